/* Internal: a layer that is a shard of a bigger one (include/sneppx/shard.h).
 * shard_split.c derives a rank's heads, config and weight views (no
 * communication); shard_agree.c holds the collective steps: every rank's verdict
 * on a call, and the sums of the output. Both sit below the layer, which calls
 * them; shard_create.h makes the layer, above it. */
#ifndef SNEPPX_RUNTIME_SHARD_H
#define SNEPPX_RUNTIME_SHARD_H
#include <pthread.h>
#include <stdint.h>

#include "sneppx/shard.h"
#include "weight_source.h"

/* What a sharded layer holds besides an ordinary layer's (layer->shard). */
struct sneppx_layer_shard {
    sneppx_shard shard;     /* rank, world, the transport (the layer releases it) */
    sneppx_shard_info info; /* its heads */
    void *call_records;     /* sneppx_shard_agree's buffer for a forward's call records */
    /* Held through each collective call (forward, cached forward, refusal): the records
     * buffer, the transport's pending sums and the order of its collectives are the
     * shard's, so two threads' calls must not interleave (each pairs whole with the
     * other ranks' calls, in the order this rank makes them). */
    pthread_mutex_t calls;
};

/* ---- shard_split.c -------------------------------------------------------- */

struct sneppx_shard_split {
    sneppx_config config;   /* the shard's: the whole config with the rank's heads */
    sneppx_shard_info info;
};

/* The heads and config of rank of world for a whole config (validated first);
 * SNEPPX_ERR_INVALID_ARGUMENT naming world or rank, listing the sizes that split. */
sneppx_status sneppx_shard_split(const sneppx_config *whole, int rank, int world, struct sneppx_shard_split *split);

/* The shard's views of the whole layer's sources (checked against the whole
 * config, so each knows its whole shape): its rows and columns of each tensor,
 * none of o_proj's bias but on rank 0. */
void sneppx_shard_views(const struct sneppx_shard_split *split,
                        const struct sneppx_weight_source whole_sources[SNEPPX_WEIGHT_FIELDS],
                        struct sneppx_weight_source views[SNEPPX_WEIGHT_FIELDS]);

/* ---- shard_agree.c -------------------------------------------------------- */

/* Every rank's verdict on one collective step. local is this rank's status (its
 * message in sneppx_last_error()); record, `bytes` bytes, is what the ranks must
 * agree on: when every rank is OK, compare(records, stride, world, arg), rank r's
 * record at records + r * stride, returns SNEPPX_OK or an error (the same on every
 * rank, since every rank sees the same records). Returns SNEPPX_OK on every rank,
 * or an error on every rank: a refusing rank keeps its own, the others take the
 * first refusing rank's status and message ("rank R of W: ..."). A failed
 * transport is SNEPPX_ERR_COMM. buffer: sneppx_shard_agree_bytes(world, bytes)
 * bytes of scratch, or NULL to allocate it. */
typedef sneppx_status (*sneppx_shard_compare)(const unsigned char *records, size_t stride, int world, void *arg);
size_t sneppx_shard_agree_bytes(int world, size_t bytes);
sneppx_status sneppx_shard_agree(const sneppx_shard *shard, sneppx_status local, const void *record, size_t bytes,
                                 sneppx_shard_compare compare, void *arg, void *buffer);

/* One forward call as every rank must make it. */
struct sneppx_shard_call {
    int64_t cached;       /* 0: sneppx_layer_forward, 1: sneppx_layer_forward_cached */
    int64_t tokens;
    int64_t batch, seq_len; /* cached: n_seqs and 0 */
    int64_t layer_index;  /* cached: the cache's layer; else 0 */
    int64_t has_mask;
    uint64_t positions;   /* a hash of the call's positions (a forward's default ones hashed as given) */
    uint64_t q_lens;      /* cached: a hash of q_lens (the same total may split otherwise); else 0 */
    uint64_t seq_ids;     /* cached: a hash of seq_ids (the same rows in another order); else 0 */
    int64_t kv_dtype;     /* cached: the cache's sneppx_dtype (a rank rounding its K/V otherwise is another
                           * layer); else 0 */
    uint64_t lengths;     /* cached: a hash of the sequences' cached lengths at layer_index (explicit
                           * positions hide a rank whose cache holds other tokens); else 0 */
    uint64_t inputs;      /* a hash of hidden_states */
    uint64_t mask;        /* a hash of the mask's entries as given, each row's plane hashed alone; 0
                           * without. By value: entries that mask alike but differ (-inf and float's
                           * lowest, NaNs of other payloads) count as different */
};
/* A hash of n values (positions, q_lens, seq_ids), for sneppx_shard_call. */
uint64_t sneppx_shard_hash(const int64_t *values, int64_t n);

/* A hash of n floats by value (-0 as +0), for sneppx_shard_call. */
uint64_t sneppx_shard_hash_floats(const float *values, int64_t n);

/* hash (SNEPPX_SHARD_HASH_START to begin) continued by one value: a hash of a call's
 * parts, such as each row's mask plane, so that one broadcast plane and the same
 * plane given per row hash alike. */
#define SNEPPX_SHARD_HASH_START 0xcbf29ce484222325ULL
uint64_t sneppx_shard_hash_step(uint64_t hash, uint64_t value);

/* sneppx_shard_hash of the positions a forward without position_ids uses (0 .. seq_len - 1
 * in each of the batch's rows), so that one rank passing none and another passing the same
 * positions explicitly agree, as their outputs do. */
uint64_t sneppx_shard_hash_default_positions(int64_t batch, int64_t seq_len);
/* sneppx_shard_agree on call (a layer that is no shard: local). */
sneppx_status sneppx_shard_agree_call(const struct sneppx_layer_shard *shard, sneppx_status local,
                                      const struct sneppx_shard_call *call);

/* Starts summing count floats at data over the ranks, in place / waits for every
 * sum started: SNEPPX_ERR_COMM naming the transport's reason on failure. */
sneppx_status sneppx_shard_sum_start(const struct sneppx_layer_shard *shard, float *data, int64_t count);
sneppx_status sneppx_shard_sum_wait(const struct sneppx_layer_shard *shard);

/* Releases the transport and frees shard (NULL: nothing). */
void sneppx_shard_free(struct sneppx_layer_shard *shard);
/* Releases a transport not (or no longer) held by a layer. */
void sneppx_shard_release(const sneppx_shard *shard);

#endif
