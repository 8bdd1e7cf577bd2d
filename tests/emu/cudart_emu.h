/* tests/emu/cudart_emu.h — what the emulator's kernel-launch path tells the
 * emulated CUDA runtime (tests/emu/cudart.c). Plain C; also C++. */
#ifndef DT_TEST_EMU_CUDART_EMU_H
#define DT_TEST_EMU_CUDART_EMU_H

#ifdef __cplusplus
extern "C" {
#endif

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
