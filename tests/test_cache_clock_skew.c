/* Files dated in the future (a clock set back: a VM restored from a
 * snapshot, a wrong RTC; or another host's clock ahead on a shared file
 * system) must not defeat the size bound:
 * 1. a dead writer's temporary file dated a day ahead is an orphan (10
 *    minutes or more from now, either way) and goes at the next scan, so a
 *    small SNEPPX_CACHE_MAX_MB does not evict every entry to make room for
 *    it; one dated a minute ahead may be a live writer's and stays (and
 *    counts in the bound);
 * 2. an entry dated a day ahead counts as the least recently used, so it is
 *    evicted first instead of outliving every other entry.
 * Each store runs in a child (the bound is read once per process). */
#include "test_cache_common.h"

#include <errno.h>
#include <time.h>

enum { ORPHAN_BYTES = 256 << 10, LIVE_BYTES = 100 };

static char dir[CACHE_TEST_DIR_MAX];

/* ---- the child: compiles and stores the rmsnorm keys of $SNEPPX_TEST_NORMS -------- */

static int child_store(void)
{
    const char *list = getenv("SNEPPX_TEST_NORMS");
    for (const char *at = list; at && *at; at += strcspn(at, ","), at += *at == ',') {
        const int64_t values[] = {atoll(at)};
        const sneppx_kernel *kernel = NULL;
        sneppx_status status = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel);
        if (status != SNEPPX_OK) {
            printf("rmsnorm n%lld: %s\n", (long long)values[0], sneppx_last_error());
            return 1;
        }
    }
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    printf("evictions %llu writes %llu\n", (unsigned long long)stats.evictions,
           (unsigned long long)stats.disk_writes);
    return 0;
}

/* ---- the parent ---------------------------------------------------------------- */

static void entry_path(int64_t n, char *path, size_t size)
{
    char key[SNEPPX_KEY_MAX];
    const int64_t values[] = {n};
    sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), key, sizeof key);
    cache_test_entry_path(dir, key, path, size);
}

static long long size_of(const char *path)
{
    struct stat info;
    return lstat(path, &info) == 0 ? (long long)info.st_size : -1;
}

/* Dates path seconds from now (ahead when positive). */
static int date(const char *path, time_t seconds)
{
    struct timespec times[2];
    clock_gettime(CLOCK_REALTIME, &times[0]);
    times[0].tv_sec += seconds;
    times[1] = times[0];
    return utimensat(AT_FDCWD, path, times, AT_SYMLINK_NOFOLLOW);
}

/* A store's temporary file of the key of rmsnorm n: the entry magic, bytes long. */
static int plant_temp(int64_t n, const char *writer, long long bytes, time_t ahead, char *path, size_t size)
{
    char key[SNEPPX_KEY_MAX];
    const int64_t values[] = {n};
    sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), key, sizeof key);
    snprintf(path, size, "%s/.%s.o.tmp-%s", dir, key, writer);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    int ok = fd >= 0 && write(fd, "sneppxK\n", 8) == 8 && ftruncate(fd, bytes) == 0;
    if (fd >= 0)
        close(fd);
    return ok && date(path, ahead) == 0 ? 0 : -1;
}

/* Runs the child storing norms under bound ("SNEPPX_CACHE_MAX_MB=..."). */
static int run_store(test_tally *tally, const char *what, const char *norms, const char *bound,
                     unsigned long long *evictions)
{
    char env_norms[128];
    snprintf(env_norms, sizeof env_norms, "SNEPPX_TEST_NORMS=%s", norms);
    const char *env[] = {env_norms, bound, NULL};
    char *output = NULL;
    unsigned long long writes = 0;
    int code = cache_test_run_child("store", env, &output);
    const char *line = output ? strstr(output, "evictions ") : NULL;
    int ok = code == 0 && line && sscanf(line, "evictions %llu writes %llu", evictions, &writes) == 2 && writes > 0;
    TEST_CHECK(tally, ok, "%s: exit %d, output: %s", what, code, output ? output : "");
    free(output);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "store") == 0)
        return child_store();

    test_tally tally = {0};
    if (cache_test_make_dir(dir, sizeof dir, "clock-skew") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    unsetenv("SNEPPX_JIT");
    char a[CACHE_TEST_PATH_MAX], b[CACHE_TEST_PATH_MAX], c[CACHE_TEST_PATH_MAX], d[CACHE_TEST_PATH_MAX];
    char orphan[CACHE_TEST_PATH_MAX], live[CACHE_TEST_PATH_MAX], bound[64];
    entry_path(96, a, sizeof a);
    entry_path(112, b, sizeof b);
    entry_path(128, c, sizeof c);
    entry_path(144, d, sizeof d);
    unsigned long long evictions = 0;

    /* 1. Two entries, a day-ahead orphan far larger than the room left, a
     * minute-ahead live writer's file; the bound holds the entries, the
     * live file and a third entry with room to spare, not the orphan. */
    if (run_store(&tally, "two entries", "96,112", "SNEPPX_CACHE_MAX_MB=0", &evictions) != 0)
        goto done;
    const long long entry = size_of(a) > size_of(b) ? size_of(a) : size_of(b);
    if (!TEST_CHECK(&tally, plant_temp(160, "1-0", ORPHAN_BYTES, 24 * 3600, orphan, sizeof orphan) == 0 &&
                                plant_temp(176, "2-0", LIVE_BYTES, 60, live, sizeof live) == 0,
                    "cannot plant the temporary files: %s", strerror(errno)))
        goto done;
    snprintf(bound, sizeof bound, "SNEPPX_CACHE_MAX_MB=%.9f", (double)(4 * entry + LIVE_BYTES) / (1 << 20));
    if (run_store(&tally, "a store beside a day-ahead orphan", "128", bound, &evictions) != 0)
        goto done;
    TEST_CHECK(&tally, size_of(orphan) < 0, "the orphan dated a day ahead is removed: %s", orphan);
    TEST_CHECK(&tally, size_of(live) == LIVE_BYTES, "the temporary file dated a minute ahead stays: %s", live);
    TEST_CHECK(&tally, evictions == 0 && size_of(a) > 0 && size_of(b) > 0 && size_of(c) > 0,
               "no entry evicted to make room for the orphan: %llu evictions; entries %lld %lld %lld", evictions,
               size_of(a), size_of(b), size_of(c));

    /* 2. The first entry dated a day ahead; a bound that holds three of
     * the four entries (and the live file): the day-ahead one goes. */
    TEST_CHECK(&tally, date(a, 24 * 3600) == 0, "utimensat %s: %s", a, strerror(errno));
    const long long four = size_of(a) + size_of(b) + size_of(c) + entry;
    snprintf(bound, sizeof bound, "SNEPPX_CACHE_MAX_MB=%.9f", (double)(four * 37 / 40 + LIVE_BYTES) / (1 << 20));
    if (run_store(&tally, "a store past the bound", "144", bound, &evictions) != 0)
        goto done;
    TEST_CHECK(&tally, evictions == 1 && size_of(a) < 0 && size_of(b) > 0 && size_of(c) > 0 && size_of(d) > 0,
               "the entry dated a day ahead is evicted first: %llu evictions (want 1); entries %lld %lld %lld %lld "
               "(want the first gone)", evictions, size_of(a), size_of(b), size_of(c), size_of(d));
done:
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
