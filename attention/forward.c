/* attention/forward.c — the distributed attention forward pass.
 *
 * Algorithm (docs/ARCHITECTURE.md, "One attention call"). Rank j of the P ranks of the
 * sequence mesh dim holds a query and a key/value shard, each one position
 * segment (mask.h; a zigzag shard's two chunks are one segment with a jump).
 * For t = 0..P-1, step t's block is rank (j - t) mod P's K and V: the hop
 * that brings the next block is posted before the block kernel runs on the
 * current one and completed after. Step 0 reads this rank's K and V where
 * they are and sends them from there (no copy into the ring). With
 * opts->group = G > 1, steps after 0 run in launches of up to G blocks side by
 * side (fwd_runs), the ring up to G hops ahead. The kernel keeps m, l, acc in
 * fp32; the first block starts them, and the rank's last block with a pair the
 * rule allows (mask.h) writes o and lse: no pass over the rows before or after
 * the ring, and no launch for a block without such a pair.
 *
 * Invariants: everything the loop touches lives in one workspace sized by
 * dt_attention_workspace_size, allocated before the loop or given; ranks agree
 * on the call (one small all_gather) before any block moves; a rank that fails
 * after that aborts the communicator, so no peer waits for it.
 *
 * Test: tests/test_attention.c (make test).
 */
#include "attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../collectives/ring.h"
#include "../dtensor/tensor_internal.h"
#include "../base/trace.h"
#include "block.h"
#include "plan.h"

/* A launch's keys: k, v with kv_batch_stride elements between batch
 * entries, interleaved from `slots` slots of c rows (block.h; 1: not), and
 * their segment (mask.h), with the segment the queries take against them. */
typedef struct launch_keys {
    const void *k, *v;
    int64_t kv_batch_stride, slots;
    dt_attn_segment qseg, kseg;
} launch_keys;

/* The arguments of a launch's block: `first` starts the rows, `last`
 * writes o and lse (the launch holding the rank's last block with a pair
 * the rule allows; a block without one adds nothing and launches nothing); `transfer`: the ring's next hops run beside it.
 * acc, m, l: the running state, NULL in a stateless call (fwd_stateless). */
static dt_attn_block_args block_args(const attn_plan *p, const attn_docs *docs, int first,
                                     int last, int transfer, const void *q, launch_keys keys,
                                     float *acc, float *m, float *l, void *o, float *lse,
                                     uint32_t *launches) {
    return (dt_attn_block_args){
        .dtype = p->dtype, .nonfinite = p->inputs_nonfinite,
        .batch = p->b, .heads = p->h, .kv_heads = p->hkv, .dim = p->D,
        .q = q, .q_batch_stride = p->c * p->h * p->D,
        .k = keys.k, .v = keys.v, .kv_batch_stride = keys.kv_batch_stride,
        .kv_slots = keys.slots, .kv_slot_rows = p->c,
        .qseg = keys.qseg, .kseg = keys.kseg, .mask = p->mask, .scale = p->scale,
        .m = m, .l = l, .ml_batch_stride = p->h * p->c, .ml_head_stride = p->c,
        .acc = acc, .acc_batch_stride = p->c * p->h * p->D,
        .first = first, .last = last,
        .o = o, .lse = lse,
        .tuning = p->tuning,
        .transfer = transfer,
        .launches = launches,
        .window = p->window, .docs = docs->dev, .docs_batch_stride = docs->batch_stride,
    };
}

/* The ring's steps in launches of up to G = p->group blocks (mask.h's
 * dt_attn_ring_runs: run 0 is step 0 alone, on the rank's own K and V; then
 * runs of steps whose sources are neighbours in the sequence). Runs land in
 * two alternating buffer sets, each [K | V] of [b][G c][hkv][D], in pieces of
 * the same sizes on every rank: whole K and V for G = 1, else per batch entry
 * (and per zigzag chunk). */
typedef struct fwd_runs {
    int n;                              /* runs */
    int first[DT_ATTN_MAX_STEPS + 1];   /* run r: steps first[r] .. first[r+1] - 1 */
    int live[DT_ATTN_MAX_STEPS];        /* run r launches: a block of it has a pair the
                                           rule allows (run 0 always: it starts the rows) */
    int last;                           /* the last run that launches: it finishes them */
    int halves;                         /* pieces per batch entry and tensor: 2 for
                                           grouped zigzag chunks, else 1 */
    int pieces;                         /* per block */
    size_t piece_bytes, row_bytes, set_kv_bytes;
    char *set[2];                       /* the two buffer sets */
    const char *own[2];                 /* this rank's K and V */
} fwd_runs;

static void fwd_runs_make(const attn_plan *p, const attn_docs *docs, char *sets, const void *k,
                          const void *v, fwd_runs *f) {
    memset(f, 0, sizeof *f);
    const int G = p->group;
    f->n = dt_attn_ring_runs(p->order, p->mask, p->S, p->parts, p->rank, G, f->first);
    for (int r = 0; r < f->n; r++) {
        for (int t = f->first[r]; t < f->first[r + 1] && !f->live[r]; t++) {
            dt_attn_segment qs, ks;
            attn_plan_segments(p, (p->rank - t + p->parts) % p->parts, &qs, &ks);
            f->live[r] = r == 0 || attn_plan_block_live(p, docs, qs, ks);
        }
        if (f->live[r]) f->last = r;
    }
    f->halves = G > 1 && p->order == DT_ORDER_ZIGZAG ? 2 : 1;
    f->row_bytes = (size_t)(p->hkv * p->D) * dt_dtype_size(p->dtype);
    f->pieces = G > 1 ? 2 * (int)p->b * f->halves : 2;
    f->piece_bytes = G > 1 ? (size_t)(p->c / f->halves) * f->row_bytes : p->kv_bytes;
    f->set_kv_bytes = (size_t)G * p->kv_bytes;
    f->set[0] = sets;
    f->set[1] = sets ? sets + 2 * f->set_kv_bytes : NULL;
    f->own[0] = k;
    f->own[1] = v;
}

static int fwd_run_of(const fwd_runs *f, int t) {
    int r = 0;
    while (f->first[r + 1] <= t) r++;
    return r;
}

/* Where piece i of step t's block lies on this rank. */
static char *fwd_piece(const attn_plan *p, const fwd_runs *f, int t, int i) {
    const int per_kv = f->pieces / 2, kv = i / per_kv;
    if (p->group == 1)   /* whole K or V, in the tensor or a set laid out as one */
        return t == 0 ? (char *)f->own[kv] : f->set[fwd_run_of(f, t) & 1] + kv * f->set_kv_bytes;
    const int64_t b = (i % per_kv) / f->halves, half = i % f->halves;
    const int64_t rows = p->c / f->halves;   /* a piece's */
    if (t == 0) return (char *)f->own[kv] + (size_t)(b * p->c + half * rows) * f->row_bytes;
    const int r = fwd_run_of(f, t);
    const int64_t n = f->first[r + 1] - f->first[r];
    const int64_t from_low = f->first[r + 1] - 1 - t, from_high = t - f->first[r];
    const int64_t row = half == 0 ? from_low * rows : n * rows + from_high * rows;
    return f->set[r & 1] + kv * f->set_kv_bytes +
           (size_t)(b * p->group * p->c + row) * f->row_bytes;
}

/* The keys of run r's launch: run 0's, this rank's own, where they are. */
static launch_keys fwd_keys(const attn_plan *p, const fwd_runs *f, int r) {
    launch_keys keys = {.k = f->own[0], .v = f->own[1], .kv_batch_stride = p->c * p->hkv * p->D};
    if (r > 0)
        keys = (launch_keys){.k = f->set[r & 1], .v = f->set[r & 1] + f->set_kv_bytes,
                             .kv_batch_stride = p->group * p->c * p->hkv * p->D};
    keys.slots = dt_attn_ring_run_keys(p->order, p->mask, p->S, p->parts, p->rank, f->first[r],
                                       f->first[r + 1], &keys.qseg, &keys.kseg);
    if (p->ruled && p->order == DT_ORDER_STRIPED)   /* one step a launch (plan.c), at the */
        attn_plan_segments(p, (p->rank - f->first[r] + p->parts) % p->parts, &keys.qseg,
                           &keys.kseg);             /* positions the rule compares */
    return keys;
}

/* Posts the hop that brings step t's block (t >= 1): it sends step t - 1's
 * from where it lies and lands step t's where its run wants it. */
static dt_status fwd_hop(const attn_plan *p, const fwd_runs *f, dt_ring *ring, int t, int chained,
                         const void **send, void **into, size_t *sizes) {
    for (int i = 0; i < f->pieces; i++) {
        send[i] = fwd_piece(p, f, t - 1, i);
        into[i] = fwd_piece(p, f, t, i);
        sizes[i] = f->piece_bytes;
    }
    return dt_ring_start_into(ring, send, into, sizes, f->pieces, chained);
}

/* Whether the call runs without the fp32 running state (acc, m, l): one
 * block (no ring: one step) on a kernel that keeps the state in registers
 * (dt_attn_kernels.fwd_stateless). Then the workspace has none: B S H D
 * fp32 less. */
static int fwd_stateless(const attn_plan *p, const dt_tensor *q, const dt_tensor *k,
                         const dt_tensor *v) {
    /* with documents or a window the state stays in the workspace */
    if (p->parts != 1 || p->ruled || !p->kern || !p->kern->fwd_stateless) return 0;
    const attn_docs none = {0};
    fwd_runs f;                   /* one rank: its own keys */
    fwd_runs_make(p, &none, NULL, dt_tensor_data_const(k), dt_tensor_data_const(v), &f);
    const dt_attn_block_args a = block_args(p, &none, 1, 1, 0, dt_tensor_data_const(q),
                                            fwd_keys(p, &f, 0), NULL, NULL, NULL, NULL, NULL, NULL);
    return p->kern->fwd_stateless(p->ctx->backend, &a);
}

/* Workspace of a forward call: [ring: 2 sets x (K | V) x G] [acc] [m] [l]
 * [kernel scratch] [document bounds]. With one rank on the sequence there
 * is no ring: the kernels read K and V where they are; a stateless call has
 * no acc, m, l. */
typedef struct fwd_workspace {
    int stateless;
    size_t off_acc, off_m, off_l, off_scratch, off_docs, total;
} fwd_workspace;

static fwd_workspace fwd_workspace_of(const attn_plan *p, const dt_tensor *q, const dt_tensor *k,
                                      const dt_tensor *v) {
    fwd_workspace w;
    w.stateless = fwd_stateless(p, q, k, v);
    const size_t rows = w.stateless ? 0 : attn_plan_rows(p);
    w.off_acc = p->parts > 1 ? attn_align(4 * (size_t)p->group * p->kv_bytes) : 0;
    w.off_m = w.off_acc + attn_align(rows * (size_t)p->D * sizeof(float));
    w.off_l = w.off_m + attn_align(rows * sizeof(float));
    w.off_scratch = w.off_l + attn_align(rows * sizeof(float));
    w.off_docs = w.off_scratch +
                 attn_align(p->kern ? p->kern->fwd_scratch(p->D, p->b * p->h, p->c) : 0);
    w.total = w.off_docs + attn_docs_bytes(p);
    return w;
}

dt_status dt_attention_workspace_size(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                      const dt_attention_options *opts, size_t *bytes) {
    DT_REQUIRE(bytes != NULL, "dt_attention_workspace_size: bytes is NULL");
    if (opts && opts->a2a_dim >= 0) {   /* the workspace is not used (attention.h) */
        *bytes = 0;
        return DT_SUCCESS;
    }
    attn_plan p;
    DT_TRY(attn_plan_make("dt_attention_workspace_size", q, k, v, opts, &p));
    *bytes = fwd_workspace_of(&p, q, k, v).total;
    return DT_SUCCESS;
}

dt_status dt_attention_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_options *opts, dt_tensor **o, dt_tensor **lse) {
    if (opts && opts->a2a_dim >= 0) return attn_ulysses_forward(q, k, v, opts, o, lse);
    const char *op = "dt_attention_forward";
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
    const dt_tensor *in[3] = {q, k, v};
    static const char *const in_names[3] = {"q", "k", "v"};
    DT_TRY(attn_plan_check_call(&p, op, local, in, in_names, 3));
    dt_comm *comm = p.sp_dim >= 0 && p.parts > 1 ? dt_mesh_comm(p.mesh, p.sp_dim) : NULL;

    dt_backend *be = p.ctx->backend;
    dt_tensor *out = NULL, *out_lse = NULL;
    dt_ring *ring = NULL;
    void *hop_args = NULL;
    attn_docs docs = {0};
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

    DT_TRY_GOTO(st, attn_docs_make(&p, q, ws + w.off_docs, &docs), fail);
    fwd_runs f;
    fwd_runs_make(&p, &docs, comm ? ws : NULL, dt_tensor_data_const(k), dt_tensor_data_const(v), &f);
    const void **send = NULL;
    void **into = NULL;
    size_t *sizes = NULL;
    if (comm) {
        /* A ring of no buffers of its own: every hop lands where its run
         * wants it (fwd_piece). The agreement check above covered what the
         * pieces follow from (shapes, Layout, group) and the direction
         * (always forward). */
        DT_TRY_GOTO(st, dt_ring_create_in_agreed(comm, 0, DT_RING_FORWARD, ws, &ring), fail);
        DT_TRY_GOTO(st, dt_ring_reserve(ring, f.pieces), fail);
        hop_args = malloc((size_t)f.pieces * (2 * sizeof(void *) + sizeof(size_t)));
        if (!hop_args) {
            st = dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: %s: out of memory for %d pieces a hop",
                          dt_context_rank(p.ctx), op, f.pieces);
            goto fail;
        }
        send = hop_args;
        into = (void **)(send + f.pieces);
        sizes = (size_t *)(into + f.pieces);
    }

    /* Run r + 1's first hop is posted before run r's launch: ordered after the
     * launches before (the last readers of its landing set), beside this one;
     * its other hops follow chained, also beside this launch. */
    uint32_t launches = 0;   /* the call's blocks that count their rows (block.h) */
    for (int r = 0; r < f.n; r++) {
        const int t0 = f.first[r], t1 = f.first[r + 1], more = r + 1 < f.n;
        if (more) DT_TRY_GOTO(st, fwd_hop(&p, &f, ring, t1, 0, send, into, sizes), fail);
        DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t0), fail);
        if (f.live[r]) {
            DT_TRACE_PUSH("attention fwd blocks");
            const dt_attn_block_args a =
                block_args(&p, &docs, r == 0, r == f.last, more, dt_tensor_data_const(q),
                           fwd_keys(&p, &f, r), acc, m, l, dt_tensor_data(out),
                           dt_tensor_data(out_lse), &launches);
            st = p.kern->fwd(be, &a, ws + w.off_scratch);
            DT_TRACE_POP();
            if (st != DT_SUCCESS) goto fail;
        }
        for (int t = t0; t < t1; t++) {   /* a launch's time on its first step */
            if (t > t0) DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t), fail);
            DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * t + 1), fail);
        }
        if (!more) continue;
        DT_TRY_GOTO(st, dt_ring_wait(ring), fail);
        for (int t = t1 + 1; t < f.first[r + 2]; t++) {
            DT_TRY_GOTO(st, fwd_hop(&p, &f, ring, t, 1, send, into, sizes), fail);
            DT_TRY_GOTO(st, dt_ring_wait(ring), fail);
        }
    }
    DT_TRY_GOTO(st, attn_timing_mark(&p, timing, 2 * p.parts), fail);
    DT_TRY_GOTO(st, attn_timing_end(&p, timing), fail);
    dt_ring_destroy(ring);
    free(hop_args);
    attn_docs_free(&docs);
    if (own_ws) be->ops->free(be, ws);
    /* kernels that may lose a NaN or Inf of the inputs: all of o, lse NaN */
    dt_tensor *const outs[2] = {out, out_lse};
    st = attn_plan_nonfinite_outputs(&p, outs, 2);
    /* DT_CHECK: finite inputs gave finite outputs (the ring is done: no abort) */
    if (st == DT_SUCCESS) st = attn_plan_check_output(&p, op, out, "o", 0);
    if (st == DT_SUCCESS) st = attn_plan_check_output(&p, op, out_lse, "lse", 1);
    if (st != DT_SUCCESS) {
        dt_tensor_destroy(out);
        dt_tensor_destroy(out_lse);
        return st;
    }
    *o = out;
    if (lse) *lse = out_lse;
    else dt_tensor_destroy(out_lse);
    return DT_SUCCESS;
fail:
    /* Peers may be waiting for this rank's next block: release them. */
    if (comm) dt_comm_abort(comm, st, dt_last_error());
    dt_ring_destroy(ring);
    free(hop_args);
    attn_docs_free(&docs);
    if (own_ws && ws) be->ops->free(be, ws);
    dt_tensor_destroy(out);
    dt_tensor_destroy(out_lse);
    return st;
}
