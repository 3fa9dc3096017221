/* Internal: the disk cache of compiled kernel objects. The one module that
 * owns the cache directory, its environment overrides and its file format.
 *
 * An entry <dir>/<key>.o is a header (magic, format version, fingerprint,
 * payload size, payload SHA-256) and the payload (a kernel's object bundle,
 * object_bundle.h, or a tuning record: opaque here). It is written to a temp
 * file in the same directory, fsynced and renamed, so readers see a whole
 * entry or none; <key>.lock serializes processes that build the same key.
 * Other files in the directory are the user's: listing, eviction and clear
 * touch only key-named entries with the magic, empty locks and temp files.
 * Every operation goes through one directory descriptor opened and checked
 * once, and never follows a symbolic link inside it.
 *
 * Memory-only (no usable directory): loads miss, stores and clears do
 * nothing. Read-only (a directory we may not write: mode 0500, a read-only
 * mount): loads verify and load entries without marking them used, locks are
 * not taken, stores and clears fail and write nothing. All functions are
 * thread-safe. */
#ifndef SNEPPX_RUNTIME_DISK_CACHE_H
#define SNEPPX_RUNTIME_DISK_CACHE_H
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "fingerprint.h"
#include "kernel_registry.h"
#include "sneppx/status.h"

/* The resolved directory, or NULL when memory-only. The first call resolves
 * it: $SNEPPX_CACHE_DIR, else $XDG_CACHE_HOME/sneppx, else ~/.cache/sneppx,
 * created 0700; a directory that is not ours, that group or others may write
 * (unless sticky), or whose path is too long or cannot be created, is
 * refused with one warning. One that this process cannot write is read-only. */
const char *sneppx_disk_cache_path(void);

/* Whether the directory is read-only for this process (see above). */
int sneppx_disk_cache_read_only(void);

/* SNEPPX_CACHE_MAX_MB in bytes (fractions allowed; default 1024 MiB; 0 =
 * unbounded; a positive value below one byte is 1). */
uint64_t sneppx_disk_cache_max_bytes(void);

/* SNEPPX_CACHE_LOCK_TIMEOUT in seconds (fractions allowed; default 30; 0 =
 * do not wait): how long sneppx_disk_cache_lock waits for another process. */
double sneppx_disk_cache_lock_timeout(void);

typedef enum sneppx_disk_load {
    SNEPPX_DISK_MISS,      /* no entry (or memory-only) */
    SNEPPX_DISK_HIT,       /* verified; *object holds the payload */
    SNEPPX_DISK_REJECTED   /* an entry exists but is not trusted; it will be replaced */
} sneppx_disk_load;

/* Reads and verifies the entry of key against fingerprint. On a hit,
 * *object is malloc'd (the caller frees it) and the entry is marked used for
 * LRU eviction. On a rejection, reason says why. */
sneppx_disk_load sneppx_disk_cache_load(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                        void **object, size_t *object_size, char *reason, size_t reason_size);

/* The verdict load would give, without marking the entry used (for listing);
 * object NULL: without keeping the payload either. */
sneppx_disk_load sneppx_disk_cache_verify(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                          void **object, size_t *object_size, char *reason, size_t reason_size);

/* Waits until this process holds the build lock of key; returns its
 * descriptor, or -1 when there is no lock to take (memory-only, read-only,
 * or the lock file is refused: building unlocked only risks duplicate work)
 * or another process held it for the whole lock timeout (one warning naming
 * the key and the wait: that process may be stopped, and its lock is never
 * released until it runs again). */
int sneppx_disk_cache_lock(const char *key);
void sneppx_disk_cache_unlock(int lock);

/* Writes the entry of key atomically. At the process's first store, and at
 * any store after which the directory would exceed the size bound (by the
 * last scan's total plus this process's stores since), scans the directory:
 * removes temporary files orphaned by dead writers (dated 10 minutes or more
 * from now, past or future; key not locked), then, while the entries and the
 * temporary files left exceed the bound, evicts least recently used entries
 * (never this one) down to 90% of it. *evicted counts the entries. A failure
 * leaves no partial entry; a read-only cache fails with SNEPPX_ERR_IO. */
sneppx_status sneppx_disk_cache_store(const char *key, const uint8_t fingerprint[SNEPPX_SHA256_SIZE],
                                      const void *object, size_t object_size, int *evicted);

/* Removes every entry and temp file, and every lock file no process holds
 * (a held one guards a build in progress; the next clear takes it). A
 * read-only cache fails with SNEPPX_ERR_IO and removes nothing. */
sneppx_status sneppx_disk_cache_clear(void);

/* The directory scans stores made in this process (see store), for tests. */
uint64_t sneppx_disk_cache_scan_count(void);

typedef struct sneppx_disk_entry {
    char key[SNEPPX_KEY_MAX];
    uint64_t bytes;        /* file size, header included */
    struct timespec last_used; /* written or last loaded (the file's mtime) */
} sneppx_disk_entry;

/* The entries, sorted by key: *entries is malloc'd (the caller frees it). */
sneppx_status sneppx_disk_cache_list(sneppx_disk_entry **entries, size_t *count);

/* when (an entry's last_used) as local time "YYYY-MM-DD HH:MM:SS", or as
 * "@<seconds since the epoch>" when it has no such date (an mtime beyond the
 * calendar's years, as tmpfs can store). */
void sneppx_disk_cache_format_time(struct timespec when, char *text, size_t size);

/* The temporary files of stores in the directory (in progress, or left by
 * writers that died: see store), which count in the size bound too. */
sneppx_status sneppx_disk_cache_temp_files(size_t *count, uint64_t *bytes);

#endif
