/* Threading: the runtime owns it (kernels are single-threaded tiles). */
#include <omp.h>

#include "threads.h"

int sneppx_thread_count(const sneppx_layer *layer)
{
    int threads = layer->config.num_threads > 0 ? layer->config.num_threads : omp_get_max_threads();
    return threads > 0 ? threads : 1;
}
