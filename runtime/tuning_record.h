/* Internal: a host's tuning record in the disk cache, one per kernel family
 * and target (today the GEMM's cache blocking, `tuning-gemm-v16`). It is an
 * entry like a kernel's (disk_cache.h: header, fingerprint, payload SHA-256),
 * whose fingerprint is the kernel fingerprint of its name and the family's
 * bitcode for this host (fingerprint.h: bitcode, versions, JIT options, host
 * triple, CPU and features), so a record from another host or build is
 * refused. The payload is one text line, "kc=<k slice> mc=<block rows>\n";
 * a value that is not among the target's candidates refuses the record too.
 * A refused record is only ignored (the target's defaults apply). */
#ifndef SNEPPX_RUNTIME_TUNING_RECORD_H
#define SNEPPX_RUNTIME_TUNING_RECORD_H
#include <stddef.h>
#include <stdint.h>
#include "fingerprint.h"
#include "kernel_registry.h"
#include "sneppx/status.h"

/* The GEMM tiles a record holds. */
struct sneppx_gemm_tuning {
    int64_t kc, mc;
};

typedef enum sneppx_tuning_load {
    SNEPPX_TUNING_NONE,     /* no record (or no disk cache) */
    SNEPPX_TUNING_LOADED,   /* verified and parsed: *tuning holds it */
    SNEPPX_TUNING_REFUSED   /* a record exists but is not trusted: reason says why */
} sneppx_tuning_load;

/* The record's name in the disk cache, "tuning-gemm-<target>" (a key-shaped
 * entry name). */
void sneppx_gemm_tuning_key(const struct sneppx_target *target, char *key, size_t key_size);

/* Whether key names a tuning record; then its fingerprint on this host and build.
 * SNEPPX_ERR_INVALID_ARGUMENT for another name, SNEPPX_ERR_UNSUPPORTED when this
 * build has no GEMM bitcode for its target. */
sneppx_status sneppx_tuning_fingerprint(const char *key, uint8_t fingerprint[SNEPPX_SHA256_SIZE]);

/* Reads, verifies and parses the GEMM record of target. */
sneppx_tuning_load sneppx_gemm_tuning_load(const struct sneppx_target *target, struct sneppx_gemm_tuning *tuning,
                                           char *reason, size_t reason_size);

/* The verdict sneppx_gemm_tuning_load would give the record named key (an
 * entry that verifies yet whose text is no candidate pair is refused too),
 * without dating the entry as used: for listing. */
sneppx_tuning_load sneppx_tuning_record_verify(const char *key, char *reason, size_t reason_size);

/* Checks tuning against target's candidates (SNEPPX_ERR_INVALID_ARGUMENT naming the
 * value) and writes the record. A memory-only cache keeps nothing (SNEPPX_OK); a
 * read-only one fails with SNEPPX_ERR_IO. */
sneppx_status sneppx_gemm_tuning_store(const struct sneppx_target *target, const struct sneppx_gemm_tuning *tuning);

/* SNEPPX_OK if tuning's kc and mc are among target's candidates; otherwise
 * SNEPPX_ERR_INVALID_ARGUMENT naming the value, with the reason in `reason` too. */
sneppx_status sneppx_gemm_tuning_check(const struct sneppx_target *target, const struct sneppx_gemm_tuning *tuning,
                                       char *reason, size_t reason_size);

#endif
