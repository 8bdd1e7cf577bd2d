/* attention/block_cuda_wgmma.cu — the Hopper forward block kernel: warpgroup
 * MMA (wgmma, sm_90a) for bf16 and fp16, head dims 64 and 128. STATUS: runs
 * on the CPU emulator of CUDA (tests/emu, test_mma_emu, against the double
 * reference on ring, striped and zigzag blocks), never yet on a GPU; chosen
 * only with DT_ATTN_KERNEL=wgmma until an H100 has measured and checked it
 * (block.h). The portable mma.sync kernel (block_cuda_mma.cu) stays the
 * default on every GPU of compute capability 8.0 or newer.
 *
 * Contract: dt_attn_kernels.fwd of block.h, as block_cuda_mma.cu: one query
 * segment against one key/value segment, GQA, the position mask of mask.h,
 * the fp32 running max m, sum l and unnormalised output acc of each query
 * row read at the start and written back at the end (fused accumulation).
 *
 * Work split. Grid (query tiles, heads, batch), the last query tiles (the
 * most keys under a causal mask) launched first. A CTA of two warpgroups
 * (256 threads) owns BM = 128 query rows, warpgroup w rows 64w .. 64w+63
 * (its warp v rows 16v .. 16v+15 of those, the mma.sync kernel's per-warp
 * fragment layout); key tiles of BN = 128. Per key tile, each warpgroup:
 *   S[64x128] = Q K^T   wgmma m64n128k16, A = Q and B = K from shared
 *                       memory (K-major), D/16 k-steps chained, one commit
 *   online softmax      mma_device.cuh's, on the same per-warp layout
 *   O[64xD]  += P V     wgmma m64nDk16, A = P from registers (the S
 *                       accumulators rounded to T), B = V from shared memory
 *                       (MN-major: V is stored [key][d]), 8 k-steps chained
 * with O in fp32 registers throughout. A warpgroup whose rows see none of a
 * tile's keys (the first 64 rows of a diagonal tile, or rows past the
 * segment) skips the tile's math; the mask and skipping rules are the
 * mma.sync kernel's (mask.h, closed form), with BN = 128.
 *
 * Shared memory: [Q tile][K stage 0][K stage 1][V stage 0][V stage 1], each
 * in wgmma_device.cuh's 128-byte swizzled column-block layout, (BM + 4 BN)
 * D 2 bytes (80 KiB at D = 64, 160 KiB at D = 128) plus 1 KiB to put the
 * first tile on a 1024-byte boundary of the shared window. Copies: cp.async
 * 16 bytes by all 256 threads, rows past the segment zero-filled; Q and key
 * tile 0 are one commit group, tile kt+1's copies fly during tile kt's math
 * (as in the mma.sync kernel). cp.async writes through the generic proxy and
 * wgmma reads through the async proxy, so every thread issues
 * fence.proxy.async after its wait_group, before the barrier that publishes
 * the tile.
 *
 * What is left for an H100 (docs/PERFORMANCE.md): measure it, then TMA
 * loads with mbarriers and a producer warp, and overlap of one warpgroup's
 * softmax with the other's wgmma (FlashAttention-3's ping-pong).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "block_cuda_mma.h"
#include "mma_device.cuh"
#include "mma_layout.h"
#include "wgmma_device.cuh"

namespace {

constexpr int WG_BM = 128;            /* query rows per CTA: 64 per warpgroup */
constexpr int WG_BN = 128;            /* keys per tile */
constexpr int WG_THREADS = 256;       /* two warpgroups */

#ifndef DT_WGMMA_STUB

/* Issue the copies of rows [row0, row0 + ROWS) of a row-major matrix (row r
 * at base + r * row_stride, D contiguous elements) into a column-block tile
 * (wgmma_device.cuh's layout); rows >= nrows are zero-filled. */
template <typename T, int ROWS, int D>
__device__ __forceinline__ void wg_load_tile(unsigned char *tile, const T *base,
                                             int64_t row_stride, int64_t row0, int64_t nrows) {
    constexpr int CHUNKS = D / 8, COPIES = ROWS * CHUNKS;
    static_assert(COPIES % WG_THREADS == 0, "every thread issues the same number of copies");
#pragma unroll
    for (int n = 0; n < COPIES / WG_THREADS; n++) {
        const int e = n * WG_THREADS + (int)threadIdx.x;
        const int r = e / CHUNKS, col = (e % CHUNKS) * 8;
        const bool valid = row0 + r < nrows;
        const T *src = valid ? base + (row0 + r) * row_stride + col : base;
        cp_async_16(tile + wg_chunk_off(r, col, ROWS), src, valid);
    }
}

/* Key tiles with at least one key at or below `limit` keys, and those with
 * every key below it (mma_layout.h's dt_mma_key_tiles / unmasked_tiles for
 * BN = 128). */
__device__ __forceinline__ int64_t wg_key_tiles(int64_t limit) { return (limit + WG_BN - 1) / WG_BN; }
__device__ __forceinline__ int64_t wg_unmasked_tiles(int64_t limit) { return limit / WG_BN; }

#endif /* !DT_WGMMA_STUB */

/* grid: (ceil(qseg.len / 128), heads, batch); block: 256 threads; dynamic
 * shared memory 1024 + (BM + 4 BN) D sizeof(T). */
template <typename T, int D>
__global__ void __launch_bounds__(WG_THREADS) fwd_wgmma_kernel(const dt_attn_block_args a) {
#ifdef DT_WGMMA_STUB
    (void)a;
    __trap();   /* never launched: the host requires an sm_90a build and a 9.0 device */
#else
    constexpr int NT = WG_BN / 8;                                      /* n-tiles of S */
    constexpr int TILE_Q = WG_BM * D * 2, TILE_KV = WG_BN * D * 2;   /* bytes */
    DT_DYNAMIC_SMEM(unsigned char, smem_raw);
    unsigned char *const sq = smem_raw + ((1024u - (wg_smem_addr(smem_raw) & 1023u)) & 1023u);
    unsigned char *const sk = sq + TILE_Q;             /* stage s at sk + s TILE_KV */
    unsigned char *const sv = sq + TILE_Q + 2 * TILE_KV;

    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int wg = warp >> 2, wl = warp & 3;   /* warpgroup, warp within it */
    const int64_t H = a.heads, G = a.kv_heads;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G);
    const int64_t nq = a.qseg.len, nk = a.kseg.len;
    const int64_t x0 = ((int64_t)gridDim.x - 1 - (int64_t)blockIdx.x) * WG_BM;
    const int64_t x1 = x0 + WG_BM < nq ? x0 + WG_BM : nq;

    /* Key tiles of the CTA (uniform: the loads and barriers) and of this
     * warpgroup (uniform over it: its wgmma). */
    const int64_t n_tiles = wg_key_tiles(dt_attn_keys_upto(a.mask, a.kseg, dt_attn_pos(a.qseg, x1 - 1)));
    if (n_tiles == 0) return;   /* every key comes after every query */
    const int64_t w0 = x0 + 64 * wg, w1 = w0 + 64 < x1 ? w0 + 64 : x1;
    const int64_t wg_tiles = w0 < x1 ? wg_key_tiles(dt_attn_keys_upto(a.mask, a.kseg, dt_attn_pos(a.qseg, w1 - 1))) : 0;
    const int64_t wg_unmasked = w0 < x1 ? wg_unmasked_tiles(dt_attn_keys_upto(a.mask, a.kseg, dt_attn_pos(a.qseg, w0))) : 0;

    const T *qg = static_cast<const T *>(a.q) + b * a.q_batch_stride + h * D;   /* row x: + x H D */
    const T *kg = static_cast<const T *>(a.k) + b * a.kv_batch_stride + g * D;  /* row y: + y G D */
    const T *vg = static_cast<const T *>(a.v) + b * a.kv_batch_stride + g * D;
    float *accg = a.acc + b * a.acc_batch_stride + h * D;
    float *mg = a.m + b * a.ml_batch_stride + h * a.ml_head_stride;
    float *lg = a.l + b * a.ml_batch_stride + h * a.ml_head_stride;

    wg_load_tile<T, WG_BM, D>(sq, qg, H * D, x0, nq);
    wg_load_tile<T, WG_BN, D>(sk, kg, G * D, 0, nk);
    wg_load_tile<T, WG_BN, D>(sv, vg, G * D, 0, nk);
    cp_async_commit();

    /* The lane's two rows (half 0: g, half 1: g + 8 of its warp's 16) and
     * their running state, read while the copies fly. */
    int64_t row[2], lim[2];
    bool live[2];
    float m[2], l[2], o[D / 8][4];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        row[half] = x0 + 64 * wg + 16 * wl + dt_mma_c_row(lane, 2 * half);
        live[half] = row[half] < nq;
        m[half] = live[half] ? mg[row[half]] : -INFINITY;
        l[half] = live[half] ? lg[row[half]] : 0.0f;
        lim[half] = live[half] ? dt_attn_keys_upto(a.mask, a.kseg, dt_attn_pos(a.qseg, row[half])) : 0;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            float2 v = make_float2(0.0f, 0.0f);
            if (live[half])
                v = *reinterpret_cast<const float2 *>(accg + row[half] * H * D + 8 * j +
                                                      dt_mma_c_col(lane, 2 * half));
            o[j][2 * half] = v.x;
            o[j][2 * half + 1] = v.y;
        }
    }

    const uint32_t q_addr = wg_smem_addr(sq) + (uint32_t)wg * 64u * 128u;   /* this warpgroup's rows */
    for (int64_t kt = 0; kt < n_tiles; kt++) {
        const int stage = (int)(kt & 1);
        if (kt + 1 < n_tiles) {
            wg_load_tile<T, WG_BN, D>(sk + (stage ^ 1) * TILE_KV, kg, G * D, (kt + 1) * WG_BN, nk);
            wg_load_tile<T, WG_BN, D>(sv + (stage ^ 1) * TILE_KV, vg, G * D, (kt + 1) * WG_BN, nk);
            cp_async_commit();
            cp_async_wait<1>();   /* tile kt (and Q) have landed */
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();   /* this thread's copies, visible to wgmma ... */
        __syncthreads();       /* ... and everyone's */

        if (kt < wg_tiles) {
            /* S = Q K^T: Q's 64 rows of this warpgroup, the tile's 128 keys.
             * Q rows are tile rows of the Q tile (BM rows per column block). */
            float s[NT][4];
            const uint32_t k_addr = wg_smem_addr(sk + stage * TILE_KV);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wgmma_ss<T, WG_BN>(s, wg_desc_k_major(q_addr, WG_BM, kk),
                                   wg_desc_k_major(k_addr, WG_BN, kk), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();

            if (kt < wg_unmasked)
                online_softmax<false, NT, D>(s, m, l, o, lim, kt * WG_BN, lane, a.scale);
            else
                online_softmax<true, NT, D>(s, m, l, o, lim, kt * WG_BN, lane, a.scale);

            /* O += P V: P rounded to T as A fragments, V MN-major. */
            uint32_t pa[WG_BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < WG_BN / 16; kk++) p_fragment<T>(pa[kk], s, kk);
            const uint32_t v_addr = wg_smem_addr(sv + stage * TILE_KV);
            wgmma_fence();   /* o and pa were written by ordinary instructions */
#pragma unroll
            for (int kk = 0; kk < WG_BN / 16; kk++)
                wgmma_rs<T, D>(o, pa[kk], wg_desc_mn_major(v_addr, WG_BN, kk), 1);
            wgmma_commit();
            wgmma_wait<0>();
        }
        __syncthreads();   /* stage is refilled by iteration kt+1's copies */
    }

#pragma unroll
    for (int half = 0; half < 2; half++) {
        if (!live[half]) continue;
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *reinterpret_cast<float2 *>(accg + row[half] * H * D + 8 * j +
                                        dt_mma_c_col(lane, 2 * half)) =
                make_float2(o[j][2 * half], o[j][2 * half + 1]);
        if ((lane & 3) == 0) {
            mg[row[half]] = m[half];
            lg[row[half]] = l[half];
        }
    }
#endif
}

template <typename T, int D>
dt_status launch(cudaStream_t stream, const dt_attn_block_args *a) {
    const dim3 grid((unsigned)((a->qseg.len + WG_BM - 1) / WG_BM), (unsigned)a->heads,
                    (unsigned)a->batch);
    return dt_mma_launch(fwd_wgmma_kernel<T, D>, grid, WG_THREADS,
                         1024 + (size_t)(WG_BM + 4 * WG_BN) * D * sizeof(T), stream, *a,
                         "forward (wgmma)", D, a->dtype);
}

}  // namespace

extern "C" int dt_attn_wgmma_supported(dt_dtype dtype, int64_t dim, int cc, char *why,
                                       size_t why_size) {
#if defined(DT_WGMMA_SM90A) || defined(DT_CUDA_EMULATE)
    if (cc != 90) {
        if (why && why_size)
            snprintf(why, why_size, "the wgmma kernel needs a compute capability 9.0 GPU "
                     "(H100, H200); this device has %d.%d", cc / 10, cc % 10);
        return 0;
    }
    return dt_attn_mma_supported(dtype, dim, 80, why, why_size);
#else
    (void)dtype;
    (void)dim;
    (void)cc;
    if (why && why_size)
        snprintf(why, why_size, "the wgmma kernel was not built: it needs NVCC_ARCH=sm_90 "
                 "(this build's device code is for another architecture)");
    return 0;
#endif
}

extern "C" dt_status dt_attn_wgmma_fwd(void *stream, const dt_attn_block_args *a) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (a->dtype == DT_BF16)
        return a->dim == 64 ? launch<__nv_bfloat16, 64>(s, a) : launch<__nv_bfloat16, 128>(s, a);
    return a->dim == 64 ? launch<__half, 64>(s, a) : launch<__half, 128>(s, a);
}
