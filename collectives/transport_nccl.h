/* collectives/transport_nccl.h — PRIVATE. The NCCL transport: one GPU per
 * rank, ranks are threads of this process (dt_launch) sharing a "world"
 * that holds the ncclUniqueId and the first failure, or processes started
 * by a launcher (mpirun, torchrun), one rank each. Built only when the
 * Makefile finds NCCL (it then defines DT_HAVE_NCCL).
 *
 * Streams: collectives and send/recv groups run on the rank's communication
 * stream, ordered after the work already queued on its compute stream (an
 * event), and the compute stream is made to wait for them (another event),
 * so results are ready for the next kernel without a host wait. The host
 * waits only where it must: barrier, and calls whose buffers are host
 * memory (they are staged through device memory). Every wait polls
 * ncclCommGetAsyncError, the event, and the world's abort flag under the
 * communicator's timeout, and aborts the communicator (ncclCommAbort) and
 * the world on error or timeout. Destroying a communicator waits for its
 * peers to destroy it too (ncclCommFinalize); with ranks as threads that
 * wait is timed only while every rank of the process is in a teardown
 * (idle_clock.h), so a rank that ends early does not time out.
 */
#ifndef DT_TRANSPORT_NCCL_H
#define DT_TRANSPORT_NCCL_H

#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_nccl_world dt_nccl_world;

/* What a rank brings to its communicators: its device, its streams
 * (cudaStream_t, owned by its CUDA backend) and its device memory hooks.
 * Everything must outlive the communicators. */
typedef struct dt_nccl_rank {
    int device;
    void *compute_stream;
    void *comm_stream;
    dt_mem mem;
} dt_nccl_rank;

/* A world of `size` ranks: takes the ncclUniqueId (once, here). */
dt_status dt_nccl_world_create(int size, const dt_comm_config *cfg, dt_nccl_world **out);

/* Bytes of an ncclUniqueId. */
#define DT_NCCL_ID_BYTES 128

/* ncclGetUniqueId into id (bytes must be DT_NCCL_ID_BYTES). With
 * NCCL_COMM_ID=host:port set, every process gets the same id (that address)
 * and rank 0's communicator init listens there. */
dt_status dt_nccl_unique_id(void *id, size_t bytes);

/* Process mode: a world of `size` ranks of which only one lives in this
 * process (dt_nccl_world_comm is then called once, with that rank). id is
 * the world's ncclUniqueId (DT_NCCL_ID_BYTES, broadcast by the launcher;
 * NULL: dt_nccl_unique_id here, for NCCL_COMM_ID bootstrap). channel (may
 * be NULL) carries failures between processes: waits poll it, and a failure
 * here is reported through it. */
dt_status dt_nccl_world_create_process(int size, const void *id, const dt_comm_config *cfg,
                                       const dt_peer_channel *channel, dt_nccl_world **out);
/* COLLECTIVE over the world's threads: the world communicator of `rank`
 * (caller owns it: dt_comm_destroy). Creation is non-blocking underneath
 * (ncclCommInitRankConfig with blocking = 0) and polled under the timeout;
 * a rank that fails to get here aborts the world and the others give up. */
dt_status dt_nccl_world_comm(dt_nccl_world *world, int rank, const dt_nccl_rank *r,
                             dt_comm **out);
/* Abort from outside a communicator (a rank whose function failed): every
 * rank's next wait aborts its communicators and returns DT_ERR_PEER_FAILED. */
void dt_nccl_world_abort(dt_nccl_world *world, int rank, dt_status status, const char *reason);
/* First abort recorded: its status (DT_SUCCESS if none), rank and message. */
dt_status dt_nccl_world_first_failure(dt_nccl_world *world, int *rank, char *msg,
                                      size_t msg_size);
/* Every rank thread must have finished and destroyed its communicators.
 * Accepts NULL. */
void dt_nccl_world_destroy(dt_nccl_world *world);

#ifdef __cplusplus
}
#endif
#endif /* DT_TRANSPORT_NCCL_H */
