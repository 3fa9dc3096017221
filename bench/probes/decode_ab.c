/* Two builds of one attn_decode kernel, A and B, in alternated rounds of one process on
 * one core: llama3-8B's shape (8 K/V heads, group 4, d 128), one query token, pages of
 * 64 tokens (the KV cache's default) in shuffled order, laid out as the cache lays them
 * (page_table.h). Between
 * two processes this VM's cores and memory change speed by up to 2x (docs/PERFORMANCE.md);
 * within rounds each phase falls on both sides. bench/probes/decode_ab.sh builds it from
 * two checkouts (decode_a and decode_b are their kernels, renamed).
 *
 *   decode_ab KV_TYPE CONTEXT COPIES ROUNDS
 *
 * KV_TYPE float32 | bfloat16 | float16 | int8; COPIES of the cache taken in turn (0: enough
 * to pass 256 MB, so that each run reads from memory; 1: the cache stays in L2/L3).
 * Prints each build's median and best time and the median of A/B per round with its
 * quartiles, after checking that both give the same output for the same cache. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "page_table.h"
#include "sneppx_abi.h"
#include "timing.h"

void decode_a(const struct sneppx_args *args);
void decode_b(const struct sneppx_args *args);

enum { PAGE = 64, HEADS = 8, GROUP = 4, D = 128, WARMUP = 20 };
#define ROTATION_BYTES 256e6

static uint32_t mix(uint64_t i)
{
    i = (i ^ (i >> 31)) * 0x9e3779b97f4a7c15u;
    return (uint32_t)(i >> 32);
}

/* Element i of a page's rows, a finite value of the type: float32 and bfloat16 (a
 * float's top half) in [-1, 1], float16 with a magnitude in [1/8, 1), int8 any of
 * [-127, 127]. */
static void fill_element(unsigned char *p, const char *type, uint64_t i)
{
    const uint32_t r = mix(i);
    const float x = (float)(r % 2001) / 1000.0f - 1.0f;
    uint32_t bits;
    memcpy(&bits, &x, 4);
    if (!strcmp(type, "int8")) {
        *(int8_t *)p = (int8_t)((int)(r % 255) - 127);
    } else if (!strcmp(type, "float32")) {
        memcpy(p, &x, 4);
    } else if (!strcmp(type, "bfloat16")) {
        const uint16_t half = (uint16_t)(bits >> 16);
        memcpy(p, &half, 2);
    } else {
        const uint16_t half = (uint16_t)((r & 0x8000u) | ((12 + r % 3) << 10) | (r >> 16 & 0x3ffu));
        memcpy(p, &half, 2);
    }
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: decode_ab KV_TYPE CONTEXT COPIES ROUNDS\n");
        return 2;
    }
    const char *type = argv[1];
    const int int8 = !strcmp(type, "int8");
    const int64_t eb = int8 ? 1 : !strcmp(type, "float32") ? 4 : 2;
    const int64_t context = atoll(argv[2]), rounds = atoll(argv[4]);
    if ((eb == 2 && strcmp(type, "float16") && strcmp(type, "bfloat16")) || context < 1 || rounds < 1 ||
        rounds > 1 << 24) {
        fprintf(stderr, "decode_ab: KV_TYPE float32 | bfloat16 | float16 | int8, CONTEXT >= 1, ROUNDS in [1, 2^24]\n");
        return 2;
    }
    const struct bench_page_layout layout = {
        .page_size = PAGE, .kv_heads = HEADS, .k_dim = D, .v_dim = D, .element_bytes = eb};
    const int64_t scale_bytes = bench_page_scale_bytes(&layout), page_bytes = bench_page_bytes(&layout);
    const int64_t pages = (context + PAGE - 1) / PAGE;
    int64_t copies = atoll(argv[3]);
    if (copies < 1)
        copies = (int64_t)(ROTATION_BYTES / (double)(pages * page_bytes)) + 1;
    unsigned char *pool = aligned_alloc(4096, (size_t)((copies * pages * page_bytes + 4095) / 4096 * 4096));
    int32_t *table = malloc(sizeof(int32_t) * (size_t)(copies * pages));
    float *scratch = aligned_alloc(64, (size_t)sneppx_attn_decode_scratch_floats(1, GROUP, D, D) * 4 + 64);
    double *seconds[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
    double *ratio = malloc(sizeof(double) * (size_t)rounds);
    if (!pool || !table || !scratch || !seconds[0] || !seconds[1] || !ratio) {
        fprintf(stderr, "decode_ab: out of memory\n");
        return 1;
    }
    for (int64_t p = 0; p < copies * pages; p++) {
        unsigned char *page = pool + p * page_bytes;
        for (int64_t i = 0; i < page_bytes - scale_bytes; i += eb)
            fill_element(page + i, type, (uint64_t)(p * page_bytes + i));
        for (int64_t i = 0; i < scale_bytes / 4; i++)
            ((float *)(void *)(page + page_bytes - scale_bytes))[i] = 1.0f / 127;
    }
    bench_shuffled_pages(table, pages, copies);
    static float q[HEADS * GROUP * D], o[2][HEADS * GROUP * D];
    for (int i = 0; i < HEADS * GROUP * D; i++)
        q[i] = sinf((float)i);
    void (*const kernel[2])(const struct sneppx_args *) = {decode_a, decode_b};
    int64_t use = 0;
    double max_diff = 0;
    for (int64_t r = -WARMUP; r < rounds; r++) {
        for (int turn = 0; turn < 2; turn++) {
            const int side = r & 1 ? 1 - turn : turn; /* each goes first every other round */
            /* The output check: both read copy 0 in the first warm-up round. */
            const int32_t *pages_of = table + (r == -WARMUP ? 0 : use++ % copies) * pages;
            const double start = bench_now();
            for (int h = 0; h < HEADS; h++) {
                struct sneppx_args a;
                memset(&a, 0, sizeof a);
                a.struct_size = sizeof a;
                a.abi_version = SNEPPX_ABI_VERSION;
                a.row_end = 1;
                a.q = q + h * GROUP * D;
                a.q_stride = HEADS * GROUP * D;
                bench_page_head_args(&layout, pool, h, &a);
                a.o = o[side] + h * GROUP * D;
                a.o_stride = HEADS * GROUP * D;
                a.q_len = 1;
                a.kv_len = a.kv_end = context;
                a.softmax_scale = 1.0f / sqrtf((float)D);
                a.scratch = scratch;
                a.pages = pages_of;
                kernel[side](&a);
            }
            if (r >= 0)
                seconds[side][r] = bench_now() - start;
        }
        if (r == -WARMUP)
            for (int i = 0; i < HEADS * GROUP * D; i++)
                max_diff = fmax(max_diff, fabs((double)o[0][i] - (double)o[1][i]));
        if (r >= 0)
            ratio[r] = seconds[0][r] / seconds[1][r];
    }
    struct bench_stats a_stats, b_stats, ratio_stats;
    bench_stats_of(seconds[0], (int)rounds, &a_stats);
    bench_stats_of(seconds[1], (int)rounds, &b_stats);
    bench_stats_of(ratio, (int)rounds, &ratio_stats); /* sorted in place: the quartiles below */
    printf("%-8s %6lld keys, %3lld copies: A %.3f ms (best %.3f), B %.3f ms (best %.3f), A/B %.3f [%.3f-%.3f] "
           "(median [quartiles] of %lld rounds), outputs differ by %.1g\n",
           type, (long long)context, (long long)copies, a_stats.median * 1e3, a_stats.min * 1e3,
           b_stats.median * 1e3, b_stats.min * 1e3, ratio_stats.median, ratio[rounds / 4], ratio[3 * rounds / 4],
           (long long)rounds, max_diff);
    return 0;
}
