/* tests/attn_ref.c — see attn_ref.h. O(B H S^2 D) in double; for tests. */
#include "attn_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/tensor.h"
#include "harness.h"

double *ref_input(uint64_t seed, int64_t n, dt_dtype dtype) {
    double *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) {
        x[i] = dt_value_round(dt_random_value(seed, (uint64_t)i), dtype);
    }
    return x;
}

/* The document of token i of batch row b, by the rule's lengths (one list
 * for every row when they sum to S, else row b's part of B lists). */
static int64_t doc_of(const attn_shape *s, const attn_ref_rule *r, int64_t b, int64_t i) {
    int64_t total = 0;
    for (int64_t d = 0; d < r->doc_count; d++) total += r->doc_lens[d];
    const int64_t target = (total == s->S ? 0 : b * s->S) + i;
    int64_t end = 0;
    for (int64_t d = 0; d < r->doc_count; d++)
        if (target < (end += r->doc_lens[d])) return d;
    return -1;
}

int ref_rule_allows(const attn_shape *s, const attn_ref_rule *r, int64_t b, int64_t i, int64_t j) {
    if (r->causal && j > i) return 0;
    if (r->window > 0 && (i - j >= r->window || j - i >= r->window)) return 0;
    return !r->doc_lens || doc_of(s, r, b, i) == doc_of(s, r, b, j);
}

/* Probabilities p[j] (j < S; 0 where the rule forbids) of query row i of
 * head h; returns lse (-inf with no key allowed). */
static double row_probs(const attn_shape *s, const attn_ref_rule *r, const double *q,
                        const double *k, int64_t b, int64_t h, int64_t i, double scale, double *p,
                        char *ok) {
    int64_t g = h / (s->H / s->Hkv);
    const double *qi = q + ((b * s->S + i) * s->H + h) * s->D;
    double mx = -INFINITY;
    for (int64_t j = 0; j < s->S; j++) {
        ok[j] = (char)ref_rule_allows(s, r, b, i, j);
        if (!ok[j]) continue;
        const double *kj = k + ((b * s->S + j) * s->Hkv + g) * s->D;
        double dot = 0;
        for (int64_t d = 0; d < s->D; d++) dot += qi[d] * kj[d];
        p[j] = scale * dot;
        if (p[j] > mx) mx = p[j];
    }
    double sum = 0;
    for (int64_t j = 0; j < s->S; j++) sum += (p[j] = ok[j] ? exp(p[j] - mx) : 0.0);
    for (int64_t j = 0; j < s->S; j++) p[j] = sum > 0 ? p[j] / sum : 0.0;
    return sum > 0 ? mx + log(sum) : -INFINITY;
}

void ref_attention_forward_rule(const attn_shape *s, const attn_ref_rule *r, const double *q,
                                const double *k, const double *v, double scale, double *o,
                                double *lse) {
    double *p = malloc((size_t)s->S * sizeof *p);
    char *ok = malloc((size_t)s->S);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < s->S; i++) {
                int64_t g = h / (s->H / s->Hkv);
                lse[(b * s->H + h) * s->S + i] = row_probs(s, r, q, k, b, h, i, scale, p, ok);
                double *oi = o + ((b * s->S + i) * s->H + h) * s->D;
                for (int64_t d = 0; d < s->D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < s->S; j++)
                        if (ok[j]) acc += p[j] * v[((b * s->S + j) * s->Hkv + g) * s->D + d];
                    oi[d] = acc;
                }
            }
    free(p);
    free(ok);
}

void ref_attention_forward(const attn_shape *s, const double *q, const double *k,
                           const double *v, int causal, double scale, double *o, double *lse) {
    const attn_ref_rule r = {.causal = causal};
    ref_attention_forward_rule(s, &r, q, k, v, scale, o, lse);
}

void ref_attention_backward_rule(const attn_shape *s, const attn_ref_rule *r, const double *q,
                                 const double *k, const double *v, const double *dout,
                                 double scale, double *dq, double *dk, double *dv) {
    int64_t D = s->D;
    memset(dq, 0, (size_t)(s->B * s->S * s->H * D) * sizeof *dq);
    memset(dk, 0, (size_t)(s->B * s->S * s->Hkv * D) * sizeof *dk);
    memset(dv, 0, (size_t)(s->B * s->S * s->Hkv * D) * sizeof *dv);
    double *p = malloc((size_t)s->S * sizeof *p), *o = malloc((size_t)D * sizeof *o);
    char *ok = malloc((size_t)s->S);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < s->S; i++) {
                int64_t g = h / (s->H / s->Hkv);
                row_probs(s, r, q, k, b, h, i, scale, p, ok);
                const double *doi = dout + ((b * s->S + i) * s->H + h) * D;
                const double *qi = q + ((b * s->S + i) * s->H + h) * D;
                double *dqi = dq + ((b * s->S + i) * s->H + h) * D;
                memset(o, 0, (size_t)D * sizeof *o);
                for (int64_t j = 0; j < s->S; j++)
                    if (ok[j])
                        for (int64_t d = 0; d < D; d++)
                            o[d] += p[j] * v[((b * s->S + j) * s->Hkv + g) * D + d];
                double delta = 0;
                for (int64_t d = 0; d < D; d++) delta += doi[d] * o[d];
                for (int64_t j = 0; j < s->S; j++) {
                    if (!ok[j]) continue;
                    const double *vj = v + ((b * s->S + j) * s->Hkv + g) * D;
                    const double *kj = k + ((b * s->S + j) * s->Hkv + g) * D;
                    double *dkj = dk + ((b * s->S + j) * s->Hkv + g) * D;
                    double *dvj = dv + ((b * s->S + j) * s->Hkv + g) * D;
                    double dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += doi[d] * vj[d];
                    double ds = p[j] * (dp - delta);
                    for (int64_t d = 0; d < D; d++) {
                        dvj[d] += p[j] * doi[d];
                        dqi[d] += scale * ds * kj[d];
                        dkj[d] += scale * ds * qi[d];
                    }
                }
            }
    free(p);
    free(o);
    free(ok);
}

void ref_attention_backward(const attn_shape *s, const double *q, const double *k,
                            const double *v, const double *dout, int causal, double scale,
                            double *dq, double *dk, double *dv) {
    const attn_ref_rule r = {.causal = causal};
    ref_attention_backward_rule(s, &r, q, k, v, dout, scale, dq, dk, dv);
}

void ref_local_rows(const double *full, int64_t B, int64_t S, int64_t heads, int64_t D,
                    dt_order order, int P, int j, int t, int64_t heads_local, double *out) {
    int64_t c = S / P, *idx = malloc((size_t)c * sizeof *idx);
    h_order_indices(order, S, P, j, idx);
    for (int64_t b = 0; b < B; b++)
        for (int64_t x = 0; x < c; x++)
            for (int64_t h = 0; h < heads_local; h++)
                memcpy(out + ((b * c + x) * heads_local + h) * D,
                       full + ((b * S + idx[x]) * heads + t * heads_local + h) * D,
                       (size_t)D * sizeof *out);
    free(idx);
}

void ref_local_lse(const double *full, int64_t B, int64_t S, int64_t heads, dt_order order,
                   int P, int j, int t, int64_t heads_local, double *out) {
    int64_t c = S / P, *idx = malloc((size_t)c * sizeof *idx);
    h_order_indices(order, S, P, j, idx);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < heads_local; h++)
            for (int64_t x = 0; x < c; x++)
                out[(b * heads_local + h) * c + x] = full[(b * heads + t * heads_local + h) * S + idx[x]];
    free(idx);
}

dt_status ref_get_f32(const dt_tensor *t, float *out) {
    size_t n = (size_t)dt_tensor_local_numel(t);
    dt_dtype dtype = dt_tensor_dtype(t);
    if (dtype == DT_F32) return dt_tensor_get_local(t, out, n * sizeof *out);
    void *tmp = malloc(n * dt_dtype_size(dtype) + 1);
    dt_status st = tmp ? dt_tensor_get_local(t, tmp, n * dt_dtype_size(dtype))
                       : dt_error(DT_ERR_OUT_OF_MEMORY, "ref_get_f32: out of memory");
    for (size_t i = 0; st == DT_SUCCESS && i < n; i++) out[i] = dt_value_get(tmp, dtype, i);
    free(tmp);
    return st;
}

dt_status ref_set_local(struct dt_tensor *t, const double *local) {
    size_t n = (size_t)dt_tensor_local_numel(t);
    dt_dtype dt = dt_tensor_dtype(t);
    size_t es = dt_dtype_size(dt);
    unsigned char *buf = malloc(n * es + 1);
    if (!buf) return dt_error(DT_ERR_OUT_OF_MEMORY, "ref_set_local: out of host memory");
    for (size_t i = 0; i < n; i++) dt_value_set(buf, dt, i, (float)local[i]);
    dt_status st = dt_tensor_set_local(t, buf, n * es);
    free(buf);
    return st;
}
