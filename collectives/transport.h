/* collectives/transport.h — PRIVATE. The transport function table behind
 * dt_comm. comm.c validates arguments that do not depend on the transport and
 * dispatches here; a transport (local, nccl, mpi) implements the table. */
#ifndef DT_TRANSPORT_H
#define DT_TRANSPORT_H

#include "comm.h"
#include "../base/log.h"

#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_coll_kind {
    DT_COLL_ALL_REDUCE = 0,
    DT_COLL_ALL_GATHER,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_ALL_TO_ALL,
    DT_COLL_BROADCAST,
    DT_COLL_SCATTER,
    DT_COLL_GATHER,
    DT_COLL_BARRIER,
    DT_COLL_SPLIT,
    DT_COLL_KIND_COUNT
} dt_coll_kind;

const char *dt_coll_kind_name(dt_coll_kind kind);

/* Arguments of one collective, validated by comm.c. */
typedef struct dt_coll_args {
    dt_coll_kind kind;
    const void *send;
    void *recv;
    size_t count;      /* per rank for all_gather / reduce_scatter / all_to_all / scatter / gather */
    dt_dtype dtype;
    dt_reduce_op op;   /* reductions only */
    int root;          /* rooted collectives only */
    int color, key;    /* split only */
    /* send/recv are host memory of this rank's thread only (agreement tables):
     * not ordered against queued device work, so a check does not drain a GPU. */
    int host_only;
} dt_coll_args;

typedef struct dt_transport_ops {
    const char *name;
    /* Runs one collective; for DT_COLL_SPLIT stores the new comm in *split_out. */
    dt_status (*collective)(dt_comm *comm, const dt_coll_args *args, dt_comm **split_out);
    /* chained: ordered after this rank's earlier groups on comm only, not
     * after the device work it queued since (dt_comm_p2p_start_chained). */
    dt_status (*p2p_start)(dt_comm *comm, const dt_p2p_op *ops, int n_ops, int chained);
    dt_status (*p2p_wait)(dt_comm *comm);
    void (*abort)(dt_comm *comm, dt_status status, const char *reason);
    int (*aborted)(const dt_comm *comm);
    void (*destroy)(dt_comm *comm);
} dt_transport_ops;

/* What every communicator of a world shares, fixed at its creation. */
typedef struct dt_comm_config {
    long timeout_ms;          /* bound on every wait */
    dt_log_level log_level;   /* DT_LOG */
    int check;                /* DT_CHECK: verify cross-rank agreement before each call */
    /* DT_LOCAL_COPIES=0 (benchmarks only): the local transport matches and
     * completes sends but moves no data, so results are wrong. Others ignore it. */
    int skip_copies;
} dt_comm_config;

/* Where a rank's communication buffers live and how a transport moves and
 * reduces them: dt_mem_host, or device memory (the CUDA backend). Fixed at world
 * creation, inherited by splits; called by the owning rank's thread, synchronous. */
typedef struct dt_mem_ops {
    const char *name;
    /* Zeroed memory of `bytes` (0: a valid unique pointer). */
    dt_status (*alloc)(void *arg, size_t bytes, void **out);
    void (*free)(void *arg, void *p);
    /* dst := src (host or device), after the work that dst_ready/src_ready
     * mark (tokens of `mark`, this rank's or a peer's; NULL: none). */
    dt_status (*copy)(void *arg, void *dst, const void *src, size_t bytes, const void *dst_ready,
                      const void *src_ready);
    /* Make the caller's earlier writes readable by other ranks' threads (cuda:
     * waits for the compute and communication streams). */
    dt_status (*publish)(void *arg);
    /* Without waiting, a token (*ready) for the point the caller's queued work
     * has reached, for `copy` (cuda: an event on the communication stream after
     * the compute stream; host: NULL). chained: the communication stream's point
     * only. Valid until the caller's next mark. */
    dt_status (*mark)(void *arg, int chained, const void **ready);
    /* acc[i] := x[i] (first) or op(acc[i], x[i]) for i < n, in fp32; acc is
     * this memory's fp32 scratch, x (fp32, bf16 or fp16) may live anywhere. */
    dt_status (*reduce)(void *arg, float *acc, const void *x, size_t n, dt_dtype dtype,
                        dt_reduce_op op, int first);
    /* Round acc (n fp32 values) to dtype in place (bf16, fp16: packed at the start). */
    dt_status (*finish)(void *arg, void *acc, size_t n, dt_dtype dtype);
    /* *first = the index of the first of n values of a float dtype at x (this
     * memory or host memory) that is NaN or infinite, else -1. For DT_CHECK:
     * waits for the rank's queued work. */
    dt_status (*find_nonfinite)(void *arg, const void *x, size_t n, dt_dtype dtype,
                                int64_t *first);
} dt_mem_ops;

typedef struct dt_mem {
    const dt_mem_ops *ops;
    void *arg;
} dt_mem;

/* Host memory: calloc/free/memcpy, reductions in C (transport_local.c). */
extern const dt_mem dt_mem_host;

/* How a rank learns of, and reports, failures of ranks in other processes
 * (transport_mpi.c provides one; the NCCL transport in process mode polls it
 * in its waits). Both calls are non-blocking and made by the rank's thread. */
typedef struct dt_peer_channel {
    void *arg;
    /* 1 if a peer has reported a failure: its status, rank and message. */
    int (*poll)(void *arg, dt_status *status, int *rank, char *msg, size_t msg_size);
    /* Tell every peer that this rank failed (once; later calls do nothing). */
    void (*notify)(void *arg, dt_status status, const char *msg);
} dt_peer_channel;

/* One rank's handle. Transports allocate it (with their own state in impl). */
struct dt_comm {
    const dt_transport_ops *ops;
    void *impl;
    int rank, size, world_rank;
    long timeout_ms;
    dt_log_level log_level;
    int check;                /* see dt_comm_config */
    unsigned long calls;      /* collective calls made, for agreement checks */
    int p2p_pending;          /* a group was started and not yet waited for */
    uint64_t p2p_sent, p2p_recv; /* bytes of the pending group to and from other ranks */
    dt_mem mem;               /* where this rank's buffers live (ring buffers, scratch) */
    /* comm.h's counters: comm.c counts calls and bytes, the transport adds
     * the time its waits block (dt_comm_wait_end). */
    dt_comm_counters counters;
};

/* Times a transport's wait for comm.h's wait_ms: t0 = dt_comm_wait_begin()
 * before it, dt_comm_wait_end(comm, t0) after it, on every way out. */
static inline double dt_comm_wait_begin(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static inline void dt_comm_wait_end(dt_comm *comm, double t0) {
    const double ms = dt_comm_wait_begin() - t0;
    if (ms > 0) comm->counters.wait_ms += ms;
}

#define DT_COMM_LOG(comm, level, ...) \
    dt_log_write((comm)->log_level, (comm)->world_rank, (level), __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif /* DT_TRANSPORT_H */
