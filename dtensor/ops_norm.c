/* dtensor/ops_norm.c — reshape, RMSNorm and rotary embedding (ops_nn.h).
 *
 * These ops are written the way a sharded op is added (docs/TUTORIAL.md
 * walks through dt_rmsnorm and dt_rotary): read the Layouts, decide what the
 * op needs (here: no communication, because each rule keeps every element's
 * inputs local), derive the output Layout, then run one local kernel through
 * the compute backend table (backend.h), so the same op runs on every
 * backend.
 *
 *   reshape  Groups of dims with equal products map onto each other; a Shard
 *            of the outer dim of a group, in a block order (contiguous,
 *            zigzag), is the same block of the flattened group, so the local
 *            buffer is already the new local tensor: one backend copy (device
 *            to device on CUDA), no traffic.
 *   rmsnorm  Reduces over the last dim: legal iff that dim is whole on every
 *            rank (not sharded, not Partial). Kernel: backend rmsnorm on the
 *            local [rows, E].
 *   rotary   Needs each token's global position: local row x of dim 1 is
 *            global token dt_order_global(order, S, P, coord, x) when a mesh
 *            dim shards dim 1 (their composition, dt_layout_global_index,
 *            when several do), which makes the op correct under contiguous,
 *            striped and zigzag sharding alike. Linear, so Partial passes.
 *            The table of the local rows' positions is built here on the host
 *            from the Layout and handed to the backend's rotary kernel (the
 *            CUDA backend stages it into device scratch). With one document
 *            list per batch row the positions differ per row: the table is
 *            [local batch rows, local seq rows] (the global batch row of each
 *            from dim 0's index map), passed with a row stride; otherwise it
 *            is one [local seq rows] shared by every batch row.
 *
 * No loop here touches tensor data: every byte is read and written by the
 * backend.
 *
 * Test: tests/test_transformer.c; rotary with documents: tests/test_grad.c (make test).
 */
#include "ops_nn.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "docs.h"
#include "tensor_internal.h"
#include "mesh.h"

const char *dt_rotary_style_name(dt_rotary_style style) {
    switch (style) {
    case DT_ROTARY_HALF: return "half";
    case DT_ROTARY_INTERLEAVED: return "interleaved";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------------ helpers */

static dt_status nn_check_dtype(const char *op, const dt_tensor *t) {
    return dt_context_check_dtype(dt_tensor_context(t), op, dt_tensor_dtype(t));
}

/* `l` with every Partial and every Shard of dim `last` replaced by
 * Replicate, formatted: the redistribution an error message suggests. */
static void nn_suggest(const dt_layout *l, int last, char *buf, size_t size) {
    dt_layout s = *l;
    for (int m = 0; m < s.ndim; m++) {
        dt_placement p = s.placements[m];
        if (p.kind == DT_PARTIAL || (p.kind == DT_SHARD && p.dim == last))
            s.placements[m] = dt_replicate();
    }
    dt_layout_format(&s, buf, size);
}

/* A new tensor with x's context, mesh, dtype, shape and Layout, not
 * zeroed: the ops that make it write all of it. */
static dt_status nn_like(const dt_tensor *x, dt_tensor **out) {
    const dt_mesh *mesh = dt_tensor_mesh(x);
    return dt_tensor_create_uninit(dt_tensor_context(x), mesh, dt_tensor_dtype(x),
                                   dt_tensor_ndim(x), dt_tensor_shape(x),
                                   mesh ? dt_tensor_layout(x) : NULL, out);
}

/* ------------------------------------------------------------------ reshape */

typedef struct nn_group {
    int o0, on;   /* old dims o0 .. o0+on-1 */
    int n0, nn;   /* new dims n0 .. n0+nn-1 */
} nn_group;

/* Cuts both shapes into the smallest groups of consecutive dims with equal
 * products; a group starts with one dim on each side, so dims of length 1
 * join the group that follows them (old [S, 1, E] -> new [S, 1, H, D] gives
 * {S}->{S}, {1}->{1}, {E}->{H, D}; [E] -> [1, E] gives {E}->{1, E}). Only
 * trailing dims of length 1 on one side form groups with nothing on the
 * other. Returns the number of groups, or -1 if the products differ. */
static int nn_groups(int on, const int64_t *os, int nn, const int64_t *ns, nn_group *g) {
    int i = 0, j = 0, k = 0;
    while (i < on || j < nn) {
        if (i < on && j < nn) {
            nn_group x = { i, 1, j, 1 };
            int64_t po = os[i++], pn = ns[j++];
            while (po != pn) {
                if (po < pn) {
                    if (i >= on) return -1;
                    po *= os[i++];
                    x.on++;
                } else {
                    if (j >= nn) return -1;
                    pn *= ns[j++];
                    x.nn++;
                }
            }
            g[k++] = x;
        } else if (i < on) {
            if (os[i] != 1) return -1;
            g[k++] = (nn_group){ i++, 1, j, 0 };
        } else {
            if (ns[j] != 1) return -1;
            g[k++] = (nn_group){ i, 0, j++, 1 };
        }
    }
    return k;
}

/* The Layout that a tensor of shape os (on dims) with Layout l on mesh has
 * after dt_tensor_reshape to shape (ndim dims; element counts checked by
 * the caller): the rule above, or DT_ERR_NOT_SUPPORTED naming the
 * redistribution that would work. */
static dt_status nn_reshape_layout(const char *op, const dt_mesh *mesh, const dt_layout *l, int on,
                                   const int64_t *os, int ndim, const int64_t *shape,
                                   dt_layout *out) {
    char obuf[160], nbuf[160];
    dt_shape_format(on, os, obuf, sizeof obuf);
    dt_shape_format(ndim, shape, nbuf, sizeof nbuf);
    nn_group g[2 * DT_MAX_DIMS];
    int ng = nn_groups(on, os, ndim, shape, g);
    if (ng < 0) return dt_error(DT_ERR_INTERNAL, "%s: cannot group %s and %s", op, obuf, nbuf);
    char ls[128];
    dt_layout_format(l, ls, sizeof ls);
    dt_layout nl = *l;
    for (int m = 0; m < l->ndim; m++) {
        dt_placement p = l->placements[m];
        if (p.kind != DT_SHARD) continue;
        const nn_group *G = NULL;
        for (int k = 0; k < ng; k++)
            if (p.dim >= g[k].o0 && p.dim < g[k].o0 + g[k].on) G = &g[k];
        int parts = dt_mesh_size(mesh, m);
        const char *why = NULL;
        int n = -1; /* the new sharded dim */
        const int64_t div = (int64_t)parts * (p.order == DT_ORDER_ZIGZAG ? 2 : 1);
        if (G == NULL || G->nn == 0) {
            why = "it disappears from the new shape";
        } else {
            for (int e = G->o0; e < p.dim && why == NULL; e++)
                if (os[e] != 1)
                    why = "it is an inner dim of the dims it merges or splits with (only the "
                          "outer dim of such a group may be sharded)";
            /* The outer new dim of the group, skipping dims of length 1
             * that the shard cannot divide. */
            n = G->n0;
            while (n + 1 < G->n0 + G->nn && shape[n] == 1 && shape[n] % div != 0) n++;
            if (why == NULL && p.order == DT_ORDER_STRIPED && os[p.dim] != shape[n])
                why = "it is striped, and a striped dim cannot be split or merged in place";
        }
        /* On one rank the shard is the whole dim: where it cannot be
         * carried, or its new dim is not divisible (zigzag's 2 chunks),
         * it is Replicate, the same data. */
        if (why == NULL && (parts > 1 || shape[n] % div == 0)) {
            nl.placements[m] = dt_shard(n, p.order);
        } else if (parts == 1) {
            nl.placements[m] = dt_replicate();
        } else {
            return dt_error(DT_ERR_NOT_SUPPORTED,
                            "%s: t %s %s -> %s: tensor dim %d is sharded on mesh dim %d and %s;"
                            " redistribute t to Replicate on mesh dim %d first", op, obuf, ls,
                            nbuf, p.dim, m, why, m);
        }
    }
    if (dt_layout_check(&nl, ndim, shape, dt_mesh_sizes(mesh)) != DT_SUCCESS) {
        char msg[768], ns[128];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_layout_format(&nl, ns, sizeof ns);
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "%s: t %s %s -> %s would need the Layout %s, which is invalid (%s); "
                        "redistribute t first", op, obuf, ls, nbuf, ns, msg);
    }
    *out = nl;
    return DT_SUCCESS;
}

static dt_status nn_reshape_impl(const dt_tensor *t, int ndim, const int64_t *shape,
                                 dt_tensor **out) {
    const char *op = "dt_tensor_reshape";
    DT_REQUIRE(t != NULL, "%s: t is NULL", op);
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    DT_REQUIRE(shape != NULL, "%s: shape is NULL", op);
    DT_REQUIRE(ndim >= 1 && ndim <= DT_MAX_DIMS, "%s: ndim %d is out of range 1..%d", op, ndim,
               DT_MAX_DIMS);
    DT_TRY(nn_check_dtype(op, t));
    int on = dt_tensor_ndim(t);
    const int64_t *os = dt_tensor_shape(t);
    char obuf[160], nbuf[160];
    dt_shape_format(on, os, obuf, sizeof obuf);
    dt_shape_format(ndim, shape, nbuf, sizeof nbuf);
    int64_t n_old = 1, n_new = 1;
    for (int d = 0; d < on; d++) {
        DT_REQUIRE(os[d] >= 1, "%s: t %s has an empty dim %d", op, obuf, d);
        n_old *= os[d];
    }
    for (int d = 0; d < ndim; d++) {
        DT_REQUIRE(shape[d] >= 1, "%s: new shape %s: dim %d has length %" PRId64 " (must be >= 1)",
                   op, nbuf, d, shape[d]);
        DT_REQUIRE(shape[d] <= n_old / n_new, "%s: new shape %s has more elements than t %s (%"
                   PRId64 ")", op, nbuf, obuf, n_old);
        n_new *= shape[d];
    }
    DT_REQUIRE(n_new == n_old, "%s: t %s has %" PRId64 " elements but the new shape %s has %" PRId64,
               op, obuf, n_old, nbuf, n_new);

    const dt_mesh *mesh = dt_tensor_mesh(t);
    dt_layout nl = dt_layout_replicated(0);
    if (mesh) DT_TRY(nn_reshape_layout(op, mesh, dt_tensor_layout(t), on, os, ndim, shape, &nl));

    return dt_tensor_view(t, ndim, shape, mesh ? &nl : NULL, out);   /* t's bytes as they are */
}

dt_status dt_tensor_reshape(const dt_tensor *t, int ndim, const int64_t *shape, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(t), nn_reshape_impl(t, ndim, shape, out));
}

/* a and b hold the same data on mesh: equal once a Shard on a mesh dim of
 * size 1 (the whole dim) reads as Replicate. */
static int nn_same_data(const dt_mesh *mesh, const dt_layout *a, const dt_layout *b) {
    if (a->ndim != b->ndim) return 0;
    dt_layout x = *a, y = *b;
    for (int m = 0; m < x.ndim; m++)
        if (dt_mesh_size(mesh, m) == 1) x.placements[m] = y.placements[m] = dt_replicate();
    return dt_layout_equal(&x, &y);
}

/* dx = dy reshaped to x's shape: dy must have the Layout the forward gives
 * x's gradient Layout (Partial read as Replicate), and dx has that Layout;
 * the local data is dy's, shared (or added into *dx). */
static dt_status nn_reshape_backward_impl(const dt_tensor *x, const dt_tensor *dy,
                                          dt_tensor **dx) {
    const char *op = "dt_tensor_reshape_backward";
    DT_REQUIRE(x && dy, "%s: x and dy must not be NULL", op);
    DT_REQUIRE(dt_tensor_context(dy) == dt_tensor_context(x) && dt_tensor_mesh(dy) ==
                   dt_tensor_mesh(x) && dt_tensor_dtype(dy) == dt_tensor_dtype(x),
               "%s: dy must have x's context, mesh and dtype", op);
    int64_t nx = 1, ny = 1;
    for (int d = 0; d < dt_tensor_ndim(x); d++) nx *= dt_tensor_shape(x)[d];
    for (int d = 0; d < dt_tensor_ndim(dy); d++) ny *= dt_tensor_shape(dy)[d];
    DT_REQUIRE(nx == ny, "%s: dy has %" PRId64 " elements, x %" PRId64, op, ny, nx);
    const dt_mesh *mesh = dt_tensor_mesh(x);
    const dt_layout gl = mesh ? dt_layout_grad(dt_tensor_layout(x)) : dt_layout_replicated(0);
    dt_grad g;
    DT_TRY(dt_grad_check(op, "dx", dx, x, dt_tensor_ndim(x), dt_tensor_shape(x),
                         mesh ? &gl : NULL, &g));
    if (!dx) return DT_SUCCESS;
    if (mesh) {
        dt_layout want;
        DT_TRY(nn_reshape_layout(op, mesh, &gl, dt_tensor_ndim(x), dt_tensor_shape(x),
                                 dt_tensor_ndim(dy), dt_tensor_shape(dy), &want));
        if (!nn_same_data(mesh, dt_tensor_layout(dy), &want)) {
            char a[160], b[160];
            dt_layout_format(dt_tensor_layout(dy), a, sizeof a);
            dt_layout_format(&want, b, sizeof b);
            return dt_error(DT_ERR_NOT_SUPPORTED, "%s: dy is %s; redistribute dy to %s, the Layout "
                            "the reshape gives x's gradient Layout", op, a, b);
        }
    }
    dt_backend *be = dt_tensor_context(x)->backend;
    dt_status st;
    if (g.accumulate)
        st = be->ops->add(be, dt_tensor_dtype(x), dt_tensor_local_numel(dy),
                          dt_tensor_data_const(g.t), dt_tensor_data_const(dy), dt_tensor_data(g.t));
    else   /* dy's bytes as they are */
        st = dt_tensor_view(dy, dt_tensor_ndim(x), dt_tensor_shape(x), mesh ? &gl : NULL, &g.t);
    return dt_grad_finish(st, &g);
}

dt_status dt_tensor_reshape_backward(const dt_tensor *x, const dt_tensor *dy, dt_tensor **dx) {
    return dt_context_note(x ? dt_tensor_context(x) : NULL, nn_reshape_backward_impl(x, dy, dx));
}

/* ------------------------------------------------------------------ rmsnorm */

/* x and weight as dt_rmsnorm takes them: the reduced (last) dim whole on
 * every rank, weight [E] Replicate everywhere (or NULL). */
static dt_status nn_rmsnorm_check(const char *op, const dt_tensor *x, const dt_tensor *weight,
                                  float eps) {
    DT_REQUIRE(x != NULL, "%s: x is NULL", op);
    DT_REQUIRE(isfinite(eps) && eps >= 0.0f, "%s: eps %g must be finite and >= 0", op, (double)eps);
    DT_TRY(nn_check_dtype(op, x));
    const int nd = dt_tensor_ndim(x), last = nd - 1;
    const int64_t E = dt_tensor_shape(x)[last];
    const dt_mesh *mesh = dt_tensor_mesh(x);
    char xs[128], sug[128];

    /* 1. What the op reads from x's Layout: the reduced dim must be whole. */
    if (mesh != NULL) {
        const dt_layout *l = dt_tensor_layout(x);
        for (int m = 0; m < l->ndim; m++) {
            dt_placement p = l->placements[m];
            if (p.kind == DT_PARTIAL || (p.kind == DT_SHARD && p.dim == last)) {
                dt_layout_format(l, xs, sizeof xs);
                nn_suggest(l, last, sug, sizeof sug);
                if (p.kind == DT_PARTIAL)
                    return dt_error(DT_ERR_NOT_SUPPORTED,
                                    "%s: x %s is Partial on mesh dim %d, and RMSNorm is not linear "
                                    "(it needs the summed values); redistribute x to %s first", op,
                                    xs, m, sug);
                return dt_error(DT_ERR_NOT_SUPPORTED,
                                "%s: x %s shards the last dim (%d, length %" PRId64 ") on mesh dim "
                                "%d, but each row's mean of squares needs the whole row; "
                                "redistribute x to %s first", op, xs, last, E, m, sug);
            }
        }
    }
    /* 2. The weight: [E], x's dtype, on x's mesh and Replicate everywhere. */
    if (weight != NULL) {
        DT_REQUIRE(dt_tensor_context(weight) == dt_tensor_context(x),
                   "%s: weight and x belong to different contexts", op);
        DT_REQUIRE(dt_tensor_mesh(weight) == mesh,
                   "%s: weight and x are on different meshes (or one is local)", op);
        DT_REQUIRE(dt_tensor_dtype(weight) == dt_tensor_dtype(x), "%s: x is %s but weight is %s",
                   op, dt_dtype_name(dt_tensor_dtype(x)), dt_dtype_name(dt_tensor_dtype(weight)));
        char ws[160];
        dt_shape_format(dt_tensor_ndim(weight), dt_tensor_shape(weight), ws, sizeof ws);
        DT_REQUIRE(dt_tensor_ndim(weight) == 1 && dt_tensor_shape(weight)[0] == E,
                   "%s: weight must be [%" PRId64 "] (the last dim of x), got %s", op, E, ws);
        if (mesh != NULL) {
            const dt_layout *wl = dt_tensor_layout(weight);
            dt_layout r = dt_layout_replicated(wl->ndim);
            if (!dt_layout_equal(wl, &r)) {
                char a[128], b[128];
                dt_layout_format(wl, a, sizeof a);
                dt_layout_format(&r, b, sizeof b);
                return dt_error(DT_ERR_NOT_SUPPORTED,
                                "%s: weight %s must be whole on every rank; redistribute it to %s",
                                op, a, b);
            }
        }
    }
    return DT_SUCCESS;
}

static dt_status nn_rmsnorm_impl(const dt_tensor *x, const dt_tensor *weight, float eps,
                                 dt_tensor **out) {
    const char *op = "dt_rmsnorm";
    DT_TRY(nn_rmsnorm_check(op, x, weight, eps));
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    /* 3. The output has x's Layout; 4. the local kernel on the local [rows, E]
     * (the last dim is whole, so local rows are whole rows). */
    const int64_t E = dt_tensor_shape(x)[dt_tensor_ndim(x) - 1];
    dt_tensor *o = NULL;
    DT_TRY(nn_like(x, &o));
    const int64_t rows = E > 0 ? dt_tensor_local_numel(x) / E : 0;
    dt_backend *be = dt_tensor_context(x)->backend;
    dt_status st = be->ops->rmsnorm(be, dt_tensor_dtype(x), rows, E, dt_tensor_data_const(x),
                                    weight ? dt_tensor_data_const(weight) : NULL, eps,
                                    dt_tensor_data(o));
    return dt_op_output(st, o, out);
}

/* dweight's Layout: Partial on the mesh dims that shard x (its rows: each
 * rank sums its own), Replicate where x is whole. */
static dt_layout nn_weight_grad_layout(const dt_tensor *x) {
    dt_layout l = dt_layout_replicated(dt_tensor_layout(x)->ndim);
    for (int m = 0; m < l.ndim; m++)
        if (dt_tensor_layout(x)->placements[m].kind == DT_SHARD) l.placements[m] = dt_partial();
    return l;
}

static dt_status nn_rmsnorm_backward_impl(const dt_tensor *x, const dt_tensor *weight, float eps,
                                          const dt_tensor *dy, dt_tensor **dx, dt_tensor **dweight) {
    const char *op = "dt_rmsnorm_backward";
    DT_TRY(nn_rmsnorm_check(op, x, weight, eps));
    DT_REQUIRE(dy != NULL, "%s: dy is NULL", op);
    DT_REQUIRE(!dweight || weight, "%s: dweight asked for without a weight", op);
    DT_TRY(dt_grad_check_dy(op, "x", x, dy));
    const dt_mesh *mesh = dt_tensor_mesh(x);
    const int nd = dt_tensor_ndim(x);
    const int64_t E = dt_tensor_shape(x)[nd - 1];
    const dt_layout wl = mesh ? nn_weight_grad_layout(x) : dt_layout_replicated(0);
    dt_grad gx, gw;
    DT_TRY(dt_grad_check(op, "dx", dx, x, nd, dt_tensor_shape(x), mesh ? dt_tensor_layout(x) : NULL,
                         &gx));
    DT_TRY(dt_grad_check(op, "dweight", dweight, x, 1, &E, mesh ? &wl : NULL, &gw));
    const int64_t rows = E > 0 ? dt_tensor_local_numel(x) / E : 0;
    dt_backend *be = dt_tensor_context(x)->backend;
    const void *w = weight ? dt_tensor_data_const(weight) : NULL;
    /* Both wanted: one pass. When one is new and the other added into (dx
     * into the residual's gradient, dweight new), the new one starts zeroed
     * and is added into as well: v + 0 is v. */
    const int zero = gx.slot && gw.slot && gx.accumulate != gw.accumulate;
    dt_status st = dt_grad_make(&gx, zero);
    if (st == DT_SUCCESS) st = dt_grad_make(&gw, zero);
    if (st == DT_SUCCESS && gx.t && gw.t) {
        st = be->ops->rmsnorm_backward(be, dt_tensor_dtype(x), rows, E, dt_tensor_data_const(x), w,
                                       eps, dt_tensor_data_const(dy), dt_tensor_data(gx.t),
                                       dt_tensor_data(gw.t), gx.accumulate || gw.accumulate);
    } else {
        if (st == DT_SUCCESS && gx.t)
            st = be->ops->rmsnorm_backward(be, dt_tensor_dtype(x), rows, E, dt_tensor_data_const(x),
                                           w, eps, dt_tensor_data_const(dy), dt_tensor_data(gx.t),
                                           NULL, gx.accumulate);
        if (st == DT_SUCCESS && gw.t)
            st = be->ops->rmsnorm_backward(be, dt_tensor_dtype(x), rows, E, dt_tensor_data_const(x),
                                           w, eps, dt_tensor_data_const(dy), NULL,
                                           dt_tensor_data(gw.t), gw.accumulate);
    }
    dt_grad_finish(st, &gx);
    return dt_grad_finish(st, &gw);
}

dt_status dt_rmsnorm_backward(const dt_tensor *x, const dt_tensor *weight, float eps,
                              const dt_tensor *dy, dt_tensor **dx, dt_tensor **dweight) {
    return dt_context_note(x ? dt_tensor_context(x) : NULL,
                           nn_rmsnorm_backward_impl(x, weight, eps, dy, dx, dweight));
}

dt_status dt_rmsnorm(const dt_tensor *x, const dt_tensor *weight, float eps, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(x), nn_rmsnorm_impl(x, weight, eps, out));
}

/* ------------------------------------------------------------------ rotary */

/* What a rotary call runs: the local buffer as [outer, s_loc, inner, D]
 * and each local row's position: pos[o * pos_stride + s] for local batch row
 * o, local seq row s (pos_stride 0: one list for every o; pos: malloc'd, the
 * caller frees it). */
typedef struct nn_rotary_plan {
    int64_t outer, s_loc, inner, D;
    int64_t *pos, pos_stride;
    double base;
    dt_rotary_style style;
} nn_rotary_plan;

/* Checks x and opts as dt_rotary takes them and makes the plan. */
static dt_status nn_rotary_plan_make(const char *op, const dt_tensor *x,
                                     const dt_rotary_options *opts, nn_rotary_plan *rp) {
    dt_rotary_options def = DT_ROTARY_OPTIONS_INIT;
    if (opts == NULL) opts = &def;
    DT_REQUIRE(x != NULL, "%s: x is NULL", op);
    DT_TRY(nn_check_dtype(op, x));
    const int nd = dt_tensor_ndim(x), last = nd - 1;
    const int64_t *shape = dt_tensor_shape(x);
    char xs[160];
    dt_shape_format(nd, shape, xs, sizeof xs);
    DT_REQUIRE(nd >= 3, "%s: x must be [B, S, ..., D] (ndim >= 3), got %s", op, xs);
    const int64_t B = shape[0], S = shape[1], D = shape[last];
    DT_REQUIRE(D % 2 == 0, "%s: x %s: the rotated dim D = %" PRId64 " must be even", op, xs, D);
    DT_REQUIRE(isfinite(opts->base) && opts->base >= 0.0f,
               "%s: base %g must be finite and >= 0 (0: 10000)", op, (double)opts->base);
    DT_REQUIRE((int)opts->style >= 0 && opts->style < DT_ROTARY_STYLE_COUNT,
               "%s: unknown style %d", op, (int)opts->style);
    if (opts->positions == NULL) {
        DT_REQUIRE(opts->n_positions == 0,
                   "%s: n_positions is %" PRId64 " but positions is NULL (give both or neither)",
                   op, opts->n_positions);
    } else {
        DT_REQUIRE(opts->n_positions == S,
                   "%s: %" PRId64 " positions given for a sequence of S = %" PRId64 " tokens", op,
                   opts->n_positions, S);
        for (int64_t g = 0; g < S; g++)
            DT_REQUIRE(opts->positions[g] >= 0, "%s: positions[%" PRId64 "] = %" PRId64
                       " is negative", op, g, opts->positions[g]);
    }
    int per_row = 0;
    DT_TRY(dt_docs_check(op, opts->doc_lens, opts->doc_count, B, S, &per_row));
    const int docs = opts->doc_lens != NULL;
    DT_REQUIRE(!(docs && opts->positions), "%s: positions and documents (doc_lens) are both "
               "given; give one (documents restart the positions at 0)", op);

    /* What the op reads from the Layout: the rotated dim must be whole; the
     * sequence's positions come from its index map below. */
    const dt_mesh *mesh = dt_tensor_mesh(x);
    if (mesh != NULL) {
        const dt_layout *l = dt_tensor_layout(x);
        for (int m = 0; m < l->ndim; m++) {
            dt_placement p = l->placements[m];
            if (p.kind != DT_SHARD) continue;
            if (p.dim == last) {
                char ls[128], sug[128];
                dt_layout_format(l, ls, sizeof ls);
                dt_layout s = *l;
                s.placements[m] = dt_replicate();
                dt_layout_format(&s, sug, sizeof sug);
                return dt_error(DT_ERR_NOT_SUPPORTED,
                                "%s: x %s shards the rotated dim D (%d) on mesh dim %d, but each "
                                "rotated pair must be local; redistribute x to %s first", op, ls,
                                last, m, sug);
            }
        }
    }

    /* The local buffer is [outer, s_loc, inner, D]; the position of each
     * local row of dim 1 (of each local batch row with a list per row),
     * from the Layout's index maps (composed where several mesh dims shard
     * the sequence: dt_tensor_global_indices). */
    const int64_t *ls = dt_tensor_local_shape(x);
    const int64_t s_loc = ls[1], outer = ls[0];
    int64_t inner = 1; /* D-vectors between two local rows of dim 1 */
    for (int d = 2; d < last; d++) inner *= ls[d];
    const int64_t rows = per_row ? outer : 1; /* position lists to make */
    int64_t *pos = malloc((size_t)(rows * s_loc > 0 ? rows * s_loc : 1) * sizeof *pos);
    int64_t *bounds = docs ? malloc((size_t)(2 * S) * sizeof *bounds) : NULL;
    int64_t *brow = per_row ? malloc((size_t)(outer > 0 ? outer : 1) * sizeof *brow) : NULL;
    dt_status st = DT_SUCCESS;
    if (pos == NULL || (docs && bounds == NULL) || (per_row && brow == NULL)) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory for %" PRId64 " positions",
                      op, rows * s_loc);
        goto fail;
    }
    if (per_row && outer > 0) DT_TRY_GOTO(st, dt_tensor_global_indices(x, 0, brow), fail);
    if (s_loc > 0) DT_TRY_GOTO(st, dt_tensor_global_indices(x, 1, pos), fail);
    for (int64_t s = 0; s < s_loc && opts->positions; s++) pos[s] = opts->positions[pos[s]];
    /* Documents (positions not given, so pos[s] holds global token g): token
     * g of batch row b is at g - the start of its document in row b. The
     * last list first, so that row 0's g are read before they are replaced. */
    for (int64_t o = docs ? rows - 1 : -1; o >= 0; o--) {
        dt_docs_bounds(opts->doc_lens, opts->doc_count, S, per_row ? brow[o] : 0, bounds);
        for (int64_t s = 0; s < s_loc; s++) pos[o * s_loc + s] = pos[s] - bounds[2 * pos[s]];
    }
    free(bounds);
    free(brow);
    *rp = (nn_rotary_plan){outer, s_loc, inner, D, pos, per_row ? s_loc : 0,
                           opts->base > 0.0f ? (double)opts->base : 10000.0, opts->style};
    return DT_SUCCESS;
fail:
    free(pos);
    free(bounds);
    free(brow);
    return st;
}

static dt_status nn_rotary_impl(const dt_tensor *x, const dt_rotary_options *opts,
                                dt_tensor **out) {
    const char *op = "dt_rotary";
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    nn_rotary_plan rp;
    DT_TRY(nn_rotary_plan_make(op, x, opts, &rp));
    dt_tensor *o = NULL;
    dt_status st = nn_like(x, &o);
    if (st == DT_SUCCESS) {
        dt_backend *be = dt_tensor_context(x)->backend;
        st = be->ops->rotary(be, dt_tensor_dtype(x), rp.outer, rp.s_loc, rp.inner, rp.D, rp.pos,
                             rp.pos_stride, rp.base, rp.style, dt_tensor_data_const(x),
                             dt_tensor_data(o));
    }
    free(rp.pos);
    return dt_op_output(st, o, out);
}

/* dx = the inverse rotation of dy at the same positions (the rotation is
 * orthogonal). Into a gradient to add into: rotated into a new tensor, then
 * added. */
static dt_status nn_rotary_backward_impl(const dt_tensor *x, const dt_rotary_options *opts,
                                         const dt_tensor *dy, dt_tensor **dx) {
    const char *op = "dt_rotary_backward";
    DT_REQUIRE(dy != NULL, "%s: dy is NULL", op);
    nn_rotary_plan rp;
    DT_TRY(nn_rotary_plan_make(op, x, opts, &rp));
    dt_status st = dt_grad_check_dy(op, "x", x, dy);
    const dt_layout gl = dt_tensor_mesh(x) ? dt_layout_grad(dt_tensor_layout(x)) : dt_layout_replicated(0);
    dt_grad g;
    if (st == DT_SUCCESS)
        st = dt_grad_check(op, "dx", dx, x, dt_tensor_ndim(x), dt_tensor_shape(x),
                           dt_tensor_mesh(x) ? &gl : NULL, &g);
    if (st != DT_SUCCESS || !dx) {
        free(rp.pos);
        return st;
    }
    dt_backend *be = dt_tensor_context(x)->backend;
    const dt_dtype dt = dt_tensor_dtype(x);
    dt_tensor *tmp = NULL;
    st = g.accumulate ? nn_like(dy, &tmp) : dt_grad_make(&g, 0);
    dt_tensor *into = g.accumulate ? tmp : g.t;
    if (st == DT_SUCCESS)
        st = be->ops->rotary_inverse(be, dt, rp.outer, rp.s_loc, rp.inner, rp.D, rp.pos,
                                     rp.pos_stride, rp.base, rp.style, dt_tensor_data_const(dy),
                                     dt_tensor_data(into));
    if (st == DT_SUCCESS && g.accumulate)
        st = be->ops->add(be, dt, dt_tensor_local_numel(dy), dt_tensor_data_const(g.t),
                          dt_tensor_data_const(tmp), dt_tensor_data(g.t));
    dt_tensor_destroy(tmp);
    free(rp.pos);
    return dt_grad_finish(st, &g);
}

dt_status dt_rotary_backward(const dt_tensor *x, const dt_rotary_options *opts,
                             const dt_tensor *dy, dt_tensor **dx) {
    return dt_context_note(x ? dt_tensor_context(x) : NULL,
                           nn_rotary_backward_impl(x, opts, dy, dx));
}

dt_status dt_rotary(const dt_tensor *x, const dt_rotary_options *opts, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(x), nn_rotary_impl(x, opts, out));
}
