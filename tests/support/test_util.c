/* Test utilities: RNG, error metrics, tally, config description. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "mha_reference.h"
#include "test_util.h"

test_rng test_rng_seeded(uint64_t seed)
{
    test_rng rng = {seed};
    return rng;
}

uint64_t test_rng_next(test_rng *rng)
{
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double test_rng_uniform(test_rng *rng)
{
    return (double)(test_rng_next(rng) >> 11) * 0x1.0p-53;
}

float test_rng_symmetric(test_rng *rng, float amplitude)
{
    return (float)((2.0 * test_rng_uniform(rng) - 1.0) * amplitude);
}

void test_fill_uniform(test_rng *rng, float *x, int64_t n, float amplitude)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = test_rng_symmetric(rng, amplitude);
}

static test_error compare(const float *got, const double *want_double, const float *want_float, int64_t n)
{
    test_error e = {0, 0, 0, 0, 0, -1};
    int64_t first_non_finite = -1;
    double diff_sq = 0.0, want_sq = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double want = want_double ? want_double[i] : (double)want_float[i];
        const double g = (double)got[i];
        e.want_max_abs = fmax(e.want_max_abs, fabs(want));
        want_sq += want * want;
        if (!isfinite(g)) {
            if (e.non_finite++ == 0)
                first_non_finite = i;
            continue;
        }
        const double diff = fabs(g - want);
        if (diff > e.max_abs || e.worst_index < 0) {
            e.max_abs = diff;
            e.worst_index = i;
        }
        diff_sq += diff * diff;
    }
    if (first_non_finite >= 0)
        e.worst_index = first_non_finite;
    e.max_normalized = e.want_max_abs > 0 ? e.max_abs / e.want_max_abs : e.max_abs;
    e.rms_relative = want_sq > 0 ? sqrt(diff_sq / want_sq) : (n ? sqrt(diff_sq / (double)n) : 0.0);
    return e;
}

test_error test_compare(const float *got, const double *want, int64_t n)
{
    return compare(got, want, NULL, n);
}

test_error test_compare_float(const float *got, const float *want, int64_t n)
{
    return compare(got, NULL, want, n);
}

int test_error_within(const test_error *error, double max_normalized, double rms_relative)
{
    return error->non_finite == 0 && error->max_normalized <= max_normalized &&
           error->rms_relative <= rms_relative;
}

int test_check_at(test_tally *tally, int ok, const char *condition, const char *file, int line,
                  const char *format, ...)
{
    if (ok) {
        tally->passed++;
        return 1;
    }
    tally->failed++;
    fprintf(stdout, "FAIL %s:%d: %s: ", file, line, condition);
    va_list args;
    va_start(args, format);
    vfprintf(stdout, format, args);
    va_end(args);
    fputc('\n', stdout);
    fflush(stdout);
    return 0;
}

int test_finish(const test_tally *tally)
{
    if (tally->skipped)
        printf("%d passed, %d failed, %d skipped\n", tally->passed, tally->failed, tally->skipped);
    else
        printf("%d passed, %d failed\n", tally->passed, tally->failed);
    return tally->failed ? 1 : 0;
}

int test_run_parts(int argc, char **argv, const test_part *parts, int count, test_tally *tally)
{
    int shard = 0, shards = 1;
    if (argc == 3 && strcmp(argv[1], "--shard") == 0) {
        if (sscanf(argv[2], "%d/%d", &shard, &shards) != 2 || shards < 1 || shard < 0 || shard >= shards) {
            fprintf(stderr, "%s: --shard %s: expected I/N with 0 <= I < N\n", argv[0], argv[2]);
            return 2;
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--shard I/N]\n", argv[0]);
        return 2;
    }
    for (int i = 0; i < count; i++)
        if (i % shards == shard)
            parts[i]();
    return test_finish(tally);
}

/* The type's HF name, from the table rendered from gen's ROPE_TYPES. */
static const char *rope_type_name(sneppx_rope_type type)
{
    return (int)type >= 0 && (int)type < sneppx_rope_type_count ? sneppx_rope_type_names[type] : "?";
}

void test_describe_config(const sneppx_config *c, char *text, size_t size)
{
    ref_dims dims;
    int used;
    if (c->kv_lora_rank > 0)
        used = snprintf(text, size, "%s h%lld H%lld mla(qlora%lld kv%lld nope%lld rope%lld v%lld%s)", c->name,
                        (long long)c->hidden_size, (long long)c->num_attention_heads, (long long)c->q_lora_rank,
                        (long long)c->kv_lora_rank, (long long)c->qk_nope_head_dim,
                        (long long)c->qk_rope_head_dim, (long long)c->v_head_dim, c->mla_naive ? " naive" : "");
    else if (ref_dims_of(c, &dims) == NULL)
        used = snprintf(text, size, "%s h%lld H%lld/KV%lld d%lld r%lld", c->name, (long long)c->hidden_size,
                        (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
                        (long long)dims.qk_head_dim, (long long)dims.rotary_dim);
    else
        used = snprintf(text, size, "%s h%lld H%lld/KV%lld (invalid shape)", c->name, (long long)c->hidden_size,
                        (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (used < 0 || (size_t)used >= size)
        return;
    snprintf(text + used, size - (size_t)used, " %s theta=%g %s(f=%g) mpe=%lld w%lld bias=%d/%d %s",
             c->rope_interleaved ? "inter" : "half", c->rope_theta, rope_type_name(c->rope_scaling.type),
             c->rope_scaling.factor, (long long)c->max_position_embeddings, (long long)c->sliding_window,
             c->qkv_bias, c->o_bias, c->use_flash_attn ? "flash" : "sdpa");
}

int test_env_flag(const char *name)
{
    const char *value = getenv(name);
    return value && *value && strcmp(value, "0") != 0;
}

void test_fill_sentinel(float *data, size_t count)
{
    const uint32_t bits = TEST_SENTINEL_BITS;
    for (size_t i = 0; i < count; i++)
        memcpy(&data[i], &bits, sizeof bits);
}

int test_all_sentinel(const float *data, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &data[i], sizeof bits);
        if (bits != TEST_SENTINEL_BITS)
            return 0;
    }
    return 1;
}
