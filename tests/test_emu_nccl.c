/* tests/test_emu_nccl.c — the CPU emulation of NCCL (tests/emu/nccl.c) that
 * lets the NCCL transport run without a GPU (make CUDA=emu).
 *
 * Most cases drive every rank from the main thread (the communicators are
 * non-blocking, so one thread can post every rank's part), which makes the
 * order of posts and waits exact: init is in progress until the last rank
 * joins; collectives (all_reduce sum/max/avg, reduce, all_gather,
 * reduce_scatter, broadcast, all_to_all) and send/receive groups for P = 1..4 give, on
 * every rank, exactly the rank-order reduction computed here (bf16 and
 * fp16 rounded at every step, as nccl.c documents), written only when a
 * wait runs the work; a rank whose peer has not posted stays not ready
 * until the peer posts, or until it aborts (then its stream drains); split
 * (colors, keys, NCCL_SPLIT_NOCOLOR); finalize; a mismatch fails every
 * rank's stream. One case runs 4 rank threads at once. The last cases run
 * dtensor's NCCL transport on it through dt_launch (all_to_all, the
 * communication counters, failures). Values come from (seed, rank, index).
 * Skipped unless built with CUDA=emu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#ifdef DT_EMU_NCCL_SKIP

static void test_skipped(void **state) {
    (void)state;
    print_message("skipped: the emulated NCCL is built only with make CUDA=emu\n");
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        {"emulated NCCL (needs make CUDA=emu)", test_skipped, NULL, NULL, NULL}};
    return h_run_cases("NCCL on the CPU (tests/emu/nccl.c)", tests, 1);
}

#else

#include "base/dtype.h"
#include "collectives/comm.h"
#include "dtensor/backend.h"
#include "dtensor/context_internal.h"
#include "dtensor/dtensor.h"
#include "emu/include/cuda_runtime_api.h"
#include "emu/include/nccl.h"

#define MAXP 4

static float val(int seed, int rank, size_t i) {
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull +
                 i * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    /* not small integers: bf16 and fp16 sums round */
    return (float)((int)(x % 2001) - 1000) / 77.0f;
}

static size_t esize(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 2; }

static void put(void *p, ncclDataType_t t, size_t i, float v) {
    if (t == ncclFloat32) ((float *)p)[i] = v;
    else if (t == ncclBfloat16) ((uint16_t *)p)[i] = dt_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = dt_f32_to_f16(v);
}

static float get(const void *p, ncclDataType_t t, size_t i) {
    if (t == ncclFloat32) return ((const float *)p)[i];
    if (t == ncclBfloat16) return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    return dt_f16_to_f32(((const uint16_t *)p)[i]);
}

static float round_to(ncclDataType_t t, float v) {
    if (t == ncclFloat32) return v;
    float h[1];   /* room for any type */
    put(h, t, 0, v);
    return get(h, t, 0);
}

/* The rank-order reduction of element i of every rank's input (seed), each
 * step rounded to the type. */
static float want_reduce(ncclDataType_t t, ncclRedOp_t op, int seed, int P, size_t i) {
    float acc = round_to(t, val(seed, 0, i));
    for (int r = 1; r < P; r++) {
        float x = round_to(t, val(seed, r, i));
        acc = round_to(t, op == ncclMax ? (x > acc ? x : acc) : acc + x);
    }
    if (op == ncclAvg) acc = round_to(t, acc / (float)P);
    return acc;
}

/* P ranks driven from this thread: a device, a stream and a communicator each. */
typedef struct world {
    int P;
    cudaStream_t s[MAXP];
    ncclComm_t c[MAXP];
} world;

static char *g_saved_devices;

static int setup(void **state) {
    (void)state;
    g_saved_devices = h_env_set("DT_EMU_DEVICES", "4");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    h_env_restore("DT_EMU_DEVICES", g_saved_devices);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    return 0;
}

static ncclConfig_t nonblocking(void) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

static void world_init(world *w, int P) {
    memset(w, 0, sizeof *w);
    w->P = P;
    ncclUniqueId id;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    for (int r = 0; r < P; r++) {
        assert_int_equal(cudaSetDevice(r), cudaSuccess);
        assert_int_equal(cudaStreamCreateWithFlags(&w->s[r], cudaStreamNonBlocking), cudaSuccess);
        ncclConfig_t cfg = nonblocking();
        ncclResult_t res = ncclCommInitRankConfig(&w->c[r], P, id, r, &cfg);
        assert_int_equal(res, r == P - 1 ? ncclSuccess : ncclInProgress);
    }
    for (int r = 0; r < P; r++) {
        ncclResult_t st = ncclInProgress;
        assert_int_equal(ncclCommGetAsyncError(w->c[r], &st), ncclSuccess);
        assert_int_equal(st, ncclSuccess);
    }
}

static void world_destroy(world *w) {
    for (int r = 0; r < w->P; r++) {
        assert_int_equal(cudaSetDevice(r), cudaSuccess);
        if (w->c[r]) assert_int_equal(ncclCommDestroy(w->c[r]), ncclSuccess);
        assert_int_equal(cudaStreamDestroy(w->s[r]), cudaSuccess);
    }
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
}

static void *dev_alloc(int r, size_t bytes) {
    void *p = NULL;
    assert_int_equal(cudaSetDevice(r), cudaSuccess);
    assert_int_equal(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
}

static void dev_free(int r, void *p) {
    assert_int_equal(cudaSetDevice(r), cudaSuccess);
    assert_int_equal(cudaFree(p), cudaSuccess);
}

/* ------------------------------------------------------------------ init */

static void test_init(void **state) {
    (void)state;
    ncclUniqueId id;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c[3] = {NULL, NULL, NULL};
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ncclConfig_t cfg = nonblocking();
    ncclResult_t st = ncclSuccess;
    for (int r = 0; r < 2; r++) {
        assert_int_equal(cudaSetDevice(r), cudaSuccess);
        assert_int_equal(ncclCommInitRankConfig(&c[r], 3, id, r, &cfg), ncclInProgress);
        assert_non_null(c[r]);
        assert_int_equal(ncclCommGetAsyncError(c[r], &st), ncclSuccess);
        assert_int_equal(st, ncclInProgress);
    }
    /* Not usable yet; the same rank twice, another nranks, a bad config. */
    int n = 0;
    assert_int_equal(ncclCommCount(c[0], &n), ncclInvalidArgument);
    assert_non_null(strstr(ncclGetLastError(c[0]), "before the previous operation"));
    ncclComm_t bad = NULL;
    assert_int_equal(ncclCommInitRankConfig(&bad, 3, id, 1, &cfg), ncclInvalidArgument);
    assert_int_equal(ncclCommInitRankConfig(&bad, 4, id, 2, &cfg), ncclInvalidArgument);
    ncclConfig_t junk;
    memset(&junk, 0, sizeof junk);
    assert_int_equal(ncclCommInitRankConfig(&bad, 3, id, 2, &junk), ncclInvalidArgument);
    assert_int_equal(ncclCommInitRankConfig(&bad, 3, id, 3, &cfg), ncclInvalidArgument);
    assert_null(bad);
    /* The last rank completes it for everyone. */
    assert_int_equal(cudaSetDevice(2), cudaSuccess);
    assert_int_equal(ncclCommInitRankConfig(&c[2], 3, id, 2, &cfg), ncclSuccess);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(ncclCommGetAsyncError(c[r], &st), ncclSuccess);
        assert_int_equal(st, ncclSuccess);
        int rank = -1, dev = -1;
        assert_int_equal(ncclCommCount(c[r], &n), ncclSuccess);
        assert_int_equal(ncclCommUserRank(c[r], &rank), ncclSuccess);
        assert_int_equal(ncclCommCuDevice(c[r], &dev), ncclSuccess);
        assert_int_equal(n, 3);
        assert_int_equal(rank, r);
        assert_int_equal(dev, r);
    }
    /* The NULL stream and another device's stream are refused. */
    float *x = dev_alloc(0, 16);
    assert_int_equal(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c[0], NULL), ncclInvalidArgument);
    assert_int_equal(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c[1], s), ncclInvalidArgument);
    assert_non_null(strstr(ncclGetLastError(NULL), "device"));
    dev_free(0, x);
    for (int r = 0; r < 3; r++) assert_int_equal(ncclCommDestroy(c[r]), ncclSuccess);
    assert_int_equal(ncclCommDestroy(c[0]) != ncclSuccess, 1);   /* not a live one any more */
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    int v = 0;
    assert_int_equal(ncclGetVersion(&v), ncclSuccess);
    assert_int_equal(v, NCCL_VERSION_CODE);
    assert_string_equal(ncclGetErrorString(ncclInProgress), "NCCL operation in progress");
}

/* ------------------------------------------------------------ collectives */

typedef struct coll_case {
    int P;
    ncclDataType_t dt;
    char name[96];
} coll_case;

enum { N = 301 };

/* Posts rank r's part of the k-th collective of the sequence. */
typedef struct bufs {
    void *in[MAXP], *out[MAXP];
} bufs;

static void run_all(world *w) {
    for (int r = 0; r < w->P; r++) assert_int_equal(cudaStreamQuery(w->s[r]), cudaSuccess);
}

static long check(const char *what, int r, const void *got, ncclDataType_t t, size_t n,
                  float (*want)(size_t i, const void *arg), const void *arg) {
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        float g = get(got, t, i), e = want(i, arg);
        if (g != e && bad++ == 0)
            print_error("%s: rank %d [%zu]: got %.9g, expected %.9g\n", what, r, i, (double)g,
                        (double)e);
    }
    return bad;
}

typedef struct wa {
    ncclDataType_t t;
    ncclRedOp_t op;
    int seed, P, root, rank;
} wa;

static float w_reduce(size_t i, const void *arg) {
    const wa *a = arg;
    return want_reduce(a->t, a->op, a->seed, a->P, i);
}
static float w_scatter(size_t i, const void *arg) {
    const wa *a = arg;
    return want_reduce(a->t, a->op, a->seed, a->P, (size_t)a->rank * N + i);
}
static float w_gather(size_t i, const void *arg) {
    const wa *a = arg;
    return round_to(a->t, val(a->seed, (int)(i / N), i % N));
}
static float w_root(size_t i, const void *arg) {
    const wa *a = arg;
    return round_to(a->t, val(a->seed, a->root, i));
}
static float w_a2a(size_t i, const void *arg) {   /* block s: rank s's block `rank` */
    const wa *a = arg;
    return round_to(a->t, val(a->seed, (int)(i / N), (size_t)a->rank * N + i % N));
}

static void fill(void *p, ncclDataType_t t, int seed, int rank, size_t n) {
    for (size_t i = 0; i < n; i++) put(p, t, i, val(seed, rank, i));
}

/* Uploads rank r's input through a pinned buffer (the copy is stream work
 * too, run before the collective). */
static void upload(world *w, int r, void *dev, ncclDataType_t t, int seed, size_t n) {
    void *h = NULL;
    assert_int_equal(cudaHostAlloc(&h, n * esize(t), cudaHostAllocDefault), cudaSuccess);
    fill(h, t, seed, r, n);
    assert_int_equal(cudaMemcpyAsync(dev, h, n * esize(t), cudaMemcpyHostToDevice, w->s[r]),
                     cudaSuccess);
    assert_int_equal(cudaStreamQuery(w->s[r]), cudaSuccess);
    assert_int_equal(cudaFreeHost(h), cudaSuccess);
}

static void test_collectives(void **state) {
    coll_case *cc = *state;
    const int P = cc->P;
    const ncclDataType_t t = cc->dt;
    const size_t es = esize(t);
    world w;
    world_init(&w, P);
    bufs b;
    void *host = malloc((size_t)P * N * es);
    for (int r = 0; r < P; r++) {
        b.in[r] = dev_alloc(r, (size_t)P * N * es);
        b.out[r] = dev_alloc(r, (size_t)(P + 1) * N * es);
    }
    long bad = 0;

    /* all_reduce sum, out of place; nothing is written before a wait, and
     * rank 0's stream is not ready until the last rank has posted. */
    for (int r = 0; r < P; r++) upload(&w, r, b.in[r], t, 11, N);
    for (int r = 0; r < P; r++) {
        assert_int_equal(cudaSetDevice(r), cudaSuccess);
        assert_int_equal(ncclAllReduce(b.in[r], b.out[r], N, t, ncclSum, w.c[r], w.s[r]),
                         ncclSuccess);
        if (r < P - 1) assert_int_equal(cudaStreamQuery(w.s[0]), cudaErrorNotReady);
    }
    (void)cudaGetLastError();
    assert_int_equal(((unsigned char *)b.out[P - 1])[0], 0xcd);   /* cudaMalloc garbage */
    run_all(&w);
    for (int r = 0; r < P; r++) {
        wa a = {t, ncclSum, 11, P, 0, r};
        bad += check("all_reduce sum", r, b.out[r], t, N, w_reduce, &a);
    }

    /* max and avg in place, queued back to back; reduce to root P-1 */
    for (int r = 0; r < P; r++) upload(&w, r, b.in[r], t, 12, N);
    for (int r = 0; r < P; r++) upload(&w, r, b.out[r], t, 13, N);
    for (int r = P - 1; r >= 0; r--) {
        assert_int_equal(ncclAllReduce(b.in[r], b.in[r], N, t, ncclMax, w.c[r], w.s[r]), ncclSuccess);
        assert_int_equal(ncclAllReduce(b.out[r], b.out[r], N, t, ncclAvg, w.c[r], w.s[r]), ncclSuccess);
    }
    run_all(&w);
    for (int r = 0; r < P; r++) {
        wa a = {t, ncclMax, 12, P, 0, r}, v = {t, ncclAvg, 13, P, 0, r};
        bad += check("all_reduce max in place", r, b.in[r], t, N, w_reduce, &a);
        bad += check("all_reduce avg in place", r, b.out[r], t, N, w_reduce, &v);
    }
    for (int r = 0; r < P; r++) upload(&w, r, b.in[r], t, 14, N);
    for (int r = 0; r < P; r++)
        assert_int_equal(ncclReduce(b.in[r], r == P - 1 ? b.out[r] : NULL, N, t, ncclSum, P - 1,
                                    w.c[r], w.s[r]),
                         ncclSuccess);
    run_all(&w);
    {
        wa a = {t, ncclSum, 14, P, 0, P - 1};
        bad += check("reduce", P - 1, b.out[P - 1], t, N, w_reduce, &a);
    }

    /* reduce_scatter, all_gather (in place), broadcast (root P-1) */
    for (int r = 0; r < P; r++) upload(&w, r, b.in[r], t, 15, (size_t)P * N);
    for (int r = 0; r < P; r++)
        assert_int_equal(ncclReduceScatter(b.in[r], b.out[r], N, t, ncclSum, w.c[r], w.s[r]),
                         ncclSuccess);
    run_all(&w);
    for (int r = 0; r < P; r++) {
        wa a = {t, ncclSum, 15, P, 0, r};
        bad += check("reduce_scatter", r, b.out[r], t, N, w_scatter, &a);
    }
    for (int r = 0; r < P; r++) upload(&w, r, (char *)b.out[r] + (size_t)r * N * es, t, 16, N);
    for (int r = 0; r < P; r++)
        assert_int_equal(ncclAllGather((char *)b.out[r] + (size_t)r * N * es, b.out[r], N, t, w.c[r],
                                       w.s[r]),
                         ncclSuccess);
    run_all(&w);
    for (int r = 0; r < P; r++) {
        wa a = {t, ncclSum, 16, P, 0, r};
        bad += check("all_gather in place", r, b.out[r], t, (size_t)P * N, w_gather, &a);
    }
    for (int r = 0; r < P; r++) upload(&w, r, b.in[r], t, 17, N);
    for (int r = 0; r < P; r++)
        assert_int_equal(ncclBroadcast(b.in[r], b.in[r], N, t, P - 1, w.c[r], w.s[r]), ncclSuccess);
    run_all(&w);
    for (int r = 0; r < P; r++) {
        wa a = {t, ncclSum, 17, P, P - 1, r};
        bad += check("broadcast", r, b.in[r], t, N, w_root, &a);
    }

    /* all_to_all, queued in reverse rank order */
    for (int r = 0; r < P; r++) upload(&w, r, b.in[r], t, 19, (size_t)P * N);
    for (int r = P - 1; r >= 0; r--)
        assert_int_equal(ncclAlltoAll(b.in[r], b.out[r], N, t, w.c[r], w.s[r]), ncclSuccess);
    run_all(&w);
    for (int r = 0; r < P; r++) {
        wa a = {t, ncclSum, 19, P, 0, r};
        bad += check("all_to_all", r, b.out[r], t, (size_t)P * N, w_a2a, &a);
    }

    /* send/recv group: to r+1, from r-1, and to/from itself */
    for (int r = 0; r < P; r++) upload(&w, r, b.in[r], t, 18, N);
    for (int r = 0; r < P; r++) {
        assert_int_equal(ncclGroupStart(), ncclSuccess);
        assert_int_equal(ncclSend(b.in[r], N, t, (r + 1) % P, w.c[r], w.s[r]), ncclSuccess);
        assert_int_equal(ncclRecv(b.out[r], N, t, (r + P - 1) % P, w.c[r], w.s[r]), ncclSuccess);
        assert_int_equal(ncclSend(b.in[r], N, t, r, w.c[r], w.s[r]), ncclSuccess);
        assert_int_equal(ncclRecv((char *)b.out[r] + N * es, N, t, r, w.c[r], w.s[r]), ncclSuccess);
        assert_int_equal(ncclGroupEnd(), ncclSuccess);
    }
    run_all(&w);
    for (int r = 0; r < P; r++) {
        wa from = {t, ncclSum, 18, P, (r + P - 1) % P, r}, self = {t, ncclSum, 18, P, r, r};
        bad += check("send/recv from r-1", r, b.out[r], t, N, w_root, &from);
        bad += check("send/recv to self", r, (char *)b.out[r] + N * es, t, N, w_root, &self);
    }

    for (int r = 0; r < P; r++) {
        dev_free(r, b.in[r]);
        dev_free(r, b.out[r]);
    }
    free(host);
    world_destroy(&w);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------------- not ready, abort, split */

static void test_missing_peer(void **state) {
    (void)state;
    world w;
    world_init(&w, 2);
    float *x0 = dev_alloc(0, 64 * 4), *x1 = dev_alloc(1, 64 * 4);
    cudaEvent_t ev = NULL, ev1 = NULL;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaEventCreate(&ev), cudaSuccess);
    assert_int_equal(cudaEventCreate(&ev1), cudaSuccess);
    /* Rank 0 posts, rank 1 does not: not ready, however often asked. */
    assert_int_equal(ncclAllReduce(x0, x0, 64, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclSuccess);
    assert_int_equal(cudaEventRecord(ev, w.s[0]), cudaSuccess);
    (void)cudaGetLastError();
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cudaStreamQuery(w.s[0]), cudaErrorNotReady);
        assert_int_equal(cudaEventQuery(ev), cudaErrorNotReady);
    }
    /* not ready is not an error: not kept as the last error (as in CUDA) */
    assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
    /* A stream waiting on that event is not ready either. */
    assert_int_equal(cudaStreamWaitEvent(w.s[1], ev, 0), cudaSuccess);
    assert_int_equal(cudaEventRecord(ev1, w.s[1]), cudaSuccess);
    assert_int_equal(cudaEventQuery(ev1), cudaErrorNotReady);
    ncclResult_t st = ncclInProgress;
    assert_int_equal(ncclCommGetAsyncError(w.c[0], &st), ncclSuccess);
    assert_int_equal(st, ncclSuccess);   /* nothing failed: it waits */
    /* Rank 0 aborts: its stream drains (the event wait and rank 1's stream too). */
    assert_int_equal(ncclCommAbort(w.c[0]), ncclSuccess);
    w.c[0] = NULL;
    assert_int_equal(cudaStreamQuery(w.s[0]), cudaSuccess);
    assert_int_equal(cudaEventQuery(ev), cudaSuccess);
    assert_int_equal(cudaEventQuery(ev1), cudaSuccess);
    /* Rank 1 posting now finds no peer: not ready until it aborts too. */
    assert_int_equal(ncclAllReduce(x1, x1, 64, ncclFloat32, ncclSum, w.c[1], w.s[1]), ncclSuccess);
    assert_int_equal(cudaStreamQuery(w.s[1]), cudaErrorNotReady);
    (void)cudaGetLastError();
    assert_int_equal(ncclCommAbort(w.c[1]), ncclSuccess);
    w.c[1] = NULL;
    assert_int_equal(cudaStreamQuery(w.s[1]), cudaSuccess);
    assert_int_equal(cudaEventDestroy(ev), cudaSuccess);
    assert_int_equal(cudaEventDestroy(ev1), cudaSuccess);
    dev_free(0, x0);
    dev_free(1, x1);
    world_destroy(&w);
}

/* Two communicators' collectives posted in opposite orders: a cycle, not
 * ready on both (NCCL would hang), until both abort. */
static void test_cycle(void **state) {
    (void)state;
    world a, b;
    world_init(&a, 2);
    world_init(&b, 2);
    float *x[2] = {dev_alloc(0, 16), dev_alloc(1, 16)};
    for (int r = 0; r < 2; r++) {
        ncclComm_t first = r == 0 ? a.c[r] : b.c[r], second = r == 0 ? b.c[r] : a.c[r];
        assert_int_equal(ncclAllReduce(x[r], x[r], 4, ncclFloat32, ncclSum, first, a.s[r]), ncclSuccess);
        assert_int_equal(ncclAllReduce(x[r], x[r], 4, ncclFloat32, ncclSum, second, a.s[r]), ncclSuccess);
    }
    assert_int_equal(cudaStreamQuery(a.s[0]), cudaErrorNotReady);
    assert_int_equal(cudaStreamQuery(a.s[1]), cudaErrorNotReady);
    (void)cudaGetLastError();
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ncclCommAbort(a.c[r]), ncclSuccess);
        assert_int_equal(ncclCommAbort(b.c[r]), ncclSuccess);
        a.c[r] = b.c[r] = NULL;
    }
    for (int r = 0; r < 2; r++) assert_int_equal(cudaStreamQuery(a.s[r]), cudaSuccess);
    dev_free(0, x[0]);
    dev_free(1, x[1]);
    world_destroy(&a);
    world_destroy(&b);
}

static void test_mismatch(void **state) {
    (void)state;
    world w;
    world_init(&w, 2);
    float *x[2] = {dev_alloc(0, 64), dev_alloc(1, 64)};
    assert_int_equal(ncclAllReduce(x[0], x[0], 16, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclSuccess);
    assert_int_equal(ncclAllReduce(x[1], x[1], 15, ncclFloat32, ncclSum, w.c[1], w.s[1]), ncclSuccess);
    fprintf(stderr, "(a launch-failure message is expected next)\n");
    for (int r = 0; r < 2; r++) {
        assert_int_equal(cudaStreamQuery(w.s[r]), cudaErrorLaunchFailure);
        ncclResult_t st = ncclSuccess;
        assert_int_equal(ncclCommGetAsyncError(w.c[r], &st), ncclSuccess);
        assert_int_equal(st, ncclInvalidUsage);
    }
    (void)cudaGetLastError();
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ncclCommAbort(w.c[r]), ncclSuccess);
        w.c[r] = NULL;
        dev_free(r, x[r]);
    }
    world_destroy(&w);
}

static void test_split_finalize(void **state) {
    (void)state;
    world w;
    world_init(&w, 4);
    ncclComm_t child[4] = {NULL, NULL, NULL, NULL};
    /* colors r % 2, key -r; rank 3 opts out */
    for (int r = 0; r < 4; r++) {
        assert_int_equal(cudaSetDevice(r), cudaSuccess);
        ncclConfig_t cfg = nonblocking();
        ncclResult_t res = ncclCommSplit(w.c[r], r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2, -r,
                                         &child[r], &cfg);
        assert_int_equal(res, r < 3 ? ncclInProgress : ncclSuccess);
        if (r < 3) {
            ncclResult_t st = ncclSuccess;
            assert_int_equal(ncclCommGetAsyncError(w.c[0], &st), ncclSuccess);
            assert_int_equal(st, ncclInProgress);   /* the parent too, until every rank calls */
            assert_int_equal(ncclCommGetAsyncError(child[r], &st), ncclSuccess);
            assert_int_equal(st, ncclInProgress);
        }
    }
    assert_null(child[3]);
    int want_size[3] = {2, 1, 2}, want_rank[3] = {1, 0, 0};
    for (int r = 0; r < 3; r++) {
        int n = 0, k = -1;
        ncclResult_t st = ncclInProgress;
        assert_int_equal(ncclCommGetAsyncError(child[r], &st), ncclSuccess);
        assert_int_equal(st, ncclSuccess);
        assert_int_equal(ncclCommCount(child[r], &n), ncclSuccess);
        assert_int_equal(ncclCommUserRank(child[r], &k), ncclSuccess);
        assert_int_equal(n, want_size[r]);
        assert_int_equal(k, want_rank[r]);
    }
    /* an all_reduce on the even ranks' communicator */
    float *x[3];
    for (int r = 0; r < 3; r += 2) {
        float v = (float)(r + 1);
        x[r] = dev_alloc(r, 4);
        assert_int_equal(cudaMemcpy(x[r], &v, 4, cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(ncclAllReduce(x[r], x[r], 1, ncclFloat32, ncclSum, child[r], w.s[r]),
                         ncclSuccess);
    }
    for (int r = 0; r < 3; r += 2) {
        float v = 0;
        assert_int_equal(cudaMemcpyAsync(&v, x[r], 4, cudaMemcpyDeviceToHost, w.s[r]), cudaSuccess);
        assert_true(v == 4.0f);
        dev_free(r, x[r]);
    }
    /* finalize: in progress until every rank of the communicator has called */
    ncclResult_t st = ncclSuccess;
    assert_int_equal(ncclCommFinalize(child[0]), ncclInProgress);
    assert_int_equal(ncclCommGetAsyncError(child[0], &st), ncclSuccess);
    assert_int_equal(st, ncclInProgress);
    assert_int_equal(ncclCommFinalize(child[1]), ncclSuccess);   /* alone in its communicator */
    assert_int_equal(ncclCommFinalize(child[2]), ncclSuccess);
    assert_int_equal(ncclCommGetAsyncError(child[0], &st), ncclSuccess);
    assert_int_equal(st, ncclSuccess);
    for (int r = 0; r < 3; r++) assert_int_equal(ncclCommDestroy(child[r]), ncclSuccess);
    world_destroy(&w);
}

/* ----------------------------------------------------------------- threads */

enum { ROUNDS = 40, TN = 97 };

typedef struct thread_arg {
    int rank, P;
    ncclUniqueId id;
    long bad;
    char msg[256];
} thread_arg;

static int poll_stream(cudaStream_t s) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e != cudaErrorNotReady) return e == cudaSuccess;
        (void)cudaGetLastError();
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 20) return 0;
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

static void *rank_thread(void *p) {
    thread_arg *a = p;
    const int r = a->rank, P = a->P;
    cudaStream_t s = NULL;
    ncclComm_t c = NULL;
    float *x = NULL, *y = NULL, h[TN];
    ncclConfig_t cfg = nonblocking();
    ncclResult_t st = ncclInProgress;
    if (cudaSetDevice(r) != cudaSuccess || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) ||
        cudaMalloc((void **)&x, TN * 4) || cudaMalloc((void **)&y, TN * 4)) {
        snprintf(a->msg, sizeof a->msg, "setup failed");
        a->bad++;
        return NULL;
    }
    ncclResult_t res = ncclCommInitRankConfig(&c, P, a->id, r, &cfg);
    while (res == ncclSuccess || res == ncclInProgress) {
        res = ncclCommGetAsyncError(c, &st);
        if (st != ncclInProgress) break;
        sched_yield();
    }
    if (res != ncclSuccess || st != ncclSuccess) {
        snprintf(a->msg, sizeof a->msg, "init: %s", ncclGetLastError(c));
        a->bad++;
        return NULL;
    }
    for (int k = 0; k < ROUNDS && !a->bad; k++) {
        for (int i = 0; i < TN; i++) h[i] = (float)((r + 1) * (k + i % 5));
        if (cudaMemcpyAsync(x, h, sizeof h, cudaMemcpyHostToDevice, s) != cudaSuccess ||
            ncclAllReduce(x, x, TN, ncclFloat32, ncclSum, c, s) != ncclSuccess ||
            ncclGroupStart() != ncclSuccess ||
            ncclSend(x, TN, ncclFloat32, (r + 1) % P, c, s) != ncclSuccess ||
            ncclRecv(y, TN, ncclFloat32, (r + P - 1) % P, c, s) != ncclSuccess ||
            ncclGroupEnd() != ncclSuccess || (k % 3 == 0 && !poll_stream(s)) ||
            cudaMemcpyAsync(h, y, sizeof h, cudaMemcpyDeviceToHost, s) != cudaSuccess) {
            snprintf(a->msg, sizeof a->msg, "round %d failed: %s", k, ncclGetLastError(c));
            a->bad++;
            break;
        }
        for (int i = 0; i < TN; i++) {
            float want = (float)(P * (P + 1) / 2 * (k + i % 5));
            if (h[i] != want && a->bad++ == 0)
                snprintf(a->msg, sizeof a->msg, "round %d [%d]: got %g, expected %g", k, i,
                         (double)h[i], (double)want);
        }
    }
    ncclCommFinalize(c);
    for (int i = 0; i < 200000; i++) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess || st != ncclInProgress) break;
        sched_yield();
    }
    if (st != ncclSuccess && !a->bad) {
        snprintf(a->msg, sizeof a->msg, "finalize did not complete");
        a->bad++;
    }
    ncclCommDestroy(c);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(s);
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    const int P = 4;
    thread_arg a[4];
    pthread_t th[4];
    ncclUniqueId id;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    for (int r = 0; r < P; r++) {
        memset(&a[r], 0, sizeof a[r]);
        a[r].rank = r;
        a[r].P = P;
        a[r].id = id;
        assert_int_equal(pthread_create(&th[r], NULL, rank_thread, &a[r]), 0);
    }
    long bad = 0;
    for (int r = 0; r < P; r++) {
        assert_int_equal(pthread_join(th[r], NULL), 0);
        if (a[r].bad) print_error("rank %d: %s\n", r, a[r].msg);
        bad += a[r].bad;
    }
    assert_int_equal(bad, 0);
}

/* ------------------------------------- the NCCL transport on the emulator */

/* dtensor's NCCL transport (collectives/transport_nccl.c) on this emulator,
 * through dt_launch on the CUDA backend, one emulated device per rank:
 * all_to_all (ncclAlltoAll) on device and on host (staged) buffers, every
 * dtype, against (seed, rank, index); the counters' exact calls and bytes;
 * wait_ms, which sees a late peer through a host buffer's wait but not
 * through a device buffer's queued call; a peer's failure; a mismatch under
 * DT_CHECK. Rank functions record, the main thread asserts. */
enum { TP_N = 37, TP_LATE_MS = 50 };

typedef struct tp_case {
    int P;
    dt_dtype dtype;
    int host;               /* host buffers (staged) instead of device ones */
    int mismatch;           /* rank_tp_fail: 0 a peer fails, 1 a count differs */
    dt_status st[MAXP];
    int bad[MAXP];
    char msg[MAXP][256];
    double host_wait[MAXP], dev_wait[MAXP], ms[MAXP];
    char name[96];
} tp_case;

static double tp_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void tp_sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void tp_note(tp_case *c, int r, const char *fmt, ...) {
    if (c->bad[r]++) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg[r], sizeof c->msg[r], fmt, ap);
    va_end(ap);
}

static void tp_record(tp_case *c, int r, dt_status st) {
    c->st[r] = st;
    if (st != DT_SUCCESS && !c->bad[r]) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
}

/* Element i of rank r's data, stored at index `at`: val() as the float
 * types hold it, integers made from it for u8 and i32. */
static void tp_put(void *buf, dt_dtype dt, size_t at, int seed, int r, size_t i) {
    const int v = (int)(val(seed, r, i) * 7.0f);
    switch (dt) {
    case DT_U8: ((uint8_t *)buf)[at] = (uint8_t)(v & 0xff); break;
    case DT_I32: ((int32_t *)buf)[at] = v * 65537 + r; break;
    default: dt_value_set(buf, dt, at, val(seed, r, i)); break;
    }
}

static dt_status tp_launch(tp_case *c, dt_rank_fn fn, long timeout_ms, dt_check_mode checks) {
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CUDA;
    o.transport = DT_TRANSPORT_NCCL;
    o.timeout_ms = timeout_ms;
    o.checks = checks;
    return dt_launch(c->P, fn, c, &o);
}

/* The call on the rank's buffers: host ones as they are, or device copies
 * (uploaded before, downloaded after, through the rank's backend). */
static dt_status tp_all_to_all(dt_context *ctx, int host, const void *send, void *recv, size_t n,
                               dt_dtype dt) {
    dt_backend *be = ctx->backend;
    const size_t bytes = (size_t)dt_context_world_size(ctx) * n * dt_dtype_size(dt);
    if (host) return dt_comm_all_to_all(dt_context_comm(ctx), send, recv, n, dt);
    void *ds = NULL, *dr = NULL;
    dt_status st = be->ops->alloc(be, bytes, &ds);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, bytes, &dr);
    if (st == DT_SUCCESS) st = be->ops->upload(be, ds, send, bytes);
    if (st == DT_SUCCESS) st = dt_comm_all_to_all(dt_context_comm(ctx), ds, dr, n, dt);
    if (st == DT_SUCCESS) st = be->ops->download(be, recv, dr, bytes);
    be->ops->free(be, ds);
    be->ops->free(be, dr);
    return st;
}

static dt_status rank_tp_all_to_all(dt_context *ctx, void *arg) {
    tp_case *c = arg;
    const int r = dt_context_rank(ctx), P = c->P, next = (r + 1) % P, prev = (r + P - 1) % P;
    const size_t es = dt_dtype_size(c->dtype), all = (size_t)P * TP_N;
    const uint64_t P1 = (uint64_t)P - 1;
    dt_comm *comm = dt_context_comm(ctx);
    char *send = malloc(all * es), *recv = malloc(all * es + 1), want[8];
    float x[TP_N] = {0}, y[TP_N];
    dt_status st = send && recv ? DT_SUCCESS : dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
    for (size_t i = 0; st == DT_SUCCESS && i < all; i++) tp_put(send, c->dtype, i, 41, r, i);
    if (st == DT_SUCCESS) memset(recv, 0xa5, all * es + 1);
    if (st == DT_SUCCESS) st = tp_all_to_all(ctx, c->host, send, recv, TP_N, c->dtype);
    for (int q = 0; st == DT_SUCCESS && q < P; q++)
        for (size_t i = 0; i < TP_N; i++) {
            tp_put(want, c->dtype, 0, 41, q, (size_t)r * TP_N + i);
            if (memcmp(recv + ((size_t)q * TP_N + i) * es, want, es) != 0)
                tp_note(c, r, "block %d [%zu] is not rank %d's block %d", q, i, q, r);
        }
    if (st == DT_SUCCESS && (unsigned char)recv[all * es] != 0xa5) tp_note(c, r, "wrote past recv");
    /* Counters: the calls and bytes comm.h defines, as on every transport. */
    dt_p2p_op ops[2] = {{DT_P2P_SEND, next, x, 5, DT_F32}, {DT_P2P_RECV, prev, y, 5, DT_F32}};
    if (st == DT_SUCCESS) st = dt_comm_all_reduce(comm, x, y, TP_N, DT_F32, DT_REDUCE_SUM);
    if (st == DT_SUCCESS) st = dt_comm_barrier(comm);
    if (st == DT_SUCCESS) st = dt_comm_sendrecv(comm, ops, 2);
    dt_comm_counters k;
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k);
    if (st == DT_SUCCESS) {
        const uint64_t a2a = P1 * TP_N * es, ar = 2 * P1 * ((TP_N + (uint64_t)P - 1) / (uint64_t)P) * 4;
        const uint64_t p2p = P > 1 ? 20 : 0;
        for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++) {
            const uint64_t calls = kind == DT_COMM_ALL_TO_ALL || kind == DT_COMM_ALL_REDUCE ||
                                   kind == DT_COMM_BARRIER || kind == DT_COMM_P2P;
            const uint64_t b = kind == DT_COMM_ALL_TO_ALL ? a2a : kind == DT_COMM_ALL_REDUCE ? ar
                               : kind == DT_COMM_P2P ? p2p : 0;
            if (k.calls[kind] != calls || k.bytes_sent[kind] != b || k.bytes_recv[kind] != b)
                tp_note(c, r, "%s: %llu calls, %llu sent, %llu received; want %llu, %llu",
                        dt_comm_kind_name((dt_comm_kind)kind), (unsigned long long)k.calls[kind],
                        (unsigned long long)k.bytes_sent[kind],
                        (unsigned long long)k.bytes_recv[kind], (unsigned long long)calls,
                        (unsigned long long)b);
        }
    }
    tp_record(c, r, st);
    free(send);
    free(recv);
    return st;
}

static int tp_available(int P) {
    char why[512];
    if (h_pair_available(P, DT_BACKEND_CUDA, DT_TRANSPORT_NCCL, why, sizeof why)) return 1;
    print_message("skipped: %s\n", why);
    return 0;
}

static void tp_assert_ok(const tp_case *c) {
    for (int r = 0; r < c->P; r++) {
        if (c->st[r] != DT_SUCCESS || c->bad[r])
            print_error("%s: rank %d: %s: %s\n", c->name, r, dt_status_name(c->st[r]), c->msg[r]);
        assert_int_equal(c->st[r], DT_SUCCESS);
        assert_int_equal(c->bad[r], 0);
    }
}

static void test_tp_all_to_all(void **state) {
    tp_case *c = *state;
    if (!tp_available(c->P)) skip();
    memset(c->st, 0, sizeof c->st);
    memset(c->bad, 0, sizeof c->bad);
    assert_int_equal(tp_launch(c, rank_tp_all_to_all, 30000, DT_CHECK_OFF), DT_SUCCESS);
    tp_assert_ok(c);
}

/* After a barrier the last rank sleeps TP_LATE_MS before an all_to_all
 * on host buffers (the others' calls wait on the host: wait_ms), then,
 * after another barrier, before one on device buffers (the others' calls
 * are queued and return: no wait_ms; the download waits). */
static dt_status rank_tp_late(dt_context *ctx, void *arg) {
    tp_case *c = arg;
    const int r = dt_context_rank(ctx), late = c->P - 1;
    dt_comm *comm = dt_context_comm(ctx);
    float x[2 * MAXP] = {0}, y[2 * MAXP];
    dt_comm_counters k0, k1, k2, k3;
    dt_status st = dt_comm_barrier(comm);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k0);
    if (st == DT_SUCCESS && r == late) tp_sleep_ms(TP_LATE_MS);
    if (st == DT_SUCCESS) st = tp_all_to_all(ctx, 1, x, y, 2, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k1);
    if (st == DT_SUCCESS) st = dt_comm_barrier(comm);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k2);
    if (st == DT_SUCCESS && r == late) tp_sleep_ms(TP_LATE_MS);
    if (st == DT_SUCCESS) st = tp_all_to_all(ctx, 0, x, y, 2, DT_F32);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(comm, &k3);
    if (st == DT_SUCCESS) {
        c->host_wait[r] = k1.wait_ms - k0.wait_ms;
        c->dev_wait[r] = k3.wait_ms - k2.wait_ms;
    }
    tp_record(c, r, st);
    return st;
}

static void test_tp_wait_time(void **state) {
    (void)state;
    for (int P = 2; P <= MAXP; P += 2) {
        if (!tp_available(P)) skip();
        tp_case c;
        memset(&c, 0, sizeof c);
        c.P = P;
        snprintf(c.name, sizeof c.name, "wait_time/P=%d", P);
        assert_int_equal(tp_launch(&c, rank_tp_late, 30000, DT_CHECK_OFF), DT_SUCCESS);
        tp_assert_ok(&c);
        for (int r = 0; r < P - 1; r++) {
            if (c.host_wait[r] < TP_LATE_MS - 10 || c.dev_wait[r] >= TP_LATE_MS - 10)
                print_error("P=%d: rank %d waited %.1f ms (host buffers), %.1f ms (device)\n", P, r,
                            c.host_wait[r], c.dev_wait[r]);
            assert_true(c.host_wait[r] >= TP_LATE_MS - 10);
            assert_true(c.dev_wait[r] >= 0 && c.dev_wait[r] < TP_LATE_MS - 10);
        }
    }
}

/* The last rank fails before the call: the others, waiting in an
 * all_to_all on host buffers, stop with DT_ERR_PEER_FAILED long before the
 * timeout. Under DT_CHECK, rank 1 moving one element more per block fails
 * every rank with DT_ERR_MISMATCH naming both calls. */
static dt_status rank_tp_fail(dt_context *ctx, void *arg) {
    tp_case *c = arg;
    const int r = dt_context_rank(ctx), P = c->P;
    float x[8 * MAXP] = {0}, y[8 * MAXP];
    const double t0 = tp_now_ms();
    dt_status st;
    if (!c->mismatch) {
        if (r == P - 1) return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d gives up on purpose", r);
        st = dt_comm_all_to_all(dt_context_comm(ctx), x, y, 4, DT_F32);
    } else {
        st = dt_comm_all_to_all(dt_context_comm(ctx), x, y, r == 1 ? 5 : 4, DT_F32);
    }
    c->ms[r] = tp_now_ms() - t0;
    tp_record(c, r, st);
    return st;
}

static void test_tp_failures(void **state) {
    (void)state;
    for (int P = 2; P <= MAXP; P++) {
        if (!tp_available(P)) skip();
        for (int mismatch = 0; mismatch < 2; mismatch++) {
            tp_case c;
            memset(&c, 0, sizeof c);
            c.P = P;
            c.mismatch = mismatch;
            for (int r = 0; r < P; r++) c.st[r] = DT_SUCCESS;
            const double t0 = tp_now_ms();
            dt_status st = tp_launch(&c, rank_tp_fail, 10000, mismatch ? DT_CHECK_ON : DT_CHECK_OFF);
            const double total = tp_now_ms() - t0;
            assert_int_equal(st, mismatch ? DT_ERR_MISMATCH : DT_ERR_NOT_SUPPORTED);
            assert_true(total < 5000);
            for (int r = 0; r < (mismatch ? P : P - 1); r++) {
                const dt_status want = mismatch ? DT_ERR_MISMATCH : DT_ERR_PEER_FAILED;
                if (c.st[r] != want) print_error("P=%d: rank %d: %s: %s\n", P, r,
                                                 dt_status_name(c.st[r]), c.msg[r]);
                assert_int_equal(c.st[r], want);
                assert_true(c.ms[r] < 5000);
                if (mismatch) {
                    assert_non_null(strstr(c.msg[r], "all_to_all of 5 fp32"));
                    assert_non_null(strstr(c.msg[r], "all_to_all of 4 fp32"));
                } else {
                    assert_non_null(strstr(c.msg[r], "gives up on purpose"));
                }
            }
        }
    }
}

int main(void) {
    static coll_case colls[12];
    struct CMUnitTest tests[64];
    size_t n = 0;
    tests[n++] = (struct CMUnitTest){"init/rendezvous,in-progress,refusals", test_init, NULL, NULL, NULL};
    static const ncclDataType_t types[3] = {ncclFloat32, ncclBfloat16, ncclFloat16};
    static const char *const tnames[3] = {"f32", "bf16", "f16"};
    size_t k = 0;
    for (int P = 1; P <= 4; P++)
        for (int t = 0; t < 3; t++) {
            if (P != 3 && t == 2) continue;
            coll_case *c = &colls[k++];
            c->P = P;
            c->dt = types[t];
            snprintf(c->name, sizeof c->name,
                     "collectives/P=%d,%s: exact vs rank-order reduction rounded per step", P,
                     tnames[t]);
            tests[n++] = (struct CMUnitTest){c->name, test_collectives, NULL, NULL, c};
        }
    tests[n++] = (struct CMUnitTest){"not-ready/missing-peer,abort-drains", test_missing_peer, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"not-ready/cycle-of-two-communicators", test_cycle, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"errors/count-mismatch-fails-every-rank", test_mismatch, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"split/colors,keys,nocolor;finalize", test_split_finalize, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"threads/P=4,all_reduce+ring,40-rounds", test_threads, NULL, NULL, NULL};
    static tp_case tps[MAXP * 7];
    static const dt_dtype tp_types[5] = {DT_F32, DT_BF16, DT_F16, DT_U8, DT_I32};
    size_t m = 0;
    for (int P = 1; P <= MAXP; P++)
        for (int host = 0; host < 2; host++)
            for (int t = 0; t < 5; t++) {
                if (host && tp_types[t] != DT_F32 && tp_types[t] != DT_BF16) continue;
                tp_case *c = &tps[m++];
                c->P = P;
                c->dtype = tp_types[t];
                c->host = host;
                snprintf(c->name, sizeof c->name, "nccl_transport/all_to_all/P=%d,%s,%s,counters", P,
                         dt_dtype_name(c->dtype), host ? "host" : "device");
                tests[n++] = (struct CMUnitTest){c->name, test_tp_all_to_all, NULL, NULL, c};
            }
    tests[n++] = (struct CMUnitTest){"nccl_transport/wait_time/P=2,4,late-rank,host-vs-device", test_tp_wait_time, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"nccl_transport/failures/P=2..4,peer-failed,mismatch-under-DT_CHECK", test_tp_failures, NULL, NULL, NULL};
    for (size_t i = 0; i < n; i++) {
        tests[i].setup_func = setup;
        tests[i].teardown_func = teardown;
    }
    return h_run_cases("NCCL on the CPU (tests/emu/nccl.c)", tests, n);
}

#endif /* DT_EMU_NCCL_SKIP */
