/* sneppx-bench: what every stage shares: the run's options, the machine's
 * measured limits, buffers, and the stage entry points. */
#ifndef SNEPPX_BENCH_BENCH_H
#define SNEPPX_BENCH_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "probe/read_probe.h"
#include "timing.h"

#define BENCH_MAX_THREAD_COUNTS 2

enum bench_stage {
    BENCH_STAGE_PEAK = 1 << 0,
    BENCH_STAGE_GEMM = 1 << 1,
    BENCH_STAGE_ATTENTION = 1 << 2,
    BENCH_STAGE_LAYER = 1 << 3,
    BENCH_STAGE_JIT = 1 << 4,
    BENCH_STAGE_MEMORY = 1 << 5,
    BENCH_STAGE_DECODE = 1 << 6,
    BENCH_STAGE_GENERATE = 1 << 7,
    BENCH_STAGE_PRECISION = 1 << 8,
    BENCH_STAGE_ALL = (1 << 9) - 1
};

struct bench_context {
    int quick;                 /* tiny sizes and single repeats: checks that the bench runs */
    int stages;                /* enum bench_stage bits */
    int thread_counts[BENCH_MAX_THREAD_COUNTS]; /* 1 and every core */
    int thread_count_n;
    const struct sneppx_target *target; /* of the kernels sneppx resolves on this host */
    /* Measured by the peak stage, in the same run as everything they divide. */
    double fma_gflops[BENCH_MAX_THREAD_COUNTS];
    double read_gbs[BENCH_MAX_THREAD_COUNTS];
    double bf16dot_gflops[BENCH_MAX_THREAD_COUNTS]; /* vdpbf16ps chains; 0 where the target has none */
    read_probe beside;         /* the buffer of bench_read_bandwidth_beside, made at first use */
    int failures;              /* stages or cases that could not run */
};

/* The measured limit for a thread count of ctx->thread_counts (0 if unmeasured). */
double bench_fma_peak(const struct bench_context *ctx, int threads);
double bench_read_bandwidth(const struct bench_context *ctx, int threads);
/* The peak of bfloat16 compute's instruction (vdpbf16ps, counted as 2 flops a product)
 * for a thread count, where the kernels' target runs it (AVX512_BF16 at 16 lanes);
 * else 0. It need not exceed the FMA peak: on the Intel Xeon measured here it is half. */
double bench_bf16dot_peak(const struct bench_context *ctx, int threads);

/* The read bandwidth now, best of 3 passes over 512 MiB (64 MiB with --quick):
 * what decode rates are divided by, probed just before and just after the case
 * so that both see the same host (a shared one, whose bandwidth wanders by 2x
 * within a run). 0 when the buffer cannot be allocated. */
double bench_read_bandwidth_beside(struct bench_context *ctx, int threads);

/* How a stage times its work: the full plan, or one run of each for --quick. */
struct bench_plan bench_plan_for(const struct bench_context *ctx, int min_reps, int max_reps,
                                 double budget_seconds);

/* Stages. Each prints its section, records its rows and counts its failures in ctx. */
void bench_stage_peak(struct bench_context *ctx);
/* Every core's FMA rate in short windows, all at once (the peak stage's, and main's
 * at the end of the run): each core's spread, and a warning when cores slowed. */
void bench_report_core_speed(struct bench_context *ctx, const char *when);
void bench_stage_gemm(struct bench_context *ctx);
/* The gemm stage's last table: the one-token sweep per weight type, from L2 and from memory.
 * Its rows are gemm rows of one token on one thread, but no projection of a layer: their
 * cases start with BENCH_SWEEP_CASE_PREFIX, which the targets leave out. */
void bench_gemm_sweep_types(struct bench_context *ctx);
#define BENCH_SWEEP_CASE_PREFIX "sweep "
void bench_stage_attention(struct bench_context *ctx);
void bench_stage_layer(struct bench_context *ctx);
void bench_stage_jit(struct bench_context *ctx);
void bench_stage_memory(struct bench_context *ctx);
void bench_stage_decode(struct bench_context *ctx);
void bench_stage_generate(struct bench_context *ctx);
/* The impl of the generate stage's scalar rows: the heap's growth in bytes over a row's
 * warm decode steps (a warm step must allocate nothing). */
#define GENERATE_HEAP_GROWTH "heap-growth"
void bench_stage_precision(struct bench_context *ctx);

/* The performance targets (docs/PERFORMANCE.md) against the rows recorded so far: met or MISS, and by how much. */
void bench_report_targets(const struct bench_context *ctx);

/* Child modes: the bench re-executes itself for work that needs a fresh process. */
int bench_child_start(int argc, char **argv);   /* --child-start MODEL: JIT cold/warm start */
int bench_child_memory(int argc, char **argv);  /* --child-memory T: peak memory of a forward */

/* Runs that read their data once each, from memory (a decode step's weights, a cache), are
 * timed over copies of it taken in turn: reused, even a few hundred MB partly stays in
 * these hosts' caches (a 64 MiB buffer reads at ~56 GB/s on one core of the Zen 5 VM, 1 GiB
 * at ~34). The copies add up to at least BENCH_ROTATION_BYTES; bench_rotation_copies says
 * how many of copy_bytes each that takes, 2 under --quick, at most max_copies. */
#define BENCH_ROTATION_BYTES ((double)(1 << 30))
int bench_rotation_copies(const struct bench_context *ctx, double copy_bytes, int max_copies);
/* A whole layer's copies in a rotation, at most (an int8 llama3-8B layer: 16 x 47 MB). */
#define BENCH_MAX_LAYER_COPIES 16

/* The batch of decode steps the generate and decode stages run (a ragged batch of this
 * many sequences) and the gemm stage times as its decode-batch T, weights from memory. */
#define BENCH_DECODE_BATCH 16

/* A 64-byte aligned float buffer, 2 MiB aligned and advised for transparent
 * huge pages when large, and touched (so no timed run pays its page faults).
 * NULL when out of memory. Free with free(). */
float *bench_alloc_floats(size_t count);

/* x[i] = scale * uniform[-1, 1) from a counter-based generator (thread-count independent). */
void bench_fill_uniform(float *x, int64_t count, uint64_t seed, float scale);

/* max |a - b| / max |b| over count floats: the relative error of a against reference b. */
double bench_relative_error(const float *a, const float *b, int64_t count);

/* Peak resident set (VmHWM) and current resident set (VmRSS) in bytes, 0 if unknown. */
size_t bench_vm_hwm_bytes(void);
size_t bench_vm_rss_bytes(void);

#endif
