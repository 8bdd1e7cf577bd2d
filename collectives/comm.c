/* collectives/comm.c — the public communicator API: argument checks that do
 * not depend on the transport, then dispatch through the transport table.
 * Arguments are checked before anything is posted, so a rejected call has
 * touched no buffer and left the communicator as it was. */
#include "transport.h"
#include "../base/trace.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *dt_reduce_op_name(dt_reduce_op op) {
    switch (op) {
    case DT_REDUCE_SUM: return "sum";
    case DT_REDUCE_MAX: return "max";
    default: return "unknown";
    }
}

const char *dt_p2p_kind_name(dt_p2p_kind kind) {
    switch (kind) {
    case DT_P2P_SEND: return "send";
    case DT_P2P_RECV: return "recv";
    default: return "unknown";
    }
}

const char *dt_coll_kind_name(dt_coll_kind kind) {
    static const char *const names[DT_COLL_KIND_COUNT] = {
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
        "broadcast",  "scatter",    "gather",         "barrier",    "split",
    };
    if ((int)kind < 0 || kind >= DT_COLL_KIND_COUNT) return "unknown";
    return names[kind];
}

const char *dt_comm_kind_name(dt_comm_kind kind) {
    static const char *const names[DT_COMM_KIND_COUNT] = {
        "p2p",        "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
        "broadcast",  "scatter",    "gather",     "barrier",
    };
    if ((int)kind < 0 || kind >= DT_COMM_KIND_COUNT) return "unknown";
    return names[kind];
}

int dt_comm_rank(const dt_comm *comm) { return comm ? comm->rank : -1; }
int dt_comm_size(const dt_comm *comm) { return comm ? comm->size : 0; }
int dt_comm_world_rank(const dt_comm *comm) { return comm ? comm->world_rank : -1; }
long dt_comm_timeout_ms(const dt_comm *comm) { return comm ? comm->timeout_ms : 0; }

/* "rank R: op: <message>" */
static dt_status comm_error(const dt_comm *comm, dt_status st, const char *op, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static dt_status comm_error(const dt_comm *comm, dt_status st, const char *op, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (comm) return dt_error(st, "rank %d: %s: %s", comm->world_rank, op, msg);
    return dt_error(st, "%s: %s", op, msg);
}

/* Checks shared by every collective; `total` is the number of elements the
 * largest buffer holds (count, or size*count). */
static dt_status check_buffer(const dt_comm *comm, const char *op, const char *name,
                              const void *buf, size_t count, dt_dtype dtype, size_t factor) {
    size_t es = dt_dtype_size(dtype);
    if (!dt_dtype_valid(dtype))
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, op, "unknown dtype %d", (int)dtype);
    if (count > SIZE_MAX / es / factor)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, op,
                          "%zu x %zu elements of %s overflow the address space", factor, count,
                          dt_dtype_name(dtype));
    if (count > 0 && buf == NULL)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, op, "%s buffer is NULL for %zu elements",
                          name, count * factor);
    return DT_SUCCESS;
}

static dt_status check_comm(const dt_comm *comm, const char *op) {
    if (!comm) return comm_error(NULL, DT_ERR_INVALID_ARGUMENT, op, "comm is NULL");
    if (comm->p2p_pending)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, op,
                          "a send/recv group is still outstanding: call dt_comm_p2p_wait first");
    return DT_SUCCESS;
}

static dt_status check_root(const dt_comm *comm, const char *op, int root) {
    if (root < 0 || root >= comm->size)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, op, "root %d is out of range [0, %d)",
                          root, comm->size);
    return DT_SUCCESS;
}

static dt_status check_op(const dt_comm *comm, const char *op, dt_reduce_op rop) {
    if ((int)rop < 0 || rop >= DT_REDUCE_OP_COUNT)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, op, "unknown reduce op %d", (int)rop);
    return DT_SUCCESS;
}

/* Renders one rank's row of an agreement table for a message. */
typedef void (*row_format)(const int64_t *row, char *buf, size_t size);

static dt_status agree(dt_comm *comm, const char *op, const int64_t *values,
                       const char *const *names, int n, row_format fmt, int status_col);

static void format_call(const int64_t *v, char *buf, size_t size) {
    dt_coll_kind kind = (dt_coll_kind)v[0];
    int n = snprintf(buf, size, "%s", dt_coll_kind_name(kind));
    if (n >= 0 && (size_t)n < size && v[1])
        n += snprintf(buf + n, size - (size_t)n, " of %" PRId64 " %s", v[1],
                      dt_dtype_name((dt_dtype)v[2]));
    if (n >= 0 && (size_t)n < size && (kind == DT_COLL_ALL_REDUCE || kind == DT_COLL_REDUCE_SCATTER))
        n += snprintf(buf + n, size - (size_t)n, " (%s)", dt_reduce_op_name((dt_reduce_op)v[3]));
    if (n >= 0 && (size_t)n < size &&
        (kind == DT_COLL_BROADCAST || kind == DT_COLL_SCATTER || kind == DT_COLL_GATHER))
        n += snprintf(buf + n, size - (size_t)n, " from root %" PRId64, v[4]);
    if (n >= 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, " as call #%" PRId64, v[5]);
}

/* DT_CHECK: a float buffer of n values holds no NaN or Inf, else
 * DT_ERR_NONFINITE naming the call, the buffer and the first index. */
static dt_status check_finite(dt_comm *comm, const char *op, const char *what, const void *buf,
                              size_t n, dt_dtype dtype) {
    if (!n || !buf || !comm->mem.ops->find_nonfinite) return DT_SUCCESS;
    int64_t first = -1;
    DT_TRY(comm->mem.ops->find_nonfinite(comm->mem.arg, buf, n, dtype, &first));
    if (first < 0) return DT_SUCCESS;
    return comm_error(comm, DT_ERR_NONFINITE, op, "the %s buffer holds a NaN or Inf at index %"
                      PRId64 " of %zu %s (DT_CHECK)", what, first, n, dt_dtype_name(dtype));
}

/* The elements this rank's send (or recv) buffer of a collective holds. */
static size_t coll_elems(const dt_comm *comm, const dt_coll_args *a, int recv) {
    const size_t all = (size_t)comm->size * a->count;
    const int root = comm->rank == a->root;
    switch (a->kind) {
    case DT_COLL_ALL_REDUCE: return a->count;
    case DT_COLL_ALL_GATHER: return recv ? all : a->count;
    case DT_COLL_REDUCE_SCATTER: return recv ? a->count : all;
    case DT_COLL_ALL_TO_ALL: return all;
    case DT_COLL_BROADCAST: return recv || root ? a->count : 0;
    case DT_COLL_SCATTER: return recv ? a->count : root ? all : 0;
    case DT_COLL_GATHER: return recv ? (root ? all : 0) : a->count;
    default: return 0;
    }
}

/* Adds a call that succeeded to comm's counters, with the bytes comm.h
 * defines for its kind. */
static void count_call(dt_comm *comm, const dt_coll_args *a) {
    const uint64_t P = (uint64_t)comm->size, es = dt_dtype_size(a->dtype);
    const uint64_t n = (uint64_t)a->count * es, others = P - 1;
    const int root = comm->rank == a->root;
    uint64_t sent = 0, recv = 0;
    dt_comm_kind k;
    switch (a->kind) {
    case DT_COLL_ALL_REDUCE:
        k = DT_COMM_ALL_REDUCE;
        sent = recv = 2 * others * (((uint64_t)a->count + P - 1) / P) * es;
        break;
    case DT_COLL_ALL_GATHER: k = DT_COMM_ALL_GATHER; sent = recv = others * n; break;
    case DT_COLL_REDUCE_SCATTER: k = DT_COMM_REDUCE_SCATTER; sent = recv = others * n; break;
    case DT_COLL_ALL_TO_ALL: k = DT_COMM_ALL_TO_ALL; sent = recv = others * n; break;
    case DT_COLL_BROADCAST:
        k = DT_COMM_BROADCAST;
        sent = root ? others * n : 0;
        recv = root ? 0 : n;
        break;
    case DT_COLL_SCATTER:
        k = DT_COMM_SCATTER;
        sent = root ? others * n : 0;
        recv = root ? 0 : n;
        break;
    case DT_COLL_GATHER:
        k = DT_COMM_GATHER;
        sent = root ? 0 : n;
        recv = root ? others * n : 0;
        break;
    case DT_COLL_BARRIER: k = DT_COMM_BARRIER; break;
    default: return;
    }
    comm->counters.calls[k]++;
    comm->counters.bytes_sent[k] += sent;
    comm->counters.bytes_recv[k] += recv;
}

/* With checks on (DT_CHECK=1), every rank first shows the others what it is
 * about to call and whether its send buffer is finite: a disagreement or a
 * NaN or Inf fails all of them with a message (agree), where the transport
 * might hang (NCCL) or mix up data; after the call they show the same of
 * their receive buffers (an overflowing sum, a peer's value). Float dtypes
 * only; the ring's sends are not checked. */
static dt_status run(dt_comm *comm, dt_coll_args *a) {
    const int finite_check = comm->check && !a->host_only && dt_dtype_is_float(a->dtype);
    const char *name = dt_coll_kind_name(a->kind);
    if (comm->check) {
        const dt_status sent = finite_check ? check_finite(comm, name, "send", a->send,
                                                           coll_elems(comm, a, 0), a->dtype)
                                            : DT_SUCCESS;
        static const char *const names[] = {"collective", "count", "dtype", "op", "root",
                                            "call number", "send buffer check"};
        int64_t v[7] = {a->kind, (int64_t)a->count, a->dtype,
                        a->kind == DT_COLL_ALL_REDUCE || a->kind == DT_COLL_REDUCE_SCATTER ? a->op : 0,
                        a->kind == DT_COLL_BROADCAST || a->kind == DT_COLL_SCATTER ||
                                a->kind == DT_COLL_GATHER ? a->root : 0,
                        (int64_t)comm->calls, sent};
        if (a->kind == DT_COLL_BARRIER || a->kind == DT_COLL_SPLIT) v[1] = v[2] = 0;
        DT_TRY(agree(comm, name, v, names, 7, format_call, 6));
    }
    comm->calls++;
    DT_TRACE_PUSH(name);
    dt_status st = comm->ops->collective(comm, a, NULL);
    DT_TRACE_POP();
    if (st == DT_SUCCESS && finite_check) {
        static const char *const names[] = {"receive buffer check"};
        const int64_t v[1] = {check_finite(comm, name, "recv", a->recv, coll_elems(comm, a, 1),
                                           a->dtype)};
        st = agree(comm, name, v, names, 1, NULL, 0);
    }
    if (st == DT_SUCCESS) count_call(comm, a);
    return st;
}

dt_status dt_comm_all_reduce(dt_comm *comm, const void *send, void *recv, size_t count,
                             dt_dtype dtype, dt_reduce_op op) {
    const char *name = "all_reduce";
    DT_TRY(check_comm(comm, name));
    DT_TRY(check_op(comm, name, op));
    DT_TRY(check_buffer(comm, name, "send", send, count, dtype, 1));
    DT_TRY(check_buffer(comm, name, "recv", recv, count, dtype, 1));
    dt_coll_args a = {.kind = DT_COLL_ALL_REDUCE, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .op = op};
    return run(comm, &a);
}

dt_status dt_comm_all_gather(dt_comm *comm, const void *send, void *recv, size_t count,
                             dt_dtype dtype) {
    const char *name = "all_gather";
    DT_TRY(check_comm(comm, name));
    DT_TRY(check_buffer(comm, name, "send", send, count, dtype, 1));
    DT_TRY(check_buffer(comm, name, "recv", recv, count, dtype, (size_t)comm->size));
    dt_coll_args a = {.kind = DT_COLL_ALL_GATHER, .send = send, .recv = recv, .count = count,
                      .dtype = dtype};
    return run(comm, &a);
}

dt_status dt_comm_reduce_scatter(dt_comm *comm, const void *send, void *recv, size_t count,
                                 dt_dtype dtype, dt_reduce_op op) {
    const char *name = "reduce_scatter";
    DT_TRY(check_comm(comm, name));
    DT_TRY(check_op(comm, name, op));
    DT_TRY(check_buffer(comm, name, "send", send, count, dtype, (size_t)comm->size));
    DT_TRY(check_buffer(comm, name, "recv", recv, count, dtype, 1));
    dt_coll_args a = {.kind = DT_COLL_REDUCE_SCATTER, .send = send, .recv = recv,
                      .count = count, .dtype = dtype, .op = op};
    return run(comm, &a);
}

dt_status dt_comm_all_to_all(dt_comm *comm, const void *send, void *recv, size_t count,
                             dt_dtype dtype) {
    const char *name = "all_to_all";
    DT_TRY(check_comm(comm, name));
    DT_TRY(check_buffer(comm, name, "send", send, count, dtype, (size_t)comm->size));
    DT_TRY(check_buffer(comm, name, "recv", recv, count, dtype, (size_t)comm->size));
    /* Every rank reads its peers' blocks of send while they write recv:
     * in place would need a copy of send, which the caller can make. */
    const size_t bytes = (size_t)comm->size * count * dt_dtype_size(dtype);
    const uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    if (bytes && s < r + bytes && r < s + bytes)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, name, "send %p and recv %p overlap (%zu "
                          "bytes each): all_to_all is not in place", send, (void *)recv, bytes);
    dt_coll_args a = {.kind = DT_COLL_ALL_TO_ALL, .send = send, .recv = recv, .count = count,
                      .dtype = dtype};
    return run(comm, &a);
}

dt_status dt_comm_broadcast(dt_comm *comm, void *buf, size_t count, dt_dtype dtype, int root) {
    const char *name = "broadcast";
    DT_TRY(check_comm(comm, name));
    DT_TRY(check_root(comm, name, root));
    DT_TRY(check_buffer(comm, name, "buf", buf, count, dtype, 1));
    dt_coll_args a = {.kind = DT_COLL_BROADCAST, .send = buf, .recv = buf, .count = count,
                      .dtype = dtype, .root = root};
    return run(comm, &a);
}

dt_status dt_comm_scatter(dt_comm *comm, const void *send, void *recv, size_t count,
                          dt_dtype dtype, int root) {
    const char *name = "scatter";
    DT_TRY(check_comm(comm, name));
    DT_TRY(check_root(comm, name, root));
    DT_TRY(check_buffer(comm, name, "send", comm->rank == root ? send : recv, count, dtype,
                        (size_t)comm->size));
    DT_TRY(check_buffer(comm, name, "recv", recv, count, dtype, 1));
    dt_coll_args a = {.kind = DT_COLL_SCATTER, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .root = root};
    return run(comm, &a);
}

dt_status dt_comm_gather(dt_comm *comm, const void *send, void *recv, size_t count,
                         dt_dtype dtype, int root) {
    const char *name = "gather";
    DT_TRY(check_comm(comm, name));
    DT_TRY(check_root(comm, name, root));
    DT_TRY(check_buffer(comm, name, "send", send, count, dtype, 1));
    DT_TRY(check_buffer(comm, name, "recv", comm->rank == root ? recv : send, count, dtype,
                        (size_t)comm->size));
    dt_coll_args a = {.kind = DT_COLL_GATHER, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .root = root};
    return run(comm, &a);
}

dt_status dt_comm_barrier(dt_comm *comm) {
    DT_TRY(check_comm(comm, "barrier"));
    dt_coll_args a = {.kind = DT_COLL_BARRIER};
    return run(comm, &a);
}

dt_status dt_comm_split(dt_comm *comm, int color, int key, dt_comm **out) {
    const char *name = "split";
    if (!out) return comm_error(comm, DT_ERR_INVALID_ARGUMENT, name, "out is NULL");
    DT_TRY(check_comm(comm, name));
    dt_coll_args a = {.kind = DT_COLL_SPLIT, .color = color, .key = key};
    comm->calls++;
    dt_comm *c = NULL;
    dt_status st = comm->ops->collective(comm, &a, &c);
    if (st == DT_SUCCESS) *out = c;
    return st;
}

void dt_comm_destroy(dt_comm *comm) {
    if (comm) comm->ops->destroy(comm);
}

static dt_status p2p_start(dt_comm *comm, const dt_p2p_op *ops, int n_ops, int chained) {
    const char *name = chained ? "p2p_start_chained" : "p2p_start";
    DT_TRY(check_comm(comm, name));
    if (n_ops < 0 || (n_ops > 0 && !ops))
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, name, "%d operations at %p", n_ops,
                          (const void *)ops);
    for (int i = 0; i < n_ops; i++) {
        const dt_p2p_op *o = &ops[i];
        if (o->kind != DT_P2P_SEND && o->kind != DT_P2P_RECV)
            return comm_error(comm, DT_ERR_INVALID_ARGUMENT, name,
                              "operation %d has unknown kind %d", i, (int)o->kind);
        if (o->peer < 0 || o->peer >= comm->size)
            return comm_error(comm, DT_ERR_INVALID_ARGUMENT, name,
                              "operation %d: peer %d is out of range [0, %d)", i, o->peer,
                              comm->size);
        DT_TRY(check_buffer(comm, name, o->kind == DT_P2P_SEND ? "send" : "recv", o->buf,
                            o->count, o->dtype, 1));
    }
    DT_TRACE_PUSH("p2p_start");
    dt_status st = comm->ops->p2p_start(comm, ops, n_ops, chained);
    DT_TRACE_POP();
    DT_TRY(st);
    /* Counted when the group completes (dt_comm_p2p_wait). */
    uint64_t sent = 0, recv = 0;
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].peer == comm->rank) continue;   /* moves nothing between ranks */
        const uint64_t b = (uint64_t)ops[i].count * dt_dtype_size(ops[i].dtype);
        if (ops[i].kind == DT_P2P_SEND) sent += b;
        else recv += b;
    }
    comm->p2p_sent = sent;
    comm->p2p_recv = recv;
    comm->p2p_pending = 1;
    return DT_SUCCESS;
}

dt_status dt_comm_p2p_start(dt_comm *comm, const dt_p2p_op *ops, int n_ops) {
    return p2p_start(comm, ops, n_ops, 0);
}

dt_status dt_comm_p2p_start_chained(dt_comm *comm, const dt_p2p_op *ops, int n_ops) {
    return p2p_start(comm, ops, n_ops, 1);
}

dt_status dt_comm_p2p_wait(dt_comm *comm) {
    if (!comm) return comm_error(NULL, DT_ERR_INVALID_ARGUMENT, "p2p_wait", "comm is NULL");
    if (!comm->p2p_pending)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, "p2p_wait",
                          "no send/recv group was started");
    comm->p2p_pending = 0;
    DT_TRACE_PUSH("p2p_wait");
    dt_status st = comm->ops->p2p_wait(comm);
    DT_TRACE_POP();
    if (st == DT_SUCCESS) {
        comm->counters.calls[DT_COMM_P2P]++;
        comm->counters.bytes_sent[DT_COMM_P2P] += comm->p2p_sent;
        comm->counters.bytes_recv[DT_COMM_P2P] += comm->p2p_recv;
    }
    return st;
}

dt_status dt_comm_counters_get(const dt_comm *comm, dt_comm_counters *out) {
    if (!comm || !out)
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, "counters_get", "%s is NULL",
                          comm ? "out" : "comm");
    *out = comm->counters;
    return DT_SUCCESS;
}

void dt_comm_counters_reset(dt_comm *comm) {
    if (comm) memset(&comm->counters, 0, sizeof comm->counters);
}

dt_status dt_comm_sendrecv(dt_comm *comm, const dt_p2p_op *ops, int n_ops) {
    DT_TRY(dt_comm_p2p_start(comm, ops, n_ops));
    return dt_comm_p2p_wait(comm);
}

void dt_comm_abort(dt_comm *comm, dt_status status, const char *reason) {
    /* An abort is a failure whatever status it gives: the transports
     * return it from the aborting rank's calls, and dt_launch reports it. */
    if (status <= DT_SUCCESS || status >= DT_STATUS_COUNT) status = DT_ERR_PEER_FAILED;
    if (comm) comm->ops->abort(comm, status, reason ? reason : "aborted by the application");
}

int dt_comm_aborted(const dt_comm *comm) { return comm ? comm->ops->aborted(comm) : 0; }

dt_status dt_comm_check_agreement(dt_comm *comm, const char *op, const int64_t *values,
                                  const char *const *names, int n) {
    const char *name = op ? op : "check_agreement";
    DT_TRY(check_comm(comm, name));
    if (n < 0 || (n > 0 && (!values || !names)))
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, name, "%d values at %p", n,
                          (const void *)values);
    return agree(comm, name, values, names, n, NULL, -1);
}

dt_status dt_comm_check_call(dt_comm *comm, const char *op, dt_status local,
                             const int64_t *values, const char *const *names, int n) {
    const char *name = op ? op : "check_call";
    DT_TRY(check_comm(comm, name));
    if (n < 0 || n + 1 > DT_COMM_CHECK_MAX || (n > 0 && (!values || !names)))
        return comm_error(comm, DT_ERR_INVALID_ARGUMENT, name, "%d values at %p", n,
                          (const void *)values);
    int64_t v[DT_COMM_CHECK_MAX];
    const char *nm[DT_COMM_CHECK_MAX];
    v[0] = local;
    nm[0] = "own checks";
    for (int i = 0; i < n; i++) {
        /* a rank whose own checks failed may not know its values */
        v[i + 1] = local == DT_SUCCESS ? values[i] : 0;
        nm[i + 1] = names[i];
    }
    return agree(comm, name, v, nm, n + 1, NULL, 0);
}

/* The exchange itself goes straight to the transport: it must not be checked
 * in turn.
 *
 * Column status_col (-1: none) holds each rank's own verdict before the
 * call, a dt_status, with dt_last_error() its message. If any rank's is not
 * DT_SUCCESS, every rank fails: a failing rank with its own status and
 * message, the others with the first failing rank's message and its status
 * where that is a finding about the shared data (DT_ERR_NONFINITE,
 * DT_ERR_OUT_OF_RANGE), else DT_ERR_MISMATCH; the messages take a second
 * all_gather, on that path only. Otherwise the values are compared. */
#define VERDICT_MSG 512
static dt_status verdict(dt_comm *comm, const char *op, const int64_t *all, int n, int status_col) {
    int first = -1;
    for (int r = 0; first < 0 && r < comm->size; r++)
        if (all[(size_t)r * (size_t)n + (size_t)status_col] != DT_SUCCESS) first = r;
    if (first < 0) return DT_SUCCESS;
    const dt_status mine = (dt_status)all[(size_t)comm->rank * (size_t)n + (size_t)status_col];
    char *msgs = malloc((size_t)comm->size * VERDICT_MSG), own[VERDICT_MSG] = "";
    if (mine != DT_SUCCESS) snprintf(own, sizeof own, "%s", dt_last_error());
    dt_status st = msgs ? DT_SUCCESS : comm_error(comm, DT_ERR_OUT_OF_MEMORY, op, "out of memory");
    if (st == DT_SUCCESS) {
        dt_coll_args a = {.kind = DT_COLL_ALL_GATHER, .send = own, .recv = msgs,
                          .count = VERDICT_MSG, .dtype = DT_U8, .host_only = 1};
        st = comm->ops->collective(comm, &a, NULL);
    }
    if (mine != DT_SUCCESS) {
        dt_error(mine, "%s", own);
    } else if (st == DT_SUCCESS) {
        const dt_status theirs = (dt_status)all[(size_t)first * (size_t)n + (size_t)status_col];
        char *m = msgs + (size_t)first * VERDICT_MSG;
        m[VERDICT_MSG - 1] = '\0';
        st = comm_error(comm, theirs == DT_ERR_NONFINITE || theirs == DT_ERR_OUT_OF_RANGE
                                  ? theirs : DT_ERR_MISMATCH,
                        op, "comm rank %d failed its own checks: %s", first, m);
    }
    free(msgs);
    return mine != DT_SUCCESS ? mine : st;
}

static dt_status agree(dt_comm *comm, const char *op, const int64_t *values,
                       const char *const *names, int n, row_format fmt, int status_col) {
    size_t row_bytes = (size_t)n * sizeof(int64_t);
    int64_t *all = malloc(row_bytes * (size_t)comm->size + 1);
    if (!all) return comm_error(comm, DT_ERR_OUT_OF_MEMORY, op, "out of memory");
    char own[VERDICT_MSG];   /* this rank's failure, kept across the exchange */
    if (status_col >= 0 && values[status_col] != DT_SUCCESS)
        snprintf(own, sizeof own, "%s", dt_last_error());
    dt_coll_args a = {.kind = DT_COLL_ALL_GATHER, .send = values, .recv = all,
                      .count = row_bytes, .dtype = DT_U8, .host_only = 1};
    dt_status st = comm->ops->collective(comm, &a, NULL);
    if (status_col >= 0 && values[status_col] != DT_SUCCESS) {
        if (st != DT_SUCCESS) {   /* the exchange failed: this rank's own error stands */
            free(all);
            return dt_error((dt_status)values[status_col], "%s", own);
        }
        dt_error((dt_status)values[status_col], "%s", own);
    }
    /* Every rank sees the same table, so every rank reaches the same verdict. */
    if (st == DT_SUCCESS && status_col >= 0) st = verdict(comm, op, all, n, status_col);
    for (int r = 1; st == DT_SUCCESS && r < comm->size; r++)
        for (int i = 0; i < n; i++) {
            const int64_t *row = all + (size_t)r * (size_t)n;
            if (row[i] == all[i]) continue;
            if (fmt) {
                char theirs[160], ref[160];
                fmt(row, theirs, sizeof theirs);
                fmt(all, ref, sizeof ref);
                st = comm_error(comm, DT_ERR_MISMATCH, op, "ranks disagree on %s: comm rank %d "
                                "calls %s but comm rank 0 calls %s", names[i], r, theirs, ref);
            } else {
                st = comm_error(comm, DT_ERR_MISMATCH, op,
                                "ranks disagree: comm rank %d has %s = %" PRId64
                                " but comm rank 0 has %" PRId64, r, names[i], row[i], all[i]);
            }
            break;
        }
    free(all);
    return st;
}
