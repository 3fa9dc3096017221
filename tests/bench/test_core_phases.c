/* core_phases_summarize on made-up samples: each core's fastest, median and
 * slowest, its share of slow windows, and the share of windows where any core was
 * slow (nothing is timed). */
#include <math.h>
#include <stdio.h>

#include "core_phases.h"

static int failures;

static void expect(double got, double want, const char *what)
{
    if (fabs(got - want) > 1e-12) {
        fprintf(stderr, "FAIL %s: got %.6g, want %.6g\n", what, got, want);
        failures++;
    }
}

int main(void)
{
    /* Core 0 slow in windows 0-1, core 1 in windows 1-3; 90% of 100 is the bar, so
     * 90.0 is not slow and 89.9 is. */
    const double rates[2][6] = {{50, 55, 100, 99, 90.0, 98}, {100, 60, 89.9, 58, 100, 97}};
    struct core_phase_summary per_core[2];
    const double any = core_phases_summarize(&rates[0][0], 2, 6, per_core);
    expect(per_core[0].fastest, 100, "core 0 fastest");
    expect(per_core[0].slowest, 50, "core 0 slowest");
    expect(per_core[0].median, (90.0 + 98) / 2, "core 0 median (even count)");
    expect(per_core[0].slow_share, 2.0 / 6, "core 0 slow share");
    expect(per_core[1].slow_share, 3.0 / 6, "core 1 slow share");
    expect(any, 4.0 / 6, "windows with any core slow");

    /* A steady core: no slow window; an odd count's median is its middle sample. */
    const double steady[5] = {100, 97, 99, 98, 96};
    struct core_phase_summary one;
    expect(core_phases_summarize(steady, 1, 5, &one), 0, "steady: no slow window");
    expect(one.median, 98, "steady median");
    expect(one.slow_share, 0, "steady slow share");

    /* Nothing sampled: nothing summarized. */
    expect(core_phases_summarize(steady, 0, 5, &one), 0, "no cores");
    if (failures)
        return 1;
    printf("core_phases: ok\n");
    return 0;
}
