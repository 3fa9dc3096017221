/* Kernel calls over OpenMP threads, partitioned as runtime/forward.c does. */
#include "tiles.h"

#include <omp.h>
#include <string.h>

#include "kernel_args.h"

/* --gemm-tile's shape; zero: the runtime's (templates/partition.h.j2). */
static int64_t gemm_tile_rows, gemm_tile_cols;

struct sneppx_args bench_new_args(void) { return sneppx_kernel_args(); }

void bench_set_gemm_tile(int64_t rows, int64_t cols)
{
    gemm_tile_rows = rows;
    gemm_tile_cols = cols;
}

struct sneppx_gemm_tiles bench_gemm_tile(const struct sneppx_target *target, int64_t rows, int64_t n, int threads)
{
    if (gemm_tile_rows == 0)
        return sneppx_gemm_tiles_for(rows, n, target->gemm_mr, 1, threads);
    return (struct sneppx_gemm_tiles){.rows = gemm_tile_rows, .cols = gemm_tile_cols};
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void bench_gemm_tiles(const sneppx_kernel *kernel, const struct sneppx_target *target, int threads, int64_t rows,
                      int64_t n, const float *src, int64_t src_stride, const float *panels, const float *bias,
                      float *dst, int64_t dst_stride)
{
    const struct sneppx_gemm_tiles tile = bench_gemm_tile(target, rows, n, threads);
    const int64_t tile_rows = tile.rows, tile_cols = tile.cols;
    const int64_t row_tiles = ceil_div(rows, tile_rows), col_tiles = ceil_div(n, tile_cols);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < row_tiles * col_tiles; task++) {
        const int64_t col_tile = task / row_tiles, row_tile = task % row_tiles;
        struct sneppx_args args = bench_new_args();
        args.row_begin = row_tile * tile_rows;
        args.row_end = args.row_begin + tile_rows < rows ? args.row_begin + tile_rows : rows;
        args.col_begin = col_tile * tile_cols;
        args.col_end = args.col_begin + tile_cols < n ? args.col_begin + tile_cols : n;
        args.src = src;
        args.src_stride = src_stride;
        args.weight = panels;
        args.bias = bias;
        args.dst = dst;
        args.dst_stride = dst_stride;
        kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
}

void bench_attention_tiles(const sneppx_kernel *kernel, int threads, const struct bench_attention_operands *ops)
{
    const int64_t tile_rows = sneppx_attention_tile_rows(ops->seq_len, 1, ops->kv_heads, threads);
    const int64_t q_tiles = ceil_div(ops->seq_len, tile_rows);
    const int64_t q_width = ops->kv_heads * ops->group * ops->head_dim, kv_width = ops->kv_heads * ops->head_dim;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t task = 0; task < q_tiles * ops->kv_heads; task++) {
        const struct sneppx_attention_task at =
            sneppx_attention_task_at(task, ops->kv_heads, q_tiles, tile_rows, ops->seq_len);
        const int64_t kv_head = at.kv_head;
        struct sneppx_args args = bench_new_args();
        args.row_begin = at.row_begin;
        args.row_end = at.row_end;
        args.q = ops->q + kv_head * ops->group * ops->head_dim;
        args.k = ops->k + kv_head * ops->head_dim;
        args.v = ops->v + kv_head * ops->head_dim;
        args.o = ops->o + kv_head * ops->group * ops->head_dim;
        args.q_stride = q_width;
        args.k_stride = kv_width;
        args.v_stride = kv_width;
        args.o_stride = q_width;
        args.q_len = ops->seq_len;
        args.kv_len = ops->seq_len;
        args.softmax_scale = ops->softmax_scale;
        args.mask = ops->mask;
        args.mask_stride = ops->mask_stride;
        args.scratch = ops->scratch + omp_get_thread_num() * ops->scratch_floats;
        kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
}
