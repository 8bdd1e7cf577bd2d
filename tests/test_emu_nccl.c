/* tests/test_emu_nccl.c — the CPU emulation of NCCL (tests/emu/nccl.c) that
 * lets the NCCL transport run without a GPU (make CUDA=emu).
 *
 * Most cases drive every rank from the main thread (the communicators are
 * non-blocking, so one thread can post every rank's part), which makes the
 * order of posts and waits exact: init is in progress until the last rank
 * joins; collectives (all_reduce sum/max/avg, reduce, all_gather,
 * reduce_scatter, broadcast) and send/receive groups for P = 1..4 give, on
 * every rank, exactly the rank-order reduction computed here (bf16 and
 * fp16 rounded at every step, as nccl.c documents), written only when a
 * wait runs the work; a rank whose peer has not posted stays not ready
 * until the peer posts, or until it aborts (then its stream drains); split
 * (colors, keys, NCCL_SPLIT_NOCOLOR); finalize; a mismatch fails every
 * rank's stream. One case runs 4 rank threads at once. Values come from
 * (seed, rank, index). Skipped unless built with CUDA=emu. */
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

int main(void) {
    static coll_case colls[12];
    struct CMUnitTest tests[24];
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
    for (size_t i = 0; i < n; i++) {
        tests[i].setup_func = setup;
        tests[i].teardown_func = teardown;
    }
    return h_run_cases("NCCL on the CPU (tests/emu/nccl.c)", tests, n);
}

#endif /* DT_EMU_NCCL_SKIP */
