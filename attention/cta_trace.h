/* attention/cta_trace.h — PRIVATE. What a traced launch of a tensor-core
 * block kernel says about itself (dt_attn_block_args.trace, block.h): where
 * its time went, for bench/blocks --trace (docs/PERFORMANCE.md).
 *
 * A launch's time is the CTAs' own (main loop plus a fixed cost around it)
 * and its SMs' idle time (launch ramp, drain). `fill` and `drain_us` show the
 * idle time, `overhead_cycles` the fixed cost per CTA. docs/KERNELS.md, "The
 * CTA trace". Test: tests/test_bench.c.
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
    int64_t slots;           /* most records running at once (may exceed CTAs) */
    int64_t work;            /* their work (tiles), summed */
    double span_us;          /* the first start to the last end */
    double fill;             /* SMs' busy time / (SMs x span): 1 when none idles */
    double drain_us;         /* the last start to the last end: nothing left to launch */
    /* Least squares over CTAs with work > 0: cycles = cycles_per_tile x work
     * + overhead_cycles; NaN when all have the same work (no line to fit). */
    double cycles_per_tile, overhead_cycles;
    double ghz;              /* cycles / ns summed over the CTAs: the SMs' clock */
    /* From the marks of the `marked` CTAs (none: NaN): mean cycles from start
     * to first tile landed, from last tile done to end, and the loop's line
     * loop_cycles_per_tile x work + loop_fixed_cycles. overhead_cycles is about
     * start + loop_fixed + end. */
    int64_t marked;
    double start_cycles, end_cycles, loop_cycles_per_tile, loop_fixed_cycles;
} dt_attn_trace_stats;

/* Back-to-back launches as one device timeline: per SM (mean over SMs seen),
 * busy (any record running), idle before its first record, between records,
 * after its last; busy + the three idles = wall. A record's waits count as
 * busy. */
typedef struct dt_attn_trace_timeline {
    int64_t records;   /* written (ns[1] != 0) */
    int64_t sms;       /* distinct SMs among them */
    double wall_us;    /* the first start to the last end */
    double busy_us, idle_start_us, idle_between_us, idle_end_us;
} dt_attn_trace_timeline;

/* Summarise the n records (unwritten ones, ns[1] = 0, skipped; none: all 0).
 * Host only; fails only with DT_ERR_OUT_OF_MEMORY. */
dt_status dt_attn_trace_summarize(const dt_attn_cta_trace *rec, int64_t n, dt_attn_trace_stats *out);

/* The timeline of the n records (unwritten ones skipped; none: all 0). Host
 * only; fails only with DT_ERR_OUT_OF_MEMORY. */
dt_status dt_attn_trace_timeline_of(const dt_attn_cta_trace *rec, int64_t n,
                                    dt_attn_trace_timeline *out);

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_CTA_TRACE_H */
