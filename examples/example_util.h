/* examples/example_util.h — helpers shared by the example programs
 * (striped_attention, tensor_parallel_mlp, transformer_block) and the benches
 * (bench/attention, bench/blocks, bench/mlp).
 *
 * Header-only: every .c file in examples/ is its own program, so everything here is
 * static. Define NAME (the program's name, a string literal) before
 * including it; the flag parsers print it in their messages.
 *
 *   timing       ex_now_s, ex_median
 *   weights      ex_weight_scale, ex_transform_local, ex_make_weight
 *   results      ex_to_host_f32, ex_check_result
 *   the MLP      ex_mlp_forward (through the library), ex_ref_matmul and
 *                ex_ref_gelu (the double-precision reference)
 *   flags        ex_parse_int, ex_parse_ints, ex_parse_choice, ex_parse_choices,
 *                ex_parse_seed, ex_parse_dtype, ex_parse_backend,
 *                ex_default_kv_heads
 *   documents    ex_docs_parse_list, ex_docs_draw (--docs L1,L2,... and
 *                random:MEAN of striped_attention and bench/attention)
 */
#ifndef DT_EXAMPLE_UTIL_H
#define DT_EXAMPLE_UTIL_H

#ifndef NAME
#error "define NAME (the program's name) before including examples/example_util.h"
#endif

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtensor/dtensor.h"

/* ------------------------------------------------------------------------
 * Timing.
 * ---------------------------------------------------------------------- */

static inline double ex_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int ex_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), n >= 1; sorts v in place (v[0] is then the
 * minimum, v[n - 1] the maximum). */
static inline double ex_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, ex_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ------------------------------------------------------------------------
 * Weights.
 * ---------------------------------------------------------------------- */

/* Matrices are scaled by 2^-k with 2^k near sqrt(fan_in / 3): the inputs are
 * uniform in [-1, 1) (variance 1/3), so each matmul keeps the variance of
 * its input, and a power of two scales exactly in fp32 and bf16. */
static inline float ex_weight_scale(int64_t fan_in) {
    return ldexpf(1.0f, -(int)lround(0.5 * log2((double)fan_in / 3.0)));
}

/* t = offset + scale * t on the local buffer, through host memory (any
 * backend), computed in fp32 and stored in t's dtype. */
static inline dt_status ex_transform_local(dt_tensor *t, float offset, float scale) {
    size_t n = (size_t)dt_tensor_local_numel(t), bytes = dt_tensor_local_bytes(t);
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory for %zu bytes", bytes);
    dt_status st = dt_tensor_get_local(t, h, bytes);
    dt_dtype dtype = dt_tensor_dtype(t);
    for (size_t i = 0; st == DT_SUCCESS && i < n; i++)
        dt_value_set(h, dtype, i, offset + scale * dt_value_get(h, dtype, i));
    if (st == DT_SUCCESS) st = dt_tensor_set_local(t, h, bytes);
    free(h);
    return st;
}

/* A weight [rows, cols] made whole on rank 0 (dt_tensor_fill_random from
 * `seed`, scaled by ex_weight_scale(rows)) and scattered under `l`.
 * Collective over the mesh. */
static inline dt_status ex_make_weight(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype,
                                       int64_t rows, int64_t cols, uint64_t seed,
                                       const dt_layout *l, dt_tensor **out) {
    dt_tensor *full = NULL;
    dt_status st = DT_SUCCESS;
    if (dt_context_rank(ctx) == 0) {
        const int64_t shape[2] = {rows, cols};
        DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, dtype, 2, shape, NULL, &full), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(full, seed), out);
        DT_TRY_GOTO(st, ex_transform_local(full, 0.0f, ex_weight_scale(rows)), out);
    }
    /* Every rank must make the collective call, also when rank 0 failed
     * above: the launch is aborted then and the others return at once. */
out:
    if (st == DT_SUCCESS) st = dt_tensor_shard(mesh, 0, full, l, out);
    dt_tensor_destroy(full);
    return st;
}

/* ------------------------------------------------------------------------
 * Results.
 * ---------------------------------------------------------------------- */

/* A local (gathered) tensor as a new fp32 host array; bf16 and fp16 are widened. */
static inline dt_status ex_to_host_f32(const dt_tensor *t, float **out) {
    size_t n = (size_t)dt_tensor_local_numel(t);
    float *f = malloc((n ? n : 1) * sizeof *f);
    void *raw = malloc(dt_tensor_local_bytes(t) + 1);
    dt_status st = f && raw ? dt_tensor_get_local(t, raw, dt_tensor_local_bytes(t))
                            : dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory for %zu floats", n);
    for (size_t i = 0; st == DT_SUCCESS && i < n; i++) f[i] = dt_value_get(raw, dt_tensor_dtype(t), i);
    free(raw);
    if (st != DT_SUCCESS) {
        free(f);
        return st;
    }
    *out = f;
    return DT_SUCCESS;
}

/* got[0..n) against the double reference ref[0..n), elementwise within
 * atol + rtol * |ref|. */
typedef struct ex_check {
    double max_err; /* max |got - ref|; INFINITY if any got is not finite */
    double worst;   /* max |got - ref| / tolerance */
    double ref_ss;  /* sum of ref^2 */
    long bad;       /* elements outside the tolerance (or not finite) */
} ex_check;

static inline ex_check ex_check_result(const float *got, const double *ref, int64_t n, double atol,
                                       double rtol) {
    ex_check c = {0, 0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], e = fabs(g - ref[i]), tol = atol + rtol * fabs(ref[i]);
        c.ref_ss += ref[i] * ref[i];
        if (e / tol > c.worst) c.worst = e / tol;
        if (!isfinite(g) || !(e <= tol)) c.bad++;
        if (!isfinite(g)) c.max_err = INFINITY;
        else if (e > c.max_err) c.max_err = e;
    }
    return c;
}

/* ------------------------------------------------------------------------
 * The MLP, Y = GELU(X W1) W2.
 * ---------------------------------------------------------------------- */

/* Through the library: W1 column-parallel, W2 row-parallel, so G @ W2 is
 * Partial and is redistributed to *out_layout (an all-reduce, or a
 * reduce-scatter) into *y. lay_h, lay_g, lay_p (each may be NULL, 128 bytes
 * otherwise) receive the Layouts of H = x @ w1, G = GELU(H) and the Partial
 * G @ w2. Collective over the mesh. */
static inline dt_status ex_mlp_forward(const dt_tensor *x, const dt_tensor *w1,
                                       const dt_tensor *w2, const dt_layout *out_layout,
                                       dt_tensor **y, char *lay_h, char *lay_g, char *lay_p) {
    dt_tensor *h = NULL, *g = NULL, *yp = NULL;
    dt_status st;
    DT_TRY_GOTO(st, dt_matmul(x, w1, &h), out);          /* [R] @ [S(1)] -> [S(2)] */
    if (lay_h) dt_layout_format(dt_tensor_layout(h), lay_h, 128);
    DT_TRY_GOTO(st, dt_gelu(h, DT_GELU_ERF, &g), out);   /* local */
    if (lay_g) dt_layout_format(dt_tensor_layout(g), lay_g, 128);
    DT_TRY_GOTO(st, dt_matmul(g, w2, &yp), out);         /* [S(2)] @ [S(0)] -> [Partial] */
    if (lay_p) dt_layout_format(dt_tensor_layout(yp), lay_p, 128);
    DT_TRY_GOTO(st, dt_tensor_redistribute(yp, out_layout, y), out);
out:
    dt_tensor_destroy(yp);
    dt_tensor_destroy(g);
    dt_tensor_destroy(h);
    return st;
}

/* The reference in double: y[M, N] = x[M, K] @ w[K, N], summed in k order. */
static inline void ex_ref_matmul(const double *x, const double *w, int64_t M, int64_t K, int64_t N,
                                 double *y) {
    for (int64_t m = 0; m < M; m++) {
        double *ym = y + m * N;
        for (int64_t n = 0; n < N; n++) ym[n] = 0;
        for (int64_t k = 0; k < K; k++) {
            const double xv = x[m * K + k];
            const double *wr = w + k * N;
            for (int64_t n = 0; n < N; n++) ym[n] += xv * wr[n];
        }
    }
}

/* t = GELU(t), the erf form, in place. */
static inline void ex_ref_gelu(double *t, int64_t n) {
    for (int64_t i = 0; i < n; i++) t[i] = 0.5 * t[i] * (1.0 + erf(t[i] / sqrt(2.0)));
}

/* ------------------------------------------------------------------------
 * Flags. Each prints its complaint (prefixed with NAME) and fails.
 * ---------------------------------------------------------------------- */

/* 1 and *out = the integer v in [lo, hi], else 0. */
static inline int ex_parse_int(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, NAME ": %s takes an integer in [%ld, %ld], got '%s'\n", flag, lo, hi,
                v ? v : "(nothing)");
        return 0;
    }
    *out = x;
    return 1;
}

/* The index of v among names[0..n), else -1. */
static inline int ex_parse_choice(const char *flag, const char *v, const char *const *names, int n) {
    for (int i = 0; v && i < n; i++)
        if (!strcmp(v, names[i])) return i;
    fprintf(stderr, NAME ": %s takes one of", flag);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s %s", i ? "," : "", names[i]);
    fprintf(stderr, "; got '%s'\n", v ? v : "(nothing)");
    return -1;
}

/* A list "1,2,4" of at most max integers in [lo, hi]: 1 and out[0..*n),
 * else 0 with a message (an empty list, too many entries, a bad one). */
static inline int ex_parse_ints(const char *flag, const char *v, long lo, long hi, int max,
                                long *out, int *n) {
    char buf[256];
    *n = 0;
    if (v && strlen(v) < sizeof buf) {
        snprintf(buf, sizeof buf, "%s", v);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            if (*n == max) {
                fprintf(stderr, NAME ": %s takes at most %d entries\n", flag, max);
                return 0;
            }
            if (!ex_parse_int(flag, tok, lo, hi, &out[*n])) return 0;
            ++*n;
        }
    }
    if (*n == 0) fprintf(stderr, NAME ": %s takes a list of integers such as %ld,%ld\n", flag, lo, hi);
    return *n > 0;
}

/* A list "a,b" of names[0..n): 1 and on[i] = 1 for each named, else 0
 * with a message (nothing named, an empty entry, an unknown or repeated
 * name). */
static inline int ex_parse_choices(const char *flag, const char *v, const char *const *names,
                                   int n, int *on) {
    memset(on, 0, (size_t)n * sizeof *on);
    int ok = v && *v;
    for (const char *p = v; ok; p++) {
        const size_t len = strcspn(p, ",");
        int k = -1;
        for (int i = 0; i < n; i++)
            if (strlen(names[i]) == len && !strncmp(p, names[i], len)) k = i;
        ok = k >= 0 && !on[k];
        if (ok) on[k] = 1;
        p += len;
        if (!*p) break;
    }
    if (ok) return 1;
    fprintf(stderr, NAME ": %s takes one or more of", flag);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s %s", i ? "," : "", names[i]);
    fprintf(stderr, " (a list: %s,%s); got '%s'\n", names[0], names[n > 1], v ? v : "(nothing)");
    return 0;
}

/* --seed: 1 and *out = the non-negative integer v, else 0. */
static inline int ex_parse_seed(const char *v, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long s = v ? strtoull(v, &end, 10) : 0;
    if (!v || *v < '0' || *v > '9' || *end || errno) { /* strtoull takes " -1" */
        fprintf(stderr, NAME ": --seed takes a non-negative integer, got '%s'\n",
                v ? v : "(nothing)");
        return 0;
    }
    *out = s;
    return 1;
}

/* --kv-heads not given: groups of two query heads (H / 2 key/value heads)
 * where that fits H and the tensor-parallel ranks tp (whole kv heads per
 * rank), else H (no grouping), so that --heads alone never clashes with a
 * default the user did not choose. */
static inline int64_t ex_default_kv_heads(int64_t heads, int64_t tp) {
    return heads % 2 == 0 && (heads / 2) % tp == 0 ? heads / 2 : heads;
}

/* --dtype fp32 | bf16 | fp16: 1 and *out, else 0. */
static inline int ex_parse_dtype(const char *flag, const char *v, dt_dtype *out) {
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    static const dt_dtype dtypes[] = {DT_F32, DT_BF16, DT_F16};
    const int k = ex_parse_choice(flag, v, names, 3);
    if (k < 0) return 0;
    *out = dtypes[k];
    return 1;
}

/* --backend auto | cpu | cuda: 1 and *out, else 0. */
static inline int ex_parse_backend(const char *flag, const char *v, dt_backend_kind *out) {
    static const char *const names[] = {"auto", "cpu", "cuda"};
    static const dt_backend_kind kinds[] = {DT_BACKEND_AUTO, DT_BACKEND_CPU, DT_BACKEND_CUDA};
    const int k = ex_parse_choice(flag, v, names, 3);
    if (k < 0) return 0;
    *out = kinds[k];
    return 1;
}

/* ------------------------------------------------------------------------
 * Packed documents (--docs).
 * ---------------------------------------------------------------------- */

/* --docs L1,L2,...: 1 and a new array *lens of *count lengths >= 1, else 0
 * with a message naming the entry that is not one. */
static inline int ex_docs_parse_list(const char *v, int64_t **lens, int64_t *count) {
    int64_t n = 1;
    for (const char *p = v; *p; p++) n += *p == ',';
    int64_t *l = malloc((size_t)n * sizeof *l);
    if (!l) {
        fprintf(stderr, NAME ": out of memory for --docs\n");
        return 0;
    }
    const char *p = v;
    for (int64_t i = 0; i < n; i++) {
        char *end = NULL;
        errno = 0;
        long long x = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : 0;
        if (!end || errno || x < 1 || x > (1LL << 40) || (*end != ',' && *end != '\0')) {
            const size_t len = strcspn(p, ",");
            fprintf(stderr, NAME ": --docs takes lengths L1,L2,... (integers >= 1) or random:MEAN; "
                    "entry %lld is '%.*s' in '%s'\n", (long long)i + 1, (int)len, p, v);
            free(l);
            return 0;
        }
        l[i] = x;
        p = *end ? end + 1 : end;
    }
    *lens = l;
    *count = n;
    return 1;
}

/* --docs random:MEAN: the lengths of documents for B rows of S tokens, a
 * row after the other, each log-normal with mean `mean` and sigma 1 (mu =
 * ln mean - 1/2) rounded to the nearest integer, at least 1, and the row's
 * last cut to end at S. A draw takes two uniforms, u = (dt_random_value(seed,
 * i) + 1) / 2 for i = 0, 1, 2, ..., to one normal (Box-Muller). A new
 * array of *count lengths summing to B*S, or NULL when out of memory. */
static inline int64_t *ex_docs_draw(double mean, uint64_t seed, int64_t B, int64_t S,
                                     int64_t *count) {
    const double mu = log(mean) - 0.5, two_pi = 6.283185307179586;
    int64_t n = 0, cap = 64;
    int64_t *lens = malloc((size_t)cap * sizeof *lens);
    uint64_t i = 0;
    for (int64_t b = 0; b < B && lens; b++)
        for (int64_t at = 0; at < S && lens; n++) {
            const double u1 = 1.0 - 0.5 * ((double)dt_random_value(seed, i++) + 1.0);   /* (0, 1] */
            const double u2 = 0.5 * ((double)dt_random_value(seed, i++) + 1.0);
            const double x = exp(mu + sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
            int64_t len = x >= (double)(S - at) ? S - at : (int64_t)llround(x);
            if (len < 1) len = 1;
            if (n == cap) {
                int64_t *more = realloc(lens, (size_t)(cap *= 2) * sizeof *lens);
                if (!more) free(lens);
                lens = more;
                if (!lens) break;
            }
            lens[n] = len;
            at += len;
        }
    *count = n;
    return lens;
}

#endif /* DT_EXAMPLE_UTIL_H */
