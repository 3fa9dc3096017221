#include "disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include "sneppx/cache.h"

#define ENTRY_SUFFIX ".o"
#define LOCK_SUFFIX ".lock"
#define TEMP_MARK ".tmp-"               /* temp files: .<key>.o.tmp-<pid>-<n> */
#define ENTRY_MAGIC "sneppxK\n"
#define ENTRY_FORMAT_VERSION 1
#define DEFAULT_MAX_MB 1024
#define MAX_PAYLOAD_BYTES (256u << 20)  /* far above any kernel; bounds a hostile size field */
#define ORPHAN_AGE_SECONDS (10 * 60)    /* a temp file untouched this long is a dead writer's (evict) */

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
    char path[PATH_MAX];
    uint64_t max_bytes;
} cache = {.fd = -1};
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static atomic_int temp_counter;

/* The chosen path, before any check: the first environment override set. */
static int choose_path(char *path, size_t size)
{
    const char *explicit_dir = getenv("SNEPPX_CACHE_DIR");
    if (explicit_dir && explicit_dir[0])
        return snprintf(path, size, "%s", explicit_dir) < (int)size;
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') /* the XDG spec ignores relative values */
        return snprintf(path, size, "%s/sneppx", xdg) < (int)size;
    const char *home = getenv("HOME");
    if (!home || !home[0]) {
        struct passwd *user = getpwuid(geteuid());
        home = user ? user->pw_dir : NULL;
    }
    return home && snprintf(path, size, "%s/.cache/sneppx", home) < (int)size;
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

/* Why the directory open as fd cannot hold trusted code, or NULL. */
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
    /* Writable for us: create and remove a probe file. */
    char probe[64];
    snprintf(probe, sizeof probe, ".probe-%ld", (long)getpid());
    int probe_fd = openat(fd, probe, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (probe_fd < 0) {
        snprintf(reason, reason_size, "not writable: %s", strerror(errno));
        return reason;
    }
    close(probe_fd);
    unlinkat(fd, probe, 0);
    return NULL;
}

/* SNEPPX_CACHE_MAX_MB in bytes; fractions allowed ("0.5" is 512 KiB). */
static uint64_t read_max_bytes(void)
{
    const char *env = getenv("SNEPPX_CACHE_MAX_MB");
    if (!env || !env[0])
        return (uint64_t)DEFAULT_MAX_MB << 20;
    char *end;
    double megabytes = strtod(env, &end);
    if (*end != '\0' || !(megabytes >= 0.0 && megabytes < 1e12)) {
        sneppx_log(0, "warning: SNEPPX_CACHE_MAX_MB='%s' is not a size in MiB; using %d", env, DEFAULT_MAX_MB);
        return (uint64_t)DEFAULT_MAX_MB << 20;
    }
    return (uint64_t)(megabytes * (1 << 20));
}

static void resolve_cache(void)
{
    cache.max_bytes = read_max_bytes();
    char chosen[PATH_MAX], reason[256];
    const char *problem = NULL;
    int fd = -1;
    if (!choose_path(chosen, sizeof chosen)) {
        snprintf(chosen, sizeof chosen, "(none)");
        problem = "no SNEPPX_CACHE_DIR, XDG_CACHE_HOME or home directory";
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
    sneppx_log(2, "kernel disk cache: %s", cache.path);
}

static int cache_fd(void)
{
    pthread_once(&cache_once, resolve_cache);
    return cache.fd;
}

const char *sneppx_disk_cache_path(void) { return cache_fd() >= 0 ? cache.path : NULL; }

uint64_t sneppx_disk_cache_max_bytes(void)
{
    cache_fd();
    return cache.max_bytes;
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

/* Whether name[0, length) has the shape of a kernel key (kernel_cache.c):
 * family, then "-<prefix><value>" fields, the last "-v<vector width>", all in
 * [a-z0-9_]. The directory may hold other files (SNEPPX_CACHE_DIR is the
 * user's choice): listing, eviction and clear touch only files named by keys. */
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
    const char *width = memrchr(name, '-', length);
    if (!width || width[1] != 'v' || width + 2 == name + length)
        return 0;
    for (const char *digit = width + 2; digit < name + length; digit++)
        if (*digit < '0' || *digit > '9')
            return 0;
    return 1;
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
                                   size_t *object_size, char *reason, size_t reason_size)
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
    return read_entry(key, fingerprint, object, object_size, reason, reason_size);
}

sneppx_disk_load sneppx_disk_cache_verify(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                          char *reason, size_t reason_size)
{
    return read_entry(key, fingerprint, NULL, NULL, reason, reason_size);
}

/* Attempts at a lock file that keeps being unlinked under us before building
 * unlocked (which only risks building the key twice). */
#define LOCK_ATTEMPTS 64

int sneppx_disk_cache_lock(const char *key)
{
    int dir = cache_fd();
    if (dir < 0)
        return -1;
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
        while (flock(fd, LOCK_EX) != 0) {
            if (errno != EINTR) {
                close(fd);
                return -1;
            }
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

/* Removes the temporary file name if its writer is certainly gone; 1 if it did.
 *
 * A writer killed mid-store (SIGKILL, OOM killer, power loss) leaves its temp
 * file behind; a live writer's temp file must never go (its rename would fail).
 * Two tests, both required:
 * - Age: the file's mtime is ORPHAN_AGE_SECONDS (10 minutes) old. A store
 *   creates the file after the compile, then writes it in one go, fsyncs and
 *   renames it: the mtime moves with every write, and only a stalled fsync
 *   keeps a live file unchanged, never for minutes. The age alone covers
 *   writers that hold no lock (a refused lock file means building unlocked).
 * - The key's flock: writers hold it from before the compile until after the
 *   rename, so when we can take it without blocking, no process (this one
 *   included: flock conflicts between descriptors) is storing that key. We
 *   unlink while holding it. A missing lock file leaves the age to decide.
 * Not the pid in the name: pids are reused, and processes in another pid
 *   namespace (containers sharing the cache) have pids we cannot see. */
static int remove_orphan(const char *name, const struct stat *info)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0 || now.tv_sec - info->st_mtim.tv_sec < ORPHAN_AGE_SECONDS)
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
        sneppx_log(2, "removed %s/%s, the temporary file of a writer that died %lld s ago", cache.path, name,
                   (long long)(now.tv_sec - info->st_mtim.tv_sec));
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

/* Removes orphaned temporary files (see remove_orphan), then least recently
 * used entries, never keep_key, until the directory (entries and the
 * temporary files left) fits the bound. Returns how many entries it removed. */
static int evict(const char *keep_key)
{
    uint64_t bound = cache.max_bytes;
    struct eviction_scan scan = {0};
    if (for_each_file(scan_for_eviction, &scan) != SNEPPX_OK || scan.list.out_of_memory || bound == 0) {
        free(scan.list.entries);
        return 0;
    }
    sneppx_disk_entry *entries = scan.list.entries;
    size_t count = scan.list.count;
    uint64_t total = scan.temp_bytes;
    for (size_t i = 0; i < count; i++)
        total += entries[i].bytes;
    if (count > 1)
        qsort(entries, count, sizeof *entries, by_last_use);
    int evicted = 0;
    for (size_t i = 0; i < count && total > bound; i++) {
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
    return evicted;
}

sneppx_status sneppx_disk_cache_store(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                      const void *object, size_t object_size, int *evicted)
{
    *evicted = 0;
    int dir = cache_fd();
    if (dir < 0)
        return SNEPPX_OK;
    struct entry_header header = {.format_version = ENTRY_FORMAT_VERSION, .header_size = sizeof header,
                                  .payload_size = object_size};
    memcpy(header.magic, ENTRY_MAGIC, sizeof header.magic);
    memcpy(header.fingerprint, fingerprint, SNEPPX_SHA256_SIZE);
    sneppx_sha256(object, object_size, header.payload_sha256);

    char name[SNEPPX_KEY_MAX + 16], temp[SNEPPX_KEY_MAX + 64];
    entry_name(key, ENTRY_SUFFIX, name, sizeof name);
    snprintf(temp, sizeof temp, ".%s" TEMP_MARK "%ld-%d", name, (long)getpid(), atomic_fetch_add(&temp_counter, 1));
    int fd = openat(dir, temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return sneppx_fail(SNEPPX_ERR_IO, "cannot create %s/%s: %s", cache.path, temp, strerror(errno));
    int failed = write_fully(fd, &header, sizeof header) != 0 || write_fully(fd, object, object_size) != 0 ||
                 fsync(fd) != 0;
    int saved_errno = errno;
    failed |= close(fd) != 0;
    /* rename is atomic: readers see the old entry or the whole new one. */
    if (failed || renameat(dir, temp, dir, name) != 0) {
        if (!failed)
            saved_errno = errno;
        unlinkat(dir, temp, 0);
        return sneppx_fail(SNEPPX_ERR_IO, "cannot write the kernel cache entry %s/%s: %s", cache.path, name,
                           strerror(saved_errno));
    }
    fsync(dir); /* makes the rename itself durable */
    *evicted = evict(key);
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
    sneppx_status removal = SNEPPX_OK;
    sneppx_status status = for_each_file(remove_cache_file, &removal);
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
