/* Page tables of the decode benchmarks (page_table.h). */
#include "page_table.h"

void bench_shuffled_pages(int32_t *table, int64_t pages, int64_t copies)
{
    for (int64_t i = 0; i < pages; i++)
        table[i] = (int32_t)i;
    uint64_t state = 0x9e3779b97f4a7c15u; /* a fixed seed: runs and builds compare alike */
    for (int64_t i = pages - 1; i > 0; i--) {
        state = state * 6364136223846793005u + 1442695040888963407u;
        const int64_t j = (int64_t)((state >> 33) % (uint64_t)(i + 1));
        const int32_t t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    for (int64_t c = 1; c < copies; c++)
        for (int64_t i = 0; i < pages; i++)
            table[c * pages + i] = (int32_t)(table[i] + c * pages);
}
