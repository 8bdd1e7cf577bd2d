/* attention/block_cpu.c — the CPU attention block kernel.
 *
 * Online softmax over tiles of up to TQ queries x TK keys, per (batch, head):
 *   S = scale * Q_t K_t^T                   (OpenBLAS sgemm, fp32)
 *   mask S where pos(q) < pos(k)            (tiles on the diagonal band only)
 *   m' = max(m, rowmax S);  P = exp(S - m')
 *   l  = l * exp(m - m') + rowsum P
 *   acc = acc * exp(m - m') + P V_t         (sgemm into the strided acc rows)
 * (the row max, the exp and its sum four lanes at a time: cpu_vec.h).
 * Rows with no allowed key keep m = -inf, l = 0, acc = 0 (never exp(-inf -
 * -inf)) and end as o = 0, lse = -inf. An allowed score that is NaN or +-inf
 * makes its row's m, l, o and lse NaN: non-finite values never vanish. Tiles
 * are packed into fp32 scratch (converting bf16, fp16): one path for every
 * dtype. The first block starts the rows, the last writes o and lse (block.h).
 *
 * Which tiles run (mask.h): a query's keys are one range of key rows whose
 * ends never decrease with the query, so a query tile's keys that every row
 * may attend (from its corner rows' spans) run unmasked, keys outside its
 * first row's start and last row's end are skipped, and the bands between run
 * in slices of TS rows, each within its own range (about the allowed pairs
 * plus TS/2 keys a row at each end). The backward swaps the roles (key tiles
 * outer, dK and dV accumulate in scratch), slicing by TS keys.
 *
 * Test: tests/test_attention.c, tests/test_attention_backward.c (make test).
 */
#include "block.h"
#include "../base/cpu_vec.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#define TQ 64
#define TK 128
#define TS 16   /* rows of a slice of the diagonal band */

static size_t fwd_scratch(int64_t dim, int64_t seqs, int64_t len) {
    (void)seqs;
    (void)len;
    return (size_t)(TQ * dim + 2 * TK * dim + TQ * TK) * sizeof(float);
}

/* rows x [x0, x0+n) of one head into a contiguous fp32 [n, dim] tile */
static void pack_rows(float *dst, const void *base, dt_dtype dtype, int64_t row_stride,
                      int64_t x0, int64_t n, int64_t dim) {
    const size_t es = dt_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++)
        dt_values_get((const char *)base + (size_t)((x0 + i) * row_stride) * es, dtype,
                      (size_t)dim, dst + i * dim);
}

/* Key rows [y0, y0+n) of one kv head (interleaved from slots: block.h)
 * into a contiguous fp32 [n, dim] tile. */
static void pack_keys(float *dst, const void *base, const dt_attn_block_args *a, int64_t y0,
                      int64_t n) {
    const size_t es = dt_dtype_size(a->dtype);
    const int64_t row_stride = a->kv_heads * a->dim;
    for (int64_t i = 0; i < n; i++)
        dt_values_get((const char *)base +
                          (size_t)(dt_attn_key_row(y0 + i, a->kv_slots, a->kv_slot_rows) *
                                   row_stride) * es,
                      a->dtype, (size_t)a->dim, dst + i * a->dim);
}

/* Scores row[0, tk) of keys y .. y+tk-1 of segment k, seen from a query at
 * position pq: -inf for the keys rule r forbids, those outside the query's
 * range of key rows (mask.h). */
static void mask_row(dt_attn_rule r, dt_attn_segment k, int64_t pq, int64_t y, float *row,
                     int64_t tk) {
    int64_t lo, hi;
    dt_attn_rule_rows(r, 1, pq, k, &lo, &hi);
    lo -= y, hi -= y;
    if (hi < lo) hi = lo;
    for (int64_t j = 0; j < tk && j < lo; j++) row[j] = -INFINITY;
    for (int64_t j = hi < 0 ? 0 : hi; j < tk; j++) row[j] = -INFINITY;
}

/* [lo, hi) less [flo, fhi) (the rows every row of a tile takes, run
 * unmasked; none when flo >= fhi): the masked band's sides, into part[0..1]
 * as [from, to) (possibly empty). */
static void band_sides(int64_t lo, int64_t hi, int64_t flo, int64_t fhi, int64_t part[2][2]) {
    if (flo >= fhi) flo = fhi = hi;
    part[0][0] = lo;
    part[0][1] = hi < flo ? hi : flo;
    part[1][0] = lo > fhi ? lo : fhi;
    part[1][1] = hi;
}

/* One (batch, head) of a forward call, and the scratch tiles. */
typedef struct fwd_head {
    const dt_attn_block_args *a;
    dt_attn_rule rule;           /* of the head's batch entry */
    const char *kb, *vb;         /* k, v of the head's kv head */
    float *m, *l, *acc;
    float *kt, *vt, *s;
} fwd_head;

/* Rows [x0, x0+tq) (packed in qt) against keys [y0, y0+tk), masked or not. */
static void fwd_tile(const fwd_head *f, const float *qt, int64_t x0, int64_t tq, int64_t y0,
                     int64_t tk, int masked) {
    const dt_attn_block_args *a = f->a;
    const int64_t H = a->heads, D = a->dim;
    float *s = f->s;
    pack_keys(f->kt, f->kb, a, y0, tk);
    pack_keys(f->vt, f->vb, a, y0, tk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tq, (int)tk, (int)D, a->scale, qt,
                (int)D, f->kt, (int)D, 0.0f, s, (int)tk);
    for (int64_t i = 0; i < tq; i++) {
        float *row = s + i * tk;
        dt_nonfinite_nan(row, tk);   /* an allowed score of +-inf poisons its row too */
        if (masked) mask_row(f->rule, a->kseg, dt_attn_pos(a->qseg, x0 + i), y0, row, tk);
        const float mx = dt_row_max(row, tk);
        const float m_old = f->m[x0 + i];
        const float m_new = dt_max_nan(mx, m_old);
        float *acc_row = f->acc + (x0 + i) * H * D;
        if (m_new == -INFINITY) {
            /* nothing allowed yet for this row: P = 0 */
            memset(row, 0, (size_t)tk * sizeof(float));
            continue;
        }
        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        const float sum = dt_exp_shift(row, tk, m_new);
        f->l[x0 + i] = f->l[x0 + i] * alpha + sum;
        f->m[x0 + i] = m_new;
        if (alpha != 1.0f)
            for (int64_t d = 0; d < D; d++) acc_row[d] *= alpha;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)tq, (int)D, (int)tk, 1.0f, s,
                (int)tk, f->vt, (int)D, 1.0f, f->acc + x0 * H * D, (int)(H * D));
}

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

/* The first block's start of rows [0, n) of one (batch, head). */
static void start_rows(const fwd_head *f, int64_t n) {
    const int64_t HD = f->a->heads * f->a->dim;
    for (int64_t x = 0; x < n; x++) {
        f->m[x] = -INFINITY;
        f->l[x] = 0.0f;
        memset(f->acc + x * HD, 0, (size_t)f->a->dim * sizeof(float));
    }
}

/* The last block's finish: o = acc / l (0 where l = 0) in the dtype at q's
 * layout (ob: the (batch, head)'s row 0), lse = m + log l (-inf where l = 0). */
static void finish_rows(const fwd_head *f, int64_t n, void *ob, float *lse) {
    const dt_attn_block_args *a = f->a;
    const int64_t D = a->dim, HD = a->heads * D;
    for (int64_t x = 0; x < n; x++) {
        /* l = 0: no allowed key, o = 0 (whatever acc picked up from masked
         * values); l NaN: a non-finite input reached the row, o and lse NaN;
         * an infinite o (an infinite value) becomes NaN (o + 0 o) */
        const float l = f->l[x], inv = 1.0f / l;
        lse[x] = l == 0.0f ? -INFINITY : f->m[x] + logf(l);
        for (int64_t d = 0; d < D; d++) {
            const float o = l == 0.0f ? 0.0f : f->acc[x * HD + d] * inv;
            dt_value_set(ob, a->dtype, (size_t)(x * HD + d), o + 0.0f * o);
        }
    }
}

static dt_status fwd(struct dt_backend *be, const dt_attn_block_args *a, void *scratch) {
    (void)be;
    const int64_t H = a->heads, G = a->kv_heads, D = a->dim, group = H / G;
    const int64_t nq = a->qseg.len;
    const size_t es = dt_dtype_size(a->dtype);
    float *qt = scratch, *kt = qt + TQ * D, *vt = kt + TK * D, *s = vt + TK * D;

    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / group;
            const size_t qo = (size_t)(b * a->q_batch_stride + h * D) * es;
            const char *qb = (const char *)a->q + qo;
            const size_t kvo = (size_t)(b * a->kv_batch_stride + g * D) * es;
            const int64_t ml = b * a->ml_batch_stride + h * a->ml_head_stride;
            const fwd_head f = {
                .a = a, .rule = dt_attn_block_rule(a, b),
                .kb = (const char *)a->k + kvo, .vb = (const char *)a->v + kvo,
                .m = a->m + ml, .l = a->l + ml, .acc = a->acc + b * a->acc_batch_stride + h * D,
                .kt = kt, .vt = vt, .s = s,
            };
            if (a->first) start_rows(&f, nq);
            for (int64_t x0 = 0; x0 < nq; x0 += TQ) {
                const int64_t tq = min64(TQ, nq - x0);
                /* keys [lo, hi) some row of the tile may attend, [flo, fhi) every one */
                int64_t lo, hi, flo, fhi;
                dt_attn_rule_range(f.rule, 1, a->qseg, x0, x0 + tq, a->kseg, &lo, &hi, &flo, &fhi);
                if (hi <= lo) continue;
                pack_rows(qt, qb, a->dtype, H * D, x0, tq, D);
                for (int64_t y0 = flo; y0 < fhi; y0 += TK)
                    fwd_tile(&f, qt, x0, tq, y0, min64(TK, fhi - y0), 0);
                for (int64_t xs = x0; xs < x0 + tq; xs += TS) {
                    const int64_t ts = min64(TS, x0 + tq - xs);
                    int64_t slo, shi, sflo, sfhi;
                    dt_attn_rule_range(f.rule, 1, a->qseg, xs, xs + ts, a->kseg, &slo, &shi, &sflo,
                                       &sfhi);
                    int64_t side[2][2];
                    band_sides(slo, shi, flo, fhi, side);
                    for (int i = 0; i < 2; i++)
                        for (int64_t y0 = side[i][0]; y0 < side[i][1]; y0 += TK)
                            fwd_tile(&f, qt + (xs - x0) * D, xs, ts, y0,
                                     min64(TK, side[i][1] - y0), 1);
                }
            }
            if (a->last) finish_rows(&f, nq, (char *)a->o + qo, a->lse + ml);
        }
    return DT_SUCCESS;
}

/* ------------------------------------------------------------- backward */

static size_t bwd_scratch(int64_t dim) {
    /* q, dO tiles [TQ, D]; k, v tiles [TK, D]; P and dS [TQ, TK]; dK, dV tiles [TK, D] */
    return (size_t)(2 * TQ * dim + 4 * TK * dim + 2 * TQ * TK) * sizeof(float);
}

static dt_status delta_rows(struct dt_backend *be, dt_dtype dtype, int64_t batch, int64_t rows,
                           int64_t heads, int64_t dim, const void *o, const void *dout,
                           float *delta) {
    (void)be;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t x = 0; x < rows; x++)
            for (int64_t h = 0; h < heads; h++) {
                const int64_t base = ((b * rows + x) * heads + h) * dim;
                float sum = 0.0f;
                for (int64_t d = 0; d < dim; d++)
                    sum += dt_value_get(o, dtype, (size_t)(base + d)) *
                           dt_value_get(dout, dtype, (size_t)(base + d));
                delta[(b * heads + h) * rows + x] = sum;
            }
    return DT_SUCCESS;
}

/* dst rows (stride row_stride) += src [n, dim], or (set) = src; src NULL:
 * zeros. */
static void put_rows(float *dst, int64_t row_stride, const float *src, int64_t n, int64_t dim,
                     int set) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < dim; d++) {
            const float x = src ? src[i * dim + d] : 0.0f;
            dst[i * row_stride + d] = set ? x : dst[i * row_stride + d] + x;
        }
}

/* One (batch, head) of a backward call, and the scratch tiles. */
typedef struct bwd_head {
    const dt_attn_block_bwd_args *a;
    dt_attn_rule rule;           /* of the head's batch entry */
    const char *qb, *gb;         /* q and dO of the head */
    const float *lse, *delta;
    float *dq;
    float *qt, *dot, *kt, *vt, *dkt, *dvt, *p, *ds;
} bwd_head;

/* Query rows [x0, x0+tq) against keys [y, y+tk) of the packed key tile that
 * starts at key y0 (y - y0 rows into kt, vt, dkt, dvt), masked or not. */
static void bwd_tile(const bwd_head *f, int64_t x0, int64_t tq, int64_t y0, int64_t y, int64_t tk,
                     int masked) {
    const dt_attn_block_bwd_args *a = f->a;
    const int64_t H = a->heads, D = a->dim, off = (y - y0) * D;
    const float *kt = f->kt + off, *vt = f->vt + off;
    float *dkt = f->dkt + off, *dvt = f->dvt + off, *p = f->p, *ds = f->ds;
    pack_rows(f->qt, f->qb, a->dtype, H * D, x0, tq, D);
    pack_rows(f->dot, f->gb, a->dtype, H * D, x0, tq, D);
    /* P = exp(scale Q K^T - lse), masked */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tq, (int)tk, (int)D, a->scale,
                f->qt, (int)D, kt, (int)D, 0.0f, p, (int)tk);
    for (int64_t i = 0; i < tq; i++) {
        float *row = p + i * tk;
        const float li = f->lse[x0 + i];
        if (li == -INFINITY) {   /* the row attends nothing: P = 0 */
            memset(row, 0, (size_t)tk * sizeof *row);
            continue;
        }
        dt_nonfinite_nan(row, tk);
        if (masked) mask_row(f->rule, a->kseg, dt_attn_pos(a->qseg, x0 + i), y, row, tk);
        (void)dt_exp_shift(row, tk, li);
    }
    /* dP = dO V^T, then dS = P (dP - delta) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tq, (int)tk, (int)D, 1.0f, f->dot,
                (int)D, vt, (int)D, 0.0f, ds, (int)tk);
    for (int64_t i = 0; i < tq; i++) {
        const float di = f->delta[x0 + i];
        for (int64_t j = 0; j < tk; j++) ds[i * tk + j] = p[i * tk + j] * (ds[i * tk + j] - di);
    }
    /* dV += P^T dO ; dK += scale dS^T Q ; dQ += scale dS K */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)tk, (int)D, (int)tq, 1.0f, p,
                (int)tk, f->dot, (int)D, 1.0f, dvt, (int)D);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)tk, (int)D, (int)tq, a->scale, ds,
                (int)tk, f->qt, (int)D, 1.0f, dkt, (int)D);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)tq, (int)D, (int)tk, a->scale, ds,
                (int)tk, kt, (int)D, 1.0f, f->dq + x0 * H * D, (int)(H * D));
}

static dt_status bwd(struct dt_backend *be, const dt_attn_block_bwd_args *a, void *scratch) {
    (void)be;
    const int64_t H = a->heads, G = a->kv_heads, D = a->dim, group = H / G;
    const int64_t nk = a->kseg.len;
    const size_t es = dt_dtype_size(a->dtype);
    float *qt = scratch, *dot = qt + TQ * D, *kt = dot + TQ * D, *vt = kt + TK * D;
    float *dkt = vt + TK * D, *dvt = dkt + TK * D, *p = dvt + TK * D, *ds = p + TQ * TK;

    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / group;
            const size_t qoff = (size_t)(b * a->q_batch_stride + h * D) * es;
            const size_t koff = (size_t)(b * a->kv_batch_stride + g * D) * es;
            const char *kb = (const char *)a->k + koff, *vb = (const char *)a->v + koff;
            const int64_t ml = b * a->ml_batch_stride + h * a->ml_head_stride;
            float *dk = a->dk + b * a->kv_batch_stride + g * D;
            float *dv = a->dv + b * a->kv_batch_stride + g * D;
            /* the group's first head writes dk, dv of a `first` call */
            const int set = a->first && h % group == 0;
            const bwd_head f = {
                .a = a, .rule = dt_attn_block_bwd_rule(a, b),
                .qb = (const char *)a->q + qoff, .gb = (const char *)a->dout + qoff,
                .lse = a->lse + ml, .delta = a->delta + ml,
                .dq = a->dq + b * a->dq_batch_stride + h * D,
                .qt = qt, .dot = dot, .kt = kt, .vt = vt, .dkt = dkt, .dvt = dvt, .p = p, .ds = ds,
            };
            /* Key tiles outer: dK and dV of a tile accumulate over all query tiles. */
            for (int64_t y0 = 0; y0 < nk; y0 += TK) {
                const int64_t tk = min64(TK, nk - y0);
                /* queries [lo, hi) some key of the tile pairs with, [flo, fhi) every one */
                int64_t lo, hi, flo, fhi;
                dt_attn_rule_range(f.rule, 0, a->kseg, y0, y0 + tk, a->qseg, &lo, &hi, &flo, &fhi);
                if (hi <= lo) {   /* no query attends these keys */
                    if (set) {
                        put_rows(dk + y0 * G * D, G * D, NULL, tk, D, 1);
                        put_rows(dv + y0 * G * D, G * D, NULL, tk, D, 1);
                    }
                    continue;
                }
                pack_rows(kt, kb, a->dtype, G * D, y0, tk, D);
                pack_rows(vt, vb, a->dtype, G * D, y0, tk, D);
                memset(dkt, 0, (size_t)(2 * TK * D) * sizeof(float));
                for (int64_t x0 = flo; x0 < fhi; x0 += TQ)
                    bwd_tile(&f, x0, min64(TQ, fhi - x0), y0, y0, tk, 0);
                for (int64_t ys = y0; ys < y0 + tk; ys += TS) {
                    const int64_t ts = min64(TS, y0 + tk - ys);
                    int64_t slo, shi, sflo, sfhi;
                    dt_attn_rule_range(f.rule, 0, a->kseg, ys, ys + ts, a->qseg, &slo, &shi, &sflo,
                                       &sfhi);
                    int64_t side[2][2];
                    band_sides(slo, shi, flo, fhi, side);
                    for (int i = 0; i < 2; i++)
                        for (int64_t x0 = side[i][0]; x0 < side[i][1]; x0 += TQ)
                            bwd_tile(&f, x0, min64(TQ, side[i][1] - x0), y0, ys, ts, 1);
                }
                put_rows(dk + y0 * G * D, G * D, dkt, tk, D, set);
                put_rows(dv + y0 * G * D, G * D, dvt, tk, D, set);
            }
        }
    return DT_SUCCESS;
}

static dt_status store(struct dt_backend *be, dt_dtype dtype, size_t n, const float *src,
                       void *dst) {
    (void)be;
    dt_values_set(dst, dtype, n, src);
    return DT_SUCCESS;
}

const dt_attn_kernels dt_attn_kernels_cpu = {
    .name = "cpu",
    .fwd_scratch = fwd_scratch,
    .bwd_scratch = bwd_scratch,
    .fwd = fwd,
    .delta = delta_rows,
    .bwd = bwd,
    .store = store,
};
