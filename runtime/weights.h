/* Internal: packing HF weights into the GEMM panels of a layer (runtime/weights.c). */
#ifndef SNEPPX_RUNTIME_WEIGHTS_H
#define SNEPPX_RUNTIME_WEIGHTS_H
#include "layer_internal.h"

sneppx_status sneppx_pack_gemm(sneppx_layer *layer, struct sneppx_packed_gemm *gemm, int64_t instances,
                               int has_bias);
void sneppx_pack_gemm_instance(struct sneppx_packed_gemm *gemm, int64_t instance, const float *hf_weight,
                               int64_t hf_row_stride);
sneppx_status sneppx_layer_load_weights(sneppx_layer *layer, const sneppx_weights *weights);

#endif
