/* tests/test_attention_docs.c — packed documents and sliding windows in
 * attention (mask.h's rule), on the CPU backend:
 *   - the rule's spans, tile classes, pair counts and block liveness against
 *     a brute-force walk of every pair with the rule written out
 *     (attn_ref.c's ref_rule_allows), for every order and P up to 8;
 *   - dt_docs_check and dt_docs_bounds against the lengths;
 *   - dt_attention_forward and dt_attention_backward, P = 1 to 8, contiguous,
 *     striped and zigzag, causal and full, fp32 / bf16 / fp16, GQA, with
 *     random document lengths (length 1 and longer than a shard included),
 *     one list for every row or one per row, windows shorter and longer
 *     than a shard, a batch sharded over a second mesh dim: every rank's o,
 *     lse, dq, dk, dv against the double-precision reference on the
 *     gathered sequence (attn_ref.c), at test_attention's and
 *     test_attention_backward's tolerances;
 *   - bad documents and windows are refused, on every rank, before
 *     anything moves.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "dtensor/docs.h"
#include "dtensor/dtensor.h"

#include "attn_ref.h"
#include "harness.h"

#define MAXP 8
#define MAXDOCS 512

/* ------------------------------------------------------------ documents */

/* Random lengths (seeded) summing to `total`, with `rows` row boundaries
 * every total / rows tokens that no document crosses; a length-1 document
 * and one of at least `long_len` tokens in each row when they fit. */
static int64_t random_docs(uint64_t seed, int64_t total, int64_t rows, int64_t long_len,
                           int64_t *lens) {
    const int64_t S = total / rows;
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t left = S, i = 0;
        while (left > 0) {
            int64_t len;
            if (i == 1) len = 1;                                   /* a one-token document */
            else if (i == 2) len = long_len;                       /* one longer than a shard */
            else len = 1 + (int64_t)((dt_random_value(seed, (uint64_t)(r * 1000 + i)) + 1.0) * 6.0);
            if (len > left) len = left;
            lens[n++] = len;
            left -= len;
            i++;
        }
    }
    return n;
}

static void test_docs_bounds(void **state) {
    (void)state;
    const int64_t lens[] = {3, 1, 4, 4, 2, 2}; /* two rows of 8: 3 1 4 | 4 2 2 */
    int per_row = -1;
    assert_int_equal(dt_docs_check("t", lens, 6, 2, 8, &per_row), DT_SUCCESS);
    assert_int_equal(per_row, 1);
    assert_int_equal(dt_docs_check("t", lens, 3, 2, 8, &per_row), DT_SUCCESS);
    assert_int_equal(per_row, 0);
    int64_t b[16];
    dt_docs_bounds(lens, 6, 8, 1, b);
    const int64_t want1[16] = {0, 4, 0, 4, 0, 4, 0, 4, 4, 6, 4, 6, 6, 8, 6, 8};
    assert_memory_equal(b, want1, sizeof want1);
    dt_docs_bounds(lens, 3, 8, 1, b);   /* one list: the same for row 1 */
    const int64_t want0[16] = {0, 3, 0, 3, 0, 3, 3, 4, 4, 8, 4, 8, 4, 8, 4, 8};
    assert_memory_equal(b, want0, sizeof want0);
    dt_docs_bounds(NULL, 0, 8, 0, b);
    for (int p = 0; p < 8; p++) assert_true(b[2 * p] == 0 && b[2 * p + 1] == 8);
    /* refused: a zero length, a wrong sum, a document across rows, count
     * without lens */
    const int64_t zero[] = {4, 0, 4}, short_sum[] = {3, 4}, across[] = {3, 6, 7};
    assert_int_equal(dt_docs_check("t", zero, 3, 1, 8, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_docs_check("t", short_sum, 2, 1, 8, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_docs_check("t", across, 3, 2, 8, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "crosses the end of batch row 0"));
    assert_int_equal(dt_docs_check("t", NULL, 2, 1, 8, NULL), DT_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------- the rule, brute force */

/* Every pair of two segments of a sequence under rule r (row 0 of lens):
 * spans, tile classes, pair counts and liveness against ref_rule_allows. */
static long check_segments(const attn_shape *s, const attn_ref_rule *rr, dt_attn_rule r,
                           dt_attn_segment q, dt_attn_segment k) {
    long bad = 0;
    int64_t pairs = 0;
    for (int64_t x = 0; x < q.len; x++) {
        int64_t lo, hi, n = 0;
        dt_attn_rule_rows(r, 1, dt_attn_pos(q, x), k, &lo, &hi);
        for (int64_t y = 0; y < k.len; y++) {
            const int ok = ref_rule_allows(s, rr, 0, dt_attn_pos(q, x), dt_attn_pos(k, y));
            n += ok;
            bad += ok != (y >= lo && y < hi);
        }
        pairs += n;
    }
    for (int64_t y = 0; y < k.len; y++) {   /* the queries of each key */
        int64_t lo, hi;
        dt_attn_rule_rows(r, 0, dt_attn_pos(k, y), q, &lo, &hi);
        for (int64_t x = 0; x < q.len; x++)
            bad += ref_rule_allows(s, rr, 0, dt_attn_pos(q, x), dt_attn_pos(k, y)) !=
                   (x >= lo && x < hi);
    }
    bad += dt_attn_pairs(r, q, k) != pairs;
    bad += dt_attn_has_pairs(r, q, k) != (pairs > 0);
    /* tiles of 3 x 5 rows: empty has no pair, full has every pair */
    for (int64_t x0 = 0; x0 < q.len; x0 += 3)
        for (int64_t y0 = 0; y0 < k.len; y0 += 5) {
            const int64_t x1 = x0 + 3 < q.len ? x0 + 3 : q.len, y1 = y0 + 5 < k.len ? y0 + 5 : k.len;
            int64_t n = 0;
            for (int64_t x = x0; x < x1; x++)
                for (int64_t y = y0; y < y1; y++)
                    n += ref_rule_allows(s, rr, 0, dt_attn_pos(q, x), dt_attn_pos(k, y));
            const dt_attn_tile cls = dt_attn_rule_tile(r, q, x0, x1, k, y0, y1);
            bad += (cls == DT_TILE_EMPTY && n != 0) || (cls == DT_TILE_FULL && n != (x1 - x0) * (y1 - y0));
            /* and for contiguous segments the class is exact */
            if (q.stride == 1 && k.stride == 1 && q.gap == 0 && k.gap == 0)
                bad += (n == 0) != (cls == DT_TILE_EMPTY) ||
                       (n == (x1 - x0) * (y1 - y0)) != (cls == DT_TILE_FULL);
        }
    return bad;
}

static void test_rule_against_brute_force(void **state) {
    (void)state;
    const int64_t S = 48;
    const attn_shape s = {1, S, 1, 1, 8};
    static const dt_order orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
    static const int64_t windows[4] = {0, 1, 5, 17};
    long bad = 0, checked = 0;
    for (int docs = 0; docs < 3; docs++) {
        int64_t lens[MAXDOCS], n = 0;
        if (docs == 1) n = random_docs(11, S, 1, 13, lens);
        if (docs == 2) n = random_docs(12, S, 1, 30, lens);
        int64_t *bounds = malloc((size_t)(2 * S) * sizeof *bounds);
        dt_docs_bounds(n ? lens : NULL, n, S, 0, bounds);
        for (int mask = 0; mask < DT_ATTN_MASK_COUNT; mask++)
            for (int w = 0; w < 4; w++) {
                const attn_ref_rule rr = {mask == DT_ATTN_CAUSAL, windows[w], n ? lens : NULL, n};
                const dt_attn_rule r = {(dt_attn_mask)mask, windows[w], n ? bounds : NULL};
                bad += check_segments(&s, &rr, r, (dt_attn_segment){0, 1, S, 0, 0},
                                      (dt_attn_segment){0, 1, S, 0, 0});
                for (int o = 0; o < 3; o++)
                    for (int P = 2; P <= MAXP; P++) {
                        if (S % (o == 2 ? 2 * P : P)) continue;
                        for (int i = 0; i < P; i++)
                            for (int j = 0; j < P; j++) {
                                bad += check_segments(&s, &rr, r, dt_attn_segment_of(orders[o], S, P, i),
                                                      dt_attn_segment_of(orders[o], S, P, j));
                                checked++;
                            }
                    }
            }
        free(bounds);
    }
    if (bad) print_error("%ld mismatches over %ld segment pairs\n", bad, checked);
    assert_int_equal(bad, 0);
    assert_true(checked > 1000);
}

/* ------------------------------------------------------ attention calls */

typedef struct doc_case {
    char name[200];
    int P, dp;                 /* sequence ranks; batch ranks (a dp x P mesh when dp > 1) */
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    attn_shape s;
    int64_t window;
    int64_t lens[MAXDOCS], count;   /* count 0: no documents */
    uint64_t seed;
    int backward;
    /* filled by the test */
    double *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
    dt_status st[2 * MAXP];
    long bad[2 * MAXP];
    char msg[2 * MAXP][256];
} doc_case;

/* test_attention's and test_attention_backward's tolerances */
static double fwd_tol(dt_dtype dt) { return dt == DT_F32 ? 1e-5 : dt == DT_F16 ? 2e-3 : 2e-2; }
static double bwd_tol(dt_dtype dt) { return dt == DT_F32 ? 1e-4 : dt == DT_F16 ? 4e-3 : 3e-2; }

/* The local rows of a full [B, S, heads, D] array on the rank at batch
 * coordinate bi of dp and sequence coordinate j of P. */
static void local_rows(const doc_case *c, const double *full, int64_t heads, int bi, int j,
                       double *out) {
    const int64_t Bl = c->s.B / c->dp;
    ref_local_rows(full + (size_t)(bi * Bl * c->s.S * heads * c->s.D), Bl, c->s.S, heads, c->s.D,
                   c->order, c->P, j, 0, heads, out);
}

static long compare_rows(const doc_case *c, const char *what, const dt_tensor *t,
                         const double *full, int64_t heads, int bi, int j, double tol) {
    const size_t n = (size_t)dt_tensor_local_numel(t);
    float *got = malloc(n * sizeof *got);
    double *ref = malloc(n * sizeof *ref);
    long bad = -1;
    if (ref_get_f32(t, got) == DT_SUCCESS) {
        local_rows(c, full, heads, bi, j, ref);
        bad = h_compare(what, got, ref, n, tol, tol, NULL);
    }
    free(got);
    free(ref);
    return bad;
}

static dt_status rank_case(dt_context *ctx, void *arg) {
    doc_case *c = arg;
    const int r = dt_context_rank(ctx);
    const attn_shape *s = &c->s;
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *dout = NULL;
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    double *buf = NULL;
    dt_status st;
    int sizes[2] = {c->dp, c->P};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 2, sizes, NULL, &mesh), out);
    const dt_layout lay = dt_layout_2d(c->dp > 1 ? dt_shard(0, DT_ORDER_CONTIGUOUS) : dt_replicate(),
                                       dt_shard(1, c->order));
    const int bi = dt_mesh_coord(mesh, 0), j = dt_mesh_coord(mesh, 1);
    int64_t qshape[4] = {s->B, s->S, s->H, s->D}, kshape[4] = {s->B, s->S, s->Hkv, s->D};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &v), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &dout), out);
    buf = malloc((size_t)(s->B * s->S * s->H * s->D) * sizeof *buf);
    local_rows(c, c->q, s->H, bi, j, buf);
    DT_TRY_GOTO(st, ref_set_local(q, buf), out);
    local_rows(c, c->k, s->Hkv, bi, j, buf);
    DT_TRY_GOTO(st, ref_set_local(k, buf), out);
    local_rows(c, c->v, s->Hkv, bi, j, buf);
    DT_TRY_GOTO(st, ref_set_local(v, buf), out);
    local_rows(c, c->dout, s->H, bi, j, buf);
    DT_TRY_GOTO(st, ref_set_local(dout, buf), out);

    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    opts.window = c->window;
    opts.doc_lens = c->count ? c->lens : NULL;
    opts.doc_count = c->count;
    opts.group = 3;   /* grouped launches where the order allows them with the rule */
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);
    const double ft = fwd_tol(c->dtype);
    c->bad[r] = compare_rows(c, "o", o, c->o, s->H, bi, j, ft);
    {   /* lse [B, H, S]: -inf rows compare as equal */
        const size_t nl = (size_t)dt_tensor_local_numel(lse);
        float *got = malloc(nl * sizeof *got);
        double *ref = malloc(nl * sizeof *ref);
        const int64_t Bl = s->B / c->dp;
        ref_local_lse(c->lse + (size_t)(bi * Bl * s->H * s->S), Bl, s->S, s->H, c->order, c->P, j,
                      0, s->H, ref);
        st = dt_tensor_get_local(lse, got, nl * sizeof *got);
        if (st == DT_SUCCESS) c->bad[r] += h_compare("lse", got, ref, nl, ft, ft, NULL);
        free(got);
        free(ref);
        if (st != DT_SUCCESS) goto out;
    }
    if (c->backward) {
        DT_TRY_GOTO(st, dt_attention_backward(q, k, v, o, lse, dout, &opts, &dq, &dk, &dv), out);
        const double bt = bwd_tol(c->dtype);
        c->bad[r] += compare_rows(c, "dq", dq, c->dq, s->H, bi, j, bt);
        c->bad[r] += compare_rows(c, "dk", dk, c->dk, s->Hkv, bi, j, bt);
        c->bad[r] += compare_rows(c, "dv", dv, c->dv, s->Hkv, bi, j, bt);
    }
out:
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    free(buf);
    dt_tensor_destroy(q), dt_tensor_destroy(k), dt_tensor_destroy(v), dt_tensor_destroy(dout);
    dt_tensor_destroy(o), dt_tensor_destroy(lse);
    dt_tensor_destroy(dq), dt_tensor_destroy(dk), dt_tensor_destroy(dv);
    dt_mesh_destroy(mesh);
    return st;
}

static void run_case(void **state) {
    doc_case *c = *state;
    const attn_shape *s = &c->s;
    const int64_t nq = s->B * s->S * s->H * s->D, nk = s->B * s->S * s->Hkv * s->D;
    c->q = ref_input(c->seed, nq, c->dtype);
    c->k = ref_input(c->seed + 1, nk, c->dtype);
    c->v = ref_input(c->seed + 2, nk, c->dtype);
    c->dout = ref_input(c->seed + 3, nq, c->dtype);
    c->o = malloc((size_t)nq * sizeof(double));
    c->lse = malloc((size_t)(s->B * s->H * s->S) * sizeof(double));
    c->dq = malloc((size_t)nq * sizeof(double));
    c->dk = malloc((size_t)nk * sizeof(double));
    c->dv = malloc((size_t)nk * sizeof(double));
    const attn_ref_rule rr = {c->mask == DT_ATTN_CAUSAL, c->window, c->count ? c->lens : NULL,
                              c->count};
    const double scale = 1.0 / sqrt((double)s->D);
    ref_attention_forward_rule(s, &rr, c->q, c->k, c->v, scale, c->o, c->lse);
    if (c->backward)
        ref_attention_backward_rule(s, &rr, c->q, c->k, c->v, c->dout, scale, c->dq, c->dk, c->dv);
    memset(c->st, 0, sizeof c->st);
    memset(c->bad, 0, sizeof c->bad);
    const dt_status st = h_launch(c->P * c->dp, rank_case, c);
    int ok = st == DT_SUCCESS;
    if (!ok) print_error("%s: %s\n", c->name, dt_last_error());
    for (int r = 0; r < c->P * c->dp; r++) {
        if (c->st[r] != DT_SUCCESS) print_error("rank %d: %s\n", r, c->msg[r]);
        else if (c->bad[r]) print_error("rank %d: %ld mismatches\n", r, c->bad[r]);
        ok &= c->st[r] == DT_SUCCESS && c->bad[r] == 0;
    }
    free(c->q), free(c->k), free(c->v), free(c->dout);
    free(c->o), free(c->lse), free(c->dq), free(c->dk), free(c->dv);
    assert_true(ok);
}

/* ------------------------------------------------ empty ring steps */

/* Ring steps whose blocks the rule leaves empty launch nothing: with
 * opts.timing, such a step's blocks_ms (the rank thread's CPU time around
 * them) is next to nothing beside step 0's block. Contiguous, P = 4, one
 * document per shard under the full mask: only step 0 has pairs; a window
 * of half a shard under the causal mask: steps 0 and 1. */
typedef struct skip_case {
    int window;                /* 0: documents; 1: window */
    dt_attention_timing timing[MAXP];
    dt_status st[MAXP];
} skip_case;

static dt_status rank_skip(dt_context *ctx, void *arg) {
    skip_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = NULL;
    int sizes[1] = {4};
    const int64_t S = 4 * 384, shape[4] = {1, S, 2, 64}, lens[4] = {S / 4, S / 4, S / 4, S / 4};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    const dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(q, 3);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->window ? DT_ATTN_CAUSAL : DT_ATTN_FULL;
    opts.doc_lens = c->window ? NULL : lens;
    opts.doc_count = c->window ? 0 : 4;
    opts.window = c->window ? S / 8 : 0;
    opts.timing = &c->timing[r];
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, &opts, &o, NULL);
    c->st[r] = st;
    dt_tensor_destroy(o);
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_empty_steps_launch_nothing(void **state) {
    (void)state;
    for (int window = 0; window < 2; window++) {
        skip_case c;
        memset(&c, 0, sizeof c);
        c.window = window;
        assert_int_equal(h_launch(4, rank_skip, &c), DT_SUCCESS);
        for (int r = 0; r < 4; r++) {
            const dt_attention_timing *t = &c.timing[r];
            assert_int_equal(t->steps, 4);
            assert_true(t->blocks_ms[0] > 0.0);
            for (int step = 1; step < 4; step++) {
                /* window: step 1 (the shard just before) has pairs, except on rank 0 */
                const int live = window && step == 1 && r > 0;
                if (live) continue;
                if (!(t->blocks_ms[step] < 0.02 * t->blocks_ms[0]))
                    print_error("%s: rank %d step %d: %.3f ms beside step 0's %.3f ms\n",
                                window ? "window" : "documents", r, step, t->blocks_ms[step],
                                t->blocks_ms[0]);
                assert_true(t->blocks_ms[step] < 0.02 * t->blocks_ms[0]);
            }
        }
    }
}

/* ---------------------------------------------------------- bad input */

typedef struct bad_case {
    int which;   /* 0: lengths that do not sum to S; 1: window < 0; 2: one rank's lengths differ */
    dt_status st[4];
    int untouched[4];
} bad_case;

static dt_status rank_bad(dt_context *ctx, void *arg) {
    bad_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = (dt_tensor *)&c, *lse = NULL;
    int sizes[1] = {2};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    const dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    int64_t shape[4] = {1, 16, 2, 8};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(q, 5);
    if (st == DT_SUCCESS) {
        const int64_t good[] = {5, 1, 10}, wrong[] = {5, 1, 9}, other[] = {6, 10};
        dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
        opts.doc_lens = c->which == 0 ? wrong : c->which == 2 && r == 1 ? other : good;
        opts.doc_count = c->which == 2 && r == 1 ? 2 : 3;
        opts.window = c->which == 1 ? -1 : 4;
        st = dt_attention_forward(q, q, q, &opts, &o, &lse);
        c->untouched[r] = o == (dt_tensor *)&c && lse == NULL;
    }
    c->st[r] = st;
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return DT_SUCCESS;
}

/* The sequence sharded over two mesh dims (a Layout the primitives take):
 * refused by attention on every rank, naming it, before anything moves. */
static dt_status rank_two_dims(dt_context *ctx, void *arg) {
    bad_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = (dt_tensor *)&c, *lse = NULL;
    int sizes[2] = {2, 2};
    dt_status st = dt_mesh_create(ctx, 2, sizes, NULL, &mesh);
    const dt_layout lay =
        dt_layout_2d(dt_shard(1, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_CONTIGUOUS));
    int64_t shape[4] = {1, 16, 2, 8};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &q);
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, NULL, &o, &lse);
    c->untouched[r] = o == (dt_tensor *)&c && lse == NULL;
    c->st[r] = st;
    if (st == DT_ERR_NOT_SUPPORTED && !strstr(dt_last_error(), "over several mesh dims"))
        c->st[r] = DT_ERR_INTERNAL;   /* refused, but not for this */
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return DT_SUCCESS;
}

static void test_sequence_over_two_mesh_dims_refused(void **state) {
    (void)state;
    bad_case c;
    memset(&c, 0, sizeof c);
    assert_int_equal(h_launch(4, rank_two_dims, &c), DT_SUCCESS);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(c.st[r], DT_ERR_NOT_SUPPORTED);
        assert_true(c.untouched[r]);
    }
}

static void test_bad_documents(void **state) {
    (void)state;
    static const dt_status want[3] = {DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
                                      DT_ERR_MISMATCH};
    for (int which = 0; which < 3; which++) {
        bad_case c = {.which = which};
        assert_int_equal(h_launch(2, rank_bad, &c), DT_SUCCESS);
        for (int r = 0; r < 2; r++) {
            if (c.st[r] != want[which])
                print_error("case %d rank %d: %s (%s)\n", which, r, dt_status_name(c.st[r]),
                            dt_last_error());
            assert_true(c.st[r] == want[which] || (which == 2 && c.st[r] != DT_SUCCESS));
            assert_true(c.untouched[r]);
        }
    }
}

/* --------------------------------------------------------------- cases */

static const char *order_short(dt_order o) { return dt_order_name(o); }

int main(void) {
    enum { NCASES = 160 };
    static doc_case cases[NCASES];
    struct CMUnitTest tests[NCASES + 6];
    size_t n = 0, nc = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_docs_bounds);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_rule_against_brute_force);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_documents);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_empty_steps_launch_nothing);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_sequence_over_two_mesh_dims_refused);
    static const dt_order orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
    static const dt_dtype dtypes[3] = {DT_F32, DT_BF16, DT_F16};
    /* P = 1 to 8, each order, causal and full alternating, the dtypes in
     * turn; documents one list or one per row; windows: none, shorter than a
     * shard, longer than a shard. */
    for (int P = 1; P <= MAXP; P++)
        for (int o = 0; o < 3; o++) {
            if (P == 1 && o) continue;
            for (int variant = 0; variant < 4; variant++) {
                doc_case *c = &cases[nc++];
                memset(c, 0, sizeof *c);
                c->P = P;
                c->dp = 1;
                c->order = orders[o];
                c->mask = (P + o + variant) % 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                c->dtype = dtypes[(P + o + variant) % 3];
                const int64_t S = 2 * P * (P <= 4 ? 12 : 6);   /* divisible by 2P */
                const int64_t chunk = S / P;
                c->s = (attn_shape){2, S, 4, variant % 2 ? 2 : 1, 16};
                c->seed = 100 + (uint64_t)(P * 10 + o * 4 + variant);
                c->backward = 1;
                const char *docs = "none";
                if (variant != 3) {   /* variant 3: a window alone */
                    const int per_row = variant == 1;
                    c->count = random_docs(c->seed, per_row ? 2 * S : S, per_row ? 2 : 1,
                                           chunk + 3 < S / 2 ? chunk + 3 : S / 2, c->lens);
                    docs = per_row ? "per-row" : "shared";
                }
                c->window = variant == 2 ? (chunk > 2 ? chunk / 2 : 1)
                                         : variant == 3 ? chunk + chunk / 2 + 1 : 0;
                snprintf(c->name, sizeof c->name,
                         "docs/%s/P=%d,B=2,S=%lld,H=4,HKV=%lld,D=16,%s,%s,docs=%s(%lld),window=%lld",
                         order_short(c->order), P, (long long)S, (long long)c->s.Hkv,
                         dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype), docs,
                         (long long)c->count, (long long)c->window);
            }
        }
    /* a batch sharded over a second mesh dim: each rank's rows take their
     * own documents (per-row lists) */
    for (int o = 0; o < 3; o++) {
        doc_case *c = &cases[nc++];
        memset(c, 0, sizeof *c);
        c->P = 3;
        c->dp = 2;
        c->order = orders[o];
        c->mask = DT_ATTN_CAUSAL;
        c->dtype = DT_F32;
        c->s = (attn_shape){4, 36, 2, 1, 8};
        c->seed = 900 + (uint64_t)o;
        c->backward = 1;
        c->count = random_docs(c->seed, 4 * 36, 4, 15, c->lens);
        c->window = 9;
        snprintf(c->name, sizeof c->name,
                 "docs/%s/dp=2,P=3,B=4,S=36,H=2,HKV=1,D=8,causal,fp32,docs=per-row(%lld),window=9",
                 order_short(c->order), (long long)c->count);
    }
    for (size_t i = 0; i < nc; i++)
        tests[n++] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, &cases[i]};
    return h_run_cases("attention_docs", tests, n);
}
