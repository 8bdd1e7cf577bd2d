/* tests/test_cuda.c — the CUDA backend against the CPU backend, and the GPU
 * transports (cuda+local: ranks sharing GPUs; cuda+nccl: one GPU per rank).
 *
 * - backend ops: every entry of dt_backend_ops on the CUDA backend, on the
 *   same inputs as the CPU backend (gemm: against double), with the
 *   tolerances stated at each case: copy_runs COPY/ADD bit-exact, add and
 *   add_beside (fp32 in, rounded to the dtype) bit-exact, gemm fp32 (TF32
 *   off) atol=rtol=1e-4, TF32 1e-2, bf16 1e-2 + 8e-3|ref|, fp16 2e-3 +
 *   2e-3|ref|, gelu fp32 1e-6 + 1e-5|ref| (bf16/fp16:
 *   one output ulp); rmsnorm fp32 1e-6 + 1e-6|ref| (CUDA sums squares in
 *   fp32, the CPU in double), rotary fp32 2e-7 + 2e-7|ref| (the same double
 *   cos/sin rounded to fp32, no FMA), bf16 and fp16 one output ulp;
 * - collectives, send/recv groups, split, host-buffer staging and agreement
 *   checks on cuda+local (P = 1..4) and on NCCL (P = 1, and P = every GPU);
 * - NCCL with a rank that never calls: every rank returns within the timeout;
 * - the ring rotator over device buffers on both;
 * - backend/transport selection (runs everywhere: it checks what a machine
 *   without a GPU must choose and refuse);
 * - the rank's device and stream for a caller's own kernels
 *   (dt_context_cuda_stream): the caller's copies there ordered with the
 *   library's work; none on the CPU backend.
 *
 * Without a GPU (or a CUDA build) every GPU case prints the reason and
 * skips. Rank threads only record; the main thread asserts.
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

#ifdef DT_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "dtensor/backend_cuda.h"
#endif
#ifdef DT_CUDA_EMULATE
#include "emu/emu.h"
#endif

#include "harness.h"
#include "collectives/comm.h"
#include "collectives/ring.h"
#include "dtensor/backend.h"
#include "dtensor/context_internal.h"
#include "dtensor/ops.h"
#include "dtensor/tensor.h"

#define MAXP 8

/* --------------------------------------------------------------- helpers */

/* 1 if `world` ranks can run on (b, t); otherwise prints why and skips. */
#define REQUIRE_PAIR(world, b, t)                                             \
    do {                                                                      \
        char why_[768];                                                       \
        if (!h_pair_available((world), (b), (t), why_, sizeof why_)) {        \
            print_message("skipped: %s\n", why_);                             \
            skip();                                                           \
            return;                                                           \
        }                                                                     \
    } while (0)

/* Host values of any dtype (dtype.h; its fp16 conversions are checked
 * against an independent reference in test_context.c). */
static void put_val(void *buf, dt_dtype dt, size_t i, float v) { dt_value_set(buf, dt, i, v); }
static float get_val(const void *buf, dt_dtype dt, size_t i) { return dt_value_get(buf, dt, i); }

/* Per-rank results, asserted on the main thread. */
typedef struct results {
    dt_status st[MAXP];
    long bad[MAXP];
    char msg[MAXP][512];
} results;

static void note_bad(results *r, int rank, const char *fmt, ...) {
    if (r->bad[rank]++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg[rank], sizeof r->msg[rank], fmt, ap);
        va_end(ap);
    }
}

static void record_status(results *r, int rank, dt_status st) {
    r->st[rank] = st;
    if (st != DT_SUCCESS) snprintf(r->msg[rank], sizeof r->msg[rank], "%s", dt_last_error());
}

static void assert_results(const results *r, int p, dt_status launched) {
    if (launched != DT_SUCCESS) print_error("launch: %s: %s\n", dt_status_name(launched), dt_last_error());
    for (int j = 0; j < p; j++) {
        if (r->st[j] != DT_SUCCESS)
            print_error("rank %d: %s: %s\n", j, dt_status_name(r->st[j]), r->msg[j]);
        else if (r->bad[j])
            print_error("rank %d: %ld check(s) failed; first: %s\n", j, r->bad[j], r->msg[j]);
    }
    assert_int_equal(launched, DT_SUCCESS);
    for (int j = 0; j < p; j++) {
        assert_int_equal(r->st[j], DT_SUCCESS);
        assert_int_equal(r->bad[j], 0);
    }
}

/* Device buffer from host data (alloc + upload). */
static dt_status to_dev(dt_backend *be, const void *host, size_t bytes, void **out) {
    DT_TRY(be->ops->alloc(be, bytes, out));
    dt_status st = be->ops->upload(be, *out, host, bytes);
    if (st != DT_SUCCESS) {
        be->ops->free(be, *out);
        *out = NULL;
    }
    return st;
}

/* ============================================================ backend ops */

/* Memory entries: zeroed alloc, unique zero-byte allocations (alloc and
 * alloc_uninit), upload, download (also into alloc_uninit's memory), copy
 * (also overlapping, memmove semantics), zero, sync. */
static dt_status rank_memory(dt_context *ctx, void *arg) {
    results *r = arg;
    dt_backend *be = ctx->backend;
    enum { N = 4099 };
    unsigned char host[N], back[N], ref[N];
    void *a = NULL, *b = NULL, *z0 = NULL, *z1 = NULL, *u = NULL, *u0 = NULL;
    dt_status st;
    if (strcmp(be->ops->name, "cuda") != 0) note_bad(r, 0, "backend is %s, not cuda", be->ops->name);
    DT_TRY_GOTO(st, be->ops->alloc(be, N, &a), out);
    DT_TRY_GOTO(st, be->ops->alloc(be, N, &b), out);
    DT_TRY_GOTO(st, be->ops->alloc(be, 0, &z0), out);
    DT_TRY_GOTO(st, be->ops->alloc(be, 0, &z1), out);
    if (!z0 || !z1 || z0 == z1) note_bad(r, 0, "alloc(0) gave %p and %p", z0, z1);
    DT_TRY_GOTO(st, be->ops->alloc_uninit(be, N, &u), out);
    DT_TRY_GOTO(st, be->ops->alloc_uninit(be, 0, &u0), out);
    if (!u || !u0 || u0 == z0 || u0 == z1 || u == a || u == b)
        note_bad(r, 0, "alloc_uninit gave %p and %p (alloc: %p, %p, %p, %p)", u, u0, a, b, z0, z1);
    DT_TRY_GOTO(st, be->ops->download(be, back, a, N), out);
    for (int i = 0; i < N; i++)
        if (back[i]) { note_bad(r, 0, "alloc: byte %d is %d, not 0", i, back[i]); break; }
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + 3);
    DT_TRY_GOTO(st, be->ops->upload(be, a, host, N), out);
    DT_TRY_GOTO(st, be->ops->copy(be, b, a, N), out);
    DT_TRY_GOTO(st, be->ops->download(be, back, b, N), out);
    if (memcmp(back, host, N)) note_bad(r, 0, "upload/copy/download round trip differs");
    DT_TRY_GOTO(st, be->ops->upload(be, u, host, N), out);
    memset(back, 0, N);
    DT_TRY_GOTO(st, be->ops->download(be, back, u, N), out);
    if (memcmp(back, host, N)) note_bad(r, 0, "alloc_uninit: upload/download round trip differs");
    /* overlapping copy, forwards and backwards */
    DT_TRY_GOTO(st, be->ops->copy(be, (char *)b + 5, b, 1000), out);
    memcpy(ref, host, N);
    memmove(ref + 5, ref, 1000);
    DT_TRY_GOTO(st, be->ops->copy(be, b, (char *)b + 17, 2000), out);
    memmove(ref, ref + 17, 2000);
    DT_TRY_GOTO(st, be->ops->download(be, back, b, N), out);
    if (memcmp(back, ref, N)) note_bad(r, 0, "overlapping copy differs from memmove");
    DT_TRY_GOTO(st, be->ops->zero(be, (char *)a + 100, 1000), out);
    DT_TRY_GOTO(st, be->ops->download(be, back, a, N), out);
    memcpy(ref, host, N);
    memset(ref + 100, 0, 1000);
    if (memcmp(back, ref, N)) note_bad(r, 0, "zero touched the wrong bytes");
    DT_TRY_GOTO(st, be->ops->sync(be), out);
out:
    be->ops->free(be, a);
    be->ops->free(be, b);
    be->ops->free(be, z0);
    be->ops->free(be, z1);
    be->ops->free(be, u);
    be->ops->free(be, u0);
    record_status(r, 0, st);
    return st;
}

static void test_memory(void **state) {
    (void)state;
    REQUIRE_PAIR(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    results r = {0};
    dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_memory, &r);
    assert_results(&r, 1, st);
}

/* A caller's own work on the rank's stream (dt_context_cuda_stream, the
 * public API only) is ordered with the library's, before and after: the
 * library fills x (random) and makes y and u (zeroed); the caller copies x
 * into y on the stream; the library adds z = x + y; the caller copies z
 * into u; u read back is 2x, bit for bit (exact in fp32). A copy the
 * library's work did not wait for, or that ran before it, leaves zeros or
 * x in u (the emulator runs stream work as late as CUDA allows). Each rank
 * reports its device, one of the machine's, and the ranks' streams differ.
 * P ranks share the GPUs (cuda+local). */
enum { OWN_N = 1 << 16 };
typedef struct own_case {
    results r;
    int device[MAXP];
    void *stream[MAXP];
} own_case;

static dt_status rank_own_work(dt_context *ctx, void *arg) {
    own_case *c = arg;
    const int rank = dt_context_rank(ctx);
    const int64_t shape[1] = {OWN_N};
    const size_t bytes = OWN_N * sizeof(float);
    dt_tensor *x = NULL, *y = NULL, *z = NULL, *u = NULL;
    float *hu = malloc(bytes);
    dt_status st = DT_SUCCESS;
    if (!hu) DT_TRY_GOTO(st, dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory"), out);
    c->device[rank] = dt_context_cuda_device(ctx);
    c->stream[rank] = dt_context_cuda_stream(ctx);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 1, shape, NULL, &x), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 1, shape, NULL, &y), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 1, shape, NULL, &u), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, 77 + (uint64_t)rank), out);
#ifdef DT_HAVE_CUDA
    cudaStream_t s = (cudaStream_t)c->stream[rank];
    if (cudaMemcpyAsync(dt_tensor_data(y), dt_tensor_data(x), bytes, cudaMemcpyDeviceToDevice, s) !=
        cudaSuccess)
        DT_TRY_GOTO(st, dt_error(DT_ERR_BACKEND, "test: cudaMemcpyAsync y = x failed"), out);
    DT_TRY_GOTO(st, dt_add(x, y, &z), out);
    if (cudaMemcpyAsync(dt_tensor_data(u), dt_tensor_data(z), bytes, cudaMemcpyDeviceToDevice, s) !=
        cudaSuccess)
        DT_TRY_GOTO(st, dt_error(DT_ERR_BACKEND, "test: cudaMemcpyAsync u = z failed"), out);
#endif
    DT_TRY_GOTO(st, dt_tensor_get_local(u, hu, bytes), out);
    for (size_t i = 0; i < OWN_N; i++) {
        const float want = 2.0f * dt_random_value(77 + (uint64_t)rank, i);
        if (hu[i] != want) {
            note_bad(&c->r, rank, "u[%zu] = %g, not 2x = %g: the caller's copies and the library's "
                     "work ran out of order", i, (double)hu[i], (double)want);
            break;
        }
    }
out:
    dt_tensor_destroy(u);
    dt_tensor_destroy(z);
    dt_tensor_destroy(y);
    dt_tensor_destroy(x);
    free(hu);
    record_status(&c->r, rank, st);
    return st;
}

static void test_own_work(void **state) {
    const int p = (int)(intptr_t)*state;
    REQUIRE_PAIR(p, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    own_case c;
    memset(&c, 0, sizeof c);
    dt_status st = h_launch_on(p, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_own_work, &c);
    assert_results(&c.r, p, st);
    int gpus = 0;
#ifdef DT_HAVE_CUDA
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
#endif
    for (int j = 0; j < p; j++) {
        if (c.device[j] < 0 || c.device[j] >= gpus || !c.stream[j])
            print_error("rank %d: device %d of %d, stream %p\n", j, c.device[j], gpus, c.stream[j]);
        assert_true(c.device[j] >= 0 && c.device[j] < gpus);
        assert_non_null(c.stream[j]);
        for (int k = 0; k < j; k++) assert_ptr_not_equal(c.stream[j], c.stream[k]);
    }
}

/* On the CPU backend there is no device and no stream. */
static dt_status rank_no_stream(dt_context *ctx, void *arg) {
    results *r = arg;
    const int rank = dt_context_rank(ctx);
    if (dt_context_cuda_device(ctx) != -1 || dt_context_cuda_stream(ctx) != NULL)
        note_bad(r, rank, "cpu backend: device %d, stream %p", dt_context_cuda_device(ctx),
                 dt_context_cuda_stream(ctx));
    return DT_SUCCESS;
}

static void test_no_stream_on_cpu(void **state) {
    (void)state;
    results r = {0};
    dt_status st = h_launch_on(2, DT_BACKEND_CPU, DT_TRANSPORT_LOCAL, rank_no_stream, &r);
    assert_results(&r, 2, st);
    assert_int_equal(dt_context_cuda_device(NULL), -1);
    assert_null(dt_context_cuda_stream(NULL));
}

/* The caching allocator (backend_cuda_alloc.cu): a freed block comes back
 * for a request of its rounded size, zeroed like a new one, and not for one
 * of another size; a request the device can only meet once the cache is emptied
 * succeeds (the cache is flushed and cudaMalloc tried again). */
static dt_status rank_cache(dt_context *ctx, void *arg) {
    results *r = arg;
    dt_backend *be = ctx->backend;
    const size_t n = (size_t)3 << 20;
    unsigned char *host = malloc(n);
    void *a = NULL, *b = NULL, *big = NULL;
    dt_status st = DT_SUCCESS;
    if (!host) return dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
    memset(host, 0x5a, n);
    DT_TRY_GOTO(st, be->ops->alloc(be, n, &a), out);
    DT_TRY_GOTO(st, be->ops->upload(be, a, host, n), out);
    void *freed = a;
    be->ops->free(be, a);
    a = NULL;
    DT_TRY_GOTO(st, be->ops->alloc(be, n - 1000, &a), out);
    if (a != freed) note_bad(r, 0, "a freed block of %zu bytes was not reused for %zu", n, n - 1000);
    DT_TRY_GOTO(st, be->ops->download(be, host, a, n - 1000), out);
    for (size_t i = 0; i < n - 1000; i++)
        if (host[i]) { note_bad(r, 0, "reused block: byte %zu is %d, not 0", i, host[i]); break; }
    be->ops->free(be, a);
    a = NULL;
    DT_TRY_GOTO(st, be->ops->alloc(be, n / 4, &b), out);
    if (b == freed) note_bad(r, 0, "a cached block of %zu bytes served a request of %zu", n, n / 4);
#ifdef DT_HAVE_CUDA
    /* Out of memory with the cache full: 60% of the free memory cached,
     * then 70% asked for. */
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        DT_TRY_GOTO(st, dt_error(DT_ERR_BACKEND, "test: cudaMemGetInfo failed"), out);
    DT_TRY_GOTO(st, be->ops->alloc(be, free_b / 10 * 6, &big), out);
    be->ops->free(be, big);
    big = NULL;
    if (be->ops->alloc(be, free_b / 10 * 7, &big) != DT_SUCCESS)
        note_bad(r, 0, "70%% of %zu free bytes with 60%% cached: %s", free_b, dt_last_error());
#endif
out:
    be->ops->free(be, a);
    be->ops->free(be, b);
    be->ops->free(be, big);
    free(host);
    record_status(r, 0, st);
    return st;
}

static void test_cache(void **state) {
    (void)state;
    REQUIRE_PAIR(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    /* On the emulator a 256 MiB device (its memory is host memory); a GPU
     * ignores the variable and the case uses 70% of what it has free. */
    setenv("DT_EMU_DEVICE_MIB", "256", 1);
    results r = {0};
    dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_cache, &r);
    unsetenv("DT_EMU_DEVICE_MIB");
    assert_results(&r, 1, st);
}

/* Ranks sharing a device reclaim each other's cached blocks (the launch's
 * dt_cuda_pool, backend_cuda.cu). World = GPUs + 1, so that ranks 0 and
 * `last` (= GPUs) share device 0: both read its free memory, rank 0
 * allocates 60% of it and frees it (its cache keeps the block), then rank
 * `last` asks for 70%, which it gets only by reclaiming rank 0's block.
 * Then rank 0 asks for 60% again: out of memory, as rank last's block is
 * live, not cached (a reclaim takes cached blocks only). */
typedef struct pool_case {
    results r;
    int gpus;
} pool_case;

static dt_status rank_pool(dt_context *ctx, void *arg) {
    pool_case *c = arg;
    const int rank = dt_context_rank(ctx), last = c->gpus;
    dt_backend *be = ctx->backend;
    dt_comm *comm = dt_context_comm(ctx);
    void *big = NULL;
    size_t free_b = 0;
    dt_status st = DT_SUCCESS;
#ifdef DT_HAVE_CUDA
    size_t total_b = 0;
    if ((rank == 0 || rank == last) && cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        st = dt_error(DT_ERR_BACKEND, "test: cudaMemGetInfo failed");
#endif
    if (st == DT_SUCCESS) st = dt_comm_barrier(comm);   /* both read it before rank 0 allocates */
    if (st == DT_SUCCESS && rank == 0) {
        st = be->ops->alloc(be, free_b / 10 * 6, &big);
        be->ops->free(be, big);
        big = NULL;
    }
    if (st == DT_SUCCESS) st = dt_comm_barrier(comm);
    if (st == DT_SUCCESS && rank == last && be->ops->alloc(be, free_b / 10 * 7, &big) != DT_SUCCESS)
        note_bad(&c->r, rank, "70%% of %zu free bytes with 60%% cached by rank 0 on the same "
                 "device: %s", free_b, dt_last_error());
    if (st == DT_SUCCESS) st = dt_comm_barrier(comm);
    if (st == DT_SUCCESS && rank == 0) {
        void *again = NULL;
        const dt_status got = be->ops->alloc(be, free_b / 10 * 6, &again);
        if (got != DT_ERR_OUT_OF_MEMORY)
            note_bad(&c->r, rank, "60%% of %zu free bytes with 70%% live on rank %d: %s, not "
                     "DT_ERR_OUT_OF_MEMORY", free_b, last, dt_status_name(got));
        be->ops->free(be, again);
    }
    if (st == DT_SUCCESS) st = dt_comm_barrier(comm);
    be->ops->free(be, big);
    record_status(&c->r, rank, st);
    return st;
}

static void test_cache_pool(void **state) {
    (void)state;
    pool_case c;
    memset(&c, 0, sizeof c);
#ifdef DT_HAVE_CUDA
    if (cudaGetDeviceCount(&c.gpus) != cudaSuccess) c.gpus = 0;
#endif
    if (c.gpus + 1 > MAXP) {
        print_message("skipped: %d GPUs: the case runs GPUs + 1 ranks, at most %d\n", c.gpus, MAXP);
        skip();
        return;
    }
    REQUIRE_PAIR(c.gpus + 1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    /* On the emulator 256 MiB devices, as test_cache */
    setenv("DT_EMU_DEVICE_MIB", "256", 1);
    dt_status st = h_launch_on(c.gpus + 1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_pool, &c);
    unsetenv("DT_EMU_DEVICE_MIB");
    assert_results(&c.r, c.gpus + 1, st);
}

/* --------------------------------------------------------------- copy_runs */

typedef enum { TAB_NONE, TAB_SRC, TAB_DST, TAB_BOTH } tab_kind;

typedef struct runs_case {
    dt_runs_op op;
    dt_dtype dtype;
    int64_t outer, n, run, dpad, spad;
    tab_kind tabs;
    results r;
} runs_case;

/* Shuffled run starts (a permutation of i*run). */
static void shuffled_offsets(int64_t n, int64_t run, uint64_t seed, int64_t *off) {
    for (int64_t i = 0; i < n; i++) off[i] = i * run;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(dt_random_value(seed, (uint64_t)i) * 0.5f * (float)(i + 1) +
                              0.5f * (float)(i + 1));
        if (j > i) j = i;
        if (j < 0) j = 0;
        int64_t t = off[i];
        off[i] = off[j];
        off[j] = t;
    }
}

static dt_status rank_runs(dt_context *ctx, void *arg) {
    runs_case *c = arg;
    dt_backend *gpu = ctx->backend, *cpu = NULL;
    size_t es = dt_dtype_size(c->dtype);
    int64_t dst_outer = c->n * c->run + c->dpad, src_outer = c->n * c->run + c->spad;
    size_t dn = (size_t)(c->outer * dst_outer), sn = (size_t)(c->outer * src_outer);
    int64_t *doff = malloc((size_t)c->n * sizeof *doff), *soff = malloc((size_t)c->n * sizeof *soff);
    unsigned char *src = malloc(sn * es), *dst = malloc(dn * es), *want = malloc(dn * es),
                  *got = malloc(dn * es);
    void *dsrc = NULL, *ddst = NULL;
    dt_status st = DT_SUCCESS;
    if (!doff || !soff || !src || !dst || !want || !got) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
        goto out;
    }
    shuffled_offsets(c->n, c->run, 11, doff);
    shuffled_offsets(c->n, c->run, 12, soff);
    /* Destination starts non-zero everywhere: gaps must survive untouched. */
    for (size_t i = 0; i < sn; i++)
        if (c->dtype == DT_U8) src[i] = (unsigned char)(i * 13 + 1);
        else put_val(src, c->dtype, i, dt_random_value(1, i));
    for (size_t i = 0; i < dn; i++)
        if (c->dtype == DT_U8) dst[i] = (unsigned char)(i * 5 + 2);
        else put_val(dst, c->dtype, i, dt_random_value(2, i));
    dt_runs runs = {c->dtype, c->op, NULL, NULL, c->outer, c->n, c->run, dst_outer, src_outer,
                    c->tabs == TAB_DST || c->tabs == TAB_BOTH ? doff : NULL,
                    c->tabs == TAB_SRC || c->tabs == TAB_BOTH ? soff : NULL};
    /* Reference: the CPU backend. */
    memcpy(want, dst, dn * es);
    DT_TRY_GOTO(st, dt_backend_cpu_create(0, &cpu), out);
    dt_runs hr = runs;
    hr.dst = want;
    hr.src = src;
    DT_TRY_GOTO(st, cpu->ops->copy_runs(cpu, &hr), out);
    DT_TRY_GOTO(st, to_dev(gpu, src, sn * es, &dsrc), out);
    DT_TRY_GOTO(st, to_dev(gpu, dst, dn * es, &ddst), out);
    runs.dst = ddst;
    runs.src = dsrc;
    DT_TRY_GOTO(st, gpu->ops->copy_runs(gpu, &runs), out);
    /* Twice more: the table scratch and staging are reused. */
    DT_TRY_GOTO(st, gpu->ops->upload(gpu, ddst, dst, dn * es), out);
    DT_TRY_GOTO(st, gpu->ops->copy_runs(gpu, &runs), out);
    DT_TRY_GOTO(st, gpu->ops->download(gpu, got, ddst, dn * es), out);
    for (size_t i = 0; i < dn * es; i++)
        if (got[i] != want[i]) {
            note_bad(&c->r, 0, "byte %zu of %zu: got 0x%02x, expected 0x%02x (not bit-exact)", i,
                     dn * es, got[i], want[i]);
            break;
        }
out:
    if (cpu) cpu->ops->destroy(cpu);
    gpu->ops->free(gpu, dsrc);
    gpu->ops->free(gpu, ddst);
    free(doff);
    free(soff);
    free(src);
    free(dst);
    free(want);
    free(got);
    record_status(&c->r, 0, st);
    return st;
}

static void test_runs(void **state) {
    runs_case *c = *state;
    REQUIRE_PAIR(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_runs, c);
    assert_results(&c->r, 1, st);
}

/* -------------------------------------------------------------------- gemm */

typedef struct gemm_case {
    dt_dtype dtype;
    int64_t m, n, k;
    int tf32;
    double atol, rtol;
    results r;
} gemm_case;

static dt_status rank_gemm(dt_context *ctx, void *arg) {
    gemm_case *c = arg;
    dt_backend *gpu = ctx->backend;
    size_t es = dt_dtype_size(c->dtype);
    size_t na = (size_t)(c->m * c->k), nb = (size_t)(c->k * c->n), nc = (size_t)(c->m * c->n);
    void *ha = malloc(na * es + 1), *hb = malloc(nb * es + 1), *hc = malloc(nc * es + 1);
    float *gotf = malloc(nc * sizeof(float) + 1);
    double *ref = malloc(nc * sizeof(double) + 1);
    void *da = NULL, *db = NULL, *dc = NULL;
    dt_status st = DT_SUCCESS;
    if (!ha || !hb || !hc || !gotf || !ref) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
        goto out;
    }
    for (size_t i = 0; i < na; i++) put_val(ha, c->dtype, i, dt_random_value(21, i));
    for (size_t i = 0; i < nb; i++) put_val(hb, c->dtype, i, dt_random_value(22, i));
    /* Reference in double from the inputs as stored. */
    for (int64_t i = 0; i < c->m; i++)
        for (int64_t j = 0; j < c->n; j++) {
            double s = 0;
            for (int64_t p = 0; p < c->k; p++)
                s += (double)get_val(ha, c->dtype, (size_t)(i * c->k + p)) *
                     (double)get_val(hb, c->dtype, (size_t)(p * c->n + j));
            ref[i * c->n + j] = s;
        }
    DT_TRY_GOTO(st, to_dev(gpu, ha, na * es, &da), out);
    DT_TRY_GOTO(st, to_dev(gpu, hb, nb * es, &db), out);
    DT_TRY_GOTO(st, gpu->ops->alloc(gpu, nc * es, &dc), out);
    /* C starts as garbage: gemm must overwrite it (k = 0 included). */
    memset(hc, 0x7b, nc * es);
    DT_TRY_GOTO(st, gpu->ops->upload(gpu, dc, hc, nc * es), out);
    DT_TRY_GOTO(st, gpu->ops->gemm(gpu, c->dtype, c->m, c->n, c->k, da, db, dc), out);
    DT_TRY_GOTO(st, gpu->ops->download(gpu, hc, dc, nc * es), out);
    for (size_t i = 0; i < nc; i++) gotf[i] = get_val(hc, c->dtype, i);
    double maxe = 0;
    long bad = h_compare("gemm", gotf, ref, nc, c->atol, c->rtol, &maxe);
    if (bad) note_bad(&c->r, 0, "%ld of %zu outside atol %g + rtol %g, max error %.3g", bad, nc,
                      c->atol, c->rtol, maxe);
    else if (nc) print_message("  gemm %s%s m=%lld n=%lld k=%lld: max |error| %.3g\n",
                               dt_dtype_name(c->dtype), c->tf32 ? " (TF32)" : "", (long long)c->m,
                               (long long)c->n, (long long)c->k, maxe);
out:
    gpu->ops->free(gpu, da);
    gpu->ops->free(gpu, db);
    gpu->ops->free(gpu, dc);
    free(ha);
    free(hb);
    free(hc);
    free(gotf);
    free(ref);
    record_status(&c->r, 0, st);
    return st;
}

static void test_gemm(void **state) {
    gemm_case *c = *state;
    REQUIRE_PAIR(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    /* TF32 is a launch-wide choice: DT_TF32 (read by dt_launch). */
    const char *old = getenv("DT_TF32");
    char saved[16] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("DT_TF32", c->tf32 ? "1" : "0", 1);
    dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_gemm, c);
    if (old) setenv("DT_TF32", saved, 1);
    else unsetenv("DT_TF32");
    assert_results(&c->r, 1, st);
}

/* ---------------------------------------------------------- add and gelu */

typedef struct ew_case {
    int gelu;                /* 0: add */
    dt_gelu_approx approx;
    dt_dtype dtype;
    int64_t n;
    int comm_ctas;           /* add_beside: dt_backend_cuda_set_comm_ctas (0: wide kernels) */
    results r;
} ew_case;

/* add_beside: fp32 x and y (full fp32 values, most not of the dtype), their
 * fp32 sum rounded once to the dtype, bit for bit; y NULL: x rounded. It
 * runs after the compute stream's work queued before it (the zeroing) and
 * is read once a sync has waited for it. With comm_ctas (CUDA) in a kernel
 * of at most that many CTAs and one more for the values past the last
 * four: on the emulator the CTAs that ran are counted. */
static dt_status check_add_beside(dt_backend *be, ew_case *c) {
    size_t es = dt_dtype_size(c->dtype), n = (size_t)c->n;
    float *fx = malloc(n * sizeof(float) + 1), *fy = malloc(n * sizeof(float) + 1);
    void *want = malloc(n * es + 1), *got = malloc(n * es + 1);
    void *dx = NULL, *dy = NULL, *dout = NULL;
    dt_status st = DT_SUCCESS;
    if (!fx || !fy || !want || !got) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        fx[i] = dt_random_value(33, i);
        fy[i] = 1e-3f * dt_random_value(34, i);
    }
    DT_TRY_GOTO(st, to_dev(be, fx, n * sizeof(float), &dx), out);
    DT_TRY_GOTO(st, to_dev(be, fy, n * sizeof(float), &dy), out);
    DT_TRY_GOTO(st, be->ops->alloc(be, n * es, &dout), out);
    for (int with_y = 1; with_y >= 0; with_y--) {
        DT_TRY_GOTO(st, be->ops->zero(be, dout, n * es), out);
#ifdef DT_CUDA_EMULATE
        /* no sync first: the zeroing (a memset, no CTAs) must stay queued */
        const uint64_t before = dt_emu_get_counts().blocks;
#endif
        DT_TRY_GOTO(st, be->ops->add_beside(be, c->dtype, c->n, dx, with_y ? dy : NULL, dout),
                    out);
        DT_TRY_GOTO(st, be->ops->sync(be), out);
#ifdef DT_CUDA_EMULATE
        const uint64_t ran = dt_emu_get_counts().blocks - before;
        if (c->comm_ctas > 0 && strcmp(be->ops->name, "cuda") == 0 &&
            (ran < 1 || ran > (uint64_t)c->comm_ctas + 1))
            note_bad(&c->r, 0, "add_beside with comm_ctas %d ran %llu CTAs", c->comm_ctas,
                     (unsigned long long)ran);
#endif
        DT_TRY_GOTO(st, be->ops->download(be, got, dout, n * es), out);
        for (size_t i = 0; i < n; i++) put_val(want, c->dtype, i, with_y ? fx[i] + fy[i] : fx[i]);
        for (size_t i = 0; i < n; i++)
            if (memcmp((char *)got + i * es, (char *)want + i * es, es)) {
                note_bad(&c->r, 0, "%s add_beside%s: [%zu] got %.9g, expected %.9g",
                         be->ops->name, with_y ? "" : " (y NULL)", i, get_val(got, c->dtype, i),
                         get_val(want, c->dtype, i));
                break;
            }
    }
out:
    be->ops->free(be, dx);
    be->ops->free(be, dy);
    be->ops->free(be, dout);
    free(fx);
    free(fy);
    free(want);
    free(got);
    return st;
}

static dt_status rank_elementwise(dt_context *ctx, void *arg) {
    ew_case *c = arg;
    dt_backend *gpu = ctx->backend, *cpu = NULL;
#ifdef DT_HAVE_CUDA
    dt_backend_cuda_set_comm_ctas(gpu, c->comm_ctas);
#endif
    size_t es = dt_dtype_size(c->dtype), n = (size_t)c->n;
    void *hx = malloc(n * es + 1), *hy = malloc(n * es + 1), *hwant = malloc(n * es + 1),
         *hgot = malloc(n * es + 1);
    float *gotf = malloc(n * sizeof(float) + 1);
    double *ref = malloc(n * sizeof(double) + 1);
    void *dx = NULL, *dy = NULL, *dout = NULL;
    dt_status st = DT_SUCCESS;
    if (!hx || !hy || !hwant || !hgot || !gotf || !ref) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
        goto out;
    }
    /* gelu: x in [-4, 4) reaches both tails; add: [-1, 1). */
    for (size_t i = 0; i < n; i++) {
        put_val(hx, c->dtype, i, (c->gelu ? 4.0f : 1.0f) * dt_random_value(31, i));
        put_val(hy, c->dtype, i, dt_random_value(32, i));
    }
    DT_TRY_GOTO(st, to_dev(gpu, hx, n * es, &dx), out);
    DT_TRY_GOTO(st, to_dev(gpu, hy, n * es, &dy), out);
    DT_TRY_GOTO(st, gpu->ops->alloc(gpu, n * es, &dout), out);
    if (c->gelu) DT_TRY_GOTO(st, gpu->ops->gelu(gpu, c->dtype, c->n, dx, dout, c->approx), out);
    else DT_TRY_GOTO(st, gpu->ops->add(gpu, c->dtype, c->n, dx, dy, dout), out);
    DT_TRY_GOTO(st, gpu->ops->download(gpu, hgot, dout, n * es), out);

    DT_TRY_GOTO(st, dt_backend_cpu_create(0, &cpu), out);
    if (c->gelu) DT_TRY_GOTO(st, cpu->ops->gelu(cpu, c->dtype, c->n, hx, hwant, c->approx), out);
    else DT_TRY_GOTO(st, cpu->ops->add(cpu, c->dtype, c->n, hx, hy, hwant), out);
    if (!c->gelu) {
        /* add: one fp32 add rounded once on both sides: bit-exact. */
        if (memcmp(hgot, hwant, n * es)) {
            for (size_t i = 0; i < n; i++)
                if (memcmp((char *)hgot + i * es, (char *)hwant + i * es, es)) {
                    note_bad(&c->r, 0, "add: [%zu] got %.9g, expected %.9g (not bit-exact)", i,
                             get_val(hgot, c->dtype, i), get_val(hwant, c->dtype, i));
                    break;
                }
        }
    } else {
        /* gelu: erff/tanhf differ by ulps between libm and CUDA; a narrow
         * dtype may then round to the neighbouring value: one ulp of it. */
        double atol = c->dtype == DT_F32 ? 1e-6 : 1e-5;
        double rtol = c->dtype == DT_F32 ? 1e-5 : c->dtype == DT_BF16 ? 8e-3 : 2e-3;
        for (size_t i = 0; i < n; i++) {
            gotf[i] = get_val(hgot, c->dtype, i);
            ref[i] = get_val(hwant, c->dtype, i);
        }
        double maxe = 0;
        long bad = h_compare("gelu", gotf, ref, n, atol, rtol, &maxe);
        if (bad) note_bad(&c->r, 0, "gelu: %ld of %zu outside atol %g + rtol %g, max error %.3g",
                          bad, n, atol, rtol, maxe);
    }
    if (!c->gelu) {   /* the CPU backend's too: the same contract */
        DT_TRY_GOTO(st, check_add_beside(gpu, c), out);
        DT_TRY_GOTO(st, check_add_beside(cpu, c), out);
    }
    /* In place (out == x) gives the same result. */
    if (c->gelu) DT_TRY_GOTO(st, gpu->ops->gelu(gpu, c->dtype, c->n, dx, dx, c->approx), out);
    else DT_TRY_GOTO(st, gpu->ops->add(gpu, c->dtype, c->n, dx, dy, dx), out);
    DT_TRY_GOTO(st, gpu->ops->download(gpu, hwant, dx, n * es), out);
    if (memcmp(hwant, hgot, n * es)) note_bad(&c->r, 0, "in-place result differs");
out:
    if (cpu) cpu->ops->destroy(cpu);
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dy);
    gpu->ops->free(gpu, dout);
    free(hx);
    free(hy);
    free(hwant);
    free(hgot);
    free(gotf);
    free(ref);
    record_status(&c->r, 0, st);
    return st;
}

static void test_elementwise(void **state) {
    ew_case *c = *state;
    REQUIRE_PAIR(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_elementwise, c);
    assert_results(&c->r, 1, st);
}

/* ------------------------------------------------------ rmsnorm and rotary */

typedef struct nn_case {
    int rotary;                 /* 0: rmsnorm */
    dt_dtype dtype;
    int64_t outer, rows, inner, n; /* rmsnorm x [rows, n]; rotary x [outer, rows, inner, n] */
    int weighted;               /* rmsnorm */
    dt_rotary_style style;      /* rotary */
    double base;                /* rotary */
    int64_t pos_stride;         /* rotary: 0, one position list for every outer row; else
                                   outer row o's at positions + o * pos_stride */
    results r;
} nn_case;

/* Position of local row s in the first (k = 0) and second call: large ones,
 * where angles formed in fp32 would be far off. */
static int64_t nn_pos(int k, int64_t s) {
    return k ? 1000000 + (s * 7919 % 1000) * 997 : 3 * s + 5;
}

static dt_status rank_nn(dt_context *ctx, void *arg) {
    nn_case *c = arg;
    dt_backend *gpu = ctx->backend, *cpu = NULL;
    const size_t es = dt_dtype_size(c->dtype);
    const size_t n = (size_t)(c->rotary ? c->outer * c->rows * c->inner * c->n : c->rows * c->n);
    const size_t nw = c->weighted ? (size_t)c->n : 0;
    void *hx = malloc(n * es + 1), *hw = malloc(nw * es + 1), *hgot[2] = {malloc(n * es + 1), malloc(n * es + 1)};
    void *hwant = malloc(n * es + 1);
    float *gotf = malloc(n * sizeof(float) + 1);
    double *ref = malloc(n * sizeof(double) + 1);
    const int64_t n_pos = c->pos_stride ? (c->outer - 1) * c->pos_stride + c->rows : c->rows;
    int64_t *pos[2] = {malloc((size_t)n_pos * sizeof(int64_t) + 8),
                       malloc((size_t)n_pos * sizeof(int64_t) + 8)};
    void *dx = NULL, *dw = NULL, *dout[2] = {NULL, NULL};
    dt_status st = DT_SUCCESS;
    if (!hx || !hw || !hgot[0] || !hgot[1] || !hwant || !gotf || !ref || !pos[0] || !pos[1]) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) put_val(hx, c->dtype, i, 3.0f * dt_random_value(41, i));
    for (size_t i = 0; i < nw; i++) put_val(hw, c->dtype, i, 1.0f + 0.5f * dt_random_value(42, i));
    for (int k = 0; k < 2; k++)
        for (int64_t j = 0; j < n_pos; j++) pos[k][j] = nn_pos(k, j);
    DT_TRY_GOTO(st, to_dev(gpu, hx, n * es, &dx), out);
    if (nw) DT_TRY_GOTO(st, to_dev(gpu, hw, nw * es, &dw), out);
    for (int k = 0; k < 2; k++) DT_TRY_GOTO(st, gpu->ops->alloc(gpu, n * es, &dout[k]), out);
    /* Two calls back to back, no wait between: the second rotary call's
     * tables must not overwrite the first's before its kernel has run. */
    for (int k = 0; k < 2; k++) {
        if (c->rotary)
            DT_TRY_GOTO(st, gpu->ops->rotary(gpu, c->dtype, c->outer, c->rows, c->inner, c->n,
                                             pos[k], c->pos_stride, c->base, c->style, dx,
                                             dout[k]), out);
        else
            DT_TRY_GOTO(st, gpu->ops->rmsnorm(gpu, c->dtype, c->rows, c->n, dx, dw, 1e-5f,
                                              dout[k]), out);
        if (!c->rotary) break;
    }
    for (int k = 0; k < (c->rotary ? 2 : 1); k++)
        DT_TRY_GOTO(st, gpu->ops->download(gpu, hgot[k], dout[k], n * es), out);

    for (int k = 0; k < (c->rotary ? 2 : 1); k++) {
        if (!cpu) DT_TRY_GOTO(st, dt_backend_cpu_create(0, &cpu), out);
        if (c->rotary)
            DT_TRY_GOTO(st, cpu->ops->rotary(cpu, c->dtype, c->outer, c->rows, c->inner, c->n,
                                             pos[k], c->pos_stride, c->base, c->style, hx,
                                             hwant), out);
        else
            DT_TRY_GOTO(st, cpu->ops->rmsnorm(cpu, c->dtype, c->rows, c->n, hx, nw ? hw : NULL,
                                              1e-5f, hwant), out);
        for (size_t i = 0; i < n; i++) ref[i] = get_val(hwant, c->dtype, i);
        /* 16-bit: one output ulp (fp16: and its subnormals' spacing) */
        const double atol = c->dtype == DT_F16 ? 1e-5 : c->dtype == DT_BF16 ? 1e-6
                            : c->rotary ? 2e-7 : 1e-6;
        const double rtol = c->dtype == DT_F16 ? ldexp(1.0, -10) : c->dtype == DT_BF16
                            ? ldexp(1.0, -7) : c->rotary ? 2e-7 : 1e-6;
        for (size_t i = 0; i < n; i++) gotf[i] = get_val(hgot[k], c->dtype, i);
        double maxe = 0;
        long bad = h_compare(c->rotary ? "rotary" : "rmsnorm", gotf, ref, n, atol, rtol, &maxe);
        if (bad)
            note_bad(&c->r, 0, "%s call %d: %ld of %zu outside atol %g + rtol %g, max error %.3g",
                     c->rotary ? "rotary" : "rmsnorm", k + 1, bad, n, atol, rtol, maxe);
        else
            print_message("  %s call %d: max |cuda - cpu| %.3g\n", c->rotary ? "rotary" : "rmsnorm",
                          k + 1, maxe);
    }
    /* In place (out == x) gives the same result. */
    if (c->rotary)
        DT_TRY_GOTO(st, gpu->ops->rotary(gpu, c->dtype, c->outer, c->rows, c->inner, c->n, pos[0],
                                         c->pos_stride, c->base, c->style, dx, dx), out);
    else
        DT_TRY_GOTO(st, gpu->ops->rmsnorm(gpu, c->dtype, c->rows, c->n, dx, dw, 1e-5f, dx), out);
    DT_TRY_GOTO(st, gpu->ops->download(gpu, hwant, dx, n * es), out);
    if (memcmp(hwant, hgot[0], n * es)) note_bad(&c->r, 0, "in-place result differs");
out:
    if (cpu) cpu->ops->destroy(cpu);
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dw);
    gpu->ops->free(gpu, dout[0]);
    gpu->ops->free(gpu, dout[1]);
    free(hx);
    free(hw);
    free(hgot[0]);
    free(hgot[1]);
    free(hwant);
    free(gotf);
    free(ref);
    free(pos[0]);
    free(pos[1]);
    record_status(&c->r, 0, st);
    return st;
}

static void test_nn(void **state) {
    nn_case *c = *state;
    REQUIRE_PAIR(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_nn, c);
    assert_results(&c->r, 1, st);
}

/* Rejections: the same statuses as the CPU backend, nothing launched. */
static dt_status rank_backend_errors(dt_context *ctx, void *arg) {
    results *r = arg;
    dt_backend *be = ctx->backend;
    void *p = NULL;
    const int64_t pos[1] = {3};
    dt_status st = be->ops->alloc(be, 64, &p);
    if (st != DT_SUCCESS) goto out;
    struct { dt_status got, want; const char *what; } e[] = {
        {be->ops->gemm(be, DT_U8, 2, 2, 2, p, p, p), DT_ERR_NOT_SUPPORTED, "gemm u8"},
        {be->ops->gemm(be, DT_F32, -1, 2, 2, p, p, p), DT_ERR_INVALID_ARGUMENT, "gemm m=-1"},
        {be->ops->add(be, DT_U8, 4, p, p, p), DT_ERR_NOT_SUPPORTED, "add u8"},
        {be->ops->gelu(be, DT_F32, 4, p, p, (dt_gelu_approx)7), DT_ERR_INVALID_ARGUMENT, "gelu approx 7"},
        {be->ops->rmsnorm(be, DT_U8, 2, 2, p, NULL, 1e-5f, p), DT_ERR_NOT_SUPPORTED, "rmsnorm u8"},
        {be->ops->rmsnorm(be, DT_F32, 2, 2, p, NULL, -1.0f, p), DT_ERR_INVALID_ARGUMENT,
         "rmsnorm eps -1"},
        {be->ops->rmsnorm(be, DT_F32, -1, 2, p, NULL, 1e-5f, p), DT_ERR_INVALID_ARGUMENT,
         "rmsnorm rows -1"},
        {be->ops->rotary(be, DT_F32, 1, 1, 1, 3, pos, 0, 1e4, DT_ROTARY_HALF, p, p),
         DT_ERR_INVALID_ARGUMENT, "rotary d=3"},
        {be->ops->rotary(be, DT_F32, 1, 1, 1, 4, pos, 0, 1e4, (dt_rotary_style)7, p, p),
         DT_ERR_INVALID_ARGUMENT, "rotary style 7"},
        {be->ops->rotary(be, DT_F32, 1, 1, 1, 4, NULL, 0, 1e4, DT_ROTARY_HALF, p, p),
         DT_ERR_INVALID_ARGUMENT, "rotary positions NULL"},
        {be->ops->rotary(be, DT_F32, 1, 1, 1, 4, pos, 0, 0.0, DT_ROTARY_HALF, p, p),
         DT_ERR_INVALID_ARGUMENT, "rotary base 0"},
        {be->ops->rotary(be, DT_U8, 1, 1, 1, 4, pos, 0, 1e4, DT_ROTARY_HALF, p, p),
         DT_ERR_NOT_SUPPORTED, "rotary u8"},
        {be->ops->rotary(be, DT_F32, 2, 2, 1, 4, pos, 1, 1e4, DT_ROTARY_HALF, p, p),
         DT_ERR_INVALID_ARGUMENT, "rotary pos_stride 1 < rows 2"},
        {be->ops->rotary(be, DT_F32, 2, 1, 1, 4, pos, -1, 1e4, DT_ROTARY_HALF, p, p),
         DT_ERR_INVALID_ARGUMENT, "rotary pos_stride -1"},
        {be->ops->copy_runs(be, &(dt_runs){DT_U8, DT_RUNS_ADD, p, p, 1, 1, 4, 0, 0, NULL, NULL}),
         DT_ERR_NOT_SUPPORTED, "copy_runs add u8"},
        {be->ops->copy_runs(be, &(dt_runs){DT_F32, DT_RUNS_COPY, p, p, 1, -1, 4, 0, 0, NULL, NULL}),
         DT_ERR_INVALID_ARGUMENT, "copy_runs n=-1"},
        {be->ops->copy_runs(be, NULL), DT_ERR_INVALID_ARGUMENT, "copy_runs NULL"},
        {be->ops->upload(be, NULL, p, 4), DT_ERR_INVALID_ARGUMENT, "upload to NULL"},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        if (e[i].got != e[i].want)
            note_bad(r, 0, "%s: got %s, expected %s", e[i].what, dt_status_name(e[i].got),
                     dt_status_name(e[i].want));
    st = be->ops->sync(be);
out:
    be->ops->free(be, p);
    record_status(r, 0, st);
    return st;
}

static void test_backend_errors(void **state) {
    (void)state;
    REQUIRE_PAIR(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    results r = {0};
    dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_backend_errors, &r);
    assert_results(&r, 1, st);
}

/* ============================================================ collectives */

typedef struct coll_case {
    dt_transport_kind transport;
    int p;              /* 0: as many ranks as NCCL can take (2..8), found at run time */
    int checks;
    int comm_ctas;      /* dt_backend_cuda_set_comm_ctas of every rank (0: the driver's copies) */
    results r;
} coll_case;

/* Small integers: every sum of up to 8 ranks is exact in fp32, bf16 and fp16, on
 * any transport and in any reduction order. */
static float ival(uint64_t seed, int rank, size_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull +
                 i * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    return (float)((int)(x % 17) - 8);
}

typedef struct rank_ctx {
    dt_context *ctx;
    dt_backend *be;
    results *r;
    int rank, p;
} rank_ctx;

/* Uploads n values of dtype from f(seed, rank, i) into a new device buffer. */
static dt_status dev_fill(rank_ctx *k, dt_dtype dt, size_t n, uint64_t seed, int owner, void **out) {
    size_t es = dt_dtype_size(dt);
    void *h = malloc(n * es + 1);
    if (!h) return dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
    for (size_t i = 0; i < n; i++) put_val(h, dt, i, ival(seed, owner, i));
    dt_status st = to_dev(k->be, h, n * es, out);
    free(h);
    return st;
}

/* Downloads n values and compares with want(i) exactly. */
typedef float (*want_fn)(const rank_ctx *k, size_t i, const void *arg);

static dt_status dev_check(rank_ctx *k, const char *what, const void *dev, dt_dtype dt, size_t n,
                           want_fn want, const void *arg) {
    size_t es = dt_dtype_size(dt);
    void *h = malloc(n * es + 1);
    if (!h) return dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
    dt_status st = k->be->ops->download(k->be, h, dev, n * es);
    for (size_t i = 0; st == DT_SUCCESS && i < n; i++) {
        float w = want(k, i, arg), g = get_val(h, dt, i);
        if (g != w) {
            note_bad(k->r, k->rank, "%s: [%zu] got %g, expected %g", what, i, g, w);
            break;
        }
    }
    free(h);
    return st;
}

typedef struct want_args { uint64_t seed; size_t count; int op; int root; int peer; } want_args;

static float want_reduce(const rank_ctx *k, size_t i, const void *arg) {
    const want_args *a = arg;
    float v = ival(a->seed, 0, i);
    for (int j = 1; j < k->p; j++) {
        float x = ival(a->seed, j, i);
        v = a->op == DT_REDUCE_SUM ? v + x : (x > v ? x : v);
    }
    return v;
}
static float want_reduce_scatter(const rank_ctx *k, size_t i, const void *arg) {
    return want_reduce(k, (size_t)k->rank * ((const want_args *)arg)->count + i, arg);
}
static float want_gather(const rank_ctx *k, size_t i, const void *arg) {
    const want_args *a = arg;
    (void)k;
    return ival(a->seed, (int)(i / a->count), i % a->count);
}
static float want_root(const rank_ctx *k, size_t i, const void *arg) {
    const want_args *a = arg;
    (void)k;
    return ival(a->seed, a->root, i);
}
static float want_scatter(const rank_ctx *k, size_t i, const void *arg) {
    const want_args *a = arg;
    return ival(a->seed, a->root, (size_t)k->rank * a->count + i);
}
static float want_peer(const rank_ctx *k, size_t i, const void *arg) {
    (void)k;
    return ival(((const want_args *)arg)->seed, ((const want_args *)arg)->peer, i);
}

static dt_status rank_collectives(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    rank_ctx k = {ctx, ctx->backend, &c->r, dt_context_rank(ctx), dt_context_world_size(ctx)};
    dt_comm *comm = dt_context_comm(ctx), *sub = NULL;
    const size_t N = 1037; /* odd, > 1 KiB: not a multiple of anything */
    int P = k.p, j = k.rank;
    void *a = NULL, *b = NULL, *big = NULL, *r2 = NULL;
    dt_status st = DT_SUCCESS;
    if (strcmp(k.be->ops->name, "cuda") != 0) note_bad(k.r, j, "backend is %s", k.be->ops->name);
#ifdef DT_HAVE_CUDA
    dt_backend_cuda_set_comm_ctas(k.be, c->comm_ctas);
#endif

    for (int dti = 0; dti < 3; dti++) {
        dt_dtype dt = (const dt_dtype[]){DT_F32, DT_BF16, DT_F16}[dti];
        size_t es = dt_dtype_size(dt);
        /* all_reduce: sum out of place, max in place */
        want_args w = {100 + dti, N, DT_REDUCE_SUM, 0, 0};
        DT_TRY_GOTO(st, dev_fill(&k, dt, N, w.seed, j, &a), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, N * es, &b), out);
        DT_TRY_GOTO(st, dt_comm_all_reduce(comm, a, b, N, dt, DT_REDUCE_SUM), out);
        DT_TRY_GOTO(st, dev_check(&k, "all_reduce sum", b, dt, N, want_reduce, &w), out);
        w.op = DT_REDUCE_MAX;
        DT_TRY_GOTO(st, dt_comm_all_reduce(comm, a, a, N, dt, DT_REDUCE_MAX), out);
        DT_TRY_GOTO(st, dev_check(&k, "all_reduce max in place", a, dt, N, want_reduce, &w), out);
        k.be->ops->free(k.be, a);
        k.be->ops->free(k.be, b);
        a = b = NULL;

        /* reduce_scatter */
        w = (want_args){200 + dti, N, DT_REDUCE_SUM, 0, 0};
        DT_TRY_GOTO(st, dev_fill(&k, dt, N * (size_t)P, w.seed, j, &big), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, N * es, &b), out);
        DT_TRY_GOTO(st, dt_comm_reduce_scatter(comm, big, b, N, dt, DT_REDUCE_SUM), out);
        DT_TRY_GOTO(st, dev_check(&k, "reduce_scatter", b, dt, N, want_reduce_scatter, &w), out);
        k.be->ops->free(k.be, big);
        k.be->ops->free(k.be, b);
        big = b = NULL;
    }

    /* all_gather, broadcast (root P-1), scatter (root 0), gather (root P-1) */
    {
        want_args w = {300, N, 0, 0, 0};
        DT_TRY_GOTO(st, dev_fill(&k, DT_F32, N, w.seed, j, &a), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, N * 4 * (size_t)P, &big), out);
        DT_TRY_GOTO(st, dt_comm_all_gather(comm, a, big, N, DT_F32), out);
        DT_TRY_GOTO(st, dev_check(&k, "all_gather", big, DT_F32, N * (size_t)P, want_gather, &w), out);
        k.be->ops->free(k.be, a);
        a = NULL;

        w = (want_args){301, N, 0, P - 1, 0};
        DT_TRY_GOTO(st, dev_fill(&k, DT_F32, N, w.seed, j, &a), out);
        DT_TRY_GOTO(st, dt_comm_broadcast(comm, a, N, DT_F32, P - 1), out);
        DT_TRY_GOTO(st, dev_check(&k, "broadcast", a, DT_F32, N, want_root, &w), out);
        k.be->ops->free(k.be, a);
        k.be->ops->free(k.be, big);
        a = big = NULL;

        w = (want_args){302, N, 0, 0, 0};
        DT_TRY_GOTO(st, dev_fill(&k, DT_F32, N * (size_t)P, w.seed, j, &big), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, N * 4, &b), out);
        DT_TRY_GOTO(st, dt_comm_scatter(comm, big, b, N, DT_F32, 0), out);
        DT_TRY_GOTO(st, dev_check(&k, "scatter", b, DT_F32, N, want_scatter, &w), out);
        k.be->ops->free(k.be, big);
        k.be->ops->free(k.be, b);
        big = b = NULL;

        w = (want_args){303, N, 0, P - 1, 0};
        DT_TRY_GOTO(st, dev_fill(&k, DT_F32, N, w.seed, j, &a), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, N * 4 * (size_t)P, &big), out);
        DT_TRY_GOTO(st, dt_comm_gather(comm, a, big, N, DT_F32, P - 1), out);
        if (j == P - 1)
            DT_TRY_GOTO(st, dev_check(&k, "gather", big, DT_F32, N * (size_t)P, want_gather, &w), out);
        k.be->ops->free(k.be, a);
        k.be->ops->free(k.be, big);
        a = big = NULL;
    }

    DT_TRY_GOTO(st, dt_comm_barrier(comm), out);

    /* A send/recv group: to rank+1, from rank-1, and to/from itself. */
    {
        want_args w = {400, N, 0, 0, (j + P - 1) % P};
        want_args self = {400, N, 0, 0, j};
        DT_TRY_GOTO(st, dev_fill(&k, DT_BF16, N, w.seed, j, &a), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, N * 2, &b), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, N * 2, &r2), out);
        dt_p2p_op ops[4] = {
            {DT_P2P_SEND, (j + 1) % P, a, N, DT_BF16},
            {DT_P2P_RECV, (j + P - 1) % P, b, N, DT_BF16},
            {DT_P2P_SEND, j, a, N, DT_BF16},
            {DT_P2P_RECV, j, r2, N, DT_BF16},
        };
        DT_TRY_GOTO(st, dt_comm_sendrecv(comm, ops, 4), out);
        DT_TRY_GOTO(st, dev_check(&k, "sendrecv from rank-1", b, DT_BF16, N, want_peer, &w), out);
        DT_TRY_GOTO(st, dev_check(&k, "sendrecv to self", r2, DT_BF16, N, want_peer, &self), out);
        k.be->ops->free(k.be, a);
        k.be->ops->free(k.be, b);
        k.be->ops->free(k.be, r2);
        a = b = r2 = NULL;
    }

    /* Host buffers: staged on NCCL, copied by the hooks on cuda+local. */
    {
        float hs[5], hr[5], hall[5 * MAXP];
        for (int i = 0; i < 5; i++) hs[i] = ival(500, j, (size_t)i);
        DT_TRY_GOTO(st, dt_comm_all_reduce(comm, hs, hr, 5, DT_F32, DT_REDUCE_SUM), out);
        want_args w = {500, 5, DT_REDUCE_SUM, 0, 0};
        for (int i = 0; i < 5; i++)
            if (hr[i] != want_reduce(&k, (size_t)i, &w))
                note_bad(k.r, j, "host all_reduce: [%d] got %g", i, hr[i]);
        DT_TRY_GOTO(st, dt_comm_all_gather(comm, hs, hall, 5, DT_F32), out);
        for (int i = 0; i < 5 * P; i++)
            if (hall[i] != ival(500, i / 5, (size_t)(i % 5)))
                note_bad(k.r, j, "host all_gather: [%d] got %g", i, hall[i]);
        int64_t mine[2] = {42, 7};
        static const char *const names[2] = {"answer", "seven"};
        DT_TRY_GOTO(st, dt_comm_check_agreement(comm, "test", mine, names, 2), out);
    }

    /* A send/recv group between host and device memory, two messages to
     * the same peer in order: from a host array into the next rank's device
     * buffer, and from a device buffer into its host array. */
    {
        enum { NH = 64 };
        float hs[NH], hr[NH], got[NH];
        const int prev = (j + P - 1) % P;
        for (int i = 0; i < NH; i++) hs[i] = ival(600, j, (size_t)i), hr[i] = NAN;
        DT_TRY_GOTO(st, to_dev(k.be, hs, sizeof hs, &a), out);
        DT_TRY_GOTO(st, k.be->ops->alloc(k.be, sizeof got, &b), out);
        dt_p2p_op ops[4] = {
            {DT_P2P_SEND, (j + 1) % P, hs, NH, DT_F32},
            {DT_P2P_RECV, prev, b, NH, DT_F32},
            {DT_P2P_SEND, (j + 1) % P, a, NH, DT_F32},
            {DT_P2P_RECV, prev, hr, NH, DT_F32},
        };
        DT_TRY_GOTO(st, dt_comm_sendrecv(comm, ops, 4), out);
        DT_TRY_GOTO(st, k.be->ops->download(k.be, got, b, sizeof got), out);
        for (int i = 0; i < NH; i++) {
            if (got[i] != ival(600, prev, (size_t)i))
                note_bad(k.r, j, "sendrecv host -> device: [%d] got %g", i, got[i]);
            if (hr[i] != ival(600, prev, (size_t)i))
                note_bad(k.r, j, "sendrecv device -> host: [%d] got %g", i, hr[i]);
        }
        k.be->ops->free(k.be, a);
        k.be->ops->free(k.be, b);
        a = b = NULL;
    }

    /* split: even and odd ranks, reversed order, one all_reduce each */
    DT_TRY_GOTO(st, dt_comm_split(comm, j % 2, -j, &sub), out);
    if (!sub) {
        note_bad(k.r, j, "split gave no communicator");
    } else {
        int q = dt_comm_size(sub);
        int expect_q = (P - j % 2 + 1) / 2;
        if (q != expect_q) note_bad(k.r, j, "split: size %d, expected %d", q, expect_q);
        float x = (float)j, s = 0;
        void *dx = NULL;
        DT_TRY_GOTO(st, to_dev(k.be, &x, sizeof x, &dx), out);
        st = dt_comm_all_reduce(sub, dx, dx, 1, DT_F32, DT_REDUCE_SUM);
        if (st == DT_SUCCESS) st = k.be->ops->download(k.be, &s, dx, sizeof s);
        k.be->ops->free(k.be, dx);
        if (st != DT_SUCCESS) goto out;
        float want = 0;
        for (int m = j % 2; m < P; m += 2) want += (float)m;
        if (s != want) note_bad(k.r, j, "split all_reduce: got %g, expected %g", s, want);
        /* ranks ordered by key -rank: the highest rank of the color is 0 */
        int hi = (P - 1) - ((P - 1 - j % 2) % 2);
        if (dt_comm_rank(sub) != (hi - j) / 2)
            note_bad(k.r, j, "split: rank %d, expected %d", dt_comm_rank(sub), (hi - j) / 2);
    }
    st = k.be->ops->sync(k.be);
out:
    dt_comm_destroy(sub);
    k.be->ops->free(k.be, a);
    k.be->ops->free(k.be, b);
    k.be->ops->free(k.be, r2);
    k.be->ops->free(k.be, big);
    record_status(k.r, j, st);
    return st;
}

/* NCCL with every GPU: the largest P in 2..8 this machine can run. */
static int nccl_all_gpus(char *why, size_t size) {
    for (int p = MAXP; p >= 2; p--) {
        if (h_pair_available(p, DT_BACKEND_CUDA, DT_TRANSPORT_NCCL, why, size)) return p;
        if (!strstr(why, "needs one GPU per rank")) return 0; /* no NCCL or no GPU at all */
    }
    snprintf(why, size, "fewer than 2 GPUs for NCCL");
    return 0;
}

static void test_collectives(void **state) {
    coll_case *c = *state;
    int p = c->p;
    if (p == 0) {
        char why[768];
        p = nccl_all_gpus(why, sizeof why);
        if (p == 0) {
            print_message("skipped: %s\n", why);
            skip();
            return;
        }
        print_message("  NCCL over %d GPUs\n", p);
    } else {
        REQUIRE_PAIR(p, DT_BACKEND_CUDA, c->transport);
    }
    memset(&c->r, 0, sizeof c->r);
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CUDA;
    o.transport = c->transport;
    o.checks = c->checks ? DT_CHECK_ON : DT_CHECK_OFF;
    o.timeout_ms = getenv("DT_TIMEOUT_MS") ? 0 : 60000;
    dt_status st = dt_launch(p, rank_collectives, c, &o);
    assert_results(&c->r, p, st);
}

/* The local transport's copies by the communication stream's copy kernel
 * (dt_backend_cuda_set_comm_ctas): P ranks each send the next rank, in one
 * group, a long bf16 message (3 x 8192 x 8 + 5 values: past two CTAs'
 * rounds of 8192 16-byte units, and 10 bytes past the last whole 16, which
 * the driver copies) and the same values less the first from 2 bytes into
 * the buffer (not 16-byte aligned: the driver's copy). Bit-exact on
 * arrival, with the driver's copies (0) and with a kernel of 2 CTAs. The
 * kernel moves a copy within one GPU only (rank r runs on GPU r mod the
 * GPUs): P = 2 on one GPU, else one rank more than the GPUs (at most 8),
 * so that the last rank shares GPU 0 with the first. On the emulator the
 * CTAs that ran are counted too: 2 per long message within a GPU more
 * than with the driver's copies. */
typedef struct copy_case {
    int ctas;
    int device[MAXP];
    results r;
} copy_case;

#define LONG_N ((size_t)3 * 8192 * 8 + 5)

static float want_peer_from_1(const rank_ctx *k, size_t i, const void *arg) {
    return want_peer(k, i + 1, arg);
}

static dt_status rank_long_copies(dt_context *ctx, void *arg) {
    copy_case *c = arg;
    rank_ctx k = {ctx, ctx->backend, &c->r, dt_context_rank(ctx), dt_context_world_size(ctx)};
    const int j = k.rank, P = k.p;
    void *a = NULL, *b = NULL, *b2 = NULL;
    want_args w = {700, LONG_N, 0, 0, (j + P - 1) % P};
    c->device[j] = dt_context_cuda_device(ctx);
#ifdef DT_HAVE_CUDA
    dt_backend_cuda_set_comm_ctas(k.be, c->ctas);
#endif
    dt_status st = dev_fill(&k, DT_BF16, LONG_N, w.seed, j, &a);
    if (st == DT_SUCCESS) st = k.be->ops->alloc(k.be, LONG_N * 2, &b);
    if (st == DT_SUCCESS) st = k.be->ops->alloc(k.be, LONG_N * 2, &b2);
    if (st == DT_SUCCESS) {
        dt_p2p_op ops[4] = {
            {DT_P2P_SEND, (j + 1) % P, a, LONG_N, DT_BF16},
            {DT_P2P_RECV, (j + P - 1) % P, b, LONG_N, DT_BF16},
            {DT_P2P_SEND, (j + 1) % P, (char *)a + 2, LONG_N - 1, DT_BF16},
            {DT_P2P_RECV, (j + P - 1) % P, b2, LONG_N - 1, DT_BF16},
        };
        st = dt_comm_sendrecv(dt_context_comm(ctx), ops, 4);
    }
    if (st == DT_SUCCESS) st = dev_check(&k, "long message", b, DT_BF16, LONG_N, want_peer, &w);
    if (st == DT_SUCCESS)
        st = dev_check(&k, "long message from 2 bytes in", b2, DT_BF16, LONG_N - 1, want_peer_from_1, &w);
    k.be->ops->free(k.be, a);
    k.be->ops->free(k.be, b);
    k.be->ops->free(k.be, b2);
    record_status(k.r, j, st);
    return st;
}

static void test_long_copies(void **state) {
    (void)state;
    int gpus = 0;
#ifdef DT_HAVE_CUDA
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
#endif
    const int p = gpus <= 1 || gpus + 1 > MAXP ? 2 : gpus + 1;
    REQUIRE_PAIR(p, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    static copy_case cases[2] = {{.ctas = 0}, {.ctas = 2}};
    uint64_t ran[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        memset(&cases[i].r, 0, sizeof cases[i].r);
#ifdef DT_CUDA_EMULATE
        const uint64_t before = dt_emu_get_counts().blocks;
#endif
        dt_status st = h_launch_on(p, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_long_copies, &cases[i]);
        assert_results(&cases[i].r, p, st);
#ifdef DT_CUDA_EMULATE
        ran[i] = dt_emu_get_counts().blocks - before;
#endif
    }
    int within = 0;   /* long messages within one GPU */
    for (int j = 0; j < p; j++) within += cases[1].device[j] == cases[1].device[(j + 1) % p];
    print_message("  %d ranks on %d GPU(s): %d long message(s) within one GPU\n", p, gpus, within);
#ifdef DT_CUDA_EMULATE
    print_message("  CTAs run: %llu with the driver's copies, %llu with a copy kernel of 2 CTAs\n",
                  (unsigned long long)ran[0], (unsigned long long)ran[1]);
    assert_true(within > 0);
    assert_int_equal(ran[1] - ran[0], 2 * within);
#else
    (void)ran;
#endif
}

/* The communication stream's default (dt_backend_cuda_comm_ctas as a
 * backend starts): the ranks of a launch on one device share
 * DT_CUDA_COMM_CTAS, DT_CUDA_COMM_CTAS / ranks each (at least 1), and a
 * rank alone on its device has 0 (the driver's copy). Each rank records
 * its device and its default; the ranks per device are counted from the
 * devices recorded. P = 2, 3, 5 and 8: on one GPU (2, 3, 5, 8 sharing it),
 * on the CI emulator's 4 (alone, alone, GPU 0 shared by two, each by two). */
typedef struct default_ctas_case {
    int p;
    int device[MAXP], ctas[MAXP];
    results r;
} default_ctas_case;

static dt_status rank_default_ctas(dt_context *ctx, void *arg) {
    default_ctas_case *c = arg;
    const int j = dt_context_rank(ctx);
    c->device[j] = dt_context_cuda_device(ctx);
#ifdef DT_HAVE_CUDA
    c->ctas[j] = dt_backend_cuda_comm_ctas(ctx->backend);
#endif
    record_status(&c->r, j, DT_SUCCESS);
    return DT_SUCCESS;
}

static void test_default_comm_ctas(void **state) {
    default_ctas_case *c = *state;
    REQUIRE_PAIR(c->p, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL);
    memset(c->device, -1, sizeof c->device);
    memset(c->ctas, -1, sizeof c->ctas);
    memset(&c->r, 0, sizeof c->r);
    dt_status st = h_launch_on(c->p, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_default_ctas, c);
    assert_results(&c->r, c->p, st);
#ifdef DT_HAVE_CUDA
    for (int j = 0; j < c->p; j++) {
        int sharing = 0;
        for (int q = 0; q < c->p; q++) sharing += c->device[q] == c->device[j];
        const int share = DT_CUDA_COMM_CTAS / sharing, want = sharing < 2 ? 0 : share > 0 ? share : 1;
        if (j == 0)
            print_message("  rank 0: GPU %d, %d of the %d ranks on it: %d CTAs\n", c->device[0],
                          sharing, c->p, c->ctas[0]);
        assert_true(c->device[j] >= 0);
        assert_int_equal(c->ctas[j], want);
    }
#endif
}

/* The fault cases over NCCL, on every GPU: the last rank misbehaves while
 * the others wait for it in a barrier (faults below). */
typedef struct fault_case {
    int aborts;   /* the last rank aborts (dt_comm_abort), else it never calls */
    results r;
} fault_case;

static dt_status rank_fault(dt_context *ctx, void *arg) {
    fault_case *f = arg;
    int j = dt_context_rank(ctx), P = dt_context_world_size(ctx);
    dt_comm *comm = dt_context_comm(ctx);
    dt_status st = DT_SUCCESS;
    if (j == P - 1 && f->aborts) dt_comm_abort(comm, DT_ERR_BACKEND, "injected abort");
    if (j != P - 1 || f->aborts) st = dt_comm_barrier(comm);
    f->r.st[j] = st;
    if (st != DT_SUCCESS) snprintf(f->r.msg[j], sizeof f->r.msg[j], "%s", dt_last_error());
    return st;
}

/* Runs the case with the given timeout; the launch's status, P in *p and
 * the seconds it took in *s. *p is 0, and the test skipped, where NCCL or
 * two GPUs are missing. */
static dt_status fault_launch(fault_case *f, long timeout_ms, int *p, double *s) {
    char why[768];
    *p = nccl_all_gpus(why, sizeof why);
    if (*p == 0) {
        print_message("skipped: %s\n", why);
        return DT_SUCCESS;
    }
    memset(&f->r, 0, sizeof f->r);
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CUDA;
    o.transport = DT_TRANSPORT_NCCL;
    o.timeout_ms = timeout_ms;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dt_status st = dt_launch(*p, rank_fault, f, &o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    print_message("  %d ranks over NCCL, rank %d %s: %s after %.2f s: %s\n", *p, *p - 1,
                  f->aborts ? "aborts" : "never calls", dt_status_name(st), *s,
                  st == DT_SUCCESS ? "" : dt_last_error());
    return st;
}

/* A rank that never calls: the last rank returns without the barrier the
 * others wait in. Every waiting rank must return within the timeout (1 s
 * here) with DT_ERR_TIMEOUT or DT_ERR_PEER_FAILED, and the launch reports
 * the failure. On NCCL the waiting ranks time out polling their event and
 * abort; the early rank, in its teardown, sees the abort. */
static void test_never_calls(void **state) {
    (void)state;
    fault_case f = {.aborts = 0};
    int p;
    double s = 0;
    dt_status st = fault_launch(&f, 1000, &p, &s);
    if (p == 0) {
        skip();
        return;
    }
    assert_int_not_equal(st, DT_SUCCESS);
    for (int j = 0; j < p - 1; j++) {
        if (f.r.st[j] != DT_ERR_TIMEOUT && f.r.st[j] != DT_ERR_PEER_FAILED)
            print_error("rank %d: %s: %s\n", j, dt_status_name(f.r.st[j]), f.r.msg[j]);
        assert_true(f.r.st[j] == DT_ERR_TIMEOUT || f.r.st[j] == DT_ERR_PEER_FAILED);
    }
    assert_true(s < 30.0);
}

/* A rank aborts (dt_comm_abort) while the others wait for it: each of them
 * returns DT_ERR_PEER_FAILED naming that rank and its reason, the rank
 * itself its own failure from its next call, and the launch the abort's
 * status (collectives/failure.h's rule; the local transport's in
 * test_collectives). The timeout is long: the abort must end the waits. */
static void test_peer_aborts(void **state) {
    (void)state;
    fault_case f = {.aborts = 1};
    int p;
    double s = 0;
    dt_status st = fault_launch(&f, 30000, &p, &s);
    if (p == 0) {
        skip();
        return;
    }
    assert_int_equal(st, DT_ERR_BACKEND);
    assert_non_null(strstr(dt_last_error(), "injected abort"));
    char want[64];
    snprintf(want, sizeof want, "stopped: rank %d failed: ", p - 1);
    for (int j = 0; j < p; j++) {
        const dt_status ws = j == p - 1 ? DT_ERR_BACKEND : DT_ERR_PEER_FAILED;
        if (f.r.st[j] != ws)
            print_error("rank %d: %s: %s\n", j, dt_status_name(f.r.st[j]), f.r.msg[j]);
        assert_int_equal(f.r.st[j], ws);
        assert_non_null(strstr(f.r.msg[j], "injected abort"));
        if (j != p - 1) assert_non_null(strstr(f.r.msg[j], want));
    }
    assert_true(s < 20.0);
}

/* ================================================================ the ring */

#define RING_BYTES 1001 /* odd: the ring moves bytes */

typedef struct ring_case {
    dt_transport_kind transport;
    int p;
    dt_ring_direction dir;
    results r;
} ring_case;

static unsigned char pattern(int owner, size_t i) { return (unsigned char)(owner * 37 + i * 11 + 5); }

static dt_status rank_ring(dt_context *ctx, void *arg) {
    ring_case *c = arg;
    dt_backend *be = ctx->backend;
    int j = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    dt_ring *ring = NULL;
    unsigned char host[RING_BYTES];
    dt_status st = dt_ring_create(dt_context_comm(ctx), RING_BYTES, c->dir, &ring);
    if (st != DT_SUCCESS) goto out;
    for (size_t i = 0; i < RING_BYTES; i++) host[i] = pattern(j, i);
    /* The ring's buffers are device memory: filled by upload. */
    DT_TRY_GOTO(st, be->ops->upload(be, dt_ring_current(ring), host, RING_BYTES), out);
    for (int t = 0; t <= p; t++) {
        int want = c->dir == DT_RING_FORWARD ? ((j - t) % p + p) % p : (j + t) % p;
        DT_TRY_GOTO(st, be->ops->download(be, host, dt_ring_current(ring), RING_BYTES), out);
        for (size_t i = 0; i < RING_BYTES; i++)
            if (host[i] != pattern(want, i)) {
                note_bad(&c->r, j, "step %d: byte %zu is %d, expected rank %d's %d", t, i, host[i],
                         want, pattern(want, i));
                break;
            }
        if (dt_ring_source(ring) != want) note_bad(&c->r, j, "step %d: source %d", t, dt_ring_source(ring));
        if (t == p) break;
        DT_TRY_GOTO(st, dt_ring_start(ring), out);
        DT_TRY_GOTO(st, dt_ring_wait(ring), out);
    }
out:
    dt_ring_destroy(ring);
    record_status(&c->r, j, st);
    return st;
}

static void test_ring(void **state) {
    ring_case *c = *state;
    int p = c->p;
    if (p == 0) {
        char why[768];
        p = nccl_all_gpus(why, sizeof why);
        if (p == 0) {
            print_message("skipped: %s\n", why);
            skip();
            return;
        }
    } else {
        REQUIRE_PAIR(p, DT_BACKEND_CUDA, c->transport);
    }
    memset(&c->r, 0, sizeof c->r);
    dt_status st = h_launch_on(p, DT_BACKEND_CUDA, c->transport, rank_ring, c);
    assert_results(&c->r, p, st);
}

/* =============================================================== selection */

typedef struct kinds { dt_backend_kind b; dt_transport_kind t; } kinds;

static dt_status rank_kinds(dt_context *ctx, void *arg) {
    kinds *k = arg;
    if (dt_context_rank(ctx) == 0) {
        k->b = dt_context_backend(ctx);
        k->t = dt_context_transport(ctx);
    }
    return DT_SUCCESS;
}

/* What auto picks and what is refused, on this machine. Runs everywhere. */
static void test_selection(void **state) {
    (void)state;
    static const char *const vars[] = {"DT_BACKEND", "DT_TRANSPORT"};
    char saved[2][32];
    int had[2];
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(vars[i]);
        had[i] = v != NULL;
        if (v) snprintf(saved[i], sizeof saved[i], "%s", v);
        unsetenv(vars[i]);
    }
    char why[768];
    int cuda = h_pair_available(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why);
    if (!cuda) {
        /* No GPU: the refusal names the reason. */
        assert_non_null(strstr(why, "DT_ERR_NOT_SUPPORTED"));
        assert_true(strstr(why, "cudaGetDeviceCount") || strstr(why, "without CUDA"));
        print_message("  no GPU here: %s\n", why);
    }
    int nccl1 = h_pair_available(1, DT_BACKEND_CUDA, DT_TRANSPORT_NCCL, why, sizeof why);
    if (!nccl1) assert_non_null(strstr(why, "DT_ERR_NOT_SUPPORTED"));

    kinds k = {DT_BACKEND_AUTO, DT_TRANSPORT_AUTO};
    assert_int_equal(dt_launch(1, rank_kinds, &k, NULL), DT_SUCCESS);
    assert_int_equal(k.b, cuda ? DT_BACKEND_CUDA : DT_BACKEND_CPU);
    assert_int_equal(k.t, nccl1 ? DT_TRANSPORT_NCCL : DT_TRANSPORT_LOCAL);
    /* More ranks than any machine here has GPUs: shared GPUs, or the CPU. */
    assert_int_equal(dt_launch(9, rank_kinds, &k, NULL), DT_SUCCESS);
    assert_int_equal(k.b, cuda ? DT_BACKEND_CUDA : DT_BACKEND_CPU);
    assert_int_equal(k.t, DT_TRANSPORT_LOCAL);
    /* NCCL cannot put two ranks on one GPU, nor move host memory. */
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.transport = DT_TRANSPORT_NCCL;
    assert_int_equal(dt_launch(9, rank_kinds, &k, &o), DT_ERR_NOT_SUPPORTED);
    o.backend = DT_BACKEND_CPU;
    assert_int_equal(dt_launch(1, rank_kinds, &k, &o), DT_ERR_NOT_SUPPORTED);
    /* The environment steers AUTO; explicit options win over it. */
    setenv("DT_BACKEND", "cpu", 1);
    assert_int_equal(dt_launch(2, rank_kinds, &k, NULL), DT_SUCCESS);
    assert_int_equal(k.b, DT_BACKEND_CPU);
    assert_int_equal(k.t, DT_TRANSPORT_LOCAL);
    setenv("DT_BACKEND", "cuda", 1);
    assert_int_equal(dt_launch(2, rank_kinds, &k, NULL), cuda ? DT_SUCCESS : DT_ERR_NOT_SUPPORTED);
    o = (dt_launch_options)DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CPU;
    assert_int_equal(dt_launch(2, rank_kinds, &k, &o), DT_SUCCESS);
    assert_int_equal(k.b, DT_BACKEND_CPU);
    setenv("DT_TF32", "yes", 1);
    assert_int_equal(dt_launch(1, rank_kinds, &k, NULL), DT_ERR_INVALID_ARGUMENT);
    unsetenv("DT_TF32");
    for (int i = 0; i < 2; i++) {
        if (had[i]) setenv(vars[i], saved[i], 1);
        else unsetenv(vars[i]);
    }
}

/* ==================================================================== main */

typedef struct table {
    struct CMUnitTest *tests;
    char (*names)[160];
    size_t n, cap;
} table;

static void add(table *t, CMUnitTestFunction fn, void *state, const char *fmt, ...) {
    if (t->n == t->cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->names[t->n], sizeof t->names[t->n], fmt, ap);
    va_end(ap);
    t->tests[t->n] = (struct CMUnitTest){t->names[t->n], fn, NULL, NULL, state};
    t->n++;
}

static const char *tab_name(tab_kind k) {
    static const char *const n[] = {"no tables", "src table", "dst table", "both tables"};
    return n[k];
}

int main(void) {
    enum { CAP = 128 };
    table tb = {calloc(CAP, sizeof(struct CMUnitTest)), calloc(CAP, 160), 0, CAP};
    if (!tb.tests || !tb.names) return 1;

    add(&tb, test_selection, NULL, "selection/auto,env,refusals");
    add(&tb, test_memory, NULL, "backend/memory: alloc,upload,download,copy,zero,sync");
    add(&tb, test_cache, NULL, "backend/memory: the caching allocator: reuse, zeroing, out of memory");
    add(&tb, test_cache_pool, NULL, "backend/memory: ranks sharing a device reclaim each other's caches");
    add(&tb, test_backend_errors, NULL, "backend/errors");
    add(&tb, test_no_stream_on_cpu, NULL, "context/stream: none on the cpu backend");
    for (intptr_t p = 1; p <= 2; p++)
        add(&tb, test_own_work, (void *)p, "context/stream: a caller's copies ordered with the library's, P=%d",
            (int)p);

    static runs_case runs[] = {
        {.op = DT_RUNS_COPY, .dtype = DT_F32, .outer = 1, .n = 37, .run = 1, .dpad = 0, .spad = 0, .tabs = TAB_BOTH},
        {.op = DT_RUNS_COPY, .dtype = DT_F32, .outer = 3, .n = 16, .run = 256, .dpad = 4, .spad = 8, .tabs = TAB_SRC},
        {.op = DT_RUNS_COPY, .dtype = DT_BF16, .outer = 2, .n = 33, .run = 5, .dpad = 3, .spad = 1, .tabs = TAB_DST},
        {.op = DT_RUNS_COPY, .dtype = DT_F16, .outer = 1, .n = 64, .run = 130, .dpad = 0, .spad = 0, .tabs = TAB_NONE},
        {.op = DT_RUNS_COPY, .dtype = DT_U8, .outer = 4, .n = 17, .run = 3, .dpad = 5, .spad = 2, .tabs = TAB_BOTH},
        {.op = DT_RUNS_COPY, .dtype = DT_U8, .outer = 1, .n = 1000, .run = 1, .dpad = 0, .spad = 0, .tabs = TAB_BOTH},
        {.op = DT_RUNS_COPY, .dtype = DT_F32, .outer = 2, .n = 5, .run = 1024, .dpad = 0, .spad = 4, .tabs = TAB_NONE},
        {.op = DT_RUNS_ADD, .dtype = DT_F32, .outer = 2, .n = 40, .run = 7, .dpad = 1, .spad = 2, .tabs = TAB_BOTH},
        {.op = DT_RUNS_ADD, .dtype = DT_F32, .outer = 1, .n = 8, .run = 300, .dpad = 0, .spad = 0, .tabs = TAB_SRC},
        {.op = DT_RUNS_ADD, .dtype = DT_BF16, .outer = 3, .n = 25, .run = 2, .dpad = 2, .spad = 0, .tabs = TAB_BOTH},
        {.op = DT_RUNS_ADD, .dtype = DT_BF16, .outer = 1, .n = 4, .run = 513, .dpad = 0, .spad = 0, .tabs = TAB_DST},
        {.op = DT_RUNS_ADD, .dtype = DT_F16, .outer = 2, .n = 20, .run = 9, .dpad = 1, .spad = 1, .tabs = TAB_BOTH},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        runs_case *c = &runs[i];
        add(&tb, test_runs, c, "copy_runs/%s,%s,outer=%lld,n=%lld,run=%lld,%s: bit-exact vs cpu",
            c->op == DT_RUNS_COPY ? "copy" : "add", dt_dtype_name(c->dtype), (long long)c->outer,
            (long long)c->n, (long long)c->run, tab_name(c->tabs));
    }

    /* gemm tolerances, |got - ref| <= atol + rtol |ref| against double, for
     * inputs in [-1, 1) and k <= 256 (outputs of size ~sqrt(k)/3 <= 5.3):
     * fp32 1e-4/1e-4 (TF32 would miss it: that is the TF32-off check);
     * TF32 1e-2/1e-2 (10-bit inputs); bf16 1e-2/8e-3 and fp16 2e-3/2e-3,
     * one output ulp relative plus one ulp at the outputs' scale in case
     * cuBLAS splits k and rounds partial sums. */
    static gemm_case gemms[] = {
        {.dtype = DT_F32, .m = 1, .n = 1, .k = 1, .tf32 = 0, .atol = 1e-4, .rtol = 1e-4},
        {.dtype = DT_F32, .m = 17, .n = 33, .k = 65, .tf32 = 0, .atol = 1e-4, .rtol = 1e-4},
        {.dtype = DT_F32, .m = 64, .n = 128, .k = 256, .tf32 = 0, .atol = 1e-4, .rtol = 1e-4},
        {.dtype = DT_F32, .m = 5, .n = 7, .k = 0, .tf32 = 0, .atol = 0, .rtol = 0},
        {.dtype = DT_F32, .m = 64, .n = 128, .k = 256, .tf32 = 1, .atol = 1e-2, .rtol = 1e-2},
        {.dtype = DT_BF16, .m = 17, .n = 33, .k = 65, .tf32 = 0, .atol = 1e-2, .rtol = 8e-3},
        {.dtype = DT_BF16, .m = 64, .n = 128, .k = 256, .tf32 = 0, .atol = 1e-2, .rtol = 8e-3},
        {.dtype = DT_F16, .m = 17, .n = 33, .k = 65, .tf32 = 0, .atol = 2e-3, .rtol = 2e-3},
        {.dtype = DT_F16, .m = 64, .n = 128, .k = 256, .tf32 = 0, .atol = 2e-3, .rtol = 2e-3},
    };
    for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++) {
        gemm_case *c = &gemms[i];
        add(&tb, test_gemm, c, "gemm/%s%s,m=%lld,n=%lld,k=%lld: atol %g rtol %g",
            dt_dtype_name(c->dtype), c->tf32 ? ",TF32" : "", (long long)c->m, (long long)c->n,
            (long long)c->k, c->atol, c->rtol);
    }

    static ew_case ews[] = {
        {.gelu = 0, .approx = DT_GELU_ERF, .dtype = DT_F32, .n = 1},      {.gelu = 0, .approx = DT_GELU_ERF, .dtype = DT_F32, .n = 100003},
        {.gelu = 0, .approx = DT_GELU_ERF, .dtype = DT_BF16, .n = 4097},  {.gelu = 0, .approx = DT_GELU_ERF, .dtype = DT_F16, .n = 4097},
        {.gelu = 1, .approx = DT_GELU_ERF, .dtype = DT_F32, .n = 100003}, {.gelu = 1, .approx = DT_GELU_TANH, .dtype = DT_F32, .n = 100003},
        {.gelu = 1, .approx = DT_GELU_ERF, .dtype = DT_BF16, .n = 4097},  {.gelu = 1, .approx = DT_GELU_TANH, .dtype = DT_BF16, .n = 4097},
        {.gelu = 1, .approx = DT_GELU_ERF, .dtype = DT_F16, .n = 4097},   {.gelu = 1, .approx = DT_GELU_TANH, .dtype = DT_F16, .n = 4097},
        /* add_beside by the communication stream's few CTAs: rounds of
         * 4096 groups of four, and 3, 1 or no values past the last four */
        {.gelu = 0, .approx = DT_GELU_ERF, .dtype = DT_F32, .n = 100003, .comm_ctas = 2},
        {.gelu = 0, .approx = DT_GELU_ERF, .dtype = DT_BF16, .n = 4097, .comm_ctas = 3},
        {.gelu = 0, .approx = DT_GELU_ERF, .dtype = DT_F16, .n = 40960, .comm_ctas = 1},
    };
    for (size_t i = 0; i < sizeof ews / sizeof ews[0]; i++) {
        ew_case *c = &ews[i];
        if (c->gelu)
            add(&tb, test_elementwise, c, "gelu/%s,%s,n=%lld: %s", dt_gelu_approx_name(c->approx),
                dt_dtype_name(c->dtype), (long long)c->n,
                c->dtype == DT_F32 ? "atol 1e-6 rtol 1e-5 vs cpu" : "one output ulp vs cpu");
        else if (c->comm_ctas)
            add(&tb, test_elementwise, c, "add/%s,n=%lld,add_beside in %d CTAs: bit-exact vs cpu",
                dt_dtype_name(c->dtype), (long long)c->n, c->comm_ctas);
        else
            add(&tb, test_elementwise, c, "add/%s,n=%lld: bit-exact vs cpu", dt_dtype_name(c->dtype),
                (long long)c->n);
    }

    /* rmsnorm: one row and many (more than the grid's blocks: rows loop),
     * short rows (one warp) and long ones (threads loop, not a multiple of
     * 32); rotary: d = 2 up to 128, few pairs with many heads (blockIdx.y
     * loops), both styles, positions shared by the outer rows or a list
     * per outer row (pos_stride = rows, and a gap between the lists). Two
     * rotary calls per case, different tables. */
    static nn_case nns[] = {
        {.rotary = 0, .dtype = DT_F32, .rows = 1, .n = 1, .weighted = 1},
        {.rotary = 0, .dtype = DT_F32, .rows = 37, .n = 4097, .weighted = 1},
        {.rotary = 0, .dtype = DT_F32, .rows = 9000, .n = 20, .weighted = 0},
        {.rotary = 0, .dtype = DT_BF16, .rows = 64, .n = 768, .weighted = 1},
        {.rotary = 0, .dtype = DT_F16, .rows = 64, .n = 100, .weighted = 1},
        {.rotary = 1, .dtype = DT_F32, .outer = 2, .rows = 48, .inner = 3, .n = 64, .style = DT_ROTARY_HALF, .base = 10000.0},
        {.rotary = 1, .dtype = DT_F32, .outer = 3, .rows = 5, .inner = 40, .n = 128, .style = DT_ROTARY_INTERLEAVED, .base = 500.0},
        {.rotary = 1, .dtype = DT_F32, .outer = 1, .rows = 7, .inner = 1, .n = 2, .style = DT_ROTARY_HALF, .base = 10000.0},
        {.rotary = 1, .dtype = DT_BF16, .outer = 2, .rows = 24, .inner = 4, .n = 32, .style = DT_ROTARY_INTERLEAVED, .base = 10000.0},
        {.rotary = 1, .dtype = DT_F16, .outer = 2, .rows = 24, .inner = 4, .n = 32, .style = DT_ROTARY_HALF, .base = 10000.0},
        {.rotary = 1, .dtype = DT_F32, .outer = 3, .rows = 48, .inner = 3, .n = 64, .style = DT_ROTARY_HALF, .base = 10000.0, .pos_stride = 48},
        {.rotary = 1, .dtype = DT_F32, .outer = 4, .rows = 5, .inner = 40, .n = 16, .style = DT_ROTARY_INTERLEAVED, .base = 500.0, .pos_stride = 9},
        {.rotary = 1, .dtype = DT_BF16, .outer = 2, .rows = 24, .inner = 4, .n = 32, .style = DT_ROTARY_HALF, .base = 10000.0, .pos_stride = 24},
    };
    for (size_t i = 0; i < sizeof nns / sizeof nns[0]; i++) {
        nn_case *c = &nns[i];
        const char *vs = c->dtype != DT_F32 ? "one output ulp vs cpu"
                         : c->rotary ? "2e-7 + 2e-7|ref| vs cpu" : "1e-6 + 1e-6|ref| vs cpu";
        if (c->rotary)
            add(&tb, test_nn, c, "rotary/%s,x=[%lld,%lld,%lld,%lld],%s,base=%g,pos_stride=%lld: %s",
                dt_dtype_name(c->dtype), (long long)c->outer, (long long)c->rows,
                (long long)c->inner, (long long)c->n, dt_rotary_style_name(c->style), c->base,
                (long long)c->pos_stride, vs);
        else
            add(&tb, test_nn, c, "rmsnorm/%s,x=[%lld,%lld],%s: %s", dt_dtype_name(c->dtype),
                (long long)c->rows, (long long)c->n, c->weighted ? "weight" : "no weight", vs);
    }

    /* comm kernels: P = 5 ranks put two on one GPU of up to 4 (rank r on
     * GPU r mod the GPUs), where the copy kernel moves their data */
    static coll_case colls[] = {
        {.transport = DT_TRANSPORT_LOCAL, .p = 1, .checks = 0}, {.transport = DT_TRANSPORT_LOCAL, .p = 2, .checks = 0},
        {.transport = DT_TRANSPORT_LOCAL, .p = 3, .checks = 0}, {.transport = DT_TRANSPORT_LOCAL, .p = 4, .checks = 0},
        {.transport = DT_TRANSPORT_LOCAL, .p = 3, .checks = 1}, {.transport = DT_TRANSPORT_LOCAL, .p = 5, .comm_ctas = 3},
        {.transport = DT_TRANSPORT_NCCL, .p = 1, .checks = 0},
        {.transport = DT_TRANSPORT_NCCL, .p = 1, .checks = 1},  {.transport = DT_TRANSPORT_NCCL, .p = 0, .checks = 0},
    };
    for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
        coll_case *c = &colls[i];
        char p[32];
        if (c->p) snprintf(p, sizeof p, "%d", c->p);
        else snprintf(p, sizeof p, "all GPUs");
        char ctas[32] = "";
        if (c->comm_ctas) snprintf(ctas, sizeof ctas, ",comm kernels of %d CTAs", c->comm_ctas);
        add(&tb, test_collectives, c, "collectives/cuda+%s,P=%s%s%s",
            c->transport == DT_TRANSPORT_NCCL ? "nccl" : "local", p, c->checks ? ",DT_CHECK" : "", ctas);
    }
    add(&tb, test_long_copies, NULL,
        "collectives/cuda+local: long messages by the driver's copies and by a copy kernel of 2 CTAs");
    static default_ctas_case default_ctas[] = {{.p = 2}, {.p = 3}, {.p = 5}, {.p = 8}};
    for (size_t i = 0; i < sizeof default_ctas / sizeof default_ctas[0]; i++)
        add(&tb, test_default_comm_ctas, &default_ctas[i],
            "collectives/cuda+local,P=%d: the communication stream's default CTAs", default_ctas[i].p);

    static ring_case rings[] = {
        {.transport = DT_TRANSPORT_LOCAL, .p = 1, .dir = DT_RING_FORWARD}, {.transport = DT_TRANSPORT_LOCAL, .p = 2, .dir = DT_RING_FORWARD},
        {.transport = DT_TRANSPORT_LOCAL, .p = 3, .dir = DT_RING_FORWARD}, {.transport = DT_TRANSPORT_LOCAL, .p = 4, .dir = DT_RING_FORWARD},
        {.transport = DT_TRANSPORT_LOCAL, .p = 3, .dir = DT_RING_BACKWARD}, {.transport = DT_TRANSPORT_NCCL, .p = 1, .dir = DT_RING_FORWARD},
        {.transport = DT_TRANSPORT_NCCL, .p = 0, .dir = DT_RING_FORWARD},  {.transport = DT_TRANSPORT_NCCL, .p = 0, .dir = DT_RING_BACKWARD},
    };
    for (size_t i = 0; i < sizeof rings / sizeof rings[0]; i++) {
        ring_case *c = &rings[i];
        char p[32];
        if (c->p) snprintf(p, sizeof p, "%d", c->p);
        else snprintf(p, sizeof p, "all GPUs");
        add(&tb, test_ring, c, "ring/cuda+%s,%s,P=%s",
            c->transport == DT_TRANSPORT_NCCL ? "nccl" : "local", dt_ring_direction_name(c->dir), p);
    }

    add(&tb, test_never_calls, NULL, "faults/cuda+nccl,P=all GPUs,last rank never calls: all return, timeout 1 s");
    add(&tb, test_peer_aborts, NULL, "faults/cuda+nccl,P=all GPUs,last rank aborts: the others stopped, naming it");

    int failed = h_run_cases("cuda", tb.tests, tb.n);
    free(tb.tests);
    free(tb.names);
    return failed;
}
