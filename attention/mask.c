/* attention/mask.c — segments of a shard and pair counts (pure). */
#include "mask.h"

const char *dt_attn_mask_name(dt_attn_mask mask) {
    switch (mask) {
    case DT_ATTN_CAUSAL: return "causal";
    case DT_ATTN_FULL: return "full";
    default: return "unknown";
    }
}

int dt_attn_segments(dt_order order, int64_t seq, int parts, int rank, dt_attn_segment segs[2]) {
    if (order == DT_ORDER_ZIGZAG) {
        int64_t h = seq / (2 * parts);
        segs[0] = (dt_attn_segment){(int64_t)rank * h, 1, h};
        segs[1] = (dt_attn_segment){(int64_t)(2 * parts - 1 - rank) * h, 1, h};
        return 2;
    }
    int64_t c = seq / parts;
    if (order == DT_ORDER_STRIPED) segs[0] = (dt_attn_segment){rank, parts, c};
    else segs[0] = (dt_attn_segment){(int64_t)rank * c, 1, c};
    return 1;
}

int64_t dt_attn_pairs(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k) {
    if (mask == DT_ATTN_FULL) return q.len * k.len;
    int64_t n = 0;
    for (int64_t x = 0; x < q.len; x++) n += dt_attn_keys_upto(mask, k, dt_attn_pos(q, x));
    return n;
}
