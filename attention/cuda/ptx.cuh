/* attention/cuda/ptx.cuh — PRIVATE. The PTX the sm_80 tensor-core kernels
 * use, one inline wrapper per instruction: cp.async, ldmatrix, mma.sync
 * m16n8k16 (bf16, fp16), the timers and SM id, programmatic dependent launch
 * (griddepcontrol), L2 prefetch, ex2.approx.ftz, max.NaN and the quad
 * shuffles.
 *
 * DT_CUDA_EMULATE (the CPU emulator, tests/emu/emu.h): each wrapper calls the
 * emulator's implementation of the instruction instead; nothing else changes.
 * Device code for compute capability < 8.0 keeps none of it (DT_MMA_STUB).
 * Test: tests/test_mma_emu.c checks the emulator's instructions and the kernels.
 */
#ifndef DT_ATTN_CUDA_PTX_CUH
#define DT_ATTN_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#ifdef DT_CUDA_EMULATE
#include <time.h>
#endif

#include "../../base/cuda_launch.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define DT_MMA_STUB 1
#endif

#ifndef DT_MMA_STUB
namespace {

/* ------------------------------------------------------------ PTX wrappers */

#ifdef DT_CUDA_EMULATE
/* The same operations on the CPU emulator (tests/emu/emu.h). */
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, bool valid) {
    dt_emu_cp_async16(smem, gmem, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() { dt_emu_cp_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    dt_emu_cp_wait(N);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
    dt_emu_ldmatrix_x4(r, row, 0);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
    dt_emu_ldmatrix_x4(r, row, 1);
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    dt_emu_mma_m16n8k16(d, a, b0, b1, DT_BF16);
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
    dt_emu_mma_m16n8k16(d, a, b0, b1, DT_F16);
}
/* The clocks of a CTA trace: the host's monotonic clock, one "SM". */
__device__ __forceinline__ uint64_t global_ns() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
__device__ __forceinline__ uint64_t sm_clock() { return global_ns(); }
__device__ __forceinline__ uint32_t sm_id() { return 0; }
#else
/* 32-bit shared-memory address of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* 16 bytes global -> shared, asynchronously; 16 zero bytes if !valid (the
 * source is then not read, but is still a valid address). */
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
                 "l"(gmem), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Wait until at most N of this thread's commit groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 b16 matrices; lane l gives the row address for matrix l / 8. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row))
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row))
                 : "memory");
}

/* d = A B + d, A 16x16 (4 regs), B 16x8 (2 regs), d 16x8 fp32. */
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The GPU's global nanosecond timer, this SM's cycle counter, this SM. */
__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint64_t sm_clock() { return (uint64_t)clock64(); }
__device__ __forceinline__ uint32_t sm_id() {
    uint32_t s;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(s));
    return s;
}
#endif /* DT_CUDA_EMULATE */

/* Programmatic dependent launch (compute capability 9.0 on; nothing on
 * older targets, where the host never asks for it: dt_cuda_launch_ex).
 * grid_dep_launch lets the grid launched after this one as its
 * programmatic dependent start once every CTA of this grid has called it
 * or exited (its CTAs then take SMs as this grid's free them);
 * grid_dep_wait waits until the grid this one depends on has completed
 * and its writes are visible. Both do nothing in a grid launched without
 * the attribute. dependent_access marks a read of what the grid before
 * may have written (the rows' running state): on the emulator, a check
 * that the thread has waited if the launch is a dependent one (for the
 * grid, or for the rows' count `rows`: rows_wait); nothing on a GPU. */
__device__ __forceinline__ void grid_dep_launch() {
#ifdef DT_CUDA_EMULATE
    dt_emu_griddep_launch();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_wait() {
#ifdef DT_CUDA_EMULATE
    dt_emu_griddep_wait();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/* A hint: the 128-byte line at p into L2 (no effect on any result). */
__device__ __forceinline__ void prefetch_l2(const void *p) {
#ifdef DT_CUDA_EMULATE
    (void)p;
#else
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}
__device__ __forceinline__ void dependent_access(const char *what, const uint32_t *rows = nullptr) {
#ifdef DT_CUDA_EMULATE
    dt_emu_griddep_require_rows(what, rows);
#else
    (void)what;
    (void)rows;
#endif
}

/* 2^x by the SFU alone (ex2.approx.ftz), the instruction exp2f itself
 * computes with: exp2f (without fast math) wraps it in a test and two
 * predicated multiplies per value, to return the results below 2^-126 as
 * subnormals, and its last multiply waits for the SFU's result at once;
 * here those are 0, and every other value is exp2f's, bit for bit. The
 * kernels' exponents are a score less its row's running maximum (forward)
 * or log-sum-exp (backward), so what is flushed is below 2^-126 where the
 * row's largest term is 1, or at least 1 over its keys. */
__device__ __forceinline__ float exp2_ftz(float x) {
#ifdef DT_CUDA_EMULATE
    return dt_emu_ex2_ftz(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

/* The larger of a and b, NaN if either is NaN (max.NaN.f32, sm_80: fmaxf
 * returns the other operand): the row maxima of the kernels' instances
 * that keep NaN (block.h's nonfinite). */
__device__ __forceinline__ float max_nan(float a, float b) {
#ifdef DT_CUDA_EMULATE
    return dt_emu_max_nan(a, b);
#else
    float y;
    asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
    return y;
#endif
}

/* Reductions over the 4 lanes of a quad (lanes 4g .. 4g+3 hold row g);
 * quad_max_nan keeps a NaN of any lane. */
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_max_nan(float x) {
    x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace
#endif /* !DT_MMA_STUB */
#endif /* DT_ATTN_CUDA_PTX_CUH */
