/* tests/test_attention.c — the mask rule, the CPU block kernel and the
 * distributed forward pass (Ring, Striped, Zigzag) against a double-precision
 * reference on the gathered sequence, written here from the definitions:
 *   o[b,i,h] = sum_j softmax_j(scale * q[b,i,h].k[b,j,g]) v[b,j,g], g = h/(H/Hkv),
 *   over keys j <= i (causal) or all j; lse = log sum_j exp(scale q.k).
 * Inputs come from dt_random_value(seed, global index); each rank checks its
 * own rows, located with the test's own index maps (harness.c). Rank threads
 * record; the main thread asserts. */
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
#include "attention/block.h"
#include "dtensor/dtensor.h"
#include "attn_ref.h"
#include "harness.h"

#define MAXP 8

/* ------------------------------------------------------- forward cases */

typedef struct fwd_case {
    char name[128];
    attn_shape s;
    int P, tp;                 /* sequence ranks; tensor-parallel ranks (heads) */
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    uint64_t seed;
    dt_backend_kind backend;   /* cpu (0 means cpu too) or cuda; cuda cases skip without a GPU */
    /* filled by the test */
    double *q, *k, *v, *o_ref, *lse_ref;
    dt_status st[MAXP * 2];
    long bad[MAXP * 2];
    double max_err[MAXP * 2];
    char msg[MAXP * 2][256];
} fwd_case;

static dt_status rank_forward(dt_context *ctx, void *arg) {
    fwd_case *c = arg;
    int r = dt_context_rank(ctx);
    const attn_shape *s = &c->s;
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL;
    float *got = NULL, *got_lse = NULL;
    double *ref = NULL, *ref_lse = NULL;
    dt_status st;
    int sizes[2] = {c->tp, c->P};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 2, sizes, NULL, &mesh), out);
    dt_layout lay = dt_layout_2d(c->tp > 1 ? dt_shard(2, DT_ORDER_CONTIGUOUS) : dt_replicate(),
                                 dt_shard(1, c->order));
    int64_t qshape[4] = {s->B, s->S, s->H, s->D}, kshape[4] = {s->B, s->S, s->Hkv, s->D};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &v), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(q, c->seed), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(k, c->seed + 1), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(v, c->seed + 2), out);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);

    /* Expected rows of this rank: heads [t*h, t*h+h), sequence indices of its shard. */
    int t = dt_mesh_coord(mesh, 0), j = dt_mesh_coord(mesh, 1);
    int64_t c_rows = s->S / c->P, h = s->H / c->tp;
    size_t n = (size_t)(s->B * c_rows * h * s->D), nl = (size_t)(s->B * h * c_rows);
    got = malloc(n * sizeof *got);
    got_lse = malloc(nl * sizeof *got_lse);
    ref = malloc(n * sizeof *ref);
    ref_lse = malloc(nl * sizeof *ref_lse);
    ref_local_rows(c->o_ref, s->B, s->S, s->H, s->D, c->order, c->P, j, t, h, ref);
    ref_local_lse(c->lse_ref, s->B, s->S, s->H, c->order, c->P, j, t, h, ref_lse);
    DT_TRY_GOTO(st, ref_get_f32(o, got), out);
    DT_TRY_GOTO(st, dt_tensor_get_local(lse, got_lse, nl * sizeof *got_lse), out);
    double tol = c->dtype == DT_F32 ? 1e-5 : 2e-2;
    c->bad[r] = h_compare(c->name, got, ref, n, tol, tol, &c->max_err[r]);
    c->bad[r] += h_compare("lse", got_lse, ref_lse, nl, tol, tol, NULL);
out:
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    free(got);
    free(got_lse);
    free(ref);
    free(ref_lse);
    dt_tensor_destroy(o);
    dt_tensor_destroy(lse);
    dt_tensor_destroy(q);
    dt_tensor_destroy(k);
    dt_tensor_destroy(v);
    dt_mesh_destroy(mesh);
    return st;
}

static void run_forward_case(void **state) {
    fwd_case *c = *state;
    const attn_shape *s = &c->s;
    dt_backend_kind backend = c->backend ? c->backend : DT_BACKEND_CPU;
    char why[512];
    if (!h_pair_available(c->P * c->tp, backend, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    int64_t nq = s->B * s->S * s->H * s->D, nk = s->B * s->S * s->Hkv * s->D;
    c->q = ref_input(c->seed, nq, c->dtype);
    c->k = ref_input(c->seed + 1, nk, c->dtype);
    c->v = ref_input(c->seed + 2, nk, c->dtype);
    c->o_ref = malloc((size_t)nq * sizeof(double));
    c->lse_ref = malloc((size_t)(s->B * s->H * s->S) * sizeof(double));
    ref_attention_forward(s, c->q, c->k, c->v, c->mask == DT_ATTN_CAUSAL, 1.0 / sqrt((double)s->D), c->o_ref,
              c->lse_ref);
    dt_status st = h_launch_on(c->P * c->tp, backend, DT_TRANSPORT_LOCAL, rank_forward, c);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->o_ref);
    free(c->lse_ref);
    if (st != DT_SUCCESS) print_error("%s: %s\n", c->name, dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->P * c->tp; r++) {
        assert_int_equal(c->st[r], DT_SUCCESS);
        assert_int_equal(c->bad[r], 0);
        assert_true(c->max_err[r] < (c->dtype == DT_F32 ? 1e-5 : 2e-2));
    }
}

/* ------------------------------------------------------------ mask tests */

static void test_segments_follow_the_orders(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++)
        for (int o = 0; o < DT_ORDER_COUNT; o++)
            for (int j = 0; j < p; j++) {
                int64_t S = 4 * p * 3, idx[96];
                dt_attn_segment seg[2];
                h_order_indices((dt_order)o, S, p, j, idx);
                int n = dt_attn_segments((dt_order)o, S, p, j, seg);
                int64_t x = 0;
                for (int i = 0; i < n; i++)
                    for (int64_t y = 0; y < seg[i].len; y++, x++)
                        assert_int_equal(dt_attn_pos(seg[i], y), idx[x]);
                assert_int_equal(x, S / p);
            }
}

/* Tile classes and loop bounds agree with the element-wise rule, and pair
 * counts with a brute-force count; striped blocks follow the paper's masks. */
static void test_tile_classes_and_pairs(void **state) {
    (void)state;
    for (int64_t qs = 0; qs < 7; qs++)
        for (int64_t ks = 0; ks < 7; ks++)
            for (int64_t stride = 1; stride <= 4; stride++) {
                dt_attn_segment q = {qs, stride, 9}, k = {ks, stride, 11};
                int64_t pairs = 0;
                for (int64_t x = 0; x < q.len; x++)
                    for (int64_t y = 0; y < k.len; y++) pairs += dt_attn_pos(q, x) >= dt_attn_pos(k, y);
                assert_int_equal(dt_attn_pairs(DT_ATTN_CAUSAL, q, k), pairs);
                assert_int_equal(dt_attn_pairs(DT_ATTN_FULL, q, k), q.len * k.len);
                /* The loop bounds kernels use: a prefix of keys per query
                 * position, a suffix of queries per key position (any p). */
                for (int64_t pos = -2; pos < 50; pos++) {
                    int64_t keys = 0, first = q.len;
                    for (int64_t y = 0; y < k.len; y++) keys += dt_attn_pos(k, y) <= pos;
                    for (int64_t x = q.len - 1; x >= 0 && dt_attn_pos(q, x) >= pos; x--) first = x;
                    assert_int_equal(dt_attn_keys_upto(DT_ATTN_CAUSAL, k, pos), keys);
                    assert_int_equal(dt_attn_queries_from(DT_ATTN_CAUSAL, q, pos), first);
                    assert_int_equal(dt_attn_keys_upto(DT_ATTN_FULL, k, pos), k.len);
                    assert_int_equal(dt_attn_queries_from(DT_ATTN_FULL, q, pos), 0);
                }
                for (int64_t x0 = 0; x0 < q.len; x0 += 3)
                    for (int64_t y0 = 0; y0 < k.len; y0 += 4) {
                        int64_t x1 = x0 + 3 < q.len ? x0 + 3 : q.len, y1 = y0 + 4 < k.len ? y0 + 4 : k.len;
                        int any = 0, all = 1;
                        for (int64_t x = x0; x < x1; x++)
                            for (int64_t y = y0; y < y1; y++) {
                                int ok = dt_attn_pos(q, x) >= dt_attn_pos(k, y);
                                any |= ok;
                                all &= ok;
                            }
                        dt_attn_tile want = all ? DT_TILE_FULL : any ? DT_TILE_PARTIAL : DT_TILE_EMPTY;
                        assert_int_equal(dt_attn_tile_class(DT_ATTN_CAUSAL, q, x0, x1, k, y0, y1), want);
                    }
            }
    /* Striped: y <= x when j >= k, y < x when j < k (Striped Attention paper). */
    for (int p = 2; p <= MAXP; p++)
        for (int j = 0; j < p; j++)
            for (int kk = 0; kk < p; kk++) {
                dt_attn_segment qsegs[2], ksegs[2];
                dt_attn_segments(DT_ORDER_STRIPED, 5 * p, p, j, qsegs);
                dt_attn_segments(DT_ORDER_STRIPED, 5 * p, p, kk, ksegs);
                dt_attn_segment qj = qsegs[0], kk_seg = ksegs[0];
                for (int64_t x = 0; x < 5; x++)
                    for (int64_t y = 0; y < 5; y++) {
                        int allowed = dt_attn_pos(qj, x) >= dt_attn_pos(kk_seg, y);
                        assert_int_equal(allowed, j >= kk ? y <= x : y < x);
                    }
            }
}

/* A block whose keys all come after its queries leaves m = -inf, l = 0 and
 * acc = 0; finalize gives 0 output and -inf lse, never NaN. */
static void test_fully_masked_block(void **state) {
    (void)state;
    enum { N = 70, D = 8 };
    float q[N * D], k[N * D], v[N * D], m[N], l[N], acc[N * D], o[N * D], lse[N];
    for (int i = 0; i < N * D; i++) q[i] = k[i] = v[i] = 0.5f;
    for (int i = 0; i < N; i++) m[i] = -INFINITY, l[i] = 0;
    memset(acc, 0, sizeof acc);
    char scratch[1 << 16];
    assert_true(dt_attn_kernels_cpu.fwd_scratch(D) <= sizeof scratch);
    dt_attn_block_args a = {.dtype = DT_F32, .batch = 1, .heads = 1, .kv_heads = 1, .dim = D,
                            .q = q, .q_batch_stride = N * D, .k = k, .v = v, .kv_batch_stride = N * D,
                            .qseg = {0, 2, N}, .kseg = {1000, 2, N}, .mask = DT_ATTN_CAUSAL,
                            .scale = 1.0f, .m = m, .l = l, .ml_batch_stride = N, .ml_head_stride = N,
                            .acc = acc, .acc_batch_stride = N * D};
    assert_int_equal(dt_attn_kernels_cpu.fwd(NULL, &a, scratch), DT_SUCCESS);
    assert_int_equal(dt_attn_kernels_cpu.finalize(NULL, DT_F32, 1, N, 1, D, acc, m, l, o, lse), DT_SUCCESS);
    for (int i = 0; i < N; i++) {
        assert_true(isinf(lse[i]) && lse[i] < 0);
        for (int d = 0; d < D; d++) assert_true(o[i * D + d] == 0.0f);
    }
}

/* Logits of magnitude 1e4: inputs are multiples of 25 so every logit is an
 * exact integer in fp32; the result must be finite and match double. */
static void test_huge_logits(void **state) {
    (void)state;
    enum { S = 150, D = 16 };
    static float q[S * D], k[S * D], v[S * D], m[S], l[S], acc[S * D], o[S * D], lse[S];
    static double qd[S * D], kd[S * D], vd[S * D], o_ref[S * D], lse_ref[S];
    for (int i = 0; i < S * D; i++) {
        q[i] = 25.0f * (float)(((i * 7) % 5) - 2);     /* -50 .. 50 */
        k[i] = 25.0f * (float)(((i * 3) % 5) - 2);
        v[i] = dt_random_value(3, (uint64_t)i);
        qd[i] = q[i], kd[i] = k[i], vd[i] = v[i];
    }
    for (int i = 0; i < S; i++) m[i] = -INFINITY, l[i] = 0;
    memset(acc, 0, sizeof acc);
    static char scratch[1 << 17];
    dt_attn_block_args a = {.dtype = DT_F32, .batch = 1, .heads = 1, .kv_heads = 1, .dim = D,
                            .q = q, .q_batch_stride = S * D, .k = k, .v = v, .kv_batch_stride = S * D,
                            .qseg = {0, 1, S}, .kseg = {0, 1, S}, .mask = DT_ATTN_CAUSAL,
                            .scale = 1.0f, .m = m, .l = l, .ml_batch_stride = S, .ml_head_stride = S,
                            .acc = acc, .acc_batch_stride = S * D};
    assert_int_equal(dt_attn_kernels_cpu.fwd(NULL, &a, scratch), DT_SUCCESS);
    assert_int_equal(dt_attn_kernels_cpu.finalize(NULL, DT_F32, 1, S, 1, D, acc, m, l, o, lse), DT_SUCCESS);
    attn_shape s = {1, S, 1, 1, D};
    ref_attention_forward(&s, qd, kd, vd, 1, 1.0, o_ref, lse_ref);
    double big = 0;
    for (int i = 0; i < S; i++) big = fmax(big, fabs(lse_ref[i]));
    assert_true(big >= 1e4);
    assert_int_equal(h_compare("huge logits: o", o, o_ref, S * D, 1e-5, 1e-5, NULL), 0);
    assert_int_equal(h_compare("huge logits: lse", lse, lse_ref, S, 1e-5, 1e-6, NULL), 0);
}

/* ----------------------------------------------------- agreement, errors */

typedef struct err_case {
    int P;
    dt_status st[MAXP];
    char msg[MAXP][512];
    int bad[MAXP];
} err_case;

/* Rank 1 builds q with 2 heads where the others use 4: every rank must fail
 * with DT_ERR_MISMATCH naming H, not hang. */
static dt_status rank_disagree(dt_context *ctx, void *arg) {
    err_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *o = NULL;
    int sizes[1] = {c->P};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    int64_t qs[4] = {1, 8 * c->P, r == 1 ? 2 : 4, 16}, ks[4] = {1, 8 * c->P, 2, 16};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, qs, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, ks, &lay, &k);
    if (st == DT_SUCCESS) st = dt_attention_forward(q, k, k, NULL, &o, NULL);
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    dt_tensor_destroy(o);
    dt_tensor_destroy(q);
    dt_tensor_destroy(k);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_ranks_that_disagree_fail_together(void **state) {
    (void)state;
    for (int p = 2; p <= 4; p++) {
        err_case c = {.P = p};
        assert_int_equal(h_launch(p, rank_disagree, &c), DT_ERR_MISMATCH);
        for (int r = 0; r < p; r++) {
            assert_int_equal(c.st[r], DT_ERR_MISMATCH);
            assert_non_null(strstr(c.msg[r], "H = 2 but comm rank 0 has 4"));
        }
    }
}

static uint64_t checksum(const dt_tensor *t) {
    size_t n = dt_tensor_local_bytes(t);
    unsigned char *buf = malloc(n ? n : 1);
    dt_tensor_get_local(t, buf, n);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
    free(buf);
    return h;
}

/* Rejected calls: the right status, a message, no output, inputs intact. */
static dt_status rank_bad_inputs(dt_context *ctx, void *arg) {
    err_case *c = arg;
    int r = dt_context_rank(ctx), P = c->P;
    dt_mesh *mesh = NULL;
    int sizes[1] = {P};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    if (st != DT_SUCCESS) return st;
    dt_layout sp = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED)), rep = dt_layout_1d(dt_replicate());
    dt_layout part = dt_layout_1d(dt_partial()), dsh = dt_layout_1d(dt_shard(3, DT_ORDER_CONTIGUOUS));
    int64_t S = 8 * P;
    int64_t sq[4] = {1, S, 4, 16}, skv[4] = {1, S, 2, 16}, s3[4] = {1, S, 3, 16},
            s12[4] = {1, S, 4, 12}, s264[4] = {1, S, 4, 264}, s2d[4] = {1, S, 2, 16};
    dt_tensor *q = NULL, *kv = NULL, *kv3 = NULL, *q12 = NULL, *q264 = NULL, *qb = NULL,
              *qr = NULL, *qp = NULL, *qd = NULL, *o = (dt_tensor *)1, *lse = (dt_tensor *)1;
    dt_tensor_create(ctx, mesh, DT_F32, 4, sq, &sp, &q);
    dt_tensor_create(ctx, mesh, DT_F32, 4, skv, &sp, &kv);
    dt_tensor_create(ctx, mesh, DT_F32, 4, s3, &sp, &kv3);
    dt_tensor_create(ctx, mesh, DT_F32, 4, s12, &sp, &q12);
    dt_tensor_create(ctx, mesh, DT_F32, 4, s264, &sp, &q264);
    dt_tensor_create(ctx, mesh, DT_BF16, 4, skv, &sp, &qb);
    dt_tensor_create(ctx, mesh, DT_F32, 4, sq, &rep, &qr);
    dt_tensor_create(ctx, mesh, DT_F32, 4, sq, &part, &qp);
    dt_tensor_create(ctx, mesh, DT_F32, 4, s2d, &dsh, &qd);
    dt_tensor_fill_random(q, 1);
    dt_tensor_fill_random(kv, 2);
    uint64_t cq = checksum(q), ckv = checksum(kv);
    dt_attention_options bad_mask = DT_ATTENTION_OPTIONS_INIT, bad_scale = DT_ATTENTION_OPTIONS_INIT,
                         small_ws = DT_ATTENTION_OPTIONS_INIT;
    bad_mask.mask = (dt_attn_mask)5;
    bad_scale.scale = -1.0f;
    char ws[16];
    small_ws.workspace = ws;
    small_ws.workspace_bytes = sizeof ws;
    struct { dt_status got, want; const char *needle; } t[] = {
        {dt_attention_forward(NULL, kv, kv, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "NULL"},
        {dt_attention_forward(q, kv, kv, NULL, NULL, &lse), DT_ERR_INVALID_ARGUMENT, "o is NULL"},
        {dt_attention_forward(q, kv3, kv3, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "do not divide"},
        {dt_attention_forward(q, kv, kv3, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "k and v shapes differ"},
        {dt_attention_forward(q12, q12, q12, NULL, &o, &lse), DT_ERR_NOT_SUPPORTED, "head dim 12"},
        {dt_attention_forward(q264, q264, q264, NULL, &o, &lse), DT_ERR_NOT_SUPPORTED, "head dim 264"},
        {dt_attention_forward(q, qb, qb, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "dtypes differ"},
        {dt_attention_forward(q, kv, kv, &bad_mask, &o, &lse), DT_ERR_INVALID_ARGUMENT, "unknown mask"},
        {dt_attention_forward(q, kv, kv, &bad_scale, &o, &lse), DT_ERR_INVALID_ARGUMENT, "scale"},
        {dt_attention_forward(q, kv, kv, &small_ws, &o, &lse), DT_ERR_INVALID_ARGUMENT, "workspace"},
        {dt_attention_forward(qr, kv, kv, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "one Layout"},
        {dt_attention_forward(qp, qp, qp, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "Partial"},
        {dt_attention_forward(qd, qd, qd, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "head dim D"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].got != t[i].want || !strstr(dt_last_error(), "") || o != NULL) {
            c->bad[r]++;
            snprintf(c->msg[r], sizeof c->msg[r], "case %zu: got %s", i, dt_status_name(t[i].got));
        }
    if (checksum(q) != cq || checksum(kv) != ckv) c->bad[r]++;
    dt_tensor *all[] = {q, kv, kv3, q12, q264, qb, qr, qp, qd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    c->st[r] = DT_SUCCESS;
    return DT_SUCCESS;
}

static void test_bad_inputs(void **state) {
    (void)state;
    for (int p = 1; p <= 3; p++) {
        err_case c = {.P = p};
        assert_int_equal(h_launch(p, rank_bad_inputs, &c), DT_SUCCESS);
        for (int r = 0; r < p; r++) {
            if (c.bad[r]) print_error("rank %d: %s\n", r, c.msg[r]);
            assert_int_equal(c.bad[r], 0);
        }
    }
}

/* A caller-provided workspace gives bit-identical results to an internal one. */
static dt_status rank_workspace(dt_context *ctx, void *arg) {
    err_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    int sizes[1] = {c->P};
    dt_tensor *q = NULL, *o1 = NULL, *o2 = NULL;
    void *ws = NULL;
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
    int64_t shape[4] = {2, 12 * c->P, 2, 8};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(q, 9);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    if (st == DT_SUCCESS) st = dt_attention_workspace_size(q, q, q, &opts, &opts.workspace_bytes);
    if (st == DT_SUCCESS) opts.workspace = ws = malloc(opts.workspace_bytes);
    for (int rep = 0; st == DT_SUCCESS && rep < 3; rep++) {
        dt_tensor_destroy(o2);
        o2 = NULL;
        st = dt_attention_forward(q, q, q, &opts, &o2, NULL);
    }
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, NULL, &o1, NULL);
    if (st == DT_SUCCESS && checksum(o1) != checksum(o2)) c->bad[r]++;
    c->st[r] = st;
    free(ws);
    dt_tensor_destroy(q);
    dt_tensor_destroy(o1);
    dt_tensor_destroy(o2);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_workspace_reuse(void **state) {
    (void)state;
    err_case c = {.P = 3};
    assert_int_equal(h_launch(3, rank_workspace, &c), DT_SUCCESS);
    for (int r = 0; r < 3; r++) assert_int_equal(c.bad[r], 0);
}

/* ------------------------------------------------------------------ main */

int main(void) {
    enum { MAXC = 200 };
    static fwd_case cases[MAXC];
    static struct CMUnitTest tests[MAXC + 8];
    int n = 0, nc = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_segments_follow_the_orders);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_tile_classes_and_pairs);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_fully_masked_block);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_huge_logits);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ranks_that_disagree_fail_together);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_inputs);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_workspace_reuse);
    /* Every order, P = 1..8, causal and full, fp32 and bf16; local lengths
     * on both sides of the kernel's 64-row tile; GQA ratios 1, 2, 4. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= MAXP; p++)
            for (int mk = 0; mk < 2; mk++)
                for (int dt = 0; dt < 2; dt++) {
                    fwd_case *c = &cases[nc++];
                    int64_t local = (p + mk) % 2 ? 6 : 66;
                    int64_t hkv = (int64_t[]){4, 2, 1}[(p + o) % 3];
                    c->s = (attn_shape){1 + (p % 2), local * p, 4, hkv, dt ? 32 : 16};
                    c->P = p;
                    c->tp = 1;
                    c->order = (dt_order)o;
                    c->mask = mk ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                    c->dtype = dt ? DT_BF16 : DT_F32;
                    c->seed = 100 + (uint64_t)nc;
                    snprintf(c->name, sizeof c->name, "forward/%s/P=%d,B=%lld,S=%lld,H=4,HKV=%lld,D=%lld,%s,%s",
                             dt_order_name(c->order), p, (long long)c->s.B, (long long)c->s.S,
                             (long long)hkv, (long long)c->s.D, dt_attn_mask_name(c->mask),
                             dt_dtype_name(c->dtype));
                }
    /* Heads sharded over a tensor-parallel mesh dim too (tp x sp). */
    int meshes[][2] = {{2, 2}, {2, 3}, {4, 1}, {2, 4}};
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++) {
        fwd_case *c = &cases[nc++];
        c->tp = meshes[i][0];
        c->P = meshes[i][1];
        c->s = (attn_shape){1, 10 * c->P, 8, 4, 16};
        c->order = i % 2 ? DT_ORDER_STRIPED : DT_ORDER_ZIGZAG;
        c->mask = DT_ATTN_CAUSAL;
        c->dtype = DT_F32;
        c->seed = 7 + i;
        snprintf(c->name, sizeof c->name, "forward/%s/tp=%d,sp=%d,S=%lld,H=8,HKV=4,D=16,causal,fp32",
                 dt_order_name(c->order), c->tp, c->P, (long long)c->s.S);
    }
    /* The same on the CUDA backend (ranks sharing one GPU): skipped without a GPU. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 4; p *= 2)
            for (int v = 0; v < 2; v++) {
                fwd_case *c = &cases[nc++];
                c->P = p;
                c->tp = 1;
                c->order = (dt_order)o;
                c->mask = v ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                c->dtype = v ? DT_BF16 : DT_F32;
                c->s = (attn_shape){2, (v ? 66 : 70) * p, 4, 2, v ? 128 : 64};
                c->seed = 500 + (uint64_t)nc;
                c->backend = DT_BACKEND_CUDA;
                snprintf(c->name, sizeof c->name, "forward/cuda/%s/P=%d,B=2,S=%lld,H=4,HKV=2,D=%lld,%s,%s",
                         dt_order_name(c->order), p, (long long)c->s.S, (long long)c->s.D,
                         dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype));
            }
    for (int i = 0; i < nc; i++) {
        tests[n] = (struct CMUnitTest){cases[i].name, run_forward_case, NULL, NULL, &cases[i]};
        n++;
    }
    return h_run_cases("attention forward (cpu)", tests, (size_t)n);
}
