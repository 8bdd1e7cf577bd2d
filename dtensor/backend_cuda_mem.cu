/* dtensor/backend_cuda_mem.cu — the device-memory hooks (dt_mem_ops,
 * collectives/transport.h) through which the transports hold, move and
 * reduce a CUDA rank's buffers: alloc and free (the caching allocator's),
 * copy, publish, mark, reduce and finish.
 *
 * Peers read this rank's buffers from other threads: copy, reduce and finish
 * wait (bounded by the rank's timeout) for the work they queue, and publish
 * for all the rank's queued work, before they return. Copies run on the
 * communication stream, not the compute stream: the work that touched the
 * buffers before is either done (publish) or marked (mark: an event on the
 * communication stream after the compute stream's queued work), and a copy
 * between device buffers waits for the marks on the device, so a ring step's
 * copy of the next block runs beside the kernel the rank has just launched
 * on the block it holds; with host memory on one side the host waits for
 * them instead. A same-device copy runs in a few CTAs (comm_ctas) where the
 * addresses allow. Reductions accumulate in fp32, like the host hooks (sum
 * in rank order; max lets NaN win); finish rounds once to bf16 or fp16.
 *
 * Test: tests/test_cuda.c, test_collectives, test_long_copies and test_ring
 * (make test; skipped without a GPU; also over the emulated NCCL: make
 * CUDA=emu test).
 */
#include "backend_cuda_impl.cuh"
#include "../base/cuda_launch.cuh"

#include <math.h>
#include <string.h>

namespace dt_cuda {
namespace {

/* Device of a pointer, or -1 for host memory (pageable or pinned). */
int device_of(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
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
            DT_TRY(wait_event(b, ev, "transport copy", "the work before a copy"));
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

/* Device memory: the absmax kernel says whether to look (no copy when all is
 * finite); then the values come to the host and are scanned. */
dt_status mem_find_nonfinite(void *arg, const void *x, size_t n, dt_dtype dtype, int64_t *first) {
    dt_backend *b = backend_of(arg);
    *first = -1;
    if (n == 0) return DT_SUCCESS;
    const size_t bytes = n * dt_dtype_size(dtype);
    const void *host = x;
    void *copy = NULL;
    if (device_of(x) >= 0) {
        float m = 0.0f;
        DT_TRY(cuda_absmax(b, dtype, (int64_t)n, x, &m));
        if (isfinite(m)) return DT_SUCCESS;
        copy = malloc(bytes);
        if (!copy) return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: out of host memory", b->rank);
        dt_status st = cuda_download(b, copy, x, bytes);
        if (st != DT_SUCCESS) {
            free(copy);
            return st;
        }
        host = copy;
    } else {
        DT_TRY(wait_all(b, "transport check"));   /* queued work may still write it */
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dt_value_get(host, dtype, i))) {
            *first = (int64_t)i;
            break;
        }
    free(copy);
    return DT_SUCCESS;
}

const dt_mem_ops cuda_mem_ops = {
    "cuda",     mem_alloc,  mem_free,   mem_copy,           mem_publish,
    mem_mark,   mem_reduce, mem_finish, mem_find_nonfinite,
};

} /* namespace */
} /* namespace dt_cuda */

/* ---------------------------------------------------------------- public */

extern "C" dt_mem dt_backend_cuda_mem(dt_backend *b) {
    dt_mem m = {&dt_cuda::cuda_mem_ops, b};
    return m;
}
