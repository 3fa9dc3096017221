/* sneppx_config_rope_frequencies() and sneppx_config_softmax_scale() against
 * numbers derived by hand from docs/MODELS.md section 2 (the literals below; each
 * comment gives the formula they come from), then against the test's own
 * float64 reference (tests/support) for every preset and every RoPE type. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mha_reference.h"
#include "sneppx/config.h"
#include "test_util.h"

/* Hand values are exact to double rounding; the library computes them with
 * pow/log in double too, so 1e-12 relative leaves room only for libm ulps. */
#define HAND_TOLERANCE 1e-12

static test_tally tally;

static int close_to(double got, double want, double relative)
{
    return fabs(got - want) <= relative * fabs(want);
}

/* Frequencies of a config from the library, for positions up to max_position. */
static int library_freqs(const sneppx_config *config, int64_t max_position, double *inv_freq, int64_t len,
                         double *factor)
{
    sneppx_status status = sneppx_config_rope_frequencies(config, max_position, inv_freq, len, factor);
    return TEST_CHECK(&tally, status == SNEPPX_OK, "%s: %s", config->name, sneppx_last_error());
}

static void check_value(const char *what, int64_t i, double got, double want)
{
    TEST_CHECK(&tally, close_to(got, want, HAND_TOLERANCE), "%s inv_freq[%lld] = %.17g, hand value %.17g", what,
               (long long)i, got, want);
}

/* Llama 3.1 (d 128, theta 5e5, orig 8192, factor 8, low 1, high 4): wavelen_i =
 * 2 pi 5e5^(i/64); high_wl = 2048, low_wl = 8192. i = 28: 1956.5 < 2048, kept;
 * i = 29..34: 2401.7 .. 6695.1, smoothed; i = 35: 8218.7 > 8192, divided by 8. */
static void test_llama3(void)
{
    sneppx_config config;
    if (!TEST_CHECK(&tally, sneppx_config_from_name("llama3.1", "8B", &config) == SNEPPX_OK, "%s",
                    sneppx_last_error()))
        return;
    double inv[64], factor = 0;
    if (!library_freqs(&config, 16, inv, 64, &factor))
        return;
    /* ratio to the unscaled 5e5^(-i/64): smooth s = (8192/wl - 1)/3, ratio = (1-s)/8 + s. */
    static const double smoothed_ratio[6] = {0.8281684118371798, 0.6437431331275951, 0.49350712273197106,
                                             0.3711222795178447, 0.2714254770727862, 0.19021074364065016};
    for (int i = 0; i < 64; i++) {
        const double unscaled = pow(5e5, -(double)i / 64.0);
        const double ratio = i <= 28 ? 1.0 : i >= 35 ? 0.125 : smoothed_ratio[i - 29];
        check_value("llama3.1", i, inv[i], unscaled * ratio);
    }
    check_value("llama3.1", 0, inv[0], 1.0);
    check_value("llama3.1", 1, inv[1], 0.8146172338565447);      /* 5e5^(-1/64) */
    check_value("llama3.1", 28, inv[28], 0.003211445994752591);  /* kept */
    check_value("llama3.1", 29, inv[29], 0.002166570763503359);  /* s = 0.803621 */
    check_value("llama3.1", 30, inv[30], 0.0013718935677611381); /* s = 0.592849 */
    check_value("llama3.1", 34, inv[34], 0.0001785078127679964); /* s = 0.074527 */
    check_value("llama3.1", 35, inv[35], 9.556212353964683e-05); /* 5e5^(-35/64)/8 */
    check_value("llama3.1", 63, inv[63], 3.068925988914511e-07); /* 5e5^(-63/64)/8 */
    TEST_CHECK(&tally, factor == 1.0, "llama3.1 attention factor %.17g, want 1", factor);
}

/* Static NTK after extend_context(llama2-7B, 16384): theta' = 1e4 * 4^(128/126). */
static void test_extend_context(void)
{
    sneppx_config config;
    if (!TEST_CHECK(&tally, sneppx_config_from_name("llama2", "7B", &config) == SNEPPX_OK, "%s",
                    sneppx_last_error()))
        return;
    TEST_CHECK(&tally, sneppx_config_extend_context(&config, 16384) == SNEPPX_OK, "%s", sneppx_last_error());
    TEST_CHECK(&tally, close_to(config.rope_theta, 40889.94243248622, HAND_TOLERANCE),
               "extended rope_theta %.17g, hand value 40889.94243248622", config.rope_theta);
    TEST_CHECK(&tally, config.max_position_embeddings == 16384, "max_position_embeddings %lld, want 16384",
               (long long)config.max_position_embeddings);
    double inv[64], factor = 0;
    if (!library_freqs(&config, 16, inv, 64, &factor))
        return;
    check_value("ntk", 0, inv[0], 1.0);
    check_value("ntk", 1, inv[1], 0.8471171851512068);      /* theta'^(-2/128) */
    check_value("ntk", 63, inv[63], 2.8869549617236452e-05); /* theta'^(-126/128) */
    sneppx_config shrink = config;
    TEST_CHECK(&tally, sneppx_config_extend_context(&shrink, 8192) == SNEPPX_ERR_INVALID_ARGUMENT,
               "extend_context to fewer positions (8192 < 16384) must be rejected");
}

/* Static NTK's exponent is d/(d-2) with d the ROTARY dim, not head_dim: partial
 * rotary (d 64, 32 rotated): theta' = 1e4 * 4^(32/30); DeepSeek-V2-Lite (head_dim
 * 128 + 64, the 64 rope dims rotated): theta' = 1e4 * 2^(64/62). With head_dim they
 * would be 1e4 * 4^(64/62) = 41829.4 and 1e4 * 2^(192/190) (or 2^(128/126)). */
static void test_extend_context_rotary_dim(void)
{
    sneppx_config partial;
    sneppx_config_init(&partial);
    partial.hidden_size = 256;
    partial.num_attention_heads = partial.num_key_value_heads = 4;
    partial.rotary_dim = 32;
    partial.max_position_embeddings = 2048;
    sneppx_config reference = partial;
    TEST_CHECK(&tally, sneppx_config_extend_context(&partial, 8192) == SNEPPX_OK, "%s", sneppx_last_error());
    TEST_CHECK(&tally, close_to(partial.rope_theta, 43872.99918778503, HAND_TOLERANCE),
               "partial rotary (32 of 64 dims) extended rope_theta %.17g, hand value 43872.99918778503",
               partial.rope_theta);
    ref_extend_context(&reference, 8192);
    TEST_CHECK(&tally, close_to(partial.rope_theta, reference.rope_theta, HAND_TOLERANCE),
               "partial rotary extended rope_theta %.17g, reference %.17g", partial.rope_theta,
               reference.rope_theta);

    sneppx_config mla;
    if (!TEST_CHECK(&tally, sneppx_config_from_name("deepseek-v2", "lite", &mla) == SNEPPX_OK, "%s",
                    sneppx_last_error()))
        return;
    reference = mla;
    TEST_CHECK(&tally, sneppx_config_extend_context(&mla, 327680) == SNEPPX_OK, "%s", sneppx_last_error());
    TEST_CHECK(&tally, close_to(mla.rope_theta, 20452.228712025368, HAND_TOLERANCE),
               "deepseek-v2-lite (64 rope dims) extended rope_theta %.17g, hand value 20452.228712025368",
               mla.rope_theta);
    ref_extend_context(&reference, 327680);
    TEST_CHECK(&tally, close_to(mla.rope_theta, reference.rope_theta, HAND_TOLERANCE),
               "deepseek-v2-lite extended rope_theta %.17g, reference %.17g", mla.rope_theta, reference.rope_theta);
}

/* DeepSeek V2 YaRN over the 64 rope dims: corr dims 10.47 / 22.51 -> range (10, 23);
 * inv/base = 1 for i <= 10, 1 - (i-10)/13 * 0.975 up to 0.1 at i = 22, 1/40 after. */
static void test_yarn(const char *size)
{
    sneppx_config config;
    if (!TEST_CHECK(&tally, sneppx_config_from_name("deepseek-v2", size, &config) == SNEPPX_OK, "%s",
                    sneppx_last_error()))
        return;
    double inv[32], factor = 0;
    if (!library_freqs(&config, 16, inv, 32, &factor))
        return;
    char what[64];
    snprintf(what, sizeof what, "yarn deepseek-v2-%s", size);
    for (int i = 0; i < 32; i++) {
        const double ratio = i <= 10 ? 1.0 : i >= 23 ? 0.025 : 1.0 - (double)(i - 10) / 13.0 * 0.975;
        check_value(what, i, inv[i], pow(1e4, -(double)i / 32.0) * ratio);
    }
    check_value(what, 11, inv[11] / pow(1e4, -11.0 / 32.0), 0.925);
    check_value(what, 12, inv[12] / pow(1e4, -12.0 / 32.0), 0.85);
    check_value(what, 22, inv[22] / pow(1e4, -22.0 / 32.0), 0.1);
    TEST_CHECK(&tally, factor == 1.0, "%s attention factor %.17g, want exactly 1 (mscale 0.707/0.707)", what,
               factor);
    /* 192^-0.5 * (1 + 0.0707 ln 40)^2 = 0.0721687836 * 1.2608037774^2 */
    const double scale = sneppx_config_softmax_scale(&config);
    TEST_CHECK(&tally, fabs(scale - 0.1147213868) < 1e-10, "%s softmax scale %.12f, want 0.1147213868", what,
               scale);
}

static sneppx_config hand_config(sneppx_rope_type type, double factor)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 256;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 4;
    config.max_position_embeddings = 2048;
    config.rope_scaling.type = type;
    config.rope_scaling.factor = factor;
    return config;
}

static void test_hand_types(void)
{
    double inv[64], factor = 0;
    sneppx_config config = hand_config(SNEPPX_ROPE_DEFAULT, 1.0);
    if (library_freqs(&config, 100000, inv, 32, &factor)) {
        check_value("default d64", 1, inv[1], pow(1e4, -2.0 / 64.0));
        check_value("default d64", 31, inv[31], pow(1e4, -62.0 / 64.0));
        TEST_CHECK(&tally, factor == 1.0, "default attention factor %.17g", factor);
    }
    config = hand_config(SNEPPX_ROPE_LINEAR, 4.0);
    if (library_freqs(&config, 100000, inv, 32, &factor))
        check_value("linear f4", 5, inv[5], 0.05928434264154138); /* 1e4^(-10/64) / 4 */
    /* Dynamic NTK, factor 2, MPE 2048: at 2048 positions exactly default; at 4096,
     * base' = 1e4 * (2*4096/2048 - 1)^(64/62) = 31082.236667168814. */
    config = hand_config(SNEPPX_ROPE_DYNAMIC, 2.0);
    if (library_freqs(&config, 2048, inv, 32, &factor))
        check_value("dynamic at MPE", 1, inv[1], pow(1e4, -2.0 / 64.0));
    if (library_freqs(&config, 4096, inv, 32, &factor)) {
        check_value("dynamic 2xMPE", 1, inv[1], 0.7237840223942559);
        check_value("dynamic 2xMPE", 31, inv[31], 4.4450714405444134e-05);
    }
    config = hand_config(SNEPPX_ROPE_DEFAULT, 1.0);
    config.rotary_dim = 32; /* partial rotary: frequencies over the rotated dims */
    if (library_freqs(&config, 16, inv, 16, &factor))
        check_value("partial r32", 3, inv[3], 0.1778279410038923); /* 1e4^(-6/32) */
    sneppx_config llama3;
    if (sneppx_config_from_name("llama3", "8B", &llama3) == SNEPPX_OK &&
        library_freqs(&llama3, 16, inv, 64, &factor))
        check_value("llama3-8B", 10, inv[10], 0.12868737343265052); /* 5e5^(-20/128) */
    /* YaRN without mscale: attention factor 0.1 ln 4 + 1 (HF get_mscale(factor)). */
    config = hand_config(SNEPPX_ROPE_YARN, 4.0);
    config.rope_scaling.original_max_position_embeddings = 512;
    if (library_freqs(&config, 16, inv, 32, &factor))
        TEST_CHECK(&tally, close_to(factor, 0.1 * log(4.0) + 1.0, HAND_TOLERANCE),
                   "yarn f4 attention factor %.17g, want 1.1386294361119891", factor);
}

/* Every preset and a grid of hand configs: library == the test's reference. */
static void test_against_reference(void)
{
    double got[128], want[128], got_factor, want_factor;
    for (int p = 0; p < sneppx_preset_count(); p++) {
        sneppx_config config;
        if (sneppx_config_from_name(sneppx_preset_name(p), NULL, &config) != SNEPPX_OK)
            continue;
        ref_dims dims;
        ref_dims_of(&config, &dims);
        if (!library_freqs(&config, 16, got, 128, &got_factor))
            continue;
        ref_rope_inv_freq(&config, 16, want, &want_factor);
        double worst = fabs(got_factor - want_factor);
        for (int64_t i = 0; i < dims.rotary_dim / 2; i++) {
            const double err = fabs(got[i] - want[i]) / want[i];
            if (isnan(err) || err > worst) /* a NaN sticks (fmax drops it) */
                worst = err;
        }
        TEST_CHECK(&tally, worst <= HAND_TOLERANCE, "preset %s: library vs reference relative error %.3g",
                   config.name, worst);
        const double scale = sneppx_config_softmax_scale(&config), want_scale = ref_softmax_scale(&config);
        TEST_CHECK(&tally, close_to(scale, want_scale, HAND_TOLERANCE), "preset %s: softmax scale %.17g, reference %.17g",
                   config.name, scale, want_scale);
    }
    /* MLA's softmax scale under every type: DeepSeek's code takes mscale_all_dim beside
     * any scaled type, and a reference that kept the yarn-only rule agreed on the presets. */
    sneppx_config mla;
    if (TEST_CHECK(&tally, sneppx_config_from_name("deepseek-v2", "lite", &mla) == SNEPPX_OK, "%s",
                   sneppx_last_error()))
        for (int type = 0; type < SNEPPX_ROPE_TYPE_COUNT; type++) {
            sneppx_config config = mla;
            config.rope_scaling.type = (sneppx_rope_type)type;
            const double scale = sneppx_config_softmax_scale(&config), want_scale = ref_softmax_scale(&config);
            TEST_CHECK(&tally, close_to(scale, want_scale, HAND_TOLERANCE),
                       "MLA type %d: softmax scale %.17g, reference %.17g", type, scale, want_scale);
        }
    /* Every type of the enum: one the reference lacks fails here. */
    for (int type = 0; type < SNEPPX_ROPE_TYPE_COUNT; type++) {
        for (int64_t seq_len = 1000; seq_len <= 9000; seq_len += 4000) {
            sneppx_config config = hand_config((sneppx_rope_type)type, 3.0);
            config.rope_scaling.low_freq_factor = 1.0;
            config.rope_scaling.high_freq_factor = 4.0;
            config.rope_scaling.original_max_position_embeddings = 256;
            config.rope_scaling.mscale = 0.8;
            config.rope_scaling.mscale_all_dim = 0.5;
            if (!library_freqs(&config, seq_len, got, 128, &got_factor))
                continue;
            ref_rope_inv_freq(&config, seq_len, want, &want_factor);
            double worst = fabs(got_factor - want_factor);
            for (int i = 0; i < 32; i++) {
                const double err = fabs(got[i] - want[i]) / want[i];
                if (isnan(err) || err > worst)
                    worst = err;
            }
            TEST_CHECK(&tally, worst <= HAND_TOLERANCE, "type %d seq %lld: library vs reference %.3g",
                       type, (long long)seq_len, worst);
        }
    }
}

int main(void)
{
    test_llama3();
    test_extend_context();
    test_extend_context_rotary_dim();
    test_yarn("236B");
    test_yarn("lite");
    test_hand_types();
    test_against_reference();
    return test_finish(&tally);
}
