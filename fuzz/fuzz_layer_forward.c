/* Fuzzes what a valid config does once it is a layer: bytes pick a small
 * config (standard or MLA, GQA, window, bias, RoPE layout and scaling, the
 * projections' storage: float32, bfloat16, float16 or int8, and dimensions up to the bounds that size kernels and scratch: head_dim 256,
 * kv_lora_rank 2048, rope / nope / v 256), and every config that
 * sneppx_config_validate accepts is created with synthetic weights and run
 * forward on a few tokens, with flash and with SDPA.
 *
 * Promises: a valid config makes a layer (no kernel refused, nothing read or
 * written outside a buffer: ASan), its forward output is finite for finite
 * input, and flash agrees with SDPA (the exact, materialized reference) to
 * float32 accuracy. A gap between the config bounds and what the kernels
 * were built for shows up here as a refusal, a sanitizer report or a
 * disagreement, found by the machine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"

/* Reads the input a byte at a time; past its end, zeros. */
struct reader {
    const uint8_t *data;
    size_t size, at;
};

static unsigned next(struct reader *r) { return r->at < r->size ? r->data[r->at++] : 0; }

/* 0..count-1 from two bytes. */
static int64_t pick(struct reader *r, int64_t count)
{
    unsigned value = next(r) | next(r) << 8;
    return (int64_t)(value % (unsigned)count);
}

static void decode(struct reader *r, sneppx_config *config, int64_t *seq_len)
{
    sneppx_config_init(config);
    snprintf(config->name, sizeof config->name, "fuzz");
    const unsigned flags = next(r);
    config->qkv_bias = flags & 1;
    config->o_bias = flags >> 1 & 1;
    config->rope_interleaved = flags >> 2 & 1;
    config->num_threads = 1 + (flags >> 3 & 1);
    const int is_mla = flags >> 4 & 1;
    config->hidden_size = 16 * (1 + pick(r, 8));
    config->num_attention_heads = 1 + pick(r, 16);
    if (is_mla) {
        /* Multiples of 8 for the latent and 2 for rope: some sums miss the
         * attention kernels' multiple of 16, which validation must refuse. */
        config->kv_lora_rank = 8 * (1 + pick(r, 256));
        config->qk_rope_head_dim = 2 * (1 + pick(r, 128));
        config->qk_nope_head_dim = 2 * (1 + pick(r, 128));
        config->v_head_dim = 16 * (1 + pick(r, 16));
        config->q_lora_rank = flags >> 5 & 1 ? 16 * (1 + pick(r, 8)) : 0;
        config->mla_naive = flags >> 6 & 1;
        config->num_key_value_heads = config->num_attention_heads;
    } else {
        config->num_key_value_heads = 1 + pick(r, config->num_attention_heads);
        config->head_dim = 8 * pick(r, 33);             /* 0 = hidden / heads */
        config->rotary_dim = 2 * pick(r, 129);          /* 0 = the whole head */
        const unsigned window = next(r);
        config->sliding_window = window < 128 ? 0 : window < 250 ? window - 120 : (int64_t)1 << (window - 210);
    }
    const unsigned rope = next(r);
    if (rope % 4 == 1) {
        config->rope_scaling.type = SNEPPX_ROPE_LINEAR;
        config->rope_scaling.factor = 1.0 + rope / 32;
    } else if (rope % 4 == 2) {
        config->rope_scaling.type = SNEPPX_ROPE_YARN;
        config->rope_scaling.factor = 1.0 + rope / 16;
        config->rope_scaling.beta_fast = 32.0;
        config->rope_scaling.beta_slow = 1.0;
        config->rope_scaling.mscale = rope & 4 ? 1.0 : 0.0;
        config->rope_scaling.mscale_all_dim = rope & 8 ? 0.707 : 0.0;
        config->rope_scaling.original_max_position_embeddings = 64;
    }
    *seq_len = 1 + pick(r, 40);
    /* Flag bit 7 stores the projections in bfloat16, float16 or int8 (a byte read
     * last, so the inputs without it pick the configs they always did): flash and
     * SDPA share the packed weights, so they must still agree. */
    if (flags >> 7 & 1)
        config->weight_dtype = (sneppx_dtype)(SNEPPX_DTYPE_BFLOAT16 + next(r) % 3);
}

static void forward(sneppx_layer *layer, int64_t seq_len, const float *hidden, float *out, const char *what)
{
    const sneppx_status status = sneppx_layer_forward(layer, 1, seq_len, hidden, NULL, NULL, NULL, out);
    FUZZ_ASSERT(status == SNEPPX_OK, "%s forward of a valid layer: %s", what, sneppx_last_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reader r = {data, size, 0};
    sneppx_config config;
    int64_t seq_len;
    decode(&r, &config, &seq_len);
    if (sneppx_config_validate(&config) != SNEPPX_OK)
        return 0;
    sneppx_layer *layer = NULL;
    sneppx_status status = sneppx_layer_create(&config, NULL, &layer);
    FUZZ_ASSERT(status == SNEPPX_OK, "create of a valid config: %s", sneppx_last_error());

    const int64_t n = seq_len * config.hidden_size;
    float *hidden = malloc(sizeof(float) * (size_t)n);
    float *flash = malloc(sizeof(float) * (size_t)n);
    float *sdpa = malloc(sizeof(float) * (size_t)n);
    FUZZ_ASSERT(hidden && flash && sdpa, "out of memory for %lld floats", (long long)n);
    for (int64_t i = 0; i < n; i++)
        hidden[i] = (float)((int)next(&r) - 128) / 128.0f;

    forward(layer, seq_len, hidden, flash, "flash");
    FUZZ_ASSERT(sneppx_layer_set_flash(layer, 0) == SNEPPX_OK, "set_flash(0): %s", sneppx_last_error());
    forward(layer, seq_len, hidden, sdpa, "sdpa");
    double largest = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        FUZZ_ASSERT(isfinite(flash[i]) && isfinite(sdpa[i]), "output %lld: flash %g, sdpa %g", (long long)i,
                    flash[i], sdpa[i]);
        largest = fmax(largest, fabs(sdpa[i]));
        worst = fmax(worst, fabs((double)flash[i] - sdpa[i]));
    }
    /* Both sum the same float32 products in other orders (and flash's
     * polynomial exp): 1e-4 of the output's size is a wide margin. */
    FUZZ_ASSERT(worst <= 1e-4 * fmax(largest, 1e-3), "flash and sdpa differ by %g (outputs up to %g), keys:\n%s",
                worst, largest, sneppx_layer_keys(layer));
    sneppx_layer_destroy(layer);
    free(hidden);
    free(flash);
    free(sdpa);
    return 0;
}
