/* attention/cuda/mma_layout.h — PRIVATE. The index math of the tensor-core
 * attention kernels (mma_fwd.cu: forward, mma_bwd.cu:
 * backward), as small pure functions of ints.
 *
 * Plain C that also compiles under nvcc, where every function is
 * __host__ __device__: the kernel calls these and nothing else for its
 * indices, and tests/test_attention.c runs the same functions on the CPU
 * against an emulation of ldmatrix and mma.sync written from the PTX ISA
 * (section "Matrix Fragments for mma.m16n8k16 with floating point type" and
 * "ldmatrix"), and against dt_attn_tile_class (mask.h). So the fragment and
 * swizzle arithmetic is tested on machines without a GPU.
 *
 * Notation: `lane` is the thread's index in its warp (0..31); g = lane / 4
 * (the "groupID" of the PTX ISA) and t = lane % 4 ("threadID_in_group").
 *
 * Fragments of mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{..}.f32
 * (D[16x8] = A[16x16] B[16x8] + C[16x8]); a .b32 register holds two 16-bit
 * elements, the lower-indexed one in its low half:
 *   A (16x16, 4 regs): reg 0 = A[g][2t, 2t+1]    reg 1 = A[g+8][2t, 2t+1]
 *                      reg 2 = A[g][2t+8, 2t+9]  reg 3 = A[g+8][2t+8, 2t+9]
 *   B (16x8, 2 regs):  reg 0 = B[2t, 2t+1][g]    reg 1 = B[2t+8, 2t+9][g]
 *   C, D (16x8, 4 fp32): c0, c1 = C[g][2t, 2t+1]  c2, c3 = C[g+8][2t, 2t+1]
 * ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 loads four 8x8 matrices;
 * lanes 8m..8m+7 give the addresses of rows 0..7 of matrix m (16 bytes
 * each), and register m of lane l receives M_m[l/4][2(l%4), 2(l%4)+1]
 * (without .trans) or M_m[2(l%4), 2(l%4)+1][l/4] (with .trans).
 *
 * Shared-memory tiles: [64 rows][dim] 16-bit elements, dim = 64 or 128,
 * row-major, each row cut into dim/8 chunks of 16 bytes; chunk c of row r is
 * stored at chunk position c ^ (r % 8) of that row (XOR swizzle). An
 * ldmatrix phase reads one chunk from each of 8 consecutive rows: without
 * the swizzle all 8 would sit in the same 4 banks (rows are 128 or 256
 * bytes apart); with it they cover the 8 distinct 16-byte bank groups. A
 * chunk's 8 elements stay contiguous and 16-byte aligned, as cp.async and
 * ldmatrix need. Needs dim a multiple of 64 (the XOR stays inside the row).
 */
#ifndef DT_ATTN_MMA_LAYOUT_H
#define DT_ATTN_MMA_LAYOUT_H

#include <stdint.h>
#include "../mask.h"

#ifdef __CUDACC__
#define DT_MMA_HD static inline __host__ __device__
#else
#define DT_MMA_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Tile sizes: a CTA of DT_MMA_WARPS warps owns DT_MMA_BM query rows (16
 * per warp) and walks the keys in tiles of DT_MMA_BN. */
#define DT_MMA_BM 64
#define DT_MMA_BN 64
#define DT_MMA_WARPS 4
#define DT_MMA_THREADS (32 * DT_MMA_WARPS)
/* The wgmma forward's (wgmma_fwd.cu): 128 query rows, 64 per
 * warpgroup, and key tiles of 128 */
#define DT_WGMMA_BM 128
#define DT_WGMMA_BN 128

/* ------------------------------------------------------------ swizzle */

/* Element offset of (row, col) in a swizzled [rows][dim] tile. */
DT_MMA_HD int dt_mma_swz(int row, int col, int dim) {
    const int chunk = col >> 3, within = col & 7;
    return row * dim + ((chunk ^ (row & 7)) << 3) + within;
}

/* Global -> shared copies (cp.async, 16 bytes each): copy number e of a
 * [64][dim] tile is row e / (dim/8), logical columns col .. col+7. */
DT_MMA_HD int dt_mma_copy_row(int e, int dim) { return e / (dim >> 3); }
DT_MMA_HD int dt_mma_copy_col(int e, int dim) { return (e % (dim >> 3)) << 3; }

/* ------------------------------------------------- ldmatrix addresses */

/* Row and column, inside a 16x16 block, whose address lane l gives to
 * ldmatrix.x4 (matrix m = l / 8, its row l % 8).
 *
 * A operand (Q, row-major [query][d], no .trans): matrix m covers rows
 * 8*(m%2).. and columns 8*(m/2).., so registers 0..3 are A regs 0..3. */
DT_MMA_HD int dt_mma_ldsm_a_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
DT_MMA_HD int dt_mma_ldsm_a_col(int lane) { return (lane >> 4) * 8; }

/* B operand of S = Q K^T from K stored [key][d] (no .trans): B[d][key] =
 * K[key][d]. Block = 16 keys x 16 d. Matrix m covers keys 8*(m/2).. and d
 * 8*(m%2)..: registers 0, 1 are B regs 0, 1 of the n-tile of keys 0..7;
 * registers 2, 3 those of keys 8..15. */
DT_MMA_HD int dt_mma_ldsm_k_row(int lane) { return (lane & 7) + (lane >> 4) * 8; }
DT_MMA_HD int dt_mma_ldsm_k_col(int lane) { return ((lane >> 3) & 1) * 8; }

/* B operand of O = P V from V stored [key][d] (.trans): B[key][d] =
 * V[key][d]. Block = 16 keys x 16 d. Matrix m covers keys 8*(m%2).. and d
 * 8*(m/2)..: registers 0, 1 are B regs 0, 1 of the n-tile of d 0..7;
 * registers 2, 3 those of d 8..15. */
DT_MMA_HD int dt_mma_ldsm_v_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
DT_MMA_HD int dt_mma_ldsm_v_col(int lane) { return (lane >> 4) * 8; }

/* ------------------------------------------------ accumulator fragments */

/* Row (0..15) and column (0..7) of accumulator element i (0..3) of lane. */
DT_MMA_HD int dt_mma_c_row(int lane, int i) { return (lane >> 2) + (i >> 1) * 8; }
DT_MMA_HD int dt_mma_c_col(int lane, int i) { return (lane & 3) * 2 + (i & 1); }
/* Which of the lane's two rows (g: 0, g+8: 1) element i belongs to. */
DT_MMA_HD int dt_mma_c_half(int i) { return i >> 1; }

/* P as the A operand of O = P V, straight from the S accumulators (no trip
 * through shared memory): for the k-step over keys 16*kk .. 16*kk+15, A
 * register r holds elements e, e+1 (e = dt_mma_p_elem(r)) of the S n-tile
 * dt_mma_p_tile(kk, r) (n-tile j = keys 8j .. 8j+7). */
DT_MMA_HD int dt_mma_p_tile(int kk, int r) { return 2 * kk + (r >> 1); }
DT_MMA_HD int dt_mma_p_elem(int r) { return (r & 1) * 2; }

/* ----------------------------------------------------- mask and bounds */

/* The key tiles a query tile [x0, x1) visits, from the limits of its first
 * and last rows (limits from dt_attn_keys_upto, mask.h, grow with x): tiles 0 .. dt_mma_key_tiles - 1 are
 * the non-empty ones of mask.h (tile kt is empty iff kt*BN >= limit of the
 * last row), and tiles below dt_mma_unmasked_tiles need no mask at all:
 * every row may attend every key of them, and all of them exist (limit <=
 * k.len). The others are masked per element with the row limits, which
 * also masks the keys past k.len of a last, short tile. */
DT_MMA_HD int64_t dt_mma_key_tiles(int64_t limit_last_row) {
    return (limit_last_row + DT_MMA_BN - 1) / DT_MMA_BN;
}
DT_MMA_HD int64_t dt_mma_unmasked_tiles(int64_t limit_first_row) {
    return limit_first_row / DT_MMA_BN;
}

/* ------------------------------------------- backward (mma_bwd.cu)
 *
 * A CTA of DT_MMA_BWD_WARPS = 8 warps owns a tile of DT_MMA_BWD_BN = 128
 * keys and walks the query tiles (DT_MMA_BM = 64 rows) that may attend
 * them (FlashAttention-2's tile sizes for its backward: twice the keys of
 * the forward's tiles, so every query tile's loads and dQ additions serve
 * 128 keys). Per query tile, three phases:
 *   1. warp w: query rows 16 (w % 4) .., keys 64 (w / 4) .. (a 16 x 64
 *      block, the forward's warp tile): S = Q K^T and dP = dO V^T (A:
 *      dt_mma_ldsm_a_* for Q and dO, B: dt_mma_ldsm_k_* for K and V), P
 *      and dS in registers, stored rounded to 16 bits in swizzled
 *      [BM][BWD_BN] shared tiles (dt_mma_ps_off);
 *   2. warp w: keys 16 w .. 16 w + 15, over the tile's 64 queries
 *        dV += P^T dO    A = P^T  from the P tile  (ldmatrix.trans, dt_mma_ldsm_at_*)
 *                        B = dO   from the dO tile (ldmatrix.trans, dt_mma_ldsm_v_*)
 *        dK += dS^T Q    likewise from the dS and Q tiles;
 *   3. warp w: query rows 16 (w % 4) .., head-dim columns (D/2) (w / 4) ..
 *        dQ += dS K      A = dS from the dS tile (ldmatrix, dt_mma_ldsm_a_*)
 *                        B = K  from the K tile  (ldmatrix.trans, dt_mma_ldsm_v_*) */
#define DT_MMA_BWD_BN 128
#define DT_MMA_BWD_WARPS 8
#define DT_MMA_BWD_THREADS (32 * DT_MMA_BWD_WARPS)

/* A warp's 16 query rows in phases 1 and 3 start at row 16 * this; its 64
 * keys (phase 1) or D/2 head-dim columns (phase 3) are half number
 * dt_mma_bwd_half. */
DT_MMA_HD int dt_mma_bwd_rows(int warp) { return warp & 3; }
DT_MMA_HD int dt_mma_bwd_half(int warp) { return warp >> 2; }

/* A operand of a product whose A is stored transposed: the tile holds
 * M[k][m] row-major ([query][key] for P and dS) and A[m][k] = M[k][m]
 * (P^T: [key][query]); with .trans. Block = 16 stored rows (k) x 16 stored
 * columns (m). Matrix j covers stored rows 8*(j/2).. and stored columns
 * 8*(j%2)..: registers 0..3 are A regs 0..3. */
DT_MMA_HD int dt_mma_ldsm_at_row(int lane) { return (lane & 7) + (lane >> 4) * 8; }
DT_MMA_HD int dt_mma_ldsm_at_col(int lane) { return ((lane >> 3) & 1) * 8; }

/* Element offset, in a swizzled [BM][BWD_BN] P or dS tile, of the pair of
 * accumulator elements 2 half, 2 half + 1 (adjacent keys of one row, one
 * .b32 store) of n-tile j of warp `warp`'s 16 x 64 scores (phase 1). */
DT_MMA_HD int dt_mma_ps_off(int warp, int lane, int j, int half) {
    return dt_mma_swz(16 * dt_mma_bwd_rows(warp) + dt_mma_c_row(lane, 2 * half),
                      64 * dt_mma_bwd_half(warp) + 8 * j + dt_mma_c_col(lane, 2 * half),
                      DT_MMA_BWD_BN);
}

/* Query tiles of bm rows (DT_MMA_BM for the mma.sync kernels; the wgmma
 * backward's 8192 / D) in a segment of nq rows. */
DT_MMA_HD int64_t dt_mma_query_tiles(int64_t nq, int bm) { return (nq + bm - 1) / bm; }

/* The query tiles (of bm rows) a key tile [y0, y1) visits: from the first
 * query that may attend key y0 (x_any = dt_attn_queries_from of mask.h at
 * key y0's position; every later query may too) to the end: tiles
 * dt_mma_bwd_first_qtile .. dt_mma_query_tiles(nq, bm) - 1 are exactly the
 * non-empty ones (none if x_any = nq). Tiles from dt_mma_bwd_unmasked_qtile
 * on need no mask: every query of them may attend every key of the tile
 * (x_full = dt_attn_queries_from at key y0 + BWD_BN - 1), and the key tile
 * is whole (`whole`: y0 + BWD_BN <= k.len; a short last key tile is always
 * masked, which masks the keys past k.len). Query rows past nq of a last,
 * short query tile are not masked by this: the kernels give them P = 0.
 * Both backward kernels use these with key tiles of DT_MMA_BWD_BN. */
DT_MMA_HD int64_t dt_mma_bwd_first_qtile(int64_t x_any, int64_t nq, int bm) {
    return x_any >= nq ? dt_mma_query_tiles(nq, bm) : x_any / bm;
}
DT_MMA_HD int64_t dt_mma_bwd_unmasked_qtile(int64_t x_full, int whole, int64_t nq, int bm) {
    return whole ? (x_full + bm - 1) / bm : dt_mma_query_tiles(nq, bm);
}

/* ------------------------------------------------------- launch order
 *
 * The tensor-core kernels (forward: a CTA per query tile; backward: a CTA
 * per key tile) launch a 1-D grid of n_ranks x n_units CTAs, a unit being
 * one (batch, head) pair of the grid (the forward's query heads, the
 * backward's kv heads: unit = b * heads + h). A tile's rank is its place by
 * work, heaviest first: under a causal mask the forward's last query tile
 * and the backward's first key tile see the most of the other side (mask.h:
 * the limits grow with the position), so rank 0 is the forward's tile
 * n_ranks - 1 and the backward's tile 0; without a mask every rank weighs
 * the same. The GPU starts CTAs in block order, so the order decides the
 * tail of a launch: rank by rank across units, the CTAs that start last are
 * the lightest (longest processing time first), while one unit after
 * another puts a heavy CTA of the last unit among the last to start, and
 * under a causal mask the other SMs then wait for it.
 *
 * Rank-major over all units would stream every unit's K and V (forward) or
 * Q, dO and dQ (backward) through the L2 at once, so the units go in
 * sections of `section` consecutive units, as many as have their re-read
 * data in the L2 (dt_mma_sched_section); inside a section, rank-major.
 * Where `section` does not divide n_units, the narrower section goes
 * first: its heavy tiles then start while whole sections are still to
 * come, while put last they are among the last to start with too few
 * CTAs around them to fill the other SMs (a greedy simulation of 132 SMs
 * over H = 8 to 64, c = 1024 to 16384: the narrow section last costs up to
 * 21% over the average load, first at most 3%; docs/KERNELS.md).
 * section = 1 is one unit after another. Consecutive units of one batch are
 * consecutive heads: GQA groups stay together.
 *
 * Block `block` (0 <= block < n_ranks * n_units) runs tile rank *rank of
 * unit *unit; every (rank, unit) pair exactly once. */
DT_MMA_HD void dt_mma_sched(int64_t block, int64_t n_ranks, int64_t n_units, int64_t section,
                            int64_t *rank, int64_t *unit) {
    /* the first section's width: 1 .. section */
    const int64_t first = n_units - (n_units - 1) / section * section;
    if (block < n_ranks * first) {
        *rank = block / first;
        *unit = block % first;
        return;
    }
    const int64_t j = block - n_ranks * first, per = n_ranks * section;
    const int64_t s = j / per, k = j - s * per;
    *rank = k / section;
    *unit = first + s * section + k % section;
}

/* Units per section: as many as fit their re-read bytes (unit_bytes each,
 * > 0) in half of an L2 of l2_bytes (the rest for everything else the
 * kernel streams), at least 1, at most n_units. */
DT_MMA_HD int64_t dt_mma_sched_section(int64_t n_units, int64_t unit_bytes, int64_t l2_bytes) {
    int64_t s = unit_bytes > 0 ? (l2_bytes / 2) / unit_bytes : n_units;
    if (s > n_units) s = n_units;
    return s < 1 ? 1 : s;
}

/* ------------------------------------------- division by a launch's constants
 *
 * A kernel's index math divides by values fixed for the launch (the
 * section widths above, the heads, the GQA group, the key segment's
 * stride). As 64-bit divisions they cost a CTA thousands of cycles per
 * query tile: nvcc emits each as a test for 32-bit operands and a div.u32,
 * a chain of about 20 dependent instructions (float reciprocal, multiplies,
 * corrections), and a forward CTA makes about a dozen at each query tile's
 * start, on the path to its first product. The host makes each divisor
 * once into a multiplier and a shift (Granlund and Montgomery, "Division by
 * invariant integers using multiplication", 1994, the round-up method with
 * a 33-bit multiplier 2^32 + mul): q = (mulhi(n, mul) + n) >> shift, exact
 * for every n < 2^32 and d >= 1 (tests/test_attention.c checks it against
 * `/`), two dependent instructions and an add. */
typedef struct dt_udiv {
    uint32_t d, mul, shift;
} dt_udiv;

/* The divisor d (>= 1): shift = ceil(log2 d), mul = floor(2^32 (2^shift -
 * d) / d) + 1, which fits in 32 bits (2^shift < 2 d, and mul = 1 when d is
 * a power of 2). d = 0, where a launch has nothing to divide (no query
 * rows, say), is made as 1. */
DT_MMA_HD dt_udiv dt_udiv_of(uint32_t d) {
    dt_udiv v;
    if (d == 0) d = 1;
    uint32_t shift = 0;
    while (shift < 32 && ((uint64_t)1 << shift) < d) shift++;
    v.d = d;
    v.shift = shift;
    v.mul = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << shift) - d)) / d + 1);
    return v;
}
/* n / v.d and n % v.d, n < 2^32. */
DT_MMA_HD uint32_t dt_udiv_q(uint32_t n, dt_udiv v) {
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, v.mul);
#else
    const uint32_t t = (uint32_t)(((uint64_t)n * v.mul) >> 32);
#endif
    return (uint32_t)(((uint64_t)t + n) >> v.shift);
}
DT_MMA_HD uint32_t dt_udiv_r(uint32_t n, dt_udiv v) { return n - dt_udiv_q(n, v) * v.d; }

/* dt_mma_sched's order, its divisions made by multiplication: the order of
 * n_ranks x n_units blocks (at most 2^32 - 1) with `section` units per
 * section. dt_mma_order_at gives what dt_mma_sched gives (tests/
 * test_attention.c compares them block by block). */
typedef struct dt_mma_order {
    uint32_t ranks;                /* n_ranks */
    dt_udiv first, section;        /* the first section's width; section */
    dt_udiv per;                   /* n_ranks x section: the blocks of a later section */
} dt_mma_order;

DT_MMA_HD dt_mma_order dt_mma_order_of(int64_t n_ranks, int64_t n_units, int64_t section) {
    dt_mma_order o;
    o.ranks = (uint32_t)n_ranks;
    o.first = dt_udiv_of((uint32_t)(n_units - (n_units - 1) / section * section));
    o.section = dt_udiv_of((uint32_t)section);
    o.per = dt_udiv_of((uint32_t)(n_ranks * section));
    return o;
}
DT_MMA_HD void dt_mma_order_at(const dt_mma_order *o, uint32_t block, uint32_t *rank,
                               uint32_t *unit) {
    const uint32_t head = o->ranks * o->first.d;   /* the first section's blocks */
    if (block < head) {
        *rank = dt_udiv_q(block, o->first);
        *unit = dt_udiv_r(block, o->first);
        return;
    }
    const uint32_t j = block - head, k = dt_udiv_r(j, o->per);
    *rank = dt_udiv_q(k, o->section);
    *unit = o->first.d + dt_udiv_q(j, o->per) * o->section.d + dt_udiv_r(k, o->section);
}

/* dt_attn_keys_upto (mask.h) for one key segment whose positions span at
 * most 2^32 - 1 (pos(len - 1) - start: dt_mma_keys_fit; the tensor-core
 * kernels' block checks ask for it), its division by the stride made by
 * multiplication: once the rows past the segment's last key are taken out
 * (they see all len keys) the offset from start it divides is below the
 * span. A segment without a jump has jump = gap = 0 and cap = len, so the
 * one division serves both of mask.h's cases. dt_mma_keys_upto gives what
 * dt_attn_keys_upto gives (tests/test_attention.c). */
typedef struct dt_mma_keys {
    int64_t start;              /* k.start */
    uint32_t span;              /* pos(len - 1) - start */
    uint32_t jump, gap;         /* row split's offset (split stride + gap) and the gap; 0, 0: none */
    int32_t len, split, full;   /* k.len (below 2^31 in the kernels), k.split; the mask is DT_ATTN_FULL */
    dt_udiv stride;
} dt_mma_keys;

DT_MMA_HD int dt_mma_keys_fit(dt_attn_segment k) {
    if (k.len <= 1) return 1;
    if (k.stride > (int64_t)UINT32_MAX / (k.len - 1) || k.gap > (int64_t)UINT32_MAX) return 0;
    return dt_attn_pos(k, k.len - 1) - k.start <= (int64_t)UINT32_MAX;
}
DT_MMA_HD dt_mma_keys dt_mma_keys_of(dt_attn_mask mask, dt_attn_segment k) {
    dt_mma_keys v;
    const int jumps = k.gap > 0 && k.split < k.len;   /* a row at or past split exists */
    v.start = k.start;
    v.span = k.len > 1 ? (uint32_t)(dt_attn_pos(k, k.len - 1) - k.start) : 0u;
    v.jump = jumps ? (uint32_t)(dt_attn_pos(k, k.split) - k.start) : 0u;
    v.gap = jumps ? (uint32_t)k.gap : 0u;
    v.len = (int32_t)k.len;
    v.split = jumps ? (int32_t)k.split : (int32_t)k.len;
    v.full = mask == DT_ATTN_FULL;
    v.stride = dt_udiv_of(k.len > 1 ? (uint32_t)k.stride : 1u);   /* unused when len <= 1 */
    return v;
}
DT_MMA_HD int32_t dt_mma_keys_upto(const dt_mma_keys *v, int64_t p) {
    if (v->full) return v->len;
    if (p < v->start) return 0;
    const int64_t d = p - v->start;
    if (d >= (int64_t)v->span) return v->len;
    /* unsigned: in the jump's hole e / stride + 1 may pass 2^31 (capped at split) */
    const uint32_t e = (uint32_t)d, past = e >= v->jump;   /* at or past row split's offset */
    const uint32_t n = dt_udiv_q(past ? e - v->gap : e, v->stride) + 1;
    const uint32_t cap = (uint32_t)(past ? v->len : v->split);
    return (int32_t)(n < cap ? n : cap);
}

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_MMA_LAYOUT_H */
