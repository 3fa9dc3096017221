/* The performance targets (docs/PERFORMANCE.md), checked against the rows this run
 * recorded, on all cores: each prints met or MISS and the case that decides it. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "report.h"

#define LAYER_TARGET_MODEL "llama3-8B"
/* Flash and the projections' share of peak are held to their targets from this T up. */
#define FLASH_TARGET_TOKENS 2048
#define PROJECTION_PEAK_TOKENS 2048
#define LAYER_TARGET_TOKENS 2048

static int is(const struct bench_row_view *row, const char *stage, const char *impl)
{
    return !row->value_unit && strcmp(row->result->stage, stage) == 0 && strcmp(row->result->impl, impl) == 0;
}

static void verdict(int measured, int met, const char *target, const char *detail)
{
    printf("  [%s] %-62s %s\n", !measured ? "n/a " : met ? "met " : "MISS", target,
           measured ? detail : "not measured in this run");
}

/* Projections at T >= 512: >= 1.0x OpenBLAS, and >= 85% of FMA peak at T = 2048; T = 1 (decode):
 * >= 90% of read bandwidth and >= 1.0x OpenBLAS's sgemv. */
static void check_projections(int threads)
{
    double worst_speedup = 1e300, worst_fraction = 1e300, worst_stream = 1e300, worst_gemv = 1e300;
    char speedup_case[96] = "", fraction_case[96] = "", stream_case[96] = "", gemv_case[96] = "";
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        const struct bench_result *r = row.result;
        /* The sweep's rows are one thread's too: on a one-core host they would be taken for the
         * projections (its L2 rows, rated against no bandwidth, as 0% of it). */
        if (!is(&row, "gemm", "sneppx") || r->threads != threads ||
            strncmp(r->case_name, BENCH_SWEEP_CASE_PREFIX, strlen(BENCH_SWEEP_CASE_PREFIX)) == 0)
            continue;
        if (r->tokens == 1 && bench_peak_fraction(r) < worst_stream) {
            worst_stream = bench_peak_fraction(r);
            snprintf(stream_case, sizeof stream_case, "worst %s: %.0f%% of read bandwidth", r->case_name,
                     100 * worst_stream);
        }
        /* Against OpenBLAS only: a host with a tuning record also has rows against its untuned kernel. */
        const int against_openblas = strcmp(row.baseline_impl, r->tokens == 1 ? "sgemv" : "sgemm") == 0;
        if (r->tokens == 1 && against_openblas && row.speedup < worst_gemv) {
            worst_gemv = row.speedup;
            snprintf(gemv_case, sizeof gemv_case, "worst %s: %.2fx", r->case_name, row.speedup);
        }
        if (r->tokens < 512)
            continue;
        if (against_openblas && row.speedup < worst_speedup) {
            worst_speedup = row.speedup;
            snprintf(speedup_case, sizeof speedup_case, "%s T=%lld: %.2fx", r->case_name, r->tokens, row.speedup);
        }
        if (r->tokens >= PROJECTION_PEAK_TOKENS && bench_peak_fraction(r) < worst_fraction) {
            worst_fraction = bench_peak_fraction(r);
            snprintf(fraction_case, sizeof fraction_case, "%s T=%lld: %.0f%%", r->case_name, r->tokens,
                     100 * worst_fraction);
        }
    }
    char detail[256];
    snprintf(detail, sizeof detail, "worst %s; worst %s", speedup_case, fraction_case);
    verdict(speedup_case[0] != 0 && fraction_case[0] != 0, worst_speedup >= 1.0 && worst_fraction >= 0.85,
            "projections T >= 512: >= 1.0x OpenBLAS; T = 2048: >= 85% of peak", detail);
    snprintf(detail, sizeof detail, "%s; %s", stream_case, gemv_case[0] ? gemv_case : "no sgemv row");
    verdict(stream_case[0] != 0, worst_stream >= 0.9 && gemv_case[0] && worst_gemv >= 1.0,
            "projections T = 1: >= 90% of read bandwidth, >= 1.0x sgemv", detail);
}

/* Flash attention, causal, d 128, no window, at every T >= 2048: >= 70% of FMA peak. */
static void check_flash(int threads)
{
    static const char target[] = "flash attention causal T >= 2048, d 128: >= 70% of FMA peak";
    double worst = 1e300;
    char detail[96] = "";
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        const struct bench_result *r = row.result;
        if (is(&row, "attention", "flash") && r->threads == threads && r->tokens >= FLASH_TARGET_TOKENS &&
            strncmp(r->case_name, "causal ", 7) == 0 && !strstr(r->case_name, " w") &&
            bench_peak_fraction(r) < worst) {
            worst = bench_peak_fraction(r);
            snprintf(detail, sizeof detail, "worst T=%lld: %.0f%% of FMA peak", r->tokens, 100 * worst);
        }
    }
    verdict(detail[0] != 0, worst >= 0.7, target, detail);
}

/* Decode attention, llama3-8B's shape at 4096 keys, batch 1: K/V streamed at >= 85% of read bandwidth. */
static void check_decode(int threads)
{
    static const char target[] = "decode d128 g4 b1, 4096 keys: >= 85% of read bandwidth";
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        const struct bench_result *r = row.result;
        if (is(&row, "decode", "decode") && r->threads == threads && r->tokens == 4096 &&
            strcmp(r->case_name, "llama3-8B b1") == 0) {
            char detail[96];
            snprintf(detail, sizeof detail, "%.0f%% of read bandwidth; %.2fx a paged read of its pages",
                     100 * bench_peak_fraction(r), row.speedup);
            verdict(1, bench_peak_fraction(r) >= 0.85, target, detail);
            return;
        }
    }
    verdict(0, 0, target, "");
}

static void check_layer(int threads)
{
    int found = 0, compared = 0, all_faster = 1;
    double fraction = 0, slowest_speedup = 1e300;
    char slowest[96] = "";
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        const struct bench_result *r = row.result;
        if (!is(&row, "layer", "sneppx") || strcmp(r->case_name, LAYER_TARGET_MODEL) != 0)
            continue;
        if (r->threads == threads && r->tokens == LAYER_TARGET_TOKENS) {
            found = 1;
            fraction = bench_peak_fraction(r);
        }
        if (row.baseline_impl[0]) {
            compared = 1;
            all_faster &= row.speedup > 1.0;
            if (row.speedup < slowest_speedup) {
                slowest_speedup = row.speedup;
                snprintf(slowest, sizeof slowest, "slowest vs PyTorch: T=%lld %dt %.2fx", r->tokens, r->threads,
                         row.speedup);
            }
        }
    }
    char detail[96];
    snprintf(detail, sizeof detail, "%.0f%% of FMA peak", 100 * fraction);
    verdict(found, fraction >= 0.8, "layer llama3-8B T = 2048: >= 80% of FMA peak end to end", detail);
    verdict(compared, all_faster, "layer llama3-8B: faster than PyTorch at every T and thread count", slowest);
}

/* Every stage at T >= 512: all-core time >= 1.85x faster than one core. A one-core host
 * has no all-core rows but the one-thread ones: nothing to measure (each row against itself
 * would read 1.00x, a MISS). */
static void check_scaling(int threads)
{
    double worst = 1e300;
    char worst_case[128] = "";
    for (size_t i = 0; threads > 1 && i < bench_row_count(); i++) {
        struct bench_row_view many;
        bench_row_at(i, &many);
        const struct bench_result *r = many.result;
        if (many.value_unit || r->threads != threads || r->tokens < 512 || strcmp(r->stage, "peak") == 0 ||
            (strcmp(r->impl, "sneppx") != 0 && strcmp(r->impl, "flash") != 0))
            continue;
        for (size_t j = 0; j < bench_row_count(); j++) {
            struct bench_row_view one;
            bench_row_at(j, &one);
            const struct bench_result *s = one.result;
            if (one.value_unit || s->threads != 1 || s->tokens != r->tokens || strcmp(s->stage, r->stage) != 0 ||
                strcmp(s->case_name, r->case_name) != 0 || strcmp(s->impl, r->impl) != 0)
                continue;
            /* Timed side by side in rounds (r->scaling), else the two medians. */
            const double scaling = r->scaling > 0 ? r->scaling : s->seconds.median / r->seconds.median;
            if (scaling < worst) {
                worst = scaling;
                snprintf(worst_case, sizeof worst_case, "worst %s %s T=%lld: %.2fx", r->stage, r->case_name,
                         r->tokens, scaling);
            }
        }
    }
    char target[80];
    snprintf(target, sizeof target, "%d threads >= 1.85x 1 thread, every stage at T >= 512", threads);
    verdict(worst_case[0] != 0, worst >= 1.85, target, worst_case);
}

static void check_jit(void)
{
    double compile = 0, load = 0, warm = 0;
    int compiles = 0, loads = 0, warms = 0;
    char compile_key[96] = "", load_key[96] = "";
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        if (!row.value_unit || strcmp(row.result->stage, "jit") != 0)
            continue;
        const char *impl = row.result->impl;
        if (strcmp(impl, "cold-compile") == 0) {
            compiles++;
            if (row.value > compile) {
                compile = row.value;
                snprintf(compile_key, sizeof compile_key, "%s", row.result->case_name);
            }
        } else if (strcmp(impl, "disk-load") == 0) {
            loads++;
            if (row.value > load) {
                load = row.value;
                snprintf(load_key, sizeof load_key, "%s", row.result->case_name);
            }
        } else if (strcmp(impl, "warm-start-kernels") == 0) {
            warms++;
            warm = row.value > warm ? row.value : warm;
        }
    }
    char detail[160];
    snprintf(detail, sizeof detail, "slowest %.1f ms (%s)", compile, compile_key);
    verdict(compiles > 0, compile <= 100, "cold compile <= 100 ms per key", detail);
    snprintf(detail, sizeof detail, "slowest %.2f ms (%s)", load, load_key);
    verdict(loads > 0, load <= 5, "disk-cache load <= 5 ms per key", detail);
    snprintf(detail, sizeof detail, "slowest layer %.1f ms (all its kernels from the disk cache)", warm);
    verdict(warms > 0, warm <= 50, "warm start of a layer <= 50 ms", detail);
}

/* Flash memory: the peak of a long forward stays within 10% of weights + activations, which at
 * T = 32768 is far below one T x T plane (4 GiB). */
static void check_memory(void)
{
    double peak = 0, expected = 0;
    long long tokens = 0;
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        if (!row.value_unit || strcmp(row.result->stage, "memory") != 0)
            continue;
        tokens = row.result->tokens;
        if (strcmp(row.result->impl, "peak-rss") == 0)
            peak = row.value;
        else if (strcmp(row.result->impl, "weights+activations") == 0)
            expected = row.value;
    }
    const double plane_mib = 4.0 * (double)tokens * (double)tokens / (1024.0 * 1024.0);
    char detail[160];
    snprintf(detail, sizeof detail, "T=%lld: peak %.0f MiB vs %.0f expected (+%.1f%%); a T x T plane is %.0f MiB",
             tokens, peak, expected, expected > 0 ? 100 * (peak - expected) / expected : 0, plane_mib);
    verdict(peak > 0 && expected > 0, peak - expected <= 0.1 * expected,
            "flash memory O(T*d) per thread: peak <= 1.1x weights + activations", detail);
}

/* A narrow type against float32 in the precision stage: the row of impl
 * "sneppx <label>" whose case starts with `kind`, compared with the float32 row. */
static const struct bench_row_view *precision_row(const char *kind, const char *label, int threads,
                                                  struct bench_row_view *row)
{
    char impl[32];
    snprintf(impl, sizeof impl, "sneppx %s", label);
    for (size_t i = 0; i < bench_row_count(); i++) {
        bench_row_at(i, row);
        if (is(row, "precision", impl) && row->result->threads == threads &&
            strncmp(row->result->case_name, kind, strlen(kind)) == 0 && strcmp(row->baseline_impl, "sneppx f32") == 0)
            return row;
    }
    return NULL;
}

/* The peak stage's rate for impl ("fma", "vdpbf16ps") on threads: its best run; 0 if not measured. */
static double peak_stage_rate(const char *impl, int threads)
{
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        if (is(&row, "peak", impl) && row.result->threads == threads)
            return bench_rate(row.result, row.result->seconds.min);
    }
    return 0;
}

/* Decode b1 at 4096: bf16 weights + cache >= 1.8x the float32 step, int8 >= 3.0x, each
 * >= 80% of its own roofline; prefill T = 2048: narrow weights >= 0.95x float32, the
 * bfloat16-compute GEMM (AVX512_BF16 hosts) >= 1.6x. */
static void check_precision(int threads)
{
    static const struct {
        const char *label;
        double speedup;
    } decode[] = {{"bf16", 1.8}, {"int8", 3.0}},
      prefill[] = {{"bf16", 0.95}, {"int8", 0.95}, {"bf16-compute", 1.6}};
    struct bench_row_view row;
    char target[96], detail[96];
    const double dot_peak = peak_stage_rate("vdpbf16ps", threads), fma_peak = peak_stage_rate("fma", threads);
    for (size_t i = 0; i < sizeof decode / sizeof decode[0]; i++) {
        const struct bench_row_view *r = precision_row("decode", decode[i].label, threads, &row);
        snprintf(target, sizeof target, "decode b1 4096, %s weights + cache: >= %.1fx f32, >= 80%% roofline",
                 decode[i].label, decode[i].speedup);
        if (r)
            snprintf(detail, sizeof detail, "%.2fx, %.0f%% of roofline", r->speedup,
                     100 * bench_peak_fraction(r->result));
        verdict(r != NULL, r && r->speedup >= decode[i].speedup && bench_peak_fraction(r->result) >= 0.8, target,
                detail);
    }
    for (size_t i = 0; i < sizeof prefill / sizeof prefill[0]; i++) {
        const struct bench_row_view *r = precision_row("prefill", prefill[i].label, threads, &row);
        snprintf(target, sizeof target, "prefill T = 2048, %s: >= %.2fx f32", prefill[i].label,
                 prefill[i].speedup);
        if (r && strcmp(prefill[i].label, "bf16-compute") == 0 && dot_peak > 0 && fma_peak > 0) {
            /* What the instruction allows on this core, so a miss the hardware forces reads as one. */
            snprintf(detail, sizeof detail, "%.2fx, %.0f%% of the vdpbf16ps peak (%.2fx the FMA peak here)",
                     r->speedup, 100 * bench_peak_fraction(r->result), dot_peak / fma_peak);
        } else if (r) {
            snprintf(detail, sizeof detail, "%.2fx", r->speedup);
        }
        verdict(r != NULL, r && r->speedup >= prefill[i].speedup, target, detail);
    }
}

/* Generation through the paged cache (the generate stage, llama3-8B's layer): a batch-1
 * step at context 4096 >= 85% of its roofline, a ragged batch of 16 >= 80% at every
 * context, chunked prefill >= 0.95x the one-shot forward, and no heap growth over the
 * warm steps of any row. */
static void check_generate(int threads)
{
    int single_found = 0, batch_found = 0, chunked_found = 0, heap_found = 0;
    double single = 0, worst_batch = 1e300, chunked = 0, worst_heap = 0;
    char batch_case[96] = "", heap_case[96] = "";
    for (size_t i = 0; i < bench_row_count(); i++) {
        struct bench_row_view row;
        bench_row_at(i, &row);
        const struct bench_result *r = row.result;
        if (strcmp(r->stage, "generate") != 0 || r->threads != threads)
            continue;
        if (row.value_unit) {
            if (strcmp(r->impl, GENERATE_HEAP_GROWTH) == 0 && (!heap_found || row.value > worst_heap)) {
                heap_found = 1;
                worst_heap = row.value;
                snprintf(heap_case, sizeof heap_case, "largest %+.0f B (%s, context %lld)", row.value,
                         r->case_name, r->tokens);
            }
        } else if (strcmp(r->impl, "sneppx") == 0 && strcmp(r->case_name, "decode b1") == 0 && r->tokens == 4096) {
            single_found = 1;
            single = bench_peak_fraction(r);
        } else if (strcmp(r->impl, "sneppx") == 0 && strncmp(r->case_name, "decode b", 8) == 0 &&
                   strcmp(r->case_name, "decode b1") != 0 && bench_peak_fraction(r) < worst_batch) {
            batch_found = 1;
            worst_batch = bench_peak_fraction(r);
            snprintf(batch_case, sizeof batch_case, "worst %s, context %lld: %.0f%% of roofline", r->case_name,
                     r->tokens, 100 * worst_batch);
        } else if (strcmp(r->impl, "chunked") == 0 && row.baseline_impl[0]) {
            chunked_found = 1;
            chunked = row.speedup;
        }
    }
    char detail[96];
    snprintf(detail, sizeof detail, "%.0f%% of roofline", 100 * single);
    verdict(single_found, single >= 0.85, "generate b1, context 4096: >= 85% of roofline", detail);
    verdict(batch_found, worst_batch >= 0.8, "generate ragged b16, every context: >= 80% of roofline", batch_case);
    snprintf(detail, sizeof detail, "%.2fx", chunked);
    verdict(chunked_found, chunked >= 0.95, "chunked prefill: >= 0.95x one-shot", detail);
    verdict(heap_found, worst_heap <= 0, "a warm decode step allocates nothing", heap_case);
}

void bench_report_targets(const struct bench_context *ctx)
{
    const int threads = ctx->thread_counts[ctx->thread_count_n - 1];
    char title[96];
    snprintf(title, sizeof title, "performance targets, on %d threads%s", threads,
             ctx->quick ? " (--quick sizes: not meaningful)" : "");
    bench_report_section(title, NULL);
    check_projections(threads);
    check_flash(threads);
    check_decode(threads);
    check_memory();
    check_layer(threads);
    check_scaling(threads);
    check_jit();
    check_precision(threads);
    check_generate(threads);
}
