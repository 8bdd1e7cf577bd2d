/* tests/test_transformer.c — the ops of dtensor/ops_nn.h and a whole
 * transformer block built from them, against independent double-precision
 * references computed here from (seed, global index).
 *
 *   reshape/...   [B,S,H,D] <-> [B,S,E] and other splits and merges under
 *                 contiguous, striped, zigzag, Partial, Replicate and 2-D
 *                 Layouts: the new Layout is the documented one, and every
 *                 rank's local data is its part of the same global tensor
 *                 (the global linear index is what a reshape keeps).
 *   rmsnorm/...   P = 1..4 and 2x2, sequence/batch sharded in every order,
 *                 with and without weight, fp32, bf16 and fp16.
 *   rotary/...    P = 1..8, every order: the angle uses the token's GLOBAL
 *                 position (the reference takes positions from the
 *                 test-local index maps of harness.c, not from the library);
 *                 both styles, explicit positions (large ones too), heads
 *                 sharded on a 2-D mesh, Partial input (linear), [B,S,D].
 *   errors/...    every rejected argument and Layout, with the status, the
 *                 message, *out untouched and the input unchanged.
 *   block/...     RMSNorm, QKV column-parallel over heads (tp), rotary,
 *                 causal attention over sp (dt_attention_forward, GQA),
 *                 output projection row-parallel + all-reduce, residual,
 *                 RMSNorm + tensor-parallel MLP + residual, on the meshes
 *                 1x1, 1x4, 2x2, 4x1, 2x3 with every order, fp32, bf16 and fp16,
 *                 against the same block in double on one rank.
 *   example/...   examples/transformer_block run as a user would (skipped
 *                 when not built), on the CPU backend (DT_EXAMPLE_BACKEND
 *                 picks another).
 *   <op>/cuda/... the reshape, rmsnorm, rotary, errors and block cases again
 *                 on the CUDA backend over the local transport (ranks share
 *                 one GPU), against the same double references and
 *                 tolerances; each skips with the reason where cuda+local
 *                 cannot run (no GPU, or no CUDA build).
 *   backend/cuda-vs-cpu/...  the same inputs through both backends: reshape
 *                 bit-exact; rotary fp32 within 2e-7 + 2e-7|cpu| (cos and sin
 *                 are rounded from double on both sides, the rotation has no
 *                 FMA); rmsnorm fp32 1e-6 + 1e-6|cpu| (both sum squares in
 *                 double, in different orders); bf16 one bf16 ulp (2^-7 |cpu|).
 *
 * Tolerances |got - ref| <= atol + rtol*|ref|:
 *   reshape            exact (bytes move)
 *   rmsnorm fp32       1e-6 + 1e-5 |ref|     fp32 scaling of a double norm
 *   rmsnorm bf16, fp16 1e-6 + u |ref|        rounded once (u = 2^-8 bf16,
 *                                            2^-11 fp16: tests/ref.h)
 *   rotary fp32        1e-6 + 1e-6 |ref|     angles in double, rotation fp32
 *   rotary bf16, fp16  1e-6 + u |ref|        rounded once
 *   block fp32         1e-4 + 1e-4 |ref|     fp32 GEMMs and softmax
 *   block bf16         8e-2 + 4e-2 |ref|     every op rounds to bf16 (2^-9),
 *                                            the residual stream is bf16
 *   block fp16         1e-2 + 5e-3 |ref|     the same in fp16 (2^-12): the
 *                                            bf16 bounds over 8
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
#include <sys/wait.h>
#include <unistd.h>

#include "attention/attention.h"
#include "dtensor/dtensor.h"
#include "harness.h"
#include "ref.h"

#define MAXW H_MAX_RANKS
#define EPS 1e-5f

static const dt_order k_orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
static const dt_dtype k_dtypes[3] = {DT_F32, DT_BF16, DT_F16};

/* ------------------------------------------------------------------ data */

/* Compares this rank's part of a global double reference under t's Layout. */
static long compare_local(const char *what, const dt_tensor *t, const double *ref_full,
                          const int *mesh_sizes, int rank, double atol, double rtol,
                          double *max_err) {
    const dt_mesh *mesh = dt_tensor_mesh(t);
    int coords[3] = {0, 0, 0};
    if (mesh) h_coords(rank, dt_mesh_ndim(mesh), mesh_sizes, coords);
    int64_t n = dt_tensor_local_numel(t);
    double *lref = malloc((size_t)(h_numel(dt_tensor_ndim(t), dt_tensor_shape(t)) + 1) * sizeof *lref);
    float *got = h_local_floats(t);
    long bad = -1;
    if (lref && got) {
        h_local_of_f64(ref_full, dt_tensor_ndim(t), dt_tensor_shape(t),
                       mesh ? dt_tensor_layout(t) : NULL, mesh_sizes, coords, lref);
        bad = h_compare(what, got, lref, (size_t)n, atol, rtol, max_err);
    }
    free(lref);
    free(got);
    return bad;
}

static void layout_name(const dt_layout *l, char *buf, size_t size) {
    if (l->ndim == 0)
        snprintf(buf, size, "local");
    else
        h_layout_short(l, buf, size);
}

/* DT_BACKEND_AUTO (0, a zeroed case) means cpu. */
static dt_backend_kind backend_of(dt_backend_kind k) {
    return k == DT_BACKEND_AUTO ? DT_BACKEND_CPU : k;
}

/* Whether `world` ranks can run on (backend, local) here, asked once per
 * world size (a CUDA launch costs streams and cuBLAS handles); *why gets
 * the reason when not. */
static int backend_usable(dt_backend_kind backend, int world, const char **why) {
    static int known[DT_BACKEND_KIND_COUNT][MAXW + 1];
    static char reason[DT_BACKEND_KIND_COUNT][MAXW + 1][640];
    backend = backend_of(backend);
    if (world < 1 || world > MAXW) world = 1;
    if (!known[backend][world])
        known[backend][world] = h_pair_available(world, backend, DT_TRANSPORT_LOCAL,
                                                 reason[backend][world],
                                                 sizeof reason[backend][world]) ? 1 : -1;
    *why = reason[backend][world];
    return known[backend][world] > 0;
}

/* Skips the calling test (with the reason) when its pair cannot run here. */
#define REQUIRE_BACKEND(backend, world)                                       \
    do {                                                                      \
        const char *why_ = NULL;                                              \
        if (!backend_usable((backend), (world), &why_)) {                     \
            print_message("skipped: %s\n", why_);                             \
            skip();                                                           \
            return;                                                           \
        }                                                                     \
    } while (0)

/* h_launch on the case's backend (cpu or cuda) and the local transport. */
static dt_status launch_on(dt_backend_kind backend, int world, dt_rank_fn fn, void *arg) {
    return h_launch_on(world, backend_of(backend), DT_TRANSPORT_LOCAL, fn, arg);
}

/* "" or "cuda/": the name part that marks a CUDA case. */
static const char *backend_tag(dt_backend_kind backend) {
    return backend_of(backend) == DT_BACKEND_CUDA ? "cuda/" : "";
}

/* ------------------------------------------------------------------ reshape */

typedef struct reshape_case {
    int mesh_ndim, mesh[2], world;
    int in_ndim, out_ndim;
    int64_t in_shape[4], out_shape[4];
    dt_layout in_l, want_l; /* ndim 0: local tensors */
    dt_dtype dtype;
    dt_backend_kind backend;
    long bad[MAXW];
    int layout_ok[MAXW];
} reshape_case;

static dt_status rank_reshape(dt_context *ctx, void *arg) {
    reshape_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *t = NULL, *o = NULL;
    float *full = NULL, *want = NULL, *got = NULL;
    dt_status st;
    const int local = c->in_l.ndim == 0;
    if (!local) DT_TRY_GOTO(st, dt_mesh_create(ctx, c->mesh_ndim, c->mesh, NULL, &mesh), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, c->in_ndim, c->in_shape, local ? NULL : &c->in_l,
                                7, 0.0f, 1.0f, &t), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(t, c->out_ndim, c->out_shape, &o), out);
    c->layout_ok[r] = dt_layout_equal(dt_tensor_layout(o), &c->want_l) &&
                      dt_tensor_ndim(o) == c->out_ndim && dt_tensor_mesh(o) == mesh &&
                      dt_tensor_dtype(o) == c->dtype;
    for (int d = 0; d < c->out_ndim; d++) c->layout_ok[r] &= dt_tensor_shape(o)[d] == c->out_shape[d];
    /* The expected local part: the same global values under the new shape
     * and Layout (the reshape keeps each element's global linear index). */
    int64_t n = h_numel(c->out_ndim, c->out_shape);
    full = malloc((size_t)n * sizeof *full);
    want = malloc((size_t)n * sizeof *want);
    got = h_local_floats(o);
    if (!full || !want || !got) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < n; i++) full[i] = h_input_value(c->dtype, 7, i, 0.0f, 1.0f);
    int coords[3] = {0, 0, 0};
    int64_t ls[4];
    if (!local) h_coords(r, c->mesh_ndim, c->mesh, coords);
    h_local_of(full, c->out_ndim, c->out_shape, local ? NULL : &c->want_l, c->mesh, coords, want, ls);
    for (int d = 0; d < c->out_ndim; d++) c->layout_ok[r] &= dt_tensor_local_shape(o)[d] == ls[d];
    long bad = 0;
    for (int64_t i = 0; i < dt_tensor_local_numel(o); i++) bad += got[i] != want[i];
    c->bad[r] = bad;
out:
    free(full);
    free(want);
    free(got);
    dt_tensor_destroy(o);
    dt_tensor_destroy(t);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_reshape(void **state) {
    reshape_case *c = *state;
    REQUIRE_BACKEND(c->backend, c->world);
    dt_status st = launch_on(c->backend, c->world, rank_reshape, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->world; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
    }
}

/* ------------------------------------------------------------------ rmsnorm */

typedef struct norm_case {
    int mesh_ndim, mesh[2], world; /* world 0: local tensors on one rank */
    dt_layout l;
    int weighted;
    dt_dtype dtype;
    dt_backend_kind backend;
    int64_t shape[3];
    long bad[MAXW];
    int layout_ok[MAXW];
    double max_err[MAXW];
} norm_case;

static dt_status rank_norm(dt_context *ctx, void *arg) {
    norm_case *c = arg;
    int r = dt_context_rank(ctx);
    const int local = c->world == 0;
    const int64_t E = c->shape[2], M = c->shape[0] * c->shape[1];
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *w = NULL, *o = NULL;
    double *ref = NULL;
    dt_status st;
    const dt_layout rep = dt_layout_replicated(c->mesh_ndim);
    if (!local) DT_TRY_GOTO(st, dt_mesh_create(ctx, c->mesh_ndim, c->mesh, NULL, &mesh), out);
    /* x scaled by 3: RMSNorm is scale-invariant, the reference sees it. */
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, 3, c->shape, local ? NULL : &c->l, 11, 0.0f,
                                3.0f, &x), out);
    if (c->weighted)
        DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, 1, &E, local ? NULL : &rep, 12, 1.0f, 0.5f,
                                    &w), out);
    DT_TRY_GOTO(st, dt_rmsnorm(x, w, EPS, &o), out);
    c->layout_ok[r] = dt_layout_equal(dt_tensor_layout(o), dt_tensor_layout(x));
    ref = malloc((size_t)(M * E) * sizeof *ref);
    if (!ref) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (int64_t m = 0; m < M; m++) {
        double ss = 0;
        for (int64_t e = 0; e < E; e++) {
            double v = h_input_value(c->dtype, 11, m * E + e, 0.0f, 3.0f);
            ss += v * v;
        }
        double inv = 1.0 / sqrt(ss / (double)E + (double)EPS);
        for (int64_t e = 0; e < E; e++)
            ref[m * E + e] = h_input_value(c->dtype, 11, m * E + e, 0.0f, 3.0f) * inv *
                             (c->weighted ? h_input_value(c->dtype, 12, e, 1.0f, 0.5f) : 1.0);
    }
    c->bad[r] = compare_local("rmsnorm", o, ref, c->mesh, r, 1e-6,
                              c->dtype == DT_F32 ? 1e-5 : h_half_ulp(c->dtype), &c->max_err[r]);
out:
    free(ref);
    dt_tensor_destroy(o);
    dt_tensor_destroy(w);
    dt_tensor_destroy(x);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_norm(void **state) {
    norm_case *c = *state;
    int world = c->world ? c->world : 1;
    REQUIRE_BACKEND(c->backend, world);
    dt_status st = launch_on(c->backend, world, rank_norm, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < world; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
        assert_true(isfinite(c->max_err[r]));
    }
}

/* eps 0 at float's ends: a row of subnormals (1/rms above FLT_MAX) and a
 * row near FLT_MAX (1/rms subnormal) are normalised like any other, within
 * an ulp of x / rms in double; state: the backend. */
static dt_status rank_norm_extremes(dt_context *ctx, void *arg) {
    double *max_rel = arg;
    static const float xs[3][4] = {{1e-39f, -2e-39f, 3e-39f, 1e-39f},
                                   {3e38f, -2e38f, 1e38f, 3.4e38f},
                                   {1.0f, 2.0f, -3.0f, 4.0f}};
    const int64_t shape[2] = {3, 4};
    dt_tensor *x = NULL, *o = NULL;
    float got[12];
    dt_status st;
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 2, shape, NULL, &x), out);
    DT_TRY_GOTO(st, dt_tensor_set_local(x, xs, sizeof xs), out);
    DT_TRY_GOTO(st, dt_rmsnorm(x, NULL, 0.0f, &o), out);
    DT_TRY_GOTO(st, dt_tensor_get_local(o, got, sizeof got), out);
    *max_rel = 0;
    for (int r = 0; r < 3; r++) {
        double ss = 0;
        for (int e = 0; e < 4; e++) ss += (double)xs[r][e] * xs[r][e];
        for (int e = 0; e < 4; e++) {
            const double want = xs[r][e] / sqrt(ss / 4);
            const double rel = fabs(got[r * 4 + e] - want) / fabs(want);
            if (!(rel <= *max_rel)) *max_rel = isnan(rel) ? INFINITY : rel;
        }
    }
out:
    dt_tensor_destroy(o);
    dt_tensor_destroy(x);
    return st;
}

static void test_norm_extremes(void **state) {
    dt_backend_kind be = *(const dt_backend_kind *)*state;
    REQUIRE_BACKEND(be, 1);
    double max_rel = INFINITY;
    dt_status st = launch_on(be, 1, rank_norm_extremes, &max_rel);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    if (!(max_rel <= 0x1p-23)) print_error("max relative error %g\n", max_rel);
    assert_true(max_rel <= 0x1p-23);
}

/* ------------------------------------------------------------------ rotary */

typedef enum pos_kind { POS_INDEX = 0, POS_OFFSET, POS_LARGE } pos_kind;
static const char *const pos_names[] = {"index", "1000+3g", "large"};

typedef struct rot_case {
    int mesh_ndim, mesh[2], world; /* world 0: local */
    dt_layout l;
    int ndim;
    int64_t shape[4];
    dt_rotary_style style;
    pos_kind pos;
    float base;
    dt_dtype dtype;
    dt_backend_kind backend;
    long bad[MAXW];
    int layout_ok[MAXW];
    double max_err[MAXW];
} rot_case;

static int64_t position_of(pos_kind k, int64_t g) {
    switch (k) {
    case POS_OFFSET: return 1000 + 3 * g;
    case POS_LARGE: return 1000000 + (int64_t)(g * 7919 % 1000) * 997;
    default: return g;
    }
}

static int has_partial(const dt_layout *l) {
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_PARTIAL) return 1;
    return 0;
}

static dt_status rank_rotary(dt_context *ctx, void *arg) {
    rot_case *c = arg;
    int r = dt_context_rank(ctx);
    const int local = c->world == 0;
    const int nd = c->ndim;
    const int64_t S = c->shape[1], D = c->shape[nd - 1], n = h_numel(nd, c->shape);
    int64_t inner = 1;
    for (int d = 2; d < nd - 1; d++) inner *= c->shape[d];
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *o = NULL, *rep = NULL;
    double *ref = NULL;
    int64_t *pos = NULL;
    dt_status st;
    if (!local) DT_TRY_GOTO(st, dt_mesh_create(ctx, c->mesh_ndim, c->mesh, NULL, &mesh), out);
    /* Under Partial, every rank holds the whole input as its summand: the
     * true input is world * x, and so is the true output. */
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, nd, c->shape, local ? NULL : &c->l, 21, 0.0f,
                                1.0f, &x), out);
    pos = malloc((size_t)S * sizeof *pos);
    ref = malloc((size_t)n * sizeof *ref);
    if (!pos || !ref) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (int64_t g = 0; g < S; g++) pos[g] = position_of(c->pos, g);
    dt_rotary_options opts = DT_ROTARY_OPTIONS_INIT;
    opts.style = c->style;
    opts.base = c->base;
    if (c->pos != POS_INDEX) {
        opts.positions = pos;
        opts.n_positions = S;
    }
    DT_TRY_GOTO(st, dt_rotary(x, &opts, &o), out);
    c->layout_ok[r] = dt_layout_equal(dt_tensor_layout(o), dt_tensor_layout(x));

    /* Reference: token s of the GLOBAL tensor at position pos[s]. */
    const double base = c->base > 0 ? c->base : 10000.0;
    const double mult = (!local && has_partial(&c->l)) ? c->world : 1.0;
    for (int64_t b = 0; b < c->shape[0]; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < inner; h++) {
                const int64_t row = ((b * S + s) * inner + h) * D;
                for (int64_t i = 0; i < D / 2; i++) {
                    const int64_t ia = row + (c->style == DT_ROTARY_INTERLEAVED ? 2 * i : i);
                    const int64_t ib = row + (c->style == DT_ROTARY_INTERLEAVED ? 2 * i + 1 : i + D / 2);
                    const double ang = (double)pos[s] * pow(base, -2.0 * (double)i / (double)D);
                    const double va = mult * h_input_value(c->dtype, 21, ia, 0.0f, 1.0f);
                    const double vb = mult * h_input_value(c->dtype, 21, ib, 0.0f, 1.0f);
                    ref[ia] = va * cos(ang) - vb * sin(ang);
                    ref[ib] = va * sin(ang) + vb * cos(ang);
                }
            }
    const double atol = 1e-6 * mult, rtol = c->dtype == DT_F32 ? 1e-6 : h_half_ulp(c->dtype);
    if (!local && has_partial(&c->l)) {
        /* the summands must add up to the rotated sum */
        DT_TRY_GOTO(st, dt_tensor_replicate(o, &rep), out);
        c->bad[r] = compare_local("rotary (Partial, replicated)", rep, ref, c->mesh, r,
                                  atol * c->world, rtol + 2 * ldexp(1.0, -24) * c->world, &c->max_err[r]);
    } else {
        c->bad[r] = compare_local("rotary", o, ref, c->mesh, r, atol, rtol, &c->max_err[r]);
    }
out:
    free(pos);
    free(ref);
    dt_tensor_destroy(rep);
    dt_tensor_destroy(o);
    dt_tensor_destroy(x);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_rotary(void **state) {
    rot_case *c = *state;
    int world = c->world ? c->world : 1;
    REQUIRE_BACKEND(c->backend, world);
    dt_status st = launch_on(c->backend, world, rank_rotary, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < world; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
        assert_true(isfinite(c->max_err[r]));
    }
}

/* ------------------------------------------------------------------ errors */

#define MAX_ERR_CASES 48

typedef struct err_case {
    int n;
    dt_status st[MAX_ERR_CASES];
    char msg[MAX_ERR_CASES][512];
    int out_untouched, changed, partial_ok[2];   /* partial_ok: per rank */
    char names[3][32];
} err_case;

static dt_status rank_errors(dt_context *ctx, void *arg) {
    err_case *c = arg;
    int r = dt_context_rank(ctx);
    int P = 2;
    dt_mesh *mesh = NULL, *mesh_b = NULL;
    dt_tensor *q = NULL, *qs = NULL, *qd = NULL, *qp = NULL, *flat = NULL, *flatz = NULL;
    dt_tensor *odd = NULL, *x2 = NULL, *xe = NULL, *xp = NULL, *w = NULL, *ws = NULL, *wl = NULL;
    dt_tensor *wb = NULL, *wlong = NULL, *wother = NULL, *xh = NULL, *loc = NULL;
    float *before = NULL, *after = NULL;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh), out);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh_b), out);
    const int64_t s4[4] = {2, 8, 4, 8}, s3[3] = {2, 8, 48}, s4odd[4] = {2, 8, 4, 7};
    const int64_t s2[2] = {16, 8}, E = 48, E1 = 49;
    const dt_layout R = dt_layout_1d(dt_replicate());
    const dt_layout heads_c = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS));
    const dt_layout heads_s = dt_layout_1d(dt_shard(2, DT_ORDER_STRIPED));
    const dt_layout dshard = dt_layout_1d(dt_shard(3, DT_ORDER_CONTIGUOUS));
    const dt_layout hid_c = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS));
    const dt_layout hid_z = dt_layout_1d(dt_shard(2, DT_ORDER_ZIGZAG));
    const dt_layout Pa = dt_layout_1d(dt_partial());
    const dt_layout W0 = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 4, s4, &heads_c, 1, 0, 1, &q), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 4, s4, &heads_s, 1, 0, 1, &qs), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 4, s4, &dshard, 1, 0, 1, &qd), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 4, s4, &Pa, 1, 0, 1, &qp), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 3, s3, &hid_c, 1, 0, 1, &flat), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 3, s3, &hid_z, 1, 0, 1, &flatz), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 4, s4odd, &R, 1, 0, 1, &odd), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 2, s2, &R, 1, 0, 1, &x2), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 3, s3, &R, 1, 0, 1, &xe), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 3, s3, &Pa, 1, 0, 1, &xp), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 1, &E, &R, 2, 1, 0.5f, &w), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 1, &E, &W0, 2, 1, 0.5f, &ws), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, DT_F32, 1, &E, NULL, 2, 1, 0.5f, &wl), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_BF16, 1, &E, &R, 2, 1, 0.5f, &wb), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, DT_F32, 1, &E1, &R, 2, 1, 0.5f, &wlong), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh_b, DT_F32, 1, &E, &R, 2, 1, 0.5f, &wother), out);
    /* A dtype every op refuses: u8 (raw bytes), on every backend. */
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_U8, 3, s3, &R, &xh), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, DT_F32, 3, s3, NULL, 1, 0, 1, &loc), out);
    before = h_local_floats(flat);

    dt_tensor *sentinel = (dt_tensor *)(uintptr_t)0x1, *o = sentinel;
    const int64_t to_flat[3] = {2, 8, 32}, to_heads3[4] = {2, 8, 3, 16}, to_heads2[4] = {2, 8, 2, 24};
    const int64_t bad_numel[3] = {2, 8, 31}, zero_dim[3] = {2, 0, 48}, neg_dim[3] = {2, -8, -48};
    const int64_t big[2] = {INT64_MAX / 2, 4}, s2u8[2] = {16, 48};
    int64_t pos8[8] = {0, 1, 2, 3, 4, -5, 6, 7};
    dt_rotary_options ro = DT_ROTARY_OPTIONS_INIT;
    int k = 0;
    /* every rank makes the calls; rank 0 records (the results agree) */
#define REJ(expr)                                                               \
    do {                                                                        \
        dt_status s_ = (expr);                                                  \
        if (r == 0 && k < MAX_ERR_CASES) {                                      \
            c->st[k] = s_;                                                      \
            snprintf(c->msg[k], sizeof c->msg[k], "%s", dt_last_error());       \
        }                                                                       \
        k++;                                                                    \
    } while (0)
    /* reshape */
    REJ(dt_tensor_reshape(q, 3, bad_numel, &o));      /* 0: element count */
    REJ(dt_tensor_reshape(qs, 3, to_flat, &o));       /* 1: striped heads merged */
    REJ(dt_tensor_reshape(qd, 3, to_flat, &o));       /* 2: inner dim D sharded */
    REJ(dt_tensor_reshape(flat, 4, to_heads3, &o));   /* 3: 3 heads over 2 ranks */
    REJ(dt_tensor_reshape(flatz, 4, to_heads2, &o));  /* 4: zigzag needs 4 | heads */
    REJ(dt_tensor_reshape(q, 0, to_flat, &o));        /* 5: ndim 0 */
    REJ(dt_tensor_reshape(q, 9, to_flat, &o));        /* 6: ndim 9 */
    REJ(dt_tensor_reshape(q, 3, NULL, &o));           /* 7 */
    REJ(dt_tensor_reshape(NULL, 3, to_flat, &o));     /* 8 */
    REJ(dt_tensor_reshape(q, 3, to_flat, NULL));      /* 9 */
    REJ(dt_tensor_reshape(flat, 3, zero_dim, &o));    /* 10: empty dim */
    REJ(dt_tensor_reshape(flat, 3, neg_dim, &o));     /* 11: negative dims */
    REJ(dt_tensor_reshape(flat, 2, big, &o));         /* 12: overflowing product */
    /* rmsnorm */
    REJ(dt_rmsnorm(flat, NULL, EPS, &o));             /* 13: last dim sharded */
    REJ(dt_rmsnorm(xp, w, EPS, &o));                  /* 14: Partial */
    REJ(dt_rmsnorm(xe, ws, EPS, &o));                 /* 15: weight sharded */
    REJ(dt_rmsnorm(xe, wlong, EPS, &o));              /* 16: weight [49] */
    REJ(dt_rmsnorm(xe, wb, EPS, &o));                 /* 17: weight bf16 */
    REJ(dt_rmsnorm(xe, wl, EPS, &o));                 /* 18: weight local */
    REJ(dt_rmsnorm(xe, wother, EPS, &o));             /* 19: weight on another mesh */
    REJ(dt_rmsnorm(xe, w, -1.0f, &o));                /* 20: eps < 0 */
    REJ(dt_rmsnorm(xe, w, NAN, &o));                  /* 21: eps NaN */
    REJ(dt_rmsnorm(NULL, w, EPS, &o));                /* 22 */
    REJ(dt_rmsnorm(xe, w, EPS, NULL));                /* 23 */
    REJ(dt_rmsnorm(xh, NULL, EPS, &o));               /* 24: u8 */
    REJ(dt_rmsnorm(loc, w, EPS, &o));                 /* 25: local x, distributed weight */
    /* rotary */
    REJ(dt_rotary(odd, NULL, &o));                    /* 26: D odd */
    REJ(dt_rotary(qd, NULL, &o));                     /* 27: D sharded */
    REJ(dt_rotary(x2, NULL, &o));                     /* 28: ndim 2 */
    ro.positions = pos8;
    ro.n_positions = 7;
    REJ(dt_rotary(q, &ro, &o));                       /* 29: 7 positions for S = 8 */
    ro.n_positions = 8;
    REJ(dt_rotary(q, &ro, &o));                       /* 30: positions[5] = -5 */
    ro.positions = NULL;
    REJ(dt_rotary(q, &ro, &o));                       /* 31: n_positions without positions */
    ro.n_positions = 0;
    ro.base = -1.0f;
    REJ(dt_rotary(q, &ro, &o));                       /* 32: base < 0 */
    ro.base = INFINITY;
    REJ(dt_rotary(q, &ro, &o));                       /* 33: base inf */
    ro.base = 10000.0f;
    ro.style = (dt_rotary_style)7;
    REJ(dt_rotary(q, &ro, &o));                       /* 34: unknown style */
    ro.style = DT_ROTARY_HALF;
    REJ(dt_rotary(NULL, &ro, &o));                    /* 35 */
    REJ(dt_rotary(q, &ro, NULL));                     /* 36 */
    REJ(dt_rotary(xh, NULL, &o));                     /* 37: u8 */
    REJ(dt_tensor_reshape(xh, 2, s2u8, &o));          /* 38: u8 */
#undef REJ
    if (r == 0) c->n = k;
    /* ... while a Partial tensor reshapes fine (it stays Partial) */
    dt_tensor *po = NULL;
    dt_layout pl = dt_layout_1d(dt_partial());
    c->partial_ok[r] = dt_tensor_reshape(qp, 3, to_flat, &po) == DT_SUCCESS &&
                       dt_layout_equal(dt_tensor_layout(po), &pl);
    dt_tensor_destroy(po);
    after = h_local_floats(flat);
    if (r == 0) {
        c->out_untouched = o == sentinel;
        c->changed = (before && after)
                         ? memcmp(before, after, (size_t)dt_tensor_local_numel(flat) * sizeof(float)) != 0
                         : 1;
        snprintf(c->names[0], sizeof c->names[0], "%s", dt_rotary_style_name(DT_ROTARY_HALF));
        snprintf(c->names[1], sizeof c->names[1], "%s", dt_rotary_style_name(DT_ROTARY_INTERLEAVED));
        snprintf(c->names[2], sizeof c->names[2], "%s", dt_rotary_style_name((dt_rotary_style)9));
    }
out:
    free(before);
    free(after);
    dt_tensor *all[] = {q, qs, qd, qp, flat, flatz, odd, x2, xe, xp, w, ws, wl, wb, wlong, wother, xh, loc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    dt_mesh_destroy(mesh_b);
    return st;
}

/* state: NULL or a dt_backend_kind * (the backend must not change what is
 * rejected, nor how). */
static void test_errors(void **state) {
    const dt_backend_kind backend = *state ? *(const dt_backend_kind *)*state : DT_BACKEND_CPU;
    REQUIRE_BACKEND(backend, 2);
    err_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    dt_status st = launch_on(backend, 2, rank_errors, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    const dt_status I = DT_ERR_INVALID_ARGUMENT, N = DT_ERR_NOT_SUPPORTED;
    const dt_status expect[] = {
        I, N, N, N, N, I, I, I, I, I, I, I, I,          /* reshape 0..12 */
        N, N, N, I, I, I, I, I, I, I, I, N, I,          /* rmsnorm 13..25 */
        I, N, I, I, I, I, I, I, I, I, I, N,             /* rotary 26..37 */
        N,                                              /* reshape of u8, 38 */
    };
    const int n_expect = (int)(sizeof expect / sizeof expect[0]);
    assert_int_equal(c->n, n_expect);
    for (int k = 0; k < c->n; k++) {
        if (c->st[k] != expect[k])
            fprintf(stderr, "  case %d: %s (%s)\n", k, dt_status_name(c->st[k]), c->msg[k]);
        assert_int_equal(c->st[k], expect[k]);
    }
    /* messages name the values and a redistribution that works */
    const struct { int k; const char *text; } msgs[] = {
        {0, "512 elements but the new shape [2, 8, 31] has 496"},
        {1, "striped"},
        {1, "redistribute t to Replicate on mesh dim 0"},
        {2, "inner dim"},
        {3, "not divisible"},
        {4, "zigzag"},
        {10, "dim 1 has length 0"},
        {12, "more elements"},
        {13, "redistribute x to [Replicate]"},
        {13, "length 48"},
        {14, "Partial"},
        {15, "redistribute it to [Replicate]"},
        {16, "[48]"},
        {17, "bf16"},
        {20, "eps -1"},
        {24, "dtype u8"},
        {26, "D = 7 must be even"},
        {27, "redistribute x to [Replicate]"},
        {28, "ndim >= 3"},
        {29, "7 positions given for a sequence of S = 8"},
        {30, "positions[5] = -5 is negative"},
        {31, "n_positions is 8 but positions is NULL"},
        {32, "base -1"},
        {34, "unknown style 7"},
        {38, "dtype u8"},
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        if (!strstr(c->msg[msgs[i].k], msgs[i].text))
            fprintf(stderr, "  case %d: '%s' lacks '%s'\n", msgs[i].k, c->msg[msgs[i].k],
                    msgs[i].text);
        assert_non_null(strstr(c->msg[msgs[i].k], msgs[i].text));
    }
    assert_true(c->out_untouched);
    assert_int_equal(c->changed, 0);
    assert_true(c->partial_ok[0] && c->partial_ok[1]);
    assert_string_equal(c->names[0], "half");
    assert_string_equal(c->names[1], "interleaved");
    assert_string_equal(c->names[2], "unknown");
    free(c);
}

/* ------------------------------------------------------------------ block */

typedef struct block_case {
    int tp, sp;
    dt_order order;
    dt_dtype dtype;
    dt_backend_kind backend;
    int64_t B, S, E, H, G;
    uint64_t seed;
    double *ref;  /* [B, S, E], made by the main thread */
    long bad[MAXW];
    int layout_ok[MAXW];
    double max_err[MAXW];
} block_case;

enum { S_X, S_G1, S_WQ, S_WK, S_WV, S_WO, S_G2, S_W1, S_W2 };

/* A [rows, cols] weight made whole on rank 0 and scattered under l. */
static dt_status make_weight(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int64_t rows,
                             int64_t cols, uint64_t seed, const dt_layout *l, dt_tensor **out) {
    dt_tensor *full = NULL;
    dt_status st = DT_SUCCESS;
    const int64_t shape[2] = {rows, cols};
    if (dt_context_rank(ctx) == 0)
        st = h_make_tensor(ctx, NULL, dtype, 2, shape, NULL, seed, 0.0f, h_weight_scale(rows), &full);
    if (st == DT_SUCCESS) st = dt_tensor_shard(mesh, 0, full, l, out);
    dt_tensor_destroy(full);
    return st;
}

static dt_status rank_block(dt_context *ctx, void *arg) {
    block_case *c = arg;
    const int r = dt_context_rank(ctx);
    const int64_t B = c->B, S = c->S, E = c->E, H = c->H, G = c->G, D = E / H, F = 4 * E;
    const uint64_t s = c->seed;
    const int sizes[2] = {c->tp, c->sp};
    const dt_layout xl = dt_layout_2d(dt_replicate(), dt_shard(1, c->order));
    const dt_layout rep = dt_layout_replicated(2);
    const dt_layout col = dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_replicate());
    const dt_layout row = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate());
    const dt_layout heads = dt_layout_2d(dt_shard(2, DT_ORDER_CONTIGUOUS), dt_shard(1, c->order));
    const dt_layout part = dt_layout_2d(dt_partial(), dt_shard(1, c->order));
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *g1 = NULL, *g2 = NULL, *wq = NULL, *wk = NULL, *wv = NULL, *wo = NULL;
    dt_tensor *w1 = NULL, *w2 = NULL, *h = NULL, *q2 = NULL, *k2 = NULL, *v2 = NULL, *q = NULL;
    dt_tensor *k = NULL, *v = NULL, *qr = NULL, *kr = NULL, *a = NULL, *a2 = NULL, *op = NULL;
    dt_tensor *o = NULL, *x1 = NULL, *h2 = NULL, *u = NULL, *gl = NULL, *yp = NULL, *y = NULL;
    dt_tensor *out = NULL;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 2, sizes, NULL, &mesh), out);
    const int64_t xs[3] = {B, S, E};
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, 3, xs, &xl, s + S_X, 0, 1, &x), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, 1, &E, &rep, s + S_G1, 1, 0.5f, &g1), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, 1, &E, &rep, s + S_G2, 1, 0.5f, &g2), out);
    DT_TRY_GOTO(st, make_weight(ctx, mesh, c->dtype, E, H * D, s + S_WQ, &col, &wq), out);
    DT_TRY_GOTO(st, make_weight(ctx, mesh, c->dtype, E, G * D, s + S_WK, &col, &wk), out);
    DT_TRY_GOTO(st, make_weight(ctx, mesh, c->dtype, E, G * D, s + S_WV, &col, &wv), out);
    DT_TRY_GOTO(st, make_weight(ctx, mesh, c->dtype, H * D, E, s + S_WO, &row, &wo), out);
    DT_TRY_GOTO(st, make_weight(ctx, mesh, c->dtype, E, F, s + S_W1, &col, &w1), out);
    DT_TRY_GOTO(st, make_weight(ctx, mesh, c->dtype, F, E, s + S_W2, &row, &w2), out);

    const int64_t qsh[4] = {B, S, H, D}, ksh[4] = {B, S, G, D}, fsh[3] = {B, S, H * D};
    DT_TRY_GOTO(st, dt_rmsnorm(x, g1, EPS, &h), out);
    DT_TRY_GOTO(st, dt_matmul(h, wq, &q2), out);
    DT_TRY_GOTO(st, dt_matmul(h, wk, &k2), out);
    DT_TRY_GOTO(st, dt_matmul(h, wv, &v2), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(q2, 4, qsh, &q), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(k2, 4, ksh, &k), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(v2, 4, ksh, &v), out);
    DT_TRY_GOTO(st, dt_rotary(q, NULL, &qr), out);
    DT_TRY_GOTO(st, dt_rotary(k, NULL, &kr), out);
    DT_TRY_GOTO(st, dt_attention_forward(qr, kr, v, NULL, &a, NULL), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(a, 3, fsh, &a2), out);
    DT_TRY_GOTO(st, dt_matmul(a2, wo, &op), out);
    DT_TRY_GOTO(st, dt_tensor_redistribute(op, &xl, &o), out);
    DT_TRY_GOTO(st, dt_add(x, o, &x1), out);
    DT_TRY_GOTO(st, dt_rmsnorm(x1, g2, EPS, &h2), out);
    DT_TRY_GOTO(st, dt_matmul(h2, w1, &u), out);
    DT_TRY_GOTO(st, dt_gelu(u, DT_GELU_ERF, &gl), out);
    DT_TRY_GOTO(st, dt_matmul(gl, w2, &yp), out);
    DT_TRY_GOTO(st, dt_tensor_redistribute(yp, &xl, &y), out);
    DT_TRY_GOTO(st, dt_add(x1, y, &out), out);

    c->layout_ok[r] = dt_layout_equal(dt_tensor_layout(q2), &heads) &&
                      dt_layout_equal(dt_tensor_layout(q), &heads) &&
                      dt_layout_equal(dt_tensor_layout(a), &heads) &&
                      dt_layout_equal(dt_tensor_layout(a2), &heads) &&
                      dt_layout_equal(dt_tensor_layout(op), &part) &&
                      dt_layout_equal(dt_tensor_layout(yp), &part) &&
                      dt_layout_equal(dt_tensor_layout(u), &heads) &&
                      dt_layout_equal(dt_tensor_layout(out), &xl) &&
                      dt_tensor_local_shape(q)[2] == H / c->tp &&
                      dt_tensor_local_shape(out)[1] == S / c->sp;
    const double atol = c->dtype == DT_F32 ? 1e-4 : c->dtype == DT_F16 ? 1e-2 : 8e-2;
    const double rtol = c->dtype == DT_F32 ? 1e-4 : c->dtype == DT_F16 ? 5e-3 : 4e-2;
    c->bad[r] = compare_local("block", out, c->ref, sizes, r, atol, rtol, &c->max_err[r]);
out:;
    dt_tensor *all[] = {x, g1, g2, wq, wk, wv, wo, w1, w2, h, q2, k2, v2, q, k, v, qr, kr, a,
                        a2, op, o, x1, h2, u, gl, yp, y, out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    return st;
}

/* y[M, N] = x[M, K] @ w[K, N] */
static void ref_matmul(const double *x, const double *w, int64_t M, int64_t K, int64_t N, double *y) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t kk = 0; kk < K; kk++) acc += x[m * K + kk] * w[kk * N + n];
            y[m * N + n] = acc;
        }
}

static void ref_rmsnorm(const double *x, const double *g, int64_t M, int64_t E, double *y) {
    for (int64_t m = 0; m < M; m++) {
        double ss = 0;
        for (int64_t e = 0; e < E; e++) ss += x[m * E + e] * x[m * E + e];
        double inv = 1.0 / sqrt(ss / (double)E + (double)EPS);
        for (int64_t e = 0; e < E; e++) y[m * E + e] = x[m * E + e] * inv * g[e];
    }
}

static void ref_rotary(double *t, int64_t B, int64_t S, int64_t NH, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < NH; h++) {
                double *v = t + ((b * S + s) * NH + h) * D;
                for (int64_t i = 0; i < D / 2; i++) {
                    double ang = (double)s * pow(10000.0, -2.0 * (double)i / (double)D);
                    double a = v[i], bb = v[i + D / 2];
                    v[i] = a * cos(ang) - bb * sin(ang);
                    v[i + D / 2] = a * sin(ang) + bb * cos(ang);
                }
            }
}

static void fill(double *out, int64_t n, dt_dtype dtype, uint64_t seed, float offset, float scale) {
    for (int64_t i = 0; i < n; i++) out[i] = h_input_value(dtype, seed, i, offset, scale);
}

static double *block_reference(const block_case *c) {
    const int64_t B = c->B, S = c->S, E = c->E, H = c->H, G = c->G, D = E / H, F = 4 * E, M = B * S;
    const uint64_t s = c->seed;
    size_t sz = (size_t)(M * E + 2 * E + E * H * D * 2 + 2 * E * G * D + 2 * E * F + M * E +
                         M * H * D * 2 + 2 * M * G * D + M * F + M * E + S);
    double *mem = malloc(sz * sizeof *mem);
    double *res = malloc((size_t)(M * E) * sizeof *res);
    if (!mem || !res) {
        free(mem);
        free(res);
        return NULL;
    }
    double *x = mem, *g1 = x + M * E, *g2 = g1 + E, *wq = g2 + E, *wo = wq + E * H * D;
    double *wk = wo + H * D * E, *wv = wk + E * G * D, *w1 = wv + E * G * D, *w2 = w1 + E * F;
    double *h = w2 + F * E, *q = h + M * E, *a = q + M * H * D, *k = a + M * H * D;
    double *v = k + M * G * D, *t = v + M * G * D, *y = t + M * F, *sc = y + M * E;
    fill(x, M * E, c->dtype, s + S_X, 0, 1);
    fill(g1, E, c->dtype, s + S_G1, 1, 0.5f);
    fill(g2, E, c->dtype, s + S_G2, 1, 0.5f);
    fill(wq, E * H * D, c->dtype, s + S_WQ, 0, h_weight_scale(E));
    fill(wk, E * G * D, c->dtype, s + S_WK, 0, h_weight_scale(E));
    fill(wv, E * G * D, c->dtype, s + S_WV, 0, h_weight_scale(E));
    fill(wo, H * D * E, c->dtype, s + S_WO, 0, h_weight_scale(H * D));
    fill(w1, E * F, c->dtype, s + S_W1, 0, h_weight_scale(E));
    fill(w2, F * E, c->dtype, s + S_W2, 0, h_weight_scale(F));

    ref_rmsnorm(x, g1, M, E, h);
    ref_matmul(h, wq, M, E, H * D, q);
    ref_matmul(h, wk, M, E, G * D, k);
    ref_matmul(h, wv, M, E, G * D, v);
    ref_rotary(q, B, S, H, D);
    ref_rotary(k, B, S, G, D);
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < H; hh++)
            for (int64_t i = 0; i < S; i++) {
                const int64_t gg = hh / (H / G);
                const double *qi = q + ((b * S + i) * H + hh) * D;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *kj = k + ((b * S + j) * G + gg) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                    sc[j] = scale * dot;
                    if (sc[j] > mx) mx = sc[j];
                }
                double *ai = a + ((b * S + i) * H + hh) * D;
                for (int64_t d = 0; d < D; d++) ai[d] = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double p = exp(sc[j] - mx);
                    const double *vj = v + ((b * S + j) * G + gg) * D;
                    sum += p;
                    for (int64_t d = 0; d < D; d++) ai[d] += p * vj[d];
                }
                for (int64_t d = 0; d < D; d++) ai[d] /= sum;
            }
    ref_matmul(a, wo, M, H * D, E, y);
    for (int64_t i = 0; i < M * E; i++) x[i] += y[i];
    ref_rmsnorm(x, g2, M, E, h);
    ref_matmul(h, w1, M, E, F, t);
    for (int64_t i = 0; i < M * F; i++) t[i] = 0.5 * t[i] * (1.0 + erf(t[i] / sqrt(2.0)));
    ref_matmul(t, w2, M, F, E, y);
    for (int64_t i = 0; i < M * E; i++) res[i] = x[i] + y[i];
    free(mem);
    return res;
}

static void test_block(void **state) {
    block_case *c = *state;
    REQUIRE_BACKEND(c->backend, c->tp * c->sp);
    c->ref = block_reference(c);
    assert_non_null(c->ref);
    dt_status st = launch_on(c->backend, c->tp * c->sp, rank_block, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    free(c->ref);
    c->ref = NULL;
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->tp * c->sp; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
        assert_true(isfinite(c->max_err[r]));
    }
}

/* ------------------------------------------------------------------ backend */

/* The same inputs through one backend (one rank, local tensors); the main
 * thread compares the CPU and CUDA results. */
enum { XB_RESHAPE, XB_NORM_F32, XB_NORM_BF16, XB_ROT_HALF, XB_ROT_INTER, XB_ROT_BF16, XB_COUNT };
static const char *const xb_names[XB_COUNT] = {
    "reshape [2,6,3,16]->[2,6,48] fp32", "rmsnorm [2,6,48] weight fp32",
    "rmsnorm [2,6,48] no weight bf16", "rotary half pos=large fp32",
    "rotary interleaved pos=1000+3g base=500 fp32", "rotary half bf16",
};

typedef struct xb_result {
    float *out[XB_COUNT];
    int64_t n[XB_COUNT];
} xb_result;

static dt_status rank_xb(dt_context *ctx, void *arg) {
    xb_result *res = arg;
    const int64_t s4[4] = {2, 6, 3, 16}, s3[3] = {2, 6, 48}, E = 48;
    int64_t pos[6];
    dt_tensor *x = NULL, *xb = NULL, *w = NULL, *x3 = NULL, *x3b = NULL;
    dt_tensor *o[XB_COUNT] = {NULL};
    dt_status st;
    for (int64_t g = 0; g < 6; g++) pos[g] = position_of(POS_LARGE, g);
    DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, DT_F32, 4, s4, NULL, 3, 0, 1, &x), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, DT_BF16, 4, s4, NULL, 4, 0, 1, &xb), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, DT_F32, 3, s3, NULL, 5, 0, 3, &x3), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, DT_BF16, 3, s3, NULL, 6, 0, 3, &x3b), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, DT_F32, 1, &E, NULL, 7, 1, 0.5f, &w), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(x, 3, s3, &o[XB_RESHAPE]), out);
    DT_TRY_GOTO(st, dt_rmsnorm(x3, w, EPS, &o[XB_NORM_F32]), out);
    DT_TRY_GOTO(st, dt_rmsnorm(x3b, NULL, EPS, &o[XB_NORM_BF16]), out);
    dt_rotary_options ro = DT_ROTARY_OPTIONS_INIT;
    ro.positions = pos;
    ro.n_positions = 6;
    DT_TRY_GOTO(st, dt_rotary(x, &ro, &o[XB_ROT_HALF]), out);
    for (int64_t g = 0; g < 6; g++) pos[g] = position_of(POS_OFFSET, g);
    ro.style = DT_ROTARY_INTERLEAVED;
    ro.base = 500.0f;
    DT_TRY_GOTO(st, dt_rotary(x, &ro, &o[XB_ROT_INTER]), out);
    DT_TRY_GOTO(st, dt_rotary(xb, NULL, &o[XB_ROT_BF16]), out);
    for (int k = 0; k < XB_COUNT; k++) {
        res->n[k] = dt_tensor_local_numel(o[k]);
        res->out[k] = h_local_floats(o[k]);
        if (!res->out[k]) {
            st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
            goto out;
        }
    }
out:
    for (int k = 0; k < XB_COUNT; k++) dt_tensor_destroy(o[k]);
    dt_tensor_destroy(w);
    dt_tensor_destroy(x3b);
    dt_tensor_destroy(x3);
    dt_tensor_destroy(xb);
    dt_tensor_destroy(x);
    return st;
}

static void xb_free(xb_result *r) {
    for (int k = 0; k < XB_COUNT; k++) free(r->out[k]);
}

static void test_cuda_vs_cpu(void **state) {
    (void)state;
    REQUIRE_BACKEND(DT_BACKEND_CUDA, 1);
    xb_result cpu, gpu;
    memset(&cpu, 0, sizeof cpu);
    memset(&gpu, 0, sizeof gpu);
    dt_status st = launch_on(DT_BACKEND_CPU, 1, rank_xb, &cpu);
    if (st != DT_SUCCESS) print_error("cpu: %s\n", dt_last_error());
    dt_status sg = launch_on(DT_BACKEND_CUDA, 1, rank_xb, &gpu);
    if (sg != DT_SUCCESS) print_error("cuda: %s\n", dt_last_error());
    long bad = 0;
    if (st == DT_SUCCESS && sg == DT_SUCCESS) {
        for (int k = 0; k < XB_COUNT; k++) {
            const int bf16 = k == XB_NORM_BF16 || k == XB_ROT_BF16;
            const int norm = k == XB_NORM_F32 || k == XB_NORM_BF16;
            const double atol = k == XB_RESHAPE ? 0 : norm ? 1e-6 : 2e-7;
            const double rtol = k == XB_RESHAPE ? 0 : bf16 ? ldexp(1.0, -7) : norm ? 1e-6 : 2e-7;
            double *ref = malloc((size_t)cpu.n[k] * sizeof *ref);
            assert_non_null(ref);
            long same = 0;
            for (int64_t i = 0; i < cpu.n[k]; i++) {
                ref[i] = cpu.out[k][i];
                same += memcmp(&cpu.out[k][i], &gpu.out[k][i], sizeof(float)) == 0;
            }
            assert_int_equal(gpu.n[k], cpu.n[k]);
            double maxe = 0;
            bad += h_compare(xb_names[k], gpu.out[k], ref, (size_t)cpu.n[k], atol, rtol, &maxe);
            print_message("  %-46s %ld of %lld bit-identical, max |cuda - cpu| %.3g\n",
                          xb_names[k], same, (long long)cpu.n[k], maxe);
            free(ref);
        }
    }
    xb_free(&cpu);
    xb_free(&gpu);
    assert_int_equal(st, DT_SUCCESS);
    assert_int_equal(sg, DT_SUCCESS);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------------------------------ example */

static char g_example[4096] = "build/examples/transformer_block";

typedef struct example_case {
    const char *args;
    int want_status;
    const char *want_text;
} example_case;


static void test_example(void **state) {
    const example_case *c = *state;
    if (access(g_example, X_OK) != 0) {
        print_message("skipped: %s is not built (run `make` first)\n", g_example);
        skip();
    }
    char *out = NULL;
    int status = h_run_program(g_example, c->args, &out);
    assert_non_null(out);
    int ok = status == c->want_status && strstr(out, c->want_text) != NULL;
    if (!ok)
        print_error("transformer_block %s: exit %d (want %d), output lacks '%s'?\n%s\n", c->args,
                    status, c->want_status, c->want_text, out);
    free(out);
    assert_int_equal(status, c->want_status);
    assert_true(ok);
}

/* ------------------------------------------------------------------ table */

#define MAX_TESTS 1024

typedef struct table {
    struct CMUnitTest tests[MAX_TESTS];
    char names[MAX_TESTS][200];
    void *owned[MAX_TESTS];
    size_t n, n_owned;
} table;

static void add(table *t, const char *name, CMUnitTestFunction fn, void *state, int owned) {
    if (t->n >= MAX_TESTS) return;
    snprintf(t->names[t->n], sizeof t->names[t->n], "%s", name);
    t->tests[t->n] = (struct CMUnitTest){t->names[t->n], fn, NULL, NULL, state};
    t->n++;
    if (owned) t->owned[t->n_owned++] = state;
}

static void add_reshape(table *tb, dt_backend_kind backend, int mesh_ndim, int m0, int m1,
                        int in_ndim, const int64_t *in, int out_ndim, const int64_t *outs,
                        dt_layout in_l, dt_layout want_l, dt_dtype dtype) {
    reshape_case *c = calloc(1, sizeof *c);
    if (!c) return;
    c->backend = backend;
    c->mesh_ndim = mesh_ndim;
    c->mesh[0] = m0;
    c->mesh[1] = m1;
    c->world = in_l.ndim == 0 ? 1 : (mesh_ndim == 2 ? m0 * m1 : m0);
    c->in_ndim = in_ndim;
    c->out_ndim = out_ndim;
    memcpy(c->in_shape, in, (size_t)in_ndim * sizeof *in);
    memcpy(c->out_shape, outs, (size_t)out_ndim * sizeof *outs);
    c->in_l = in_l;
    c->want_l = want_l;
    c->dtype = dtype;
    char a[64], b[64], sa[64] = "", sb[64] = "", name[200];
    layout_name(&in_l, a, sizeof a);
    layout_name(&want_l, b, sizeof b);
    for (int d = 0; d < in_ndim; d++)
        snprintf(sa + strlen(sa), sizeof sa - strlen(sa), "%s%lld", d ? "x" : "", (long long)in[d]);
    for (int d = 0; d < out_ndim; d++)
        snprintf(sb + strlen(sb), sizeof sb - strlen(sb), "%s%lld", d ? "x" : "", (long long)outs[d]);
    if (mesh_ndim == 2)
        snprintf(name, sizeof name, "reshape/%smesh=%dx%d,%s[%s]->%s[%s],%s",
                 backend_tag(backend), m0, m1, sa, a, sb, b, dt_dtype_name(dtype));
    else
        snprintf(name, sizeof name, "reshape/%sP=%d,%s[%s]->%s[%s],%s", backend_tag(backend),
                 c->world, sa, a, sb, b, dt_dtype_name(dtype));
    add(tb, name, test_reshape, c, 1);
}

/* The reshape, rmsnorm, rotary, errors and block cases on one backend. */
static int add_op_cases(table *tb, dt_backend_kind be) {
    static const dt_backend_kind cuda_kind = DT_BACKEND_CUDA;
    const char *tag = backend_tag(be);
    char name[200], ln[64];

    /* reshape */
    {
        const int64_t bshd[4] = {2, 12, 12, 4}, bse[3] = {2, 12, 48}, bs1e[4] = {2, 12, 1, 48};
        const int64_t bse3[3] = {4, 6, 8}, me[2] = {24, 8};
        for (int P = 1; P <= 4; P++) {
            for (int o = 0; o < 3; o += 2) {
                if (k_orders[o] == DT_ORDER_ZIGZAG && 12 % (2 * P)) continue;
                dt_layout l = dt_layout_1d(dt_shard(2, k_orders[o]));
                add_reshape(tb, be, 1, P, 1, 4, bshd, 3, bse, l, l, DT_F32);  /* merge heads */
                add_reshape(tb, be, 1, P, 1, 3, bse, 4, bshd, l, l, DT_BF16); /* split E */
            }
            dt_layout s1 = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
            add_reshape(tb, be, 1, P, 1, 4, bshd, 3, bse, s1, s1, DT_F32);    /* tokens: any order */
            /* a new dim of length 1: the shard stays on the group's outer dim
             * when it can (P = 1: the head dim of MQA's single kv head),
             * else moves past it */
            add_reshape(tb, be, 1, P, 1, 3, bse, 4, bs1e, dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS)),
                        dt_layout_1d(dt_shard(P == 1 ? 2 : 3, DT_ORDER_CONTIGUOUS)), DT_F32);
            /* an old dim of length 1 before the sharded one */
            add_reshape(tb, be, 1, P, 1, 4, bs1e, 3, bse, dt_layout_1d(dt_shard(3, DT_ORDER_ZIGZAG)),
                        dt_layout_1d(dt_shard(2, DT_ORDER_ZIGZAG)), DT_BF16);
            add_reshape(tb, be, 1, P, 1, 4, bs1e, 3, bse, dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED)),
                        dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED)), DT_F32);
        }
        for (int P = 1; P <= 4; P *= 2) /* merge [B, S] */
            add_reshape(tb, be, 1, P, 1, 3, bse3, 2, me, dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)),
                        dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)), DT_F32);
        add_reshape(tb, be, 1, 3, 1, 4, bshd, 3, bse, dt_layout_1d(dt_partial()),
                    dt_layout_1d(dt_partial()), DT_F32);
        add_reshape(tb, be, 1, 3, 1, 4, bshd, 3, bse, dt_layout_1d(dt_replicate()),
                    dt_layout_1d(dt_replicate()), DT_BF16);
        /* striped heads on a mesh dim of size 1: the same data as Replicate */
        add_reshape(tb, be, 1, 1, 1, 4, bshd, 3, bse, dt_layout_1d(dt_shard(2, DT_ORDER_STRIPED)),
                    dt_layout_1d(dt_replicate()), DT_F32);
        /* zigzag on one rank, its new dim odd (not two chunks): Replicate */
        {
            const int64_t b3[2] = {3, 4}, b4[2] = {4, 3};
            add_reshape(tb, be, 1, 1, 1, 2, b4, 2, b3, dt_layout_1d(dt_shard(0, DT_ORDER_ZIGZAG)),
                        dt_layout_1d(dt_replicate()), DT_F32);
        }
        for (int o = 0; o < 3; o++) {
            dt_layout l = dt_layout_2d(dt_shard(2, DT_ORDER_CONTIGUOUS), dt_shard(1, k_orders[o]));
            add_reshape(tb, be, 2, 2, 3, 4, bshd, 3, bse, l, l, DT_F32);
            add_reshape(tb, be, 2, 3, 2, 3, bse, 4, bshd, l, l, DT_F32);
        }
        add_reshape(tb, be, 1, 1, 1, 4, bshd, 3, bse, dt_layout_replicated(0), dt_layout_replicated(0),
                    DT_F32);
    }

    /* rmsnorm */
    for (int P = 1; P <= 4; P++)
        for (int li = 0; li < 4; li++)
            for (int dt = 0; dt < 3; dt++) {
                dt_layout l;
                if (li == 0) l = dt_layout_1d(dt_replicate());
                else if (li == 1) l = dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
                else if (li == 2) l = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
                else if (P != 3) l = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
                else continue;
                norm_case *c = calloc(1, sizeof *c);
                if (!c) return 1;
                c->mesh_ndim = 1;
                c->mesh[0] = P;
                c->world = P;
                c->l = l;
                c->weighted = (li + dt) % 2 == 0;
                c->dtype = k_dtypes[dt];
                c->backend = be;
                c->shape[0] = 4, c->shape[1] = 24, c->shape[2] = 20;
                h_layout_short(&l, ln, sizeof ln);
                snprintf(name, sizeof name, "rmsnorm/%sP=%d,x=[4,24,20],%s,%s,%s", tag, P, ln,
                         c->weighted ? "weight" : "no weight", dt_dtype_name(c->dtype));
                add(tb, name, test_norm, c, 1);
            }
    for (int i = 0; i < 2; i++) {
        norm_case *c = calloc(1, sizeof *c);
        if (!c) return 1;
        if (i == 0) {
            c->mesh_ndim = 2, c->mesh[0] = 2, c->mesh[1] = 2, c->world = 4;
            c->l = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_STRIPED));
            h_layout_short(&c->l, ln, sizeof ln);
            snprintf(name, sizeof name, "rmsnorm/%smesh=2x2,x=[4,24,20],%s,weight,fp32", tag, ln);
        } else {
            c->world = 0;
            snprintf(name, sizeof name, "rmsnorm/%slocal,x=[4,24,20],weight,fp32", tag);
        }
        c->backend = be;
        c->weighted = 1;
        c->dtype = DT_F32;
        c->shape[0] = 4, c->shape[1] = 24, c->shape[2] = 20;
        add(tb, name, test_norm, c, 1);
    }
    {
        static const dt_backend_kind kinds[] = {DT_BACKEND_CPU, DT_BACKEND_CUDA};
        snprintf(name, sizeof name, "rmsnorm/%seps=0,rows of subnormals and near FLT_MAX,fp32", tag);
        add(tb, name, test_norm_extremes, (void *)&kinds[be == DT_BACKEND_CUDA], 0);
    }

    /* rotary */
    for (int P = 1; P <= MAXW; P++)
        for (int o = 0; o < 3; o++)
            for (int sty = 0; sty < 2; sty++) {
                rot_case *c = calloc(1, sizeof *c);
                if (!c) return 1;
                c->mesh_ndim = 1;
                c->mesh[0] = P;
                c->world = P;
                c->l = dt_layout_1d(dt_shard(1, k_orders[o]));
                c->ndim = 4;
                c->shape[0] = 2, c->shape[1] = 2 * P * 3, c->shape[2] = 3, c->shape[3] = 8;
                c->style = sty ? DT_ROTARY_INTERLEAVED : DT_ROTARY_HALF;
                c->pos = (P + o) % 3 == 0 ? POS_OFFSET : POS_INDEX;
                c->base = 0.0f;
                c->dtype = (P + o + sty) % 4 == 0 ? DT_BF16
                           : (P + o + sty) % 4 == 2 ? DT_F16 : DT_F32;
                c->backend = be;
                h_layout_short(&c->l, ln, sizeof ln);
                snprintf(name, sizeof name, "rotary/%sP=%d,x=[2,%lld,3,8],%s,%s,pos=%s,%s", tag, P,
                         (long long)c->shape[1], ln, dt_rotary_style_name(c->style),
                         pos_names[c->pos], dt_dtype_name(c->dtype));
                add(tb, name, test_rotary, c, 1);
            }
    {
        /* heads on tp, tokens striped on sp; large positions; base 500;
         * Partial; [B, S, D]; local */
        struct { int mesh_ndim, m0, m1; dt_layout l; int ndim; int64_t shape[4]; pos_kind pos;
                 float base; const char *what; } extra[] = {
            {2, 2, 3, dt_layout_2d(dt_shard(2, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_STRIPED)),
             4, {1, 12, 4, 16}, POS_INDEX, 0.0f, "heads+striped"},
            {2, 3, 2, dt_layout_2d(dt_shard(1, DT_ORDER_ZIGZAG), dt_shard(0, DT_ORDER_CONTIGUOUS)),
             4, {2, 12, 4, 16}, POS_LARGE, 500.0f, "zigzag+batch"},
            {1, 4, 1, dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED)), 4, {1, 16, 2, 32}, POS_LARGE,
             10000.0f, "striped"},
            {1, 3, 1, dt_layout_1d(dt_partial()), 4, {2, 6, 2, 8}, POS_OFFSET, 0.0f, "Partial"},
            {1, 2, 1, dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED)), 3, {2, 10, 12, 0}, POS_INDEX,
             0.0f, "[B,S,D]"},
            {0, 1, 1, dt_layout_replicated(0), 4, {2, 7, 3, 6}, POS_OFFSET, 0.0f, "local"},
        };
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
            for (int sty = 0; sty < 2; sty++) {
                rot_case *c = calloc(1, sizeof *c);
                if (!c) return 1;
                c->mesh_ndim = extra[i].mesh_ndim;
                c->mesh[0] = extra[i].m0;
                c->mesh[1] = extra[i].m1;
                c->world = extra[i].mesh_ndim == 0 ? 0
                           : extra[i].mesh_ndim == 2 ? extra[i].m0 * extra[i].m1 : extra[i].m0;
                c->l = extra[i].l;
                c->ndim = extra[i].ndim;
                memcpy(c->shape, extra[i].shape, sizeof c->shape);
                c->style = sty ? DT_ROTARY_INTERLEAVED : DT_ROTARY_HALF;
                c->pos = extra[i].pos;
                c->base = extra[i].base;
                c->dtype = DT_F32;
                c->backend = be;
                char sh[64] = "";
                for (int d = 0; d < c->ndim; d++)
                    snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", d ? "," : "",
                             (long long)c->shape[d]);
                layout_name(&c->l, ln, sizeof ln);
                snprintf(name, sizeof name, "rotary/%s%s,world=%d,x=[%s],%s,%s,pos=%s,base=%g,fp32",
                         tag, extra[i].what, c->world ? c->world : 1, sh, ln,
                         dt_rotary_style_name(c->style), pos_names[c->pos],
                         (double)(c->base > 0 ? c->base : 10000.0f));
                add(tb, name, test_rotary, c, 1);
            }
    }

    snprintf(name, sizeof name, "errors/%sP=2,reshape+rmsnorm+rotary", tag);
    add(tb, name, test_errors, be == DT_BACKEND_CUDA ? (void *)&cuda_kind : NULL, 0);

    /* the block */
    {
        static const int meshes[][2] = {{1, 1}, {1, 4}, {2, 2}, {4, 1}, {2, 3}};
        for (size_t m = 0; m < sizeof meshes / sizeof meshes[0]; m++)
            for (int o = 0; o < 3; o++)
                for (int dt = 0; dt < 3; dt++) {
                    /* bf16 on a third of them, fp16 on another */
                    if (dt && (m + (size_t)o) % 3 != (size_t)dt - 1) continue;
                    block_case *c = calloc(1, sizeof *c);
                    if (!c) return 1;
                    c->tp = meshes[m][0];
                    c->sp = meshes[m][1];
                    c->order = k_orders[o];
                    c->dtype = k_dtypes[dt];
                    c->backend = be;
                    c->B = 1, c->S = 24, c->E = 64, c->H = 8, c->G = 4;
                    c->seed = 1000 + 17 * m + (uint64_t)o;
                    snprintf(name, sizeof name,
                             "block/%stp=%d,sp=%d,%s,B=1,S=24,E=64,H=8,Hkv=4,D=8,%s", tag, c->tp, c->sp,
                             dt_order_name(c->order), dt_dtype_name(c->dtype));
                    add(tb, name, test_block, c, 1);
                }
        /* MQA (one kv head: k is [B, S, 1, D]) and wider heads */
        static const struct { int tp, sp; int64_t B, S, E, H, G; dt_order o; } more[] = {
            {1, 4, 2, 16, 64, 4, 1, DT_ORDER_STRIPED},
            {1, 1, 1, 12, 64, 2, 1, DT_ORDER_CONTIGUOUS},
            {2, 2, 2, 16, 96, 6, 2, DT_ORDER_ZIGZAG},
            {3, 2, 1, 12, 96, 3, 3, DT_ORDER_STRIPED},
        };
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
            block_case *c = calloc(1, sizeof *c);
            if (!c) return 1;
            c->tp = more[i].tp, c->sp = more[i].sp, c->order = more[i].o, c->dtype = DT_F32;
            c->backend = be;
            c->B = more[i].B, c->S = more[i].S, c->E = more[i].E, c->H = more[i].H, c->G = more[i].G;
            c->seed = 2000 + i;
            snprintf(name, sizeof name, "block/%stp=%d,sp=%d,%s,B=%lld,S=%lld,E=%lld,H=%lld,Hkv=%lld,"
                     "D=%lld,fp32", tag, c->tp, c->sp, dt_order_name(c->order), (long long)c->B,
                     (long long)c->S, (long long)c->E, (long long)c->H, (long long)c->G,
                     (long long)(c->E / c->H));
            add(tb, name, test_block, c, 1);
        }
    }

    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    const char *slash = argv[0] ? strrchr(argv[0], '/') : NULL;
    if (slash && slash - argv[0] < 4000) {
        snprintf(g_example, sizeof g_example, "%.*s/../examples/transformer_block",
                 (int)(slash - argv[0]), argv[0]);
        if (access(g_example, X_OK) != 0)
            snprintf(g_example, sizeof g_example, "build/examples/transformer_block");
    }
    static table tb;
    char name[200];

    /* Every op case on the CPU backend, then again on CUDA (cuda+local,
     * ranks sharing one GPU; skipped with the reason where it cannot run). */
    if (add_op_cases(&tb, DT_BACKEND_CPU) || add_op_cases(&tb, DT_BACKEND_CUDA)) return 1;

    add(&tb, "backend/cuda-vs-cpu/reshape+rmsnorm+rotary,fp32+bf16", test_cuda_vs_cpu, NULL, 0);

    static const example_case examples[] = {
        {"", 0, "result: PASS"},
        {"--sweep --batch 1 --seq 24 --embed 64 --heads 8 --kv-heads 4", 0, "result: PASS"},
        {"--tp 2 --sp 3 --order zigzag --dtype bf16 --seq 36 --embed 128 --heads 4 --kv-heads 2", 0,
         "result: PASS"},
        {"--tp 3", 2, "--heads 8 is not divisible by --tp 3"},
        {"--tp 2 --kv-heads 1", 2, "--kv-heads 1 is not divisible by --tp 2"},
        /* --kv-heads not given: H/2 where that fits H and tp, else H */
        {"--tp 3 --sp 1 --seq 24 --embed 96 --heads 6", 0, "6 heads (3 kv heads)"},
        {"--tp 2 --sp 2 --seq 24 --embed 64 --heads 2", 0, "2 heads (2 kv heads)"},
        {"--tp 1 --sp 2 --seq 24 --embed 48 --heads 3", 0, "3 heads (3 kv heads)"},
        {"--order diagonal", 2, "--order takes one of contiguous, striped, zigzag"},
        {"--sp 4 --seq 10", 2, "--seq 10 is not divisible by --sp 4"},
        {"--heads 5", 2, "--heads 5 does not divide --embed 256"},
        {"--embed 96 --heads 8", 2, "head dim E/H = 12"},
        {"--frobnicate", 2, "unknown flag '--frobnicate'"},
        /* a sweep checks what every mesh needs (its reference read past
         * the kv heads, or divided by zero, when it did not) */
        {"--sweep --heads 4 --kv-heads 8", 2, "--kv-heads 8 does not divide --heads 4"},
        {"--sweep --seq 8 --embed 64 --heads 8 --kv-heads 3", 2, "--kv-heads 3 does not divide"},
        {"--sweep --embed 20 --heads 4 --kv-heads 4", 2, "head dim E/H = 5"},
        {"--backend cpu --dtype fp16 --seq 24 --embed 64 --heads 8 --kv-heads 4", 0, "result: PASS"},
    };
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        snprintf(name, sizeof name, "example/transformer_block %s%s-> exit %d", examples[i].args,
                 *examples[i].args ? " " : "", examples[i].want_status);
        add(&tb, name, test_example, (void *)&examples[i], 0);
    }

    int failed = h_run_cases("transformer", tb.tests, tb.n);
    for (size_t i = 0; i < tb.n_owned; i++) free(tb.owned[i]);
    return failed;
}
