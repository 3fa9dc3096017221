/* Internal: where one weight tensor's elements come from while a layer packs
 * them. Packing asks a source for a few rows at a time as float32 (a pack
 * task's columns), so no source is ever copied whole: the caller's memory in
 * its own element type, a tensor of an open safetensors file (read with
 * pread), or the seeded synthetic weights (computed per element). */
#ifndef SNEPPX_RUNTIME_WEIGHT_SOURCE_H
#define SNEPPX_RUNTIME_WEIGHT_SOURCE_H
#include <stdint.h>

#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "sneppx/safetensors.h"

/* sneppx_weights' fields (all pointers): a source's field index is its
 * field's position, offsetof(sneppx_weights, field) / sizeof(const float *). */
#define SNEPPX_WEIGHT_FIELDS ((int)(sizeof(sneppx_weights) / sizeof(const float *)))

enum sneppx_source_kind { SNEPPX_SOURCE_NONE = 0, SNEPPX_SOURCE_MEMORY, SNEPPX_SOURCE_FILE, SNEPPX_SOURCE_SYNTHETIC };

struct sneppx_weight_source {
    enum sneppx_source_kind kind;
    int64_t rows, cols;                /* the tensor's [out, in] (a rank-1 tensor: [n, 1]) */
    /* A view (a shard's rows and columns, sneppx_weight_source_view): element (r, c) is
     * the whole tensor's (row0 + r, col0 + c), in rows of stride elements; stride 0 is
     * the whole tensor itself (row0 = col0 = 0, stride = cols). */
    int64_t row0, col0, stride;
    /* MEMORY: row-major elements of dtype (FLOAT32, BFLOAT16 or FLOAT16 bits). */
    const void *data;
    sneppx_dtype dtype;
    /* FILE: the index-th tensor of file (any dtype sneppx_safetensors_read_f32 reads). */
    const sneppx_safetensors *file;
    int64_t index;
    /* SYNTHETIC: offset + scale * u, u uniform in [-1, 1) from the tensor id's stream. */
    int tensor_id;
    float scale, offset;
};

/* The field names of sneppx_weights, by field index ("q_proj_weight", ...). */
extern const char *const sneppx_weight_field_names[];

/* 1 if a MEMORY source may hold elements of dtype (the types packing widens from). */
int sneppx_source_dtype_supported(int dtype);

/* Rows [first, first + count) as float32 into out (count * cols floats, row-major).
 * Fails only for FILE sources (the file changed since it was opened, or no memory);
 * the message then names the file and the tensor. */
sneppx_status sneppx_weight_source_read(const struct sneppx_weight_source *source, int64_t first, int64_t count,
                                        float *out);

/* Rows [row0, row0 + rows) and columns [col0, col0 + cols) of whole, a source of a
 * whole tensor of whole_cols columns: what a shard reads of it. Synthetic elements keep
 * their whole tensor's indices, so a view's values are the whole tensor's. */
struct sneppx_weight_source sneppx_weight_source_view(const struct sneppx_weight_source *whole, int64_t whole_cols,
                                                      int64_t row0, int64_t rows, int64_t col0, int64_t cols);

/* 1 if the source's rows are whole rows of its tensor, consecutive in memory. */
int sneppx_weight_source_rows_contiguous(const struct sneppx_weight_source *source);

/* A float32 [rows, cols] tensor in memory as a source. */
struct sneppx_weight_source sneppx_float32_source(const float *data, int64_t rows, int64_t cols);

#endif
