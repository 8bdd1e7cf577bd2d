/* tests/test_collectives.c — collectives (all_to_all in every dtype among
 * them), grouped send/recv and the communication counters on the local
 * transport, world sizes 1..8, against references computed here from
 * (seed, rank, index). Rank threads only record; the main thread asserts
 * (a failed cmocka assert in a rank thread would kill the binary silently). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "collectives/comm.h"
#include "collectives/failure.h"
#include "collectives/idle_clock.h"
#include "collectives/transport_local.h"
#include "base/backoff.h"
#include "dtensor/context.h"

#define MAXP 8
#define N 37 /* not a multiple of anything convenient */

/* Data of rank r at index i: exact in fp32 and bf16 (small multiples of 1/4),
 * signed, and different for every (seed, rank, index). */
static float value(uint64_t seed, int r, size_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)r * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    return (float)((int)(x % 257) - 128) / 4.0f;
}

/* The reduced types; the values above are exact in all three. */
static const dt_dtype float_types[] = {DT_F32, DT_BF16, DT_F16};

typedef struct coll_case {
    int p;
    dt_dtype dtype;
    uint64_t seed;
    int in_place;
    size_t count;       /* all_to_all: elements per block */
    dt_check_mode checks;
    /* results, per rank */
    dt_status st[MAXP];
    int bad[MAXP];      /* elements that differ from the reference */
    char msg[MAXP][256];
} coll_case;

static void put(void *buf, dt_dtype dt, size_t i, float v) { dt_value_set(buf, dt, i, v); }
static float get(const void *buf, dt_dtype dt, size_t i) { return dt_value_get(buf, dt, i); }

/* v as the dtype stores it. */
static float rounded(dt_dtype dt, double v) {
    return dt_value_round((float)v, dt);
}

static void record(coll_case *c, int r, dt_status st) {
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
}

static void assert_all_ok(const coll_case *c) {
    for (int r = 0; r < c->p; r++) {
        if (c->st[r] != DT_SUCCESS) print_error("rank %d: %s: %s\n", r, dt_status_name(c->st[r]), c->msg[r]);
        assert_int_equal(c->st[r], DT_SUCCESS);
        if (c->bad[r]) print_error("rank %d: %d elements differ from the reference\n", r, c->bad[r]);
        assert_int_equal(c->bad[r], 0);
    }
}

static dt_status launch(coll_case *c, dt_rank_fn fn, long timeout_ms) {
    /* cpu + local, whatever the machine has: this suite checks host buffers. */
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CPU;
    o.transport = DT_TRANSPORT_LOCAL;
    o.timeout_ms = timeout_ms;
    o.checks = c->checks;
    return dt_launch(c->p, fn, c, &o);
}

/* ---------------------------------------------------------------- all_reduce */

static dt_status rank_all_reduce(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = c->p;
    size_t es = dt_dtype_size(c->dtype);
    char *send = malloc(N * es), *recv = malloc(N * es);
    for (size_t i = 0; i < N; i++) put(send, c->dtype, i, value(c->seed, r, i));
    for (int op = 0; op < DT_REDUCE_OP_COUNT; op++) {
        char *out = c->in_place ? send : recv;
        if (c->in_place)
            for (size_t i = 0; i < N; i++) put(send, c->dtype, i, value(c->seed, r, i));
        dt_status st = dt_comm_all_reduce(dt_context_comm(ctx), send, out, N, c->dtype, (dt_reduce_op)op);
        record(c, r, st);
        if (st != DT_SUCCESS) break;
        for (size_t i = 0; i < N; i++) {
            double ref = value(c->seed, 0, i);
            for (int q = 1; q < p; q++) {
                double v = value(c->seed, q, i);
                ref = op == DT_REDUCE_SUM ? ref + v : fmax(ref, v);
            }
            /* Partial sums are exact in fp32 (multiples of 1/4 below 2^11), and
             * bf16 or fp16 is rounded once at the end: the result is exactly known. */
            if (get(out, c->dtype, i) != rounded(c->dtype, ref)) c->bad[r]++;
        }
    }
    free(send);
    free(recv);
    return DT_SUCCESS;
}

static void test_all_reduce(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++)
        for (int dt = 0; dt < 3; dt++)
            for (int ip = 0; ip < 2; ip++)
                for (uint64_t seed = 1; seed <= 2; seed++) {
                    coll_case c = {.p = p, .dtype = float_types[dt], .seed = seed, .in_place = ip};
                    assert_int_equal(launch(&c, rank_all_reduce, 10000), DT_SUCCESS);
                    assert_all_ok(&c);
                }
}

/* Arbitrary fp32 data: every rank must get the same bits (rank-order sum). */
static dt_status rank_all_reduce_bits(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx);
    float send[N], recv[N];
    for (size_t i = 0; i < N; i++) send[i] = value(c->seed, r, i) * 0.3333333f + 1e-3f * (float)r;
    dt_status st = dt_comm_all_reduce(dt_context_comm(ctx), send, recv, N, DT_F32, DT_REDUCE_SUM);
    record(c, r, st);
    float ref[N];
    for (size_t i = 0; i < N; i++) {
        float acc = 0;
        for (int q = 0; q < c->p; q++) acc = q ? acc + (value(c->seed, q, i) * 0.3333333f + 1e-3f * (float)q)
                                                : value(c->seed, q, i) * 0.3333333f;
        ref[i] = acc;
    }
    if (memcmp(ref, recv, sizeof ref) != 0) c->bad[r]++;
    return DT_SUCCESS;
}

static void test_all_reduce_same_bits_on_every_rank(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++) {
        coll_case c = {.p = p, .dtype = DT_F32, .seed = 7};
        assert_int_equal(launch(&c, rank_all_reduce_bits, 10000), DT_SUCCESS);
        assert_all_ok(&c);
    }
}

/* ------------------------------------------- all_gather / reduce_scatter */

static dt_status rank_gather_scatter(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = c->p;
    dt_comm *comm = dt_context_comm(ctx);
    size_t es = dt_dtype_size(c->dtype);
    char *big = malloc((size_t)p * N * es), *small = malloc(N * es);
    dt_status st;

    /* all_gather: big[q*N + i] = value(q, i); in place uses big + r*N as send. */
    for (size_t i = 0; i < N; i++) put(c->in_place ? big + (size_t)r * N * es : small, c->dtype, i, value(c->seed, r, i));
    st = dt_comm_all_gather(comm, c->in_place ? big + (size_t)r * N * es : small, big, N, c->dtype);
    record(c, r, st);
    if (st != DT_SUCCESS) goto out;
    for (int q = 0; q < p; q++)
        for (size_t i = 0; i < N; i++)
            if (get(big, c->dtype, (size_t)q * N + i) != rounded(c->dtype, value(c->seed, q, i)))
                c->bad[r]++;

    /* reduce_scatter: rank r gets sum over q of value(q, r*N + i). */
    for (size_t i = 0; i < (size_t)p * N; i++) put(big, c->dtype, i, value(c->seed + 1, r, i));
    void *out = c->in_place ? big + (size_t)r * N * es : small;
    st = dt_comm_reduce_scatter(comm, big, out, N, c->dtype, DT_REDUCE_SUM);
    record(c, r, st);
    if (st != DT_SUCCESS) goto out;
    for (size_t i = 0; i < N; i++) {
        double ref = 0;
        for (int q = 0; q < p; q++) ref += value(c->seed + 1, q, (size_t)r * N + i);
        if (get(out, c->dtype, i) != rounded(c->dtype, ref)) c->bad[r]++;
    }
out:
    free(big);
    free(small);
    return DT_SUCCESS;
}

static void test_all_gather_reduce_scatter(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++)
        for (int dt = 0; dt < 3; dt++)
            for (int ip = 0; ip < 2; ip++) {
                coll_case c = {.p = p, .dtype = float_types[dt], .seed = 3, .in_place = ip};
                assert_int_equal(launch(&c, rank_gather_scatter, 10000), DT_SUCCESS);
                assert_all_ok(&c);
            }
}

/* --------------------------------------------------------------- all_to_all */

/* The dtypes all_to_all moves: every one (it moves bytes). */
static const dt_dtype all_types[] = {DT_F32, DT_BF16, DT_F16, DT_U8, DT_I32};

/* Stores at index `at` of buf the element i of rank r's data (seed): the
 * value() as the float types hold it, integers made from it for u8, i32. */
static void put_any(void *buf, dt_dtype dt, size_t at, uint64_t seed, int r, size_t i) {
    const int v = (int)(value(seed, r, i) * 4.0f);   /* in [-512, 512] */
    switch (dt) {
    case DT_U8: ((uint8_t *)buf)[at] = (uint8_t)(v & 0xff); break;
    case DT_I32: ((int32_t *)buf)[at] = v * 65537 + r; break;
    default: put(buf, dt, at, value(seed, r, i)); break;
    }
}

/* Rank r's recv block q must be rank q's send block r, element for element
 * (bytes compared), and nothing past recv written; two calls in a row. */
static dt_status rank_all_to_all(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = c->p;
    dt_comm *comm = dt_context_comm(ctx);
    const size_t n = c->count, es = dt_dtype_size(c->dtype), all = (size_t)p * n;
    char *send = malloc(all * es + 1), *recv = malloc(all * es + 1), want[8];
    dt_status st = DT_SUCCESS;
    for (uint64_t seed = c->seed; seed < c->seed + 2 && st == DT_SUCCESS; seed++) {
        for (size_t i = 0; i < all; i++) put_any(send, c->dtype, i, seed, r, i);
        memset(recv, 0xa5, all * es + 1);
        st = dt_comm_all_to_all(comm, send, recv, n, c->dtype);
        record(c, r, st);
        if (st != DT_SUCCESS) break;
        for (int q = 0; q < p; q++)
            for (size_t i = 0; i < n; i++) {
                put_any(want, c->dtype, 0, seed, q, (size_t)r * n + i);
                if (memcmp(recv + ((size_t)q * n + i) * es, want, es) != 0) c->bad[r]++;
                put_any(want, c->dtype, 0, seed, r, (size_t)q * n + i);   /* send untouched */
                if (memcmp(send + ((size_t)q * n + i) * es, want, es) != 0) c->bad[r]++;
            }
        if ((unsigned char)recv[all * es] != 0xa5) c->bad[r]++;
    }
    free(send);
    free(recv);
    return st;
}

static void test_all_to_all(void **state) {
    (void)state;
    const size_t counts[] = {N, 1, 0};
    for (int p = 1; p <= MAXP; p++)
        for (size_t t = 0; t < sizeof all_types / sizeof all_types[0]; t++)
            for (size_t k = 0; k < 3; k++) {
                if (k > 0 && all_types[t] != DT_F32) continue;
                coll_case c = {.p = p, .dtype = all_types[t], .seed = 21 + k, .count = counts[k]};
                dt_status st = launch(&c, rank_all_to_all, 10000);
                if (st != DT_SUCCESS || c.bad[0])
                    print_error("all_to_all/P=%d,%s,count=%zu\n", p, dt_dtype_name(c.dtype),
                                c.count);
                assert_int_equal(st, DT_SUCCESS);
                assert_all_ok(&c);
            }
}

/* ------------------------------------------ broadcast / scatter / gather */

static dt_status rank_rooted(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = c->p;
    dt_comm *comm = dt_context_comm(ctx);
    float *big = malloc((size_t)p * N * sizeof(float)), buf[N];
    for (int root = 0; root < p; root++) {
        /* broadcast */
        for (size_t i = 0; i < N; i++) buf[i] = value(c->seed, r, i);
        dt_status st = dt_comm_broadcast(comm, buf, N, DT_F32, root);
        record(c, r, st);
        if (st != DT_SUCCESS) break;
        for (size_t i = 0; i < N; i++) if (buf[i] != value(c->seed, root, i)) c->bad[r]++;
        /* scatter: root's big[q*N + i] = value(root, q*N + i) goes to rank q */
        for (size_t i = 0; i < (size_t)p * N; i++) big[i] = value(c->seed, r, i);
        st = dt_comm_scatter(comm, r == root ? big : NULL, buf, N, DT_F32, root);
        record(c, r, st);
        if (st != DT_SUCCESS) break;
        for (size_t i = 0; i < N; i++) if (buf[i] != value(c->seed, root, (size_t)r * N + i)) c->bad[r]++;
        /* gather: rank q's buf lands at root's big[q*N..] */
        for (size_t i = 0; i < N; i++) buf[i] = value(c->seed + 9, r, i);
        memset(big, 0, (size_t)p * N * sizeof(float));
        st = dt_comm_gather(comm, buf, r == root ? big : NULL, N, DT_F32, root);
        record(c, r, st);
        if (st != DT_SUCCESS) break;
        if (r == root)
            for (int q = 0; q < p; q++)
                for (size_t i = 0; i < N; i++)
                    if (big[(size_t)q * N + i] != value(c->seed + 9, q, i)) c->bad[r]++;
    }
    free(big);
    return DT_SUCCESS;
}

static void test_broadcast_scatter_gather_every_root(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++) {
        coll_case c = {.p = p, .dtype = DT_F32, .seed = 5};
        assert_int_equal(launch(&c, rank_rooted, 10000), DT_SUCCESS);
        assert_all_ok(&c);
    }
}

/* ------------------------------------------------------------------ barrier */

typedef struct barrier_case {
    coll_case c;
    int arrived;      /* guarded by the barrier itself: read only after it */
    int seen[MAXP];
} barrier_case;

static dt_status rank_barrier(dt_context *ctx, void *arg) {
    barrier_case *b = arg;
    int r = dt_context_rank(ctx);
    for (int round = 0; round < 20; round++) {
        /* Rank r sleeps a little so late ranks would be missed without a barrier. */
        struct timespec ts = {0, 200000L * r};
        nanosleep(&ts, NULL);
        __atomic_add_fetch(&b->arrived, 1, __ATOMIC_SEQ_CST);
        dt_status st = dt_comm_barrier(dt_context_comm(ctx));
        record(&b->c, r, st);
        if (st != DT_SUCCESS) return st;
        if (__atomic_load_n(&b->arrived, __ATOMIC_SEQ_CST) < (round + 1) * b->c.p) b->c.bad[r]++;
        /* Second barrier: nobody starts the next round's increment early. */
        st = dt_comm_barrier(dt_context_comm(ctx));
        record(&b->c, r, st);
        if (st != DT_SUCCESS) return st;
    }
    return DT_SUCCESS;
}

static void test_barrier(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++) {
        barrier_case b = {.c = {.p = p}};
        assert_int_equal(launch(&b.c, rank_barrier, 10000), DT_SUCCESS);
        assert_all_ok(&b.c);
        assert_int_equal(b.arrived, 20 * p);
    }
}

/* ---------------------------------------------------------------- sub-groups */

/* Split the world into groups by rank % k; all_reduce the world rank within
 * each group; also split a 2-D mesh's rows and columns. */
static dt_status rank_split(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = c->p;
    for (int k = 1; k <= 3 && k <= p; k++) {
        dt_comm *sub = NULL;
        dt_status st = dt_comm_split(dt_context_comm(ctx), r % k, -r /* reversed order */, &sub);
        record(c, r, st);
        if (st != DT_SUCCESS) return st;
        int members = 0, pos = 0;
        float sum_ref = 0;
        for (int q = 0; q < p; q++)
            if (q % k == r % k) {
                members++;
                sum_ref += (float)q;
                if (q > r) pos++;   /* key -q orders the group by descending rank */
            }
        if (dt_comm_size(sub) != members || dt_comm_rank(sub) != pos) c->bad[r]++;
        float x = (float)r, sum = 0;
        st = dt_comm_all_reduce(sub, &x, &sum, 1, DT_F32, DT_REDUCE_SUM);
        record(c, r, st);
        if (sum != sum_ref) c->bad[r]++;
        dt_comm_destroy(sub);
        if (st != DT_SUCCESS) return st;
    }
    /* Opting out with a negative color. */
    dt_comm *none = (dt_comm *)1;
    dt_status st = dt_comm_split(dt_context_comm(ctx), r == 0 ? -1 : 0, 0, &none);
    record(c, r, st);
    if ((r == 0) != (none == NULL)) c->bad[r]++;
    if (none) {
        st = dt_comm_barrier(none);
        record(c, r, st);
        if (dt_comm_size(none) != p - 1) c->bad[r]++;
    }
    dt_comm_destroy(none);
    return st;
}

static void test_split(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++) {
        coll_case c = {.p = p};
        assert_int_equal(launch(&c, rank_split, 10000), DT_SUCCESS);
        assert_all_ok(&c);
    }
}

/* ------------------------------------------------------------ send / recv */

/* All-to-all with a different size for every pair: rank r sends r + q + 1
 * values to q, all in one group, receives posted before sends on odd ranks. */
static dt_status rank_alltoall(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), p = c->p;
    float *out[MAXP], *in[MAXP];
    dt_p2p_op ops[2 * MAXP];
    int n = 0;
    for (int q = 0; q < p; q++) {
        size_t cnt = (size_t)(r + q + 1);
        out[q] = malloc(cnt * sizeof(float));
        in[q] = calloc(cnt, sizeof(float));
        for (size_t i = 0; i < cnt; i++) out[q][i] = value(c->seed, r, (size_t)q * 100 + i);
    }
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < p; q++) {
            int send = (k == 0) == (r % 2 == 0);
            ops[n++] = (dt_p2p_op){send ? DT_P2P_SEND : DT_P2P_RECV, q, send ? out[q] : in[q],
                                   (size_t)(r + q + 1), DT_F32};
        }
    dt_status st = dt_comm_sendrecv(dt_context_comm(ctx), ops, n);
    record(c, r, st);
    for (int q = 0; q < p; q++) {
        for (size_t i = 0; st == DT_SUCCESS && i < (size_t)(r + q + 1); i++)
            if (in[q][i] != value(c->seed, q, (size_t)r * 100 + i)) c->bad[r]++;
        free(out[q]);
        free(in[q]);
    }
    return st;
}

static void test_sendrecv_alltoall(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++) {
        coll_case c = {.p = p, .seed = 11};
        assert_int_equal(launch(&c, rank_alltoall, 10000), DT_SUCCESS);
        assert_all_ok(&c);
    }
}

/* Several messages between one pair, in order, across groups. */
static dt_status rank_ordered(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx);
    float a[3] = {1, 2, 3}, b[5] = {4, 5, 6, 7, 8}, x[3] = {0}, y[5] = {0};
    dt_status st = DT_SUCCESS;
    if (r == 0) {
        dt_p2p_op ops[2] = {{DT_P2P_SEND, 1, a, 3, DT_F32}, {DT_P2P_SEND, 1, b, 5, DT_F32}};
        st = dt_comm_sendrecv(dt_context_comm(ctx), ops, 2);
    } else if (r == 1) {
        dt_p2p_op o1 = {DT_P2P_RECV, 0, x, 3, DT_F32}, o2 = {DT_P2P_RECV, 0, y, 5, DT_F32};
        st = dt_comm_sendrecv(dt_context_comm(ctx), &o1, 1);
        if (st == DT_SUCCESS) st = dt_comm_sendrecv(dt_context_comm(ctx), &o2, 1);
        if (memcmp(x, a, sizeof a) || memcmp(y, b, sizeof b)) c->bad[r]++;
    }
    record(c, r, st);
    return st;
}

static void test_sendrecv_ordered_across_groups(void **state) {
    (void)state;
    coll_case c = {.p = 3};
    assert_int_equal(launch(&c, rank_ordered, 10000), DT_SUCCESS);
    assert_all_ok(&c);
}

/* ------------------------------------------------------------- strictness */

/* Rank 1 calls all_gather where the others call all_reduce: every rank gets
 * DT_ERR_MISMATCH naming ranks 0 and 1, and nothing hangs. */
static dt_status rank_wrong_collective(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx);
    float x[4] = {1, 2, 3, 4}, y[4 * MAXP];
    dt_status st = r == 1 ? dt_comm_all_gather(dt_context_comm(ctx), x, y, 4, DT_F32)
                          : dt_comm_all_reduce(dt_context_comm(ctx), x, y, 4, DT_F32, DT_REDUCE_SUM);
    record(c, r, st);
    return st;
}

static void assert_every_rank(const coll_case *c, dt_status want, const char *needle1, const char *needle2) {
    for (int r = 0; r < c->p; r++) {
        if (c->st[r] != want) print_error("rank %d: got %s (%s)\n", r, dt_status_name(c->st[r]), c->msg[r]);
        assert_int_equal(c->st[r], want);
        if (needle1) assert_non_null(strstr(c->msg[r], needle1));
        if (needle2) assert_non_null(strstr(c->msg[r], needle2));
    }
}

static void test_mismatched_collectives(void **state) {
    (void)state;
    for (int p = 2; p <= 4; p++) {
        coll_case c = {.p = p};
        assert_int_equal(launch(&c, rank_wrong_collective, 5000), DT_ERR_MISMATCH);
        assert_every_rank(&c, DT_ERR_MISMATCH, "rank 1 calls all_gather", "rank 0 calls all_reduce");
    }
}

/* Rank 1 posts 5 fp32 where rank 0 sends 4: both fail naming each other. */
static dt_status rank_wrong_size(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx);
    float buf[8] = {0};
    dt_p2p_op op = r == 0 ? (dt_p2p_op){DT_P2P_SEND, 1, buf, 4, DT_F32}
                          : (dt_p2p_op){DT_P2P_RECV, 0, buf, 5, DT_F32};
    dt_status st = dt_comm_sendrecv(dt_context_comm(ctx), &op, 1);
    record(c, r, st);
    return st;
}

static void test_mismatched_send_recv(void **state) {
    (void)state;
    coll_case c = {.p = 2};
    assert_int_equal(launch(&c, rank_wrong_size, 5000), DT_ERR_MISMATCH);
    assert_every_rank(&c, DT_ERR_MISMATCH, "rank 1 receives 5 fp32 from rank 0",
                      "rank 0 sends 4 fp32 to rank 1");
}

/* Rank 1 moves one element more per block (or another dtype) than the
 * others: DT_ERR_MISMATCH on every rank naming both calls, checks off
 * (the transport's own check) and on (DT_CHECK's). */
static dt_status rank_all_to_all_mismatch(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx);
    float x[8 * MAXP] = {0}, y[8 * MAXP];
    const size_t n = r == 1 && c->in_place == 0 ? 5 : 4;
    const dt_dtype dt = r == 1 && c->in_place == 1 ? DT_BF16 : DT_F32;
    dt_status st = dt_comm_all_to_all(dt_context_comm(ctx), x, y, n, dt);
    record(c, r, st);
    return st;
}

static void test_all_to_all_mismatch(void **state) {
    (void)state;
    for (int p = 2; p <= 4; p++)
        for (int what = 0; what < 2; what++)   /* 0: count, 1: dtype (in_place field) */
            for (int checks = 0; checks < 2; checks++) {
                coll_case c = {.p = p, .in_place = what,
                               .checks = checks ? DT_CHECK_ON : DT_CHECK_OFF};
                assert_int_equal(launch(&c, rank_all_to_all_mismatch, 5000), DT_ERR_MISMATCH);
                assert_every_rank(&c, DT_ERR_MISMATCH,
                                  what ? "all_to_all of 4 bf16" : "all_to_all of 5 fp32",
                                  "all_to_all of 4 fp32");
            }
}

/* DT_LOCAL_COPIES=0 (benchmarks: a ring's time without its copies): the
 * sends and receives still match and complete, a receive's buffer keeps
 * what it held, collectives still move their data, and a mismatch still
 * fails both ends; DT_LOCAL_COPIES=1 moves the data; anything else is
 * refused by dt_launch. */
static dt_status rank_no_copies(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx);
    const int skip = !strcmp(getenv("DT_LOCAL_COPIES"), "0");
    float a[4] = {1, 2, 3, 4}, x[4] = {-1, -1, -1, -1}, g[4 * MAXP];
    const float *want = skip ? (const float[4]){-1, -1, -1, -1} : a;
    dt_p2p_op op = r == 0 ? (dt_p2p_op){DT_P2P_SEND, 1, a, 4, DT_F32}
                          : (dt_p2p_op){DT_P2P_RECV, 0, x, 4, DT_F32};
    dt_status st = dt_comm_sendrecv(dt_context_comm(ctx), &op, 1);
    if (st == DT_SUCCESS && r == 1 && memcmp(x, want, sizeof x)) c->bad[r]++;
    const float mine[4] = {(float)r, 0, 0, 0};
    if (st == DT_SUCCESS) st = dt_comm_all_gather(dt_context_comm(ctx), mine, g, 4, DT_F32);
    for (int q = 0; st == DT_SUCCESS && q < c->p; q++)
        if (g[4 * q] != (float)q) c->bad[r]++;
    record(c, r, st);
    return st;
}

static void test_local_copies_off(void **state) {
    (void)state;
    const char *old = getenv("DT_LOCAL_COPIES");
    char saved[8] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    for (int skip = 0; skip < 2; skip++) {
        setenv("DT_LOCAL_COPIES", skip ? "0" : "1", 1);
        coll_case c = {.p = 2};
        assert_int_equal(launch(&c, rank_no_copies, 10000), DT_SUCCESS);
        assert_all_ok(&c);
        coll_case m = {.p = 2};
        assert_int_equal(launch(&m, rank_wrong_size, 5000), DT_ERR_MISMATCH);
        assert_every_rank(&m, DT_ERR_MISMATCH, "rank 1 receives 5 fp32 from rank 0",
                          "rank 0 sends 4 fp32 to rank 1");
    }
    setenv("DT_LOCAL_COPIES", "no", 1);
    coll_case c = {.p = 2};
    assert_int_equal(launch(&c, rank_no_copies, 10000), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "DT_LOCAL_COPIES=no is not 0 or 1"));
    if (old) setenv("DT_LOCAL_COPIES", saved, 1);
    else unsetenv("DT_LOCAL_COPIES");
}

/* ------------------------------------------------------------- failures */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* mode 0: the failing rank returns an error before the collective;
 * mode 1: it returns success without ever calling it (peers must time out);
 * mode 2: it aborts mid-way through a series of collectives;
 * mode 3: it is slow, but within the timeout (everyone must succeed);
 * mode 4: it aborts with DT_SUCCESS (still an abort), calls a collective
 *         itself (an error, not a crash), and returns success. */
typedef struct fail_case {
    coll_case c;
    int mode, victim;
    int a2a;       /* the collective: 0 all_reduce, 1 all_to_all */
    double elapsed_ms[MAXP];
    dt_status own; /* mode 4: the victim's collective after its abort */
} fail_case;

/* The collective under test: all_reduce of 16 or all_to_all of 2 per rank. */
static dt_status fail_call(const fail_case *f, dt_comm *comm, float *x, float *y) {
    return f->a2a ? dt_comm_all_to_all(comm, x, y, 2, DT_F32)
                  : dt_comm_all_reduce(comm, x, y, 16, DT_F32, DT_REDUCE_SUM);
}

static dt_status rank_fail(dt_context *ctx, void *arg) {
    fail_case *f = arg;
    int r = dt_context_rank(ctx);
    double t0 = now_ms();
    float x[16] = {0}, y[16];
    dt_status st = DT_SUCCESS;
    for (int round = 0; round < 5 && st == DT_SUCCESS; round++) {
        if (r == f->victim) {
            if (f->mode == 0 && round == 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "injected failure");
            if (f->mode == 1 && round == 0) return DT_SUCCESS;
            if (f->mode == 2 && round == 3) {
                dt_comm_abort(dt_context_comm(ctx), DT_ERR_BACKEND, "injected abort");
                return DT_ERR_BACKEND;
            }
            if (f->mode == 4 && round == 3) {
                dt_comm_abort(dt_context_comm(ctx), DT_SUCCESS, "aborted with DT_SUCCESS");
                f->own = fail_call(f, dt_context_comm(ctx), x, y);
                return DT_SUCCESS;
            }
            if (f->mode == 3) sleep_ms(30);
        }
        st = fail_call(f, dt_context_comm(ctx), x, y);
    }
    f->elapsed_ms[r] = now_ms() - t0;
    record(&f->c, r, st);
    return st;
}

static void test_failures_do_not_hang(void **state) {
    (void)state;
    const long timeout = 300;
    for (int a2a = 0; a2a < 2; a2a++)
        for (int mode = 0; mode < 5; mode++)
            for (int p = 2; p <= MAXP; p += 3) {
                fail_case f = {.c = {.p = p}, .mode = mode, .victim = p - 1, .a2a = a2a};
                double t0 = now_ms();
                dt_status st = launch(&f.c, rank_fail, timeout);
                double total = now_ms() - t0;
                if (mode == 3) {
                    assert_int_equal(st, DT_SUCCESS);
                    assert_all_ok(&f.c);
                    continue;
                }
                assert_int_not_equal(st, DT_SUCCESS);
                /* Failing peers are noticed at once; a missing peer after the timeout. */
                assert_true(total < (mode == 1 ? timeout + 1000 : timeout));
                for (int r = 0; r < p; r++) {
                    if (r == f.victim) continue;
                    dt_status want = mode == 1 ? DT_ERR_TIMEOUT : DT_ERR_PEER_FAILED;
                    if (mode == 1 && f.c.st[r] == DT_ERR_PEER_FAILED) want = DT_ERR_PEER_FAILED;
                    assert_int_equal(f.c.st[r], want);
                    assert_true(f.elapsed_ms[r] < timeout + 1000);
                }
                if (mode == 1) assert_int_equal(st, DT_ERR_TIMEOUT);
                if (mode == 0) {
                    assert_int_equal(st, DT_ERR_INVALID_ARGUMENT);
                    assert_non_null(strstr(dt_last_error(), "injected failure"));
                }
                if (mode == 2) assert_non_null(strstr(f.c.msg[0], "injected abort"));
                if (mode == 4) {
                    assert_int_equal(st, DT_ERR_PEER_FAILED);
                    assert_int_equal(f.own, DT_ERR_PEER_FAILED);
                    assert_non_null(strstr(f.c.msg[0], "aborted with DT_SUCCESS"));
                }
            }
}

/* ----------------------------------------------------------------- counters */

/* Compares one kind's counters with what comm.h defines; a difference is
 * counted in c->bad[r] with the first one's message. */
static void expect_kind(coll_case *c, int r, const dt_comm_counters *k, dt_comm_kind kind,
                        uint64_t calls, uint64_t sent, uint64_t recv) {
    if (k->calls[kind] == calls && k->bytes_sent[kind] == sent && k->bytes_recv[kind] == recv)
        return;
    if (c->bad[r]++ == 0)
        snprintf(c->msg[r], sizeof c->msg[r], "%s: %llu calls, %llu sent, %llu received; want "
                 "%llu, %llu, %llu", dt_comm_kind_name(kind), (unsigned long long)k->calls[kind],
                 (unsigned long long)k->bytes_sent[kind], (unsigned long long)k->bytes_recv[kind],
                 (unsigned long long)calls, (unsigned long long)sent, (unsigned long long)recv);
}

static int counters_zero(const dt_comm_counters *k) {
    for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++)
        if (k->calls[kind] || k->bytes_sent[kind] || k->bytes_recv[kind]) return 0;
    return k->wait_ms == 0;
}

/* A known sequence of calls of every kind (rejected ones among them) gives
 * the exact calls and bytes comm.h defines, on every rank; a reset zeroes
 * them and the next call counts alone. */
static dt_status rank_counters(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    const int r = dt_context_rank(ctx), p = c->p, root = p - 1;
    const uint64_t P1 = (uint64_t)p - 1;
    dt_comm *comm = dt_context_comm(ctx);
    float f[64 * MAXP] = {0}, g[64 * MAXP] = {0}, h[8] = {0};
    uint16_t b[64 * MAXP] = {0};
    uint8_t u[8 * MAXP] = {0}, v[8 * MAXP];
    dt_comm_counters k;
    dt_status st = dt_comm_counters_get(comm, &k);
    if (st == DT_SUCCESS && !counters_zero(&k)) c->bad[r]++;   /* a new communicator: zero */
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    dt_p2p_op g1[4] = {{DT_P2P_SEND, next, f, 5, DT_F32}, {DT_P2P_RECV, prev, g, 5, DT_F32},
                       {DT_P2P_SEND, r, f, 3, DT_F32}, {DT_P2P_RECV, r, h, 3, DT_F32}};
    dt_p2p_op g2[2] = {{DT_P2P_RECV, prev, b + 8, 2, DT_BF16}, {DT_P2P_SEND, next, b, 2, DT_BF16}};
#define DO(call) if (st == DT_SUCCESS) st = (call)
    DO(dt_comm_all_reduce(comm, f, g, N, DT_F32, DT_REDUCE_SUM));
    DO(dt_comm_all_reduce(comm, f, f, N, DT_F32, DT_REDUCE_MAX));
    DO(dt_comm_all_gather(comm, b, b + 64, N, DT_BF16));
    DO(dt_comm_reduce_scatter(comm, b, b + 5 * MAXP, 5, DT_F16, DT_REDUCE_SUM));
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
    /* rejected before any transport: not counted */
    if (st == DT_SUCCESS && (dt_comm_all_to_all(comm, f, f, 1, DT_F32) != DT_ERR_INVALID_ARGUMENT ||
                             dt_comm_broadcast(comm, f, 1, DT_F32, -1) != DT_ERR_INVALID_ARGUMENT))
        c->bad[r]++;
    record(c, r, st);
    if (st != DT_SUCCESS) return st;
    st = dt_comm_counters_get(comm, &k);
    record(c, r, st);
    if (st != DT_SUCCESS) return st;
    const uint64_t ar = 2 * P1 * ((N + (uint64_t)p - 1) / (uint64_t)p) * 4;
    const uint64_t p2p = p > 1 ? 5 * 4 + 2 * 2 : 0;   /* the sends to itself move nothing */
    expect_kind(c, r, &k, DT_COMM_P2P, 2, p2p, p2p);
    expect_kind(c, r, &k, DT_COMM_ALL_REDUCE, 2, 2 * ar, 2 * ar);
    expect_kind(c, r, &k, DT_COMM_ALL_GATHER, 1, P1 * N * 2, P1 * N * 2);
    expect_kind(c, r, &k, DT_COMM_REDUCE_SCATTER, 1, P1 * 5 * 2, P1 * 5 * 2);
    expect_kind(c, r, &k, DT_COMM_ALL_TO_ALL, 2, P1 * (3 * 4 + 7), P1 * (3 * 4 + 7));
    expect_kind(c, r, &k, DT_COMM_BROADCAST, 1, r == root ? P1 * N * 4 : 0, r == root ? 0 : N * 4);
    expect_kind(c, r, &k, DT_COMM_SCATTER, 1, r == 0 ? P1 * 16 : 0, r == 0 ? 0 : 16);
    expect_kind(c, r, &k, DT_COMM_GATHER, 1, r == root ? 0 : 12, r == root ? P1 * 12 : 0);
    expect_kind(c, r, &k, DT_COMM_BARRIER, 3, 0, 0);
    if (!(k.wait_ms >= 0) || (p == 1 && k.wait_ms != 0)) c->bad[r]++;   /* alone: never blocked */
    /* reset: zero; the next call counts alone */
    dt_comm_counters_reset(comm);
    dt_comm_counters_reset(NULL);
    st = dt_comm_counters_get(comm, &k);
    if (st == DT_SUCCESS && !counters_zero(&k)) c->bad[r]++;
    if (st == DT_SUCCESS) st = dt_comm_all_to_all(comm, f, g, 2, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k);
    record(c, r, st);
    if (st != DT_SUCCESS) return st;
    for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++)
        if (kind != DT_COMM_ALL_TO_ALL) expect_kind(c, r, &k, (dt_comm_kind)kind, 0, 0, 0);
    expect_kind(c, r, &k, DT_COMM_ALL_TO_ALL, 1, P1 * 8, P1 * 8);
    return DT_SUCCESS;
}

static void test_counters(void **state) {
    (void)state;
    static const char *const names[DT_COMM_KIND_COUNT] = {
        "p2p", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
        "broadcast", "scatter", "gather", "barrier"};
    for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++)
        assert_string_equal(dt_comm_kind_name((dt_comm_kind)kind), names[kind]);
    assert_string_equal(dt_comm_kind_name(DT_COMM_KIND_COUNT), "unknown");
    assert_string_equal(dt_comm_kind_name((dt_comm_kind)-1), "unknown");
    /* Checks on: their agreement exchanges count no call and no byte. */
    for (int checks = 0; checks < 2; checks++)
        for (int p = 1; p <= MAXP; p++) {
            coll_case c = {.p = p, .checks = checks ? DT_CHECK_ON : DT_CHECK_OFF};
            dt_status st = launch(&c, rank_counters, 10000);
            if (st != DT_SUCCESS) print_error("counters/P=%d,checks=%d\n", p, checks);
            assert_int_equal(st, DT_SUCCESS);
            for (int r = 0; r < p; r++)
                if (c.bad[r]) print_error("counters/P=%d,checks=%d: rank %d: %s\n", p, checks, r, c.msg[r]);
            assert_all_ok(&c);
        }
}

/* A sub-communicator has counters of its own, from zero: calls on it do
 * not show in its parent's, nor the parent's in its own; the split itself
 * counts nowhere. */
static dt_status rank_counters_split(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    const int r = dt_context_rank(ctx), p = c->p;
    dt_comm *world = dt_context_comm(ctx), *sub = NULL;
    float x[4 * MAXP] = {0}, y[4 * MAXP];
    dt_comm_counters kw, ks;
    dt_status st = dt_comm_split(world, r % 2, r, &sub);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(sub, &ks);
    if (st == DT_SUCCESS && !counters_zero(&ks)) c->bad[r]++;
    if (st == DT_SUCCESS) st = dt_comm_all_to_all(sub, x, y, 4, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_barrier(sub);
    if (st == DT_SUCCESS) st = dt_comm_all_gather(world, x, y, 2, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(sub, &ks);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(world, &kw);
    record(c, r, st);
    if (st == DT_SUCCESS) {
        const uint64_t sub1 = (uint64_t)dt_comm_size(sub) - 1, w1 = (uint64_t)p - 1;
        for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++) {
            const dt_comm_kind kd = (dt_comm_kind)kind;
            if (kd == DT_COMM_ALL_TO_ALL) expect_kind(c, r, &ks, kd, 1, sub1 * 16, sub1 * 16);
            else if (kd == DT_COMM_BARRIER) expect_kind(c, r, &ks, kd, 1, 0, 0);
            else expect_kind(c, r, &ks, kd, 0, 0, 0);
            if (kd == DT_COMM_ALL_GATHER) expect_kind(c, r, &kw, kd, 1, w1 * 8, w1 * 8);
            else expect_kind(c, r, &kw, kd, 0, 0, 0);
        }
    }
    dt_comm_destroy(sub);
    return st;
}

static void test_counters_split(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++) {
        coll_case c = {.p = p};
        assert_int_equal(launch(&c, rank_counters_split, 10000), DT_SUCCESS);
        for (int r = 0; r < p; r++)
            if (c.bad[r]) print_error("counters_split/P=%d: rank %d: %s\n", p, r, c.msg[r]);
        assert_all_ok(&c);
    }
}

/* wait_ms grows by the time a rank is blocked for a late peer: after a
 * barrier, the last rank sleeps LATE_MS before an all_to_all, and then
 * before its send to rank 0; the others' all_to_all and rank 0's receive
 * wait for it. */
enum { LATE_MS = 50 };

typedef struct wait_case {
    coll_case c;
    double a2a_ms[MAXP];   /* wait_ms over the all_to_all */
    double p2p_ms[MAXP];   /* over the p2p group */
} wait_case;

static dt_status rank_counters_wait(dt_context *ctx, void *arg) {
    wait_case *w = arg;
    const int r = dt_context_rank(ctx), p = w->c.p, late = p - 1;
    dt_comm *comm = dt_context_comm(ctx);
    float x[2 * MAXP] = {0}, y[2 * MAXP];
    dt_comm_counters k0, k1, k2;
    dt_status st = dt_comm_barrier(comm);
    dt_comm_counters_reset(comm);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k0);
    if (st == DT_SUCCESS && r == late) sleep_ms(LATE_MS);
    if (st == DT_SUCCESS) st = dt_comm_all_to_all(comm, x, y, 2, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k1);
    if (st == DT_SUCCESS && r == late) sleep_ms(LATE_MS);
    if (st == DT_SUCCESS && (r == 0 || r == late)) {
        dt_p2p_op op = r == 0 ? (dt_p2p_op){DT_P2P_RECV, late, y, 2, DT_F32}
                              : (dt_p2p_op){DT_P2P_SEND, 0, x, 2, DT_F32};
        st = dt_comm_sendrecv(comm, &op, 1);
    }
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k2);
    record(&w->c, r, st);
    if (st == DT_SUCCESS) {
        w->a2a_ms[r] = k1.wait_ms - k0.wait_ms;
        w->p2p_ms[r] = k2.wait_ms - k1.wait_ms;
        if (k0.wait_ms != 0) w->c.bad[r]++;
    }
    return st;
}

static void test_counters_wait_time(void **state) {
    (void)state;
    const int ps[] = {2, 3, 8};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        wait_case w = {.c = {.p = ps[i]}};
        assert_int_equal(launch(&w.c, rank_counters_wait, 10000), DT_SUCCESS);
        assert_all_ok(&w.c);
        for (int r = 0; r < w.c.p; r++) {
            const int late = r == w.c.p - 1;
            if (!late && w.a2a_ms[r] < LATE_MS - 10)
                print_error("P=%d: rank %d waited %.1f ms for the late rank's all_to_all\n",
                            w.c.p, r, w.a2a_ms[r]);
            assert_true(w.a2a_ms[r] >= 0 && w.p2p_ms[r] >= 0);
            if (!late) assert_true(w.a2a_ms[r] >= LATE_MS - 10);
            if (r == 0) assert_true(w.p2p_ms[r] >= LATE_MS - 10);
        }
    }
}

/* ---------------------------------------------------------- bad arguments */

static dt_status rank_bad_args(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    int r = dt_context_rank(ctx), i = 0;
    dt_comm *comm = dt_context_comm(ctx);
    float x[4] = {1, 2, 3, 4}, y[4] = {5, 6, 7, 8};
#define EXPECT(call, want)                                                              \
    do {                                                                                \
        dt_status got_ = (call);                                                        \
        i++;                                                                            \
        if (got_ != (want)) {                                                           \
            c->bad[r]++;                                                                \
            snprintf(c->msg[r], sizeof c->msg[r], "case %d: got %s: %s", i,             \
                     dt_status_name(got_), dt_last_error());                            \
        }                                                                               \
    } while (0)
    EXPECT(dt_comm_all_reduce(NULL, x, y, 4, DT_F32, DT_REDUCE_SUM), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_reduce(comm, x, y, 4, (dt_dtype)99, DT_REDUCE_SUM), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_reduce(comm, x, y, 4, DT_F32, (dt_reduce_op)7), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_reduce(comm, NULL, y, 4, DT_F32, DT_REDUCE_SUM), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_reduce(comm, x, y, SIZE_MAX / 2, DT_F32, DT_REDUCE_SUM), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_reduce(comm, x, y, 4, DT_U8, DT_REDUCE_SUM), DT_ERR_NOT_SUPPORTED);
    EXPECT(dt_comm_all_gather(comm, x, NULL, 1, DT_F32), DT_ERR_INVALID_ARGUMENT);
    /* all_to_all is not in place: send and recv may not overlap at all */
    EXPECT(dt_comm_all_to_all(comm, x, x, 1, DT_F32), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_to_all(comm, x, x + 1, 2, DT_F32), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_to_all(comm, x, NULL, 1, DT_F32), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_all_to_all(comm, x, y, SIZE_MAX / 2, DT_F32), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_counters_get(comm, NULL), DT_ERR_INVALID_ARGUMENT);
    dt_comm_counters none;
    EXPECT(dt_comm_counters_get(NULL, &none), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_broadcast(comm, x, 4, DT_F32, c->p), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_broadcast(comm, x, 4, DT_F32, -1), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_gather(comm, x, NULL, 1, DT_F32, 0), r == 0 ? DT_ERR_INVALID_ARGUMENT : DT_SUCCESS);
    /* The gather above blocked ranks > 0 until rank 0 makes a valid one. */
    if (r == 0) EXPECT(dt_comm_gather(comm, x, y, 1, DT_F32, 0), DT_SUCCESS);
    EXPECT(dt_comm_sendrecv(comm, &(dt_p2p_op){DT_P2P_SEND, c->p, x, 1, DT_F32}, 1), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_sendrecv(comm, &(dt_p2p_op){(dt_p2p_kind)5, 0, x, 1, DT_F32}, 1), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_sendrecv(comm, NULL, 2), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_p2p_wait(comm), DT_ERR_INVALID_ARGUMENT);
    EXPECT(dt_comm_split(comm, 0, 0, NULL), DT_ERR_INVALID_ARGUMENT);
    /* A collective while a send/recv group is outstanding (the group's ops
     * must outlive it, hence a variable rather than a compound literal). */
    dt_p2p_op self_send = {DT_P2P_SEND, r, x, 4, DT_F32};
    EXPECT(dt_comm_p2p_start(comm, &self_send, 1), DT_SUCCESS);
    EXPECT(dt_comm_barrier(comm), DT_ERR_INVALID_ARGUMENT);
    float z[4] = {0};
    EXPECT(dt_comm_sendrecv(comm, &(dt_p2p_op){DT_P2P_RECV, r, z, 4, DT_F32}, 1), DT_ERR_INVALID_ARGUMENT);
    /* Nobody receives the self-send: the first rank to time out aborts the
     * world, the others then stop with DT_ERR_PEER_FAILED. */
    dt_status waited = dt_comm_p2p_wait(comm);
    EXPECT(waited == DT_ERR_PEER_FAILED ? DT_ERR_TIMEOUT : waited, DT_ERR_TIMEOUT);
    /* Of all these calls only the valid gather counted (comm.h): rejected
     * and failed calls count nothing. */
    dt_comm_counters k;
    EXPECT(dt_comm_counters_get(comm, &k), DT_SUCCESS);
    for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++)
        if (k.calls[kind] != (kind == DT_COMM_GATHER) ||
            k.bytes_sent[kind] != (kind == DT_COMM_GATHER && r > 0 ? 4u : 0u) ||
            k.bytes_recv[kind] != (kind == DT_COMM_GATHER && r == 0 ? 4u * (c->p - 1) : 0u)) {
            c->bad[r]++;
            snprintf(c->msg[r], sizeof c->msg[r], "counters of %s: %llu calls, %llu sent, %llu "
                     "received", dt_comm_kind_name((dt_comm_kind)kind),
                     (unsigned long long)k.calls[kind], (unsigned long long)k.bytes_sent[kind],
                     (unsigned long long)k.bytes_recv[kind]);
        }
#undef EXPECT
    /* Rejected calls wrote nothing: x is intact, and y only holds what the
     * valid gather put on rank 0 (x[0] of every rank). */
    float y_ref[4] = {5, 6, 7, 8};
    if (r == 0)
        for (int q = 0; q < c->p; q++) y_ref[q] = 1;
    if (x[0] != 1 || x[3] != 4 || memcmp(y, y_ref, sizeof y) != 0) c->bad[r]++;
    c->st[r] = DT_SUCCESS;
    return DT_SUCCESS;
}

static void test_bad_arguments(void **state) {
    (void)state;
    for (int p = 1; p <= 3; p++) {
        coll_case c = {.p = p};
        /* The last case times out on purpose, which aborts the world. */
        dt_status st = launch(&c, rank_bad_args, 200);
        assert_int_equal(st, DT_ERR_TIMEOUT);
        for (int r = 0; r < p; r++) if (c.bad[r]) print_error("rank %d: %s\n", r, c.msg[r]);
        assert_all_ok(&c);
    }
}

/* dt_backoff: a poll past `spins` sleeps at least `us`, and the thread's
 * timer slack is what it was before (lowered for the sleep only); one
 * before `spins` only yields. */
static double backoff_us(unsigned spin) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    dt_backoff(spin, 200, 20);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3;
}

static void test_backoff(void **state) {
    (void)state;
#ifdef __linux__
    const int saved = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    assert_true(saved > 0);
    assert_int_equal(prctl(PR_SET_TIMERSLACK, 50000UL, 0, 0, 0), 0);
    for (int i = 0; i < 20; i++) assert_true(backoff_us(200) >= 20.0);
    assert_int_equal(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), 50000);
    backoff_us(0);
    assert_int_equal(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), 50000);
    assert_int_equal(prctl(PR_SET_TIMERSLACK, (unsigned long)saved, 0, 0, 0), 0);
#else
    for (int i = 0; i < 20; i++) assert_true(backoff_us(200) >= 20.0);
#endif
}

/* The NCCL transport's teardown clock (pure; the transport itself needs
 * GPUs): a teardown wait counts only while every rank of the process is in
 * a teardown, from the later of its own start and the last arrival. */
static void test_idle_clock(void **state) {
    (void)state;
    dt_idle_clock k;
    /* P = 3 threads. Rank 0 arrives at 100: ranks 1 and 2 still work. */
    dt_idle_clock_init(&k, 3);
    assert_int_equal(dt_idle_clock_waited(&k, 0, 5000), 0);
    dt_idle_clock_enter(&k, 100);
    assert_int_equal(dt_idle_clock_waited(&k, 100, 900000), 0); /* long, but not late */
    dt_idle_clock_enter(&k, 200);
    assert_int_equal(dt_idle_clock_waited(&k, 100, 900000), 0);
    /* The last arrives at 1000: the clock runs for every waiter from then. */
    dt_idle_clock_enter(&k, 1000);
    assert_int_equal(dt_idle_clock_waited(&k, 100, 1500), 500);
    assert_int_equal(dt_idle_clock_waited(&k, 200, 1000), 0);
    /* A wait that began after the last arrival counts from its own start. */
    assert_int_equal(dt_idle_clock_waited(&k, 1200, 1500), 300);
    assert_int_equal(dt_idle_clock_waited(&k, 1200, 1100), 0); /* clock read before the start */
    /* A rank goes back to its function (a sub-communicator's teardown
     * ended): the clock stops, and restarts from its next arrival. */
    dt_idle_clock_leave(&k);
    assert_int_equal(dt_idle_clock_waited(&k, 100, 9000), 0);
    dt_idle_clock_enter(&k, 9000);
    assert_int_equal(dt_idle_clock_waited(&k, 100, 9250), 250);
    /* An extra arrival cannot push the count below zero nor move the start. */
    dt_idle_clock_enter(&k, 9100);
    assert_int_equal(dt_idle_clock_waited(&k, 100, 9250), 250);
    dt_idle_clock_leave(&k);
    assert_int_equal(dt_idle_clock_waited(&k, 100, 9250), 0);
    /* One rank per process: the clock runs from the rank's own arrival, as
     * any other wait's. */
    dt_idle_clock_init(&k, 1);
    dt_idle_clock_enter(&k, 40);
    assert_int_equal(dt_idle_clock_waited(&k, 40, 640), 600);
}

/* A world's first failure (failure.h; every transport's record, pure): the
 * first is kept, and each rank's error follows from it: the failure itself
 * where it happened, DT_ERR_PEER_FAILED naming it elsewhere, a mismatch as
 * a mismatch everywhere. */
static void test_failure_record(void **state) {
    (void)state;
    dt_failure f;
    memset(&f, 0, sizeof f);
    int rank = 7;
    char msg[64] = "stale";
    assert_int_equal(dt_failure_get(&f, &rank, msg, sizeof msg), DT_SUCCESS);
    assert_int_equal(rank, -1);
    assert_string_equal(msg, "");
    assert_int_equal(dt_failure_error(&f, 0, "allreduce"), DT_ERR_INTERNAL);

    assert_int_equal(dt_failure_record(&f, 2, DT_ERR_TIMEOUT, "rank 2: recv timed out"), 1);
    assert_int_equal(dt_failure_record(&f, 1, DT_ERR_BACKEND, "later"), 0);   /* kept: the first */
    assert_int_equal(dt_failure_get(&f, &rank, msg, sizeof msg), DT_ERR_TIMEOUT);
    assert_int_equal(rank, 2);
    assert_string_equal(msg, "rank 2: recv timed out");
    assert_int_equal(dt_failure_get(&f, NULL, NULL, 0), DT_ERR_TIMEOUT);
    assert_int_equal(dt_failure_get(&f, NULL, msg, 5), DT_ERR_TIMEOUT);   /* cut to fit */
    assert_string_equal(msg, "rank");

    /* where it happened: the failure itself; elsewhere: the peer's */
    assert_int_equal(dt_failure_error(&f, 2, "allreduce"), DT_ERR_TIMEOUT);
    assert_string_equal(dt_last_error(), "rank 2: recv timed out");
    assert_int_equal(dt_failure_error(&f, 0, "allreduce"), DT_ERR_PEER_FAILED);
    assert_string_equal(dt_last_error(),
                        "rank 0: allreduce stopped: rank 2 failed: rank 2: recv timed out");

    /* a mismatch is the program's: every rank says so */
    memset(&f, 0, sizeof f);
    assert_int_equal(dt_failure_record(&f, 3, DT_ERR_MISMATCH, "sizes differ"), 1);
    assert_int_equal(dt_failure_error(&f, 1, "sendrecv"), DT_ERR_MISMATCH);
    assert_non_null(strstr(dt_last_error(), "rank 3 failed: sizes differ"));
    assert_int_equal(dt_failure_error(&f, 3, "sendrecv"), DT_ERR_MISMATCH);

    /* a message longer than the record is cut, never overflowed; NULL is "" */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    memset(&f, 0, sizeof f);
    assert_int_equal(dt_failure_record(&f, 0, DT_ERR_SYSTEM, big), 1);
    assert_int_equal(strlen(f.msg), sizeof f.msg - 1);
    memset(&f, 0, sizeof f);
    assert_int_equal(dt_failure_record(&f, 0, DT_ERR_SYSTEM, NULL), 1);
    assert_int_equal(dt_failure_get(&f, &rank, msg, sizeof msg), DT_ERR_SYSTEM);
    assert_int_equal(rank, 0);
    assert_string_equal(msg, "");
}

/* Host memory hooks that count publish calls and can slow a rank's copies
 * down: a rank thread of a world made here (not by dt_launch) passes
 * {&hooked_ops, its hook_rank} as its communicator's memory. */
typedef struct hook_rank {
    dt_local_world *world;
    int rank, size;
    int publishes;                  /* publish calls of this rank's memory */
    int after_check, after_gather;  /* publishes after each step (test_checks_do_not_publish) */
    long copy_delay_ms;             /* slept before each copy */
    dt_status st;
    char msg[256];
} hook_rank;

static dt_status hooked_publish(void *arg) {
    ((hook_rank *)arg)->publishes++;
    return DT_SUCCESS;
}
static dt_status hooked_alloc(void *arg, size_t bytes, void **out) {
    (void)arg;
    return dt_mem_host.ops->alloc(dt_mem_host.arg, bytes, out);
}
static void hooked_free(void *arg, void *p) {
    (void)arg;
    dt_mem_host.ops->free(dt_mem_host.arg, p);
}
static dt_status hooked_copy(void *arg, void *dst, const void *src, size_t bytes,
                             const void *dst_ready, const void *src_ready) {
    sleep_ms(((hook_rank *)arg)->copy_delay_ms);
    return dt_mem_host.ops->copy(dt_mem_host.arg, dst, src, bytes, dst_ready, src_ready);
}
static dt_status hooked_mark(void *arg, int chained, const void **ready) {
    (void)arg;
    return dt_mem_host.ops->mark(dt_mem_host.arg, chained, ready);
}
static dt_status hooked_reduce(void *arg, float *acc, const void *x, size_t n, dt_dtype dtype,
                               dt_reduce_op op, int first) {
    (void)arg;
    return dt_mem_host.ops->reduce(dt_mem_host.arg, acc, x, n, dtype, op, first);
}
static dt_status hooked_finish(void *arg, void *acc, size_t n, dt_dtype dtype) {
    (void)arg;
    return dt_mem_host.ops->finish(dt_mem_host.arg, acc, n, dtype);
}
static dt_status hooked_find_nonfinite(void *arg, const void *x, size_t n, dt_dtype dtype,
                                       int64_t *first) {
    (void)arg;
    return dt_mem_host.ops->find_nonfinite(dt_mem_host.arg, x, n, dtype, first);
}
static const dt_mem_ops hooked_ops = {"hooked", hooked_alloc, hooked_free, hooked_copy,
                                      hooked_publish, hooked_mark, hooked_reduce, hooked_finish,
                                      hooked_find_nonfinite};

/* Runs main(r) on a thread per rank of a new world of p ranks, each with its
 * hooked memory; r[j] is set up by the caller but for world, rank, size.
 * check: DT_CHECK's agreement check before every collective. */
static void run_hooked(int p, long timeout_ms, int check, hook_rank *r,
                       void *(*main_fn)(void *)) {
    dt_comm_config cfg = {.timeout_ms = timeout_ms, .log_level = DT_LOG_ERROR, .check = check};
    dt_local_world *w = NULL;
    assert_int_equal(dt_local_world_create(p, &cfg, &w), DT_SUCCESS);
    pthread_t th[MAXP];
    for (int j = 0; j < p; j++) {
        r[j].world = w;
        r[j].rank = j;
        r[j].size = p;
        assert_int_equal(pthread_create(&th[j], NULL, main_fn, &r[j]), 0);
    }
    for (int j = 0; j < p; j++) pthread_join(th[j], NULL);
    dt_local_world_destroy(w);
}

/* A rank's status, its message kept; a failure aborts the world. */
static void hooked_record(hook_rank *r, dt_status st) {
    r->st = st;
    if (st == DT_SUCCESS) return;
    snprintf(r->msg, sizeof r->msg, "%s", dt_last_error());
    dt_local_world_abort(r->world, r->rank, r->st, r->msg);
}

/* An agreement check orders nothing on the device: the local transport
 * publishes (on CUDA: waits for the rank's compute stream) before a
 * collective over the rank's buffers, but not before a check's all_gather of
 * host tables, so a check never drains a GPU's queue. Counted through the
 * hooks, with checks on (DT_CHECK: every collective is preceded by a check
 * of its own). */
static void *publish_rank_main(void *arg) {
    hook_rank *r = arg;
    dt_mem mem = {&hooked_ops, r};
    dt_comm *comm = NULL;
    dt_status st = dt_local_world_comm(r->world, r->rank, &mem, &comm);
    int64_t mine[2] = {7, r->size};
    static const char *const names[2] = {"seven", "size"};
    if (st == DT_SUCCESS) st = dt_comm_check_agreement(comm, "test", mine, names, 2);
    r->after_check = r->publishes;
    float send[4], recv[4 * MAXP];
    for (int i = 0; i < 4; i++) send[i] = value(5, r->rank, (size_t)i);
    if (st == DT_SUCCESS) st = dt_comm_all_gather(comm, send, recv, 4, DT_F32);
    r->after_gather = r->publishes;
    hooked_record(r, st);
    dt_comm_destroy(comm);
    return NULL;
}

static void test_checks_do_not_publish(void **state) {
    (void)state;
    for (int p = 1; p <= 3; p++) {
        hook_rank r[3] = {{0}};
        run_hooked(p, 10000, 1, r, publish_rank_main);
        for (int j = 0; j < p; j++) {
            if (r[j].st != DT_SUCCESS) print_error("rank %d: %s\n", j, r[j].msg);
            assert_int_equal(r[j].st, DT_SUCCESS);
            assert_int_equal(r[j].after_check, 0);   /* the check: none */
            assert_int_equal(r[j].after_gather, 1);  /* its own check: none; the gather: one */
        }
    }
}

/* Departure has a deadline of its own. Rank 1 enters a gather at once, the
 * root DEPART_MS * 3/5 later (in time), and the root's two copies take
 * DEPART_MS * 3/10 each: the root reads rank 1's send buffer at 6/5 of the
 * timeout after rank 1 arrived. Rank 1 must still be waiting then, and
 * only then get its buffer back (which it overwrites at once): a departure
 * bounded by what arrival left of one timeout gave it back at 1x, and the
 * root gathered the overwritten values. */
enum { DEPART_MS = 2000, DEPART_N = 4096 };
static float depart_recv[2 * DEPART_N];

static void *depart_rank_main(void *arg) {
    hook_rank *r = arg;
    dt_mem mem = {&hooked_ops, r};
    dt_comm *comm = NULL;
    float *send = malloc(DEPART_N * sizeof *send);
    dt_status st = send ? dt_local_world_comm(r->world, r->rank, &mem, &comm)
                        : dt_error(DT_ERR_OUT_OF_MEMORY, "test: no send buffer");
    for (size_t i = 0; send && i < DEPART_N; i++) send[i] = value(11, r->rank, i);
    if (st == DT_SUCCESS && r->rank == 0) sleep_ms(DEPART_MS * 3 / 5);
    if (st == DT_SUCCESS) st = dt_comm_gather(comm, send, depart_recv, DEPART_N, DT_F32, 0);
    for (size_t i = 0; send && i < DEPART_N; i++) send[i] = NAN;   /* the buffer is the caller's again */
    hooked_record(r, st);
    dt_comm_destroy(comm);
    free(send);
    return NULL;
}

static void test_departure_outlasts_arrival(void **state) {
    (void)state;
    hook_rank r[2] = {{.copy_delay_ms = DEPART_MS * 3 / 10}, {0}};
    for (size_t i = 0; i < 2 * DEPART_N; i++) depart_recv[i] = NAN;
    run_hooked(2, DEPART_MS, 0, r, depart_rank_main);
    for (int j = 0; j < 2; j++) {
        if (r[j].st != DT_SUCCESS) print_error("rank %d: %s\n", j, r[j].msg);
        assert_int_equal(r[j].st, DT_SUCCESS);
    }
    int bad = 0;
    for (int m = 0; m < 2; m++)
        for (size_t i = 0; i < DEPART_N; i++)
            bad += !(depart_recv[(size_t)m * DEPART_N + i] == value(11, m, i));
    if (bad) print_error("%d gathered values differ from the ranks' data\n", bad);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_clock),
        cmocka_unit_test(test_failure_record),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_all_reduce_same_bits_on_every_rank),
        cmocka_unit_test(test_all_gather_reduce_scatter),
        cmocka_unit_test(test_all_to_all),
        cmocka_unit_test(test_broadcast_scatter_gather_every_root),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_sendrecv_alltoall),
        cmocka_unit_test(test_sendrecv_ordered_across_groups),
        cmocka_unit_test(test_local_copies_off),
        cmocka_unit_test(test_mismatched_collectives),
        cmocka_unit_test(test_mismatched_send_recv),
        cmocka_unit_test(test_all_to_all_mismatch),
        cmocka_unit_test(test_failures_do_not_hang),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_counters_split),
        cmocka_unit_test(test_counters_wait_time),
        cmocka_unit_test(test_checks_do_not_publish),
        cmocka_unit_test(test_departure_outlasts_arrival),
    };
    return cmocka_run_group_tests_name("collectives (cpu+local, P=1..8)", tests, NULL, NULL);
}
