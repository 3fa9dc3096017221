/* Internal: per-call scratch, pooled per layer (runtime/workspace.c). */
#ifndef SNEPPX_RUNTIME_WORKSPACE_H
#define SNEPPX_RUNTIME_WORKSPACE_H
#include "layer_internal.h"

sneppx_status sneppx_workspace_acquire(sneppx_layer *layer, int64_t batch, int64_t seq_len,
                                       struct sneppx_workspace **workspace);
void sneppx_workspace_release(sneppx_layer *layer, struct sneppx_workspace *workspace);
void sneppx_workspace_free_all(sneppx_layer *layer);

#endif
