/* Internal: a layer's thread count and aligned allocations (runtime/threads.c). */
#ifndef SNEPPX_RUNTIME_THREADS_H
#define SNEPPX_RUNTIME_THREADS_H
#include "layer_internal.h"

int sneppx_thread_count(const sneppx_layer *layer);
void *sneppx_alloc_floats(size_t count);   /* sneppx_alloc_big of count floats */

#endif
