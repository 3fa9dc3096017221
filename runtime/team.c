/* The team of every parallel region of the runtime (runtime/team.h).
 *
 * GCC's OpenMP (libgomp) keeps the threads of its first parallel region for
 * the next ones, and fork() copies only the calling thread: in the child, the
 * next region with more than one thread waits for the parent's threads
 * forever. A child forked after the runtime started threads (a
 * multiprocessing worker of a process that ran a forward) therefore runs the
 * runtime's regions on one thread: slower, the same answers. A child forked
 * before keeps every thread. */
#include "team.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "error.h"

static atomic_int threads_started;       /* a region of the runtime asked for more than one thread */
static atomic_int forked_after_threads;  /* this process is a child forked after that */

static void after_fork_in_child(void)
{
    if (atomic_load_explicit(&threads_started, memory_order_relaxed))
        atomic_store_explicit(&forked_after_threads, 1, memory_order_relaxed);
}

static void watch_forks(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

int sneppx_team_size(int wanted)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, watch_forks);
    if (atomic_load_explicit(&forked_after_threads, memory_order_relaxed)) {
        static atomic_flag told = ATOMIC_FLAG_INIT;
        if (!atomic_flag_test_and_set(&told))
            sneppx_log(0, "warning: this process was forked after sneppx ran OpenMP threads, which a "
                          "forked child cannot start again: sneppx runs on one thread here (start worker "
                          "processes with spawn or forkserver, or before the first forward, to keep them all)");
        return 1;
    }
    const int threads = wanted > 0 ? wanted : omp_get_max_threads();
    if (threads <= 1)
        return 1;
    if (!atomic_load_explicit(&threads_started, memory_order_relaxed))
        atomic_store_explicit(&threads_started, 1, memory_order_relaxed);
    return threads;
}
