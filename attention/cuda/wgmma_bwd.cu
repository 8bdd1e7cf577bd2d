/* attention/cuda/wgmma_bwd.cu — the Hopper backward block kernel:
 * warpgroup MMA (wgmma, sm_90a) fed by TMA, bf16 and fp16, head dims 64
 * and 128 (FlashAttention-3's structure, simplified: no producer warp, no
 * ping-pong). Tested on the CPU emulator of CUDA (tests/emu, test_mma_emu:
 * against the double reference on ring, striped and zigzag blocks) and on
 * GPUs as block.cu's table of verified paths records (speed:
 * docs/PERFORMANCE.md): auto's first choice on compute capability 9.0, in
 * the form that table names.
 *
 * Two forms (kernels.h's dt_attn_form), one body: LATEST as described
 * below; VERIFIED with exp2f for exp2_ftz, dS stored element by element
 * (store_ds), dQ added by float2 atomics (common.cuh's add_dq) with no
 * staging rows, each k-step's descriptor made from its address, and lse
 * and delta loaded one value at a time (probabilities_t). "LATEST:" marks
 * what only that form does.
 *
 * Contract: dt_attn_kernels.bwd of block.h, as mma_bwd.cu: one
 * query segment against one key/value segment, GQA, the position mask of
 * mask.h; P = exp(scale q.k - lse) (0 where masked and on rows with lse =
 * -inf), dP = dO V^T, dS = P (dP - delta); dV += P^T dO, dK += scale dS^T
 * Q, dQ += scale dS K, all three ADDED into the fp32 outputs, dq by bulk
 * reductions or atomics (its last bits may differ from run to run; dk,
 * dv's do not);
 * a `first` call writes dk, dv instead (0 where no query attends a key).
 *
 * Work split. A CTA per (key tile of BN = 128 keys, kv head, batch), in the
 * launch order of mma_layout.h (the first key tiles, the most queries under
 * a causal mask, of a section of kv heads first), the mma.sync backward's
 * grid. Two warpgroups (256 threads); warpgroup w owns keys 64w .. 64w+63
 * of the tile, its warp v keys 16v .. 16v+15 of those (so warp 4w + v of
 * the CTA holds keys 16 (4w + v) .., the mma.sync backward's per-warp
 * layout of dK and dV, and common.cuh's add_dk_dv serves both). The
 * CTA loops over the query heads of its kv head's group and, per head,
 * over the query tiles of BM = 8192 / D rows (128 at D = 64, 64 at D = 128)
 * that may attend its keys. Per query tile, each warpgroup, "transposed"
 * (keys as the M = 64 rows, FlashAttention-3's layout):
 *   S^T  = K Q^T     wgmma m64nBMk16, A = its K rows, B = Q, both K-major
 *   dP^T = V dO^T    wgmma m64nBMk16, A = its V rows, B = dO, both K-major
 *   P^T = exp2(scale log2e S^T - lse log2e) (0 where masked),
 *   dS^T = P^T (dP^T - delta)        in fp32 registers; lse, delta and the
 *                                    mask's key limits per query from
 *                                    shared memory (one value per column)
 *   dV  += P^T dO    wgmma m64nDk16, A = P^T from registers (rounded to T),
 *                    B = dO MN-major (stored [query][d])
 *   dK  += dS^T Q    likewise, A = dS^T, B = Q
 * with dK and dV in fp32 registers through the whole loop. dS^T goes to
 * shared memory as dS [query][key] (each warpgroup its 64 keys: one column
 * block; LATEST: stmatrix.trans of the A fragments above), and after a barrier
 * each warpgroup computes a 64 x 64 piece of dQ = dS K over all 128 keys:
 *   dQ piece = dS K  wgmma m64n64k16, A = dS rows (K-major), B = K MN-major
 * rows 64w .. (BM = 128, D = 64) or head-dim columns 64w .. (BM = 64,
 * D = 128), one mechanism for both head dims. LATEST: the piece, scaled, goes into
 * the warpgroup's staging rows in shared memory (stage_dq), and after the
 * barrier that closes the iteration the warpgroup's first 64 threads add a
 * row each (256 bytes) into the fp32 dq by a bulk reduction
 * (cp.reduce.async.bulk .add.f32, the TMA unit's: FlashAttention-3's dQ),
 * which reads the rows during the next iteration's math; those threads
 * wait for the reads (cp.async.bulk.wait_group.read) before the next
 * iteration's dS barrier, after which the rows are written again, and for
 * the adds before they exit. Where float2 atomics (common.cuh's
 * add_dq, which the mma.sync backward keeps) took every thread 16
 * reductions and their 64-bit addresses a query tile, that thread stores
 * 16 float2 into shared memory and half of them issue one instruction.
 *
 * Dependent launch (compute capability 9.0; block.h's continues): every
 * CTA runs griddepcontrol.launch_dependents at its start and
 * griddepcontrol.wait only before it exits, so that a block continuing
 * the call may run beside the end of the one before (it adds into the
 * same dq, by reductions, and touches nothing else that block does) and
 * completes after it.
 *
 * Mask and skipped tiles: the mma.sync backward's rule (mma_layout.h's
 * dt_mma_bwd_first_qtile / _unmasked_qtile with BM rows): the visited query
 * tiles are exactly the non-empty ones, the unmasked ones the full tiles of
 * a whole key tile; masked tiles compare each key with its query's key
 * limit (dt_attn_keys_upto), which also masks the keys past the segment.
 * Query rows past the segment and rows whose lse is -inf take lse = +inf:
 * P = 0 exactly, so nothing they touch changes.
 *
 * Shared memory, every tile in ptx_sm90.cuh's 128-byte swizzled
 * column-block layout on a 1024-byte boundary: [K][V] of [BN][D], [Q 0]
 * [Q 1][dO 0][dO 1] of [BM][D], [dS] of [BM][BN], then per stage the
 * query rows' lse log2e, delta and key limits, two mbarriers, and (LATEST)
 * the two warpgroups' dQ staging rows (36 KiB): 182 KiB at D = 128, 168
 * KiB at D = 64 (146 and 130 KiB without the staging rows: VERIFIED).
 * Loads: TMA from 4-D tensor maps of the
 * block's segments (rows past a segment arrive as zeros), issued by thread
 * 0: K, V and the first query tile's Q, dO on full[0]; the next query
 * tile's Q, dO into the other stage at the top of each iteration, flying
 * during its math; the __syncthreads closing an iteration frees its stage,
 * its row values and the dS tile. dS and the dQ staging rows are written
 * by the generic proxy (stmatrix, stores) and read by the async proxy
 * (wgmma, the bulk reductions): each writer runs fence.proxy.async before
 * the barrier. A wait that does not complete within 10 s traps.
 *
 * Registers per thread: dK, dV D (64 at D = 64, 128 at D = 128), S^T and
 * dP^T BM / 2 each, P^T and dS^T as A fragments BM / 4 each, the dQ piece
 * 32. ptxas (CUDA 13, sm_90a): 238 registers at D = 64, 240 at D = 128
 * (VERIFIED: 228 and 250), no spills, no serialised wgmma; one CTA (8
 * warps) per SM.
 *
 * Documents and windows (block.h's docs, window), in the LATEST form only:
 * bwd_wgmma_rule_kernel, the same body (bwd_wgmma_body) with the mma.sync
 * backward's rule design (common.cuh, "documents and windows"): per key
 * its range of query rows, the query tiles of their runs, masks by both
 * ends of each query row's range of key rows (wb_rule_smem: their starts
 * per stage). The VERIFIED form's launch refuses such a block with
 * DT_ERR_NOT_SUPPORTED. Test: tests/test_mma_emu.c, backward-wgmma-rule/...
 *
 * Not done (docs/PERFORMANCE.md): FlashAttention-3's producer warp and
 * register reallocation (setmaxnreg), and skipping a warpgroup's products
 * on query tiles its keys do not see.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "common.cuh"
#include "mma_layout.h"
#include "ptx_sm90.cuh"

namespace {

constexpr int WB_BN = DT_MMA_BWD_BN;   /* keys per CTA: 64 per warpgroup */
constexpr int WB_THREADS = 256;        /* two warpgroups */
static_assert(WB_BN == 128, "two warpgroups of 64 keys");

/* Query rows per tile: 128 at D = 64, 64 at D = 128 (so that each
 * warpgroup's dQ piece is 64 x 64, and the registers fit). */
template <int D>
constexpr int wb_bm() {
    return 8192 / D;
}

/* The per-row values of one query tile (a stage): lse log2(e) (+inf: the
 * row contributes nothing), delta, and the row's key limit (mask.h). */
template <int BM>
struct wb_rows {
    float lse2[BM];
    float delta[BM];
    int64_t lim[BM];
};

/* A staging row of a warpgroup's dQ piece: its 64 fp32 and 32 bytes more,
 * so that row r starts 8 r banks on (mod 32) and a half-warp's float2
 * stores (4 rows, 4 column pairs: stage_dq) meet no bank twice. */
constexpr uint32_t WB_DQ_ROW = 64 * 4 + 32;

/* Byte offsets of the shared-memory regions (from the 1024-aligned base);
 * the dQ staging rows in the LATEST form only. */
template <int D, dt_attn_form F>
struct wb_smem {
    static constexpr int BM = wb_bm<D>();
    static constexpr uint32_t KV = WB_BN * D * 2, QT = BM * D * 2;   /* tile bytes */
    static constexpr uint32_t K = 0, V = K + KV, Q = V + KV, DO = Q + 2 * QT, DS = DO + 2 * QT,
                              ROWS = DS + BM * WB_BN * 2, BARS = ROWS + 2 * sizeof(wb_rows<BM>),
                              DQ = (BARS + 2 * 8 + 127) / 128 * 128,   /* [2][64][WB_DQ_ROW] */
                              END = F == DT_ATTN_FORM_LATEST ? DQ + 2 * 64 * WB_DQ_ROW
                                                             : BARS + 2 * 8;
    /* dynamic shared memory to ask for: the regions plus the alignment slack */
    static constexpr size_t BYTES = 1024 + END;
};

/* The rule kernel's (documents and windows) regions past wb_smem's: per
 * stage the query rows' key-row range starts (their ends are wb_rows'
 * lim), then the keys' runs of query tiles (common.cuh). */
template <int D>
struct wb_rule_smem {
    using L = wb_smem<D, DT_ATTN_FORM_LATEST>;
    static constexpr uint32_t LO = (L::END + 7) / 8 * 8, RUNS = LO + 2 * L::BM * 8,
                              END = RUNS + sizeof(rule_runs<WB_BN>);
    static constexpr size_t BYTES = 1024 + END;
};

struct wb_params {
    CUtensorMap q, dout, k, v;
    dt_attn_block_bwd_args a;
    dt_mma_grid grid;   /* the launch's index math (common.cuh) */
};

#ifndef DT_WGMMA_STUB

/* Fills a stage's row values for query rows x0 .. x0 + BM - 1 of head h
 * (threads 0 .. BM - 1, one row each). */
template <int BM>
__device__ __forceinline__ void fill_rows(wb_rows<BM> *r, const dt_attn_block_bwd_args &a,
                                          const dt_mma_grid &grid, int64_t b, int64_t h,
                                          int64_t x0) {
    const int i = (int)threadIdx.x;
    if (i >= BM) return;
    const int64_t x = x0 + i, off = b * a.ml_batch_stride + h * a.ml_head_stride + x;
    const bool live = x < a.qseg.len;
    const float l = live ? a.lse[off] : -INFINITY;
    r->lse2[i] = l == -INFINITY ? INFINITY : l * LOG2E;   /* P = 0 on the whole row */
    r->delta[i] = live ? a.delta[off] : 0.0f;
    r->lim[i] = live ? dt_mma_keys_upto(&grid.keys, dt_attn_pos(a.qseg, x)) : 0;
}

/* The rule kernel's: a stage's query rows' ranges of key rows, [lo[i],
 * r->lim[i]) (threads 0 .. BM - 1, after their fill_rows; grid.keys counts
 * the rows up to any position: dt_mma_rule_grid). */
template <int BM>
__device__ __forceinline__ void fill_rule_rows(wb_rows<BM> *r, int64_t *lo,
                                               const dt_attn_rule &rule,
                                               const dt_attn_block_bwd_args &a,
                                               const dt_mma_grid &grid, int64_t x0) {
    const int i = (int)threadIdx.x;
    if (i >= BM) return;
    int l = 0, h = 0;
    if (x0 + i < a.qseg.len) rule_rows(rule, 1, dt_attn_pos(a.qseg, x0 + i), grid.keys, l, h);
    lo[i] = l;
    r->lim[i] = h;
}

/* In: s = S^T, dp = dP^T of the warp's 16 keys (rows) x BM queries
 * (columns: n-tile j = queries 8j .. 8j+7). Out: s = P^T, dp = dS^T (fp32).
 * MASKED: key `key0 + row` >= its query's limit gives P = 0 (RANGED,
 * documents and windows: also key < lim_lo[its query]). F: the form
 * (its exponentials; LATEST loads the lane's lse and delta in pairs). NF
 * (block.h's nonfinite): a score of +-inf becomes NaN (x + 0 x), and a
 * query with lse2 = +inf gets P = 0 by a select, whatever its scores hold. */
template <bool MASKED, int BM, dt_attn_form F, bool NF, bool RANGED = false>
__device__ __forceinline__ void probabilities_t(float (&s)[BM / 8][4], float (&dp)[BM / 8][4],
                                                const wb_rows<BM> *r, int64_t key0, int lane,
                                                float scale_log2, const int64_t *lim_lo = nullptr) {
    constexpr bool PAIRS = F == DT_ATTN_FORM_LATEST;
#pragma unroll
    for (int j = 0; j < BM / 8; j++) {
        /* PAIRS: the lane's two columns' values, each pair in one load */
        const int c0 = 8 * j + dt_mma_c_col(lane, 0);
        float2 lse2 = make_float2(0.0f, 0.0f), delta = lse2;
        if constexpr (PAIRS) {
            lse2 = *reinterpret_cast<const float2 *>(&r->lse2[c0]);
            delta = *reinterpret_cast<const float2 *>(&r->delta[c0]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* dt_mma_c_col(lane, i)'s column, as each form has it made */
            const int c = PAIRS ? c0 + (i & 1) : 8 * j + dt_mma_c_col(lane, i);
            const float lc = PAIRS ? (i & 1 ? lse2.y : lse2.x) : r->lse2[c];
            const float dc = PAIRS ? (i & 1 ? delta.y : delta.x) : r->delta[c];
            float p;
            if constexpr (NF) {
                float x = s[j][i] * scale_log2;
                x += 0.0f * x;
                p = lc == INFINITY ? 0.0f : exp2_of<F>(x - lc);
            } else {
                p = exp2_of<F>(s[j][i] * scale_log2 - lc);   /* 0 when lse2 = +inf */
            }
            if (MASKED && key0 + dt_mma_c_row(lane, i) >= r->lim[c]) p = 0.0f;
            if constexpr (RANGED)
                if (MASKED && key0 + dt_mma_c_row(lane, i) < lim_lo[c]) p = 0.0f;
            s[j][i] = p;
            dp[j][i] = p * (dp[j][i] - dc);
        }
    }
}

/* Stores the warpgroup's dS^T (its 64 keys x BM queries, rounded to T) as
 * dS [query][key] into column block `wg` of the dS tile at sds.
 * LATEST: from dsa, the A fragments of dK += dS^T Q (dS^T rounded to T).
 * Register m of fragment kk is the 8x8 matrix of the warp's keys 8 (m % 2)
 * .. and the queries of n-tile j = dt_mma_p_tile(kk, m) (elements
 * dt_mma_p_elem(m) of the accumulators), in the layout stmatrix takes;
 * stored transposed, each of its queries' rows is 8 keys, one 16-byte
 * chunk of the tile, whose address lane 8m + i gives for query 8j + i:
 * four instructions a fragment. VERIFIED: from ds, the fp32 accumulators,
 * each thread its BM / 2 values 16 bits at a time. */
template <typename T, int BM, dt_attn_form F>
__device__ __forceinline__ void store_ds(unsigned char *sds, const float (&ds)[BM / 8][4],
                                         const uint32_t (&dsa)[BM / 16][4], int wg, int wl,
                                         int lane) {
    if constexpr (F == DT_ATTN_FORM_LATEST) {
        const int m = lane / 8, i = lane % 8;
        const int key = 64 * wg + 16 * wl + 8 * (m % 2);
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)
            stmatrix_x4_trans(sds + wg_tile_off(8 * dt_mma_p_tile(kk, m) + i, key, BM), dsa[kk]);
    } else {
#pragma unroll
        for (int j = 0; j < BM / 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = 64 * wg + 16 * wl + dt_mma_c_row(lane, i);
                const int query = 8 * j + dt_mma_c_col(lane, i);
                *reinterpret_cast<uint16_t *>(sds + wg_tile_off(query, key, BM)) =
                    (uint16_t)(elem<T>::pack(ds[j][i], 0.0f) & 0xFFFFu);
            }
    }
}

/* LATEST: the warpgroup's dQ piece (64 x 64, wgmma's accumulator layout: n-tile
 * j is columns 8j ..; the warp's rows 16 wl ..), scaled, into its staging
 * rows at sdq: row 16 wl + g (+ 8) gets columns 2t, 2t + 1 of each n-tile,
 * a float2. */
__device__ __forceinline__ void stage_dq(unsigned char *sdq, const float (&dq)[8][4], int wl,
                                         int lane, float scale) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = 16 * wl + dt_mma_c_row(lane, 2 * half);
            const int col = 8 * j + dt_mma_c_col(lane, 2 * half);
            *reinterpret_cast<float2 *>(sdq + row * WB_DQ_ROW + col * 4) =
                make_float2(scale * dq[j][2 * half], scale * dq[j][2 * half + 1]);
        }
}

#endif /* !DT_WGMMA_STUB */

#ifndef DT_WGMMA_STUB
/* The kernels' body: bwd_wgmma_kernel's (R false), and with R (documents
 * and windows: bwd_wgmma_rule_kernel, LATEST only; common.cuh, "documents
 * and windows") the same with the CTA's walk over its keys' runs of query
 * tiles: each key's range of query rows (keys = 0) made once, per head the
 * query tiles of their runs (rule_tile_at), a tile inside [lo of the last
 * key, hi of the first) unmasked when the key tile is whole, the others
 * masked by both ends of each query row's range of key rows
 * (fill_rule_rows, probabilities_t's RANGED). */
template <typename T, int D, dt_attn_form F, bool NF, bool R>
__device__ __forceinline__ void bwd_wgmma_body(const wb_params &p) {
    static_assert(!R || F == DT_ATTN_FORM_LATEST, "documents and windows run only in LATEST forms");
    using L = wb_smem<D, F>;
    constexpr int BM = L::BM;
    constexpr bool LATEST = F == DT_ATTN_FORM_LATEST;
    const dt_attn_block_bwd_args &a = p.a;
    cta_trace(a, 0);
    grid_dep_launch();   /* a continuing block after this one may start (dependent) */
    if (threadIdx.x == 0) {   /* the tensor maps into the SM's descriptor cache (a hint) */
        tma_prefetch_map(&p.q);
        tma_prefetch_map(&p.dout);
        tma_prefetch_map(&p.k);
        tma_prefetch_map(&p.v);
    }
    DT_DYNAMIC_SMEM(unsigned char, smem_raw);
    unsigned char *const sm = smem_raw + ((1024u - (wg_smem_addr(smem_raw) & 1023u)) & 1023u);
    wb_rows<BM> *const rows = reinterpret_cast<wb_rows<BM> *>(sm + L::ROWS);   /* [2] */
    uint64_t *const full = reinterpret_cast<uint64_t *>(sm + L::BARS);         /* [2] */

    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int wg = warp >> 2, wl = warp & 3;   /* warpgroup, warp within it */
    const int64_t H = a.heads, G = a.kv_heads;
    const int64_t nq = a.qseg.len, nk = a.kseg.len;
    const bwd_cta c = bwd_cta_of(a, p.grid, BM);
    /* R: the keys' runs of query tiles (c's walk is the mask's), the same
     * for every head of the group; [flo, fhi): the query rows every key
     * pairs with */
    int n_iter = c.n_iter;
    [[maybe_unused]] int per_head = 0, flo = 0, fhi = 0;
    [[maybe_unused]] bool whole = false;
    [[maybe_unused]] const dt_attn_rule rule = dt_attn_block_bwd_rule(&a, c.b);
    [[maybe_unused]] rule_runs<WB_BN> *const runs =
        reinterpret_cast<rule_runs<WB_BN> *>(sm + wb_rule_smem<D>::RUNS);
    [[maybe_unused]] int64_t *const rlo = reinterpret_cast<int64_t *>(sm + wb_rule_smem<D>::LO);
    if constexpr (R) {
        if ((int)threadIdx.x < WB_BN) {
            const int64_t y = c.y0 + threadIdx.x;
            int64_t qlo = 0, qhi = 0;
            if (y < nk) dt_attn_rule_rows(rule, 0, dt_attn_pos(a.kseg, y), a.qseg, &qlo, &qhi);
            runs->lo[threadIdx.x] = (int32_t)qlo;
            runs->hi[threadIdx.x] = (int32_t)qhi;
        }
        __syncthreads();
        rule_runs_build(*runs, BM);
        __syncthreads();
        whole = c.y0 + WB_BN <= nk;
        flo = runs->lo[(whole ? WB_BN : nk - c.y0) - 1];
        fhi = runs->hi[0];
        per_head = rule_tile_count(*runs);
        n_iter = c.group * per_head;
    }
    /* iteration it's query head and query tile */
    const auto head_of = [&](int it) -> int {
        if constexpr (R) return c.g * c.group + it / per_head;
        else return c.head(it);
    };
    const auto qtile_of = [&](int it) -> int {
        if constexpr (R) return rule_tile_at(*runs, it % per_head);
        else return c.qtile(it);
    };
    if (n_iter == 0) {   /* no query attends these keys: dk, dv unchanged, or 0 */
        if (a.first)
            zero_dk_dv<D>(a.dk + c.b * a.kv_batch_stride + c.g * D,
                          a.dv + c.b * a.kv_batch_stride + c.g * D, G * D, c.y0, nk);
        grid_dep_wait();
        return cta_trace(a, 1);
    }
    const int64_t b = c.b, g = c.g, y0 = c.y0;

    /* Stage s's Q and dO land on full[s] (one arrival: thread 0's
     * expect_tx, plus the bytes); its n-th use completes phase n. K and V
     * come with the first query tile, on full[0]. */
    const int bi = (int)b, gi = (int)g;
    if (threadIdx.x == 0) {
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        fence_mbar_init();
    }
    __syncthreads();
    auto load_q = [&](int stage, int64_t it) {   /* thread 0: iteration it's Q and dO */
        const int hi = (int)head_of((int)it), x0 = (int)(qtile_of((int)it) * BM);
#pragma unroll
        for (int cb = 0; cb < D / 64; cb++) {
            tma_load_4d(sm + L::Q + stage * L::QT + cb * BM * 128, &p.q, 64 * cb, hi, x0, bi,
                        &full[stage]);
            tma_load_4d(sm + L::DO + stage * L::QT + cb * BM * 128, &p.dout, 64 * cb, hi, x0, bi,
                        &full[stage]);
        }
    };
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&full[0], 2 * L::KV + 2 * L::QT);
#pragma unroll
        for (int cb = 0; cb < D / 64; cb++) {
            tma_load_4d(sm + L::K + cb * WB_BN * 128, &p.k, 64 * cb, gi, (int)y0, bi, &full[0]);
            tma_load_4d(sm + L::V + cb * WB_BN * 128, &p.v, 64 * cb, gi, (int)y0, bi, &full[0]);
        }
        load_q(0, 0);
    }
    fill_rows<BM>(&rows[0], a, p.grid, b, head_of(0), qtile_of(0) * BM);
    if constexpr (R) fill_rule_rows<BM>(&rows[0], rlo, rule, a, p.grid, qtile_of(0) * BM);
    __syncthreads();   /* iteration 0's row values */

    const uint32_t k_addr = wg_smem_addr(sm + L::K), v_addr = wg_smem_addr(sm + L::V);
    const uint32_t ds_addr = wg_smem_addr(sm + L::DS);
    /* This warpgroup's piece of dQ: rows r0 .., head-dim columns c0 .. */
    const int r0 = BM == 128 ? 64 * wg : 0, c0 = D == 128 ? 64 * wg : 0;
    const int64_t key0 = y0 + 64 * wg + 16 * wl;   /* the warp's first key */
    const float scale_log2 = a.scale * LOG2E;
    /* LATEST: dQ goes through shared memory: the warpgroup stages its
     * piece there, and its first 64 threads add a row of it each into dq by
     * a bulk reduction (the TMA unit's, FlashAttention-3's dQ). */
    [[maybe_unused]] unsigned char *const sdq = sm + L::DQ + (uint32_t)wg * 64u * WB_DQ_ROW;
    const int wt = (int)threadIdx.x & 127;   /* the thread within its warpgroup */

    /* dk[j][i], dv[j][i]: accumulator element i of n-tile j (head-dim
     * columns 8j .. 8j+7) of the warp's 16 keys. */
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[j][i] = dv[j][i] = 0.0f;

    for (int it = 0; it < n_iter; it++) {
        const int stage = (int)(it & 1);
        if (it + 1 < n_iter) {   /* iteration it+1's loads fly during this one */
            if (threadIdx.x == 0) {
                mbar_arrive_expect_tx(&full[stage ^ 1], 2 * L::QT);
                load_q(stage ^ 1, it + 1);
            }
            fill_rows<BM>(&rows[stage ^ 1], a, p.grid, b, head_of(it + 1), qtile_of(it + 1) * BM);
            if constexpr (R)
                fill_rule_rows<BM>(&rows[stage ^ 1], rlo + (stage ^ 1) * BM, rule, a, p.grid,
                                   qtile_of(it + 1) * BM);
        }
        const int64_t h = head_of(it), qt = qtile_of(it);
        const wb_rows<BM> *r = &rows[stage];
        const uint32_t q_addr = wg_smem_addr(sm + L::Q + stage * L::QT);
        const uint32_t do_addr = wg_smem_addr(sm + L::DO + stage * L::QT);
        mbar_wait(&full[stage], (uint32_t)(it >> 1) & 1u);   /* Q, dO (and K, V) have landed */
        if (it == 0 && threadIdx.x == 0) cta_mark(a, 0);     /* --trace: the first tiles' */

        /* S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 keys (rows 64w
         * of the K and V tiles) against the tile's BM queries. */
        float s[BM / 8][4], dp[BM / 8][4];
        /* The k-steps' descriptors: LATEST the first one's plus a constant
         * each (wg_desc_plus), as the forward's S product at D = 128;
         * VERIFIED each made from its address. */
        const uint32_t ka = k_addr + 64u * 128u * wg, va = v_addr + 64u * 128u * wg;
        const uint64_t kd = wg_desc_k_major(ka, WB_BN, 0), vd = wg_desc_k_major(va, WB_BN, 0),
                       qd = wg_desc_k_major(q_addr, BM, 0), dod = wg_desc_k_major(do_addr, BM, 0);
        const auto k_step = [](uint32_t addr, uint64_t first, int rows, int kk) {
            if constexpr (LATEST) return wg_desc_plus(first, wg_k_major_off(rows, kk));
            else return wg_desc_k_major(addr, rows, kk);
        };
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_ss<T, BM>(s, k_step(ka, kd, WB_BN, kk), k_step(q_addr, qd, BM, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_ss<T, BM>(dp, k_step(va, vd, WB_BN, kk), k_step(do_addr, dod, BM, kk), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        if constexpr (R) {
            if (!(whole && qt * BM >= flo && (qt + 1) * BM <= fhi))
                probabilities_t<true, BM, F, NF, true>(s, dp, r, key0, lane, scale_log2,
                                                       rlo + stage * BM);
            else
                probabilities_t<false, BM, F, NF>(s, dp, r, key0, lane, scale_log2);
        } else if (qt < c.qt_unmasked) {
            probabilities_t<true, BM, F, NF>(s, dp, r, key0, lane, scale_log2);
        } else {
            probabilities_t<false, BM, F, NF>(s, dp, r, key0, lane, scale_log2);
        }

        /* dV += P^T dO, dK += dS^T Q: A from registers (k-step kk: queries
         * 16kk ..), B MN-major from the dO and Q tiles. */
        uint32_t pa[BM / 16][4], dsa[BM / 16][4];
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            p_fragment<T>(pa[kk], s, kk);
            p_fragment<T>(dsa[kk], dp, kk);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)
            wgmma_rs<T, D>(dv, pa[kk], wg_desc_mn_major(do_addr, BM, kk), 1);
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)
            wgmma_rs<T, D>(dk, dsa[kk], wg_desc_mn_major(q_addr, BM, kk), 1);
        wgmma_commit();

        /* dS to shared memory for dQ = dS K, which needs every key's. */
        store_ds<T, BM, F>(sm + L::DS, dp, dsa, wg, wl, lane);
        fence_proxy_async();
        /* LATEST: the last iteration's reductions have read their rows */
        if (LATEST && wt < 64) bulk_wait_read<0>();
        __syncthreads();   /* the dS tile is complete (LATEST: the staging rows free) */

        float dq[8][4];
        const uint32_t dsa0 = ds_addr + (uint32_t)r0 * 128u;
        const uint64_t dsd = wg_desc_k_major(dsa0, BM, 0);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WB_BN / 16; kk++)   /* B MN-major: TRANS_B = 1 */
            wgmma_ss<T, 64, 1>(dq, k_step(dsa0, dsd, BM, kk),
                               wg_desc_mn_major(k_addr + (uint32_t)(c0 / 64) * WB_BN * 128u,
                                                WB_BN, kk),
                               kk > 0);
        wgmma_commit();
        wgmma_wait<0>();   /* dV, dK and the dQ piece */
        if constexpr (LATEST) {
            stage_dq(sdq, dq, wl, lane, a.scale);
            fence_proxy_async();
            /* this stage, its row values and dS are rewritten by what
             * follows; the staging rows are complete */
            __syncthreads();
            if (wt < 64) {   /* query row qt BM + r0 + wt, columns c0 .. c0 + 63 */
                const int64_t x = qt * BM + r0 + wt;
                if (x < nq)
                    bulk_reduce_add_f32(a.dq + b * a.dq_batch_stride + x * H * D + h * D + c0,
                                        sdq + wt * WB_DQ_ROW, 64 * 4);
                bulk_commit();
            }
        } else {
            int64_t qrow[2];
            bool live[2];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                qrow[half] = qt * BM + r0 + 16 * wl + dt_mma_c_row(lane, 2 * half);
                live[half] = qrow[half] < nq;
            }
            add_dq<8>(a.dq + b * a.dq_batch_stride + h * D, H * D, c0, dq, qrow, live, lane,
                      a.scale);
            __syncthreads();   /* this stage, its row values and dS are rewritten by what follows */
        }
    }
    if (LATEST && wt < 64) bulk_wait<0>();   /* before the CTA's shared memory goes */

    /* --trace: every thread is done with the loop (its last __syncthreads) */
    if (threadIdx.x == 0) cta_mark(a, 1);
    /* Add into dk (scaled) and dv: the warp's keys 16 warp .. 16 warp + 15. */
    add_dk_dv<D>(a.dk + b * a.kv_batch_stride + g * D, a.dv + b * a.kv_batch_stride + g * D,
                 G * D, y0 + 16 * warp, nk, dk, dv, lane, a.scale, a.first);
    /* A dependent block completes after the block before (it wrote none
     * of this one's inputs, so nothing waits earlier). */
    grid_dep_wait();
    cta_trace(a, 1, n_iter);
}
#endif /* !DT_WGMMA_STUB */

/* grid: ceil(kseg.len / 128) x kv_heads x batch blocks, in mma_layout.h's
 * launch order (p.grid.order); block: 256 threads; dynamic
 * shared memory wb_smem<D, F>::BYTES. F: the form; NF: the LATEST form's
 * instance for a block with non-finite inputs (block.h's nonfinite:
 * probabilities_t keeps the rules). */
template <typename T, int D, dt_attn_form F, bool NF>
__global__ void __launch_bounds__(WB_THREADS, 1)
    bwd_wgmma_kernel(const __grid_constant__ wb_params p) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
#ifdef DT_WGMMA_STUB
    (void)p;
    __trap();   /* never launched: the host requires an sm_90a build and a 9.0 device */
#else
    bwd_wgmma_body<T, D, F, NF, false>(p);
#endif
}

/* The LATEST form with documents or a window (block.h's docs, window):
 * bwd_wgmma_kernel's grid and block, dynamic shared memory
 * wb_rule_smem<D>::BYTES; p.grid's keys count the rows up to any position
 * (dt_mma_rule_grid). NF as bwd_wgmma_kernel's. */
template <typename T, int D, bool NF>
__global__ void __launch_bounds__(WB_THREADS, 1)
    bwd_wgmma_rule_kernel(const __grid_constant__ wb_params p) {
#ifdef DT_WGMMA_STUB
    (void)p;
    __trap();
#else
    bwd_wgmma_body<T, D, DT_ATTN_FORM_LATEST, NF, true>(p);
#endif
}

template <typename T, int D, dt_attn_form F>
dt_status launch(cudaStream_t stream, const dt_attn_block_bwd_args *a, int64_t l2_bytes,
                 int dependent) {
    if constexpr (F != DT_ATTN_FORM_LATEST)   /* documents and windows: LATEST only */
        if (dt_mma_ruled(*a)) return dt_mma_refuse_ruled("wgmma backward");
    wb_params p;
    memset(&p, 0, sizeof p);
    p.a = *a;
    p.grid = dt_mma_bwd_grid(*a, l2_bytes);
    DT_TRY(make_block_maps(*a, wb_bm<D>(), WB_BN, &p.q, &p.k, &p.v, a->dout, &p.dout));
    const dim3 grid((unsigned)((a->kseg.len + WB_BN - 1) / WB_BN * a->kv_heads * a->batch));
    if constexpr (F == DT_ATTN_FORM_LATEST) {
        if (dt_mma_ruled(*a)) {   /* documents or a window */
            dt_mma_rule_grid(p.grid, a->kseg);
            return dt_mma_launch(a->nonfinite ? bwd_wgmma_rule_kernel<T, D, true>
                                              : bwd_wgmma_rule_kernel<T, D, false>,
                                 grid, WB_THREADS, wb_rule_smem<D>::BYTES, stream,
                                 "backward (wgmma, documents and windows)", D, a->dtype,
                                 dependent && a->continues, p);
        }
    }
    auto kernel = bwd_wgmma_kernel<T, D, F, false>;
    if constexpr (F == DT_ATTN_FORM_LATEST)
        if (a->nonfinite) kernel = bwd_wgmma_kernel<T, D, F, true>;
    return dt_mma_launch(kernel, grid, WB_THREADS, wb_smem<D, F>::BYTES, stream,
                         "backward (wgmma)", D, a->dtype, dependent && a->continues, p);
}

}  // namespace

extern "C" dt_status dt_attn_wgmma_bwd(void *stream, const dt_attn_block_bwd_args *a,
                                       int64_t l2_bytes, int dependent, dt_attn_form form) {
    return dt_mma_dispatch(a->dtype, a->dim, form, [&](auto t, auto d, auto f) {
        return launch<typename decltype(t)::type, decltype(d)::value, decltype(f)::value>(
            static_cast<cudaStream_t>(stream), a, l2_bytes, dependent);
    });
}
