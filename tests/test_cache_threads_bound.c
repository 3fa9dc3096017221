/* The size bound holds when a process's threads store side by side (a layer
 * compiles its kernels on several threads). A store made while another
 * thread scans the directory does not scan itself; the scanning thread must
 * then scan again, or the last store of a burst can leave the directory over
 * the bound. Under a bound of one byte a scan leaves at most the key of the
 * store that scanned, so after each round of two stores made at the same
 * moment the directory may hold one entry, or none when each scan removed
 * the other's, never two. Files of the user's (not key-named, never evicted)
 * make each scan long enough that the other store lands inside it: without
 * the rescan, dozens of the rounds leave two entries. */
#include "test_cache_common.h"

#include <pthread.h>

#include "disk_cache.h"

enum { ROUNDS = 400, THREADS = 2, OBJECT_BYTES = 4096, USER_FILES = 300 };

static pthread_barrier_t start_line;
static int round_index;
static sneppx_status statuses[THREADS];

static void *store_one(void *argument)
{
    const int thread = (int)(intptr_t)argument;
    static const uint8_t fingerprint[SNEPPX_SHA256_SIZE] = {1};
    static uint8_t object[OBJECT_BYTES];
    char key[64];
    snprintf(key, sizeof key, "rmsnorm-n%d-v16", 16 * (THREADS * round_index + thread + 1));
    pthread_barrier_wait(&start_line);
    int evicted = 0;
    statuses[thread] = sneppx_disk_cache_store(key, fingerprint, object, sizeof object, &evicted);
    return NULL;
}

/* Files a scan lists and leaves alone. */
static int write_user_files(const char *dir)
{
    for (int i = 0; i < USER_FILES; i++) {
        char path[CACHE_TEST_PATH_MAX];
        snprintf(path, sizeof path, "%s/notes-%d.txt", dir, i);
        FILE *file = fopen(path, "w");
        if (!file)
            return -1;
        fclose(file);
    }
    return 0;
}

int main(void)
{
    test_tally tally = {0};
    char dir[CACHE_TEST_DIR_MAX];
    if (cache_test_make_dir(dir, sizeof dir, "threads-bound") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0 ||
        setenv("SNEPPX_CACHE_MAX_MB", "1e-9", 1) != 0 || write_user_files(dir) != 0) {
        perror("cache directory");
        return 1;
    }
    pthread_barrier_init(&start_line, NULL, THREADS);
    int over_bound_rounds = 0, failed_stores = 0, most_entries = 0;
    for (round_index = 0; round_index < ROUNDS; round_index++) {
        pthread_t threads[THREADS];
        for (int t = 0; t < THREADS; t++)
            pthread_create(&threads[t], NULL, store_one, (void *)(intptr_t)t);
        for (int t = 0; t < THREADS; t++)
            pthread_join(threads[t], NULL);
        for (int t = 0; t < THREADS; t++)
            failed_stores += statuses[t] != SNEPPX_OK;
        const int entries = cache_test_count_entries(dir);
        over_bound_rounds += entries > 1;
        most_entries = entries > most_entries ? entries : most_entries;
    }
    pthread_barrier_destroy(&start_line);
    TEST_CHECK(&tally, failed_stores == 0, "%d of %d stores failed", failed_stores, ROUNDS * THREADS);
    TEST_CHECK(&tally, over_bound_rounds == 0,
               "%d of %d rounds of %d simultaneous stores under a one-byte bound left more than one entry "
               "(at most %d)",
               over_bound_rounds, ROUNDS, THREADS, most_entries);
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
