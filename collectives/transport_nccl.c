/* collectives/transport_nccl.c — the NCCL transport: one GPU per rank.
 *
 * Algorithm. Communicators are non-blocking (ncclConfig_t.blocking = 0): no
 * NCCL call blocks the host; ncclInProgress is settled by polling
 * ncclCommGetAsyncError. A collective or send/recv group is ordered after the
 * compute stream (event `ready`), enqueued on the communication stream, and
 * the compute stream then waits on event `done`: stream order, no host wait.
 *   all_reduce, all_gather, reduce_scatter, broadcast -> the NCCL collective
 *   all_to_all      -> ncclAlltoAll (NCCL >= 2.28; before, a send/recv group)
 *   scatter, gather -> one ncclSend/ncclRecv group (root's part: a memcpy)
 *   barrier         -> a one-element ncclAllReduce, waited for on the host
 *   split           -> ncclCommSplit;  p2p -> one ncclGroupStart/End
 *   (a chained group is ordered after the communication stream only)
 * Host buffers are staged through grow-only pinned and device buffers, and
 * the call waits for completion. A host_only collective (agreement tables)
 * waits for the communication stream only, not every queued kernel.
 *
 * Invariants. No wait is unbounded: each polls the async error, the event and
 * the world's abort flag under the timeout. On error, timeout or a peer's
 * abort the rank ncclCommAbort's the communicator (ending kernels stuck on a
 * peer), records the world's first failure and returns; an aborted
 * communicator is never used again. Across processes the world also polls a
 * peer channel (the MPI world's notices).
 *
 * Teardown: drain, ncclCommFinalize (waits for every rank of the node), then
 * ncclCommDestroy; with ranks as threads these waits count only while every
 * rank of the process is in a teardown (idle_clock.h). Staging buffers are
 * freed once the stream has drained (release_staging).
 *
 * Test: tests/test_cuda.c (one GPU per rank; skipped without GPUs; run on the
 * emulated NCCL of tests/emu/nccl.c by make CUDA=emu test).
 */
#include "transport_nccl.h"
#include "failure.h"
#include "idle_clock.h"
#include "../base/backoff.h"
#include "../base/trace.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Staging buffers of an aborted communicator whose stream was still busy:
 * freed by the same rank's world communicator at its teardown, once the
 * stream has drained (see release_staging). */
typedef struct stage_grave {
    struct stage_grave *next;
    int rank;               /* world rank: whose communication stream used them */
    char *dstage, *hstage;
} stage_grave;

struct dt_nccl_world {
    pthread_mutex_t mu;
    int size;
    dt_comm_config cfg;
    ncclUniqueId id;
    dt_peer_channel channel;/* process mode: failures of ranks elsewhere (may be empty) */
    dt_failure failure;     /* the first failure: the world is aborted once set */
    dt_idle_clock idle;     /* bounds teardown waits (idle_clock.h) */
    stage_grave *graves;
};

typedef struct host_back {
    void *host;     /* the caller's buffer */
    size_t off;     /* in the staging buffers */
    size_t bytes;
} host_back;

typedef struct nccl_impl {
    dt_nccl_world *world;
    ncclComm_t nc;             /* NULL once aborted or destroyed */
    int aborted;
    int device;
    cudaStream_t compute, stream;
    cudaEvent_t ready, done;   /* compute -> communication, communication -> compute */
    /* staging of host buffers */
    char *dstage;
    size_t dstage_bytes;
    char *hstage;
    size_t hstage_bytes;
    int world_comm;            /* the rank's world communicator: its teardown is its last */
    int stage_idle;            /* teardown drained the stream: staging may be freed */
    /* the outstanding p2p group */
    void **dptr;               /* per op: the pointer NCCL sees */
    int dptr_cap;
    host_back *backs;          /* host receives to copy out in p2p_wait */
    int n_backs, backs_cap;
    int p2p_host;              /* the group touched host memory */
} nccl_impl;

static const dt_transport_ops nccl_ops;

#define STAGE_ALIGN 256

static size_t align_up(size_t x) { return (x + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

/* ----------------------------------------------------------------- world */

/* Records the first failure. notify: it happened here, so ranks in other
 * processes are told through the channel (process mode). */
static void world_abort_ex(dt_nccl_world *w, int rank, dt_status st, const char *msg, int notify) {
    pthread_mutex_lock(&w->mu);
    const int first = dt_failure_record(&w->failure, rank, st, msg);
    if (first) dt_log_write(w->cfg.log_level, rank, DT_LOG_WARN, "aborting the world: %s", msg);
    pthread_mutex_unlock(&w->mu);
    /* Only the rank's own thread lives in this process: no lock needed. */
    if (first && notify && w->channel.notify) w->channel.notify(w->channel.arg, st, msg);
}

static void world_abort(dt_nccl_world *w, int rank, dt_status st, const char *msg) {
    world_abort_ex(w, rank, st, msg, 1);
}

static int world_aborted(dt_nccl_world *w) {
    pthread_mutex_lock(&w->mu);
    int a = w->failure.set;
    pthread_mutex_unlock(&w->mu);
    if (!a && w->channel.poll) {
        /* A rank in another process reported a failure (polled, non-blocking). */
        dt_status st = DT_SUCCESS;
        int rank = -1;
        char msg[1024];
        if (w->channel.poll(w->channel.arg, &st, &rank, msg, sizeof msg)) {
            world_abort_ex(w, rank, st, msg, 0);
            a = 1;
        }
    }
    return a;
}

/* A world of `size` ranks, `here` of them threads of this process, with
 * NCCL's unique id (NULL: this process makes one) and the channel of
 * failures elsewhere (NULL: none): both ways of making one. */
static dt_status world_new(int size, int here, const void *id, const dt_peer_channel *channel,
                           const dt_comm_config *cfg, dt_nccl_world **out) {
    if (!out || !cfg) return dt_error(DT_ERR_INVALID_ARGUMENT, "nccl world: out or cfg is NULL");
    *out = NULL;
    if (size < 1) return dt_error(DT_ERR_INVALID_ARGUMENT, "nccl world: size %d < 1", size);
    if (cfg->timeout_ms <= 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "nccl world: timeout %ld ms <= 0", cfg->timeout_ms);
    dt_nccl_world *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_OUT_OF_MEMORY, "nccl world: out of memory");
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w);
        return dt_error(DT_ERR_SYSTEM, "nccl world: cannot create a mutex");
    }
    w->size = size;
    w->cfg = *cfg;
    dt_idle_clock_init(&w->idle, here);
    if (channel) w->channel = *channel;
    /* Without an id, every process makes its own: with NCCL_COMM_ID set they
     * all encode the same address, and rank 0's init listens there. */
    dt_status st = id ? (memcpy(&w->id, id, sizeof w->id), DT_SUCCESS)
                      : dt_nccl_unique_id(&w->id, sizeof w->id);
    if (st != DT_SUCCESS) {
        dt_nccl_world_destroy(w);
        return st;
    }
    *out = w;
    return DT_SUCCESS;
}

dt_status dt_nccl_world_create(int size, const dt_comm_config *cfg, dt_nccl_world **out) {
    return world_new(size, size, NULL, NULL, cfg, out);   /* every rank a thread here */
}

void dt_nccl_world_abort(dt_nccl_world *w, int rank, dt_status status, const char *reason) {
    if (w) world_abort(w, rank, status, reason ? reason : "aborted");
}

dt_status dt_nccl_world_first_failure(dt_nccl_world *w, int *rank, char *msg, size_t size) {
    if (!w) return DT_SUCCESS;
    pthread_mutex_lock(&w->mu);
    dt_status st = dt_failure_get(&w->failure, rank, msg, size);
    pthread_mutex_unlock(&w->mu);
    return st;
}

dt_status dt_nccl_unique_id(void *id, size_t bytes) {
    if (!id || bytes != sizeof(ncclUniqueId))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "nccl: unique id buffer of %zu bytes (need %zu)",
                        bytes, sizeof(ncclUniqueId));
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) {
        const char *last = ncclGetLastError(NULL);
        return dt_error(DT_ERR_BACKEND, "nccl: ncclGetUniqueId failed: %s%s%s",
                        ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    }
    memcpy(id, &u, sizeof u);
    return DT_SUCCESS;
}

dt_status dt_nccl_world_create_process(int size, const void *id, const dt_comm_config *cfg,
                                       const dt_peer_channel *channel, dt_nccl_world **out) {
    return world_new(size, 1, id, channel, cfg, out);   /* one rank lives here */
}

void dt_nccl_world_destroy(dt_nccl_world *w) {
    if (!w) return;
    /* Buffers still here belong to a rank whose stream never drained: they
     * stay allocated (release_staging says why); only the notes go. */
    while (w->graves) {
        stage_grave *g = w->graves;
        w->graves = g->next;
        free(g);
    }
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* ---------------------------------------------------------------- errors */

static void abort_handle(nccl_impl *im) {
    if (im->nc) (void)ncclCommAbort(im->nc);
    im->nc = NULL;
    im->aborted = 1;
}

/* The current message becomes the world's first failure (if it is the
 * first), the communicator is aborted, and st is returned with the message. */
static dt_status fail_and_abort(dt_comm *c, dt_status st) {
    nccl_impl *im = c->impl;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    world_abort(im->world, c->world_rank, st, msg);
    abort_handle(im);
    return dt_error(st, "%s", msg);
}

static int call_len(const char *call) { return (int)strcspn(call, "("); }

static dt_status nccl_fail(dt_comm *c, const char *what, const char *call, ncclResult_t r) {
    nccl_impl *im = c->impl;
    const char *last = ncclGetLastError(im->nc);
    dt_error(DT_ERR_BACKEND, "rank %d: nccl %s: %.*s failed on device %d: %s%s%s", c->world_rank,
             what, call_len(call), call, im->device, ncclGetErrorString(r),
             last && *last ? ": " : "", last ? last : "");
    return fail_and_abort(c, DT_ERR_BACKEND);
}

static dt_status cuda_fail(dt_comm *c, const char *what, const char *call, cudaError_t e) {
    nccl_impl *im = c->impl;
    (void)cudaGetLastError();
    dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_OUT_OF_MEMORY : DT_ERR_BACKEND,
             "rank %d: nccl %s: %.*s failed on device %d: %s (%s)", c->world_rank, what,
             call_len(call), call, im->device, cudaGetErrorString(e), cudaGetErrorName(e));
    return fail_and_abort(c, e == cudaErrorMemoryAllocation ? DT_ERR_OUT_OF_MEMORY : DT_ERR_BACKEND);
}

/* Another rank aborted the world: abort this communicator too and say who. */
static dt_status peer_failed(dt_comm *c, const char *what) {
    nccl_impl *im = c->impl;
    dt_nccl_world *w = im->world;
    abort_handle(im);
    pthread_mutex_lock(&w->mu);
    const dt_failure f = w->failure;   /* the message is made outside the lock */
    pthread_mutex_unlock(&w->mu);
    return dt_failure_error(&f, c->world_rank, what);
}

#define CU_TRY(c, what, call)                                                 \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) return cuda_fail((c), (what), #call, e_);      \
    } while (0)

/* ----------------------------------------------------------------- waits */

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Time a wait that began at t0 has counted toward the timeout. A teardown
 * wait counts only while every rank of this process is in a teardown too
 * (see idle_clock.h): a peer still running its function is not late. */
static long waited_ms(dt_nccl_world *w, int64_t t0, int teardown) {
    int64_t now = now_ms();
    if (!teardown) return (long)(now - t0);
    pthread_mutex_lock(&w->mu);
    int64_t d = dt_idle_clock_waited(&w->idle, t0, now);
    pthread_mutex_unlock(&w->mu);
    return (long)d;
}

/* Between two polls: 200 yields, then 20 us sleeps (backoff.h). */
static void backoff(unsigned spin) { dt_backoff(spin, 200, 20); }

/* Polls until `nc` has settled (no ncclInProgress) and, if ev is given, ev
 * has completed. Every pass checks the async error and the world's abort
 * flag; the timeout bounds it (for a teardown wait, on the idle clock).
 * Aborts the communicator on any failure. */
static dt_status nccl_wait_poll(dt_comm *c, ncclComm_t nc, cudaEvent_t ev, const char *what,
                                int teardown);

/* nccl_wait_poll, its time added to c's wait_ms (comm.h). */
static dt_status nccl_wait_for(dt_comm *c, ncclComm_t nc, cudaEvent_t ev, const char *what,
                               int teardown) {
    const double t0 = dt_comm_wait_begin();
    dt_status st = nccl_wait_poll(c, nc, ev, what, teardown);
    dt_comm_wait_end(c, t0);
    return st;
}

static dt_status nccl_wait_poll(dt_comm *c, ncclComm_t nc, cudaEvent_t ev, const char *what,
                                int teardown) {
    nccl_impl *im = c->impl;
    int64_t t0 = now_ms();
    for (unsigned spin = 0;; spin++) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(nc, &state);
        if (r != ncclSuccess) return nccl_fail(c, what, "ncclCommGetAsyncError", r);
        if (state != ncclSuccess && state != ncclInProgress)
            return nccl_fail(c, what, "an asynchronous NCCL operation", state);
        if (state == ncclSuccess) {
            if (!ev) return DT_SUCCESS;
            cudaError_t e = cudaEventQuery(ev);
            if (e == cudaSuccess) return DT_SUCCESS;
            if (e != cudaErrorNotReady) return cuda_fail(c, what, "cudaEventQuery", e);
        }
        if (world_aborted(im->world)) return peer_failed(c, what);
        if (waited_ms(im->world, t0, teardown) > c->timeout_ms) {
            if (teardown)
                dt_error(DT_ERR_TIMEOUT, "rank %d: nccl %s did not complete within %ld ms "
                         "(DT_TIMEOUT_MS) of the last rank of this process reaching its teardown, "
                         "on device %d: %s", c->world_rank, what, c->timeout_ms, im->device,
                         state == ncclInProgress ? "NCCL still in progress (a peer may not have "
                                                   "destroyed this communicator)"
                                                 : "queued work did not finish (a peer may not "
                                                   "have joined it)");
            else
                dt_error(DT_ERR_TIMEOUT, "rank %d: nccl %s timed out after %ld ms (DT_TIMEOUT_MS) "
                         "on device %d: %s", c->world_rank, what, c->timeout_ms, im->device,
                         state == ncclInProgress ? "NCCL still in progress"
                                                 : "the operation did not complete (a peer may "
                                                   "not have joined)");
            return fail_and_abort(c, DT_ERR_TIMEOUT);
        }
        backoff(spin);
    }
}

static dt_status nccl_wait(dt_comm *c, ncclComm_t nc, cudaEvent_t ev, const char *what) {
    return nccl_wait_for(c, nc, ev, what, 0);
}

/* One NCCL call; ncclInProgress is settled by polling. */
#define NC_TRY(c, what, call)                                                 \
    do {                                                                      \
        ncclResult_t r_ = (call);                                             \
        if (r_ == ncclInProgress) {                                           \
            DT_TRY(nccl_wait((c), ((nccl_impl *)(c)->impl)->nc, NULL, (what))); \
        } else if (r_ != ncclSuccess) {                                       \
            return nccl_fail((c), (what), #call, r_);                         \
        }                                                                     \
    } while (0)

/* Usable? A world abort by a peer aborts this communicator now. */
static dt_status check_alive(dt_comm *c, const char *what) {
    nccl_impl *im = c->impl;
    if (world_aborted(im->world)) return peer_failed(c, what);
    if (im->aborted || !im->nc)
        return dt_error(DT_ERR_PEER_FAILED, "rank %d: nccl %s: this communicator was aborted",
                        c->world_rank, what);
    return DT_SUCCESS;
}

static dt_status enter(dt_comm *c, const char *what) {
    nccl_impl *im = c->impl;
    int cur = -1;
    CU_TRY(c, what, cudaGetDevice(&cur));
    if (cur != im->device) CU_TRY(c, what, cudaSetDevice(im->device));
    return DT_SUCCESS;
}

/* Where p lives: 1 this rank's device (NCCL uses it as it is), 0 memory the
 * host can read and write (pageable, pinned, managed elsewhere: staged),
 * -1 device memory of another GPU (neither: memcpy on it would crash). */
static int placement(const nccl_impl *im, const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (a.type == cudaMemoryTypeManaged) return a.device == im->device;
    if (a.type == cudaMemoryTypeDevice) return a.device == im->device ? 1 : -1;
    return 0;
}

static dt_status foreign_buffer(dt_comm *c, const char *what, const char *name, const void *p) {
    nccl_impl *im = c->impl;
    return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: nccl %s: the %s buffer %p is device memory "
                    "of another GPU (this rank drives device %d)", c->world_rank, what, name, p,
                    im->device);
}

/* Orders the communication stream after the compute stream's queued work. */
static dt_status order_after_compute(dt_comm *c, const char *what) {
    nccl_impl *im = c->impl;
    CU_TRY(c, what, cudaEventRecord(im->ready, im->compute));
    CU_TRY(c, what, cudaStreamWaitEvent(im->stream, im->ready, 0));
    return DT_SUCCESS;
}

/* Records `done` and makes the compute stream wait for it. */
static dt_status hand_back(dt_comm *c, const char *what) {
    nccl_impl *im = c->impl;
    CU_TRY(c, what, cudaEventRecord(im->done, im->stream));
    CU_TRY(c, what, cudaStreamWaitEvent(im->compute, im->done, 0));
    return DT_SUCCESS;
}

/* Makes both staging buffers hold `need` bytes. Queued work may still use
 * the old ones: the communication stream is drained first, and the compute
 * stream with it, since cudaFree and cudaFreeHost wait for the whole device:
 * here the wait is bounded and sees an abort. */
static dt_status stage_reserve(dt_comm *c, size_t need, const char *what) {
    nccl_impl *im = c->impl;
    if (need <= im->dstage_bytes && need <= im->hstage_bytes) return DT_SUCCESS;
    size_t want = need < 4096 ? 4096 : need;
    if (im->dstage || im->hstage) {
        DT_TRY(order_after_compute(c, what));
        CU_TRY(c, what, cudaEventRecord(im->done, im->stream));
        DT_TRY(nccl_wait(c, im->nc, im->done, what));
    }
    if (im->dstage) CU_TRY(c, what, cudaFree(im->dstage));
    if (im->hstage) CU_TRY(c, what, cudaFreeHost(im->hstage));
    im->dstage = im->hstage = NULL;
    im->dstage_bytes = im->hstage_bytes = 0;
    CU_TRY(c, what, cudaMalloc((void **)&im->dstage, want));
    im->dstage_bytes = want;
    CU_TRY(c, what, cudaHostAlloc((void **)&im->hstage, want, cudaHostAllocDefault));
    im->hstage_bytes = want;
    return DT_SUCCESS;
}

/* ----------------------------------------------------------- collectives */

static ncclDataType_t nccl_type(dt_dtype t) {
    switch (t) {
    case DT_F32: return ncclFloat32;
    case DT_BF16: return ncclBfloat16;
    case DT_F16: return ncclFloat16;
    case DT_I32: return ncclInt32;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(dt_reduce_op op) { return op == DT_REDUCE_MAX ? ncclMax : ncclSum; }

/* The NCCL part of one collective on device pointers (stream order). */
static dt_status enqueue(dt_comm *c, const dt_coll_args *a, const char *send, char *recv,
                         const char *what) {
    nccl_impl *im = c->impl;
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    ncclDataType_t t = nccl_type(a->dtype);
    int me = c->rank, P = c->size;
    switch (a->kind) {
    case DT_COLL_ALL_REDUCE:
        NC_TRY(c, what, ncclAllReduce(send, recv, a->count, t, nccl_op(a->op), im->nc, im->stream));
        return DT_SUCCESS;
    case DT_COLL_ALL_GATHER:
        NC_TRY(c, what, ncclAllGather(send, recv, a->count, t, im->nc, im->stream));
        return DT_SUCCESS;
    case DT_COLL_REDUCE_SCATTER:
        NC_TRY(c, what, ncclReduceScatter(send, recv, a->count, t, nccl_op(a->op), im->nc,
                                          im->stream));
        return DT_SUCCESS;
    case DT_COLL_BROADCAST:
        NC_TRY(c, what, ncclBroadcast(send, recv, a->count, t, a->root, im->nc, im->stream));
        return DT_SUCCESS;
    case DT_COLL_ALL_TO_ALL: {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
        NC_TRY(c, what, ncclAlltoAll(send, recv, a->count, t, im->nc, im->stream));
        return DT_SUCCESS;
#else
        /* Block p of send to rank p, block p of recv from it (the own one too). */
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return nccl_fail(c, what, "ncclGroupStart", r);
        for (int p = 0; r == ncclSuccess && p < P && bytes; p++) {
            r = ncclSend(send + (size_t)p * bytes, a->count, t, p, im->nc, im->stream);
            if (r == ncclSuccess)
                r = ncclRecv(recv + (size_t)p * bytes, a->count, t, p, im->nc, im->stream);
        }
        ncclResult_t e = ncclGroupEnd(); /* always closes the group */
        if (r != ncclSuccess && r != ncclInProgress)
            return nccl_fail(c, what, "ncclSend/ncclRecv (all_to_all)", r);
        if (e == ncclInProgress) DT_TRY(nccl_wait(c, im->nc, NULL, what));
        else if (e != ncclSuccess) return nccl_fail(c, what, "ncclGroupEnd", e);
        return DT_SUCCESS;
#endif
    }
    case DT_COLL_BARRIER:
        /* a zero summed, so that no rank sends memory it never wrote */
        CU_TRY(c, what, cudaMemsetAsync(recv, 0, sizeof(float), im->stream));
        NC_TRY(c, what, ncclAllReduce(recv, recv, 1, ncclFloat32, ncclSum, im->nc, im->stream));
        return DT_SUCCESS;
    case DT_COLL_SCATTER:
    case DT_COLL_GATHER: {
        int scatter = a->kind == DT_COLL_SCATTER;
        /* The root's own part is a local copy. */
        if (me == a->root) {
            const char *src = scatter ? send + (size_t)me * bytes : send;
            char *dst = scatter ? recv : recv + (size_t)me * bytes;
            if (src != dst)
                CU_TRY(c, what, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                                im->stream));
        }
        if (P == 1) return DT_SUCCESS;
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return nccl_fail(c, what, "ncclGroupStart", r);
        for (int p = 0; r == ncclSuccess && p < P; p++) {
            if (me == a->root && p != me)
                r = scatter ? ncclSend(send + (size_t)p * bytes, a->count, t, p, im->nc, im->stream)
                            : ncclRecv(recv + (size_t)p * bytes, a->count, t, p, im->nc, im->stream);
            else if (me != a->root && p == a->root)
                r = scatter ? ncclRecv(recv, a->count, t, p, im->nc, im->stream)
                            : ncclSend(send, a->count, t, p, im->nc, im->stream);
        }
        ncclResult_t e = ncclGroupEnd(); /* always closes the group */
        if (r != ncclSuccess && r != ncclInProgress)
            return nccl_fail(c, what, scatter ? "ncclSend/ncclRecv (scatter)" : "ncclSend/ncclRecv (gather)", r);
        if (e == ncclInProgress) DT_TRY(nccl_wait(c, im->nc, NULL, what));
        else if (e != ncclSuccess) return nccl_fail(c, what, "ncclGroupEnd", e);
        return DT_SUCCESS;
    }
    default:
        return dt_error(DT_ERR_INTERNAL, "rank %d: nccl: unexpected collective %s", c->world_rank,
                        what);
    }
}

/* Bytes of the send and receive buffers a collective touches on this rank. */
static void coll_bytes(const dt_comm *c, const dt_coll_args *a, size_t *sbytes, size_t *rbytes) {
    size_t bytes = a->count * dt_dtype_size(a->dtype), P = (size_t)c->size;
    int root = c->rank == a->root;
    *sbytes = *rbytes = 0;
    switch (a->kind) {
    case DT_COLL_ALL_REDUCE: *sbytes = bytes, *rbytes = bytes; break;
    case DT_COLL_ALL_GATHER: *sbytes = bytes, *rbytes = P * bytes; break;
    case DT_COLL_REDUCE_SCATTER: *sbytes = P * bytes, *rbytes = bytes; break;
    case DT_COLL_ALL_TO_ALL: *sbytes = P * bytes, *rbytes = P * bytes; break;
    case DT_COLL_BROADCAST: *sbytes = bytes, *rbytes = bytes; break;
    case DT_COLL_SCATTER: *sbytes = root ? P * bytes : 0, *rbytes = bytes; break;
    case DT_COLL_GATHER: *sbytes = bytes, *rbytes = root ? P * bytes : 0; break;
    default: break;
    }
}

static dt_status run_collective(dt_comm *c, const dt_coll_args *a, const char *what) {
    nccl_impl *im = c->impl;
    size_t sbytes, rbytes;
    coll_bytes(c, a, &sbytes, &rbytes);
    if (a->kind != DT_COLL_BARRIER && sbytes == 0 && rbytes == 0) return DT_SUCCESS;
    DT_TRY(enter(c, what));
    const char *send = a->send;
    char *recv = a->recv;
    /* Broadcast is in place (send == recv): one staged region serves both. */
    int in_place = a->kind == DT_COLL_BROADCAST;
    int send_at = sbytes ? placement(im, send) : 1, recv_at = rbytes ? placement(im, recv) : 1;
    if (send_at < 0) return foreign_buffer(c, what, "send", send);
    if (recv_at < 0) return foreign_buffer(c, what, "receive", recv);
    int host_send = send_at == 0;
    int host_recv = in_place ? host_send : recv_at == 0;
    size_t roff = host_send && !in_place ? align_up(sbytes) : 0;
    size_t need = in_place ? (host_send ? sbytes : 0) : roff + (host_recv ? rbytes : 0);
    if (a->kind == DT_COLL_BARRIER) need = sizeof(float);
    if (need) DT_TRY(stage_reserve(c, need, what));
    if (!a->host_only) DT_TRY(order_after_compute(c, what));
    if (host_send) {
        memcpy(im->hstage, send, sbytes);
        CU_TRY(c, what, cudaMemcpyAsync(im->dstage, im->hstage, sbytes, cudaMemcpyHostToDevice,
                                        im->stream));
        send = im->dstage;
    }
    if (host_recv) recv = im->dstage + roff;
    if (a->kind == DT_COLL_BARRIER) recv = im->dstage;
    DT_TRY(enqueue(c, a, send, recv, what));
    if (host_recv)
        CU_TRY(c, what, cudaMemcpyAsync(im->hstage + roff, recv, rbytes, cudaMemcpyDeviceToHost,
                                        im->stream));
    if (a->host_only) CU_TRY(c, what, cudaEventRecord(im->done, im->stream));
    else DT_TRY(hand_back(c, what));
    if (!host_send && !host_recv && a->kind != DT_COLL_BARRIER) return DT_SUCCESS;
    /* The host needs the data (or, for a barrier, the completion). */
    DT_TRY(nccl_wait(c, im->nc, im->done, what));
    if (host_recv) memcpy(a->recv, im->hstage + roff, rbytes);
    return DT_SUCCESS;
}

static dt_status comm_make(dt_nccl_world *w, ncclComm_t nc, const dt_nccl_rank *r,
                           int world_rank, dt_comm **out);

static dt_status nccl_split(dt_comm *c, const dt_coll_args *a, dt_comm **out) {
    nccl_impl *im = c->impl;
    const char *what = "split";
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t child = NULL;
    DT_TRY(enter(c, what));
    ncclResult_t r = ncclCommSplit(im->nc, a->color >= 0 ? a->color : NCCL_SPLIT_NOCOLOR, a->key,
                                   &child, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (child) (void)ncclCommAbort(child);
        return nccl_fail(c, what, "ncclCommSplit", r);
    }
    dt_status st = nccl_wait(c, im->nc, NULL, what);
    if (st == DT_SUCCESS && child) st = nccl_wait(c, child, NULL, what);
    if (st != DT_SUCCESS) {
        if (child) (void)ncclCommAbort(child);
        return st;
    }
    if (!child) return DT_SUCCESS; /* opted out: *out stays NULL */
    dt_nccl_rank rk = {im->device, im->compute, im->stream, c->mem};
    st = comm_make(im->world, child, &rk, c->world_rank, out);
    if (st != DT_SUCCESS) {
        (void)ncclCommAbort(child);
        return fail_and_abort(c, st);
    }
    return DT_SUCCESS;
}

static dt_status nccl_collective(dt_comm *c, const dt_coll_args *a, dt_comm **split_out) {
    const char *what = dt_coll_kind_name(a->kind);
    DT_TRY(check_alive(c, what));
    if ((a->kind == DT_COLL_ALL_REDUCE || a->kind == DT_COLL_REDUCE_SCATTER) &&
        !dt_dtype_is_float(a->dtype))
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: %s: the nccl transport reduces fp32, "
                        "bf16 and fp16, not %s", c->world_rank, what, dt_dtype_name(a->dtype));
    return a->kind == DT_COLL_SPLIT ? nccl_split(c, a, split_out) : run_collective(c, a, what);
}

/* -------------------------------------------------------- point-to-point */

static dt_status p2p_post(dt_comm *c, const dt_p2p_op *ops, int n, int chained) {
    nccl_impl *im = c->impl;
    const char *what = "sendrecv";
    DT_TRY(enter(c, what));
    if (n > im->dptr_cap || n > im->backs_cap) {
        /* Steady-state callers (the ring) reuse the capacity: no allocation. */
        void **d = realloc(im->dptr, (size_t)n * sizeof *d);
        if (d) im->dptr = d;
        host_back *hb = realloc(im->backs, (size_t)n * sizeof *hb);
        if (hb) im->backs = hb;
        if (!d || !hb)
            return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: sendrecv: out of memory for %d ops",
                            c->world_rank, n);
        im->dptr_cap = im->backs_cap = n;
    }
    /* Host buffers are staged; where each goes. */
    size_t need = 0;
    for (int k = 0; k < n; k++) {
        size_t bytes = ops[k].count * dt_dtype_size(ops[k].dtype);
        int at = bytes ? placement(im, ops[k].buf) : 1;
        if (at < 0)
            return foreign_buffer(c, what, ops[k].kind == DT_P2P_SEND ? "send" : "receive",
                                  ops[k].buf);
        im->dptr[k] = ops[k].buf;
        if (at == 0) {
            im->dptr[k] = NULL; /* placed below */
            need += align_up(bytes);
        }
    }
    if (need) DT_TRY(stage_reserve(c, need, what));
    /* A chained group follows the communication stream's earlier work
     * only; a staged one (host buffers) is ordered as any. */
    if (!chained || need) DT_TRY(order_after_compute(c, what));
    im->n_backs = 0;
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        size_t bytes = ops[k].count * dt_dtype_size(ops[k].dtype);
        if (im->dptr[k] != NULL || bytes == 0) continue;
        im->dptr[k] = im->dstage + off;
        if (ops[k].kind == DT_P2P_SEND) {
            memcpy(im->hstage + off, ops[k].buf, bytes);
            CU_TRY(c, what, cudaMemcpyAsync(im->dstage + off, im->hstage + off, bytes,
                                            cudaMemcpyHostToDevice, im->stream));
        } else {
            im->backs[im->n_backs++] = (host_back){ops[k].buf, off, bytes};
        }
        off += align_up(bytes);
    }
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(c, what, "ncclGroupStart", r);
    for (int k = 0; r == ncclSuccess && k < n; k++) {
        if (ops[k].count == 0) continue;
        ncclDataType_t t = nccl_type(ops[k].dtype);
        r = ops[k].kind == DT_P2P_SEND
                ? ncclSend(im->dptr[k], ops[k].count, t, ops[k].peer, im->nc, im->stream)
                : ncclRecv(im->dptr[k], ops[k].count, t, ops[k].peer, im->nc, im->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(c, what, "ncclSend/ncclRecv", r);
    if (e == ncclInProgress) DT_TRY(nccl_wait(c, im->nc, NULL, what));
    else if (e != ncclSuccess) return nccl_fail(c, what, "ncclGroupEnd", e);
    for (int k = 0; k < im->n_backs; k++)
        CU_TRY(c, what, cudaMemcpyAsync(im->hstage + im->backs[k].off, im->dstage + im->backs[k].off,
                                        im->backs[k].bytes, cudaMemcpyDeviceToHost, im->stream));
    CU_TRY(c, what, cudaEventRecord(im->done, im->stream));
    im->p2p_host = need > 0;
    return DT_SUCCESS;
}

static dt_status nccl_p2p_start(dt_comm *c, const dt_p2p_op *ops, int n, int chained) {
    DT_TRY(check_alive(c, "sendrecv"));
    return p2p_post(c, ops, n, chained);
}

static dt_status nccl_p2p_wait(dt_comm *c) {
    nccl_impl *im = c->impl;
    const char *what = "sendrecv";
    DT_TRY(check_alive(c, what));
    dt_status st = enter(c, what);
    /* A cheap look at the async error: a failed group is reported here. */
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = st == DT_SUCCESS ? ncclCommGetAsyncError(im->nc, &state) : ncclSuccess;
    if (st == DT_SUCCESS && r != ncclSuccess) st = nccl_fail(c, what, "ncclCommGetAsyncError", r);
    else if (st == DT_SUCCESS && state != ncclSuccess && state != ncclInProgress)
        st = nccl_fail(c, what, "an asynchronous NCCL operation", state);
    if (st == DT_SUCCESS) {
        cudaError_t e = cudaStreamWaitEvent(im->compute, im->done, 0);
        if (e != cudaSuccess) st = cuda_fail(c, what, "cudaStreamWaitEvent", e);
    }
    /* Host receives: the host needs the data now. */
    if (st == DT_SUCCESS && im->p2p_host) st = nccl_wait(c, im->nc, im->done, what);
    for (int k = 0; st == DT_SUCCESS && k < im->n_backs; k++)
        memcpy(im->backs[k].host, im->hstage + im->backs[k].off, im->backs[k].bytes);
    im->n_backs = 0;
    im->p2p_host = 0;
    return st;
}

/* ----------------------------------------------------------- lifecycle */

static void nccl_abort(dt_comm *c, dt_status status, const char *reason) {
    nccl_impl *im = c->impl;
    char msg[1024];
    snprintf(msg, sizeof msg, "rank %d aborted (%s): %s", c->world_rank, dt_status_name(status),
             reason);
    world_abort(im->world, c->world_rank, status, msg);
    abort_handle(im);
}

static int nccl_aborted(const dt_comm *c) {
    nccl_impl *im = c->impl;
    return im->aborted || world_aborted(im->world);
}

/* Teardown of a live communicator: drain its stream, ncclCommFinalize
 * (settles once the node's ranks meet in its closing barrier), ncclCommDestroy.
 * Both waits run on the idle clock; a failure aborts as in every wait. */
static dt_status teardown_live(dt_comm *c) {
    nccl_impl *im = c->impl;
    dt_nccl_world *w = im->world;
    const char *what = "destroy";
    pthread_mutex_lock(&w->mu);
    dt_idle_clock_enter(&w->idle, now_ms());
    pthread_mutex_unlock(&w->mu);
    dt_status st = DT_SUCCESS;
    cudaError_t e = cudaEventRecord(im->done, im->stream);
    if (e != cudaSuccess) st = cuda_fail(c, what, "cudaEventRecord", e);
    if (st == DT_SUCCESS) st = nccl_wait_for(c, im->nc, im->done, "destroy (queued work)", 1);
    if (st == DT_SUCCESS) {
        im->stage_idle = 1; /* nothing of this communicator is queued any more */
        ncclResult_t r = ncclCommFinalize(im->nc);
        /* Reported, so that peers waiting for this rank in their own
         * finalize stop at once instead of timing out. */
        if (r != ncclSuccess && r != ncclInProgress) st = nccl_fail(c, what, "ncclCommFinalize", r);
    }
    if (st == DT_SUCCESS) st = nccl_wait_for(c, im->nc, NULL, "destroy (ncclCommFinalize)", 1);
    if (st == DT_SUCCESS) {
        (void)ncclCommDestroy(im->nc);
        im->nc = NULL;
    }
    if (!im->world_comm) {
        /* A sub-communicator: the rank goes back to its function. */
        pthread_mutex_lock(&w->mu);
        dt_idle_clock_leave(&w->idle);
        pthread_mutex_unlock(&w->mu);
    }
    return st;
}

/* Bounded wait for everything queued on the communication stream, after
 * the communicator was aborted (no NCCL state left to poll). */
static int stream_drained(dt_comm *c) {
    nccl_impl *im = c->impl;
    if (cudaEventRecord(im->done, im->stream) != cudaSuccess) return 0;
    int64_t t0 = now_ms();
    for (unsigned spin = 0;; spin++) {
        cudaError_t e = cudaEventQuery(im->done);
        if (e == cudaSuccess) return 1;
        if (e != cudaErrorNotReady || now_ms() - t0 > c->timeout_ms) return 0;
        backoff(spin);
    }
}

/* Frees the staging buffers (for a world communicator, also those its aborted
 * sub-communicators left) once nothing queued can touch them: cudaFree waits
 * for the device, so behind a kernel that never ends it would block for good.
 * A sub-communicator that finds the shared stream busy after an abort leaves
 * its buffers to the world communicator (destroyed last), which waits, bounded,
 * and frees them; if that wait runs out they stay allocated, with a warning. */
static void release_staging(dt_comm *c) {
    nccl_impl *im = c->impl;
    dt_nccl_world *w = im->world;
    stage_grave *mine = NULL;
    if (im->world_comm) {
        pthread_mutex_lock(&w->mu);
        for (stage_grave **p = &w->graves; *p;) {
            stage_grave *g = *p;
            if (g->rank != c->world_rank) {
                p = &g->next;
                continue;
            }
            *p = g->next;
            g->next = mine;
            mine = g;
        }
        pthread_mutex_unlock(&w->mu);
    }
    if (!im->dstage && !im->hstage && !mine) return;
    int idle = im->stage_idle;
    if (!idle) idle = im->world_comm ? stream_drained(c) : cudaStreamQuery(im->stream) == cudaSuccess;
    if (!idle && !im->world_comm) {
        stage_grave *g = malloc(sizeof *g); /* without it, they stay allocated */
        if (g) {
            *g = (stage_grave){NULL, c->world_rank, im->dstage, im->hstage};
            pthread_mutex_lock(&w->mu);
            g->next = w->graves;
            w->graves = g;
            pthread_mutex_unlock(&w->mu);
        }
        return;
    }
    if (!idle)
        DT_COMM_LOG(c, DT_LOG_WARN, "nccl destroy: the communication stream of device %d did not "
                    "drain within %ld ms (DT_TIMEOUT_MS); its staging buffers stay allocated",
                    im->device, c->timeout_ms);
    if (idle && im->dstage) (void)cudaFree(im->dstage);
    if (idle && im->hstage) (void)cudaFreeHost(im->hstage);
    while (mine) {
        stage_grave *g = mine;
        mine = g->next;
        if (idle && g->dstage) (void)cudaFree(g->dstage);
        if (idle && g->hstage) (void)cudaFreeHost(g->hstage);
        free(g);
    }
}

static void nccl_destroy(dt_comm *c) {
    nccl_impl *im = c->impl;
    char saved[1024];
    dt_error_save_(saved, sizeof saved);
    int dev_ok = enter(c, "destroy") == DT_SUCCESS;
    if (im->nc && dev_ok && !im->aborted && !world_aborted(im->world)) (void)teardown_live(c);
    /* An aborted world (a failed teardown has aborted the handle already). */
    if (im->nc) abort_handle(im);
    if (dev_ok) release_staging(c);
    if (im->ready) (void)cudaEventDestroy(im->ready);
    if (im->done) (void)cudaEventDestroy(im->done);
    (void)cudaGetLastError();
    dt_error_restore_(saved);
    free(im->dptr);
    free(im->backs);
    free(im);
    free(c);
}

static const dt_transport_ops nccl_ops = {
    .name = "nccl",
    .collective = nccl_collective,
    .p2p_start = nccl_p2p_start,
    .p2p_wait = nccl_p2p_wait,
    .abort = nccl_abort,
    .aborted = nccl_aborted,
    .destroy = nccl_destroy,
};

/* A handle on a ready (or still initialising) NCCL communicator. Rank and
 * size are read once it is ready (comm_ready). */
static dt_status comm_make(dt_nccl_world *w, ncclComm_t nc, const dt_nccl_rank *r,
                           int world_rank, dt_comm **out) {
    dt_comm *c = calloc(1, sizeof *c);
    nccl_impl *im = calloc(1, sizeof *im);
    if (!c || !im) {
        free(c);
        free(im);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: out of memory for a communicator",
                        world_rank);
    }
    c->ops = &nccl_ops;
    c->impl = im;
    c->world_rank = world_rank;
    c->timeout_ms = w->cfg.timeout_ms;
    c->log_level = w->cfg.log_level;
    c->check = w->cfg.check;
    c->mem = r->mem;
    im->world = w;
    im->nc = nc;
    im->device = r->device;
    im->compute = (cudaStream_t)r->compute_stream;
    im->stream = (cudaStream_t)r->comm_stream;
    cudaError_t e = cudaEventCreateWithFlags(&im->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&im->done, cudaEventDisableTiming);
    if (e == cudaSuccess && nc) {
        int rank = -1, size = 0;
        ncclResult_t nr = ncclCommUserRank(nc, &rank);
        if (nr == ncclSuccess) nr = ncclCommCount(nc, &size);
        if (nr != ncclSuccess) {
            im->nc = NULL; /* the caller owns nc on failure */
            nccl_destroy(c);
            return dt_error(DT_ERR_BACKEND, "rank %d: nccl: ncclCommUserRank/ncclCommCount failed: %s",
                            world_rank, ncclGetErrorString(nr));
        }
        c->rank = rank;
        c->size = size;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        im->nc = NULL;
        nccl_destroy(c);
        return dt_error(DT_ERR_BACKEND, "rank %d: nccl: cudaEventCreateWithFlags failed: %s",
                        world_rank, cudaGetErrorString(e));
    }
    *out = c;
    return DT_SUCCESS;
}

dt_status dt_nccl_world_comm(dt_nccl_world *w, int rank, const dt_nccl_rank *r, dt_comm **out) {
    if (!w || !r || !out || rank < 0 || rank >= w->size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "nccl world: bad comm request for rank %d", rank);
    *out = NULL;
    cudaError_t e = cudaSetDevice(r->device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dt_error(DT_ERR_BACKEND, "rank %d: nccl: cudaSetDevice(%d) failed: %s", rank,
                        r->device, cudaGetErrorString(e));
    }
    /* The shell first: the wait below needs a dt_comm for its messages. */
    dt_comm *c = NULL;
    DT_TRY(comm_make(w, NULL, r, rank, &c));
    c->rank = rank;
    c->size = w->size;
    nccl_impl *im = c->impl;
    im->world_comm = 1;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t nr = ncclCommInitRankConfig(&im->nc, w->size, w->id, rank, &cfg);
    dt_status st = DT_SUCCESS;
    if (nr != ncclSuccess && nr != ncclInProgress) {
        st = nccl_fail(c, "init", "ncclCommInitRankConfig", nr);
    } else {
        DT_TRACE_PUSH("nccl init");
        st = nccl_wait(c, im->nc, NULL, "init (ncclCommInitRankConfig)");
        DT_TRACE_POP();
    }
    if (st != DT_SUCCESS) {
        nccl_destroy(c);
        return st;
    }
    DT_COMM_LOG(c, DT_LOG_DEBUG, "nccl communicator ready: rank %d of %d on device %d", rank,
                w->size, r->device);
    /* Its counters start here: the init's wait was no call on it. */
    memset(&c->counters, 0, sizeof c->counters);
    *out = c;
    return DT_SUCCESS;
}
