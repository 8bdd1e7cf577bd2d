/* tests/test_grad.c — the backward of every model op (dtensor/ops.h,
 * dtensor/ops_nn.h), dt_tensor_grad_reduce, and the training calls of
 * dtensor/optim.h, against double-precision references written here from
 * the mathematics (never from the library's code).
 *
 *   fd/...            each reference backward against central finite
 *                     differences of its reference forward, L = sum(dy * y)
 *                     with a random dy (cross-entropy: L = dl * loss): the
 *                     references are checked before they check the library.
 *   <op>/...          the library's forward and backward for every Layout rule
 *                     of docs/API.md's forward -> backward table, P = 1..8 on
 *                     1-D meshes (every order) and 2-D meshes 2x2, 2x3, 3x2
 *                     (a dp-like and a tp-like dim together), and local
 *                     tensors. For each output and gradient: its Layout is the
 *                     table's (stated here per mesh dim, not asked of the
 *                     library); its global value (dt_tensor_gather, Partial
 *                     dims summed) and every rank's part (test-local index
 *                     maps of tests/harness.c) match the reference;
 *                     dt_tensor_grad_reduce gives the input's Layout with
 *                     Partial read as Replicate and the same values; a second
 *                     backward into the same tensors (each output alone, NULL
 *                     skipping the other) leaves twice the gradient in them.
 *   <op>/nan/...      a NaN in an input and one in dy: NaN exactly where the
 *                     reference (which propagates NaN) has one, finite
 *                     elsewhere, forward and backward.
 *   cross_entropy/... also the mean over every counted target of the GLOBAL
 *                     batch with the rows split over one mesh dim and the
 *                     vocabulary over another, ignored targets spread
 *                     unevenly over the ranks (an ignore index that is a
 *                     class too); the loss bitwise equal on every rank; the
 *                     loss alone (dlogits NULL) and dlogits alone.
 *   rotary/...,docs=  also with packed documents (doc_lens): each token at
 *                     its offset in its document, one list for every batch
 *                     row or one per row, the sequence sharded in every
 *                     order and the batch sharded, forward and backward.
 *   adamw/...         dt_adamw_step against torch.optim.AdamW's formula in
 *                     double over 3 steps: fp32 param, bf16 and fp16 param
 *                     with an fp32 master.
 *   sum_squares/, convert/   against a double sum and round-to-nearest-even
 *                     written here (special values included).
 *   errors/...        wrong Layouts (the message names the redistribution),
 *                     mismatched shapes, targets out of range (on one rank
 *                     only: every rank fails), zero-size dims, Partial inputs
 *                     to non-linear ops, gradients to add into with the wrong
 *                     Layout, shape or dtype: the status, the message, no
 *                     output handle written, no input or gradient changed
 *                     (checksums before and after).
 *   cuda/...          the same cases on the CUDA backend (cuda+local, ranks
 *                     sharing one device; make CUDA=emu: the emulator's) with
 *                     P = 1, 3, 4, 8 on 1-D meshes, fp32
 *                     and, alternately, bf16 or fp16; each skipped with the
 *                     reason where cuda+local cannot run.
 * DT_TEST_QUICK (valgrind, ThreadSanitizer): P = 1 and 3 (CUDA: 3), every
 * other Layout, one order per matmul row, the 2x2 mesh, no 16-bit CPU cases.
 *
 * Tolerances, |got - ref| <= bound per element, with u = 2^-24, A the sum of
 * the magnitudes of the terms an element is formed from (of every summand
 * of a Partial input), n the terms summed, W the summands of a Partial
 * result (1 if none), k = 1, or 2 (3) after adding into it once (twice)
 * more; bounds scale with k, and a bf16 or fp16 result adds
 * (W + 1 + k) k (u_d A + s_d), u_d = 2^-8, 2^-11 (each rounding of a summand,
 * of the result and of what it is added to; inputs are values of the dtype),
 * s_d = 2^-25 for fp16 (its subnormals), else 0:
 *   matmul                (n + W + 8) u A, CUDA twice that (fp32 GEMM, TF32 off)
 *   add                   out (W + 1) u A; gradients exact (copies of dy)
 *   reshape               out (W - 1) u A (the gather's sums); gradient exact
 *   gelu, swiglu          1e-6 A, CUDA 2e-5 A (fp32 libm, |x| < 3); out + 1e-7
 *   rmsnorm               dx (E + 8) u A, dweight (rows + W + 8) u A;
 *                         out 1e-5 A + 1e-6
 *   rotary                out (W + 8) u (|a| + |b|), dx 8 u (|dy_a| + |dy_b|)
 *                         (cos, sin rounded to fp32)
 *   embedding             out exact; dtable (tokens + W + 8) u A
 *   cross-entropy         dlogits 2e-5 A, A = (p + [j = t]) / N; loss
 *                         1e-5 sum(|lse| + |x_t|) / N + 1e-7
 *   adamw                 per step 4u |p| + 1e-5 lr; m 1e-6 (its terms'
 *                         magnitudes), v 1e-6 |v|; a 16-bit param is its
 *                         master rounded, exactly
 *   sum_squares           (W + 2) u |ref| (the ranks' shares are summed as
 *                         fp32 pieces), and one case at 1e-12 relative: the
 *                         "accumulated in double" of dtensor/optim.h
 *   convert               exact (signed zeros, inf, NaN, subnormals, ties)
 * Rank functions only record; the main thread asserts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"
#include "harness.h"
#include "ref.h"

#define MAXW H_MAX_RANKS
#define U32 0x1p-24
#define PI 3.14159265358979323846
#define EPS_NORM 1e-5f

static const dt_order k_orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
static int g_quick;

/* ================================================================ references
 * Double precision, from the definitions; NaN propagates through every one
 * (max_nan below instead of fmax, which drops NaN). */

static double max_nan(double a, double b) { return (b > a || isnan(b)) ? b : a; }

static double ref_gelu(double x, dt_gelu_approx a) {
    if (a == DT_GELU_ERF) return 0.5 * x * erfc(-x / sqrt(2.0));
    const double k = sqrt(2.0 / PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* gelu'(x); *mag the sum of its terms' magnitudes. */
static double ref_gelu_grad(double x, dt_gelu_approx a, double *mag) {
    double t1, t2;
    if (a == DT_GELU_ERF) {
        t1 = 0.5 * erfc(-x / sqrt(2.0));                /* Phi(x) */
        t2 = x * exp(-0.5 * x * x) / sqrt(2.0 * PI);    /* x phi(x) */
    } else {
        const double k = sqrt(2.0 / PI), c = 0.044715, t = tanh(k * (x + c * x * x * x));
        t1 = 0.5 * (1.0 + t);
        t2 = 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
    }
    if (mag) *mag = fabs(t1) + fabs(t2);
    return t1 + t2;
}

/* silu(g) = g sigma(g); silu'(g) = sigma (1 + g (1 - sigma)), *mag its terms. */
static double ref_silu(double g, double *d, double *mag) {
    const double s = 1.0 / (1.0 + exp(-g));
    if (d) *d = s * (1.0 + g * (1.0 - s));
    if (mag) *mag = s + fabs(g) * s * (1.0 - s);
    return g * s;
}

/* y = x @ w, x [M, K], w [K, N]; xa, wa the magnitudes (may be NULL with ya). */
static void ref_matmul(int64_t M, int64_t K, int64_t N, const double *x, const double *xa,
                       const double *w, const double *wa, double *y, double *ya) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                s += x[i * K + k] * w[k * N + n];
                if (ya) a += xa[i * K + k] * wa[k * N + n];
            }
            y[i * N + n] = s;
            if (ya) ya[i * N + n] = a;
        }
}

/* dx = dy w^T, dw = x^T dy (either may be NULL), with magnitudes. */
static void ref_matmul_bwd(int64_t M, int64_t K, int64_t N, const double *x, const double *xa,
                           const double *w, const double *wa, const double *dy, double *dx,
                           double *dxa, double *dw, double *dwa) {
    for (int64_t i = 0; dx && i < M; i++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0, a = 0;
            for (int64_t n = 0; n < N; n++) {
                s += dy[i * N + n] * w[k * N + n];
                if (dxa) a += fabs(dy[i * N + n]) * wa[k * N + n];
            }
            dx[i * K + k] = s;
            if (dxa) dxa[i * K + k] = a;
        }
    for (int64_t k = 0; dw && k < K; k++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int64_t i = 0; i < M; i++) {
                s += x[i * K + k] * dy[i * N + n];
                if (dwa) a += xa[i * K + k] * fabs(dy[i * N + n]);
            }
            dw[k * N + n] = s;
            if (dwa) dwa[k * N + n] = a;
        }
}

/* RMSNorm over rows of E: y = x r w, r = (mean x^2 + eps)^-1/2; with dy:
 *   dx_i = r w_i dy_i - x_i r^3 / E sum_j dy_j w_j x_j,  dw_i = sum_rows dy_i x_i r.
 * w NULL: no weight (dw unused). Every output may be NULL. */
static void ref_rmsnorm(int64_t rows, int64_t E, const double *x, const double *w, double eps,
                        const double *dy, double *y, double *ya, double *dx, double *dxa,
                        double *dw, double *dwa) {
    for (int64_t i = 0; dw && i < E; i++) dw[i] = dwa[i] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * E;
        double ss = 0;
        for (int64_t i = 0; i < E; i++) ss += xr[i] * xr[i];
        const double inv = 1.0 / sqrt(ss / (double)E + eps);
        for (int64_t i = 0; y && i < E; i++) {
            y[r * E + i] = xr[i] * inv * (w ? w[i] : 1.0);
            if (ya) ya[r * E + i] = fabs(y[r * E + i]);
        }
        if (!dy) continue;
        const double *g = dy + r * E;
        double sgx = 0, sgxa = 0;
        for (int64_t j = 0; j < E; j++) {
            const double gw = g[j] * (w ? w[j] : 1.0);
            sgx += gw * xr[j];
            sgxa += fabs(gw * xr[j]);
        }
        const double k3 = inv * inv * inv / (double)E;
        for (int64_t i = 0; dx && i < E; i++) {
            const double gw = g[i] * (w ? w[i] : 1.0);
            dx[r * E + i] = inv * gw - xr[i] * k3 * sgx;
            dxa[r * E + i] = fabs(inv * gw) + fabs(xr[i]) * k3 * sgxa;
        }
        for (int64_t i = 0; dw && i < E; i++) {
            dw[i] += g[i] * xr[i] * inv;
            dwa[i] += fabs(g[i] * xr[i] * inv);
        }
    }
}

/* Rotary over x [B, S, H, D] at positions pos[b * pos_stride + s] (NULL:
 * s), base; sign 1 the rotation (a c - b s, a s + b c), sign -1 its
 * transpose (the backward: a c + b s, -a s + b c). ya (may be NULL) =
 * |a| + |b| of each pair. */
static void ref_rotary(int64_t B, int64_t S, int64_t H, int64_t D, const double *x,
                       const int64_t *pos, int64_t pos_stride, double base, dt_rotary_style style,
                       double sign, double *y, double *ya) {
    const int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t row = ((b * S + s) * H + h) * D;
                for (int64_t i = 0; i < half; i++) {
                    const double ang =
                        (double)(pos ? pos[b * pos_stride + s] : s) * pow(base, -2.0 * (double)i / (double)D);
                    const double c = cos(ang), sn = sign * sin(ang);
                    const int64_t ia = row + (style == DT_ROTARY_INTERLEAVED ? 2 * i : i);
                    const int64_t ib = row + (style == DT_ROTARY_INTERLEAVED ? 2 * i + 1 : i + half);
                    const double a = x[ia], bb = x[ib];
                    y[ia] = a * c - bb * sn;
                    y[ib] = a * sn + bb * c;
                    if (ya) ya[ia] = ya[ib] = fabs(a) + fabs(bb);
                }
            }
}

/* Cross-entropy of x [rows, V] against t [rows]: targets equal to `ignore`
 * count nowhere; mean over the N counted rows (sum_red: the sum). Returns
 * the loss (NaN for a mean over nothing); dx/dxa (may be NULL) its gradient
 * and magnitudes; *loss_mag the scale of the loss's terms. */
static double ref_ce(int64_t rows, int64_t V, const double *x, const int32_t *t, int32_t ignore,
                     int sum_red, double *dx, double *dxa, double *loss_mag) {
    int64_t N = 0;
    for (int64_t r = 0; r < rows; r++) N += t[r] != ignore;
    const double scale = sum_red ? 1.0 : 1.0 / (double)N;
    double loss = 0, mag = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * V;
        if (t[r] == ignore) {
            for (int64_t j = 0; dx && j < V; j++) dx[r * V + j] = dxa[r * V + j] = 0.0;
            continue;
        }
        double m = -INFINITY, se = 0;
        for (int64_t j = 0; j < V; j++) m = max_nan(m, xr[j]);
        for (int64_t j = 0; j < V; j++) se += exp(xr[j] - m);
        const double lse = m + log(se);
        loss += lse - xr[t[r]];
        mag += fabs(lse) + fabs(xr[t[r]]);
        for (int64_t j = 0; dx && j < V; j++) {
            const double p = exp(xr[j] - m) / se, one = j == t[r] ? 1.0 : 0.0;
            dx[r * V + j] = (p - one) * scale;
            dxa[r * V + j] = (p + one) * scale;
        }
    }
    if (loss_mag) *loss_mag = mag * (N > 0 ? scale : 1.0);
    return N == 0 && !sum_red ? NAN : loss * scale;
}

/* v rounded to nearest even in a binary format with `mant` stored mantissa
 * bits, smallest normal exponent emin and largest finite value maxv. */
static double round_fmt(double v, int mant, int emin, double maxv) {
    if (isnan(v) || isinf(v) || v == 0.0) return v;
    int e;
    frexp(fabs(v), &e);
    const int lead = e - 1 < emin ? emin : e - 1;
    const double ulp = ldexp(1.0, lead - mant);
    const double q = rint(v / ulp) * ulp; /* the default rounding: ties to even */
    return fabs(q) > maxv ? copysign(INFINITY, v) : q;
}

/* v (a double holding any float) as dtype d stores it. */
static double round_to(double v, dt_dtype d) {
    if (d == DT_BF16) return round_fmt(v, 7, -126, 0x1.fep127);
    if (d == DT_F16) return round_fmt(v, 10, -14, 65504.0);
    return round_fmt(v, 23, -126, FLT_MAX);
}

/* ==================================================================== results */

typedef struct res {
    long fails[MAXW];
    char why[MAXW][400];
} res;

/* One rank's view of a case: its context, mesh, and what it made (freed by
 * rk_done). */
typedef struct rk {
    res *res;
    int r;
    dt_context *ctx;
    dt_mesh *mesh; /* NULL: local tensors */
    int nd, ms[3], coords[3];
    dt_tensor *t[96];
    int nt;
    void *h[160];
    int nh;
} rk;

static void flag(rk *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void flag(rk *k, const char *fmt, ...) {
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (k->res->fails[k->r]++ == 0)
        snprintf(k->res->why[k->r], sizeof k->res->why[k->r], "%s", buf);
    fprintf(stderr, "  rank %d: %s\n", k->r, buf);
}

static void *hmem(rk *k, size_t bytes) {
    void *p = calloc(1, bytes + 16);
    if (!p || k->nh >= (int)(sizeof k->h / sizeof k->h[0])) {
        fprintf(stderr, "test_grad: out of host memory or slots\n");
        abort();
    }
    k->h[k->nh++] = p;
    return p;
}
#define DMEM(k, n) ((double *)hmem((k), (size_t)(n) * sizeof(double)))

static dt_tensor *keep(rk *k, dt_tensor *t) {
    if (t && k->nt < (int)(sizeof k->t / sizeof k->t[0])) k->t[k->nt++] = t;
    else if (t) abort();
    return t;
}

/* Makes the mesh (COLLECTIVE; mesh_ndim 0: local tensors). */
static dt_status rk_init(rk *k, dt_context *ctx, res *rs, int mesh_ndim, const int *mesh) {
    memset(k, 0, sizeof *k);
    k->res = rs;
    k->ctx = ctx;
    k->r = dt_context_rank(ctx);
    k->nd = mesh_ndim;
    if (mesh_ndim == 0) return DT_SUCCESS;
    for (int m = 0; m < mesh_ndim; m++) k->ms[m] = mesh[m];
    h_coords(k->r, mesh_ndim, k->ms, k->coords);
    return dt_mesh_create(ctx, mesh_ndim, mesh, NULL, &k->mesh);
}

static void rk_done(rk *k) {
    for (int i = k->nt - 1; i >= 0; i--) dt_tensor_destroy(k->t[i]);
    for (int i = 0; i < k->nh; i++) free(k->h[i]);
    dt_mesh_destroy(k->mesh);
    k->nt = k->nh = 0;
    k->mesh = NULL;
}

static const dt_layout *L(const rk *k, const dt_layout *l) { return k->mesh ? l : NULL; }

static int partial_count(const rk *k, const dt_layout *l) {
    return k->mesh && l ? h_partial_count(l, k->ms) : 1;
}

/* l with Partial read as Replicate: docs/API.md's rule for a gradient's
 * Layout, stated here. */
static dt_layout grad_of(const dt_layout *l) {
    dt_layout g = *l;
    for (int m = 0; m < g.ndim; m++)
        if (g.placements[m].kind == DT_PARTIAL) g.placements[m] = dt_replicate();
    return g;
}

static void shape_str(int ndim, const int64_t *s, char *buf, size_t size) {
    size_t p = 0;
    buf[0] = '\0';
    for (int d = 0; d < ndim && p < size; d++)
        p += (size_t)snprintf(buf + p, size - p, "%s%lld", d ? "," : "[", (long long)s[d]);
    if (p < size) snprintf(buf + p, size - p, "]");
}

static void lname(const dt_layout *l, char *buf, size_t size) {
    if (!l || l->ndim == 0) snprintf(buf, size, "local");
    else h_layout_short(l, buf, size);
}

/* ======================================================================= data */

/* Summand q of input `seed` at global index g: offset + scale * r in the dtype. */
static double value(dt_dtype dt, uint64_t seed, int q, int64_t g, double scale, double offset) {
    return h_stored(dt, (float)(offset + scale * h_stored(dt, dt_random_value(seed + 7919u * (uint64_t)q,
                                                                               (uint64_t)g))));
}

/* A tensor of `shape` under l (ignored for local tensors) whose Partial
 * mesh dims hold summands of their own; glob (may be NULL) gets the global
 * value (their sum, in double), gabs the sum of their magnitudes. nan_at >= 0
 * puts a NaN at that global index (in summand 0). */
static dt_status make_f(rk *k, dt_dtype dt, int ndim, const int64_t *shape, const dt_layout *l,
                        uint64_t seed, double scale, double offset, int64_t nan_at, double *glob,
                        double *gabs, dt_tensor **out) {
    const dt_layout *ll = L(k, l);
    const int64_t n = h_numel(ndim, shape);
    const int np = partial_count(k, ll), pc = ll ? h_partial_index(ll, k->ms, k->coords) : 0;
    float *mine = hmem(k, (size_t)(n + 1) * sizeof(float)), *loc = hmem(k, (size_t)(n + 1) * sizeof(float));
    for (int64_t g = 0; g < n; g++) {
        double s = 0, a = 0;
        for (int q = 0; q < np; q++) {
            const double v = value(dt, seed, q, g, scale, offset);
            if (q == pc) mine[g] = (float)v;
            s += v;
            a += fabs(v);
        }
        if (g == nan_at) {
            if (pc == 0) mine[g] = NAN;
            s = a = NAN;
        }
        if (glob) glob[g] = s;
        if (gabs) gabs[g] = a;
    }
    h_local_of(mine, ndim, shape, ll, k->ms, k->coords, loc, NULL);
    dt_tensor *t = NULL;
    DT_TRY(dt_tensor_create(k->ctx, k->mesh, dt, ndim, shape, ll, &t));
    keep(k, t);
    void *buf = hmem(k, (size_t)(n + 1) * sizeof(float));
    dt_values_set(buf, dt, (size_t)dt_tensor_local_numel(t), loc);
    DT_TRY(dt_tensor_set_local(t, buf, dt_tensor_local_bytes(t)));
    *out = t;
    return DT_SUCCESS;
}

/* An i32 tensor holding full[] (global, row-major) under l. */
static dt_status make_i32(rk *k, int ndim, const int64_t *shape, const dt_layout *l,
                          const int32_t *full, dt_tensor **out) {
    const dt_layout *ll = L(k, l);
    const int64_t n = h_numel(ndim, shape);
    float *f = hmem(k, (size_t)(n + 1) * sizeof(float)), *loc = hmem(k, (size_t)(n + 1) * sizeof(float));
    memcpy(f, full, (size_t)n * sizeof(int32_t)); /* 4-byte elements moved as they are */
    h_local_of(f, ndim, shape, ll, k->ms, k->coords, loc, NULL);
    dt_tensor *t = NULL;
    DT_TRY(dt_tensor_create(k->ctx, k->mesh, DT_I32, ndim, shape, ll, &t));
    keep(k, t);
    DT_TRY(dt_tensor_set_local(t, loc, dt_tensor_local_bytes(t)));
    *out = t;
    return DT_SUCCESS;
}

/* FNV-1a of a tensor's local bytes (0 for NULL). */
static uint64_t checksum(const dt_tensor *t) {
    if (!t) return 0;
    size_t b = dt_tensor_local_bytes(t);
    unsigned char *p = malloc(b + 1);
    uint64_t h = 1469598103934665603ull;
    if (!p || dt_tensor_get_local(t, p, b) != DT_SUCCESS) {
        free(p);
        return 1;
    }
    for (size_t i = 0; i < b; i++) h = (h ^ p[i]) * 1099511628211ull;
    free(p);
    return h;
}

/* tol[i] = k (rel a[i] + atol) + (16-bit: (wp + 1 + k) k (u_d a[i] + s_d)):
 * the bound for k times a result of magnitude a (module comment); s_d is
 * half the spacing of fp16's subnormals, 2^-25 (bf16's are far below
 * anything compared). */
static void fill_tol(double *tol, const double *a, int64_t n, double rel, double atol, dt_dtype dt,
                     int wp, int kk) {
    const double ud = dt == DT_F32 ? 0.0 : h_half_ulp(dt), sd = dt == DT_F16 ? 0x1p-25 : 0.0;
    for (int64_t i = 0; i < n; i++)
        tol[i] = kk * (rel * a[i] + atol) + (double)(wp + 1 + kk) * kk * (ud * a[i] + sd);
}

static double *scaled(rk *k, const double *v, int64_t n, double s) {
    double *o = DMEM(k, n);
    for (int64_t i = 0; i < n; i++) o[i] = s * v[i];
    return o;
}

/* Mismatches of got against ref within tol: NaN must meet NaN, inf the same
 * inf, and finite values the bound. Prints the first few. */
static long compare(const char *what, const float *got, const double *ref, const double *tol,
                    int64_t n) {
    long bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], r = ref[i];
        int ok;
        if (isnan(r)) ok = isnan(g);
        else if (isinf(r)) ok = g == r;
        else {
            ok = isfinite(g) && fabs(g - r) <= tol[i];
            if (isfinite(g) && fabs(g - r) > worst) worst = fabs(g - r);
            if (!isfinite(g)) worst = INFINITY;
        }
        if (!ok && bad++ < 4)
            fprintf(stderr, "    %s: [%" PRId64 "] got %.9g, expected %.9g (bound %.3g)\n", what, i, g,
                    r, tol[i]);
    }
    if (bad) fprintf(stderr, "    %s: %ld of %" PRId64 " differ, max error %.3g\n", what, bad, n, worst);
    return bad;
}

/* Checks a result tensor: its Layout is `want` (local: none), its shape,
 * every rank's local part against ref/tol (where not Partial), and the
 * global tensor gathered on rank 0. COLLECTIVE (the gather). */
static dt_status check_tensor(rk *k, const char *what, const dt_tensor *t, const dt_layout *want,
                              int ndim, const int64_t *shape, const double *ref, const double *tol) {
    char a[160], b[160];
    const dt_layout *tl = dt_tensor_layout(t);
    if (k->mesh && !dt_layout_equal(tl, want)) {
        dt_layout_format(tl, a, sizeof a);
        dt_layout_format(want, b, sizeof b);
        flag(k, "%s: Layout %s, expected %s", what, a, b);
    } else if (!k->mesh && (tl->ndim != 0 || dt_tensor_mesh(t) != NULL)) {
        flag(k, "%s: a local input gave a distributed result", what);
    }
    int same = dt_tensor_ndim(t) == ndim;
    for (int d = 0; same && d < ndim; d++) same = dt_tensor_shape(t)[d] == shape[d];
    if (!same) {
        shape_str(dt_tensor_ndim(t), dt_tensor_shape(t), a, sizeof a);
        shape_str(ndim, shape, b, sizeof b);
        flag(k, "%s: shape %s, expected %s", what, a, b);
        return DT_SUCCESS; /* the same on every rank: no gather anywhere */
    }
    const int64_t n = h_numel(ndim, shape);
    char w[200];
    if (partial_count(k, tl) == 1) {
        double *lref = DMEM(k, n + 1), *ltol = DMEM(k, n + 1);
        h_local_of_f64(ref, ndim, shape, L(k, tl), k->ms, k->coords, lref);
        h_local_of_f64(tol, ndim, shape, L(k, tl), k->ms, k->coords, ltol);
        float *got = h_local_floats(t);
        if (!got) return dt_error(DT_ERR_OUT_OF_MEMORY, "%s: download failed", what);
        snprintf(w, sizeof w, "rank %d: %s (local part)", k->r, what);
        if (compare(w, got, lref, ltol, dt_tensor_local_numel(t)))
            flag(k, "%s: the local part differs from the reference", what);
        free(got);
    }
    if (!k->mesh) return DT_SUCCESS;
    dt_tensor *full = NULL;
    DT_TRY(dt_tensor_gather(t, 0, &full));
    if (k->r == 0) {
        float *got = full ? h_local_floats(full) : NULL;
        if (!got) {
            dt_tensor_destroy(full);
            return dt_error(DT_ERR_INTERNAL, "%s: the gather gave nothing on rank 0", what);
        }
        snprintf(w, sizeof w, "%s (gathered)", what);
        if (compare(w, got, ref, tol, n)) flag(k, "%s: the gathered tensor differs from the reference", what);
        free(got);
    }
    dt_tensor_destroy(full);
    return DT_SUCCESS;
}

/* check_tensor for a gradient of `input`, then dt_tensor_grad_reduce: the
 * input's Layout with Partial read as Replicate, the same values. */
static dt_status check_grad(rk *k, const char *what, const dt_tensor *g, const dt_layout *want,
                            const dt_tensor *input, const double *ref, const double *tol) {
    const int nd = dt_tensor_ndim(input);
    const int64_t *shape = dt_tensor_shape(input);
    DT_TRY(check_tensor(k, what, g, want, nd, shape, ref, tol));
    if (!k->mesh) return DT_SUCCESS;
    dt_tensor *red = NULL;
    DT_TRY(dt_tensor_grad_reduce(g, input, &red));
    keep(k, red);
    const dt_layout gl = grad_of(dt_tensor_layout(input));
    char w[160];
    snprintf(w, sizeof w, "%s reduced", what);
    return check_tensor(k, w, red, &gl, nd, shape, ref, tol);
}

/* The same tensor handle after adding into it. */
static void check_same(rk *k, const char *what, const dt_tensor *before, const dt_tensor *after) {
    if (before != after) flag(k, "%s: adding into a gradient replaced its tensor", what);
}

/* ================================================================ op cases */

typedef enum op_kind {
    OP_MATMUL, OP_ADD, OP_GELU, OP_SWIGLU, OP_RESHAPE, OP_RMSNORM, OP_ROTARY, OP_EMBED, OP_CE,
    OP_KIND_COUNT
} op_kind;

/* One op on one mesh: the inputs' Layouts and what docs/API.md's table says
 * the output, dy and the gradients get. */
typedef struct gcase {
    op_kind op;
    dt_backend_kind backend;
    int mesh_ndim, mesh[2], world; /* mesh_ndim 0: local tensors, one rank */
    dt_dtype dtype;
    dt_layout in[2];   /* matmul x, w; embedding table, tokens; CE logits, targets; else x */
    dt_layout out, dy; /* the forward output's and dy's */
    dt_layout grad[2]; /* matmul dx, dw; add da = db; swiglu dgate = dup; rmsnorm dx,
                          dweight; rotary, reshape dx; embedding dtable; CE dlogits */
    int ndim;
    int64_t shape[5];  /* matmul {B, S, K, N}; embedding {B, S, V, E}; CE {B, S, V}; else x */
    int rndim;
    int64_t rshape[5]; /* reshape: the new shape */
    int variant;       /* gelu: approx; rotary: style; rmsnorm: weight; CE: 1 = sum */
    int positions;     /* rotary: explicit positions */
    int docs;          /* rotary: documents (rot_docs): 0 none, 1 one list, 2 a list per row */
    float base;        /* rotary */
    int32_t ignore;    /* CE */
    int loss_only;     /* CE: also the call without dlogits */
    int nan;           /* a NaN in the main input and in dy */
    uint64_t seed;
    res res;
    float loss[MAXW];
} gcase;

static dt_backend_kind be_of(dt_backend_kind b) { return b == DT_BACKEND_AUTO ? DT_BACKEND_CPU : b; }
static int is_cuda(const gcase *c) { return be_of(c->backend) == DT_BACKEND_CUDA; }

/* ---------------------------------------------------------------- matmul */

static dt_status run_matmul(rk *k, gcase *c) {
    const int64_t B = c->shape[0], S = c->shape[1], K = c->shape[2], N = c->shape[3], M = B * S;
    const int64_t xs[3] = {B, S, K}, ws[2] = {K, N}, ys[3] = {B, S, N};
    const dt_dtype dt = c->dtype;
    double *x = DMEM(k, M * K), *xa = DMEM(k, M * K), *w = DMEM(k, K * N), *wa = DMEM(k, K * N);
    double *dy = DMEM(k, M * N), *y = DMEM(k, M * N), *ya = DMEM(k, M * N);
    double *dx = DMEM(k, M * K), *dxa = DMEM(k, M * K), *dw = DMEM(k, K * N), *dwa = DMEM(k, K * N);
    double *tol = DMEM(k, M * K + K * N + M * N);
    dt_tensor *tx, *tw, *tdy, *ty = NULL, *gx = NULL, *gw = NULL;
    const int64_t nan_x = c->nan ? (S > 1 ? 1 : 0) * K + K - 1 : -1;
    const int64_t nan_dy = c->nan ? (M - 1) * N : -1;
    DT_TRY(make_f(k, dt, 3, xs, &c->in[0], c->seed, 1.0, 0.0, nan_x, x, xa, &tx));
    DT_TRY(make_f(k, dt, 2, ws, &c->in[1], c->seed + 1, 1.0, 0.0, -1, w, wa, &tw));
    DT_TRY(make_f(k, dt, 3, ys, &c->dy, c->seed + 2, 1.0, 0.0, nan_dy, dy, NULL, &tdy));
    const double cu = is_cuda(c) ? 2.0 : 1.0;

    DT_TRY(dt_matmul(tx, tw, &ty));
    keep(k, ty);
    ref_matmul(M, K, N, x, xa, w, wa, y, ya);
    fill_tol(tol, ya, M * N, cu * (double)(K + c->world + 8) * U32, 0, dt, partial_count(k, &c->out), 1);
    DT_TRY(check_tensor(k, "out", ty, &c->out, 3, ys, y, tol));

    ref_matmul_bwd(M, K, N, x, xa, w, wa, dy, dx, dxa, dw, dwa);
    DT_TRY(dt_matmul_backward(tx, tw, tdy, &gx, &gw));
    keep(k, gx);
    keep(k, gw);
    const int wpx = partial_count(k, &c->grad[0]), wpw = partial_count(k, &c->grad[1]);
    const double relx = cu * (double)(N + c->world + 8) * U32, relw = cu * (double)(M + c->world + 8) * U32;
    fill_tol(tol, dxa, M * K, relx, 0, dt, wpx, 1);
    DT_TRY(check_grad(k, "dx", gx, &c->grad[0], tx, dx, tol));
    /* sequence parallelism: a Partial dx of an x that was all-gathered from
     * Shard(1) goes back by reduce-scatter, one dt_tensor_grad_reduce onto
     * the sharded x (the same decision on every rank: shapes and Layouts) */
    for (int m = 0; m < c->mesh_ndim; m++) {
        int seq_free = 1;
        for (int q = 0; q < c->mesh_ndim; q++)
            if (c->in[0].placements[q].kind == DT_SHARD && c->in[0].placements[q].dim == 1) seq_free = 0;
        if (c->grad[0].placements[m].kind != DT_PARTIAL || c->in[0].placements[m].kind != DT_REPLICATE ||
            !seq_free || S % c->mesh[m] != 0)
            continue;
        dt_layout sp = grad_of(&c->in[0]);
        sp.placements[m] = dt_shard(1, DT_ORDER_CONTIGUOUS);
        dt_tensor *xsp, *red = NULL;
        DT_TRY(make_f(k, dt, 3, xs, &sp, c->seed + 5, 1.0, 0.0, -1, NULL, NULL, &xsp));
        DT_TRY(dt_tensor_grad_reduce(gx, xsp, &red));
        keep(k, red);
        DT_TRY(check_tensor(k, "dx reduce-scattered onto a sequence-sharded x", red, &sp, 3, xs, dx, tol));
        break;
    }
    fill_tol(tol, dwa, K * N, relw, 0, dt, wpw, 1);
    DT_TRY(check_grad(k, "dw", gw, &c->grad[1], tw, dw, tol));

    /* into the same tensors, one output at a time */
    dt_tensor *gx0 = gx, *gw0 = gw;
    DT_TRY(dt_matmul_backward(tx, tw, tdy, &gx, NULL));
    DT_TRY(dt_matmul_backward(tx, tw, tdy, NULL, &gw));
    check_same(k, "dx", gx0, gx);
    check_same(k, "dw", gw0, gw);
    fill_tol(tol, dxa, M * K, relx, 0, dt, wpx, 2);
    DT_TRY(check_tensor(k, "dx added into", gx, &c->grad[0], 3, xs, scaled(k, dx, M * K, 2), tol));
    fill_tol(tol, dwa, K * N, relw, 0, dt, wpw, 2);
    return check_tensor(k, "dw added into", gw, &c->grad[1], 2, ws, scaled(k, dw, K * N, 2), tol);
}

/* ------------------------------------------------------------------- add */

static dt_status run_add(rk *k, gcase *c) {
    const int64_t n = h_numel(c->ndim, c->shape);
    double *a = DMEM(k, n), *aa = DMEM(k, n), *b = DMEM(k, n), *ba = DMEM(k, n), *dy = DMEM(k, n),
           *dya = DMEM(k, n), *y = DMEM(k, n), *tol = DMEM(k, n);
    dt_tensor *ta, *tb, *tdy, *ty = NULL, *ga = NULL, *gb = NULL;
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed, 1.0, 0.0, -1, a, aa, &ta));
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed + 1, 1.0, 0.0, -1, b, ba, &tb));
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->dy, c->seed + 2, 1.0, 0.0, -1, dy, dya, &tdy));
    DT_TRY(dt_add(ta, tb, &ty));
    keep(k, ty);
    for (int64_t i = 0; i < n; i++) {
        y[i] = a[i] + b[i];
        aa[i] += ba[i];
    }
    fill_tol(tol, aa, n, (double)(partial_count(k, &c->out) + 1) * U32, 0, c->dtype,
             partial_count(k, &c->out), 1);
    DT_TRY(check_tensor(k, "out", ty, &c->out, c->ndim, c->shape, y, tol));

    /* the gradient passes through: dy exactly, and 2 dy (exact) added once more */
    DT_TRY(dt_add_backward(ta, tb, tdy, &ga, &gb));
    keep(k, ga);
    keep(k, gb);
    for (int64_t i = 0; i < n; i++) tol[i] = 0.0;
    DT_TRY(check_grad(k, "da", ga, &c->grad[0], ta, dy, tol));
    DT_TRY(check_grad(k, "db", gb, &c->grad[0], tb, dy, tol));
    dt_tensor *ga0 = ga, *gb0 = gb;
    DT_TRY(dt_add_backward(ta, tb, tdy, &ga, NULL));
    DT_TRY(dt_add_backward(ta, tb, tdy, NULL, &gb));
    check_same(k, "da", ga0, ga);
    check_same(k, "db", gb0, gb);
    double *dy2 = scaled(k, dy, n, 2);
    DT_TRY(check_tensor(k, "da added into", ga, &c->grad[0], c->ndim, c->shape, dy2, tol));
    return check_tensor(k, "db added into", gb, &c->grad[0], c->ndim, c->shape, dy2, tol);
}

/* ------------------------------------------------------------ gelu, swiglu */

static dt_status run_gelu(rk *k, gcase *c) {
    const int64_t n = h_numel(c->ndim, c->shape);
    const dt_gelu_approx ap = c->variant ? DT_GELU_TANH : DT_GELU_ERF;
    double *x = DMEM(k, n), *dy = DMEM(k, n), *y = DMEM(k, n), *ya = DMEM(k, n), *dx = DMEM(k, n),
           *dxa = DMEM(k, n), *tol = DMEM(k, n);
    dt_tensor *tx, *tdy, *ty = NULL, *gx = NULL;
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed, 3.0, 0.0, c->nan ? n / 3 : -1,
                  x, NULL, &tx));
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->dy, c->seed + 1, 1.0, 0.0,
                  c->nan ? 2 * n / 3 + 1 : -1, dy, NULL, &tdy));
    const double rel = is_cuda(c) ? 2e-5 : 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double mag;
        y[i] = ref_gelu(x[i], ap);
        ya[i] = fabs(y[i]);
        dx[i] = dy[i] * ref_gelu_grad(x[i], ap, &mag);
        dxa[i] = fabs(dy[i]) * mag;
    }
    DT_TRY(dt_gelu(tx, ap, &ty));
    keep(k, ty);
    fill_tol(tol, ya, n, rel, 1e-7, c->dtype, 1, 1);
    DT_TRY(check_tensor(k, "out", ty, &c->out, c->ndim, c->shape, y, tol));
    DT_TRY(dt_gelu_backward(tx, ap, tdy, &gx));
    keep(k, gx);
    fill_tol(tol, dxa, n, rel, 1e-12, c->dtype, 1, 1);
    DT_TRY(check_grad(k, "dx", gx, &c->grad[0], tx, dx, tol));
    dt_tensor *g0 = gx;
    DT_TRY(dt_gelu_backward(tx, ap, tdy, &gx));
    check_same(k, "dx", g0, gx);
    fill_tol(tol, dxa, n, rel, 1e-12, c->dtype, 1, 2);
    return check_tensor(k, "dx added into", gx, &c->grad[0], c->ndim, c->shape, scaled(k, dx, n, 2), tol);
}

static dt_status run_swiglu(rk *k, gcase *c) {
    const int64_t n = h_numel(c->ndim, c->shape);
    double *g = DMEM(k, n), *u = DMEM(k, n), *dy = DMEM(k, n), *y = DMEM(k, n), *ya = DMEM(k, n),
           *dg = DMEM(k, n), *dga = DMEM(k, n), *du = DMEM(k, n), *dua = DMEM(k, n),
           *tol = DMEM(k, n);
    dt_tensor *tg, *tu, *tdy, *ty = NULL, *gg = NULL, *gu = NULL;
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed, 3.0, 0.0, c->nan ? n / 3 : -1,
                  g, NULL, &tg));
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed + 1, 1.0, 0.0,
                  c->nan ? n / 2 : -1, u, NULL, &tu));
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->dy, c->seed + 2, 1.0, 0.0,
                  c->nan ? 2 * n / 3 + 1 : -1, dy, NULL, &tdy));
    const double rel = is_cuda(c) ? 2e-5 : 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double d, mag;
        const double s = ref_silu(g[i], &d, &mag);
        y[i] = s * u[i];
        ya[i] = fabs(y[i]);
        dg[i] = dy[i] * u[i] * d;
        dga[i] = fabs(dy[i] * u[i]) * mag;
        du[i] = dy[i] * s;
        dua[i] = fabs(du[i]);
    }
    DT_TRY(dt_swiglu(tg, tu, &ty));
    keep(k, ty);
    fill_tol(tol, ya, n, rel, 1e-7, c->dtype, 1, 1);
    DT_TRY(check_tensor(k, "out", ty, &c->out, c->ndim, c->shape, y, tol));
    DT_TRY(dt_swiglu_backward(tg, tu, tdy, &gg, &gu));
    keep(k, gg);
    keep(k, gu);
    fill_tol(tol, dga, n, rel, 1e-12, c->dtype, 1, 1);
    DT_TRY(check_grad(k, "dgate", gg, &c->grad[0], tg, dg, tol));
    fill_tol(tol, dua, n, rel, 1e-12, c->dtype, 1, 1);
    DT_TRY(check_grad(k, "dup", gu, &c->grad[0], tu, du, tol));
    dt_tensor *gg0 = gg, *gu0 = gu;
    DT_TRY(dt_swiglu_backward(tg, tu, tdy, &gg, NULL));
    DT_TRY(dt_swiglu_backward(tg, tu, tdy, NULL, &gu));
    check_same(k, "dgate", gg0, gg);
    check_same(k, "dup", gu0, gu);
    fill_tol(tol, dga, n, rel, 1e-12, c->dtype, 1, 2);
    DT_TRY(check_tensor(k, "dgate added into", gg, &c->grad[0], c->ndim, c->shape, scaled(k, dg, n, 2), tol));
    fill_tol(tol, dua, n, rel, 1e-12, c->dtype, 1, 2);
    return check_tensor(k, "dup added into", gu, &c->grad[0], c->ndim, c->shape, scaled(k, du, n, 2), tol);
}

/* --------------------------------------------------------------- reshape */

static dt_status run_reshape(rk *k, gcase *c) {
    const int64_t n = h_numel(c->ndim, c->shape);
    double *x = DMEM(k, n), *xa = DMEM(k, n), *dy = DMEM(k, n), *tol = DMEM(k, n);
    dt_tensor *tx, *tdy, *ty = NULL, *gx = NULL;
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed, 1.0, 0.0, -1, x, xa, &tx));
    DT_TRY(make_f(k, c->dtype, c->rndim, c->rshape, &c->dy, c->seed + 1, 1.0, 0.0, -1, dy, NULL, &tdy));
    /* a reshape keeps the global linear index: out = x, dx = dy */
    DT_TRY(dt_tensor_reshape(tx, c->rndim, c->rshape, &ty));
    keep(k, ty);
    /* Partial: the gather sums W summands, each addition rounded */
    const int wp = partial_count(k, &c->out);
    const double ud = c->dtype == DT_F32 ? 0.0 : h_half_ulp(c->dtype), sd = c->dtype == DT_F16 ? 0x1p-25 : 0;
    for (int64_t i = 0; i < n; i++) tol[i] = (double)(wp - 1) * ((U32 + ud) * xa[i] + sd);
    DT_TRY(check_tensor(k, "out", ty, &c->out, c->rndim, c->rshape, x, tol));
    DT_TRY(dt_tensor_reshape_backward(tx, tdy, &gx));
    keep(k, gx);
    for (int64_t i = 0; i < n; i++) tol[i] = 0.0;
    DT_TRY(check_grad(k, "dx", gx, &c->grad[0], tx, dy, tol));
    dt_tensor *g0 = gx;
    DT_TRY(dt_tensor_reshape_backward(tx, tdy, &gx));
    check_same(k, "dx", g0, gx);
    return check_tensor(k, "dx added into", gx, &c->grad[0], c->ndim, c->shape, scaled(k, dy, n, 2), tol);
}

/* --------------------------------------------------------------- rmsnorm */

static dt_status run_rmsnorm(rk *k, gcase *c) {
    const int64_t n = h_numel(c->ndim, c->shape), E = c->shape[c->ndim - 1], rows = n / E;
    const int has_w = c->variant;
    double *x = DMEM(k, n), *w = DMEM(k, E), *dy = DMEM(k, n), *y = DMEM(k, n), *ya = DMEM(k, n),
           *dx = DMEM(k, n), *dxa = DMEM(k, n), *dw = DMEM(k, E), *dwa = DMEM(k, E),
           *tol = DMEM(k, n);
    dt_tensor *tx, *tw = NULL, *tdy, *ty = NULL, *gx = NULL, *gw = NULL;
    const dt_layout wl = dt_layout_replicated(c->mesh_ndim);
    const int64_t ws[1] = {E};
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed, 2.0, 0.0, c->nan ? n / 3 : -1,
                  x, NULL, &tx));
    if (has_w) DT_TRY(make_f(k, c->dtype, 1, ws, &wl, c->seed + 1, 0.5, 1.0, -1, w, NULL, &tw));
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->dy, c->seed + 2, 1.0, 0.0,
                  c->nan ? n - E / 2 - 1 : -1, dy, NULL, &tdy));
    ref_rmsnorm(rows, E, x, has_w ? w : NULL, (double)EPS_NORM, dy, y, ya, dx, dxa, dw, dwa);
    DT_TRY(dt_rmsnorm(tx, tw, EPS_NORM, &ty));
    keep(k, ty);
    fill_tol(tol, ya, n, 1e-5, 1e-6, c->dtype, 1, 1);
    DT_TRY(check_tensor(k, "out", ty, &c->out, c->ndim, c->shape, y, tol));

    DT_TRY(dt_rmsnorm_backward(tx, tw, EPS_NORM, tdy, &gx, has_w ? &gw : NULL));
    keep(k, gx);
    keep(k, gw);
    const int wpw = partial_count(k, &c->grad[1]);
    const double relx = (double)(E + 8) * U32, relw = (double)(rows + wpw + 8) * U32;
    fill_tol(tol, dxa, n, relx, 0, c->dtype, 1, 1);
    DT_TRY(check_grad(k, "dx", gx, &c->grad[0], tx, dx, tol));
    if (has_w) {
        fill_tol(tol, dwa, E, relw, 0, c->dtype, wpw, 1);
        DT_TRY(check_grad(k, "dweight", gw, &c->grad[1], tw, dw, tol));
    }
    dt_tensor *gx0 = gx, *gw0 = gw;
    /* with a weight: both added into (one pass), then each alone: 3 times */
    const int times = has_w ? 3 : 2;
    if (has_w) {
        DT_TRY(dt_rmsnorm_backward(tx, tw, EPS_NORM, tdy, &gx, &gw));
        DT_TRY(dt_rmsnorm_backward(tx, tw, EPS_NORM, tdy, NULL, &gw));
        check_same(k, "dweight", gw0, gw);
        fill_tol(tol, dwa, E, relw, 0, c->dtype, wpw, 3);
        DT_TRY(check_tensor(k, "dweight added into twice", gw, &c->grad[1], 1, ws, scaled(k, dw, E, 3),
                            tol));
    }
    DT_TRY(dt_rmsnorm_backward(tx, tw, EPS_NORM, tdy, &gx, NULL));
    check_same(k, "dx", gx0, gx);
    fill_tol(tol, dxa, n, relx, 0, c->dtype, 1, times);
    return check_tensor(k, "dx added into", gx, &c->grad[0], c->ndim, c->shape, scaled(k, dx, n, times),
                        tol);
}

/* ---------------------------------------------------------------- rotary */

/* Document lengths for B rows of S tokens into lens (B S entries), their
 * count returned: docs 2, a list per row; docs 1, row 0's list alone, for
 * every row. Row b's lengths cycle through 1, S/2 + 1, 2 from step b mod 3,
 * the last cut to fit: documents of one token, and one across several
 * shards of a sharded sequence. */
static int64_t rot_docs(int docs, int64_t B, int64_t S, int64_t *lens) {
    int64_t n = 0;
    for (int64_t b = 0; b < (docs == 2 ? B : 1); b++)
        for (int64_t left = S, k = b; left > 0; k++) {
            const int64_t step = k % 3, want = step == 0 ? 1 : step == 1 ? S / 2 + 1 : 2;
            lens[n++] = want < left ? want : left;
            left -= lens[n - 1];
        }
    return n;
}

static dt_status run_rotary(rk *k, gcase *c) {
    const int64_t n = h_numel(c->ndim, c->shape);
    const int64_t B = c->shape[0], S = c->shape[1], D = c->shape[c->ndim - 1], H = n / (B * S * D);
    double *x = DMEM(k, n), *xa = DMEM(k, n), *dy = DMEM(k, n), *y = DMEM(k, n), *ya = DMEM(k, n),
           *dx = DMEM(k, n), *dxa = DMEM(k, n), *tol = DMEM(k, n);
    int64_t *pos = hmem(k, (size_t)(B * S) * sizeof(int64_t)), *lens = NULL, pos_stride = 0;
    for (int64_t s = 0; s < S; s++) pos[s] = 7 + 3 * (S - 1 - s); /* not monotone in s */
    dt_rotary_options o = DT_ROTARY_OPTIONS_INIT;
    o.style = c->variant ? DT_ROTARY_INTERLEAVED : DT_ROTARY_HALF;
    o.base = c->base;
    if (c->positions) o.positions = pos, o.n_positions = S;
    if (c->docs) {
        /* position of token s of row b: s - the first token of its document */
        lens = hmem(k, (size_t)(B * S) * sizeof(int64_t));
        o.doc_lens = lens;
        o.doc_count = rot_docs(c->docs, B, S, lens);
        pos_stride = S;
        for (int64_t b = 0, i = 0; b < B; b++) {
            if (c->docs == 1) i = 0;
            for (int64_t s = 0, start = 0; s < S; i++) {
                for (int64_t t = 0; t < lens[i]; t++, s++) pos[b * S + s] = s - start;
                start = s;
            }
        }
    }
    const int64_t *rpos = c->positions || c->docs ? pos : NULL;
    const double base = c->base > 0 ? c->base : 10000.0;
    dt_tensor *tx, *tdy, *ty = NULL, *gx = NULL;
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->in[0], c->seed, 1.0, 0.0, c->nan ? n / 3 : -1,
                  x, xa, &tx));
    DT_TRY(make_f(k, c->dtype, c->ndim, c->shape, &c->dy, c->seed + 1, 1.0, 0.0,
                  c->nan ? 2 * n / 3 + 1 : -1, dy, NULL, &tdy));
    ref_rotary(B, S, H, D, x, rpos, pos_stride, base, o.style, 1.0, y, NULL);
    ref_rotary(B, S, H, D, xa, rpos, pos_stride, base, o.style, 1.0, ya, ya); /* |a| + |b| */
    ref_rotary(B, S, H, D, dy, rpos, pos_stride, base, o.style, -1.0, dx, dxa);
    DT_TRY(dt_rotary(tx, &o, &ty));
    keep(k, ty);
    const int wp = partial_count(k, &c->out);
    fill_tol(tol, ya, n, (double)(wp + 8) * U32, 0, c->dtype, wp, 1);
    DT_TRY(check_tensor(k, "out", ty, &c->out, c->ndim, c->shape, y, tol));
    DT_TRY(dt_rotary_backward(tx, &o, tdy, &gx));
    keep(k, gx);
    fill_tol(tol, dxa, n, 8 * U32, 0, c->dtype, 1, 1);
    DT_TRY(check_grad(k, "dx", gx, &c->grad[0], tx, dx, tol));
    dt_tensor *g0 = gx;
    DT_TRY(dt_rotary_backward(tx, &o, tdy, &gx));
    check_same(k, "dx", g0, gx);
    fill_tol(tol, dxa, n, 8 * U32, 0, c->dtype, 1, 2);
    return check_tensor(k, "dx added into", gx, &c->grad[0], c->ndim, c->shape, scaled(k, dx, n, 2), tol);
}

/* ------------------------------------------------------------- embedding */

static int32_t token_of(uint64_t seed, int64_t g, int64_t V) {
    int64_t t = (int64_t)((dt_random_value(seed, (uint64_t)g) + 1.0f) * 0.5f * (float)V);
    return (int32_t)(t < 0 ? 0 : t >= V ? V - 1 : t);
}

static dt_status run_embed(rk *k, gcase *c) {
    const int64_t B = c->shape[0], S = c->shape[1], V = c->shape[2], E = c->shape[3], T = B * S;
    const int64_t ts[2] = {V, E}, ks[2] = {B, S}, ys[3] = {B, S, E};
    int32_t *tok = hmem(k, (size_t)T * sizeof(int32_t));
    for (int64_t g = 0; g < T; g++) tok[g] = token_of(c->seed + 5, g, V);
    if (T > 2) tok[T - 1] = tok[0]; /* a row hit twice */
    double *tab = DMEM(k, V * E), *dy = DMEM(k, T * E), *y = DMEM(k, T * E), *dt = DMEM(k, V * E),
           *dta = DMEM(k, V * E), *tol = DMEM(k, V * E + T * E);
    dt_tensor *tt, *tk, *tdy, *ty = NULL, *gt = NULL;
    DT_TRY(make_f(k, c->dtype, 2, ts, &c->in[0], c->seed, 1.0, 0.0,
                  c->nan ? (int64_t)tok[T / 2] * E + E - 1 : -1, tab, NULL, &tt));
    DT_TRY(make_i32(k, 2, ks, &c->in[1], tok, &tk));
    DT_TRY(make_f(k, c->dtype, 3, ys, &c->dy, c->seed + 2, 1.0, 0.0, c->nan ? (T / 3) * E : -1, dy,
                  NULL, &tdy));
    for (int64_t i = 0; i < T * E; i++) y[i] = tab[(int64_t)tok[i / E] * E + i % E];
    for (int64_t v = 0; v < V * E; v++) dt[v] = dta[v] = 0.0;
    for (int64_t i = 0; i < T; i++) {
        for (int64_t e = 0; e < E; e++) {
            dt[(int64_t)tok[i] * E + e] += dy[i * E + e];
            dta[(int64_t)tok[i] * E + e] += fabs(dy[i * E + e]);
        }
    }
    DT_TRY(dt_embedding(tt, tk, &ty));
    keep(k, ty);
    for (int64_t i = 0; i < T * E; i++) tol[i] = 0.0; /* a copy; Partial: the row plus zeros */
    DT_TRY(check_tensor(k, "out", ty, &c->out, 3, ys, y, tol));
    DT_TRY(dt_embedding_backward(tt, tk, tdy, &gt));
    keep(k, gt);
    const int wp = partial_count(k, &c->grad[0]);
    fill_tol(tol, dta, V * E, (double)(T + wp + 8) * U32, 0, c->dtype, wp, 1);
    DT_TRY(check_grad(k, "dtable", gt, &c->grad[0], tt, dt, tol));
    dt_tensor *g0 = gt;
    DT_TRY(dt_embedding_backward(tt, tk, tdy, &gt));
    check_same(k, "dtable", g0, gt);
    fill_tol(tol, dta, V * E, (double)(T + wp + 8) * U32, 0, c->dtype, wp, 2);
    return check_tensor(k, "dtable added into", gt, &c->grad[0], 2, ts, scaled(k, dt, V * E, 2), tol);
}

/* --------------------------------------------------------- cross-entropy */

/* Targets in [0, V), `ignore` at every 5th token and on the first half of
 * the first sequence: the ranks of a row split hold different counts. */
static void make_targets(int32_t *t, int64_t B, int64_t S, int64_t V, int32_t ignore, uint64_t seed) {
    for (int64_t g = 0; g < B * S; g++)
        t[g] = (g % 5 == 2 || g < S / 2) ? ignore : token_of(seed, g, V);
}

static dt_status run_ce(rk *k, gcase *c) {
    const int64_t B = c->shape[0], S = c->shape[1], V = c->shape[2], R = B * S;
    const int64_t xs[3] = {B, S, V}, ts[2] = {B, S};
    int32_t *tg = hmem(k, (size_t)R * sizeof(int32_t));
    make_targets(tg, B, S, V, c->ignore, c->seed + 9);
    int64_t nan_row = -1;
    for (int64_t r = 0; c->nan && r < R && nan_row < 0; r++)
        if (tg[r] != c->ignore && r > 0) nan_row = r;
    double *x = DMEM(k, R * V), *dx = DMEM(k, R * V), *dxa = DMEM(k, R * V), *tol = DMEM(k, R * V);
    dt_tensor *tx, *tt, *gx = NULL, *gx2 = NULL;
    DT_TRY(make_f(k, c->dtype, 3, xs, &c->in[0], c->seed, 3.0, 0.0, nan_row >= 0 ? nan_row * V + 1 : -1,
                  x, NULL, &tx));
    DT_TRY(make_i32(k, 2, ts, &c->in[1], tg, &tt));
    double lmag = 0;
    const double lref = ref_ce(R, V, x, tg, c->ignore, c->variant, dx, dxa, &lmag);
    dt_cross_entropy_options o = DT_CROSS_ENTROPY_OPTIONS_INIT;
    o.ignore_index = c->ignore;
    o.reduction = c->variant ? DT_LOSS_SUM : DT_LOSS_MEAN;
    float loss = -12345.0f;
    DT_TRY(dt_cross_entropy(tx, tt, &o, &loss, &gx));
    keep(k, gx);
    c->loss[k->r] = loss;
    const double lt = 1e-5 * lmag + 1e-7;
    if (!(isnan(lref) ? isnan(loss) : fabs((double)loss - lref) <= lt))
        flag(k, "loss %.9g, expected %.9g (bound %.3g)", (double)loss, lref, lt);
    fill_tol(tol, dxa, R * V, 2e-5, 0, c->dtype, 1, 1);
    DT_TRY(check_grad(k, "dlogits", gx, &c->grad[0], tx, dx, tol));

    /* dlogits alone: the same tensor bit for bit */
    DT_TRY(dt_cross_entropy(tx, tt, &o, NULL, &gx2));
    keep(k, gx2);
    if (checksum(gx2) != checksum(gx)) flag(k, "dlogits without the loss differ from dlogits with it");
    if (c->loss_only) {
        float l2 = -12345.0f;
        dt_status st = dt_cross_entropy(tx, tt, &o, &l2, NULL);
        if (st != DT_SUCCESS) flag(k, "the loss alone (dlogits NULL): %s: %s", dt_status_name(st), dt_last_error());
        else if (memcmp(&l2, &loss, sizeof loss) != 0)
            flag(k, "the loss alone %.9g differs from the loss with dlogits %.9g", (double)l2, (double)loss);
    }
    return DT_SUCCESS;
}

static dt_status rank_gcase(dt_context *ctx, void *arg) {
    gcase *c = arg;
    rk k;
    dt_status st = rk_init(&k, ctx, &c->res, c->mesh_ndim, c->mesh);
    if (st == DT_SUCCESS) {
        switch (c->op) {
        case OP_MATMUL: st = run_matmul(&k, c); break;
        case OP_ADD: st = run_add(&k, c); break;
        case OP_GELU: st = run_gelu(&k, c); break;
        case OP_SWIGLU: st = run_swiglu(&k, c); break;
        case OP_RESHAPE: st = run_reshape(&k, c); break;
        case OP_RMSNORM: st = run_rmsnorm(&k, c); break;
        case OP_ROTARY: st = run_rotary(&k, c); break;
        case OP_EMBED: st = run_embed(&k, c); break;
        case OP_CE: st = run_ce(&k, c); break;
        default: st = dt_error(DT_ERR_INTERNAL, "unknown op %d", (int)c->op);
        }
    }
    rk_done(&k);
    return st;
}

/* Whether `world` ranks can run on (backend, local) here, asked once per
 * world size; *why gets the reason when not. */
static int backend_usable(dt_backend_kind backend, int world, const char **why) {
    static int known[DT_BACKEND_KIND_COUNT][MAXW + 1];
    static char reason[DT_BACKEND_KIND_COUNT][MAXW + 1][640];
    backend = be_of(backend);
    if (world < 1 || world > MAXW) world = 1;
    if (!known[backend][world])
        known[backend][world] = h_pair_available(world, backend, DT_TRANSPORT_LOCAL, reason[backend][world],
                                                 sizeof reason[backend][world]) ? 1 : -1;
    *why = reason[backend][world];
    return known[backend][world] > 0;
}

#define REQUIRE_BACKEND(backend, world)                                       \
    do {                                                                      \
        const char *why_ = NULL;                                              \
        if (!backend_usable((backend), (world), &why_)) {                     \
            print_message("skipped: %s\n", why_);                             \
            skip();                                                           \
            return;                                                           \
        }                                                                     \
    } while (0)

/* Launches fn over the case's world and asserts no rank recorded a failure. */
static void launch_and_assert(dt_backend_kind backend, int world, dt_rank_fn fn, void *arg, res *rs) {
    memset(rs, 0, sizeof *rs);
    dt_status st = h_launch_on(world, be_of(backend), DT_TRANSPORT_LOCAL, fn, arg);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s: %s\n", dt_status_name(st), dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < world; r++) {
        if (rs->fails[r]) fprintf(stderr, "  rank %d: %ld failed checks, the first: %s\n", r, rs->fails[r],
                                  rs->why[r]);
        assert_int_equal(rs->fails[r], 0);
    }
}

static void test_gcase(void **state) {
    gcase *c = *state;
    const int world = c->world > 0 ? c->world : 1;
    REQUIRE_BACKEND(c->backend, world);
    launch_and_assert(c->backend, world, rank_gcase, c, &c->res);
    if (c->op == OP_CE)
        for (int r = 1; r < world; r++) {
            if (memcmp(&c->loss[r], &c->loss[0], sizeof(float)) != 0)
                fprintf(stderr, "  loss %.9g on rank %d, %.9g on rank 0\n", (double)c->loss[r], r,
                        (double)c->loss[0]);
            assert_memory_equal(&c->loss[r], &c->loss[0], sizeof(float));
        }
}

/* ====================================================== finite differences
 * Each reference backward against central differences of its reference
 * forward, on the main thread (no library call): the parameters p (all
 * inputs, concatenated) in double, L(p) = sum(dy * y) (cross-entropy: dl *
 * loss), |(L(p + h e_i) - L(p - h e_i)) / 2h - dL/dp_i| <= 1e-6 (1 + |dL/dp_i|)
 * with h = 1e-5 (truncation h^2 |L'''| and rounding 1e-16 |L| / h are both
 * far below it). */

typedef enum fd_kind {
    FD_MATMUL, FD_ADD, FD_GELU_ERF, FD_GELU_TANH, FD_SWIGLU, FD_RESHAPE, FD_RMSNORM, FD_RMSNORM_NO_W,
    FD_ROTARY_HALF, FD_ROTARY_INTERLEAVED, FD_EMBED, FD_CE_MEAN, FD_CE_SUM, FD_KIND_COUNT
} fd_kind;

static const char *const k_fd_names[FD_KIND_COUNT] = {
    "matmul/x=[3,4],w=[4,5]", "add/[6]", "gelu/erf,[16]", "gelu/tanh,[16]", "swiglu/[12]",
    "reshape/[3,4]->[12]", "rmsnorm/weight,[3,5]", "rmsnorm/no weight,[3,5]",
    "rotary/half,x=[1,4,2,6],positions,base=100", "rotary/interleaved,x=[1,4,2,6],positions,base=100",
    "embedding/table=[5,3],7 tokens with repeats", "cross_entropy/mean,[6,5],one target ignored",
    "cross_entropy/sum,[6,5],one target ignored",
};

typedef struct fdc {
    fd_kind kind;
    int64_t np, ny;     /* parameters, outputs */
    double p[64], dy[64];
    int32_t idx[8];     /* embedding tokens; CE targets */
    int64_t pos[4];
} fdc;

static void fd_setup(fdc *f, fd_kind kind) {
    memset(f, 0, sizeof *f);
    f->kind = kind;
    static const int64_t np[FD_KIND_COUNT] = {32, 12, 16, 16, 24, 12, 20, 15, 48, 48, 15, 30, 30};
    static const int64_t ny[FD_KIND_COUNT] = {15, 6, 16, 16, 12, 12, 15, 15, 48, 48, 21, 1, 1};
    f->np = np[kind];
    f->ny = ny[kind];
    const double sc = (kind == FD_GELU_ERF || kind == FD_GELU_TANH || kind == FD_SWIGLU || kind >= FD_CE_MEAN)
                          ? 3.0 : 1.0;
    for (int64_t i = 0; i < f->np; i++) f->p[i] = sc * dt_random_value(500 + (uint64_t)kind, (uint64_t)i);
    for (int64_t i = 0; i < f->ny; i++) f->dy[i] = dt_random_value(600 + (uint64_t)kind, (uint64_t)i);
    if (kind == FD_RMSNORM)
        for (int i = 15; i < 20; i++) f->p[i] = 1.0 + 0.5 * f->p[i];
    static const int32_t toks[7] = {3, 0, 3, 4, 1, 3, 0};
    static const int32_t tgts[6] = {1, 4, -1, 0, 2, 4};
    memcpy(f->idx, kind == FD_EMBED ? toks : tgts, kind == FD_EMBED ? sizeof toks : sizeof tgts);
    static const int64_t pos[4] = {5, 0, 9, 2};
    memcpy(f->pos, pos, sizeof pos);
}

/* L(p) and, when g is not NULL, the reference gradient dL/dp. */
static double fd_eval(const fdc *f, const double *p, double *g) {
    double y[64], d[64], d2[64], a[64], a2[64], L = 0;
    int64_t ny = f->ny;
    switch (f->kind) {
    case FD_MATMUL:
        ref_matmul(3, 4, 5, p, p, p + 12, p + 12, y, NULL);
        if (g) ref_matmul_bwd(3, 4, 5, p, NULL, p + 12, NULL, f->dy, g, NULL, g + 12, NULL);
        break;
    case FD_ADD:
        for (int i = 0; i < 6; i++) y[i] = p[i] + p[6 + i];
        for (int i = 0; g && i < 6; i++) g[i] = g[6 + i] = f->dy[i];
        break;
    case FD_GELU_ERF:
    case FD_GELU_TANH: {
        const dt_gelu_approx ap = f->kind == FD_GELU_ERF ? DT_GELU_ERF : DT_GELU_TANH;
        for (int i = 0; i < 16; i++) {
            y[i] = ref_gelu(p[i], ap);
            if (g) g[i] = f->dy[i] * ref_gelu_grad(p[i], ap, NULL);
        }
        break;
    }
    case FD_SWIGLU:
        for (int i = 0; i < 12; i++) {
            double ds;
            const double s = ref_silu(p[i], &ds, NULL);
            y[i] = s * p[12 + i];
            if (g) g[i] = f->dy[i] * p[12 + i] * ds, g[12 + i] = f->dy[i] * s;
        }
        break;
    case FD_RESHAPE:
        for (int i = 0; i < 12; i++) y[i] = p[i];
        for (int i = 0; g && i < 12; i++) g[i] = f->dy[i];
        break;
    case FD_RMSNORM:
    case FD_RMSNORM_NO_W: {
        const double *w = f->kind == FD_RMSNORM ? p + 15 : NULL;
        ref_rmsnorm(3, 5, p, w, 1e-5, f->dy, y, NULL, d, a, d2, a2);
        for (int i = 0; g && i < 15; i++) g[i] = d[i];
        for (int i = 0; g && w && i < 5; i++) g[15 + i] = d2[i];
        break;
    }
    case FD_ROTARY_HALF:
    case FD_ROTARY_INTERLEAVED: {
        const dt_rotary_style st = f->kind == FD_ROTARY_HALF ? DT_ROTARY_HALF : DT_ROTARY_INTERLEAVED;
        ref_rotary(1, 4, 2, 6, p, f->pos, 0, 100.0, st, 1.0, y, NULL);
        if (g) ref_rotary(1, 4, 2, 6, f->dy, f->pos, 0, 100.0, st, -1.0, g, NULL);
        break;
    }
    case FD_EMBED:
        for (int t = 0; t < 7; t++)
            for (int e = 0; e < 3; e++) y[t * 3 + e] = p[f->idx[t] * 3 + e];
        for (int i = 0; g && i < 15; i++) g[i] = 0.0;
        for (int t = 0; g && t < 7; t++)
            for (int e = 0; e < 3; e++) g[f->idx[t] * 3 + e] += f->dy[t * 3 + e];
        break;
    case FD_CE_MEAN:
    case FD_CE_SUM:
        y[0] = ref_ce(6, 5, p, f->idx, -1, f->kind == FD_CE_SUM, g ? d : NULL, a, NULL);
        for (int i = 0; g && i < 30; i++) g[i] = f->dy[0] * d[i];
        break;
    default:
        ny = 0;
    }
    for (int64_t i = 0; i < ny; i++) L += f->dy[i] * y[i];
    return L;
}

static void test_fd(void **state) {
    fdc f;
    fd_setup(&f, (fd_kind)(intptr_t)*state);
    double p[64], g[64];
    memcpy(p, f.p, sizeof p);
    fd_eval(&f, p, g);
    long bad = 0;
    for (int64_t i = 0; i < f.np; i++) {
        const double h = 1e-5, keep_p = p[i];
        p[i] = keep_p + h;
        const double lp = fd_eval(&f, p, NULL);
        p[i] = keep_p - h;
        const double lm = fd_eval(&f, p, NULL);
        p[i] = keep_p;
        const double fd = (lp - lm) / (2 * h);
        if (!(fabs(fd - g[i]) <= 1e-6 * (1.0 + fabs(g[i])))) {
            if (bad++ < 4)
                fprintf(stderr, "  %s: dL/dp[%" PRId64 "] finite differences %.12g, analytic %.12g\n",
                        k_fd_names[f.kind], i, fd, g[i]);
        }
    }
    assert_int_equal(bad, 0);
}

/* ================================================================== errors */

typedef enum err_kind {
    E_OPS,          /* matmul, add, gelu, swiglu backward */
    E_NN,           /* reshape, rmsnorm, rotary backward */
    E_EMBED_CE,     /* embedding, cross-entropy, grad_reduce */
    E_OPTIM,        /* adamw, sum_squares, convert */
    E_RESHAPE_MSG,  /* reshape_backward names the Layout dy needs */
    E_ZERO,         /* a zero-size vocabulary or embedding dim */
    E_CE_ONE_RANK,  /* a bad target on one rank of a row split: every rank fails */
    E_CE_ONE_RANK_2D,
    E_KIND_COUNT
} err_kind;

typedef struct ecase {
    err_kind kind;
    dt_backend_kind backend;
    int mesh_ndim, mesh[2], world;
    int checked[MAXW];
    res res;
} ecase;

#define ANY_FAIL ((dt_status)-1)

/* A rejected call: `want` (ANY_FAIL: any failure), a message holding
 * `text` (NULL: not checked), no output handle written. */
static void rej_check(rk *k, int line, dt_status want, const char *text, dt_status got, int wrote) {
    const char *msg = dt_last_error();
    if (got == DT_SUCCESS || (want != ANY_FAIL && got != want))
        flag(k, "line %d: %s (%s), expected %s", line, dt_status_name(got), got ? msg : "no message",
             want == ANY_FAIL ? "a failure" : dt_status_name(want));
    else if (text && !strstr(msg, text))
        flag(k, "line %d: the message '%s' lacks '%s'", line, msg, text);
    if (wrote && got != DT_SUCCESS) flag(k, "line %d: a rejected call wrote an output handle", line);
}

#define REJ(want, text, expr)                                                             \
    do {                                                                                  \
        o1 = o2 = NULL;                                                                   \
        dt_status s_ = (expr);                                                            \
        rej_check(k, __LINE__, (want), (text), s_, o1 != NULL || o2 != NULL);             \
        if (s_ == DT_SUCCESS) dt_tensor_destroy(o1), dt_tensor_destroy(o2);               \
        e->checked[k->r]++;                                                               \
    } while (0)

#define MK(var, dt, nd, shp, lay, seed)                                                   \
    do {                                                                                  \
        const int64_t s__[] = shp;                                                        \
        DT_TRY(make_f(k, (dt), (nd), s__, (lay), (seed), 1.0, 0.0, -1, NULL, NULL, &var)); \
    } while (0)
#define SHAPE(...) {__VA_ARGS__}

static dt_status err_ops(rk *k, ecase *e) {
    dt_tensor *o1, *o2, *xr, *xk, *xs, *xp, *wr, *wc, *wrow, *dyr, *dys, *dyp, *dy5, *accR, *accT, *accB,
        *dyxr, *dyxs, *dyx7, *accS;
    const dt_layout R = dt_layout_1d(dt_replicate()), Pa = dt_layout_1d(dt_partial());
    const dt_layout S2 = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS)),
                    S1 = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS)),
                    W1 = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS)),
                    W0 = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    MK(xr, DT_F32, 3, SHAPE(2, 4, 8), &R, 1);
    MK(xk, DT_F32, 3, SHAPE(2, 4, 8), &S2, 1);
    MK(xs, DT_F32, 3, SHAPE(2, 4, 8), &S1, 1);
    MK(xp, DT_F32, 3, SHAPE(2, 4, 8), &Pa, 1);
    MK(wr, DT_F32, 2, SHAPE(8, 6), &R, 2);
    MK(wc, DT_F32, 2, SHAPE(8, 6), &W1, 2);
    MK(wrow, DT_F32, 2, SHAPE(8, 6), &W0, 2);
    MK(dyr, DT_F32, 3, SHAPE(2, 4, 6), &R, 3);
    MK(dys, DT_F32, 3, SHAPE(2, 4, 6), &S1, 3);
    MK(dyp, DT_F32, 3, SHAPE(2, 4, 6), &Pa, 3);
    MK(dy5, DT_F32, 3, SHAPE(2, 4, 5), &R, 3);
    MK(accR, DT_F32, 2, SHAPE(8, 6), &R, 4);   /* dw of a sequence-sharded x is Partial */
    MK(accT, DT_F32, 2, SHAPE(6, 8), &Pa, 4);  /* the transposed shape */
    MK(accB, DT_BF16, 2, SHAPE(8, 6), &Pa, 4); /* another dtype */
    MK(dyxr, DT_F32, 3, SHAPE(2, 4, 8), &R, 5);
    MK(dyxs, DT_F32, 3, SHAPE(2, 4, 8), &S1, 5);
    MK(dyx7, DT_F32, 3, SHAPE(2, 4, 7), &R, 5);
    MK(accS, DT_F32, 3, SHAPE(2, 4, 8), &S1, 6);
    const int nt = k->nt;
    uint64_t before[96];
    for (int i = 0; i < nt; i++) before[i] = checksum(k->t[i]);
    dt_tensor *accR0 = accR, *accT0 = accT, *accB0 = accB, *accS0 = accS;

    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Shard(2, contiguous)]",
        dt_matmul_backward(xr, wc, dyr, &o1, &o2));   /* column-parallel: dy is Shard(last) */
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Replicate]",
        dt_matmul_backward(xk, wrow, dyp, &o1, &o2)); /* row-parallel: dy Replicate, not Partial */
    REJ(DT_ERR_INVALID_ARGUMENT, "must have the shape of x", dt_matmul_backward(xr, wr, dy5, &o1, &o2));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute w to [Shard(0, contiguous)]",
        dt_matmul_backward(xk, wr, dyr, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "dw to accumulate into", dt_matmul_backward(xs, wr, dys, &o1, &accR));
    REJ(DT_ERR_INVALID_ARGUMENT, "dw to accumulate into", dt_matmul_backward(xs, wr, dys, &o1, &accT));
    REJ(DT_ERR_INVALID_ARGUMENT, "bf16", dt_matmul_backward(xs, wr, dys, &o1, &accB));
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_matmul_backward(xr, wr, NULL, &o1, &o2));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Replicate]", dt_add_backward(xr, xr, dyxs, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "must have a's shape", dt_add_backward(xr, xr, dyx7, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "equal shapes and Layouts", dt_add_backward(xr, xs, dyxr, &o1, &o2));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute x to [Replicate]", dt_gelu_backward(xp, DT_GELU_ERF, dyxr, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Shard(1, contiguous)]",
        dt_gelu_backward(xs, DT_GELU_TANH, dyxr, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "unknown approximation 7", dt_gelu_backward(xr, (dt_gelu_approx)7, dyxr, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute gate to [Replicate]", dt_swiglu_backward(xp, xp, dyxr, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "one shape and one Layout", dt_swiglu_backward(xr, xs, dyxr, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "both be new or both be added into",
        dt_swiglu_backward(xs, xs, dyxs, &o1, &accS));
    REJ(DT_ERR_INVALID_ARGUMENT, "must have gate's shape", dt_swiglu_backward(xr, xr, dyx7, &o1, &o2));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Shard(1, contiguous)]",
        dt_swiglu_backward(xs, xs, dyxr, &o1, &o2));

    if (accR != accR0 || accT != accT0 || accB != accB0 || accS != accS0)
        flag(k, "a rejected call replaced a gradient to add into");
    for (int i = 0; i < nt; i++)
        if (checksum(k->t[i]) != before[i]) flag(k, "tensor %d (an input or a gradient) changed", i);
    return DT_SUCCESS;
}

static dt_status err_nn(rk *k, ecase *e) {
    dt_tensor *o1, *o2, *x3r, *x3s, *x3k, *x3p, *wE, *w7, *dy3r, *dy3s, *accE, *dy4r, *dy4b, *dy72,
        *x4, *x4k, *x7, *dy7, *dy4x, *dy4s, *acc4s;
    const dt_layout R = dt_layout_1d(dt_replicate()), Pa = dt_layout_1d(dt_partial());
    const dt_layout S1 = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS)),
                    S2 = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS)),
                    S1s = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED)),
                    S3 = dt_layout_1d(dt_shard(3, DT_ORDER_CONTIGUOUS));
    MK(x3r, DT_F32, 3, SHAPE(2, 4, 8), &R, 1);
    MK(x3s, DT_F32, 3, SHAPE(2, 4, 8), &S1, 1);
    MK(x3k, DT_F32, 3, SHAPE(2, 4, 8), &S2, 1);
    MK(x3p, DT_F32, 3, SHAPE(2, 4, 8), &Pa, 1);
    MK(wE, DT_F32, 1, SHAPE(8), &R, 2);
    MK(w7, DT_F32, 1, SHAPE(7), &R, 2);
    MK(dy3r, DT_F32, 3, SHAPE(2, 4, 8), &R, 3);
    MK(dy3s, DT_F32, 3, SHAPE(2, 4, 8), &S1, 3);
    MK(accE, DT_F32, 1, SHAPE(8), &R, 4);     /* dweight of a sharded x is Partial */
    MK(dy4r, DT_F32, 4, SHAPE(2, 4, 2, 4), &R, 5);
    MK(dy4b, DT_BF16, 4, SHAPE(2, 4, 2, 4), &S1, 5);
    MK(dy72, DT_F32, 4, SHAPE(2, 4, 3, 3), &S1, 5); /* 72 elements, not 64 */
    MK(x4, DT_F32, 4, SHAPE(2, 4, 2, 4), &S1s, 6);
    MK(x4k, DT_F32, 4, SHAPE(2, 4, 2, 4), &S3, 6);
    MK(x7, DT_F32, 3, SHAPE(2, 4, 7), &R, 7);
    MK(dy7, DT_F32, 3, SHAPE(2, 4, 7), &R, 7);
    MK(dy4x, DT_F32, 4, SHAPE(2, 4, 2, 2), &S1s, 8);
    MK(dy4s, DT_F32, 4, SHAPE(2, 4, 2, 4), &S1s, 9);
    MK(acc4s, DT_F32, 4, SHAPE(2, 4, 2, 4), &S1s, 10); /* x4's dx to add into */
    const int nt = k->nt;
    uint64_t before[96];
    for (int i = 0; i < nt; i++) before[i] = checksum(k->t[i]);
    dt_tensor *accE0 = accE, *acc4s0 = acc4s;
    const int64_t pos3[3] = {0, 1, 2}, posneg[4] = {0, 1, -2, 3}, pos4[4] = {0, 1, 2, 3};
    dt_rotary_options o3 = DT_ROTARY_OPTIONS_INIT, oneg = DT_ROTARY_OPTIONS_INIT;
    o3.positions = pos3, o3.n_positions = 3;
    oneg.positions = posneg, oneg.n_positions = 4;
    /* documents of x4 [2, 4, 2, 4] (S = 4, B = 2) that dt_rotary refuses */
    const int64_t d_sum3[2] = {2, 1}, d_zero[3] = {2, 0, 2}, d_cross[3] = {3, 2, 3}, d_ok[2] = {1, 3};
    dt_rotary_options od_sum = DT_ROTARY_OPTIONS_INIT, od_zero = DT_ROTARY_OPTIONS_INIT,
                      od_cross = DT_ROTARY_OPTIONS_INIT, od_null = DT_ROTARY_OPTIONS_INIT,
                      od_pos = DT_ROTARY_OPTIONS_INIT;
    od_sum.doc_lens = d_sum3, od_sum.doc_count = 2;
    od_zero.doc_lens = d_zero, od_zero.doc_count = 3;
    od_cross.doc_lens = d_cross, od_cross.doc_count = 3;
    od_null.doc_count = 2;
    od_pos.doc_lens = d_ok, od_pos.doc_count = 2, od_pos.positions = pos4, od_pos.n_positions = 4;

    REJ(DT_ERR_NOT_SUPPORTED, "redistribute x to [Replicate]",
        dt_rmsnorm_backward(x3k, wE, EPS_NORM, dy3r, &o1, &o2)); /* the last dim sharded */
    REJ(DT_ERR_NOT_SUPPORTED, "not linear", dt_rmsnorm_backward(x3p, NULL, EPS_NORM, dy3r, &o1, NULL));
    REJ(DT_ERR_INVALID_ARGUMENT, "without a weight", dt_rmsnorm_backward(x3r, NULL, EPS_NORM, dy3r, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "weight must be [8]", dt_rmsnorm_backward(x3r, w7, EPS_NORM, dy3r, &o1, &o2));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Shard(1, contiguous)]",
        dt_rmsnorm_backward(x3s, wE, EPS_NORM, dy3r, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "dweight to accumulate into",
        dt_rmsnorm_backward(x3s, wE, EPS_NORM, dy3s, &o1, &accE));
    REJ(DT_ERR_INVALID_ARGUMENT, "eps", dt_rmsnorm_backward(x3r, wE, -1.0f, dy3r, &o1, &o2));
    REJ(DT_ERR_INVALID_ARGUMENT, "must have x's shape", dt_rmsnorm_backward(x3r, wE, EPS_NORM, dy7, &o1, &o2));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Shard(1, striped)]", dt_rotary_backward(x4, NULL, dy4r, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute x to [Replicate]", dt_rotary_backward(x4k, NULL, dy4r, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "must be even", dt_rotary_backward(x7, NULL, dy7, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "3 positions", dt_rotary_backward(x4, &o3, dy4x, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "negative", dt_rotary_backward(x4, &oneg, dy4x, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "must have x's shape", dt_rotary_backward(x4, NULL, dy4x, &o1));
    /* documents: refused before anything is made or added into */
    const dt_rotary_options *od[5] = {&od_sum, &od_zero, &od_cross, &od_null, &od_pos};
    const char *od_msg[5] = {"document lengths sum to 3, not S = 4", "document 1 has length 0",
                             "crosses the end of batch row 0", "both or neither",
                             "positions and documents (doc_lens) are both given"};
    for (int i = 0; i < 5; i++) {
        REJ(DT_ERR_INVALID_ARGUMENT, od_msg[i], dt_rotary(x4, od[i], &o1));
        REJ(DT_ERR_INVALID_ARGUMENT, od_msg[i], dt_rotary_backward(x4, od[i], dy4s, &o1));
        REJ(DT_ERR_INVALID_ARGUMENT, od_msg[i], dt_rotary_backward(x4, od[i], dy4s, &acc4s));
    }
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_tensor_reshape_backward(x3s, dy72, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "dtype", dt_tensor_reshape_backward(x3s, dy4b, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, NULL, dt_tensor_reshape_backward(x3s, dy4r, &o1)); /* dy must be Shard(1) */

    if (accE != accE0 || acc4s != acc4s0) flag(k, "a rejected call replaced a gradient to add into");
    for (int i = 0; i < nt; i++)
        if (checksum(k->t[i]) != before[i]) flag(k, "tensor %d (an input or a gradient) changed", i);
    return DT_SUCCESS;
}

static dt_status err_embed_ce(rk *k, ecase *e) {
    dt_tensor *o1, *o2, *tabV, *tabR, *tabVs, *tokR, *tokS, *tokBad, *tokF, *dyP, *dyR, *dy5, *accT,
        *lgR, *lgVs, *lgP, *lgS1, *tg, *tg3, *accL, *other = NULL, *loc = NULL;
    const dt_layout R = dt_layout_1d(dt_replicate()), Pa = dt_layout_1d(dt_partial());
    const dt_layout V0 = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)),
                    V0s = dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED)),
                    S1 = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS)),
                    S2s = dt_layout_1d(dt_shard(2, DT_ORDER_STRIPED));
    const int64_t ks[2] = {2, 4}, ks3[2] = {2, 3};
    int32_t tok[8] = {1, 7, 0, 3, 3, 5, 2, 6}, bad[8] = {1, 7, 0, 3, 8, 5, 2, 6};
    MK(tabV, DT_F32, 2, SHAPE(8, 4), &V0, 1);
    MK(tabR, DT_F32, 2, SHAPE(8, 4), &R, 1);
    MK(tabVs, DT_F32, 2, SHAPE(8, 4), &V0s, 1);
    DT_TRY(make_i32(k, 2, ks, &R, tok, &tokR));
    DT_TRY(make_i32(k, 2, ks, &S1, tok, &tokS));
    DT_TRY(make_i32(k, 2, ks, &R, bad, &tokBad));
    MK(tokF, DT_F32, 2, SHAPE(2, 4), &R, 2);
    MK(dyP, DT_F32, 3, SHAPE(2, 4, 4), &Pa, 3);
    MK(dyR, DT_F32, 3, SHAPE(2, 4, 4), &R, 3);
    MK(dy5, DT_F32, 3, SHAPE(2, 4, 5), &R, 3);
    MK(accT, DT_F32, 2, SHAPE(8, 4), &R, 4); /* a vocab-parallel dtable is Shard(0) */
    MK(lgR, DT_F32, 3, SHAPE(2, 4, 6), &R, 5);
    MK(lgVs, DT_F32, 3, SHAPE(2, 4, 6), &S2s, 5);
    MK(lgP, DT_F32, 3, SHAPE(2, 4, 6), &Pa, 5);
    MK(lgS1, DT_F32, 3, SHAPE(2, 4, 6), &S1, 5);
    int32_t t6[8] = {0, 5, -1, 2, 3, 1, 4, -1};
    DT_TRY(make_i32(k, 2, ks, &R, t6, &tg));
    DT_TRY(make_i32(k, 2, ks3, &R, t6, &tg3));
    MK(accL, DT_F32, 3, SHAPE(2, 4, 6), &R, 6);
    /* another mesh of the same sizes, and a local tensor */
    dt_mesh *mesh_b = NULL;
    DT_TRY(dt_mesh_create(k->ctx, k->nd, k->ms, NULL, &mesh_b));
    const int64_t s84[2] = {8, 4};
    dt_status st = dt_tensor_create(k->ctx, mesh_b, DT_F32, 2, s84, &R, &other);
    if (st == DT_SUCCESS) st = dt_tensor_create(k->ctx, NULL, DT_F32, 2, s84, NULL, &loc);
    if (st != DT_SUCCESS) {
        dt_tensor_destroy(other);
        dt_mesh_destroy(mesh_b);
        return st;
    }
    const int nt = k->nt;
    uint64_t before[96];
    for (int i = 0; i < nt; i++) before[i] = checksum(k->t[i]);
    dt_tensor *accT0 = accT, *accL0 = accL;
    float loss = -12345.0f;
    dt_cross_entropy_options bad_red = DT_CROSS_ENTROPY_OPTIONS_INIT;
    bad_red.reduction = (dt_loss_reduction)7;

    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Replicate]", dt_embedding_backward(tabV, tokR, dyP, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "must have the output's shape", dt_embedding_backward(tabR, tokR, dy5, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "outside [0, 8)", dt_embedding_backward(tabR, tokBad, dyR, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "outside [0, 8)", dt_embedding(tabR, tokBad, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, "contiguous", dt_embedding(tabVs, tokR, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, "contiguous", dt_embedding_backward(tabVs, tokR, dyR, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "i32", dt_embedding_backward(tabR, tokF, dyR, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "dtable to accumulate into", dt_embedding_backward(tabV, tokR, dyR, &accT));
    REJ(DT_ERR_NOT_SUPPORTED, "both sharded", dt_embedding_backward(tabV, tokS, dyR, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "without the last dim", dt_cross_entropy(lgR, tg3, NULL, &loss, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, "each mesh dim must split", dt_cross_entropy(lgS1, tg, NULL, &loss, &o1));
    REJ(DT_ERR_NOT_SUPPORTED, NULL, dt_cross_entropy(lgVs, tg, NULL, &loss, &o1)); /* striped vocabulary */
    REJ(DT_ERR_NOT_SUPPORTED, NULL, dt_cross_entropy(lgP, tg, NULL, &loss, &o1));  /* Partial logits */
    REJ(DT_ERR_INVALID_ARGUMENT, "*dlogits must be NULL", dt_cross_entropy(lgR, tg, NULL, &loss, &accL));
    REJ(DT_ERR_INVALID_ARGUMENT, "unknown reduction", dt_cross_entropy(lgR, tg, &bad_red, &loss, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "local", dt_tensor_grad_reduce(loc, loc, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, "different meshes", dt_tensor_grad_reduce(other, tabR, &o1));
    if (loss != -12345.0f) flag(k, "a rejected dt_cross_entropy wrote the loss (%g)", (double)loss);

    if (accT != accT0 || accL != accL0) flag(k, "a rejected call replaced a gradient to add into");
    for (int i = 0; i < nt; i++)
        if (checksum(k->t[i]) != before[i]) flag(k, "tensor %d (an input or a gradient) changed", i);
    dt_tensor_destroy(other);
    dt_tensor_destroy(loc);
    dt_mesh_destroy(mesh_b);
    return DT_SUCCESS;
}

static dt_status err_optim(rk *k, ecase *e) {
    dt_tensor *o1, *o2, *p, *m, *v, *g, *gP, *gR, *pb, *gb, *mb;
    const dt_layout S0 = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)), Pa = dt_layout_1d(dt_partial()),
                    R = dt_layout_1d(dt_replicate());
    MK(p, DT_F32, 2, SHAPE(4, 6), &S0, 1);
    MK(m, DT_F32, 2, SHAPE(4, 6), &S0, 2);
    MK(v, DT_F32, 2, SHAPE(4, 6), &S0, 3);
    MK(g, DT_F32, 2, SHAPE(4, 6), &S0, 4);
    MK(gP, DT_F32, 2, SHAPE(4, 6), &Pa, 4);
    MK(gR, DT_F32, 2, SHAPE(4, 6), &R, 4);
    MK(pb, DT_BF16, 2, SHAPE(4, 6), &S0, 1);
    MK(gb, DT_BF16, 2, SHAPE(4, 6), &S0, 4);
    MK(mb, DT_BF16, 2, SHAPE(4, 6), &S0, 2);
    const int nt = k->nt;
    uint64_t before[96];
    for (int i = 0; i < nt; i++) before[i] = checksum(k->t[i]);
    dt_adamw_options bad_lr = DT_ADAMW_OPTIONS_INIT, bad_b1 = DT_ADAMW_OPTIONS_INIT;
    bad_lr.lr = NAN;
    bad_b1.beta1 = 1.0f;
    double ss = -1.0;

    o1 = o2 = NULL;
    REJ(DT_ERR_INVALID_ARGUMENT, "dt_tensor_grad_reduce", dt_adamw_step(p, NULL, m, v, gP, 1.0f, NULL, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "must have param's shape and Layout", dt_adamw_step(p, NULL, m, v, gR, 1.0f, NULL, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "master", dt_adamw_step(pb, NULL, m, v, gb, 1.0f, NULL, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "m is bf16", dt_adamw_step(p, NULL, mb, v, g, 1.0f, NULL, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "grad is bf16", dt_adamw_step(p, NULL, m, v, gb, 1.0f, NULL, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "step 0", dt_adamw_step(p, NULL, m, v, g, 1.0f, NULL, 0));
    REJ(DT_ERR_INVALID_ARGUMENT, "grad_scale", dt_adamw_step(p, NULL, m, v, g, 0.0f, NULL, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "grad_scale", dt_adamw_step(p, NULL, m, v, g, NAN, NULL, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "options", dt_adamw_step(p, NULL, m, v, g, 1.0f, &bad_lr, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "options", dt_adamw_step(p, NULL, m, v, g, 1.0f, &bad_b1, 1));
    REJ(DT_ERR_INVALID_ARGUMENT, "dt_tensor_grad_reduce", dt_tensor_sum_squares(gP, &ss));
    const dt_tensor *const many[3] = {g, gP, g};
    double ssn[3] = {-1.0, -1.0, -1.0};
    REJ(DT_ERR_INVALID_ARGUMENT, "dt_tensor_grad_reduce", dt_tensor_sum_squares_n(many, 3, ssn));
    REJ(ANY_FAIL, NULL, dt_tensor_convert(p, DT_I32, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_tensor_convert(NULL, DT_F32, &o1));
    if (ss != -1.0 || ssn[0] != -1.0 || ssn[1] != -1.0 || ssn[2] != -1.0)
        flag(k, "a rejected dt_tensor_sum_squares(_n) wrote its result");
    for (int i = 0; i < nt; i++)
        if (checksum(k->t[i]) != before[i]) flag(k, "tensor %d (param, master, m, v or grad) changed", i);
    return DT_SUCCESS;
}

static dt_status err_reshape_msg(rk *k, ecase *e) {
    dt_tensor *o1, *o2, *x, *dy;
    const dt_layout R = dt_layout_1d(dt_replicate()), S1 = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    MK(x, DT_F32, 3, SHAPE(2, 4, 8), &S1, 1);
    MK(dy, DT_F32, 4, SHAPE(2, 4, 2, 4), &R, 2);
    /* x [2, 4, 8] Shard(1) reshaped to [2, 4, 2, 4] is Shard(1): dy must be too */
    REJ(DT_ERR_NOT_SUPPORTED, "redistribute dy to [Shard(1, contiguous)]", dt_tensor_reshape_backward(x, dy, &o1));
    return DT_SUCCESS;
}

static dt_status err_zero(rk *k, ecase *e) {
    dt_tensor *o1, *o2, *tab0, *tabE0, *tokR, *dyE0, *lgV0, *tgIgn, *tgZero;
    const dt_layout R = dt_layout_1d(dt_replicate());
    const int64_t ks[2] = {2, 4};
    const int32_t tok[8] = {1, 7, 0, 3, 3, 5, 2, 6}, ign[8] = {-1, -1, -1, -1, -1, -1, -1, -1},
                  zero[8] = {0};
    MK(tab0, DT_F32, 2, SHAPE(0, 4), &R, 1);
    MK(tabE0, DT_F32, 2, SHAPE(8, 0), &R, 1);
    DT_TRY(make_i32(k, 2, ks, &R, tok, &tokR));
    MK(dyE0, DT_F32, 3, SHAPE(2, 4, 0), &R, 2);
    MK(lgV0, DT_F32, 3, SHAPE(2, 4, 0), &R, 3);
    DT_TRY(make_i32(k, 2, ks, &R, ign, &tgIgn));
    DT_TRY(make_i32(k, 2, ks, &R, zero, &tgZero));
    float loss = -12345.0f;
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_embedding(tab0, tokR, &o1));              /* V = 0 */
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_embedding(tabE0, tokR, &o1));             /* E = 0 */
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_embedding_backward(tabE0, tokR, dyE0, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_cross_entropy(lgV0, tgZero, NULL, &loss, &o1));
    REJ(DT_ERR_INVALID_ARGUMENT, NULL, dt_cross_entropy(lgV0, tgIgn, NULL, &loss, &o1)); /* V = 0 */
    if (loss != -12345.0f) flag(k, "a rejected dt_cross_entropy wrote the loss (%g)", (double)loss);
    return DT_SUCCESS;
}

/* A target out of range on some ranks only (rows split): every rank fails,
 * the ranks that hold it with INVALID_ARGUMENT naming it; nothing written. */
static dt_status err_ce_one_rank(rk *k, ecase *e) {
    dt_tensor *o1 = NULL, *o2 = NULL, *lg, *tg;
    const int two_d = e->kind == E_CE_ONE_RANK_2D;
    const int64_t B = 2, S = two_d ? 4 : 6, V = two_d ? 6 : 5;
    const int64_t xs[3] = {B, S, V}, ts[2] = {B, S};
    const dt_layout ll = two_d ? dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(2, DT_ORDER_CONTIGUOUS))
                               : dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout tl = two_d ? dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate())
                               : dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    int32_t t[64];
    for (int64_t g = 0; g < B * S; g++) t[g] = (int32_t)(g % V);
    /* 1-D: token 3 of sequence 1, on rank 1 of 3; 2-D: batch 1, on coordinate 1 of dim 0 */
    const int64_t bad_at = two_d ? S + 2 : S + 3;
    t[bad_at] = (int32_t)V;
    const int holder = k->coords[0] == 1;
    DT_TRY(make_f(k, DT_F32, 3, xs, &ll, 1, 1.0, 0.0, -1, NULL, NULL, &lg));
    DT_TRY(make_i32(k, 2, ts, &tl, t, &tg));
    const uint64_t c1 = checksum(lg), c2 = checksum(tg);
    float loss = -12345.0f;
    char text[64];
    snprintf(text, sizeof text, "outside [0, %d)", (int)V);
    REJ(holder ? DT_ERR_INVALID_ARGUMENT : ANY_FAIL, holder ? text : NULL,
        dt_cross_entropy(lg, tg, NULL, &loss, &o1));
    if (loss != -12345.0f) flag(k, "a failed dt_cross_entropy wrote the loss (%g)", (double)loss);
    if (checksum(lg) != c1 || checksum(tg) != c2) flag(k, "a failed dt_cross_entropy changed its inputs");
    return DT_SUCCESS;
}

static dt_status rank_errors(dt_context *ctx, void *arg) {
    ecase *e = arg;
    rk kk, *k = &kk;
    dt_status st = rk_init(k, ctx, &e->res, e->mesh_ndim, e->mesh);
    if (st == DT_SUCCESS) {
        switch (e->kind) {
        case E_OPS: st = err_ops(k, e); break;
        case E_NN: st = err_nn(k, e); break;
        case E_EMBED_CE: st = err_embed_ce(k, e); break;
        case E_OPTIM: st = err_optim(k, e); break;
        case E_RESHAPE_MSG: st = err_reshape_msg(k, e); break;
        case E_ZERO: st = err_zero(k, e); break;
        case E_CE_ONE_RANK:
        case E_CE_ONE_RANK_2D: st = err_ce_one_rank(k, e); break;
        default: st = dt_error(DT_ERR_INTERNAL, "unknown error case %d", (int)e->kind);
        }
    }
    rk_done(k);
    return st;
}

static void test_errors(void **state) {
    ecase *e = *state;
    REQUIRE_BACKEND(e->backend, e->world);
    memset(e->checked, 0, sizeof e->checked);
    launch_and_assert(e->backend, e->world, rank_errors, e, &e->res);
    for (int r = 0; r < e->world; r++) assert_true(e->checked[r] > 0);
}

/* ================================================================== optim */

typedef enum opt_what { OPT_ADAMW, OPT_SUM_SQUARES, OPT_CONVERT } opt_what;

typedef struct ocase {
    opt_what what;
    dt_backend_kind backend;
    int mesh_ndim, mesh[2], world;
    dt_layout l;
    dt_dtype dtype, to; /* adamw: param's; sum_squares: t's; convert: from, to */
    int nullopts;       /* adamw: default options, grad_scale 1; sum_squares: to double precision */
    int64_t shape[2];
    res res;
    double ss[MAXW];
} ocase;

/* torch.optim.AdamW in double, one element, step t:
 *   p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
static void ref_adamw(double *p, double *m, double *v, double g, const dt_adamw_options *o, int64_t t) {
    const double lr = o->lr, b1 = o->beta1, b2 = o->beta2, eps = o->eps, wd = o->weight_decay;
    *p *= 1.0 - lr * wd;
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    *p -= lr / bc1 * *m / (sqrt(*v) / sqrt(bc2) + eps);
}

static dt_status run_adamw(rk *k, ocase *c) {
    const int steps = 3;
    const int64_t n = c->shape[0] * c->shape[1];
    const int has_master = c->dtype != DT_F32;
    const float gscale = c->nullopts ? 1.0f : 0.5f;
    dt_adamw_options o = DT_ADAMW_OPTIONS_INIT;
    if (!c->nullopts) o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.95f, o.eps = 1e-8f, o.weight_decay = 0.1f;
    double *p = DMEM(k, n), *m = DMEM(k, n), *v = DMEM(k, n), *g = DMEM(k, n), *tol = DMEM(k, n),
           *tolm = DMEM(k, n), *tolv = DMEM(k, n), *ma = DMEM(k, n);
    dt_tensor *tp, *tmaster = NULL, *tm = NULL, *tv = NULL, *tg;
    /* master: fp32 values r; param: r rounded to its dtype (kept so by the user) */
    DT_TRY(make_f(k, c->dtype, 2, c->shape, &c->l, 11, 1.0, 0.0, -1, NULL, NULL, &tp));
    if (has_master) DT_TRY(make_f(k, DT_F32, 2, c->shape, &c->l, 11, 1.0, 0.0, -1, p, NULL, &tmaster));
    else for (int64_t i = 0; i < n; i++) p[i] = value(DT_F32, 11, 0, i, 1.0, 0.0);
    DT_TRY(dt_tensor_create(k->ctx, k->mesh, DT_F32, 2, c->shape, L(k, &c->l), &tm));
    keep(k, tm);
    DT_TRY(dt_tensor_create(k->ctx, k->mesh, DT_F32, 2, c->shape, L(k, &c->l), &tv));
    keep(k, tv);
    for (int t = 1; t <= steps; t++) {
        DT_TRY(make_f(k, c->dtype, 2, c->shape, &c->l, 20 + (uint64_t)t, 1.0, 0.0, -1, g, NULL, &tg));
        DT_TRY(dt_adamw_step(tp, tmaster, tm, tv, tg, gscale, c->nullopts ? NULL : &o, t));
        for (int64_t i = 0; i < n; i++) {
            ref_adamw(&p[i], &m[i], &v[i], g[i] * gscale, &o, t);
            ma[i] = o.beta1 * ma[i] + (1.0 - o.beta1) * fabs(g[i] * gscale); /* |m|'s terms */
        }
    }
    for (int64_t i = 0; i < n; i++) {
        tol[i] = steps * (4 * U32 * fabs(p[i]) + 1e-5 * o.lr);
        tolm[i] = 1e-6 * ma[i] + 1e-12;
        tolv[i] = 1e-6 * fabs(v[i]) + 1e-15;
    }
    DT_TRY(check_tensor(k, has_master ? "master" : "param", has_master ? tmaster : tp, &c->l, 2, c->shape, p,
                        tol));
    DT_TRY(check_tensor(k, "m", tm, &c->l, 2, c->shape, m, tolm));
    DT_TRY(check_tensor(k, "v", tv, &c->l, 2, c->shape, v, tolv));
    if (has_master) {
        /* param = the master rounded to its dtype, exactly */
        float *pm = h_local_floats(tmaster), *pp = h_local_floats(tp);
        if (!pm || !pp) {
            free(pm);
            free(pp);
            return dt_error(DT_ERR_OUT_OF_MEMORY, "download failed");
        }
        long bad = 0;
        for (int64_t i = 0; i < dt_tensor_local_numel(tp); i++)
            if ((double)pp[i] != round_to(pm[i], c->dtype) && bad++ < 3)
                fprintf(stderr, "    param[%" PRId64 "] %.9g is not master %.9g rounded to %s\n", i,
                        (double)pp[i], (double)pm[i], dt_dtype_name(c->dtype));
        if (bad) flag(k, "param is not its master rounded (%ld elements)", bad);
        free(pm);
        free(pp);
    }
    return DT_SUCCESS;
}

static dt_status run_sum_squares(rk *k, ocase *c) {
    const int64_t n = c->shape[0] * c->shape[1];
    double *x = DMEM(k, n);
    dt_tensor *t;
    DT_TRY(make_f(k, c->dtype, 2, c->shape, &c->l, 31, 1.0, 0.0, -1, x, NULL, &t));
    double ref = 0, got = -1;
    for (int64_t i = 0; i < n; i++) ref += x[i] * x[i];
    DT_TRY(dt_tensor_sum_squares(t, &got));
    c->ss[k->r] = got;
    /* dt_tensor_sum_squares_n: each result the single call's bits, in one
     * world exchange (an all_gather, none without a mesh) */
    double *x2 = DMEM(k, n), one2 = -1, many[3] = {-1, -1, -1};
    dt_tensor *t2;
    DT_TRY(make_f(k, c->dtype, 2, c->shape, &c->l, 37, 1.0, 0.0, -1, x2, NULL, &t2));
    DT_TRY(dt_tensor_sum_squares(t2, &one2));
    dt_comm *world = dt_context_comm(k->ctx);
    dt_comm_counters cnt;
    dt_comm_counters_reset(world);
    const dt_tensor *const ts[3] = {t, t2, t};
    DT_TRY(dt_tensor_sum_squares_n(ts, 3, many));
    DT_TRY(dt_comm_counters_get(world, &cnt));
    if (many[0] != got || many[1] != one2 || many[2] != got)
        flag(k, "sum_squares_n %.17g %.17g %.17g, single calls %.17g %.17g", many[0], many[1],
             many[2], got, one2);
    uint64_t calls = 0;
    for (int i = 0; i < DT_COMM_KIND_COUNT; i++) calls += cnt.calls[i];
    if (calls != (dt_tensor_mesh(t) ? 1u : 0u) ||
        cnt.calls[DT_COMM_ALL_GATHER] != (dt_tensor_mesh(t) ? 1u : 0u))
        flag(k, "sum_squares_n made %llu world calls (%llu all_gathers), want %d",
             (unsigned long long)calls, (unsigned long long)cnt.calls[DT_COMM_ALL_GATHER],
             dt_tensor_mesh(t) ? 1 : 0);
    /* the contract's "accumulated in double" (strict), or the rounding of
     * fp32 pieces summed across the ranks */
    const double tol = c->nullopts ? 1e-12 * ref : (double)(c->world + 2) * U32 * ref;
    if (!(fabs(got - ref) <= tol))
        flag(k, "sum of squares %.17g, expected %.17g (relative error %.3g, bound %.3g)", got, ref,
             fabs(got - ref) / ref, tol / ref);
    return DT_SUCCESS;
}

/* Special values first, then values over a wide range of exponents. */
static double convert_value(int64_t g, uint64_t seed) {
    static const double sp[] = {
        0.0, -0.0, INFINITY, -INFINITY, NAN, 65504.0, 65519.99, 65520.0, 1e-8, 0x1p-24, 0x1p-25,
        0x1.8p-25, 3e38, 0x1.01p0 /* bf16 tie to even: 1 */, 0x1.03p0 /* bf16 tie: up */,
        0x1.002p0 /* fp16 tie: 1 */, 0x1.006p0 /* fp16 tie: up */, -0x1p-130, 0x1p-149, 0x1.fep127,
        0x1.ff8p127 /* bf16: to inf */, -1.0009765625,
    };
    const int64_t nsp = (int64_t)(sizeof sp / sizeof sp[0]);
    if (g < nsp) return sp[g];
    return ldexp((double)dt_random_value(seed, (uint64_t)g), (int)(g * 7 % 48) - 30);
}

static dt_status run_convert(rk *k, ocase *c) {
    const int64_t n = c->shape[0] * c->shape[1];
    const dt_layout *ll = L(k, &c->l);
    const int pc = ll ? h_partial_index(ll, k->ms, k->coords) : 0;
    float *mine = hmem(k, (size_t)n * sizeof(float)), *loc = hmem(k, (size_t)n * sizeof(float));
    for (int64_t g = 0; g < n; g++) /* each Partial summand its own values, of the source dtype */
        mine[g] = (float)round_to(round_to(convert_value(g, 40 + (uint64_t)pc), DT_F32), c->dtype);
    h_local_of(mine, 2, c->shape, ll, k->ms, k->coords, loc, NULL);
    dt_tensor *t = NULL, *o = NULL;
    DT_TRY(dt_tensor_create(k->ctx, k->mesh, c->dtype, 2, c->shape, ll, &t));
    keep(k, t);
    const int64_t ln = dt_tensor_local_numel(t);
    void *buf = hmem(k, (size_t)n * sizeof(float));
    dt_values_set(buf, c->dtype, (size_t)ln, loc);
    DT_TRY(dt_tensor_set_local(t, buf, dt_tensor_local_bytes(t)));
    DT_TRY(dt_tensor_convert(t, c->to, &o));
    keep(k, o);
    if (dt_tensor_dtype(o) != c->to) flag(k, "the result is %s, not %s", dt_dtype_name(dt_tensor_dtype(o)),
                                          dt_dtype_name(c->to));
    if (k->mesh && !dt_layout_equal(dt_tensor_layout(o), &c->l)) flag(k, "convert changed the Layout");
    float *got = h_local_floats(o);
    if (!got) return dt_error(DT_ERR_OUT_OF_MEMORY, "download failed");
    long bad = 0;
    for (int64_t i = 0; i < ln; i++) {
        const double want = round_to(loc[i], c->to);
        const int ok = isnan(want) ? isnan(got[i]) : ((double)got[i] == want && !signbit(got[i]) == !signbit(want));
        if (!ok && bad++ < 4)
            fprintf(stderr, "    convert %s -> %s: %.9g gave %.9g, expected %.9g\n", dt_dtype_name(c->dtype),
                    dt_dtype_name(c->to), (double)loc[i], (double)got[i], want);
    }
    free(got);
    if (bad) flag(k, "%ld values converted wrongly", bad);
    return DT_SUCCESS;
}

static dt_status rank_optim(dt_context *ctx, void *arg) {
    ocase *c = arg;
    rk k;
    dt_status st = rk_init(&k, ctx, &c->res, c->mesh_ndim, c->mesh);
    if (st == DT_SUCCESS)
        st = c->what == OPT_ADAMW ? run_adamw(&k, c)
             : c->what == OPT_SUM_SQUARES ? run_sum_squares(&k, c) : run_convert(&k, c);
    rk_done(&k);
    return st;
}

static void test_optim(void **state) {
    ocase *c = *state;
    const int world = c->world > 0 ? c->world : 1;
    REQUIRE_BACKEND(c->backend, world);
    launch_and_assert(c->backend, world, rank_optim, c, &c->res);
    if (c->what == OPT_SUM_SQUARES)
        for (int r = 1; r < world; r++) assert_memory_equal(&c->ss[r], &c->ss[0], sizeof(double));
}

/* ================================================================ the table */

typedef struct table {
    struct CMUnitTest *tests;
    char (*names)[512];
    size_t n, cap;
    void **owned;
    size_t n_owned;
} table;

static table g_tb;

static void add(const char *name, CMUnitTestFunction fn, void *state) {
    if (g_tb.n >= g_tb.cap) {
        fprintf(stderr, "test_grad: more than %zu cases\n", g_tb.cap);
        abort();
    }
    snprintf(g_tb.names[g_tb.n], sizeof g_tb.names[0], "%s", name);
    g_tb.tests[g_tb.n] = (struct CMUnitTest){g_tb.names[g_tb.n], fn, NULL, NULL, state};
    g_tb.n++;
}

static void *own(size_t size) {
    void *p = calloc(1, size);
    if (!p) abort();
    g_tb.owned[g_tb.n_owned++] = p;
    return p;
}

static const char *tag(dt_backend_kind be) { return be == DT_BACKEND_CUDA ? "cuda/" : ""; }

static const char *oname(dt_order o) { return dt_order_name(o); }

/* "local", "P=3" or "mesh=2x3" */
static void mesh_str(int mesh_ndim, const int *mesh, char *buf, size_t size) {
    if (mesh_ndim == 0) snprintf(buf, size, "local");
    else if (mesh_ndim == 1) snprintf(buf, size, "P=%d", mesh[0]);
    else snprintf(buf, size, "mesh=%dx%d", mesh[0], mesh[1]);
}


static gcase *new_case(op_kind op, dt_backend_kind be, int mesh_ndim, const int *mesh, dt_dtype dt) {
    gcase *c = own(sizeof *c);
    c->op = op;
    c->backend = be;
    c->mesh_ndim = mesh_ndim;
    c->world = mesh_ndim ? 1 : 0;
    for (int m = 0; m < mesh_ndim; m++) c->mesh[m] = mesh[m], c->world *= mesh[m];
    c->dtype = dt;
    c->seed = 1000 + 37 * g_tb.n;
    for (int i = 0; i < 2; i++) c->in[i] = c->grad[i] = dt_layout_replicated(mesh_ndim);
    c->out = c->dy = dt_layout_replicated(mesh_ndim);
    c->ignore = -1;
    return c;
}

/* The factor a Layout requires of each tensor dim: P per mesh dim that
 * shards it (2P for zigzag). */
static void shard_mult(const dt_layout *l, const int *mesh, int ndim, int64_t *mult) {
    for (int d = 0; d < ndim; d++) mult[d] = 1;
    for (int m = 0; l && m < l->ndim; m++)
        if (l->placements[m].kind == DT_SHARD)
            mult[l->placements[m].dim] *= mesh[m] * (l->placements[m].order == DT_ORDER_ZIGZAG ? 2 : 1);
}

/* ------------------------------------------------------------ matmul cases */

enum { MM_RR, MM_COL, MM_ROW, MM_BATCH, MM_SEQ, MM_PX, MM_PW, MM_KIND_COUNT };

typedef struct mm_dim {
    const char *name;
    dt_placement x, w, out, dy, dx, dw;
} mm_dim;

/* docs/API.md's matmul rows, one mesh dim, x [B, S, K] (last dim 2), w [K, N]. */
static mm_dim mm_dim_of(int kind, dt_order o) {
    const dt_placement R = dt_replicate(), P = dt_partial();
    switch (kind) {
    case MM_COL: return (mm_dim){"col-parallel", R, dt_shard(1, o), dt_shard(2, o), dt_shard(2, o), P, dt_shard(1, o)};
    case MM_ROW: return (mm_dim){"row-parallel", dt_shard(2, o), dt_shard(0, o), P, R, dt_shard(2, o), dt_shard(0, o)};
    case MM_BATCH: return (mm_dim){"batch", dt_shard(0, o), R, dt_shard(0, o), dt_shard(0, o), dt_shard(0, o), P};
    case MM_SEQ: return (mm_dim){"sequence", dt_shard(1, o), R, dt_shard(1, o), dt_shard(1, o), dt_shard(1, o), P};
    case MM_PX: return (mm_dim){"partial-x", P, R, P, R, R, P};
    case MM_PW: return (mm_dim){"partial-w", R, P, P, R, P, R};
    default: return (mm_dim){"replicated", R, R, R, R, R, R};
    }
}

static int mm_sharded(int kind) { return kind >= MM_COL && kind <= MM_SEQ; }

static void add_matmul(dt_backend_kind be, int mesh_ndim, const int *mesh, const int *kinds,
                       const dt_order *ords, dt_dtype dt, int nan) {
    gcase *c = new_case(OP_MATMUL, be, mesh_ndim, mesh, dt);
    int64_t mB = 1, mS = 1, mK = 1, mN = 1;
    char kn[120] = "";
    for (int m = 0; m < mesh_ndim; m++) {
        const mm_dim d = mm_dim_of(kinds[m], ords[m]);
        c->in[0].placements[m] = d.x, c->in[1].placements[m] = d.w, c->out.placements[m] = d.out;
        c->dy.placements[m] = d.dy, c->grad[0].placements[m] = d.dx, c->grad[1].placements[m] = d.dw;
        const int64_t f = mesh[m] * (ords[m] == DT_ORDER_ZIGZAG ? 2 : 1);
        if (kinds[m] == MM_BATCH) mB *= f;
        if (kinds[m] == MM_SEQ) mS *= f;
        if (kinds[m] == MM_ROW) mK *= f;
        if (kinds[m] == MM_COL) mN *= f;
        snprintf(kn + strlen(kn), sizeof kn - strlen(kn), "%s%s%s%s", m ? "+" : "", d.name,
                 mm_sharded(kinds[m]) ? "," : "", mm_sharded(kinds[m]) ? oname(ords[m]) : "");
    }
    c->ndim = 3;
    c->shape[0] = mB > 1 ? mB : 2;
    c->shape[1] = mS > 1 ? mS : 3;
    for (int m = 0; m < mesh_ndim && mS == 1; m++) /* room for the reduce-scatter onto Shard(1) */
        if ((kinds[m] == MM_COL || kinds[m] == MM_PW) && mesh[m] > 1) c->shape[1] = 2 * mesh[m];
    c->shape[2] = mK > 1 ? 2 * mK : 5;
    c->shape[3] = mN > 1 ? mN : 4;
    c->nan = nan;
    char ms[32], name[512];
    mesh_str(mesh_ndim, mesh, ms, sizeof ms);
    snprintf(name, sizeof name, "%smatmul/%s%s/%s,x=[%lld,%lld,%lld],w=[%lld,%lld],%s", tag(be),
             nan ? "nan/" : "", mesh_ndim ? kn : "local", ms, (long long)c->shape[0],
             (long long)c->shape[1], (long long)c->shape[2], (long long)c->shape[2],
             (long long)c->shape[3], dt_dtype_name(dt));
    add(name, test_gcase, c);
}

/* -------------------------------------------- elementwise, norm, rotary cases */

/* x-shaped ops: the Layout rules of docs/API.md's table for x's Layout l. */
static gcase *add_x(op_kind op, dt_backend_kind be, int mesh_ndim, const int *mesh, const dt_layout *l,
                    dt_dtype dt, int variant, int ndim, const int64_t *base, const int64_t *sharded_base,
                    int nan, const char *extra) {
    gcase *c = new_case(op, be, mesh_ndim, mesh, dt);
    if (mesh_ndim) c->in[0] = *l;
    int64_t mult[5];
    shard_mult(mesh_ndim ? l : NULL, mesh, ndim, mult);
    c->ndim = ndim;
    for (int d = 0; d < ndim; d++) c->shape[d] = mult[d] > 1 ? mult[d] * sharded_base[d] : base[d];
    const dt_layout g = grad_of(&c->in[0]);
    c->out = c->in[0];
    c->dy = c->grad[0] = (op == OP_GELU || op == OP_SWIGLU || op == OP_RMSNORM) ? c->in[0] : g;
    if (op == OP_RMSNORM)
        for (int m = 0; m < mesh_ndim; m++)
            c->grad[1].placements[m] = c->in[0].placements[m].kind == DT_SHARD ? dt_partial() : dt_replicate();
    c->variant = variant;
    c->nan = nan;
    static const char *const opn[OP_KIND_COUNT] = {"matmul", "add", "gelu", "swiglu", "reshape", "rmsnorm",
                                                   "rotary", "embedding", "cross_entropy"};
    char ms[32], ln[96], sh[64], name[512];
    mesh_str(mesh_ndim, mesh, ms, sizeof ms);
    lname(mesh_ndim ? l : NULL, ln, sizeof ln);
    shape_str(ndim, c->shape, sh, sizeof sh);
    snprintf(name, sizeof name, "%s%s/%s%s/%s,x=%s%s%s,%s", tag(be), opn[op], nan ? "nan/" : "", ln, ms, sh,
             extra ? "," : "", extra ? extra : "", dt_dtype_name(dt));
    add(name, test_gcase, c);
    return c;
}

static void add_rotary(dt_backend_kind be, int mesh_ndim, const int *mesh, const dt_layout *l, dt_dtype dt,
                       int style, int positions, float base, int nan) {
    static const int64_t b[4] = {2, 3, 2, 8}, sb[4] = {1, 2, 1, 8};
    char extra[96];
    snprintf(extra, sizeof extra, "%s,%s,base=%g", style ? "interleaved" : "half",
             positions ? "positions" : "pos=index", base > 0 ? (double)base : 10000.0);
    gcase *c = add_x(OP_ROTARY, be, mesh_ndim, mesh, l, dt, style, 4, b, sb, nan, extra);
    c->positions = positions;
    c->base = base;
}

/* Rotary with documents (rot_docs: docs 1 one list for every row, 2 a list
 * per row), x shaped as add_rotary's; the lengths are in the name. */
static void add_rotary_docs(dt_backend_kind be, int mesh_ndim, const int *mesh, const dt_layout *l,
                            dt_dtype dt, int style, int docs) {
    static const int64_t b[4] = {2, 3, 2, 8}, sb[4] = {1, 2, 1, 8};
    int64_t mult[4], lens[256];
    shard_mult(mesh_ndim ? l : NULL, mesh, 4, mult);
    const int64_t B = mult[0] > 1 ? mult[0] * sb[0] : b[0], S = mult[1] > 1 ? mult[1] * sb[1] : b[1];
    if (B * S > 256) abort();
    const int64_t count = rot_docs(docs, B, S, lens);
    char extra[400];
    int at = snprintf(extra, sizeof extra, "%s,docs=%s[", style ? "interleaved" : "half",
                      docs == 2 ? "per-row" : "shared");
    for (int64_t i = 0; i < count && at < (int)sizeof extra; i++)
        at += snprintf(extra + at, sizeof extra - (size_t)at, "%s%lld", i ? "," : "", (long long)lens[i]);
    if (at >= (int)sizeof extra - 1) abort(); /* a name never cut short */
    snprintf(extra + at, sizeof extra - (size_t)at, "]");
    gcase *c = add_x(OP_ROTARY, be, mesh_ndim, mesh, l, dt, style, 4, b, sb, 0, extra);
    c->docs = docs;
}

/* ----------------------------------------------------------- reshape cases */

static void add_reshape(dt_backend_kind be, int mesh_ndim, const int *mesh, const dt_layout *in, int ndim,
                        const int64_t *shape, const dt_layout *out, int rndim, const int64_t *rshape,
                        dt_dtype dt, const char *what) {
    gcase *c = new_case(OP_RESHAPE, be, mesh_ndim, mesh, dt);
    if (mesh_ndim) {
        c->in[0] = *in;
        c->out = *out;
        c->dy = grad_of(out);
        c->grad[0] = grad_of(in);
    }
    c->ndim = ndim;
    c->rndim = rndim;
    memcpy(c->shape, shape, (size_t)ndim * sizeof *shape);
    memcpy(c->rshape, rshape, (size_t)rndim * sizeof *rshape);
    char ms[32], a[96], b[96], s1[64], s2[64], name[512];
    mesh_str(mesh_ndim, mesh, ms, sizeof ms);
    lname(mesh_ndim ? in : NULL, a, sizeof a);
    lname(mesh_ndim ? out : NULL, b, sizeof b);
    shape_str(ndim, shape, s1, sizeof s1);
    shape_str(rndim, rshape, s2, sizeof s2);
    snprintf(name, sizeof name, "%sreshape/%s%s%s->%s/%s,%s->%s,%s", tag(be), what ? what : "", what ? "," : "",
             a, b, ms, s1, s2, dt_dtype_name(dt));
    add(name, test_gcase, c);
}

/* ------------------------------------------------- embedding, loss cases */

enum { EK_RR, EK_TOK, EK_VOCAB, EK_EMB };

static void add_embed(dt_backend_kind be, int mesh_ndim, const int *mesh, const int *kinds, const int *dims,
                      const dt_order *ords, dt_dtype dt, int nan) {
    gcase *c = new_case(OP_EMBED, be, mesh_ndim, mesh, dt);
    int64_t mB = 1, mS = 1, mV = 1, mE = 1;
    char kn[120] = "";
    const dt_placement R = dt_replicate(), P = dt_partial();
    for (int m = 0; m < mesh_ndim; m++) {
        const dt_order o = ords[m];
        const int64_t f = mesh[m] * (o == DT_ORDER_ZIGZAG ? 2 : 1);
        dt_placement tab = R, tok = R, out = R, dtab = R;
        const char *nm = "replicated";
        if (kinds[m] == EK_TOK) {
            tok = out = dt_shard(dims[m], o), dtab = P, nm = dims[m] ? "tokens-seq" : "tokens-batch";
            if (dims[m]) mS *= f;
            else mB *= f;
        } else if (kinds[m] == EK_VOCAB) {
            tab = dtab = dt_shard(0, DT_ORDER_CONTIGUOUS), out = P, nm = "vocab-parallel", mV *= mesh[m];
        } else if (kinds[m] == EK_EMB) {
            tab = dtab = dt_shard(1, o), out = dt_shard(2, o), nm = "embed-dim", mE *= f;
        }
        c->in[0].placements[m] = tab, c->in[1].placements[m] = tok, c->out.placements[m] = out;
        c->grad[0].placements[m] = dtab;
        const int ordered = kinds[m] == EK_TOK || kinds[m] == EK_EMB;
        snprintf(kn + strlen(kn), sizeof kn - strlen(kn), "%s%s%s%s", m ? "+" : "", nm, ordered ? "," : "",
                 ordered ? oname(o) : "");
    }
    c->dy = grad_of(&c->out);
    c->shape[0] = mB > 1 ? mB : 2;
    c->shape[1] = mS > 1 ? 2 * mS : 3;
    c->shape[2] = mV > 1 ? 4 * mV : 7;
    c->shape[3] = mE > 1 ? mE : 3;
    c->nan = nan;
    char ms[32], name[512];
    mesh_str(mesh_ndim, mesh, ms, sizeof ms);
    snprintf(name, sizeof name, "%sembedding/%s%s/%s,table=[%lld,%lld],tokens=[%lld,%lld],%s", tag(be),
             nan ? "nan/" : "", mesh_ndim ? kn : "local", ms, (long long)c->shape[2], (long long)c->shape[3],
             (long long)c->shape[0], (long long)c->shape[1], dt_dtype_name(dt));
    add(name, test_gcase, c);
}

enum { CK_RR, CK_VOCAB, CK_ROWS };

static gcase *add_ce(dt_backend_kind be, int mesh_ndim, const int *mesh, const int *kinds, const int *dims,
                     const dt_order *ords, dt_dtype dt, int sum_red, int32_t ignore, int loss_only, int nan) {
    gcase *c = new_case(OP_CE, be, mesh_ndim, mesh, dt);
    int64_t mB = 1, mS = 1, mV = 1;
    char kn[120] = "";
    for (int m = 0; m < mesh_ndim; m++) {
        const dt_order o = ords[m];
        const int64_t f = mesh[m] * (o == DT_ORDER_ZIGZAG ? 2 : 1);
        const char *nm = "replicated";
        if (kinds[m] == CK_VOCAB) {
            c->in[0].placements[m] = dt_shard(2, DT_ORDER_CONTIGUOUS), nm = "vocab-parallel", mV *= mesh[m];
        } else if (kinds[m] == CK_ROWS) {
            c->in[0].placements[m] = c->in[1].placements[m] = dt_shard(dims[m], o);
            nm = dims[m] ? "rows-seq" : "rows-batch";
            if (dims[m]) mS *= f;
            else mB *= f;
        }
        snprintf(kn + strlen(kn), sizeof kn - strlen(kn), "%s%s%s%s", m ? "+" : "", nm,
                 kinds[m] == CK_ROWS ? "," : "", kinds[m] == CK_ROWS ? oname(o) : "");
    }
    c->grad[0] = c->in[0];
    c->shape[0] = mB > 1 ? mB : 2;
    c->shape[1] = mS > 1 ? 2 * mS : 4;
    c->shape[2] = mV > 1 ? 4 * mV : 7;
    c->variant = sum_red;
    c->ignore = ignore;
    c->loss_only = loss_only;
    c->nan = nan;
    char ms[32], name[512], extra[80];
    mesh_str(mesh_ndim, mesh, ms, sizeof ms);
    snprintf(extra, sizeof extra, "%s,ignore_index=%d%s%s", sum_red ? "sum" : "mean", (int)ignore,
             ignore >= 0 ? " (a class)" : "", loss_only ? ",loss alone (dlogits NULL)" : "");
    snprintf(name, sizeof name, "%scross_entropy/%s%s/%s,logits=[%lld,%lld,%lld],%s,%s", tag(be), nan ? "nan/" : "",
             mesh_ndim ? kn : "local", ms, (long long)c->shape[0], (long long)c->shape[1],
             (long long)c->shape[2], extra, dt_dtype_name(dt));
    add(name, test_gcase, c);
    return c;
}

/* ------------------------------------------------------ optim, errors */

static void add_optim(opt_what what, dt_backend_kind be, int mesh_ndim, const int *mesh, const dt_layout *l,
                      dt_dtype dt, dt_dtype to, int nullopts, int64_t rows, int64_t cols) {
    ocase *c = own(sizeof *c);
    c->what = what;
    c->backend = be;
    c->mesh_ndim = mesh_ndim;
    c->world = mesh_ndim ? 1 : 0;
    for (int m = 0; m < mesh_ndim; m++) c->mesh[m] = mesh[m], c->world *= mesh[m];
    c->l = mesh_ndim ? *l : dt_layout_replicated(0);
    c->dtype = dt;
    c->to = to;
    c->nullopts = nullopts;
    c->shape[0] = rows;
    c->shape[1] = cols;
    char ms[32], ln[96], name[512];
    mesh_str(mesh_ndim, mesh, ms, sizeof ms);
    lname(mesh_ndim ? l : NULL, ln, sizeof ln);
    if (what == OPT_ADAMW)
        snprintf(name, sizeof name, "%sadamw/%s%s/%s,%s,[%lld,%lld],3 steps,%s", tag(be), dt_dtype_name(dt),
                 dt == DT_F32 ? " param" : " param+fp32 master", ln, ms, (long long)rows, (long long)cols,
                 nullopts ? "default options" : "lr=0.01,betas=0.9,0.95,wd=0.1,grad_scale=0.5");
    else if (what == OPT_SUM_SQUARES)
        snprintf(name, sizeof name, "%ssum_squares/%s%s/%s,[%lld,%lld],%s", tag(be),
                 nullopts ? "to double precision,relative 1e-12," : "", ln, ms, (long long)rows,
                 (long long)cols, dt_dtype_name(dt));
    else
        snprintf(name, sizeof name, "%sconvert/%s->%s/%s,%s,[%lld,%lld],special values", tag(be),
                 dt_dtype_name(dt), dt_dtype_name(to), ln, ms, (long long)rows, (long long)cols);
    add(name, test_optim, c);
}

static void add_errors(err_kind kind, dt_backend_kind be, int mesh_ndim, int m0, int m1, const char *what) {
    ecase *e = own(sizeof *e);
    e->kind = kind;
    e->backend = be;
    e->mesh_ndim = mesh_ndim;
    e->mesh[0] = m0;
    e->mesh[1] = m1;
    e->world = mesh_ndim == 2 ? m0 * m1 : m0;
    char ms[32], name[512];
    mesh_str(mesh_ndim, e->mesh, ms, sizeof ms);
    snprintf(name, sizeof name, "%serrors/%s/%s", tag(be), what, ms);
    add(name, test_errors, e);
}

/* ====================================================================== main */

static dt_placement S_(int d, dt_order o) { return dt_shard(d, o); }

/* Every case on one backend: P = 1..8 (CUDA: 1, 3, 4, 8) and the 2x2, 2x3,
 * 3x2 meshes in fp32; bf16 and fp16 too at P = 3 on the CPU, and
 * alternately on CUDA. */
static void add_op_cases(dt_backend_kind be) {
    const int cuda = be == DT_BACKEND_CUDA;
    const dt_placement R = dt_replicate(), Pp = dt_partial();
    const dt_order C = DT_ORDER_CONTIGUOUS, St = DT_ORDER_STRIPED, Z = DT_ORDER_ZIGZAG;
    static const int meshes2[3][2] = {{2, 2}, {2, 3}, {3, 2}};
    const int n2 = g_quick ? 1 : 3;
    int counter = 0;
    const size_t QSTEP = g_quick ? 2 : 1; /* DT_TEST_QUICK: every other Layout */

    for (int P = 1; P <= MAXW; P++) {
        /* CUDA: P = 1, 3, 4, 8 (each launch makes a stream and a cuBLAS handle per rank) */
        if (g_quick ? P != 3 && (cuda || P != 1) : cuda && P != 1 && P != 3 && P != 4 && P != 8) continue;
        /* the dtypes at this P: fp32, and bf16 + fp16 (CPU: P = 3; CUDA: one of them, alternating) */
        dt_dtype dts[3] = {DT_F32, DT_BF16, DT_F16};
        const int ndt = cuda ? 2 : (P == 3 && !g_quick ? 3 : 1);
#define EACH_DT(body)                                                                      \
    for (int di_ = 0; di_ < ndt; di_++) {                                                  \
        const dt_dtype dt = cuda && di_ == 1 ? dts[1 + (counter++ % 2)] : dts[di_];        \
        body;                                                                              \
    }
        const int mesh[1] = {P};
        const size_t Q0 = g_quick ? (size_t)(P / 2) % 2 : 0; /* quick: P = 1 the even, P = 3 the odd */
        /* matmul: all six rows, every order */
        for (int kind = 0; kind < MM_KIND_COUNT; kind++)
            for (int o = 0; o < (mm_sharded(kind) ? 3 : 1); o++) {
                if (g_quick && mm_sharded(kind) && o != (P + kind) % 3) continue;
                const int kinds[1] = {kind};
                const dt_order ords[1] = {k_orders[o]};
                EACH_DT(add_matmul(be, 1, mesh, kinds, ords, dt, 0));
            }
        /* add */
        const dt_layout add_l[] = {dt_layout_1d(R), dt_layout_1d(Pp), dt_layout_1d(S_(0, C)),
                                   dt_layout_1d(S_(1, St)), dt_layout_1d(S_(2, Z))};
        static const int64_t b3[3] = {2, 3, 4}, sb3[3] = {1, 1, 1}, sb3s[3] = {1, 2, 1};
        for (size_t i = 0; i < sizeof add_l / sizeof add_l[0]; i++)
            EACH_DT(add_x(OP_ADD, be, 1, mesh, &add_l[i], dt, 0, 3, b3, sb3, 0, NULL));
        /* gelu, both approximations */
        const dt_layout gelu_l[] = {dt_layout_1d(R), dt_layout_1d(S_(0, C)), dt_layout_1d(S_(1, C)),
                                    dt_layout_1d(S_(1, St)), dt_layout_1d(S_(1, Z)), dt_layout_1d(S_(2, C))};
        for (size_t i = Q0; i < sizeof gelu_l / sizeof gelu_l[0]; i += QSTEP)
            for (int ap = 0; ap < 2; ap++)
                EACH_DT(add_x(OP_GELU, be, 1, mesh, &gelu_l[i], dt, ap, 3, b3, sb3s, 0, ap ? "tanh" : "erf"));
        /* swiglu */
        const dt_layout sw_l[] = {dt_layout_1d(R), dt_layout_1d(S_(1, Z)), dt_layout_1d(S_(2, St)),
                                  dt_layout_1d(S_(0, C))};
        for (size_t i = Q0; i < sizeof sw_l / sizeof sw_l[0]; i += QSTEP)
            EACH_DT(add_x(OP_SWIGLU, be, 1, mesh, &sw_l[i], dt, 0, 3, b3, sb3s, 0, NULL));
        /* rmsnorm, with and without weight */
        const dt_layout rn_l[] = {dt_layout_1d(R), dt_layout_1d(S_(0, C)), dt_layout_1d(S_(1, C)),
                                  dt_layout_1d(S_(1, St)), dt_layout_1d(S_(1, Z))};
        static const int64_t b3n[3] = {2, 3, 8}, sb3n[3] = {1, 2, 8};
        for (size_t i = Q0; i < sizeof rn_l / sizeof rn_l[0]; i += QSTEP)
            for (int w = 0; w < 2; w++)
                EACH_DT(add_x(OP_RMSNORM, be, 1, mesh, &rn_l[i], dt, w, 3, b3n, sb3n, 0, w ? "weight" : "no weight"));
        /* rotary, both styles */
        const dt_layout rot_l[] = {dt_layout_1d(R), dt_layout_1d(S_(1, C)), dt_layout_1d(S_(1, St)),
                                   dt_layout_1d(S_(1, Z)), dt_layout_1d(S_(2, C)), dt_layout_1d(S_(0, C)),
                                   dt_layout_1d(Pp)};
        for (size_t i = Q0; i < sizeof rot_l / sizeof rot_l[0]; i += QSTEP)
            for (int sty = 0; sty < 2; sty++)
                EACH_DT(add_rotary(be, 1, mesh, &rot_l[i], dt, sty, (int)(i + (size_t)sty) % 2,
                                   (i % 3 == 2) ? 500.0f : 0.0f, 0));
        /* rotary with documents: one list for every row and a list per row,
         * the sequence sharded in every order, the batch sharded */
        const dt_layout rod_l[] = {dt_layout_1d(S_(1, C)), dt_layout_1d(S_(1, St)), dt_layout_1d(S_(1, Z)),
                                   dt_layout_1d(S_(0, C))};
        for (size_t i = Q0; i < sizeof rod_l / sizeof rod_l[0]; i += QSTEP)
            for (int docs = 1; docs <= 2; docs++)
                EACH_DT(add_rotary_docs(be, 1, mesh, &rod_l[i], dt, (int)(i + (size_t)docs) % 2, docs));
        /* reshape */
        {
            const dt_layout l2c = dt_layout_1d(S_(2, C)), l2z = dt_layout_1d(S_(2, Z)), lp = dt_layout_1d(Pp),
                            lr = dt_layout_1d(R), l0 = dt_layout_1d(S_(0, C));
            const int64_t heads[3] = {2, 3, 4 * P}, heads4[4] = {2, 3, P, 4};
            const int64_t zz[3] = {2, 3, 8 * P}, zz4[4] = {2, 3, 2 * P, 4};
            const int64_t sq[3] = {2, 2 * P, 6}, sq4[4] = {2, 2 * P, 2, 3};
            const int64_t pl[3] = {2, 3, 6}, pl4[4] = {2, 3, 2, 3};
            const int64_t bt[3] = {2 * P, 3, 6}, bt2[2] = {2 * P, 18};
            EACH_DT(add_reshape(be, 1, mesh, &l2c, 3, heads, &l2c, 4, heads4, dt, "split heads"));
            EACH_DT(add_reshape(be, 1, mesh, &l2c, 4, heads4, &l2c, 3, heads, dt, "merge heads"));
            EACH_DT(add_reshape(be, 1, mesh, &l2z, 3, zz, &l2z, 4, zz4, dt, "split heads"));
            for (int o = 0; o < 3; o++) {
                if (g_quick && o != P % 3) continue;
                const dt_layout ls = dt_layout_1d(S_(1, k_orders[o]));
                EACH_DT(add_reshape(be, 1, mesh, &ls, 3, sq, &ls, 4, sq4, dt, "sequence"));
            }
            EACH_DT(add_reshape(be, 1, mesh, &lp, 3, pl, &lp, 4, pl4, dt, NULL));
            EACH_DT(add_reshape(be, 1, mesh, &lr, 3, pl, &lr, 4, pl4, dt, NULL));
            EACH_DT(add_reshape(be, 1, mesh, &l0, 3, bt, &l0, 2, bt2, dt, "batch"));
        }
        /* embedding */
        {
            static const struct { int kind, dim, o; } ek[] = {
                {EK_RR, 0, 0}, {EK_TOK, 0, 0}, {EK_TOK, 1, 0}, {EK_TOK, 1, 1}, {EK_TOK, 1, 2},
                {EK_VOCAB, 0, 0}, {EK_EMB, 0, 1}};
            for (size_t i = Q0; i < sizeof ek / sizeof ek[0]; i += QSTEP) {
                const int kinds[1] = {ek[i].kind}, dims[1] = {ek[i].dim};
                const dt_order ords[1] = {k_orders[ek[i].o]};
                EACH_DT(add_embed(be, 1, mesh, kinds, dims, ords, dt, 0));
            }
        }
        /* cross-entropy */
        {
            static const struct { int kind, dim, o; } ck[] = {
                {CK_RR, 0, 0}, {CK_VOCAB, 0, 0}, {CK_ROWS, 0, 0}, {CK_ROWS, 1, 0}, {CK_ROWS, 1, 1},
                {CK_ROWS, 1, 2}};
            for (size_t i = Q0; i < sizeof ck / sizeof ck[0]; i += QSTEP) {
                const int kinds[1] = {ck[i].kind}, dims[1] = {ck[i].dim};
                const dt_order ords[1] = {k_orders[ck[i].o]};
                const int sum_red = (P + (int)i) % 4 == 3;
                const int32_t ignore = (P + (int)i) % 3 == 1 ? -100 : -1;
                EACH_DT(add_ce(be, 1, mesh, kinds, dims, ords, dt, sum_red, ignore, 0, 0));
            }
        }
    }

    /* 2-D meshes: a dp-like dim 0 and a tp-like dim 1 */
    for (int mi = 0; mi < n2; mi++) {
        const int *mesh = meshes2[mi];
        const dt_dtype dt = DT_F32;
        static const struct { int k0, o0, k1, o1; } mm2[] = {
            {MM_BATCH, 0, MM_COL, 1}, {MM_SEQ, 2, MM_ROW, 0}, {MM_SEQ, 1, MM_COL, 2}, {MM_COL, 0, MM_ROW, 1},
            {MM_PX, 0, MM_COL, 2},    {MM_BATCH, 1, MM_PW, 0}, {MM_SEQ, 0, MM_BATCH, 2}, {MM_ROW, 0, MM_SEQ, 1},
        };
        for (size_t i = 0; i < sizeof mm2 / sizeof mm2[0]; i += QSTEP) {
            const int kinds[2] = {mm2[i].k0, mm2[i].k1};
            const dt_order ords[2] = {k_orders[mm2[i].o0], k_orders[mm2[i].o1]};
            add_matmul(be, 2, mesh, kinds, ords, cuda && i % 2 ? (i % 4 == 1 ? DT_BF16 : DT_F16) : dt, 0);
        }
        static const int64_t b3[3] = {2, 3, 4}, sb3[3] = {1, 2, 1}, b3n[3] = {2, 3, 8}, sb3n[3] = {1, 2, 8};
        const dt_layout add2[] = {dt_layout_2d(S_(0, C), Pp), dt_layout_2d(S_(1, Z), S_(2, St))};
        for (int i = 0; i < 2; i++) add_x(OP_ADD, be, 2, mesh, &add2[i], dt, 0, 3, b3, sb3, 0, NULL);
        const dt_layout g2[] = {dt_layout_2d(S_(0, C), S_(2, St)), dt_layout_2d(S_(1, Z), S_(2, C))};
        for (int i = 0; i < 2; i++)
            for (int ap = 0; ap < 2; ap++)
                add_x(OP_GELU, be, 2, mesh, &g2[i], dt, ap, 3, b3, sb3, 0, ap ? "tanh" : "erf");
        const dt_layout s2[] = {dt_layout_2d(S_(1, St), S_(2, C)), dt_layout_2d(R, S_(0, Z))};
        for (int i = 0; i < 2; i++) add_x(OP_SWIGLU, be, 2, mesh, &s2[i], dt, 0, 3, b3, sb3, 0, NULL);
        const dt_layout r2[] = {dt_layout_2d(S_(0, C), S_(1, Z)), dt_layout_2d(S_(1, St), R)};
        for (int i = 0; i < 2; i++)
            for (int w = 0; w < 2; w++)
                add_x(OP_RMSNORM, be, 2, mesh, &r2[i], cuda && w ? DT_BF16 : dt, w, 3, b3n, sb3n, 0,
                      w ? "weight" : "no weight");
        const dt_layout ro2[] = {dt_layout_2d(S_(1, Z), S_(2, C)), dt_layout_2d(S_(0, C), S_(1, St)),
                                 dt_layout_2d(Pp, S_(1, C))};
        for (int i = 0; i < 3; i++)
            for (int sty = 0; sty < 2; sty++) add_rotary(be, 2, mesh, &ro2[i], dt, sty, sty, 0.0f, 0);
        /* documents, batch and sequence both sharded; heads sharded */
        for (int i = 0; i < 2; i++)
            for (int docs = 1; docs <= 2; docs++) add_rotary_docs(be, 2, mesh, &ro2[i], dt, docs - 1, docs);
        {
            const dt_layout in = dt_layout_2d(S_(1, Z), S_(2, C));
            const int64_t s3[3] = {2, 2 * mesh[0], 4 * mesh[1]}, s4[4] = {2, 2 * mesh[0], mesh[1], 4};
            add_reshape(be, 2, mesh, &in, 3, s3, &in, 4, s4, dt, "split heads");
            add_reshape(be, 2, mesh, &in, 4, s4, &in, 3, s3, dt, "merge heads");
        }
        static const struct { int k0, d0, o0, k1, d1, o1; } e2[] = {
            {EK_TOK, 1, 2, EK_VOCAB, 0, 0}, {EK_TOK, 0, 0, EK_EMB, 0, 0}, {EK_VOCAB, 0, 0, EK_TOK, 1, 1},
            {EK_RR, 0, 0, EK_VOCAB, 0, 0},  {EK_EMB, 0, 1, EK_TOK, 0, 0},
        };
        for (size_t i = 0; i < sizeof e2 / sizeof e2[0]; i += QSTEP) {
            const int kinds[2] = {e2[i].k0, e2[i].k1}, dims[2] = {e2[i].d0, e2[i].d1};
            const dt_order ords[2] = {k_orders[e2[i].o0], k_orders[e2[i].o1]};
            add_embed(be, 2, mesh, kinds, dims, ords, dt, 0);
        }
        /* the loss's mean over the global batch: rows over dp, vocabulary over tp, and more */
        static const struct { int k0, d0, o0, k1, d1, o1; } c2[] = {
            {CK_ROWS, 0, 0, CK_VOCAB, 0, 0}, {CK_ROWS, 1, 2, CK_VOCAB, 0, 0}, {CK_VOCAB, 0, 0, CK_ROWS, 1, 1},
            {CK_ROWS, 0, 0, CK_ROWS, 1, 2},  {CK_RR, 0, 0, CK_VOCAB, 0, 0},   {CK_ROWS, 1, 0, CK_RR, 0, 0},
        };
        for (size_t i = 0; i < sizeof c2 / sizeof c2[0]; i += QSTEP) {
            const int kinds[2] = {c2[i].k0, c2[i].k1}, dims[2] = {c2[i].d0, c2[i].d1};
            const dt_order ords[2] = {k_orders[c2[i].o0], k_orders[c2[i].o1]};
            add_ce(be, 2, mesh, kinds, dims, ords, cuda && i % 2 ? DT_BF16 : dt, (int)i == 3, -1, 0, 0);
        }
    }

    /* local tensors (no mesh) */
    {
        static const int64_t b3[3] = {2, 3, 4}, b3n[3] = {2, 3, 8}, s4[4] = {2, 3, 2, 2};
        add_matmul(be, 0, NULL, NULL, NULL, DT_F32, 0);
        add_x(OP_ADD, be, 0, NULL, NULL, DT_F32, 0, 3, b3, b3, 0, NULL);
        add_x(OP_GELU, be, 0, NULL, NULL, DT_F32, 1, 3, b3, b3, 0, "tanh");
        add_x(OP_SWIGLU, be, 0, NULL, NULL, DT_F32, 0, 3, b3, b3, 0, NULL);
        add_x(OP_RMSNORM, be, 0, NULL, NULL, DT_F32, 1, 3, b3n, b3n, 0, "weight");
        add_rotary(be, 0, NULL, NULL, DT_F32, 1, 1, 0.0f, 0);
        add_rotary_docs(be, 0, NULL, NULL, DT_F32, 0, 2);
        add_reshape(be, 0, NULL, NULL, 3, b3, NULL, 4, s4, DT_F32, NULL);
        add_embed(be, 0, NULL, NULL, NULL, NULL, DT_F32, 0);
        add_ce(be, 0, NULL, NULL, NULL, NULL, DT_F32, 0, -1, 0, 0);
    }

    /* NaN propagation */
    {
        const int m2[1] = {2};
        const int kseq[1] = {MM_SEQ}, kb[1] = {MM_BATCH};
        const dt_order oz[1] = {Z}, oc[1] = {C};
        add_matmul(be, 1, m2, kseq, oz, DT_F32, 1);
        add_matmul(be, 0, NULL, NULL, NULL, DT_F32, 1);
        add_matmul(be, 1, m2, kb, oc, cuda ? DT_BF16 : DT_F32, 1);
        static const int64_t b3[3] = {2, 3, 4}, sb3[3] = {1, 2, 1}, b3n[3] = {2, 3, 8}, sb3n[3] = {1, 2, 8};
        const dt_layout ls = dt_layout_1d(S_(1, St)), lc = dt_layout_1d(S_(1, C));
        add_x(OP_GELU, be, 1, m2, &ls, DT_F32, 0, 3, b3, sb3, 1, "erf");
        add_x(OP_GELU, be, 1, m2, &ls, DT_F32, 1, 3, b3, sb3, 1, "tanh");
        add_x(OP_SWIGLU, be, 1, m2, &lc, DT_F32, 0, 3, b3, sb3, 1, NULL);
        add_x(OP_RMSNORM, be, 1, m2, &lc, DT_F32, 1, 3, b3n, sb3n, 1, "weight");
        const dt_layout lz = dt_layout_1d(S_(1, Z));
        add_rotary(be, 1, m2, &lz, DT_F32, 0, 0, 0.0f, 1);
        add_rotary(be, 1, m2, &lz, DT_F32, 1, 1, 0.0f, 1);
        const int ev[1] = {EK_VOCAB}, et[1] = {EK_TOK}, d0[1] = {0}, d1[1] = {1};
        add_embed(be, 1, m2, ev, d0, oc, DT_F32, 1);
        add_embed(be, 1, m2, et, d1, oz, DT_F32, 1);
        const int cv[1] = {CK_VOCAB}, cr[1] = {CK_ROWS};
        add_ce(be, 1, m2, cv, d0, oc, DT_F32, 0, -1, 0, 1);
        add_ce(be, 1, m2, cr, d1, oz, DT_F32, 0, -1, 0, 1);
        add_ce(be, 0, NULL, NULL, NULL, NULL, DT_F32, 1, -1, 0, 1);
    }

    /* cross-entropy: an ignore index that is a class, and the loss alone */
    {
        const int m3[1] = {3}, m1[1] = {1}, mm22[2] = {2, 2};
        const int cv[1] = {CK_VOCAB}, cr[1] = {CK_ROWS}, cvr[2] = {CK_ROWS, CK_VOCAB}, d1[1] = {1},
                  d00[2] = {1, 0};
        const dt_order oc[1] = {C}, occ[2] = {St, C};
        add_ce(be, 1, m3, cr, d1, oc, DT_F32, 0, 1, 0, 0);
        add_ce(be, 2, mm22, cvr, d00, occ, DT_F32, 0, 0, 0, 0);
        add_ce(be, 1, m1, cv, d1, oc, DT_F32, 0, -1, 1, 0);
        add_ce(be, 1, m3, cv, d1, oc, DT_F32, 0, -1, 1, 0);
        add_ce(be, 0, NULL, NULL, NULL, NULL, DT_F32, 1, -1, 1, 0);
    }

    /* reshape on one rank where the forward makes a placement Replicate */
    {
        const int m1[1] = {1};
        const dt_layout l2c = dt_layout_1d(S_(2, C)), l2z = dt_layout_1d(S_(2, Z)), lr = dt_layout_1d(R);
        const int64_t a[3] = {2, 4, 6}, a2[2] = {2, 24}, a4[4] = {2, 4, 3, 2};
        add_reshape(be, 1, m1, &l2c, 3, a, &lr, 2, a2, DT_F32, "inner dim merged");
        add_reshape(be, 1, m1, &l2z, 3, a, &lr, 4, a4, DT_F32, "zigzag, 3 heads not divisible");
    }

    /* optimizer calls */
    {
        const int m1[1] = {1}, m2[1] = {2}, m3[1] = {3}, m22[2] = {2, 2}, m23[2] = {2, 3};
        const dt_layout r1 = dt_layout_1d(R), s0 = dt_layout_1d(S_(0, C)), s1s = dt_layout_1d(S_(1, St)),
                        s0r = dt_layout_2d(S_(0, C), R), rz = dt_layout_2d(R, S_(1, Z)),
                        p1 = dt_layout_1d(Pp);
        add_optim(OPT_ADAMW, be, 0, NULL, NULL, DT_F32, DT_F32, 0, 12, 6);
        add_optim(OPT_ADAMW, be, 1, m3, &s0, DT_F32, DT_F32, 0, 12, 6);
        add_optim(OPT_ADAMW, be, 1, m1, &r1, DT_F32, DT_F32, 1, 12, 6);
        add_optim(OPT_ADAMW, be, 2, m22, &s0r, DT_BF16, DT_F32, 0, 12, 6);
        add_optim(OPT_ADAMW, be, 1, m2, &s1s, DT_F16, DT_F32, 0, 12, 6);
        for (int P = 1; P <= MAXW; P++) {
            if (g_quick && P > 3) continue;
            const int mp[1] = {P};
            const dt_layout l = dt_layout_1d(S_(0, k_orders[P % 3]));
            add_optim(OPT_SUM_SQUARES, be, 1, mp, &l, DT_F32, DT_F32, 0, 4 * P, 5);
        }
        add_optim(OPT_SUM_SQUARES, be, 1, m3, &r1, DT_F32, DT_F32, 0, 6, 5);
        const int m4[1] = {4};
        const dt_layout s0s = dt_layout_1d(S_(0, St));
        add_optim(OPT_SUM_SQUARES, be, 1, m4, &s0s, DT_F32, DT_F32, 1, 16, 5);
        add_optim(OPT_SUM_SQUARES, be, 2, m23, &s0r, DT_F32, DT_F32, 0, 6, 5);
        add_optim(OPT_SUM_SQUARES, be, 2, m22, &rz, DT_BF16, DT_F32, 0, 3, 8);
        add_optim(OPT_SUM_SQUARES, be, 0, NULL, NULL, DT_F16, DT_F32, 0, 7, 5);
        static const dt_dtype pairs[][2] = {{DT_F32, DT_BF16}, {DT_F32, DT_F16}, {DT_BF16, DT_F32},
                                            {DT_F16, DT_F32},  {DT_BF16, DT_F16}, {DT_F16, DT_BF16},
                                            {DT_F32, DT_F32}};
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
            add_optim(OPT_CONVERT, be, 0, NULL, NULL, pairs[i][0], pairs[i][1], 0, 8, 12);
            if (i < 3) add_optim(OPT_CONVERT, be, 1, m2, &s0, pairs[i][0], pairs[i][1], 0, 8, 12);
        }
        add_optim(OPT_CONVERT, be, 1, m2, &p1, DT_F32, DT_BF16, 0, 8, 12);
        const dt_layout s1r = dt_layout_2d(S_(1, St), R);
        add_optim(OPT_CONVERT, be, 2, m22, &s1r, DT_F16, DT_F32, 0, 8, 12);
    }

    add_errors(E_OPS, be, 1, 2, 1, "matmul+add+gelu+swiglu backward");
    add_errors(E_NN, be, 1, 2, 1, "reshape+rmsnorm+rotary backward+rotary documents");
    add_errors(E_EMBED_CE, be, 1, 2, 1, "embedding+cross_entropy+grad_reduce");
    add_errors(E_OPTIM, be, 1, 2, 1, "adamw+sum_squares+convert");
    add_errors(E_RESHAPE_MSG, be, 1, 2, 1, "reshape_backward names the Layout dy needs");
    add_errors(E_ZERO, be, 1, 2, 1, "zero-size vocabulary or embedding dim");
    add_errors(E_CE_ONE_RANK, be, 1, 3, 1, "cross_entropy target out of range on one rank of a row split");
    add_errors(E_CE_ONE_RANK_2D, be, 2, 2, 2, "cross_entropy target out of range on one dp coordinate");
#undef EACH_DT
}

int main(void) {
    g_quick = getenv("DT_TEST_QUICK") != NULL;
    g_tb.cap = 4096;
    g_tb.tests = calloc(g_tb.cap, sizeof *g_tb.tests);
    g_tb.names = calloc(g_tb.cap, sizeof *g_tb.names);
    g_tb.owned = calloc(g_tb.cap, sizeof *g_tb.owned);
    if (!g_tb.tests || !g_tb.names || !g_tb.owned) return 1;
    if (g_quick) print_message("DT_TEST_QUICK: P = 1 and 3 (CUDA: 3), the 2x2 mesh, every other Layout\n");

    char name[512];
    for (int f = 0; f < FD_KIND_COUNT; f++) {
        snprintf(name, sizeof name, "fd/%s", k_fd_names[f]);
        add(name, test_fd, (void *)(intptr_t)f);
    }
    add_op_cases(DT_BACKEND_CPU);
    add_op_cases(DT_BACKEND_CUDA);

    const int failed = h_run_cases("grad", g_tb.tests, g_tb.n);
    for (size_t i = 0; i < g_tb.n_owned; i++) free(g_tb.owned[i]);
    free(g_tb.owned);
    free(g_tb.tests);
    free(g_tb.names);
    return failed;
}
