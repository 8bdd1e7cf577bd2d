/* attention/block.h — PRIVATE. The attention block kernels: one query
 * segment against one key/value segment, accumulated into fp32 running
 * max m, running sum l and unnormalised output acc (online softmax), with
 * the position-based mask of mask.h.
 *
 * Layouts (strides in elements):
 *   q[b][x][h][d]   at q + b*q_batch_stride + (x*heads + h)*dim + d
 *   k, v[b][y][g][d] at k + b*kv_batch_stride + (y*kv_heads + g)*dim + d
 *   m, l[b][h][x]   at m + b*ml_batch_stride + h*ml_head_stride + x
 *   acc[b][x][h][d] at acc + b*acc_batch_stride + (x*heads + h)*dim + d
 * Query head h reads key/value head h / (heads / kv_heads) (GQA / MQA).
 *
 * A call's blocks (one per ring step) run in order; the first of them
 * starts the rows from m = -inf, l = 0, acc = 0 without reading them, and
 * the last writes the normalised output and log-sum-exp instead of m, l and
 * acc (dt_attn_block_args.first, .last): no pass before or after the ring.
 *
 * The CUDA backend has three kernels for each direction: simple scalar
 * ones (cuda/block.cu, every dtype and head dim), tensor-core ones
 * (cuda/mma_fwd.cu forward, cuda/mma_bwd.cu backward: bf16 / fp16,
 * head dim 64 or 128, compute capability >= 8.0) and Hopper ones
 * (cuda/wgmma_fwd.cu forward, cuda/wgmma_bwd.cu backward:
 * warpgroup MMA and TMA, compute capability 9.0, an sm_90 build).
 * DT_ATTN_KERNEL (auto | simple | mma | wgmma), read once per attention
 * call when its plan is made (plan.c), picks between them for the forward
 * and the backward alike; the CPU kernels ignore it. auto means, in both
 * directions, wgmma where it can run, else mma, else simple. The
 * tensor-core kernels run on the CPU emulator of CUDA (tests/emu), and
 * have passed their tests on an H100 (2026-11-22) and an H200
 * (2026-11-26; the wgmma backward there first).
 */
#ifndef DT_ATTN_BLOCK_H
#define DT_ATTN_BLOCK_H

#include <stddef.h>
#include <stdint.h>
#include "../base/dtype.h"
#include "../base/status.h"
#include "mask.h"
#include "tuning.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One CTA of a tensor-core kernel's launch, as it recorded itself when the
 * block's args carry a trace (bench only: bench/blocks --trace, analysed by
 * cta_trace.h). Written by the CTA's thread 0 at its first instruction (ns[0],
 * clock[0], sm) and once every thread has issued its last store (ns[1],
 * clock[1], work): ns from
 * %globaltimer (one clock for the whole GPU, ns), clock from clock64 (the
 * SM's cycle counter), sm from %smid. work: the iterations of the CTA's
 * main loop, its tiles: key tiles of one query tile forward, query tiles
 * (times the GQA group's heads) of one key tile backward. The kernels
 * also mark (the low 32 bits of clock64) where their main loop runs:
 * mark[0] once its first tile has landed (before its math), mark[1] once
 * every thread is done with its last (forward: before the rows' merge and
 * write-back; backward: before dK and dV go out), so that a CTA's time
 * splits into its start, its loop and its end; both 0 in a CTA without
 * tiles, in the wgmma forward at D = 64 (its registers have no room for
 * them) and in the mma backward (one of its loads' waits would hold them:
 * not made).
 * (The persistent wgmma forward writes a record per query tile: the
 * tile's own start and end.) On the CPU emulator ns and clock are
 * CLOCK_MONOTONIC and sm is 0. */
typedef struct dt_attn_cta_trace {
    uint64_t ns[2], clock[2];
    uint32_t sm, work;
    uint32_t mark[2];
} dt_attn_cta_trace;

typedef struct dt_attn_block_args {
    dt_dtype dtype;                 /* of q, k, v */
    int64_t batch, heads, kv_heads, dim;
    const void *q;
    int64_t q_batch_stride;
    const void *k, *v;
    int64_t kv_batch_stride;
    /* Keys interleaved from kv_slots slots (0 or 1: none): key row y lies
     * at row dt_attn_key_row(y, kv_slots, kv_slot_rows) of k and v, slot s
     * being rows s kv_slot_rows .. of each batch entry (a grouped striped
     * ring's launch, whose shards' keys take turns: forward.c). The
     * forward kernels only; the wgmma kernel wants kv_slots to divide its
     * key tile's rows (a power of two up to 64 does). */
    int64_t kv_slots, kv_slot_rows;
    dt_attn_segment qseg, kseg;     /* rows and positions */
    dt_attn_mask mask;
    float scale;
    float *m, *l;
    int64_t ml_batch_stride, ml_head_stride;
    float *acc;
    int64_t acc_batch_stride;
    /* first: the block starts its rows from m = -inf, l = 0, acc = 0 and
     * does not read them. last: the block finishes its rows: it writes
     * o = acc / l (0 where l = 0) in dtype with q's layout and strides,
     * o[b][x][h][d] at o + b*q_batch_stride + (x*heads + h)*dim + d, and
     * lse = m + log l (-inf where l = 0), fp32 with m's layout; what m, l
     * and acc hold afterwards is undefined (the CUDA kernels leave them,
     * the CPU kernel works in them). Every row of qseg is started or
     * finished, whether or not the block has a key for it. */
    int first, last;
    void *o;
    float *lse;
    dt_attention_tuning tuning;        /* CUDA only: the kernel (resolved: never from the
                                          environment here) and its launch */
    /* A ring transfer (the next step's K and V) runs beside this block, on
     * the communication stream: a same-device copy's blocks or NCCL's
     * kernel, which need SMs while the block runs. CUDA: a kernel that
     * would hold every SM until the block ends (the persistent wgmma
     * forward) runs a CTA per tile instead, whose CTAs leave SMs as their
     * tiles end, to the transfer first (its stream's greater priority). */
    int transfer;
    /* NULL, or room for trace_len records: CTA i of the launch (its launch
     * order, blockIdx.x) fills trace[i] if i < trace_len. The CUDA
     * tensor-core kernels only; the others ignore it. */
    dt_attn_cta_trace *trace;
    int64_t trace_len;
    /* The rows' waits (CUDA: the tensor-core forward kernels, dependent
     * launch mode 2, dt_attention_tuning). A block
     * launched as the programmatic dependent of the block before waits for
     * the rows it merges, not for that whole block: visits counts, per 16
     * query rows of each (batch, head) (rows 16i .. 16i+15 of (b, h) at
     * visits[(b heads + h) ceil(qseg.len / 16) + i]), the call's counted
     * blocks that are done with them; a block waits until its rows' count
     * reaches `visit` (the counted blocks launched before it in the call),
     * merges them, and adds 1; also for rows it has no key for and leaves
     * as they are, so that a block completes only once every block before
     * it is done with every row, as with whole-block waits. Such a block
     * never waits for the block before as a whole. launches:
     * the caller's count of the call's counted blocks so far (host memory,
     * 0 before the first block), which the CUDA backend reads and advances:
     * it sets visit, and visits in its scratch, zeroed on the stream before
     * the call's first block. NULL (or visits NULL at the kernels): every
     * dependent block waits for the whole block before (mode 1). The CPU
     * kernels ignore all three. */
    uint32_t *launches;
    uint32_t *visits;
    uint32_t visit;
} dt_attn_block_args;

/* Backward of one block, from the forward's log-sum-exp (FlashAttention-2):
 *   P  = exp(scale q.k - lse)        (0 where masked, and on rows with lse = -inf)
 *   dV += P^T dO      dP = dO V^T      dS = P (dP - delta)
 *   dQ += scale dS K  dK += scale dS^T Q
 * with delta = rowsum(dO * O). dout has q's layout and dtype; lse and delta
 * are [b][h][x] fp32 with the ml strides; dq has acc's layout; dk and dv are
 * fp32 with k's layout (kv_batch_stride). GQA: dk, dv of kv head g sum over
 * the query heads of its group. dq, dk and dv are accumulated into (read,
 * add, write): the ring calls the kernel once per block; but with `first`
 * set, dk and dv (the kseg.len rows of every kv head and batch) are written
 * instead, 0 where no query attends a key, so that they need not be zeroed
 * before (what they held is never read). On CUDA the
 * tensor-core kernels add into dq by reductions (float2 atomics, or bulk
 * reductions of whole rows), so the order of dq's sums (not dk's or dv's)
 * may differ from run to run. */
typedef struct dt_attn_block_bwd_args {
    dt_dtype dtype;
    int64_t batch, heads, kv_heads, dim;
    const void *q, *dout;
    int64_t q_batch_stride;
    const void *k, *v;
    int64_t kv_batch_stride;
    dt_attn_segment qseg, kseg;
    dt_attn_mask mask;
    float scale;
    const float *lse, *delta;
    int64_t ml_batch_stride, ml_head_stride;
    float *dq;
    int64_t dq_batch_stride;
    float *dk, *dv;
    int first;                         /* write dk, dv instead of adding into them */
    /* The work queued before this block ends with another backward block,
     * which writes none of what this one reads or writes but dq, and
     * reads none of what this one writes (a ring's next step: dk, dv of
     * another buffer or other rows). CUDA, compute capability 9.0: this
     * block is launched as that one's programmatic dependent, and may
     * start while it finishes (dt_attention_tuning.dependent_launch). */
    int continues;
    dt_attention_tuning tuning;        /* as dt_attn_block_args.tuning */
    dt_attn_cta_trace *trace;          /* as dt_attn_block_args.trace */
    int64_t trace_len;
} dt_attn_block_bwd_args;

/* Where key row y of a block lies among its rows of k and v
 * (dt_attn_block_args.kv_slots). */
static inline DT_ATTN_HD int64_t dt_attn_key_row(int64_t y, int64_t slots, int64_t slot_rows) {
    return slots > 1 ? y % slots * slot_rows + y / slots : y;
}

struct dt_backend;

/* One backend's attention kernels. All run on the backend's compute stream;
 * pointers are backend memory. Per-row arrays (m, l, lse, delta) are
 * [b][h][x] with `rows` rows; acc and dq are [b][x][h][d] fp32. */
typedef struct dt_attn_kernels {
    const char *name;
    /* Scratch bytes the forward blocks of a call need: head dim `dim`,
     * `seqs` (batch x heads) query sequences of at most `len` rows. */
    size_t (*fwd_scratch)(int64_t dim, int64_t seqs, int64_t len);
    size_t (*bwd_scratch)(int64_t dim);
    /* May be NULL (one kernel per direction only). Whether the kernel
     * `want` (forward and backward alike) can run blocks of this dtype and
     * head dim on this backend's device: DT_SUCCESS, or DT_ERR_NOT_SUPPORTED
     * with the reason in why (dt_last_error untouched). Called once per
     * call, before any block. */
    dt_status (*kernel_check)(struct dt_backend *be, dt_dtype dtype, int64_t dim,
                              dt_attn_kernel_choice want, char *why, size_t why_size);
    dt_status (*fwd)(struct dt_backend *be, const dt_attn_block_args *a, void *scratch);
    /* May be NULL (always 0). 1 if fwd on this block, whose first and last
     * are both set (a call of one block), reads and
     * writes none of m, l and acc, which may then be NULL: the tensor-core
     * kernels keep a block's running state in registers. Asked before the
     * workspace is sized (forward.c). */
    int (*fwd_stateless)(struct dt_backend *be, const dt_attn_block_args *a);
    /* delta = rowsum(dout * o), fp32. */
    dt_status (*delta)(struct dt_backend *be, dt_dtype dtype, int64_t batch, int64_t rows,
                       int64_t heads, int64_t dim, const void *o, const void *dout, float *delta);
    dt_status (*bwd)(struct dt_backend *be, const dt_attn_block_bwd_args *a, void *scratch);
    /* dst[i] = src[i] rounded to `dtype`, i < n. */
    dt_status (*store)(struct dt_backend *be, dt_dtype dtype, size_t n, const float *src, void *dst);
} dt_attn_kernels;

extern const dt_attn_kernels dt_attn_kernels_cpu;
#ifdef DT_HAVE_CUDA
extern const dt_attn_kernels dt_attn_kernels_cuda;   /* cuda/block.cu */
#endif

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_BLOCK_H */
