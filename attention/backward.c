/* attention/backward.c — the distributed attention backward pass.
 *
 * Algorithm (docs/ARCHITECTURE.md, "The backward ring"). delta = rowsum(dO*O)
 * once per local query row. For t = 0..P-1 rank j computes on the K|V block of
 * src(t) = (j - t) mod P: the block kernel recomputes the probabilities from
 * the forward's lse and accumulates dQ (stays home) and the block's dK, dV.
 * K|V travel one step ahead of the compute; the fp32 dK|dV of a block one step
 * behind it (final only after its compute). One group per step carries both:
 *
 *   step t posts: K|V of src(t)     -> j+1,  K|V of src(t+1)        <- j-1  (t < P-1)
 *                 dK|dV of src(t-1) -> j+1,  dK|dV so far of src(t) <- j-1  (t > 0)
 *   computes src(t)'s contributions into `loc`, completes the group, and adds
 *   `loc` into the sums received (add_beside: beside the next kernel, so the
 *   next kernel writes the spare `loc`).
 *
 * A block with no pair the rule allows (mask.h) runs neither kernel nor add. The last
 * hop home has no kernel to hide behind, so step P-1's block runs in two
 * halves of its key rows, and the hop carries finished gradients in their own
 * dtype (rounded once, as at home) straight into dk and dv: part 0, complete,
 * round and post its half home; part 1 into the sums, round, post; store dQ.
 *
 * Buffers: two for K|V (current, landing), four for dK|dV (LOC, SPARE, RCV,
 * SND; the stage at the end); roles rotate, nothing is copied. One rank on the
 * sequence: no ring, one dK|dV buffer, final.
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

#include "../collectives/comm.h"
#include "../dtensor/tensor_internal.h"
#include "../base/trace.h"
#include "block.h"
#include "plan.h"

/* The dK|dV buffers of the ring, by role (bwd_ring below). */
enum { LOC, SPARE, RCV, SND, BWD_GRAD_BUFS };

/* Workspace: [K|V: 2 blocks] [dK|dV: 4 blocks] [dq] [delta] [kernel
 * scratch] [document bounds]; with one rank on the sequence (no ring)
 * [dK|dV: 1 block] [dq] [delta] [kernel scratch] [document bounds]. */
typedef struct bwd_workspace {
    size_t grad_bytes;                /* one fp32 dK (or dV) */
    size_t off_grads, off_dq, off_delta, off_scratch, off_docs, total;
} bwd_workspace;

static bwd_workspace bwd_workspace_of(const attn_plan *p) {
    bwd_workspace w;
    size_t rows = attn_plan_rows(p);
    const int ring = p->parts > 1;
    w.grad_bytes = (size_t)(p->b * p->c * p->hkv * p->D) * sizeof(float);
    w.off_grads = ring ? attn_align(4 * p->kv_bytes) : 0;
    w.off_dq = w.off_grads + attn_align((ring ? 2 * BWD_GRAD_BUFS : 2) * w.grad_bytes);
    w.off_delta = w.off_dq + attn_align(rows * (size_t)p->D * sizeof(float));
    w.off_scratch = w.off_delta + attn_align(rows * sizeof(float));
    w.off_docs = w.off_scratch + attn_align(p->kern ? p->kern->bwd_scratch(p->D) : 0);
    w.total = w.off_docs + attn_docs_bytes(p);
    return w;
}

/* The buffers of the loop (see the header): kv[cur] is src(t)'s K|V,
 * kv[1 - cur] the landing buffer; grad[LOC] takes this step's contributions,
 * grad[SPARE] the next step's (grad[LOC] may still be read by this step's
 * add, beside the next kernel), grad[RCV] the partial sums of src(t),
 * grad[SND] the finished sums of src(t-1). Each grad buffer is dK then dV,
 * fp32. */
typedef struct bwd_ring {
    dt_comm *comm;                    /* NULL: one rank, nothing moves */
    const char *k, *v;                /* this rank's K and V, where they are */
    char *kv[2];
    float *grad[BWD_GRAD_BUFS];
    int cur;
    dt_p2p_op ops[6];
} bwd_ring;

/* The K and V of step t's block: this rank's own at step 0, then kv[cur]. */
static const char *bwd_ring_k(const bwd_ring *r, int t) { return t == 0 ? r->k : r->kv[r->cur]; }
static const char *bwd_ring_v(const bwd_ring *r, const attn_plan *p, int t) {
    return t == 0 ? r->v : r->kv[r->cur] + p->kv_bytes;
}

/* The last hop's stage: src(P-1)'s finished dK (g = 0) or dV (g = 1),
 * rounded to the gradients' dtype, in grad[SND] (its send is done then). */
static char *bwd_stage(const bwd_ring *r, const attn_plan *p, const bwd_workspace *w, int g) {
    const size_t grad_n = w->grad_bytes / sizeof(float);
    return (char *)r->grad[SND] + (size_t)g * grad_n * dt_dtype_size(p->dtype);
}

/* Post step t's group; returns the number of operations posted. */
static dt_status bwd_ring_start(bwd_ring *r, const attn_plan *p, const bwd_workspace *w, int t,
                                int *posted) {
    *posted = 0;
    if (!r->comm) return DT_SUCCESS;
    int j = dt_comm_rank(r->comm);
    int next = (j + 1) % p->parts, prev = (j + p->parts - 1) % p->parts;
    int n = 0;
    if (t + 1 < p->parts) {   /* K and V, one message each, landing packed */
        char *land = r->kv[1 - r->cur];
        r->ops[n++] = (dt_p2p_op){DT_P2P_SEND, next, (void *)bwd_ring_k(r, t), p->kv_bytes, DT_U8};
        r->ops[n++] = (dt_p2p_op){DT_P2P_RECV, prev, land, p->kv_bytes, DT_U8};
        r->ops[n++] = (dt_p2p_op){DT_P2P_SEND, next, (void *)bwd_ring_v(r, p, t), p->kv_bytes,
                                  DT_U8};
        r->ops[n++] = (dt_p2p_op){DT_P2P_RECV, prev, land + p->kv_bytes, p->kv_bytes, DT_U8};
    }
    if (t > 0) {
        r->ops[n++] = (dt_p2p_op){DT_P2P_SEND, next, r->grad[SND], 2 * w->grad_bytes, DT_U8};
        r->ops[n++] = (dt_p2p_op){DT_P2P_RECV, prev, r->grad[RCV], 2 * w->grad_bytes, DT_U8};
    }
    if (n) DT_TRY(dt_comm_p2p_start(r->comm, r->ops, n));
    *posted = n;
    return DT_SUCCESS;
}

/* After the last step: rows [r0, r1) of the finished gradients of
 * src(P-1) = j+1, rounded to the gradients' dtype in grad[SND] (dK's
 * rows, then dV's: bwd_stage), go home, and this rank's own land in dk
 * and dv; two messages each way. Nothing without a ring or rows. */
static dt_status bwd_ring_home(bwd_ring *r, const attn_plan *p, const bwd_workspace *w,
                               dt_tensor *dk, dt_tensor *dv, int64_t r0, int64_t r1,
                               int *posted) {
    *posted = 0;
    if (!r->comm || r0 == r1) return DT_SUCCESS;
    const int j = dt_comm_rank(r->comm), next = (j + 1) % p->parts,
              prev = (j + p->parts - 1) % p->parts;
    const size_t row = (size_t)(p->hkv * p->D), es = dt_dtype_size(p->dtype);
    const size_t off = (size_t)r0 * row * es, bytes = (size_t)(r1 - r0) * row * es;
    char *const land[2] = {dt_tensor_data(dk), dt_tensor_data(dv)};
    int n = 0;
    for (int g = 0; g < 2; g++) {   /* dK, then dV */
        r->ops[n++] = (dt_p2p_op){DT_P2P_SEND, next, bwd_stage(r, p, w, g) + off, bytes, DT_U8};
        r->ops[n++] = (dt_p2p_op){DT_P2P_RECV, prev, land[g] + off, bytes, DT_U8};
    }
    DT_TRY(dt_comm_p2p_start(r->comm, r->ops, n));
    *posted = n;
    return DT_SUCCESS;
}

/* Rows [r0, r1) of src(P-1)'s finished dK|dV, the fp32 `sums` plus `loc`
 * (NULL: the sums alone), rounded into the stage beside the kernels after
 * it; their hop home follows it (backend.h, add_beside). */
static dt_status bwd_round_rows(const attn_plan *p, const bwd_workspace *w, const bwd_ring *r,
                                const float *sums, const float *loc, int64_t r0, int64_t r1) {
    dt_backend *be = p->ctx->backend;
    const size_t row = (size_t)(p->hkv * p->D), es = dt_dtype_size(p->dtype);
    const size_t off = (size_t)r0 * row, n = (size_t)(r1 - r0) * row;
    const size_t grad_n = w->grad_bytes / sizeof(float);
    for (int g = 0; g < 2 && n; g++)   /* dK, then dV */
        DT_TRY(be->ops->add_beside(be, p->dtype, (int64_t)n, sums + g * grad_n + off,
                                   loc ? loc + g * grad_n + off : NULL,
                                   bwd_stage(r, p, w, g) + off * es));
    return DT_SUCCESS;
}

/* The final fp32 dK|dV at `home` (one rank on the sequence: no ring),
 * rounded into dk, dv. */
static dt_status bwd_store(const attn_plan *p, const bwd_workspace *w, const float *home,
                           dt_tensor *dk, dt_tensor *dv) {
    const size_t n = (size_t)dt_tensor_local_numel(dk);
    dt_backend *be = p->ctx->backend;
    DT_TRY(p->kern->store(be, p->dtype, n, home, dt_tensor_data(dk)));
    return p->kern->store(be, p->dtype, n, home + w->grad_bytes / sizeof(float),
                          dt_tensor_data(dv));
}

dt_status dt_attention_backward_workspace_size(const dt_tensor *q, const dt_tensor *k,
                                               const dt_tensor *v,
                                               const dt_attention_options *opts, size_t *bytes) {
    DT_REQUIRE(bytes != NULL, "dt_attention_backward_workspace_size: bytes is NULL");
    if (opts && opts->a2a_dim >= 0) {   /* the workspace is not used (attention.h) */
        *bytes = 0;
        return DT_SUCCESS;
    }
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

/* What every step's backward kernels share: this rank's queries, the
 * forward's lse, delta, and the fp32 dQ they accumulate into. */
typedef struct bwd_queries {
    const dt_tensor *q, *dout;
    const float *lse, *delta;
    float *dq;
    void *scratch;
    const attn_docs *docs;
} bwd_queries;

/* The backward block kernels of one step on key rows [r0, r1) (batch-major
 * over the b * c rows of K and dK|dV): this rank's queries against k, v (ks:
 * src's segment), contributions written (`first`) or added into dkv. One launch
 * per run of whole batches or part of one; each but the call's first continues
 * the launch before it (block.h). */
static dt_status run_rows(const attn_plan *p, const bwd_workspace *w, const bwd_queries *bq,
                          const char *k, const char *v, dt_attn_segment qs, dt_attn_segment ks,
                          float *dkv, int first, int continues, int64_t r0, int64_t r1) {
    const int64_t row = p->hkv * p->D;   /* elements of one key row */
    const size_t es = dt_dtype_size(p->dtype);
    while (r0 < r1) {
        const int64_t b0 = r0 / p->c, y0 = r0 % p->c;
        int64_t nb = 1, y1 = p->c;   /* batches [b0, b0 + nb), keys [y0, y1) of each */
        if (y0 == 0 && r1 - r0 >= p->c) nb = (r1 - r0) / p->c;
        else if (r1 - r0 < p->c - y0) y1 = y0 + (r1 - r0);
        const int64_t kv_off = b0 * p->c * row + y0 * row, q_off = b0 * p->c * p->h * p->D,
                      ml_off = b0 * p->h * p->c;
        const dt_attn_block_bwd_args a = {
            .dtype = p->dtype, .nonfinite = p->inputs_nonfinite,
            .batch = nb, .heads = p->h, .kv_heads = p->hkv, .dim = p->D,
            .q = (const char *)dt_tensor_data_const(bq->q) + (size_t)q_off * es,
            .dout = (const char *)dt_tensor_data_const(bq->dout) + (size_t)q_off * es,
            .q_batch_stride = p->c * p->h * p->D,
            .k = k + (size_t)kv_off * es, .v = v + (size_t)kv_off * es,
            .kv_batch_stride = p->c * row,
            .qseg = qs, .kseg = dt_attn_segment_rows(ks, y0, y1 - y0), .mask = p->mask,
            .scale = p->scale,
            .lse = bq->lse + ml_off, .delta = bq->delta + ml_off,
            .ml_batch_stride = p->h * p->c, .ml_head_stride = p->c,
            .dq = bq->dq + q_off, .dq_batch_stride = p->c * p->h * p->D,
            .dk = dkv + kv_off, .dv = dkv + w->grad_bytes / sizeof(float) + kv_off,
            .tuning = p->tuning, .first = first, .continues = continues,
            .window = p->window,
            .docs = bq->docs->dev ? bq->docs->dev + b0 * bq->docs->batch_stride : NULL,
            .docs_batch_stride = bq->docs->batch_stride,
        };
        DT_TRY(p->kern->bwd(p->ctx->backend, &a, bq->scratch));
        r0 += nb * (y1 - y0);
        continues = 1;
    }
    return DT_SUCCESS;
}

dt_status dt_attention_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                const dt_tensor *o, const dt_tensor *lse, const dt_tensor *dout,
                                const dt_attention_options *opts, dt_tensor **dq, dt_tensor **dk,
                                dt_tensor **dv) {
    if (opts && opts->a2a_dim >= 0)
        return attn_ulysses_backward(q, k, v, o, lse, dout, opts, dq, dk, dv);
    const char *op = "dt_attention_backward";
    attn_plan p;
    dt_status local = attn_plan_make(op, q, k, v, opts, &p);
    if (local == DT_SUCCESS && !(dq && dk && dv))
        local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: dq, dk and dv must not be NULL", op);
    if (local == DT_SUCCESS) local = check_outputs(&p, op, q, o, lse, dout);
    if (local == DT_SUCCESS) local = attn_plan_check_kernel(&p, op);
    bwd_workspace w = bwd_workspace_of(&p);
    if (local == DT_SUCCESS)
        local = attn_plan_check_workspace(&p, op, opts, w.total,
                                          "dt_attention_backward_workspace_size");
    dt_attention_timing *timing = opts ? opts->timing : NULL;
    if (local == DT_SUCCESS) local = attn_timing_begin(&p, timing);
    const dt_tensor *in[4] = {q, k, v, dout};
    static const char *const in_names[4] = {"q", "k", "v", "dout"};
    DT_TRY(attn_plan_check_call(&p, op, local, in, in_names, 4));
    dt_comm *comm = p.sp_dim >= 0 && p.parts > 1 ? dt_mesh_comm(p.mesh, p.sp_dim) : NULL;

    dt_backend *be = p.ctx->backend;
    dt_tensor *gq = NULL, *gk = NULL, *gv = NULL;
    char *ws = opts ? opts->workspace : NULL;
    int own_ws = ws == NULL;
    int pending = 0;                  /* a group is posted and not completed */
    attn_docs docs = {0};
    dt_status st;
    /* Not zeroed: what the loop adds into it zeroes first (as it must in a
     * caller's workspace), and the stores write all of dq, dk, dv. */
    if (own_ws) DT_TRY_GOTO(st, be->ops->alloc_uninit(be, w.total, (void **)&ws), fail);
    const dt_layout *lq = p.mesh ? dt_tensor_layout(q) : NULL;
    DT_TRY_GOTO(st, dt_tensor_create_uninit(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(q), lq,
                                            &gq), fail);
    DT_TRY_GOTO(st, dt_tensor_create_uninit(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(k), lq,
                                            &gk), fail);
    DT_TRY_GOTO(st, dt_tensor_create_uninit(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(v), lq,
                                            &gv), fail);

    float *dqa = (float *)(ws + w.off_dq), *delta = (float *)(ws + w.off_delta);
    size_t dkv_bytes = 2 * w.grad_bytes, dkv_n = dkv_bytes / sizeof(float);
    bwd_ring r = {.comm = comm, .k = dt_tensor_data_const(k), .v = dt_tensor_data_const(v),
                  .kv = {ws, ws + 2 * p.kv_bytes}};
    for (int i = 0; i < (comm ? BWD_GRAD_BUFS : 1); i++)
        r.grad[i] = (float *)(ws + w.off_grads + i * dkv_bytes);
    DT_TRY_GOTO(st, be->ops->zero(be, dqa, attn_plan_rows(&p) * (size_t)p.D * sizeof(float)),
                fail);
    DT_TRY_GOTO(st, p.kern->delta(be, p.dtype, p.b, p.c, p.h, p.D, dt_tensor_data_const(o),
                                  dt_tensor_data_const(dout), delta), fail);

    DT_TRY_GOTO(st, attn_docs_make(&p, q, ws + w.off_docs, &docs), fail);
    const bwd_queries bq = {.q = q, .dout = dout, .lse = dt_tensor_data_const(lse),
                            .delta = delta, .dq = dqa, .scratch = ws + w.off_scratch,
                            .docs = &docs};
    /* A block's key rows, batch-major; the last step's block runs in two
     * parts, rows [0, half) and [half, rows) (see the header). Every rank
     * splits alike, so that each part's messages match on both ends. */
    const int64_t rows = p.b * p.c, half = comm ? rows / 2 : rows;
    const int j = comm ? dt_comm_rank(comm) : 0, last = p.parts - 1;
    for (int t = 0; t < p.parts; t++) {
        int src = (j - t + p.parts) % p.parts;
        /* A block with no pair the rule allows (a causal contiguous ring's
         * blocks from later ranks) adds nothing: no kernel, no add; the sums
         * received leave as they came. Step 0's always runs: its block
         * starts the sums. */
        dt_attn_segment qs, ks;
        attn_plan_segments(&p, src, &qs, &ks);
        const int idle = t > 0 && !attn_plan_block_live(&p, &docs, qs, ks);
        DT_TRY_GOTO(st, bwd_ring_start(&r, &p, &w, t, &pending), fail);
        DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t), fail);
        DT_TRACE_PUSH("attention bwd blocks");
        if (!idle)
            st = run_rows(&p, &w, &bq, bwd_ring_k(&r, t), bwd_ring_v(&r, &p, t), qs, ks,
                          r.grad[LOC], 1, t > 0, 0, t < last ? rows : half);
        DT_TRACE_POP();
        if (st != DT_SUCCESS) goto fail;
        /* The last step's block ends after its second part, unless it is
         * idle: then the wait for the sums below is a wait, not a block. */
        if (t < last || !comm || idle)
            DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t + 1), fail);
        if (!comm) break;   /* one step; grad[LOC] holds the final sums */
        if (pending) {
            pending = 0;
            DT_TRY_GOTO(st, dt_comm_p2p_wait(comm), fail);
        }
        if (t == last) {
            /* src(P-1) = j+1's gradients: rows [0, half) are loc plus the sums,
             * rounded beside the kernel of rows [half, rows), which adds into
             * the sums themselves; each part goes home once rounded. */
            float *const sums = r.grad[RCV];
            DT_TRY_GOTO(st, bwd_round_rows(&p, &w, &r, sums, idle ? NULL : r.grad[LOC], 0, half),
                        fail);
            DT_TRY_GOTO(st, bwd_ring_home(&r, &p, &w, gk, gv, 0, half, &pending), fail);
            DT_TRACE_PUSH("attention bwd blocks");
            if (!idle)
                st = run_rows(&p, &w, &bq, bwd_ring_k(&r, t), bwd_ring_v(&r, &p, t), qs, ks,
                              sums, 0, 1, half, rows);
            DT_TRACE_POP();
            if (st != DT_SUCCESS) goto fail;
            if (!idle) DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t + 1), fail);
            DT_TRY_GOTO(st, bwd_round_rows(&p, &w, &r, sums, NULL, half, rows), fail);
            break;
        }
        /* src(t)'s sums so far plus this rank's: finished here, they leave
         * next. At step 0 nothing arrived: this rank's are all there is.
         * The add runs beside the next kernel, which writes the spare; the
         * next group's send of its sum follows it (backend.h, add_beside). */
        float *const loc = r.grad[LOC];
        if (t > 0) {
            if (!idle)
                DT_TRY_GOTO(st, be->ops->add_beside(be, DT_F32, (int64_t)dkv_n, r.grad[RCV], loc,
                                                    r.grad[RCV]), fail);
            float *const sum = r.grad[RCV];
            r.grad[RCV] = r.grad[SND];   /* sent: free to land the next sums */
            r.grad[SND] = sum;
            if (!idle) {                 /* an idle step wrote no loc and read none */
                r.grad[LOC] = r.grad[SPARE];
                r.grad[SPARE] = loc;     /* the kernel after next writes it */
            }
        } else {
            float *const unused = r.grad[SND];   /* nothing was sent at step 0 */
            r.grad[SND] = loc;
            r.grad[LOC] = r.grad[SPARE];
            r.grad[SPARE] = unused;
        }
        r.cur = 1 - r.cur;
    }
    /* Without a ring dK|dV are final in grad[LOC], rounded into dk, dv
     * here. Else they come home in two parts, the second posted once the
     * first is in (one group at a time); dQ is stored while it travels. */
    if (!comm) DT_TRY_GOTO(st, bwd_store(&p, &w, r.grad[LOC], gk, gv), fail);
    if (pending) {
        pending = 0;
        DT_TRY_GOTO(st, dt_comm_p2p_wait(comm), fail);
    }
    if (comm) DT_TRY_GOTO(st, bwd_ring_home(&r, &p, &w, gk, gv, half, rows, &pending), fail);
    DT_TRY_GOTO(st, p.kern->store(be, p.dtype, (size_t)dt_tensor_local_numel(gq), dqa,
                                  dt_tensor_data(gq)), fail);
    if (pending) {
        pending = 0;
        DT_TRY_GOTO(st, dt_comm_p2p_wait(comm), fail);
    }
    DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * p.parts), fail);
    DT_TRY_GOTO(st, attn_timing_end(&p, timing), fail);
    attn_docs_free(&docs);
    if (own_ws) be->ops->free(be, ws);
    /* kernels that may lose a NaN or Inf of the inputs: all of dq, dk, dv NaN */
    dt_tensor *const outs[3] = {gq, gk, gv};
    st = attn_plan_nonfinite_outputs(&p, outs, 3);
    /* DT_CHECK: finite inputs gave finite gradients (the ring is done: no abort) */
    if (st == DT_SUCCESS) st = attn_plan_check_output(&p, op, gq, "dq", 0);
    if (st == DT_SUCCESS) st = attn_plan_check_output(&p, op, gk, "dk", 0);
    if (st == DT_SUCCESS) st = attn_plan_check_output(&p, op, gv, "dv", 0);
    if (st != DT_SUCCESS) {
        dt_tensor_destroy(gq), dt_tensor_destroy(gk), dt_tensor_destroy(gv);
        return st;
    }
    *dq = gq;
    *dk = gk;
    *dv = gv;
    return DT_SUCCESS;
fail:
    /* Peers may wait for this rank's blocks: release them. A group still
     * posted is completed (with the abort's error) before its buffers go. */
    if (comm) dt_comm_abort(comm, st, dt_last_error());
    if (pending) (void)dt_comm_p2p_wait(comm);
    attn_docs_free(&docs);
    if (own_ws && ws) be->ops->free(be, ws);
    dt_tensor_destroy(gq);
    dt_tensor_destroy(gk);
    dt_tensor_destroy(gv);
    return st;
}
