/* tests/test_ops.c — dt_matmul (replicated, column-, row-, sequence-parallel,
 * Partial operands; 1-D meshes P = 1..8 and 2-D meshes), dt_add and dt_gelu,
 * against double-precision references computed here from (seed, global
 * index) with the test-local index maps of tests/harness.c.
 *
 * Tolerances (|got - ref| <= bound, per element; A = sum_k |x_ik| |w_kj|):
 *   matmul fp32:  (K + W) * 2^-24 * A      fp32 accumulation of K products
 *                                          and at most W summands (W = world)
 *   matmul bf16:  the fp32 bound + u |ref|, plus u A when the output is
 *   and fp16      Partial (each summand is rounded to the dtype once, then
 *                 the all-reduce rounds the sum once), with u the rounding's
 *                 relative error: 2^-8 (bf16), 2^-11 (fp16). Inputs are
 *                 values of the dtype.
 *   add:          exact (fp32: the same fp32 addition; bf16, fp16: rounded
 *                 once); Partial inputs are multiples of 1/16 so their sums
 *                 are exact.
 *   gelu fp32:    1e-6 + 1e-6 |ref| against erf / tanh in double
 *   gelu bf16,    1e-6 + u |ref| (computed in fp32, rounded once)
 *   fp16
 *   gelu sweep:   the same bounds on 2^18 + 1 points of [-12, 12] on one
 *                 rank, and 1e-5 |ref| (bf16, fp16: u |ref|, fp16 plus its
 *                 subnormals' 2^-25) on x in [-9, -3] (the left tail, where
 *                 1 + erf(x / sqrt 2) would cancel); +inf, NaN, -0 and -1e30
 *                 (fp16: -6e4) map to inf, NaN, -0 and -0.
 *
 * Rank functions only record; the main thread asserts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/context.h"
#include "base/dtype.h"
#include "dtensor/mesh.h"
#include "dtensor/ops.h"
#include "dtensor/primitives.h"
#include "dtensor/tensor.h"
#include "harness.h"
#include "ref.h"

#define MAXW H_MAX_RANKS

static int has_partial(const dt_layout *l) {
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_PARTIAL) return 1;
    return 0;
}

/* Summand pc of a global tensor: values rounded to dtype; `quantise` makes
 * them multiples of 1/16 (exact sums). */
static float summand(uint64_t seed, int pc, int64_t g, dt_dtype dtype, int quantise, float scale) {
    float v = dt_random_value(seed + 7919u * (uint64_t)pc, (uint64_t)g) * scale;
    if (quantise) v = floorf(v * 16.0f) / 16.0f;
    return h_stored(dtype, v);
}

/* Creates a tensor holding this rank's summand under `l`: summand index from
 * its Partial coordinates (0 without Partial dims). */
static dt_status make_input(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                            const int64_t *shape, const dt_layout *l, uint64_t seed, int quantise,
                            float scale, dt_tensor **out) {
    int coords[3] = { 0, 0, 0 };
    const int *ms = mesh ? dt_mesh_sizes(mesh) : NULL;
    if (mesh) h_coords(dt_context_rank(ctx), dt_mesh_ndim(mesh), ms, coords);
    int pc = l ? h_partial_index(l, ms, coords) : 0;
    int64_t n = h_numel(ndim, shape);
    float *full = malloc((size_t)(n + 1) * sizeof *full);
    float *loc = malloc((size_t)(n + 1) * sizeof *loc);
    float *h = malloc((size_t)(n + 1) * sizeof *h);   /* loc in the dtype */
    dt_tensor *t = NULL;
    dt_status st = DT_ERR_OUT_OF_MEMORY;
    if (!full || !loc || !h) goto out;
    for (int64_t g = 0; g < n; g++) full[g] = summand(seed, pc, g, dtype, quantise, scale);
    h_local_of(full, ndim, shape, l, ms, coords, loc, NULL);
    st = dt_tensor_create(ctx, mesh, dtype, ndim, shape, l, &t);
    if (st != DT_SUCCESS) goto out;
    dt_values_set(h, dtype, (size_t)dt_tensor_local_numel(t), loc);
    st = dt_tensor_set_local(t, h, dt_tensor_local_bytes(t));
out:
    free(full);
    free(loc);
    free(h);
    if (st == DT_SUCCESS)
        *out = t;
    else
        dt_tensor_destroy(t);
    return st;
}

/* The true global value (sum of summands) and sum of |summands|, in double. */
static void true_global(uint64_t seed, const dt_layout *l, const int *ms, int64_t n,
                        dt_dtype dtype, int quantise, float scale, double *val, double *absval) {
    int np = l ? h_partial_count(l, ms) : 1;
    for (int64_t g = 0; g < n; g++) {
        double s = 0, a = 0;
        for (int pc = 0; pc < np; pc++) {
            double v = summand(seed, pc, g, dtype, quantise, scale);
            s += v;
            a += fabs(v);
        }
        val[g] = s;
        if (absval) absval[g] = a;
    }
}

static const char *order_letter(dt_order o) {
    return o == DT_ORDER_CONTIGUOUS ? "contiguous" : o == DT_ORDER_STRIPED ? "striped" : "zigzag";
}

/* ------------------------------------------------------------------ */
/* matmul                                                              */
/* ------------------------------------------------------------------ */

typedef struct mm_case {
    int ndim_mesh, mesh[3], world;
    dt_layout xl, wl, ol; /* ol: the output Layout ops.h promises */
    dt_dtype dtype;
    int64_t B, S, K, N;
    long bad[MAXW];
    int layout_ok[MAXW];
    double max_err[MAXW];
} mm_case;

static dt_status rank_matmul(dt_context *ctx, void *arg) {
    mm_case *c = arg;
    int r = dt_context_rank(ctx);
    int64_t xs[] = { c->B, c->S, c->K }, ws[] = { c->K, c->N }, os[] = { c->B, c->S, c->N };
    int64_t xn = h_numel(3, xs), wn = h_numel(2, ws), on = h_numel(3, os);
    int64_t M = c->B * c->S;
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *w = NULL, *o = NULL, *rep = NULL;
    double *xv = malloc((size_t)xn * sizeof *xv), *xa = malloc((size_t)xn * sizeof *xa);
    double *wv = malloc((size_t)wn * sizeof *wv), *wa = malloc((size_t)wn * sizeof *wa);
    double *ref = malloc((size_t)on * sizeof *ref), *tol = malloc((size_t)on * sizeof *tol);
    double *lref = malloc((size_t)on * sizeof *lref), *ltol = malloc((size_t)on * sizeof *ltol);
    float *got = NULL;
    dt_status st = DT_SUCCESS;
    if (!xv || !xa || !wv || !wa || !ref || !tol || !lref || !ltol) {
        st = DT_ERR_OUT_OF_MEMORY;
        goto out;
    }
    DT_TRY_GOTO(st, dt_mesh_create(ctx, c->ndim_mesh, c->mesh, NULL, &mesh), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, c->dtype, 3, xs, &c->xl, 11, 0, 1.0f, &x), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, c->dtype, 2, ws, &c->wl, 22, 0, 1.0f, &w), out);
    DT_TRY_GOTO(st, dt_matmul(x, w, &o), out);
    c->layout_ok[r] = dt_layout_equal(dt_tensor_layout(o), &c->ol);

    /* reference and per-element bound */
    true_global(11, &c->xl, c->mesh, xn, c->dtype, 0, 1.0f, xv, xa);
    true_global(22, &c->wl, c->mesh, wn, c->dtype, 0, 1.0f, wv, wa);
    int out_partial = has_partial(&c->ol);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < c->N; j++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < c->K; k++) {
                s += xv[i * c->K + k] * wv[k * c->N + j];
                a += xa[i * c->K + k] * wa[k * c->N + j];
            }
            double bound = (double)(c->K + c->world) * ldexp(1.0, -24) * a;
            if (c->dtype != DT_F32)
                bound += h_half_ulp(c->dtype) * (fabs(s) + (out_partial ? a : 0.0));
            ref[i * c->N + j] = s;
            tol[i * c->N + j] = bound;
        }
    int coords[3];
    h_coords(r, c->ndim_mesh, c->mesh, coords);
    if (out_partial) {
        /* the summands must add up: replicate, compare with the whole result */
        DT_TRY_GOTO(st, dt_tensor_replicate(o, &rep), out);
        got = h_local_floats(rep);
        if (got == NULL) {
            st = DT_ERR_OUT_OF_MEMORY;
            goto out;
        }
        c->bad[r] = h_compare_tol("matmul (replicated)", got, ref, tol, (size_t)on, &c->max_err[r]);
    } else {
        h_local_of_f64(ref, 3, os, &c->ol, c->mesh, coords, lref);
        h_local_of_f64(tol, 3, os, &c->ol, c->mesh, coords, ltol);
        got = h_local_floats(o);
        if (got == NULL) {
            st = DT_ERR_OUT_OF_MEMORY;
            goto out;
        }
        c->bad[r] = h_compare_tol("matmul", got, lref, ltol, (size_t)dt_tensor_local_numel(o),
                                  &c->max_err[r]);
    }
out:
    free(xv);
    free(xa);
    free(wv);
    free(wa);
    free(ref);
    free(tol);
    free(lref);
    free(ltol);
    free(got);
    dt_tensor_destroy(x);
    dt_tensor_destroy(w);
    dt_tensor_destroy(o);
    dt_tensor_destroy(rep);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_matmul(void **state) {
    mm_case *c = *state;
    dt_status st = h_launch(c->world, rank_matmul, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->world; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
        assert_true(isfinite(c->max_err[r]));
    }
}

/* A local (mesh NULL) matmul with a 1-dim x and a 4-dim x: leading dims flatten. */
typedef struct mm_local_case {
    long bad[2];
    int64_t out_shape[2][4];
} mm_local_case;

static dt_status rank_matmul_local(dt_context *ctx, void *arg) {
    mm_local_case *c = arg;
    const int64_t K = 7, N = 5;
    int64_t x1s[] = { K }, x4s[] = { 2, 1, 3, K }, ws[] = { K, N };
    dt_tensor *x1 = NULL, *x4 = NULL, *w = NULL, *o1 = NULL, *o4 = NULL;
    dt_status st = DT_SUCCESS;
    DT_TRY_GOTO(st, make_input(ctx, NULL, DT_F32, 1, x1s, NULL, 5, 0, 1.0f, &x1), out);
    DT_TRY_GOTO(st, make_input(ctx, NULL, DT_F32, 4, x4s, NULL, 6, 0, 1.0f, &x4), out);
    DT_TRY_GOTO(st, make_input(ctx, NULL, DT_F32, 2, ws, NULL, 7, 0, 1.0f, &w), out);
    DT_TRY_GOTO(st, dt_matmul(x1, w, &o1), out);
    DT_TRY_GOTO(st, dt_matmul(x4, w, &o4), out);
    dt_tensor *outs[2] = { o1, o4 };
    int64_t rows[2] = { 1, 6 };
    uint64_t seeds[2] = { 5, 6 };
    for (int t = 0; t < 2; t++) {
        float *got = h_local_floats(outs[t]);
        double ref[6 * 5], tol[6 * 5];
        for (int64_t i = 0; i < rows[t]; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0, a = 0;
                for (int64_t k = 0; k < K; k++) {
                    double xv = summand(seeds[t], 0, i * K + k, DT_F32, 0, 1.0f);
                    double wv = summand(7, 0, k * N + j, DT_F32, 0, 1.0f);
                    s += xv * wv;
                    a += fabs(xv * wv);
                }
                ref[i * N + j] = s;
                tol[i * N + j] = (double)(K + 1) * ldexp(1.0, -24) * a;
            }
        c->bad[t] = got ? h_compare_tol("local matmul", got, ref, tol, (size_t)(rows[t] * N), NULL) : -1;
        free(got);
        for (int d = 0; d < dt_tensor_ndim(outs[t]); d++) c->out_shape[t][d] = dt_tensor_shape(outs[t])[d];
    }
out:
    dt_tensor_destroy(x1);
    dt_tensor_destroy(x4);
    dt_tensor_destroy(w);
    dt_tensor_destroy(o1);
    dt_tensor_destroy(o4);
    return st;
}

static void test_matmul_local(void **state) {
    (void)state;
    mm_local_case c;
    memset(&c, 0, sizeof c);
    assert_int_equal(h_launch(1, rank_matmul_local, &c), DT_SUCCESS);
    assert_int_equal(c.bad[0], 0);
    assert_int_equal(c.bad[1], 0);
    assert_int_equal(c.out_shape[0][0], 5);
    assert_int_equal(c.out_shape[1][0], 2);
    assert_int_equal(c.out_shape[1][2], 3);
    assert_int_equal(c.out_shape[1][3], 5);
}

/* ------------------------------------------------------------------ */
/* add                                                                 */
/* ------------------------------------------------------------------ */

typedef struct add_case {
    int world;
    dt_layout l;
    dt_dtype dtype;
    long bad[MAXW];
    int layout_ok[MAXW];
} add_case;

static dt_status rank_add(dt_context *ctx, void *arg) {
    add_case *c = arg;
    int r = dt_context_rank(ctx);
    int64_t shape[] = { 2 * c->world, 3, 4 * c->world };
    int64_t n = h_numel(3, shape);
    dt_mesh *mesh = NULL;
    dt_tensor *a = NULL, *b = NULL, *o = NULL, *rep = NULL;
    float *ga = NULL, *gb = NULL, *go = NULL;
    double *ref = NULL, *bv = NULL;
    dt_status st = DT_SUCCESS;
    int partial = has_partial(&c->l);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &c->world, NULL, &mesh), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, c->dtype, 3, shape, &c->l, 3, partial, 1.0f, &a), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, c->dtype, 3, shape, &c->l, 4, partial, 1.0f, &b), out);
    DT_TRY_GOTO(st, dt_add(a, b, &o), out);
    c->layout_ok[r] = dt_layout_equal(dt_tensor_layout(o), &c->l);
    if (!partial) {
        /* elementwise on the local parts: the same fp32 sum, rounded once */
        ga = h_local_floats(a);
        gb = h_local_floats(b);
        go = h_local_floats(o);
        if (!ga || !gb || !go) {
            st = DT_ERR_OUT_OF_MEMORY;
            goto out;
        }
        long bad = 0;
        for (int64_t i = 0; i < dt_tensor_local_numel(o); i++)
            bad += go[i] != h_stored(c->dtype, ga[i] + gb[i]);
        c->bad[r] = bad;
    } else {
        ref = malloc((size_t)n * sizeof *ref);
        bv = malloc((size_t)n * sizeof *bv);
        if (!ref || !bv) {
            st = DT_ERR_OUT_OF_MEMORY;
            goto out;
        }
        true_global(3, &c->l, &c->world, n, c->dtype, 1, 1.0f, ref, NULL);
        true_global(4, &c->l, &c->world, n, c->dtype, 1, 1.0f, bv, NULL);
        for (int64_t g = 0; g < n; g++) ref[g] += bv[g];
        DT_TRY_GOTO(st, dt_tensor_replicate(o, &rep), out);
        go = h_local_floats(rep);
        if (!go) {
            st = DT_ERR_OUT_OF_MEMORY;
            goto out;
        }
        c->bad[r] = h_compare("add (Partial, replicated)", go, ref, (size_t)n, 0.0, 0.0, NULL);
    }
out:
    free(ga);
    free(gb);
    free(go);
    free(ref);
    free(bv);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_tensor_destroy(o);
    dt_tensor_destroy(rep);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_add(void **state) {
    add_case *c = *state;
    dt_status st = h_launch(c->world, rank_add, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->world; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
    }
}

/* ------------------------------------------------------------------ */
/* gelu                                                                */
/* ------------------------------------------------------------------ */

typedef struct gelu_case {
    int world; /* 0: a local tensor on one rank */
    dt_layout l;
    dt_dtype dtype;
    dt_gelu_approx approx;
    long bad[MAXW];
    double max_err[MAXW];
    int layout_ok[MAXW];
} gelu_case;

static dt_status rank_gelu(dt_context *ctx, void *arg) {
    gelu_case *c = arg;
    int r = dt_context_rank(ctx);
    int P = c->world > 0 ? c->world : 1;
    int64_t shape[] = { 3, 8 * P };
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *o = NULL;
    float *gx = NULL, *go = NULL;
    double *ref = NULL, *tol = NULL;
    dt_status st = DT_SUCCESS;
    if (c->world > 0) DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh), out);
    /* inputs in [-4, 4): both tails and the bend of GELU */
    DT_TRY_GOTO(st, make_input(ctx, mesh, c->dtype, 2, shape, mesh ? &c->l : NULL, 9, 0, 4.0f, &x),
                out);
    DT_TRY_GOTO(st, dt_gelu(x, c->approx, &o), out);
    c->layout_ok[r] = mesh ? dt_layout_equal(dt_tensor_layout(o), &c->l)
                           : dt_tensor_layout(o)->ndim == 0;
    int64_t n = dt_tensor_local_numel(o);
    gx = h_local_floats(x);
    go = h_local_floats(o);
    ref = malloc((size_t)(n + 1) * sizeof *ref);
    tol = malloc((size_t)(n + 1) * sizeof *tol);
    if (!gx || !go || !ref || !tol) {
        st = DT_ERR_OUT_OF_MEMORY;
        goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        ref[i] = h_gelu_ref(gx[i], c->approx);
        tol[i] = 1e-6 + (c->dtype == DT_F32 ? 1e-6 : h_half_ulp(c->dtype)) * fabs(ref[i]);
    }
    c->bad[r] = h_compare_tol("gelu", go, ref, tol, (size_t)n, &c->max_err[r]);
out:
    free(gx);
    free(go);
    free(ref);
    free(tol);
    dt_tensor_destroy(x);
    dt_tensor_destroy(o);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_gelu(void **state) {
    gelu_case *c = *state;
    int w = c->world > 0 ? c->world : 1;
    dt_status st = h_launch(w, rank_gelu, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < w; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
    }
}

/* Dense sweep of one local tensor (the CPU kernel works in blocks: the
 * length is not a multiple of the block), left tail and special values. */
typedef struct sweep_case {
    dt_dtype dtype;
    dt_gelu_approx approx;
    long bad, tail_bad, special_bad;
    double max_err;
} sweep_case;

enum { SWEEP_N = (1 << 18) + 1, SWEEP_SPECIALS = 4 };

static dt_status rank_gelu_sweep(dt_context *ctx, void *arg) {
    sweep_case *c = arg;
    const int64_t n = SWEEP_N + SWEEP_SPECIALS;
    /* the last: a large negative value the dtype holds */
    const float specials[SWEEP_SPECIALS] = {INFINITY, NAN, -0.0f,
                                            c->dtype == DT_F16 ? -6e4f : -1e30f};
    float *x = malloc((size_t)n * sizeof *x), *got = NULL;
    double *ref = malloc((size_t)n * sizeof *ref), *tol = malloc((size_t)n * sizeof *tol);
    float *h = malloc((size_t)n * sizeof *h);   /* x in the dtype */
    dt_tensor *t = NULL, *o = NULL;
    dt_status st = DT_SUCCESS;
    if (!x || !ref || !tol || !h) {
        st = DT_ERR_OUT_OF_MEMORY;
        goto out;
    }
    for (int64_t i = 0; i < SWEEP_N; i++) x[i] = h_stored(c->dtype, -12.0f + 24.0f * (float)i / (SWEEP_N - 1));
    for (int k = 0; k < SWEEP_SPECIALS; k++) x[SWEEP_N + k] = specials[k];
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, c->dtype, 1, &n, NULL, &t), out);
    dt_values_set(h, c->dtype, (size_t)n, x);
    DT_TRY_GOTO(st, dt_tensor_set_local(t, h, dt_tensor_local_bytes(t)), out);
    DT_TRY_GOTO(st, dt_gelu(t, c->approx, &o), out);
    got = h_local_floats(o);
    if (!got) {
        st = DT_ERR_OUT_OF_MEMORY;
        goto out;
    }
    for (int64_t i = 0; i < SWEEP_N; i++) {
        /* The same functions written without 1 + erf or 1 + tanh, which
         * cancel in double too for x < -6 or so. */
        const double xd = x[i], k = sqrt(2.0 / 3.14159265358979323846);
        ref[i] = c->approx == DT_GELU_ERF ? 0.5 * xd * erfc(-xd / sqrt(2.0))
                                          : xd / (1.0 + exp(-2.0 * k * (xd + 0.044715 * xd * xd * xd)));
        tol[i] = 1e-6 + (c->dtype == DT_F32 ? 1e-6 : h_half_ulp(c->dtype)) * fabs(ref[i]);
    }
    c->bad = h_compare_tol("gelu sweep", got, ref, tol, SWEEP_N, &c->max_err);
    /* The left tail, relative (fp16 also rounds to its subnormals there). */
    const double rt = c->dtype == DT_F32 ? 1e-5 : h_half_ulp(c->dtype);
    const double at = c->dtype == DT_F16 ? ldexp(1.0, -25) : 0.0;
    for (int64_t i = 0; i < SWEEP_N; i++) {
        if (x[i] >= -9.0f && x[i] <= -3.0f && !(fabs(got[i] - ref[i]) <= at + rt * fabs(ref[i]))) {
            if (c->tail_bad++ < 3)
                fprintf(stderr, "  gelu tail: x %.9g got %.9g, expected %.9g (relative %g)\n",
                        (double)x[i], (double)got[i], ref[i], rt);
        }
    }
    const float *sp = got + SWEEP_N;
    c->special_bad = !(isinf(sp[0]) && sp[0] > 0) + !isnan(sp[1]) + !(sp[2] == 0.0f && signbit(sp[2])) +
                     !(sp[3] == 0.0f);
    if (c->special_bad)
        fprintf(stderr, "  gelu(+inf, NaN, -0, %g) = %g, %g, %g, %g\n", (double)specials[3],
                (double)sp[0], (double)sp[1], (double)sp[2], (double)sp[3]);
out:
    free(x);
    free(got);
    free(ref);
    free(tol);
    free(h);
    dt_tensor_destroy(o);
    dt_tensor_destroy(t);
    return st;
}

static void test_gelu_sweep(void **state) {
    sweep_case *c = *state;
    dt_status st = h_launch(1, rank_gelu_sweep, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    assert_int_equal(c->bad, 0);
    assert_int_equal(c->tail_bad, 0);
    assert_int_equal(c->special_bad, 0);
}

/* ------------------------------------------------------------------ */
/* Rejected combinations                                               */
/* ------------------------------------------------------------------ */

#define N_ERR 32

typedef struct err_case {
    dt_status st[N_ERR];
    char msg[N_ERR][300];
    int n, out_untouched;
    long changed;
    char names[8][32];
} err_case;

static dt_status rank_errors(dt_context *ctx, void *arg) {
    err_case *c = arg;
    int r = dt_context_rank(ctx);
    int P = 2;
    dt_mesh *mesh = NULL, *mesh_b = NULL;
    dt_tensor *x = NULL, *xr = NULL, *xp = NULL, *xs1 = NULL, *w = NULL, *ws0 = NULL, *ws0s = NULL,
              *wr = NULL, *wp = NULL, *w3 = NULL, *xb = NULL, *wk = NULL, *other = NULL,
              *loc = NULL;
    dt_status st = DT_SUCCESS;
    int64_t xs[] = { 2, 4, 8 }, ws[] = { 8, 4 }, w3s[] = { 8, 4, 1 }, wks[] = { 6, 4 };
    dt_layout R = dt_layout_1d(dt_replicate()), Pa = dt_layout_1d(dt_partial());
    dt_layout Xk = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS));
    dt_layout Xs1 = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    dt_layout W0 = dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED));
    dt_layout W0c = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    dt_layout W1 = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh), out);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh_b), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 3, xs, &Xk, 1, 0, 1.0f, &x), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 3, xs, &R, 1, 0, 1.0f, &xr), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 3, xs, &Pa, 1, 0, 1.0f, &xp), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 3, xs, &Xs1, 1, 0, 1.0f, &xs1), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 2, ws, &R, 2, 0, 1.0f, &wr), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 2, ws, &W0, 2, 0, 1.0f, &ws0s), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 2, ws, &W0c, 2, 0, 1.0f, &ws0), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 2, ws, &W1, 2, 0, 1.0f, &w), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 2, ws, &Pa, 2, 0, 1.0f, &wp), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 3, w3s, &R, 2, 0, 1.0f, &w3), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_BF16, 3, xs, &R, 1, 0, 1.0f, &xb), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh, DT_F32, 2, wks, &R, 2, 0, 1.0f, &wk), out);
    DT_TRY_GOTO(st, make_input(ctx, mesh_b, DT_F32, 2, ws, &R, 2, 0, 1.0f, &other), out);
    DT_TRY_GOTO(st, make_input(ctx, NULL, DT_F32, 2, ws, NULL, 2, 0, 1.0f, &loc), out);
    float *before = h_local_floats(x);

    dt_tensor *sentinel = (dt_tensor *)(uintptr_t)0x1, *o = sentinel;
    int k = 0;
    /* every rank makes the calls; rank 0 records (the results agree) */
#define REJ(expr)                                                               \
    do {                                                                        \
        dt_status s_ = (expr);                                                  \
        if (r == 0) {                                                           \
            c->st[k] = s_;                                                      \
            snprintf(c->msg[k], sizeof c->msg[k], "%s", dt_last_error());       \
        }                                                                       \
        k++;                                                                    \
    } while (0)
    REJ(dt_matmul(x, wr, &o));    /* 0: Shard(K) @ Replicate */
    REJ(dt_matmul(xr, ws0s, &o)); /* 1: Replicate @ Shard(0) */
    REJ(dt_matmul(x, ws0s, &o));  /* 2: K split in different orders */
    REJ(dt_matmul(xs1, w, &o));   /* 3: Shard(1) @ Shard(1) */
    REJ(dt_matmul(xp, w, &o));    /* 4: Partial @ Shard */
    REJ(dt_matmul(xs1, wp, &o));  /* 5: Shard @ Partial */
    REJ(dt_matmul(xr, wk, &o));   /* 6: K mismatch */
    REJ(dt_matmul(xr, w3, &o));   /* 7: w not 2-dim */
    REJ(dt_matmul(xb, wr, &o));   /* 8: dtype mismatch */
    REJ(dt_matmul(xr, other, &o)); /* 9: another mesh */
    REJ(dt_matmul(xr, loc, &o));  /* 10: local with distributed */
    REJ(dt_matmul(NULL, wr, &o)); /* 11 */
    REJ(dt_matmul(xr, wr, NULL)); /* 12 */
    REJ(dt_add(x, xr, &o));       /* 13: Layouts differ */
    REJ(dt_add(xp, xr, &o));      /* 14: Partial + Replicate */
    REJ(dt_add(xr, xb, &o));      /* 15: dtypes differ */
    REJ(dt_add(wr, wk, &o));      /* 16: shapes differ */
    REJ(dt_add(NULL, xr, &o));    /* 17 */
    REJ(dt_gelu(xp, DT_GELU_ERF, &o));                     /* 18: Partial */
    REJ(dt_gelu(xr, (dt_gelu_approx)5, &o));               /* 19: unknown approx */
    REJ(dt_gelu(NULL, DT_GELU_TANH, &o));                  /* 20 */
    REJ(dt_gelu(xr, DT_GELU_TANH, NULL));                  /* 21 */
#undef REJ
    if (r == 0) c->n = k;
    float *after = h_local_floats(x);
    if (r == 0) {
        c->out_untouched = o == sentinel;
        c->changed = (before && after)
                         ? memcmp(before, after, (size_t)dt_tensor_local_numel(x) * sizeof(float)) != 0
                         : 1;
        snprintf(c->names[0], sizeof c->names[0], "%s", dt_gelu_approx_name(DT_GELU_ERF));
        snprintf(c->names[1], sizeof c->names[1], "%s", dt_gelu_approx_name(DT_GELU_TANH));
        snprintf(c->names[2], sizeof c->names[2], "%s", dt_gelu_approx_name((dt_gelu_approx)9));
    }
    free(before);
    free(after);
out:
    dt_tensor_destroy(x);
    dt_tensor_destroy(xr);
    dt_tensor_destroy(xp);
    dt_tensor_destroy(xs1);
    dt_tensor_destroy(w);
    dt_tensor_destroy(ws0);
    dt_tensor_destroy(ws0s);
    dt_tensor_destroy(wr);
    dt_tensor_destroy(wp);
    dt_tensor_destroy(w3);
    dt_tensor_destroy(xb);
    dt_tensor_destroy(wk);
    dt_tensor_destroy(other);
    dt_tensor_destroy(loc);
    dt_mesh_destroy(mesh);
    dt_mesh_destroy(mesh_b);
    return st;
}

static void test_errors(void **state) {
    (void)state;
    err_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    dt_status st = h_launch(2, rank_errors, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    assert_int_equal(c->n, 22);
    const dt_status expect[22] = {
        DT_ERR_NOT_SUPPORTED, DT_ERR_NOT_SUPPORTED, DT_ERR_NOT_SUPPORTED, DT_ERR_NOT_SUPPORTED,
        DT_ERR_NOT_SUPPORTED, DT_ERR_NOT_SUPPORTED, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_NOT_SUPPORTED, DT_ERR_NOT_SUPPORTED, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT, DT_ERR_NOT_SUPPORTED,
        DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
    };
    for (int k = 0; k < c->n; k++) {
        if (c->st[k] != expect[k])
            fprintf(stderr, "  case %d: %s (%s)\n", k, dt_status_name(c->st[k]), c->msg[k]);
        assert_int_equal(c->st[k], expect[k]);
    }
    /* unsupported Layouts are named, with a redistribution that works */
    const struct { int k; const char *text; } msgs[] = {
        { 0, "x [Shard(2, contiguous)] @ w [Replicate]" },
        { 0, "redistribute w to [Shard(0, contiguous)]" },
        { 1, "redistribute x to [Shard(2, striped)]" },
        { 2, "redistribute w to [Shard(0, contiguous)]" },
        { 3, "redistribute w to [Replicate]" },
        { 4, "redistribute x to [Replicate]" },
        { 5, "redistribute w to [Replicate]" },
        { 6, "K (8 vs 6)" },
        { 8, "bf16" },
        { 13, "redistribute b to [Shard(2, contiguous)]" },
        { 14, "Partial" },
        { 16, "[8, 4]" },
        { 18, "redistribute x to [Replicate]" },
        { 19, "approximation 5" },
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        if (!strstr(c->msg[msgs[i].k], msgs[i].text))
            fprintf(stderr, "  case %d: '%s' lacks '%s'\n", msgs[i].k, c->msg[msgs[i].k],
                    msgs[i].text);
        assert_non_null(strstr(c->msg[msgs[i].k], msgs[i].text));
    }
    assert_true(c->out_untouched);
    assert_int_equal(c->changed, 0);
    assert_string_equal(c->names[0], "erf");
    assert_string_equal(c->names[1], "tanh");
    assert_string_equal(c->names[2], "unknown");
    free(c);
}

/* ------------------------------------------------------------------ */
/* Case tables                                                         */
/* ------------------------------------------------------------------ */

typedef struct mm_kind {
    const char *kind;
    dt_layout xl, wl, ol;
} mm_kind;

typedef struct table {
    struct CMUnitTest *tests;
    char (*names)[200];
    size_t n, cap;
} table;

static void add_test(table *t, const char *name, CMUnitTestFunction fn, void *state) {
    if (t->n >= t->cap) return;
    snprintf(t->names[t->n], sizeof t->names[t->n], "%s", name);
    t->tests[t->n] = (struct CMUnitTest){ t->names[t->n], fn, NULL, NULL, state };
    t->n++;
}

int main(void) {
    table tb = { calloc(1024, sizeof(struct CMUnitTest)), calloc(1024, 200), 0, 1024 };
    void **owned = calloc(1024, sizeof *owned);
    size_t n_owned = 0;
    if (!tb.tests || !tb.names || !owned) return 1;
    char name[200];
#define NEW(type) ((type *)(owned[n_owned++] = calloc(1, sizeof(type))))
    static const dt_order orders[3] = { DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG };

    static const dt_dtype dtypes[3] = { DT_F32, DT_BF16, DT_F16 };

    /* matmul on 1-D meshes */
    for (int dt = 0; dt < 3; dt++)
        for (int P = 1; P <= MAXW; P++) {
            dt_dtype dtype = dtypes[dt];
            mm_kind k[12];
            int nk = 0;
            for (int o = 0; o < 3; o++) {
                k[nk++] = (mm_kind){ "column", dt_layout_1d(dt_replicate()),
                                          dt_layout_1d(dt_shard(1, orders[o])),
                                          dt_layout_1d(dt_shard(2, orders[o])) };
                k[nk++] = (mm_kind){ "row", dt_layout_1d(dt_shard(2, orders[o])),
                                          dt_layout_1d(dt_shard(0, orders[o])),
                                          dt_layout_1d(dt_partial()) };
                k[nk++] = (mm_kind){ "sequence", dt_layout_1d(dt_shard(1, orders[o])),
                                          dt_layout_1d(dt_replicate()),
                                          dt_layout_1d(dt_shard(1, orders[o])) };
            }
            k[nk++] = (mm_kind){ "replicated", dt_layout_1d(dt_replicate()),
                                      dt_layout_1d(dt_replicate()), dt_layout_1d(dt_replicate()) };
            k[nk++] = (mm_kind){ "partial_x", dt_layout_1d(dt_partial()),
                                      dt_layout_1d(dt_replicate()), dt_layout_1d(dt_partial()) };
            k[nk++] = (mm_kind){ "partial_w", dt_layout_1d(dt_replicate()),
                                      dt_layout_1d(dt_partial()), dt_layout_1d(dt_partial()) };
            for (int i = 0; i < nk; i++) {
                mm_case *c = NEW(mm_case);
                c->ndim_mesh = 1;
                c->mesh[0] = P;
                c->world = P;
                c->xl = k[i].xl;
                c->wl = k[i].wl;
                c->ol = k[i].ol;
                c->dtype = dtype;
                c->B = 2;
                c->S = 2 * P;
                c->K = 6 * P;
                c->N = 4 * P;
                const char *ord = "";
                if (k[i].xl.placements[0].kind == DT_SHARD)
                    ord = order_letter(k[i].xl.placements[0].order);
                else if (k[i].wl.placements[0].kind == DT_SHARD)
                    ord = order_letter(k[i].wl.placements[0].order);
                snprintf(name, sizeof name, "matmul/%s%s%s,P=%d,B=2,S=%lld,K=%lld,N=%lld,%s",
                         k[i].kind, *ord ? "," : "", ord, P, (long long)c->S, (long long)c->K,
                         (long long)c->N, dt_dtype_name(dtype));
                add_test(&tb, name, test_matmul, c);
            }
        }
    /* matmul on 2-D meshes (sequence x tensor parallel) */
    {
        const int m2[][2] = { { 2, 2 }, { 2, 3 }, { 3, 2 } };
        const mm_kind k[] = {
            { "seq+column",
              dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_replicate()),
              dt_layout_2d(dt_replicate(), dt_shard(1, DT_ORDER_STRIPED)),
              dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_shard(2, DT_ORDER_STRIPED)) },
            { "seq+row",
              dt_layout_2d(dt_shard(1, DT_ORDER_ZIGZAG), dt_shard(2, DT_ORDER_CONTIGUOUS)),
              dt_layout_2d(dt_replicate(), dt_shard(0, DT_ORDER_CONTIGUOUS)),
              dt_layout_2d(dt_shard(1, DT_ORDER_ZIGZAG), dt_partial()) },
            { "column+row",
              dt_layout_2d(dt_replicate(), dt_shard(2, DT_ORDER_STRIPED)),
              dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_shard(0, DT_ORDER_STRIPED)),
              dt_layout_2d(dt_shard(2, DT_ORDER_CONTIGUOUS), dt_partial()) },
            { "partial+column",
              dt_layout_2d(dt_partial(), dt_replicate()),
              dt_layout_2d(dt_replicate(), dt_shard(1, DT_ORDER_ZIGZAG)),
              dt_layout_2d(dt_partial(), dt_shard(2, DT_ORDER_ZIGZAG)) },
        };
        for (int mi = 0; mi < 3; mi++)
            for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
                for (int dt = 0; dt < 3; dt++) {
                    mm_case *c = NEW(mm_case);
                    c->ndim_mesh = 2;
                    c->mesh[0] = m2[mi][0];
                    c->mesh[1] = m2[mi][1];
                    c->world = m2[mi][0] * m2[mi][1];
                    c->xl = k[i].xl;
                    c->wl = k[i].wl;
                    c->ol = k[i].ol;
                    c->dtype = dtypes[dt];
                    c->B = 2;
                    c->S = 12;
                    c->K = 24;
                    c->N = 12;
                    snprintf(name, sizeof name, "matmul/%s,mesh=%dx%d,B=2,S=12,K=24,N=12,%s",
                             k[i].kind, m2[mi][0], m2[mi][1], dt_dtype_name(c->dtype));
                    add_test(&tb, name, test_matmul, c);
                }
    }
    add_test(&tb, "matmul/local,x=[7] and [2,1,3,7],w=[7,5]", test_matmul_local, NULL);

    /* add */
    for (int P = 1; P <= MAXW; P++) {
        const dt_layout ls[] = { dt_layout_1d(dt_replicate()), dt_layout_1d(dt_partial()),
                                 dt_layout_1d(dt_shard(2, DT_ORDER_ZIGZAG)),
                                 dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED)) };
        for (int i = 0; i < 4; i++)
            for (int dt = 0; dt < 3; dt++) {
                add_case *c = NEW(add_case);
                c->world = P;
                c->l = ls[i];
                c->dtype = dtypes[dt];
                char a[64];
                h_layout_short(&c->l, a, sizeof a);
                snprintf(name, sizeof name, "add/P=%d,%s,%s", P, a, dt_dtype_name(c->dtype));
                add_test(&tb, name, test_add, c);
            }
    }
    /* gelu */
    for (int P = 0; P <= MAXW; P += (P < 3 ? 1 : 5)) {
        for (int ap = 0; ap < 2; ap++)
            for (int dt = 0; dt < 3; dt++) {
                gelu_case *c = NEW(gelu_case);
                c->world = P;
                c->l = (P % 2) ? dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED))
                               : dt_layout_1d(dt_replicate());
                c->dtype = dtypes[dt];
                c->approx = ap ? DT_GELU_TANH : DT_GELU_ERF;
                char a[64];
                if (P > 0)
                    h_layout_short(&c->l, a, sizeof a);
                else
                    snprintf(a, sizeof a, "local");
                snprintf(name, sizeof name, "gelu/P=%d,%s,%s,%s", P, a,
                         dt_gelu_approx_name(c->approx), dt_dtype_name(c->dtype));
                add_test(&tb, name, test_gelu, c);
            }
    }
    for (int ap = 0; ap < 2; ap++)
        for (int dt = 0; dt < 3; dt++) {
            sweep_case *c = NEW(sweep_case);
            c->dtype = dtypes[dt];
            c->approx = ap ? DT_GELU_TANH : DT_GELU_ERF;
            snprintf(name, sizeof name, "gelu/sweep,x=[-12,12] and inf,nan,-0,%s,%s,%s",
                     dtypes[dt] == DT_F16 ? "-6e4" : "-1e30",
                     dt_gelu_approx_name(c->approx), dt_dtype_name(c->dtype));
            add_test(&tb, name, test_gelu_sweep, c);
        }
    add_test(&tb, "errors/P=2", test_errors, NULL);
#undef NEW
    int failed = h_run_cases("ops", tb.tests, tb.n);
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    free(tb.tests);
    free(tb.names);
    return failed;
}
