/* Fuzzes the paged KV cache as a caller drives it: the input's first bytes
 * pick a tiny layer (hidden 32, 2 heads, 1 K/V head of head_dim 16; or a
 * sliding window of 6; or MLA with a latent of 16 + 16) with 1 or 2 threads,
 * flash or SDPA, and a cache of 2 layers (pages of 1 to 8 tokens, a pool of 2
 * to 12 pages, float32 / bfloat16 / float16 / int8, a page table sized for the
 * pool or for 4 tokens; or, flag bit 7, a long cache: pages of 64, prefills of
 * 128 to 448 tokens, max_position_embeddings 1024, so that decode over 512
 * held keys or more splits them across key ranges merged by log-sum-exp);
 * the rest is a sequence of operations on that cache:
 * add, remove, fork, truncate (one sequence, or up to 4 at once, all or
 * none), reset, a cached forward over a ragged set of
 * sequences at layer 0 or 1, with NULL masks or (the op byte's high nibble)
 * a plane per sequence: NULL, the causal (+ window) mask written out, that
 * with holes and biases, any entries (keys after the query's own among them),
 * or one that shows a token the window released (and bad arguments: layer
 * index 2 or -1, no sequences, unknown or removed ids, duplicates, q_len 0,
 * positions below 0 or past max_position_embeddings 64, such a mask, more
 * pages than the pool has), read, and the length queries.
 *
 * The harness keeps a model of the cache: each sequence's length per layer,
 * its released pages, its page table over pages with refcounts (copy-on-write
 * as kv_cache.h describes it), and every K/V row it still holds. Promises,
 * checked after every operation:
 *   - a call succeeds or fails as the model says (a failure with
 *     SNEPPX_ERR_INVALID_ARGUMENT, or SNEPPX_ERR_OUT_OF_MEMORY for a full pool);
 *     a refused forward writes nothing to out;
 *   - a failed call changes nothing, and no call changes a row it did not
 *     append: every live sequence's held rows, both layers, read back
 *     byte-identical to the model (a fork's are its parent's);
 *   - lengths and the first held token match the model, reads outside the held
 *     tokens are refused;
 *   - the stats' free pages are the pool minus the pages the model's
 *     sequences hold (free + held = pool), and the live sequences count;
 *   - a forward's new rows are byte-identical to those a fresh cache holds
 *     after the same call (the same rows and positions, as new sequences:
 *     other pages, other pasts; a row's projection may differ by an fp32
 *     rounding with the call's other rows, so the call is the same), and
 *     with float32 rows its output matches the cache-free forward over the
 *     tokens the sequence holds to 1e-4 of the output's size (the queries'
 *     windows are held, so that is the whole sequence's answer; with a plane,
 *     the forward whose mask has the plane's rows from the first held key on).
 * Rows are compared with every held row of every sequence after every
 * operation, so a row is checked against the fresh cache once, when appended,
 * and against the model from then on. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sneppx/config.h"
#include "sneppx/kv_cache.h"
#include "sneppx/layer.h"

#define HIDDEN 32
#define MAX_POSITIONS 64
#define LONG_POSITIONS 1024 /* the long caches' layers */
#define WINDOW 6
#define NUM_LAYERS 2
#define MAX_PAGES 12
#define MAX_PAGE_SIZE 8
#define LONG_PAGE_SIZE 64 /* a long cache's pages */
#define MAX_TOKENS_HELD (MAX_PAGES * LONG_PAGE_SIZE) /* a sequence holds at most the pool */
#define MAX_SEQS 8
#define MAX_DEAD 16
#define MAX_CALL_SEQS 4
#define SHORT_Q_LEN 23 /* past SNEPPX_DECODE_MAX_QUERIES (16): the gathered path too */
#define MAX_Q_LEN 448 /* a long cache's prefill: 128 to 448 */
#define K_FLOATS 32  /* the most floats of K (MLA: of a latent row) one token holds */
#define V_FLOATS 16

/* Reads the input a byte at a time; past its end, zeros. */
struct reader {
    const uint8_t *data;
    size_t size, at;
};

static unsigned next(struct reader *r) { return r->at < r->size ? r->data[r->at++] : 0; }

/* ---- the layers, made once per process (kernels compile at first use) ---- */

enum { STANDARD, WINDOWED, MLA, KINDS };
static sneppx_layer *layers[KINDS][2][2];

/* long: max_position_embeddings LONG_POSITIONS, for a long cache. */
static sneppx_layer *layer_of(int kind, int threads, int long_cache)
{
    sneppx_layer **layer = &layers[kind][threads - 1][long_cache];
    if (*layer)
        return *layer;
    sneppx_config config;
    sneppx_config_init(&config);
    snprintf(config.name, sizeof config.name, "fuzz-kv");
    config.hidden_size = HIDDEN;
    config.num_attention_heads = 2;
    config.max_position_embeddings = long_cache ? LONG_POSITIONS : MAX_POSITIONS;
    config.num_threads = threads;
    if (kind == MLA) {
        config.num_key_value_heads = 2;
        config.kv_lora_rank = 16;
        config.qk_rope_head_dim = 16;
        config.qk_nope_head_dim = 16;
        config.v_head_dim = 16;
    } else {
        config.num_key_value_heads = 1;
        config.head_dim = 16;
        config.sliding_window = kind == WINDOWED ? WINDOW : 0;
    }
    sneppx_status status = sneppx_layer_create(&config, NULL, layer);
    FUZZ_ASSERT(status == SNEPPX_OK, "the harness's layer %d: %s", kind, sneppx_last_error());
    return *layer;
}

/* ---- the model ---- */

struct model_seq {
    int64_t id;
    int64_t length[NUM_LAYERS];
    int64_t released;           /* pages released from the front */
    int held;
    int pages[MAX_PAGES + 1];   /* model page numbers */
    /* Per layer, the held tokens [released * page_size, length): what made them
     * (seed of the hidden row, position) and the rows the cache holds; arrays of
     * the pool's tokens in `block`. */
    uint32_t *seed[NUM_LAYERS];
    int64_t *position[NUM_LAYERS];
    float (*k[NUM_LAYERS])[K_FLOATS];
    float (*v[NUM_LAYERS])[V_FLOATS];
    void *block;
};

/* Bytes of the seeds of `tokens` tokens, rounded up so that the next layer's arrays stay aligned. */
static size_t seed_bytes(int64_t tokens) { return ((size_t)tokens * sizeof(uint32_t) + 7) / 8 * 8; }

/* Bytes of the arrays of a sequence that holds at most `tokens` tokens. */
static size_t model_block_bytes(int64_t tokens)
{
    return NUM_LAYERS * ((size_t)tokens * (sizeof(float[K_FLOATS]) + sizeof(float[V_FLOATS]) + sizeof(int64_t)) +
                         seed_bytes(tokens));
}

/* q's arrays in a new block (a copy of from's, or zeros). */
static void model_block(struct model_seq *q, int64_t tokens, const struct model_seq *from)
{
    const size_t bytes = model_block_bytes(tokens);
    char *at = from ? malloc(bytes) : calloc(1, bytes);
    FUZZ_ASSERT(at, "out of memory");
    if (from)
        memcpy(at, from->block, bytes);
    q->block = at;
    for (int l = 0; l < NUM_LAYERS; l++) {
        q->k[l] = (void *)at, at += (size_t)tokens * sizeof(float[K_FLOATS]);
        q->v[l] = (void *)at, at += (size_t)tokens * sizeof(float[V_FLOATS]);
        q->position[l] = (void *)at, at += (size_t)tokens * sizeof(int64_t);
        q->seed[l] = (void *)at, at += seed_bytes(tokens);
    }
}

struct state {
    sneppx_layer *layer;
    sneppx_kv_cache *cache, *fresh;
    int kind;
    int64_t page_size, page_shift, pool, window;
    int long_cache;              /* pages of 64 and long prefills: split-KV decode */
    int64_t max_positions;
    int64_t k_floats, v_floats;  /* per token, as read */
    int float32;
    int refcount[MAX_PAGES];
    struct model_seq *seqs[MAX_SEQS];
    int live;
    int64_t dead[MAX_DEAD];      /* ids removed (or reset away): unknown forever */
    int dead_count;
    uint32_t next_seed;
};

static int64_t pages_for(const struct state *s, int64_t length)
{
    return (length + s->page_size - 1) >> s->page_shift;
}

static int64_t first_held(const struct state *s, const struct model_seq *q) { return q->released * s->page_size; }

static int64_t smallest(const struct model_seq *q)
{
    return q->length[0] < q->length[1] ? q->length[0] : q->length[1];
}

static int64_t largest(const struct model_seq *q)
{
    return q->length[0] > q->length[1] ? q->length[0] : q->length[1];
}

static int free_pages(const struct state *s)
{
    int n = 0;
    for (int p = 0; p < s->pool; p++)
        n += s->refcount[p] == 0;
    return n;
}

static int page_take(struct state *s)
{
    for (int p = 0; p < s->pool; p++)
        if (s->refcount[p] == 0) {
            s->refcount[p] = 1;
            return p;
        }
    FUZZ_ASSERT(0, "the model took a page from a full pool");
    return -1;
}

/* The hidden row of a token seed: values in [-1, 1). */
static void hidden_row(uint32_t seed, float *row)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int h = 0; h < HIDDEN; h++) {
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 29;
        row[h] = (float)(int)(x >> 56 & 0xff) / 128.0f - 1.0f;
    }
}

static void forget(struct state *s, int index)
{
    if (s->dead_count < MAX_DEAD)
        s->dead[s->dead_count++] = s->seqs[index]->id;
    else
        s->dead[s->seqs[index]->id % MAX_DEAD] = s->seqs[index]->id;
    free(s->seqs[index]->block);
    free(s->seqs[index]);
    s->seqs[index] = s->seqs[--s->live];
}

static void unref_all(struct state *s, struct model_seq *q)
{
    for (int i = 0; i < q->held; i++)
        s->refcount[q->pages[i]]--;
    q->held = 0;
}

/* Drops the first `count` held pages and the tokens they held. */
static void release_front(struct state *s, struct model_seq *q, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        s->refcount[q->pages[i]]--;
    memmove(q->pages, q->pages + count, (size_t)(q->held - count) * sizeof *q->pages);
    q->held -= (int)count;
    const int64_t before = first_held(s, q);
    q->released += count;
    const int64_t drop = first_held(s, q) - before;
    for (int l = 0; l < NUM_LAYERS; l++) {
        const int64_t kept = q->length[l] - first_held(s, q);
        FUZZ_ASSERT(kept >= 0, "the model released tokens layer %d still needs", l);
        memmove(q->seed[l], q->seed[l] + drop, (size_t)kept * sizeof q->seed[l][0]);
        memmove(q->position[l], q->position[l] + drop, (size_t)kept * sizeof q->position[l][0]);
        memmove(q->k[l], q->k[l] + drop, (size_t)kept * sizeof q->k[l][0]);
        memmove(q->v[l], q->v[l] + drop, (size_t)kept * sizeof q->v[l][0]);
    }
}

/* kv_cache.h's window rule: the pages of tokens <= L - W, L the smallest layer length. */
static void release_hidden(struct state *s, struct model_seq *q)
{
    if (s->window <= 0)
        return;
    const int64_t hidden = smallest(q) - s->window + 1;
    const int64_t releasable = hidden > 0 ? (hidden >> s->page_shift) - q->released : 0;
    const int64_t count = releasable < q->held ? releasable : q->held;
    if (count > 0)
        release_front(s, q, count);
}

/* ---- checks against the cache ---- */

static float read_k[MAX_TOKENS_HELD + MAX_Q_LEN][K_FLOATS], read_v[MAX_TOKENS_HELD + MAX_Q_LEN][V_FLOATS];

static void read_rows(struct state *s, sneppx_kv_cache *cache, int64_t id, int64_t layer, int64_t begin,
                      int64_t end, const char *what)
{
    sneppx_status status = sneppx_kv_cache_read(cache, id, layer, begin, end, &read_k[0][0], &read_v[0][0]);
    FUZZ_ASSERT(status == SNEPPX_OK, "%s: read of [%lld, %lld) at layer %lld: %s", what, (long long)begin,
                (long long)end, (long long)layer, sneppx_last_error());
    /* The read packs rows of k_floats (v_floats): spread them to the model's stride. */
    const int64_t rows = end - begin;
    float *k = &read_k[0][0], *v = &read_v[0][0];
    for (int64_t r = rows - 1; r >= 0; r--) {
        memmove(read_k[r], k + r * s->k_floats, (size_t)s->k_floats * sizeof(float));
        if (s->v_floats)
            memmove(read_v[r], v + r * s->v_floats, (size_t)s->v_floats * sizeof(float));
    }
}

/* Every promise about the cache's state, after any operation. */
static void check_state(struct state *s, const char *after)
{
    sneppx_kv_cache_stats stats;
    FUZZ_ASSERT(sneppx_kv_cache_stats_get(s->cache, &stats) == SNEPPX_OK, "stats: %s", sneppx_last_error());
    FUZZ_ASSERT(stats.total_pages == s->pool, "after %s: the pool has %lld pages, made with %lld", after,
                (long long)stats.total_pages, (long long)s->pool);
    FUZZ_ASSERT(stats.free_pages == free_pages(s),
                "after %s: %lld pages free, but the sequences hold %d of %lld (free + held != pool)", after,
                (long long)stats.free_pages, (int)s->pool - free_pages(s), (long long)s->pool);
    FUZZ_ASSERT(stats.sequences == s->live, "after %s: %lld live sequences, the model has %d", after,
                (long long)stats.sequences, s->live);
    for (int i = 0; i < s->live; i++) {
        struct model_seq *q = s->seqs[i];
        int64_t length = -1;
        FUZZ_ASSERT(sneppx_kv_cache_length(s->cache, q->id, &length) == SNEPPX_OK && length == largest(q),
                    "after %s: sequence %lld has length %lld, the model %lld (%s)", after, (long long)q->id,
                    (long long)length, (long long)largest(q), sneppx_last_error());
        int64_t held_from = -1;
        FUZZ_ASSERT(sneppx_kv_cache_first_held(s->cache, q->id, &held_from) == SNEPPX_OK &&
                        held_from == first_held(s, q),
                    "after %s: sequence %lld holds from token %lld, the model from %lld (%s)", after,
                    (long long)q->id, (long long)held_from, (long long)first_held(s, q), sneppx_last_error());
        for (int l = 0; l < NUM_LAYERS; l++) {
            FUZZ_ASSERT(sneppx_kv_cache_layer_length(s->cache, q->id, l, &length) == SNEPPX_OK &&
                            length == q->length[l],
                        "after %s: sequence %lld has length %lld at layer %d, the model %lld (%s)", after,
                        (long long)q->id, (long long)length, l, (long long)q->length[l], sneppx_last_error());
            const int64_t first = first_held(s, q), rows = q->length[l] - first;
            read_rows(s, s->cache, q->id, l, first, q->length[l], after);
            for (int64_t r = 0; r < rows; r++)
                FUZZ_ASSERT(memcmp(read_k[r], q->k[l][r], (size_t)s->k_floats * sizeof(float)) == 0 &&
                                memcmp(read_v[r], q->v[l][r], (size_t)s->v_floats * sizeof(float)) == 0,
                            "after %s: sequence %lld's row of token %lld at layer %d changed", after,
                            (long long)q->id, (long long)(first + r), l);
        }
    }
}

/* ---- operations ---- */

/* A sequence id from a byte: mostly a live one, else a removed one or one no cache gave. */
static int64_t pick_id(struct state *s, unsigned b)
{
    if (s->live > 0 && b < 200)
        return s->seqs[b % s->live]->id;
    if (s->dead_count > 0 && b < 235)
        return s->dead[b % s->dead_count];
    const int64_t odd[] = {-1, (int64_t)1 << 40, INT64_MAX, 12345, INT64_MIN};
    if (s->live > 0 && b % 6 == 5) /* a live slot with the next generation */
        return s->seqs[b % s->live]->id + ((int64_t)1 << 32);
    return odd[b % 5];
}

static int find(const struct state *s, int64_t id)
{
    for (int i = 0; i < s->live; i++)
        if (s->seqs[i]->id == id)
            return i;
    return -1;
}

static void expect(sneppx_status status, sneppx_status want, const char *what)
{
    FUZZ_ASSERT(status == want, "%s returned %d, the model says %d (%s)", what, (int)status, (int)want,
                status == SNEPPX_OK ? "" : sneppx_last_error());
}

static void op_add(struct state *s)
{
    if (s->live == MAX_SEQS)
        return;
    int64_t id = -1;
    expect(sneppx_kv_cache_add_sequence(s->cache, &id), SNEPPX_OK, "add");
    FUZZ_ASSERT(find(s, id) < 0, "add gave %lld, a live sequence's id", (long long)id);
    for (int i = 0; i < s->dead_count; i++)
        FUZZ_ASSERT(s->dead[i] != id, "add gave %lld again, the id of a removed sequence", (long long)id);
    struct model_seq *q = calloc(1, sizeof *q);
    FUZZ_ASSERT(q, "out of memory");
    model_block(q, s->pool * s->page_size, NULL);
    q->id = id;
    s->seqs[s->live++] = q;
}

static void op_remove(struct state *s, struct reader *r)
{
    const int64_t id = pick_id(s, next(r));
    const int index = find(s, id);
    expect(sneppx_kv_cache_remove_sequence(s->cache, id), index >= 0 ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT,
           "remove");
    if (index >= 0) {
        unref_all(s, s->seqs[index]);
        forget(s, index);
    }
}

static void op_fork(struct state *s, struct reader *r)
{
    const int64_t id = pick_id(s, next(r));
    if (s->live == MAX_SEQS)
        return;
    const int index = find(s, id);
    int64_t child_id = -1;
    expect(sneppx_kv_cache_fork(s->cache, id, &child_id), index >= 0 ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT,
           "fork");
    if (index < 0)
        return;
    FUZZ_ASSERT(find(s, child_id) < 0 && child_id != id, "fork gave %lld, a live sequence's id",
                (long long)child_id);
    struct model_seq *child = malloc(sizeof *child);
    FUZZ_ASSERT(child, "out of memory");
    memcpy(child, s->seqs[index], sizeof *child);
    model_block(child, s->pool * s->page_size, s->seqs[index]);
    child->id = child_id;
    for (int i = 0; i < child->held; i++)
        s->refcount[child->pages[i]]++;
    s->seqs[s->live++] = child;
}

/* What truncating q (NULL: no live sequence) to length must return (kv_cache.h). */
static sneppx_status truncate_want(const struct state *s, const struct model_seq *q, int64_t length)
{
    if (!q || length < 0 || length > largest(q))
        return SNEPPX_ERR_INVALID_ARGUMENT;
    const int64_t low = smallest(q) < length ? smallest(q) : length;
    const int64_t needed = s->window > 0 && low - s->window + 1 > 0 ? low - s->window + 1 : 0;
    /* Length 0 keeps no token, so none the window released is missed. */
    return length > 0 && first_held(s, q) > needed ? SNEPPX_ERR_INVALID_ARGUMENT : SNEPPX_OK;
}

static void truncate_model(struct state *s, struct model_seq *q, int64_t length)
{
    for (int l = 0; l < NUM_LAYERS; l++)
        q->length[l] = q->length[l] < length ? q->length[l] : length;
    if (length == 0)
        q->released = 0; /* the sequence starts over: its table counts from token 0 again */
    const int64_t keep = pages_for(s, length) - q->released;
    while (q->held > keep)
        s->refcount[q->pages[--q->held]]--;
}

/* A length for q (NULL: none) from byte b: mostly one it has, else b >> 2, or its negative. */
static int64_t pick_length(const struct model_seq *q, unsigned b)
{
    if (q && b % 4 < 2 && largest(q) > 0)
        return (b >> 2) % (largest(q) + 1);
    return b % 4 == 3 ? -(int64_t)(b >> 2) : b >> 2;
}

enum { MAX_TRUNCATED = 4 };

/* sneppx_kv_cache_truncate_sequences over the first id and up to 3 more: all or none,
 * refused when any entry is (unknown, twice in the call, or as a lone truncate). */
static void op_truncate_sequences(struct state *s, struct reader *r, int64_t first_id, unsigned count)
{
    const int n = 1 + (int)(count % MAX_TRUNCATED);
    int64_t ids[MAX_TRUNCATED], lengths[MAX_TRUNCATED];
    struct model_seq *qs[MAX_TRUNCATED];
    sneppx_status want = SNEPPX_OK;
    for (int i = 0; i < n; i++) {
        ids[i] = i == 0 ? first_id : pick_id(s, next(r));
        const int index = find(s, ids[i]);
        qs[i] = index >= 0 ? s->seqs[index] : NULL;
        lengths[i] = pick_length(qs[i], next(r));
        for (int j = 0; j < i; j++)
            if (qs[i] && qs[j] == qs[i])
                want = SNEPPX_ERR_INVALID_ARGUMENT;
        if (truncate_want(s, qs[i], lengths[i]) != SNEPPX_OK)
            want = SNEPPX_ERR_INVALID_ARGUMENT;
    }
    expect(sneppx_kv_cache_truncate_sequences(s->cache, n, ids, lengths), want, "truncate_sequences");
    if (want == SNEPPX_OK)
        for (int i = 0; i < n; i++)
            truncate_model(s, qs[i], lengths[i]);
}

/* One sequence, or (b % 8 == 7, a negative length's byte before the batch form existed)
 * a batch of them. */
static void op_truncate(struct state *s, struct reader *r)
{
    const int64_t id = pick_id(s, next(r));
    const unsigned b = next(r);
    if (b % 8 == 7) {
        op_truncate_sequences(s, r, id, b >> 3);
        return;
    }
    const int index = find(s, id);
    struct model_seq *q = index >= 0 ? s->seqs[index] : NULL;
    const int64_t length = pick_length(q, b);
    const sneppx_status want = truncate_want(s, q, length);
    expect(sneppx_kv_cache_truncate(s->cache, id, length), want, "truncate");
    if (want == SNEPPX_OK)
        truncate_model(s, q, length);
}

static void op_reset(struct state *s)
{
    expect(sneppx_kv_cache_reset(s->cache), SNEPPX_OK, "reset");
    while (s->live > 0) {
        unref_all(s, s->seqs[0]);
        forget(s, 0);
    }
}

static void op_read(struct state *s, struct reader *r)
{
    const int64_t id = pick_id(s, next(r));
    const int index = find(s, id);
    const unsigned b = next(r), c = next(r), d = next(r);
    const int64_t layer = b % 8 == 7 ? -1 : b % 8 == 6 ? NUM_LAYERS : (int64_t)(b & 1);
    int64_t begin = c, end = d;
    const struct model_seq *q = index >= 0 ? s->seqs[index] : NULL;
    if (q && layer >= 0 && layer < NUM_LAYERS && !(b & 8)) { /* mostly near the held tokens */
        begin = first_held(s, q) - 1 + c % (q->length[layer] - first_held(s, q) + 3);
        end = begin + d % 6 - 1;
    }
    const int ok = q && layer >= 0 && layer < NUM_LAYERS && begin >= first_held(s, q) && end >= begin &&
                   end <= q->length[layer];
    FUZZ_ASSERT(!ok || end - begin <= MAX_TOKENS_HELD, "a read of more tokens than the pool");
    sneppx_status status = ok ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT;
    if (ok) {
        read_rows(s, s->cache, id, layer, begin, end, "read");
        for (int64_t t = begin; t < end; t++) {
            const int64_t m = t - first_held(s, q);
            FUZZ_ASSERT(memcmp(read_k[t - begin], q->k[layer][m], (size_t)s->k_floats * sizeof(float)) == 0 &&
                            memcmp(read_v[t - begin], q->v[layer][m], (size_t)s->v_floats * sizeof(float)) == 0,
                        "read of [%lld, %lld) at layer %lld: token %lld differs from the model", (long long)begin,
                        (long long)end, (long long)layer, (long long)t);
        }
    } else {
        static float k[4 * MAX_TOKENS_HELD * K_FLOATS], v[4 * MAX_TOKENS_HELD * V_FLOATS];
        if (begin < 0 || end > begin + 4 * MAX_TOKENS_HELD) /* a bad range the cache may not write to */
            end = begin;
        expect(sneppx_kv_cache_read(s->cache, id, layer, begin, end, k, v), status, "read");
    }
    /* The length queries, with bad layers too. */
    int64_t length = -1;
    expect(sneppx_kv_cache_layer_length(s->cache, id, layer, &length),
           q && layer >= 0 && layer < NUM_LAYERS ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT, "layer_length");
    expect(sneppx_kv_cache_length(s->cache, id, &length), q ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT, "length");
    expect(sneppx_kv_cache_first_held(s->cache, id, &length), q ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT,
           "first_held");
}

/* Scratch of a forward call. */
static float hidden[MAX_CALL_SEQS * MAX_Q_LEN][HIDDEN], out[MAX_CALL_SEQS * MAX_Q_LEN][HIDDEN];
static float fresh_out[MAX_CALL_SEQS * MAX_Q_LEN][HIDDEN];
static float whole_in[MAX_TOKENS_HELD + MAX_Q_LEN][HIDDEN], whole_out[MAX_TOKENS_HELD + MAX_Q_LEN][HIDDEN];
static int64_t whole_positions[MAX_TOKENS_HELD + MAX_Q_LEN];
/* Explicit masks: a plane [q_len, past + q_len] per sequence, and the cache-free
 * forward's [n, n] over the held tokens. */
#define PLANE_ROWS 32 /* a longer call, or a longer sequence, gets no plane */
#define PLANE_COLUMNS 1024
static float planes[MAX_CALL_SEQS][PLANE_ROWS * PLANE_COLUMNS];
static float whole_mask[MAX_TOKENS_HELD * MAX_TOKENS_HELD];

/* What a sequence's mask plane is (the op byte's high nibble picks them). */
enum { PLANE_NULL, PLANE_CAUSAL, PLANE_HOLES, PLANE_ANY, PLANE_SHOWS_RELEASED, PLANE_KINDS };

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return x;
}

/* Fills sequence q's plane for q_len new tokens after past (a call's rows: each
 * row's first key is the first token the pages hold). Causal (+ window) written
 * out; HOLES masks some more keys and biases others; ANY takes any entries, keys
 * after the query's own among them (a mask is final); every key the window
 * released is masked, but by SHOWS_RELEASED, which shows one of them (when there
 * is one). Returns whether the cache must accept the plane. */
static int fill_plane(const struct state *s, const struct model_seq *q, int kind, int64_t past, int64_t q_len,
                      uint64_t seed, float *plane)
{
    static const float biases[8] = {0.0f, 0.0f, -1.0f, 0.5f, -INFINITY, -1e30f, -FLT_MAX, -1e29f};
    const float masked = seed % 3 == 0 ? -INFINITY : seed % 3 == 1 ? -1e30f : -FLT_MAX;
    const int64_t columns = past + q_len, first = first_held(s, q);
    for (int64_t i = 0; i < q_len; i++)
        for (int64_t j = 0; j < columns; j++) {
            const int64_t query = past + i;
            const int hidden = j > query || (s->window > 0 && query - j >= s->window);
            const uint64_t r = mix(seed + (uint64_t)(i * columns + j) * 0x9e3779b97f4a7c15ULL);
            float value = hidden ? masked : 0.0f;
            if (kind == PLANE_HOLES && !hidden)
                value = biases[r % 8];
            else if (kind == PLANE_ANY)
                value = biases[r % 8] + (r >> 8) % 4 * 0.25f;
            plane[i * columns + j] = j < first ? masked : value;
        }
    if (kind == PLANE_SHOWS_RELEASED && first > 0) {
        plane[(q_len - 1) * columns + first - 1] = 0.0f;
        return 0;
    }
    return 1;
}

/* The call's new rows are those a fresh cache holds after the same call: the
 * same tokens of fresh sequences at the same positions (the projections of the
 * same rows, so byte for byte; attention reads other pages). */
static void check_fresh(struct state *s, int64_t layer, int64_t n_seqs, const int *index, const int64_t *q_lens,
                        const int64_t *positions)
{
    expect(sneppx_kv_cache_reset(s->fresh), SNEPPX_OK, "reset of the fresh cache");
    int64_t ids[MAX_CALL_SEQS];
    for (int64_t i = 0; i < n_seqs; i++)
        expect(sneppx_kv_cache_add_sequence(s->fresh, &ids[i]), SNEPPX_OK, "add to the fresh cache");
    expect(sneppx_layer_forward_cached(s->layer, s->fresh, 0, n_seqs, ids, q_lens, &hidden[0][0], positions, NULL,
                                       &fresh_out[0][0]),
           SNEPPX_OK, "the same call into a fresh cache");
    for (int64_t i = 0; i < n_seqs; i++) {
        const struct model_seq *q = s->seqs[index[i]];
        const int64_t past = q->length[layer] - q_lens[i];
        read_rows(s, s->fresh, ids[i], 0, 0, q_lens[i], "the fresh cache");
        for (int64_t t = past > first_held(s, q) ? past : first_held(s, q); t < q->length[layer]; t++) {
            const int64_t m = t - first_held(s, q), j = t - past;
            FUZZ_ASSERT(memcmp(read_k[j], q->k[layer][m], (size_t)s->k_floats * sizeof(float)) == 0 &&
                            memcmp(read_v[j], q->v[layer][m], (size_t)s->v_floats * sizeof(float)) == 0,
                        "sequence %lld: token %lld's row at layer %lld differs from a fresh cache's after the same "
                        "call",
                        (long long)q->id, (long long)t, (long long)layer);
        }
    }
}

/* float32 rows: the call's output rows of q equal the cache-free forward over the tokens it holds. */
static void check_output(struct state *s, const struct model_seq *q, int64_t layer, int64_t q_len,
                         const float *plane, const float *got)
{
    const int64_t first = first_held(s, q), n = q->length[layer] - first;
    for (int64_t t = 0; t < n; t++) {
        hidden_row(q->seed[layer][t], whole_in[t]);
        whole_positions[t] = q->position[layer][t];
    }
    /* A plane: the whole sequence's mask has it as its last q_len rows (from the
     * first held key on), causal (+ window) rows before (their outputs unused). */
    const int64_t shape[4] = {1, 1, n, n};
    for (int64_t i = 0; plane && i < n; i++)
        for (int64_t j = 0; j < n; j++)
            whole_mask[i * n + j] = i >= n - q_len ? plane[(i - (n - q_len)) * q->length[layer] + first + j]
                                    : j > i || (s->window > 0 && i - j >= s->window) ? -INFINITY
                                                                                     : 0.0f;
    sneppx_status status = sneppx_layer_forward(s->layer, 1, n, &whole_in[0][0], plane ? whole_mask : NULL,
                                                plane ? shape : NULL, whole_positions, &whole_out[0][0]);
    FUZZ_ASSERT(status == SNEPPX_OK, "the cache-free forward of %lld held tokens: %s", (long long)n,
                sneppx_last_error());
    double size = 1e-3, worst = 0;
    for (int64_t j = 0; j < q_len; j++)
        for (int h = 0; h < HIDDEN; h++) {
            const double want = whole_out[n - q_len + j][h];
            FUZZ_ASSERT(isfinite(got[j * HIDDEN + h]), "sequence %lld: output %g", (long long)q->id,
                        got[j * HIDDEN + h]);
            size = fmax(size, fabs(want));
            worst = fmax(worst, fabs(got[j * HIDDEN + h] - want));
        }
    FUZZ_ASSERT(worst <= 1e-4 * size,
                "sequence %lld at layer %lld: the cached forward differs from the cache-free one by %g (outputs up "
                "to %g)",
                (long long)q->id, (long long)layer, worst, size);
}

/* A cached forward; mask_mode (the op byte's high nibble, 0 for NULL masks) picks
 * each sequence's plane. */
static void op_forward(struct state *s, struct reader *r, unsigned mask_mode)
{
    const unsigned flags = next(r);
    const int64_t layer = flags % 8 < 3 ? 0 : flags % 8 < 6 ? 1 : flags % 8 == 6 ? NUM_LAYERS : -1;
    const int64_t n_seqs = flags >> 5 == 7 ? 0 : 1 + (flags >> 3) % MAX_CALL_SEQS;
    const int explicit_positions = flags >> 6 & 1;
    int64_t ids[MAX_CALL_SEQS], q_lens[MAX_CALL_SEQS], positions[MAX_CALL_SEQS * MAX_Q_LEN];
    uint32_t seeds[MAX_CALL_SEQS * MAX_Q_LEN];
    int index[MAX_CALL_SEQS];
    int64_t tokens = 0;
    int valid = layer >= 0 && layer < NUM_LAYERS && n_seqs >= 1;
    for (int64_t i = 0; i < n_seqs; i++) {
        ids[i] = pick_id(s, next(r));
        const unsigned b = next(r);
        /* Mostly decode-sized; a long cache's prefills take 13. */
        q_lens[i] = b % 16 == 15                    ? 16 + b / 16 % 8
                    : b % 16 == 14                  ? 0
                    : b % 16 == 13 && s->long_cache ? 64 * (2 + b / 16 % 6)
                                                    : 1 + b % 4;
        index[i] = find(s, ids[i]);
        valid = valid && index[i] >= 0 && q_lens[i] >= 1;
        for (int64_t j = 0; j < i; j++)
            valid = valid && ids[j] != ids[i];
        const int64_t past = index[i] >= 0 && layer >= 0 && layer < NUM_LAYERS ? s->seqs[index[i]]->length[layer] : 0;
        const unsigned p = explicit_positions ? next(r) : 0;
        for (int64_t j = 0; j < q_lens[i]; j++) {
            seeds[tokens] = s->next_seed++;
            hidden_row(seeds[tokens], hidden[tokens]);
            /* Explicit: the default shifted, or anywhere around [0, 64). */
            positions[tokens] = !explicit_positions ? past + j
                                : p < 192              ? past + j + (int64_t)(p % 8) - 2
                                                       : (int64_t)(p % 64) * 3 / 2 - 16 + j;
            valid = valid && positions[tokens] >= 0 && positions[tokens] < s->max_positions;
            tokens++;
        }
    }
    /* The masks: a plane of a kind per sequence, from the op byte's high nibble. */
    const float *masks[MAX_CALL_SEQS] = {NULL};
    for (int64_t i = 0; mask_mode && valid && i < n_seqs; i++) {
        const int kind = (int)((mask_mode + 3 * (unsigned)i) % PLANE_KINDS);
        if (kind == PLANE_NULL)
            continue;
        const struct model_seq *q = s->seqs[index[i]];
        if (q->length[layer] + q_lens[i] > PLANE_COLUMNS || q_lens[i] > PLANE_ROWS)
            continue;
        valid = fill_plane(s, q, kind, q->length[layer], q_lens[i], mix(s->next_seed * 31 + (uint64_t)i + mask_mode),
                           planes[i]);
        masks[i] = planes[i];
    }
    /* The pages the call needs (kv_cache.h): new ones, and a copy of each shared
     * page it writes, but for the last writer of a page every holder writes. */
    int writers[MAX_PAGES] = {0}, last_writer[MAX_PAGES];
    int64_t needed = 0;
    for (int pass = 0; valid && pass < 2; pass++)
        for (int64_t i = 0; i < n_seqs; i++) {
            const struct model_seq *q = s->seqs[index[i]];
            const int64_t covered = pages_for(s, q->length[layer] + q_lens[i]) - q->released;
            const int64_t begin = (q->length[layer] >> s->page_shift) - q->released;
            const int64_t end = covered < q->held ? covered : q->held;
            for (int64_t p = begin; p < end; p++) {
                const int page = q->pages[p];
                if (s->refcount[page] <= 1)
                    continue;
                if (pass == 0) {
                    writers[page]++;
                    last_writer[page] = (int)i;
                } else {
                    needed += !(writers[page] == s->refcount[page] && last_writer[page] == i);
                }
            }
            if (pass == 1)
                needed += covered > q->held ? covered - q->held : 0;
        }
    const sneppx_status want = !valid                          ? SNEPPX_ERR_INVALID_ARGUMENT
                               : needed > free_pages(s)        ? SNEPPX_ERR_OUT_OF_MEMORY
                                                               : SNEPPX_OK;
    for (int64_t t = 0; t < tokens; t++)
        for (int h = 0; h < HIDDEN; h++)
            out[t][h] = (float)(t * HIDDEN + h);
    expect(sneppx_layer_forward_cached(s->layer, s->cache, layer, n_seqs, ids, q_lens, &hidden[0][0],
                                       explicit_positions ? positions : NULL, mask_mode ? masks : NULL, &out[0][0]),
           want, "forward_cached");
    if (want != SNEPPX_OK) { /* kv_cache.h: on error nothing is written to out */
        for (int64_t t = 0; t < tokens; t++)
            for (int h = 0; h < HIDDEN; h++)
                FUZZ_ASSERT(out[t][h] == (float)(t * HIDDEN + h), "a refused forward_cached wrote out[%lld][%d]",
                            (long long)t, h);
        return;
    }

    /* The model's pages: copies of the shared ones it writes, then new ones. */
    for (int64_t i = 0; i < n_seqs; i++) {
        struct model_seq *q = s->seqs[index[i]];
        const int64_t covered = pages_for(s, q->length[layer] + q_lens[i]) - q->released;
        const int64_t begin = (q->length[layer] >> s->page_shift) - q->released;
        const int64_t end = covered < q->held ? covered : q->held;
        for (int64_t p = begin; p < end; p++) {
            const int page = q->pages[p];
            if (s->refcount[page] > 1 && !(writers[page] == s->refcount[page] && last_writer[page] == i)) {
                writers[page]--; /* stays shared by the others */
                s->refcount[page]--;
                q->pages[p] = page_take(s);
            }
        }
        while (q->held < covered)
            q->pages[q->held++] = page_take(s);
    }
    /* The new tokens; the output against the cache-free forward (before the window
     * releases what the queries saw); the window's release (which may take new
     * tokens too); the new rows the cache still holds, then against a fresh cache. */
    for (int64_t i = 0, token0 = 0; i < n_seqs; token0 += q_lens[i], i++) {
        struct model_seq *q = s->seqs[index[i]];
        const int64_t past = q->length[layer], m = past - first_held(s, q);
        FUZZ_ASSERT(m + q_lens[i] <= s->pool * s->page_size, "the model holds more tokens than the pool");
        for (int64_t j = 0; j < q_lens[i]; j++) {
            q->seed[layer][m + j] = seeds[token0 + j];
            q->position[layer][m + j] = positions[token0 + j];
        }
        q->length[layer] += q_lens[i];
        if (s->float32)
            check_output(s, q, layer, q_lens[i], masks[i], out[token0]);
        release_hidden(s, q);
        const int64_t first = past > first_held(s, q) ? past : first_held(s, q);
        read_rows(s, s->cache, q->id, layer, first, q->length[layer], "the new rows");
        for (int64_t t = first; t < q->length[layer]; t++) {
            memcpy(q->k[layer][t - first_held(s, q)], read_k[t - first], sizeof read_k[0]);
            memcpy(q->v[layer][t - first_held(s, q)], read_v[t - first], sizeof read_v[0]);
        }
    }
    check_fresh(s, layer, n_seqs, index, q_lens, positions);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* The 2-thread layers' OpenMP workers would spin between calls of a few
     * microseconds, on the cores the fuzzer needs (a third of its time). */
    setenv("KMP_BLOCKTIME", "0", 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reader r = {data, size, 0};
    static struct state s;
    memset(&s, 0, sizeof s);
    const unsigned flags = next(&r), shape = next(&r);
    s.kind = flags % 4 == 3 ? STANDARD : (int)(flags % 4);
    s.long_cache = flags >> 7 & 1;
    s.max_positions = s.long_cache ? LONG_POSITIONS : MAX_POSITIONS;
    s.layer = layer_of(s.kind, 1 + (flags >> 2 & 1), s.long_cache);
    FUZZ_ASSERT(sneppx_layer_set_flash(s.layer, !(flags >> 3 & 1)) == SNEPPX_OK, "set_flash: %s",
                sneppx_last_error());
    const sneppx_dtype dtype = (sneppx_dtype)(flags >> 4 & 3);
    s.float32 = dtype == SNEPPX_DTYPE_FLOAT32;
    s.page_shift = s.long_cache ? 6 : shape % 4;
    s.page_size = (int64_t)1 << s.page_shift;
    s.pool = 2 + (shape >> 2) % (MAX_PAGES - 1);
    s.window = s.kind == WINDOWED ? WINDOW : 0;
    s.k_floats = s.kind == MLA ? 32 : 16;
    s.v_floats = s.kind == MLA ? 0 : 16;

    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.page_size = s.page_size;
    options.capacity_tokens = (s.pool - 1) * s.page_size + 1 + (int64_t)(shape >> 6) % s.page_size; /* rounded up */
    options.num_layers = NUM_LAYERS;
    options.dtype = dtype;
    options.max_sequence_tokens = flags >> 6 & 1 ? 4 : 0; /* a small table grows as the sequence does */
    sneppx_status status = sneppx_kv_cache_create(sneppx_layer_config(s.layer), &options, &s.cache);
    FUZZ_ASSERT(status == SNEPPX_OK, "create: %s", sneppx_last_error());
    options.capacity_tokens = MAX_CALL_SEQS * (s.long_cache ? MAX_Q_LEN + LONG_PAGE_SIZE : SHORT_Q_LEN + MAX_PAGE_SIZE);
    options.max_sequence_tokens = 0;
    status = sneppx_kv_cache_create(sneppx_layer_config(s.layer), &options, &s.fresh);
    FUZZ_ASSERT(status == SNEPPX_OK, "create of the fresh cache: %s", sneppx_last_error());

    check_state(&s, "create");
    static const char *const names[] = {"add", "remove", "fork", "truncate", "reset", "forward", "read", "add"};
    for (int op = 0; r.at < r.size && op < 256; op++) {
        const unsigned op_byte = next(&r), which = op_byte % 16;
        const int kind = which < 8 ? (int)which : which < 13 ? 5 : (int)(which - 13) * 2; /* forward, add, fork */
        switch (kind) {
        case 0:
        case 7: op_add(&s); break;
        case 1: op_remove(&s, &r); break;
        case 2: op_fork(&s, &r); break;
        case 3: op_truncate(&s, &r); break;
        case 4: op_reset(&s); break;
        case 5: op_forward(&s, &r, op_byte >> 4); break;
        case 6: op_read(&s, &r); break;
        }
        check_state(&s, names[kind]);
    }
    while (s.live > 0)
        forget(&s, 0);
    sneppx_kv_cache_destroy(s.cache);
    sneppx_kv_cache_destroy(s.fresh);
    return 0;
}
