/* Storage types: llama3-8B's layer with its weights and KV cache in float32,
 * bfloat16, float16 and int8, on every core.
 *
 * Decode (batch 1, one context): each type's step against the float32 step
 * (the speedup its narrower bytes buy) and against its own roofline (packed
 * weight bytes + the cache bytes its query reads, over the read bandwidth
 * probed before and after the types' rounds), then against llama.cpp with the
 * nearest GGUF types (f16, bf16, q8_0 weights and KV) and HF transformers in
 * bfloat16, the three in rounds of their own (each baseline a server process
 * asked for one step at a time, decode_baselines.h). A type's steps take copies
 * of its layer in turn (bench_rotation_copies),
 * so its weights come from memory as a generation's would, not from the L3 the
 * step before filled (an int8 step reads 56 MB; the cache, one per type, at most
 * a sixth of that). Prefill (one forward of T tokens): each weight type against the
 * float32 layer, where widening the panels must hide behind the FMAs. Each row
 * also says what the type costs in accuracy: max |output - float32's| / max
 * |float32's|, on the same synthetic weights and inputs (decode: the first step
 * after the prefill). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "decode_baselines.h"
#include "report.h"
#include "sneppx/sneppx.h"

#define MODEL "llama3-8B"
#define PREFILL_CHUNK 512

/* One row of the decode table: sneppx's types (label: weights and cache, the
 * short names targets.c looks for) and the baselines' nearest ones (NULL: none run). */
struct precision_case {
    const char *label;
    sneppx_dtype weights, cache;
    const char *llama_weights, *llama_cache; /* bench/baselines/decode_llama_cpp.py --weight-type/--kv-type */
    const char *torch_dtype;                 /* bench/baselines/decode_torch.py --dtype */
};

static const struct precision_case decode_cases[] = {
    {"f32", SNEPPX_DTYPE_FLOAT32, SNEPPX_DTYPE_FLOAT32, "f32", "f32", "float32"},
    {"bf16", SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_BFLOAT16, "bf16", "bf16", "bfloat16"},
    {"f16", SNEPPX_DTYPE_FLOAT16, SNEPPX_DTYPE_FLOAT16, "f16", "f16", NULL},
    {"int8", SNEPPX_DTYPE_INT8, SNEPPX_DTYPE_INT8, "q8_0", "q8_0", NULL},
    /* llama.cpp's usual pairing: q8_0 weights with an f16 cache. */
    {"int8/f16", SNEPPX_DTYPE_INT8, SNEPPX_DTYPE_FLOAT16, "q8_0", "f16", NULL},
};
#define DECODE_CASES (sizeof decode_cases / sizeof decode_cases[0])

/* compute: the projections' sneppx_config.compute_dtype (bfloat16: vdpbf16ps, where
 * the host has AVX512_BF16; elsewhere the case says it is left out). */
static const struct {
    const char *label;
    sneppx_dtype weights, compute;
} prefill_cases[] = {
    {"f32", SNEPPX_DTYPE_FLOAT32, SNEPPX_DTYPE_FLOAT32},
    {"bf16", SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_FLOAT32},
    {"f16", SNEPPX_DTYPE_FLOAT16, SNEPPX_DTYPE_FLOAT32},
    {"int8", SNEPPX_DTYPE_INT8, SNEPPX_DTYPE_FLOAT32},
    {"bf16-compute", SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_BFLOAT16},
};
#define PREFILL_CASES (sizeof prefill_cases / sizeof prefill_cases[0])
_Static_assert(DECODE_CASES <= BENCH_MAX_SIDES && PREFILL_CASES <= BENCH_MAX_SIDES,
               "every type is one side of bench_measure_sides");

static void stage_failed(struct bench_context *ctx, const char *what)
{
    fprintf(stderr, "sneppx-bench: precision: %s: %s\n", what, sneppx_last_error());
    ctx->failures++;
}

/* Copies of a layer (the same synthetic weights) and one one-sequence cache of the given
 * types, prefilled to `context` tokens by the first copy; step i runs copy i % copies. */
struct decode_run {
    sneppx_layer *layers[BENCH_MAX_LAYER_COPIES];
    int copies, uses;
    sneppx_kv_cache *cache;
    int64_t seq_id, length;
    float *hidden, *out; /* PREFILL_CHUNK tokens */
    double weight_bytes, token_bytes;
    float *first_step; /* [hidden_size]: the output of the first step after the prefill */
};

/* max |a - b| / max |b| over n values: a narrow type's output against float32's. */
static double normalized_error(const float *a, const float *b, int64_t n)
{
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        const double difference = fabs((double)a[i] - (double)b[i]), magnitude = fabs((double)b[i]);
        worst = difference > worst ? difference : worst;
        scale = magnitude > scale ? magnitude : scale;
    }
    return scale > 0 ? worst / scale : worst;
}

static void decode_run_free(struct decode_run *run)
{
    sneppx_kv_cache_destroy(run->cache);
    for (int c = 0; c < run->copies; c++)
        sneppx_layer_destroy(run->layers[c]);
    free(run->hidden);
    free(run->out);
    free(run->first_step);
    memset(run, 0, sizeof *run);
}

static int forward(struct decode_run *run, sneppx_layer *layer, int64_t q_len)
{
    return sneppx_layer_forward_cached(layer, run->cache, 0, 1, &run->seq_id, &q_len, run->hidden, NULL, NULL,
                                       run->out) == SNEPPX_OK
               ? 0
               : -1;
}

/* One step over run->length cached tokens: the step before it is rolled back, so that
 * every step, timed or not, reads the same cache (the sides of a round run untimed
 * steps too, a different number each). */
static int decode_step(void *opaque)
{
    struct decode_run *run = opaque;
    sneppx_layer *layer = run->layers[run->uses++ % run->copies];
    if (sneppx_kv_cache_truncate(run->cache, run->seq_id, run->length) != SNEPPX_OK || forward(run, layer, 1) != 0) {
        fprintf(stderr, "sneppx-bench: precision: decode: %s\n", sneppx_last_error());
        return 1;
    }
    return 0;
}

/* 0, or -1 with sneppx_last_error() saying why (the caller names what). */
static int decode_run_make(const struct bench_context *ctx, struct decode_run *run, const sneppx_config *base,
                           const struct precision_case *c, int64_t context)
{
    memset(run, 0, sizeof *run);
    sneppx_config config = *base;
    config.weight_dtype = c->weights;
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.dtype = c->cache;
    options.capacity_tokens = context + 2 + 2 * SNEPPX_KV_DEFAULT_PAGE_SIZE;
    if (sneppx_layer_create(&config, NULL, &run->layers[0]) != SNEPPX_OK)
        return -1;
    run->copies = 1;
    if (sneppx_kv_cache_create(&config, &options, &run->cache) != SNEPPX_OK ||
        sneppx_kv_cache_add_sequence(run->cache, &run->seq_id) != SNEPPX_OK)
        return -1;
    run->hidden = bench_alloc_floats((size_t)(PREFILL_CHUNK * config.hidden_size));
    run->out = bench_alloc_floats((size_t)(PREFILL_CHUNK * config.hidden_size));
    if (!run->hidden || !run->out)
        return -1;
    bench_fill_uniform(run->hidden, PREFILL_CHUNK * config.hidden_size, 47, 1.0f);
    for (int64_t done = 0; done < context; done += PREFILL_CHUNK) {
        const int64_t q_len = context - done < PREFILL_CHUNK ? context - done : PREFILL_CHUNK;
        if (forward(run, run->layers[0], q_len) != 0)
            return -1;
    }
    run->length = context;
    /* Every case steps from the same prefill with the same token: the outputs compare. */
    run->first_step = malloc(sizeof(float) * (size_t)config.hidden_size);
    if (!run->first_step || forward(run, run->layers[0], 1) != 0)
        return -1;
    memcpy(run->first_step, run->out, sizeof(float) * (size_t)config.hidden_size);
    run->length++;
    sneppx_kv_cache_stats stats;
    sneppx_kv_cache_stats_get(run->cache, &stats);
    run->token_bytes = (double)stats.token_bytes; /* rows and int8 scales, not the pages' alignment */
    run->weight_bytes = sneppx_layer_weight_bytes(run->layers[0]);
    const int copies = bench_rotation_copies(ctx, run->weight_bytes, BENCH_MAX_LAYER_COPIES);
    for (; run->copies < copies; run->copies++)
        if (sneppx_layer_create(&config, NULL, &run->layers[run->copies]) != SNEPPX_OK)
            return -1;
    return 0;
}

/* A case's decode step against llama.cpp's and PyTorch's nearest types: each a
 * server (decode_baselines.h) with its cache at `context`, all three side by side
 * in rounds of their own, so the speedups are ratios within those rounds. `ours`:
 * the case's row (its work, rate and roof); its time here is these rounds'. */
static void compare_with_baselines(struct bench_context *ctx, const sneppx_config *config, int64_t context,
                                   int threads, const struct bench_plan *plan, struct decode_run *run,
                                   const struct precision_case *c, const struct bench_result *ours)
{
    enum { LLAMA_CPP, PYTORCH, BASELINES };
    const char *llama_args[] = {"--weight-type", c->llama_weights, "--kv-type", c->llama_cache, NULL};
    const char *torch_args[] = {"--dtype", c->torch_dtype, NULL};
    void (*settle)(void) = threads > 1 ? bench_settle : NULL;
    struct decode_baseline_server servers[BASELINES];
    struct bench_side sides[1 + BASELINES] = {{.body = decode_step, .state = run, .after = settle}};
    int side_of[BASELINES] = {-1, -1}, count = 1;
    char impl[BASELINES][sizeof ours->impl];
    snprintf(impl[LLAMA_CPP], sizeof impl[LLAMA_CPP], "llama.cpp %s/%s", c->llama_weights, c->llama_cache);
    snprintf(impl[PYTORCH], sizeof impl[PYTORCH], "pytorch %s", c->torch_dtype ? c->torch_dtype : "");
    for (int b = 0; b < BASELINES; b++) {
        memset(&servers[b], 0, sizeof servers[b]);
        if (b == PYTORCH && !c->torch_dtype)
            continue;
        if (decode_baseline_serve(b == LLAMA_CPP ? "decode_llama_cpp.py" : "decode_torch.py", config, threads,
                                  b == LLAMA_CPP ? llama_args : torch_args, &servers[b]) != 0) {
            printf("  (%s: skipped: %s)\n", impl[b], servers[b].skipped);
            continue;
        }
        char other[96];
        decode_baseline_describe_other_bytes(servers[b].other_bytes, other, sizeof other);
        printf("  (%s: %s%s)\n", impl[b], servers[b].version, other);
        if (decode_baseline_step_side(&servers[b], context, 1, settle, &sides[count]) != 0) {
            ctx->failures++;
            continue;
        }
        side_of[b] = count++;
    }
    struct bench_stats seconds[1 + BASELINES];
    struct bench_rounds rounds;
    if (count > 1) {
        if (settle)
            settle(); /* the baselines' threads, busy with their prefills */
        if (bench_measure_sides(sides, count, plan, seconds, &rounds) != 0) {
            ctx->failures++;
        } else {
            struct bench_result subject = *ours;
            subject.seconds = seconds[0];
            for (int b = 0; b < BASELINES; b++) {
                if (side_of[b] < 0)
                    continue;
                struct bench_result theirs = subject;
                memcpy(theirs.impl, impl[b], sizeof theirs.impl); /* the same size */
                theirs.seconds = seconds[side_of[b]];
                struct bench_stats speedup;
                bench_round_ratio(&rounds, side_of[b], 0, &speedup);
                bench_report_rounds(&subject, &theirs, &speedup, NULL);
            }
        }
    }
    for (int b = 0; b < BASELINES; b++)
        decode_baseline_stop(&servers[b]);
}

/* Times each case's decode step, all side by side in rounds; the float32 case (first) is
 * every other's baseline. */
static void report_decode(struct bench_context *ctx, const sneppx_config *config, int64_t context, int threads)
{
    const struct bench_plan plan = bench_plan_for(ctx, 8, 32, 2.0);
    struct decode_run runs[DECODE_CASES];
    const struct precision_case *cases[DECODE_CASES];
    struct bench_side sides[DECODE_CASES];
    int count = 0;
    for (size_t i = 0; i < DECODE_CASES; i++) {
        struct decode_run *run = &runs[count];
        if (decode_run_make(ctx, run, config, &decode_cases[i], context) != 0 || decode_step(run) != 0) {
            char what[96];
            snprintf(what, sizeof what, "decode, %s weights and cache", decode_cases[i].label);
            stage_failed(ctx, what);
            decode_run_free(run);
            if (i == 0)
                return; /* every other type is compared with float32 */
            continue;
        }
        cases[count] = &decode_cases[i];
        sides[count] = (struct bench_side){.body = decode_step, .state = run};
        count++;
    }
    struct bench_stats seconds[DECODE_CASES];
    struct bench_rounds rounds;
    const double before = bench_read_bandwidth_beside(ctx, threads);
    const int failed = bench_measure_sides(sides, count, &plan, seconds, &rounds);
    const double after = bench_read_bandwidth_beside(ctx, threads);
    struct bench_result float32_step = {0};
    for (int i = 0; !failed && i < count; i++) {
        const struct precision_case *c = cases[i];
        const struct decode_run *run = &runs[i];
        /* A step reads the weights and the cache it extends by one token. */
        struct bench_result ours = {.stage = "precision", .tokens = context, .threads = threads,
                                    .work = run->weight_bytes + (double)(run->length + 1) * run->token_bytes,
                                    .unit = BENCH_UNIT_BYTES, .seconds = seconds[i],
                                    .peak_rate = before > after ? before : after};
        snprintf(ours.impl, sizeof ours.impl, "sneppx %s", c->label);
        snprintf(ours.case_name, sizeof ours.case_name, "decode b1 %s", c->label);
        char note[160];
        const int length = snprintf(note, sizeof note, "weights %.1f MB x %d copies, cache %.1f KB/token",
                                    run->weight_bytes / 1e6, run->copies, run->token_bytes / 1e3);
        if (i == 0) {
            float32_step = ours;
            bench_report_pair(&ours, NULL, note);
        } else {
            snprintf(note + length, sizeof note - (size_t)length, ", error %.1e vs f32",
                     normalized_error(run->first_step, runs[0].first_step, config->hidden_size));
            struct bench_stats speedup;
            bench_round_ratio(&rounds, 0, i, &speedup);
            bench_report_rounds(&ours, &float32_step, &speedup, note);
        }
        compare_with_baselines(ctx, config, context, threads, &plan, &runs[i], c, &ours);
    }
    if (failed)
        ctx->failures++;
    for (int i = 0; i < count; i++)
        decode_run_free(&runs[i]);
}

struct prefill_run {
    sneppx_layer *layer;
    int64_t tokens;
    const float *hidden;
    float *out;
};

static int prefill_forward(void *opaque)
{
    const struct prefill_run *run = opaque;
    if (sneppx_layer_forward(run->layer, 1, run->tokens, run->hidden, NULL, NULL, NULL, run->out) == SNEPPX_OK)
        return 0;
    fprintf(stderr, "sneppx-bench: precision: prefill: %s\n", sneppx_last_error());
    return 1;
}

/* One forward of `tokens` tokens per weight type, against the float32 layer's: every
 * type's layer is made first, then all are timed side by side in rounds, so that the
 * ratios to float32 hold on a host whose speed wanders between phases. */
static void report_prefill(struct bench_context *ctx, const sneppx_config *base, int64_t tokens, int threads)
{
    const struct bench_plan plan = bench_plan_for(ctx, 3, 8, 4.0);
    struct prefill_run runs[PREFILL_CASES];
    struct bench_result results[PREFILL_CASES];
    struct bench_side sides[PREFILL_CASES];
    int count = 0;
    memset(runs, 0, sizeof runs);
    float *hidden = bench_alloc_floats((size_t)(tokens * base->hidden_size));
    if (!hidden) {
        fprintf(stderr, "sneppx-bench: precision: out of memory for %lld tokens\n", (long long)tokens);
        ctx->failures++;
        return;
    }
    bench_fill_uniform(hidden, tokens * base->hidden_size, 53, 1.0f);
    for (size_t i = 0; i < PREFILL_CASES; i++) {
        sneppx_config config = *base;
        config.weight_dtype = prefill_cases[i].weights;
        config.compute_dtype = prefill_cases[i].compute;
        struct prefill_run *run = &runs[count];
        *run = (struct prefill_run){.tokens = tokens, .hidden = hidden};
        const sneppx_status status = sneppx_layer_create(&config, NULL, &run->layer);
        if (status == SNEPPX_ERR_UNSUPPORTED && prefill_cases[i].compute != SNEPPX_DTYPE_FLOAT32) {
            printf("  prefill %-14s | left out: %s\n", prefill_cases[i].label, sneppx_last_error());
            continue;
        }
        if (status != SNEPPX_OK) {
            stage_failed(ctx, "prefill layer");
            if (i == 0)
                goto done; /* every other type is compared with float32 */
            continue;
        }
        run->out = bench_alloc_floats((size_t)(tokens * base->hidden_size));
        if (!run->out || prefill_forward(run) != 0) { /* warm: the workspace */
            ctx->failures++;
            sneppx_layer_destroy(run->layer);
            free(run->out);
            if (i == 0)
                goto done;
            continue;
        }
        struct bench_result *ours = &results[count];
        /* bfloat16 compute is rated against its own instruction's peak, which is not the
         * FMA's on every core (the attention it leaves in float32 is a sixth of the work). */
        const double dot_peak = bench_bf16dot_peak(ctx, threads);
        const int bf16dot = prefill_cases[i].compute == SNEPPX_DTYPE_BFLOAT16 && dot_peak > 0;
        *ours = (struct bench_result){.stage = "precision", .tokens = tokens, .threads = threads,
                                      .work = sneppx_layer_flops(run->layer, 1, tokens), .unit = BENCH_UNIT_FLOPS,
                                      .peak_rate = bf16dot ? dot_peak : bench_fma_peak(ctx, threads)};
        snprintf(ours->impl, sizeof ours->impl, "sneppx %s", prefill_cases[i].label);
        snprintf(ours->case_name, sizeof ours->case_name, "prefill %s", prefill_cases[i].label);
        sides[count] = (struct bench_side){.body = prefill_forward, .state = run};
        count++;
    }
    struct bench_stats seconds[PREFILL_CASES];
    struct bench_rounds rounds;
    if (bench_measure_sides(sides, count, &plan, seconds, &rounds) != 0) {
        ctx->failures++;
        goto done;
    }
    const int64_t values = tokens * base->hidden_size;
    for (int i = 0; i < count; i++) {
        results[i].seconds = seconds[i];
        if (i == 0) {
            bench_report_pair(&results[0], NULL, NULL);
            continue;
        }
        struct bench_stats speedup;
        bench_round_ratio(&rounds, 0, i, &speedup);
        char note[64];
        snprintf(note, sizeof note, "error %.1e vs f32", normalized_error(runs[i].out, runs[0].out, values));
        bench_report_rounds(&results[i], &results[0], &speedup, note);
    }
done:
    for (int i = 0; i < count; i++) {
        sneppx_layer_destroy(runs[i].layer);
        free(runs[i].out);
    }
    free(hidden);
}

void bench_stage_precision(struct bench_context *ctx)
{
    const int64_t context = ctx->quick ? 64 : 4096, prefill_tokens = ctx->quick ? 64 : 2048;
    const int threads = ctx->thread_counts[ctx->thread_count_n - 1];
    bench_report_section("precision: " MODEL " layer by weight and KV-cache type, every core",
                         "decode b1: ms per step, GB/s and % of the read bandwidth (probed before and after) on "
                         "the bytes the step reads in its own types; speedup = the float32 step's time (or the "
                         "baseline's) / this type's. prefill: GFLOP/s, % of FMA peak (bf16-compute: of the "
                         "vdpbf16ps peak of the peak stage); speedup = float32 "
                         "weights' time / this type's. sneppx's types alternate in rounds, and each type with "
                         "its baselines in rounds of their own: a speedup is the median [min-max] over rounds");
    sneppx_config config;
    if (sneppx_config_from_name(MODEL, NULL, &config) != SNEPPX_OK) {
        stage_failed(ctx, "config");
        return;
    }
    config.num_threads = threads;
    config.use_flash_attn = 1;
    report_decode(ctx, &config, context, threads);
    report_prefill(ctx, &config, prefill_tokens, threads);
}
