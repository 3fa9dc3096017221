/* Generation through the paged KV cache: llama3-8B's layer on every core.
 *
 * Decode steps at each context, batch 1 and a ragged batch, rated against the
 * decode roofline: a step must read the packed weights once and every cached
 * K/V row its queries see, so (weight bytes + cache bytes) / the read
 * bandwidth probed just before and after the case bounds it from below, as its
 * arithmetic / the FMA peak does (the longer of the two: a batch of 16 on a host
 * with a low peak is as much arithmetic as memory). Beside it, in the same
 * rounds, the same attention in llama.cpp (a one-block GGUF, flash attention,
 * f32 weights and KV) and in HF transformers' LlamaAttention with a DynamicCache
 * (torch SDPA), from the virtual environment scripts/venv.sh makes
 * ($SNEPPX_BENCH_VENV; bench/run.sh sets it): each a server process asked for one
 * step at a time (decode_baselines.h). Every side's step runs at the case's
 * context and takes its token out of its cache again, so that the steps of all
 * rounds see the same cache. Then chunked prefill (512-token chunks through the
 * cache) against the one-shot cache-free forward of the same tokens, the two
 * side by side in rounds. Decode steps take copies of the layer in turn
 * (bench_rotation_copies), so each reads its weights from memory, as a model's
 * layer does when the other layers have run since its last step. */
#include <malloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "decode_baselines.h"
#include "report.h"
#include "sneppx/sneppx.h"

#define MODEL "llama3-8B"
#define CHUNK 512
/* Batches of up to this many sequences get a prefill each; a longer context
 * forks one prefilled sequence and truncates the forks (its K/V, 268 MB per
 * sequence at 32768, is far beyond any cache, so sharing pages flatters nothing). */
#define DISTINCT_PREFILL_MAX_CONTEXT DECODE_BASELINE_BATCH_MAX_CONTEXT

static const int64_t full_contexts[] = {512, 4096, 32768};
static const int64_t quick_contexts[] = {64};
static const int64_t full_batches[] = {1, BENCH_DECODE_BATCH};
static const int64_t quick_batches[] = {1, 2};
#define MAX_CONTEXTS ((int)(sizeof full_contexts / sizeof full_contexts[0]))
#define MAX_BATCHES ((int)(sizeof full_batches / sizeof full_batches[0]))
_Static_assert(sizeof quick_batches == sizeof full_batches, "a quick run has as many batches");

struct generation {
    sneppx_layer *layer;                      /* prefills, and the first of the copies */
    sneppx_layer *copies[BENCH_MAX_LAYER_COPIES];  /* the same weights; decode step i runs copy i % copy_count */
    int copy_count, steps;
    sneppx_kv_cache *cache;
    int64_t hidden_size;
    int64_t batch;
    int64_t seq_ids[BENCH_DECODE_BATCH];
    int64_t q_lens[BENCH_DECODE_BATCH];
    int64_t lengths[BENCH_DECODE_BATCH];   /* cached tokens per sequence */
    float *hidden, *out;   /* CHUNK tokens (decode: up to BENCH_DECODE_BATCH) */
};

static int forward(struct generation *g, sneppx_layer *layer, int64_t n_seqs, const int64_t *seq_ids,
                   const int64_t *q_lens)
{
    if (sneppx_layer_forward_cached(layer, g->cache, 0, n_seqs, seq_ids, q_lens, g->hidden, NULL, NULL, g->out) ==
        SNEPPX_OK)
        return 0;
    fprintf(stderr, "sneppx-bench: generate: %s\n", sneppx_last_error());
    return 1;
}

/* Appends `tokens` tokens to seq_id, CHUNK at a time. */
static int prefill(struct generation *g, int64_t seq_id, int64_t tokens)
{
    for (int64_t done = 0; done < tokens; done += CHUNK) {
        int64_t q_len = tokens - done < CHUNK ? tokens - done : CHUNK;
        if (forward(g, g->layer, 1, &seq_id, &q_len) != 0)
            return 1;
    }
    return 0;
}

/* Ragged lengths around `context` (their mean): context x (0.5 .. 1.5) for
 * prefilled batches, x (0.75 .. 1.25) for forks of one sequence. */
static int64_t ragged_length(int64_t context, int64_t s, int64_t batch)
{
    if (batch == 1)
        return context;
    const int forked = context > DISTINCT_PREFILL_MAX_CONTEXT;
    const double low = forked ? 0.75 : 0.5, span = forked ? 0.5 : 1.0;
    return (int64_t)((double)context * (low + span * (double)s / (double)(batch - 1)));
}

static int cache_failed(const char *what)
{
    fprintf(stderr, "sneppx-bench: generate: %s: %s\n", what, sneppx_last_error());
    return 1;
}

/* g->batch sequences at their ragged lengths around `context`. */
static int fill_cache(struct generation *g, int64_t context)
{
    if (sneppx_kv_cache_reset(g->cache) != SNEPPX_OK)
        return cache_failed("reset");
    if (context <= DISTINCT_PREFILL_MAX_CONTEXT || g->batch == 1) {
        for (int64_t s = 0; s < g->batch; s++) {
            g->lengths[s] = ragged_length(context, s, g->batch);
            if (sneppx_kv_cache_add_sequence(g->cache, &g->seq_ids[s]) != SNEPPX_OK)
                return cache_failed("add");
            if (prefill(g, g->seq_ids[s], g->lengths[s]) != 0)
                return 1;
        }
        return 0;
    }
    int64_t root;
    if (sneppx_kv_cache_add_sequence(g->cache, &root) != SNEPPX_OK)
        return cache_failed("add");
    if (prefill(g, root, ragged_length(context, g->batch - 1, g->batch)) != 0)
        return 1;
    for (int64_t s = 0; s < g->batch; s++) {
        g->lengths[s] = ragged_length(context, s, g->batch);
        if (sneppx_kv_cache_fork(g->cache, root, &g->seq_ids[s]) != SNEPPX_OK ||
            sneppx_kv_cache_truncate(g->cache, g->seq_ids[s], g->lengths[s]) != SNEPPX_OK)
            return cache_failed("fork");
    }
    return sneppx_kv_cache_remove_sequence(g->cache, root) == SNEPPX_OK ? 0 : cache_failed("remove");
}

/* One token per sequence, then out of the cache again (a batch's rollback), as the
 * baselines' steps do: every step at the same lengths. */
static int decode_step(void *opaque)
{
    struct generation *g = opaque;
    for (int64_t s = 0; s < g->batch; s++)
        g->q_lens[s] = 1;
    if (forward(g, g->copies[g->steps++ % g->copy_count], g->batch, g->seq_ids, g->q_lens) != 0)
        return 1;
    if (sneppx_kv_cache_truncate_sequences(g->cache, g->batch, g->seq_ids, g->lengths) != SNEPPX_OK)
        return cache_failed("truncate");
    return 0;
}

/* One query/key pair's attention arithmetic, every head: a two-token forward sees
 * three pairs, two one-token forwards two, and the projections are the same. */
static double pair_flops(const sneppx_layer *layer)
{
    return sneppx_layer_flops(layer, 1, 2) - 2 * sneppx_layer_flops(layer, 1, 1);
}

/* Floating-point operations of one decode step at the current lengths: each
 * sequence's token through the projections and over its cached tokens and itself. */
static double step_flops(const struct generation *g)
{
    double flops = 0;
    for (int64_t s = 0; s < g->batch; s++)
        flops += sneppx_layer_flops(g->layer, 1, 1) + pair_flops(g->layer) * (double)g->lengths[s];
    return flops;
}

/* Bytes one decode step reads at the current lengths: the weights once, and
 * each sequence's cached K/V (no window in llama3-8B). */
static double step_bytes(const struct generation *g, double token_bytes)
{
    double bytes = sneppx_layer_weight_bytes(g->layer);
    for (int64_t s = 0; s < g->batch; s++)
        bytes += (double)(g->lengths[s] + 1) * token_bytes;
    return bytes;
}

static size_t heap_bytes(void)
{
    const struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}

/* The decode baselines, each a server (decode_baselines.h). */
enum { BASELINE_LLAMA_CPP, BASELINE_PYTORCH, BASELINES };
static const char *const baseline_names[BASELINES] = {"llama.cpp", "pytorch"};

static void stop_baselines(struct decode_baseline_server *baselines)
{
    for (int i = 0; i < BASELINES; i++)
        decode_baseline_stop(&baselines[i]);
}

static void report_decode(struct bench_context *ctx, struct generation *g, int64_t context, int threads,
                          const struct bench_plan *plan, double token_bytes,
                          struct decode_baseline_server *baselines)
{
    if (fill_cache(g, context) != 0) {
        ctx->failures++;
        return;
    }
    /* Warm: every copy's workspace for this batch, copy-on-write of forked pages. */
    for (int c = 0; c < g->copy_count; c++)
        if (decode_step(g) != 0) {
            ctx->failures++;
            return;
        }
    const double bytes = step_bytes(g, token_bytes);
    struct bench_result ours = {.stage = "generate", .impl = "sneppx", .tokens = context, .threads = threads,
                                .work = bytes, .unit = BENCH_UNIT_BYTES};
    snprintf(ours.case_name, sizeof ours.case_name, "decode b%lld%s", (long long)g->batch,
             g->batch > 1 ? " ragged" : "");
    /* sneppx and each baseline that holds this case's cache, side by side in rounds
     * (the baselines' batches only up to DECODE_BASELINE_BATCH_MAX_CONTEXT). */
    struct bench_side sides[1 + BASELINES];
    int side_of[BASELINES], count = 0;
    void (*settle)(void) = threads > 1 ? bench_settle : NULL;
    sides[count++] = (struct bench_side){.body = decode_step, .state = g, .after = settle};
    for (int i = 0; i < BASELINES; i++) {
        side_of[i] = -1;
        if ((g->batch > 1 && context > DECODE_BASELINE_BATCH_MAX_CONTEXT) ||
            decode_baseline_step_side(&baselines[i], context, g->batch, settle, &sides[count]) != 0)
            continue;
        side_of[i] = count++;
    }
    if (count > 1 && settle)
        settle(); /* the baselines' threads, busy with their prefills */
    struct bench_stats seconds[1 + BASELINES];
    struct bench_rounds rounds;
    const double before = bench_read_bandwidth_beside(ctx, threads);
    const size_t heap_before = heap_bytes();
    const int steps_before = g->steps;
    if (bench_measure_sides(sides, count, plan, seconds, &rounds) != 0) {
        ctx->failures++;
        return;
    }
    const size_t heap_after = heap_bytes();
    ours.seconds = seconds[0];
    const double after = bench_read_bandwidth_beside(ctx, threads);
    /* The roofline's two roofs: reading the step's bytes at the read bandwidth, and
     * its arithmetic at the FMA peak; the rate it allows is the bytes over the longer
     * of the two times. A batch of 16 is as much arithmetic as reading where the peak
     * is low (an AVX2 host: 16 rows of projections at 203 GFLOP/s take about as long
     * as its 36 GB/s read of the weights). */
    const double bandwidth = before > after ? before : after, fma_peak = bench_fma_peak(ctx, threads);
    const double flops = step_flops(g);
    const double compute_bound = fma_peak > 0 ? bytes * fma_peak / flops : bandwidth;
    ours.peak_rate = compute_bound < bandwidth ? compute_bound : bandwidth;
    const long long heap_growth = (long long)heap_after - (long long)heap_before;
    char note[96];
    snprintf(note, sizeof note, "heap %+lld B over %d warm steps%s", heap_growth, g->steps - steps_before,
             compute_bound < bandwidth ? "; roof: FMA peak" : "");
    bench_record_value("generate", ours.case_name, GENERATE_HEAP_GROWTH, context, threads, (double)heap_growth, "B");
    int reported = 0;
    for (int i = 0; i < BASELINES; i++) {
        if (side_of[i] < 0)
            continue;
        struct bench_result theirs = ours;
        snprintf(theirs.impl, sizeof theirs.impl, "%s", baseline_names[i]);
        theirs.seconds = seconds[side_of[i]];
        struct bench_stats speedup;
        bench_round_ratio(&rounds, side_of[i], 0, &speedup);
        bench_report_rounds(&ours, &theirs, &speedup, reported ? NULL : note);
        reported = 1;
    }
    if (!reported)
        bench_report_pair(&ours, NULL, note);
}

struct one_shot {
    sneppx_layer *layer;
    int64_t tokens;
    const float *hidden;
    float *out;
};

static int run_one_shot(void *opaque)
{
    const struct one_shot *run = opaque;
    if (sneppx_layer_forward(run->layer, 1, run->tokens, run->hidden, NULL, NULL, NULL, run->out) == SNEPPX_OK)
        return 0;
    fprintf(stderr, "sneppx-bench: generate: one-shot: %s\n", sneppx_last_error());
    return 1;
}

struct chunked {
    struct generation *g;
    int64_t tokens;
};

static int run_chunked(void *opaque)
{
    struct chunked *run = opaque;
    struct generation *g = run->g;
    if (sneppx_kv_cache_reset(g->cache) != SNEPPX_OK || sneppx_kv_cache_add_sequence(g->cache, &g->seq_ids[0]))
        return cache_failed("reset");
    return prefill(g, g->seq_ids[0], run->tokens);
}

/* Chunked prefill (CHUNK tokens a call, through the cache) against one
 * forward of all the tokens without a cache: the same flops. */
static void report_chunked(struct bench_context *ctx, struct generation *g, int64_t tokens, int threads,
                           const struct bench_plan *plan)
{
    float *hidden = bench_alloc_floats((size_t)(tokens * g->hidden_size));
    float *out = bench_alloc_floats((size_t)(tokens * g->hidden_size));
    if (!hidden || !out) {
        fprintf(stderr, "sneppx-bench: generate: out of memory for %lld tokens\n", (long long)tokens);
        ctx->failures++;
    } else {
        bench_fill_uniform(hidden, tokens * g->hidden_size, 41, 1.0f);
        struct one_shot shot = {.layer = g->layer, .tokens = tokens, .hidden = hidden, .out = out};
        struct chunked chunks = {.g = g, .tokens = tokens};
        struct bench_result ours = {.stage = "generate", .impl = "chunked", .tokens = tokens, .threads = threads,
                                    .unit = BENCH_UNIT_FLOPS};
        snprintf(ours.case_name, sizeof ours.case_name, "prefill %d-token chunks", CHUNK);
        ours.work = sneppx_layer_flops(g->layer, 1, tokens);
        ours.peak_rate = bench_fma_peak(ctx, threads);
        struct bench_result theirs = ours;
        snprintf(theirs.impl, sizeof theirs.impl, "one-shot");
        /* Side by side in rounds, as every comparison within one process: the ratio of two
         * medians timed one after the other would carry the host's phase between them. */
        enum { SIDE_CHUNKED, SIDE_ONE_SHOT, SIDES };
        const struct bench_side sides[SIDES] = {{.body = run_chunked, .state = &chunks},
                                                {.body = run_one_shot, .state = &shot}};
        struct bench_stats seconds[SIDES], speedup;
        struct bench_rounds rounds;
        if (bench_measure_sides(sides, SIDES, plan, seconds, &rounds) != 0) {
            ctx->failures++;
        } else {
            ours.seconds = seconds[SIDE_CHUNKED];
            theirs.seconds = seconds[SIDE_ONE_SHOT];
            bench_round_ratio(&rounds, SIDE_ONE_SHOT, SIDE_CHUNKED, &speedup);
            bench_report_rounds(&ours, &theirs, &speedup, "(baseline: sneppx_layer_forward of all tokens at once)");
        }
    }
    free(hidden);
    free(out);
}

void bench_stage_generate(struct bench_context *ctx)
{
    bench_report_section("generation: " MODEL " layer through the paged KV cache, every core",
                         "decode: ms per step, GB/s on the bytes a step must read (weights + visible cache, "
                         "float32) and % of its roofline: those bytes at the read bandwidth (probed just before "
                         "and after each case, best of both) or its arithmetic at the FMA peak, whichever takes "
                         "longer (\"roof: FMA peak\" where that is the arithmetic); speedup = baseline time / sneppx "
                         "time; ragged batches: lengths 0.5-1.5x the context (forks of one prefill, "
                         "0.75-1.25x, past 4096), the baselines' rows all at the context");
    const int threads = ctx->thread_counts[ctx->thread_count_n - 1];
    const int64_t *contexts = ctx->quick ? quick_contexts : full_contexts;
    const int context_count = ctx->quick ? 1 : MAX_CONTEXTS;
    const int64_t *batches = ctx->quick ? quick_batches : full_batches;
    const struct bench_plan plan = bench_plan_for(ctx, 8, 32, 2.0);
    sneppx_config config;
    if (sneppx_config_from_name(MODEL, NULL, &config) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: %s\n", sneppx_last_error());
        ctx->failures++;
        return;
    }
    struct decode_baseline_server baselines[BASELINES];
    const char *const scripts[BASELINES] = {"decode_llama_cpp.py", "decode_torch.py"};
    for (int i = 0; i < BASELINES; i++) {
        char other[96] = "";
        if (decode_baseline_serve(scripts[i], &config, threads, NULL, &baselines[i]) != 0) {
            printf("  (%s: skipped: %s)\n", baseline_names[i], baselines[i].skipped);
            continue;
        }
        decode_baseline_describe_other_bytes(baselines[i].other_bytes, other, sizeof other);
        printf("  (%s%s; a server process asked for one step at a time, %.2f ms a request there and back)\n",
               baselines[i].version, other, 1e3 * baselines[i].request_seconds);
    }
    bench_settle();

    config.num_threads = threads;
    config.use_flash_attn = 1;
    /* llama3-8B's 8192 positions end before the longest context: static NTK scaling (the
     * same arithmetic, other frequencies) lets the positions run on. */
    const int64_t positions_needed = contexts[context_count - 1] * 2;
    if (positions_needed > config.max_position_embeddings &&
        sneppx_config_extend_context(&config, positions_needed) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: generate: %s\n", sneppx_last_error());
        ctx->failures++;
        stop_baselines(baselines);
        return;
    }
    struct generation g = {.hidden_size = config.hidden_size};
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    const int64_t most = batches[MAX_BATCHES - 1];
    /* The longest ragged sequence, plus a step's token (taken out again after each step). */
    const int64_t longest = contexts[context_count - 1] * 3 / 2 + 1;
    const int64_t prefill_tokens = ctx->quick ? 2 * CHUNK : 8 * CHUNK;
    options.capacity_tokens = most * (longest + 2 * SNEPPX_KV_DEFAULT_PAGE_SIZE);
    if (options.capacity_tokens < prefill_tokens + SNEPPX_KV_DEFAULT_PAGE_SIZE)
        options.capacity_tokens = prefill_tokens + SNEPPX_KV_DEFAULT_PAGE_SIZE;
    if (sneppx_layer_create(&config, NULL, &g.layer) != SNEPPX_OK ||
        sneppx_kv_cache_create(&config, &options, &g.cache) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: generate: %s\n", sneppx_last_error());
        ctx->failures++;
        goto done;
    }
    g.copies[0] = g.layer;
    g.copy_count = 1;
    const int copies = bench_rotation_copies(ctx, sneppx_layer_weight_bytes(g.layer), BENCH_MAX_LAYER_COPIES);
    for (; g.copy_count < copies; g.copy_count++)
        if (sneppx_layer_create(&config, NULL, &g.copies[g.copy_count]) != SNEPPX_OK) {
            fprintf(stderr, "sneppx-bench: generate: layer copy: %s\n", sneppx_last_error());
            ctx->failures++;
            goto done;
        }
    printf("  (decode steps take %d copies of the layer in turn, %.0f MB of weights each)\n", g.copy_count,
           sneppx_layer_weight_bytes(g.layer) / 1e6);
    g.hidden = bench_alloc_floats((size_t)(CHUNK * config.hidden_size));
    g.out = bench_alloc_floats((size_t)(CHUNK * config.hidden_size));
    if (!g.hidden || !g.out) {
        ctx->failures++;
        goto done;
    }
    bench_fill_uniform(g.hidden, CHUNK * config.hidden_size, 43, 1.0f);
    sneppx_kv_cache_stats stats;
    sneppx_kv_cache_stats_get(g.cache, &stats);
    const double token_bytes = (double)stats.page_bytes / (double)stats.page_size;
    for (int c = 0; c < context_count; c++)
        for (int b = 0; b < MAX_BATCHES; b++) {
            g.batch = batches[b];
            report_decode(ctx, &g, contexts[c], threads, &plan, token_bytes, baselines);
        }
    g.batch = 1;
    const struct bench_plan prefill_plan = bench_plan_for(ctx, 3, 5, 4.0);
    report_chunked(ctx, &g, prefill_tokens, threads, &prefill_plan);
done:
    free(g.hidden);
    free(g.out);
    sneppx_kv_cache_destroy(g.cache);
    for (int c = 1; c < g.copy_count; c++)
        sneppx_layer_destroy(g.copies[c]);
    sneppx_layer_destroy(g.layer);
    stop_baselines(baselines);
}
