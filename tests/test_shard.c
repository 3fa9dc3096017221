/* ctest: two cores (a thread per rank) */
/* Tensor-parallel shards (include/sneppx/shard.h) without MPI: world sizes 1, 2,
 * 3 and 4, each rank a thread of this process, with a transport of shared
 * memory and barriers (the ranks sum in rank order). tests/support/shard_cases.c
 * holds the cases, which tests/mpi/ runs over MPI as well: every small family
 * (GQA with biases and a window, MQA, MLA absorbed and naive), forward, masked
 * forward and cached forward against the whole layer within 1e-6; sizes that
 * cannot split refused on every rank, naming the sizes that can; one rank with
 * another config, other weights, a bad argument, another call, a full cache:
 * every rank fails, nothing written; a checkpoint read shard by shard. Then
 * what needs a transport of the test's own: a transport that fails, and the
 * release of every transport given to a create. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_cases.h"

#define MAX_WORLD 4
#define SLOT_BYTES 4096 /* the largest record an all-gather carries (a create's, a message) */

struct world {
    int size;
    pthread_barrier_t barrier;
    unsigned char gather[MAX_WORLD * SLOT_BYTES];
    float *data[MAX_WORLD];
    int64_t count[MAX_WORLD];
    atomic_int made, released;
    atomic_int fail_sums; /* the failing-transport case: every sum fails */
};

struct rank_context {
    struct world *world;
    int rank;
};

static int thread_allgather(void *context, const void *mine, void *all, size_t bytes, char *error, size_t size)
{
    struct rank_context *c = context;
    struct world *w = c->world;
    if (bytes > SLOT_BYTES) {
        snprintf(error, size, "%zu bytes exceed the test's slot", bytes);
        return 1;
    }
    pthread_barrier_wait(&w->barrier); /* every rank has read the last gather */
    memcpy(w->gather + (size_t)c->rank * bytes, mine, bytes);
    pthread_barrier_wait(&w->barrier);
    memcpy(all, w->gather, (size_t)w->size * bytes);
    return 0;
}

/* Blocking: each rank sums every rank's rows in rank order, then writes its own. */
static int thread_sum_start(void *context, float *data, int64_t count, char *error, size_t size)
{
    struct rank_context *c = context;
    struct world *w = c->world;
    if (atomic_load(&w->fail_sums)) {
        snprintf(error, size, "the test's transport fails every sum");
        return 1;
    }
    w->data[c->rank] = data;
    w->count[c->rank] = count;
    pthread_barrier_wait(&w->barrier);
    float *sum = malloc(sizeof(float) * (size_t)count);
    for (int r = 0; r < w->size; r++)
        if (w->count[r] != count) {
            snprintf(error, size, "rank %d sums %lld floats, rank %d %lld", r, (long long)w->count[r], c->rank,
                     (long long)count);
            free(sum);
            sum = NULL;
            break;
        }
    for (int64_t i = 0; sum && i < count; i++) {
        float s = w->data[0][i];
        for (int r = 1; r < w->size; r++)
            s += w->data[r][i];
        sum[i] = s;
    }
    pthread_barrier_wait(&w->barrier); /* every rank has read every rank's rows */
    if (sum)
        memcpy(data, sum, sizeof(float) * (size_t)count);
    free(sum);
    return sum ? 0 : 1;
}

static int thread_sum_wait(void *context, char *error, size_t size)
{
    (void)context, (void)error, (void)size;
    return 0;
}

static void thread_release(void *context)
{
    struct rank_context *c = context;
    atomic_fetch_add(&c->world->released, 1);
}

static int make_shard(void *context, sneppx_shard *shard)
{
    struct rank_context *c = context;
    atomic_fetch_add(&c->world->made, 1);
    *shard = (sneppx_shard){.rank = c->rank, .world = c->world->size,
                            .transport = {.context = c, .allgather = thread_allgather,
                                          .sum_start = thread_sum_start, .sum_wait = thread_sum_wait,
                                          .release = thread_release}};
    return 0;
}

static void barrier(void *context)
{
    struct rank_context *c = context;
    pthread_barrier_wait(&c->world->barrier);
}

struct rank_thread {
    pthread_t thread;
    struct rank_context context;
    int failures;
};

/* A transport that fails its sums: the forward returns SNEPPX_ERR_COMM naming it, on every rank. */
static int failing_transport(const shard_env *env)
{
    struct rank_context *c = env->context;
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 64;
    config.num_attention_heads = config.num_key_value_heads = 12; /* splits at 1, 2, 3 and 4 */
    config.head_dim = 16;
    config.num_threads = 1;
    sneppx_shard shard;
    make_shard(c, &shard);
    sneppx_layer *layer = NULL;
    int failures = 0;
    if (sneppx_layer_create_shard(&config, NULL, &shard, &layer) != SNEPPX_OK) {
        fprintf(stderr, "rank %d: FAIL failing transport: create: %s\n", env->rank, sneppx_last_error());
        return 1;
    }
    float x[2 * 64] = {0}, out[2 * 64] = {0};
    barrier(c);
    if (env->rank == 0)
        atomic_store(&c->world->fail_sums, 1);
    barrier(c);
    const sneppx_status status = sneppx_layer_forward(layer, 1, 2, x, NULL, NULL, NULL, out);
    if (status != SNEPPX_ERR_COMM ||
        !strstr(sneppx_last_error(), "shard transport: sum failed: the test's transport fails every sum")) {
        fprintf(stderr, "rank %d: FAIL failing transport: %s '%s'\n", env->rank, sneppx_status_name(status),
                sneppx_last_error());
        failures++;
    }
    barrier(c);
    if (env->rank == 0)
        atomic_store(&c->world->fail_sums, 0);
    sneppx_layer_destroy(layer);
    return failures;
}

static void *run_rank(void *argument)
{
    struct rank_thread *t = argument;
    const char *scratch = getenv("SNEPPX_BINARY_DIR");
    const shard_env env = {.rank = t->context.rank, .world = t->context.world->size, .make_shard = make_shard,
                           .barrier = barrier, .context = &t->context, .scratch_dir = scratch ? scratch : "."};
    t->failures = shard_cases_run(&env, SHARD_CASES_SMALL | SHARD_CASES_FAILURES | SHARD_CASES_CHECKPOINT);
    t->failures += failing_transport(&env);
    return NULL;
}

/* The local calls: sneppx_shard_check, and sneppx_layer_shard_info of a layer that is no shard. */
static int local_calls(void)
{
    int failures = 0;
    sneppx_config config;
    sneppx_config_from_name("llama3-8B", NULL, &config);
    sneppx_status status = sneppx_shard_check(&config, 3);
    if (status != SNEPPX_ERR_INVALID_ARGUMENT ||
        !strstr(sneppx_last_error(), "world: 3 ranks cannot split llama3-8B's 32 query heads in 8 K/V groups") ||
        !strstr(sneppx_last_error(), "world sizes that can: 1, 2, 4, 8, 16 or 32")) {
        fprintf(stderr, "FAIL sneppx_shard_check(llama3-8B, 3): %s '%s'\n", sneppx_status_name(status),
                sneppx_last_error());
        failures++;
    }
    if (sneppx_shard_check(&config, 16) != SNEPPX_OK || sneppx_shard_check(&config, 0) == SNEPPX_OK ||
        sneppx_shard_check(NULL, 2) == SNEPPX_OK) {
        fprintf(stderr, "FAIL sneppx_shard_check: 16 refused, or 0 / a NULL config accepted\n");
        failures++;
    }
    sneppx_config small;
    sneppx_config_init(&small);
    small.hidden_size = 64;
    small.num_attention_heads = 4;
    small.num_key_value_heads = 2;
    small.num_threads = 1;
    sneppx_layer *layer = NULL;
    sneppx_shard_info info;
    memset(&info, 0xff, sizeof info);
    if (sneppx_layer_create(&small, NULL, &layer) != SNEPPX_OK || sneppx_layer_shard_info(layer, &info) != SNEPPX_OK ||
        info.rank != 0 || info.world != 1 || info.q_head_begin != 0 || info.q_heads != 4 || info.kv_head_begin != 0 ||
        info.kv_heads != 2) {
        fprintf(stderr, "FAIL sneppx_layer_shard_info of a whole layer: rank %d of %d, q %lld+%lld, kv %lld+%lld\n",
                info.rank, info.world, (long long)info.q_head_begin, (long long)info.q_heads,
                (long long)info.kv_head_begin, (long long)info.kv_heads);
        failures++;
    }
    if (sneppx_layer_shard_info(layer, NULL) != SNEPPX_ERR_INVALID_ARGUMENT ||
        !strstr(sneppx_last_error(), "info: must not be NULL")) {
        fprintf(stderr, "FAIL sneppx_layer_shard_info(layer, NULL): '%s'\n", sneppx_last_error());
        failures++;
    }
    sneppx_layer_destroy(layer);
    return failures;
}

int main(void)
{
    static const int worlds[] = {1, 2, 3, 4};
    int failures = local_calls();
    for (size_t i = 0; i < sizeof worlds / sizeof worlds[0]; i++) {
        static struct world world;
        memset(&world, 0, sizeof world);
        world.size = worlds[i];
        pthread_barrier_init(&world.barrier, NULL, (unsigned)world.size);
        struct rank_thread threads[MAX_WORLD];
        for (int r = 0; r < world.size; r++) {
            threads[r].context = (struct rank_context){&world, r};
            pthread_create(&threads[r].thread, NULL, run_rank, &threads[r]);
        }
        int world_failures = 0;
        for (int r = 0; r < world.size; r++) {
            pthread_join(threads[r].thread, NULL);
            world_failures += threads[r].failures;
        }
        /* Every transport given to a create was released: by a failed create, or by destroy. */
        if (atomic_load(&world.made) != atomic_load(&world.released)) {
            fprintf(stderr, "FAIL world %d: %d transports made, %d released\n", world.size, atomic_load(&world.made),
                    atomic_load(&world.released));
            world_failures++;
        }
        printf("world %d: %d failed checks (%d transports)\n", world.size, world_failures, atomic_load(&world.made));
        failures += world_failures;
        pthread_barrier_destroy(&world.barrier);
    }
    printf("%s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
