/* Decode attention (attn_decode) over a paged K/V cache: one query token per
 * sequence against its whole context, rated in GB/s of K/V streamed against
 * the read bandwidth probed just before and after the case. llama3-8B's shape
 * (8 K/V heads, group 4, d 128), also with an int8 cache (a float32 scale per
 * row, in the page as the KV cache keeps it); qwen2-7B's (4 K/V heads, group 7:
 * the presets' widest grouped-query group, the most rows a P.V pass); and
 * deepseek-v2-lite's absorbed MLA (one 576-float latent row per token shared
 * by K and V, 16 query heads, v 512). Batch 1 and 16, contexts 512 / 4096 /
 * 32768, pages of the KV cache's default size
 * (SNEPPX_KV_DEFAULT_PAGE_SIZE tokens) in shuffled order. A cache smaller
 * than this machine's caches would be read from them, not from memory, when
 * run after run reads it again (a 32 MiB one from a 32 MiB L3: "160% of the
 * read bandwidth"), while a model's step reads every other layer's cache and
 * weights in between; so, as the gemm stage's T = 1, runs cycle through
 * copies of the cache that add up to more than the caches hold. A batch
 * with fewer (sequence, K/V head) pairs than 2 per thread splits each
 * sequence's keys (split-KV) and merges the splits with
 * sneppx_attn_decode_merge(), inside the timed run. Beside the kernel, in the
 * same rounds, a paged read (run_paged_read) rates it against what its pages
 * let the cores read. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels.h"
#include "page_table.h"
#include "report.h"
#include "sneppx/kv_cache.h"
#include "tiles.h"

/* What sneppx_kv_cache gives a caller who does not choose. */
#define PAGE_SIZE SNEPPX_KV_DEFAULT_PAGE_SIZE
/* Cases whose cache would exceed this are left out (llama3-8B at batch 16 x 32768: 4 GiB). */
#define POOL_BUDGET_BYTES ((int64_t)3 << 29)

struct decode_shape {
    const char *name;
    int64_t kv_heads, group, head_dim, v_head_dim;
    int mla; /* one latent row per token: k = v, row stride head_dim */
    sneppx_dtype kv_type; /* float32 or int8 */
};

static const struct decode_shape shapes[] = {
    {"llama3-8B", 8, 4, 128, 128, 0, SNEPPX_DTYPE_FLOAT32},
    {"llama3-8B int8", 8, 4, 128, 128, 0, SNEPPX_DTYPE_INT8},
    {"qwen2-7B", 4, 7, 128, 128, 0, SNEPPX_DTYPE_FLOAT32},
    {"deepseek-v2-lite", 1, 16, 576, 512, 1, SNEPPX_DTYPE_FLOAT32},
};
static const int64_t full_contexts[] = {512, 4096, 32768}, quick_contexts[] = {64, 200};
static const int64_t full_batches[] = {1, BENCH_DECODE_BATCH}, quick_batches[] = {1, 2};

struct decode_run {
    const sneppx_kernel *kernel;
    const struct decode_shape *shape;
    int threads;
    int64_t batch, context, splits, pages_per_seq;
    const float *q;
    const unsigned char *pool;
    const int32_t *table; /* [copies][batch][pages_per_seq]: copy c's pages are c * batch * pages_per_seq on */
    int64_t copies, uses; /* run i reads copy i % copies */
    float *o, *split, *scratch;
    int64_t scratch_floats;
    volatile uint32_t sink; /* the paged read's sum, so that it is not dead */
};

/* A page of the shape's cache (page_table.h). */
static struct bench_page_layout page_layout(const struct decode_shape *s)
{
    return (struct bench_page_layout){.page_size = PAGE_SIZE,
                                      .kv_heads = s->kv_heads,
                                      .k_dim = s->head_dim,
                                      .v_dim = s->v_head_dim,
                                      .element_bytes = s->kv_type == SNEPPX_DTYPE_INT8 ? 1 : 4,
                                      .mla = s->mla};
}

static int64_t element_bytes(const struct decode_shape *s) { return page_layout(s).element_bytes; }

/* Bytes of K/V one run reads: every key and value row of every (sequence, K/V head)
 * once, and an int8 row's scale. */
static double kv_bytes(const struct decode_shape *s, int64_t batch, int64_t context)
{
    const int64_t row = s->mla ? s->head_dim : s->head_dim + s->v_head_dim;
    const int64_t scales = s->kv_type == SNEPPX_DTYPE_INT8 ? 2 * (int64_t)sizeof(float) : 0;
    return (double)(batch * s->kv_heads * context * (row * element_bytes(s) + scales));
}

/* A copy's bytes: the pages of `batch` sequences of `context` tokens. */
static int64_t pool_bytes(const struct decode_shape *s, int64_t batch, int64_t context)
{
    const struct bench_page_layout layout = page_layout(s);
    return batch * ((context + PAGE_SIZE - 1) / PAGE_SIZE) * bench_page_bytes(&layout);
}

/* The kernel arguments of one task of a run: (sequence b, K/V head h, split sp) as
 * task = (b * kv_heads + h) * splits + sp, reading the page table `table`. */
static struct sneppx_args task_args(const struct decode_run *run, const int32_t *table, int64_t task)
{
    const struct decode_shape *s = run->shape;
    const int64_t heads = s->kv_heads * s->group, splits = run->splits;
    const int64_t split_floats = sneppx_attn_decode_split_floats(splits, 1, s->group, s->v_head_dim);
    const int64_t sp = task % splits, h = task / splits % s->kv_heads, b = task / splits / s->kv_heads;
    struct sneppx_args args = bench_new_args();
    args.row_begin = 0;
    args.row_end = 1;
    args.q = run->q + (b * heads + h * s->group) * s->head_dim;
    args.q_stride = heads * s->head_dim;
    const struct bench_page_layout layout = page_layout(s);
    bench_page_head_args(&layout, run->pool, h, &args);
    args.q_len = 1;
    args.kv_len = run->context;
    args.softmax_scale = 1.0f / sqrtf((float)s->head_dim);
    args.pages = table + b * run->pages_per_seq;
    args.kv_begin = run->context * sp / splits;
    args.kv_end = run->context * (sp + 1) / splits;
    float *o = run->o + (b * heads + h * s->group) * s->v_head_dim;
    if (splits == 1) {
        args.o = o;
        args.o_stride = heads * s->v_head_dim;
    } else {
        float *split = run->split + (b * s->kv_heads + h) * split_floats;
        args.o = split + sp * s->group * s->v_head_dim;
        args.o_stride = s->group * s->v_head_dim;
        args.lse = split + (splits * s->v_head_dim + sp) * s->group;
    }
    return args;
}

static int run_decode(void *opaque)
{
    struct decode_run *run = opaque;
    const struct decode_shape *s = run->shape;
    const int64_t heads = s->kv_heads * s->group, splits = run->splits;
    const int64_t split_floats = sneppx_attn_decode_split_floats(splits, 1, s->group, s->v_head_dim);
    const int64_t tasks = run->batch * s->kv_heads * splits;
    const int32_t *table = run->table + run->uses++ % run->copies * run->batch * run->pages_per_seq;
#pragma omp parallel for schedule(static) num_threads(run->threads)
    for (int64_t task = 0; task < tasks; task++) {
        struct sneppx_args args = task_args(run, table, task);
        args.scratch = run->scratch + omp_get_thread_num() * run->scratch_floats;
        run->kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
    if (splits > 1) {
#pragma omp parallel for schedule(static) num_threads(run->threads)
        for (int64_t pair = 0; pair < run->batch * s->kv_heads; pair++) {
            const int64_t h = pair % s->kv_heads, b = pair / s->kv_heads;
            sneppx_attn_decode_merge(run->split + pair * split_floats, splits, 1, s->group, s->v_head_dim,
                                     run->o + (b * heads + h * s->group) * s->v_head_dim, heads * s->v_head_dim,
                                     NULL);
        }
    }
    return 0;
}

/* Integer lanes: a sum of any bytes, in a cycle each. */
typedef uint32_t read_vector __attribute__((vector_size(32)));
typedef uint32_t read_vector_mem __attribute__((vector_size(32), aligned(1), may_alias));

/* The sum of `bytes` bytes (a multiple of 64) of each of the rows, as 32-bit words,
 * prefetching the same bytes of the first `ahead` rows of `next` into L2 with each row,
 * as the kernel does. */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2")))
#endif
static uint32_t sum_rows(const unsigned char *const *rows, int64_t n, int64_t bytes,
                         const unsigned char *const *next, int64_t ahead)
{
    read_vector s0 = {0}, s1 = {0};
    for (int64_t j = 0; j < n; j++) {
        if (j < ahead)
            for (int64_t b = 0; b < bytes; b += 64)
                __builtin_prefetch(next[j] + b, 0, 2);
        for (int64_t b = 0; b < bytes; b += 64) {
            s0 += *(const read_vector_mem *)(rows[j] + b);
            s1 += *(const read_vector_mem *)(rows[j] + b + 32);
        }
    }
    const read_vector total = s0 + s1;
    uint32_t sum = 0;
    for (int lane = 0; lane < 8; lane++)
        sum += total[lane];
    return sum;
}

/* The key and value rows of keys [j0, j0 + keys) of a task, from its page table; with
 * int8 rows, the sum of their scales' bits (read as the kernel reads them, one a row). */
static uint32_t tile_rows(const struct sneppx_args *args, int64_t eb, int64_t j0, int64_t keys,
                          const unsigned char **kp, const unsigned char **vp)
{
    uint32_t scales = 0;
    for (int64_t jj = 0; jj < keys; jj++) {
        const int64_t j = j0 + jj, page = args->pages[j / args->page_size] * args->page_stride;
        const int64_t slot = j % args->page_size;
        kp[jj] = (const unsigned char *)args->k + (page + slot * args->k_stride) * eb;
        vp[jj] = (const unsigned char *)args->v + (page + slot * args->v_stride) * eb;
        if (args->k_scale) {
            uint32_t k, v;
            memcpy(&k, args->k_scale + page / 4 + slot, sizeof k);
            memcpy(&v, args->v_scale + page / 4 + slot, sizeof v);
            scales += k + v;
        }
    }
    return scales;
}

/* A paged read: every row a run of the kernel reads, in the kernel's order (a tile
 * of SNEPPX_ATTN_BLOCK_KV keys' rows, then their values) and with its software
 * prefetch (the next tile's rows into L2), summed; nothing else computed. What the
 * kernel's access pattern lets the cores read, beside the read probe's one long
 * stream per thread. */
static int run_paged_read(void *opaque)
{
    struct decode_run *run = opaque;
    const struct decode_shape *s = run->shape;
    const int64_t tasks = run->batch * s->kv_heads * run->splits;
    const int32_t *table = run->table + run->uses++ % run->copies * run->batch * run->pages_per_seq;
    const int64_t eb = element_bytes(s);
    uint32_t total = 0;
#pragma omp parallel for schedule(static) num_threads(run->threads) reduction(+ : total)
    for (int64_t task = 0; task < tasks; task++) {
        const struct sneppx_args args = task_args(run, table, task);
        const unsigned char *kp[2][SNEPPX_ATTN_BLOCK_KV], *vp[2][SNEPPX_ATTN_BLOCK_KV];
        int tile = 0;
        const int64_t first = args.kv_end - args.kv_begin;
        total += tile_rows(&args, eb, args.kv_begin, first < SNEPPX_ATTN_BLOCK_KV ? first : SNEPPX_ATTN_BLOCK_KV,
                           kp[0], vp[0]);
        for (int64_t j0 = args.kv_begin; j0 < args.kv_end; j0 += SNEPPX_ATTN_BLOCK_KV, tile ^= 1) {
            const int64_t keys = args.kv_end - j0 < SNEPPX_ATTN_BLOCK_KV ? args.kv_end - j0 : SNEPPX_ATTN_BLOCK_KV;
            const int64_t rest = args.kv_end - j0 - keys;
            const int64_t next = rest < SNEPPX_ATTN_BLOCK_KV ? rest : SNEPPX_ATTN_BLOCK_KV;
            total += tile_rows(&args, eb, j0 + keys, next, kp[tile ^ 1], vp[tile ^ 1]);
            total += sum_rows(kp[tile], keys, s->head_dim * eb, kp[tile ^ 1], next);
            if (!s->mla) /* MLA's values are the keys' first floats: read with them */
                total += sum_rows(vp[tile], keys, s->v_head_dim * eb, vp[tile ^ 1], next);
        }
    }
    run->sink = total;
    return 0;
}

/* Splits per sequence so that every thread has at least 2 tasks, each of at least 256 keys. */
static int64_t splits_for(const struct decode_shape *s, int64_t batch, int64_t context, int threads)
{
    int64_t splits = 1;
    while (batch * s->kv_heads * splits < 2 * threads && context / (2 * splits) >= 256)
        splits *= 2;
    return splits;
}

static void measure(struct bench_context *ctx, const struct decode_shape *s,
                    int64_t batch, int64_t context, int threads, struct decode_run *run)
{
    run->threads = threads;
    run->splits = splits_for(s, batch, context, threads);
    struct bench_result result = {.stage = "decode", .tokens = context, .threads = threads,
                                  .unit = BENCH_UNIT_BYTES};
    snprintf(result.impl, sizeof result.impl, "decode");
    snprintf(result.case_name, sizeof result.case_name, "%s b%lld", s->name, (long long)batch);
    result.work = kv_bytes(s, batch, context);
    const double before = bench_read_bandwidth_beside(ctx, threads);
    const struct bench_plan plan = bench_plan_for(ctx, 5, 41, 1.5);
    enum { SIDE_KERNEL, SIDE_PAGED_READ, SIDES };
    const struct bench_side sides[SIDES] = {{.body = run_decode, .state = run}, {.body = run_paged_read, .state = run}};
    struct bench_stats seconds[SIDES];
    struct bench_rounds rounds;
    if (bench_measure_sides(sides, SIDES, &plan, seconds, &rounds) != 0) {
        ctx->failures++;
        return;
    }
    const double after = bench_read_bandwidth_beside(ctx, threads);
    result.seconds = seconds[SIDE_KERNEL];
    result.peak_rate = before > after ? before : after;
    struct bench_result paged = result;
    snprintf(paged.impl, sizeof paged.impl, "paged-read");
    paged.seconds = seconds[SIDE_PAGED_READ];
    struct bench_stats of_paged;
    bench_round_ratio(&rounds, SIDE_PAGED_READ, SIDE_KERNEL, &of_paged);
    /* Q.K and P.V: 2 * (d + dv) flops per key and query head. */
    const double flops = 2.0 * (double)(s->head_dim + s->v_head_dim) * (double)(batch * s->kv_heads * s->group) *
                         (double)context;
    const double fma_peak = bench_fma_peak(ctx, threads);
    char note[96];
    snprintf(note, sizeof note, "split %lld, %.0f GFLOP/s (%.0f%% of FMA peak)", (long long)run->splits,
             flops / result.seconds.median * 1e-9,
             fma_peak > 0 ? 100 * flops / result.seconds.median * 1e-9 / fma_peak : 0.0);
    bench_report_rounds(&result, &paged, &of_paged, note);
}

static void bench_shape(struct bench_context *ctx, const struct decode_shape *s)
{
    const int64_t values[] = {s->head_dim, s->v_head_dim, s->group, 0, SNEPPX_MASK_CAUSAL, s->kv_type};
    const sneppx_kernel *kernel;
    if (sneppx_kernel_resolve("attn_decode", values, ctx->target, &kernel) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: attn_decode %s: %s\n", s->name, sneppx_last_error());
        ctx->failures++;
        return;
    }
    const int64_t *contexts = ctx->quick ? quick_contexts : full_contexts;
    const int64_t *batches = ctx->quick ? quick_batches : full_batches;
    const int counts = 2 + !ctx->quick;
    const int max_threads = ctx->thread_counts[ctx->thread_count_n - 1];
    for (int bi = 0; bi < 2; bi++)
        for (int ci = 0; ci < counts; ci++) {
            const int64_t batch = batches[bi], context = ci < 3 ? contexts[ci] : 0;
            struct decode_run run = {.kernel = kernel, .shape = s, .batch = batch, .context = context};
            const int64_t copy_bytes = pool_bytes(s, batch, context);
            if (copy_bytes > POOL_BUDGET_BYTES) {
                printf("  %-30s %6lld | left out: its cache is %.1f GiB (> %.1f)\n", s->name, (long long)context,
                       copy_bytes / (double)(1 << 30), POOL_BUDGET_BYTES / (double)(1 << 30));
                continue;
            }
            run.copies = bench_rotation_copies(ctx, (double)copy_bytes, INT_MAX);
            const int64_t floats = run.copies * copy_bytes / 4;
            const int64_t heads = s->kv_heads * s->group;
            run.pages_per_seq = (context + PAGE_SIZE - 1) / PAGE_SIZE;
            run.scratch_floats = (sneppx_attn_decode_scratch_floats(1, s->group, s->head_dim, s->v_head_dim) + 15) /
                                 16 * 16;
            const int64_t max_splits = splits_for(s, batch, context, max_threads);
            float *pool = bench_alloc_floats((size_t)floats);
            float *q = bench_alloc_floats((size_t)(batch * heads * s->head_dim));
            float *o = bench_alloc_floats((size_t)(batch * heads * s->v_head_dim));
            float *split = bench_alloc_floats((size_t)(batch * s->kv_heads *
                                                       sneppx_attn_decode_split_floats(max_splits, 1, s->group,
                                                                                       s->v_head_dim)));
            float *scratch = bench_alloc_floats((size_t)(max_threads * run.scratch_floats));
            int32_t *table = malloc((size_t)(run.copies * batch * run.pages_per_seq) * sizeof(int32_t));
            if (pool && q && o && split && scratch && table) {
                bench_fill_uniform(pool, floats, 31, 1.0f);
                const struct bench_page_layout layout = page_layout(s);
                const int64_t page_bytes = bench_page_bytes(&layout), scale_bytes = bench_page_scale_bytes(&layout);
                /* int8 rows: the floats' bytes, any int8; their scales 1/127 */
                for (int64_t page = 0; scale_bytes > 0 && page < floats * 4 / page_bytes; page++) {
                    float *scales = (float *)(void *)((unsigned char *)pool + (page + 1) * page_bytes - scale_bytes);
                    for (int64_t i = 0; i < scale_bytes / (int64_t)sizeof(float); i++)
                        scales[i] = 1.0f / 127;
                }
                bench_fill_uniform(q, batch * heads * s->head_dim, 32, 1.0f);
                bench_shuffled_pages(table, batch * run.pages_per_seq, run.copies);
                run.pool = (const unsigned char *)pool;
                run.q = q;
                run.o = o;
                run.split = split;
                run.scratch = scratch;
                run.table = table;
                for (int t = 0; t < ctx->thread_count_n; t++)
                    measure(ctx, s, batch, context, ctx->thread_counts[t], &run);
            } else {
                fprintf(stderr, "sneppx-bench: decode: out of memory\n");
                ctx->failures++;
            }
            free(pool);
            free(q);
            free(o);
            free(split);
            free(scratch);
            free(table);
        }
}

void bench_stage_decode(struct bench_context *ctx)
{
    char title[96];
    snprintf(title, sizeof title, "decode attention: one token against a paged K/V cache (pages of %d, shuffled)",
             PAGE_SIZE);
    bench_report_section(title,
                         "GB/s of K/V read (every key and value once; MLA's latent row once for both); "
                         "% = of the read bandwidth probed just before and after each case (best of both); "
                         "paged-read: the same rows, order and prefetch summed with nothing computed, in the same "
                         "rounds (x = its time / the kernel's: the fraction of what the pages let the cores read); "
                         "split = key ranges per sequence, merged");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        bench_shape(ctx, &shapes[i]);
}
