/* attention/cuda/mma_bwd.cu — the tensor-core backward block kernel
 * (FlashAttention-2 structure and tile sizes) for bf16 and fp16, head dims
 * 64 and 128, compute capability >= 8.0: 8 warps, 128 keys per CTA, float2
 * dQ atomics. Tested on the CPU emulator of CUDA (tests/emu, test_mma_emu:
 * against the double reference on ring, striped and zigzag blocks) and on
 * GPUs as block.cu's table of verified paths records (speed:
 * docs/PERFORMANCE.md). What auto runs where block.cu's table of
 * verified paths lists it and the wgmma kernel cannot run the block (on
 * 9.0 the wgmma one is faster). The simple kernels in block.cu stay as the
 * fallback and the cross-check (DT_ATTN_KERNEL, tuning.h).
 *
 * Contract: dt_attn_kernels.bwd of block.h, the same as block_cpu.c and the
 * simple kernels: one query segment against one key/value segment, GQA
 * (query head h reads kv head h / (H/G)), the position mask of mask.h;
 * P = exp(scale q.k - lse) (0 where masked and on rows with lse = -inf),
 * dP = dO V^T, dS = P (dP - delta); dV += P^T dO, dK += scale dS^T Q,
 * dQ += scale dS K, all three ADDED into the fp32 outputs (a `first` call
 * writes dk, dv instead, 0 where no query attends a key: its CTAs that
 * return at once write zeros).
 *
 * Work split (mma_layout.h, "backward"). A CTA per (key tile, kv head,
 * batch), launched in the order of mma_layout.h (the first key tiles, the
 * most queries under a causal mask, of a section of kv heads first); a CTA
 * of 8 warps (256 threads) owns BN = 128 keys of one (batch, kv head g) and
 * loops over the query heads of g's group and, per head, over the query
 * tiles (BM = 64 rows) that may attend its keys. Per query tile:
 *   1. warp w, query rows 16 (w % 4) .. +15, keys 64 (w / 4) .. +63:
 *        S  = Q K^T      A = Q  (ldmatrix, dt_mma_ldsm_a_*), B = K (dt_mma_ldsm_k_*)
 *        dP = dO V^T     A = dO (ldmatrix),                  B = V (dt_mma_ldsm_k_*)
 *        P  = exp(scale S - lse), dS = P (dP - delta)   in fp32 registers
 *      and stores P and dS, rounded to T, into swizzled [64][128] tiles.
 *   2. __syncthreads; warp w, keys 16w .. 16w+15, all D columns:
 *        dV += P^T dO    A = P^T  (ldmatrix.trans of the P tile, dt_mma_ldsm_at_*)
 *                        B = dO   (ldmatrix.trans, dt_mma_ldsm_v_*)
 *        dK += dS^T Q    A = dS^T (ldmatrix.trans of the dS tile), B = Q (.trans)
 *      dK and dV stay in fp32 registers across the whole loop (2 x 16 x D
 *      per warp) and are added into dk, dv once at the end (read, add,
 *      write: float2, or only write on a `first` call; the CTA alone owns
 *      those rows in this call).
 *   3. warp w, the query rows of phase 1, head-dim columns (D/2) (w / 4)
 *      .. +D/2-1, 16 at a time:
 *        dQ += dS K      A = dS (ldmatrix of the dS tile, all 128 keys)
 *                        B = K (ldmatrix.trans, dt_mma_ldsm_v_*)
 *      each 16 x 16 piece scaled and added into the fp32 dq with float2
 *      atomicAdd (one 8-byte reduction per pair of adjacent columns on
 *      compute capability 9.0, two 4-byte ones before). Every key tile's
 *      CTA adds into the same dq rows, so dq's summation order, and its
 *      last bits, may differ from run to run; dk and dv are deterministic.
 *      (A deterministic dq would need a per-key-tile dq scratch, B H nq D
 *      fp32 per key tile, and a reduction pass; FA2 makes the same choice
 *      by default.) 128 keys per CTA halve, against 64, the dQ additions
 *      and the Q, dO loads per key.
 *   4. __syncthreads: the P, dS tiles and the Q, dO stage are reused.
 *
 * Dependent launch (compute capability 9.0; block.h's continues): every
 * CTA runs griddepcontrol.launch_dependents at its start and
 * griddepcontrol.wait only before it exits, so that a block continuing
 * the call may run beside the end of the one before (it adds into the
 * same dq, with atomics, and touches nothing else that block does) and
 * completes after it.
 *
 * Mask and skipped tiles (mask.h's rule, closed form, dt_mma_bwd_* of
 * mma_layout.h). Queries that may attend a key form a suffix of q, so the
 * query tiles of key tile [y0, y0+128) are those from the one holding
 * x_any = dt_attn_queries_from(pos(y0)) on (none: the CTA returns before
 * loading anything, leaving dk, dv untouched); those from
 * ceil(dt_attn_queries_from(pos(y0 + 127)) / 64) on are full, and need no
 * per-element mask, when the key tile is whole; the others are masked with
 * the per-row key limits (dt_attn_keys_upto), which also masks keys past
 * the segment's end. Query rows past the segment's end, and rows whose lse
 * is -inf (they attend nothing anywhere), take lse = +inf: exp gives P = 0
 * exactly, so dS = 0 * (dP - 0) = 0 and nothing they touch changes (their
 * dq is not written at all). Masked elements are set to P = 0 after the
 * exp, so an overflowing exp there never reaches a product.
 *
 * Documents and windows (block.h's docs, window: mask.h's whole rule), in
 * the LATEST form only, run in a kernel of their own (bwd_mma_rule_kernel;
 * the VERIFIED form's launch refuses such a block with
 * DT_ERR_NOT_SUPPORTED): a key's queries are one range of query rows
 * (dt_attn_rule_rows with keys = 0), made once per key; per head the CTA
 * walks exactly the query tiles some key's range reaches (common.cuh's
 * rule_runs), a tile inside every key's range unmasked when the key tile is
 * whole, the others masked by both ends of each query row's range of key
 * rows. Test: tests/test_mma_emu.c, backward-rule/... cases.
 *
 * Shared memory (dynamic, (2 BN + 4 BM) D + 2 BM BN 16-bit elements: 96 KiB
 * at D = 64, 160 KiB at D = 128): [K][V] of [128][D], [Q stage 0][Q stage 1]
 * [dO stage 0][dO stage 1] of [64][D], then [P][dS] of [64][128], with the
 * XOR swizzle of mma_layout.h at their row lengths (conflict-free ldmatrix
 * and .b32 stores). Copies are cp.async 16 bytes, zero-filled past the
 * segments. Pipeline: K, V and the first (head, query tile)'s Q, dO are one
 * commit group; iteration i issues the copies of iteration i+1 into the
 * other stage before waiting for its own (wait_group 1), so they overlap
 * iteration i's math; the __syncthreads closing iteration i keeps
 * iteration i+1's copies off the stage still being read.
 *
 * Resources (ptxas -v, CUDA 13, sm_90): 243 registers at D = 64,
 * no spills; 255 registers at D = 128 with an 80-byte stack frame (76 bytes
 * of spill stores, 108 of loads): the 2 x 16 x 128 fp32 dK, dV
 * accumulators per warp plus S and dP leave no room. One CTA (8 warps) per
 * SM either way, the occupancy of the 4-warp version's two CTAs.
 *
 * Numerics: scores and lse in natural-log units, exp as 2^((scale s -
 * lse) log2 e), by exp2f in the VERIFIED form and exp2_ftz in the LATEST
 * (kernels.h's dt_attn_form: the only difference between the forms here,
 * as in the forward); P and dS are rounded to T for the tensor cores (as
 * FA2 does), every accumulation is fp32.
 *
 * Every index comes from mma_layout.h, whose functions tests/test_attention.c
 * runs on the CPU against an ldmatrix / mma.sync emulation written from the
 * PTX ISA (test_mma_bwd_fragments: this kernel's three phases against plain
 * matmuls; test_mma_tile_bounds: its query-tile bounds against
 * dt_attn_tile_class). GPU test: tests/test_attention_backward.c,
 * "backward/cuda-kernels/..." cases, DT_ATTN_KERNEL=simple and =mma (the
 * VERIFIED form), and "backward/cuda-latest/..." (the LATEST form) against
 * the double reference (make test; skipped without a GPU; the emulator
 * runs them, and tests/test_mma_emu.c both forms directly).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "common.cuh"
#include "mma_layout.h"

namespace {

constexpr int BM = DT_MMA_BM;               /* query rows per tile */
constexpr int BN = DT_MMA_BWD_BN;           /* keys per CTA */
constexpr int THREADS = DT_MMA_BWD_THREADS; /* 8 warps */

static_assert(BM == 16 * 4 && BN == 16 * DT_MMA_BWD_WARPS && BN == 2 * 64,
              "phases 1, 3: 4 groups of 16 query rows x 2 halves; phase 2: 16 keys per warp");

/* Dynamic shared memory of the kernel, in bytes. */
template <typename T, int D>
constexpr size_t bwd_smem_bytes() {
    return (size_t)((2 * BN + 4 * BM) * D + 2 * BM * BN) * sizeof(T);
}

#ifndef DT_MMA_STUB
constexpr int NT = 64 / 8;                /* n-tiles (8 keys each) of a warp's S and dP */

/* ------------------------------------------------------ shared-memory map */

/* [K][V] of [BN][D], [Q 0][Q 1][dO 0][dO 1] of [BM][D], then [P][dS] of
 * [BM][BN]: every tile starts on a multiple of 8 KiB (the bank argument
 * needs 128 bytes). */
template <typename T, int D>
__device__ __forceinline__ T *k_tile(unsigned char *smem) {
    return reinterpret_cast<T *>(smem);
}
template <typename T, int D>
__device__ __forceinline__ T *v_tile(unsigned char *smem) {
    return reinterpret_cast<T *>(smem) + BN * D;
}
template <typename T, int D>
__device__ __forceinline__ T *q_stage(unsigned char *smem, int stage) {
    return reinterpret_cast<T *>(smem) + (2 * BN + stage * BM) * D;
}
template <typename T, int D>
__device__ __forceinline__ T *do_stage(unsigned char *smem, int stage) {
    return reinterpret_cast<T *>(smem) + (2 * BN + (2 + stage) * BM) * D;
}
template <typename T, int D>
__device__ __forceinline__ T *p_tile(unsigned char *smem) {
    return reinterpret_cast<T *>(smem) + (2 * BN + 4 * BM) * D;
}
template <typename T, int D>
__device__ __forceinline__ T *ds_tile(unsigned char *smem) {
    return p_tile<T, D>(smem) + BM * BN;
}

/* ------------------------------------------------------------- tile steps */

/* s = A B^T for the 16 rows from 16 rg of A ([BM][D] tile: Q or dO) and the
 * 64 rows of B from sb (K or V from its row 64 half: a multiple of 8 rows
 * on, where the swizzle repeats): s[j] is the accumulator of n-tile j (B
 * rows 8j .. 8j+7). The forward's tile_scores, with A read per k-step
 * instead of held (the backward needs the registers for dK, dV). */
template <typename T, int D>
__device__ __forceinline__ void warp_abt(float (&s)[NT][4], const T *sa, const T *sb, int rg,
                                         int lane) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) s[j][i] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t af[4];
        ldmatrix_x4(af, sa + dt_mma_swz(16 * rg + dt_mma_ldsm_a_row(lane),
                                        16 * kk + dt_mma_ldsm_a_col(lane), D));
#pragma unroll
        for (int jj = 0; jj < NT / 2; jj++) {   /* B rows 16jj .. 16jj+15: n-tiles 2jj, 2jj+1 */
            uint32_t bb[4];
            ldmatrix_x4(bb, sb + dt_mma_swz(16 * jj + dt_mma_ldsm_k_row(lane),
                                            16 * kk + dt_mma_ldsm_k_col(lane), D));
            elem<T>::mma(s[2 * jj], af, bb[0], bb[1]);
            elem<T>::mma(s[2 * jj + 1], af, bb[2], bb[3]);
        }
    }
}

/* In: s = Q K^T, dp = dO V^T of the warp's rows. Out: s = P, dp = dS (fp32).
 * lse[half] is +inf for a row that must contribute nothing. MASKED: keys
 * y >= lim[half] of the row give P = 0 (key0: the warp's first key);
 * RANGED (documents and windows: bwd_mma_rule_kernel) also keys y <
 * lim_lo[half]. F: the kernel's form (its exponentials). NF (block.h's
 * nonfinite): a score of +-inf becomes NaN (x + 0 x), and a row with lse =
 * +inf gets P = 0 by a select, whatever its scores hold. */
template <bool MASKED, dt_attn_form F, bool NF, bool RANGED = false>
__device__ __forceinline__ void probabilities(float (&s)[NT][4], float (&dp)[NT][4],
                                              const float (&lse)[2], const float (&delta)[2],
                                              const int64_t (&lim)[2], int64_t key0, int lane,
                                              float scale, const int64_t *lim_lo = nullptr) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int half = dt_mma_c_half(i);
            float p;
            if constexpr (NF) {
                float x = s[j][i] * scale;
                x += 0.0f * x;
                p = lse[half] == INFINITY ? 0.0f : exp2_of<F>((x - lse[half]) * LOG2E);
            } else {
                p = exp2_of<F>((s[j][i] * scale - lse[half]) * LOG2E);   /* 0 when lse = +inf */
            }
            if (MASKED && key0 + 8 * j + dt_mma_c_col(lane, i) >= lim[half]) p = 0.0f;
            if constexpr (RANGED)
                if (MASKED && key0 + 8 * j + dt_mma_c_col(lane, i) < lim_lo[half]) p = 0.0f;
            s[j][i] = p;
            dp[j][i] = p * (dp[j][i] - delta[half]);
        }
}

/* Stores the warp's P and dS (rounded to T) into the swizzled [BM][BN] P
 * and dS tiles: one .b32 per pair of adjacent keys. */
template <typename T>
__device__ __forceinline__ void store_p_ds(T *sp, T *sds, const float (&p)[NT][4],
                                           const float (&ds)[NT][4], int warp, int lane) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int off = dt_mma_ps_off(warp, lane, j, half);
            *reinterpret_cast<uint32_t *>(sp + off) = elem<T>::pack(p[j][2 * half], p[j][2 * half + 1]);
            *reinterpret_cast<uint32_t *>(sds + off) =
                elem<T>::pack(ds[j][2 * half], ds[j][2 * half + 1]);
        }
}

/* dv += P^T dO and dk += dS^T Q (unscaled) for the warp's 16 keys: A from
 * the P and dS tiles, B from the dO and Q tiles, all by ldmatrix.trans.
 * dv[j], dk[j]: accumulators of n-tile j (head-dim columns 8j .. 8j+7). */
template <typename T, int D>
__device__ __forceinline__ void warp_dkdv(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                          const T *sp, const T *sds, const T *sq, const T *sdo,
                                          int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < BM / 16; kk++) {   /* query rows 16kk .. 16kk+15 */
        uint32_t pa[4], dsa[4];
        const int at = dt_mma_swz(16 * kk + dt_mma_ldsm_at_row(lane),
                                  16 * warp + dt_mma_ldsm_at_col(lane), BN);
        ldmatrix_x4_trans(pa, sp + at);
        ldmatrix_x4_trans(dsa, sds + at);
#pragma unroll
        for (int jd = 0; jd < D / 16; jd++) {   /* d 16jd .. 16jd+15: n-tiles 2jd, 2jd+1 */
            const int b = dt_mma_swz(16 * kk + dt_mma_ldsm_v_row(lane),
                                     16 * jd + dt_mma_ldsm_v_col(lane), D);
            uint32_t ob[4], qb[4];
            ldmatrix_x4_trans(ob, sdo + b);
            elem<T>::mma(dv[2 * jd], pa, ob[0], ob[1]);
            elem<T>::mma(dv[2 * jd + 1], pa, ob[2], ob[3]);
            ldmatrix_x4_trans(qb, sq + b);
            elem<T>::mma(dk[2 * jd], dsa, qb[0], qb[1]);
            elem<T>::mma(dk[2 * jd + 1], dsa, qb[2], qb[3]);
        }
    }
}

/* dq += scale dS K for the 16 query rows from 16 rg and the D/2 head-dim
 * columns from (D/2) ch: A = dS from the dS tile (ldmatrix, all BN keys),
 * B = K by ldmatrix.trans; 16 columns at a time, each added with atomics.
 * dqg: dq of the (batch, head) at row 0, row stride `rs`. */
template <typename T, int D>
__device__ __forceinline__ void warp_dq(float *dqg, int64_t rs, const T *sds, const T *sk, int rg,
                                        int ch, const int64_t (&row)[2], const bool (&live)[2],
                                        int lane, float scale) {
    uint32_t da[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        ldmatrix_x4(da[kk], sds + dt_mma_swz(16 * rg + dt_mma_ldsm_a_row(lane),
                                             16 * kk + dt_mma_ldsm_a_col(lane), BN));
#pragma unroll
    for (int jd = 0; jd < D / 32; jd++) {
        const int col0 = ch * (D / 2) + 16 * jd;
        float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {   /* keys 16kk .. 16kk+15 */
            uint32_t kb[4];
            ldmatrix_x4_trans(kb, sk + dt_mma_swz(16 * kk + dt_mma_ldsm_v_row(lane),
                                                  col0 + dt_mma_ldsm_v_col(lane), D));
            elem<T>::mma(acc[0], da[kk], kb[0], kb[1]);
            elem<T>::mma(acc[1], da[kk], kb[2], kb[3]);
        }
        add_dq<2>(dqg, rs, col0, acc, row, live, lane, scale);
    }
}

#endif /* !DT_MMA_STUB */

/* ------------------------------------------------------------ the kernel */

/* grid: ceil(kseg.len / 128) x kv_heads x batch blocks, in mma_layout.h's
 * launch order (grid.order); block: 256 threads;
 * dynamic shared memory bwd_smem_bytes<T, D>(). F: the form; NF: the
 * LATEST form's instance for a block with non-finite inputs (block.h's
 * nonfinite: probabilities keeps the rules). */
template <typename T, int D, dt_attn_form F, bool NF>
__global__ void __launch_bounds__(THREADS, 1) bwd_mma_kernel(const dt_attn_block_bwd_args a,
                                                             const dt_mma_grid grid) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
#ifdef DT_MMA_STUB
    (void)a;
    (void)grid;
    __trap();   /* never launched: the host requires compute capability >= 8.0 */
#else
    cta_trace(a, 0);
    grid_dep_launch();   /* a continuing block after this one may start (dependent) */
    DT_DYNAMIC_SMEM(unsigned char, smem);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int rg = dt_mma_bwd_rows(warp), hf = dt_mma_bwd_half(warp);
    const int64_t H = a.heads, G = a.kv_heads;
    const int64_t nq = a.qseg.len, nk = a.kseg.len;
    const bwd_cta c = bwd_cta_of(a, grid, BM);
    if (c.n_iter == 0) {   /* no query attends these keys: dk, dv unchanged, or 0 */
        if (a.first)
            zero_dk_dv<D>(a.dk + c.b * a.kv_batch_stride + c.g * D,
                          a.dv + c.b * a.kv_batch_stride + c.g * D, G * D, c.y0, nk);
        grid_dep_wait();
        return cta_trace(a, 1);
    }
    const int64_t b = c.b, g = c.g, y0 = c.y0;

    const T *kg = static_cast<const T *>(a.k) + b * a.kv_batch_stride + g * D;   /* row y: + y G D */
    const T *vg = static_cast<const T *>(a.v) + b * a.kv_batch_stride + g * D;
    const T *qb = static_cast<const T *>(a.q) + b * a.q_batch_stride;           /* + (x H + h) D */
    const T *dob = static_cast<const T *>(a.dout) + b * a.q_batch_stride;

    /* Group 0: K, V and iteration 0's Q, dO. */
    load_tile<T, D, BN, THREADS>(k_tile<T, D>(smem), kg, G * D, y0, nk);
    load_tile<T, D, BN, THREADS>(v_tile<T, D>(smem), vg, G * D, y0, nk);
    {
        const int64_t h = c.head(0), x0 = c.qtile(0) * BM;
        load_tile<T, D, BM, THREADS>(q_stage<T, D>(smem, 0), qb + h * D, H * D, x0, nq);
        load_tile<T, D, BM, THREADS>(do_stage<T, D>(smem, 0), dob + h * D, H * D, x0, nq);
    }
    cp_async_commit();

    /* dk[j][i], dv[j][i]: accumulator element i of n-tile j (head-dim
     * columns 8j .. 8j+7) of the warp's keys 16w .. 16w+15. */
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[j][i] = dv[j][i] = 0.0f;

    for (int it = 0; it < c.n_iter; it++) {
        const int stage = (int)(it & 1);
        if (it + 1 < c.n_iter) {
            const int64_t h = c.head(it + 1);
            const int64_t x0 = c.qtile(it + 1) * BM;
            load_tile<T, D, BM, THREADS>(q_stage<T, D>(smem, stage ^ 1), qb + h * D, H * D, x0, nq);
            load_tile<T, D, BM, THREADS>(do_stage<T, D>(smem, stage ^ 1), dob + h * D, H * D, x0,
                                         nq);
            cp_async_commit();
            cp_async_wait<1>();   /* all but iteration it+1's group: it's (and K, V) landed */
        } else {
            cp_async_wait<0>();
        }

        const int64_t h = c.head(it), qt = c.qtile(it), x0 = qt * BM;
        /* The lane's two query rows of phases 1 and 3 (half 0: row g, half
         * 1: row g+8 of the warp's 16), read while waiting for the barrier. */
        const float *lseg = a.lse + b * a.ml_batch_stride + h * a.ml_head_stride;
        const float *deltag = a.delta + b * a.ml_batch_stride + h * a.ml_head_stride;
        int64_t row[2], lim[2];
        bool live[2];
        float lse[2], delta[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            row[half] = x0 + 16 * rg + dt_mma_c_row(lane, 2 * half);
            live[half] = row[half] < nq;
            const float l = live[half] ? lseg[row[half]] : -INFINITY;
            lse[half] = l == -INFINITY ? INFINITY : l;   /* P = 0 on the whole row */
            delta[half] = live[half] ? deltag[row[half]] : 0.0f;
            lim[half] = 0;
        }
        const bool masked = qt < c.qt_unmasked;
        if (masked) {
#pragma unroll
            for (int half = 0; half < 2; half++)
                if (live[half])
                    lim[half] = dt_mma_keys_upto(&grid.keys, dt_attn_pos(a.qseg, row[half]));
        }
        __syncthreads();   /* every thread's copies of iteration it are visible to all */

        const T *sq = q_stage<T, D>(smem, stage), *sdo = do_stage<T, D>(smem, stage);
        {   /* phase 1: the warp's 16 rows x 64 keys */
            float s[NT][4], dp[NT][4];
            warp_abt<T, D>(s, sq, k_tile<T, D>(smem) + 64 * hf * D, rg, lane);
            warp_abt<T, D>(dp, sdo, v_tile<T, D>(smem) + 64 * hf * D, rg, lane);
            if (masked)
                probabilities<true, F, NF>(s, dp, lse, delta, lim, y0 + 64 * hf, lane, a.scale);
            else
                probabilities<false, F, NF>(s, dp, lse, delta, lim, y0 + 64 * hf, lane, a.scale);
            store_p_ds<T>(p_tile<T, D>(smem), ds_tile<T, D>(smem), s, dp, warp, lane);
        }
        __syncthreads();   /* the P and dS tiles are complete */

        warp_dkdv<T, D>(dk, dv, p_tile<T, D>(smem), ds_tile<T, D>(smem), sq, sdo, warp, lane);
        warp_dq<T, D>(a.dq + b * a.dq_batch_stride + h * D, H * D, ds_tile<T, D>(smem),
                      k_tile<T, D>(smem), rg, hf, row, live, lane, a.scale);
        __syncthreads();   /* P, dS and this stage are rewritten by the next iterations */
    }

    /* Add into dk (scaled) and dv: the warp's keys 16w .. 16w + 15. */
    add_dk_dv<D>(a.dk + b * a.kv_batch_stride + g * D, a.dv + b * a.kv_batch_stride + g * D,
                 G * D, y0 + 16 * warp, nk, dk, dv, lane, a.scale, a.first);
    /* A dependent block completes after the block before (it wrote none
     * of this one's inputs, so nothing waits earlier). */
    grid_dep_wait();
    cta_trace(a, 1, c.n_iter);
#endif
}

/* The LATEST form with documents or a window (block.h's docs, window;
 * common.cuh, "documents and windows"): bwd_mma_kernel's grid, block,
 * phases and pipeline, plus a rule_runs<BN> past its tiles in dynamic
 * shared memory. Each key's range of query rows (keys = 0) is made once;
 * the CTA walks its group's heads and, per head, the query tiles of their
 * runs, a tile inside [lo of the last key, hi of the first) without a mask
 * when the key tile is whole, the others masked by both ends of each query
 * row's range of key rows. NF as bwd_mma_kernel's. */
template <typename T, int D, bool NF>
__global__ void __launch_bounds__(THREADS, 1) bwd_mma_rule_kernel(const dt_attn_block_bwd_args a,
                                                                  const dt_mma_grid grid) {
#ifdef DT_MMA_STUB
    (void)a;
    (void)grid;
    __trap();
#else
    constexpr dt_attn_form F = DT_ATTN_FORM_LATEST;
    cta_trace(a, 0);
    grid_dep_launch();
    DT_DYNAMIC_SMEM(unsigned char, smem);
    rule_runs<BN> &runs = *reinterpret_cast<rule_runs<BN> *>(ds_tile<T, D>(smem) + BM * BN);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int rg = dt_mma_bwd_rows(warp), hf = dt_mma_bwd_half(warp);
    const int64_t H = a.heads, G = a.kv_heads;
    const int64_t nq = a.qseg.len, nk = a.kseg.len;
    uint32_t rank, unit;   /* bwd_cta_of's key tile, batch and kv head */
    dt_mma_order_at(&grid.order, blockIdx.x, &rank, &unit);
    const int64_t b = dt_udiv_q(unit, grid.heads), g = dt_udiv_r(unit, grid.heads);
    const int64_t y0 = (int64_t)rank * BN;
    const int group = (int)grid.group.d;
    const dt_attn_rule rule = dt_attn_block_bwd_rule(&a, b);

    /* Each key's range of query rows, then their runs of query tiles. */
    if ((int)threadIdx.x < BN) {
        const int64_t y = y0 + threadIdx.x;
        int64_t lo = 0, hi = 0;
        if (y < nk) dt_attn_rule_rows(rule, 0, dt_attn_pos(a.kseg, y), a.qseg, &lo, &hi);
        runs.lo[threadIdx.x] = (int32_t)lo;
        runs.hi[threadIdx.x] = (int32_t)hi;
    }
    __syncthreads();
    rule_runs_build(runs, BM);
    __syncthreads();
    const bool whole = y0 + BN <= nk;
    /* every key pairs with every query row of [flo, fhi) */
    const int flo = runs.lo[(whole ? BN : nk - y0) - 1], fhi = runs.hi[0];
    /* iteration it: head g group + it / per_head, the it % per_head-th
     * query tile of the runs */
    const int per_head = rule_tile_count(runs), n_iter = group * per_head;
    if (n_iter == 0) {   /* no query attends these keys: dk, dv unchanged, or 0 */
        if (a.first)
            zero_dk_dv<D>(a.dk + b * a.kv_batch_stride + g * D,
                          a.dv + b * a.kv_batch_stride + g * D, G * D, y0, nk);
        grid_dep_wait();
        return cta_trace(a, 1);
    }

    const T *kg = static_cast<const T *>(a.k) + b * a.kv_batch_stride + g * D;
    const T *vg = static_cast<const T *>(a.v) + b * a.kv_batch_stride + g * D;
    const T *qb = static_cast<const T *>(a.q) + b * a.q_batch_stride;
    const T *dob = static_cast<const T *>(a.dout) + b * a.q_batch_stride;

    /* Group 0: K, V and the first (head, query tile)'s Q, dO. */
    load_tile<T, D, BN, THREADS>(k_tile<T, D>(smem), kg, G * D, y0, nk);
    load_tile<T, D, BN, THREADS>(v_tile<T, D>(smem), vg, G * D, y0, nk);
    load_tile<T, D, BM, THREADS>(q_stage<T, D>(smem, 0), qb + g * group * D, H * D,
                                 (int64_t)runs.s[0] * BM, nq);
    load_tile<T, D, BM, THREADS>(do_stage<T, D>(smem, 0), dob + g * group * D, H * D,
                                 (int64_t)runs.s[0] * BM, nq);
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[j][i] = dv[j][i] = 0.0f;

    for (int it = 0; it < n_iter; it++) {
        const int stage = it & 1;
        if (it + 1 < n_iter) {
            const int64_t h = g * group + (it + 1) / per_head;
            const int64_t x0 = (int64_t)rule_tile_at(runs, (it + 1) % per_head) * BM;
            load_tile<T, D, BM, THREADS>(q_stage<T, D>(smem, stage ^ 1), qb + h * D, H * D, x0, nq);
            load_tile<T, D, BM, THREADS>(do_stage<T, D>(smem, stage ^ 1), dob + h * D, H * D, x0,
                                         nq);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }

        const int qt = rule_tile_at(runs, it % per_head);
        const int64_t h = g * group + it / per_head, x0 = (int64_t)qt * BM;
        const float *lseg = a.lse + b * a.ml_batch_stride + h * a.ml_head_stride;
        const float *deltag = a.delta + b * a.ml_batch_stride + h * a.ml_head_stride;
        int64_t row[2], lim[2], lim_lo[2];
        bool live[2];
        float lse[2], delta[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            row[half] = x0 + 16 * rg + dt_mma_c_row(lane, 2 * half);
            live[half] = row[half] < nq;
            const float l = live[half] ? lseg[row[half]] : -INFINITY;
            lse[half] = l == -INFINITY ? INFINITY : l;   /* P = 0 on the whole row */
            delta[half] = live[half] ? deltag[row[half]] : 0.0f;
            lim[half] = lim_lo[half] = 0;
        }
        const bool masked = !(whole && qt * BM >= flo && (qt + 1) * BM <= fhi);
        if (masked) {
#pragma unroll
            for (int half = 0; half < 2; half++)
                if (live[half]) {
                    int lo, hi;
                    rule_rows(rule, 1, dt_attn_pos(a.qseg, row[half]), grid.keys, lo, hi);
                    lim_lo[half] = lo;
                    lim[half] = hi;
                }
        }
        __syncthreads();   /* every thread's copies of this iteration are visible to all */

        const T *sq = q_stage<T, D>(smem, stage), *sdo = do_stage<T, D>(smem, stage);
        {   /* phase 1: the warp's 16 rows x 64 keys */
            float s[NT][4], dp[NT][4];
            warp_abt<T, D>(s, sq, k_tile<T, D>(smem) + 64 * hf * D, rg, lane);
            warp_abt<T, D>(dp, sdo, v_tile<T, D>(smem) + 64 * hf * D, rg, lane);
            if (masked)
                probabilities<true, F, NF, true>(s, dp, lse, delta, lim, y0 + 64 * hf, lane,
                                                 a.scale, lim_lo);
            else
                probabilities<false, F, NF>(s, dp, lse, delta, lim, y0 + 64 * hf, lane, a.scale);
            store_p_ds<T>(p_tile<T, D>(smem), ds_tile<T, D>(smem), s, dp, warp, lane);
        }
        __syncthreads();   /* the P and dS tiles are complete */

        warp_dkdv<T, D>(dk, dv, p_tile<T, D>(smem), ds_tile<T, D>(smem), sq, sdo, warp, lane);
        warp_dq<T, D>(a.dq + b * a.dq_batch_stride + h * D, H * D, ds_tile<T, D>(smem),
                      k_tile<T, D>(smem), rg, hf, row, live, lane, a.scale);
        __syncthreads();   /* P, dS and this stage are rewritten by the next iterations */
    }

    add_dk_dv<D>(a.dk + b * a.kv_batch_stride + g * D, a.dv + b * a.kv_batch_stride + g * D,
                 G * D, y0 + 16 * warp, nk, dk, dv, lane, a.scale, a.first);
    grid_dep_wait();
    cta_trace(a, 1, n_iter);
#endif
}

template <typename T, int D, dt_attn_form F>
dt_status launch(cudaStream_t stream, const dt_attn_block_bwd_args *a, int64_t l2_bytes,
                 int dependent) {
    const dim3 grid((unsigned)((a->kseg.len + BN - 1) / BN * a->kv_heads * a->batch));
    if (dt_mma_ruled(*a)) {   /* documents or a window: the LATEST form's rule kernel */
        if constexpr (F != DT_ATTN_FORM_LATEST) {
            return dt_mma_refuse_ruled("mma backward");
        } else {
            dt_mma_grid g = dt_mma_bwd_grid(*a, l2_bytes);
            dt_mma_rule_grid(g, a->kseg);
            return dt_mma_launch(a->nonfinite ? bwd_mma_rule_kernel<T, D, true>
                                              : bwd_mma_rule_kernel<T, D, false>,
                                 grid, THREADS, bwd_smem_bytes<T, D>() + sizeof(rule_runs<BN>),
                                 stream, "backward", D, a->dtype, dependent && a->continues, *a,
                                 g);
        }
    }
    auto kernel = bwd_mma_kernel<T, D, F, false>;
    if constexpr (F == DT_ATTN_FORM_LATEST)
        if (a->nonfinite) kernel = bwd_mma_kernel<T, D, F, true>;
    return dt_mma_launch(kernel, grid, THREADS, bwd_smem_bytes<T, D>(), stream, "backward", D,
                         a->dtype, dependent && a->continues, *a, dt_mma_bwd_grid(*a, l2_bytes));
}

}  // namespace

extern "C" dt_status dt_attn_mma_bwd(void *stream, const dt_attn_block_bwd_args *a,
                                     int64_t l2_bytes, int dependent, dt_attn_form form) {
    return dt_mma_dispatch(a->dtype, a->dim, form, [&](auto t, auto d, auto f) {
        return launch<typename decltype(t)::type, decltype(d)::value, decltype(f)::value>(
            static_cast<cudaStream_t>(stream), a, l2_bytes, dependent);
    });
}
