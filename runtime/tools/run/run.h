/* sneppx-run's parts beside its main (runtime/tools/sneppx-run.c). */
#ifndef SNEPPX_TOOLS_RUN_H
#define SNEPPX_TOOLS_RUN_H
#include <stdint.h>
#include <time.h>

#include "sneppx/config.h"
#include "sneppx/kv_cache.h"

/* Prefills go in chunks of this many tokens per sequence (run_decode, run_tp). */
#define RUN_PREFILL_CHUNK 512

/* The KV cache tokens of a run of `batch` sequences: `context` prefilled and `steps`
 * timed decode steps after a warm-up step, each sequence in whole pages. */
static inline int64_t run_kv_capacity_tokens(int64_t batch, int64_t context, int64_t steps)
{
    const int64_t page = SNEPPX_KV_DEFAULT_PAGE_SIZE;
    return batch * ((context + steps + 1 + page - 1) / page) * page;
}

/* Tokens per sequence of a run's largest forward: a prefill chunk, or a decode step's one. */
static inline int64_t run_forward_tokens(int64_t context)
{
    return context > RUN_PREFILL_CHUNK ? RUN_PREFILL_CHUNK : context > 1 ? context : 1;
}

/* Monotonic wall time, ms. */
static inline double run_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* qsort's order of doubles, ascending. */
static inline int run_compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Generation on preset `arch` with synthetic weights: `batch` sequences
 * prefilled with `context` tokens each (chunks of 512), then `steps` decode
 * steps of one token per sequence through a paged KV cache. Prints the prefill
 * time, ms per step, tokens/s and the bytes a step reads against the read
 * bandwidth measured just before and after the steps; the projections' weights
 * stored as weight_dtype, multiplied in compute_dtype. 0 on success. */
int run_decode(const char *arch, int64_t batch, int64_t context, int64_t steps, int threads, int flash,
               sneppx_dtype weight_dtype, sneppx_dtype kv_dtype, sneppx_dtype compute_dtype);

/* What main parsed, for the modes below. */
struct run_options {
    int64_t batch, seq_len, context, decode;
    int threads, repeat, flash;
    sneppx_dtype weight_dtype, kv_dtype, compute_dtype;
};

/* --tp, under mpirun (run/tp.c, built with MPI): each preset's layer split by
 * heads over the ranks of MPI_COMM_WORLD; a forward of batch x seq_len tokens
 * (or, with decode > 0, a prefill of context tokens and decode steps), each
 * rank's heads, memory and times, and the slowest rank's median. Initializes
 * and finalizes MPI; 0 on success (the same on every rank). */
int run_tp(int *argc, char ***argv, const char *const *archs, int arch_count, const struct run_options *options);

#endif
