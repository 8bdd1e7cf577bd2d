/* attention/mma_layout.h — PRIVATE. The index math of the tensor-core
 * forward kernel (block_cuda_mma.cu), as small pure functions of ints.
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
#include "mask.h"

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

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_MMA_LAYOUT_H */
