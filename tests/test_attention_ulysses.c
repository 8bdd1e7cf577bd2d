/* tests/test_attention_ulysses.c — attention by Layout: Ulysses (the
 * sequence's shards moved to the heads by an all-to-all,
 * dt_attention_options.a2a_dim) and the Ulysses x ring hybrid (the sequence
 * sharded over two mesh dims), on the CPU backend (and a few cases on the
 * CUDA backend, over the local transport and NCCL's all-to-all, where
 * there is one: a GPU or the emulator):
 *   - forward and backward, P = U x R from 2 to 8: pure Ulysses (R = 1),
 *     the hybrid with the ring outer or inner, every order on each dim,
 *     heads also sharded over a tensor-parallel mesh dim, GQA with kv heads
 *     that U divides and that it does not (repeated, their gradients
 *     summed), causal and full, documents and a window, fp32 and bf16:
 *     every rank's o, lse, dq, dk, dv against the double-precision
 *     reference on the whole sequence (attn_ref.c), at test_attention's
 *     and test_attention_backward's tolerances;
 *   - the communication, from the communicators' counters: a Ulysses
 *     forward is five all-to-alls over its mesh dim (q, k, v out; o, lse
 *     back) of the sizes the Layouts give, a backward nine, and nothing
 *     else on that dim; a ring forward P - 1 sends of the packed K|V block;
 *   - heads that U does not divide and an a2a_dim that does not shard the
 *     sequence are refused on every rank.
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
#include "collectives/comm.h"
#include "dtensor/dtensor.h"

#include "attn_ref.h"
#include "harness.h"

#define MAXR 8

typedef struct u_case {
    char name[200];
    int ndim, sizes[2];        /* the mesh */
    dt_layout layout;          /* of q, k, v */
    int a2a_dim;
    dt_attn_mask mask;
    dt_dtype dtype;
    attn_shape s;
    int64_t window;
    int64_t lens[64], count;   /* documents (count 0: none) */
    uint64_t seed;
    dt_backend_kind backend;   /* 0: cpu; cuda: skipped where there is none */
    dt_transport_kind transport;
    /* filled by the test */
    double *ref[5];            /* o, lse, dq, dk, dv on the whole sequence */
    dt_status st[MAXR];
    long bad[MAXR], seen[MAXR][5];
    char msg[MAXR][256];
} u_case;

static double fwd_tol(dt_dtype dt) { return dt == DT_F32 ? 1e-5 : dt == DT_F16 ? 2e-3 : 2e-2; }
static double bwd_tol(dt_dtype dt) { return dt == DT_F32 ? 1e-4 : dt == DT_F16 ? 4e-3 : 3e-2; }

/* t's local elements (got through dt_tensor_get_global into a full array
 * first filled with NaN) against ref at the same global places; the count
 * compared in *seen. */
static long compare_global(const char *what, const dt_tensor *t, const double *ref, double tol,
                           long *seen) {
    const int nd = dt_tensor_ndim(t);
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= dt_tensor_shape(t)[d];
    const dt_dtype dt = dt_tensor_dtype(t);
    void *full = malloc((size_t)n * dt_dtype_size(dt));
    memset(full, 0xff, (size_t)n * dt_dtype_size(dt));   /* NaN in every float dtype */
    long bad = 0;
    *seen = 0;
    if (dt_tensor_get_global(t, full) != DT_SUCCESS) bad = -1;
    for (int64_t i = 0; bad >= 0 && i < n; i++) {
        const double got = dt_value_get(full, dt, (size_t)i);
        if (isnan(got)) continue;
        (*seen)++;
        const double r = ref[i];
        const int ok = isinf(r) ? got == r : fabs(got - r) <= tol + tol * fabs(r);
        if (!ok && bad++ < 3)
            print_message("  %s[%lld]: got %.6g, expected %.6g\n", what, (long long)i, got, r);
    }
    free(full);
    return bad;
}

static dt_status rank_case(dt_context *ctx, void *arg) {
    u_case *c = arg;
    const int r = dt_context_rank(ctx);
    const attn_shape *s = &c->s;
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *g = NULL, *o = NULL, *lse = NULL;
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, c->ndim, c->sizes, NULL, &mesh), out);
    const int64_t qs[4] = {s->B, s->S, s->H, s->D}, ks[4] = {s->B, s->S, s->Hkv, s->D};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qs, &c->layout, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, ks, &c->layout, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, ks, &c->layout, &v), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qs, &c->layout, &g), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(q, c->seed), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(k, c->seed + 1), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(v, c->seed + 2), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(g, c->seed + 3), out);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    opts.a2a_dim = c->a2a_dim;
    opts.window = c->window;
    opts.doc_lens = c->count ? c->lens : NULL;
    opts.doc_count = c->count;
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);
    DT_TRY_GOTO(st, dt_attention_backward(q, k, v, o, lse, g, &opts, &dq, &dk, &dv), out);
    const dt_tensor *outs[5] = {o, lse, dq, dk, dv};
    static const char *const names[5] = {"o", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        const long b = compare_global(names[i], outs[i], c->ref[i],
                                      i < 2 ? fwd_tol(c->dtype) : bwd_tol(c->dtype), &c->seen[r][i]);
        c->bad[r] += b < 0 ? 1 : b;
        /* every rank compared exactly its own elements, and the outputs
         * have the inputs' Layouts */
        c->bad[r] += c->seen[r][i] != dt_tensor_local_numel(outs[i]);
    }
    c->bad[r] += !dt_layout_equal(dt_tensor_layout(o), &c->layout) ||
                 !dt_layout_equal(dt_tensor_layout(dq), &c->layout) ||
                 !dt_layout_equal(dt_tensor_layout(dk), &c->layout);
out:
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    dt_tensor *all[] = {q, k, v, g, o, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    return st;
}

static void run_case(void **state) {
    u_case *c = *state;
    const attn_shape *s = &c->s;
    const int64_t nq = s->B * s->S * s->H * s->D, nk = s->B * s->S * s->Hkv * s->D;
    double *q = ref_input(c->seed, nq, c->dtype), *k = ref_input(c->seed + 1, nk, c->dtype);
    double *v = ref_input(c->seed + 2, nk, c->dtype), *g = ref_input(c->seed + 3, nq, c->dtype);
    const int64_t sizes[5] = {nq, s->B * s->H * s->S, nq, nk, nk};
    for (int i = 0; i < 5; i++) c->ref[i] = malloc((size_t)sizes[i] * sizeof(double));
    const attn_ref_rule rule = {c->mask == DT_ATTN_CAUSAL, c->window, c->count ? c->lens : NULL,
                                c->count};
    const double scale = 1.0 / sqrt((double)s->D);
    ref_attention_forward_rule(s, &rule, q, k, v, scale, c->ref[0], c->ref[1]);
    ref_attention_backward_rule(s, &rule, q, k, v, g, scale, c->ref[2], c->ref[3], c->ref[4]);
    memset(c->bad, 0, sizeof c->bad);
    const int world = c->sizes[0] * (c->ndim > 1 ? c->sizes[1] : 1);
    const dt_backend_kind backend = c->backend ? c->backend : DT_BACKEND_CPU;
    char why[512];
    if (!h_pair_available(world, backend, c->transport, why, sizeof why)) {
        for (int i = 0; i < 5; i++) free(c->ref[i]);
        free(q), free(k), free(v), free(g);
        print_message("skipped: %s\n", why);
        skip();
    }
    const dt_status st = h_launch_on(world, backend, c->transport, rank_case, c);
    int ok = st == DT_SUCCESS;
    for (int r = 0; r < world; r++) {
        if (c->st[r] != DT_SUCCESS) print_error("rank %d: %s\n", r, c->msg[r]);
        else if (c->bad[r]) print_error("rank %d: %ld mismatches\n", r, c->bad[r]);
        ok &= c->st[r] == DT_SUCCESS && c->bad[r] == 0;
    }
    free(q), free(k), free(v), free(g);
    for (int i = 0; i < 5; i++) free(c->ref[i]);
    assert_true(ok);
}

/* ------------------------------------------------------------- counters */

typedef struct count_case {
    int ulysses;               /* 1: a Ulysses call over mesh dim 0; 0: a ring */
    dt_comm_counters fwd[MAXR], bwd[MAXR];
    dt_status st[MAXR];
} count_case;

enum { CP = 4, CB = 2, CS = 32, CH = 4, CHKV = 2, CD = 8 };

static dt_status rank_count(dt_context *ctx, void *arg) {
    count_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL,
              *dv = NULL;
    int P = CP;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh), out);
    const dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    const int64_t qs[4] = {CB, CS, CH, CD}, ks[4] = {CB, CS, CHKV, CD};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_BF16, 4, qs, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_BF16, 4, ks, &lay, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_BF16, 4, ks, &lay, &v), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(q, 1), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(k, 2), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(v, 3), out);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.a2a_dim = c->ulysses ? 0 : -1;
    dt_comm *comm = dt_mesh_comm(mesh, 0);
    dt_comm_counters_reset(comm);
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);
    DT_TRY_GOTO(st, dt_comm_counters_get(comm, &c->fwd[r]), out);
    dt_comm_counters_reset(comm);
    DT_TRY_GOTO(st, dt_attention_backward(q, k, v, o, lse, q, &opts, &dq, &dk, &dv), out);
    DT_TRY_GOTO(st, dt_comm_counters_get(comm, &c->bwd[r]), out);
out:
    c->st[r] = st;
    dt_tensor *all[] = {q, k, v, o, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    return st;
}

/* Exact counts over the sequence's mesh dim (P = 4, B = 2, S = 32, H = 4,
 * H_kv = 2, D = 8, bf16): a local q is B S/P H D = 256 elements, k and v
 * 128, lse (fp32) B H S/P = 64; an all-to-all sends and receives (P - 1)/P
 * of a rank's tensor. Ulysses (U = 4 > H_kv: k, v repeated e = 2 times
 * first): forward q, k, v, o, lse; backward q, k, v, o, lse, dout in and
 * dq, dk, dv out; nothing else on the dim. Ring forward: P - 1 hops of the
 * packed K|V block; backward: P - 1 hops of K|V, P - 1 of the fp32 dK|dV
 * sums, and the finished dK|dV home in bf16 (two groups). */
static void test_counters(void **state) {
    (void)state;
    for (int ulysses = 0; ulysses < 2; ulysses++) {
        count_case c;
        memset(&c, 0, sizeof c);
        c.ulysses = ulysses;
        assert_int_equal(h_launch(CP, rank_count, &c), DT_SUCCESS);
        const uint64_t q_b = CB * CS / CP * CH * CD * 2, kv_b = CB * CS / CP * CHKV * CD * 2;
        const uint64_t lse_b = CB * CH * CS / CP * 4, share = CP - 1, e = CP / CHKV;
        for (int r = 0; r < CP; r++) {
            const dt_comm_counters *f = &c.fwd[r], *b = &c.bwd[r];
            assert_int_equal(c.st[r], DT_SUCCESS);
            if (ulysses) {
                const uint64_t fwd = (q_b + 2 * e * kv_b + q_b + lse_b) * share / CP;
                const uint64_t bwd = (3 * q_b + 2 * e * kv_b + lse_b + q_b + 2 * e * kv_b) * share / CP;
                assert_int_equal(f->calls[DT_COMM_ALL_TO_ALL], 5);
                assert_int_equal(f->bytes_sent[DT_COMM_ALL_TO_ALL], fwd);
                assert_int_equal(f->bytes_recv[DT_COMM_ALL_TO_ALL], fwd);
                assert_int_equal(b->calls[DT_COMM_ALL_TO_ALL], 9);
                assert_int_equal(b->bytes_sent[DT_COMM_ALL_TO_ALL], bwd);
                assert_int_equal(b->bytes_recv[DT_COMM_ALL_TO_ALL], bwd);
                assert_int_equal(f->calls[DT_COMM_P2P] + b->calls[DT_COMM_P2P], 0);
            } else {
                assert_int_equal(f->calls[DT_COMM_P2P], CP - 1);
                assert_int_equal(f->bytes_sent[DT_COMM_P2P], (CP - 1) * 2 * kv_b);
                assert_int_equal(f->bytes_recv[DT_COMM_P2P], (CP - 1) * 2 * kv_b);
                assert_int_equal(f->calls[DT_COMM_ALL_TO_ALL], 0);
                /* backward: K|V hops P - 1, dK|dV (fp32, twice a bf16 block)
                 * P - 1 hops on the way and the way home */
                const uint64_t bwd = (CP - 1) * 2 * kv_b + (CP - 1) * 2 * (2 * kv_b) + 2 * kv_b;
                assert_int_equal(b->calls[DT_COMM_P2P], CP + 2);
                assert_int_equal(b->bytes_sent[DT_COMM_P2P], bwd);
                assert_int_equal(b->bytes_recv[DT_COMM_P2P], bwd);
                assert_int_equal(b->calls[DT_COMM_ALL_TO_ALL], 0);
            }
        }
    }
}

/* ------------------------------------------------------------ refusals */

typedef struct bad_case {
    int which;   /* 0: heads not divisible by U; 1: a2a_dim not sharding the sequence */
    dt_status st[MAXR];
    char msg[MAXR][256];
} bad_case;

static dt_status rank_bad(dt_context *ctx, void *arg) {
    bad_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = NULL, *lse = NULL;
    int sizes[2] = {2, 2};
    dt_status st = dt_mesh_create(ctx, 2, sizes, NULL, &mesh);
    const dt_layout lay = c->which == 0 ? dt_layout_2d(dt_replicate(), dt_shard(1, DT_ORDER_CONTIGUOUS))
                                        : dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS),
                                                       dt_shard(1, DT_ORDER_CONTIGUOUS));
    const int64_t shape[4] = {2, 8, c->which == 0 ? 3 : 2, 8};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &q);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.a2a_dim = c->which == 0 ? 1 : 0;
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, &opts, &o, &lse);
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    if (o || lse) c->st[r] = DT_ERR_INTERNAL;   /* a refusal hands out nothing */
    dt_tensor_destroy(o);
    dt_tensor_destroy(lse);
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return DT_SUCCESS;
}

static void test_refusals(void **state) {
    (void)state;
    static const char *const why[2] = {"heads must be divisible", "must shard the sequence"};
    for (int which = 0; which < 2; which++) {
        bad_case c;
        memset(&c, 0, sizeof c);
        c.which = which;
        assert_int_equal(h_launch(4, rank_bad, &c), DT_SUCCESS);
        for (int r = 0; r < 4; r++) {
            if (c.st[r] != DT_ERR_INVALID_ARGUMENT || !strstr(c.msg[r], why[which]))
                print_error("case %d rank %d: %s: %s\n", which, r, dt_status_name(c.st[r]),
                            c.msg[r]);
            assert_int_equal(c.st[r], DT_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(c.msg[r], why[which]));
        }
    }
}

/* ---------------------------------------------------------------- cases */

static const char *on(dt_placement p) {
    static char buf[4][40];
    static int i;
    char *b = buf[i++ % 4];
    if (p.kind == DT_SHARD) snprintf(b, 40, "S%d%c", p.dim, dt_order_name(p.order)[0]);
    else snprintf(b, 40, "R");
    return b;
}

int main(void) {
    enum { NC = 48 };
    static u_case cases[NC];
    static struct CMUnitTest tests[NC + 2];
    int n = 0, nc = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_counters);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_refusals);
    static const dt_order orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
    /* Pure Ulysses: U = 2, 3, 4, 8 over one mesh dim, every order; kv heads
     * U divides, and fewer (repeated). */
    static const int us[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++)
        for (int o = 0; o < 3; o++) {
            u_case *c = &cases[nc++];
            memset(c, 0, sizeof *c);
            const int U = us[i];
            c->ndim = 1;
            c->sizes[0] = U;
            c->layout = dt_layout_1d(dt_shard(1, orders[o]));
            c->a2a_dim = 0;
            c->mask = (i + o) % 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
            c->dtype = (i + o) % 3 == 2 ? DT_BF16 : DT_F32;
            /* kv heads: as many as the heads, one, or two (repeated for
             * U = 3, 4, 8: e = 3, 2, 4, two kv heads a rank before) */
            c->s = (attn_shape){2, 2 * U * (U <= 4 ? 6 : 3), 2 * U, (int64_t[]){2 * U, 1, 2}[o], 8};
            c->seed = 300 + (uint64_t)nc;
        }
    /* The hybrid: R x U meshes, the ring outer (mesh dim 0) or inner. */
    static const int rus[][2] = {{2, 2}, {2, 4}, {4, 2}, {2, 3}, {3, 2}};
    for (int i = 0; i < 5; i++)
        for (int outer = 0; outer < 2; outer++) {
            u_case *c = &cases[nc++];
            memset(c, 0, sizeof *c);
            const int R = rus[i][0], U = rus[i][1];
            const dt_order oring = orders[(i + outer) % 3], ou = orders[(i + 2 * outer + 1) % 3];
            c->ndim = 2;
            c->sizes[0] = outer ? U : R;
            c->sizes[1] = outer ? R : U;
            c->layout = outer ? dt_layout_2d(dt_shard(1, ou), dt_shard(1, oring))
                              : dt_layout_2d(dt_shard(1, oring), dt_shard(1, ou));
            c->a2a_dim = outer ? 0 : 1;
            c->mask = i % 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
            c->dtype = i == 2 ? DT_BF16 : DT_F32;
            c->s = (attn_shape){1, 4 * R * U, 2 * U, i % 2 ? 1 : U, 8};
            c->seed = 400 + (uint64_t)nc;
        }
    /* Heads over a tensor-parallel mesh dim too (T x U, T outer); and a
     * hybrid with documents and a window. */
    for (int v = 0; v < 3; v++) {
        u_case *c = &cases[nc++];
        memset(c, 0, sizeof *c);
        c->ndim = 2;
        c->sizes[0] = 2;
        c->sizes[1] = v == 2 ? 3 : 2;
        c->a2a_dim = 1;
        c->dtype = DT_F32;
        c->mask = DT_ATTN_CAUSAL;
        c->seed = 500 + (uint64_t)nc;
        if (v < 2) {   /* tp x Ulysses: heads over both at the call */
            c->layout = dt_layout_2d(dt_shard(2, DT_ORDER_CONTIGUOUS), dt_shard(1, orders[v + 1]));
            c->s = (attn_shape){2, 24, 8, v ? 2 : 4, 8};
        } else {       /* ring x Ulysses with documents and a window */
            c->layout = dt_layout_2d(dt_shard(1, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_CONTIGUOUS));
            c->s = (attn_shape){2, 36, 6, 3, 8};
            static const int64_t lens[] = {5, 1, 14, 16, 9, 3, 24};   /* rows 36 + 36 */
            c->count = 7;
            memcpy(c->lens, lens, sizeof lens);
            c->window = 7;
        }
    }
    /* The CUDA backend (on a GPU or the emulator; skipped elsewhere): pure
     * Ulysses over the local transport and over NCCL (its all-to-all), and
     * a hybrid, in bf16 and fp16. */
    for (int v = 0; v < 4; v++) {
        u_case *c = &cases[nc++];
        memset(c, 0, sizeof *c);
        c->backend = DT_BACKEND_CUDA;
        c->transport = v == 1 ? DT_TRANSPORT_NCCL : DT_TRANSPORT_LOCAL;
        c->ndim = v == 3 ? 2 : 1;
        c->sizes[0] = v == 3 ? 2 : 4;
        c->sizes[1] = 2;
        c->layout = v == 3 ? dt_layout_2d(dt_shard(1, DT_ORDER_ZIGZAG), dt_shard(1, DT_ORDER_CONTIGUOUS))
                           : dt_layout_1d(dt_shard(1, orders[v]));
        c->a2a_dim = v == 3 ? 1 : 0;
        c->mask = v == 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
        c->dtype = v % 2 ? DT_F16 : DT_BF16;
        c->s = (attn_shape){1, 32, 8, v == 0 ? 2 : 4, 16};
        c->seed = 600 + (uint64_t)nc;
    }
    for (int i = 0; i < nc; i++) {
        u_case *c = &cases[i];
        snprintf(c->name, sizeof c->name,
                 "ulysses/%s%s/mesh=%dx%d,[%s,%s],a2a=%d/B=%lld,S=%lld,H=%lld,HKV=%lld,D=%lld,%s,%s%s%s",
                 c->backend == DT_BACKEND_CUDA ? "cuda" : "cpu",
                 c->transport == DT_TRANSPORT_NCCL ? "-nccl" : "",
                 c->sizes[0], c->ndim > 1 ? c->sizes[1] : 1, on(c->layout.placements[0]),
                 c->ndim > 1 ? on(c->layout.placements[1]) : "-", c->a2a_dim, (long long)c->s.B,
                 (long long)c->s.S, (long long)c->s.H, (long long)c->s.Hkv, (long long)c->s.D,
                 dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype), c->count ? ",docs" : "",
                 c->window ? ",window" : "");
        tests[n++] = (struct CMUnitTest){c->name, run_case, NULL, NULL, c};
    }
    return h_run_cases("attention_ulysses", tests, (size_t)n);
}
