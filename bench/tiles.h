/* The parallel partitions the stage benchmarks call kernels over: the same
 * tiles, schedules and loop order as runtime/forward.c, so that a stage here
 * measures what the layer runs. (The runtime exports no entry point for its
 * partitions; when it does, these become calls to it.) */
#ifndef SNEPPX_BENCH_TILES_H
#define SNEPPX_BENCH_TILES_H

#include <stdint.h>

#include "kernels.h"

/* forward.c's GEMM task: rows x output columns (columns a multiple of every NR). */
#define BENCH_GEMM_TILE_ROWS 192
#define BENCH_GEMM_TILE_COLS 256
/* forward.c's attention task: query rows of one (sequence, kv head). */
#define BENCH_ATTN_TILE_ROWS 64

/* A zeroed argument block with the ABI's size and version filled in. */
struct sneppx_args bench_new_args(void);

/* Overrides the GEMM task shape (--gemm-tile), to measure other tilings
 * against the runtime's; cols must be a multiple of 2 * vector width. */
void bench_set_gemm_tile(int64_t rows, int64_t cols);
void bench_gemm_tile(int64_t *rows, int64_t *cols);

/* dst[r, c] = src[r, :] . W[c, :] (+ bias) for r < rows, c < n, over `threads`
 * OpenMP threads: row tiles x column tiles, statically scheduled. */
void bench_gemm_tiles(const sneppx_kernel *kernel, int threads, int64_t rows, int64_t n, const float *src,
                      int64_t src_stride, const float *panels, const float *bias, float *dst, int64_t dst_stride);

/* Causal self-attention of one sequence of seq_len tokens: q [seq_len, kv_heads *
 * group * d] (the group's heads adjacent), k and v [seq_len, kv_heads * d],
 * o like q. Tasks are (query tile, kv head), dynamically scheduled, last query
 * tiles first (they see the most keys). scratch: threads x scratch_floats. */
struct bench_attention_operands {
    const float *q, *k, *v;
    float *o;
    int64_t seq_len, kv_heads, group, head_dim;
    float softmax_scale;
    float *scratch;
    int64_t scratch_floats;
};
void bench_attention_tiles(const sneppx_kernel *kernel, int threads, const struct bench_attention_operands *ops);

#endif
