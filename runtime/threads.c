/* Threading: the runtime owns it (kernels are single-threaded tiles). */
#include "threads.h"

#include "team.h"

int sneppx_thread_count(const sneppx_layer *layer) { return sneppx_team_size(layer->config.num_threads); }
