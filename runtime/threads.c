/* Threading and big allocations: the runtime owns both (kernels are single-threaded tiles). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "threads.h"

int sneppx_thread_count(const sneppx_layer *layer)
{
    int threads = layer->config.num_threads > 0 ? layer->config.num_threads : omp_get_max_threads();
    return threads > 0 ? threads : 1;
}

void *sneppx_alloc_floats(size_t count)
{
    size_t bytes = count * sizeof(float);
    /* 2 MiB alignment lets the kernel back big buffers with transparent huge
     * pages: first-touch faults cost ~10 us per 4 KiB page on these machines. */
    size_t alignment = bytes >= ((size_t)4 << 20) ? ((size_t)2 << 20) : 64;
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
