/* One forward case through the layer (flash and SDPA) against the reference. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mha_reference.h"
#include "sneppx/layer.h"
#include "test_forward_case.h"

/* Floats after the output that the layer must not touch. */
#define CANARY_FLOATS 16
static const float canary_value = 12345.0f;

int test_force_reference(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = test_env_flag("SNEPPX_TEST_FORCE_REFERENCE");
    return cached;
}

void test_group_begin(test_group *group, const char *format, ...)
{
    memset(group, 0, sizeof *group);
    va_list args;
    va_start(args, format);
    vsnprintf(group->name, sizeof group->name, format, args);
    va_end(args);
}

void test_group_end(const test_group *group)
{
    printf("[%s] %d cases: %d passed, %d failed, %d skipped; worst vs reference max %.2e rms %.2e; "
           "flash vs sdpa max %.2e%s%s\n",
           group->name, group->cases, group->passed, group->failed, group->skipped, group->worst_ref_max,
           group->worst_ref_rms, group->worst_pair_max, group->worst_case[0] ? "; worst: " : "",
           group->worst_case);
    fflush(stdout);
}

/* An output buffer: NaN where the layer must write, canaries after it. */
static float *output_buffer(int64_t n)
{
    float *out = malloc((size_t)(n + CANARY_FLOATS) * sizeof *out);
    if (!out)
        return NULL;
    for (int64_t i = 0; i < n; i++)
        out[i] = NAN;
    for (int i = 0; i < CANARY_FLOATS; i++)
        out[n + i] = canary_value;
    return out;
}

static int canaries_intact(const float *out, int64_t n)
{
    for (int i = 0; i < CANARY_FLOATS; i++)
        if (out[n + i] != canary_value)
            return 0;
    return 1;
}

static void describe_error(const test_error *e, const test_inputs *in, char *text, size_t size)
{
    const int64_t row = e->worst_index / in->hidden;
    snprintf(text, size, "max %.3e (abs %.3e of %.3e) rms %.3e non-finite %lld at [b%lld s%lld h%lld]",
             e->max_normalized, e->max_abs, e->want_max_abs, e->rms_relative, (long long)e->non_finite,
             (long long)(row / in->seq_len), (long long)(row % in->seq_len),
             (long long)(e->worst_index % in->hidden));
}

/* Runs the layer once with flash and once with SDPA. Returns 1 on success, -1 on
 * a failed check. */
static int run_layer(test_tally *tally, const test_case *t, const char *what, float *flash, float *sdpa)
{
    const test_inputs *in = t->inputs;
    sneppx_layer *layer = NULL;
    sneppx_status status = sneppx_layer_create(t->config, t->weights ? &t->weights->view : NULL, &layer);
    if (!TEST_CHECK(tally, status == SNEPPX_OK, "%s: sneppx_layer_create: %s: %s", what,
                    sneppx_status_name(status), sneppx_last_error()))
        return -1;
    int ok = 1;
    const sneppx_config *held = sneppx_layer_config(layer);
    ok &= TEST_CHECK(tally, held && held->hidden_size == t->config->hidden_size,
                     "%s: sneppx_layer_config() does not give back the config", what);
    if (t->expect_key) {
        const char *keys = sneppx_layer_keys(layer);
        ok &= TEST_CHECK(tally, keys && strstr(keys, t->expect_key), "%s: keys lack '%s':\n%s", what,
                         t->expect_key, keys ? keys : "(null)");
    }
    for (int flash_on = 1; flash_on >= 0 && ok; flash_on--) {
        float *out = flash_on ? flash : sdpa;
        status = sneppx_layer_set_flash(layer, flash_on);
        ok &= TEST_CHECK(tally, status == SNEPPX_OK, "%s: set_flash(%d): %s", what, flash_on, sneppx_last_error());
        if (!ok)
            break;
        status = sneppx_layer_forward(layer, in->batch, in->seq_len, in->hidden_states, in->mask,
                                      test_inputs_mask_shape(in), in->position_ids, out);
        ok &= TEST_CHECK(tally, status == SNEPPX_OK, "%s %s: sneppx_layer_forward: %s: %s", what,
                         flash_on ? "flash" : "sdpa", sneppx_status_name(status), sneppx_last_error());
    }
    sneppx_layer_destroy(layer);
    return ok ? 1 : -1;
}

static void note_worst(test_group *group, double max_normalized, const char *what)
{
    if (max_normalized >= group->worst_ref_max) {
        group->worst_ref_max = max_normalized;
        snprintf(group->worst_case, sizeof group->worst_case, "%s", what);
    }
}

void test_run_case(test_tally *tally, test_group *group, const test_case *t)
{
    const test_inputs *in = t->inputs;
    const int64_t n = in->batch * in->seq_len * in->hidden;
    const sneppx_config *ref_config = t->reference_config ? t->reference_config : t->config;
    char config_text[256], what[400];
    test_describe_config(t->config, config_text, sizeof config_text);
    snprintf(what, sizeof what, "%s | %s b%lld s%lld", config_text, t->label, (long long)in->batch,
             (long long)in->seq_len);
    group->cases++;
    const int failed_before = tally->failed;
    int ran = -1; /* 1 ran, 0 skipped, -1 failed before comparing */

    float *flash = output_buffer(n), *sdpa = output_buffer(n);
    double *want = t->weights ? malloc((size_t)n * sizeof *want) : NULL;
    if (!TEST_CHECK(tally, flash && sdpa && (want || !t->weights), "%s: out of memory", what))
        goto done;
    if (t->weights) {
        const char *problem = ref_mha_forward(ref_config, &t->weights->view, in->batch, in->seq_len,
                                              in->hidden_states, in->mask, in->position_ids, want);
        if (!TEST_CHECK(tally, problem == NULL, "%s: reference: %s", what, problem))
            goto done;
    }
    if (test_force_reference()) {
        if (!t->weights) {
            printf("SKIP %s: forced reference needs weights, this case uses synthetic ones\n", what);
            ran = 0;
        } else {
            for (int64_t i = 0; i < n; i++)
                flash[i] = sdpa[i] = (float)want[i];
            ran = 1;
        }
    } else {
        ran = run_layer(tally, t, what, flash, sdpa);
    }
    if (ran == 0) {
        group->skipped++;
        tally->skipped++;
        goto done;
    }
    if (ran < 0)
        goto done;

    char detail[200];
    TEST_CHECK(tally, canaries_intact(flash, n) && canaries_intact(sdpa, n),
               "%s: the layer wrote past out[batch*seq_len*hidden]", what);
    const test_error pair = test_compare_float(flash, sdpa, n);
    describe_error(&pair, in, detail, sizeof detail);
    TEST_CHECK(tally, test_error_within(&pair, TEST_PAIR_MAX_NORMALIZED, TEST_PAIR_RMS_RELATIVE),
               "%s: flash vs sdpa %s (limits max %.0e rms %.0e)", what, detail, TEST_PAIR_MAX_NORMALIZED,
               TEST_PAIR_RMS_RELATIVE);
    group->worst_pair_max = fmax(group->worst_pair_max, pair.non_finite ? INFINITY : pair.max_normalized);
    for (int flash_on = 1; flash_on >= 0 && t->weights; flash_on--) {
        const test_error e = test_compare(flash_on ? flash : sdpa, want, n);
        describe_error(&e, in, detail, sizeof detail);
        TEST_CHECK(tally, test_error_within(&e, TEST_REF_MAX_NORMALIZED, TEST_REF_RMS_RELATIVE),
                   "%s: %s vs reference %s (limits max %.0e rms %.0e)", what, flash_on ? "flash" : "sdpa", detail,
                   TEST_REF_MAX_NORMALIZED, TEST_REF_RMS_RELATIVE);
        note_worst(group, e.non_finite ? INFINITY : e.max_normalized, what);
        group->worst_ref_rms = fmax(group->worst_ref_rms, e.non_finite ? INFINITY : e.rms_relative);
    }
    if (!t->weights) {
        /* Synthetic weights: no reference; the output must at least be finite. */
        const test_error self = test_compare_float(flash, flash, n);
        TEST_CHECK(tally, self.non_finite == 0, "%s: %lld non-finite outputs (synthetic weights)", what,
                   (long long)self.non_finite);
    }
done:
    if (tally->failed > failed_before)
        group->failed++;
    else if (ran == 1)
        group->passed++;
    free(flash);
    free(sdpa);
    free(want);
}
