/* attention/ulysses.c — attention by Layout: the all-to-all ("Ulysses")
 * dim (dt_attention_options.a2a_dim; attention.h).
 *
 * Ulysses attention is a Layout change, not an algorithm of its own. With
 * the sequence (dim 1) of q, k, v sharded over mesh dim u of U ranks, the
 * call redistributes them so that u shards the heads (dim 2, contiguous,
 * after any mesh dim that shards them already): one all-to-all over u.
 * Each rank then holds the whole sequence, or the part a second mesh dim
 * still shards (the Ulysses x ring hybrid: the ring runs over that dim),
 * for 1/U of the heads, and the ordinary call runs on those Layouts. Its o
 * and lse go back by the inverse all-to-all. The backward redistributes q,
 * k, v, o, lse and dout the same way and dq, dk, dv back.
 *
 * GQA: when U times the mesh dims already sharding the heads (T) does not
 * divide H_kv, each kv head is repeated e = lcm(H_kv, T U) / H_kv times
 * (head j of the repeated k, v is head j / e, the query heads keep their kv
 * head), as DeepSpeed does, before the all-to-all; the backward sums the
 * copies' gradients. H must be divisible by T U.
 *
 * Every rank validates the same arguments alike; ranks that disagree on
 * a2a_dim fail together at one agreement check before anything moves.
 * Test: tests/test_attention_ulysses.c (make test).
 */
#include "attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dtensor/mesh.h"
#include "../dtensor/primitives.h"
#include "../dtensor/tensor_internal.h"
#include "plan.h"

/* What a call with an all-to-all dim does. */
typedef struct ulysses_plan {
    int u, U;              /* the all-to-all mesh dim, its size */
    int64_t e;             /* kv head repeats (1: none) */
    dt_layout seq, heads;  /* q's Layout; the same with u sharding the heads */
} ulysses_plan;

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The Layout of lse [B, H, S] for q's [B, S, H, D] Layout l. */
static dt_layout lse_layout_of(const dt_layout *l) {
    dt_layout r = *l;
    for (int m = 0; m < r.ndim; m++)
        if (r.placements[m].kind == DT_SHARD &&
            (r.placements[m].dim == 1 || r.placements[m].dim == 2))
            r.placements[m].dim = 3 - r.placements[m].dim;
    return r;
}

/* Validates the all-to-all dim against q and k; touches nothing. */
static dt_status plan_make(const char *op, const dt_tensor *q, const dt_tensor *k,
                           const dt_attention_options *opts, ulysses_plan *u) {
    memset(u, 0, sizeof *u);
    DT_REQUIRE(q && k, "%s: q and k must not be NULL", op);
    const dt_mesh *mesh = dt_tensor_mesh(q);
    char f[128];
    DT_REQUIRE(mesh, "%s: a2a_dim %d names a mesh dim, but q has no mesh", op, opts->a2a_dim);
    DT_REQUIRE(dt_tensor_ndim(q) == 4 && dt_tensor_ndim(k) == 4,
               "%s: q and k must be [B, S, H, D] (ndim %d, %d)", op, dt_tensor_ndim(q),
               dt_tensor_ndim(k));
    const dt_layout *l = dt_tensor_layout(q);
    dt_layout_format(l, f, sizeof f);
    DT_REQUIRE(opts->a2a_dim < l->ndim, "%s: a2a_dim %d is not a mesh dim (the mesh has %d)", op,
               opts->a2a_dim, l->ndim);
    u->u = opts->a2a_dim;
    u->U = dt_mesh_size(mesh, u->u);
    const dt_placement pl = l->placements[u->u];
    DT_REQUIRE(pl.kind == DT_SHARD && pl.dim == 1,
               "%s: a2a_dim %d must shard the sequence (dim 1) of q, k, v; their Layout is %s", op,
               u->u, f);
    const int64_t H = dt_tensor_shape(q)[2], Hkv = dt_tensor_shape(k)[2];
    int64_t T = 1;   /* the ranks of the mesh dims that shard the heads already */
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_SHARD && l->placements[m].dim == 2)
            T *= dt_mesh_size(mesh, m);
    const int64_t TU = T * u->U;
    if (H % TU || Hkv < 1 || H % Hkv)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: %lld heads (kv heads %lld) over the %lld "
                        "ranks of a2a_dim %d%s: the heads must be divisible by them", op,
                        (long long)H, (long long)Hkv, (long long)TU, u->u,
                        T > 1 ? " and the heads' mesh dims" : "");
    u->e = TU / gcd64(Hkv, TU);   /* lcm(Hkv, TU) / Hkv */
    u->seq = *l;
    u->heads = *l;
    u->heads.placements[u->u] = dt_shard(2, DT_ORDER_CONTIGUOUS);
    return DT_SUCCESS;
}

/* COLLECTIVE over the world: the local verdict and the all-to-all dim. */
static dt_status plan_agree(const dt_tensor *q, const char *op, dt_status local,
                            const ulysses_plan *u, const dt_attention_options *opts) {
    static const char *const names[2] = {"a2a_dim", "kv head repeats"};
    const int64_t v[2] = {opts->a2a_dim, u->e};
    return dt_context_check_call(q ? dt_tensor_context(q) : NULL, op, local, v, names, 2,
                                 DT_CHECK_ON);
}

/* t [B, S, Hkv, D] with each head repeated e times: head j of *out is head
 * j / e of t (e = 1: *out = NULL, t stands). Local copies, t's Layout. */
static dt_status repeat_heads(const dt_tensor *t, int64_t e, dt_tensor **out) {
    *out = NULL;
    if (e == 1) return DT_SUCCESS;
    const int64_t *s = dt_tensor_shape(t), *ls = dt_tensor_local_shape(t);
    const int64_t shape[4] = {s[0], s[1], s[2] * e, s[3]}, rows = ls[0] * ls[1];
    const int64_t h = ls[2], D = ls[3];
    dt_tensor *r = NULL;
    DT_TRY(dt_tensor_create_uninit(dt_tensor_context(t), dt_tensor_mesh(t), dt_tensor_dtype(t), 4,
                                   shape, dt_tensor_mesh(t) ? dt_tensor_layout(t) : NULL, &r));
    dt_status st = DT_SUCCESS;
    if (rows * h > 0) {
        int64_t *off = malloc((size_t)(h * e) * 2 * sizeof *off);
        if (!off) st = dt_error(DT_ERR_OUT_OF_MEMORY, "repeating kv heads: out of host memory");
        for (int64_t j = 0; st == DT_SUCCESS && j < h * e; j++) {
            off[j] = j * D;                    /* head j of the repeated row */
            off[h * e + j] = (j / e) * D;      /* from head j / e of t's */
        }
        const dt_runs runs = {.dtype = dt_tensor_dtype(t), .op = DT_RUNS_COPY,
                              .dst = dt_tensor_data(r), .src = dt_tensor_data_const(t),
                              .outer = rows, .n = h * e, .run_elems = D,
                              .dst_outer = h * e * D, .src_outer = h * D,
                              .dst_off = off, .src_off = off ? off + h * e : NULL};
        if (st == DT_SUCCESS) st = dt_tensor_context(t)->backend->ops->copy_runs(
                                  dt_tensor_context(t)->backend, &runs);
        free(off);
    }
    return dt_op_output(st, r, out);
}

/* The gradient of repeat_heads: *out [B, S, Hkv, D] sums the e copies of
 * each head of g [B, S, Hkv e, D] (in g's dtype, copy after copy). */
static dt_status sum_heads(const dt_tensor *g, int64_t e, dt_tensor **out) {
    const int64_t *s = dt_tensor_shape(g), *ls = dt_tensor_local_shape(g);
    const int64_t shape[4] = {s[0], s[1], s[2] / e, s[3]}, rows = ls[0] * ls[1];
    const int64_t h = ls[2] / e, D = ls[3];
    dt_tensor *r = NULL;
    DT_TRY(dt_tensor_create_uninit(dt_tensor_context(g), dt_tensor_mesh(g), dt_tensor_dtype(g), 4,
                                   shape, dt_tensor_mesh(g) ? dt_tensor_layout(g) : NULL, &r));
    dt_status st = DT_SUCCESS;
    dt_backend *be = dt_tensor_context(g)->backend;
    int64_t *off = rows * h > 0 ? malloc((size_t)h * 2 * sizeof *off) : NULL;
    if (rows * h > 0 && !off)
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "summing kv heads: out of host memory");
    for (int64_t i = 0; st == DT_SUCCESS && rows * h > 0 && i < e; i++) {
        for (int64_t j = 0; j < h; j++) {
            off[j] = j * D;                    /* head j of the sum */
            off[h + j] = (j * e + i) * D;      /* its copy i */
        }
        const dt_runs runs = {.dtype = dt_tensor_dtype(g), .op = i ? DT_RUNS_ADD : DT_RUNS_COPY,
                              .dst = dt_tensor_data(r), .src = dt_tensor_data_const(g),
                              .outer = rows, .n = h, .run_elems = D,
                              .dst_outer = h * D, .src_outer = h * e * D,
                              .dst_off = off, .src_off = off + h};
        st = be->ops->copy_runs(be, &runs);
    }
    free(off);
    return dt_op_output(st, r, out);
}

/* *out := t redistributed to l. */
static dt_status to(const dt_tensor *t, const dt_layout *l, dt_tensor **out) {
    return dt_tensor_redistribute(t, l, out);
}

/* After the agreement a failing rank aborts the world, so that no peer
 * waits for its part of a redistribution. */
static dt_status fail_all(const dt_tensor *q, dt_status st) {
    dt_comm_abort(dt_context_comm(dt_tensor_context(q)), st, dt_last_error());
    return st;
}

/* The options of the call on the redistributed tensors. */
static dt_attention_options inner_opts(const dt_attention_options *opts) {
    dt_attention_options o = *opts;
    o.a2a_dim = -1;
    o.workspace = NULL;   /* sized for other shapes: the inner call makes its own */
    o.workspace_bytes = 0;
    return o;
}

/* q, k, v with the heads over u (kv heads repeated first where u.e > 1):
 * t[0], t[1] the repeated k, v (or NULL), t[2..4] q, k, v redistributed. */
static dt_status heads_inputs(const ulysses_plan *u, const dt_tensor *q, const dt_tensor *k,
                              const dt_tensor *v, dt_tensor **t) {
    DT_TRY(repeat_heads(k, u->e, &t[0]));
    DT_TRY(repeat_heads(v, u->e, &t[1]));
    DT_TRY(to(q, &u->heads, &t[2]));
    DT_TRY(to(t[0] ? t[0] : k, &u->heads, &t[3]));
    return to(t[1] ? t[1] : v, &u->heads, &t[4]);
}

static void destroy_all(dt_tensor **t, int n) {
    for (int i = 0; i < n; i++) {
        dt_tensor_destroy(t[i]);
        t[i] = NULL;
    }
}

dt_status attn_ulysses_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_options *opts, dt_tensor **o, dt_tensor **lse) {
    const char *op = "dt_attention_forward";
    ulysses_plan u;
    dt_status local = plan_make(op, q, k, opts, &u);
    if (local == DT_SUCCESS && !o) local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: o is NULL", op);
    DT_TRY(plan_agree(q, op, local, &u, opts));
    /* kr, vr: the repeated kv heads; qh, kh, vh: heads over u; oh, lh: the result */
    enum { KR, VR, QH, KH, VH, OH, LH, OUT, LSE, N };
    dt_tensor *t[N] = {NULL};
    dt_status st;
    const dt_layout lse_seq = lse_layout_of(&u.seq);
    const dt_attention_options in = inner_opts(opts);
    DT_TRY_GOTO(st, heads_inputs(&u, q, k, v, &t[KR]), fail);
    DT_TRY_GOTO(st, dt_attention_forward(t[QH], t[KH], t[VH], &in, &t[OH], &t[LH]), fail);
    DT_TRY_GOTO(st, to(t[OH], &u.seq, &t[OUT]), fail);
    if (lse) DT_TRY_GOTO(st, to(t[LH], &lse_seq, &t[LSE]), fail);
    *o = t[OUT];
    if (lse) *lse = t[LSE];
    t[OUT] = t[LSE] = NULL;
    st = DT_SUCCESS;
fail:
    destroy_all(t, N);
    return st == DT_SUCCESS ? st : fail_all(q, st);
}

dt_status attn_ulysses_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                const dt_tensor *o, const dt_tensor *lse, const dt_tensor *dout,
                                const dt_attention_options *opts, dt_tensor **dq, dt_tensor **dk,
                                dt_tensor **dv) {
    const char *op = "dt_attention_backward";
    ulysses_plan u;
    dt_status local = plan_make(op, q, k, opts, &u);
    if (local == DT_SUCCESS && !(dq && dk && dv))
        local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: dq, dk and dv must not be NULL", op);
    if (local == DT_SUCCESS && !(o && lse && dout))
        local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: o, lse and dout must not be NULL", op);
    if (local == DT_SUCCESS && !dt_layout_equal(dt_tensor_layout(dout), &u.seq))
        local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: dout must have q's Layout", op);
    DT_TRY(plan_agree(q, op, local, &u, opts));
    enum { KR, VR, QH, KH, VH, OH, LH, GH, DQH, DKH, DVH, DQ, DKR, DVR, DK, DV, N };
    dt_tensor *t[N] = {NULL};
    dt_status st;
    const dt_layout lse_heads = lse_layout_of(&u.heads);
    const dt_attention_options in = inner_opts(opts);
    DT_TRY_GOTO(st, heads_inputs(&u, q, k, v, &t[KR]), fail);
    DT_TRY_GOTO(st, to(o, &u.heads, &t[OH]), fail);
    DT_TRY_GOTO(st, to(lse, &lse_heads, &t[LH]), fail);
    DT_TRY_GOTO(st, to(dout, &u.heads, &t[GH]), fail);
    DT_TRY_GOTO(st, dt_attention_backward(t[QH], t[KH], t[VH], t[OH], t[LH], t[GH], &in, &t[DQH],
                                          &t[DKH], &t[DVH]), fail);
    DT_TRY_GOTO(st, to(t[DQH], &u.seq, &t[DQ]), fail);
    DT_TRY_GOTO(st, to(t[DKH], &u.seq, &t[DKR]), fail);
    DT_TRY_GOTO(st, to(t[DVH], &u.seq, &t[DVR]), fail);
    if (u.e > 1) {
        DT_TRY_GOTO(st, sum_heads(t[DKR], u.e, &t[DK]), fail);
        DT_TRY_GOTO(st, sum_heads(t[DVR], u.e, &t[DV]), fail);
    } else {
        t[DK] = t[DKR], t[DV] = t[DVR];
        t[DKR] = t[DVR] = NULL;
    }
    *dq = t[DQ];
    *dk = t[DK];
    *dv = t[DV];
    t[DQ] = t[DK] = t[DV] = NULL;
    st = DT_SUCCESS;
fail:
    destroy_all(t, N);
    return st == DT_SUCCESS ? st : fail_all(q, st);
}
