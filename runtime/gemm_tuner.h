/* Internal: times a target's GEMM tile candidates on this host. Each kc of
 * the target's candidates with each mc (targets.py) is compiled (or loaded)
 * as a float32 GEMM key, and all of them run the same product, partitioned as
 * the forward pass partitions it (templates/partition.h.j2), in interleaved
 * rounds; a candidate's time is its fastest round. The defaults are kept
 * unless a candidate beats them by SNEPPX_TUNE_MIN_GAIN or more on both its
 * fastest and its median round (a difference within noise changes no key);
 * of those that do, the one with the fastest median round wins.
 * Nothing is stored here: runtime/tuning_record.h keeps a result. */
#ifndef SNEPPX_RUNTIME_GEMM_TUNER_H
#define SNEPPX_RUNTIME_GEMM_TUNER_H
#include <stdint.h>
#include "kernel_registry.h"
#include "sneppx/status.h"
#include "tuning_record.h"

/* A candidate must run this fraction faster than the default to replace it. */
#define SNEPPX_TUNE_MIN_GAIN 0.01

/* Timed rounds a tuning may ask for. */
#define SNEPPX_TUNE_MAX_ROUNDS 100

#define SNEPPX_TUNE_MAX_CANDIDATES (SNEPPX_MAX_TILE_CANDIDATES * SNEPPX_MAX_TILE_CANDIDATES)

/* The product timed: [rows, k] x [k, n] on `threads` threads (0: OpenMP's
 * default), `rounds` timed rounds after one warm-up. */
struct sneppx_gemm_tune_shape {
    int64_t rows, k, n;
    int threads, rounds;
};

/* The shape `sneppx-cache tune` and SNEPPX_TUNE use: llama3-8B's O projection
 * at T = 512, [512, 4096] x [4096, 4096], 5 rounds on OpenMP's default threads
 * (5-7 s on 2 cores, compiles included). */
struct sneppx_gemm_tune_shape sneppx_gemm_tune_default_shape(void);

struct sneppx_gemm_tune_time {
    struct sneppx_gemm_tuning tiles;
    double ms;        /* the fastest round */
    double median_ms; /* the median round */
    double gflops;    /* 2 rows k n / the fastest round */
};

struct sneppx_gemm_tune_result {
    int count;                    /* candidates timed */
    struct sneppx_gemm_tune_time times[SNEPPX_TUNE_MAX_CANDIDATES];
    int fastest, defaults, winner; /* indices into times: the fastest round's, the defaults', the winner */
    double compile_ms, total_ms;  /* resolving the candidates; the whole tuning */
};

/* The winner among count candidates' times (sneppx_gemm_tune's rule above):
 * the index of the candidate with the fastest median round among those that
 * beat times[defaults] on both rounds, else defaults; with no defaults
 * (defaults < 0), the fastest median round of all (-1 when count is 0). */
int sneppx_gemm_tune_winner(const struct sneppx_gemm_tune_time *times, int count, int defaults);

/* Times target's candidates over shape (rows, k, n at least 1, rounds at least
 * 1, threads 0..SNEPPX_MAX_THREADS: SNEPPX_ERR_INVALID_ARGUMENT naming the
 * value). The target must be one this host runs (its features a subset of the
 * host's), else SNEPPX_ERR_UNSUPPORTED. */
sneppx_status sneppx_gemm_tune(const struct sneppx_target *target, const struct sneppx_gemm_tune_shape *shape,
                               struct sneppx_gemm_tune_result *result);

#endif
