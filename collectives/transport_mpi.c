/* collectives/transport_mpi.c — the MPI transport: ranks are processes
 * started by mpirun, buffers are host memory.
 *
 * Algorithm. A world (one dt_launch) holds two MPI_Comm_idup duplicates of
 * MPI_COMM_WORLD: `data` (collectives, p2p) and `ctrl` (failure notices, the
 * exit exchange, bootstrap). Errors return (MPI_ERRORS_RETURN). Only
 * non-blocking calls are made, each waited for by an MPI_Testall loop that
 * also probes ctrl for a peer's notice and gives up after the timeout.
 *
 * Collectives first MPI_Iallgather a header (kind, count, dtype, op, root,
 * color, key): a disagreement is DT_ERR_MISMATCH on every member, where MPI
 * would hang or mix data; a barrier is that exchange alone. all_reduce is
 * MPI_Ialltoallv, a segment reduction in fp32 in rank order rounded once (the
 * local transport's bits), then MPI_Iallgatherv; reduce_scatter the same
 * without the gather; the others map to MPI_I*. split is MPI_Comm_split, the
 * one blocking call, entered only once the header shows every member there
 * (docs/RELIABILITY.md). Data goes through the communicator's scratch, so an
 * abandoned request never touches a caller's buffer.
 *
 * Point-to-point: p2p_start posts every send (MPI_Isend, tag = base + dtype);
 * p2p_wait matches receives in order per peer with MPI_Improbe, checks dtype
 * (tag) and size (else DT_ERR_MISMATCH, not truncation), then MPI_Imrecv.
 * Zero-length messages are sent too, so numbering matches the local transport.
 *
 * Failures. A rank that times out, errs, mismatches or whose function fails
 * marks the world failed and sends each peer one notice; their next poll
 * returns DT_ERR_PEER_FAILED (DT_ERR_MISMATCH for a mismatch). A process that
 * dies outside the library sends nothing: peers time out. Never MPI_Abort.
 *
 * Process-wide state: who initialised MPI, whether MPI_COMM_WORLD is usable
 * (a timed-out creation leaves an idup pending), and a graveyard of memory
 * that abandoned requests may touch, freed after MPI_Finalize.
 *
 * Test: tests/test_mpi.c, run by `make test` under mpirun -np 1..4.
 */
#include "transport_mpi.h"
#include "failure.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    TAG_NOTICE = 7,     /* control communicator: a rank's failure notice */
    TAG_P2P = 100,      /* data communicators: TAG_P2P + dtype */
};

#define NOTICE_MSG 1000  /* bytes of message text in a notice */
#define FINISH_MSG 500   /* bytes of message text in an exit record */
#define HDR_N 8          /* int64 per collective header */

/* ------------------------------------------------------ process state */

typedef struct grave {
    struct grave *next;
    void *p;
} grave;

static struct {
    pthread_mutex_t mu;
    int we_initialised;     /* dt_mpi_init started MPI (the lifecycle thread) */
    int finalized;          /* dt_mpi_finalize called MPI_Finalize */
    char unusable[512];     /* why MPI_COMM_WORLD cannot make worlds any more ("" if it can) */
    char no_finalize[512];  /* why MPI_Finalize could wait forever ("" if it cannot) */
    long timeout_ms;        /* the last dt_mpi_init's: bounds MPI_Finalize */
    grave *graves;
} g_mpi = {PTHREAD_MUTEX_INITIALIZER, 0, 0, "", "", 0, NULL};

/* Keeps p alive (reachable) until dt_mpi_finalize: an abandoned MPI request
 * may still write to it. */
static void bury(void *p) {
    if (!p) return;
    grave *gr = malloc(sizeof *gr);
    pthread_mutex_lock(&g_mpi.mu);
    if (gr) {
        gr->p = p;
        gr->next = g_mpi.graves;
        g_mpi.graves = gr;
    }
    /* Out of memory: p stays unreachable; leaking it is still safe. */
    pthread_mutex_unlock(&g_mpi.mu);
}

/* dst := src, cut to fit (messages are shortened, never overflowed). */
static void copy_str(char *dst, size_t size, const char *src) {
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void mpi_string(int rc, char *buf, size_t size) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    snprintf(buf, size, "%s", s);
}

static const char *thread_level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
    }
}

/* MPI_Init_thread and MPI_Finalize wait for every process and cannot be
 * interrupted, so they run on a lifecycle thread of their own that the caller
 * waits for under its timeout (the same thread must do both). A timed-out wait
 * leaves it there: the process can still return an error and exit. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, init_done, init_rc, fin_asked, fin_done, fin_rc;
} g_life = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0};

/* Waits (g_life.mu held) until *flag is set or timeout_ms pass: 1 if set. */
static int life_wait(const int *flag, long timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    while (!*flag)
        if (pthread_cond_timedwait(&g_life.cv, &g_life.mu, &until) != 0) break;
    return *flag;
}

static void *life_main(void *arg) {
    (void)arg;
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    pthread_mutex_lock(&g_life.mu);
    g_life.init_done = 1;
    g_life.init_rc = rc;
    pthread_cond_broadcast(&g_life.cv);
    /* idle until dt_finalize asks (the process may also exit first) */
    while (rc == MPI_SUCCESS && !life_wait(&g_life.fin_asked, 1000)) continue;
    pthread_mutex_unlock(&g_life.mu);
    if (rc != MPI_SUCCESS) return NULL;
    rc = MPI_Finalize();
    pthread_mutex_lock(&g_life.mu);
    g_life.fin_done = 1;
    g_life.fin_rc = rc;
    pthread_cond_broadcast(&g_life.cv);
    pthread_mutex_unlock(&g_life.mu);
    return NULL;
}

/* Remembers why MPI_Finalize must not be entered (the first reason). */
static void finalize_unsafe(const char *why) {
    pthread_mutex_lock(&g_mpi.mu);
    if (!g_mpi.no_finalize[0]) copy_str(g_mpi.no_finalize, sizeof g_mpi.no_finalize, why);
    pthread_mutex_unlock(&g_mpi.mu);
}

dt_status dt_mpi_init(long timeout_ms, int *rank, int *size) {
    dt_status st = DT_SUCCESS;
    char why[MPI_MAX_ERROR_STRING];
    pthread_mutex_lock(&g_mpi.mu);
    g_mpi.timeout_ms = timeout_ms;
    if (g_mpi.finalized) {
        st = dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: MPI was already finalized (dt_finalize or "
                      "MPI_Finalize): no launch over MPI can follow");
        goto out;
    }
    if (g_mpi.unusable[0]) {
        st = dt_error(DT_ERR_PEER_FAILED, "dt_launch: MPI cannot start another world in this "
                      "process: %s", g_mpi.unusable);
        goto out;
    }
    pthread_mutex_lock(&g_life.mu);
    int started = g_life.started;
    pthread_mutex_unlock(&g_life.mu);
    int inited = 0;
    if (!started) {
        int fin = 0;
        MPI_Initialized(&inited);
        MPI_Finalized(&fin);
        if (fin) {
            st = dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: MPI was already finalized "
                          "(MPI_Finalize): no launch over MPI can follow");
            goto out;
        }
    }
    if (!inited) {   /* ours to start (or started by an earlier call) */
        pthread_mutex_lock(&g_life.mu);
        if (!g_life.started) {
            pthread_t th;
            if (pthread_create(&th, NULL, life_main, NULL) != 0) {
                pthread_mutex_unlock(&g_life.mu);
                st = dt_error(DT_ERR_SYSTEM, "dt_launch: cannot start a thread for MPI_Init_thread");
                goto out;
            }
            pthread_detach(th);
            g_life.started = 1;
            g_mpi.we_initialised = 1;
        }
        const int done = life_wait(&g_life.init_done, timeout_ms);
        const int rc = g_life.init_rc;
        pthread_mutex_unlock(&g_life.mu);
        if (!done) {
            snprintf(why, sizeof why, "MPI_Init_thread had not returned after %ld ms", timeout_ms);
            st = dt_error(DT_ERR_TIMEOUT, "dt_launch: MPI_Init_thread did not return within %ld ms "
                          "(DT_TIMEOUT_MS): it waits for every process of the job to start MPI, "
                          "and one is late, failed before dt_launch, or is missing", timeout_ms);
            pthread_mutex_unlock(&g_mpi.mu);
            finalize_unsafe(why);
            return st;
        }
        if (rc != MPI_SUCCESS) {
            mpi_string(rc, why, sizeof why);
            st = dt_error(DT_ERR_BACKEND, "dt_launch: MPI_Init_thread failed: %s", why);
            goto out;
        }
    }
    int level = MPI_THREAD_SINGLE, is_main = 0;
    MPI_Query_thread(&level);
    MPI_Is_thread_main(&is_main);
    if (level < MPI_THREAD_SERIALIZED && !is_main) {
        st = dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: MPI runs at %s, which allows MPI calls "
                      "from the thread that initialised it only, and dt_launch is called from "
                      "another thread (initialise MPI with MPI_THREAD_SERIALIZED, or call "
                      "dt_launch from that thread)", thread_level_name(level));
        goto out;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
out:
    pthread_mutex_unlock(&g_mpi.mu);
    return st;
}

dt_status dt_mpi_finalize(void) {
    dt_status st = DT_SUCCESS;
    pthread_mutex_lock(&g_mpi.mu);
    const long timeout_ms = g_mpi.timeout_ms;
    if (g_mpi.we_initialised && !g_mpi.finalized) {
        if (g_mpi.no_finalize[0]) {
            st = dt_error(DT_ERR_PEER_FAILED, "dt_finalize: MPI_Finalize not entered: it waits for "
                          "every process of the job, and %s; the process may exit (its launcher "
                          "reports it)", g_mpi.no_finalize);
            pthread_mutex_unlock(&g_mpi.mu);
            return st;
        }
        pthread_mutex_lock(&g_life.mu);
        g_life.fin_asked = 1;
        pthread_cond_broadcast(&g_life.cv);
        const int done = life_wait(&g_life.fin_done, timeout_ms);
        const int rc = g_life.fin_rc;
        pthread_mutex_unlock(&g_life.mu);
        if (!done) {
            st = dt_error(DT_ERR_TIMEOUT, "dt_finalize: MPI_Finalize did not return within %ld ms "
                          "(DT_TIMEOUT_MS): a process of the job has not reached it", timeout_ms);
            copy_str(g_mpi.no_finalize, sizeof g_mpi.no_finalize, "an earlier MPI_Finalize did not return");
            pthread_mutex_unlock(&g_mpi.mu);
            return st;
        }
        if (rc != MPI_SUCCESS) {
            char why[MPI_MAX_ERROR_STRING];
            mpi_string(rc, why, sizeof why);
            st = dt_error(DT_ERR_BACKEND, "dt_finalize: MPI_Finalize failed: %s", why);
        }
        g_mpi.finalized = 1;
        /* No request can run any more: what they might have touched is free. */
        while (g_mpi.graves) {
            grave *gr = g_mpi.graves;
            g_mpi.graves = gr->next;
            free(gr->p);
            free(gr);
        }
    }
    pthread_mutex_unlock(&g_mpi.mu);
    return st;
}

/* ------------------------------------------------------------- world */

struct dt_mpi_world {
    MPI_Comm data, ctrl;
    int rank, size;
    dt_comm_config cfg;
    dt_failure failure;      /* the first failure: the world is aborted once set */
    int notified;            /* this rank has sent its notice */
    char *notice;            /* the notice sent (must live until the sends complete) */
    MPI_Request *notice_reqs;
    int n_notice;
    int leak;                /* requests may be pending on data/ctrl: never free them */
    int comms;               /* live communicator handles */
};

typedef struct notice_head {
    int32_t status, rank;
} notice_head;

/* Reads every notice that has arrived; 1 if the world has failed. Never
 * blocks (a notice is small). An empty probe drives MPI's progress, so a poll
 * outside a wait loop probes twice to find a notice not yet matched. */
static int world_poll(dt_mpi_world *w) {
    for (int misses = 0; w->ctrl != MPI_COMM_NULL;) {
        int flag = 0;
        MPI_Message m;
        MPI_Status s;
        if (MPI_Improbe(MPI_ANY_SOURCE, TAG_NOTICE, w->ctrl, &flag, &m, &s) != MPI_SUCCESS)
            break;
        if (!flag) {
            if (++misses == 2) break;
            continue;
        }
        int n = 0;
        MPI_Get_count(&s, MPI_BYTE, &n);
        /* On the heap: a receive that does not finish is left to MPI with
         * its buffer kept (buried), never on this stack. */
        size_t size = sizeof(notice_head) + NOTICE_MSG + 1;
        char *buf = calloc(1, size);
        if (!buf) {
            /* The matched message stays unreceived: MPI's memory, leaked. */
            w->leak = 1;
            dt_failure_record(&w->failure, s.MPI_SOURCE, DT_ERR_PEER_FAILED,
                              "a failure notice arrived (out of memory reading it)");
            break;
        }
        if (n < 0 || (size_t)n > size - 1) n = (int)size - 1;
        MPI_Request r = MPI_REQUEST_NULL;
        int done = 0;
        if (MPI_Imrecv(buf, n, MPI_BYTE, &m, &r) == MPI_SUCCESS)
            for (int spin = 0; !done && spin < 100000; spin++) {
                if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
                if (!done) sched_yield();
            }
        if (!done) {
            /* Cannot happen for a small message. */
            if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
            bury(buf);
            w->leak = 1;
            dt_failure_record(&w->failure, s.MPI_SOURCE, DT_ERR_PEER_FAILED,
                              "a failure notice could not be read");
            break;
        }
        notice_head h;
        memcpy(&h, buf, sizeof h);
        buf[size - 1] = '\0';
        dt_status st = h.status > 0 && h.status < DT_STATUS_COUNT ? (dt_status)h.status
                                                                   : DT_ERR_PEER_FAILED;
        dt_failure_record(&w->failure, h.rank, st, buf + sizeof h);
        free(buf);
    }
    return w->failure.set;
}

void dt_mpi_world_abort(dt_mpi_world *w, dt_status status, const char *reason) {
    if (!w) return;
    world_poll(w);
    if (dt_failure_record(&w->failure, w->rank, status, reason ? reason : "aborted"))
        dt_log_write(w->cfg.log_level, w->rank, DT_LOG_WARN, "aborting the world: %s",
                     w->failure.msg);
    if (w->notified || w->failure.rank != w->rank || w->size == 1 || w->ctrl == MPI_COMM_NULL)
        return;
    /* Tell the peers once. Small messages: MPI sends them eagerly. */
    w->notified = 1;
    size_t len = strnlen(w->failure.msg, NOTICE_MSG - 1);
    w->notice = calloc(1, sizeof(notice_head) + len + 1);
    w->notice_reqs = malloc((size_t)w->size * sizeof *w->notice_reqs);
    if (!w->notice || !w->notice_reqs) return;
    notice_head h = {(int32_t)w->failure.status, (int32_t)w->rank};
    memcpy(w->notice, &h, sizeof h);
    memcpy(w->notice + sizeof h, w->failure.msg, len);
    for (int q = 0; q < w->size; q++) {
        if (q == w->rank) continue;
        MPI_Request r = MPI_REQUEST_NULL;
        if (MPI_Isend(w->notice, (int)(sizeof h + len + 1), MPI_BYTE, q, TAG_NOTICE, w->ctrl, &r) ==
            MPI_SUCCESS)
            w->notice_reqs[w->n_notice++] = r;
    }
}

int dt_mpi_world_aborted(dt_mpi_world *w) { return w ? world_poll(w) : 0; }
int dt_mpi_world_rank(const dt_mpi_world *w) { return w ? w->rank : -1; }
int dt_mpi_world_size(const dt_mpi_world *w) { return w ? w->size : 0; }

/* ----------------------------------------------------------------- waits */

enum { W_OK = 0, W_ABORTED, W_TIMEOUT, W_ERROR };

static long elapsed_ms(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)(t.tv_sec - t0->tv_sec) * 1000L + (t.tv_nsec - t0->tv_nsec) / 1000000L;
}

/* Polling keeps MPI progressing; after a few rounds, sleep a little so
 * processes sharing cores (mpirun --oversubscribe) let each other run. */
static void backoff(unsigned spin) {
    if (spin < 64) {
        sched_yield();
    } else {
        struct timespec ts = {0, spin < 1000 ? 20000L : 200000L};
        nanosleep(&ts, NULL);
    }
}

/* Waits for n requests. watch: stop when the world fails (a notice). */
static int wait_reqs(dt_mpi_world *w, int n, MPI_Request *reqs, long timeout_ms, int watch,
                     int *mpi_rc) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spin = 0;; spin++) {
        int flag = 0;
        int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            *mpi_rc = rc;
            return W_ERROR;
        }
        if (flag) return W_OK;
        if (watch && world_poll(w)) return W_ABORTED;
        if (elapsed_ms(&t0) > timeout_ms) return W_TIMEOUT;
        backoff(spin);
    }
}

/* ------------------------------------------------------- world lifecycle */

dt_status dt_mpi_world_create(const dt_comm_config *cfg, dt_mpi_world **out) {
    if (!cfg || !out) return dt_error(DT_ERR_INVALID_ARGUMENT, "mpi world: cfg or out is NULL");
    *out = NULL;
    if (cfg->timeout_ms <= 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "mpi world: timeout %ld ms <= 0", cfg->timeout_ms);
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) return dt_error(DT_ERR_INTERNAL, "mpi world: MPI is not initialised");
    pthread_mutex_lock(&g_mpi.mu);
    int bad = g_mpi.unusable[0] != '\0';
    char why[sizeof g_mpi.unusable];
    snprintf(why, sizeof why, "%s", g_mpi.unusable);
    pthread_mutex_unlock(&g_mpi.mu);
    if (bad)
        return dt_error(DT_ERR_PEER_FAILED, "dt_launch: MPI cannot start another world in this "
                        "process: %s", why);
    dt_mpi_world *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_OUT_OF_MEMORY, "mpi world: out of memory");
    w->cfg = *cfg;
    w->data = w->ctrl = MPI_COMM_NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &w->data, &r[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_idup(MPI_COMM_WORLD, &w->ctrl, &r[1]);
    int wr = rc == MPI_SUCCESS ? wait_reqs(w, 2, r, cfg->timeout_ms, 0, &rc) : W_ERROR;
    if (wr != W_OK) {
        char msg[512];
        if (wr == W_TIMEOUT)
            snprintf(msg, sizeof msg, "rank %d of %d: creating the world timed out after %ld ms "
                     "(DT_TIMEOUT_MS): not every process called dt_launch (every process that "
                     "mpirun started must call it, the same number of times)", w->rank, w->size,
                     cfg->timeout_ms);
        else {
            char e[MPI_MAX_ERROR_STRING];
            mpi_string(rc, e, sizeof e);
            snprintf(msg, sizeof msg, "rank %d of %d: MPI_Comm_idup failed: %s", w->rank, w->size, e);
        }
        /* The pending idups are on MPI_COMM_WORLD: no later world can match them. */
        pthread_mutex_lock(&g_mpi.mu);
        snprintf(g_mpi.unusable, sizeof g_mpi.unusable, "%s", msg);
        pthread_mutex_unlock(&g_mpi.mu);
        finalize_unsafe(msg);
        bury(w); /* the idups write into w->data and w->ctrl */
        return dt_error(wr == W_TIMEOUT ? DT_ERR_TIMEOUT : DT_ERR_BACKEND, "%s", msg);
    }
    MPI_Comm_set_errhandler(w->data, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(w->ctrl, MPI_ERRORS_RETURN);
    *out = w;
    return DT_SUCCESS;
}

void dt_mpi_world_destroy(dt_mpi_world *w) {
    if (!w) return;
    if (w->n_notice) {
        int done = 0;
        MPI_Testall(w->n_notice, w->notice_reqs, &done, MPI_STATUSES_IGNORE);
        if (!done) {
            /* A peer that stopped listening: let MPI finish or drop them. */
            for (int i = 0; i < w->n_notice; i++)
                if (w->notice_reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&w->notice_reqs[i]);
            bury(w->notice);
            w->notice = NULL;
        }
    }
    free(w->notice);
    free(w->notice_reqs);
    if (!w->leak && !w->failure.set) {
        if (w->data != MPI_COMM_NULL) MPI_Comm_free(&w->data);
        if (w->ctrl != MPI_COMM_NULL) MPI_Comm_free(&w->ctrl);
    }
    /* A failed world's communicators stay allocated inside MPI: requests
     * abandoned on them may still be pending. */
    free(w);
}

static dt_status world_wait_fail(dt_mpi_world *w, int wr, int rc, const char *what) {
    if (wr == W_ABORTED) {
        return dt_failure_error(&w->failure, w->rank, what);
    }
    char msg[700];
    if (wr == W_TIMEOUT) {
        snprintf(msg, sizeof msg, "rank %d: %s timed out after %ld ms (DT_TIMEOUT_MS) waiting for "
                 "the other ranks", w->rank, what, w->cfg.timeout_ms);
    } else {
        char e[MPI_MAX_ERROR_STRING];
        mpi_string(rc, e, sizeof e);
        snprintf(msg, sizeof msg, "rank %d: %s: MPI failed: %s", w->rank, what, e);
    }
    dt_status st = wr == W_TIMEOUT ? DT_ERR_TIMEOUT : DT_ERR_BACKEND;
    dt_mpi_world_abort(w, st, msg);
    return dt_error(st, "%s", msg);
}

dt_status dt_mpi_world_bcast(dt_mpi_world *w, void *buf, size_t bytes, int root) {
    if (!w || (!buf && bytes) || bytes > INT_MAX || root < 0 || root >= w->size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "mpi world: bad broadcast of %zu bytes from %d",
                        bytes, root);
    /* Not skipped or stopped for a failure: the control communicator's
     * collectives (this, then the exit exchange) stay in the same order on
     * every rank; the root's failure travels in the data (context.c). */
    char *tmp = malloc(bytes ? bytes : 1);
    if (!tmp) return dt_error(DT_ERR_OUT_OF_MEMORY, "mpi world: out of memory");
    if (w->rank == root && bytes) memcpy(tmp, buf, bytes);
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Ibcast(tmp, (int)bytes, MPI_BYTE, root, w->ctrl, &r);
    int wr = rc == MPI_SUCCESS ? wait_reqs(w, 1, &r, w->cfg.timeout_ms, 0, &rc) : W_ERROR;
    if (wr != W_OK) {
        w->leak = 1;
        bury(tmp);
        return world_wait_fail(w, wr, rc, "bootstrap broadcast");
    }
    if (bytes) memcpy(buf, tmp, bytes);
    free(tmp);
    return DT_SUCCESS;
}

typedef struct finish_rec {
    int32_t status;
    int32_t origin;     /* the rank the failure started on, as this rank knows it */
    char msg[FINISH_MSG];
} finish_rec;

/* The exit exchange's grace (at most the timeout): see dt_mpi_world_finish. */
#define FINISH_GRACE_MS 1000L

/* COLLECTIVE over ctrl: the verdict of dt_mpi_world_finish, not stopped by
 * notices. After `bound` ms: `mine` if it failed, else DT_ERR_TIMEOUT, and MPI
 * may not be finalized (a process is missing). */
static dt_status exchange(dt_mpi_world *w, dt_status mine, const char *my_msg, long bound,
                          const char *what, char *msg, size_t msg_size) {
    finish_rec me;
    memset(&me, 0, sizeof me);
    me.status = (int32_t)mine;
    me.origin = mine == DT_SUCCESS ? -1 : w->failure.set ? w->failure.rank : w->rank;
    copy_str(me.msg, sizeof me.msg, mine != DT_SUCCESS && my_msg ? my_msg : "");
    finish_rec *all = calloc((size_t)w->size, sizeof *all);
    if (!all) return dt_error(DT_ERR_OUT_OF_MEMORY, "mpi world: out of memory for %s", what);
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, w->ctrl,
                            &r);
    int wr = rc == MPI_SUCCESS ? wait_reqs(w, 1, &r, bound, 0, &rc) : W_ERROR;
    if (wr != W_OK) {
        w->leak = 1;
        bury(all);
        dt_status st;
        char m[700];
        if (wr == W_TIMEOUT && mine != DT_SUCCESS) {
            snprintf(m, sizeof m, "%s (and not every rank reached %s within %ld ms after it)",
                     my_msg && *my_msg ? my_msg : dt_status_name(mine), what, bound);
            st = mine;
            dt_error(st, "%s", m);
        } else if (wr == W_TIMEOUT) {
            snprintf(m, sizeof m, "rank %d: %s: not every rank reached it within %ld ms "
                     "(DT_TIMEOUT_MS): a rank hangs, died, or computes for longer", w->rank, what,
                     bound);
            st = DT_ERR_TIMEOUT;
            dt_mpi_world_abort(w, st, m);
            dt_error(st, "%s", m);
        } else {
            st = world_wait_fail(w, wr, rc, what);
        }
        snprintf(m, sizeof m, "%s did not complete on rank %d", what, w->rank);
        finalize_unsafe(m);
        if (msg && msg_size) snprintf(msg, msg_size, "%s", dt_last_error());
        return st;
    }
    /* Every process reached this exchange: none is missing, so MPI_Finalize
     * can complete again, whatever an earlier world left. */
    pthread_mutex_lock(&g_mpi.mu);
    g_mpi.no_finalize[0] = '\0';
    pthread_mutex_unlock(&g_mpi.mu);
    int pick = -1;
    /* The lowest rank whose failure was its own; else the lowest failure. */
    for (int q = 0; q < w->size && pick < 0; q++)
        if (all[q].status != DT_SUCCESS && all[q].origin == q) pick = q;
    for (int q = 0; q < w->size && pick < 0; q++)
        if (all[q].status != DT_SUCCESS && all[q].status != DT_ERR_PEER_FAILED) pick = q;
    for (int q = 0; q < w->size && pick < 0; q++)
        if (all[q].status != DT_SUCCESS) pick = q;
    dt_status st = DT_SUCCESS;
    if (pick >= 0) {
        /* Failure notices may still be on their way to this rank: keep the
         * communicators allocated rather than free them under a message. */
        w->leak = 1;
        st = all[pick].status > 0 && all[pick].status < DT_STATUS_COUNT ? (dt_status)all[pick].status
                                                                        : DT_ERR_INTERNAL;
        all[pick].msg[FINISH_MSG - 1] = '\0';
        if (msg && msg_size) snprintf(msg, msg_size, "%s", all[pick].msg);
    } else if (msg && msg_size) {
        msg[0] = '\0';
    }
    free(all);
    return st;
}

dt_status dt_mpi_world_agree(dt_mpi_world *w, dt_status mine, const char *my_msg, char *msg,
                             size_t msg_size) {
    if (!w) return dt_error(DT_ERR_INVALID_ARGUMENT, "mpi world: NULL");
    return exchange(w, mine, my_msg, w->cfg.timeout_ms, "dt_launch (the start agreement)", msg,
                    msg_size);
}

dt_status dt_mpi_world_finish(dt_mpi_world *w, dt_status mine, const char *my_msg, char *msg,
                              size_t msg_size) {
    if (!w) return dt_error(DT_ERR_INVALID_ARGUMENT, "mpi world: NULL");
    world_poll(w);
    /* An abort made here (dt_comm_abort) counts even if the function then
     * returned success, as in the local transport. */
    if (mine == DT_SUCCESS && w->failure.set && w->failure.rank == w->rank) {
        mine = w->failure.status;
        my_msg = w->failure.msg;
    }
    /* A peer still in a library wait gives up within one timeout of that
     * wait's start, before this rank came here, and then reports: the
     * timeout and a grace are enough for it. A failure known here: the
     * grace alone (the others learn of it within a few polls). */
    const long t = w->cfg.timeout_ms, grace = t < FINISH_GRACE_MS ? t : FINISH_GRACE_MS;
    const long bound = w->failure.set || mine != DT_SUCCESS ? grace
                       : t > LONG_MAX - grace ? LONG_MAX : t + grace;
    return exchange(w, mine, my_msg, bound, "dt_launch (the exit exchange)", msg, msg_size);
}

static int channel_poll(void *arg, dt_status *status, int *rank, char *msg, size_t size) {
    dt_mpi_world *w = arg;
    if (!world_poll(w) || w->failure.rank == w->rank) return 0;
    *status = dt_failure_get(&w->failure, rank, msg, size);
    return 1;
}

static void channel_notify(void *arg, dt_status status, const char *msg) {
    dt_mpi_world_abort(arg, status, msg);
}

dt_peer_channel dt_mpi_world_channel(dt_mpi_world *w) {
    dt_peer_channel ch = {w, channel_poll, channel_notify};
    return ch;
}

/* ------------------------------------------------------- communicators */

typedef struct mpi_impl {
    dt_mpi_world *world;
    MPI_Comm mc;
    int owns_mc;            /* a split's; the world communicator's belongs to the world */
    int *world_ranks;       /* comm rank -> world rank */
    unsigned long seq;      /* collectives entered */
    char *scratch;          /* header tables, received data, fp32 accumulators */
    size_t scratch_bytes;
    int *v;                 /* 4 * size ints: counts and displacements */
    int failed;             /* an abandoned request may still use scratch */
    /* the outstanding p2p group */
    const dt_p2p_op *ops;
    int n, cap;
    MPI_Request *reqs;
    unsigned char *matched;
    uint64_t *op_seq;
    size_t *stage_off;         /* [cap] each op's place in stage */
    char *stage;               /* the group's data: sends copied in, receives copied out */
    size_t stage_bytes;
    uint64_t *sent, *received; /* [size] messages posted to / from each peer */
    unsigned char *blocked;    /* [size] scratch for p2p_wait */
} mpi_impl;

static const dt_transport_ops mpi_ops;

static dt_status comm_make(dt_mpi_world *w, MPI_Comm mc, int owns, const dt_mem *mem,
                           dt_comm **out) {
    dt_comm *c = calloc(1, sizeof *c);
    mpi_impl *im = calloc(1, sizeof *im);
    int rank = 0, size = 1;
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    if (im) {
        im->world_ranks = malloc((size_t)size * sizeof(int));
        im->v = malloc(4 * (size_t)size * sizeof(int));
        im->sent = calloc((size_t)size, sizeof(uint64_t));
        im->received = calloc((size_t)size, sizeof(uint64_t));
        im->blocked = calloc((size_t)size, 1);
    }
    if (!c || !im || !im->world_ranks || !im->v || !im->sent || !im->received || !im->blocked) {
        if (im) {
            free(im->world_ranks);
            free(im->v);
            free(im->sent);
            free(im->received);
            free(im->blocked);
        }
        free(im);
        free(c);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: out of memory for a communicator", w->rank);
    }
    /* World ranks of the members, for messages and for dt_comm_world_rank. */
    MPI_Group gc, gw;
    MPI_Comm_group(mc, &gc);
    MPI_Comm_group(w->data, &gw);
    int *mine = malloc((size_t)size * sizeof(int));
    if (mine) {
        for (int i = 0; i < size; i++) mine[i] = i;
        MPI_Group_translate_ranks(gc, size, mine, gw, im->world_ranks);
        free(mine);
    } else {
        for (int i = 0; i < size; i++) im->world_ranks[i] = i;
    }
    MPI_Group_free(&gc);
    MPI_Group_free(&gw);
    im->world = w;
    im->mc = mc;
    im->owns_mc = owns;
    c->ops = &mpi_ops;
    c->impl = im;
    c->rank = rank;
    c->size = size;
    c->world_rank = w->rank;
    c->timeout_ms = w->cfg.timeout_ms;
    c->log_level = w->cfg.log_level;
    c->check = w->cfg.check;
    c->mem = mem ? *mem : dt_mem_host;
    w->comms++;
    *out = c;
    return DT_SUCCESS;
}

dt_status dt_mpi_world_comm(dt_mpi_world *w, const dt_mem *mem, dt_comm **out) {
    if (!w || !out) return dt_error(DT_ERR_INVALID_ARGUMENT, "mpi world: bad comm request");
    if (mem && mem->ops != dt_mem_host.ops)
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: the mpi transport moves host memory, not "
                        "%s memory", w->rank, mem->ops->name);
    return comm_make(w, w->data, 0, mem, out);
}

/* Another rank failed (or this one did, earlier): say who and why. */
static dt_status peer_failed(dt_comm *c, const char *what) {
    return world_wait_fail(((mpi_impl *)c->impl)->world, W_ABORTED, 0, what);
}

/* A wait that did not end well: the matching error, the world failed. */
static dt_status wait_fail(dt_comm *c, int wr, int rc, const char *what, const char *waiting_for) {
    mpi_impl *im = c->impl;
    dt_mpi_world *w = im->world;
    if (wr == W_ABORTED) return peer_failed(c, what);
    char msg[1024];
    dt_status st;
    if (wr == W_TIMEOUT) {
        st = DT_ERR_TIMEOUT;
        snprintf(msg, sizeof msg, "rank %d: %s timed out after %ld ms (DT_TIMEOUT_MS) waiting for "
                 "%s", c->world_rank, what, c->timeout_ms, waiting_for);
    } else {
        char e[MPI_MAX_ERROR_STRING];
        mpi_string(rc, e, sizeof e);
        st = DT_ERR_BACKEND;
        snprintf(msg, sizeof msg, "rank %d: %s: MPI failed: %s", c->world_rank, what, e);
    }
    dt_mpi_world_abort(w, st, msg);
    return dt_error(st, "%s", msg);
}

static dt_status call_fail(dt_comm *c, const char *what, const char *call, int rc) {
    char e[MPI_MAX_ERROR_STRING], msg[1024];
    mpi_string(rc, e, sizeof e);
    snprintf(msg, sizeof msg, "rank %d: %s: %s failed: %s", c->world_rank, what, call, e);
    dt_mpi_world_abort(((mpi_impl *)c->impl)->world, DT_ERR_BACKEND, msg);
    return dt_error(DT_ERR_BACKEND, "%s", msg);
}

static dt_status check_alive(dt_comm *c, const char *what) {
    mpi_impl *im = c->impl;
    if (world_poll(im->world)) return peer_failed(c, what);
    return DT_SUCCESS;
}

static dt_status scratch_reserve(dt_comm *c, size_t bytes, const char *what) {
    mpi_impl *im = c->impl;
    if (bytes <= im->scratch_bytes) return DT_SUCCESS;
    /* Only a healthy communicator gets here: no request uses the old one. */
    free(im->scratch);
    im->scratch = malloc(bytes);
    im->scratch_bytes = im->scratch ? bytes : 0;
    if (!im->scratch)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: %s: out of memory for %zu bytes of "
                        "scratch", c->world_rank, what, bytes);
    return DT_SUCCESS;
}

/* Waits for one collective request; on failure the scratch is abandoned.
 * watch: also stop when a peer's failure notice arrives (not for a split's
 * header: exchange_header). */
static dt_status coll_wait_watch(dt_comm *c, MPI_Request *r, const char *what, int watch) {
    mpi_impl *im = c->impl;
    int rc = MPI_SUCCESS;
    const double t0 = dt_comm_wait_begin();
    int wr = wait_reqs(im->world, 1, r, c->timeout_ms, watch, &rc);
    dt_comm_wait_end(c, t0);
    if (wr == W_OK) return DT_SUCCESS;
    im->failed = 1;
    im->world->leak = 1;
    char who[160];
    snprintf(who, sizeof who, "the other %d rank(s) of this communicator (one has not called it, "
             "or is in another call)", c->size - 1);
    return wait_fail(c, wr, rc, what, who);
}

static dt_status coll_wait(dt_comm *c, MPI_Request *r, const char *what) {
    return coll_wait_watch(c, r, what, 1);
}

static MPI_Datatype unit_type(dt_dtype t) {
    switch (dt_dtype_size(t)) {
    case 4: return MPI_UINT32_T;
    case 2: return MPI_UINT16_T;
    case 8: return MPI_UINT64_T;
    default: return MPI_BYTE;
    }
}

static int is_rooted(dt_coll_kind k) {
    return k == DT_COLL_BROADCAST || k == DT_COLL_SCATTER || k == DT_COLL_GATHER;
}
static int is_reduction(dt_coll_kind k) {
    return k == DT_COLL_ALL_REDUCE || k == DT_COLL_REDUCE_SCATTER;
}
static int has_data(dt_coll_kind k) { return k != DT_COLL_BARRIER && k != DT_COLL_SPLIT; }

static void format_hdr(const int64_t *h, char *buf, size_t size) {
    dt_coll_kind k = (dt_coll_kind)h[0];
    int n = snprintf(buf, size, "%s", dt_coll_kind_name(k));
    if (n >= 0 && (size_t)n < size && has_data(k))
        n += snprintf(buf + n, size - (size_t)n, " of %lld %s", (long long)h[1],
                      dt_dtype_name((dt_dtype)h[2]));
    if (n >= 0 && (size_t)n < size && is_reduction(k))
        n += snprintf(buf + n, size - (size_t)n, " (%s)", dt_reduce_op_name((dt_reduce_op)h[3]));
    if (n >= 0 && (size_t)n < size && is_rooted(k))
        snprintf(buf + n, size - (size_t)n, " from root %lld", (long long)h[4]);
}

static int hdr_agree(const int64_t *a, const int64_t *b) {
    dt_coll_kind k = (dt_coll_kind)a[0];
    if (a[0] != b[0]) return 0;
    if (has_data(k) && (a[1] != b[1] || a[2] != b[2])) return 0;
    if (is_reduction(k) && a[3] != b[3]) return 0;
    if (is_rooted(k) && a[4] != b[4]) return 0;
    return 1;
}

/* The header exchange: every member shows the others its call. On return
 * the scratch holds the size x HDR_N table. */
static dt_status exchange_header(dt_comm *c, const dt_coll_args *a, const char *what) {
    mpi_impl *im = c->impl;
    int64_t h[HDR_N] = {a->kind, (int64_t)a->count, a->dtype, a->op, a->root, a->color, a->key, 0};
    if (!has_data(a->kind)) h[1] = h[2] = 0;
    DT_TRY(scratch_reserve(c, (size_t)c->size * sizeof h, what));
    int64_t *all = (int64_t *)im->scratch;
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(h, HDR_N, MPI_INT64_T, all, HDR_N, MPI_INT64_T, im->mc, &r);
    if (rc != MPI_SUCCESS) return call_fail(c, what, "MPI_Iallgather", rc);
    /* A split's header wait ignores notices: once all have posted, the others
     * enter the blocking MPI_Comm_split and would wait for this member forever.
     * Only its timeout ends it (MPI has no non-blocking split). */
    DT_TRY(coll_wait_watch(c, &r, what, a->kind != DT_COLL_SPLIT));
    for (int m = 1; m < c->size; m++) {
        if (hdr_agree(all, all + (size_t)m * HDR_N)) continue;
        char a0[160], am[160], msg[1024];
        format_hdr(all, a0, sizeof a0);
        format_hdr(all + (size_t)m * HDR_N, am, sizeof am);
        snprintf(msg, sizeof msg, "collective #%lu on a communicator of %d ranks: rank %d calls %s "
                 "but rank %d calls %s", im->seq, c->size, im->world_ranks[m], am,
                 im->world_ranks[0], a0);
        /* Every member sees the same table and fails the same way. */
        dt_mpi_world_abort(im->world, DT_ERR_MISMATCH, msg);
        return dt_error(DT_ERR_MISMATCH, "rank %d: %s", c->world_rank, msg);
    }
    return DT_SUCCESS;
}

/* acc (fp32, n) := op over the size blocks of `blocks` (n elements each, in
 * rank order), rounded once to dtype at the start of acc. */
static dt_status reduce_blocks(dt_comm *c, float *acc, const char *blocks, size_t n,
                               const dt_coll_args *a) {
    size_t es = dt_dtype_size(a->dtype);
    for (int q = 0; q < c->size; q++)
        DT_TRY(c->mem.ops->reduce(c->mem.arg, acc, blocks + (size_t)q * n * es, n, a->dtype, a->op,
                                  q == 0));
    return c->mem.ops->finish(c->mem.arg, acc, n, a->dtype);
}

static size_t align16(size_t x) { return (x + 15) / 16 * 16; }

/* The call's input copied into the scratch at byte `at`: what a request
 * reads is the communicator's, as what it writes, so that one abandoned
 * after a failure never reads a caller's buffer after the call returned. */
static const char *stage_input(dt_comm *c, size_t at, const void *src, size_t bytes) {
    mpi_impl *im = c->impl;
    if (bytes) memcpy(im->scratch + at, src, bytes);
    return im->scratch + at;
}

static dt_status all_reduce(dt_comm *c, const dt_coll_args *a, const char *what) {
    mpi_impl *im = c->impl;
    size_t P = (size_t)c->size, me = (size_t)c->rank, n = a->count, es = dt_dtype_size(a->dtype);
    size_t off_me = n * me / P, len_me = n * (me + 1) / P - off_me;
    size_t b_bytes = align16(P * len_me * es), acc_bytes = align16(len_me * sizeof(float));
    size_t out_bytes = align16(n * es);
    DT_TRY(scratch_reserve(c, b_bytes + acc_bytes + out_bytes + n * es, what));
    char *blocks = im->scratch, *out = im->scratch + b_bytes + acc_bytes;
    float *acc = (float *)(im->scratch + b_bytes);
    const char *in = stage_input(c, b_bytes + acc_bytes + out_bytes, a->send, n * es);
    int *sc = im->v, *sd = im->v + P, *rcn = im->v + 2 * P, *rd = im->v + 3 * P;
    for (size_t q = 0; q < P; q++) {
        size_t off = n * q / P;
        sc[q] = (int)(n * (q + 1) / P - off);
        sd[q] = (int)off;
        rcn[q] = (int)len_me;
        rd[q] = (int)(q * len_me);
    }
    MPI_Datatype t = unit_type(a->dtype);
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Ialltoallv(in, sc, sd, t, blocks, rcn, rd, t, im->mc, &r);
    if (rc != MPI_SUCCESS) return call_fail(c, what, "MPI_Ialltoallv", rc);
    DT_TRY(coll_wait(c, &r, what));
    DT_TRY(reduce_blocks(c, acc, blocks, len_me, a));
    /* The reduced segments, each computed once, go to everyone: sc/sd are
     * every segment's length and offset. */
    rc = MPI_Iallgatherv(acc, (int)len_me, t, out, sc, sd, t, im->mc, &r);
    if (rc != MPI_SUCCESS) return call_fail(c, what, "MPI_Iallgatherv", rc);
    DT_TRY(coll_wait(c, &r, what));
    (void)off_me;
    memcpy(a->recv, out, n * es);
    return DT_SUCCESS;
}

static dt_status reduce_scatter(dt_comm *c, const dt_coll_args *a, const char *what) {
    mpi_impl *im = c->impl;
    size_t P = (size_t)c->size, n = a->count, es = dt_dtype_size(a->dtype);
    size_t b_bytes = align16(P * n * es), acc_bytes = align16(n * sizeof(float));
    DT_TRY(scratch_reserve(c, b_bytes + acc_bytes + P * n * es, what));
    char *blocks = im->scratch;
    float *acc = (float *)(im->scratch + b_bytes);
    const char *in = stage_input(c, b_bytes + acc_bytes, a->send, P * n * es);
    MPI_Datatype t = unit_type(a->dtype);
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Ialltoall(in, (int)n, t, blocks, (int)n, t, im->mc, &r);
    if (rc != MPI_SUCCESS) return call_fail(c, what, "MPI_Ialltoall", rc);
    DT_TRY(coll_wait(c, &r, what));
    DT_TRY(reduce_blocks(c, acc, blocks, n, a));
    memcpy(a->recv, acc, n * es);
    return DT_SUCCESS;
}

static dt_status move_data(dt_comm *c, const dt_coll_args *a, const char *what) {
    mpi_impl *im = c->impl;
    size_t P = (size_t)c->size, n = a->count, es = dt_dtype_size(a->dtype), bytes = n * es;
    int root = c->rank == a->root;
    MPI_Datatype t = unit_type(a->dtype);
    MPI_Request r = MPI_REQUEST_NULL;
    int rc;
    const char *call;
    switch (a->kind) {
    case DT_COLL_ALL_REDUCE: return all_reduce(c, a, what);
    case DT_COLL_REDUCE_SCATTER: return reduce_scatter(c, a, what);
    /* Received data lands at the scratch's start, the input (staged) after it. */
    case DT_COLL_ALL_GATHER: {
        size_t at = align16(P * bytes);
        DT_TRY(scratch_reserve(c, at + bytes, what));
        const char *in = stage_input(c, at, a->send, bytes);
        call = "MPI_Iallgather";
        rc = MPI_Iallgather(in, (int)n, t, im->scratch, (int)n, t, im->mc, &r);
        break;
    }
    case DT_COLL_ALL_TO_ALL: {
        size_t at = align16(P * bytes);
        DT_TRY(scratch_reserve(c, at + P * bytes, what));
        const char *in = stage_input(c, at, a->send, P * bytes);
        call = "MPI_Ialltoall";
        rc = MPI_Ialltoall(in, (int)n, t, im->scratch, (int)n, t, im->mc, &r);
        break;
    }
    case DT_COLL_BROADCAST:
        DT_TRY(scratch_reserve(c, bytes, what));
        if (root) stage_input(c, 0, a->recv, bytes);
        call = "MPI_Ibcast";
        rc = MPI_Ibcast(im->scratch, (int)n, t, a->root, im->mc, &r);
        break;
    case DT_COLL_SCATTER: {
        size_t at = align16(bytes);
        DT_TRY(scratch_reserve(c, at + (root ? P * bytes : 0), what));
        const char *in = root ? stage_input(c, at, a->send, P * bytes) : NULL;
        call = "MPI_Iscatter";
        rc = MPI_Iscatter(in, (int)n, t, im->scratch, (int)n, t, a->root, im->mc, &r);
        break;
    }
    case DT_COLL_GATHER: {
        size_t at = root ? align16(P * bytes) : 0;
        DT_TRY(scratch_reserve(c, at + bytes, what));
        const char *in = stage_input(c, at, a->send, bytes);
        call = "MPI_Igather";
        rc = MPI_Igather(in, (int)n, t, root ? im->scratch : NULL, (int)n, t, a->root, im->mc, &r);
        break;
    }
    default:
        return dt_error(DT_ERR_INTERNAL, "rank %d: mpi: unexpected collective %s", c->world_rank, what);
    }
    if (rc != MPI_SUCCESS) return call_fail(c, what, call, rc);
    DT_TRY(coll_wait(c, &r, what));
    switch (a->kind) {
    case DT_COLL_ALL_GATHER: memcpy(a->recv, im->scratch, P * bytes); break;
    case DT_COLL_ALL_TO_ALL: memcpy(a->recv, im->scratch, P * bytes); break;
    case DT_COLL_BROADCAST: if (!root) memcpy(a->recv, im->scratch, bytes); break;
    case DT_COLL_SCATTER: memmove(a->recv, im->scratch, bytes); break;
    case DT_COLL_GATHER: if (root) memcpy(a->recv, im->scratch, P * bytes); break;
    default: break;
    }
    return DT_SUCCESS;
}

static dt_status split(dt_comm *c, const dt_coll_args *a, dt_comm **out) {
    mpi_impl *im = c->impl;
    MPI_Comm nc = MPI_COMM_NULL;
    /* A member that gave up on the header exchange has sent its notice by now:
     * check it, so that no one enters a split that member will never call. */
    DT_TRY(check_alive(c, "split"));
    int rc = MPI_Comm_split(im->mc, a->color >= 0 ? a->color : MPI_UNDEFINED, a->key, &nc);
    if (rc != MPI_SUCCESS) return call_fail(c, "split", "MPI_Comm_split", rc);
    if (nc == MPI_COMM_NULL) return DT_SUCCESS;
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    dt_status st = comm_make(im->world, nc, 1, &c->mem, out);
    if (st != DT_SUCCESS) {
        MPI_Comm_free(&nc);
        dt_mpi_world_abort(im->world, st, dt_last_error());
    }
    return st;
}

static dt_status mpi_collective(dt_comm *c, const dt_coll_args *a, dt_comm **split_out) {
    mpi_impl *im = c->impl;
    const char *name = dt_coll_kind_name(a->kind);
    if (is_reduction(a->kind) && !dt_dtype_is_float(a->dtype))
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: %s: the mpi transport reduces fp32, bf16 "
                        "and fp16, not %s", c->world_rank, name, dt_dtype_name(a->dtype));
    if (has_data(a->kind) && a->count > INT_MAX)
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: %s: %zu elements; the mpi transport moves "
                        "at most %d per rank and call", c->world_rank, name, a->count, INT_MAX);
    DT_TRY(check_alive(c, name));
    char what[96];
    snprintf(what, sizeof what, "%s (collective #%lu)", name, ++im->seq);
    DT_TRY(exchange_header(c, a, what));
    if (a->kind == DT_COLL_BARRIER) return DT_SUCCESS; /* the exchange was one */
    if (a->kind == DT_COLL_SPLIT) return split(c, a, split_out);
    if (a->count == 0) return DT_SUCCESS;
    return move_data(c, a, what);
}

/* -------------------------------------------------------- point-to-point */

/* Cancels what can be, waits briefly for the rest, frees what remains:
 * after a failure nothing of this group is waited for again. */
static void p2p_drop(dt_comm *c) {
    mpi_impl *im = c->impl;
    int any = 0;
    for (int k = 0; k < im->n; k++)
        if (im->reqs[k] != MPI_REQUEST_NULL) {
            MPI_Cancel(&im->reqs[k]);
            any = 1;
        }
    if (any) {
        int rc = 0;
        long drain = c->timeout_ms < 1000 ? c->timeout_ms : 1000;
        const double t0 = dt_comm_wait_begin();
        const int wr = wait_reqs(im->world, im->n, im->reqs, drain, 0, &rc);
        dt_comm_wait_end(c, t0);
        if (wr != W_OK) {
            for (int k = 0; k < im->n; k++)
                if (im->reqs[k] != MPI_REQUEST_NULL) MPI_Request_free(&im->reqs[k]);
            im->world->leak = 1;
            /* What those requests still read or write is the stage, never
             * a caller's buffer: it stays allocated; the next group gets
             * another. */
            bury(im->stage);
            im->stage = NULL;
            im->stage_bytes = 0;
        }
    }
    im->ops = NULL;
    im->n = 0;
}

static dt_status mpi_p2p_start(dt_comm *c, const dt_p2p_op *ops, int n, int chained) {
    (void)chained;   /* host memory: nothing is queued */
    mpi_impl *im = c->impl;
    const char *what = "sendrecv";
    for (int k = 0; k < n; k++)
        if (ops[k].count > INT_MAX)
            return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: sendrecv: operation %d has %zu "
                            "elements; the mpi transport moves at most %d per message",
                            c->world_rank, k, ops[k].count, INT_MAX);
    DT_TRY(check_alive(c, what));
    if (n > im->cap) {
        /* Steady-state callers (the ring) reuse the capacity: no allocation. */
        MPI_Request *r = realloc(im->reqs, (size_t)n * sizeof *r);
        if (r) im->reqs = r;
        unsigned char *m = realloc(im->matched, (size_t)n);
        if (m) im->matched = m;
        uint64_t *s = realloc(im->op_seq, (size_t)n * sizeof *s);
        if (s) im->op_seq = s;
        size_t *o = realloc(im->stage_off, (size_t)n * sizeof *o);
        if (o) im->stage_off = o;
        if (!r || !m || !s || !o)
            return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: sendrecv: out of memory for %d ops",
                            c->world_rank, n);
        im->cap = n;
    }
    /* Data goes through the stage (sends copied in, receives copied out in
     * p2p_wait), so that a request abandoned after a failure never touches a
     * caller's buffer after the call returned. */
    size_t total = 0;
    for (int k = 0; k < n; k++) {
        im->stage_off[k] = total;
        total += align16(ops[k].count * dt_dtype_size(ops[k].dtype));
    }
    if (!im->stage || total > im->stage_bytes) {
        /* No request uses the old one: its group completed, or it was
         * buried. Never NULL, for zero-length messages' pointers too. */
        size_t bytes = total > 16 ? total : 16;
        free(im->stage);
        im->stage = malloc(bytes);
        im->stage_bytes = im->stage ? bytes : 0;
        if (!im->stage)
            return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: sendrecv: out of memory for %zu bytes "
                            "of staging", c->world_rank, bytes);
    }
    im->ops = ops;
    im->n = n;
    for (int k = 0; k < n; k++) {
        im->reqs[k] = MPI_REQUEST_NULL;
        im->matched[k] = 0;
    }
    for (int k = 0; k < n; k++) {
        const dt_p2p_op *o = &ops[k];
        if (o->kind == DT_P2P_RECV) {
            im->op_seq[k] = im->received[o->peer]++;
            continue;
        }
        im->op_seq[k] = im->sent[o->peer]++;
        char *at = im->stage + im->stage_off[k];
        if (o->count) memcpy(at, o->buf, o->count * dt_dtype_size(o->dtype));
        int rc = MPI_Isend(at, (int)o->count, unit_type(o->dtype), o->peer, TAG_P2P + o->dtype,
                           im->mc, &im->reqs[k]);
        if (rc != MPI_SUCCESS) {
            dt_status st = call_fail(c, what, "MPI_Isend", rc);
            p2p_drop(c);
            return st;
        }
    }
    return DT_SUCCESS;
}

/* "message #3 from rank 1 (not yet sent), its send to rank 2 (not yet received)" */
static void describe_pending(dt_comm *c, char *buf, size_t size) {
    mpi_impl *im = c->impl;
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < im->n && len + 1 < size; k++) {
        const dt_p2p_op *o = &im->ops[k];
        int done = 0;
        if (o->kind == DT_P2P_RECV && im->matched[k] && im->reqs[k] == MPI_REQUEST_NULL) done = 1;
        if (o->kind == DT_P2P_SEND && im->reqs[k] == MPI_REQUEST_NULL) done = 1;
        if (done) continue;
        int n = o->kind == DT_P2P_RECV
                    ? snprintf(buf + len, size - len, "%smessage #%llu from rank %d (%s)",
                               len ? ", " : "", (unsigned long long)im->op_seq[k],
                               im->world_ranks[o->peer],
                               im->matched[k] ? "arriving" : "not sent yet")
                    : snprintf(buf + len, size - len, "%sits message #%llu to rank %d (not "
                               "received yet)", len ? ", " : "",
                               (unsigned long long)im->op_seq[k], im->world_ranks[o->peer]);
        if (n < 0) break;
        len += (size_t)n;
        if (len >= size) len = size - 1;
    }
}

static dt_status mpi_p2p_wait(dt_comm *c) {
    mpi_impl *im = c->impl;
    const char *what = "sendrecv";
    dt_status st = check_alive(c, what);
    if (st != DT_SUCCESS) {
        p2p_drop(c);
        return st;
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const double waited0 = dt_comm_wait_begin();   /* the whole loop is the wait */
    for (unsigned spin = 0;; spin++) {
        /* Match receives in order per peer: a peer whose earlier receive
         * found nothing this pass is not probed again, or a later receive
         * could take a message meant for the earlier one. */
        int all_matched = 1;
        memset(im->blocked, 0, (size_t)c->size);
        for (int k = 0; k < im->n; k++) {
            const dt_p2p_op *o = &im->ops[k];
            if (o->kind != DT_P2P_RECV || im->matched[k]) continue;
            if (im->blocked[o->peer]) {
                all_matched = 0;
                continue;
            }
            int flag = 0;
            MPI_Message m;
            MPI_Status s;
            int rc = MPI_Improbe(o->peer, MPI_ANY_TAG, im->mc, &flag, &m, &s);
            if (rc != MPI_SUCCESS) {
                st = call_fail(c, what, "MPI_Improbe", rc);
                goto fail;
            }
            if (!flag) {
                im->blocked[o->peer] = 1;
                all_matched = 0;
                continue;
            }
            /* Counted in the sender's units, as it sent them (at most INT_MAX
             * of them; a byte count would not fit an int past 2 GiB). */
            int sdt = s.MPI_TAG - TAG_P2P;
            int known = sdt >= 0 && sdt < DT_DTYPE_COUNT;
            int sent = 0;
            MPI_Get_count(&s, known ? unit_type((dt_dtype)sdt) : MPI_BYTE, &sent);
            if (sdt != (int)o->dtype || sent == MPI_UNDEFINED || (size_t)sent != o->count) {
                char msg[512];
                snprintf(msg, sizeof msg,
                         "send/recv mismatch: rank %d receives %zu %s from rank %d, but rank %d "
                         "sends %zu %s to rank %d (message #%llu between them)",
                         c->world_rank, o->count, dt_dtype_name(o->dtype), im->world_ranks[o->peer],
                         im->world_ranks[o->peer], (size_t)(sent > 0 ? sent : 0),
                         known ? dt_dtype_name((dt_dtype)sdt) : "bytes",
                         c->world_rank, (unsigned long long)im->op_seq[k]);
                /* The matched message is left unreceived: the world is over. */
                dt_mpi_world_abort(im->world, DT_ERR_MISMATCH, msg);
                st = dt_error(DT_ERR_MISMATCH, "rank %d: %s", c->world_rank, msg);
                goto fail;
            }
            rc = MPI_Imrecv(im->stage + im->stage_off[k], (int)o->count, unit_type(o->dtype), &m,
                            &im->reqs[k]);
            if (rc != MPI_SUCCESS) {
                st = call_fail(c, what, "MPI_Imrecv", rc);
                goto fail;
            }
            im->matched[k] = 1;
        }
        int flag = 0;
        int rc = MPI_Testall(im->n, im->reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            st = wait_fail(c, W_ERROR, rc, what, "");
            goto fail;
        }
        if (flag && all_matched) break;
        if (world_poll(im->world)) {
            st = peer_failed(c, what);
            goto fail;
        }
        if (elapsed_ms(&t0) > c->timeout_ms) {
            char who[768];
            describe_pending(c, who, sizeof who);
            st = wait_fail(c, W_TIMEOUT, 0, what, who);
            goto fail;
        }
        backoff(spin);
    }
    dt_comm_wait_end(c, waited0);
    for (int k = 0; k < im->n; k++) {
        const dt_p2p_op *o = &im->ops[k];
        if (o->kind == DT_P2P_RECV && o->count)
            memcpy(o->buf, im->stage + im->stage_off[k], o->count * dt_dtype_size(o->dtype));
    }
    im->ops = NULL;
    im->n = 0;
    return DT_SUCCESS;
fail:
    dt_comm_wait_end(c, waited0);
    p2p_drop(c);
    return st;
}

/* ----------------------------------------------------------- lifecycle */

static void mpi_abort(dt_comm *c, dt_status status, const char *reason) {
    char msg[1024];
    snprintf(msg, sizeof msg, "rank %d aborted (%s): %s", c->world_rank, dt_status_name(status),
             reason);
    dt_mpi_world_abort(((mpi_impl *)c->impl)->world, status, msg);
}

static int mpi_aborted(const dt_comm *c) {
    return world_poll(((const mpi_impl *)c->impl)->world);
}

static void mpi_destroy(dt_comm *c) {
    mpi_impl *im = c->impl;
    dt_mpi_world *w = im->world;
    if (im->n) p2p_drop(c); /* a group started and never waited for */
    if (im->failed) bury(im->scratch);
    else free(im->scratch);
    free(im->stage); /* NULL if p2p_drop left it to a request */
    if (im->owns_mc && im->mc != MPI_COMM_NULL && !w->leak && !w->failure.set) MPI_Comm_free(&im->mc);
    w->comms--;
    free(im->world_ranks);
    free(im->v);
    free(im->reqs);
    free(im->matched);
    free(im->op_seq);
    free(im->stage_off);
    free(im->sent);
    free(im->received);
    free(im->blocked);
    free(im);
    free(c);
}

static const dt_transport_ops mpi_ops = {
    .name = "mpi",
    .collective = mpi_collective,
    .p2p_start = mpi_p2p_start,
    .p2p_wait = mpi_p2p_wait,
    .abort = mpi_abort,
    .aborted = mpi_aborted,
    .destroy = mpi_destroy,
};
