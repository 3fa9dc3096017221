/* ctest: two cores (mpirun starts its ranks) */
/* Tensor-parallel layers over MPI (include/sneppx/mpi.h), run by ctest through
 * `mpirun -np N` for N = 1, 2, 3, 4: every case of tests/support/shard_cases.c
 * with MPI_COMM_WORLD as the transport (the small families, forward, masked and
 * cached, against the whole layer within 1e-6 on every rank; sizes that cannot
 * split refused on every rank; the failure cases; a checkpoint read shard by
 * shard; llama3-8B's and qwen2-0.5B's shapes at 3 tokens), then the
 * sneppx_mpi_layer_create calls themselves on MPI_COMM_WORLD and on halves of it
 * (MPI_Comm_split: two shard groups at once), their errors without MPI, and a layer
 * used after MPI_Finalize.
 * --mixed-targets first checks that rank 0 runs v8 and the others the host's
 * target (mpi_shard_mixed_targets). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_cases.h"
#include "sneppx/mpi.h"

static int make_shard(void *context, sneppx_shard *shard)
{
    char error[256];
    if (sneppx_mpi_shard(*(MPI_Comm *)context, shard, error, sizeof error) != 0) {
        fprintf(stderr, "sneppx_mpi_shard: %s\n", error);
        return 1;
    }
    return 0;
}

static void barrier(void *context) { MPI_Barrier(*(MPI_Comm *)context); }

static float *inputs(int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((i * 7919) % 201 - 100) / 100.0f;
    return x;
}

/* sneppx_mpi_layer_create over comm against the whole layer; returns failures. */
static int create_over(MPI_Comm comm, const char *what)
{
    int rank, world;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 192;
    config.num_attention_heads = 12;
    config.num_key_value_heads = 1; /* splits at 1, 2, 3, 4, 6, 12 (its K/V head on every rank) */
    config.num_threads = 1;
    sneppx_layer *shard = NULL, *whole = NULL;
    const sneppx_status status = sneppx_mpi_layer_create(&config, NULL, comm, &shard);
    if (status != SNEPPX_OK || sneppx_layer_create(&config, NULL, &whole) != SNEPPX_OK) {
        fprintf(stderr, "rank %d/%d: FAIL %s: create: %s\n", rank, world, what, sneppx_last_error());
        sneppx_layer_destroy(shard);
        return 1;
    }
    const int64_t n = 5 * config.hidden_size;
    float *x = inputs(n), *want = calloc((size_t)n, sizeof(float)), *got = calloc((size_t)n, sizeof(float));
    sneppx_layer_forward(whole, 1, 5, x, NULL, NULL, NULL, want);
    const sneppx_status forward = sneppx_layer_forward(shard, 1, 5, x, NULL, NULL, NULL, got);
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = got[i] > want[i] ? got[i] - want[i] : want[i] - got[i];
        worst = d > worst ? d : worst;
        scale = want[i] > scale ? want[i] : -want[i] > scale ? -want[i] : scale;
    }
    const int failed = forward != SNEPPX_OK || !(worst <= 1e-6 * scale);
    if (failed)
        fprintf(stderr, "rank %d/%d: FAIL %s: forward %s '%s', error %.3g\n", rank, world, what,
                sneppx_status_name(forward), sneppx_last_error(), worst / scale);
    free(x), free(want), free(got);
    sneppx_layer_destroy(whole);
    sneppx_layer_destroy(shard);
    return failed;
}

/* A layer of 4 heads of 16, each its own K/V head, on one thread: quick to make anywhere. */
static sneppx_config tiny_config(void)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 64;
    config.num_attention_heads = config.num_key_value_heads = 4;
    config.num_threads = 1;
    return config;
}

/* 1 if /proc/cpuinfo lists avx512f (the host runs v16 unless told otherwise). */
static int host_has_avx512f(void)
{
    FILE *cpuinfo = fopen("/proc/cpuinfo", "r");
    char line[4096];
    int found = 0;
    while (cpuinfo && !found && fgets(line, sizeof line, cpuinfo))
        found = strncmp(line, "flags", 5) == 0 && strstr(line, " avx512f") != NULL;
    if (cpuinfo)
        fclose(cpuinfo);
    return found;
}

/* --mixed-targets (mpi_shard_mixed_targets): rank 0 must run v8 and, on an AVX-512
 * host, the others v16; otherwise the environment did not reach one rank only and the
 * test would repeat mpi_shard_np2 without a word. Returns failures. */
static int check_mixed_targets(int rank)
{
    const sneppx_config config = tiny_config();
    sneppx_layer *layer = NULL;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        fprintf(stderr, "rank %d: FAIL --mixed-targets: create: %s\n", rank, sneppx_last_error());
        return 1;
    }
    const int runs_v8 = strstr(sneppx_layer_keys(layer), "-v8") != NULL;
    sneppx_layer_destroy(layer);
    const int wants_v8 = rank == 0 || !host_has_avx512f();
    if (runs_v8 != wants_v8) {
        fprintf(stderr, "rank %d: FAIL --mixed-targets: runs %s, want %s (SNEPPX_TARGET %s)\n", rank,
                runs_v8 ? "v8" : "another target", wants_v8 ? "v8" : "the host's", getenv("SNEPPX_TARGET")
                ? getenv("SNEPPX_TARGET") : "unset");
        return 1;
    }
    return 0;
}

/* 12 heads of 16 on one thread: splits over 1, 2, 3 and 4 ranks. */
static sneppx_config twelve_heads(void)
{
    sneppx_config config = tiny_config();
    config.hidden_size = 192;
    config.num_attention_heads = config.num_key_value_heads = 12;
    return config;
}

/* After MPI_Finalize (MPI may then be called no more; Open MPI aborts the process when it
 * is): a forward, a refusal and a create fail with SNEPPX_ERR_COMM saying so, and
 * sneppx_mpi_shard_fortran refuses the handle; layer (made before) is destroyed.
 * Returns failures (this rank's: the ranks can no longer count them together). */
static int after_finalize(sneppx_layer *layer, int world_handle, int rank, int world)
{
    int failures = 0;
    const int64_t n = 3 * twelve_heads().hidden_size;
    float *x = inputs(n), *out = calloc((size_t)n, sizeof(float));
    const sneppx_status forward = sneppx_layer_forward(layer, 1, 3, x, NULL, NULL, NULL, out);
    if (forward != SNEPPX_ERR_COMM || !strstr(sneppx_last_error(), "MPI is finalized")) {
        fprintf(stderr, "rank %d/%d: FAIL a forward after MPI_Finalize: %s '%s'\n", rank, world,
                sneppx_status_name(forward), sneppx_last_error());
        failures++;
    }
    const sneppx_status refused = sneppx_layer_shard_refuse(layer, SNEPPX_ERR_INVALID_ARGUMENT, "no");
    if (refused != SNEPPX_ERR_COMM || !strstr(sneppx_last_error(), "MPI is finalized")) {
        fprintf(stderr, "rank %d/%d: FAIL a refusal after MPI_Finalize: %s '%s'\n", rank, world,
                sneppx_status_name(refused), sneppx_last_error());
        failures++;
    }
    sneppx_layer_destroy(layer);
    free(x), free(out);
    sneppx_shard unmade;
    char reason[256] = "";
    if (sneppx_mpi_shard_fortran(world_handle, &unmade, reason, sizeof reason) == 0 ||
        !strstr(reason, "MPI is finalized")) {
        fprintf(stderr, "rank %d/%d: FAIL sneppx_mpi_shard_fortran after MPI_Finalize: '%s'\n", rank, world, reason);
        failures++;
    }
    const sneppx_config config = twelve_heads();
    sneppx_layer *late = NULL;
    const sneppx_status status = sneppx_mpi_layer_create(&config, NULL, MPI_COMM_WORLD, &late);
    if (status != SNEPPX_ERR_COMM || late || !strstr(sneppx_last_error(), "MPI is finalized")) {
        fprintf(stderr, "rank %d/%d: FAIL a create after MPI_Finalize: %s '%s'\n", rank, world,
                sneppx_status_name(status), sneppx_last_error());
        failures++;
    }
    sneppx_layer_destroy(late);
    return failures;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm comm = MPI_COMM_WORLD;
    const char *scratch = getenv("SNEPPX_BINARY_DIR");
    const shard_env env = {.rank = rank, .world = world, .make_shard = make_shard, .barrier = barrier,
                           .context = &comm, .scratch_dir = scratch ? scratch : ".", .own_process = 1};
    int failures = argc > 1 && strcmp(argv[1], "--mixed-targets") == 0 ? check_mixed_targets(rank) : 0;
    failures += shard_cases_run(&env, SHARD_CASES_SMALL | SHARD_CASES_FAILURES | SHARD_CASES_CHECKPOINT |
                                             SHARD_CASES_PRESETS);

    failures += create_over(MPI_COMM_WORLD, "sneppx_mpi_layer_create on MPI_COMM_WORLD");
    if (world % 2 == 0) {
        /* Two groups of world / 2 ranks, each its own layer, at the same time. */
        MPI_Comm half;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
        failures += create_over(half, "sneppx_mpi_layer_create on half of MPI_COMM_WORLD");
        /* An intercommunicator between the halves: refused on every rank, naming comm
         * (its all-gathers read the other half's records, its in-place sums fail). */
        MPI_Comm inter;
        MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 ? 0 : 1, 7, &inter);
        const sneppx_config config = tiny_config();
        sneppx_layer *layer = NULL;
        const sneppx_status status = sneppx_mpi_layer_create(&config, NULL, inter, &layer);
        if (status != SNEPPX_ERR_COMM || layer || !strstr(sneppx_last_error(), "comm: an intercommunicator")) {
            fprintf(stderr, "rank %d/%d: FAIL an intercommunicator: %s '%s'\n", rank, world,
                    sneppx_status_name(status), sneppx_last_error());
            failures++;
        }
        sneppx_layer_destroy(layer);
        MPI_Comm_free(&inter);
        MPI_Comm_free(&half);
    }
    /* MPI_COMM_NULL: refused by this rank alone, naming it. */
    sneppx_config config;
    sneppx_config_from_name("qwen2", "0.5B", &config);
    sneppx_layer *layer = NULL;
    sneppx_status status = sneppx_mpi_layer_create(&config, NULL, MPI_COMM_NULL, &layer);
    if (status != SNEPPX_ERR_COMM || !strstr(sneppx_last_error(), "comm: MPI_COMM_NULL")) {
        fprintf(stderr, "rank %d/%d: FAIL MPI_COMM_NULL: %s '%s'\n", rank, world, sneppx_status_name(status),
                sneppx_last_error());
        failures++;
    }
    /* A Fortran handle that names no communicator (a binding's bad object): an error
     * naming comm, where MPI's default error handler would abort the process. */
    sneppx_shard unmade;
    char reason[256] = "";
    if (sneppx_mpi_shard_fortran(1 << 30, &unmade, reason, sizeof reason) == 0 ||
        !strstr(reason, "comm: Fortran handle 1073741824 is not a communicator")) {
        fprintf(stderr, "rank %d/%d: FAIL an invalid Fortran handle: '%s'\n", rank, world, reason);
        failures++;
    }

    /* A layer used after MPI_Finalize: each MPI call would abort the process. */
    const sneppx_config twelve = twelve_heads();
    sneppx_layer *kept = NULL;
    if (sneppx_mpi_layer_create(&twelve, NULL, MPI_COMM_WORLD, &kept) != SNEPPX_OK) {
        fprintf(stderr, "rank %d/%d: FAIL create before MPI_Finalize: %s\n", rank, world, sneppx_last_error());
        failures++;
    }
    const int world_handle = (int)MPI_Comm_c2f(MPI_COMM_WORLD);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%d ranks: %d failed checks\n", world, total);
    MPI_Finalize();
    return total + after_finalize(kept, world_handle, rank, world) ? 1 : 0;
}
