/* attention/cuda/mma_fwd.cu — the tensor-core forward block kernel
 * (FlashAttention-2 style) for bf16 and fp16, head dims 64 and 128, compute
 * capability >= 8.0. STATUS: passes its tests on the CPU emulator of CUDA
 * (tests/emu, test_mma_emu: against the double reference on ring, striped
 * and zigzag blocks) and on an H100 (0.81x to 1.11x FlashAttention-2 there,
 * docs/PERFORMANCE.md); what auto runs where block.cu's table of
 * verified paths lists it and the wgmma kernel cannot run the block; the
 * simple kernel in block.cu stays as the fallback and the cross-check
 * (DT_ATTN_KERNEL, tuning.h).
 *
 * Contract: dt_attn_kernels.fwd of block.h, the same as block_cpu.c and the
 * simple kernel. One query segment against one key/value segment, GQA (query
 * head h reads kv head h / (H/G)), the position mask of mask.h; the fp32
 * running max m, sum l and unnormalised output acc of each query row are
 * merged with the block's own at the end and written back (fused
 * accumulation, no merge pass; common.cuh's write_rows). On compute
 * capability 9.0 a block after a call's first is a programmatic dependent
 * launch, which waits for the block before only before that merge
 * (wgmma_fwd.cu says why).
 *
 * Work split. A CTA per (query tile, head, batch), launched in the order of
 * mma_layout.h (the heaviest query tiles of a section of heads first); a
 * CTA of 4 warps (128 threads) owns a tile of BM = 64 query rows of one
 * (batch, head), warp w rows 16w .. 16w+15; key tiles of BN = 64. Per key
 * tile, each warp:
 *   S[16x64]  = Q[16xD] K^T          mma m16n8k16, Q as A fragments held in
 *                                    registers, K via ldmatrix (B operand)
 *   S = scale * S, masked (-inf) on partial tiles only
 *   m' = max(m, rowmax S)            (quad shuffles: 4 lanes share a row)
 *   P = exp(S - m'),  alpha = exp(m - m'),  l = alpha l + rowsum P
 *   O[16xD]   = alpha O + P V        P re-packed from the S accumulators
 *                                    into A fragments; V via ldmatrix.trans
 * with O in fp32 registers (from 0; the acc rows merged at the end). Exponentials
 * are 2^((x - m) * log2(e)), by exp2f in the kernel's VERIFIED form and by
 * exp2_ftz in its LATEST (kernels.h's dt_attn_form; common.cuh: exp2f's
 * instruction without its subnormal results; the only difference between
 * the forms here): m and the scores stay in natural-log units,
 * exactly what block.h stores, so nothing is converted at the boundaries
 * and logits of 1e4 lose nothing but the final subtraction's rounding. (FA2
 * instead folds scale * log2(e) into one FFMA with a rounded m * scale *
 * log2(e); that saves two FP32 ops per score but makes m inexact at
 * |logit| ~ 1e4, where the block contract stores m across calls.) Rows
 * that see no allowed key keep m = -inf and l = 0: the exponent uses 0 in
 * place of an m' of -inf, so exp(-inf - -inf) never happens.
 *
 * Mask and skipped tiles (mask.h's rule, closed form). A query row x may
 * attend keys y < limit(x) (dt_attn_keys_upto of mask.h: the count of keys at or
 * before its position, or all keys without a mask), and limits grow with x.
 * So for query tile [x0, x1) the non-empty key tiles are exactly 0 ..
 * ceil(limit(x1-1) / BN) - 1 and the loop never visits an empty one (a CTA
 * with none returns before loading anything); the first floor(limit(x0) /
 * BN) of them are full (no per-element mask); the rest are masked with the
 * per-row limits, which also masks keys past the segment's end in a last
 * short tile. Query rows past the end of the segment are zero-filled,
 * computed and never written.
 *
 * Documents and windows (block.h's docs, window: mask.h's whole rule), in
 * the LATEST form only, run in a kernel of their own (fwd_mma_rule_kernel;
 * the VERIFIED form's launch refuses such a block with
 * DT_ERR_NOT_SUPPORTED), so that the other instances' code is the same
 * with or without them: a query row's keys are one range [lo, hi) of key
 * rows (dt_attn_rule_rows), made once per row; the CTA visits exactly the
 * key tiles that some row's range reaches (common.cuh's rule_runs), a tile
 * inside every row's range without a mask, the others masked by both ends
 * of each row's range. Test: tests/test_mma_emu.c, forward-rule/... cases.
 *
 * Shared memory (dynamic, (BM + 4 BN) * D * 2 bytes: 40 KiB at D = 64,
 * 80 KiB at D = 128): [Q tile][K stage 0][K stage 1][V stage 0][V stage 1],
 * each [64][D] 16-bit with the XOR swizzle of mma_layout.h (chunk c of row
 * r at c ^ (r % 8): conflict-free ldmatrix). Copies are cp.async 16 bytes
 * (.cg), zero-filled for rows past the segment. Pipeline: Q and key tile 0
 * are one commit group; in iteration kt the copies of tile kt+1 go to the
 * other stage and are committed before waiting for tile kt (wait_group 1),
 * so they overlap tile kt's math; a __syncthreads after each tile's math
 * keeps the next iteration's copies off the stage still being read.
 *
 * The PTX wrappers and the tile copy are shared with the backward kernel
 * (mma_bwd.cu), the online softmax with the Hopper forward kernel
 * (wgmma_fwd.cu), all in common.cuh.
 *
 * Every index comes from mma_layout.h, whose functions tests/test_attention.c
 * runs on the CPU against an ldmatrix / mma.sync emulation written from the
 * PTX ISA. GPU test: tests/test_attention.c, "forward/cuda-kernels/..."
 * cases, DT_ATTN_KERNEL=simple and =mma (the VERIFIED form), and
 * "forward/cuda-latest/..." (the LATEST form) against the double reference
 * (make test; skipped without a GPU; the emulator runs them, and
 * tests/test_mma_emu.c both forms directly).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "common.cuh"
#include "mma_layout.h"

namespace {

constexpr int BM = DT_MMA_BM;             /* query rows per CTA */
constexpr int BN = DT_MMA_BN;             /* keys per tile */
constexpr int THREADS = DT_MMA_THREADS;   /* 4 warps */

static_assert(BM == 16 * DT_MMA_WARPS, "one warp per 16 query rows");
static_assert(BN % 16 == 0, "key tiles are whole k-steps of the P V product");

#ifndef DT_MMA_STUB
constexpr int NT_S = BN / 8;              /* n-tiles (8 keys each) of a warp's S */

/* ------------------------------------------------------------ tile steps */

/* Shared memory of the CTA: the Q tile, then two K stages, then two V
 * stages, each [64][D] elements. */
template <typename T, int D>
__device__ __forceinline__ T *q_tile(unsigned char *smem) {
    return reinterpret_cast<T *>(smem);
}
template <typename T, int D>
__device__ __forceinline__ T *k_stage(unsigned char *smem, int stage) {
    return reinterpret_cast<T *>(smem) + (BM + stage * BN) * D;
}
template <typename T, int D>
__device__ __forceinline__ T *v_stage(unsigned char *smem, int stage) {
    return reinterpret_cast<T *>(smem) + (BM + (2 + stage) * BN) * D;
}

/* This warp's 16 query rows of the Q tile as A fragments, one per k-step
 * of 16 head-dim elements. */
template <typename T, int D>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[D / 16][4], const T *sq, int warp,
                                                 int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        ldmatrix_x4(qf[kk], sq + dt_mma_swz(16 * warp + dt_mma_ldsm_a_row(lane),
                                            16 * kk + dt_mma_ldsm_a_col(lane), D));
}

/* s = Q K^T for the warp's 16 rows and the 64 keys of a K stage: s[j] is
 * the accumulator of n-tile j (keys 8j .. 8j+7 of the tile). */
template <typename T, int D>
__device__ __forceinline__ void tile_scores(float (&s)[NT_S][4], const uint32_t (&qf)[D / 16][4],
                                            const T *sk, int lane) {
#pragma unroll
    for (int j = 0; j < NT_S; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) s[j][i] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int jj = 0; jj < BN / 16; jj++) {   /* keys 16jj .. 16jj+15: n-tiles 2jj, 2jj+1 */
            uint32_t kb[4];
            ldmatrix_x4(kb, sk + dt_mma_swz(16 * jj + dt_mma_ldsm_k_row(lane),
                                            16 * kk + dt_mma_ldsm_k_col(lane), D));
            elem<T>::mma(s[2 * jj], qf[kk], kb[0], kb[1]);
            elem<T>::mma(s[2 * jj + 1], qf[kk], kb[2], kb[3]);
        }
}

/* o += P V: P from the S accumulators (rounded to T), V from a V stage. */
template <typename T, int D>
__device__ __forceinline__ void tile_pv(float (&o)[D / 8][4], const float (&p)[NT_S][4],
                                        const T *sv, int lane) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {   /* keys 16kk .. 16kk+15 */
        uint32_t pa[4];
        p_fragment<T>(pa, p, kk);
#pragma unroll
        for (int jd = 0; jd < D / 16; jd++) {   /* d 16jd .. 16jd+15: n-tiles 2jd, 2jd+1 */
            uint32_t vb[4];
            ldmatrix_x4_trans(vb, sv + dt_mma_swz(16 * kk + dt_mma_ldsm_v_row(lane),
                                                  16 * jd + dt_mma_ldsm_v_col(lane), D));
            elem<T>::mma(o[2 * jd], pa, vb[0], vb[1]);
            elem<T>::mma(o[2 * jd + 1], pa, vb[2], vb[3]);
        }
    }
}

#endif /* !DT_MMA_STUB */

/* ------------------------------------------------------------ the kernel */

/* grid: ceil(qseg.len / 64) x heads x batch blocks, in mma_layout.h's
 * launch order (grid.order); block: 128 threads;
 * dynamic shared memory (BM + 4 BN) * D * sizeof(T). F: the form; NF: the
 * LATEST form's instance for a block with non-finite inputs (block.h's
 * nonfinite: common.cuh's online_softmax and write_rows keep the rules). */
template <typename T, int D, dt_attn_form F, bool NF>
__global__ void __launch_bounds__(THREADS) fwd_mma_kernel(const dt_attn_block_args a,
                                                          const dt_mma_grid grid) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
#ifdef DT_MMA_STUB
    (void)a;
    (void)grid;
    __trap();   /* never launched: the host requires compute capability >= 8.0 */
#else
    cta_trace(a, 0);
    grid_dep_launch();   /* the next block may start (wgmma_fwd.cu says how) */
    DT_DYNAMIC_SMEM(unsigned char, smem);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int64_t H = a.heads, G = a.kv_heads, nq = a.qseg.len, nk = a.kseg.len;
    const fwd_cta c = fwd_cta_of(a, grid, blockIdx.x, BM);
    const int64_t x0 = c.x0, x1 = c.x1;

    /* Key tiles to visit (the non-empty ones) and how many need no mask;
     * uniform over the CTA, so the early return, the loads and the loop are
     * too. With no tile the rows are still started or finished (a.first,
     * a.last). */
    const int64_t n_tiles = dt_mma_key_tiles(dt_mma_keys_upto(&grid.keys, dt_attn_pos(a.qseg, x1 - 1)));
    const int64_t n_unmasked = dt_mma_unmasked_tiles(dt_mma_keys_upto(&grid.keys, dt_attn_pos(a.qseg, x0)));
    if (n_tiles == 0 && !a.first && !a.last) {   /* m, l, acc unchanged */
        rows_wait(a, c, x0 + 16 * warp);   /* ends after the block before, as below */
        rows_done(a, c, x0 + 16 * warp, lane);
        grid_dep_exit(a);
        return cta_trace(a, 1);
    }

    /* row x of q at qg + x H D, row y of k and v at kg, vg + y G D (keys
     * interleaved: at their row dt_attn_key_row(y, ...), block.h) */
    const T *qg = static_cast<const T *>(a.q) + c.b * a.q_batch_stride + c.h * D;
    const T *kg = static_cast<const T *>(a.k) + c.b * a.kv_batch_stride + c.g * D;
    const T *vg = static_cast<const T *>(a.v) + c.b * a.kv_batch_stride + c.g * D;

    /* Group 0: the Q tile and key tile 0 (stage 0). */
    if (n_tiles > 0) {
        load_tile<T, D>(q_tile<T, D>(smem), qg, H * D, x0, nq);
        load_tile<T, D>(k_stage<T, D>(smem, 0), kg, G * D, 0, nk, a.kv_slots, a.kv_slot_rows);
        load_tile<T, D>(v_stage<T, D>(smem, 0), vg, G * D, 0, nk, a.kv_slots, a.kv_slot_rows);
        cp_async_commit();
    }

    /* The lane's two query rows, their state started empty (merged with
     * the stored one at the end: common.cuh). */
    int lim[2];
    float m[2], l[2], o[D / 8][4];
    start_rows<D>(a, grid, x0 + 16 * warp, lane, lim, m, l, o);
    prefetch_rows<D>(a, c, x0 + 16 * warp, lane);

    uint32_t qf[D / 16][4];
    for (int64_t kt = 0; kt < n_tiles; kt++) {
        const int stage = (int)(kt & 1);
        if (kt + 1 < n_tiles) {
            load_tile<T, D>(k_stage<T, D>(smem, stage ^ 1), kg, G * D, (kt + 1) * BN, nk,
                            a.kv_slots, a.kv_slot_rows);
            load_tile<T, D>(v_stage<T, D>(smem, stage ^ 1), vg, G * D, (kt + 1) * BN, nk,
                            a.kv_slots, a.kv_slot_rows);
            cp_async_commit();
            cp_async_wait<1>();   /* all but tile kt+1's group: tile kt (and Q) have landed */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();   /* every thread's copies of tile kt are visible to all */
        if (kt == 0) {
            if (threadIdx.x == 0) cta_mark(a, 0);
            load_q_fragments<T, D>(qf, q_tile<T, D>(smem), warp, lane);
        }

        float s[NT_S][4];
        tile_scores<T, D>(s, qf, k_stage<T, D>(smem, stage), lane);
        constexpr softmax_exp EXP = F == DT_ATTN_FORM_LATEST ? SFU : EXP2F;
        if (kt < n_unmasked)
            online_softmax<false, NT_S, D, EXP, float, NF>(s, m, l, o, lim, kt * BN, lane, a.scale);
        else
            online_softmax<true, NT_S, D, EXP, float, NF>(s, m, l, o, lim, kt * BN, lane, a.scale);
        tile_pv<T, D>(o, s, v_stage<T, D>(smem, stage), lane);
        __syncthreads();   /* stage is refilled by iteration kt+1's copies */
    }
    if (n_tiles > 0 && threadIdx.x == 0) cta_mark(a, 1);

    /* A dependent launch (a block after the call's first, compute
     * capability 9.0) waits for the block before only here, before the
     * rows' merge: every thread for the whole block (mode 1: this block
     * then ends after it), or each warp for its rows' count (mode 2). */
    const fwd_cta e = fwd_cta_of(a, grid, cta_index(), BM);   /* c, made again: cta_index */
    rows_wait(a, e, e.x0 + 16 * warp);
    write_rows<T, D, F, NF>(a, e, e.x0 + 16 * warp, lane, m, l, o);
    rows_done(a, e, e.x0 + 16 * warp, lane);
    grid_dep_exit(a);
    cta_trace(a, 1, n_tiles);
#endif
}

/* The LATEST form with documents or a window (block.h's docs, window;
 * common.cuh, "documents and windows"): fwd_mma_kernel's grid, block,
 * pipeline and row state, plus a rule_runs<BM> past its tiles in dynamic
 * shared memory. Each row's range of key rows [lo, hi) is made once; the
 * CTA visits the key tiles of their runs, a tile inside [lo of the last
 * row, hi of the first) without a mask, the others masked by both ends of
 * each row's range. NF as fwd_mma_kernel's. */
template <typename T, int D, bool NF>
__global__ void __launch_bounds__(THREADS) fwd_mma_rule_kernel(const dt_attn_block_args a,
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
    rule_runs<BM> &runs = *reinterpret_cast<rule_runs<BM> *>(smem + (BM + 4 * BN) * D * sizeof(T));
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int64_t H = a.heads, G = a.kv_heads, nq = a.qseg.len, nk = a.kseg.len;
    const fwd_cta c = fwd_cta_of(a, grid, blockIdx.x, BM);
    const int64_t x0 = c.x0;
    const dt_attn_rule rule = dt_attn_block_rule(&a, c.b);

    /* The lane's two rows' ranges of key rows (lim: their ends), into the
     * runs' table by the quad's first lane; then the runs. */
    int lim[2], lo[2];
    float m[2], l[2], o[D / 8][4];
    start_rows<D>(a, grid, x0 + 16 * warp, lane, lim, m, l, o);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int i = 16 * warp + dt_mma_c_row(lane, 2 * half);
        lo[half] = lim[half] = 0;
        if (x0 + i < nq)
            rule_rows(rule, 1, dt_attn_pos(a.qseg, x0 + i), grid.keys, lo[half], lim[half]);
        if ((lane & 3) == 0) {
            runs.lo[i] = lo[half];
            runs.hi[i] = lim[half];
        }
    }
    __syncthreads();
    rule_runs_build(runs, BN);
    __syncthreads();
    /* every row pairs with every key of [flo, fhi) */
    const int last = (int)((c.x1 - x0) - 1);
    const int flo = runs.lo[last], fhi = runs.hi[0];
    int run, cur = rule_first(runs, run);
    if (cur < 0 && !a.first && !a.last) {   /* m, l, acc unchanged */
        rows_wait(a, c, x0 + 16 * warp);
        rows_done(a, c, x0 + 16 * warp, lane);
        grid_dep_exit(a);
        return cta_trace(a, 1);
    }
    int next_run = run, nxt = cur >= 0 ? rule_next(runs, next_run, cur) : -1;

    const T *qg = static_cast<const T *>(a.q) + c.b * a.q_batch_stride + c.h * D;
    const T *kg = static_cast<const T *>(a.k) + c.b * a.kv_batch_stride + c.g * D;
    const T *vg = static_cast<const T *>(a.v) + c.b * a.kv_batch_stride + c.g * D;
    if (cur >= 0) {   /* group 0: the Q tile and the first key tile (stage 0) */
        load_tile<T, D>(q_tile<T, D>(smem), qg, H * D, x0, nq);
        load_tile<T, D>(k_stage<T, D>(smem, 0), kg, G * D, (int64_t)cur * BN, nk, a.kv_slots,
                        a.kv_slot_rows);
        load_tile<T, D>(v_stage<T, D>(smem, 0), vg, G * D, (int64_t)cur * BN, nk, a.kv_slots,
                        a.kv_slot_rows);
        cp_async_commit();
    }
    prefetch_rows<D>(a, c, x0 + 16 * warp, lane);

    uint32_t qf[D / 16][4];
    int64_t n_tiles = 0;
    for (int stage = 0; cur >= 0; stage ^= 1, n_tiles++) {
        if (nxt >= 0) {
            load_tile<T, D>(k_stage<T, D>(smem, stage ^ 1), kg, G * D, (int64_t)nxt * BN, nk,
                            a.kv_slots, a.kv_slot_rows);
            load_tile<T, D>(v_stage<T, D>(smem, stage ^ 1), vg, G * D, (int64_t)nxt * BN, nk,
                            a.kv_slots, a.kv_slot_rows);
            cp_async_commit();
            cp_async_wait<1>();   /* all but the next tile's group: this one (and Q) landed */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (n_tiles == 0) {
            if (threadIdx.x == 0) cta_mark(a, 0);
            load_q_fragments<T, D>(qf, q_tile<T, D>(smem), warp, lane);
        }
        float s[NT_S][4];
        tile_scores<T, D>(s, qf, k_stage<T, D>(smem, stage), lane);
        if (cur * BN >= flo && (cur + 1) * BN <= fhi)
            online_softmax<false, NT_S, D, SFU, float, NF>(s, m, l, o, lim, cur * BN, lane, a.scale);
        else
            online_softmax<true, NT_S, D, SFU, float, NF, true>(s, m, l, o, lim, cur * BN, lane,
                                                                a.scale, nullptr, lo);
        tile_pv<T, D>(o, s, v_stage<T, D>(smem, stage), lane);
        __syncthreads();   /* stage is refilled by the next iteration's copies */
        cur = nxt;
        if (nxt >= 0) nxt = rule_next(runs, next_run, nxt);
    }
    if (n_tiles > 0 && threadIdx.x == 0) cta_mark(a, 1);

    const fwd_cta e = fwd_cta_of(a, grid, cta_index(), BM);
    rows_wait(a, e, e.x0 + 16 * warp);
    write_rows<T, D, F, NF>(a, e, e.x0 + 16 * warp, lane, m, l, o);
    rows_done(a, e, e.x0 + 16 * warp, lane);
    grid_dep_exit(a);
    cta_trace(a, 1, n_tiles);
#endif
}

template <typename T, int D, dt_attn_form F>
dt_status launch(cudaStream_t stream, const dt_attn_block_args *a, int64_t l2_bytes,
                 int dependent) {
    const dim3 grid((unsigned)(dt_mma_query_tiles(a->qseg.len, DT_MMA_BM) * a->heads * a->batch));
    if (dt_mma_ruled(*a)) {   /* documents or a window: the LATEST form's rule kernel */
        if constexpr (F != DT_ATTN_FORM_LATEST) {
            return dt_mma_refuse_ruled("mma forward");
        } else {
            dt_mma_grid g = dt_mma_fwd_grid(*a, BM, l2_bytes);
            dt_mma_rule_grid(g, a->kseg);
            return dt_mma_launch(a->nonfinite ? fwd_mma_rule_kernel<T, D, true>
                                              : fwd_mma_rule_kernel<T, D, false>,
                                 grid, DT_MMA_THREADS,
                                 (size_t)(BM + 4 * BN) * D * sizeof(T) + sizeof(rule_runs<BM>),
                                 stream, "forward", D, a->dtype, dependent && !a->first, *a, g);
        }
    }
    auto kernel = fwd_mma_kernel<T, D, F, false>;
    if constexpr (F == DT_ATTN_FORM_LATEST)
        if (a->nonfinite) kernel = fwd_mma_kernel<T, D, F, true>;
    return dt_mma_launch(kernel, grid, DT_MMA_THREADS, (size_t)(BM + 4 * BN) * D * sizeof(T),
                         stream, "forward", D, a->dtype, dependent && !a->first, *a,
                         dt_mma_fwd_grid(*a, BM, l2_bytes));
}

void say(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void say(char *why, size_t size, const char *fmt, ...) {
    if (!why || !size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
}

}  // namespace

extern "C" int dt_attn_mma_supported(dt_dtype dtype, int64_t dim, int cc, char *why,
                                     size_t why_size) {
    if (dtype != DT_BF16 && dtype != DT_F16) {
        say(why, why_size, "the tensor-core kernel takes bf16 or fp16, not %s",
            dt_dtype_name(dtype));
        return 0;
    }
    if (dim != 64 && dim != 128) {
        say(why, why_size, "the tensor-core kernel takes head dim 64 or 128, not %lld",
            (long long)dim);
        return 0;
    }
    if (cc < 80) {
        say(why, why_size, "the tensor-core kernel needs compute capability 8.0 or newer; "
            "this device has %d.%d", cc / 10, cc % 10);
        return 0;
    }
    return 1;
}

namespace {

/* The needs both tensor-core kernels share: 16-bit operands 16-byte aligned
 * (cp.async), batch strides of whole 16-byte rows, segments whose row
 * indices fit an int with a tile to spare, key positions that span at most
 * 2^32 - 1 (the kernels divide by the stride in 32 bits: mma_layout.h's
 * dt_mma_keys), a 1-D grid of (tiles of 64 rows of the `tiled` segment) x
 * units x batch blocks within 2^31 - 1. */
int operands_ok(const char *const *names, const void *const *ptrs, int nptrs, int64_t stride_a,
                int64_t stride_b, int64_t nq, dt_attn_segment kseg, int64_t tiled, int64_t units,
                int64_t batch, const char *units_name, char *why, size_t why_size) {
    const int64_t nk = kseg.len;
    for (int i = 0; i < nptrs; i++)
        if ((uintptr_t)ptrs[i] % 16) {
            say(why, why_size, "%s (%p) is not 16-byte aligned", names[i], ptrs[i]);
            return 0;
        }
    if (stride_a % 8 || stride_b % 8) {
        say(why, why_size, "batch strides %lld (q), %lld (k, v) are not multiples of 8 elements",
            (long long)stride_a, (long long)stride_b);
        return 0;
    }
    if (nq > INT32_MAX - BM || nk > INT32_MAX - BN) {
        say(why, why_size, "segments of %lld and %lld rows are too long (2^31 - 64 at most)",
            (long long)nq, (long long)nk);
        return 0;
    }
    if (!dt_mma_keys_fit(kseg)) {
        say(why, why_size, "the key segment's positions span more than 2^32 - 1 (%lld keys, "
            "stride %lld)", (long long)nk, (long long)kseg.stride);
        return 0;
    }
    const int64_t tiles = dt_mma_query_tiles(tiled, DT_MMA_BM);   /* 64-row tiles, either segment */
    if (units * batch > 0 && (units > INT32_MAX / batch || tiles > INT32_MAX / (units * batch))) {
        say(why, why_size, "%lld tiles x %lld %s x %lld batch exceed the grid (2^31 - 1 blocks)",
            (long long)tiles, (long long)units, units_name, (long long)batch);
        return 0;
    }
    return 1;
}

}  // namespace

extern "C" int dt_attn_mma_block_ok(const dt_attn_block_args *a, char *why, size_t why_size) {
    const char *const names[3] = {"q", "k", "v"};
    const void *const ptrs[3] = {a->q, a->k, a->v};
    if (!operands_ok(names, ptrs, 3, a->q_batch_stride, a->kv_batch_stride, a->qseg.len,
                     a->kseg, a->qseg.len, a->heads, a->batch, "heads", why, why_size))
        return 0;
    if ((uintptr_t)a->acc % 8 || a->acc_batch_stride % 2) {
        say(why, why_size, "acc %p (batch stride %lld) is not 8-byte aligned", (void *)a->acc,
            (long long)a->acc_batch_stride);
        return 0;
    }
    if (a->last && (uintptr_t)a->o % 4) {   /* pairs of 16-bit outputs (q's strides: even) */
        say(why, why_size, "o %p is not 4-byte aligned", a->o);
        return 0;
    }
    /* the wgmma kernel's boxes take the same rows of every slot */
    if (a->kv_slots > 1 && (a->kv_slots > 64 || (a->kv_slots & (a->kv_slots - 1)))) {
        say(why, why_size, "keys interleaved from %lld slots: the tensor-core kernels take a power "
            "of two up to 64", (long long)a->kv_slots);
        return 0;
    }
    return 1;
}

extern "C" int dt_attn_mma_bwd_block_ok(const dt_attn_block_bwd_args *a, char *why,
                                        size_t why_size) {
    const char *const names[4] = {"q", "dout", "k", "v"};
    const void *const ptrs[4] = {a->q, a->dout, a->k, a->v};
    if (!operands_ok(names, ptrs, 4, a->q_batch_stride, a->kv_batch_stride, a->qseg.len,
                     a->kseg, a->kseg.len, a->kv_heads, a->batch, "kv heads", why, why_size))
        return 0;
    /* dk, dv: float2 read-add-write (their batch stride is kv_batch_stride,
     * checked above); dq: float2 atomics (mma.sync), bulk reductions of
     * 16-byte aligned rows (wgmma: a row is heads x dim values, dim a
     * multiple of 8). */
    if (((uintptr_t)a->dk | (uintptr_t)a->dv) % 8 || (uintptr_t)a->dq % 16 ||
        a->dq_batch_stride % 4) {
        say(why, why_size, "dk %p or dv %p is not 8-byte aligned, or dq %p (batch stride %lld) "
            "not 16-byte aligned", (void *)a->dk, (void *)a->dv, (void *)a->dq,
            (long long)a->dq_batch_stride);
        return 0;
    }
    /* A CTA walks its GQA group's query tiles (of 64 rows at the least)
     * with 32-bit counters (common.cuh's bwd_cta). */
    const int64_t group = a->kv_heads > 0 ? a->heads / a->kv_heads : 0;
    if (group * ((a->qseg.len + DT_MMA_BM - 1) / DT_MMA_BM) > INT32_MAX) {
        say(why, why_size, "%lld query heads per kv head x %lld query tiles of 64 rows is more "
            "than 2^31 - 1 iterations for one CTA", (long long)group,
            (long long)((a->qseg.len + DT_MMA_BM - 1) / DT_MMA_BM));
        return 0;
    }
    return 1;
}

extern "C" dt_status dt_attn_mma_fwd(void *stream, const dt_attn_block_args *a, int64_t l2_bytes,
                                    int dependent, dt_attn_form form) {
    return dt_mma_dispatch(a->dtype, a->dim, form, [&](auto t, auto d, auto f) {
        return launch<typename decltype(t)::type, decltype(d)::value, decltype(f)::value>(
            static_cast<cudaStream_t>(stream), a, l2_bytes, dependent);
    });
}
