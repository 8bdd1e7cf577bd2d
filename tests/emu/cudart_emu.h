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
 * launches of dtensor/cuda_launch.cuh come through here. */
cudaError_t dt_emu_cuda_enqueue(cudaStream_t stream, int (*run)(void *ctx, char *err, size_t size),
                                void *ctx);

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
