/* Four vendored layers whose caches hold four types, in one program
 * (aot_kv_dtypes_link.test): each prefills two sequences (20 and 17 tokens, the
 * gathered path), decodes three steps (attn_decode over the caches in place), and
 * prints whether its outputs are finite; then a refused call names its argument.
 * Every buffer is exactly the size the header's macros and _cached_scratch_floats
 * give, so a sanitizer build sees any access past them. */
#include "sneppx_deepseek_v2_lite.h"
#include "sneppx_llama3_8b.h"
#include "sneppx_mistral_7b.h"
#include "sneppx_qwen2_0_5b.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PROMPT 20
#define STEPS 3
#define CAPACITY (PROMPT + STEPS)

/* count bytes, no more (one for none): a sanitizer sees an access past them. */
static void *bytes(int64_t count)
{
    void *data = malloc(count > 0 ? (size_t)count : 1);
    if (!data)
        exit(2);
    return data;
}

/* Scratch: 64-byte aligned, its size a multiple of 64 bytes (whole regions of 16 floats). */
static float *scratch_floats(int64_t count)
{
    if (count <= 0 || count % 16 != 0)
        exit(3);
    float *data = aligned_alloc(64, (size_t)count * sizeof(float));
    if (!data)
        exit(2);
    return data;
}

static void fill(float *data, int64_t count, float scale)
{
    uint32_t state = 12345u;
    for (int64_t i = 0; i < count; i++) {
        state = state * 1664525u + 1013904223u;
        data[i] = scale * ((float)(state >> 8) / 8388608.0f - 1.0f);
    }
}

/* The call of a layer whose caches hold a float type, and of one whose caches are int8. */
#define CALL(P, U) \
    P##_forward_cached(packed, 2, q_lens, cached, k, U##_V_CACHE_ROW ? v : NULL, CAPACITY, x, NULL, out, scratch, 1)
#define CALL_INT8(P, U)                                                                                          \
    P##_forward_cached(packed, 2, q_lens, cached, k, U##_V_CACHE_ROW ? v : NULL, k_scales,                     \
                       U##_V_CACHE_ROW ? v_scales : NULL, CAPACITY, x, NULL, out, scratch, 1)

#define RUN(P, U, CALL_CACHED)                                                                                   \
    do {                                                                                                         \
        float *packed = bytes(4 * P##_packed_floats());                                                         \
        fill(packed, P##_packed_floats(), 0.02f);                                                                \
        P##_kv_element *k[2], *v[2];                                                                             \
        float *k_scales[2], *v_scales[2];                                                                        \
        for (int i = 0; i < 2; i++) {                                                                            \
            k[i] = bytes(U##_K_CACHE_BYTES(CAPACITY));                                                           \
            v[i] = bytes(U##_V_CACHE_BYTES(CAPACITY));                                                           \
            k_scales[i] = bytes(U##_SCALES_BYTES(CAPACITY));                                                     \
            v_scales[i] = bytes(U##_SCALES_BYTES(CAPACITY));                                                     \
        }                                                                                                        \
        const int64_t tokens = 2 * PROMPT;                                                                       \
        float *scratch = scratch_floats(P##_cached_scratch_floats(tokens, CAPACITY, 1));                          \
        float *x = bytes(4 * tokens * U##_HIDDEN_SIZE), *out = bytes(4 * tokens * U##_HIDDEN_SIZE);             \
        fill(x, tokens * U##_HIDDEN_SIZE, 1.0f);                                                                 \
        int64_t q_lens[2] = {PROMPT, PROMPT - 3}, cached[2] = {0, 0};                                            \
        int status = CALL_CACHED(P, U), finite = 1;                                                              \
        for (int step = 0; step < STEPS && status == SNEPPX_AOT_OK; step++) {                                    \
            cached[0] += q_lens[0], cached[1] += q_lens[1];                                                      \
            q_lens[0] = q_lens[1] = 1;                                                                           \
            status = CALL_CACHED(P, U);                                                                          \
            for (int64_t i = 0; i < 2 * U##_HIDDEN_SIZE; i++)                                                    \
                finite &= isfinite(out[i]) != 0;                                                                 \
        }                                                                                                        \
        printf("%s (%s caches, %lld bytes a sequence): status %d, finite %d\n", #P, U##_KV_DTYPE,              \
               (long long)U##_CACHE_BYTES(CAPACITY), status, finite);                                            \
        cached[0] = CAPACITY;                                                                                    \
        status = CALL_CACHED(P, U);                                                                              \
        printf("%s refused: %d %s\n", #P, status, P##_last_error());                                             \
        for (int i = 0; i < 2; i++)                                                                              \
            free(k[i]), free(v[i]), free(k_scales[i]), free(v_scales[i]);                                        \
        free(packed), free(scratch), free(x), free(out);                                                         \
    } while (0)

int main(void)
{
    RUN(sneppx_llama3_8b, SNEPPX_LLAMA3_8B, CALL_INT8);
    RUN(sneppx_mistral_7b, SNEPPX_MISTRAL_7B, CALL);
    RUN(sneppx_deepseek_v2_lite, SNEPPX_DEEPSEEK_V2_LITE, CALL);
    RUN(sneppx_qwen2_0_5b, SNEPPX_QWEN2_0_5B, CALL);
    return 0;
}
