/* Making a shard: every rank checks its arguments and derives its heads; the
 * ranks agree on the config, the weights' kind and the split (one all-gather,
 * before any kernel compiles); each packs its rows and columns of the whole
 * tensors as an ordinary layer of its heads; and the ranks agree on the result,
 * so that a rank that could not make its layer fails every rank's create. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "error.h"
#include "layer_internal.h"
#include "shard_create.h"
#include "weights.h"

/* What every rank's create must share. */
struct create_record {
    sneppx_config config; /* compared value by value (padding never counts) */
    int32_t rank, world;
    int32_t weights;      /* enum sneppx_shard_weights */
    int32_t pad;
    int64_t layer_index;
};

static const char *weights_name(int32_t weights)
{
    switch (weights) {
    case SNEPPX_SHARD_SYNTHETIC: return "synthetic weights (NULL)";
    case SNEPPX_SHARD_FLOAT32: return "float32 tensors";
    case SNEPPX_SHARD_TYPED: return "typed tensors";
    case SNEPPX_SHARD_CHECKPOINT: return "a checkpoint";
    }
    return "no weights";
}

static sneppx_status compare_creates(const unsigned char *records, size_t stride, int world, void *arg)
{
    (void)arg;
    struct create_record first, other;
    memcpy(&first, records, sizeof first);
    /* Execution choices a rank may make for itself: they change no result beyond rounding. */
    static const size_t own_choices[] = {offsetof(sneppx_config, num_threads),
                                         offsetof(sneppx_config, use_flash_attn)};
    for (int r = 0; r < world; r++) {
        memcpy(&other, records + (size_t)r * stride, sizeof other);
        if (other.rank != r || other.world != world)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "shard: the transport's rank %d of %d says it is rank %d of %d (shard.rank and "
                               "shard.world must be the transport's)",
                               r, world, (int)other.rank, (int)other.world);
        if (r == 0)
            continue;
        if (other.weights != first.weights)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "weights: rank %d of %d gives %s, rank 0 %s: every rank of a sharded layer reads the "
                               "same weights",
                               r, world, weights_name(other.weights), weights_name(first.weights));
        if (other.layer_index != first.layer_index)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "layer_index: rank %d of %d loads layer %lld, rank 0 layer %lld: every rank of a "
                               "sharded layer reads the same weights",
                               r, world, (long long)other.layer_index, (long long)first.layer_index);
        char difference[256];
        if (sneppx_config_difference(&other.config, &first.config, own_choices,
                                     (int)(sizeof own_choices / sizeof own_choices[0]), difference,
                                     sizeof difference))
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config: rank %d of %d's differs from rank 0's: %s (rank %d / rank 0); every rank of "
                               "a sharded layer needs the same config (num_threads and use_flash_attn aside)",
                               r, world, difference, r);
    }
    return SNEPPX_OK;
}

sneppx_status sneppx_shard_check_argument(const sneppx_shard *shard)
{
    if (!shard)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "shard: must not be NULL");
    const sneppx_shard_transport *t = &shard->transport;
    sneppx_status status = SNEPPX_OK;
    if (!t->allgather || !t->sum_start || !t->sum_wait)
        status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "shard.transport.%s: must not be NULL",
                             !t->allgather ? "allgather" : !t->sum_start ? "sum_start" : "sum_wait");
    else if (shard->world < 1 || shard->world > SNEPPX_MAX_HEADS)
        status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "shard.world: %d is outside [1, %lld]", shard->world,
                             (long long)SNEPPX_MAX_HEADS);
    else if (shard->rank < 0 || shard->rank >= shard->world)
        status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "shard.rank: %d is outside [0, %d)", shard->rank,
                             shard->world);
    if (status != SNEPPX_OK)
        sneppx_shard_release(shard);
    return status;
}

sneppx_status sneppx_shard_create(const sneppx_config *config, sneppx_status local,
                                  struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS],
                                  enum sneppx_shard_weights weights, int64_t layer_index, const sneppx_shard *shard,
                                  sneppx_layer **out)
{
    struct sneppx_shard_split split;
    struct sneppx_weight_source views[SNEPPX_WEIGHT_FIELDS];
    memset(&split, 0, sizeof split);
    if (local == SNEPPX_OK && !out)
        local = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: output pointer must not be NULL");
    /* The whole layer's tensors against the whole config (which this validates), then the split. */
    if (local == SNEPPX_OK)
        local = sneppx_weight_sources_check(config, sources);
    if (local == SNEPPX_OK)
        local = sneppx_shard_split(config, shard->rank, shard->world, &split);
    if (local == SNEPPX_OK)
        sneppx_shard_views(&split, sources, views);

    struct create_record record;
    memset(&record, 0, sizeof record);
    if (config)
        record.config = *config;
    record.rank = shard->rank;
    record.world = shard->world;
    record.weights = (int32_t)weights;
    record.layer_index = layer_index;
    sneppx_status status = sneppx_shard_agree(shard, local, &record, sizeof record, compare_creates, NULL, NULL);
    const int agreed = status == SNEPPX_OK; /* on every rank, or on none */

    sneppx_layer *layer = NULL;
    struct sneppx_layer_shard *held = NULL;
    if (status == SNEPPX_OK)
        status = sneppx_layer_create_from_sources(&split.config, views, &layer);
    if (status == SNEPPX_OK) {
        held = calloc(1, sizeof *held);
        if (held) {
            pthread_mutex_init(&held->calls, NULL);
            held->call_records = calloc(1, sneppx_shard_agree_bytes(shard->world, sizeof(struct sneppx_shard_call)));
        }
        if (!held || !held->call_records)
            status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "shard: out of memory");
    }
    /* Every rank made its layer? */
    if (agreed)
        status = sneppx_shard_agree(shard, status, NULL, 0, NULL, NULL, NULL);
    if (status != SNEPPX_OK) {
        sneppx_layer_destroy(layer);
        if (held) {
            pthread_mutex_destroy(&held->calls);
            free(held->call_records);
        }
        free(held);
        sneppx_shard_release(shard);
        return status;
    }
    held->shard = *shard;
    held->info = split.info;
    layer->shard = held;
    *out = layer;
    return SNEPPX_OK;
}

sneppx_status sneppx_layer_create_shard(const sneppx_config *config, const sneppx_weights *weights,
                                        const sneppx_shard *shard, sneppx_layer **out)
{
    sneppx_clear_error();
    if (out)
        *out = NULL;
    sneppx_status status = sneppx_shard_check_argument(shard);
    if (status != SNEPPX_OK)
        return status;
    struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS] = {{0}};
    status = config ? SNEPPX_OK : sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    if (status == SNEPPX_OK && weights)
        sneppx_float32_sources(weights, sources);
    else if (status == SNEPPX_OK)
        status = sneppx_synthetic_sources(config, sources);
    return sneppx_shard_create(config, status, sources, weights ? SNEPPX_SHARD_FLOAT32 : SNEPPX_SHARD_SYNTHETIC, 0,
                               shard, out);
}

sneppx_status sneppx_layer_create_shard_typed(const sneppx_config *config, const sneppx_typed_weights *weights,
                                              const sneppx_shard *shard, sneppx_layer **out)
{
    sneppx_clear_error();
    if (out)
        *out = NULL;
    sneppx_status status = sneppx_shard_check_argument(shard);
    if (status != SNEPPX_OK)
        return status;
    struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS] = {{0}};
    status = config ? sneppx_typed_sources(weights, sources)
                    : sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    return sneppx_shard_create(config, status, sources, SNEPPX_SHARD_TYPED, 0, shard, out);
}

sneppx_status sneppx_layer_shard_info(const sneppx_layer *layer, sneppx_shard_info *info)
{
    sneppx_clear_error();
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: must not be NULL");
    if (!info)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "info: must not be NULL");
    if (layer->shard) {
        *info = layer->shard->info;
        return SNEPPX_OK;
    }
    const sneppx_config *c = &layer->config;
    info->rank = 0;
    info->world = 1;
    info->q_head_begin = info->kv_head_begin = 0;
    info->q_heads = c->num_attention_heads;
    info->kv_heads = c->kv_lora_rank > 0 ? c->num_attention_heads : c->num_key_value_heads;
    return SNEPPX_OK;
}
