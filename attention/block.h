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
 * Non-finite values: an allowed logit that is NaN or +-inf makes its row's
 * m, l, o and lse NaN (the row max keeps NaN); a row with no allowed key
 * ends as o = 0, lse = -inf whatever its masked keys and values hold; an
 * infinite o becomes NaN. A NaN or Inf of v or dout, and in the backward
 * of any input (a row's lse included), may also reach rows or keys of the
 * same computed tile that the mask keeps from it (0 x NaN, 0 x Inf in a
 * matrix product: dQ = dS K multiplies a masked pair's dS = 0 by its key),
 * never beyond. Kernels that do not keep this say so
 * (dt_attn_kernels.exact_nonfinite).
 *
 * CUDA kernels per direction: simple (cuda/block.cu, every dtype and head
 * dim), mma (cuda/mma_*.cu: bf16/fp16, head dim 64 or 128, sm_80+) and wgmma
 * (cuda/wgmma_*.cu: sm_90). DT_ATTN_KERNEL (tuning.h), read once per call
 * (plan.c), picks one for both directions; auto takes the first path verified
 * on the device's architecture that can run the block (cuda/block.cu's
 * table), else simple. The CPU kernels ignore it. docs/KERNELS.md has the
 * design; the tensor-core kernels also run on the emulator (tests/emu).
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

/* One CTA's record of itself in a tensor-core launch (bench/blocks --trace;
 * cta_trace.h reads them; docs/KERNELS.md, "The CTA trace"). [0] at its first
 * instruction, [1] after its last store; the persistent wgmma forward writes
 * one per query tile. Emulator: CLOCK_MONOTONIC, sm 0. */
typedef struct dt_attn_cta_trace {
    uint64_t ns[2], clock[2];   /* %globaltimer (ns, GPU-wide); clock64 (SM cycles) */
    uint32_t sm, work;          /* %smid; main-loop tiles (key tiles fwd, query tiles bwd) */
    uint32_t mark[2];           /* low clock64 bits: first tile landed, last tile done
                                   (0: no tiles, wgmma fwd at D = 64, mma bwd) */
} dt_attn_cta_trace;

typedef struct dt_attn_block_args {
    dt_dtype dtype;                 /* of q, k, v */
    /* 1 when some input of the call may be NaN or Inf: the kernels must then
     * keep the non-finite rules above; 0: every input is finite and within
     * plan.c's range, nothing non-finite can arise. The CPU kernels keep the
     * rules either way. (In the padding after dtype, so that every other
     * field keeps its offset and the VERIFIED kernels' code is unchanged.) */
    int nonfinite;
    int64_t batch, heads, kv_heads, dim;
    const void *q;
    int64_t q_batch_stride;
    const void *k, *v;
    int64_t kv_batch_stride;
    /* Forward only: keys interleaved from kv_slots slots (0, 1: none), key row
     * y at row dt_attn_key_row(y, ...) of k, v (a grouped striped launch); the
     * wgmma kernel needs kv_slots to divide its key tile (a power of two <= 64). */
    int64_t kv_slots, kv_slot_rows;
    dt_attn_segment qseg, kseg;     /* rows and positions */
    dt_attn_mask mask;
    float scale;
    float *m, *l;
    int64_t ml_batch_stride, ml_head_stride;
    float *acc;
    int64_t acc_batch_stride;
    /* first: start every row from m = -inf, l = 0, acc = 0 without reading them.
     * last: finish every row: o = acc / l (0 where l = 0) in dtype with q's
     * layout, lse = m + log l (-inf where l = 0) fp32 with m's; m, l, acc are
     * then undefined. Rows with no key in the block are started/finished too. */
    int first, last;
    void *o;
    float *lse;
    dt_attention_tuning tuning;        /* CUDA only: kernel (resolved) and launch knobs */
    /* A ring transfer runs beside this block and needs SMs: a kernel that would
     * hold every SM (the persistent wgmma forward) runs a CTA per tile instead. */
    int transfer;
    /* NULL, or trace_len records: CTA i (blockIdx.x) fills trace[i] if i <
     * trace_len. CUDA tensor-core kernels only. */
    dt_attn_cta_trace *trace;
    int64_t trace_len;
    /* Per-row waits (CUDA tensor-core forward, dependent launch mode 2): a
     * dependent block waits until visits[(b heads + h) ceil(qseg.len / 16) + i]
     * (rows 16i..16i+15 of (b, h)) reaches `visit`, merges, adds 1 (rows it has
     * no key for too). launches: the caller's host count of the call's blocks
     * (0 at first), which the backend reads and advances; NULL: whole-block
     * waits (mode 1). CPU kernels ignore all three. */
    uint32_t *launches;
    uint32_t *visits;
    uint32_t visit;
    /* Documents and window (mask.h's dt_attn_rule with `mask`): docs NULL,
     * window 0 leave the mask alone. Else batch entry b's rule reads docs +
     * b * docs_batch_stride (0: one table for every entry); backend memory. */
    int64_t window;
    const int64_t *docs;
    int64_t docs_batch_stride;
} dt_attn_block_args;

/* Backward of one block from the forward's lse (FlashAttention-2):
 *   P  = exp(scale q.k - lse)        (0 where masked, and on rows with lse = -inf)
 *   dV += P^T dO      dP = dO V^T      dS = P (dP - delta)
 *   dQ += scale dS K  dK += scale dS^T Q
 * delta = rowsum(dO * O). dout: q's layout and dtype; lse, delta [b][h][x] fp32;
 * dq: acc's layout; dk, dv fp32 with k's (GQA: summed over the group's heads).
 * All accumulate, except dk, dv with `first` (written, no zeroing needed). CUDA
 * tensor-core kernels add into dq atomically: its sum order may vary by run. */
typedef struct dt_attn_block_bwd_args {
    dt_dtype dtype;
    int nonfinite;                     /* as dt_attn_block_args.nonfinite */
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
    /* The work queued before ends with a backward block that shares only dq
     * with this one (other dk, dv rows or buffer): on sm_90 this block may
     * launch as its programmatic dependent (tuning.dependent_launch). */
    int continues;
    dt_attention_tuning tuning;        /* as dt_attn_block_args.tuning */
    dt_attn_cta_trace *trace;          /* as dt_attn_block_args.trace */
    int64_t trace_len;
    int64_t window;                    /* as dt_attn_block_args.window, docs, */
    const int64_t *docs;               /* docs_batch_stride */
    int64_t docs_batch_stride;
} dt_attn_block_bwd_args;

/* Batch entry b's rule (mask.h) of a forward or backward block. */
static inline DT_ATTN_HD dt_attn_rule dt_attn_block_rule(const dt_attn_block_args *a, int64_t b) {
    dt_attn_rule r = {a->mask, a->window, a->docs ? a->docs + b * a->docs_batch_stride : 0};
    return r;
}
static inline DT_ATTN_HD dt_attn_rule dt_attn_block_bwd_rule(const dt_attn_block_bwd_args *a, int64_t b) {
    dt_attn_rule r = {a->mask, a->window, a->docs ? a->docs + b * a->docs_batch_stride : 0};
    return r;
}

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
    /* May be NULL. DT_SUCCESS if kernel `want` can run this dtype and head dim
     * on this device, with documents or a window when `ruled` (mask.h's rule
     * beyond the mask), else DT_ERR_NOT_SUPPORTED with the reason in why
     * (dt_last_error untouched). Once per call, before any block. */
    dt_status (*kernel_check)(struct dt_backend *be, dt_dtype dtype, int64_t dim,
                              dt_attn_kernel_choice want, int ruled, char *why, size_t why_size);
    /* May be NULL (1). 1 if the blocks kernel `want` runs for this dtype and
     * head dim, forward and backward, keep the non-finite rules above; 0 if
     * they may lose a NaN or Inf (a form that predates the rules):
     * a call whose inputs are not all finite then writes NaN to all of its
     * outputs instead (plan.h). */
    int (*exact_nonfinite)(struct dt_backend *be, dt_dtype dtype, int64_t dim,
                           dt_attn_kernel_choice want);
    dt_status (*fwd)(struct dt_backend *be, const dt_attn_block_args *a, void *scratch);
    /* May be NULL (0). 1 if fwd on this one-block call (first and last set)
     * touches none of m, l, acc, which may then be NULL (state in registers). */
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
