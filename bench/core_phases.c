/* Summaries of per-core rate samples (core_phases.h); the sampling is the peak
 * stage's. */
#include "core_phases.h"

#include <stdlib.h>
#include <string.h>

#include "timing.h"

double core_phases_summarize(const double *rates, int cores, int samples, struct core_phase_summary *per_core)
{
    if (cores <= 0 || samples <= 0)
        return 0;
    double *sorted = malloc((size_t)samples * sizeof(double));
    if (!sorted)
        return 0;
    for (int c = 0; c < cores; c++) {
        memcpy(sorted, rates + (size_t)c * (size_t)samples, (size_t)samples * sizeof(double));
        struct bench_stats stats;
        bench_stats_of(sorted, samples, &stats);
        struct core_phase_summary *s = &per_core[c];
        s->slowest = stats.min;
        s->fastest = stats.max;
        s->median = stats.median;
        int slow = 0;
        for (int i = 0; i < samples; i++)
            slow += sorted[i] < CORE_PHASE_SLOW_SHARE * s->fastest;
        s->slow_share = (double)slow / samples;
    }
    free(sorted);
    int any_slow = 0;
    for (int i = 0; i < samples; i++) {
        int slow = 0;
        for (int c = 0; c < cores; c++)
            slow |= rates[(size_t)c * (size_t)samples + (size_t)i] < CORE_PHASE_SLOW_SHARE * per_core[c].fastest;
        any_slow += slow;
    }
    return (double)any_slow / samples;
}
