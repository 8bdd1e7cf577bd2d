/* dtensor/grad.c — what the ops' backward functions share: gradient
 * outputs that are made new or added into (tensor_internal.h), the check
 * that an incoming gradient has the Layout the rules give it, and
 * dt_tensor_grad_reduce. Test: tests/test_grad.c. */
#include "primitives.h"
#include "tensor_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_grad_check(const char *op, const char *name, dt_tensor **slot, const dt_tensor *like,
                        int ndim, const int64_t *shape, const dt_layout *layout, dt_grad *g) {
    memset(g, 0, sizeof *g);
    g->slot = slot;
    g->ctx = dt_tensor_context(like);
    g->mesh = dt_tensor_mesh(like);
    g->dtype = dt_tensor_dtype(like);
    g->ndim = ndim;
    for (int d = 0; d < ndim; d++) g->shape[d] = shape[d];
    g->layout = layout ? *layout : dt_layout_replicated(0);
    if (!slot || !*slot) return DT_SUCCESS;
    const dt_tensor *t = *slot;
    int same = dt_tensor_context(t) == g->ctx && dt_tensor_mesh(t) == g->mesh &&
               dt_tensor_dtype(t) == g->dtype && dt_tensor_ndim(t) == ndim &&
               dt_layout_equal(dt_tensor_layout(t), &g->layout);
    for (int d = 0; same && d < ndim; d++) same = dt_tensor_shape(t)[d] == shape[d];
    if (same) {   /* added into below: its buffer its own (values unchanged) */
        g->t = *slot;
        g->accumulate = 1;
        return dt_tensor_own(g->t);
    }
    char want_s[160], got_s[160], want_l[160], got_l[160];
    dt_shape_format(ndim, shape, want_s, sizeof want_s);
    dt_shape_format(dt_tensor_ndim(t), dt_tensor_shape(t), got_s, sizeof got_s);
    dt_layout_format(&g->layout, want_l, sizeof want_l);
    dt_layout_format(dt_tensor_layout(t), got_l, sizeof got_l);
    return dt_error(DT_ERR_INVALID_ARGUMENT,
                    "%s: %s to accumulate into is %s %s %s%s; the gradient is %s %s %s on %s (pass "
                    "the address of a NULL pointer for a new tensor)",
                    op, name, dt_dtype_name(dt_tensor_dtype(t)), got_s, got_l,
                    dt_tensor_mesh(t) != g->mesh || dt_tensor_context(t) != g->ctx
                        ? " on another mesh or context" : "",
                    dt_dtype_name(g->dtype), want_s, want_l, g->mesh ? "its input's mesh" : "no mesh");
}

dt_status dt_grad_make(dt_grad *g, int zero) {
    if (!g->slot || g->t) return DT_SUCCESS;
    const dt_layout *l = g->mesh ? &g->layout : NULL;
    return (zero ? dt_tensor_create : dt_tensor_create_uninit)(g->ctx, g->mesh, g->dtype, g->ndim,
                                                               g->shape, l, &g->t);
}

dt_status dt_grad_finish(dt_status st, dt_grad *g) {
    if (!g->slot || g->accumulate) return st;
    if (st == DT_SUCCESS) *g->slot = g->t;
    else dt_tensor_destroy(g->t);
    g->t = NULL;
    return st;
}

dt_status dt_layout_require(const char *op, const char *what, const dt_tensor *t,
                            const dt_layout *want, const char *why) {
    if (!dt_tensor_mesh(t) || dt_layout_equal(dt_tensor_layout(t), want)) return DT_SUCCESS;
    char got[160], w[160];
    dt_layout_format(dt_tensor_layout(t), got, sizeof got);
    dt_layout_format(want, w, sizeof w);
    return dt_error(DT_ERR_NOT_SUPPORTED, "%s: %s %s must be %s (%s); redistribute %s to %s", op,
                    what, got, w, why, what, w);
}

dt_status dt_grad_check_dy(const char *op, const char *xname, const dt_tensor *x,
                           const dt_tensor *dy) {
    DT_REQUIRE(dt_tensor_context(dy) == dt_tensor_context(x) && dt_tensor_mesh(dy) ==
                   dt_tensor_mesh(x) && dt_tensor_dtype(dy) == dt_tensor_dtype(x),
               "%s: dy must have %s's context, mesh and dtype (%s)", op, xname,
               dt_dtype_name(dt_tensor_dtype(x)));
    int same = dt_tensor_ndim(dy) == dt_tensor_ndim(x);
    for (int d = 0; same && d < dt_tensor_ndim(x); d++)
        same = dt_tensor_shape(dy)[d] == dt_tensor_shape(x)[d];
    if (!same) {
        char a[160], b[160];
        dt_shape_format(dt_tensor_ndim(x), dt_tensor_shape(x), a, sizeof a);
        dt_shape_format(dt_tensor_ndim(dy), dt_tensor_shape(dy), b, sizeof b);
        return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: dy %s must have %s's shape %s", op, b, xname,
                        a);
    }
    if (!dt_tensor_mesh(x)) return DT_SUCCESS;
    const dt_layout want = dt_layout_grad(dt_tensor_layout(x));
    return dt_layout_require(op, "dy", dy, &want, "the Layout of the output's gradient");
}

static dt_status grad_reduce_impl(const dt_tensor *grad, const dt_tensor *t, dt_tensor **out) {
    DT_REQUIRE(grad && t, "dt_tensor_grad_reduce: grad and t must not be NULL");
    DT_REQUIRE(out != NULL, "dt_tensor_grad_reduce: out is NULL");
    DT_REQUIRE(dt_tensor_mesh(grad) == dt_tensor_mesh(t),
               "dt_tensor_grad_reduce: grad and t are on different meshes");
    if (!dt_tensor_mesh(t)) return dt_error(DT_ERR_INVALID_ARGUMENT,
                                            "dt_tensor_grad_reduce: t is a local tensor (no mesh)");
    const dt_layout want = dt_layout_grad(dt_tensor_layout(t));
    return dt_tensor_redistribute(grad, &want, out);
}

dt_status dt_tensor_grad_reduce(const dt_tensor *grad, const dt_tensor *t, dt_tensor **out) {
    return dt_context_note(grad ? dt_tensor_context(grad) : NULL, grad_reduce_impl(grad, t, out));
}

static dt_status grad_reduce_n_impl(const dt_tensor *const *grads, const dt_tensor *const *ts,
                                    int n, dt_tensor **outs) {
    const char *op = "dt_tensor_grad_reduce_n";
    DT_REQUIRE(grads && ts && outs && n >= 1, "%s: grads, ts and outs must not be NULL, n (%d) "
               ">= 1", op, n);
    dt_layout *want = malloc((size_t)n * sizeof *want);
    if (!want) return dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    dt_status st = DT_SUCCESS;
    for (int i = 0; i < n && st == DT_SUCCESS; i++) {
        if (!grads[i] || !ts[i])
            st = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: grads[%d] or ts[%d] is NULL", op, i, i);
        else if (dt_tensor_mesh(grads[i]) != dt_tensor_mesh(ts[i]) || !dt_tensor_mesh(ts[i]))
            st = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: grads[%d] and ts[%d] must be on one mesh",
                          op, i, i);
        else want[i] = dt_layout_grad(dt_tensor_layout(ts[i]));
    }
    if (st == DT_SUCCESS) st = dt_tensor_redistribute_n(grads, want, n, outs);
    free(want);
    return st;
}

dt_status dt_tensor_grad_reduce_n(const dt_tensor *const *grads, const dt_tensor *const *ts, int n,
                                  dt_tensor **outs) {
    return dt_context_note(grads && n >= 1 && grads[0] ? dt_tensor_context(grads[0]) : NULL,
                           grad_reduce_n_impl(grads, ts, n, outs));
}
