/* The attention layer forward against the float64 reference (tests/support),
 * and flash against SDPA:
 *   - every preset: output shape (every element written, nothing past the end),
 *     numerics at short sequences with random weights up to 13B; the 70B+ presets
 *     (llama2/llama3/llama3.1-70B, llama3.1-405B, qwen2-72B, deepseek-v2-236B) use
 *     the layer's synthetic weights: flash vs SDPA and finiteness only;
 *   - GQA head-count ratios 1..8 (and 7, 3), with the group in the kernel key;
 *   - a sweep of small configs: head_dim {16,32,64,128} x group {1,2,4} x window
 *     {0, 13} x mask mode {causal, explicit, fully masked rows, left padding} x
 *     RoPE {default, linear, dynamic NTK, llama3, yarn, static NTK, partial,
 *     interleaved} x bias {off, q/k/v+o} x {flash, SDPA};
 *   - longer sequences across several K/V tiles; MLA (DeepSeek V2) small configs
 *     with and without q LoRA and YaRN, absorbed and naive forms;
 *   - the harness's own sensitivity: semantic bugs must exceed the thresholds.
 * Thresholds and their justification: tests/support/test_forward_case.h.
 * SNEPPX_TEST_FORCE_REFERENCE=1 runs the reference against itself. */
#include <stdio.h>
#include <string.h>

#include "mha_reference.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "test_forward_case.h"
#include "test_inputs.h"
#include "test_util.h"
#include "test_weights.h"

/* Above this many weight floats (~480 MB) a preset runs on synthetic weights. */
#define RANDOM_WEIGHTS_MAX_FLOATS ((int64_t)120 * 1000 * 1000)
#define SWEEP_HIDDEN 80   /* not a multiple of the GEMM panel width on purpose */
#define SWEEP_WINDOW 13

static test_tally tally;

enum rope_variant {
    ROPE_DEFAULT, ROPE_LINEAR, ROPE_DYNAMIC, ROPE_LLAMA3, ROPE_YARN, ROPE_STATIC_NTK, ROPE_PARTIAL,
    ROPE_INTERLEAVED, ROPE_VARIANT_COUNT
};
static const char *const rope_variant_names[ROPE_VARIANT_COUNT] = {
    "default", "linear", "dynamic", "llama3", "yarn", "static-ntk", "partial", "interleaved"};

/* A hand GQA config of sneppx_config_init's defaults with the given shape. */
static sneppx_config gqa_config(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window,
                                int bias)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = hidden;
    config.num_attention_heads = heads;
    config.num_key_value_heads = kv_heads;
    config.head_dim = head_dim;
    config.sliding_window = window;
    config.qkv_bias = config.o_bias = bias;
    return config;
}

/* Sets the RoPE variant on the layer's config and on the reference's own copy
 * (they differ only for static NTK, where each side does its own extension). */
static int set_rope_variant(enum rope_variant variant, sneppx_config *config, sneppx_config *reference)
{
    sneppx_rope_scaling *scaling = &config->rope_scaling;
    switch (variant) {
    case ROPE_DEFAULT: break;
    case ROPE_LINEAR: scaling->type = SNEPPX_ROPE_LINEAR; scaling->factor = 2.0; break;
    case ROPE_DYNAMIC: /* positions pass 40 in most cases: the base grows */
        scaling->type = SNEPPX_ROPE_DYNAMIC; scaling->factor = 2.0; config->max_position_embeddings = 40; break;
    case ROPE_LLAMA3: /* bands at wavelengths 16 and 64: all three occur for every head_dim */
        config->rope_theta = 500000.0; scaling->type = SNEPPX_ROPE_LLAMA3; scaling->factor = 8.0;
        scaling->low_freq_factor = 1.0; scaling->high_freq_factor = 4.0;
        scaling->original_max_position_embeddings = 64; break;
    case ROPE_YARN: /* no mscale pair: cos/sin factor 0.1 ln 4 + 1, not 1 */
        scaling->type = SNEPPX_ROPE_YARN; scaling->factor = 4.0; scaling->beta_fast = 32.0;
        scaling->beta_slow = 1.0; scaling->original_max_position_embeddings = 32; break;
    case ROPE_STATIC_NTK: config->max_position_embeddings = 64; break;
    case ROPE_PARTIAL: config->rotary_dim = config->head_dim / 2; break;
    case ROPE_INTERLEAVED: config->rope_interleaved = 1; break;
    case ROPE_VARIANT_COUNT: break;
    }
    *reference = *config;
    if (variant == ROPE_STATIC_NTK) {
        /* 64 -> 2048: the explicit-mask cases' positions (up to 1099) stay inside the
         * extended context, which the layer checks. */
        ref_extend_context(reference, 2048);
        return TEST_CHECK(&tally, sneppx_config_extend_context(config, 2048) == SNEPPX_OK, "extend_context: %s",
                          sneppx_last_error());
    }
    return 1;
}

/* Builds inputs and weights for one case and runs it. */
static void run_one(test_group *group, const sneppx_config *config, const sneppx_config *reference,
                    test_mask_mode mode, int64_t batch, int64_t seq_len, int synthetic, uint64_t seed,
                    const char *expect_key)
{
    test_inputs inputs;
    test_weights weights;
    if (!TEST_CHECK(&tally, test_inputs_make(mode, batch, seq_len, config->hidden_size, config->sliding_window,
                                             seed, &inputs) == 0, "inputs: out of memory"))
        return;
    if (!synthetic && !TEST_CHECK(&tally, test_weights_random(config, seed ^ 0xabcdef, &weights) == 0,
                                  "%s: random weights: out of memory", config->name)) {
        test_inputs_free(&inputs);
        return;
    }
    char label[64];
    snprintf(label, sizeof label, "%s", test_mask_mode_name(mode));
    const test_case test = {label, config, reference, synthetic ? NULL : &weights, &inputs, expect_key};
    test_run_case(&tally, group, &test);
    if (!synthetic)
        test_weights_free(&weights);
    test_inputs_free(&inputs);
}

static void test_presets(void)
{
    for (int p = 0; p < sneppx_preset_count(); p++) {
        const char *name = sneppx_preset_name(p);
        sneppx_config config;
        if (!TEST_CHECK(&tally, sneppx_config_from_name(name, NULL, &config) == SNEPPX_OK, "preset %s: %s", name,
                        sneppx_last_error()))
            continue;
        /* DeepSeek-V2 (236B) is just above the bound, but both MLA presets are wanted
         * against the reference: it runs with random weights at batch 1, seq 3. */
        const int big = test_weights_float_count(&config) > RANDOM_WEIGHTS_MAX_FLOATS;
        const int synthetic = big && config.kv_lora_rank == 0;
        if (config.kv_lora_rank > 0)
            TEST_CHECK(&tally, config.rope_interleaved == 1,
                       "preset %s: DeepSeek rotates (2i, 2i+1) pairs (docs/MODELS.md 3), rope_interleaved is %d", name,
                       config.rope_interleaved);
        char key[32] = "";
        if (config.kv_lora_rank == 0)
            snprintf(key, sizeof key, "-g%lld-", (long long)(config.num_attention_heads / config.num_key_value_heads));
        test_group group;
        test_group_begin(&group, "preset %s%s", name, synthetic ? " (synthetic weights: flash vs sdpa only)" : "");
        run_one(&group, &config, NULL, TEST_MASK_CAUSAL, big ? 1 : 2, synthetic ? 2 : (big ? 3 : 7), synthetic, 100 + p,
                key[0] ? key : NULL);
        if (!big)
            run_one(&group, &config, NULL, TEST_MASK_LEFT_PADDING, 2, 9, 0, 200 + p, NULL);
        test_group_end(&group);
    }
}

static void test_gqa_ratios(void)
{
    static const int64_t shapes[][2] = {{8, 8}, {8, 4}, {8, 2}, {8, 1}, {14, 2}, {12, 3}, {28, 4}};
    test_group group;
    test_group_begin(&group, "gqa ratios d64");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const sneppx_config config = gqa_config(128, shapes[s][0], shapes[s][1], 64, 0, 1);
        char key[32];
        snprintf(key, sizeof key, "-g%lld-", (long long)(shapes[s][0] / shapes[s][1]));
        run_one(&group, &config, NULL, TEST_MASK_CAUSAL, 2, 37, 0, 300 + s, key);
        run_one(&group, &config, NULL, TEST_MASK_EXPLICIT, 2, 37, 0, 400 + s, key);
    }
    test_group_end(&group);

    sneppx_layer *layer = NULL;
    sneppx_config bad = gqa_config(128, 8, 3, 64, 0, 1);
    sneppx_status status = sneppx_layer_create(&bad, NULL, &layer);
    TEST_CHECK(&tally, status == SNEPPX_ERR_INVALID_ARGUMENT && !layer,
               "8 heads / 3 kv heads must be rejected as invalid, got %s", sneppx_status_name(status));
    bad = gqa_config(96, 4, 4, 24, 0, 1);
    status = sneppx_layer_create(&bad, NULL, &layer);
    TEST_CHECK(&tally, status != SNEPPX_OK && !layer && strstr(sneppx_last_error(), "head_dim"),
               "head_dim 24 must be rejected with a message naming head_dim, got %s '%s'",
               sneppx_status_name(status), sneppx_last_error());
}

static void test_sweep(void)
{
    static const int64_t head_dims[] = {16, 32, 64, 128};
    static const int64_t groups[] = {1, 2, 4};
    static const int64_t seq_lens[] = {45, 100, 17, 1, 70};
    uint64_t case_index = 0;
    for (size_t d = 0; d < sizeof head_dims / sizeof head_dims[0]; d++) {
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
            test_group group;
            test_group_begin(&group, "sweep d%lld g%lld", (long long)head_dims[d], (long long)groups[g]);
            for (int64_t window = 0; window <= SWEEP_WINDOW; window += SWEEP_WINDOW) {
                for (int mode = 0; mode < TEST_MASK_MODE_COUNT; mode++) {
                    for (int rope = 0; rope < ROPE_VARIANT_COUNT; rope++) {
                        for (int bias = 0; bias <= 1; bias++, case_index++) {
                            sneppx_config config =
                                gqa_config(SWEEP_HIDDEN, 2 * groups[g], 2, head_dims[d], window, bias);
                            sneppx_config reference;
                            snprintf(config.name, sizeof config.name, "%s", rope_variant_names[rope]);
                            if (!set_rope_variant((enum rope_variant)rope, &config, &reference))
                                continue;
                            const int64_t seq_len = seq_lens[case_index % 5];
                            run_one(&group, &config, &reference, (test_mask_mode)mode, 2, seq_len, 0,
                                    1000 + case_index, NULL);
                        }
                    }
                }
            }
            test_group_end(&group);
        }
    }
}

/* Several query blocks and K/V tiles, windows that skip whole tiles. */
static void test_long_sequences(void)
{
    test_group group;
    test_group_begin(&group, "long d128 g4 s300");
    for (int64_t window = 0; window <= 100; window += 100) {
        sneppx_config config = gqa_config(128, 8, 2, 128, window, 0);
        config.rope_theta = 500000.0;
        char key[32];
        snprintf(key, sizeof key, "-w%lld-", (long long)window);
        run_one(&group, &config, NULL, TEST_MASK_CAUSAL, 1, 300, 0, 5000 + window, key);
        run_one(&group, &config, NULL, TEST_MASK_LEFT_PADDING, 2, 300, 0, 6000 + window, NULL);
    }
    test_group_end(&group);

    /* Flash transposes Q and O in tiles once they outgrow 56 KB of scratch
     * (d 256 x 64 rows at group 4; d 128 x 128 rows at group 8): query counts
     * that leave the last tile partly padded, across several K/V tiles. */
    test_group_begin(&group, "tiled transposes d256 g4, d128 g8");
    const sneppx_config wide = gqa_config(256, 4, 1, 256, 0, 1);
    run_one(&group, &wide, NULL, TEST_MASK_CAUSAL, 2, 77, 0, 7100, "attn_flash-d256-dv256-g4-");
    run_one(&group, &wide, NULL, TEST_MASK_EXPLICIT, 1, 77, 0, 7101, NULL);
    const sneppx_config grouped = gqa_config(256, 16, 2, 128, 13, 0);
    run_one(&group, &grouped, NULL, TEST_MASK_CAUSAL, 1, 71, 0, 7102, "attn_flash-d128-dv128-g8-w13-");
    run_one(&group, &grouped, NULL, TEST_MASK_LEFT_PADDING, 2, 37, 0, 7103, NULL);
    test_group_end(&group);
}

static sneppx_config mla_config(int64_t q_lora_rank, int yarn, int bias)
{
    sneppx_config config;
    sneppx_config_init(&config);
    snprintf(config.name, sizeof config.name, "mla");
    config.hidden_size = 64;
    config.num_attention_heads = config.num_key_value_heads = 4;
    config.q_lora_rank = q_lora_rank;
    config.kv_lora_rank = 32;
    config.qk_nope_head_dim = 16;
    config.qk_rope_head_dim = 16;
    config.v_head_dim = 32;
    config.rope_interleaved = 1; /* DeepSeek's layout (docs/MODELS.md section 3) */
    config.qkv_bias = config.o_bias = bias;
    if (yarn) {
        /* mscale != mscale_all_dim: a cos/sin factor != 1 and a softmax scale with mscale^2. */
        sneppx_rope_scaling *scaling = &config.rope_scaling;
        scaling->type = SNEPPX_ROPE_YARN;
        scaling->factor = 40.0;
        scaling->original_max_position_embeddings = 32;
        scaling->beta_fast = 32.0;
        scaling->beta_slow = 1.0;
        scaling->mscale = 1.0;
        scaling->mscale_all_dim = 0.707;
        config.max_position_embeddings = 1280;
    }
    return config;
}

static void test_mla(void)
{
    static const int64_t seq_lens[] = {5, 70};
    static const test_mask_mode modes[] = {TEST_MASK_CAUSAL, TEST_MASK_EXPLICIT, TEST_MASK_LEFT_PADDING};
    for (int naive = 0; naive <= 1; naive++) {
        test_group group;
        test_group_begin(&group, "mla %s", naive ? "naive" : "absorbed");
        uint64_t seed = 7000 + 100 * (uint64_t)naive;
        for (int variant = 0; variant < 3; variant++) {
            sneppx_config config = mla_config(variant == 0 ? 0 : 48, variant >= 1, variant == 2);
            config.mla_naive = naive;
            for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
                for (size_t s = 0; s < sizeof seq_lens / sizeof seq_lens[0]; s++)
                    run_one(&group, &config, NULL, modes[m], 2, seq_lens[s], 0, seed++, NULL);
        }
        test_group_end(&group);
    }
}

/* Reference against mutated references: a threshold that lets these through
 * could not catch the bug each one stands for. */
static void test_harness_sensitivity(void)
{
    const sneppx_config base = gqa_config(SWEEP_HIDDEN, 4, 2, 32, SWEEP_WINDOW, 1);
    test_inputs inputs, padded;
    test_weights weights;
    if (test_inputs_make(TEST_MASK_CAUSAL, 2, 45, SWEEP_HIDDEN, SWEEP_WINDOW, 77, &inputs) ||
        test_inputs_make(TEST_MASK_LEFT_PADDING, 2, 45, SWEEP_HIDDEN, SWEEP_WINDOW, 77, &padded) ||
        test_weights_random(&base, 78, &weights)) {
        TEST_CHECK(&tally, 0, "harness sensitivity: out of memory");
        return;
    }
    const int64_t n = 2 * 45 * SWEEP_HIDDEN;
    static double want[2 * 45 * SWEEP_HIDDEN], mutated[2 * 45 * SWEEP_HIDDEN];
    static float mutated_float[2 * 45 * SWEEP_HIDDEN];
    ref_mha_forward(&base, &weights.view, 2, 45, inputs.hidden_states, NULL, NULL, want);
    struct { const char *bug; sneppx_config config; const test_inputs *in; } mutations[6];
    for (int i = 0; i < 6; i++) {
        mutations[i].config = base;
        mutations[i].in = &inputs;
    }
    mutations[0].bug = "window of W+1 keys";
    mutations[0].config.sliding_window = SWEEP_WINDOW + 1;
    mutations[1].bug = "interleaved instead of rotate_half pairs";
    mutations[1].config.rope_interleaved = 1;
    mutations[2].bug = "half the dims rotated";
    mutations[2].config.rotary_dim = 16;
    mutations[3].bug = "q/k/v bias dropped";
    mutations[3].config.qkv_bias = 0;
    mutations[4].bug = "o bias dropped";
    mutations[4].config.o_bias = 0;
    mutations[5].bug = "theta 5e5 instead of 1e4";
    mutations[5].config.rope_theta = 500000.0;
    for (int i = 0; i < 6; i++) {
        ref_mha_forward(&mutations[i].config, &weights.view, 2, 45, mutations[i].in->hidden_states, NULL, NULL,
                        mutated);
        for (int64_t j = 0; j < n; j++)
            mutated_float[j] = (float)mutated[j];
        const test_error e = test_compare(mutated_float, want, n);
        printf("[harness sensitivity] %-42s max %.2e rms %.2e\n", mutations[i].bug, e.max_normalized, e.rms_relative);
        TEST_CHECK(&tally, e.max_normalized > 10 * TEST_REF_MAX_NORMALIZED && e.rms_relative > 10 * TEST_REF_RMS_RELATIVE,
                   "the harness cannot see a %s (max %.2e, rms %.2e)", mutations[i].bug, e.max_normalized,
                   e.rms_relative);
    }
    /* The padding mask matters: ignoring it is visible too. */
    ref_mha_forward(&base, &weights.view, 2, 45, padded.hidden_states, padded.mask, padded.position_ids, want);
    ref_mha_forward(&base, &weights.view, 2, 45, padded.hidden_states, NULL, NULL, mutated);
    for (int64_t j = 0; j < n; j++)
        mutated_float[j] = (float)mutated[j];
    const test_error e = test_compare(mutated_float, want, n);
    printf("[harness sensitivity] %-42s max %.2e rms %.2e\n", "left-padding mask ignored", e.max_normalized,
           e.rms_relative);
    TEST_CHECK(&tally, e.max_normalized > 10 * TEST_REF_MAX_NORMALIZED, "the harness cannot see an ignored mask");
    test_weights_free(&weights);
    test_inputs_free(&inputs);
    test_inputs_free(&padded);
}

/* ctest: 3 shards (tests/CMakeLists.txt): the parts below, dealt round-robin. */
int main(int argc, char **argv)
{
    if (test_force_reference())
        printf("SNEPPX_TEST_FORCE_REFERENCE: the reference stands in for the layer (harness check)\n");
    /* The presets (16 full-size layers) are most of the time: their shard's other part is the cheapest. */
    static const test_part parts[] = {test_presets, test_long_sequences, test_sweep,
                                      test_harness_sensitivity, test_gqa_ratios, test_mla};
    return test_run_parts(argc, argv, parts, (int)(sizeof parts / sizeof parts[0]), &tally);
}
