/* The GEMM task partition (templates/partition.h.j2): tasks cover the product
 * exactly once, stay within the bounds, keep rows whole register tiles and
 * columns whole panels, and columns are split past the bound only to keep the
 * threads busy; attention tiles shrink only when tasks are few. Pinned shapes
 * are the ones the benchmarks quote. */
#include <stdio.h>

#include "sneppx_abi.h"
#include "test_util.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void check_shape(test_tally *tally, int64_t rows, int64_t n, int64_t row_align, int64_t instances,
                        int threads)
{
    const struct sneppx_gemm_tiles tiles = sneppx_gemm_tiles_for(rows, n, row_align, instances, threads);
    const int64_t row_tiles = ceil_div(rows, tiles.rows), col_tiles = ceil_div(n, tiles.cols);
    const int64_t tasks = instances * row_tiles * col_tiles;
    char shape[128];
    snprintf(shape, sizeof shape, "rows %lld n %lld align %lld instances %lld threads %d -> %lldx%lld",
             (long long)rows, (long long)n, (long long)row_align, (long long)instances, threads,
             (long long)tiles.rows, (long long)tiles.cols);
    TEST_CHECK(tally, tiles.rows % row_align == 0 && tiles.cols % SNEPPX_GEMM_COL_ALIGN == 0, "%s: alignment", shape);
    TEST_CHECK(tally, tiles.rows <= SNEPPX_GEMM_MAX_TILE_ROWS + row_align - 1 && tiles.cols <= SNEPPX_GEMM_MAX_TILE_COLS,
               "%s: beyond the bounds", shape);
    /* Every tile holds something: the last row and column tiles are not empty. */
    TEST_CHECK(tally, (row_tiles - 1) * tiles.rows < rows && (col_tiles - 1) * tiles.cols < n, "%s: an empty tile",
               shape);
    /* Columns are split beyond the bound only to balance the threads, and then
     * only up to that balance; the chosen split balances at least as well. */
    const int64_t fewest_col_tiles = ceil_div(n, SNEPPX_GEMM_MAX_TILE_COLS);
    const int64_t widest_cols = ceil_div(n, fewest_col_tiles * SNEPPX_GEMM_COL_ALIGN) * SNEPPX_GEMM_COL_ALIGN;
    const int64_t fewest_tasks = instances * row_tiles * ceil_div(n, widest_cols);
    const double fewest_busy = sneppx_gemm_busy(fewest_tasks, threads), busy = sneppx_gemm_busy(tasks, threads);
    if (fewest_busy >= 1.0 - SNEPPX_GEMM_MAX_IDLE)
        TEST_CHECK(tally, tasks == fewest_tasks, "%s: %lld tasks where %lld balance", shape, (long long)tasks,
                   (long long)fewest_tasks);
    TEST_CHECK(tally, busy >= fewest_busy, "%s: busy %.3f, %.3f with the fewest tasks", shape, busy, fewest_busy);
    /* Two threads and an even number of panels per fewest tile: always balanced. */
    if (threads == 2 && ceil_div(n, SNEPPX_GEMM_COL_ALIGN) % 2 == 0 && n % SNEPPX_GEMM_COL_ALIGN == 0)
        TEST_CHECK(tally, busy >= 1.0 - SNEPPX_GEMM_MAX_IDLE, "%s: busy %.3f", shape, busy);
}

static void check_pinned(test_tally *tally, int64_t rows, int64_t n, int threads, int64_t want_rows,
                         int64_t want_cols)
{
    const struct sneppx_gemm_tiles tiles = sneppx_gemm_tiles_for(rows, n, 14, 1, threads);
    TEST_CHECK(tally, tiles.rows == want_rows && tiles.cols == want_cols,
               "rows %lld n %lld threads %d: %lldx%lld, want %lldx%lld", (long long)rows, (long long)n, threads,
               (long long)tiles.rows, (long long)tiles.cols, (long long)want_rows, (long long)want_cols);
}

int main(void)
{
    test_tally tally = {0};
    /* llama3-8B's projections on 2 threads: QKV 4 x 3 tasks, O 4 x 2; at
     * T = 512 and decode, 3 column tiles of 2048 would idle a thread: 4 of 1536. */
    check_pinned(&tally, 2048, 6144, 2, 518, 2048);
    check_pinned(&tally, 512, 6144, 2, 518, 1536);
    check_pinned(&tally, 2048, 4096, 2, 518, 2048);
    check_pinned(&tally, 2048, 6144, 1, 518, 2048);
    check_pinned(&tally, 1, 6144, 2, 14, 1536);
    check_pinned(&tally, 128, 4096, 2, 140, 2048);
    static const int64_t rows_list[] = {1, 2, 5, 13, 14, 15, 100, 128, 511, 512, 2048, 4099, 32768};
    static const int64_t n_list[] = {1, 31, 32, 33, 128, 576, 1152, 2048, 4096, 4608, 6144, 12288, 24576};
    for (size_t r = 0; r < sizeof rows_list / sizeof rows_list[0]; r++)
        for (size_t c = 0; c < sizeof n_list / sizeof n_list[0]; c++)
            for (int threads = 1; threads <= 8; threads++) {
                check_shape(&tally, rows_list[r], n_list[c], 14, 1, threads);
                check_shape(&tally, rows_list[r], n_list[c], 6, 3, threads);
            }
    /* Attention: 64-row tiles unless that leaves fewer than 4 tasks per thread. */
    TEST_CHECK(&tally, sneppx_attention_tile_rows(128, 1, 8, 2) == 64, "llama3-8B T=128: 16 tasks of 64 rows");
    TEST_CHECK(&tally, sneppx_attention_tile_rows(128, 1, 1, 2) == 16, "deepseek (1 K/V head) T=128: 8 tasks of 16");
    TEST_CHECK(&tally, sneppx_attention_tile_rows(256, 1, 1, 2) == 32, "1 K/V head T=256: 8 tasks of 32");
    TEST_CHECK(&tally, sneppx_attention_tile_rows(8192, 1, 1, 2) == 64, "1 K/V head T=8192: 128 tasks of 64");
    TEST_CHECK(&tally, sneppx_attention_tile_rows(1, 1, 1, 2) == SNEPPX_ATTN_MIN_TILE_ROWS, "decode: the fewest rows");
    TEST_CHECK(&tally, sneppx_attention_tile_rows(128, 4, 1, 2) == 64, "4 sequences of T=128: 8 tasks of 64");
    /* The attention tasks cover every query row of every (sequence, K/V head) once, last tiles first. */
    static const int64_t seq_lens[] = {1, 15, 16, 17, 64, 77, 128, 300};
    for (size_t s = 0; s < sizeof seq_lens / sizeof seq_lens[0]; s++) {
        const int64_t seq_len = seq_lens[s], sequences = 2, kv_heads = 3;
        const int64_t tile_rows = sneppx_attention_tile_rows(seq_len, sequences, kv_heads, 2);
        const int64_t q_tiles = ceil_div(seq_len, tile_rows), tasks = sequences * kv_heads * q_tiles;
        int64_t covered[2][3] = {{0}}, bad = 0;
        for (int64_t task = 0; task < tasks; task++) {
            const struct sneppx_attention_task at = sneppx_attention_task_at(task, kv_heads, q_tiles, tile_rows, seq_len);
            bad += at.row_begin < 0 || at.row_end > seq_len || at.row_begin >= at.row_end ||
                   at.row_end - at.row_begin > tile_rows || at.sequence >= sequences || at.kv_head >= kv_heads;
            if (task % q_tiles == 0)
                bad += at.row_end != seq_len; /* a head's first task is its last tile */
            if (!bad)
                covered[at.sequence][at.kv_head] += at.row_end - at.row_begin;
        }
        for (int64_t b = 0; b < sequences; b++)
            for (int64_t h = 0; h < kv_heads; h++)
                bad += covered[b][h] != seq_len;
        TEST_CHECK(&tally, bad == 0, "attention tasks of seq_len %lld (tiles of %lld rows): %lld problems",
                   (long long)seq_len, (long long)tile_rows, (long long)bad);
    }
    /* Degenerate sizes still give a usable shape (the callers never pass them). */
    const struct sneppx_gemm_tiles empty = sneppx_gemm_tiles_for(0, 0, 14, 1, 2);
    TEST_CHECK(&tally, empty.rows == 14 && empty.cols == SNEPPX_GEMM_COL_ALIGN, "empty: %lldx%lld",
               (long long)empty.rows, (long long)empty.cols);
    return test_finish(&tally);
}
