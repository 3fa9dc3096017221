/* sneppx — the kernel caches: where compiled kernels live and what the JIT did.
 *
 * Every kernel specialization is compiled by LLVM at most once per process
 * (in-memory cache) and at most once per machine while the disk cache holds
 * its object file. The disk cache directory is
 *
 *   $SNEPPX_CACHE_DIR, else $XDG_CACHE_HOME/sneppx, else ~/.cache/sneppx
 *
 * resolved once per process, created with mode 0700. A directory that is not
 * ours or that group/others may write (unless sticky), or whose path is too
 * long, turns the disk cache off for the process (memory-only) with one
 * warning on stderr. One this process cannot write (mode 0500, a read-only
 * mount) is used read-only: valid entries load; nothing is written (no lock
 * files, no eviction); a kernel compiled there stays in memory, with one
 * warning. Entries are verified (SHA-256 fingerprint of the bitcode, key,
 * sneppx and LLVM versions, optimization options, host CPU) before use; a bad
 * or foreign entry is rebuilt and replaced, never loaded.
 *
 * Environment:
 *   SNEPPX_CACHE_DIR     the directory (see above)
 *   SNEPPX_CACHE_MAX_MB  size bound of the directory in MiB (fractions allowed;
 *                        default 1024, 0 = no bound, a positive value below
 *                        one byte = one byte); temporary files count too. A
 *                        process checks it by reading the directory at its
 *                        first write and whenever its writes since would pass
 *                        the bound; it then removes dead writers' temporary
 *                        files (dated 10 minutes or more from now, its key not
 *                        locked) and evicts least recently used entries down
 *                        to 90% of the bound
 *   SNEPPX_CACHE_LOCK_TIMEOUT  seconds a process waits for another one building
 *                        the same key (fractions allowed; default 30, 0 = do
 *                        not wait), then builds it too, with one warning: the
 *                        other may be stopped (SIGSTOP, a debugger)
 *   SNEPPX_TUNE=1        the first layer a process creates times the GEMM's tile
 *                        candidates when the cache holds no valid tuning record
 *                        for this host (a few seconds, once: without a usable
 *                        disk cache, once per process, with a warning) and keeps
 *                        the winner: GEMM keys then carry it (`sneppx-cache tune`
 *                        does it on demand; docs/API.md)
 *   SNEPPX_JIT=0         never compile: a kernel missing from both caches fails
 *                        with SNEPPX_ERR_JIT and a message naming its key
 *   SNEPPX_VERBOSE=1     log each compile (key and milliseconds)
 *   SNEPPX_TARGET=v8     run (and cache) another instruction-set target than the host's
 *   SNEPPX_JIT_THREADS, SNEPPX_PERF_MAP: docs/SECURITY.md, which lists them all
 */
#ifndef SNEPPX_CACHE_H
#define SNEPPX_CACHE_H

#include <stdint.h>
#include "sneppx/export.h"
#include "sneppx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SNEPPX_CACHE_KEY_MAX 160

/* The directory of the disk cache, or "" when the process runs memory-only.
 * Resolves (and creates) it on the first call. Thread-safe; the string lives
 * until process exit. */
SNEPPX_API const char *sneppx_cache_dir(void);

/* Removes every entry of the disk cache (object files, temporary files, and
 * the lock files no process holds: a held one guards a build in progress).
 * Kernels this process already resolved stay valid and stay in the
 * in-memory cache. Memory-only: does nothing and returns SNEPPX_OK.
 * Read-only: removes nothing and returns SNEPPX_ERR_IO.
 * Thread-safe; a process writing an entry at the same time keeps its kernel in
 * memory. */
SNEPPX_API sneppx_status sneppx_cache_clear(void);

/* Where a resolve found its kernel. */
typedef enum sneppx_kernel_source {
    SNEPPX_KERNEL_SOURCE_NONE = 0,     /* no resolve yet, or it failed */
    SNEPPX_KERNEL_SOURCE_MEMORY = 1,   /* in-memory cache of this process */
    SNEPPX_KERNEL_SOURCE_DISK = 2,     /* object file of the disk cache, linked */
    SNEPPX_KERNEL_SOURCE_COMPILED = 3  /* specialized, optimized and compiled by LLVM */
} sneppx_kernel_source;

/* Counters since process start (or the last test reset), over all threads. */
typedef struct sneppx_jit_stats {
    uint64_t compiles;          /* kernels compiled by LLVM */
    uint64_t disk_hits;         /* kernels linked from a verified disk cache entry */
    uint64_t memory_hits;       /* resolves answered by the in-memory cache */
    uint64_t disk_rejects;      /* entries refused (corrupt, foreign, symlink, not ours) */
    uint64_t disk_writes;       /* entries written to the disk cache */
    uint64_t evictions;         /* entries removed to honour SNEPPX_CACHE_MAX_MB */
    double compile_ms_total;    /* specialize + optimize + emit object, summed */
    double load_ms_total;       /* read + verify + link + look up, summed over compiles and hits */
    char last_key[SNEPPX_CACHE_KEY_MAX]; /* the last kernel compiled or loaded from disk */
    sneppx_kernel_source last_source;
    double last_ms;             /* its total milliseconds */
} sneppx_jit_stats;

/* Copies the counters into stats. Thread-safe (a consistent snapshot). */
SNEPPX_API sneppx_status sneppx_jit_stats_get(sneppx_jit_stats *stats);

/* Timing of one resolve. compile_ms is 0 unless the kernel was compiled;
 * load_ms covers reading, verifying and linking the object (0 for memory). */
typedef struct sneppx_kernel_timing {
    char key[SNEPPX_CACHE_KEY_MAX];
    sneppx_kernel_source source;
    double compile_ms;
    double load_ms;
    double total_ms;            /* the whole resolve, key formatting to entry address */
} sneppx_kernel_timing;

/* The last kernel resolve of the calling thread. Thread-safe (per thread). */
SNEPPX_API sneppx_status sneppx_kernel_last_timing(sneppx_kernel_timing *timing);

#ifdef __cplusplus
}
#endif
#endif
