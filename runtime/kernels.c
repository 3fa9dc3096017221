/* Kernel dispatch (runtime/kernels.h): key -> compiled entry points.
 *
 * Three levels: the in-memory table (a lock-free read: published nodes never
 * move or change), the disk cache (runtime/disk_cache.c), the LLVM JIT
 * (runtime/jit.c). A miss is built under a per-key pending record, so threads
 * asking for the same key wait for one build while other keys build in
 * parallel; processes building the same key serialize on the disk cache's
 * per-key lock (for at most SNEPPX_CACHE_LOCK_TIMEOUT: a holder that is
 * stopped never lets go, and then both build). */
#include "kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "disk_cache.h"
#include "error.h"
#include "fingerprint.h"
#include "host.h"
#include "jit.h"
#include "kernel_registry.h"
#include "sneppx/cache.h"

_Static_assert(SNEPPX_KEY_MAX == SNEPPX_CACHE_KEY_MAX, "one key size in the internal and public headers");

#define BUCKET_COUNT 256 /* chains, so the table never fills; a layer needs about ten keys */

sneppx_status sneppx_kernel_fingerprint(const char *key, uint8_t fingerprint[SNEPPX_SHA256_SIZE])
{
    char family[SNEPPX_KEY_MAX];
    const struct sneppx_target *target;
    sneppx_status status = sneppx_kernel_key_parse(key, family, sizeof family, &target);
    if (status != SNEPPX_OK)
        return status;
    const struct sneppx_kernel_family *kernel_family = sneppx_kernel_family_find(family);
    if (!kernel_family)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "kernel '%s': this build embeds no %s bitcode for target %s",
                           key, family, target->name);
    return sneppx_kernel_fingerprint_for(kernel_family, target, key, fingerprint);
}

sneppx_status sneppx_kernel_fingerprint_for(const struct sneppx_kernel_family *family,
                                            const struct sneppx_target *target, const char *key,
                                            uint8_t fingerprint[SNEPPX_SHA256_SIZE])
{
    const struct sneppx_embedded_bitcode *bitcode = sneppx_kernel_bitcode_find(family->family, target);
    if (!bitcode)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "kernel '%s': this build embeds no %s bitcode for target %s",
                           key, family->family, target->name);
    sneppx_fingerprint_kernel(key, bitcode->sha256_hex, sneppx_host_info(), sneppx_jit_options(),
                              family->jit_pipeline, fingerprint);
    return SNEPPX_OK;
}

/* ---- statistics --------------------------------------------------------------- */

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static sneppx_jit_stats stats;               /* all but memory_hits, under stats_lock */
static atomic_uint_fast64_t memory_hits;     /* the hot path: no lock */
static _Thread_local sneppx_kernel_timing last_timing;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* What one build did to the disk cache, for the statistics. */
struct disk_events {
    int rejects, writes, evictions;
};

static void record_build(const sneppx_kernel_timing *timing, const struct disk_events *events)
{
    pthread_mutex_lock(&stats_lock);
    stats.compiles += timing->source == SNEPPX_KERNEL_SOURCE_COMPILED;
    stats.disk_hits += timing->source == SNEPPX_KERNEL_SOURCE_DISK;
    stats.disk_rejects += (uint64_t)events->rejects;
    stats.disk_writes += (uint64_t)events->writes;
    stats.evictions += (uint64_t)events->evictions;
    stats.compile_ms_total += timing->compile_ms;
    stats.load_ms_total += timing->load_ms;
    if (timing->source != SNEPPX_KERNEL_SOURCE_NONE) {
        memcpy(stats.last_key, timing->key, sizeof stats.last_key);
        stats.last_source = timing->source;
        stats.last_ms = timing->total_ms;
    }
    pthread_mutex_unlock(&stats_lock);
}

sneppx_status sneppx_jit_stats_get(sneppx_jit_stats *out)
{
    sneppx_clear_error();
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "stats is NULL");
    pthread_mutex_lock(&stats_lock);
    *out = stats;
    pthread_mutex_unlock(&stats_lock);
    out->memory_hits = atomic_load_explicit(&memory_hits, memory_order_relaxed);
    return SNEPPX_OK;
}

sneppx_status sneppx_kernel_last_timing(sneppx_kernel_timing *timing)
{
    sneppx_clear_error();
    if (!timing)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "timing is NULL");
    *timing = last_timing;
    return SNEPPX_OK;
}

/* ---- building one kernel: disk cache, else LLVM ------------------------------ */

/* Says once per process that the disk cache cannot keep a kernel. */
static void warn_store_failure(const char *key)
{
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    sneppx_log(atomic_flag_test_and_set(&warned) ? 2 : 0, "warning: kernel '%s' stays in memory only: %s", key,
               sneppx_last_error());
}

/* Loads the verified entry of key; a refused one is logged and counted once,
 * and why it was refused is left in reason. */
static sneppx_disk_load load_entry(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                   void **object, size_t *object_size, struct disk_events *events, char *reason,
                                   size_t reason_size)
{
    sneppx_disk_load result = sneppx_disk_cache_load(key, fingerprint, object, object_size, reason, reason_size);
    if (result == SNEPPX_DISK_REJECTED) {
        if (events->rejects == 0)
            sneppx_log(1, "disk cache entry of '%s' refused (%s); rebuilding it", key, reason);
        events->rejects = 1;
    }
    return result;
}

/* The object bundle of the kernel: a verified disk cache entry, else compiled
 * under the key's cross-process lock (after looking again, since the process
 * that held the lock may have written it) and stored. Without the lock
 * (memory-only or read-only cache, a refused lock file, or another process
 * holding it past the lock timeout) it is compiled all the same: a store is
 * atomic, so building a key twice costs only time. skip_disk: compile and
 * store whatever the cache holds (its entry verified but did not link). */
static sneppx_status obtain_object(const struct sneppx_kernel_family *family, const int64_t *values,
                                   const struct sneppx_target *target, const char *key, int skip_disk, void **object,
                                   size_t *object_size, sneppx_kernel_timing *timing, struct disk_events *events)
{
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    sneppx_status status = sneppx_kernel_fingerprint_for(family, target, key, fingerprint);
    if (status != SNEPPX_OK)
        return status;
    timing->source = SNEPPX_KERNEL_SOURCE_DISK;
    char reason[160];
    const sneppx_disk_load loaded =
        skip_disk ? SNEPPX_DISK_MISS : load_entry(key, fingerprint, object, object_size, events, reason, sizeof reason);
    if (loaded == SNEPPX_DISK_HIT)
        return SNEPPX_OK;
    if (!sneppx_jit_allowed()) {
        /* A deployed cache whose entries another build or CPU wrote is refused entry by
         * entry: the error says so, not only that no entry is valid. */
        const char *dir = sneppx_disk_cache_path();
        timing->source = SNEPPX_KERNEL_SOURCE_NONE;
        return sneppx_fail(SNEPPX_ERR_JIT, "SNEPPX_JIT=0 forbids compiling kernel '%s', and the disk cache (%s) "
                           "holds no valid entry for it%s%s%s", key, dir ? dir : "memory-only",
                           loaded == SNEPPX_DISK_REJECTED ? " (its entry is refused: " : "",
                           loaded == SNEPPX_DISK_REJECTED ? reason : "", loaded == SNEPPX_DISK_REJECTED ? ")" : "");
    }
    int lock = sneppx_disk_cache_lock(key);
    if (lock >= 0 && !skip_disk &&
        load_entry(key, fingerprint, object, object_size, events, reason, sizeof reason) == SNEPPX_DISK_HIT) {
        sneppx_disk_cache_unlock(lock);
        return SNEPPX_OK;
    }
    timing->source = SNEPPX_KERNEL_SOURCE_COMPILED;
    double compile_start = now_ms();
    status = sneppx_jit_compile_object(family, values, target, 0, object, object_size);
    timing->compile_ms = now_ms() - compile_start;
    if (status == SNEPPX_OK) {
        if (sneppx_disk_cache_store(key, fingerprint, *object, *object_size, &events->evictions) == SNEPPX_OK)
            events->writes = sneppx_disk_cache_path() != NULL;
        else
            warn_store_failure(key);
    } else {
        timing->source = SNEPPX_KERNEL_SOURCE_NONE;
    }
    sneppx_disk_cache_unlock(lock);
    return status;
}

/* Fills kernel->entry for kernel->key from the disk cache or the JIT. */
static sneppx_status build_kernel(const struct sneppx_kernel_family *family, const int64_t *values,
                                  const struct sneppx_target *target, sneppx_kernel *kernel, sneppx_kernel_timing *timing)
{
    const char *key = kernel->key;
    struct disk_events events = {0};
    void *object = NULL;
    size_t object_size = 0;
    double start = now_ms();
    sneppx_status status = obtain_object(family, values, target, key, 0, &object, &object_size, timing, &events);
    double link_start = now_ms();
    int object_at_fault = 0;
    if (status == SNEPPX_OK) {
        status = sneppx_jit_link_object(family, key, object, object_size, kernel->entry, &object_at_fault);
        free(object);
        object = NULL;
    }
    /* An entry that verified (its hash, fingerprint and size) but does not unpack or link
     * was written by something else than this build's store: a rejected entry, rebuilt
     * and replaced, not a key that fails in every process until a clear. */
    if (status != SNEPPX_OK && object_at_fault && timing->source == SNEPPX_KERNEL_SOURCE_DISK) {
        char reason[512];
        snprintf(reason, sizeof reason, "%s", sneppx_last_error());
        events.rejects = 1;
        if (!sneppx_jit_allowed()) {
            status = sneppx_fail(SNEPPX_ERR_JIT, "SNEPPX_JIT=0 forbids compiling kernel '%s', and its disk cache "
                                 "entry does not link (%s)", key, reason);
        } else {
            sneppx_log(1, "disk cache entry of '%s' refused (it does not link: %s); rebuilding it", key, reason);
            status = obtain_object(family, values, target, key, 1, &object, &object_size, timing, &events);
            link_start = now_ms();
            if (status == SNEPPX_OK) {
                status = sneppx_jit_link_object(family, key, object, object_size, kernel->entry, &object_at_fault);
                free(object);
            }
        }
    }
    if (status != SNEPPX_OK)
        timing->source = SNEPPX_KERNEL_SOURCE_NONE;
    double end = now_ms();
    /* A hit's load time includes reading and verifying the file. */
    timing->load_ms = timing->source == SNEPPX_KERNEL_SOURCE_DISK ? end - start : end - link_start;
    timing->total_ms = end - start;
    record_build(timing, &events);
    if (timing->source == SNEPPX_KERNEL_SOURCE_COMPILED)
        sneppx_log(1, "compiled %s in %.1f ms (link %.1f ms)", key, timing->compile_ms, timing->load_ms);
    else if (timing->source == SNEPPX_KERNEL_SOURCE_DISK)
        sneppx_log(2, "loaded %s from the disk cache in %.2f ms", key, timing->load_ms);
    return status;
}

/* ---- the in-memory table -------------------------------------------------------- */

struct node {
    sneppx_kernel kernel;
    uint64_t hash;
    struct node *next;      /* set before the node is published, never after */
};

/* A build in progress; waiters sleep on build_done until done is set. */
struct pending {
    char key[SNEPPX_KEY_MAX];
    int waiters, done;
    sneppx_status status;
    char message[512];
    const sneppx_kernel *result;
    struct pending *next;
};

static _Atomic(struct node *) buckets[BUCKET_COUNT];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER; /* writers, pending builds */
static pthread_cond_t build_done = PTHREAD_COND_INITIALIZER;
static struct pending *pending_builds;

static uint64_t hash_key(const char *key)
{
    uint64_t hash = 1469598103934665603ull; /* FNV-1a */
    for (; *key; key++)
        hash = (hash ^ (unsigned char)*key) * 1099511628211ull;
    return hash;
}

static const sneppx_kernel *find_published(const char *key, uint64_t hash)
{
    struct node *n = atomic_load_explicit(&buckets[hash % BUCKET_COUNT], memory_order_acquire);
    for (; n; n = n->next)
        if (n->hash == hash && strcmp(n->kernel.key, key) == 0)
            return &n->kernel;
    return NULL;
}

static struct pending *find_pending(const char *key)
{
    for (struct pending *p = pending_builds; p; p = p->next)
        if (strcmp(p->key, key) == 0)
            return p;
    return NULL;
}

static void unlink_pending(struct pending *build)
{
    for (struct pending **link = &pending_builds; *link; link = &(*link)->next)
        if (*link == build) {
            *link = build->next;
            return;
        }
}

/* Waits (table_lock held) for another thread's build of the same key. */
static sneppx_status wait_for(struct pending *build, const sneppx_kernel **kernel)
{
    build->waiters++;
    while (!build->done)
        pthread_cond_wait(&build_done, &table_lock);
    sneppx_status status = build->status;
    *kernel = build->result;
    if (status != SNEPPX_OK)
        sneppx_fail(status, "%s", build->message);
    if (--build->waiters == 0)
        free(build);
    return status;
}

/* The slow path: build key (or wait for the thread building it) and publish it. */
static sneppx_status resolve_miss(const struct sneppx_kernel_family *family, const int64_t *values,
                                  const struct sneppx_target *target, const char *key, uint64_t hash, const sneppx_kernel **kernel,
                                  sneppx_kernel_timing *timing)
{
    pthread_mutex_lock(&table_lock);
    if ((*kernel = find_published(key, hash)) != NULL) {
        pthread_mutex_unlock(&table_lock);
        timing->source = SNEPPX_KERNEL_SOURCE_MEMORY;
        atomic_fetch_add_explicit(&memory_hits, 1, memory_order_relaxed);
        return SNEPPX_OK;
    }
    struct pending *build = find_pending(key);
    if (build) {
        sneppx_status status = wait_for(build, kernel);
        pthread_mutex_unlock(&table_lock);
        if (status == SNEPPX_OK) {
            /* Another thread built it: to this caller, a memory hit. */
            timing->source = SNEPPX_KERNEL_SOURCE_MEMORY;
            atomic_fetch_add_explicit(&memory_hits, 1, memory_order_relaxed);
        }
        return status;
    }
    struct node *node = calloc(1, sizeof *node);
    build = calloc(1, sizeof *build);
    if (!node || !build) {
        pthread_mutex_unlock(&table_lock);
        free(node);
        free(build);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory resolving kernel '%s'", key);
    }
    snprintf(build->key, sizeof build->key, "%s", key);
    build->next = pending_builds;
    pending_builds = build;
    pthread_mutex_unlock(&table_lock);

    snprintf(node->kernel.key, sizeof node->kernel.key, "%s", key);
    node->hash = hash;
    sneppx_status status = build_kernel(family, values, target, &node->kernel, timing);

    pthread_mutex_lock(&table_lock);
    if (status == SNEPPX_OK) {
        _Atomic(struct node *) *bucket = &buckets[hash % BUCKET_COUNT];
        node->next = atomic_load_explicit(bucket, memory_order_relaxed);
        atomic_store_explicit(bucket, node, memory_order_release);
        *kernel = &node->kernel;
    } else {
        snprintf(build->message, sizeof build->message, "%s", sneppx_last_error());
        free(node);
    }
    build->status = status;
    build->result = *kernel;
    build->done = 1;
    unlink_pending(build);
    if (build->waiters == 0)
        free(build);
    pthread_cond_broadcast(&build_done);
    pthread_mutex_unlock(&table_lock);
    return status;
}

void sneppx_kernel_prepare(void) { sneppx_jit_prepare(); }

sneppx_status sneppx_kernel_resolve(const char *family, const int64_t *values, const struct sneppx_target *target,
                                    const sneppx_kernel **kernel)
{
    double start = now_ms();
    sneppx_kernel_timing timing = {.source = SNEPPX_KERNEL_SOURCE_NONE};
    if (!kernel)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "kernel is NULL");
    *kernel = NULL;
    sneppx_status status = sneppx_kernel_key(family, values, target, timing.key, sizeof timing.key);
    if (status != SNEPPX_OK) {
        last_timing = timing;
        return status;
    }
    uint64_t hash = hash_key(timing.key);
    if ((*kernel = find_published(timing.key, hash)) != NULL) {
        atomic_fetch_add_explicit(&memory_hits, 1, memory_order_relaxed);
        timing.source = SNEPPX_KERNEL_SOURCE_MEMORY;
    } else {
        status = resolve_miss(sneppx_kernel_family_find(family), values, target, timing.key, hash, kernel, &timing);
    }
    timing.total_ms = now_ms() - start;
    last_timing = timing;
    return status;
}

void sneppx_kernel_cache_reset_for_testing(void)
{
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < BUCKET_COUNT; i++) {
        struct node *n = atomic_exchange(&buckets[i], NULL);
        while (n) {
            struct node *next = n->next;
            free(n);
            n = next;
        }
    }
    pthread_mutex_unlock(&table_lock);
    pthread_mutex_lock(&stats_lock);
    memset(&stats, 0, sizeof stats);
    pthread_mutex_unlock(&stats_lock);
    atomic_store(&memory_hits, 0);
    sneppx_jit_unlink_all_for_testing();
}
