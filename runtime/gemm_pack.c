#include "gemm_pack.h"

#include "kernel_args.h"

void sneppx_gemm_pack_columns(const sneppx_kernel *kernel, const float *rows, int64_t k, int64_t c0, int64_t c1,
                              void *panels)
{
    struct sneppx_args args = sneppx_kernel_args();
    args.col_begin = c0;
    args.col_end = c1;
    args.src = rows;
    args.src_stride = k;
    args.dst = (float *)panels; /* the ABI's pointer type; the entry writes the key's weight type */
    kernel->entry[SNEPPX_ENTRY_PACK](&args);
}

void sneppx_gemm_pack_matrix(const sneppx_kernel *kernel, const float *weights, int64_t k, int64_t n, void *panels,
                             int threads)
{
    const int64_t tasks = (n + SNEPPX_PACK_COLUMNS - 1) / SNEPPX_PACK_COLUMNS;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t c0 = task * SNEPPX_PACK_COLUMNS;
        sneppx_gemm_pack_columns(kernel, weights, k, c0, c0 + SNEPPX_PACK_COLUMNS < n ? c0 + SNEPPX_PACK_COLUMNS : n,
                                 panels);
    }
}
