/* The whole layer through the public API (synthetic weights), per model, T and
 * thread count; beside llama3-8B, the same layer in PyTorch as HF runs it, with its
 * default attn_implementation "sdpa" (bench/torch_layer.py, timed in the same rounds),
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
#define TORCH_MODEL "llama3-8B"

/* PyTorch's layer for TORCH_MODEL, one server process per thread count
 * (bench/torch_layer.py), asked for one forward at a time in the same rounds as
 * sneppx's. */
struct torch_layers {
    struct bench_server servers[BENCH_MAX_THREAD_COUNTS];
    int thread_counts[BENCH_MAX_THREAD_COUNTS];
    int count;                   /* 0: no PyTorch column (skipped says why) */
    double request_seconds;      /* the slowest server's median round trip of a request that does nothing */
    char version[64];
    char attention[64];          /* "sdpa blas mkl": HF's attn_implementation it ran and torch's BLAS */
    char skipped[256];
};

static void stop_torch(struct torch_layers *torch)
{
    for (int t = 0; t < BENCH_MAX_THREAD_COUNTS; t++)
        bench_server_stop(&torch->servers[t]);
    torch->count = 0;
}

/* torch_layer.py's start-up lines: its version and the attention it runs. */
static void torch_start_line(const char *line, void *state)
{
    struct torch_layers *torch = state;
    const char *version = bench_child_field(line, "torch");
    const char *attention = bench_child_field(line, "attention");
    if (version)
        snprintf(torch->version, sizeof torch->version, "%s", version);
    if (attention)
        snprintf(torch->attention, sizeof torch->attention, "%s", attention);
}

static void start_torch(const struct bench_context *ctx, const sneppx_config *config, struct torch_layers *torch)
{
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
                              "--rope-theta", theta, "--qkv-bias", bias, "--threads", threads, NULL};
        /* glibc's default malloc returns PyTorch's big temporaries to the OS and
         * every forward pays fresh page faults again (6.8 s instead of 0.99 s at T = 2048). */
        const char *const set_env[] = {
            "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295",
            blas_threads, omp_threads, NULL};
        /* OpenBLAS's core (Debian's torch runs its GEMMs on OpenBLAS) is the bench's own
         * environment, which it re-executed itself into (main.c): unset, or Haswell's where
         * sneppx runs a narrower target, as for the bench's own OpenBLAS. */
        struct bench_server *server = &torch->servers[t];
        if (bench_server_start(argv, set_env, NULL, server) != 0) {
            snprintf(torch->skipped, sizeof torch->skipped, "cannot run %.200s", python);
            break;
        }
        if (bench_server_await_ready(server, "torch_layer.py", torch_start_line, torch, torch->skipped,
                                     sizeof torch->skipped) != 0)
            break;
        const double seconds = bench_server_round_trip(server);
        if (seconds < 0) {
            snprintf(torch->skipped, sizeof torch->skipped, "torch_layer.py did not answer a ping");
            break;
        }
        if (seconds > torch->request_seconds)
            torch->request_seconds = seconds;
        torch->thread_counts[t] = ctx->thread_counts[t];
        torch->count = t + 1;
    }
    if (torch->skipped[0])
        stop_torch(torch);
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
    struct torch_layers torch;
    memset(&torch, 0, sizeof torch);
    if (strcmp(model, TORCH_MODEL) == 0) {
        start_torch(ctx, &config, &torch);
        if (torch.skipped[0])
            printf("  (PyTorch baseline skipped: %s)\n", torch.skipped);
        else
            printf("  (PyTorch %s, HF attention %s, same thread counts, a server process per thread count whose "
                   "forwards alternate with sneppx's in rounds; its times include a request's round trip, %.3f ms)\n",
                   torch.version, torch.attention[0] ? torch.attention : "(not printed)",
                   1e3 * torch.request_seconds);
    }

    config.num_threads = 0; /* OpenMP's count, set per measurement with omp_set_num_threads */
    config.use_flash_attn = 1;
    const double create_start = bench_now();
    sneppx_layer *layer;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: %s: %s\n", model, sneppx_last_error());
        ctx->failures++;
        stop_torch(&torch);
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
            /* Every thread count, and PyTorch's at each, side by side in rounds: the
             * all-core scaling and the speedups are ratios within rounds (libgomp's
             * threads, ours and PyTorch's, settle after a multithreaded turn). */
            struct layer_run runs[BENCH_MAX_THREAD_COUNTS];
            struct bench_request torch_runs[BENCH_MAX_THREAD_COUNTS];
            struct bench_side sides[2 * BENCH_MAX_THREAD_COUNTS];
            const int count = ctx->thread_count_n;
            for (int t = 0; t < count; t++) {
                runs[t] = (struct layer_run){.layer = layer, .tokens = tokens_list[ti],
                                             .threads = ctx->thread_counts[t], .hidden = hidden, .out = out};
                sides[t] = (struct bench_side){.body = run_forward, .state = &runs[t],
                                               .after = runs[t].threads > 1 ? bench_settle : NULL};
            }
            for (int t = 0; t < torch.count; t++) {
                torch_runs[t] = (struct bench_request){.server = &torch.servers[t], .who = "PyTorch's layer"};
                snprintf(torch_runs[t].line, sizeof torch_runs[t].line, "run %lld", (long long)tokens_list[ti]);
                sides[count + t] = (struct bench_side){.body = bench_request_run, .state = &torch_runs[t],
                                                       .after = torch.thread_counts[t] > 1 ? bench_settle : NULL};
            }
            struct bench_stats seconds[2 * BENCH_MAX_THREAD_COUNTS];
            struct bench_rounds rounds;
            if (bench_measure_sides(sides, count + torch.count, &plan, seconds, &rounds) != 0) {
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
                theirs.scaling = 0;
                struct bench_stats speedup = {0};
                if (t < torch.count) {
                    theirs.seconds = seconds[count + t];
                    bench_round_ratio(&rounds, count + t, t, &speedup);
                }
                char note[96] = "";
                if (ti == 0 && t == 0)
                    snprintf(note, sizeof note, "(layer created in %.2f s)", create_seconds);
                else if (t > 0)
                    bench_format_scaling(note, sizeof note, threads, &scaling);
                if (t < torch.count)
                    bench_report_rounds(&ours, &theirs, &speedup, note);
                else
                    bench_report_pair(&ours, NULL, note);
            }
        }
    }
    stop_torch(&torch);
    omp_set_num_threads(omp_get_num_procs());
    free(hidden);
    free(out);
    sneppx_layer_destroy(layer);
}

void bench_stage_layer(struct bench_context *ctx)
{
    bench_report_section("whole layer: x -> QKV (+bias) -> RoPE -> flash attention (causal) -> O, batch 1",
                         "synthetic weights; speedup = PyTorch time / sneppx time, the median [min-max] of its "
                         "per-round ratio; % = of FMA peak on the flops "
                         "the mask keeps (sneppx_layer_flops), for both; the thread counts and PyTorch alternate in "
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
