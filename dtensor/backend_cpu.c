/* dtensor/backend_cpu.c — the CPU compute backend: host memory, OpenBLAS.
 *
 * Tensor data is host memory from a caching allocator (below), each block
 * after a 16-byte head holding its rounded size. bf16 and fp16 are stored
 * as 16 bits and computed in fp32: every result is rounded to its dtype
 * exactly once (round to nearest even), so the CPU backend is the
 * reference the CUDA backend is checked against. The backend keeps no
 * global state; the table below is constant.
 *
 * Test: tests/test_ops.c and tests/test_tensor.c, and tests/test_grad_kernels.c
 * for the gradient, loss and optimizer entries (make test).
 */
#include "backend.h"
#include "context.h"   /* dt_memory_stats */
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
 * call, which is fine because gemm is not called inside a hot loop), the
 * caching allocator's free blocks and the memory counters (the rank's
 * thread only). */
typedef struct dt_cpu_impl {
    double *marks;   /* the rank thread's CPU seconds; NAN until recorded */
    int n_marks;
    void **cached;   /* raw blocks kept for reuse, the newest last */
    size_t n_cached, cap_cached, cached_bytes;
    size_t in_use, peak;   /* bytes of live blocks (their rounded sizes) */
    uint64_t mallocs;
} dt_cpu_impl;

/* Memory is a caching allocator, as the CUDA backend's: a freed block is
 * kept and serves the next request of its rounded size (512 B, 2 MiB from
 * 1 MiB up), so a loop that repeats its requests (a training step) takes
 * no memory from the system after its first pass and no page faults. A
 * block is CPU_HEAD bytes holding its rounded size, then the caller's
 * (malloc's 16-byte alignment kept). Under AddressSanitizer and valgrind a
 * cached block is off limits, as freed memory is. The cache is emptied
 * when malloc fails (then tried again), on request (memory op) and at
 * destroy. */
#define CPU_HEAD 16

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CPU_NOACCESS(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CPU_UNDEFINED(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#define CPU_DEFINED(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#elif defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define CPU_NOACCESS(p, n) VALGRIND_MAKE_MEM_NOACCESS(p, n)
#define CPU_UNDEFINED(p, n) VALGRIND_MAKE_MEM_UNDEFINED(p, n)
#define CPU_DEFINED(p, n) VALGRIND_MAKE_MEM_DEFINED(p, n)
#endif
#endif
#ifndef CPU_NOACCESS
#define CPU_NOACCESS(p, n) ((void)(p), (void)(n))
#define CPU_UNDEFINED(p, n) ((void)(p), (void)(n))
#define CPU_DEFINED(p, n) ((void)(p), (void)(n))
#endif

static size_t cpu_rounded(size_t bytes) {
    const size_t unit = bytes < ((size_t)1 << 20) ? 512 : (size_t)2 << 20;
    const size_t want = (bytes + unit - 1) / unit * unit;
    return want ? want : unit;
}

static size_t cpu_size_of(const void *raw) {
    size_t n;
    memcpy(&n, raw, sizeof n);
    return n;
}

static void cpu_cache_empty(dt_cpu_impl *im) {
    for (size_t i = 0; i < im->n_cached; i++) {
        CPU_DEFINED(im->cached[i], CPU_HEAD);
        free(im->cached[i]);
    }
    im->n_cached = im->cached_bytes = 0;
}

/* A raw block of `want` bytes (rounded) for the caller, counted in; NULL
 * if the host is out of memory. */
static void *cpu_block(dt_cpu_impl *im, size_t want) {
    void *raw = NULL;
    for (size_t i = im->n_cached; i > 0 && !raw; i--) {
        CPU_DEFINED(im->cached[i - 1], CPU_HEAD);
        if (cpu_size_of(im->cached[i - 1]) == want) {
            raw = im->cached[i - 1];
            im->cached[i - 1] = im->cached[--im->n_cached];
            im->cached_bytes -= want;
            CPU_UNDEFINED((char *)raw + CPU_HEAD, want);
        } else {
            CPU_NOACCESS(im->cached[i - 1], CPU_HEAD);
        }
    }
    if (!raw) {
        raw = malloc(CPU_HEAD + want);
        if (!raw && im->n_cached) {
            cpu_cache_empty(im);
            raw = malloc(CPU_HEAD + want);
        }
        if (!raw) return NULL;
        im->mallocs++;
        memcpy(raw, &want, sizeof want);
    }
    im->in_use += want;
    if (im->in_use > im->peak) im->peak = im->in_use;
    return raw;
}

static dt_status cpu_alloc(dt_backend *b, size_t bytes, void **out, int zero) {
    if (out == NULL) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu alloc: out is NULL");
    void *raw = bytes <= SIZE_MAX - CPU_HEAD - ((size_t)2 << 20) ? cpu_block(b->impl, cpu_rounded(bytes))
                                                               : NULL;
    if (raw == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "cpu alloc: out of host memory for %zu bytes",
                        bytes);
    if (zero) memset((char *)raw + CPU_HEAD, 0, bytes);
    *out = (char *)raw + CPU_HEAD;
    return DT_SUCCESS;
}

static dt_status dt_cpu_alloc(dt_backend *b, size_t bytes, void **out) {
    return cpu_alloc(b, bytes, out, 1);
}

static dt_status dt_cpu_alloc_uninit(dt_backend *b, size_t bytes, void **out) {
    return cpu_alloc(b, bytes, out, 0);
}

static void dt_cpu_free(dt_backend *b, void *p) {
    if (!p) return;
    dt_cpu_impl *im = b->impl;
    char *raw = (char *)p - CPU_HEAD;
    const size_t n = cpu_size_of(raw);
    im->in_use -= n < im->in_use ? n : im->in_use;
    if (im->n_cached == im->cap_cached) {
        const size_t cap = im->cap_cached ? 2 * im->cap_cached : 64;
        void **v = realloc(im->cached, cap * sizeof *v);
        if (!v) {   /* no room to keep it: back to the system */
            free(raw);
            return;
        }
        im->cached = v;
        im->cap_cached = cap;
    }
    im->cached[im->n_cached++] = raw;
    im->cached_bytes += n;
    CPU_NOACCESS(raw, CPU_HEAD + n);
}

static dt_status dt_cpu_memory(dt_backend *b, dt_memory_stats *out, int what) {
    dt_cpu_impl *im = b->impl;
    if (what & DT_MEMORY_RELEASE) cpu_cache_empty(im);
    if (what & DT_MEMORY_RESET_PEAK) im->peak = im->in_use;
    *out = (dt_memory_stats){im->in_use, im->peak, im->cached_bytes, im->mallocs};
    return DT_SUCCESS;
}

static void dt_cpu_destroy(dt_backend *b) {
    if (!b) return;
    dt_cpu_impl *im = b->impl;
    if (im) {
        cpu_cache_empty(im);
        free(im->cached);
        free(im->marks);
    }
    free(im);
    free(b);
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
 *   tanh: (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 *   exp:  dt_vexpf (cpu_vec.h).
 *
 * Accuracy against x * Phi(x) in double rounded to fp32, every fp32 value
 * of each range: x in [1e-4, 6] at most 2 ulp erf, 3 ulp tanh; x in
 * [-3, -1e-4] at most 15 ulp erf, 16 ulp tanh; x in [-6, -3] at most 62 ulp
 * (erff's 1 + erf loses every bit there). tests/test_ops.c's 1e-6 +
 * 1e-6|ref| holds there and on every 37th bit pattern of the whole fp32
 * range. NaN gives NaN, +inf gives inf, -inf gives NaN. */
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

/* ------------------------------------------- fp32 loops, compiled twice
 *
 * Each loop below is written once and inlined into a plain copy and, on
 * x86, an AVX2 copy for CPUs that have it (DT_CPU_COPIES; DT_CPU_RUN picks
 * one): no FMA, no reciprocal estimates, so both copies give the same bits.
 * Vector blocks cover what fits (eight floats, or four doubles), the rest
 * of a row goes element by element through the same arithmetic. */
#ifdef DT_VEC_AVX2
#define DT_CPU_COPIES(name, params, args)                 \
    static void name##_plain params { name##_loop args; } \
    DT_VEC_AVX2 static void name##_avx2 params { name##_loop args; }
#define DT_CPU_RUN(name, args)       \
    do {                             \
        if (dt_cpu_avx2())           \
            name##_avx2 args;        \
        else                         \
            name##_plain args;       \
    } while (0)
#else
#define DT_CPU_COPIES(name, params, args) \
    static void name##_plain params { name##_loop args; }
#define DT_CPU_RUN(name, args) name##_plain args
#endif

/* RMSNorm's row sums of fp32 x [n] in double: *ss = sum x^2 and (dy not
 * NULL) *sgx = sum g x, g = dy w (dy without w). Eight lanes (two vectors of
 * four doubles per sum), each lane's terms in index order, the lanes then
 * added pairwise, then the tail's terms: another order than one running sum,
 * the same bound (each sum within (n + 1) 2^-53 of its terms' magnitudes). */
DT_VEC_INLINE void dt_rms_sums_f32(int64_t n, const float *x, const float *dy, const float *w,
                                   double *ss, double *sgx) {
    double s = 0.0, sg = 0.0;
    int64_t i = 0;
#if defined(__GNUC__)
    if (n >= 8) {
        dt_vd4 s0 = {0}, s1 = {0}, g0 = {0}, g1 = {0}, v0, v1, d0, d1, w0, w1;
        for (; i + 8 <= n; i += 8) {
            dt_vload_d4(x + i, &v0);
            dt_vload_d4(x + i + 4, &v1);
            s0 += v0 * v0;
            s1 += v1 * v1;
            if (!dy) continue;
            dt_vload_d4(dy + i, &d0);
            dt_vload_d4(dy + i + 4, &d1);
            if (w) {
                dt_vload_d4(w + i, &w0);
                dt_vload_d4(w + i + 4, &w1);
                d0 *= w0;
                d1 *= w1;
            }
            g0 += d0 * v0;
            g1 += d1 * v1;
        }
        s0 += s1;
        g0 += g1;
        s = dt_vsum_d4(&s0);
        sg = dt_vsum_d4(&g0);
    }
#endif
    for (; i < n; i++) {
        const double v = x[i];
        s += v * v;
        if (dy) sg += (w ? (double)dy[i] * w[i] : (double)dy[i]) * v;
    }
    *ss = s;
    if (sgx) *sgx = sg;
}

/* dt_cpu_rmsnorm's rows for fp32: out = x up inv (times w) in fp32, up and
 * inv formed as in dt_cpu_rmsnorm's loop for the other dtypes. */
DT_VEC_INLINE void dt_rmsnorm_f32_loop(int64_t rows, int64_t n, const float *x, const float *w,
                                       float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = out + r * n;
        double ss;
        dt_rms_sums_f32(n, xr, NULL, NULL, &ss, NULL);
        const double invd = 1.0 / sqrt(ss / (double)n + (double)eps);
        const float up = invd > FLT_MAX ? 0x1p64f : invd < FLT_MIN ? 0x1p-64f : 1.0f;
        const float inv = (float)(invd / up);
        int64_t i = 0;
#if defined(__GNUC__)
        for (; i + 8 <= n; i += 8) {
            dt_vf8 v, wv;
            memcpy(&v, xr + i, sizeof v);
            v = v * up * inv;
            if (w) memcpy(&wv, w + i, sizeof wv), v *= wv;
            memcpy(yr + i, &v, sizeof v);
        }
#endif
        for (; i < n; i++) {
            float v = xr[i] * up * inv;
            if (w) v *= w[i];
            yr[i] = v;
        }
    }
}

DT_CPU_COPIES(dt_rmsnorm_f32,
              (int64_t rows, int64_t n, const float *x, const float *w, float eps, float *out),
              (rows, n, x, w, eps, out))

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
    if (dtype == DT_F32) {
        DT_CPU_RUN(dt_rmsnorm_f32, (rows, n, x, w, eps, out));
        return DT_SUCCESS;
    }
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

/* One row of rotary in fp32, a' = a c - b s, b' = a s + b c, each product
 * rounded: half style, pairs (x[i], x[i + d/2]) with cv, sv [d/2] the cos
 * and sin of pair i; interleaved, pairs (x[2i], x[2i + 1]) with cv = (c_i,
 * c_i) and sv = (-s_i, s_i) [d], so that lane by lane y = x cv + swap(x) sv
 * (a c + b (-s) is a c - b s exactly). y may be x. */
DT_VEC_INLINE void dt_rotate_row_f32(int64_t d, int interleaved, const float *cv, const float *sv,
                                     const float *x, float *y) {
    const int64_t half = d / 2;
    int64_t i = 0;
    if (!interleaved) {
#if defined(__GNUC__)
        for (; i + 8 <= half; i += 8) {
            dt_vf8 a, bv, c, sn;
            memcpy(&a, x + i, sizeof a);
            memcpy(&bv, x + half + i, sizeof bv);
            memcpy(&c, cv + i, sizeof c);
            memcpy(&sn, sv + i, sizeof sn);
            const dt_vf8 ya = a * c - bv * sn, yb = a * sn + bv * c;
            memcpy(y + i, &ya, sizeof ya);
            memcpy(y + half + i, &yb, sizeof yb);
        }
#endif
        for (; i < half; i++) {
            const float a = x[i], bv = x[half + i], c = cv[i], sn = sv[i];
            y[i] = a * c - bv * sn;
            y[half + i] = a * sn + bv * c;
        }
        return;
    }
#if defined(__GNUC__)
    for (; i + 8 <= d; i += 8) {
        dt_vf8 v, sw, c, sn;
        memcpy(&v, x + i, sizeof v);
        dt_vswap_pairs_f8(&v, &sw);
        memcpy(&c, cv + i, sizeof c);
        memcpy(&sn, sv + i, sizeof sn);
        v = v * c + sw * sn;
        memcpy(y + i, &v, sizeof v);
    }
#endif
    for (; i < d; i += 2) {
        const float a = x[i], bv = x[i + 1], c = cv[i], sn = sv[i + 1];
        y[i] = a * c - bv * sn;
        y[i + 1] = a * sn + bv * c;
    }
}

/* The `inner` rows of d at element offset `row` of fp32 x and out. */
DT_VEC_INLINE void dt_rotate_f32_loop(int64_t inner, int64_t d, int interleaved, const float *cv,
                                      const float *sv, const float *x, float *out, int64_t row) {
    for (int64_t h = 0; h < inner; h++)
        dt_rotate_row_f32(d, interleaved, cv, sv, x + row + h * d, out + row + h * d);
}

DT_CPU_COPIES(dt_rotate_f32,
              (int64_t inner, int64_t d, int interleaved, const float *cv, const float *sv,
               const float *x, float *out, int64_t row),
              (inner, d, interleaved, cv, sv, x, out, row))

/* rotary (sign 1) and rotary_inverse (sign -1, the rotation by -angle):
 * the same angles, cos and sin; the inverse negates the fp32 sine, which
 * rounds the same either way, so its products are the forward's up to sign.
 * cos/sin are made once per position and reused across the outer rows that
 * share it (all of them with pos_stride 0), in the layout of
 * dt_rotate_row_f32 (which fp32 runs through; other dtypes element by
 * element, the same arithmetic, each result rounded once). */
static dt_status dt_cpu_rotate(const char *what, double sign, dt_dtype dtype, int64_t outer,
                               int64_t rows, int64_t inner, int64_t d, const int64_t *positions,
                               int64_t pos_stride, double base, dt_rotary_style style,
                               const void *x, void *out) {
    DT_TRY(dt_check_float_dtype(what, dtype));
    if (outer < 0 || rows < 0 || inner < 0 || d < 0 || d % 2 != 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu %s: bad size outer %" PRId64 " rows %" PRId64 " inner %" PRId64
                        " d %" PRId64 " (d must be even)", what, outer, rows, inner, d);
    if (pos_stride != 0 && pos_stride < rows)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu %s: pos_stride %" PRId64 " must be 0 (shared) or >= rows %" PRId64,
                        what, pos_stride, rows);
    if (!isfinite(base) || base <= 0.0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: base %g must be finite and > 0", what,
                        base);
    if ((int)style < 0 || style >= DT_ROTARY_STYLE_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: unknown style %d", what, (int)style);
    if (outer == 0 || rows == 0 || inner == 0 || d == 0) return DT_SUCCESS;
    if (x == NULL || out == NULL || positions == NULL)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: NULL buffer or positions", what);
    const int64_t half = d / 2;
    double *theta = malloc((size_t)half * sizeof *theta);
    float *cv = malloc((size_t)d * 2 * sizeof *cv), *sv = cv ? cv + d : NULL;
    if (!theta || !cv) {
        free(theta);
        free(cv);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "cpu %s: out of host memory (d %" PRId64 ")", what,
                        d);
    }
    for (int64_t i = 0; i < half; i++) theta[i] = pow(base, -2.0 * (double)i / (double)d);
    const int interleaved = style == DT_ROTARY_INTERLEAVED;
    for (int64_t s = 0; s < rows; s++)
        for (int64_t o = 0; o < outer; o++) {
            if (o == 0 || pos_stride != 0) {
                const double pos = (double)positions[o * pos_stride + s];
                for (int64_t i = 0; i < half; i++) {
                    const double a = pos * theta[i];
                    const float c = (float)cos(a), sn = (float)(sign * sin(a));
                    if (interleaved) {
                        cv[2 * i] = cv[2 * i + 1] = c;
                        sv[2 * i] = -sn;
                        sv[2 * i + 1] = sn;
                    } else {
                        cv[i] = c;
                        sv[i] = sn;
                    }
                }
            }
            const int64_t row0 = (o * rows + s) * inner * d;
            if (dtype == DT_F32) {
                DT_CPU_RUN(dt_rotate_f32, (inner, d, interleaved, cv, sv, x, out, row0));
                continue;
            }
            for (int64_t h = 0; h < inner; h++) {
                const int64_t row = row0 + h * d;
                for (int64_t i = 0; i < half; i++) {
                    const int64_t ia = row + (interleaved ? 2 * i : i);
                    const int64_t ib = row + (interleaved ? 2 * i + 1 : i + half);
                    const float c = cv[interleaved ? 2 * i : i];
                    const float sn = sv[interleaved ? 2 * i + 1 : i];
                    const float va = dt_value_get(x, dtype, (size_t)ia);
                    const float vb = dt_value_get(x, dtype, (size_t)ib);
                    dt_value_set(out, dtype, (size_t)ia, va * c - vb * sn);
                    dt_value_set(out, dtype, (size_t)ib, va * sn + vb * c);
                }
            }
        }
    free(theta);
    free(cv);
    return DT_SUCCESS;
}

static dt_status dt_cpu_rotary(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows,
                               int64_t inner, int64_t d, const int64_t *positions,
                               int64_t pos_stride, double base, dt_rotary_style style,
                               const void *x, void *out) {
    (void)b;
    return dt_cpu_rotate("rotary", 1.0, dtype, outer, rows, inner, d, positions, pos_stride, base,
                         style, x, out);
}

/* ------------------------------------------- gradients, losses, optimizer
 *
 * backend.h's contracts. Elementwise values are formed in double from the
 * stored inputs and rounded to fp32 once (fp32 SwiGLU and fp32 ce_grad's dx
 * excepted: fp32 arithmetic, within the bounds stated at their loops); with
 * `accumulate` the stored output is then added in fp32 and the sum rounded
 * to the dtype once. Sums over many values (rmsnorm_backward, ce_sum,
 * sumsq) are accumulated in double; the gradients of embedding rows in
 * fp32, in token order. */

static dt_status dt_cpu_rotary_inverse(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows,
                                       int64_t inner, int64_t d, const int64_t *positions,
                                       int64_t pos_stride, double base, dt_rotary_style style,
                                       const void *x, void *out) {
    (void)b;
    return dt_cpu_rotate("rotary inverse", -1.0, dtype, outer, rows, inner, d, positions,
                         pos_stride, base, style, x, out);
}

/* Element i of out becomes v, plus (accumulate) what it holds, added in
 * fp32; rounded to dtype once. */
static inline void dt_put(void *out, dt_dtype dtype, size_t i, float v, int accumulate) {
    if (accumulate) v += dt_value_get(out, dtype, i);
    dt_value_set(out, dtype, i, v);
}

static dt_status dt_cpu_gemm_ex(dt_backend *b, dt_dtype dtype, int trans_a, int trans_b,
                                int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                                const void *bm, float beta, void *c) {
    (void)b;
    DT_TRY(dt_check_float_dtype("gemm_ex", dtype));
    if ((trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gemm_ex: trans_a %d, trans_b %d (0 or 1)",
                        trans_a, trans_b);
    if (m < 0 || n < 0 || k < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu gemm_ex: negative size m %" PRId64 " n %" PRId64 " k %" PRId64, m, n,
                        k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "cpu gemm_ex: m %" PRId64 " n %" PRId64 " k %" PRId64
                        " exceeds the BLAS int range", m, n, k);
    if (m == 0 || n == 0) return DT_SUCCESS;
    if (c == NULL || (k > 0 && (a == NULL || bm == NULL)))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gemm_ex: NULL buffer");
    const size_t mn = (size_t)m * (size_t)n;
    if (k == 0) {
        /* C = beta C (beta 0: zeros, C unread), rounded once */
        for (size_t i = 0; i < mn; i++)
            dt_value_set(c, dtype, i, beta == 0.0f ? 0.0f : beta * dt_value_get(c, dtype, i));
        return DT_SUCCESS;
    }
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    const int lda = (int)(trans_a ? m : k), ldb = (int)(trans_b ? k : n);
    if (dtype == DT_F32) {
        /* beta 0: BLAS stores alpha A B without reading C */
        cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha, a, lda, bm, ldb, beta, c,
                    (int)n);
        return DT_SUCCESS;
    }
    dt_status st = DT_SUCCESS;
    float *fa = dt_array_to_f32(dtype, a, m * k);
    float *fb = dt_array_to_f32(dtype, bm, k * n);
    float *fc = beta != 0.0f ? dt_array_to_f32(dtype, c, m * n) : malloc(mn * sizeof *fc);
    if (fa == NULL || fb == NULL || fc == NULL) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY,
                      "cpu gemm_ex: out of host memory for %s scratch (m %" PRId64 " n %" PRId64
                      " k %" PRId64 ")", dt_dtype_name(dtype), m, n, k);
        goto out;
    }
    cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha, fa, lda, fb, ldb, beta, fc,
                (int)n);
    dt_values_set(c, dtype, mn, fc);
out:
    free(fa);
    free(fb);
    free(fc);
    return st;
}

/* gelu'(x) in double; its limits at -inf and +inf are 0 and 1. */
static double dt_gelu_grad(double x, dt_gelu_approx approx) {
    if (isinf(x)) return x > 0.0 ? 1.0 : 0.0;
    if (approx == DT_GELU_ERF) {
        /* Phi(x) + x phi(x); erfc keeps Phi's relative accuracy for x < 0 */
        const double cdf = 0.5 * erfc(-x * 0.70710678118654752440);
        return cdf + x * (0.39894228040143267794 * exp(-0.5 * x * x));
    }
    /* x s(2u) with u = sqrt(2/pi) (x + 0.044715 x^3): s + 2 x s (1 - s) u';
     * 1 - s formed as its own sigmoid, and the second term 0 where s (1 - s)
     * underflows (u' may overflow there) */
    const double k = 0.79788456080286535588, c3 = 0.044715;
    const double u = k * (x + c3 * x * x * x);
    const double s = 1.0 / (1.0 + exp(-2.0 * u)), sc = 1.0 / (1.0 + exp(2.0 * u));
    const double ss = s * sc;
    return s + (ss == 0.0 ? 0.0 : 2.0 * x * ss * (k * (1.0 + 3.0 * c3 * x * x)));
}

static dt_status dt_cpu_gelu_backward(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                                      const void *dy, void *dx, dt_gelu_approx approx,
                                      int accumulate) {
    (void)b;
    if ((int)approx < 0 || approx >= DT_GELU_APPROX_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu gelu backward: unknown approximation %d",
                        (int)approx);
    DT_TRY(dt_cpu_elementwise_args("gelu backward", dtype, n, x, dy, 0, dx));
    for (size_t i = 0; i < (size_t)n; i++) {
        const double g = dt_gelu_grad(dt_value_get(x, dtype, i), approx);
        dt_put(dx, dtype, i, (float)(dt_value_get(dy, dtype, i) * g), accumulate);
    }
    return DT_SUCCESS;
}

/* silu(g) = g s(g) and silu'(g) = s(g) (1 + g (1 - s(g))) in double, with
 * 1 - s(g) = s(-g) formed on its own; at -inf: 0 and 0, at +inf: inf and 1. */
static void dt_silu(double g, double *silu, double *dsilu) {
    if (isinf(g)) {
        *silu = g > 0.0 ? g : -0.0;
        *dsilu = g > 0.0 ? 1.0 : 0.0;
        return;
    }
    const double s = 1.0 / (1.0 + exp(-g)), sc = 1.0 / (1.0 + exp(g));
    *silu = g * s;
    *dsilu = s * (1.0 + g * sc);
}

/* Element i of SwiGLU and of its backward, any dtype: silu in double
 * (dt_silu), each result rounded once. dgate or dup may be gate, up or dy:
 * all are read before either is written. */
static inline void dt_swiglu_at(dt_dtype dtype, size_t i, const void *gate, const void *up,
                                void *out) {
    double silu, dsilu;
    dt_silu(dt_value_get(gate, dtype, i), &silu, &dsilu);
    dt_value_set(out, dtype, i, (float)(silu * dt_value_get(up, dtype, i)));
}

static inline void dt_swiglu_backward_at(dt_dtype dtype, size_t i, const void *gate,
                                         const void *up, const void *dy, void *dgate, void *dup,
                                         int accumulate) {
    double silu, dsilu;
    dt_silu(dt_value_get(gate, dtype, i), &silu, &dsilu);
    const double g = dt_value_get(dy, dtype, i);
    const float vg = (float)(g * dt_value_get(up, dtype, i) * dsilu), vu = (float)(g * silu);
    if (dgate) dt_put(dgate, dtype, i, vg, accumulate);
    if (dup) dt_put(dup, dtype, i, vu, accumulate);
}

#if defined(__GNUC__)
/* fp32 in blocks of eight, in fp32: silu and silu' of the gates
 * (dt_vsilu_f8, cpu_vec.h), then out = silu up, dgate = (dy up) silu' and
 * dup = dy silu; before the final rounding, within 3.32u |out| (and |dup|)
 * and 8.9u |dy up| s (1 + |g| (1 - s)) (dgate; s = s(g)), u = 2^-24 (the
 * bounds derived in tests/test_grad_kernels.c). A block goes element by
 * element through the _at functions (double) where a gate is one that
 * dt_vsilu_ok_f8 refuses (NaN, +-inf, |g| > 87, 0 < |g| < 2^-125) or, in
 * the backward, where dy up is not finite. Each loop is written once and
 * inlined into a plain copy and, on x86, an AVX2 copy for CPUs that have it
 * (no FMA, no reciprocal estimates: the same results either way). Outputs
 * may be inputs: a block reads all its inputs before it writes. */
DT_VEC_INLINE int dt_swiglu8(const float *gate, const float *up, float *out) {
    dt_vf8 g, u, silu, dsilu;
    memcpy(&g, gate, sizeof g);
    if (!dt_vsilu_ok_f8(&g)) return 0;
    memcpy(&u, up, sizeof u);
    dt_vsilu_f8(&g, &silu, &dsilu);   /* dsilu unused: the compiler drops it */
    silu *= u;
    memcpy(out, &silu, sizeof silu);
    return 1;
}

DT_VEC_INLINE int dt_swiglu_backward8(const float *gate, const float *up, const float *dy,
                                      float *dgate, float *dup, int accumulate) {
    dt_vf8 g, u, d, silu, dsilu, old;
    memcpy(&g, gate, sizeof g);
    memcpy(&u, up, sizeof u);
    memcpy(&d, dy, sizeof d);
    const dt_vf8 du = d * u;
    const dt_vi8 finite = du - du == 0.0f;   /* inf - inf and NaN are NaN */
    if (!dt_vsilu_ok_f8(&g) || !dt_vall8(&finite)) return 0;
    dt_vsilu_f8(&g, &silu, &dsilu);
    dt_vf8 vg = du * dsilu, vu = d * silu;
    if (accumulate && dgate) memcpy(&old, dgate, sizeof old), vg += old;   /* fp32, as dt_put */
    if (accumulate && dup) memcpy(&old, dup, sizeof old), vu += old;
    if (dgate) memcpy(dgate, &vg, sizeof vg);
    if (dup) memcpy(dup, &vu, sizeof vu);
    return 1;
}

DT_VEC_INLINE void dt_swiglu_loop(dt_dtype dtype, size_t n, const void *gate, const void *up,
                                  void *out) {
    size_t i = 0;
    for (; dtype == DT_F32 && i + 8 <= n; i += 8)
        if (!dt_swiglu8((const float *)gate + i, (const float *)up + i, (float *)out + i))
            for (size_t j = i; j < i + 8; j++) dt_swiglu_at(dtype, j, gate, up, out);
    for (; i < n; i++) dt_swiglu_at(dtype, i, gate, up, out);
}

DT_VEC_INLINE void dt_swiglu_backward_loop(dt_dtype dtype, size_t n, const void *gate,
                                           const void *up, const void *dy, void *dgate, void *dup,
                                           int accumulate) {
    size_t i = 0;
    for (; dtype == DT_F32 && i + 8 <= n; i += 8)
        if (!dt_swiglu_backward8((const float *)gate + i, (const float *)up + i,
                                 (const float *)dy + i, dgate ? (float *)dgate + i : NULL,
                                 dup ? (float *)dup + i : NULL, accumulate))
            for (size_t j = i; j < i + 8; j++)
                dt_swiglu_backward_at(dtype, j, gate, up, dy, dgate, dup, accumulate);
    for (; i < n; i++) dt_swiglu_backward_at(dtype, i, gate, up, dy, dgate, dup, accumulate);
}

static void dt_swiglu_plain(dt_dtype dtype, size_t n, const void *gate, const void *up,
                            void *out) {
    dt_swiglu_loop(dtype, n, gate, up, out);
}

static void dt_swiglu_backward_plain(dt_dtype dtype, size_t n, const void *gate, const void *up,
                                     const void *dy, void *dgate, void *dup, int accumulate) {
    dt_swiglu_backward_loop(dtype, n, gate, up, dy, dgate, dup, accumulate);
}

#ifdef DT_VEC_AVX2
DT_VEC_AVX2 static void dt_swiglu_avx2(dt_dtype dtype, size_t n, const void *gate,
                                       const void *up, void *out) {
    dt_swiglu_loop(dtype, n, gate, up, out);
}

DT_VEC_AVX2 static void dt_swiglu_backward_avx2(dt_dtype dtype, size_t n, const void *gate,
                                                const void *up, const void *dy, void *dgate,
                                                void *dup, int accumulate) {
    dt_swiglu_backward_loop(dtype, n, gate, up, dy, dgate, dup, accumulate);
}
#endif
#endif

static dt_status dt_cpu_swiglu(dt_backend *b, dt_dtype dtype, int64_t n, const void *gate,
                               const void *up, void *out) {
    (void)b;
    DT_TRY(dt_cpu_elementwise_args("swiglu", dtype, n, gate, up, 0, out));
#ifdef DT_VEC_AVX2
    if (dt_cpu_avx2()) dt_swiglu_avx2(dtype, (size_t)n, gate, up, out);
    else dt_swiglu_plain(dtype, (size_t)n, gate, up, out);
#elif defined(__GNUC__)
    dt_swiglu_plain(dtype, (size_t)n, gate, up, out);
#else
    for (size_t i = 0; i < (size_t)n; i++) dt_swiglu_at(dtype, i, gate, up, out);
#endif
    return DT_SUCCESS;
}

static dt_status dt_cpu_swiglu_backward(dt_backend *b, dt_dtype dtype, int64_t n,
                                        const void *gate, const void *up, const void *dy,
                                        void *dgate, void *dup, int accumulate) {
    (void)b;
    DT_TRY(dt_cpu_elementwise_args("swiglu backward", dtype, n, gate, up, 0, dy));
    if (!dgate && !dup) return DT_SUCCESS;
#ifdef DT_VEC_AVX2
    if (dt_cpu_avx2())
        dt_swiglu_backward_avx2(dtype, (size_t)n, gate, up, dy, dgate, dup, accumulate);
    else
        dt_swiglu_backward_plain(dtype, (size_t)n, gate, up, dy, dgate, dup, accumulate);
#elif defined(__GNUC__)
    dt_swiglu_backward_plain(dtype, (size_t)n, gate, up, dy, dgate, dup, accumulate);
#else
    for (size_t i = 0; i < (size_t)n; i++)
        dt_swiglu_backward_at(dtype, i, gate, up, dy, dgate, dup, accumulate);
#endif
    return DT_SUCCESS;
}

/* dt_cpu_rmsnorm_backward's rows for fp32: dx (when not NULL) written or
 * added into, dw's sums added into acc (when not NULL), in double, as the
 * other dtypes' loop; the row sums through dt_rms_sums_f32, then one pass
 * for acc and dx, four doubles at a time. */
DT_VEC_INLINE void dt_rmsnorm_backward_f32_loop(int64_t rows, int64_t n, const float *x,
                                                const float *w, float eps, const float *dy,
                                                float *dx, double *acc, int accumulate) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n, *gr = dy + r * n;
        float *dr = dx ? dx + r * n : NULL;
        double ss, sgx;
        dt_rms_sums_f32(n, xr, gr, w, &ss, &sgx);
        const double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
        const double k3 = inv * inv * inv * (sgx / (double)n);
        int64_t i = 0;
#if defined(__GNUC__)
        for (; i + 4 <= n; i += 4) {
            dt_vd4 v, g, t;
            dt_vload_d4(xr + i, &v);
            dt_vload_d4(gr + i, &g);
            if (acc) {
                memcpy(&t, acc + i, sizeof t);
                t += g * v * inv;
                memcpy(acc + i, &t, sizeof t);
            }
            if (!dr) continue;
            if (w) dt_vload_d4(w + i, &t), g *= t;
            t = inv * g - v * k3;
            dt_vf f, old;
            f = __builtin_convertvector(t, dt_vf);
            if (accumulate) memcpy(&old, dr + i, sizeof old), f += old;   /* fp32, as dt_put */
            memcpy(dr + i, &f, sizeof f);
        }
#endif
        for (; i < n; i++) {
            if (acc) acc[i] += (double)gr[i] * xr[i] * inv;
            if (!dr) continue;
            const double g = w ? (double)gr[i] * w[i] : (double)gr[i];
            const float v = (float)(inv * g - (double)xr[i] * k3);
            dr[i] = accumulate ? v + dr[i] : v;
        }
    }
}

DT_CPU_COPIES(dt_rmsnorm_backward_f32,
              (int64_t rows, int64_t n, const float *x, const float *w, float eps,
               const float *dy, float *dx, double *acc, int accumulate),
              (rows, n, x, w, eps, dy, dx, acc, accumulate))

static dt_status dt_cpu_rmsnorm_backward(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                                         const void *x, const void *w, float eps, const void *dy,
                                         void *dx, void *dw, int accumulate) {
    (void)b;
    DT_TRY(dt_check_float_dtype("rmsnorm backward", dtype));
    if (rows < 0 || n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu rmsnorm backward: negative size rows %" PRId64 " n %" PRId64, rows,
                        n);
    if (!isfinite(eps) || eps < 0.0f)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu rmsnorm backward: eps %g must be finite and >= 0", (double)eps);
    if (w == NULL) dw = NULL;   /* no weight: no weight gradient */
    if (n == 0 || (dx == NULL && dw == NULL)) return DT_SUCCESS;
    if ((rows > 0 && (x == NULL || dy == NULL)) || (dw != NULL && w == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu rmsnorm backward: NULL buffer");
    double *acc = NULL;
    if (dw) {
        acc = calloc((size_t)n, sizeof *acc);
        if (acc == NULL)
            return dt_error(DT_ERR_OUT_OF_MEMORY,
                            "cpu rmsnorm backward: out of host memory (n %" PRId64 ")", n);
    }
    if (dtype == DT_F32) {   /* the same arithmetic on float pointers */
        DT_CPU_RUN(dt_rmsnorm_backward_f32,
                   (rows, n, x, w, eps, dy, dx, dw ? acc : NULL, accumulate));
        rows = 0;
    }
    for (int64_t r = 0; r < rows; r++) {
        const size_t o = (size_t)(r * n);
        double ss = 0.0, sgx = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double v = dt_value_get(x, dtype, o + (size_t)i);
            double g = dt_value_get(dy, dtype, o + (size_t)i);
            if (w) g *= dt_value_get(w, dtype, (size_t)i);
            ss += v * v;
            sgx += g * v;
        }
        /* r and r^3 mean(g x) in double, as the forward's r */
        const double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
        const double k3 = inv * inv * inv * (sgx / (double)n);
        for (int64_t i = 0; dw && i < n; i++)
            acc[i] += (double)dt_value_get(dy, dtype, o + (size_t)i) *
                      dt_value_get(x, dtype, o + (size_t)i) * inv;
        for (int64_t i = 0; dx && i < n; i++) {
            const double v = dt_value_get(x, dtype, o + (size_t)i);
            double g = dt_value_get(dy, dtype, o + (size_t)i);
            if (w) g *= dt_value_get(w, dtype, (size_t)i);
            dt_put(dx, dtype, o + (size_t)i, (float)(inv * g - v * k3), accumulate);
        }
    }
    for (int64_t i = 0; dw && i < n; i++) dt_put(dw, dtype, (size_t)i, (float)acc[i], accumulate);
    free(acc);
    return DT_SUCCESS;
}

/* The arguments of embedding and embedding_backward: tok and the [n, d]
 * buffer (out, dy) are needed for n > 0, the table (table, dtable) for
 * rows > 0. */
static dt_status dt_cpu_embedding_args(const char *what, dt_dtype dtype, int64_t n, int64_t d,
                                       const int32_t *tok, int64_t rows, const void *rows_nd,
                                       const void *table) {
    DT_TRY(dt_check_float_dtype(what, dtype));
    if (n < 0 || d < 0 || rows < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu %s: negative size n %" PRId64 " d %" PRId64 " rows %" PRId64, what,
                        n, d, rows);
    if (d > 0 && ((n > 0 && (tok == NULL || rows_nd == NULL)) || (rows > 0 && table == NULL)))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: NULL buffer", what);
    return DT_SUCCESS;
}

static dt_status dt_cpu_embedding(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d,
                                  const int32_t *tok, int64_t lo, int64_t rows, const void *table,
                                  void *out) {
    (void)b;
    DT_TRY(dt_cpu_embedding_args("embedding", dtype, n, d, tok, rows, out, table));
    if (n == 0 || d == 0) return DT_SUCCESS;
    const size_t row_bytes = (size_t)d * dt_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)tok[i] - lo;
        char *o = (char *)out + (size_t)i * row_bytes;
        if (r >= 0 && r < rows) memcpy(o, (const char *)table + (size_t)r * row_bytes, row_bytes);
        else memset(o, 0, row_bytes);   /* +0 in every float dtype */
    }
    return DT_SUCCESS;
}

/* (table row, token index) pairs, ordered by row, then index. */
typedef struct dt_row_tok {
    int64_t row, i;
} dt_row_tok;

static int dt_row_tok_cmp(const void *pa, const void *pb) {
    const dt_row_tok *a = pa, *b = pb;
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* The tokens grouped by their row (a sort), so that each row is summed in
 * fp32 in token order with one row of scratch, and the rows no token hits
 * are zeroed (accumulate 0) or left as they are. */
static dt_status dt_cpu_embedding_backward(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d,
                                           const int32_t *tok, int64_t lo, int64_t rows,
                                           const void *dy, void *dtable, int accumulate) {
    (void)b;
    DT_TRY(dt_cpu_embedding_args("embedding backward", dtype, n, d, tok, rows, dy, dtable));
    if (d == 0 || rows == 0) return DT_SUCCESS;
    dt_row_tok *hit = malloc((size_t)(n > 0 ? n : 1) * sizeof *hit);
    float *acc = malloc((size_t)d * sizeof *acc);
    if (hit == NULL || acc == NULL) {
        free(hit);
        free(acc);
        return dt_error(DT_ERR_OUT_OF_MEMORY,
                        "cpu embedding backward: out of host memory (n %" PRId64 " d %" PRId64 ")",
                        n, d);
    }
    int64_t nh = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)tok[i] - lo;
        if (r >= 0 && r < rows) hit[nh++] = (dt_row_tok){r, i};
    }
    qsort(hit, (size_t)nh, sizeof *hit, dt_row_tok_cmp);
    const size_t es = dt_dtype_size(dtype);
    int64_t next = 0;   /* rows below it are done */
    for (int64_t h = 0; h <= nh; h++) {
        const int64_t r = h < nh ? hit[h].row : rows;
        if (!accumulate && r > next)
            memset((char *)dtable + (size_t)(next * d) * es, 0, (size_t)((r - next) * d) * es);
        if (h == nh) break;
        const size_t o = (size_t)(r * d);
        for (int64_t j = 0; j < d; j++)
            acc[j] = accumulate ? dt_value_get(dtable, dtype, o + (size_t)j) : 0.0f;
        for (; h < nh && hit[h].row == r; h++) {
            const size_t oi = (size_t)(hit[h].i * d);
            for (int64_t j = 0; j < d; j++) acc[j] += dt_value_get(dy, dtype, oi + (size_t)j);
        }
        h--;
        dt_values_set((char *)dtable + o * es, dtype, (size_t)d, acc);
        next = r + 1;
    }
    free(hit);
    free(acc);
    return DT_SUCCESS;
}

static dt_status dt_cpu_i32_check(dt_backend *b, int64_t n, const int32_t *x, int64_t limit,
                                  int32_t ignore, int64_t *valid, int64_t *bad) {
    (void)b;
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu i32_check: negative count %" PRId64, n);
    if (valid == NULL || bad == NULL || (n > 0 && x == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu i32_check: NULL buffer");
    int64_t nv = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] == ignore) continue;
        if (x[i] >= 0 && x[i] < limit) nv++;
        else if (first < 0) first = i;
    }
    *valid = nv;
    *bad = first;
    return DT_SUCCESS;
}

/* The sizes of the cross-entropy calls. */
static dt_status dt_cpu_ce_args(const char *what, dt_dtype dtype, int64_t rows, int64_t n,
                                int nonnull) {
    DT_TRY(dt_check_float_dtype(what, dtype));
    if (rows < 0 || n < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu %s: negative size rows %" PRId64 " n %" PRId64, what, rows, n);
    if (rows > 0 && !nonnull) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu %s: NULL buffer", what);
    return DT_SUCCESS;
}

/* ce_max's rows for fp32: dt_max_nan over the row, sixteen lanes (two
 * vectors of eight) and then the lanes; the max is exact, so only the order
 * (the sign of a zero max, which NaN comes out) differs. */
DT_VEC_INLINE void dt_ce_max_f32_loop(int64_t rows, int64_t n, const float *x, float *m) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float mx = -INFINITY;
        int64_t j = 0;
#if defined(__GNUC__)
        if (n >= 16) {
            dt_vf8 m0, m1, v0, v1;
            memcpy(&m0, xr, sizeof m0);
            memcpy(&m1, xr + 8, sizeof m1);
            for (j = 16; j + 16 <= n; j += 16) {
                memcpy(&v0, xr + j, sizeof v0);
                memcpy(&v1, xr + j + 8, sizeof v1);
                const dt_vu8 t0 = (dt_vu8)((v0 > m0) | (v0 != v0));
                const dt_vu8 t1 = (dt_vu8)((v1 > m1) | (v1 != v1));
                m0 = (dt_vf8)(((dt_vu8)v0 & t0) | ((dt_vu8)m0 & ~t0));   /* a NaN lane stays NaN */
                m1 = (dt_vf8)(((dt_vu8)v1 & t1) | ((dt_vu8)m1 & ~t1));
            }
            for (int k = 0; k < 8; k++) mx = dt_max_nan(dt_max_nan(mx, m0[k]), m1[k]);
        }
#endif
        for (; j < n; j++) mx = dt_max_nan(mx, xr[j]);
        m[r] = mx;
    }
}

DT_CPU_COPIES(dt_ce_max_f32, (int64_t rows, int64_t n, const float *x, float *m), (rows, n, x, m))

/* e^(x - m) of the eight fp32 x from x0 into *e, where every x - m (in
 * fp32) is in [-87, 0] (else 0 and *e untouched: NaN, +-inf, x > m, far
 * below m): dt_vexpq_f8 with 1 + q rounded, within (1.9 + |x - m|) u of
 * e^(x - m), the second term x - m's rounding. */
DT_VEC_INLINE int dt_ce_exp8(const float *x0, float m, dt_vf8 *e) {
    dt_vf8 v, t, q;
    memcpy(&v, x0, sizeof v);
    v -= m;
    const dt_vi8 ok = (v >= -87.0f) & (v <= 0.0f);
    if (!dt_vall8(&ok)) return 0;
    dt_vexpq_f8(&v, &t, &q);
    *e = (1.0f + q) * t;
    return 1;
}

/* ce_sum's rows for fp32: se = the sum in double of e^(x - m), each term
 * from dt_ce_exp8 where a block of eight takes it, else exp in double. With
 * m the row's max (se >= 1): within (2.9 + n/e) u se (the terms' (1.9 +
 * |x - m|) u, |x - m| e^(x - m) <= 1/e; the rounding to fp32), under
 * ce_sum's (2n + 8) u se. */
DT_VEC_INLINE void dt_ce_sum_f32_loop(int64_t rows, int64_t n, const float *x, const float *m,
                                      float *se) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n, mr = m[r];
        double s = 0.0;
        int64_t j = 0;
#if defined(__GNUC__)
        dt_vd4 acc = {0}, lo, hi;
        dt_vf8 e;
        float f[8];
        for (; j + 8 <= n; j += 8) {
            if (!dt_ce_exp8(xr + j, mr, &e)) {
                for (int64_t k = j; k < j + 8; k++) s += exp((double)xr[k] - (double)mr);
                continue;
            }
            memcpy(f, &e, sizeof f);
            dt_vload_d4(f, &lo);
            dt_vload_d4(f + 4, &hi);
            acc += lo + hi;
        }
        s += dt_vsum_d4(&acc);
#endif
        for (; j < n; j++) s += exp((double)xr[j] - (double)mr);
        se[r] = (float)s;
    }
}

DT_CPU_COPIES(dt_ce_sum_f32, (int64_t rows, int64_t n, const float *x, const float *m, float *se),
              (rows, n, x, m, se))

/* ce_grad's dx for one counted fp32 row with target column t (any value):
 * dx = e^(x - m) k, k = scale / se rounded to fp32, where dt_ce_exp8 takes
 * a block of eight and k is a normal float: within (3.9 + |x - m|) u p
 * |scale| (p = e^(x - m) / se; the exp's (1.9 + |x - m|) u, k's and the
 * product's roundings; a subnormal dx half its spacing more), under
 * ce_grad's (4 + |x - m|) u p |scale| + 2u |dx|. Elsewhere, and at the
 * target (where p - 1 may cancel), in double and rounded once. The
 * target's value is formed before dx is written (dx may be x). */
DT_VEC_INLINE void dt_ce_grad_row_f32(int64_t n, const float *x, float m, float se, int64_t t,
                                      float scale, float *dx) {
    const double md = m, sd = se;
    const int hit = t >= 0 && t < n;
    const float vt = hit ? (float)((exp((double)x[t] - md) / sd - 1.0) * scale) : 0.0f;
    int64_t j = 0;
#if defined(__GNUC__)
    const float k = (float)((double)scale / sd);
    dt_vf8 e;
    for (; isnormal(k) && j + 8 <= n; j += 8) {
        if (dt_ce_exp8(x + j, m, &e)) {
            e *= k;
            memcpy(dx + j, &e, sizeof e);
            continue;
        }
        for (int64_t i = j; i < j + 8; i++) dx[i] = (float)(exp((double)x[i] - md) / sd * scale);
    }
#endif
    for (; j < n; j++) dx[j] = (float)(exp((double)x[j] - md) / sd * scale);
    if (hit) dx[t] = vt;
}

DT_VEC_INLINE void dt_ce_grad_f32_loop(int64_t rows, int64_t n, const float *x, const float *m,
                                       const float *se, const int32_t *tgt, int64_t lo,
                                       int32_t ignore, float scale, float *dx) {
    for (int64_t r = 0; r < rows; r++) {
        if (tgt[r] == ignore) memset(dx + r * n, 0, (size_t)n * sizeof *dx);
        else dt_ce_grad_row_f32(n, x + r * n, m[r], se[r], (int64_t)tgt[r] - lo, scale, dx + r * n);
    }
}

DT_CPU_COPIES(dt_ce_grad_f32,
              (int64_t rows, int64_t n, const float *x, const float *m, const float *se,
               const int32_t *tgt, int64_t lo, int32_t ignore, float scale, float *dx),
              (rows, n, x, m, se, tgt, lo, ignore, scale, dx))

static dt_status dt_cpu_ce_max(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                               const void *x, float *m) {
    (void)b;
    DT_TRY(dt_cpu_ce_args("ce_max", dtype, rows, n, m != NULL && (n == 0 || x != NULL)));
    if (dtype == DT_F32 && n > 0) {
        DT_CPU_RUN(dt_ce_max_f32, (rows, n, x, m));
        return DT_SUCCESS;
    }
    for (int64_t r = 0; r < rows; r++) {
        float v = -INFINITY;
        for (int64_t j = 0; j < n; j++) v = dt_max_nan(v, dt_value_get(x, dtype, (size_t)(r * n + j)));
        m[r] = v;
    }
    return DT_SUCCESS;
}

static dt_status dt_cpu_ce_sum(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                               const void *x, const float *m, const int32_t *tgt, int64_t lo,
                               float *se, float *tl) {
    (void)b;
    DT_TRY(dt_cpu_ce_args("ce_sum", dtype, rows, n,
                          m && tgt && se && tl && (n == 0 || x != NULL)));
    const int f32 = dtype == DT_F32 && n > 0;
    if (f32) DT_CPU_RUN(dt_ce_sum_f32, (rows, n, x, m, se));
    for (int64_t r = 0; r < rows; r++) {
        if (!f32) {
            double s = 0.0;
            for (int64_t j = 0; j < n; j++)
                s += exp((double)dt_value_get(x, dtype, (size_t)(r * n + j)) - (double)m[r]);
            se[r] = (float)s;
        }
        const int64_t t = (int64_t)tgt[r] - lo;
        tl[r] = t >= 0 && t < n ? dt_value_get(x, dtype, (size_t)(r * n + t)) : 0.0f;
    }
    return DT_SUCCESS;
}

static dt_status dt_cpu_ce_grad(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                                const void *x, const float *m, const float *se, const float *tl,
                                const int32_t *tgt, int64_t lo, int32_t ignore, float scale,
                                void *dx, float *loss) {
    (void)b;
    DT_TRY(dt_cpu_ce_args("ce_grad", dtype, rows, n,
                          m && se && tl && tgt && loss && (n == 0 || dx == NULL || x != NULL)));
    if (dtype == DT_F32 && dx && n > 0) {
        DT_CPU_RUN(dt_ce_grad_f32, (rows, n, x, m, se, tgt, lo, ignore, scale, dx));
        dx = NULL;   /* the losses below */
    }
    for (int64_t r = 0; r < rows; r++) {
        const size_t o = (size_t)(r * n);
        if (tgt[r] == ignore) {
            for (int64_t j = 0; dx && j < n; j++) dt_value_set(dx, dtype, o + (size_t)j, 0.0f);
            loss[r] = 0.0f;
            continue;
        }
        const int64_t t = (int64_t)tgt[r] - lo;
        for (int64_t j = 0; dx && j < n; j++) {
            const double p =
                exp((double)dt_value_get(x, dtype, o + (size_t)j) - (double)m[r]) / (double)se[r];
            dt_value_set(dx, dtype, o + (size_t)j, (float)((p - (j == t ? 1.0 : 0.0)) * scale));
        }
        loss[r] = (float)((double)m[r] + log((double)se[r]) - (double)tl[r]);
    }
    return DT_SUCCESS;
}

static dt_status dt_cpu_absmax(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                               float *out) {
    (void)b;
    DT_TRY(dt_check_float_dtype("absmax", dtype));
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu absmax: negative count %" PRId64, n);
    if (out == NULL || (n > 0 && x == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu absmax: NULL buffer");
    float v = 0.0f;
    for (size_t i = 0; i < (size_t)n; i++) v = dt_max_nan(v, fabsf(dt_value_get(x, dtype, i)));
    *out = v;
    return DT_SUCCESS;
}

static dt_status dt_cpu_sumsq(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                              double *out) {
    (void)b;
    DT_TRY(dt_check_float_dtype("sumsq", dtype));
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu sumsq: negative count %" PRId64, n);
    if (out == NULL || (n > 0 && x == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu sumsq: NULL buffer");
    double s = 0.0;
    if (dtype == DT_F32) {   /* four sums in double, lane by lane, then added */
        const float *f = x;
        double a[4] = {0.0, 0.0, 0.0, 0.0};
        size_t i = 0;
        for (; i + 4 <= (size_t)n; i += 4)
            for (int k = 0; k < 4; k++) a[k] += (double)f[i + k] * (double)f[i + k];
        for (; i < (size_t)n; i++) a[0] += (double)f[i] * (double)f[i];
        s = (a[0] + a[1]) + (a[2] + a[3]);
    } else {
        for (size_t i = 0; i < (size_t)n; i++) {
            const double v = dt_value_get(x, dtype, i);
            s += v * v;
        }
    }
    *out = s;
    return DT_SUCCESS;
}

static dt_status dt_cpu_convert(dt_backend *b, int64_t n, dt_dtype src_dtype, const void *src,
                                dt_dtype dst_dtype, void *dst) {
    (void)b;
    if (!dt_dtype_valid(src_dtype) || !dt_dtype_valid(dst_dtype) ||
        (src_dtype != dst_dtype && (!dt_dtype_is_float(src_dtype) || !dt_dtype_is_float(dst_dtype))))
        return dt_error(DT_ERR_NOT_SUPPORTED,
                        "cpu convert: %s to %s is not supported (float dtypes, or equal ones)",
                        dt_dtype_name(src_dtype), dt_dtype_name(dst_dtype));
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu convert: negative count %" PRId64, n);
    if (n > 0 && (src == NULL || dst == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu convert: NULL buffer");
    if (src_dtype == dst_dtype) {
        if (n > 0) memmove(dst, src, (size_t)n * dt_dtype_size(src_dtype));
        return DT_SUCCESS;
    }
    /* through fp32 in blocks: bf16 and fp16 are exact in fp32, so each
     * value is rounded once, to the destination */
    float buf[256];
    const size_t ss = dt_dtype_size(src_dtype), ds = dt_dtype_size(dst_dtype);
    for (size_t i = 0; i < (size_t)n; i += 256) {
        const size_t k = (size_t)n - i < 256 ? (size_t)n - i : 256;
        dt_values_get((const char *)src + i * ss, src_dtype, k, buf);
        dt_values_set((char *)dst + i * ds, dst_dtype, k, buf);
    }
    return DT_SUCCESS;
}

/* The step's constants, formed in double on the host and rounded to fp32
 * (as PyTorch passes its Python floats to the fp32 kernels); backend_cuda_ops.cu
 * forms the same ones. The per-element arithmetic is a fixed sequence of
 * fp32 operations, each rounded (no fused multiply-add). */
static dt_status dt_cpu_adamw(dt_backend *b, dt_dtype dtype, int64_t n, void *param, float *master,
                              float *m, float *v, const void *grad, float gscale, float lr,
                              float b1, float b2, float eps, float wd, int64_t step) {
    (void)b;
    DT_TRY(dt_check_float_dtype("adamw", dtype));
    if (n < 0) return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu adamw: negative count %" PRId64, n);
    if (!isfinite(lr) || !(b1 >= 0.0f && b1 < 1.0f) || !(b2 >= 0.0f && b2 < 1.0f) ||
        !(eps >= 0.0f && isfinite(eps)) || !(wd >= 0.0f && isfinite(wd)) || step < 1)
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "cpu adamw: lr %g, betas %g %g, eps %g, weight decay %g, step %" PRId64
                        " (lr finite, betas in [0, 1), eps and weight decay finite and >= 0, "
                        "step >= 1)", (double)lr, (double)b1, (double)b2, (double)eps, (double)wd,
                        step);
    if (n > 0 && (param == NULL || master == NULL || m == NULL || v == NULL || grad == NULL))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "cpu adamw: NULL buffer");
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    const float omb1 = (float)(1.0 - (double)b1), omb2 = (float)(1.0 - (double)b2);
    const float step_size = (float)((double)lr / (1.0 - pow((double)b1, (double)step)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow((double)b2, (double)step));
    if (dtype == DT_F32) {   /* the same operations, four lanes at a time */
        dt_adamw_f32((size_t)n, param, master, m, v, grad, gscale, b1, omb1, b2, omb2, bc2_sqrt,
                     eps, decay, step_size);
        return DT_SUCCESS;
    }
    for (size_t i = 0; i < (size_t)n; i++) {
        const float g = dt_value_get(grad, dtype, i) * gscale;
        const float mi = m[i] * b1 + omb1 * g;
        const float vi = v[i] * b2 + omb2 * (g * g);
        const float den = sqrtf(vi) / bc2_sqrt + eps;
        const float p = master[i] * decay - step_size * (mi / den);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        dt_value_set(param, dtype, i, p);
    }
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
    .gemm_ex = dt_cpu_gemm_ex,
    .gelu_backward = dt_cpu_gelu_backward,
    .swiglu = dt_cpu_swiglu,
    .swiglu_backward = dt_cpu_swiglu_backward,
    .rmsnorm_backward = dt_cpu_rmsnorm_backward,
    .rotary_inverse = dt_cpu_rotary_inverse,
    .embedding = dt_cpu_embedding,
    .embedding_backward = dt_cpu_embedding_backward,
    .i32_check = dt_cpu_i32_check,
    .ce_max = dt_cpu_ce_max,
    .ce_sum = dt_cpu_ce_sum,
    .ce_grad = dt_cpu_ce_grad,
    .absmax = dt_cpu_absmax,
    .sumsq = dt_cpu_sumsq,
    .convert = dt_cpu_convert,
    .adamw = dt_cpu_adamw,
    .memory = dt_cpu_memory,
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
