/* The decode baselines (bench/baselines/decode_*.py, from the virtual
 * environment scripts/venv.sh makes): llama.cpp and HF transformers running
 * one attention layer's decode steps over a KV cache of a given context. */
#ifndef SNEPPX_BENCH_DECODE_BASELINES_H
#define SNEPPX_BENCH_DECODE_BASELINES_H

#include <stddef.h>
#include <stdint.h>

#include "sneppx/sneppx.h"
#include "timing.h"

#define DECODE_BASELINE_MAX_CONTEXTS 3
#define DECODE_BASELINE_MAX_BATCHES 2
/* Past this context a baseline runs batch 1 only: a batch would cost it that
 * many long prefills (llama.cpp: 16 x 32768 tokens, most of an hour). */
#define DECODE_BASELINE_BATCH_MAX_CONTEXT 4096

struct decode_baseline_times {
    struct bench_stats seconds[DECODE_BASELINE_MAX_CONTEXTS][DECODE_BASELINE_MAX_BATCHES];
    char version[96];
    double other_bytes; /* what a step also reads outside the attention layer (llama.cpp's FFN,
                           norms and output layer: the script's nonattention_bytes), 0 = none said */
    char skipped[256]; /* why nothing was measured, "" when something was */
};

/* " (its step also reads 5.8 MB outside attention, not subtracted)" into text when
 * times says so, else "". */
void decode_baseline_describe_other_bytes(const struct decode_baseline_times *times, char *text, size_t size);

/* Runs bench/baselines/<script> for every (context, batch) of config's shape on
 * `threads` threads, `steps` timed steps each, with extra_args (NULL-terminated,
 * or NULL: e.g. {"--weight-type", "q8_0", NULL}) and fills times. */
void decode_baseline_run(const char *script, const sneppx_config *config, const int64_t *contexts,
                         int context_count, const int64_t *batches, int batch_count, int threads, int steps,
                         const char *const *extra_args, struct decode_baseline_times *times);

#endif
