/* dtensor/cuda_launch.cuh — PRIVATE. The one way the CUDA sources launch a
 * kernel and declare dynamic shared memory, so that the same sources also
 * run on the CPU emulator of tests/emu (emu.h) when the host C++ compiler
 * builds them with DT_CUDA_EMULATE (make CUDA=emu, and test_mma_emu).
 *
 *   dt_cuda_launch(kernel, grid, block, smem, stream, args...)
 *       is kernel<<<grid, block, smem, stream>>>(args...); check it with
 *       cudaGetLastError() as after <<<>>>. On the emulator the grid runs
 *       before the call returns, and a kernel the emulator rejects (an
 *       out-of-bounds shared-memory access, a deadlock, ...) leaves
 *       cudaErrorLaunchFailure there, its reason printed on stderr.
 *   DT_DYNAMIC_SMEM(type, name);
 *       is extern __shared__ __align__(128) type name[].
 * CUDA C++ only.
 */
#ifndef DT_CUDA_LAUNCH_CUH
#define DT_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef DT_CUDA_EMULATE
#include <tuple>

#include "cudart_emu.h"
#define DT_DYNAMIC_SMEM(type, name) type *const name = reinterpret_cast<type *>(dt_emu_dynamic_smem())
#else
#define DT_DYNAMIC_SMEM(type, name) extern __shared__ __align__(128) type name[]
#endif

template <typename... P, typename... A>
inline void dt_cuda_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                           cudaStream_t stream, A... args) {
#ifdef DT_CUDA_EMULATE
    (void)stream;   /* every stream runs at the call (tests/emu/cudart.c) */
    struct call {
        void (*kernel)(P...);
        std::tuple<P...> args;
    } c{kernel, std::tuple<P...>(args...)};
    char err[512];
    if (dt_emu_launch(dt_emu_dim3{grid.x, grid.y, grid.z}, dt_emu_dim3{block.x, block.y, block.z},
                      smem,
                      [](void *p) {
                          call *k = static_cast<call *>(p);
                          std::apply(k->kernel, k->args);
                      },
                      &c, err, sizeof err))
        dt_emu_cuda_set_launch_error(err);
#else
    kernel<<<grid, block, smem, stream>>>(args...);
#endif
}

#endif /* DT_CUDA_LAUNCH_CUH */
