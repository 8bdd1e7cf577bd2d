/* attention/cuda/ptx_sm90.cuh — PRIVATE. The Hopper (sm_90a) instructions of
 * the wgmma kernels (wgmma_fwd.cu forward, wgmma_bwd.cu
 * backward): warpgroup MMA (wgmma.mma_async m64nNk16 with f32 accumulators,
 * A from shared memory or registers, B from shared memory), its fence /
 * commit / wait, the async-proxy fence, named barriers, mbarriers, TMA
 * tile loads (cp.async.bulk.tensor), bulk reductions (cp.reduce.async.bulk)
 * and stmatrix, the shared-memory matrix descriptors
 * of the 128-byte swizzled layout the kernels keep their tiles in, and on
 * the host the tensor maps of those loads. CUDA C++ only.
 *
 * wgmma needs the architecture-specific target sm_90a: the Makefile builds
 * wgmma_fwd.cu and wgmma_bwd.cu for it (when NVCC_ARCH is
 * sm_90) and defines DT_WGMMA_SM90A; device code for any other target keeps
 * trapping stubs (DT_WGMMA_STUB) and the host never launches them
 * (dt_attn_wgmma_supported).
 * Under DT_CUDA_EMULATE the same operations call the CPU emulator
 * (tests/emu/emu.h), which implements them from the PTX ISA.
 *
 * Shared-memory tiles ("column blocks"). A tile of R rows x D columns of
 * 16-bit elements is stored as D/64 column blocks, block b holding columns
 * 64b .. 64b+63 of every row: R rows of 128 bytes, row r at byte 128 r of
 * the block, its 16-byte chunk c (columns 8c .. 8c+7 of the block) at chunk
 * position c ^ (r % 8). Blocks are R * 128 bytes apart and every block
 * starts on a 1024-byte boundary of the shared window. That is the PTX
 * ISA's 128-byte swizzle (address bits 4-6 XOR bits 7-9) of its canonical
 * layouts (section "Shared Memory Matrix Layout", T = 8 elements per 16
 * bytes):
 *   K-major  ((8,m),(T,2k)):((8T,SBO),(1,T)):  rows of the operand are tile
 *            rows (queries of Q, keys of K), K runs along a row; 8-row groups
 *            SBO = 1024 bytes apart; LBO unused (encoded 1). The k-step of
 *            16 columns kk starts in block kk / 4 at byte 32 (kk % 4).
 *   MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): a B operand whose K runs
 *            down the tile (V in O = P V, stored [key][d]; the backward's
 *            dO, Q and K): K = tile rows, 8-row groups SBO = 1024 bytes
 *            apart; N = the columns, the next 64 of them the next column
 *            block, LBO = R * 128 bytes on. The k-step of 16 rows kk
 *            starts at byte 2048 kk of block 0 (wgmma_ss with TRANS_B = 1,
 *            or wgmma_rs).
 * Because the swizzle acts on address bits, a k-step start inside a
 * 1024-byte atom (K-major, byte 32 (kk % 4)) needs no base offset: the
 * hardware swizzles the full address, as TMA did when it wrote the tile
 * (its CU_TENSOR_MAP_SWIZZLE_128B is the same XOR of the same address bits,
 * for a box whose rows are 128 bytes).
 */
#ifndef DT_ATTN_WGMMA_DEVICE_CUH
#define DT_ATTN_WGMMA_DEVICE_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../../base/dtype.h"
#include "../../base/status.h"

#if !defined(DT_CUDA_EMULATE) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DT_WGMMA_STUB 1   /* device pass for a target without wgmma */
#endif

#ifndef DT_WGMMA_STUB
namespace {

/* ------------------------------------------------------------ descriptors */

/* Shared-window address of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t wg_smem_addr(const void *p) {
#ifdef DT_CUDA_EMULATE
    return dt_emu_smem_addr(p);
#else
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

/* Matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address,
 * leading and stride byte offsets, each (x & 0x3FFFF) >> 4 in 14 bits, base
 * offset 0 (atoms on 1024-byte boundaries), swizzle mode 1 (128 bytes). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | (uint64_t)((lbo & 0x3FFFFu) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFFu) >> 4) << 32 | (uint64_t)1 << 62;
}

/* The descriptor of addr + off from d, addr's: the start address field
 * (bits 0-13, the address / 16) plus off / 16, in the low word alone. The
 * field cannot carry: addr + off lies in the shared window, below 256 KiB
 * (2^18, the field's reach). So the k-steps of a product can share one
 * descriptor made from the tile's address and each add a constant to it:
 * one integer add where making each from its address takes the masks and
 * shifts of wg_desc, in the issue slots the softmax needs. */
__device__ __forceinline__ uint64_t wg_desc_plus(uint64_t d, uint32_t off) {
    const uint32_t lo = (uint32_t)d + (off >> 4), hi = (uint32_t)(d >> 32);
    return (uint64_t)hi << 32 | lo;
}

/* K-major operand of `rows` tile rows: k-step kk (16 columns) lies
 * wg_k_major_off(rows, kk) bytes after the tile's start. */
__device__ __forceinline__ uint32_t wg_k_major_off(int rows, int kk) {
    return (uint32_t)(kk / 4) * (uint32_t)rows * 128u + (uint32_t)(kk % 4) * 32u;
}
__device__ __forceinline__ uint64_t wg_desc_k_major(uint32_t tile, int rows, int kk) {
    return wg_desc(tile + wg_k_major_off(rows, kk), 16u, 1024u);
}

/* MN-major B operand of a `rows`-row tile (rows = K): k-step kk (16 rows). */
__device__ __forceinline__ uint64_t wg_desc_mn_major(uint32_t tile, int rows, int kk) {
    return wg_desc_plus(wg_desc(tile, (uint32_t)rows * 128u, 1024u), (uint32_t)kk * 2048u);
}

/* Byte offset of element (row, col) in a tile of `rows` rows in the
 * column-block layout above (for ordinary stores into a tile that wgmma
 * reads; the block must start on a 1024-byte boundary). */
__device__ __forceinline__ uint32_t wg_tile_off(int row, int col, int rows) {
    return (uint32_t)(col / 64) * (uint32_t)rows * 128u + (uint32_t)row * 128u +
           ((uint32_t)((col % 64) / 8 ^ (row % 8)) << 4) + (uint32_t)(col % 8) * 2u;
}

/* ------------------------------------------------------------ instructions */

#ifdef DT_CUDA_EMULATE
template <typename T>
struct dt_elem_dtype;
template <>
struct dt_elem_dtype<__nv_bfloat16> {
    static constexpr dt_dtype value = DT_BF16;
};
template <>
struct dt_elem_dtype<__half> {
    static constexpr dt_dtype value = DT_F16;
};

template <int BASE>
__device__ __forceinline__ void bar_sync(int which, int n) {
    dt_emu_bar_sync(BASE + which, n);
}
template <int BASE>
__device__ __forceinline__ void bar_arrive(int which, int n) {
    dt_emu_bar_arrive(BASE + which, n);
}
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) { dt_emu_mbar_init(bar, count); }
__device__ __forceinline__ void fence_mbar_init() { dt_emu_fence_mbarrier_init(); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    dt_emu_mbar_arrive_expect_tx(bar, bytes);
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) { dt_emu_mbar_arrive(bar); }
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) { dt_emu_mbar_wait(bar, parity); }
__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            int c3, uint64_t *bar) {
    const int32_t c[4] = {c0, c1, c2, c3};
    dt_emu_tma_load(dst, map, c, 4, bar);
}
__device__ __forceinline__ void tma_load_5d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            int c3, int c4, uint64_t *bar) {
    const int32_t c[5] = {c0, c1, c2, c3, c4};
    dt_emu_tma_load(dst, map, c, 5, bar);
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) { dt_emu_tma_prefetch(map); }
__device__ __forceinline__ void fence_proxy_async() { dt_emu_fence_proxy_async(); }
__device__ __forceinline__ void stmatrix_x4_trans(void *row, const uint32_t (&r)[4]) {
    dt_emu_stmatrix_x4(row, r, 1);
}
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes) {
    dt_emu_bulk_reduce_add_f32(dst, src, bytes);
}
__device__ __forceinline__ void bulk_commit() { dt_emu_bulk_commit(); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    dt_emu_bulk_wait(N);
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
    dt_emu_bulk_wait(N);
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    dt_emu_setmaxnreg(1, N);
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    dt_emu_setmaxnreg(0, N);
}
__device__ __forceinline__ void wgmma_fence() { dt_emu_wgmma_fence(); }
__device__ __forceinline__ void wgmma_commit() { dt_emu_wgmma_commit(); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    dt_emu_wgmma_wait(N);
}
/* d (m64 x N fp32, n-tile j = columns 8j .. 8j+7) = A B + (scale_d ? d : 0):
 * A from shared memory (K-major), B K-major (TRANS_B 0) or MN-major (1). */
template <typename T, int N, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db,
                                         int scale_d) {
    dt_emu_wgmma(&d[0][0], N, nullptr, da, db, scale_d, TRANS_B, dt_elem_dtype<T>::value);
}
/* The same with A from registers (the m16n8k16 A fragment of the thread's
 * warp, rows 16 (warp % 4) ..) and B MN-major. */
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db,
                                         int scale_d) {
    dt_emu_wgmma(&d[0][0], N, a, 0, db, scale_d, 1, dt_elem_dtype<T>::value);
}
#else
/* Named barrier BASE + which (which 0 or 1; ids 1..15, 0 is
 * __syncthreads's) of n threads: bar.sync waits for the phase to complete,
 * bar.arrive counts without waiting. The ids are immediates, so ptxas
 * reserves only the barriers used. */
template <int BASE>
__device__ __forceinline__ void bar_sync(int which, int n) {
    if (which) asm volatile("bar.sync %0, %1;\n" ::"n"(BASE + 1), "r"(n) : "memory");
    else asm volatile("bar.sync %0, %1;\n" ::"n"(BASE), "r"(n) : "memory");
}
template <int BASE>
__device__ __forceinline__ void bar_arrive(int which, int n) {
    if (which) asm volatile("bar.arrive %0, %1;\n" ::"n"(BASE + 1), "r"(n) : "memory");
    else asm volatile("bar.arrive %0, %1;\n" ::"n"(BASE), "r"(n) : "memory");
}

/* mbarrier in shared memory: init with the expected arrival count; the
 * fence makes the initialisation visible to the async proxy (TMA). */
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(wg_smem_addr(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* One arrival that also expects `bytes` of TMA transactions this phase. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(wg_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}
/* One arrival. */
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(wg_smem_addr(bar)) : "memory");
}
/* Fails the launch. A call, not the trap inlined: ptxas gives a region
 * after setmaxnreg.inc its new register count only if no trap lies in it
 * (CUDA 13.0: with the trap inline the forward's consumers kept the 168
 * registers of the CTA's entry and spilled). */
__device__ __noinline__ void wg_fail() { __trap(); }

/* Until the phase of parity `parity` has completed. Bounded: a phase that
 * has not completed after DT_WG_WAIT_NS of the global timer (a TMA that
 * never lands) traps, which fails the launch instead of hanging the GPU. */
#define DT_WG_WAIT_NS 10000000000ull
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    const uint32_t addr = wg_smem_addr(bar);
    uint64_t t0 = 0;
    for (;;) {
        uint32_t done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
        if (done) return;
        uint64_t now;
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
        if (!t0) t0 = now;
        else if (now - t0 > DT_WG_WAIT_NS) wg_fail();
    }
}
/* TMA: the box of `map` at element coordinates (c0 innermost .. c3) into
 * shared memory at dst (1024-aligned for the 128-byte swizzle), completing
 * its bytes on bar. */
__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            int c3, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(wg_smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
        "r"(wg_smem_addr(bar))
        : "memory");
}
/* The same through a 5-D map (c0 innermost .. c4). */
__device__ __forceinline__ void tma_load_5d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            int c3, int c4, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(wg_smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
        "r"(wg_smem_addr(bar))
        : "memory");
}
/* A hint: the tensor map (a kernel parameter) into the SM's descriptor
 * cache, so that the first TMA through it need not fetch it (CUTLASS's
 * kernels prefetch theirs at their start likewise). */
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
/* This thread's shared-memory stores become visible to the async proxy
 * (the wgmma reading them), once a barrier has ordered them. */
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* The warp's four 8x8 matrices of 16-bit elements, register m of lane l
 * holding row l/4, columns 2(l%4) (low half) and +1 of matrix m (an mma
 * fragment's layout, as ldmatrix loads it), stored transposed: column c of
 * matrix m as the 16 bytes at the address of lane 8m + c (`row`, 16-byte
 * aligned in shared memory). */
__device__ __forceinline__ void stmatrix_x4_trans(void *row, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(wg_smem_addr(row)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
/* dst[i] += src[i] for the `bytes` (a multiple of 16) of fp32 at src
 * (shared memory) and dst (global), both 16-byte aligned: one bulk
 * reduction by the TMA unit, which reads src through the async proxy (its
 * writers' fence.proxy.async and a barrier come first) and completes in
 * this thread's bulk groups: bulk_commit closes a group, bulk_wait_read<N>
 * waits until all but the newest N groups have read their sources (free
 * to be written again), bulk_wait<N> until their adds are done too. */
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(wg_smem_addr(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/* The calling warpgroup's registers per thread become N (24 .. 256, a
 * multiple of 8; every thread of the warpgroup executes the same one):
 * .inc waits until the CTA's other warpgroups have released enough by
 * .dec. A CTA's warps share each SM sub-partition's 16,384 registers,
 * three warps of a CTA of 12 or 9 on one, so ptxas gives each thread 168
 * at the most; a warpgroup that needs few gives them to those that need
 * many. */
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* The accumulator operands: n-tile j's four fp32 registers d[j][0..3] are
 * registers 4j .. 4j+3 of the instruction's D vector. */
#define DT_WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define DT_WG_D32 DT_WG_D4(0), DT_WG_D4(1), DT_WG_D4(2), DT_WG_D4(3), DT_WG_D4(4), DT_WG_D4(5), \
    DT_WG_D4(6), DT_WG_D4(7)
#define DT_WG_D64 DT_WG_D32, DT_WG_D4(8), DT_WG_D4(9), DT_WG_D4(10), DT_WG_D4(11), DT_WG_D4(12), \
    DT_WG_D4(13), DT_WG_D4(14), DT_WG_D4(15)
#define DT_WG_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
    "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define DT_WG_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
    "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, " \
    "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* wgmma.mma_async ... d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b,
 * imm-trans-a, imm-trans-b (A K-major: trans 0; B K-major: TB 0, MN-major:
 * TB 1). */
#define DT_WG_SS(TY, NN, DREGS, DOPS, IA, IB, IS, TB)                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                          \
                 "wgmma.mma_async.sync.aligned.m64n" #NN "k16.f32." TY "." TY " " DREGS        \
                 ", %" #IA ", %" #IB ", p, 1, 1, 0, " #TB ";\n}\n"                             \
                 : DOPS                                                                      \
                 : "l"(da), "l"(db), "r"(scale_d))
/* wgmma.mma_async ... d, {a0..a3}, b-desc, scale-d, imm-scale-a,
 * imm-scale-b, imm-trans-b (B MN-major: trans 1). */
#define DT_WG_RS(TY, NN, DREGS, DOPS, A0, A1, A2, A3, IB, IS)                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                          \
                 "wgmma.mma_async.sync.aligned.m64n" #NN "k16.f32." TY "." TY " " DREGS        \
                 ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #IB ", p, 1, 1, 1;\n}\n"      \
                 : DOPS                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))

template <typename T, int N>
struct wg_ops;
#define DT_WG_OPS(CT, TY)                                                                    \
    template <>                                                                              \
    struct wg_ops<CT, 64> {                                                                  \
        static __device__ __forceinline__ void ss(float (&d)[8][4], uint64_t da, uint64_t db,   \
                                                  int scale_d) {                             \
            DT_WG_SS(TY, 64, DT_WG_R32, DT_WG_D32, 32, 33, 34, 0);                           \
        }                                                                                    \
        static __device__ __forceinline__ void ss_t(float (&d)[8][4], uint64_t da, uint64_t db, \
                                                    int scale_d) {                           \
            DT_WG_SS(TY, 64, DT_WG_R32, DT_WG_D32, 32, 33, 34, 1);                           \
        }                                                                                    \
        static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4],   \
                                                  uint64_t db, int scale_d) {                \
            DT_WG_RS(TY, 64, DT_WG_R32, DT_WG_D32, 32, 33, 34, 35, 36, 37);                              \
        }                                                                                    \
    };                                                                                       \
    template <>                                                                              \
    struct wg_ops<CT, 128> {                                                                 \
        static __device__ __forceinline__ void ss(float (&d)[16][4], uint64_t da, uint64_t db, \
                                                  int scale_d) {                             \
            DT_WG_SS(TY, 128, DT_WG_R64, DT_WG_D64, 64, 65, 66, 0);                          \
        }                                                                                    \
        static __device__ __forceinline__ void rs(float (&d)[16][4], const uint32_t (&a)[4],  \
                                                  uint64_t db, int scale_d) {                \
            DT_WG_RS(TY, 128, DT_WG_R64, DT_WG_D64, 64, 65, 66, 67, 68, 69);                             \
        }                                                                                    \
    };
DT_WG_OPS(__nv_bfloat16, "bf16")
DT_WG_OPS(__half, "f16")

template <typename T, int N, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db,
                                         int scale_d) {
    if constexpr (TRANS_B != 0) wg_ops<T, N>::ss_t(d, da, db, scale_d);
    else wg_ops<T, N>::ss(d, da, db, scale_d);
}
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db,
                                         int scale_d) {
    wg_ops<T, N>::rs(d, a, db, scale_d);
}
#endif /* DT_CUDA_EMULATE */

}  // namespace
#endif /* !DT_WGMMA_STUB */

/* ------------------------------------------------------ host: tensor maps */

namespace {

/* cuTensorMapEncodeTiled, a driver function, through the runtime (so the
 * library links no libcuda): looked up once; NULL if the driver lacks it. */
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;   /* racing lookups store the same value */
    PFN_cuTensorMapEncodeTiled_v12000 f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (!f) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = nullptr;
        (void)cudaGetLastError();
        f = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }
    return f;
}

/* The map of a [batch][rows][heads][D] 16-bit tensor at base (batch
 * stride in elements), 128-byte swizzle. slots 0 or 1 (as block.h's
 * kv_slots): 4-D, {D, heads, rows, batch}, boxes of 64 x 1 x box_rows x 1.
 * slots > 1: its rows are
 * interleaved from `slots` slots of `rows` rows each (block.h's
 * dt_attn_key_row; slot s at rows s rows ..), 5-D, {D, heads, slots, rows,
 * batch}, boxes of 64 x 1 x slots x box_rows / slots x 1, which land in
 * shared memory in the interleaved order: row j of a box at coordinate
 * (.., 0, r0, ..) is row r0 + j / slots of slot j % slots. Its strides do
 * not grow with the dimension (a slot's is rows times a row's), which the
 * driver's documentation neither promises nor rules out:
 * dt_attn_wgmma_slots_ok asks it once. The driver's verdict. */
CUresult encode_map(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap *map, const void *base,
                    dt_dtype dtype, int64_t dim, int64_t heads, int64_t rows, int64_t batch,
                    int64_t batch_stride, int box_rows, int64_t slots) {
    const int64_t es = 2, row_bytes = heads * dim * es;
    /* one batch: any stride will do, and the driver wants one that is not 0 */
    const int interleaved = slots > 1;
    const int64_t bs = batch > 1 ? batch_stride : rows * heads * dim * (interleaved ? slots : 1);
    const cuuint32_t rank = interleaved ? 5 : 4;
    cuuint64_t dims[5] = {(cuuint64_t)dim, (cuuint64_t)heads, (cuuint64_t)rows, (cuuint64_t)batch, 0};
    cuuint64_t strides[4] = {(cuuint64_t)(dim * es), (cuuint64_t)row_bytes, (cuuint64_t)(bs * es), 0};
    cuuint32_t box[5] = {64, 1, (cuuint32_t)box_rows, 1, 0}, elem_strides[5] = {1, 1, 1, 1, 1};
    if (interleaved) {
        dims[2] = (cuuint64_t)slots, dims[3] = (cuuint64_t)rows, dims[4] = (cuuint64_t)batch;
        strides[1] = (cuuint64_t)(rows * row_bytes), strides[2] = (cuuint64_t)row_bytes;
        strides[3] = (cuuint64_t)(bs * es);
        box[2] = (cuuint32_t)slots, box[3] = (cuuint32_t)(box_rows / slots), box[4] = 1;
    }
    return encode(map, dtype == DT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                  rank, const_cast<void *>(base), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* encode_map, its refusal an error naming the tensor. */
dt_status make_map(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap *map, const char *name,
                   const void *base, dt_dtype dtype, int64_t dim, int64_t heads, int64_t rows,
                   int64_t batch, int64_t batch_stride, int box_rows, int64_t slots = 0) {
    const CUresult r =
        encode_map(encode, map, base, dtype, dim, heads, rows, batch, batch_stride, box_rows, slots);
    if (r != CUDA_SUCCESS)
        return dt_error(DT_ERR_BACKEND, "attention (cuda wgmma): cuTensorMapEncodeTiled refused %s "
                        "(%p, [%lld, %lld, %lld, %lld], batch stride %lld, %lld slots): CUresult %d",
                        name, base, (long long)batch, (long long)rows, (long long)heads,
                        (long long)dim, (long long)batch_stride, (long long)slots, (int)r);
    return DT_SUCCESS;
}

/* The maps of one block's operands (A: dt_attn_block_args or
 * dt_attn_block_bwd_args): q (and dout, when asked for) over the query
 * segment's rows in boxes of q_box rows, k and v over the key segment's in
 * boxes of kv_box rows: 4-D maps, or with kv_slots > 1 5-D ones of keys
 * interleaved from kv_slots slots of kv_slot_rows rows (make_map; kv_slots
 * divides kv_box). DT_ERR_NOT_SUPPORTED if the
 * driver has no cuTensorMapEncodeTiled. */
template <class A>
dt_status make_block_maps(const A &a, int q_box, int kv_box, CUtensorMap *q, CUtensorMap *k,
                          CUtensorMap *v, const void *dout = nullptr, CUtensorMap *dout_map = nullptr,
                          int64_t kv_slots = 0, int64_t kv_slot_rows = 0) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
    if (!encode)
        return dt_error(DT_ERR_NOT_SUPPORTED, "attention (cuda wgmma): the CUDA driver has no "
                        "cuTensorMapEncodeTiled (TMA needs a CUDA 12 driver)");
    DT_TRY(make_map(encode, q, "q", a.q, a.dtype, a.dim, a.heads, a.qseg.len, a.batch,
                    a.q_batch_stride, q_box));
    if (dout_map)
        DT_TRY(make_map(encode, dout_map, "dout", dout, a.dtype, a.dim, a.heads, a.qseg.len,
                        a.batch, a.q_batch_stride, q_box));
    const int64_t kv_rows = kv_slots > 1 ? kv_slot_rows : a.kseg.len;
    DT_TRY(make_map(encode, k, "k", a.k, a.dtype, a.dim, a.kv_heads, kv_rows, a.batch,
                    a.kv_batch_stride, kv_box, kv_slots));
    return make_map(encode, v, "v", a.v, a.dtype, a.dim, a.kv_heads, kv_rows, a.batch,
                    a.kv_batch_stride, kv_box, kv_slots);
}

}  // namespace
#endif /* DT_ATTN_WGMMA_DEVICE_CUH */
