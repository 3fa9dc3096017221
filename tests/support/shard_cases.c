/* The tensor-parallel cases (shard_cases.h). Every output of a shard is checked
 * against the whole layer that each rank also makes, on the same weights and
 * inputs: max |shard - whole| / max |whole| at most 1e-6 on every rank.
 * The shards compute q, k, v and attention exactly as the whole layer does (the
 * same sums in the same order); they differ only in how the O projection's sum
 * over K = heads x v_head_dim is grouped: each rank sums its K / world and the
 * ranks' sums are added. The GEMM sums each k slice of gemm_kc from zero and adds
 * it to C at the slice's end (templates/gemm.c.j2), so where the ranks' ranges
 * start at slice boundaries the two groupings differ only in how the slices'
 * sums are added: measured 7e-8 at llama3-8B (K = 4096, 2 and 4 ranks), where
 * continuing C's chain through the slices measured 2.6e-6. Ranges that cut a
 * slice (qwen2-0.5B's 448 of 896) measured 7.2e-7; the small configs 6.1e-7. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_cases.h"

#define MAX_ERROR 1e-6
#define SENTINEL 12345.0f /* in out before a call that must not write it */

struct run {
    const shard_env *env;
    int failures;
    const char *name; /* the case, for messages */
};

static int check(struct run *run, int ok, const char *format, ...) __attribute__((format(printf, 3, 4)));
static int check(struct run *run, int ok, const char *format, ...)
{
    if (ok)
        return 1;
    run->failures++;
    char text[1024];
    va_list ap;
    va_start(ap, format);
    vsnprintf(text, sizeof text, format, ap);
    va_end(ap);
    fprintf(stderr, "rank %d/%d: FAIL %s: %s\n", run->env->rank, run->env->world, run->name, text);
    return 0;
}

/* The rule shard.h states, written again: world divides the query heads and
 * divides or is a multiple of the K/V heads (MLA: the query heads). */
static int splits(const sneppx_config *config, int world)
{
    const int64_t heads = config->num_attention_heads;
    const int64_t kv = config->kv_lora_rank > 0 ? heads : config->num_key_value_heads;
    return heads % world == 0 && (kv % world == 0 || world % kv == 0);
}

static float *uniform(int64_t n, uint64_t seed, float amplitude)
{
    float *x = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int64_t i = 0; x && i < n; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = amplitude * ((float)(state >> 40) / 8388608.0f - 1.0f);
    }
    return x;
}

static float *filled(int64_t n, float value)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; x && i < n; i++)
        x[i] = value;
    return x;
}

static double normalized_error(const float *got, const float *want, int64_t n)
{
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)want[i]);
        worst = d > worst || d != d ? d : worst;
        scale = fabs((double)want[i]) > scale ? fabs((double)want[i]) : scale;
    }
    return scale > 0 ? worst / scale : worst;
}

static int untouched(const float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (out[i] != SENTINEL)
            return 0;
    return 1;
}

static int contains(const char *text, const char *needle) { return strstr(text, needle) != NULL; }

/* ---- configs ---------------------------------------------------------------- */

static sneppx_config gqa(const char *name, int64_t hidden, int64_t heads, int64_t kv, int64_t head_dim)
{
    sneppx_config c;
    sneppx_config_init(&c);
    snprintf(c.name, sizeof c.name, "%s", name);
    c.hidden_size = hidden;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    c.head_dim = head_dim;
    c.max_position_embeddings = 512;
    c.num_threads = 1;
    return c;
}

static sneppx_config mla(const char *name, int64_t heads, int64_t q_lora, int naive)
{
    sneppx_config c;
    sneppx_config_init(&c);
    snprintf(c.name, sizeof c.name, "%s", name);
    c.hidden_size = 128;
    c.num_attention_heads = c.num_key_value_heads = heads;
    c.q_lora_rank = q_lora;
    c.kv_lora_rank = 64;
    c.qk_nope_head_dim = 32;
    c.qk_rope_head_dim = 16;
    c.v_head_dim = 32;
    c.rope_interleaved = 1;
    c.mla_naive = naive;
    c.max_position_embeddings = 512;
    c.num_threads = 1;
    return c;
}

/* The small configs: together they split at 1, 2, 3, 4 and refuse at some of them. */
static int small_configs(sneppx_config *out)
{
    int n = 0;
    /* GQA 8 / 2, q/k/v and o biases: splits at 1, 2, 4 (K/V replicated), 8. */
    out[n++] = gqa("gqa8x2-bias", 128, 8, 2, 32);
    /* 12 / 3 with a sliding window of 6: splits at 1, 3, 6, 12 (not 2 or 4). */
    out[n] = gqa("gqa12x3-window", 192, 12, 3, 16);
    out[n].sliding_window = 6;
    out[n].qkv_bias = out[n].o_bias = 0;
    n++;
    /* MQA 6 / 1, partial rotary, Qwen's biases (q/k/v, no o): splits at 1, 2, 3, 6. */
    out[n] = gqa("mqa6x1-partial", 96, 6, 1, 32);
    out[n].rotary_dim = 16;
    out[n].o_bias = 0;
    n++;
    /* MLA: 4 heads, no q LoRA, absorbed (1, 2, 4); 6 heads, q LoRA, biases, naive (1, 2, 3, 6). */
    out[n++] = mla("mla4", 4, 0, 0);
    out[n] = mla("mla6-qlora-naive", 6, 48, 1);
    out[n].qkv_bias = out[n].o_bias = 1;
    n++;
    out[n++] = mla("mla6-qlora", 6, 48, 0);
    return n;
}

/* ---- one config ------------------------------------------------------------- */

static sneppx_status create_shard(struct run *run, const sneppx_config *config, const sneppx_weights *weights,
                                  sneppx_layer **layer)
{
    sneppx_shard shard;
    if (run->env->make_shard(run->env->context, &shard) != 0) {
        check(run, 0, "make_shard failed");
        *layer = NULL;
        return SNEPPX_ERR_COMM;
    }
    return sneppx_layer_create_shard(config, weights, &shard, layer);
}

/* The causal forward, a masked one with offset positions, and (unless naive MLA)
 * prefill and decode steps through a KV cache, against the whole layer. */
static void compare_layers(struct run *run, sneppx_layer *whole, sneppx_layer *shard, const sneppx_config *config,
                           int64_t batch, int64_t seq, int masked, int cached)
{
    const int64_t hidden = config->hidden_size, n = batch * seq * hidden;
    float *x = uniform(n, 7, 1.0f), *want = filled(n, 0), *got = filled(n, 0);
    sneppx_status ws = sneppx_layer_forward(whole, batch, seq, x, NULL, NULL, NULL, want);
    sneppx_status gs = sneppx_layer_forward(shard, batch, seq, x, NULL, NULL, NULL, got);
    double error = normalized_error(got, want, n);
    check(run, ws == SNEPPX_OK && gs == SNEPPX_OK && error <= MAX_ERROR,
          "forward %lld x %lld: %s / %s (%s), error %.3g (at most %.3g)", (long long)batch, (long long)seq,
          sneppx_status_name(ws), sneppx_status_name(gs), sneppx_last_error(), error, MAX_ERROR);

    /* One token: the projections' single-row sweep (a decode step's). */
    ws = sneppx_layer_forward(whole, 1, 1, x, NULL, NULL, NULL, want);
    gs = sneppx_layer_forward(shard, 1, 1, x, NULL, NULL, NULL, got);
    error = normalized_error(got, want, hidden);
    check(run, ws == SNEPPX_OK && gs == SNEPPX_OK && error <= MAX_ERROR, "forward of one token: %s / %s (%s), error %.3g",
          sneppx_status_name(ws), sneppx_status_name(gs), sneppx_last_error(), error);

    /* 200 tokens: the O projection's sums in several chunks (forward.c's SUM_CHUNK_MIN_ROWS). */
    const int64_t long_n = 200 * hidden;
    float *long_x = uniform(long_n, 11, 1.0f), *long_want = filled(long_n, 0), *long_got = filled(long_n, 0);
    ws = sneppx_layer_forward(whole, 1, 200, long_x, NULL, NULL, NULL, long_want);
    gs = sneppx_layer_forward(shard, 1, 200, long_x, NULL, NULL, NULL, long_got);
    error = normalized_error(long_got, long_want, long_n);
    check(run, ws == SNEPPX_OK && gs == SNEPPX_OK && error <= MAX_ERROR,
          "forward of 200 tokens: %s / %s (%s), error %.3g (at most %.3g)", sneppx_status_name(ws),
          sneppx_status_name(gs), sneppx_last_error(), error, MAX_ERROR);
    free(long_x), free(long_want), free(long_got);

    if (masked) {
        /* Causal with every third key hidden too; positions from 5. */
        float *mask = filled(batch * seq * seq, 0);
        int64_t *positions = malloc(sizeof(int64_t) * (size_t)(batch * seq));
        for (int64_t b = 0; b < batch; b++)
            for (int64_t i = 0; i < seq; i++) {
                positions[b * seq + i] = 5 + i;
                for (int64_t j = 0; j < seq; j++)
                    mask[(b * seq + i) * seq + j] = j > i || (j % 3 == 1 && j != i) ? -INFINITY : 0.0f;
            }
        const int64_t shape[4] = {batch, 1, seq, seq};
        ws = sneppx_layer_forward(whole, batch, seq, x, mask, shape, positions, want);
        gs = sneppx_layer_forward(shard, batch, seq, x, mask, shape, positions, got);
        error = normalized_error(got, want, n);
        check(run, ws == SNEPPX_OK && gs == SNEPPX_OK && error <= MAX_ERROR,
              "masked forward: %s / %s (%s), error %.3g (at most %.3g)", sneppx_status_name(ws), sneppx_status_name(gs),
              sneppx_last_error(), error, MAX_ERROR);
        free(mask);
        free(positions);
    }

    if (cached) {
        /* Each its own cache: the shard's holds its K/V heads (made from its config). */
        sneppx_kv_cache_options options;
        sneppx_kv_cache_options_init(&options);
        options.capacity_tokens = 64;
        options.page_size = 4;
        sneppx_kv_cache *whole_cache = NULL, *shard_cache = NULL;
        sneppx_status s1 = sneppx_kv_cache_create(config, &options, &whole_cache);
        sneppx_status s2 = sneppx_kv_cache_create(sneppx_layer_config(shard), &options, &shard_cache);
        int64_t whole_ids[2], shard_ids[2];
        for (int i = 0; i < 2 && s1 == SNEPPX_OK && s2 == SNEPPX_OK; i++) {
            s1 = sneppx_kv_cache_add_sequence(whole_cache, &whole_ids[i]);
            s2 = sneppx_kv_cache_add_sequence(shard_cache, &shard_ids[i]);
        }
        if (check(run, s1 == SNEPPX_OK && s2 == SNEPPX_OK, "caches: %s", sneppx_last_error())) {
            /* A ragged prefill of 5 and 3 tokens, then three decode steps of both. */
            int64_t q_lens[2] = {5, 3};
            for (int step = 0; step < 4; step++) {
                const int64_t tokens = q_lens[0] + q_lens[1];
                float *cx = uniform(tokens * hidden, 100 + (uint64_t)step, 1.0f);
                float *cw = filled(tokens * hidden, 0), *cg = filled(tokens * hidden, 0);
                ws = sneppx_layer_forward_cached(whole, whole_cache, 0, 2, whole_ids, q_lens, cx, NULL, NULL, cw);
                gs = sneppx_layer_forward_cached(shard, shard_cache, 0, 2, shard_ids, q_lens, cx, NULL, NULL, cg);
                error = normalized_error(cg, cw, tokens * hidden);
                check(run, ws == SNEPPX_OK && gs == SNEPPX_OK && error <= MAX_ERROR,
                      "cached step %d (%lld + %lld tokens): %s / %s (%s), error %.3g (at most %.3g)", step,
                      (long long)q_lens[0], (long long)q_lens[1], sneppx_status_name(ws), sneppx_status_name(gs),
                      sneppx_last_error(), error, MAX_ERROR);
                free(cx), free(cw), free(cg);
                q_lens[0] = q_lens[1] = 1;
            }
        }
        sneppx_kv_cache_destroy(whole_cache);
        sneppx_kv_cache_destroy(shard_cache);
    }
    free(x), free(want), free(got);
}

static void check_info(struct run *run, const sneppx_layer *shard, const sneppx_config *config)
{
    const int world = run->env->world, rank = run->env->rank;
    const int64_t heads = config->num_attention_heads;
    const int64_t kv = config->kv_lora_rank > 0 ? heads : config->num_key_value_heads;
    const int64_t kv_heads = kv % world == 0 ? kv / world : 1;
    const int64_t kv_begin = kv % world == 0 ? rank * kv_heads : rank / (world / kv);
    sneppx_shard_info info;
    const sneppx_status status = sneppx_layer_shard_info(shard, &info);
    check(run,
          status == SNEPPX_OK && info.rank == rank && info.world == world && info.q_heads == heads / world &&
              info.q_head_begin == rank * (heads / world) && info.kv_heads == kv_heads &&
              info.kv_head_begin == kv_begin,
          "shard info: rank %d of %d, q [%lld +%lld), kv [%lld +%lld); want q [%lld +%lld), kv [%lld +%lld)",
          info.rank, info.world, (long long)info.q_head_begin, (long long)info.q_heads,
          (long long)info.kv_head_begin, (long long)info.kv_heads, (long long)(rank * (heads / world)),
          (long long)(heads / world), (long long)kv_begin, (long long)kv_heads);
    const sneppx_config *own = sneppx_layer_config(shard);
    check(run, own->num_attention_heads == heads / world && own->o_bias == (rank == 0 ? config->o_bias : 0),
          "the shard's config: %lld heads, o_bias %d", (long long)own->num_attention_heads, own->o_bias);
}

/* One config on this rank: refused when world does not split it, else every
 * output against the whole layer. */
static void run_config(struct run *run, const sneppx_config *config, int64_t batch, int64_t seq, int masked)
{
    run->name = config->name;
    sneppx_layer *shard = NULL, *whole = NULL;
    const sneppx_status status = create_shard(run, config, NULL, &shard);
    if (!splits(config, run->env->world)) {
        char want[64];
        snprintf(want, sizeof want, "world: %d ranks cannot split", run->env->world);
        check(run, status == SNEPPX_ERR_INVALID_ARGUMENT && !shard && contains(sneppx_last_error(), want),
              "world %d must be refused naming it: %s '%s'", run->env->world, sneppx_status_name(status),
              sneppx_last_error());
        check(run, contains(sneppx_last_error(), "world sizes that can: 1, "), "the sizes that can: '%s'",
              sneppx_last_error());
        return;
    }
    if (!check(run, status == SNEPPX_OK, "create: %s '%s'", sneppx_status_name(status), sneppx_last_error()))
        return;
    check_info(run, shard, config);
    if (check(run, sneppx_layer_create(config, NULL, &whole) == SNEPPX_OK, "whole layer: %s", sneppx_last_error()))
        compare_layers(run, whole, shard, config, batch, seq, masked, !config->mla_naive);
    sneppx_layer_destroy(whole);
    sneppx_layer_destroy(shard);
}

/* ---- failures --------------------------------------------------------------- */

/* message must hold want on the rank that refused and "rank R of W: " + want on the others. */
static void check_refusal(struct run *run, const char *what, sneppx_status status, sneppx_status want_status,
                          int refusing, const char *want)
{
    char prefix[64] = "";
    if (run->env->rank != refusing)
        snprintf(prefix, sizeof prefix, "rank %d of %d: ", refusing, run->env->world);
    const char *message = sneppx_last_error();
    check(run, status == want_status && strncmp(message, prefix, strlen(prefix)) == 0 && contains(message, want),
          "%s: %s '%s', want %s '%s...%s...'", what, sneppx_status_name(status), message,
          sneppx_status_name(want_status), prefix, want);
}

/* Every rank checks the same message (a mismatch all ranks see alike). */
static void check_all(struct run *run, const char *what, sneppx_status status, const char *want)
{
    check(run, status == SNEPPX_ERR_INVALID_ARGUMENT && contains(sneppx_last_error(), want), "%s: %s '%s', want '%s'",
          what, sneppx_status_name(status), sneppx_last_error(), want);
}

static void create_failures(struct run *run, const sneppx_config *config)
{
    const int last = run->env->world - 1, rank = run->env->rank;
    char want[256];
    sneppx_layer *layer = NULL;
    run->name = "another config on one rank";
    sneppx_config other = *config;
    if (rank == last)
        other.rope_theta = 20000.0;
    snprintf(want, sizeof want, "config: rank %d of %d's differs from rank 0's: rope_theta 20000 / 10000", last,
             run->env->world);
    check_all(run, "create", create_shard(run, &other, NULL, &layer), want);
    check(run, layer == NULL, "no layer");

    run->name = "num_threads and use_flash_attn are each rank's";
    other = *config;
    if (rank == last) {
        other.num_threads = 2;
        other.use_flash_attn = 0;
    }
    sneppx_status status = create_shard(run, &other, NULL, &layer);
    check(run, status == SNEPPX_OK, "create: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    sneppx_layer_destroy(layer);
    layer = NULL;

    run->name = "other weights on one rank";
    sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    sneppx_attn_tensors(config, tensors, &count);
    sneppx_weights weights;
    memset(&weights, 0, sizeof weights);
    float *storage[SNEPPX_ATTN_TENSORS_MAX] = {0};
    for (int i = 0; i < count; i++) {
        storage[i] = uniform(tensors[i].shape[0] * (tensors[i].rank == 2 ? tensors[i].shape[1] : 1), 50 + (uint64_t)i,
                             0.1f);
        *(const float **)((char *)&weights + tensors[i].weights_offset) = storage[i];
    }
    snprintf(want, sizeof want, "weights: rank %d of %d gives float32 tensors, rank 0 synthetic weights (NULL)", last,
             run->env->world);
    check_all(run, "create", create_shard(run, config, rank == last ? &weights : NULL, &layer), want);
    for (int i = 0; i < count; i++)
        free(storage[i]);

    run->name = "a NULL output pointer on one rank";
    sneppx_shard shard;
    run->env->make_shard(run->env->context, &shard);
    status = sneppx_layer_create_shard(config, NULL, &shard, rank == last ? NULL : &layer);
    check_refusal(run, "create", status, SNEPPX_ERR_INVALID_ARGUMENT, last, "layer: output pointer must not be NULL");
    check(run, layer == NULL, "no layer");

    run->name = "a NULL config on every rank";
    status = create_shard(run, NULL, NULL, &layer);
    check(run, status == SNEPPX_ERR_INVALID_ARGUMENT && contains(sneppx_last_error(), "config: must not be NULL"),
          "%s '%s'", sneppx_status_name(status), sneppx_last_error());

    run->name = "a transport without sum_wait";
    run->env->make_shard(run->env->context, &shard);
    sneppx_shard broken = shard;
    broken.transport.sum_wait = NULL;
    status = sneppx_layer_create_shard(config, NULL, &broken, &layer); /* releases it, as any create */
    check(run, status == SNEPPX_ERR_INVALID_ARGUMENT && contains(sneppx_last_error(), "shard.transport.sum_wait"),
          "%s '%s'", sneppx_status_name(status), sneppx_last_error());
}

static int64_t free_pages(sneppx_kv_cache *cache)
{
    sneppx_kv_cache_stats stats;
    return sneppx_kv_cache_stats_get(cache, &stats) == SNEPPX_OK ? stats.free_pages : -1;
}

static void forward_failures(struct run *run, const sneppx_config *config)
{
    const int last = run->env->world - 1, rank = run->env->rank, world = run->env->world;
    sneppx_layer *shard = NULL, *whole = NULL;
    run->name = "forward failures";
    if (!check(run, create_shard(run, config, NULL, &shard) == SNEPPX_OK &&
                        sneppx_layer_create(config, NULL, &whole) == SNEPPX_OK,
               "create: %s", sneppx_last_error()))
        goto done;
    const int64_t hidden = config->hidden_size, batch = 2, seq = 4, n = batch * seq * hidden;
    float *x = uniform(n, 3, 1.0f), *out = filled(n, SENTINEL), *want = filled(n, 0);
    char want_text[256];

    run->name = "a bad argument on one rank";
    sneppx_status status = sneppx_layer_forward(shard, batch, rank == last ? 0 : seq, x, NULL, NULL, NULL, out);
    check_refusal(run, "forward", status, SNEPPX_ERR_INVALID_ARGUMENT, last, "seq_len");
    check(run, untouched(out, n), "out written");

    run->name = "another shape on one rank";
    status = sneppx_layer_forward(shard, rank == last ? 1 : batch, seq, x, NULL, NULL, NULL, out);
    snprintf(want_text, sizeof want_text, "hidden_states: rank %d of %d runs batch 1 x seq_len 4, rank 0 batch 2", last,
             world);
    check_all(run, "forward", status, want_text);
    check(run, untouched(out, n), "out written");

    run->name = "other positions on one rank";
    int64_t positions[8];
    for (int i = 0; i < 8; i++)
        positions[i] = i % 4 + (rank == last ? 1 : 0);
    status = sneppx_layer_forward(shard, batch, seq, x, NULL, NULL, positions, out);
    snprintf(want_text, sizeof want_text, "position_ids: rank %d of %d's positions differ from rank 0's", last, world);
    check_all(run, "forward", status, want_text);
    check(run, untouched(out, n), "out written");

    run->name = "a mask on one rank";
    float *mask = filled(batch * seq * seq, 0);
    const int64_t shape[4] = {batch, 1, seq, seq};
    status = sneppx_layer_forward(shard, batch, seq, x, rank == last ? mask : NULL, rank == last ? shape : NULL, NULL,
                                  out);
    snprintf(want_text, sizeof want_text, "attention_mask: rank %d of %d passes one, rank 0 none", last, world);
    check_all(run, "forward", status, want_text);
    check(run, untouched(out, n), "out written");
    free(mask);

    run->name = "a binding's refusal on one rank";
    status = rank == last ? sneppx_layer_shard_refuse(shard, SNEPPX_ERR_INVALID_ARGUMENT, "hidden_states: checked by the binding")
                          : sneppx_layer_forward(shard, batch, seq, x, NULL, NULL, NULL, out);
    check_refusal(run, "forward", status, SNEPPX_ERR_INVALID_ARGUMENT, last, "hidden_states: checked by the binding");
    check(run, untouched(out, n), "out written");
    /* A refusal with a NULL message is still this rank's part in the call. */
    status = rank == last ? sneppx_layer_shard_refuse(shard, SNEPPX_ERR_INVALID_ARGUMENT, NULL)
                          : sneppx_layer_forward(shard, batch, seq, x, NULL, NULL, NULL, out);
    check_refusal(run, "forward", status, SNEPPX_ERR_INVALID_ARGUMENT, last, "message: must not be NULL");
    check(run, untouched(out, n), "out written");
    status = sneppx_layer_shard_refuse(shard, SNEPPX_OK, "not a refusal");
    check(run, status == SNEPPX_ERR_INVALID_ARGUMENT && contains(sneppx_last_error(), "status: 0 is not a refusal"),
          "refuse with SNEPPX_OK: %s '%s'", sneppx_status_name(status), sneppx_last_error());

    run->name = "after the refusals";
    sneppx_layer_forward(whole, batch, seq, x, NULL, NULL, NULL, want);
    status = sneppx_layer_forward(shard, batch, seq, x, NULL, NULL, NULL, out);
    const double error = normalized_error(out, want, n);
    check(run, status == SNEPPX_OK && error <= MAX_ERROR, "%s '%s', error %.3g", sneppx_status_name(status),
          sneppx_last_error(), error);

    /* A full cache on one rank: refused everywhere before a token is appended. */
    run->name = "a full cache on one rank";
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.page_size = 16; /* what the page counts below are in */
    options.capacity_tokens = rank == last ? 32 : 64; /* 2 pages or 4 */
    sneppx_kv_cache *cache = NULL, *whole_cache = NULL;
    int64_t id = -1, whole_id = -1;
    status = sneppx_kv_cache_create(sneppx_layer_config(shard), &options, &cache);
    options.capacity_tokens = 64;
    if (status == SNEPPX_OK)
        status = sneppx_kv_cache_create(config, &options, &whole_cache);
    if (status == SNEPPX_OK)
        status = sneppx_kv_cache_add_sequence(cache, &id);
    if (status == SNEPPX_OK)
        status = sneppx_kv_cache_add_sequence(whole_cache, &whole_id);
    if (check(run, status == SNEPPX_OK, "cache: %s", sneppx_last_error())) {
        int64_t q_len = 40, length = -1; /* 3 pages */
        float *cx = uniform(q_len * hidden, 9, 1.0f), *cout = filled(q_len * hidden, SENTINEL);
        float *cwant = filled(q_len * hidden, 0);
        const int64_t free_before = free_pages(cache);
        /* The other ranks had room: their pages must go back to the pool. */
        status = sneppx_layer_forward_cached(shard, cache, 0, 1, &id, &q_len, cx, NULL, NULL, cout);
        check_refusal(run, "forward_cached", status, SNEPPX_ERR_OUT_OF_MEMORY, last, "cache: pool full");
        sneppx_kv_cache_length(cache, id, &length);
        check(run, untouched(cout, q_len * hidden) && length == 0, "out written or cache grew (%lld tokens)",
              (long long)length);
        check(run, free_pages(cache) == free_before, "free pages %lld after the refusal, %lld before",
              (long long)free_pages(cache), (long long)free_before);
        q_len = 10;
        status = sneppx_layer_forward_cached(shard, cache, 0, 1, &id, &q_len, cx, NULL, NULL, cout);
        sneppx_layer_forward_cached(whole, whole_cache, 0, 1, &whole_id, &q_len, cx, NULL, NULL, cwant);
        double e = normalized_error(cout, cwant, q_len * hidden);
        check(run, status == SNEPPX_OK && e <= MAX_ERROR, "10 tokens then: %s '%s', error %.3g",
              sneppx_status_name(status), sneppx_last_error(), e);

        run->name = "a binding's refusal of a cached forward on one rank";
        const int64_t free_now = free_pages(cache);
        q_len = 20; /* a fresh page on every rank */
        status = rank == last ? sneppx_layer_shard_refuse(shard, SNEPPX_ERR_INVALID_ARGUMENT, "past_key_value: no")
                              : sneppx_layer_forward_cached(shard, cache, 0, 1, &id, &q_len, cx, NULL, NULL, cout);
        check_refusal(run, "forward_cached", status, SNEPPX_ERR_INVALID_ARGUMENT, last, "past_key_value: no");
        sneppx_kv_cache_length(cache, id, &length);
        check(run, length == 10 && free_pages(cache) == free_now, "cache changed: %lld tokens, %lld free pages of %lld",
              (long long)length, (long long)free_pages(cache), (long long)free_now);
        q_len = 10;

        /* A fork shares the 10 tokens' page, so the other ranks' reserve copies
         * it (copy-on-write): the refusal must share it again. */
        run->name = "another cached length on one rank";
        int64_t fork = -1;
        status = sneppx_kv_cache_fork(cache, id, &fork);
        if (rank == last && status == SNEPPX_OK)
            status = sneppx_kv_cache_truncate(cache, fork, 9);
        check(run, status == SNEPPX_OK, "fork: %s", sneppx_last_error());
        const int64_t shared_free = free_pages(cache);
        q_len = 1;
        for (int64_t i = 0; i < hidden; i++)
            cout[i] = SENTINEL;
        status = sneppx_layer_forward_cached(shard, cache, 0, 1, &fork, &q_len, cx, NULL, NULL, cout);
        snprintf(want_text, sizeof want_text, "cache: rank %d of %d's sequences hold other lengths than rank 0's",
                 last, world);
        check_all(run, "forward_cached", status, want_text);
        check(run, untouched(cout, hidden), "out written");
        check(run, free_pages(cache) == shared_free, "free pages %lld after the refusal, %lld before",
              (long long)free_pages(cache), (long long)shared_free);
        /* The same positions given on every rank: the lengths still differ. */
        const int64_t position = 10;
        status = sneppx_layer_forward_cached(shard, cache, 0, 1, &fork, &q_len, cx, &position, NULL, cout);
        check_all(run, "forward_cached with positions", status, want_text);
        check(run, untouched(cout, hidden), "out written");
        check(run, free_pages(cache) == shared_free, "free pages %lld after the refusal, %lld before",
              (long long)free_pages(cache), (long long)shared_free);
        /* The parent's next token, written into its page, is the whole layer's. */
        status = sneppx_layer_forward_cached(shard, cache, 0, 1, &id, &q_len, cx, NULL, NULL, cout);
        sneppx_layer_forward_cached(whole, whole_cache, 0, 1, &whole_id, &q_len, cx, NULL, NULL, cwant);
        e = normalized_error(cout, cwant, hidden);
        check(run, status == SNEPPX_OK && e <= MAX_ERROR && free_pages(cache) == shared_free - 1,
              "the parent's 11th token then: %s '%s', error %.3g, free pages %lld (want %lld: one copy)",
              sneppx_status_name(status), sneppx_last_error(), e, (long long)free_pages(cache),
              (long long)(shared_free - 1));
        free(cx), free(cout), free(cwant);
    }
    sneppx_kv_cache_destroy(cache);
    sneppx_kv_cache_destroy(whole_cache);
    free(x), free(out), free(want);
done:
    sneppx_layer_destroy(shard);
    sneppx_layer_destroy(whole);
}

/* ---- a checkpoint, read shard by shard -------------------------------------- */

static uint16_t bf16_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    bits += 0x7fff + ((bits >> 16) & 1); /* round to nearest even (finite values) */
    return (uint16_t)(bits >> 16);
}

/* Writes layers 0 and 1 (the same tensors) of config's self_attn: matrices as BF16,
 * vectors as F32. The tensors' bits go to typed (bfloat16 / float32 refs, owned by
 * storage) too. Returns 0 on success. */
static int write_checkpoint(const char *path, const sneppx_config *config, sneppx_typed_weights *typed,
                            void *storage[SNEPPX_ATTN_TENSORS_MAX], int *count)
{
    sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX];
    if (sneppx_attn_tensors(config, tensors, count) != SNEPPX_OK)
        return 1;
    char header[8192];
    size_t used = (size_t)snprintf(header, sizeof header, "{");
    uint64_t offset = 0;
    for (int layer = 0; layer < 2; layer++)
        for (int i = 0; i < *count; i++) {
            const int64_t elements = tensors[i].shape[0] * (tensors[i].rank == 2 ? tensors[i].shape[1] : 1);
            const int bf16 = tensors[i].rank == 2;
            const uint64_t bytes = (uint64_t)elements * (bf16 ? 2 : 4);
            char shape[64];
            if (tensors[i].rank == 2)
                snprintf(shape, sizeof shape, "%lld,%lld", (long long)tensors[i].shape[0],
                         (long long)tensors[i].shape[1]);
            else
                snprintf(shape, sizeof shape, "%lld", (long long)tensors[i].shape[0]);
            used += (size_t)snprintf(header + used, sizeof header - used,
                                     "%s\"model.layers.%d.self_attn.%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                     "\"data_offsets\":[%llu,%llu]}",
                                     used > 1 ? "," : "", layer, tensors[i].name, bf16 ? "BF16" : "F32", shape,
                                     (unsigned long long)offset, (unsigned long long)(offset + bytes));
            offset += bytes;
        }
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    FILE *file = fopen(path, "wb");
    if (!file)
        return 1;
    const uint64_t header_bytes = used;
    fwrite(&header_bytes, sizeof header_bytes, 1, file);
    fwrite(header, 1, used, file);
    memset(typed, 0, sizeof *typed);
    for (int i = 0; i < *count; i++) {
        const int64_t elements = tensors[i].shape[0] * (tensors[i].rank == 2 ? tensors[i].shape[1] : 1);
        float *values = uniform(elements, 900 + (uint64_t)i, tensors[i].rank == 2 ? 0.15f : 0.3f);
        sneppx_tensor_ref *ref = (sneppx_tensor_ref *)((char *)typed + tensors[i].weights_offset /
                                                                           sizeof(const float *) *
                                                                           sizeof(sneppx_tensor_ref));
        if (tensors[i].rank == 2) {
            uint16_t *bits = malloc(sizeof(uint16_t) * (size_t)elements);
            for (int64_t e = 0; e < elements; e++)
                bits[e] = bf16_bits(values[e]);
            free(values);
            storage[i] = bits;
            ref->dtype = SNEPPX_DTYPE_BFLOAT16;
        } else {
            storage[i] = values;
            ref->dtype = SNEPPX_DTYPE_FLOAT32;
        }
        ref->data = storage[i];
    }
    for (int layer = 0; layer < 2; layer++)
        for (int i = 0; i < *count; i++) {
            const int64_t elements = tensors[i].shape[0] * (tensors[i].rank == 2 ? tensors[i].shape[1] : 1);
            fwrite(storage[i], tensors[i].rank == 2 ? 2 : 4, (size_t)elements, file);
        }
    return fclose(file) != 0;
}

/* Bytes this process has read (/proc/self/io rchar), or -1. */
static long long bytes_read(void)
{
    FILE *io = fopen("/proc/self/io", "r");
    char line[128];
    long long value = -1;
    while (io && fgets(line, sizeof line, io))
        if (sscanf(line, "rchar: %lld", &value) == 1)
            break;
    if (io)
        fclose(io);
    return value;
}

/* The bytes of a layer's tensors as write_checkpoint stores them (matrices BF16, vectors F32). */
static long long stored_bytes(const sneppx_config *config)
{
    sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    long long bytes = 0;
    sneppx_attn_tensors(config, tensors, &count);
    for (int i = 0; i < count; i++)
        bytes += tensors[i].rank == 2 ? 2 * tensors[i].shape[0] * tensors[i].shape[1] : 4 * tensors[i].shape[0];
    return bytes;
}

static void checkpoint_case(struct run *run, const sneppx_config *config)
{
    const shard_env *env = run->env;
    run->name = "checkpoint";
    char path[512];
    snprintf(path, sizeof path, "%s/shard_cases_w%d.safetensors", env->scratch_dir, env->world);
    sneppx_typed_weights typed;
    void *storage[SNEPPX_ATTN_TENSORS_MAX] = {0};
    int count = 0;
    /* Every rank makes the same typed tensors; rank 0 alone writes the file. */
    int written = write_checkpoint(env->rank == 0 ? path : "/dev/null", config, &typed, storage, &count);
    check(run, written == 0, "writing %s", path);
    env->barrier(env->context);

    sneppx_layer *whole = NULL, *from_file = NULL, *from_memory = NULL;
    sneppx_shard shard;
    sneppx_status s0 = sneppx_layer_create_from_safetensors(config, path, 0, &whole);
    /* From memory first: the file's shard then finds its kernels in memory, and reads the file alone. */
    env->make_shard(env->context, &shard);
    sneppx_status s2 = sneppx_layer_create_shard_typed(config, &typed, &shard, &from_memory);
    env->make_shard(env->context, &shard);
    const long long read_before = bytes_read();
    sneppx_status s1 = sneppx_layer_create_shard_from_safetensors(config, path, 0, &shard, &from_file);
    const long long read = bytes_read() - read_before;
    /* Each rank reads its shard's rows and columns, plus the file's header (a few KiB). */
    if (env->own_process && s1 == SNEPPX_OK && read_before >= 0) {
        const long long shard_bytes = stored_bytes(sneppx_layer_config(from_file)), whole = stored_bytes(config);
        check(run, read >= shard_bytes && read <= shard_bytes + 16384,
              "read %lld bytes of the file for a shard of %lld bytes (the layer's: %lld)", read, shard_bytes, whole);
    }
    if (check(run, s0 == SNEPPX_OK && s1 == SNEPPX_OK && s2 == SNEPPX_OK, "create: %s %s %s '%s'",
              sneppx_status_name(s0), sneppx_status_name(s1), sneppx_status_name(s2), sneppx_last_error())) {
        const int64_t hidden = config->hidden_size, n = 6 * hidden;
        float *x = uniform(n, 11, 1.0f), *want = filled(n, 0), *got = filled(n, 0), *got_memory = filled(n, 0);
        sneppx_layer_forward(whole, 1, 6, x, NULL, NULL, NULL, want);
        s1 = sneppx_layer_forward(from_file, 1, 6, x, NULL, NULL, NULL, got);
        s2 = sneppx_layer_forward(from_memory, 1, 6, x, NULL, NULL, NULL, got_memory);
        const double error = normalized_error(got, want, n), memory_error = normalized_error(got_memory, got, n);
        check(run, s1 == SNEPPX_OK && s2 == SNEPPX_OK && error <= MAX_ERROR && memory_error == 0,
              "forward: %s %s, error %.3g against the whole layer, %.3g from memory", sneppx_status_name(s1),
              sneppx_status_name(s2), error, memory_error);
        free(x), free(want), free(got), free(got_memory);
    }
    sneppx_layer_destroy(whole);
    sneppx_layer_destroy(from_file);
    sneppx_layer_destroy(from_memory);

    if (env->world > 1) {
        run->name = "checkpoint: another layer on one rank";
        const int last = env->world - 1;
        char want[256];
        snprintf(want, sizeof want, "layer_index: rank %d of %d loads layer 1, rank 0 layer 0", last, env->world);
        env->make_shard(env->context, &shard);
        sneppx_layer *layer = NULL;
        check_all(run, "create",
                  sneppx_layer_create_shard_from_safetensors(config, path, env->rank == last ? 1 : 0, &shard, &layer),
                  want);
        run->name = "checkpoint: a missing file on one rank";
        env->make_shard(env->context, &shard);
        sneppx_status status = sneppx_layer_create_shard_from_safetensors(
            config, env->rank == last ? "/nonexistent/shard.safetensors" : path, 0, &shard, &layer);
        check_refusal(run, "create", status, SNEPPX_ERR_IO, last, "/nonexistent/shard.safetensors");
    }
    for (int i = 0; i < count; i++)
        free(storage[i]);
    env->barrier(env->context);
    if (env->rank == 0)
        remove(path);
}

/* ---- presets ---------------------------------------------------------------- */

static void preset_case(struct run *run, const char *name, int64_t tokens)
{
    sneppx_config config;
    if (!check(run, sneppx_config_from_name(name, NULL, &config) == SNEPPX_OK, "preset %s", name))
        return;
    config.num_threads = 1;
    run_config(run, &config, 1, tokens, 0);
    /* Resident weights per rank: 1/world of the layer's, panels rounded (no K/V
     * head replicated up to world = num_key_value_heads). */
    if (splits(&config, run->env->world) && run->env->world <= config.num_key_value_heads) {
        sneppx_layer *whole = NULL, *shard = NULL;
        sneppx_layer_create(&config, NULL, &whole);
        create_shard(run, &config, NULL, &shard);
        const double ratio = sneppx_layer_weight_bytes(shard) * run->env->world / sneppx_layer_weight_bytes(whole);
        check(run, ratio > 0.99 && ratio < 1.01, "weights per rank x world / the layer's: %.4f", ratio);
        sneppx_layer_destroy(whole);
        sneppx_layer_destroy(shard);
    }
}

int shard_cases_run(const shard_env *env, int which)
{
    struct run run = {env, 0, ""};
    sneppx_config configs[8];
    const int count = small_configs(configs);
    if (which & SHARD_CASES_SMALL)
        for (int i = 0; i < count; i++)
            run_config(&run, &configs[i], 2, 9, 1);
    if ((which & SHARD_CASES_FAILURES) && env->world > 1) {
        /* The first small config this world splits (every world up to 4 splits one). */
        int i = 0;
        while (i + 1 < count && (!splits(&configs[i], env->world) || configs[i].kv_lora_rank > 0))
            i++;
        create_failures(&run, &configs[i]);
        forward_failures(&run, &configs[i]);
    }
    if (which & SHARD_CASES_CHECKPOINT) {
        int i = 0;
        while (i + 1 < count && !splits(&configs[i], env->world))
            i++;
        checkpoint_case(&run, &configs[i]);
    }
    if (which & SHARD_CASES_PRESETS) {
        preset_case(&run, "llama3-8B", 3);
        preset_case(&run, "qwen2-0.5B", 3);
    }
    return run.failures;
}
