/* The tensor-parallel cases (include/sneppx/shard.h), written once for any
 * transport: each rank of a world runs shard_cases_run() with its own
 * environment, as an MPI rank (tests/mpi/) or as a thread of one process
 * (tests/test_shard.c). Public API only, so the MPI tests link the shared
 * library. */
#ifndef SNEPPX_TEST_SHARD_CASES_H
#define SNEPPX_TEST_SHARD_CASES_H

#include "sneppx/sneppx.h"

typedef struct shard_env {
    int rank, world;
    /* A fresh shard of this rank (each create call takes one); 0 on success. */
    int (*make_shard)(void *context, sneppx_shard *shard);
    /* Waits for every rank. */
    void (*barrier)(void *context);
    void *context;
    /* A directory every rank sees (the checkpoint case writes a file there). */
    const char *scratch_dir;
    /* Each rank is a process of its own, so /proc/self/io counts its reads alone. */
    int own_process;
} shard_env;

/* Which cases run: every config of the small families (GQA with biases and a
 * window, MQA with partial rotary, MLA absorbed and naive, with and without q
 * LoRA), forward, masked forward and cached forward; the failure cases (another
 * config on one rank, a bad argument on one rank, a full cache on one rank, ...);
 * a checkpoint read shard by shard; and with SHARD_CASES_PRESETS the real shapes
 * of llama3-8B and qwen2-0.5B at a few tokens. */
enum { SHARD_CASES_SMALL = 1, SHARD_CASES_FAILURES = 2, SHARD_CASES_CHECKPOINT = 4, SHARD_CASES_PRESETS = 8 };

/* Runs the selected cases on this rank, printing "rank R/W: FAIL ..." lines;
 * returns the number of failed checks (the same cases must run on every rank). */
int shard_cases_run(const shard_env *env, int which);

#endif
