/* Attention: the flash kernel against the materialized SDPA kernel, causal,
 * head_dim 128, 4 query heads per K/V head (llama3-8B's 32/8 heads), and
 * mistral-7B's 4096-key sliding window at T = 8192 against no window. Up to
 * T = 2048 also the flash kernel's other masks against its causal kernel: a
 * window that cuts keys at every T, and an explicit mask plane (the causal
 * one, as HF builds it), whose every tile runs the scalar mask pass and,
 * hiding keys, checks its values for NaN / Inf. At each T every kernel on
 * every thread count is timed in one set of rounds (bench_measure_sides). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "kernels.h"
#include "report.h"
#include "tiles.h"

#define KV_HEADS 8
#define GROUP 4
#define HEAD_DIM 128
#define MISTRAL_WINDOW 4096

static const int64_t full_tokens[] = {512, 2048, 8192};
static const int64_t quick_tokens[] = {96, 200};
/* The other masks run up to this T (the explicit plane is T x T floats). */
#define MASK_CASES_MAX_TOKENS 2048
/* Keys of the window those cases take: a quarter of T = 1024, an eighth of 2048. */
#define MASK_CASES_WINDOW 256
/* SDPA's work grows as T^2 with no skipping; past this it runs on all cores only, fewer times. */
#define SDPA_LONG_TOKENS 8192

struct attention_run {
    const sneppx_kernel *kernel;
    int threads;
    struct bench_attention_operands ops;
};

static int run_attention(void *opaque)
{
    const struct attention_run *run = opaque;
    bench_attention_tiles(run->kernel, run->threads, &run->ops);
    return 0;
}

/* Query/key pairs a causal mask with a window of `window` keys (0 = none) keeps. */
static double kept_pairs(int64_t seq_len, int64_t window)
{
    double pairs = 0;
    for (int64_t i = 0; i < seq_len; i++)
        pairs += (double)(window > 0 && i + 1 > window ? window : i + 1);
    return pairs;
}

static int resolve_mode(struct bench_context *ctx, const char *family, int64_t window, int64_t mask_mode,
                        const sneppx_kernel **kernel)
{
    const int64_t values[] = {HEAD_DIM, HEAD_DIM, GROUP, window, mask_mode};
    if (sneppx_kernel_resolve(family, values, ctx->target, kernel) == SNEPPX_OK)
        return 0;
    fprintf(stderr, "sneppx-bench: %s: %s\n", family, sneppx_last_error());
    ctx->failures++;
    return -1;
}

static int resolve(struct bench_context *ctx, const char *family, int64_t window, const sneppx_kernel **kernel)
{
    return resolve_mode(ctx, family, window, SNEPPX_MASK_CAUSAL, kernel);
}

static struct bench_result attention_result(const struct bench_context *ctx, const char *impl, int64_t tokens,
                                            int threads, int64_t window)
{
    struct bench_result result = {.stage = "attention", .tokens = tokens, .threads = threads,
                                  .unit = BENCH_UNIT_FLOPS};
    snprintf(result.impl, sizeof result.impl, "%s", impl);
    if (window)
        snprintf(result.case_name, sizeof result.case_name, "causal d%d g%d w%lld", HEAD_DIM, GROUP,
                 (long long)window);
    else
        snprintf(result.case_name, sizeof result.case_name, "causal d%d g%d", HEAD_DIM, GROUP);
    /* QK^T and PV: 2 * (d + dv) flops per kept pair and query head. */
    result.work = 2.0 * (2 * HEAD_DIM) * (KV_HEADS * GROUP) * kept_pairs(tokens, window);
    result.peak_rate = bench_fma_peak(ctx, threads);
    return result;
}

/* What runs at one T and thread count: the causal flash kernel, SDPA beside it,
 * and up to MASK_CASES_MAX_TOKENS the flash kernels of a window that cuts keys
 * and of an explicit mask plane; at the longest T, on all cores, also the
 * mistral window against none (LONG_WINDOW, one side more). */
enum attention_side { SIDE_FLASH, SIDE_SDPA, SIDE_WINDOW, SIDE_EXPLICIT, SIDE_LONG_WINDOW, SIDES_PER_COUNT };
_Static_assert(BENCH_MAX_THREAD_COUNTS * SIDES_PER_COUNT <= BENCH_MAX_SIDES,
               "every thread count's sides at one T in one set of rounds");

/* Operands of the longest T, shared by every measurement (shorter T use their first
 * rows), and an output per thread count and side, so that each is checked. */
struct attention_buffers {
    float *q, *k, *v, *scratch;
    int64_t scratch_floats;
    float *o[BENCH_MAX_THREAD_COUNTS][SIDES_PER_COUNT];
    float *mask;        /* [mask_tokens, mask_tokens]: 0 where causal attention sees a key, else finfo.min */
    int64_t mask_tokens;
};

/* The kernels the stage resolved, one per side. */
struct attention_kernels {
    const sneppx_kernel *side[SIDES_PER_COUNT];
    int64_t window[SIDES_PER_COUNT]; /* the keys each kernel's window keeps, 0 = none */
};

static struct attention_run new_run(const sneppx_kernel *kernel, int threads, int64_t tokens,
                                    const struct attention_buffers *b, float *o)
{
    return (struct attention_run){.kernel = kernel, .threads = threads,
                                  .ops = {.q = b->q, .k = b->k, .v = b->v, .o = o, .seq_len = tokens,
                                          .kv_heads = KV_HEADS, .group = GROUP, .head_dim = HEAD_DIM,
                                          .softmax_scale = 1.0f / sqrtf((float)HEAD_DIM), .scratch = b->scratch,
                                          .scratch_floats = b->scratch_floats, .mask = b->mask,
                                          .mask_stride = b->mask_tokens}};
}

/* Whether side runs at tokens on threads. SDPA's work grows as T^2 with no
 * skipping: past SDPA_LONG_TOKENS it runs on all cores only. */
static int side_runs(const struct bench_context *ctx, enum attention_side side, int64_t tokens, int threads,
                     int64_t longest, const struct attention_buffers *b)
{
    const int max_threads = ctx->thread_counts[ctx->thread_count_n - 1];
    switch (side) {
    case SIDE_FLASH: return 1;
    case SIDE_SDPA: return ctx->quick || tokens < SDPA_LONG_TOKENS || threads == max_threads;
    case SIDE_WINDOW:
    case SIDE_EXPLICIT: return tokens <= b->mask_tokens;
    case SIDE_LONG_WINDOW: return tokens == longest && threads == max_threads;
    default: return 0;
    }
}

/* A side's row: the flops its mask keeps, at its threads. */
static struct bench_result side_result(const struct bench_context *ctx, const struct attention_kernels *kernels,
                                       enum attention_side side, int64_t tokens, int threads)
{
    struct bench_result r = attention_result(ctx, side == SIDE_SDPA ? "sdpa" : "flash", tokens, threads,
                                             kernels->window[side]);
    if (side == SIDE_EXPLICIT)
        snprintf(r.case_name, sizeof r.case_name, "explicit d%d g%d", HEAD_DIM, GROUP);
    return r;
}

/* One T: every thread count's sides timed side by side in rounds, so that each
 * speedup (SDPA / flash, causal / another mask) and each scaling (1 thread / all
 * cores) is a median of ratios within rounds. slot[t][side]: the side's index
 * among the rounds' (-1: it does not run). */
static void measure_tokens(struct bench_context *ctx, const struct attention_kernels *kernels, int64_t tokens,
                           int64_t longest, const struct attention_buffers *b)
{
    struct attention_run runs[BENCH_MAX_SIDES];
    struct bench_side sides[BENCH_MAX_SIDES];
    int slot[BENCH_MAX_THREAD_COUNTS][SIDES_PER_COUNT], count = 0;
    const int long_run = !ctx->quick && tokens >= SDPA_LONG_TOKENS;
    for (int t = 0; t < ctx->thread_count_n; t++)
        for (int side = 0; side < SIDES_PER_COUNT; side++) {
            const int threads = ctx->thread_counts[t];
            slot[t][side] = -1;
            if (!side_runs(ctx, side, tokens, threads, longest, b))
                continue;
            runs[count] = new_run(kernels->side[side], threads, tokens, b, b->o[t][side]);
            /* A long SDPA run takes seconds: it runs once, in the first round, and the
             * flash sides take their three rounds or more. */
            sides[count] = (struct bench_side){.body = run_attention, .state = &runs[count],
                                               .once = side == SIDE_SDPA && long_run};
            slot[t][side] = count++;
        }
    const struct bench_plan plan = bench_plan_for(ctx, 3, 9, long_run ? 12.0 : 4.0);
    struct bench_stats seconds[BENCH_MAX_SIDES];
    struct bench_rounds rounds;
    if (bench_measure_sides(sides, count, &plan, seconds, &rounds) != 0) {
        ctx->failures++;
        return;
    }
    const int64_t floats = tokens * KV_HEADS * GROUP * HEAD_DIM;
    for (int t = 0; t < ctx->thread_count_n; t++) {
        const int threads = ctx->thread_counts[t];
        struct bench_result row[SIDES_PER_COUNT];
        struct bench_stats scaling[SIDES_PER_COUNT] = {{0}};
        for (int side = 0; side < SIDES_PER_COUNT; side++) {
            if (slot[t][side] < 0)
                continue;
            row[side] = side_result(ctx, kernels, side, tokens, threads);
            row[side].seconds = seconds[slot[t][side]];
            if (t > 0 && side != SIDE_SDPA) /* against the same kernel on 1 thread (absent: 0) */
                bench_round_ratio(&rounds, slot[0][side], slot[t][side], &scaling[side]);
            row[side].scaling = scaling[side].median;
        }
        char note[160], scaling_text[48] = "";
        struct bench_stats speedup;
        if (t > 0) {
            char text[44];
            bench_format_scaling(text, sizeof text, threads, &scaling[SIDE_FLASH]);
            snprintf(scaling_text, sizeof scaling_text, "  %s", text);
        }
        if (slot[t][SIDE_SDPA] >= 0) {
            const double error = bench_relative_error(b->o[t][SIDE_FLASH], b->o[t][SIDE_SDPA], floats);
            snprintf(note, sizeof note, "err %.1e%s%s", error, error > 1e-4 ? " MISMATCH" : "", scaling_text);
            if (error > 1e-4)
                ctx->failures++;
            bench_round_ratio(&rounds, slot[t][SIDE_SDPA], slot[t][SIDE_FLASH], &speedup);
            bench_report_rounds(&row[SIDE_FLASH], &row[SIDE_SDPA], &speedup, note);
        } else {
            snprintf(note, sizeof note, "(SDPA at this T: all cores only)%s", scaling_text);
            speedup = (struct bench_stats){0};
            bench_report_rounds(&row[SIDE_FLASH], NULL, &speedup, note);
        }
        struct bench_result causal = row[SIDE_FLASH];
        snprintf(causal.impl, sizeof causal.impl, "causal");
        causal.scaling = 0;
        if (slot[t][SIDE_WINDOW] >= 0) {
            snprintf(note, sizeof note, "window %lld: %.0f%% of the pairs", (long long)kernels->window[SIDE_WINDOW],
                     100 * row[SIDE_WINDOW].work / causal.work);
            bench_round_ratio(&rounds, slot[t][SIDE_FLASH], slot[t][SIDE_WINDOW], &speedup);
            bench_report_rounds(&row[SIDE_WINDOW], &causal, &speedup, note);
        }
        /* The explicit plane is the causal mask: the same keys kept, every tile through
         * the scalar mask pass (the causal kernel skips the tiles it hides and masks
         * only those on the diagonal), so its ratio is that pass and the hidden half
         * of the tiles; its output must equal the causal one. */
        if (slot[t][SIDE_EXPLICIT] >= 0) {
            const double error = bench_relative_error(b->o[t][SIDE_EXPLICIT], b->o[t][SIDE_FLASH], floats);
            snprintf(note, sizeof note, "causal plane; err vs causal %.1e%s", error, error > 1e-5 ? " MISMATCH" : "");
            if (error > 1e-5)
                ctx->failures++;
            bench_round_ratio(&rounds, slot[t][SIDE_FLASH], slot[t][SIDE_EXPLICIT], &speedup);
            bench_report_rounds(&row[SIDE_EXPLICIT], &causal, &speedup, note);
        }
        if (slot[t][SIDE_LONG_WINDOW] >= 0) {
            snprintf(note, sizeof note, "window %lld vs none: %.0f%% of the pairs, speedup = no-window time / window time",
                     (long long)kernels->window[SIDE_LONG_WINDOW], 100 * row[SIDE_LONG_WINDOW].work / causal.work);
            snprintf(causal.impl, sizeof causal.impl, "no-win");
            bench_round_ratio(&rounds, slot[t][SIDE_FLASH], slot[t][SIDE_LONG_WINDOW], &speedup);
            bench_report_rounds(&row[SIDE_LONG_WINDOW], &causal, &speedup, note);
        }
    }
}

void bench_stage_attention(struct bench_context *ctx)
{
    bench_report_section("attention: flash vs SDPA, causal, head_dim 128, group 4 (32 query / 8 K/V heads)",
                         "at each T every kernel and thread count timed side by side in rounds; speedup = SDPA "
                         "time / flash time, median of per-round ratios [min-max]; % = of FMA peak on the flops "
                         "the mask keeps; err = max |flash - SDPA| / max |SDPA|");
    const int64_t *tokens_list = ctx->quick ? quick_tokens : full_tokens;
    const int tokens_count = ctx->quick ? (int)(sizeof quick_tokens / sizeof quick_tokens[0])
                                        : (int)(sizeof full_tokens / sizeof full_tokens[0]);
    const int64_t max_tokens = tokens_list[tokens_count - 1];
    const int max_threads = ctx->thread_counts[ctx->thread_count_n - 1];
    /* --quick: windows shorter than its longest T, so that they still cut keys. */
    struct attention_kernels kernels = {.window = {[SIDE_WINDOW] = ctx->quick ? 32 : MASK_CASES_WINDOW,
                                                   [SIDE_LONG_WINDOW] = ctx->quick ? 64 : MISTRAL_WINDOW}};
    if (resolve(ctx, "attn_flash", 0, &kernels.side[SIDE_FLASH]) ||
        resolve(ctx, "attn_sdpa", 0, &kernels.side[SIDE_SDPA]) ||
        resolve(ctx, "attn_flash", kernels.window[SIDE_WINDOW], &kernels.side[SIDE_WINDOW]) ||
        resolve_mode(ctx, "attn_flash", 0, SNEPPX_MASK_EXPLICIT, &kernels.side[SIDE_EXPLICIT]) ||
        resolve(ctx, "attn_flash", kernels.window[SIDE_LONG_WINDOW], &kernels.side[SIDE_LONG_WINDOW]))
        return;

    const int64_t q_width = KV_HEADS * GROUP * HEAD_DIM, kv_width = KV_HEADS * HEAD_DIM;
    struct attention_buffers b = {0};
    b.scratch_floats = sneppx_attn_flash_scratch_floats(GROUP, HEAD_DIM, HEAD_DIM);
    if (sneppx_attn_sdpa_scratch_floats(GROUP, max_tokens) > b.scratch_floats)
        b.scratch_floats = sneppx_attn_sdpa_scratch_floats(GROUP, max_tokens);
    b.scratch_floats = (b.scratch_floats + 15) / 16 * 16; /* keeps every thread's slice 64-byte aligned */
    b.q = bench_alloc_floats((size_t)(max_tokens * q_width));
    b.k = bench_alloc_floats((size_t)(max_tokens * kv_width));
    b.v = bench_alloc_floats((size_t)(max_tokens * kv_width));
    b.scratch = bench_alloc_floats((size_t)(max_threads * b.scratch_floats));
    b.mask_tokens = max_tokens < MASK_CASES_MAX_TOKENS ? max_tokens : MASK_CASES_MAX_TOKENS;
    b.mask = bench_alloc_floats((size_t)(b.mask_tokens * b.mask_tokens));
    int allocated = b.q && b.k && b.v && b.scratch && b.mask;
    for (int t = 0; t < ctx->thread_count_n; t++)
        for (int side = 0; side < SIDES_PER_COUNT; side++) {
            /* Rows of the longest T the side runs at on these threads (side_runs; the list ascends). */
            int64_t rows = 0;
            for (int ti = 0; ti < tokens_count; ti++)
                if (side_runs(ctx, side, tokens_list[ti], ctx->thread_counts[t], max_tokens, &b))
                    rows = tokens_list[ti];
            if (rows > 0)
                allocated &= (b.o[t][side] = bench_alloc_floats((size_t)(rows * q_width))) != NULL;
        }
    if (allocated) {
        bench_fill_uniform(b.q, max_tokens * q_width, 21, 1.0f);
        bench_fill_uniform(b.k, max_tokens * kv_width, 22, 1.0f);
        bench_fill_uniform(b.v, max_tokens * kv_width, 23, 1.0f);
        for (int64_t i = 0; i < b.mask_tokens; i++)
            for (int64_t j = 0; j < b.mask_tokens; j++)
                b.mask[i * b.mask_tokens + j] = j <= i ? 0.0f : -3.4028234663852886e38f;
        for (int ti = 0; ti < tokens_count; ti++)
            measure_tokens(ctx, &kernels, tokens_list[ti], max_tokens, &b);
    } else {
        fprintf(stderr, "sneppx-bench: attention: out of memory\n");
        ctx->failures++;
    }
    free(b.q);
    free(b.k);
    free(b.v);
    free(b.scratch);
    free(b.mask);
    for (int t = 0; t < BENCH_MAX_THREAD_COUNTS; t++)
        for (int side = 0; side < SIDES_PER_COUNT; side++)
            free(b.o[t][side]);
}
