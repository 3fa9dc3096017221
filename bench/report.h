/* The bench's output: aligned side-by-side lines on stdout and one CSV row per
 * measurement (bench/plot.py draws the chart from it). */
#ifndef SNEPPX_BENCH_REPORT_H
#define SNEPPX_BENCH_REPORT_H

#include <stddef.h>

#include "timing.h"

enum bench_unit {
    BENCH_UNIT_FLOPS, /* work counts floating-point operations; rates in GFLOP/s */
    BENCH_UNIT_BYTES  /* work counts bytes read; rates in GB/s */
};

/* One measured implementation of one case. */
struct bench_result {
    char stage[16];       /* "peak", "gemm", "attention", "layer" */
    char case_name[48];   /* "qkv 4096x6144", "llama3-8B", "causal d128 g4" */
    char impl[24];        /* "sneppx", "openblas", "pytorch", "flash", "sdpa" */
    long long tokens;     /* T, 0 where it does not apply */
    int threads;
    struct bench_stats seconds;
    double work;          /* flops the mask keeps, or bytes, of one run */
    enum bench_unit unit;
    double peak_rate;     /* the rate that is 100% (GFLOP/s or GB/s); 0 = none */
    double scaling;       /* 1-thread time / this time, median of per-round ratios; 0 = not measured so */
};

/* Rate of one run of r that took `seconds` (GFLOP/s or GB/s). */
double bench_rate(const struct bench_result *r, double seconds);

/* Fraction of r's peak at its median (0 when r has no peak). */
double bench_peak_fraction(const struct bench_result *r);

/* Starts a section: a title and one line saying what its columns mean. */
void bench_report_section(const char *title, const char *explanation);

/* One line: subject and baseline (NULL = none) side by side, each as median
 * ms [min-max], rate [min-max] and fraction of peak, then the speedup
 * baseline median time / subject median time (the rate ratio when both do the
 * same work). note (may be NULL) ends the line. Records both for the CSV. */
void bench_report_pair(const struct bench_result *subject, const struct bench_result *baseline, const char *note);

/* bench_report_pair for a subject and baseline timed in the same rounds
 * (bench_measure_sides): the speedup is `speedup`, the median over the rounds
 * of baseline time / subject time, printed with its [min-max]. */
void bench_report_rounds(const struct bench_result *subject, const struct bench_result *baseline,
                         const struct bench_stats *speedup, const char *note);

/* "2t/1t 1.93x [1.85-2.01]" into text (the range when there was more than one
 * round): a row's scaling, its 1-thread time / its `threads`-thread time. */
void bench_format_scaling(char *text, size_t size, int threads, const struct bench_stats *scaling);

/* Records a scalar for the CSV: a JIT time in ms, a memory size in MiB. */
void bench_record_value(const char *stage, const char *case_name, const char *impl, long long tokens,
                        int threads, double value, const char *unit);

/* The recorded rows, in order: a measurement (value_unit NULL) or a scalar. */
struct bench_row_view {
    const struct bench_result *result; /* stage, case, impl, tokens, threads (and seconds, work, peak) */
    const char *baseline_impl;         /* "" when the row had no baseline */
    double speedup;                    /* baseline time / this time, 0 without a baseline */
    const char *value_unit;            /* scalars only: "ms", "MiB" */
    double value;
};
size_t bench_row_count(void);
void bench_row_at(size_t index, struct bench_row_view *view);

/* Writes every recorded row to path. Returns 0, or -1 with errno set. */
int bench_write_csv(const char *path);

#endif
