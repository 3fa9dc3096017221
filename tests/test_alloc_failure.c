/* Every allocation the runtime makes on the way through create, forward, the
 * KV cache's calls and the cached forward, failed one at a time: each call
 * must return SNEPPX_ERR_OUT_OF_MEMORY (never crash, never succeed with a
 * half-made object), leave what it was given as it was (the layer still runs
 * and gives the same bits, out untouched, the cache's lengths unchanged) and
 * keep nothing of what it allocated.
 *
 * The test defines malloc, calloc, realloc, posix_memalign and free, which
 * take the place of the C library's in the whole process. Only calls made
 * directly from this executable's code (the statically linked runtime) are
 * counted and failed, and only while a call is armed: OpenMP, LLVM and the
 * C library allocate for themselves (and abort or throw when they cannot),
 * which is not the runtime's to handle. Every block the runtime allocates
 * while armed is remembered until it is freed, so a block the failed call
 * keeps is seen at once, without a leak checker (this test cannot run under
 * ASan, whose allocator would replace these functions). The kernels are
 * resolved before any call is armed: a compile allocates inside LLVM. */
#define _GNU_SOURCE
#include <link.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sneppx/sneppx.h"
#include "test_util.h"
#include "test_weights.h"

/* A sanitizer's allocator takes malloc's place itself: there the test does not run. */
#if defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED TEST_UNDER_ASAN
#endif

#if SANITIZED
int main(void)
{
    printf("skipped: a sanitizer replaces the allocator this test replaces\n");
    return 0;
}
#else

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void __libc_free(void *pointer);

/* ---- the allocator ------------------------------------------------------- */

static uintptr_t code_begin, code_end;  /* this executable's code */
static atomic_int armed;                /* count and fail the runtime's allocations */
static atomic_long counted;             /* the runtime's allocations since arming */
static long fail_at = -1;               /* the one counted allocation that fails */
static atomic_int failed;               /* that one was reached */

enum { LIVE_SLOTS = 1 << 16 };
static void *live[LIVE_SLOTS];          /* blocks the runtime allocated while armed, not freed yet */
static long live_count;
static atomic_flag live_lock = ATOMIC_FLAG_INIT;

static int find_code(struct dl_phdr_info *info, size_t size, void *unused)
{
    (void)size, (void)unused;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            code_begin = info->dlpi_addr + ph->p_vaddr;
            code_end = code_begin + ph->p_memsz;
        }
    }
    return 1; /* the first object is the executable */
}

static void live_lock_take(void)
{
    while (atomic_flag_test_and_set_explicit(&live_lock, memory_order_acquire))
        ;
}

static void live_lock_give(void) { atomic_flag_clear_explicit(&live_lock, memory_order_release); }

static size_t slot_of(const void *pointer) { return ((uintptr_t)pointer >> 4) * 2654435761u % LIVE_SLOTS; }

static void live_add(void *pointer)
{
    live_lock_take();
    size_t slot = slot_of(pointer);
    while (live[slot])
        slot = (slot + 1) % LIVE_SLOTS;
    live[slot] = pointer;
    live_count++;
    live_lock_give();
}

/* Forgets pointer if it is remembered (linear probing with backward-shift deletion). */
static void live_remove(void *pointer)
{
    if (!pointer)
        return;
    live_lock_take();
    if (live_count == 0) {
        live_lock_give();
        return;
    }
    size_t slot = slot_of(pointer);
    while (live[slot] && live[slot] != pointer)
        slot = (slot + 1) % LIVE_SLOTS;
    if (live[slot]) {
        live[slot] = NULL;
        live_count--;
        for (size_t next = (slot + 1) % LIVE_SLOTS; live[next]; next = (next + 1) % LIVE_SLOTS) {
            const size_t home = slot_of(live[next]);
            /* move live[next] into the hole unless its home lies cyclically in (slot, next] */
            const int stays = slot <= next ? (home > slot && home <= next) : (home > slot || home <= next);
            if (!stays) {
                live[slot] = live[next];
                live[next] = NULL;
                slot = next;
            }
        }
    }
    live_lock_give();
}

/* Whether this allocation (called from caller) is the runtime's, and if so whether it fails. */
static int runtime_call(const void *caller, int *fail)
{
    *fail = 0;
    if (!atomic_load_explicit(&armed, memory_order_acquire))
        return 0;
    if ((uintptr_t)caller < code_begin || (uintptr_t)caller >= code_end)
        return 0;
    if (atomic_fetch_add(&counted, 1) == fail_at) {
        atomic_store(&failed, 1);
        *fail = 1;
    }
    return 1;
}

void *malloc(size_t size)
{
    int fail;
    const int ours = runtime_call(__builtin_return_address(0), &fail);
    if (fail)
        return NULL;
    void *pointer = __libc_malloc(size);
    if (ours && pointer)
        live_add(pointer);
    return pointer;
}

void *calloc(size_t count, size_t size)
{
    int fail;
    const int ours = runtime_call(__builtin_return_address(0), &fail);
    if (fail)
        return NULL;
    void *pointer = __libc_calloc(count, size);
    if (ours && pointer)
        live_add(pointer);
    return pointer;
}

void *realloc(void *old, size_t size)
{
    int fail;
    const int ours = runtime_call(__builtin_return_address(0), &fail);
    if (fail)
        return NULL;
    void *pointer = __libc_realloc(old, size);
    if (pointer || size == 0)
        live_remove(old);
    if (ours && pointer)
        live_add(pointer);
    return pointer;
}

int posix_memalign(void **out, size_t alignment, size_t size)
{
    int fail;
    const int ours = runtime_call(__builtin_return_address(0), &fail);
    if (fail)
        return 12; /* ENOMEM */
    void *pointer = __libc_memalign(alignment, size);
    if (!pointer)
        return 12;
    if (ours)
        live_add(pointer);
    *out = pointer;
    return 0;
}

void free(void *pointer)
{
    live_remove(pointer);
    __libc_free(pointer);
}

static long live_blocks(void)
{
    live_lock_take();
    const long count = live_count;
    live_lock_give();
    return count;
}

/* Arms allocation n (0-based) of the runtime's to fail; n < 0 counts without failing. */
static void arm(long n)
{
    fail_at = n;
    atomic_store(&counted, 0);
    atomic_store(&failed, 0);
    atomic_store_explicit(&armed, 1, memory_order_release);
}

static void disarm(void) { atomic_store_explicit(&armed, 0, memory_order_release); }

/* ---- the cases ----------------------------------------------------------- */

enum { HIDDEN = 64, BATCH = 2, SEQ = 9, TOKENS = BATCH * SEQ, MAX_STEPS = 400 };

static test_tally tally;

static void gqa_config(sneppx_config *c)
{
    sneppx_config_init(c);
    c->hidden_size = HIDDEN, c->num_attention_heads = 4, c->num_key_value_heads = 2, c->head_dim = 16;
    c->sliding_window = 5;
    c->qkv_bias = 1;
}

static void mla_config(sneppx_config *c)
{
    sneppx_config_init(c);
    c->hidden_size = HIDDEN, c->num_attention_heads = 2, c->num_key_value_heads = 2;
    c->q_lora_rank = 32, c->kv_lora_rank = 32, c->qk_nope_head_dim = 16, c->qk_rope_head_dim = 16;
    c->v_head_dim = 16, c->rope_interleaved = 1;
}

static float hidden[TOKENS * HIDDEN], mask[BATCH * SEQ * SEQ];
static float want[TOKENS * HIDDEN], got[TOKENS * HIDDEN];
static const int64_t mask_shape[4] = {BATCH, 1, SEQ, SEQ};

static sneppx_status forward(sneppx_layer *layer, float *out)
{
    return sneppx_layer_forward(layer, BATCH, SEQ, hidden, mask, mask_shape, NULL, out);
}

/* Creating a layer of config (weights NULL: synthetic) with each allocation failed in turn. */
static void create_fails_cleanly(const char *name, const sneppx_config *config, const sneppx_weights *weights)
{
    sneppx_layer *reference = NULL;
    if (!TEST_CHECK(&tally, sneppx_layer_create(config, weights, &reference) == SNEPPX_OK, "%s: create: %s", name,
                    sneppx_last_error()))
        return;
    TEST_CHECK(&tally, forward(reference, want) == SNEPPX_OK, "%s: forward: %s", name, sneppx_last_error());
    sneppx_layer_destroy(reference);
    for (long n = 0; n < MAX_STEPS; n++) {
        sneppx_layer *layer = (sneppx_layer *)&tally; /* create must set it to NULL on failure */
        arm(n);
        const sneppx_status status = sneppx_layer_create(config, weights, &layer);
        disarm();
        if (!atomic_load(&failed)) {
            TEST_CHECK(&tally, status == SNEPPX_OK, "%s: create without a failure: %s", name, sneppx_last_error());
            if (status == SNEPPX_OK) {
                TEST_CHECK(&tally, forward(layer, got) == SNEPPX_OK && memcmp(got, want, sizeof got) == 0,
                           "%s: forward after create", name);
                sneppx_layer_destroy(layer);
            }
            TEST_CHECK(&tally, live_blocks() == 0, "%s: %ld blocks kept after destroy", name, live_blocks());
            printf("%s: create makes %ld allocations; each failed cleanly\n", name, n);
            return;
        }
        if (status == SNEPPX_OK) {
            /* An allocation the runtime can do without (the key list's copy) may fail
             * and create still succeed: then the layer must be whole. */
            TEST_CHECK(&tally, forward(layer, got) == SNEPPX_OK && memcmp(got, want, sizeof got) == 0,
                       "%s: allocation %ld failed, create succeeded, forward differs: %s", name, n,
                       sneppx_last_error());
            sneppx_layer_destroy(layer);
        } else {
            TEST_CHECK(&tally, status == SNEPPX_ERR_OUT_OF_MEMORY && layer == NULL,
                       "%s: allocation %ld failed: create returned %s (layer %p): %s", name, n,
                       sneppx_status_name(status), (void *)layer, sneppx_last_error());
        }
        TEST_CHECK(&tally, live_blocks() == 0, "%s: allocation %ld failed: %ld blocks kept", name, n, live_blocks());
    }
    TEST_CHECK(&tally, 0, "%s: create makes more than %d allocations", name, MAX_STEPS);
}

/* A new layer's first forward (its workspace, RoPE tables) with each allocation failed in turn. */
static void forward_fails_cleanly(const char *name, const sneppx_config *config)
{
    sneppx_layer *reference = NULL;
    if (!TEST_CHECK(&tally, sneppx_layer_create(config, NULL, &reference) == SNEPPX_OK, "%s: create: %s", name,
                    sneppx_last_error()))
        return;
    TEST_CHECK(&tally, forward(reference, want) == SNEPPX_OK, "%s: forward: %s", name, sneppx_last_error());
    sneppx_layer_destroy(reference);
    for (long n = 0; n < MAX_STEPS; n++) {
        sneppx_layer *layer = NULL;
        if (!TEST_CHECK(&tally, sneppx_layer_create(config, NULL, &layer) == SNEPPX_OK, "%s: create: %s", name,
                        sneppx_last_error()))
            return;
        test_fill_sentinel(got, TOKENS * HIDDEN);
        arm(n);
        const sneppx_status status = forward(layer, got);
        disarm();
        const int reached = atomic_load(&failed);
        if (status == SNEPPX_OK) {
            TEST_CHECK(&tally, memcmp(got, want, sizeof got) == 0, "%s: allocation %ld failed, forward succeeded, "
                       "result differs", name, n);
        } else {
            TEST_CHECK(&tally, reached && status == SNEPPX_ERR_OUT_OF_MEMORY,
                       "%s: allocation %ld failed: forward returned %s: %s", name, n, sneppx_status_name(status),
                       sneppx_last_error());
            TEST_CHECK(&tally, test_all_sentinel(got, TOKENS * HIDDEN), "%s: allocation %ld failed: out written",
                       name, n);
            TEST_CHECK(&tally, forward(layer, got) == SNEPPX_OK && memcmp(got, want, sizeof got) == 0,
                       "%s: allocation %ld failed: the next forward differs: %s", name, n, sneppx_last_error());
        }
        sneppx_layer_destroy(layer);
        TEST_CHECK(&tally, live_blocks() == 0, "%s: allocation %ld failed: %ld blocks kept", name, n, live_blocks());
        if (!reached) {
            printf("%s: a first forward makes %ld allocations; each failed cleanly\n", name, n);
            return;
        }
    }
    TEST_CHECK(&tally, 0, "%s: forward makes more than %d allocations", name, MAX_STEPS);
}

/* A prefill of two sequences, then a fork and a decode step of the parent and
 * the fork, each allocation of the cache's create, add, fork and the cached
 * forwards failed in turn. */
static sneppx_status cached_steps(const sneppx_config *config, sneppx_layer *layer, float *out, int64_t *lengths,
                                  long *armed_at)
{
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.capacity_tokens = 64;
    options.page_size = 4;
    options.max_sequence_tokens = 4; /* so that the decode's append grows the page table */
    sneppx_kv_cache *cache = NULL;
    int64_t ids[3] = {-1, -1, -1};
    const int64_t prefill[2] = {SEQ, SEQ - 2}, decode[3] = {1, 1, 1};
    sneppx_status status = sneppx_kv_cache_create(config, &options, &cache);
    if (status == SNEPPX_OK)
        status = sneppx_kv_cache_add_sequence(cache, &ids[0]);
    if (status == SNEPPX_OK)
        status = sneppx_kv_cache_add_sequence(cache, &ids[1]);
    if (status == SNEPPX_OK)
        status = sneppx_layer_forward_cached(layer, cache, 0, 2, ids, prefill, hidden, NULL, NULL, out);
    if (status == SNEPPX_OK)
        status = sneppx_kv_cache_fork(cache, ids[0], &ids[2]);
    float *step_out = out + (SEQ + SEQ - 2) * HIDDEN;
    /* A failed step leaves the lengths as they were: record them before it. */
    for (int i = 0; i < 3 && status == SNEPPX_OK; i++)
        sneppx_kv_cache_length(cache, ids[i], &lengths[i]);
    if (status == SNEPPX_OK) {
        *armed_at = atomic_load(&counted);
        status = sneppx_layer_forward_cached(layer, cache, 0, 3, ids, decode, hidden + 2 * HIDDEN, NULL, NULL,
                                             step_out);
    }
    if (status != SNEPPX_OK && cache && ids[2] >= 0) {
        /* lengths[] hold what the failed step had; the cache must still say so */
        int64_t now[3];
        for (int i = 0; i < 3; i++)
            if (sneppx_kv_cache_length(cache, ids[i], &now[i]) != SNEPPX_OK || now[i] != lengths[i])
                lengths[0] = -1;
    }
    sneppx_kv_cache_destroy(cache);
    return status;
}

static void cached_fails_cleanly(const char *name, const sneppx_config *config)
{
    enum { OUT = (SEQ + SEQ - 2 + 3) * HIDDEN };
    static float cached_want[OUT], cached_got[OUT];
    sneppx_layer *layer = NULL;
    if (!TEST_CHECK(&tally, sneppx_layer_create(config, NULL, &layer) == SNEPPX_OK, "%s: create: %s", name,
                    sneppx_last_error()))
        return;
    int64_t lengths[3];
    long step_at = 0;
    TEST_CHECK(&tally, cached_steps(config, layer, cached_want, lengths, &step_at) == SNEPPX_OK,
               "%s: cached steps: %s", name, sneppx_last_error());
    for (long n = 0; n < MAX_STEPS; n++) {
        test_fill_sentinel(cached_got, OUT);
        arm(n);
        const sneppx_status status = cached_steps(config, layer, cached_got, lengths, &step_at);
        disarm();
        const int reached = atomic_load(&failed);
        if (status == SNEPPX_OK) {
            TEST_CHECK(&tally, memcmp(cached_got, cached_want, sizeof cached_got) == 0,
                       "%s: allocation %ld failed, the cached steps succeeded, results differ", name, n);
        } else {
            TEST_CHECK(&tally, reached && status == SNEPPX_ERR_OUT_OF_MEMORY,
                       "%s: allocation %ld failed: returned %s: %s", name, n, sneppx_status_name(status),
                       sneppx_last_error());
            if (n >= step_at) {
                TEST_CHECK(&tally, lengths[0] >= 0, "%s: allocation %ld failed the decode step: the cache's "
                           "lengths changed", name, n);
                TEST_CHECK(&tally, test_all_sentinel(cached_got + (SEQ + SEQ - 2) * HIDDEN, 3 * HIDDEN),
                           "%s: allocation %ld failed the decode step: out written", name, n);
            }
        }
        TEST_CHECK(&tally, live_blocks() == 0, "%s: allocation %ld failed: %ld blocks kept", name, n, live_blocks());
        if (!reached) {
            printf("%s: the cached steps make %ld allocations; each failed cleanly\n", name, n);
            sneppx_layer_destroy(layer);
            return;
        }
    }
    sneppx_layer_destroy(layer);
    TEST_CHECK(&tally, 0, "%s: the cached steps make more than %d allocations", name, MAX_STEPS);
}

/* A warm forward allocates nothing (API.md), also when two threads run
 * forwards of one shape on one layer at once, on different OpenMP thread
 * counts (torch.set_num_threads sets the calling thread's): the pool keeps a
 * workspace for each caller, and lends each the one that fits it. The first
 * round warms the pool, but on a loaded host its two calls may not overlap
 * (one ends before the other starts), and the first round in which they do
 * makes the second workspace: one round may allocate, no more. A pool that
 * drops a caller's workspace allocates in every round the calls overlap. */
enum { CALLERS = 2, ROUNDS = 60 };
static pthread_barrier_t round_start, round_end;
static sneppx_layer *shared_layer;
static float caller_out[CALLERS][TOKENS * HIDDEN];
static int caller_failures;

static void *concurrent_caller(void *context)
{
    float *out = context;
    omp_set_num_threads(out == caller_out[0] ? 2 : 1);
    for (int round = 0; round < ROUNDS + 1; round++) {
        pthread_barrier_wait(&round_start);
        if (forward(shared_layer, out) != SNEPPX_OK || memcmp(out, want, sizeof want) != 0)
            __atomic_add_fetch(&caller_failures, 1, __ATOMIC_RELAXED);
        pthread_barrier_wait(&round_end);
    }
    return NULL;
}

static void concurrent_warm_forwards_allocate_nothing(const char *name, const sneppx_config *config)
{
    if (!TEST_CHECK(&tally, sneppx_layer_create(config, NULL, &shared_layer) == SNEPPX_OK, "%s: create: %s", name,
                    sneppx_last_error()))
        return;
    TEST_CHECK(&tally, forward(shared_layer, want) == SNEPPX_OK, "%s: forward: %s", name, sneppx_last_error());
    pthread_barrier_init(&round_start, NULL, CALLERS + 1);
    pthread_barrier_init(&round_end, NULL, CALLERS + 1);
    pthread_t threads[CALLERS];
    for (int t = 0; t < CALLERS; t++)
        pthread_create(&threads[t], NULL, concurrent_caller, caller_out[t]);
    long allocations = 0, before = 0;
    int rounds_allocating = 0;
    for (int round = 0; round < ROUNDS + 1; round++) {
        if (round == 1) /* round 0 warms the pool, with a workspace per caller when the calls overlap */
            arm(-1);
        pthread_barrier_wait(&round_start);
        pthread_barrier_wait(&round_end);
        if (round >= 1) {
            allocations = atomic_load(&counted);
            rounds_allocating += allocations > before;
            before = allocations;
        }
    }
    disarm();
    for (int t = 0; t < CALLERS; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&round_start);
    pthread_barrier_destroy(&round_end);
    TEST_CHECK(&tally, caller_failures == 0, "%s: %d concurrent forwards failed or differ", name, caller_failures);
    TEST_CHECK(&tally, rounds_allocating <= 1,
               "%s: %d of %d rounds of %d concurrent warm forwards allocated (%ld allocations; one round may)", name,
               rounds_allocating, ROUNDS, CALLERS, allocations);
    sneppx_layer_destroy(shared_layer);
}

int main(void)
{
    dl_iterate_phdr(find_code, NULL);
    test_rng rng = test_rng_seeded(11);
    test_fill_uniform(&rng, hidden, TOKENS * HIDDEN, 1.0f);
    for (int64_t b = 0; b < BATCH; b++)
        for (int64_t i = 0; i < SEQ; i++)
            for (int64_t j = 0; j < SEQ; j++)
                mask[(b * SEQ + i) * SEQ + j] = j <= i ? -0.25f * (float)j / SEQ : -1e38f;

    sneppx_config gqa, mla, gqa_bf16;
    gqa_config(&gqa);
    mla_config(&mla);
    gqa_config(&gqa_bf16);
    gqa_bf16.weight_dtype = SNEPPX_DTYPE_BFLOAT16;
    /* Every kernel (and the disk cache's first scan) before anything is armed. */
    TEST_CHECK(&tally, sneppx_layer_warmup(&gqa) == SNEPPX_OK && sneppx_layer_warmup(&mla) == SNEPPX_OK &&
                       sneppx_layer_warmup(&gqa_bf16) == SNEPPX_OK,
               "warmup: %s", sneppx_last_error());
    test_weights weights;
    if (TEST_CHECK(&tally, test_weights_random(&gqa, 3, &weights) == 0, "weights")) {
        create_fails_cleanly("gqa, float32 weights", &gqa, &weights.view);
        test_weights_free(&weights);
    }
    create_fails_cleanly("gqa, synthetic", &gqa, NULL);
    create_fails_cleanly("gqa, bfloat16", &gqa_bf16, NULL);
    create_fails_cleanly("mla", &mla, NULL);
    forward_fails_cleanly("gqa", &gqa);
    forward_fails_cleanly("mla", &mla);
    cached_fails_cleanly("gqa", &gqa);
    cached_fails_cleanly("mla", &mla);
    concurrent_warm_forwards_allocate_nothing("gqa", &gqa);
    return test_finish(&tally);
}
#endif
