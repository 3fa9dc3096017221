#include "disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "kernel_registry.h"
#include "sneppx/cache.h"

#define ENTRY_SUFFIX ".o"
#define LOCK_SUFFIX ".lock"
#define TEMP_MARK ".tmp-"               /* temp files: .<key>.o.tmp-<pid>-<n> */
#define ENTRY_MAGIC "sneppxK\n"
#define ENTRY_FORMAT_VERSION 1
#define DEFAULT_MAX_MB 1024
#define MAX_MAX_MB 1e12                 /* far above any disk; keeps the bound within uint64_t bytes */
#define DEFAULT_LOCK_TIMEOUT 30.0       /* seconds a build waits for another process's lock */
#define MAX_LOCK_TIMEOUT 1e9            /* about 30 years: "wait for ever" */
#define PROBE_ATTEMPTS 16               /* probe names tried before a directory counts as not writable */
#define TEMP_ATTEMPTS 16                /* temporary file names tried before a store fails */
#define MAX_PAYLOAD_BYTES (256u << 20)  /* far above any kernel; bounds a hostile size field */
#define ORPHAN_AGE_SECONDS (10 * 60)    /* a temp file dated this far from now is a dead writer's (evict) */
#define LOW_WATER_PERCENT 90            /* eviction leaves the directory at most this full, so the next
                                           scan waits for another tenth of the bound to be written */

struct entry_header {
    char magic[8];
    uint32_t format_version;
    uint32_t header_size;
    uint64_t payload_size;
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    uint8_t payload_sha256[SNEPPX_SHA256_SIZE];
};

/* ---- the directory, resolved once --------------------------------------- */

static struct {
    int fd;                 /* -1 when memory-only */
    int read_only;          /* entries are loaded, nothing is written (see probe_writable) */
    char read_only_reason[128];
    char path[PATH_MAX];
    uint64_t max_bytes;
    double lock_timeout;    /* seconds */
} cache = {.fd = -1};
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static atomic_int temp_counter;
static atomic_uint_fast64_t scan_count; /* directory scans by stores (evict) */

/* The chosen path, before any check: the first environment override set.
 * NULL, or why there is none (then path holds what to call it). */
static const char *choose_path(char *path, size_t size, char *reason, size_t reason_size)
{
    const char *variable = "$SNEPPX_CACHE_DIR", *base = getenv("SNEPPX_CACHE_DIR"), *below = "";
    if (!base || !base[0]) {
        variable = "$XDG_CACHE_HOME", base = getenv("XDG_CACHE_HOME"), below = "/sneppx";
        if (!base || base[0] != '/') { /* the XDG spec ignores relative values */
            variable = "$HOME", base = getenv("HOME"), below = "/.cache/sneppx";
            if (!base || !base[0]) {
                struct passwd *user = getpwuid(geteuid());
                variable = "~", base = user ? user->pw_dir : NULL;
            }
        }
    }
    if (!base) {
        snprintf(path, size, "(none)");
        return "no SNEPPX_CACHE_DIR, XDG_CACHE_HOME or home directory";
    }
    if (snprintf(path, size, "%s%s", base, below) >= (int)size) {
        snprintf(path, size, "%s", sneppx_clip(base).text);
        snprintf(reason, reason_size, "%s%s is too long: %zu bytes, where a path has at most %zu", variable, below,
                 strlen(base) + strlen(below), size - 1);
        return reason;
    }
    return NULL;
}

/* mkdir -p with mode 0700 for every directory it creates. */
static int make_directories(const char *path)
{
    char prefix[PATH_MAX];
    snprintf(prefix, sizeof prefix, "%s", path);
    for (char *slash = strchr(prefix + 1, '/');; slash = strchr(slash + 1, '/')) {
        if (slash)
            *slash = '\0';
        if (prefix[0] && mkdir(prefix, 0700) != 0 && errno != EEXIST)
            return -1;
        if (!slash)
            return 0;
        *slash = '/';
    }
}

/* Whether this process may write the directory open as fd: it creates and
 * removes a probe file. A name taken (left by a process that died in
 * between, or by one of the same pid in another pid namespace) is not ours
 * to remove, so the next attempt's name is tried. A directory we may not
 * write (mode 0500, a read-only mount, a full disk) is a read-only cache:
 * its valid entries load, nothing is written. */
static void probe_writable(int fd)
{
    int error = EEXIST;
    for (int attempt = 0; attempt < PROBE_ATTEMPTS && error == EEXIST; attempt++) {
        char probe[64];
        snprintf(probe, sizeof probe, ".probe-%ld-%d", (long)getpid(), attempt);
        int probe_fd = openat(fd, probe, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (probe_fd >= 0) {
            close(probe_fd);
            unlinkat(fd, probe, 0);
            return;
        }
        error = errno;
    }
    cache.read_only = 1;
    snprintf(cache.read_only_reason, sizeof cache.read_only_reason, "not writable by this process: %s",
             strerror(error));
}

/* Why the directory open as fd cannot hold trusted code, or NULL (then
 * probe_writable has said whether it is read-only). */
static const char *refusal(int fd, char *reason, size_t reason_size)
{
    struct stat info;
    if (fstat(fd, &info) != 0)
        return strerror(errno);
    if (info.st_uid != geteuid()) {
        snprintf(reason, reason_size, "owned by uid %u, not by this user (uid %u)", (unsigned)info.st_uid,
                 (unsigned)geteuid());
        return reason;
    }
    /* Others who can write the directory can swap an entry for their own
     * code, unless the sticky bit stops them renaming over our files. */
    if ((info.st_mode & (S_IWGRP | S_IWOTH)) && !(info.st_mode & S_ISVTX)) {
        snprintf(reason, reason_size, "writable by group or others (mode %04o)", (unsigned)(info.st_mode & 07777));
        return reason;
    }
    probe_writable(fd);
    return NULL;
}

/* The number in environment variable name: fallback when it is unset or
 * empty, and (with one warning naming it) when it is not a number in
 * [0, max]. what says what it should be, for the warning. */
static double read_env_number(const char *name, const char *what, double fallback, double max)
{
    const char *env = getenv(name);
    if (!env || !env[0])
        return fallback;
    char *end;
    const double value = strtod(env, &end);
    if (*end != '\0' || !(value >= 0.0 && value <= max)) {
        sneppx_log(0, "warning: %s='%s' is not %s; using %g", name, sneppx_clip(env).text, what, fallback);
        return fallback;
    }
    return value;
}

/* SNEPPX_CACHE_MAX_MB in bytes; fractions allowed ("0.5" is 512 KiB). A
 * positive size below one byte is the smallest bound, not none. */
static uint64_t read_max_bytes(void)
{
    const double bytes = read_env_number("SNEPPX_CACHE_MAX_MB", "a size in MiB (0 = no bound)", DEFAULT_MAX_MB,
                                         MAX_MAX_MB) * (1 << 20);
    return bytes > 0.0 && bytes < 1.0 ? 1 : (uint64_t)bytes;
}

static void resolve_cache(void)
{
    cache.max_bytes = read_max_bytes();
    cache.lock_timeout = read_env_number("SNEPPX_CACHE_LOCK_TIMEOUT", "a number of seconds (0 = do not wait)",
                                         DEFAULT_LOCK_TIMEOUT, MAX_LOCK_TIMEOUT);
    char chosen[PATH_MAX], reason[256];
    const char *problem = NULL;
    int fd = -1;
    if ((problem = choose_path(chosen, sizeof chosen, reason, sizeof reason)) != NULL) {
        /* nothing to open */
    } else if (make_directories(chosen) != 0) {
        snprintf(reason, sizeof reason, "cannot create it: %s", strerror(errno));
        problem = reason;
    } else if ((fd = open(chosen, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        snprintf(reason, sizeof reason, "cannot open it: %s", strerror(errno));
        problem = reason;
    } else {
        problem = refusal(fd, reason, sizeof reason);
    }
    if (problem) {
        if (fd >= 0)
            close(fd);
        /* The one warning of a process without a disk cache. */
        sneppx_log(0, "warning: kernel disk cache %s disabled (%s); compiled kernels stay in memory", chosen,
                   problem);
        return;
    }
    if (!realpath(chosen, cache.path))
        snprintf(cache.path, sizeof cache.path, "%s", chosen);
    cache.fd = fd;
    if (cache.read_only)
        sneppx_log(1, "kernel disk cache %s is read-only (%s): its entries are loaded, nothing is written",
                   cache.path, cache.read_only_reason);
    else
        sneppx_log(2, "kernel disk cache: %s", cache.path);
}

static int cache_fd(void)
{
    pthread_once(&cache_once, resolve_cache);
    return cache.fd;
}

const char *sneppx_disk_cache_path(void) { return cache_fd() >= 0 ? cache.path : NULL; }

int sneppx_disk_cache_read_only(void) { return cache_fd() >= 0 && cache.read_only; }

uint64_t sneppx_disk_cache_max_bytes(void)
{
    cache_fd();
    return cache.max_bytes;
}

double sneppx_disk_cache_lock_timeout(void)
{
    cache_fd();
    return cache.lock_timeout;
}

/* ---- entries ------------------------------------------------------------ */

static void entry_name(const char *key, const char *suffix, char *name, size_t size)
{
    snprintf(name, size, "%s%s", key, suffix);
}

static int has_suffix(const char *name, const char *suffix)
{
    size_t length = strlen(name), suffix_length = strlen(suffix);
    return length > suffix_length && strcmp(name + length - suffix_length, suffix) == 0;
}

/* Reads exactly size bytes; 0 on success. */
static int read_fully(int fd, void *data, size_t size)
{
    for (size_t done = 0; done < size;) {
        ssize_t n = read(fd, (char *)data + done, size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

static int write_fully(int fd, const void *data, size_t size)
{
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, (const char *)data + done, size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

/* Whether name[0, length) has the shape of a kernel key (kernel_registry.c):
 * family, then "-<prefix><value>" fields, all in [a-z0-9_], the last part
 * the name of one of this build's targets (sneppx_targets: "v16", not any
 * "v<digits>"). The directory may hold other files (SNEPPX_CACHE_DIR is the
 * user's choice, "my-notes.o"): listing, eviction and clear touch only files
 * named by keys. */
static int is_key_name(const char *name, size_t length)
{
    if (length == 0 || length >= SNEPPX_KEY_MAX || name[0] < 'a' || name[0] > 'z')
        return 0;
    for (size_t i = 0; i < length; i++) {
        const char c = name[i];
        if (c == '-' ? name[i - 1] == '-' || i + 1 == length
                     : !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    const char *dash = memrchr(name, '-', length);
    if (!dash)
        return 0;
    char target[SNEPPX_KEY_MAX];
    const size_t target_length = (size_t)(name + length - dash - 1);
    memcpy(target, dash + 1, target_length);
    target[target_length] = '\0';
    return sneppx_target_named(target) != NULL;
}

/* Whether the file name in the cache directory starts with the entry magic:
 * what sneppx writes, and what no other program's file starts with. */
static int starts_with_magic(const char *name)
{
    int fd = openat(cache.fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char magic[sizeof ENTRY_MAGIC - 1];
    const int ours = read_fully(fd, magic, sizeof magic) == 0 && memcmp(magic, ENTRY_MAGIC, sizeof magic) == 0;
    close(fd);
    return ours;
}

/* Why the open entry fd (of expected payload) is not trusted, or NULL. */
static const char *verify_entry(int fd, const uint8_t fingerprint[SNEPPX_SHA256_SIZE], void **object,
                                size_t *object_size)
{
    struct stat info;
    struct entry_header header;
    if (fstat(fd, &info) != 0)
        return "cannot stat it";
    if (!S_ISREG(info.st_mode))
        return "not a regular file";
    if (info.st_uid != geteuid())
        return "not owned by this user";
    if (info.st_mode & (S_IWGRP | S_IWOTH))
        return "writable by group or others";
    if ((uint64_t)info.st_size < sizeof header || read_fully(fd, &header, sizeof header) != 0)
        return "truncated header";
    if (memcmp(header.magic, ENTRY_MAGIC, sizeof header.magic) != 0)
        return "not a sneppx cache entry";
    if (header.format_version != ENTRY_FORMAT_VERSION || header.header_size != sizeof header)
        return "another entry format version";
    if (memcmp(header.fingerprint, fingerprint, SNEPPX_SHA256_SIZE) != 0)
        return "fingerprint differs (other bitcode, versions, options or host)";
    if (header.payload_size > MAX_PAYLOAD_BYTES || header.payload_size != (uint64_t)info.st_size - sizeof header)
        return "size differs from its header (truncated or extended)";
    void *payload = malloc(header.payload_size ? header.payload_size : 1);
    if (!payload)
        return "out of memory";
    uint8_t digest[SNEPPX_SHA256_SIZE];
    if (read_fully(fd, payload, header.payload_size) != 0) {
        free(payload);
        return "truncated payload";
    }
    sneppx_sha256(payload, header.payload_size, digest);
    if (memcmp(digest, header.payload_sha256, SNEPPX_SHA256_SIZE) != 0) {
        free(payload);
        return "payload SHA-256 differs (corrupted)";
    }
    *object = payload;
    *object_size = header.payload_size;
    return NULL;
}

/* Opens and verifies the entry of key; keeps the payload when object is not NULL. */
static sneppx_disk_load read_entry(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE], void **object,
                                   size_t *object_size, int mark_used, char *reason, size_t reason_size)
{
    int dir = cache_fd();
    if (dir < 0)
        return SNEPPX_DISK_MISS;
    char name[SNEPPX_KEY_MAX + 16];
    entry_name(key, ENTRY_SUFFIX, name, sizeof name);
    /* O_NONBLOCK: a FIFO planted as an entry must not block the open. */
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return SNEPPX_DISK_MISS;
        snprintf(reason, reason_size, "%s", errno == ELOOP ? "a symbolic link" : strerror(errno));
        return SNEPPX_DISK_REJECTED;
    }
    void *payload = NULL;
    size_t payload_size = 0;
    const char *problem = verify_entry(fd, fingerprint, &payload, &payload_size);
    if (!problem && object) {
        if (mark_used && !cache.read_only)
            futimens(fd, NULL); /* last use, for LRU eviction */
        *object = payload;
        *object_size = payload_size;
    } else {
        free(payload);
    }
    close(fd);
    if (problem) {
        snprintf(reason, reason_size, "%s", problem);
        return SNEPPX_DISK_REJECTED;
    }
    return SNEPPX_DISK_HIT;
}

sneppx_disk_load sneppx_disk_cache_load(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                        void **object, size_t *object_size, char *reason, size_t reason_size)
{
    return read_entry(key, fingerprint, object, object_size, 1, reason, reason_size);
}

sneppx_disk_load sneppx_disk_cache_verify(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                          void **object, size_t *object_size, char *reason, size_t reason_size)
{
    return read_entry(key, fingerprint, object, object_size, 0, reason, reason_size);
}

/* Attempts at a lock file that keeps being unlinked under us before building
 * unlocked (which only risks building the key twice). */
#define LOCK_ATTEMPTS 64
#define LOCK_POLL_MAX_NS (20 * 1000 * 1000) /* the longest pause between two tries */

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) * 1e-9;
}

/* Takes the flock of fd, trying until the lock timeout has passed since
 * start: 0 when taken, 1 when the time is up, -1 on an error. A blocking
 * flock would wait for ever on a holder that is stopped (SIGSTOP, a
 * debugger, a frozen container) yet alive, so the kernel never drops its
 * lock; polling bounds the wait without signals or timers, which belong to
 * the application. Pauses grow from 1 ms to 20 ms: a waiter starts at most
 * 20 ms after the holder lets go, against builds of tens of milliseconds. */
static int flock_until(int fd, const struct timespec *start)
{
    long pause_ns = 1000 * 1000;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        const double left = cache.lock_timeout - seconds_since(start);
        if (left <= 0.0)
            return 1;
        const double pause = fmin((double)pause_ns * 1e-9, left);
        struct timespec sleep = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
        nanosleep(&sleep, NULL);
        pause_ns = pause_ns * 2 < LOCK_POLL_MAX_NS ? pause_ns * 2 : LOCK_POLL_MAX_NS;
    }
}

int sneppx_disk_cache_lock(const char *key)
{
    int dir = cache_fd();
    if (dir < 0 || cache.read_only) /* nothing to serialize: a read-only cache is never written */
        return -1;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    char name[SNEPPX_KEY_MAX + 16];
    entry_name(key, LOCK_SUFFIX, name, sizeof name);
    for (int attempt = 0; attempt < LOCK_ATTEMPTS; attempt++) {
        int fd = openat(dir, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
        struct stat info;
        if (fd < 0 || fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != geteuid()) {
            sneppx_log(1, "kernel '%s': lock file %s/%s refused; building without it", key, cache.path, name);
            if (fd >= 0)
                close(fd);
            return -1;
        }
        const int locked = flock_until(fd, &start);
        if (locked != 0) {
            if (locked > 0)
                sneppx_log(0, "warning: kernel '%s': another process held its lock %s/%s for the %.1f s it waited "
                           "(SNEPPX_CACHE_LOCK_TIMEOUT); building it without the lock", key, cache.path, name,
                           seconds_since(&start));
            close(fd);
            return -1;
        }
        /* Eviction and clear unlink a lock file only while holding it, so a
         * process that waited on it may now hold a file no longer at the path,
         * which guards nothing: the next process creates a new one. Take that. */
        struct stat at_path;
        if (fstatat(dir, name, &at_path, AT_SYMLINK_NOFOLLOW) == 0 && at_path.st_dev == info.st_dev &&
            at_path.st_ino == info.st_ino)
            return fd;
        close(fd);
    }
    sneppx_log(1, "kernel '%s': lock file %s/%s keeps being removed; building without it", key, cache.path, name);
    return -1;
}

void sneppx_disk_cache_unlock(int lock)
{
    if (lock >= 0)
        close(lock); /* closing the only descriptor releases the flock */
}

/* ---- eviction, listing, clearing ------------------------------------------ */

/* Calls visit(name, info) for each entry file (regular, ours) of the directory. */
static sneppx_status for_each_file(int (*visit)(const char *name, const struct stat *info, void *context),
                                   void *context)
{
    int dir = cache_fd();
    if (dir < 0)
        return SNEPPX_OK;
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *stream = fd >= 0 ? fdopendir(fd) : NULL;
    if (!stream) {
        if (fd >= 0)
            close(fd);
        return sneppx_fail(SNEPPX_ERR_IO, "cannot read the kernel cache directory %s: %s", cache.path,
                           strerror(errno));
    }
    int stop = 0;
    for (struct dirent *item; !stop && (item = readdir(stream)) != NULL;) {
        struct stat info;
        if (item->d_name[0] == '.' && (item->d_name[1] == '\0' || strcmp(item->d_name, "..") == 0))
            continue;
        if (fstatat(dir, item->d_name, &info, AT_SYMLINK_NOFOLLOW) == 0)
            stop = visit(item->d_name, &info, context);
    }
    closedir(stream);
    return SNEPPX_OK;
}

struct entry_list {
    sneppx_disk_entry *entries;
    size_t count, capacity;
    int out_of_memory;
};

/* "<key>.o", a regular file that starts with the entry magic. */
static int is_entry_file(const char *name, const struct stat *info)
{
    return has_suffix(name, ENTRY_SUFFIX) && S_ISREG(info->st_mode) &&
           is_key_name(name, strlen(name) - strlen(ENTRY_SUFFIX)) && starts_with_magic(name);
}

static int collect_entry(const char *name, const struct stat *info, void *context)
{
    struct entry_list *list = context;
    size_t length = strlen(name);
    if (!is_entry_file(name, info))
        return 0;
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? 2 * list->capacity : 64;
        sneppx_disk_entry *grown = realloc(list->entries, capacity * sizeof *grown);
        if (!grown) {
            list->out_of_memory = 1;
            return 1;
        }
        list->entries = grown;
        list->capacity = capacity;
    }
    sneppx_disk_entry *entry = &list->entries[list->count++];
    memcpy(entry->key, name, length - strlen(ENTRY_SUFFIX));
    entry->key[length - strlen(ENTRY_SUFFIX)] = '\0';
    entry->bytes = (uint64_t)info->st_size;
    entry->last_used = info->st_mtim;
    return 0;
}

static int by_key(const void *a, const void *b)
{
    return strcmp(((const sneppx_disk_entry *)a)->key, ((const sneppx_disk_entry *)b)->key);
}

static int by_last_use(const void *a, const void *b)
{
    struct timespec x = ((const sneppx_disk_entry *)a)->last_used, y = ((const sneppx_disk_entry *)b)->last_used;
    if (x.tv_sec != y.tv_sec)
        return x.tv_sec < y.tv_sec ? -1 : 1;
    return x.tv_nsec < y.tv_nsec ? -1 : x.tv_nsec > y.tv_nsec;
}

sneppx_status sneppx_disk_cache_list(sneppx_disk_entry **entries, size_t *count)
{
    struct entry_list list = {0};
    sneppx_status status = for_each_file(collect_entry, &list);
    if (status == SNEPPX_OK && list.out_of_memory)
        status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory listing the kernel cache %s", cache.path);
    if (status != SNEPPX_OK) {
        free(list.entries);
        return status;
    }
    if (list.count > 1) /* an empty directory leaves entries NULL, which qsort must not get */
        qsort(list.entries, list.count, sizeof *list.entries, by_key);
    *entries = list.entries;
    *count = list.count;
    return SNEPPX_OK;
}

/* "<key>.lock", empty: lock files are created empty and never written. */
static int is_lock_file(const char *name, const struct stat *info)
{
    return has_suffix(name, LOCK_SUFFIX) && is_key_name(name, strlen(name) - strlen(LOCK_SUFFIX)) &&
           S_ISREG(info->st_mode) && info->st_size == 0;
}

/* Unlinks the lock file `name` unless a process holds it or it is not ours
 * (is_lock_file). It is taken without blocking and unlinked while held, so a
 * process waiting on it finds it gone afterwards and takes a new one
 * (sneppx_disk_cache_lock). A held lock stays:
 * unlinked, it would let a second process create a new lock file and build
 * the same key beside the holder. Returns -1 (errno set) if the unlink failed. */
static int remove_free_lock(const char *name)
{
    int lock = openat(cache.fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (lock < 0)
        return errno == ENOENT || errno == ELOOP ? 0 : -1;
    struct stat info;
    if (fstat(lock, &info) != 0 || !is_lock_file(name, &info)) {
        close(lock);
        return 0;
    }
    int failed = 0;
    if (flock(lock, LOCK_EX | LOCK_NB) == 0)
        failed = unlinkat(cache.fd, name, 0) != 0 && errno != ENOENT;
    int saved_errno = errno;
    close(lock);
    errno = saved_errno;
    return failed ? -1 : 0;
}

/* A temporary file of a store: ".<key>.o.tmp-<pid>-<n>", empty or begun with
 * the entry magic (a store writes the header first). */
static int is_temp_file(const char *name, const struct stat *info)
{
    const char *mark = strstr(name, ENTRY_SUFFIX TEMP_MARK);
    if (name[0] != '.' || !mark || !is_key_name(name + 1, (size_t)(mark - name - 1)) || !S_ISREG(info->st_mode))
        return 0;
    const char *tail = mark + strlen(ENTRY_SUFFIX TEMP_MARK);
    const size_t digits = strspn(tail, "0123456789");
    if (digits == 0 || tail[digits] != '-' || tail[digits + 1] == '\0' ||
        strspn(tail + digits + 1, "0123456789") != strlen(tail + digits + 1))
        return 0;
    return info->st_size < (off_t)(sizeof ENTRY_MAGIC - 1) || starts_with_magic(name);
}

struct temp_census {
    size_t count;
    uint64_t bytes;
};

static int count_temp_file(const char *name, const struct stat *info, void *context)
{
    struct temp_census *census = context;
    if (is_temp_file(name, info)) {
        census->count++;
        census->bytes += (uint64_t)info->st_size;
    }
    return 0;
}

sneppx_status sneppx_disk_cache_temp_files(size_t *count, uint64_t *bytes)
{
    struct temp_census census = {0};
    sneppx_status status = for_each_file(count_temp_file, &census);
    *count = census.count;
    *bytes = census.bytes;
    return status;
}

/* Whether an mtime is at least ORPHAN_AGE_SECONDS away from now, in the past
 * or in the future. A clock set back (a VM restored from a snapshot, a fixed
 * RTC) or another host's clock ahead (a shared file system) dates files in
 * the future; counted as young, they would never age. Within the window, a
 * future date is young: a live writer on a host whose clock is slightly
 * ahead keeps its file. */
static int far_from_now(const struct timespec *mtime, const struct timespec *now)
{
    return mtime->tv_sec <= now->tv_sec - ORPHAN_AGE_SECONDS || mtime->tv_sec >= now->tv_sec + ORPHAN_AGE_SECONDS;
}

/* Removes the temporary file name if its writer is certainly gone; 1 if it did.
 *
 * A writer killed mid-store (SIGKILL, OOM killer, power loss) leaves its temp
 * file behind; a live writer's temp file must never go (its rename would fail).
 * Two tests, both required:
 * - Age: the file's mtime is ORPHAN_AGE_SECONDS (10 minutes) from now
 *   (far_from_now). A store creates the file after the compile, then writes
 *   it in one go, fsyncs and renames it: the mtime moves with every write,
 *   and only a stalled fsync keeps a live file unchanged, never for minutes.
 *   The age alone covers writers that hold no lock (a refused lock file, or
 *   a lock held past SNEPPX_CACHE_LOCK_TIMEOUT, means building unlocked).
 * - The key's flock: writers hold it from before the compile until after the
 *   rename, so when we can take it without blocking, no process (this one
 *   included: flock conflicts between descriptors) is storing that key. We
 *   unlink while holding it. A missing lock file leaves the age to decide.
 * Not the pid in the name: pids are reused, and processes in another pid
 *   namespace (containers sharing the cache) have pids we cannot see. */
static int remove_orphan(const char *name, const struct stat *info)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0 || !far_from_now(&info->st_mtim, &now))
        return 0;
    char lock_name[NAME_MAX + 1];
    const char *key = name + 1, *key_end = strstr(name, ENTRY_SUFFIX TEMP_MARK);
    if ((size_t)(key_end - key) >= SNEPPX_KEY_MAX)
        return 0;
    snprintf(lock_name, sizeof lock_name, "%.*s" LOCK_SUFFIX, (int)(key_end - key), key);
    int lock = openat(cache.fd, lock_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (lock < 0 && errno != ENOENT)
        return 0;
    if (lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) != 0) {
        close(lock); /* a live writer stores this key now */
        return 0;
    }
    int removed = unlinkat(cache.fd, name, 0) == 0;
    if (lock >= 0)
        close(lock);
    if (removed)
        sneppx_log(2, "removed %s/%s, the temporary file of a dead writer, dated %.0f s from now", cache.path,
                   name, (double)info->st_mtim.tv_sec - (double)now.tv_sec);
    return removed;
}

struct eviction_scan {
    struct entry_list list;
    uint64_t temp_bytes; /* temporary files kept: they take room in the bound too */
};

/* Entries into the list; orphaned temporary files removed, the others counted. */
static int scan_for_eviction(const char *name, const struct stat *info, void *context)
{
    struct eviction_scan *scan = context;
    if (is_temp_file(name, info)) {
        if (!remove_orphan(name, info))
            scan->temp_bytes += (uint64_t)info->st_size;
        return 0;
    }
    return collect_entry(name, info, &scan->list);
}

/* Scans the directory: removes orphaned temporary files (see
 * remove_orphan), then, when the entries and the temporary files left exceed
 * the bound, least recently used entries (never keep_key) until they fill at
 * most LOW_WATER_PERCENT of it. *total is what is left; returns how many
 * entries it removed, or -1 when the scan failed. */
static int evict(const char *keep_key, uint64_t *total_left)
{
    const uint64_t bound = cache.max_bytes;
    struct eviction_scan scan = {0};
    atomic_fetch_add(&scan_count, 1);
    if (for_each_file(scan_for_eviction, &scan) != SNEPPX_OK || scan.list.out_of_memory) {
        free(scan.list.entries);
        return -1;
    }
    sneppx_disk_entry *entries = scan.list.entries;
    size_t count = scan.list.count;
    uint64_t total = scan.temp_bytes;
    for (size_t i = 0; i < count; i++)
        total += entries[i].bytes;
    *total_left = total;
    if (bound == 0 || total <= bound) {
        free(entries);
        return 0;
    }
    /* An entry dated in the future (see far_from_now) would outlive every
     * other: it counts as the least recently used. Loading it dates it now. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (size_t i = 0; i < count; i++)
        if (entries[i].last_used.tv_sec >= now.tv_sec + ORPHAN_AGE_SECONDS)
            entries[i].last_used = (struct timespec){0, 0};
    if (count > 1)
        qsort(entries, count, sizeof *entries, by_last_use);
    const uint64_t low_water = bound / 100 * LOW_WATER_PERCENT + bound % 100 * LOW_WATER_PERCENT / 100;
    int evicted = 0;
    for (size_t i = 0; i < count && total > low_water; i++) {
        if (strcmp(entries[i].key, keep_key) == 0)
            continue;
        char name[SNEPPX_KEY_MAX + 16];
        entry_name(entries[i].key, ENTRY_SUFFIX, name, sizeof name);
        if (unlinkat(cache.fd, name, 0) == 0 || errno == ENOENT) {
            total -= entries[i].bytes;
            evicted++;
            entry_name(entries[i].key, LOCK_SUFFIX, name, sizeof name);
            remove_free_lock(name);
            sneppx_log(2, "evicted kernel '%s' from the disk cache", entries[i].key);
        }
    }
    free(entries);
    *total_left = total;
    return evicted;
}

/* What the size bound counts (entries and temporary files) as this process
 * believes it: the last scan's total plus this process's stores since. A
 * store scans the directory (evict) only when it is the process's first, or
 * when the estimate passes the bound, so a directory of 50k entries is not
 * read again at every store. Other processes' stores are not seen until the
 * next scan; every process scans at its first store. Stores by other threads
 * while one scans add to added_while_scanning, and the scanning thread scans
 * again if they may have passed the bound: a process's last store leaves the
 * directory within the bound whichever thread stored it. */
static struct {
    pthread_mutex_t lock;
    int known, scanning;
    uint64_t bytes, added_while_scanning;
} usage = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Accounts a store of key that grew the directory by added bytes (less what
 * it replaced), and scans if due; returns the entries evicted. */
static int account_store(const char *key, int64_t added)
{
    pthread_mutex_lock(&usage.lock);
    if (usage.scanning) {
        if (added > 0)
            usage.added_while_scanning += (uint64_t)added;
        pthread_mutex_unlock(&usage.lock);
        return 0;
    }
    const uint64_t estimate = added < 0 && (uint64_t)-added > usage.bytes ? 0 : usage.bytes + (uint64_t)added;
    const int scan = !usage.known || (cache.max_bytes && estimate > cache.max_bytes);
    if (scan) {
        usage.scanning = 1;
        usage.added_while_scanning = 0;
    } else {
        usage.bytes = estimate;
    }
    pthread_mutex_unlock(&usage.lock);
    if (!scan)
        return 0;
    int evicted_total = 0;
    for (;;) {
        uint64_t total = 0;
        const int evicted = evict(key, &total);
        if (evicted > 0)
            evicted_total += evicted;
        pthread_mutex_lock(&usage.lock);
        const uint64_t pending = usage.added_while_scanning;
        usage.added_while_scanning = 0;
        /* The scan may or may not have seen those stores: counting them
         * again overestimates, which only brings the next scan sooner. */
        if (evicted >= 0 && pending > 0 && cache.max_bytes && total + pending > cache.max_bytes) {
            pthread_mutex_unlock(&usage.lock);
            continue;
        }
        usage.scanning = 0;
        usage.known = evicted >= 0;
        usage.bytes = total + pending;
        pthread_mutex_unlock(&usage.lock);
        return evicted_total;
    }
}

/* Forgets the estimate (after a clear): the next store scans. */
static void forget_usage(void)
{
    pthread_mutex_lock(&usage.lock);
    usage.known = 0;
    pthread_mutex_unlock(&usage.lock);
}

uint64_t sneppx_disk_cache_scan_count(void) { return atomic_load(&scan_count); }

sneppx_status sneppx_disk_cache_store(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                      const void *object, size_t object_size, int *evicted)
{
    *evicted = 0;
    int dir = cache_fd();
    if (dir < 0)
        return SNEPPX_OK;
    if (cache.read_only)
        return sneppx_fail(SNEPPX_ERR_IO, "the kernel disk cache %s is read-only (%s)", cache.path,
                           cache.read_only_reason);
    struct entry_header header = {.format_version = ENTRY_FORMAT_VERSION, .header_size = sizeof header,
                                  .payload_size = object_size};
    memcpy(header.magic, ENTRY_MAGIC, sizeof header.magic);
    memcpy(header.fingerprint, fingerprint, SNEPPX_SHA256_SIZE);
    sneppx_sha256(object, object_size, header.payload_sha256);

    char name[SNEPPX_KEY_MAX + 16], temp[SNEPPX_KEY_MAX + 64];
    entry_name(key, ENTRY_SUFFIX, name, sizeof name);
    /* A name taken is not ours to remove: a writer that died with this pid
     * (a container's processes get the same pids run after run), or one of the
     * same pid in another pid namespace. The next name is tried. */
    int fd = -1;
    for (int attempt = 0; attempt < TEMP_ATTEMPTS && (attempt == 0 || errno == EEXIST); attempt++) {
        snprintf(temp, sizeof temp, ".%s" TEMP_MARK "%ld-%d", name, (long)getpid(),
                 atomic_fetch_add(&temp_counter, 1));
        if ((fd = openat(dir, temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) >= 0)
            break;
    }
    if (fd < 0)
        return sneppx_fail(SNEPPX_ERR_IO, "cannot create %s/%s: %s", cache.path, temp, strerror(errno));
    int failed = write_fully(fd, &header, sizeof header) != 0 || write_fully(fd, object, object_size) != 0 ||
                 fsync(fd) != 0;
    int saved_errno = errno;
    failed |= close(fd) != 0;
    struct stat replaced; /* the entry the rename replaces, if any: its bytes leave the directory */
    int64_t added = (int64_t)(sizeof header + object_size);
    if (!failed && fstatat(dir, name, &replaced, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(replaced.st_mode))
        added -= (int64_t)replaced.st_size;
    /* rename is atomic: readers see the old entry or the whole new one. */
    if (failed || renameat(dir, temp, dir, name) != 0) {
        if (!failed)
            saved_errno = errno;
        unlinkat(dir, temp, 0);
        return sneppx_fail(SNEPPX_ERR_IO, "cannot write the kernel cache entry %s/%s: %s", cache.path, name,
                           strerror(saved_errno));
    }
    fsync(dir); /* makes the rename itself durable */
    *evicted = account_store(key, added);
    return SNEPPX_OK;
}

static int remove_cache_file(const char *name, const struct stat *info, void *context)
{
    sneppx_status *status = context;
    const int lock = is_lock_file(name, info);
    if (!lock && !is_temp_file(name, info) && !is_entry_file(name, info))
        return 0;
    const int failed = lock ? remove_free_lock(name) != 0 : unlinkat(cache.fd, name, 0) != 0 && errno != ENOENT;
    if (failed && *status == SNEPPX_OK)
        *status = sneppx_fail(SNEPPX_ERR_IO, "cannot remove %s/%s: %s", cache.path, name, strerror(errno));
    return 0;
}

sneppx_status sneppx_disk_cache_clear(void)
{
    if (cache_fd() >= 0 && cache.read_only)
        return sneppx_fail(SNEPPX_ERR_IO, "the kernel disk cache %s is read-only (%s): nothing removed", cache.path,
                           cache.read_only_reason);
    sneppx_status removal = SNEPPX_OK;
    sneppx_status status = for_each_file(remove_cache_file, &removal);
    forget_usage();
    return status != SNEPPX_OK ? status : removal;
}

void sneppx_disk_cache_format_time(struct timespec when, char *text, size_t size)
{
    struct tm local;
    if (!localtime_r(&when.tv_sec, &local) || strftime(text, size, "%Y-%m-%d %H:%M:%S", &local) == 0)
        snprintf(text, size, "@%lld", (long long)when.tv_sec);
}

/* ---- public: include/sneppx/cache.h ---------------------------------------- */

const char *sneppx_cache_dir(void)
{
    const char *path = sneppx_disk_cache_path();
    return path ? path : "";
}

sneppx_status sneppx_cache_clear(void)
{
    sneppx_clear_error();
    return sneppx_disk_cache_clear();
}
