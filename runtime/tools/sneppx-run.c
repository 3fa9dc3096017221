/* sneppx-run: the main job. For each preset, JIT-compiles (or loads from the
 * disk cache) every kernel of the layer, runs forward passes on synthetic
 * weights and inputs, and prints the keys, compile/cache times and GFLOP/s.
 * With --decode, generation instead: a prefill of --context tokens, then
 * decode steps through a KV cache (run/decode.c). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "run/run.h"
#include "sneppx/sneppx.h"

static const char *source_name(sneppx_kernel_source source)
{
    switch (source) {
    case SNEPPX_KERNEL_SOURCE_COMPILED: return "compiled";
    case SNEPPX_KERNEL_SOURCE_DISK: return "disk cache";
    case SNEPPX_KERNEL_SOURCE_MEMORY: return "memory";
    default: return "?";
    }
}

/* --seq and --batch are bounded as sneppx_layer_forward bounds them
 * (SNEPPX_MAX_SEQ_LEN each, SNEPPX_MAX_TOKENS in all), so that tokens x hidden
 * cannot overflow before the forward checks them. */
#define MAX_REPEAT (1LL << 24) /* timed runs; one more warms up, and r <= repeat must not overflow */

/* The value of option `name` as an integer in [min, max]; complains naming the option otherwise. */
static int parse_count(const char *name, const char *text, long long min, long long max, long long *value)
{
    char *end;
    errno = 0;
    long long parsed = strtoll(text, &end, 10);
    if (errno || end == text || *end || parsed < min || parsed > max) {
        fprintf(stderr, "sneppx-run: %s: '%.64s%s' is not an integer in [%lld, %lld]\n", name, text,
                strlen(text) > 64 ? "..." : "", min, max);
        return -1;
    }
    *value = parsed;
    return 0;
}

static void usage(FILE *to)
{
    fprintf(to, "usage: sneppx-run [--arch NAME]... [--seq T] [--batch B] [--threads N] [--repeat R] [--sdpa] [--tp]\n"
                "                  [--weight-dtype float32|bfloat16|float16|int8] [--compute-dtype float32|bfloat16]\n"
                "       sneppx-run [--arch NAME]... --context C --decode N [--batch B] [--threads N] [--sdpa] [--tp]\n"
                "                  [--weight-dtype float32|bfloat16|float16|int8] [--kv-dtype float32|bfloat16|float16|int8]\n"
                "                  [--compute-dtype float32|bfloat16]\n"
                "  Runs one attention layer forward per preset (default: llama3-8B mistral-7B qwen2-7B\n"
                "  deepseek-v2-lite) on synthetic weights; --list-archs prints the preset names.\n"
                "  --decode: prefill C tokens in each of B sequences, then N decode steps through a\n"
                "  paged KV cache: ms per step, tokens/s, and the bytes a step reads against the\n"
                "  read bandwidth measured just before and after the steps.\n"
                "  --weight-dtype: how the projections' weights are stored (default float32);\n"
                "  bfloat16 and float16 halve the bytes a decode step reads, int8 (a float32\n"
                "  scale per 32 weights) takes 9/32 of them.\n"
                "  --kv-dtype: how the KV cache stores K and V (default float32); bfloat16 and float16\n"
                "  halve the cache bytes a decode step reads, int8 (a scale per row) about quarters them.\n"
                "  --compute-dtype: what the projections multiply in (default float32); bfloat16\n"
                "  (with --weight-dtype bfloat16, on AVX512_BF16 hosts) rounds their inputs to\n"
                "  bfloat16 and runs ~2x the float32 rate on AMD Zen 4/5 (0.7x on an Intel Xeon whose\n"
                "  vdpbf16ps issues a quarter as often as an FMA: sneppx-bench's peak stage shows both).\n"
                "  --tp, under mpirun -np N: the layer split by heads over the N ranks (tensor\n"
                "  parallel); prints each rank's heads, weights, KV cache, memory and times.\n");
}

static int run_arch(const char *arch, int64_t batch, int64_t seq_len, int threads, int repeat, int flash,
                    sneppx_dtype weight_dtype, sneppx_dtype compute_dtype)
{
    sneppx_config config;
    if (sneppx_config_from_name(arch, NULL, &config) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-run: %s\n", sneppx_last_error());
        return 1;
    }
    config.num_threads = threads;
    config.use_flash_attn = flash;
    config.weight_dtype = weight_dtype;
    config.compute_dtype = compute_dtype;
    printf("== %s: hidden %lld, heads %lld/%lld, window %lld, batch %lld, seq %lld, %s, %s weights%s\n", config.name,
           (long long)config.hidden_size, (long long)config.num_attention_heads,
           (long long)config.num_key_value_heads, (long long)config.sliding_window, (long long)batch,
           (long long)seq_len, flash ? "flash" : "sdpa", sneppx_dtype_name(weight_dtype),
           compute_dtype == SNEPPX_DTYPE_BFLOAT16 ? ", bfloat16 compute" : "");
    double start = run_now_ms();
    sneppx_layer *layer;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-run: %s: %s\n", arch, sneppx_last_error());
        return 1;
    }
    double created = run_now_ms() - start;
    double kernel_ms = 0;
    for (int i = 0; i < sneppx_layer_kernel_count(layer); i++) {
        sneppx_kernel_timing timing;
        sneppx_layer_kernel_timing(layer, i, &timing);
        kernel_ms += timing.total_ms;
        printf("   kernel %-48s %-10s %8.2f ms\n", timing.key, source_name(timing.source), timing.total_ms);
    }
    /* The layer resolves its keys side by side on its threads, so their summed
     * times can exceed the wall time of the whole creation. */
    printf("   layer ready in %.1f ms (synthetic weights, packing, and %d keys resolved side by side: %.1f ms"
           " summed over keys)\n",
           created, sneppx_layer_kernel_count(layer), kernel_ms);

    const int64_t tokens = batch * seq_len;
    const double mib = 2.0 * sizeof(float) * (double)tokens * (double)config.hidden_size / (1 << 20);
    float *hidden = malloc(sizeof(float) * (size_t)(tokens * config.hidden_size));
    float *out = malloc(sizeof(float) * (size_t)(tokens * config.hidden_size));
    double *times = malloc(sizeof(double) * ((size_t)repeat + 1));
    if (!hidden || !out || !times) {
        fprintf(stderr, "sneppx-run: %s: out of memory for the input and output of --batch %lld x --seq %lld "
                        "tokens x hidden %lld (%.0f MiB) and %lld timings\n",
                config.name, (long long)batch, (long long)seq_len, (long long)config.hidden_size, mib, (long long)repeat + 1);
        free(hidden);
        free(out);
        free(times);
        sneppx_layer_destroy(layer);
        return 1;
    }
    unsigned state = 12345;
    for (int64_t i = 0; i < tokens * config.hidden_size; i++) {
        state = state * 1103515245u + 12345u;
        hidden[i] = (float)((state >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    int failed = 0;
    for (int r = 0; r <= repeat && !failed; r++) { /* run 0 warms up (first-touch, tables) */
        double t0 = run_now_ms();
        if (sneppx_layer_forward(layer, batch, seq_len, hidden, NULL, NULL, NULL, out) != SNEPPX_OK) {
            fprintf(stderr, "sneppx-run: forward: %s\n", sneppx_last_error());
            failed = 1;
        }
        times[r] = run_now_ms() - t0;
    }
    if (!failed) {
        qsort(times + 1, (size_t)repeat, sizeof(double), run_compare_doubles);
        double median = times[1 + repeat / 2];
        double checksum = 0;
        for (int64_t i = 0; i < tokens * config.hidden_size; i++)
            checksum += out[i];
        double gflops = sneppx_layer_flops(layer, batch, seq_len) / (median * 1e6);
        printf("   forward: first %.2f ms, median %.2f ms (min %.2f, max %.2f) over %d runs = %.1f GFLOP/s"
               "  [checksum %.6g]\n",
               times[0], median, times[1], times[repeat], repeat, gflops, checksum);
    }
    free(hidden);
    free(out);
    free(times);
    sneppx_layer_destroy(layer);
    return failed;
}

int main(int argc, char **argv)
{
    const char *archs[64];
    int arch_count = 0, flash = 1, tensor_parallel = 0;
    sneppx_dtype weight_dtype = SNEPPX_DTYPE_FLOAT32, kv_dtype = SNEPPX_DTYPE_FLOAT32,
                 compute_dtype = SNEPPX_DTYPE_FLOAT32;
    long long seq_len = 128, batch = 1, threads = 0, repeat = 5, context = 0, decode = 0;
    const char *forward_only = NULL; /* --seq or --repeat, which generation has no use for */
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const int takes_value = !strcmp(arg, "--arch") || !strcmp(arg, "--seq") || !strcmp(arg, "--batch") ||
                                !strcmp(arg, "--threads") || !strcmp(arg, "--repeat") ||
                                !strcmp(arg, "--context") || !strcmp(arg, "--decode") ||
                                !strcmp(arg, "--weight-dtype") || !strcmp(arg, "--kv-dtype") ||
                                !strcmp(arg, "--compute-dtype");
        const char *value = takes_value && i + 1 < argc ? argv[++i] : NULL;
        if (takes_value && !value) {
            fprintf(stderr, "sneppx-run: %s needs a value\n", arg);
            usage(stderr);
            return 2;
        }
        if (!strcmp(arg, "--arch")) {
            if (arch_count == (int)(sizeof archs / sizeof archs[0])) {
                fprintf(stderr, "sneppx-run: --arch: at most %d presets per run\n", (int)(sizeof archs / sizeof archs[0]));
                return 2;
            }
            archs[arch_count++] = value;
        } else if (!strcmp(arg, "--seq")) {
            if (parse_count("--seq", value, 1, SNEPPX_MAX_SEQ_LEN, &seq_len) != 0)
                return 2;
            forward_only = arg;
        } else if (!strcmp(arg, "--batch")) {
            if (parse_count("--batch", value, 1, SNEPPX_MAX_SEQ_LEN, &batch) != 0)
                return 2;
        } else if (!strcmp(arg, "--threads")) {
            if (parse_count("--threads", value, 0, SNEPPX_MAX_THREADS, &threads) != 0)
                return 2;
        } else if (!strcmp(arg, "--repeat")) {
            if (parse_count("--repeat", value, 1, MAX_REPEAT, &repeat) != 0)
                return 2;
            forward_only = arg;
        } else if (!strcmp(arg, "--context")) {
            if (parse_count("--context", value, 0, SNEPPX_MAX_SEQ_LEN, &context) != 0)
                return 2;
        } else if (!strcmp(arg, "--decode")) {
            if (parse_count("--decode", value, 1, MAX_REPEAT, &decode) != 0)
                return 2;
        } else if (!strcmp(arg, "--weight-dtype") || !strcmp(arg, "--kv-dtype")) {
            /* Weights and the KV cache take every type. */
            const int kv = !strcmp(arg, "--kv-dtype");
            int found = -1;
            for (int t = 0; t < SNEPPX_DTYPE_COUNT; t++)
                if (!strcmp(value, sneppx_dtype_name(t)))
                    found = t;
            if (found < 0) {
                fprintf(stderr, "sneppx-run: %s: '%.64s' is not float32, bfloat16, float16 or int8\n", arg, value);
                return 2;
            }
            *(kv ? &kv_dtype : &weight_dtype) = (sneppx_dtype)found;
        } else if (!strcmp(arg, "--compute-dtype")) {
            if (strcmp(value, "float32") && strcmp(value, "bfloat16")) {
                fprintf(stderr, "sneppx-run: --compute-dtype: '%.64s' is not float32 or bfloat16\n", value);
                return 2;
            }
            compute_dtype = strcmp(value, "float32") ? SNEPPX_DTYPE_BFLOAT16 : SNEPPX_DTYPE_FLOAT32;
        } else if (!strcmp(arg, "--sdpa")) {
            flash = 0;
        } else if (!strcmp(arg, "--tp")) {
            tensor_parallel = 1;
        } else if (!strcmp(arg, "--list-archs")) {
            for (int p = 0; p < sneppx_preset_count(); p++)
                printf("%s\n", sneppx_preset_name(p));
            return 0;
        } else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "sneppx-run: bad argument '%s'\n", arg);
            usage(stderr);
            return 2;
        }
    }
    if (compute_dtype == SNEPPX_DTYPE_BFLOAT16 && weight_dtype != SNEPPX_DTYPE_BFLOAT16) {
        fprintf(stderr, "sneppx-run: --compute-dtype bfloat16 needs bfloat16 weights (--weight-dtype bfloat16), "
                        "not %s\n", sneppx_dtype_name(weight_dtype));
        return 2;
    }
    if (kv_dtype != SNEPPX_DTYPE_FLOAT32 && !decode) {
        fprintf(stderr, "sneppx-run: --kv-dtype needs --decode N (only generation uses a KV cache)\n");
        return 2;
    }
    if (context && !decode) {
        fprintf(stderr, "sneppx-run: --context needs --decode N (the decode steps after the prefill)\n");
        return 2;
    }
    if (decode && forward_only) {
        fprintf(stderr, "sneppx-run: %s is not for --decode (generation takes --context and --decode)\n",
                forward_only);
        return 2;
    }
    if (decode && run_kv_capacity_tokens(batch, context, decode) > SNEPPX_KV_MAX_CAPACITY_TOKENS) {
        fprintf(stderr, "sneppx-run: --batch %lld x (--context %lld + --decode %lld) tokens, in whole pages of %d, "
                        "exceed a KV cache's %lld\n", batch, context, decode, SNEPPX_KV_DEFAULT_PAGE_SIZE,
                (long long)SNEPPX_KV_MAX_CAPACITY_TOKENS);
        return 2;
    }
    if (decode && batch * run_forward_tokens(context) > SNEPPX_MAX_TOKENS) {
        fprintf(stderr, "sneppx-run: --batch %lld x %lld prefill tokens = %lld per forward (--context goes in chunks "
                        "of %d); at most %lld (2^26)\n", batch, (long long)run_forward_tokens(context),
                batch * run_forward_tokens(context), RUN_PREFILL_CHUNK, (long long)SNEPPX_MAX_TOKENS);
        return 2;
    }
    if (!decode && seq_len * batch > SNEPPX_MAX_TOKENS) {
        fprintf(stderr, "sneppx-run: --batch %lld x --seq %lld = %lld tokens; at most %lld (2^26) per forward\n",
                batch, seq_len, batch * seq_len, (long long)SNEPPX_MAX_TOKENS);
        return 2;
    }
    if (arch_count == 0) {
        archs[arch_count++] = "llama3-8B";
        archs[arch_count++] = "mistral-7B";
        archs[arch_count++] = "qwen2-7B";
        archs[arch_count++] = "deepseek-v2-lite";
    }
    /* Every name is checked before the first preset runs, as the other options are: a
     * misspelled last --arch must not cost the runs of the ones before it. So is every
     * preset with the options set, as its layer will validate it: a host without
     * AVX512_BF16 refuses --compute-dtype bfloat16 once, not once per preset after the
     * runs before it. */
    for (int a = 0; a < arch_count; a++) {
        sneppx_config config;
        if (sneppx_config_from_name(archs[a], NULL, &config) != SNEPPX_OK) {
            fprintf(stderr, "sneppx-run: --arch: %s\n", sneppx_last_error());
            return 2;
        }
        config.num_threads = (int)threads;
        config.use_flash_attn = flash;
        config.weight_dtype = weight_dtype;
        config.compute_dtype = compute_dtype;
        if (sneppx_config_validate(&config) != SNEPPX_OK) {
            fprintf(stderr, "sneppx-run: %s: %s\n", config.name, sneppx_last_error());
            return 1;
        }
    }
    if (tensor_parallel) {
#ifdef SNEPPX_RUN_MPI
        const struct run_options options = {.batch = batch, .seq_len = seq_len, .context = context,
                                            .decode = decode, .threads = (int)threads, .repeat = (int)repeat,
                                            .flash = flash, .weight_dtype = weight_dtype,
                                            .kv_dtype = kv_dtype, .compute_dtype = compute_dtype};
        return run_tp(&argc, &argv, archs, arch_count, &options) ? 1 : 0;
#else
        fprintf(stderr, "sneppx-run: --tp: this sneppx-run was built without MPI (CMake found none: install "
                        "libopenmpi-dev and rebuild)\n");
        return 2;
#endif
    }
    printf("sneppx-run: kernel cache %s\n", sneppx_cache_dir()[0] ? sneppx_cache_dir() : "(memory only)");
    int failures = 0;
    for (int a = 0; a < arch_count; a++)
        failures += decode ? run_decode(archs[a], batch, context, decode, (int)threads, flash, weight_dtype, kv_dtype,
                                      compute_dtype)
                           : run_arch(archs[a], batch, seq_len, (int)threads, (int)repeat, flash, weight_dtype,
                                      compute_dtype);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    printf("JIT: %llu compiled (%.1f ms), %llu loaded from the disk cache, %llu memory hits\n",
           (unsigned long long)stats.compiles, stats.compile_ms_total, (unsigned long long)stats.disk_hits,
           (unsigned long long)stats.memory_hits);
    return failures ? 1 : 0;
}
