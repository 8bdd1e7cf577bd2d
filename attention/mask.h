/* attention/mask.h — the one mask rule, from global token positions.
 *
 * The rule. A query at global position i may attend a key at position j iff
 *   - they are in the same document (documents: docs.h; none given, one per
 *     batch row),
 *   - j <= i under DT_ATTN_CAUSAL (any j of the document under DT_ATTN_FULL),
 *   - and |i - j| < W when a window W >= 1 is set.
 * So the keys a query may attend are one interval of positions, its "span"
 * [lo, hi], and so are the queries that may attend a key; both ends never
 * decrease as the position grows (dt_attn_rule_span).
 *
 * A shard of a sequence is a "segment": its rows in local order and their
 * global positions, which grow with the row. Row x sits at
 *   start + x * stride            (x < split)
 *   start + x * stride + gap      (x >= split)
 * (gap >= 0: one jump, or none when gap = 0). For P ranks and a sequence of
 * S tokens, rank j holds
 *   contiguous: (j*c, 1, c)                     with c = S / P
 *   striped:    (j, P, c)                       (token i on rank i mod P)
 *   zigzag:     (j*h, 1, 2h), split h, gap (2P-2-2j)*h, h = S / (2P):
 *               chunk j, then chunk 2P-1-j (rows h .. 2h-1 jump to it)
 * Single-device attention is (0, 1, S). Since positions grow with the row, a
 * span is a range of rows of the other segment, and a tile's class (empty,
 * partial, full) follows from the spans of its first and last rows
 * (dt_attn_rule_range): a zigzag shard is one block per ring step, not four.
 *
 * The mask-only functions below (dt_attn_keys_upto, dt_attn_queries_from,
 * dt_attn_tile_class, dt_attn_no_pairs) are the rule without documents or
 * window, where a query's keys are a prefix of the key rows: the kernel forms
 * that predate documents use them.
 *
 * Pure functions. Test: tests/test_attention.c.
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

/* Number of rows of s at positions <= p. */
static inline DT_ATTN_HD int64_t dt_attn_rows_upto(dt_attn_segment s, int64_t p) {
    if (p < s.start) return 0;
    const int64_t d = p - s.start, jump = dt_attn_pos(s, s.split) - s.start;
    int64_t n;
    if (d >= jump) n = (d - s.gap) / s.stride + 1;   /* row split is in, and the rows to d - gap */
    else {                                          /* the rows to d, none at or past split */
        n = d / s.stride + 1;
        if (n > s.split) n = s.split;
    }
    return n < s.len ? n : s.len;
}

/* The rule of one batch row (see the top). docs: NULL (one document), or
 * docs[2p], docs[2p + 1] the start and end (exclusive) of the document of
 * position p (docs.h's dt_docs_bounds), every position of the sequence;
 * host memory for the CPU kernels, device memory for the CUDA ones. */
typedef struct dt_attn_rule {
    dt_attn_mask mask;
    int64_t window;           /* 0: none; else |i - j| < window (>= 1) */
    const int64_t *docs;
} dt_attn_rule;

/* No position is this far out: an unbounded end of a span. */
#define DT_ATTN_FAR ((int64_t)1 << 60)

/* The span [*lo, *hi] of positions the rule pairs with position p: the keys
 * a query at p may attend (keys = 1), or the queries that may attend a key
 * at p (keys = 0). Empty when *lo > *hi. */
static inline DT_ATTN_HD void dt_attn_rule_span(dt_attn_rule r, int keys, int64_t p, int64_t *lo,
                                                int64_t *hi) {
    int64_t a = r.docs ? r.docs[2 * p] : -DT_ATTN_FAR, b = r.docs ? r.docs[2 * p + 1] - 1 : DT_ATTN_FAR;
    if (r.window > 0) {
        if (a < p - r.window + 1) a = p - r.window + 1;
        if (b > p + r.window - 1) b = p + r.window - 1;
    }
    if (r.mask == DT_ATTN_CAUSAL) {
        if (keys && b > p) b = p;
        if (!keys && a < p) a = p;
    }
    *lo = a;
    *hi = b;
}

/* The rows [*lo, *hi) of segment s within the span of position p (keys: as
 * dt_attn_rule_span). Empty when *lo >= *hi. */
static inline DT_ATTN_HD void dt_attn_rule_rows(dt_attn_rule r, int keys, int64_t p, dt_attn_segment s,
                                                int64_t *lo, int64_t *hi) {
    int64_t a, b;
    dt_attn_rule_span(r, keys, p, &a, &b);
    *lo = dt_attn_rows_upto(s, a - 1);
    *hi = a > b ? *lo : dt_attn_rows_upto(s, b);
}

/* For rows [x0, x1) of segment a (non-empty; queries if keys, else keys):
 * the rows [*lo, *hi) of segment b that some of them pair with at most (a
 * superset: the first row's span start to the last row's span end), and the
 * rows [*flo, *fhi) that every one of them pairs with (none when *flo >= *fhi). */
static inline DT_ATTN_HD void dt_attn_rule_range(dt_attn_rule r, int keys, dt_attn_segment a, int64_t x0,
                                                 int64_t x1, dt_attn_segment b, int64_t *lo,
                                                 int64_t *hi, int64_t *flo, int64_t *fhi) {
    int64_t l0, h0, l1, h1;
    dt_attn_rule_rows(r, keys, dt_attn_pos(a, x0), b, &l0, &h0);
    dt_attn_rule_rows(r, keys, dt_attn_pos(a, x1 - 1), b, &l1, &h1);
    *lo = l0;
    *hi = h1;   /* >= h0: span ends never decrease */
    *flo = l1;
    *fhi = h0;
}

/* The segment of rank `rank` of `parts` for a sequence of seq tokens
 * sharded with `order` (seq divisible by parts, by 2 parts for zigzag). */
dt_attn_segment dt_attn_segment_of(dt_order order, int64_t seq, int parts, int rank);

/* Rows [x0, x0 + n) of s (within s.len) as a segment of their own: row x sits
 * where row x0 + x of s does (the backward's last step runs keys in halves). */
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

/* Class of the tile of rows [x0, x1) of q and [y0, y1) of k (non-empty
 * ranges) under rule r: empty and full are exact for the tile's corners'
 * spans; a tile they call partial may still hold no pair (a short document
 * between two rows of a striped tile). */
static inline DT_ATTN_HD dt_attn_tile dt_attn_rule_tile(dt_attn_rule r, dt_attn_segment q, int64_t x0,
                                                        int64_t x1, dt_attn_segment k, int64_t y0,
                                                        int64_t y1) {
    int64_t lo, hi, flo, fhi;
    dt_attn_rule_range(r, 1, q, x0, x1, k, &lo, &hi, &flo, &fhi);
    if (hi <= y0 || lo >= y1) return DT_TILE_EMPTY;
    if (flo <= y0 && fhi >= y1) return DT_TILE_FULL;
    return DT_TILE_PARTIAL;
}

/* 1 if no pair of the segments may attend (a side empty, or every key after
 * every query): a ring block that adds nothing. */
static inline DT_ATTN_HD int dt_attn_no_pairs(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k) {
    return q.len == 0 || k.len == 0 ||
           dt_attn_tile_class(mask, q, 0, q.len, k, 0, k.len) == DT_TILE_EMPTY;
}

/* The prefix of keys / suffix of queries a position allows; kernels size their
 * loops with these. Offsets d from s.start: x * stride before split, x * stride
 * + gap from it on. */

/* n such that a query at position p may attend keys [0, n) of k. */
static inline DT_ATTN_HD int64_t dt_attn_keys_upto(dt_attn_mask mask, dt_attn_segment k, int64_t p) {
    return mask == DT_ATTN_FULL ? k.len : dt_attn_rows_upto(k, p);
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

/* The last ring step (step t: keys of rank (rank - t) mod parts) whose block
 * has a pair the mask allows, 0 if none after step 0: it finishes the rows.
 * Contiguous causal: `rank`; striped, zigzag, full: parts - 1. */
int dt_attn_ring_last_step(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank);

/* Steps per launch for `requested` (dt_attention_options.group; 0, 1: one): at
 * most parts - 1; striped causal: the greatest power of two up to that and 64. */
int dt_attn_ring_group(dt_order order, dt_attn_mask mask, int parts, int requested);
/* Rank's steps in launches of up to `group`: launch r is steps first[r] ..
 * first[r+1] - 1 (first: parts + 1 entries); returns n, first[n] = parts. Launch
 * 0 is step 0 alone; then runs whose sources are sequence neighbours, never
 * crossing the sources' wrap nor dt_attn_ring_last_step. */
int dt_attn_ring_runs(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank,
                      int group, int *first);
/* Segments of the launch of steps [t0, t1) (a run, or [0, 1): the shards' own),
 * n blocks in one buffer, lowest source s_lo first: *qs the queries', *ks the
 * keys'; returns the slots:
 *   contiguous (or full mask, not zigzag): (s_lo c, 1, n c), one slot;
 *   zigzag: first chunks ascending, then second ones descending: (s_lo h, 1,
 *     2 n h), split n h, gap (2 parts - 2 - 2 s_hi) h, h = c / 2;
 *   striped causal, t0 >= 1: n slots of c rows (key row y: row y / n of slot
 *     y mod n, in sequence order); sources all below the rank or all above, so
 *     keys at (0, 1, n c) and queries at (n - 1, n, c) or (-1, n, c) keep the
 *     mask's every comparison. */
int64_t dt_attn_ring_run_keys(dt_order order, dt_attn_mask mask, int64_t seq, int parts, int rank,
                              int t0, int t1, dt_attn_segment *qs, dt_attn_segment *ks);

/* Number of (query, key) pairs rule r allows between two segments: the
 * work of a block, in closed form per query row. */
int64_t dt_attn_pairs(dt_attn_rule r, dt_attn_segment q, dt_attn_segment k);

/* 1 if rule r allows some pair of the segments (exact; stops at the first
 * query row that has one). */
int dt_attn_has_pairs(dt_attn_rule r, dt_attn_segment q, dt_attn_segment k);

/* Tiles of bm x bn a forward kernel visits in a block (per query tile, the
 * key tiles from its first row's first key to its last row's last key, less
 * those dt_attn_rule_tile calls empty); *visits (may be NULL): query tiles
 * with at least one. bench/blocks.c's tile model. */
int64_t dt_attn_tiles(dt_attn_rule r, dt_attn_segment q, dt_attn_segment k, int64_t bm,
                      int64_t bn, int64_t *visits);

/* The rule of mask alone: no documents, no window. */
static inline DT_ATTN_HD dt_attn_rule dt_attn_rule_of(dt_attn_mask mask) {
    dt_attn_rule r = {mask, 0, 0};
    return r;
}

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_MASK_H */
