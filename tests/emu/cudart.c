/* tests/emu/cudart.c — the CUDA runtime and cuBLAS, host side, emulated on
 * the CPU (include/cuda_runtime_api.h, include/cublas_v2.h), so that
 * dtensor's CUDA backend runs in `make test` without a GPU; its kernels run
 * on the fiber emulator (emu.h). Test: tests/test_emu_cudart.c.
 *
 * The model: DT_EMU_DEVICES devices (1 when unset; 0, or anything but a
 * number up to 64, means none), each an H100-like compute capability 9.0
 * part with 132 SMs and 227 KiB of opt-in shared memory per block, whose
 * memory is host memory. Where this differs from a GPU:
 *   - Stream work (copies, memsets, gemms, event records; kernel launches,
 *     by dt_emu_cuda_enqueue) is queued and runs, in order, only when the
 *     host waits for it, in the waiting thread: as late as CUDA allows, so
 *     a missing wait shows (the streams section says when). Streams never
 *     overlap; an event's timestamp is the host clock when its record ran.
 *     Work may be not ready (cudaStreamWaitEvent, the emulated NCCL of
 *     nccl.c): calls that block in CUDA poll for it for at most 5 s, then
 *     warn and go on.
 *   - Device memory is 256-byte aligned host memory, filled with 0xcd bytes
 *     when allocated (cudaHostAlloc's is not filled); a device holds
 *     min(80 GiB, half the host's RAM), or DT_EMU_DEVICE_MIB MiB where that
 *     is set (tests that need to run out), and cudaMalloc beyond that fails
 *     with cudaErrorMemoryAllocation. Every allocation is in one table, so
 *     pointers are checked: cudaFree / cudaFreeHost reject pointers they did
 *     not return, and a copy, memset or gemm operand that starts inside an
 *     allocation must end inside it; the device side of an explicitly
 *     directed copy, memsets and gemm operands must be memory CUDA knows
 *     (cudaMalloc, or pinned host memory as with unified addressing).
 *   - A kernel the emulator rejects sets the last error of the thread that
 *     ran it to cudaErrorLaunchFailure, and its stream (and events recorded
 *     after it there) report that error from then on; other streams and
 *     calls go on, where a GPU would poison the whole context.
 *   - cudaFuncSetAttribute only checks its value against the device limits.
 *   - cublasGemmEx computes in full fp32 whatever the compute type (no TF32
 *     rounding of inputs) with OpenBLAS sgemm on fp32 copies of 16-bit
 *     operands; a 16-bit C is rounded once, at the end. The algo is ignored.
 *   - The driver API is one function, cuTensorMapEncodeTiled (include/cuda.h),
 *     found through cudaGetDriverEntryPointByVersion; its tensor maps are
 *     the emulator's own encoding, for the emulated TMA of runtime.c.
 *
 * Thread-safe: one mutex guards the allocation table, another the queues;
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
#include "base/dtype.h"
#include "include/cublas_v2.h"
#include "include/cuda.h"
#include "include/cuda_runtime_api.h"
#include "include/cudaTypedefs.h"
#include "tmap_emu.h"

#ifdef __cplusplus
#define DT_TLS thread_local
#else
#define DT_TLS _Thread_local
#endif

#define EMU_MAX_DEVICES 64
#define EMU_SMS 132
#define EMU_SMEM_OPTIN (227 * 1024)
#define EMU_L2_BYTES (50 * 1024 * 1024)   /* an H100's */
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

/* cudaErrorNotReady ("not actually an error", says CUDA) is returned but,
 * as by CUDA, not kept as the thread's last error: a query that polls must
 * not make the next launch check fail. */
static cudaError_t status(cudaError_t e) {
    return e == cudaSuccess || e == cudaErrorNotReady ? e : fail(e);
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
    /* DT_EMU_DEVICE_MIB: a smaller device, for tests that run it out of
     * memory (read at every allocation, so a test may set it for a while). */
    const char *s = getenv("DT_EMU_DEVICE_MIB");
    if (s && *s) {
        char *end;
        errno = 0;
        long mib = strtol(s, &end, 10);
        if (!errno && !*end && mib > 0 && mib <= (80L << 10)) return (size_t)mib << 20;
    }
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
    case cudaDevAttrL2CacheSize: *value = EMU_L2_BYTES; break;
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

int dt_emu_cuda_device_range(const void *p, size_t bytes) {
    return p && bytes > 0 && region(p, bytes) > REGION_UNKNOWN;
}

int dt_emu_cuda_allocation(const void *p, const void **base, size_t *bytes) {
    pthread_mutex_lock(&g_lock);
    const alloc_rec *r = p ? find_locked(p) : NULL;
    if (r) {
        *base = r->p;
        *bytes = r->bytes;
    }
    pthread_mutex_unlock(&g_lock);
    return r != NULL;
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

static void wait_device(const char *what);

static cudaError_t release(void *p, int host) {
    if (!p) return cudaSuccess;
    wait_device(host ? "cudaFreeHost" : "cudaFree");   /* queued work may still use it */
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

/* ----------------------------------------------------------------- streams
 *
 * Work is deferred, as on a GPU: a stream is a queue of operations (kernel
 * launches, copies, memsets, gemms, event records, event waits, and the
 * emulated NCCL's collectives and send/receive groups, tests/emu/nccl.c)
 * that run in order, and here they run only when the host waits for them
 * -- cudaStreamQuery or cudaStreamDestroy of their stream, cudaEventQuery /
 * Synchronize of an event recorded there, cudaFree / cudaFreeHost (which
 * wait for the current device's streams), and a copy into pageable host
 * memory (synchronous in CUDA) -- so as late as CUDA allows. Code that
 * reads a result without waiting, or lets a stream read a buffer that
 * another stream, or the host, changes before the wait, gets wrong numbers
 * here as it could on a GPU. The NULL stream runs its work at once, after
 * every blocking (cudaStreamDefault) stream's of the current device.
 * A failed operation (a kernel the emulator rejects) makes its stream
 * return cudaErrorLaunchFailure from then on, as a faulting kernel does.
 * One mutex (q_lock) guards every queue and is held while work runs, so
 * operations never overlap.
 *
 * An operation may be *not ready* (its run returns 1): a cudaStreamWaitEvent
 * whose event's record has not run and cannot run yet, or an NCCL operation
 * whose peers have not posted or reached their parts. It stays at the head
 * of its stream, which stops there: cudaStreamQuery and cudaEventQuery then
 * report cudaErrorNotReady, and a later wait tries again. Running an
 * operation may run other streams' work (an event wait runs the event's
 * stream up to the record; an NCCL operation runs its peers' streams up to
 * their parts); a stream already being run further up (a dependency cycle)
 * is not run again: the operation that needs it is not ready. Nothing here
 * ever blocks, except where CUDA's call does (cudaFree, a synchronous copy,
 * cudaEventSynchronize), and those poll for at most EMU_BLOCK_MS and then
 * go on with a warning. */

#define EMU_BLOCK_MS 5000

typedef struct emu_op {
    struct emu_op *next;
    /* Runs the operation; 0 (done: it freed ctx), -1 with a message (failed:
     * it freed ctx), or 1 (not ready: ctx kept, run again later). NULL: an
     * event record. */
    int (*run)(void *ctx, char *err, size_t err_size);
    void *ctx;
    cudaEvent_t event;
} emu_op;

struct CUstream_st {
    uint32_t magic;           /* 0 once destroyed with work still queued */
    unsigned flags;
    int device;               /* current when it was created */
    emu_op *head, *tail;
    cudaError_t error;        /* sticky: the first failed operation's */
    int running;              /* its work is being run further up the call stack */
    struct CUstream_st *next; /* every live stream, and destroyed ones still holding work */
};

struct CUevent_st {
    uint32_t magic;                 /* 0 once destroyed while records or waits were queued */
    unsigned flags;
    unsigned long recorded, done;   /* records queued, records run */
    cudaStream_t stream;            /* of the last record */
    cudaError_t error;              /* its stream's, when the record ran */
    double ms;                      /* host monotonic clock when the last record ran */
    unsigned long refs;             /* queued records and waits that use it */
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t g_streams;

static cudaError_t check_stream(cudaStream_t s) {
    return !s || s->magic == STREAM_MAGIC ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

static cudaError_t check_event(cudaEvent_t ev) {
    return ev && ev->magic == EVENT_MAGIC ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

double dt_emu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void dt_emu_nap(void) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
}

/* A queued record or wait let go of ev (q_lock held): a destroyed event is
 * freed with the last. */
static void event_unref(cudaEvent_t ev) {
    if (--ev->refs == 0 && ev->magic != EVENT_MAGIC) free(ev);
}

/* Runs one operation of stream s (NULL: the NULL stream); q_lock held.
 * 1: not ready (op stays queued); 0: done, op freed. */
static int run_op(cudaStream_t s, emu_op *op) {
    if (!op->run) {
        op->event->done++;
        op->event->ms = dt_emu_now_ms();
        op->event->error = s ? s->error : cudaSuccess;
        event_unref(op->event);
    } else {
        char err[512] = "";
        int rc = op->run(op->ctx, err, sizeof err);
        if (rc > 0) return 1;
        if (rc != 0) {
            dt_emu_cuda_set_launch_error(err);
            if (s && s->error == cudaSuccess) s->error = cudaErrorLaunchFailure;
        }
    }
    free(op);
    return 0;
}

/* What stops a run of a stream's work short of its end. */
typedef struct stop_at {
    const void *ctx;           /* the head operation's ctx is this (it is not run) */
    const int *flag;           /* *flag became non-zero */
    cudaEvent_t ev;            /* ev->done reached target */
    unsigned long target;
} stop_at;

static int stopped(cudaStream_t s, const stop_at *at) {
    if (!at) return 0;
    if (at->ctx && s->head && s->head->ctx == at->ctx) return 1;
    if (at->flag && *at->flag) return 1;
    return at->ev && at->ev->done >= at->target;
}

/* Runs s's work in order until it is empty, `at` says stop, or the head is
 * not ready; a stream already being run further up is left alone (a cycle).
 * q_lock held. Returns 1 if s is empty. */
static int drain_to(cudaStream_t s, const stop_at *at) {
    if (s->running) return s->head == NULL;
    s->running = 1;
    while (s->head && !stopped(s, at)) {
        emu_op *op = s->head, *next = op->next;   /* nothing queues on s while op runs */
        if (run_op(s, op) != 0) break;           /* op stays at the head */
        s->head = next;                          /* run_op freed op */
        if (!s->head) s->tail = NULL;
    }
    s->running = 0;
    return s->head == NULL;
}

static int drain(cudaStream_t s) { return drain_to(s, NULL); }

/* Every stream of `device` (-1: every device), or only the blocking ones;
 * q_lock held. Streams destroyed with work queued are freed once it has
 * run. Returns 1 if all of them are empty. */
static int drain_all(int blocking_only, int device) {
    int empty = 1;
    for (cudaStream_t *p = &g_streams; *p;) {
        cudaStream_t s = *p;
        if ((!blocking_only || !(s->flags & cudaStreamNonBlocking)) &&
            (device < 0 || s->device == device) && !drain(s))
            empty = 0;
        if (s->magic != STREAM_MAGIC && !s->head && !s->running) {
            *p = s->next;
            free(s);
        } else {
            p = &s->next;
        }
    }
    return empty;
}

/* Queues op on s, or runs it now on the NULL stream; q_lock held. */
static cudaError_t enqueue_locked(cudaStream_t s, emu_op *op) {
    cudaError_t e = check_stream(s);
    if (e == cudaSuccess && !s) {
        drain_all(1, tl_device);
        if (run_op(NULL, op) != 0) {
            /* Only the NCCL emulator's operations can be not ready, and it
             * refuses the NULL stream. */
            dt_emu_cuda_set_launch_error("an operation on the NULL stream was not ready");
            free(op);
        }
    } else if (e == cudaSuccess) {
        op->next = NULL;
        if (s->tail) s->tail->next = op;
        else s->head = op;
        s->tail = op;
    }
    return e;
}

static cudaError_t enqueue(cudaStream_t s, emu_op *op) {
    pthread_mutex_lock(&q_lock);
    cudaError_t e = enqueue_locked(s, op);
    pthread_mutex_unlock(&q_lock);
    return e;
}

static emu_op *new_op(int (*run)(void *, char *, size_t), void *ctx) {
    emu_op *op = (emu_op *)calloc(1, sizeof *op);
    if (op) {
        op->run = run;
        op->ctx = ctx;
    }
    return op;
}

cudaError_t dt_emu_cuda_enqueue(cudaStream_t stream, int (*run)(void *ctx, char *err, size_t size),
                                void *ctx) {
    emu_op *op = new_op(run, ctx);
    if (!op) return fail(cudaErrorMemoryAllocation);
    cudaError_t e = enqueue(stream, op);
    if (e != cudaSuccess) {
        free(op);
        return fail(e);
    }
    return cudaSuccess;
}

void dt_emu_cuda_lock(void) { pthread_mutex_lock(&q_lock); }
void dt_emu_cuda_unlock(void) { pthread_mutex_unlock(&q_lock); }

cudaError_t dt_emu_cuda_enqueue_locked(cudaStream_t stream,
                                       int (*run)(void *ctx, char *err, size_t size), void *ctx) {
    if (!stream) return cudaErrorInvalidResourceHandle;
    emu_op *op = new_op(run, ctx);
    if (!op) return cudaErrorMemoryAllocation;
    cudaError_t e = enqueue_locked(stream, op);
    if (e != cudaSuccess) free(op);
    return e;
}

int dt_emu_cuda_reach(cudaStream_t stream, const void *ctx, const int *flag) {
    stop_at at = {ctx, flag, NULL, 0};
    drain_to(stream, &at);
    return stream->head && stream->head->ctx == ctx;
}

int dt_emu_cuda_stream_device(cudaStream_t stream) {
    return stream && stream->magic == STREAM_MAGIC ? stream->device : -1;
}

/* Priorities as an H100 reports them (0 least, -5 greatest); streams never
 * overlap here, so a priority changes nothing but is kept. */
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    cudaError_t e = check_device(tl_device);
    if (e != cudaSuccess) return fail(e);
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = -5;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
    (void)priority; /* CUDA clamps it to the range: any value is accepted */
    return cudaStreamCreateWithFlags(pStream, flags);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
    cudaError_t e = check_device(tl_device);
    if (e != cudaSuccess) return fail(e);
    cudaStream_t s = (cudaStream_t)calloc(1, sizeof *s);
    if (!s) return fail(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    s->flags = flags;
    s->device = tl_device;
    pthread_mutex_lock(&q_lock);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&q_lock);
    *pStream = s;
    return cudaSuccess;
}

/* CUDA lets queued work finish after cudaStreamDestroy returns: work that
 * is not ready yet keeps the stream (no longer a valid handle) until it has
 * run. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    pthread_mutex_lock(&q_lock);
    cudaError_t e = stream ? check_stream(stream) : cudaErrorInvalidResourceHandle;
    if (e == cudaSuccess) {
        int empty = drain(stream);
        stream->magic = 0;
        if (empty) {
            for (cudaStream_t *p = &g_streams; *p; p = &(*p)->next)
                if (*p == stream) {
                    *p = stream->next;
                    break;
                }
            free(stream);
        }
    }
    pthread_mutex_unlock(&q_lock);
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    pthread_mutex_lock(&q_lock);
    cudaError_t e = check_stream(stream);
    if (e == cudaSuccess && stream) {
        int empty = drain(stream);
        e = stream->error != cudaSuccess ? stream->error : empty ? cudaSuccess : cudaErrorNotReady;
    } else if (e == cudaSuccess) {
        e = drain_all(1, tl_device) ? cudaSuccess : cudaErrorNotReady;
    }
    pthread_mutex_unlock(&q_lock);
    return status(e);
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

/* Runs the stream of ev's last record until the record numbered `target`
 * has run, if it can; q_lock held. */
static void reach_record(cudaEvent_t ev, unsigned long target) {
    if (ev->done < target && ev->stream) {
        stop_at at = {NULL, NULL, ev, target};
        drain_to(ev->stream, &at);
    }
}

static void reach(cudaEvent_t ev) { reach_record(ev, ev->recorded); }

/* CUDA does not wait: queued records and waits keep the event until they
 * have run. */
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    pthread_mutex_lock(&q_lock);
    cudaError_t e = check_event(event);
    if (e == cudaSuccess) {
        event->magic = 0;
        if (event->refs == 0) free(event);
    }
    pthread_mutex_unlock(&q_lock);
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    emu_op *op = new_op(NULL, NULL);
    if (!op) return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&q_lock);
    cudaError_t e = check_event(event);
    if (e == cudaSuccess) e = check_stream(stream);
    if (e == cudaSuccess) {
        op->event = event;
        event->recorded++;
        event->stream = stream;
        event->refs++;
        e = enqueue_locked(stream, op);
    } else {
        free(op);
    }
    pthread_mutex_unlock(&q_lock);
    return e == cudaSuccess ? e : fail(e);
}

/* A queued cudaStreamWaitEvent: the record that was the event's last at
 * the call must have run. */
typedef struct wait_op {
    cudaEvent_t ev;
    unsigned long target;
} wait_op;

static int run_wait(void *ctx, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    wait_op *w = (wait_op *)ctx;
    reach_record(w->ev, w->target);
    if (w->ev->done < w->target) return 1;
    event_unref(w->ev);
    free(w);
    return 0;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (flags & ~(unsigned)cudaEventWaitExternal) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&q_lock);
    cudaError_t e = check_event(event);
    if (e == cudaSuccess) e = check_stream(stream);
    if (e == cudaSuccess && event->done < event->recorded) {
        if (!stream) {
            /* The NULL stream's later work runs at once anyway. */
            reach(event);
        } else {
            wait_op *w = (wait_op *)malloc(sizeof *w);
            emu_op *op = w ? new_op(run_wait, w) : NULL;
            if (!op) {
                free(w);
                e = cudaErrorMemoryAllocation;
            } else {
                *w = (wait_op){event, event->recorded};
                event->refs++;
                e = enqueue_locked(stream, op);
                if (e != cudaSuccess) {
                    event->refs--;
                    free(w);
                    free(op);
                }
            }
        }
    }
    pthread_mutex_unlock(&q_lock);
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    pthread_mutex_lock(&q_lock);
    cudaError_t e = check_event(event);
    if (e == cudaSuccess) {
        reach(event);
        e = event->done < event->recorded ? cudaErrorNotReady : event->error;
    }
    pthread_mutex_unlock(&q_lock);
    return status(e);
}

/* Blocks as CUDA does, but for at most EMU_BLOCK_MS. */
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    double t0 = dt_emu_now_ms();
    for (;;) {
        cudaError_t e = cudaEventQuery(event);
        if (e != cudaErrorNotReady) return e;
        if (dt_emu_now_ms() - t0 > EMU_BLOCK_MS) {
            fprintf(stderr, "CUDA emulator: cudaEventSynchronize: the event's work was not ready "
                            "within %d ms (on a GPU this call would go on waiting)\n",
                    EMU_BLOCK_MS);
            return cudaErrorNotReady;
        }
        dt_emu_nap();
    }
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&q_lock);
    cudaError_t e = cudaSuccess;
    if (check_event(start) != cudaSuccess || check_event(end) != cudaSuccess ||
        ((start->flags | end->flags) & cudaEventDisableTiming) || !start->recorded ||
        !end->recorded)
        e = cudaErrorInvalidResourceHandle;
    else if (start->done < start->recorded || end->done < end->recorded)
        e = cudaErrorNotReady;   /* not waited for: as on a GPU */
    else
        *ms = (float)(end->ms - start->ms);
    pthread_mutex_unlock(&q_lock);
    return status(e);
}

/* Waits for every stream of the current device (cudaFree and cudaFreeHost
 * do: the device may still use the memory). Work that is not ready (a
 * collective whose peers have not posted yet) is polled for, as CUDA would
 * block, for at most EMU_BLOCK_MS; then a warning, and the call goes on. */
static void wait_device(const char *what) {
    double t0 = dt_emu_now_ms();
    for (;;) {
        pthread_mutex_lock(&q_lock);
        int empty = drain_all(0, tl_device);
        pthread_mutex_unlock(&q_lock);
        if (empty) return;
        if (dt_emu_now_ms() - t0 > EMU_BLOCK_MS) {
            fprintf(stderr, "CUDA emulator: %s: device %d still has queued work that is not ready "
                            "after %d ms (on a GPU this call would go on waiting for it); going "
                            "on\n", what, tl_device, EMU_BLOCK_MS);
            return;
        }
        dt_emu_nap();
    }
}

/* Waits for everything queued on s, as a synchronous call does: polls
 * for at most EMU_BLOCK_MS, then warns and returns cudaErrorNotReady. */
static cudaError_t wait_stream(cudaStream_t s, const char *what) {
    double t0 = dt_emu_now_ms();
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e != cudaErrorNotReady) return e;
        if (dt_emu_now_ms() - t0 > EMU_BLOCK_MS) {
            fprintf(stderr, "CUDA emulator: %s: the stream's work was not ready within %d ms (on "
                            "a GPU this call would go on waiting)\n", what, EMU_BLOCK_MS);
            return e;
        }
        dt_emu_nap();
    }
}

/* ------------------------------------------------------------------ copies */

typedef struct copy_op {
    void *dst;
    const void *src;
    size_t count;
    int value;            /* memset: the byte; copy: -1 */
    unsigned char *owned; /* a snapshot of pageable source memory */
} copy_op;

static int run_copy(void *ctx, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    copy_op *c = (copy_op *)ctx;
    if (c->value >= 0) memset(c->dst, c->value, c->count);
    else memmove(c->dst, c->owned ? c->owned : c->src, c->count);
    free(c->owned);
    free(c);
    return 0;
}

/* CUDA's rules for host memory it does not know (pageable): a copy from it
 * reads it before returning (the data is staged); a copy into it returns
 * only when done. Pinned (cudaHostAlloc) and device memory are read and
 * written when the copy runs. */
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
    copy_op *c = (copy_op *)calloc(1, sizeof *c);
    if (!c) return fail(cudaErrorMemoryAllocation);
    *c = (copy_op){dst, src, count, -1, NULL};
    if (rs == REGION_UNKNOWN && rd != REGION_UNKNOWN) {
        c->owned = (unsigned char *)malloc(count);
        if (!c->owned) {
            free(c);
            return fail(cudaErrorMemoryAllocation);
        }
        memcpy(c->owned, src, count);
    }
    emu_op *op = new_op(run_copy, c);
    if (!op) {
        free(c->owned);
        free(c);
        return fail(cudaErrorMemoryAllocation);
    }
    e = enqueue(stream, op);
    if (e == cudaSuccess && rd == REGION_UNKNOWN && rs != REGION_UNKNOWN && stream)
        e = wait_stream(stream, "cudaMemcpy(Async) into pageable memory");   /* done on return */
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, count, kind, NULL);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    cudaError_t e = check_stream(stream);
    if (e != cudaSuccess) return fail(e);
    if (count == 0) return cudaSuccess;
    if (!devPtr || region(devPtr, count) <= REGION_UNKNOWN) return fail(cudaErrorInvalidValue);
    copy_op *c = (copy_op *)calloc(1, sizeof *c);
    emu_op *op = c ? new_op(run_copy, c) : NULL;
    if (!op) {
        free(c);
        return fail(cudaErrorMemoryAllocation);
    }
    *c = (copy_op){devPtr, NULL, count, value & 0xff, NULL};
    e = enqueue(stream, op);
    return e == cudaSuccess ? e : fail(e);
}

/* ------------------------------------------ driver entry points, tensor maps
 *
 * The emulated driver has one function, cuTensorMapEncodeTiled, reached as
 * with the real driver through cudaGetDriverEntryPointByVersion (no libcuda
 * to link). The map it writes is the emulator's own encoding (tmap_emu.h),
 * which only the emulated cp.async.bulk.tensor (dt_emu_tma_load,
 * runtime.c) reads. */

#define EMU_DRIVER_VERSION 13000   /* CUDA 13.0, like the stand-in headers */

/* Checks the arguments against the requirements the CUDA driver API
 * documents for cuTensorMapEncodeTiled ("Tensor Map Object Management"):
 * CUDA_ERROR_INVALID_VALUE for a violation, nothing printed. Valid maps the
 * emulated TMA cannot copy return CUDA_ERROR_NOT_SUPPORTED (checked after
 * the rules that apply to every map): interleaved layouts, the 128-byte
 * swizzle's 32- and 64-byte atomicity modes, element strides other than 1
 * in dimensions 1.., the OOB-NaN fill, and the FLOAT32_FTZ, TFLOAT32* and
 * packed sub-byte data types. Also rejected (the documentation leaves it
 * open): a NULL globalAddress, and NULL arrays of a non-zero length.
 * The documentation also shows strides that each include the one before
 * (globalStrides[i] >= globalStrides[i - 1] globalDim[i]), without saying
 * whether a driver refuses others: DT_EMU_TMAP_SORTED=1 (read at each
 * call) makes this one refuse them, CUDA_ERROR_INVALID_VALUE, for tests of
 * a caller's way around such a driver. */
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                        cuuint32_t tensorRank, void *globalAddress,
                                        const cuuint64_t *globalDim,
                                        const cuuint64_t *globalStrides, const cuuint32_t *boxDim,
                                        const cuuint32_t *elementStrides,
                                        CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                        CUtensorMapL2promotion l2Promotion,
                                        CUtensorMapFloatOOBfill oobFill) {
    const unsigned dtype = (unsigned)tensorDataType, il = (unsigned)interleave;
    const unsigned sw = (unsigned)swizzle, l2 = (unsigned)l2Promotion, oob = (unsigned)oobFill;
    if (!tensorMap || (uintptr_t)tensorMap % 64) return CUDA_ERROR_INVALID_VALUE;
    if (dtype > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B || il > CU_TENSOR_MAP_INTERLEAVE_32B ||
        sw > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B || l2 > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
        oob > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
        return CUDA_ERROR_INVALID_VALUE;
    /* the types whose elements are copied as they are; the rest would be
     * converted or unpacked on the way */
    const uint32_t esize = dt_emu_tmap_esize(dtype);
    if (!esize) return CUDA_ERROR_NOT_SUPPORTED;
    const int is_float = dtype == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 ||
                         dtype == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ||
                         dtype == CU_TENSOR_MAP_DATA_TYPE_FLOAT64 ||
                         dtype == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    /* rank 1..5; interleaved layouts 3..5 */
    if (tensorRank < 1 || tensorRank > DT_EMU_TMAP_MAX_RANK ||
        (il != CU_TENSOR_MAP_INTERLEAVE_NONE && tensorRank < 3))
        return CUDA_ERROR_INVALID_VALUE;
    /* the global address: 16-byte aligned, 32 with the 32-byte interleave */
    const uintptr_t addr = (uintptr_t)globalAddress;
    if (!globalAddress || addr % 16 || (il == CU_TENSOR_MAP_INTERLEAVE_32B && addr % 32))
        return CUDA_ERROR_INVALID_VALUE;
    /* globalDim[i] in 1 .. 2^32 */
    if (!globalDim || !boxDim || !elementStrides || (tensorRank > 1 && !globalStrides))
        return CUDA_ERROR_INVALID_VALUE;
    for (cuuint32_t i = 0; i < tensorRank; i++)
        if (globalDim[i] < 1 || globalDim[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
    /* the rank - 1 strides of dimensions 1..: bytes, multiples of 16 (32
     * with the 32-byte interleave), below 2^40 */
    for (cuuint32_t i = 0; i + 1 < tensorRank; i++)
        if (globalStrides[i] % 16 || globalStrides[i] >= (1ull << 40) ||
            (il == CU_TENSOR_MAP_INTERLEAVE_32B && globalStrides[i] % 32))
            return CUDA_ERROR_INVALID_VALUE;
    const char *sorted = getenv("DT_EMU_TMAP_SORTED");
    if (sorted && !strcmp(sorted, "1"))
        for (cuuint32_t i = 0; i + 1 < tensorRank; i++) {
            const uint64_t before = i ? globalStrides[i - 1] : esize;
            if (globalStrides[i] < before * globalDim[i]) return CUDA_ERROR_INVALID_VALUE;
        }
    /* boxDim[i] in 1 .. 256; without interleave the inner box a multiple of
     * 16 bytes */
    for (cuuint32_t i = 0; i < tensorRank; i++)
        if (boxDim[i] < 1 || boxDim[i] > 256) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t inner = (uint64_t)boxDim[0] * esize;
    if (il == CU_TENSOR_MAP_INTERLEAVE_NONE && inner % 16) return CUDA_ERROR_INVALID_VALUE;
    /* elementStrides[i] in 1 .. 8 (without interleave [0] is ignored) */
    for (cuuint32_t i = 0; i < tensorRank; i++)
        if (elementStrides[i] < 1 || elementStrides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
    /* the 32-byte interleave needs the 32-byte swizzle; without interleave
     * a swizzle spans at most its size of inner box: 32, 64, 128 bytes */
    if (il == CU_TENSOR_MAP_INTERLEAVE_32B && sw != CU_TENSOR_MAP_SWIZZLE_32B)
        return CUDA_ERROR_INVALID_VALUE;
    if (il == CU_TENSOR_MAP_INTERLEAVE_NONE && sw != CU_TENSOR_MAP_SWIZZLE_NONE) {
        const uint64_t span = sw == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : sw == CU_TENSOR_MAP_SWIZZLE_64B ? 64 : 128;
        if (inner > span) return CUDA_ERROR_INVALID_VALUE;
    }
    /* the OOB-NaN fill is for floating-point types */
    if (oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !is_float)
        return CUDA_ERROR_INVALID_VALUE;
    /* valid, but not emulated */
    if (il != CU_TENSOR_MAP_INTERLEAVE_NONE || sw > CU_TENSOR_MAP_SWIZZLE_128B ||
        oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        return CUDA_ERROR_NOT_SUPPORTED;
    for (cuuint32_t i = 1; i < tensorRank; i++)
        if (elementStrides[i] != 1) return CUDA_ERROR_NOT_SUPPORTED;
    dt_emu_tmap m;
    memset(&m, 0, sizeof m);
    m.dtype = dtype;
    m.rank = tensorRank;
    m.interleave = il;
    m.swizzle = sw;
    m.l2 = l2;
    m.oob = oob;
    m.addr = (uint64_t)addr;
    for (cuuint32_t i = 0; i < tensorRank; i++) {
        m.dim[i] = globalDim[i];
        m.stride[i] = i ? globalStrides[i - 1] : esize;
        m.box[i] = boxDim[i];
        m.estride[i] = elementStrides[i];
    }
    dt_emu_tmap_pack((void *)tensorMap, &m);   /* 64-byte aligned is enough: no member access */
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus) {
    if (!symbol || !funcPtr || cudaVersion > EMU_DRIVER_VERSION ||
        (flags != cudaEnableDefault && flags != cudaEnableLegacyStream &&
         flags != cudaEnablePerThreadDefaultStream))
        return fail(cudaErrorInvalidValue);
    cudaError_t e = check_device(tl_device);   /* the runtime initialises a context first */
    if (e != cudaSuccess) return fail(e);
    enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    *funcPtr = NULL;
    if (!strcmp(symbol, "cuTensorMapEncodeTiled")) {
        if (cudaVersion >= 12000) {
            PFN_cuTensorMapEncodeTiled_v12000 fn = cuTensorMapEncodeTiled;
            *funcPtr = (void *)fn;
            status = cudaDriverEntryPointSuccess;
        } else {
            status = cudaDriverEntryPointVersionNotSufficent;
        }
    }
    if (driverStatus) *driverStatus = status;
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

/* One queued gemm: C = alpha op(A) op(B) + beta C, column-major. */
typedef struct gemm_op {
    cublasOperation_t transa, transb;
    int m, n, k;
    float alpha, beta;
    const void *A, *B;
    void *C;
    cudaDataType Atype, Btype, Ctype;
    int lda, ldb, ldc;
} gemm_op;

static int run_gemm(void *ctx, char *err, size_t err_size) {
    gemm_op g = *(gemm_op *)ctx;
    free(ctx);
    /* The stored shapes: A is ar x ac, B br x bc. */
    const int ar = g.transa == CUBLAS_OP_N ? g.m : g.k, ac = g.transa == CUBLAS_OP_N ? g.k : g.m;
    const int br = g.transb == CUBLAS_OP_N ? g.k : g.n, bc = g.transb == CUBLAS_OP_N ? g.n : g.k;
    const int product = g.k > 0 && g.alpha != 0.0f;   /* otherwise A and B are not read (BLAS) */
    const int wide_c = g.Ctype == CUDA_R_32F;
    float *a = NULL, *b = NULL, *c = wide_c ? (float *)g.C : NULL;
    int la = g.lda, lb = g.ldb, lc = g.ldc, rc = -1;
    if (!wide_c) {
        c = (float *)malloc((size_t)g.m * (size_t)g.n * sizeof *c);
        if (!c) goto out;
        lc = g.m;
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++)   /* beta = 0: C is not read (BLAS) */
                c[(size_t)j * g.m + i] =
                    g.beta != 0.0f ? load(g.C, g.Ctype, (size_t)j * g.ldc + i) : 0.0f;
    }
    if (product) {
        a = g.Atype == CUDA_R_32F ? (float *)g.A : widen(g.A, g.Atype, ar, ac, g.lda);
        b = g.Btype == CUDA_R_32F ? (float *)g.B : widen(g.B, g.Btype, br, bc, g.ldb);
        if (!a || !b) goto out;
        if (g.Atype != CUDA_R_32F) la = ar > 1 ? ar : 1;
        if (g.Btype != CUDA_R_32F) lb = br > 1 ? br : 1;
        cblas_sgemm(CblasColMajor, g.transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    g.transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha, a,
                    la, b, lb, g.beta, c, lc);
    } else {
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) {
                float *x = &c[(size_t)j * lc + i];
                *x = g.beta != 0.0f ? g.beta * *x : 0.0f;
            }
    }
    if (!wide_c)
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) {
                float v = c[(size_t)j * g.m + i];
                ((uint16_t *)g.C)[(size_t)j * g.ldc + i] =
                    g.Ctype == CUDA_R_16BF ? dt_f32_to_bf16(v) : dt_f32_to_f16(v);
            }
    rc = 0;
out:
    if (rc) snprintf(err, err_size, "cublasGemmEx: out of host memory");
    if (a && a != g.A) free(a);
    if (b && b != g.B) free(b);
    if (!wide_c) free(c);
    return rc;
}

/* Arguments are checked at the call, as cuBLAS does; the product runs on
 * the handle's stream (host pointer mode: alpha and beta are read now). */
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
    const int product = k > 0 && al != 0.0f;
    if ((product && (!operand_ok("A", A, Atype, ar, ac, lda) ||
                     !operand_ok("B", B, Btype, br, bc, ldb))) ||
        !operand_ok("C", C, Ctype, m, n, ldc))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    gemm_op *g = (gemm_op *)malloc(sizeof *g);
    if (!g) return CUBLAS_STATUS_ALLOC_FAILED;
    *g = (gemm_op){transa, transb, m, n, k, al, be, A, B, C, Atype, Btype, Ctype, lda, ldb, ldc};
    if (dt_emu_cuda_enqueue(handle->stream, run_gemm, g) != cudaSuccess) {
        free(g);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}
