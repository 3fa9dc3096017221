/* The collective steps of a sharded layer: every rank's verdict on a call
 * (one all-gather of a small record; a second, of messages, only when a rank
 * refused), and the sums of the output through the transport. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sneppx/config.h"
#include "error.h"
#include "shard.h"

/* A refusing rank's message as the others repeat it. */
#define MESSAGE_BYTES 768

static sneppx_status transport_failed(const char *step, const char *reason)
{
    return sneppx_fail(SNEPPX_ERR_COMM, "shard transport: %s failed: %s", step,
                       reason[0] ? reason : "(no reason given)");
}

static sneppx_status allgather(const sneppx_shard *shard, const void *mine, void *all, size_t bytes)
{
    char reason[512] = "";
    const sneppx_shard_transport *t = &shard->transport;
    if (t->allgather(t->context, mine, all, bytes, reason, sizeof reason) != 0)
        return transport_failed("allgather", reason);
    return SNEPPX_OK;
}

/* Every rank's status leads its record. */
struct entry_head {
    int32_t status;
    int32_t pad;
};

static size_t entry_bytes(size_t bytes) { return sizeof(struct entry_head) + (bytes + 7) / 8 * 8; }

size_t sneppx_shard_agree_bytes(int world, size_t bytes) { return ((size_t)world + 1) * entry_bytes(bytes); }

/* The rank that refused first, or -1, and its status. */
static int first_refusing(const unsigned char *all, size_t entry, int world, sneppx_status *refused)
{
    for (int r = 0; r < world; r++) {
        struct entry_head h;
        memcpy(&h, all + (size_t)r * entry, sizeof h);
        if (h.status != SNEPPX_OK) {
            *refused = (sneppx_status)h.status;
            return r;
        }
    }
    return -1;
}

/* The second step, once every rank knows that `refusing` refused: its message to all. */
static sneppx_status repeat_refusal(const sneppx_shard *shard, sneppx_status local, const char *own_message,
                                    int refusing, sneppx_status refused)
{
    const int world = shard->world;
    char *messages = calloc((size_t)world + 1, MESSAGE_BYTES);
    if (!messages) /* as in sneppx_shard_agree: the others then wait on this rank */
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "shard: no memory for %d ranks' messages", world);
    char *own = messages + (size_t)world * MESSAGE_BYTES;
    snprintf(own, MESSAGE_BYTES, "%s", local != SNEPPX_OK ? own_message : "");
    sneppx_status status = allgather(shard, own, messages, MESSAGE_BYTES);
    if (status == SNEPPX_OK) {
        if (local != SNEPPX_OK) /* this rank's own message stands */
            status = sneppx_fail(local, "%s", own_message);
        else
            status = sneppx_fail(refused, "rank %d of %d: %.*s", refusing, world, MESSAGE_BYTES,
                                 messages + (size_t)refusing * MESSAGE_BYTES);
    }
    free(messages);
    return status;
}

sneppx_status sneppx_shard_agree(const sneppx_shard *shard, sneppx_status local, const void *record, size_t bytes,
                                 sneppx_shard_compare compare, void *arg, void *buffer)
{
    const size_t entry = entry_bytes(bytes);
    const int world = shard->world;
    unsigned char *all = buffer ? buffer : calloc(1, sneppx_shard_agree_bytes(world, bytes));
    /* Without memory this rank cannot take part: the others then wait on it as on a
     * rank that died. A warm forward passes its layer's buffer, so it never gets here. */
    if (!all)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "shard: no memory for %d ranks' records", world);
    unsigned char *mine = all + (size_t)world * entry;
    memset(mine, 0, entry);
    const struct entry_head head = {(int32_t)local, 0};
    memcpy(mine, &head, sizeof head);
    if (bytes)
        memcpy(mine + sizeof head, record, bytes);
    char own_message[MESSAGE_BYTES];
    snprintf(own_message, sizeof own_message, "%s", sneppx_last_error());
    sneppx_status status = allgather(shard, mine, all, entry);
    sneppx_status refused = SNEPPX_OK;
    const int refusing = status == SNEPPX_OK ? first_refusing(all, entry, world, &refused) : -1;
    if (refusing >= 0)
        status = repeat_refusal(shard, local, own_message, refusing, refused);
    else if (status == SNEPPX_OK && compare)
        status = compare(all + sizeof head, entry, world, arg);
    if (!buffer)
        free(all);
    return status;
}

uint64_t sneppx_shard_hash_step(uint64_t hash, uint64_t value)
{
    /* FNV-1a's step, then the high half folded into the low one: a multiply only
     * carries upward, so without the fold a difference in a value's top bits (the sign
     * of the first float of a pair) stays there, and two of them cancel. */
    hash = (hash ^ value) * 0x100000001b3ULL;
    return hash ^ hash >> 32;
}

/* A float's bits, -0 as +0 (the same value). */
static uint32_t float_bits(float value)
{
    const float canonical = value + 0.0f;
    uint32_t bits;
    memcpy(&bits, &canonical, sizeof bits);
    return bits;
}

uint64_t sneppx_shard_hash_floats(const float *values, int64_t n)
{
    /* Four independent lanes of two floats a step, folded at the end: a multiply's
     * latency a step bounds one lane, and a prefill's hidden_states (2048 x 4096
     * floats) then hashes in a few ms on one core. */
    uint64_t lanes[4] = {SNEPPX_SHARD_HASH_START, SNEPPX_SHARD_HASH_START ^ 1, SNEPPX_SHARD_HASH_START ^ 2,
                         SNEPPX_SHARD_HASH_START ^ 3};
    const int64_t whole = n - n % 8;
    for (int64_t i = 0; i < whole; i += 8)
        for (int lane = 0; lane < 4; lane++)
            lanes[lane] = sneppx_shard_hash_step(lanes[lane], (uint64_t)float_bits(values[i + 2 * lane]) << 32 |
                                                                  float_bits(values[i + 2 * lane + 1]));
    uint64_t hash = SNEPPX_SHARD_HASH_START;
    for (int lane = 0; lane < 4; lane++)
        hash = sneppx_shard_hash_step(hash, lanes[lane]);
    for (int64_t i = whole; i < n; i++)
        hash = sneppx_shard_hash_step(hash, float_bits(values[i]));
    return hash;
}

uint64_t sneppx_shard_hash(const int64_t *values, int64_t n)
{
    uint64_t hash = SNEPPX_SHARD_HASH_START;
    for (int64_t i = 0; i < n; i++)
        hash = sneppx_shard_hash_step(hash, (uint64_t)values[i]);
    return hash;
}

uint64_t sneppx_shard_hash_default_positions(int64_t batch, int64_t seq_len)
{
    uint64_t hash = SNEPPX_SHARD_HASH_START;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = 0; t < seq_len; t++)
            hash = sneppx_shard_hash_step(hash, (uint64_t)t);
    return hash;
}

static sneppx_status compare_calls(const unsigned char *records, size_t stride, int world, void *arg)
{
    (void)arg;
    struct sneppx_shard_call first, call;
    const struct sneppx_shard_call *c = &call;
    memcpy(&first, records, sizeof first);
    for (int r = 1; r < world; r++) {
        memcpy(&call, records + (size_t)r * stride, sizeof call);
        if (c->cached != first.cached)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "layer: rank %d of %d runs %s, rank 0 %s: every rank of a sharded layer makes the "
                               "same calls in the same order",
                               r, world, c->cached ? "a cached forward" : "a forward",
                               first.cached ? "a cached forward" : "a forward");
        if (!c->cached && (c->batch != first.batch || c->seq_len != first.seq_len))
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "hidden_states: rank %d of %d runs batch %lld x seq_len %lld, rank 0 batch %lld x "
                               "seq_len %lld: every rank of a sharded layer makes the same call",
                               r, world, (long long)c->batch, (long long)c->seq_len, (long long)first.batch,
                               (long long)first.seq_len);
        if (c->cached && (c->batch != first.batch || c->tokens != first.tokens))
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "q_lens: rank %d of %d runs %lld sequences of %lld tokens in all, rank 0 %lld of %lld: "
                               "every rank of a sharded layer makes the same call",
                               r, world, (long long)c->batch, (long long)c->tokens, (long long)first.batch,
                               (long long)first.tokens);
        if (c->seq_ids != first.seq_ids)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "seq_ids: rank %d of %d's differ from rank 0's (%lld sequences on each): every rank "
                               "of a sharded layer makes the same call",
                               r, world, (long long)c->batch);
        if (c->q_lens != first.q_lens)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "q_lens: rank %d of %d's differ from rank 0's (%lld tokens in all on each): every "
                               "rank of a sharded layer makes the same call",
                               r, world, (long long)c->tokens);
        if (c->kv_dtype != first.kv_dtype)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "cache: rank %d of %d's holds %s, rank 0's %s: every rank of a sharded layer caches "
                               "its K/V in the same dtype",
                               r, world, sneppx_dtype_name((int)c->kv_dtype), sneppx_dtype_name((int)first.kv_dtype));
        if (c->layer_index != first.layer_index)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "layer_index: rank %d of %d passes %lld, rank 0 %lld: every rank of a sharded layer "
                               "makes the same call",
                               r, world, (long long)c->layer_index, (long long)first.layer_index);
        if (c->lengths != first.lengths)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "cache: rank %d of %d's sequences hold other lengths than rank 0's (%lld sequences "
                               "at layer_index %lld): every rank of a sharded layer appends the same tokens to its "
                               "cache",
                               r, world, (long long)c->batch, (long long)c->layer_index);
        if (c->has_mask != first.has_mask)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "%s: rank %d of %d passes %s, rank 0 %s: every rank of a sharded layer makes the same "
                               "call",
                               c->cached ? "masks" : "attention_mask", r, world, c->has_mask ? "one" : "none",
                               first.has_mask ? "one" : "none");
        if (c->positions != first.positions)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "position_ids: rank %d of %d's positions differ from rank 0's: every rank of a "
                               "sharded layer makes the same call",
                               r, world);
        if (c->inputs != first.inputs)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "hidden_states: rank %d of %d's differ from rank 0's: every rank of a sharded layer "
                               "makes the same call (each computes its heads of the same input)",
                               r, world);
        if (c->mask != first.mask)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "%s: rank %d of %d's entries differ from rank 0's: every rank of a sharded layer "
                               "makes the same call",
                               c->cached ? "masks" : "attention_mask", r, world);
    }
    return SNEPPX_OK;
}

sneppx_status sneppx_shard_agree_call(const struct sneppx_layer_shard *shard, sneppx_status local,
                                      const struct sneppx_shard_call *call)
{
    if (!shard)
        return local;
    return sneppx_shard_agree(&shard->shard, local, call, sizeof *call, compare_calls, NULL, shard->call_records);
}

sneppx_status sneppx_shard_sum_start(const struct sneppx_layer_shard *shard, float *data, int64_t count)
{
    char reason[512] = "";
    const sneppx_shard_transport *t = &shard->shard.transport;
    if (t->sum_start(t->context, data, count, reason, sizeof reason) != 0)
        return transport_failed("sum", reason);
    return SNEPPX_OK;
}

sneppx_status sneppx_shard_sum_wait(const struct sneppx_layer_shard *shard)
{
    char reason[512] = "";
    const sneppx_shard_transport *t = &shard->shard.transport;
    if (t->sum_wait(t->context, reason, sizeof reason) != 0)
        return transport_failed("sum", reason);
    return SNEPPX_OK;
}

void sneppx_shard_release(const sneppx_shard *shard)
{
    if (shard && shard->transport.release)
        shard->transport.release(shard->transport.context);
}

void sneppx_shard_free(struct sneppx_layer_shard *shard)
{
    if (!shard)
        return;
    sneppx_shard_release(&shard->shard);
    pthread_mutex_destroy(&shard->calls);
    free(shard->call_records);
    free(shard);
}
