/* dtensor/backend_cuda_impl.cuh — PRIVATE. What the CUDA backend's sources
 * share: backend_cuda.cu (the table, create and destroy, errors, bounded
 * waits, accessors), backend_cuda_alloc.cu (the caching allocator and the
 * pool), backend_cuda_ops.cu (the ops and their kernels) and
 * backend_cuda_mem.cu (the transports' device-memory hooks). Here: a rank's
 * state (cuda_impl), the error mapping and its check macros, the bounded
 * waits, the allocator's entries, the ops the table and the hooks share,
 * grid sizes and the element conversions of the kernels.
 *
 * Every function here belongs to namespace dt_cuda; each file keeps its own
 * helpers and kernels in an anonymous namespace. CUDA C++ only.
 */
#ifndef DT_BACKEND_CUDA_IMPL_CUH
#define DT_BACKEND_CUDA_IMPL_CUH

#include "backend_cuda.h"
#include "context.h"   /* dt_memory_stats */

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

namespace dt_cuda {

/* Device blocks of the caching allocator (backend_cuda_alloc.cu). */
struct dev_block {
    void *p;
    size_t bytes;
};
struct dev_blocks {
    dev_block *v;
    size_t n, cap;
};

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
    /* memory counters (the rank's thread only): bytes of the allocator's
     * live blocks, their most, cudaMalloc calls (scratch growth included) */
    size_t in_use, peak;
    uint64_t mallocs;
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
/* ------------------------------------------------- errors (backend_cuda.cu) */

/* "rank R: cuda OP: CALL failed on device D: <CUDA's message> (<name>)".
 * `call` may be a whole expression; only the function name is kept. A
 * sticky error marks the backend failed. */
dt_status cuda_error(const dt_backend *b, const char *op, const char *call, cudaError_t e);
dt_status cublas_error(const dt_backend *b, const char *op, const char *call, cublasStatus_t s);

#define CU_TRY(b, op, call)                                                   \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) return dt_cuda::cuda_error((b), (op), #call, e_); \
    } while (0)

/* After every kernel launch. */
#define CU_LAUNCHED(b, op, kernel)                                            \
    do {                                                                      \
        cudaError_t e_ = cudaGetLastError();                                  \
        if (e_ != cudaSuccess) return dt_cuda::cuda_error((b), (op), kernel, e_); \
    } while (0)

/* ------------------------------------------- bounded waits (backend_cuda.cu) */

/* Makes the backend's device current for the calling thread. */
dt_status enter(const dt_backend *b, const char *op);
/* Polls until the stream is idle; bounded by the timeout. */
dt_status wait_stream(const dt_backend *b, cudaStream_t s, const char *op);
/* Polls until the event has completed; bounded by the timeout. `what` names
 * the work it follows, for messages. */
dt_status wait_event(const dt_backend *b, cudaEvent_t ev, const char *op, const char *what);
/* Both streams (compute, then communication). */
dt_status wait_all(const dt_backend *b, const char *op);

/* -------------------------------------- allocation (backend_cuda_alloc.cu) */

dt_status cuda_alloc(dt_backend *b, size_t bytes, void **out);
dt_status cuda_alloc_uninit(dt_backend *b, size_t bytes, void **out);
void cuda_free(dt_backend *b, void *p);
dt_status cuda_memory(dt_backend *b, dt_memory_stats *out, int what);
/* Frees every cached block, after draining the rank's streams (queued work
 * may still use them). */
dt_status cache_flush(dt_backend *b, const char *op);
/* b joins its pool (im->pool): 0 if there is no host memory for it. */
int pool_join(dt_backend *b);
/* b leaves its pool, if it joined: no other rank reclaims its cache after. */
void pool_leave(dt_backend *b);
/* Grows a device scratch to `need` bytes (contents not kept). The old one
 * may still be read by queued work: drain first. */
dt_status grow_device(const dt_backend *b, void **p, size_t *bytes, size_t need, const char *op);

/* ---------------------------------------------- ops (backend_cuda_ops.cu) */

dt_status cuda_upload(dt_backend *b, void *dst, const void *host, size_t bytes);
dt_status cuda_download(dt_backend *b, void *host, const void *src, size_t bytes);
dt_status cuda_copy(dt_backend *b, void *dst, const void *src, size_t bytes);
dt_status cuda_zero(dt_backend *b, void *p, size_t bytes);
dt_status cuda_copy_runs(dt_backend *b, const dt_runs *r);
dt_status cuda_gemm(dt_backend *b, dt_dtype dtype, int64_t m, int64_t n, int64_t k,
                    const void *a, const void *bm, void *c);
dt_status cuda_add(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, const void *y,
                   void *out);
dt_status cuda_add_beside(dt_backend *b, dt_dtype dtype, int64_t n, const float *x,
                          const float *y, void *out);
dt_status cuda_gelu(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, void *out,
                    dt_gelu_approx approx);
dt_status cuda_rmsnorm(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                       const void *w, float eps, void *out);
dt_status cuda_rotary(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows, int64_t inner,
                      int64_t d, const int64_t *positions, int64_t pos_stride, double base,
                      dt_rotary_style style, const void *x, void *out);
/* Gradients, losses and the optimizer (backend.h's contracts). */
dt_status cuda_gemm_ex(dt_backend *b, dt_dtype dtype, int trans_a, int trans_b, int64_t m,
                       int64_t n, int64_t k, float alpha, const void *a, const void *bm, float beta,
                       void *c);
dt_status cuda_gelu_backward(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                             const void *dy, void *dx, dt_gelu_approx approx, int accumulate);
dt_status cuda_swiglu(dt_backend *b, dt_dtype dtype, int64_t n, const void *gate, const void *up,
                      void *out);
dt_status cuda_swiglu_backward(dt_backend *b, dt_dtype dtype, int64_t n, const void *gate,
                               const void *up, const void *dy, void *dgate, void *dup,
                               int accumulate);
dt_status cuda_rmsnorm_backward(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                                const void *x, const void *w, float eps, const void *dy, void *dx,
                                void *dw, int accumulate);
dt_status cuda_rotary_inverse(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows,
                              int64_t inner, int64_t d, const int64_t *positions,
                              int64_t pos_stride, double base, dt_rotary_style style,
                              const void *x, void *out);
dt_status cuda_embedding(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d, const int32_t *tok,
                         int64_t lo, int64_t rows, const void *table, void *out);
dt_status cuda_embedding_backward(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d,
                                  const int32_t *tok, int64_t lo, int64_t rows, const void *dy,
                                  void *dtable, int accumulate);
dt_status cuda_i32_check(dt_backend *b, int64_t n, const int32_t *x, int64_t limit,
                         int32_t ignore, int64_t *valid, int64_t *bad);
dt_status cuda_ce_max(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                      float *m);
dt_status cuda_ce_sum(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                      const float *m, const int32_t *tgt, int64_t lo, float *se, float *tl);
dt_status cuda_ce_grad(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                       const float *m, const float *se, const float *tl, const int32_t *tgt,
                       int64_t lo, int32_t ignore, float scale, void *dx, float *loss);
dt_status cuda_absmax(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, float *out);
dt_status cuda_sumsq(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, double *out);
dt_status cuda_convert(dt_backend *b, int64_t n, dt_dtype src_dtype, const void *src,
                       dt_dtype dst_dtype, void *dst);
dt_status cuda_adamw(dt_backend *b, dt_dtype dtype, int64_t n, void *param, float *master,
                     float *m, float *v, const void *grad, float gscale, float lr, float b1,
                     float b2, float eps, float wd, int64_t step);
/* DT_ERR_INVALID_ARGUMENT if x or y is NULL with bytes > 0. */
dt_status check_buffers(const dt_backend *b, const char *op, const void *x, const void *y,
                        size_t bytes);
/* The communication stream's next work waits, on the device, for the
 * compute stream's work queued so far (add_beside, mem_mark). */
dt_status comm_after_compute(dt_backend *b, const char *what);

/* ------------------------------------------------------------- grid sizes */

/* Blocks of `threads` for n elements, at most sms * 32 (the kernels stride
 * over the rest). */
inline unsigned grid_for(const cuda_impl *im, int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    int64_t cap = (int64_t)im->sms * 32;
    return (unsigned)(blocks < cap ? blocks : (cap > 0 ? cap : 1));
}

/* CTAs of a communication-stream kernel (comm_ctas > 0) over n units,
 * `round` a CTA's round: as many as the rounds need, at most comm_ctas. */
inline unsigned comm_grid(const cuda_impl *im, int64_t n, int64_t round) {
    const int64_t need = (n + round - 1) / round;
    return (unsigned)(need < im->comm_ctas ? need : im->comm_ctas);
}

/* The communication stream's kernels in a few CTAs
 * (dt_backend_cuda_set_comm_ctas; add_round_comm_kernel in
 * backend_cuda_ops.cu and the transport's copy_kernel in
 * backend_cuda_mem.cu): COMM_THREADS threads, each with COMM_UNROLL
 * 16-byte loads in flight (of its one input, or half as many of each of
 * two; a block's width apart, all before the stores): 128 KiB a CTA, for
 * one CTA to move more than an SM's share of the memory's bandwidth (4
 * TB/s / 132 SMs = 30 GB/s; measured: docs/PERFORMANCE.md).
 * The default count is DT_CUDA_COMM_CTAS shared by the ranks on a GPU
 * (backend_cuda.h). Cache-streaming loads and stores (evicted first): the
 * work passes through L2 without pushing out the tiles the kernel beside
 * it reuses. */
inline constexpr int COMM_THREADS = 1024, COMM_UNROLL = 8;

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

} /* namespace dt_cuda */

#endif /* DT_BACKEND_CUDA_IMPL_CUH */
