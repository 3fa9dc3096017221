/* Per-call scratch, pooled per layer: concurrent forward calls each take their
 * own workspace; a released one is reused by the next call that fits in it.
 *
 * The pool keeps at most POOL_MAX idle workspaces. One that a returning
 * workspace covers (every size at most its) is dropped, so that calls of
 * growing sizes do not pile up buffers, but only while the pool still holds
 * as many as calls have held at once: callers running side by side each need
 * one, and dropping their twin would make the next round allocate again. A
 * call takes the smallest that fits, leaving the large ones to the calls that
 * need them. */
#include <stdlib.h>

#include "big_alloc.h"
#include "error.h"
#include "workspace.h"
#include "threads.h"

#define POOL_MAX 4

static int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

static sneppx_status workspace_create(sneppx_layer *layer, int64_t tokens, const struct sneppx_workspace_needs *needs,
                                      struct sneppx_workspace **out)
{
    const sneppx_config *config = &layer->config;
    const int64_t seq_len = needs->kv_len;
    const int64_t heads = config->num_attention_heads;
    const int64_t threads = sneppx_thread_count(layer);
    const int64_t flash = sneppx_attn_flash_scratch_floats(layer->attn_group, layer->attn_head_dim, layer->attn_v_head_dim);
    const int64_t sdpa = sneppx_attn_sdpa_scratch_floats(layer->attn_group, seq_len);
    const int64_t decode = sneppx_attn_decode_scratch_floats(SNEPPX_DECODE_MAX_QUERIES, layer->attn_group,
                                                             layer->attn_head_dim, layer->attn_v_head_dim);
    int64_t attention_floats = flash > sdpa ? flash : sdpa;
    attention_floats = round_up(attention_floats > decode ? attention_floats : decode, 16);
    int64_t per_thread = attention_floats + round_up(needs->gather_floats, 16);

    struct sneppx_workspace *ws = calloc(1, sizeof *ws);
    if (!ws)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "workspace: out of memory");
    ws->tokens = tokens;
    ws->seq_len = seq_len;
    ws->threads = threads;
    ws->thread_scratch_floats = per_thread;
    ws->gather_floats = needs->gather_floats;
    ws->plan_bytes = needs->plan_bytes;
    ws->thread_gather_offset = attention_floats;

    /* Lay out every buffer in one allocation, each 64-byte aligned. */
    enum { BUFFERS = 11 };
    int64_t sizes[BUFFERS] = {0};
    float *plan = NULL;
    float **slots[BUFFERS] = {&ws->qkv, &ws->latent, &ws->q_absorbed, &ws->q_lora, &ws->kv_expanded,
                              &ws->attn_out, &ws->heads_out, &ws->cos, &ws->sin, &ws->thread_scratch, &plan};
    const int64_t half = layer->rotary_dim / 2;
    if (layer->is_mla) {
        sizes[0] = tokens * layer->q_dim;
        sizes[1] = tokens * layer->latent_dim;
        sizes[3] = config->q_lora_rank > 0 ? tokens * config->q_lora_rank : 0;
        if (config->mla_naive) {
            sizes[2] = tokens * layer->q_dim; /* expanded K */
            sizes[4] = tokens * heads * (config->qk_nope_head_dim + config->v_head_dim);
            sizes[5] = tokens * layer->attn_dim;
        } else {
            sizes[2] = tokens * heads * layer->latent_dim;
            sizes[5] = tokens * heads * config->kv_lora_rank;
            sizes[6] = tokens * layer->attn_dim;
        }
    } else {
        sizes[0] = tokens * layer->qkv_dim;
        sizes[5] = tokens * layer->attn_dim;
    }
    sizes[7] = tokens * half;
    sizes[8] = tokens * half;
    sizes[9] = threads * per_thread;
    sizes[10] = (needs->plan_bytes + (int64_t)sizeof(float) - 1) / (int64_t)sizeof(float);
    size_t total = 0;
    for (int i = 0; i < BUFFERS; i++)
        total += (size_t)round_up(sizes[i], 16);
    ws->floats = total;
    ws->buffer = sneppx_alloc_floats(total);
    if (!ws->buffer) {
        free(ws);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "workspace: cannot allocate %zu floats for %lld tokens",
                           total, (long long)tokens);
    }
    float *cursor = ws->buffer;
    for (int i = 0; i < BUFFERS; i++) {
        *slots[i] = sizes[i] ? cursor : NULL;
        cursor += round_up(sizes[i], 16);
    }
    ws->plan = plan;
    *out = ws;
    return SNEPPX_OK;
}

static void workspace_free(struct sneppx_workspace *ws)
{
    if (!ws)
        return;
    free(ws->buffer);
    free(ws);
}

sneppx_status sneppx_workspace_acquire(sneppx_layer *layer, int64_t batch, int64_t seq_len,
                                       struct sneppx_workspace **out)
{
    const struct sneppx_workspace_needs needs = {seq_len, 0, 0};
    return sneppx_workspace_acquire_needs(layer, batch * seq_len, &needs, out);
}

sneppx_status sneppx_workspace_acquire_needs(sneppx_layer *layer, int64_t tokens,
                                             const struct sneppx_workspace_needs *needs, struct sneppx_workspace **out)
{
    const int64_t seq_len = needs->kv_len;
    const int64_t threads = sneppx_thread_count(layer);
    pthread_mutex_lock(&layer->lock);
    struct sneppx_workspace **best = NULL;
    for (struct sneppx_workspace **link = &layer->free_workspaces; *link; link = &(*link)->next) {
        const struct sneppx_workspace *ws = *link;
        if (ws->tokens >= tokens && ws->seq_len >= seq_len && ws->threads >= threads &&
            ws->gather_floats >= needs->gather_floats && ws->plan_bytes >= needs->plan_bytes &&
            (!best || ws->floats < (*best)->floats))
            best = link;
    }
    if (++layer->workspaces_lent > layer->workspaces_lent_peak)
        layer->workspaces_lent_peak = layer->workspaces_lent;
    if (best) {
        struct sneppx_workspace *ws = *best;
        *best = ws->next;
        pthread_mutex_unlock(&layer->lock);
        ws->next = NULL;
        *out = ws;
        return SNEPPX_OK;
    }
    pthread_mutex_unlock(&layer->lock);
    sneppx_status status = workspace_create(layer, tokens, needs, out);
    if (status != SNEPPX_OK) {
        pthread_mutex_lock(&layer->lock);
        layer->workspaces_lent--;
        pthread_mutex_unlock(&layer->lock);
    }
    return status;
}

/* Whether ws can serve every call idle can. */
static int covers(const struct sneppx_workspace *ws, const struct sneppx_workspace *idle)
{
    return idle->tokens <= ws->tokens && idle->seq_len <= ws->seq_len && idle->threads <= ws->threads &&
           idle->gather_floats <= ws->gather_floats && idle->plan_bytes <= ws->plan_bytes;
}

void sneppx_workspace_release(sneppx_layer *layer, struct sneppx_workspace *ws)
{
    pthread_mutex_lock(&layer->lock);
    layer->workspaces_lent--;
    const int wanted = layer->workspaces_lent_peak < POOL_MAX ? layer->workspaces_lent_peak : POOL_MAX;
    int pooled = 1; /* ws */
    for (const struct sneppx_workspace *idle = layer->free_workspaces; idle; idle = idle->next)
        pooled++;
    struct sneppx_workspace **link = &layer->free_workspaces;
    int kept = 1;
    while (*link) {
        struct sneppx_workspace *idle = *link;
        if (kept == POOL_MAX || (pooled > wanted && covers(ws, idle))) {
            *link = idle->next;
            workspace_free(idle);
            pooled--;
            continue;
        }
        kept++;
        link = &idle->next;
    }
    ws->next = layer->free_workspaces;
    layer->free_workspaces = ws;
    pthread_mutex_unlock(&layer->lock);
}

void sneppx_workspace_free_all(sneppx_layer *layer)
{
    struct sneppx_workspace *ws = layer->free_workspaces;
    while (ws) {
        struct sneppx_workspace *next = ws->next;
        workspace_free(ws);
        ws = next;
    }
    layer->free_workspaces = NULL;
}
