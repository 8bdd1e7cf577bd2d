/* base/cuda_launch.cuh — PRIVATE. The one way the CUDA sources launch a
 * kernel and declare dynamic shared memory, so that the same sources also
 * run on the CPU emulator of tests/emu (emu.h) when the host C++ compiler
 * builds them with DT_CUDA_EMULATE (make CUDA=emu, and test_mma_emu).
 *
 *   dt_cuda_launch(kernel, grid, block, smem, stream, args...)
 *       is kernel<<<grid, block, smem, stream>>>(args...); check it with
 *       cudaGetLastError() as after <<<>>>. On the emulator the launch is
 *       queued on the stream and runs when the host waits for it; a kernel
 *       the emulator rejects (an out-of-bounds shared-memory access, a
 *       deadlock, ...) then makes the stream report cudaErrorLaunchFailure,
 *       its reason printed on stderr.
 *   dt_cuda_launch_ex(kernel, grid, block, smem, stream, dependent, args...)
 *       the same; with dependent, as a programmatic dependent launch
 *       (cudaLaunchAttributeProgrammaticStreamSerialization, compute
 *       capability 9.0 on): the kernel may start before the kernel before
 *       it on the stream has completed, once that one's CTAs have all run
 *       griddepcontrol.launch_dependents or exited, and must run
 *       griddepcontrol.wait before it reads what that one wrote. A kernel
 *       whose device code for this GPU was compiled for an architecture
 *       before 9.0 (an sm_80 build JIT-compiled on an H100) has no
 *       griddepcontrol.wait, which attention/cuda/common.cuh emits from 9.0 on: it is
 *       launched as an ordinary one. The emulator runs a dependent launch
 *       after the kernel before, as any launch, and checks what the kernel
 *       marks (emu.h, dt_emu_griddep_require).
 *   DT_DYNAMIC_SMEM(type, name);
 *       is extern __shared__ __align__(128) type name[].
 * CUDA C++ only.
 */
#ifndef DT_CUDA_LAUNCH_CUH
#define DT_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef DT_CUDA_EMULATE
#include <stdlib.h>

#include <new>
#include <tuple>

#include "cudart_emu.h"
#define DT_DYNAMIC_SMEM(type, name) type *const name = reinterpret_cast<type *>(dt_emu_dynamic_smem())
#else
#define DT_DYNAMIC_SMEM(type, name) extern __shared__ __align__(128) type name[]
#endif

template <typename... P, typename... A>
inline void dt_cuda_launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t stream, bool dependent, A... args) {
#ifdef DT_CUDA_EMULATE
    /* Queued on the stream like any other work (tests/emu/cudart.c): it
     * runs when the host waits for the stream. */
    struct call {
        void (*kernel)(P...);
        std::tuple<P...> args;
        dt_emu_dim3 grid, block;
        size_t smem;
        bool dependent;
    };
    /* aligned as the arguments need (a CUtensorMap parameter: 128 bytes) */
    void *mem = aligned_alloc(alignof(call), (sizeof(call) + alignof(call) - 1) / alignof(call) * alignof(call));
    if (!mem) {
        dt_emu_cuda_set_launch_error("out of host memory for a kernel launch");
        return;
    }
    call *c = new (mem) call{kernel, std::tuple<P...>(args...), dt_emu_dim3{grid.x, grid.y, grid.z},
                             dt_emu_dim3{block.x, block.y, block.z}, smem, dependent};
    auto run = [](void *p, char *err, size_t err_size) -> int {
        call *k = static_cast<call *>(p);
        int rc = dt_emu_launch(k->grid, k->block, k->smem, k->dependent,
                               [](void *q) {
                                   call *kq = static_cast<call *>(q);
                                   std::apply(kq->kernel, kq->args);
                               },
                               k, err, err_size);
        k->~call();
        free(k);
        return rc;
    };
    if (dt_emu_cuda_enqueue(stream, run, c) != cudaSuccess) {
        c->~call();
        free(c);
    }
#else
    /* ptxVersion: the virtual architecture of the code that runs the kernel
     * on the current device. A failed query launches it as an ordinary
     * kernel, and leaves its error for the caller's check. */
    cudaFuncAttributes fa;
    if (dependent && (cudaFuncGetAttributes(&fa, reinterpret_cast<const void *>(kernel)) !=
                          cudaSuccess ||
                      fa.ptxVersion < 90))
        dependent = false;
    if (!dependent) {
        kernel<<<grid, block, smem, stream>>>(args...);
        return;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    /* a failure is also the runtime's last error, as after <<<>>> */
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
#endif
}

template <typename... P, typename... A>
inline void dt_cuda_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                           cudaStream_t stream, A... args) {
    dt_cuda_launch_ex(kernel, grid, block, smem, stream, false, args...);
}

#endif /* DT_CUDA_LAUNCH_CUH */
