/* collectives/transport_local.c — the in-process transport: ranks are
 * threads of one process and share a "world".
 *
 * Algorithm. One mutex and condition variable per world guard all shared
 * state; data is copied outside the lock. A communicator is a "group" with one
 * slot per member.
 *
 * Collectives are rendezvous. A rank entering its k-th collective publishes its
 * arguments (coll_seq = k) and waits until every member has ("arrival"); checks
 * that all agree on kind, count, dtype, op, root (else DT_ERR_MISMATCH on every
 * member); reads its peers' buffers (pull: each rank writes only its outputs);
 * then marks k done and waits until every member has ("departure"), since peers
 * may still read its send buffer. Reductions go to a per-rank scratch copied
 * out after departure (in place is safe), summed in rank order (same bits).
 *
 * Point-to-point: dt_comm_p2p_start publishes the op array, numbering sends and
 * receives per pair; in dt_comm_p2p_wait a receiver finds the matching send in
 * the peer's array, checks count and dtype, copies (unless skip_copies), marks
 * it consumed; a sender returns once all its sends are consumed.
 *
 * Invariants: a rank is at most one collective ahead of a peer on a group; a
 * published p2p array stays valid until its sends are consumed; every wait has
 * a deadline (departure its own), and a timeout aborts the world, which wakes
 * every waiter.
 *
 * Memory goes through the rank's dt_mem hooks (host memcpy, or device copies
 * for CUDA ranks sharing GPUs). A collective first publishes (unless
 * host_only); a p2p group only marks, and each copy starts after the marks of
 * both ends, so a ring step's copy overlaps the next kernel. Hooks are
 * synchronous, so the algorithm is the same on host and device.
 *
 * Test: tests/test_collectives.c, tests/test_ring.c.
 */
#include "transport_local.h"
#include "failure.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct dt_local_group dt_local_group;

typedef struct local_slot {
    /* collectives */
    unsigned long coll_seq;     /* collectives entered */
    unsigned long coll_done;    /* collectives whose reads are finished */
    dt_coll_args args;          /* of collective coll_seq */
    dt_local_group *split_group;/* result of the current split for this member */
    int split_rank;
    void *scratch;              /* reduction results, private to the member */
    size_t scratch_bytes;
    const dt_mem_ops *scratch_ops; /* the member's memory the scratch came from */
    /* point-to-point */
    const dt_p2p_op *p2p_ops;   /* published group, NULL when none */
    int p2p_n, p2p_cap;
    uint64_t *op_seq;           /* per published op: its number within its pair */
    unsigned char *op_consumed; /* per published send: consumed by the receiver */
    int sends_outstanding;
    int readers;                /* receivers copying from this member's buffers now */
    const void *p2p_ready;      /* mark token: the member's work before its group */
    uint64_t *sent;             /* [size] sends posted to each peer */
    uint64_t *received;         /* [size] receives posted from each peer */
    /* what the member is blocked in, for timeout messages */
    const char *state;
} local_slot;

struct dt_local_group {
    dt_local_world *world;
    int size;
    int *world_ranks;
    local_slot *slots;
    int refs;
    unsigned long split_seq;    /* coll_seq of the last split whose groups exist */
    dt_local_group *next;
};

struct dt_local_world {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size;
    dt_comm_config cfg;
    dt_failure failure;           /* the first failure: the world is aborted once set */
    dt_local_group *groups;       /* every live group, the world group included */
    dt_local_group *world_group;  /* holds a reference of the world's own */
};

static const dt_transport_ops local_ops;

/* ---------------------------------------------------------- host memory */

static dt_status host_alloc(void *arg, size_t bytes, void **out) {
    (void)arg;
    /* calloc(0) may return NULL; one byte keeps every pointer valid and unique. */
    void *p = calloc(bytes > 0 ? bytes : 1, 1);
    if (!p) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory for %zu bytes", bytes);
    *out = p;
    return DT_SUCCESS;
}

static void host_free(void *arg, void *p) {
    (void)arg;
    free(p);
}

static dt_status host_copy(void *arg, void *dst, const void *src, size_t bytes,
                           const void *dst_ready, const void *src_ready) {
    (void)arg;
    (void)dst_ready;
    (void)src_ready;
    if (bytes) memcpy(dst, src, bytes);
    return DT_SUCCESS;
}

static dt_status host_publish(void *arg) {
    (void)arg;
    return DT_SUCCESS;
}

static dt_status host_mark(void *arg, int chained, const void **ready) {
    (void)arg;
    (void)chained;
    *ready = NULL;
    return DT_SUCCESS;
}

static void reduce_f32(float *acc, const float *x, size_t n, dt_reduce_op op) {
    if (op == DT_REDUCE_SUM) {
        for (size_t i = 0; i < n; i++) acc[i] += x[i];
    } else {
        for (size_t i = 0; i < n; i++)
            if (x[i] > acc[i] || isnan(x[i])) acc[i] = x[i];
    }
}

static dt_status host_reduce(void *arg, float *acc, const void *src, size_t n, dt_dtype dtype,
                             dt_reduce_op op, int first) {
    (void)arg;
    if (n == 0) return DT_SUCCESS; /* an empty tensor's buffers may be NULL */
    if (dtype == DT_F32) {
        if (first) memcpy(acc, src, n * sizeof(float));
        else reduce_f32(acc, (const float *)src, n, op);
    } else {
        const uint16_t *h = (const uint16_t *)src;
        for (size_t i = 0; i < n; i++) {
            float x = dtype == DT_BF16 ? dt_bf16_to_f32(h[i]) : dt_f16_to_f32(h[i]);
            if (first) acc[i] = x;
            else if (op == DT_REDUCE_SUM) acc[i] += x;
            else if (x > acc[i] || isnan(x)) acc[i] = x;
        }
    }
    return DT_SUCCESS;
}

static dt_status host_finish(void *arg, void *acc, size_t n, dt_dtype dtype) {
    (void)arg;
    if (dtype == DT_BF16 || dtype == DT_F16) {
        /* In place, ascending: element i's 2 bytes never pass element i's 4. */
        const float *f = acc;
        uint16_t *out = acc;
        for (size_t i = 0; i < n; i++)
            out[i] = dtype == DT_BF16 ? dt_f32_to_bf16(f[i]) : dt_f32_to_f16(f[i]);
    }
    return DT_SUCCESS;
}

static dt_status host_find_nonfinite(void *arg, const void *x, size_t n, dt_dtype dtype,
                                     int64_t *first) {
    (void)arg;
    *first = -1;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dt_value_get(x, dtype, i))) {
            *first = (int64_t)i;
            break;
        }
    return DT_SUCCESS;
}

static const dt_mem_ops host_mem_ops = {
    .name = "host",
    .find_nonfinite = host_find_nonfinite,
    .alloc = host_alloc,
    .free = host_free,
    .copy = host_copy,
    .publish = host_publish,
    .mark = host_mark,
    .reduce = host_reduce,
    .finish = host_finish,
};

const dt_mem dt_mem_host = {&host_mem_ops, NULL};

/* ---------------------------------------------------------------- groups */

static void group_free(dt_local_group *g) {
    if (!g) return;
    if (g->slots) {
        for (int m = 0; m < g->size; m++) {
            local_slot *s = &g->slots[m];
            /* Normally freed by its member (local_destroy); device memory
             * left here belongs to a backend that may be gone. */
            if (s->scratch_ops == &host_mem_ops) free(s->scratch);
            free(s->op_seq);
            free(s->op_consumed);
            free(s->sent);
            free(s->received);
        }
    }
    free(g->slots);
    free(g->world_ranks);
    free(g);
}

/* Allocates a group of `size` members and links it into the world.
 * Caller holds the world lock (or is the only thread). */
static dt_local_group *group_new(dt_local_world *w, int size, const int *world_ranks) {
    dt_local_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->world = w;
    g->size = size;
    g->world_ranks = malloc((size_t)size * sizeof *g->world_ranks);
    g->slots = calloc((size_t)size, sizeof *g->slots);
    if (!g->world_ranks || !g->slots) goto fail;
    for (int m = 0; m < size; m++) {
        g->world_ranks[m] = world_ranks[m];
        g->slots[m].sent = calloc((size_t)size, sizeof(uint64_t));
        g->slots[m].received = calloc((size_t)size, sizeof(uint64_t));
        if (!g->slots[m].sent || !g->slots[m].received) goto fail;
    }
    g->next = w->groups;
    w->groups = g;
    return g;
fail:
    group_free(g);
    return NULL;
}

static void group_unlink(dt_local_world *w, dt_local_group *g) {
    for (dt_local_group **p = &w->groups; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            return;
        }
    }
}

static dt_status comm_new(dt_local_group *g, int rank, const dt_mem *mem, dt_comm **out) {
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: out of memory for a communicator",
                            g->world_ranks[rank]);
    c->ops = &local_ops;
    c->impl = g;
    c->rank = rank;
    c->size = g->size;
    c->world_rank = g->world_ranks[rank];
    c->timeout_ms = g->world->cfg.timeout_ms;
    c->log_level = g->world->cfg.log_level;
    c->check = g->world->cfg.check;
    c->mem = *mem;
    *out = c;
    return DT_SUCCESS;
}

/* ----------------------------------------------------------------- world */

dt_status dt_local_world_create(int size, const dt_comm_config *cfg, dt_local_world **out) {
    if (!out || !cfg) return dt_error(DT_ERR_INVALID_ARGUMENT, "local world: out or cfg is NULL");
    *out = NULL;
    if (size < 1) return dt_error(DT_ERR_INVALID_ARGUMENT, "local world: size %d < 1", size);
    if (cfg->timeout_ms <= 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "local world: timeout %ld ms <= 0",
                        cfg->timeout_ms);
    dt_local_world *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_OUT_OF_MEMORY, "local world: out of memory");
    w->size = size;
    w->cfg = *cfg;
    static int warned;   /* once a process */
    if (cfg->skip_copies && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        dt_log_write(cfg->log_level, -1, DT_LOG_WARN, "DT_LOCAL_COPIES=0: the local transport's "
                     "sends and receives move no data (a benchmark's mode: results that depend "
                     "on them are wrong)");
    pthread_condattr_t ca;
    int ok_mu = pthread_mutex_init(&w->mu, NULL) == 0;
    int ok_cv = pthread_condattr_init(&ca) == 0 &&
                pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
                pthread_cond_init(&w->cv, &ca) == 0;
    if (!ok_mu || !ok_cv) {
        if (ok_mu) pthread_mutex_destroy(&w->mu);
        free(w);
        return dt_error(DT_ERR_SYSTEM, "local world: cannot create a mutex or condition variable");
    }
    int *ranks = malloc((size_t)size * sizeof *ranks);
    if (!ranks) goto oom;
    for (int r = 0; r < size; r++) ranks[r] = r;
    w->world_group = group_new(w, size, ranks);
    free(ranks);
    if (!w->world_group) goto oom;
    /* The world's own reference: a rank that finishes early must not free
     * the group before a slow rank has made its handle. */
    w->world_group->refs = 1;
    *out = w;
    return DT_SUCCESS;
oom:
    dt_local_world_destroy(w);
    return dt_error(DT_ERR_OUT_OF_MEMORY, "local world of %d ranks: out of memory", size);
}

dt_status dt_local_world_comm(dt_local_world *w, int rank, const dt_mem *mem, dt_comm **out) {
    if (!w || !out || rank < 0 || rank >= w->size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "local world: bad comm request for rank %d", rank);
    pthread_mutex_lock(&w->mu);
    dt_local_group *g = w->world_group;
    dt_status st = comm_new(g, rank, mem ? mem : &dt_mem_host, out);
    if (st == DT_SUCCESS) g->refs++;
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* Caller holds the lock. Keeps the first abort. */
static void world_abort_locked(dt_local_world *w, int rank, dt_status status, const char *msg) {
    if (dt_failure_record(&w->failure, rank, status, msg))
        dt_log_write(w->cfg.log_level, rank, DT_LOG_WARN, "aborting the world: %s", msg);
    pthread_cond_broadcast(&w->cv);
}

void dt_local_world_abort(dt_local_world *w, int rank, dt_status status, const char *reason) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    world_abort_locked(w, rank, status, reason ? reason : "aborted");
    pthread_mutex_unlock(&w->mu);
}

dt_status dt_local_world_first_failure(dt_local_world *w, int *rank, char *msg, size_t size) {
    if (!w) return DT_SUCCESS;
    pthread_mutex_lock(&w->mu);
    dt_status st = dt_failure_get(&w->failure, rank, msg, size);
    pthread_mutex_unlock(&w->mu);
    return st;
}

void dt_local_world_destroy(dt_local_world *w) {
    if (!w) return;
    while (w->groups) {
        dt_local_group *g = w->groups;
        w->groups = g->next;
        group_free(g);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* ----------------------------------------------------------------- waits */

typedef int (*wait_pred)(const void *arg);

enum { WAIT_OK = 0, WAIT_ABORTED, WAIT_TIMEOUT };

static struct timespec deadline_after(long ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* Caller holds the lock. The predicate wins over an abort that came later.
 * `drain` waits out an abort too: used where peers may still be reading this
 * rank's buffers, which must not be handed back to the caller before they
 * finish (they finish in bounded time: they only copy). The time blocked
 * goes to c's wait_ms (comm.h). */
static int wait_for(dt_comm *c, const struct timespec *deadline, wait_pred pred,
                    const void *arg, int drain) {
    dt_local_world *w = ((dt_local_group *)c->impl)->world;
    if (pred(arg)) return WAIT_OK;
    const double t0 = dt_comm_wait_begin();
    int rc;
    for (;;) {
        if (pred(arg)) {
            rc = WAIT_OK;
            break;
        }
        if (w->failure.set && !drain) {
            rc = WAIT_ABORTED;
            break;
        }
        if (pthread_cond_timedwait(&w->cv, &w->mu, deadline) == ETIMEDOUT) {
            rc = pred(arg) ? WAIT_OK : w->failure.set ? WAIT_ABORTED : WAIT_TIMEOUT;
            break;
        }
    }
    dt_comm_wait_end(c, t0);
    return rc;
}

/* The status a rank returns when it stops waiting because the world was
 * aborted (failure.h). Caller holds the lock. */
static dt_status aborted_error(dt_comm *c, const char *op) {
    return dt_failure_error(&((dt_local_group *)c->impl)->world->failure, c->world_rank, op);
}

/* Append "rank R (in OP)" for member m to buf, comma-separated unless buf
 * ends with a space. */
static void describe_member(const dt_local_group *g, int m, char *buf, size_t size) {
    size_t len = strlen(buf);
    if (len + 1 >= size) return;
    const char *state = g->slots[m].state;
    snprintf(buf + len, size - len, "%srank %d (%s%s)", len && buf[len - 1] != ' ' ? ", " : "",
             g->world_ranks[m], state ? "in " : "",
             state ? state : "not in a call on this communicator");
}

/* Times out: build the message, abort the world, return DT_ERR_TIMEOUT.
 * Caller holds the lock. */
static dt_status timeout_error(dt_comm *c, const char *what, const char *waiting_for) {
    dt_local_world *w = ((dt_local_group *)c->impl)->world;
    char msg[1024];
    snprintf(msg, sizeof msg, "rank %d: %s timed out after %ld ms waiting for %s", c->world_rank,
             what, c->timeout_ms, waiting_for);
    world_abort_locked(w, c->world_rank, DT_ERR_TIMEOUT, msg);
    return dt_error(DT_ERR_TIMEOUT, "%s", msg);
}

static dt_status wait_error(dt_comm *c, int rc, const char *what, const char *waiting_for) {
    return rc == WAIT_ABORTED ? aborted_error(c, what) : timeout_error(c, what, waiting_for);
}

/* ----------------------------------------------------------- collectives */

typedef struct seq_wait {
    const dt_local_group *g;
    unsigned long seq;
    int done;   /* 0: wait for coll_seq, 1: wait for coll_done */
} seq_wait;

static int all_reached(const void *arg) {
    const seq_wait *s = arg;
    for (int m = 0; m < s->g->size; m++) {
        const local_slot *sl = &s->g->slots[m];
        if ((s->done ? sl->coll_done : sl->coll_seq) < s->seq) return 0;
    }
    return 1;
}

/* done = 0: wait for every member's arrival at seq; done = 1: for their
 * departure, which every member reaches in bounded time once all arrived, so
 * it is waited for even after an abort (see wait_for). */
static dt_status wait_all(dt_comm *c, const struct timespec *deadline, unsigned long seq,
                          int done, const char *what) {
    dt_local_group *g = c->impl;
    seq_wait s = {g, seq, done};
    int rc = wait_for(c, deadline, all_reached, &s, done);
    if (rc == WAIT_OK) return DT_SUCCESS;
    char who[768] = "";
    for (int m = 0; m < g->size; m++)
        if ((done ? g->slots[m].coll_done : g->slots[m].coll_seq) < seq)
            describe_member(g, m, who, sizeof who);
    return wait_error(c, rc, what, who);
}

static int is_rooted(dt_coll_kind k) {
    return k == DT_COLL_BROADCAST || k == DT_COLL_SCATTER || k == DT_COLL_GATHER;
}
static int is_reduction(dt_coll_kind k) {
    return k == DT_COLL_ALL_REDUCE || k == DT_COLL_REDUCE_SCATTER;
}
static int has_data(dt_coll_kind k) { return k != DT_COLL_BARRIER && k != DT_COLL_SPLIT; }

static void format_args(const dt_coll_args *a, char *buf, size_t size) {
    int n = snprintf(buf, size, "%s", dt_coll_kind_name(a->kind));
    if (n < 0 || (size_t)n >= size) return;
    if (has_data(a->kind))
        n += snprintf(buf + n, size - (size_t)n, " of %zu %s", a->count, dt_dtype_name(a->dtype));
    if (n >= 0 && (size_t)n < size && is_reduction(a->kind))
        n += snprintf(buf + n, size - (size_t)n, " (%s)", dt_reduce_op_name(a->op));
    if (n >= 0 && (size_t)n < size && is_rooted(a->kind))
        snprintf(buf + n, size - (size_t)n, " from root %d", a->root);
}

static int args_agree(const dt_coll_args *a, const dt_coll_args *b) {
    if (a->kind != b->kind) return 0;
    if (has_data(a->kind) && (a->count != b->count || a->dtype != b->dtype)) return 0;
    if (is_reduction(a->kind) && a->op != b->op) return 0;
    if (is_rooted(a->kind) && a->root != b->root) return 0;
    return 1;
}

/* Caller holds the lock and every member has arrived at seq. */
static dt_status check_agreement(dt_comm *c, unsigned long seq) {
    dt_local_group *g = c->impl;
    for (int m = 1; m < g->size; m++) {
        if (args_agree(&g->slots[0].args, &g->slots[m].args)) continue;
        char a0[160], am[160], msg[1024];
        format_args(&g->slots[0].args, a0, sizeof a0);
        format_args(&g->slots[m].args, am, sizeof am);
        snprintf(msg, sizeof msg,
                 "collective #%lu on a communicator of %d ranks: rank %d calls %s but rank %d "
                 "calls %s",
                 seq, g->size, g->world_ranks[m], am, g->world_ranks[0], a0);
        world_abort_locked(g->world, c->world_rank, DT_ERR_MISMATCH, msg);
        return dt_error(DT_ERR_MISMATCH, "rank %d: %s", c->world_rank, msg);
    }
    return DT_SUCCESS;
}

/* scratch := op over members of (their send + offset elements), count
 * elements, accumulated in fp32 in rank order and rounded once. */
static dt_status reduce_into_scratch(dt_comm *c, size_t offset, const dt_coll_args *a) {
    dt_local_group *g = c->impl;
    local_slot *me = &g->slots[c->rank];
    size_t need = a->count * sizeof(float);
    if (need > me->scratch_bytes) {
        void *p = NULL;
        if (me->scratch) c->mem.ops->free(c->mem.arg, me->scratch);
        me->scratch = NULL;
        me->scratch_bytes = 0;
        dt_status st = c->mem.ops->alloc(c->mem.arg, need, &p);
        if (st != DT_SUCCESS) {
            char why[512];
            snprintf(why, sizeof why, "%s", dt_last_error());
            return dt_error(st, "rank %d: %s: scratch of %zu bytes: %s", c->world_rank,
                            dt_coll_kind_name(a->kind), need, why);
        }
        me->scratch = p;
        me->scratch_bytes = need;
        me->scratch_ops = c->mem.ops;
    }
    float *acc = me->scratch;
    size_t es = dt_dtype_size(a->dtype);
    for (int m = 0; m < g->size; m++) {
        const char *src = (const char *)g->slots[m].args.send + offset * es;
        DT_TRY(c->mem.ops->reduce(c->mem.arg, acc, src, a->count, a->dtype, a->op, m == 0));
    }
    return c->mem.ops->finish(c->mem.arg, acc, a->count, a->dtype);
}

/* Reads the peers' buffers of a collective that every member has joined. */
static dt_status move_data(dt_comm *c, const dt_coll_args *a) {
    dt_local_group *g = c->impl;
    const local_slot *s = g->slots;
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    int r = c->rank;
    const dt_mem *mem = &c->mem;
    switch (a->kind) {
    case DT_COLL_ALL_REDUCE: return reduce_into_scratch(c, 0, a);
    case DT_COLL_REDUCE_SCATTER: return reduce_into_scratch(c, (size_t)r * a->count, a);
    case DT_COLL_ALL_GATHER:
        for (int m = 0; m < g->size; m++) {
            char *dst = (char *)a->recv + (size_t)m * bytes;
            if (bytes && dst != s[m].args.send)
                DT_TRY(mem->ops->copy(mem->arg, dst, s[m].args.send, bytes, NULL, NULL));
        }
        return DT_SUCCESS;
    case DT_COLL_ALL_TO_ALL:
        /* block m of recv := block r of member m's send (never the same memory) */
        for (int m = 0; m < g->size; m++) {
            const char *src = (const char *)s[m].args.send + (size_t)r * bytes;
            if (bytes)
                DT_TRY(mem->ops->copy(mem->arg, (char *)a->recv + (size_t)m * bytes, src, bytes,
                                      NULL, NULL));
        }
        return DT_SUCCESS;
    case DT_COLL_BROADCAST:
        if (r != a->root && bytes)
            return mem->ops->copy(mem->arg, a->recv, s[a->root].args.recv, bytes, NULL, NULL);
        return DT_SUCCESS;
    case DT_COLL_SCATTER: {
        const char *src = (const char *)s[a->root].args.send + (size_t)r * bytes;
        if (bytes && src != a->recv)
            return mem->ops->copy(mem->arg, a->recv, src, bytes, NULL, NULL);
        return DT_SUCCESS;
    }
    case DT_COLL_GATHER:
        if (r == a->root)
            for (int m = 0; m < g->size; m++) {
                char *dst = (char *)a->recv + (size_t)m * bytes;
                if (bytes && dst != s[m].args.send)
                    DT_TRY(mem->ops->copy(mem->arg, dst, s[m].args.send, bytes, NULL, NULL));
            }
        return DT_SUCCESS;
    default: return DT_SUCCESS;
    }
}

typedef struct split_entry { int color, key, member; } split_entry;

static int split_cmp(const void *pa, const void *pb) {
    const split_entry *a = pa, *b = pb;
    if (a->color != b->color) return a->color < b->color ? -1 : 1;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->member > b->member) - (a->member < b->member);
}

/* The first member through arrival makes the groups of every color for all.
 * Caller holds the lock. */
static dt_status split_groups(dt_comm *c, unsigned long seq) {
    dt_local_group *g = c->impl;
    if (g->split_seq == seq) return DT_SUCCESS;
    split_entry *e = malloc((size_t)g->size * sizeof *e);
    int *ranks = malloc((size_t)g->size * sizeof *ranks);
    dt_status st = DT_SUCCESS;
    if (!e || !ranks) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: split: out of memory", c->world_rank);
        goto out;
    }
    for (int m = 0; m < g->size; m++) {
        e[m] = (split_entry){g->slots[m].args.color, g->slots[m].args.key, m};
        g->slots[m].split_group = NULL;
        g->slots[m].split_rank = -1;
    }
    qsort(e, (size_t)g->size, sizeof *e, split_cmp);
    for (int i = 0; i < g->size;) {
        int j = i;
        while (j < g->size && e[j].color == e[i].color) j++;
        if (e[i].color >= 0) {
            for (int k = i; k < j; k++) ranks[k - i] = g->world_ranks[e[k].member];
            dt_local_group *ng = group_new(g->world, j - i, ranks);
            if (!ng) {
                st = dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: split: out of memory", c->world_rank);
                goto out;
            }
            ng->refs = j - i;
            for (int k = i; k < j; k++) {
                g->slots[e[k].member].split_group = ng;
                g->slots[e[k].member].split_rank = k - i;
            }
        }
        i = j;
    }
    g->split_seq = seq;
out:
    free(e);
    free(ranks);
    return st;
}

static dt_status local_collective(dt_comm *c, const dt_coll_args *a, dt_comm **split_out) {
    dt_local_group *g = c->impl;
    dt_local_world *w = g->world;
    local_slot *me = &g->slots[c->rank];
    const char *name = dt_coll_kind_name(a->kind);
    struct timespec deadline = deadline_after(c->timeout_ms);
    char what[96];
    dt_status st = DT_SUCCESS;

    if (is_reduction(a->kind) && !dt_dtype_is_float(a->dtype))
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: %s: the local transport reduces fp32, "
                        "bf16 and fp16, not %s", c->world_rank, name, dt_dtype_name(a->dtype));
    if (!a->host_only && (st = c->mem.ops->publish(c->mem.arg)) != DT_SUCCESS) {
        dt_local_world_abort(w, c->world_rank, st, dt_last_error());
        return st;
    }
    pthread_mutex_lock(&w->mu);
    if (w->failure.set) {
        st = aborted_error(c, name);
        goto unlock;
    }
    unsigned long seq = ++me->coll_seq;
    snprintf(what, sizeof what, "%s (collective #%lu)", name, seq);
    me->args = *a;
    me->state = name;
    pthread_cond_broadcast(&w->cv);
    DT_TRY_GOTO(st, wait_all(c, &deadline, seq, 0, what), unlock);
    /* Every member has arrived, so peers may now read this rank's buffers:
     * from here every way out, failures included, goes through departure. */
    dt_status part = check_agreement(c, seq);   /* this rank's part of the collective */
    if (part == DT_SUCCESS && a->kind == DT_COLL_SPLIT) {
        part = split_groups(c, seq);
        if (part == DT_SUCCESS && me->split_group)
            part = comm_new(me->split_group, me->split_rank, &c->mem, split_out);
    }
    pthread_mutex_unlock(&w->mu);

    if (part == DT_SUCCESS) part = move_data(c, a);

    pthread_mutex_lock(&w->mu);
    me->coll_done = seq;
    pthread_cond_broadcast(&w->cv);
    if (part != DT_SUCCESS) world_abort_locked(w, c->world_rank, part, dt_last_error());
    /* Departure gets a bound of its own (peers only copy): returning buffers
     * a peer still reads would corrupt that peer's result. */
    struct timespec leave = deadline_after(c->timeout_ms);
    st = part;
    DT_KEEP_FIRST(st, wait_all(c, &leave, seq, 1, what));
unlock:
    me->state = NULL;
    pthread_mutex_unlock(&w->mu);
    if (st == DT_SUCCESS && is_reduction(a->kind) && a->count)
        st = c->mem.ops->copy(c->mem.arg, a->recv, me->scratch, a->count * dt_dtype_size(a->dtype),
                             NULL, NULL);
    if (st != DT_SUCCESS && split_out && *split_out) {
        dt_comm_destroy(*split_out);
        *split_out = NULL;
    }
    return st;
}

/* -------------------------------------------------------- point-to-point */

static dt_status local_p2p_start(dt_comm *c, const dt_p2p_op *ops, int n, int chained) {
    dt_local_group *g = c->impl;
    dt_local_world *w = g->world;
    local_slot *me = &g->slots[c->rank];
    /* No wait: the group's copies start after both ends' marks, beside the
     * kernel launched next. Mark before the lock: peers read the token only
     * once the group is published below. */
    const void *ready = NULL;
    dt_status st = c->mem.ops->mark(c->mem.arg, chained, &ready);
    if (st != DT_SUCCESS) {
        dt_local_world_abort(w, c->world_rank, st, dt_last_error());
        return st;
    }
    pthread_mutex_lock(&w->mu);
    if (w->failure.set) {
        st = aborted_error(c, "sendrecv");
        goto unlock;
    }
    if (n > me->p2p_cap) {
        /* Peers read these arrays under the lock, so growing them here is safe.
         * Steady-state callers (the ring) reuse the capacity: no allocation. */
        uint64_t *seqs = realloc(me->op_seq, (size_t)n * sizeof *seqs);
        if (seqs) me->op_seq = seqs;
        unsigned char *cons = realloc(me->op_consumed, (size_t)n);
        if (cons) me->op_consumed = cons;
        if (!seqs || !cons) {
            st = dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: sendrecv: out of memory for %d ops",
                          c->world_rank, n);
            goto unlock;
        }
        me->p2p_cap = n;
    }
    me->sends_outstanding = 0;
    for (int k = 0; k < n; k++) {
        if (ops[k].kind == DT_P2P_SEND) {
            me->op_seq[k] = me->sent[ops[k].peer]++;
            me->op_consumed[k] = 0;
            me->sends_outstanding++;
        } else {
            me->op_seq[k] = me->received[ops[k].peer]++;
        }
    }
    me->p2p_ops = ops;
    me->p2p_n = n;
    me->p2p_ready = ready;
    me->state = "sendrecv";
    pthread_cond_broadcast(&w->cv);
unlock:
    pthread_mutex_unlock(&w->mu);
    return st;
}

typedef struct send_wait {
    const local_slot *peer;
    int to;
    uint64_t seq;
} send_wait;

static int send_posted(const void *arg) {
    const send_wait *s = arg;
    return s->peer->sent[s->to] > s->seq;
}

static int no_readers(const void *arg) { return ((const local_slot *)arg)->readers == 0; }

static int sends_consumed(const void *arg) {
    return ((const local_slot *)arg)->sends_outstanding == 0;
}

static dt_status local_p2p_wait(dt_comm *c) {
    dt_local_group *g = c->impl;
    dt_local_world *w = g->world;
    local_slot *me = &g->slots[c->rank];
    struct timespec deadline = deadline_after(c->timeout_ms);
    dt_status st = DT_SUCCESS;
    char what[64], who[256];
    snprintf(what, sizeof what, "sendrecv");

    pthread_mutex_lock(&w->mu);
    for (int k = 0; k < me->p2p_n; k++) {
        const dt_p2p_op *op = &me->p2p_ops[k];
        if (op->kind != DT_P2P_RECV) continue;
        local_slot *peer = &g->slots[op->peer];
        send_wait sw = {peer, c->rank, me->op_seq[k]};
        int rc = wait_for(c, &deadline, send_posted, &sw, 0);
        if (rc == WAIT_OK && w->failure.set) rc = WAIT_ABORTED; /* start no copy after an abort */
        if (rc != WAIT_OK) {
            snprintf(who, sizeof who, "message #%llu from ", (unsigned long long)sw.seq);
            describe_member(g, op->peer, who, sizeof who);
            st = wait_error(c, rc, what, who);
            goto unlock;
        }
        /* The peer cannot have moved past this group: its sends are not consumed. */
        int j = 0;
        while (j < peer->p2p_n &&
               !(peer->p2p_ops[j].kind == DT_P2P_SEND && peer->p2p_ops[j].peer == c->rank &&
                 peer->op_seq[j] == sw.seq))
            j++;
        if (j == peer->p2p_n) {
            st = dt_error(DT_ERR_INTERNAL, "rank %d: sendrecv: message #%llu from rank %d is "
                          "posted but not found", c->world_rank, (unsigned long long)sw.seq,
                          g->world_ranks[op->peer]);
            world_abort_locked(w, c->world_rank, st, dt_last_error());
            goto unlock;
        }
        const dt_p2p_op *src = &peer->p2p_ops[j];
        if (src->count != op->count || src->dtype != op->dtype) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "send/recv mismatch: rank %d receives %zu %s from rank %d, but rank %d "
                     "sends %zu %s to rank %d (message #%llu between them)",
                     c->world_rank, op->count, dt_dtype_name(op->dtype), g->world_ranks[op->peer],
                     g->world_ranks[op->peer], src->count, dt_dtype_name(src->dtype),
                     c->world_rank, (unsigned long long)sw.seq);
            world_abort_locked(w, c->world_rank, DT_ERR_MISMATCH, msg);
            st = dt_error(DT_ERR_MISMATCH, "rank %d: %s", c->world_rank, msg);
            goto unlock;
        }
        peer->readers++;
        const void *src_ready = peer->p2p_ready;
        pthread_mutex_unlock(&w->mu);
        size_t bytes = op->count * dt_dtype_size(op->dtype);
        dt_status copied = DT_SUCCESS;
        if (bytes && op->buf != src->buf && !w->cfg.skip_copies)
            copied = c->mem.ops->copy(c->mem.arg, op->buf, src->buf, bytes, me->p2p_ready,
                                      src_ready);
        pthread_mutex_lock(&w->mu);
        peer->readers--;
        peer->op_consumed[j] = 1;
        peer->sends_outstanding--;
        pthread_cond_broadcast(&w->cv);
        if (copied != DT_SUCCESS) {
            st = copied;
            world_abort_locked(w, c->world_rank, st, dt_last_error());
            goto unlock;
        }
    }
    int rc = wait_for(c, &deadline, sends_consumed, me, 0);
    if (rc != WAIT_OK) {
        snprintf(who, sizeof who, "its sends to be received: ");
        for (int k = 0; k < me->p2p_n; k++)
            if (me->p2p_ops[k].kind == DT_P2P_SEND && !me->op_consumed[k])
                describe_member(g, me->p2p_ops[k].peer, who, sizeof who);
        st = wait_error(c, rc, what, who);
    }
unlock:
    /* Receivers mid-copy from this rank's buffers finish before they go back
     * to the caller; no new copy starts once the group is withdrawn. */
    struct timespec drain_deadline = deadline_after(c->timeout_ms);
    wait_for(c, &drain_deadline, no_readers, me, 1);
    me->p2p_ops = NULL;
    me->p2p_n = 0;
    me->state = NULL;
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* ----------------------------------------------------------- lifecycle */

static void local_abort(dt_comm *c, dt_status status, const char *reason) {
    char msg[1024];
    snprintf(msg, sizeof msg, "rank %d aborted (%s): %s", c->world_rank, dt_status_name(status),
             reason);
    dt_local_world_abort(((dt_local_group *)c->impl)->world, c->world_rank, status, msg);
}

static int local_aborted(const dt_comm *c) {
    dt_local_world *w = ((const dt_local_group *)c->impl)->world;
    pthread_mutex_lock(&w->mu);
    int a = w->failure.set;
    pthread_mutex_unlock(&w->mu);
    return a;
}

static void local_destroy(dt_comm *c) {
    dt_local_group *g = c->impl;
    dt_local_world *w = g->world;
    local_slot *me = &g->slots[c->rank];
    /* The scratch is private to this member: free it with its own memory
     * while its backend is alive. */
    if (me->scratch) c->mem.ops->free(c->mem.arg, me->scratch);
    me->scratch = NULL;
    me->scratch_bytes = 0;
    pthread_mutex_lock(&w->mu);
    if (--g->refs == 0) {
        group_unlink(w, g);
        group_free(g);
    }
    pthread_mutex_unlock(&w->mu);
    free(c);
}

static const dt_transport_ops local_ops = {
    .name = "local",
    .collective = local_collective,
    .p2p_start = local_p2p_start,
    .p2p_wait = local_p2p_wait,
    .abort = local_abort,
    .aborted = local_aborted,
    .destroy = local_destroy,
};
