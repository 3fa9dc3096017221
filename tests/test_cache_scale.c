/* A cache directory of 50,000 entries: a store must not read the whole
 * directory each time (the size bound's scan opens every entry to check its
 * magic). A process scans at its first store and again only when its stores
 * since would pass the bound (eviction then leaves room: 90% of it).
 *
 * The parent fills a directory with small fake entries (the entry magic, key
 * names), then runs children that compile and store keys:
 * - under the default bound, 6 stores make exactly 1 scan;
 * - with a bound just above the directory plus one more entry, the first
 *   store scans (the process's first) and the second scans again (it passes
 *   the bound) and evicts the oldest fakes down to 90% of the bound;
 * - with a bound of one byte, every store passes it: one scan each.
 * Every child prints each store's time, for the record (not asserted: the
 * machine is shared). */
#include "test_cache_common.h"

#include <dirent.h>
#include <errno.h>
#include <time.h>

#include "disk_cache.h"

enum { FAKE_ENTRIES = 50000, FAKE_BYTES = 64, STORES = 6 };

/* ---- the child: stores keys, prints the scans after each ---------------------- */

/* argv: the first rmsnorm n, the number of keys (n, n + 16, ...). */
static int child_store(int first_n, int count)
{
    for (int i = 0; i < count; i++) {
        const int64_t values[] = {first_n + 16 * i};
        const sneppx_kernel *kernel = NULL;
        sneppx_status status = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel);
        sneppx_kernel_timing timing;
        sneppx_kernel_last_timing(&timing);
        if (status != SNEPPX_OK || timing.source != SNEPPX_KERNEL_SOURCE_COMPILED) {
            printf("store %d: %s source %d: %s\n", i, sneppx_status_name(status), (int)timing.source,
                   sneppx_last_error());
            return 1;
        }
        /* The resolve, less compiling and linking: writing the entry and the bound's work. */
        printf("store %d scans %llu ms %.1f\n", i, (unsigned long long)sneppx_disk_cache_scan_count(),
               timing.total_ms - timing.compile_ms - timing.load_ms);
    }
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    printf("evictions %llu\n", (unsigned long long)stats.evictions);
    return 0;
}

/* ---- the parent ------------------------------------------------------------------ */

static char dir[CACHE_TEST_DIR_MAX];

/* The fakes are written before any real entry, so they are the least
 * recently used. */
static int fill(void)
{
    const char header[FAKE_BYTES] = "sneppxK\n";
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY);
    for (int i = 0; i < FAKE_ENTRIES && dir_fd >= 0; i++) {
        char name[64];
        snprintf(name, sizeof name, "gemm-k%d-n1-bias0-v16.o", i + 1);
        int fd = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0 || write(fd, header, sizeof header) != (ssize_t)sizeof header) {
            fprintf(stderr, "cannot write %s/%s: %s\n", dir, name, strerror(errno));
            if (fd >= 0)
                close(fd);
            close(dir_fd);
            return -1;
        }
        close(fd);
    }
    if (dir_fd < 0)
        return -1;
    close(dir_fd);
    return 0;
}

/* Bytes of the cache entries (*.o) in dir, and of the largest. */
static unsigned long long entry_bytes(unsigned long long *largest)
{
    unsigned long long total = 0;
    *largest = 0;
    DIR *stream = opendir(dir);
    for (struct dirent *item; stream && (item = readdir(stream)) != NULL;) {
        size_t length = strlen(item->d_name);
        struct stat info;
        if (length > 2 && strcmp(item->d_name + length - 2, ".o") == 0 &&
            fstatat(dirfd(stream), item->d_name, &info, 0) == 0) {
            total += (unsigned long long)info.st_size;
            if (strncmp(item->d_name, "rmsnorm", 7) == 0 && (unsigned long long)info.st_size > *largest)
                *largest = (unsigned long long)info.st_size;
        }
    }
    if (stream)
        closedir(stream);
    return total;
}

/* Runs `self store first_n count` with the bound; fills scans[] (after each
 * store) and *evictions; returns the exit code. */
static int run_stores(const char *what, const char *bound, int first_n, int count, unsigned long long *scans,
                      unsigned long long *evictions)
{
    char scenario[64];
    snprintf(scenario, sizeof scenario, "store-%d-%d", first_n, count);
    const char *env[] = {bound, NULL};
    char *output = NULL;
    int code = cache_test_run_child(scenario, env, &output);
    double total_ms = 0;
    const char *at = output;
    for (int i = 0; i < count && code == 0; i++) {
        int index;
        double ms;
        at = at ? strstr(at, "store ") : NULL;
        if (!at || sscanf(at, "store %d scans %llu ms %lf", &index, &scans[i], &ms) != 3 || index != i)
            code = -2;
        else
            total_ms += ms, at++;
    }
    at = output ? strstr(output, "evictions ") : NULL;
    if (code == 0 && (!at || sscanf(at, "evictions %llu", evictions) != 1))
        code = -2;
    printf("%s (%s): %d stores, %.1f ms storing in all; scans after each:", what, bound, count, total_ms);
    for (int i = 0; i < count && code == 0; i++)
        printf(" %llu", scans[i]);
    printf("\n");
    if (code != 0)
        printf("  child exit %d, output:\n%s\n", code, output ? output : "");
    free(output);
    return code;
}

int main(int argc, char **argv)
{
    int first_n, count;
    if (argc == 2 && sscanf(argv[1], "store-%d-%d", &first_n, &count) == 2)
        return child_store(first_n, count);

    test_tally tally = {0};
    if (cache_test_make_dir(dir, sizeof dir, "scale") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    unsetenv("SNEPPX_JIT");
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (fill() != 0) {
        cache_test_remove_tree(dir);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    printf("%d fake entries written in %.1f s\n", FAKE_ENTRIES,
           (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) * 1e-9);

    unsigned long long scans[STORES], evictions = 0, largest;
    int code = run_stores("default bound", "SNEPPX_CACHE_MAX_MB", 32, STORES, scans, &evictions);
    TEST_CHECK(&tally, code == 0 && scans[STORES - 1] == 1 && evictions == 0,
               "%d stores into %d entries under the default bound: %llu scans (want 1), %llu evictions (want 0)",
               STORES, FAKE_ENTRIES, code == 0 ? scans[STORES - 1] : 0, evictions);

    /* Room for one more entry, not two: the second store passes the bound. */
    const unsigned long long before = entry_bytes(&largest);
    char bound[64];
    snprintf(bound, sizeof bound, "SNEPPX_CACHE_MAX_MB=%.9f", (double)(before + largest + largest / 2) / (1 << 20));
    code = run_stores("bound passed at the second store", bound, 32 + 16 * STORES, 2, scans, &evictions);
    const unsigned long long after = entry_bytes(&largest);
    const double bound_bytes = (double)(before + largest + largest / 2);
    TEST_CHECK(&tally, code == 0 && scans[0] == 1 && scans[1] == 2,
               "the first store scans, the one that passes the bound scans again: scans %llu, %llu (want 1, 2)",
               code == 0 ? scans[0] : 0, code == 0 ? scans[1] : 0);
    TEST_CHECK(&tally, code == 0 && evictions > 0 && (double)after <= 0.9 * bound_bytes &&
                           (double)after > 0.9 * bound_bytes - 2.0 * (double)largest,
               "%llu evictions leave %llu bytes: at most 90%% of the bound (%.0f), within two entries of it",
               evictions, after, 0.9 * bound_bytes);

    /* A bound of one byte: every store passes it. */
    code = run_stores("bound of one byte", "SNEPPX_CACHE_MAX_MB=1e-9", 32 + 16 * (STORES + 2), 3, scans, &evictions);
    TEST_CHECK(&tally, code == 0 && scans[0] == 1 && scans[1] == 2 && scans[2] == 3,
               "a bound of one byte: one scan per store (%llu, %llu, %llu)", code == 0 ? scans[0] : 0,
               code == 0 ? scans[1] : 0, code == 0 ? scans[2] : 0);

    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
