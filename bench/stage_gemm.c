/* Projections: sneppx's GEMM kernel over the runtime's tile partition against
 * OpenBLAS on the shapes of one layer, [T,4096]x[4096,6144] (fused QKV) and
 * [T,4096]x[4096,4096] (O). T = 1 is decode: sneppx's GEMM against
 * cblas_sgemv (OpenBLAS's sgemm with M = 1 does not route to sgemv and is
 * 3.3x slower), rated as the bandwidth of streaming the weights from memory. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "bench.h"
#include "gemm_pack.h"
#include "gemm_tiles.h"
#include "kernels.h"
#include "report.h"
#include "tiles.h"

struct gemm_case {
    const char *name;
    int64_t k, n;
};

static const struct gemm_case full_cases[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}};
static const int64_t full_tokens[] = {1, BENCH_DECODE_BATCH, 128, 512, 2048};
/* --quick: every code path on shapes that take milliseconds. */
static const struct gemm_case quick_cases[] = {{"qkv", 512, 768}, {"o", 512, 512}};
static const int64_t quick_tokens[] = {1, 24};

/* Decode reads every layer's weights once per step, from memory: T = 1 and a batch of
 * decode steps (T up to BENCH_DECODE_BATCH) cycle through copies of the weights
 * (bench_rotation_copies); longer T re-read one copy. */
#define MAX_COPIES 32
/* The sides timed per thread count, in this order (untuned: only on a host with a tuning record). */
enum { SIDE_SNEPPX, SIDE_OPENBLAS, SIDE_UNTUNED, SIDES_PER_COUNT };
_Static_assert(BENCH_MAX_THREAD_COUNTS * SIDES_PER_COUNT <= BENCH_MAX_SIDES, "every thread count's sides in one set of rounds");

/* Copies of one weight matrix, in both layouts; copy i is used by run i % count. */
struct weight_copies {
    float *weights[MAX_COPIES]; /* HF layout [n, k], for OpenBLAS */
    float *panels[MAX_COPIES];  /* the same weights packed for the kernel */
    int count;
};

struct gemm_run {
    const sneppx_kernel *kernel;
    const struct sneppx_target *target; /* the kernel's */
    int64_t k, n, tokens;
    const struct weight_copies *copies;
    int uses;             /* copies used so far: the next run takes copy uses % count */
    const float *src;     /* [tokens, k] */
    float *dst;           /* [tokens, n] */
    int threads;
};

static int run_sneppx(void *opaque)
{
    struct gemm_run *run = opaque;
    const float *panels = run->copies->panels[run->uses++ % run->copies->count];
    bench_gemm_tiles(run->kernel, run->target, run->threads, run->tokens, run->n, run->src, run->k, panels, NULL,
                     run->dst, run->n);
    return 0;
}

static int run_openblas(void *opaque)
{
    struct gemm_run *run = opaque;
    /* Sides of several thread counts take turns: each run sets its own (a no-op when unchanged). */
    if (openblas_get_num_threads() != run->threads)
        openblas_set_num_threads(run->threads);
    const float *weights = run->copies->weights[run->uses++ % run->copies->count];
    const int k = (int)run->k, n = (int)run->n;
    if (run->tokens == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, weights, k, run->src, 1, 0.0f, run->dst, 1);
    else /* dst = src W^T, as torch.nn.functional.linear computes it */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)run->tokens, n, k, 1.0f, run->src, k, weights, k,
                    0.0f, run->dst, n);
    return 0;
}

/* `count` copies of one random weight matrix, in HF layout and packed. Returns -1 when out of memory
 * (what was allocated is in copies, for the caller to free). */
static int make_copies(const struct bench_context *ctx, const sneppx_kernel *kernel, const struct gemm_case *shape,
                       int count, struct weight_copies *copies)
{
    const size_t weight_floats = (size_t)(shape->n * shape->k);
    const size_t panel_floats = (size_t)sneppx_gemm_packed_floats(shape->k, shape->n, ctx->target->gemm_nr);
    for (int c = 0; c < count; c++) {
        copies->weights[c] = bench_alloc_floats(weight_floats);
        copies->panels[c] = bench_alloc_floats(panel_floats);
        copies->count = c + 1;
        if (!copies->weights[c] || !copies->panels[c])
            return -1;
        if (c == 0) {
            bench_fill_uniform(copies->weights[0], shape->n * shape->k, 11, 1.0f / 64.0f);
            sneppx_gemm_pack_matrix(kernel, copies->weights[0], shape->k, shape->n, copies->panels[0],
                                    omp_get_max_threads());
        } else {
            memcpy(copies->weights[c], copies->weights[0], weight_floats * sizeof(float));
            memcpy(copies->panels[c], copies->panels[0], panel_floats * sizeof(float));
        }
    }
    return 0;
}

static void bench_case(struct bench_context *ctx, const struct gemm_case *shape, const int64_t *tokens_list,
                       int tokens_count)
{
    const int64_t max_tokens = tokens_list[tokens_count - 1];
    /* no bias, float32 weights; kc and mc: this host's (tuned, or the target's defaults) */
    int64_t values[] = {shape->k, shape->n, 0, 0, 0, 0};
    sneppx_gemm_tiles(ctx->target, SNEPPX_DTYPE_FLOAT32, &values[4], &values[5]);
    /* A host with a tuning record also runs the target's defaults, in the same run. */
    int64_t untuned_values[] = {shape->k, shape->n, 0, 0, 0, 0};
    sneppx_gemm_default_tiles(ctx->target, SNEPPX_DTYPE_FLOAT32, &untuned_values[4], &untuned_values[5]);
    const int tuned = values[4] != untuned_values[4] || values[5] != untuned_values[5];
    const sneppx_kernel *kernel, *untuned = NULL;
    if (sneppx_kernel_resolve("gemm", values, ctx->target, &kernel) != SNEPPX_OK ||
        (tuned && sneppx_kernel_resolve("gemm", untuned_values, ctx->target, &untuned) != SNEPPX_OK)) {
        fprintf(stderr, "sneppx-bench: gemm %s: %s\n", shape->name, sneppx_last_error());
        ctx->failures++;
        return;
    }
    struct weight_copies single, rotation;
    memset(&single, 0, sizeof single);
    memset(&rotation, 0, sizeof rotation);
    const double weight_bytes = 4.0 * (double)(shape->n * shape->k);
    float *src = bench_alloc_floats((size_t)(max_tokens * shape->k));
    /* Each side's output: [thread count][side]. */
    const int per_count = untuned ? SIDES_PER_COUNT : SIDE_UNTUNED;
    float *outputs[BENCH_MAX_THREAD_COUNTS][SIDES_PER_COUNT] = {{NULL}};
    int outputs_made = 1;
    for (int t = 0; t < ctx->thread_count_n; t++)
        for (int i = 0; i < per_count; i++)
            outputs_made &= (outputs[t][i] = bench_alloc_floats((size_t)(max_tokens * shape->n))) != NULL;
    const int copies = bench_rotation_copies(ctx, weight_bytes, MAX_COPIES);
    if (!src || !outputs_made || make_copies(ctx, kernel, shape, copies, &rotation) != 0) {
        fprintf(stderr, "sneppx-bench: gemm %s: out of memory\n", shape->name);
        ctx->failures++;
        goto done;
    }
    single.weights[0] = rotation.weights[0];
    single.panels[0] = rotation.panels[0];
    single.count = 1;
    bench_fill_uniform(src, max_tokens * shape->k, 12, 1.0f);

    const struct bench_plan plan = bench_plan_for(ctx, 5, 15, 2.0);
    /* At each T, every thread count's sneppx, OpenBLAS and (a tuned host) untuned kernel
     * run side by side in rounds, so that the speedups and the all-core scaling are
     * ratios within rounds; a multithreaded side's threads go idle before the next runs. */
    for (int ti = 0; ti < tokens_count; ti++) {
        const int64_t tokens = tokens_list[ti];
        struct gemm_run runs[BENCH_MAX_SIDES];
        struct bench_side sides[BENCH_MAX_SIDES];
        for (int t = 0; t < ctx->thread_count_n; t++) {
            const int threads = ctx->thread_counts[t];
            void (*settle)(void) = threads > 1 ? bench_settle : NULL;
            for (int i = 0; i < per_count; i++) {
                struct gemm_run *run = &runs[t * per_count + i];
                *run = (struct gemm_run){.kernel = i == SIDE_UNTUNED ? untuned : kernel, .target = ctx->target, .k = shape->k,
                                         .n = shape->n, .tokens = tokens,
                                         .copies = tokens <= BENCH_DECODE_BATCH ? &rotation : &single, .src = src,
                                         .dst = outputs[t][i], .threads = threads};
                sides[t * per_count + i] =
                    (struct bench_side){.body = i == SIDE_OPENBLAS ? run_openblas : run_sneppx, .state = run,
                                        .after = settle};
            }
        }
        struct bench_stats seconds[BENCH_MAX_SIDES];
        struct bench_rounds rounds;
        /* T = 1 is rated against the read bandwidth probed just before and after its rounds
         * (best of both), as the decode stages are: the peak stage's, minutes earlier, is not
         * what this shared host's memory gives now (it wanders by 2x within a run). */
        double bandwidth[BENCH_MAX_THREAD_COUNTS] = {0};
        for (int t = 0; tokens == 1 && t < ctx->thread_count_n; t++)
            bandwidth[t] = bench_read_bandwidth_beside(ctx, ctx->thread_counts[t]);
        if (bench_measure_sides(sides, ctx->thread_count_n * per_count, &plan, seconds, &rounds) != 0) {
            ctx->failures++;
            break;
        }
        for (int t = 0; tokens == 1 && t < ctx->thread_count_n; t++) {
            const double after = bench_read_bandwidth_beside(ctx, ctx->thread_counts[t]);
            bandwidth[t] = after > bandwidth[t] ? after : bandwidth[t];
        }
        for (int t = 0; t < ctx->thread_count_n; t++) {
            const int threads = ctx->thread_counts[t], first_side = t * per_count;
            struct bench_result ours = {.stage = "gemm", .impl = "sneppx", .tokens = tokens, .threads = threads,
                                        .seconds = seconds[first_side + SIDE_SNEPPX]};
            snprintf(ours.case_name, sizeof ours.case_name, "%s %lldx%lld", shape->name, (long long)shape->k,
                     (long long)shape->n);
            if (tokens == 1) { /* decode: bound by streaming the weights once */
                ours.unit = BENCH_UNIT_BYTES;
                ours.work = (double)shape->n * (double)shape->k * sizeof(float);
                ours.peak_rate = bandwidth[t] > 0 ? bandwidth[t] : bench_read_bandwidth(ctx, threads);
            } else {
                ours.unit = BENCH_UNIT_FLOPS;
                ours.work = 2.0 * (double)tokens * (double)shape->n * (double)shape->k;
                ours.peak_rate = bench_fma_peak(ctx, threads);
            }
            struct bench_stats scaling = {0};
            if (t > 0) /* against the first thread count's sneppx (1 thread) */
                bench_round_ratio(&rounds, SIDE_SNEPPX, first_side + SIDE_SNEPPX, &scaling);
            ours.scaling = scaling.median;
            struct bench_result theirs = ours;
            snprintf(theirs.impl, sizeof theirs.impl, tokens == 1 ? "sgemv" : "sgemm");
            theirs.seconds = seconds[first_side + SIDE_OPENBLAS];
            theirs.scaling = 0;

            const double error = bench_relative_error(outputs[t][SIDE_SNEPPX], outputs[t][SIDE_OPENBLAS], tokens * shape->n);
            char note[160];
            const int length = snprintf(note, sizeof note, "err %.1e%s", error, error > 1e-4 ? " MISMATCH" : "");
            if (error > 1e-4)
                ctx->failures++;
            if (t > 0) {
                char scaling_text[48];
                bench_format_scaling(scaling_text, sizeof scaling_text, threads, &scaling);
                snprintf(note + length, sizeof note - (size_t)length, "  %s", scaling_text);
            }
            struct bench_stats speedup;
            bench_round_ratio(&rounds, first_side + SIDE_OPENBLAS, first_side + SIDE_SNEPPX, &speedup);
            bench_report_rounds(&ours, &theirs, &speedup, note);
            if (untuned) {
                struct bench_result before = ours;
                snprintf(before.impl, sizeof before.impl, "untuned");
                before.seconds = seconds[first_side + SIDE_UNTUNED];
                before.scaling = 0;
                bench_round_ratio(&rounds, first_side + SIDE_UNTUNED, first_side + SIDE_SNEPPX, &speedup);
                const double untuned_error = bench_relative_error(outputs[t][SIDE_UNTUNED], outputs[t][SIDE_OPENBLAS], tokens * shape->n);
                snprintf(note, sizeof note, "tuned kc%lld-mc%lld vs the target's kc%lld-mc%lld, err %.1e%s",
                         (long long)values[4], (long long)values[5], (long long)untuned_values[4],
                         (long long)untuned_values[5], untuned_error, untuned_error > 1e-4 ? " MISMATCH" : "");
                if (untuned_error > 1e-4)
                    ctx->failures++;
                bench_report_rounds(&ours, &before, &speedup, note);
            }
        }
    }
done:
    for (int c = 0; c < rotation.count; c++) {
        free(rotation.weights[c]);
        free(rotation.panels[c]);
    }
    free(src);
    for (int t = 0; t < BENCH_MAX_THREAD_COUNTS; t++)
        for (int i = 0; i < SIDES_PER_COUNT; i++)
            free(outputs[t][i]);
}

void bench_stage_gemm(struct bench_context *ctx)
{
    bench_report_section("projections: sneppx GEMM vs OpenBLAS (T = 1: sgemv, rated in GB/s of weights streamed, "
                         "% of the read bandwidth probed just before and after, best of both)",
                         "case KxN, T rows; sneppx and OpenBLAS on every thread count alternate in rounds; "
                         "speedup = OpenBLAS time / sneppx time in a round, median [min-max] over the rounds; "
                         "Nt/1t: sneppx's 1-thread time / N-thread time, the same way; % = of FMA peak at that thread count; err = max |sneppx - OpenBLAS| / max |OpenBLAS|");
    const struct gemm_case *cases = ctx->quick ? quick_cases : full_cases;
    const int64_t *tokens = ctx->quick ? quick_tokens : full_tokens;
    const int tokens_count = ctx->quick ? (int)(sizeof quick_tokens / sizeof quick_tokens[0])
                                        : (int)(sizeof full_tokens / sizeof full_tokens[0]);
    for (int c = 0; c < 2; c++)
        bench_case(ctx, &cases[c], tokens, tokens_count);
    bench_gemm_sweep_types(ctx);
}
