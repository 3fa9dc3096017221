/* How the forward pipeline splits a stage into tasks for its threads. The
 * benchmarks include this too, so a stage there runs what the layer runs. */
#ifndef SNEPPX_PARTITION_H
#define SNEPPX_PARTITION_H

#include <stdint.h>

/* Query rows per attention task (one sequence, one kv head), and the fewest
 * it is cut to: the flash kernel works in blocks of 16 query positions. */
#define SNEPPX_ATTN_TILE_ROWS 64
#define SNEPPX_ATTN_MIN_TILE_ROWS 16
/* Tiles are cut (64 -> 32 -> 16 rows) while there are fewer tasks than this per thread. */
#define SNEPPX_ATTN_TASKS_PER_THREAD 4

/* Query rows per attention task for `sequences` x `kv_heads` heads of seq_len
 * queries on `threads` threads. A causal task's work grows with its last
 * query, so with few tasks the last one decides the time: deepseek-v2-lite's
 * absorbed attention (one K/V head) at T = 128 made 2 tasks of 64 rows, one
 * with 3x the other's work. Smaller tiles cost little (each 16-query block
 * reads its keys once either way) but are kept for when they are needed: each
 * task is an OpenMP dispatch. */
static inline int64_t sneppx_attention_tile_rows(int64_t seq_len, int64_t sequences, int64_t kv_heads, int threads)
{
    const int64_t heads = sequences * kv_heads > 0 ? sequences * kv_heads : 1;
    const int64_t wanted = SNEPPX_ATTN_TASKS_PER_THREAD * (threads > 1 ? threads : 1);
    int64_t rows = SNEPPX_ATTN_TILE_ROWS;
    while (rows > SNEPPX_ATTN_MIN_TILE_ROWS && heads * ((seq_len + rows - 1) / rows) < wanted)
        rows /= 2;
    return rows;
}

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
 * task's activations once per k slice, so the copy is amortized over the
 * task's columns; it sweeps the task's C once per k slice, which costs little
 * even from L3 (a 14 x 32 tile is loaded and stored once per 512 k steps).
 * Measured on [2048, 4096] x [4096, 6144] and x [4096, 4096], one process
 * timing the shapes interleaved: 518 x 2048 ran 2-4% faster than 420 x 512
 * on one and two threads (perf: the copy was 4% of the time at 512 columns),
 * 192 x 256 5% slower still; 224 x 6144 (all columns, C of 5.5 MB) 6% slower.
 * With a memory-streaming loop on the other core, 518 x 2048 ran 2-3% slower
 * than 420 x 512 (README, Performance). */
#define SNEPPX_GEMM_MAX_TILE_ROWS 560
#define SNEPPX_GEMM_MAX_TILE_COLS 2048
/* Columns of a task are a multiple of every kernel's panel width (2 x vector width). */
#define SNEPPX_GEMM_COL_ALIGN 32

static inline int64_t sneppx_partition_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Threads may idle at most this fraction of a stage's time (tasks counted equal). */
#define SNEPPX_GEMM_MAX_IDLE 0.05

/* The fraction of `threads` threads' time that `tasks` equal tasks keep busy. */
static inline double sneppx_gemm_busy(int64_t tasks, int threads)
{
    const int64_t workers = threads > 1 ? threads : 1;
    return (double)tasks / (double)(sneppx_partition_ceil_div(tasks, workers) * workers);
}

/* The task shape for `instances` products [rows, k] x [k, n] on `threads`
 * threads (static schedule): tasks of equal size, rows a multiple of row_align
 * (the kernel's register tile height, SNEPPX_GEMM_MR) so that only the
 * matrix's last task pads a partial tile; as few column tiles as the bounds
 * allow, and a few more when the threads would otherwise idle more than
 * SNEPPX_GEMM_MAX_IDLE (3 tasks on 2 threads idle one thread a third of the
 * time; 4 tasks of 1536 columns instead of 3 of 2048 cost nothing measurable). */
static inline struct sneppx_gemm_tiles sneppx_gemm_tiles_for(int64_t rows, int64_t n, int64_t row_align,
                                                             int64_t instances, int threads)
{
    struct sneppx_gemm_tiles tiles;
    if (rows <= 0 || n <= 0) {
        tiles.rows = row_align > 0 ? row_align : 1;
        tiles.cols = SNEPPX_GEMM_COL_ALIGN;
        return tiles;
    }
    const int64_t row_tiles = sneppx_partition_ceil_div(rows, SNEPPX_GEMM_MAX_TILE_ROWS);
    tiles.rows = sneppx_partition_ceil_div(sneppx_partition_ceil_div(rows, row_tiles), row_align) * row_align;
    const int64_t row_tasks = (instances > 0 ? instances : 1) * sneppx_partition_ceil_div(rows, tiles.rows);
    const int64_t panels = sneppx_partition_ceil_div(n, SNEPPX_GEMM_COL_ALIGN);
    const int64_t min_col_tiles = sneppx_partition_ceil_div(n, SNEPPX_GEMM_MAX_TILE_COLS);
    const int64_t workers = threads > 1 ? threads : 1;
    double best_busy = -1.0;
    /* The search stops at 4 tiles per thread more than the fewest: by then the
     * best balance is found or the tasks are small enough that it is close. */
    for (int64_t col_tiles = min_col_tiles; col_tiles <= panels && col_tiles <= min_col_tiles + 4 * workers;
         col_tiles++) {
        const int64_t cols = sneppx_partition_ceil_div(n, col_tiles * SNEPPX_GEMM_COL_ALIGN) * SNEPPX_GEMM_COL_ALIGN;
        const int64_t tasks = row_tasks * sneppx_partition_ceil_div(n, cols);
        const double busy = sneppx_gemm_busy(tasks, threads);
        if (busy > best_busy) {
            best_busy = busy;
            tiles.cols = cols;
        }
        if (busy >= 1.0 - SNEPPX_GEMM_MAX_IDLE)
            break;
    }
    return tiles;
}

#endif
