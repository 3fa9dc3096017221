/* Internal: the forward pipeline (runtime/forward.c): projections -> RoPE -> attention -> O projection. */
#ifndef SNEPPX_RUNTIME_FORWARD_H
#define SNEPPX_RUNTIME_FORWARD_H
#include "layer_internal.h"

/* Runs every stage with the layer's kernels and the given attention kernel
 * (layer.c resolves it for the call's mask mode); arguments already validated.
 * Fails only for a shard (runtime/shard.h) whose transport fails to sum out. */
sneppx_status sneppx_forward_run(const sneppx_layer *layer, const sneppx_kernel *attention,
                                 const struct sneppx_workspace *ws, int64_t batch, int64_t seq_len,
                                 const float *hidden, const float *mask, int64_t mask_batch_stride, float *out);

/* The stages before and after attention, for the cached forward (forward_cached.c):
 * project leaves q in ws->qkv (MLA absorbed: ws->q_absorbed [tokens, H, latent])
 * and k|v in ws->qkv rows after q (MLA: ws->latent rows), RoPE applied with
 * ws->cos/sin; output reads ws->attn_out. */
void sneppx_forward_project(const sneppx_layer *layer, const struct sneppx_workspace *ws, int64_t tokens,
                            const float *hidden);
sneppx_status sneppx_forward_output(const sneppx_layer *layer, const struct sneppx_workspace *ws, int64_t tokens,
                                    float *out);

#endif
