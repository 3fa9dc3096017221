/* Internal: allocations big enough to want huge pages (runtime/big_alloc.c). */
#ifndef SNEPPX_RUNTIME_BIG_ALLOC_H
#define SNEPPX_RUNTIME_BIG_ALLOC_H
#include <stddef.h>

/* 64-byte aligned; from 4 MiB on, 2 MiB aligned with huge pages advised. Free with free(). */
void *sneppx_alloc_big(size_t bytes);

/* sneppx_alloc_big of count floats. */
void *sneppx_alloc_floats(size_t count);

#endif
