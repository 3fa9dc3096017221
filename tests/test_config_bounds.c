/* Every bound of a config (sneppx/limits.h, rendered from one table) at its
 * edge: the largest legal value builds a layer whose flash and SDPA forwards
 * agree with the float64 reference (and, under ASan, touch no byte outside
 * their buffers), and the next value is refused by sneppx_layer_create with
 * the field named, before any kernel is compiled.
 *
 * The shapes around each bound are the smallest the config allows, so that
 * the bound itself decides the kernels' sizes (an MLA latent of 2048 with
 * rope 256 makes attention keys of head_dim 2304, the registry's largest). */
#include <stdio.h>
#include <string.h>

#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "sneppx/limits.h"
#include "test_forward_case.h"
#include "test_util.h"

static test_tally tally;

static sneppx_config standard(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim)
{
    sneppx_config config;
    sneppx_config_init(&config);
    snprintf(config.name, sizeof config.name, "bounds");
    config.hidden_size = hidden;
    config.num_attention_heads = heads;
    config.num_key_value_heads = kv_heads;
    config.head_dim = head_dim;
    return config;
}

static sneppx_config mla(int64_t heads, int64_t kv_lora_rank, int64_t nope, int64_t rope, int64_t v)
{
    sneppx_config config = standard(64, heads, heads, 0);
    config.kv_lora_rank = kv_lora_rank;
    config.qk_nope_head_dim = nope;
    config.qk_rope_head_dim = rope;
    config.v_head_dim = v;
    config.rope_interleaved = 1;
    return config;
}

/* The largest legal value: flash and SDPA against the reference. */
static void runs(test_group *group, const char *what, const sneppx_config *config, int64_t seq_len,
                 test_mask_mode mode, uint64_t seed)
{
    test_inputs inputs;
    test_weights weights;
    if (!TEST_CHECK(&tally, test_inputs_make(mode, 1, seq_len, config->hidden_size, config->sliding_window, seed,
                                             &inputs) == 0, "%s: inputs: out of memory", what))
        return;
    if (TEST_CHECK(&tally, test_weights_random(config, seed ^ 0x5a5a, &weights) == 0, "%s: weights: out of memory",
                   what)) {
        const test_case test = {what, config, NULL, &weights, &inputs, NULL};
        test_run_case(&tally, group, &test);
        test_weights_free(&weights);
    }
    test_inputs_free(&inputs);
}

/* One past the bound: refused at create, naming the field, before any compile. */
static void refused(const char *what, const sneppx_config *config, const char *field)
{
    sneppx_jit_stats before, after;
    sneppx_jit_stats_get(&before);
    sneppx_layer *layer = (sneppx_layer *)1;
    sneppx_status status = sneppx_layer_create(config, NULL, &layer);
    char message[512];
    snprintf(message, sizeof message, "%s", sneppx_last_error());
    sneppx_jit_stats_get(&after);
    TEST_CHECK(&tally, status != SNEPPX_OK && layer == NULL && strstr(message, field) != NULL,
               "%s: create gave %s, layer %p, '%s' (want an error naming %s)", what, sneppx_status_name(status),
               (void *)layer, message, field);
    TEST_CHECK(&tally, after.compiles == before.compiles && after.disk_hits == before.disk_hits,
               "%s: %llu kernels were resolved before the refusal", what,
               (unsigned long long)(after.compiles + after.disk_hits - before.compiles - before.disk_hits));
    printf("[refused] %-44s %s\n", what, message);
}

static void test_mla_latent(void)
{
    test_group group;
    test_group_begin(&group, "mla latent bounds");
    /* A deepseek_v2 config.json a user could write: 2 heads, latent 1536. */
    sneppx_config config = mla(2, 1536, 64, 64, 64);
    config.hidden_size = 256;
    runs(&group, "kv_lora_rank 1536 rope 64 (2 heads)", &config, 40, TEST_MASK_CAUSAL, 11);
    /* The largest latent and rope: attention head_dim 2304, v 2048. */
    config = mla(2, SNEPPX_MAX_LATENT_DIM, 16, SNEPPX_MAX_HEAD_DIM, 16);
    runs(&group, "kv_lora_rank 2048 rope 256", &config, 24, TEST_MASK_CAUSAL, 12);
    runs(&group, "kv_lora_rank 2048 rope 256 (mask)", &config, 24, TEST_MASK_EXPLICIT, 13);
    /* A whole GQA-sized group of heads over the largest latent. */
    config = mla(16, SNEPPX_MAX_LATENT_DIM, 16, 16, 16);
    runs(&group, "kv_lora_rank 2048, 16 heads", &config, 20, TEST_MASK_CAUSAL, 14);
    /* The largest per-head dims, absorbed and naive. */
    config = mla(2, 16, SNEPPX_MAX_HEAD_DIM, SNEPPX_MAX_HEAD_DIM, SNEPPX_MAX_HEAD_DIM);
    runs(&group, "nope/rope/v 256", &config, 20, TEST_MASK_CAUSAL, 15);
    config.mla_naive = 1;
    runs(&group, "nope/rope/v 256 (naive)", &config, 20, TEST_MASK_CAUSAL, 16);
    test_group_end(&group);

    config = mla(2, SNEPPX_MAX_LATENT_DIM + SNEPPX_HEAD_DIM_MULTIPLE, 16, 16, 16);
    refused("kv_lora_rank 2064", &config, "config.kv_lora_rank");
    config = mla(2, SNEPPX_MAX_LATENT_DIM - 8, 16, 16, 16);
    refused("kv_lora_rank 2040 (not a multiple)", &config, "config.kv_lora_rank");
    config = mla(2, 64, 14, SNEPPX_MAX_HEAD_DIM + 2, 16);
    refused("qk_rope_head_dim 258", &config, "config.qk_rope_head_dim");
    config = mla(2, 64, SNEPPX_MAX_HEAD_DIM + 16, 16, 16);
    refused("qk_nope_head_dim 272", &config, "config.qk_nope_head_dim");
    config = mla(2, 64, 16, 16, SNEPPX_MAX_HEAD_DIM + 16);
    refused("v_head_dim 272", &config, "config.v_head_dim");
}

static void test_standard(void)
{
    test_group group;
    test_group_begin(&group, "standard bounds");
    sneppx_config config = standard(64, 2, 1, SNEPPX_MAX_HEAD_DIM);
    config.rotary_dim = SNEPPX_MAX_HEAD_DIM;
    runs(&group, "head_dim 256, rotary_dim 256", &config, 30, TEST_MASK_CAUSAL, 21);
    /* Every head in one group: the flash block holds 4096 x 16 rows. */
    config = standard(16, SNEPPX_MAX_HEADS, 1, 16);
    runs(&group, "4096 heads over one kv head", &config, 5, TEST_MASK_CAUSAL, 22);
    config = standard(64, 2, 2, 32);
    config.max_position_embeddings = SNEPPX_MAX_POSITIONS;
    config.sliding_window = SNEPPX_MAX_POSITIONS;
    runs(&group, "max_position_embeddings, window 2^40", &config, 20, TEST_MASK_CAUSAL, 23);
    /* The widest projection: k = n of the O GEMM = 2^20. */
    config = standard(SNEPPX_MAX_DIM, 1, 1, 16);
    runs(&group, "hidden_size 2^20", &config, 3, TEST_MASK_CAUSAL, 24);
    test_group_end(&group);

    config = standard(64, 2, 1, SNEPPX_MAX_HEAD_DIM + SNEPPX_HEAD_DIM_MULTIPLE);
    refused("head_dim 272", &config, "config.head_dim");
    config = standard(64, 2, 1, 64);
    config.rotary_dim = SNEPPX_MAX_HEAD_DIM + 2;
    refused("rotary_dim 258", &config, "config.rotary_dim");
    config = standard(16, SNEPPX_MAX_HEADS + 1, 1, 16);
    refused("num_attention_heads 4097", &config, "config.num_attention_heads");
    config = standard(SNEPPX_MAX_DIM + 1, 1, 1, 16);
    refused("hidden_size 2^20 + 1", &config, "config.hidden_size");
    config = standard(64, 2, 2, 32);
    config.sliding_window = SNEPPX_MAX_POSITIONS + 1;
    refused("sliding_window 2^40 + 1", &config, "config.sliding_window");
    config = standard(64, 2, 2, 32);
    config.max_position_embeddings = SNEPPX_MAX_POSITIONS + 1;
    refused("max_position_embeddings 2^40 + 1", &config, "config.max_position_embeddings");
    config = standard(64, 2, 2, 32);
    config.num_threads = (int)SNEPPX_MAX_THREADS + 1;
    refused("num_threads 1025", &config, "config.num_threads");
    config.num_threads = (int)SNEPPX_MAX_THREADS;
    TEST_CHECK(&tally, sneppx_config_validate(&config) == SNEPPX_OK, "num_threads 1024 refused: %s",
               sneppx_last_error());

    /* MLA's fields without MLA: the layer would run on head_dim and ignore them. */
    config = standard(64, 2, 2, 32);
    config.v_head_dim = 64;
    refused("v_head_dim 64 without kv_lora_rank", &config, "config.v_head_dim: 64 applies to MLA configs");
    config = standard(64, 2, 2, 32);
    config.q_lora_rank = 48;
    refused("q_lora_rank 48 without kv_lora_rank", &config, "config.q_lora_rank: 48 applies to MLA configs");
    config = standard(64, 2, 2, 32);
    config.kv_lora_rank = -16;
    refused("kv_lora_rank -16", &config, "config.kv_lora_rank: -16 applies to MLA configs");
}

int main(void)
{
    test_mla_latent();
    test_standard();
    return test_finish(&tally);
}
