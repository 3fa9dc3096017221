/* Bad input to the public C API. Each case asserts the
 * status, that the message names the argument, that nothing was written to
 * the output (pre-filled with a sentinel), and at the end that the layer still
 * gives bitwise the output it gave before any bad call.
 *
 * Cases: NULL pointers; zero/negative sizes; sizes whose byte counts
 * overflow; masks of the wrong shape; position_ids negative or beyond
 * max_position_embeddings (accepted after extend_context); hand configs with
 * heads not divisible by kv heads, unsupported head_dim, rotary_dim > head_dim,
 * a negative window; weights missing or extra; unknown preset names; NaN/Inf
 * in the input (propagate within their sequence, no crash, no effect on other
 * sequences); SNEPPX_JIT=0 with a cold cache (child process: the switch and
 * the cache directory are read once per process); malformed safetensors paths
 * (directory, empty file, FIFO). Malformed safetensors headers and mis-shaped
 * checkpoint tensors are covered in test_safetensors*.c. */
#include "test_cache_common.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>

#include "sneppx/safetensors.h"
#include "sneppx/sneppx.h"

#define HIDDEN 64
#define MAX_POSITIONS 64
#define BATCH 2
#define SEQ 24
#define TOKENS (BATCH * SEQ)

static float out[TOKENS * HIDDEN];

/* The status is want and the message contains needle. */
#define EXPECT_ERROR(tally, call, want, needle)                                                              \
    do {                                                                                                      \
        sneppx_status got_ = (call);                                                                          \
        TEST_CHECK(tally, got_ == (want) && strstr(sneppx_last_error(), needle) != NULL,                     \
                   "%s -> %s '%s', want %s naming '%s'", #call, sneppx_status_name(got_), sneppx_last_error(), \
                   sneppx_status_name(want), needle);                                                        \
    } while (0)

/* A forward that must fail naming needle and leave out untouched. */
#define EXPECT_FORWARD_ERROR(tally, layer, batch, seq, hidden, mask, shape, positions, needle)                  \
    do {                                                                                                        \
        test_fill_sentinel(out, TOKENS * HIDDEN);                                                               \
        EXPECT_ERROR(tally, sneppx_layer_forward(layer, batch, seq, hidden, mask, shape, positions, out),       \
                     SNEPPX_ERR_INVALID_ARGUMENT, needle);                                                      \
        TEST_CHECK(tally, test_all_sentinel(out, TOKENS * HIDDEN), "%s: out was written", needle);             \
    } while (0)

/* GQA 4/2, head_dim 16, q/k/v/o bias: small enough to compile in a blink. */
static void small_config(sneppx_config *config)
{
    sneppx_config_init(config);
    config->hidden_size = HIDDEN;
    config->num_attention_heads = 4;
    config->num_key_value_heads = 2;
    config->head_dim = 16;
    config->max_position_embeddings = MAX_POSITIONS;
}

static void test_null_pointers(test_tally *tally, sneppx_layer *layer, const float *hidden)
{
    sneppx_config config;
    small_config(&config);
    sneppx_layer *made = (sneppx_layer *)&config; /* must become NULL on failure */
    EXPECT_ERROR(tally, sneppx_layer_create(NULL, NULL, &made), SNEPPX_ERR_INVALID_ARGUMENT, "config");
    TEST_CHECK(tally, made == NULL, "a failed create leaves *layer NULL");
    EXPECT_ERROR(tally, sneppx_layer_create(&config, NULL, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "layer");
    EXPECT_FORWARD_ERROR(tally, NULL, 1, SEQ, hidden, NULL, NULL, NULL, "layer");
    EXPECT_FORWARD_ERROR(tally, layer, 1, SEQ, NULL, NULL, NULL, NULL, "hidden_states");
    EXPECT_ERROR(tally, sneppx_layer_forward(layer, 1, SEQ, hidden, NULL, NULL, NULL, NULL),
                 SNEPPX_ERR_INVALID_ARGUMENT, "out");
    EXPECT_FORWARD_ERROR(tally, layer, 1, SEQ, hidden, hidden, NULL, NULL, "mask_shape");
    /* A shape without its mask: the mask pointer forgotten, not a causal forward. */
    const int64_t shape[4] = {1, 1, SEQ, SEQ};
    EXPECT_FORWARD_ERROR(tally, layer, 1, SEQ, hidden, NULL, shape, NULL, "mask_shape: given without attention_mask");
    EXPECT_ERROR(tally, sneppx_layer_warmup(NULL), SNEPPX_ERR_INVALID_ARGUMENT, "config");
    EXPECT_ERROR(tally, sneppx_layer_set_flash(NULL, 1), SNEPPX_ERR_INVALID_ARGUMENT, "layer");
    EXPECT_ERROR(tally, sneppx_layer_set_flash(layer, 2), SNEPPX_ERR_INVALID_ARGUMENT,
                 "use_flash_attn: 2 must be 0 or 1");
    EXPECT_ERROR(tally, sneppx_layer_set_flash(layer, -1), SNEPPX_ERR_INVALID_ARGUMENT,
                 "use_flash_attn: -1 must be 0 or 1");
    TEST_CHECK(tally, sneppx_layer_config(layer)->use_flash_attn == 1, "a refused set_flash changed the layer");
    sneppx_kernel_timing timing;
    EXPECT_ERROR(tally, sneppx_layer_kernel_timing(NULL, 0, &timing), SNEPPX_ERR_INVALID_ARGUMENT, "layer");
    EXPECT_ERROR(tally, sneppx_layer_kernel_timing(layer, 0, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "timing");
    EXPECT_ERROR(tally, sneppx_layer_kernel_timing(layer, -1, &timing), SNEPPX_ERR_INVALID_ARGUMENT, "index");
    EXPECT_ERROR(tally, sneppx_jit_stats_get(NULL), SNEPPX_ERR_INVALID_ARGUMENT, "stats");
    EXPECT_ERROR(tally, sneppx_kernel_last_timing(NULL), SNEPPX_ERR_INVALID_ARGUMENT, "timing");
    EXPECT_ERROR(tally, sneppx_config_from_name(NULL, "8B", &config), SNEPPX_ERR_INVALID_ARGUMENT, "family");
    EXPECT_ERROR(tally, sneppx_config_from_name("llama3", "8B", NULL), SNEPPX_ERR_INVALID_ARGUMENT, "config");
    EXPECT_ERROR(tally, sneppx_config_validate(NULL), SNEPPX_ERR_INVALID_ARGUMENT, "config");
    EXPECT_ERROR(tally, sneppx_config_extend_context(NULL, 128), SNEPPX_ERR_INVALID_ARGUMENT, "config");
    double inv_freq[8], factor;
    EXPECT_ERROR(tally, sneppx_config_rope_frequencies(&config, 0, NULL, 8, &factor), SNEPPX_ERR_INVALID_ARGUMENT,
                 "inv_freq");
    EXPECT_ERROR(tally, sneppx_config_rope_frequencies(&config, 0, inv_freq, 8, NULL), SNEPPX_ERR_INVALID_ARGUMENT,
                 "attention_factor");
    sneppx_safetensors *file;
    EXPECT_ERROR(tally, sneppx_safetensors_open(NULL, &file), SNEPPX_ERR_INVALID_ARGUMENT, "path");
    EXPECT_ERROR(tally, sneppx_safetensors_open("x.safetensors", NULL), SNEPPX_ERR_INVALID_ARGUMENT, "file");
    /* Queries and destructors take NULL quietly. */
    sneppx_layer_destroy(NULL);
    sneppx_safetensors_close(NULL);
    TEST_CHECK(tally, sneppx_layer_config(NULL) == NULL && strcmp(sneppx_layer_keys(NULL), "") == 0 &&
                          sneppx_layer_kernel_count(NULL) == 0 && sneppx_layer_flops(NULL, 1, 1) == 0.0,
               "NULL layer queries give empty answers");
}

static void test_sizes(test_tally *tally, sneppx_layer *layer, const float *hidden)
{
    EXPECT_FORWARD_ERROR(tally, layer, 0, SEQ, hidden, NULL, NULL, NULL, "batch");
    EXPECT_FORWARD_ERROR(tally, layer, -1, SEQ, hidden, NULL, NULL, NULL, "batch");
    EXPECT_FORWARD_ERROR(tally, layer, 1, 0, hidden, NULL, NULL, NULL, "seq_len");
    EXPECT_FORWARD_ERROR(tally, layer, 1, -7, hidden, NULL, NULL, NULL, "seq_len");
    EXPECT_FORWARD_ERROR(tally, layer, INT64_MAX, SEQ, hidden, NULL, NULL, NULL, "batch");
    EXPECT_FORWARD_ERROR(tally, layer, 1, INT64_MIN, hidden, NULL, NULL, NULL, "seq_len");
    /* Each fits, the product's bytes do not. */
    EXPECT_FORWARD_ERROR(tally, layer, (int64_t)1 << 24, (int64_t)1 << 24, hidden, NULL, NULL, NULL,
                         "batch * seq_len");

    /* Hand configs whose byte counts would overflow are refused by validation. */
    sneppx_config config;
    sneppx_layer *made = NULL;
    small_config(&config);
    config.hidden_size = INT64_MAX;
    EXPECT_ERROR(tally, sneppx_layer_create(&config, NULL, &made), SNEPPX_ERR_INVALID_ARGUMENT, "config.hidden_size");
    small_config(&config);
    config.num_attention_heads = (int64_t)1 << 40;
    EXPECT_ERROR(tally, sneppx_layer_create(&config, NULL, &made), SNEPPX_ERR_INVALID_ARGUMENT,
                 "config.num_attention_heads");
    small_config(&config);
    config.max_position_embeddings = INT64_MAX;
    EXPECT_ERROR(tally, sneppx_layer_create(&config, NULL, &made), SNEPPX_ERR_INVALID_ARGUMENT,
                 "config.max_position_embeddings");
    small_config(&config);
    config.num_threads = -1;
    EXPECT_ERROR(tally, sneppx_layer_create(&config, NULL, &made), SNEPPX_ERR_INVALID_ARGUMENT, "config.num_threads");
    TEST_CHECK(tally, made == NULL, "no layer from an oversized config");
    small_config(&config);
    /* Too large: the message gives the real bound (it used to say "must exceed 64"). */
    EXPECT_ERROR(tally, sneppx_config_extend_context(&config, INT64_MAX), SNEPPX_ERR_INVALID_ARGUMENT,
                 "new_max_positions: 9223372036854775807 is above the largest max_position_embeddings, "
                 "2^40 = 1099511627776");
    EXPECT_ERROR(tally, sneppx_config_extend_context(&config, (int64_t)1 << 62), SNEPPX_ERR_INVALID_ARGUMENT,
                 "2^40");
    EXPECT_ERROR(tally, sneppx_config_extend_context(&config, MAX_POSITIONS), SNEPPX_ERR_INVALID_ARGUMENT,
                 "new_max_positions: 64 must exceed max_position_embeddings 64");
    TEST_CHECK(tally, config.max_position_embeddings == MAX_POSITIONS && config.rope_theta == 10000.0,
               "a refused extend_context leaves the config as it was");
    /* A result that would not validate: NTK's exponent dim / (dim - 2) is infinite for a
     * rotary dim of 2, so theta would be. Refused, naming the cause; the config as it was. */
    config.rotary_dim = 2;
    const sneppx_config before_extend = config;
    EXPECT_ERROR(tally, sneppx_config_extend_context(&config, 2 * MAX_POSITIONS), SNEPPX_ERR_INVALID_ARGUMENT,
                 "new_max_positions: 128 makes the config invalid (config.rope_theta: inf");
    TEST_CHECK(tally, memcmp(&config, &before_extend, sizeof config) == 0,
               "an extend_context whose result is invalid changed the config");
    small_config(&config);
    double inv_freq[8], factor;
    EXPECT_ERROR(tally, sneppx_config_rope_frequencies(&config, 0, inv_freq, 7, &factor),
                 SNEPPX_ERR_INVALID_ARGUMENT, "inv_freq_len");
}

static void test_masks(test_tally *tally, sneppx_layer *layer, const float *hidden, const float *mask)
{
    const int64_t shapes[][4] = {
        {BATCH, 1, SEQ, SEQ + 1}, {BATCH, 1, SEQ - 1, SEQ}, {BATCH, 2, SEQ, SEQ}, {BATCH + 1, 1, SEQ, SEQ},
        {0, 1, SEQ, SEQ},         {-1, 1, SEQ, SEQ},        {BATCH, 1, -SEQ, -SEQ}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        EXPECT_FORWARD_ERROR(tally, layer, BATCH, SEQ, hidden, mask, shapes[i], NULL, "attention_mask");
    /* The message gives the accepted shapes, the batch-1 broadcast only when it differs. */
    EXPECT_FORWARD_ERROR(tally, layer, BATCH, SEQ, hidden, mask, shapes[0], NULL,
                         "attention_mask: shape [2, 1, 24, 25], expected [2, 1, 24, 24] (or [1, 1, 24, 24] for every "
                         "sequence)");
    const int64_t one[4] = {1, 1, 5, 5};
    test_fill_sentinel(out, TOKENS * HIDDEN);
    sneppx_status status = sneppx_layer_forward(layer, 1, 6, hidden, mask, one, NULL, out);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT &&
                          strcmp(sneppx_last_error(), "attention_mask: shape [1, 1, 5, 5], expected [1, 1, 6, 6]") == 0,
               "batch 1: %s '%s'", sneppx_status_name(status), sneppx_last_error());
}

static void test_positions(test_tally *tally, sneppx_layer *layer, const float *hidden)
{
    int64_t positions[TOKENS];
    for (int64_t i = 0; i < TOKENS; i++)
        positions[i] = i % SEQ;
    positions[SEQ + 3] = -1;
    EXPECT_FORWARD_ERROR(tally, layer, BATCH, SEQ, hidden, NULL, NULL, positions, "position_ids");
    positions[SEQ + 3] = INT64_MIN;
    EXPECT_FORWARD_ERROR(tally, layer, BATCH, SEQ, hidden, NULL, NULL, positions, "position_ids");
    positions[SEQ + 3] = MAX_POSITIONS; /* one past the last position */
    EXPECT_FORWARD_ERROR(tally, layer, BATCH, SEQ, hidden, NULL, NULL, positions, "position_ids");
    positions[SEQ + 3] = INT64_MAX;
    EXPECT_FORWARD_ERROR(tally, layer, BATCH, SEQ, hidden, NULL, NULL, positions, "position_ids");

    /* After extend_context the same positions are in range; the next power is not. */
    sneppx_config config;
    small_config(&config);
    TEST_CHECK(tally, sneppx_config_extend_context(&config, 2 * MAX_POSITIONS) == SNEPPX_OK, "extend_context: %s",
               sneppx_last_error());
    sneppx_layer *extended = NULL;
    if (!TEST_CHECK(tally, sneppx_layer_create(&config, NULL, &extended) == SNEPPX_OK, "extended layer: %s",
                    sneppx_last_error()))
        return;
    positions[SEQ + 3] = MAX_POSITIONS;
    positions[SEQ + 4] = 2 * MAX_POSITIONS - 1;
    test_fill_sentinel(out, TOKENS * HIDDEN);
    sneppx_status status = sneppx_layer_forward(extended, BATCH, SEQ, hidden, NULL, NULL, positions, out);
    int finite = 1;
    for (int64_t i = 0; i < TOKENS * HIDDEN; i++)
        finite &= isfinite(out[i]) != 0;
    TEST_CHECK(tally, status == SNEPPX_OK && finite, "positions %d and %d after extend_context(%d): %s, %s",
               MAX_POSITIONS, 2 * MAX_POSITIONS - 1, 2 * MAX_POSITIONS, sneppx_last_error(),
               finite ? "finite" : "non-finite output");
    positions[SEQ + 4] = 2 * MAX_POSITIONS;
    EXPECT_FORWARD_ERROR(tally, extended, BATCH, SEQ, hidden, NULL, NULL, positions, "position_ids");
    sneppx_layer_destroy(extended);
}

/* A hand config that validation must refuse: status, field, and no layer. */
static void expect_config_refused(test_tally *tally, const char *what, const sneppx_config *config,
                                  sneppx_status want, const char *field)
{
    sneppx_layer *made = (sneppx_layer *)config;
    sneppx_status got = sneppx_layer_create(config, NULL, &made);
    TEST_CHECK(tally, got == want && strstr(sneppx_last_error(), field) && made == NULL,
               "%s: %s '%s', want %s naming '%s'%s", what, sneppx_status_name(got), sneppx_last_error(),
               sneppx_status_name(want), field, made ? " (and a layer was made)" : "");
    got = sneppx_config_validate(config);
    TEST_CHECK(tally, got == want, "%s: validate says %s", what, sneppx_status_name(got));
}

static void test_hand_configs(test_tally *tally)
{
    sneppx_config config;
    small_config(&config);
    config.num_key_value_heads = 3;
    expect_config_refused(tally, "4 heads over 3 kv heads", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.num_key_value_heads");
    config.num_key_value_heads = 0;
    expect_config_refused(tally, "0 kv heads", &config, SNEPPX_ERR_INVALID_ARGUMENT, "config.num_key_value_heads");
    const int64_t head_dims[] = {72, 17, 512, 8};
    const sneppx_status head_dim_status[] = {SNEPPX_ERR_UNSUPPORTED, SNEPPX_ERR_UNSUPPORTED,
                                             SNEPPX_ERR_INVALID_ARGUMENT, SNEPPX_ERR_UNSUPPORTED};
    for (int i = 0; i < 4; i++) {
        char what[64];
        small_config(&config);
        config.head_dim = head_dims[i];
        snprintf(what, sizeof what, "head_dim %lld", (long long)head_dims[i]);
        expect_config_refused(tally, what, &config, head_dim_status[i], "config.head_dim");
    }
    small_config(&config);
    config.head_dim = 0;
    config.hidden_size = 66; /* 66 / 4 heads is not whole */
    expect_config_refused(tally, "hidden 66 over 4 heads", &config, SNEPPX_ERR_INVALID_ARGUMENT, "config.head_dim");
    small_config(&config);
    config.rotary_dim = 32;
    expect_config_refused(tally, "rotary_dim 32 > head_dim 16", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rotary_dim");
    config.rotary_dim = 7;
    expect_config_refused(tally, "odd rotary_dim", &config, SNEPPX_ERR_INVALID_ARGUMENT, "config.rotary_dim");
    small_config(&config);
    config.sliding_window = -1;
    expect_config_refused(tally, "sliding_window -1", &config, SNEPPX_ERR_INVALID_ARGUMENT, "config.sliding_window");
    small_config(&config);
    config.rope_theta = NAN;
    expect_config_refused(tally, "rope_theta NaN", &config, SNEPPX_ERR_INVALID_ARGUMENT, "config.rope_theta");
    small_config(&config);
    config.rope_scaling.type = SNEPPX_ROPE_LINEAR;
    config.rope_scaling.factor = INFINITY;
    expect_config_refused(tally, "rope factor inf", &config, SNEPPX_ERR_INVALID_ARGUMENT, "config.rope_scaling.factor");
    /* Dynamic NTK's power d / (d - 2) over 2 rotated dims (transformers divides by zero). */
    small_config(&config);
    config.rope_scaling.type = SNEPPX_ROPE_DYNAMIC;
    config.rope_scaling.factor = 2.0;
    config.rotary_dim = 4;
    TEST_CHECK(tally, sneppx_config_validate(&config) == SNEPPX_OK, "dynamic over 4 dims refused: %s",
               sneppx_last_error());
    config.rotary_dim = 2;
    expect_config_refused(tally, "dynamic over 2 rotated dims", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rope_scaling.type: dynamic scales the base by a power d / (d - 2)");
    /* A type no sneppx_rope_type names, below or above the enum. */
    static const int bad_types[] = {-1, SNEPPX_ROPE_TYPE_COUNT, 99};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        small_config(&config);
        config.rope_scaling.type = (sneppx_rope_type)bad_types[i];
        char needle[64];
        snprintf(needle, sizeof needle, "config.rope_scaling.type: %d is not a sneppx_rope_type", bad_types[i]);
        expect_config_refused(tally, "rope_scaling.type out of the enum", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                              needle);
    }
    /* YaRN's parameters each finite, named when one is not. */
    small_config(&config);
    config.rope_scaling.type = SNEPPX_ROPE_YARN;
    config.rope_scaling.factor = 4.0;
    config.rope_scaling.beta_fast = NAN;
    config.rope_scaling.beta_slow = 1.0;
    expect_config_refused(tally, "yarn beta_fast NaN", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rope_scaling.beta_fast: nan is not finite");
    config.rope_scaling.beta_fast = 32.0;
    config.rope_scaling.mscale = -INFINITY;
    expect_config_refused(tally, "yarn mscale -inf", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rope_scaling.mscale: -inf is not finite");
    /* 0 means YaRN's default (betas) or the derived factor; below 0 is refused, not read as 0
     * (transformers fails on a negative beta, and scales cos/sin by a negative factor). */
    config.rope_scaling.mscale = 0.0;
    config.rope_scaling.beta_fast = -5.0;
    expect_config_refused(tally, "yarn beta_fast -5", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rope_scaling.beta_fast: -5 must be >= 0 (0: YaRN's 32)");
    config.rope_scaling.beta_fast = 0.0;
    config.rope_scaling.beta_slow = -1.0;
    expect_config_refused(tally, "yarn beta_slow -1", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rope_scaling.beta_slow: -1 must be >= 0 (0: YaRN's 1)");
    config.rope_scaling.beta_slow = 0.0;
    config.rope_scaling.attention_factor = -2.0;
    expect_config_refused(tally, "yarn attention_factor -2", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rope_scaling.attention_factor: -2 must be >= 0 (0: derived from factor and mscale)");
    config.rope_scaling.attention_factor = 0.0;
    TEST_CHECK(tally, sneppx_config_validate(&config) == SNEPPX_OK, "yarn with every 0 refused: %s",
               sneppx_last_error());
    /* Flags are 0 or 1; mla_naive only on an MLA config. */
    small_config(&config);
    config.use_flash_attn = 7;
    expect_config_refused(tally, "use_flash_attn 7", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.use_flash_attn: 7 must be 0 or 1");
    small_config(&config);
    config.qkv_bias = -3;
    expect_config_refused(tally, "qkv_bias -3", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.qkv_bias: -3 must be 0 or 1");
    small_config(&config);
    config.o_bias = 2;
    expect_config_refused(tally, "o_bias 2", &config, SNEPPX_ERR_INVALID_ARGUMENT, "config.o_bias: 2 must be 0 or 1");
    small_config(&config);
    config.rope_interleaved = 5;
    expect_config_refused(tally, "rope_interleaved 5", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rope_interleaved: 5 must be 0 or 1");
    small_config(&config);
    config.mla_naive = 2;
    expect_config_refused(tally, "mla_naive 2", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.mla_naive: 2 must be 0 or 1");
    small_config(&config);
    config.mla_naive = 1;
    expect_config_refused(tally, "mla_naive on a non-MLA config", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.mla_naive: applies to MLA configs (kv_lora_rank > 0) only");
    /* MLA rotates qk_rope_head_dim dims: a rotary_dim beside it was dropped without a word. */
    small_config(&config);
    config.kv_lora_rank = 32, config.qk_nope_head_dim = 16, config.qk_rope_head_dim = 16, config.v_head_dim = 16;
    config.rope_interleaved = 1;
    TEST_CHECK(tally, sneppx_config_validate(&config) == SNEPPX_OK, "MLA config refused: %s", sneppx_last_error());
    config.rotary_dim = 16; /* the dims it rotates, as the presets say */
    TEST_CHECK(tally, sneppx_config_validate(&config) == SNEPPX_OK, "MLA rotary_dim 16 refused: %s",
               sneppx_last_error());
    config.rotary_dim = 8;
    expect_config_refused(tally, "rotary_dim on an MLA config", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.rotary_dim: 8, but MLA rotates the qk_rope_head_dim (16) dims of each head");
}

/* The name reaches logs and generated code: only A-Z a-z 0-9 . _ -, NUL-terminated
 * in its field. A "*" "/" and a newline would end a comment and start a line of C. */
static void test_config_names(test_tally *tally)
{
    sneppx_config config;
    small_config(&config);
    snprintf(config.name, sizeof config.name, "x*/\nint injected;\n/*");
    expect_config_refused(tally, "a name that closes a comment", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.name: byte 1 (0x2a) is not one of A-Z a-z 0-9 . _ -");
    snprintf(config.name, sizeof config.name, "model \xc3\xa9");
    expect_config_refused(tally, "a name with a space", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.name: byte 5 (0x20)");
    memset(config.name, 'a', sizeof config.name); /* no NUL: reading it would run past the field */
    expect_config_refused(tally, "a name without its NUL", &config, SNEPPX_ERR_INVALID_ARGUMENT,
                          "config.name: not NUL-terminated within its 64 bytes");
    const char *const fine[] = {"", "custom", "Meta-Llama-3.1-8B_instruct", "deepseek_v2"};
    for (int i = 0; i < 4; i++) {
        snprintf(config.name, sizeof config.name, "%s", fine[i]);
        TEST_CHECK(tally, sneppx_config_validate(&config) == SNEPPX_OK, "name '%s': %s", fine[i],
                   sneppx_last_error());
    }
    memset(config.name, 'z', sizeof config.name - 1);
    config.name[sizeof config.name - 1] = '\0';
    TEST_CHECK(tally, sneppx_config_validate(&config) == SNEPPX_OK, "a 63-byte name: %s", sneppx_last_error());
    for (int p = 0; p < sneppx_preset_count(); p++) {
        TEST_CHECK(tally, sneppx_config_from_name(sneppx_preset_name(p), NULL, &config) == SNEPPX_OK &&
                              sneppx_config_validate(&config) == SNEPPX_OK,
                   "preset %s: %s", sneppx_preset_name(p), sneppx_last_error());
    }
}

static void test_weights(test_tally *tally)
{
    sneppx_config config;
    small_config(&config);
    /* Every pointer set to one buffer large enough for any tensor of this config. */
    static float buffer[4 * HIDDEN * HIDDEN];
    sneppx_weights weights = {.q_proj_weight = buffer, .q_proj_bias = buffer, .k_proj_weight = buffer,
                              .k_proj_bias = buffer, .v_proj_weight = buffer, .v_proj_bias = buffer,
                              .o_proj_weight = buffer, .o_proj_bias = buffer};
    sneppx_layer *made = NULL;
    weights.k_proj_weight = NULL;
    EXPECT_ERROR(tally, sneppx_layer_create(&config, &weights, &made), SNEPPX_ERR_INVALID_ARGUMENT,
                 "weights.k_proj_weight");
    /* Refused before any kernel is resolved: a shape no layer of this process had
     * (its kernels compile only once the weights are right). */
    sneppx_config unresolved = config;
    unresolved.hidden_size = 48;
    unresolved.num_key_value_heads = 1;
    sneppx_jit_stats before, after;
    sneppx_jit_stats_get(&before);
    EXPECT_ERROR(tally, sneppx_layer_create(&unresolved, &weights, &made), SNEPPX_ERR_INVALID_ARGUMENT,
                 "weights.k_proj_weight: NULL, but this config needs k_proj.weight [16 x 48]");
    sneppx_jit_stats_get(&after);
    TEST_CHECK(tally, after.compiles == before.compiles && after.disk_hits == before.disk_hits &&
                          after.memory_hits == before.memory_hits,
               "a create with a missing tensor resolved kernels first: %llu compiles, %llu disk hits, %llu memory "
               "hits", (unsigned long long)(after.compiles - before.compiles),
               (unsigned long long)(after.disk_hits - before.disk_hits),
               (unsigned long long)(after.memory_hits - before.memory_hits));
    weights.k_proj_weight = buffer;
    weights.o_proj_bias = NULL;
    EXPECT_ERROR(tally, sneppx_layer_create(&config, &weights, &made), SNEPPX_ERR_INVALID_ARGUMENT,
                 "weights.o_proj_bias");
    weights.o_proj_bias = buffer;
    weights.kv_b_proj_weight = buffer; /* an MLA tensor given to a GQA layer */
    EXPECT_ERROR(tally, sneppx_layer_create(&config, &weights, &made), SNEPPX_ERR_INVALID_ARGUMENT,
                 "weights.kv_b_proj_weight");
    weights.kv_b_proj_weight = NULL;
    config.qkv_bias = 0; /* biases given to a layer without them */
    EXPECT_ERROR(tally, sneppx_layer_create(&config, &weights, &made), SNEPPX_ERR_INVALID_ARGUMENT,
                 "weights.q_proj_bias");
    TEST_CHECK(tally, made == NULL, "no layer from bad weights");
}

static void test_preset_names(test_tally *tally)
{
    sneppx_config config;
    const char *families[] = {"llama5", "", "llama3-8B-extra", "%s%n%s"};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        EXPECT_ERROR(tally, sneppx_config_from_name(families[i], NULL, &config), SNEPPX_ERR_UNKNOWN_PRESET, "name");
        int lists_all = 1;
        for (int p = 0; p < sneppx_preset_count(); p++)
            lists_all &= strstr(sneppx_last_error(), sneppx_preset_name(p)) != NULL;
        TEST_CHECK(tally, lists_all, "'%s': the message lists every valid name: %s", families[i],
                   sneppx_last_error());
    }
    EXPECT_ERROR(tally, sneppx_config_from_name("llama3", "9B", &config), SNEPPX_ERR_UNKNOWN_PRESET, "llama3-9B");
    /* A name longer than any message: refused, not overflowed. */
    static char long_name[8192];
    memset(long_name, 'x', sizeof long_name - 1);
    EXPECT_ERROR(tally, sneppx_config_from_name(long_name, long_name, &config), SNEPPX_ERR_UNKNOWN_PRESET, "name");
    /* Its echo is bounded (64 bytes and "..."), so every valid name still fits. */
    char echoed[80];
    snprintf(echoed, sizeof echoed, "'%.64s...'", long_name);
    for (int sized = 0; sized < 2; sized++) {
        EXPECT_ERROR(tally, sneppx_config_from_name(long_name, sized ? "8B" : NULL, &config),
                     SNEPPX_ERR_UNKNOWN_PRESET, echoed);
        int lists_all = strlen(sneppx_last_error()) < 1000;
        for (int p = 0; p < sneppx_preset_count(); p++)
            lists_all &= strstr(sneppx_last_error(), sneppx_preset_name(p)) != NULL;
        TEST_CHECK(tally, lists_all, "a %zu-byte name: the message stays short and lists every valid name: %s",
                   strlen(long_name), sneppx_last_error());
    }
    /* Cut on a whole UTF-8 character: 63 ASCII bytes, then a 2-byte 'é' straddling byte 64. */
    char accented[128];
    memset(accented, 'y', 63);
    snprintf(accented + 63, sizeof accented - 63, "\xc3\xa9tail-of-the-name");
    EXPECT_ERROR(tally, sneppx_config_from_name(accented, NULL, &config), SNEPPX_ERR_UNKNOWN_PRESET, "name");
    TEST_CHECK(tally, strstr(sneppx_last_error(), "\xc3") == NULL && strstr(sneppx_last_error(), "y...'"),
               "a name cut inside a UTF-8 character drops the partial character: %s", sneppx_last_error());
    /* A name that fits is echoed whole. */
    EXPECT_ERROR(tally, sneppx_config_from_name("llama3", "9B", &config), SNEPPX_ERR_UNKNOWN_PRESET, "'llama3-9B';");
    /* Each control character shows as '?': a name must not start a line of its own
     * or send a terminal escape sequence inside a message. */
    EXPECT_ERROR(tally, sneppx_config_from_name("a\033[31mb\nc", "\t8B", &config), SNEPPX_ERR_UNKNOWN_PRESET,
                 "'a?[31mb?c-?8B';");
    TEST_CHECK(tally, sneppx_preset_name(-1) == NULL && sneppx_preset_name(sneppx_preset_count()) == NULL,
               "preset names out of range are NULL");
}

/* NaN or Inf in one token of sequence 1 poisons that sequence's outputs (HF
 * does the same: p * v with p = 0 is NaN) and nothing else. */
static void test_non_finite(test_tally *tally, sneppx_layer *layer, const float *hidden, const float *clean)
{
    static float poisoned[TOKENS * HIDDEN];
    const float bad_values[] = {NAN, INFINITY, -INFINITY};
    for (int v = 0; v < 3; v++) {
        memcpy(poisoned, hidden, sizeof poisoned);
        poisoned[(SEQ + 5) * HIDDEN + 7] = bad_values[v];
        test_fill_sentinel(out, TOKENS * HIDDEN);
        sneppx_status status = sneppx_layer_forward(layer, BATCH, SEQ, poisoned, NULL, NULL, NULL, out);
        int64_t non_finite_rows = 0;
        for (int64_t row = SEQ; row < TOKENS; row++) {
            int bad = 0;
            for (int64_t i = 0; i < HIDDEN; i++)
                bad |= !isfinite(out[row * HIDDEN + i]);
            non_finite_rows += bad;
        }
        int first_sequence_same = memcmp(out, clean, sizeof(float) * SEQ * HIDDEN) == 0;
        TEST_CHECK(tally, status == SNEPPX_OK && first_sequence_same && non_finite_rows >= SEQ - 5,
                   "%g at token 5 of sequence 1: %s; sequence 0 %s; %lld of %d rows of sequence 1 non-finite "
                   "(want >= %d: every row that sees token 5)", bad_values[v], sneppx_status_name(status),
                   first_sequence_same ? "bitwise unchanged" : "CHANGED", (long long)non_finite_rows, SEQ, SEQ - 5);
    }
}

/* ---- SNEPPX_JIT=0 (child processes) ------------------------------------------ */

/* Child: creates the small layer; prints the outcome; exit 0 if it matches argv's expectation. */
static int child_create(int expect_ok)
{
    sneppx_config config;
    small_config(&config);
    sneppx_layer *layer = NULL;
    sneppx_status status = sneppx_layer_create(&config, NULL, &layer);
    char message[1024];
    snprintf(message, sizeof message, "%s", sneppx_last_error()); /* the next call clears it */
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    printf("status %s compiles %llu message: %s\n", sneppx_status_name(status), (unsigned long long)stats.compiles,
           message);
    sneppx_layer_destroy(layer);
    if (expect_ok)
        return status == SNEPPX_OK && stats.compiles == 0 ? 0 : 1;
    return status == SNEPPX_ERR_JIT && layer == NULL && stats.compiles == 0 ? 0 : 1;
}

static void test_jit_forbidden(test_tally *tally, const char *warm_dir, const char *first_key)
{
    char cold_dir[CACHE_TEST_DIR_MAX], cold_env[CACHE_TEST_ENV_MAX], warm_env[CACHE_TEST_ENV_MAX];
    if (cache_test_make_dir(cold_dir, sizeof cold_dir, "cold") != 0) {
        TEST_CHECK(tally, 0, "cannot make a cold cache directory: %s", strerror(errno));
        return;
    }
    snprintf(cold_env, sizeof cold_env, "SNEPPX_CACHE_DIR=%s", cold_dir);
    snprintf(warm_env, sizeof warm_env, "SNEPPX_CACHE_DIR=%s", warm_dir);
    const char *cold[] = {"SNEPPX_JIT=0", cold_env, NULL}, *warm[] = {"SNEPPX_JIT=0", warm_env, NULL};
    char *text = NULL;
    int code = cache_test_run_child("jit-forbidden-cold", cold, &text);
    TEST_CHECK(tally, code == 0 && text && strstr(text, "SNEPPX_JIT=0") && strstr(text, first_key),
               "SNEPPX_JIT=0, cold cache: exit %d, want SNEPPX_ERR_JIT naming '%s', got: %s", code, first_key,
               text ? text : "(no output)");
    free(text);
    code = cache_test_run_child("jit-forbidden-warm", warm, &text);
    TEST_CHECK(tally, code == 0, "SNEPPX_JIT=0, warm cache: exit %d (want a layer, 0 compiles): %s", code,
               text ? text : "(no output)");
    free(text);
    cache_test_remove_tree(cold_dir);
}

/* ---- safetensors paths that are not files ------------------------------------- */

/* Child: opening a FIFO must fail, not wait for a writer; the alarm turns a hang into a failure. */
static int child_open_fifo(const char *path)
{
    alarm(5);
    sneppx_safetensors *file = NULL;
    sneppx_status status = sneppx_safetensors_open(path, &file);
    printf("%s: %s\n", sneppx_status_name(status), sneppx_last_error());
    sneppx_safetensors_close(file);
    return status == SNEPPX_ERR_IO && file == NULL && strstr(sneppx_last_error(), path) ? 0 : 1;
}

static void test_safetensors_paths(test_tally *tally, const char *dir)
{
    char path[CACHE_TEST_PATH_MAX], env[CACHE_TEST_ENV_MAX];
    sneppx_safetensors *file = NULL;
    EXPECT_ERROR(tally, sneppx_safetensors_open(dir, &file), SNEPPX_ERR_IO, dir);
    /* An empty path is named as such, not as a file "" that cannot be opened. */
    sneppx_config config;
    small_config(&config);
    sneppx_attn_weights *weights = NULL;
    sneppx_layer *layer = NULL;
    EXPECT_ERROR(tally, sneppx_safetensors_open("", &file), SNEPPX_ERR_INVALID_ARGUMENT, "path is empty");
    EXPECT_ERROR(tally, sneppx_attn_weights_load("", 0, &config, &weights), SNEPPX_ERR_INVALID_ARGUMENT,
                 "sneppx_attn_weights_load: path is empty");
    EXPECT_ERROR(tally, sneppx_layer_create_from_safetensors(&config, "", 0, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                 "sneppx_layer_create_from_safetensors: path is empty");
    EXPECT_ERROR(tally, sneppx_config_from_json_file("", &config), SNEPPX_ERR_INVALID_ARGUMENT, "path: empty");
    TEST_CHECK(tally, weights == NULL && layer == NULL, "no weights or layer from an empty path");
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    EXPECT_ERROR(tally, sneppx_safetensors_open(path, &file), SNEPPX_ERR_IO, "missing.safetensors");
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    FILE *stream = fopen(path, "wb");
    if (stream)
        fclose(stream);
    EXPECT_ERROR(tally, sneppx_safetensors_open(path, &file), SNEPPX_ERR_FORMAT, "empty.safetensors");
    /* A header with a NUL byte inside its JSON. */
    snprintf(path, sizeof path, "%s/nul.safetensors", dir);
    static const unsigned char nul_header[] = {12, 0, 0, 0, 0, 0, 0, 0, '{', '"', 'a', 0, '"', ':', '{', '}', '}',
                                               ' ', ' ', ' '};
    stream = fopen(path, "wb");
    if (stream) {
        fwrite(nul_header, 1, sizeof nul_header, stream);
        fclose(stream);
    }
    EXPECT_ERROR(tally, sneppx_safetensors_open(path, &file), SNEPPX_ERR_FORMAT, "nul.safetensors");
    TEST_CHECK(tally, file == NULL, "no file handle from bad paths");

    snprintf(path, sizeof path, "%s/fifo.safetensors", dir);
    snprintf(env, sizeof env, "SNEPPX_TEST_FIFO=%s", path);
    const char *changes[] = {env, NULL};
    char *text = NULL;
    int code = mkfifo(path, 0600) == 0 ? cache_test_run_child("open-fifo", changes, &text) : -2;
    TEST_CHECK(tally, code == 0, "sneppx_safetensors_open on a FIFO: exit %d (-1: it blocked until killed "
               "after 5 s; it must open with O_NONBLOCK and refuse a non-regular file): %s", code,
               text ? text : "(no output)");
    free(text);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "jit-forbidden-cold") == 0)
        return child_create(0);
    if (argc > 1 && strcmp(argv[1], "jit-forbidden-warm") == 0)
        return child_create(1);
    if (argc > 1 && strcmp(argv[1], "open-fifo") == 0)
        return child_open_fifo(getenv("SNEPPX_TEST_FIFO"));

    test_tally tally = {0};
    /* A private cache: the warm-cache child needs exactly this process's entries. */
    char dir[CACHE_TEST_DIR_MAX];
    if (cache_test_make_dir(dir, sizeof dir, "bad-input") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    sneppx_config config;
    small_config(&config);
    sneppx_layer *layer = NULL;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        printf("FAIL: the small layer: %s\n", sneppx_last_error());
        return 1;
    }
    char first_key[SNEPPX_CACHE_KEY_MAX] = "";
    sscanf(sneppx_layer_keys(layer), "%159s", first_key);

    static float hidden[TOKENS * HIDDEN], mask[BATCH * SEQ * SEQ], clean[TOKENS * HIDDEN], again[TOKENS * HIDDEN];
    test_rng rng = test_rng_seeded(11);
    test_fill_uniform(&rng, hidden, TOKENS * HIDDEN, 1.0f);
    for (int64_t i = 0; i < BATCH * SEQ * SEQ; i++)
        mask[i] = (i % SEQ) <= (i / SEQ % SEQ) ? 0.0f : -INFINITY;
    sneppx_status status = sneppx_layer_forward(layer, BATCH, SEQ, hidden, NULL, NULL, NULL, clean);
    TEST_CHECK(&tally, status == SNEPPX_OK, "clean forward: %s", sneppx_last_error());

    test_null_pointers(&tally, layer, hidden);
    test_sizes(&tally, layer, hidden);
    test_masks(&tally, layer, hidden, mask);
    test_positions(&tally, layer, hidden);
    test_hand_configs(&tally);
    test_config_names(&tally);
    test_weights(&tally);
    test_preset_names(&tally);
    test_non_finite(&tally, layer, hidden, clean);

    /* After every refusal above the layer computes exactly what it did before. */
    status = sneppx_layer_forward(layer, BATCH, SEQ, hidden, NULL, NULL, NULL, again);
    TEST_CHECK(&tally, status == SNEPPX_OK && memcmp(clean, again, sizeof clean) == 0,
               "the layer after the bad calls: %s, output %s", sneppx_status_name(status),
               memcmp(clean, again, sizeof clean) == 0 ? "bitwise unchanged" : "CHANGED");
    sneppx_layer_destroy(layer);

    test_jit_forbidden(&tally, dir, first_key);
    test_safetensors_paths(&tally, dir);
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
