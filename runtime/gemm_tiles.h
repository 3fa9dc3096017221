/* Internal: the cache blocking a GEMM key carries (its kc and mc fields) on
 * this host: the host's tuning record for the target when the disk cache holds
 * a valid one (runtime/tuning_record.h), else the target's defaults
 * (targets.py's gemm_kc, gemm_mc, gemm_int8_mc). With SNEPPX_TUNE=1 and no
 * valid record, the first call for a target tunes it (runtime/gemm_tuner.h, a
 * few seconds) and keeps the winner. A tuned kc and mc apply to float32 and
 * 16-bit panels; int8 panels keep the target's taller block and k slice. */
#ifndef SNEPPX_RUNTIME_GEMM_TILES_H
#define SNEPPX_RUNTIME_GEMM_TILES_H
#include <stdint.h>
#include "kernel_registry.h"
#include "sneppx/config.h"

/* The GEMM key's kc and mc for panels of weight_type on target. The record is
 * read (or tuned) once per process and target. Thread-safe. */
void sneppx_gemm_tiles(const struct sneppx_target *target, sneppx_dtype weight_type, int64_t *kc, int64_t *mc);

/* The target's defaults alone (no record). */
void sneppx_gemm_default_tiles(const struct sneppx_target *target, sneppx_dtype weight_type, int64_t *kc,
                               int64_t *mc);

/* Tests and sneppx-cache tune: forgets what was read, so the next call reads
 * the disk cache (and SNEPPX_TUNE) again. Not thread-safe. */
void sneppx_gemm_tiles_reset(void);

#endif
