/* collectives/comm.h — communicators and collectives.
 *
 * A dt_comm is one rank's handle on a group of ranks. It knows bytes, dtypes,
 * streams and ranks; nothing of tensors or Layouts. Every call below is
 * enqueued on the rank's communication stream; on the CPU backend that means
 * it has completed when the call returns.
 *
 * Calls marked COLLECTIVE must be made by every rank of the communicator, in
 * the same order, with agreeing arguments (count, dtype, op, root). The local
 * transport checks this: a disagreement returns DT_ERR_MISMATCH on every rank
 * with a message naming both ranks, where NCCL would hang.
 *
 * Every blocking wait is bounded by the communicator's timeout (DT_TIMEOUT_MS,
 * see context.h). A wait that runs out, or that sees another rank fail, aborts
 * the whole world: every rank blocked in, or later entering, a call on any of
 * its communicators returns DT_ERR_TIMEOUT (the rank that timed out) or
 * DT_ERR_PEER_FAILED (the others) instead of waiting. An aborted world stays
 * aborted; start a new launch to continue.
 *
 * Buffers: host pointers on the CPU backend, device pointers on CUDA. The
 * caller owns them; they must stay valid until the call (or, for
 * dt_comm_p2p_start, the matching dt_comm_p2p_wait) returns.
 *
 * Test: tests/test_collectives.c (make test).
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "../base/dtype.h"
#include "../base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_comm dt_comm;

typedef enum dt_reduce_op {
    DT_REDUCE_SUM = 0,
    DT_REDUCE_MAX,
    DT_REDUCE_OP_COUNT
} dt_reduce_op;

const char *dt_reduce_op_name(dt_reduce_op op);

/* Rank of the caller in the communicator, and its size. */
int dt_comm_rank(const dt_comm *comm);
int dt_comm_size(const dt_comm *comm);
/* World rank of the caller (same for every communicator of one rank). */
int dt_comm_world_rank(const dt_comm *comm);
/* Timeout of every wait, in milliseconds. */
long dt_comm_timeout_ms(const dt_comm *comm);

/* COLLECTIVE. Split into sub-communicators: ranks with the same color form
 * one, ordered by (key, rank in comm). color < 0 opts out (*out = NULL).
 * The new communicator shares the parent's world (abort, timeout). */
dt_status dt_comm_split(dt_comm *comm, int color, int key, dt_comm **out);

/* Destroy a communicator made by dt_comm_split. Accepts NULL. Do not destroy
 * a communicator while a call on it is in progress. Not collective on the
 * local and mpi transports; on nccl it waits until every rank of the
 * communicator destroys it too (ncclCommFinalize), so destroy shared
 * communicators in the same order on every rank. That wait is bounded by
 * the timeout, counted (ranks as threads) only while every rank of the
 * process is itself in a teardown: a peer that is still working is not late. */
void dt_comm_destroy(dt_comm *comm);

/* COLLECTIVE. recv[i] = op over ranks of send[i], i < count. send may equal
 * recv (in place). How a sum is formed depends on the transport:
 *   local, mpi: accumulated in fp32 in rank order (rank 0 first), bf16
 *     rounded once at the end: every rank gets the same bits, and both
 *     transports give the same bits for the same inputs.
 *   nccl: NCCL's own reduction, in an order its algorithm picks (ring,
 *     tree, NVLS; it varies with size, world size and topology), not rank
 *     order, in the element type: bf16 and fp16 sums are rounded at every
 *     step, so they may differ from the local transport's (and fp32 sums
 *     too, by their order). Every rank still gets the same bits: NCCL
 *     forwards each reduced element unchanged (its maintainers' word, not a
 *     documented guarantee).
 * max rounds nothing on any transport. Dtypes: fp32, bf16 and fp16 on every
 * transport (u8 moves but does not reduce). */
dt_status dt_comm_all_reduce(dt_comm *comm, const void *send, void *recv,
                             size_t count, dt_dtype dtype, dt_reduce_op op);

/* COLLECTIVE. recv[r*count + i] = send of rank r [i]; recv holds size*count.
 * In place when send == recv + rank*count. */
dt_status dt_comm_all_gather(dt_comm *comm, const void *send, void *recv,
                             size_t count, dt_dtype dtype);

/* COLLECTIVE. recv[i] = op over ranks of send[rank*count + i]; send holds
 * size*count. In place when recv == send + rank*count. Sums are formed as
 * in dt_comm_all_reduce (per transport). */
dt_status dt_comm_reduce_scatter(dt_comm *comm, const void *send, void *recv,
                                 size_t count, dt_dtype dtype, dt_reduce_op op);

/* COLLECTIVE. buf on every rank := buf on root. */
dt_status dt_comm_broadcast(dt_comm *comm, void *buf, size_t count,
                            dt_dtype dtype, int root);

/* COLLECTIVE. recv on rank r := send[r*count .. r*count+count-1] of root.
 * send is read on root only (may be NULL elsewhere). */
dt_status dt_comm_scatter(dt_comm *comm, const void *send, void *recv,
                          size_t count, dt_dtype dtype, int root);

/* COLLECTIVE. recv[r*count + i] on root := send of rank r [i].
 * recv is written on root only (may be NULL elsewhere). */
dt_status dt_comm_gather(dt_comm *comm, const void *send, void *recv,
                         size_t count, dt_dtype dtype, int root);

/* COLLECTIVE. Returns when every rank has entered it. */
dt_status dt_comm_barrier(dt_comm *comm);

/* Point-to-point, grouped (NCCL's ncclGroupStart / ncclSend / ncclRecv /
 * ncclGroupEnd). A group is one array of operations; every send must be
 * matched, in order per pair of ranks, by a receive of the same size and
 * dtype on the peer (the local transport checks this and fails both ranks
 * with DT_ERR_MISMATCH when they disagree). A rank may send to or receive
 * from itself. */
typedef enum dt_p2p_kind { DT_P2P_SEND = 0, DT_P2P_RECV } dt_p2p_kind;

/* "send", "recv"; "unknown" otherwise. */
const char *dt_p2p_kind_name(dt_p2p_kind kind);

typedef struct dt_p2p_op {
    dt_p2p_kind kind;
    int peer;          /* rank in comm */
    void *buf;         /* read for SEND, written for RECV */
    size_t count;      /* elements */
    dt_dtype dtype;
} dt_p2p_op;

/* Post a group of operations without waiting for them. At most one group is
 * outstanding per communicator and rank; `ops` must stay valid until
 * dt_comm_p2p_wait returns. */
dt_status dt_comm_p2p_start(dt_comm *comm, const dt_p2p_op *ops, int n_ops);

/* dt_comm_p2p_start, ordered after this rank's earlier groups on comm
 * only: not after the device work it queued since its last group posted
 * by dt_comm_p2p_start (CUDA: the kernels on its compute stream; the CPU
 * backend queues nothing, so there the two are one). For a ring running
 * steps ahead of its kernels: the step after one ordered after the kernels
 * that last read its landing buffers forwards what that step received and
 * lands in buffers that step's ordering freed, beside the kernel launched
 * between them. The caller guarantees that no work queued since the last
 * dt_comm_p2p_start writes the group's send buffers or touches its receive
 * buffers. */
dt_status dt_comm_p2p_start_chained(dt_comm *comm, const dt_p2p_op *ops, int n_ops);

/* Complete the outstanding group: after it returns, received data is visible
 * to work on the compute stream and send buffers may be reused. */
dt_status dt_comm_p2p_wait(dt_comm *comm);

/* dt_comm_p2p_start followed by dt_comm_p2p_wait. */
dt_status dt_comm_sendrecv(dt_comm *comm, const dt_p2p_op *ops, int n_ops);

/* COLLECTIVE. Check that every rank passes the same n values (named by
 * names[i], for the message) before an operation that would hang or corrupt
 * data if they did not. Returns DT_SUCCESS, or DT_ERR_MISMATCH on every rank
 * with a message naming the op, the first rank and value that differ from
 * rank 0, and both values ("rank 0: attention_forward: ranks disagree: comm
 * rank 2 has q.shape[1] = 96 but comm rank 0 has 64"). Costs one all_gather
 * of n int64. */
dt_status dt_comm_check_agreement(dt_comm *comm, const char *op, const int64_t *values,
                                  const char *const *names, int n);

/* Abort the world this communicator belongs to: every rank's pending and
 * future calls return DT_ERR_PEER_FAILED with `reason`. `status` is what
 * this rank's own later calls and dt_launch return (a status that is no
 * error, such as DT_SUCCESS, counts as DT_ERR_PEER_FAILED). Safe to call
 * from any rank at any time, more than once (the first reason is kept). */
void dt_comm_abort(dt_comm *comm, dt_status status, const char *reason);

/* 1 if the world of this communicator has been aborted. */
int dt_comm_aborted(const dt_comm *comm);

#ifdef __cplusplus
}
#endif
#endif /* DT_COMM_H */
