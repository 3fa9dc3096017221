/* Internal: reading part of a tensor of an open safetensors file
 * (runtime/safetensors.c), for packing a few rows at a time. */
#ifndef SNEPPX_RUNTIME_SAFETENSORS_INTERNAL_H
#define SNEPPX_RUNTIME_SAFETENSORS_INTERNAL_H
#include <stdint.h>

#include "sneppx/safetensors.h"

/* SNEPPX_OK if the index-th tensor's dtype converts to float32, else
 * SNEPPX_ERR_UNSUPPORTED naming the file, the tensor and the dtype. index is valid. */
sneppx_status sneppx_safetensors_check_f32(const sneppx_safetensors *file, int64_t index);

/* Elements [first, first + count) of the index-th tensor (in range, of a dtype
 * check_f32 accepts) as float32 into out. Safe from several threads at once. */
sneppx_status sneppx_safetensors_read_f32_range(const sneppx_safetensors *file, int64_t index, int64_t first,
                                                int64_t count, float *out);

#endif
