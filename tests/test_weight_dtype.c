/* Narrow weight storage (sneppx_config.weight_dtype), at the kernel and the C API:
 *   - the GEMM's _pack entry rounds to the type, bit for bit: bfloat16 to nearest
 *     even (ties both ways, signs), NaN stays NaN, inf stays inf, the largest floats
 *     round to inf; float16 to nearest even, subnormals, 65504 kept and 65520 to
 *     inf, NaN; for every target (v16 runs only on an AVX-512 host);
 *   - the product widens those panels exactly: with one-hot activations each output
 *     is one stored weight, through the decode sweep (1 row) and both microkernel
 *     heights (2 and 14+ rows), so a wrong widening or element size shows at once;
 *   - int8: _pack quantizes per group of 32 k rows of a column, bit for bit against
 *     a quantizer written here with rintf: an all-zero group (scale 0), a group
 *     with one large value, ties rounded to even, a negative maximum, a short last
 *     group (k = 45), a non-finite group (scale NaN, q 0), padding columns zero; and
 *     the product reads back q * scale exactly through the decode sweep and both
 *     microkernel heights; sneppx_gemm_packed_bytes() sizes int8 panels (scales
 *     included, a short group whole) and refuses other values with -1;
 *   - sneppx_layer_weight_bytes() counts the narrow panels: half the float32
 *     panels (9/32 in int8), biases unchanged;
 *   - a weight_dtype outside the enum is refused by sneppx_config_validate and
 *     sneppx_layer_create, naming config.weight_dtype and the four types;
 *     sneppx_dtype_name().
 * The numerics of whole layers (every family against the float64 reference on
 * the rounded weights, the cached forward, the vendored layer) are in
 * tests/python/test_weight_dtype.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_tiles.h"
#include "host.h"
#include "kernel_registry.h"
#include "kernels.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "sneppx_abi.h"
#include "test_util.h"

static test_tally tally;

static float from_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static float half_float(uint16_t h)
{
    /* float16 -> float, by the format's definition (independent of the kernels). */
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (exponent == 0x1f)
        return mantissa ? NAN : sign * INFINITY;
    if (exponent == 0)
        return sign * ldexpf((float)mantissa, -24);
    return sign * ldexpf((float)(mantissa | 0x400), exponent - 25);
}

struct rounding {
    uint32_t in;      /* float32 bits */
    uint16_t out;     /* the type's bits; for a NaN: any NaN of the sign */
};

static const struct rounding bf16_cases[] = {
    {0x3f800000u, 0x3f80}, /* 1 */
    {0x3f808000u, 0x3f80}, /* halfway between 0x3f80 and 0x3f81: to the even one, down */
    {0x3f818000u, 0x3f82}, /* halfway between 0x3f81 and 0x3f82: to the even one, up */
    {0x3f808001u, 0x3f81}, /* just above halfway: up */
    {0x3f807fffu, 0x3f80}, /* just below halfway: down */
    {0xbf818000u, 0xbf82}, /* a negative tie */
    {0x7f800000u, 0x7f80}, /* inf */
    {0xff800000u, 0xff80}, /* -inf */
    {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds past the largest bfloat16: inf */
    {0x7fc00000u, 0x7fc0}, /* quiet NaN */
    {0x7f800001u, 0x7fc0}, /* a NaN whose payload lies in the dropped bits: still NaN */
    {0xff800001u, 0xffc0}, /* and of its sign */
    {0x00000001u, 0x0000}, /* the smallest subnormal float: to zero */
    {0x80000000u, 0x8000}, /* -0 */
};

static const struct rounding f16_cases[] = {
    {0x3f800000u, 0x3c00}, /* 1 */
    {0x3f801000u, 0x3c00}, /* 1 + 2^-11, halfway to 1 + 2^-10: to even, down */
    {0x3f803000u, 0x3c02}, /* 1 + 3 * 2^-11: to even, up */
    {0x477fe000u, 0x7bff}, /* 65504, the largest float16 */
    {0x477fefffu, 0x7bff}, /* just below 65520: 65504 */
    {0x477ff000u, 0x7c00}, /* 65520, halfway past 65504: inf */
    {0x49742400u, 0x7c00}, /* 1e6: inf */
    {0xc9742400u, 0xfc00}, /* -1e6: -inf */
    {0x7f800000u, 0x7c00}, /* inf */
    {0x7fc00000u, 0x7e00}, /* NaN */
    {0x38800000u, 0x0400}, /* 2^-14, the smallest normal */
    {0x33800000u, 0x0001}, /* 2^-24, the smallest subnormal */
    {0x33000000u, 0x0000}, /* 2^-25, halfway between 0 and 2^-24: to even, 0 */
    {0x33c00000u, 0x0002}, /* 3 * 2^-25, halfway between 1 and 2 subnormal steps: 2 */
    {0x387fe000u, 0x0400}, /* 2^-14 - 2^-25, halfway between 1023 and 1024 steps: to even, the smallest normal */
    {0x387fc000u, 0x03ff}, /* 2^-14 - 2^-24: the largest subnormal */
    {0xb3800000u, 0x8001}, /* -2^-24 */
};

static int is_nan16(uint16_t bits, int bf16)
{
    return bf16 ? ((bits & 0x7f80) == 0x7f80 && (bits & 0x7f)) : ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff));
}

/* A case's input if it packs to a finite value, else 0.5: column 1 checks the
 * widening of every finite case exactly (subnormals, the largest values). */
static float finite_case(const struct rounding *c, int bf16)
{
    const int finite = bf16 ? (c->out & 0x7f80) != 0x7f80 : (c->out & 0x7c00) != 0x7c00;
    return finite ? from_bits(c->in) : 0.5f;
}

/* The product over packed panels of `rows` one-hot rows (row r is 1 at k = r % k,
 * 0 elsewhere) into out [rows, n]: out[r, c] must be the stored W[c, r % k] widened. */
enum { MAX_ROWS = 40, MAX_K = 45 };
static const int64_t one_hot_rows[] = {1, 2, MAX_ROWS};

static void one_hot_product(const sneppx_kernel *kernel, const void *panels, int64_t k, int64_t n, int64_t rows,
                            float *out)
{
    float src[MAX_ROWS * MAX_K] = {0};
    for (int64_t r = 0; r < rows; r++)
        src[r * k + r % k] = 1.0f;
    struct sneppx_args run = {.struct_size = sizeof run, .abi_version = SNEPPX_ABI_VERSION, .row_begin = 0,
                              .row_end = rows, .col_begin = 0, .col_end = n, .src = src, .src_stride = k,
                              .weight = panels, .dst = out, .dst_stride = n};
    kernel->entry[SNEPPX_ENTRY_RUN](&run);
}

/* Packs the cases as column 0 of an [n, k] matrix (k = the case count) with the
 * _pack entry of a `dtype` GEMM for target, checks the stored bits, then runs the
 * product on one-hot rows and checks that each output is the stored value widened. */
static void check_type(const struct sneppx_target *target, int dtype, const struct rounding *cases, int count)
{
    const int bf16 = dtype == SNEPPX_DTYPE_BFLOAT16;
    const int64_t k = count, n = 3, nr = target->gemm_nr;
    int64_t values[] = {k, n, 0, dtype, 0, 0};
    sneppx_gemm_default_tiles(target, (sneppx_dtype)dtype, &values[4], &values[5]);
    const sneppx_kernel *kernel;
    if (!TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", values, target, &kernel) == SNEPPX_OK, "%s %s: %s",
                    target->name, sneppx_dtype_name(dtype), sneppx_last_error()))
        return;
    if (!TEST_CHECK(&tally, count <= 32 && count <= MAX_K, "%d cases: more than the matrix holds", count))
        return;
    float hf[3 * 32];
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < k; i++)
            hf[c * k + i] = c == 0 ? from_bits(cases[i].in) : c == 1 ? finite_case(&cases[i], bf16)
                                                                       : 0.25f * (float)(c * k + i); /* exact */
    const int64_t bytes = sneppx_gemm_packed_bytes(k, n, nr, dtype);
    uint16_t *panels = aligned_alloc(64, (size_t)(bytes + 63) / 64 * 64);
    memset(panels, 0xff, (size_t)bytes); /* columns past n must come out zero */
    struct sneppx_args pack = {.struct_size = sizeof pack, .abi_version = SNEPPX_ABI_VERSION, .col_begin = 0,
                               .col_end = n, .src = hf, .src_stride = k, .dst = (float *)panels};
    kernel->entry[SNEPPX_ENTRY_PACK](&pack);
    int wrong = 0;
    for (int i = 0; i < count; i++) {
        const uint16_t got = panels[i * nr];
        const int ok = is_nan16(cases[i].out, bf16) ? is_nan16(got, bf16) && (got & 0x8000) == (cases[i].out & 0x8000)
                                                    : got == cases[i].out;
        wrong += !TEST_CHECK(&tally, ok, "%s %s: 0x%08x packed as 0x%04x, want 0x%04x", target->name,
                             sneppx_dtype_name(dtype), (unsigned)cases[i].in, got, cases[i].out);
    }
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = n; c < nr; c++)
            wrong += !TEST_CHECK(&tally, panels[i * nr + c] == 0, "%s %s: padding column %lld of k %lld is 0x%04x",
                                 target->name, sneppx_dtype_name(dtype), (long long)c, (long long)i,
                                 panels[i * nr + c]);

    float out[MAX_ROWS * 3];
    for (size_t t = 0; t < sizeof one_hot_rows / sizeof one_hot_rows[0]; t++) {
        const int64_t rows = one_hot_rows[t];
        one_hot_product(kernel, panels, k, n, rows, out);
        for (int64_t r = 0; r < rows && wrong < 8; r++)
            for (int64_t c = 0; c < n; c++) {
                const uint16_t stored = panels[(r % k) * nr + c];
                float want = bf16 ? from_bits((uint32_t)stored << 16) : half_float(stored);
                const float got = out[r * n + c];
                /* 1 * w + 0 * (the other weights): inf * 0 is NaN, as in any float product */
                int has_inf = 0;
                for (int64_t i = 0; i < k; i++) {
                    const uint16_t w = panels[i * nr + c];
                    has_inf |= bf16 ? (w & 0x7fff) >= 0x7f80 : (w & 0x7fff) >= 0x7c00;
                }
                if (has_inf)
                    want = NAN;
                const int ok = isnan(want) ? isnan(got) : got == want;
                wrong += !TEST_CHECK(&tally, ok, "%s %s: %lld rows: out[%lld, %lld] = %g, want %g", target->name,
                                     sneppx_dtype_name(dtype), (long long)rows, (long long)r, (long long)c, got,
                                     want);
            }
    }
    free(panels);
}

/* ---- int8 ---------------------------------------------------------------- */

/* The group config.h documents; the cases below (a whole group and a short one) are laid out for it. */
enum { I8_K = 45, I8_N = 4, I8_GROUP = 32 };
_Static_assert((int)I8_GROUP == SNEPPX_GEMM_INT8_GROUP, "the documented int8 group is the ABI's");
_Static_assert((int)I8_K <= (int)MAX_K, "one_hot_product's rows hold the int8 cases' k");

/* The quantizer as config.h states it, written independently of the kernels:
 * scale = max |w| / 127 (float32), q = rintf(w / scale) (nearest even) clamped to
 * [-127, 127]; scale 0 and q 0 for an all-zero group; scale NaN and q 0 when a
 * value is not finite. */
static void reference_quantize(const float *w, int64_t count, float *scale, int8_t *q)
{
    float largest = 0.0f;
    int finite = 1;
    for (int64_t i = 0; i < count; i++) {
        finite &= isfinite(w[i]) != 0;
        if (fabsf(w[i]) > largest)
            largest = fabsf(w[i]);
    }
    *scale = finite ? largest / 127.0f : NAN;
    for (int64_t i = 0; i < count; i++) {
        float r = *scale > 0.0f ? rintf(w[i] / *scale) : 0.0f;
        q[i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
    }
}

/* Column c of the HF [I8_N, I8_K] matrix; groups k 0..31 and 32..44. */
static float int8_case(int64_t c, int64_t i)
{
    static const float ties[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 3.5f, 127.0f, 0.0f, -0.0f,
                                 4.5f};
    switch (c) {
    case 0: /* an all-zero group, then ties: the group's max is 127, so scale 1 and w / scale = w */
        return i < I8_GROUP ? 0.0f : ties[i - I8_GROUP];
    case 1: /* one large value among tiny ones (they quantize to 0), then a negative maximum */
        return i < I8_GROUP ? (i == 7 ? 1000.0f : 1e-3f * (float)(i % 5 - 2)) : (i == 40 ? -3.0f : 0.01f * (float)(i - 38));
    case 2: /* spread values, two signs */
        return 0.37f * sinf(0.7f * (float)i + 0.3f) + (i == 20 ? 0.5f : 0.0f);
    default: /* a non-finite first group (not read back: its products are NaN), finite after */
        return i == 3 ? INFINITY : 0.25f * (float)(i - 40);
    }
}

static float scale_at(const unsigned char *panels, int64_t nr, int64_t c, int64_t g0)
{
    float scale;
    memcpy(&scale, panels + sneppx_gemm_panel_bytes(g0, nr, SNEPPX_GEMM_INT8) + c * (int64_t)sizeof(float),
           sizeof scale);
    return scale;
}

static int8_t q_at(const unsigned char *panels, int64_t nr, int64_t c, int64_t i)
{
    const int64_t g0 = i / I8_GROUP * I8_GROUP;
    return (int8_t)panels[sneppx_gemm_panel_bytes(g0, nr, SNEPPX_GEMM_INT8) + nr * (int64_t)sizeof(float) +
                          (i - g0) * nr + c];
}

static int same_float(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static void check_int8(const struct sneppx_target *target)
{
    const int64_t k = I8_K, n = I8_N, nr = target->gemm_nr;
    int64_t values[] = {k, n, 0, SNEPPX_DTYPE_INT8, 0, 0};
    sneppx_gemm_default_tiles(target, SNEPPX_DTYPE_INT8, &values[4], &values[5]);
    const sneppx_kernel *kernel;
    if (!TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", values, target, &kernel) == SNEPPX_OK, "%s int8: %s",
                    target->name, sneppx_last_error()))
        return;
    float hf[I8_N * I8_K];
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < k; i++)
            hf[c * k + i] = int8_case(c, i);
    /* Two groups (32 and 13 rows), each nr float32 scales and its rows of nr int8. */
    const int64_t bytes = sneppx_gemm_packed_bytes(k, n, nr, SNEPPX_DTYPE_INT8);
    TEST_CHECK(&tally, bytes == 2 * nr * 4 + k * nr, "%s: int8 packed bytes %lld", target->name, (long long)bytes);
    unsigned char *panels = aligned_alloc(64, (size_t)(bytes + 63) / 64 * 64);
    memset(panels, 0xff, (size_t)bytes); /* columns past n must come out zero */
    struct sneppx_args pack = {.struct_size = sizeof pack, .abi_version = SNEPPX_ABI_VERSION, .col_begin = 0,
                               .col_end = n, .src = hf, .src_stride = k, .dst = (float *)panels};
    kernel->entry[SNEPPX_ENTRY_PACK](&pack);

    int wrong = 0;
    float want_scale[I8_N][2];
    int8_t want_q[I8_N][I8_K];
    for (int64_t c = 0; c < nr; c++)
        for (int64_t g = 0; g < 2; g++) {
            const int64_t g0 = g * I8_GROUP, count = g ? k - I8_GROUP : I8_GROUP;
            float scale = 0.0f;
            int8_t q[I8_GROUP] = {0};
            if (c < n)
                reference_quantize(hf + c * k + g0, count, &scale, q);
            if (c < n)
                want_scale[c][g] = scale;
            const float got = scale_at(panels, nr, c, g0);
            wrong += !TEST_CHECK(&tally, same_float(got, scale), "%s int8: column %lld group %lld scale %a, want %a",
                                 target->name, (long long)c, (long long)g, got, scale);
            for (int64_t i = 0; i < count; i++) {
                if (c < n)
                    want_q[c][g0 + i] = q[i];
                wrong += !TEST_CHECK(&tally, q_at(panels, nr, c, g0 + i) == q[i], "%s int8: W[%lld, %lld] = %g as %d, "
                                     "want %d", target->name, (long long)c, (long long)(g0 + i),
                                     c < n ? hf[c * k + g0 + i] : 0.0f, q_at(panels, nr, c, g0 + i), q[i]);
            }
        }
    /* The cases as written, beside the quantizer: scale 0 for zeros, 1000 / 127 with
     * the large value 127 and the tiny ones 0, ties to even, a negative maximum. */
    static const int8_t tie_q[] = {0, 2, 2, 0, -2, -2, 126, -126, 4, 127, 0, 0, 4};
    for (int i = 0; i < (int)(sizeof tie_q / sizeof tie_q[0]); i++)
        wrong += !TEST_CHECK(&tally, want_q[0][I8_GROUP + i] == tie_q[i], "int8 tie %g -> %d, want %d",
                             int8_case(0, I8_GROUP + i), want_q[0][I8_GROUP + i], tie_q[i]);
    wrong += !TEST_CHECK(&tally, want_scale[0][0] == 0.0f && want_scale[0][1] == 1.0f &&
                                     want_scale[1][0] == 1000.0f / 127.0f && want_q[1][7] == 127 && want_q[1][8] == 0 &&
                                     want_q[1][40] == -127 && isnan(want_scale[3][0]) && want_q[3][3] == 0,
                         "int8 cases: scales %g %g %g, q %d %d %d", want_scale[0][0], want_scale[0][1],
                         want_scale[1][0], want_q[1][7], want_q[1][8], want_q[1][40]);

    /* out[r, c] is q * scale of W[c, r % k], exactly. */
    float out[MAX_ROWS * I8_N];
    for (size_t t = 0; t < sizeof one_hot_rows / sizeof one_hot_rows[0]; t++) {
        const int64_t rows = one_hot_rows[t];
        one_hot_product(kernel, panels, k, n, rows, out);
        for (int64_t r = 0; r < rows && wrong < 8; r++)
            for (int64_t c = 0; c < n; c++) {
                const int64_t i = r % k;
                /* column 3's first group has a NaN scale: 0 * NaN poisons every row of it */
                const float want = c == 3 ? NAN : (float)want_q[c][i] * want_scale[c][i / I8_GROUP];
                const float got = out[r * n + c];
                wrong += !TEST_CHECK(&tally, same_float(got, want), "%s int8: %lld rows: out[%lld, %lld] = %a, want %a",
                                     target->name, (long long)rows, (long long)r, (long long)c, got, want);
            }
    }
    free(panels);
}

/* Column 0 holds inf/NaN cases, so its products are NaN (inf * 0); columns 1 and
 * 2 hold finite values only and check the widening exactly. */
static void test_rounding_and_widening(void)
{
    for (int t = 0; t < sneppx_target_count; t++) {
        const struct sneppx_target *target = &sneppx_targets[t];
        if (target->vector_width > sneppx_host_target()->vector_width)
            continue; /* this host cannot run it */
        check_type(target, SNEPPX_DTYPE_BFLOAT16, bf16_cases, (int)(sizeof bf16_cases / sizeof bf16_cases[0]));
        check_type(target, SNEPPX_DTYPE_FLOAT16, f16_cases, (int)(sizeof f16_cases / sizeof f16_cases[0]));
        check_int8(target);
    }
    TEST_CHECK(&tally, sneppx_gemm_packed_bytes(64, 64, 32, SNEPPX_DTYPE_COUNT) == -1 &&
                           sneppx_gemm_packed_bytes(64, 64, 32, -1) == -1,
               "sneppx_gemm_packed_bytes of a value that is no weight type");
}

static sneppx_config small_config(int bias)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 96; /* not a multiple of the panel width */
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 32;
    config.qkv_bias = config.o_bias = bias;
    config.num_threads = 1;
    return config;
}

static void test_weight_bytes(void)
{
    for (int bias = 0; bias <= 1; bias++) {
        double bytes[SNEPPX_DTYPE_COUNT];
        for (int dtype = 0; dtype < SNEPPX_DTYPE_COUNT; dtype++) {
            sneppx_config config = small_config(bias);
            config.weight_dtype = (sneppx_dtype)dtype;
            sneppx_layer *layer = NULL;
            bytes[dtype] = -1;
            if (TEST_CHECK(&tally, sneppx_layer_create(&config, NULL, &layer) == SNEPPX_OK, "%s: %s",
                           sneppx_dtype_name(dtype), sneppx_last_error())) {
                bytes[dtype] = sneppx_layer_weight_bytes(layer);
                char want[64];
                snprintf(want, sizeof want, "-bias%d-%s-", bias, sneppx_dtype_name(dtype));
                TEST_CHECK(&tally, strstr(sneppx_layer_keys(layer), want) != NULL, "keys '%s' lack '%s'",
                           sneppx_layer_keys(layer), want);
            }
            sneppx_layer_destroy(layer);
        }
        /* q|k|v (4 + 2 + 2 heads of 32) and o (96) biases: float32 in every type. int8: a
         * byte per weight and a float32 scale per 32 (k is 96 and 128: whole groups). */
        const double bias_bytes = bias ? 4.0 * (8 * 32 + 96) : 0.0;
        for (int dtype = 1; dtype < SNEPPX_DTYPE_COUNT; dtype++)
            TEST_CHECK(&tally, bytes[dtype] == (bytes[0] - bias_bytes) * (dtype == SNEPPX_DTYPE_INT8 ? 9.0 / 32 : 0.5) +
                                                   bias_bytes,
                       "bias %d: %s layer weighs %.0f bytes, float32 %.0f (biases %.0f)", bias,
                       sneppx_dtype_name(dtype), bytes[dtype], bytes[0], bias_bytes);
    }
}

static void test_bad_dtype(void)
{
    const int bad[] = {SNEPPX_DTYPE_COUNT, -1, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sneppx_config config = small_config(0);
        config.weight_dtype = (sneppx_dtype)bad[i];
        sneppx_status status = sneppx_config_validate(&config);
        TEST_CHECK(&tally, status == SNEPPX_ERR_INVALID_ARGUMENT &&
                               strstr(sneppx_last_error(), "config.weight_dtype") &&
                               strstr(sneppx_last_error(), "float32, bfloat16, float16, int8"),
                   "validate %d: %s '%s'", bad[i], sneppx_status_name(status), sneppx_last_error());
        sneppx_layer *layer = (sneppx_layer *)&config; /* must be set to NULL */
        status = sneppx_layer_create(&config, NULL, &layer);
        TEST_CHECK(&tally, status == SNEPPX_ERR_INVALID_ARGUMENT && layer == NULL &&
                               strstr(sneppx_last_error(), "config.weight_dtype"),
                   "create %d: %s '%s'", bad[i], sneppx_status_name(status), sneppx_last_error());
    }
    TEST_CHECK(&tally, strcmp(sneppx_dtype_name(SNEPPX_DTYPE_FLOAT32), "float32") == 0 &&
                           strcmp(sneppx_dtype_name(SNEPPX_DTYPE_BFLOAT16), "bfloat16") == 0 &&
                           strcmp(sneppx_dtype_name(SNEPPX_DTYPE_FLOAT16), "float16") == 0 &&
                           strcmp(sneppx_dtype_name(SNEPPX_DTYPE_INT8), "int8") == 0 &&
                           sneppx_dtype_name(SNEPPX_DTYPE_COUNT) == NULL && sneppx_dtype_name(-1) == NULL,
               "sneppx_dtype_name");
    sneppx_config config;
    sneppx_config_init(&config);
    TEST_CHECK(&tally, config.weight_dtype == SNEPPX_DTYPE_FLOAT32, "default weight_dtype %d", config.weight_dtype);
}

int main(void)
{
    test_rounding_and_widening();
    test_weight_bytes();
    test_bad_dtype();
    return test_finish(&tally);
}
