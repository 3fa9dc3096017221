/* The decode baselines (bench/baselines/decode_*.py, from the virtual
 * environment scripts/venv.sh makes): llama.cpp and HF transformers running
 * one attention layer's decode steps over a KV cache of a given context. */
#ifndef SNEPPX_BENCH_DECODE_BASELINES_H
#define SNEPPX_BENCH_DECODE_BASELINES_H

#include <stddef.h>
#include <stdint.h>

#include "child.h"
#include "sneppx/sneppx.h"
#include "timing.h"

/* Past this context a baseline runs batch 1 only: a batch would cost it that
 * many long prefills (llama.cpp: 16 x 32768 tokens, most of an hour). */
#define DECODE_BASELINE_BATCH_MAX_CONTEXT 4096

/* " (its step also reads 5.8 MB outside attention, not subtracted)" into text for
 * other_bytes > 0 (a baseline's nonattention_bytes), else "". */
void decode_baseline_describe_other_bytes(double other_bytes, char *text, size_t size);

/* A baseline run as a server (bench/baselines/decode_serve.py's protocol): the
 * bench asks it for one decode step at a time, in the same rounds as its own. */
struct decode_baseline_server {
    struct bench_server server;
    char script[64];
    char version[96];
    double other_bytes;     /* what a step also reads outside the attention layer (llama.cpp's FFN, norms
                               and output layer: the script's nonattention_bytes), 0 = none said */
    double request_seconds; /* a request's median round trip, in every step's time */
    char skipped[256];      /* why it is not running, "" when it is */
    struct bench_request step; /* the "step" request of its side (decode_baseline_step_side) */
};

/* Starts bench/baselines/<script> for config's shape on `threads` threads, with
 * extra_args (NULL-terminated, or NULL: e.g. {"--weight-type", "q8_0", NULL}), and
 * waits for it to be ready. Returns 0,
 * or -1 with why in served->skipped (no venv, no torch or llama_cpp there, ...). */
int decode_baseline_serve(const char *script, const sneppx_config *config, int threads,
                          const char *const *extra_args, struct decode_baseline_server *served);

/* Has the server fill a cache of `batch` sequences of `context` tokens; each
 * "step" request then runs one decode step at that context (bench_request_run).
 * Returns 0, or -1 (said on stderr; also for a server not running). */
int decode_baseline_prepare(struct decode_baseline_server *served, int64_t context, int64_t batch);

/* decode_baseline_prepare, then fills *side with a body that asks the server for one
 * step (bench_request_run), followed by `after` (bench_settle where a baseline's
 * threads would spin into the next side's time, or NULL). The caller settles once
 * after every baseline's prefill, before the rounds. Returns 0, or -1 as
 * decode_baseline_prepare. */
int decode_baseline_step_side(struct decode_baseline_server *served, int64_t context, int64_t batch,
                              void (*after)(void), struct bench_side *side);

/* Ends the server (nothing for one that is not running). */
void decode_baseline_stop(struct decode_baseline_server *served);

#endif
