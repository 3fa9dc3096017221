/* Hidden states, masks and position ids of the test mask modes. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_inputs.h"
#include "test_util.h"

/* What HF writes into masked entries: torch.finfo(torch.float32).min. */
static const float hf_masked = -FLT_MAX;

const char *test_mask_mode_name(test_mask_mode mode)
{
    switch (mode) {
    case TEST_MASK_CAUSAL: return "causal";
    case TEST_MASK_EXPLICIT: return "explicit";
    case TEST_MASK_FULLY_MASKED_ROWS: return "masked-rows";
    case TEST_MASK_LEFT_PADDING: return "left-pad";
    case TEST_MASK_MODE_COUNT: break;
    }
    return "?";
}

static void fill_explicit(test_rng *rng, int64_t seq_len, float *plane)
{
    for (int64_t i = 0; i < seq_len; i++)
        for (int64_t j = 0; j < seq_len; j++)
            plane[i * seq_len + j] = j <= i ? -2.0f * (float)test_rng_uniform(rng) : hf_masked;
}

static void fill_fully_masked_rows(int64_t b, int64_t seq_len, float *plane)
{
    for (int64_t i = 0; i < seq_len; i++)
        for (int64_t j = 0; j < seq_len; j++)
            plane[i * seq_len + j] = j <= i ? 0.0f : hf_masked;
    if (b == 0) {
        for (int64_t j = 0; j < seq_len; j++)
            plane[j] = -INFINITY; /* row 0 */
        for (int64_t j = 1; j < seq_len; j++)
            plane[(seq_len - 1) * seq_len + j] = hf_masked; /* last row: key 0 only */
    } else {
        const int64_t row = seq_len / 2;
        for (int64_t j = 0; j < seq_len; j++)
            plane[row * seq_len + j] = hf_masked;
    }
}

static void fill_left_padding(int64_t pad, int64_t seq_len, int64_t window, float *plane, int64_t *positions)
{
    for (int64_t i = 0; i < seq_len; i++) {
        positions[i] = i < pad ? 1 : i - pad;
        for (int64_t j = 0; j < seq_len; j++) {
            const int visible = j <= i && j >= pad && (window <= 0 || i - j <= window - 1);
            plane[i * seq_len + j] = visible ? 0.0f : hf_masked;
        }
    }
}

int test_inputs_make(test_mask_mode mode, int64_t batch, int64_t seq_len, int64_t hidden, int64_t window,
                     uint64_t seed, test_inputs *in)
{
    memset(in, 0, sizeof *in);
    in->batch = batch;
    in->seq_len = seq_len;
    in->hidden = hidden;
    test_rng rng = test_rng_seeded(seed);
    const int64_t plane = seq_len * seq_len;
    in->hidden_states = malloc((size_t)(batch * seq_len * hidden) * sizeof(float));
    if (!in->hidden_states)
        return -1;
    test_fill_uniform(&rng, in->hidden_states, batch * seq_len * hidden, 1.0f);
    if (mode == TEST_MASK_CAUSAL)
        return 0;

    in->mask = malloc((size_t)(batch * plane) * sizeof(float));
    in->position_ids = malloc((size_t)(batch * seq_len) * sizeof(int64_t));
    if (!in->mask || !in->position_ids) {
        test_inputs_free(in);
        return -1;
    }
    in->mask_shape[0] = batch;
    in->mask_shape[1] = 1;
    in->mask_shape[2] = seq_len;
    in->mask_shape[3] = seq_len;
    for (int64_t b = 0; b < batch; b++) {
        float *mask = in->mask + b * plane;
        int64_t *positions = in->position_ids + b * seq_len;
        for (int64_t i = 0; i < seq_len; i++)
            positions[i] = i;
        if (mode == TEST_MASK_EXPLICIT) {
            fill_explicit(&rng, seq_len, mask);
            /* A continuation after 1000 tokens, and a strided row: RoPE sees large angles. */
            for (int64_t i = 0; i < seq_len; i++)
                positions[i] = b % 2 == 0 ? 1000 + i : 3 + 2 * i;
        } else if (mode == TEST_MASK_FULLY_MASKED_ROWS) {
            fill_fully_masked_rows(b, seq_len, mask);
        } else {
            fill_left_padding(b == 0 ? seq_len / 3 : 0, seq_len, window, mask, positions);
        }
    }
    if (mode == TEST_MASK_FULLY_MASKED_ROWS) {
        free(in->position_ids);
        in->position_ids = NULL;
    }
    return 0;
}

void test_inputs_free(test_inputs *in)
{
    free(in->hidden_states);
    free(in->mask);
    free(in->position_ids);
    memset(in, 0, sizeof *in);
}
