/* Pages and page tables of the decode benchmarks: a cache's pages laid out as
 * the KV cache lays them, in the order of a cache that has run a while. */
#ifndef SNEPPX_BENCH_PAGE_TABLE_H
#define SNEPPX_BENCH_PAGE_TABLE_H
#include <stdint.h>

#include "sneppx_abi.h"

/* One page of the KV cache (runtime/kv_cache_internal.h): page_size tokens' K rows of
 * every K/V head, then their V rows, then with int8 rows one float32 scale per K row of
 * every head, then per V row. MLA: one latent row of k_dim per token, shared by K and V
 * (and one scale a row). */
struct bench_page_layout {
    int64_t page_size, kv_heads, k_dim, v_dim;
    int64_t element_bytes; /* 4, 2 or 1 (int8, scaled) */
    int mla;
};

/* Bytes of a page's int8 scales (0 for the other types). */
int64_t bench_page_scale_bytes(const struct bench_page_layout *layout);

/* Bytes of one page, scales included. */
int64_t bench_page_bytes(const struct bench_page_layout *layout);

/* Sets the kernel arguments that find K/V head `kv_head`'s rows in pages of `pool`:
 * k, v, their strides and scales, page_size and page_stride (a page in elements; int8:
 * its bytes). The pages themselves are args->pages. */
void bench_page_head_args(const struct bench_page_layout *layout, const unsigned char *pool, int64_t kv_head,
                          struct sneppx_args *args);

/* table[0, pages): every page once, in a shuffled order (the same order every call);
 * table[c * pages + i] = table[i] + c * pages for the copies c in [1, copies), the same
 * order over each copy's own pages. */
void bench_shuffled_pages(int32_t *table, int64_t pages, int64_t copies);

#endif
