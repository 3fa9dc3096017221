/* Page tables of the decode benchmarks: the pages of a cache that has run a while. */
#ifndef SNEPPX_BENCH_PAGE_TABLE_H
#define SNEPPX_BENCH_PAGE_TABLE_H
#include <stdint.h>

/* table[0, pages): every page once, in a shuffled order (the same order every call);
 * table[c * pages + i] = table[i] + c * pages for the copies c in [1, copies), the same
 * order over each copy's own pages. */
void bench_shuffled_pages(int32_t *table, int64_t pages, int64_t copies);

#endif
