/* dtensor/ops_embed.c — the token embedding and the cross-entropy loss
 * (ops_nn.h), vocab-parallel as Megatron's.
 *
 * embedding: a rank whose table rows are [lo, lo + rows) of the vocabulary
 * (Shard(0, contiguous)) looks up the tokens that fall there and writes 0
 * for the others, so the output is Partial over that mesh dim; the backward
 * adds dy's rows into the rank's own table rows only.
 *
 * cross-entropy, per row r of logits (a token) whose vocabulary columns are
 * split over the vocab mesh dim:
 *   M = max over the whole row          (local max, all-reduce max)
 *   s = sum_j e^(x_j - M)               (local sum, all-reduce sum)
 *   t = x[target]                       (the owning rank's, others 0: sum)
 *   loss_r = M + log s - t,  dx_j = (e^(x_j - M) / s - [j = target]) / N
 * with N the targets that count in the global batch (a sum over the mesh
 * dims that split the rows); the loss is the sum of loss_r over the rows
 * that count (the same reduction) divided by N. Everything in fp32, the
 * final sums in double on the host. The ranks first agree on shapes,
 * Layouts and whether their targets are valid (one all-gather).
 *
 * Test: tests/test_grad.c.
 */
#include "ops_nn.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh.h"
#include "tensor_internal.h"

/* ---------------------------------------------------------------- embedding */

/* What embedding reads from the Layouts: out's Layout and dtable's, and the
 * rank's vocabulary rows [lo, lo + rows). */
typedef struct embed_plan {
    dt_layout out, dtable;
    int64_t lo, rows, n, E;
} embed_plan;

static dt_status embed_plan_make(const char *op, const dt_tensor *table, const dt_tensor *tokens,
                                 embed_plan *p) {
    DT_REQUIRE(table && tokens, "%s: table and tokens must not be NULL", op);
    DT_REQUIRE(dt_tensor_context(table) == dt_tensor_context(tokens) &&
                   dt_tensor_mesh(table) == dt_tensor_mesh(tokens),
               "%s: table and tokens must share one context and mesh", op);
    DT_TRY(dt_context_check_dtype(dt_tensor_context(table), op, dt_tensor_dtype(table)));
    DT_REQUIRE(dt_tensor_dtype(tokens) == DT_I32, "%s: tokens must be i32, got %s", op,
               dt_dtype_name(dt_tensor_dtype(tokens)));
    char ts[160];
    dt_shape_format(dt_tensor_ndim(table), dt_tensor_shape(table), ts, sizeof ts);
    DT_REQUIRE(dt_tensor_ndim(table) == 2, "%s: table must be [V, E], got %s", op, ts);
    DT_REQUIRE(dt_tensor_ndim(tokens) < DT_MAX_DIMS, "%s: tokens have too many dims (%d)", op,
               dt_tensor_ndim(tokens));
    const int64_t V = dt_tensor_shape(table)[0];
    DT_REQUIRE(V > 0 && dt_tensor_shape(table)[1] > 0,
               "%s: table %s is empty (the vocabulary and the embedding dim must be >= 1)", op, ts);
    const int nt = dt_tensor_ndim(tokens);
    memset(p, 0, sizeof *p);
    p->E = dt_tensor_local_shape(table)[1];
    p->rows = dt_tensor_local_shape(table)[0];
    p->n = dt_tensor_local_numel(tokens);
    const dt_mesh *mesh = dt_tensor_mesh(table);
    if (!mesh) return DT_SUCCESS;
    const dt_layout *tl = dt_tensor_layout(table), *kl = dt_tensor_layout(tokens);
    p->out = p->dtable = *tl;
    for (int m = 0; m < tl->ndim; m++) {
        const dt_placement a = tl->placements[m], b = kl->placements[m];
        char as[160], bs[160];
        dt_layout_format(tl, as, sizeof as);
        dt_layout_format(kl, bs, sizeof bs);
        if (a.kind == DT_PARTIAL || b.kind == DT_PARTIAL)
            return dt_error(DT_ERR_NOT_SUPPORTED, "%s: table %s or tokens %s is Partial on mesh "
                            "dim %d; redistribute it to Replicate first", op, as, bs, m);
        if (a.kind == DT_SHARD && b.kind == DT_SHARD)
            return dt_error(DT_ERR_NOT_SUPPORTED, "%s: table %s and tokens %s are both sharded on "
                            "mesh dim %d; redistribute the tokens to Replicate there", op, as, bs,
                            m);
        if (a.kind == DT_SHARD && a.dim == 0 && a.order != DT_ORDER_CONTIGUOUS)
            return dt_error(DT_ERR_NOT_SUPPORTED, "%s: table %s shards the vocabulary %s on mesh "
                            "dim %d; vocab-parallel tables are contiguous", op, as,
                            dt_order_name(a.order), m);
        if (a.kind == DT_SHARD && a.dim == 0 && dt_layout_shard_dims(tl, 0, NULL) > 1)
            return dt_error(DT_ERR_NOT_SUPPORTED, "%s: table %s shards the vocabulary over "
                            "several mesh dims; vocab-parallel tables use one: redistribute the "
                            "table to shard dim 0 on one mesh dim", op, as);
        if (a.kind == DT_SHARD && a.dim == 0) {   /* vocab-parallel */
            p->out.placements[m] = dt_partial();
            p->lo = (int64_t)dt_mesh_coord(mesh, m) * (V / dt_mesh_size(mesh, m));
        } else if (a.kind == DT_SHARD) {           /* the embedding dim */
            p->out.placements[m] = dt_shard(nt, a.order);
        } else if (b.kind == DT_SHARD) {           /* rows of tokens */
            p->out.placements[m] = b;
            p->dtable.placements[m] = dt_partial();
        } else {
            p->out.placements[m] = dt_replicate();
        }
    }
    return DT_SUCCESS;
}

/* The tokens' values are in [0, V): one host read of their range. */
static dt_status check_tokens(const char *op, const char *what, const dt_tensor *tokens, int64_t V,
                              int32_t ignore, int64_t *valid) {
    dt_backend *be = dt_tensor_context(tokens)->backend;
    int64_t bad = -1, n_valid = 0;
    DT_TRY(be->ops->i32_check(be, dt_tensor_local_numel(tokens), dt_tensor_data_const(tokens), V,
                              ignore, &n_valid, &bad));
    if (valid) *valid = n_valid;
    if (bad < 0) return DT_SUCCESS;
    int32_t v = 0;
    DT_TRY(be->ops->download(be, &v, (const int32_t *)dt_tensor_data_const(tokens) + bad, sizeof v));
    return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: %s[%" PRId64 "] (local) = %d is outside [0, %"
                    PRId64 ")%s", op, what, bad, v, V,
                    ignore != INT32_MIN ? " and is not the ignore index" : "");
}

static int64_t out_shape(const dt_tensor *table, const dt_tensor *tokens, int64_t *shape) {
    const int nt = dt_tensor_ndim(tokens);
    for (int d = 0; d < nt; d++) shape[d] = dt_tensor_shape(tokens)[d];
    shape[nt] = dt_tensor_shape(table)[1];
    return nt + 1;
}

static dt_status embedding_impl(const dt_tensor *table, const dt_tensor *tokens, dt_tensor **out) {
    const char *op = "dt_embedding";
    embed_plan p;
    DT_TRY(embed_plan_make(op, table, tokens, &p));
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    DT_TRY(check_tokens(op, "tokens", tokens, dt_tensor_shape(table)[0], INT32_MIN, NULL));
    int64_t shape[DT_MAX_DIMS];
    const int nd = (int)out_shape(table, tokens, shape);
    const dt_mesh *mesh = dt_tensor_mesh(table);
    dt_tensor *o = NULL;
    DT_TRY(dt_tensor_create_uninit(dt_tensor_context(table), mesh, dt_tensor_dtype(table), nd, shape,
                                   mesh ? &p.out : NULL, &o));
    dt_backend *be = dt_tensor_context(table)->backend;
    dt_status st = be->ops->embedding(be, dt_tensor_dtype(table), p.n, p.E,
                                      dt_tensor_data_const(tokens), p.lo, p.rows,
                                      dt_tensor_data_const(table), dt_tensor_data(o));
    return dt_op_output(st, o, out);
}

dt_status dt_embedding(const dt_tensor *table, const dt_tensor *tokens, dt_tensor **out) {
    return dt_context_note(table ? dt_tensor_context(table) : NULL,
                           embedding_impl(table, tokens, out));
}

static dt_status embedding_backward_impl(const dt_tensor *table, const dt_tensor *tokens,
                                         const dt_tensor *dy, dt_tensor **dtable) {
    const char *op = "dt_embedding_backward";
    embed_plan p;
    DT_TRY(embed_plan_make(op, table, tokens, &p));
    DT_REQUIRE(dy != NULL, "%s: dy is NULL", op);
    int64_t shape[DT_MAX_DIMS];
    const int nd = (int)out_shape(table, tokens, shape);
    DT_REQUIRE(dt_tensor_context(dy) == dt_tensor_context(table) &&
                   dt_tensor_mesh(dy) == dt_tensor_mesh(table) &&
                   dt_tensor_dtype(dy) == dt_tensor_dtype(table),
               "%s: dy must have the table's context, mesh and dtype", op);
    int same = dt_tensor_ndim(dy) == nd;
    for (int d = 0; same && d < nd; d++) same = dt_tensor_shape(dy)[d] == shape[d];
    if (!same) {
        char a[160], b[160];
        dt_shape_format(nd, shape, a, sizeof a);
        dt_shape_format(dt_tensor_ndim(dy), dt_tensor_shape(dy), b, sizeof b);
        return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: dy %s must have the output's shape %s", op,
                        b, a);
    }
    const dt_mesh *mesh = dt_tensor_mesh(table);
    if (mesh) {
        const dt_layout want = dt_layout_grad(&p.out);
        DT_TRY(dt_layout_require(op, "dy", dy, &want, "the Layout of the output's gradient"));
    }
    dt_grad g;
    DT_TRY(dt_grad_check(op, "dtable", dtable, table, 2, dt_tensor_shape(table),
                         mesh ? &p.dtable : NULL, &g));
    if (!dtable) return DT_SUCCESS;
    DT_TRY(check_tokens(op, "tokens", tokens, dt_tensor_shape(table)[0], INT32_MIN, NULL));
    dt_backend *be = dt_tensor_context(table)->backend;
    dt_status st = dt_grad_make(&g, 0);
    if (st == DT_SUCCESS)
        st = be->ops->embedding_backward(be, dt_tensor_dtype(table), p.n, p.E,
                                         dt_tensor_data_const(tokens), p.lo, p.rows,
                                         dt_tensor_data_const(dy), dt_tensor_data(g.t),
                                         g.accumulate);
    return dt_grad_finish(st, &g);
}

dt_status dt_embedding_backward(const dt_tensor *table, const dt_tensor *tokens,
                                const dt_tensor *dy, dt_tensor **dtable) {
    return dt_context_note(table ? dt_tensor_context(table) : NULL,
                           embedding_backward_impl(table, tokens, dy, dtable));
}

/* ------------------------------------------------------------ cross-entropy */

/* The mesh dims whose communicators reduce: the vocabulary's (at most one)
 * and the rows'. */
typedef struct ce_plan {
    int vocab_dim;                    /* -1: the vocabulary is whole here */
    int row_dims[DT_MAX_MESH_DIMS], n_row_dims;
    int64_t lo, V, Vl, rows;
} ce_plan;

static dt_status ce_plan_make(const char *op, const dt_tensor *logits, const dt_tensor *targets,
                              const dt_cross_entropy_options *o, ce_plan *p) {
    DT_REQUIRE(logits && targets, "%s: logits and targets must not be NULL", op);
    DT_REQUIRE(dt_tensor_context(logits) == dt_tensor_context(targets) &&
                   dt_tensor_mesh(logits) == dt_tensor_mesh(targets),
               "%s: logits and targets must share one context and mesh", op);
    DT_TRY(dt_context_check_dtype(dt_tensor_context(logits), op, dt_tensor_dtype(logits)));
    DT_REQUIRE(dt_tensor_dtype(targets) == DT_I32, "%s: targets must be i32, got %s", op,
               dt_dtype_name(dt_tensor_dtype(targets)));
    DT_REQUIRE((int)o->reduction >= 0 && o->reduction < DT_LOSS_REDUCTION_COUNT,
               "%s: unknown reduction %d", op, (int)o->reduction);
    const int nd = dt_tensor_ndim(logits), last = nd - 1;
    int same = dt_tensor_ndim(targets) == last;
    for (int d = 0; same && d < last; d++)
        same = dt_tensor_shape(targets)[d] == dt_tensor_shape(logits)[d];
    if (!same) {
        char a[160], b[160];
        dt_shape_format(nd, dt_tensor_shape(logits), a, sizeof a);
        dt_shape_format(dt_tensor_ndim(targets), dt_tensor_shape(targets), b, sizeof b);
        return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: targets %s must be logits %s without the "
                        "last dim", op, b, a);
    }
    DT_REQUIRE(dt_tensor_shape(logits)[last] > 0,
               "%s: logits have no classes (the last dim, the vocabulary, is 0)", op);
    memset(p, 0, sizeof *p);
    p->vocab_dim = -1;
    p->V = dt_tensor_shape(logits)[last];
    p->Vl = dt_tensor_local_shape(logits)[last];
    p->rows = dt_tensor_local_numel(targets);
    const dt_mesh *mesh = dt_tensor_mesh(logits);
    if (!mesh) return DT_SUCCESS;
    const dt_layout *ll = dt_tensor_layout(logits), *tl = dt_tensor_layout(targets);
    for (int m = 0; m < ll->ndim; m++) {
        const dt_placement a = ll->placements[m], b = tl->placements[m];
        if (a.kind == DT_REPLICATE && b.kind == DT_REPLICATE) continue;
        if (a.kind == DT_SHARD && a.dim == last && dt_layout_shard_dims(ll, last, NULL) > 1) {
            char as[160];
            dt_layout_format(ll, as, sizeof as);
            return dt_error(DT_ERR_NOT_SUPPORTED,
                            "%s: logits %s shard the vocabulary (dim %d) over several mesh dims; "
                            "the vocab-parallel loss splits it over one: redistribute the logits "
                            "to shard dim %d on one mesh dim", op, as, last, last);
        }
        if (a.kind == DT_SHARD && a.dim == last && a.order == DT_ORDER_CONTIGUOUS &&
            b.kind == DT_REPLICATE) {
            p->vocab_dim = m;
            p->lo = (int64_t)dt_mesh_coord(mesh, m) * p->Vl;
            continue;
        }
        if (a.kind == DT_SHARD && a.dim < last && dt_placement_equal(a, b)) {
            p->row_dims[p->n_row_dims++] = m;
            continue;
        }
        char as[160], bs[160];
        dt_layout_format(ll, as, sizeof as);
        dt_layout_format(tl, bs, sizeof bs);
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "%s: logits %s with targets %s on mesh dim %d: each mesh dim must split "
                        "the vocabulary (logits Shard(%d, contiguous), targets Replicate), split "
                        "the rows alike (the same Shard on both) or neither (Replicate)", op, as,
                        bs, m, last);
    }
    return DT_SUCCESS;
}

/* All-reduce n fp32 of backend memory over the comms of `dims`. */
static dt_status ce_reduce(const dt_mesh *mesh, const int *dims, int n_dims, float *buf, size_t n,
                           dt_reduce_op rop) {
    for (int i = 0; i < n_dims; i++)
        DT_TRY(dt_comm_all_reduce(dt_mesh_comm(mesh, dims[i]), buf, buf, n, DT_F32, rop));
    return DT_SUCCESS;
}

/* Host doubles summed over the row dims, through backend memory (a transport
 * may take device memory only): each value as four fp32 pieces, so that
 * counts of up to 2^40 and sums stay exact or within fp32's rounding of the
 * pieces. */
#define CE_PIECES 4
static dt_status ce_sum_host(dt_backend *be, const dt_mesh *mesh, const ce_plan *p, double *v,
                             int n) {
    if (!p->n_row_dims) return DT_SUCCESS;
    float host[2 * CE_PIECES];
    void *dev = NULL;
    DT_TRY(be->ops->alloc(be, sizeof host, &dev));
    for (int i = 0; i < n; i++) {   /* v[i] = sum of the pieces, each exact in fp32 */
        double r = v[i];
        for (int k = 0; k < CE_PIECES; k++) {
            host[i * CE_PIECES + k] = (float)r;
            r -= (double)(float)r;
        }
    }
    dt_status st = be->ops->upload(be, dev, host, (size_t)n * CE_PIECES * sizeof(float));
    if (st == DT_SUCCESS)
        st = ce_reduce(mesh, p->row_dims, p->n_row_dims, dev, (size_t)n * CE_PIECES, DT_REDUCE_SUM);
    if (st == DT_SUCCESS) st = be->ops->download(be, host, dev, (size_t)n * CE_PIECES * sizeof(float));
    for (int i = 0; st == DT_SUCCESS && i < n; i++) {
        v[i] = 0.0;
        for (int k = CE_PIECES - 1; k >= 0; k--) v[i] += (double)host[i * CE_PIECES + k];
    }
    be->ops->free(be, dev);
    return st;
}

static dt_status cross_entropy_impl(const dt_tensor *logits, const dt_tensor *targets,
                                    const dt_cross_entropy_options *opts, float *loss,
                                    dt_tensor **dlogits) {
    const char *op = "dt_cross_entropy";
    const dt_cross_entropy_options def = DT_CROSS_ENTROPY_OPTIONS_INIT;
    const dt_cross_entropy_options *o = opts ? opts : &def;
    /* This rank's own checks, then the ranks' agreement (collective even
     * when they fail). */
    ce_plan p;
    int64_t valid = 0;
    dt_status local = ce_plan_make(op, logits, targets, o, &p);
    if (local == DT_SUCCESS && dlogits && *dlogits)
        local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: *dlogits must be NULL (a new tensor)", op);
    if (local == DT_SUCCESS)
        local = check_tokens(op, "targets", targets, p.V, o->ignore_index, &valid);
    const dt_tensor *any = logits ? logits : targets;
    dt_context *ctx = any ? dt_tensor_context(any) : NULL;
    const dt_mesh *mesh = any ? dt_tensor_mesh(any) : NULL;
    if (mesh) {
        static const char *const names[] = {"ndim", "V", "reduction", "ignore index", "dlogits"};
        const int64_t vals[5] = {logits ? dt_tensor_ndim(logits) : 0, p.V, o->reduction,
                                 o->ignore_index, dlogits != NULL};
        DT_TRY(dt_context_check_call(ctx, op, local, vals, names, 5, DT_CHECK_ON));
    } else {
        DT_TRY(local);
    }

    dt_backend *be = ctx->backend;
    const dt_dtype dt = dt_tensor_dtype(logits);
    double stats[2] = {(double)valid, 0.0};   /* targets that count; the loss's sum */
    DT_TRY(ce_sum_host(be, mesh, &p, stats, 1));
    const double N = stats[0];
    const float scale = o->reduction == DT_LOSS_MEAN ? (N > 0 ? (float)(1.0 / N) : 0.0f) : 1.0f;

    /* per row: the max, the sum and the target's logit (fp32, backend memory) */
    const size_t rows = (size_t)p.rows;
    float *buf = NULL;
    dt_tensor *g = NULL;
    float *host = NULL;
    dt_status st = be->ops->alloc(be, (4 * rows + 1) * sizeof(float), (void **)&buf);
    float *m = buf, *se = buf + rows, *tl = buf + 2 * rows, *lr = buf + 3 * rows;
    const int vdims[1] = {p.vocab_dim};
    const int nv = p.vocab_dim >= 0;
    if (st == DT_SUCCESS)
        st = be->ops->ce_max(be, dt, p.rows, p.Vl, dt_tensor_data_const(logits), m);
    if (st == DT_SUCCESS && nv) st = ce_reduce(mesh, vdims, 1, m, rows, DT_REDUCE_MAX);
    if (st == DT_SUCCESS)
        st = be->ops->ce_sum(be, dt, p.rows, p.Vl, dt_tensor_data_const(logits), m,
                             dt_tensor_data_const(targets), p.lo, se, tl);
    if (st == DT_SUCCESS && nv) st = ce_reduce(mesh, vdims, 1, se, 2 * rows, DT_REDUCE_SUM);
    if (st == DT_SUCCESS && dlogits)
        st = dt_tensor_create_uninit(ctx, mesh, dt, dt_tensor_ndim(logits), dt_tensor_shape(logits),
                                     mesh ? dt_tensor_layout(logits) : NULL, &g);
    if (st == DT_SUCCESS)
        st = be->ops->ce_grad(be, dt, p.rows, p.Vl, dt_tensor_data_const(logits), m, se, tl,
                              dt_tensor_data_const(targets), p.lo, o->ignore_index, scale,
                              g ? dt_tensor_data(g) : NULL, lr);
    if (st == DT_SUCCESS && loss) {
        host = malloc(rows ? rows * sizeof *host : 1);
        if (!host) st = dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        if (st == DT_SUCCESS && rows) st = be->ops->download(be, host, lr, rows * sizeof *host);
        double sum = 0.0;
        for (size_t r = 0; st == DT_SUCCESS && r < rows; r++) sum += (double)host[r];
        stats[1] = sum;
        if (st == DT_SUCCESS) st = ce_sum_host(be, mesh, &p, stats + 1, 1);
        if (st == DT_SUCCESS)
            *loss = o->reduction == DT_LOSS_MEAN ? (float)(N > 0 ? stats[1] / N : NAN)
                                                 : (float)stats[1];
    }
    free(host);
    be->ops->free(be, buf);
    if (st == DT_SUCCESS && dlogits) *dlogits = g;
    else dt_tensor_destroy(g);
    return st;
}

dt_status dt_cross_entropy(const dt_tensor *logits, const dt_tensor *targets,
                           const dt_cross_entropy_options *opts, float *loss,
                           dt_tensor **dlogits) {
    const dt_tensor *any = logits ? logits : targets;
    return dt_context_note(any ? dt_tensor_context(any) : NULL,
                           cross_entropy_impl(logits, targets, opts, loss, dlogits));
}
