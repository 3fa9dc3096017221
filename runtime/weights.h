/* Internal: packing HF weights into the GEMM panels of a layer (runtime/weights.c). */
#ifndef SNEPPX_RUNTIME_WEIGHTS_H
#define SNEPPX_RUNTIME_WEIGHTS_H
#include "layer_internal.h"
#include "weight_source.h"

/* Allocates gemm's panels for `instances` matrices (and its bias). */
sneppx_status sneppx_pack_gemm(sneppx_layer *layer, struct sneppx_packed_gemm *gemm, int64_t instances,
                               int has_bias);
/* Packs instance `instance` from parts stacked row after row (their rows sum
 * to gemm->n, each has gemm->k columns), SNEPPX_PACK_COLUMNS rows per task: float32
 * rows in memory in place, any other rows through a float32 scratch per thread. */
sneppx_status sneppx_pack_gemm_sources(struct sneppx_packed_gemm *gemm, int64_t instance,
                                       const struct sneppx_weight_source *const parts[], int part_count);
/* The same from one float32 [n, k] matrix in memory (cannot fail). */
void sneppx_pack_gemm_instance(struct sneppx_packed_gemm *gemm, int64_t instance, const float *hf_weight);

/* Checks that sources hold exactly the tensors config needs (naming the
 * sneppx_weights field otherwise) and sets each one's rows and cols. */
sneppx_status sneppx_weight_sources_check(const sneppx_config *config,
                                          struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS]);
/* Checks and packs every tensor of the layer from sources. */
sneppx_status sneppx_layer_load_sources(sneppx_layer *layer, struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS]);
/* The seeded weights of layer.h's rule: a source per tensor config needs (config
 * validated first), each of its whole shape. */
sneppx_status sneppx_synthetic_sources(const sneppx_config *config,
                                      struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS]);
/* A source per non-NULL tensor of weights (shapes: from the config, when checked). */
void sneppx_float32_sources(const sneppx_weights *weights, struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS]);
/* The same of typed weights, refusing a NULL weights, a dtype packing cannot widen or
 * 16-bit elements at an odd address, naming the field. */
sneppx_status sneppx_typed_sources(const sneppx_typed_weights *weights,
                                   struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS]);
/* Checks the sources, then makes the layer (kernels) and packs them; *out untouched on failure. */
sneppx_status sneppx_layer_create_from_sources(const sneppx_config *config,
                                               struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS],
                                               sneppx_layer **out);

#endif
