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

dt_status dt_attn_trace_summarize(const dt_attn_cta_trace *rec, int64_t n, dt_attn_trace_stats *out) {
    memset(out, 0, sizeof *out);
    out->cycles_per_tile = out->overhead_cycles = NAN;
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
    double busy_ns = 0, cycles = 0;
    /* sums for the least squares of cycles on work */
    double sx = 0, sy = 0, sxx = 0, sxy = 0, m = 0;
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
        if (r->work > 0) {
            const double x = (double)r->work;
            sx += x, sy += c, sxx += x * x, sxy += x * c, m += 1;
        }
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
    out->fill = span > 0 ? busy_ns / ((double)out->slots * span) : NAN;
    out->ghz = busy_ns > 0 ? cycles / busy_ns : NAN;
    const double var = m * sxx - sx * sx;
    if (m >= 2 && var > 0) {
        out->cycles_per_tile = (m * sxy - sx * sy) / var;
        out->overhead_cycles = (sy - out->cycles_per_tile * sx) / m;
    }
    return DT_SUCCESS;
}
