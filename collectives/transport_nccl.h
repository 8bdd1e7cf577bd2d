/* collectives/transport_nccl.h — PRIVATE. The NCCL transport: one GPU per
 * rank; ranks are threads of this process sharing a world (ncclUniqueId, first
 * failure), or processes started by a launcher, one rank each. Built with
 * DT_HAVE_NCCL. Calls run on the communication stream, ordered after the
 * compute stream and before its next kernel, without a host wait (except
 * barrier and host buffers). Streams, waits, teardown: transport_nccl.c.
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

/* Process mode: one rank of `size` lives here (one dt_nccl_world_comm call).
 * id: the ncclUniqueId (DT_NCCL_ID_BYTES; NULL: dt_nccl_unique_id, for
 * NCCL_COMM_ID). channel (may be NULL) carries failures between processes. */
dt_status dt_nccl_world_create_process(int size, const void *id, const dt_comm_config *cfg,
                                       const dt_peer_channel *channel, dt_nccl_world **out);
/* COLLECTIVE over the world's threads: rank's world communicator (caller owns
 * it: dt_comm_destroy); init is polled under the timeout, a failure aborts all. */
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
