/* Pages and page tables of the decode benchmarks (page_table.h). */
#include "page_table.h"

static int is_int8(const struct bench_page_layout *layout) { return layout->element_bytes == 1; }

/* Rows of one page: every head's K and V rows, or MLA's latent rows. */
static int64_t page_rows_elements(const struct bench_page_layout *layout)
{
    return layout->mla ? layout->page_size * layout->k_dim
                       : layout->kv_heads * layout->page_size * (layout->k_dim + layout->v_dim);
}

int64_t bench_page_scale_bytes(const struct bench_page_layout *layout)
{
    if (!is_int8(layout))
        return 0;
    return (layout->mla ? 1 : 2 * layout->kv_heads) * layout->page_size * (int64_t)sizeof(float);
}

int64_t bench_page_bytes(const struct bench_page_layout *layout)
{
    return page_rows_elements(layout) * layout->element_bytes + bench_page_scale_bytes(layout);
}

void bench_page_head_args(const struct bench_page_layout *layout, const unsigned char *pool, int64_t kv_head,
                          struct sneppx_args *args)
{
    const int64_t eb = layout->element_bytes, tokens = layout->page_size;
    args->page_size = tokens;
    args->page_stride = bench_page_bytes(layout) / eb;
    if (layout->mla) {
        args->k = args->v = (const float *)(const void *)pool;
        args->k_stride = args->v_stride = layout->k_dim;
        if (is_int8(layout))
            args->k_scale = args->v_scale = (const float *)(const void *)(pool + page_rows_elements(layout));
        return;
    }
    const int64_t k_bytes = layout->kv_heads * tokens * layout->k_dim * eb;
    args->k = (const float *)(const void *)(pool + kv_head * tokens * layout->k_dim * eb);
    args->v = (const float *)(const void *)(pool + k_bytes + kv_head * tokens * layout->v_dim * eb);
    args->k_stride = layout->k_dim;
    args->v_stride = layout->v_dim;
    if (is_int8(layout)) {
        /* The kernel finds page p's scales at float p * page_stride / 4 of these. */
        const float *scales = (const float *)(const void *)(pool + page_rows_elements(layout));
        args->k_scale = scales + kv_head * tokens;
        args->v_scale = scales + (layout->kv_heads + kv_head) * tokens;
    }
}

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
