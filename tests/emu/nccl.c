/* tests/emu/nccl.c — NCCL emulated on the CPU (include/nccl.h), so that
 * dtensor's NCCL transport (collectives/transport_nccl.c) runs in `make
 * CUDA=emu test` without a GPU. Test: tests/test_emu_nccl.c; and every
 * cuda+nccl case of the suites (make CUDA=emu test runs them with
 * DT_EMU_DEVICES=4 emulated devices, one per rank).
 *
 * The model. Ranks are threads of this process; a communicator is a
 * "clique" shared by the rank handles (ncclComm_t) that joined it.
 *   - Creation: ncclCommInitRankConfig joins the clique of its unique id
 *     (made at the first call with that id); the clique is ready once all
 *     nranks ranks have joined. ncclCommSplit is a rendezvous of the
 *     parent's ranks (matched by call order): once all have called, each
 *     color gets a clique, ranks ordered by (key, parent rank);
 *     NCCL_SPLIT_NOCOLOR gives NULL. Until then the new handle, and the
 *     parent, report ncclInProgress (as NCCL's parent runs the split as an
 *     async job). ncclCommFinalize: in progress until every rank of the
 *     clique has called it and this rank's operations are done.
 *     Non-blocking communicators (config.blocking = 0) return at once
 *     (ncclInProgress) and are polled with ncclCommGetAsyncError; blocking
 *     ones poll here, for at most EMU_NCCL_BLOCK_MS, then fail with
 *     ncclSystemError. Using a communicator still in progress fails with
 *     ncclInvalidArgument, as in NCCL.
 *   - Operations are stream work (tests/emu/cudart.c's queues): every call
 *     posts its part to the clique at once (collectives are matched across
 *     ranks by call order on the communicator; sends and receives per
 *     (source, destination) pair in order; a ncclGroupStart/End group's
 *     sends and receives on one (communicator, stream) are one operation
 *     that completes as a whole) and queues it on its stream. When a
 *     stream's run reaches a part, the operation runs if every participant
 *     has posted its part and every participant's stream can be run up to
 *     it (this runs the peers' streams as far as that, in this thread);
 *     then the whole collective is done at once, every rank's output
 *     written, and the peers' parts are marked done (they complete when
 *     their streams reach them). Otherwise the part is "not ready": its
 *     stream stops there, cudaStreamQuery / cudaEventQuery report
 *     cudaErrorNotReady, and a later wait tries again. A peer that never
 *     posts leaves it not ready for ever (the library's timeout aborts);
 *     a cycle (a stream that must be run to run itself, as when two ranks
 *     post two communicators' collectives in opposite orders) is not ready
 *     too, where NCCL would hang.
 *   - ncclCommAbort (and ncclCommDestroy) make the rank's queued parts
 *     complete without moving data, as an abort ends NCCL's kernels, so its
 *     streams drain; peers' parts that needed them stay not ready until
 *     those peers abort too.
 *
 * Where it differs from NCCL:
 *   - Reductions run in rank order (rank 0 first), in the element type:
 *     every step of a bf16 or fp16 sum is computed in fp32 and rounded to
 *     the element type, as NCCL's own reductions round at every step (NCCL
 *     picks its order by algorithm; here it is always rank order). ncclAvg
 *     is the sum divided by nranks (integers: truncated). fp8 is refused.
 *   - Collectives inside a ncclGroupStart/End group are posted at the call,
 *     not fused with the group's sends and receives.
 *   - Streams must be created streams of the communicator's device (the
 *     NULL stream is refused), and buffers must lie inside one allocation
 *     CUDA knows (cudaMalloc, or pinned host memory); a participant's
 *     mismatch (kind, count, type, op, root; or a send and its receive of
 *     different sizes) fails the operation on every rank (the streams then
 *     report cudaErrorLaunchFailure, the async error ncclInvalidUsage),
 *     where NCCL would hang or corrupt memory.
 *   - Only ranks of one process meet: ranks in different processes (a
 *     unique id from NCCL_COMM_ID) never do, and their init times out.
 *   - Nothing here blocks the host beyond the bounded polls above.
 *
 * State is guarded by the emulated runtime's queue lock (dt_emu_cuda_lock):
 * the run functions of queued work are called with it held. Also compiles
 * as C++. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudart_emu.h"
#include "base/dtype.h"
#include "include/cuda_runtime_api.h"
#include "include/nccl.h"

#ifdef __cplusplus
#define DT_TLS thread_local
#else
#define DT_TLS _Thread_local
#endif

#define COMM_MAGIC 0x6e63636cu   /* "nccl" */
#define ID_MAGIC "dtensor-emu-nccl"
#define EMU_NCCL_BLOCK_MS 60000

/* ------------------------------------------------------------------ errors */

static DT_TLS char tl_last[512];

static ncclResult_t nfail(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_last, sizeof tl_last, fmt, ap);
    va_end(ap);
    return r;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return tl_last;
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return nfail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* ------------------------------------------------------------------- state */

typedef struct clique clique;
typedef struct part part;

/* One send or receive of a group. */
typedef struct item {
    part *owner;
    int send;               /* 1 send, 0 receive */
    int src, dst;           /* ranks in the clique */
    void *buf;
    size_t count, bytes;
    ncclDataType_t dt;
    unsigned long seq;      /* per (src, dst) pair and direction */
    int done;
    int linked;             /* in the clique's list for its pair */
    struct item *next;
} item;

enum { K_ALL_REDUCE, K_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_BROADCAST, K_ALL_TO_ALL, K_GROUP };
static const char *const kind_names[] = {"ncclAllReduce", "ncclReduce", "ncclAllGather",
                                         "ncclReduceScatter", "ncclBroadcast", "ncclAlltoAll",
                                         "ncclSend/ncclRecv"};

/* One collective of a clique: its ranks' parts, matched by call order. */
typedef struct coll {
    unsigned long seq;
    int posted;
    part **parts;           /* [nranks] */
    int done;
    int refs;               /* parts not yet freed */
    struct coll *next;
} coll;

/* A rank's operation: the ctx of its queued stream work. */
struct part {
    clique *cl;
    int rank;
    cudaStream_t stream;
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root;
    coll *c;
    item *items;
    int n_items, n_done;
    int done;               /* complete: its run returns at once */
    int aborted;            /* its rank aborted: completes without data */
    char err[256];          /* set: the operation failed */
    struct part *next;      /* the clique's parts not yet freed */
};

typedef struct split_rec {
    unsigned long seq;
    int n;                        /* the parent's ranks */
    int called;
    int *color, *key;
    ncclComm_t *parent, *child;   /* per parent rank */
    struct split_rec *next;
} split_rec;

struct clique {
    int nranks;
    int refs;                     /* handles and parts */
    ncclComm_t *members;
    int joined;
    ncclUniqueId id;
    int pending;                  /* waiting in g_pending for ranks to join */
    unsigned long *coll_seq;      /* per rank */
    coll *colls;
    unsigned long *send_seq, *recv_seq;   /* [src * nranks + dst] */
    item **pairs;                 /* [src * nranks + dst]: unmatched items */
    unsigned long *split_seq;     /* per rank */
    split_rec *splits;
    int finalized;
    int *live;                    /* per rank: parts not yet done */
    part *parts;
    clique *next;
};

struct ncclComm {
    uint32_t magic;
    clique *cl;                   /* NULL until a split completes */
    int rank;
    int device;
    int blocking;
    int ready;
    int pending_splits;
    int finalizing;
    ncclResult_t error;           /* asynchronous error */
    split_rec *split;             /* a child still waiting for its split */
    struct ncclComm *next;        /* every live handle */
};

static clique *g_pending;         /* cliques waiting for ranks to join */
static ncclComm_t g_comms;
static unsigned long g_ids;
static int g_depth;               /* part runs on the call stack */
static part *g_dead;              /* parts finished while g_depth > 0 */

/* DT_EMU_NCCL_TRACE=1: every post, and every operation run, on stderr. */
static int tracing(void) {
    static int t = -1;
    if (t < 0) {
        const char *v = getenv("DT_EMU_NCCL_TRACE");
        t = v && *v && strcmp(v, "0") != 0;
    }
    return t;
}

#define TRACE(...)                                                            \
    do {                                                                      \
        if (tracing()) fprintf(stderr, "[nccl emu] " __VA_ARGS__);            \
    } while (0)

static void lock(void) { dt_emu_cuda_lock(); }
static void unlock(void) { dt_emu_cuda_unlock(); }

static int valid(ncclComm_t h) {
    for (ncclComm_t c = g_comms; c; c = c->next)
        if (c == h) return h->magic == COMM_MAGIC;
    return 0;
}

static clique *clique_new(int nranks) {
    clique *cl = (clique *)calloc(1, sizeof *cl);
    if (!cl) return NULL;
    size_t n = (size_t)nranks;
    cl->nranks = nranks;
    cl->members = (ncclComm_t *)calloc(n, sizeof *cl->members);
    cl->coll_seq = (unsigned long *)calloc(n, sizeof *cl->coll_seq);
    cl->send_seq = (unsigned long *)calloc(n * n, sizeof *cl->send_seq);
    cl->recv_seq = (unsigned long *)calloc(n * n, sizeof *cl->recv_seq);
    cl->pairs = (item **)calloc(n * n, sizeof *cl->pairs);
    cl->split_seq = (unsigned long *)calloc(n, sizeof *cl->split_seq);
    cl->live = (int *)calloc(n, sizeof *cl->live);
    if (!cl->members || !cl->coll_seq || !cl->send_seq || !cl->recv_seq || !cl->pairs ||
        !cl->split_seq || !cl->live) {
        free(cl->members), free(cl->coll_seq), free(cl->send_seq), free(cl->recv_seq);
        free(cl->pairs), free(cl->split_seq), free(cl->live), free(cl);
        return NULL;
    }
    return cl;
}

static void split_free(split_rec *r) {
    if (!r) return;
    free(r->color), free(r->key), free(r->parent), free(r->child), free(r);
}

static void clique_unref(clique *cl) {
    if (!cl || --cl->refs > 0) return;
    if (cl->pending)
        for (clique **p = &g_pending; *p; p = &(*p)->next)
            if (*p == cl) {
                *p = cl->next;
                break;
            }
    while (cl->splits) {
        split_rec *r = cl->splits;
        cl->splits = r->next;
        for (int i = 0; i < cl->nranks; i++)
            if (r->child[i]) r->child[i]->split = NULL;
        split_free(r);
    }
    free(cl->members), free(cl->coll_seq), free(cl->send_seq), free(cl->recv_seq);
    free(cl->pairs), free(cl->split_seq), free(cl->live), free(cl);
}

static ncclResult_t state_of(ncclComm_t h) {
    if (h->error != ncclSuccess) return h->error;
    if (!h->ready || h->pending_splits) return ncclInProgress;
    if (h->finalizing && (h->cl->finalized < h->cl->nranks || h->cl->live[h->rank] > 0))
        return ncclInProgress;
    return ncclSuccess;
}

/* Blocking communicators: poll until settled (lock held; it is released
 * while napping). */
static ncclResult_t settle(ncclComm_t h, const char *fn) {
    double t0 = dt_emu_now_ms();
    for (;;) {
        ncclResult_t st = state_of(h);
        if (st != ncclInProgress) return st;
        if (dt_emu_now_ms() - t0 > EMU_NCCL_BLOCK_MS)
            return nfail(ncclSystemError, "%s: the other ranks did not arrive within %d ms (NCCL "
                         "emulator)", fn, EMU_NCCL_BLOCK_MS);
        unlock();
        dt_emu_nap();
        lock();
        if (!valid(h)) return nfail(ncclInvalidUsage, "%s: the communicator was destroyed", fn);
    }
}

static ncclComm_t handle_new(int device, int blocking) {
    ncclComm_t h = (ncclComm_t)calloc(1, sizeof *h);
    if (!h) return NULL;
    h->magic = COMM_MAGIC;
    h->device = device;
    h->blocking = blocking;
    h->next = g_comms;
    g_comms = h;
    return h;
}

static int blocking_of(const ncclConfig_t *config) {
    return !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
}

static ncclResult_t check_config(const ncclConfig_t *config, const char *fn) {
    if (!config) return ncclSuccess;
    if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t) ||
        config->version != NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH))
        return nfail(ncclInvalidArgument, "%s: the config was not set from "
                     "NCCL_CONFIG_INITIALIZER", fn);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1)
        return nfail(ncclInvalidArgument, "%s: config blocking = %d (0 or 1)", fn,
                     config->blocking);
    return ncclSuccess;
}

/* ------------------------------------------------------------ communicators */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return nfail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    memset(id, 0, sizeof *id);
    lock();
    unsigned long n = ++g_ids;
    unlock();
    snprintf(id->internal, sizeof id->internal, "%s:%ld:%lu", ID_MAGIC, (long)getpid(), n);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    const char *fn = "ncclCommInitRankConfig";
    if (!comm) return nfail(ncclInvalidArgument, "%s: comm is NULL", fn);
    *comm = NULL;
    ncclResult_t r = check_config(config, fn);
    if (r != ncclSuccess) return r;
    if (nranks < 1) return nfail(ncclInvalidArgument, "%s: nranks %d < 1", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return nfail(ncclInvalidArgument, "%s: rank %d not in [0, %d)", fn, rank, nranks);
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return nfail(ncclUnhandledCudaError, "%s: cudaGetDevice failed", fn);
    }
    lock();
    clique *cl = g_pending;
    while (cl && memcmp(&cl->id, &commId, sizeof commId) != 0) cl = cl->next;
    if (cl && cl->nranks != nranks) {
        unlock();
        return nfail(ncclInvalidArgument, "%s: rank %d says nranks %d, an earlier rank of this "
                     "unique id said %d", fn, rank, nranks, cl->nranks);
    }
    if (cl && cl->members[rank]) {
        unlock();
        return nfail(ncclInvalidArgument, "%s: rank %d of this unique id joined twice", fn, rank);
    }
    int fresh = !cl;
    if (fresh) {
        cl = clique_new(nranks);
        if (cl) {
            cl->id = commId;
            cl->pending = 1;
            cl->next = g_pending;
            g_pending = cl;
        }
    }
    ncclComm_t h = cl ? handle_new(device, blocking_of(config)) : NULL;
    if (!h) {
        if (cl && fresh) {
            cl->refs = 1;
            clique_unref(cl);
        }
        unlock();
        return nfail(ncclSystemError, "%s: out of memory", fn);
    }
    h->cl = cl;
    h->rank = rank;
    cl->refs++;
    cl->members[rank] = h;
    if (++cl->joined == nranks) {
        for (clique **p = &g_pending; *p; p = &(*p)->next)
            if (*p == cl) {
                *p = cl->next;
                break;
            }
        cl->pending = 0;
        for (int i = 0; i < nranks; i++)
            if (cl->members[i]) cl->members[i]->ready = 1;
    }
    *comm = h;
    if (h->blocking) r = settle(h, fn);
    else r = h->ready ? ncclSuccess : ncclInProgress;
    unlock();
    return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!asyncError) return nfail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    lock();
    int ok = valid(comm);
    if (ok) *asyncError = state_of(comm);
    unlock();
    return ok ? ncclSuccess
              : nfail(ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
}

/* A communicator that may take operations (lock held). */
static ncclResult_t usable(ncclComm_t h, const char *fn) {
    if (!valid(h)) return nfail(ncclInvalidArgument, "%s: comm is not a live communicator", fn);
    ncclResult_t st = state_of(h);
    if (st == ncclInProgress)
        return nfail(ncclInvalidArgument, "%s: Attempt to use communicator before the previous "
                     "operation returned ncclSuccess", fn);
    if (st != ncclSuccess) return nfail(st, "%s: the communicator has an asynchronous error", fn);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!count) return nfail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    lock();
    ncclResult_t r = usable(comm, "ncclCommCount");
    if (r == ncclSuccess) *count = comm->cl->nranks;
    unlock();
    return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!rank) return nfail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    lock();
    ncclResult_t r = usable(comm, "ncclCommUserRank");
    if (r == ncclSuccess) *rank = comm->rank;
    unlock();
    return r;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!device) return nfail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    lock();
    ncclResult_t r = usable(comm, "ncclCommCuDevice");
    if (r == ncclSuccess) *device = comm->device;
    unlock();
    return r;
}

/* Every rank of the parent has called: make the children (lock held). */
static void split_complete(clique *cl, split_rec *rec) {
    int n = cl->nranks;
    int *order = (int *)malloc((size_t)n * sizeof *order);
    int *taken = (int *)calloc((size_t)n, sizeof *taken);
    for (int i = 0; order && taken && i < n; i++) {
        if (taken[i] || rec->color[i] == NCCL_SPLIT_NOCOLOR) continue;
        int m = 0;
        for (int j = i; j < n; j++)
            if (!taken[j] && rec->color[j] == rec->color[i]) {
                taken[j] = 1;
                /* insertion by (key, parent rank) */
                int at = m++;
                while (at > 0 && rec->key[order[at - 1]] > rec->key[j]) {
                    order[at] = order[at - 1];
                    at--;
                }
                order[at] = j;
            }
        clique *child = clique_new(m);
        for (int k = 0; k < m; k++) {
            ncclComm_t h = rec->child[order[k]];
            if (!h) continue;   /* aborted while waiting */
            h->split = NULL;
            if (!child) {
                h->error = nfail(ncclSystemError, "ncclCommSplit: out of memory");
                continue;
            }
            h->cl = child;
            h->rank = k;
            h->ready = 1;
            child->members[k] = h;
            child->refs++;
        }
        if (child) child->joined = m;
    }
    if (!order || !taken)
        for (int i = 0; i < n; i++)
            if (rec->child[i]) {
                rec->child[i]->split = NULL;
                rec->child[i]->error = ncclSystemError;
            }
    for (int i = 0; i < n; i++)
        if (rec->parent[i]) rec->parent[i]->pending_splits--;
    for (split_rec **p = &cl->splits; *p; p = &(*p)->next)
        if (*p == rec) {
            *p = rec->next;
            break;
        }
    split_free(rec);
    free(order);
    free(taken);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
    const char *fn = "ncclCommSplit";
    if (!newcomm) return nfail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    *newcomm = NULL;
    ncclResult_t r = check_config(config, fn);
    if (r != ncclSuccess) return r;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return nfail(ncclInvalidArgument, "%s: color %d < 0 (NCCL_SPLIT_NOCOLOR is %d)", fn, color,
                     NCCL_SPLIT_NOCOLOR);
    lock();
    r = usable(comm, fn);
    if (r != ncclSuccess) {
        unlock();
        return r;
    }
    clique *cl = comm->cl;
    int n = cl->nranks, me = comm->rank;
    unsigned long seq = cl->split_seq[me]++;
    split_rec *rec = cl->splits;
    while (rec && rec->seq != seq) rec = rec->next;
    if (!rec) {
        rec = (split_rec *)calloc(1, sizeof *rec);
        if (rec) {
            rec->seq = seq;
            rec->n = n;
            rec->color = (int *)calloc((size_t)n, sizeof(int));
            rec->key = (int *)calloc((size_t)n, sizeof(int));
            rec->parent = (ncclComm_t *)calloc((size_t)n, sizeof(ncclComm_t));
            rec->child = (ncclComm_t *)calloc((size_t)n, sizeof(ncclComm_t));
            if (!rec->color || !rec->key || !rec->parent || !rec->child) {
                split_free(rec);
                rec = NULL;
            } else {
                rec->next = cl->splits;
                cl->splits = rec;
            }
        }
    }
    ncclComm_t child = NULL;
    if (rec && color != NCCL_SPLIT_NOCOLOR) {
        child = handle_new(comm->device, config ? blocking_of(config) : comm->blocking);
        if (child) child->split = rec;
    }
    if (!rec || (color != NCCL_SPLIT_NOCOLOR && !child)) {
        comm->error = ncclSystemError;
        unlock();
        return nfail(ncclSystemError, "%s: out of memory", fn);
    }
    rec->color[me] = color;
    rec->key[me] = key;
    rec->parent[me] = comm;
    rec->child[me] = child;
    comm->pending_splits++;
    *newcomm = child;
    if (++rec->called == n) split_complete(cl, rec);
    if (comm->blocking) r = settle(comm, fn);
    else r = state_of(comm) == ncclInProgress ? ncclInProgress : ncclSuccess;
    if (r == ncclSuccess && child && child->blocking) r = settle(child, fn);
    unlock();
    return r;
}

/* ----------------------------------------------------------------- parts */

static void item_unlink(clique *cl, item *it) {
    if (!it->linked) return;
    for (item **p = &cl->pairs[(size_t)it->src * cl->nranks + it->dst]; *p; p = &(*p)->next)
        if (*p == it) {
            *p = it->next;
            break;
        }
    it->linked = 0;
}

static void part_mark_done(part *p) {
    if (p->done) return;
    p->done = 1;
    p->cl->live[p->rank]--;
}

static void part_free(part *p) {
    clique *cl = p->cl;
    for (int i = 0; i < p->n_items; i++) item_unlink(cl, &p->items[i]);
    part_mark_done(p);
    coll *c = p->c;
    if (c) {
        c->parts[p->rank] = NULL;
        if (--c->refs == 0) {
            for (coll **q = &cl->colls; *q; q = &(*q)->next)
                if (*q == c) {
                    *q = c->next;
                    break;
                }
            free(c->parts);
            free(c);
        }
    }
    for (part **q = &cl->parts; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            break;
        }
    free(p->items);
    free(p);
    clique_unref(cl);
}

/* Finished parts are freed once no part run is on the stack (a run further
 * up may hold pointers to them); until then they wait in g_dead. */
static void part_release(part *p) {
    if (g_depth == 0) {
        part_free(p);
        return;
    }
    for (part **q = &p->cl->parts; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            break;
        }
    p->next = g_dead;
    g_dead = p;
}

static void flush_dead(void) {
    while (g_dead) {
        part *p = g_dead;
        g_dead = p->next;
        part_free(p);   /* no longer in its clique's list: nothing to unlink there */
    }
}

/* ------------------------------------------------------------- arithmetic */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;   /* fp8 and unknown: refused */
    }
}

#define COMBINE(a, b, op) \
    ((op) == ncclMax ? ((b) > (a) ? (b) : (a)) : (op) == ncclMin ? ((b) < (a) ? (b) : (a)) \
     : (op) == ncclProd ? (a) * (b) : (a) + (b))

/* acc[i] = acc[i] op x[i], i < n, rounded to the element type. */
static void combine(void *acc, const void *x, size_t n, ncclDataType_t t, ncclRedOp_t op) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
#define INT_CASE(T, U)                                                       \
    {                                                                         \
        T a = ((T *)acc)[i], b = ((const T *)x)[i];                           \
        T v = op == ncclMax ? (b > a ? b : a) : op == ncclMin ? (b < a ? b : a) \
              : op == ncclProd ? (T)((U)a * (U)b) : (T)((U)a + (U)b);         \
        ((T *)acc)[i] = v;                                                    \
        break;                                                                \
    }
        case ncclInt8: INT_CASE(int8_t, uint8_t)
        case ncclUint8: INT_CASE(uint8_t, unsigned)
        case ncclInt32: INT_CASE(int32_t, uint32_t)
        case ncclUint32: INT_CASE(uint32_t, uint32_t)
        case ncclInt64: INT_CASE(int64_t, uint64_t)
        case ncclUint64: INT_CASE(uint64_t, uint64_t)
#undef INT_CASE
        case ncclFloat32: {
            float a = ((float *)acc)[i], b = ((const float *)x)[i];
            ((float *)acc)[i] = COMBINE(a, b, op);
            break;
        }
        case ncclFloat64: {
            double a = ((double *)acc)[i], b = ((const double *)x)[i];
            ((double *)acc)[i] = COMBINE(a, b, op);
            break;
        }
        case ncclFloat16: {
            float a = dt_f16_to_f32(((uint16_t *)acc)[i]), b = dt_f16_to_f32(((const uint16_t *)x)[i]);
            ((uint16_t *)acc)[i] = dt_f32_to_f16(COMBINE(a, b, op));
            break;
        }
        case ncclBfloat16: {
            float a = dt_bf16_to_f32(((uint16_t *)acc)[i]), b = dt_bf16_to_f32(((const uint16_t *)x)[i]);
            ((uint16_t *)acc)[i] = dt_f32_to_bf16(COMBINE(a, b, op));
            break;
        }
        default: break;
        }
    }
}

/* ncclAvg: the sum divided by nranks. */
static void average(void *acc, size_t n, ncclDataType_t t, int nranks) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case ncclInt8: ((int8_t *)acc)[i] = (int8_t)(((int8_t *)acc)[i] / nranks); break;
        case ncclUint8: ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] / (unsigned)nranks); break;
        case ncclInt32: ((int32_t *)acc)[i] /= nranks; break;
        case ncclUint32: ((uint32_t *)acc)[i] /= (uint32_t)nranks; break;
        case ncclInt64: ((int64_t *)acc)[i] /= nranks; break;
        case ncclUint64: ((uint64_t *)acc)[i] /= (uint64_t)nranks; break;
        case ncclFloat32: ((float *)acc)[i] /= (float)nranks; break;
        case ncclFloat64: ((double *)acc)[i] /= (double)nranks; break;
        case ncclFloat16: {
            uint16_t *v = &((uint16_t *)acc)[i];
            *v = dt_f32_to_f16(dt_f16_to_f32(*v) / (float)nranks);
            break;
        }
        case ncclBfloat16: {
            uint16_t *v = &((uint16_t *)acc)[i];
            *v = dt_f32_to_bf16(dt_bf16_to_f32(*v) / (float)nranks);
            break;
        }
        default: break;
        }
    }
}

/* out = the reduction of n elements at offset `off` of every part's send
 * buffer, in rank order. */
static void reduce_into(void *out, coll *c, int nranks, size_t off, size_t n) {
    part *p0 = c->parts[0];
    size_t es = type_size(p0->dt);
    memcpy(out, (const char *)p0->send + off * es, n * es);
    for (int r = 1; r < nranks; r++)
        combine(out, (const char *)c->parts[r]->send + off * es, n, p0->dt, p0->op);
    if (p0->op == ncclAvg) average(out, n, p0->dt, nranks);
}

/* ------------------------------------------------------------- execution */

static void coll_fail(coll *c, int nranks, const char *msg) {
    for (int r = 0; r < nranks; r++) {
        part *p = c->parts[r];
        snprintf(p->err, sizeof p->err, "%s", msg);
        ncclComm_t h = p->cl->members[r];
        if (h && h->error == ncclSuccess) h->error = ncclInvalidUsage;
        part_mark_done(p);
    }
    c->done = 1;
}

/* Every part posted and reached: the whole collective at once. */
static void coll_execute(coll *c, clique *cl) {
    int n = cl->nranks;
    part *p0 = c->parts[0];
    char msg[256];
    for (int r = 1; r < n; r++) {
        part *p = c->parts[r];
        if (p->kind != p0->kind || p->count != p0->count || p->dt != p0->dt ||
            ((p0->kind == K_ALL_REDUCE || p0->kind == K_REDUCE || p0->kind == K_REDUCE_SCATTER) &&
             p->op != p0->op) ||
            ((p0->kind == K_REDUCE || p0->kind == K_BROADCAST) && p->root != p0->root)) {
            snprintf(msg, sizeof msg, "NCCL emulator: collective #%lu of a communicator of %d "
                     "ranks: rank 0 called %s (count %zu, type %d, op %d, root %d), rank %d %s "
                     "(count %zu, type %d, op %d, root %d)", c->seq, n, kind_names[p0->kind],
                     p0->count, (int)p0->dt, (int)p0->op, p0->root, r, kind_names[p->kind],
                     p->count, (int)p->dt, (int)p->op, p->root);
            coll_fail(c, n, msg);
            return;
        }
    }
    size_t es = type_size(p0->dt), count = p0->count;
    size_t total = p0->kind == K_ALL_GATHER || p0->kind == K_REDUCE_SCATTER ? (size_t)n * count
                   : p0->kind == K_ALL_TO_ALL ? (size_t)n * n * count
                                              : count;
    char *tmp = (char *)malloc(total * es + 1);
    if (!tmp) {
        coll_fail(c, n, "NCCL emulator: out of host memory");
        return;
    }
    switch (p0->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE:
        reduce_into(tmp, c, n, 0, count);
        for (int r = 0; r < n; r++)
            if (p0->kind == K_ALL_REDUCE || r == p0->root) memcpy(c->parts[r]->recv, tmp, count * es);
        break;
    case K_REDUCE_SCATTER:
        reduce_into(tmp, c, n, 0, total);
        for (int r = 0; r < n; r++) memcpy(c->parts[r]->recv, tmp + (size_t)r * count * es, count * es);
        break;
    case K_ALL_GATHER:
        for (int r = 0; r < n; r++) memcpy(tmp + (size_t)r * count * es, c->parts[r]->send, count * es);
        for (int r = 0; r < n; r++) memcpy(c->parts[r]->recv, tmp, total * es);
        break;
    case K_BROADCAST:
        memcpy(tmp, c->parts[p0->root]->send, count * es);
        for (int r = 0; r < n; r++) memcpy(c->parts[r]->recv, tmp, count * es);
        break;
    case K_ALL_TO_ALL:
        /* every send read before any recv is written: rank d's recv block s
         * is rank s's send block d */
        for (int d = 0; d < n; d++)
            for (int src = 0; src < n; src++)
                memcpy(tmp + ((size_t)d * n + src) * count * es,
                       (const char *)c->parts[src]->send + (size_t)d * count * es, count * es);
        for (int d = 0; d < n; d++)
            memcpy(c->parts[d]->recv, tmp + (size_t)d * n * count * es, (size_t)n * count * es);
        break;
    default: break;
    }
    free(tmp);
    TRACE("clique %p runs %s #%lu\n", (void *)cl, kind_names[p0->kind], c->seq);
    for (int r = 0; r < n; r++) part_mark_done(c->parts[r]);
    c->done = 1;
}

/* 0: done (or failed: p->err), 1: not ready. */
static int progress_coll(part *p) {
    if (p->done || p->aborted) return 0;
    coll *c = p->c;
    clique *cl = p->cl;
    if (c->posted < cl->nranks) return 1;
    for (int r = 0; r < cl->nranks; r++)
        if (!c->parts[r] || c->parts[r]->aborted) return 1;
    for (int r = 0; r < cl->nranks; r++) {
        if (r == p->rank) continue;
        part *o = c->parts[r];
        int at = dt_emu_cuda_reach(o->stream, o, &c->done);
        if (c->done) return 0;   /* a run further down did it */
        if (!at) return 1;
    }
    coll_execute(c, cl);
    return 0;
}

static item *match_of(clique *cl, const item *it) {
    for (item *m = cl->pairs[(size_t)it->src * cl->nranks + it->dst]; m; m = m->next)
        if (m->send != it->send && m->seq == it->seq) return m;
    return NULL;
}

static void item_done(clique *cl, item *it) {
    it->done = 1;
    item_unlink(cl, it);
    if (++it->owner->n_done == it->owner->n_items) part_mark_done(it->owner);
}

static int progress_group(part *p) {
    if (p->done || p->aborted) return 0;
    clique *cl = p->cl;
    int pending = 0;
    for (int i = 0; i < p->n_items; i++) {
        item *it = &p->items[i];
        if (it->done) continue;
        item *m = match_of(cl, it);
        if (!m || m->owner->aborted) {
            pending = 1;
            continue;
        }
        if (m->owner != p) {
            int at = dt_emu_cuda_reach(m->owner->stream, m->owner, &it->done);
            if (it->done) continue;   /* a run further down did it */
            if (!at) {
                pending = 1;
                continue;
            }
        }
        item *s = it->send ? it : m, *d = it->send ? m : it;
        if (s->bytes != d->bytes) {
            char msg[256];
            snprintf(msg, sizeof msg, "NCCL emulator: rank %d sends %zu bytes (count %zu, type "
                     "%d) to rank %d, which receives %zu (count %zu, type %d)", s->src, s->bytes,
                     s->count, (int)s->dt, s->dst, d->bytes, d->count, (int)d->dt);
            snprintf(s->owner->err, sizeof s->owner->err, "%s", msg);
            snprintf(d->owner->err, sizeof d->owner->err, "%s", msg);
            ncclComm_t hs = cl->members[s->src], hd = cl->members[d->dst];
            if (hs && hs->error == ncclSuccess) hs->error = ncclInvalidUsage;
            if (hd && hd->error == ncclSuccess) hd->error = ncclInvalidUsage;
        } else if (s->bytes) {
            memmove(d->buf, s->buf, s->bytes);
        }
        TRACE("clique %p runs send/recv %d->%d #%lu\n", (void *)cl, s->src, s->dst, s->seq);
        item_done(cl, s);
        item_done(cl, d);
    }
    return pending && !p->done;
}

/* The run of a queued part (q_lock held). */
static int run_part(void *ctx, char *err, size_t err_size) {
    part *p = (part *)ctx;
    g_depth++;
    int rc = p->kind == K_GROUP ? progress_group(p) : progress_coll(p);
    g_depth--;
    if (rc == 0) {
        if (p->err[0] && !p->aborted) {
            snprintf(err, err_size, "%s", p->err);
            rc = -1;
        }
        part_release(p);
    }
    if (g_depth == 0) flush_dead();
    return rc;
}

/* ----------------------------------------------------------------- posting */

static ncclResult_t check_stream(ncclComm_t h, cudaStream_t s, const char *fn) {
    int dev = dt_emu_cuda_stream_device(s);
    if (!s) return nfail(ncclInvalidArgument, "%s: the NCCL emulator needs a created stream, not "
                         "the NULL stream", fn);
    if (dev < 0) return nfail(ncclInvalidArgument, "%s: stream %p is not a live CUDA stream", fn,
                              (void *)s);
    if (dev != h->device)
        return nfail(ncclInvalidArgument, "%s: the stream belongs to device %d, the communicator "
                     "(rank %d) to device %d", fn, dev, h->rank, h->device);
    return ncclSuccess;
}

static ncclResult_t check_buffer(const void *p, size_t bytes, const char *fn, const char *name) {
    if (bytes == 0 || dt_emu_cuda_device_range(p, bytes)) return ncclSuccess;
    return nfail(ncclInvalidArgument, "%s: %s [%p, +%zu bytes) is not inside one allocation CUDA "
                 "knows (cudaMalloc or pinned memory)", fn, name, p, bytes);
}

static part *part_new(ncclComm_t h, cudaStream_t s, int kind) {
    part *p = (part *)calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cl = h->cl;
    p->rank = h->rank;
    p->stream = s;
    p->kind = kind;
    return p;
}

/* Registers p with its clique and queues it (lock held). */
static ncclResult_t part_post(part *p, const char *fn) {
    clique *cl = p->cl;
    if (p->kind != K_GROUP) {
        unsigned long seq = cl->coll_seq[p->rank]++;
        coll *c = cl->colls;
        while (c && c->seq != seq) c = c->next;
        if (!c) {
            c = (coll *)calloc(1, sizeof *c);
            if (c) c->parts = (part **)calloc((size_t)cl->nranks, sizeof *c->parts);
            if (!c || !c->parts) {
                free(c);
                cl->coll_seq[p->rank]--;
                free(p);
                return nfail(ncclSystemError, "%s: out of memory", fn);
            }
            c->seq = seq;
            c->next = cl->colls;
            cl->colls = c;
        }
        c->parts[p->rank] = p;
        c->posted++;
        c->refs++;
        p->c = c;
    } else {
        size_t n = (size_t)cl->nranks;
        for (int i = 0; i < p->n_items; i++) {
            item *it = &p->items[i];
            it->owner = p;
            size_t k = (size_t)it->src * n + (size_t)it->dst;
            it->seq = it->send ? cl->send_seq[k]++ : cl->recv_seq[k]++;
            it->next = cl->pairs[k];
            cl->pairs[k] = it;
            it->linked = 1;
        }
    }
    p->next = cl->parts;
    cl->parts = p;
    cl->refs++;
    cl->live[p->rank]++;
    if (p->kind != K_GROUP)
        TRACE("clique %p rank %d/%d posts %s #%lu (count %zu) on stream %p\n", (void *)cl, p->rank,
              cl->nranks, kind_names[p->kind], p->c->seq, p->count, (void *)p->stream);
    for (int i = 0; i < p->n_items; i++)
        TRACE("clique %p rank %d/%d posts %s %d->%d #%lu (%zu bytes) on stream %p\n", (void *)cl,
              p->rank, cl->nranks, p->items[i].send ? "send" : "recv", p->items[i].src,
              p->items[i].dst, p->items[i].seq, p->items[i].bytes, (void *)p->stream);
    cudaError_t e = dt_emu_cuda_enqueue_locked(p->stream, run_part, p);
    if (e != cudaSuccess) {
        /* Posted but never queued: it completes as aborted for its peers. */
        p->aborted = 1;
        part_free(p);
        return nfail(ncclUnhandledCudaError, "%s: cannot queue on the stream: %s", fn,
                     cudaGetErrorString(e));
    }
    return ncclSuccess;
}

static ncclResult_t post_coll(int kind, const void *send, void *recv, size_t count,
                              ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream) {
    const char *fn = kind_names[kind];
    size_t es = type_size(dt);
    if (es == 0)
        return nfail(ncclInvalidArgument, "%s: datatype %d is not emulated", fn, (int)dt);
    if (kind != K_ALL_GATHER && kind != K_BROADCAST && kind != K_ALL_TO_ALL &&
        (unsigned)op >= (unsigned)ncclNumOps)
        return nfail(ncclInvalidArgument, "%s: op %d is not a built-in reduction", fn, (int)op);
    lock();
    ncclResult_t r = usable(comm, fn);
    if (r == ncclSuccess) r = check_stream(comm, stream, fn);
    int n = r == ncclSuccess ? comm->cl->nranks : 0, me = r == ncclSuccess ? comm->rank : 0;
    if (r == ncclSuccess && (kind == K_REDUCE || kind == K_BROADCAST) && (root < 0 || root >= n))
        r = nfail(ncclInvalidArgument, "%s: root %d not in [0, %d)", fn, root, n);
    if (r == ncclSuccess) {
        size_t sb = count * es, rb = count * es;
        if (kind == K_REDUCE_SCATTER || kind == K_ALL_TO_ALL) sb *= (size_t)n;
        if (kind == K_ALL_GATHER || kind == K_ALL_TO_ALL) rb *= (size_t)n;
        if (kind == K_BROADCAST && me != root) sb = 0;
        if (kind == K_REDUCE && me != root) rb = 0;
        r = check_buffer(send, sb, fn, "sendbuff");
        if (r == ncclSuccess) r = check_buffer(recv, rb, fn, "recvbuff");
    }
    if (r == ncclSuccess) {
        part *p = part_new(comm, stream, kind);
        if (!p) {
            r = nfail(ncclSystemError, "%s: out of memory", fn);
        } else {
            p->send = send;
            p->recv = recv;
            p->count = count;
            p->dt = dt;
            p->op = op;
            p->root = root;
            r = part_post(p, fn);
        }
    }
    unlock();
    return r;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    return post_coll(K_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    return post_coll(K_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    return post_coll(K_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return post_coll(K_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm,
                     stream);
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return post_coll(K_ALL_TO_ALL, sendbuff, recvbuff, count, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
    return post_coll(K_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

/* ------------------------------------------------------- send, recv, groups */

typedef struct gitem {
    ncclComm_t comm;
    cudaStream_t stream;
    int send, peer;
    void *buf;
    size_t count;
    ncclDataType_t dt;
} gitem;

static DT_TLS int tl_depth;
static DT_TLS gitem *tl_items;
static DT_TLS int tl_n, tl_cap;

/* Posts the items of one (comm, stream) as one group part (lock held). */
static ncclResult_t post_group(const gitem *g, int n) {
    const char *fn = kind_names[K_GROUP];
    ncclComm_t h = g[0].comm;
    ncclResult_t r = usable(h, fn);
    if (r == ncclSuccess) r = check_stream(h, g[0].stream, fn);
    if (r != ncclSuccess) return r;
    part *p = part_new(h, g[0].stream, K_GROUP);
    item *items = (item *)calloc((size_t)n, sizeof *items);
    if (!p || !items) {
        free(p);
        free(items);
        return nfail(ncclSystemError, "%s: out of memory", fn);
    }
    for (int i = 0; i < n; i++) {
        item *it = &items[i];
        it->send = g[i].send;
        it->src = g[i].send ? h->rank : g[i].peer;
        it->dst = g[i].send ? g[i].peer : h->rank;
        it->buf = g[i].buf;
        it->count = g[i].count;
        it->dt = g[i].dt;
        it->bytes = g[i].count * type_size(g[i].dt);
    }
    p->items = items;
    p->n_items = n;
    return part_post(p, fn);
}

static ncclResult_t p2p(int send, void *buf, size_t count, ncclDataType_t dt, int peer,
                        ncclComm_t comm, cudaStream_t stream) {
    const char *fn = send ? "ncclSend" : "ncclRecv";
    size_t es = type_size(dt);
    if (es == 0) return nfail(ncclInvalidArgument, "%s: datatype %d is not emulated", fn, (int)dt);
    lock();
    ncclResult_t r = usable(comm, fn);
    if (r == ncclSuccess) r = check_stream(comm, stream, fn);
    if (r == ncclSuccess && (peer < 0 || peer >= comm->cl->nranks))
        r = nfail(ncclInvalidArgument, "%s: peer %d not in [0, %d)", fn, peer, comm->cl->nranks);
    if (r == ncclSuccess) r = check_buffer(buf, count * es, fn, send ? "sendbuff" : "recvbuff");
    gitem g = {comm, stream, send, peer, buf, count, dt};
    if (r == ncclSuccess && tl_depth == 0) {
        r = post_group(&g, 1);
    } else if (r == ncclSuccess) {
        if (tl_n == tl_cap) {
            int cap = tl_cap ? 2 * tl_cap : 16;
            gitem *t = (gitem *)realloc(tl_items, (size_t)cap * sizeof *t);
            if (t) {
                tl_items = t;
                tl_cap = cap;
            }
        }
        if (tl_n < tl_cap) tl_items[tl_n++] = g;
        else r = nfail(ncclSystemError, "%s: out of memory", fn);
    }
    unlock();
    return r;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return p2p(1, (void *)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return p2p(0, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
    tl_depth++;
    return ncclSuccess;
}

/* The outermost end posts the group's sends and receives: one operation
 * per (communicator, stream), in the order of their first call. */
ncclResult_t ncclGroupEnd(void) {
    if (tl_depth == 0) return nfail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart");
    if (--tl_depth > 0) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    gitem *sel = tl_n ? (gitem *)malloc((size_t)tl_n * sizeof *sel) : NULL;
    if (tl_n && !sel) r = nfail(ncclSystemError, "ncclGroupEnd: out of memory");
    lock();
    for (int i = 0; sel && i < tl_n; i++) {
        if (!tl_items[i].comm) continue;
        int m = 0;
        ncclComm_t c = tl_items[i].comm;
        cudaStream_t s = tl_items[i].stream;
        for (int j = i; j < tl_n; j++)
            if (tl_items[j].comm == c && tl_items[j].stream == s) {
                sel[m++] = tl_items[j];
                tl_items[j].comm = NULL;
            }
        ncclResult_t e = post_group(sel, m);
        if (r == ncclSuccess) r = e;
    }
    unlock();
    free(sel);
    tl_n = 0;
    if (!tl_cap) return r;
    free(tl_items);
    tl_items = NULL;
    tl_cap = 0;
    return r;
}

/* --------------------------------------------------------------- teardown */

/* The rank's queued parts complete without data (lock held). */
static void abort_parts(ncclComm_t h) {
    clique *cl = h->cl;
    if (!cl) return;
    for (part *p = cl->parts; p; p = p->next)
        if (p->rank == h->rank && !p->done) {
            p->aborted = 1;
            for (int i = 0; i < p->n_items; i++) item_unlink(cl, &p->items[i]);
            part_mark_done(p);
        }
}

/* Frees a handle (lock held). */
static void handle_free(ncclComm_t h) {
    for (ncclComm_t *p = &g_comms; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            break;
        }
    if (h->split)   /* a child still waiting for its split */
        for (int i = 0; i < h->split->n; i++)
            if (h->split->child[i] == h) h->split->child[i] = NULL;
    clique *cl = h->cl;
    if (cl) {
        for (split_rec *r = cl->splits; r; r = r->next)
            if (r->parent[h->rank] == h) r->parent[h->rank] = NULL;
        if (cl->members[h->rank] == h) cl->members[h->rank] = NULL;
    }
    h->magic = 0;
    free(h);
    clique_unref(cl);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    lock();
    int ok = valid(comm);
    if (ok) {
        abort_parts(comm);
        handle_free(comm);
    }
    unlock();
    return ok ? ncclSuccess : nfail(ncclInvalidArgument, "ncclCommAbort: not a live communicator");
}

/* Without a finalize NCCL's destroy finalizes (a collective wait); here it
 * drops the rank's unfinished operations, as an abort does. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    return ncclCommAbort(comm) == ncclSuccess
               ? ncclSuccess
               : nfail(ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    const char *fn = "ncclCommFinalize";
    lock();
    ncclResult_t r = usable(comm, fn);
    if (r == ncclSuccess && comm->finalizing)
        r = nfail(ncclInvalidUsage, "%s: called twice", fn);
    if (r == ncclSuccess) {
        comm->finalizing = 1;
        comm->cl->finalized++;
        if (comm->blocking) r = settle(comm, fn);
        else r = state_of(comm);
    }
    unlock();
    return r;
}
