/* Internal: per-call scratch, pooled per layer (runtime/workspace.c). */
#ifndef SNEPPX_RUNTIME_WORKSPACE_H
#define SNEPPX_RUNTIME_WORKSPACE_H
#include "layer_internal.h"

sneppx_status sneppx_workspace_acquire(sneppx_layer *layer, int64_t batch, int64_t seq_len,
                                       struct sneppx_workspace **workspace);

/* What a cached forward (forward_cached.c) needs beyond a plain forward of
 * `tokens` tokens: attention scratch for kv_len keys per call, gather_floats
 * more per thread (ws->thread_scratch + ws->thread_gather_offset), and
 * plan_bytes of bookkeeping (ws->plan). A plain forward is {seq_len, 0, 0}. */
struct sneppx_workspace_needs {
    int64_t kv_len, gather_floats, plan_bytes;
};
sneppx_status sneppx_workspace_acquire_needs(sneppx_layer *layer, int64_t tokens,
                                             const struct sneppx_workspace_needs *needs,
                                             struct sneppx_workspace **workspace);
void sneppx_workspace_release(sneppx_layer *layer, struct sneppx_workspace *workspace);
void sneppx_workspace_free_all(sneppx_layer *layer);

#endif
