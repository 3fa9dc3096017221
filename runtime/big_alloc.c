/* Big buffers (packed weights, workspaces, the KV cache's pool) on huge pages
 * where the kernel allows: first-touch faults cost ~10 us per 4 KiB page on
 * these machines, and a decode step that streams hundreds of MB through 4 KiB
 * pages spends its time in TLB misses. */
#include <stdlib.h>
#include <sys/mman.h>

#include "big_alloc.h"

void *sneppx_alloc_big(size_t bytes)
{
    const size_t alignment = bytes >= ((size_t)4 << 20) ? ((size_t)2 << 20) : 64;
    bytes = (bytes + alignment - 1) / alignment * alignment;
    void *memory = NULL;
    if (posix_memalign(&memory, alignment, bytes ? bytes : alignment) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (alignment > 64)
        madvise(memory, bytes, MADV_HUGEPAGE);
#endif
    return memory;
}

void *sneppx_alloc_floats(size_t count) { return sneppx_alloc_big(count * sizeof(float)); }
