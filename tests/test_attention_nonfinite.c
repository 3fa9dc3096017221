/* NaN / Inf in one token must stay in the rows that see that token.
 *
 * A token's hidden state is poisoned (NaN, Inf, or a value that overflows only
 * its key or only its value); every output row whose attention cannot see that
 * token (causal mask, sliding window, explicit mask: later tokens, tokens
 * outside the window, masked entries, fully masked rows) must be finite and
 * equal, within the fp32 budget of tests/support/test_forward_case.h, for
 * flash, SDPA and the float64 reference, which sums over visible keys only.
 * Flash used to add 0 * v_j for a key hidden from a row inside a tile that
 * crosses the mask boundary, which is NaN when v_j is NaN or infinite: a NaN
 * at token 10 of 20 turned all 20 rows NaN (SDPA: rows 10-19, as HF).
 *
 * Positions cover the first token, tokens inside and at the edges of the
 * 64-key tiles and the query blocks (16 positions, 18 for group 4 at v8), and
 * the last token; sequences of 150 tokens leave partly padded row vectors at
 * the end; configs: GQA group 4, MHA (group 1: blocks of 32 rows at v16, 24 at
 * v8), a window of 13, and absorbed MLA. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha_reference.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "test_forward_case.h"
#include "test_inputs.h"
#include "test_util.h"
#include "test_weights.h"

#define SEQ_LEN 150
#define BATCH 2
#define HIDDEN 80
/* The hidden feature a poisoned token carries its value in. */
#define FEATURE 3
/* Weight of FEATURE in the projection that must overflow: 3e38 * 8 is inf in float. */
#define HUGE_INPUT 3.0e38f
#define OVERFLOW_WEIGHT 8.0f

static test_tally tally;

enum poison {
    POISON_NAN,    /* q, k and v of the token NaN */
    POISON_INF,    /* q, k and v of the token infinite (or NaN after RoPE) */
    POISON_K_ONLY, /* only k overflows: q and v of the token stay finite */
    POISON_V_ONLY, /* only v overflows: q and k of the token stay finite */
    POISON_COUNT
};
static const char *const poison_names[POISON_COUNT] = {"nan", "inf", "k-only", "v-only"};

/* Poisoned tokens of batch row 0 and row 1, per case. */
static const int64_t positions[][2] = {{10, 149}, {0, 63}, {64, 65}, {15, 16}, {17, 18}, {100, 127}, {149, 0}};

static int sees(const test_inputs *in, int64_t window, int64_t b, int64_t i, int64_t j)
{
    if (in->mask)
        return in->mask[(b * in->seq_len + i) * in->seq_len + j] > -1e30f;
    return j <= i && (window <= 0 || i - j < window);
}

/* Zeroes column FEATURE of a [rows, HIDDEN] projection, or sets it to OVERFLOW_WEIGHT. */
static void set_feature_column(const float *weight, int64_t rows, float value)
{
    float *w = (float *)weight; /* owned by the test (test_weights) */
    for (int64_t r = 0; r < rows; r++)
        w[r * HIDDEN + FEATURE] = value;
}

/* Weights for a poison kind: K-only / V-only route the huge input into one projection. */
static void route_feature(const sneppx_config *config, test_weights *weights, enum poison kind)
{
    if (kind != POISON_K_ONLY && kind != POISON_V_ONLY)
        return;
    const int64_t d = config->head_dim, q_rows = config->num_attention_heads * d;
    const int64_t kv_rows = config->num_key_value_heads * d;
    set_feature_column(weights->view.q_proj_weight, q_rows, 0.0f);
    set_feature_column(weights->view.k_proj_weight, kv_rows, kind == POISON_K_ONLY ? OVERFLOW_WEIGHT : 0.0f);
    set_feature_column(weights->view.v_proj_weight, kv_rows, kind == POISON_V_ONLY ? OVERFLOW_WEIGHT : 0.0f);
}

static float poison_value(enum poison kind)
{
    switch (kind) {
    case POISON_NAN: return NAN;
    case POISON_INF: return INFINITY;
    default: return HUGE_INPUT;
    }
}

static int run(sneppx_layer *layer, int flash, const test_inputs *in, float *out, const char *what)
{
    sneppx_status status = sneppx_layer_set_flash(layer, flash);
    if (status == SNEPPX_OK)
        status = sneppx_layer_forward(layer, in->batch, in->seq_len, in->hidden_states, in->mask,
                                      test_inputs_mask_shape(in), in->position_ids, out);
    return TEST_CHECK(&tally, status == SNEPPX_OK, "%s %s: %s", what, flash ? "flash" : "sdpa",
                      sneppx_last_error());
}

/* One poisoned forward: flash, SDPA and the reference on the rows that cannot see the poison. */
static void check_case(sneppx_layer *layer, const sneppx_config *config, const test_weights *weights,
                       test_inputs *in, enum poison kind, const int64_t poisoned[2], const char *what)
{
    const int64_t n = in->batch * in->seq_len * HIDDEN;
    float *flash = malloc((size_t)n * sizeof *flash), *sdpa = malloc((size_t)n * sizeof *sdpa);
    float *flash_rows = malloc((size_t)n * sizeof *flash_rows), *sdpa_rows = malloc((size_t)n * sizeof *sdpa_rows);
    double *want = malloc((size_t)n * sizeof *want), *want_rows = malloc((size_t)n * sizeof *want_rows);
    if (!TEST_CHECK(&tally, flash && sdpa && flash_rows && sdpa_rows && want && want_rows, "out of memory"))
        goto done;
    float saved[BATCH];
    for (int64_t b = 0; b < in->batch; b++) {
        float *x = in->hidden_states + (b * in->seq_len + poisoned[b]) * HIDDEN + FEATURE;
        saved[b] = *x;
        *x = poison_value(kind);
    }
    const char *problem = ref_mha_forward(config, &weights->view, in->batch, in->seq_len, in->hidden_states,
                                          in->mask, in->position_ids, want);
    const int ran = TEST_CHECK(&tally, problem == NULL, "%s: reference: %s", what, problem) &&
                    run(layer, 1, in, flash, what) && run(layer, 0, in, sdpa, what);
    for (int64_t b = 0; b < in->batch; b++)
        in->hidden_states[(b * in->seq_len + poisoned[b]) * HIDDEN + FEATURE] = saved[b];
    if (!ran)
        goto done;

    /* Gather the rows that cannot see their sequence's poisoned token. */
    int64_t kept = 0, rows = 0, seeing_finite = 0;
    for (int64_t b = 0; b < in->batch; b++)
        for (int64_t i = 0; i < in->seq_len; i++) {
            const int64_t at = (b * in->seq_len + i) * HIDDEN;
            /* The token's own row has a poisoned query (NaN / Inf kinds): no claim on it. */
            if (i == poisoned[b] && (kind == POISON_NAN || kind == POISON_INF))
                continue;
            if (sees(in, config->sliding_window, b, i, poisoned[b])) {
                /* A row that sees a NaN or infinite value (with a probability > 0) shows it. */
                if (kind == POISON_NAN || kind == POISON_V_ONLY) {
                    int flash_finite = 1, sdpa_finite = 1;
                    for (int64_t e = 0; e < HIDDEN; e++) {
                        flash_finite &= isfinite(flash[at + e]) != 0;
                        sdpa_finite &= isfinite(sdpa[at + e]) != 0;
                    }
                    seeing_finite += flash_finite + sdpa_finite;
                }
                continue;
            }
            memcpy(flash_rows + kept, flash + at, HIDDEN * sizeof(float));
            memcpy(sdpa_rows + kept, sdpa + at, HIDDEN * sizeof(float));
            memcpy(want_rows + kept, want + at, HIDDEN * sizeof(double));
            kept += HIDDEN;
            rows++;
        }
    TEST_CHECK(&tally, seeing_finite == 0, "%s: %lld rows (flash + sdpa) that see the poisoned token are finite",
               what, (long long)seeing_finite);
    if (kept == 0)
        goto done;
    const test_error vs_flash = test_compare(flash_rows, want_rows, kept);
    const test_error vs_sdpa = test_compare(sdpa_rows, want_rows, kept);
    const test_error pair = test_compare_float(flash_rows, sdpa_rows, kept);
    TEST_CHECK(&tally, test_error_within(&vs_flash, TEST_REF_MAX_NORMALIZED, TEST_REF_RMS_RELATIVE),
               "%s: flash vs reference on the %lld rows that cannot see the token: %lld non-finite, max %.2e rms %.2e",
               what, (long long)rows, (long long)vs_flash.non_finite, vs_flash.max_normalized,
               vs_flash.rms_relative);
    TEST_CHECK(&tally, test_error_within(&vs_sdpa, TEST_REF_MAX_NORMALIZED, TEST_REF_RMS_RELATIVE),
               "%s: sdpa vs reference on the %lld rows that cannot see the token: %lld non-finite, max %.2e rms %.2e",
               what, (long long)rows, (long long)vs_sdpa.non_finite, vs_sdpa.max_normalized, vs_sdpa.rms_relative);
    TEST_CHECK(&tally, test_error_within(&pair, TEST_PAIR_MAX_NORMALIZED, TEST_PAIR_RMS_RELATIVE),
               "%s: flash vs sdpa on the %lld rows that cannot see the token: max %.2e rms %.2e", what,
               (long long)rows, pair.max_normalized, pair.rms_relative);
done:
    free(flash);
    free(sdpa);
    free(flash_rows);
    free(sdpa_rows);
    free(want);
    free(want_rows);
}

static void check_config(const char *name, const sneppx_config *config, int mla)
{
    static const test_mask_mode modes[] = {TEST_MASK_CAUSAL, TEST_MASK_EXPLICIT, TEST_MASK_FULLY_MASKED_ROWS,
                                           TEST_MASK_LEFT_PADDING};
    const int failed_before = tally.failed;
    int cases = 0;
    for (int kind = 0; kind < POISON_COUNT; kind++) {
        /* MLA's latent is its keys and its values at once: no K-only / V-only. */
        if (mla && (kind == POISON_K_ONLY || kind == POISON_V_ONLY))
            continue;
        test_weights weights;
        if (!TEST_CHECK(&tally, test_weights_random(config, 0x5eed + (uint64_t)kind, &weights) == 0,
                        "%s: weights: out of memory", name))
            return;
        route_feature(config, &weights, (enum poison)kind);
        sneppx_layer *layer = NULL;
        if (!TEST_CHECK(&tally, sneppx_layer_create(config, &weights.view, &layer) == SNEPPX_OK, "%s: %s", name,
                        sneppx_last_error())) {
            test_weights_free(&weights);
            return;
        }
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            test_inputs in;
            if (!TEST_CHECK(&tally, test_inputs_make(modes[m], BATCH, SEQ_LEN, HIDDEN, config->sliding_window,
                                                     40 + m, &in) == 0, "inputs: out of memory"))
                continue;
            for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++, cases++) {
                char what[160];
                snprintf(what, sizeof what, "%s %s %s tokens %lld/%lld", name, test_mask_mode_name(modes[m]),
                         poison_names[kind], (long long)positions[p][0], (long long)positions[p][1]);
                check_case(layer, config, &weights, &in, (enum poison)kind, positions[p], what);
            }
            test_inputs_free(&in);
        }
        sneppx_layer_destroy(layer);
        test_weights_free(&weights);
    }
    printf("[%s] %d poisoned forwards, %s\n", name, cases, tally.failed == failed_before ? "ok" : "FAILED");
    fflush(stdout);
}

static sneppx_config gqa(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = HIDDEN;
    config.num_attention_heads = heads;
    config.num_key_value_heads = kv_heads;
    config.head_dim = head_dim;
    config.sliding_window = window;
    return config;
}

int main(void)
{
    sneppx_config config = gqa(8, 2, 32, 0);
    check_config("gqa g4 d32", &config, 0);
    config = gqa(2, 2, 64, 0);
    check_config("mha g1 d64", &config, 0);
    config = gqa(4, 2, 64, 13);
    check_config("window 13 g2 d64", &config, 0);

    sneppx_config_init(&config);
    config.hidden_size = HIDDEN;
    config.num_attention_heads = config.num_key_value_heads = 4;
    config.kv_lora_rank = 32;
    config.qk_nope_head_dim = 16;
    config.qk_rope_head_dim = 16;
    config.v_head_dim = 32;
    config.rope_interleaved = 1;
    config.qkv_bias = config.o_bias = 0;
    check_config("mla absorbed", &config, 1);
    config.mla_naive = 1;
    check_config("mla naive", &config, 1);
    return test_finish(&tally);
}
