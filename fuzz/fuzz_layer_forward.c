/* Fuzzes what a valid config does once it is a layer, and what a forward call
 * of it accepts: bytes pick a small config (standard or MLA, GQA, window, bias,
 * RoPE layout and scaling: default, linear, dynamic, llama3 or yarn, the
 * projections' storage: float32, bfloat16, float16 or int8, and dimensions up
 * to the bounds that size kernels and scratch: head_dim 256, kv_lora_rank 2048,
 * rope / nope / v 256), and every config that sneppx_config_validate accepts
 * is created with synthetic weights and run forward, with flash and with
 * SDPA, on a call the bytes pick too: a batch of 1 to 4 sequences of a few
 * tokens; position_ids NULL, given as the default, shifted by a row's offset,
 * or any (negative, past max_position_embeddings, past 2^40 among them); no
 * mask, the causal (+ window) mask written out, a mask of any entries (masked,
 * barely not, positive, one plane for every sequence or one each), or a mask
 * the call must refuse (a wrong shape, a shape without a mask, a mask without
 * its shape).
 *
 * Promises: a valid config makes a layer (no kernel refused, nothing read or
 * written outside a buffer: ASan); a call is refused (INVALID_ARGUMENT, with a
 * message, out untouched) exactly when layer.h's rules on mask shapes and
 * positions say so; an accepted call's output is finite for finite input, and
 * flash agrees with SDPA (the exact, materialized reference) to float32
 * accuracy. And what the harness can check on its own, cheaply: each sequence
 * of a batch comes out as it does alone; positions given as the default are
 * the NULL ones, bit for bit; shifting every position of a sequence by one
 * offset changes nothing (RoPE sees only distances; not for dynamic RoPE past
 * max_position_embeddings, whose frequencies follow the call's longest
 * position); the causal mask written out is the NULL mask; a query whose keys
 * are all masked gives the output of zero attention (0 without an o bias);
 * dynamic RoPE below max_position_embeddings is the default RoPE. A gap
 * between the config bounds and what the kernels were built for shows up
 * here as a refusal, a sanitizer report or a disagreement, found by the
 * machine. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "sneppx/limits.h"

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

/* A RoPE scaling factor from a byte: 0 (refused), steps of 1/16 up to ~16, or huge. */
static double factor_byte(unsigned byte) { return byte == 255 ? 1e300 : byte / 16.0; }

/* The dynamic and llama3 types (rope byte % 4 == 3), with a max_position_embeddings
 * that a few tokens pass or 4096; the bytes are read only for them, so the inputs
 * of other types pick the configs they always did. */
static void decode_rope_extra(struct reader *r, unsigned rope, sneppx_config *config)
{
    const unsigned positions = next(r);
    config->max_position_embeddings = positions < 128 ? 4096 : 1 + (positions - 128) / 2;
    config->rope_scaling.factor = factor_byte(next(r));
    if (rope >> 2 & 1) {
        config->rope_scaling.type = SNEPPX_ROPE_LLAMA3;
        /* low_freq_factor 0 and high_freq_factor <= low are refused, as is a negative orig. */
        config->rope_scaling.low_freq_factor = (next(r) % 16) / 4.0;
        config->rope_scaling.high_freq_factor = config->rope_scaling.low_freq_factor + ((int)(next(r) % 16) - 2) / 4.0;
        const unsigned orig = next(r);
        config->rope_scaling.original_max_position_embeddings = orig == 1 ? -1 : 32 * (int64_t)orig;
    } else {
        config->rope_scaling.type = SNEPPX_ROPE_DYNAMIC;
    }
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
    } else if (rope % 4 == 3) {
        decode_rope_extra(r, rope, config);
    }
    *seq_len = 1 + pick(r, 40);
    /* Flag bit 7 stores the projections in bfloat16, float16 or int8 (a byte read
     * last, so the inputs without it pick the configs they always did): flash and
     * SDPA share the packed weights, so they must still agree. */
    if (flags >> 7 & 1)
        config->weight_dtype = (sneppx_dtype)(SNEPPX_DTYPE_BFLOAT16 + next(r) % 3);
}

/* ---- the call: batch, position_ids, attention_mask --------------------------- */

enum { POSITIONS_NULL, POSITIONS_DEFAULT, POSITIONS_SHIFTED, POSITIONS_ANY };
enum { MASK_NULL, MASK_CAUSAL, MASK_ANY, MASK_BAD };

struct call {
    int64_t batch, seq_len, tokens;
    int positions, mask;
    int64_t *position_ids;    /* [batch, seq_len], or NULL */
    float *mask_data;         /* planes of [seq_len, seq_len]: 1 or batch */
    int64_t planes;           /* 1: one plane for every sequence */
    int64_t shape[4];
    const float *mask_arg;    /* as passed: a MASK_BAD call may drop one of the two */
    const int64_t *shape_arg;
    int64_t largest;          /* the largest position (the default ones' too) */
    int valid;                /* whether layer.h's rules accept the call */
};

/* Mask entries a byte picks: kept, masked (<= -1e30), barely not (-1e29), positive. */
static const float mask_values[16] = {0.0f,  0.0f,  0.0f,   0.0f,   -1.0f,   -0.5f,   1.0f,     2.5f,
                                      -8.0f, -1e4f, -1e29f, -1e30f, -FLT_MAX, 0.25f, -INFINITY, -3.0f};

/* Whether key j is hidden from query i by the causal mask with window (0 = none). */
static int causal_hides(int64_t i, int64_t j, int64_t window) { return j > i || (window > 0 && i - j >= window); }

/* Reads the call's choices (the byte after the config), then the hidden states
 * into *hidden, then the positions and the mask. A call byte of 0 is the call
 * the harness always made: one sequence, NULL positions, NULL mask. */
static float *decode_call(struct reader *r, const sneppx_config *config, int64_t seq_len, struct call *call)
{
    const unsigned choice = next(r);
    memset(call, 0, sizeof *call);
    call->batch = 1 + (choice & 3);
    call->seq_len = seq_len;
    call->tokens = call->batch * seq_len;
    call->positions = choice >> 2 & 3;
    call->mask = choice >> 4 & 3;
    call->planes = choice >> 6 & 1 ? 1 : call->batch;

    const int64_t n = call->tokens * config->hidden_size;
    float *hidden = malloc(sizeof(float) * (size_t)n);
    FUZZ_ASSERT(hidden, "out of memory for %lld floats", (long long)n);
    for (int64_t i = 0; i < n; i++)
        hidden[i] = (float)((int)next(r) - 128) / 128.0f;

    const int64_t max_positions = config->max_position_embeddings;
    call->largest = seq_len - 1;
    if (call->positions != POSITIONS_NULL) {
        call->position_ids = malloc(sizeof(int64_t) * (size_t)call->tokens);
        FUZZ_ASSERT(call->position_ids, "out of memory");
        call->largest = -1;
        for (int64_t b = 0; b < call->batch; b++) {
            /* An offset per sequence, up to a little past max_position_embeddings. */
            const int64_t shift = call->positions == POSITIONS_SHIFTED ? pick(r, max_positions + 8) : 0;
            for (int64_t i = 0; i < seq_len; i++) {
                int64_t position = shift + i;
                if (call->positions == POSITIONS_ANY) {
                    const unsigned value = next(r) | next(r) << 8;
                    position = value == 0xffff   ? -1
                               : value == 0xfffe ? SNEPPX_MAX_POSITIONS
                               : value == 0xfffd ? SNEPPX_MAX_POSITIONS + 1
                                                 : (int64_t)(value % (unsigned)(max_positions + 8));
                }
                call->position_ids[b * seq_len + i] = position;
                if (position > call->largest || call->largest < 0)
                    call->largest = position;
            }
        }
    }

    int mask_ok = 1;
    if (call->mask != MASK_NULL) {
        const int64_t plane = seq_len * seq_len;
        call->mask_data = malloc(sizeof(float) * (size_t)(call->planes * plane));
        FUZZ_ASSERT(call->mask_data, "out of memory");
        const int64_t shape[4] = {call->planes, 1, seq_len, seq_len};
        memcpy(call->shape, shape, sizeof shape);
        call->mask_arg = call->mask_data;
        call->shape_arg = call->shape;
        const unsigned how = next(r);
        /* Written out, a masked entry is -inf, -1e30 or -FLT_MAX: all hide their key. */
        const float hidden_value = how & 1 ? -INFINITY : how & 2 ? -1e30f : -FLT_MAX;
        for (int64_t p = 0; p < call->planes; p++)
            for (int64_t i = 0; i < seq_len; i++)
                for (int64_t j = 0; j < seq_len; j++) {
                    float value = 0.0f;
                    if (call->mask == MASK_CAUSAL)
                        value = causal_hides(i, j, config->sliding_window) ? hidden_value : 0.0f;
                    else if (call->mask == MASK_ANY)
                        value = mask_values[next(r) % 16];
                    call->mask_data[p * plane + i * seq_len + j] = value;
                }
        if (call->mask == MASK_BAD) {
            mask_ok = 0;
            switch (how % 6) {
            case 0: call->mask_arg = NULL; break;           /* a shape without its mask */
            case 1: call->shape_arg = NULL; break;          /* a mask without its shape */
            case 2: call->shape[0] = call->batch + 1; break;
            case 3: call->shape[1] = how & 8 ? 0 : 2; break;
            case 4: call->shape[2] = seq_len + 1; break;
            default: call->shape[3] = seq_len - 1; break;
            }
        }
    }

    /* layer.h: positions >= 0, below max_position_embeddings unless the RoPE
     * type is dynamic, and at most 2^40. */
    int positions_ok = call->largest <= SNEPPX_MAX_POSITIONS &&
                       (config->rope_scaling.type == SNEPPX_ROPE_DYNAMIC || call->largest < max_positions);
    for (int64_t i = 0; call->position_ids && i < call->tokens; i++)
        positions_ok &= call->position_ids[i] >= 0;
    call->valid = mask_ok && positions_ok;
    return hidden;
}

static void free_call(struct call *call)
{
    free(call->position_ids);
    free(call->mask_data);
}

/* ---- forwards and comparisons ------------------------------------------------ */

static float *floats(int64_t n)
{
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    FUZZ_ASSERT(p, "out of memory for %lld floats", (long long)n);
    return p;
}

static void forward(sneppx_layer *layer, int64_t batch, int64_t seq_len, const float *hidden, const float *mask,
                    const int64_t *shape, const int64_t *positions, float *out, const char *what)
{
    const sneppx_status status = sneppx_layer_forward(layer, batch, seq_len, hidden, mask, shape, positions, out);
    FUZZ_ASSERT(status == SNEPPX_OK, "%s forward of a valid layer: %s", what, sneppx_last_error());
}

/* Whether two outputs agree to 1e-4 of the reference's size (both sum the same
 * float32 products in other orders, with other exp approximations: a wide margin). */
static void agree(const float *got, const float *reference, int64_t n, const char *what, sneppx_layer *layer)
{
    double largest = 0, worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        FUZZ_ASSERT(isfinite(got[i]) && isfinite(reference[i]), "%s: output %lld: %g against %g", what,
                    (long long)i, got[i], reference[i]);
        largest = fmax(largest, fabs(reference[i]));
        if (fabs((double)got[i] - reference[i]) > worst) {
            worst = fabs((double)got[i] - reference[i]);
            at = i;
        }
    }
    FUZZ_ASSERT(worst <= 1e-4 * fmax(largest, 1e-3), "%s: differ by %g at %lld (outputs up to %g), keys:\n%s", what,
                worst, (long long)at, largest, sneppx_layer_keys(layer));
}

/* A refused call says why and leaves out as it was. */
static void refused(sneppx_layer *layer, const struct call *call, const float *hidden, float *out, int64_t n,
                    const char *what)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)i;
    const sneppx_status status = sneppx_layer_forward(layer, call->batch, call->seq_len, hidden, call->mask_arg,
                                                      call->shape_arg, call->position_ids, out);
    FUZZ_ASSERT(status == SNEPPX_ERR_INVALID_ARGUMENT && sneppx_last_error()[0] != '\0',
                "%s forward of a call layer.h refuses (positions up to %lld, mask %d): status %d: %s", what,
                (long long)call->largest, call->mask, (int)status, sneppx_last_error());
    for (int64_t i = 0; i < n; i++)
        FUZZ_ASSERT(out[i] == (float)i, "%s: a refused forward wrote out[%lld]", what, (long long)i);
}

/* The checks of an accepted call against other calls of the same layer (flash),
 * each a property the harness knows without a reference implementation. */
static void check_properties(sneppx_layer *layer, const sneppx_config *config, const struct call *call,
                             const float *hidden, const float *out)
{
    const int64_t seq_len = call->seq_len, hidden_size = config->hidden_size, row = seq_len * hidden_size;
    const int64_t plane = seq_len * seq_len;
    /* Dynamic RoPE past max_position_embeddings takes its frequencies from the
     * call's longest position: the other calls below would not share them. */
    const int dynamic_past = config->rope_scaling.type == SNEPPX_ROPE_DYNAMIC &&
                             call->largest + 1 > config->max_position_embeddings;
    float *other = floats(call->tokens * hidden_size);

    /* Each sequence alone, with its positions and its mask plane. */
    if (call->batch > 1 && !dynamic_past) {
        const int64_t alone_shape[4] = {1, 1, seq_len, seq_len};
        for (int64_t b = 0; b < call->batch; b++) {
            forward(layer, 1, seq_len, hidden + b * row,
                    call->mask_arg ? call->mask_data + (call->planes > 1 ? b : 0) * plane : NULL,
                    call->mask_arg ? alone_shape : NULL, call->position_ids ? call->position_ids + b * seq_len : NULL,
                    other, "one sequence of the batch");
            agree(out + b * row, other, row, "a sequence of the batch against itself alone", layer);
        }
    }

    /* The same call with NULL positions: the same, bit for bit, when the positions
     * were the default ones; to rounding when shifted (RoPE sees distances only). */
    if ((call->positions == POSITIONS_DEFAULT || call->positions == POSITIONS_SHIFTED) && !dynamic_past &&
        seq_len <= config->max_position_embeddings) {
        forward(layer, call->batch, seq_len, hidden, call->mask_arg, call->shape_arg, NULL, other, "NULL positions");
        if (call->positions == POSITIONS_DEFAULT)
            FUZZ_ASSERT(memcmp(other, out, sizeof(float) * (size_t)(call->tokens * hidden_size)) == 0,
                        "position_ids 0..seq_len-1 differ from NULL ones");
        else
            agree(out, other, call->tokens * hidden_size, "positions shifted by an offset against NULL positions",
                  layer);
    }

    /* The causal (+ window) mask written out: the NULL mask's output. */
    if (call->mask == MASK_CAUSAL) {
        forward(layer, call->batch, seq_len, hidden, NULL, NULL, call->position_ids, other, "NULL mask");
        agree(out, other, call->tokens * hidden_size, "the causal mask written out against the NULL mask", layer);
    }

    /* A query that sees no key: zero attention, so without an o bias a zero row. */
    if (call->mask == MASK_ANY && !config->o_bias) {
        for (int64_t b = 0; b < call->batch; b++)
            for (int64_t i = 0; i < seq_len; i++) {
                const float *mask_row = call->mask_data + (call->planes > 1 ? b : 0) * plane + i * seq_len;
                int64_t j = 0;
                while (j < seq_len && mask_row[j] <= -1e30f)
                    j++;
                if (j < seq_len)
                    continue;
                for (int64_t c = 0; c < hidden_size; c++)
                    FUZZ_ASSERT(out[(b * seq_len + i) * hidden_size + c] == 0.0f,
                                "sequence %lld, query %lld sees no key, yet its output %lld is %g", (long long)b,
                                (long long)i, (long long)c, out[(b * seq_len + i) * hidden_size + c]);
            }
    }
    free(other);
}

/* Dynamic RoPE whose call stays below max_position_embeddings is the default
 * RoPE: the same layer with the default type gives the same output. */
static void check_dynamic_as_default(const sneppx_config *config, const struct call *call, const float *hidden,
                                     const float *out)
{
    if (config->rope_scaling.type != SNEPPX_ROPE_DYNAMIC || call->largest + 1 > config->max_position_embeddings)
        return;
    sneppx_config plain = *config;
    memset(&plain.rope_scaling, 0, sizeof plain.rope_scaling);
    plain.rope_scaling.type = SNEPPX_ROPE_DEFAULT;
    sneppx_layer *layer = NULL;
    FUZZ_ASSERT(sneppx_layer_create(&plain, NULL, &layer) == SNEPPX_OK, "create of the default-RoPE config: %s",
                sneppx_last_error());
    float *other = floats(call->tokens * config->hidden_size);
    forward(layer, call->batch, call->seq_len, hidden, call->mask_arg, call->shape_arg, call->position_ids, other,
            "default RoPE");
    agree(out, other, call->tokens * config->hidden_size, "dynamic RoPE below max_position_embeddings against default",
          layer);
    free(other);
    sneppx_layer_destroy(layer);
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

    struct call call;
    float *hidden = decode_call(&r, &config, seq_len, &call);
    const int64_t n = call.tokens * config.hidden_size;
    float *flash = floats(n), *sdpa = floats(n);
    if (!call.valid) {
        refused(layer, &call, hidden, flash, n, "flash");
        FUZZ_ASSERT(sneppx_layer_set_flash(layer, 0) == SNEPPX_OK, "set_flash(0): %s", sneppx_last_error());
        refused(layer, &call, hidden, sdpa, n, "sdpa");
    } else {
        forward(layer, call.batch, seq_len, hidden, call.mask_arg, call.shape_arg, call.position_ids, flash, "flash");
        FUZZ_ASSERT(sneppx_layer_set_flash(layer, 0) == SNEPPX_OK, "set_flash(0): %s", sneppx_last_error());
        forward(layer, call.batch, seq_len, hidden, call.mask_arg, call.shape_arg, call.position_ids, sdpa, "sdpa");
        agree(flash, sdpa, n, "flash and sdpa", layer);
        FUZZ_ASSERT(sneppx_layer_set_flash(layer, 1) == SNEPPX_OK, "set_flash(1): %s", sneppx_last_error());
        check_properties(layer, &config, &call, hidden, flash);
        check_dynamic_as_default(&config, &call, hidden, flash);
    }
    sneppx_layer_destroy(layer);
    free_call(&call);
    free(hidden);
    free(flash);
    free(sdpa);
    return 0;
}
