/* dtensor/backend_cuda.cu — the CUDA compute backend: device memory, cuBLAS,
 * CUDA C kernels; and the device-memory hooks (dt_mem) the transports use.
 *
 * Every call is enqueued on the rank's compute stream in call order, so the
 * stream order is the program order and most calls never wait. The host
 * waits only where it needs the data or must know the device is done with a
 * buffer: upload/download (the host buffer), sync, and the transport hooks
 * (peers read this rank's buffers from other threads). Each wait polls
 * cudaStreamQuery under the rank's timeout; a wait that runs out, or a
 * sticky device error, marks the backend failed, after which waits fail at
 * once and frees leak instead of blocking.
 *
 * Device memory: a caching allocator, as PyTorch's. free keeps the block
 * for reuse instead of calling cudaFree (which synchronises the whole
 * device): the communication stream's queued work is ordered before the
 * compute stream's next work (event free_ev), so every later use of the
 * block, on either stream, comes after every earlier one, and an alloc may
 * hand it out again at once. Blocks are not split: sizes are rounded (512 B,
 * 2 MiB from 1 MiB up) and a cached block serves a request of at least half
 * its size. The cache is emptied (after draining the streams) when cudaMalloc
 * runs out of memory, then the allocation is tried again, and at destroy.
 * It is per rank; ranks of one launch sharing a device (a pool,
 * dt_cuda_pool) reclaim each other's when that is not enough: the
 * reclaiming rank takes another's cached blocks under that cache's lock,
 * waits (bounded) for an event recorded on each of that rank's streams,
 * which follows every use of them queued before they were freed, and frees
 * them.
 *
 * copy_runs (every pack, unpack, slice and permutation): the host offset
 * tables go through a pinned staging buffer into a device scratch that only
 * grows (an event guards the staging buffer's reuse). COPY moves the widest
 * unit (16, 8, 4, 2 or 1 bytes) that divides every address, stride, offset
 * and run length; long runs get one thread block each, short runs one
 * thread per unit. ADD computes in fp32 and rounds once, like the CPU
 * backend, so fp32 and bf16 results are bit-identical to it.
 *
 * gemm: row-major C = A B is column-major C^T = B^T A^T, one cublasGemmEx.
 * fp32 uses CUBLAS_COMPUTE_32F (no TF32) unless TF32 is on; bf16 and fp16
 * accumulate in fp32.
 *
 * Test: tests/test_cuda.c (make test; skipped without a GPU).
 */
#include "backend_cuda.h"
#include "../base/backoff.h"
#include "../base/cuda_launch.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <inttypes.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Under AddressSanitizer on the CPU emulator of CUDA (tests/emu), where
 * device memory is host memory and kernels run as host code: the bytes of
 * a fresh block past the request are poisoned (alloc_of), so that a
 * kernel's access past a tensor shows as it would past a cudaMalloc of its
 * exact size, instead of landing in the allocator's rounding; a block taken
 * from the cache is unpoisoned whole (no finer: its last owner's queued
 * work may still run on it, later in the emulated streams' order). Nothing
 * on a GPU. */
#if defined(DT_CUDA_EMULATE) && defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define DT_DEVICE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DT_DEVICE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DT_DEVICE_POISON(p, n) ((void)(p), (void)(n))
#define DT_DEVICE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The ranks whose caches reclaim each other (backend_cuda.h; pool_reclaim). */
struct dt_cuda_pool {
    pthread_mutex_t lock;   /* members, and a reclaim from start to end */
    dt_backend **members;
    int n, cap;
};

namespace {

/* Device blocks of the caching allocator (see the top). */
struct dev_block {
    void *p;
    size_t bytes;
};
struct dev_blocks {
    dev_block *v;
    size_t n, cap;
};

/* 0 when the host is out of memory. */
int blocks_push(dev_blocks *s, void *p, size_t bytes) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        dev_block *v = static_cast<dev_block *>(realloc(s->v, cap * sizeof *v));
        if (!v) return 0;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = dev_block{p, bytes};
    return 1;
}

/* Removes and returns entry i (order is not kept). */
dev_block blocks_take(dev_blocks *s, size_t i) {
    dev_block blk = s->v[i];
    s->v[i] = s->v[--s->n];
    return blk;
}

struct cuda_impl {
    int device;
    long timeout_ms;
    int tf32;
    int sms;                    /* multiprocessors, for grid sizes */
    int comm_ctas;              /* dt_backend_cuda_set_comm_ctas: 0, the driver's copy, wide kernels */
    int cc;                     /* compute capability, major * 10 + minor */
    int64_t l2_bytes;           /* L2 cache size, for the attention kernels' launch order */
    int failed;                 /* a wait ran out or the device failed: never wait again */
    char failure[512];
    cudaStream_t compute, comm;
    cublasHandle_t blas;
    /* copy_runs offset tables: pinned host staging -> device scratch */
    void *tab_host;
    size_t tab_host_bytes;
    void *tab_dev;
    size_t tab_dev_bytes;
    cudaEvent_t tab_ev;         /* recorded after the last upload from tab_host */
    int tab_ev_pending;
    /* transport staging: reduce inputs from elsewhere, bf16 rounding, overlapping copies */
    void *stage;
    size_t stage_bytes;
    /* the caching allocator: blocks handed out, and blocks kept for reuse;
     * cached and cached_bytes under cache_lock (a rank of the pool that
     * reclaims them takes them from another thread) */
    dev_blocks live, cached;
    size_t cached_bytes;
    pthread_mutex_t cache_lock;
    dt_cuda_pool *pool;         /* NULL, or the pool this backend joined */
    cudaEvent_t reclaim_ev;     /* recorded on another rank's stream by pool_reclaim */
    cudaEvent_t free_ev;        /* orders the comm stream before a freed block's reuse */
    cudaEvent_t mark_ev;        /* transport mark: the point a p2p start has reached (mem_mark) */
    cudaEvent_t join_ev;        /* the compute stream's point the comm stream waits for next */
    /* profiling marks: events on the compute stream (backend.h mark ops) */
    cudaEvent_t *marks;
    int n_marks;
    /* NCCL: the world was aborted (see dt_backend_cuda_set_abort_poll); may be NULL */
    int (*abort_poll)(void *arg);
    void *abort_arg;
};

inline cuda_impl *impl_of(const dt_backend *b) { return static_cast<cuda_impl *>(b->impl); }

/* ------------------------------------------------------------------ errors */

int is_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
        return 1;
    default:
        return 0;
    }
}

void mark_failed(cuda_impl *im) {
    if (im->failed) return;
    im->failed = 1;
    snprintf(im->failure, sizeof im->failure, "%s", dt_last_error());
}

/* "rank R: cuda OP: CALL failed on device D: <CUDA's message> (<name>)".
 * `call` may be a whole expression; only the function name is kept. */
dt_status cuda_error(const dt_backend *b, const char *op, const char *call, cudaError_t e) {
    cuda_impl *im = impl_of(b);
    (void)cudaGetLastError(); /* clear a non-sticky error so later launch checks are clean */
    dt_status st = e == cudaErrorMemoryAllocation ? DT_ERR_OUT_OF_MEMORY : DT_ERR_BACKEND;
    dt_error(st, "rank %d: cuda %s: %.*s failed on device %d: %s (%s)", b->rank, op,
             (int)strcspn(call, "("), call, im ? im->device : -1, cudaGetErrorString(e),
             cudaGetErrorName(e));
    if (im && is_sticky(e)) mark_failed(im);
    return st;
}

dt_status cublas_error(const dt_backend *b, const char *op, const char *call, cublasStatus_t s) {
    return dt_error(s == CUBLAS_STATUS_ALLOC_FAILED ? DT_ERR_OUT_OF_MEMORY : DT_ERR_BACKEND,
                    "rank %d: cuda %s: %.*s failed on device %d: %s (%s)", b->rank, op,
                    (int)strcspn(call, "("), call, impl_of(b)->device, cublasGetStatusString(s),
                    cublasGetStatusName(s));
}

#define CU_TRY(b, op, call)                                                   \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) return cuda_error((b), (op), #call, e_);       \
    } while (0)

/* After every kernel launch. */
#define CU_LAUNCHED(b, op, kernel)                                            \
    do {                                                                      \
        cudaError_t e_ = cudaGetLastError();                                  \
        if (e_ != cudaSuccess) return cuda_error((b), (op), kernel, e_);      \
    } while (0)

#define BLAS_TRY(b, op, call)                                                 \
    do {                                                                      \
        cublasStatus_t s_ = (call);                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) return cublas_error((b), (op), #call, s_); \
    } while (0)

/* ------------------------------------------------------------------- waits */

long elapsed_ms(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)(t.tv_sec - t0->tv_sec) * 1000L + (t.tv_nsec - t0->tv_nsec) / 1000000L;
}

/* Polls query() (cudaStreamQuery or cudaEventQuery, named by `call`) until
 * it reports completion; bounded by the timeout. Short waits spin
 * (yielding), long ones sleep 20 us per poll (dt_backoff, with the timer
 * slack that makes that about 20) and also ask the abort poll:
 * work queued behind an NCCL kernel whose peer failed only finishes once
 * the communicator is aborted, so the wait returns DT_ERR_PEER_FAILED then
 * instead of running out the timeout. `what` names the work for messages. */
template <typename Query>
dt_status poll_until(const dt_backend *b, const char *op, const char *call, const char *what,
                     Query query) {
    cuda_impl *im = impl_of(b);
    if (im->failed)
        return dt_error(DT_ERR_BACKEND, "rank %d: cuda %s: device %d failed earlier: %s", b->rank,
                        op, im->device, im->failure);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spin = 0;; spin++) {
        cudaError_t e = query();
        if (e == cudaSuccess) return DT_SUCCESS;
        if (e != cudaErrorNotReady) {
            dt_status st = cuda_error(b, op, call, e);
            mark_failed(im);
            return st;
        }
        if (elapsed_ms(&t0) > im->timeout_ms) {
            dt_status st = dt_error(DT_ERR_TIMEOUT,
                                    "rank %d: cuda %s: %s on device %d did not finish within "
                                    "%ld ms (DT_TIMEOUT_MS)", b->rank, op, what, im->device,
                                    im->timeout_ms);
            mark_failed(im);
            return st;
        }
        /* Not marked failed: once the communicators are aborted the
         * stream drains, and later waits (context teardown) succeed. */
        if (spin >= 200 && im->abort_poll && spin % 16 == 0 && im->abort_poll(im->abort_arg))
            return dt_error(DT_ERR_PEER_FAILED,
                            "rank %d: cuda %s: stopped waiting for %s on device %d: the "
                            "world was aborted (a rank failed)", b->rank, op, what, im->device);
        dt_backoff(spin, 200, 20);
    }
}

/* Polls until the stream is idle; bounded by the timeout. */
dt_status wait_stream(const dt_backend *b, cudaStream_t s, const char *op) {
    return poll_until(b, op, "cudaStreamQuery", "work queued",
                      [s] { return cudaStreamQuery(s); });
}

dt_status wait_all(const dt_backend *b, const char *op) {
    DT_TRY(wait_stream(b, impl_of(b)->compute, op));
    return wait_stream(b, impl_of(b)->comm, op);
}

/* The caching allocator (below). */
dt_status cache_flush(dt_backend *b, const char *op);
void pool_leave(dt_backend *b);
void cuda_free(dt_backend *b, void *p);

/* Makes the backend's device current for the calling thread. */
dt_status enter(const dt_backend *b, const char *op) {
    int cur = -1;
    CU_TRY(b, op, cudaGetDevice(&cur));
    if (cur != impl_of(b)->device) CU_TRY(b, op, cudaSetDevice(impl_of(b)->device));
    return DT_SUCCESS;
}

/* Device of a pointer, or -1 for host memory (pageable or pinned). */
int device_of(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

/* Grows a device scratch to `need` bytes (contents not kept). The old one
 * may still be read by queued work: drain first. */
dt_status grow_device(const dt_backend *b, void **p, size_t *bytes, size_t need, const char *op) {
    if (need <= *bytes) return DT_SUCCESS;
    if (*p) {
        DT_TRY(wait_all(b, op));
        CU_TRY(b, op, cudaFree(*p));
        *p = NULL;
        *bytes = 0;
    }
    size_t want = need < 4096 ? 4096 : need;
    CU_TRY(b, op, cudaMalloc(p, want));
    *bytes = want;
    return DT_SUCCESS;
}

/* ------------------------------------------------------------ conversions */

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

/* --------------------------------------------------------------- copy_runs */

struct runs_args {
    char *dst;
    const char *src;
    int64_t outer, n;
    int64_t run_units;          /* units of T per run */
    int64_t run_bytes;
    int64_t dst_outer, src_outer; /* bytes */
    const int64_t *doff, *soff; /* element offsets, or NULL: i * run */
    int es_shift;               /* log2 element size */
};

enum { RUNS_COPY = 0, RUNS_ADD = 1 };

template <typename T, int OP>
__device__ __forceinline__ void runs_apply(T *d, const T *s) {
    if constexpr (OP == RUNS_COPY) *d = *s;
    else *d = from_f<T>(to_f(*d) + to_f(*s));
}

template <typename T>
__device__ __forceinline__ void runs_bases(const runs_args &a, int64_t r, T **d, const T **s) {
    int64_t o = r / a.n, i = r - o * a.n;
    *d = reinterpret_cast<T *>(a.dst + o * a.dst_outer +
                               (a.doff ? (a.doff[i] << a.es_shift) : i * a.run_bytes));
    *s = reinterpret_cast<const T *>(a.src + o * a.src_outer +
                                     (a.soff ? (a.soff[i] << a.es_shift) : i * a.run_bytes));
}

/* One block per run: long runs, coalesced. */
template <typename T, int OP>
__global__ void runs_block_kernel(runs_args a) {
    int64_t runs = a.outer * a.n;
    for (int64_t r = blockIdx.x; r < runs; r += gridDim.x) {
        T *d;
        const T *s;
        runs_bases(a, r, &d, &s);
        for (int64_t t = threadIdx.x; t < a.run_units; t += blockDim.x) runs_apply<T, OP>(d + t, s + t);
    }
}

/* One thread per unit: short runs (single elements of a permutation). */
template <typename T, int OP>
__global__ void runs_flat_kernel(runs_args a) {
    int64_t total = a.outer * a.n * a.run_units;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        int64_t r = idx / a.run_units, t = idx - r * a.run_units;
        T *d;
        const T *s;
        runs_bases(a, r, &d, &s);
        runs_apply<T, OP>(d + t, s + t);
    }
}

template <typename T, int OP>
dt_status runs_launch(const dt_backend *b, runs_args a) {
    cuda_impl *im = impl_of(b);
    const int threads = 256;
    int64_t cap = (int64_t)im->sms * 32;
    if (a.run_units >= 128) {
        int64_t runs = a.outer * a.n;
        unsigned grid = (unsigned)(runs < cap ? runs : cap);
        dt_cuda_launch(runs_block_kernel<T, OP>, grid, threads, 0, im->compute, a);
        CU_LAUNCHED(b, "copy_runs", "runs_block_kernel");
    } else {
        int64_t total = a.outer * a.n * a.run_units;
        int64_t blocks = (total + threads - 1) / threads;
        unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
        dt_cuda_launch(runs_flat_kernel<T, OP>, grid, threads, 0, im->compute, a);
        CU_LAUNCHED(b, "copy_runs", "runs_flat_kernel");
    }
    return DT_SUCCESS;
}

/* ------------------------------------------------------------ elementwise */

template <typename T>
__global__ void add_kernel(const T *x, const T *y, T *out, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_f<T>(to_f(x[i]) + to_f(y[i]));
}

/* out = x + y from fp32 (y NULL: x), rounded to T (add_beside). */
template <typename T>
__global__ void add_round_kernel(const float *x, const float *y, T *out, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_f<T>(y ? x[i] + y[i] : x[i]);
}

/* The communication stream's kernels in a few CTAs
 * (dt_backend_cuda_set_comm_ctas; add_round_comm_kernel below and the
 * transport's copy_kernel): COMM_THREADS threads, each with COMM_UNROLL
 * 16-byte loads in flight (of its one input, or half as many of each of
 * two; a block's width apart, all before the stores): 128 KiB a CTA, for
 * one CTA to move more than an SM's share of the memory's bandwidth (4
 * TB/s / 132 SMs = 30 GB/s; the copy measured 28 to 37 GB/s a CTA on an
 * H200, 2026-11-29, not Little's law's 130 at a microsecond's latency).
 * The default count is DT_CUDA_COMM_CTAS shared by the ranks on a GPU
 * (backend_cuda.h). Cache-streaming loads and stores (evicted first): the
 * work passes through L2 without pushing out the tiles the kernel beside
 * it reuses. */
constexpr int COMM_THREADS = 1024, COMM_UNROLL = 8;

/* Four values rounded to T into p (16 bytes of fp32, 8 of bf16 or fp16,
 * as aligned), evicted first. */
template <typename T>
__device__ __forceinline__ void store4(T *p, float4 v) {
    if constexpr (sizeof(T) == 4) {
        __stcs(reinterpret_cast<float4 *>(p), v);
    } else {
        const T q[4] = {from_f<T>(v.x), from_f<T>(v.y), from_f<T>(v.z), from_f<T>(v.w)};
        uint2 u;
        memcpy(&u, q, sizeof u);
        __stcs(reinterpret_cast<uint2 *>(p), u);
    }
}

/* add_round_kernel in gridDim.x CTAs of COMM_THREADS: n4 groups of four
 * (x, y 16-byte aligned, out 4 sizeof(T)), the same sums and rounding;
 * half the copy's groups a round, as it loads two inputs. */
constexpr int ADD_UNROLL = COMM_UNROLL / 2;
constexpr int64_t ADD_ROUND = (int64_t)COMM_THREADS * ADD_UNROLL;
template <typename T>
__global__ void __launch_bounds__(COMM_THREADS)
    add_round_comm_kernel(const float4 *x, const float4 *y, T *out, int64_t n4) {
    for (int64_t base = blockIdx.x * ADD_ROUND + threadIdx.x; base < n4; base += gridDim.x * ADD_ROUND) {
        float4 a[ADD_UNROLL], b[ADD_UNROLL];
#pragma unroll
        for (int u = 0; u < ADD_UNROLL; u++) {
            const int64_t i = base + u * COMM_THREADS;
            if (i < n4) {
                a[u] = __ldcs(x + i);
                b[u] = y ? __ldcs(y + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
#pragma unroll
        for (int u = 0; u < ADD_UNROLL; u++) {
            const int64_t i = base + u * COMM_THREADS;
            if (i < n4)
                store4<T>(out + 4 * i, y ? make_float4(a[u].x + b[u].x, a[u].y + b[u].y,
                                                       a[u].z + b[u].z, a[u].w + b[u].w)
                                         : a[u]);
        }
    }
}

__device__ __forceinline__ float gelu_f32(float x, int tanh_form) {
    const float inv_sqrt2 = 0.70710678118654752440f;
    const float sqrt_2_over_pi = 0.79788456080286535588f;
    if (!tanh_form) return 0.5f * x * (1.0f + erff(x * inv_sqrt2));
    float u = sqrt_2_over_pi * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

template <typename T>
__global__ void gelu_kernel(const T *x, T *out, int64_t n, int tanh_form) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_f<T>(gelu_f32(to_f(x[i]), tanh_form));
}

/* ------------------------------------------------------------------- busy */

/* One thread keeping its stream busy for ns nanoseconds of the GPU's
 * timer (dt_backend_cuda_busy). */
__global__ void busy_kernel(uint64_t ns) {
#ifdef DT_CUDA_EMULATE
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
#else
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
#endif
}

/* ---------------------------------------------------------- rmsnorm, rotary */

/* RMSNorm, one block per row (grid-stride over rows): each thread sums the
 * squares of its strided elements in double (the op is memory bound, and
 * fp32 squares of values below 1e-19 vanish), the warps reduce by shuffles
 * and meet in shared memory, warp 0 reduces the warp sums; 1/sqrt(mean +
 * eps) is formed in double and applied as on the CPU (scaled by a power of
 * two where it leaves float's normal range). blockDim.x is a multiple of
 * 32, <= 1024. */
template <typename T>
__global__ void rmsnorm_kernel(const T *x, const T *w, T *out, int64_t rows, int64_t n, float eps) {
    __shared__ double warp_sum[32];
    __shared__ float row_inv, row_up;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * n;
        T *orow = out + r * n;
        double ss = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const double v = to_f(xr[i]);
            ss = fma(v, v, ss);
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) warp_sum[warp] = ss;
        __syncthreads();
        if (warp == 0) {
            ss = lane < warps ? warp_sum[lane] : 0.0;
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) {
                const double invd = 1.0 / sqrt(ss / (double)n + (double)eps);
                row_up = invd > FLT_MAX ? 0x1p64f : invd < FLT_MIN ? 0x1p-64f : 1.0f;
                row_inv = (float)(invd / row_up);
            }
        }
        __syncthreads();
        const float inv = row_inv, up = row_up;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = __fmul_rn(__fmul_rn(to_f(xr[i]), up), inv);
            if (w) v = __fmul_rn(v, to_f(w[i]));
            orow[i] = from_f<T>(v);
        }
        __syncthreads(); /* warp_sum and row_inv are reused by the next row */
    }
}

/* Rotary: one thread per (local row s, pair i), grid-stride over the
 * rows * d/2 pairs in x; blockIdx.y strides over the outer * inner
 * d-vectors that share the row, so cos/sin (double, from the staged
 * positions and angles) are computed once per thread and reused. The
 * products are rounded separately (__fmul_rn: no contraction into an FMA),
 * as on the CPU. */
template <typename T>
__global__ void rotary_kernel(const T *x, T *out, const int64_t *pos, const double *theta,
                              int64_t outer, int64_t rows, int64_t inner, int64_t d,
                              int interleaved) {
    const int64_t half = d / 2, pairs = rows * half, vecs = outer * inner;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += stride) {
        const int64_t s = p / half, i = p - s * half;
        double sd, cd;
        sincos((double)pos[s] * theta[i], &sd, &cd);
        const float c = (float)cd, sn = (float)sd;
        const int64_t oa = interleaved ? 2 * i : i, ob = interleaved ? 2 * i + 1 : i + half;
        for (int64_t v = blockIdx.y; v < vecs; v += gridDim.y) {
            const int64_t o = v / inner, h = v - o * inner;
            const int64_t row = ((o * rows + s) * inner + h) * d;
            const float va = to_f(x[row + oa]), vb = to_f(x[row + ob]);
            out[row + oa] = from_f<T>(__fsub_rn(__fmul_rn(va, c), __fmul_rn(vb, sn)));
            out[row + ob] = from_f<T>(__fadd_rn(__fmul_rn(va, sn), __fmul_rn(vb, c)));
        }
    }
}

/* Transport reductions: acc := x (first) or acc op x, in fp32, like the
 * host hooks (sum in rank order; max lets NaN win). */
template <typename T>
__global__ void reduce_kernel(float *acc, const T *x, int64_t n, int is_max, int first) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = to_f(x[i]);
        if (first) acc[i] = v;
        else if (!is_max) acc[i] += v;
        else if (v > acc[i] || isnan(v)) acc[i] = v;
    }
}

template <typename T>
__global__ void f32_to_kernel(const float *in, T *out, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_f<T>(in[i]);
}

unsigned grid_for(const cuda_impl *im, int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    int64_t cap = (int64_t)im->sms * 32;
    return (unsigned)(blocks < cap ? blocks : (cap > 0 ? cap : 1));
}

/* CTAs of a communication-stream kernel (comm_ctas > 0) over n units,
 * `round` a CTA's round: as many as the rounds need, at most comm_ctas. */
unsigned comm_grid(const cuda_impl *im, int64_t n, int64_t round) {
    const int64_t need = (n + round - 1) / round;
    return (unsigned)(need < im->comm_ctas ? need : im->comm_ctas);
}

/* --------------------------------------------------------------- the table */

void cuda_destroy(dt_backend *b) {
    if (!b) return;
    cuda_impl *im = impl_of(b);
    if (im) {
        pool_leave(b);   /* no other rank reclaims its cache from now on */
        char saved[1024];
        dt_error_save_(saved, sizeof saved);
        int idle = !im->failed && enter(b, "destroy") == DT_SUCCESS &&
                   (!im->compute || wait_stream(b, im->compute, "destroy") == DT_SUCCESS) &&
                   (!im->comm || wait_stream(b, im->comm, "destroy") == DT_SUCCESS);
        /* A device that hung or failed is left as it is: these calls could block. */
        if (idle) {
            (void)cache_flush(b, "destroy");
            if (im->free_ev) (void)cudaEventDestroy(im->free_ev);
            if (im->mark_ev) (void)cudaEventDestroy(im->mark_ev);
            if (im->join_ev) (void)cudaEventDestroy(im->join_ev);
            if (im->reclaim_ev) (void)cudaEventDestroy(im->reclaim_ev);
            if (im->tab_dev) (void)cudaFree(im->tab_dev);
            if (im->stage) (void)cudaFree(im->stage);
            if (im->tab_host) (void)cudaFreeHost(im->tab_host);
            if (im->tab_ev) (void)cudaEventDestroy(im->tab_ev);
            for (int i = 0; i < im->n_marks; i++) (void)cudaEventDestroy(im->marks[i]);
            if (im->blas) (void)cublasDestroy(im->blas);
            if (im->compute) (void)cudaStreamDestroy(im->compute);
            if (im->comm) (void)cudaStreamDestroy(im->comm);
        }
        (void)cudaGetLastError();
        dt_error_restore_(saved);
        free(im->marks);
        free(im->live.v);
        free(im->cached.v);
        pthread_mutex_destroy(&im->cache_lock);
        free(im);
    }
    free(b);
}

/* Every block of im's cache, taken off it (under its lock). */
dev_blocks cache_take_all(cuda_impl *im) {
    pthread_mutex_lock(&im->cache_lock);
    const dev_blocks all = im->cached;
    im->cached = dev_blocks{};
    im->cached_bytes = 0;
    pthread_mutex_unlock(&im->cache_lock);
    return all;
}

/* Puts a block into im's cache; 0 if there is no host memory for it. */
int cache_put(cuda_impl *im, void *p, size_t bytes) {
    pthread_mutex_lock(&im->cache_lock);
    const int ok = blocks_push(&im->cached, p, bytes);
    if (ok) im->cached_bytes += bytes;
    pthread_mutex_unlock(&im->cache_lock);
    return ok;
}

/* cudaFree of every block of `blocks`, which it then releases. */
void free_blocks(dev_blocks *blocks) {
    for (size_t i = 0; i < blocks->n; i++)
        if (cudaFree(blocks->v[i].p) != cudaSuccess) (void)cudaGetLastError();
    free(blocks->v);
    *blocks = dev_blocks{};
}

/* Frees every cached block, after draining the rank's streams (queued work
 * may still use them). */
dt_status cache_flush(dt_backend *b, const char *op) {
    cuda_impl *im = impl_of(b);
    pthread_mutex_lock(&im->cache_lock);
    const size_t n = im->cached.n;
    pthread_mutex_unlock(&im->cache_lock);
    if (n == 0) return DT_SUCCESS;
    DT_TRY(wait_all(b, op));
    dev_blocks all = cache_take_all(im);
    free_blocks(&all);
    return DT_SUCCESS;
}

/* The smallest cached block of want to 2 * want bytes, taken off the cache;
 * NULL if there is none. */
void *cache_take(cuda_impl *im, size_t want, size_t *bytes) {
    pthread_mutex_lock(&im->cache_lock);
    size_t best = im->cached.n;
    for (size_t i = 0; i < im->cached.n; i++) {
        size_t have = im->cached.v[i].bytes;
        int fits = have >= want && have / 2 <= want;
        if (fits && (best == im->cached.n || have < im->cached.v[best].bytes)) best = i;
    }
    void *p = NULL;
    if (best < im->cached.n) {
        dev_block blk = blocks_take(&im->cached, best);
        im->cached_bytes -= blk.bytes;
        *bytes = blk.bytes;
        p = blk.p;
    }
    pthread_mutex_unlock(&im->cache_lock);
    return p;
}

/* ------------------------------------------------------------- the pool */

/* b joins its pool (im->pool): 0 if there is no host memory for it. */
int pool_join(dt_backend *b) {
    dt_cuda_pool *p = impl_of(b)->pool;
    pthread_mutex_lock(&p->lock);
    int ok = 1;
    if (p->n == p->cap) {
        const int cap = p->cap ? 2 * p->cap : 8;
        dt_backend **m = static_cast<dt_backend **>(realloc(p->members, (size_t)cap * sizeof *m));
        if (m) {
            p->members = m;
            p->cap = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) p->members[p->n++] = b;
    pthread_mutex_unlock(&p->lock);
    return ok;
}

/* b leaves its pool, if it joined: no other rank reclaims its cache after. */
void pool_leave(dt_backend *b) {
    dt_cuda_pool *p = impl_of(b)->pool;
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->n; i++)
        if (p->members[i] == b) {
            p->members[i] = p->members[--p->n];
            break;
        }
    pthread_mutex_unlock(&p->lock);
}

/* Out of memory with its own cache empty: frees the blocks that the other
 * ranks of b's pool on its device keep cached. A rank's blocks are taken
 * off its cache (under its lock: from then on it cannot hand them out),
 * then freed once an event recorded on each of its two streams has
 * completed: every use of a block was queued there before the block was
 * freed into the cache, so before the record. The waits are b's (its
 * timeout; one that runs out fails b, as any wait of b's does, and the
 * rank's blocks go back to its cache). *freed: how many were freed. One
 * reclaim at a time per pool. */
dt_status pool_reclaim(dt_backend *b, const char *op, size_t *freed) {
    cuda_impl *im = impl_of(b);
    *freed = 0;
    dt_cuda_pool *p = im->pool;
    if (!p) return DT_SUCCESS;
    dt_status st = DT_SUCCESS;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->n && st == DT_SUCCESS; i++) {
        const dt_backend *other = p->members[i];
        cuda_impl *om = impl_of(other);
        if (other == b || om->device != im->device) continue;
        dev_blocks took = cache_take_all(om);
        if (took.n == 0) {
            free(took.v);
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "rank %d's work queued before its frees", other->rank);
        for (cudaStream_t s : {om->compute, om->comm}) {
            if (st != DT_SUCCESS) break;
            const cudaError_t e = cudaEventRecord(im->reclaim_ev, s);
            st = e == cudaSuccess
                     ? poll_until(b, op, "cudaEventQuery", what,
                                  [im] { return cudaEventQuery(im->reclaim_ev); })
                     : cuda_error(b, op, "cudaEventRecord", e);
        }
        if (st == DT_SUCCESS) {
            *freed += took.n;
            free_blocks(&took);
        } else {   /* back where they were (leaked where the host has no room) */
            for (size_t j = 0; j < took.n; j++) (void)cache_put(om, took.v[j].p, took.v[j].bytes);
            free(took.v);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* cuda_alloc and cuda_alloc_uninit: zero says whether the memory is zeroed
 * (a memset on the compute stream). */
dt_status alloc_of(dt_backend *b, size_t bytes, void **out, bool zero) {
    if (!out) return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda alloc: out is NULL", b->rank);
    *out = NULL;
    DT_TRY(enter(b, "alloc"));
    cuda_impl *im = impl_of(b);
    size_t unit = bytes < ((size_t)1 << 20) ? 512 : (size_t)2 << 20;
    if (bytes > SIZE_MAX - unit)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda alloc: %zu bytes is too many",
                        b->rank, bytes);
    size_t want = (bytes + unit - 1) / unit * unit;
    if (want == 0) want = unit;
    size_t have = 0;
    void *p = cache_take(im, want, &have);
    if (!p) {
        have = want;
        cudaError_t e = cudaMalloc(&p, want);
        if (e == cudaErrorMemoryAllocation) {   /* this rank's cache, then its pool's */
            (void)cudaGetLastError();
            DT_TRY(cache_flush(b, "alloc"));
            e = cudaMalloc(&p, want);
        }
        size_t reclaimed = 0;
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            DT_TRY(pool_reclaim(b, "alloc", &reclaimed));
            if (reclaimed) e = cudaMalloc(&p, want);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_OUT_OF_MEMORY : DT_ERR_BACKEND,
                            "rank %d: cuda alloc: cudaMalloc of %zu bytes on device %d failed: "
                            "%s (%s)", b->rank, want, im->device, cudaGetErrorString(e),
                            cudaGetErrorName(e));
        }
        DT_DEVICE_POISON(static_cast<char *>(p) + bytes, want - bytes);
    } else {
        DT_DEVICE_UNPOISON(p, have);
    }
    if (!blocks_push(&im->live, p, have)) {
        if (!cache_put(im, p, have)) (void)cudaFree(p); /* not used yet: nothing to wait for */
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda alloc: out of host memory",
                        b->rank);
    }
    if (zero && bytes > 0) {
        cudaError_t e = cudaMemsetAsync(p, 0, bytes, im->compute);
        if (e != cudaSuccess) {
            dt_status st = cuda_error(b, "alloc", "cudaMemsetAsync", e);
            cuda_free(b, p);
            return st;
        }
    }
    *out = p;
    return DT_SUCCESS;
}

dt_status cuda_alloc(dt_backend *b, size_t bytes, void **out) {
    return alloc_of(b, bytes, out, true);
}

dt_status cuda_alloc_uninit(dt_backend *b, size_t bytes, void **out) {
    return alloc_of(b, bytes, out, false);
}

void cuda_free(dt_backend *b, void *p) {
    if (!p) return;
    cuda_impl *im = impl_of(b);
    if (im->failed) return; /* leak: cudaFree could wait forever on a hung device */
    char saved[1024];
    dt_error_save_(saved, sizeof saved);
    size_t i = im->live.n;
    while (i > 0 && im->live.v[i - 1].p != p) i--; /* the newest first: frees tend to be LIFO */
    if (enter(b, "free") == DT_SUCCESS) {
        dev_block blk = i > 0 ? blocks_take(&im->live, i - 1) : dev_block{p, 0};
        int ordered = blk.bytes > 0 && cudaEventRecord(im->free_ev, im->comm) == cudaSuccess &&
                      cudaStreamWaitEvent(im->compute, im->free_ev, 0) == cudaSuccess;
        const int cached = ordered && cache_put(im, blk.p, blk.bytes);
        /* Not from cuda_alloc, or the cache could not take it: freed now. */
        if (!cached && wait_all(b, "free") == DT_SUCCESS && cudaFree(p) != cudaSuccess)
            (void)cudaGetLastError();
    }
    (void)cudaGetLastError();
    dt_error_restore_(saved);
}

dt_status check_buffers(const dt_backend *b, const char *op, const void *x, const void *y,
                        size_t bytes) {
    if (bytes > 0 && (x == NULL || y == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer for %zu bytes",
                        b->rank, op, bytes);
    return DT_SUCCESS;
}

/* Host <-> device, waited for on both sides: before, so a pageable copy can
 * never block behind unbounded queued work; after, so the host buffer is
 * free (upload) or filled (download). */
dt_status host_transfer(dt_backend *b, const char *op, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return DT_SUCCESS;
    DT_TRY(check_buffers(b, op, dst, src, bytes));
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    DT_TRY(wait_stream(b, im->compute, op));
    CU_TRY(b, op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, im->compute));
    return wait_stream(b, im->compute, op);
}

dt_status cuda_upload(dt_backend *b, void *dst, const void *host, size_t bytes) {
    return host_transfer(b, "upload", dst, host, bytes);
}

dt_status cuda_download(dt_backend *b, void *host, const void *src, size_t bytes) {
    return host_transfer(b, "download", host, src, bytes);
}

dt_status cuda_copy(dt_backend *b, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return DT_SUCCESS;
    DT_TRY(check_buffers(b, "copy", dst, src, bytes));
    DT_TRY(enter(b, "copy"));
    cuda_impl *im = impl_of(b);
    const char *d = static_cast<const char *>(dst), *s = static_cast<const char *>(src);
    if (d < s + bytes && s < d + bytes) {
        /* Overlapping (memmove semantics, as on the CPU): through the stage. */
        DT_TRY(grow_device(b, &im->stage, &im->stage_bytes, bytes, "copy"));
        CU_TRY(b, "copy", cudaMemcpyAsync(im->stage, src, bytes, cudaMemcpyDefault, im->compute));
        src = im->stage;
    }
    CU_TRY(b, "copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, im->compute));
    return DT_SUCCESS;
}

dt_status cuda_zero(dt_backend *b, void *p, size_t bytes) {
    if (bytes == 0) return DT_SUCCESS;
    if (!p) return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda zero: NULL buffer", b->rank);
    DT_TRY(enter(b, "zero"));
    CU_TRY(b, "zero", cudaMemsetAsync(p, 0, bytes, impl_of(b)->compute));
    return DT_SUCCESS;
}

/* One host table to stage into device scratch (see stage_tables). */
struct table_part {
    const void *host;   /* NULL or bytes == 0: nothing, *dev = NULL */
    size_t bytes;
    const void **dev;   /* receives the device address */
};

/* Stages host tables (offsets, positions, angles) through the pinned buffer
 * into the device scratch tab_dev that only grows, as one copy on the
 * compute stream; part k lands at *parts[k].dev, each 16-byte aligned. The
 * kernels that read them are enqueued after the copy, and the next staging
 * (enqueued after those kernels) cannot overwrite them early; the pinned
 * buffer may still feed the previous copy, which its event guards. */
dt_status stage_tables(dt_backend *b, const char *op, const table_part *parts, int n) {
    cuda_impl *im = impl_of(b);
    size_t need = 0;
    for (int k = 0; k < n; k++) {
        *parts[k].dev = NULL;
        if (parts[k].host && parts[k].bytes) need += (parts[k].bytes + 15) & ~(size_t)15;
    }
    if (need == 0) return DT_SUCCESS;
    if (im->tab_ev_pending) {
        cudaEvent_t ev = im->tab_ev;
        DT_TRY(poll_until(b, op, "cudaEventQuery", "the previous table upload",
                          [ev] { return cudaEventQuery(ev); }));
        im->tab_ev_pending = 0;
    }
    if (need > im->tab_host_bytes) {
        /* cudaFreeHost synchronises the device: drain the rank's streams
         * first (bounded), as grow_device does before cudaFree, or a stream
         * stuck behind a peer's collective would block the host for good. */
        if (im->tab_host) {
            DT_TRY(wait_all(b, op));
            CU_TRY(b, op, cudaFreeHost(im->tab_host));
        }
        im->tab_host = NULL;
        im->tab_host_bytes = 0;
        size_t want = need < 4096 ? 4096 : need;
        CU_TRY(b, op, cudaHostAlloc(&im->tab_host, want, cudaHostAllocDefault));
        im->tab_host_bytes = want;
    }
    DT_TRY(grow_device(b, &im->tab_dev, &im->tab_dev_bytes, need, op));
    char *h = static_cast<char *>(im->tab_host);
    char *dev = static_cast<char *>(im->tab_dev);
    size_t at = 0;
    for (int k = 0; k < n; k++) {
        if (!parts[k].host || !parts[k].bytes) continue;
        memcpy(h + at, parts[k].host, parts[k].bytes);
        *parts[k].dev = dev + at;
        at += (parts[k].bytes + 15) & ~(size_t)15;
    }
    CU_TRY(b, op, cudaMemcpyAsync(im->tab_dev, im->tab_host, need, cudaMemcpyHostToDevice,
                                  im->compute));
    CU_TRY(b, op, cudaEventRecord(im->tab_ev, im->compute));
    im->tab_ev_pending = 1;
    return DT_SUCCESS;
}

/* Uploads the offset tables (either may be NULL) into the device scratch. */
dt_status upload_tables(dt_backend *b, const dt_runs *r, const int64_t **doff,
                        const int64_t **soff) {
    size_t tab = (size_t)r->n * sizeof(int64_t);
    const void *d = NULL, *s = NULL;
    table_part parts[2] = {{r->dst_off, tab, &d}, {r->src_off, tab, &s}};
    DT_TRY(stage_tables(b, "copy_runs", parts, 2));
    *doff = static_cast<const int64_t *>(d);
    *soff = static_cast<const int64_t *>(s);
    return DT_SUCCESS;
}

int log2_exact(size_t x) {
    int s = 0;
    while ((size_t)1 << s < x) s++;
    return s;
}

dt_status cuda_copy_runs(dt_backend *b, const dt_runs *r) {
    if (r == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda copy_runs: runs is NULL", b->rank);
    size_t es = dt_dtype_size(r->dtype);
    if (es == 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda copy_runs: unknown dtype %d",
                        b->rank, (int)r->dtype);
    if (r->op != DT_RUNS_COPY && r->op != DT_RUNS_ADD)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda copy_runs: unknown op %d", b->rank,
                        (int)r->op);
    if (r->op == DT_RUNS_ADD && r->dtype != DT_F32 && r->dtype != DT_BF16 && r->dtype != DT_F16)
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "rank %d: cuda copy_runs: add is not supported for %s (fp32, bf16, fp16 are)",
                        b->rank, dt_dtype_name(r->dtype));
    if (r->outer < 0 || r->n < 0 || r->run_elems < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda copy_runs: negative extent (outer %" PRId64 ", n %" PRId64
                        ", run %" PRId64 ")", b->rank, r->outer, r->n, r->run_elems);
    if (r->outer == 0 || r->n == 0 || r->run_elems == 0) return DT_SUCCESS;
    if (r->dst == NULL || r->src == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda copy_runs: NULL buffer", b->rank);
    DT_TRY(enter(b, "copy_runs"));

    runs_args a;
    a.dst = static_cast<char *>(r->dst);
    a.src = static_cast<const char *>(r->src);
    a.outer = r->outer;
    a.n = r->n;
    a.run_bytes = r->run_elems * (int64_t)es;
    a.dst_outer = r->dst_outer * (int64_t)es;
    a.src_outer = r->src_outer * (int64_t)es;
    a.es_shift = log2_exact(es);
    DT_TRY(upload_tables(b, r, &a.doff, &a.soff));

    if (r->op == DT_RUNS_ADD) {
        a.run_units = r->run_elems;
        if (r->dtype == DT_F32) return runs_launch<float, RUNS_ADD>(b, a);
        if (r->dtype == DT_BF16) return runs_launch<__nv_bfloat16, RUNS_ADD>(b, a);
        return runs_launch<__half, RUNS_ADD>(b, a);
    }
    /* COPY: the widest unit dividing every byte address, stride and offset. */
    uint64_t bits = (uint64_t)(uintptr_t)r->dst | (uint64_t)(uintptr_t)r->src |
                    (uint64_t)a.run_bytes | (uint64_t)a.dst_outer | (uint64_t)a.src_outer;
    uint64_t offs = 0;
    for (int64_t i = 0; r->dst_off && i < r->n; i++) offs |= (uint64_t)r->dst_off[i];
    for (int64_t i = 0; r->src_off && i < r->n; i++) offs |= (uint64_t)r->src_off[i];
    bits |= offs << a.es_shift;
    int64_t w = 16;
    while (w > 1 && (bits & (uint64_t)(w - 1))) w >>= 1;
    a.run_units = a.run_bytes / w;
    switch (w) {
    case 16: return runs_launch<uint4, RUNS_COPY>(b, a);
    case 8: return runs_launch<uint2, RUNS_COPY>(b, a);
    case 4: return runs_launch<unsigned int, RUNS_COPY>(b, a);
    case 2: return runs_launch<unsigned short, RUNS_COPY>(b, a);
    default: return runs_launch<unsigned char, RUNS_COPY>(b, a);
    }
}

dt_status check_float(const dt_backend *b, const char *op, dt_dtype dtype) {
    if (dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16) return DT_SUCCESS;
    return dt_error(DT_ERR_NOT_SUPPORTED,
                    "rank %d: cuda %s: dtype %s is not supported (fp32, bf16, fp16 are)", b->rank,
                    op, dt_dtype_name(dtype));
}

/* The handle's math mode. cuBLAS may otherwise do the split-K reductions of
 * bf16 / fp16 gemms in the output type; the contract is fp32 accumulation. */
cublasMath_t math_mode(int tf32) {
    return static_cast<cublasMath_t>((tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

dt_status cuda_gemm(dt_backend *b, dt_dtype dtype, int64_t m, int64_t n, int64_t k,
                    const void *a, const void *bm, void *c) {
    DT_TRY(check_float(b, "gemm", dtype));
    if (m < 0 || n < 0 || k < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda gemm: negative size m %" PRId64 " n %" PRId64 " k %" PRId64,
                        b->rank, m, n, k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "rank %d: cuda gemm: m %" PRId64 " n %" PRId64 " k %" PRId64
                        " exceeds cuBLAS's int range", b->rank, m, n, k);
    if (m == 0 || n == 0) return DT_SUCCESS;
    if (a == NULL || bm == NULL || c == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda gemm: NULL buffer", b->rank);
    DT_TRY(enter(b, "gemm"));
    cuda_impl *im = impl_of(b);
    if (k == 0)
        return cuda_zero(b, c, (size_t)m * (size_t)n * dt_dtype_size(dtype));
    cudaDataType_t t = dtype == DT_F32 ? CUDA_R_32F : dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasComputeType_t ct = dtype == DT_F32 && im->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                          : CUBLAS_COMPUTE_32F;
    const float alpha = 1.0f, beta = 0.0f;
    /* Row-major C[m,n] = A[m,k] B[k,n] is column-major C^T[n,m] = B^T[n,k] A^T[k,m]. */
    BLAS_TRY(b, "gemm", cublasGemmEx(im->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                     &alpha, bm, t, (int)n, a, t, (int)k, &beta, c, t, (int)n, ct,
                                     CUBLAS_GEMM_DEFAULT));
    CU_LAUNCHED(b, "gemm", "cublasGemmEx");
    return DT_SUCCESS;
}

/* The arguments of the elementwise ops (y NULL allowed or not). */
dt_status elementwise_args(const dt_backend *b, const char *what, dt_dtype dtype, int64_t n,
                           const void *x, const void *y, int y_optional, const void *out) {
    DT_TRY(check_float(b, what, dtype));
    if (n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: negative count %" PRId64,
                        b->rank, what, n);
    if (n > 0 && (x == NULL || (y == NULL && !y_optional) || out == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, what);
    return DT_SUCCESS;
}

dt_status cuda_add(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, const void *y,
                   void *out) {
    DT_TRY(elementwise_args(b, "add", dtype, n, x, y, 0, out));
    if (n == 0) return DT_SUCCESS;
    DT_TRY(enter(b, "add"));
    cuda_impl *im = impl_of(b);
    unsigned grid = grid_for(im, n, 256);
    if (dtype == DT_F32)
        dt_cuda_launch(add_kernel<float>, grid, 256, 0, im->compute,
                       static_cast<const float *>(x), static_cast<const float *>(y),
                       static_cast<float *>(out), n);
    else if (dtype == DT_BF16)
        dt_cuda_launch(add_kernel<__nv_bfloat16>, grid, 256, 0, im->compute,
                       static_cast<const __nv_bfloat16 *>(x), static_cast<const __nv_bfloat16 *>(y),
                       static_cast<__nv_bfloat16 *>(out), n);
    else
        dt_cuda_launch(add_kernel<__half>, grid, 256, 0, im->compute,
                       static_cast<const __half *>(x), static_cast<const __half *>(y),
                       static_cast<__half *>(out), n);
    CU_LAUNCHED(b, "add", "add_kernel");
    return DT_SUCCESS;
}

/* The communication stream's next work waits, on the device, for the
 * compute stream's work queued so far (add_beside, mem_mark). */
dt_status comm_after_compute(dt_backend *b, const char *what) {
    cuda_impl *im = impl_of(b);
    DT_TRY(enter(b, what));
    CU_TRY(b, what, cudaEventRecord(im->join_ev, im->compute));
    CU_TRY(b, what, cudaStreamWaitEvent(im->comm, im->join_ev, 0));
    return DT_SUCCESS;
}

/* On the communication stream, after the compute stream's queued work: the
 * transports queue their work there too (NCCL) or mark their sends' start
 * there (mem_mark), so later transfers come after it; later compute work
 * does not. */
dt_status cuda_add_beside(dt_backend *b, dt_dtype dtype, int64_t n, const float *x,
                          const float *y, void *out) {
    const char *what = "add beside";
    DT_TRY(elementwise_args(b, what, dtype, n, x, y, 1, out));
    if (n == 0) return DT_SUCCESS;
    DT_TRY(comm_after_compute(b, what));
    cuda_impl *im = impl_of(b);
    /* in a few CTAs (comm_ctas): the groups of four, then the rest by the
     * kernel below; inputs 16-byte aligned, out 4 values' width */
    const size_t es = dt_dtype_size(dtype);
    const int64_t n4 = im->comm_ctas > 0 && ((uintptr_t)x | (uintptr_t)y) % 16 == 0 &&
                               (uintptr_t)out % (4 * es) == 0
                           ? n / 4
                           : 0;
    if (n4 > 0) {
        const unsigned g = comm_grid(im, n4, ADD_ROUND);
        const float4 *x4 = reinterpret_cast<const float4 *>(x), *y4 = reinterpret_cast<const float4 *>(y);
        if (dtype == DT_F32)
            dt_cuda_launch(add_round_comm_kernel<float>, g, COMM_THREADS, 0, im->comm, x4, y4,
                           static_cast<float *>(out), n4);
        else if (dtype == DT_BF16)
            dt_cuda_launch(add_round_comm_kernel<__nv_bfloat16>, g, COMM_THREADS, 0, im->comm, x4,
                           y4, static_cast<__nv_bfloat16 *>(out), n4);
        else
            dt_cuda_launch(add_round_comm_kernel<__half>, g, COMM_THREADS, 0, im->comm, x4, y4,
                           static_cast<__half *>(out), n4);
        CU_LAUNCHED(b, what, "add_round_comm_kernel");
        x += 4 * n4;
        y = y ? y + 4 * n4 : y;
        out = static_cast<char *>(out) + 4 * n4 * es;
        n -= 4 * n4;
        if (n == 0) return DT_SUCCESS;
    }
    unsigned grid = grid_for(im, n, 256);
    if (dtype == DT_F32)
        dt_cuda_launch(add_round_kernel<float>, grid, 256, 0, im->comm, x, y,
                       static_cast<float *>(out), n);
    else if (dtype == DT_BF16)
        dt_cuda_launch(add_round_kernel<__nv_bfloat16>, grid, 256, 0, im->comm, x, y,
                       static_cast<__nv_bfloat16 *>(out), n);
    else
        dt_cuda_launch(add_round_kernel<__half>, grid, 256, 0, im->comm, x, y,
                       static_cast<__half *>(out), n);
    CU_LAUNCHED(b, what, "add_round_kernel");
    return DT_SUCCESS;
}

dt_status cuda_gelu(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, void *out,
                    dt_gelu_approx approx) {
    if ((int)approx < 0 || approx >= DT_GELU_APPROX_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda gelu: unknown approximation %d",
                        b->rank, (int)approx);
    DT_TRY(elementwise_args(b, "gelu", dtype, n, x, NULL, 1, out));
    if (n == 0) return DT_SUCCESS;
    DT_TRY(enter(b, "gelu"));
    cuda_impl *im = impl_of(b);
    unsigned grid = grid_for(im, n, 256);
    int tanh_form = approx == DT_GELU_TANH;
    if (dtype == DT_F32)
        dt_cuda_launch(gelu_kernel<float>, grid, 256, 0, im->compute,
                       static_cast<const float *>(x), static_cast<float *>(out), n, tanh_form);
    else if (dtype == DT_BF16)
        dt_cuda_launch(gelu_kernel<__nv_bfloat16>, grid, 256, 0, im->compute,
                       static_cast<const __nv_bfloat16 *>(x), static_cast<__nv_bfloat16 *>(out), n,
                       tanh_form);
    else
        dt_cuda_launch(gelu_kernel<__half>, grid, 256, 0, im->compute,
                       static_cast<const __half *>(x), static_cast<__half *>(out), n, tanh_form);
    CU_LAUNCHED(b, "gelu", "gelu_kernel");
    return DT_SUCCESS;
}

dt_status cuda_rmsnorm(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                       const void *w, float eps, void *out) {
    DT_TRY(check_float(b, "rmsnorm", dtype));
    if (rows < 0 || n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda rmsnorm: negative size rows %" PRId64 " n %" PRId64,
                        b->rank, rows, n);
    if (!isfinite(eps) || eps < 0.0f)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda rmsnorm: eps %g must be finite and >= 0", b->rank,
                        (double)eps);
    if (rows == 0 || n == 0) return DT_SUCCESS;
    if (x == NULL || out == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda rmsnorm: NULL buffer", b->rank);
    DT_TRY(enter(b, "rmsnorm"));
    cuda_impl *im = impl_of(b);
    /* Enough warps that each thread sums a handful of elements, at most 512. */
    int threads = n >= 512 ? 512 : (int)((n + 31) / 32) * 32;
    int64_t cap = (int64_t)im->sms * 32;
    unsigned grid = (unsigned)(rows < cap ? rows : (cap > 0 ? cap : 1));
    if (dtype == DT_F32)
        dt_cuda_launch(rmsnorm_kernel<float>, grid, threads, 0, im->compute,
                       static_cast<const float *>(x), static_cast<const float *>(w),
                       static_cast<float *>(out), rows, n, eps);
    else if (dtype == DT_BF16)
        dt_cuda_launch(rmsnorm_kernel<__nv_bfloat16>, grid, threads, 0, im->compute,
                       static_cast<const __nv_bfloat16 *>(x), static_cast<const __nv_bfloat16 *>(w),
                       static_cast<__nv_bfloat16 *>(out), rows, n, eps);
    else
        dt_cuda_launch(rmsnorm_kernel<__half>, grid, threads, 0, im->compute,
                       static_cast<const __half *>(x), static_cast<const __half *>(w),
                       static_cast<__half *>(out), rows, n, eps);
    CU_LAUNCHED(b, "rmsnorm", "rmsnorm_kernel");
    return DT_SUCCESS;
}

dt_status cuda_rotary(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows, int64_t inner,
                      int64_t d, const int64_t *positions, double base, dt_rotary_style style,
                      const void *x, void *out) {
    DT_TRY(check_float(b, "rotary", dtype));
    if (outer < 0 || rows < 0 || inner < 0 || d < 0 || d % 2 != 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda rotary: bad size outer %" PRId64 " rows %" PRId64
                        " inner %" PRId64 " d %" PRId64 " (d must be even)", b->rank, outer, rows,
                        inner, d);
    if (!isfinite(base) || base <= 0.0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda rotary: base %g must be finite and > 0", b->rank, base);
    if ((int)style < 0 || style >= DT_ROTARY_STYLE_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda rotary: unknown style %d",
                        b->rank, (int)style);
    if (outer == 0 || rows == 0 || inner == 0 || d == 0) return DT_SUCCESS;
    if (x == NULL || out == NULL || positions == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda rotary: NULL buffer or positions", b->rank);
    DT_TRY(enter(b, "rotary"));
    cuda_impl *im = impl_of(b);
    const int64_t half = d / 2;
    /* The angles theta_i = base^(-2i/d) are made here with the host's pow,
     * bit for bit the CPU backend's; they travel with the positions. */
    double *theta = static_cast<double *>(malloc((size_t)half * sizeof(double)));
    if (!theta)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda rotary: out of host memory (d %"
                        PRId64 ")", b->rank, d);
    for (int64_t i = 0; i < half; i++) theta[i] = pow(base, -2.0 * (double)i / (double)d);
    const void *dpos = NULL, *dtheta = NULL;
    table_part parts[2] = {{positions, (size_t)rows * sizeof(int64_t), &dpos},
                           {theta, (size_t)half * sizeof(double), &dtheta}};
    dt_status st = stage_tables(b, "rotary", parts, 2);
    free(theta); /* copied into the pinned buffer */
    DT_TRY(st);
    const int threads = 256;
    const int64_t pairs = rows * half, vecs = outer * inner;
    const unsigned gx = grid_for(im, pairs, threads);
    /* Enough blocks in y to fill the device when there are few pairs. */
    int64_t want = ((int64_t)im->sms * 8 + gx - 1) / gx;
    if (want > vecs) want = vecs;
    if (want > 65535) want = 65535;
    if (want < 1) want = 1;
    const dim3 grid(gx, (unsigned)want);
    const int64_t *p = static_cast<const int64_t *>(dpos);
    const double *th = static_cast<const double *>(dtheta);
    const int il = style == DT_ROTARY_INTERLEAVED;
    if (dtype == DT_F32)
        dt_cuda_launch(rotary_kernel<float>, grid, threads, 0, im->compute,
                       static_cast<const float *>(x), static_cast<float *>(out), p, th, outer, rows,
                       inner, d, il);
    else if (dtype == DT_BF16)
        dt_cuda_launch(rotary_kernel<__nv_bfloat16>, grid, threads, 0, im->compute,
                       static_cast<const __nv_bfloat16 *>(x), static_cast<__nv_bfloat16 *>(out), p,
                       th, outer, rows, inner, d, il);
    else
        dt_cuda_launch(rotary_kernel<__half>, grid, threads, 0, im->compute,
                       static_cast<const __half *>(x), static_cast<__half *>(out), p, th, outer,
                       rows, inner, d, il);
    CU_LAUNCHED(b, "rotary", "rotary_kernel");
    return DT_SUCCESS;
}

dt_status cuda_sync(dt_backend *b) {
    DT_TRY(enter(b, "sync"));
    return wait_all(b, "sync");
}

/* Marks are timing events (no blocking-sync flag: read by polling). */
dt_status cuda_marks_reserve(dt_backend *b, int n) {
    cuda_impl *im = impl_of(b);
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda marks: %d marks", b->rank, n);
    if (n <= im->n_marks) return DT_SUCCESS;
    DT_TRY(enter(b, "marks"));
    cudaEvent_t *m = static_cast<cudaEvent_t *>(realloc(im->marks, (size_t)n * sizeof *m));
    if (!m)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda marks: out of memory for %d", b->rank,
                        n);
    im->marks = m;
    for (; im->n_marks < n; im->n_marks++)
        CU_TRY(b, "marks", cudaEventCreate(&im->marks[im->n_marks]));
    return DT_SUCCESS;
}

dt_status cuda_mark(dt_backend *b, int i) {
    cuda_impl *im = impl_of(b);
    if (i < 0 || i >= im->n_marks)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda mark %d: %d reserved", b->rank, i,
                        im->n_marks);
    DT_TRY(enter(b, "mark"));
    CU_TRY(b, "mark", cudaEventRecord(im->marks[i], im->compute));
    return DT_SUCCESS;
}

dt_status cuda_mark_ms(dt_backend *b, int i, int j, double *ms) {
    cuda_impl *im = impl_of(b);
    if (i < 0 || j < 0 || i >= im->n_marks || j >= im->n_marks)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda marks %d, %d: %d reserved",
                        b->rank, i, j, im->n_marks);
    DT_TRY(enter(b, "mark"));
    for (int k : {i, j}) {
        cudaEvent_t ev = im->marks[k];
        DT_TRY(poll_until(b, "mark", "cudaEventQuery", "a profiling mark",
                          [ev] { return cudaEventQuery(ev); }));
    }
    float f = 0.0f;
    CU_TRY(b, "mark", cudaEventElapsedTime(&f, im->marks[i], im->marks[j]));
    *ms = f;
    return DT_SUCCESS;
}

/* Positional: C++17 has no designated initialisers. Keep in the order of
 * dt_backend_ops. */
const dt_backend_ops cuda_ops = {
    "cuda",          cuda_destroy, cuda_alloc,     cuda_alloc_uninit, cuda_free, cuda_upload,
    cuda_download,   cuda_copy,    cuda_zero,      cuda_copy_runs, cuda_gemm, cuda_add,
    cuda_add_beside,
    cuda_gelu,       cuda_rmsnorm, cuda_rotary,    cuda_sync, cuda_marks_reserve, cuda_mark,
    cuda_mark_ms,
};

/* ------------------------------------------------------ transport memory */

dt_backend *backend_of(void *arg) { return static_cast<dt_backend *>(arg); }

dt_status mem_alloc(void *arg, size_t bytes, void **out) { return cuda_alloc(backend_of(arg), bytes, out); }

void mem_free(void *arg, void *p) { cuda_free(backend_of(arg), p); }

/* A same-device copy in a few CTAs (one of the communication stream's
 * kernels: see COMM_THREADS): n 16-byte units. */
constexpr int64_t COPY_ROUND = (int64_t)COMM_THREADS * COMM_UNROLL;
__global__ void __launch_bounds__(COMM_THREADS) copy_kernel(uint4 *dst, const uint4 *src, int64_t n) {
    for (int64_t base = blockIdx.x * COPY_ROUND + threadIdx.x; base < n; base += gridDim.x * COPY_ROUND) {
        uint4 r[COMM_UNROLL];
#pragma unroll
        for (int u = 0; u < COMM_UNROLL; u++)
            if (base + u * COMM_THREADS < n) r[u] = __ldcs(src + base + u * COMM_THREADS);
#pragma unroll
        for (int u = 0; u < COMM_UNROLL; u++)
            if (base + u * COMM_THREADS < n) __stcs(dst + base + u * COMM_THREADS, r[u]);
    }
}

/* dst := src on this device's communication stream: copy_kernel in at
 * most comm_ctas CTAs where both lie on this device and comm_ctas > 0 (16-byte
 * aligned; a tail of fewer bytes by cudaMemcpyAsync), else cudaMemcpyAsync
 * (the driver's copy: as many blocks as the SMs take). */
dt_status comm_copy(dt_backend *b, void *dst, const void *src, size_t bytes, int same_device) {
    cuda_impl *im = impl_of(b);
    const size_t body = im->comm_ctas > 0 && same_device &&
                                ((uintptr_t)dst | (uintptr_t)src) % sizeof(uint4) == 0
                            ? bytes / sizeof(uint4) * sizeof(uint4)
                            : 0;
    if (body > 0) {
        const int64_t n = (int64_t)(body / sizeof(uint4));
        dt_cuda_launch(copy_kernel, comm_grid(im, n, COPY_ROUND), COMM_THREADS, 0, im->comm,
                       static_cast<uint4 *>(dst), static_cast<const uint4 *>(src), n);
        CU_LAUNCHED(b, "transport copy", "copy_kernel");
    }
    if (body < bytes)
        CU_TRY(b, "transport copy", cudaMemcpyAsync(static_cast<char *>(dst) + body,
                                                    static_cast<const char *>(src) + body,
                                                    bytes - body, cudaMemcpyDefault, im->comm));
    return DT_SUCCESS;
}

dt_status mem_copy(void *arg, void *dst, const void *src, size_t bytes, const void *dst_ready,
                   const void *src_ready) {
    if (bytes == 0 || dst == src) return DT_SUCCESS;
    const int dev_dst = device_of(dst), dev_src = device_of(src);
    const int host_dst = dev_dst < 0, host_src = dev_src < 0;
    if (host_dst && host_src) {
        memmove(dst, src, bytes); /* host to host: agreement tables, user host buffers */
        return DT_SUCCESS;
    }
    /* On the communication stream, not the compute stream: the work that
     * touched the buffers before is either done (published) or marked, and
     * the copy waits for the marks on the device, so a ring step's copy of
     * the next block runs beside the kernel the rank has just launched on
     * the block it holds. Waited for here: the transport's hooks complete on
     * return. With host memory on one side the host waits for the marks
     * instead, bounded: a copy to or from pageable memory can hold the host
     * inside cudaMemcpyAsync until the device reaches it. */
    dt_backend *b = backend_of(arg);
    DT_TRY(check_buffers(b, "transport copy", dst, src, bytes));
    DT_TRY(enter(b, "transport copy"));
    cuda_impl *im = impl_of(b);
    const void *ready[2] = {dst_ready, src_ready};
    for (int i = 0; i < 2; i++) {
        if (!ready[i]) continue;
        cudaEvent_t ev = (cudaEvent_t)const_cast<void *>(ready[i]);
        if (host_dst || host_src)
            DT_TRY(poll_until(b, "transport copy", "cudaEventQuery", "the work before a copy",
                              [ev] { return cudaEventQuery(ev); }));
        else
            CU_TRY(b, "transport copy", cudaStreamWaitEvent(im->comm, ev, 0));
    }
    DT_TRY(comm_copy(b, dst, src, bytes, dev_dst == im->device && dev_src == im->device));
    return wait_stream(b, im->comm, "transport copy");
}

dt_status mem_publish(void *arg) {
    dt_backend *b = backend_of(arg);
    DT_TRY(enter(b, "transport publish"));
    /* both streams: an add_beside on the communication stream wrote too */
    DT_TRY(wait_stream(b, impl_of(b)->compute, "transport publish"));
    return wait_stream(b, impl_of(b)->comm, "transport publish");
}

dt_status mem_mark(void *arg, int chained, const void **ready) {
    dt_backend *b = backend_of(arg);
    cuda_impl *im = impl_of(b);
    *ready = NULL;
    /* On the communication stream, after the compute stream's queued work
     * (chained: only after the communication stream's own): a copy from
     * this rank's buffers then also waits for an add_beside queued before
     * (the backward's dK|dV sums). */
    if (!chained) DT_TRY(comm_after_compute(b, "transport mark"));
    else DT_TRY(enter(b, "transport mark"));
    CU_TRY(b, "transport mark", cudaEventRecord(im->mark_ev, im->comm));
    *ready = im->mark_ev;
    return DT_SUCCESS;
}

dt_status mem_reduce(void *arg, float *acc, const void *x, size_t n, dt_dtype dtype,
                     dt_reduce_op op, int first) {
    dt_backend *b = backend_of(arg);
    cuda_impl *im = impl_of(b);
    if (n == 0) return DT_SUCCESS;
    if (!dt_dtype_is_float(dtype))
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: cuda reduce: dtype %s", b->rank,
                        dt_dtype_name(dtype));
    DT_TRY(enter(b, "transport reduce"));
    size_t bytes = n * dt_dtype_size(dtype);
    if (device_of(x) != im->device) {
        /* Host memory or another device: bring it here first. */
        DT_TRY(grow_device(b, &im->stage, &im->stage_bytes, bytes, "transport reduce"));
        DT_TRY(wait_stream(b, im->compute, "transport reduce"));
        CU_TRY(b, "transport reduce", cudaMemcpyAsync(im->stage, x, bytes, cudaMemcpyDefault,
                                                      im->compute));
        x = im->stage;
    }
    unsigned grid = grid_for(im, (int64_t)n, 256);
    int is_max = op == DT_REDUCE_MAX;
    if (dtype == DT_F32)
        dt_cuda_launch(reduce_kernel<float>, grid, 256, 0, im->compute,
                       acc, static_cast<const float *>(x), (int64_t)n, is_max, first);
    else if (dtype == DT_BF16)
        dt_cuda_launch(reduce_kernel<__nv_bfloat16>, grid, 256, 0, im->compute,
                       acc, static_cast<const __nv_bfloat16 *>(x), (int64_t)n, is_max, first);
    else
        dt_cuda_launch(reduce_kernel<__half>, grid, 256, 0, im->compute,
                       acc, static_cast<const __half *>(x), (int64_t)n, is_max, first);
    CU_LAUNCHED(b, "transport reduce", "reduce_kernel");
    /* The peer may reuse x as soon as this rank reports its reads done. */
    return wait_stream(b, im->compute, "transport reduce");
}

dt_status mem_finish(void *arg, void *acc, size_t n, dt_dtype dtype) {
    dt_backend *b = backend_of(arg);
    cuda_impl *im = impl_of(b);
    if (n == 0 || dtype == DT_F32) return DT_SUCCESS;
    DT_TRY(enter(b, "transport reduce"));
    size_t bytes = n * dt_dtype_size(dtype);
    DT_TRY(grow_device(b, &im->stage, &im->stage_bytes, bytes, "transport reduce"));
    unsigned grid = grid_for(im, (int64_t)n, 256);
    /* Out of place (threads would overwrite each other's fp32 inputs), then back. */
    if (dtype == DT_BF16)
        dt_cuda_launch(f32_to_kernel<__nv_bfloat16>, grid, 256, 0, im->compute,
                       static_cast<const float *>(acc), static_cast<__nv_bfloat16 *>(im->stage),
                       (int64_t)n);
    else if (dtype == DT_F16)
        dt_cuda_launch(f32_to_kernel<__half>, grid, 256, 0, im->compute,
                       static_cast<const float *>(acc), static_cast<__half *>(im->stage),
                       (int64_t)n);
    else
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: cuda reduce: dtype %s", b->rank,
                        dt_dtype_name(dtype));
    CU_LAUNCHED(b, "transport reduce", "f32_to_kernel");
    CU_TRY(b, "transport reduce", cudaMemcpyAsync(acc, im->stage, bytes, cudaMemcpyDeviceToDevice,
                                                  im->compute));
    return wait_stream(b, im->compute, "transport reduce");
}

const dt_mem_ops cuda_mem_ops = {
    "cuda", mem_alloc, mem_free, mem_copy, mem_publish, mem_mark, mem_reduce, mem_finish,
};

} /* namespace */

/* ---------------------------------------------------------------- public */

extern "C" dt_status dt_cuda_pool_create(dt_cuda_pool **out) {
    if (!out) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_cuda_pool_create: out is NULL");
    *out = NULL;
    dt_cuda_pool *p = static_cast<dt_cuda_pool *>(calloc(1, sizeof *p));
    if (!p) return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_cuda_pool_create: out of host memory");
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return dt_error(DT_ERR_SYSTEM, "dt_cuda_pool_create: pthread_mutex_init failed");
    }
    *out = p;
    return DT_SUCCESS;
}

extern "C" void dt_cuda_pool_destroy(dt_cuda_pool *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->lock);
    free(p->members);
    free(p);
}

extern "C" int dt_cuda_device_count(char *reason, size_t reason_size) {
    int n = 0; /* cudaGetDeviceCount leaves it untouched when it fails */
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (reason && reason_size)
            snprintf(reason, reason_size, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        (void)cudaGetLastError();
        return 0;
    }
    if (n <= 0 && reason && reason_size)
        snprintf(reason, reason_size, "cudaGetDeviceCount: no CUDA device");
    return n > 0 ? n : 0;
}

extern "C" dt_status dt_backend_cuda_create(int rank, const dt_cuda_options *o, dt_backend **out) {
    if (!out || !o)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: dt_backend_cuda_create: out or options is NULL", rank);
    *out = NULL;
    if (o->device < 0 || o->timeout_ms <= 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: dt_backend_cuda_create: device %d, timeout %ld ms", rank,
                        o->device, o->timeout_ms);
    dt_backend *b = static_cast<dt_backend *>(calloc(1, sizeof *b));
    cuda_impl *im = static_cast<cuda_impl *>(calloc(1, sizeof *im));
    if (!b || !im) {
        free(b);
        free(im);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda backend: out of host memory", rank);
    }
    b->ops = &cuda_ops;
    b->impl = im;
    b->rank = rank;
    im->device = o->device;
    im->timeout_ms = o->timeout_ms;
    im->tf32 = o->tf32 != 0;
    dt_status st = DT_SUCCESS;
    if (pthread_mutex_init(&im->cache_lock, NULL) != 0) {
        free(b);
        free(im);
        return dt_error(DT_ERR_SYSTEM, "rank %d: cuda backend: pthread_mutex_init failed", rank);
    }
    cudaError_t e = cudaSetDevice(o->device);
    cublasStatus_t s;
    if (e != cudaSuccess) {
        st = cuda_error(b, "create", "cudaSetDevice", e);
        goto fail;
    }
#define CREATE_TRY(call)                                                      \
    do {                                                                      \
        e = (call);                                                           \
        if (e != cudaSuccess) {                                               \
            st = cuda_error(b, "create", #call, e);                           \
            goto fail;                                                        \
        }                                                                     \
    } while (0)
    CREATE_TRY(cudaDeviceGetAttribute(&im->sms, cudaDevAttrMultiProcessorCount, o->device));
    /* the ranks sharing this device share DT_CUDA_COMM_CTAS (backend_cuda.h) */
    if (o->device_ranks > 1) {
        const int share = DT_CUDA_COMM_CTAS / o->device_ranks;
        im->comm_ctas = share > 0 ? share : 1;
    }
    {
        int major = 0, minor = 0;
        CREATE_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, o->device));
        CREATE_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, o->device));
        im->cc = major * 10 + minor;
    }
    {
        int l2 = 0;
        CREATE_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, o->device));
        im->l2_bytes = l2;
    }
    /* Non-blocking: no implicit ordering with the legacy default stream. The
     * communication stream has the greatest priority: a same-device copy
     * runs on the SMs, and its blocks then go ahead of the queued blocks of
     * the kernel it should overlap instead of waiting for that kernel. */
    {
        int least = 0, greatest = 0;
        CREATE_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        CREATE_TRY(cudaStreamCreateWithFlags(&im->compute, cudaStreamNonBlocking));
        CREATE_TRY(cudaStreamCreateWithPriority(&im->comm, cudaStreamNonBlocking, greatest));
    }
    CREATE_TRY(cudaEventCreateWithFlags(&im->tab_ev, cudaEventDisableTiming));
    CREATE_TRY(cudaEventCreateWithFlags(&im->free_ev, cudaEventDisableTiming));
    CREATE_TRY(cudaEventCreateWithFlags(&im->mark_ev, cudaEventDisableTiming));
    CREATE_TRY(cudaEventCreateWithFlags(&im->join_ev, cudaEventDisableTiming));
    CREATE_TRY(cudaEventCreateWithFlags(&im->reclaim_ev, cudaEventDisableTiming));
#undef CREATE_TRY
    s = cublasCreate(&im->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(im->blas, im->compute);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(im->blas, math_mode(im->tf32));
    if (s != CUBLAS_STATUS_SUCCESS) {
        st = cublas_error(b, "create", "cublasCreate", s);
        goto fail;
    }
    if (o->pool) {
        im->pool = o->pool;
        if (!pool_join(b)) {
            im->pool = NULL;
            st = dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda backend: out of host memory "
                          "joining its pool", rank);
            goto fail;
        }
    }
    *out = b;
    return DT_SUCCESS;
fail:
    cuda_destroy(b);
    return st;
}

extern "C" int dt_backend_is_cuda(const dt_backend *b) { return b && b->ops == &cuda_ops; }

extern "C" int dt_backend_cuda_device(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? impl_of(b)->device : -1;
}

extern "C" int dt_backend_cuda_compute_capability(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? impl_of(b)->cc : 0;
}

extern "C" void *dt_backend_cuda_compute_stream(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? static_cast<void *>(impl_of(b)->compute) : NULL;
}

extern "C" void *dt_backend_cuda_comm_stream(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? static_cast<void *>(impl_of(b)->comm) : NULL;
}

extern "C" int64_t dt_backend_cuda_l2_bytes(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? impl_of(b)->l2_bytes : 0;
}

extern "C" void dt_backend_cuda_set_l2_bytes(dt_backend *b, int64_t bytes) {
    if (dt_backend_is_cuda(b) && bytes >= 0) impl_of(b)->l2_bytes = bytes;
}

extern "C" int dt_backend_cuda_sms(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? impl_of(b)->sms : 0;
}

extern "C" int dt_backend_cuda_comm_ctas(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? impl_of(b)->comm_ctas : 0;
}

extern "C" void dt_backend_cuda_set_comm_ctas(dt_backend *b, int ctas) {
    if (dt_backend_is_cuda(b)) impl_of(b)->comm_ctas = ctas > 0 ? ctas : 0;
}

extern "C" dt_status dt_backend_cuda_busy(dt_backend *b, double us) {
    if (!dt_backend_is_cuda(b)) return DT_SUCCESS;
    if (!(us >= 0 && us <= 1e6))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda busy: %g us is not in [0, 1e6]",
                        b->rank, us);
    DT_TRY(enter(b, "busy"));
    dt_cuda_launch(busy_kernel, 1, 1, 0, impl_of(b)->compute, (uint64_t)(us * 1e3));
    CU_LAUNCHED(b, "busy", "busy_kernel");
    return DT_SUCCESS;
}

extern "C" void dt_backend_cuda_set_tf32(dt_backend *b, int on) {
    if (!dt_backend_is_cuda(b)) return;
    cuda_impl *im = impl_of(b);
    im->tf32 = on != 0;
    if (im->blas) (void)cublasSetMathMode(im->blas, math_mode(im->tf32));
}

extern "C" void dt_backend_cuda_set_abort_poll(dt_backend *b, int (*poll)(void *arg), void *arg) {
    if (!dt_backend_is_cuda(b)) return;
    impl_of(b)->abort_poll = poll;
    impl_of(b)->abort_arg = poll ? arg : NULL;
}

extern "C" int dt_backend_cuda_tf32(const dt_backend *b) {
    return dt_backend_is_cuda(b) ? impl_of(b)->tf32 : 0;
}

extern "C" dt_mem dt_backend_cuda_mem(dt_backend *b) {
    dt_mem m = {&cuda_mem_ops, b};
    return m;
}
