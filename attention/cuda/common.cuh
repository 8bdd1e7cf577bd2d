/* attention/cuda/common.cuh — PRIVATE. What the tensor-core attention
 * kernels share (mma_fwd.cu, mma_bwd.cu, wgmma_fwd.cu, wgmma_bwd.cu): the
 * per-element-type packing, the online softmax of the forward kernels, P as
 * an A fragment, the backward kernels' CTA plan and dQ / dK / dV additions,
 * the swizzled tile copy, a CTA's trace record, and on the host the launch
 * grids and the dtype / head-dim dispatch. CUDA C++ only; the instructions
 * come from ptx.cuh. Every index comes from mma_layout.h (tested on the CPU
 * by tests/test_attention.c).
 *
 * Device code for compute capability < 8.0 keeps only trapping stubs of the
 * kernels (DT_MMA_STUB, ptx.cuh); the host never launches them there
 * (dt_attn_mma_supported).
 */
#ifndef DT_ATTN_CUDA_COMMON_CUH
#define DT_ATTN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "../../base/dtype.h"
#include "../../base/status.h"
#include "../block.h"
#include "kernels.h"
#include "mma_layout.h"
#include "ptx.cuh"

namespace {

/* Documents and windows (below): a CTA's rows' ranges and their runs of
 * tiles, in shared memory past the kernel's tiles (the host sizes it):
 * lo[i], hi[i] the range of the tile's row i (empty past the segment);
 * runs k < n of tile indices [s[k], e[k]). */
template <int ROWS>
struct rule_runs {
    int32_t lo[ROWS], hi[ROWS];
    int32_t s[ROWS], e[ROWS];
    int32_t n;
};

}  // namespace

#ifndef DT_MMA_STUB
namespace {


/* The CTA's record of a traced launch (dt_attn_block_args.trace, block.h;
 * bench only): thread 0 stamps record `index` (blockIdx.x where < 0; the
 * persistent wgmma forward gives its tile's) with its start (end = 0) or,
 * once every thread of the CTA is there, its end and work (end = 1: every
 * thread calls it, at the kernel's last line or its early return, both
 * uniform over the CTA). With `by` >= 0 thread `by` stamps the end where
 * it is, with no barrier (the wgmma forward's overlapped order, whose
 * warpgroups do not meet). Args: the forward's or the backward's block
 * args. Untraced, one test of a kernel parameter. */
template <typename Args>
__device__ __forceinline__ void cta_trace(const Args &a, int end, int64_t work = 0,
                                          int64_t index = -1, int by = -1) {
    if (!a.trace) return;
    if (end && by < 0) __syncthreads();   /* the CTA's end, not thread 0's */
    if (index < 0) index = blockIdx.x;
    if ((int)threadIdx.x != (end && by >= 0 ? by : 0) || index >= a.trace_len) return;
    dt_attn_cta_trace *r = a.trace + index;
    r->ns[end] = global_ns();
    r->clock[end] = sm_clock();
    if (end)
        r->work = (uint32_t)work;
    else
        r->sm = sm_id();
}

/* A forward kernel's marks in its record (dt_attn_cta_trace.mark): the
 * calling thread (one of the CTA's) stamps mark k (0: the first key tile
 * has landed; 1: every thread is done with the last) of record `index`, as
 * cta_trace, once it has seen that happen. */
template <typename Args>
__device__ __forceinline__ void cta_mark(const Args &a, int k, int64_t index = -1) {
    if (!a.trace) return;
    if (index < 0) index = blockIdx.x;
    if (index < a.trace_len) a.trace[index].mark[k] = (uint32_t)sm_clock();
}

/* Per element type: the mma.sync variant and the fp32 pair -> .b32 packing
 * (lo in the low half: the lower-indexed element of a fragment pair). */
template <typename T>
struct elem;

template <>
struct elem<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        return u;
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        mma_bf16(d, a, b0, b1);
    }
};

template <>
struct elem<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        const __half2 v = __floats2half2_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        return u;
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        mma_f16(d, a, b0, b1);
    }
};

constexpr float LOG2E = 1.4426950408889634f;

/* 2^x as a kernel's form F computes it (kernels.h's dt_attn_form): exp2f
 * (VERIFIED) or exp2_ftz (LATEST: exp2f's instruction alone, results below
 * 2^-126 flushed to 0, ptx.cuh). */
template <dt_attn_form F>
__device__ __forceinline__ float exp2_of(float x) {
    if constexpr (F == DT_ATTN_FORM_LATEST) return exp2_ftz(x);
    else return exp2f(x);
}

/* A launch's index math, made on the host (dt_mma_fwd_grid,
 * dt_mma_bwd_grid) so that the kernels divide by multiplication
 * (mma_layout.h: dt_udiv): the launch order of its blocks (or query tiles,
 * for a persistent kernel), the heads of a batch (the forward's query
 * heads, the backward's kv heads: a unit is b * heads + h), the GQA group
 * (query heads per kv head) and the key limits of its key segment. Every
 * kernel's launch passes the block checks (dt_attn_mma_block_ok,
 * dt_attn_mma_bwd_block_ok: at most 2^31 - 1 tiles of 64 rows x units),
 * so its blocks and units fit the 32 bits of the order. */
struct dt_mma_grid {
    dt_mma_order order;
    dt_udiv heads, group;
    dt_mma_keys keys;
};

/* A forward CTA's query tile (both forward kernels: a CTA per query tile
 * of bm rows of a (batch, query head), launched in mma_layout.h's order,
 * the last query tile, the most keys, first): batch b, query head h, its kv
 * head g, rows x0 .. x1 - 1 of the query segment. */
struct fwd_cta {
    int64_t b, h, g, x0, x1;
};

__device__ __forceinline__ fwd_cta fwd_cta_of(const dt_attn_block_args &a, const dt_mma_grid &grid,
                                              uint32_t cta, int bm) {
    uint32_t rank, unit;   /* rank 0: the last query tile */
    dt_mma_order_at(&grid.order, cta, &rank, &unit);
    fwd_cta c;
    c.b = dt_udiv_q(unit, grid.heads);
    c.h = dt_udiv_r(unit, grid.heads);
    c.g = dt_udiv_q((uint32_t)c.h, grid.group);
    c.x0 = (int64_t)(grid.order.ranks - 1 - rank) * bm;
    c.x1 = c.x0 + bm < a.qseg.len ? c.x0 + bm : a.qseg.len;
    return c;
}

/* x, which the compiler cannot know to be x: a value made from it is made
 * again instead of being held. The forward kernels make their fwd_cta
 * again from their tile's index before writing the rows back, instead of
 * holding it, the rows and the pointers made from it in registers through
 * the main loop: the wgmma kernel has 128 registers at D = 64 (two CTAs
 * per SM), and held there they spilled. */
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
#ifndef DT_CUDA_EMULATE
    asm volatile("mov.u32 %0, %0;\n" : "+r"(x));
#endif
    return x;
}

/* blockIdx.x, read so that the compiler cannot reuse an earlier read. */
__device__ __forceinline__ uint32_t cta_index() { return opaque(blockIdx.x); }

/* The running state of the lane's two query rows in a forward kernel
 * (half 0: row g, half 1: row g + 8 of the warp's 16, which start at query
 * row `row0` of the block; c: the CTA's batch and head): started empty
 * (m = -inf, l = 0, o = 0) for the block's keys, then merged with the
 * state earlier blocks left in acc, m, l and written back (fused
 * accumulation; a.first: the call's first block, nothing to merge). The
 * merge comes at the end, not a read at the start, so that nothing before
 * it reads what an earlier block wrote: the wgmma forward, launched as a
 * programmatic dependent of the block before (wgmma_fwd.cu), runs
 * its keys while that block still finishes. o[j][i] is accumulator element
 * i of n-tile j (head-dim columns 8j .. 8j+7): row dt_mma_c_row(lane, i),
 * column 8j + dt_mma_c_col(lane, i); elements 2 half and 2 half + 1 are
 * adjacent columns of one row, one float2. Rows past the segment are not
 * live: no key allowed (lim = 0), never written. Row x of the (batch,
 * head): acc at acc_of(a, c) + x H D, m and l at a.m + ml_of(a, c) + x and
 * a.l + ml_of(a, c) + x. */
template <int D>
__device__ __forceinline__ float *acc_of(const dt_attn_block_args &a, const fwd_cta &c) {
    return a.acc + c.b * a.acc_batch_stride + c.h * D;
}
__device__ __forceinline__ int64_t ml_of(const dt_attn_block_args &a, const fwd_cta &c) {
    return c.b * a.ml_batch_stride + c.h * a.ml_head_stride;
}

/* The rows' waits (dependent launch mode 2: block.h's visits). A warp's 16
 * query rows, from row0 (a multiple of 16) of c's batch and head, have a
 * count of the call's blocks done with them; NULL without visits, or for
 * rows past the segment (a warp of the last query tile). */
__device__ __forceinline__ uint32_t *rows_count(const dt_attn_block_args &a, const fwd_cta &c,
                                                int64_t row0) {
    if (!a.visits || row0 >= a.qseg.len) return nullptr;
    return a.visits + (c.b * a.heads + c.h) * ((a.qseg.len + 15) / 16) + row0 / 16;
}

/* Fails the launch: a count that does not come within DT_ROWS_WAIT_NS of
 * the global timer (a broken call, never a hung GPU). A call, not the trap
 * inlined (ptx_sm90.cuh's wg_fail says why). */
#ifndef DT_CUDA_EMULATE
#define DT_ROWS_WAIT_NS 10000000000ull
__device__ __noinline__ void rows_fail() { __trap(); }
#endif

/* Every lane of the warp, before it reads or writes its rows' stored
 * state: with visits, until their count reaches a.visit (ld.acquire: the
 * lane's later reads see what the blocks before wrote there); without,
 * until the grid before has completed (grid_dep_wait). */
__device__ __forceinline__ void rows_wait(const dt_attn_block_args &a, const fwd_cta &c,
                                          int64_t row0) {
    if (!a.visits) {
        grid_dep_wait();
        return;
    }
    const uint32_t *const n = rows_count(a, c, row0);
    if (!n) return;
#ifdef DT_CUDA_EMULATE
    dt_emu_rows_acquire(n, a.visit);
#else
    uint64_t t0 = 0;
    for (;;) {
        uint32_t v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(n) : "memory");
        if (v >= a.visit) return;
        const uint64_t now = global_ns();
        if (!t0) t0 = now;
        else if (now - t0 > DT_ROWS_WAIT_NS) rows_fail();
    }
#endif
}

/* The warp is done with its rows (written back, or without a key for
 * them, left as they were): with visits, their count goes up by 1, after
 * every lane's stores (each lane's fence, the warp's barrier, then lane
 * 0's add). Every lane of the warp. */
__device__ __forceinline__ void rows_done(const dt_attn_block_args &a, const fwd_cta &c,
                                          int64_t row0, int lane) {
    uint32_t *const n = rows_count(a, c, row0);
    if (!n) return;
    __threadfence();
    __syncwarp();
#ifdef DT_CUDA_EMULATE
    if (lane == 0) dt_emu_rows_release(n, a.visit);
#else
    if (lane == 0) atomicAdd(n, 1u);
#endif
}

/* A thread of a block with visits is about to exit: nothing after it needs
 * the grid before complete (the blocks after wait for their rows' counts),
 * so it does not wait for that grid; without visits it waits
 * (grid_dep_wait), so that this grid completes after that one, as the next
 * grid's wait needs. */
__device__ __forceinline__ void grid_dep_exit(const dt_attn_block_args &a) {
    if (a.visits) {
#ifdef DT_CUDA_EMULATE
        dt_emu_griddep_waive();
#endif
        return;
    }
    grid_dep_wait();
}

template <int D>
__device__ __forceinline__ void start_rows(const dt_attn_block_args &a, const dt_mma_grid &grid,
                                           int64_t row0, int lane, int (&lim)[2], float (&m)[2],
                                           float (&l)[2], float (&o)[D / 8][4]) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t row = row0 + dt_mma_c_row(lane, 2 * half);
        m[half] = -INFINITY;
        l[half] = 0.0f;
        /* at most kseg.len, below 2^31 (dt_attn_mma_block_ok) */
        lim[half] = row < a.qseg.len ? (int)dt_mma_keys_upto(&grid.keys, dt_attn_pos(a.qseg, row)) : 0;
        /* 0, which the compiler cannot know to be 0: with o known zero it
         * specialises the first key tile and spills the mma kernel at
         * D = 128 (36 bytes; 254 registers without) */
#pragma unroll
        for (int j = 0; j < D / 8; j++) o[j][2 * half] = o[j][2 * half + 1] = __uint_as_float(opaque(0));
    }
}

/* The stored state of the lane's rows, which write_rows reads for the
 * merge, brought into L2 ahead of it (the forward kernels ask at the start
 * of a query tile, where registers are free: two key tiles before its end
 * the wgmma kernel spilled at D = 64): an earlier block wrote it, mostly
 * long enough ago to be out of L2, and read from device memory at the
 * merge, 64 KiB a query tile of 128 rows at D = 128, it would cost a CTA
 * one to two key tiles' time (an estimate from the H100's memory bandwidth
 * per SM; not measured). L2 is where the GPU's memory is coherent, so the
 * hint is safe even before grid_dep_wait. The quad's lanes take turns
 * over a row's 128-byte lines. */
template <int D>
__device__ __forceinline__ void prefetch_rows(const dt_attn_block_args &a, const fwd_cta &c,
                                              int64_t row0, int lane) {
    if (a.first) return;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t row = row0 + dt_mma_c_row(lane, 2 * half);
        if (row >= a.qseg.len) continue;
        const float *const accr = acc_of<D>(a, c) + row * a.heads * D;
#pragma unroll
        for (int line = 0; line < D * 4 / 128; line += 4)
            if (line + (lane & 3) < D * 4 / 128) prefetch_l2(accr + 32 * (line + (lane & 3)));
        if ((lane & 3) == 0) {
            prefetch_l2(a.m + ml_of(a, c) + row);
            prefetch_l2(a.l + ml_of(a, c) + row);
        }
    }
}

/* The stored state of the lane's two rows (half 0, 1), as load_rows
 * brought it into registers for the merge: m, l and the row's acc at the
 * lane's columns (as o: element j the float2 of columns 8j +
 * dt_mma_c_col(lane, 2 half) and the next); -inf, 0, 0 for a row past the
 * segment or a call's first block (nothing stored). */
template <int D>
struct stored_rows {
    float m[2], l[2];
    float2 acc[2][D / 8];
};

/* Loads the stored state of the lane's rows (unless a.first), every load
 * issued before any is used: one wait for the memory instead of four (each
 * row's m and l, then its acc, one row after the other). The wgmma forward
 * at D = 128 issues them before its last product's wait, so that the
 * product hides their latency (wgmma_fwd.cu, EARLY). Reads what an
 * earlier block wrote: after grid_dep_wait. */
template <int D>
__device__ __forceinline__ void load_rows(const dt_attn_block_args &a, const fwd_cta &c, int64_t row0,
                                          int lane, stored_rows<D> &s) {
    if (row0 < a.qseg.len) dependent_access("the rows' running state", rows_count(a, c, row0));
#pragma unroll
    for (int half = 0; half < 2; half++) {
        s.m[half] = -INFINITY;
        s.l[half] = 0.0f;
#pragma unroll
        for (int j = 0; j < D / 8; j++) s.acc[half][j] = make_float2(0.0f, 0.0f);
        const int64_t row = row0 + dt_mma_c_row(lane, 2 * half);
        if (a.first || row >= a.qseg.len) continue;
        const float *const accr = acc_of<D>(a, c) + row * a.heads * D;
        s.m[half] = a.m[ml_of(a, c) + row];
        s.l[half] = a.l[ml_of(a, c) + row];
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            s.acc[half][j] = *reinterpret_cast<const float2 *>(accr + 8 * j + dt_mma_c_col(lane, 2 * half));
    }
}

/* ... merged with the stored state s (load_rows; unless a.first) and
 * written back: m, l and acc, or, by the call's last block (a.last), o =
 * acc / l (0 where l = 0) in T with q's layout and lse = m + log l (-inf
 * where l = 0) with m's. The merge of (m, l, o) with the stored (m', l',
 * acc'): M = max(m, m'), l = l e^(m - M) + l' e^(m' - M), o = o e^(m - M)
 * + acc' e^(m' - M), with the online softmax's exponent base (0 while M =
 * -inf, so no -inf - -inf), its exponentials the kernel's form F's. The 4
 * lanes of a quad hold the same m and l. NF (block.h's nonfinite, LATEST
 * forms only): block.h's non-finite rules: M keeps a NaN (max_nan), l NaN
 * gives o and lse NaN, l = 0 gives o = 0 and lse = -inf whatever acc holds
 * (masked values' 0 x NaN), and an infinite o becomes NaN (o + 0 o). */
template <typename T, int D, dt_attn_form F, bool NF = false>
__device__ __forceinline__ void write_rows(const dt_attn_block_args &a, const fwd_cta &c,
                                           int64_t row0, int lane, float (&m)[2], float (&l)[2],
                                           float (&o)[D / 8][4], const stored_rows<D> &s) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
    const int64_t heads = a.heads;
    int64_t row[2];
    bool live[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        row[half] = row0 + dt_mma_c_row(lane, 2 * half);
        live[half] = row[half] < a.qseg.len;
    }
    if (!a.first) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            if (!live[half]) continue;
            const float mn = NF ? max_nan(m[half], s.m[half]) : fmaxf(m[half], s.m[half]);
            const float mu = mn == -INFINITY ? 0.0f : mn;
            const float al = exp2_of<F>((m[half] - mu) * LOG2E), be = exp2_of<F>((s.m[half] - mu) * LOG2E);
            m[half] = mn;
            l[half] = l[half] * al + s.l[half] * be;
#pragma unroll
            for (int j = 0; j < D / 8; j++) {
                o[j][2 * half] = o[j][2 * half] * al + s.acc[half][j].x * be;
                o[j][2 * half + 1] = o[j][2 * half + 1] * al + s.acc[half][j].y * be;
            }
        }
        /* every lane of the quad has read its rows' m and l (their values
         * used above) before the quad's first lane writes them (all 32
         * lanes: outside `live`) */
        __syncwarp();
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        if (!live[half]) continue;
        if (a.last) {
            T *og = static_cast<T *>(a.o) + c.b * a.q_batch_stride + (row[half] * heads + c.h) * D;
            if constexpr (NF) {
                const bool none = l[half] == 0.0f;   /* no allowed key; NaN l: NaN o, lse */
                const float inv = 1.0f / l[half];
                const auto out = [&](float x) {
                    const float y = none ? 0.0f : x * inv;
                    return y + 0.0f * y;
                };
#pragma unroll
                for (int j = 0; j < D / 8; j++)
                    *reinterpret_cast<uint32_t *>(og + 8 * j + dt_mma_c_col(lane, 2 * half)) =
                        elem<T>::pack(out(o[j][2 * half]), out(o[j][2 * half + 1]));
                if ((lane & 3) == 0)
                    a.lse[ml_of(a, c) + row[half]] = none ? -INFINITY : m[half] + logf(l[half]);
                continue;
            }
            const float inv = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
#pragma unroll
            for (int j = 0; j < D / 8; j++)
                *reinterpret_cast<uint32_t *>(og + 8 * j + dt_mma_c_col(lane, 2 * half)) =
                    elem<T>::pack(o[j][2 * half] * inv, o[j][2 * half + 1] * inv);
            if ((lane & 3) == 0)
                a.lse[ml_of(a, c) + row[half]] = l[half] > 0.0f ? m[half] + logf(l[half]) : -INFINITY;
            continue;
        }
        float *const accr = acc_of<D>(a, c) + row[half] * heads * D;
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *reinterpret_cast<float2 *>(accr + 8 * j + dt_mma_c_col(lane, 2 * half)) =
                make_float2(o[j][2 * half], o[j][2 * half + 1]);
        if ((lane & 3) == 0) {
            a.m[ml_of(a, c) + row[half]] = m[half];
            a.l[ml_of(a, c) + row[half]] = l[half];
        }
    }
}

/* load_rows and write_rows back to back: the mma forward's end, and the
 * wgmma forward's where it does not load early. */
template <typename T, int D, dt_attn_form F, bool NF = false>
__device__ __forceinline__ void write_rows(const dt_attn_block_args &a, const fwd_cta &c,
                                           int64_t row0, int lane, float (&m)[2], float (&l)[2],
                                           float (&o)[D / 8][4]) {
    stored_rows<D> s;
    load_rows<D>(a, c, row0, lane, s);
    write_rows<T, D, F, NF>(a, c, row0, lane, m, l, o, s);
}

/* How online_softmax makes P (its EXP): by exp2_ftz into s (SFU, the
 * LATEST form's), the same and each pair also packed into the A
 * fragments of the P V product as it is made (SFU_PACKED: the wgmma
 * forward's LATEST form at D = 64, which ptxas spills at its 128 registers
 * when the fragments are packed after), or by exp2f into s (EXP2F: every
 * VERIFIED form, and the wgmma forward's thread-0 variant at D = 128,
 * which ptxas spills at its 255 registers with exp2_ftz). The same P every
 * way but for the values exp2_ftz flushes; ptxas (CUDA 13.0) spills none
 * of the kernels so. */
enum softmax_exp { SFU, SFU_PACKED, EXP2F };

/* The online softmax of one key tile of NT n-tiles (8 keys each), on the
 * lane's two rows (half 0: row g, half 1: row g+8 of the warp's 16), for
 * both forward kernels (mma.sync: mma_fwd.cu; wgmma:
 * wgmma_fwd.cu, whose accumulators have the same per-warp layout).
 * In: s = raw Q K^T. Out: s = P (fp32), and with SFU_PACKED also pa[NT /
 * 2] = P rounded to T as p_fragment makes it; m, l updated, o rescaled by
 * alpha. MASKED: keys y >= lim[half] of the row become -inf (key0 is the
 * tile's first key); RANGED (documents and windows, LATEST forms only:
 * rule_rows below) also keys y < lim_lo[half]. Exponentials are 2^((x -
 * m) log2(e)), m in natural-log units (mma_fwd.cu says why). NF (block.h's
 * nonfinite): an allowed score of +-inf becomes NaN (x + 0 x, before the
 * mask's select) and the row maxima keep a NaN (max_nan), so that a NaN row
 * max makes every exponent of the row, alpha, l and o NaN. */
template <bool MASKED, int NT, int D, softmax_exp EXP = SFU, typename T = float, bool NF = false,
          bool RANGED = false>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                               float (&o)[D / 8][4], const int (&lim)[2],
                                               int key0, int lane, float scale,
                                               uint32_t (*pa)[4] = nullptr,
                                               const int *lim_lo = nullptr) {
    const auto ex2 = [](float x) { return EXP == EXP2F ? exp2f(x) : exp2_ftz(x); };
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int half = dt_mma_c_half(i);
            float v = s[j][i] * scale;
            if constexpr (NF) v += 0.0f * v;
            if (MASKED && key0 + 8 * j + dt_mma_c_col(lane, i) >= lim[half]) v = -INFINITY;
            if constexpr (RANGED)
                if (MASKED && key0 + 8 * j + dt_mma_c_col(lane, i) < lim_lo[half]) v = -INFINITY;
            s[j][i] = v;
            if constexpr (NF) mx[half] = max_nan(mx[half], v);
            else mx[half] = fmaxf(mx[half], v);
        }
    float mu[2], alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const float m_new = NF ? max_nan(m[half], quad_max_nan(mx[half]))
                               : fmaxf(m[half], quad_max(mx[half]));
        /* exponent base: 0 while the row has no allowed key (m_new = -inf),
         * so every exponent below is -inf - 0, never -inf - -inf */
        mu[half] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[half] = ex2((m[half] - mu[half]) * LOG2E);   /* 0 when m was -inf */
        m[half] = m_new;
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int half = dt_mma_c_half(i);
            const float p = ex2((s[j][i] - mu[half]) * LOG2E);
            s[j][i] = p;
            sum[half] += p;
            if constexpr (EXP == SFU_PACKED)   /* n-tile j's pair of this half (dt_mma_p_tile) */
                if (i & 1) pa[j >> 1][2 * (j & 1) + (i >> 1)] = elem<T>::pack(s[j][i - 1], p);
        }
#pragma unroll
    for (int half = 0; half < 2; half++) l[half] = l[half] * alpha[half] + quad_sum(sum[half]);
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[j][i] *= alpha[dt_mma_c_half(i)];
}

/* P (or dS) as the A fragment of the k-step over keys 16 kk .. 16 kk + 15,
 * straight from the score accumulators p[n-tile][4], rounded to T
 * (mma_layout.h, dt_mma_p_tile). (p is a pointer, not an array of a
 * templated extent: g++ folds the identical instances for different
 * extents and then warns about bounds with the wrong one.) */
template <typename T>
__device__ __forceinline__ void p_fragment(uint32_t (&pa)[4], const float (*p)[4], int kk) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int j = dt_mma_p_tile(kk, r), e = dt_mma_p_elem(r);
        pa[r] = elem<T>::pack(p[j][e], p[j][e + 1]);
    }
}

/* ------------------------------------------------- backward accumulators
 *
 * Both backward kernels (mma.sync: mma_bwd.cu; wgmma:
 * wgmma_bwd.cu) hold dK and dV in the per-warp accumulator
 * layout (warp w of the CTA: keys 16 w .. 16 w + 15 of the key tile; lane
 * rows g and g + 8, n-tile j = head-dim columns 8j .. 8j+7) and add dQ from
 * accumulators of the same layout. */

/* A backward CTA's work (both backward kernels, one CTA per key tile of
 * DT_MMA_BWD_BN keys of a kv head, launched in mma_layout.h's order,
 * dt_mma_grid's): batch b, kv head g, first key y0, and its walk over
 * the group's query heads and their query tiles of bm rows that may attend
 * its keys (per head, the per_head tiles from qt_first on; from
 * qt_unmasked on, no mask). Uniform over the CTA, and so are its early
 * return (n_iter = 0: no query attends these keys) and its loop. */
struct bwd_cta {
    /* 32-bit: held through the main loop, where the backward kernels are
     * short of registers; dt_attn_mma_bwd_block_ok keeps n_iter in range */
    int b, g, y0, group, qt_first, qt_unmasked, per_head, n_iter;
    /* iteration it's query head and query tile */
    __device__ int head(int it) const { return g * group + it / per_head; }
    __device__ int qtile(int it) const { return qt_first + it % per_head; }
};

__device__ __forceinline__ bwd_cta bwd_cta_of(const dt_attn_block_bwd_args &a,
                                              const dt_mma_grid &grid, int bm) {
    constexpr int BN = DT_MMA_BWD_BN;
    const int64_t nq = a.qseg.len, nk = a.kseg.len;
    uint32_t rank, unit;   /* rank 0: the first key tile, the most queries */
    dt_mma_order_at(&grid.order, blockIdx.x, &rank, &unit);
    bwd_cta c;
    c.b = (int)dt_udiv_q(unit, grid.heads);
    c.g = (int)dt_udiv_r(unit, grid.heads);
    c.y0 = (int)rank * BN;
    c.group = (int)grid.group.d;
    const bool whole = c.y0 + BN <= nk;
    c.qt_first = (int)dt_mma_bwd_first_qtile(
        dt_attn_queries_from(a.mask, a.qseg, dt_attn_pos(a.kseg, c.y0)), nq, bm);
    c.qt_unmasked = (int)dt_mma_bwd_unmasked_qtile(
        whole ? dt_attn_queries_from(a.mask, a.qseg, dt_attn_pos(a.kseg, c.y0 + BN - 1)) : 0,
        whole, nq, bm);
    c.per_head = (int)dt_mma_query_tiles(nq, bm) - c.qt_first;
    c.n_iter = c.group * c.per_head;
    return c;
}

/* p[0], p[1] += x, y: one 8-byte reduction where the device has it
 * (float2 atomicAdd, compute capability 9.0 and the emulator's device), two
 * 4-byte ones before. Every grid only adds into dq (block.h's continues),
 * so a dependent backward block adds before it waits for the one before:
 * on the emulator a reduction, which it allows there. */
__device__ __forceinline__ void add_pair(float *p, float x, float y) {
#if defined(DT_CUDA_EMULATE)
    dt_emu_reduce_add(reinterpret_cast<float2 *>(p), make_float2(x, y));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(p), make_float2(x, y));
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

/* dq[row][col0 + 8j + ..] += scale acc[j] for the lane's two query rows
 * (row[half], skipped unless live[half]) and NJ n-tiles, with atomics:
 * every key tile's CTA adds into the same dq rows. dqg: dq of the (batch,
 * head) at row 0, row stride rs. */
template <int NJ>
__device__ __forceinline__ void add_dq(float *dqg, int64_t rs, int col0, const float (&acc)[NJ][4],
                                       const int64_t (&row)[2], const bool (&live)[2], int lane,
                                       float scale) {
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int half = 0; half < 2; half++)   /* elements 2 half, 2 half + 1: one row */
            if (live[half])
                add_pair(dqg + row[half] * rs + col0 + 8 * j + dt_mma_c_col(lane, 2 * half),
                         scale * acc[j][2 * half], scale * acc[j][2 * half + 1]);
}

/* dk += scale dk_acc, dv += dv_acc for the lane's keys y_warp + g and
 * y_warp + g + 8 (y_warp: the warp's first key in the segment; keys past
 * nk are skipped): read, add, write, float2 (the CTA alone owns those rows
 * in this call, so dk and dv are deterministic); with `set` (a `first`
 * call, block.h) written without the read. dkg, dvg: dk, dv of the
 * (batch, kv head) at row 0, row stride rs. */
template <int D>
__device__ __forceinline__ void add_dk_dv(float *dkg, float *dvg, int64_t rs, int64_t y_warp,
                                          int64_t nk, const float (&dk)[D / 8][4],
                                          const float (&dv)[D / 8][4], int lane, float scale,
                                          bool set) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t y = y_warp + dt_mma_c_row(lane, 2 * half);
        if (y >= nk) continue;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            const int64_t off = y * rs + 8 * j + dt_mma_c_col(lane, 2 * half);
            float2 *pk = reinterpret_cast<float2 *>(dkg + off);
            float2 *pv = reinterpret_cast<float2 *>(dvg + off);
            float2 k2 = make_float2(0.0f, 0.0f), v2 = k2;
            if (!set) {
                k2 = *pk;
                v2 = *pv;
            }
            k2.x += scale * dk[j][2 * half];
            k2.y += scale * dk[j][2 * half + 1];
            v2.x += dv[j][2 * half];
            v2.y += dv[j][2 * half + 1];
            *pk = k2;
            *pv = v2;
        }
    }
}

/* The backward CTA of a `first` call whose keys y0 .. y0 + DT_MMA_BWD_BN - 1
 * no query attends: 0 into those rows (< nk) of dk and dv, float2, every
 * thread of the CTA. dkg, dvg, rs: as add_dk_dv's. */
template <int D>
__device__ __forceinline__ void zero_dk_dv(float *dkg, float *dvg, int64_t rs, int64_t y0,
                                           int64_t nk) {
    constexpr int PAIRS = D / 2;   /* float2 a row */
    for (int i = (int)threadIdx.x; i < DT_MMA_BWD_BN * PAIRS; i += (int)blockDim.x) {
        const int64_t y = y0 + i / PAIRS;
        if (y >= nk) continue;
        const int64_t off = y * rs + 2 * (i % PAIRS);
        *reinterpret_cast<float2 *>(dkg + off) = make_float2(0.0f, 0.0f);
        *reinterpret_cast<float2 *>(dvg + off) = make_float2(0.0f, 0.0f);
    }
}

/* ---------------------------------------------- documents and windows
 *
 * mask.h's rule beyond the mask (block.h's docs, window) runs in the
 * LATEST forms only, in kernels of their own (each file's rule kernel),
 * so that no other instance's code changes; block_cpu.c is the design.
 * Each row of a CTA's tile (the forward's queries, the backward's keys)
 * pairs with one range [lo, hi) of rows of the other segment
 * (dt_attn_rule_rows), whose ends never decrease with the row. So the
 * tiles of the other segment that hold a pair are the rows' ranges cut
 * into tiles: a few runs of consecutive tiles (more than one only where a
 * short document, a window or a zigzag jump leaves a gap), and a CTA
 * visits exactly those. A tile inside [lo of the last row with a range,
 * hi of the first) pairs every row with every one of its rows (full: no
 * mask); the others are masked per element by each row's own range.
 * Rows without a pair keep m = -inf, l = 0 (o = 0, lse = -inf). */

/* Thread 0, once every lo and hi is written (a __syncthreads before it,
 * and one after before the others read the runs): the runs of tiles of
 * `tile` rows that hold a row of some range, merged where they meet (the
 * ranges' starts grow with the row: the runs come sorted). */
template <int ROWS>
__device__ __forceinline__ void rule_runs_build(rule_runs<ROWS> &r, int tile) {
    if (threadIdx.x != 0) return;
    int n = 0;
    for (int i = 0; i < ROWS; i++) {
        const int lo = r.lo[i], hi = r.hi[i];
        if (lo >= hi) continue;
        const int s = lo / tile, e = (hi - 1) / tile + 1;
        if (n > 0 && s <= r.e[n - 1]) {
            if (e > r.e[n - 1]) r.e[n - 1] = e;
        } else {
            r.s[n] = s;
            r.e[n] = e;
            n++;
        }
    }
    r.n = n;
}

/* The runs' first tile, -1 if none (*k: its run). */
template <int ROWS>
__device__ __forceinline__ int rule_first(const rule_runs<ROWS> &r, int &k) {
    k = 0;
    return r.n > 0 ? r.s[0] : -1;
}

/* The tile after tile t of run *k (*k follows it), -1 after the last. */
template <int ROWS>
__device__ __forceinline__ int rule_next(const rule_runs<ROWS> &r, int &k, int t) {
    if (t + 1 < r.e[k]) return t + 1;
    return ++k < r.n ? r.s[k] : -1;
}

/* The runs' count of tiles, and their k-th tile (k below that count). */
template <int ROWS>
__device__ __forceinline__ int rule_tile_count(const rule_runs<ROWS> &r) {
    int n = 0;
    for (int i = 0; i < r.n; i++) n += r.e[i] - r.s[i];
    return n;
}
template <int ROWS>
__device__ __forceinline__ int rule_tile_at(const rule_runs<ROWS> &r, int k) {
    int i = 0;
    while (k >= r.e[i] - r.s[i]) k -= r.e[i] - r.s[i], i++;
    return r.s[i] + k;
}

/* mask.h's dt_attn_rule_rows, its divisions by multiplication: the rows
 * [lo, hi) of the segment of k within rule r's span of position p (keys:
 * as there). k must count the rows up to any position (made with a causal
 * mask: dt_mma_rule_grid makes the ruled launches' so). */
__device__ __forceinline__ void rule_rows(const dt_attn_rule &r, int keys, int64_t p,
                                          const dt_mma_keys &k, int &lo, int &hi) {
    int64_t a, b;
    dt_attn_rule_span(r, keys, p, &a, &b);
    lo = dt_mma_keys_upto(&k, a - 1);
    hi = a > b ? lo : dt_mma_keys_upto(&k, b);
}

/* ------------------------------------------------------------ tile copies */

/* Issue the copies of rows [row0, row0 + ROWS) of a row-major matrix (row r
 * at base + r * row_stride, D contiguous elements; with slots > 1 row r at
 * base + dt_attn_key_row(r, slots, slot_rows) * row_stride, keys
 * interleaved: block.h) into a swizzled tile; rows >= nrows are
 * zero-filled. All THREADS threads of the CTA take part. */
template <typename T, int D, int ROWS = 64, int THREADS = DT_MMA_THREADS>
__device__ __forceinline__ void load_tile(T *tile, const T *base, int64_t row_stride, int64_t row0,
                                          int64_t nrows, int64_t slots = 1, int64_t slot_rows = 0) {
    constexpr int COPIES = ROWS * D / 8;   /* 16-byte copies per tile */
    static_assert(COPIES % THREADS == 0, "every thread issues the same number of copies");
#pragma unroll
    for (int n = 0; n < COPIES / THREADS; n++) {
        const int e = n * THREADS + (int)threadIdx.x;
        const int r = dt_mma_copy_row(e, D), c = dt_mma_copy_col(e, D);
        const bool valid = row0 + r < nrows;
        const T *src = valid ? base + dt_attn_key_row(row0 + r, slots, slot_rows) * row_stride + c : base;
        cp_async_16(tile + dt_mma_swz(r, c, D), src, valid);
    }
}


}  // namespace
#endif /* !DT_MMA_STUB */

namespace {

/* Host: the eight instances of a tensor-core kernel's launch: f(type tag,
 * head dim, form) for bf16 or fp16 (dtype), head dim 64 or 128 (dim) and
 * the form (kernels.h's dt_attn_form), as f(dt_mma_type<T>{},
 * dt_mma_dim<D>{}, dt_mma_form<F>{}); f reads T as decltype(tag)::type, D
 * as decltype(dim)::value and F as decltype(form)::value. */
template <typename T>
struct dt_mma_type {
    using type = T;
};
template <int D>
struct dt_mma_dim {
    static constexpr int value = D;
};
template <dt_attn_form F>
struct dt_mma_form {
    static constexpr dt_attn_form value = F;
};
template <typename T, int D, typename Fn>
dt_status dt_mma_dispatch_form(dt_attn_form form, Fn f) {
    if (form == DT_ATTN_FORM_LATEST)
        return f(dt_mma_type<T>{}, dt_mma_dim<D>{}, dt_mma_form<DT_ATTN_FORM_LATEST>{});
    return f(dt_mma_type<T>{}, dt_mma_dim<D>{}, dt_mma_form<DT_ATTN_FORM_VERIFIED>{});
}
template <typename Fn>
dt_status dt_mma_dispatch(dt_dtype dtype, int64_t dim, dt_attn_form form, Fn f) {
    if (dtype == DT_BF16)
        return dim == 64 ? dt_mma_dispatch_form<__nv_bfloat16, 64>(form, f)
                         : dt_mma_dispatch_form<__nv_bfloat16, 128>(form, f);
    return dim == 64 ? dt_mma_dispatch_form<__half, 64>(form, f)
                     : dt_mma_dispatch_form<__half, 128>(form, f);
}

/* Host: kernel<<<grid, threads, smem, stream>>>(args...) after raising its
 * dynamic shared-memory limit; errors name the pass (`what`), head dim and
 * dtype. */
template <typename... P>
dt_status dt_mma_launch(void (*kernel)(P...), dim3 grid, int threads, size_t smem,
                        cudaStream_t stream, const char *what, int dim, dt_dtype dtype,
                        bool dependent, P... args) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dt_error(DT_ERR_BACKEND, "attention (cuda mma): %s block: %zu bytes of shared "
                        "memory: %s", what, smem, cudaGetErrorString(e));
    }
    dt_cuda_launch_ex(kernel, grid, dim3((unsigned)threads), smem, stream, dependent, args...);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return dt_error(DT_ERR_BACKEND, "attention (cuda mma): %s block (D = %d, %s): %s", what,
                        dim, dt_dtype_name(dtype), cudaGetErrorString(e));
    return DT_SUCCESS;
}

/* Host: a block with documents or a window (block.h), which only the
 * LATEST forms' rule kernels run; a VERIFIED form refuses it (what: the
 * kernel and pass, for the message). */
template <typename A>
inline bool dt_mma_ruled(const A &a) {
    return a.docs != nullptr || a.window > 0;
}
inline dt_status dt_mma_refuse_ruled(const char *what) {
    return dt_error(DT_ERR_NOT_SUPPORTED, "attention (cuda %s): documents and windows run only "
                    "in the kernel's LATEST form", what);
}

/* Host: the launch's dt_mma_grid for a forward block of query tiles of bm
 * rows (units: the query heads, which re-read their kv head's K and V,
 * shared by the GQA group) and for a backward block of key tiles of
 * DT_MMA_BWD_BN (units: the kv heads, whose CTAs re-read the group's Q and
 * dO and add into its dQ), on a device with l2_bytes of L2 (the section of
 * mma_layout.h's launch order). */
inline dt_mma_grid dt_mma_fwd_grid(const dt_attn_block_args &a, int bm, int64_t l2_bytes) {
    const int64_t group = a.heads / a.kv_heads, units = a.batch * a.heads;
    const int64_t kv = 2 * a.kseg.len * a.dim * (int64_t)dt_dtype_size(a.dtype);
    dt_mma_grid g;
    g.order = dt_mma_order_of(dt_mma_query_tiles(a.qseg.len, bm), units,
                              dt_mma_sched_section(units, (kv + group - 1) / group, l2_bytes));
    g.heads = dt_udiv_of((uint32_t)a.heads);
    g.group = dt_udiv_of((uint32_t)group);
    g.keys = dt_mma_keys_of(a.mask, a.kseg);
    return g;
}
inline dt_mma_grid dt_mma_bwd_grid(const dt_attn_block_bwd_args &a, int64_t l2_bytes) {
    const int64_t group = a.heads / a.kv_heads, units = a.batch * a.kv_heads;
    const int64_t per_row = a.dim * (2 * (int64_t)dt_dtype_size(a.dtype) + 4);   /* q, dO; dq */
    dt_mma_grid g;
    g.order = dt_mma_order_of((a.kseg.len + DT_MMA_BWD_BN - 1) / DT_MMA_BWD_BN, units,
                              dt_mma_sched_section(units, group * a.qseg.len * per_row, l2_bytes));
    g.heads = dt_udiv_of((uint32_t)a.kv_heads);
    g.group = dt_udiv_of((uint32_t)group);
    g.keys = dt_mma_keys_of(a.mask, a.kseg);
    return g;
}

/* Host: a ruled launch's grid g (either pass): its keys count the key
 * rows up to any position, whatever the mask (rule_rows). */
inline void dt_mma_rule_grid(dt_mma_grid &g, dt_attn_segment kseg) {
    g.keys = dt_mma_keys_of(DT_ATTN_CAUSAL, kseg);
}

}  // namespace
#endif /* DT_ATTN_CUDA_COMMON_CUH */
