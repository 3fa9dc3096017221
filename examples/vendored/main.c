/* A project that vendors one sneppx layer: `sneppx-gen --arch NAME -o gen/`
 * writes gen/sneppx_<arch>.{c,h}; this program compiles with them, packs random
 * weights, runs the forward pass and prints a checksum and the time; then it
 * generates over KV caches it owns, of the type the layer was generated for
 * (sneppx-gen --kv-dtype), and compares the last token's row with the forward's.
 *
 * Built by the Makefile beside it, which passes the layer's header and its
 * symbol prefix (SNEPPX_LAYER_HEADER, SNEPPX_LAYER, SNEPPX_LAYER_UPPER), so the
 * same program works for every architecture.
 *
 *     usage: vendored [batch] [seq_len] [threads]
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include SNEPPX_LAYER_HEADER

#define CONCAT2(a, b) a##b
#define CONCAT(a, b) CONCAT2(a, b)
#define LAYER(name) CONCAT(SNEPPX_LAYER, name)
#define LAYER_MACRO(name) CONCAT(SNEPPX_LAYER_UPPER, name)

static double seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* Uniform in [-scale, scale) from a 64-bit LCG: reproducible on every platform. */
static void fill_random(float *data, int64_t count, uint64_t seed, float scale)
{
    uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < count; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = scale * ((float)(state >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    }
}

static void *alloc_bytes(int64_t count)
{
    size_t bytes = ((size_t)count + 63) / 64 * 64;
    void *data = aligned_alloc(64, bytes ? bytes : 64);
    if (!data) {
        fprintf(stderr, "vendored: out of memory (%lld bytes)\n", (long long)count);
        exit(1);
    }
    return data;
}

static float *alloc_floats(int64_t count)
{
    return alloc_bytes(count * (int64_t)sizeof(float));
}

/* Generation over caches this program owns: each sequence's first seq_len - 1 tokens
 * in one call (the prompt), then its last token alone (a decode step). The step's
 * rows are the forward's last rows (forward_out), up to the rounding of K and V to
 * the caches' type. Returns the largest difference over the largest |row value|, or
 * -1 on an error. */
static double generate(const float *packed, int64_t batch, int64_t seq_len, const float *hidden_states,
                       const float *forward_out, int threads)
{
    const int64_t hidden = LAYER_MACRO(_HIDDEN_SIZE), prompt = seq_len - 1, capacity = seq_len;
    LAYER(_kv_element) **k = malloc(sizeof *k * (size_t)batch), **v = malloc(sizeof *v * (size_t)batch);
    float **k_scales = malloc(sizeof *k_scales * (size_t)batch), **v_scales = malloc(sizeof *v_scales * (size_t)batch);
    int64_t *q_lens = malloc(sizeof *q_lens * (size_t)batch), *cached = malloc(sizeof *cached * (size_t)batch);
    if (!k || !v || !k_scales || !v_scales || !q_lens || !cached)
        exit(1);
    /* LAYER_CACHE_BYTES(capacity) in all per sequence: K, V (none for MLA) and, for int8, scales. */
    for (int64_t b = 0; b < batch; b++) {
        k[b] = alloc_bytes(LAYER_MACRO(_K_CACHE_BYTES)(capacity));
        v[b] = alloc_bytes(LAYER_MACRO(_V_CACHE_BYTES)(capacity));
        k_scales[b] = alloc_bytes(LAYER_MACRO(_SCALES_BYTES)(capacity));
        v_scales[b] = alloc_bytes(LAYER_MACRO(_SCALES_BYTES)(capacity));
        cached[b] = 0;
    }
    const int64_t scratch_floats = LAYER(_cached_scratch_floats)(prompt > 0 ? batch * prompt : batch, capacity, threads);
    float *scratch = alloc_floats(scratch_floats > 0 ? scratch_floats : 1);
    float *x = alloc_floats(batch * seq_len * hidden), *y = alloc_floats(batch * seq_len * hidden);
    double largest = 0.0, difference = 0.0;
    int status = scratch_floats > 0 ? SNEPPX_AOT_OK : SNEPPX_AOT_ERR_INVALID_ARGUMENT;
    /* The prompt's tokens then the last ones, each call's sequences packed one after another. */
    for (int call = prompt > 0 ? 0 : 1; call < 2 && status == SNEPPX_AOT_OK; call++) {
        const int64_t first = call == 0 ? 0 : prompt, count = call == 0 ? prompt : 1;
        for (int64_t b = 0; b < batch; b++) {
            q_lens[b] = count;
            memcpy(x + b * count * hidden, hidden_states + (b * seq_len + first) * hidden,
                   sizeof(float) * (size_t)(count * hidden));
        }
        const int64_t v_rows = LAYER_MACRO(_V_CACHE_ROW);
#if LAYER_MACRO(_CACHE_SCALES)
        status = LAYER(_forward_cached)(packed, batch, q_lens, cached, k, v_rows ? v : NULL, k_scales,
                                        v_rows ? v_scales : NULL, capacity, x, NULL, y, scratch, threads);
#else
        status = LAYER(_forward_cached)(packed, batch, q_lens, cached, k, v_rows ? v : NULL, capacity, x, NULL, y,
                                        scratch, threads);
#endif
        for (int64_t b = 0; b < batch; b++)
            cached[b] += count;
    }
    for (int64_t b = 0; b < batch && status == SNEPPX_AOT_OK; b++)
        for (int64_t i = 0; i < hidden; i++) {
            const double want = forward_out[((b + 1) * seq_len - 1) * hidden + i];
            largest = fabs(want) > largest ? fabs(want) : largest;
            difference = fabs(y[b * hidden + i] - want) > difference ? fabs(y[b * hidden + i] - want) : difference;
        }
    if (status != SNEPPX_AOT_OK)
        fprintf(stderr, "vendored: forward_cached failed: %s\n", LAYER(_last_error)());
    for (int64_t b = 0; b < batch; b++)
        free(k[b]), free(v[b]), free(k_scales[b]), free(v_scales[b]);
    free(k), free(v), free(k_scales), free(v_scales), free(q_lens), free(cached), free(scratch), free(x), free(y);
    return status == SNEPPX_AOT_OK && largest > 0.0 ? difference / largest : -1.0;
}

int main(int argc, char **argv)
{
    const int64_t batch = argc > 1 ? atoll(argv[1]) : 1;
    const int64_t seq_len = argc > 2 ? atoll(argv[2]) : 128;
    const int threads = argc > 3 ? atoi(argv[3]) : 1;
    const int64_t hidden = LAYER_MACRO(_HIDDEN_SIZE);

    /* Random HF weights, scaled like a trained layer's (~1/sqrt(fan_in); norm weights near 1). */
    struct LAYER(_weights) weights;
    float *owned[16];
    int owned_count = 0;
    uint64_t seed = 1;
#define FILL_FIELD(field, floats)                                                  \
    {                                                                              \
        const int norm = strstr(#field, "layernorm") != NULL;                      \
        float *data = alloc_floats(floats);                                        \
        fill_random(data, floats, seed++, norm ? 0.1f : 1.0f / sqrtf((float)hidden)); \
        for (int64_t i = 0; norm && i < (floats); i++)                             \
            data[i] += 1.0f;                                                       \
        weights.field = data;                                                      \
        owned[owned_count++] = data;                                               \
    }
    LAYER_MACRO(_WEIGHT_FIELDS)(FILL_FIELD)
#undef FILL_FIELD

    float *packed = alloc_floats(LAYER(_packed_floats)());
    if (LAYER(_pack)(&weights, packed) != SNEPPX_AOT_OK) {
        fprintf(stderr, "vendored: pack failed: %s\n", LAYER(_last_error)());
        return 1;
    }
    for (int i = 0; i < owned_count; i++)
        free(owned[i]);

    const int64_t scratch_floats = LAYER(_scratch_floats)(batch, seq_len, threads);
    if (scratch_floats < 0) {
        fprintf(stderr, "vendored: %s\n", LAYER(_last_error)());
        return 1;
    }
    float *scratch = alloc_floats(scratch_floats);
    float *hidden_states = alloc_floats(batch * seq_len * hidden);
    float *out = alloc_floats(batch * seq_len * hidden);
    fill_random(hidden_states, batch * seq_len * hidden, 99, 1.0f);

    /* The first call touches fresh scratch pages; time the best of the next ones. */
    double best = INFINITY;
    for (int run = 0; run < 4; run++) {
        const double start = seconds();
        const int status = LAYER(_forward)(packed, batch, seq_len, hidden_states, NULL, NULL, NULL, out, scratch, threads);
        const double elapsed = seconds() - start;
        if (status != SNEPPX_AOT_OK) {
            fprintf(stderr, "vendored: forward failed: %s\n", LAYER(_last_error)());
            return 1;
        }
        if (run > 0 && elapsed < best)
            best = elapsed;
    }

    double sum = 0.0, abs_sum = 0.0;
    int finite = 1;
    for (int64_t i = 0; i < batch * seq_len * hidden; i++) {
        finite &= isfinite(out[i]) != 0;
        sum += out[i];
        abs_sum += fabs(out[i]);
    }
    printf("layer %s: batch %lld, seq_len %lld, threads %d\n", SNEPPX_LAYER_HEADER, (long long)batch,
           (long long)seq_len, threads);
    printf("checksum: sum %.6e, mean |out| %.6e\n", sum, abs_sum / (double)(batch * seq_len * hidden));
    printf("forward: %.3f ms (best of 3 after a warm-up call)\n", best * 1e3);

    const double cached_difference = generate(packed, batch, seq_len, hidden_states, out, threads);
    printf("generation over %s caches (%lld bytes a sequence): last rows vs the forward's, %.1e of their largest\n",
           LAYER_MACRO(_KV_DTYPE), (long long)LAYER_MACRO(_CACHE_BYTES)(seq_len), cached_difference);

    /* Errors come back as codes with a message naming the argument; nothing aborts. */
    const int status = LAYER(_forward)(packed, batch, 0, hidden_states, NULL, NULL, NULL, out, scratch, threads);
    printf("seq_len 0 -> status %d: %s\n", status, LAYER(_last_error)());

    free(packed);
    free(scratch);
    free(hidden_states);
    free(out);
    /* float32 caches give the forward's rows but for the order of float sums; the rounding
     * of K and V to a narrow type moves them by its relative precision at most (int8's 1/254). */
    const double cached_bound = strcmp(LAYER_MACRO(_KV_DTYPE), "float32") == 0 ? 1e-4 : 2e-2;
    if (!finite || status != SNEPPX_AOT_ERR_INVALID_ARGUMENT || !(abs_sum > 0.0) ||
        !(cached_difference >= 0.0 && cached_difference <= cached_bound)) {
        fprintf(stderr, "vendored: FAILED (finite output %d, error status %d, generation %.1e of at most %.0e)\n",
                finite, status, cached_difference, cached_bound);
        return 1;
    }
    return 0;
}
