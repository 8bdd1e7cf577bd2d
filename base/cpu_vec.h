/* base/cpu_vec.h — PRIVATE. fp32 vector math for the CPU kernels.
 *
 * Four floats at a time with GCC/Clang vector extensions (SSE2 on x86-64,
 * NEON on arm64), so that a kernel's exp and reductions stay in vector
 * registers with no libm call per element; other compilers get the same
 * functions written element by element through libm.
 *
 *   dt_vexpf(a)          e^a for a in [-87, 88] (callers clamp): Cody-Waite
 *                        reduction to 2^n e^r, |r| <= ln(2)/2, Taylor to r^7;
 *                        at most 1.22 ulp from e^a in double over every fp32
 *                        a of the range (checked once, 2026-11-23; the tests
 *                        check it through GELU and the attention kernels)
 *   dt_row_max(x, n)     the largest of x[0..n) (-inf for n = 0; x holds no NaN)
 *   dt_exp_shift(x, n, s)
 *                        x[j] = e^(x[j] - s) in place, for x[j] - s <= 88
 *                        (-inf gives 0, and so does anything below -87,
 *                        where e^ is under 2^-125; NaN stays NaN); returns
 *                        the sum of the results (added in four lanes, then
 *                        across them)
 *
 * Users: backend_cpu.c (GELU), attention/block_cpu.c (softmax).
 */
#ifndef DT_CPU_VEC_H
#define DT_CPU_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

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

static inline float dt_row_max(const float *x, int64_t n) {
    dt_vf m = dt_vsplat(-INFINITY), v;
    int64_t j = 0;
    for (; j + DT_VW <= n; j += DT_VW) {
        memcpy(&v, x + j, sizeof v);
        m = dt_vsel(v > m, v, m);
    }
    float mx = m[0] > m[1] ? m[0] : m[1];
    const float m23 = m[2] > m[3] ? m[2] : m[3];
    mx = mx > m23 ? mx : m23;
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static inline float dt_exp_shift(float *x, int64_t n, float s) {
    dt_vf acc = dt_vsplat(0.0f), v;
    int64_t j = 0;
    for (; j + DT_VW <= n; j += DT_VW) {
        memcpy(&v, x + j, sizeof v);
        v = dt_vexp_or_zero(v - s);
        memcpy(x + j, &v, sizeof v);
        acc += v;
    }
    if (j < n) {   /* the tail, padded with -inf (0 after the exp) */
        float t[DT_VW] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        memcpy(t, x + j, (size_t)(n - j) * sizeof *t);
        memcpy(&v, t, sizeof v);
        v = dt_vexp_or_zero(v - s);
        memcpy(t, &v, sizeof v);
        memcpy(x + j, t, (size_t)(n - j) * sizeof *t);
        acc += v;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}
#else
static inline float dt_row_max(const float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static inline float dt_exp_shift(float *x, int64_t n, float s) {
    float total = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float a = x[j] - s;
        x[j] = a < -87.0f ? 0.0f : expf(a);
        total += x[j];
    }
    return total;
}
#endif

#endif /* DT_CPU_VEC_H */
