/* tests/emu/cuda_emu.h — the CUDA C++ a source sees when the host C++
 * compiler builds it for the emulator (emu.h): qualifiers that mean nothing
 * on the CPU, static __shared__ arrays, dim3, the built-in indices,
 * __syncthreads and the warp shuffle (fp32, fp64), fp32 and float2 atomicAdd, float2 / uint2 /
 * uint4 / float4, cache-streaming loads and stores, the bf16 / fp16 types with
 * their round-to-nearest-even conversions (base/dtype.h's), the
 * arithmetic intrinsics used, and the
 * host API (cuda_runtime_api.h, cudart.c). Reached through
 * tests/emu/include/{cuda_runtime,cuda_bf16,cuda_fp16}.h. Only what the
 * CUDA sources use. */
#ifndef DT_TEST_CUDA_EMU_H
#define DT_TEST_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is for CUDA sources compiled as C++ (DT_CUDA_EMULATE)"
#endif

#include <initializer_list>   /* CUDA's own headers bring it in */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "emu.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* A kernel parameter kept in parameter space (a CUtensorMap taken by value,
 * whose address cp.async.bulk.tensor needs): an ordinary parameter here. */
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
/* A static __shared__ array: one per kernel instantiation, which the blocks
 * share one after another, as on a GPU where each block sees its own. */
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct CUstream_st *cudaStream_t;

#define threadIdx (*dt_emu_thread_idx())
#define blockIdx (*dt_emu_block_idx())
#define blockDim (*dt_emu_block_dim())
#define gridDim (*dt_emu_grid_dim())

inline void __syncthreads() { dt_emu_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { dt_emu_syncwarp(mask); }
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    return dt_emu_shfl_xor(mask, v, lane_mask);
}
/* A double moves as two 32-bit shuffles, as CUDA's own overload does. */
inline double __shfl_xor_sync(unsigned mask, double v, int lane_mask) {
    float half[2];
    memcpy(half, &v, sizeof v);
    for (int k = 0; k < 2; k++) half[k] = dt_emu_shfl_xor(mask, half[k], lane_mask);
    memcpy(&v, half, sizeof v);
    return v;
}
/* Fibers never run at the same time: a plain read-add-write is atomic. */
inline float atomicAdd(float *p, float v) {
    dt_emu_griddep_require("atomicAdd");
    const float old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    dt_emu_griddep_require("atomicAdd");
    const unsigned old = *p;
    *p = old + v;
    return old;
}
[[noreturn]] inline void __trap() { dt_emu_fail("__trap()"); }
/* Fibers never run at the same time, and run one block after another:
 * every write is seen by every later read. */
inline void __threadfence() {}

struct __attribute__((aligned(8))) float2 {
    float x, y;
};
/* The float2 atomicAdd of compute capability 9.x (the emulated device's):
 * one 8-byte access, which must be 8-byte aligned. */
inline float2 atomicAdd(float2 *p, float2 v) {
    if ((uintptr_t)p % 8) dt_emu_fail("float2 atomicAdd at %p: not 8-byte aligned", (void *)p);
    dt_emu_griddep_require("atomicAdd");
    const float2 old = *p;
    p->x = old.x + v.x;
    p->y = old.y + v.y;
    return old;
}
/* A reduction (RED: p += v, nothing returned) that the kernel declares
 * commutes with the grid before's: that grid only reduces into p too (the
 * backward's dQ). So, unlike atomicAdd, a programmatic dependent launch may
 * make it before griddepcontrol.wait; the emulator takes the kernel's word
 * for what the grid before does there. */
inline void dt_emu_reduce_add(float2 *p, float2 v) {
    if ((uintptr_t)p % 8) dt_emu_fail("float2 reduction at %p: not 8-byte aligned", (void *)p);
    p->x += v.x;
    p->y += v.y;
}
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
/* Cache-streaming load and store (ld.global.cs, st.global.cs): a cache
 * hint, nothing to emulate. */
template <typename T>
inline T __ldcs(const T *p) { return *p; }
template <typename T>
inline void __stcs(T *p, T v) { *p = v; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;   /* x in the low half */
};
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{{dt_f32_to_bf16(lo)}, {dt_f32_to_bf16(hi)}};
}

inline float __bfloat162float(__nv_bfloat16 x) { return dt_bf16_to_f32(x.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return __nv_bfloat16{dt_f32_to_bf16(x)}; }

struct __half {
    uint16_t bits;
};
struct __half2 {
    __half x, y;
};
inline __half2 __floats2half2_rn(float lo, float hi) {
    return __half2{{dt_f32_to_f16(lo)}, {dt_f32_to_f16(hi)}};
}
inline float __half2float(__half x) { return dt_f16_to_f32(x.bits); }
inline __half __float2half_rn(float x) { return __half{dt_f32_to_f16(x)}; }

/* Arithmetic intrinsics: the rounded operations are plain fp32 operations
 * here (built with -ffp-contract=off, nothing is fused into an FMA);
 * __expf is CUDA's fast approximation, within a few ulp: expf. sincos is
 * glibc's (g++ defines _GNU_SOURCE). */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __expf(float x) { return expf(x); }
inline float __uint_as_float(unsigned x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

#endif /* DT_TEST_CUDA_EMU_H */
