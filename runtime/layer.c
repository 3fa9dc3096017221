/* Layer lifecycle: validate the config, resolve every kernel it needs (by key),
 * pack the weights, and run forward calls with validated arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "error.h"
#include "forward.h"
#include "gemm_tiles.h"
#include "kernel_registry.h"
#include "rope_tables.h"
#include "shard.h"
#include "threads.h"
#include "weights.h"
#include "workspace.h"

/* Records a resolved kernel once (key line and timing); caller holds layer->lock. */
static void record_kernel(sneppx_layer *layer, const char *key, const sneppx_kernel_timing *timing)
{
    const int count = atomic_load_explicit(&layer->timing_count, memory_order_relaxed);
    for (int i = 0; i < count; i++)
        if (strcmp(layer->timings[i].key, key) == 0)
            return;
    if (count == SNEPPX_LAYER_MAX_KERNELS)
        return;
    size_t len = strlen(key);
    memcpy(layer->keys + layer->keys_len, key, len);
    layer->keys_len += len;
    layer->keys[layer->keys_len++] = '\n';
    layer->keys[layer->keys_len] = '\0';
    sneppx_kernel_timing *slot = &layer->timings[count];
    if (timing) {
        *slot = *timing;
    } else {
        memset(slot, 0, sizeof *slot);
        snprintf(slot->key, sizeof slot->key, "%s", key);
    }
    atomic_store_explicit(&layer->timing_count, count + 1, memory_order_release);
}

struct sneppx_keys_copy {
    struct sneppx_keys_copy *next;
    char text[];
};

/* Publishes a copy of the key list for sneppx_layer_keys(); caller holds layer->lock.
 * Out of memory, the last copy stays published, without the new lines. */
static void publish_keys(sneppx_layer *layer)
{
    struct sneppx_keys_copy *copy = malloc(sizeof *copy + layer->keys_len + 1);
    if (!copy)
        return;
    memcpy(copy->text, layer->keys, layer->keys_len + 1);
    copy->next = layer->keys_copies;
    layer->keys_copies = copy;
    atomic_store_explicit(&layer->keys_published, copy->text, memory_order_release);
}

/* The kernels a layer needs, gathered before any is resolved so that they
 * compile side by side (kernels.c compiles distinct keys concurrently).
 * At most SNEPPX_LAYER_MAX_KERNELS (warmup's; layer_internal.h counts them). */
#define MAX_REQUESTS (SNEPPX_LAYER_MAX_KERNELS + 4)

struct kernel_request {
    const char *family;
    int64_t values[SNEPPX_MAX_KEY_FIELDS];
    const sneppx_kernel **kernel;            /* where the resolved kernel goes */
    sneppx_status status;
    sneppx_kernel_timing timing;
    int timed;
    char error[1024];   /* sneppx_last_error() of the thread that failed */
};

struct kernel_requests {
    struct kernel_request items[MAX_REQUESTS];
    int count;
    const struct sneppx_target *target; /* the layer's */
};

static void request(struct kernel_requests *requests, const char *family, const int64_t *values, int value_count,
                    const sneppx_kernel **kernel)
{
    if (requests->count == MAX_REQUESTS)
        abort(); /* a programming error: MAX_REQUESTS is below what layer_init asks for */
    struct kernel_request *r = &requests->items[requests->count++];
    memset(r, 0, sizeof *r);
    r->family = family;
    memcpy(r->values, values, (size_t)value_count * sizeof *values);
    r->kernel = kernel;
}

/* weight_type is the config's weight_dtype; bfloat16 compute (compute_dtype, which
 * validation allows with bfloat16 weights only) is the gemm_bf16dot family. The
 * gemm key's kc and mc are this host's (gemm_tiles.h: tuned, or the target's). */
static void request_gemm(struct kernel_requests *requests, sneppx_dtype weight_type,
                         struct sneppx_packed_gemm *gemm, int64_t k, int64_t n, int has_bias)
{
    int64_t values[] = {k, n, has_bias ? 1 : 0, (int64_t)weight_type, 0, 0};
    sneppx_gemm_tiles(requests->target, weight_type, &values[4], &values[5]);
    gemm->k = k;
    gemm->n = n;
    gemm->weight_type = weight_type;
    if (gemm->bf16_pairs)
        request(requests, "gemm_bf16dot", values, 3, &gemm->kernel);
    else
        request(requests, "gemm", values, 6, &gemm->kernel);
}

static void request_rmsnorm(struct kernel_requests *requests, int64_t n, const sneppx_kernel **kernel)
{
    const int64_t values[] = {n};
    request(requests, "rmsnorm", values, 1, kernel);
}

/* kv_type: decode's sixth key field (the KV cache's element type); the others have five. */
static void request_attention(struct kernel_requests *requests, const sneppx_layer *layer, int kind,
                              int explicit_mask, sneppx_dtype kv_type, const sneppx_kernel **kernel)
{
    static const char *const families[SNEPPX_ATTN_KINDS] = {"attn_sdpa", "attn_flash", "attn_decode"};
    /* An explicit mask is final (HF semantics): no causal or window on top. */
    const int64_t values[] = {layer->attn_head_dim, layer->attn_v_head_dim, layer->attn_group,
                              explicit_mask ? 0 : layer->attn_window,
                              explicit_mask ? SNEPPX_MASK_EXPLICIT : SNEPPX_MASK_CAUSAL, (int64_t)kv_type};
    request(requests, families[kind], values, kind == SNEPPX_ATTN_DECODE ? 6 : 5, kernel);
}

/* Resolves every request, on up to the layer's threads at once: a cold layer
 * costs the longest chain of compiles, not their sum. Kernels are recorded
 * in request order, so the layer's key list does not depend on timing; the
 * first failure in that order is the error reported. */
static sneppx_status resolve_requests(sneppx_layer *layer, struct kernel_requests *requests)
{
    /* Every key against the registry's ranges first: a config that derives an
     * illegal key is refused before anything compiles. */
    for (int i = 0; i < requests->count; i++) {
        const struct kernel_request *r = &requests->items[i];
        char key[SNEPPX_KEY_MAX];
        if (sneppx_kernel_key(r->family, r->values, layer->target, key, sizeof key) != SNEPPX_OK) {
            char reason[512];
            snprintf(reason, sizeof reason, "%s", sneppx_last_error());
            return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config: derives a %s kernel no template is built for: %s",
                               r->family, reason);
        }
    }
    const int threads = sneppx_thread_count(layer) < requests->count ? sneppx_thread_count(layer) : requests->count;
    /* Once per process, before the first key: no thread's key waits for it. */
    sneppx_kernel_prepare();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads > 0 ? threads : 1)
    for (int i = 0; i < requests->count; i++) {
        struct kernel_request *r = &requests->items[i];
        r->status = sneppx_kernel_resolve(r->family, r->values, layer->target, r->kernel);
        if (r->status == SNEPPX_OK)
            r->timed = sneppx_kernel_last_timing(&r->timing) == SNEPPX_OK;
        else
            snprintf(r->error, sizeof r->error, "%s", sneppx_last_error());
    }
    sneppx_status status = SNEPPX_OK;
    pthread_mutex_lock(&layer->lock);
    const size_t keys_len = layer->keys_len;
    for (int i = 0; i < requests->count && status == SNEPPX_OK; i++) {
        const struct kernel_request *r = &requests->items[i];
        if (r->status != SNEPPX_OK)
            status = sneppx_fail(r->status, "%s", r->error);
        else
            record_kernel(layer, (*r->kernel)->key, r->timed ? &r->timing : NULL);
    }
    if (layer->keys_len != keys_len)
        publish_keys(layer);
    pthread_mutex_unlock(&layer->lock);
    return status;
}

/* An attention kernel through its slot: resolved once, then read without a lock. */
static sneppx_status attention_in_slot(sneppx_layer *layer, _Atomic(const sneppx_kernel *) *slot, int kind,
                                       int explicit_mask, sneppx_dtype kv_type, const sneppx_kernel **kernel)
{
    const sneppx_kernel *cached = atomic_load_explicit(slot, memory_order_acquire);
    if (cached) {
        *kernel = cached;
        return SNEPPX_OK;
    }
    struct kernel_requests requests = {.count = 0};
    request_attention(&requests, layer, kind, explicit_mask, kv_type, kernel);
    sneppx_status status = resolve_requests(layer, &requests);
    if (status == SNEPPX_OK)
        atomic_store_explicit(slot, *kernel, memory_order_release);
    return status;
}

sneppx_status sneppx_layer_attention_kernel(sneppx_layer *layer, int kind, int explicit_mask,
                                            const sneppx_kernel **kernel)
{
    if (kind == SNEPPX_ATTN_DECODE)
        return sneppx_layer_decode_kernel(layer, SNEPPX_DTYPE_FLOAT32, explicit_mask, kernel);
    return attention_in_slot(layer, &layer->attention[kind][explicit_mask], kind, explicit_mask,
                             SNEPPX_DTYPE_FLOAT32, kernel);
}

sneppx_status sneppx_layer_decode_kernel(sneppx_layer *layer, sneppx_dtype kv_type, int explicit_mask,
                                         const sneppx_kernel **kernel)
{
    return attention_in_slot(layer, &layer->decode[kv_type][explicit_mask], SNEPPX_ATTN_DECODE, explicit_mask,
                             kv_type, kernel);
}

/* Derives every dimension and resolves the kernels, the attention kernel in
 * use or (all_attention) every attention variant; no weights yet. */
static sneppx_status layer_init(const sneppx_config *config, int all_attention, sneppx_layer **out)
{
    sneppx_status status = sneppx_config_validate(config);
    if (status != SNEPPX_OK)
        return status;
    sneppx_layer *layer = calloc(1, sizeof *layer);
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "layer: out of memory");
    pthread_mutex_init(&layer->lock, NULL);
    layer->config = *config;
    layer->target = sneppx_host_target();
    atomic_store(&layer->use_flash, config->use_flash_attn ? 1 : 0);
    const int64_t heads = config->num_attention_heads;
    const sneppx_dtype wt = config->weight_dtype; /* every projection's */
    layer->rotary_dim = sneppx_config_rotary_dim(config);
    layer->softmax_scale = (float)sneppx_config_softmax_scale(config);
    layer->is_mla = config->kv_lora_rank > 0;
    *out = layer;
    if (config->compute_dtype == SNEPPX_DTYPE_BFLOAT16) {
        struct sneppx_packed_gemm *gemms[] = {&layer->qkv_proj, &layer->o_proj, &layer->q_a_proj, &layer->kv_a_proj,
                                              &layer->kv_b_proj, &layer->absorb_uk, &layer->absorb_uv};
        for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++)
            gemms[i]->bf16_pairs = 1;
    }

    /* The threads take requests in this order, the order of the layer's key list too. */
    struct kernel_requests requests = {.count = 0, .target = layer->target};
    if (layer->is_mla) {
        layer->head_dim = config->qk_nope_head_dim + config->qk_rope_head_dim;
        layer->v_head_dim = config->v_head_dim;
        layer->latent_dim = config->kv_lora_rank + config->qk_rope_head_dim;
        layer->q_dim = heads * layer->head_dim;
        layer->attn_dim = heads * layer->v_head_dim;
        if (config->q_lora_rank > 0) {
            request_gemm(&requests, wt, &layer->q_a_proj, config->hidden_size, config->q_lora_rank,
                         config->qkv_bias);
            request_rmsnorm(&requests, config->q_lora_rank, &layer->q_a_norm);
            request_gemm(&requests, wt, &layer->qkv_proj, config->q_lora_rank, layer->q_dim, 0);
        } else {
            request_gemm(&requests, wt, &layer->qkv_proj, config->hidden_size, layer->q_dim, 0);
        }
        request_gemm(&requests, wt, &layer->kv_a_proj, config->hidden_size, layer->latent_dim, config->qkv_bias);
        request_rmsnorm(&requests, config->kv_lora_rank, &layer->kv_a_norm);
        if (config->mla_naive) {
            layer->kv_heads = heads;
            layer->attn_head_dim = layer->head_dim;
            layer->attn_v_head_dim = layer->v_head_dim;
            layer->attn_group = 1;
            request_gemm(&requests, wt, &layer->kv_b_proj, config->kv_lora_rank,
                         heads * (config->qk_nope_head_dim + config->v_head_dim), 0);
        } else {
            /* Absorbed: one shared latent "kv head" of q/k dim kv_lora+rope and v dim kv_lora. */
            layer->kv_heads = 1;
            layer->attn_head_dim = layer->latent_dim;
            layer->attn_v_head_dim = config->kv_lora_rank;
            layer->attn_group = heads;
            request_gemm(&requests, wt, &layer->absorb_uk, config->qk_nope_head_dim, config->kv_lora_rank, 0);
            request_gemm(&requests, wt, &layer->absorb_uv, config->kv_lora_rank, config->v_head_dim, 0);
        }
        request_gemm(&requests, wt, &layer->o_proj, layer->attn_dim, config->hidden_size, config->o_bias);
    } else {
        layer->head_dim = sneppx_config_head_dim(config);
        layer->v_head_dim = layer->head_dim;
        layer->kv_heads = config->num_key_value_heads;
        layer->group = heads / layer->kv_heads;
        layer->q_dim = heads * layer->head_dim;
        layer->kv_dim = layer->kv_heads * layer->head_dim;
        layer->qkv_dim = layer->q_dim + 2 * layer->kv_dim;
        layer->attn_dim = heads * layer->v_head_dim;
        layer->attn_head_dim = layer->head_dim;
        layer->attn_v_head_dim = layer->head_dim;
        layer->attn_group = layer->group;
        layer->attn_window = config->sliding_window;
        request_gemm(&requests, wt, &layer->qkv_proj, config->hidden_size, layer->qkv_dim, config->qkv_bias);
        request_gemm(&requests, wt, &layer->o_proj, layer->attn_dim, config->hidden_size, config->o_bias);
    }
    layer->group = layer->attn_group;

    const int64_t rope_values[] = {layer->rotary_dim, config->rope_interleaved ? 1 : 0};
    request(&requests, "rope", rope_values, 2, &layer->rope);
    /* A layer resolves the attention its use_flash_attn switch names; warmup every kernel
     * a forward could ask for: both switches, explicit masks, and decode over a KV cache
     * of each element type (a read-only cache under SNEPPX_JIT=0 must hold them all). */
    const sneppx_kernel *attention[SNEPPX_ATTN_DECODE][2] = {{NULL, NULL}, {NULL, NULL}};
    const sneppx_kernel *decode[SNEPPX_DTYPE_COUNT][2] = {{NULL, NULL}};
    const int use_flash = atomic_load(&layer->use_flash);
    for (int kind = 0; kind < SNEPPX_ATTN_DECODE; kind++)
        for (int explicit_mask = 0; explicit_mask < 2; explicit_mask++)
            if (all_attention || (kind == use_flash && !explicit_mask))
                request_attention(&requests, layer, kind, explicit_mask, SNEPPX_DTYPE_FLOAT32,
                                  &attention[kind][explicit_mask]);
    for (int kv_type = 0; all_attention && kv_type < SNEPPX_DTYPE_COUNT; kv_type++)
        for (int explicit_mask = 0; explicit_mask < 2; explicit_mask++)
            request_attention(&requests, layer, SNEPPX_ATTN_DECODE, explicit_mask, (sneppx_dtype)kv_type,
                              &decode[kv_type][explicit_mask]);
    if ((status = resolve_requests(layer, &requests)) != SNEPPX_OK)
        return status;
    for (int explicit_mask = 0; explicit_mask < 2; explicit_mask++) {
        for (int kind = 0; kind < SNEPPX_ATTN_DECODE; kind++)
            if (attention[kind][explicit_mask])
                atomic_store_explicit(&layer->attention[kind][explicit_mask], attention[kind][explicit_mask],
                                      memory_order_release);
        for (int kv_type = 0; kv_type < SNEPPX_DTYPE_COUNT; kv_type++)
            if (decode[kv_type][explicit_mask])
                atomic_store_explicit(&layer->decode[kv_type][explicit_mask], decode[kv_type][explicit_mask],
                                      memory_order_release);
    }

    layer->inv_freq = malloc(sizeof(double) * (size_t)(layer->rotary_dim / 2));
    if (!layer->inv_freq)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "layer: out of memory for RoPE frequencies");
    struct sneppx_rope_params params;
    sneppx_config_rope_params(config, &params);
    sneppx_rope_inv_freq(&params, 0, layer->inv_freq, &layer->attention_factor);
    return SNEPPX_OK;
}

sneppx_status sneppx_layer_create(const sneppx_config *config, const sneppx_weights *weights,
                                  sneppx_layer **out)
{
    sneppx_clear_error();
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: output pointer must not be NULL");
    *out = NULL;
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    /* As every create: the weights are checked before any kernel is resolved. */
    struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS] = {{0}};
    sneppx_status status = SNEPPX_OK;
    if (weights)
        sneppx_float32_sources(weights, sources);
    else
        status = sneppx_synthetic_sources(config, sources);
    if (status != SNEPPX_OK)
        return status;
    return sneppx_layer_create_from_sources(config, sources, out);
}

sneppx_status sneppx_layer_create_unpacked(const sneppx_config *config, sneppx_layer **out)
{
    sneppx_clear_error();
    *out = NULL;
    sneppx_layer *layer = NULL;
    sneppx_status status = layer_init(config, 0, &layer);
    if (status != SNEPPX_OK) {
        sneppx_layer_destroy(layer);
        return status;
    }
    *out = layer;
    return SNEPPX_OK;
}

sneppx_status sneppx_layer_warmup(const sneppx_config *config)
{
    sneppx_clear_error();
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    sneppx_layer *layer = NULL;
    sneppx_status status = layer_init(config, 1, &layer);
    sneppx_layer_destroy(layer);
    return status;
}

sneppx_status sneppx_layer_set_flash(sneppx_layer *layer, int use_flash_attn)
{
    sneppx_clear_error();
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: must not be NULL");
    if (use_flash_attn != 0 && use_flash_attn != 1)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "use_flash_attn: %d must be 0 or 1", use_flash_attn);
    const sneppx_kernel *attention;
    sneppx_status status = sneppx_layer_attention_kernel(layer, use_flash_attn, 0, &attention);
    if (status != SNEPPX_OK)
        return status;
    /* Under the lock: two switches at once would otherwise write the config's
     * copy unordered, and it could name the attention the forwards do not run. */
    pthread_mutex_lock(&layer->lock);
    atomic_store(&layer->use_flash, use_flash_attn);
    layer->config.use_flash_attn = use_flash_attn;
    pthread_mutex_unlock(&layer->lock);
    return SNEPPX_OK;
}

const sneppx_config *sneppx_layer_config(const sneppx_layer *layer) { return layer ? &layer->config : NULL; }

const char *sneppx_layer_keys(const sneppx_layer *layer)
{
    const char *keys = layer ? atomic_load_explicit(&layer->keys_published, memory_order_acquire) : NULL;
    return keys ? keys : "";
}

int sneppx_layer_kernel_count(const sneppx_layer *layer)
{
    return layer ? atomic_load_explicit(&layer->timing_count, memory_order_acquire) : 0;
}

sneppx_status sneppx_layer_kernel_timing(const sneppx_layer *layer, int index, sneppx_kernel_timing *timing)
{
    sneppx_clear_error();
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: must not be NULL");
    if (!timing)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "timing: must not be NULL");
    const int count = atomic_load_explicit(&layer->timing_count, memory_order_acquire);
    if (index < 0 || index >= count)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "index: %d is outside [0, %d)", index, count);
    *timing = layer->timings[index];
    return SNEPPX_OK;
}

/* Query/key pairs a causal mask with window (0 = none) keeps in one sequence:
 * row i sees min(i + 1, window) keys, so the rows up to the window sum to
 * w(w+1)/2 and each later row adds w. Closed form, so any int64 seq_len
 * returns at once; exact (one rounding to double) through unsigned __int128. */
static double visible_pairs(int64_t seq_len, int64_t window)
{
    const unsigned __int128 n = (unsigned __int128)seq_len;
    const unsigned __int128 w = window > 0 && window < seq_len ? (unsigned __int128)window : n;
    return (double)(w * (w + 1) / 2 + (n - w) * w);
}

double sneppx_layer_flops(const sneppx_layer *layer, int64_t batch, int64_t seq_len)
{
    if (!layer || batch <= 0 || seq_len <= 0)
        return 0;
    const sneppx_config *c = &layer->config;
    const double tokens = (double)batch * (double)seq_len, heads = (double)c->num_attention_heads;
    const double hidden = (double)c->hidden_size;
    double flops = 2 * tokens * (double)layer->attn_dim * hidden; /* o_proj */
    if (layer->is_mla) {
        const double rank = (double)c->kv_lora_rank, nope = (double)c->qk_nope_head_dim;
        flops += c->q_lora_rank > 0 ? 2 * tokens * (double)c->q_lora_rank * (hidden + (double)layer->q_dim)
                                    : 2 * tokens * hidden * (double)layer->q_dim;
        flops += 2 * tokens * hidden * (double)layer->latent_dim;
        if (c->mla_naive)
            flops += 2 * tokens * rank * heads * (nope + (double)c->v_head_dim);
        else
            flops += 2 * tokens * heads * (nope * rank + rank * (double)c->v_head_dim);
    } else {
        flops += 2 * tokens * hidden * (double)layer->qkv_dim;
    }
    flops += 2 * (double)batch * heads * visible_pairs(seq_len, layer->attn_window) *
             (double)(layer->attn_head_dim + layer->attn_v_head_dim);
    return flops;
}

static double gemm_bytes(const struct sneppx_packed_gemm *gemm)
{
    if (!gemm->panels)
        return 0;
    const double bias_bytes = gemm->bias ? (double)sizeof(float) * (double)gemm->n : 0;
    return (double)gemm->panel_bytes * (double)gemm->instances + bias_bytes;
}

double sneppx_layer_weight_bytes(const sneppx_layer *layer)
{
    if (!layer)
        return 0;
    double bytes = gemm_bytes(&layer->qkv_proj) + gemm_bytes(&layer->o_proj) + gemm_bytes(&layer->q_a_proj) +
                   gemm_bytes(&layer->kv_a_proj) + gemm_bytes(&layer->kv_b_proj) + gemm_bytes(&layer->absorb_uk) +
                   gemm_bytes(&layer->absorb_uv);
    if (layer->q_a_norm_weight)
        bytes += sizeof(float) * (double)layer->config.q_lora_rank;
    if (layer->kv_a_norm_weight)
        bytes += sizeof(float) * (double)layer->config.kv_lora_rank;
    return bytes;
}

static void free_gemm(struct sneppx_packed_gemm *gemm)
{
    free(gemm->panels);
    free(gemm->bias);
}

void sneppx_layer_destroy(sneppx_layer *layer)
{
    if (!layer)
        return;
    sneppx_workspace_free_all(layer);
    free_gemm(&layer->qkv_proj);
    free_gemm(&layer->o_proj);
    free_gemm(&layer->q_a_proj);
    free_gemm(&layer->kv_a_proj);
    free_gemm(&layer->kv_b_proj);
    free_gemm(&layer->absorb_uk);
    free_gemm(&layer->absorb_uv);
    free(layer->q_a_norm_weight);
    free(layer->kv_a_norm_weight);
    free(layer->inv_freq);
    free(layer->cos_cache);
    free(layer->sin_cache);
    sneppx_shard_free(layer->shard);
    while (layer->keys_copies) {
        struct sneppx_keys_copy *next = layer->keys_copies->next;
        free(layer->keys_copies);
        layer->keys_copies = next;
    }
    pthread_mutex_destroy(&layer->lock);
    free(layer);
}

/* Both rendered from limits.py: the public bounds are the ones every forward checks. */
_Static_assert(SNEPPX_MAX_SEQ_LEN == SNEPPX_FORWARD_MAX_SEQ_LEN, "limits.h's SNEPPX_MAX_SEQ_LEN is the ABI's");
_Static_assert(SNEPPX_MAX_TOKENS == SNEPPX_FORWARD_MAX_TOKENS, "limits.h's SNEPPX_MAX_TOKENS is the ABI's");

/* Forward: validate every argument before touching out, with the checks every
 * vendored layer makes (templates/forward_checks.h.j2). A shard's (agreed
 * non-NULL) then takes every rank's verdict, setting *agreed, before it runs. */
static sneppx_status forward(sneppx_layer *layer, int64_t batch, int64_t seq_len, const float *hidden_states,
                             const float *attention_mask, const int64_t mask_shape[4], const int64_t *position_ids,
                             float *out, int *agreed)
{
    const sneppx_config *config = &layer->config;
    char message[256];
    if (sneppx_forward_check_sizes(batch, seq_len,
                                   sneppx_forward_floats_per_token(layer->qkv_dim, layer->attn_dim,
                                                                   config->hidden_size),
                                   message, sizeof message))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s", message);
    const int64_t tokens = batch * seq_len;
    if (!hidden_states)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "hidden_states: must not be NULL");
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "out: must not be NULL");
    int64_t mask_batch_stride = 0;
    if (sneppx_forward_check_mask_shape(batch, seq_len, attention_mask, mask_shape, &mask_batch_stride, message,
                                        sizeof message))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s", message);
    int64_t max_position;
    if (sneppx_forward_check_positions(position_ids, tokens, seq_len, config->max_position_embeddings,
                                       config->rope_scaling.type == SNEPPX_ROPE_DYNAMIC,
                                       sneppx_config_beyond_positions_hint(config, 0), &max_position, message,
                                       sizeof message))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s", message);

    const sneppx_kernel *attention;
    sneppx_status status = sneppx_layer_attention_kernel(layer, atomic_load(&layer->use_flash), attention_mask != NULL, &attention);
    if (status != SNEPPX_OK)
        return status;
    struct sneppx_workspace *workspace;
    if ((status = sneppx_workspace_acquire(layer, batch, seq_len, &workspace)) != SNEPPX_OK)
        return status;
    status = sneppx_rope_tables(layer, tokens, seq_len, position_ids, max_position,
                                workspace->cos, workspace->sin);
    if (agreed) {
        uint64_t mask_hash = attention_mask ? SNEPPX_SHARD_HASH_START : 0, plane_hash = 0;
        for (int64_t b = 0; status == SNEPPX_OK && attention_mask && b < batch; b++) {
            if (b == 0 || mask_batch_stride) /* a broadcast plane is hashed once */
                plane_hash = sneppx_shard_hash_floats(attention_mask + b * mask_batch_stride, seq_len * seq_len);
            mask_hash = sneppx_shard_hash_step(mask_hash, plane_hash);
        }
        const struct sneppx_shard_call call = {
            .cached = 0, .tokens = tokens, .batch = batch, .seq_len = seq_len, .has_mask = attention_mask != NULL,
            .positions = position_ids ? sneppx_shard_hash(position_ids, tokens)
                                      : sneppx_shard_hash_default_positions(batch, seq_len),
            .inputs = status == SNEPPX_OK
                          ? sneppx_shard_hash_floats(hidden_states, tokens * layer->config.hidden_size)
                          : 0,
            .mask = mask_hash};
        status = sneppx_shard_agree_call(layer->shard, status, &call);
        *agreed = 1;
    }
    if (status == SNEPPX_OK)
        status = sneppx_forward_run(layer, attention, workspace, batch, seq_len, hidden_states, attention_mask,
                                    mask_batch_stride, out);
    sneppx_workspace_release(layer, workspace);
    return status;
}

sneppx_status sneppx_layer_forward(sneppx_layer *layer, int64_t batch, int64_t seq_len,
                                   const float *hidden_states, const float *attention_mask,
                                   const int64_t mask_shape[4], const int64_t *position_ids,
                                   float *out)
{
    sneppx_clear_error();
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: must not be NULL");
    if (!layer->shard)
        return forward(layer, batch, seq_len, hidden_states, attention_mask, mask_shape, position_ids, out, NULL);
    /* A shard: every rank's verdict on the call before anything is written (in
     * forward(), or here when it refused before its own agreement), then the sums
     * of the O projection. */
    int agreed = 0;
    pthread_mutex_lock(&layer->shard->calls);
    sneppx_status status =
        forward(layer, batch, seq_len, hidden_states, attention_mask, mask_shape, position_ids, out, &agreed);
    if (!agreed) {
        const struct sneppx_shard_call call = {.cached = 0, .batch = batch, .seq_len = seq_len,
                                               .has_mask = attention_mask != NULL};
        status = sneppx_shard_agree_call(layer->shard, status, &call);
    }
    pthread_mutex_unlock(&layer->shard->calls);
    return status;
}
