/* ctest: two cores (threads or processes of its own; ctest -j2 runs it alone) */
/* The in-memory kernel cache under concurrency: 8 threads asking for one cold
 * key at the same moment compile it once and get the same kernel; then 8
 * threads hammering a mix of keys (some cold) compile each key once. */
#include "test_cache_common.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>


enum { THREADS = 8, HAMMER_RESOLVES = 4000, MIXED_KEYS = 4 };

static pthread_barrier_t start_line;

struct worker {
    int64_t first_n;                         /* rmsnorm n of the first key */
    const sneppx_kernel *seen[MIXED_KEYS];   /* the kernel each key resolved to (one per key, or a failure) */
    int inconsistent, failures;
    sneppx_kernel_source source;             /* of the single-key resolve */
    char error[256];
};

static void *resolve_together(void *context)
{
    struct worker *worker = context;
    const int64_t values[] = {worker->first_n};
    pthread_barrier_wait(&start_line);
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &worker->seen[0]);
    sneppx_kernel_timing timing;
    sneppx_kernel_last_timing(&timing);
    worker->source = timing.source;
    if (status != SNEPPX_OK) {
        worker->failures++;
        snprintf(worker->error, sizeof worker->error, "%s", sneppx_last_error());
    }
    return NULL;
}

static void *hammer(void *context)
{
    struct worker *worker = context;
    test_rng rng = test_rng_seeded((uint64_t)(uintptr_t)context);
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < HAMMER_RESOLVES; i++) {
        int which = (int)(test_rng_next(&rng) % MIXED_KEYS);
        const int64_t values[] = {worker->first_n + 64 * which};
        const sneppx_kernel *kernel = NULL;
        if (sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel) != SNEPPX_OK) {
            worker->failures++;
            snprintf(worker->error, sizeof worker->error, "%s", sneppx_last_error());
            continue;
        }
        if (worker->seen[which] && worker->seen[which] != kernel)
            worker->inconsistent++;
        worker->seen[which] = kernel;
    }
    return NULL;
}

static void run_threads(void *(*body)(void *), struct worker *workers)
{
    pthread_t threads[THREADS];
    pthread_barrier_init(&start_line, NULL, THREADS);
    for (int t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, body, &workers[t]);
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&start_line);
}

static void test_one_cold_key(test_tally *tally)
{
    struct worker workers[THREADS] = {0};
    for (int t = 0; t < THREADS; t++)
        workers[t].first_n = 160;
    run_threads(resolve_together, workers);

    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(tally, stats.compiles == 1 && stats.disk_hits == 0,
               "8 threads, one cold key: %llu compiles, %llu disk hits (want 1, 0)",
               (unsigned long long)stats.compiles, (unsigned long long)stats.disk_hits);
    TEST_CHECK(tally, stats.memory_hits == THREADS - 1, "the other 7 threads are memory hits: %llu",
               (unsigned long long)stats.memory_hits);
    int compiled = 0, same = 1;
    for (int t = 0; t < THREADS; t++) {
        TEST_CHECK(tally, workers[t].failures == 0, "thread %d: %s", t, workers[t].error);
        compiled += workers[t].source == SNEPPX_KERNEL_SOURCE_COMPILED;
        same &= workers[t].seen[0] == workers[0].seen[0];
    }
    TEST_CHECK(tally, compiled == 1, "exactly one thread reports a compile: %d", compiled);
    TEST_CHECK(tally, same && workers[0].seen[0], "every thread holds the same kernel");
    if (workers[0].seen[0]) {
        double error = cache_test_rmsnorm_error(workers[0].seen[0], 160, NULL);
        TEST_CHECK(tally, error < 1e-6, "rmsnorm n160: normalized error %.3g (limit 1e-6)", error);
    }
}

static void test_hammer(test_tally *tally)
{
    sneppx_jit_stats before, after;
    sneppx_jit_stats_get(&before);
    struct worker workers[THREADS] = {0};
    for (int t = 0; t < THREADS; t++)
        workers[t].first_n = 160; /* keys n160 (warm), n224, n288, n352 (cold) */
    run_threads(hammer, workers);
    sneppx_jit_stats_get(&after);

    uint64_t compiles = after.compiles - before.compiles;
    TEST_CHECK(tally, compiles == MIXED_KEYS - 1, "%d threads x %d resolves over %d keys: %llu compiles (want %d)",
               THREADS, HAMMER_RESOLVES, MIXED_KEYS, (unsigned long long)compiles, MIXED_KEYS - 1);
    uint64_t memory_hits = after.memory_hits - before.memory_hits;
    TEST_CHECK(tally, memory_hits == (uint64_t)(THREADS * HAMMER_RESOLVES) - compiles,
               "every other resolve is a memory hit: %llu", (unsigned long long)memory_hits);
    for (int t = 0; t < THREADS; t++)
        TEST_CHECK(tally, workers[t].failures == 0 && workers[t].inconsistent == 0,
                   "thread %d: %d failures (%s), %d resolves returned another kernel for a key", t,
                   workers[t].failures, workers[t].error, workers[t].inconsistent);
    for (int k = 0; k < MIXED_KEYS; k++) {
        const sneppx_kernel *kernel = NULL;
        int agree = 1;
        for (int t = 0; t < THREADS; t++) {
            if (workers[t].seen[k] && !kernel)
                kernel = workers[t].seen[k];
            agree &= !workers[t].seen[k] || workers[t].seen[k] == kernel;
        }
        TEST_CHECK(tally, kernel && agree, "key %d: every thread holds one kernel", k);
        if (!kernel)
            continue;
        double error = cache_test_rmsnorm_error(kernel, 160 + 64 * k, NULL);
        TEST_CHECK(tally, error < 1e-6, "%s: normalized error %.3g (limit 1e-6)", kernel->key, error);
    }
}

int main(void)
{
    test_tally tally = {0};
    /* A private cold cache: every key of this test compiles exactly once. */
    char dir[CACHE_TEST_DIR_MAX];
    if (cache_test_make_dir(dir, sizeof dir, "concurrency") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    test_one_cold_key(&tally);
    test_hammer(&tally);
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
