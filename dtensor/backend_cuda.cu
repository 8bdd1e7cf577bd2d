/* dtensor/backend_cuda.cu — the CUDA compute backend (backend_cuda.h): its
 * table (cuda_ops), create and destroy, the errors and the bounded waits,
 * the public accessors, sync and the profiling marks. The caching allocator
 * is in backend_cuda_alloc.cu, the ops and their kernels in
 * backend_cuda_ops.cu, the transports' device-memory hooks (dt_mem) in
 * backend_cuda_mem.cu; what they share in backend_cuda_impl.cuh.
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
 * Test: tests/test_cuda.c (make test; skipped without a GPU).
 */
#include "backend_cuda_impl.cuh"
#include "../base/backoff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace dt_cuda {
namespace {

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

} /* namespace */

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

/* Makes the backend's device current for the calling thread. */
dt_status enter(const dt_backend *b, const char *op) {
    int cur = -1;
    CU_TRY(b, op, cudaGetDevice(&cur));
    if (cur != impl_of(b)->device) CU_TRY(b, op, cudaSetDevice(impl_of(b)->device));
    return DT_SUCCESS;
}

/* Polls until the stream is idle; bounded by the timeout. */
dt_status wait_stream(const dt_backend *b, cudaStream_t s, const char *op) {
    return poll_until(b, op, "cudaStreamQuery", "work queued",
                      [s] { return cudaStreamQuery(s); });
}

dt_status wait_event(const dt_backend *b, cudaEvent_t ev, const char *op, const char *what) {
    return poll_until(b, op, "cudaEventQuery", what, [ev] { return cudaEventQuery(ev); });
}

dt_status wait_all(const dt_backend *b, const char *op) {
    DT_TRY(wait_stream(b, impl_of(b)->compute, op));
    return wait_stream(b, impl_of(b)->comm, op);
}

namespace {

/* --------------------------------------------------------------- the table */

/* The handle's math mode. cuBLAS may otherwise do the split-K reductions of
 * bf16 / fp16 gemms in the output type; the contract is fp32 accumulation. */
cublasMath_t math_mode(int tf32) {
    return static_cast<cublasMath_t>((tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

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
    for (int k : {i, j}) DT_TRY(wait_event(b, im->marks[k], "mark", "a profiling mark"));
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
    cuda_gemm_ex,    cuda_gelu_backward, cuda_swiglu, cuda_swiglu_backward, cuda_rmsnorm_backward,
    cuda_rotary_inverse, cuda_embedding, cuda_embedding_backward, cuda_i32_check, cuda_ce_max,
    cuda_ce_sum,     cuda_ce_grad, cuda_absmax,   cuda_sumsq, cuda_convert, cuda_adamw,
    cuda_memory,
};

} /* namespace */
} /* namespace dt_cuda */

/* ---------------------------------------------------------------- public */

using namespace dt_cuda;

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
