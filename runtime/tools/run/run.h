/* sneppx-run's parts beside its main (runtime/tools/sneppx-run.c). */
#ifndef SNEPPX_TOOLS_RUN_H
#define SNEPPX_TOOLS_RUN_H
#include <stdint.h>

#include "sneppx/config.h"

/* Generation on preset `arch` with synthetic weights: `batch` sequences
 * prefilled with `context` tokens each (chunks of 512), then `steps` decode
 * steps of one token per sequence through a paged KV cache. Prints the prefill
 * time, ms per step, tokens/s and the bytes a step reads against the read
 * bandwidth measured just before and after the steps; the projections' weights
 * stored as weight_dtype, multiplied in compute_dtype. 0 on success. */
int run_decode(const char *arch, int64_t batch, int64_t context, int64_t steps, int threads, int flash,
               sneppx_dtype weight_dtype, sneppx_dtype kv_dtype, sneppx_dtype compute_dtype);

#endif
