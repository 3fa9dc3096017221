/* ctest: two cores (threads or processes of its own; ctest -j2 runs it alone) */
/* Concurrency of the public API.
 *
 * 1. Layers of five architectures (GQA, sliding window, Qwen2-style bias with
 *    partial rotary and llama3 scaling, MLA with q LoRA, naive MLA) created and
 *    run from five threads at once on a cold private cache: each output equals
 *    the float64 reference within the harness's thresholds and, bitwise, a
 *    serial re-run; every distinct kernel key was compiled exactly once.
 * 2. One layer, four threads calling forward at once, each with its own shape
 *    and mask mode, while a fifth thread switches flash/SDPA and reads the
 *    read-only API: every output equals, bitwise, the serial output of the
 *    attention kernel that was active (flash or SDPA).
 * 3. A layer's first explicit-mask forward resolves that attention kernel and
 *    adds it to the layer's kernel list while another thread reads the list
 *    (keys, count, timings): the reader sees the list before or after the
 *    line, whole, and a key string returned earlier is not changed under its
 *    holder.
 * 4. Two threads switch one layer to flash and to SDPA at the same moment,
 *    round after round: after each round the layer's config says the
 *    attention its forwards run (TSan also sees the two switches' writes).
 *
 * Bitwise is the right bar: a forward's arithmetic is a fixed set of
 * independent tiles (no reduction across threads), so its result does not
 * depend on which thread ran which tile or on what other calls are doing. */
#include "test_cache_common.h"

#include <pthread.h>
#include <stdatomic.h>

#include "layer_internal.h"
#include "mha_reference.h"
#include "sneppx/sneppx.h"
#include "test_forward_case.h"
#include "test_inputs.h"
#include "test_weights.h"

/* ---- 1. several architectures at once ---------------------------------------- */

enum { ARCHS = 5 };

struct arch_run {
    const char *name;
    sneppx_config config;
    test_weights weights;
    test_inputs inputs;
    float *out;              /* concurrent run */
    sneppx_status status;
    char error[512];
    char keys[2048];         /* sneppx_layer_keys() of the concurrent layer */
};

static pthread_barrier_t arch_start;

static void arch_configs(struct arch_run runs[ARCHS])
{
    sneppx_config *c;
    runs[0].name = "gqa";
    c = &runs[0].config;
    sneppx_config_init(c);
    c->hidden_size = 128, c->num_attention_heads = 8, c->num_key_value_heads = 2, c->head_dim = 16;
    c->qkv_bias = c->o_bias = 0;

    runs[1].name = "window";
    c = &runs[1].config;
    sneppx_config_init(c);
    c->hidden_size = 128, c->num_attention_heads = 4, c->num_key_value_heads = 1, c->head_dim = 32;
    c->sliding_window = 9, c->qkv_bias = c->o_bias = 0, c->rope_theta = 1e6;

    runs[2].name = "bias+partial+llama3";
    c = &runs[2].config;
    sneppx_config_init(c);
    c->hidden_size = 192, c->num_attention_heads = 3, c->num_key_value_heads = 3, c->head_dim = 64;
    c->rotary_dim = 32, c->qkv_bias = 1, c->o_bias = 0, c->rope_theta = 5e5, c->max_position_embeddings = 2048;
    c->rope_scaling = (sneppx_rope_scaling){.type = SNEPPX_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1,
                                            .high_freq_factor = 4, .original_max_position_embeddings = 256};

    runs[3].name = "mla";
    c = &runs[3].config;
    sneppx_config_init(c);
    c->hidden_size = 128, c->num_attention_heads = 4, c->num_key_value_heads = 4;
    c->q_lora_rank = 48, c->kv_lora_rank = 64, c->qk_nope_head_dim = 16, c->qk_rope_head_dim = 16;
    c->v_head_dim = 32, c->qkv_bias = c->o_bias = 0, c->rope_interleaved = 1;
    c->rope_scaling = (sneppx_rope_scaling){.type = SNEPPX_ROPE_YARN, .factor = 40, .beta_fast = 32,
                                            .beta_slow = 1, .mscale = 0.707, .mscale_all_dim = 0.707,
                                            .original_max_position_embeddings = 64};

    runs[4].name = "mla-naive";
    runs[4].config = runs[3].config;
    runs[4].config.q_lora_rank = 0;
    runs[4].config.mla_naive = 1;
}

static void *run_arch(void *context)
{
    struct arch_run *run = context;
    sneppx_layer *layer = NULL;
    pthread_barrier_wait(&arch_start);
    run->status = sneppx_layer_create(&run->config, &run->weights.view, &layer);
    if (run->status == SNEPPX_OK)
        run->status = sneppx_layer_forward(layer, run->inputs.batch, run->inputs.seq_len, run->inputs.hidden_states,
                                           run->inputs.mask, test_inputs_mask_shape(&run->inputs),
                                           run->inputs.position_ids, run->out);
    snprintf(run->error, sizeof run->error, "%s", sneppx_last_error());
    snprintf(run->keys, sizeof run->keys, "%s", sneppx_layer_keys(layer));
    sneppx_layer_destroy(layer);
    return NULL;
}

/* Distinct lines over every run's key list. */
static int distinct_keys(const struct arch_run runs[ARCHS])
{
    char seen[64][SNEPPX_CACHE_KEY_MAX];
    int count = 0;
    for (int r = 0; r < ARCHS; r++) {
        char copy[sizeof runs[r].keys];
        memcpy(copy, runs[r].keys, sizeof copy);
        char *save = NULL;
        for (char *key = strtok_r(copy, "\n", &save); key; key = strtok_r(NULL, "\n", &save)) {
            int known = 0;
            for (int i = 0; i < count; i++)
                known |= strcmp(seen[i], key) == 0;
            if (!known && count < 64)
                snprintf(seen[count++], SNEPPX_CACHE_KEY_MAX, "%s", key);
        }
    }
    return count;
}

static void check_arch(test_tally *tally, struct arch_run *run)
{
    const int64_t n = run->inputs.batch * run->inputs.seq_len * run->config.hidden_size;
    if (!TEST_CHECK(tally, run->status == SNEPPX_OK, "%s: concurrent create/forward: %s %s", run->name,
                    sneppx_status_name(run->status), run->error))
        return;
    double *want = malloc(sizeof(double) * (size_t)n);
    float *serial = malloc(sizeof(float) * (size_t)n);
    const char *problem = ref_mha_forward(&run->config, &run->weights.view, run->inputs.batch, run->inputs.seq_len,
                                          run->inputs.hidden_states, run->inputs.mask, run->inputs.position_ids,
                                          want);
    if (TEST_CHECK(tally, problem == NULL, "%s: reference: %s", run->name, problem ? problem : "")) {
        test_error error = test_compare(run->out, want, n);
        TEST_CHECK(tally, test_error_within(&error, TEST_REF_MAX_NORMALIZED, TEST_REF_RMS_RELATIVE),
                   "%s: vs float64 reference: max %.3g rms %.3g non-finite %lld (limits %.0e, %.0e)", run->name,
                   error.max_normalized, error.rms_relative, (long long)error.non_finite, TEST_REF_MAX_NORMALIZED,
                   TEST_REF_RMS_RELATIVE);
    }
    sneppx_layer *layer = NULL;
    sneppx_status status = sneppx_layer_create(&run->config, &run->weights.view, &layer);
    if (status == SNEPPX_OK)
        status = sneppx_layer_forward(layer, run->inputs.batch, run->inputs.seq_len, run->inputs.hidden_states,
                                      run->inputs.mask, test_inputs_mask_shape(&run->inputs),
                                      run->inputs.position_ids, serial);
    TEST_CHECK(tally, status == SNEPPX_OK && memcmp(serial, run->out, sizeof(float) * (size_t)n) == 0,
               "%s: serial re-run %s, concurrent output %s", run->name, sneppx_status_name(status),
               status == SNEPPX_OK && memcmp(serial, run->out, sizeof(float) * (size_t)n) == 0 ? "bitwise equal"
                                                                                               : "DIFFERS");
    sneppx_layer_destroy(layer);
    free(want);
    free(serial);
}

static void test_architectures_at_once(test_tally *tally)
{
    struct arch_run runs[ARCHS];
    memset(runs, 0, sizeof runs);
    arch_configs(runs);
    const test_mask_mode modes[ARCHS] = {TEST_MASK_CAUSAL, TEST_MASK_CAUSAL, TEST_MASK_EXPLICIT,
                                         TEST_MASK_CAUSAL, TEST_MASK_LEFT_PADDING};
    for (int r = 0; r < ARCHS; r++) {
        const sneppx_config *c = &runs[r].config;
        if (test_weights_random(c, 100 + (uint64_t)r, &runs[r].weights) != 0 ||
            test_inputs_make(modes[r], 2, 37 + 9 * r, c->hidden_size, c->sliding_window, 200 + (uint64_t)r,
                             &runs[r].inputs) != 0 ||
            !(runs[r].out = calloc((size_t)(runs[r].inputs.batch * runs[r].inputs.seq_len * c->hidden_size),
                                   sizeof(float)))) {
            TEST_CHECK(tally, 0, "%s: out of memory preparing the case", runs[r].name);
            return;
        }
    }
    sneppx_jit_stats before, after;
    sneppx_jit_stats_get(&before);
    pthread_t threads[ARCHS];
    pthread_barrier_init(&arch_start, NULL, ARCHS);
    for (int r = 0; r < ARCHS; r++)
        pthread_create(&threads[r], NULL, run_arch, &runs[r]);
    for (int r = 0; r < ARCHS; r++)
        pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&arch_start);
    sneppx_jit_stats_get(&after);

    const int keys = distinct_keys(runs);
    TEST_CHECK(tally, after.compiles - before.compiles == (uint64_t)keys && after.disk_hits == before.disk_hits,
               "%d architectures at once on a cold cache: %llu compiles, %llu disk hits for %d distinct keys "
               "(each key compiled exactly once)", ARCHS, (unsigned long long)(after.compiles - before.compiles),
               (unsigned long long)(after.disk_hits - before.disk_hits), keys);
    for (int r = 0; r < ARCHS; r++) {
        check_arch(tally, &runs[r]);
        test_weights_free(&runs[r].weights);
        test_inputs_free(&runs[r].inputs);
        free(runs[r].out);
    }
}

/* ---- 2. one layer, many callers ------------------------------------------------- */

enum { CALLERS = 4, CALLS_PER_CALLER = 6, HIDDEN = 256 };

struct caller {
    sneppx_layer *layer;
    test_inputs inputs;
    float *expected[2];      /* serial outputs with SDPA [0] and flash [1] */
    float *out;
    int mismatches, failures;
    char error[512];
};

static pthread_barrier_t caller_start;
static atomic_int callers_running;

static void *call_forward(void *context)
{
    struct caller *caller = context;
    const test_inputs *in = &caller->inputs;
    const size_t bytes = sizeof(float) * (size_t)(in->batch * in->seq_len * HIDDEN);
    pthread_barrier_wait(&caller_start);
    for (int call = 0; call < CALLS_PER_CALLER; call++) {
        memset(caller->out, 0, bytes);
        sneppx_status status = sneppx_layer_forward(caller->layer, in->batch, in->seq_len, in->hidden_states,
                                                    in->mask, test_inputs_mask_shape(in), in->position_ids,
                                                    caller->out);
        if (status != SNEPPX_OK) {
            caller->failures++;
            snprintf(caller->error, sizeof caller->error, "%s", sneppx_last_error());
        } else if (memcmp(caller->out, caller->expected[0], bytes) != 0 &&
                   memcmp(caller->out, caller->expected[1], bytes) != 0) {
            caller->mismatches++;
        }
    }
    atomic_fetch_sub(&callers_running, 1);
    return NULL;
}

struct meddler {
    sneppx_layer *layer;
    int switches, failures;
    char error[512];
};

/* Switches flash/SDPA and reads the read-only API until the callers finish. */
static void *meddle(void *context)
{
    struct meddler *meddler = context;
    pthread_barrier_wait(&caller_start);
    for (int i = 0; atomic_load(&callers_running) > 0; i++) {
        sneppx_config preset;
        sneppx_jit_stats stats;
        sneppx_kernel_timing timing;
        int ok = sneppx_layer_set_flash(meddler->layer, i % 2) == SNEPPX_OK &&
                 sneppx_config_from_name("llama3", "8B", &preset) == SNEPPX_OK &&
                 sneppx_jit_stats_get(&stats) == SNEPPX_OK &&
                 sneppx_layer_kernel_timing(meddler->layer, 0, &timing) == SNEPPX_OK &&
                 sneppx_layer_keys(meddler->layer)[0] != '\0' && sneppx_layer_kernel_count(meddler->layer) > 0 &&
                 sneppx_layer_flops(meddler->layer, 1, 8) > 0;
        if (!ok) {
            meddler->failures++;
            snprintf(meddler->error, sizeof meddler->error, "%s", sneppx_last_error());
        }
        meddler->switches++;
    }
    return NULL;
}

/* The parts' layer: 8 query heads over 2 K/V heads of d 32, synthetic weights; NULL
 * (and a failed check) when it cannot be made. */
static sneppx_layer *small_layer(test_tally *tally, int64_t sliding_window, int num_threads,
                                 sneppx_config *config)
{
    sneppx_config_init(config);
    config->hidden_size = HIDDEN, config->num_attention_heads = 8, config->num_key_value_heads = 2;
    config->head_dim = 32, config->sliding_window = sliding_window, config->num_threads = num_threads;
    sneppx_layer *layer = NULL;
    TEST_CHECK(tally, sneppx_layer_create(config, NULL, &layer) == SNEPPX_OK, "layer: %s", sneppx_last_error());
    return layer;
}

static void test_one_layer_many_callers(test_tally *tally)
{
    sneppx_config config;
    sneppx_layer *layer = small_layer(tally, 40, 0, &config);
    if (!layer)
        return;
    struct caller callers[CALLERS];
    memset(callers, 0, sizeof callers);
    /* Different shapes and mask modes: workspaces of several sizes in the pool at once. */
    const test_mask_mode modes[CALLERS] = {TEST_MASK_CAUSAL, TEST_MASK_EXPLICIT, TEST_MASK_LEFT_PADDING,
                                           TEST_MASK_CAUSAL};
    int ready = 1;
    for (int t = 0; t < CALLERS; t++) {
        struct caller *c = &callers[t];
        c->layer = layer;
        ready &= test_inputs_make(modes[t], 1 + t % 2, 45 + 31 * t, HIDDEN, config.sliding_window, 300 + (uint64_t)t,
                                  &c->inputs) == 0;
        const size_t count = (size_t)(c->inputs.batch * c->inputs.seq_len * HIDDEN);
        for (int flash = 0; flash < 2 && ready; flash++) {
            ready &= (c->expected[flash] = malloc(count * sizeof(float))) != NULL &&
                     sneppx_layer_set_flash(layer, flash) == SNEPPX_OK &&
                     sneppx_layer_forward(layer, c->inputs.batch, c->inputs.seq_len, c->inputs.hidden_states,
                                          c->inputs.mask, test_inputs_mask_shape(&c->inputs),
                                          c->inputs.position_ids, c->expected[flash]) == SNEPPX_OK;
        }
        ready &= (c->out = malloc(count * sizeof(float))) != NULL;
    }
    if (TEST_CHECK(tally, ready, "serial runs: %s", sneppx_last_error())) {
        struct meddler meddler = {.layer = layer};
        pthread_t threads[CALLERS + 1];
        atomic_store(&callers_running, CALLERS);
        pthread_barrier_init(&caller_start, NULL, CALLERS + 1);
        for (int t = 0; t < CALLERS; t++)
            pthread_create(&threads[t], NULL, call_forward, &callers[t]);
        pthread_create(&threads[CALLERS], NULL, meddle, &meddler);
        for (int t = 0; t <= CALLERS; t++)
            pthread_join(threads[t], NULL);
        pthread_barrier_destroy(&caller_start);
        for (int t = 0; t < CALLERS; t++)
            TEST_CHECK(tally, callers[t].failures == 0 && callers[t].mismatches == 0,
                       "caller %d (%s, batch %lld, seq %lld): %d of %d calls failed (%s), %d differ bitwise from "
                       "both serial outputs", t, test_mask_mode_name(modes[t]), (long long)callers[t].inputs.batch,
                       (long long)callers[t].inputs.seq_len, callers[t].failures, CALLS_PER_CALLER,
                       callers[t].error, callers[t].mismatches);
        TEST_CHECK(tally, meddler.failures == 0 && meddler.switches > 0,
                   "flash/SDPA switches and API reads beside the callers: %d of %d failed (%s)", meddler.failures,
                   meddler.switches, meddler.error);
    }
    for (int t = 0; t < CALLERS; t++) {
        test_inputs_free(&callers[t].inputs);
        free(callers[t].expected[0]);
        free(callers[t].expected[1]);
        free(callers[t].out);
    }
    sneppx_layer_destroy(layer);
}

/* ---- 3. the kernel list read while a forward adds to it ------------------------------ */

struct list_reader {
    sneppx_layer *layer;
    atomic_int stop;
    int reads, torn, lines_before;
};

static int count_lines(const char *text)
{
    int lines = 0;
    for (; *text; text++)
        lines += *text == '\n';
    return lines;
}

static void *read_kernel_list(void *context)
{
    struct list_reader *reader = context;
    do {
        const char *keys = sneppx_layer_keys(reader->layer);
        const size_t length = strlen(keys);
        const int lines = count_lines(keys), count = sneppx_layer_kernel_count(reader->layer);
        sneppx_kernel_timing timing;
        reader->torn += length == 0 || keys[length - 1] != '\n' || lines < reader->lines_before ||
                        lines > reader->lines_before + 1 || count < reader->lines_before ||
                        sneppx_layer_kernel_timing(reader->layer, count - 1, &timing) != SNEPPX_OK ||
                        timing.key[0] == '\0';
        reader->reads++;
    } while (!atomic_load(&reader->stop));
    return NULL;
}

static void test_kernel_list_beside_resolution(test_tally *tally)
{
    sneppx_config config;
    sneppx_layer *layer = small_layer(tally, 0, 1, &config);
    test_inputs inputs;
    if (!layer)
        return;
    if (!TEST_CHECK(tally, test_inputs_make(TEST_MASK_EXPLICIT, 1, 9, HIDDEN, 0, 77, &inputs) == 0, "inputs")) {
        sneppx_layer_destroy(layer);
        return;
    }
    float *out = malloc(sizeof(float) * (size_t)(inputs.batch * inputs.seq_len * HIDDEN));
    const char *keys_before = sneppx_layer_keys(layer);
    char copy_before[2048];
    snprintf(copy_before, sizeof copy_before, "%s", keys_before);
    struct list_reader reader = {.layer = layer, .lines_before = count_lines(keys_before)};
    pthread_t thread;
    pthread_create(&thread, NULL, read_kernel_list, &reader);
    const sneppx_status status =
        out ? sneppx_layer_forward(layer, inputs.batch, inputs.seq_len, inputs.hidden_states, inputs.mask,
                                   test_inputs_mask_shape(&inputs), inputs.position_ids, out)
            : SNEPPX_ERR_OUT_OF_MEMORY;
    atomic_store(&reader.stop, 1);
    pthread_join(thread, NULL);
    TEST_CHECK(tally, status == SNEPPX_OK, "explicit-mask forward: %s", sneppx_last_error());
    TEST_CHECK(tally, count_lines(sneppx_layer_keys(layer)) == reader.lines_before + 1 &&
                          sneppx_layer_kernel_count(layer) == reader.lines_before + 1,
               "the explicit-mask forward adds one kernel to the %d listed: %d lines, count %d", reader.lines_before,
               count_lines(sneppx_layer_keys(layer)), sneppx_layer_kernel_count(layer));
    TEST_CHECK(tally, strcmp(keys_before, copy_before) == 0,
               "the key string returned before the forward is unchanged after it: '%s', was '%s'", keys_before,
               copy_before);
    TEST_CHECK(tally, reader.torn == 0, "%d of %d reads beside the forward saw a list neither before nor after it",
               reader.torn, reader.reads);
    free(out);
    test_inputs_free(&inputs);
    sneppx_layer_destroy(layer);
}

/* ---- 4. two switches at once ------------------------------------------------ */

enum { SWITCH_ROUNDS = 200 };

static pthread_barrier_t switch_start, switch_end;

struct switcher {
    sneppx_layer *layer;
    int flash, failures;
};

static void *switch_flash(void *context)
{
    struct switcher *s = context;
    for (int round = 0; round < SWITCH_ROUNDS; round++) {
        pthread_barrier_wait(&switch_start);
        s->failures += sneppx_layer_set_flash(s->layer, s->flash) != SNEPPX_OK;
        pthread_barrier_wait(&switch_end);
    }
    return NULL;
}

static void test_two_switches_at_once(test_tally *tally)
{
    sneppx_config config;
    sneppx_layer *layer = small_layer(tally, 0, 1, &config);
    if (!layer)
        return;
    struct switcher switchers[2] = {{.layer = layer, .flash = 0}, {.layer = layer, .flash = 1}};
    pthread_barrier_init(&switch_start, NULL, 3);
    pthread_barrier_init(&switch_end, NULL, 3);
    pthread_t threads[2];
    for (int t = 0; t < 2; t++)
        pthread_create(&threads[t], NULL, switch_flash, &switchers[t]);
    int disagreements = 0;
    for (int round = 0; round < SWITCH_ROUNDS; round++) {
        pthread_barrier_wait(&switch_start);
        pthread_barrier_wait(&switch_end);
        disagreements += sneppx_layer_config(layer)->use_flash_attn != atomic_load(&layer->use_flash);
    }
    for (int t = 0; t < 2; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&switch_start);
    pthread_barrier_destroy(&switch_end);
    TEST_CHECK(tally, switchers[0].failures == 0 && switchers[1].failures == 0, "set_flash failed: %d, %d",
               switchers[0].failures, switchers[1].failures);
    TEST_CHECK(tally, disagreements == 0,
               "after %d of %d rounds of two switches at once the config's use_flash_attn is not the attention "
               "the forwards run",
               disagreements, SWITCH_ROUNDS);
    sneppx_layer_destroy(layer);
}

int main(void)
{
    test_tally tally = {0};
    /* A private cold cache: every kernel of the first part compiles in this process. */
    char dir[CACHE_TEST_DIR_MAX];
    if (cache_test_make_dir(dir, sizeof dir, "concurrency") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    test_architectures_at_once(&tally);
    test_one_layer_many_callers(&tally);
    test_kernel_list_beside_resolution(&tally);
    test_two_switches_at_once(&tally);
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
