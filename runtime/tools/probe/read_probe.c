/* The read-bandwidth probe (read_probe.h). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "read_probe.h"

#define HUGE_PAGE_BYTES ((size_t)2 << 20)
/* A thread's share is a multiple of this many floats: whole unrolled steps. */
#define SHARE_FLOATS 64

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
/* A share starts on a multiple of SHARE_FLOATS floats of a huge-page-aligned buffer,
 * and the loops step a vector at a time: each load is aligned to its own width, no
 * more (a 64-byte claim for the 32-byte vectors was undefined, which UBSan reports
 * on AVX2 hosts, where the narrow loop runs). */
typedef float v16f_mem __attribute__((vector_size(64), aligned(64), may_alias));
typedef float v8f_mem __attribute__((vector_size(32), aligned(32), may_alias));

#if defined(__x86_64__) || defined(__i386__)
#define TARGET_WIDE __attribute__((target("avx512f"), noinline))
#define TARGET_NARROW __attribute__((target("avx2"), noinline))
#else
#define TARGET_WIDE __attribute__((noinline))
#define TARGET_NARROW __attribute__((noinline))
#endif

/* Four independent sums, so that the adds' latency does not bound the loop. */
#define DEFINE_READ_LOOP(name, vtype, vmem, target)                                 \
    target static float name(const float *data, int64_t count)                     \
    {                                                                               \
        const int64_t lanes = (int64_t)(sizeof(vtype) / sizeof(float));             \
        vtype s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};                               \
        for (int64_t i = 0; i + 4 * lanes <= count; i += 4 * lanes) {               \
            s0 += *(const vmem *)(data + i);                                        \
            s1 += *(const vmem *)(data + i + lanes);                                \
            s2 += *(const vmem *)(data + i + 2 * lanes);                            \
            s3 += *(const vmem *)(data + i + 3 * lanes);                            \
        }                                                                           \
        const vtype total = (s0 + s1) + (s2 + s3);                                  \
        float sum = 0;                                                              \
        for (int64_t lane = 0; lane < lanes; lane++)                                \
            sum += total[lane];                                                     \
        return sum;                                                                 \
    }

DEFINE_READ_LOOP(read_wide, v16f, v16f_mem, TARGET_WIDE)
DEFINE_READ_LOOP(read_narrow, v8f, v8f_mem, TARGET_NARROW)

int read_probe_host_is_wide(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx512f");
#else
    return 1;
#endif
}

int read_probe_init(read_probe *probe, size_t bytes)
{
    memset(probe, 0, sizeof *probe);
    bytes = (bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    void *memory = NULL;
    if (posix_memalign(&memory, HUGE_PAGE_BYTES, bytes) != 0)
        return -1;
#ifdef MADV_HUGEPAGE
    /* What the runtime's big buffers get (weights, the KV cache's pool): the
     * probe must not pay TLB misses the work it rates does not. */
    madvise(memory, bytes, MADV_HUGEPAGE);
#endif
    memset(memory, 0, bytes); /* first touch outside any timing */
    probe->buffer = memory;
    probe->floats = (int64_t)(bytes / sizeof(float));
    probe->wide = read_probe_host_is_wide();
    return 0;
}

void read_probe_free(read_probe *probe)
{
    free(probe->buffer);
    memset(probe, 0, sizeof *probe);
}

static int team_size(int threads) { return threads > 0 ? threads : omp_get_max_threads(); }

double read_probe_pass_bytes(const read_probe *probe, int threads)
{
    const int team = team_size(threads);
    return (double)(probe->floats / team / SHARE_FLOATS * SHARE_FLOATS * team) * sizeof(float);
}

float read_probe_pass(const read_probe *probe, int threads)
{
    float total = 0;
#pragma omp parallel num_threads(team_size(threads)) reduction(+ : total)
    {
        /* Each thread streams its own contiguous share. */
        const int64_t share = probe->floats / omp_get_num_threads() / SHARE_FLOATS * SHARE_FLOATS;
        const float *mine = probe->buffer + share * omp_get_thread_num();
        total += probe->wide ? read_wide(mine, share) : read_narrow(mine, share);
    }
    return total;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double read_probe_best_gbs(const read_probe *probe, int threads, int runs)
{
    double best = 0;
    volatile float sink = 0;
    for (int run = 0; run < runs; run++) {
        const double start = seconds();
        sink = read_probe_pass(probe, threads);
        const double gbs = read_probe_pass_bytes(probe, threads) / (seconds() - start) * 1e-9;
        best = gbs > best ? gbs : best;
    }
    (void)sink;
    return best;
}
