/* attention/cta_trace.c — the summary of a traced kernel launch
 * (cta_trace.h). */
#include "cta_trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A CTA's start (+1) or end (-1) at time t. */
typedef struct event {
    uint64_t t;
    int d;
} event;

/* By time; at one time ends before starts (a slot freed and taken again at
 * the same instant is one slot). */
static int event_cmp(const void *x, const void *y) {
    const event *a = x, *b = y;
    if (a->t != b->t) return a->t < b->t ? -1 : 1;
    return a->d - b->d;
}

static int written(const dt_attn_cta_trace *r) { return r->ns[1] != 0 && r->ns[1] >= r->ns[0]; }

/* The least squares line y = slope x + intercept through points added one
 * by one; NaN for both with fewer than two distinct x. */
typedef struct line_fit {
    double n, sx, sy, sxx, sxy;
} line_fit;

static void fit_add(line_fit *f, double x, double y) {
    f->n += 1, f->sx += x, f->sy += y, f->sxx += x * x, f->sxy += x * y;
}

static void fit_line(const line_fit *f, double *slope, double *intercept) {
    const double var = f->n * f->sxx - f->sx * f->sx;
    *slope = *intercept = NAN;
    if (f->n >= 2 && var > 0) {
        *slope = (f->n * f->sxy - f->sx * f->sy) / var;
        *intercept = (f->sy - *slope * f->sx) / f->n;
    }
}

dt_status dt_attn_trace_summarize(const dt_attn_cta_trace *rec, int64_t n, dt_attn_trace_stats *out) {
    memset(out, 0, sizeof *out);
    out->cycles_per_tile = out->overhead_cycles = NAN;
    out->start_cycles = out->end_cycles = out->loop_cycles_per_tile = out->loop_fixed_cycles = NAN;
    event *ev = malloc((size_t)(n > 0 ? 2 * n : 1) * sizeof *ev);
    /* SMs seen: %smid is below 2^16 on every GPU; a bitmap of that */
    unsigned char *seen = calloc(1u << 13, 1);
    if (!ev || !seen) {
        free(ev);
        free(seen);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "cta trace: no host memory for %lld records",
                        (long long)n);
    }
    uint64_t first = UINT64_MAX, last = 0, last_start = 0;
    double busy_ns = 0, cycles = 0, start = 0, end = 0;
    line_fit all = {0}, loop = {0};   /* cycles on work: the CTA's, its loop's */
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const dt_attn_cta_trace *r = &rec[i];
        if (!written(r)) continue;
        out->ctas++;
        out->work += r->work;
        const uint32_t sm = r->sm & 0xffffu;
        if (!(seen[sm >> 3] & (1u << (sm & 7)))) {
            seen[sm >> 3] |= (unsigned char)(1u << (sm & 7));
            out->sms++;
        }
        first = r->ns[0] < first ? r->ns[0] : first;
        last = r->ns[1] > last ? r->ns[1] : last;
        last_start = r->ns[0] > last_start ? r->ns[0] : last_start;
        busy_ns += (double)(r->ns[1] - r->ns[0]);
        const double c = (double)(r->clock[1] - r->clock[0]);
        cycles += c;
        ev[k++] = (event){r->ns[0], +1};
        ev[k++] = (event){r->ns[1], -1};
        if (r->work == 0) continue;
        fit_add(&all, (double)r->work, c);
        if (r->mark[0] == 0 || r->mark[1] == 0) continue;
        /* 32-bit marks: differences modulo 2^32 */
        const uint32_t c0 = (uint32_t)r->clock[0], c1 = (uint32_t)r->clock[1];
        out->marked++;
        start += (double)(uint32_t)(r->mark[0] - c0);
        end += (double)(uint32_t)(c1 - r->mark[1]);
        fit_add(&loop, (double)r->work, (double)(uint32_t)(r->mark[1] - r->mark[0]));
    }
    free(seen);
    if (out->ctas == 0) {
        free(ev);
        return DT_SUCCESS;
    }
    qsort(ev, (size_t)k, sizeof *ev, event_cmp);
    int64_t running = 0;
    for (int64_t i = 0; i < k; i++) {
        running += ev[i].d;
        out->slots = running > out->slots ? running : out->slots;
    }
    free(ev);
    const double span = (double)(last - first);
    out->span_us = span / 1e3;
    out->drain_us = (double)(last - last_start) / 1e3;
    /* fill from the SMs' busy time, not the records': a persistent CTA's
     * query tiles overlap in time (the overlapped order), so the most
     * records at once (slots) can pass the CTAs the SMs hold */
    dt_attn_trace_timeline tl;
    DT_TRY(dt_attn_trace_timeline_of(rec, n, &tl));
    out->fill = span > 0 ? tl.busy_us / tl.wall_us : NAN;
    out->ghz = busy_ns > 0 ? cycles / busy_ns : NAN;
    fit_line(&all, &out->cycles_per_tile, &out->overhead_cycles);
    fit_line(&loop, &out->loop_cycles_per_tile, &out->loop_fixed_cycles);
    if (out->marked > 0) {
        out->start_cycles = start / (double)out->marked;
        out->end_cycles = end / (double)out->marked;
    }
    return DT_SUCCESS;
}

/* A written record's SM and interval, for the timeline's sort. */
typedef struct span {
    uint32_t sm;
    uint64_t t0, t1;
} span;

/* By SM, then by start. */
static int span_cmp(const void *x, const void *y) {
    const span *a = x, *b = y;
    if (a->sm != b->sm) return a->sm < b->sm ? -1 : 1;
    if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
    return 0;
}

dt_status dt_attn_trace_timeline_of(const dt_attn_cta_trace *rec, int64_t n,
                                    dt_attn_trace_timeline *out) {
    memset(out, 0, sizeof *out);
    span *sp = malloc((size_t)(n > 0 ? n : 1) * sizeof *sp);
    if (!sp)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "cta trace: no host memory for %lld records",
                        (long long)n);
    uint64_t first = UINT64_MAX, last = 0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!written(&rec[i])) continue;
        sp[k++] = (span){rec[i].sm & 0xffffu, rec[i].ns[0], rec[i].ns[1]};
        first = rec[i].ns[0] < first ? rec[i].ns[0] : first;
        last = rec[i].ns[1] > last ? rec[i].ns[1] : last;
    }
    out->records = k;
    if (k == 0) {
        free(sp);
        return DT_SUCCESS;
    }
    qsort(sp, (size_t)k, sizeof *sp, span_cmp);
    /* Each SM's records in order of their starts: the union of their
     * intervals is busy, the holes between them idle_between. */
    double busy = 0, start = 0, between = 0, end = 0;
    for (int64_t i = 0; i < k;) {
        const uint32_t sm = sp[i].sm;
        uint64_t t0 = sp[i].t0, t1 = sp[i].t1;   /* the current run of overlapping records */
        start += (double)(t0 - first);
        for (i++; i < k && sp[i].sm == sm; i++) {
            if (sp[i].t0 > t1) {   /* a hole: the run ends */
                busy += (double)(t1 - t0);
                between += (double)(sp[i].t0 - t1);
                t0 = sp[i].t0;
            }
            t1 = sp[i].t1 > t1 ? sp[i].t1 : t1;
        }
        busy += (double)(t1 - t0);
        end += (double)(last - t1);
        out->sms++;
    }
    free(sp);
    const double per_sm = 1e3 * (double)out->sms;   /* ns summed over SMs -> us per SM */
    out->wall_us = (double)(last - first) / 1e3;
    out->busy_us = busy / per_sm;
    out->idle_start_us = start / per_sm;
    out->idle_between_us = between / per_sm;
    out->idle_end_us = end / per_sm;
    return DT_SUCCESS;
}
