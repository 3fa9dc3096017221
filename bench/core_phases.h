/* Whether the cores kept their speed: each core's FMA rate sampled in short
 * windows, all cores at once. A virtual machine whose cores share physical ones
 * with other guests can run a core at half speed for seconds at a time, which no
 * steal time shows; a two-thread case split evenly then waits for the slower
 * core, and its medians mix phases. */
#ifndef SNEPPX_BENCH_CORE_PHASES_H
#define SNEPPX_BENCH_CORE_PHASES_H

/* A sample slower than this share of its core's fastest counts as a slow phase
 * (the sampling's own spread on a quiet core stays within a few percent). */
#define CORE_PHASE_SLOW_SHARE 0.9

struct core_phase_summary {
    double fastest, median, slowest; /* of one core's samples, in its rate's unit */
    double slow_share;               /* of its samples below CORE_PHASE_SLOW_SHARE x fastest */
};

/* rates[core * samples + s]: core's rate in window s. Fills per_core[core] and
 * returns the share of windows in which any core was slow (what an even split
 * over all of them waits for). */
double core_phases_summarize(const double *rates, int cores, int samples, struct core_phase_summary *per_core);

#endif
