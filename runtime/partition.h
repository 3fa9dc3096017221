/* How the forward pipeline splits a stage into tasks for its threads. The
 * benchmarks include this too, so a stage there runs what the layer runs. */
#ifndef SNEPPX_PARTITION_H
#define SNEPPX_PARTITION_H

#include <stdint.h>

/* Query rows per attention task (one sequence, one kv head). */
#define SNEPPX_ATTN_TILE_ROWS 64

/* Which query tile of which (sequence, kv head) attention task number `task`
 * is, of sequences x kv_heads x q_tiles, dynamically scheduled. One (sequence,
 * kv head)'s tasks are consecutive, so the threads read the same K/V: at
 * T = 8192 the 8 heads' K/V (64 MB) outgrow L3 while one head's 8 MB stays
 * there. Within it the last query tiles come first: under a causal mask they
 * carry the most keys, and the small ones fill in at the end. */
struct sneppx_attention_task {
    int64_t sequence, kv_head, q_tile;
};

static inline struct sneppx_attention_task sneppx_attention_task_at(int64_t task, int64_t kv_heads, int64_t q_tiles)
{
    struct sneppx_attention_task at;
    at.q_tile = q_tiles - 1 - task % q_tiles;
    at.kv_head = task / q_tiles % kv_heads;
    at.sequence = task / (q_tiles * kv_heads);
    return at;
}

/* A GEMM task: rows x output columns of the product. */
struct sneppx_gemm_tiles {
    int64_t rows, cols;
};

/* At most this many rows and columns per GEMM task. The GEMM kernel copies a
 * task's activations once per k slice, so a task's copy is amortized over its
 * columns (192 x 256 tasks spent ~5% re-copying at T = 2048); and it sweeps
 * the task's C once per k slice, so the task's C (rows x cols floats) should
 * stay near L2. Measured on [2048, 4096] x [4096, 6144], one thread: 448 x 512
 * ran 3-7% faster than 192 x 256; 2048-row tasks 10% slower. */
#define SNEPPX_GEMM_MAX_TILE_ROWS 448
#define SNEPPX_GEMM_MAX_TILE_COLS 512
/* Columns of a task are a multiple of every kernel's panel width (2 x vector width). */
#define SNEPPX_GEMM_COL_ALIGN 32

/* The task shape for a [rows, k] x [k, n] product: as few tasks as the bounds
 * allow, of equal size, so the last row or column tile is not a sliver; rows
 * a multiple of row_align (the kernel's register tile height,
 * SNEPPX_GEMM_MR), so that only the matrix's last task pads a partial tile. */
static inline struct sneppx_gemm_tiles sneppx_gemm_tiles_for(int64_t rows, int64_t n, int64_t row_align)
{
    const int64_t row_tiles = (rows + SNEPPX_GEMM_MAX_TILE_ROWS - 1) / SNEPPX_GEMM_MAX_TILE_ROWS;
    const int64_t col_tiles = (n + SNEPPX_GEMM_MAX_TILE_COLS - 1) / SNEPPX_GEMM_MAX_TILE_COLS;
    struct sneppx_gemm_tiles tiles;
    tiles.rows = row_tiles > 0 ? (rows + row_tiles - 1) / row_tiles : 1;
    tiles.rows = (tiles.rows + row_align - 1) / row_align * row_align;
    tiles.cols = col_tiles > 0 ? (n + col_tiles - 1) / col_tiles : SNEPPX_GEMM_COL_ALIGN;
    tiles.cols = (tiles.cols + SNEPPX_GEMM_COL_ALIGN - 1) / SNEPPX_GEMM_COL_ALIGN * SNEPPX_GEMM_COL_ALIGN;
    return tiles;
}

#endif
