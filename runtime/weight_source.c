/* Rows of a weight tensor as float32, from wherever the tensor is: the
 * caller's memory in its element type, a safetensors file, or the seeded
 * synthetic weights (see weight_source.h). */
#include <string.h>

#include "half.h"
#include "safetensors_internal.h"
#include "weight_source.h"

/* sneppx_weights' fields in declaration order (include/sneppx/layer.h). */
const char *const sneppx_weight_field_names[] = {
    "q_proj_weight", "q_proj_bias", "k_proj_weight", "k_proj_bias", "v_proj_weight", "v_proj_bias",
    "o_proj_weight", "o_proj_bias", "q_a_proj_weight", "q_a_proj_bias", "q_a_layernorm_weight",
    "q_b_proj_weight", "kv_a_proj_with_mqa_weight", "kv_a_proj_with_mqa_bias", "kv_a_layernorm_weight",
    "kv_b_proj_weight"};
_Static_assert(sizeof sneppx_weight_field_names / sizeof sneppx_weight_field_names[0] ==
                   sizeof(sneppx_weights) / sizeof(const float *),
               "sneppx_weight_field_names must list every sneppx_weights field");
_Static_assert(sizeof(sneppx_typed_weights) == sizeof(sneppx_weights) / sizeof(const float *) *
                                                   sizeof(sneppx_tensor_ref),
               "sneppx_typed_weights must have one sneppx_tensor_ref per sneppx_weights field");

int sneppx_source_dtype_supported(int dtype)
{
    return dtype == SNEPPX_DTYPE_FLOAT32 || dtype == SNEPPX_DTYPE_BFLOAT16 || dtype == SNEPPX_DTYPE_FLOAT16;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Counter-based (layer.h's SNEPPX_SYNTHETIC_SEED rule): element i of tensor id t
 * depends on t and i only, so any rows can be made in any order. */
static void synthetic_rows(const struct sneppx_weight_source *source, int64_t first, int64_t count, float *out)
{
    const uint64_t stream = splitmix64(SNEPPX_SYNTHETIC_SEED + (uint64_t)source->tensor_id);
    const int64_t begin = first * source->cols, n = count * source->cols;
    for (int64_t i = 0; i < n; i++) {
        const double unit = (double)(splitmix64(stream ^ (uint64_t)(begin + i)) >> 11) * 0x1.0p-53; /* [0, 1) */
        out[i] = source->offset + source->scale * (float)(2.0 * unit - 1.0);
    }
}

static void memory_rows(const struct sneppx_weight_source *source, int64_t first, int64_t count, float *out)
{
    const int64_t begin = first * source->cols, n = count * source->cols;
    if (source->dtype == SNEPPX_DTYPE_FLOAT32) {
        memcpy(out, (const float *)source->data + begin, sizeof(float) * (size_t)n);
        return;
    }
    const uint16_t *bits = (const uint16_t *)source->data + begin;
    if (source->dtype == SNEPPX_DTYPE_BFLOAT16)
        for (int64_t i = 0; i < n; i++)
            out[i] = sneppx_bf16_to_f32(bits[i]);
    else
        for (int64_t i = 0; i < n; i++)
            out[i] = sneppx_f16_to_f32(bits[i]);
}

sneppx_status sneppx_weight_source_read(const struct sneppx_weight_source *source, int64_t first, int64_t count,
                                        float *out)
{
    switch (source->kind) {
    case SNEPPX_SOURCE_MEMORY:
        memory_rows(source, first, count, out);
        return SNEPPX_OK;
    case SNEPPX_SOURCE_FILE:
        return sneppx_safetensors_read_f32_range(source->file, source->index, first * source->cols,
                                                 count * source->cols, out);
    case SNEPPX_SOURCE_SYNTHETIC:
        synthetic_rows(source, first, count, out);
        return SNEPPX_OK;
    case SNEPPX_SOURCE_NONE:
        break;
    }
    memset(out, 0, sizeof(float) * (size_t)(count * source->cols));
    return SNEPPX_OK;
}

struct sneppx_weight_source sneppx_float32_source(const float *data, int64_t rows, int64_t cols)
{
    struct sneppx_weight_source source = {.kind = SNEPPX_SOURCE_MEMORY, .rows = rows, .cols = cols, .data = data,
                                          .dtype = SNEPPX_DTYPE_FLOAT32};
    return source;
}
