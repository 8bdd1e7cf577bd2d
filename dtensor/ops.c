/* dtensor/ops.c — matmul, add and gelu on DTensors.
 *
 * None of these communicates: each reads its inputs' Layouts, derives the
 * output Layout mesh dim by mesh dim, and runs one local kernel on the local
 * buffers. A combination with no local meaning is rejected with
 * DT_ERR_NOT_SUPPORTED naming both Layouts and a redistribution that works.
 *
 * matmul: x [..., K] @ w [K, N]. Locally x is [M, K_local] with M the
 * product of x's local leading dims (row-major, so they flatten for free)
 * and w is [K_local, N_local]. The rules in ops.h keep every local product
 * meaningful: K is either whole on both sides or split the same way (same
 * mesh dim, same order), which makes the local results summands (Partial).
 *
 * Test: tests/test_ops.c (make test).
 */
#include "ops.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "tensor_internal.h"

const char *dt_gelu_approx_name(dt_gelu_approx approx) {
    switch (approx) {
    case DT_GELU_ERF: return "erf";
    case DT_GELU_TANH: return "tanh";
    default: return "unknown";
    }
}

/* Checks that two tensors live on the same context and mesh. */
static dt_status dt_check_same_place(const char *op, const char *an, const dt_tensor *a,
                                     const char *bn, const dt_tensor *b) {
    DT_REQUIRE(dt_tensor_context(a) == dt_tensor_context(b),
               "%s: %s and %s belong to different contexts", op, an, bn);
    DT_REQUIRE(dt_tensor_mesh(a) == dt_tensor_mesh(b),
               "%s: %s and %s are on different meshes (or one is local)", op, an, bn);
    DT_REQUIRE(dt_tensor_dtype(a) == dt_tensor_dtype(b), "%s: %s is %s but %s is %s", op, an,
               dt_dtype_name(dt_tensor_dtype(a)), bn, dt_dtype_name(dt_tensor_dtype(b)));
    return DT_SUCCESS;
}

/* `l` with mesh dim m set to p, formatted, if that Layout is valid for the
 * shape; otherwise returns 0. */
static int dt_suggest(const dt_layout *l, int m, dt_placement p, int ndim, const int64_t *shape,
                      const dt_mesh *mesh, char *buf, size_t size) {
    dt_layout s = *l;
    s.placements[m] = p;
    char saved[1024];
    dt_error_save_(saved, sizeof saved);
    dt_status st = dt_layout_check(&s, ndim, shape, dt_mesh_sizes(mesh));
    dt_error_restore_(saved);
    if (st != DT_SUCCESS) return 0;
    dt_layout_format(&s, buf, size);
    return 1;
}

/* The rules of out = x @ w on one mesh dim, forward and backward, written
 * once (ops.h has the table): from x's and w's placements (xlast: x's last
 * dim), out's placement, the placement dy must have (out's, Partial read
 * as Replicate), and dx's and dw's (dx = dy w^T, dw = x^T dy, each local
 * product meaningful because K, or the rows, are whole or split alike).
 * 0 if the pair is unsupported. */
typedef struct matmul_rule {
    dt_placement out, dy, dx, dw;
} matmul_rule;

static int dt_matmul_rule(dt_placement a, dt_placement b, int xlast, matmul_rule *r) {
    const dt_placement R = dt_replicate(), P = dt_partial();
    if (a.kind == DT_REPLICATE && b.kind == DT_REPLICATE)
        *r = (matmul_rule){R, R, R, R};
    else if (a.kind == DT_REPLICATE && b.kind == DT_SHARD && b.dim == 1)   /* column-parallel */
        *r = (matmul_rule){dt_shard(xlast, b.order), dt_shard(xlast, b.order), P, b};
    else if (a.kind == DT_SHARD && a.dim == xlast && b.kind == DT_SHARD && b.dim == 0 &&
             a.order == b.order)   /* row-parallel */
        *r = (matmul_rule){P, R, a, b};
    else if (a.kind == DT_SHARD && a.dim < xlast && b.kind == DT_REPLICATE)   /* batch, sequence */
        *r = (matmul_rule){a, a, a, P};
    else if (a.kind == DT_PARTIAL && b.kind == DT_REPLICATE)
        *r = (matmul_rule){P, R, R, P};
    else if (a.kind == DT_REPLICATE && b.kind == DT_PARTIAL)
        *r = (matmul_rule){P, R, P, R};
    else
        return 0;
    return 1;
}

static dt_status dt_matmul_unsupported(const dt_tensor *x, const dt_tensor *w, int m) {
    const dt_mesh *mesh = dt_tensor_mesh(x);
    const dt_layout *xl = dt_tensor_layout(x), *wl = dt_tensor_layout(w);
    dt_placement a = xl->placements[m], b = wl->placements[m];
    int xn = dt_tensor_ndim(x), xlast = xn - 1;
    char xs[128], ws[128], sug[160], sug2[160];
    dt_layout_format(xl, xs, sizeof xs);
    dt_layout_format(wl, ws, sizeof ws);

    const char *what = NULL; /* which tensor to redistribute */
    int ok = 0;
    if (a.kind == DT_SHARD && a.dim == xlast && (b.kind == DT_REPLICATE || b.kind == DT_SHARD)) {
        /* row-parallel: w must split K the same way */
        what = "w";
        ok = dt_suggest(wl, m, dt_shard(0, a.order), 2, dt_tensor_shape(w), mesh, sug, sizeof sug);
    } else if (a.kind == DT_REPLICATE && b.kind == DT_SHARD && b.dim == 0) {
        what = "x";
        ok = dt_suggest(xl, m, dt_shard(xlast, b.order), xn, dt_tensor_shape(x), mesh, sug,
                        sizeof sug);
    } else if (b.kind == DT_PARTIAL || (a.kind == DT_SHARD && b.kind == DT_SHARD)) {
        what = "w";
        ok = dt_suggest(wl, m, dt_replicate(), 2, dt_tensor_shape(w), mesh, sug, sizeof sug);
    } else if (a.kind == DT_PARTIAL) {
        what = "x";
        ok = dt_suggest(xl, m, dt_replicate(), xn, dt_tensor_shape(x), mesh, sug, sizeof sug);
    }
    if (ok)
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "dt_matmul: x %s @ w %s is not supported on mesh dim %d; redistribute %s "
                        "to %s", xs, ws, m, what, sug);
    dt_suggest(xl, m, dt_replicate(), xn, dt_tensor_shape(x), mesh, sug, sizeof sug);
    dt_suggest(wl, m, dt_replicate(), 2, dt_tensor_shape(w), mesh, sug2, sizeof sug2);
    return dt_error(DT_ERR_NOT_SUPPORTED,
                    "dt_matmul: x %s @ w %s is not supported on mesh dim %d; redistribute x to %s "
                    "and w to %s", xs, ws, m, sug, sug2);
}

static dt_status dt_matmul_impl(const dt_tensor *x, const dt_tensor *w, dt_tensor **out) {
    const char *op = "dt_matmul";
    DT_REQUIRE(x != NULL, "%s: x is NULL", op);
    DT_REQUIRE(w != NULL, "%s: w is NULL", op);
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    DT_TRY(dt_check_same_place(op, "x", x, "w", w));
    DT_TRY(dt_context_check_dtype(dt_tensor_context(x), op, dt_tensor_dtype(x)));
    int xn = dt_tensor_ndim(x);
    const int64_t *xs = dt_tensor_shape(x), *ws = dt_tensor_shape(w);
    char xbuf[160], wbuf[160];
    dt_shape_format(xn, xs, xbuf, sizeof xbuf);
    dt_shape_format(dt_tensor_ndim(w), ws, wbuf, sizeof wbuf);
    DT_REQUIRE(dt_tensor_ndim(w) == 2, "%s: w must be 2-dim [K, N], got shape %s", op, wbuf);
    DT_REQUIRE(xs[xn - 1] == ws[0], "%s: x %s and w %s disagree on K (%" PRId64 " vs %" PRId64 ")",
               op, xbuf, wbuf, xs[xn - 1], ws[0]);

    const dt_mesh *mesh = dt_tensor_mesh(x);
    dt_layout ol = dt_layout_replicated(0);
    int64_t oshape[DT_MAX_DIMS];
    for (int d = 0; d < xn; d++) oshape[d] = xs[d];
    oshape[xn - 1] = ws[1];
    if (mesh != NULL) {
        const dt_layout *xl = dt_tensor_layout(x), *wl = dt_tensor_layout(w);
        ol.ndim = xl->ndim;
        for (int m = 0; m < xl->ndim; m++) {
            matmul_rule r;
            if (!dt_matmul_rule(xl->placements[m], wl->placements[m], xn - 1, &r))
                return dt_matmul_unsupported(x, w, m);
            ol.placements[m] = r.out;
        }
        /* e.g. x [Shard(0), Replicate] @ w [Replicate, Shard(1)] is fine; an
         * output dim sharded over several mesh dims repeats an input's chain
         * of them (same mesh dims, same orders), so its data lines up. */
        dt_status st = dt_layout_check(&ol, xn, oshape, dt_mesh_sizes(mesh));
        if (st != DT_SUCCESS) {
            char msg[768];
            snprintf(msg, sizeof msg, "%s", dt_last_error());
            return dt_error(DT_ERR_NOT_SUPPORTED, "%s: the output Layout is invalid: %s", op, msg);
        }
    }

    dt_context *ctx = dt_tensor_context(x);
    const int64_t *xL = dt_tensor_local_shape(x), *wL = dt_tensor_local_shape(w);
    if (xL[xn - 1] != wL[0])
        return dt_error(DT_ERR_INTERNAL, "%s: local K differs (%" PRId64 " vs %" PRId64 ")", op,
                        xL[xn - 1], wL[0]);
    int64_t M = 1;
    for (int d = 0; d < xn - 1; d++) M *= xL[d];

    /* Outputs these ops write in full are not zeroed first (a memset as
     * large as the output, on CUDA): the gemm writes all of o, except with
     * K = 0, where o is the zeros it was made as. */
    dt_tensor *o = NULL;
    DT_TRY((wL[0] > 0 ? dt_tensor_create_uninit : dt_tensor_create)(
        ctx, mesh, dt_tensor_dtype(x), xn, oshape, mesh ? &ol : NULL, &o));
    dt_backend *be = ctx->backend;
    dt_status st = be->ops->gemm(be, dt_tensor_dtype(x), M, wL[1], wL[0], dt_tensor_data_const(x),
                                 dt_tensor_data_const(w), dt_tensor_data(o));
    return dt_op_output(st, o, out);
}

dt_status dt_matmul(const dt_tensor *x, const dt_tensor *w, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(x), dt_matmul_impl(x, w, out));
}

static dt_status dt_matmul_backward_impl(const dt_tensor *x, const dt_tensor *w,
                                         const dt_tensor *dy, dt_tensor **dx, dt_tensor **dw) {
    const char *op = "dt_matmul_backward";
    DT_REQUIRE(x && w && dy, "%s: x, w and dy must not be NULL", op);
    DT_TRY(dt_check_same_place(op, "x", x, "w", w));
    DT_TRY(dt_check_same_place(op, "x", x, "dy", dy));
    DT_TRY(dt_context_check_dtype(dt_tensor_context(x), op, dt_tensor_dtype(x)));
    const int xn = dt_tensor_ndim(x);
    const int64_t *xs = dt_tensor_shape(x), *ws = dt_tensor_shape(w);
    char xbuf[160], wbuf[160], ybuf[160];
    dt_shape_format(xn, xs, xbuf, sizeof xbuf);
    dt_shape_format(dt_tensor_ndim(w), ws, wbuf, sizeof wbuf);
    DT_REQUIRE(dt_tensor_ndim(w) == 2, "%s: w must be 2-dim [K, N], got shape %s", op, wbuf);
    DT_REQUIRE(xs[xn - 1] == ws[0], "%s: x %s and w %s disagree on K (%" PRId64 " vs %" PRId64 ")",
               op, xbuf, wbuf, xs[xn - 1], ws[0]);
    int same = dt_tensor_ndim(dy) == xn && dt_tensor_shape(dy)[xn - 1] == ws[1];
    for (int d = 0; same && d < xn - 1; d++) same = dt_tensor_shape(dy)[d] == xs[d];
    dt_shape_format(dt_tensor_ndim(dy), dt_tensor_shape(dy), ybuf, sizeof ybuf);
    DT_REQUIRE(same, "%s: dy %s must have the shape of x %s @ w %s", op, ybuf, xbuf, wbuf);

    const dt_mesh *mesh = dt_tensor_mesh(x);
    dt_layout dyl = dt_layout_replicated(0), dxl = dyl, dwl = dyl;
    if (mesh) {
        const dt_layout *xl = dt_tensor_layout(x), *wl = dt_tensor_layout(w);
        dyl.ndim = dxl.ndim = dwl.ndim = xl->ndim;
        for (int m = 0; m < xl->ndim; m++) {
            matmul_rule r;
            if (!dt_matmul_rule(xl->placements[m], wl->placements[m], xn - 1, &r))
                return dt_matmul_unsupported(x, w, m);
            dyl.placements[m] = r.dy, dxl.placements[m] = r.dx, dwl.placements[m] = r.dw;
        }
        DT_TRY(dt_layout_require(op, "dy", dy, &dyl,
                                 "the gradient's Layout of x @ w: its Layout, Partial read as "
                                 "Replicate"));
    }
    dt_grad gx, gw;
    DT_TRY(dt_grad_check(op, "dx", dx, x, xn, xs, mesh ? &dxl : NULL, &gx));
    DT_TRY(dt_grad_check(op, "dw", dw, x, 2, ws, mesh ? &dwl : NULL, &gw));

    const int64_t *xL = dt_tensor_local_shape(x), *wL = dt_tensor_local_shape(w);
    int64_t M = 1;
    for (int d = 0; d < xn - 1; d++) M *= xL[d];
    const int64_t K = wL[0], N = wL[1];
    dt_backend *be = dt_tensor_context(x)->backend;
    const dt_dtype dt = dt_tensor_dtype(x);
    /* a product over nothing (N or M local 0) writes zeros only if made zero */
    dt_status st = dt_grad_make(&gx, N == 0);
    if (st == DT_SUCCESS) st = dt_grad_make(&gw, M == 0);
    if (st == DT_SUCCESS && gx.t && N > 0)   /* dx [M, K] = dy [M, N] @ w^T */
        st = be->ops->gemm_ex(be, dt, 0, 1, M, K, N, 1.0f, dt_tensor_data_const(dy),
                              dt_tensor_data_const(w), gx.accumulate ? 1.0f : 0.0f,
                              dt_tensor_data(gx.t));
    if (st == DT_SUCCESS && gw.t && M > 0)   /* dw [K, N] = x^T @ dy */
        st = be->ops->gemm_ex(be, dt, 1, 0, K, N, M, 1.0f, dt_tensor_data_const(x),
                              dt_tensor_data_const(dy), gw.accumulate ? 1.0f : 0.0f,
                              dt_tensor_data(gw.t));
    dt_grad_finish(st, &gx);
    return dt_grad_finish(st, &gw);
}

dt_status dt_matmul_backward(const dt_tensor *x, const dt_tensor *w, const dt_tensor *dy,
                             dt_tensor **dx, dt_tensor **dw) {
    return dt_context_note(x ? dt_tensor_context(x) : NULL,
                           dt_matmul_backward_impl(x, w, dy, dx, dw));
}

static int dt_layout_has_partial(const dt_layout *l) {
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_PARTIAL) return 1;
    return 0;
}

static dt_status dt_add_impl(const dt_tensor *a, const dt_tensor *b, dt_tensor **out) {
    const char *op = "dt_add";
    DT_REQUIRE(a != NULL, "%s: a is NULL", op);
    DT_REQUIRE(b != NULL, "%s: b is NULL", op);
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    DT_TRY(dt_check_same_place(op, "a", a, "b", b));
    DT_TRY(dt_context_check_dtype(dt_tensor_context(a), op, dt_tensor_dtype(a)));
    int nd = dt_tensor_ndim(a);
    int same = dt_tensor_ndim(b) == nd;
    for (int d = 0; same && d < nd; d++) same = dt_tensor_shape(a)[d] == dt_tensor_shape(b)[d];
    if (!same) {
        char as[160], bs[160];
        dt_shape_format(nd, dt_tensor_shape(a), as, sizeof as);
        dt_shape_format(dt_tensor_ndim(b), dt_tensor_shape(b), bs, sizeof bs);
        return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: shapes differ: a %s, b %s", op, as, bs);
    }
    const dt_layout *al = dt_tensor_layout(a), *bl = dt_tensor_layout(b);
    if (!dt_layout_equal(al, bl)) {
        char as[128], bs[128];
        dt_layout_format(al, as, sizeof as);
        dt_layout_format(bl, bs, sizeof bs);
        if (dt_layout_has_partial(al) || dt_layout_has_partial(bl)) {
            dt_layout r = dt_layout_replicated(al->ndim);
            char rs[128];
            dt_layout_format(&r, rs, sizeof rs);
            return dt_error(DT_ERR_NOT_SUPPORTED,
                            "%s: a %s + b %s mixes Partial with another placement; redistribute "
                            "both to %s (or b to %s)", op, as, bs, rs, as);
        }
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "%s: a %s + b %s have different Layouts; redistribute b to %s", op, as, bs,
                        as);
    }
    dt_context *ctx = dt_tensor_context(a);
    const dt_mesh *mesh = dt_tensor_mesh(a);
    dt_tensor *o = NULL;
    DT_TRY(dt_tensor_create_uninit(ctx, mesh, dt_tensor_dtype(a), nd, dt_tensor_shape(a),
                                   mesh ? al : NULL, &o));
    dt_backend *be = ctx->backend;
    dt_status st = be->ops->add(be, dt_tensor_dtype(a), dt_tensor_local_numel(a),
                                dt_tensor_data_const(a), dt_tensor_data_const(b),
                                dt_tensor_data(o));
    return dt_op_output(st, o, out);
}

dt_status dt_add(const dt_tensor *a, const dt_tensor *b, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(a), dt_add_impl(a, b, out));
}

/* x is not Partial (the elementwise ops that are not linear). */
static dt_status dt_require_not_partial(const char *op, const char *name, const dt_tensor *x,
                                        const char *what) {
    const dt_layout *xl = dt_tensor_layout(x);
    if (!dt_layout_has_partial(xl)) return DT_SUCCESS;
    const dt_layout r = dt_layout_grad(xl);
    char xs[128], rs[128];
    dt_layout_format(xl, xs, sizeof xs);
    dt_layout_format(&r, rs, sizeof rs);
    return dt_error(DT_ERR_NOT_SUPPORTED,
                    "%s: %s %s is Partial and %s is not linear; redistribute %s to %s first", op,
                    name, xs, what, name, rs);
}

static dt_status dt_gelu_impl(const dt_tensor *x, dt_gelu_approx approx, dt_tensor **out) {
    const char *op = "dt_gelu";
    DT_REQUIRE(x != NULL, "%s: x is NULL", op);
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    DT_REQUIRE((int)approx >= 0 && approx < DT_GELU_APPROX_COUNT,
               "%s: unknown approximation %d", op, (int)approx);
    DT_TRY(dt_context_check_dtype(dt_tensor_context(x), op, dt_tensor_dtype(x)));
    DT_TRY(dt_require_not_partial(op, "x", x, "GELU"));
    const dt_layout *xl = dt_tensor_layout(x);
    dt_context *ctx = dt_tensor_context(x);
    const dt_mesh *mesh = dt_tensor_mesh(x);
    dt_tensor *o = NULL;
    DT_TRY(dt_tensor_create_uninit(ctx, mesh, dt_tensor_dtype(x), dt_tensor_ndim(x),
                                   dt_tensor_shape(x), mesh ? xl : NULL, &o));
    dt_backend *be = ctx->backend;
    dt_status st = be->ops->gelu(be, dt_tensor_dtype(x), dt_tensor_local_numel(x),
                                 dt_tensor_data_const(x), dt_tensor_data(o), approx);
    return dt_op_output(st, o, out);
}

dt_status dt_gelu(const dt_tensor *x, dt_gelu_approx approx, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(x), dt_gelu_impl(x, approx, out));
}

static dt_status dt_add_backward_impl(const dt_tensor *a, const dt_tensor *b, const dt_tensor *dy,
                                      dt_tensor **da, dt_tensor **db) {
    const char *op = "dt_add_backward";
    DT_REQUIRE(a && b && dy, "%s: a, b and dy must not be NULL", op);
    DT_TRY(dt_check_same_place(op, "a", a, "b", b));
    DT_TRY(dt_context_check_dtype(dt_tensor_context(a), op, dt_tensor_dtype(a)));
    DT_TRY(dt_grad_check_dy(op, "a", a, dy));
    DT_REQUIRE(dt_layout_equal(dt_tensor_layout(a), dt_tensor_layout(b)) &&
                   dt_tensor_ndim(a) == dt_tensor_ndim(b),
               "%s: a and b must have dt_add's equal shapes and Layouts", op);
    const dt_layout gl = dt_layout_grad(dt_tensor_layout(a));
    const int n = dt_tensor_ndim(a);
    dt_grad ga, gb;
    DT_TRY(dt_grad_check(op, "da", da, a, n, dt_tensor_shape(a), dt_tensor_mesh(a) ? &gl : NULL, &ga));
    DT_TRY(dt_grad_check(op, "db", db, a, n, dt_tensor_shape(a), dt_tensor_mesh(a) ? &gl : NULL, &gb));
    dt_backend *be = dt_tensor_context(a)->backend;
    const int64_t len = dt_tensor_local_numel(dy);
    dt_status st = DT_SUCCESS;
    dt_grad *g[2] = {&ga, &gb};
    for (int i = 0; i < 2 && st == DT_SUCCESS; i++) {
        if (!g[i]->slot) continue;
        if (g[i]->accumulate)
            st = be->ops->add(be, dt_tensor_dtype(dy), len, dt_tensor_data_const(g[i]->t),
                              dt_tensor_data_const(dy), dt_tensor_data(g[i]->t));
        else   /* dy itself: its buffer, shared */
            st = dt_tensor_view(dy, n, dt_tensor_shape(a), dt_tensor_mesh(a) ? &gl : NULL,
                                &g[i]->t);
    }
    dt_grad_finish(st, &ga);
    return dt_grad_finish(st, &gb);
}

dt_status dt_add_backward(const dt_tensor *a, const dt_tensor *b, const dt_tensor *dy,
                          dt_tensor **da, dt_tensor **db) {
    return dt_context_note(a ? dt_tensor_context(a) : NULL, dt_add_backward_impl(a, b, dy, da, db));
}

static dt_status dt_gelu_backward_impl(const dt_tensor *x, dt_gelu_approx approx,
                                       const dt_tensor *dy, dt_tensor **dx) {
    const char *op = "dt_gelu_backward";
    DT_REQUIRE(x && dy, "%s: x and dy must not be NULL", op);
    DT_REQUIRE((int)approx >= 0 && approx < DT_GELU_APPROX_COUNT, "%s: unknown approximation %d",
               op, (int)approx);
    DT_TRY(dt_context_check_dtype(dt_tensor_context(x), op, dt_tensor_dtype(x)));
    DT_TRY(dt_require_not_partial(op, "x", x, "GELU"));
    DT_TRY(dt_grad_check_dy(op, "x", x, dy));
    dt_grad g;
    DT_TRY(dt_grad_check(op, "dx", dx, x, dt_tensor_ndim(x), dt_tensor_shape(x),
                         dt_tensor_mesh(x) ? dt_tensor_layout(x) : NULL, &g));
    dt_backend *be = dt_tensor_context(x)->backend;
    dt_status st = dt_grad_make(&g, 0);
    if (st == DT_SUCCESS && g.t)
        st = be->ops->gelu_backward(be, dt_tensor_dtype(x), dt_tensor_local_numel(x),
                                    dt_tensor_data_const(x), dt_tensor_data_const(dy),
                                    dt_tensor_data(g.t), approx, g.accumulate);
    return dt_grad_finish(st, &g);
}

dt_status dt_gelu_backward(const dt_tensor *x, dt_gelu_approx approx, const dt_tensor *dy,
                           dt_tensor **dx) {
    return dt_context_note(x ? dt_tensor_context(x) : NULL, dt_gelu_backward_impl(x, approx, dy, dx));
}

/* gate and up: one op's two inputs of equal shape and Layout, not Partial. */
static dt_status dt_check_swiglu_inputs(const char *op, const dt_tensor *gate, const dt_tensor *up) {
    DT_REQUIRE(gate && up, "%s: gate and up must not be NULL", op);
    DT_TRY(dt_check_same_place(op, "gate", gate, "up", up));
    DT_TRY(dt_context_check_dtype(dt_tensor_context(gate), op, dt_tensor_dtype(gate)));
    int same = dt_tensor_ndim(gate) == dt_tensor_ndim(up) &&
               dt_layout_equal(dt_tensor_layout(gate), dt_tensor_layout(up));
    for (int d = 0; same && d < dt_tensor_ndim(gate); d++)
        same = dt_tensor_shape(gate)[d] == dt_tensor_shape(up)[d];
    if (!same) {
        char a[160], b[160], al[128], bl[128];
        dt_shape_format(dt_tensor_ndim(gate), dt_tensor_shape(gate), a, sizeof a);
        dt_shape_format(dt_tensor_ndim(up), dt_tensor_shape(up), b, sizeof b);
        dt_layout_format(dt_tensor_layout(gate), al, sizeof al);
        dt_layout_format(dt_tensor_layout(up), bl, sizeof bl);
        return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: gate %s %s and up %s %s must have one shape "
                        "and one Layout", op, a, al, b, bl);
    }
    return dt_require_not_partial(op, "gate", gate, "SwiGLU");
}

static dt_status dt_swiglu_impl(const dt_tensor *gate, const dt_tensor *up, dt_tensor **out) {
    const char *op = "dt_swiglu";
    DT_TRY(dt_check_swiglu_inputs(op, gate, up));
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    dt_context *ctx = dt_tensor_context(gate);
    const dt_mesh *mesh = dt_tensor_mesh(gate);
    dt_tensor *o = NULL;
    DT_TRY(dt_tensor_create_uninit(ctx, mesh, dt_tensor_dtype(gate), dt_tensor_ndim(gate),
                                   dt_tensor_shape(gate), mesh ? dt_tensor_layout(gate) : NULL, &o));
    dt_backend *be = ctx->backend;
    dt_status st = be->ops->swiglu(be, dt_tensor_dtype(gate), dt_tensor_local_numel(gate),
                                   dt_tensor_data_const(gate), dt_tensor_data_const(up),
                                   dt_tensor_data(o));
    return dt_op_output(st, o, out);
}

dt_status dt_swiglu(const dt_tensor *gate, const dt_tensor *up, dt_tensor **out) {
    return dt_context_note(gate ? dt_tensor_context(gate) : NULL, dt_swiglu_impl(gate, up, out));
}

static dt_status dt_swiglu_backward_impl(const dt_tensor *gate, const dt_tensor *up,
                                         const dt_tensor *dy, dt_tensor **dgate, dt_tensor **dup) {
    const char *op = "dt_swiglu_backward";
    DT_TRY(dt_check_swiglu_inputs(op, gate, up));
    DT_REQUIRE(dy != NULL, "%s: dy is NULL", op);
    DT_TRY(dt_grad_check_dy(op, "gate", gate, dy));
    const dt_layout *l = dt_tensor_mesh(gate) ? dt_tensor_layout(gate) : NULL;
    const int n = dt_tensor_ndim(gate);
    dt_grad gg, gu;
    DT_TRY(dt_grad_check(op, "dgate", dgate, gate, n, dt_tensor_shape(gate), l, &gg));
    DT_TRY(dt_grad_check(op, "dup", dup, gate, n, dt_tensor_shape(gate), l, &gu));
    DT_REQUIRE(gg.accumulate == gu.accumulate || !dgate || !dup,
               "%s: dgate and dup must both be new or both be added into", op);
    dt_backend *be = dt_tensor_context(gate)->backend;
    dt_status st = dt_grad_make(&gg, 0);
    if (st == DT_SUCCESS) st = dt_grad_make(&gu, 0);
    if (st == DT_SUCCESS && (gg.t || gu.t))
        st = be->ops->swiglu_backward(be, dt_tensor_dtype(gate), dt_tensor_local_numel(gate),
                                      dt_tensor_data_const(gate), dt_tensor_data_const(up),
                                      dt_tensor_data_const(dy), gg.t ? dt_tensor_data(gg.t) : NULL,
                                      gu.t ? dt_tensor_data(gu.t) : NULL,
                                      gg.t ? gg.accumulate : gu.accumulate);
    dt_grad_finish(st, &gg);
    return dt_grad_finish(st, &gu);
}

dt_status dt_swiglu_backward(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy,
                             dt_tensor **dgate, dt_tensor **dup) {
    return dt_context_note(gate ? dt_tensor_context(gate) : NULL,
                           dt_swiglu_backward_impl(gate, up, dy, dgate, dup));
}
