/* collectives/comm.h — communicators and collectives.
 *
 * A dt_comm is one rank's handle on a group of ranks: bytes, dtypes, streams,
 * ranks; no tensors. Every call is enqueued on the rank's communication stream
 * (on the CPU backend: complete when it returns).
 * COLLECTIVE: every rank of the communicator calls it, in the same order, with
 * agreeing arguments (count, dtype, op, root); the local transport checks and
 * returns DT_ERR_MISMATCH on every rank where NCCL would hang.
 * Every wait is bounded by DT_TIMEOUT_MS (context.h). A timeout or a failed peer
 * aborts the world: every call on any of its communicators returns
 * DT_ERR_TIMEOUT (the rank that timed out) or DT_ERR_PEER_FAILED, for good.
 * Buffers: host pointers on CPU, device pointers on CUDA, owned by the caller,
 * valid until the call (for dt_comm_p2p_start: dt_comm_p2p_wait) returns.
 * Test: tests/test_collectives.c.
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

/* Destroy a dt_comm_split result; accepts NULL; no call on it may be running.
 * Local, mpi: not collective. nccl: waits until every rank destroys it too, so
 * destroy shared communicators in the same order on every rank; the timeout
 * counts only while every rank of the process is in a teardown (idle_clock.h). */
void dt_comm_destroy(dt_comm *comm);

/* COLLECTIVE. recv[i] = op over ranks of send[i], i < count; send may equal recv.
 * Sums: local and mpi add in fp32 in rank order and round once (the same bits on
 * both); nccl adds in its own order in the element type, so sums may differ from
 * local's, yet every rank gets the same bits. Dtypes fp32, bf16, fp16 (u8: no). */
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

/* COLLECTIVE. recv[r*count + i] := send of rank r [rank*count + i]: block r of
 * this rank's recv is block `rank` of rank r's send; send and recv hold
 * size*count each. Any dtype (bytes are moved, never combined). Not in place:
 * send and recv must not overlap (DT_ERR_INVALID_ARGUMENT). */
dt_status dt_comm_all_to_all(dt_comm *comm, const void *send, void *recv,
                             size_t count, dt_dtype dtype);

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

/* Point-to-point, grouped as ncclGroupStart/End: each send is matched, in order
 * per pair of ranks, by a receive of the same count and dtype on the peer (local
 * checks: DT_ERR_MISMATCH on both). A rank may send to itself. */
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

/* Post a group without waiting. At most one group outstanding per comm and rank;
 * ops and their buffers stay valid until dt_comm_p2p_wait returns. */
dt_status dt_comm_p2p_start(dt_comm *comm, const dt_p2p_op *ops, int n_ops);

/* dt_comm_p2p_start ordered after this rank's earlier groups on comm only, not
 * after device work queued since (CUDA: compute-stream kernels; on CPU the same
 * as p2p_start): lets a ring run steps ahead of its kernels. The caller ensures
 * no work queued since the last p2p_start writes the sends or touches the recvs. */
dt_status dt_comm_p2p_start_chained(dt_comm *comm, const dt_p2p_op *ops, int n_ops);

/* Complete the outstanding group: received data is then visible to the compute
 * stream and send buffers reusable (nccl: a stream wait, not a host wait). */
dt_status dt_comm_p2p_wait(dt_comm *comm);

/* dt_comm_p2p_start followed by dt_comm_p2p_wait. */
dt_status dt_comm_sendrecv(dt_comm *comm, const dt_p2p_op *ops, int n_ops);

/* COLLECTIVE. Check that every rank passes the same n values (names[i] label
 * them); else DT_ERR_MISMATCH on every rank, naming the op, the first rank and
 * value that differ from rank 0, and both values. One all_gather of n int64. */
dt_status dt_comm_check_agreement(dt_comm *comm, const char *op, const int64_t *values,
                                  const char *const *names, int n);

/* COLLECTIVE. dt_comm_check_agreement after each rank's own checks of a call:
 * `local` is this rank's verdict (its message in dt_last_error()), n <
 * DT_COMM_CHECK_MAX. If any rank's failed, every rank fails at once: that
 * rank with its own status and message; the others with the first failing
 * rank's message ("comm rank R failed its own checks: ...") and its status
 * where that is a finding about the data all ranks share (DT_ERR_NONFINITE,
 * DT_ERR_OUT_OF_RANGE), else DT_ERR_MISMATCH. Else the values are compared
 * as dt_comm_check_agreement does. One all_gather of n + 1 int64; a second,
 * of the messages, only when a rank failed. */
#define DT_COMM_CHECK_MAX 64
dt_status dt_comm_check_call(dt_comm *comm, const char *op, dt_status local,
                             const int64_t *values, const char *const *names, int n);

/* Communication counters of one communicator (a split's start at zero and
 * are its own). Host bookkeeping of the rank's thread: no lock, no wait, not
 * collective; read and reset them from that thread, as every call on comm.
 *
 * calls: calls that returned DT_SUCCESS (CUDA: enqueued), by kind; a rejected
 * or failed call counts nothing. A p2p group counts once, when
 * dt_comm_p2p_wait (or dt_comm_sendrecv) returns DT_SUCCESS. dt_comm_split and
 * the agreement exchanges (DT_CHECK, dt_comm_check_agreement/_call) count no
 * call and no byte.
 *
 * bytes_sent, bytes_recv: what this rank's part of a call moves to and from
 * the other ranks by the operation's definition, whatever algorithm the
 * transport runs (so the same on every transport); a rank's own block never
 * counts. With P = size and n = count * dt_dtype_size(dtype) bytes:
 *   p2p                                    the group's sends to other ranks;
 *                                          its receives from other ranks
 *   all_gather, reduce_scatter, all_to_all sent = recv = (P-1) n
 *   all_reduce                             sent = recv = 2 (P-1) ceil(count/P)
 *                                          * dtype size: a reduce_scatter and
 *                                          an all_gather of count padded to a
 *                                          multiple of P
 *   broadcast, scatter                     root sends (P-1) n; others receive n
 *   gather                                 others send n; root receives (P-1) n
 *   barrier                                nothing
 * With P = 1 every call counts 0 bytes.
 *
 * wait_ms: host time, in milliseconds, the rank's thread spent blocked in the
 * transport's waits on this communicator (for peers, or for its own
 * communication to complete), in every call on it, failed ones and agreement
 * exchanges included; copies, reductions and staging do not count. local:
 * its condition waits (arrival, departure, messages); mpi: polling MPI
 * requests; nccl: polling NCCL and CUDA events on the host (host buffers,
 * barrier, settling ncclInProgress). A call on device buffers is queued, not
 * waited for: the time the device spends waiting for a late peer is not seen. */
typedef enum dt_comm_kind {
    DT_COMM_P2P = 0,       /* a group of sends and receives */
    DT_COMM_ALL_REDUCE,
    DT_COMM_ALL_GATHER,
    DT_COMM_REDUCE_SCATTER,
    DT_COMM_ALL_TO_ALL,
    DT_COMM_BROADCAST,
    DT_COMM_SCATTER,
    DT_COMM_GATHER,
    DT_COMM_BARRIER,
    DT_COMM_KIND_COUNT
} dt_comm_kind;

/* "p2p" (a send/recv group), "all_reduce", ... (the collective's name);
 * "unknown" otherwise. */
const char *dt_comm_kind_name(dt_comm_kind kind);

typedef struct dt_comm_counters {
    uint64_t calls[DT_COMM_KIND_COUNT];       /* successful calls */
    uint64_t bytes_sent[DT_COMM_KIND_COUNT];  /* to other ranks, as defined above */
    uint64_t bytes_recv[DT_COMM_KIND_COUNT];  /* from other ranks */
    double wait_ms;                           /* host time blocked in the transport's waits */
} dt_comm_counters;

/* *out := comm's counters. DT_ERR_INVALID_ARGUMENT if comm or out is NULL. */
dt_status dt_comm_counters_get(const dt_comm *comm, dt_comm_counters *out);

/* Zero comm's counters; accepts NULL. */
void dt_comm_counters_reset(dt_comm *comm);

/* Abort comm's world: other ranks' pending and later calls return
 * DT_ERR_PEER_FAILED with `reason`; this rank's and dt_launch return `status`
 * (DT_SUCCESS counts as PEER_FAILED). Any rank, any time; the first reason wins. */
void dt_comm_abort(dt_comm *comm, dt_status status, const char *reason);

/* 1 if the world of this communicator has been aborted. */
int dt_comm_aborted(const dt_comm *comm);

#ifdef __cplusplus
}
#endif
#endif /* DT_COMM_H */
