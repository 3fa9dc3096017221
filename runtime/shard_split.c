/* Splitting a layer by heads: which heads a rank holds, its config, and the
 * rows and columns of each whole tensor it reads. No communication. */
#include <stdio.h>
#include <string.h>

#include "config_internal.h"
#include "error.h"
#include "shard.h"

/* Query heads and K/V heads (MLA: the query heads; its latent is shared) of a config. */
static int64_t kv_heads_of(const sneppx_config *config)
{
    return config->kv_lora_rank > 0 ? config->num_attention_heads : config->num_key_value_heads;
}

static int splits(const sneppx_config *config, int64_t world)
{
    const int64_t heads = config->num_attention_heads, kv = kv_heads_of(config);
    return heads % world == 0 && (kv % world == 0 || world % kv == 0);
}

/* "1, 2, 4 or 8": every world size that splits config. */
static void sizes_that_split(const sneppx_config *config, char *text, size_t size)
{
    int64_t found[64], count = 0;
    for (int64_t w = 1; w <= config->num_attention_heads && count < 64; w++)
        if (splits(config, w))
            found[count++] = w;
    size_t used = 0;
    text[0] = '\0';
    for (int64_t i = 0; i < count && used < size; i++)
        used += (size_t)snprintf(text + used, size - used, "%s%lld", i == 0 ? "" : i + 1 == count ? " or " : ", ",
                                 (long long)found[i]);
}

static sneppx_status check_world(const sneppx_config *config, int world)
{
    if (world >= 1 && world <= config->num_attention_heads && splits(config, world))
        return SNEPPX_OK;
    char sizes[512];
    sizes_that_split(config, sizes, sizeof sizes);
    if (config->kv_lora_rank > 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "world: %d ranks cannot split %s's %lld heads evenly; world sizes that can: %s", world,
                           config->name, (long long)config->num_attention_heads, sizes);
    return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                       "world: %d ranks cannot split %s's %lld query heads in %lld K/V groups (a rank holds whole "
                       "query heads and whole K/V groups, replicating a K/V head when world exceeds %lld); world "
                       "sizes that can: %s",
                       world, config->name, (long long)config->num_attention_heads,
                       (long long)config->num_key_value_heads, (long long)config->num_key_value_heads, sizes);
}

sneppx_status sneppx_shard_check(const sneppx_config *config, int world)
{
    sneppx_clear_error();
    sneppx_status status = sneppx_config_validate(config);
    return status == SNEPPX_OK ? check_world(config, world) : status;
}

sneppx_status sneppx_shard_split(const sneppx_config *whole, int rank, int world, struct sneppx_shard_split *split)
{
    sneppx_status status = sneppx_config_validate(whole);
    if (status != SNEPPX_OK || (status = check_world(whole, world)) != SNEPPX_OK)
        return status;
    if (rank < 0 || rank >= world)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "rank: %d is outside [0, %d)", rank, world);
    const int64_t heads = whole->num_attention_heads, kv = kv_heads_of(whole);
    sneppx_shard_info *info = &split->info;
    info->rank = rank;
    info->world = world;
    info->q_heads = heads / world;
    info->q_head_begin = rank * info->q_heads;
    if (kv % world == 0) {
        info->kv_heads = kv / world;
        info->kv_head_begin = rank * info->kv_heads;
    } else { /* world is a multiple of kv: world / kv ranks share each K/V head */
        info->kv_heads = 1;
        info->kv_head_begin = rank / (world / kv);
    }
    sneppx_config *c = &split->config;
    *c = *whole;
    c->num_attention_heads = info->q_heads;
    c->num_key_value_heads = whole->kv_lora_rank > 0 ? info->q_heads : info->kv_heads;
    /* head_dim 0 means hidden_size / num_attention_heads of the whole layer. */
    if (whole->kv_lora_rank == 0)
        c->head_dim = sneppx_config_head_dim(whole);
    /* The O projection's bias is added once, by rank 0, before the sum. */
    c->o_bias = rank == 0 ? whole->o_bias : 0;
    return SNEPPX_OK;
}

/* How a tensor of sneppx_weights follows the heads. */
enum follows { WHOLE, Q_ROWS, KV_ROWS, Q_COLUMNS };

static enum follows follows_of(size_t field_offset)
{
    switch (field_offset) {
    case offsetof(sneppx_weights, q_proj_weight):
    case offsetof(sneppx_weights, q_proj_bias):
    case offsetof(sneppx_weights, q_b_proj_weight):
    case offsetof(sneppx_weights, kv_b_proj_weight): /* MLA: nope + v rows per head */
        return Q_ROWS;
    case offsetof(sneppx_weights, k_proj_weight):
    case offsetof(sneppx_weights, k_proj_bias):
    case offsetof(sneppx_weights, v_proj_weight):
    case offsetof(sneppx_weights, v_proj_bias):
        return KV_ROWS;
    case offsetof(sneppx_weights, o_proj_weight):
        return Q_COLUMNS;
    default: /* o_proj's bias (rank 0's), MLA's shared projections and norms */
        return WHOLE;
    }
}

void sneppx_shard_views(const struct sneppx_shard_split *split,
                        const struct sneppx_weight_source whole_sources[SNEPPX_WEIGHT_FIELDS],
                        struct sneppx_weight_source views[SNEPPX_WEIGHT_FIELDS])
{
    sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    /* The shard's tensors and shapes: the whole config validated, so its shard's is too. */
    (void)sneppx_attn_tensors(&split->config, tensors, &count);
    memset(views, 0, sizeof(struct sneppx_weight_source) * SNEPPX_WEIGHT_FIELDS);
    const sneppx_shard_info *info = &split->info;
    for (int i = 0; i < count; i++) {
        const size_t offset = tensors[i].weights_offset;
        const int field = (int)(offset / sizeof(const float *));
        const struct sneppx_weight_source *source = &whole_sources[field];
        const int64_t rows = tensors[i].shape[0], cols = tensors[i].rank == 2 ? tensors[i].shape[1] : 1;
        /* Each follows its heads in blocks of its shard's size: rows (or columns) per head x heads. */
        int64_t row0 = 0, col0 = 0;
        switch (follows_of(offset)) {
        case Q_ROWS:
            row0 = info->q_head_begin / info->q_heads * rows;
            break;
        case KV_ROWS:
            row0 = info->kv_head_begin / info->kv_heads * rows;
            break;
        case Q_COLUMNS:
            col0 = info->q_head_begin / info->q_heads * cols;
            break;
        case WHOLE:
            break;
        }
        views[field] = sneppx_weight_source_view(source, source->cols, row0, rows, col0, cols);
    }
}
