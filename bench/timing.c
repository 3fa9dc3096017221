/* Repeated timing with warm-up; median, min and max of the repeats. */
#include "timing.h"

#include <stdlib.h>
#include <time.h>

#define BENCH_MAX_REPS 64
#define SETTLE_NANOSECONDS 250000000L /* > OpenBLAS's 2^28-cycle spin at ~2 GHz */

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int bench_measure(bench_body body, void *state, const struct bench_plan *plan, struct bench_stats *stats)
{
    double times[BENCH_MAX_REPS];
    double warm_seconds = 0;
    for (int i = 0; i < plan->warmup; i++) {
        const double start = bench_now();
        const int failed = body(state);
        if (failed)
            return failed;
        warm_seconds = bench_now() - start;
    }
    int max_reps = plan->max_reps < BENCH_MAX_REPS ? plan->max_reps : BENCH_MAX_REPS;
    int min_reps = plan->min_reps < max_reps ? plan->min_reps : max_reps;
    if (min_reps < 1)
        min_reps = 1;
    /* The warm-up run predicts one repeat; plan the count from it so that a
     * slow body does not run max_reps times. */
    int reps = max_reps;
    if (warm_seconds > 0 && (double)reps * warm_seconds > plan->budget_seconds)
        reps = (int)(plan->budget_seconds / warm_seconds);
    if (reps < min_reps)
        reps = min_reps;
    const double deadline = bench_now() + plan->budget_seconds;
    int done = 0;
    while (done < reps) {
        const double start = bench_now();
        const int failed = body(state);
        if (failed)
            return failed;
        times[done++] = bench_now() - start;
        /* Without a warm-up there is no prediction: stop at the budget instead. */
        if (plan->warmup == 0 && done >= min_reps && bench_now() > deadline)
            break;
    }
    bench_stats_of(times, done, stats);
    return 0;
}

void bench_stats_of(double *values, int count, struct bench_stats *stats)
{
    qsort(values, (size_t)count, sizeof values[0], compare_doubles);
    stats->reps = count;
    stats->min = values[0];
    stats->max = values[count - 1];
    stats->median = count % 2 ? values[count / 2] : 0.5 * (values[count / 2 - 1] + values[count / 2]);
}

void bench_settle(void)
{
    const struct timespec pause = {0, SETTLE_NANOSECONDS};
    nanosleep(&pause, NULL);
}
