/* The one-token weight sweep (a decode step's projections) per weight type on
 * one thread: float32, bfloat16, float16 and int8 panels of k = 4096, once
 * small enough to stay in L2 (whole panels of about 256 KiB: one float32
 * panel at v16 is 512 KiB, which a 1 MiB L2 holds; read over and over) and
 * once from memory (copies in turn, 256 MiB per type: 8x a 32 MiB L3). From L2 the rate is the
 * loop's own: its widening loads, conversions and FMAs per byte, which a
 * model such as llvm-mca prices per cycle. So the L2 rows say the cycles per
 * 64 weights at the core's clock, measured beside them by a chain of dependent
 * integer adds (one cycle each on every x86 core). From memory, the rate
 * against the read bandwidth probed beside it: whether the loop or the memory
 * bounds a step. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gemm_pack.h"
#include "gemm_tiles.h"
#include "kernel_args.h"
#include "kernels.h"
#include "report.h"
#include "tiles.h"

#define SWEEP_K 4096
#define L2_BUDGET_BYTES (256 << 10)
#define MEMORY_BYTES ((double)(256 << 20)) /* one type's copies in all: 8x a 32 MiB L3 */
#define MEMORY_N 2048
#define MAX_COPIES 32
/* Calls per timed run of the L2 side: one call reads 256 KiB, a few microseconds. */
#define L2_CALLS 64

static const struct {
    const char *label;
    sneppx_dtype type;
} sweep_types[] = {
    {"f32", SNEPPX_DTYPE_FLOAT32},
    {"bf16", SNEPPX_DTYPE_BFLOAT16},
    {"f16", SNEPPX_DTYPE_FLOAT16},
    {"int8", SNEPPX_DTYPE_INT8},
};
#define SWEEP_TYPES (int)(sizeof sweep_types / sizeof sweep_types[0])
enum { SIDE_L2, SIDE_MEMORY, PLACES };
_Static_assert(SWEEP_TYPES * PLACES <= BENCH_MAX_SIDES, "every type's two places in one set of rounds");

struct sweep_run {
    const sneppx_kernel *kernel;
    const struct sneppx_target *target;
    int64_t k, n;
    int calls;              /* kernel calls per timed run */
    void *copies[MAX_COPIES];
    int count, calls_made;  /* copies made; kernel calls so far (the next reads copy calls_made % count) */
    double bytes;           /* packed bytes one call reads */
    const float *src;
    float *dst;
};

/* One kernel call over every column, on the calling thread: the loop alone. Through
 * bench_gemm_tiles' OpenMP region and tasks, a call over 144 KiB of int8 panels cost
 * about 1 us more (Zen 4), a sixth of its time in L2. */
static int run_sweep(void *opaque)
{
    struct sweep_run *run = opaque;
    struct sneppx_args args = bench_new_args();
    args.row_begin = 0;
    args.row_end = 1;
    args.col_begin = 0;
    args.col_end = run->n;
    args.src = run->src;
    args.src_stride = run->k;
    args.dst = run->dst;
    args.dst_stride = run->n;
    for (int c = 0; c < run->calls; c++) {
        args.weight = run->copies[run->calls_made++ % run->count];
        run->kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
    return 0;
}

static void sweep_free(struct sweep_run *run)
{
    for (int c = 0; c < run->count; c++)
        free(run->copies[c]);
    run->count = 0;
}

/* Resolves the kernel of type for [1, k] x [k, n] and packs `copies` copies of one random
 * matrix; -1 (with the reason on stderr) when it cannot. */
static int sweep_make(const struct bench_context *ctx, sneppx_dtype type, int64_t k, int64_t n, int copies,
                      int calls, const float *src, float *dst, struct sweep_run *run)
{
    *run = (struct sweep_run){.target = ctx->target, .k = k, .n = n, .calls = calls, .src = src, .dst = dst};
    int64_t values[] = {k, n, 0, (int64_t)type, 0, 0};
    sneppx_gemm_tiles(ctx->target, type, &values[4], &values[5]);
    if (sneppx_kernel_resolve("gemm", values, ctx->target, &run->kernel) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: sweep: %s\n", sneppx_last_error());
        return -1;
    }
    run->bytes = (double)sneppx_gemm_packed_bytes(k, n, ctx->target->gemm_nr, type);
    float *weights = bench_alloc_floats((size_t)(k * n));
    int made = weights != NULL;
    for (int c = 0; made && c < copies; c++) {
        made = (run->copies[c] = bench_alloc_floats((size_t)(run->bytes / sizeof(float)) + 1)) != NULL;
        run->count += made;
        if (made && c == 0) {
            bench_fill_uniform(weights, k * n, 21, 1.0f / 64.0f);
            sneppx_gemm_pack_matrix(run->kernel, weights, k, n, run->copies[0], omp_get_max_threads());
        } else if (made) {
            memcpy(run->copies[c], run->copies[0], (size_t)run->bytes);
        }
    }
    free(weights);
    if (!made)
        fprintf(stderr, "sneppx-bench: sweep: out of memory\n");
    return made ? 0 : -1;
}

/* Columns whose panels of type fill about L2_BUDGET_BYTES: whole panels, at least one. */
static int64_t l2_columns(const struct sneppx_target *target, sneppx_dtype type, int64_t k)
{
    const int64_t panel = sneppx_gemm_panel_bytes(k, target->gemm_nr, type);
    const int64_t panels = L2_BUDGET_BYTES / panel;
    return (panels > 1 ? panels : 1) * target->gemm_nr;
}

/* The core's clock now, in Hz: the best of 5 runs of a chain of dependent adds, whose
 * 8 per iteration take 8 cycles while the loop's own count and branch run beside
 * them. The addend is a register the compiler cannot see into: Intel's Golden Cove
 * folds chains of immediate adds at rename, and an Intel Xeon's "add $1" chain
 * ran at 21-22 "GHz" where this one and a chain of 3-cycle imuls agree on 4.1.
 * 0 where the chain is not written (not x86-64). */
static double core_clock_hz(void)
{
#if defined(__x86_64__)
    const long iterations = 4 << 20;
    double best = 0;
    for (int run = 0; run < 5; run++) {
        unsigned long chain = 0, one = 1;
        __asm__ volatile("" : "+r"(one));
        const double start = bench_now();
        for (long i = 0; i < iterations; i++)
            __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                             "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
                             : "+r"(chain)
                             : "r"(one));
        const double hz = 8.0 * (double)iterations / (bench_now() - start);
        best = hz > best ? hz : best;
    }
    return best;
#else
    return 0;
#endif
}

static void report(const struct sweep_run runs[][PLACES], const struct bench_stats *seconds,
                   const struct bench_rounds *rounds, double bandwidth, double hz)
{
    for (int t = 0; t < SWEEP_TYPES; t++) {
        const struct sweep_run *l2 = &runs[t][SIDE_L2], *memory = &runs[t][SIDE_MEMORY];
        const int l2_side = t * PLACES + SIDE_L2, memory_side = t * PLACES + SIDE_MEMORY;
        struct bench_result in_l2 = {.stage = "gemm", .impl = "sneppx", .tokens = 1, .threads = 1,
                                     .seconds = seconds[l2_side], .work = l2->bytes * l2->calls,
                                     .unit = BENCH_UNIT_BYTES};
        snprintf(in_l2.case_name, sizeof in_l2.case_name, BENCH_SWEEP_CASE_PREFIX "%s L2 %.0fK", sweep_types[t].label,
                 l2->bytes / 1024.0);
        struct bench_result from_memory = {.stage = "gemm", .impl = "sneppx", .tokens = 1, .threads = 1,
                                           .seconds = seconds[memory_side], .work = memory->bytes * memory->calls,
                                           .unit = BENCH_UNIT_BYTES, .peak_rate = bandwidth};
        snprintf(from_memory.case_name, sizeof from_memory.case_name, BENCH_SWEEP_CASE_PREFIX "%s memory",
                 sweep_types[t].label);
        /* The rate ratio per round: the time ratio times the ratio of the bytes each run reads. */
        struct bench_stats ratio;
        bench_round_ratio(rounds, memory_side, l2_side, &ratio);
        const double scale = in_l2.work / from_memory.work;
        char note[160];
        int length = snprintf(note, sizeof note, "k %lld n %lld, %.2fx [%.2f-%.2f] the rate from memory",
                              (long long)l2->k, (long long)l2->n, ratio.median * scale, ratio.min * scale, ratio.max * scale);
        if (hz > 0) {
            const double weights = (double)l2->k * (double)l2->n * l2->calls;
            snprintf(note + length, sizeof note - (size_t)length, "; %.1f cycles per 64 weights at %.2f GHz",
                     seconds[l2_side].median / weights * 64.0 * hz, hz / 1e9);
        }
        bench_report_pair(&in_l2, NULL, note);
        snprintf(note, sizeof note, "k %lld n %lld, %d copies in turn", (long long)memory->k, (long long)memory->n,
                 memory->count);
        bench_report_pair(&from_memory, NULL, note);
    }
}

void bench_gemm_sweep_types(struct bench_context *ctx)
{
    bench_report_section("one-token weight sweep by weight type, one thread: panels in L2 (read again and again) "
                         "and from memory (copies in turn)",
                         "GB/s of packed weights (int8: with their scales); from memory, % of the 1-thread read "
                         "bandwidth probed just before and after (best of both); L2 rows: x = their rate over the "
                         "memory row's, median [min-max] over rounds in which all rows alternate; cycles per 64 "
                         "weights at the core's clock, measured just before and after by a chain of dependent "
                         "adds (best of both)");
    const int64_t k = ctx->quick ? 512 : SWEEP_K;
    float *src = bench_alloc_floats((size_t)k), *dst = bench_alloc_floats(MEMORY_N + 4096);
    struct sweep_run runs[SWEEP_TYPES][PLACES];
    memset(runs, 0, sizeof runs);
    int made = src && dst;
    if (made)
        bench_fill_uniform(src, k, 22, 1.0f);
    for (int t = 0; made && t < SWEEP_TYPES; t++) {
        const sneppx_dtype type = sweep_types[t].type;
        const int64_t memory_n = ctx->quick ? 128 : MEMORY_N;
        const double copy_bytes = (double)sneppx_gemm_packed_bytes(k, memory_n, ctx->target->gemm_nr, type);
        int copies = ctx->quick ? 2 : (int)(MEMORY_BYTES / copy_bytes) + 1;
        copies = copies < MAX_COPIES ? copies : MAX_COPIES;
        made = sweep_make(ctx, type, k, l2_columns(ctx->target, type, k), 1, ctx->quick ? 1 : L2_CALLS, src, dst,
                          &runs[t][SIDE_L2]) == 0 &&
               sweep_make(ctx, type, k, memory_n, copies, 1, src, dst, &runs[t][SIDE_MEMORY]) == 0;
    }
    if (!made) {
        ctx->failures++;
        goto done;
    }
    struct bench_side sides[BENCH_MAX_SIDES];
    for (int t = 0; t < SWEEP_TYPES; t++)
        for (int p = 0; p < PLACES; p++)
            sides[t * PLACES + p] = (struct bench_side){.body = run_sweep, .state = &runs[t][p]};
    const struct bench_plan plan = bench_plan_for(ctx, 10, 40, 1.0);
    struct bench_stats seconds[BENCH_MAX_SIDES];
    struct bench_rounds rounds;
    const double before = bench_read_bandwidth_beside(ctx, 1), clock_before = core_clock_hz();
    if (bench_measure_sides(sides, SWEEP_TYPES * PLACES, &plan, seconds, &rounds) != 0) {
        ctx->failures++;
        goto done;
    }
    const double after = bench_read_bandwidth_beside(ctx, 1), clock_after = core_clock_hz();
    report((const struct sweep_run(*)[PLACES])runs, seconds, &rounds, before > after ? before : after,
           clock_before > clock_after ? clock_before : clock_after);
done:
    for (int t = 0; t < SWEEP_TYPES; t++)
        for (int p = 0; p < PLACES; p++)
            sweep_free(&runs[t][p]);
    free(src);
    free(dst);
}
