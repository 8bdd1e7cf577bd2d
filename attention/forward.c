/* attention/forward.c — the distributed attention forward pass.
 *
 * Algorithm (DESIGN.md section 6). Rank j of the P ranks of the sequence
 * mesh dim holds a query shard and a key/value shard, each one position
 * segment (mask.h; a zigzag shard's two chunks are one segment with a
 * jump). K and V travel the ring packed in one buffer; step 0 computes on
 * this rank's where they are and sends them from there, so nothing is
 * copied into the ring. For t = 0..P-1: the ring's current block is that of
 * rank src = (j - t) mod P; the transfer of the next block is posted before
 * the block kernel runs on the current one (this rank's q segment against
 * src's k segment), and completed after. The kernel accumulates m, l and acc
 * in fp32; step 0's block starts them, the rank's last block with a pair the
 * mask allows (step P-1's but in a contiguous causal ring, where it is step
 * j's: dt_attn_ring_last_step) writes the normalised output and the
 * log-sum-exp (kept for the backward pass) instead: no pass over the rows
 * before or after the ring, and none for the blocks after it, which add
 * nothing.
 *
 * Invariants: everything the loop touches (ring buffers, accumulators,
 * kernel scratch) lives in one workspace sized by dt_attention_workspace_size
 * and allocated before the loop, or given by the caller; ranks agree on the
 * call (checked by one small all_gather) before any block moves; a rank that
 * fails after that aborts the communicators, so no peer waits for it.
 *
 * Test: tests/test_attention.c (make test).
 */
#include "attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../collectives/ring.h"
#include "../dtensor/context_internal.h"
#include "../dtensor/trace.h"
#include "block.h"
#include "plan.h"

/* The arguments of ring step t's block (0 .. parts-1), on the K and V of
 * rank src: step 0's starts the rows, step `last`'s writes o and lse (the
 * rank's last block with a pair the mask allows: dt_attn_ring_last_step;
 * the blocks after it add nothing and launch nothing). acc, m, l: the
 * running state, NULL in a stateless call (fwd_stateless). */
static dt_attn_block_args block_args(const attn_plan *p, int t, int last, int src, const void *q,
                                     const char *k, const char *v, float *acc, float *m, float *l,
                                     void *o, float *lse, uint32_t *launches) {
    dt_attn_segment qs, ks;
    attn_plan_segments(p, src, &qs, &ks);
    return (dt_attn_block_args){
        .dtype = p->dtype, .batch = p->b, .heads = p->h, .kv_heads = p->hkv, .dim = p->D,
        .q = q, .q_batch_stride = p->c * p->h * p->D,
        .k = k, .v = v, .kv_batch_stride = p->c * p->hkv * p->D,
        .qseg = qs, .kseg = ks, .mask = p->mask, .scale = p->scale,
        .m = m, .l = l, .ml_batch_stride = p->h * p->c, .ml_head_stride = p->c,
        .acc = acc, .acc_batch_stride = p->c * p->h * p->D,
        .first = t == 0, .last = t == last,
        .o = o, .lse = lse,
        .kernel = p->kernel,
        .transfer = t + 1 < p->parts,   /* step t+1's K, V are in flight (dt_ring_start) */
        .launches = launches,
    };
}

/* Whether the call runs without the fp32 running state (acc, m, l): one
 * block (no ring: one step) on a kernel that keeps the state in registers
 * (dt_attn_kernels.fwd_stateless). Then the workspace has none: B S H D
 * fp32 less. */
static int fwd_stateless(const attn_plan *p, const dt_tensor *q, const dt_tensor *k,
                         const dt_tensor *v) {
    if (p->parts != 1 || !p->kern || !p->kern->fwd_stateless) return 0;
    const dt_attn_block_args a =   /* one rank: its own keys */
        block_args(p, 0, 0, 0, dt_tensor_data_const(q), dt_tensor_data_const(k),
                   dt_tensor_data_const(v), NULL, NULL, NULL, NULL, NULL, NULL);
    return p->kern->fwd_stateless(p->ctx->backend, &a);
}

/* Workspace of a forward call: [ring: 2 x (K | V)] [acc] [m] [l] [kernel
 * scratch]. With one rank on the sequence there is no ring: the kernels
 * read K and V where they are; a stateless call has no acc, m, l. */
typedef struct fwd_workspace {
    int stateless;
    size_t off_acc, off_m, off_l, off_scratch, total;
} fwd_workspace;

static fwd_workspace fwd_workspace_of(const attn_plan *p, const dt_tensor *q, const dt_tensor *k,
                                      const dt_tensor *v) {
    fwd_workspace w;
    w.stateless = fwd_stateless(p, q, k, v);
    const size_t rows = w.stateless ? 0 : attn_plan_rows(p);
    w.off_acc = p->parts > 1 ? attn_align(4 * p->kv_bytes) : 0;
    w.off_m = w.off_acc + attn_align(rows * (size_t)p->D * sizeof(float));
    w.off_l = w.off_m + attn_align(rows * sizeof(float));
    w.off_scratch = w.off_l + attn_align(rows * sizeof(float));
    w.total = w.off_scratch + attn_align(p->kern ? p->kern->fwd_scratch(p->D, p->b * p->h, p->c) : 0);
    return w;
}

dt_status dt_attention_workspace_size(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                      const dt_attention_options *opts, size_t *bytes) {
    DT_REQUIRE(bytes != NULL, "dt_attention_workspace_size: bytes is NULL");
    attn_plan p;
    DT_TRY(attn_plan_make("dt_attention_workspace_size", q, k, v, opts, &p));
    *bytes = fwd_workspace_of(&p, q, k, v).total;
    return DT_SUCCESS;
}

dt_status dt_attention_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_options *opts, dt_tensor **o, dt_tensor **lse) {
    const char *op = "dt_attention_forward";
    if (o) *o = NULL;
    if (lse) *lse = NULL;
    attn_plan p;
    dt_status local = attn_plan_make(op, q, k, v, opts, &p);
    if (local == DT_SUCCESS && !o) local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: o is NULL", op);
    if (local == DT_SUCCESS) local = attn_plan_check_kernel(&p, op);
    fwd_workspace w = {0};
    if (local == DT_SUCCESS) w = fwd_workspace_of(&p, q, k, v);
    if (local == DT_SUCCESS)
        local = attn_plan_check_workspace(&p, op, opts, w.total, "dt_attention_workspace_size");
    dt_attention_timing *timing = opts ? opts->timing : NULL;
    if (local == DT_SUCCESS) local = attn_timing_begin(&p, timing);
    DT_TRY(attn_plan_check_agreement(&p, op, local));
    dt_comm *comm = p.sp_dim >= 0 && p.parts > 1 ? dt_mesh_comm(p.mesh, p.sp_dim) : NULL;

    dt_backend *be = p.ctx->backend;
    dt_tensor *out = NULL, *out_lse = NULL;
    dt_ring *ring = NULL;
    char *ws = opts ? opts->workspace : NULL;
    int own_ws = ws == NULL;
    dt_status st;
    /* Not zeroed: the loop writes every byte it reads of the workspace (as
     * it must for a caller's), and the last blocks all of o and lse. */
    if (own_ws) DT_TRY_GOTO(st, be->ops->alloc_uninit(be, w.total, (void **)&ws), fail);
    int64_t lse_shape[3] = {p.B, p.H, p.S};
    DT_TRY_GOTO(st, dt_tensor_create_uninit(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(q),
                                            dt_tensor_layout(q)->ndim ? dt_tensor_layout(q) : NULL,
                                            &out), fail);
    DT_TRY_GOTO(st, dt_tensor_create_uninit(p.ctx, p.mesh, DT_F32, 3, lse_shape,
                                            p.mesh ? &p.lse_layout : NULL, &out_lse), fail);

    float *acc = w.stateless ? NULL : (float *)(ws + w.off_acc);
    float *m = w.stateless ? NULL : (float *)(ws + w.off_m);
    float *l = w.stateless ? NULL : (float *)(ws + w.off_l);

    /* The agreement check above covered the ring's bytes (from the shapes
     * and Layout) and direction (always forward). */
    if (comm)
        DT_TRY_GOTO(st, dt_ring_create_in_agreed(comm, 2 * p.kv_bytes, DT_RING_FORWARD, ws, &ring),
                    fail);
    /* Step 0 computes on this rank's K and V where they are and sends them
     * from there; they arrive packed (K | V) in the ring's other buffer. */
    const void *const own_kv[2] = {dt_tensor_data_const(k), dt_tensor_data_const(v)};
    const size_t kv_sizes[2] = {p.kv_bytes, p.kv_bytes};

    const int last = p.parts > 1 ? dt_attn_ring_last_step(p.order, p.mask, p.S, p.parts, p.rank) : 0;
    uint32_t launches = 0;   /* the call's blocks that count their rows (block.h) */
    for (int t = 0; t < p.parts; t++) {
        int more = t + 1 < p.parts;
        if (more)
            DT_TRY_GOTO(st, t == 0 ? dt_ring_start_from(ring, own_kv, kv_sizes, 2)
                                   : dt_ring_start(ring), fail);
        int src = ring ? dt_ring_source(ring) : 0;
        DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t), fail);
        DT_TRACE_PUSH("attention fwd blocks");
        const char *kb = t == 0 ? own_kv[0] : dt_ring_current(ring);
        const char *vb = t == 0 ? own_kv[1] : kb + p.kv_bytes;
        const dt_attn_block_args a = block_args(&p, t, last, src, dt_tensor_data_const(q), kb, vb,
                                                acc, m, l, dt_tensor_data(out),
                                                dt_tensor_data(out_lse), &launches);
        st = p.kern->fwd(be, &a, ws + w.off_scratch);
        DT_TRACE_POP();
        if (st != DT_SUCCESS) goto fail;
        DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t + 1), fail);
        if (more) DT_TRY_GOTO(st, dt_ring_wait(ring), fail);
    }
    DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * p.parts), fail);
    DT_TRY_GOTO(st, attn_timing_end(&p, timing), fail);
    dt_ring_destroy(ring);
    if (own_ws) be->ops->free(be, ws);
    *o = out;
    if (lse) *lse = out_lse;
    else dt_tensor_destroy(out_lse);
    return DT_SUCCESS;
fail:
    /* Peers may be waiting for this rank's next block: release them. */
    if (comm) dt_comm_abort(comm, st, dt_last_error());
    dt_ring_destroy(ring);
    if (own_ws && ws) be->ops->free(be, ws);
    dt_tensor_destroy(out);
    dt_tensor_destroy(out_lse);
    return st;
}
