/* Internal: a layer's thread count (runtime/threads.c). */
#ifndef SNEPPX_RUNTIME_THREADS_H
#define SNEPPX_RUNTIME_THREADS_H
#include "layer_internal.h"

/* config.num_threads (0 = OpenMP's default) as every region of the layer takes it (team.h). */
int sneppx_thread_count(const sneppx_layer *layer);

#endif
