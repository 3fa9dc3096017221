/* sneppx over MPI: tensor-parallel attention layers whose shards (shard.h) live
 * on the ranks of a communicator. The only sneppx header that includes <mpi.h>;
 * its functions are in libsneppx_mpi (built when CMake's FindMPI finds MPI),
 * which links libsneppx and MPI: link -lsneppx_mpi -lsneppx and MPI's own flags
 * (CMake: sneppx::sneppx_mpi).
 *
 * MPI must be initialized, at least MPI_THREAD_FUNNELED (the layer's OpenMP
 * threads never call MPI: the layer calls MPI from the thread that calls it).
 * Which level: calls from the thread that initialized MPI only, FUNNELED; from
 * several threads, one call at a time in the whole process, SERIALIZED; several
 * shards (layers) called from several threads at once, MULTIPLE (calls on one
 * shard take turns by themselves, shard.h). Each shard talks over its own duplicate of
 * the communicator (MPI_Comm_dup at create, freed by sneppx_layer_destroy), with
 * MPI_ERRORS_RETURN, so its traffic never mixes with the caller's and an MPI
 * error it sees is SNEPPX_ERR_COMM rather than an abort. A rank that dies is
 * another matter: mpirun then ends the job (Open MPI's default), and the other
 * ranks never wait on it forever. Destroy shards before MPI_Finalize (after it,
 * destroy frees the layer and leaves the communicator to MPI's teardown, and a
 * collective call or a create is SNEPPX_ERR_COMM saying so, never an MPI call).
 *
 *   MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
 *   sneppx_layer *layer;    // this rank's heads of llama3.1-405B's layer
 *   sneppx_mpi_layer_create_from_safetensors(&config, "/models/405B", 0, MPI_COMM_WORLD, &layer);
 *   sneppx_layer_forward(layer, 1, T, x, NULL, NULL, NULL, y);   // every rank: the whole y
 *   sneppx_layer_destroy(layer);
 *   MPI_Finalize();
 */
#ifndef SNEPPX_MPI_H
#define SNEPPX_MPI_H

#include <mpi.h>
#include <stddef.h>
#include "sneppx/export.h"
#include "sneppx/shard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sneppx_layer_create_shard, _typed and _from_safetensors on every rank of comm
 * (an intracommunicator: an intercommunicator or MPI_COMM_NULL is SNEPPX_ERR_COMM
 * naming comm): rank comm's rank, world its size (collective over comm; every
 * rank passes the same config and weights). The errors are shard.h's: every rank
 * fails alike. */
SNEPPX_API sneppx_status sneppx_mpi_layer_create(const sneppx_config *config, const sneppx_weights *weights,
                                                 MPI_Comm comm, sneppx_layer **layer);
SNEPPX_API sneppx_status sneppx_mpi_layer_create_typed(const sneppx_config *config,
                                                       const sneppx_typed_weights *weights, MPI_Comm comm,
                                                       sneppx_layer **layer);
SNEPPX_API sneppx_status sneppx_mpi_layer_create_from_safetensors(const sneppx_config *config, const char *path,
                                                                  int64_t layer_index, MPI_Comm comm,
                                                                  sneppx_layer **layer);

/* The shard (rank, world and a transport over a duplicate of comm) that the calls
 * above pass to shard.h's; collective over comm. Returns 0, or nonzero with the
 * reason in error (then shard holds nothing to release). A shard not given to a
 * create call must be released: shard->transport.release(shard->transport.context). */
SNEPPX_API int sneppx_mpi_shard(MPI_Comm comm, sneppx_shard *shard, char *error, size_t error_size);
/* The same from comm's Fortran handle (MPI_Comm_c2f), for bindings that cannot
 * name an MPI_Comm: Python's mpi4py gives it as comm.py2f(). */
SNEPPX_API int sneppx_mpi_shard_fortran(int comm, sneppx_shard *shard, char *error, size_t error_size);

#ifdef __cplusplus
}
#endif
#endif
