/* dtensor/backend_cpu.c — the CPU compute backend: host memory, OpenBLAS.
 *
 * Tensor data is plain host memory from calloc. bf16 and fp16 are stored
 * as 16 bits and computed in fp32: every result is rounded to its dtype
 * exactly once (round to nearest even), so the CPU backend is the
 * reference the CUDA backend is checked against. The backend keeps no
 * global state; the table below is constant.
 *
 * Test: tests/test_ops.c and tests/test_tensor.c (make test).
 */
#include "backend.h"
#include "../base/cpu_vec.h"

#include <cblas.h>
#include <inttypes.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Per-backend state: the profiling marks (16-bit gemm scratch is made per
 * call, which is fine because gemm is not called inside a hot loop). */
typedef struct dt_cpu_impl {
    double *marks;   /* the rank thread's CPU seconds; NAN until recorded */
    int n_marks;
} dt_cpu_impl;

static void dt_cpu_destroy(dt_backend *b) {
    if (!b) return;
    dt_cpu_impl *im = b->impl;
    if (im) free(im->marks);
    free(im);
    free(b);
}

static dt_status dt_cpu_alloc(dt_backend *b, size_t bytes, void **out) {
    (void)b;
    if (out == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu alloc: out is NULL");
    /* calloc(0) may return NULL; one byte keeps every pointer valid and unique. */
    void *p = calloc(bytes > 0 ? bytes : 1, 1);
    if (p == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "cpu alloc: out of host memory for %zu bytes",
                        bytes);
    *out = p;
    return DT_SUCCESS;
}

static dt_status dt_cpu_alloc_uninit(dt_backend *b, size_t bytes, void **out) {
    (void)b;
    if (out == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu alloc: out is NULL");
    void *p = malloc(bytes > 0 ? bytes : 1);   /* valgrind sees a read before a write */
    if (p == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "cpu alloc: out of host memory for %zu bytes",
                        bytes);
    *out = p;
    return DT_SUCCESS;
}

static void dt_cpu_free(dt_backend *b, void *p) {
    (void)b;
    free(p);
}

static dt_status dt_cpu_memcpy(const char *what, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return DT_SUCCESS;
    if (dst == NULL || src == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: NULL buffer for %zu bytes", what, bytes);
    memmove(dst, src, bytes);
    return DT_SUCCESS;
}

static dt_status dt_cpu_upload(dt_backend *b, void *dst, const void *host, size_t bytes) {
    (void)b;
    return dt_cpu_memcpy("upload", dst, host, bytes);
}

static dt_status dt_cpu_download(dt_backend *b, void *host, const void *src, size_t bytes) {
    (void)b;
    return dt_cpu_memcpy("download", host, src, bytes);
}

static dt_status dt_cpu_copy(dt_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    return dt_cpu_memcpy("copy", dst, src, bytes);
}

static dt_status dt_cpu_zero(dt_backend *b, void *p, size_t bytes) {
    (void)b;
    if (bytes == 0) return DT_SUCCESS;
    if (p == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu zero: NULL buffer");
    memset(p, 0, bytes);
    return DT_SUCCESS;
}

/* out = x + y, n elements (out may be x); bf16 and fp16 sums rounded once. */
static void dt_add_n(dt_dtype dtype, void *out, const void *x, const void *y, int64_t n) {
    if (dtype == DT_F32) {
        const float *fx = x, *fy = y;
        float *fo = out;
        for (int64_t i = 0; i < n; i++) fo[i] = fx[i] + fy[i];
        return;
    }
    for (size_t i = 0; i < (size_t)n; i++)
        dt_value_set(out, dtype, i, dt_value_get(x, dtype, i) + dt_value_get(y, dtype, i));
}

static dt_status dt_cpu_copy_runs(dt_backend *b, const dt_runs *r) {
    (void)b;
    if (r == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu copy_runs: runs is NULL");
    size_t es = dt_dtype_size(r->dtype);
    if (es == 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu copy_runs: unknown dtype %d", (int)r->dtype);
    if (r->op != DT_RUNS_COPY && r->op != DT_RUNS_ADD)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu copy_runs: unknown op %d", (int)r->op);
    if (r->op == DT_RUNS_ADD && !dt_dtype_is_float(r->dtype))
        return dt_error(DT_ERR_NOT_SUPPORTED, "cpu copy_runs: add is not supported for %s",
                        dt_dtype_name(r->dtype));
    if (r->outer < 0 || r->n < 0 || r->run_elems < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu copy_runs: negative extent (outer %" PRId64 ", n %" PRId64
                        ", run %" PRId64 ")", r->outer, r->n, r->run_elems);
    if (r->outer == 0 || r->n == 0 || r->run_elems == 0) return DT_SUCCESS;
    if (r->dst == NULL || r->src == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu copy_runs: NULL buffer");

    char *dst = r->dst;
    const char *src = r->src;
    size_t run_bytes = (size_t)r->run_elems * es;
    for (int64_t o = 0; o < r->outer; o++) {
        char *dbase = dst + (size_t)(o * r->dst_outer) * es;
        const char *sbase = src + (size_t)(o * r->src_outer) * es;
        for (int64_t i = 0; i < r->n; i++) {
            int64_t doff = r->dst_off ? r->dst_off[i] : i * r->run_elems;
            int64_t soff = r->src_off ? r->src_off[i] : i * r->run_elems;
            char *d = dbase + (size_t)doff * es;
            const char *s = sbase + (size_t)soff * es;
            if (r->op == DT_RUNS_COPY) memcpy(d, s, run_bytes);
            else dt_add_n(r->dtype, d, d, s, r->run_elems);
        }
    }
    return DT_SUCCESS;
}

static dt_status dt_check_float_dtype(const char *op, dt_dtype dtype) {
    if (dt_dtype_is_float(dtype)) return DT_SUCCESS;
    return dt_error(DT_ERR_NOT_SUPPORTED,
                    "cpu %s: dtype %s is not supported (fp32, bf16, fp16 are)", op,
                    dt_dtype_name(dtype));
}

/* n values of a 16-bit dtype as a new fp32 array (NULL on allocation failure). */
static float *dt_array_to_f32(dt_dtype dtype, const void *src, int64_t n) {
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (f != NULL) dt_values_get(src, dtype, (size_t)n, f);
    return f;
}

static void dt_sgemm_rowmajor(int m, int n, int k, const float *a, const float *bm, float *c) {
    if (k == 0) {
        memset(c, 0, (size_t)m * (size_t)n * sizeof *c);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, bm, n, 0.0f, c,
                n);
}

static dt_status dt_cpu_gemm(dt_backend *b, dt_dtype dtype, int64_t m, int64_t n, int64_t k,
                             const void *a, const void *bm, void *c) {
    (void)b;
    DT_TRY(dt_check_float_dtype("gemm", dtype));
    if (m < 0 || n < 0 || k < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu gemm: negative size m %" PRId64 " n %" PRId64 " k %" PRId64, m, n, k);
    /* cblas takes int sizes and leading dimensions. */
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "cpu gemm: m %" PRId64 " n %" PRId64 " k %" PRId64
                        " exceeds the BLAS int range", m, n, k);
    if (m == 0 || n == 0) return DT_SUCCESS;
    if (a == NULL || bm == NULL || c == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gemm: NULL buffer");

    if (dtype == DT_F32) {
        dt_sgemm_rowmajor((int)m, (int)n, (int)k, a, bm, c);
        return DT_SUCCESS;
    }

    dt_status st = DT_SUCCESS;
    float *fa = dt_array_to_f32(dtype, a, m * k);
    float *fb = dt_array_to_f32(dtype, bm, k * n);
    float *fc = malloc((size_t)m * (size_t)n * sizeof *fc);
    if (fa == NULL || fb == NULL || fc == NULL) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY,
                      "cpu gemm: out of host memory for %s scratch (m %" PRId64 " n %" PRId64
                      " k %" PRId64 ")", dt_dtype_name(dtype), m, n, k);
        goto out;
    }
    dt_sgemm_rowmajor((int)m, (int)n, (int)k, fa, fb, fc);
    dt_values_set(c, dtype, (size_t)(m * n), fc);
out:
    free(fa);
    free(fb);
    free(fc);
    return st;
}

/* The arguments of the elementwise ops (y NULL allowed or not). */
static dt_status dt_cpu_elementwise_args(const char *what, dt_dtype dtype, int64_t n,
                                         const void *x, const void *y, int y_optional,
                                         const void *out) {
    DT_TRY(dt_check_float_dtype(what, dtype));
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: negative count %" PRId64, what, n);
    if (n > 0 && (x == NULL || (y == NULL && !y_optional) || out == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: NULL buffer", what);
    return DT_SUCCESS;
}

static dt_status dt_cpu_add(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                            const void *y, void *out) {
    (void)b;
    DT_TRY(dt_cpu_elementwise_args("add", dtype, n, x, y, 0, out));
    if (n == 0) return DT_SUCCESS;
    dt_add_n(dtype, out, x, y, n);
    return DT_SUCCESS;
}

/* backend.h's add_beside: nothing is queued on the CPU, so at once. */
static dt_status dt_cpu_add_beside(dt_backend *b, dt_dtype dtype, int64_t n, const float *x,
                                   const float *y, void *out) {
    (void)b;
    DT_TRY(dt_cpu_elementwise_args("add beside", dtype, n, x, y, 1, out));
    if (n == 0) return DT_SUCCESS;
    if (dtype == DT_F32 && y) {
        dt_add_n(DT_F32, out, x, y, n);
        return DT_SUCCESS;
    }
    for (size_t i = 0; i < (size_t)n; i++) dt_value_set(out, dtype, i, y ? x[i] + y[i] : x[i]);
    return DT_SUCCESS;
}

/* GELU, x * Phi(x), in blocks of DT_GELU_BLOCK fp32 values with GCC/Clang
 * vector extensions (4 floats: SSE2 on x86-64, NEON on arm64): no libm call
 * per element, so the whole block stays in vector registers.
 *
 *   erf:  Phi(x) = (1 + erf(z)) / 2, z = x / sqrt(2). For |z| < 0.5,
 *         erf(z) = z P(z^2) (P of degree 4); otherwise
 *         erfc(t) = exp(-t^2) R(1 / (1 + t/2)), t = |z| (R of degree 10, fitted
 *         on [0.5, 9.5] to 1.1e-8 relative with fp32 coefficients; beyond
 *         t = 9.3 erfc < 1e-38 is taken as 0) and Phi = 1 - erfc/2 (x >= 0) or
 *         erfc/2 (x < 0), which keeps the relative accuracy in the left tail
 *         that 1 + erff(z) loses.
 *   tanh: (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3)
 *         formed as before.
 *   exp:  dt_vexpf (cpu_vec.h).
 *
 * Accuracy against x * Phi(x) in double rounded to fp32, every fp32 value
 * of each range (the previous erff / tanhf loop in brackets): x in [1e-4, 6] at most
 * 2 ulp erf [2], 3 ulp tanh [2]; x in [-3, -1e-4] at most 15 ulp erf [103],
 * 16 ulp tanh [206]; x in [-6, -3] at most 62 ulp [every bit lost: erff
 * rounds 1 + erf to 0 below x = -5.5]. tests/test_ops.c's 1e-6 + 1e-6|ref|
 * holds there and on every 37th bit pattern of the whole fp32 range. NaN
 * gives NaN, +inf gives inf, -inf gives NaN (as
 * before). fp32 on one x86-64 core (SSE2): erf 4-5 ns, tanh 3 ns per element,
 * where the per-element erff loop took 6.5-19 ns (depending on the range of
 * x) and the tanhf loop 22-30 ns; bf16 adds 1-2 ns of conversions (not
 * measured for fp16, whose conversions branch). */
#define DT_GELU_BLOCK 64

#if defined(__GNUC__)
static inline dt_vf dt_vgelu_erf(dt_vf x) {
    const dt_vf zero = {0.0f, 0.0f, 0.0f, 0.0f};
    const dt_vf z = x * 0.70710678f;
    const dt_vf t = (dt_vf)((dt_vu)z & 0x7fffffffu);
    /* |z| < 0.5: erf(z) = z P(z^2) */
    const dt_vf w = z * z;
    dt_vf pa = w * 6.737693213e-03f - 2.776403539e-02f;
    pa = pa * w + 1.129848883e-01f;
    pa = pa * w - 3.761338592e-01f;
    pa = pa * w + 1.128379226e+00f;
    const dt_vf phi_small = (z * pa) * 0.5f + 0.5f;
    /* |z| >= 0.5: erfc(t) = e^(-t^2) R(1 / (1 + t/2)); 0 beyond t = 9.3 (and for NaN) */
    const dt_vi live = t < 9.3f;
    const dt_vf tb = dt_vsel(live, t, zero + 9.3f);
    const dt_vf u = 1.0f / (1.0f + 0.5f * tb);
    dt_vf r = u * 7.699969225e-03f - 1.135382056e-01f;
    r = r * u + 4.383189976e-01f;
    r = r * u - 7.225927114e-01f;
    r = r * u + 4.975349605e-01f;
    r = r * u - 1.576113403e-01f;
    r = r * u + 2.534921467e-01f;
    r = r * u + 2.304478586e-01f;
    r = r * u + 2.843139172e-01f;
    r = r * u + 2.819213867e-01f;
    r = r * u + 5.939207767e-06f;
    const dt_vf h = dt_vmask(live, 0.5f * dt_vexpf(-(tb * tb)) * r); /* erfc(t) / 2 */
    const dt_vf phi_large = dt_vsel(x >= 0.0f, 1.0f - h, h);
    return x * dt_vsel(t < 0.5f, phi_small, phi_large);
}

static inline dt_vf dt_vgelu_tanh(dt_vf x) {
    const dt_vf zero = {0.0f, 0.0f, 0.0f, 0.0f};
    const dt_vf u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
    const dt_vf a = -2.0f * u;
    const dt_vi live = a < 88.0f; /* beyond (and for NaN): e^a overflows, the sigmoid is 0 */
    dt_vf ac = dt_vsel(live, a, zero + 88.0f);
    ac = dt_vsel(ac > -87.0f, ac, zero - 87.0f); /* below: 1 + e^a is 1 */
    return x * dt_vmask(live, 1.0f / (1.0f + dt_vexpf(ac)));
}

static void dt_gelu_block(const float *x, float *y, dt_gelu_approx approx) {
    dt_vf v;
    if (approx == DT_GELU_ERF) {
        for (int i = 0; i < DT_GELU_BLOCK; i += DT_VW) {
            memcpy(&v, x + i, sizeof v);
            v = dt_vgelu_erf(v);
            memcpy(y + i, &v, sizeof v);
        }
    } else {
        for (int i = 0; i < DT_GELU_BLOCK; i += DT_VW) {
            memcpy(&v, x + i, sizeof v);
            v = dt_vgelu_tanh(v);
            memcpy(y + i, &v, sizeof v);
        }
    }
}
#else
/* Other compilers: the same formulas through libm, one element at a time. */
static void dt_gelu_block(const float *x, float *y, dt_gelu_approx approx) {
    for (int i = 0; i < DT_GELU_BLOCK; i++) {
        const float v = x[i];
        if (approx == DT_GELU_ERF) {
            y[i] = v * (0.5f * erfcf(-v * 0.70710678f));
        } else {
            const float u = 0.79788456080286535588f * (v + 0.044715f * v * v * v);
            y[i] = v / (1.0f + expf(-2.0f * u));
        }
    }
}
#endif

static dt_status dt_cpu_gelu(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, void *out,
                             dt_gelu_approx approx) {
    (void)b;
    if ((int)approx < 0 || approx >= DT_GELU_APPROX_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gelu: unknown approximation %d", (int)approx);
    DT_TRY(dt_cpu_elementwise_args("gelu", dtype, n, x, NULL, 1, out));
    if (n == 0) return DT_SUCCESS;
    float xb[DT_GELU_BLOCK], yb[DT_GELU_BLOCK];
    for (int64_t i = 0; i < n; i += DT_GELU_BLOCK) {
        const int64_t m = n - i < DT_GELU_BLOCK ? n - i : DT_GELU_BLOCK;
        if (dtype == DT_F32 && m == DT_GELU_BLOCK) {
            /* Whole block in place or not: each vector is read before it is written. */
            dt_gelu_block((const float *)x + i, (float *)out + i, approx);
            continue;
        }
        const size_t es = dt_dtype_size(dtype);
        dt_values_get((const char *)x + (size_t)i * es, dtype, (size_t)m, xb);
        for (int64_t k = m; k < DT_GELU_BLOCK; k++) xb[k] = 0.0f;
        dt_gelu_block(xb, yb, approx);
        dt_values_set((char *)out + (size_t)i * es, dtype, (size_t)m, yb);
    }
    return DT_SUCCESS;
}

static dt_status dt_cpu_rmsnorm(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                                const void *x, const void *w, float eps, void *out) {
    (void)b;
    DT_TRY(dt_check_float_dtype("rmsnorm", dtype));
    if (rows < 0 || n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu rmsnorm: negative size rows %" PRId64 " n %" PRId64, rows, n);
    if (!isfinite(eps) || eps < 0.0f)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu rmsnorm: eps %g must be finite and >= 0",
                        (double)eps);
    if (rows == 0 || n == 0) return DT_SUCCESS;
    if (x == NULL || out == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu rmsnorm: NULL buffer");
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) {
            double v = dt_value_get(x, dtype, (size_t)(r * n + i));
            ss += v * v;
        }
        /* 1/rms leaves float's normal range for rows of subnormals (eps 0)
         * or near FLT_MAX: then x 2^k times inv 2^-k, the same product. */
        const double invd = 1.0 / sqrt(ss / (double)n + (double)eps);
        const float up = invd > FLT_MAX ? 0x1p64f : invd < FLT_MIN ? 0x1p-64f : 1.0f;
        const float inv = (float)(invd / up);
        for (int64_t i = 0; i < n; i++) {
            float v = dt_value_get(x, dtype, (size_t)(r * n + i)) * up * inv;
            if (w) v *= dt_value_get(w, dtype, (size_t)i);
            dt_value_set(out, dtype, (size_t)(r * n + i), v);
        }
    }
    return DT_SUCCESS;
}

static dt_status dt_cpu_rotary(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows,
                               int64_t inner, int64_t d, const int64_t *positions, double base,
                               dt_rotary_style style, const void *x, void *out) {
    (void)b;
    DT_TRY(dt_check_float_dtype("rotary", dtype));
    if (outer < 0 || rows < 0 || inner < 0 || d < 0 || d % 2 != 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu rotary: bad size outer %" PRId64 " rows %" PRId64 " inner %" PRId64
                        " d %" PRId64 " (d must be even)", outer, rows, inner, d);
    if (!isfinite(base) || base <= 0.0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu rotary: base %g must be finite and > 0",
                        base);
    if ((int)style < 0 || style >= DT_ROTARY_STYLE_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu rotary: unknown style %d", (int)style);
    if (outer == 0 || rows == 0 || inner == 0 || d == 0) return DT_SUCCESS;
    if (x == NULL || out == NULL || positions == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu rotary: NULL buffer or positions");
    const int64_t half = d / 2;
    double *theta = malloc((size_t)half * sizeof *theta);
    float *cs = malloc((size_t)half * 2 * sizeof *cs);
    if (!theta || !cs) {
        free(theta);
        free(cs);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "cpu rotary: out of host memory (d %" PRId64 ")", d);
    }
    for (int64_t i = 0; i < half; i++) theta[i] = pow(base, -2.0 * (double)i / (double)d);
    const int interleaved = style == DT_ROTARY_INTERLEAVED;
    for (int64_t s = 0; s < rows; s++) {
        const double pos = (double)positions[s];
        for (int64_t i = 0; i < half; i++) {
            const double a = pos * theta[i];
            cs[2 * i] = (float)cos(a);
            cs[2 * i + 1] = (float)sin(a);
        }
        for (int64_t o = 0; o < outer; o++)
            for (int64_t h = 0; h < inner; h++) {
                const int64_t row = ((o * rows + s) * inner + h) * d;
                for (int64_t i = 0; i < half; i++) {
                    const int64_t ia = row + (interleaved ? 2 * i : i);
                    const int64_t ib = row + (interleaved ? 2 * i + 1 : i + half);
                    const float c = cs[2 * i], sn = cs[2 * i + 1];
                    const float va = dt_value_get(x, dtype, (size_t)ia);
                    const float vb = dt_value_get(x, dtype, (size_t)ib);
                    dt_value_set(out, dtype, (size_t)ia, va * c - vb * sn);
                    dt_value_set(out, dtype, (size_t)ib, va * sn + vb * c);
                }
            }
    }
    free(theta);
    free(cs);
    return DT_SUCCESS;
}

static dt_status dt_cpu_sync(dt_backend *b) {
    (void)b; /* host calls complete before they return */
    return DT_SUCCESS;
}

static dt_status dt_cpu_marks_reserve(dt_backend *b, int n) {
    dt_cpu_impl *im = b->impl;
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu marks: %d marks", n);
    if (n > im->n_marks) {
        double *m = realloc(im->marks, (size_t)n * sizeof *m);
        if (!m) return dt_error(DT_ERR_OUT_OF_MEMORY, "cpu marks: out of memory for %d", n);
        im->marks = m;
        im->n_marks = n;
    }
    for (int i = 0; i < n; i++) im->marks[i] = NAN;
    return DT_SUCCESS;
}

static dt_status dt_cpu_mark(dt_backend *b, int i) {
    dt_cpu_impl *im = b->impl;
    if (i < 0 || i >= im->n_marks)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu mark %d: %d reserved", i, im->n_marks);
    struct timespec ts;
    /* The calling (rank) thread's CPU time: its own work, not the time it
     * waits for peers or, with more ranks than cores, for a core. */
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return dt_error(DT_ERR_SYSTEM, "cpu mark %d: no thread CPU clock", i);
    im->marks[i] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return DT_SUCCESS;
}

static dt_status dt_cpu_mark_ms(dt_backend *b, int i, int j, double *ms) {
    dt_cpu_impl *im = b->impl;
    if (i < 0 || j < 0 || i >= im->n_marks || j >= im->n_marks || isnan(im->marks[i]) ||
        isnan(im->marks[j]))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu marks %d, %d: not both recorded", i, j);
    *ms = 1e3 * (im->marks[j] - im->marks[i]);
    return DT_SUCCESS;
}

static const dt_backend_ops dt_cpu_ops = {
    .name = "cpu",
    .destroy = dt_cpu_destroy,
    .alloc = dt_cpu_alloc,
    .alloc_uninit = dt_cpu_alloc_uninit,
    .free = dt_cpu_free,
    .upload = dt_cpu_upload,
    .download = dt_cpu_download,
    .copy = dt_cpu_copy,
    .zero = dt_cpu_zero,
    .copy_runs = dt_cpu_copy_runs,
    .gemm = dt_cpu_gemm,
    .add = dt_cpu_add,
    .add_beside = dt_cpu_add_beside,
    .gelu = dt_cpu_gelu,
    .rmsnorm = dt_cpu_rmsnorm,
    .rotary = dt_cpu_rotary,
    .sync = dt_cpu_sync,
    .marks_reserve = dt_cpu_marks_reserve,
    .mark = dt_cpu_mark,
    .mark_ms = dt_cpu_mark_ms,
};

dt_status dt_backend_cpu_create(int rank, dt_backend **out) {
    if (out == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_backend_cpu_create: out is NULL");
    dt_backend *b = calloc(1, sizeof *b);
    if (b == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_backend_cpu_create: out of host memory (rank %d)",
                        rank);
    b->ops = &dt_cpu_ops;
    b->impl = calloc(1, sizeof(dt_cpu_impl));
    if (b->impl == NULL) {
        free(b);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_backend_cpu_create: out of host memory (rank %d)",
                        rank);
    }
    b->rank = rank;
    *out = b;
    return DT_SUCCESS;
}
