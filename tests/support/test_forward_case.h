/* One forward case: build a layer, run it with flash and with SDPA, compare both
 * with each other and with the float64 reference, and fold the outcome into
 * the statistics of a group of cases (one summary line per group).
 *
 * SNEPPX_TEST_FORCE_REFERENCE=1 replaces the layer by the reference itself
 * (rounded to float32): every case must then pass with errors at float32
 * rounding level, which proves the harness (inputs, reference, metrics). */
#ifndef SNEPPX_TEST_FORWARD_CASE_H
#define SNEPPX_TEST_FORWARD_CASE_H

#include <stdint.h>
#include "sneppx/config.h"
#include "test_inputs.h"
#include "test_util.h"
#include "test_weights.h"

/* fp32 kernels vs the float64 reference. Every output element sums a few
 * hundred to a few thousand fp32 products (projections over hidden and H*D,
 * q.k over head_dim, p.v over the keys); with unit roundoff 6e-8 and random
 * signs the relative error is ~sqrt(K)*6e-8 <= 4e-6 for K <= 4096, the
 * polynomial exp adds ~1e-7 relative, and fp32 cos/sin of angles computed in
 * double add ~6e-8 absolute. 2e-5 RMS / 1e-4 max keeps a 5-20x margin, while a
 * semantic bug (a window off by one key, a wrong RoPE pairing or frequency, a
 * missing bias, a wrong GQA head) moves the output by 1e-3..1 (the harness's
 * own sensitivity checks in test_mha_forward.c prove it). */
#define TEST_REF_MAX_NORMALIZED 1e-4
#define TEST_REF_RMS_RELATIVE 2e-5
/* Flash vs SDPA: the same fp32 inputs and projections, different summation
 * order and exp in the attention only. */
#define TEST_PAIR_MAX_NORMALIZED 5e-5
#define TEST_PAIR_RMS_RELATIVE 1e-5

typedef struct test_case {
    const char *label;                      /* e.g. "causal s45" (mask mode, sizes) */
    const sneppx_config *config;            /* what the layer is created from */
    const sneppx_config *reference_config;  /* NULL = config; else the reference's own
                                               derivation (e.g. its extend_context) */
    const test_weights *weights;            /* NULL = the layer's synthetic weights: no
                                               reference, flash vs SDPA and finiteness only */
    const test_inputs *inputs;
    const char *expect_key;                 /* NULL, or text sneppx_layer_keys() must contain */
} test_case;

typedef struct test_group {
    char name[96];
    int cases, passed, failed, skipped;
    double worst_ref_max, worst_ref_rms;    /* over flash and SDPA vs reference */
    double worst_pair_max;                  /* flash vs SDPA */
    char worst_case[400];
} test_group;

int test_force_reference(void);

void test_group_begin(test_group *group, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* Runs one case; every check goes into tally, the outcome into group. Skipped
 * (and printed) only in forced-reference mode for cases on synthetic weights. */
void test_run_case(test_tally *tally, test_group *group, const test_case *test);

/* Prints the group's one-line summary. */
void test_group_end(const test_group *group);

#endif
