/* dtensor/backend_cpu.c — the CPU compute backend: host memory, OpenBLAS.
 *
 * Tensor data is plain host memory from calloc. bf16 is stored as 16 bits
 * and computed in fp32: every bf16 result is rounded to bf16 exactly once
 * (round to nearest even), so the CPU backend is the reference the CUDA
 * backend is checked against. The backend keeps no global state; the table
 * below is constant.
 *
 * Test: tests/test_ops.c and tests/test_tensor.c (make test).
 */
#include "backend.h"

#include <cblas.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* No per-backend state yet (impl stays NULL): bf16 gemm scratch is made per
 * call, which is fine because gemm is not called inside a hot loop. */
static void dt_cpu_destroy(dt_backend *b) { free(b); }

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

static void dt_add_f32(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

static void dt_add_bf16(dt_bf16 *dst, const dt_bf16 *src, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt_f32_to_bf16(dt_bf16_to_f32(dst[i]) + dt_bf16_to_f32(src[i]));
}

static dt_status dt_cpu_copy_runs(dt_backend *b, const dt_runs *r) {
    (void)b;
    if (r == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu copy_runs: runs is NULL");
    size_t es = dt_dtype_size(r->dtype);
    if (es == 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu copy_runs: unknown dtype %d", (int)r->dtype);
    if (r->op != DT_RUNS_COPY && r->op != DT_RUNS_ADD)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu copy_runs: unknown op %d", (int)r->op);
    if (r->op == DT_RUNS_ADD && r->dtype != DT_F32 && r->dtype != DT_BF16)
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
            if (r->op == DT_RUNS_COPY)
                memcpy(d, s, run_bytes);
            else if (r->dtype == DT_F32)
                dt_add_f32((float *)(void *)d, (const float *)(const void *)s, r->run_elems);
            else
                dt_add_bf16((dt_bf16 *)(void *)d, (const dt_bf16 *)(const void *)s, r->run_elems);
        }
    }
    return DT_SUCCESS;
}

static dt_status dt_check_float_dtype(const char *op, dt_dtype dtype) {
    if (dtype == DT_F32 || dtype == DT_BF16) return DT_SUCCESS;
    return dt_error(DT_ERR_NOT_SUPPORTED, "cpu %s: dtype %s is not supported (fp32, bf16 are)",
                    op, dt_dtype_name(dtype));
}

/* Converts n bf16 values to a new fp32 array (NULL on allocation failure). */
static float *dt_bf16_array_to_f32(const dt_bf16 *src, int64_t n) {
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (f == NULL) return NULL;
    for (int64_t i = 0; i < n; i++) f[i] = dt_bf16_to_f32(src[i]);
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
    float *fa = dt_bf16_array_to_f32(a, m * k);
    float *fb = dt_bf16_array_to_f32(bm, k * n);
    float *fc = malloc((size_t)m * (size_t)n * sizeof *fc);
    if (fa == NULL || fb == NULL || fc == NULL) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY,
                      "cpu gemm: out of host memory for bf16 scratch (m %" PRId64 " n %" PRId64
                      " k %" PRId64 ")", m, n, k);
        goto out;
    }
    dt_sgemm_rowmajor((int)m, (int)n, (int)k, fa, fb, fc);
    dt_bf16 *hc = c;
    for (int64_t i = 0; i < m * n; i++) hc[i] = dt_f32_to_bf16(fc[i]);
out:
    free(fa);
    free(fb);
    free(fc);
    return st;
}

static dt_status dt_cpu_add(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                            const void *y, void *out) {
    (void)b;
    DT_TRY(dt_check_float_dtype("add", dtype));
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu add: negative count %" PRId64, n);
    if (n == 0) return DT_SUCCESS;
    if (x == NULL || y == NULL || out == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu add: NULL buffer");
    if (dtype == DT_F32) {
        const float *fx = x, *fy = y;
        float *fo = out;
        for (int64_t i = 0; i < n; i++) fo[i] = fx[i] + fy[i];
    } else {
        const dt_bf16 *hx = x, *hy = y;
        dt_bf16 *ho = out;
        for (int64_t i = 0; i < n; i++)
            ho[i] = dt_f32_to_bf16(dt_bf16_to_f32(hx[i]) + dt_bf16_to_f32(hy[i]));
    }
    return DT_SUCCESS;
}

static float dt_gelu_f32(float x, dt_gelu_approx approx) {
    const float inv_sqrt2 = 0.70710678118654752440f;
    const float sqrt_2_over_pi = 0.79788456080286535588f;
    if (approx == DT_GELU_ERF) return 0.5f * x * (1.0f + erff(x * inv_sqrt2));
    float u = sqrt_2_over_pi * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

static dt_status dt_cpu_gelu(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, void *out,
                             dt_gelu_approx approx) {
    (void)b;
    DT_TRY(dt_check_float_dtype("gelu", dtype));
    if ((int)approx < 0 || approx >= DT_GELU_APPROX_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gelu: unknown approximation %d", (int)approx);
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gelu: negative count %" PRId64, n);
    if (n == 0) return DT_SUCCESS;
    if (x == NULL || out == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gelu: NULL buffer");
    if (dtype == DT_F32) {
        const float *fx = x;
        float *fo = out;
        for (int64_t i = 0; i < n; i++) fo[i] = dt_gelu_f32(fx[i], approx);
    } else {
        const dt_bf16 *hx = x;
        dt_bf16 *ho = out;
        for (int64_t i = 0; i < n; i++)
            ho[i] = dt_f32_to_bf16(dt_gelu_f32(dt_bf16_to_f32(hx[i]), approx));
    }
    return DT_SUCCESS;
}

static dt_status dt_cpu_sync(dt_backend *b) {
    (void)b; /* host calls complete before they return */
    return DT_SUCCESS;
}

static const dt_backend_ops dt_cpu_ops = {
    .name = "cpu",
    .destroy = dt_cpu_destroy,
    .alloc = dt_cpu_alloc,
    .free = dt_cpu_free,
    .upload = dt_cpu_upload,
    .download = dt_cpu_download,
    .copy = dt_cpu_copy,
    .zero = dt_cpu_zero,
    .copy_runs = dt_cpu_copy_runs,
    .gemm = dt_cpu_gemm,
    .add = dt_cpu_add,
    .gelu = dt_cpu_gelu,
    .sync = dt_cpu_sync,
};

dt_status dt_backend_cpu_create(int rank, dt_backend **out) {
    if (out == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_backend_cpu_create: out is NULL");
    dt_backend *b = calloc(1, sizeof *b);
    if (b == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_backend_cpu_create: out of host memory (rank %d)",
                        rank);
    b->ops = &dt_cpu_ops;
    b->impl = NULL;
    b->rank = rank;
    *out = b;
    return DT_SUCCESS;
}
