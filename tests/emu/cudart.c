/* tests/emu/cudart.c — the CUDA runtime and cuBLAS, host side, emulated on
 * the CPU (include/cuda_runtime_api.h, include/cublas_v2.h), so that
 * dtensor's CUDA backend runs in `make test` without a GPU; its kernels run
 * on the fiber emulator (emu.h). Test: tests/test_emu_cudart.c.
 *
 * The model: DT_EMU_DEVICES devices (1 when unset; 0, or anything but a
 * number up to 64, means none), each an H100-like compute capability 9.0
 * part with 132 SMs and 227 KiB of opt-in shared memory per block, whose
 * memory is host memory. Where this differs from a GPU:
 *   - Every stream operation (copies, memsets, gemms; kernel launches, by
 *     the launch path) runs to completion in the calling thread before the
 *     call returns: streams never overlap, cudaStreamQuery and
 *     cudaEventQuery always answer cudaSuccess, and an event's timestamp
 *     (host monotonic clock) is taken when it is recorded.
 *   - Device memory is 256-byte aligned host memory, filled with 0xcd bytes
 *     when allocated (cudaHostAlloc's is not filled); a device holds
 *     min(80 GiB, half the host's RAM), and cudaMalloc beyond that fails
 *     with cudaErrorMemoryAllocation. Every allocation is in one table, so
 *     pointers are checked: cudaFree / cudaFreeHost reject pointers they did
 *     not return, and a copy, memset or gemm operand that starts inside an
 *     allocation must end inside it; the device side of an explicitly
 *     directed copy, memsets and gemm operands must be memory CUDA knows
 *     (cudaMalloc, or pinned host memory as with unified addressing).
 *   - A failed launch (dt_emu_cuda_set_launch_error) sets the thread's last
 *     error to cudaErrorLaunchFailure like any other error: it does not
 *     poison the device for every later call as it does on a GPU.
 *   - cudaFuncSetAttribute only checks its value against the device limits.
 *   - cublasGemmEx computes in full fp32 whatever the compute type (no TF32
 *     rounding of inputs) with OpenBLAS sgemm on fp32 copies of 16-bit
 *     operands; a 16-bit C is rounded once, at the end. The algo is ignored.
 *
 * Thread-safe: one mutex guards the allocation table and event timestamps;
 * the last error and the current device are per thread, as in CUDA. Also
 * compiles as C++ (g++ -x c++), like the CUDA sources that call it. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "cudart_emu.h"
#include "dtensor/dtype.h"
#include "include/cublas_v2.h"
#include "include/cuda_runtime_api.h"

#ifdef __cplusplus
#define DT_TLS thread_local
#else
#define DT_TLS _Thread_local
#endif

#define EMU_MAX_DEVICES 64
#define EMU_SMS 132
#define EMU_SMEM_OPTIN (227 * 1024)
#define EMU_ALIGN 256
#define EMU_GARBAGE 0xcd

#define STREAM_MAGIC 0x7374726du   /* "strm" */
#define EVENT_MAGIC 0x6576656eu    /* "even" */
#define BLAS_MAGIC 0x626c6173u     /* "blas" */

/* ------------------------------------------------------------------ errors */

static DT_TLS cudaError_t tl_error = cudaSuccess;
static DT_TLS int tl_device = 0;
static DT_TLS char tl_launch_msg[512];

#define ERR(code, text) {code, #code, text}
static const struct {
    cudaError_t code;
    const char *name, *text;
} cuda_errors[] = {
    /* The strings of libcudart 13. */
    ERR(cudaSuccess, "no error"),
    ERR(cudaErrorInvalidValue, "invalid argument"),
    ERR(cudaErrorMemoryAllocation, "out of memory"),
    ERR(cudaErrorInitializationError, "initialization error"),
    ERR(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    ERR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    ERR(cudaErrorInvalidDeviceFunction, "invalid device function"),
    ERR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    ERR(cudaErrorInvalidDevice, "invalid device ordinal"),
    ERR(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered"),
    ERR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    ERR(cudaErrorNotReady, "device not ready"),
    ERR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    ERR(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    ERR(cudaErrorAssert, "device-side assert triggered"),
    ERR(cudaErrorHardwareStackError, "hardware stack error"),
    ERR(cudaErrorIllegalInstruction, "an illegal instruction was encountered"),
    ERR(cudaErrorMisalignedAddress, "misaligned address"),
    ERR(cudaErrorInvalidAddressSpace, "operation not supported on global/shared address space"),
    ERR(cudaErrorInvalidPc, "invalid program counter"),
    ERR(cudaErrorLaunchFailure, "unspecified launch failure"),
    ERR(cudaErrorNotSupported, "operation not supported"),
    ERR(cudaErrorUnknown, "unknown error"),
};

/* A failing call returns its code through here: it becomes the thread's last error. */
static cudaError_t fail(cudaError_t e) {
    tl_error = e;
    return e;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = tl_error;
    tl_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return tl_error; }

const char *cudaGetErrorString(cudaError_t error) {
    for (size_t i = 0; i < sizeof cuda_errors / sizeof cuda_errors[0]; i++)
        if (cuda_errors[i].code == error) return cuda_errors[i].text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error) {
    for (size_t i = 0; i < sizeof cuda_errors / sizeof cuda_errors[0]; i++)
        if (cuda_errors[i].code == error) return cuda_errors[i].name;
    return "unrecognized error code";
}

void dt_emu_cuda_set_launch_error(const char *msg) {
    snprintf(tl_launch_msg, sizeof tl_launch_msg, "%s", msg && *msg ? msg : "(no message)");
    fprintf(stderr, "CUDA emulator: kernel launch failed: %s\n", tl_launch_msg);
    tl_error = cudaErrorLaunchFailure;
}

const char *dt_emu_cuda_launch_error(void) { return tl_launch_msg; }

/* ----------------------------------------------------------------- devices */

static int device_count(void) {
    const char *s = getenv("DT_EMU_DEVICES");
    if (!s || !*s) return 1;
    char *end;
    errno = 0;
    long n = strtol(s, &end, 10);
    return errno || *end || n < 0 || n > EMU_MAX_DEVICES ? 0 : (int)n;
}

static cudaError_t check_device(int device) {
    int n = device_count();
    if (n == 0) return cudaErrorNoDevice;
    return device < 0 || device >= n ? cudaErrorInvalidDevice : cudaSuccess;
}

static size_t device_bytes(void) {
    const size_t h100 = (size_t)80 << 30;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t half_ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 2 : h100;
    return half_ram < h100 ? half_ram : h100;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail(cudaErrorInvalidValue);
    *count = device_count();
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    cudaError_t e = check_device(device);
    if (e != cudaSuccess) return fail(e);
    tl_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail(cudaErrorInvalidValue);
    cudaError_t e = check_device(tl_device);
    if (e != cudaSuccess) return fail(e);
    *device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (!value) return fail(cudaErrorInvalidValue);
    cudaError_t e = check_device(device);
    if (e != cudaSuccess) return fail(e);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = EMU_SMS; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = EMU_SMEM_OPTIN; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        return value >= 0 && value <= EMU_SMEM_OPTIN ? cudaSuccess : fail(cudaErrorInvalidValue);
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
    default: return fail(cudaErrorInvalidValue);
    }
}

/* ------------------------------------------------------------------ memory */

/* Every live cudaMalloc / cudaHostAlloc allocation, unordered. */
typedef struct alloc_rec {
    unsigned char *p;
    size_t bytes;
    int device;   /* the device current when it was allocated */
    int host;     /* cudaHostAlloc */
} alloc_rec;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc_rec *g_allocs;
static size_t g_n_allocs, g_cap_allocs;
static size_t g_used[EMU_MAX_DEVICES];   /* cudaMalloc bytes per device */

/* The allocation holding address p, or NULL (g_lock held). */
static alloc_rec *find_locked(const void *p) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < g_n_allocs; i++) {
        uintptr_t lo = (uintptr_t)g_allocs[i].p;
        if (a >= lo && a - lo < g_allocs[i].bytes) return &g_allocs[i];
    }
    return NULL;
}

/* Where [p, p + bytes) lies: 0 outside every allocation, 1 inside a device
 * allocation, 2 inside a pinned host one, -1 starting inside one but
 * running past its end. bytes > 0. */
enum { REGION_PAST_END = -1, REGION_UNKNOWN = 0, REGION_DEVICE = 1, REGION_HOST = 2 };
static int region(const void *p, size_t bytes) {
    pthread_mutex_lock(&g_lock);
    const alloc_rec *r = find_locked(p);
    int where = !r ? REGION_UNKNOWN
                : bytes > r->bytes - (size_t)((const unsigned char *)p - r->p) ? REGION_PAST_END
                : r->host ? REGION_HOST
                          : REGION_DEVICE;
    pthread_mutex_unlock(&g_lock);
    return where;
}

static cudaError_t allocate(void **out, size_t bytes, int host) {
    if (!out) return fail(cudaErrorInvalidValue);
    *out = NULL;
    cudaError_t e = check_device(tl_device);
    if (e != cudaSuccess) return fail(e);
    if (bytes == 0) return cudaSuccess;   /* NULL, as CUDA returns */
    void *p = NULL;
    pthread_mutex_lock(&g_lock);
    if (!host && bytes > device_bytes() - g_used[tl_device]) e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess && g_n_allocs == g_cap_allocs) {
        size_t cap = g_cap_allocs ? 2 * g_cap_allocs : 64;
        alloc_rec *t = (alloc_rec *)realloc(g_allocs, cap * sizeof *t);
        if (t) {
            g_allocs = t;
            g_cap_allocs = cap;
        } else {
            e = cudaErrorMemoryAllocation;
        }
    }
    if (e == cudaSuccess && posix_memalign(&p, EMU_ALIGN, bytes) != 0)
        e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) {
        alloc_rec r = {(unsigned char *)p, bytes, tl_device, host};
        g_allocs[g_n_allocs++] = r;
        if (!host) g_used[tl_device] += bytes;
    }
    pthread_mutex_unlock(&g_lock);
    if (e != cudaSuccess) return fail(e);
    if (!host) memset(p, EMU_GARBAGE, bytes);   /* code that expects zeros shows */
    *out = p;
    return cudaSuccess;
}

static cudaError_t release(void *p, int host) {
    if (!p) return cudaSuccess;
    alloc_rec *r = NULL;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n_allocs && !r; i++)
        if (g_allocs[i].p == p && g_allocs[i].host == host) r = &g_allocs[i];
    if (r) {
        if (!host) g_used[r->device] -= r->bytes;
        *r = g_allocs[--g_n_allocs];
    }
    pthread_mutex_unlock(&g_lock);
    if (!r) return fail(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) { return allocate(devPtr, size, 0); }
cudaError_t cudaFree(void *devPtr) { return release(devPtr, 0); }

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    /* cudaHostAlloc{Default,Portable,Mapped,WriteCombined} all give the same here */
    if (flags & ~0xfu) return fail(cudaErrorInvalidValue);
    return allocate(pHost, size, 1);
}

cudaError_t cudaFreeHost(void *ptr) { return release(ptr, 1); }

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue);
    cudaError_t e = check_device(tl_device);
    if (e != cudaSuccess) return fail(e);
    size_t total = device_bytes();
    pthread_mutex_lock(&g_lock);
    size_t used = g_used[tl_device];
    pthread_mutex_unlock(&g_lock);
    *total_bytes = total;
    *free_bytes = used < total ? total - used : 0;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    if (!attributes) return fail(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = cudaInvalidDeviceId;
    pthread_mutex_lock(&g_lock);
    const alloc_rec *r = find_locked(ptr);
    if (r) {
        attributes->type = r->host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
        attributes->device = r->device;
        /* pinned memory is mapped too, as with unified addressing */
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = r->host ? (void *)ptr : NULL;
    }
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

/* ----------------------------------------------------------------- streams */

struct CUstream_st {
    uint32_t magic;
    unsigned flags;
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    int recorded;   /* g_lock guards recorded and ms */
    double ms;      /* host monotonic clock when last recorded */
};

static cudaError_t check_stream(cudaStream_t s) {
    return !s || s->magic == STREAM_MAGIC ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

static cudaError_t check_event(cudaEvent_t ev) {
    return ev && ev->magic == EVENT_MAGIC ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
    cudaError_t e = check_device(tl_device);
    if (e != cudaSuccess) return fail(e);
    cudaStream_t s = (cudaStream_t)calloc(1, sizeof *s);
    if (!s) return fail(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    s->flags = flags;
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream || check_stream(stream) != cudaSuccess) return fail(cudaErrorInvalidResourceHandle);
    stream->magic = 0;
    free(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    cudaError_t e = check_stream(stream);
    return e == cudaSuccess ? e : fail(e);   /* its work was done when it was enqueued */
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    if (!event || (flags & ~0xfu)) return fail(cudaErrorInvalidValue);
    cudaError_t e = check_device(tl_device);
    if (e != cudaSuccess) return fail(e);
    cudaEvent_t ev = (cudaEvent_t)calloc(1, sizeof *ev);
    if (!ev) return fail(cudaErrorMemoryAllocation);
    ev->magic = EVENT_MAGIC;
    ev->flags = flags;
    *event = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (check_event(event) != cudaSuccess) return fail(cudaErrorInvalidResourceHandle);
    event->magic = 0;
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    cudaError_t e = check_event(event);
    if (e == cudaSuccess) e = check_stream(stream);
    if (e != cudaSuccess) return fail(e);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&g_lock);
    event->recorded = 1;
    event->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    cudaError_t e = check_event(event);
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return cudaEventQuery(event); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return fail(cudaErrorInvalidValue);
    if (check_event(start) != cudaSuccess || check_event(end) != cudaSuccess ||
        ((start->flags | end->flags) & cudaEventDisableTiming))
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_lock);
    int ok = start->recorded && end->recorded;
    if (ok) *ms = (float)(end->ms - start->ms);
    pthread_mutex_unlock(&g_lock);
    return ok ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

/* ------------------------------------------------------------------ copies */

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    cudaError_t e = check_stream(stream);
    if (e != cudaSuccess) return fail(e);
    if ((unsigned)kind > (unsigned)cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection);
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue);
    int rd = region(dst, count), rs = region(src, count);
    int dev_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int dev_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (rd == REGION_PAST_END || rs == REGION_PAST_END || (dev_dst && rd == REGION_UNKNOWN) ||
        (dev_src && rs == REGION_UNKNOWN))
        return fail(cudaErrorInvalidValue);
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, count, kind, NULL);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    cudaError_t e = check_stream(stream);
    if (e != cudaSuccess) return fail(e);
    if (count == 0) return cudaSuccess;
    if (!devPtr || region(devPtr, count) <= REGION_UNKNOWN) return fail(cudaErrorInvalidValue);
    memset(devPtr, value, count);
    return cudaSuccess;
}

/* ------------------------------------------------------------------ cuBLAS */

struct cublasContext {
    uint32_t magic;
    cudaStream_t stream;
    cublasMath_t mode;
};

static const struct {
    cublasStatus_t code;
    const char *name, *text;
} blas_statuses[] = {
    /* The strings of libcublas 13. */
    ERR(CUBLAS_STATUS_SUCCESS, "success"),
    ERR(CUBLAS_STATUS_NOT_INITIALIZED, "the library was not initialized"),
    ERR(CUBLAS_STATUS_ALLOC_FAILED, "the resource allocation failed"),
    ERR(CUBLAS_STATUS_INVALID_VALUE,
        "an unsupported value or parameter was passed to the function"),
    ERR(CUBLAS_STATUS_ARCH_MISMATCH,
        "the function requires an architectural feature absent from the device"),
    ERR(CUBLAS_STATUS_MAPPING_ERROR, "an access to GPU memory space failed"),
    ERR(CUBLAS_STATUS_EXECUTION_FAILED, "the function failed to launch on the GPU"),
    ERR(CUBLAS_STATUS_INTERNAL_ERROR, "an internal operation failed"),
    ERR(CUBLAS_STATUS_NOT_SUPPORTED, "the requested functionality is not supported"),
    ERR(CUBLAS_STATUS_LICENSE_ERROR, "the license check failed"),
};

const char *cublasGetStatusName(cublasStatus_t status) {
    for (size_t i = 0; i < sizeof blas_statuses / sizeof blas_statuses[0]; i++)
        if (blas_statuses[i].code == status) return blas_statuses[i].name;
    return "unrecognized status";
}

const char *cublasGetStatusString(cublasStatus_t status) {
    for (size_t i = 0; i < sizeof blas_statuses / sizeof blas_statuses[0]; i++)
        if (blas_statuses[i].code == status) return blas_statuses[i].text;
    return "unrecognized status";
}

static int blas_ok(cublasHandle_t h) { return h && h->magic == BLAS_MAGIC; }

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    if (check_device(tl_device) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasHandle_t h = (cublasHandle_t)calloc(1, sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = BLAS_MAGIC;
    h->mode = CUBLAS_DEFAULT_MATH;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!blas_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId) {
    if (!blas_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!blas_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    unsigned m = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (m > CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
    handle->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

static float load(const void *p, cudaDataType t, size_t i) {
    switch (t) {
    case CUDA_R_16BF: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_16F: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* 1 if the rows x cols column-major matrix at p (leading dimension ld) lies
 * inside one allocation CUDA knows, as a GPU needs; prints why not. */
static int operand_ok(const char *name, const void *p, cudaDataType t, int rows, int cols, int ld) {
    size_t bytes = ((size_t)ld * (size_t)(cols - 1) + (size_t)rows) * type_size(t);
    if (p && region(p, bytes) > REGION_UNKNOWN) return 1;
    fprintf(stderr,
            "CUDA emulator: cublasGemmEx: %s [%p, +%zu bytes) is not inside one "
            "cudaMalloc allocation\n",
            name, p, bytes);
    return 0;
}

/* A 16-bit rows x cols matrix (leading dimension ld) as a packed fp32 one. */
static float *widen(const void *p, cudaDataType t, int rows, int cols, int ld) {
    float *w = (float *)malloc((size_t)rows * (size_t)cols * sizeof *w);
    if (w)
        for (int j = 0; j < cols; j++)
            for (int i = 0; i < rows; i++)
                w[(size_t)j * rows + i] = load(p, t, (size_t)j * ld + i);
    return w;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    (void)algo;
    if (!blas_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((unsigned)transa > CUBLAS_OP_C || (unsigned)transb > CUBLAS_OP_C || m < 0 || n < 0 ||
        k < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* The stored shapes: A is ar x ac, B br x bc. */
    const int ar = transa == CUBLAS_OP_N ? m : k, ac = transa == CUBLAS_OP_N ? k : m;
    const int br = transb == CUBLAS_OP_N ? k : n, bc = transb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC &&
        computeType != CUBLAS_COMPUTE_32F_FAST_16F && computeType != CUBLAS_COMPUTE_32F_FAST_16BF &&
        computeType != CUBLAS_COMPUTE_32F_FAST_TF32)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* cuBLAS's CUBLAS_COMPUTE_32F table: 32F x 32F -> 32F; 16BF (16F) x
     * 16BF (16F) -> the same type or 32F. */
    if (Atype != Btype || (Atype != CUDA_R_32F && Atype != CUDA_R_16BF && Atype != CUDA_R_16F) ||
        (Ctype != Atype && Ctype != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;

    const float al = *(const float *)alpha, be = *(const float *)beta;
    const int product = k > 0 && al != 0.0f;   /* otherwise A and B are not read (BLAS) */
    if ((product && (!operand_ok("A", A, Atype, ar, ac, lda) ||
                     !operand_ok("B", B, Btype, br, bc, ldb))) ||
        !operand_ok("C", C, Ctype, m, n, ldc))
        return CUBLAS_STATUS_EXECUTION_FAILED;

    /* fp32 views: the operands themselves, or packed fp32 copies. */
    const int wide_c = Ctype == CUDA_R_32F;
    float *a = NULL, *b = NULL, *c = wide_c ? (float *)C : NULL;
    int la = lda, lb = ldb, lc = ldc;
    cublasStatus_t st = CUBLAS_STATUS_ALLOC_FAILED;
    if (!wide_c) {
        c = (float *)malloc((size_t)m * (size_t)n * sizeof *c);
        if (!c) goto out;
        lc = m;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++)   /* beta = 0: C is not read (BLAS) */
                c[(size_t)j * m + i] = be != 0.0f ? load(C, Ctype, (size_t)j * ldc + i) : 0.0f;
    }
    if (product) {
        a = Atype == CUDA_R_32F ? (float *)A : widen(A, Atype, ar, ac, lda);
        b = Btype == CUDA_R_32F ? (float *)B : widen(B, Btype, br, bc, ldb);
        if (!a || !b) goto out;
        if (Atype != CUDA_R_32F) la = ar > 1 ? ar : 1;
        if (Btype != CUDA_R_32F) lb = br > 1 ? br : 1;
        cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, al, a, la, b, lb,
                    be, c, lc);
    } else {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float *x = &c[(size_t)j * lc + i];
                *x = be != 0.0f ? be * *x : 0.0f;
            }
    }
    if (!wide_c)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float v = c[(size_t)j * m + i];
                ((uint16_t *)C)[(size_t)j * ldc + i] =
                    Ctype == CUDA_R_16BF ? dt_f32_to_bf16(v) : dt_f32_to_f16(v);
            }
    st = CUBLAS_STATUS_SUCCESS;
out:
    if (a && a != A) free(a);
    if (b && b != B) free(b);
    if (!wide_c) free(c);
    return st;
}
