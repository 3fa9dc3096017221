/* The bench's side-by-side timing (bench/timing.c) on a fake clock: bodies whose
 * runs take known times, and a slow phase. Checks that the sides take turns in
 * rounds (each round starting one side further on, every other one reversed, so
 * that with three sides no side always follows the same one), that each gets the repeats
 * its plan asks for, that the median of the ratios within rounds holds
 * through a slow phase, and that a side run once does not cut the rounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "timing.h"

static double fake_now;
static double slowdown = 1.0; /* the host's phase: every run takes this many times longer */

static double fake_clock(void) { return fake_now; }

#define MAX_LOG 4096
static int call_log[MAX_LOG];
static int calls;

struct fake_body {
    int side;
    double seconds; /* one run on a quiet host */
};

static int run_fake(void *state)
{
    const struct fake_body *body = state;
    fake_now += body->seconds * slowdown;
    if (calls < MAX_LOG)
        call_log[calls] = body->side;
    calls++;
    return 0;
}

static int turns; /* side 0's turns ended, its warm-up's included */

/* A slow phase: the host is 5x slower from the end of side 0's turn in round 2
 * (it goes first in even rounds) to the end of its turn in round 3 (second):
 * side 1's turn of round 2 is slow alone, round 3 slow on both sides. */
static void after_side0(void)
{
    turns++;
    slowdown = turns == 4 ? 5.0 : 1.0;
}

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

static void test_rounds_hold_the_ratio_through_a_slow_phase(void)
{
    struct fake_body a = {0, 0.010}, b = {1, 0.020};
    const struct bench_side sides[] = {{.body = run_fake, .state = &a, .after = after_side0},
                                       {.body = run_fake, .state = &b}};
    const struct bench_plan plan = {.warmup = 1, .min_reps = 4, .max_reps = 16, .budget_seconds = 0.2};
    struct bench_stats stats[2];
    struct bench_rounds rounds;
    calls = 0;
    check(bench_measure_sides(sides, 2, &plan, stats, &rounds) == 0, "measure_sides returns 0");
    /* Side 0: 0.2 s / 10 ms = 20 repeats, capped at 16; side 1: 0.2 / 20 ms = 10.
     * Rounds: min(16, 10, BENCH_MAX_ROUNDS) = 8; per round 2, and 1 or 2 (all 10 used). */
    check(rounds.rounds == 8 && rounds.sides == 2, "8 rounds of 2 sides");
    check(stats[0].reps == 16 && stats[1].reps == 10, "every planned repeat: 16 and 10 timed runs");
    /* After the warm-ups (calls 0 and 1), each turn is one block of calls of one side
     * (untimed runs for 50 ms, then the timed ones), in the order A B, B A, A B, ...:
     * 16 turns, 15 boundaries, of which the 7 between rounds keep the side. */
    int changes = 0;
    for (int i = 3; i < calls && i < MAX_LOG; i++)
        changes += call_log[i] != call_log[i - 1];
    check(call_log[0] == 0 && call_log[1] == 1 && call_log[2] == 0, "warm-ups, then side 0 first");
    check(changes == 8, "turns alternate, each round starting one side further on");
    struct bench_stats ratio;
    bench_round_ratio(&rounds, 1, 0, &ratio);
    check(ratio.reps == 8, "one ratio per round");
    check(fabs(ratio.median - 2.0) < 1e-9, "the median ratio within rounds is 2");
    /* Round 2: side 1 slow alone, 100 ms against 10 ms; round 3: both slow, ratio 2. */
    check(fabs(ratio.max - 10.0) < 1e-9 && fabs(ratio.min - 2.0) < 1e-9,
          "the slow turn shows in the range (10), not in the median");
    fprintf(stderr, "ratio %.3f [%.3f-%.3f]; overall medians %.4f / %.4f\n", ratio.median, ratio.min, ratio.max,
            stats[1].median, stats[0].median);
}

static void test_round_ratio_is_a_median_over_rounds(void)
{
    calls = 0;
    struct bench_rounds rounds = {.sides = 2, .rounds = 3};
    const double times[3][2] = {{1.0, 1.0}, {1.0, 3.0}, {2.0, 4.0}};
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 2; s++)
            rounds.median[r][s] = times[r][s];
    struct bench_stats ratio;
    bench_round_ratio(&rounds, 1, 0, &ratio);
    check(ratio.reps == 3 && ratio.median == 2.0 && ratio.min == 1.0 && ratio.max == 3.0,
          "ratios 1, 3, 2: median 2 [1-3]");
    rounds.median[1][0] = 0; /* a round without a time for the denominator is left out */
    bench_round_ratio(&rounds, 1, 0, &ratio);
    check(ratio.reps == 2 && ratio.median == 1.5, "a zero denominator's round is skipped");
    bench_round_ratio(&rounds, 2, 0, &ratio);
    check(ratio.reps == 0 && ratio.median == 0, "a side the rounds do not have gives no ratio");
}

static void test_one_round_for_a_single_repeat(void)
{
    struct fake_body a = {0, 0.5}, b = {1, 1.0};
    const struct bench_side sides[] = {{.body = run_fake, .state = &a}, {.body = run_fake, .state = &b}};
    const struct bench_plan plan = {.warmup = 1, .min_reps = 1, .max_reps = 1, .budget_seconds = 0};
    struct bench_stats stats[2];
    struct bench_rounds rounds;
    calls = 0;
    check(bench_measure_sides(sides, 2, &plan, stats, &rounds) == 0, "measure_sides returns 0 (one repeat)");
    check(rounds.rounds == 1 && stats[0].reps == 1 && stats[1].reps == 1, "one round, one run each");
    check(calls == 4, "a warm-up and a timed run per side; no untimed run for runs of 50 ms or more");
    check(bench_measure_sides(sides, BENCH_MAX_SIDES + 1, &plan, stats, &rounds) == -1,
          "more sides than BENCH_MAX_SIDES are refused");
}

/* A side too slow to repeat (SDPA at T = 8192) runs once, in the first round, and
 * the others still get their rounds; a ratio against it is that round's. */
static void test_a_once_side_runs_in_the_first_round_only(void)
{
    struct fake_body a = {0, 0.1}, b = {1, 0.2}, slow = {2, 2.0}; /* 100 ms and more: no untimed runs */
    const struct bench_side sides[3] = {{.body = run_fake, .state = &a}, {.body = run_fake, .state = &b},
                                        {.body = run_fake, .state = &slow, .once = 1}};
    const struct bench_plan plan = {.warmup = 1, .min_reps = 3, .max_reps = 3, .budget_seconds = 0};
    struct bench_stats stats[3];
    struct bench_rounds rounds;
    calls = 0;
    check(bench_measure_sides(sides, 3, &plan, stats, &rounds) == 0, "measure_sides returns 0 (a once side)");
    check(rounds.rounds == 3, "the once side does not cut the others' rounds to one");
    check(stats[0].reps == 3 && stats[1].reps == 3 && stats[2].reps == 1, "3, 3 and 1 timed runs");
    check(calls == 3 + 3 + 3 + 1, "three warm-ups, then the once side's run among the others'");
    int slow_calls = 0;
    for (int i = 3; i < calls; i++)
        slow_calls += call_log[i] == 2;
    check(slow_calls == 1 && call_log[3] == 0 && call_log[4] == 1 && call_log[5] == 2,
          "its one timed run is in the first round, after the others' turns");
    check(rounds.median[0][2] == 2.0 && rounds.median[1][2] == 0 && rounds.median[2][2] == 0,
          "its later rounds are empty");
    struct bench_stats ratio;
    bench_round_ratio(&rounds, 2, 0, &ratio);
    check(ratio.reps == 1 && fabs(ratio.median - 20.0) < 1e-9, "a ratio against it is the first round's alone");
    bench_round_ratio(&rounds, 1, 0, &ratio);
    check(ratio.reps == 3 && fabs(ratio.median - 2.0) < 1e-9, "the repeated sides' ratio is over every round");
    const struct bench_side only_once[1] = {{.body = run_fake, .state = &slow, .once = 1}};
    check(bench_measure_sides(only_once, 1, &plan, stats, &rounds) == 0 && rounds.rounds == 1 && stats[0].reps == 1,
          "once sides alone: one round");
}

/* Three sides: a rotation alone would put B after A in every round B does not start. */
static void test_three_sides_follow_different_sides(void)
{
    struct fake_body bodies[3] = {{0, 0.1}, {1, 0.1}, {2, 0.1}}; /* 100 ms: no untimed runs */
    const struct bench_side sides[3] = {{.body = run_fake, .state = &bodies[0]},
                                        {.body = run_fake, .state = &bodies[1]},
                                        {.body = run_fake, .state = &bodies[2]}};
    const struct bench_plan plan = {.warmup = 1, .min_reps = 6, .max_reps = 6, .budget_seconds = 10};
    struct bench_stats stats[3];
    struct bench_rounds rounds;
    calls = 0;
    check(bench_measure_sides(sides, 3, &plan, stats, &rounds) == 0, "measure_sides returns 0 (three sides)");
    check(rounds.rounds == 6 && calls == 3 + 18, "three warm-ups, then 6 rounds of one run per side");
    /* After the warm-ups each call is one turn: round r is calls 3 + 3r .. 3 + 3r + 2. */
    int preceded[3][3] = {{0}}, first[3] = {0};
    for (int r = 0; r < 6; r++) {
        const int *turns = &call_log[3 + 3 * r];
        first[turns[0]]++;
        for (int t = 1; t < 3; t++)
            preceded[turns[t]][turns[t - 1]]++;
    }
    for (int s = 0; s < 3; s++) {
        int neighbours = 0;
        for (int o = 0; o < 3; o++)
            neighbours += preceded[s][o] > 0;
        check(neighbours == 2, "within rounds, each side follows both others");
        check(first[s] == 2, "each side starts as many rounds");
    }
}

int main(void)
{
    bench_set_clock(fake_clock);
    test_round_ratio_is_a_median_over_rounds();
    test_rounds_hold_the_ratio_through_a_slow_phase();
    test_one_round_for_a_single_repeat();
    test_three_sides_follow_different_sides();
    test_a_once_side_runs_in_the_first_round_only();
    bench_set_clock(NULL);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("bench rounds: all checks passed\n");
    return 0;
}
