/* Peak memory of the flash path on a long sequence: llama3-8B at T = 32768 (RoPE
 * context extended to it), one forward in a fresh process (--child-memory T),
 * against the bytes it cannot avoid: the packed weights and the activations.
 * Flash keeps O(T * d) per thread; one T x T score plane would be 4 GiB. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench.h"
#include "child.h"
#include "kernels.h"
#include "report.h"
#include "sneppx/sneppx.h"

#define MEMORY_MODEL "llama3-8B"
#define FULL_TOKENS 32768
#define QUICK_TOKENS 512
#define MIB (1024.0 * 1024.0)

/* The buffers a forward of `tokens` cannot do without, in bytes. */
struct memory_budget {
    double weights;      /* packed QKV and O panels */
    double activations;  /* x, out, fused qkv, attention out, cos/sin tables */
    double scratch;      /* attention scratch of every thread */
};

static struct memory_budget budget_of(const sneppx_config *c, int64_t tokens, int64_t gemm_nr, int threads)
{
    const double head_dim = (double)(c->head_dim ? c->head_dim : c->hidden_size / c->num_attention_heads);
    const double rotary = c->rotary_dim ? (double)c->rotary_dim : head_dim;
    const int64_t q_dim = c->num_attention_heads * (int64_t)head_dim;
    const int64_t qkv_dim = q_dim + 2 * c->num_key_value_heads * (int64_t)head_dim;
    const int64_t group = c->num_attention_heads / c->num_key_value_heads;
    struct memory_budget b;
    b.weights = 4.0 * (double)(sneppx_gemm_packed_floats(c->hidden_size, qkv_dim, gemm_nr) +
                               sneppx_gemm_packed_floats(q_dim, c->hidden_size, gemm_nr));
    b.activations = 4.0 * (double)tokens * (2.0 * (double)c->hidden_size + (double)qkv_dim + (double)q_dim + rotary);
    const int64_t flash = sneppx_attn_flash_scratch_floats(group, (int64_t)head_dim, (int64_t)head_dim);
    const int64_t sdpa = sneppx_attn_sdpa_scratch_floats(group, tokens);
    b.scratch = 4.0 * threads * (double)(flash > sdpa ? flash : sdpa);
    return b;
}

/* Resets VmHWM to the current RSS (Linux >= 4.0), so the next read is the
 * peak of what runs in between. */
static int reset_peak_rss(void)
{
    FILE *clear_refs = fopen("/proc/self/clear_refs", "w");
    if (!clear_refs)
        return 0;
    const int ok = fputs("5", clear_refs) >= 0;
    return fclose(clear_refs) == 0 && ok;
}

int bench_child_memory(int argc, char **argv)
{
    if (argc < 1 || atoll(argv[0]) <= 0) {
        fprintf(stderr, "sneppx-bench --child-memory TOKENS\n");
        return 2;
    }
    const int64_t tokens = atoll(argv[0]);
    const size_t rss_start = bench_vm_rss_bytes();
    sneppx_config config;
    sneppx_layer *layer;
    if (sneppx_config_from_name(MEMORY_MODEL, NULL, &config) != SNEPPX_OK ||
        (tokens > config.max_position_embeddings && sneppx_config_extend_context(&config, tokens) != SNEPPX_OK) ||
        sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: %s at T=%lld: %s\n", MEMORY_MODEL, (long long)tokens, sneppx_last_error());
        return 1;
    }
    float *hidden = bench_alloc_floats((size_t)(tokens * config.hidden_size));
    float *out = bench_alloc_floats((size_t)(tokens * config.hidden_size));
    if (!hidden || !out) {
        fprintf(stderr, "sneppx-bench: out of memory for T=%lld\n", (long long)tokens);
        return 1;
    }
    bench_fill_uniform(hidden, tokens * config.hidden_size, 51, 1.0f);
    const int peak_was_reset = reset_peak_rss();
    const size_t rss_before = bench_vm_rss_bytes();
    const double start = bench_now();
    if (sneppx_layer_forward(layer, 1, tokens, hidden, NULL, NULL, NULL, out) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-bench: forward at T=%lld: %s\n", (long long)tokens, sneppx_last_error());
        return 1;
    }
    const double seconds = bench_now() - start;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    printf("rss_start %zu\nrss_before_forward %zu\nhwm_forward %zu\npeak_was_reset %d\nmaxrss_process %.0f\n"
           "forward_s %.6f\nflops %.6g\n",
           rss_start, rss_before, bench_vm_hwm_bytes(), peak_was_reset, (double)usage.ru_maxrss * 1024.0, seconds,
           sneppx_layer_flops(layer, 1, tokens));
    free(hidden);
    free(out);
    sneppx_layer_destroy(layer);
    return 0;
}

static double field(const char *output, const char *name)
{
    const char *value = bench_child_field(output, name);
    return value ? atof(value) : 0;
}

void bench_stage_memory(struct bench_context *ctx)
{
    const int64_t tokens = ctx->quick ? QUICK_TOKENS : FULL_TOKENS;
    const int threads = ctx->thread_counts[ctx->thread_count_n - 1];
    char title[160];
    snprintf(title, sizeof title, "memory: peak RSS of one flash forward, %s at T = %lld, %d threads (fresh process)",
             MEMORY_MODEL, (long long)tokens, threads);
    bench_report_section(title, "VmHWM reset just before the forward; against the packed weights + activations "
                                "(x, out, fused qkv, attention out, cos/sin) + attention scratch");
    char tokens_arg[32];
    snprintf(tokens_arg, sizeof tokens_arg, "%lld", (long long)tokens);
    char *const argv[] = {BENCH_SELF_EXE, "--child-memory", tokens_arg, NULL};
    struct bench_child child;
    if (bench_child_run(argv, NULL, NULL, &child) != 0 || child.exit_code != 0) {
        fprintf(stderr, "sneppx-bench: memory child failed (status %d)\n", child.exit_code);
        free(child.output);
        ctx->failures++;
        return;
    }
    sneppx_config config;
    sneppx_config_from_name(MEMORY_MODEL, NULL, &config);
    const struct memory_budget b = budget_of(&config, tokens, ctx->target->gemm_nr, threads);
    const double rss_start = field(child.output, "rss_start");
    const double hwm = field(child.output, "hwm_forward");
    const double seconds = field(child.output, "forward_s"), flops = field(child.output, "flops");
    const int reset = field(child.output, "peak_was_reset") != 0;
    const double expected = rss_start + b.weights + b.activations + b.scratch;
    const double one_plane = 4.0 * (double)tokens * (double)tokens;
    free(child.output);

    printf("  forward %.1f s = %.1f GF/s (%.0f%% of FMA peak, one run)\n", seconds, flops / seconds * 1e-9,
           100 * flops / seconds * 1e-9 / bench_fma_peak(ctx, threads));
    printf("  peak RSS %s: %.0f MiB; expected %.0f MiB = process at start %.0f + packed weights %.0f + "
           "activations %.0f + scratch %.1f\n",
           reset ? "during the forward" : "of the whole process (VmHWM could not be reset)", hwm / MIB,
           expected / MIB, rss_start / MIB, b.weights / MIB, b.activations / MIB, b.scratch / MIB);
    printf("  excess over expected: %.0f MiB (%.1f%%); one T x T score plane would be %.0f MiB\n",
           (hwm - expected) / MIB, 100 * (hwm - expected) / expected, one_plane / MIB);
    bench_record_value("memory", MEMORY_MODEL, "peak-rss", tokens, threads, hwm / MIB, "MiB");
    bench_record_value("memory", MEMORY_MODEL, "weights+activations", tokens, threads, expected / MIB, "MiB");
    bench_record_value("memory", MEMORY_MODEL, "forward", tokens, threads, seconds * 1e3, "ms");
}
