/* attention/cta_trace.h — PRIVATE. What a traced launch of a tensor-core
 * block kernel says about itself (dt_attn_block_args.trace, block.h): where
 * its time went, for bench/blocks --trace (docs/PERFORMANCE.md).
 *
 * A launch's time splits into the CTAs' own time (each one's main loop and
 * the fixed cost around it: loading the first tiles, reading and writing
 * the rows) and the time its SMs sit idle (at the start, while CTAs are
 * still being launched, and at the end, once none is left to start and the
 * last ones finish). A causal block's time over a full one's (r) is near
 * 1/2 only if both stay small: `fill` and `drain_us` show the idle time,
 * `overhead_cycles` the fixed cost per CTA in units of `cycles_per_tile`.
 */
#ifndef DT_ATTN_CTA_TRACE_H
#define DT_ATTN_CTA_TRACE_H

#include <stdint.h>
#include "../base/status.h"
#include "block.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_attn_trace_stats {
    int64_t ctas;            /* records written (ns[1] != 0) */
    int64_t sms;             /* distinct SMs among them */
    int64_t slots;           /* the most records running at one time (a persistent
                                CTA's query tiles may overlap: more than the CTAs) */
    int64_t work;            /* their work (tiles), summed */
    double span_us;          /* the first start to the last end */
    double fill;             /* the SMs' busy time / (SMs x span), an SM busy while any
                                record on it runs (the timeline's busy / wall): 1 when no
                                SM is ever idle */
    double drain_us;         /* the last start to the last end: nothing left to launch */
    /* Least squares over the CTAs with work > 0: cycles = cycles_per_tile
     * x work + overhead_cycles (the intercept holds whatever a CTA spends
     * beyond its tiles at the mean tile's cost: loads before the first
     * tile, the rows read and written, a masked tile's extra). NaN when
     * every such CTA has the same work (a full block): no line to fit. */
    double cycles_per_tile, overhead_cycles;
    double ghz;              /* cycles / ns summed over the CTAs: the SMs' clock */
    /* Where the fixed cost goes, from the kernels' marks
     * (dt_attn_cta_trace.mark) of the CTAs with work > 0 that set them
     * (`marked`; with none, the four are NaN): start_cycles, the mean time
     * from a CTA's start to its first tile landed (its loads' latency
     * and whatever ran before: the launch order, the rows' start);
     * end_cycles, from its last tile done to its end (forward: the rows'
     * merge and write-back, a dependent launch's wait for the block
     * before; backward: dK and dV written or added); and
     * the loop between them on the line loop_cycles_per_tile x work +
     * loop_fixed_cycles (the loop's own excess over its tiles: a masked
     * tile's extra work, the pipeline's fill and drain). overhead_cycles is
     * about start + loop_fixed + end. */
    int64_t marked;
    double start_cycles, end_cycles, loop_cycles_per_tile, loop_fixed_cycles;
} dt_attn_trace_stats;

/* The records of launches run back to back (bench/blocks (p) --trace: a
 * ring's blocks as the ring runs them, the one call), as one device
 * timeline. Per SM: the time it ran at least one record (busy), and the
 * time it ran none: before its first record (idle_start: the launches'
 * start), between two of its records (idle_between: a CTA's exit to the
 * next one's start on that SM, within a launch or from one launch to the
 * next) and after its last (idle_end); each the mean over the SMs seen, so
 * that busy + idle_start + idle_between + idle_end = wall. A record holds
 * its CTA's whole time (persistent: its query tile's), whatever it waits
 * for inside (a dependent launch's wait for the launch before) included;
 * at D = 64, two CTAs an SM, an SM is busy while either runs. */
typedef struct dt_attn_trace_timeline {
    int64_t records;   /* written (ns[1] != 0) */
    int64_t sms;       /* distinct SMs among them */
    double wall_us;    /* the first start to the last end */
    double busy_us, idle_start_us, idle_between_us, idle_end_us;
} dt_attn_trace_timeline;

/* Summarises the n records rec (a traced launch's dt_attn_cta_trace, the
 * ones never written, ns[1] = 0, left out) into *out; with none written,
 * ctas = 0 and every time 0. DT_ERR_OUT_OF_MEMORY (host memory for the
 * sort of 2n events) is the only failure. */
dt_status dt_attn_trace_summarize(const dt_attn_cta_trace *rec, int64_t n, dt_attn_trace_stats *out);

/* The timeline of the n records rec (those never written left out) into
 * *out; with none written, records = 0 and every time 0.
 * DT_ERR_OUT_OF_MEMORY (host memory for a sorted copy) is the only
 * failure. */
dt_status dt_attn_trace_timeline_of(const dt_attn_cta_trace *rec, int64_t n,
                                    dt_attn_trace_timeline *out);

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_CTA_TRACE_H */
