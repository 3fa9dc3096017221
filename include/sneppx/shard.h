/* Tensor parallelism: one attention layer split by heads over `world` processes
 * (Megatron-style), whatever carries the data between them. Each process, a
 * "rank", holds a shard:
 *
 *   - its query heads' rows of q_proj (MLA: q_proj or q_b_proj, and kv_b_proj),
 *   - the K/V heads those query heads read (k_proj, v_proj): whole K/V groups, so
 *     when world exceeds num_key_value_heads a K/V head is replicated on the
 *     world / num_key_value_heads ranks that share its group,
 *   - the matching columns of o_proj (rank 0 alone adds its bias),
 *   - whole copies of what every head shares (MLA's q_a_proj, kv_a_proj_with_mqa
 *     and both layernorms).
 *
 * Biases follow their rows. A forward (or cached forward) runs the rank's heads
 * and sums the shards' [tokens, hidden] outputs in place through the transport,
 * so every rank returns the whole layer's output. The sums start in chunks of
 * rows as the O projection writes them, overlapping the rest of the GEMM.
 *
 * Collective calls: every rank makes the same calls on its shard, in the same
 * order, with the same arguments (hidden states included): create (two
 * all-gathers), sneppx_layer_forward and sneppx_layer_forward_cached (one small
 * all-gather, then the sums). The all-gather compares what can differ silently:
 * the shape, the mask's presence, hashes of the hidden states, of the mask's
 * entries and of the positions and, cached, the layer index, the cache's dtype,
 * hashes of seq_ids and q_lens and of the lengths the cache holds for them.
 * A call one rank refuses (a bad argument, a full KV
 * cache, another config, a call that differs) fails on every rank, before anything is written: the
 * refusing rank with its own message, the others with "rank R of W: <its
 * message>". A transport that fails is SNEPPX_ERR_COMM. Other calls on a shard
 * (set_flash, keys, flops, weight_bytes, destroy) are local. Collective calls made
 * on one shard from several threads run one at a time, each paired whole with one
 * call of every other rank in the order each rank makes them.
 *
 * A shard's sneppx_layer_config() is the shard's config: the full config with the
 * rank's num_attention_heads and num_key_value_heads (head_dim made explicit, o_bias
 * on rank 0 only). Make its KV cache from that config: it holds the rank's K/V
 * heads only (MLA: the whole latent rows, which every head reads).
 *
 * include/sneppx/mpi.h is a transport over an MPI communicator; this header is
 * what any other needs. */
#ifndef SNEPPX_SHARD_H
#define SNEPPX_SHARD_H

#include <stddef.h>
#include <stdint.h>
#include "sneppx/config.h"
#include "sneppx/export.h"
#include "sneppx/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What moves data between the ranks. Each function returns 0, or nonzero with a
 * NUL-terminated reason in error (at most error_size bytes), which the layer
 * reports as SNEPPX_ERR_COMM. The layer calls them from the thread that called it,
 * outside its parallel regions. */
typedef struct sneppx_shard_transport {
    void *context;
    /* Every rank's `bytes` bytes at mine into all (world x bytes, in rank order). */
    int (*allgather)(void *context, const void *mine, void *all, size_t bytes, char *error, size_t error_size);
    /* Starts summing count floats at data over the ranks, in place, and may return
     * before the sum is done; the layer touches data again only after sum_wait. */
    int (*sum_start)(void *context, float *data, int64_t count, char *error, size_t error_size);
    /* Waits for every sum started since the last wait. */
    int (*sum_wait)(void *context, char *error, size_t error_size);
    /* Frees context; NULL if there is nothing to free. */
    void (*release)(void *context);
} sneppx_shard_transport;

typedef struct sneppx_shard {
    int rank;  /* this process's, in [0, world) */
    int world; /* ranks the layer is split over: see sneppx_shard_check */
    sneppx_shard_transport transport;
} sneppx_shard;

/* SNEPPX_OK if config's heads split over world ranks: world divides
 * num_attention_heads, and either divides num_key_value_heads or is a multiple
 * of it (each rank then holds whole K/V groups); MLA: world divides
 * num_attention_heads. Otherwise SNEPPX_ERR_INVALID_ARGUMENT naming world and
 * listing every size that splits. Local (no transport). */
SNEPPX_API sneppx_status sneppx_shard_check(const sneppx_config *config, int world);

/* sneppx_layer_create, sneppx_layer_create_typed and
 * sneppx_layer_create_from_safetensors for rank shard->rank of shard->world.
 * config and the weights are the whole layer's (every rank passes the same);
 * each rank reads only its shard's rows and columns of them (a checkpoint: with
 * pread, row by row where it needs columns), so resident weights per rank are
 * about 1/world of the layer's, plus MLA's shared projections. NULL weights are
 * the synthetic ones of the whole layer, indexed by the whole tensor's (row,
 * column): the shards of a synthetic layer sum to exactly its output (int8
 * weight_dtype: only where each rank's o_proj columns are a multiple of 32, since a
 * shard's int8 groups of 32 start at its own first column). Collective;
 * checks that every rank has the same config (num_threads and use_flash_attn
 * aside, which may differ per rank), weights of the same kind and the same
 * layer_index, naming the first value that differs.
 * The layer takes shard->transport: it calls release when destroyed, and a call
 * that returns no layer calls it before returning (after any communication).
 * Destroy shards before the transport's own teardown (MPI_Finalize). */
SNEPPX_API sneppx_status sneppx_layer_create_shard(const sneppx_config *config, const sneppx_weights *weights,
                                                   const sneppx_shard *shard, sneppx_layer **layer);
SNEPPX_API sneppx_status sneppx_layer_create_shard_typed(const sneppx_config *config,
                                                         const sneppx_typed_weights *weights,
                                                         const sneppx_shard *shard, sneppx_layer **layer);
SNEPPX_API sneppx_status sneppx_layer_create_shard_from_safetensors(const sneppx_config *config, const char *path,
                                                                    int64_t layer_index, const sneppx_shard *shard,
                                                                    sneppx_layer **layer);

/* Which heads a shard holds. */
typedef struct sneppx_shard_info {
    int rank, world;          /* 0 and 1 for a layer that is not a shard */
    int64_t q_head_begin;     /* its query heads: [q_head_begin, q_head_begin + q_heads) of the whole layer's */
    int64_t q_heads;
    int64_t kv_head_begin;    /* its K/V heads (MLA: the query heads again; the latent is shared) */
    int64_t kv_heads;
} sneppx_shard_info;

/* The shard's heads (a layer that is no shard: all of them, rank 0 of 1). */
SNEPPX_API sneppx_status sneppx_layer_shard_info(const sneppx_layer *layer, sneppx_shard_info *info);

/* Refuses, on this rank, the forward or cached forward the other ranks are
 * calling: for a caller (a binding) that checks arguments before calling and
 * finds them wrong. It takes the call's place in the collective agreement, so
 * the others fail with "rank R of W: <message>" (status as given) instead of
 * waiting for this rank, and nothing is written anywhere. Returns status, with
 * message as this rank's error. status: an error status other than
 * SNEPPX_ERR_COMM, message non-NULL (else the refusal is SNEPPX_ERR_INVALID_ARGUMENT
 * naming the one that is wrong, still collective). A layer that is no shard:
 * local, returns status. */
SNEPPX_API sneppx_status sneppx_layer_shard_refuse(sneppx_layer *layer, sneppx_status status, const char *message);

#ifdef __cplusplus
}
#endif
#endif
