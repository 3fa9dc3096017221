/* The bench's performance targets (bench/targets.c) on rows recorded by hand: which
 * row decides each verdict, and when a target is n/a rather than MISS. Nothing is
 * timed. Checks that on a one-core host the one-token projections are judged by the
 * projections' rows (not by the weight sweep's, recorded as gemm rows of one token on
 * one thread too) and that the all-core scaling is not measured (a row against itself
 * is no scaling); and that on two threads the scaling and projection targets still
 * read met or MISS from the rows' numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "report.h"

static int failures;

/* A row of `seconds` per run whose rate is `rate` (GFLOP/s or GB/s) at `peak` (0: none). */
static struct bench_result row(const char *stage, const char *case_name, const char *impl, long long tokens,
                               int threads, enum bench_unit unit, double seconds, double rate, double peak,
                               double scaling)
{
    struct bench_result r = {.tokens = tokens, .threads = threads, .unit = unit, .peak_rate = peak,
                             .scaling = scaling};
    snprintf(r.stage, sizeof r.stage, "%s", stage);
    snprintf(r.case_name, sizeof r.case_name, "%s", case_name);
    snprintf(r.impl, sizeof r.impl, "%s", impl);
    r.seconds = (struct bench_stats){seconds, seconds, seconds, 3};
    r.work = rate * 1e9 * seconds;
    return r;
}

/* A projection row of sneppx and its OpenBLAS baseline (speedup = their times' ratio). */
static void projection(const char *case_name, long long tokens, int threads, double fraction, double speedup,
                       double scaling)
{
    const int decode = tokens == 1;
    const enum bench_unit unit = decode ? BENCH_UNIT_BYTES : BENCH_UNIT_FLOPS;
    const double peak = 100 * threads, seconds = 0.01;
    struct bench_result ours = row("gemm", case_name, "sneppx", tokens, threads, unit, seconds, fraction * peak,
                                   peak, scaling);
    struct bench_result theirs = ours;
    snprintf(theirs.impl, sizeof theirs.impl, decode ? "sgemv" : "sgemm");
    theirs.seconds.median = theirs.seconds.min = theirs.seconds.max = seconds * speedup;
    theirs.scaling = 0;
    bench_report_pair(&ours, &theirs, NULL);
}

/* The weight sweep's two rows of one type: L2 (no peak) and from memory (half the bandwidth). */
static void sweep(void)
{
    struct bench_result in_l2 =
        row("gemm", BENCH_SWEEP_CASE_PREFIX "f32 L2 512K", "sneppx", 1, 1, BENCH_UNIT_BYTES, 0.001, 150, 0, 0);
    struct bench_result from_memory =
        row("gemm", BENCH_SWEEP_CASE_PREFIX "f32 memory", "sneppx", 1, 1, BENCH_UNIT_BYTES, 0.001, 50, 100, 0);
    bench_report_pair(&in_l2, NULL, NULL);
    bench_report_pair(&from_memory, NULL, NULL);
}

/* A generate-stage decode row at `fraction` of its roofline (bytes over the read bandwidth),
 * its heap growth over the warm steps beside it. */
static void generate_decode(const char *case_name, long long context, int threads, double fraction,
                            double heap_growth)
{
    const double bandwidth = 50;
    struct bench_result ours =
        row("generate", case_name, "sneppx", context, threads, BENCH_UNIT_BYTES, 0.005, fraction * bandwidth,
            bandwidth, 0);
    bench_report_pair(&ours, NULL, NULL);
    bench_record_value("generate", case_name, GENERATE_HEAP_GROWTH, context, threads, heap_growth, "B");
}

/* Chunked prefill against the one-shot forward: speedup = one-shot time / chunked time. */
static void generate_chunked(int threads, double speedup)
{
    struct bench_result ours = row("generate", "prefill 512-token chunks", "chunked", 4096, threads,
                                   BENCH_UNIT_FLOPS, 0.1, 100, 200, 0);
    struct bench_result theirs = ours;
    snprintf(theirs.impl, sizeof theirs.impl, "one-shot");
    theirs.seconds.median = theirs.seconds.min = theirs.seconds.max = 0.1 * speedup;
    bench_report_pair(&ours, &theirs, NULL);
}

/* The targets' lines for ctx, read back from stdout. */
static char *targets_text(const struct bench_context *ctx)
{
    char path[] = "/tmp/sneppx-test-targets-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        exit(1);
    }
    fflush(stdout);
    const int saved = dup(STDOUT_FILENO);
    dup2(fd, STDOUT_FILENO);
    bench_report_targets(ctx);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    const off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)size + 1);
    if (!text || pread(fd, text, (size_t)size, 0) != size) {
        perror("read");
        exit(1);
    }
    close(fd);
    unlink(path);
    return text;
}

/* The line of text naming target, which must start with verdict ("met ", "MISS", "n/a "). */
static void expect(const char *text, const char *target, const char *verdict)
{
    const char *at = strstr(text, target);
    const char *line = at;
    while (line && line > text && line[-1] != '\n')
        line--;
    char want[16];
    snprintf(want, sizeof want, "  [%s]", verdict);
    if (!at || strncmp(line, want, strlen(want)) != 0) {
        fprintf(stderr, "FAIL: '%s' wants [%s], got: %.*s\n", target, verdict,
                at ? (int)strcspn(line, "\n") : 9, at ? line : "no line");
        failures++;
    }
}

int main(void)
{
    /* One core: every row is a one-thread row, and the sweep's are gemm rows of one token. */
    struct bench_context one = {.thread_counts = {1}, .thread_count_n = 1};
    projection("qkv 4096x6144", 1, 1, 0.95, 1.10, 0);
    projection("qkv 4096x6144", 2048, 1, 0.90, 1.05, 0);
    sweep();
    char *text = targets_text(&one);
    expect(text, "projections T = 1: >= 90% of read bandwidth, >= 1.0x sgemv", "met ");
    expect(text, "projections T >= 512: >= 1.0x OpenBLAS; T = 2048: >= 85% of peak", "met ");
    expect(text, "1 threads >= 1.85x 1 thread", "n/a ");
    free(text);

    /* Two threads: the all-core rows decide, their per-round scaling against one thread. */
    struct bench_context two = {.thread_counts = {1, 2}, .thread_count_n = 2};
    projection("o 4096x4096", 512, 1, 0.90, 1.02, 0);
    projection("o 4096x4096", 512, 2, 0.90, 1.02, 1.95);
    projection("qkv 4096x6144", 1, 2, 0.92, 1.01, 0);
    text = targets_text(&two);
    expect(text, "2 threads >= 1.85x 1 thread", "met ");
    expect(text, "projections T = 1: >= 90% of read bandwidth, >= 1.0x sgemv", "met ");
    free(text);
    projection("qkv 4096x6144", 2048, 2, 0.88, 0.98, 1.70);
    text = targets_text(&two);
    expect(text, "2 threads >= 1.85x 1 thread", "MISS");
    expect(text, "projections T >= 512: >= 1.0x OpenBLAS; T = 2048: >= 85% of peak", "MISS");
    free(text);

    /* Generation: nothing recorded yet is n/a; then the rows decide, batch 16 by its worst
     * context, the heap by its largest growth, on the all-core rows only. */
    text = targets_text(&two);
    expect(text, "generate b1, context 4096: >= 85% of roofline", "n/a ");
    expect(text, "a warm decode step allocates nothing", "n/a ");
    free(text);
    generate_decode("decode b1", 4096, 1, 0.50, 4096); /* one thread's rows do not count */
    generate_decode("decode b1", 4096, 2, 0.90, 0);
    generate_decode("decode b1", 512, 2, 0.60, 0);     /* only context 4096 is held to 85% */
    generate_decode("decode b16 ragged", 512, 2, 0.85, 0);
    generate_decode("decode b16 ragged", 4096, 2, 0.82, 0);
    generate_chunked(1, 0.80);
    generate_chunked(2, 0.99);
    text = targets_text(&two);
    expect(text, "generate b1, context 4096: >= 85% of roofline", "met ");
    expect(text, "generate ragged b16, every context: >= 80% of roofline", "met ");
    expect(text, "chunked prefill: >= 0.95x one-shot", "met ");
    expect(text, "a warm decode step allocates nothing", "met ");
    free(text);
    generate_decode("decode b16 ragged", 32768, 2, 0.66, 64);
    text = targets_text(&two);
    expect(text, "generate ragged b16, every context: >= 80% of roofline", "MISS");
    expect(text, "a warm decode step allocates nothing", "MISS");
    expect(text, "generate b1, context 4096: >= 85% of roofline", "met ");
    free(text);

    /* bfloat16 compute: the verdict is the speedup's; the detail names the share of the
     * vdpbf16ps peak and that peak against the FMA's, from the peak stage's rows. */
    struct bench_result f32 = row("precision", "prefill f32", "sneppx f32", 2048, 2, BENCH_UNIT_FLOPS, 0.7, 280, 460, 0);
    struct bench_result dot =
        row("precision", "prefill bf16-compute", "sneppx bf16-compute", 2048, 2, BENCH_UNIT_FLOPS, 1.0, 196, 230, 0);
    bench_report_pair(&f32, NULL, NULL);
    bench_report_pair(&dot, &f32, NULL);
    text = targets_text(&two);
    expect(text, "prefill T = 2048, bf16-compute: >= 1.60x f32", "MISS");
    if (!strstr(text, "0.70x\n"))
        fprintf(stderr, "FAIL: without the peak stage's rows the detail is the speedup alone\n"), failures++;
    free(text);
    struct bench_result fma = row("peak", "fma 16-lane vectors", "fma", 0, 2, BENCH_UNIT_FLOPS, 0.2, 460, 0, 0);
    struct bench_result dot_peak = row("peak", "vdpbf16ps 16-lane", "vdpbf16ps", 0, 2, BENCH_UNIT_FLOPS, 0.2, 230, 0, 0);
    bench_report_pair(&fma, NULL, NULL);
    bench_report_pair(&dot_peak, NULL, NULL);
    text = targets_text(&two);
    expect(text, "prefill T = 2048, bf16-compute: >= 1.60x f32", "MISS");
    if (!strstr(text, "0.70x, 85% of the vdpbf16ps peak (0.50x the FMA peak here)"))
        fprintf(stderr, "FAIL: the bf16-compute detail wants its share of the vdpbf16ps peak\n"), failures++;
    free(text);

    if (failures)
        return 1;
    printf("bench targets: ok\n");
    return 0;
}
