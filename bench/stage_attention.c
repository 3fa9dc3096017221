/* Attention: the flash kernel against the materialized SDPA kernel, causal,
 * head_dim 128, 4 query heads per K/V head (llama3-8B's 32/8 heads), and
 * mistral-7B's 4096-key sliding window at T = 8192 against no window. Up to
 * T = 2048 also the flash kernel's other masks against its causal kernel: a
 * window that cuts keys at every T, and an explicit mask plane (the causal
 * one, as HF builds it), whose every tile runs the scalar mask pass and,
 * hiding keys, checks its values for NaN / Inf. */
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

/* Operands of the longest T, shared by every measurement (shorter T use their first rows). */
struct attention_buffers {
    float *q, *k, *v, *o_flash, *o_sdpa, *scratch;
    int64_t scratch_floats;
    float *mask;        /* [mask_tokens, mask_tokens]: 0 where causal attention sees a key, else finfo.min */
    int64_t mask_tokens;
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

/* Flash against SDPA at one T and thread count; returns flash's result. */
static struct bench_result flash_vs_sdpa(struct bench_context *ctx, const sneppx_kernel *flash,
                                         const sneppx_kernel *sdpa, int64_t tokens, int threads,
                                         const struct attention_buffers *b)
{
    const int long_run = !ctx->quick && tokens >= SDPA_LONG_TOKENS;
    const int max_threads = ctx->thread_counts[ctx->thread_count_n - 1];
    struct bench_result ours = attention_result(ctx, "flash", tokens, threads, 0);
    struct bench_result theirs = attention_result(ctx, "sdpa", tokens, threads, 0);
    const struct bench_plan flash_plan = bench_plan_for(ctx, 3, 9, long_run ? 12.0 : 4.0);
    const struct bench_plan sdpa_plan = bench_plan_for(ctx, long_run ? 1 : 3, 9, 4.0);
    struct attention_run run = new_run(flash, threads, tokens, b, b->o_flash);
    bench_measure(run_attention, &run, &flash_plan, &ours.seconds);
    if (long_run && threads != max_threads) {
        bench_report_pair(&ours, NULL, "(SDPA at this T: all cores only)");
        return ours;
    }
    run = new_run(sdpa, threads, tokens, b, b->o_sdpa);
    bench_measure(run_attention, &run, &sdpa_plan, &theirs.seconds);
    const double error = bench_relative_error(b->o_flash, b->o_sdpa, tokens * KV_HEADS * GROUP * HEAD_DIM);
    char note[64];
    snprintf(note, sizeof note, "err %.1e%s", error, error > 1e-4 ? " MISMATCH" : "");
    if (error > 1e-4)
        ctx->failures++;
    bench_report_pair(&ours, &theirs, note);
    return ours;
}

/* The flash kernels of a window that cuts keys and of an explicit mask plane,
 * against the causal kernel at the same T and threads (causal, already
 * measured). The explicit plane is the causal mask: the same keys kept, every
 * tile through the scalar mask pass (the causal kernel skips the tiles it
 * hides and masks only those on the diagonal), so its ratio is that pass and
 * the hidden half of the tiles. Outputs: window against no reference; explicit
 * against the causal output, which it must equal. */
static void mask_cases(struct bench_context *ctx, const sneppx_kernel *flash_window,
                       const sneppx_kernel *flash_explicit, int64_t window, struct bench_result causal,
                       const struct attention_buffers *b)
{
    const int64_t tokens = causal.tokens;
    const struct bench_plan plan = bench_plan_for(ctx, 3, 9, 4.0);
    snprintf(causal.impl, sizeof causal.impl, "causal");

    struct bench_result windowed = attention_result(ctx, "flash", tokens, causal.threads, window);
    struct attention_run run = new_run(flash_window, causal.threads, tokens, b, b->o_sdpa);
    bench_measure(run_attention, &run, &plan, &windowed.seconds);
    char note[96];
    snprintf(note, sizeof note, "window %lld: %.0f%% of the pairs", (long long)window,
             100 * windowed.work / causal.work);
    bench_report_pair(&windowed, &causal, note);

    struct bench_result explicit_mask = attention_result(ctx, "flash", tokens, causal.threads, 0);
    snprintf(explicit_mask.case_name, sizeof explicit_mask.case_name, "explicit d%d g%d", HEAD_DIM, GROUP);
    run = new_run(flash_explicit, causal.threads, tokens, b, b->o_sdpa);
    bench_measure(run_attention, &run, &plan, &explicit_mask.seconds);
    const double error = bench_relative_error(b->o_sdpa, b->o_flash, tokens * KV_HEADS * GROUP * HEAD_DIM);
    snprintf(note, sizeof note, "causal plane; err vs causal %.1e%s", error, error > 1e-5 ? " MISMATCH" : "");
    if (error > 1e-5)
        ctx->failures++;
    bench_report_pair(&explicit_mask, &causal, note);
}

/* The same flash kernel with a window folded in, against no window (no_window, already measured). */
static void window_vs_none(struct bench_context *ctx, const sneppx_kernel *flash_window, int64_t window,
                           struct bench_result no_window, const struct attention_buffers *b)
{
    struct attention_run run = new_run(flash_window, no_window.threads, no_window.tokens, b, b->o_flash);
    struct bench_result windowed = attention_result(ctx, "flash", no_window.tokens, no_window.threads, window);
    const struct bench_plan plan = bench_plan_for(ctx, 3, 9, 12.0);
    bench_measure(run_attention, &run, &plan, &windowed.seconds);
    char note[96];
    snprintf(note, sizeof note, "window %lld vs none: %.0f%% of the pairs, speedup = no-window time / window time",
             (long long)window, 100 * windowed.work / no_window.work);
    snprintf(no_window.impl, sizeof no_window.impl, "no-win");
    bench_report_pair(&windowed, &no_window, note);
}

void bench_stage_attention(struct bench_context *ctx)
{
    bench_report_section("attention: flash vs SDPA, causal, head_dim 128, group 4 (32 query / 8 K/V heads)",
                         "speedup = SDPA time / flash time; % = of FMA peak on the flops the mask keeps; "
                         "err = max |flash - SDPA| / max |SDPA|");
    const int64_t *tokens_list = ctx->quick ? quick_tokens : full_tokens;
    const int tokens_count = ctx->quick ? (int)(sizeof quick_tokens / sizeof quick_tokens[0])
                                        : (int)(sizeof full_tokens / sizeof full_tokens[0]);
    const int64_t max_tokens = tokens_list[tokens_count - 1];
    const int max_threads = ctx->thread_counts[ctx->thread_count_n - 1];
    /* --quick: a window shorter than its longest T, so that the window still cuts keys. */
    const int64_t window = ctx->quick ? 64 : MISTRAL_WINDOW;
    const int64_t mask_window = ctx->quick ? 32 : MASK_CASES_WINDOW;
    const sneppx_kernel *flash, *sdpa, *flash_window, *flash_mask_window, *flash_explicit;
    if (resolve(ctx, "attn_flash", 0, &flash) || resolve(ctx, "attn_sdpa", 0, &sdpa) ||
        resolve(ctx, "attn_flash", window, &flash_window) ||
        resolve(ctx, "attn_flash", mask_window, &flash_mask_window) ||
        resolve_mode(ctx, "attn_flash", 0, SNEPPX_MASK_EXPLICIT, &flash_explicit))
        return;

    const int64_t q_width = KV_HEADS * GROUP * HEAD_DIM, kv_width = KV_HEADS * HEAD_DIM;
    struct attention_buffers b;
    b.scratch_floats = sneppx_attn_flash_scratch_floats(GROUP, HEAD_DIM, HEAD_DIM);
    if (sneppx_attn_sdpa_scratch_floats(GROUP, max_tokens) > b.scratch_floats)
        b.scratch_floats = sneppx_attn_sdpa_scratch_floats(GROUP, max_tokens);
    b.scratch_floats = (b.scratch_floats + 15) / 16 * 16; /* keeps every thread's slice 64-byte aligned */
    b.q = bench_alloc_floats((size_t)(max_tokens * q_width));
    b.k = bench_alloc_floats((size_t)(max_tokens * kv_width));
    b.v = bench_alloc_floats((size_t)(max_tokens * kv_width));
    b.o_flash = bench_alloc_floats((size_t)(max_tokens * q_width));
    b.o_sdpa = bench_alloc_floats((size_t)(max_tokens * q_width));
    b.scratch = bench_alloc_floats((size_t)(max_threads * b.scratch_floats));
    b.mask_tokens = max_tokens < MASK_CASES_MAX_TOKENS ? max_tokens : MASK_CASES_MAX_TOKENS;
    b.mask = bench_alloc_floats((size_t)(b.mask_tokens * b.mask_tokens));
    if (b.q && b.k && b.v && b.o_flash && b.o_sdpa && b.scratch && b.mask) {
        bench_fill_uniform(b.q, max_tokens * q_width, 21, 1.0f);
        bench_fill_uniform(b.k, max_tokens * kv_width, 22, 1.0f);
        bench_fill_uniform(b.v, max_tokens * kv_width, 23, 1.0f);
        for (int64_t i = 0; i < b.mask_tokens; i++)
            for (int64_t j = 0; j < b.mask_tokens; j++)
                b.mask[i * b.mask_tokens + j] = j <= i ? 0.0f : -3.4028234663852886e38f;
        struct bench_result longest = {.threads = 0};
        for (int ti = 0; ti < tokens_count; ti++)
            for (int t = 0; t < ctx->thread_count_n; t++) {
                longest = flash_vs_sdpa(ctx, flash, sdpa, tokens_list[ti], ctx->thread_counts[t], &b);
                if (tokens_list[ti] <= b.mask_tokens)
                    mask_cases(ctx, flash_mask_window, flash_explicit, mask_window, longest, &b);
            }
        window_vs_none(ctx, flash_window, window, longest, &b);
    } else {
        fprintf(stderr, "sneppx-bench: attention: out of memory\n");
        ctx->failures++;
    }
    free(b.q);
    free(b.k);
    free(b.v);
    free(b.o_flash);
    free(b.o_sdpa);
    free(b.scratch);
    free(b.mask);
}
