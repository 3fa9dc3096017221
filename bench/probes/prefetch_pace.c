/* sneppx-prefetch-pace: how the pace and the order of software prefetches into L2 decide
 * what a core reads from memory while it computes (docs/PERFORMANCE.md, decode attention
 * on Zen 3). It streams CHUNKS chunks of 32 KiB (a K/V head's rows in a page of 64 tokens)
 * in shuffled order, doing FMAS_PER_LINE FMAs per 64-byte line read (about decode
 * attention's arithmetic per line), and prefetches the next chunk in several patterns;
 * each is rated against a plain read of the same chunks in the same rounds.
 *
 *   sneppx-prefetch-pace [ROUNDS]      (best of ROUNDS, 9 by default; pin it: taskset -c 1)
 *
 * x86-64 with AVX2 and FMA only: the loops are what attn_decode's v8 kernels run. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "timing.h"

#define CHUNK_BYTES (32 * 1024)
#define CHUNKS 1024
#define LINES (CHUNK_BYTES / 64)
#define ROW_BYTES 512 /* a d 128 float32 row: a P.V pass reads 128 bytes of each */
#define FMAS_PER_LINE 16

static char *pool;
static int order[CHUNKS];
static int l2_resident; /* every chunk one of two: the arithmetic alone */

static const char *chunk(int c)
{
    if (c >= CHUNKS)
        c = CHUNKS - 1;
    return pool + (size_t)(l2_resident ? order[c] % 2 : order[c]) * CHUNK_BYTES;
}

__attribute__((target("avx2,fma"), always_inline)) static inline void compute_line(const char *line, __m256 acc[8])
{
    const __m256 a = _mm256_load_ps((const float *)line), b = _mm256_load_ps((const float *)line + 8);
    for (int i = 0; i < FMAS_PER_LINE / 8; i++)
        for (int k = 0; k < 8; k++)
            acc[k] = _mm256_fmadd_ps(a, b, acc[k]);
}

__attribute__((target("avx2"))) static float total(const __m256 acc[8])
{
    float lanes[8], sum = 0;
    for (int k = 0; k < 8; k++) {
        _mm256_storeu_ps(lanes, acc[k]);
        sum += lanes[0];
    }
    return sum;
}

/* The prefetch patterns: at line l of chunk c (lines read in order, or in a P.V pass's
 * order: 128 bytes of each row, row after row), which lines of chunk c + 1 to ask for. */
enum pattern { NONE, EVEN, GROUPS_OF_32, TWICE_FIRST_HALF, TWICE_128_THEN_NONE, ALL_AT_START, STRIDED_EVEN };

static volatile float sink;

/* Inlined into one copy per pattern (stream_as below), so each loop carries only its own
 * prefetches. */
__attribute__((target("avx2,fma"), always_inline)) static inline double stream_with(enum pattern pattern, int pv_order)
{
    __m256 acc[8];
    for (int k = 0; k < 8; k++)
        acc[k] = _mm256_setzero_ps();
    const double start = bench_now();
    for (int c = 0; c < CHUNKS; c++) {
        const char *now = chunk(c), *next = chunk(c + 1);
        if (pattern == ALL_AT_START)
            for (int l = 0; l < LINES; l++)
                _mm_prefetch(next + l * 64, _MM_HINT_T1);
        for (int l = 0; l < LINES; l++) {
            switch (pattern) {
            case EVEN:
                _mm_prefetch(next + l * 64, _MM_HINT_T1);
                break;
            case GROUPS_OF_32:
                if (l % 32 == 0)
                    for (int g = 0; g < 32; g++)
                        _mm_prefetch(next + (l + g) * 64, _MM_HINT_T1);
                break;
            case TWICE_FIRST_HALF:
                if (l < LINES / 2) {
                    _mm_prefetch(next + 2 * l * 64, _MM_HINT_T1);
                    _mm_prefetch(next + (2 * l + 1) * 64, _MM_HINT_T1);
                }
                break;
            case TWICE_128_THEN_NONE:
                if (l % 256 < 128) {
                    const int k = l / 256 * 128 + l % 256;
                    _mm_prefetch(next + 2 * k * 64, _MM_HINT_T1);
                    _mm_prefetch(next + (2 * k + 1) * 64, _MM_HINT_T1);
                }
                break;
            case STRIDED_EVEN: /* line l of the P.V order: pass l / 128, row l / 2 % 64 */
                _mm_prefetch(next + l / 2 % 64 * ROW_BYTES + l / 128 * 128 + l % 2 * 64, _MM_HINT_T1);
                break;
            case NONE:
            case ALL_AT_START:
                break;
            }
            const int line = pv_order ? l / 2 % 64 * ROW_BYTES / 64 + l / 128 * 2 + l % 2 : l;
            compute_line(now + line * 64, acc);
        }
    }
    const double elapsed = bench_now() - start;
    sink = total(acc);
    return elapsed;
}

#define STREAM_AS(name, pattern, pv_order) \
    __attribute__((target("avx2,fma"), noinline)) static double name(void) { return stream_with(pattern, pv_order); }
STREAM_AS(stream_none, NONE, 0)
STREAM_AS(stream_even, EVEN, 0)
STREAM_AS(stream_groups, GROUPS_OF_32, 0)
STREAM_AS(stream_twice_first_half, TWICE_FIRST_HALF, 0)
STREAM_AS(stream_twice_128, TWICE_128_THEN_NONE, 0)
STREAM_AS(stream_all_at_start, ALL_AT_START, 0)
STREAM_AS(stream_pv_even, EVEN, 1)
STREAM_AS(stream_pv_strided, STRIDED_EVEN, 1)

__attribute__((target("avx2"), noinline)) static double plain_read(void)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    const double start = bench_now();
    for (int c = 0; c < CHUNKS; c++) {
        const float *p = (const float *)chunk(c);
        for (int i = 0; i < CHUNK_BYTES / 4; i += 16) {
            s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
            s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        }
    }
    const double elapsed = bench_now() - start;
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(s0, s1));
    sink = lanes[0];
    return elapsed;
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 9;
    if (rounds < 1 || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, rounds < 1 ? "usage: sneppx-prefetch-pace [ROUNDS >= 1]\n"
                                   : "sneppx-prefetch-pace: needs AVX2 and FMA\n");
        return 2;
    }
    const size_t bytes = (size_t)CHUNKS * CHUNK_BYTES, flush_bytes = (size_t)64 << 20;
    pool = aligned_alloc((size_t)2 << 20, bytes);
    char *flush = malloc(flush_bytes);
    if (!pool || !flush) {
        fprintf(stderr, "sneppx-prefetch-pace: out of memory\n");
        return 1;
    }
    madvise(pool, bytes, MADV_HUGEPAGE);
    memset(pool, 1, bytes);
    for (int i = 0; i < CHUNKS; i++)
        order[i] = i;
    srand(1);
    for (int i = CHUNKS - 1; i > 0; i--) {
        const int j = rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    static const struct {
        const char *name;
        double (*stream)(void);
        int l2;
    } cases[] = {
        {"from L2, no prefetch (the arithmetic)", stream_none, 1},
        {"no prefetch", stream_none, 0},
        {"even: a line per line, in line order", stream_even, 0},
        {"groups of 32 lines every 32 lines", stream_groups, 0},
        {"twice the pace in a chunk's first half", stream_twice_first_half, 0},
        {"twice the pace 128 lines, none 128", stream_twice_128, 0},
        {"all 512 at a chunk's start", stream_all_at_start, 0},
        {"P.V order read, even, in line order", stream_pv_even, 0},
        {"P.V order read, even, in P.V order", stream_pv_strided, 0},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    double best[sizeof cases / sizeof cases[0]], best_read = 1e30;
    for (int i = 0; i < n; i++)
        best[i] = 1e30;
    for (int r = 0; r < rounds; r++) {
        l2_resident = 0;
        memset(flush, r, flush_bytes);
        const double t = plain_read();
        best_read = t < best_read ? t : best_read;
        for (int i = 0; i < n; i++) {
            l2_resident = cases[i].l2;
            memset(flush, r + i, flush_bytes);
            const double s = cases[i].stream();
            best[i] = s < best[i] ? s : best[i];
        }
    }
    printf("%d chunks of %d KiB in shuffled order, %d FMAs per 64-byte line, best of %d rounds\n", CHUNKS,
           CHUNK_BYTES / 1024, FMAS_PER_LINE, rounds);
    printf("  %-42s %8.2f ms %6.1f GB/s\n", "plain read", 1e3 * best_read, 1e-9 * (double)bytes / best_read);
    for (int i = 0; i < n; i++)
        printf("  %-42s %8.2f ms %6.1f GB/s %5.2fx the read\n", cases[i].name, 1e3 * best[i],
               1e-9 * (double)bytes / best[i], best_read / best[i]);
    free(flush);
    free(pool);
    return 0;
}
