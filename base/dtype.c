/* base/dtype.c — element type sizes and names, array conversions. */
#include "dtype.h"

size_t dt_dtype_size(dt_dtype dtype) {
    switch (dtype) {
    case DT_F32: return 4;
    case DT_BF16: return 2;
    case DT_F16: return 2;
    case DT_U8: return 1;
    case DT_I32: return 4;
    default: return 0;
    }
}

const char *dt_dtype_name(dt_dtype dtype) {
    switch (dtype) {
    case DT_F32: return "fp32";
    case DT_BF16: return "bf16";
    case DT_F16: return "fp16";
    case DT_U8: return "u8";
    case DT_I32: return "i32";
    default: return "unknown";
    }
}

int dt_dtype_valid(dt_dtype dtype) { return (int)dtype >= 0 && dtype < DT_DTYPE_COUNT; }

/* Widening loops in runs of a fixed length, which GCC vectorizes at -O2
 * (its cheap cost model takes loops of a known trip count), then the rest. */
#define WIDEN_N(name, type, widen)                                                      \
    static void name(const type *restrict src, size_t n, float *restrict dst) {        \
        size_t i = 0;                                                                   \
        for (; i + 8 <= n; i += 8)                                                      \
            for (size_t j = 0; j < 8; j++) dst[i + j] = widen(src[i + j]);              \
        for (; i < n; i++) dst[i] = widen(src[i]);                                      \
    }
WIDEN_N(bf16_to_f32_n, dt_bf16, dt_bf16_to_f32)
WIDEN_N(f16_to_f32_n, dt_f16, dt_f16_to_f32)
#undef WIDEN_N

/* The dtype is looked at once per array, not once per element. */
void dt_values_get(const void *p, dt_dtype dtype, size_t n, float *dst) {
    if (n == 0) return;
    switch (dtype) {
    case DT_F32: memcpy(dst, p, n * sizeof *dst); break;
    case DT_BF16: bf16_to_f32_n(p, n, dst); break;
    case DT_F16: f16_to_f32_n(p, n, dst); break;
    default:
        for (size_t i = 0; i < n; i++) dst[i] = dt_value_get(p, dtype, i);
        break;
    }
}

void dt_values_set(void *p, dt_dtype dtype, size_t n, const float *src) {
    if (n == 0) return;
    switch (dtype) {
    case DT_F32: memcpy(p, src, n * sizeof *src); break;
    case DT_BF16:
        for (size_t i = 0; i < n; i++) ((dt_bf16 *)p)[i] = dt_f32_to_bf16(src[i]);
        break;
    case DT_F16:
        for (size_t i = 0; i < n; i++) ((dt_f16 *)p)[i] = dt_f32_to_f16(src[i]);
        break;
    default:
        for (size_t i = 0; i < n; i++) dt_value_set(p, dtype, i, src[i]);
        break;
    }
}
