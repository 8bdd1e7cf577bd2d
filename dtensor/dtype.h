/* dtensor/dtype.h — element types.
 *
 * fp32 is the reference type. bf16 is stored as 16 bits and computed in fp32
 * (convert with dt_bf16_to_f32 / dt_f32_to_bf16, round-to-nearest-even).
 * fp16 is reserved for the CUDA backend. u8 is raw bytes, for transfers
 * (communicators, the ring rotator); tensors do not take it.
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
    DT_DTYPE_COUNT
} dt_dtype;

/* Size of one element in bytes; 0 for an unknown dtype. */
size_t dt_dtype_size(dt_dtype dtype);
/* "fp32", "bf16", "fp16", "u8"; "unknown" otherwise. */
const char *dt_dtype_name(dt_dtype dtype);
/* 1 if dtype is a known value. */
int dt_dtype_valid(dt_dtype dtype);

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

#ifdef __cplusplus
}
#endif
#endif /* DT_DTYPE_H */
