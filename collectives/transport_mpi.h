/* collectives/transport_mpi.h — PRIVATE. The MPI transport: ranks are
 * processes started by mpirun, buffers are host memory. Built with DT_HAVE_MPI;
 * no MPI types here, so callers need no mpi.h.
 * A world is one dt_launch: two duplicates of MPI_COMM_WORLD (traffic, and
 * control: failure notices, exit exchange, bootstrap). Every wait is an MPI_Test
 * loop bounded by the timeout; no blocking MPI wait, MPI_Abort or exit.
 * Process-wide state (as MPI's): who initialised MPI, whether MPI_COMM_WORLD is
 * usable, memory abandoned requests may touch (freed by dt_mpi_finalize).
 */
#ifndef DT_TRANSPORT_MPI_H
#define DT_TRANSPORT_MPI_H

#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_mpi_world dt_mpi_world;

/* Initialises MPI if nobody has (MPI_Init_thread, MPI_THREAD_SERIALIZED, on
 * a thread of its own that also finalizes it) and returns this process's
 * rank and the size of MPI_COMM_WORLD. MPI's start waits for every process
 * of the job: DT_ERR_TIMEOUT after timeout_ms (a later call waits again).
 * Fails if MPI was finalized, if a previous world left MPI_COMM_WORLD
 * unusable, or if MPI's thread level does not allow calls from this thread. */
dt_status dt_mpi_init(long timeout_ms, int *rank, int *size);

/* MPI_Finalize if dt_mpi_init initialised MPI, then frees what abandoned
 * requests held. Skipped (DT_ERR_PEER_FAILED) when the last world did not
 * complete; else bounded by dt_mpi_init's timeout (DT_ERR_TIMEOUT). */
dt_status dt_mpi_finalize(void);

/* COLLECTIVE over MPI_COMM_WORLD (every process, in the same order): a new
 * world (MPI_Comm_idup twice, polled under cfg->timeout_ms). */
dt_status dt_mpi_world_create(const dt_comm_config *cfg, dt_mpi_world **out);
int dt_mpi_world_rank(const dt_mpi_world *world);
int dt_mpi_world_size(const dt_mpi_world *world);
/* The world communicator of this process's rank (caller owns it:
 * dt_comm_destroy). `mem` must be host memory (NULL: dt_mem_host). */
dt_status dt_mpi_world_comm(dt_mpi_world *world, const dt_mem *mem, dt_comm **out);
/* Marks the world failed (first failure kept) and, once, tells every other
 * rank (a non-blocking message on the control communicator), so their next
 * poll returns DT_ERR_PEER_FAILED. */
void dt_mpi_world_abort(dt_mpi_world *world, dt_status status, const char *reason);
/* 1 if the world failed here or a peer's notice has arrived (polls). */
int dt_mpi_world_aborted(dt_mpi_world *world);
/* COLLECTIVE over the world: `bytes` of buf on root reach every rank (control
 * communicator, bounded). Failed ranks call it too; a notice does not stop it. */
dt_status dt_mpi_world_bcast(dt_mpi_world *world, void *buf, size_t bytes, int root);
/* COLLECTIVE over the world, once, before a launch runs its function: every
 * rank shares whether its own start went well (`mine`, with its message) and
 * gets the verdict, as dt_mpi_world_finish; bounded by the timeout. */
dt_status dt_mpi_world_agree(dt_mpi_world *world, dt_status mine, const char *my_msg, char *msg,
                             size_t msg_size);
/* COLLECTIVE over the world, once at the end of a launch: every rank shares
 * its status and gets the same verdict (DT_SUCCESS, or the lowest rank's own
 * failure). Bounded by the timeout plus a 1 s grace (the grace alone once a
 * failure is known here); DT_ERR_TIMEOUT if a rank never arrives. */
dt_status dt_mpi_world_finish(dt_mpi_world *world, dt_status mine, const char *my_msg,
                              char *msg, size_t msg_size);
/* A channel other transports (NCCL in process mode) use for failures that
 * cross processes: poll for a peer's notice, notify the peers. */
dt_peer_channel dt_mpi_world_channel(dt_mpi_world *world);
/* Every communicator of the world must be destroyed. Accepts NULL. A
 * failed world's MPI communicators are not freed (requests may be pending
 * on them). */
void dt_mpi_world_destroy(dt_mpi_world *world);

#ifdef __cplusplus
}
#endif
#endif /* DT_TRANSPORT_MPI_H */
