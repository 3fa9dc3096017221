/* ctest: two cores (threads or processes of its own; ctest -j2 runs it alone) */
/* The disk cache across processes:
 *
 * 1. Eight processes started at once (released together from a pipe) on a
 *    cache directory that does not exist yet each warm a GQA and an MLA
 *    config. All succeed; the directory then holds exactly one valid entry
 *    per key and no temporary file; the processes compiled each key exactly
 *    once between them (the per-key flock plus the re-check after taking it)
 *    and loaded it from disk otherwise; a ninth process compiles nothing.
 * 2. A process SIGKILLed while writing an entry (mid-payload, and after the
 *    last byte but before the rename publishes it) leaves no entry under the
 *    key's name: the next resolve compiles the kernel again (it never loads
 *    the partial file), its lock is free (the kernel dropped the dead
 *    process's flock), the new entry verifies, and a cache clear removes the
 *    orphaned temporary file.
 *
 * 3. Eviction counts temporary files and removes orphaned ones: with the two
 *    writers' leftovers, one aged past 10 minutes, and a planted old one whose
 *    key's lock this process holds (a live writer), a process bounded by
 *    SNEPPX_CACHE_MAX_MB stores a key: the aged orphan is gone, the fresh
 *    one and the locked one stay, and the bytes of those two make it evict
 *    some (not all) least recently used entries.
 *
 * 4. Lock files: a clear removes a free one and keeps a held one (its holder
 *    is building that key); and a process that waited on a lock file that
 *    was unlinked meanwhile (by a user's rm, or an older version) ends up
 *    holding the lock file at the path, not the unlinked one, which would
 *    let the next process build the same key beside it.
 *
 * The kill points are exact, not timing-dependent: in the child, this file's
 * write() and renameat() stand in for libc's (the executable's definitions
 * win at link time) and SIGKILL the process at the chosen point of the
 * store; otherwise they pass straight to the system calls. */
#include "test_cache_common.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>

#include "disk_cache.h"
#include "fingerprint.h"
#include "sneppx/sneppx.h"

enum { WORKERS = 8 };

/* ---- kill points of the writer child ------------------------------------------ */

enum kill_point { KILL_NOWHERE, KILL_MID_PAYLOAD, KILL_BEFORE_RENAME };
static enum kill_point kill_point = KILL_NOWHERE;

/* True when fd is a temporary file of the cache (".<key>.o.tmp-<pid>-<n>"). */
static int is_cache_temp_file(int fd)
{
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, target, sizeof target - 1);
    if (length <= 0)
        return 0;
    target[length] = '\0';
    return strstr(target, ".o.tmp-") != NULL;
}

ssize_t write(int fd, const void *data, size_t size)
{
    /* The store writes the header, then the payload: die halfway through the payload. */
    static int cache_writes;
    if (kill_point == KILL_MID_PAYLOAD && is_cache_temp_file(fd) && ++cache_writes == 2) {
        syscall(SYS_write, fd, data, size / 2);
        kill(getpid(), SIGKILL);
    }
    return (ssize_t)syscall(SYS_write, fd, data, size);
}

int renameat(int old_dir, const char *old_path, int new_dir, const char *new_path)
{
    if (kill_point == KILL_BEFORE_RENAME && strstr(old_path, ".o.tmp-"))
        kill(getpid(), SIGKILL);
    return (int)syscall(SYS_renameat, old_dir, old_path, new_dir, new_path);
}

/* ---- children ------------------------------------------------------------------ */

static void gqa_config(sneppx_config *c)
{
    sneppx_config_init(c);
    c->hidden_size = 128, c->num_attention_heads = 8, c->num_key_value_heads = 2, c->head_dim = 16;
    c->sliding_window = 5;
}

static void mla_config(sneppx_config *c)
{
    sneppx_config_init(c);
    c->hidden_size = 128, c->num_attention_heads = 2, c->num_key_value_heads = 2, c->q_lora_rank = 32;
    c->kv_lora_rank = 32, c->qk_nope_head_dim = 16, c->qk_rope_head_dim = 16, c->v_head_dim = 16;
    c->rope_interleaved = 1;
}

/* Waits at the gate (EOF on the pipe), warms both configs, prints its counters. */
static int child_worker(int gate)
{
    char byte;
    while (read(gate, &byte, 1) > 0)
        continue;
    sneppx_config gqa, mla;
    gqa_config(&gqa);
    mla_config(&mla);
    sneppx_status status = sneppx_layer_warmup(&gqa);
    if (status == SNEPPX_OK)
        status = sneppx_layer_warmup(&mla);
    sneppx_jit_stats stats;
    char message[1024];
    snprintf(message, sizeof message, "%s", sneppx_last_error());
    sneppx_jit_stats_get(&stats);
    printf("compiles %llu disk_hits %llu rejects %llu status %s %s\n", (unsigned long long)stats.compiles,
           (unsigned long long)stats.disk_hits, (unsigned long long)stats.disk_rejects, sneppx_status_name(status),
           message);
    return status == SNEPPX_OK ? 0 : 1;
}

static const int64_t killed_norm_n[] = {208, 240}; /* rmsnorm keys of the two kill points */

/* Compiles an rmsnorm kernel and dies at the kill point while storing it. */
static int child_killed_writer(enum kill_point point)
{
    kill_point = point;
    const int64_t values[] = {killed_norm_n[point == KILL_BEFORE_RENAME]};
    const sneppx_kernel *kernel;
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel);
    printf("the store returned (%s: %s) instead of dying\n", sneppx_status_name(status), sneppx_last_error());
    return 3;
}

static const int64_t bounded_norm_n[] = {256}; /* the key the bounded child stores */

/* Resolves (compiles and stores) one key under $SNEPPX_CACHE_MAX_MB; prints the evictions. */
static int child_bounded_store(void)
{
    const sneppx_kernel *kernel;
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", bounded_norm_n, sneppx_host_target(), &kernel);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    printf("evictions %llu writes %llu status %s %s\n", (unsigned long long)stats.evictions,
           (unsigned long long)stats.disk_writes, sneppx_status_name(status), sneppx_last_error());
    return status == SNEPPX_OK ? 0 : 1;
}

/* ---- parent helpers ------------------------------------------------------------- */

/* Starts `self scenario argument` with stdout and stderr to log_path; the
 * gate's write end stays with the parent only. */
static pid_t spawn_child(const char *scenario, const char *argument, int close_fd, const char *log_path)
{
    char self[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
    if (length <= 0)
        return -1;
    self[length] = '\0';
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (close_fd >= 0)
        posix_spawn_file_actions_addclose(&actions, close_fd);
    char *argv[] = {self, (char *)scenario, (char *)argument, NULL};
    pid_t child = -1;
    if (posix_spawn(&child, self, &actions, NULL, argv, environ) != 0)
        child = -1;
    posix_spawn_file_actions_destroy(&actions);
    return child;
}

static char *read_log(const char *path)
{
    FILE *stream = fopen(path, "r");
    static char text[4096];
    text[0] = '\0';
    if (stream) {
        size_t n = fread(text, 1, sizeof text - 1, stream);
        text[n] = '\0';
        fclose(stream);
    }
    return text;
}

struct dir_census {
    int entries, locks, temps, others;
    char first_temp[NAME_MAX + 1];
};

static struct dir_census census(const char *dir)
{
    struct dir_census count = {0};
    DIR *stream = opendir(dir);
    for (struct dirent *item; stream && (item = readdir(stream)) != NULL;) {
        const char *name = item->d_name;
        size_t length = strlen(name);
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        if (name[0] == '.' && strstr(name, ".o.tmp-")) {
            if (count.temps++ == 0)
                snprintf(count.first_temp, sizeof count.first_temp, "%s", name);
        } else if (length > 2 && strcmp(name + length - 2, ".o") == 0) {
            count.entries++;
        } else if (length > 5 && strcmp(name + length - 5, ".lock") == 0) {
            count.locks++;
        } else {
            count.others++;
        }
    }
    if (stream)
        closedir(stream);
    return count;
}

/* ---- 1. eight processes at once ------------------------------------------------ */

static void test_eight_processes(test_tally *tally, const char *dir, const char *log_dir)
{
    int gate[2];
    if (pipe(gate) != 0) {
        TEST_CHECK(tally, 0, "pipe: %s", strerror(errno));
        return;
    }
    char gate_fd[16], logs[WORKERS][CACHE_TEST_PATH_MAX];
    snprintf(gate_fd, sizeof gate_fd, "%d", gate[0]);
    pid_t children[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        snprintf(logs[w], sizeof logs[w], "%s/worker-%d.log", log_dir, w);
        children[w] = spawn_child("worker", gate_fd, gate[1], logs[w]);
    }
    close(gate[0]);
    close(gate[1]); /* every worker sees EOF now: they start together */

    unsigned long long compiles = 0, disk_hits = 0, rejects = 0;
    int succeeded = 0;
    for (int w = 0; w < WORKERS; w++) {
        int status = 0;
        int exited = children[w] > 0 && waitpid(children[w], &status, 0) == children[w] && WIFEXITED(status) &&
                     WEXITSTATUS(status) == 0;
        unsigned long long c = 0, h = 0, r = 0;
        const char *log = read_log(logs[w]);
        exited &= sscanf(log, "compiles %llu disk_hits %llu rejects %llu", &c, &h, &r) == 3;
        TEST_CHECK(tally, exited, "worker %d: status 0x%x, output: %s", w, status, log);
        succeeded += exited;
        compiles += c, disk_hits += h, rejects += r;
    }
    if (succeeded != WORKERS)
        return;

    const struct dir_census files = census(dir);
    TEST_CHECK(tally, files.temps == 0 && files.others == 0 && files.entries > 0,
               "after %d workers: %d entries, %d temporary files (want 0, e.g. %s), %d foreign files", WORKERS,
               files.entries, files.temps, files.first_temp, files.others);
    TEST_CHECK(tally, compiles == (unsigned long long)files.entries && rejects == 0 &&
                          disk_hits == (unsigned long long)(WORKERS - 1) * (unsigned long long)files.entries,
               "%d workers x %d keys: %llu compiles (want %d: each key once), %llu disk hits (want %d), %llu "
               "rejected entries", WORKERS, files.entries, compiles, files.entries, disk_hits,
               (WORKERS - 1) * files.entries, rejects);

    /* Each entry is the one valid file of its key. */
    sneppx_disk_entry *entries = NULL;
    size_t count = 0;
    int valid = 0;
    if (sneppx_disk_cache_list(&entries, &count) == SNEPPX_OK) {
        for (size_t i = 0; i < count; i++) {
            uint8_t fingerprint[SNEPPX_SHA256_SIZE];
            char reason[160] = "";
            int ok = sneppx_kernel_fingerprint(entries[i].key, fingerprint) == SNEPPX_OK &&
                     sneppx_disk_cache_verify(entries[i].key, fingerprint, NULL, NULL, reason, sizeof reason) ==
                         SNEPPX_DISK_HIT;
            TEST_CHECK(tally, ok, "entry %s does not verify: %s", entries[i].key, reason);
            valid += ok;
        }
        free(entries);
    }
    TEST_CHECK(tally, valid == files.entries && (int)count == files.entries, "%d of %d listed entries verify",
               valid, (int)count);

    /* This process, the ninth, finds every kernel on disk. */
    sneppx_jit_stats before, after;
    sneppx_jit_stats_get(&before);
    sneppx_config gqa, mla;
    gqa_config(&gqa);
    mla_config(&mla);
    sneppx_status status = sneppx_layer_warmup(&gqa);
    if (status == SNEPPX_OK)
        status = sneppx_layer_warmup(&mla);
    sneppx_jit_stats_get(&after);
    TEST_CHECK(tally, status == SNEPPX_OK && after.compiles == before.compiles &&
                          after.disk_hits - before.disk_hits == (uint64_t)files.entries,
               "a ninth process: %s, %llu compiles, %llu disk hits (want 0, %d)", sneppx_last_error(),
               (unsigned long long)(after.compiles - before.compiles),
               (unsigned long long)(after.disk_hits - before.disk_hits), files.entries);
}

/* ---- 2. killed while writing ---------------------------------------------------- */

static void test_killed_writer(test_tally *tally, const char *dir, const char *log_dir, enum kill_point point)
{
    const char *what = point == KILL_MID_PAYLOAD ? "killed mid-payload" : "killed before the rename";
    const int64_t values[] = {killed_norm_n[point == KILL_BEFORE_RENAME]};
    char key[SNEPPX_KEY_MAX], log[CACHE_TEST_PATH_MAX], entry[CACHE_TEST_PATH_MAX], argument[8];
    sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), key, sizeof key);
    cache_test_entry_path(dir, key, entry, sizeof entry);
    snprintf(log, sizeof log, "%s/writer-%d.log", log_dir, (int)point);
    snprintf(argument, sizeof argument, "%d", (int)point);
    const struct dir_census before = census(dir);

    pid_t child = spawn_child("killed-writer", argument, -1, log);
    int status = 0;
    int killed = child > 0 && waitpid(child, &status, 0) == child && WIFSIGNALED(status) &&
                 WTERMSIG(status) == SIGKILL;
    if (!TEST_CHECK(tally, killed, "%s: the writer was not killed (status 0x%x): %s", what, status, read_log(log)))
        return;
    const struct dir_census after = census(dir);
    struct stat info;
    TEST_CHECK(tally, lstat(entry, &info) != 0 && errno == ENOENT && after.temps == before.temps + 1,
               "%s: %s must not exist, and one orphaned temporary file must (%d before, %d after)", what, entry,
               before.temps, after.temps);

    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    void *object = NULL;
    size_t object_size = 0;
    char reason[160] = "";
    sneppx_kernel_fingerprint(key, fingerprint);
    sneppx_disk_load load = sneppx_disk_cache_load(key, fingerprint, &object, &object_size, reason, sizeof reason);
    free(object);
    TEST_CHECK(tally, load == SNEPPX_DISK_MISS, "%s: the disk cache answers %d for %s (want a miss): %s", what,
               (int)load, key, reason);

    /* The next resolve takes the dead writer's lock (alarm: a held lock would hang it) and compiles. */
    alarm(60);
    const sneppx_kernel *kernel = NULL;
    sneppx_status resolved = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel);
    alarm(0);
    sneppx_kernel_timing timing;
    sneppx_kernel_last_timing(&timing);
    TEST_CHECK(tally, resolved == SNEPPX_OK && timing.source == SNEPPX_KERNEL_SOURCE_COMPILED,
               "%s: the next resolve of %s: %s, source %d (want compiled)", what, key, sneppx_last_error(),
               (int)timing.source);
    if (kernel) {
        double error = cache_test_rmsnorm_error(kernel, values[0], NULL);
        TEST_CHECK(tally, error < 1e-6, "%s: %s normalized error %.3g (limit 1e-6)", what, key, error);
    }
    TEST_CHECK(tally, sneppx_disk_cache_verify(key, fingerprint, NULL, NULL, reason, sizeof reason) == SNEPPX_DISK_HIT,
               "%s: the rewritten entry verifies: %s", what, reason);
}

/* ---- 3. eviction and orphaned temporary files ----------------------------------- */

/* The path of the first temporary file of key in dir, or "" if none. */
static void temp_file_of(const char *dir, const char *key, char *path, size_t size)
{
    char prefix[SNEPPX_KEY_MAX + 16];
    snprintf(prefix, sizeof prefix, ".%s.o.tmp-", key);
    path[0] = '\0';
    DIR *stream = opendir(dir);
    for (struct dirent *item; stream && (item = readdir(stream)) != NULL;)
        if (strncmp(item->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(path, size, "%s/%s", dir, item->d_name);
            break;
        }
    if (stream)
        closedir(stream);
}

static int set_age(const char *path, time_t seconds)
{
    struct timespec times[2];
    clock_gettime(CLOCK_REALTIME, &times[0]);
    times[0].tv_sec -= seconds;
    times[1] = times[0];
    return utimensat(AT_FDCWD, path, times, AT_SYMLINK_NOFOLLOW);
}

static void test_orphans_evicted(test_tally *tally, const char *dir, const char *log_dir)
{
    enum { PLANTED_BYTES = 256 << 10 };
    char keys[3][SNEPPX_KEY_MAX], aged[CACHE_TEST_PATH_MAX], fresh[CACHE_TEST_PATH_MAX];
    char planted[CACHE_TEST_PATH_MAX], stored[CACHE_TEST_PATH_MAX], log[CACHE_TEST_PATH_MAX];
    const int64_t locked_n[] = {224};
    sneppx_kernel_key("rmsnorm", &killed_norm_n[0], sneppx_host_target(), keys[0], sizeof keys[0]);
    sneppx_kernel_key("rmsnorm", &killed_norm_n[1], sneppx_host_target(), keys[1], sizeof keys[1]);
    sneppx_kernel_key("rmsnorm", locked_n, sneppx_host_target(), keys[2], sizeof keys[2]);
    temp_file_of(dir, keys[0], aged, sizeof aged);
    temp_file_of(dir, keys[1], fresh, sizeof fresh);
    if (!TEST_CHECK(tally, aged[0] && fresh[0], "the killed writers' temporary files: '%s' '%s'", aged, fresh))
        return;
    /* The dead mid-payload writer's file, 11 minutes old: an orphan. */
    TEST_CHECK(tally, set_age(aged, 11 * 60) == 0, "utimensat %s: %s", aged, strerror(errno));
    /* A live writer: as old, but its key's lock is held (by this process). */
    if (!TEST_CHECK(tally, snprintf(planted, sizeof planted, "%s/.%s.o.tmp-%ld-0", dir, keys[2], (long)getpid()) <
                               (int)sizeof planted,
                    "the planted file's path fits"))
        return;
    /* It begins with the entry magic, as a store's header does: eviction and
     * clear leave other files in the directory alone. */
    int fd = open(planted, O_WRONLY | O_CREAT | O_EXCL, 0600);
    TEST_CHECK(tally, fd >= 0 && write(fd, "sneppxK\n", 8) == 8 && ftruncate(fd, PLANTED_BYTES) == 0,
               "cannot plant %s", planted);
    if (fd >= 0)
        close(fd);
    set_age(planted, 11 * 60);
    int lock = sneppx_disk_cache_lock(keys[2]);
    TEST_CHECK(tally, lock >= 0, "the lock of %s", keys[2]);

    /* A bound with PLANTED_BYTES to spare over the entries: only the kept
     * temporary files (and the new entry) push the directory over it. */
    sneppx_disk_entry *entries = NULL;
    size_t count = 0;
    uint64_t entry_bytes = 0;
    if (sneppx_disk_cache_list(&entries, &count) == SNEPPX_OK)
        for (size_t i = 0; i < count; i++)
            entry_bytes += entries[i].bytes;
    free(entries);
    char bound[64];
    snprintf(bound, sizeof bound, "%.9f", (double)(entry_bytes + PLANTED_BYTES) / (1 << 20));
    setenv("SNEPPX_CACHE_MAX_MB", bound, 1); /* for the child: this process resolved its cache already */
    snprintf(log, sizeof log, "%s/bounded.log", log_dir);
    pid_t child = spawn_child("bounded-store", "-", -1, log);
    unsetenv("SNEPPX_CACHE_MAX_MB");
    int status = 0;
    unsigned long long evictions = 0, writes = 0;
    int ok = child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
             sscanf(read_log(log), "evictions %llu writes %llu", &evictions, &writes) == 2;
    sneppx_disk_cache_unlock(lock);
    if (!TEST_CHECK(tally, ok && writes == 1, "the bounded store (status 0x%x): %s", status, read_log(log)))
        return;

    struct stat info;
    TEST_CHECK(tally, lstat(aged, &info) != 0 && errno == ENOENT,
               "the orphan of a writer dead for 11 minutes is removed by eviction: %s", aged);
    TEST_CHECK(tally, lstat(fresh, &info) == 0, "a dead writer's file younger than 10 minutes stays: %s", fresh);
    TEST_CHECK(tally, lstat(planted, &info) == 0, "an old file whose key's lock is held stays: %s", planted);
    char key[SNEPPX_KEY_MAX];
    sneppx_kernel_key("rmsnorm", bounded_norm_n, sneppx_host_target(), key, sizeof key);
    TEST_CHECK(tally, cache_test_entry_path(dir, key, stored, sizeof stored) == 0 && lstat(stored, &info) == 0,
               "the stored entry stays: %s", stored);
    TEST_CHECK(tally, evictions >= 1 && evictions < count,
               "the kept temporary files count in the bound: %llu of %zu entries evicted (want some, not all)",
               evictions, count);
}

/* ---- 4. lock files ---------------------------------------------------------- */

struct lock_waiter {
    const char *key;
    int fd;
};

static void *take_lock(void *context)
{
    struct lock_waiter *waiter = context;
    waiter->fd = sneppx_disk_cache_lock(waiter->key);
    return NULL;
}

/* How many of this process's descriptors are open on path (through /proc/self/fd). */
static int descriptors_on(const char *path)
{
    int count = 0;
    DIR *stream = opendir("/proc/self/fd");
    for (struct dirent *item; stream && (item = readdir(stream)) != NULL;) {
        char link[NAME_MAX + 32], target[CACHE_TEST_PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%s", item->d_name);
        ssize_t length = readlink(link, target, sizeof target - 1);
        if (length > 0) {
            target[length] = '\0';
            count += strcmp(target, path) == 0;
        }
    }
    if (stream)
        closedir(stream);
    return count;
}

static void test_lock_files(test_tally *tally, const char *dir)
{
    const int64_t n[] = {240};
    char key[SNEPPX_KEY_MAX], path[CACHE_TEST_PATH_MAX];
    sneppx_kernel_key("rmsnorm", n, sneppx_host_target(), key, sizeof key);
    char real_dir[PATH_MAX];
    if (!TEST_CHECK(tally, realpath(dir, real_dir) != NULL, "realpath %s: %s", dir, strerror(errno)))
        return;
    snprintf(path, sizeof path, "%s/%s.lock", real_dir, key);
    struct stat info;

    int holder = sneppx_disk_cache_lock(key);
    if (!TEST_CHECK(tally, holder >= 0, "the lock of %s", key))
        return;
    TEST_CHECK(tally, sneppx_cache_clear() == SNEPPX_OK && lstat(path, &info) == 0,
               "a clear keeps a held lock file: %s (%s)", path, sneppx_last_error());
    sneppx_disk_cache_unlock(holder);
    TEST_CHECK(tally, sneppx_cache_clear() == SNEPPX_OK && lstat(path, &info) != 0 && errno == ENOENT,
               "a clear removes a free lock file: %s", path);

    /* The waiter opens the lock file and blocks on it; the file is unlinked;
     * the holder lets go. */
    holder = sneppx_disk_cache_lock(key);
    struct lock_waiter waiter = {.key = key, .fd = -1};
    pthread_t thread;
    if (!TEST_CHECK(tally, holder >= 0 && pthread_create(&thread, NULL, take_lock, &waiter) == 0,
                    "the lock of %s and a waiting thread", key)) {
        sneppx_disk_cache_unlock(holder);
        return;
    }
    int opened = 0;
    for (int waited_ms = 0; waited_ms < 10000 && !opened; waited_ms++) {
        opened = descriptors_on(path) >= 2;
        if (!opened)
            usleep(1000);
    }
    TEST_CHECK(tally, opened, "the waiting thread opened %s", path);
    TEST_CHECK(tally, unlink(path) == 0, "unlink %s: %s", path, strerror(errno));
    sneppx_disk_cache_unlock(holder);
    pthread_join(thread, NULL);
    struct stat held;
    TEST_CHECK(tally,
               waiter.fd >= 0 && fstat(waiter.fd, &held) == 0 && lstat(path, &info) == 0 &&
                   held.st_ino == info.st_ino && held.st_dev == info.st_dev,
               "the waiter holds the lock file at the path, not the unlinked one (fd %d)", waiter.fd);
    sneppx_disk_cache_unlock(waiter.fd);
}

/* A file is a key's when its last part names one of this build's targets
 * (the target table, not a "v<digits>" pattern): clear removes an entry and a
 * free (empty) lock file of the host's target, and leaves an entry-like file
 * of "v32", no target of this build, alone. */
static void test_target_names(test_tally *tally, const char *dir)
{
    char names[3][SNEPPX_KEY_MAX + 8], paths[3][CACHE_TEST_PATH_MAX];
    snprintf(names[0], sizeof names[0], "rmsnorm-n64-%s.o", sneppx_host_target()->name);
    snprintf(names[1], sizeof names[1], "rmsnorm-n64-%s.lock", sneppx_host_target()->name);
    snprintf(names[2], sizeof names[2], "rmsnorm-n64-v32.o");
    for (size_t i = 0; i < 3; i++) {
        if (!TEST_CHECK(tally, snprintf(paths[i], sizeof paths[i], "%s/%s", dir, names[i]) < (int)sizeof paths[i],
                        "the path of %s fits", names[i]))
            return;
        const size_t bytes = i == 1 ? 0 : 8; /* the entry magic; a lock file is empty */
        int fd = open(paths[i], O_WRONLY | O_CREAT | O_EXCL, 0600);
        TEST_CHECK(tally, fd >= 0 && write(fd, "sneppxK\n", bytes) == (ssize_t)bytes, "cannot plant %s: %s",
                   paths[i], strerror(errno));
        if (fd >= 0)
            close(fd);
    }
    TEST_CHECK(tally, sneppx_cache_clear() == SNEPPX_OK, "clear: %s", sneppx_last_error());
    struct stat info;
    for (size_t i = 0; i < 2; i++)
        TEST_CHECK(tally, lstat(paths[i], &info) != 0 && errno == ENOENT, "a clear removes %s", paths[i]);
    TEST_CHECK(tally, lstat(paths[2], &info) == 0, "a clear leaves %s alone", paths[2]);
    unlink(paths[2]);
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "worker") == 0)
        return child_worker(atoi(argv[2]));
    if (argc > 2 && strcmp(argv[1], "killed-writer") == 0)
        return child_killed_writer((enum kill_point)atoi(argv[2]));
    if (argc > 2 && strcmp(argv[1], "bounded-store") == 0)
        return child_bounded_store();

    test_tally tally = {0};
    char base[CACHE_TEST_DIR_MAX], dir[CACHE_TEST_PATH_MAX];
    if (cache_test_make_dir(base, sizeof base, "processes") != 0) {
        perror("mkdtemp");
        return 1;
    }
    /* A cache directory nobody created yet: the workers race to create it too. */
    snprintf(dir, sizeof dir, "%s/cache", base);
    setenv("SNEPPX_CACHE_DIR", dir, 1);
    test_eight_processes(&tally, dir, base);
    test_killed_writer(&tally, dir, base, KILL_MID_PAYLOAD);
    test_killed_writer(&tally, dir, base, KILL_BEFORE_RENAME);

    test_orphans_evicted(&tally, dir, base);

    TEST_CHECK(&tally, census(dir).temps == 2, "two temporary files before the clear (one orphan, one planted): %d",
               census(dir).temps);
    TEST_CHECK(&tally, sneppx_cache_clear() == SNEPPX_OK && census(dir).temps == 0 && census(dir).entries == 0,
               "sneppx_cache_clear removes entries and orphaned temporary files: %s (%d left)", sneppx_last_error(),
               census(dir).temps + census(dir).entries);
    test_lock_files(&tally, dir);
    test_target_names(&tally, dir);
    cache_test_remove_tree(base);
    return test_finish(&tally);
}
