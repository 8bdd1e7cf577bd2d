/* dtensor/backend_cuda.h — PRIVATE. The CUDA compute backend (backend_cuda.cu),
 * for the backend selection in context.c, the transports and the tests.
 *
 * Plain C: CUDA handles cross this header as void * (cudaStream_t is a
 * pointer), so C files that include it need no CUDA headers. Built only
 * when the Makefile finds nvcc and cuBLAS (it then defines DT_HAVE_CUDA).
 *
 * A CUDA backend belongs to one rank and one device. It owns a compute
 * stream (every backend call is enqueued there, in call order), a
 * communication stream (for the NCCL transport), a cuBLAS handle bound to
 * the compute stream, and device scratch that only grows. Every host wait is
 * a poll bounded by timeout_ms; a wait that runs out, or a sticky CUDA
 * error, marks the backend failed: later waits fail at once and frees leak
 * rather than block (cudaFree synchronises the device).
 *
 * TF32: fp32 gemm computes in full fp32 by default. DT_TF32=1 in the
 * environment (read by dt_launch) or dt_backend_cuda_set_tf32 lets cuBLAS
 * use TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation).
 *
 * Test: tests/test_cuda.c (make test; every case skips without a GPU).
 */
#ifndef DT_BACKEND_CUDA_H
#define DT_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "backend.h"
#include "../collectives/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ranks of one process whose CUDA backends may reclaim each other's
 * cached device memory (dt_launch makes one for its ranks): a rank whose
 * cudaMalloc runs out with its own cache empty frees the blocks that the
 * other ranks on its device keep cached, once the work each queued before
 * has run (waited for under the reclaiming rank's timeout), and tries
 * again. Without a pool a backend reclaims only its own cache. Thread-safe;
 * destroyed after every backend that joined it. */
typedef struct dt_cuda_pool dt_cuda_pool;
dt_status dt_cuda_pool_create(dt_cuda_pool **out);
void dt_cuda_pool_destroy(dt_cuda_pool *pool);

typedef struct dt_cuda_options {
    int device;            /* CUDA device index (after CUDA_VISIBLE_DEVICES) */
    long timeout_ms;       /* bound on every host wait (> 0) */
    int tf32;              /* 1: fp32 gemm may use TF32 */
    dt_cuda_pool *pool;    /* NULL, or the pool the backend joins (it must outlive it) */
    int device_ranks;      /* ranks of the launch on this device, this one included (0
                            * counts as 1): the default of dt_backend_cuda_set_comm_ctas */
} dt_cuda_options;

/* Number of visible CUDA devices. Without a driver (or without a device)
 * cudaGetDeviceCount fails and leaves its count untouched: that is 0 here,
 * and `reason` (may be NULL) receives "cudaGetDeviceCount: <CUDA's message>". */
int dt_cuda_device_count(char *reason, size_t reason_size);

/* Sets the calling thread's device, creates the streams and the cuBLAS
 * handle. The backend is used from the thread that created it. */
dt_status dt_backend_cuda_create(int rank, const dt_cuda_options *opts, dt_backend **out);

/* Accessors (b must be a CUDA backend). Streams are cudaStream_t. */
int dt_backend_cuda_device(const dt_backend *b);
/* The device's compute capability as major * 10 + minor (90 for an H100),
 * read once when the backend is created. */
int dt_backend_cuda_compute_capability(const dt_backend *b);
/* The device's L2 size in bytes, read once when the backend is created:
 * the attention kernels order their CTAs by it (attention/cuda/mma_layout.h).
 * set_l2_bytes replaces it (benchmarks compare orders: 0 gives one head
 * at a time); results never depend on it, only speed. */
int64_t dt_backend_cuda_l2_bytes(const dt_backend *b);
void dt_backend_cuda_set_l2_bytes(dt_backend *b, int64_t bytes);
/* The device's multiprocessors, read once when the backend is created. */
int dt_backend_cuda_sms(const dt_backend *b);
/* How the communication stream's own work runs beside the compute
 * stream's kernels: the transport's copies between two buffers of this
 * device (the local transport's sends and collectives between ranks
 * sharing a GPU) and add_beside (the backward ring's sums of dK, dV). 0:
 * the driver's copy (cudaMemcpyAsync) and a kernel of as many blocks as
 * the SMs take, each on as many SMs as it gets; n > 0: kernels of at most
 * n CTAs (16-byte units, cache-streaming), so that such work takes a few
 * SMs for longer beside the kernel it overlaps instead of most of them for
 * a short time, as NCCL's send and receive take a channel's few. The
 * default shares DT_CUDA_COMM_CTAS between the ranks of a launch on one
 * device (dt_cuda_options.device_ranks): DT_CUDA_COMM_CTAS / ranks each,
 * at least 1, where two or more share it; 0 for a rank alone on its
 * device (measured on an H200, docs/PERFORMANCE.md). Copies to or from
 * the host or another device, and what is not 16-byte aligned or past the
 * last whole 16 bytes (four values of an add), stay as with 0. Negative
 * values count as 0. Results never depend on it, only speed. */
#define DT_CUDA_COMM_CTAS 32
int dt_backend_cuda_comm_ctas(const dt_backend *b);
void dt_backend_cuda_set_comm_ctas(dt_backend *b, int ctas);
/* Keeps the compute stream busy for `us` microseconds (at most 1 s; one
 * thread spinning on the GPU's timer), for benchmarks: enqueued before a
 * start event, it lets the host prepare and launch the work it times
 * while the GPU is busy, so that the events hold the GPU's time and not
 * the host's. Does nothing on another backend. */
dt_status dt_backend_cuda_busy(dt_backend *b, double us);
void *dt_backend_cuda_compute_stream(const dt_backend *b);
void *dt_backend_cuda_comm_stream(const dt_backend *b);
void dt_backend_cuda_set_tf32(dt_backend *b, int on);
int dt_backend_cuda_tf32(const dt_backend *b);
/* With NCCL, a peer's failure leaves this rank's streams stuck behind the
 * collective it never joined until the communicators are aborted. poll(arg)
 * (called by the rank's thread, non-blocking) says whether the world has
 * been aborted: long waits ask it and then return DT_ERR_PEER_FAILED at
 * once instead of running out the timeout. NULL: none. Set by context.c
 * for the NCCL transport, cleared before the communicator is destroyed. */
void dt_backend_cuda_set_abort_poll(dt_backend *b, int (*poll)(void *arg), void *arg);
/* 1 if b is a CUDA backend. */
int dt_backend_is_cuda(const dt_backend *b);

/* The transport memory hooks of this rank (device memory, copies on the
 * compute stream waited for, reductions by kernels): for the local
 * transport (ranks sharing GPUs) and ring buffers. b must outlive every
 * communicator that holds them. */
dt_mem dt_backend_cuda_mem(dt_backend *b);

#ifdef __cplusplus
}
#endif
#endif /* DT_BACKEND_CUDA_H */
