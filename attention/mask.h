/* attention/mask.h — the one causal mask rule, from global token positions.
 *
 * A shard of a sequence is a "segment": its rows in local order and their
 * global positions, which grow with the row. Row x sits at
 *   start + x * stride            (x < split)
 *   start + x * stride + gap      (x >= split)
 * (gap >= 0: one jump, or none when gap = 0). Query x of one segment and key
 * y of another may attend iff pos(q) >= pos(k) (causal) or always (full).
 * For P ranks and a sequence of S tokens, rank j holds
 *   contiguous: (j*c, 1, c)                     with c = S / P
 *   striped:    (j, P, c)                       (token i on rank i mod P)
 *   zigzag:     (j*h, 1, 2h), split h, gap (2P-2-2j)*h, h = S / (2P):
 *               chunk j, then chunk 2P-1-j (rows h .. 2h-1 jump to it)
 * Single-device causal attention is (0, 1, S). Since positions grow with the
 * row, a tile of rows [x0, x1) x [y0, y1) is empty, partial or full from its
 * first and last positions alone (kernels skip empty tiles and mask only
 * partial ones), the keys a query may attend are a prefix of the key rows
 * and the queries that may attend a key a suffix of the query rows: so a
 * zigzag shard is one block per ring step, like the others, not four.
 *
 * Pure functions. Test: tests/test_attention.c (make test).
 */
#ifndef DT_ATTN_MASK_H
#define DT_ATTN_MASK_H

#include <stdint.h>
#include "../dtensor/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The inline rules below are also compiled into CUDA kernels. */
#ifdef __CUDACC__
#define DT_ATTN_HD __host__ __device__
#else
#define DT_ATTN_HD
#endif

typedef enum dt_attn_mask {
    DT_ATTN_CAUSAL = 0,   /* pos(q) >= pos(k) */
    DT_ATTN_FULL,         /* no mask */
    DT_ATTN_MASK_COUNT
} dt_attn_mask;

const char *dt_attn_mask_name(dt_attn_mask mask);

typedef struct dt_attn_segment {
    int64_t start;    /* global position of row 0 */
    int64_t stride;   /* >= 1 */
    int64_t len;      /* rows */
    int64_t split;    /* rows split .. len-1 sit gap positions further on */
    int64_t gap;      /* >= 0; 0 (with split 0): no jump, as {start, stride, len} leaves them */
} dt_attn_segment;

/* Position of row x of a segment. */
static inline DT_ATTN_HD int64_t dt_attn_pos(dt_attn_segment s, int64_t x) {
    return s.start + x * s.stride + (x >= s.split ? s.gap : 0);
}

/* The segment of rank `rank` of `parts` for a sequence of seq tokens
 * sharded with `order` (seq divisible by parts, by 2 parts for zigzag). */
dt_attn_segment dt_attn_segment_of(dt_order order, int64_t seq, int parts, int rank);

/* Rows [x0, x0 + n) of s as a segment of their own (0 <= x0, x0 + n <=
 * s.len): row x of it sits where row x0 + x of s does; the jump stays
 * where it falls inside, or is gone. A block on part of a shard's rows
 * (the backward's last step runs its keys in two parts). */
static inline DT_ATTN_HD dt_attn_segment dt_attn_segment_rows(dt_attn_segment s, int64_t x0, int64_t n) {
    dt_attn_segment r = {dt_attn_pos(s, x0), s.stride, n, 0, 0};
    if (x0 < s.split) {
        r.split = s.split - x0;
        r.gap = s.gap;
    }
    return r;
}

typedef enum dt_attn_tile {
    DT_TILE_EMPTY = 0,   /* no pair may attend: skipped */
    DT_TILE_PARTIAL,     /* some may: masked per element */
    DT_TILE_FULL         /* all may: no mask */
} dt_attn_tile;

/* "empty", "partial", "full"; "unknown" otherwise. */
const char *dt_attn_tile_name(dt_attn_tile tile);

/* Class of the tile of rows [x0, x1) of q and [y0, y1) of k (non-empty ranges). */
static inline DT_ATTN_HD dt_attn_tile dt_attn_tile_class(dt_attn_mask mask, dt_attn_segment q, int64_t x0,
                                              int64_t x1, dt_attn_segment k, int64_t y0,
                                              int64_t y1) {
    if (mask == DT_ATTN_FULL) return DT_TILE_FULL;
    if (dt_attn_pos(q, x0) >= dt_attn_pos(k, y1 - 1)) return DT_TILE_FULL;
    if (dt_attn_pos(q, x1 - 1) < dt_attn_pos(k, y0)) return DT_TILE_EMPTY;
    return DT_TILE_PARTIAL;
}

/* Whether no pair of the two segments may attend: no row on a side, or
 * (causal) every key after every query. A ring's block of such a pair
 * adds nothing (a contiguous ring's blocks from later ranks). */
static inline DT_ATTN_HD int dt_attn_no_pairs(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k) {
    return q.len == 0 || k.len == 0 ||
           dt_attn_tile_class(mask, q, 0, q.len, k, 0, k.len) == DT_TILE_EMPTY;
}

/* Positions grow with the row, so the keys a query may attend are a prefix
 * of k and the queries that may attend a key a suffix of q. Kernels size
 * their loops with these instead of visiting empty tiles. Both count in
 * offsets d from s.start: row split is at offset split * stride + gap (its
 * "jump"); rows before it at x * stride, rows from it on at x * stride +
 * gap. With gap = 0 the two rules agree. */

/* n such that a query at position p may attend keys [0, n) of k. */
static inline DT_ATTN_HD int64_t dt_attn_keys_upto(dt_attn_mask mask, dt_attn_segment k, int64_t p) {
    if (mask == DT_ATTN_FULL) return k.len;
    if (p < k.start) return 0;
    const int64_t d = p - k.start, jump = dt_attn_pos(k, k.split) - k.start;
    int64_t n;
    if (d >= jump) n = (d - k.gap) / k.stride + 1;   /* row split is in, and the rows to d - gap */
    else {                                          /* the rows to d, none at or past split */
        n = d / k.stride + 1;
        if (n > k.split) n = k.split;
    }
    return n < k.len ? n : k.len;
}

/* x such that queries [x, q.len) of q may attend a key at position p. */
static inline DT_ATTN_HD int64_t dt_attn_queries_from(dt_attn_mask mask, dt_attn_segment q, int64_t p) {
    if (mask == DT_ATTN_FULL || p <= q.start) return 0;
    const int64_t d = p - q.start, jump = dt_attn_pos(q, q.split) - q.start;
    int64_t x;
    if (d > jump) x = (d - q.gap + q.stride - 1) / q.stride;   /* ceil: first row past split at >= p */
    else {                                                   /* row split at the latest */
        x = (d + q.stride - 1) / q.stride;
        if (x > q.split) x = q.split;
    }
    return x < q.len ? x : q.len;
}

/* The last step of a ring of `parts` ranks (step t: rank `rank`'s queries
 * against the keys of rank (rank - t) mod parts) whose block has a pair
 * the mask allows, 0 if none after step 0 has: the step whose block may
 * finish the rank's rows, since every block after it adds nothing (a
 * contiguous causal ring: step `rank`). parts - 1 for striped and zigzag
 * rings and for the full mask. */
int dt_attn_ring_last_step(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank);

/* A ring's steps in launches (dt_attention_options.group; the forward
 * pass's launches, attention/forward.c, and bench/blocks' (g) rows).
 *
 * dt_attn_ring_group: the steps per launch a ring of `parts` ranks takes
 * when `requested` are asked for (0 or 1: one): at most parts - 1 (the
 * steps after a rank's own block; a ring of two takes one), and for a
 * striped causal ring the greatest power of two up to that and 64 (its
 * launches' keys are interleaved from slots: dt_attn_ring_run_keys).
 *
 * dt_attn_ring_runs: rank `rank`'s steps in launches of up to `group`
 * (dt_attn_ring_group's) steps: launch r takes steps first[r] ..
 * first[r+1] - 1; returns their count n, first[n] = parts (first has room
 * for parts + 1). Launch 0 is step 0 alone (the rank's own block), then
 * runs of consecutive steps, whose sources (rank - t) mod parts descend by
 * one, so that their shards are neighbours in the sequence. A run never
 * crosses the sources' wrap from 0 to parts - 1 (step rank + 1), nor the
 * ring's last step with pairs (dt_attn_ring_last_step); a striped causal
 * run holds a power of two of steps. The runs after the one holding that
 * last step add nothing (their first step is past it).
 *
 * dt_attn_ring_run_keys: the segments of the launch of steps t0 .. t1 - 1
 * (one of those runs, or t0 = 0, t1 = 1): *qs the rank's queries', *ks
 * that of the launch's keys, the n = t1 - t0 blocks laid in one buffer
 * lowest source first (source s_lo + i in place i); returns the slots
 * (block.h's kv_slots: 1, the blocks side by side):
 *   contiguous (and the full mask, which reads no position, in any order
 *     but zigzag): (s_lo c, 1, n c), the rank's own queries;
 *   zigzag: the n first chunks lowest source first, then the n second
 *     ones highest source first (one jump): (s_lo h, 1, 2 n h), split n h,
 *     gap (2 parts - 2 - 2 s_hi) h, h = c / 2;
 *   striped causal, t0 >= 1: n slots of c rows, key row y row y / n of the
 *     slot y mod n. Shard s holds positions s, s + parts, .., so a run's
 *     keys taken in turns are in sequence order; and since the sources of
 *     a run lie all below the rank (key row i visible to query row x iff i
 *     <= x) or all above it (iff i < x), the keys at virtual positions (0,
 *     1, n c) and the queries at (n - 1, n, c) (below) or (-1, n, c)
 *     (above) keep every comparison of the mask.
 * Step 0's launch is the rank's own block, at the shards' own segments. */
int dt_attn_ring_group(dt_order order, dt_attn_mask mask, int parts, int requested);
int dt_attn_ring_runs(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank,
                      int group, int *first);
int64_t dt_attn_ring_run_keys(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank,
                              int t0, int t1, dt_attn_segment *qs, dt_attn_segment *ks);

/* Number of (query, key) pairs that may attend between two segments: the
 * work of a block, in closed form per query row. */
int64_t dt_attn_pairs(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k);

/* The tiles a forward kernel of bm query rows x bn keys per tile visits in
 * a block: per query tile, the key tiles up to its last row's last key
 * (dt_attn_keys_upto; every tile with a pair the mask allows, as keys are
 * a prefix per row and grow with it), summed; *visits (if not NULL) the
 * query tiles with at least one. bench/blocks' tile model (item 3 of
 * issue 8: a ring's time against one call's as K + F V). */
int64_t dt_attn_tiles(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k, int64_t bm,
                      int64_t bn, int64_t *visits);

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_MASK_H */
