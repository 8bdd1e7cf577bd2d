/* dtensor/optim.c — the sum of squares, dtype conversion and AdamW
 * (optim.h): Layout checks here, the arithmetic in the backend's kernels.
 * Test: tests/test_grad.c. */
#include "optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh.h"
#include "primitives.h"
#include "tensor_internal.h"

/* t's share of its sum of squares: this rank's local sum divided by the
 * ranks that hold the same elements (Replicate mesh dims). */
static dt_status sum_squares_share(const char *op, const dt_tensor *t, double *share) {
    DT_REQUIRE(t != NULL, "%s: a tensor is NULL", op);
    DT_TRY(dt_context_check_dtype(dt_tensor_context(t), op, dt_tensor_dtype(t)));
    const dt_mesh *mesh = dt_tensor_mesh(t);
    const dt_layout *l = dt_tensor_layout(t);
    double copies = 1.0;
    for (int m = 0; mesh && m < l->ndim; m++) {
        DT_REQUIRE(l->placements[m].kind != DT_PARTIAL,
                   "%s: t is Partial on mesh dim %d; reduce it first (dt_tensor_grad_reduce)", op, m);
        if (l->placements[m].kind == DT_REPLICATE) copies *= dt_mesh_size(mesh, m);
    }
    dt_backend *be = dt_tensor_context(t)->backend;
    double local = 0.0;
    DT_TRY(be->ops->sumsq(be, dt_tensor_dtype(t), dt_tensor_local_numel(t), dt_tensor_data_const(t),
                          &local));
    *share = mesh ? local / copies : local;
    return DT_SUCCESS;
}

static dt_status sum_squares_impl(const dt_tensor *const *t, int n, double *out) {
    const char *op = "dt_tensor_sum_squares";
    DT_REQUIRE(t && out && n >= 1, "%s: t and out must not be NULL, n (%d) >= 1", op, n);
    DT_REQUIRE(t[0] != NULL, "%s: a tensor is NULL", op);
    dt_context *ctx = dt_tensor_context(t[0]);
    int meshed = 0;
    for (int i = 0; i < n; i++) {
        DT_REQUIRE(t[i] && dt_tensor_context(t[i]) == ctx,
                   "%s: tensor %d is NULL or of another context", op, i);
        meshed |= dt_tensor_mesh(t[i]) != NULL;
    }
    double *mine = malloc((size_t)n * sizeof *mine);
    if (!mine) return dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    dt_status st = DT_SUCCESS;
    for (int i = 0; i < n && st == DT_SUCCESS; i++) st = sum_squares_share(op, t[i], &mine[i]);
    if (st != DT_SUCCESS || !meshed) {
        for (int i = 0; st == DT_SUCCESS && i < n; i++) out[i] = mine[i];
        free(mine);
        return st;
    }
    /* every rank's shares (doubles' bytes) gathered over the world in one
     * exchange, through backend memory, and summed in rank order: the same
     * bits on every rank, tensor by tensor */
    dt_backend *be = ctx->backend;
    dt_comm *world = dt_context_comm(ctx);
    const size_t W = (size_t)dt_comm_size(world), row = (size_t)n * sizeof *mine;
    double *all = malloc(W * row);
    void *dev = NULL;
    st = all ? be->ops->alloc(be, (W + 1) * row, &dev)
             : dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    char *mine_dev = dev, *all_dev = dev ? mine_dev + row : NULL;
    if (st == DT_SUCCESS) st = be->ops->upload(be, mine_dev, mine, row);
    if (st == DT_SUCCESS) st = dt_comm_all_gather(world, mine_dev, all_dev, row, DT_U8);
    if (st == DT_SUCCESS) st = be->ops->download(be, all, all_dev, W * row);
    for (int i = 0; st == DT_SUCCESS && i < n; i++) {
        double sum = 0.0;
        if (!dt_tensor_mesh(t[i])) {
            out[i] = mine[i];
            continue;
        }
        for (size_t r = 0; r < W; r++) sum += all[r * (size_t)n + (size_t)i];
        out[i] = sum;
    }
    if (dev) be->ops->free(be, dev);
    free(all);
    free(mine);
    return st;
}

dt_status dt_tensor_sum_squares(const dt_tensor *t, double *out) {
    return dt_context_note(t ? dt_tensor_context(t) : NULL, sum_squares_impl(&t, 1, out));
}

dt_status dt_tensor_sum_squares_n(const dt_tensor *const *t, int n, double *out) {
    return dt_context_note(t && n >= 1 && t[0] ? dt_tensor_context(t[0]) : NULL,
                           sum_squares_impl(t, n, out));
}

static dt_status convert_impl(const dt_tensor *t, dt_dtype dtype, dt_tensor **out) {
    const char *op = "dt_tensor_convert";
    DT_REQUIRE(t && out, "%s: t and out must not be NULL", op);
    DT_TRY(dt_context_check_dtype(dt_tensor_context(t), op, dt_tensor_dtype(t)));
    DT_TRY(dt_context_check_dtype(dt_tensor_context(t), op, dtype));
    const dt_mesh *mesh = dt_tensor_mesh(t);
    dt_tensor *o = NULL;
    DT_TRY(dt_tensor_create_uninit(dt_tensor_context(t), mesh, dtype, dt_tensor_ndim(t),
                                   dt_tensor_shape(t), mesh ? dt_tensor_layout(t) : NULL, &o));
    dt_backend *be = dt_tensor_context(t)->backend;
    dt_status st = be->ops->convert(be, dt_tensor_local_numel(t), dt_tensor_dtype(t),
                                    dt_tensor_data_const(t), dtype, dt_tensor_data(o));
    return dt_op_output(st, o, out);
}

dt_status dt_tensor_convert(const dt_tensor *t, dt_dtype dtype, dt_tensor **out) {
    return dt_context_note(t ? dt_tensor_context(t) : NULL, convert_impl(t, dtype, out));
}

/* `t` (named) has p's context, mesh, shape and Layout, and `dtype`. */
static dt_status like_param(const char *op, const char *name, const dt_tensor *t,
                            const dt_tensor *p, dt_dtype dtype) {
    DT_REQUIRE(t != NULL, "%s: %s is NULL", op, name);
    int same = dt_tensor_context(t) == dt_tensor_context(p) && dt_tensor_mesh(t) == dt_tensor_mesh(p) &&
               dt_tensor_ndim(t) == dt_tensor_ndim(p) &&
               dt_layout_equal(dt_tensor_layout(t), dt_tensor_layout(p));
    for (int d = 0; same && d < dt_tensor_ndim(p); d++)
        same = dt_tensor_shape(t)[d] == dt_tensor_shape(p)[d];
    if (!same) {
        char a[160], b[160], al[160], bl[160];
        dt_shape_format(dt_tensor_ndim(t), dt_tensor_shape(t), a, sizeof a);
        dt_shape_format(dt_tensor_ndim(p), dt_tensor_shape(p), b, sizeof b);
        dt_layout_format(dt_tensor_layout(t), al, sizeof al);
        dt_layout_format(dt_tensor_layout(p), bl, sizeof bl);
        return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: %s %s %s must have param's shape and Layout "
                        "%s %s (and its mesh)%s", op, name, a, al, b, bl,
                        strcmp(name, "grad") ? "" : "; reduce a Partial gradient with "
                        "dt_tensor_grad_reduce");
    }
    DT_REQUIRE(dt_tensor_dtype(t) == dtype, "%s: %s is %s, must be %s", op, name,
               dt_dtype_name(dt_tensor_dtype(t)), dt_dtype_name(dtype));
    return DT_SUCCESS;
}

static dt_status adamw_impl(dt_tensor *param, dt_tensor *master, dt_tensor *m, dt_tensor *v,
                            const dt_tensor *grad, float grad_scale, const dt_adamw_options *o,
                            int64_t step) {
    const char *op = "dt_adamw_step";
    const dt_adamw_options def = DT_ADAMW_OPTIONS_INIT;
    if (!o) o = &def;
    DT_REQUIRE(param != NULL, "%s: param is NULL", op);
    const dt_dtype dt = dt_tensor_dtype(param);
    DT_TRY(dt_context_check_dtype(dt_tensor_context(param), op, dt));
    DT_REQUIRE(master || dt == DT_F32, "%s: a %s param needs an fp32 master copy", op,
               dt_dtype_name(dt));
    if (master) DT_TRY(like_param(op, "master", master, param, DT_F32));
    DT_TRY(like_param(op, "m", m, param, DT_F32));
    DT_TRY(like_param(op, "v", v, param, DT_F32));
    DT_TRY(like_param(op, "grad", grad, param, dt));
    DT_REQUIRE(step >= 1, "%s: step %lld must be >= 1", op, (long long)step);
    DT_REQUIRE(isfinite(grad_scale) && grad_scale > 0, "%s: grad_scale %g must be finite and > 0",
               op, (double)grad_scale);
    DT_REQUIRE(isfinite(o->lr) && o->lr >= 0 && o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 &&
                   o->beta2 < 1 && isfinite(o->eps) && o->eps >= 0 && isfinite(o->weight_decay) &&
                   o->weight_decay >= 0,
               "%s: options out of range (lr %g, betas %g %g, eps %g, weight decay %g)", op,
               (double)o->lr, (double)o->beta1, (double)o->beta2, (double)o->eps,
               (double)o->weight_decay);
    dt_backend *be = dt_tensor_context(param)->backend;
    DT_TRY(dt_tensor_own(param));   /* written below: buffers of their own */
    if (master) DT_TRY(dt_tensor_own(master));
    DT_TRY(dt_tensor_own(m));
    DT_TRY(dt_tensor_own(v));
    return be->ops->adamw(be, dt, dt_tensor_local_numel(param), dt_tensor_data(param),
                          master ? dt_tensor_data(master) : dt_tensor_data(param), dt_tensor_data(m),
                          dt_tensor_data(v), dt_tensor_data_const(grad), grad_scale, o->lr,
                          o->beta1, o->beta2, o->eps, o->weight_decay, step);
}

dt_status dt_adamw_step(dt_tensor *param, dt_tensor *master, dt_tensor *m, dt_tensor *v,
                        const dt_tensor *grad, float grad_scale, const dt_adamw_options *opts,
                        int64_t step) {
    return dt_context_note(param ? dt_tensor_context(param) : NULL,
                           adamw_impl(param, master, m, v, grad, grad_scale, opts, step));
}
