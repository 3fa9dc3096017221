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

/* Elements per row of the whole tensor, and where row r of the source starts in it. */
static int64_t stride_of(const struct sneppx_weight_source *source)
{
    return source->stride ? source->stride : source->cols;
}

static int64_t row_start(const struct sneppx_weight_source *source, int64_t r)
{
    return (source->row0 + r) * stride_of(source) + source->col0;
}

int sneppx_weight_source_rows_contiguous(const struct sneppx_weight_source *source)
{
    return stride_of(source) == source->cols;
}

/* Counter-based (layer.h's SNEPPX_SYNTHETIC_SEED rule): element i of tensor id t
 * depends on t and i only, so any rows can be made in any order. */
static void synthetic_row(const struct sneppx_weight_source *source, int64_t begin, int64_t n, float *out)
{
    const uint64_t stream = splitmix64(SNEPPX_SYNTHETIC_SEED + (uint64_t)source->tensor_id);
    for (int64_t i = 0; i < n; i++) {
        const double unit = (double)(splitmix64(stream ^ (uint64_t)(begin + i)) >> 11) * 0x1.0p-53; /* [0, 1) */
        out[i] = source->offset + source->scale * (float)(2.0 * unit - 1.0);
    }
}

static void memory_row(const struct sneppx_weight_source *source, int64_t begin, int64_t n, float *out)
{
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

/* Elements [begin, begin + n) of the whole tensor, in its order. */
static sneppx_status read_run(const struct sneppx_weight_source *source, int64_t begin, int64_t n, float *out)
{
    switch (source->kind) {
    case SNEPPX_SOURCE_MEMORY:
        memory_row(source, begin, n, out);
        return SNEPPX_OK;
    case SNEPPX_SOURCE_FILE:
        return sneppx_safetensors_read_f32_range(source->file, source->index, begin, n, out);
    case SNEPPX_SOURCE_SYNTHETIC:
        synthetic_row(source, begin, n, out);
        return SNEPPX_OK;
    case SNEPPX_SOURCE_NONE:
        break;
    }
    memset(out, 0, sizeof(float) * (size_t)n);
    return SNEPPX_OK;
}

sneppx_status sneppx_weight_source_read(const struct sneppx_weight_source *source, int64_t first, int64_t count,
                                        float *out)
{
    /* Whole rows are one run of the tensor; a column view reads row by row. */
    if (sneppx_weight_source_rows_contiguous(source))
        return read_run(source, row_start(source, first), count * source->cols, out);
    sneppx_status status = SNEPPX_OK;
    for (int64_t r = 0; r < count && status == SNEPPX_OK; r++)
        status = read_run(source, row_start(source, first + r), source->cols, out + r * source->cols);
    return status;
}

struct sneppx_weight_source sneppx_weight_source_view(const struct sneppx_weight_source *whole, int64_t whole_cols,
                                                      int64_t row0, int64_t rows, int64_t col0, int64_t cols)
{
    struct sneppx_weight_source view = *whole;
    view.row0 = whole->row0 + row0;
    view.col0 = whole->col0 + col0;
    view.stride = whole->stride ? whole->stride : whole_cols;
    view.rows = rows;
    view.cols = cols;
    return view;
}

struct sneppx_weight_source sneppx_float32_source(const float *data, int64_t rows, int64_t cols)
{
    struct sneppx_weight_source source = {.kind = SNEPPX_SOURCE_MEMORY, .rows = rows, .cols = cols, .data = data,
                                          .dtype = SNEPPX_DTYPE_FLOAT32};
    return source;
}
