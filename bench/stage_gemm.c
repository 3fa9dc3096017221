/* Projections: sneppx's GEMM kernel over the runtime's tile partition against
 * OpenBLAS on the shapes of one layer, [T,4096]x[4096,6144] (fused QKV) and
 * [T,4096]x[4096,4096] (O). T = 1 is decode: sneppx's GEMM against
 * cblas_sgemv (OpenBLAS's sgemm with M = 1 does not route to sgemv and is
 * 3.3x slower), rated as the bandwidth of streaming the weights. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

#include "bench.h"
#include "kernels.h"
#include "report.h"
#include "tiles.h"

struct gemm_case {
    const char *name;
    int64_t k, n;
};

static const struct gemm_case full_cases[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}};
static const int64_t full_tokens[] = {1, 128, 512, 2048};
/* --quick: every code path on shapes that take milliseconds. */
static const struct gemm_case quick_cases[] = {{"qkv", 512, 768}, {"o", 512, 512}};
static const int64_t quick_tokens[] = {1, 24};

struct gemm_run {
    const sneppx_kernel *kernel;
    int64_t k, n, tokens;
    const float *weights; /* HF layout [n, k], for OpenBLAS */
    const float *panels;  /* the same weights packed for the kernel */
    const float *src;     /* [tokens, k] */
    float *dst;           /* [tokens, n] */
    int threads;
};

static int run_sneppx(void *opaque)
{
    const struct gemm_run *run = opaque;
    bench_gemm_tiles(run->kernel, run->threads, run->tokens, run->n, run->src, run->k, run->panels, NULL,
                     run->dst, run->n);
    return 0;
}

static int run_openblas(void *opaque)
{
    const struct gemm_run *run = opaque;
    const int k = (int)run->k, n = (int)run->n;
    if (run->tokens == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, run->weights, k, run->src, 1, 0.0f, run->dst, 1);
    else /* dst = src W^T, as torch.nn.functional.linear computes it */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)run->tokens, n, k, 1.0f, run->src, k,
                    run->weights, k, 0.0f, run->dst, n);
    return 0;
}

static void pack_weights(const sneppx_kernel *kernel, const float *weights, int64_t k, int64_t n, float *panels)
{
    const int64_t columns_per_task = 64; /* a multiple of every NR */
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < n; c0 += columns_per_task) {
        struct sneppx_args args = bench_new_args();
        args.col_begin = c0;
        args.col_end = c0 + columns_per_task < n ? c0 + columns_per_task : n;
        args.src = weights;
        args.src_stride = k;
        args.dst = panels;
        kernel->entry[1](&args);
    }
}

static void bench_case(struct bench_context *ctx, const struct gemm_case *shape, const int64_t *tokens_list,
                       int tokens_count)
{
    const int64_t max_tokens = tokens_list[tokens_count - 1];
    const int64_t values[] = {shape->k, shape->n, 0};
    const sneppx_kernel *kernel;
    if (sneppx_kernel_resolve("gemm", values, ctx->vector_width, &kernel) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: gemm %s: %s\n", shape->name, sneppx_last_error());
        ctx->failures++;
        return;
    }
    float *weights = bench_alloc_floats((size_t)(shape->n * shape->k));
    float *panels = bench_alloc_floats((size_t)sneppx_gemm_packed_floats(shape->k, shape->n, ctx->vector_width));
    float *src = bench_alloc_floats((size_t)(max_tokens * shape->k));
    float *dst = bench_alloc_floats((size_t)(max_tokens * shape->n));
    float *reference = bench_alloc_floats((size_t)(max_tokens * shape->n));
    if (!weights || !panels || !src || !dst || !reference) {
        fprintf(stderr, "sneppx-bench: gemm %s: out of memory\n", shape->name);
        ctx->failures++;
        goto done;
    }
    bench_fill_uniform(weights, shape->n * shape->k, 11, 1.0f / 64.0f);
    bench_fill_uniform(src, max_tokens * shape->k, 12, 1.0f);
    pack_weights(kernel, weights, shape->k, shape->n, panels);

    const struct bench_plan plan = bench_plan_for(ctx, 5, 15, 2.0);
    for (int ti = 0; ti < tokens_count; ti++) {
        const int64_t tokens = tokens_list[ti];
        for (int t = 0; t < ctx->thread_count_n; t++) {
            const int threads = ctx->thread_counts[t];
            struct gemm_run run = {.kernel = kernel, .k = shape->k, .n = shape->n, .tokens = tokens,
                                   .weights = weights, .panels = panels, .src = src, .threads = threads};
            struct bench_result ours = {.stage = "gemm", .impl = "sneppx", .tokens = tokens, .threads = threads};
            snprintf(ours.case_name, sizeof ours.case_name, "%s %lldx%lld", shape->name, (long long)shape->k,
                     (long long)shape->n);
            if (tokens == 1) { /* decode: bound by streaming the weights once */
                ours.unit = BENCH_UNIT_BYTES;
                ours.work = (double)shape->n * (double)shape->k * sizeof(float);
                ours.peak_rate = bench_read_bandwidth(ctx, threads);
            } else {
                ours.unit = BENCH_UNIT_FLOPS;
                ours.work = 2.0 * (double)tokens * (double)shape->n * (double)shape->k;
                ours.peak_rate = bench_fma_peak(ctx, threads);
            }
            struct bench_result theirs = ours;
            snprintf(theirs.impl, sizeof theirs.impl, tokens == 1 ? "sgemv" : "sgemm");

            run.dst = dst;
            bench_measure(run_sneppx, &run, &plan, &ours.seconds);
            bench_settle();
            openblas_set_num_threads(threads);
            run.dst = reference;
            bench_measure(run_openblas, &run, &plan, &theirs.seconds);
            bench_settle();

            const double error = bench_relative_error(dst, reference, tokens * shape->n);
            char note[64];
            snprintf(note, sizeof note, "err %.1e%s", error, error > 1e-4 ? " MISMATCH" : "");
            if (error > 1e-4)
                ctx->failures++;
            bench_report_pair(&ours, &theirs, note);
        }
    }
done:
    free(weights);
    free(panels);
    free(src);
    free(dst);
    free(reference);
}

void bench_stage_gemm(struct bench_context *ctx)
{
    bench_report_section("projections: sneppx GEMM vs OpenBLAS (T = 1: sgemv, rated in GB/s of weights streamed, "
                         "% of read bandwidth)",
                         "case KxN, T rows; speedup = OpenBLAS time / sneppx time; % = of FMA peak at that thread "
                         "count; err = max |sneppx - OpenBLAS| / max |OpenBLAS|");
    const struct gemm_case *cases = ctx->quick ? quick_cases : full_cases;
    const int64_t *tokens = ctx->quick ? quick_tokens : full_tokens;
    const int tokens_count = ctx->quick ? (int)(sizeof quick_tokens / sizeof quick_tokens[0])
                                        : (int)(sizeof full_tokens / sizeof full_tokens[0]);
    for (int c = 0; c < 2; c++)
        bench_case(ctx, &cases[c], tokens, tokens_count);
}
