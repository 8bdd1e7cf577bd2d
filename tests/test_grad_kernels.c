/* tests/test_grad_kernels.c — the compute backends' entries for gradients,
 * losses and the optimizer (dtensor/backend.h: gemm_ex, gelu_backward,
 * swiglu, swiglu_backward, rmsnorm_backward, rotary_inverse, embedding,
 * embedding_backward, i32_check, ce_max, ce_sum, ce_grad, absmax, sumsq,
 * convert, adamw), called directly through ctx->backend in a dt_launch rank
 * function, on random inputs (fixed seeds) in fp32, bf16 and fp16, odd sizes
 * and empty ones, against double-precision references written here from the
 * mathematics (not from the library's code). Every case runs on the CPU
 * backend, and on the CUDA backend where the build has it and a device
 * exists (make CUDA=emu: the emulator's); there the CPU backend runs the
 * same call too and the two must agree within the sum of their bounds
 * (adamw: bit for bit, the same fp32 operations). Without a device the CUDA
 * cases are skipped with the reason.
 *
 * Inputs are values of their dtype, so a reference sees what the backend
 * sees. Outputs an op must overwrite start as NaN (so a call that reads
 * them, or leaves some unwritten, fails); accumulated ones start random.
 * Cases marked "nonfinite" put NaN and +-inf into the inputs: the
 * reference, in double, gives NaN or inf where the mathematics does (the
 * limits of gelu' and silu at +-inf; 0 * inf is NaN), and the backend must
 * give the same (NaN for NaN; inf of the same sign).
 *
 * Tolerances, |got - ref| <= bound, per element; u = 2^-24 (fp32's
 * rounding), u_d that of the output dtype (2^-24, 2^-8, 2^-11) and s_d half
 * its smallest spacing (fp16: 2^-25; else 2^-126, as much as fp32's
 * subnormals can lose); every bound adds u_d |ref| + s_d (the final
 * rounding), and where the op accumulates, u (|t| + |old|) (the fp32 sum
 * of the new term t and the old value):
 *   gemm_ex          (k + 2) u (A + |beta C|), A = |alpha| sum |a||b|
 *                    (fp32 accumulation; TF32 on: + 2^-10 A)
 *   gelu_backward    CPU (double, rounded once): 2u |t| + 2^-45 X M;
 *                    CUDA (fp32 erfcf, expf): 16 u X M + 16 FLT_MIN |dy|;
 *                    M = |dy| (|first term| + |second term|) of gelu' (no
 *                    cancellation is credited), X = 1 + x^2, at most 256:
 *                    the exponent's argument, formed in fp32 from x
 *   swiglu           CPU fp32 3.32u |t|, CPU bf16 and fp16 (double, rounded
 *                    once) 2u |t|, CUDA 16u |t|. CPU fp32 (dt_vsilu_f8,
 *                    base/cpu_vec.h): e^-g = t (1 + q) within 0.9u, d = 1 +
 *                    t + t q one rounding (0.42u more where 1 + t is
 *                    inexact, t >= 2^24: t q + 1 rounded first), silu = g / d
 *                    one more: (2.42 + 0.9)u
 *   swiglu_backward  the same, with M = |dy up| s (1 + |g| (1 - s)) for
 *                    dgate (silu' = s (1 + g (1 - s))) and no X (g is exact);
 *                    CPU fp32 dgate 8.9u M: silu' = (1 + g (E / d1)) / d1
 *                    with E = e^-g within 1.9u (1 + q rounded) and d1 = 1 +
 *                    E, within (6u + 1.9u) s (1 + |g| (1 - s)) (E's error
 *                    enters through d1 and E / d1 with weights summing to 1,
 *                    d1's rounding twice, four roundings more), dy up one more
 *   rmsnorm_backward 2u |t| + 2^-40 M (both backends in double; M the sums
 *                    of the terms' magnitudes)
 *   rotary_inverse   4u (|a| + |b|) (cos and sin rounded to fp32, three
 *                    roundings); rotary then rotary_inverse gives x back
 *                    within 8u (|a| + |b|) + 3 u_d (|a| + |b|)
 *   embedding, ce_max, absmax, convert, i32_check and ce_sum's tl: exact
 *   embedding_bwd    c u (|old| + sum |dy|), c = the rows summed + 1
 *   ce_sum           (2n + 8) u se (an fp32 sum of n terms, each within
 *                    4 + |x - m| ulp; se >= 1)
 *   ce_grad          dx: (4 + |x - m|) u p |scale| + 2u |ref|;
 *                    loss: 2u (|m| + |log se| + |tl|) + 2u |loss|
 *   sumsq            2^-40 |ref| (double accumulation)
 *   adamw            m: 4u (|b1 m| + |(1 - b1) g|), v: 5u (|b2 v| +
 *                    |(1 - b2) g^2|), master: 3u |master| + the update's
 *                    relative error (from m's and v's, and six roundings)
 *                    + u |ref|
 *
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

#ifdef DT_HAVE_CUDA
#include "dtensor/backend_cuda.h"
#endif
#include "harness.h"
#include "dtensor/backend.h"
#include "dtensor/context_internal.h"
#include "dtensor/tensor.h"

#define U32 0x1p-24
/* The CPU backend's fp32 SwiGLU, computed in fp32 (bounds derived above): out and
 * dup in u |t|, dgate in u M. */
#define SW_F32 3.32
#define SW_BWD_F32 8.9
#define PI 3.14159265358979323846

/* ------------------------------------------------------------------ cases */

typedef enum gk_op {
    OP_GEMM_EX, OP_GELU_BWD, OP_SWIGLU, OP_SWIGLU_BWD, OP_RMSNORM_BWD, OP_ROTARY_INV, OP_EMBEDDING,
    OP_EMBEDDING_BWD, OP_I32_CHECK, OP_CE_MAX, OP_CE_SUM, OP_CE_GRAD, OP_ABSMAX, OP_SUMSQ,
    OP_CONVERT, OP_ADAMW, OP_ERRORS
} gk_op;

static const char *const op_names[] = {
    "gemm_ex", "gelu_backward", "swiglu", "swiglu_backward", "rmsnorm_backward", "rotary_inverse",
    "embedding", "embedding_backward", "i32_check", "ce_max", "ce_sum", "ce_grad", "absmax",
    "sumsq", "convert", "adamw", "errors"};

typedef struct gk_case {
    gk_op op;
    dt_backend_kind backend;
    dt_dtype dtype, dtype2;   /* convert: source, destination */
    int64_t s[4];             /* sizes (per op) */
    int p[4];                 /* switches (per op) */
    int nonfinite;            /* NaN and inf in the inputs */
    uint64_t seed;
    char name[192];
    /* results */
    dt_status st;
    long bad;
    char msg[768];
} gk_case;

/* Sizes and switches of each op (s, p):
 *   gemm_ex           s = m, n, k;            p = trans_a, trans_b, beta (0 or 1)
 *   gelu_backward     s = n;                  p = approx, accumulate
 *   swiglu            s = n;                  p = wide gates (see setup)
 *   swiglu_backward   s = n;                  p = accumulate, outputs (0 both, 1 dgate, 2 dup),
 *                                             wide gates
 *   rmsnorm_backward  s = rows, n;            p = weighted, accumulate, outputs (as above: dx, dw)
 *   rotary_inverse    s = outer, rows, inner, d; p = style, large positions, round trip,
 *                     pos_stride (0: one position list for every outer row)
 *   embedding(_bwd)   s = n, d, rows, lo;     p = accumulate
 *   i32_check         s = n, limit;           p = bad values (0 none, 1 three, 2 many),
 *                                             ignore (0: -100, 1: 7, a class)
 *   ce_*              s = rows, n, lo;         p = (ce_grad) dx NULL, wide (some logits
 *                                             below -87)
 *   absmax, sumsq     s = n
 *   convert           s = n (dtype -> dtype2)
 *   adamw             s = n;                  p = step, param is master */

/* ------------------------------------------------------------- buffers */

enum { MAXB = 8 };

typedef struct buf {
    const char *name;
    dt_dtype dt;
    size_t n;
    int out;            /* checked after the call */
    int host;           /* a host output (absmax, sumsq, i32_check): got is written by the call */
    void *h;            /* host contents before the call (the dtype's storage) */
    void *d;            /* backend memory */
    double *got, *ref, *tol;
} buf;

typedef struct io {
    int nb;
    buf b[MAXB];
    int64_t *pos;       /* rotary positions (host) */
    int alloc_failed;
} io;

static size_t dt_size(dt_dtype dt) { return dt_dtype_size(dt); }

static double hget(const buf *b, size_t i) {
    switch (b->dt) {
    case DT_I32: return ((const int32_t *)b->h)[i];
    case DT_U8: return ((const uint8_t *)b->h)[i];
    default: return dt_value_get(b->h, b->dt, i);
    }
}

static void hset(buf *b, size_t i, double v) {
    switch (b->dt) {
    case DT_I32: ((int32_t *)b->h)[i] = (int32_t)v; break;
    case DT_U8: ((uint8_t *)b->h)[i] = (uint8_t)v; break;
    default: dt_value_set(b->h, b->dt, i, (float)v); break;
    }
}

/* Element i of what a backend left in an output of dtype dt (host copy p). */
static double vget(const void *p, dt_dtype dt, size_t i) {
    switch (dt) {
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_U8: return ((const uint8_t *)p)[i];
    default: return dt_value_get(p, dt, i);
    }
}

static buf *add_buf(io *o, const char *name, dt_dtype dt, size_t n, int out) {
    buf *b = &o->b[o->nb++];
    memset(b, 0, sizeof *b);
    b->name = name;
    b->dt = dt;
    b->n = n;
    b->out = out;
    b->h = calloc(n * dt_size(dt) + 16, 1);
    if (out) {
        b->got = calloc(n + 1, sizeof(double));
        b->ref = calloc(n + 1, sizeof(double));
        b->tol = calloc(n + 1, sizeof(double));
    }
    if (!b->h || (out && (!b->got || !b->ref || !b->tol))) o->alloc_failed = 1;
    return b;
}

static buf *add_host_out(io *o, const char *name, size_t n) {
    buf *b = add_buf(o, name, DT_F32, n, 1);
    b->host = 1;
    return b;
}

static void io_free(io *o) {
    for (int k = 0; k < o->nb; k++) {
        free(o->b[k].h);
        free(o->b[k].got);
        free(o->b[k].ref);
        free(o->b[k].tol);
    }
    free(o->pos);
    memset(o, 0, sizeof *o);
}

/* Uniform in [-1, 1), from (seed, input id, index). */
static double rnd(uint64_t seed, int id, size_t i) {
    return dt_random_value(seed * 1000003u + (uint64_t)id * 7919u, (uint64_t)i);
}

/* A 64-bit hash of (seed, id, i), for integers. */
static uint64_t hash3(uint64_t seed, int id, size_t i) {
    uint64_t h = seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)id << 32) ^ (uint64_t)i;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 29;
    h *= 0x94d049bb133111ebULL;
    return h ^ (h >> 32);
}

static void fill(buf *b, uint64_t seed, int id, double scale, double offset) {
    for (size_t i = 0; i < b->n; i++) hset(b, i, offset + scale * rnd(seed, id, i));
}

static void fill_nan(buf *b) {
    for (size_t i = 0; i < b->n; i++) hset(b, i, NAN);
}

static double u_of(dt_dtype dt) {
    return dt == DT_BF16 ? 0x1p-8 : dt == DT_F16 ? 0x1p-11 : U32;
}

static double s_of(dt_dtype dt) { return dt == DT_F16 ? 0x1p-25 : 0x1p-126; }

/* The bound of an output element of dtype dt: e (the value's own error),
 * plus the fp32 sum with the old value (accumulate), plus the rounding. */
static double out_tol(dt_dtype dt, double e, double t, double old, int acc, double ref) {
    return e + (acc ? U32 * (fabs(t) + fabs(old)) : 0.0) + u_of(dt) * fabs(ref) + s_of(dt);
}

/* ------------------------------------------------------------- the ops */

#define TRY(expr)                                                             \
    do {                                                                      \
        dt_status st_ = (expr);                                               \
        if (st_ != DT_SUCCESS) return st_;                                    \
    } while (0)

/* The AdamW hyperparameters of every case. */
static const float AW_GSCALE = 0.5f, AW_LR = 1e-3f, AW_B1 = 0.9f, AW_B2 = 0.999f, AW_EPS = 1e-8f,
                   AW_WD = 0.01f;
#define CE_IGNORE (-100)
/* i32_check's ignore: -100, or (p[1]) a class, 7 */
#define I32_IGNORE(c) ((c)->p[1] ? 7 : -100)
#define CE_SCALE 0.125f
#define GEMM_ALPHA (-1.5f)
#define ROPE_BASE 10000.0

/* Buffers, their contents and (for rotary) the positions. */
static void setup(const gk_case *c, io *o) {
    const dt_dtype dt = c->dtype;
    const uint64_t sd = c->seed;
    const int nf = c->nonfinite;
    switch (c->op) {
    case OP_GEMM_EX: {
        const int64_t m = c->s[0], n = c->s[1], k = c->s[2];
        buf *a = add_buf(o, "A", dt, (size_t)(m * k), 0);
        buf *b = add_buf(o, "B", dt, (size_t)(k * n), 0);
        buf *cc = add_buf(o, "C", dt, (size_t)(m * n), 1);
        if (o->alloc_failed) return;
        fill(a, sd, 1, 1.0, 0.0);
        fill(b, sd, 2, 1.0, 0.0);
        if (c->p[2]) fill(cc, sd, 3, 1.0, 0.0);
        else fill_nan(cc);   /* beta 0 never reads C */
        if (nf && m * k > 0 && k * n > 0) {
            hset(a, 0, NAN);                    /* op(A)[0, 0]: row 0 of C */
            hset(b, (size_t)(k * n - 1), INFINITY); /* op(B)[k-1, n-1]: column n-1 */
        }
        break;
    }
    case OP_GELU_BWD:
    case OP_SWIGLU:
    case OP_SWIGLU_BWD: {
        const size_t n = (size_t)c->s[0];
        buf *x = add_buf(o, c->op == OP_GELU_BWD ? "x" : "gate", dt, n, 0);
        buf *y = c->op == OP_GELU_BWD ? NULL : add_buf(o, "up", dt, n, 0);
        buf *dy = c->op == OP_SWIGLU ? NULL : add_buf(o, "dy", dt, n, 0);
        const int acc = c->op == OP_GELU_BWD ? c->p[1] : c->op == OP_SWIGLU_BWD ? c->p[0] : 0;
        buf *o1 = NULL, *o2 = NULL;
        if (c->op == OP_SWIGLU_BWD) {
            o1 = add_buf(o, "dgate", dt, n, c->p[1] != 2);
            o2 = add_buf(o, "dup", dt, n, c->p[1] != 1);
        } else {
            o1 = add_buf(o, c->op == OP_GELU_BWD ? "dx" : "out", dt, n, 1);
        }
        if (o->alloc_failed) return;
        fill(x, sd, 1, 8.0, 0.0);
        if (y) fill(y, sd, 2, 2.0, 0.0);
        if (dy) fill(dy, sd, 3, 1.0, 0.0);
        const int wide = c->op == OP_SWIGLU ? c->p[0] : c->op == OP_SWIGLU_BWD ? c->p[2] : 0;
        if (wide) {
            /* Gates beyond the CPU's fp32 vector path (|g| > 87, up to
             * 127.5, where silu is normal down to g = -92, then subnormal
             * and 0; 0 < |g| < 2^-125) in some blocks of eight, its edges
             * (+-87, 2^-125, +-0) in others, so that one call runs both
             * paths. */
            for (size_t i = 0; i < n; i++) {
                const double r = rnd(sd, 6, i);
                if (i % 24 == 5) hset(x, i, copysign(87.5 + 40.0 * fabs(r), r));
                if (i % 24 == 13) hset(x, i, r < 0 ? -87.0 : 87.0);
                if (i % 48 == 21) hset(x, i, r < 0 ? -0.0 : 0.0);
            }
            if (n > 40) {
                hset(x, 29, 0x1p-130);
                hset(x, 37, 0x1p-125);
                hset(x, 38, -0x1.8p-125);
            }
            /* dy up overflows fp32 where the product dgate does not (CPU
             * only: the CUDA kernel forms dy up in fp32) */
            if (n > 60 && dy && c->backend == DT_BACKEND_CPU) {
                hset(x, 53, -20.0);
                hset(y, 53, 3e19);
                hset(dy, 53, -3e19);
            }
        }
        for (buf *ob = o1; ob; ob = ob == o1 ? o2 : NULL) {
            if (acc) fill(ob, sd, ob == o1 ? 4 : 5, 1.0, 0.0);
            else fill_nan(ob);
        }
        if (nf && n >= 10) {
            hset(x, 8, 1e30);   /* fp16: inf */
            hset(x, 9, -1e30);
            hset(x, 0, NAN);
            hset(x, 1, INFINITY);
            hset(x, 2, -INFINITY);
            if (dy) hset(dy, 3, NAN);
            if (dy) hset(dy, 4, INFINITY);
            if (y) {
                hset(y, 5, NAN);
                hset(y, 6, -INFINITY);
                hset(x, 7, -INFINITY);
                hset(y, 7, INFINITY);   /* silu(-inf) up = 0 inf: NaN */
            }
        }
        break;
    }
    case OP_RMSNORM_BWD: {
        const int64_t rows = c->s[0], n = c->s[1];
        const int weighted = c->p[0], acc = c->p[1], outs = c->p[2];
        buf *x = add_buf(o, "x", dt, (size_t)(rows * n), 0);
        buf *w = weighted ? add_buf(o, "w", dt, (size_t)n, 0) : NULL;
        buf *dy = add_buf(o, "dy", dt, (size_t)(rows * n), 0);
        buf *dx = outs != 2 ? add_buf(o, "dx", dt, (size_t)(rows * n), 1) : NULL;
        /* without w, dw is passed all the same, and must stay as it is */
        buf *dw = outs != 1 ? add_buf(o, "dw", dt, (size_t)n, 1) : NULL;
        if (o->alloc_failed) return;
        fill(x, sd, 1, 2.0, 0.0);
        if (w) fill(w, sd, 2, 0.5, 1.0);
        fill(dy, sd, 3, 1.0, 0.0);
        if (dx) {
            if (acc) fill(dx, sd, 4, 1.0, 0.0);
            else fill_nan(dx);
        }
        if (dw) {
            if (acc || !weighted) fill(dw, sd, 5, 1.0, 0.0);
            else fill_nan(dw);
        }
        if (nf && rows >= 2 && n >= 3) {
            hset(x, (size_t)(1 * n + 2), NAN);   /* row 1 */
            hset(dy, 0, INFINITY);               /* row 0 */
        }
        break;
    }
    case OP_ROTARY_INV: {
        const int64_t outer = c->s[0], rows = c->s[1], inner = c->s[2], d = c->s[3];
        const size_t n = (size_t)(outer * rows * inner * d);
        buf *x = add_buf(o, "x", dt, n, 0);
        buf *out = add_buf(o, "out", dt, n, 1);
        if (c->p[2]) add_buf(o, "rotated", dt, n, 0);   /* the round trip's middle */
        const int64_t n_pos = c->p[3] ? (outer - 1) * c->p[3] + rows : rows;
        o->pos = malloc((size_t)(n_pos + 1) * sizeof *o->pos);
        if (o->alloc_failed || !o->pos) {
            o->alloc_failed = 1;
            return;
        }
        fill(x, sd, 1, 3.0, 0.0);
        fill_nan(out);
        for (int64_t j = 0; j < n_pos; j++)
            o->pos[j] = c->p[1] ? 1000000 + (j * 7919 % 1000) * 997 : 3 * j + 5;
        if (nf && n >= 4) {
            hset(x, 0, NAN);
            hset(x, n - 1, INFINITY);
        }
        break;
    }
    case OP_EMBEDDING:
    case OP_EMBEDDING_BWD: {
        const int64_t n = c->s[0], d = c->s[1], rows = c->s[2], lo = c->s[3];
        buf *tok = add_buf(o, "tok", DT_I32, (size_t)n, 0);
        buf *src = c->op == OP_EMBEDDING ? add_buf(o, "table", dt, (size_t)(rows * d), 0)
                                         : add_buf(o, "dy", dt, (size_t)(n * d), 0);
        buf *dst = c->op == OP_EMBEDDING ? add_buf(o, "out", dt, (size_t)(n * d), 1)
                                         : add_buf(o, "dtable", dt, (size_t)(rows * d), 1);
        if (o->alloc_failed) return;
        /* in range, below, above, and -100 (an ignore index) */
        for (int64_t i = 0; i < n; i++)
            hset(tok, (size_t)i, i % 5 == 4 ? -100.0
                                             : (double)(lo - 2 + (int64_t)(hash3(sd, 1, (size_t)i) %
                                                                           (uint64_t)(rows + 4))));
        fill(src, sd, 2, 1.0, 0.0);
        if (c->op == OP_EMBEDDING_BWD && c->p[0]) fill(dst, sd, 3, 1.0, 0.0);
        else fill_nan(dst);
        if (nf) {
            /* a NaN and an inf in rows some token selects */
            int64_t hit[2] = {-1, -1}, nh = 0;
            for (int64_t i = 0; i < n && nh < 2; i++) {
                const int64_t r = (int64_t)hget(tok, (size_t)i) - lo;
                if (r >= 0 && r < rows && (nh == 0 || r != (int64_t)hget(tok, (size_t)hit[0]) - lo))
                    hit[nh++] = i;
            }
            for (int64_t k = 0; k < nh && d > 1; k++) {
                const int64_t row = c->op == OP_EMBEDDING ? (int64_t)hget(tok, (size_t)hit[k]) - lo
                                                          : hit[k];
                hset(src, (size_t)(row * d + k), k == 0 ? NAN : -INFINITY);
            }
        }
        break;
    }
    case OP_I32_CHECK: {
        const int64_t n = c->s[0], limit = c->s[1];
        buf *x = add_buf(o, "x", DT_I32, (size_t)n, 0);
        add_host_out(o, "valid", 1);
        add_host_out(o, "bad", 1);
        if (o->alloc_failed) return;
        for (int64_t i = 0; i < n; i++)
            hset(x, (size_t)i, i % 7 == 6 ? (double)I32_IGNORE(c) : (double)(hash3(sd, 1, (size_t)i) % (uint64_t)limit));
        if (c->p[0] == 1 && n > 0) {
            /* the first bad value at n/3; more after it */
            hset(x, (size_t)(n / 3), (double)limit);
            if (n > 2) hset(x, (size_t)(n / 2), -1.0);
            if (n > 3) hset(x, (size_t)(n - 1), 2147483647.0);
        }
        /* every value bad from n/5 on: several in each thread's share */
        for (int64_t i = n / 5; c->p[0] == 2 && i < n; i++)
            hset(x, (size_t)i, i % 2 ? (double)(limit + i) : (double)(-1 - i));
        break;
    }
    case OP_CE_MAX:
    case OP_CE_SUM:
    case OP_CE_GRAD: {
        const int64_t rows = c->s[0], n = c->s[1], lo = c->s[2];
        buf *x = add_buf(o, "x", dt, (size_t)(rows * n), 0);
        if (o->alloc_failed) return;
        fill(x, sd, 1, 6.0, 0.0);
        for (int64_t e = 5; c->p[1] && e < rows * n; e += 13)   /* wide: e^(x - m) < 2^-125 */
            hset(x, (size_t)e, -100.0 - (double)(e % 23));
        if (nf && n >= 2) {
            if (rows >= 1) hset(x, 1, NAN);                                 /* row 0 */
            if (rows >= 2) hset(x, (size_t)n, INFINITY);                    /* row 1 */
            if (rows >= 3) hset(x, (size_t)(2 * n), -INFINITY);             /* row 2 */
            if (rows >= 4) hset(x, (size_t)(3 * n + 1), NAN);               /* row 3: ignored */
        }
        if (c->op == OP_CE_MAX) {
            buf *m = add_buf(o, "m", DT_F32, (size_t)rows, 1);
            if (!o->alloc_failed) fill_nan(m);
            break;
        }
        buf *m = add_buf(o, "m", DT_F32, (size_t)rows, 0);
        buf *tgt = add_buf(o, "tgt", DT_I32, (size_t)rows, 0);
        if (o->alloc_failed) return;
        for (int64_t r = 0; r < rows; r++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                const double v = hget(x, (size_t)(r * n + j));
                if (isnan(v) || isnan(mx)) mx = NAN;
                else if (v > mx) mx = v;
            }
            hset(m, (size_t)r, mx);
            /* lo - 1 .. lo + n + 1 (some out of this shard's range); every
             * fourth row (from row 3) the ignore index */
            hset(tgt, (size_t)r, r % 4 == 3 ? -100.0 : (double)(lo - 1 + (r * 7 + 3) % (n + 3)));
        }
        if (c->op == OP_CE_SUM) {
            buf *se = add_buf(o, "se", DT_F32, (size_t)rows, 1);
            buf *tl = add_buf(o, "tl", DT_F32, (size_t)rows, 1);
            if (o->alloc_failed) return;
            fill_nan(se);
            fill_nan(tl);
            break;
        }
        buf *se = add_buf(o, "se", DT_F32, (size_t)rows, 0);
        buf *tl = add_buf(o, "tl", DT_F32, (size_t)rows, 0);
        buf *dx = add_buf(o, "dx", dt, (size_t)(rows * n), !c->p[0]);   /* p[0]: dx NULL */
        buf *loss = add_buf(o, "loss", DT_F32, (size_t)rows, 1);
        if (o->alloc_failed) return;
        for (int64_t r = 0; r < rows; r++) {
            double s = 0.0;
            const double mr = hget(m, (size_t)r);
            for (int64_t j = 0; j < n; j++) s += exp(hget(x, (size_t)(r * n + j)) - mr);
            hset(se, (size_t)r, s);
            const int64_t t = (int64_t)hget(tgt, (size_t)r) - lo;
            hset(tl, (size_t)r, t >= 0 && t < n ? hget(x, (size_t)(r * n + t)) : 0.0);
        }
        fill_nan(dx);
        fill_nan(loss);
        break;
    }
    case OP_ABSMAX:
    case OP_SUMSQ: {
        const int64_t n = c->s[0];
        buf *x = add_buf(o, "x", dt, (size_t)n, 0);
        add_host_out(o, c->op == OP_ABSMAX ? "absmax" : "sumsq", 1);
        if (o->alloc_failed) return;
        fill(x, sd, 1, 4.0, 0.0);
        /* p[0]: 1 a NaN, 2 infinities, 3 both */
        if ((c->p[0] & 2) && n >= 3) {
            hset(x, (size_t)(n / 2), INFINITY);
            hset(x, (size_t)(n - 1), -INFINITY);
        }
        if ((c->p[0] & 1) && n >= 1) hset(x, (size_t)(n - 1) / 3, NAN);
        break;
    }
    case OP_CONVERT: {
        const int64_t n = c->s[0];
        buf *src = add_buf(o, "src", c->dtype, (size_t)n, 0);
        buf *dst = add_buf(o, "dst", c->dtype2, (size_t)n, 1);
        if (o->alloc_failed) return;
        if (dt_dtype_is_float(c->dtype)) {
            /* magnitudes 2^-30 .. 2^17: fp16 subnormals and overflow, bf16's rounding */
            for (int64_t i = 0; i < n; i++)
                hset(src, (size_t)i,
                     ldexp(rnd(sd, 1, (size_t)i), (int)(hash3(sd, 2, (size_t)i) % 48) - 30));
            const double special[] = {NAN, INFINITY, -INFINITY, -0.0, 65504.0, 65520.0, 65519.0,
                                      0x1p-25, 0x3p-26, 1.0 + 0x1p-8, 1.0 + 0x3p-8};
            for (size_t k = 0; k < sizeof special / sizeof *special && (int64_t)k < n; k++)
                hset(src, (size_t)(n - 1) - k * (size_t)(n / 11 > 0 ? n / 11 : 1) % (size_t)n,
                     special[k]);
        } else {
            for (int64_t i = 0; i < n; i++) hset(src, (size_t)i, (double)(hash3(sd, 1, (size_t)i) % 251));
        }
        fill_nan(dst);
        break;
    }
    case OP_ADAMW: {
        const size_t n = (size_t)c->s[0];
        const int alias = c->p[1];
        buf *master = add_buf(o, "master", DT_F32, n, 1);
        buf *param = alias ? NULL : add_buf(o, "param", dt, n, 1);
        buf *m = add_buf(o, "m", DT_F32, n, 1);
        buf *v = add_buf(o, "v", DT_F32, n, 1);
        buf *g = add_buf(o, "grad", dt, n, 0);
        if (o->alloc_failed) return;
        fill(master, sd, 1, 1.0, 0.0);
        for (size_t i = 0; param && i < n; i++) hset(param, i, hget(master, i));
        fill(m, sd, 3, 1e-2, 0.0);
        for (size_t i = 0; i < n; i++) hset(v, i, 1e-6 + 1e-4 * fabs(rnd(sd, 4, i)));
        fill(g, sd, 5, 0.1, 0.0);
        if (c->nonfinite && n >= 2) {
            hset(g, 0, NAN);
            hset(g, 1, INFINITY);
        }
        break;
    }
    case OP_ERRORS: break;
    }
}

/* The call, on backend memory (host outputs straight into got). */
static dt_status call(dt_backend *be, const gk_case *c, io *o) {
    const dt_backend_ops *f = be->ops;
    const dt_dtype dt = c->dtype;
    buf *b = o->b;
    switch (c->op) {
    case OP_GEMM_EX:
        return f->gemm_ex(be, dt, c->p[0], c->p[1], c->s[0], c->s[1], c->s[2], GEMM_ALPHA, b[0].d,
                          b[1].d, c->p[2] ? 1.0f : 0.0f, b[2].d);
    case OP_GELU_BWD:
        return f->gelu_backward(be, dt, c->s[0], b[0].d, b[1].d, b[2].d, (dt_gelu_approx)c->p[0],
                                c->p[1]);
    case OP_SWIGLU: return f->swiglu(be, dt, c->s[0], b[0].d, b[1].d, b[2].d);
    case OP_SWIGLU_BWD:
        return f->swiglu_backward(be, dt, c->s[0], b[0].d, b[1].d, b[2].d,
                                  c->p[1] != 2 ? b[3].d : NULL, c->p[1] != 1 ? b[4].d : NULL,
                                  c->p[0]);
    case OP_RMSNORM_BWD: {
        int k = 0;
        void *x = b[k++].d, *w = c->p[0] ? b[k++].d : NULL, *dy = b[k++].d;
        void *dx = c->p[2] != 2 ? b[k++].d : NULL, *dw = c->p[2] != 1 ? b[k++].d : NULL;
        return f->rmsnorm_backward(be, dt, c->s[0], c->s[1], x, w, 1e-5f, dy, dx, dw, c->p[1]);
    }
    case OP_ROTARY_INV:
        if (c->p[2]) {
            TRY(f->rotary(be, dt, c->s[0], c->s[1], c->s[2], c->s[3], o->pos, c->p[3], ROPE_BASE,
                          (dt_rotary_style)c->p[0], b[0].d, b[2].d));
            return f->rotary_inverse(be, dt, c->s[0], c->s[1], c->s[2], c->s[3], o->pos, c->p[3],
                                     ROPE_BASE, (dt_rotary_style)c->p[0], b[2].d, b[1].d);
        }
        return f->rotary_inverse(be, dt, c->s[0], c->s[1], c->s[2], c->s[3], o->pos, c->p[3],
                                 ROPE_BASE, (dt_rotary_style)c->p[0], b[0].d, b[1].d);
    case OP_EMBEDDING:
        return f->embedding(be, dt, c->s[0], c->s[1], b[0].d, c->s[3], c->s[2], b[1].d, b[2].d);
    case OP_EMBEDDING_BWD:
        return f->embedding_backward(be, dt, c->s[0], c->s[1], b[0].d, c->s[3], c->s[2], b[1].d,
                                     b[2].d, c->p[0]);
    case OP_I32_CHECK: {
        int64_t valid = -7, bad = -7;
        TRY(f->i32_check(be, c->s[0], b[0].d, c->s[1], I32_IGNORE(c), &valid, &bad));
        b[1].got[0] = (double)valid;
        b[2].got[0] = (double)bad;
        return DT_SUCCESS;
    }
    case OP_CE_MAX: return f->ce_max(be, dt, c->s[0], c->s[1], b[0].d, b[1].d);
    case OP_CE_SUM:
        return f->ce_sum(be, dt, c->s[0], c->s[1], b[0].d, b[1].d, b[2].d, c->s[2], b[3].d,
                         b[4].d);
    case OP_CE_GRAD:
        return f->ce_grad(be, dt, c->s[0], c->s[1], b[0].d, b[1].d, b[3].d, b[4].d, b[2].d,
                          c->s[2], CE_IGNORE, CE_SCALE, c->p[0] ? NULL : b[5].d, b[6].d);
    case OP_ABSMAX: {
        float v = -7.0f;
        TRY(f->absmax(be, dt, c->s[0], b[0].d, &v));
        b[1].got[0] = v;
        return DT_SUCCESS;
    }
    case OP_SUMSQ: {
        double v = -7.0;
        TRY(f->sumsq(be, dt, c->s[0], b[0].d, &v));
        b[1].got[0] = v;
        return DT_SUCCESS;
    }
    case OP_CONVERT: return f->convert(be, c->s[0], c->dtype, b[0].d, c->dtype2, b[1].d);
    case OP_ADAMW: {
        const int alias = c->p[1];
        buf *master = &b[0], *param = alias ? &b[0] : &b[1];
        buf *m = &b[alias ? 1 : 2], *v = &b[alias ? 2 : 3], *g = &b[alias ? 3 : 4];
        return f->adamw(be, dt, c->s[0], param->d, master->d, m->d, v->d, g->d, AW_GSCALE, AW_LR,
                        AW_B1, AW_B2, AW_EPS, AW_WD, c->p[0]);
    }
    case OP_ERRORS: break;
    }
    return DT_ERR_INTERNAL;
}

/* Uploads the buffers, calls, downloads the outputs into got. */
static dt_status run(dt_backend *be, const gk_case *c, io *o) {
    dt_status st = DT_SUCCESS;
    for (int k = 0; k < o->nb && st == DT_SUCCESS; k++) {
        buf *b = &o->b[k];
        b->d = NULL;
        if (b->host) continue;
        const size_t bytes = b->n * dt_size(b->dt);
        st = be->ops->alloc(be, bytes, &b->d);
        if (st == DT_SUCCESS) st = be->ops->upload(be, b->d, b->h, bytes);
    }
    if (st == DT_SUCCESS) st = call(be, c, o);
    for (int k = 0; k < o->nb && st == DT_SUCCESS; k++) {
        buf *b = &o->b[k];
        if (!b->out || b->host) continue;
        const size_t bytes = b->n * dt_size(b->dt);
        void *tmp = malloc(bytes + 16);
        if (!tmp) {
            st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory");
            break;
        }
        st = be->ops->download(be, tmp, b->d, bytes);
        for (size_t i = 0; st == DT_SUCCESS && i < b->n; i++) b->got[i] = vget(tmp, b->dt, i);
        free(tmp);
    }
    for (int k = 0; k < o->nb; k++)
        if (o->b[k].d) be->ops->free(be, o->b[k].d);
    return st;
}

/* ------------------------------------------------------------ references */

/* gelu'(x) and the magnitude of its terms. erf: Phi + x phi; tanh form:
 * d/dx of x s(2u), u = sqrt(2/pi) (x + 0.044715 x^3), with s(2u) = (1 +
 * tanh u) / 2 and its complement each formed as a sigmoid (no cancellation
 * in either). Limits 0 and 1 at -inf and +inf. */
static void ref_gelu_grad(double x, int tanh_form, double *gp, double *mag) {
    if (isinf(x)) {
        *gp = x > 0 ? 1.0 : 0.0;
        *mag = *gp;
        return;
    }
    double a, b;
    if (!tanh_form) {
        a = 0.5 * erfc(-x / sqrt(2.0));
        b = x * exp(-0.5 * x * x) / sqrt(2.0 * PI);
    } else {
        const double k = sqrt(2.0 / PI), c3 = 0.044715;
        const double u = k * (x + c3 * x * x * x);
        const double s = 1.0 / (1.0 + exp(-2.0 * u)), sc = 1.0 / (1.0 + exp(2.0 * u));
        a = s;
        b = s * sc == 0.0 ? 0.0 : 2.0 * x * s * sc * k * (1.0 + 3.0 * c3 * x * x);
    }
    *gp = a + b;
    *mag = fabs(a) + fabs(b);
}

/* silu(g), silu'(g) and the magnitude of silu''s terms; limits at +-inf. */
static void ref_silu(double g, double *silu, double *dsilu, double *mag) {
    if (isinf(g)) {
        *silu = g > 0 ? g : 0.0;
        *dsilu = g > 0 ? 1.0 : 0.0;
        *mag = *dsilu;
        return;
    }
    const double s = 1.0 / (1.0 + exp(-g)), sc = 1.0 / (1.0 + exp(g));
    *silu = g * s;
    *dsilu = s * (1.0 + g * sc);
    *mag = s * (1.0 + fabs(g) * sc);
}

/* x rounded to nearest even in dtype dt, from the formats' parameters
 * (precision p bits, smallest normal exponent emin, largest finite). */
static double ref_round(double x, dt_dtype dt) {
    if (!isfinite(x) || x == 0.0 || dt == DT_I32 || dt == DT_U8) return x;
    const int p = dt == DT_F32 ? 24 : dt == DT_BF16 ? 8 : 11;
    const int emin = dt == DT_F16 ? -14 : -126;
    const double max = dt == DT_F16 ? 65504.0 : dt == DT_BF16 ? 0x1.fep127 : (double)FLT_MAX;
    int e = ilogb(x);
    if (e < emin) e = emin;
    const double q = ldexp(1.0, e - p + 1);   /* the spacing at x */
    const double r = rint(x / q) * q;         /* rint: nearest, ties to even */
    return fabs(r) > max ? copysign(INFINITY, x) : r;
}

/* ref and tol of every output, for the backend `cuda` says. */
static void reference(const gk_case *c, io *o, int cuda, int tf32) {
    const dt_dtype dt = c->dtype;
    buf *b = o->b;
    switch (c->op) {
    case OP_GEMM_EX: {
        const int64_t m = c->s[0], n = c->s[1], k = c->s[2];
        const int ta = c->p[0], tb = c->p[1];
        const double beta = c->p[2] ? 1.0 : 0.0, alpha = GEMM_ALPHA;
        buf *A = &b[0], *B = &b[1], *C = &b[2];
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0.0, sa = 0.0;
                for (int64_t l = 0; l < k; l++) {
                    const double av = hget(A, (size_t)(ta ? l * m + i : i * k + l));
                    const double bv = hget(B, (size_t)(tb ? j * k + l : l * n + j));
                    s += av * bv;
                    sa += fabs(av * bv);
                }
                const double c0 = beta != 0.0 ? hget(C, (size_t)(i * n + j)) : 0.0;
                const double r = alpha * s + beta * c0;
                const double mag = fabs(alpha) * sa + fabs(beta * c0);
                C->ref[i * n + j] = r;
                C->tol[i * n + j] = (double)(k + 2) * U32 * mag +
                                    (tf32 ? 0x1p-10 * fabs(alpha) * sa : 0.0) +
                                    out_tol(dt, 0.0, 0.0, 0.0, 0, r);
            }
        break;
    }
    case OP_GELU_BWD: {
        buf *x = &b[0], *dy = &b[1], *dx = &b[2];
        const int acc = c->p[1];
        for (size_t i = 0; i < x->n; i++) {
            double gp, mag;
            const double xv = hget(x, i), g = hget(dy, i);
            ref_gelu_grad(xv, c->p[0] == DT_GELU_TANH, &gp, &mag);
            const double t = g * gp, mt = fabs(g) * mag, old = acc ? hget(dx, i) : 0.0;
            /* the argument's conditioning; beyond |x| = 15 every term has
             * saturated (1, 0) or underflowed (FLT_MIN) */
            const double x2 = isfinite(xv) && xv * xv < 255 ? 1 + xv * xv : 256;
            const double e = cuda ? 16 * U32 * x2 * mt + 16 * FLT_MIN * fabs(g)
                                  : 2 * U32 * fabs(t) + 0x1p-45 * x2 * mt;
            dx->ref[i] = t + old;
            dx->tol[i] = out_tol(dt, e, t, old, acc, t + old);
        }
        break;
    }
    case OP_SWIGLU: {
        buf *g = &b[0], *up = &b[1], *out = &b[2];
        for (size_t i = 0; i < g->n; i++) {
            double silu, dsilu, mag;
            ref_silu(hget(g, i), &silu, &dsilu, &mag);
            const double t = silu * hget(up, i);
            out->ref[i] = t;
            out->tol[i] = out_tol(dt, (cuda ? 16 : dt == DT_F32 ? SW_F32 : 2) * U32 * fabs(t), 0, 0,
                                  0, t);
        }
        break;
    }
    case OP_SWIGLU_BWD: {
        buf *g = &b[0], *up = &b[1], *dy = &b[2], *dg = &b[3], *du = &b[4];
        const int acc = c->p[0];
        for (size_t i = 0; i < g->n; i++) {
            double silu, dsilu, mag;
            const double gv = hget(g, i), uv = hget(up, i), d = hget(dy, i);
            ref_silu(gv, &silu, &dsilu, &mag);
            const double tg = d * uv * dsilu, mg = fabs(d * uv) * mag, tu = d * silu;
            const double eg = cuda           ? 16 * U32 * mg + 16 * FLT_MIN * fabs(d * uv)
                              : dt == DT_F32 ? SW_BWD_F32 * U32 * mg
                                             : 2 * U32 * fabs(tg) + 0x1p-45 * mg;
            const double eu = cuda           ? 16 * U32 * fabs(tu) + 16 * FLT_MIN * fabs(d)
                              : dt == DT_F32 ? SW_F32 * U32 * fabs(tu)
                                             : 2 * U32 * fabs(tu);
            const double og = acc ? hget(dg, i) : 0.0, ou = acc ? hget(du, i) : 0.0;
            if (dg->out) {
                dg->ref[i] = tg + og;
                dg->tol[i] = out_tol(dt, eg, tg, og, acc, tg + og);
            }
            if (du->out) {
                du->ref[i] = tu + ou;
                du->tol[i] = out_tol(dt, eu, tu, ou, acc, tu + ou);
            }
        }
        break;
    }
    case OP_RMSNORM_BWD: {
        const int64_t rows = c->s[0], n = c->s[1];
        const int weighted = c->p[0], acc = c->p[1], outs = c->p[2];
        int k = 0;
        buf *x = &b[k++], *w = weighted ? &b[k++] : NULL, *dy = &b[k++];
        buf *dx = outs != 2 ? &b[k++] : NULL, *dw = outs != 1 ? &b[k++] : NULL;
        double *sdw = calloc((size_t)n + 1, sizeof *sdw), *mdw = calloc((size_t)n + 1, sizeof *mdw);
        if (!sdw || !mdw) {
            free(sdw);
            free(mdw);
            o->alloc_failed = 1;
            return;
        }
        const double eps = (double)1e-5f;
        for (int64_t r = 0; r < rows; r++) {
            double ss = 0.0, sgx = 0.0, sagx = 0.0;
            for (int64_t i = 0; i < n; i++) {
                const double xv = hget(x, (size_t)(r * n + i));
                const double g = hget(dy, (size_t)(r * n + i)) * (w ? hget(w, (size_t)i) : 1.0);
                ss += xv * xv;
                sgx += g * xv;
                sagx += fabs(g * xv);
            }
            const double inv = 1.0 / sqrt(ss / (double)n + eps);
            const double k3 = inv * inv * inv * sgx / (double)n;
            const double mk3 = inv * inv * inv * sagx / (double)n;
            for (int64_t i = 0; i < n; i++) {
                const size_t e = (size_t)(r * n + i);
                const double xv = hget(x, e), d = hget(dy, e);
                const double g = d * (w ? hget(w, (size_t)i) : 1.0);
                sdw[i] += d * xv * inv;
                mdw[i] += fabs(d * xv * inv);
                if (!dx) continue;
                const double t = inv * g - xv * k3, old = acc ? hget(dx, e) : 0.0;
                dx->ref[e] = t + old;
                dx->tol[e] = out_tol(dt, 2 * U32 * fabs(t) + 0x1p-40 * (inv * fabs(g) + fabs(xv) * mk3),
                                     t, old, acc, t + old);
            }
        }
        for (int64_t i = 0; dw && i < n; i++) {
            const double old = hget(dw, (size_t)i);
            if (!weighted) {
                dw->ref[i] = old;   /* no weight: dw is not touched */
                dw->tol[i] = 0.0;
                continue;
            }
            const double t = sdw[i], o0 = acc ? old : 0.0;
            dw->ref[i] = t + o0;
            dw->tol[i] = out_tol(dt, 2 * U32 * fabs(t) + 0x1p-40 * mdw[i], t, o0, acc, t + o0);
        }
        free(sdw);
        free(mdw);
        break;
    }
    case OP_ROTARY_INV: {
        const int64_t outer = c->s[0], rows = c->s[1], inner = c->s[2], d = c->s[3], half = d / 2;
        const int il = c->p[0] == DT_ROTARY_INTERLEAVED, trip = c->p[2];
        buf *x = &b[0], *out = &b[1];
        for (int64_t o0 = 0; o0 < outer; o0++)
            for (int64_t s = 0; s < rows; s++)
                for (int64_t h = 0; h < inner; h++)
                    for (int64_t i = 0; i < half; i++) {
                        const size_t row = (size_t)(((o0 * rows + s) * inner + h) * d);
                        const size_t ia = row + (size_t)(il ? 2 * i : i);
                        const size_t ib = row + (size_t)(il ? 2 * i + 1 : i + half);
                        const double a = hget(x, ia), bb = hget(x, ib);
                        const double mag = fabs(a) + fabs(bb);
                        if (trip) {
                            out->ref[ia] = a;
                            out->ref[ib] = bb;
                            out->tol[ia] = out->tol[ib] =
                                8 * U32 * mag + 3 * u_of(dt) * mag + s_of(dt);
                            continue;
                        }
                        const double ang = (double)o->pos[o0 * c->p[3] + s] *
                                           pow(ROPE_BASE, -2.0 * (double)i / (double)d);
                        const double cs = cos(ang), sn = sin(ang);
                        out->ref[ia] = a * cs + bb * sn;   /* rotation by -angle */
                        out->ref[ib] = -a * sn + bb * cs;
                        out->tol[ia] = out_tol(dt, 4 * U32 * mag, 0, 0, 0, out->ref[ia]);
                        out->tol[ib] = out_tol(dt, 4 * U32 * mag, 0, 0, 0, out->ref[ib]);
                    }
        break;
    }
    case OP_EMBEDDING: {
        const int64_t n = c->s[0], d = c->s[1], rows = c->s[2], lo = c->s[3];
        buf *tok = &b[0], *table = &b[1], *out = &b[2];
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = (int64_t)hget(tok, (size_t)i) - lo;
            for (int64_t j = 0; j < d; j++) {
                out->ref[i * d + j] = r >= 0 && r < rows ? hget(table, (size_t)(r * d + j)) : 0.0;
                out->tol[i * d + j] = 0.0;
            }
        }
        break;
    }
    case OP_EMBEDDING_BWD: {
        const int64_t n = c->s[0], d = c->s[1], rows = c->s[2], lo = c->s[3];
        const int acc = c->p[0];
        buf *tok = &b[0], *dy = &b[1], *dt_ = &b[2];
        double *mag = calloc((size_t)(rows * d) + 1, sizeof *mag);
        int64_t *cnt = calloc((size_t)rows + 1, sizeof *cnt);
        if (!mag || !cnt) {
            free(mag);
            free(cnt);
            o->alloc_failed = 1;
            return;
        }
        for (int64_t e = 0; e < rows * d; e++) {
            const double old = acc ? hget(dt_, (size_t)e) : 0.0;
            dt_->ref[e] = old;
            mag[e] = fabs(old);
        }
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = (int64_t)hget(tok, (size_t)i) - lo;
            if (r < 0 || r >= rows) continue;
            cnt[r]++;
            for (int64_t j = 0; j < d; j++) {
                const double v = hget(dy, (size_t)(i * d + j));
                dt_->ref[r * d + j] += v;
                mag[r * d + j] += fabs(v);
            }
        }
        for (int64_t e = 0; e < rows * d; e++)
            dt_->tol[e] = (double)(cnt[e / d] + 1) * U32 * mag[e] + u_of(dt) * fabs(dt_->ref[e]) +
                          s_of(dt);
        free(mag);
        free(cnt);
        break;
    }
    case OP_I32_CHECK: {
        const int64_t n = c->s[0], limit = c->s[1];
        int64_t valid = 0, bad = -1;
        for (int64_t i = 0; i < n; i++) {
            const int64_t v = (int64_t)hget(&b[0], (size_t)i);
            if (v == I32_IGNORE(c)) continue;   /* neither counted nor bad */
            if (v >= 0 && v < limit) valid++;
            else if (bad < 0) bad = i;
        }
        b[1].ref[0] = (double)valid;
        b[2].ref[0] = (double)bad;
        break;
    }
    case OP_CE_MAX: {
        const int64_t rows = c->s[0], n = c->s[1];
        for (int64_t r = 0; r < rows; r++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                const double v = hget(&b[0], (size_t)(r * n + j));
                mx = isnan(v) || isnan(mx) ? NAN : v > mx ? v : mx;
            }
            b[1].ref[r] = mx;
        }
        break;
    }
    case OP_CE_SUM: {
        const int64_t rows = c->s[0], n = c->s[1], lo = c->s[2];
        buf *x = &b[0], *m = &b[1], *tgt = &b[2], *se = &b[3], *tl = &b[4];
        for (int64_t r = 0; r < rows; r++) {
            double s = 0.0;
            for (int64_t j = 0; j < n; j++)
                s += exp(hget(x, (size_t)(r * n + j)) - hget(m, (size_t)r));
            se->ref[r] = s;
            se->tol[r] = (double)(2 * n + 8) * U32 * s;
            const int64_t t = (int64_t)hget(tgt, (size_t)r) - lo;
            tl->ref[r] = t >= 0 && t < n ? hget(x, (size_t)(r * n + t)) : 0.0;
            tl->tol[r] = 0.0;
        }
        break;
    }
    case OP_CE_GRAD: {
        const int64_t rows = c->s[0], n = c->s[1], lo = c->s[2];
        buf *x = &b[0], *m = &b[1], *tgt = &b[2], *se = &b[3], *tl = &b[4], *dx = &b[5],
            *loss = &b[6];
        for (int64_t r = 0; r < rows; r++) {
            const int ign = (int64_t)hget(tgt, (size_t)r) == CE_IGNORE;
            const int64_t t = (int64_t)hget(tgt, (size_t)r) - lo;
            const double mr = hget(m, (size_t)r), sr = hget(se, (size_t)r), tr = hget(tl, (size_t)r);
            for (int64_t j = 0; dx->out && j < n; j++) {
                const size_t e = (size_t)(r * n + j);
                if (ign) {
                    dx->ref[e] = 0.0;
                    dx->tol[e] = 0.0;
                    continue;
                }
                const double xv = hget(x, e), p = exp(xv - mr) / sr;
                const double v = (p - (j == t ? 1.0 : 0.0)) * CE_SCALE;
                dx->ref[e] = v;
                /* p = 0 (x = -inf) is exact */
                dx->tol[e] = (p > 0 ? (4 + fabs(xv - mr)) * U32 * p * CE_SCALE : 0.0) +
                             2 * U32 * fabs(v) + out_tol(dt, 0, 0, 0, 0, v);
            }
            const double l = ign ? 0.0 : mr + log(sr) - tr;
            loss->ref[r] = l;
            loss->tol[r] = ign ? 0.0 : 2 * U32 * (fabs(mr) + fabs(log(sr)) + fabs(tr)) + 2 * U32 * fabs(l);
        }
        break;
    }
    case OP_ABSMAX: {
        double v = 0.0;
        for (size_t i = 0; i < b[0].n; i++) {
            const double a = fabs(hget(&b[0], i));
            v = isnan(a) || isnan(v) ? NAN : a > v ? a : v;
        }
        b[1].ref[0] = v;
        break;
    }
    case OP_SUMSQ: {
        double s = 0.0;
        for (size_t i = 0; i < b[0].n; i++) s += hget(&b[0], i) * hget(&b[0], i);
        b[1].ref[0] = s;
        b[1].tol[0] = 0x1p-40 * fabs(s);
        break;
    }
    case OP_CONVERT:
        for (size_t i = 0; i < b[0].n; i++) b[1].ref[i] = ref_round(hget(&b[0], i), c->dtype2);
        break;
    case OP_ADAMW: {
        const int alias = c->p[1];
        buf *master = &b[0], *param = alias ? NULL : &b[1];
        buf *m = &b[alias ? 1 : 2], *v = &b[alias ? 2 : 3], *g = &b[alias ? 3 : 4];
        const double b1 = AW_B1, b2 = AW_B2, lr = AW_LR, eps = AW_EPS, wd = AW_WD;
        const double bc1 = 1.0 - pow(b1, (double)c->p[0]), bc2 = 1.0 - pow(b2, (double)c->p[0]);
        for (size_t i = 0; i < master->n; i++) {
            const double gv = hget(g, i) * (double)AW_GSCALE, mv = hget(m, i), vv = hget(v, i);
            const double mw = hget(master, i);
            const double mr = b1 * mv + (1 - b1) * gv, vr = b2 * vv + (1 - b2) * gv * gv;
            const double tm = 4 * U32 * (fabs(b1 * mv) + fabs((1 - b1) * gv));
            const double tv = 5 * U32 * (fabs(b2 * vv) + fabs((1 - b2) * gv * gv));
            const double den = sqrt(vr / bc2) + eps, upd = lr * (mr / bc1) / den;
            const double r = mw * (1 - lr * wd) - upd;
            const double tupd = lr / bc1 / den * (tm + fabs(mr) * (0.5 * tv / vr + 6 * U32));
            const double tmaster = 3 * U32 * fabs(mw) + tupd + U32 * fabs(r);
            m->ref[i] = mr;
            m->tol[i] = tm;
            v->ref[i] = vr;
            v->tol[i] = tv;
            master->ref[i] = r;
            master->tol[i] = tmaster;
            if (param) {
                param->ref[i] = r;
                param->tol[i] = tmaster + u_of(dt) * fabs(r) + s_of(dt);
            }
        }
        break;
    }
    case OP_ERRORS: break;
    }
}

/* ------------------------------------------------------------- checking */

/* Mismatches of got against ref (NaN must meet NaN, inf the same inf);
 * prints the first few; the worst finite error into *worst. */
static long check(const char *what, const char *buf_name, const double *got, const double *ref,
                  const double *tol, size_t n, double *worst) {
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double g = got[i], r = ref[i];
        int ok;
        if (isnan(r) || isnan(g)) ok = isnan(r) && isnan(g);
        else if (isinf(r) || isinf(g)) ok = g == r;
        else {
            const double e = fabs(g - r);
            if (e > *worst) *worst = e;
            ok = e <= tol[i];
        }
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s %s[%zu]: got %.9g, expected %.9g (bound %.3g)\n", what,
                    buf_name, i, g, r, tol[i]);
    }
    return bad;
}

static void note(gk_case *c, const char *fmt, ...) {
    if (c->bad++ > 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
}

static dt_status rank_case(dt_context *ctx, void *arg) {
    gk_case *c = arg;
    dt_backend *be = ctx->backend, *cpu = NULL;
    const int cuda = strcmp(be->ops->name, "cuda") == 0;
    int tf32 = 0;
#ifdef DT_HAVE_CUDA
    tf32 = cuda && dt_backend_cuda_tf32(be);
#endif
    io o, oc;
    memset(&o, 0, sizeof o);
    memset(&oc, 0, sizeof oc);
    dt_status st = DT_SUCCESS;
    setup(c, &o);
    if (o.alloc_failed) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of host memory");
        goto out;
    }
    DT_TRY_GOTO(st, run(be, c, &o), out);
    reference(c, &o, cuda, tf32);
    if (o.alloc_failed) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of host memory");
        goto out;
    }
    for (int k = 0; k < o.nb; k++) {
        const buf *b = &o.b[k];
        if (!b->out) continue;
        double worst = 0.0;
        const long bad = check(c->name, b->name, b->got, b->ref, b->tol, b->n, &worst);
        if (bad) note(c, "%s: %ld of %zu outside the bound (max finite error %.3g)", b->name, bad, b->n, worst);
        else if (b->n) print_message("  %s: max error %.3g over %zu\n", b->name, worst, b->n);
    }
    if (cuda) {
        /* The CPU backend on the same inputs: within the sum of both bounds
         * (adamw: identical). */
        DT_TRY_GOTO(st, dt_backend_cpu_create(0, &cpu), out);
        setup(c, &oc);
        if (oc.alloc_failed) {
            st = dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of host memory");
            goto out;
        }
        DT_TRY_GOTO(st, run(cpu, c, &oc), out);
        reference(c, &oc, 0, 0);
        for (int k = 0; k < o.nb; k++) {
            const buf *b = &o.b[k], *bc = &oc.b[k];
            if (!b->out) continue;
            for (size_t i = 0; i < b->n; i++) bc->tol[i] = c->op == OP_ADAMW ? 0.0 : bc->tol[i] + b->tol[i];
            double worst = 0.0;
            const long bad = check(c->name, b->name, b->got, bc->got, bc->tol, b->n, &worst);
            if (bad) note(c, "%s: cuda and cpu differ at %ld of %zu (max %.3g)", b->name, bad, b->n, worst);
            else if (b->n) print_message("  %s: max |cuda - cpu| %.3g\n", b->name, worst);
        }
    }
out:
    if (cpu) cpu->ops->destroy(cpu);
    io_free(&o);
    io_free(&oc);
    c->st = st;
    if (st != DT_SUCCESS) snprintf(c->msg, sizeof c->msg, "%s", dt_last_error());
    return st;
}

/* ------------------------------------------------------------- rejections */

/* Each call is refused with the status the contract gives, before it
 * touches anything (the buffer keeps its bytes). */
static dt_status rank_errors(dt_context *ctx, void *arg) {
    gk_case *c = arg;
    dt_backend *be = ctx->backend;
    const dt_backend_ops *f = be->ops;
    void *p = NULL;
    unsigned char before[256], after[256];
    int64_t iv = 0, ib = 0;
    float fv = 0.0f;
    double dv = 0.0;
    const int64_t pos[1] = {3};
    memset(before, 0x5a, sizeof before);
    dt_status st = f->alloc(be, sizeof before, &p);
    if (st == DT_SUCCESS) st = f->upload(be, p, before, sizeof before);
    if (st != DT_SUCCESS) goto out;
    struct { dt_status got, want; const char *what; } e[] = {
        {f->gemm_ex(be, DT_F32, 2, 0, 2, 2, 2, 1.0f, p, p, 0.0f, p), DT_ERR_INVALID_ARGUMENT, "gemm_ex trans_a 2"},
        {f->gemm_ex(be, DT_F32, 0, 0, -1, 2, 2, 1.0f, p, p, 0.0f, p), DT_ERR_INVALID_ARGUMENT, "gemm_ex m -1"},
        {f->gemm_ex(be, DT_U8, 0, 0, 2, 2, 2, 1.0f, p, p, 0.0f, p), DT_ERR_NOT_SUPPORTED, "gemm_ex u8"},
        {f->gemm_ex(be, DT_F32, 0, 0, 2, 2, 2, 1.0f, NULL, p, 0.0f, p), DT_ERR_INVALID_ARGUMENT, "gemm_ex A NULL"},
        {f->gelu_backward(be, DT_F32, 4, p, p, p, (dt_gelu_approx)7, 0), DT_ERR_INVALID_ARGUMENT, "gelu_backward approx 7"},
        {f->gelu_backward(be, DT_I32, 4, p, p, p, DT_GELU_ERF, 0), DT_ERR_NOT_SUPPORTED, "gelu_backward i32"},
        {f->swiglu(be, DT_F32, -1, p, p, p), DT_ERR_INVALID_ARGUMENT, "swiglu n -1"},
        {f->swiglu_backward(be, DT_F32, 4, p, p, NULL, p, p, 0), DT_ERR_INVALID_ARGUMENT, "swiglu_backward dy NULL"},
        {f->rmsnorm_backward(be, DT_F32, 2, 2, p, p, -1.0f, p, p, p, 0), DT_ERR_INVALID_ARGUMENT, "rmsnorm_backward eps -1"},
        {f->rmsnorm_backward(be, DT_F32, -1, 2, p, p, 1e-5f, p, p, p, 0), DT_ERR_INVALID_ARGUMENT, "rmsnorm_backward rows -1"},
        {f->rotary_inverse(be, DT_F32, 1, 1, 1, 3, pos, 0, 1e4, DT_ROTARY_HALF, p, p), DT_ERR_INVALID_ARGUMENT, "rotary_inverse d 3"},
        {f->rotary_inverse(be, DT_F32, 1, 1, 1, 4, NULL, 0, 1e4, DT_ROTARY_HALF, p, p), DT_ERR_INVALID_ARGUMENT, "rotary_inverse positions NULL"},
        {f->rotary_inverse(be, DT_F32, 2, 2, 1, 4, pos, 1, 1e4, DT_ROTARY_HALF, p, p), DT_ERR_INVALID_ARGUMENT, "rotary_inverse pos_stride 1 < rows 2"},
        {f->rotary_inverse(be, DT_F32, 2, 1, 1, 4, pos, -1, 1e4, DT_ROTARY_HALF, p, p), DT_ERR_INVALID_ARGUMENT, "rotary_inverse pos_stride -1"},
        {f->embedding(be, DT_F32, -1, 4, p, 0, 4, p, p), DT_ERR_INVALID_ARGUMENT, "embedding n -1"},
        {f->embedding_backward(be, DT_U8, 2, 4, p, 0, 4, p, p, 0), DT_ERR_NOT_SUPPORTED, "embedding_backward u8"},
        {f->i32_check(be, 4, p, 10, -100, NULL, &ib), DT_ERR_INVALID_ARGUMENT, "i32_check valid NULL"},
        {f->i32_check(be, -1, p, 10, -100, &iv, &ib), DT_ERR_INVALID_ARGUMENT, "i32_check n -1"},
        {f->ce_max(be, DT_F32, -1, 4, p, p), DT_ERR_INVALID_ARGUMENT, "ce_max rows -1"},
        {f->ce_sum(be, DT_F32, 2, 4, p, p, NULL, 0, p, p), DT_ERR_INVALID_ARGUMENT, "ce_sum tgt NULL"},
        {f->ce_grad(be, DT_F32, 2, 4, p, p, p, p, p, 0, -100, 1.0f, p, NULL), DT_ERR_INVALID_ARGUMENT, "ce_grad loss NULL"},
        {f->absmax(be, DT_F32, 4, p, NULL), DT_ERR_INVALID_ARGUMENT, "absmax out NULL"},
        {f->absmax(be, DT_U8, 4, p, &fv), DT_ERR_NOT_SUPPORTED, "absmax u8"},
        {f->sumsq(be, DT_F32, -1, p, &dv), DT_ERR_INVALID_ARGUMENT, "sumsq n -1"},
        {f->convert(be, 4, DT_U8, p, DT_F32, p), DT_ERR_NOT_SUPPORTED, "convert u8 to fp32"},
        {f->convert(be, 4, DT_F32, p, DT_I32, p), DT_ERR_NOT_SUPPORTED, "convert fp32 to i32"},
        {f->adamw(be, DT_F32, 4, p, p, p, p, p, 1.0f, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0), DT_ERR_INVALID_ARGUMENT, "adamw step 0"},
        {f->adamw(be, DT_F32, 4, p, p, p, p, p, 1.0f, 1e-3f, 1.0f, 0.999f, 1e-8f, 0.0f, 1), DT_ERR_INVALID_ARGUMENT, "adamw beta1 1"},
        {f->adamw(be, DT_F32, 4, p, p, p, p, p, 1.0f, NAN, 0.9f, 0.999f, 1e-8f, 0.0f, 1), DT_ERR_INVALID_ARGUMENT, "adamw lr NaN"},
        {f->adamw(be, DT_F32, 4, p, p, p, p, p, 1.0f, 1e-3f, 0.9f, 0.999f, 1e-8f, -1.0f, 1), DT_ERR_INVALID_ARGUMENT, "adamw weight decay -1"},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        if (e[i].got != e[i].want)
            note(c, "%s: got %s, want %s", e[i].what, dt_status_name(e[i].got), dt_status_name(e[i].want));
    st = f->download(be, after, p, sizeof after);
    if (st == DT_SUCCESS && memcmp(before, after, sizeof before) != 0)
        note(c, "a refused call changed the buffer");
out:
    f->free(be, p);
    c->st = st;
    if (st != DT_SUCCESS) snprintf(c->msg, sizeof c->msg, "%s", dt_last_error());
    return st;
}

/* ------------------------------------------------------------- driver */

static int cuda_usable(const char **why) {
    static int known;
    static char reason[640];
    if (!known)
        known = h_pair_available(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, reason, sizeof reason) ? 1 : -1;
    *why = reason;
    return known > 0;
}

static void test_case(void **state) {
    gk_case *c = *state;
    if (c->backend == DT_BACKEND_CUDA) {
        const char *why = NULL;
        if (!cuda_usable(&why)) {
            print_message("skipped: %s\n", why);
            skip();
            return;
        }
    }
    c->bad = 0;
    c->msg[0] = '\0';
    const dt_status launched = h_launch_on(1, c->backend, DT_TRANSPORT_LOCAL,
                                           c->op == OP_ERRORS ? rank_errors : rank_case, c);
    if (launched != DT_SUCCESS || c->st != DT_SUCCESS)
        print_error("%s: %s: %s\n", c->name, dt_status_name(c->st != DT_SUCCESS ? c->st : launched),
                    c->msg[0] ? c->msg : dt_last_error());
    else if (c->bad)
        print_error("%s: %ld check(s) failed; first: %s\n", c->name, c->bad, c->msg);
    assert_int_equal(launched, DT_SUCCESS);
    assert_int_equal(c->st, DT_SUCCESS);
    assert_int_equal(c->bad, 0);
}

typedef struct table {
    gk_case *cases;
    struct CMUnitTest *tests;
    size_t n, cap;
} table;

static gk_case *add_case(table *t, gk_op op, dt_backend_kind be, dt_dtype dt, const char *fmt, ...) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->cases = realloc(t->cases, t->cap * sizeof *t->cases);
        if (!t->cases) {
            fprintf(stderr, "test_grad_kernels: out of memory\n");
            exit(1);
        }
    }
    gk_case *c = &t->cases[t->n++];
    memset(c, 0, sizeof *c);
    c->op = op;
    c->backend = be;
    c->dtype = dt;
    c->dtype2 = dt;
    c->seed = 1000 + t->n;
    char params[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(params, sizeof params, fmt, ap);
    va_end(ap);
    snprintf(c->name, sizeof c->name, "%s/%s/%s%s%s", op_names[op],
             be == DT_BACKEND_CUDA ? "cuda" : "cpu", op == OP_I32_CHECK || op == OP_ERRORS ? "" : dt_dtype_name(dt),
             op == OP_I32_CHECK || op == OP_ERRORS ? "" : "/", params);
    return c;
}

#define SET4(a, x0, x1, x2, x3) ((a)[0] = (x0), (a)[1] = (x1), (a)[2] = (x2), (a)[3] = (x3))

static void add_cases(table *t, dt_backend_kind be) {
    static const dt_dtype dts[] = {DT_F32, DT_BF16, DT_F16};
    gk_case *c;
    for (int q = 0; q < 3; q++) {
        const dt_dtype dt = dts[q];
        /* gemm_ex: every transpose and beta on two shapes; edge sizes */
        static const int64_t shapes[][3] = {{5, 7, 3}, {33, 17, 64}};
        for (int sh = 0; sh < 2; sh++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int beta = 0; beta < 2; beta++) {
                        c = add_case(t, OP_GEMM_EX, be, dt, "tA=%d,tB=%d,beta=%d,m=%" PRId64 ",n=%" PRId64 ",k=%" PRId64,
                                     ta, tb, beta, shapes[sh][0], shapes[sh][1], shapes[sh][2]);
                        SET4(c->s, shapes[sh][0], shapes[sh][1], shapes[sh][2], 0);
                        SET4(c->p, ta, tb, beta, 0);
                    }
        static const int64_t edges[][3] = {{1, 1, 1}, {0, 4, 3}, {4, 3, 0}};
        for (int sh = 0; sh < 3; sh++)
            for (int beta = 0; beta < 2; beta++) {
                c = add_case(t, OP_GEMM_EX, be, dt, "tA=1,tB=1,beta=%d,m=%" PRId64 ",n=%" PRId64 ",k=%" PRId64,
                             beta, edges[sh][0], edges[sh][1], edges[sh][2]);
                SET4(c->s, edges[sh][0], edges[sh][1], edges[sh][2], 0);
                SET4(c->p, 1, 1, beta, 0);
            }
        for (int ta = 0; ta < 2; ta++) {
            c = add_case(t, OP_GEMM_EX, be, dt, "tA=%d,tB=%d,beta=1,m=6,n=5,k=4,nonfinite", ta, 1 - ta);
            SET4(c->s, 6, 5, 4, 0);
            SET4(c->p, ta, 1 - ta, 1, 0);
            c->nonfinite = 1;
        }
        /* gelu_backward */
        for (int ap = 0; ap < 2; ap++) {
            const char *an = ap ? "tanh" : "erf";
            for (int acc = 0; acc < 2; acc++)
                for (int64_t n = 1; n <= 1001; n += 1000) {
                    c = add_case(t, OP_GELU_BWD, be, dt, "approx=%s,acc=%d,n=%" PRId64, an, acc, n);
                    c->s[0] = n;
                    SET4(c->p, ap, acc, 0, 0);
                }
            c = add_case(t, OP_GELU_BWD, be, dt, "approx=%s,acc=1,n=257,nonfinite", an);
            c->s[0] = 257;
            SET4(c->p, ap, 1, 0, 0);
            c->nonfinite = 1;
        }
        c = add_case(t, OP_GELU_BWD, be, dt, "approx=erf,acc=0,n=0");
        /* swiglu */
        for (int64_t n = 0; n <= 1001; n = n ? n + 1000 : 1) {
            c = add_case(t, OP_SWIGLU, be, dt, "n=%" PRId64, n);
            c->s[0] = n;
        }
        c = add_case(t, OP_SWIGLU, be, dt, "n=97,nonfinite");
        c->s[0] = 97;
        c->nonfinite = 1;
        c = add_case(t, OP_SWIGLU, be, dt, "n=1007,wide");
        c->s[0] = 1007;
        c->p[0] = 1;
        /* swiglu_backward */
        static const char *const outs[] = {"dgate,dup", "dgate", "dup"};
        for (int acc = 0; acc < 2; acc++)
            for (int ou = 0; ou < 3; ou++) {
                c = add_case(t, OP_SWIGLU_BWD, be, dt, "acc=%d,out=%s,n=1001", acc, outs[ou]);
                c->s[0] = 1001;
                SET4(c->p, acc, ou, 0, 0);
            }
        for (int64_t n = 0; n <= 1; n++) {
            c = add_case(t, OP_SWIGLU_BWD, be, dt, "acc=0,out=dgate,dup,n=%" PRId64, n);
            c->s[0] = n;
        }
        c = add_case(t, OP_SWIGLU_BWD, be, dt, "acc=1,out=dgate,dup,n=97,nonfinite");
        c->s[0] = 97;
        c->p[0] = 1;
        c->nonfinite = 1;
        for (int acc = 0; acc < 2; acc++) {
            c = add_case(t, OP_SWIGLU_BWD, be, dt, "acc=%d,out=dgate,dup,n=1007,wide", acc);
            c->s[0] = 1007;
            SET4(c->p, acc, 0, 1, 0);
        }
        /* rmsnorm_backward */
        static const char *const routs[] = {"dx,dw", "dx", "dw"};
        for (int wt = 0; wt < 2; wt++)
            for (int acc = 0; acc < 2; acc++) {
                c = add_case(t, OP_RMSNORM_BWD, be, dt, "w=%d,acc=%d,out=dx,dw,rows=7,n=33", wt, acc);
                SET4(c->s, 7, 33, 0, 0);
                SET4(c->p, wt, acc, 0, 0);
            }
        for (int ou = 1; ou < 3; ou++) {
            c = add_case(t, OP_RMSNORM_BWD, be, dt, "w=1,acc=1,out=%s,rows=3,n=300", routs[ou]);
            SET4(c->s, 3, 300, 0, 0);
            SET4(c->p, 1, 1, ou, 0);
        }
        static const int64_t rshapes[][2] = {{3, 700}, {1, 1}, {0, 5}, {4, 0}, {130, 9}};
        for (int sh = 0; sh < 5; sh++) {
            c = add_case(t, OP_RMSNORM_BWD, be, dt, "w=1,acc=0,out=dx,dw,rows=%" PRId64 ",n=%" PRId64,
                         rshapes[sh][0], rshapes[sh][1]);
            SET4(c->s, rshapes[sh][0], rshapes[sh][1], 0, 0);
            SET4(c->p, 1, 0, 0, 0);
        }
        c = add_case(t, OP_RMSNORM_BWD, be, dt, "w=1,acc=0,out=dx,dw,rows=4,n=9,nonfinite");
        SET4(c->s, 4, 9, 0, 0);
        SET4(c->p, 1, 0, 0, 0);
        c->nonfinite = 1;
        /* rotary_inverse */
        static const int64_t qshapes[][4] = {{2, 3, 2, 8}, {1, 5, 3, 6}, {2, 3, 3, 36}};
        for (int st = 0; st < 2; st++) {
            const char *sn = st ? "interleaved" : "half";
            for (int sh = 0; sh < 3; sh++)
                for (int large = 0; large < 2; large++) {
                    c = add_case(t, OP_ROTARY_INV, be, dt, "style=%s,pos=%s,shape=%" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64,
                                 sn, large ? "large" : "small", qshapes[sh][0], qshapes[sh][1],
                                 qshapes[sh][2], qshapes[sh][3]);
                    SET4(c->s, qshapes[sh][0], qshapes[sh][1], qshapes[sh][2], qshapes[sh][3]);
                    SET4(c->p, st, large, 0, 0);
                }
            c = add_case(t, OP_ROTARY_INV, be, dt, "style=%s,pos=large,roundtrip,shape=2x3x2x8", sn);
            SET4(c->s, 2, 3, 2, 8);
            SET4(c->p, st, 1, 1, 0);
            c = add_case(t, OP_ROTARY_INV, be, dt, "style=%s,pos=large,roundtrip,shape=2x3x3x36",
                         sn);
            SET4(c->s, 2, 3, 3, 36);
            SET4(c->p, st, 1, 1, 0);
            /* a position list per outer row, back to back and with a gap */
            for (int gap = 0; gap < 2; gap++) {
                c = add_case(t, OP_ROTARY_INV, be, dt, "style=%s,pos=%s,pos_stride=%d,shape=3x5x2x8", sn,
                             gap ? "large" : "small", 5 + 2 * gap);
                SET4(c->s, 3, 5, 2, 8);
                SET4(c->p, st, gap, 0, 5 + 2 * gap);
            }
            c = add_case(t, OP_ROTARY_INV, be, dt, "style=%s,pos=large,pos_stride=3,roundtrip,shape=2x3x2x8", sn);
            SET4(c->s, 2, 3, 2, 8);
            SET4(c->p, st, 1, 1, 3);
        }
        c = add_case(t, OP_ROTARY_INV, be, dt, "style=half,pos=small,shape=0x3x2x8");
        SET4(c->s, 0, 3, 2, 8);
        c = add_case(t, OP_ROTARY_INV, be, dt, "style=half,pos=small,shape=1x3x2x8,nonfinite");
        SET4(c->s, 1, 3, 2, 8);
        c->nonfinite = 1;
        /* embedding, embedding_backward */
        static const int64_t eshapes[][4] = {{7, 5, 11, 3}, {200, 33, 40, -5}, {0, 4, 5, 0}};
        for (int sh = 0; sh < 3; sh++) {
            c = add_case(t, OP_EMBEDDING, be, dt, "n=%" PRId64 ",d=%" PRId64 ",rows=%" PRId64 ",lo=%" PRId64,
                         eshapes[sh][0], eshapes[sh][1], eshapes[sh][2], eshapes[sh][3]);
            SET4(c->s, eshapes[sh][0], eshapes[sh][1], eshapes[sh][2], eshapes[sh][3]);
            for (int acc = 0; acc < 2; acc++) {
                c = add_case(t, OP_EMBEDDING_BWD, be, dt, "acc=%d,n=%" PRId64 ",d=%" PRId64 ",rows=%" PRId64 ",lo=%" PRId64,
                             acc, eshapes[sh][0], eshapes[sh][1], eshapes[sh][2], eshapes[sh][3]);
                SET4(c->s, eshapes[sh][0], eshapes[sh][1], eshapes[sh][2], eshapes[sh][3]);
                c->p[0] = acc;
            }
        }
        c = add_case(t, OP_EMBEDDING, be, dt, "n=30,d=6,rows=9,lo=2,nonfinite");
        SET4(c->s, 30, 6, 9, 2);
        c->nonfinite = 1;
        c = add_case(t, OP_EMBEDDING_BWD, be, dt, "acc=1,n=30,d=6,rows=9,lo=2,nonfinite");
        SET4(c->s, 30, 6, 9, 2);
        c->p[0] = 1;
        c->nonfinite = 1;
        /* cross-entropy */
        static const int64_t cshapes[][3] = {{0, 5, 0}, {3, 1, 0}, {5, 37, 0}, {6, 37, 40}, {3, 1000, 7}};
        for (gk_op op = OP_CE_MAX; op <= OP_CE_GRAD; op++) {
            for (int sh = 0; sh < 5; sh++) {
                c = add_case(t, op, be, dt, "rows=%" PRId64 ",n=%" PRId64 ",lo=%" PRId64,
                             cshapes[sh][0], cshapes[sh][1], cshapes[sh][2]);
                SET4(c->s, cshapes[sh][0], cshapes[sh][1], cshapes[sh][2], 0);
            }
            c = add_case(t, op, be, dt, "rows=5,n=37,lo=0,nonfinite");
            SET4(c->s, 5, 37, 0, 0);
            c->nonfinite = 1;
        }
        for (gk_op op = OP_CE_MAX; op <= OP_CE_GRAD; op++) {
            c = add_case(t, op, be, dt, "rows=5,n=45,lo=2,wide");
            SET4(c->s, 5, 45, 2, 0);
            c->p[1] = 1;
        }
        c = add_case(t, OP_CE_GRAD, be, dt, "rows=6,n=37,lo=40,dx=NULL");
        SET4(c->s, 6, 37, 40, 0);
        c->p[0] = 1;
        /* absmax, sumsq */
        static const char *const nfn[] = {"", ",nan", ",inf", ",nan+inf"};
        for (gk_op op = OP_ABSMAX; op <= OP_SUMSQ; op++) {
            static const int64_t rns[] = {0, 1, 1001, 70001, 300007};
            for (int k = 0; k < 5; k++) {
                c = add_case(t, op, be, dt, "n=%" PRId64, rns[k]);
                c->s[0] = rns[k];
            }
            for (int k = 1; k < 4; k++) {
                c = add_case(t, op, be, dt, "n=1001%s", nfn[k]);
                c->s[0] = 1001;
                c->p[0] = k;
                c->nonfinite = 1;
            }
        }
        /* convert: to every float dtype */
        for (int q2 = 0; q2 < 3; q2++)
            for (int64_t n = 0; n <= 1001; n += 1001) {
                c = add_case(t, OP_CONVERT, be, dt, "to=%s,n=%" PRId64, dt_dtype_name(dts[q2]), n);
                c->dtype2 = dts[q2];
                c->s[0] = n;
            }
        /* adamw */
        for (int step = 1; step <= 10; step += 9) {
            c = add_case(t, OP_ADAMW, be, dt, "step=%d,n=1001", step);
            c->s[0] = 1001;
            c->p[0] = step;
        }
        c = add_case(t, OP_ADAMW, be, dt, "step=3,n=0");
        c->p[0] = 3;
        c = add_case(t, OP_ADAMW, be, dt, "step=2,n=65,nonfinite");
        c->s[0] = 65;
        c->p[0] = 2;
        c->nonfinite = 1;
        if (dt == DT_F32) {
            c = add_case(t, OP_ADAMW, be, dt, "step=4,n=333,param=master");
            c->s[0] = 333;
            SET4(c->p, 4, 1, 0, 0);
        }
    }
    /* convert between equal non-float dtypes: a copy */
    c = add_case(t, OP_CONVERT, be, DT_I32, "to=i32,n=77");
    c->s[0] = 77;
    c = add_case(t, OP_CONVERT, be, DT_U8, "to=u8,n=77");
    c->s[0] = 77;
    /* i32_check */
    static const int64_t ins[] = {0, 1, 1000, 70001, 300007};
    for (int k = 0; k < 5; k++)
        for (int withbad = 0; withbad < 3; withbad++)
            for (int cls = 0; cls < 2; cls++) {
                c = add_case(t, OP_I32_CHECK, be, DT_I32, "bad=%d,ignore=%d,n=%" PRId64 ",limit=50257",
                             withbad, cls ? 7 : -100, ins[k]);
                SET4(c->s, ins[k], 50257, 0, 0);
                SET4(c->p, withbad, cls, 0, 0);
            }
    add_case(t, OP_ERRORS, be, DT_F32, "rejections");
}

int main(void) {
    table t = {0};
    add_cases(&t, DT_BACKEND_CPU);
    add_cases(&t, DT_BACKEND_CUDA);
    t.tests = calloc(t.n, sizeof *t.tests);
    if (!t.tests) return 1;
    for (size_t i = 0; i < t.n; i++) {
        t.tests[i].name = t.cases[i].name;
        t.tests[i].test_func = test_case;
        t.tests[i].initial_state = &t.cases[i];
    }
    const int failed = h_run_cases("grad_kernels", t.tests, t.n);
    free(t.tests);
    free(t.cases);
    return failed;
}
