/* The machine's limits, measured in the same run as what is compared to them:
 *   FMA peak: register-resident chains of vector FMAs, nothing but FMAs;
 *   core speed: the same chains on every core at once, sampled in short windows,
 *     to show a host whose cores change speed (core_phases.h), at the start of the
 *     run and again at its end;
 *   read bandwidth: a vector sum over a buffer far larger than the caches;
 *   bfloat16 dot-product peak (AVX512_BF16 hosts at 16 lanes): chains of vdpbf16ps,
 *     what bfloat16 compute's GEMM multiplies by, whose rate against the FMA's differs
 *     by core (an Intel Xeon here issues one a quarter as often as an FMA). */
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "core_phases.h"
#include "host.h"
#include "kernel_registry.h"
#include "report.h"

/* Independent accumulator chains: 2 FMA pipes x 4 cycles of latency keep 8 in
 * flight; 12 leaves slack and still fits the 16 registers of AVX2. */
#define FMA_CHAINS 12

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

#if defined(__x86_64__) || defined(__i386__)
#define TARGET_WIDE __attribute__((target("avx512f,fma"), noinline))
#define TARGET_NARROW __attribute__((target("avx2,fma"), noinline))
#else
#define TARGET_WIDE __attribute__((noinline))
#define TARGET_NARROW __attribute__((noinline))
#endif

#define CHAIN_STATEMENTS(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)

/* acc = acc * m + a on FMA_CHAINS chains; returns their sum so nothing is dead. */
#define DEFINE_FMA_LOOP(name, vtype, target)                                        \
    target static float name(int64_t iterations, float seed)                      \
    {                                                                               \
        typedef vtype chain_vector;                                                 \
        const vtype m = (vtype){0} + 0.999999f, a = (vtype){0} + 1e-7f;             \
        CHAIN_STATEMENTS(DECLARE_CHAIN)                                             \
        for (int64_t i = 0; i < iterations; i++) {                                  \
            CHAIN_STATEMENTS(STEP_CHAIN)                                            \
            __asm__ volatile("" ::: "memory"); /* keep the loop a loop */           \
        }                                                                           \
        vtype total = (vtype){0};                                                   \
        CHAIN_STATEMENTS(SUM_CHAIN)                                                 \
        float sum = 0;                                                              \
        for (size_t lane = 0; lane < sizeof(vtype) / sizeof(float); lane++)        \
            sum += total[lane];                                                     \
        return sum;                                                                 \
    }
#define DECLARE_CHAIN(i) chain_vector acc##i = (chain_vector){0} + seed * (float)(i + 1);
#define STEP_CHAIN(i) acc##i = acc##i * m + a;
#define SUM_CHAIN(i) total += acc##i;

DEFINE_FMA_LOOP(fma_loop_wide, v16f, TARGET_WIDE)
DEFINE_FMA_LOOP(fma_loop_narrow, v8f, TARGET_NARROW)

#if defined(__x86_64__)
#define BF16DOT_CHAIN(i) __m512 acc##i = _mm512_set1_ps(seed * (float)(i + 1));
#define BF16DOT_STEP(i) acc##i = _mm512_dpbf16_ps(acc##i, pair, pair);
#define BF16DOT_SUM(i) total = _mm512_add_ps(total, acc##i);
/* acc += pair . pair (two bfloat16 products a lane) on FMA_CHAINS chains; returns their sum. */
__attribute__((target("avx512f,avx512bf16"), noinline)) static float bf16dot_loop(int64_t iterations, float seed)
{
    __m512bh pair = (__m512bh)_mm512_set1_epi16(0x3c00); /* 2^-7 */
    CHAIN_STATEMENTS(BF16DOT_CHAIN)
    for (int64_t i = 0; i < iterations; i++) {
        CHAIN_STATEMENTS(BF16DOT_STEP)
        __asm__ volatile("" : "+v"(pair)); /* keep the loop a loop */
    }
    __m512 total = _mm512_setzero_ps();
    CHAIN_STATEMENTS(BF16DOT_SUM)
    return _mm512_reduce_add_ps(total);
}
#define HAVE_BF16DOT_LOOP 1
#else
#define HAVE_BF16DOT_LOOP 0
#endif

/* A run of chains on `threads` threads at once: loop is fma_loop_wide, fma_loop_narrow
 * or bf16dot_loop. */
struct fma_state {
    int threads;
    float (*loop)(int64_t iterations, float seed);
    int64_t iterations;  /* per thread */
    volatile float sink;
};

static int run_fma(void *opaque)
{
    struct fma_state *state = opaque;
    float total = 0;
#pragma omp parallel num_threads(state->threads) reduction(+ : total)
    total += state->loop(state->iterations, 1e-3f * (float)(omp_get_thread_num() + 1));
    state->sink = total;
    return 0;
}

struct read_state {
    int threads;
    const read_probe *probe;
    volatile float sink;
};

static int run_read(void *opaque)
{
    struct read_state *state = opaque;
    state->sink = read_probe_pass(state->probe, state->threads);
    return 0;
}

/* Windows of the core-speed probe: 4 s in all (0.5 s for --quick), long enough to
 * see phases of a second or more, each window long enough for a steady rate. */
#define PHASE_WINDOW_SECONDS 0.25
#define PHASE_SAMPLES 16
#define PHASE_QUICK_SAMPLES 2
/* FMA loop iterations between clock reads: ~0.2 ms of a 3 GHz core (12 FMAs an iteration, 2 a cycle). */
#define PHASE_CHUNK 100000

static volatile float phase_sink; /* the chains' sum, so that they are not dead */

/* The peak of the vectors the kernels use: 8 lanes for the v8 target, also when
 * SNEPPX_TARGET runs it on an AVX-512 host. */
static int peak_is_wide(void)
{
    return read_probe_host_is_wide() && sneppx_host_target()->vector_width >= 16;
}

void bench_report_core_speed(struct bench_context *ctx, const char *when)
{
    const int wide = peak_is_wide(), lanes = wide ? 16 : 8;
    const int cores = ctx->thread_counts[ctx->thread_count_n - 1];
    const int samples = ctx->quick ? PHASE_QUICK_SAMPLES : PHASE_SAMPLES;
    double *rates = calloc((size_t)cores * samples, sizeof(double));
    struct core_phase_summary *per_core = calloc((size_t)cores, sizeof *per_core);
    if (!rates || !per_core) {
        free(rates);
        free(per_core);
        fprintf(stderr, "sneppx-bench: no memory for the core-speed probe\n");
        ctx->failures++;
        return;
    }
    float total = 0;
#pragma omp parallel num_threads(cores) reduction(+ : total)
    {
        const int core = omp_get_thread_num();
        const float seed = 1e-3f * (float)(core + 1);
        for (int s = 0; s < samples; s++) {
            const double start = omp_get_wtime();
            double now;
            int64_t chunks = 0;
            do {
                total += wide ? fma_loop_wide(PHASE_CHUNK, seed) : fma_loop_narrow(PHASE_CHUNK, seed);
                chunks++;
            } while ((now = omp_get_wtime()) - start < PHASE_WINDOW_SECONDS);
            rates[core * samples + s] = (double)chunks * PHASE_CHUNK * FMA_CHAINS * lanes * 2 / (now - start) * 1e-9;
        }
    }
    phase_sink = total;
    const double any_slow = core_phases_summarize(rates, cores, samples, per_core);
    for (int c = 0; c < cores; c++) {
        printf("  core speed %s, thread %-2d %dt | fma windows of %.2f s: fastest %.1f GF/s, median %.1f, slowest "
               "%.1f; below %.0f%% of its fastest in %.0f%% of %d\n",
               when, c, cores, PHASE_WINDOW_SECONDS, per_core[c].fastest, per_core[c].median, per_core[c].slowest,
               100 * CORE_PHASE_SLOW_SHARE, 100 * per_core[c].slow_share, samples);
        char name[64];
        snprintf(name, sizeof name, "core speed %s thread %d", when, c); /* no comma: a CSV field */
        bench_record_value("peak", name, "slow-windows", 0, cores, 100 * per_core[c].slow_share, "%");
    }
    if (cores > 1 && any_slow > 0.125)
        printf("   WARNING: some core ran below %.0f%% of its own speed in %.0f%% of the windows %s: a case split evenly "
               "over %d threads waits for the slowest, so %d-thread medians mix phases (1-thread rows and best rounds "
               "show the code)\n",
               100 * CORE_PHASE_SLOW_SHARE, 100 * any_slow, when, cores, cores);
    free(rates);
    free(per_core);
}

static int thread_slot(const struct bench_context *ctx, int threads)
{
    for (int i = 0; i < ctx->thread_count_n; i++)
        if (ctx->thread_counts[i] == threads)
            return i;
    return -1;
}

double bench_fma_peak(const struct bench_context *ctx, int threads)
{
    const int slot = thread_slot(ctx, threads);
    return slot < 0 ? 0 : ctx->fma_gflops[slot];
}

double bench_bf16dot_peak(const struct bench_context *ctx, int threads)
{
    const int slot = thread_slot(ctx, threads);
    return slot < 0 ? 0 : ctx->bf16dot_gflops[slot];
}

double bench_read_bandwidth(const struct bench_context *ctx, int threads)
{
    const int slot = thread_slot(ctx, threads);
    return slot < 0 ? 0 : ctx->read_gbs[slot];
}

double bench_read_bandwidth_beside(struct bench_context *ctx, int threads)
{
    if (!ctx->beside.buffer && read_probe_init(&ctx->beside, ctx->quick ? (size_t)64 << 20 : (size_t)512 << 20) != 0)
        return 0;
    return read_probe_best_gbs(&ctx->beside, threads, 3);
}

void bench_stage_peak(struct bench_context *ctx)
{
    const int wide = peak_is_wide();
    const int lanes = wide ? 16 : 8;
    bench_report_section("machine: FMA peak and read bandwidth",
                         "FMA: register-resident vector FMA chains; read: vector sum over a buffer far larger "
                         "than the caches (pages touched before timing); vdpbf16ps (AVX512_BF16 hosts at 16 "
                         "lanes): the same chains of bfloat16 pair products, 2 products (4 flops) a lane");
    /* ~0.2 s per run at 200 GFLOP/s per core; a buffer of 1 GiB (64 MiB for --quick). */
    const int64_t iterations = ctx->quick ? 2000000 : 100000000;
    const size_t read_bytes = ctx->quick ? (size_t)64 << 20 : (size_t)1 << 30;
    read_probe probe;
    if (read_probe_init(&probe, read_bytes) != 0) {
        fprintf(stderr, "sneppx-bench: no memory for the %zu MiB bandwidth buffer\n", read_bytes >> 20);
        ctx->failures++;
        return;
    }
    const struct bench_plan plan = bench_plan_for(ctx, 5, 9, 2.0);

    for (int t = 0; t < ctx->thread_count_n; t++) {
        const int threads = ctx->thread_counts[t];
        struct fma_state fma = {.threads = threads, .loop = wide ? fma_loop_wide : fma_loop_narrow,
                                .iterations = iterations};
        struct bench_result result = {.stage = "peak", .impl = "fma", .threads = threads,
                                      .unit = BENCH_UNIT_FLOPS};
        snprintf(result.case_name, sizeof result.case_name, "fma %d-lane vectors", lanes);
        result.work = (double)iterations * FMA_CHAINS * lanes * 2 * threads;
        bench_measure(run_fma, &fma, &plan, &result.seconds);
        /* The machine's peak is its best run: slower runs are the host's noise. */
        ctx->fma_gflops[t] = bench_rate(&result, result.seconds.min);
        bench_report_pair(&result, NULL, "(peak = best run)");
    }
#if HAVE_BF16DOT_LOOP
    /* Where bfloat16 compute runs (the precision stage's bf16-compute prefill divides by it). */
    if (wide && sneppx_host_has_feature("+avx512bf16"))
        for (int t = 0; t < ctx->thread_count_n; t++) {
            const int threads = ctx->thread_counts[t];
            struct fma_state dot = {.threads = threads, .loop = bf16dot_loop, .iterations = iterations / 2};
            struct bench_result result = {.stage = "peak", .impl = "vdpbf16ps", .threads = threads,
                                          .unit = BENCH_UNIT_FLOPS};
            snprintf(result.case_name, sizeof result.case_name, "vdpbf16ps 16-lane");
            result.work = (double)dot.iterations * FMA_CHAINS * lanes * 4 * threads;
            bench_measure(run_fma, &dot, &plan, &result.seconds);
            ctx->bf16dot_gflops[t] = bench_rate(&result, result.seconds.min);
            char note[96];
            snprintf(note, sizeof note, "(peak = best run; %.2fx the FMA peak)",
                     ctx->fma_gflops[t] > 0 ? ctx->bf16dot_gflops[t] / ctx->fma_gflops[t] : 0.0);
            bench_report_pair(&result, NULL, note);
        }
#endif
    bench_report_core_speed(ctx, "at start");
    for (int t = 0; t < ctx->thread_count_n; t++) {
        const int threads = ctx->thread_counts[t];
        struct read_state read = {.threads = threads, .probe = &probe};
        struct bench_result result = {.stage = "peak", .impl = "read", .threads = threads,
                                      .unit = BENCH_UNIT_BYTES};
        snprintf(result.case_name, sizeof result.case_name, "read %zu MiB", read_bytes >> 20);
        result.work = read_probe_pass_bytes(&probe, threads);
        bench_measure(run_read, &read, &plan, &result.seconds);
        ctx->read_gbs[t] = bench_rate(&result, result.seconds.min);
        bench_report_pair(&result, NULL, "(bandwidth = best run)");
    }
    read_probe_free(&probe);
}
