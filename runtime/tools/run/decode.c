/* sneppx-run --context C --decode N [--batch B]: a prefill, then decode steps
 * over a paged KV cache, rated against the decode roofline: a step must read
 * the layer's packed weights once and every cached K/V row its queries can
 * see, so (weight bytes + cache bytes) / read bandwidth bounds it from below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe/read_probe.h"
#include "run.h"
#include "sneppx/sneppx.h"

#define PROBE_BYTES ((size_t)512 << 20)
#define PROBE_RUNS 3

static void fill_random(float *data, int64_t count, unsigned *state)
{
    for (int64_t i = 0; i < count; i++) {
        *state = *state * 1103515245u + 12345u;
        data[i] = (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

struct decode_run {
    sneppx_layer *layer;
    sneppx_kv_cache *cache;
    int64_t batch, context, steps;
    int64_t *seq_ids, *q_lens;
    float *hidden, *out;   /* batch x run_forward_tokens(context) tokens */
    double *step_ms;
};

static int fail(const char *what)
{
    fprintf(stderr, "sneppx-run: %s: %s\n", what, sneppx_last_error());
    return 1;
}

/* Every sequence gets `context` tokens, RUN_PREFILL_CHUNK at a time, all sequences in each call. */
static int prefill(struct decode_run *run, unsigned *state, int64_t hidden_size)
{
    for (int64_t begin = 0; begin < run->context; begin += RUN_PREFILL_CHUNK) {
        const int64_t chunk = run->context - begin < RUN_PREFILL_CHUNK ? run->context - begin : RUN_PREFILL_CHUNK;
        for (int64_t s = 0; s < run->batch; s++)
            run->q_lens[s] = chunk;
        fill_random(run->hidden, run->batch * chunk * hidden_size, state);
        if (sneppx_layer_forward_cached(run->layer, run->cache, 0, run->batch, run->seq_ids, run->q_lens,
                                        run->hidden, NULL, NULL, run->out) != SNEPPX_OK)
            return fail("prefill");
    }
    return 0;
}

/* Step 0 warms up (first touch of the step's scratch); steps 1..N are timed. */
static int decode_steps(struct decode_run *run, unsigned *state, int64_t hidden_size)
{
    for (int64_t s = 0; s < run->batch; s++)
        run->q_lens[s] = 1;
    for (int64_t step = 0; step <= run->steps; step++) {
        fill_random(run->hidden, run->batch * hidden_size, state);
        const double start = run_now_ms();
        if (sneppx_layer_forward_cached(run->layer, run->cache, 0, run->batch, run->seq_ids, run->q_lens,
                                        run->hidden, NULL, NULL, run->out) != SNEPPX_OK)
            return fail("decode");
        if (step > 0)
            run->step_ms[step - 1] = run_now_ms() - start;
    }
    return 0;
}

/* K/V bytes the timed steps read on average: each sequence's visible keys (all
 * of them, or the window's) at each step. */
static double cache_bytes_per_step(const struct decode_run *run, int64_t window, double token_bytes)
{
    double total = 0;
    for (int64_t step = 1; step <= run->steps; step++) {
        int64_t keys = run->context + step + 1;
        if (window > 0 && keys > window)
            keys = window;
        total += (double)keys * token_bytes * (double)run->batch;
    }
    return total / (double)run->steps;
}

static int report(struct decode_run *run, const sneppx_config *config, double bandwidth, double prefill_ms)
{
    sneppx_kv_cache_stats stats;
    if (sneppx_kv_cache_stats_get(run->cache, &stats) != SNEPPX_OK)
        return fail("cache stats");
    if (run->context > 0)
        printf("   prefill: %lld x %lld tokens in chunks of %d: %.1f ms (%.0f tokens/s)\n", (long long)run->batch,
               (long long)run->context, RUN_PREFILL_CHUNK, prefill_ms,
               (double)(run->batch * run->context) / (prefill_ms * 1e-3));
    qsort(run->step_ms, (size_t)run->steps, sizeof(double), run_compare_doubles);
    const double median = run->step_ms[run->steps / 2];
    const double token_bytes = (double)stats.page_bytes / (double)stats.page_size;
    const double weights = sneppx_layer_weight_bytes(run->layer);
    const double cache = cache_bytes_per_step(run, config->sliding_window, token_bytes);
    const double gbs = (weights + cache) / (median * 1e-3) * 1e-9;
    printf("   decode: median %.3f ms per step (min %.3f, max %.3f) over %lld steps = %.1f tokens/s\n", median,
           run->step_ms[0], run->step_ms[run->steps - 1], (long long)run->steps,
           (double)run->batch / (median * 1e-3));
    printf("   a step reads %.1f MB of weights + %.1f MB of cache = %.1f GB/s", weights * 1e-6, cache * 1e-6, gbs);
    if (bandwidth > 0)
        printf(", %.0f%% of the read bandwidth measured beside the steps (%.1f GB/s): roofline %.3f ms per step\n",
               100 * gbs / bandwidth, bandwidth, (weights + cache) / (bandwidth * 1e9) * 1e3);
    else
        printf(" (no memory to measure the read bandwidth)\n");
    return 0;
}

int run_decode(const char *arch, int64_t batch, int64_t context, int64_t steps, int threads, int flash,
               sneppx_dtype weight_dtype, sneppx_dtype kv_dtype, sneppx_dtype compute_dtype)
{
    sneppx_config config;
    if (sneppx_config_from_name(arch, NULL, &config) != SNEPPX_OK)
        return fail("--arch");
    config.num_threads = threads;
    config.use_flash_attn = flash;
    config.weight_dtype = weight_dtype;
    config.compute_dtype = compute_dtype;
    printf("== %s decode: batch %lld, context %lld, %lld steps, %s, %s weights, %s KV cache\n", config.name,
           (long long)batch, (long long)context, (long long)steps, flash ? "flash" : "sdpa",
           sneppx_dtype_name(weight_dtype), sneppx_dtype_name(kv_dtype));
    struct decode_run run = {.batch = batch, .context = context, .steps = steps};
    int failed = 1;
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.capacity_tokens = run_kv_capacity_tokens(batch, context, steps);
    options.dtype = kv_dtype;
    const size_t chunk_floats = (size_t)(batch * run_forward_tokens(context) * config.hidden_size);
    run.seq_ids = calloc((size_t)batch, sizeof(int64_t));
    run.q_lens = calloc((size_t)batch, sizeof(int64_t));
    run.hidden = malloc(sizeof(float) * chunk_floats);
    run.out = malloc(sizeof(float) * chunk_floats);
    run.step_ms = malloc(sizeof(double) * (size_t)steps);
    if (!run.seq_ids || !run.q_lens || !run.hidden || !run.out || !run.step_ms) {
        fprintf(stderr, "sneppx-run: out of memory for %lld x %lld tokens of input and output\n", (long long)batch,
                (long long)run_forward_tokens(context));
        goto done;
    }
    if (sneppx_layer_create(&config, NULL, &run.layer) != SNEPPX_OK) {
        fail(arch);
        goto done;
    }
    if (sneppx_kv_cache_create(&config, &options, &run.cache) != SNEPPX_OK) {
        fail("kv cache");
        goto done;
    }
    for (int64_t s = 0; s < batch; s++)
        if (sneppx_kv_cache_add_sequence(run.cache, &run.seq_ids[s]) != SNEPPX_OK) {
            fail("kv cache");
            goto done;
        }
    unsigned state = 12345;
    const double start = run_now_ms();
    if (prefill(&run, &state, config.hidden_size) != 0)
        goto done;
    const double prefill_ms = run_now_ms() - start;
    /* The host is shared: the bandwidth is the best of the probes just before
     * and just after the steps, in the same conditions as they ran. */
    read_probe probe;
    double bandwidth = 0;
    const int probed = read_probe_init(&probe, PROBE_BYTES) == 0;
    if (probed)
        bandwidth = read_probe_best_gbs(&probe, threads, PROBE_RUNS);
    if (decode_steps(&run, &state, config.hidden_size) != 0) {
        if (probed)
            read_probe_free(&probe);
        goto done;
    }
    if (probed) {
        const double after = read_probe_best_gbs(&probe, threads, PROBE_RUNS);
        bandwidth = after > bandwidth ? after : bandwidth;
        read_probe_free(&probe);
    }
    failed = report(&run, &config, bandwidth, prefill_ms);
done:
    sneppx_kv_cache_destroy(run.cache);
    sneppx_layer_destroy(run.layer);
    free(run.seq_ids);
    free(run.q_lens);
    free(run.hidden);
    free(run.out);
    free(run.step_ms);
    return failed;
}
