/* The whole layer through the public API (synthetic weights), per model, T and
 * thread count; beside llama3-8B, the same layer in PyTorch as HF runs it, with its
 * default attn_implementation "sdpa" (bench/torch_layer.py),
 * from $SNEPPX_BENCH_VENV (torch 2.x; bench/run.sh makes it with scripts/venv.sh)
 * when set, else from /usr/bin/python3 when it can import torch. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "child.h"
#include "report.h"
#include "sneppx/sneppx.h"

static const char *const full_models[] = {"llama3-8B", "mistral-7B", "qwen2-72B", "deepseek-v2-lite"};
static const int64_t full_tokens[] = {128, 512, 2048};
static const char *const quick_models[] = {"llama3-8B", "deepseek-v2-lite"};
static const int64_t quick_tokens[] = {16};
#define MAX_TOKEN_COUNTS 3
#define TORCH_MODEL "llama3-8B"

/* PyTorch's times for TORCH_MODEL by [token index][thread index]; reps 0 = none. */
struct torch_times {
    struct bench_stats seconds[MAX_TOKEN_COUNTS][BENCH_MAX_THREAD_COUNTS];
    char version[64];
    char attention[64]; /* "sdpa blas mkl": HF's attn_implementation it ran and torch's BLAS */
    char skipped[256]; /* why there is no PyTorch column, when there is none */
};

static void run_torch(const struct bench_context *ctx, const sneppx_config *config, const int64_t *tokens_list,
                      int tokens_count, struct torch_times *torch)
{
    char tokens_arg[128] = "", number[32];
    for (int i = 0; i < tokens_count; i++) {
        snprintf(number, sizeof number, "%s%lld", i ? "," : "", (long long)tokens_list[i]);
        strncat(tokens_arg, number, sizeof tokens_arg - strlen(tokens_arg) - 1);
    }
    char python[512];
    const char *venv = getenv("SNEPPX_BENCH_VENV");
    snprintf(python, sizeof python, "%s%s", venv && venv[0] ? venv : SNEPPX_BENCH_PYTHON,
             venv && venv[0] ? "/bin/python" : "");
    for (int t = 0; t < ctx->thread_count_n; t++) {
        char hidden[32], heads[32], kv_heads[32], head_dim[32], theta[48], bias[8], threads[16];
        char blas_threads[48], omp_threads[48];
        snprintf(hidden, sizeof hidden, "%lld", (long long)config->hidden_size);
        snprintf(heads, sizeof heads, "%lld", (long long)config->num_attention_heads);
        snprintf(kv_heads, sizeof kv_heads, "%lld", (long long)config->num_key_value_heads);
        snprintf(head_dim, sizeof head_dim, "%lld",
                 (long long)(config->head_dim ? config->head_dim : config->hidden_size / config->num_attention_heads));
        snprintf(theta, sizeof theta, "%.17g", config->rope_theta);
        snprintf(bias, sizeof bias, "%d", config->qkv_bias ? 1 : 0);
        snprintf(threads, sizeof threads, "%d", ctx->thread_counts[t]);
        snprintf(blas_threads, sizeof blas_threads, "OPENBLAS_NUM_THREADS=%d", ctx->thread_counts[t]);
        snprintf(omp_threads, sizeof omp_threads, "OMP_NUM_THREADS=%d", ctx->thread_counts[t]);
        char *const argv[] = {python, (char *)SNEPPX_BENCH_SOURCE_DIR "/torch_layer.py",
                              "--hidden", hidden, "--heads", heads, "--kv-heads", kv_heads, "--head-dim", head_dim,
                              "--rope-theta", theta, "--qkv-bias", bias, "--tokens", tokens_arg,
                              "--threads", threads, ctx->quick ? "--max-reps" : "--min-reps", ctx->quick ? "1" : "3",
                              NULL};
        /* glibc's default malloc returns PyTorch's big temporaries to the OS and
         * every forward pays fresh page faults again (6.8 s instead of 0.99 s at T = 2048). */
        const char *const set_env[] = {
            "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295",
            blas_threads, omp_threads, NULL};
        /* OpenBLAS's core (Debian's torch runs its GEMMs on OpenBLAS) is the bench's own
         * environment, which it re-executed itself into (main.c): unset, or Haswell's where
         * sneppx runs a narrower target, as for the bench's own OpenBLAS. */
        struct bench_child child;
        if (bench_child_run(argv, set_env, NULL, &child) != 0) {
            snprintf(torch->skipped, sizeof torch->skipped, "cannot run %.200s", python);
            return;
        }
        const char *unavailable = bench_child_field(child.output, "unavailable");
        const char *version = bench_child_field(child.output, "torch");
        const char *attention = bench_child_field(child.output, "attention");
        if (unavailable)
            snprintf(torch->skipped, sizeof torch->skipped, "%.*s", (int)strcspn(unavailable, "\n"), unavailable);
        else if (!version || child.exit_code != 0)
            snprintf(torch->skipped, sizeof torch->skipped, "torch_layer.py exited with status %d",
                     child.exit_code);
        if (torch->skipped[0]) {
            free(child.output);
            return;
        }
        snprintf(torch->version, sizeof torch->version, "%.*s", (int)strcspn(version, "\n"), version);
        if (attention)
            snprintf(torch->attention, sizeof torch->attention, "%.*s", (int)strcspn(attention, "\n"), attention);
        for (const char *line = child.output; (line = strstr(line, "result ")) != NULL; line++) {
            long long tokens;
            int thread_count, reps;
            double median, fastest, slowest;
            if (sscanf(line, "result %lld %d %lf %lf %lf %d", &tokens, &thread_count, &median, &fastest, &slowest,
                       &reps) != 6)
                continue;
            for (int i = 0; i < tokens_count; i++)
                if (tokens_list[i] == tokens)
                    torch->seconds[i][t] = (struct bench_stats){median, fastest, slowest, reps};
        }
        free(child.output);
    }
}

struct layer_run {
    sneppx_layer *layer;
    int64_t tokens;
    int threads; /* the layer runs on OpenMP's count: set per run */
    const float *hidden;
    float *out;
};

static int run_forward(void *opaque)
{
    const struct layer_run *run = opaque;
    omp_set_num_threads(run->threads);
    if (sneppx_layer_forward(run->layer, 1, run->tokens, run->hidden, NULL, NULL, NULL, run->out) == SNEPPX_OK)
        return 0;
    fprintf(stderr, "sneppx-bench: forward: %s\n", sneppx_last_error());
    return 1;
}

static void bench_model(struct bench_context *ctx, const char *model, const int64_t *tokens_list,
                        int tokens_count)
{
    sneppx_config config;
    if (sneppx_config_from_name(model, NULL, &config) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: %s: %s\n", model, sneppx_last_error());
        ctx->failures++;
        return;
    }
    struct torch_times torch;
    memset(&torch, 0, sizeof torch);
    const int with_torch = strcmp(model, TORCH_MODEL) == 0;
    if (with_torch) {
        run_torch(ctx, &config, tokens_list, tokens_count, &torch);
        if (torch.skipped[0])
            printf("  (PyTorch baseline skipped: %s)\n", torch.skipped);
        else
            printf("  (PyTorch %s, HF attention %s, same thread counts)\n", torch.version,
                   torch.attention[0] ? torch.attention : "(not printed)");
    }

    config.num_threads = 0; /* OpenMP's count, set per measurement with omp_set_num_threads */
    config.use_flash_attn = 1;
    const double create_start = bench_now();
    sneppx_layer *layer;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: %s: %s\n", model, sneppx_last_error());
        ctx->failures++;
        return;
    }
    const double create_seconds = bench_now() - create_start;
    const int64_t max_tokens = tokens_list[tokens_count - 1];
    float *hidden = bench_alloc_floats((size_t)(max_tokens * config.hidden_size));
    float *out = bench_alloc_floats((size_t)(max_tokens * config.hidden_size));
    if (!hidden || !out) {
        fprintf(stderr, "sneppx-bench: %s: out of memory\n", model);
        ctx->failures++;
    } else {
        bench_fill_uniform(hidden, max_tokens * config.hidden_size, 31, 1.0f);
        const struct bench_plan plan = bench_plan_for(ctx, 3, 9, 4.0);
        for (int ti = 0; ti < tokens_count; ti++) {
            /* Every thread count side by side in rounds: the all-core scaling is a ratio
             * within rounds (libgomp's threads settle after a multithreaded turn). */
            struct layer_run runs[BENCH_MAX_THREAD_COUNTS];
            struct bench_side sides[BENCH_MAX_THREAD_COUNTS];
            for (int t = 0; t < ctx->thread_count_n; t++) {
                runs[t] = (struct layer_run){.layer = layer, .tokens = tokens_list[ti],
                                             .threads = ctx->thread_counts[t], .hidden = hidden, .out = out};
                sides[t] = (struct bench_side){run_forward, &runs[t], runs[t].threads > 1 ? bench_settle : NULL};
            }
            struct bench_stats seconds[BENCH_MAX_THREAD_COUNTS];
            struct bench_rounds rounds;
            if (bench_measure_sides(sides, ctx->thread_count_n, &plan, seconds, &rounds) != 0) {
                ctx->failures++;
                continue;
            }
            for (int t = 0; t < ctx->thread_count_n; t++) {
                const int threads = ctx->thread_counts[t];
                struct bench_result ours = {.stage = "layer", .impl = "sneppx", .tokens = tokens_list[ti],
                                            .threads = threads, .unit = BENCH_UNIT_FLOPS, .seconds = seconds[t]};
                snprintf(ours.case_name, sizeof ours.case_name, "%s", model);
                ours.work = sneppx_layer_flops(layer, 1, tokens_list[ti]);
                ours.peak_rate = bench_fma_peak(ctx, threads);
                struct bench_stats scaling = {0};
                if (t > 0) /* against the first thread count (1 thread) */
                    bench_round_ratio(&rounds, 0, t, &scaling);
                ours.scaling = scaling.median;
                struct bench_result theirs = ours;
                snprintf(theirs.impl, sizeof theirs.impl, "pytorch");
                theirs.seconds = torch.seconds[ti][t];
                theirs.scaling = 0;
                char note[96] = "";
                if (ti == 0 && t == 0)
                    snprintf(note, sizeof note, "(layer created in %.2f s)", create_seconds);
                else if (t > 0)
                    bench_format_scaling(note, sizeof note, threads, &scaling);
                bench_report_pair(&ours, theirs.seconds.reps > 0 ? &theirs : NULL, note);
            }
        }
    }
    omp_set_num_threads(omp_get_num_procs());
    free(hidden);
    free(out);
    sneppx_layer_destroy(layer);
}

void bench_stage_layer(struct bench_context *ctx)
{
    bench_report_section("whole layer: x -> QKV (+bias) -> RoPE -> flash attention (causal) -> O, batch 1",
                         "synthetic weights; speedup = PyTorch time / sneppx time; % = of FMA peak on the flops "
                         "the mask keeps (sneppx_layer_flops), for both; sneppx's thread counts alternate in "
                         "rounds, Nt/1t = the median [min-max] of their per-round ratio");
    const char *const *models = ctx->quick ? quick_models : full_models;
    const int model_count = ctx->quick ? (int)(sizeof quick_models / sizeof quick_models[0])
                                       : (int)(sizeof full_models / sizeof full_models[0]);
    const int64_t *tokens = ctx->quick ? quick_tokens : full_tokens;
    const int tokens_count = ctx->quick ? (int)(sizeof quick_tokens / sizeof quick_tokens[0])
                                        : (int)(sizeof full_tokens / sizeof full_tokens[0]);
    for (int m = 0; m < model_count; m++)
        bench_model(ctx, models[m], tokens, tokens_count);
}
