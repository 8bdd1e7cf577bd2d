/* tests/test_mpi.c — the MPI transport and process launch.
 *
 * `make test` runs this binary under `mpirun -np N` for N = 1..4
 * (tests/run_tests.sh); run it by hand the same way:
 *     mpirun --oversubscribe -np 3 build/tests/test_mpi
 * Every process runs the same cases; a case is one or more
 * dt_launch(0, ...) over MPI (one rank per process). Rank functions only
 * record: each launch ends by all-gathering every rank's error count, so
 * every process asserts on all ranks' results and reaches the same verdict;
 * asserts come after the launches, so a failing case never leaves processes
 * out of step. Only rank 0 prints (DT_TEST_MPI_VERBOSE=1: every rank).
 *
 * Started without mpirun, or from a build without MPI, the suite reports
 * itself skipped with the reason (DT_TEST_MPI_SKIP, set by run_tests.sh,
 * says why mpirun was not used).
 *
 * Covered: launch (world size 0 / N / wrong), every collective (fp32 and
 * bf16, in place, every root, zero and uneven counts) against references
 * from (seed, rank, index) and the local transport's bits, checks on
 * (DT_CHECK), all_to_all (every dtype; its mismatch, a peer's failure, a
 * missing member), the communication counters (exact calls and bytes per
 * kind, reset, a split's own, wait time for a late rank), grouped send/recv (self, many per pair, zero length) and
 * mismatches of size and dtype, split, the ring rotator, shard / gather /
 * redistribute round trips (1-D, and 2-D at N = 4), attention forward and
 * backward (o, dq, dk, dv) bit for bit against the local transport, collective mismatches, a timeout, a peer's
 * failure and dt_comm_abort reaching the others before the timeout (an
 * abort whose status is DT_SUCCESS too), a rank that comes to a split after
 * the others timed out, a receive that stalls after MPI matched it (what
 * arrives after the timeout never lands in the caller's buffer), the
 * bootstrap broadcast after its root failed, and a healthy launch after all
 * of that.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention/attention.h"
#include "collectives/ring.h"
#ifdef DT_HAVE_MPI
#include "collectives/transport_mpi.h"
#endif
#include "dtensor/dtensor.h"
#include "dtensor/launch_env.h"

#define MAXP 64
#define N 37

static int g_rank = 0, g_size = 1; /* this process, from the launcher */

/* ------------------------------------------------------------ helpers */

static float value(uint64_t seed, int r, size_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)r * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    return (float)((int)(x % 257) - 128) / 4.0f;
}

static void put(void *buf, dt_dtype dt, size_t i, float v) { dt_value_set(buf, dt, i, v); }
static float get(const void *buf, dt_dtype dt, size_t i) { return dt_value_get(buf, dt, i); }
static float rounded(dt_dtype dt, double v) {
    return dt_value_round((float)v, dt);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* What a case's launch leaves behind, the same on every process. */
typedef struct outcome {
    dt_status st;        /* dt_launch's status */
    char msg[1024];      /* and message */
    int bad[MAXP];       /* per rank: wrong elements or wrong statuses */
    int shared;          /* bad[] was all-gathered */
} outcome;

static dt_status launch_mpi(dt_rank_fn fn, void *arg, long timeout_ms, dt_check_mode checks,
                            outcome *o) {
    dt_launch_options opts = DT_LAUNCH_OPTIONS_INIT;
    opts.backend = DT_BACKEND_CPU;
    opts.transport = DT_TRANSPORT_MPI;
    opts.timeout_ms = timeout_ms;
    opts.checks = checks;
    dt_status st = dt_launch(0, fn, arg, &opts);
    if (o) {
        o->st = st;
        snprintf(o->msg, sizeof o->msg, "%s", st == DT_SUCCESS ? "" : dt_last_error());
    }
    return st;
}

/* Inside a launch: every rank learns every rank's error count. */
static dt_status share_bad(dt_context *ctx, outcome *o, int mine) {
    int32_t v = mine;
    int32_t all[MAXP];
    dt_status st = dt_comm_all_gather(dt_context_comm(ctx), &v, all, sizeof v, DT_U8);
    if (st != DT_SUCCESS) return st;
    for (int r = 0; r < dt_context_world_size(ctx); r++) o->bad[r] = all[r];
    o->shared = 1;
    return DT_SUCCESS;
}

static void assert_clean(const outcome *o, const char *what) {
    if (o->st != DT_SUCCESS) print_error("%s: %s: %s\n", what, dt_status_name(o->st), o->msg);
    assert_int_equal(o->st, DT_SUCCESS);
    assert_true(o->shared);
    for (int r = 0; r < g_size; r++) {
        if (o->bad[r]) print_error("%s: rank %d: %d wrong\n", what, r, o->bad[r]);
        assert_int_equal(o->bad[r], 0);
    }
}

/* ------------------------------------------------------------- launch */

typedef struct ids_case {
    outcome o;
} ids_case;

static dt_status rank_ids(dt_context *ctx, void *arg) {
    ids_case *c = arg;
    int bad = 0;
    if (dt_context_rank(ctx) != g_rank) bad++;
    if (dt_context_world_size(ctx) != g_size) bad++;
    if (dt_context_transport(ctx) != DT_TRANSPORT_MPI) bad++;
    if (dt_context_backend(ctx) != DT_BACKEND_CPU) bad++;
    if (dt_comm_world_rank(dt_context_comm(ctx)) != g_rank) bad++;
    return share_bad(ctx, &c->o, bad);
}

static void test_launch(void **state) {
    (void)state;
    ids_case c;
    memset(&c, 0, sizeof c);
    launch_mpi(rank_ids, &c, 20000, DT_CHECK_AUTO, &c.o);
    assert_clean(&c.o, "dt_launch(0)");
    /* The launcher's size works too; any other fails alike on every process. */
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CPU;
    o.transport = DT_TRANSPORT_MPI;
    o.timeout_ms = 20000;
    memset(&c, 0, sizeof c);
    dt_status st = dt_launch(g_size, rank_ids, &c, &o);
    assert_int_equal(st, DT_SUCCESS);
    st = dt_launch(g_size + 1, rank_ids, &c, &o);
    assert_int_equal(st, DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "pass 0"));
    /* Transport AUTO picks mpi under mpirun (with 0 or the right size). */
    memset(&c, 0, sizeof c);
    o.transport = DT_TRANSPORT_AUTO;
    assert_int_equal(dt_launch(0, rank_ids, &c, &o), DT_SUCCESS);
    st = dt_launch(g_size + 2, rank_ids, &c, &o);
    assert_int_equal(st, DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "DT_TRANSPORT=local"));
    /* Threads are still there when asked for, inside an MPI process. */
    o.transport = DT_TRANSPORT_LOCAL;
    assert_int_equal(dt_launch(0, rank_ids, &c, &o), DT_ERR_INVALID_ARGUMENT);
}

/* --------------------------------------------------------- collectives */

typedef struct coll_case {
    outcome o;
    dt_dtype dtype;
    int in_place;
    size_t count;
    uint64_t seed;
} coll_case;

static dt_status rank_reductions(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    dt_comm *comm = dt_context_comm(ctx);
    size_t n = c->count, es = dt_dtype_size(c->dtype);
    char *big = calloc((size_t)p * n + 1, es), *small = calloc(n + 1, es);
    int bad = 0;
    dt_status st = DT_SUCCESS;
    for (int op = 0; op < DT_REDUCE_OP_COUNT && st == DT_SUCCESS; op++) {
        for (size_t i = 0; i < n; i++) put(small, c->dtype, i, value(c->seed, r, i));
        char *out = c->in_place ? small : big;
        st = dt_comm_all_reduce(comm, small, out, n, c->dtype, (dt_reduce_op)op);
        if (st != DT_SUCCESS) break;
        for (size_t i = 0; i < n; i++) {
            double ref = value(c->seed, 0, i);
            for (int q = 1; q < p; q++)
                ref = op == DT_REDUCE_SUM ? ref + value(c->seed, q, i) : fmax(ref, value(c->seed, q, i));
            if (get(out, c->dtype, i) != rounded(c->dtype, ref)) bad++;
        }
    }
    /* reduce_scatter: rank r gets the sum over q of rank q's block r. */
    if (st == DT_SUCCESS) {
        for (size_t i = 0; i < (size_t)p * n; i++) put(big, c->dtype, i, value(c->seed + 1, r, i));
        void *out = c->in_place ? big + (size_t)r * n * es : small;
        st = dt_comm_reduce_scatter(comm, big, out, n, c->dtype, DT_REDUCE_SUM);
        for (size_t i = 0; st == DT_SUCCESS && i < n; i++) {
            double ref = 0;
            for (int q = 0; q < p; q++) ref += value(c->seed + 1, q, (size_t)r * n + i);
            if (get(out, c->dtype, i) != rounded(c->dtype, ref)) bad++;
        }
    }
    free(big);
    free(small);
    if (st != DT_SUCCESS) return st;
    return share_bad(ctx, &c->o, bad);
}

static void test_reductions(void **state) {
    (void)state;
    size_t counts[] = {N, 0, 1, 3, 1000};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int dt = 0; dt < 2; dt++)
            for (int ip = 0; ip < 2; ip++) {
                coll_case c;
                memset(&c, 0, sizeof c);
                c.dtype = dt ? DT_BF16 : DT_F32;
                c.in_place = ip;
                c.count = counts[k];
                c.seed = 11 + k;
                launch_mpi(rank_reductions, &c, 20000, DT_CHECK_AUTO, &c.o);
                char what[96];
                snprintf(what, sizeof what, "reductions count=%zu %s%s", c.count,
                         dt_dtype_name(c.dtype), ip ? " in place" : "");
                assert_clean(&c.o, what);
            }
}

/* Arbitrary fp32 data: every rank gets exactly the rank-order sum, the bits
 * of the local transport. */
static dt_status rank_bits(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    float send[N], recv[N], ref[N];
    for (size_t i = 0; i < N; i++) send[i] = value(c->seed, r, i) * 0.3333333f + 1e-3f * (float)r;
    dt_status st = dt_comm_all_reduce(dt_context_comm(ctx), send, recv, N, DT_F32, DT_REDUCE_SUM);
    if (st != DT_SUCCESS) return st;
    for (size_t i = 0; i < N; i++) {
        float acc = 0;
        for (int q = 0; q < p; q++) {
            float v = value(c->seed, q, i) * 0.3333333f + 1e-3f * (float)q;
            acc = q ? acc + v : v;
        }
        ref[i] = acc;
    }
    return share_bad(ctx, &c->o, memcmp(ref, recv, sizeof ref) != 0);
}

static void test_reduction_bits(void **state) {
    (void)state;
    coll_case c;
    memset(&c, 0, sizeof c);
    c.seed = 7;
    launch_mpi(rank_bits, &c, 20000, DT_CHECK_AUTO, &c.o);
    assert_clean(&c.o, "all_reduce bits");
}

static dt_status rank_moves(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    dt_comm *comm = dt_context_comm(ctx);
    float *big = calloc((size_t)p * N, sizeof(float)), buf[N];
    int bad = 0;
    dt_status st = DT_SUCCESS;
    /* all_gather, plain and in place */
    for (int ip = 0; ip < 2 && st == DT_SUCCESS; ip++) {
        float *send = ip ? big + (size_t)r * N : buf;
        for (size_t i = 0; i < N; i++) send[i] = value(c->seed, r, i);
        st = dt_comm_all_gather(comm, send, big, N, DT_F32);
        for (int q = 0; st == DT_SUCCESS && q < p; q++)
            for (size_t i = 0; i < N; i++) bad += big[(size_t)q * N + i] != value(c->seed, q, i);
    }
    for (int root = 0; root < p && st == DT_SUCCESS; root++) {
        for (size_t i = 0; i < N; i++) buf[i] = value(c->seed, r, i);
        st = dt_comm_broadcast(comm, buf, N, DT_F32, root);
        if (st != DT_SUCCESS) break;
        for (size_t i = 0; i < N; i++) bad += buf[i] != value(c->seed, root, i);
        for (size_t i = 0; i < (size_t)p * N; i++) big[i] = value(c->seed + 2, r, i);
        st = dt_comm_scatter(comm, r == root ? big : NULL, buf, N, DT_F32, root);
        if (st != DT_SUCCESS) break;
        for (size_t i = 0; i < N; i++) bad += buf[i] != value(c->seed + 2, root, (size_t)r * N + i);
        for (size_t i = 0; i < N; i++) buf[i] = value(c->seed + 3, r, i);
        memset(big, 0, (size_t)p * N * sizeof(float));
        st = dt_comm_gather(comm, buf, r == root ? big : NULL, N, DT_F32, root);
        if (st != DT_SUCCESS || r != root) continue;
        for (int q = 0; q < p; q++)
            for (size_t i = 0; i < N; i++) bad += big[(size_t)q * N + i] != value(c->seed + 3, q, i);
    }
    for (int k = 0; k < 5 && st == DT_SUCCESS; k++) st = dt_comm_barrier(comm);
    free(big);
    if (st != DT_SUCCESS) return st;
    return share_bad(ctx, &c->o, bad);
}

static void test_gather_broadcast_scatter(void **state) {
    (void)state;
    for (int checks = 0; checks < 2; checks++) {
        coll_case c;
        memset(&c, 0, sizeof c);
        c.seed = 5;
        launch_mpi(rank_moves, &c, 20000, checks ? DT_CHECK_ON : DT_CHECK_OFF, &c.o);
        assert_clean(&c.o, checks ? "moves with DT_CHECK" : "moves");
    }
}

/* --------------------------------------------------------- all_to_all */

static void sleep_ms(long ms);

/* Element i of rank r's data (seed), stored at index `at`: value() as the
 * float types hold it, integers made from it for u8 and i32. */
static void put_any(void *buf, dt_dtype dt, size_t at, uint64_t seed, int r, size_t i) {
    const int v = (int)(value(seed, r, i) * 4.0f);
    switch (dt) {
    case DT_U8: ((uint8_t *)buf)[at] = (uint8_t)(v & 0xff); break;
    case DT_I32: ((int32_t *)buf)[at] = v * 65537 + r; break;
    default: put(buf, dt, at, value(seed, r, i)); break;
    }
}

/* Every dtype, counts 0, 1, N and 1000: rank r's recv block q is rank q's
 * send block r, bytes compared, nothing past recv written, send untouched. */
static dt_status rank_all_to_all(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    static const dt_dtype types[] = {DT_F32, DT_BF16, DT_F16, DT_U8, DT_I32};
    static const size_t counts[] = {N, 0, 1, 1000};
    int bad = 0;
    dt_status st = DT_SUCCESS;
    for (size_t t = 0; t < sizeof types / sizeof types[0] && st == DT_SUCCESS; t++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0] && st == DT_SUCCESS; k++) {
            const dt_dtype dt = types[t];
            const size_t n = counts[k], es = dt_dtype_size(dt), all = (size_t)p * n;
            const uint64_t seed = c->seed + 10 * t + k;
            char *send = malloc(all * es + 1), *recv = malloc(all * es + 1), want[8];
            if (!send || !recv) st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
            for (size_t i = 0; st == DT_SUCCESS && i < all; i++) put_any(send, dt, i, seed, r, i);
            if (st == DT_SUCCESS) memset(recv, 0xa5, all * es + 1);
            if (st == DT_SUCCESS) st = dt_comm_all_to_all(dt_context_comm(ctx), send, recv, n, dt);
            for (int q = 0; st == DT_SUCCESS && q < p; q++)
                for (size_t i = 0; i < n; i++) {
                    put_any(want, dt, 0, seed, q, (size_t)r * n + i);
                    bad += memcmp(recv + ((size_t)q * n + i) * es, want, es) != 0;
                    put_any(want, dt, 0, seed, r, (size_t)q * n + i);
                    bad += memcmp(send + ((size_t)q * n + i) * es, want, es) != 0;
                }
            if (st == DT_SUCCESS) bad += (unsigned char)recv[all * es] != 0xa5;
            free(send);
            free(recv);
        }
    if (st != DT_SUCCESS) return st;
    return share_bad(ctx, &c->o, bad);
}

static void test_all_to_all(void **state) {
    (void)state;
    for (int checks = 0; checks < 2; checks++) {
        coll_case c;
        memset(&c, 0, sizeof c);
        c.seed = 31;
        launch_mpi(rank_all_to_all, &c, 20000, checks ? DT_CHECK_ON : DT_CHECK_OFF, &c.o);
        assert_clean(&c.o, checks ? "all_to_all with DT_CHECK" : "all_to_all");
    }
}

/* ----------------------------------------------------------- counters */

/* One kind's counters against comm.h's definition: 1 if they differ. */
static int kind_differs(int r, const dt_comm_counters *k, dt_comm_kind kind, uint64_t calls,
                        uint64_t sent, uint64_t recv) {
    if (k->calls[kind] == calls && k->bytes_sent[kind] == sent && k->bytes_recv[kind] == recv)
        return 0;
    print_error("rank %d: %s: %llu calls, %llu sent, %llu received; want %llu, %llu, %llu\n", r,
                dt_comm_kind_name(kind), (unsigned long long)k->calls[kind],
                (unsigned long long)k->bytes_sent[kind], (unsigned long long)k->bytes_recv[kind],
                (unsigned long long)calls, (unsigned long long)sent, (unsigned long long)recv);
    return 1;
}

static int counters_zero(const dt_comm_counters *k) {
    for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++)
        if (k->calls[kind] || k->bytes_sent[kind] || k->bytes_recv[kind]) return 0;
    return k->wait_ms == 0;
}

#define LATE_MS 50

/* The calls and bytes comm.h defines after a known sequence of every kind
 * (rejected calls among them), the same as on the local transport; reset;
 * a split's counters its own; and wait_ms: after a barrier the last rank
 * sleeps LATE_MS before an all_to_all, which the others wait for. */
static dt_status rank_counters(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    const int r = dt_context_rank(ctx), p = dt_context_world_size(ctx), root = p - 1;
    const uint64_t P1 = (uint64_t)p - 1;
    dt_comm *comm = dt_context_comm(ctx), *sub = NULL;
    float *f = calloc(64 * (size_t)p, sizeof *f), *g = calloc(64 * (size_t)p, sizeof *g), h[8];
    uint16_t *b = calloc(128 * (size_t)p, sizeof *b);
    uint8_t *u = calloc(8 * (size_t)p, 1), *v = calloc(8 * (size_t)p, 1);
    int bad = 0;
    dt_comm_counters k, ks;
    dt_status st = f && g && b && u && v ? dt_comm_counters_get(comm, &k)
                                         : dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
    if (st == DT_SUCCESS) bad += !counters_zero(&k);
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    dt_p2p_op g1[4] = {{DT_P2P_SEND, next, f, 5, DT_F32}, {DT_P2P_RECV, prev, g, 5, DT_F32},
                       {DT_P2P_SEND, r, f, 3, DT_F32}, {DT_P2P_RECV, r, h, 3, DT_F32}};
    dt_p2p_op g2[2] = {{DT_P2P_RECV, prev, b + 8, 2, DT_BF16}, {DT_P2P_SEND, next, b, 2, DT_BF16}};
#define DO(call) if (st == DT_SUCCESS) st = (call)
    DO(dt_comm_all_reduce(comm, f, g, N, DT_F32, DT_REDUCE_SUM));
    DO(dt_comm_all_reduce(comm, f, f, N, DT_F32, DT_REDUCE_MAX));
    DO(dt_comm_all_gather(comm, b, b + 64, N, DT_BF16));
    DO(dt_comm_reduce_scatter(comm, b, b + 64 * (size_t)p, 5, DT_F16, DT_REDUCE_SUM));
    DO(dt_comm_all_to_all(comm, f, g, 3, DT_F32));
    DO(dt_comm_all_to_all(comm, u, v, 7, DT_U8));
    DO(dt_comm_broadcast(comm, f, N, DT_F32, root));
    DO(dt_comm_scatter(comm, r == 0 ? f : NULL, g, 4, DT_F32, 0));
    DO(dt_comm_gather(comm, b, r == root ? b + 64 : NULL, 6, DT_BF16, root));
    for (int i = 0; i < 3; i++) DO(dt_comm_barrier(comm));
    DO(dt_comm_sendrecv(comm, g1, 4));
    DO(dt_comm_p2p_start(comm, g2, 2));
    DO(dt_comm_p2p_wait(comm));
#undef DO
    if (st == DT_SUCCESS)   /* rejected before the transport: not counted */
        bad += dt_comm_all_to_all(comm, f, f, 1, DT_F32) != DT_ERR_INVALID_ARGUMENT;
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k);
    if (st == DT_SUCCESS) {
        const uint64_t ar = 2 * P1 * ((N + (uint64_t)p - 1) / (uint64_t)p) * 4;
        const uint64_t p2p = p > 1 ? 5 * 4 + 2 * 2 : 0;
        bad += kind_differs(r, &k, DT_COMM_P2P, 2, p2p, p2p);
        bad += kind_differs(r, &k, DT_COMM_ALL_REDUCE, 2, 2 * ar, 2 * ar);
        bad += kind_differs(r, &k, DT_COMM_ALL_GATHER, 1, P1 * N * 2, P1 * N * 2);
        bad += kind_differs(r, &k, DT_COMM_REDUCE_SCATTER, 1, P1 * 5 * 2, P1 * 5 * 2);
        bad += kind_differs(r, &k, DT_COMM_ALL_TO_ALL, 2, P1 * (3 * 4 + 7), P1 * (3 * 4 + 7));
        bad += kind_differs(r, &k, DT_COMM_BROADCAST, 1, r == root ? P1 * N * 4 : 0,
                            r == root ? 0 : N * 4);
        bad += kind_differs(r, &k, DT_COMM_SCATTER, 1, r == 0 ? P1 * 16 : 0, r == 0 ? 0 : 16);
        bad += kind_differs(r, &k, DT_COMM_GATHER, 1, r == root ? 0 : 12, r == root ? P1 * 12 : 0);
        bad += kind_differs(r, &k, DT_COMM_BARRIER, 3, 0, 0);
        bad += !(k.wait_ms >= 0);
    }
    /* reset, then a split: its counters start at zero and are its own */
    dt_comm_counters_reset(comm);
    if (st == DT_SUCCESS) st = dt_comm_split(comm, r % 2, r, &sub);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(sub, &ks);
    if (st == DT_SUCCESS) bad += !counters_zero(&ks);
    if (st == DT_SUCCESS) st = dt_comm_all_to_all(sub, f, g, 4, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_all_gather(comm, f, g, 2, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(sub, &ks);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k);
    if (st == DT_SUCCESS) {
        const uint64_t s1 = (uint64_t)dt_comm_size(sub) - 1;
        for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++) {
            const dt_comm_kind kd = (dt_comm_kind)kind;
            bad += kind_differs(r, &ks, kd, kd == DT_COMM_ALL_TO_ALL, kd == DT_COMM_ALL_TO_ALL ? s1 * 16 : 0,
                                kd == DT_COMM_ALL_TO_ALL ? s1 * 16 : 0);
            bad += kind_differs(r, &k, kd, kd == DT_COMM_ALL_GATHER, kd == DT_COMM_ALL_GATHER ? P1 * 8 : 0,
                                kd == DT_COMM_ALL_GATHER ? P1 * 8 : 0);
        }
    }
    dt_comm_destroy(sub);
    /* wait_ms: the others wait for the late rank */
    dt_comm_counters k0, k1;
    if (st == DT_SUCCESS) st = dt_comm_barrier(comm);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k0);
    if (st == DT_SUCCESS && r == root && p > 1) sleep_ms(LATE_MS);
    if (st == DT_SUCCESS) st = dt_comm_all_to_all(comm, f, g, 2, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k1);
    if (st == DT_SUCCESS) {
        const double waited = k1.wait_ms - k0.wait_ms;
        if (waited < 0 || (r != root && waited < LATE_MS - 10)) {
            print_error("rank %d: waited %.1f ms for the late rank's all_to_all\n", r, waited);
            bad++;
        }
    }
    free(f);
    free(g);
    free(b);
    free(u);
    free(v);
    if (st != DT_SUCCESS) return st;
    return share_bad(ctx, &c->o, bad);
}

static void test_counters(void **state) {
    (void)state;
    for (int checks = 0; checks < 2; checks++) {
        coll_case c;
        memset(&c, 0, sizeof c);
        launch_mpi(rank_counters, &c, 20000, checks ? DT_CHECK_ON : DT_CHECK_OFF, &c.o);
        assert_clean(&c.o, checks ? "counters with DT_CHECK" : "counters");
    }
}

/* -------------------------------------------------------------- p2p */

static dt_status rank_p2p(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    int next = (r + 1) % p, prev = (r + p - 1) % p;
    enum { M = 4 };
    float out[M][N], in[M][N], self_out[N], self_in[N];
    dt_bf16 bout[N], bin[N];
    int bad = 0;
    /* Several messages per pair keep their order; a zero-length one; to self. */
    for (int m = 0; m < M; m++)
        for (size_t i = 0; i < N; i++) out[m][i] = value(c->seed + (uint64_t)m, r, i);
    for (size_t i = 0; i < N; i++) {
        self_out[i] = value(c->seed + 50, r, i);
        bout[i] = dt_f32_to_bf16(value(c->seed + 60, r, i));
    }
    memset(in, 0, sizeof in);
    dt_p2p_op ops[2 * M + 5];
    int n = 0;
    for (int m = 0; m < M; m++) {
        ops[n++] = (dt_p2p_op){DT_P2P_RECV, prev, in[m], N - (size_t)m, DT_F32};
        ops[n++] = (dt_p2p_op){DT_P2P_SEND, next, out[m], N - (size_t)m, DT_F32};
    }
    ops[n++] = (dt_p2p_op){DT_P2P_SEND, next, NULL, 0, DT_F32};
    ops[n++] = (dt_p2p_op){DT_P2P_RECV, prev, NULL, 0, DT_F32};
    ops[n++] = (dt_p2p_op){DT_P2P_RECV, r, self_in, N, DT_F32};
    ops[n++] = (dt_p2p_op){DT_P2P_SEND, r, self_out, N, DT_F32};
    ops[n++] = (dt_p2p_op){DT_P2P_SEND, next, bout, N, DT_BF16};
    dt_status st = dt_comm_p2p_start(dt_context_comm(ctx), ops, n);
    /* A second operation list in the same group is not allowed; receive the
     * bf16 message in a group of its own after this one. */
    if (st == DT_SUCCESS) st = dt_comm_p2p_wait(dt_context_comm(ctx));
    if (st == DT_SUCCESS) {
        dt_p2p_op rb = {DT_P2P_RECV, prev, bin, N, DT_BF16};
        st = dt_comm_sendrecv(dt_context_comm(ctx), &rb, 1);
    }
    if (st != DT_SUCCESS) return st;
    for (int m = 0; m < M; m++)
        for (size_t i = 0; i < N - (size_t)m; i++) bad += in[m][i] != value(c->seed + (uint64_t)m, prev, i);
    for (size_t i = 0; i < N; i++) {
        bad += self_in[i] != value(c->seed + 50, r, i);
        bad += bin[i] != dt_f32_to_bf16(value(c->seed + 60, prev, i));
    }
    return share_bad(ctx, &c->o, bad);
}

static void test_sendrecv(void **state) {
    (void)state;
    coll_case c;
    memset(&c, 0, sizeof c);
    c.seed = 21;
    launch_mpi(rank_p2p, &c, 20000, DT_CHECK_AUTO, &c.o);
    assert_clean(&c.o, "sendrecv");
}

typedef struct mismatch_case {
    outcome o;
    int dtype_case;          /* 0: sizes differ; 1: same bytes, dtypes differ */
    dt_status first[MAXP];   /* each rank's status from its first call */
} mismatch_case;

/* The last rank receives from rank 0 something else than rank 0 sends;
 * everyone then meets in a barrier. */
static dt_status rank_p2p_mismatch(dt_context *ctx, void *arg) {
    mismatch_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx), last = p - 1;
    float f[16] = {0};
    dt_bf16 h[32] = {0};
    dt_p2p_op ops[2];
    int n = 0;
    if (r == 0) ops[n++] = c->dtype_case ? (dt_p2p_op){DT_P2P_SEND, last, h, 20, DT_BF16}
                                         : (dt_p2p_op){DT_P2P_SEND, last, f, 12, DT_F32};
    if (r == last) ops[n++] = (dt_p2p_op){DT_P2P_RECV, 0, f, 10, DT_F32};
    dt_status st = n ? dt_comm_sendrecv(dt_context_comm(ctx), ops, n) : DT_SUCCESS;
    if (st == DT_SUCCESS) st = dt_comm_barrier(dt_context_comm(ctx));
    c->first[r] = st;
    return st;
}

static void test_sendrecv_mismatch(void **state) {
    (void)state;
    for (int dc = 0; dc < 2; dc++) {
        mismatch_case c;
        memset(&c, 0, sizeof c);
        c.dtype_case = dc;
        launch_mpi(rank_p2p_mismatch, &c, 20000, DT_CHECK_OFF, &c.o);
        if (c.o.st != DT_ERR_MISMATCH) print_error("%s: %s\n", dt_status_name(c.o.st), c.o.msg);
        assert_int_equal(c.o.st, DT_ERR_MISMATCH);
        char want[160];
        snprintf(want, sizeof want, "rank %d receives 10 fp32 from rank 0, but rank 0 sends %s to "
                 "rank %d", g_size - 1, dc ? "20 bf16" : "12 fp32", g_size - 1);
        if (!strstr(c.o.msg, want)) print_error("message: %s\nwanted: %s\n", c.o.msg, want);
        assert_non_null(strstr(c.o.msg, want));
        /* This process's own call failed too (the receiver, or a peer told). */
        assert_int_equal(c.first[g_rank], DT_ERR_MISMATCH);
    }
}

/* ----------------------------------------------------------- split, ring */

static dt_status rank_split(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    int bad = 0;
    dt_status st = DT_SUCCESS;
    for (int k = 1; k <= 3 && st == DT_SUCCESS; k++) {
        dt_comm *sub = NULL;
        /* Rank 0 opts out of the k = 3 split. */
        int color = k == 3 && r == 0 ? -1 : r % k;
        st = dt_comm_split(dt_context_comm(ctx), color, -r, &sub);
        if (st != DT_SUCCESS) break;
        if (color < 0) {
            bad += sub != NULL;
            continue;
        }
        int members = 0, pos = 0;
        float ref = 0, got = 0, mine = (float)r;
        for (int q = 0; q < p; q++)
            if (q % k == r % k && !(k == 3 && q == 0)) {
                members++;
                ref += (float)q;
                if (q > r) pos++;
            }
        bad += dt_comm_size(sub) != members;
        bad += dt_comm_rank(sub) != pos;
        bad += dt_comm_world_rank(sub) != r;
        st = dt_comm_all_reduce(sub, &mine, &got, 1, DT_F32, DT_REDUCE_SUM);
        bad += got != ref;
        /* p2p on the sub-communicator: its own ranks. */
        if (st == DT_SUCCESS) {
            int sz = dt_comm_size(sub), me = dt_comm_rank(sub);
            float s = (float)r, in = -1;
            dt_p2p_op ops[2] = {{DT_P2P_SEND, (me + 1) % sz, &s, 1, DT_F32},
                                {DT_P2P_RECV, (me + sz - 1) % sz, &in, 1, DT_F32}};
            st = dt_comm_sendrecv(sub, ops, 2);
            bad += in < 0;
        }
        dt_comm_destroy(sub);
    }
    if (st != DT_SUCCESS) return st;
    return share_bad(ctx, &c->o, bad);
}

static void test_split(void **state) {
    (void)state;
    coll_case c;
    memset(&c, 0, sizeof c);
    launch_mpi(rank_split, &c, 20000, DT_CHECK_AUTO, &c.o);
    assert_clean(&c.o, "split");
}

#define RING_BYTES 1001

static dt_status rank_ring(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int j = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    int bad = 0;
    dt_ring *ring = NULL;
    dt_status st = dt_ring_create(dt_context_comm(ctx), RING_BYTES, DT_RING_FORWARD, &ring);
    if (st != DT_SUCCESS) return st;
    unsigned char *b = dt_ring_current(ring);
    for (size_t i = 0; i < RING_BYTES; i++) b[i] = (unsigned char)(j * 37 + i * 11 + 5);
    for (int t = 0; t < 2 * p && st == DT_SUCCESS; t++) {
        int src = ((j - t) % p + p) % p;
        b = dt_ring_current(ring);
        for (size_t i = 0; i < RING_BYTES; i++) bad += b[i] != (unsigned char)(src * 37 + i * 11 + 5);
        bad += dt_ring_source(ring) != src;
        st = dt_ring_step(ring);
    }
    dt_ring_destroy(ring);
    if (st != DT_SUCCESS) return st;
    return share_bad(ctx, &c->o, bad);
}

static void test_ring(void **state) {
    (void)state;
    coll_case c;
    memset(&c, 0, sizeof c);
    launch_mpi(rank_ring, &c, 20000, DT_CHECK_AUTO, &c.o);
    assert_clean(&c.o, "ring");
}

/* ---------------------------------------------- tensors and attention */

/* Shard from root, redistribute through every order, replicate, gather:
 * the global tensor is fill_random's everywhere. 2-D mesh at 4 ranks. */
static dt_status rank_roundtrip(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    int two_d = p == 4;
    int sizes[2] = {two_d ? 2 : p, 2};
    dt_mesh *mesh = NULL;
    dt_tensor *full = NULL, *a = NULL, *b = NULL, *rep = NULL, *back = NULL;
    int bad = 0;
    dt_status st;
    int64_t shape[2] = {8 * p, 6 * p};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, two_d ? 2 : 1, sizes, NULL, &mesh), out);
    if (r == 1 % p) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 2, shape, NULL, &full), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(full, c->seed), out);
    }
    dt_layout l1 = two_d ? dt_layout_2d(dt_shard(0, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_ZIGZAG))
                         : dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED));
    dt_layout l2 = two_d ? dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_shard(0, DT_ORDER_ZIGZAG))
                         : dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 1 % p, full, &l1, &a), out);
    DT_TRY_GOTO(st, dt_tensor_redistribute(a, &l2, &b), out);
    DT_TRY_GOTO(st, dt_tensor_replicate(b, &rep), out);
    const float *x = dt_tensor_data_const(rep);
    for (int64_t i = 0; i < shape[0] * shape[1]; i++) bad += x[i] != dt_random_value(c->seed, (uint64_t)i);
    DT_TRY_GOTO(st, dt_tensor_gather(b, 0, &back), out);
    if (r == 0) {
        const float *y = dt_tensor_data_const(back);
        for (int64_t i = 0; i < shape[0] * shape[1]; i++) bad += y[i] != dt_random_value(c->seed, (uint64_t)i);
    }
    st = share_bad(ctx, &c->o, bad);
out:
    dt_tensor_destroy(back);
    dt_tensor_destroy(rep);
    dt_tensor_destroy(b);
    dt_tensor_destroy(a);
    dt_tensor_destroy(full);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_tensor_roundtrip(void **state) {
    (void)state;
    coll_case c;
    memset(&c, 0, sizeof c);
    c.seed = 99;
    launch_mpi(rank_roundtrip, &c, 20000, DT_CHECK_AUTO, &c.o);
    assert_clean(&c.o, "shard/redistribute/gather");
}

typedef struct attn_case {
    outcome o;
    int p;
    dt_dtype dtype;
    float *ref;          /* the local transport's o, dq, dk, dv, each [B, S, H, D] */
    size_t numel;
    int mismatches;      /* set by the local launch's root */
} attn_case;

#define A_B 1
#define A_H 2
#define A_D 16

/* The same attention on either transport: striped Q, K, V and dO from
 * fill_random, forward and backward; o, dq, dk, dv gathered on rank 0 into
 * out[0..4*numel). */
static dt_status attention_run(dt_context *ctx, attn_case *c, float *out) {
    int p = dt_context_world_size(ctx);
    int sizes[1] = {p};
    dt_mesh *mesh = NULL;
    dt_tensor *t[5] = {NULL}, *res[4] = {NULL}, *lse = NULL, *full = NULL;
    dt_tensor **q = &t[0], **k = &t[1], **v = &t[2], **dout = &t[3];
    dt_status st;
    int64_t shape[4] = {A_B, 16 * p, A_H, A_D};
    dt_layout l = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, NULL, &mesh), done);
    for (int i = 0; i < 4; i++) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, shape, &l, &t[i]), done);
        DT_TRY_GOTO(st, dt_tensor_fill_random(t[i], (uint64_t)i + 1), done);
    }
    DT_TRY_GOTO(st, dt_attention_forward(*q, *k, *v, NULL, &res[0], &lse), done);
    DT_TRY_GOTO(st, dt_attention_backward(*q, *k, *v, res[0], lse, *dout, NULL, &res[1], &res[2],
                                          &res[3]), done);
    for (int i = 0; i < 4; i++) {
        DT_TRY_GOTO(st, dt_tensor_gather(res[i], 0, &full), done);
        if (full) {
            const void *d = dt_tensor_data_const(full);
            for (size_t e = 0; e < c->numel; e++) out[(size_t)i * c->numel + e] = get(d, c->dtype, e);
        }
        dt_tensor_destroy(full);
        full = NULL;
    }
done:
    dt_tensor_destroy(full);
    dt_tensor_destroy(lse);
    for (int i = 0; i < 4; i++) dt_tensor_destroy(res[i]);
    for (int i = 0; i < 4; i++) dt_tensor_destroy(t[i]);
    dt_mesh_destroy(mesh);
    return st;
}

static dt_status rank_attention_local(dt_context *ctx, void *arg) {
    attn_case *c = arg;
    return attention_run(ctx, c, c->ref);
}

static dt_status rank_attention_mpi(dt_context *ctx, void *arg) {
    attn_case *c = arg;
    float *got = calloc(4 * c->numel, sizeof(float));
    if (!got) return dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
    dt_status st = attention_run(ctx, c, got);
    int bad = 0;
    if (st == DT_SUCCESS && dt_context_rank(ctx) == 0) {
        /* Same kernels, same ring order, same reductions: the same bits. */
        for (size_t i = 0; i < 4 * c->numel; i++)
            bad += memcmp(&got[i], &c->ref[i], sizeof(float)) != 0;
        if (bad) fprintf(stderr, "attention: %d of %zu values of o, dq, dk, dv differ from the "
                         "local transport\n", bad, 4 * c->numel);
    }
    free(got);
    if (st != DT_SUCCESS) return st;
    return share_bad(ctx, &c->o, bad);
}

static void test_attention_vs_local(void **state) {
    (void)state;
    for (int dt = 0; dt < 2; dt++) {
        attn_case c;
        memset(&c, 0, sizeof c);
        c.p = g_size;
        c.dtype = dt ? DT_BF16 : DT_F32;
        c.numel = (size_t)A_B * 16 * (size_t)g_size * A_H * A_D;
        c.ref = calloc(4 * c.numel, sizeof(float));
        assert_non_null(c.ref);
        /* The reference: the same ranks as threads of this process. */
        dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
        o.backend = DT_BACKEND_CPU;
        o.transport = DT_TRANSPORT_LOCAL;
        o.timeout_ms = 20000;
        dt_status st = dt_launch(g_size, rank_attention_local, &c, &o);
        if (st != DT_SUCCESS) print_error("local: %s\n", dt_last_error());
        launch_mpi(rank_attention_mpi, &c, 20000, DT_CHECK_AUTO, &c.o);
        free(c.ref);
        assert_int_equal(st, DT_SUCCESS);
        assert_clean(&c.o, dt ? "attention bf16" : "attention f32");
    }
}

/* ------------------------------------------------------------ failures */

typedef struct fault_case {
    outcome o;
    int kind;
    float *big;            /* F_P2P_STALL: STALL_N elements, the test's */
    dt_status st;          /* this process's status from the call under test */
    char msg[1024];
    double ms;             /* how long that call took */
    int wrote;             /* F_MESH: the call wrote its output handle */
} fault_case;

enum { F_COUNT, F_KIND, F_TIMEOUT, F_PEER, F_ABORT, F_ABORT_OK, F_SPLIT_LATE, F_P2P_STALL, F_MESH,
       F_A2A_COUNT, F_A2A_PEER, F_A2A_MISSING };

#define SPLIT_LATE_MS 1600 /* F_SPLIT_LATE: after the others' 1000 ms timeout */
#define STALL_MS 4000      /* F_P2P_STALL: after rank 0's 1500 ms timeout and 1 s drain */
#define STALL_N (1 << 20)  /* F_P2P_STALL: floats, far above any eager limit */
#define SENTINEL 1234.5f

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static dt_status rank_fault(dt_context *ctx, void *arg) {
    fault_case *c = arg;
    int r = dt_context_rank(ctx), p = dt_context_world_size(ctx), last = p - 1;
    dt_comm *comm = dt_context_comm(ctx);
    float x[2 * MAXP] = {0}, y[2 * MAXP];
    double t0 = now_ms();
    dt_status st = DT_SUCCESS;
    switch (c->kind) {
    case F_COUNT: /* rank 0 reduces 5 elements, the others 6 */
        st = dt_comm_all_reduce(comm, x, y, r == 0 ? 5 : 6, DT_F32, DT_REDUCE_SUM);
        break;
    case F_A2A_COUNT: /* rank 0 moves 1 element per block, the others 2 */
        st = dt_comm_all_to_all(comm, x, y, r == 0 ? 1 : 2, DT_F32);
        break;
    case F_A2A_PEER: /* the last rank fails at once; the others wait in an all_to_all */
        if (r == last) return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d gives up on purpose", r);
        st = dt_comm_all_to_all(comm, x, y, 1, DT_F32);
        break;
    case F_A2A_MISSING: /* the last rank returns without the all_to_all the others call */
        if (r == last) return DT_SUCCESS;
        st = dt_comm_all_to_all(comm, x, y, 1, DT_F32);
        break;
    case F_KIND: /* the last rank broadcasts, the others meet in a barrier */
        st = r == last ? dt_comm_broadcast(comm, x, 4, DT_F32, 0) : dt_comm_barrier(comm);
        break;
    case F_TIMEOUT: { /* rank 0 waits for a message nobody sends */
        if (r != 0) return DT_SUCCESS;
        dt_p2p_op op = {DT_P2P_RECV, last, y, 8, DT_F32};
        st = dt_comm_sendrecv(comm, &op, 1);
        break;
    }
    case F_PEER: /* the last rank fails at once; the others wait in barriers */
        if (r == last) return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d gives up on purpose", r);
        for (int k = 0; k < 3 && st == DT_SUCCESS; k++) st = dt_comm_barrier(comm);
        break;
    case F_ABORT: /* the last rank aborts and returns success */
        if (r == last) {
            dt_comm_abort(comm, DT_ERR_INVALID_ARGUMENT, "stop, said the last rank");
            return DT_SUCCESS;
        }
        st = dt_comm_all_reduce(comm, x, y, 8, DT_F32, DT_REDUCE_SUM);
        break;
    case F_ABORT_OK: /* the last rank aborts with a status that is no error,
                      * calls a collective itself, and returns success */
        if (r == last) dt_comm_abort(comm, DT_SUCCESS, "aborted with DT_SUCCESS");
        st = dt_comm_all_reduce(comm, x, y, 8, DT_F32, DT_REDUCE_SUM);
        break;
    case F_SPLIT_LATE: { /* the last rank reaches a split after the others
                          * gave up on it: it must not wait in MPI's split */
        if (r == last) {
            sleep_ms(SPLIT_LATE_MS);
            t0 = now_ms();
        }
        dt_comm *sub = NULL;
        st = dt_comm_split(comm, 0, r, &sub);
        dt_comm_destroy(sub);
        break;
    }
    case F_MESH: { /* rank 0 asks for a {1, P} mesh, the others for {P} */
        int two[2] = {1, p}, one[1] = {p};
        dt_mesh *mesh = NULL;
        st = r == 0 ? dt_mesh_create(ctx, 2, two, NULL, &mesh) : dt_mesh_create(ctx, 1, one, NULL, &mesh);
        if (mesh) c->wrote = 1;
        dt_mesh_destroy(mesh);
        break;
    }
    case F_P2P_STALL: /* the last rank's large message to rank 0 starts (MPI
                       * matches it) and then stalls: the last rank does not
                       * call MPI again before rank 0 has given up on it */
        if (r == last) {
            for (size_t i = 0; i < STALL_N; i++) c->big[i] = (float)i;
            dt_p2p_op op = {DT_P2P_SEND, 0, c->big, STALL_N, DT_F32};
            st = dt_comm_p2p_start(comm, &op, 1);
            sleep_ms(STALL_MS);
            if (st == DT_SUCCESS) st = dt_comm_p2p_wait(comm);
        } else if (r == 0) {
            dt_p2p_op op = {DT_P2P_RECV, last, c->big, STALL_N, DT_F32};
            st = dt_comm_sendrecv(comm, &op, 1);
            /* What the abandoned receive may still bring must not land here. */
            for (size_t i = 0; i < STALL_N; i++) c->big[i] = SENTINEL;
        } else {
            sleep_ms(STALL_MS); /* at the exit exchange with the last rank */
        }
        break;
    }
    c->ms = now_ms() - t0;
    c->st = st;
    snprintf(c->msg, sizeof c->msg, "%s", st == DT_SUCCESS ? "" : dt_last_error());
    return c->kind == F_ABORT_OK ? DT_SUCCESS : st;
}

static void run_fault_checked(fault_case *c, int kind, long timeout_ms, dt_check_mode checks) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->st = DT_SUCCESS;
    launch_mpi(rank_fault, c, timeout_ms, checks, &c->o);
}

static void run_fault(fault_case *c, int kind, long timeout_ms) {
    run_fault_checked(c, kind, timeout_ms, DT_CHECK_OFF);
}

static void test_collective_mismatch(void **state) {
    (void)state;
    if (g_size < 2) {
        print_message("collective mismatches need 2 ranks or more\n");
        skip();
    }
    fault_case c;
    run_fault(&c, F_COUNT, 20000);
    if (c.o.st != DT_ERR_MISMATCH || !strstr(c.o.msg, "but rank 0 calls all_reduce of 5 fp32"))
        print_error("%s: %s\n", dt_status_name(c.o.st), c.o.msg);
    assert_int_equal(c.o.st, DT_ERR_MISMATCH);
    assert_int_equal(c.st, DT_ERR_MISMATCH);
    assert_non_null(strstr(c.o.msg, "calls all_reduce of 6 fp32 (sum) but rank 0 calls all_reduce of 5 fp32"));
    run_fault(&c, F_KIND, 20000);
    assert_int_equal(c.o.st, DT_ERR_MISMATCH);
    assert_int_equal(c.st, DT_ERR_MISMATCH);
    assert_non_null(strstr(c.o.msg, "calls broadcast of 4 fp32 from root 0 but rank 0 calls barrier"));
    run_fault(&c, F_A2A_COUNT, 20000);
    if (c.o.st != DT_ERR_MISMATCH) print_error("%s: %s\n", dt_status_name(c.o.st), c.o.msg);
    assert_int_equal(c.o.st, DT_ERR_MISMATCH);
    assert_int_equal(c.st, DT_ERR_MISMATCH);
    assert_non_null(strstr(c.o.msg, "calls all_to_all of 2 fp32 but rank 0 calls all_to_all of 1 fp32"));
}

/* Processes that ask for different meshes all fail with DT_ERR_MISMATCH
 * naming the rank and both meshes, checks on or off. */
static void test_disagreeing_meshes(void **state) {
    (void)state;
    if (g_size < 2) {
        print_message("disagreeing meshes need 2 ranks or more\n");
        skip();
    }
    for (int checks = 0; checks < 2; checks++) {
        fault_case c;
        double t0 = now_ms();
        run_fault_checked(&c, F_MESH, 20000, checks ? DT_CHECK_ON : DT_CHECK_OFF);
        char want[96];
        snprintf(want, sizeof want, "rank 1 asks for %d but rank 0 for 1 x %d", g_size, g_size);
        if (c.st != DT_ERR_MISMATCH || !strstr(c.msg, want))
            print_error("rank %d: %s: %s\n", g_rank, dt_status_name(c.st), c.msg);
        assert_int_equal(c.o.st, DT_ERR_MISMATCH);
        assert_int_equal(c.st, DT_ERR_MISMATCH);
        assert_non_null(strstr(c.msg, want));
        assert_false(c.wrote);
        assert_true(now_ms() - t0 < 10000);
    }
}

static void test_timeout(void **state) {
    (void)state;
    fault_case c;
    run_fault(&c, F_TIMEOUT, 1000);
    assert_int_equal(c.o.st, DT_ERR_TIMEOUT);
    char want[96];
    snprintf(want, sizeof want, "message #0 from rank %d (not sent yet)", g_size - 1);
    if (!strstr(c.o.msg, want)) print_error("message: %s\n", c.o.msg);
    assert_non_null(strstr(c.o.msg, "rank 0: sendrecv timed out after 1000 ms"));
    assert_non_null(strstr(c.o.msg, want));
    if (g_rank == 0) {
        assert_int_equal(c.st, DT_ERR_TIMEOUT);
        assert_true(c.ms >= 990);
    }
}

/* Ranks in an all_to_all a rank never calls time out (or hear that
 * another did) after the timeout, and the launch says which call. */
static void test_all_to_all_timeout(void **state) {
    (void)state;
    if (g_size < 2) {
        print_message("a missing member needs 2 ranks or more\n");
        skip();
    }
    fault_case c;
    run_fault(&c, F_A2A_MISSING, 1000);
    if (c.o.st != DT_ERR_TIMEOUT) print_error("%s: %s\n", dt_status_name(c.o.st), c.o.msg);
    assert_int_equal(c.o.st, DT_ERR_TIMEOUT);
    assert_non_null(strstr(c.o.msg, "all_to_all (collective #1) timed out after 1000 ms"));
    if (g_rank != g_size - 1) {
        if (c.st != DT_ERR_TIMEOUT && c.st != DT_ERR_PEER_FAILED)
            print_error("rank %d: %s: %s\n", g_rank, dt_status_name(c.st), c.msg);
        assert_true(c.st == DT_ERR_TIMEOUT || c.st == DT_ERR_PEER_FAILED);
        assert_true(c.ms >= 900 && c.ms < 6000);
    }
}

static void test_peer_failure_is_prompt(void **state) {
    (void)state;
    fault_case c;
    /* 10 s timeout: the others must hear of the failure long before. */
    double t0 = now_ms();
    run_fault(&c, F_PEER, 10000);
    double total = now_ms() - t0;
    char want[64];
    snprintf(want, sizeof want, "rank %d gives up on purpose", g_size - 1);
    assert_int_equal(c.o.st, DT_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(c.o.msg, want));
    if (g_rank != g_size - 1) {
        if (c.st != DT_ERR_PEER_FAILED) print_error("rank %d: %s\n", g_rank, c.msg);
        assert_int_equal(c.st, DT_ERR_PEER_FAILED);
        assert_non_null(strstr(c.msg, want));
        assert_true(c.ms < 5000);
    }
    assert_true(total < 8000);

    /* The same for ranks waiting in an all_to_all. */
    t0 = now_ms();
    run_fault(&c, F_A2A_PEER, 10000);
    total = now_ms() - t0;
    assert_int_equal(c.o.st, DT_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(c.o.msg, want));
    if (g_rank != g_size - 1) {
        if (c.st != DT_ERR_PEER_FAILED) print_error("rank %d: %s\n", g_rank, c.msg);
        assert_int_equal(c.st, DT_ERR_PEER_FAILED);
        assert_non_null(strstr(c.msg, want));
        assert_true(c.ms < 5000);
    }
    assert_true(total < 8000);

    run_fault(&c, F_ABORT, 10000);
    assert_int_equal(c.o.st, DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(c.o.msg, "stop, said the last rank"));
    if (g_rank != g_size - 1) {
        assert_int_equal(c.st, DT_ERR_PEER_FAILED);
        assert_true(c.ms < 5000);
    }
}

/* A status that is no error still aborts: every rank's calls fail (the
 * aborting rank's own too) and the launch reports the abort. */
static void test_abort_without_error(void **state) {
    (void)state;
    fault_case c;
    run_fault(&c, F_ABORT_OK, 10000);
    if (c.o.st != DT_ERR_PEER_FAILED) print_error("%s: %s\n", dt_status_name(c.o.st), c.o.msg);
    assert_int_equal(c.o.st, DT_ERR_PEER_FAILED);
    assert_non_null(strstr(c.o.msg, "aborted with DT_SUCCESS"));
    assert_int_equal(c.st, DT_ERR_PEER_FAILED);
    assert_true(c.ms < 5000);
}

/* A rank that comes to a split after the others' wait for it timed out is
 * stopped by their notices, not left in MPI's blocking split. */
static void test_split_after_timeout(void **state) {
    (void)state;
    if (g_size < 2) {
        print_message("a late member needs 2 ranks or more\n");
        skip();
    }
    fault_case c;
    run_fault(&c, F_SPLIT_LATE, 1000);
    if (c.o.st != DT_ERR_TIMEOUT) print_error("%s: %s\n", dt_status_name(c.o.st), c.o.msg);
    assert_int_equal(c.o.st, DT_ERR_TIMEOUT);
    assert_non_null(strstr(c.o.msg, "split"));
    if (g_rank == g_size - 1) {
        if (c.st != DT_ERR_PEER_FAILED) print_error("late rank: %s\n", c.msg);
        assert_int_equal(c.st, DT_ERR_PEER_FAILED);
        assert_true(c.ms < 1000);
    } else {
        assert_int_equal(c.st, DT_ERR_TIMEOUT);
    }
}

/* A receive MPI has matched but that does not finish before the timeout
 * is abandoned; the rest of its message, sent once the sender calls MPI
 * again (here while rank 0 is in dt_launch's exit exchange), lands in the
 * communicator's stage, never in the buffer rank 0 passed, which it is
 * free to reuse (or free) once the call has returned. */
static void test_stalled_receive(void **state) {
    (void)state;
    if (g_size < 2) {
        print_message("a stalled message needs 2 ranks or more\n");
        skip();
    }
    fault_case c;
    float *big = malloc(STALL_N * sizeof *big);
    assert_non_null(big);
    memset(&c, 0, sizeof c);
    c.kind = F_P2P_STALL;
    c.st = DT_SUCCESS;
    c.big = big;
    launch_mpi(rank_fault, &c, 1500, DT_CHECK_OFF, &c.o);
    long changed = 0;
    if (g_rank == 0)
        for (size_t i = 0; i < STALL_N; i++) changed += big[i] != SENTINEL;
    free(big);
    if (c.o.st != DT_ERR_TIMEOUT) print_error("%s: %s\n", dt_status_name(c.o.st), c.o.msg);
    assert_int_equal(c.o.st, DT_ERR_TIMEOUT);
    assert_non_null(strstr(c.o.msg, "rank 0: sendrecv timed out after 1500 ms"));
    if (g_rank == 0) {
        assert_int_equal(c.st, DT_ERR_TIMEOUT);
        if (changed) print_error("%ld of %d elements written after the call returned\n", changed,
                                 STALL_N);
        assert_int_equal(changed, 0);
    }
    if (g_rank == g_size - 1) {
        if (c.st != DT_ERR_PEER_FAILED)
            print_error("last rank: %s: %s\n", dt_status_name(c.st), c.msg);
        assert_int_equal(c.st, DT_ERR_PEER_FAILED);
    }
}

/* The bootstrap broadcast (NCCL's id under mpirun) when its root has
 * already failed: every rank still joins it, a notice does not stop it, and
 * the exit exchange after it gives the root's failure at once. */
static void test_bootstrap_after_root_failure(void **state) {
    (void)state;
#ifdef DT_HAVE_MPI
    dt_comm_config cfg = {.timeout_ms = 10000, .log_level = DT_LOG_ERROR};
    dt_mpi_world *w = NULL;
    int rank = -1, size = 0;
    assert_int_equal(dt_mpi_init(20000, &rank, &size), DT_SUCCESS);
    assert_int_equal(dt_mpi_world_create(&cfg, &w), DT_SUCCESS);
    char buf[64] = "";
    const char *why = "rank 0 could not make the id";
    if (rank == 0) {
        dt_mpi_world_abort(w, DT_ERR_BACKEND, why);
        snprintf(buf, sizeof buf, "the root's word");
    }
    double t0 = now_ms();
    dt_status b = dt_mpi_world_bcast(w, buf, sizeof buf, 0);
    char verdict[1200] = "";
    dt_status fin = dt_mpi_world_finish(w, rank == 0 ? DT_ERR_BACKEND : DT_SUCCESS,
                                        rank == 0 ? why : NULL, verdict, sizeof verdict);
    double ms = now_ms() - t0;
    dt_mpi_world_destroy(w);
    if (b != DT_SUCCESS || fin != DT_ERR_BACKEND)
        print_error("rank %d: broadcast %s, finish %s: %s\n", rank, dt_status_name(b),
                    dt_status_name(fin), verdict);
    assert_int_equal(b, DT_SUCCESS);
    assert_string_equal(buf, "the root's word");
    assert_int_equal(fin, DT_ERR_BACKEND);
    assert_non_null(strstr(verdict, why));
    assert_true(ms < 5000);
#else
    skip();
#endif
}

/* After every failure above, a new launch still works. */
static void test_healthy_after_failures(void **state) {
    (void)state;
    coll_case c;
    memset(&c, 0, sizeof c);
    c.seed = 3;
    launch_mpi(rank_moves, &c, 20000, DT_CHECK_AUTO, &c.o);
    assert_clean(&c.o, "moves after failures");
}

/* --------------------------------------------------------------- main */

static char skip_reason[512];

static void test_mpi_suite(void **state) {
    (void)state;
    print_message("skipped: %s\n", skip_reason);
    skip();
}

int main(int argc, char **argv) {
    /* For tests/run_tests.sh: is there an MPI transport to test? */
    if (argc > 1 && strcmp(argv[1], "--built-with-mpi") == 0) {
#ifdef DT_HAVE_MPI
        return 0;
#else
        return 1;
#endif
    }
    dt_launch_env env;
    if (dt_launch_env_read(NULL, NULL, &env) != DT_SUCCESS) {
        fprintf(stderr, "test_mpi: %s\n", dt_last_error());
        return 1;
    }
    const char *why = getenv("DT_TEST_MPI_SKIP");
#ifndef DT_HAVE_MPI
    why = "this build has no MPI transport (MPI=0, or no mpicc at build time)";
#endif
    if (!why && env.launcher != DT_LAUNCHER_MPI)
        why = "not started by mpirun: run `mpirun -np N build/tests/test_mpi` (make test does, "
              "for N = 1..4)";
    if (why) {
        if (env.rank > 0) return 0;
        snprintf(skip_reason, sizeof skip_reason, "%s", why);
        const struct CMUnitTest skipped[] = {cmocka_unit_test(test_mpi_suite)};
        return cmocka_run_group_tests_name("mpi transport", skipped, NULL, NULL);
    }
    g_rank = env.rank;
    g_size = env.size;
    if (g_size < 1 || g_size > MAXP) {
        fprintf(stderr, "test_mpi: needs 1..%d processes (launcher says %d)\n", MAXP, g_size);
        return 1;
    }
    const char *verbose = getenv("DT_TEST_MPI_VERBOSE");
    if (g_rank != 0 && !(verbose && *verbose == '1')) {
        if (!freopen("/dev/null", "w", stdout)) return 1;
    }

    static char names[24][64];
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_reduction_bits),
        cmocka_unit_test(test_gather_broadcast_scatter),
        cmocka_unit_test(test_all_to_all),
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_sendrecv),
        cmocka_unit_test(test_sendrecv_mismatch),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_tensor_roundtrip),
        cmocka_unit_test(test_attention_vs_local),
        cmocka_unit_test(test_collective_mismatch),
        cmocka_unit_test(test_disagreeing_meshes),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_all_to_all_timeout),
        cmocka_unit_test(test_peer_failure_is_prompt),
        cmocka_unit_test(test_abort_without_error),
        cmocka_unit_test(test_split_after_timeout),
        cmocka_unit_test(test_stalled_receive),
        cmocka_unit_test(test_bootstrap_after_root_failure),
        cmocka_unit_test(test_healthy_after_failures),
    };
    size_t n = sizeof tests / sizeof tests[0];
    for (size_t i = 0; i < n; i++) {
        /* "test_ring" -> "mpi/ring/P=3" */
        snprintf(names[i], sizeof names[i], "mpi/%s/P=%d", tests[i].name + 5, g_size);
        tests[i].name = names[i];
    }
    char group[64];
    snprintf(group, sizeof group, "mpi transport, P=%d", g_size);
    int failed = _cmocka_run_group_tests(group, tests, n, NULL, NULL);
    dt_status st = dt_finalize();
    if (st != DT_SUCCESS) {
        fprintf(stderr, "rank %d: dt_finalize: %s\n", g_rank, dt_last_error());
        failed++;
    }
    return failed;
}
