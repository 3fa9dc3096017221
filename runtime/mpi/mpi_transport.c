/* libsneppx_mpi: shard.h's transport over an MPI communicator. All-gathers are
 * MPI_Allgather; a sum is MPI_Iallreduce (float32, MPI_SUM, in place) per chunk
 * of the O projection, each start testing the earlier ones so that MPI moves
 * them on while the GEMM writes the next rows, and the wait is MPI_Waitall. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sneppx/mpi.h"

/* One MPI call moves at most this many floats (counts are int). */
#define MAX_PIECE_FLOATS (1 << 30)

struct mpi_transport {
    MPI_Comm comm;        /* the layer's own duplicate, MPI_ERRORS_RETURN */
    MPI_Request *pending; /* sums started and not yet waited for */
    int count, capacity;
};

static int mpi_failed(int code, const char *call, char *error, size_t error_size)
{
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", code);
    snprintf(error, error_size, "%s: %.*s", call, length, text);
    return 1;
}

/* 1, saying so, once MPI is finalized: an MPI call then aborts the process (Open MPI:
 * "called after MPI_FINALIZE"), whatever the communicator's error handler. */
static int mpi_is_finalized(char *error, size_t error_size)
{
    int done = 0;
    MPI_Finalized(&done); /* callable at any time */
    if (done)
        snprintf(error, error_size, "MPI is finalized (destroy sharded layers before MPI_Finalize)");
    return done;
}

static int transport_allgather(void *context, const void *mine, void *all, size_t bytes, char *error,
                               size_t error_size)
{
    struct mpi_transport *t = context;
    if (mpi_is_finalized(error, error_size)) /* a call's first step: nothing else of it reaches MPI */
        return 1;
    if (bytes > INT_MAX) {
        snprintf(error, error_size, "MPI_Allgather: %zu bytes per rank exceed an int count", bytes);
        return 1;
    }
    const int code = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, t->comm);
    return code == MPI_SUCCESS ? 0 : mpi_failed(code, "MPI_Allgather", error, error_size);
}

static int transport_sum_start(void *context, float *data, int64_t count, char *error, size_t error_size)
{
    struct mpi_transport *t = context;
    for (int64_t done = 0; done < count; done += MAX_PIECE_FLOATS) {
        const int n = (int)(count - done < MAX_PIECE_FLOATS ? count - done : MAX_PIECE_FLOATS);
        if (t->count == t->capacity) {
            /* Grows once or twice in a layer's life: a call starts at most 4 chunks' sums. */
            const int capacity = t->capacity ? 2 * t->capacity : 8;
            MPI_Request *grown = realloc(t->pending, sizeof *grown * (size_t)capacity);
            if (!grown) {
                snprintf(error, error_size, "out of memory for %d MPI requests", capacity);
                return 1;
            }
            t->pending = grown;
            t->capacity = capacity;
        }
        const int code = MPI_Iallreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, t->comm,
                                        &t->pending[t->count]);
        if (code != MPI_SUCCESS)
            return mpi_failed(code, "MPI_Iallreduce", error, error_size);
        t->count++;
    }
    /* Moves the started sums on (MPI progresses nonblocking collectives inside its calls). */
    int done = 0;
    const int code = MPI_Testall(t->count, t->pending, &done, MPI_STATUSES_IGNORE);
    if (code != MPI_SUCCESS)
        return mpi_failed(code, "MPI_Testall", error, error_size);
    if (done)
        t->count = 0;
    return 0;
}

static int transport_sum_wait(void *context, char *error, size_t error_size)
{
    struct mpi_transport *t = context;
    const int code = MPI_Waitall(t->count, t->pending, MPI_STATUSES_IGNORE);
    t->count = 0;
    return code == MPI_SUCCESS ? 0 : mpi_failed(code, "MPI_Waitall", error, error_size);
}

static void transport_release(void *context)
{
    struct mpi_transport *t = context;
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) /* after MPI_Finalize, MPI's teardown has freed it */
        MPI_Comm_free(&t->comm);
    free(t->pending);
    free(t);
}

int sneppx_mpi_shard(MPI_Comm comm, sneppx_shard *shard, char *error, size_t error_size)
{
    if (!shard || !error || error_size == 0) {
        if (error && error_size)
            snprintf(error, error_size, "shard: must not be NULL");
        return 1;
    }
    memset(shard, 0, sizeof *shard);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) {
        snprintf(error, error_size, "MPI is %s (call MPI_Init_thread with at least MPI_THREAD_FUNNELED first)",
                 finalized ? "finalized" : "not initialized");
        return 1;
    }
    if (comm == MPI_COMM_NULL) {
        snprintf(error, error_size, "comm: MPI_COMM_NULL");
        return 1;
    }
    /* Over an intercommunicator the all-gathers would read the remote group's records
     * and the in-place sums are not allowed: every rank of comm refuses it alike. */
    int inter = 0;
    int code = MPI_Comm_test_inter(comm, &inter);
    if (code != MPI_SUCCESS)
        return mpi_failed(code, "comm: MPI_Comm_test_inter", error, error_size);
    if (inter) {
        snprintf(error, error_size, "comm: an intercommunicator; a sharded layer needs an intracommunicator "
                                    "(MPI_Intercomm_merge makes one)");
        return 1;
    }
    struct mpi_transport *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(error, error_size, "out of memory");
        return 1;
    }
    code = MPI_Comm_dup(comm, &t->comm);
    if (code != MPI_SUCCESS) {
        free(t);
        return mpi_failed(code, "MPI_Comm_dup", error, error_size);
    }
    int rank = 0, size = 1;
    if ((code = MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (code = MPI_Comm_rank(t->comm, &rank)) != MPI_SUCCESS || (code = MPI_Comm_size(t->comm, &size)) != MPI_SUCCESS) {
        MPI_Comm_free(&t->comm);
        free(t);
        return mpi_failed(code, "MPI_Comm_set_errhandler / rank / size", error, error_size);
    }
    shard->rank = rank;
    shard->world = size;
    shard->transport = (sneppx_shard_transport){.context = t, .allgather = transport_allgather,
                                                .sum_start = transport_sum_start, .sum_wait = transport_sum_wait,
                                                .release = transport_release};
    return 0;
}

int sneppx_mpi_shard_fortran(int comm, sneppx_shard *shard, char *error, size_t error_size)
{
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) /* MPI_Comm_f2c needs MPI running: let sneppx_mpi_shard say why */
        return sneppx_mpi_shard(MPI_COMM_NULL, shard, error, error_size);
    /* An invalid handle converts to an invalid communicator (Open MPI's is a null one; an
     * MPI whose handles are integers passes it through), on which the next MPI call would
     * abort the process under the default error handler. */
    const MPI_Comm converted = MPI_Comm_f2c((MPI_Fint)comm);
    if (!converted) {
        snprintf(error, error_size, "comm: Fortran handle %d is not a communicator", comm);
        return 1;
    }
    return sneppx_mpi_shard(converted, shard, error, error_size);
}

/* ---- create over a communicator ------------------------------------------------- */

/* A transport that could not be made: its first call fails with the reason, so
 * the create call reports it as its SNEPPX_ERR_COMM, through libsneppx's errors. */
static int failed_allgather(void *context, const void *mine, void *all, size_t bytes, char *error,
                            size_t error_size)
{
    (void)mine, (void)all, (void)bytes;
    snprintf(error, error_size, "%s", (const char *)context);
    return 1;
}

static int failed_sum_start(void *context, float *data, int64_t count, char *error, size_t error_size)
{
    (void)data, (void)count;
    snprintf(error, error_size, "%s", (const char *)context);
    return 1;
}

static int failed_sum_wait(void *context, char *error, size_t error_size)
{
    snprintf(error, error_size, "%s", (const char *)context);
    return 1;
}

static sneppx_shard shard_over(MPI_Comm comm)
{
    sneppx_shard shard;
    char reason[512];
    if (sneppx_mpi_shard(comm, &shard, reason, sizeof reason) == 0)
        return shard;
    /* Rank 0 of 1: the create's first all-gather fails, naming the reason (a string
     * it cannot allocate leaves "out of memory", static, unreleased). */
    char *copy = malloc(strlen(reason) + 1);
    if (copy)
        memcpy(copy, reason, strlen(reason) + 1);
    shard = (sneppx_shard){.rank = 0, .world = 1,
                           .transport = {.context = copy ? copy : "out of memory", .allgather = failed_allgather,
                                         .sum_start = failed_sum_start, .sum_wait = failed_sum_wait,
                                         .release = copy ? free : NULL}};
    return shard;
}

sneppx_status sneppx_mpi_layer_create(const sneppx_config *config, const sneppx_weights *weights, MPI_Comm comm,
                                      sneppx_layer **layer)
{
    const sneppx_shard shard = shard_over(comm);
    return sneppx_layer_create_shard(config, weights, &shard, layer);
}

sneppx_status sneppx_mpi_layer_create_typed(const sneppx_config *config, const sneppx_typed_weights *weights,
                                            MPI_Comm comm, sneppx_layer **layer)
{
    const sneppx_shard shard = shard_over(comm);
    return sneppx_layer_create_shard_typed(config, weights, &shard, layer);
}

sneppx_status sneppx_mpi_layer_create_from_safetensors(const sneppx_config *config, const char *path,
                                                       int64_t layer_index, MPI_Comm comm, sneppx_layer **layer)
{
    const sneppx_shard shard = shard_over(comm);
    return sneppx_layer_create_shard_from_safetensors(config, path, layer_index, &shard, layer);
}
