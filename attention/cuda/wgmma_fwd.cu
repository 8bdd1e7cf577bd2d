/* attention/cuda/wgmma_fwd.cu — the Hopper forward block kernel: warpgroup
 * MMA (wgmma, sm_90a) for bf16 and fp16, head dims 64 and 128. Auto's
 * first choice on compute capability 9.0, in the form block.cu's table of
 * verified paths names; the portable mma.sync kernel (mma_fwd.cu) where
 * this one cannot run the block. Two forms (kernels.h's dt_attn_form):
 * their exponentials, exp2f (VERIFIED) or exp2_ftz where ptxas fits it
 * (LATEST), are the only difference. Tested on the CPU emulator of CUDA (tests/emu,
 * test_mma_emu: ring, striped and zigzag blocks against the double
 * reference) and on H100 and H200 GPUs. Its speed is in
 * docs/PERFORMANCE.md; its design in docs/KERNELS.md ("The wgmma
 * forward").
 *
 * Contract: dt_attn_kernels.fwd of block.h, as mma_fwd.cu: one query
 * segment against one key/value segment, GQA, the position mask of mask.h,
 * the fp32 running max m, sum l and unnormalised output acc of each query
 * row merged with the block's own at the end and written back (fused
 * accumulation; common.cuh's start_rows and write_rows).
 *
 * Work split. A query tile per (128 query rows, head, batch), taken in the
 * order of mma_layout.h (the last query tiles, the most keys under a
 * causal mask, of a section of heads first). Persistent where a block has
 * more query tiles than the SMs hold CTAs (dt_attn_wgmma_fwd's sms and
 * queue): as many CTAs as they hold, CTA i taking tile i first and its
 * next ones from a queue (wg_next: two counters that every launch leaves
 * at 0, no clear between launches), each when it starts the last key tile
 * of its current one, so that the next tile's first loads fly during that
 * key tile's math and the rows' merge and write-back (greedy
 * longest-first scheduling, as the GPU's block scheduler does for a CTA
 * per tile, without a CTA's start and first loads per tile). Otherwise,
 * and beside a ring transfer (block.h's transfer: persistent CTAs would
 * hold every SM until the block ends, and the transfer's copy blocks or
 * NCCL kernel would wait for them, as FlashAttention-3 leaves its
 * sm_margin free for), a CTA per query tile.
 *
 * Dependent launch. A block after a call's first is launched as a
 * programmatic dependent of the block before it (dt_attn_wgmma_fwd's
 * dependent; compute capability 9.0): every CTA runs
 * griddepcontrol.launch_dependents at its start, so the next block's
 * CTAs take SMs as this block's leave them, filling the end of its
 * launch; they load their first query tile and run all its key tiles but
 * the last, and wait for this block (griddepcontrol.wait, grid_dep_wait)
 * only there, before a ticket of the shared queue (thread 0 takes it while
 * the last key tile's loads are issued, and the CTA's barriers hold the
 * other threads), and before merging their rows with the stored state, which
 * is why the rows start empty and merge at the end instead of being read
 * at the start. Every thread waits before it exits, so that a block
 * completes after the block before, as the next one's wait needs. What
 * such a block reads before its wait (q, k, v) was written before the
 * call's first block, or came by an event the stream waited for (the
 * ring's next K, V). With the rows' waits (block.h's visits; dependent
 * launch mode 2) each warp waits instead for its 16 rows' count
 * (common.cuh's rows_wait, rows_done), no thread for the grid before,
 * and such a block runs a CTA per query tile (launch() says why).
 *
 * A CTA of two warpgroups
 * (256 threads) owns BM = 128 query rows, warpgroup w rows 64w .. 64w+63
 * (its warp v rows 16v .. 16v+15 of those, the mma.sync kernel's per-warp
 * fragment layout); key tiles of BN = 128. Per key tile, each warpgroup:
 *   S[64x128] = Q K^T   wgmma m64n128k16, A = Q and B = K from shared
 *                       memory (K-major), D/16 k-steps chained, one commit
 *   online softmax      common.cuh's, on the same per-warp layout
 *   O[64xD]  += P V     wgmma m64nDk16, A = P from registers (the S
 *                       accumulators rounded to T), B = V from shared memory
 *                       (MN-major: V is stored [key][d]), 8 k-steps chained
 * with O in fp32 registers throughout. The two warpgroups take turns on
 * the tensor cores (FlashAttention-3's ping-pong, two named barriers): per
 * tile S of 0, S of 1 beside 0's softmax, PV of 0 beside 1's softmax, PV of
 * 1. A warpgroup whose rows see none of a
 * tile's keys (the first 64 rows of a diagonal tile, or rows past the
 * segment) skips the tile's math, and at D = 128 one whose rows see only
 * the first 64 keys of their last tile (the diagonal tile's first 64 rows
 * under an aligned causal mask, a segment's last 64 keys or fewer) runs
 * both products of that tile on those 64 keys (narrow below: a quarter of
 * a diagonal tile's tensor work, the same sums); the mask and skipping
 * rules are the mma.sync kernel's (mask.h, closed form), with BN = 128.
 * Documents and windows (block.h's docs, window), in the LATEST form only,
 * run in a simpler kernel of their own (fwd_wgmma_rule_kernel: a CTA per
 * query tile, thread 0's loads, no ping-pong; the VERIFIED form's launch
 * refuses such a block with DT_ERR_NOT_SUPPORTED), with the mma.sync
 * kernel's rule design (common.cuh, "documents and windows").
 *
 * Shared memory: [Q 0][Q 1][K stage 0][K stage 1][V stage 0][V stage 1],
 * each in ptx_sm90.cuh's 128-byte swizzled column-block layout (a Q
 * buffer at D = 128 as each warpgroup's 64 rows in a tile of their own,
 * wg_load_first), (2 BM + 4 BN) D 2 bytes (96 KiB at D = 64, 192 KiB at D =
 * 128), then eight mbarriers (full, empty, pub and qfree, two each) and
 * four words, plus 1 KiB to put the
 * first tile on a 1024-byte boundary of the shared window. A CTA's query
 * tiles take the Q buffers in turn, its key tiles (over all its query
 * tiles) the stages.
 * Loads: TMA (cp.async.bulk.tensor), issued by thread 0 (or the producer
 * warpgroup's first thread), one box of 64
 * columns x BM or BN rows per column block, through 4-D tensor maps of the
 * block's q, k and v segments made on the host for each launch: the map's
 * row count is the segment's length, so rows past it arrive as zeros, and
 * the box lands in exactly the swizzled layout wgmma reads (TMA's 128-byte
 * swizzle is the same address-bit XOR). Stage s's tiles complete on
 * mbarrier full[s], a query tile's Q with its first key tile; the next key
 * tile's TMA (the next query tile's first, with its Q, after a query
 * tile's last) is issued during a key tile's math and flies beside it,
 * into the stage the key tile before used, once every thread is done with
 * it: at D = 128 each thread arrives on that stage's mbarrier empty[s]
 * after its math and thread 0 waits there once its warpgroup's first
 * product of the tile is issued, so that the warpgroups keep their
 * ping-pong from tile to tile; at D = 64 (two CTAs per SM cover each
 * other's waits, and 128 registers leave no room for the rest) a
 * __syncthreads after each key tile. A query tile's last key tile's
 * release frees its Q buffer too, for the TMA two query tiles on (with
 * the producer, an arrival of every thread on qfree). TMA writes through
 * the async proxy, which wgmma reads through: no proxy fence. A wait that
 * does not complete within 10 s traps (a failed launch, never a hung GPU).
 *
 * ptxas (sm_90a, CUDA 13.0), both forms: 128 registers at D = 64 (two
 * CTAs per SM: launch bounds), 252 at D = 128 (whose warpgroups load their
 * rows' stored state before their last product's wait: EARLY below), no
 * spills, no serialised wgmma; with the producer warpgroup 168 at the
 * entry, 232 for the consumers and 40 for the producer (setmaxnreg), no
 * spills. The batch and kv head of the current tile sit in shared memory
 * for thread 0's loads instead of in every thread's registers (at D = 64
 * they spilled). A
 * tile's index math divides by multiplication (common.cuh's
 * dt_mma_grid, made on the host).
 *
 * The overlapped order (OV below; D = 128): the warpgroups do not meet
 * after a query tile, so one merges and writes its rows back while the
 * other computes, and one query tile's end overlaps the next one's start.
 * The producer warpgroup (PRODUCER below; the default at D = 128) takes
 * every load and the tile queue off thread 0, so that no consumer thread
 * waits for a release or a ticket (FlashAttention-3's warp
 * specialisation). Not tried yet: a third stage; the overlap of a tile's
 * S with the previous tile's P V inside a warpgroup.
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

constexpr int WG_BM = DT_WGMMA_BM;    /* query rows per CTA: 64 per warpgroup */
constexpr int WG_RM = WG_BM / 2;      /* a warpgroup's query rows */
/* The rows of a Q buffer's column blocks and of the q map's boxes: at D =
 * 128 each warpgroup's 64 rows a tile of their own (wg_load_first), at D =
 * 64 (one column block) the two tiles one box of 128 rows. */
template <int D>
__host__ __device__ constexpr int wg_q_box() { return D == 64 ? WG_BM : WG_RM; }
constexpr int WG_BN = DT_WGMMA_BN;    /* keys per tile */
constexpr int WG_THREADS = 256;       /* two warpgroups */

/* The tensor maps of one block (TMA): q [B][nq][H][D], k and v
 * [B][nk][G][D] as 4-D maps {D, heads, rows, batch} with the segment's rows
 * only, so that the rows past its end arrive as zeros; boxes of 64 columns
 * (128 bytes, the 128-byte swizzle's row) x 1 head x a warpgroup's 64
 * query rows or BN key rows. */
struct wg_params {
    CUtensorMap q, k, v;
    dt_attn_block_args a;
    dt_mma_grid grid;  /* the launch's index math (common.cuh) */
    uint32_t tiles;    /* query tiles of the block: ceil(nq / BM) x heads x batch */
    uint32_t *queue;   /* the tile queue (wg_next); NULL: a CTA per tile */
};

#ifndef DT_WGMMA_STUB

/* Key tiles with at least one key at or below `limit` keys, and those with
 * every key below it (mma_layout.h's dt_mma_key_tiles / unmasked_tiles for
 * BN = 128). */
__device__ __forceinline__ int wg_key_tiles(int64_t limit) { return (int)((limit + WG_BN - 1) / WG_BN); }
__device__ __forceinline__ int wg_unmasked_tiles(int64_t limit) { return (int)(limit / WG_BN); }

/* A width of a product's N (or its keys) as a type, for the generic
 * lambdas that issue and wait for a product of either width. */
template <int N>
struct wg_n {
    static constexpr int value = N;
};

/* The key tiles of a CTA's query tile c: those its last row sees. */
__device__ __forceinline__ int wg_tiles_of(const wg_params &p, const fwd_cta &c) {
    return wg_key_tiles(dt_mma_keys_upto(&p.grid.keys, dt_attn_pos(p.a.qseg, c.x1 - 1)));
}

/* Thread 0: key tile kt of batch bi, kv head gi into a stage (K at sk, V
 * at sv) on mbarrier *bar, which expects them and `more` bytes besides. */
template <int D>
__device__ __forceinline__ void wg_load_kv(const wg_params &p, int bi, int gi, int kt,
                                           unsigned char *sk, unsigned char *sv, uint64_t *bar,
                                           int more) {
    constexpr int TILE_KV = WG_BN * D * 2;
    mbar_arrive_expect_tx(bar, 2 * TILE_KV + more);
    const int slots = (int)p.a.kv_slots;   /* > 1: keys interleaved (make_map) */
#pragma unroll
    for (int cb = 0; cb < D / 64; cb++) {
        if (slots > 1) {
            const int r0 = kt * (WG_BN / slots);
            tma_load_5d(sk + cb * WG_BN * 128, &p.k, 64 * cb, gi, 0, r0, bi, bar);
            tma_load_5d(sv + cb * WG_BN * 128, &p.v, 64 * cb, gi, 0, r0, bi, bar);
        } else {
            tma_load_4d(sk + cb * WG_BN * 128, &p.k, 64 * cb, gi, kt * WG_BN, bi, bar);
            tma_load_4d(sv + cb * WG_BN * 128, &p.v, 64 * cb, gi, kt * WG_BN, bi, bar);
        }
    }
}

/* Thread 0: query tile c's queries into Q buffer sq and its first key
 * tile into a stage, all on *bar, if it has a key tile. The buffer holds
 * warpgroup w's 64 rows at sq + w TILE_Q / 2, each warpgroup's a tile of
 * its own (column blocks of 64 rows). */
template <int D>
__device__ __forceinline__ void wg_load_first(const wg_params &p, const fwd_cta &c,
                                              unsigned char *sq, unsigned char *sk,
                                              unsigned char *sv, uint64_t *bar) {
    constexpr int TILE_Q = WG_BM * D * 2;
    if (wg_tiles_of(p, c) == 0) return;
    wg_load_kv<D>(p, (int)c.b, (int)c.g, 0, sk, sv, bar, TILE_Q);
    if constexpr (D == 64) {   /* one column block: the warpgroups' tiles are one box */
        tma_load_4d(sq, &p.q, 0, (int)c.h, (int)c.x0, (int)c.b, bar);
    } else {
#pragma unroll
        for (int w = 0; w < 2; w++)
#pragma unroll
            for (int cb = 0; cb < D / 64; cb++)
                tma_load_4d(sq + w * (TILE_Q / 2) + cb * WG_RM * 128, &p.q, 64 * cb, (int)c.h,
                            (int)c.x0 + WG_RM * w, (int)c.b, bar);
    }
}


/* Thread 0: the CTA's next query tile, published in *slot for every
 * thread after the next __syncthreads (or, with pub, by an arrival on the
 * mbarrier *pub once it is written: the overlapped order), and its first
 * key tile with its
 * queries loaded into Q buffer sq and the stage at sk, sv, if it has one.
 * The CTA's first is tile blockIdx.x; the next ones come from the queue,
 * tiles gridDim.x on in the launch order; none (the block's tile count)
 * without a queue or once it is empty. The queue: queue[0] counts the
 * tiles taken from it, queue[1] the CTAs that found it empty; both are 0
 * when a launch starts, and the last CTA to find it empty sets them to 0
 * again, so that the next launch finds them so without a clear between
 * (which would come between this grid and its programmatic dependent).
 * Its tickets are taken only after grid_dep_wait: the grid before (on the
 * same queue) has then completed, its reset included. Every CTA finds the
 * queue empty exactly once, after its last ticket; the fences order each
 * CTA's tickets before its count, and the counts before the reset. */
__device__ __forceinline__ uint32_t wg_ticket(const wg_params &p, bool first) {
    if (first) return blockIdx.x;
    if (!p.queue) return p.tiles;
    grid_dep_wait();
    const uint32_t next = gridDim.x + atomicAdd(&p.queue[0], 1u);
    if (next < p.tiles) return next;
    __threadfence();
    if (atomicAdd(&p.queue[1], 1u) == gridDim.x - 1) {
        __threadfence();
        p.queue[0] = 0;
        p.queue[1] = 0;
    }
    return p.tiles;
}
template <int D>
__device__ __forceinline__ void wg_next(const wg_params &p, bool first, uint32_t *slot,
                                        unsigned char *sq, unsigned char *sk, unsigned char *sv,
                                        uint64_t *bar, uint64_t *pub = nullptr) {
    const uint32_t next = wg_ticket(p, first);
    *slot = next;
    if (pub) mbar_arrive(pub);   /* release: the slot's write before the arrival */
    if (next < p.tiles)
        wg_load_first<D>(p, fwd_cta_of(p.a, p.grid, next, WG_BM), sq, sk, sv, bar);
}

/* The producer warpgroup's first thread (PRODUCER, D = 128): every load of the CTA
 * and its tile queue, so that no consumer thread stops its math for them.
 * Query tile n (the CTA's n-th, the first blockIdx.x, the next ones from
 * wg_ticket, taken once the last key tile of the one before is issued)
 * goes into Q buffer n % 2, its index into slot next[(n % 2) ^ 1],
 * published by an arrival on pub[(n % 2) ^ 1] (phase n / 2), both once
 * every consumer has arrived on qfree[n % 2] for query tile n - 2 (done
 * with that Q buffer, and long past reading the slot). Key tile f of the
 * CTA goes into stage f % 2 once every consumer has released key tile f -
 * 2 there (empty[f % 2], phase f / 2 - 1), and lands on full[f % 2]. The
 * index past the last tile ends both sides. */
template <int D>
__device__ __forceinline__ void wg_produce(const wg_params &p, unsigned char *sq, unsigned char *sk,
                                           unsigned char *sv, uint64_t *full, uint64_t *empty,
                                           uint64_t *pub, uint64_t *qfree, uint32_t *next) {
    constexpr int TILE_Q = WG_BM * D * 2, TILE_KV = WG_BN * D * 2;
    uint32_t f = 0;
    for (uint32_t n = 0;; n++) {
        const uint32_t buf = n & 1u, tile = wg_ticket(p, n == 0);
        if (n >= 2) mbar_wait(&qfree[buf], ((n - 2) >> 1) & 1u);
        next[buf ^ 1] = tile;
        mbar_arrive(&pub[buf ^ 1]);   /* release: the slot's write before the arrival */
        if (tile >= p.tiles) return;
        const fwd_cta c = fwd_cta_of(p.a, p.grid, tile, WG_BM);
        const int n_tiles = wg_tiles_of(p, c);
        for (int kt = 0; kt < n_tiles; kt++, f++) {
            const uint32_t st = f & 1u;
            if (f >= 2) mbar_wait(&empty[st], ((f - 2) >> 1) & 1u);
            if (kt == 0)
                wg_load_first<D>(p, c, sq + buf * TILE_Q, sk + st * TILE_KV, sv + st * TILE_KV, &full[st]);
            else
                wg_load_kv<D>(p, (int)c.b, (int)c.g, kt, sk + st * TILE_KV, sv + st * TILE_KV, &full[st], 0);
        }
    }
}

#endif /* !DT_WGMMA_STUB */

/* CTAs per SM: the kernel's launch bounds, and a persistent launch's CTAs
 * per SM. */
template <int D>
constexpr int wg_ctas_per_sm() { return D == 64 ? 2 : 1; }

/* Threads of a CTA: two warpgroups, and with PRODUCER the producer's. Its
 * registers per thread, and the consumers' (setmaxnreg): the 168 that
 * ptxas gives the 384 threads of one CTA per SM are moved to the
 * consumers, within each SM sub-partition's 16,384 registers (its three
 * warps: two consumers' and one producer's, 2 x 232 + 40 = 504 x 32 =
 * 16,128). */
template <int PRODUCER>
constexpr int wg_threads() { return PRODUCER > 0 ? WG_THREADS + 128 : WG_THREADS; }
constexpr int WG_PRODUCER_REGS = 40, WG_CONSUMER_REGS = 232;

/* grid: a CTA per query tile (ceil(qseg.len / 128) x heads x batch), or
 * fewer, persistent, with p.queue; tiles in mma_layout.h's launch order
 * (p.grid.order); block: wg_threads<PRODUCER>() threads; dynamic shared
 * memory 1024 + (2 BM + 4 BN) D sizeof(T) + 80. PRODUCER: the loads by a
 * producer warpgroup (1, at D = 128; the same kernel at D = 64) or thread
 * 0's (0). F: the form (kernels.h's dt_attn_form: the exponentials); NF:
 * the LATEST form's instance for a block with non-finite inputs (block.h's
 * nonfinite: common.cuh's online_softmax and write_rows keep the rules). */
template <typename T, int D, int PRODUCER, dt_attn_form F, bool NF>
__global__ void __launch_bounds__(wg_threads<PRODUCER>(), wg_ctas_per_sm<D>()) fwd_wgmma_kernel(const __grid_constant__ wg_params p) {
    static_assert(!NF || F == DT_ATTN_FORM_LATEST, "only LATEST forms keep the non-finite rules");
#ifdef DT_WGMMA_STUB
    (void)p;
    __trap();   /* never launched: the host requires an sm_90a build and a 9.0 device */
#else
    const dt_attn_block_args &a = p.a;
    constexpr int NT = WG_BN / 8;                                      /* n-tiles of S */
    constexpr int TILE_Q = WG_BM * D * 2, TILE_KV = WG_BN * D * 2;   /* bytes */
    /* How a stage is released for its next load. At D = 128 by its empty
     * barrier, which thread 0 waits for once warpgroup 0's first product of
     * the tile is issued (the tensor cores work on it, and on warpgroup 1's
     * last product of the tile before, meanwhile): the warpgroups keep their
     * ping-pong from tile to tile. At D = 64 by a __syncthreads after each
     * tile, the load issued before the tile's first product: there the
     * producer's code beside the S accumulators, or the loop without that
     * barrier, would not fit in the 128 registers of two CTAs per SM (ptxas
     * spills), and the other CTA's math covers the barrier's wait. */
    constexpr bool RELEASE = D == 128;
    /* The overlapped order (D = 128; at D = 64 the warpgroups meet after
     * every key tile, RELEASE says why): the warpgroups do not meet after a
     * query tile's last key tile.
     * Warpgroup 0 merges and writes its rows back while warpgroup 1 runs
     * its last products, then starts the next query tile's first while
     * warpgroup 1 writes its rows: the turns go on from one query tile to
     * the next (warpgroup 1 gives the first turn once, at the CTA's start;
     * warpgroup 0 takes the turn left over at its end), and the next query
     * tile's index reaches every thread by the mbarrier pub (thread 0
     * arrives once it has written the slot, during the last key tile; every
     * thread waits there before it releases that tile's stage, so that no
     * thread is two publications behind). Tiles without keys still meet
     * (a __syncthreads). */
    constexpr bool OV = RELEASE;
    /* The producer warpgroup (PRODUCER, dt_attn_wgmma_fwd's producer; D =
     * 128 only): a third warpgroup, whose first thread issues every load and
     * takes the queue's tickets (wg_produce), where thread 0 did so between
     * its warpgroup's products, so that no consumer thread waits for a
     * stage's release, a ticket's atomic or the next tile's index math
     * (FlashAttention-3's warp specialisation). A whole warpgroup, so that
     * setmaxnreg can give its registers to the consumers (wg_threads). The
     * consumers take each query tile's index from its slot once pub has
     * published it, and release its Q buffer on qfree; a tile without keys
     * needs no meeting. */
    constexpr bool PW = PRODUCER > 0 && RELEASE;
    DT_DYNAMIC_SMEM(unsigned char, smem_raw);
    unsigned char *const sq = smem_raw + ((1024u - (wg_smem_addr(smem_raw) & 1023u)) & 1023u);
    unsigned char *const sk = sq + 2 * TILE_Q;   /* Q buffer b at sq + b TILE_Q */
    unsigned char *const sv = sk + 2 * TILE_KV;  /* stage s at sk + s TILE_KV, sv + s TILE_KV */
    uint64_t *const full = reinterpret_cast<uint64_t *>(sv + 2 * TILE_KV);  /* [2] */
    uint64_t *const empty = full + 2;                                        /* [2] */
    uint64_t *const pub = empty + 2;     /* [2]: publications of next (OV: pub[0] alone) */
    uint64_t *const qfree = pub + 2;     /* [2]: PW, the Q buffers' releases */
    uint32_t *const next = reinterpret_cast<uint32_t *>(qfree + 2);          /* [2] */
    /* Thread 0's alone, read where needed instead of held in registers */
    volatile int *const at = reinterpret_cast<volatile int *>(next + 2);      /* [2] */

    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int wg = warp >> 2, wl = warp & 3;   /* warpgroup, warp within it */

    /* Stage s's K and V tiles land on mbarrier full[s] (one arrival: thread
     * 0's expect_tx, plus the TMA bytes) and are released on empty[s] (an
     * arrival of every thread once its math on them is done); the n-th use
     * of a stage completes phase n of both. The CTA's key tiles, over all
     * its query tiles, go through the stages in turn: its f-th in stage
     * f % 2, use f / 2. Its query tiles go through the two Q buffers in
     * turn, the ti-th in buffer ti % 2. Thread 0 issues every TMA, a query
     * tile's first key tile with the query tile itself, during the previous
     * query tile's last key tile (PW: the producer, wg_produce, as soon as
     * the buffers are free). The tensor maps go into the SM's descriptor
     * cache first (a hint, beside the set-up before the first loads). */
    if (threadIdx.x == 0) {
        tma_prefetch_map(&p.q);
        tma_prefetch_map(&p.k);
        tma_prefetch_map(&p.v);
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        if (RELEASE) {
            mbar_init(&empty[0], WG_THREADS);
            mbar_init(&empty[1], WG_THREADS);
        }
        if (OV || PW) mbar_init(&pub[0], 1);
        if (PW) {
            mbar_init(&pub[1], 1);
            mbar_init(&qfree[0], WG_THREADS);
            mbar_init(&qfree[1], WG_THREADS);
        }
        fence_mbar_init();
        if (!PW) wg_next<D>(p, true, &next[1], sq, sk, sv, &full[0]);
    }
    /* The next block's grid may start: its CTAs take SMs as this grid's
     * leave them, and run their first tile's keys before they wait for
     * this grid (grid_dep_wait: before a ticket of the queue, and before
     * the rows' merge). */
    grid_dep_launch();
    __syncthreads();
    if constexpr (PW) {
        if (wg == 2) {   /* the producer */
            setmaxnreg_dec<WG_PRODUCER_REGS>();
            if (threadIdx.x == WG_THREADS) wg_produce<D>(p, sq, sk, sv, full, empty, pub, qfree, next);
            grid_dep_exit(p.a);   /* every thread, before it exits (below) */
            return;
        }
        setmaxnreg_inc<WG_CONSUMER_REGS>();
    }

    /* Named barrier TURN + w is "warpgroup w's turn" (the ping-pong below) */
    constexpr int TURN = 1, PAIR = WG_THREADS;
    if (OV && wg == 1) bar_arrive<TURN>(0, PAIR);   /* the first turn, once */
    uint32_t pubs = 0;   /* OV: the publications this thread has waited for */
    /* f: key tiles so far (stage f % 2, the use's parity (f / 2) % 2); ti:
     * query tiles so far, mod 2. Query tile ti's index is in next[ti ^ 1]
     * (the first's in next[1]): thread 0 writes it during tile ti - 1's last
     * key tile (or at once for a tile without keys, or before the first
     * __syncthreads) and every thread reads it after that tile's last
     * __syncthreads; the slot's next write is during tile ti + 1, past
     * another. */
    uint32_t f = 0;
    uint32_t ti = 0;
    for (;; ti ^= 1) {
        /* PW: published by the producer (pubs: the query tiles so far) */
        if (PW) mbar_wait(&pub[ti ^ 1], (pubs++ >> 1) & 1u);
        const uint32_t tile = next[ti ^ 1];
        if (tile >= p.tiles) break;
        cta_trace(a, 0, 0, tile);
        const fwd_cta c = fwd_cta_of(a, p.grid, tile, WG_BM);
        const int64_t x0 = c.x0, x1 = c.x1;
        if (!PW && threadIdx.x == 0) {   /* its batch and kv head, for thread 0's loads */
            at[0] = (int)c.b;
            at[1] = (int)c.g;
        }
        /* Key tiles of the query tile (uniform: the loads and barriers) and
         * of this warpgroup (uniform over it: its wgmma). */
        const int n_tiles = wg_tiles_of(p, c);
        const int64_t w0 = x0 + 64 * wg, w1 = w0 + 64 < x1 ? w0 + 64 : x1;
        /* its limits: at D = 64 by mask.h's division, with which ptxas
         * fits the kernel in its 128 registers (with dt_mma_keys_upto it
         * spilled 8 bytes) */
        const auto limit = [&](int64_t x) -> int64_t {
            if constexpr (D == 64) return dt_attn_keys_upto(a.mask, a.kseg, dt_attn_pos(a.qseg, x));
            else return dt_mma_keys_upto(&p.grid.keys, dt_attn_pos(a.qseg, x));
        };
        const int64_t wg_limit = w0 < x1 ? limit(w1 - 1) : 0;
        const int wg_tiles = wg_key_tiles(wg_limit);
        const int wg_unmasked = w0 < x1 ? wg_unmasked_tiles(limit(w0)) : 0;
        /* Its rows see only the first half of their last key tile (the
         * diagonal tile's first 64 rows under an aligned causal mask): both
         * products of that tile run on those 64 keys alone, half the
         * tensor-core work, the same results. At D = 128 (at D = 64 the
         * second form of each product spilled 248 bytes at its 128
         * registers). DT_WGMMA_NARROW = 0 compiles them out. */
        constexpr bool NARROW = D == 128 && DT_WGMMA_NARROW;
        const bool wg_narrow = NARROW && wg_tiles > 0 &&
                               wg_limit - (int64_t)(wg_tiles - 1) * WG_BN <= WG_BN / 2;

        /* The lane's two query rows, their state started empty (merged with
         * the stored one at the end: common.cuh); a tile without keys
         * (every key after every query) only starts or finishes its rows
         * (a.first, a.last), or does nothing. */
        int lim[2];
        float m[2], l[2], o[D / 8][4];
        const int64_t row0 = x0 + 64 * wg + 16 * wl;   /* the warp's first row */
        start_rows<D>(a, p.grid, row0, lane, lim, m, l, o);
        if (n_tiles > 0 || a.last) prefetch_rows<D>(a, c, row0, lane);
        /* EARLY (the overlapped order): a warpgroup whose rows see the
         * query tile's last key tile issues the loads of its rows' stored
         * state before it waits for its product of that tile, which hides
         * their latency, and merges and writes its rows back once it has
         * released the tile's stage (after thread 0 has issued the next
         * query tile's loads there); the others after the key tiles, as
         * before (warpgroup 0 where its rows see one key tile fewer: its
         * rows written before that last tile would hold back thread 0's
         * loads). The loads' 68 registers took the kernel to 255 (from
         * 187; 250 with narrow tiles and the rows' waits), no spills;
         * within the producer's 232 for the consumers (setmaxnreg) they
         * spilled 212 bytes, so with the producer they are not early. */
        constexpr bool EARLY = OV && !PW;
        const bool early = EARLY && n_tiles > 0 && wg_tiles == n_tiles;
        if (!PW && n_tiles == 0) {
            /* OV: the warpgroups did not meet after the tile before; they
             * must before thread 0 refills its Q buffer and stage */
            if (OV) __syncthreads();
            if (threadIdx.x == 0)
                wg_next<D>(p, false, &next[ti], sq + (ti ^ 1) * TILE_Q, sk + (f & 1) * TILE_KV,
                           sv + (f & 1) * TILE_KV, &full[f & 1]);
            __syncthreads();
        }

        /* this warpgroup's queries (its rows of Q buffer ti): their address,
         * made from the shared window's (as the address of its rows there
         * ptxas spilled 12 bytes at D = 64) */
        const uint32_t q_addr = wg_smem_addr(sq + ti * TILE_Q) + (uint32_t)wg * (TILE_Q / 2);
        /* Ping-pong: the warpgroups take turns issuing their wgmma, so that one's
         * softmax runs while the other's products keep the tensor cores busy.
         * Named barrier TURN + w is "warpgroup w's turn": w syncs on it (its 128
         * threads) before each of its two products of a tile, the other
         * warpgroup arrives on it (its 128) after issuing each of its own. So
         * per tile: S of 0 | S of 1 beside softmax of 0 | PV of 0 beside softmax
         * of 1 | PV of 1. Warpgroup 1 opens each query tile by giving 0 the
         * first turn and leaves out its last arrival, so every phase
         * completes (OV: it opens once and never leaves it out; see there); a
         * warpgroup that skips a tile's math still takes its turns. */
        /* --trace: when the first key tile has landed, seen by thread 0,
         * which stamped the tile's start (its wait in the loop then passes
         * at once; it issues its next loads only after that wait anyway);
         * at D = 128 only (at D = 64 the marks make ptxas spill) */
        if (RELEASE && a.trace && n_tiles > 0 && threadIdx.x == 0) {
            mbar_wait(&full[f & 1], (uint32_t)(f >> 1) & 1u);
            cta_mark(a, 0, tile);
        }
        if (!OV && wg == 1 && n_tiles > 0) bar_arrive<TURN>(0, PAIR);
        for (int kt = 0; kt < n_tiles; kt++, f++) {
            const int stage = (int)(f & 1);
            /* Thread 0: the next key tile (the next query tile's first
             * after the last) into the other stage, to fly during this
             * tile's math, once every thread is done with that stage (key
             * tile f - 1; RELEASE says how). */
            const auto produce = [&] {
                if (PW || threadIdx.x != 0) return;   /* PW: the producer's */
                if (RELEASE && f > 0) mbar_wait(&empty[stage ^ 1], ((f - 1) >> 1) & 1u);
                unsigned char *const nk = sk + (stage ^ 1) * TILE_KV, *const nv = sv + (stage ^ 1) * TILE_KV;
                if (kt + 1 < n_tiles)
                    wg_load_kv<D>(p, at[0], at[1], kt + 1, nk, nv, &full[stage ^ 1], 0);
                else
                    wg_next<D>(p, false, &next[ti], sq + (ti ^ 1) * TILE_Q, nk, nv, &full[stage ^ 1],
                               OV ? pub : nullptr);
            };
            if (!RELEASE) produce();
            mbar_wait(&full[stage], (uint32_t)(f >> 1) & 1u);   /* tile kt (and Q) have landed */

            /* Each product is issued and waited for inside one branch (its
             * warpgroup's turns taken on both), which keeps ptxas from
             * serialising the wgmma (it does when an issue and its wait sit in
             * different branches). */
            const bool mine = kt < wg_tiles;   /* uniform over the warpgroup */
            const bool narrow = kt + 1 == wg_tiles && wg_narrow;   /* likewise */
            const bool pass_on = OV || wg == 0 || kt + 1 < n_tiles;
            const bool ends = early && kt + 1 == n_tiles;   /* its rows' last product */
            stored_rows<D> stored;   /* ends: the rows' stored state */
            bar_sync<TURN>(wg, PAIR);
            if (mine) {
                /* S = Q K^T: Q's 64 rows of this warpgroup (tile rows of the Q
                 * tile, BM rows per column block), the tile's first N keys
                 * (N = 128, or 64 where its rows see no more: narrow). */
                float s[NT][4];
                const uint32_t k_addr = wg_smem_addr(sk + stage * TILE_KV);
                /* The k-steps' descriptors: at D = 128 the first one's
                 * plus a constant each (wg_desc_plus); at D = 64 each
                 * made from its address (there the other form made
                 * ptxas spill at the 128 registers of two CTAs an SM).
                 * The first N keys of the tile are the first N rows of
                 * each of its column blocks: the same descriptors. */
                const uint64_t qd = wg_desc_k_major(q_addr, wg_q_box<D>(), 0), kd = wg_desc_k_major(k_addr, WG_BN, 0);
                const auto s_product = [&](auto n, float(&sn)[decltype(n)::value / 8][4]) {
                    constexpr int N = decltype(n)::value;
                    wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < D / 16; kk++) {
                        if constexpr (D == 128)
                            wgmma_ss<T, N>(sn, wg_desc_plus(qd, wg_k_major_off(wg_q_box<D>(), kk)),
                                           wg_desc_plus(kd, wg_k_major_off(WG_BN, kk)), kk > 0);
                        else
                            wgmma_ss<T, N>(sn, wg_desc_k_major(q_addr, wg_q_box<D>(), kk),
                                           wg_desc_k_major(k_addr, WG_BN, kk), kk > 0);
                    }
                    wgmma_commit();
                    if (RELEASE) produce();
                    bar_arrive<TURN>(wg ^ 1, PAIR);
                    wgmma_wait<0>();
                };
                /* narrow: the keys past the first 64, masked for every
                 * row, are 0 here and -inf after the (masked) softmax */
                if (narrow) {
                    float s_lo[NT / 2][4];
                    s_product(wg_n<WG_BN / 2>{}, s_lo);
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int i = 0; i < 4; i++) s[j][i] = j < NT / 2 ? s_lo[j][i] : 0.0f;
                } else {
                    s_product(wg_n<WG_BN>{}, s);
                }
                /* P rounded to T as A fragments (pa), by the softmax's
                 * form of it that ptxas spills none of the kernels with:
                 * VERIFIED exp2f, LATEST exp2_ftz where it fits */
                constexpr softmax_exp EXP = F == DT_ATTN_FORM_VERIFIED ? EXP2F
                                            : D == 64 ? SFU_PACKED : PRODUCER == 0 ? EXP2F : SFU;
                uint32_t pa[WG_BN / 16][4];
                if (kt < wg_unmasked)
                    online_softmax<false, NT, D, EXP, T, NF>(s, m, l, o, lim, kt * WG_BN, lane, a.scale, pa);
                else
                    online_softmax<true, NT, D, EXP, T, NF>(s, m, l, o, lim, kt * WG_BN, lane, a.scale, pa);
                if constexpr (EXP != SFU_PACKED) {
#pragma unroll
                    for (int kk = 0; kk < WG_BN / 16; kk++) p_fragment<T>(pa[kk], s, kk);
                }

                /* O += P V: V MN-major; the k-steps of the first 64 keys
                 * alone where narrow (the others' P is 0: the same sums). */
                const uint32_t v_addr = wg_smem_addr(sv + stage * TILE_KV);
                const auto pv_product = [&](auto n) {
                    constexpr int N = decltype(n)::value;
                    bar_sync<TURN>(wg, PAIR);
                    wgmma_fence();   /* o and pa were written by ordinary instructions */
#pragma unroll
                    for (int kk = 0; kk < N / 16; kk++)
                        wgmma_rs<T, D>(o, pa[kk], wg_desc_mn_major(v_addr, WG_BN, kk), 1);
                    wgmma_commit();
                    if (pass_on) bar_arrive<TURN>(wg ^ 1, PAIR);
                    if (ends) {   /* before what the grid before wrote: its wait */
                        rows_wait(a, c, row0);
                        load_rows<D>(a, c, row0, lane, stored);
                    }
                    wgmma_wait<0>();
                };
                if (narrow) pv_product(wg_n<WG_BN / 2>{});
                else pv_product(wg_n<WG_BN>{});
            } else {
                if (RELEASE) produce();
                bar_arrive<TURN>(wg ^ 1, PAIR);
                bar_sync<TURN>(wg, PAIR);
                if (pass_on) bar_arrive<TURN>(wg ^ 1, PAIR);
            }
            /* OV: next[ti], published during this last key tile, seen
             * before this thread lets thread 0 go on to the next publication */
            if (OV && !PW && kt + 1 == n_tiles) mbar_wait(&pub[0], pubs++ & 1u);
            /* this thread is done with the stage (and with Q after the last) */
            if (RELEASE) mbar_arrive(&empty[stage]);
            else __syncthreads();
            if (ends) {
                /* --trace: warpgroup 1, the later of the two, is done with
                 * the keys (its rows' last product is the tile's last) */
                if (threadIdx.x == WG_THREADS - 1) cta_mark(a, 1, tile);
                write_rows<T, D, F, NF>(a, c, row0, lane, m, l, o, stored);
                rows_done(a, c, row0, lane);
            }
        }
        /* next[ti] was written during the last key tile (at D = 64 that
         * tile's __syncthreads published it; OV: pub did; PW: the
         * producer's pub). PW: this thread is done with Q buffer ti. */
        if (PW) mbar_arrive(&qfree[ti]);
        /* --trace: warpgroup 1, the later of the two, is done with the keys
         * (with its rows written early, marked there) */
        if (OV && n_tiles > 0 && threadIdx.x == WG_THREADS - 1 && !early) cta_mark(a, 1, tile);

        /* Before it reads what the grid before wrote (the stored rows),
         * and also where it has no key for them: rows_wait (block.h's
         * visits say why); its rows counted once it is done with them. */
        if (!early) {
            /* c: at D = 64 made again (opaque says why); at D = 128 held */
            const fwd_cta e = D == 128 ? c : fwd_cta_of(a, p.grid, opaque(tile), WG_BM);
            const int64_t rows0 = e.x0 + 64 * wg + 16 * wl;
            rows_wait(a, e, rows0);
            if (n_tiles > 0 || a.first || a.last) write_rows<T, D, F, NF>(a, e, rows0, lane, m, l, o);
            rows_done(a, e, rows0, lane);
        }
        /* OV: the tile ends when warpgroup 1 (the later) has written its
         * rows; no barrier, so a traced run keeps the overlap (a tile
         * without keys: thread 0's, which stamped its start, as nothing
         * orders warpgroup 1 after that) */
        cta_trace(a, 1, n_tiles, tile, OV ? (n_tiles > 0 ? WG_THREADS - 1 : 0) : -1);
    }
    if (OV && wg == 0) bar_sync<TURN>(0, PAIR);   /* the turn warpgroup 1 left over */
    /* Every thread, before it exits: without visits this grid then
     * completes after the one before, as the next grid's own wait needs */
    grid_dep_exit(a);
#endif
}

/* Dynamic shared memory of fwd_wgmma_rule_kernel: the alignment slack, Q,
 * two stages of K and V, two mbarriers, the rows' runs (common.cuh). */
template <int D>
constexpr size_t wg_rule_smem() {
    return 1024 + (size_t)(WG_BM + 4 * WG_BN) * D * 2 + 2 * sizeof(uint64_t) +
           sizeof(rule_runs<WG_BM>);
}

/* The LATEST form with documents or a window (block.h's docs, window;
 * common.cuh, "documents and windows"), a kernel of its own: a CTA per
 * query tile of 128 rows (never persistent, no producer warpgroup, no
 * ping-pong: the order of fwd_wgmma_kernel at D = 64), warpgroup w rows
 * 64w .. 64w + 63. Thread 0 loads Q with the first key tile, and each
 * next key tile into the other stage before the current one's math; a
 * __syncthreads after each tile releases its stage. Each row's range of
 * key rows is made once; the CTA visits the key tiles of its rows' runs;
 * a warpgroup skips the math of a tile outside its rows' ranges (lo of its
 * first row to hi of its last), runs one inside all of them (lo of its
 * last row to hi of its first) without a mask, and masks the others by
 * both ends of each row's range. Marks (--trace) at D = 128, as
 * fwd_wgmma_kernel's. grid: ceil(qseg.len / 128) x heads x batch; block:
 * 256 threads; dynamic shared memory wg_rule_smem<D>(). NF as
 * fwd_wgmma_kernel's. */
template <typename T, int D, bool NF>
__global__ void __launch_bounds__(WG_THREADS, 1)
    fwd_wgmma_rule_kernel(const __grid_constant__ wg_params p) {
#ifdef DT_WGMMA_STUB
    (void)p;
    __trap();
#else
    constexpr dt_attn_form F = DT_ATTN_FORM_LATEST;
    const dt_attn_block_args &a = p.a;
    constexpr int NT = WG_BN / 8;
    constexpr int TILE_Q = WG_BM * D * 2, TILE_KV = WG_BN * D * 2;
    DT_DYNAMIC_SMEM(unsigned char, smem_raw);
    unsigned char *const sq = smem_raw + ((1024u - (wg_smem_addr(smem_raw) & 1023u)) & 1023u);
    unsigned char *const sk = sq + TILE_Q;        /* stage s at sk + s TILE_KV, sv + s TILE_KV */
    unsigned char *const sv = sk + 2 * TILE_KV;
    uint64_t *const full = reinterpret_cast<uint64_t *>(sv + 2 * TILE_KV);   /* [2] */
    rule_runs<WG_BM> &runs = *reinterpret_cast<rule_runs<WG_BM> *>(full + 2);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int wg = warp >> 2, wl = warp & 3;
    cta_trace(a, 0);
    const fwd_cta c = fwd_cta_of(a, p.grid, blockIdx.x, WG_BM);
    const dt_attn_rule rule = dt_attn_block_rule(&a, c.b);
    if (threadIdx.x == 0) {
        tma_prefetch_map(&p.q);
        tma_prefetch_map(&p.k);
        tma_prefetch_map(&p.v);
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        fence_mbar_init();
    }
    grid_dep_launch();

    /* The lane's two rows' ranges of key rows (lim: their ends), into the
     * runs' table by the quad's first lane; then the runs. */
    int lim[2], lo[2];
    float m[2], l[2], o[D / 8][4];
    const int64_t row0 = c.x0 + 64 * wg + 16 * wl;   /* the warp's first row */
    start_rows<D>(a, p.grid, row0, lane, lim, m, l, o);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int i = 64 * wg + 16 * wl + dt_mma_c_row(lane, 2 * half);
        lo[half] = lim[half] = 0;
        if (c.x0 + i < a.qseg.len)
            rule_rows(rule, 1, dt_attn_pos(a.qseg, c.x0 + i), p.grid.keys, lo[half], lim[half]);
        if ((lane & 3) == 0) {
            runs.lo[i] = lo[half];
            runs.hi[i] = lim[half];
        }
    }
    __syncthreads();
    rule_runs_build(runs, WG_BN);
    __syncthreads();
    /* the warpgroup's rows (none past the segment): some pair with keys
     * of [w_lo, w_hi), every one with those of [w_flo, w_fhi) */
    const int last = (int)(c.x1 - c.x0) - 1, w_first = 64 * wg;
    const int w_last = w_first + 63 < last ? w_first + 63 : last;
    const bool w_rows = w_first <= last;
    const int w_lo = w_rows ? runs.lo[w_first] : 0, w_hi = w_rows ? runs.hi[w_last] : 0;
    const int w_flo = w_rows ? runs.lo[w_last] : 0, w_fhi = w_rows ? runs.hi[w_first] : 0;
    int run, cur = rule_first(runs, run);
    if (cur < 0 && !a.first && !a.last) {   /* m, l, acc unchanged */
        rows_wait(a, c, row0);
        rows_done(a, c, row0, lane);
        grid_dep_exit(a);
        return cta_trace(a, 1);
    }
    int next_run = run, nxt = cur >= 0 ? rule_next(runs, next_run, cur) : -1;
    if (cur >= 0 && threadIdx.x == 0) {   /* Q with the first key tile, stage 0 */
        wg_load_kv<D>(p, (int)c.b, (int)c.g, cur, sk, sv, &full[0], TILE_Q);
        if constexpr (D == 64) {
            tma_load_4d(sq, &p.q, 0, (int)c.h, (int)c.x0, (int)c.b, &full[0]);
        } else {
#pragma unroll
            for (int w = 0; w < 2; w++)
#pragma unroll
                for (int cb = 0; cb < D / 64; cb++)
                    tma_load_4d(sq + w * (TILE_Q / 2) + cb * WG_RM * 128, &p.q, 64 * cb, (int)c.h,
                                (int)c.x0 + WG_RM * w, (int)c.b, &full[0]);
        }
    }
    prefetch_rows<D>(a, c, row0, lane);

    const uint32_t q_addr = wg_smem_addr(sq) + (uint32_t)wg * (TILE_Q / 2);
    int64_t n_tiles = 0;
    for (int stage = 0; cur >= 0; stage ^= 1, n_tiles++) {
        /* thread 0: the next key tile into the stage the tile before used
         * (free since the __syncthreads closing that tile) */
        if (nxt >= 0 && threadIdx.x == 0)
            wg_load_kv<D>(p, (int)c.b, (int)c.g, nxt, sk + (stage ^ 1) * TILE_KV,
                          sv + (stage ^ 1) * TILE_KV, &full[stage ^ 1], 0);
        mbar_wait(&full[stage], (uint32_t)(n_tiles >> 1) & 1u);   /* this tile (and Q) landed */
        if (D == 128 && n_tiles == 0 && threadIdx.x == 0) cta_mark(a, 0);
        const int y0 = cur * WG_BN;
        if (w_lo < w_hi && w_lo < y0 + WG_BN && w_hi > y0) {   /* uniform over the warpgroup */
            float s[NT][4];
            const uint32_t k_addr = wg_smem_addr(sk + stage * TILE_KV);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wgmma_ss<T, WG_BN>(s, wg_desc_k_major(q_addr, wg_q_box<D>(), kk),
                                   wg_desc_k_major(k_addr, WG_BN, kk), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            if (y0 >= w_flo && y0 + WG_BN <= w_fhi)
                online_softmax<false, NT, D, SFU, T, NF>(s, m, l, o, lim, y0, lane, a.scale);
            else
                online_softmax<true, NT, D, SFU, T, NF, true>(s, m, l, o, lim, y0, lane, a.scale,
                                                              nullptr, lo);
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
        __syncthreads();   /* every thread is done with the stage */
        cur = nxt;
        if (nxt >= 0) nxt = rule_next(runs, next_run, nxt);
    }
    if (D == 128 && n_tiles > 0 && threadIdx.x == 0) cta_mark(a, 1);

    const fwd_cta e = fwd_cta_of(a, p.grid, cta_index(), WG_BM);   /* c, made again */
    const int64_t rows0 = e.x0 + 64 * wg + 16 * wl;
    rows_wait(a, e, rows0);
    write_rows<T, D, F, NF>(a, e, rows0, lane, m, l, o);
    rows_done(a, e, rows0, lane);
    grid_dep_exit(a);
    cta_trace(a, 1, n_tiles);
#endif
}

template <typename T, int D, dt_attn_form F>
dt_status launch(cudaStream_t stream, const dt_attn_block_args *a, int64_t l2_bytes, int sms,
                 void *queue, int dependent, int producer) {
    if constexpr (F != DT_ATTN_FORM_LATEST)   /* documents and windows: LATEST only */
        if (dt_mma_ruled(*a)) return dt_mma_refuse_ruled("wgmma forward");
    wg_params p;
    memset(&p, 0, sizeof p);
    p.a = *a;
    p.grid = dt_mma_fwd_grid(*a, WG_BM, l2_bytes);
    DT_TRY(make_block_maps(*a, wg_q_box<D>(), WG_BN, &p.q, &p.k, &p.v, nullptr, nullptr,
                           a->kv_slots, a->kv_slot_rows));
    const int64_t tiles = (a->qseg.len + WG_BM - 1) / WG_BM * a->heads * a->batch;
    const int64_t resident = (int64_t)sms * wg_ctas_per_sm<D>();
    p.tiles = (uint32_t)tiles;
    int64_t ctas = tiles;
    if (queue && a->first) {   /* the call's first block: the queue's memory is new */
        const cudaError_t e = cudaMemsetAsync(queue, 0, DT_ATTN_WGMMA_QUEUE_BYTES, stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return dt_error(DT_ERR_BACKEND, "attention (cuda wgmma): forward block: clearing "
                            "its tile queue: %s", cudaGetErrorString(e));
        }
    }
    const int dep = dependent && !a->first;
    if constexpr (F == DT_ATTN_FORM_LATEST) {
        if (dt_mma_ruled(*a)) {   /* documents or a window: a CTA per query tile */
            dt_mma_rule_grid(p.grid, a->kseg);
            return dt_mma_launch(a->nonfinite ? fwd_wgmma_rule_kernel<T, D, true>
                                              : fwd_wgmma_rule_kernel<T, D, false>,
                                 dim3((unsigned)tiles), WG_THREADS, wg_rule_smem<D>(), stream,
                                 "forward (wgmma, documents and windows)", D, a->dtype, dep, p);
        }
    }
    /* persistent, unless a ring transfer needs SMs beside the block, or
     * the block waits for its rows' counts (visits) as a dependent launch:
     * its CTAs do not wait for the block before, which may still run,
     * while persistent ones share a queue with it */
    if (queue && resident > 0 && resident < tiles && !a->transfer && !(dep && a->visits)) {
        ctas = resident;
        p.queue = static_cast<uint32_t *>(queue);
    }
    /* A block that continues a call (not its first) may start while the
     * block before finishes: it reads nothing that block writes before
     * grid_dep_wait (its q, k, v were there before the call's first block
     * started, or came by an event the stream waited for). */
    const size_t smem = 1024 + (size_t)(2 * WG_BM + 4 * WG_BN) * D * sizeof(T) +
                        8 * sizeof(uint64_t) + 4 * sizeof(uint32_t);
    const dim3 grid((unsigned)ctas);
    /* with non-finite inputs, the LATEST form's instance that keeps the
     * rules (block.h's nonfinite) */
    if constexpr (D == 128) {
        if (producer) {
            auto kernel = fwd_wgmma_kernel<T, D, 1, F, false>;
            if constexpr (F == DT_ATTN_FORM_LATEST)
                if (a->nonfinite) kernel = fwd_wgmma_kernel<T, D, 1, F, true>;
            return dt_mma_launch(kernel, grid, wg_threads<1>(), smem, stream,
                                 "forward (wgmma, producer)", D, a->dtype, dep, p);
        }
    }
    auto kernel = fwd_wgmma_kernel<T, D, 0, F, false>;
    if constexpr (F == DT_ATTN_FORM_LATEST)
        if (a->nonfinite) kernel = fwd_wgmma_kernel<T, D, 0, F, true>;
    return dt_mma_launch(kernel, grid, WG_THREADS, smem, stream, "forward (wgmma)", D, a->dtype,
                         dep, p);
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

extern "C" int dt_attn_wgmma_slots_ok(char *why, size_t why_size) {
    static int verdict;   /* 0: not asked yet, 1: takes them, else the CUresult + 2 */
    int v = __atomic_load_n(&verdict, __ATOMIC_ACQUIRE);
    if (!v) {
        PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
        /* the shape of a striped ring's launch of 2 blocks of 70 rows, at a
         * 16-byte aligned address the driver only records */
        alignas(128) static const unsigned char probe[16] = {0};
        CUtensorMap map;
        const CUresult r = encode ? encode_map(encode, &map, probe, DT_BF16, 128, 2, 70, 2,
                                               2 * 70 * 2 * 128, WG_BN, 2)
                                  : CUDA_ERROR_NOT_SUPPORTED;
        v = r == CUDA_SUCCESS ? 1 : (int)r + 2;
        __atomic_store_n(&verdict, v, __ATOMIC_RELEASE);   /* racing probes store the same */
    }
    if (v != 1 && why && why_size)
        snprintf(why, why_size, "the CUDA driver refuses the wgmma kernel's tensor maps of keys "
                 "interleaved from slots (cuTensorMapEncodeTiled: CUresult %d)", v - 2);
    return v == 1;
}

extern "C" dt_status dt_attn_wgmma_fwd(void *stream, const dt_attn_block_args *a, int64_t l2_bytes,
                                      int sms, void *queue, int dependent, int producer,
                                      dt_attn_form form) {
    return dt_mma_dispatch(a->dtype, a->dim, form, [&](auto t, auto d, auto f) {
        return launch<typename decltype(t)::type, decltype(d)::value, decltype(f)::value>(
            static_cast<cudaStream_t>(stream), a, l2_bytes, sms, queue, dependent, producer);
    });
}
