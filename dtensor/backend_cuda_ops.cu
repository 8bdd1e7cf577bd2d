/* dtensor/backend_cuda_ops.cu — the CUDA backend's ops (the table's
 * entries, backend.h) and their kernels: upload, download, copy, zero,
 * copy_runs, gemm, add, add_beside, gelu, rmsnorm, rotary; the gradients,
 * losses and the optimizer (gemm_ex to adamw, their own section below);
 * and dt_backend_cuda_busy. Each is enqueued on the rank's compute stream in
 * call order (add_beside on the communication stream, after the compute
 * stream's queued work); only upload and download wait, for the host
 * buffer, and the calls that return a host value (absmax, sumsq,
 * i32_check), for it. Arguments are checked before anything is enqueued.
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
 * Test: tests/test_cuda.c, test_runs, test_gemm and test_elementwise, and
 * tests/test_grad_kernels.c (make test; skipped without a GPU).
 */
#include "backend_cuda_impl.cuh"
#include "../base/cuda_launch.cuh"

#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLAS_TRY(b, op, call)                                                 \
    do {                                                                      \
        cublasStatus_t s_ = (call);                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) return cublas_error((b), (op), #call, s_); \
    } while (0)

namespace dt_cuda {
namespace {

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
 * positions and angles) are computed once per thread and reused, and again
 * only where an outer row's position differs (pos_stride != 0). The
 * products are rounded separately (__fmul_rn: no contraction into an FMA),
 * as on the CPU. */
template <typename T>
__global__ void rotary_kernel(const T *x, T *out, const int64_t *pos, int64_t pos_stride,
                              const double *theta, int64_t outer, int64_t rows, int64_t inner,
                              int64_t d, int interleaved, double sign) {
    const int64_t half = d / 2, pairs = rows * half, vecs = outer * inner;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += stride) {
        const int64_t s = p / half, i = p - s * half;
        const int64_t oa = interleaved ? 2 * i : i, ob = interleaved ? 2 * i + 1 : i + half;
        int64_t at = -1;   /* the position c and sn are for; positions are >= 0 */
        float c = 0.0f, sn = 0.0f;
        for (int64_t v = blockIdx.y; v < vecs; v += gridDim.y) {
            const int64_t o = v / inner, h = v - o * inner;
            const int64_t ps = pos[o * pos_stride + s];
            if (ps != at) {
                double sd, cd;
                sincos((double)ps * theta[i], &sd, &cd);
                c = (float)cd;
                sn = (float)(sign * sd);   /* sign -1: rotary_inverse */
                at = ps;
            }
            const int64_t row = ((o * rows + s) * inner + h) * d;
            const float va = to_f(x[row + oa]), vb = to_f(x[row + ob]);
            out[row + oa] = from_f<T>(__fsub_rn(__fmul_rn(va, c), __fmul_rn(vb, sn)));
            out[row + ob] = from_f<T>(__fadd_rn(__fmul_rn(va, sn), __fmul_rn(vb, c)));
        }
    }
}

/* ------------------------------------------------------- host-side helpers */

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
        DT_TRY(wait_event(b, im->tab_ev, op, "the previous table upload"));
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

dt_status check_float(const dt_backend *b, const char *op, dt_dtype dtype) {
    if (dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16) return DT_SUCCESS;
    return dt_error(DT_ERR_NOT_SUPPORTED,
                    "rank %d: cuda %s: dtype %s is not supported (fp32, bf16, fp16 are)", b->rank,
                    op, dt_dtype_name(dtype));
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

} /* namespace */

/* ------------------------------------------------------------------ the ops */

dt_status check_buffers(const dt_backend *b, const char *op, const void *x, const void *y,
                        size_t bytes) {
    if (bytes > 0 && (x == NULL || y == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer for %zu bytes",
                        b->rank, op, bytes);
    return DT_SUCCESS;
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

namespace {

/* rotary (sign 1) and rotary_inverse (sign -1: the rotation by -angle, the
 * same cos and the fp32 sine negated, so the same products up to sign). */
dt_status rotary_run(dt_backend *b, const char *what, double sign, dt_dtype dtype, int64_t outer,
                     int64_t rows, int64_t inner, int64_t d, const int64_t *positions,
                     int64_t pos_stride, double base, dt_rotary_style style, const void *x,
                     void *out) {
    DT_TRY(check_float(b, what, dtype));
    if (outer < 0 || rows < 0 || inner < 0 || d < 0 || d % 2 != 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: bad size outer %" PRId64 " rows %" PRId64
                        " inner %" PRId64 " d %" PRId64 " (d must be even)", b->rank, what, outer,
                        rows, inner, d);
    if (pos_stride != 0 && pos_stride < rows)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: pos_stride %" PRId64 " must be 0 (shared) or >= rows %"
                        PRId64, b->rank, what, pos_stride, rows);
    if (!isfinite(base) || base <= 0.0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: base %g must be finite and > 0", b->rank, what, base);
    if ((int)style < 0 || style >= DT_ROTARY_STYLE_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: unknown style %d",
                        b->rank, what, (int)style);
    if (outer == 0 || rows == 0 || inner == 0 || d == 0) return DT_SUCCESS;
    if (x == NULL || out == NULL || positions == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: NULL buffer or positions", b->rank, what);
    DT_TRY(enter(b, what));
    cuda_impl *im = impl_of(b);
    const int64_t half = d / 2;
    /* The angles theta_i = base^(-2i/d) are made here with the host's pow,
     * bit for bit the CPU backend's; they travel with the positions. */
    double *theta = static_cast<double *>(malloc((size_t)half * sizeof(double)));
    if (!theta)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda %s: out of host memory (d %"
                        PRId64 ")", b->rank, what, d);
    for (int64_t i = 0; i < half; i++) theta[i] = pow(base, -2.0 * (double)i / (double)d);
    const void *dpos = NULL, *dtheta = NULL;
    const int64_t n_pos = pos_stride ? (outer - 1) * pos_stride + rows : rows;
    table_part parts[2] = {{positions, (size_t)n_pos * sizeof(int64_t), &dpos},
                           {theta, (size_t)half * sizeof(double), &dtheta}};
    dt_status st = stage_tables(b, what, parts, 2);
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
                       static_cast<const float *>(x), static_cast<float *>(out), p, pos_stride,
                       th, outer, rows, inner, d, il, sign);
    else if (dtype == DT_BF16)
        dt_cuda_launch(rotary_kernel<__nv_bfloat16>, grid, threads, 0, im->compute,
                       static_cast<const __nv_bfloat16 *>(x), static_cast<__nv_bfloat16 *>(out), p,
                       pos_stride, th, outer, rows, inner, d, il, sign);
    else
        dt_cuda_launch(rotary_kernel<__half>, grid, threads, 0, im->compute,
                       static_cast<const __half *>(x), static_cast<__half *>(out), p,
                       pos_stride, th, outer, rows, inner, d, il, sign);
    CU_LAUNCHED(b, what, "rotary_kernel");
    return DT_SUCCESS;
}

} /* namespace */

dt_status cuda_rotary(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows, int64_t inner,
                      int64_t d, const int64_t *positions, int64_t pos_stride, double base,
                      dt_rotary_style style, const void *x, void *out) {
    return rotary_run(b, "rotary", 1.0, dtype, outer, rows, inner, d, positions, pos_stride, base,
                      style, x, out);
}

/* ----------------------------------------- gradients, losses, optimizer
 *
 * backend.h's contracts, on the compute stream like the ops above.
 * Elementwise kernels compute in fp32 (gelu_backward, swiglu and its
 * backward through erfcf / expf; the CPU backend forms the same values in
 * double), rounding once; with `accumulate` the output is read and added in
 * fp32. Row sums (rmsnorm_backward's, as the forward's) are accumulated in
 * double, the cross-entropy's sum of exponentials in fp32; the weight
 * gradient of rmsnorm sums the rows in chunks (one partial per chunk and
 * column, in double) and then the chunks in order, so it is deterministic.
 * embedding_backward adds with fp32 atomics into an fp32 table (the
 * gradient itself when it is fp32, else a scratch rounded once at the end),
 * so repeated tokens sum in fp32 in an unspecified order. The reductions
 * that return a host value (absmax, sumsq, i32_check) write one partial per
 * block into scratch of the caching allocator, then wait (bounded) and
 * combine the partials on the host in block order. adamw is a fixed
 * sequence of correctly rounded fp32 operations (no contraction into fused
 * multiply-adds), that of the CPU backend, so their results agree bit for
 * bit. Every max propagates NaN.
 *
 * Test: tests/test_grad_kernels.c (every entry against double-precision
 * references, CUDA against the CPU backend; make test, make CUDA=emu test).
 */

namespace {

#define FLOAT_DISPATCH(dtype, T, ...)                                         \
    do {                                                                      \
        if ((dtype) == DT_F32) {                                              \
            using T = float;                                                  \
            __VA_ARGS__;                                                      \
        } else if ((dtype) == DT_BF16) {                                      \
            using T = __nv_bfloat16;                                          \
            __VA_ARGS__;                                                      \
        } else {                                                              \
            using T = __half;                                                 \
            __VA_ARGS__;                                                      \
        }                                                                     \
    } while (0)

#define GRID_STRIDE(i, n)                                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

/* Threads of the reductions' blocks, and at most how many blocks (each
 * leaves one partial for the host). */
constexpr int RED_THREADS = 256, RED_BLOCKS = 512;

/* out[i] = v, plus what it holds (accumulate) added in fp32; rounded once. */
template <typename T>
__device__ __forceinline__ void put(T *out, int64_t i, float v, int accumulate) {
    out[i] = from_f<T>(accumulate ? __fadd_rn(v, to_f(out[i])) : v);
}

/* The larger of a and b; NaN if either is (fmaxf and a > b ? a : b drop it). */
__device__ __forceinline__ float max_nan(float a, float b) { return a > b || a != a ? a : b; }

struct max_nan_op {
    __device__ float operator()(float a, float b) const { return max_nan(a, b); }
};
struct sum_op {
    template <typename V> __device__ V operator()(V a, V b) const { return a + b; }
};

/* The reduction of every thread's v by op (identity `id`), returned to all
 * threads of the block: shuffles within each warp, the warps' results in
 * sh (32 entries of shared memory), reduced by warp 0. blockDim.x a multiple
 * of 32, <= 1024. Ends with a barrier, so sh may be reused at once. */
template <typename V, typename Op>
__device__ V block_reduce(V v, Op op, V id, V *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? sh[lane] : id;
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;   /* every lane has read sh: the shuffles wait for all */
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

/* Threads of a block that reduces one row of n: enough warps that each
 * thread takes a handful, at most 256. */
inline int row_threads(int64_t n) {
    return n >= RED_THREADS ? RED_THREADS : n <= 32 ? 32 : (int)((n + 31) / 32) * 32;
}

template <typename T>
__global__ void scale_kernel(T *c, int64_t n, float beta) {
    GRID_STRIDE(i, n) c[i] = from_f<T>(__fmul_rn(beta, to_f(c[i])));
}

/* gelu'(x) in fp32: Phi(x) + x phi(x) (erf; erfcf keeps Phi's relative
 * accuracy for x < 0), or s + 2 x s (1 - s) u' with s = s(2u) the tanh
 * form's sigmoid and 1 - s formed as its own (tanh). Limits 0 and 1 at -inf
 * and +inf; the second term is 0 where s (1 - s) underflows. */
__device__ __forceinline__ float gelu_grad_f32(float x, int tanh_form) {
    if (isinf(x)) return x > 0.0f ? 1.0f : 0.0f;
    if (!tanh_form) {
        const float cdf = 0.5f * erfcf(-x * 0.70710678118654752440f);
        return cdf + x * (0.39894228040143267794f * expf(-0.5f * (x * x)));
    }
    const float k = 0.79788456080286535588f, c3 = 0.044715f;
    const float u = k * (x + c3 * x * x * x);
    const float s = 1.0f / (1.0f + expf(-2.0f * u)), sc = 1.0f / (1.0f + expf(2.0f * u));
    const float ss = s * sc;
    return s + (ss == 0.0f ? 0.0f : 2.0f * x * ss * (k * (1.0f + 3.0f * c3 * (x * x))));
}

template <typename T>
__global__ void gelu_backward_kernel(const T *x, const T *dy, T *dx, int64_t n, int tanh_form,
                                     int accumulate) {
    GRID_STRIDE(i, n) put(dx, i, to_f(dy[i]) * gelu_grad_f32(to_f(x[i]), tanh_form), accumulate);
}

/* silu(g) = g s(g) and silu'(g) = s (1 + g (1 - s)), 1 - s = s(-g): from
 * e = e^-|g|, which never overflows (so silu stays right where it is a
 * normal float below g = -88.7), s(|g|) = 1 / (1 + e), s(-|g|) = e s(|g|);
 * at -inf 0 and 0, at +inf inf and 1. */
__device__ __forceinline__ void silu_f32(float g, float *silu, float *dsilu) {
    if (isinf(g)) {
        *silu = g > 0.0f ? g : -0.0f;
        *dsilu = g > 0.0f ? 1.0f : 0.0f;
        return;
    }
    const float e = expf(-fabsf(g)), d = 1.0f / (1.0f + e), ed = e * d;
    const float s = g >= 0.0f ? d : ed, sc = g >= 0.0f ? ed : d;
    *silu = g * s;
    *dsilu = s * (1.0f + g * sc);
}

template <typename T>
__global__ void swiglu_kernel(const T *gate, const T *up, T *out, int64_t n) {
    GRID_STRIDE(i, n) {
        float silu, dsilu;
        silu_f32(to_f(gate[i]), &silu, &dsilu);
        out[i] = from_f<T>(silu * to_f(up[i]));
    }
}

/* Both gradients of an element are formed before either is stored (they
 * may alias the inputs elementwise). */
template <typename T>
__global__ void swiglu_backward_kernel(const T *gate, const T *up, const T *dy, T *dgate, T *dup,
                                       int64_t n, int accumulate) {
    GRID_STRIDE(i, n) {
        float silu, dsilu;
        silu_f32(to_f(gate[i]), &silu, &dsilu);
        const float g = to_f(dy[i]);
        const float vg = g * to_f(up[i]) * dsilu, vu = g * silu;
        if (dgate) put(dgate, i, vg, accumulate);
        if (dup) put(dup, i, vu, accumulate);
    }
}

/* rmsnorm_backward, per row r of x [rows, n], one block per row: inv[r] =
 * 1 / sqrt(mean(x^2) + eps) and k3[r] = inv^3 mean(g x), g = dy w (dy
 * without w), the sums in double (as the forward's). */
template <typename T>
__global__ void rmsnorm_bwd_rows_kernel(const T *x, const T *w, const T *dy, int64_t rows,
                                        int64_t n, float eps, double *inv, double *k3) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * n, *dyr = dy + r * n;
        double ss = 0.0, sgx = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const double v = to_f(xr[i]);
            double g = to_f(dyr[i]);
            if (w) g *= to_f(w[i]);
            ss = fma(v, v, ss);
            sgx = fma(g, v, sgx);
        }
        ss = block_reduce(ss, sum_op(), 0.0, sh);
        sgx = block_reduce(sgx, sum_op(), 0.0, sh);
        if (threadIdx.x == 0) {
            const double iv = 1.0 / sqrt(ss / (double)n + (double)eps);
            inv[r] = iv;
            k3[r] = iv * iv * iv * (sgx / (double)n);
        }
    }
}

/* dx = inv g - x k3, in double, rounded once (elementwise: dx may be dy). */
template <typename T>
__global__ void rmsnorm_bwd_dx_kernel(const T *x, const T *w, const T *dy, T *dx, int64_t rows,
                                      int64_t n, const double *inv, const double *k3,
                                      int accumulate) {
    GRID_STRIDE(idx, rows * n) {
        const int64_t r = idx / n, i = idx - r * n;
        double g = to_f(dy[idx]);
        if (w) g *= to_f(w[i]);
        put(dx, idx, (float)(inv[r] * g - (double)to_f(x[idx]) * k3[r]), accumulate);
    }
}

/* dw partials: part[c, j] = sum over the rows of chunk c (blockIdx.y) of
 * dy x inv, in double; threads over the columns (coalesced). */
template <typename T>
__global__ void rmsnorm_bwd_dw_part_kernel(const T *x, const T *dy, int64_t rows, int64_t n,
                                           int64_t chunk, const double *inv, double *part) {
    const int64_t c = blockIdx.y, r0 = c * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    GRID_STRIDE(j, n) {
        double s = 0.0;
        for (int64_t r = r0; r < r1; r++) s += (double)to_f(dy[r * n + j]) * to_f(x[r * n + j]) * inv[r];
        part[c * n + j] = s;
    }
}

/* dw[j] = the chunks' partials summed in order, rounded once. */
template <typename T>
__global__ void rmsnorm_bwd_dw_kernel(const double *part, int64_t chunks, int64_t n, T *dw,
                                      int accumulate) {
    GRID_STRIDE(j, n) {
        double s = 0.0;
        for (int64_t c = 0; c < chunks; c++) s += part[c * n + j];
        put(dw, j, (float)s, accumulate);
    }
}

/* The rotation of rotary_kernel by -angle is rotary_kernel with the sine's
 * sign flipped (rotary_run). */

template <typename T>
__global__ void embedding_kernel(const int32_t *tok, const T *table, T *out, int64_t n, int64_t d,
                                 int64_t lo, int64_t rows) {
    GRID_STRIDE(idx, n * d) {
        const int64_t i = idx / d, j = idx - i * d, r = (int64_t)tok[i] - lo;
        out[idx] = r >= 0 && r < rows ? table[r * d + j] : from_f<T>(0.0f);
    }
}

/* acc[tok[i] - lo, :] += dy[i, :] (fp32 atomics) for the tokens in range. */
template <typename T>
__global__ void embedding_bwd_kernel(const int32_t *tok, const T *dy, float *acc, int64_t n,
                                     int64_t d, int64_t lo, int64_t rows) {
    GRID_STRIDE(idx, n * d) {
        const int64_t i = idx / d, j = idx - i * d, r = (int64_t)tok[i] - lo;
        if (r >= 0 && r < rows) atomicAdd(acc + r * d + j, to_f(dy[idx]));
    }
}

template <typename S, typename D>
__global__ void convert_kernel(const S *src, D *dst, int64_t n) {
    GRID_STRIDE(i, n) dst[i] = from_f<D>(to_f(src[i]));
}

/* Per block: part[2b] = how many x are in [0, limit) and not `ignore`,
 * part[2b + 1] = the first index of one neither there nor `ignore`
 * (INT64_MAX: none); a tree in shared memory (RED_THREADS threads). */
__global__ void i32_check_kernel(const int32_t *x, int64_t n, int64_t limit, int32_t ignore,
                                 int64_t *part) {
    __shared__ int64_t sv[RED_THREADS], sb[RED_THREADS];
    int64_t valid = 0, bad = INT64_MAX;
    GRID_STRIDE(i, n) {
        const int32_t v = x[i];
        if (v == ignore) continue;
        if (v >= 0 && (int64_t)v < limit) valid++;
        else if (i < bad) bad = i;
    }
    const int t = threadIdx.x;
    sv[t] = valid;
    sb[t] = bad;
    __syncthreads();
    for (int s = RED_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            sv[t] += sv[t + s];
            sb[t] = sb[t + s] < sb[t] ? sb[t + s] : sb[t];
        }
        __syncthreads();
    }
    if (t == 0) {
        part[2 * blockIdx.x] = sv[0];
        part[2 * blockIdx.x + 1] = sb[0];
    }
}

/* m[r] = max_j x[r, j] (NaN if any is), one block per row. */
template <typename T>
__global__ void ce_max_kernel(const T *x, int64_t rows, int64_t n, float *m) {
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float v = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) v = max_nan(v, to_f(x[r * n + j]));
        v = block_reduce(v, max_nan_op(), -INFINITY, sh);
        if (threadIdx.x == 0) m[r] = v;
    }
}

/* se[r] = sum_j e^(x[r, j] - m[r]) in fp32, tl[r] = the target's logit or 0;
 * one block per row. */
template <typename T>
__global__ void ce_sum_kernel(const T *x, const float *m, const int32_t *tgt, int64_t rows,
                              int64_t n, int64_t lo, float *se, float *tl) {
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float mr = m[r];
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += expf(to_f(x[r * n + j]) - mr);
        s = block_reduce(s, sum_op(), 0.0f, sh);
        if (threadIdx.x == 0) {
            const int64_t t = (int64_t)tgt[r] - lo;
            se[r] = s;
            tl[r] = t >= 0 && t < n ? to_f(x[r * n + t]) : 0.0f;
        }
    }
}

/* Elementwise over [rows, n] (dx NULL: nothing), the losses over the rows
 * first. */
template <typename T>
__global__ void ce_grad_kernel(const T *x, const float *m, const float *se, const float *tl,
                               const int32_t *tgt, int64_t rows, int64_t n, int64_t lo,
                               int32_t ignore, float scale, T *dx, float *loss) {
    GRID_STRIDE(r, rows) loss[r] = tgt[r] == ignore ? 0.0f : m[r] + logf(se[r]) - tl[r];
    GRID_STRIDE(idx, dx ? rows * n : 0) {
        const int64_t r = idx / n, j = idx - r * n;
        float v = 0.0f;
        if (tgt[r] != ignore) {
            const float p = expf(to_f(x[idx]) - m[r]) / se[r];
            v = (p - (j == (int64_t)tgt[r] - lo ? 1.0f : 0.0f)) * scale;
        }
        dx[idx] = from_f<T>(v);
    }
}

/* part[b] = max |x| over the block's elements (NaN if any is). */
template <typename T>
__global__ void absmax_kernel(const T *x, int64_t n, float *part) {
    __shared__ float sh[32];
    float v = 0.0f;
    GRID_STRIDE(i, n) v = max_nan(v, fabsf(to_f(x[i])));
    v = block_reduce(v, max_nan_op(), 0.0f, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = v;
}

/* part[b] = sum of x^2 over the block's elements, in double. */
template <typename T>
__global__ void sumsq_kernel(const T *x, int64_t n, double *part) {
    __shared__ double sh[32];
    double s = 0.0;
    GRID_STRIDE(i, n) {
        const double v = to_f(x[i]);
        s = fma(v, v, s);
    }
    s = block_reduce(s, sum_op(), 0.0, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* One AdamW step (backend_cpu.c's dt_cpu_adamw, the same fp32 operations
 * in the same order, each rounded: the _rn intrinsics keep nvcc from
 * fusing them; division and sqrtf are correctly rounded). */
template <typename T>
__global__ void adamw_kernel(T *param, float *master, float *m, float *v, const T *grad, int64_t n,
                             float gscale, float b1, float b2, float omb1, float omb2, float decay,
                             float step_size, float bc2_sqrt, float eps) {
    GRID_STRIDE(i, n) {
        const float g = __fmul_rn(to_f(grad[i]), gscale);
        const float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(omb1, g));
        const float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(omb2, __fmul_rn(g, g)));
        const float den = __fadd_rn(sqrtf(vi) / bc2_sqrt, eps);
        const float p = __fsub_rn(__fmul_rn(master[i], decay), __fmul_rn(step_size, mi / den));
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        param[i] = from_f<T>(p);
    }
}

/* ------------------------------------------------------------ host side */

/* Blocks of RED_THREADS for a reduction over n, at most RED_BLOCKS. */
inline unsigned red_grid(const cuda_impl *im, int64_t n) {
    const unsigned g = grid_for(im, n, RED_THREADS);
    return g < (unsigned)RED_BLOCKS ? g : (unsigned)RED_BLOCKS;
}

/* Blocks for one block per row: at most sms * 32 (they stride over the rest). */
inline unsigned row_grid(const cuda_impl *im, int64_t rows) {
    const int64_t cap = (int64_t)im->sms * 32;
    return (unsigned)(rows < cap ? rows : (cap > 0 ? cap : 1));
}

/* A reduction: `launch` (given the device scratch of `bytes`) enqueues the
 * kernel that fills it; then, after a bounded wait, the partials are copied
 * into host (`bytes`) and the scratch goes back to the allocator. */
template <typename Launch>
dt_status reduce_to_host(dt_backend *b, const char *op, size_t bytes, void *host, Launch launch) {
    void *part = NULL;
    DT_TRY(cuda_alloc_uninit(b, bytes, &part));
    dt_status st = launch(part);
    if (st == DT_SUCCESS) st = host_transfer(b, op, host, part, bytes);
    cuda_free(b, part);
    return st;
}

/* DT_SUCCESS, or the error of the launch just made (CU_LAUNCHED for code
 * that must clean up). */
dt_status launched(const dt_backend *b, const char *op, const char *kernel) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? DT_SUCCESS : cuda_error(b, op, kernel, e);
}

} /* namespace */

dt_status cuda_gemm_ex(dt_backend *b, dt_dtype dtype, int trans_a, int trans_b, int64_t m,
                       int64_t n, int64_t k, float alpha, const void *a, const void *bm, float beta,
                       void *c) {
    const char *op = "gemm_ex";
    DT_TRY(check_float(b, op, dtype));
    if ((trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda gemm_ex: trans_a %d, trans_b %d "
                        "(0 or 1)", b->rank, trans_a, trans_b);
    if (m < 0 || n < 0 || k < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda gemm_ex: negative size m %" PRId64 " n %" PRId64
                        " k %" PRId64, b->rank, m, n, k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "rank %d: cuda gemm_ex: m %" PRId64 " n %" PRId64 " k %" PRId64
                        " exceeds cuBLAS's int range", b->rank, m, n, k);
    if (m == 0 || n == 0) return DT_SUCCESS;
    if (c == NULL || (k > 0 && (a == NULL || bm == NULL)))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda gemm_ex: NULL buffer", b->rank);
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    if (k == 0) {
        /* C = beta C; beta 0 never reads C */
        const int64_t mn = m * n;
        if (beta == 0.0f) return cuda_zero(b, c, (size_t)mn * dt_dtype_size(dtype));
        if (beta == 1.0f) return DT_SUCCESS;
        FLOAT_DISPATCH(dtype, T,
                       dt_cuda_launch(scale_kernel<T>, grid_for(im, mn, 256), 256, 0, im->compute,
                                      static_cast<T *>(c), mn, beta));
        CU_LAUNCHED(b, op, "scale_kernel");
        return DT_SUCCESS;
    }
    const cudaDataType_t t = dtype == DT_F32 ? CUDA_R_32F : dtype == DT_BF16 ? CUDA_R_16BF
                                                                             : CUDA_R_16F;
    const cublasComputeType_t ct = dtype == DT_F32 && im->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                : CUBLAS_COMPUTE_32F;
    /* Row-major C[m,n] = op(A) op(B) is column-major C^T[n,m] = op(B)^T
     * op(A)^T. A row-major matrix read column-major is its transpose, so B
     * as stored (B [k,n], or with trans_b B [n,k]) is op(B)^T with OP_N,
     * resp. OP_T; the same for A: no copies. */
    const int lda = (int)(trans_a ? m : k), ldb = (int)(trans_b ? k : n);
    BLAS_TRY(b, op, cublasGemmEx(im->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                 &alpha, bm, t, ldb, a, t, lda, &beta, c, t, (int)n, ct,
                                 CUBLAS_GEMM_DEFAULT));
    CU_LAUNCHED(b, op, "cublasGemmEx");
    return DT_SUCCESS;
}

dt_status cuda_gelu_backward(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                             const void *dy, void *dx, dt_gelu_approx approx, int accumulate) {
    const char *op = "gelu backward";
    if ((int)approx < 0 || approx >= DT_GELU_APPROX_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: unknown approximation %d",
                        b->rank, op, (int)approx);
    DT_TRY(elementwise_args(b, op, dtype, n, x, dy, 0, dx));
    if (n == 0) return DT_SUCCESS;
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(gelu_backward_kernel<T>, grid_for(im, n, 256), 256, 0,
                                  im->compute, static_cast<const T *>(x),
                                  static_cast<const T *>(dy), static_cast<T *>(dx), n,
                                  (int)(approx == DT_GELU_TANH), accumulate != 0));
    CU_LAUNCHED(b, op, "gelu_backward_kernel");
    return DT_SUCCESS;
}

dt_status cuda_swiglu(dt_backend *b, dt_dtype dtype, int64_t n, const void *gate, const void *up,
                      void *out) {
    DT_TRY(elementwise_args(b, "swiglu", dtype, n, gate, up, 0, out));
    if (n == 0) return DT_SUCCESS;
    DT_TRY(enter(b, "swiglu"));
    cuda_impl *im = impl_of(b);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(swiglu_kernel<T>, grid_for(im, n, 256), 256, 0, im->compute,
                                  static_cast<const T *>(gate), static_cast<const T *>(up),
                                  static_cast<T *>(out), n));
    CU_LAUNCHED(b, "swiglu", "swiglu_kernel");
    return DT_SUCCESS;
}

dt_status cuda_swiglu_backward(dt_backend *b, dt_dtype dtype, int64_t n, const void *gate,
                               const void *up, const void *dy, void *dgate, void *dup,
                               int accumulate) {
    const char *op = "swiglu backward";
    DT_TRY(elementwise_args(b, op, dtype, n, gate, up, 0, dy));
    if (n == 0 || (dgate == NULL && dup == NULL)) return DT_SUCCESS;
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(swiglu_backward_kernel<T>, grid_for(im, n, 256), 256, 0,
                                  im->compute, static_cast<const T *>(gate),
                                  static_cast<const T *>(up), static_cast<const T *>(dy),
                                  static_cast<T *>(dgate), static_cast<T *>(dup), n,
                                  (int)(accumulate != 0)));
    CU_LAUNCHED(b, op, "swiglu_backward_kernel");
    return DT_SUCCESS;
}

dt_status cuda_rmsnorm_backward(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                                const void *x, const void *w, float eps, const void *dy, void *dx,
                                void *dw, int accumulate) {
    const char *op = "rmsnorm backward";
    DT_TRY(check_float(b, op, dtype));
    if (rows < 0 || n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: negative size rows %" PRId64 " n %" PRId64, b->rank, op,
                        rows, n);
    if (!isfinite(eps) || eps < 0.0f)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: eps %g must be finite and >= 0",
                        b->rank, op, (double)eps);
    if (w == NULL) dw = NULL;   /* no weight: no weight gradient */
    if (n == 0 || (dx == NULL && dw == NULL)) return DT_SUCCESS;
    if (rows > 0 && (x == NULL || dy == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, op);
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    const int acc = accumulate != 0;
    if (rows == 0) {
        /* dw sums no rows: 0, or unchanged */
        if (dw && !acc) return cuda_zero(b, dw, (size_t)n * dt_dtype_size(dtype));
        return DT_SUCCESS;
    }
    /* scratch: inv [rows], k3 [rows], the dw partials [chunks, n] (doubles);
     * chunks of 64 rows, at most 1024 of them */
    int64_t chunks = dw ? (rows + 63) / 64 : 0;
    if (chunks > 1024) chunks = 1024;
    const int64_t chunk = chunks ? (rows + chunks - 1) / chunks : 0;
    if (chunks) chunks = (rows + chunk - 1) / chunk;
    double *scr = NULL;
    DT_TRY(cuda_alloc_uninit(b, (size_t)(2 * rows + chunks * n) * sizeof(double),
                             reinterpret_cast<void **>(&scr)));
    double *inv = scr, *k3 = scr + rows, *part = scr + 2 * rows;
    const unsigned gx = (unsigned)((n + 255) / 256 < 64 ? (n + 255) / 256 : 64);
    dt_status st;
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(rmsnorm_bwd_rows_kernel<T>, row_grid(im, rows), row_threads(n),
                                  0, im->compute, static_cast<const T *>(x),
                                  static_cast<const T *>(w), static_cast<const T *>(dy), rows, n,
                                  eps, inv, k3));
    DT_TRY_GOTO(st, launched(b, op, "rmsnorm_bwd_rows_kernel"), out);
    if (dw) {
        FLOAT_DISPATCH(dtype, T,
                       dt_cuda_launch(rmsnorm_bwd_dw_part_kernel<T>, dim3(gx, (unsigned)chunks),
                                      256, 0, im->compute, static_cast<const T *>(x),
                                      static_cast<const T *>(dy), rows, n, chunk,
                                      static_cast<const double *>(inv), part));
        DT_TRY_GOTO(st, launched(b, op, "rmsnorm_bwd_dw_part_kernel"), out);
        FLOAT_DISPATCH(dtype, T,
                       dt_cuda_launch(rmsnorm_bwd_dw_kernel<T>, grid_for(im, n, 256), 256, 0,
                                      im->compute, static_cast<const double *>(part), chunks, n,
                                      static_cast<T *>(dw), acc));
        DT_TRY_GOTO(st, launched(b, op, "rmsnorm_bwd_dw_kernel"), out);
    }
    /* last: dx may be dy or x */
    if (dx) {
        FLOAT_DISPATCH(dtype, T,
                       dt_cuda_launch(rmsnorm_bwd_dx_kernel<T>, grid_for(im, rows * n, 256), 256, 0,
                                      im->compute, static_cast<const T *>(x),
                                      static_cast<const T *>(w), static_cast<const T *>(dy),
                                      static_cast<T *>(dx), rows, n,
                                      static_cast<const double *>(inv),
                                      static_cast<const double *>(k3), acc));
        DT_TRY_GOTO(st, launched(b, op, "rmsnorm_bwd_dx_kernel"), out);
    }
out:
    cuda_free(b, scr);   /* stream-ordered: reused only by work queued after these */
    return st;
}

dt_status cuda_rotary_inverse(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows,
                              int64_t inner, int64_t d, const int64_t *positions,
                              int64_t pos_stride, double base, dt_rotary_style style,
                              const void *x, void *out) {
    return rotary_run(b, "rotary inverse", -1.0, dtype, outer, rows, inner, d, positions,
                      pos_stride, base, style, x, out);
}

namespace {

/* The arguments of embedding and embedding_backward: tok and the [n, d]
 * buffer (out, dy) are needed for n > 0, the table for rows > 0. */
dt_status embedding_args(const dt_backend *b, const char *op, dt_dtype dtype, int64_t n,
                         int64_t d, const int32_t *tok, int64_t rows, const void *rows_nd,
                         const void *table) {
    DT_TRY(check_float(b, op, dtype));
    if (n < 0 || d < 0 || rows < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: negative size n %" PRId64 " d %" PRId64
                        " rows %" PRId64, b->rank, op, n, d, rows);
    if (d > 0 && ((n > 0 && (tok == NULL || rows_nd == NULL)) || (rows > 0 && table == NULL)))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, op);
    return DT_SUCCESS;
}

/* The arguments of the cross-entropy calls (`present`: every buffer the
 * call needs is there). */
dt_status ce_args(const dt_backend *b, const char *op, dt_dtype dtype, int64_t rows, int64_t n,
                  int present) {
    DT_TRY(check_float(b, op, dtype));
    if (rows < 0 || n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: negative size rows %" PRId64 " n %" PRId64, b->rank,
                        op, rows, n);
    if (rows > 0 && !present)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, op);
    return DT_SUCCESS;
}

} /* namespace */

dt_status cuda_embedding(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d, const int32_t *tok,
                         int64_t lo, int64_t rows, const void *table, void *out) {
    DT_TRY(embedding_args(b, "embedding", dtype, n, d, tok, rows, out, table));
    if (n == 0 || d == 0) return DT_SUCCESS;
    DT_TRY(enter(b, "embedding"));
    cuda_impl *im = impl_of(b);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(embedding_kernel<T>, grid_for(im, n * d, 256), 256, 0,
                                  im->compute, tok, static_cast<const T *>(table),
                                  static_cast<T *>(out), n, d, lo, rows));
    CU_LAUNCHED(b, "embedding", "embedding_kernel");
    return DT_SUCCESS;
}

dt_status cuda_embedding_backward(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d,
                                  const int32_t *tok, int64_t lo, int64_t rows, const void *dy,
                                  void *dtable, int accumulate) {
    const char *op = "embedding backward";
    DT_TRY(embedding_args(b, op, dtype, n, d, tok, rows, dy, dtable));
    if (d == 0 || rows == 0 || (n == 0 && accumulate)) return DT_SUCCESS;
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    const int64_t cells = rows * d;
    if (n == 0) return cuda_zero(b, dtable, (size_t)cells * dt_dtype_size(dtype));
    if (dtype == DT_F32) {
        /* the atomics add into the gradient itself */
        if (!accumulate) DT_TRY(cuda_zero(b, dtable, (size_t)cells * sizeof(float)));
        dt_cuda_launch(embedding_bwd_kernel<float>, grid_for(im, n * d, 256), 256, 0, im->compute,
                       tok, static_cast<const float *>(dy), static_cast<float *>(dtable), n, d,
                       lo, rows);
        CU_LAUNCHED(b, op, "embedding_bwd_kernel");
        return DT_SUCCESS;
    }
    /* 16-bit: an fp32 copy of the table (or zeros), the atomics, one rounding */
    float *acc = NULL;
    DT_TRY(cuda_alloc_uninit(b, (size_t)cells * sizeof(float), reinterpret_cast<void **>(&acc)));
    const unsigned gc = grid_for(im, cells, 256), gt = grid_for(im, n * d, 256);
    dt_status st;
    if (!accumulate) {
        DT_TRY_GOTO(st, cuda_zero(b, acc, (size_t)cells * sizeof(float)), out);
    } else {
        FLOAT_DISPATCH(dtype, T,
                       dt_cuda_launch(convert_kernel<T, float>, gc, 256, 0, im->compute,
                                      static_cast<const T *>(dtable), acc, cells));
        DT_TRY_GOTO(st, launched(b, op, "convert_kernel"), out);
    }
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(embedding_bwd_kernel<T>, gt, 256, 0, im->compute, tok,
                                  static_cast<const T *>(dy), acc, n, d, lo, rows));
    DT_TRY_GOTO(st, launched(b, op, "embedding_bwd_kernel"), out);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(convert_kernel<float, T>, gc, 256, 0, im->compute,
                                  static_cast<const float *>(acc), static_cast<T *>(dtable),
                                  cells));
    DT_TRY_GOTO(st, launched(b, op, "convert_kernel"), out);
out:
    cuda_free(b, acc);   /* stream-ordered: reused only by work queued after these */
    return st;
}

dt_status cuda_i32_check(dt_backend *b, int64_t n, const int32_t *x, int64_t limit,
                         int32_t ignore, int64_t *valid, int64_t *bad) {
    const char *op = "i32_check";
    if (n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: negative count %" PRId64,
                        b->rank, op, n);
    if (valid == NULL || bad == NULL || (n > 0 && x == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, op);
    if (n == 0) {
        *valid = 0;
        *bad = -1;
        return DT_SUCCESS;
    }
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    const unsigned grid = red_grid(im, n);
    int64_t host[2 * RED_BLOCKS];
    DT_TRY(reduce_to_host(b, op, 2 * grid * sizeof(int64_t), host, [&](void *part) -> dt_status {
        dt_cuda_launch(i32_check_kernel, grid, RED_THREADS, 0, im->compute, x, n, limit, ignore,
                       static_cast<int64_t *>(part));
        CU_LAUNCHED(b, op, "i32_check_kernel");
        return DT_SUCCESS;
    }));
    int64_t nv = 0, first = INT64_MAX;
    for (unsigned k = 0; k < grid; k++) {
        nv += host[2 * k];
        if (host[2 * k + 1] < first) first = host[2 * k + 1];
    }
    *valid = nv;
    *bad = first == INT64_MAX ? -1 : first;
    return DT_SUCCESS;
}

dt_status cuda_ce_max(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                      float *m) {
    DT_TRY(ce_args(b, "ce_max", dtype, rows, n, m != NULL && (n == 0 || x != NULL)));
    if (rows == 0) return DT_SUCCESS;
    DT_TRY(enter(b, "ce_max"));
    cuda_impl *im = impl_of(b);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(ce_max_kernel<T>, row_grid(im, rows), row_threads(n), 0,
                                  im->compute, static_cast<const T *>(x), rows, n, m));
    CU_LAUNCHED(b, "ce_max", "ce_max_kernel");
    return DT_SUCCESS;
}

dt_status cuda_ce_sum(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                      const float *m, const int32_t *tgt, int64_t lo, float *se, float *tl) {
    DT_TRY(ce_args(b, "ce_sum", dtype, rows, n, m && tgt && se && tl && (n == 0 || x != NULL)));
    if (rows == 0) return DT_SUCCESS;
    DT_TRY(enter(b, "ce_sum"));
    cuda_impl *im = impl_of(b);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(ce_sum_kernel<T>, row_grid(im, rows), row_threads(n), 0,
                                  im->compute, static_cast<const T *>(x), m, tgt, rows, n, lo, se,
                                  tl));
    CU_LAUNCHED(b, "ce_sum", "ce_sum_kernel");
    return DT_SUCCESS;
}

dt_status cuda_ce_grad(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                       const float *m, const float *se, const float *tl, const int32_t *tgt,
                       int64_t lo, int32_t ignore, float scale, void *dx, float *loss) {
    DT_TRY(ce_args(b, "ce_grad", dtype, rows, n,
                   m && se && tl && tgt && loss && (n == 0 || dx == NULL || x != NULL)));
    if (rows == 0) return DT_SUCCESS;
    DT_TRY(enter(b, "ce_grad"));
    cuda_impl *im = impl_of(b);
    const unsigned grid = grid_for(im, rows * (dx && n > 0 ? n : 1), 256);
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(ce_grad_kernel<T>, grid, 256, 0, im->compute,
                                  static_cast<const T *>(x), m, se, tl, tgt, rows, n, lo, ignore,
                                  scale, static_cast<T *>(dx), loss));
    CU_LAUNCHED(b, "ce_grad", "ce_grad_kernel");
    return DT_SUCCESS;
}

/* The arguments of a reduction to one host value: a float dtype, n >= 0,
 * out set, x set when n > 0. */
static dt_status check_reduction(dt_backend *b, const char *op, dt_dtype dtype, int64_t n,
                                 const void *x, const void *out) {
    DT_TRY(check_float(b, op, dtype));
    if (n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: negative count %" PRId64,
                        b->rank, op, n);
    if (out == NULL || (n > 0 && x == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, op);
    return DT_SUCCESS;
}

dt_status cuda_absmax(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, float *out) {
    const char *op = "absmax";
    DT_TRY(check_reduction(b, op, dtype, n, x, out));
    if (n == 0) {
        *out = 0.0f;
        return DT_SUCCESS;
    }
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    const unsigned grid = red_grid(im, n);
    float host[RED_BLOCKS];
    DT_TRY(reduce_to_host(b, op, grid * sizeof(float), host, [&](void *part) -> dt_status {
        FLOAT_DISPATCH(dtype, T,
                       dt_cuda_launch(absmax_kernel<T>, grid, RED_THREADS, 0, im->compute,
                                      static_cast<const T *>(x), n, static_cast<float *>(part)));
        CU_LAUNCHED(b, op, "absmax_kernel");
        return DT_SUCCESS;
    }));
    float v = 0.0f;
    for (unsigned k = 0; k < grid; k++) v = host[k] > v || host[k] != host[k] ? host[k] : v;
    *out = v;   /* NaN once a partial is (a NaN v stays: NaN > x is false, NaN != NaN) */
    return DT_SUCCESS;
}

dt_status cuda_sumsq(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, double *out) {
    const char *op = "sumsq";
    DT_TRY(check_reduction(b, op, dtype, n, x, out));
    if (n == 0) {
        *out = 0.0;
        return DT_SUCCESS;
    }
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    const unsigned grid = red_grid(im, n);
    double host[RED_BLOCKS];
    DT_TRY(reduce_to_host(b, op, grid * sizeof(double), host, [&](void *part) -> dt_status {
        FLOAT_DISPATCH(dtype, T,
                       dt_cuda_launch(sumsq_kernel<T>, grid, RED_THREADS, 0, im->compute,
                                      static_cast<const T *>(x), n, static_cast<double *>(part)));
        CU_LAUNCHED(b, op, "sumsq_kernel");
        return DT_SUCCESS;
    }));
    double s = 0.0;
    for (unsigned k = 0; k < grid; k++) s += host[k];
    *out = s;
    return DT_SUCCESS;
}

dt_status cuda_convert(dt_backend *b, int64_t n, dt_dtype src_dtype, const void *src,
                       dt_dtype dst_dtype, void *dst) {
    const char *op = "convert";
    const int fs = src_dtype == DT_F32 || src_dtype == DT_BF16 || src_dtype == DT_F16;
    const int fd = dst_dtype == DT_F32 || dst_dtype == DT_BF16 || dst_dtype == DT_F16;
    if (!dt_dtype_valid(src_dtype) || !dt_dtype_valid(dst_dtype) ||
        (src_dtype != dst_dtype && (!fs || !fd)))
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "rank %d: cuda %s: %s to %s is not supported (float dtypes, or equal ones)",
                        b->rank, op, dt_dtype_name(src_dtype), dt_dtype_name(dst_dtype));
    if (n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: negative count %" PRId64,
                        b->rank, op, n);
    if (n > 0 && (src == NULL || dst == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, op);
    if (n == 0) return DT_SUCCESS;
    if (src_dtype == dst_dtype) return cuda_copy(b, dst, src, (size_t)n * dt_dtype_size(src_dtype));
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    const unsigned grid = grid_for(im, n, 256);
    FLOAT_DISPATCH(src_dtype, S, FLOAT_DISPATCH(dst_dtype, D,
                   dt_cuda_launch(convert_kernel<S, D>, grid, 256, 0, im->compute,
                                  static_cast<const S *>(src), static_cast<D *>(dst), n)));
    CU_LAUNCHED(b, op, "convert_kernel");
    return DT_SUCCESS;
}

/* The constants as backend_cpu.c's dt_cpu_adamw forms them (host double,
 * rounded to fp32), so that both backends compute the same step. */
dt_status cuda_adamw(dt_backend *b, dt_dtype dtype, int64_t n, void *param, float *master,
                     float *m, float *v, const void *grad, float gscale, float lr, float b1,
                     float b2, float eps, float wd, int64_t step) {
    const char *op = "adamw";
    DT_TRY(check_float(b, op, dtype));
    if (n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: negative count %" PRId64,
                        b->rank, op, n);
    if (!isfinite(lr) || !(b1 >= 0.0f && b1 < 1.0f) || !(b2 >= 0.0f && b2 < 1.0f) ||
        !(eps >= 0.0f && isfinite(eps)) || !(wd >= 0.0f && isfinite(wd)) || step < 1)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "rank %d: cuda %s: lr %g, betas %g %g, eps %g, weight decay %g, step %" PRId64
                        " (lr finite, betas in [0, 1), eps and weight decay finite and >= 0, "
                        "step >= 1)", b->rank, op, (double)lr, (double)b1, (double)b2,
                        (double)eps, (double)wd, step);
    if (n > 0 && (param == NULL || master == NULL || m == NULL || v == NULL || grad == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda %s: NULL buffer", b->rank, op);
    if (n == 0) return DT_SUCCESS;
    DT_TRY(enter(b, op));
    cuda_impl *im = impl_of(b);
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    const float omb1 = (float)(1.0 - (double)b1), omb2 = (float)(1.0 - (double)b2);
    const float step_size = (float)((double)lr / (1.0 - pow((double)b1, (double)step)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow((double)b2, (double)step));
    FLOAT_DISPATCH(dtype, T,
                   dt_cuda_launch(adamw_kernel<T>, grid_for(im, n, 256), 256, 0, im->compute,
                                  static_cast<T *>(param), master, m, v,
                                  static_cast<const T *>(grad), n, gscale, b1, b2, omb1, omb2,
                                  decay, step_size, bc2_sqrt, eps));
    CU_LAUNCHED(b, op, "adamw_kernel");
    return DT_SUCCESS;
}

} /* namespace dt_cuda */

/* ---------------------------------------------------------------- public */

using namespace dt_cuda;

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
