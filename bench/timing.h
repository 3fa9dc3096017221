/* Repeated timing: warm-up runs, then a median with min and max over repeats. */
#ifndef SNEPPX_BENCH_TIMING_H
#define SNEPPX_BENCH_TIMING_H

/* Seconds on the monotonic clock. */
double bench_now(void);

/* Replaces the clock bench_now reads (NULL: the monotonic clock again), so that a
 * test can drive the timing logic with runs of known length. */
void bench_set_clock(double (*now)(void));

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

/* One of the bodies bench_measure_sides times side by side. after (NULL for
 * none) runs, untimed, when the side's turn in a round ends: bench_settle for a
 * side whose library's threads spin on after a call. once: a side too slow to
 * repeat (SDPA at T = 8192 takes seconds) runs one timed repeat, in the first
 * round only, and does not limit how many rounds the others run. */
struct bench_side {
    bench_body body;
    void *state;
    void (*after)(void);
    int once;
};

#define BENCH_MAX_SIDES 10
#define BENCH_MAX_ROUNDS 8

/* Each side's median seconds per run within each round. */
struct bench_rounds {
    int sides, rounds;
    double median[BENCH_MAX_ROUNDS][BENCH_MAX_SIDES];
};

/* Times `count` (at most BENCH_MAX_SIDES) bodies side by side: after each
 * side's warm-up (at least one run, which sizes its repeats as bench_measure
 * does), rounds in which every side in turn runs its share of the repeats, each
 * round starting one side further on and every other round in reverse order, so
 * that no side always follows the same one; a side whose runs are short first runs
 * untimed for 50 ms (the other sides had the caches and cores). This host has
 * slow phases of seconds to minutes: one lands on every side of a round, so a
 * ratio of two sides within a round holds where a ratio of two sides timed one
 * after the other would not. The repeats are spread over min(fewest side's
 * repeats, BENCH_MAX_ROUNDS) rounds (a `once` side's one repeat aside).
 * stats[s]: side s over all its timed runs; rounds (may be NULL): the per-round
 * medians, 0 where a side did not run. Returns the first nonzero
 * result of a body, or -1 for a count out of range. */
int bench_measure_sides(const struct bench_side *sides, int count, const struct bench_plan *plan,
                        struct bench_stats *stats, struct bench_rounds *rounds);

/* Median [min-max] over the rounds of side `numerator`'s time / side
 * `denominator`'s in the same round, over the rounds both ran in: how many
 * times faster the denominator side ran (its speedup) when numerator is the
 * baseline. All zero (reps 0) when a side is not among the rounds'. */
void bench_round_ratio(const struct bench_rounds *rounds, int numerator, int denominator, struct bench_stats *ratio);

/* Fills stats from count >= 1 values measured elsewhere (sorts them in place). */
void bench_stats_of(double *values, int count, struct bench_stats *stats);

/* Sleeps long enough for the worker threads of the library measured last
 * (OpenBLAS spins ~2^28 cycles, libgomp ~300k spins) to go idle, so they do
 * not steal a core from the next measurement on this 2-core machine. */
void bench_settle(void);

#endif
