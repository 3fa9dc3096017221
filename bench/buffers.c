/* Benchmark buffers: allocated once, touched before any timed run, filled
 * with reproducible values; and the error check between two results. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench.h"

#define HUGE_PAGE_BYTES ((size_t)2 << 20)

int bench_rotation_copies(const struct bench_context *ctx, double copy_bytes, int max_copies)
{
    const double wanted = copy_bytes >= BENCH_ROTATION_BYTES ? 1 : ctx->quick ? 2 : BENCH_ROTATION_BYTES / copy_bytes + 1;
    return wanted < max_copies ? (int)wanted : max_copies;
}

float *bench_alloc_floats(size_t count)
{
    size_t bytes = (count ? count : 1) * sizeof(float);
    /* A first touch costs ~10 us per 4 KiB page in this VM; huge pages cut
     * that 512x for the big operands, and the memset pays it here, untimed. */
    const size_t alignment = bytes >= 2 * HUGE_PAGE_BYTES ? HUGE_PAGE_BYTES : 64;
    bytes = (bytes + alignment - 1) / alignment * alignment;
    void *memory = NULL;
    if (posix_memalign(&memory, alignment, bytes) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (alignment == HUGE_PAGE_BYTES)
        madvise(memory, bytes, MADV_HUGEPAGE);
#endif
    memset(memory, 0, bytes);
    return memory;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

void bench_fill_uniform(float *x, int64_t count, uint64_t seed, float scale)
{
    const uint64_t stream = splitmix64(seed);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) {
        const double unit = (double)(splitmix64(stream ^ (uint64_t)i) >> 11) * 0x1.0p-53;
        x[i] = scale * (float)(2.0 * unit - 1.0);
    }
}

double bench_relative_error(const float *a, const float *b, int64_t count)
{
    double max_diff = 0, max_ref = 0;
    for (int64_t i = 0; i < count; i++) {
        const double diff = fabs((double)a[i] - (double)b[i]);
        /* NaN compares false: count it as an infinite error. */
        if (!(diff <= max_diff))
            max_diff = isnan(diff) ? INFINITY : diff;
        if (fabs((double)b[i]) > max_ref)
            max_ref = fabs((double)b[i]);
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}
