/* sneppx_config_from_json: the published config.json of every family gives
 * its preset, field for field (the files live in fuzz/corpus/config_json/,
 * where they also seed the fuzzer); each kind of bad file is refused with
 * the right status, a message naming the field, and the config untouched.
 * sneppx_config_from_json_file reads a file or a checkpoint directory's
 * config.json and refuses what is no regular file (a FIFO at once, no hang).
 * sneppx_rope_scaling_from_json reads a rope_scaling value alone. */
#include "test_cache_common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sneppx/config.h"
#include "test_util.h"

/* Published files, named by the preset they describe. */
static const char *const published[] = {
    "llama2-7B", "llama3-8B", "llama3.1-8B", "mistral-7B", "mistral-7B-v0.3",
    "qwen2-0.5B", "qwen2-7B", "deepseek-v2-lite", "deepseek-v2-236B"};

static char *read_text(const char *path, size_t *size)
{
    FILE *stream = fopen(path, "rb");
    if (!stream)
        return NULL;
    char *text = NULL;
    if (fseek(stream, 0, SEEK_END) == 0) {
        long length = ftell(stream);
        text = length >= 0 ? malloc((size_t)length + 1) : NULL;
        if (text && (fseek(stream, 0, SEEK_SET) != 0 || fread(text, 1, (size_t)length, stream) != (size_t)length)) {
            free(text);
            text = NULL;
        } else if (text) {
            text[length] = '\0';
            *size = (size_t)length;
        }
    }
    fclose(stream);
    return text;
}

/* The q/k head dim and rotary dim a config means (0 = derive, as in config.h). */
static int64_t effective_head_dim(const sneppx_config *c)
{
    if (c->kv_lora_rank > 0)
        return c->qk_nope_head_dim + c->qk_rope_head_dim;
    return c->head_dim > 0 ? c->head_dim : c->hidden_size / c->num_attention_heads;
}

static int64_t effective_rotary_dim(const sneppx_config *c)
{
    if (c->kv_lora_rank > 0)
        return c->qk_rope_head_dim;
    return c->rotary_dim > 0 ? c->rotary_dim : effective_head_dim(c);
}

/* Every field that shapes the math, compared exactly (the file's numbers and
 * the registry's are the same decimal literals). The registry spells derived
 * dims out where the file leaves them to the reader. */
static void expect_same_config(test_tally *tally, const char *what, const sneppx_config *got,
                               const sneppx_config *want)
{
    TEST_CHECK(tally, effective_head_dim(got) == effective_head_dim(want) &&
                          effective_rotary_dim(got) == effective_rotary_dim(want),
               "%s: head_dim %lld rotary %lld, preset %lld %lld", what, (long long)effective_head_dim(got),
               (long long)effective_rotary_dim(got), (long long)effective_head_dim(want),
               (long long)effective_rotary_dim(want));
#define SAME(field)                                                                                         \
    TEST_CHECK(tally, got->field == want->field, "%s: " #field " %.17g, preset %.17g", what, (double)got->field, \
               (double)want->field)
    SAME(hidden_size);
    SAME(num_attention_heads);
    SAME(num_key_value_heads);
    SAME(rope_interleaved);
    SAME(rope_theta);
    SAME(rope_scaling.type);
    SAME(rope_scaling.factor);
    SAME(rope_scaling.low_freq_factor);
    SAME(rope_scaling.high_freq_factor);
    SAME(rope_scaling.original_max_position_embeddings);
    SAME(rope_scaling.beta_fast);
    SAME(rope_scaling.beta_slow);
    SAME(rope_scaling.mscale);
    SAME(rope_scaling.mscale_all_dim);
    SAME(rope_scaling.attention_factor);
    SAME(max_position_embeddings);
    SAME(sliding_window);
    SAME(qkv_bias);
    SAME(o_bias);
    SAME(q_lora_rank);
    SAME(kv_lora_rank);
    SAME(qk_nope_head_dim);
    SAME(qk_rope_head_dim);
    SAME(v_head_dim);
#undef SAME
}

static void test_published(test_tally *tally)
{
    const char *source = getenv("SNEPPX_SOURCE_DIR");
    for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/fuzz/corpus/config_json/%s.json", source ? source : ".", published[i]);
        size_t size = 0;
        char *text = read_text(path, &size);
        if (!TEST_CHECK(tally, text != NULL, "cannot read %s (is SNEPPX_SOURCE_DIR set?)", path))
            continue;
        sneppx_config parsed, preset;
        sneppx_status status = sneppx_config_from_json(text, size, &parsed);
        TEST_CHECK(tally, status == SNEPPX_OK, "%s: %s: %s", published[i], sneppx_status_name(status),
                   sneppx_last_error());
        if (status == SNEPPX_OK && TEST_CHECK(tally, sneppx_config_from_name(published[i], NULL, &preset) == SNEPPX_OK,
                                              "preset %s: %s", published[i], sneppx_last_error()))
            expect_same_config(tally, published[i], &parsed, &preset);
        free(text);
    }
}

/* A small valid Llama file the bad cases below edit one field of. */
#define LLAMA_HEAD "{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_attention_heads\": 4"

struct bad_case {
    const char *json;
    sneppx_status status;
    const char *needle; /* the message must contain it: the field's name */
};

static const struct bad_case bad_cases[] = {
    {"", SNEPPX_ERR_FORMAT, "json_text"},
    {"{\"model_type\": ", SNEPPX_ERR_FORMAT, "not valid JSON"},
    {"[1, 2]", SNEPPX_ERR_FORMAT, "not a JSON object"},
    {LLAMA_HEAD "} trailing", SNEPPX_ERR_FORMAT, "bytes after the JSON object"},
    /* cJSON ends a string at the NUL an escape decodes to: this key would have been read
     * as num_key_value_heads (HF reads another key and defaults to 4 heads). */
    {LLAMA_HEAD ", \"num_key_value_heads\\u0000x\": 2}", SNEPPX_ERR_FORMAT,
     "json_text: not valid JSON, or a NUL in a string (at byte 90: a NUL, a \\u escape"},
    {"{\"model_type\": \"llama\\u0000-not-llama\"}", SNEPPX_ERR_FORMAT, "(at byte 21: a NUL"},
    {"{\"model_type\": \"llama\\u00zz\"}", SNEPPX_ERR_FORMAT, "(at byte 21: a NUL"},
    {"{\"hidden_size\": 256, \"num_attention_heads\": 4}", SNEPPX_ERR_FORMAT, "model_type: missing"},
    {"{\"model_type\": 7}", SNEPPX_ERR_FORMAT, "model_type: expected a string, got 7"},
    {"{\"model_type\": \"gpt2\"}", SNEPPX_ERR_UNSUPPORTED, "model_type: 'gpt2' is not supported"},
    /* Long names are cut at 64 bytes (32 for a wrong-typed value) and say so. */
    {"{\"model_type\": \"llama_with_a_model_type_name_longer_than_sixty_four_bytes_for_sure_xyz\"}",
     SNEPPX_ERR_UNSUPPORTED,
     "model_type: 'llama_with_a_model_type_name_longer_than_sixty_four_bytes_for_su...' is not supported"},
    {"{\"model_type\": \"mistral_short_enough\"}", SNEPPX_ERR_UNSUPPORTED, "'mistral_short_enough' is not"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"a_rope_type_whose_name_runs_past_sixty_four_bytes_of_text_here_and_more\", "
     "\"factor\": 2}}", SNEPPX_ERR_UNSUPPORTED,
     "rope_type: 'a_rope_type_whose_name_runs_past_sixty_four_bytes_of_text_here_a...' is not supported"},
    {"{\"model_type\": \"llama\", \"hidden_size\": \"two hundred and fifty six, as words, no less\", "
     "\"num_attention_heads\": 4}", SNEPPX_ERR_FORMAT, "got the string \"two hundred and fifty six, as wo...\""},
    {"{\"model_type\": \"llama\", \"num_attention_heads\": 4}", SNEPPX_ERR_FORMAT, "hidden_size: missing"},
    {"{\"model_type\": \"llama\", \"hidden_size\": \"256\", \"num_attention_heads\": 4}", SNEPPX_ERR_FORMAT,
     "hidden_size: expected a non-negative integer, got the string \"256\""},
    {"{\"model_type\": \"llama\", \"hidden_size\": 256.5, \"num_attention_heads\": 4}", SNEPPX_ERR_FORMAT,
     "hidden_size: expected a non-negative integer, got 256.5"},
    {"{\"model_type\": \"llama\", \"hidden_size\": 1e300, \"num_attention_heads\": 4}", SNEPPX_ERR_FORMAT,
     "hidden_size: expected a non-negative integer"},
    {LLAMA_HEAD ", \"num_key_value_heads\": -2}", SNEPPX_ERR_FORMAT, "num_key_value_heads: expected a non-negative"},
    {LLAMA_HEAD ", \"num_key_value_heads\": 3}", SNEPPX_ERR_INVALID_ARGUMENT, "num_key_value_heads"},
    {LLAMA_HEAD ", \"head_dim\": true}", SNEPPX_ERR_FORMAT, "head_dim: expected a non-negative integer, got true"},
    {LLAMA_HEAD ", \"head_dim\": 72}", SNEPPX_ERR_UNSUPPORTED, "head_dim"},
    {LLAMA_HEAD ", \"rope_theta\": \"1e4\"}", SNEPPX_ERR_FORMAT, "rope_theta: expected a finite number"},
    {LLAMA_HEAD ", \"rope_theta\": 1e999}", SNEPPX_ERR_FORMAT, "rope_theta: expected a finite number"},
    {LLAMA_HEAD ", \"rope_theta\": 0.5}", SNEPPX_ERR_INVALID_ARGUMENT, "rope_theta"},
    {LLAMA_HEAD ", \"max_position_embeddings\": 0}", SNEPPX_ERR_INVALID_ARGUMENT, "max_position_embeddings"},
    {LLAMA_HEAD ", \"attention_bias\": 1}", SNEPPX_ERR_FORMAT, "attention_bias: expected true or false, got 1"},
    {LLAMA_HEAD ", \"hidden_size\": 512}", SNEPPX_ERR_FORMAT, "hidden_size: appears 2 times"},
    /* transformers fails on a partial factor beside a scaled RoPE */
    {LLAMA_HEAD ", \"partial_rotary_factor\": 0.5, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}",
     SNEPPX_ERR_UNSUPPORTED, "config.json: partial_rotary_factor: 0.5 with rope_scaling 'linear' is not supported"},
    {LLAMA_HEAD ", \"rope_scaling\": 8}", SNEPPX_ERR_FORMAT, "rope_scaling: expected an object or null, got 8"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"factor\": 2.0}}", SNEPPX_ERR_FORMAT, "rope_scaling.rope_type: missing"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 2.0}}", SNEPPX_ERR_UNSUPPORTED,
     "rope_scaling.rope_type: 'longrope' is not supported"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"yarn\", \"factor\": 2.0}}",
     SNEPPX_ERR_FORMAT, "rope_type 'linear' and type 'yarn' disagree"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"linear\"}}", SNEPPX_ERR_FORMAT, "rope_scaling.factor: missing"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": \"2\"}}", SNEPPX_ERR_FORMAT,
     "rope_scaling.factor: expected a finite number"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": -2}}", SNEPPX_ERR_INVALID_ARGUMENT,
     "rope_scaling.factor"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
     "\"high_freq_factor\": 4}}", SNEPPX_ERR_FORMAT, "rope_scaling.original_max_position_embeddings: missing"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
     "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 81.5}}", SNEPPX_ERR_FORMAT,
     "rope_scaling.original_max_position_embeddings: expected an integer"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": false}}",
     SNEPPX_ERR_UNSUPPORTED, "rope_scaling.truncate"},
    {LLAMA_HEAD ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"finetuned\": true}}",
     SNEPPX_ERR_UNSUPPORTED, "rope_scaling.finetuned: unknown key"},
    {LLAMA_HEAD ", \"rope_parameters\": {\"rope_theta\": 1e6, \"factor\": 2}}", SNEPPX_ERR_FORMAT,
     "config.json: rope_parameters.rope_type: missing (nor is 'type' given), which 'factor' needs"},
    {LLAMA_HEAD ", \"rope_parameters\": {\"rope_type\": \"longrope\", \"factor\": 2}}", SNEPPX_ERR_UNSUPPORTED,
     "config.json: rope_parameters.rope_type: 'longrope' is not supported"},
    {LLAMA_HEAD ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": \"1e6\"}}", SNEPPX_ERR_FORMAT,
     "config.json: rope_parameters.rope_theta: expected a finite number"},
    {"{\"model_type\": \"mistral\", \"hidden_size\": 256, \"num_attention_heads\": 4, \"sliding_window\": -1}",
     SNEPPX_ERR_FORMAT, "sliding_window: expected a non-negative integer, got -1"},
    {"{\"model_type\": \"qwen2\", \"hidden_size\": 256, \"num_attention_heads\": 4, \"use_sliding_window\": true}",
     SNEPPX_ERR_UNSUPPORTED, "use_sliding_window"},
    {"{\"model_type\": \"qwen2\", \"hidden_size\": 256, \"num_attention_heads\": 4, \"use_sliding_window\": \"no\"}",
     SNEPPX_ERR_FORMAT, "use_sliding_window: expected true or false"},
    {"{\"model_type\": \"deepseek_v2\", \"hidden_size\": 256, \"num_attention_heads\": 4, \"qk_nope_head_dim\": 32, "
     "\"qk_rope_head_dim\": 32, \"v_head_dim\": 32}", SNEPPX_ERR_FORMAT, "kv_lora_rank: missing"},
    {"{\"model_type\": \"deepseek_v2\", \"hidden_size\": 256, \"num_attention_heads\": 4, \"kv_lora_rank\": 64, "
     "\"qk_nope_head_dim\": 32, \"qk_rope_head_dim\": [32], \"v_head_dim\": 32}", SNEPPX_ERR_FORMAT,
     "qk_rope_head_dim: expected a non-negative integer, got an array"},
};

/* Bytes of a config nobody wrote: a failed parse must leave them all. */
#define SENTINEL 0xa5

static int untouched(const sneppx_config *config)
{
    const unsigned char *bytes = (const unsigned char *)config;
    for (size_t i = 0; i < sizeof *config; i++)
        if (bytes[i] != SENTINEL)
            return 0;
    return 1;
}

static void test_bad_files(test_tally *tally)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *bad = &bad_cases[i];
        sneppx_config config;
        memset(&config, SENTINEL, sizeof config);
        sneppx_status status = sneppx_config_from_json(bad->json, strlen(bad->json), &config);
        TEST_CHECK(tally, status == bad->status && strstr(sneppx_last_error(), bad->needle) && untouched(&config),
                   "%s\n  -> %s '%s', want %s naming '%s'%s", bad->json, sneppx_status_name(status),
                   sneppx_last_error(), sneppx_status_name(bad->status), bad->needle,
                   untouched(&config) ? "" : " (and config was written)");
    }
    sneppx_config config;
    memset(&config, SENTINEL, sizeof config);
    /* Text beyond 16 MiB is refused by its length alone, before a copy or a parse. */
    const size_t huge = ((size_t)16 << 20) + 1;
    char *spaces = malloc(huge);
    if (spaces) {
        memset(spaces, ' ', huge);
        memcpy(spaces, LLAMA_HEAD "}", strlen(LLAMA_HEAD "}"));
        TEST_CHECK(tally, sneppx_config_from_json(spaces, huge, &config) == SNEPPX_ERR_FORMAT &&
                              strstr(sneppx_last_error(), "json_text: more than 16777216 bytes") && untouched(&config),
                   "16 MiB + 1 of text: '%s'", sneppx_last_error());
        TEST_CHECK(tally, sneppx_config_from_json(spaces, huge - 1, &config) == SNEPPX_OK,
                   "16 MiB of text (a config padded with spaces): '%s'", sneppx_last_error());
        free(spaces);
    }
    TEST_CHECK(tally, sneppx_config_from_json(NULL, 3, &config) == SNEPPX_ERR_INVALID_ARGUMENT &&
                          strstr(sneppx_last_error(), "json_text"), "NULL json_text: '%s'", sneppx_last_error());
    TEST_CHECK(tally, sneppx_config_from_json("{}", 2, NULL) == SNEPPX_ERR_INVALID_ARGUMENT &&
                          strstr(sneppx_last_error(), "config"), "NULL config: '%s'", sneppx_last_error());
}

/* Defaults and family rules a published file does not exercise. */
static void test_semantics(test_tally *tally)
{
    sneppx_config config;
    /* The length bounds the text: what follows is not read (no NUL needed). */
    const char padded[] = LLAMA_HEAD "}\n  garbage that is not JSON";
    sneppx_status status = sneppx_config_from_json(padded, strlen(LLAMA_HEAD "}\n "), &config);
    TEST_CHECK(tally, status == SNEPPX_OK, "length-bounded text: %s", sneppx_last_error());
    if (status == SNEPPX_OK) {
        /* llama: no attention_bias -> none; no max_position_embeddings -> LlamaConfig's 2048;
         * no rope_theta -> 10000; no num_key_value_heads -> the head count. */
        TEST_CHECK(tally, config.qkv_bias == 0 && config.o_bias == 0 && config.max_position_embeddings == 2048 &&
                              config.rope_theta == 10000.0 && config.num_key_value_heads == 4 &&
                              config.rope_scaling.type == SNEPPX_ROPE_DEFAULT && config.use_flash_attn == 1 &&
                              strcmp(config.name, "llama") == 0,
                   "llama defaults: bias %d/%d mpe %lld theta %g kv %lld name %s", config.qkv_bias, config.o_bias,
                   (long long)config.max_position_embeddings, config.rope_theta,
                   (long long)config.num_key_value_heads, config.name);
    }
    /* transformers' LLaMA, Mistral and Qwen2 rotate the whole head whatever partial_rotary_factor
     * says (an invalid one included): so does the reader. */
    const char *const families[] = {"llama", "mistral", "qwen2"};
    const char *const factors[] = {"0.25", "0.01", "1.5", "\"half\"",
                                   "1.0, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}"};
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++) {
            char partial[256];
            snprintf(partial, sizeof partial,
                     "{\"model_type\": \"%s\", \"hidden_size\": 512, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 4, \"head_dim\": 128, "
                     "\"partial_rotary_factor\": %s}", families[f], factors[i]);
            status = sneppx_config_from_json(partial, strlen(partial), &config);
            TEST_CHECK(tally, status == SNEPPX_OK && config.rotary_dim == 0 && config.head_dim == 128,
                       "%s, partial_rotary_factor %s: status %d rotary_dim %lld (%s)", families[f], factors[i],
                       (int)status, (long long)config.rotary_dim, sneppx_last_error());
        }
    const char *biased = LLAMA_HEAD ", \"head_dim\": 128, \"attention_bias\": true}";
    status = sneppx_config_from_json(biased, strlen(biased), &config);
    TEST_CHECK(tally, status == SNEPPX_OK && config.head_dim == 128 && config.qkv_bias == 1 && config.o_bias == 1,
               "llama attention_bias: bias %d/%d (%s)", config.qkv_bias, config.o_bias, sneppx_last_error());
    const char *yarn = LLAMA_HEAD ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}}";
    status = sneppx_config_from_json(yarn, strlen(yarn), &config);
    TEST_CHECK(tally, status == SNEPPX_OK && config.rope_scaling.type == SNEPPX_ROPE_YARN &&
                          config.rope_scaling.beta_fast == 32.0 && config.rope_scaling.beta_slow == 1.0 &&
                          config.rope_scaling.original_max_position_embeddings == 0,
               "yarn defaults: beta %g/%g orig %lld (%s)", config.rope_scaling.beta_fast,
               config.rope_scaling.beta_slow, (long long)config.rope_scaling.original_max_position_embeddings,
               sneppx_last_error());
    /* Where rope_theta and the scaling come from, as transformers reads them. */
    const struct {
        const char *what, *text;
        double theta;
        sneppx_rope_type type;
        double factor;
    } ropes[] = {
        /* transformers 5 saves rope_theta and the scaling inside rope_parameters, none at the top. */
        {"rope_parameters", LLAMA_HEAD ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2, "
                            "\"rope_theta\": 500000}}", 500000.0, SNEPPX_ROPE_LINEAR, 2.0},
        /* transformers takes `rope_scaling or rope_parameters`: an empty rope_scaling is none. */
        {"empty rope_scaling beside rope_parameters",
         LLAMA_HEAD ", \"rope_scaling\": {}, \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2, "
                    "\"rope_theta\": 500000}}", 500000.0, SNEPPX_ROPE_LINEAR, 2.0},
        /* ... and a dict without a type as plain RoPE, when it holds no scaling parameter. */
        {"untyped rope_parameters", LLAMA_HEAD ", \"rope_parameters\": {\"rope_theta\": 1000000}}", 1e6,
         SNEPPX_ROPE_DEFAULT, 1.0},
        {"empty rope_scaling", LLAMA_HEAD ", \"rope_scaling\": {}}", 10000.0, SNEPPX_ROPE_DEFAULT, 1.0},
    };
    for (size_t i = 0; i < sizeof ropes / sizeof ropes[0]; i++) {
        status = sneppx_config_from_json(ropes[i].text, strlen(ropes[i].text), &config);
        TEST_CHECK(tally, status == SNEPPX_OK && config.rope_theta == ropes[i].theta &&
                              config.rope_scaling.type == ropes[i].type && config.rope_scaling.factor == ropes[i].factor,
                   "%s: theta %g type %d factor %g (%s)", ropes[i].what, config.rope_theta,
                   (int)config.rope_scaling.type, config.rope_scaling.factor, sneppx_last_error());
    }
    /* Keys left out take the config class's defaults: MistralConfig's 8 K/V heads and window
     * of 4096 (a file without them runs so in transformers), Qwen2Config's 32 K/V heads; a
     * null is None there: num_attention_heads K/V heads, no window. */
    const struct {
        const char *what, *text;
        int64_t kv_heads, window;
    } defaults[] = {
        {"mistral, keys left out", "{\"model_type\": \"mistral\", \"hidden_size\": 512, \"num_attention_heads\": 32}",
         8, 4096},
        {"mistral, nulls", "{\"model_type\": \"mistral\", \"hidden_size\": 512, \"num_attention_heads\": 32, "
                           "\"num_key_value_heads\": null, \"sliding_window\": null}", 32, 0},
        {"qwen2, keys left out", "{\"model_type\": \"qwen2\", \"hidden_size\": 1024, \"num_attention_heads\": 64}",
         32, 0},
        {"llama, keys left out", "{\"model_type\": \"llama\", \"hidden_size\": 1024, \"num_attention_heads\": 64, "
                                 "\"sliding_window\": 16}", 64, 0},
    };
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
        status = sneppx_config_from_json(defaults[i].text, strlen(defaults[i].text), &config);
        TEST_CHECK(tally, status == SNEPPX_OK && config.num_key_value_heads == defaults[i].kv_heads &&
                              config.sliding_window == defaults[i].window,
                   "%s: K/V heads %lld (want %lld), window %lld (want %lld) (%s)", defaults[i].what,
                   (long long)config.num_key_value_heads, (long long)defaults[i].kv_heads,
                   (long long)config.sliding_window, (long long)defaults[i].window, sneppx_last_error());
    }
    /* DeepseekV2Config's q_lora_rank is 1536 (q_a_proj, q_b_proj) when left out, None (q_proj) when null. */
    for (int null_rank = 0; null_rank < 2; null_rank++) {
        char deepseek[512];
        snprintf(deepseek, sizeof deepseek,
                 "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 256, \"num_attention_heads\": 4, "
                 "\"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 16, \"v_head_dim\": 16%s}",
                 null_rank ? ", \"q_lora_rank\": null" : "");
        status = sneppx_config_from_json(deepseek, strlen(deepseek), &config);
        TEST_CHECK(tally, status == SNEPPX_OK && config.q_lora_rank == (null_rank ? 0 : 1536),
                   "deepseek_v2, q_lora_rank %s: %lld (%s)", null_rank ? "null" : "left out",
                   (long long)config.q_lora_rank, sneppx_last_error());
    }
    const char *mistral = "{\"model_type\": \"mistral\", \"hidden_size\": 256, \"num_attention_heads\": 4, "
                          "\"num_key_value_heads\": 4, \"sliding_window\": null, \"attention_bias\": true}";
    status = sneppx_config_from_json(mistral, strlen(mistral), &config);
    TEST_CHECK(tally, status == SNEPPX_OK && config.qkv_bias == 0 && config.o_bias == 0 &&
                          config.max_position_embeddings == 131072 && config.sliding_window == 0,
               "mistral: never a bias, MistralConfig's 131072 positions, no window: %d/%d %lld %lld (%s)",
               config.qkv_bias, config.o_bias, (long long)config.max_position_embeddings,
               (long long)config.sliding_window, sneppx_last_error());
}

/* sneppx_config_from_json_file: the same config as from the text; errors name
 * the file; a FIFO is refused at once (the alarm turns a hang into a failure). */
static void test_files(test_tally *tally)
{
    char dir[CACHE_TEST_DIR_MAX], path[CACHE_TEST_PATH_MAX];
    if (!TEST_CHECK(tally, cache_test_make_dir(dir, sizeof dir, "config-json") == 0, "temporary directory"))
        return;
    const char *source = getenv("SNEPPX_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/fuzz/corpus/config_json/qwen2-7B.json", source ? source : ".");
    size_t size = 0;
    char *text = read_text(path, &size);
    sneppx_config from_text, from_file, from_dir;
    if (TEST_CHECK(tally, text && sneppx_config_from_json(text, size, &from_text) == SNEPPX_OK, "%s: %s", path,
                   sneppx_last_error())) {
        TEST_CHECK(tally, sneppx_config_from_json_file(path, &from_file) == SNEPPX_OK, "file %s: %s", path,
                   sneppx_last_error());
        expect_same_config(tally, "from_json_file", &from_file, &from_text);
        char copy[CACHE_TEST_PATH_MAX];
        snprintf(copy, sizeof copy, "%s/config.json", dir);
        FILE *stream = fopen(copy, "wb");
        if (stream) {
            fwrite(text, 1, size, stream);
            fclose(stream);
        }
        TEST_CHECK(tally, sneppx_config_from_json_file(dir, &from_dir) == SNEPPX_OK, "directory %s: %s", dir,
                   sneppx_last_error());
        expect_same_config(tally, "from_json_file(directory)", &from_dir, &from_text);
        remove(copy);
    }
    free(text);

    sneppx_config untouched_config;
    memset(&untouched_config, SENTINEL, sizeof untouched_config);
    snprintf(path, sizeof path, "%s/missing.json", dir);
    sneppx_status status = sneppx_config_from_json_file(path, &untouched_config);
    TEST_CHECK(tally, status == SNEPPX_ERR_IO && strstr(sneppx_last_error(), "missing.json: cannot open"),
               "missing file: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *stream = fopen(path, "wb");
    if (stream) {
        fputs("{\"model_type\": \"gpt2\"}", stream);
        fclose(stream);
    }
    status = sneppx_config_from_json_file(path, &untouched_config);
    char want[CACHE_TEST_PATH_MAX + 64];
    snprintf(want, sizeof want, "%s: model_type: 'gpt2' is not supported", path);
    TEST_CHECK(tally, status == SNEPPX_ERR_UNSUPPORTED && strstr(sneppx_last_error(), want),
               "unsupported file: %s '%s', want '%s'", sneppx_status_name(status), sneppx_last_error(), want);

    snprintf(path, sizeof path, "%s/fifo.json", dir);
    if (TEST_CHECK(tally, mkfifo(path, 0600) == 0, "mkfifo %s", path)) {
        alarm(10); /* SIGALRM ends the test if the call waits for a writer */
        status = sneppx_config_from_json_file(path, &untouched_config);
        alarm(0);
        TEST_CHECK(tally, status == SNEPPX_ERR_IO && strstr(sneppx_last_error(), "fifo.json: not a regular file"),
                   "FIFO: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    }
    /* More than 16 MiB (a sparse file): refused by size, naming the file, before parsing. */
    snprintf(path, sizeof path, "%s/huge.json", dir);
    stream = fopen(path, "wb");
    const int written = stream && fputs("{}", stream) >= 0 && ftruncate(fileno(stream), (16 << 20) + 1) == 0;
    if (stream)
        fclose(stream);
    if (TEST_CHECK(tally, written, "sparse %s", path)) {
        status = sneppx_config_from_json_file(path, &untouched_config);
        snprintf(want, sizeof want, "%s: more than 16777216 bytes, the most a config.json may have", path);
        TEST_CHECK(tally, status == SNEPPX_ERR_FORMAT && strstr(sneppx_last_error(), want),
                   "oversized file: %s '%s', want '%s'", sneppx_status_name(status), sneppx_last_error(), want);
        remove(path);
    }
    /* A path as long as Linux takes (PATH_MAX, 4096 bytes with its NUL) still leaves room
     * for the reason after it. */
    char long_path[4096];
    memset(long_path, 'a', sizeof long_path - 1);
    long_path[0] = '/';
    long_path[sizeof long_path - 1] = '\0';
    status = sneppx_config_from_json_file(long_path, &untouched_config);
    const char *message = sneppx_last_error();
    const size_t length = strlen(message), reason = strlen(strerror(ENAMETOOLONG));
    TEST_CHECK(tally, status == SNEPPX_ERR_IO && length > reason &&
                          strcmp(message + length - reason, strerror(ENAMETOOLONG)) == 0,
               "a 4095-byte path: %s, a message of %zu bytes ending '%s'", sneppx_status_name(status), length,
               length > 40 ? message + length - 40 : message);
    TEST_CHECK(tally, untouched(&untouched_config), "a failed from_json_file wrote the config");
    status = sneppx_config_from_json_file(NULL, &untouched_config);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "path"), "NULL path: %s",
               sneppx_last_error());
    cache_test_remove_tree(dir);
}

/* sneppx_rope_scaling_from_json: the rope_scaling value alone (Python's
 * constructor reads its dict here), with the rules and words of config.json's. */
static void test_rope_scaling_alone(test_tally *tally)
{
    sneppx_rope_scaling scaling;
    memset(&scaling, 0x7f, sizeof scaling);
    const char *yarn = "{\"type\": \"yarn\", \"factor\": 40, \"mscale\": 0.707}";
    sneppx_status status = sneppx_rope_scaling_from_json(yarn, strlen(yarn), &scaling);
    TEST_CHECK(tally, status == SNEPPX_OK && scaling.type == SNEPPX_ROPE_YARN && scaling.factor == 40.0 &&
                          scaling.beta_fast == 32.0 && scaling.beta_slow == 1.0 && scaling.mscale == 0.707 &&
                          scaling.mscale_all_dim == 0.0 && scaling.original_max_position_embeddings == 0,
               "yarn: %s '%s' type %d factor %g beta %g/%g", sneppx_status_name(status), sneppx_last_error(),
               (int)scaling.type, scaling.factor, scaling.beta_fast, scaling.beta_slow);
    status = sneppx_rope_scaling_from_json(" null ", 6, &scaling);
    TEST_CHECK(tally, status == SNEPPX_OK && scaling.type == SNEPPX_ROPE_DEFAULT && scaling.factor == 1.0 &&
                          scaling.mscale == 0.0 && scaling.beta_fast == 0.0,
               "null: %s type %d factor %g mscale %g", sneppx_status_name(status), (int)scaling.type,
               scaling.factor, scaling.mscale);

    static const struct {
        const char *text;
        sneppx_status status;
        const char *message;   /* the whole message */
    } bad[] = {
        {"{\"rope_type\": \"linear\"}", SNEPPX_ERR_FORMAT,
         "rope_scaling.factor: missing (rope_type 'linear' needs it)"},
        {"{\"rope_type\": \"longrope\", \"factor\": 2}", SNEPPX_ERR_UNSUPPORTED,
         "rope_scaling.rope_type: 'longrope' is not supported (supported: default, linear, dynamic, llama3, yarn)"},
        {"{\"rope_type\": \"linear\", \"factor\": \"2\"}", SNEPPX_ERR_FORMAT,
         "rope_scaling.factor: expected a finite number, got the string \"2\""},
        {"[1]", SNEPPX_ERR_FORMAT, "rope_scaling: expected an object or null, got an array"},
        {"{\"rope_type\": ", SNEPPX_ERR_FORMAT, "json_text: not valid JSON (at byte 13)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sneppx_rope_scaling kept = {.type = SNEPPX_ROPE_LLAMA3, .factor = 3.0};
        status = sneppx_rope_scaling_from_json(bad[i].text, strlen(bad[i].text), &kept);
        TEST_CHECK(tally, status == bad[i].status && strcmp(sneppx_last_error(), bad[i].message) == 0 &&
                              kept.type == SNEPPX_ROPE_LLAMA3 && kept.factor == 3.0,
                   "%s: %s '%s', want '%s' and the struct untouched", bad[i].text, sneppx_status_name(status),
                   sneppx_last_error(), bad[i].message);
    }
    status = sneppx_rope_scaling_from_json(NULL, 0, &scaling);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strcmp(sneppx_last_error(), "json_text: must not be "
                                                                      "NULL") == 0, "NULL text: '%s'",
               sneppx_last_error());
    status = sneppx_rope_scaling_from_json("null", 4, NULL);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strcmp(sneppx_last_error(), "scaling: must not be "
                                                                      "NULL") == 0, "NULL scaling: '%s'",
               sneppx_last_error());
}

int main(void)
{
    test_tally tally = {0};
    test_published(&tally);
    test_bad_files(&tally);
    test_semantics(&tally);
    test_files(&tally);
    test_rope_scaling_alone(&tally);
    return test_finish(&tally);
}
