/* Side-by-side lines on stdout, and the rows behind them for the CSV. */
#include "report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct csv_row {
    struct bench_result result;
    char baseline_impl[24];
    double speedup;        /* baseline time / this time; 0 = no baseline */
    int is_value;          /* a bench_record_value row */
    double value;
    char value_unit[12];
};

static struct csv_row *rows;
static size_t row_count, row_capacity;

static struct csv_row *new_row(void)
{
    if (row_count == row_capacity) {
        const size_t capacity = row_capacity ? 2 * row_capacity : 64;
        struct csv_row *grown = realloc(rows, capacity * sizeof *grown);
        if (!grown)
            return NULL; /* the table on stdout is complete; only the CSV loses the row */
        rows = grown;
        row_capacity = capacity;
    }
    struct csv_row *row = &rows[row_count++];
    memset(row, 0, sizeof *row);
    return row;
}

double bench_rate(const struct bench_result *r, double seconds)
{
    return seconds > 0 ? r->work / seconds * 1e-9 : 0;
}

double bench_peak_fraction(const struct bench_result *r)
{
    return r->peak_rate > 0 ? bench_rate(r, r->seconds.median) / r->peak_rate : 0;
}

void bench_report_section(const char *title, const char *explanation)
{
    printf("\n== %s\n", title);
    if (explanation && explanation[0])
        printf("   %s\n", explanation);
    fflush(stdout);
}

/* "12.34" with about four significant digits, for milliseconds. */
static void format_ms(double seconds, char *text, size_t size)
{
    const double ms = seconds * 1e3;
    snprintf(text, size, ms < 1 ? "%.3f" : ms < 100 ? "%.2f" : ms < 10000 ? "%.1f" : "%.0f", ms);
}

static void print_result(const struct bench_result *r)
{
    char median[16], lo[16], hi[16];
    format_ms(r->seconds.median, median, sizeof median);
    format_ms(r->seconds.min, lo, sizeof lo);
    format_ms(r->seconds.max, hi, sizeof hi);
    printf("%-8s %8s ms [%s-%s] %6.1f %s [%.1f-%.1f]", r->impl, median, lo, hi,
           bench_rate(r, r->seconds.median), r->unit == BENCH_UNIT_FLOPS ? "GF/s" : "GB/s",
           bench_rate(r, r->seconds.max), bench_rate(r, r->seconds.min));
    if (r->peak_rate > 0)
        printf(" %3.0f%%", 100 * bench_peak_fraction(r));
}

static void record(const struct bench_result *r, const struct bench_result *baseline, double speedup)
{
    struct csv_row *row = new_row();
    if (!row)
        return;
    row->result = *r;
    if (baseline && speedup > 0) {
        snprintf(row->baseline_impl, sizeof row->baseline_impl, "%s", baseline->impl);
        row->speedup = speedup;
    }
}

/* A line with speedup (0 = none) and its range over rounds (NULL = none). */
static void report_line(const struct bench_result *subject, const struct bench_result *baseline, double speedup,
                        const struct bench_stats *range, const char *note)
{
    char tokens[24] = "";
    if (subject->tokens > 0)
        snprintf(tokens, sizeof tokens, "T=%lld", subject->tokens);
    printf("  %-22s %-7s %dt | ", subject->case_name, tokens, subject->threads);
    print_result(subject);
    if (baseline) {
        printf(" | ");
        print_result(baseline);
        printf(" | %5.2fx", speedup);
        if (range)
            printf(" [%.2f-%.2f]", range->min, range->max);
    }
    if (note && note[0])
        printf("  %s", note);
    printf("\n");
    fflush(stdout);
    record(subject, baseline, speedup);
    if (baseline)
        record(baseline, NULL, 0);
}

void bench_report_pair(const struct bench_result *subject, const struct bench_result *baseline, const char *note)
{
    const double speedup =
        baseline && subject->seconds.median > 0 ? baseline->seconds.median / subject->seconds.median : 0;
    report_line(subject, baseline, speedup, NULL, note);
}

void bench_report_rounds(const struct bench_result *subject, const struct bench_result *baseline,
                         const struct bench_stats *speedup, const char *note)
{
    report_line(subject, baseline, speedup->median, speedup->reps > 1 ? speedup : NULL, note);
}

void bench_format_scaling(char *text, size_t size, int threads, const struct bench_stats *scaling)
{
    const int length = snprintf(text, size, "%dt/1t %.2fx", threads, scaling->median);
    if (scaling->reps > 1 && length > 0 && (size_t)length < size)
        snprintf(text + length, size - (size_t)length, " [%.2f-%.2f]", scaling->min, scaling->max);
}

void bench_record_value(const char *stage, const char *case_name, const char *impl, long long tokens,
                        int threads, double value, const char *unit)
{
    struct csv_row *row = new_row();
    if (!row)
        return;
    snprintf(row->result.stage, sizeof row->result.stage, "%s", stage);
    snprintf(row->result.case_name, sizeof row->result.case_name, "%s", case_name);
    snprintf(row->result.impl, sizeof row->result.impl, "%s", impl);
    row->result.tokens = tokens;
    row->result.threads = threads;
    row->is_value = 1;
    row->value = value;
    snprintf(row->value_unit, sizeof row->value_unit, "%s", unit);
}

size_t bench_row_count(void) { return row_count; }

void bench_row_at(size_t index, struct bench_row_view *view)
{
    const struct csv_row *row = &rows[index];
    view->result = &row->result;
    view->baseline_impl = row->baseline_impl;
    view->speedup = row->speedup;
    view->value_unit = row->is_value ? row->value_unit : NULL;
    view->value = row->value;
}

int bench_write_csv(const char *path)
{
    FILE *file = fopen(path, "w");
    if (!file)
        return -1;
    fprintf(file, "stage,case,impl,tokens,threads,median_ms,min_ms,max_ms,reps,"
                  "unit,value,value_min,value_max,peak,fraction_of_peak,baseline,speedup\n");
    for (size_t i = 0; i < row_count; i++) {
        const struct csv_row *row = &rows[i];
        const struct bench_result *r = &row->result;
        fprintf(file, "%s,%s,%s,%lld,%d,", r->stage, r->case_name, r->impl, r->tokens, r->threads);
        if (row->is_value) {
            fprintf(file, ",,,,%s,%.6g,,,,,,\n", row->value_unit, row->value);
            continue;
        }
        fprintf(file, "%.6g,%.6g,%.6g,%d,%s,%.6g,%.6g,%.6g,", r->seconds.median * 1e3, r->seconds.min * 1e3,
                r->seconds.max * 1e3, r->seconds.reps, r->unit == BENCH_UNIT_FLOPS ? "GFLOP/s" : "GB/s",
                bench_rate(r, r->seconds.median), bench_rate(r, r->seconds.max), bench_rate(r, r->seconds.min));
        if (r->peak_rate > 0)
            fprintf(file, "%.6g,%.6g,", r->peak_rate, bench_peak_fraction(r));
        else
            fprintf(file, ",,");
        if (row->baseline_impl[0])
            fprintf(file, "%s,%.6g\n", row->baseline_impl, row->speedup);
        else
            fprintf(file, ",\n");
    }
    const int failed = ferror(file);
    if (fclose(file) != 0 || failed) {
        if (!errno)
            errno = EIO;
        return -1;
    }
    return 0;
}
