/* The machine's limits, measured in the same run as what is compared to them:
 *   FMA peak: register-resident chains of vector FMAs, nothing but FMAs;
 *   read bandwidth: a vector sum over a buffer far larger than the caches. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "report.h"

/* Independent accumulator chains: 2 FMA pipes x 4 cycles of latency keep 8 in
 * flight; 12 leaves slack and still fits the 16 registers of AVX2. */
#define FMA_CHAINS 12
#define BANDWIDTH_ACCUMULATORS 4

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v16f_mem __attribute__((vector_size(64), aligned(64), may_alias));
typedef float v8f_mem __attribute__((vector_size(32), aligned(64), may_alias));

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

#define DEFINE_READ_LOOP(name, vtype, vmem, target)                                 \
    target static float name(const float *data, int64_t count)                     \
    {                                                                               \
        const int64_t lanes = (int64_t)(sizeof(vtype) / sizeof(float));             \
        const int64_t step = lanes * BANDWIDTH_ACCUMULATORS;                        \
        vtype s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};                               \
        for (int64_t i = 0; i + step <= count; i += step) {                         \
            s0 += *(const vmem *)(data + i);                                        \
            s1 += *(const vmem *)(data + i + lanes);                                \
            s2 += *(const vmem *)(data + i + 2 * lanes);                            \
            s3 += *(const vmem *)(data + i + 3 * lanes);                            \
        }                                                                           \
        const vtype total = (s0 + s1) + (s2 + s3);                                  \
        float sum = 0;                                                              \
        for (int64_t lane = 0; lane < lanes; lane++)                                \
            sum += total[lane];                                                     \
        return sum;                                                                 \
    }

DEFINE_READ_LOOP(read_loop_wide, v16f, v16f_mem, TARGET_WIDE)
DEFINE_READ_LOOP(read_loop_narrow, v8f, v8f_mem, TARGET_NARROW)

static int host_has_avx512(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx512f");
#else
    return 1;
#endif
}

struct fma_state {
    int threads;
    int wide;
    int64_t iterations;  /* per thread */
    volatile float sink;
};

static int run_fma(void *opaque)
{
    struct fma_state *state = opaque;
    float total = 0;
#pragma omp parallel num_threads(state->threads) reduction(+ : total)
    total += state->wide ? fma_loop_wide(state->iterations, 1e-3f * (float)(omp_get_thread_num() + 1))
                         : fma_loop_narrow(state->iterations, 1e-3f * (float)(omp_get_thread_num() + 1));
    state->sink = total;
    return 0;
}

struct read_state {
    int threads;
    int wide;
    const float *data;
    int64_t count;
    volatile float sink;
};

static int run_read(void *opaque)
{
    struct read_state *state = opaque;
    float total = 0;
#pragma omp parallel num_threads(state->threads) reduction(+ : total)
    {
        /* Each thread streams its own contiguous share. */
        const int64_t share = state->count / omp_get_num_threads() / 64 * 64;
        const float *mine = state->data + share * omp_get_thread_num();
        total += state->wide ? read_loop_wide(mine, share) : read_loop_narrow(mine, share);
    }
    state->sink = total;
    return 0;
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

double bench_read_bandwidth(const struct bench_context *ctx, int threads)
{
    const int slot = thread_slot(ctx, threads);
    return slot < 0 ? 0 : ctx->read_gbs[slot];
}

void bench_stage_peak(struct bench_context *ctx)
{
    const int wide = host_has_avx512();
    const int lanes = wide ? 16 : 8;
    bench_report_section("machine: FMA peak and read bandwidth",
                         "FMA: register-resident vector FMA chains; read: vector sum over a buffer far larger "
                         "than the caches (pages touched before timing)");
    /* ~0.2 s per run at 200 GFLOP/s per core; a buffer of 1 GiB (64 MiB for --quick). */
    const int64_t iterations = ctx->quick ? 2000000 : 100000000;
    const int64_t read_floats = ctx->quick ? ((int64_t)16 << 20) : ((int64_t)256 << 20);
    float *buffer = bench_alloc_floats((size_t)read_floats);
    if (!buffer) {
        fprintf(stderr, "sneppx-bench: no memory for the %lld MiB bandwidth buffer\n",
                (long long)(read_floats >> 18));
        ctx->failures++;
        return;
    }
    bench_fill_uniform(buffer, read_floats, 1, 1.0f);
    const struct bench_plan plan = bench_plan_for(ctx, 5, 9, 2.0);

    for (int t = 0; t < ctx->thread_count_n; t++) {
        const int threads = ctx->thread_counts[t];
        struct fma_state fma = {.threads = threads, .wide = wide, .iterations = iterations};
        struct bench_result result = {.stage = "peak", .impl = "fma", .threads = threads,
                                      .unit = BENCH_UNIT_FLOPS};
        snprintf(result.case_name, sizeof result.case_name, "fma %d-lane vectors", lanes);
        result.work = (double)iterations * FMA_CHAINS * lanes * 2 * threads;
        bench_measure(run_fma, &fma, &plan, &result.seconds);
        /* The machine's peak is its best run: slower runs are the host's noise. */
        ctx->fma_gflops[t] = bench_rate(&result, result.seconds.min);
        bench_report_pair(&result, NULL, "(peak = best run)");
    }
    for (int t = 0; t < ctx->thread_count_n; t++) {
        const int threads = ctx->thread_counts[t];
        struct read_state read = {.threads = threads, .wide = wide, .data = buffer, .count = read_floats};
        struct bench_result result = {.stage = "peak", .impl = "read", .threads = threads,
                                      .unit = BENCH_UNIT_BYTES};
        snprintf(result.case_name, sizeof result.case_name, "read %lld MiB", (long long)(read_floats >> 18));
        result.work = (double)(read_floats / threads / 64 * 64 * threads) * sizeof(float);
        bench_measure(run_read, &read, &plan, &result.seconds);
        ctx->read_gbs[t] = bench_rate(&result, result.seconds.min);
        bench_report_pair(&result, NULL, "(bandwidth = best run)");
    }
    free(buffer);
}
