/* Repeated timing with warm-up; median, min and max of the repeats. */
#include "timing.h"

#include <stdlib.h>
#include <time.h>

#define BENCH_MAX_REPS 64
/* A side whose warm-up run took less than this runs untimed for at least this
 * long before each of its turns in a round: after another side's turn (and a
 * settle) its caches are cold and its threads asleep, which one millisecond run
 * does not undo; a longer run hardly notices. */
#define WARM_TURN_SECONDS 0.05
#define SETTLE_NANOSECONDS 250000000L /* > OpenBLAS's 2^28-cycle spin at ~2 GHz */

static double monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double (*now_source)(void) = monotonic_now;

double bench_now(void) { return now_source(); }

void bench_set_clock(double (*now)(void)) { now_source = now ? now : monotonic_now; }

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int plan_max_reps(const struct bench_plan *plan)
{
    return plan->max_reps < BENCH_MAX_REPS ? plan->max_reps : BENCH_MAX_REPS;
}

/* The plan's fewest timed runs: at least 1, at most plan_max_reps. */
static int plan_min_reps(const struct bench_plan *plan)
{
    const int max_reps = plan_max_reps(plan);
    const int min_reps = plan->min_reps < max_reps ? plan->min_reps : max_reps;
    return min_reps > 1 ? min_reps : 1;
}

/* How many timed runs a body gets after a warm-up run took warm_seconds: the
 * warm-up predicts one repeat, so a slow body does not run max_reps times. */
static int planned_reps(const struct bench_plan *plan, double warm_seconds)
{
    const int min_reps = plan_min_reps(plan);
    int reps = plan_max_reps(plan);
    if (warm_seconds > 0 && (double)reps * warm_seconds > plan->budget_seconds)
        reps = (int)(plan->budget_seconds / warm_seconds);
    return reps < min_reps ? min_reps : reps;
}

/* Runs body plan->warmup times untimed; *seconds is the last run's time. */
static int warm_up(bench_body body, void *state, const struct bench_plan *plan, double *seconds)
{
    *seconds = 0;
    for (int i = 0; i < plan->warmup; i++) {
        const double start = bench_now();
        const int failed = body(state);
        if (failed)
            return failed;
        *seconds = bench_now() - start;
    }
    return 0;
}

int bench_measure(bench_body body, void *state, const struct bench_plan *plan, struct bench_stats *stats)
{
    double times[BENCH_MAX_REPS];
    double warm_seconds;
    int failed = warm_up(body, state, plan, &warm_seconds);
    if (failed)
        return failed;
    const int reps = planned_reps(plan, warm_seconds), min_reps = plan_min_reps(plan);
    const double deadline = bench_now() + plan->budget_seconds;
    int done = 0;
    while (done < reps) {
        const double start = bench_now();
        if ((failed = body(state)) != 0)
            return failed;
        times[done++] = bench_now() - start;
        /* Without a warm-up there is no prediction: stop at the budget instead. */
        if (plan->warmup == 0 && done >= min_reps && bench_now() > deadline)
            break;
    }
    bench_stats_of(times, done, stats);
    return 0;
}

/* The side whose turn `turn` of round `round` is. Each round starts one side further
 * on, and every other round runs the sides in the reverse order, so that no side
 * always follows the same one (or always a settle): a rotation alone keeps each side
 * after its one neighbour in all but the rounds it starts (A B C, B C A, C A B: B
 * always after A). With two sides, A B, B A, A B, ...; with three, A B C, B A C,
 * C A B, A C B, B C A, C B A. */
static int turn_side(int round, int turn, int count)
{
    return round % 2 == 0 ? (round + turn) % count : ((round - turn) % count + count) % count;
}

int bench_measure_sides(const struct bench_side *sides, int count, const struct bench_plan *plan,
                        struct bench_stats *stats, struct bench_rounds *rounds)
{
    double times[BENCH_MAX_SIDES][BENCH_MAX_REPS], warm_seconds[BENCH_MAX_SIDES];
    int reps[BENCH_MAX_SIDES], done[BENCH_MAX_SIDES] = {0};
    if (count < 0 || count > BENCH_MAX_SIDES)
        return -1;
    /* The warm-up sizes the repeats: at least one, whatever the plan says. */
    struct bench_plan warmed = *plan;
    warmed.warmup = plan->warmup > 0 ? plan->warmup : 1;
    int round_count = BENCH_MAX_ROUNDS, repeated = 0;
    for (int s = 0; s < count; s++) {
        const int failed = warm_up(sides[s].body, sides[s].state, &warmed, &warm_seconds[s]);
        if (sides[s].after)
            sides[s].after();
        if (failed)
            return failed;
        reps[s] = sides[s].once ? 1 : planned_reps(&warmed, warm_seconds[s]);
        if (!sides[s].once) {
            round_count = reps[s] < round_count ? reps[s] : round_count;
            repeated = 1;
        }
    }
    if (!repeated) /* no side, or only `once` sides: one round */
        round_count = count > 0 ? 1 : 0;
    if (rounds) {
        rounds->sides = count;
        rounds->rounds = round_count;
    }
    for (int round = 0; round < round_count; round++)
        for (int turn = 0; turn < count; turn++) {
            const int s = turn_side(round, turn, count);
            const struct bench_side *side = &sides[s];
            if (side->once && round > 0) {
                if (rounds)
                    rounds->median[round][s] = 0;
                continue;
            }
            if (warm_seconds[s] < WARM_TURN_SECONDS) {
                const double until = bench_now() + WARM_TURN_SECONDS;
                do {
                    const int failed = side->body(side->state);
                    if (failed)
                        return failed;
                } while (bench_now() < until);
            }
            /* reps[s] spread over the rounds, the first reps[s] % round_count taking one more
             * (a `once` side's one repeat: the first round's, as round 0 < 1 % round_count
             * when there are more rounds, and 1 / 1 when there is one). */
            const int first = done[s], in_round = reps[s] / round_count + (round < reps[s] % round_count);
            for (int i = 0; i < in_round; i++) {
                const double start = bench_now();
                const int failed = side->body(side->state);
                if (failed)
                    return failed;
                times[s][done[s]++] = bench_now() - start;
            }
            if (side->after)
                side->after();
            if (rounds) {
                struct bench_stats this_round; /* sorts the round's slice in place: the final stats do not mind */
                bench_stats_of(&times[s][first], in_round, &this_round);
                rounds->median[round][s] = this_round.median;
            }
        }
    for (int s = 0; s < count; s++)
        bench_stats_of(times[s], done[s], &stats[s]);
    return 0;
}

void bench_round_ratio(const struct bench_rounds *rounds, int numerator, int denominator, struct bench_stats *ratio)
{
    double ratios[BENCH_MAX_ROUNDS];
    int count = 0;
    if (numerator >= 0 && numerator < rounds->sides && denominator >= 0 && denominator < rounds->sides)
        for (int round = 0; round < rounds->rounds; round++)
            if (rounds->median[round][numerator] > 0 && rounds->median[round][denominator] > 0)
                ratios[count++] = rounds->median[round][numerator] / rounds->median[round][denominator];
    if (count == 0) {
        *ratio = (struct bench_stats){0};
        return;
    }
    bench_stats_of(ratios, count, ratio);
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
