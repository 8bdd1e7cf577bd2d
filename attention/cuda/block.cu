/* attention/cuda/block.cu — the CUDA attention kernels, and which of them
 * runs a block.
 *
 * STATUS: everything here is built (nvcc, sm_90 by default) and runs on the
 * CPU emulator of CUDA (tests/emu: `make CUDA=emu test`, and test_mma_emu
 * for the tensor-core kernels in every `make test`). What has passed on a
 * GPU, and in which form, is the table verified_paths below.
 *
 * Same contract and mask rule as block_cpu.c (block.h). Forward: three
 * kernels, chosen per block by fwd():
 *   - wgmma (wgmma_fwd.cu): Hopper warpgroup MMA fed by TMA, bf16 /
 *     fp16, head dim 64 or 128, compute capability 9.0 and an sm_90 build,
 *     16-byte aligned q, k, v (1.16x to 1.62x FlashAttention-2's forward
 *     on an H200: docs/PERFORMANCE.md).
 *   - mma (mma_fwd.cu): FlashAttention-2 style on tensor cores, for
 *     bf16 / fp16, head dim 64 or 128, compute capability >= 8.0, with
 *     16-byte aligned q, k, v.
 *   - simple (here): one thread per query row of one (batch, head), blocks
 *     of 64 rows; key tiles of 64 whose class (mask.h) is computed once per
 *     thread block: empty tiles are skipped, full tiles are not masked.
 *     Each thread keeps its row's running max and sum in registers and its
 *     unnormalised output in the fp32 acc array, which it alone writes. K
 *     and V tiles are staged in shared memory as fp32 (bf16 / fp16 are
 *     widened on load). Every dtype and head dim; the fallback, and the
 *     in-tree cross-check of the tensor-core kernels.
 * Each kernel comes in two forms (kernels.h's dt_attn_form): VERIFIED,
 * which has passed on a GPU, and LATEST, with the changes no GPU has run
 * yet; a LATEST form keeps block.h's non-finite rules in a second
 * instance, launched for a block with non-finite inputs
 * (dt_attn_block_args.nonfinite), and otherwise the same code as without
 * the rules (for the simple kernels, the VERIFIED code). DT_ATTN_KERNEL
 * (tuning.h; read by the attention plan, once per call, and passed in
 * dt_attn_block_args.tuning) picks: auto the first path of verified_paths
 * for the device's compute capability that can run the block, else
 * simple; simple always; mma or wgmma the VERIFIED form; simple-latest,
 * mma-latest or wgmma-latest the LATEST form; or DT_ERR_NOT_SUPPORTED
 * naming what is missing (checked before the ring loop by kernel_check;
 * alignment per block). dt_attn_cuda_path_of is that choice, tested
 * without a GPU (test_attention's cuda-kernel-table case); exact_nonfinite
 * tells the plan whether that choice keeps the non-finite rules.
 *
 * Backward: three kernels too, chosen per block by bwd() the same way
 * (dt_attn_mma_bwd_block_ok for alignment):
 *   - wgmma (wgmma_bwd.cu): Hopper warpgroup MMA fed by TMA, a
 *     CTA per 128 keys of a kv head (1.5x to 1.8x the mma one on an H200:
 *     docs/PERFORMANCE_HISTORY.md).
 *   - mma (mma_bwd.cu): FlashAttention-2 structure on tensor
 *     cores (a CTA per 128 keys of a kv head, dK and dV in registers over
 *     the query tiles of its group's heads, dQ added with atomics).
 *   - simple (here; FlashAttention-2 math, no atomics): one kernel in which
 *     each thread owns a query row and accumulates dQ over the keys; one in
 *     which each thread owns a key row of a kv head and accumulates dK, dV
 *     over the queries of every head in its group.
 * All recompute P from the forward's lse.
 *
 * Everything runs on the backend's compute stream; errors of a launch are
 * read with cudaGetLastError and returned as DT_ERR_BACKEND.
 *
 * Documents and windows (mask.h's rule beyond the mask: block.h's docs,
 * window) run only in the simple kernels' LATEST form, in kernels of their
 * own (fwd_rule_kernel, bwd_dq_rule_kernel, bwd_dkv_rule_kernel), so that
 * the code of every other path is the same with or without them. They
 * follow block_cpu.c's design: per 64 query rows the range of key rows
 * some row may attend (dt_attn_rule_range), in tiles that
 * dt_attn_rule_tile calls empty (skipped), full or partial; each row runs
 * only the keys of its own span (dt_attn_rule_rows, once per row), which
 * masks a partial tile without a select. The backward's threads loop over
 * their row's span: the keys a query pairs with (dQ), the queries that pair
 * with a key (keys = 0: dK, dV). kernel_check refuses a ruled call for
 * any other DT_ATTN_KERNEL choice, and the paths send every ruled block
 * there; the host skips a block whose mask and window leave no pair (the
 * documents, in device memory, are the plan's to skip: forward.c,
 * backward.c).
 *
 * Test: tests/test_attention.c, tests/test_attention_backward.c on a GPU
 * or the emulator (make test), against the CPU backend's results and the
 * double reference: every kernel forced in its VERIFIED form
 * ("cuda-kernels" cases) and its LATEST form ("cuda-latest" cases);
 * documents and windows: tests/test_attention_docs_cuda.c.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

extern "C" {
#include "../block.h"
#include "kernels.h"
#include "../../dtensor/backend_cuda.h"
}
#include "../../base/cuda_launch.cuh"

#define TQ 64
#define TK 64

namespace {

__device__ __forceinline__ float load(const void *p, dt_dtype dt, int64_t i) {
    if (dt == DT_F32) return static_cast<const float *>(p)[i];
    if (dt == DT_BF16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    return __half2float(static_cast<const __half *>(p)[i]);
}

__device__ __forceinline__ void store_val(void *p, dt_dtype dt, int64_t i, float v) {
    if (dt == DT_F32) static_cast<float *>(p)[i] = v;
    else if (dt == DT_BF16) static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
    else static_cast<__half *>(p)[i] = __float2half_rn(v);
}

__device__ __forceinline__ int64_t pos(dt_attn_segment s, int64_t x) { return dt_attn_pos(s, x); }

/* The larger of a and b, NaN if either is NaN (fmaxf returns the other
 * operand): by a select, on any architecture. */
__device__ __forceinline__ float max_nan(float a, float b) { return a > b || a != a ? a : b; }

/* grid: (ceil(nq / TQ), heads, batch); block: TQ threads; shared: 2 * TK * D floats.
 * F: the form (kernels.h); NF: the LATEST form's instance for a block with
 * non-finite inputs (block.h's nonfinite), which keeps the rules: a logit
 * of +-inf becomes NaN (x + 0 x, before the mask's select), the row
 * maxima keep a NaN, and the last block writes o = 0 and lse = -inf where
 * l = 0, NaN where l is NaN, and NaN for an infinite o. */
template <dt_attn_form F, bool NF>
__global__ void fwd_kernel(dt_attn_block_args a) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
    DT_DYNAMIC_SMEM(float, smem);
    const int64_t D = a.dim, H = a.heads, G = a.kv_heads;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G);
    const int64_t x0 = (int64_t)blockIdx.x * TQ, x = x0 + threadIdx.x;
    const int64_t nq = a.qseg.len, nk = a.kseg.len;
    const int64_t x1 = x0 + TQ < nq ? x0 + TQ : nq;
    const bool active = x < nq;
    float *ks = smem, *vs = smem + TK * D;
    const int64_t qoff = b * a.q_batch_stride + (x * H + h) * D;
    const int64_t kvb = b * a.kv_batch_stride + g * D;
    float *m = a.m + b * a.ml_batch_stride + h * a.ml_head_stride;
    float *l = a.l + b * a.ml_batch_stride + h * a.ml_head_stride;
    float *acc = a.acc + b * a.acc_batch_stride + (x * H + h) * D;
    float mi = active && !a.first ? m[x] : -INFINITY, li = active && !a.first ? l[x] : 0.0f;
    if (active && a.first)
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    const int64_t pq = active ? pos(a.qseg, x) : 0;
    float s[TK];
    for (int64_t y0 = 0; y0 < nk; y0 += TK) {
        const int64_t y1 = y0 + TK < nk ? y0 + TK : nk, tk = y1 - y0;
        const dt_attn_tile cls = dt_attn_tile_class(a.mask, a.qseg, x0, x1, a.kseg, y0, y1);
        if (cls == DT_TILE_EMPTY) continue;   /* uniform across the block */
        __syncthreads();
        for (int64_t e = threadIdx.x; e < tk * D; e += blockDim.x) {
            const int64_t j = e / D, d = e % D;
            const int64_t off = kvb + dt_attn_key_row(y0 + j, a.kv_slots, a.kv_slot_rows) * G * D + d;
            ks[e] = load(a.k, a.dtype, off);
            vs[e] = load(a.v, a.dtype, off);
        }
        __syncthreads();
        if (!active) continue;
        float mx = -INFINITY;
        for (int64_t j = 0; j < tk; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++) dot += load(a.q, a.dtype, qoff + d) * ks[j * D + d];
            dot *= a.scale;
            if constexpr (NF) dot += 0.0f * dot;
            if (cls == DT_TILE_PARTIAL && pq < pos(a.kseg, y0 + j)) dot = -INFINITY;
            s[j] = dot;
            mx = NF ? max_nan(mx, dot) : fmaxf(mx, dot);
        }
        const float m_new = NF ? max_nan(mi, mx) : fmaxf(mi, mx);
        if (m_new == -INFINITY) continue;
        const float alpha = mi == -INFINITY ? 0.0f : __expf(mi - m_new);
        float sum = 0.0f;
        for (int64_t j = 0; j < tk; j++) {
            s[j] = __expf(s[j] - m_new);
            sum += s[j];
        }
        li = li * alpha + sum;
        mi = m_new;
        for (int64_t d = 0; d < D; d++) {
            float o = acc[d] * alpha;
            for (int64_t j = 0; j < tk; j++) o += s[j] * vs[j * D + d];
            acc[d] = o;
        }
    }
    if (!active) return;
    if (a.last) {   /* the call's last block: o and lse instead of m, l, acc */
        if constexpr (NF) {
            const bool none = li == 0.0f;   /* no allowed key; NaN li: NaN o, lse */
            const float inv = 1.0f / li;
            a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x] =
                none ? -INFINITY : mi + logf(li);
            for (int64_t d = 0; d < D; d++) {
                const float o = none ? 0.0f : acc[d] * inv;
                store_val(a.o, a.dtype, qoff + d, o + 0.0f * o);
            }
        } else {
            const float inv = li > 0.0f ? 1.0f / li : 0.0f;
            a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x] =
                li > 0.0f ? mi + logf(li) : -INFINITY;
            for (int64_t d = 0; d < D; d++) store_val(a.o, a.dtype, qoff + d, acc[d] * inv);
        }
    } else {
        m[x] = mi;
        l[x] = li;
    }
}

/* The forward of a block with documents or a window (block.h's docs,
 * window): fwd_kernel's grid, shared memory and per-row state, in the
 * LATEST form only (NF as fwd_kernel's). The block's rows [x0, x1) may
 * attend key rows [lo, hi) at most (the first row's span start to the last
 * row's end: dt_attn_rule_range), run in tiles of TK from lo; a tile that
 * dt_attn_rule_tile calls empty is skipped by the whole block, and each
 * row takes the keys of its own span [klo, khi) within a tile (all of a
 * full one): keys outside it are never read, so that masked keys and
 * values reach no row, and a row with none keeps m = -inf, l = 0, acc = 0
 * (o = 0, lse = -inf). */
template <dt_attn_form F, bool NF>
__global__ void fwd_rule_kernel(dt_attn_block_args a) {
    static_assert(F == DT_ATTN_FORM_LATEST, "documents and windows run only in LATEST forms");
    DT_DYNAMIC_SMEM(float, smem);
    const int64_t D = a.dim, H = a.heads, G = a.kv_heads;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G);
    const int64_t x0 = (int64_t)blockIdx.x * TQ, x = x0 + threadIdx.x;
    const int64_t nq = a.qseg.len;
    const int64_t x1 = x0 + TQ < nq ? x0 + TQ : nq;
    const bool active = x < nq;
    const dt_attn_rule rule = dt_attn_block_rule(&a, b);
    float *ks = smem, *vs = smem + TK * D;
    const int64_t qoff = b * a.q_batch_stride + (x * H + h) * D;
    const int64_t kvb = b * a.kv_batch_stride + g * D;
    float *m = a.m + b * a.ml_batch_stride + h * a.ml_head_stride;
    float *l = a.l + b * a.ml_batch_stride + h * a.ml_head_stride;
    float *acc = a.acc + b * a.acc_batch_stride + (x * H + h) * D;
    float mi = active && !a.first ? m[x] : -INFINITY, li = active && !a.first ? l[x] : 0.0f;
    if (active && a.first)
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    /* this row's keys [klo, khi); the block's [lo, hi) (uniform across it) */
    int64_t klo = 0, khi = 0, lo, hi, flo, fhi;
    if (active) dt_attn_rule_rows(rule, 1, pos(a.qseg, x), a.kseg, &klo, &khi);
    dt_attn_rule_range(rule, 1, a.qseg, x0, x1, a.kseg, &lo, &hi, &flo, &fhi);
    float s[TK];
    for (int64_t y0 = lo; y0 < hi; y0 += TK) {
        const int64_t y1 = y0 + TK < hi ? y0 + TK : hi, tk = y1 - y0;
        const dt_attn_tile cls = dt_attn_rule_tile(rule, a.qseg, x0, x1, a.kseg, y0, y1);
        if (cls == DT_TILE_EMPTY) continue;   /* uniform across the block */
        __syncthreads();
        for (int64_t e = threadIdx.x; e < tk * D; e += blockDim.x) {
            const int64_t j = e / D, d = e % D;
            const int64_t off = kvb + dt_attn_key_row(y0 + j, a.kv_slots, a.kv_slot_rows) * G * D + d;
            ks[e] = load(a.k, a.dtype, off);
            vs[e] = load(a.v, a.dtype, off);
        }
        __syncthreads();
        if (!active) continue;
        /* the row's keys of the tile: [j0, j1) */
        int64_t j0 = 0, j1 = tk;
        if (cls == DT_TILE_PARTIAL) {
            j0 = klo - y0 < 0 ? 0 : klo - y0 < tk ? klo - y0 : tk;
            j1 = khi - y0 < j0 ? j0 : khi - y0 < tk ? khi - y0 : tk;
        }
        if (j0 == j1) continue;
        float mx = -INFINITY;
        for (int64_t j = j0; j < j1; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++) dot += load(a.q, a.dtype, qoff + d) * ks[j * D + d];
            dot *= a.scale;
            if constexpr (NF) dot += 0.0f * dot;
            s[j] = dot;
            mx = NF ? max_nan(mx, dot) : fmaxf(mx, dot);
        }
        const float m_new = NF ? max_nan(mi, mx) : fmaxf(mi, mx);
        if (m_new == -INFINITY) continue;
        const float alpha = mi == -INFINITY ? 0.0f : __expf(mi - m_new);
        float sum = 0.0f;
        for (int64_t j = j0; j < j1; j++) {
            s[j] = __expf(s[j] - m_new);
            sum += s[j];
        }
        li = li * alpha + sum;
        mi = m_new;
        for (int64_t d = 0; d < D; d++) {
            float o = acc[d] * alpha;
            for (int64_t j = j0; j < j1; j++) o += s[j] * vs[j * D + d];
            acc[d] = o;
        }
    }
    if (!active) return;
    if (a.last) {   /* the call's last block: o and lse instead of m, l, acc */
        if constexpr (NF) {
            const bool none = li == 0.0f;   /* no allowed key; NaN li: NaN o, lse */
            const float inv = 1.0f / li;
            a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x] =
                none ? -INFINITY : mi + logf(li);
            for (int64_t d = 0; d < D; d++) {
                const float o = none ? 0.0f : acc[d] * inv;
                store_val(a.o, a.dtype, qoff + d, o + 0.0f * o);
            }
        } else {
            const float inv = li > 0.0f ? 1.0f / li : 0.0f;
            a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x] =
                li > 0.0f ? mi + logf(li) : -INFINITY;
            for (int64_t d = 0; d < D; d++) store_val(a.o, a.dtype, qoff + d, acc[d] * inv);
        }
    } else {
        m[x] = mi;
        l[x] = li;
    }
}

/* delta: one warp per output row r (of batch x rows x heads), its lanes over
 * the row's dim elements, so every access of a warp is one contiguous run
 * (a thread per row made each access a 32-way scatter). */
constexpr int ROW_WARPS = 8;   /* rows per block of 256 threads */

__device__ __forceinline__ int64_t ml_index(int64_t r, int64_t rows, int64_t heads) {
    const int64_t h = r % heads, x = (r / heads) % rows, b = r / (heads * rows);
    return (b * heads + h) * rows + x;
}

__global__ void delta_kernel(dt_dtype dt, int64_t batch, int64_t rows, int64_t heads, int64_t dim,
                             const void *o, const void *dout, float *delta) {
    const int64_t n = batch * rows * heads;
    const int lane = (int)threadIdx.x & 31;
    for (int64_t r = blockIdx.x * (int64_t)ROW_WARPS + (threadIdx.x >> 5); r < n;
         r += (int64_t)gridDim.x * ROW_WARPS) {
        float sum = 0.0f;
        for (int64_t d = lane; d < dim; d += 32)
            sum += load(o, dt, r * dim + d) * load(dout, dt, r * dim + d);
        for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
        if (lane == 0) delta[ml_index(r, rows, heads)] = sum;
    }
}

__global__ void store_kernel(dt_dtype dt, size_t n, const float *src, void *dst) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        store_val(dst, dt, (int64_t)i, src[i]);
}

/* P and dS of one (query x of head h, key y) pair; returns 0 for masked
 * pairs and rows with lse = -inf. NF: a logit of +-inf becomes NaN. */
template <bool NF>
__device__ __forceinline__ void pair_grad(const dt_attn_block_bwd_args &a, int64_t b, int64_t h,
                                          int64_t g, int64_t x, int64_t y, float lse, float delta,
                                          float *p_out, float *ds_out) {
    const int64_t D = a.dim, H = a.heads, G = a.kv_heads;
    *p_out = *ds_out = 0.0f;
    if (lse == -INFINITY) return;
    if (a.mask == DT_ATTN_CAUSAL && pos(a.qseg, x) < pos(a.kseg, y)) return;
    const int64_t qo = b * a.q_batch_stride + (x * H + h) * D;
    const int64_t ko = b * a.kv_batch_stride + (y * G + g) * D;
    float dot = 0.0f, dp = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        dot += load(a.q, a.dtype, qo + d) * load(a.k, a.dtype, ko + d);
        dp += load(a.dout, a.dtype, qo + d) * load(a.v, a.dtype, ko + d);
    }
    float p;
    if constexpr (NF) {
        float x = a.scale * dot;
        x += 0.0f * x;
        p = __expf(x - lse);
    } else {
        p = __expf(a.scale * dot - lse);
    }
    *p_out = p;
    *ds_out = p * (dp - delta);
}

/* grid: (ceil(nq / 128), heads, batch): each thread owns dQ of one query row.
 * F, NF: as fwd_kernel's (pair_grad keeps the rules). */
template <dt_attn_form F, bool NF>
__global__ void bwd_dq_kernel(dt_attn_block_bwd_args a) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (a.heads / a.kv_heads);
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= a.qseg.len) return;
    const int64_t D = a.dim, G = a.kv_heads;
    const float lse = a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x];
    const float delta = a.delta[b * a.ml_batch_stride + h * a.ml_head_stride + x];
    float *dq = a.dq + b * a.dq_batch_stride + (x * a.heads + h) * D;
    for (int64_t y = 0; y < a.kseg.len; y++) {
        /* Skip keys after the query's position (causal) without touching memory. */
        if (a.mask == DT_ATTN_CAUSAL && pos(a.qseg, x) < pos(a.kseg, y)) continue;
        float p, ds;
        pair_grad<NF>(a, b, h, g, x, y, lse, delta, &p, &ds);
        if (ds == 0.0f) continue;
        const int64_t ko = b * a.kv_batch_stride + (y * G + g) * D;
        for (int64_t d = 0; d < D; d++) dq[d] += a.scale * ds * load(a.k, a.dtype, ko + d);
    }
}

/* grid: (ceil(nk / 128), kv_heads, batch): each thread owns dK, dV of one key row.
 * F, NF: as fwd_kernel's (pair_grad keeps the rules). */
template <dt_attn_form F, bool NF>
__global__ void bwd_dkv_kernel(dt_attn_block_bwd_args a) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
    const int64_t b = blockIdx.z, g = blockIdx.y, group = a.heads / a.kv_heads;
    const int64_t y = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (y >= a.kseg.len) return;
    const int64_t D = a.dim, H = a.heads;
    float *dk = a.dk + b * a.kv_batch_stride + (y * a.kv_heads + g) * D;
    float *dv = a.dv + b * a.kv_batch_stride + (y * a.kv_heads + g) * D;
    if (a.first)   /* written, not added into: this thread owns the row */
        for (int64_t d = 0; d < D; d++) dk[d] = dv[d] = 0.0f;
    for (int64_t h = g * group; h < (g + 1) * group; h++)
        for (int64_t x = 0; x < a.qseg.len; x++) {
            if (a.mask == DT_ATTN_CAUSAL && pos(a.qseg, x) < pos(a.kseg, y)) continue;
            const int64_t r = b * a.ml_batch_stride + h * a.ml_head_stride + x;
            float p, ds;
            pair_grad<NF>(a, b, h, g, x, y, a.lse[r], a.delta[r], &p, &ds);
            const int64_t qo = b * a.q_batch_stride + (x * H + h) * D;
            for (int64_t d = 0; d < D; d++) {
                dv[d] += p * load(a.dout, a.dtype, qo + d);
                dk[d] += a.scale * ds * load(a.q, a.dtype, qo + d);
            }
        }
}

/* bwd_dq_kernel with documents or a window (LATEST only; NF as its): the
 * thread's query row runs the keys of its span alone (dt_attn_rule_rows). */
template <dt_attn_form F, bool NF>
__global__ void bwd_dq_rule_kernel(dt_attn_block_bwd_args a) {
    static_assert(F == DT_ATTN_FORM_LATEST, "documents and windows run only in LATEST forms");
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (a.heads / a.kv_heads);
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= a.qseg.len) return;
    const int64_t D = a.dim, G = a.kv_heads;
    const float lse = a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x];
    if (lse == -INFINITY) return;   /* the row attends nothing: P = 0 */
    const float delta = a.delta[b * a.ml_batch_stride + h * a.ml_head_stride + x];
    float *dq = a.dq + b * a.dq_batch_stride + (x * a.heads + h) * D;
    int64_t lo, hi;
    dt_attn_rule_rows(dt_attn_block_bwd_rule(&a, b), 1, pos(a.qseg, x), a.kseg, &lo, &hi);
    for (int64_t y = lo; y < hi; y++) {
        float p, ds;
        pair_grad<NF>(a, b, h, g, x, y, lse, delta, &p, &ds);
        if (ds == 0.0f) continue;
        const int64_t ko = b * a.kv_batch_stride + (y * G + g) * D;
        for (int64_t d = 0; d < D; d++) dq[d] += a.scale * ds * load(a.k, a.dtype, ko + d);
    }
}

/* bwd_dkv_kernel with documents or a window (LATEST only; NF as its): the
 * thread's key row runs the queries that may attend it alone
 * (dt_attn_rule_rows with keys = 0), of every head of its group. */
template <dt_attn_form F, bool NF>
__global__ void bwd_dkv_rule_kernel(dt_attn_block_bwd_args a) {
    static_assert(F == DT_ATTN_FORM_LATEST, "documents and windows run only in LATEST forms");
    const int64_t b = blockIdx.z, g = blockIdx.y, group = a.heads / a.kv_heads;
    const int64_t y = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (y >= a.kseg.len) return;
    const int64_t D = a.dim, H = a.heads;
    float *dk = a.dk + b * a.kv_batch_stride + (y * a.kv_heads + g) * D;
    float *dv = a.dv + b * a.kv_batch_stride + (y * a.kv_heads + g) * D;
    if (a.first)   /* written, not added into: this thread owns the row */
        for (int64_t d = 0; d < D; d++) dk[d] = dv[d] = 0.0f;
    int64_t lo, hi;
    dt_attn_rule_rows(dt_attn_block_bwd_rule(&a, b), 0, pos(a.kseg, y), a.qseg, &lo, &hi);
    for (int64_t h = g * group; h < (g + 1) * group; h++)
        for (int64_t x = lo; x < hi; x++) {
            const int64_t r = b * a.ml_batch_stride + h * a.ml_head_stride + x;
            float p, ds;
            pair_grad<NF>(a, b, h, g, x, y, a.lse[r], a.delta[r], &p, &ds);
            const int64_t qo = b * a.q_batch_stride + (x * H + h) * D;
            for (int64_t d = 0; d < D; d++) {
                dv[d] += p * load(a.dout, a.dtype, qo + d);
                dk[d] += a.scale * ds * load(a.q, a.dtype, qo + d);
            }
        }
}

dt_status launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return DT_SUCCESS;
    return dt_error(DT_ERR_BACKEND, "attention (cuda): %s: %s", what, cudaGetErrorString(e));
}

cudaStream_t stream_of(dt_backend *be) {
    return static_cast<cudaStream_t>(dt_backend_cuda_compute_stream(be));
}

unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 ? (b ? b : 1) : 65535);
}

/* The forward's scratch: the persistent wgmma kernel's tile queue, then
 * the rows' counts of dependent launch mode 2 (block.h's visits), one
 * per 16 query rows of each query sequence. */
int64_t rows_counts(int64_t seqs, int64_t len) { return seqs * ((len + 15) / 16); }
size_t fwd_scratch(int64_t dim, int64_t seqs, int64_t len) {
    (void)dim;
    return DT_ATTN_WGMMA_QUEUE_BYTES + (size_t)rows_counts(seqs, len) * sizeof(uint32_t);
}
size_t bwd_scratch(int64_t dim) { (void)dim; return 0; }

/* The kernel paths that have passed the CUDA suites (test_attention's
 * "forward/cuda-kernels/..." and test_attention_backward's
 * "backward/cuda-kernels/..." among them) and compute-sanitizer on a GPU:
 * the only paths auto takes, per compute capability, the first entry that
 * can run the block (the fastest first); the simple kernel where none can
 * (an architecture with no entry: the tensor-core kernels have never run on
 * compute capability 8.x). A form not listed for an architecture runs
 * there only when forced (DT_ATTN_KERNEL=mma, wgmma, simple-latest,
 * mma-latest or wgmma-latest). docs/PERFORMANCE.md ("Which kernel paths
 * are verified on which GPU") has the runs.
 * When a GPU run passes a kernel's LATEST form, making it the default there
 * is a one-line change: that entry's form, in the commit that records the
 * run (and its `run`). */
struct verified_path {
    int cc;                     /* compute capability, major * 10 + minor */
    dt_attn_cuda_kernel kernel;
    dt_attn_form form;
    unsigned passes;            /* PASS_FWD | PASS_BWD: the passes that ran there */
    const char *run;            /* the GPU run that passed it: device, date, revision */
};
constexpr unsigned PASS_FWD = 1, PASS_BWD = 2;
constexpr verified_path verified_paths[] = {
    {90, DT_ATTN_CUDA_WGMMA, DT_ATTN_FORM_VERIFIED, PASS_FWD | PASS_BWD, "H200, 2026-11-29, 38a59b5"},
    {90, DT_ATTN_CUDA_MMA, DT_ATTN_FORM_VERIFIED, PASS_FWD | PASS_BWD, "H200, 2026-11-29, 38a59b5"},
};

/* Whether tensor-core kernel k handles dtype and dim on a device of
 * compute capability cc (the forward's interleaved keys, kv_slots > 1, the
 * wgmma kernel only where the driver takes their tensor maps); otherwise 0
 * and why. */
int kernel_runs(dt_attn_cuda_kernel k, int cc, dt_dtype dtype, int64_t dim, int64_t kv_slots,
                char *why, size_t why_size) {
    if (k == DT_ATTN_CUDA_MMA) return dt_attn_mma_supported(dtype, dim, cc, why, why_size);
    if (k != DT_ATTN_CUDA_WGMMA || !dt_attn_wgmma_supported(dtype, dim, cc, why, why_size)) return 0;
    return kv_slots <= 1 || dt_attn_wgmma_slots_ok(why, why_size);
}

/* Documents and windows: the kernels' LATEST forms alone take them (the
 * rule kernels above, mma_*.cu's and wgmma_*.cu's), and only when asked
 * for by name, since no GPU has run them yet. 1 and *path if choice k runs
 * a ruled block of this dtype, head dim and alignment (aligned: the
 * tensor-core kernels' block check; kv_slots: the forward's), else 0 and
 * why. A block without keys or queries takes the simple rule kernels. */
int ruled_path(int cc, dt_attn_kernel_choice k, dt_dtype dtype, int64_t dim, int aligned,
               int backward, int64_t kv_slots, bool simple_only, dt_attn_cuda_path *path,
               char *why, size_t why_size) {
    if (k == DT_ATTN_KERNEL_SIMPLE_LATEST ||
        (simple_only && (k == DT_ATTN_KERNEL_MMA_LATEST || k == DT_ATTN_KERNEL_WGMMA_LATEST))) {
        *path = dt_attn_cuda_path{DT_ATTN_CUDA_SIMPLE, DT_ATTN_FORM_LATEST};
        return 1;
    }
    if (k == DT_ATTN_KERNEL_MMA_LATEST || k == DT_ATTN_KERNEL_WGMMA_LATEST)
        return dt_attn_cuda_path_of(k, cc, dtype, dim, aligned, backward, kv_slots, path, why,
                                    why_size);
    if (why && why_size)
        snprintf(why, why_size, "documents and windows run only in the kernels' LATEST forms, "
                 "which no GPU has passed yet: set DT_ATTN_KERNEL=simple-latest, mma-latest or "
                 "wgmma-latest (or dt_attention_tuning.kernel)");
    return 0;
}

/* A block with documents or a window (mask.h's rule beyond the mask). */
bool block_ruled(const dt_attn_block_args *a) { return a->docs != nullptr || a->window > 0; }
bool block_ruled(const dt_attn_block_bwd_args *a) { return a->docs != nullptr || a->window > 0; }

/* 1 if no pair of the segments may attend under the mask and the window
 * (exactly the mask's dt_attn_no_pairs without a window). The documents
 * only remove pairs, so a block this calls empty is empty under the whole
 * rule; one it does not may still be (forward.c and backward.c skip those
 * from the host's table of the documents). */
bool no_pairs(dt_attn_mask mask, int64_t window, dt_attn_segment q, dt_attn_segment k) {
    if (dt_attn_no_pairs(mask, q, k)) return true;
    return window > 0 && !dt_attn_has_pairs(dt_attn_rule{mask, window, nullptr}, q, k);
}

/* Plan time (once per call): can the requested kernel run this dtype and
 * head dim on this device, with documents or a window when ruled? Only a
 * forced tensor-core kernel can fail without them (the same answer for
 * the forward and the backward); with them, every choice but
 * simple-latest (ruled_path). */
dt_status kernel_check(dt_backend *be, dt_dtype dtype, int64_t dim, dt_attn_kernel_choice want,
                       int ruled, char *why, size_t why_size) {
    const int cc = dt_backend_cuda_compute_capability(be);
    dt_attn_cuda_path path;
    if (ruled)   /* both passes */
        return ruled_path(cc, want, dtype, dim, 1, 0, 0, false, &path, why, why_size) &&
                       ruled_path(cc, want, dtype, dim, 1, 1, 0, false, &path, why, why_size)
                   ? DT_SUCCESS
                   : DT_ERR_NOT_SUPPORTED;
    return dt_attn_cuda_path_of(want, cc, dtype, dim, 1, 0, 0, &path, why, why_size)
               ? DT_SUCCESS
               : DT_ERR_NOT_SUPPORTED;
}

/* dt_attn_cuda_path_of on this backend's device. */
int path_of(dt_backend *be, dt_attn_kernel_choice k, dt_dtype dtype, int64_t dim, int aligned,
            int backward, int64_t kv_slots, dt_attn_cuda_path *path, char *why, size_t why_size) {
    return dt_attn_cuda_path_of(k, dt_backend_cuda_compute_capability(be), dtype, dim, aligned,
                                backward, kv_slots, path, why, why_size);
}

/* How the tensor-core kernels' blocks that continue a call are launched
 * (dt_attention_tuning.dependent_launch): 0 after the block before has
 * completed, 1 as its programmatic dependents, 2 the same with the
 * forward's rows' waits; dependent launches need compute capability 9.0. */
int dependent_launches(dt_backend *be, const dt_attention_tuning &t) {
    return dt_backend_cuda_compute_capability(be) >= 90 ? t.dependent_launch : 0;
}

/* The form a choice forces: LATEST for the _LATEST choices, else VERIFIED
 * (auto's own come from the table). */
dt_attn_form form_of(dt_attn_kernel_choice k) {
    return k == DT_ATTN_KERNEL_MMA_LATEST || k == DT_ATTN_KERNEL_WGMMA_LATEST ||
                   k == DT_ATTN_KERNEL_SIMPLE_LATEST
               ? DT_ATTN_FORM_LATEST
               : DT_ATTN_FORM_VERIFIED;
}

/* The forward's: path_of, but a block with no key (its rows only started
 * or finished) takes the simple kernel, in the form of the choice: a
 * tensor map of 0 rows cannot even be made. A ruled block: ruled_path. */
int fwd_path_of(dt_backend *be, const dt_attn_block_args *a, dt_attn_cuda_path *path, char *why,
                size_t why_size) {
    if (block_ruled(a))
        return ruled_path(dt_backend_cuda_compute_capability(be), a->tuning.kernel, a->dtype,
                          a->dim, dt_attn_mma_block_ok(a, why, why_size), 0, a->kv_slots,
                          a->kseg.len == 0, path, why, why_size);
    *path = dt_attn_cuda_path{DT_ATTN_CUDA_SIMPLE, form_of(a->tuning.kernel)};
    if (a->tuning.kernel == DT_ATTN_KERNEL_SIMPLE || a->kseg.len == 0) return 1;
    return path_of(be, a->tuning.kernel, a->dtype, a->dim, dt_attn_mma_block_ok(a, why, why_size),
                   0, a->kv_slots, path, why, why_size);
}

/* Nothing to do: no row, or no pair the mask allows (no key, or every key
 * after every query: a contiguous ring's blocks from ranks after this one)
 * and nothing to start or finish (28 of the 64 blocks at P = 8: forward.c
 * finishes a rank's rows at its last block with a pair). Then nothing is
 * launched; the stream order and the next block's dependence on the one
 * before are the same without the launch, which would write nothing. */
bool fwd_idle(const dt_attn_block_args *a) {
    if (a->qseg.len == 0 || a->batch == 0 || a->heads == 0) return true;
    return !a->first && !a->last && no_pairs(a->mask, a->window, a->qseg, a->kseg);
}

/* Dependent launch mode 2 (the rows' waits): the counts in scratch,
 * zeroed on the stream before the call's first block, and the call's
 * count of counted blocks so far restarted there (block.h's launches). */
dt_status rows_start(dt_backend *be, const dt_attn_block_args *a, void *scratch) {
    *a->launches = 0;
    const size_t bytes = (size_t)rows_counts(a->batch * a->heads, a->qseg.len) * sizeof(uint32_t);
    if (cudaMemsetAsync(static_cast<char *>(scratch) + DT_ATTN_WGMMA_QUEUE_BYTES, 0, bytes,
                        stream_of(be)) == cudaSuccess)
        return DT_SUCCESS;
    return launched("forward block: clearing the rows' counts");
}

dt_status fwd(dt_backend *be, const dt_attn_block_args *a, void *scratch) {
    if (fwd_idle(a)) return DT_SUCCESS;
    dt_attn_cuda_path path;
    char why[256] = "";
    if (!fwd_path_of(be, a, &path, why, sizeof why))
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: attention (cuda): DT_ATTN_KERNEL=%s: %s",
                        be->rank, dt_attn_kernel_choice_name(a->tuning.kernel), why);
    const int dependent = dependent_launches(be, a->tuning);
    const bool counted = dependent == 2 && a->launches;
    if (counted && a->first) DT_TRY(rows_start(be, a, scratch));
    dt_attn_block_args b = *a;
    if (counted && path.kernel != DT_ATTN_CUDA_SIMPLE) {   /* the simple kernel's blocks do not count */
        b.visits = reinterpret_cast<uint32_t *>(static_cast<char *>(scratch) +
                                                DT_ATTN_WGMMA_QUEUE_BYTES);
        b.visit = (*a->launches)++;
    }
    if (path.kernel == DT_ATTN_CUDA_WGMMA) {
        const int persistent = a->tuning.persistent;
        if (persistent == 2) b.transfer = 0;   /* persistent even beside a transfer */
        return dt_attn_wgmma_fwd(stream_of(be), &b, dt_backend_cuda_l2_bytes(be),
                                 persistent ? dt_backend_cuda_sms(be) : 0, scratch, dependent,
                                 a->tuning.producer, path.form);
    }
    if (path.kernel == DT_ATTN_CUDA_MMA)
        return dt_attn_mma_fwd(stream_of(be), &b, dt_backend_cuda_l2_bytes(be), dependent,
                               path.form);
    if (!a->acc || !a->m || !a->l)   /* fwd_stateless promised a tensor-core kernel */
        return dt_error(DT_ERR_INTERNAL, "rank %d: attention (cuda): a block without running "
                        "state reached the simple forward kernel", be->rank);
    dim3 grid((unsigned)((a->qseg.len + TQ - 1) / TQ), (unsigned)a->heads, (unsigned)a->batch);
    size_t smem = 2 * TK * (size_t)a->dim * sizeof(float);   /* up to 128 KiB at D = 256 */
    const bool latest = path.form == DT_ATTN_FORM_LATEST, ruled = block_ruled(a);
    if (ruled && !latest)   /* fwd_path_of sends them to the LATEST form */
        return dt_error(DT_ERR_INTERNAL, "rank %d: attention (cuda): a block with documents or "
                        "a window reached a VERIFIED kernel", be->rank);
    void (*const kernel)(dt_attn_block_args) =
        ruled ? (a->nonfinite ? fwd_rule_kernel<DT_ATTN_FORM_LATEST, true>
                              : fwd_rule_kernel<DT_ATTN_FORM_LATEST, false>)
        : !latest ? fwd_kernel<DT_ATTN_FORM_VERIFIED, false>
        : a->nonfinite ? fwd_kernel<DT_ATTN_FORM_LATEST, true>
                       : fwd_kernel<DT_ATTN_FORM_LATEST, false>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess)
        return launched("forward block: shared memory size");
    dt_cuda_launch(kernel, grid, TQ, smem, stream_of(be), *a);
    return launched("forward block");
}

/* The tensor-core kernels start and finish a block's rows in registers
 * (mma_fwd.cu, wgmma_fwd.cu); the simple one works in acc. */
int fwd_stateless(dt_backend *be, const dt_attn_block_args *a) {
    if (!a->first || !a->last) return 0;
    if (fwd_idle(a)) return 1;
    dt_attn_cuda_path path;
    char why[256];
    return fwd_path_of(be, a, &path, why, sizeof why) && path.kernel != DT_ATTN_CUDA_SIMPLE;
}

dt_status delta_rows(dt_backend *be, dt_dtype dtype, int64_t batch, int64_t rows, int64_t heads,
                     int64_t dim, const void *o, const void *dout, float *delta) {
    size_t n = (size_t)(batch * rows * heads);
    dt_cuda_launch(delta_kernel, blocks_for(n, ROW_WARPS), 32 * ROW_WARPS, 0, stream_of(be),
                   dtype, batch, rows, heads, dim, o, dout, delta);
    return launched("delta");
}

dt_status bwd(dt_backend *be, const dt_attn_block_bwd_args *a, void *scratch) {
    (void)scratch;
    if (a->kseg.len == 0 || a->batch == 0 || a->heads == 0) return DT_SUCCESS;   /* no rows */
    /* no pair: dq, dk, dv unchanged (nothing launched), or (first) dk, dv 0 */
    if (!a->first && no_pairs(a->mask, a->window, a->qseg, a->kseg)) return DT_SUCCESS;
    const bool no_query = a->qseg.len == 0, ruled = block_ruled(a);
    dt_attn_cuda_path path = {DT_ATTN_CUDA_SIMPLE, form_of(a->tuning.kernel)};
    if (ruled || !no_query) {   /* a ruled block: a LATEST form (ruled_path), or refused */
        char why[256] = "";
        const int aligned = no_query || dt_attn_mma_bwd_block_ok(a, why, sizeof why);
        const int ok = ruled ? ruled_path(dt_backend_cuda_compute_capability(be), a->tuning.kernel,
                                          a->dtype, a->dim, aligned, 1, 0, no_query, &path, why,
                                          sizeof why)
                             : path_of(be, a->tuning.kernel, a->dtype, a->dim, aligned, 1, 0, &path,
                                       why, sizeof why);
        if (!ok)
            return dt_error(DT_ERR_NOT_SUPPORTED,
                            "rank %d: attention (cuda): backward: DT_ATTN_KERNEL=%s: %s", be->rank,
                            dt_attn_kernel_choice_name(a->tuning.kernel), why);
        const int dependent = dependent_launches(be, a->tuning);
        if (path.kernel == DT_ATTN_CUDA_WGMMA)
            return dt_attn_wgmma_bwd(stream_of(be), a, dt_backend_cuda_l2_bytes(be), dependent,
                                     path.form);
        if (path.kernel == DT_ATTN_CUDA_MMA)
            return dt_attn_mma_bwd(stream_of(be), a, dt_backend_cuda_l2_bytes(be), dependent,
                                   path.form);
    }
    /* the simple kernels, in the path's form; with non-finite inputs the
     * LATEST form's instances that keep the rules */
    const bool latest = path.form == DT_ATTN_FORM_LATEST;
    void (*const dq_kernel)(dt_attn_block_bwd_args) =
        ruled ? (a->nonfinite ? bwd_dq_rule_kernel<DT_ATTN_FORM_LATEST, true>
                              : bwd_dq_rule_kernel<DT_ATTN_FORM_LATEST, false>)
        : !latest ? bwd_dq_kernel<DT_ATTN_FORM_VERIFIED, false>
        : a->nonfinite ? bwd_dq_kernel<DT_ATTN_FORM_LATEST, true>
                       : bwd_dq_kernel<DT_ATTN_FORM_LATEST, false>;
    void (*const dkv_kernel)(dt_attn_block_bwd_args) =
        ruled ? (a->nonfinite ? bwd_dkv_rule_kernel<DT_ATTN_FORM_LATEST, true>
                              : bwd_dkv_rule_kernel<DT_ATTN_FORM_LATEST, false>)
        : !latest ? bwd_dkv_kernel<DT_ATTN_FORM_VERIFIED, false>
        : a->nonfinite ? bwd_dkv_kernel<DT_ATTN_FORM_LATEST, true>
                       : bwd_dkv_kernel<DT_ATTN_FORM_LATEST, false>;
    if (!no_query) {
        dim3 gq((unsigned)((a->qseg.len + 127) / 128), (unsigned)a->heads, (unsigned)a->batch);
        dt_cuda_launch(dq_kernel, gq, 128, 0, stream_of(be), *a);
        DT_TRY(launched("backward dq"));
    }
    dim3 gk((unsigned)((a->kseg.len + 127) / 128), (unsigned)a->kv_heads, (unsigned)a->batch);
    dt_cuda_launch(dkv_kernel, gk, 128, 0, stream_of(be), *a);
    return launched("backward dk dv");
}

dt_status store(dt_backend *be, dt_dtype dtype, size_t n, const float *src, void *dst) {
    dt_cuda_launch(store_kernel, blocks_for(n, 256), 256, 0, stream_of(be), dtype, n, src, dst);
    return launched("store");
}

}  // namespace

extern "C" int dt_attn_cuda_path_of(dt_attn_kernel_choice k, int cc, dt_dtype dtype, int64_t dim,
                                    int aligned, int backward, int64_t kv_slots,
                                    dt_attn_cuda_path *path, char *why, size_t why_size) {
    *path = dt_attn_cuda_path{DT_ATTN_CUDA_SIMPLE, DT_ATTN_FORM_VERIFIED};
    dt_attn_cuda_kernel forced = DT_ATTN_CUDA_SIMPLE;
    dt_attn_form form = DT_ATTN_FORM_VERIFIED;
    switch (k) {
    case DT_ATTN_KERNEL_AUTO: {
        const unsigned pass = backward ? PASS_BWD : PASS_FWD;
        for (const verified_path &e : verified_paths)
            if (e.cc == cc && (e.passes & pass) &&
                kernel_runs(e.kernel, cc, dtype, dim, kv_slots, nullptr, 0) && aligned) {
                *path = dt_attn_cuda_path{e.kernel, e.form};
                break;
            }
        return 1;
    }
    case DT_ATTN_KERNEL_SIMPLE: return 1;
    case DT_ATTN_KERNEL_SIMPLE_LATEST:
        *path = dt_attn_cuda_path{DT_ATTN_CUDA_SIMPLE, DT_ATTN_FORM_LATEST};
        return 1;
    case DT_ATTN_KERNEL_MMA: forced = DT_ATTN_CUDA_MMA; break;
    case DT_ATTN_KERNEL_WGMMA: forced = DT_ATTN_CUDA_WGMMA; break;
    case DT_ATTN_KERNEL_MMA_LATEST: forced = DT_ATTN_CUDA_MMA, form = DT_ATTN_FORM_LATEST; break;
    case DT_ATTN_KERNEL_WGMMA_LATEST: forced = DT_ATTN_CUDA_WGMMA, form = DT_ATTN_FORM_LATEST; break;
    default:
        if (why && why_size) snprintf(why, why_size, "unknown kernel choice %d", (int)k);
        return 0;
    }
    /* a forced kernel: its reason if it cannot run, else the block's (in
     * why already) if it is not aligned */
    if (!kernel_runs(forced, cc, dtype, dim, kv_slots, why, why_size) || !aligned) return 0;
    *path = dt_attn_cuda_path{forced, form};
    return 1;
}

/* Plan time (once per call): 1 if the paths `want` takes for this dtype and
 * head dim on this device, forward and backward, are LATEST forms, which
 * keep block.h's non-finite rules (with dt_attn_block_args.nonfinite);
 * VERIFIED forms may lose a NaN or Inf: 0, and a call with a non-finite
 * input writes NaN to all of its outputs (plan.h). auto takes VERIFIED
 * forms only. A forced choice never falls back to another form: a block it
 * cannot run fails, and a forward block with no key takes the simple
 * kernel in the choice's form (fwd_path_of). */
static int exact_nonfinite(dt_backend *be, dt_dtype dtype, int64_t dim,
                           dt_attn_kernel_choice want) {
    const int cc = dt_backend_cuda_compute_capability(be);
    for (int backward = 0; backward < 2; backward++) {
        dt_attn_cuda_path path;
        if (!dt_attn_cuda_path_of(want, cc, dtype, dim, 1, backward, 0, &path, nullptr, 0) ||
            path.form != DT_ATTN_FORM_LATEST)
            return 0;
    }
    return 1;
}

extern "C" const dt_attn_kernels dt_attn_kernels_cuda = {
    "cuda", fwd_scratch, bwd_scratch, kernel_check, exact_nonfinite, fwd, fwd_stateless,
    delta_rows, bwd, store,
};
