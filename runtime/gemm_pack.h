/* Internal: the GEMM's _pack entry called over tasks of output columns, the one
 * loop that turns float32 [n, k] rows into a key's panels (weights.c from each
 * source, the tuner from its random matrix, the bench's stages). */
#ifndef SNEPPX_RUNTIME_GEMM_PACK_H
#define SNEPPX_RUNTIME_GEMM_PACK_H
#include <stdint.h>

#include "kernels.h"
#include "sneppx_abi.h"

/* Output columns per pack task: enough to amortize a call, few enough that a
 * thread's float32 scratch of them stays small (64 rows of k 4096: 1 MiB). */
#define SNEPPX_PACK_COLUMNS 64
_Static_assert(SNEPPX_PACK_COLUMNS % SNEPPX_GEMM_COL_ALIGN == 0,
               "a pack task ends on a panel boundary of every target");

/* Packs output columns [c0, c1) into panels by kernel's _pack entry, which
 * rounds (or quantizes) them to the key's weight type. rows holds the float32
 * rows indexed by absolute column: row c at rows + c * k. */
void sneppx_gemm_pack_columns(const sneppx_kernel *kernel, const float *rows, int64_t k, int64_t c0, int64_t c1,
                              void *panels);
/* Packs all of the float32 [n, k] matrix weights into panels, a task of
 * SNEPPX_PACK_COLUMNS columns at a time on `threads` OpenMP threads. */
void sneppx_gemm_pack_matrix(const sneppx_kernel *kernel, const float *weights, int64_t k, int64_t n, void *panels,
                             int threads);

#endif
