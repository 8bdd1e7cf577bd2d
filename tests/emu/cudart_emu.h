/* tests/emu/cudart_emu.h — what the emulator's kernel-launch path tells the
 * emulated CUDA runtime (tests/emu/cudart.c). Plain C; also C++. */
#ifndef DT_TEST_EMU_CUDART_EMU_H
#define DT_TEST_EMU_CUDART_EMU_H

#include "include/cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Queues run(ctx) on `stream` (the NULL stream: runs it now, after every
 * blocking stream's work); it runs when the host waits for that stream
 * (tests/emu/cudart.c), exactly once, and frees ctx. It returns 0, or -1
 * with a message in err: the stream then reports cudaErrorLaunchFailure.
 * An invalid stream: the error, and run is never called. The kernel
 * launches of base/cuda_launch.cuh come through here. run returns 0
 * here (1, "not ready", is for dt_emu_cuda_enqueue_locked's users). */
cudaError_t dt_emu_cuda_enqueue(cudaStream_t stream, int (*run)(void *ctx, char *err, size_t size),
                                void *ctx);

/* For the emulated NCCL (tests/emu/nccl.c), whose operations are stream
 * work too. dt_emu_cuda_lock / unlock take and release the queues' lock;
 * the run functions of queued work are called with it held.
 *   dt_emu_cuda_enqueue_locked: dt_emu_cuda_enqueue with the lock held, on
 *     a created stream only (NULL: cudaErrorInvalidResourceHandle). run may
 *     return 1, "not ready": it stays at the head of its stream, which stops
 *     there (cudaStreamQuery / cudaEventQuery say cudaErrorNotReady) until
 *     a later wait runs it again and it returns 0 or -1.
 *   dt_emu_cuda_reach (lock held): runs stream's work in order until the
 *     head operation's ctx is `ctx` (it is not run), or *flag (flag may be
 *     NULL) becomes non-zero, or the head is not ready, or the queue is
 *     empty. A stream being run further up the call stack is not run again
 *     (a cycle). Returns 1 if the head is then ctx's operation.
 *   dt_emu_cuda_stream_device: the device a valid stream was created on;
 *     -1 for an invalid stream. */
/* The host's monotonic clock in ms, and a 0.2 ms sleep: the bounded polls
 * of cudart.c and nccl.c. */
double dt_emu_now_ms(void);
void dt_emu_nap(void);

void dt_emu_cuda_lock(void);
void dt_emu_cuda_unlock(void);
cudaError_t dt_emu_cuda_enqueue_locked(cudaStream_t stream,
                                       int (*run)(void *ctx, char *err, size_t size), void *ctx);
int dt_emu_cuda_reach(cudaStream_t stream, const void *ctx, const int *flag);
int dt_emu_cuda_stream_device(cudaStream_t stream);

/* 1 if [p, p + bytes) lies inside one allocation CUDA knows (cudaMalloc,
 * or pinned host memory), as device-side operands must. */
int dt_emu_cuda_device_range(const void *p, size_t bytes);

/* 1 if p lies inside an allocation CUDA knows (cudaMalloc, or pinned host
 * memory), with its first byte in *base and its size in *bytes; else 0.
 * The emulated TMA (runtime.c) bounds a tensor's reads by the allocation
 * holding the tensor map's global address. */
int dt_emu_cuda_allocation(const void *p, const void **base, size_t *bytes);

/* A launch failed (dt_emu_launch returned -1 with `msg`): prints msg to
 * stderr once, keeps it, and sets the calling thread's last error to
 * cudaErrorLaunchFailure, as a faulting kernel does on a GPU (the next
 * cudaGetLastError / cudaPeekAtLastError returns it). */
void dt_emu_cuda_set_launch_error(const char *msg);

/* The calling thread's last launch-failure message ("" if none); valid
 * until its next launch failure. */
const char *dt_emu_cuda_launch_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DT_TEST_EMU_CUDART_EMU_H */
