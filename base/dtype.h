/* base/dtype.h — element types. fp32 is the reference; bf16 and fp16 are
 * stored as 16 bits and computed in fp32 on every backend (conversions round
 * to nearest even). u8 is raw bytes for transfers and workspaces: no op or
 * primitive takes it (DT_ERR_NOT_SUPPORTED).
 * Test: tests/test_context.c (every fp16 value, fp32 -> fp16 rounding).
 */
#ifndef DT_DTYPE_H
#define DT_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_dtype {
    DT_F32 = 0,
    DT_BF16,
    DT_F16,
    DT_U8,
    DT_I32,      /* token ids and other integers: moved and indexed, never computed on */
    DT_DTYPE_COUNT
} dt_dtype;

/* Size of one element in bytes; 0 for an unknown dtype. */
size_t dt_dtype_size(dt_dtype dtype);
/* "fp32", "bf16", "fp16", "u8", "i32"; "unknown" otherwise. */
const char *dt_dtype_name(dt_dtype dtype);
/* 1 if dtype is a known value. */
int dt_dtype_valid(dt_dtype dtype);
/* 1 for the floating types (fp32, bf16, fp16): the ones reductions take. */
static inline int dt_dtype_is_float(dt_dtype dtype) {
    return dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16;
}

typedef uint16_t dt_bf16;

static inline float dt_bf16_to_f32(dt_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline dt_bf16 dt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return (dt_bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (dt_bf16)(u >> 16);
}

typedef uint16_t dt_f16;

/* Exact and branch-free (loops of it vectorize), with no subnormal fp32
 * operand (exact under denormals-are-zero): a zero or subnormal h with
 * mantissa m is 2^-14 (1 + m/1024) - 2^-14 = m 2^-24. */
static inline float dt_f16_to_f32(dt_f16 h) {
    const uint32_t em = (uint32_t)(h & 0x7fffu) << 13, e = em & 0x0f800000u;
    const uint32_t special = 0u - (uint32_t)(e == 0x0f800000u), low = 0u - (uint32_t)(e == 0);
    const uint32_t normal = em + (112u << 23) + (special & (112u << 23));
    uint32_t u = em + (113u << 23);
    float f;
    memcpy(&f, &u, sizeof f);
    f -= 6.103515625e-05f;   /* 2^-14 */
    memcpy(&u, &f, sizeof u);
    u = (normal & ~low) | (u & low) | (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; beyond 65504 (from 65520 up) to inf; NaN stays
 * NaN (quiet). */
static inline dt_f16 dt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (dt_f16)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (dt_f16)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                             /* normal: 2^-14 and up */
        uint32_t r = a - 0x38000000u;                   /* rebias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (dt_f16)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return (dt_f16)sign;           /* below 2^-25: zero */
    /* Subnormal: k * 2^-24 with k = mantissa >> shift, rounded; k = 1024 is
     * the smallest normal, whose bits are the same. */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23);
    uint32_t k = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u))) k++;
    return (dt_f16)(sign | k);
}

/* Element i of a host array of fp32, bf16 or fp16 as fp32 (u8: its value). */
static inline float dt_value_get(const void *p, dt_dtype dtype, size_t i) {
    switch (dtype) {
    case DT_F32: return ((const float *)p)[i];
    case DT_BF16: return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
    case DT_F16: return dt_f16_to_f32(((const dt_f16 *)p)[i]);
    default: return (float)((const uint8_t *)p)[i];
    }
}

/* Store v, rounded to dtype, as element i (u8: truncated). */
static inline void dt_value_set(void *p, dt_dtype dtype, size_t i, float v) {
    switch (dtype) {
    case DT_F32: ((float *)p)[i] = v; break;
    case DT_BF16: ((dt_bf16 *)p)[i] = dt_f32_to_bf16(v); break;
    case DT_F16: ((dt_f16 *)p)[i] = dt_f32_to_f16(v); break;
    default: ((uint8_t *)p)[i] = (uint8_t)(int)v; break;
    }
}

/* n elements of a host array of fp32, bf16 or fp16 (u8: their values) to
 * fp32 at dst, and n fp32 values at src rounded to dtype (nearest even; u8:
 * truncated) into dst. The arrays must not overlap. */
void dt_values_get(const void *p, dt_dtype dtype, size_t n, float *dst);
void dt_values_set(void *p, dt_dtype dtype, size_t n, const float *src);

/* What storing v in dtype keeps. */
static inline float dt_value_round(float v, dt_dtype dtype) {
    switch (dtype) {
    case DT_BF16: return dt_bf16_to_f32(dt_f32_to_bf16(v));
    case DT_F16: return dt_f16_to_f32(dt_f32_to_f16(v));
    default: return v;
    }
}

#ifdef __cplusplus
}
#endif
#endif /* DT_DTYPE_H */
