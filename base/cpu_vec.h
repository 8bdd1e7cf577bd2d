/* base/cpu_vec.h — PRIVATE. Vector math for the CPU kernels: four or eight
 * floats at a time with GCC/Clang vector extensions (SSE2, AVX, NEON), so
 * that exp and reductions stay in registers with no libm call per element;
 * other compilers get the same functions element by element through libm.
 *
 *   dt_vexpf(a)             e^a for a in [-87, 88] (callers clamp): Cody-Waite
 *                           to 2^n e^r, |r| <= ln(2)/2, Taylor to r^7; within
 *                           1.22 ulp of e^a over the range
 *   dt_row_max(x, n)        max of x[0..n) (-inf for n = 0; NaN if any is NaN)
 *   dt_nonfinite_nan(x, n)  x[j] = NaN where x[j] is +-inf or NaN (x + 0x)
 *   dt_exp_shift(x, n, s)   x[j] = e^min(x[j] - s, 0) in place (below -87
 *                           gives 0, NaN stays NaN); returns the sum. s is
 *                           the row's max or its log-sum-exp, so the exponent
 *                           is <= 0 but for rounding: a logit recomputed in
 *                           another order must not overflow
 *   dt_vexpq_f8(x, t, q)    e^x = t (1 + q) for eight x in [-87, 87]: t =
 *                           2^n, q = e^r - 1 (Cody-Waite, |r| < 0.3466,
 *                           Taylor to r^8); t (1 + q) unrounded is within
 *                           0.9u e^x, u = 2^-24 (1.9u once 1 + q is rounded)
 *   dt_vsilu_ok_f8(g)       1 if dt_vsilu_f8 takes all eight: g = +-0 or
 *                           2^-125 <= |g| <= 87 (so no NaN, no inf)
 *   dt_vsilu_f8(g, silu, dsilu)  silu(g) = g s(g) and silu'(g) = s(g) (1 +
 *                           g s(-g)), s the logistic, of eight floats, in
 *                           fp32: silu = g / d, d = 1 + e^-g, within 3.32u
 *                           |silu|; silu' = (1 + g (E / d1)) / d1, E = e^-g,
 *                           d1 = 1 + E, within 7.9u s(g) (1 + |g| s(-g))
 *                           (cancellation not credited); GCC/Clang only
 *   dt_vd4, dt_vload_d4, dt_vsum_d4  four doubles: four floats widened
 *                           (exact); the lanes summed (v0 + v1) + (v2 + v3)
 *   dt_vswap_pairs_f8(v, out)  (v1, v0, v3, v2, ...): interleaved pairs
 *   DT_VEC_AVX2, dt_cpu_avx2()  a function compiled for AVX2 as well (x86),
 *                           and whether this CPU may run it; DT_VEC_INLINE
 *                           inlines a loop into each such copy (elsewhere
 *                           plain static inline)
 *
 * Users: dtensor/backend_cpu.c (GELU, SwiGLU, RMSNorm, rotary,
 * cross-entropy), attention/block_cpu.c
 * (softmax); tested through them.
 */
#ifndef DT_CPU_VEC_H
#define DT_CPU_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The larger of a and b; NaN if either is NaN. */
static inline float dt_max_nan(float a, float b) { return a > b || a != a ? a : b; }

/* dt_adamw_f32's elements i0..n-1, one at a time (the reference the
 * vector lanes follow, operation for operation). */
static inline void dt_adamw_f32_from(size_t i0, size_t n, float *param, float *master, float *m,
                                     float *v, const float *grad, float gscale, float b1,
                                     float omb1, float b2, float omb2, float bc2s, float eps,
                                     float decay, float step) {
    for (size_t i = i0; i < n; i++) {
        const float g = grad[i] * gscale;
        const float mi = m[i] * b1 + omb1 * g;
        const float vi = v[i] * b2 + omb2 * (g * g);
        const float w = master[i] * decay - step * (mi / (sqrtf(vi) / bc2s + eps));
        m[i] = mi;
        v[i] = vi;
        master[i] = w;
        param[i] = w;
    }
}

#if defined(__GNUC__)
typedef float dt_vf __attribute__((vector_size(16)));
typedef int32_t dt_vi __attribute__((vector_size(16)));   /* comparison masks */
typedef uint32_t dt_vu __attribute__((vector_size(16)));  /* bit patterns */
#define DT_VW 4

/* m ? a : b, lane by lane (m all ones or zero). */
static inline dt_vf dt_vsel(dt_vi m, dt_vf a, dt_vf b) {
    return (dt_vf)(((dt_vu)a & (dt_vu)m) | ((dt_vu)b & ~(dt_vu)m));
}

static inline dt_vf dt_vmask(dt_vi m, dt_vf a) { return (dt_vf)((dt_vu)a & (dt_vu)m); }

static inline dt_vf dt_vsplat(float v) { return (dt_vf){v, v, v, v}; }

/* e^a for a in [-87, 88] (callers clamp): 2^n stays a normal float. */
static inline dt_vf dt_vexpf(dt_vf a) {
    const dt_vf shift = dt_vsplat(12582912.0f);   /* 1.5 * 2^23 */
    dt_vf kd = a * 1.44269502f + shift; /* n = round(a / ln 2) in the low mantissa bits */
    const dt_vu ki = (dt_vu)kd;
    kd -= shift;
    const dt_vf r = (a - kd * 0.693145751953125f) - kd * 1.42860677e-06f; /* ln 2 = hi + lo */
    dt_vf p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * (dt_vf)((ki + 127u) << 23); /* 2^n: n + 127 in the exponent field */
}

/* e^a, 0 below -87 (-inf included), NaN for NaN; a <= 88. */
static inline dt_vf dt_vexp_or_zero(dt_vf a) {
    const dt_vi dead = a < -87.0f;
    return dt_vmask(~dead, dt_vexpf(dt_vsel(dead, dt_vsplat(0.0f), a)));
}

/* min(a, 0) in each lane; a NaN lane stays NaN. */
static inline dt_vf dt_vmin0(dt_vf a) { return dt_vsel(a > 0.0f, dt_vsplat(0.0f), a); }

static inline float dt_row_max(const float *x, int64_t n) {
    dt_vf m = dt_vsplat(-INFINITY), v;
    int64_t j = 0;
    for (; j + DT_VW <= n; j += DT_VW) {
        memcpy(&v, x + j, sizeof v);
        m = dt_vsel((v > m) | (v != v), v, m);   /* a NaN lane stays NaN */
    }
    float mx = dt_max_nan(dt_max_nan(m[0], m[1]), dt_max_nan(m[2], m[3]));
    for (; j < n; j++) mx = dt_max_nan(x[j], mx);
    return mx;
}

static inline void dt_nonfinite_nan(float *x, int64_t n) {
    dt_vf v;
    int64_t j = 0;
    for (; j + DT_VW <= n; j += DT_VW) {
        memcpy(&v, x + j, sizeof v);
        v += 0.0f * v;
        memcpy(x + j, &v, sizeof v);
    }
    for (; j < n; j++) x[j] += 0.0f * x[j];
}

static inline float dt_exp_shift(float *x, int64_t n, float s) {
    dt_vf acc = dt_vsplat(0.0f), v;
    int64_t j = 0;
    for (; j + DT_VW <= n; j += DT_VW) {
        memcpy(&v, x + j, sizeof v);
        v = dt_vexp_or_zero(dt_vmin0(v - s));
        memcpy(x + j, &v, sizeof v);
        acc += v;
    }
    if (j < n) {   /* the tail, padded with -inf (0 after the exp) */
        float t[DT_VW] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        memcpy(t, x + j, (size_t)(n - j) * sizeof *t);
        memcpy(&v, t, sizeof v);
        v = dt_vexp_or_zero(dt_vmin0(v - s));
        memcpy(t, &v, sizeof v);
        memcpy(x + j, t, (size_t)(n - j) * sizeof *t);
        acc += v;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

#define DT_VEC_INLINE static inline __attribute__((always_inline))

/* Eight floats: one AVX register, or two SSE2 ones (GCC and Clang split the
 * operations). Passed by pointer: by value the ABI would differ with AVX.
 * dt_vi8 holds comparison masks, dt_vu8 bit patterns. */
typedef float dt_vf8 __attribute__((vector_size(32)));
typedef int32_t dt_vi8 __attribute__((vector_size(32)));
typedef uint32_t dt_vu8 __attribute__((vector_size(32)));

/* 1 if every lane of *m is set. */
DT_VEC_INLINE int dt_vall8(const dt_vi8 *m) {
    uint64_t w[4];
    memcpy(w, m, sizeof w);
    return (w[0] & w[1] & w[2] & w[3]) == ~(uint64_t)0;
}

/* Four doubles (two SSE2 registers, or one AVX one), passed by pointer as
 * dt_vf8 is. */
typedef double dt_vd4 __attribute__((vector_size(32)));

/* p[0..4) widened to double (exact). */
DT_VEC_INLINE void dt_vload_d4(const float *p, dt_vd4 *out) {
    *out = (dt_vd4){p[0], p[1], p[2], p[3]};   /* one cvtps2pd with AVX (GCC 12) */
}

/* (v0 + v1) + (v2 + v3). */
DT_VEC_INLINE double dt_vsum_d4(const dt_vd4 *v) {
    return ((*v)[0] + (*v)[1]) + ((*v)[2] + (*v)[3]);
}

/* The lanes of *v swapped in pairs: (v1, v0, v3, v2, ...). */
DT_VEC_INLINE void dt_vswap_pairs_f8(const dt_vf8 *v, dt_vf8 *out) {
#if defined(__clang__)
    *out = __builtin_shufflevector(*v, *v, 1, 0, 3, 2, 5, 4, 7, 6);
#else
    *out = __builtin_shuffle(*v, (dt_vi8){1, 0, 3, 2, 5, 4, 7, 6});
#endif
}

/* e^x = t (1 + q) for x in [-87, 87]: t = 2^n, a normal float, and q = e^r - 1
 * (|q| < 0.4145) for x = n ln 2 + r, |r| < 0.3466 (Cody-Waite: ln 2 = hi +
 * lo, n hi and r0 = x - n hi exact), q = r0 + (h - n lo), h = r^2 P(r) with
 * r = r0 - n lo rounded and P Taylor's 1/2 + r/6 + ... + r^6/8!. t (1 + q),
 * unrounded, is within 0.9u e^x (u = 2^-24): at r = -0.3466, where 1 + q =
 * 0.707 is least, q's rounding 0.293u, h's and h - n lo's 0.24u, r's through
 * h 0.10u. The sum 1 + q is left to the caller: rounded, it is the exp's
 * largest error (u). */
DT_VEC_INLINE void dt_vexpq_f8(const dt_vf8 *x, dt_vf8 *t, dt_vf8 *q) {
    const dt_vf8 a = *x;
    dt_vf8 kd = a * 1.44269502f + 12582912.0f;   /* n in the low mantissa bits (1.5 * 2^23) */
    const dt_vu8 ki = (dt_vu8)kd;
    kd -= 12582912.0f;
    const dt_vf8 r0 = a - kd * 0.693145751953125f, c = kd * 1.42860677e-06f, r = r0 - c;
    dt_vf8 p = r * (1.0f / 40320.0f) + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    *q = r0 + ((r * r) * p - c);
    *t = (dt_vf8)((ki + 127u) << 23);   /* n + 127 in the exponent field */
}

/* 1 if dt_vsilu_f8 takes every lane of g: g = +-0 or 2^-125 <= |g| <= 87
 * (NaN and +-inf not): e^-g and silu stay normal floats. */
DT_VEC_INLINE int dt_vsilu_ok_f8(const dt_vf8 *g) {
    const dt_vf8 a = (dt_vf8)((dt_vu8)*g & 0x7fffffffu);
    const dt_vi8 ok = (a <= 87.0f) & ((a >= 0x1p-125f) | (a == 0.0f));
    return dt_vall8(&ok);
}

/* silu(g) = g / d and silu'(g) = (1 + g (E / d1)) / d1 in fp32, for g that
 * dt_vsilu_ok_f8 takes (see the header for the bounds): E = e^-g = t (1 +
 * q) (dt_vexpq_f8) with 1 + q rounded, d1 = 1 + E rounded, and d = 1 + t +
 * t q rounded once where 1 + t is exact (|n| <= 23, t q exact), otherwise
 * with the part of 1 + t that its rounding loses (Fast2Sum) added to t q
 * first: d within (1.42 + 0.9)u, silu = g / d one rounding more. */
DT_VEC_INLINE void dt_vsilu_f8(const dt_vf8 *g, dt_vf8 *silu, dt_vf8 *dsilu) {
    const dt_vf8 v = *g, x = -v;
    dt_vf8 t, q;
    dt_vexpq_f8(&x, &t, &q);
    const dt_vu8 big = (dt_vu8)(t > 1.0f), one = (dt_vu8)(dt_vf8){1, 1, 1, 1, 1, 1, 1, 1};
    const dt_vf8 hi = (dt_vf8)(((dt_vu8)t & big) | (one & ~big));   /* max(t, 1) */
    const dt_vf8 lo = (dt_vf8)(((dt_vu8)t & ~big) | (one & big));   /* min(t, 1) */
    const dt_vf8 s = hi + lo, err = lo - (s - hi);   /* s + err = 1 + t */
    *silu = v / (s + (t * q + err));
    const dt_vf8 e = (1.0f + q) * t, d1 = 1.0f + e;
    *dsilu = (1.0f + v * (e / d1)) / d1;
}

/* sqrt of each lane (IEEE, as sqrtf). */
#if defined(__SSE__)
#include <xmmintrin.h>
static inline dt_vf dt_vsqrt(dt_vf a) { return (dt_vf)_mm_sqrt_ps((__m128)a); }
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
static inline dt_vf dt_vsqrt(dt_vf a) { return (dt_vf)vsqrtq_f32((float32x4_t)a); }
#else
static inline dt_vf dt_vsqrt(dt_vf a) {
    return (dt_vf){sqrtf(a[0]), sqrtf(a[1]), sqrtf(a[2]), sqrtf(a[3])};
}
#endif

/* One AdamW step over n fp32 values (backend.h's adamw: g = grad gscale;
 * m = b1 m + omb1 g; v = b2 v + omb2 g^2; w = w decay - step (m / (sqrt(v) /
 * bc2s + eps)); param = w), four lanes at a time, each lane's operations
 * those of the scalar tail. param may be master. */
static inline void dt_adamw_f32(size_t n, float *param, float *master, float *m, float *v,
                                const float *grad, float gscale, float b1, float omb1, float b2,
                                float omb2, float bc2s, float eps, float decay, float step) {
    size_t i = 0;
    for (; i + DT_VW <= n; i += DT_VW) {
        dt_vf g, mv, vv, w;
        memcpy(&g, grad + i, sizeof g);
        memcpy(&mv, m + i, sizeof mv);
        memcpy(&vv, v + i, sizeof vv);
        memcpy(&w, master + i, sizeof w);
        g = g * gscale;
        mv = mv * b1 + omb1 * g;
        vv = vv * b2 + omb2 * (g * g);
        const dt_vf den = dt_vsqrt(vv) / bc2s + eps;
        w = w * decay - step * (mv / den);
        memcpy(m + i, &mv, sizeof mv);
        memcpy(v + i, &vv, sizeof vv);
        memcpy(master + i, &w, sizeof w);
        memcpy(param + i, &w, sizeof w);
    }
    dt_adamw_f32_from(i, n, param, master, m, v, grad, gscale, b1, omb1, b2, omb2, bc2s, eps,
                      decay, step);
}

/* DT_VEC_AVX2 marks a function to be compiled for AVX2 as well: where it
 * is defined, dt_cpu_avx2() says whether this CPU has it (a function
 * with the attribute may only run when it does). */
#if defined(__x86_64__) || defined(__i386__)
#define DT_VEC_AVX2 __attribute__((target("avx2")))
static inline int dt_cpu_avx2(void) { return __builtin_cpu_supports("avx2"); }
#endif
#else
#define DT_VEC_INLINE static inline

static inline void dt_adamw_f32(size_t n, float *param, float *master, float *m, float *v,
                                const float *grad, float gscale, float b1, float omb1, float b2,
                                float omb2, float bc2s, float eps, float decay, float step) {
    dt_adamw_f32_from(0, n, param, master, m, v, grad, gscale, b1, omb1, b2, omb2, bc2s, eps,
                      decay, step);
}

static inline float dt_row_max(const float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) mx = dt_max_nan(x[j], mx);
    return mx;
}

static inline void dt_nonfinite_nan(float *x, int64_t n) {
    for (int64_t j = 0; j < n; j++) x[j] += 0.0f * x[j];
}

static inline float dt_exp_shift(float *x, int64_t n, float s) {
    float total = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float a = x[j] - s > 0.0f ? 0.0f : x[j] - s;   /* NaN stays NaN */
        x[j] = a < -87.0f ? 0.0f : expf(a);
        total += x[j];
    }
    return total;
}

#endif

#endif /* DT_CPU_VEC_H */
