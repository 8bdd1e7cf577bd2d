/* attention/backward.c — the distributed attention backward pass.
 *
 * Algorithm (DESIGN.md section 6). delta = rowsum(dO * O) is computed once
 * per local query row. The ring buffer carries K | V | dK | dV, the
 * gradients in fp32. For t = 0..P-1 the current buffer holds the block of
 * rank src = (j - t) mod P; the backward block kernel recomputes the
 * probabilities from the forward's log-sum-exp, accumulates dQ (which stays
 * home) and the block's dK, dV (which travel with it); then the buffer moves
 * one step on. After P steps every block, with the gradient contributions of
 * all ranks, is back on its owner.
 *
 * The gradients are only final after the compute of a step, so a step's
 * transfer starts after its compute: the backward pass does not overlap
 * communication with compute yet (the forward does).
 *
 * Invariants: as in forward.c: one workspace, allocated before the loop or
 * given; ranks agree before any block moves; a failing rank aborts.
 *
 * Test: tests/test_attention_backward.c (make test).
 */
#include "attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../collectives/ring.h"
#include "../dtensor/context_internal.h"
#include "block.h"
#include "plan.h"

/* Workspace: [ring: 2 x (K | V | dK | dV)] [dq] [delta] [kernel scratch]. */
typedef struct bwd_workspace {
    size_t grad_bytes, block_bytes;   /* one fp32 dK; one ring block */
    size_t off_dq, off_delta, off_scratch, total;
} bwd_workspace;

static bwd_workspace bwd_workspace_of(const attn_plan *p) {
    bwd_workspace w;
    size_t rows = attn_plan_rows(p);
    w.grad_bytes = (size_t)(p->b * p->c * p->hkv * p->D) * sizeof(float);
    w.block_bytes = 2 * p->kv_bytes + 2 * w.grad_bytes;
    w.off_dq = attn_align(2 * w.block_bytes);
    w.off_delta = w.off_dq + attn_align(rows * (size_t)p->D * sizeof(float));
    w.off_scratch = w.off_delta + attn_align(rows * sizeof(float));
    w.total = w.off_scratch + attn_align(p->kern ? p->kern->bwd_scratch(p->D) : 0);
    return w;
}

dt_status dt_attention_backward_workspace_size(const dt_tensor *q, const dt_tensor *k,
                                               const dt_tensor *v,
                                               const dt_attention_options *opts, size_t *bytes) {
    DT_REQUIRE(bytes != NULL, "dt_attention_backward_workspace_size: bytes is NULL");
    attn_plan p;
    DT_TRY(attn_plan_make("dt_attention_backward_workspace_size", q, k, v, opts, &p));
    *bytes = bwd_workspace_of(&p).total;
    return DT_SUCCESS;
}

/* o and dout must look like q; lse like the forward's. */
static dt_status check_outputs(const attn_plan *p, const char *op, const dt_tensor *q,
                               const dt_tensor *o, const dt_tensor *lse, const dt_tensor *dout) {
    int rank = dt_context_rank(p->ctx);
    DT_REQUIRE(o && lse && dout, "rank %d: %s: o, lse and dout must not be NULL", rank, op);
    const dt_tensor *like_q[2] = {o, dout};
    const char *names[2] = {"o", "dout"};
    for (int i = 0; i < 2; i++) {
        const dt_tensor *t = like_q[i];
        int same = dt_tensor_context(t) == p->ctx && dt_tensor_mesh(t) == p->mesh &&
                   dt_tensor_dtype(t) == p->dtype && dt_tensor_ndim(t) == 4 &&
                   memcmp(dt_tensor_shape(t), dt_tensor_shape(q), 4 * sizeof(int64_t)) == 0 &&
                   dt_layout_equal(dt_tensor_layout(t), dt_tensor_layout(q));
        DT_REQUIRE(same, "rank %d: %s: %s must have q's context, mesh, dtype (%s), shape "
                   "[%lld, %lld, %lld, %lld] and Layout", rank, op, names[i],
                   dt_dtype_name(p->dtype), (long long)p->B, (long long)p->S, (long long)p->H,
                   (long long)p->D);
    }
    const int64_t *ls = dt_tensor_shape(lse);
    int ok = dt_tensor_context(lse) == p->ctx && dt_tensor_mesh(lse) == p->mesh &&
             dt_tensor_dtype(lse) == DT_F32 && dt_tensor_ndim(lse) == 3 && ls[0] == p->B &&
             ls[1] == p->H && ls[2] == p->S &&
             (!p->mesh || dt_layout_equal(dt_tensor_layout(lse), &p->lse_layout));
    DT_REQUIRE(ok, "rank %d: %s: lse must be the forward's: fp32 [%lld, %lld, %lld] on q's mesh",
               rank, op, (long long)p->B, (long long)p->H, (long long)p->S);
    return DT_SUCCESS;
}

static dt_status run_blocks(const attn_plan *p, const bwd_workspace *w, const dt_tensor *q,
                            const dt_tensor *dout, const float *lse, char *block, int src,
                            float *dq, const float *delta, void *scratch) {
    dt_attn_segment qs[2], ks[2];
    int nq, nk;
    attn_plan_segments(p, src, qs, &nq, ks, &nk);
    size_t es = dt_dtype_size(p->dtype);
    const char *k = block, *v = block + p->kv_bytes;
    float *dk = (float *)(block + 2 * p->kv_bytes);
    float *dv = (float *)(block + 2 * p->kv_bytes + w->grad_bytes);
    int64_t qoff = 0;
    for (int i = 0; i < nq; i++) {
        int64_t koff = 0;
        for (int j = 0; j < nk; j++) {
            size_t qo = (size_t)(qoff * p->h * p->D), ko = (size_t)(koff * p->hkv * p->D);
            dt_attn_block_bwd_args a = {
                .dtype = p->dtype, .batch = p->b, .heads = p->h, .kv_heads = p->hkv, .dim = p->D,
                .q = (const char *)dt_tensor_data_const(q) + qo * es,
                .dout = (const char *)dt_tensor_data_const(dout) + qo * es,
                .q_batch_stride = p->c * p->h * p->D,
                .k = k + ko * es, .v = v + ko * es, .kv_batch_stride = p->c * p->hkv * p->D,
                .qseg = qs[i], .kseg = ks[j], .mask = p->mask, .scale = p->scale,
                .lse = lse + qoff, .delta = delta + qoff,
                .ml_batch_stride = p->h * p->c, .ml_head_stride = p->c,
                .dq = dq + qo, .dq_batch_stride = p->c * p->h * p->D,
                .dk = dk + ko, .dv = dv + ko,
            };
            DT_TRY(p->kern->bwd(p->ctx->backend, &a, scratch));
            koff += ks[j].len;
        }
        qoff += qs[i].len;
    }
    return DT_SUCCESS;
}

dt_status dt_attention_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                const dt_tensor *o, const dt_tensor *lse, const dt_tensor *dout,
                                const dt_attention_options *opts, dt_tensor **dq, dt_tensor **dk,
                                dt_tensor **dv) {
    const char *op = "dt_attention_backward";
    DT_REQUIRE(dq && dk && dv, "%s: dq, dk and dv must not be NULL", op);
    *dq = *dk = *dv = NULL;
    attn_plan p;
    dt_status local = attn_plan_make(op, q, k, v, opts, &p);
    if (local == DT_SUCCESS) local = check_outputs(&p, op, q, o, lse, dout);
    bwd_workspace w = bwd_workspace_of(&p);
    if (local == DT_SUCCESS && opts && opts->workspace && opts->workspace_bytes < w.total)
        local = dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: %s: workspace of %zu bytes is smaller "
                         "than the %zu needed (dt_attention_backward_workspace_size)",
                         dt_context_rank(p.ctx), op, opts->workspace_bytes, w.total);
    DT_TRY(attn_plan_check_agreement(&p, op, local));
    dt_comm *comm = p.sp_dim >= 0 && p.parts > 1 ? dt_mesh_comm(p.mesh, p.sp_dim) : NULL;

    dt_backend *be = p.ctx->backend;
    dt_tensor *gq = NULL, *gk = NULL, *gv = NULL;
    dt_ring *ring = NULL;
    char *ws = opts ? opts->workspace : NULL;
    int own_ws = ws == NULL;
    dt_status st;
    if (own_ws) DT_TRY_GOTO(st, be->ops->alloc(be, w.total, (void **)&ws), fail);
    const dt_layout *lq = p.mesh ? dt_tensor_layout(q) : NULL;
    DT_TRY_GOTO(st, dt_tensor_create(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(q), lq, &gq), fail);
    DT_TRY_GOTO(st, dt_tensor_create(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(k), lq, &gk), fail);
    DT_TRY_GOTO(st, dt_tensor_create(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(v), lq, &gv), fail);

    float *dqa = (float *)(ws + w.off_dq), *delta = (float *)(ws + w.off_delta);
    DT_TRY_GOTO(st, be->ops->zero(be, dqa, attn_plan_rows(&p) * (size_t)p.D * sizeof(float)),
                fail);
    DT_TRY_GOTO(st, p.kern->delta(be, p.dtype, p.b, p.c, p.h, p.D, dt_tensor_data_const(o),
                                  dt_tensor_data_const(dout), delta), fail);
    if (comm)
        DT_TRY_GOTO(st, dt_ring_create_in(comm, w.block_bytes, DT_RING_FORWARD, ws, &ring), fail);
    char *block = ring ? dt_ring_current(ring) : ws;
    DT_TRY_GOTO(st, be->ops->copy(be, block, dt_tensor_data_const(k), p.kv_bytes), fail);
    DT_TRY_GOTO(st, be->ops->copy(be, block + p.kv_bytes, dt_tensor_data_const(v), p.kv_bytes),
                fail);
    DT_TRY_GOTO(st, be->ops->zero(be, block + 2 * p.kv_bytes, 2 * w.grad_bytes), fail);

    for (int t = 0; t < p.parts; t++) {
        int src = ring ? dt_ring_source(ring) : 0;
        DT_TRY_GOTO(st, run_blocks(&p, &w, q, dout, dt_tensor_data_const(lse),
                                   ring ? dt_ring_current(ring) : block, src, dqa, delta,
                                   ws + w.off_scratch), fail);
        /* P steps in all: the last one brings each block's gradients home. */
        if (ring) DT_TRY_GOTO(st, dt_ring_step(ring), fail);
    }
    block = ring ? dt_ring_current(ring) : block;
    size_t nq = (size_t)dt_tensor_local_numel(gq), nk = (size_t)dt_tensor_local_numel(gk);
    DT_TRY_GOTO(st, p.kern->store(be, p.dtype, nq, dqa, dt_tensor_data(gq)), fail);
    DT_TRY_GOTO(st, p.kern->store(be, p.dtype, nk, (const float *)(block + 2 * p.kv_bytes),
                                  dt_tensor_data(gk)), fail);
    DT_TRY_GOTO(st, p.kern->store(be, p.dtype, nk,
                                  (const float *)(block + 2 * p.kv_bytes + w.grad_bytes),
                                  dt_tensor_data(gv)), fail);
    dt_ring_destroy(ring);
    if (own_ws) be->ops->free(be, ws);
    *dq = gq;
    *dk = gk;
    *dv = gv;
    return DT_SUCCESS;
fail:
    if (comm) dt_comm_abort(comm, st, dt_last_error());
    dt_ring_destroy(ring);
    if (own_ws && ws) be->ops->free(be, ws);
    dt_tensor_destroy(gq);
    dt_tensor_destroy(gk);
    dt_tensor_destroy(gv);
    return st;
}
