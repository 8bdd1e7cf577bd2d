/* dtensor/dtype.c — element type sizes and names. */
#include "dtype.h"

size_t dt_dtype_size(dt_dtype dtype) {
    switch (dtype) {
    case DT_F32: return 4;
    case DT_BF16: return 2;
    case DT_F16: return 2;
    case DT_U8: return 1;
    default: return 0;
    }
}

const char *dt_dtype_name(dt_dtype dtype) {
    switch (dtype) {
    case DT_F32: return "fp32";
    case DT_BF16: return "bf16";
    case DT_F16: return "fp16";
    case DT_U8: return "u8";
    default: return "unknown";
    }
}

int dt_dtype_valid(dt_dtype dtype) { return (int)dtype >= 0 && dtype < DT_DTYPE_COUNT; }
