/* sneppx — reading HuggingFace safetensors checkpoints.
 *
 * File format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"<tensor name>": {"dtype": "BF16", "shape": [rows, cols],
 *                      "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"<key>": "<string>", ...}}
 * then the data buffer; offsets are byte offsets into that buffer, data is
 * little-endian and row-major.
 *
 * Two levels:
 *   - one file: sneppx_safetensors_open() opens it, parses the header
 *     with cJSON and validates every entry (header length within the file,
 *     known dtype, shape product times element size equal to the byte range,
 *     ranges inside the data buffer and not overlapping, no integer overflow);
 *     sneppx_safetensors_read_f32() reads one tensor with pread (not a
 *     memory map: a file truncated while open is SNEPPX_ERR_IO naming the
 *     file and the tensor, not SIGBUS) and converts it (F32, F16, BF16, F64)
 *     to float32.
 *   - one layer of a checkpoint: sneppx_attn_weights_load() resolves a
 *     checkpoint directory, a single .safetensors file or a sharded
 *     checkpoint's model.safetensors.index.json, opens only the shards that
 *     hold layer L's self_attn tensors, checks their names and shapes against
 *     a config (missing, extra and mis-shaped tensors are errors naming the
 *     tensor and the file) and owns the float32 copies behind a sneppx_weights;
 *     sneppx_layer_create_from_safetensors() packs a layer from it directly,
 *     a few rows at a time, without those copies.
 *
 * Every error message names the file, and the tensor when there is one. */
#ifndef SNEPPX_SAFETENSORS_H
#define SNEPPX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "sneppx/config.h"
#include "sneppx/export.h"
#include "sneppx/layer.h"
#include "sneppx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ one file */

typedef struct sneppx_safetensors sneppx_safetensors;

typedef struct sneppx_tensor_info {
    const char *name;        /* as in the file, "model.layers.0.self_attn.q_proj.weight" */
    const char *dtype;       /* as in the file, "F32", "BF16", ... */
    int rank;
    const int64_t *shape;    /* rank entries */
    int64_t element_count;   /* product of shape (1 for rank 0) */
    uint64_t byte_size;
} sneppx_tensor_info;

/* Opens and validates path. The file stays open until close. */
SNEPPX_API sneppx_status sneppx_safetensors_open(const char *path, sneppx_safetensors **file);

/* Tensors in the file (the "__metadata__" entry is not one), sorted by name. */
SNEPPX_API int64_t sneppx_safetensors_tensor_count(const sneppx_safetensors *file);

/* Name, dtype and shape of the index-th tensor; strings and shape live until close. */
SNEPPX_API sneppx_status sneppx_safetensors_tensor_info(const sneppx_safetensors *file, int64_t index,
                                                        sneppx_tensor_info *info);

/* Index of the tensor with exactly this name, or -1. */
SNEPPX_API int64_t sneppx_safetensors_find(const sneppx_safetensors *file, const char *name);

/* Converts the index-th tensor to float32 into out, which holds out_count
 * floats and must match the tensor's element count. Dtypes F32, F16, BF16
 * and F64 convert: F32 as stored, bit for bit; F16 and BF16 widen exactly
 * (every value is a float32 value; a NaN keeps its sign and payload, at the
 * top of the float32's fraction); F64 rounds to nearest, ties to even (past
 * the float32 range to inf; a NaN stays a NaN, its payload not kept). Any
 * other dtype is an error.
 * Arguments are checked before anything is written; a read that fails
 * part-way (the file cut short or unreadable since it was opened) leaves out
 * partly written: the data streams into out, with no copy of the tensor. */
SNEPPX_API sneppx_status sneppx_safetensors_read_f32(const sneppx_safetensors *file, int64_t index,
                                                     float *out, int64_t out_count);

/* The path the file was opened with. */
SNEPPX_API const char *sneppx_safetensors_path(const sneppx_safetensors *file);

SNEPPX_API void sneppx_safetensors_close(sneppx_safetensors *file);

/* ------------------------------------------- the tensors of one self_attn */

#define SNEPPX_ATTN_TENSORS_MAX 12

typedef struct sneppx_attn_tensor {
    const char *name;        /* HF name inside self_attn: "q_proj.weight", "kv_a_layernorm.weight" */
    int rank;                /* 2 for projection weights [out, in], 1 for biases and norms */
    int64_t shape[2];
    size_t weights_offset;   /* offsetof(sneppx_weights, <the field this tensor fills>) */
} sneppx_attn_tensor;

/* The tensors a layer of this config holds, with the shapes it expects, in a
 * fixed order (at most SNEPPX_ATTN_TENSORS_MAX). Biases appear only when the
 * config has them (qkv_bias: q/k/v, or MLA's q_a_proj and kv_a_proj_with_mqa;
 * o_bias: o_proj). MLA configs (kv_lora_rank > 0) list DeepSeek's names:
 * q_a_proj/q_a_layernorm/q_b_proj, or q_proj when q_lora_rank is 0. */
SNEPPX_API sneppx_status sneppx_attn_tensors(const sneppx_config *config,
                                             sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX],
                                             int *count);

/* 1 if name (inside self_attn) is a buffer some checkpoints carry that sneppx
 * recomputes instead of loading ("rotary_emb.inv_freq" of older Llama files). */
SNEPPX_API int sneppx_attn_tensor_is_ignored(const char *name);

/* ------------------------------------------------ one layer of a checkpoint */

typedef struct sneppx_attn_weights sneppx_attn_weights;

/* Loads layer `layer`'s self_attn tensors for config from path: a directory
 * (model.safetensors, else model.safetensors.index.json, else every
 * *.safetensors file in it: transformers' order), a .json index with a
 * "weight_map", or a .safetensors file. A tensor belongs to the layer when its name ends in
 * "layers.<layer>.self_attn.<HF name>" after a prefix ("model.",
 * "language_model.model.", or none) that holds every tensor the config needs:
 * a multimodal checkpoint's vision tower, whose encoder layers have self_attn
 * tensors of their own under another prefix, is passed over; two complete
 * prefixes are SNEPPX_ERR_FORMAT, naming both. */
SNEPPX_API sneppx_status sneppx_attn_weights_load(const char *path, int64_t layer,
                                                  const sneppx_config *config,
                                                  sneppx_attn_weights **weights);

/* The loaded tensors as the layer API takes them; valid until free. */
SNEPPX_API const sneppx_weights *sneppx_attn_weights_view(const sneppx_attn_weights *weights);

SNEPPX_API void sneppx_attn_weights_free(sneppx_attn_weights *weights);

/* sneppx_layer_create() from layer `layer_index` of the checkpoint at path
 * (found and checked as sneppx_attn_weights_load finds and checks it), packed
 * straight from the file: each pack task reads its 64 output rows of the
 * tensor (wherever they are: q, k or v of the fused projection) with pread,
 * widens them into a float32 scratch of its thread and packs them into
 * config->weight_dtype. No tensor is ever copied whole, so loading needs the
 * packed weights plus a scratch of 64 rows (6 bytes per element for a 16-bit
 * file) per thread, not a float32 copy of the layer; a BF16 file into a
 * bfloat16 layer keeps every bit. Biases and norm weights become float32; MLA's
 * kv_b_proj is widened whole for the absorption (float32, then packed).
 * F32, F16, BF16 and F64 tensors are read; any other dtype is
 * SNEPPX_ERR_UNSUPPORTED naming the tensor and the dtype, before anything is
 * packed. Thread-safe, as sneppx_layer_create. */
SNEPPX_API sneppx_status sneppx_layer_create_from_safetensors(const sneppx_config *config, const char *path,
                                                              int64_t layer_index, sneppx_layer **layer);

#ifdef __cplusplus
}
#endif
#endif
