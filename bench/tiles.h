/* The parallel partitions the stage benchmarks call kernels over: the tiles
 * of templates/partition.h.j2, with the schedules and loop order of
 * runtime/forward.c, so that a stage here measures what the layer runs. */
#ifndef SNEPPX_BENCH_TILES_H
#define SNEPPX_BENCH_TILES_H

#include <stdint.h>

#include "kernels.h"
#include "sneppx_abi.h"

/* A zeroed argument block with the ABI's size and version filled in. */
struct sneppx_args bench_new_args(void);

/* Overrides the GEMM task shape (--gemm-tile), to measure other tilings
 * against the runtime's; cols must be a multiple of SNEPPX_GEMM_COL_ALIGN. */
void bench_set_gemm_tile(int64_t rows, int64_t cols);
/* The task shape bench_gemm_tiles() uses for a [rows, k] x [k, n] product of
 * a kernel of `target` (whose gemm_mr the runtime's tasks are multiples of). */
struct sneppx_gemm_tiles bench_gemm_tile(const struct sneppx_target *target, int64_t rows, int64_t n, int threads);

/* dst[r, c] = src[r, :] . W[c, :] (+ bias) for r < rows, c < n, over `threads`
 * OpenMP threads: row tiles x column tiles, statically scheduled; kernel is
 * one of target's. */
void bench_gemm_tiles(const sneppx_kernel *kernel, const struct sneppx_target *target, int threads, int64_t rows,
                      int64_t n, const float *src, int64_t src_stride, const float *panels, const float *bias,
                      float *dst, int64_t dst_stride);

/* Self-attention of one sequence of seq_len tokens: q [seq_len, kv_heads *
 * group * d] (the group's heads adjacent), k and v [seq_len, kv_heads * d],
 * o like q; mask, for a kernel of explicit mask mode, the additive [seq_len,
 * seq_len] plane (row stride mask_stride) every head shares. Tasks are (query
 * tile, kv head), dynamically scheduled in the order of
 * sneppx_attention_task_at(). scratch: threads x scratch_floats. */
struct bench_attention_operands {
    const float *q, *k, *v;
    float *o;
    int64_t seq_len, kv_heads, group, head_dim;
    float softmax_scale;
    float *scratch;
    int64_t scratch_floats;
    const float *mask;
    int64_t mask_stride;
};
void bench_attention_tiles(const sneppx_kernel *kernel, int threads, const struct bench_attention_operands *ops);

#endif
