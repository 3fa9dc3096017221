/* Internal: the collective create of a sharded layer (shard_create.c), above the
 * layer it makes, beside shard_refuse.c's public refusal; the checkpoint reader
 * creates through it too. shard.h's steps sit below the layer. */
#ifndef SNEPPX_RUNTIME_SHARD_CREATE_H
#define SNEPPX_RUNTIME_SHARD_CREATE_H
#include <stdint.h>

#include "shard.h"

/* What a rank's weights are, which every rank must share. */
enum sneppx_shard_weights { SNEPPX_SHARD_SYNTHETIC = 1, SNEPPX_SHARD_FLOAT32, SNEPPX_SHARD_TYPED, SNEPPX_SHARD_CHECKPOINT };

/* Checks shard itself (local: the transport cannot be trusted before this):
 * SNEPPX_OK, or an error naming it, the transport released. */
sneppx_status sneppx_shard_check_argument(const sneppx_shard *shard);

/* The collective create after the public entry's own checks: local is this
 * rank's verdict so far (SNEPPX_OK: config is non-NULL and sources hold the whole
 * layer's tensors, not yet checked against it). Releases the transport unless it
 * returns a layer in *out (out may be NULL: refused). */
sneppx_status sneppx_shard_create(const sneppx_config *config, sneppx_status local,
                                  struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS],
                                  enum sneppx_shard_weights weights, int64_t layer_index, const sneppx_shard *shard,
                                  sneppx_layer **out);

#endif
