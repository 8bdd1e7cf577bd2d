/* attention/mask.c — segments of a shard and pair counts (pure). */
#include "mask.h"

const char *dt_attn_tile_name(dt_attn_tile tile) {
    switch (tile) {
    case DT_TILE_EMPTY: return "empty";
    case DT_TILE_PARTIAL: return "partial";
    case DT_TILE_FULL: return "full";
    default: return "unknown";
    }
}

const char *dt_attn_mask_name(dt_attn_mask mask) {
    switch (mask) {
    case DT_ATTN_CAUSAL: return "causal";
    case DT_ATTN_FULL: return "full";
    default: return "unknown";
    }
}

dt_attn_segment dt_attn_segment_of(dt_order order, int64_t seq, int parts, int rank) {
    if (order == DT_ORDER_ZIGZAG) {   /* chunks rank and 2 parts - 1 - rank of h */
        const int64_t h = seq / (2 * parts);
        return (dt_attn_segment){.start = rank * h, .stride = 1, .len = 2 * h, .split = h,
                                 .gap = (2 * (int64_t)parts - 2 - 2 * (int64_t)rank) * h};
    }
    const int64_t c = seq / parts;
    if (order == DT_ORDER_STRIPED) return (dt_attn_segment){rank, parts, c, 0, 0};
    return (dt_attn_segment){rank * c, 1, c, 0, 0};
}

int dt_attn_ring_last_step(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank) {
    const dt_attn_segment q = dt_attn_segment_of(order, seq, parts, rank);
    for (int t = parts - 1; t > 0; t--)
        if (!dt_attn_no_pairs(mask, q, dt_attn_segment_of(order, seq, parts, (rank - t + parts) % parts)))
            return t;
    return 0;
}

int dt_attn_ring_group(dt_order order, dt_attn_mask mask, int parts, int requested) {
    int g = requested > 1 && parts > 2 ? (requested < parts - 1 ? requested : parts - 1) : 1;
    if (order == DT_ORDER_STRIPED && mask == DT_ATTN_CAUSAL) {
        if (g > 64) g = 64;
        while (g & (g - 1)) g &= g - 1;   /* the highest power of two in g */
    }
    return g;
}

int dt_attn_ring_runs(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank,
                      int group, int *first) {
    const int last = dt_attn_ring_last_step(order, mask, seq, parts, rank);
    const int pow2 = order == DT_ORDER_STRIPED && mask == DT_ATTN_CAUSAL;
    int n = 0;
    first[n++] = 0;   /* step 0 */
    for (int t = 1; t < parts;) {
        /* up to the next step a run may not cross into */
        int end = parts;
        if (t <= rank) end = rank + 1;
        if (t <= last && last + 1 < end) end = last + 1;
        int steps = end - t < group ? end - t : group;
        while (pow2 && (steps & (steps - 1))) steps &= steps - 1;
        first[n++] = t;
        t += steps;
    }
    first[n] = parts;
    return n;
}

int64_t dt_attn_ring_run_keys(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank,
                              int t0, int t1, dt_attn_segment *qs, dt_attn_segment *ks) {
    *qs = dt_attn_segment_of(order, seq, parts, rank);
    if (t0 == 0) {   /* the rank's own block */
        *ks = *qs;
        return 1;
    }
    const int64_t n = t1 - t0, c = seq / parts, h = c / 2;
    const int64_t s_hi = ((rank - t0) % parts + parts) % parts, s_lo = s_hi - n + 1;
    if (order == DT_ORDER_ZIGZAG) {
        *ks = (dt_attn_segment){s_lo * h, 1, 2 * n * h, n * h, (2 * (int64_t)parts - 2 - 2 * s_hi) * h};
        return 1;
    }
    if (order == DT_ORDER_STRIPED && mask == DT_ATTN_CAUSAL) {
        *qs = (dt_attn_segment){t0 <= rank ? n - 1 : -1, n, c, 0, 0};
        *ks = (dt_attn_segment){0, 1, n * c, 0, 0};
        return n;
    }
    *ks = (dt_attn_segment){s_lo * c, 1, n * c, 0, 0};
    return 1;
}

int64_t dt_attn_tiles(dt_attn_rule r, dt_attn_segment q, dt_attn_segment k, int64_t bm,
                      int64_t bn, int64_t *visits) {
    int64_t tiles = 0, v = 0;
    for (int64_t x0 = 0; x0 < q.len; x0 += bm) {
        const int64_t x1 = x0 + bm < q.len ? x0 + bm : q.len;
        int64_t lo, hi, flo, fhi, n = 0;
        dt_attn_rule_range(r, 1, q, x0, x1, k, &lo, &hi, &flo, &fhi);
        for (int64_t y0 = lo / bn * bn; y0 < hi; y0 += bn)
            n += dt_attn_rule_tile(r, q, x0, x1, k, y0, y0 + bn < k.len ? y0 + bn : k.len) !=
                 DT_TILE_EMPTY;
        tiles += n;
        v += n > 0;
    }
    if (visits) *visits = v;
    return tiles;
}

int64_t dt_attn_pairs(dt_attn_rule r, dt_attn_segment q, dt_attn_segment k) {
    int64_t n = 0;
    for (int64_t x = 0; x < q.len; x++) {
        int64_t lo, hi;
        dt_attn_rule_rows(r, 1, dt_attn_pos(q, x), k, &lo, &hi);
        if (hi > lo) n += hi - lo;
    }
    return n;
}

int dt_attn_has_pairs(dt_attn_rule r, dt_attn_segment q, dt_attn_segment k) {
    for (int64_t x = 0; x < q.len; x++) {
        int64_t lo, hi;
        dt_attn_rule_rows(r, 1, dt_attn_pos(q, x), k, &lo, &hi);
        if (hi > lo) return 1;
    }
    return 0;
}
