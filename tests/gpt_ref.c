/* tests/gpt_ref.c — see gpt_ref.h. Plain loops in double, one sequence at a
 * time; shapes as in the model's definition (row-major, W [in, out]). */
#include "gpt_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *open_in(const char *dir, const char *name, const char *mode) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fopen(path, mode);
}

int gpt_ref_load(gpt_ref *r, const char *dir) {
    memset(r, 0, sizeof *r);
    FILE *f = open_in(dir, "config.txt", "r");
    if (!f) {
        fprintf(stderr, "gpt_ref: no %s/config.txt\n", dir);
        return -1;
    }
    char key[64];
    double val;
    int keys = 0;
    while (fscanf(f, "%63s %lf", key, &val) == 2) {
        keys++;
#define K(name, field) if (!strcmp(key, name)) r->field = (__typeof__(r->field))val;
        K("vocab", vocab) K("layers", layers) K("dim", dim) K("heads", heads)
        K("kv_heads", kv_heads) K("ffn", ffn) K("seq", seq) K("batch", batch) K("steps", steps)
        K("lr", lr) K("beta1", beta1) K("beta2", beta2) K("eps", eps)
        K("weight_decay", weight_decay) K("clip", clip) K("rope_base", rope_base)
        K("norm_eps", norm_eps) K("packed", packed)
#undef K
    }
    fclose(f);
    if (keys != 17 + (r->packed != 0)) {
        fprintf(stderr, "gpt_ref: %s/config.txt has %d keys, not 17 (18 with packed)\n", dir, keys);
        return -1;
    }
    if (r->packed) {
        f = open_in(dir, "separator.bin", "rb");
        r->sep_len = f ? (int)fread(r->sep, 1, sizeof r->sep, f) : 0;
        if (f) fclose(f);
        if (r->sep_len < 1) {
            fprintf(stderr, "gpt_ref: packed, but no separator in %s/separator.bin\n", dir);
            return -1;
        }
    }
    r->np = (int)(2 + 9 * r->layers + 1);
    r->name = calloc((size_t)r->np, sizeof *r->name);
    r->ndim = calloc((size_t)r->np, sizeof *r->ndim);
    r->shape = calloc((size_t)r->np, sizeof *r->shape);
    r->offset = calloc((size_t)r->np, sizeof *r->offset);
    f = open_in(dir, "params.txt", "r");
    if (!f || !r->name || !r->ndim || !r->shape || !r->offset) {
        fprintf(stderr, "gpt_ref: no %s/params.txt\n", dir);
        if (f) fclose(f);
        return -1;
    }
    char line[256];
    int i = 0;
    while (i < r->np && fgets(line, sizeof line, f)) {
        long long a = 0, b = 0;
        const int n = sscanf(line, "%63s %lld %lld", r->name[i], &a, &b);
        if (n < 2) continue;
        r->ndim[i] = n - 1;
        r->shape[i][0] = a;
        r->shape[i][1] = n == 3 ? b : 1;
        r->offset[i] = r->total;
        r->total += a * (n == 3 ? b : 1);
        i++;
    }
    fclose(f);
    if (i != r->np) {
        fprintf(stderr, "gpt_ref: %s/params.txt lists %d parameters, not %d\n", dir, i, r->np);
        return -1;
    }
    const size_t n = (size_t)r->total;
    r->w = calloc(n, sizeof *r->w), r->grad = calloc(n, sizeof *r->grad);
    r->m = calloc(n, sizeof *r->m), r->v = calloc(n, sizeof *r->v);
    float *init = malloc(n * sizeof *init);
    f = open_in(dir, "init.bin", "rb");
    const int ok = r->w && r->grad && r->m && r->v && init && f && fread(init, sizeof *init, n, f) == n;
    if (f) fclose(f);
    for (size_t j = 0; ok && j < n; j++) r->w[j] = init[j];
    free(init);
    if (!ok) fprintf(stderr, "gpt_ref: %s/init.bin is missing or short\n", dir);
    return ok ? 0 : -1;
}

void gpt_ref_free(gpt_ref *r) {
    free(r->name), free(r->ndim), free(r->shape), free(r->offset);
    free(r->w), free(r->grad), free(r->m), free(r->v);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- helpers */

/* y[n][o] (+)= x[n][i] @ w[i][o] */
static void mm(const double *x, const double *w, double *y, int64_t n, int64_t in, int64_t out, int add) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t o = 0; o < out; o++) {
            double s = add ? y[t * out + o] : 0.0;
            for (int64_t i = 0; i < in; i++) s += x[t * in + i] * w[i * out + o];
            y[t * out + o] = s;
        }
}

/* dx[n][i] (+)= dy[n][o] @ w^T; dw[i][o] += x^T dy */
static void mm_back(const double *x, const double *w, const double *dy, double *dx, double *dw,
                    int64_t n, int64_t in, int64_t out, int add_dx) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < in; i++) {
            double s = add_dx ? dx[t * in + i] : 0.0;
            for (int64_t o = 0; o < out; o++) s += dy[t * out + o] * w[i * out + o];
            dx[t * in + i] = s;
        }
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++) {
            double s = 0.0;
            for (int64_t t = 0; t < n; t++) s += x[t * in + i] * dy[t * out + o];
            dw[i * out + o] += s;
        }
}

static void rmsnorm(const double *x, const double *w, double eps, double *y, double *r, int64_t n,
                    int64_t d) {
    for (int64_t t = 0; t < n; t++) {
        double ss = 0.0;
        for (int64_t j = 0; j < d; j++) ss += x[t * d + j] * x[t * d + j];
        r[t] = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t j = 0; j < d; j++) y[t * d + j] = x[t * d + j] * r[t] * w[j];
    }
}

/* dx (+)= the gradient through y = x r w; dw += */
static void rmsnorm_back(const double *x, const double *w, const double *r, const double *dy,
                         double *dx, double *dw, int64_t n, int64_t d, int add) {
    for (int64_t t = 0; t < n; t++) {
        double dot = 0.0;
        for (int64_t j = 0; j < d; j++) dot += dy[t * d + j] * w[j] * x[t * d + j];
        for (int64_t j = 0; j < d; j++) {
            const double g = r[t] * w[j] * dy[t * d + j] - x[t * d + j] * r[t] * r[t] * r[t] * dot / (double)d;
            dx[t * d + j] = (add ? dx[t * d + j] : 0.0) + g;
            dw[j] += dy[t * d + j] * x[t * d + j] * r[t];
        }
    }
}

/* Rotates pairs (i, i + Dh/2) of each head of x [n][heads * Dh] of token t
 * by sign * (t - start[t]) * base^(-2i/Dh), in place. */
static void rotary(double *x, int64_t n, int64_t heads, int64_t Dh, double base, double sign,
                   const int64_t *start) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < Dh / 2; i++) {
                const double th = sign * (double)(t - start[t]) * pow(base, -2.0 * (double)i / (double)Dh);
                double *a = x + t * heads * Dh + h * Dh + i, *b = a + Dh / 2;
                const double c = cos(th), s = sin(th), a0 = *a, b0 = *b;
                *a = a0 * c - b0 * s;
                *b = a0 * s + b0 * c;
            }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double *P(gpt_ref *r, int i) { return r->w + r->offset[i]; }
static double *G(gpt_ref *r, int i) { return r->grad + r->offset[i]; }

/* --------------------------------------------------------- one sequence */

typedef struct acts {
    double *h, *a, *ra, *q, *k, *v, *p, *o, *h1, *m, *rm, *g, *u, *sw;
} acts;

static double sequence(gpt_ref *r, const int32_t *tok, int want_grad, double inv_count) {
    const int64_t S = r->seq, d = r->dim, H = r->heads, Hkv = r->kv_heads, Dh = d / H, F = r->ffn;
    const int64_t V = r->vocab, L = r->layers, qd = H * Dh, kvd = Hkv * Dh, grp = H / Hkv;
    const double scale = 1.0 / sqrt((double)Dh);
    /* start[t]: the first token of t's document; token t attends u in [start[t], t] */
    int64_t *start = calloc((size_t)S, sizeof *start);
    for (int64_t t = 1; t < S; t++) {
        int sep = r->packed && t >= r->sep_len;
        for (int i = 0; sep && i < r->sep_len; i++) sep = tok[t - r->sep_len + i] == r->sep[i];
        start[t] = sep ? t : start[t - 1];
    }
    acts *A = calloc((size_t)L, sizeof *A);
    double *hL = calloc((size_t)(S * d), sizeof(double)), *n = calloc((size_t)(S * d), sizeof(double));
    double *rn = calloc((size_t)S, sizeof(double)), *lg = calloc((size_t)(S * V), sizeof(double));
    double *cur = calloc((size_t)(S * d), sizeof(double));
    for (int64_t t = 0; t < S; t++) memcpy(cur + t * d, P(r, 0) + (int64_t)tok[t] * d, (size_t)d * sizeof(double));
    for (int64_t l = 0; l < L; l++) {
        acts *x = &A[l];
        const int b = 1 + (int)l * 9;
#define NEW(f, cnt) x->f = calloc((size_t)(cnt), sizeof(double))
        NEW(h, S * d); NEW(a, S * d); NEW(ra, S); NEW(q, S * qd); NEW(k, S * kvd); NEW(v, S * kvd);
        NEW(p, H * S * S); NEW(o, S * qd); NEW(h1, S * d); NEW(m, S * d); NEW(rm, S);
        NEW(g, S * F); NEW(u, S * F); NEW(sw, S * F);
#undef NEW
        memcpy(x->h, cur, (size_t)(S * d) * sizeof(double));
        rmsnorm(x->h, P(r, b + 0), r->norm_eps, x->a, x->ra, S, d);
        mm(x->a, P(r, b + 1), x->q, S, d, qd, 0);
        mm(x->a, P(r, b + 2), x->k, S, d, kvd, 0);
        mm(x->a, P(r, b + 3), x->v, S, d, kvd, 0);
        rotary(x->q, S, H, Dh, r->rope_base, 1.0, start);
        rotary(x->k, S, Hkv, Dh, r->rope_base, 1.0, start);
        for (int64_t hd = 0; hd < H; hd++) {
            const int64_t kh = hd / grp;
            for (int64_t t = 0; t < S; t++) {
                double *pr = x->p + (hd * S + t) * S, mx = -INFINITY, sum = 0.0;
                for (int64_t u = start[t]; u <= t; u++) {
                    double s = 0.0;
                    for (int64_t e = 0; e < Dh; e++) s += x->q[t * qd + hd * Dh + e] * x->k[u * kvd + kh * Dh + e];
                    pr[u] = scale * s;
                    mx = fmax(mx, pr[u]);
                }
                for (int64_t u = start[t]; u <= t; u++) sum += (pr[u] = exp(pr[u] - mx));
                for (int64_t u = start[t]; u <= t; u++) pr[u] /= sum;
                for (int64_t e = 0; e < Dh; e++) {
                    double s = 0.0;
                    for (int64_t u = start[t]; u <= t; u++) s += pr[u] * x->v[u * kvd + kh * Dh + e];
                    x->o[t * qd + hd * Dh + e] = s;
                }
            }
        }
        memcpy(x->h1, x->h, (size_t)(S * d) * sizeof(double));
        mm(x->o, P(r, b + 4), x->h1, S, qd, d, 1);
        rmsnorm(x->h1, P(r, b + 5), r->norm_eps, x->m, x->rm, S, d);
        mm(x->m, P(r, b + 6), x->g, S, d, F, 0);
        mm(x->m, P(r, b + 7), x->u, S, d, F, 0);
        for (int64_t j = 0; j < S * F; j++) x->sw[j] = x->g[j] * sigmoid(x->g[j]) * x->u[j];
        memcpy(cur, x->h1, (size_t)(S * d) * sizeof(double));
        mm(x->sw, P(r, b + 8), cur, S, F, d, 1);
    }
    memcpy(hL, cur, (size_t)(S * d) * sizeof(double));
    const int fn = r->np - 2, head = r->np - 1;
    rmsnorm(hL, P(r, fn), r->norm_eps, n, rn, S, d);
    mm(n, P(r, head), lg, S, d, V, 0);
    double loss = 0.0;
    for (int64_t t = 0; t < S; t++) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t c = 0; c < V; c++) mx = fmax(mx, lg[t * V + c]);
        for (int64_t c = 0; c < V; c++) sum += exp(lg[t * V + c] - mx);
        const double lse = mx + log(sum);
        loss += lse - lg[t * V + tok[t + 1]];
        for (int64_t c = 0; c < V; c++)   /* dlogits, in place */
            lg[t * V + c] = (exp(lg[t * V + c] - lse) - (c == tok[t + 1])) * inv_count;
    }
    if (want_grad) {
        double *dn = calloc((size_t)(S * d), sizeof(double)), *dh = calloc((size_t)(S * d), sizeof(double));
        mm_back(n, P(r, head), lg, dn, G(r, head), S, d, V, 0);
        rmsnorm_back(hL, P(r, fn), rn, dn, dh, G(r, fn), S, d, 0);
        double *t1 = calloc((size_t)(S * (F > qd ? F : qd)), sizeof(double));
        double *t2 = calloc((size_t)(S * F), sizeof(double)), *dm = calloc((size_t)(S * d), sizeof(double));
        double *dq = calloc((size_t)(S * qd), sizeof(double)), *dk = calloc((size_t)(S * kvd), sizeof(double));
        double *dv = calloc((size_t)(S * kvd), sizeof(double)), *da = calloc((size_t)(S * d), sizeof(double));
        for (int64_t l = L - 1; l >= 0; l--) {
            acts *x = &A[l];
            const int b = 1 + (int)l * 9;
            /* h2 = h1 + sw @ Wd: dh1 = dh (kept in dh) */
            double *dsw = t1, *dgt = t2;
            mm_back(x->sw, P(r, b + 8), dh, dsw, G(r, b + 8), S, F, d, 0);
            double *du = calloc((size_t)(S * F), sizeof(double));
            for (int64_t j = 0; j < S * F; j++) {
                const double sg = sigmoid(x->g[j]), silu = x->g[j] * sg;
                dgt[j] = dsw[j] * x->u[j] * sg * (1.0 + x->g[j] * (1.0 - sg));
                du[j] = dsw[j] * silu;
            }
            mm_back(x->m, P(r, b + 6), dgt, dm, G(r, b + 6), S, d, F, 0);
            mm_back(x->m, P(r, b + 7), du, dm, G(r, b + 7), S, d, F, 1);
            free(du);
            rmsnorm_back(x->h1, P(r, b + 5), x->rm, dm, dh, G(r, b + 5), S, d, 1);
            /* h1 = h + o @ Wo */
            double *dO = t1;
            mm_back(x->o, P(r, b + 4), dh, dO, G(r, b + 4), S, qd, d, 0);
            memset(dq, 0, (size_t)(S * qd) * sizeof(double));
            memset(dk, 0, (size_t)(S * kvd) * sizeof(double));
            memset(dv, 0, (size_t)(S * kvd) * sizeof(double));
            for (int64_t hd = 0; hd < H; hd++) {
                const int64_t kh = hd / grp;
                for (int64_t t = 0; t < S; t++) {
                    const double *pr = x->p + (hd * S + t) * S;
                    double dp[4096], dsum = 0.0;
                    for (int64_t u = start[t]; u <= t; u++) {
                        double s = 0.0;
                        for (int64_t e = 0; e < Dh; e++) s += dO[t * qd + hd * Dh + e] * x->v[u * kvd + kh * Dh + e];
                        dp[u] = s;
                        dsum += pr[u] * s;
                        for (int64_t e = 0; e < Dh; e++) dv[u * kvd + kh * Dh + e] += pr[u] * dO[t * qd + hd * Dh + e];
                    }
                    for (int64_t u = start[t]; u <= t; u++) {
                        const double ds = pr[u] * (dp[u] - dsum) * scale;
                        for (int64_t e = 0; e < Dh; e++) {
                            dq[t * qd + hd * Dh + e] += ds * x->k[u * kvd + kh * Dh + e];
                            dk[u * kvd + kh * Dh + e] += ds * x->q[t * qd + hd * Dh + e];
                        }
                    }
                }
            }
            rotary(dq, S, H, Dh, r->rope_base, -1.0, start);
            rotary(dk, S, Hkv, Dh, r->rope_base, -1.0, start);
            mm_back(x->a, P(r, b + 1), dq, da, G(r, b + 1), S, d, qd, 0);
            mm_back(x->a, P(r, b + 2), dk, da, G(r, b + 2), S, d, kvd, 1);
            mm_back(x->a, P(r, b + 3), dv, da, G(r, b + 3), S, d, kvd, 1);
            rmsnorm_back(x->h, P(r, b + 0), x->ra, da, dh, G(r, b + 0), S, d, 1);
        }
        for (int64_t t = 0; t < S; t++)
            for (int64_t j = 0; j < d; j++) G(r, 0)[(int64_t)tok[t] * d + j] += dh[t * d + j];
        free(dn), free(dh), free(t1), free(t2), free(dm), free(dq), free(dk), free(dv), free(da);
    }
    for (int64_t l = 0; l < L; l++) {
        acts *x = &A[l];
        free(x->h), free(x->a), free(x->ra), free(x->q), free(x->k), free(x->v), free(x->p);
        free(x->o), free(x->h1), free(x->m), free(x->rm), free(x->g), free(x->u), free(x->sw);
    }
    free(A), free(hL), free(n), free(rn), free(lg), free(cur), free(start);
    return loss;
}

static double batch(gpt_ref *r, const int32_t *tokens, int want_grad) {
    if (want_grad) memset(r->grad, 0, (size_t)r->total * sizeof *r->grad);
    const double inv = 1.0 / (double)(r->batch * r->seq);
    double loss = 0.0;
    for (int64_t b = 0; b < r->batch; b++) loss += sequence(r, tokens + b * (r->seq + 1), want_grad, inv);
    return loss * inv;
}

double gpt_ref_loss_grad(gpt_ref *r, const int32_t *tokens) { return batch(r, tokens, 1); }
double gpt_ref_loss(gpt_ref *r, const int32_t *tokens) { return batch(r, tokens, 0); }

double gpt_ref_step(gpt_ref *r, const int32_t *tokens, int64_t step, double lr, double *norm) {
    const double loss = batch(r, tokens, 1);
    double sq = 0.0;
    for (int64_t j = 0; j < r->total; j++) sq += r->grad[j] * r->grad[j];
    *norm = sqrt(sq);
    double scale = 1.0;
    if (r->clip > 0) {
        const double coef = r->clip / (*norm + 1e-6);
        if (coef < 1.0) scale = coef;
    }
    const double bc1 = 1.0 - pow(r->beta1, (double)step), bc2 = 1.0 - pow(r->beta2, (double)step);
    for (int i = 0; i < r->np; i++) {
        const double wd = r->ndim[i] >= 2 ? r->weight_decay : 0.0;
        const int64_t n = r->shape[i][0] * r->shape[i][1];
        for (int64_t j = r->offset[i]; j < r->offset[i] + n; j++) {
            const double g = r->grad[j] * scale;
            r->m[j] = r->beta1 * r->m[j] + (1.0 - r->beta1) * g;
            r->v[j] = r->beta2 * r->v[j] + (1.0 - r->beta2) * g * g;
            r->w[j] -= lr * wd * r->w[j];
            r->w[j] -= lr * (r->m[j] / bc1) / (sqrt(r->v[j] / bc2) + r->eps);
        }
    }
    return loss;
}
