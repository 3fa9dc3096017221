/* A rank that dies: run by rank_exit.sh under mpirun. Every rank makes its
 * shard; then the others call the forward, whose first collective step waits
 * for the last rank, which exits without MPI_Finalize instead. They must not wait
 * forever: MPI reports the error or mpirun ends the job (rank_exit.sh checks
 * which, and that it happened within its time limit). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "sneppx/mpi.h"

int main(int argc, char **argv)
{
    int provided = 0, rank = 0, world = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 64;
    config.num_attention_heads = config.num_key_value_heads = 4;
    config.head_dim = 16;
    config.num_threads = 1;
    sneppx_layer *layer = NULL;
    if (sneppx_mpi_layer_create(&config, NULL, MPI_COMM_WORLD, &layer) != SNEPPX_OK) {
        fprintf(stderr, "rank %d: create failed: %s\n", rank, sneppx_last_error());
        return 2;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == world - 1) {
        /* While the others wait in their forward's first step: exit status 0, which
         * is no failure mpirun sees, only a rank gone without MPI_Finalize. */
        sleep(1);
        printf("rank %d exits without MPI_Finalize\n", rank);
        fflush(stdout);
        _exit(0);
    }
    float x[4 * 64] = {0}, out[4 * 64];
    const sneppx_status status = sneppx_layer_forward(layer, 1, 4, x, NULL, NULL, NULL, out);
    /* Reached only if MPI reports the dead rank instead of mpirun ending the job. */
    printf("rank %d: forward returned %s: %s\n", rank, sneppx_status_name(status), sneppx_last_error());
    fflush(stdout);
    return status == SNEPPX_OK ? 1 : 4;
}
