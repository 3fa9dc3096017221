/* The host's read bandwidth, measured as sneppx-run's decode roofline needs it:
 * threads streaming a buffer far larger than the caches, best of a few runs
 * (the host is shared and noisy; the best run is the machine, not the noise). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "run.h"

#define BUFFER_BYTES ((size_t)512 << 20)
#define RUNS 3

typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_mem __attribute__((vector_size(32), aligned(64), may_alias));

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Four independent sums, so the adds' latency does not bound the loop. */
static float read_share(const float *data, int64_t count)
{
    v8f a = {0}, b = {0}, c = {0}, d = {0};
    for (int64_t i = 0; i + 32 <= count; i += 32) {
        a += *(const v8f_mem *)(data + i);
        b += *(const v8f_mem *)(data + i + 8);
        c += *(const v8f_mem *)(data + i + 16);
        d += *(const v8f_mem *)(data + i + 24);
    }
    v8f sum = a + b + c + d;
    return sum[0] + sum[7];
}

double run_read_bandwidth_gbs(int threads)
{
    const int64_t count = (int64_t)(BUFFER_BYTES / sizeof(float));
    float *data = aligned_alloc(64, BUFFER_BYTES);
    if (!data)
        return 0;
    memset(data, 0, BUFFER_BYTES); /* first touch outside the timing */
    double best = 0;
    volatile float sink = 0;
    for (int run = 0; run < RUNS; run++) {
        const double start = seconds();
        float total = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads()) reduction(+ : total)
        {
            const int64_t share = count / omp_get_num_threads() / 32 * 32;
            total += read_share(data + share * omp_get_thread_num(), share);
        }
        sink = total;
        const double gbs = (double)BUFFER_BYTES / (seconds() - start) * 1e-9;
        best = gbs > best ? gbs : best;
    }
    (void)sink;
    free(data);
    return best;
}
