/* Forward inputs for tests: hidden states, and the mask / position_ids pattern
 * of a mask mode, built the way HF callers build them. */
#ifndef SNEPPX_TEST_INPUTS_H
#define SNEPPX_TEST_INPUTS_H

#include <stdint.h>

typedef enum test_mask_mode {
    /* mask NULL (causal + the config's window), position_ids NULL. */
    TEST_MASK_CAUSAL,
    /* Explicit final mask: causal without any window (the layer must not add
     * its window on top), visible entries carry a random bias in [-2, 0],
     * masked entries finfo(float32).min; offset, non-contiguous position_ids. */
    TEST_MASK_EXPLICIT,
    /* Explicit causal mask where some rows have every key masked (by -inf and
     * by finfo.min; those rows must give zeros) and one row sees one key. */
    TEST_MASK_FULLY_MASKED_ROWS,
    /* HF left padding: batch row 0 starts with seq_len/3 pad tokens. Mask =
     * causal (+ window) AND key is not a pad; position_ids = cumsum(attn)-1 with
     * pads at 1 (HF generate). Pad query rows see no key. */
    TEST_MASK_LEFT_PADDING,
    TEST_MASK_MODE_COUNT
} test_mask_mode;

typedef struct test_inputs {
    int64_t batch, seq_len, hidden;
    float *hidden_states;    /* [batch, seq_len, hidden], uniform in [-1, 1) */
    float *mask;             /* [batch, 1, seq_len, seq_len] or NULL */
    int64_t mask_shape[4];
    int64_t *position_ids;   /* [batch, seq_len] or NULL */
} test_inputs;

/* Returns 0, or -1 when out of memory. window is the config's sliding window
 * (used by the left-padding mask, which HF builds with the window). */
int test_inputs_make(test_mask_mode mode, int64_t batch, int64_t seq_len, int64_t hidden, int64_t window,
                     uint64_t seed, test_inputs *inputs);
void test_inputs_free(test_inputs *inputs);
const char *test_mask_mode_name(test_mask_mode mode);

/* The mask_shape argument of sneppx_layer_forward (NULL when there is no mask). */
static inline const int64_t *test_inputs_mask_shape(const test_inputs *inputs)
{
    return inputs->mask ? inputs->mask_shape : 0;
}

#endif
