/* Summaries of per-core rate samples (core_phases.h); the sampling is the peak
 * stage's. */
#include "core_phases.h"

#include <stdlib.h>
#include <string.h>

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double core_phases_summarize(const double *rates, int cores, int samples, struct core_phase_summary *per_core)
{
    if (cores <= 0 || samples <= 0)
        return 0;
    double *sorted = malloc((size_t)samples * sizeof(double));
    if (!sorted)
        return 0;
    for (int c = 0; c < cores; c++) {
        memcpy(sorted, rates + (size_t)c * (size_t)samples, (size_t)samples * sizeof(double));
        qsort(sorted, (size_t)samples, sizeof(double), compare_doubles);
        struct core_phase_summary *s = &per_core[c];
        s->slowest = sorted[0];
        s->fastest = sorted[samples - 1];
        s->median = samples % 2 ? sorted[samples / 2] : (sorted[samples / 2 - 1] + sorted[samples / 2]) / 2;
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
