/* Repeated timing: warm-up runs, then a median with min and max over repeats. */
#ifndef SNEPPX_BENCH_TIMING_H
#define SNEPPX_BENCH_TIMING_H

/* Seconds on the monotonic clock. */
double bench_now(void);

/* How often to run a body: `warmup` untimed runs (they absorb first-touch page
 * faults, cold caches and thread start-up), then repeats until both
 * `min_reps` are done and `budget_seconds` is spent, but never more than
 * `max_reps`. The warm-up time picks the count up front, so a slow body
 * (SDPA at T = 8192) runs min_reps times and a fast one max_reps. */
struct bench_plan {
    int warmup;
    int min_reps;
    int max_reps;
    double budget_seconds;
};

/* Seconds per run: median, fastest, slowest, and how many runs they are of (or
 * the same of any values given to bench_stats_of). */
struct bench_stats {
    double median, min, max;
    int reps;
};

/* One run of the measured work; returns 0, or nonzero to stop (an error). */
typedef int (*bench_body)(void *state);

/* Runs body per plan and fills stats. Returns the body's first nonzero result. */
int bench_measure(bench_body body, void *state, const struct bench_plan *plan, struct bench_stats *stats);

/* Fills stats from count >= 1 values measured elsewhere (sorts them in place). */
void bench_stats_of(double *values, int count, struct bench_stats *stats);

/* Sleeps long enough for the worker threads of the library measured last
 * (OpenBLAS spins ~2^28 cycles, libgomp ~300k spins) to go idle, so they do
 * not steal a core from the next measurement on this 2-core machine. */
void bench_settle(void);

#endif
