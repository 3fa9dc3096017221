/* JIT: what a layer's kernels cost to get, in fresh processes (the bench
 * re-executes itself with --child-start MODEL THREADS WEIGHT_TYPE): the layer's
 * own kernels, SDPA's, the explicit-mask flash kernel (a masked forward), and
 * the decode kernels of the float32, bfloat16 and int8 KV caches (a one-token
 * cached step per type; float32 with an explicit mask too). Left out: SDPA with
 * an explicit mask, float16 caches and weights, bfloat16 compute;
 *   cold, 1 thread: an empty SNEPPX_CACHE_DIR, every key specialized, optimized
 *     and compiled one after another: the compile time of each key alone;
 *   warm, 1 thread: that directory, now full, and SNEPPX_JIT=0 so a miss
 *     would fail: the load time of each key alone;
 *   cold and warm, all cores: the same in another directory, with the layer
 *     resolving its keys side by side on its threads, as a user's layer does
 *     (a key's time then includes waiting for the other threads' links).
 * Each of the four runs START_ROUNDS times, in rounds (a fresh pair of
 * directories per round), and is reported as its median [min-max]: one
 * process's compile is one sample of a VM whose speed drifts, and a single
 * sample let one slow moment decide a key's verdict.
 * Per key: compile ms and disk-cache load ms, one thread. Per
 * layer: the sum of its keys' resolves, the layer created (kernels +
 * synthetic weights + packing), its first forward, and the child's wall time
 * from fork to exit. */
#include <ftw.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "child.h"
#include "report.h"
#include "timing.h"
#include "sneppx/sneppx.h"

/* qwen2-72B is left out: its keys are of the same families (gemm, rope,
 * attention), and its 2.4 GB of synthetic weights would swamp its start.
 * llama3-8B also with int8 and bfloat16 weights: their GEMM keys are other code. */
struct start_model {
    const char *name;
    sneppx_dtype weights;
};
static const struct start_model full_models[] = {{"llama3-8B", SNEPPX_DTYPE_FLOAT32},
                                                 {"mistral-7B", SNEPPX_DTYPE_FLOAT32},
                                                 {"deepseek-v2-lite", SNEPPX_DTYPE_FLOAT32},
                                                 {"llama3-8B", SNEPPX_DTYPE_INT8},
                                                 {"llama3-8B", SNEPPX_DTYPE_BFLOAT16}};
static const struct start_model quick_models[] = {{"deepseek-v2-lite", SNEPPX_DTYPE_FLOAT32}};
/* The KV cache types whose decode kernels a child compiles. */
static const sneppx_dtype cache_types[] = {SNEPPX_DTYPE_FLOAT32, SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_INT8};
#define FIRST_FORWARD_TOKENS 128
#define MAX_KERNELS 32
#define START_ROUNDS 3 /* --quick: 1 */

struct kernel_line {
    char key[SNEPPX_CACHE_KEY_MAX];
    int source;
    double compile_ms, load_ms, total_ms;
};

struct start_report {
    struct kernel_line kernels[MAX_KERNELS];
    int kernel_count;
    double kernels_ms, create_ms, forward_ms, wall_ms;
    int ok;
};

static const char *source_name(int source)
{
    switch (source) {
    case SNEPPX_KERNEL_SOURCE_COMPILED: return "compiled";
    case SNEPPX_KERNEL_SOURCE_DISK: return "disk";
    case SNEPPX_KERNEL_SOURCE_MEMORY: return "memory";
    default: return "none";
    }
}

/* ---- the child: one fresh process creating one layer ---------------------- */

/* A one-token cached step per KV cache type: each compiles that type's decode
 * kernel, which the layer lists with its own; on the float32 cache a second
 * sequence's step with an explicit mask plane compiles the masked one. 0 when
 * all ran. */
static int decode_steps(sneppx_layer *layer, const sneppx_config *config, const float *hidden, float *out)
{
    for (size_t t = 0; t < sizeof cache_types / sizeof cache_types[0]; t++) {
        sneppx_kv_cache_options options;
        sneppx_kv_cache_options_init(&options);
        options.capacity_tokens = 2 * SNEPPX_KV_DEFAULT_PAGE_SIZE; /* a page per sequence */
        options.dtype = cache_types[t];
        sneppx_kv_cache *cache = NULL;
        int64_t seq_id = 0, masked_id = 0;
        const int64_t q_len = 1;
        const float plane[1] = {0.0f}; /* [q_len, 0 + q_len]: the token sees itself */
        const float *const masks[1] = {plane};
        const int masked_step = cache_types[t] == SNEPPX_DTYPE_FLOAT32;
        sneppx_status status = sneppx_kv_cache_create(config, &options, &cache);
        if (status == SNEPPX_OK)
            status = sneppx_kv_cache_add_sequence(cache, &seq_id);
        if (status == SNEPPX_OK)
            status = sneppx_layer_forward_cached(layer, cache, 0, 1, &seq_id, &q_len, hidden, NULL, NULL, out);
        if (status == SNEPPX_OK && masked_step)
            status = sneppx_kv_cache_add_sequence(cache, &masked_id);
        if (status == SNEPPX_OK && masked_step)
            status = sneppx_layer_forward_cached(layer, cache, 0, 1, &masked_id, &q_len, hidden, NULL, masks, out);
        sneppx_kv_cache_destroy(cache);
        if (status != SNEPPX_OK) {
            fprintf(stderr, "sneppx-bench: %s cache step: %s\n", sneppx_dtype_name(cache_types[t]),
                    sneppx_last_error());
            return 1;
        }
    }
    return 0;
}

/* A forward with an explicit mask (HF's causal plane): compiles the layer's
 * explicit-mask attention kernel. 0 when it ran. */
static int masked_forward(sneppx_layer *layer, int64_t tokens, const float *hidden, float *out)
{
    float *mask = bench_alloc_floats((size_t)(tokens * tokens));
    if (!mask)
        return 1;
    for (int64_t i = 0; i < tokens; i++)
        for (int64_t j = 0; j < tokens; j++)
            mask[i * tokens + j] = j <= i ? 0.0f : -INFINITY;
    const int64_t shape[4] = {1, 1, tokens, tokens};
    const sneppx_status status = sneppx_layer_forward(layer, 1, tokens, hidden, mask, shape, NULL, out);
    free(mask);
    if (status != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: masked forward: %s\n", sneppx_last_error());
        return 1;
    }
    return 0;
}

/* The sneppx_dtype named name, or -1. */
static int dtype_named(const char *name)
{
    for (int t = 0; t < SNEPPX_DTYPE_COUNT; t++)
        if (strcmp(sneppx_dtype_name(t), name) == 0)
            return t;
    return -1;
}

int bench_child_start(int argc, char **argv)
{
    const double start = bench_now();
    if (argc < 3 || dtype_named(argv[2]) < 0) {
        fprintf(stderr, "sneppx-bench --child-start MODEL THREADS WEIGHT_TYPE\n");
        return 2;
    }
    sneppx_config config;
    sneppx_layer *layer;
    int ok = sneppx_config_from_name(argv[0], NULL, &config) == SNEPPX_OK;
    if (ok) {
        config.num_threads = atoi(argv[1]);
        config.weight_dtype = (sneppx_dtype)dtype_named(argv[2]);
        ok = sneppx_layer_create(&config, NULL, &layer) == SNEPPX_OK;
    }
    if (!ok) {
        fprintf(stderr, "sneppx-bench: %s: %s\n", argv[0], sneppx_last_error());
        return 1;
    }
    const double created = bench_now();
    /* The SDPA kernel too: a deployment that switches paths needs it warm. */
    if (sneppx_layer_set_flash(layer, 0) != SNEPPX_OK || sneppx_layer_set_flash(layer, 1) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: %s: %s\n", argv[0], sneppx_last_error());
        return 1;
    }
    const int64_t tokens = FIRST_FORWARD_TOKENS;
    float *hidden = bench_alloc_floats((size_t)(tokens * config.hidden_size));
    float *out = bench_alloc_floats((size_t)(tokens * config.hidden_size));
    if (!hidden || !out)
        return 1;
    bench_fill_uniform(hidden, tokens * config.hidden_size, 41, 1.0f);
    const double forward_start = bench_now();
    if (sneppx_layer_forward(layer, 1, tokens, hidden, NULL, NULL, NULL, out) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: %s forward: %s\n", argv[0], sneppx_last_error());
        return 1;
    }
    const double forward_ms = (bench_now() - forward_start) * 1e3;
    if (masked_forward(layer, tokens, hidden, out) != 0 || decode_steps(layer, &config, hidden, out) != 0)
        return 1;
    double kernels_ms = 0;
    for (int i = 0; i < sneppx_layer_kernel_count(layer); i++) {
        sneppx_kernel_timing timing;
        if (sneppx_layer_kernel_timing(layer, i, &timing) != SNEPPX_OK)
            continue;
        printf("kernel %s %d %.4f %.4f %.4f\n", timing.key, (int)timing.source, timing.compile_ms, timing.load_ms,
               timing.total_ms);
        kernels_ms += timing.total_ms;
    }
    printf("kernels_ms %.4f\ncreate_ms %.4f\nforward_ms %.4f\n", kernels_ms, (created - start) * 1e3, forward_ms);
    free(hidden);
    free(out);
    sneppx_layer_destroy(layer);
    return 0;
}

/* ---- the parent ------------------------------------------------------------ */

static void run_start(struct bench_context *ctx, const struct start_model *model, const char *cache_dir, int warm,
                      int threads, struct start_report *report)
{
    memset(report, 0, sizeof *report);
    char cache_env[4200];
    snprintf(cache_env, sizeof cache_env, "SNEPPX_CACHE_DIR=%s", cache_dir);
    /* Warm: SNEPPX_JIT=0 turns a cache miss into an error instead of a silent compile.
     * OPENBLAS_NUM_THREADS=1: the child links OpenBLAS (the other stages' baseline)
     * but never calls it, and its pool's workers, started as the library loads, spin
     * before they sleep, taking the second core from the first key's divided code
     * generation (docs/PERFORMANCE.md, "A process's first compile"). */
    const char *const set_env[] = {cache_env, "OPENBLAS_NUM_THREADS=1", warm ? "SNEPPX_JIT=0" : NULL, NULL};
    const char *const unset_env[] = {"SNEPPX_JIT", "SNEPPX_CACHE_MAX_MB", NULL};
    char thread_arg[16];
    snprintf(thread_arg, sizeof thread_arg, "%d", threads);
    char *const argv[] = {BENCH_SELF_EXE, "--child-start", (char *)model->name, thread_arg,
                          (char *)sneppx_dtype_name(model->weights), NULL};
    struct bench_child child;
    if (bench_child_run(argv, set_env, unset_env, &child) != 0) {
        ctx->failures++;
        return;
    }
    report->wall_ms = child.wall_seconds * 1e3;
    for (const char *line = child.output; (line = strstr(line, "kernel ")) != NULL; line++) {
        if (line != child.output && line[-1] != '\n')
            continue;
        struct kernel_line *k = &report->kernels[report->kernel_count];
        if (report->kernel_count < MAX_KERNELS &&
            sscanf(line, "kernel %159s %d %lf %lf %lf", k->key, &k->source, &k->compile_ms, &k->load_ms,
                   &k->total_ms) == 5)
            report->kernel_count++;
    }
    const char *kernels = bench_child_field(child.output, "kernels_ms");
    const char *create = bench_child_field(child.output, "create_ms");
    const char *forward = bench_child_field(child.output, "forward_ms");
    report->ok = child.exit_code == 0 && kernels && create && forward;
    if (report->ok) {
        report->kernels_ms = atof(kernels);
        report->create_ms = atof(create);
        report->forward_ms = atof(forward);
    } else {
        fprintf(stderr, "sneppx-bench: %s (%s weights) %s start: child exited with status %d\n", model->name,
                sneppx_dtype_name(model->weights), warm ? "warm" : "cold", child.exit_code);
        ctx->failures++;
    }
    free(child.output);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

/* The four kinds of start, in the order a round runs them. */
enum start_kind { COLD_1T, WARM_1T, COLD_ALL, WARM_ALL, START_KINDS };

/* One kind of start over the rounds. */
struct start_runs {
    struct start_report run[START_ROUNDS];
    int count;
};

/* The line of key in report, or NULL. */
static const struct kernel_line *find_key(const struct start_report *report, const char *key)
{
    for (int k = 0; k < report->kernel_count; k++)
        if (strcmp(report->kernels[k].key, key) == 0)
            return &report->kernels[k];
    return NULL;
}

/* Median [min-max] over the runs of a double at `offset`: into the key's
 * kernel line when key is given (runs without the key are skipped), else into
 * the report. Returns how many runs had it. */
static int run_stats(const struct start_runs *runs, const char *key, size_t offset, struct bench_stats *stats)
{
    double values[START_ROUNDS];
    int n = 0;
    for (int r = 0; r < runs->count; r++) {
        const void *from = &runs->run[r];
        if (key && !(from = find_key(&runs->run[r], key)))
            continue;
        values[n++] = *(const double *)((const char *)from + offset);
    }
    if (n > 0)
        bench_stats_of(values, n, stats);
    return n;
}

/* name: "cold" or "warm" with threads > 1, "cold-1t" / "warm-1t" for one-thread children. */
static void print_start(const char *model, const char *name, int threads, const struct start_runs *runs)
{
    struct bench_stats kernels, created, forward, process;
    run_stats(runs, NULL, offsetof(struct start_report, kernels_ms), &kernels);
    run_stats(runs, NULL, offsetof(struct start_report, create_ms), &created);
    run_stats(runs, NULL, offsetof(struct start_report, forward_ms), &forward);
    run_stats(runs, NULL, offsetof(struct start_report, wall_ms), &process);
    printf("  %-22s %-7s start, %d thread%s: keys' resolves %7.1f ms summed (%d keys, incl. SDPA and decode), "
           "layer created %7.1f ms (kernels + weights), first forward T=%d %6.1f ms, process fork->exit %7.1f ms\n",
           model, name, threads, threads > 1 ? "s" : " ", kernels.median, runs->run[0].kernel_count, created.median,
           FIRST_FORWARD_TOKENS, forward.median, process.median);
    char metric[64];
    snprintf(metric, sizeof metric, "%s-start-kernels", name);
    bench_record_value("jit", model, metric, 0, threads, kernels.median, "ms");
    snprintf(metric, sizeof metric, "%s-start-created", name);
    bench_record_value("jit", model, metric, 0, threads, created.median, "ms");
    snprintf(metric, sizeof metric, "%s-start-process", name);
    bench_record_value("jit", model, metric, 0, threads, process.median, "ms");
}

/* One round: the four starts, the cold ones in fresh empty directories. 0 when all ran. */
static int run_round(struct bench_context *ctx, const struct start_model *model, int threads,
                     struct start_runs runs[START_KINDS])
{
    char serial_dir[] = "/tmp/sneppx-bench-cache-XXXXXX";
    char parallel_dir[] = "/tmp/sneppx-bench-cache-XXXXXX";
    if (!mkdtemp(serial_dir) || !mkdtemp(parallel_dir)) {
        perror("sneppx-bench: mkdtemp");
        rmdir(serial_dir); /* fails harmlessly when it was not made */
        ctx->failures++;
        return -1;
    }
    const int r = runs[COLD_1T].count;
    run_start(ctx, model, serial_dir, 0, 1, &runs[COLD_1T].run[r]);
    run_start(ctx, model, serial_dir, 1, 1, &runs[WARM_1T].run[r]);
    run_start(ctx, model, parallel_dir, 0, threads, &runs[COLD_ALL].run[r]);
    run_start(ctx, model, parallel_dir, 1, threads, &runs[WARM_ALL].run[r]);
    nftw(serial_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    nftw(parallel_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    for (int kind = 0; kind < START_KINDS; kind++)
        if (!runs[kind].run[r].ok)
            return -1;
    for (int kind = 0; kind < START_KINDS; kind++)
        runs[kind].count++;
    return 0;
}

void bench_stage_jit(struct bench_context *ctx)
{
    const int rounds = ctx->quick ? 1 : START_ROUNDS;
    char explanation[768];
    snprintf(explanation, sizeof explanation,
             "fresh processes, each start %d time%s: median [min-max]; compile = specialize + optimize + emit objects, one "
             "key at a time (a 1-thread layer; a key with enough code has its code generation split over 2 threads, "
             "as any compile alone in a process on 2+ cores); load = read + verify + link the objects, one key at a time too; "
             "total = the whole resolve, median (a process's first compile also sets up LLVM; the LLJIT is created "
             "before the first key, counted in the start, not in a key); a layer on all cores resolves its keys "
             "side by side",
             rounds, rounds > 1 ? "s" : "");
    bench_report_section("JIT: per key, cold compile (empty cache dir) and disk-cache load (SNEPPX_JIT=0); "
                         "cold and warm start of a layer",
                         explanation);
    const int threads = ctx->thread_counts[ctx->thread_count_n - 1];
    const struct start_model *models = ctx->quick ? quick_models : full_models;
    const int model_count = ctx->quick ? 1 : (int)(sizeof full_models / sizeof full_models[0]);
    struct start_runs runs[START_KINDS];
    for (int m = 0; m < model_count; m++) {
        memset(runs, 0, sizeof runs);
        int failed = 0;
        for (int r = 0; r < rounds && !failed; r++)
            failed = run_round(ctx, &models[m], threads, runs) != 0;
        if (failed)
            continue;
        /* "llama3-8B", or "llama3-8B int8" for narrow weights. */
        char label[64];
        snprintf(label, sizeof label, "%s%s%s", models[m].name, models[m].weights ? " " : "",
                 models[m].weights ? sneppx_dtype_name(models[m].weights) : "");
        const struct start_report *cold = &runs[COLD_1T].run[0];
        printf("  %-56s | cold: source   compile median [min-max]  total | warm: source  load [min-max]     total\n",
               label);
        for (int i = 0; i < cold->kernel_count; i++) {
            const char *key = cold->kernels[i].key;
            const struct kernel_line *warm = find_key(&runs[WARM_1T].run[0], key);
            struct bench_stats compile, total, load = {0}, load_total = {0};
            run_stats(&runs[COLD_1T], key, offsetof(struct kernel_line, compile_ms), &compile);
            run_stats(&runs[COLD_1T], key, offsetof(struct kernel_line, total_ms), &total);
            const int loads = run_stats(&runs[WARM_1T], key, offsetof(struct kernel_line, load_ms), &load);
            run_stats(&runs[WARM_1T], key, offsetof(struct kernel_line, total_ms), &load_total);
            printf("    %-54s | %-8s %7.1f ms [%5.1f-%5.1f] %6.1f ms | %-6s %5.2f ms [%4.2f-%4.2f] %5.2f ms\n", key,
                   source_name(cold->kernels[i].source), compile.median, compile.min, compile.max, total.median,
                   warm ? source_name(warm->source) : "-", load.median, load.min, load.max, load_total.median);
            bench_record_value("jit", key, "cold-compile", 0, 0, compile.median, "ms");
            bench_record_value("jit", key, "cold-total", 0, 0, total.median, "ms");
            if (loads) {
                bench_record_value("jit", key, "disk-load", 0, 0, load.median, "ms");
                bench_record_value("jit", key, "disk-total", 0, 0, load_total.median, "ms");
            }
        }
        print_start(label, "cold-1t", 1, &runs[COLD_1T]);
        print_start(label, "warm-1t", 1, &runs[WARM_1T]);
        print_start(label, "cold", threads, &runs[COLD_ALL]);
        print_start(label, "warm", threads, &runs[WARM_ALL]);
    }
}
