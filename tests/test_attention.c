/* tests/test_attention.c — the mask rule, the CPU block kernel and the
 * distributed forward pass (Ring, Striped, Zigzag) against a double-precision
 * reference on the gathered sequence, written here from the definitions:
 *   o[b,i,h] = sum_j softmax_j(scale * q[b,i,h].k[b,j,g]) v[b,j,g], g = h/(H/Hkv),
 *   over keys j <= i (causal) or all j; lse = log sum_j exp(scale q.k).
 * Inputs come from dt_random_value(seed, global index); each rank checks its
 * own rows, located with the test's own index maps (harness.c). Rank threads
 * record; the main thread asserts.
 *
 * The CUDA tensor-core kernels (attention/cuda/mma_fwd.cu forward,
 * attention/cuda/mma_bwd.cu backward) are covered three ways: their index math
 * (attention/cuda/mma_layout.h) against an emulation of ldmatrix and mma.sync
 * written here from the PTX ISA (test_mma_fragments, test_mma_bwd_fragments),
 * and their tile bounds against dt_attn_tile_class (test_mma_tile_bounds) —
 * all run everywhere; and, on a GPU, the "forward/cuda-kernels/..." cases
 * here and the "backward/cuda-kernels/..." cases of
 * test_attention_backward.c run the distributed passes with
 * DT_ATTN_KERNEL=simple, =mma and =wgmma (where it can run: a 9.0 device;
 * the forward at D = 128 with its loads by a producer warpgroup, the
 * default, and again with its loads by thread 0) against the double
 * reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention/attention.h"
#include "attention/block.h"
#include "attention/cuda/kernels.h"
#include "attention/cuda/mma_layout.h"
#include "dtensor/dtensor.h"
#ifdef DT_HAVE_CUDA
#include "dtensor/backend_cuda.h"
#include "dtensor/context_internal.h"
#endif
#include "attn_ref.h"
#include "harness.h"
#ifdef DT_CUDA_EMULATE
#include "emu/emu.h"
#endif

#define MAXP 8

/* ------------------------------------------------------- forward cases */

typedef struct fwd_case {
    char name[128];
    attn_shape s;
    int P, tp;                 /* sequence ranks; tensor-parallel ranks (heads) */
    dt_order head_order;       /* heads' Shard(2) order; on a tp of 1 the heads are
                                  replicated unless it is non-contiguous */
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    uint64_t seed;
    dt_backend_kind backend;   /* cpu (0 means cpu too) or cuda; cuda cases skip without a GPU */
    int kernels;               /* cuda: run with DT_ATTN_KERNEL=simple, =mma, =wgmma (and wgmma
                                  with its producer warpgroup off), each checked */
    int thread0;               /* cuda: the wgmma forward's producer warpgroup off, its loads
                                  by thread 0 (set by the test) */
    dt_attn_kernel_choice kernel;   /* cuda: dt_attention_tuning.kernel (0: auto) */
    int huge;                  /* q, k multiples of 25: logits of magnitude 1e4 (exact in fp32) */
    int group;                 /* dt_attention_options.group: ring steps per launch */
    int nccl;                  /* cuda: the NCCL transport (a GPU a rank), not the local one */
    /* filled by the test */
    double *q, *k, *v, *o_ref, *lse_ref;
    dt_status st[MAXP * 2];
    long bad[MAXP * 2];
    double max_err[MAXP * 2];
    char msg[MAXP * 2][256];
} fwd_case;

/* |got - ref| <= tol + tol |ref| for o and lse: fp32 1e-5; bf16 2e-2 (the
 * issue's bounds); fp16 2e-3 (o rounded to fp16, 2^-12 relative, and on
 * the tensor-core kernels P too: about 5e-4 at |v| <= 1, four times over). */
static double attn_tol(dt_dtype dt) { return dt == DT_F32 ? 1e-5 : dt == DT_F16 ? 2e-3 : 2e-2; }

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
    dt_placement heads = c->tp > 1 || c->head_order != DT_ORDER_CONTIGUOUS
                             ? dt_shard(2, c->head_order) : dt_replicate();
    dt_layout lay = dt_layout_2d(heads, dt_shard(1, c->order));
    int64_t qshape[4] = {s->B, s->S, s->H, s->D}, kshape[4] = {s->B, s->S, s->Hkv, s->D};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &v), out);
    /* Rows of this rank: heads [t*h, t*h+h), sequence indices of its shard. */
    int t = dt_mesh_coord(mesh, 0), j = dt_mesh_coord(mesh, 1);
    int64_t c_rows = s->S / c->P, h = s->H / c->tp, hkv = s->Hkv / c->tp;
    size_t n = (size_t)(s->B * c_rows * h * s->D), nl = (size_t)(s->B * h * c_rows);
    if (c->kernels || c->kernel) {
        /* fp16 and chosen values: each rank sets its rows of the test's inputs */
        size_t nkv = (size_t)(s->B * c_rows * hkv * s->D);
        ref = malloc((n > nkv ? n : nkv) * sizeof *ref);
        ref_local_rows(c->q, s->B, s->S, s->H, s->D, c->order, c->P, j, t, h, ref);
        DT_TRY_GOTO(st, ref_set_local(q, ref), out);
        ref_local_rows(c->k, s->B, s->S, s->Hkv, s->D, c->order, c->P, j, t, hkv, ref);
        DT_TRY_GOTO(st, ref_set_local(k, ref), out);
        ref_local_rows(c->v, s->B, s->S, s->Hkv, s->D, c->order, c->P, j, t, hkv, ref);
        DT_TRY_GOTO(st, ref_set_local(v, ref), out);
        free(ref);
        ref = NULL;
    } else {
        DT_TRY_GOTO(st, dt_tensor_fill_random(q, c->seed), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(k, c->seed + 1), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(v, c->seed + 2), out);
    }
    dt_attention_tuning tuning = DT_ATTENTION_TUNING_INIT;
    tuning.producer = !c->thread0;   /* ignored off CUDA */
    tuning.kernel = c->kernel;
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    opts.group = c->group;
    opts.tuning = &tuning;
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);

    got = malloc(n * sizeof *got);
    got_lse = malloc(nl * sizeof *got_lse);
    ref = malloc(n * sizeof *ref);
    ref_lse = malloc(nl * sizeof *ref_lse);
    ref_local_rows(c->o_ref, s->B, s->S, s->H, s->D, c->order, c->P, j, t, h, ref);
    ref_local_lse(c->lse_ref, s->B, s->S, s->H, c->order, c->P, j, t, h, ref_lse);
    DT_TRY_GOTO(st, ref_get_f32(o, got), out);
    DT_TRY_GOTO(st, dt_tensor_get_local(lse, got_lse, nl * sizeof *got_lse), out);
    const double tol = attn_tol(c->dtype);
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

/* Logits of magnitude 1e4: q, k multiples of 25 (exact in bf16 and fp16),
 * so every q.k is an exact integer in fp32. */
static double *huge_input(int64_t n, int which) {
    double *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = 25.0 * (double)(((i * (which ? 3 : 7)) % 5) - 2);
    return x;
}

/* One launch of the case: 1 if every rank succeeded and matched the
 * reference, else 0 after printing what failed. `kernel` names the
 * DT_ATTN_KERNEL value in force (NULL: not set by the test). The caller
 * asserts, after restoring the environment and freeing the inputs. */
static dt_status launch_ranks(fwd_case *c, dt_backend_kind backend) {
    memset(c->st, 0, sizeof c->st);
    memset(c->bad, 0, sizeof c->bad);
    memset(c->max_err, 0, sizeof c->max_err);
    return h_launch_on(c->P * c->tp, backend, c->nccl ? DT_TRANSPORT_NCCL : DT_TRANSPORT_LOCAL,
                       rank_forward, c);
}

static int judge_case(fwd_case *c, dt_status st, const char *kernel) {
    const char *k = kernel ? kernel : "unset";
    int ok = st == DT_SUCCESS;
    if (!ok) print_error("%s (DT_ATTN_KERNEL %s): %s\n", c->name, k, dt_last_error());
    for (int r = 0; r < c->P * c->tp; r++) {
        if (c->st[r] != DT_SUCCESS) {
            print_error("rank %d (DT_ATTN_KERNEL %s): %s\n", r, k, c->msg[r]);
            ok = 0;
        } else if (c->bad[r] || !(c->max_err[r] < attn_tol(c->dtype))) {
            print_error("rank %d (DT_ATTN_KERNEL %s): %ld mismatches, max error %.3g\n", r, k,
                        c->bad[r], c->max_err[r]);
            ok = 0;
        }
    }
    return ok;
}

static int launch_case(fwd_case *c, dt_backend_kind backend, const char *kernel) {
    return judge_case(c, launch_ranks(c, backend), kernel);
}

/* launch_case with the wgmma kernel forced (DT_ATTN_KERNEL=wgmma, or
 * c->kernel wgmma-latest): 1 if it passed, or if every rank refused with
 * DT_ERR_NOT_SUPPORTED for a reason outside the case (not a 9.0 device, or
 * no sm_90 build: *refused = 1). */
static int wgmma_case(fwd_case *c, dt_backend_kind backend, int *refused) {
    const dt_status st = launch_ranks(c, backend);
    *refused = st == DT_ERR_NOT_SUPPORTED;
    for (int r = 0; r < c->P * c->tp && *refused; r++)
        *refused = c->st[r] == DT_ERR_NOT_SUPPORTED &&
                   (strstr(c->msg[r], "needs a compute capability 9.0") ||
                    strstr(c->msg[r], "wgmma kernel was not built"));
    char kernel[64];
    snprintf(kernel, sizeof kernel, "%s%s", c->kernel ? dt_attn_kernel_choice_name(c->kernel) : "wgmma",
             c->thread0 ? ", loads by thread 0" : "");
    return *refused || judge_case(c, st, kernel);
}

static void run_forward_case(void **state) {
    fwd_case *c = *state;
    const attn_shape *s = &c->s;
    dt_backend_kind backend = c->backend ? c->backend : DT_BACKEND_CPU;
    char why[512];
    if (!h_pair_available(c->P * c->tp, backend, c->nccl ? DT_TRANSPORT_NCCL : DT_TRANSPORT_LOCAL,
                          why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    int64_t nq = s->B * s->S * s->H * s->D, nk = s->B * s->S * s->Hkv * s->D;
    c->q = c->huge ? huge_input(nq, 0) : ref_input(c->seed, nq, c->dtype);
    c->k = c->huge ? huge_input(nk, 1) : ref_input(c->seed + 1, nk, c->dtype);
    c->v = ref_input(c->seed + 2, nk, c->dtype);
    c->o_ref = malloc((size_t)nq * sizeof(double));
    c->lse_ref = malloc((size_t)(s->B * s->H * s->S) * sizeof(double));
    ref_attention_forward(s, c->q, c->k, c->v, c->mask == DT_ATTN_CAUSAL, 1.0 / sqrt((double)s->D), c->o_ref,
              c->lse_ref);
    int ok_simple = 1, ok = 1, ok_wgmma = 1;
    if (c->kernels) {
        /* Every CUDA forward kernel on the same inputs, each against the
         * reference; the variable is read when each call's plan is made.
         * wgmma runs only on a 9.0 device with an sm_90 build: elsewhere
         * every rank must refuse it, saying which of the two is missing. */
        char *saved = h_env_set("DT_ATTN_KERNEL", "simple");
        ok_simple = launch_case(c, backend, "simple");
        setenv("DT_ATTN_KERNEL", "mma", 1);
        ok = launch_case(c, backend, "mma");
        setenv("DT_ATTN_KERNEL", "wgmma", 1);
        int refused = 0;
        ok_wgmma = wgmma_case(c, backend, &refused);
        if (!refused && c->s.D == 128) {   /* without the producer warpgroup (thread 0's
                                              loads) */
            c->thread0 = 1;
            ok_wgmma = wgmma_case(c, backend, &refused) && ok_wgmma;
            c->thread0 = 0;
        }
        h_env_restore("DT_ATTN_KERNEL", saved);
        if (refused) print_message("wgmma kernel not run: %s\n", c->msg[0]);
    } else if (c->kernel == DT_ATTN_KERNEL_WGMMA_LATEST) {   /* where it can run, as =wgmma */
        int refused = 0;
        ok_wgmma = wgmma_case(c, backend, &refused);
        if (!refused && c->s.D == 128) {   /* and with thread 0's loads */
            c->thread0 = 1;
            ok_wgmma = wgmma_case(c, backend, &refused) && ok_wgmma;
            c->thread0 = 0;
        }
        if (refused) print_message("wgmma kernel not run: %s\n", c->msg[0]);
    } else {
        ok = launch_case(c, backend, c->kernel ? dt_attn_kernel_choice_name(c->kernel) : NULL);
    }
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->o_ref);
    free(c->lse_ref);
    assert_true(ok_simple);
    assert_true(ok);
    assert_true(ok_wgmma);
}

/* ------------------------------------------------------------ mask tests */

static void test_segments_follow_the_orders(void **state) {
    (void)state;
    for (int p = 1; p <= MAXP; p++)
        for (int o = 0; o < DT_ORDER_COUNT; o++)
            for (int j = 0; j < p; j++) {
                int64_t S = 4 * p * 3, idx[96];
                h_order_indices((dt_order)o, S, p, j, idx);
                const dt_attn_segment seg = dt_attn_segment_of((dt_order)o, S, p, j);
                assert_int_equal(seg.len, S / p);
                for (int64_t x = 0; x < seg.len; x++) {
                    assert_int_equal(dt_attn_pos(seg, x), idx[x]);
                    /* the kernels' bounds rest on positions growing with the row */
                    if (x > 0) assert_true(dt_attn_pos(seg, x) > dt_attn_pos(seg, x - 1));
                }
                /* the ring step that finishes the rows: the last with a pair */
                for (int mask = 0; mask < 2; mask++) {
                    int last = 0;
                    for (int t = 1; t < p; t++)
                        if (dt_attn_pairs(dt_attn_rule_of((dt_attn_mask)mask), seg,
                                          dt_attn_segment_of((dt_order)o, S, p, (j - t + p) % p)) > 0)
                            last = t;
                    assert_int_equal(dt_attn_ring_last_step((dt_order)o, (dt_attn_mask)mask, S, p, j),
                                     last);
                    if (mask == DT_ATTN_CAUSAL && o == DT_ORDER_CONTIGUOUS) assert_int_equal(last, j);
                    else assert_int_equal(last, p - 1);
                }
            }
}

/* A ring's steps in launches (mask.h's dt_attn_ring_group, _runs and
 * _run_keys), for every order, mask, P, rank and group asked for: the
 * group is at most what was asked and P - 1 (for striped causal the
 * greatest power of two up to those and 64); the launches take every step
 * once, step 0 alone, then runs of at most the group's steps (a power of
 * two for striped causal) that cross neither the sources' wrap from 0 to
 * P - 1 nor the last step with pairs; and every (query, key) pair of a
 * launch, its keys laid as the forward pass lands them (lowest source
 * first; zigzag's second chunks highest source first; striped causal's
 * rows in turns from n slots), gets the causal mask's verdict on the
 * tokens' own positions (h_order_indices), the keys' positions growing
 * with the row as the kernels' bounds need. */
static void test_ring_runs_keep_the_mask(void **state) {
    (void)state;
    static const int asked[] = {0, 1, 2, 3, 4, 5, 7, 8, 100};
    const int64_t c = 4, h = c / 2;
    for (int p = 1; p <= MAXP; p++)
        for (int o = 0; o < DT_ORDER_COUNT; o++)
            for (int mask = 0; mask < 2; mask++)
                for (size_t a = 0; a < sizeof asked / sizeof *asked; a++) {
                    const int64_t S = c * p;
                    const int striped = o == DT_ORDER_STRIPED && mask == DT_ATTN_CAUSAL;
                    const int g = dt_attn_ring_group((dt_order)o, (dt_attn_mask)mask, p, asked[a]);
                    const int most = asked[a] < p - 1 ? asked[a] : p - 1;   /* at most */
                    assert_true(g >= 1 && (g == 1 || g <= most));
                    if (striped) {
                        assert_int_equal(g & (g - 1), 0);
                        assert_true(g <= 64 && (2 * g > (most < 64 ? most : 64) || g == 1));
                    } else {
                        assert_int_equal(g, most > 1 ? most : 1);
                    }
                    for (int j = 0; j < p; j++) {
                        int first[MAXP + 1];
                        const int n = dt_attn_ring_runs((dt_order)o, (dt_attn_mask)mask, S, p, j,
                                                        g, first);
                        const int last =
                            dt_attn_ring_last_step((dt_order)o, (dt_attn_mask)mask, S, p, j);
                        assert_true(n >= 1 && n <= p);
                        assert_int_equal(first[0], 0);
                        assert_int_equal(first[1], 1);
                        assert_int_equal(first[n], p);
                        int64_t qidx[96];
                        h_order_indices((dt_order)o, S, p, j, qidx);
                        for (int r = 0; r < n; r++) {
                            const int t0 = first[r], t1 = first[r + 1], len = t1 - t0;
                            assert_true(len >= 1 && len <= g);
                            if (striped) assert_int_equal(len & (len - 1), 0);
                            assert_false(t0 <= j && j < t1 - 1);         /* the wrap */
                            assert_false(t0 <= last && last < t1 - 1);   /* the last step */
                            dt_attn_segment qs, ks;
                            const int64_t slots = dt_attn_ring_run_keys(
                                (dt_order)o, (dt_attn_mask)mask, S, p, j, t0, t1, &qs, &ks);
                            assert_int_equal(slots, striped && t0 > 0 ? len : 1);
                            assert_int_equal(qs.len, c);
                            assert_int_equal(ks.len, len * c);
                            const int s_hi = ((j - t0) % p + p) % p, s_lo = s_hi - len + 1;
                            assert_true(s_lo >= 0);
                            int64_t prev = -1;
                            for (int64_t y = 0; y < ks.len; y++) {
                                int64_t src, row;   /* where key row y of the launch lies */
                                if (slots > 1) {
                                    src = s_lo + y % slots;
                                    row = y / slots;
                                } else if (o == DT_ORDER_ZIGZAG && y >= len * h) {
                                    src = s_hi - (y - len * h) / h;
                                    row = h + (y - len * h) % h;
                                } else if (o == DT_ORDER_ZIGZAG) {
                                    src = s_lo + y / h;
                                    row = y % h;
                                } else {
                                    src = s_lo + y / c;
                                    row = y % c;
                                }
                                int64_t kidx[96];
                                h_order_indices((dt_order)o, S, p, (int)src, kidx);
                                if (mask == DT_ATTN_CAUSAL) {
                                    assert_true(kidx[row] > prev);
                                    assert_true(y == 0 ||
                                                dt_attn_pos(ks, y) > dt_attn_pos(ks, y - 1));
                                }
                                prev = kidx[row];
                                for (int64_t x = 0; x < c; x++)
                                    if (mask == DT_ATTN_CAUSAL &&
                                        (qidx[x] >= kidx[row]) !=
                                            (dt_attn_pos(qs, x) >= dt_attn_pos(ks, y)))
                                        fail_msg("%s P=%d rank %d group %d, steps %d..%d: query "
                                                 "%lld (token %lld), key %lld (token %lld of rank "
                                                 "%lld): the launch's positions disagree",
                                                 dt_order_name((dt_order)o), p, j, g, t0, t1 - 1,
                                                 (long long)x, (long long)qidx[x], (long long)y,
                                                 (long long)kidx[row], (long long)src);
                            }
                        }
                    }
                }
    /* striped causal slots: 64 at most (the tensor-core kernels' limit) */
    assert_int_equal(dt_attn_ring_group(DT_ORDER_STRIPED, DT_ATTN_CAUSAL, 200, 100), 64);
    assert_int_equal(dt_attn_ring_group(DT_ORDER_STRIPED, DT_ATTN_FULL, 200, 100), 100);
    assert_int_equal(dt_attn_ring_group(DT_ORDER_CONTIGUOUS, DT_ATTN_CAUSAL, 200, 100), 100);
}

/* Tile classes and loop bounds agree with the element-wise rule, and pair
 * counts with a brute-force count; striped blocks follow the paper's masks. */
static void check_mask_rule(dt_attn_segment q, dt_attn_segment k) {
    int64_t pairs = 0;
    for (int64_t x = 0; x < q.len; x++)
        for (int64_t y = 0; y < k.len; y++) pairs += dt_attn_pos(q, x) >= dt_attn_pos(k, y);
    assert_int_equal(dt_attn_pairs(dt_attn_rule_of(DT_ATTN_CAUSAL), q, k), pairs);
    assert_int_equal(dt_attn_pairs(dt_attn_rule_of(DT_ATTN_FULL), q, k), q.len * k.len);
    assert_int_equal(dt_attn_no_pairs(DT_ATTN_CAUSAL, q, k), pairs == 0);
    assert_false(dt_attn_no_pairs(DT_ATTN_FULL, q, k));
    /* A kernel's tiles: those with a pair the mask allows, and the query
     * tiles with any */
    static const int64_t tile_sizes[][2] = {{1, 1}, {2, 3}, {4, 4}, {3, 5}, {8, 2}};
    for (int i = 0; i < 5; i++)
        for (int mask = 0; mask < 2; mask++) {
            const int64_t bm = tile_sizes[i][0], bn = tile_sizes[i][1];
            int64_t tiles = 0, visits = 0, got_visits = -1;
            for (int64_t x0 = 0; x0 < q.len; x0 += bm) {
                int64_t n = 0;
                for (int64_t y0 = 0; y0 < k.len; y0 += bn) {
                    int any = 0;
                    for (int64_t x = x0; x < x0 + bm && x < q.len; x++)
                        for (int64_t y = y0; y < y0 + bn && y < k.len; y++)
                            any |= mask == DT_ATTN_FULL || dt_attn_pos(q, x) >= dt_attn_pos(k, y);
                    n += any;
                }
                tiles += n;
                visits += n > 0;
            }
            assert_int_equal(dt_attn_tiles(dt_attn_rule_of((dt_attn_mask)mask), q, k, bm, bn, &got_visits), tiles);
            assert_int_equal(got_visits, visits);
        }
    /* The loop bounds kernels use: a prefix of keys per query position, a
     * suffix of queries per key position (any p). */
    for (int64_t pos = -2; pos < 64; pos++) {
        int64_t keys = 0, first = q.len;
        for (int64_t y = 0; y < k.len; y++) keys += dt_attn_pos(k, y) <= pos;
        for (int64_t x = q.len - 1; x >= 0 && dt_attn_pos(q, x) >= pos; x--) first = x;
        if (dt_attn_keys_upto(DT_ATTN_CAUSAL, k, pos) != keys ||
            dt_attn_queries_from(DT_ATTN_CAUSAL, q, pos) != first)
            fail_msg("q (%lld,%lld,%lld,%lld,%lld) k (%lld,%lld,%lld,%lld,%lld) position %lld: "
                     "keys %lld want %lld, queries from %lld want %lld", (long long)q.start,
                     (long long)q.stride, (long long)q.len, (long long)q.split, (long long)q.gap,
                     (long long)k.start, (long long)k.stride, (long long)k.len, (long long)k.split,
                     (long long)k.gap, (long long)pos,
                     (long long)dt_attn_keys_upto(DT_ATTN_CAUSAL, k, pos), (long long)keys,
                     (long long)dt_attn_queries_from(DT_ATTN_CAUSAL, q, pos), (long long)first);
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
    /* Part of a segment's rows: the same positions, and the same key limits
     * (shifted by x0, within the part) for every position. */
    for (int64_t x0 = 0; x0 <= k.len; x0++)
        for (int64_t n = 0; x0 + n <= k.len; n++) {
            const dt_attn_segment part = dt_attn_segment_rows(k, x0, n);
            assert_int_equal(part.len, n);
            for (int64_t x = 0; x < n; x++) assert_int_equal(dt_attn_pos(part, x), dt_attn_pos(k, x0 + x));
            for (int64_t pos = -2; pos < 64; pos++) {
                int64_t keys = dt_attn_keys_upto(DT_ATTN_CAUSAL, k, pos) - x0;
                keys = keys < 0 ? 0 : keys > n ? n : keys;
                assert_int_equal(dt_attn_keys_upto(DT_ATTN_CAUSAL, part, pos), keys);
            }
        }
}

static void test_tile_classes_and_pairs(void **state) {
    (void)state;
    /* (split, gap) of a segment: none; a jump inside (zigzag's); one before
     * row 0; one past the last row; a jump of one position (no hole) */
    const int64_t jumps[][2] = {{0, 0}, {4, 6}, {0, 5}, {20, 3}, {5, 1}};
    for (int64_t qs = 0; qs < 7; qs++)
        for (int64_t ks = 0; ks < 7; ks++)
            for (int64_t stride = 1; stride <= 4; stride++)
                for (int jq = 0; jq < 5; jq++)
                    for (int jk = 0; jk < 5; jk++)
                        if ((jq == 0 && jk == 0) || stride <= 2)   /* jumps at strides 1, 2 */
                            check_mask_rule((dt_attn_segment){qs, stride, 9, jumps[jq][0], jumps[jq][1]},
                                            (dt_attn_segment){ks, stride, 11, jumps[jk][0], jumps[jk][1]});
    /* Striped: y <= x when j >= k, y < x when j < k (Striped Attention paper). */
    for (int p = 2; p <= MAXP; p++)
        for (int j = 0; j < p; j++)
            for (int kk = 0; kk < p; kk++) {
                const dt_attn_segment qj = dt_attn_segment_of(DT_ORDER_STRIPED, 5 * p, p, j);
                const dt_attn_segment kk_seg = dt_attn_segment_of(DT_ORDER_STRIPED, 5 * p, p, kk);
                for (int64_t x = 0; x < 5; x++)
                    for (int64_t y = 0; y < 5; y++) {
                        int allowed = dt_attn_pos(qj, x) >= dt_attn_pos(kk_seg, y);
                        assert_int_equal(allowed, j >= kk ? y <= x : y < x);
                    }
            }
}

/* A block whose keys all come after its queries, as a call's only block
 * (first and last: m, l and acc hold NaN before, which it must not read),
 * gives 0 output and -inf lse, never NaN; as the first of two such blocks
 * it starts m, l and acc at -inf, 0, 0 for the second to finish. */
static void test_fully_masked_block(void **state) {
    (void)state;
    enum { N = 70, D = 8 };
    float q[N * D], k[N * D], v[N * D], m[N], l[N], acc[N * D], o[N * D], lse[N];
    for (int i = 0; i < N * D; i++) q[i] = k[i] = v[i] = 0.5f;
    char scratch[1 << 16];
    assert_true(dt_attn_kernels_cpu.fwd_scratch(D, 1, N) <= sizeof scratch);
    for (int split = 0; split < 2; split++) {
        for (int i = 0; i < N; i++) m[i] = l[i] = lse[i] = NAN;
        for (int i = 0; i < N * D; i++) acc[i] = o[i] = NAN;
        dt_attn_block_args a = {.dtype = DT_F32, .batch = 1, .heads = 1, .kv_heads = 1, .dim = D,
                                .q = q, .q_batch_stride = N * D, .k = k, .v = v,
                                .kv_batch_stride = N * D, .qseg = {0, 2, N}, .kseg = {1000, 2, N},
                                .mask = DT_ATTN_CAUSAL, .scale = 1.0f, .m = m, .l = l,
                                .ml_batch_stride = N, .ml_head_stride = N, .acc = acc,
                                .acc_batch_stride = N * D, .first = 1, .last = !split, .o = o,
                                .lse = lse};
        assert_int_equal(dt_attn_kernels_cpu.fwd(NULL, &a, scratch), DT_SUCCESS);
        if (split) {
            for (int i = 0; i < N; i++) assert_true(isinf(m[i]) && m[i] < 0 && l[i] == 0.0f);
            for (int i = 0; i < N * D; i++) assert_true(acc[i] == 0.0f && isnan(o[i]));
            a.first = 0;
            a.last = 1;
            a.kseg.start = 2000;
            assert_int_equal(dt_attn_kernels_cpu.fwd(NULL, &a, scratch), DT_SUCCESS);
        }
        for (int i = 0; i < N; i++) {
            assert_true(isinf(lse[i]) && lse[i] < 0);
            for (int d = 0; d < D; d++) assert_true(o[i * D + d] == 0.0f);
        }
    }
}

/* The backward of a block no query of which attends any key (all keys
 * after the queries under the causal mask, or no query at all): with
 * `first` it writes dk, dv as 0 over NaN, without it leaves them as they
 * were; dq is untouched either way. */
static void test_backward_block_without_pairs(void **state) {
    (void)state;
    enum { N = 70, D = 8, G = 2 };
    float q[N * G * D], k[N * G * D], dq[N * G * D], dk[N * G * D], dv[N * G * D];
    float lse[G * N], delta[G * N];
    for (int i = 0; i < N * G * D; i++) q[i] = k[i] = 0.5f;
    for (int i = 0; i < G * N; i++) lse[i] = delta[i] = 0.25f;
    static char scratch[1 << 20];
    assert_true(dt_attn_kernels_cpu.bwd_scratch(D) <= sizeof scratch);
    for (int no_query = 0; no_query < 2; no_query++)
        for (int first = 0; first < 2; first++) {
            for (int i = 0; i < N * G * D; i++) {
                dq[i] = 3.0f;
                dk[i] = dv[i] = first ? NAN : 1.5f;
            }
            dt_attn_block_bwd_args a = {
                .dtype = DT_F32, .batch = 1, .heads = G, .kv_heads = G, .dim = D, .q = q,
                .dout = q, .q_batch_stride = N * G * D, .k = k, .v = k,
                .kv_batch_stride = N * G * D, .qseg = {0, 2, no_query ? 0 : N},
                .kseg = {1000, 2, N}, .mask = DT_ATTN_CAUSAL, .scale = 1.0f, .lse = lse,
                .delta = delta, .ml_batch_stride = G * N, .ml_head_stride = N, .dq = dq,
                .dq_batch_stride = N * G * D, .dk = dk, .dv = dv, .first = first};
            assert_int_equal(dt_attn_kernels_cpu.bwd(NULL, &a, scratch), DT_SUCCESS);
            for (int i = 0; i < N * G * D; i++) {
                assert_true(dq[i] == 3.0f);
                assert_true(dk[i] == (first ? 0.0f : 1.5f) && dv[i] == dk[i]);
            }
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
    static char scratch[1 << 17];
    dt_attn_block_args a = {.dtype = DT_F32, .batch = 1, .heads = 1, .kv_heads = 1, .dim = D,
                            .q = q, .q_batch_stride = S * D, .k = k, .v = v, .kv_batch_stride = S * D,
                            .qseg = {0, 1, S}, .kseg = {0, 1, S}, .mask = DT_ATTN_CAUSAL,
                            .scale = 1.0f, .m = m, .l = l, .ml_batch_stride = S, .ml_head_stride = S,
                            .acc = acc, .acc_batch_stride = S * D, .first = 1, .last = 1, .o = o,
                            .lse = lse};
    assert_int_equal(dt_attn_kernels_cpu.fwd(NULL, &a, scratch), DT_SUCCESS);
    attn_shape s = {1, S, 1, 1, D};
    ref_attention_forward(&s, qd, kd, vd, 1, 1.0, o_ref, lse_ref);
    double big = 0;
    for (int i = 0; i < S; i++) big = fmax(big, fabs(lse_ref[i]));
    assert_true(big >= 1e4);
    assert_int_equal(h_compare("huge logits: o", o, o_ref, S * D, 1e-5, 1e-5, NULL), 0);
    assert_int_equal(h_compare("huge logits: lse", lse, lse_ref, S, 1e-5, 1e-6, NULL), 0);
}

/* ------------------------------------- tensor-core kernel, on the CPU */

/* An emulation of the two warp-wide PTX instructions the tensor-core kernel
 * (attention/cuda/mma_fwd.cu) is built on, written here from the PTX
 * ISA's tables, independently of attention/cuda/mma_layout.h. Running the
 * kernel's loops with the kernel's index functions (attention/cuda/mma_layout.h) over it
 * must give plain matmuls. A .b32 register is a pair of 16-bit halves, held
 * as floats (low half first); values are whatever the tile holds. */
typedef struct emu_reg {
    float h[2];
} emu_reg;

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives addr[l],
 * the element offset of row l % 8 of matrix l / 8 (16-byte aligned);
 * register m of lane l receives M_m[l/4][2(l%4) + h], h = 0, 1, or with
 * .trans M_m[2(l%4) + h][l/4], where M_m[r][c] = smem[addr[8m + r] + c]. */
static void emu_ldmatrix(const float *smem, const int addr[32], int trans, emu_reg out[32][4]) {
    for (int l = 0; l < 32; l++) assert_int_equal(addr[l] % 8, 0);
    for (int l = 0; l < 32; l++)
        for (int m = 0; m < 4; m++)
            for (int h = 0; h < 2; h++) {
                int r = trans ? 2 * (l % 4) + h : l / 4, c = trans ? l / 4 : 2 * (l % 4) + h;
                out[l][m].h[h] = smem[addr[8 * m + r] + c];
            }
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += A B. With g = l >> 2,
 * t = l % 4 and element i of a fragment = half i % 2 of register i / 2:
 *   A (8 elements): row g for i in {0, 1, 4, 5}, else g + 8;
 *                   col 2t + (i & 1), plus 8 for i >= 4
 *   B (4 elements): row 2t + (i & 1), plus 8 for i >= 2; col g
 *   C (4 floats):   row g for i < 2, else g + 8; col 2t + (i & 1) */
static void emu_mma(float d[32][4], emu_reg a[32][4], emu_reg b0[32], emu_reg b1[32]) {
    double A[16][16], B[16][8];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) A[r][c] = NAN;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) B[r][c] = NAN;
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l % 4;
        for (int i = 0; i < 8; i++) {
            int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = a[l][i / 2].h[i % 2];
        }
        for (int i = 0; i < 4; i++)
            B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = (i / 2 ? b1 : b0)[l].h[i % 2];
    }
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l % 4;
        for (int i = 0; i < 4; i++) {
            int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
            double sum = 0;
            for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
            d[l][i] += (float)sum;
        }
    }
}

/* The 8 row addresses of each matrix of an ldmatrix.x4 fall in 8 distinct
 * 16-byte bank groups (tiles start on 128-byte boundaries): no conflict. */
static void check_banks(const int addr[32]) {
    for (int m = 0; m < 4; m++) {
        int seen = 0;
        for (int r = 0; r < 8; r++) seen |= 1 << ((addr[8 * m + r] * 2 / 16) % 8);
        assert_int_equal(seen, 0xff);
    }
}

/* Lane l's ldmatrix address for a 16x16 block at (row0, col0) of a tile. */
typedef int (*lane_fn)(int lane);
static void ldsm_addrs(int addr[32], int row0, int col0, lane_fn row, lane_fn col, int D) {
    for (int l = 0; l < 32; l++) addr[l] = dt_mma_swz(row0 + row(l), col0 + col(l), D);
    check_banks(addr);
}

/* One query tile through the kernel's steps for head dim D: the cp.async
 * copies into swizzled tiles, Q fragments, S = Q K^T, P re-packed from S,
 * O = P V, every element located with the kernel's functions. */
static void check_mma_tile(int D, uint64_t seed) {
    enum { R = 64 };   /* rows of every tile: DT_MMA_BM = DT_MMA_BN */
    assert_int_equal(DT_MMA_BM, R);
    assert_int_equal(DT_MMA_BN, R);
    float *q = malloc(sizeof(float) * R * D), *k = malloc(sizeof(float) * R * D);
    float *v = malloc(sizeof(float) * R * D), *sq = malloc(sizeof(float) * R * D);
    float *sk = malloc(sizeof(float) * R * D), *sv = malloc(sizeof(float) * R * D);
    int *hits = calloc((size_t)(R * D), sizeof(int));
    for (int i = 0; i < R * D; i++) {
        q[i] = dt_random_value(seed, (uint64_t)i);
        k[i] = dt_random_value(seed + 1, (uint64_t)i);
        v[i] = dt_random_value(seed + 2, (uint64_t)i);
    }
    /* Copies: each lands 16-byte aligned, every element exactly once, and a
     * chunk's 8 elements stay contiguous. */
    for (int e = 0; e < R * D / 8; e++) {
        int r = dt_mma_copy_row(e, D), c = dt_mma_copy_col(e, D), off = dt_mma_swz(r, c, D);
        assert_true(r >= 0 && r < R && c >= 0 && c < D && c % 8 == 0);
        assert_int_equal(off % 8, 0);
        for (int w = 0; w < 8; w++) {
            assert_int_equal(dt_mma_swz(r, c + w, D), off + w);
            sq[off + w] = q[r * D + c + w];
            sk[off + w] = k[r * D + c + w];
            sv[off + w] = v[r * D + c + w];
            hits[off + w]++;
        }
    }
    for (int i = 0; i < R * D; i++) assert_int_equal(hits[i], 1);

    static emu_reg qf[8][32][4], kb[32][4], vb[32][4], pa[32][4], b0[32], b1[32];
    static float s[R / 8][32][4], o[16][32][4];
    static double pm[16][R];
    int addr[32];
    long bad = 0;
    for (int warp = 0; warp < DT_MMA_WARPS; warp++) {
        for (int kk = 0; kk < D / 16; kk++) {
            ldsm_addrs(addr, 16 * warp, 16 * kk, dt_mma_ldsm_a_row, dt_mma_ldsm_a_col, D);
            emu_ldmatrix(sq, addr, 0, qf[kk]);
        }
        /* S = Q K^T (tile_scores) */
        memset(s, 0, sizeof s);
        for (int kk = 0; kk < D / 16; kk++)
            for (int jj = 0; jj < R / 16; jj++) {
                ldsm_addrs(addr, 16 * jj, 16 * kk, dt_mma_ldsm_k_row, dt_mma_ldsm_k_col, D);
                emu_ldmatrix(sk, addr, 0, kb);
                for (int l = 0; l < 32; l++) b0[l] = kb[l][0], b1[l] = kb[l][1];
                emu_mma(s[2 * jj], qf[kk], b0, b1);
                for (int l = 0; l < 32; l++) b0[l] = kb[l][2], b1[l] = kb[l][3];
                emu_mma(s[2 * jj + 1], qf[kk], b0, b1);
            }
        int cover[16][R];
        memset(cover, 0, sizeof cover);
        for (int j = 0; j < R / 8; j++)
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++) {
                    int row = dt_mma_c_row(l, i), col = 8 * j + dt_mma_c_col(l, i);
                    /* the lane's rows are g and g + 8 (the softmax's halves) */
                    assert_int_equal(row, (l >> 2) + 8 * dt_mma_c_half(i));
                    cover[row][col]++;
                    double ref = 0;
                    for (int d = 0; d < D; d++) ref += (double)q[(16 * warp + row) * D + d] * k[col * D + d];
                    if (fabs(s[j][l][i] - ref) > 1e-4 * (1 + fabs(ref)) && bad++ < 5)
                        fprintf(stderr, "  S: D=%d warp %d lane %d tile %d elem %d: %g, expected %g\n",
                                D, warp, l, j, i, s[j][l][i], ref);
                    pm[row][col] = s[j][l][i];
                }
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < R; c++) assert_int_equal(cover[r][c], 1);
        /* O = P V with P = S (tile_pv) */
        memset(o, 0, sizeof o);
        for (int kk = 0; kk < R / 16; kk++) {
            for (int l = 0; l < 32; l++)
                for (int r = 0; r < 4; r++) {
                    int j = dt_mma_p_tile(kk, r), e = dt_mma_p_elem(r);
                    pa[l][r].h[0] = s[j][l][e];
                    pa[l][r].h[1] = s[j][l][e + 1];
                }
            for (int jd = 0; jd < D / 16; jd++) {
                ldsm_addrs(addr, 16 * kk, 16 * jd, dt_mma_ldsm_v_row, dt_mma_ldsm_v_col, D);
                emu_ldmatrix(sv, addr, 1, vb);
                for (int l = 0; l < 32; l++) b0[l] = vb[l][0], b1[l] = vb[l][1];
                emu_mma(o[2 * jd], pa, b0, b1);
                for (int l = 0; l < 32; l++) b0[l] = vb[l][2], b1[l] = vb[l][3];
                emu_mma(o[2 * jd + 1], pa, b0, b1);
            }
        }
        for (int j = 0; j < D / 8; j++)
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++) {
                    int row = dt_mma_c_row(l, i), col = 8 * j + dt_mma_c_col(l, i);
                    double ref = 0;
                    for (int y = 0; y < R; y++) ref += pm[row][y] * v[y * D + col];
                    if (fabs(o[j][l][i] - ref) > 1e-4 * (1 + fabs(ref)) && bad++ < 5)
                        fprintf(stderr, "  O: D=%d warp %d lane %d tile %d elem %d: %g, expected %g\n",
                                D, warp, l, j, i, o[j][l][i], ref);
                }
    }
    free(q);
    free(k);
    free(v);
    free(sq);
    free(sk);
    free(sv);
    free(hits);
    assert_int_equal(bad, 0);
}

static void test_mma_fragments(void **state) {
    (void)state;
    for (int seed = 1; seed <= 3; seed++) {
        check_mma_tile(64, (uint64_t)(40 * seed));
        check_mma_tile(128, (uint64_t)(40 * seed + 7));
    }
}

/* The tensor-core BACKWARD kernel's index math (attention/cuda/mma_bwd.cu), one
 * (head, query tile) iteration of one CTA (8 warps, 64 query rows, 128
 * keys) for head dim D, over the emulator:
 *   phase 1, per warp (16 query rows from 16 (w % 4), 64 keys from
 *            64 (w / 4)): S = Q K^T and dP = dO V^T (warp_abt), then P and
 *            dS stored into swizzled [64][128] tiles (store_p_ds,
 *            dt_mma_ps_off);
 *   phase 2, per warp (16 keys): dV = P^T dO and dK = dS^T Q (warp_dkdv:
 *            ldmatrix.trans of the P / dS tiles with dt_mma_ldsm_at_*, of
 *            the dO / Q tiles with dt_mma_ldsm_v_*);
 *   phase 3, per warp (the 16 rows of phase 1, D/2 columns from
 *            (D/2) (w / 4)): dQ = dS K with dS from the dS tile (ldmatrix,
 *            dt_mma_ldsm_a_*) and K by ldmatrix.trans (warp_dq).
 * Any values will do for P and dS (the fragments are what is tested), so P
 * := S and dS := dP, and each product is checked against a plain matmul. */
static void check_mma_bwd_tile(int D, uint64_t seed) {
    enum { R = 64, N = 128, W = 8 };   /* query rows, keys, warps */
    assert_int_equal(DT_MMA_BM, R);
    assert_int_equal(DT_MMA_BWD_BN, N);
    assert_int_equal(DT_MMA_BWD_WARPS, W);
    float *in[4], *sw[4];   /* q, do ([R][D]), k, v ([N][D]): row-major, then swizzled */
    for (int m = 0; m < 4; m++) {
        const int rows = m < 2 ? R : N;
        in[m] = malloc(sizeof(float) * (size_t)(rows * D));
        sw[m] = malloc(sizeof(float) * (size_t)(rows * D));
        for (int i = 0; i < rows * D; i++) in[m][i] = dt_random_value(seed + (uint64_t)m, (uint64_t)i);
        for (int e = 0; e < rows * D / 8; e++) {
            int r = dt_mma_copy_row(e, D), c = dt_mma_copy_col(e, D), off = dt_mma_swz(r, c, D);
            for (int w = 0; w < 8; w++) sw[m][off + w] = in[m][r * D + c + w];
        }
    }
    const float *q = in[0], *dO = in[1], *k = in[2], *v = in[3];
    const float *sq = sw[0], *sdo = sw[1], *sk = sw[2], *sv = sw[3];
    static float sp[R * N], sds[R * N];
    static int written[R * N];
    static float acc[2][W][8][32][4];   /* [S or dP][warp][n-tile][lane][elem] */
    static emu_reg af[32][4], bb[32][4], pa[32][4], b0[32], b1[32], da[N / 16][32][4];
    static float dk[16][32][4], dv[16][32][4], dq[2][32][4];
    int addr[32];
    long bad = 0;
    memset(written, 0, sizeof written);
    memset(acc, 0, sizeof acc);
    /* phase 1 */
    for (int warp = 0; warp < W; warp++)
        for (int which = 0; which < 2; which++) {   /* S = Q K^T, dP = dO V^T */
            const int rg = dt_mma_bwd_rows(warp), key0 = 64 * dt_mma_bwd_half(warp);
            const float *sa = which ? sdo : sq, *sb = (which ? sv : sk) + key0 * D;
            const float *a = which ? dO : q, *bm = which ? v : k;
            float (*s)[32][4] = acc[which][warp];
            for (int kk = 0; kk < D / 16; kk++) {
                ldsm_addrs(addr, 16 * rg, 16 * kk, dt_mma_ldsm_a_row, dt_mma_ldsm_a_col, D);
                emu_ldmatrix(sa, addr, 0, af);
                for (int jj = 0; jj < 4; jj++) {
                    ldsm_addrs(addr, 16 * jj, 16 * kk, dt_mma_ldsm_k_row, dt_mma_ldsm_k_col, D);
                    emu_ldmatrix(sb, addr, 0, bb);
                    for (int l = 0; l < 32; l++) b0[l] = bb[l][0], b1[l] = bb[l][1];
                    emu_mma(s[2 * jj], af, b0, b1);
                    for (int l = 0; l < 32; l++) b0[l] = bb[l][2], b1[l] = bb[l][3];
                    emu_mma(s[2 * jj + 1], af, b0, b1);
                }
            }
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++)
                    for (int i = 0; i < 4; i++) {
                        int row = 16 * rg + dt_mma_c_row(l, i), col = key0 + 8 * j + dt_mma_c_col(l, i);
                        double ref = 0;
                        for (int d = 0; d < D; d++) ref += (double)a[row * D + d] * bm[col * D + d];
                        if (fabs(s[j][l][i] - ref) > 1e-4 * (1 + fabs(ref)) && bad++ < 5)
                            fprintf(stderr, "  bwd %s: D=%d warp %d lane %d tile %d elem %d: %g, "
                                    "expected %g\n", which ? "dP" : "S", D, warp, l, j, i,
                                    s[j][l][i], ref);
                    }
            /* store_p_ds: one .b32 per lane and (j, half), conflict-free */
            for (int j = 0; j < 8; j++)
                for (int half = 0; half < 2; half++) {
                    uint32_t banks = 0;
                    for (int l = 0; l < 32; l++) {
                        int off = dt_mma_ps_off(warp, l, j, half);
                        assert_int_equal(off % 2, 0);
                        banks |= 1u << ((off / 2) % 32);
                        /* the pair is elements 2 half, 2 half + 1: row and keys */
                        assert_int_equal(off, dt_mma_swz(16 * rg + dt_mma_c_row(l, 2 * half),
                                                         key0 + 8 * j + dt_mma_c_col(l, 2 * half), N));
                        assert_int_equal(dt_mma_c_col(l, 2 * half + 1), dt_mma_c_col(l, 2 * half) + 1);
                        assert_int_equal(dt_mma_c_row(l, 2 * half + 1), dt_mma_c_row(l, 2 * half));
                        float *dst = which ? sds : sp;
                        dst[off] = s[j][l][2 * half];
                        dst[off + 1] = s[j][l][2 * half + 1];
                        if (!which) written[off]++, written[off + 1]++;
                    }
                    assert_int_equal((unsigned)banks, 0xffffffffu);
                }
        }
    for (int i = 0; i < R * N; i++) assert_int_equal(written[i], 1);
    /* The P and dS matrices as stored, unswizzled: pm[query][key]. */
    static double pm[R][N], dsm[R][N];
    for (int x = 0; x < R; x++)
        for (int y = 0; y < N; y++) {
            pm[x][y] = sp[dt_mma_swz(x, y, N)];
            dsm[x][y] = sds[dt_mma_swz(x, y, N)];
        }
    /* phase 2: dV = P^T dO, dK = dS^T Q for keys 16w .. 16w+15 */
    for (int warp = 0; warp < W; warp++) {
        memset(dk, 0, sizeof dk);
        memset(dv, 0, sizeof dv);
        for (int kk = 0; kk < R / 16; kk++)
            for (int which = 0; which < 2; which++) {   /* dV, dK */
                ldsm_addrs(addr, 16 * kk, 16 * warp, dt_mma_ldsm_at_row, dt_mma_ldsm_at_col, N);
                emu_ldmatrix(which ? sds : sp, addr, 1, pa);
                for (int jd = 0; jd < D / 16; jd++) {
                    ldsm_addrs(addr, 16 * kk, 16 * jd, dt_mma_ldsm_v_row, dt_mma_ldsm_v_col, D);
                    emu_ldmatrix(which ? sq : sdo, addr, 1, bb);
                    float (*o)[32][4] = which ? dk : dv;
                    for (int l = 0; l < 32; l++) b0[l] = bb[l][0], b1[l] = bb[l][1];
                    emu_mma(o[2 * jd], pa, b0, b1);
                    for (int l = 0; l < 32; l++) b0[l] = bb[l][2], b1[l] = bb[l][3];
                    emu_mma(o[2 * jd + 1], pa, b0, b1);
                }
            }
        for (int which = 0; which < 2; which++)
            for (int j = 0; j < D / 8; j++)
                for (int l = 0; l < 32; l++)
                    for (int i = 0; i < 4; i++) {
                        int key = 16 * warp + dt_mma_c_row(l, i), col = 8 * j + dt_mma_c_col(l, i);
                        double ref = 0;
                        for (int x = 0; x < R; x++)
                            ref += which ? dsm[x][key] * q[x * D + col] : pm[x][key] * dO[x * D + col];
                        float got = which ? dk[j][l][i] : dv[j][l][i];
                        if (fabs(got - ref) > 1e-4 * (1 + fabs(ref)) && bad++ < 5)
                            fprintf(stderr, "  bwd %s: D=%d warp %d lane %d tile %d elem %d: %g, "
                                    "expected %g\n", which ? "dK" : "dV", D, warp, l, j, i, got, ref);
                    }
    }
    /* phase 3: dQ = dS K for the warp's 16 rows and D/2 columns, 16 at a time */
    for (int warp = 0; warp < W; warp++) {
        const int rg = dt_mma_bwd_rows(warp), c0 = (D / 2) * dt_mma_bwd_half(warp);
        for (int kk = 0; kk < N / 16; kk++) {
            ldsm_addrs(addr, 16 * rg, 16 * kk, dt_mma_ldsm_a_row, dt_mma_ldsm_a_col, N);
            emu_ldmatrix(sds, addr, 0, da[kk]);
        }
        for (int jd = 0; jd < D / 32; jd++) {
            memset(dq, 0, sizeof dq);
            for (int kk = 0; kk < N / 16; kk++) {
                ldsm_addrs(addr, 16 * kk, c0 + 16 * jd, dt_mma_ldsm_v_row, dt_mma_ldsm_v_col, D);
                emu_ldmatrix(sk, addr, 1, bb);
                for (int l = 0; l < 32; l++) b0[l] = bb[l][0], b1[l] = bb[l][1];
                emu_mma(dq[0], da[kk], b0, b1);
                for (int l = 0; l < 32; l++) b0[l] = bb[l][2], b1[l] = bb[l][3];
                emu_mma(dq[1], da[kk], b0, b1);
            }
            for (int n = 0; n < 2; n++)
                for (int l = 0; l < 32; l++)
                    for (int i = 0; i < 4; i++) {
                        int row = 16 * rg + dt_mma_c_row(l, i);
                        int col = c0 + 16 * jd + 8 * n + dt_mma_c_col(l, i);
                        double ref = 0;
                        for (int y = 0; y < N; y++) ref += dsm[row][y] * k[y * D + col];
                        if (fabs(dq[n][l][i] - ref) > 1e-4 * (1 + fabs(ref)) && bad++ < 5)
                            fprintf(stderr, "  bwd dQ: D=%d warp %d lane %d cols %d elem %d: %g, "
                                    "expected %g\n", D, warp, l, c0 + 16 * jd + 8 * n, i,
                                    dq[n][l][i], ref);
                    }
        }
    }
    for (int m = 0; m < 4; m++) free(in[m]), free(sw[m]);
    assert_int_equal(bad, 0);
}

static void test_mma_bwd_fragments(void **state) {
    (void)state;
    for (int seed = 1; seed <= 3; seed++) {
        check_mma_bwd_tile(64, (uint64_t)(60 * seed));
        check_mma_bwd_tile(128, (uint64_t)(60 * seed + 7));
    }
}

/* The backward kernels' query-tile bounds (query tiles of bm rows: the
 * mma.sync kernel's 64, the wgmma kernel's 128 at D = 64) for every key
 * tile of k: the visited query tiles are exactly the non-empty ones, and
 * the unmasked ones exactly the full ones of whole key tiles. */
static void check_bwd_bounds(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k, int bm) {
    const int64_t nqt = dt_mma_query_tiles(q.len, bm);
    assert_int_equal(nqt, (q.len + bm - 1) / bm);
    for (int64_t y0 = 0; y0 < k.len; y0 += DT_MMA_BWD_BN) {
        int64_t y1 = y0 + DT_MMA_BWD_BN < k.len ? y0 + DT_MMA_BWD_BN : k.len;
        int whole = y0 + DT_MMA_BWD_BN <= k.len;
        int64_t first =
            dt_mma_bwd_first_qtile(dt_attn_queries_from(mask, q, dt_attn_pos(k, y0)), q.len, bm);
        int64_t unm = dt_mma_bwd_unmasked_qtile(
            whole ? dt_attn_queries_from(mask, q, dt_attn_pos(k, y0 + DT_MMA_BWD_BN - 1)) : 0,
            whole, q.len, bm);
        assert_true(first >= 0 && first <= nqt && unm >= 0 && unm <= nqt);
        for (int64_t qt = 0; qt < nqt; qt++) {
            int64_t x0 = qt * bm, x1 = x0 + bm < q.len ? x0 + bm : q.len;
            dt_attn_tile cls = dt_attn_tile_class(mask, q, x0, x1, k, y0, y1);
            if ((qt >= first) != (cls != DT_TILE_EMPTY) ||
                (qt >= unm) != (cls == DT_TILE_FULL && whole))
                fail_msg("bwd (bm %d): q (%lld,%lld,%lld) k (%lld,%lld,%lld) y0 %lld qt %lld: "
                         "visited %d, unmasked %d, class %d, whole %d", bm,
                         (long long)q.start, (long long)q.stride, (long long)q.len,
                         (long long)k.start, (long long)k.stride, (long long)k.len, (long long)y0,
                         (long long)qt, qt >= first, qt >= unm, (int)cls, whole);
        }
    }
}

/* The launch order's premise (attention/cuda/mma_layout.h): rank 0 is the heaviest tile.
 * The forward's key tiles per query tile never fall as the query tile
 * rises, the backward's query tiles per key tile never rise as the key tile
 * rises. */
static void check_heaviest_first(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k) {
    int64_t prev = 0;
    for (int64_t x0 = 0; x0 < q.len; x0 += DT_MMA_BM) {
        int64_t x1 = x0 + DT_MMA_BM < q.len ? x0 + DT_MMA_BM : q.len;
        int64_t nt = dt_mma_key_tiles(dt_attn_keys_upto(mask, k, dt_attn_pos(q, x1 - 1)));
        assert_true(nt >= prev);
        prev = nt;
    }
    prev = INT64_MAX;
    for (int64_t y0 = 0; y0 < k.len; y0 += DT_MMA_BWD_BN) {
        int64_t first = dt_mma_bwd_first_qtile(dt_attn_queries_from(mask, q, dt_attn_pos(k, y0)),
                                               q.len, DT_MMA_BM);
        int64_t visits = dt_mma_query_tiles(q.len, DT_MMA_BM) - first;
        assert_true(visits <= prev);
        prev = visits;
    }
}

/* The tensor-core kernels' closed-form bounds agree with mask.h: per-row key
 * limits with the element rule; the forward's visited key tiles are exactly
 * the non-empty ones, its unmasked ones full and whole; the backward's
 * likewise for query tiles (check_bwd_bounds). */
static void check_bounds(dt_attn_mask mask, dt_attn_segment q, dt_attn_segment k) {
    assert_true(dt_mma_keys_fit(k));
    const dt_mma_keys keys = dt_mma_keys_of(mask, k);   /* the kernels' form */
    for (int64_t x = 0; x < q.len; x++) {
        int64_t n = 0;
        for (int64_t y = 0; y < k.len; y++)
            n += mask == DT_ATTN_FULL || dt_attn_pos(q, x) >= dt_attn_pos(k, y);
        assert_int_equal(dt_attn_keys_upto(mask, k, dt_attn_pos(q, x)), n);
        assert_int_equal(dt_mma_keys_upto(&keys, dt_attn_pos(q, x)), n);
    }
    const int64_t ktiles = (k.len + DT_MMA_BN - 1) / DT_MMA_BN;
    for (int64_t x0 = 0; x0 < q.len; x0 += DT_MMA_BM) {
        int64_t x1 = x0 + DT_MMA_BM < q.len ? x0 + DT_MMA_BM : q.len;
        int64_t nt = dt_mma_key_tiles(dt_attn_keys_upto(mask, k, dt_attn_pos(q, x1 - 1)));
        int64_t nu = dt_mma_unmasked_tiles(dt_attn_keys_upto(mask, k, dt_attn_pos(q, x0)));
        assert_true(nu <= nt && nt <= ktiles);
        for (int64_t kt = 0; kt < ktiles; kt++) {
            int64_t y0 = kt * DT_MMA_BN, y1 = y0 + DT_MMA_BN < k.len ? y0 + DT_MMA_BN : k.len;
            dt_attn_tile cls = dt_attn_tile_class(mask, q, x0, x1, k, y0, y1);
            if ((kt < nt) != (cls != DT_TILE_EMPTY))
                fail_msg("q (%lld,%lld,%lld) k (%lld,%lld,%lld) x0 %lld kt %lld: visited %d, class %d",
                         (long long)q.start, (long long)q.stride, (long long)q.len,
                         (long long)k.start, (long long)k.stride, (long long)k.len,
                         (long long)x0, (long long)kt, kt < nt, (int)cls);
            if (kt < nu) assert_true(cls == DT_TILE_FULL && y0 + DT_MMA_BN <= k.len);
        }
    }
    check_bwd_bounds(mask, q, k, DT_MMA_BM);
    check_bwd_bounds(mask, q, k, 2 * DT_MMA_BM);
    check_heaviest_first(mask, q, k);
}

/* The launch order of the tensor-core kernels (dt_mma_sched) against the
 * loop nest it stands for: sections of `section` units, the narrower one
 * (where section does not divide the units) first, and inside one rank by
 * rank, unit by unit; section 1 is one unit after another. */
static void test_mma_launch_order(void **state) {
    (void)state;
    const int64_t ranks[] = {1, 2, 5, 32}, units[] = {1, 3, 7, 16}, sections[] = {1, 2, 3, 7, 16, 40};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t c = 0; c < 6; c++) {
                const int64_t nr = ranks[a], nu = units[b], sec = sections[c];
                const int64_t narrow = nu % sec;   /* the narrower section's width, 0: none */
                int64_t block = 0;
                for (int64_t base = 0; base < nu; base += base == 0 && narrow ? narrow : sec) {
                    const int64_t width = base == 0 && narrow ? narrow : sec;
                    for (int64_t r = 0; r < nr; r++)
                        for (int64_t u = base; u < base + width; u++, block++) {
                            int64_t rank = -1, unit = -1;
                            dt_mma_sched(block, nr, nu, sec, &rank, &unit);
                            /* the kernels' form, by multiplication */
                            const dt_mma_order ord = dt_mma_order_of(nr, nu, sec);
                            uint32_t rank32 = UINT32_MAX, unit32 = UINT32_MAX;
                            dt_mma_order_at(&ord, (uint32_t)block, &rank32, &unit32);
                            if (rank32 != (uint32_t)r || unit32 != (uint32_t)u)
                                fail_msg("dt_mma_order_at: ranks %lld units %lld section %lld "
                                         "block %lld: (%u, %u), want (%lld, %lld)", (long long)nr,
                                         (long long)nu, (long long)sec, (long long)block, rank32,
                                         unit32, (long long)r, (long long)u);
                            if (rank != r || unit != u)
                                fail_msg("ranks %lld units %lld section %lld block %lld: "
                                         "(%lld, %lld), want (%lld, %lld)", (long long)nr,
                                         (long long)nu, (long long)sec, (long long)block,
                                         (long long)rank, (long long)unit, (long long)r,
                                         (long long)u);
                        }
                }
                assert_int_equal(block, nr * nu);   /* the nest visited every pair once */
                if (sec == 1)   /* the order before sections: unit-major */
                    for (int64_t blk = 0; blk < nr * nu; blk++) {
                        int64_t rank, unit;
                        dt_mma_sched(blk, nr, nu, sec, &rank, &unit);
                        assert_true(rank == blk % nr && unit == blk / nr);
                    }
            }
    /* units per section: half the L2 over the bytes a unit re-reads */
    const int64_t MiB = 1 << 20;
    assert_int_equal(dt_mma_sched_section(32, 2 * MiB, 50 * MiB), 12);
    assert_int_equal(dt_mma_sched_section(8, 2 * MiB, 50 * MiB), 8);
    assert_int_equal(dt_mma_sched_section(32, 40 * MiB, 50 * MiB), 1);
    assert_int_equal(dt_mma_sched_section(32, 2 * MiB, 0), 1);
    assert_int_equal(dt_mma_sched_section(5, 0, 50 * MiB), 5);
}

/* The kernels' division by a launch's constants (attention/cuda/mma_layout.h: dt_udiv,
 * dt_mma_keys_upto) against C's `/` and `%` and mask.h's dt_attn_keys_upto:
 * every divisor up to 4096 and the powers of 2 and their neighbours up to
 * 2^32 - 1, with dividends at and around its multiples, the ends of the
 * 32-bit range and pseudo-random ones. */
static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void check_udiv(uint32_t d, uint64_t *seed) {
    const dt_udiv v = dt_udiv_of(d);
    uint32_t n[64];
    int c = 0;
    const uint32_t k = (uint32_t)(splitmix(seed) % ((uint64_t)UINT32_MAX / d + 1));   /* a multiple's index */
    const uint32_t fixed[] = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, k * d, k * d - 1, k * d + d - 1,
                              (UINT32_MAX / d) * d, (UINT32_MAX / d) * d - 1, UINT32_MAX, UINT32_MAX - 1,
                              1u << 31, (1u << 31) - 1, 1u << 16, (1u << 16) - 1};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) n[c++] = fixed[i];
    while (c < 64) n[c++] = (uint32_t)splitmix(seed);
    for (int i = 0; i < c; i++) {
        const uint32_t q = dt_udiv_q(n[i], v), r = dt_udiv_r(n[i], v);
        if (q != n[i] / d || r != n[i] % d)
            fail_msg("dt_udiv: %u / %u = %u rem %u, want %u rem %u", n[i], d, q, r, n[i] / d, n[i] % d);
    }
}
static void test_mma_division(void **state) {
    (void)state;
    uint64_t seed = 17;
    for (uint32_t d = 1; d <= 4096; d++) check_udiv(d, &seed);
    for (int b = 12; b < 32; b++)
        for (int dd = -3; dd <= 3; dd++) check_udiv((uint32_t)((1ull << b) + (uint64_t)(int64_t)dd), &seed);
    check_udiv(UINT32_MAX, &seed);
    /* 0, a launch with nothing to divide: made as 1, no trap on the host */
    assert_int_equal(dt_udiv_of(0).d, 1);
    assert_int_equal(dt_udiv_q(12345, dt_udiv_of(0)), 12345);
    const dt_mma_order empty = dt_mma_order_of(0, 4, 3);   /* no query tiles */
    assert_int_equal(empty.ranks, 0);
    check_udiv(UINT32_MAX - 1, &seed);
    for (int i = 0; i < 2000; i++) {
        const uint32_t d = (uint32_t)splitmix(&seed) >> (splitmix(&seed) % 32);
        check_udiv(d ? d : 1, &seed);
    }

    /* the key limit of a position against mask.h, on segments whose
     * positions span up to 2^32 - 1 (dt_mma_keys_fit) */
    const dt_attn_segment segs[] = {
        {0, 1, 4096, 0, 0},       {1, 8, 512, 0, 0},        {7, 3, 1000, 0, 0},
        {1000000, 1, 1, 0, 0},    {5, 2, 0, 0, 0},          {3, 64, 1 << 20, 0, 0},
        {1ll << 40, 7, 100, 0, 0}, {-50, 5, 100, 0, 0},     {0, 4096, 1 << 20, 0, 0},
        {9, UINT32_MAX, 2, 0, 0}, {0, 2, (1ll << 31) - 1, 0, 0}, {2, 5000000000ll, 1, 0, 0},
        /* with a jump: zigzag's (P = 8, rank 2, h = 2048), at row 0, past
         * the end, of one position, on a stride, to the span's limit */
        {4096, 1, 4096, 2048, 20480 }, {0, 1, 100, 0, 77},  {3, 1, 100, 100, 1000},
        {3, 1, 100, 50, 1},       {11, 3, 1000, 999, 12345}, {0, 1, 2, 1, UINT32_MAX - 1},
    };
    for (size_t si = 0; si < sizeof segs / sizeof segs[0]; si++)
        for (int mask = 0; mask < 2; mask++) {
            const dt_attn_segment k = segs[si];
            assert_true(dt_mma_keys_fit(k));
            const dt_mma_keys v = dt_mma_keys_of((dt_attn_mask)mask, k);
            const int64_t last = dt_attn_pos(k, k.len > 0 ? k.len - 1 : 0);
            const int64_t at = dt_attn_pos(k, k.split), before = dt_attn_pos(k, k.split - 1);
            int64_t ps[80];
            int c = 0;
            const int64_t fixed[] = {k.start - 1, k.start, k.start + 1, k.start + k.stride - 1,
                                     k.start + k.stride, last - 1, last, last + 1,
                                     last + k.stride, INT64_MIN / 2, INT64_MAX / 2,
                                     /* around the jump, and in its hole */
                                     before - 1, before, before + 1, at - 1, at, at + 1,
                                     (before + at) / 2};
            for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) ps[c++] = fixed[i];
            while (c < 80) {   /* around a random key's position */
                const int64_t key = k.len > 0 ? (int64_t)(splitmix(&seed) % (uint64_t)k.len) : 0;
                ps[c++] = dt_attn_pos(k, key) + (int64_t)(splitmix(&seed) % 3) - 1;
            }
            for (int i = 0; i < c; i++) {
                const int64_t got = dt_mma_keys_upto(&v, ps[i]);
                const int64_t want = dt_attn_keys_upto((dt_attn_mask)mask, k, ps[i]);
                if (got != want)
                    fail_msg("dt_mma_keys_upto: mask %d, keys (%lld, %lld, %lld, %lld, %lld), "
                             "position %lld: %lld, want %lld", mask, (long long)k.start,
                             (long long)k.stride, (long long)k.len, (long long)k.split,
                             (long long)k.gap, (long long)ps[i], (long long)got, (long long)want);
            }
        }
    /* the span's limit */
    const dt_attn_segment wide[] = {{0, 1, (1ll << 32) + 1, 0, 0}, {0, 3000000000ll, 3, 0, 0},
                                    {0, 3, 1ll << 31, 0, 0}, {0, 1, 2, 1, UINT32_MAX},
                                    {0, 1, 3, 1, 1ll << 40}};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) assert_false(dt_mma_keys_fit(wide[i]));
}

/* Greedy list scheduling of a launch in dt_mma_sched's order on `slots`
 * CTA slots (what the GPU's block scheduler does: each CTA, in block
 * order, starts on the slot that frees first), the forward of a causal
 * c x c block with one (batch, head) unit per head: the query tile of rank
 * r (0 the last tile) has n_ranks - r key tiles, plus `fixed` tiles of a
 * CTA's own cost. Returns the launch's span over its average load. */
static double sched_tail(int64_t n_ranks, int64_t n_units, int64_t section, int slots,
                         double fixed) {
    double *slot = calloc((size_t)slots, sizeof *slot), total = 0, span = 0;
    assert_non_null(slot);
    for (int64_t blk = 0; blk < n_ranks * n_units; blk++) {
        int64_t rank, unit;
        dt_mma_sched(blk, n_ranks, n_units, section, &rank, &unit);
        int first = 0;
        for (int i = 1; i < slots; i++)
            if (slot[i] < slot[first]) first = i;
        const double w = (double)(n_ranks - rank) + fixed;
        slot[first] += w;
        total += w;
        if (slot[first] > span) span = slot[first];
    }
    free(slot);
    return span / (total / slots);
}

/* The launch order's tail (attention/cuda/mma_layout.h): on an H100's 132 SMs (one CTA
 * each at D = 128, two at D = 64) and its 50 MiB L2, every causal forward
 * launch at least four CTAs deep per slot ends within 3.5% of its average
 * load. With the narrower section last, a heavy tile of it starts among
 * the last CTAs: H = 16, c = 4096, D = 128 (the issue's first shape) took
 * 15% to 17% longer, H = 32, c = 4096, D = 64 20%. */
static void test_mma_launch_tail(void **state) {
    (void)state;
    const int64_t heads[] = {8, 16, 32, 64}, lens[] = {2048, 4096, 8192, 16384};
    int checked = 0;
    for (size_t h = 0; h < 4; h++)
        for (size_t c = 0; c < 4; c++)
            for (int64_t dim = 64; dim <= 128; dim += 64) {
                const int slots = dim == 64 ? 264 : 132;
                const int64_t n_ranks = lens[c] / 128, n_units = heads[h];
                if (n_ranks * n_units < 4 * slots) continue;
                const int64_t sec = dt_mma_sched_section(n_units, 2 * lens[c] * dim * 2, 50 << 20);
                for (int f = 0; f <= 2; f++) {
                    const double tail = sched_tail(n_ranks, n_units, sec, slots, f);
                    if (tail > 1.035)
                        fail_msg("H %lld c %lld D %lld (section %lld, %d slots, fixed %d): span "
                                 "%.3f x the average load", (long long)heads[h], (long long)lens[c],
                                 (long long)dim, (long long)sec, slots, f, tail);
                }
                checked++;
            }
    assert_true(checked >= 12);
}

static void test_mma_tile_bounds(void **state) {
    (void)state;
    const int64_t qlens[] = {1, 63, 64, 65, 130, 200}, klens[] = {1, 64, 65, 200};
    const int64_t strides[][2] = {{1, 1}, {2, 2}, {3, 3}, {8, 8}, {1, 2}, {3, 1}};
    const int64_t qstarts[] = {0, 1, 7, 130}, kstarts[] = {0, 2, 65};
    for (int mk = 0; mk < 2; mk++)
        for (size_t a = 0; a < 6; a++)
            for (size_t b = 0; b < 4; b++)
                for (size_t st = 0; st < 6; st++)
                    for (size_t i = 0; i < 4; i++)
                        for (size_t j = 0; j < 3; j++) {
                            dt_attn_segment q = {qstarts[i], strides[st][0], qlens[a], 0, 0};
                            dt_attn_segment k = {kstarts[j], strides[st][1], klens[b], 0, 0};
                            check_bounds(mk ? DT_ATTN_FULL : DT_ATTN_CAUSAL, q, k);
                        }
    /* segments with a jump (split, gap): inside a tile, on a tile's edge,
     * before row 0, of one position */
    const int64_t jumps[][2] = {{0, 0}, {37, 100}, {64, 64}, {0, 9}, {100, 1}};
    for (size_t a = 1; a < 6; a++)
        for (size_t b = 1; b < 4; b++)
            for (int jq = 0; jq < 5; jq++)
                for (int jk = 0; jk < 5; jk++)
                    for (int64_t stride = 1; stride <= 2; stride++) {
                        dt_attn_segment q = {7, stride, qlens[a], jumps[jq][0], jumps[jq][1]};
                        dt_attn_segment k = {2, stride, klens[b], jumps[jk][0], jumps[jk][1]};
                        check_bounds(DT_ATTN_CAUSAL, q, k);
                    }
    /* the segments of real shardings: chunks across tiles' edges (67 rows)
     * and on them (128) */
    for (int64_t h = 67; h <= 128; h += 61)
        for (int p = 1; p <= MAXP; p++)
            for (int o = 0; o < DT_ORDER_COUNT; o++)
                for (int j = 0; j < p; j++)
                    for (int src = 0; src < p; src++)
                        check_bounds(DT_ATTN_CAUSAL, dt_attn_segment_of((dt_order)o, 2 * p * h, p, j),
                                     dt_attn_segment_of((dt_order)o, 2 * p * h, p, src));
}

/* DT_ATTN_KERNEL and dt_attention_tuning.kernel: a bad value (a name
 * near a valid one among them) is refused on every rank, before anything
 * moves; on the CPU backend the valid values change nothing. */
typedef struct env_case {
    int P;
    const dt_attention_tuning *tuning;   /* opts.tuning (NULL: none, no options) */
    dt_status st[MAXP];
    char msg[MAXP][512];
    uint64_t sum[MAXP];
} env_case;

static uint64_t checksum(const dt_tensor *t);

static dt_status rank_env(dt_context *ctx, void *arg) {
    env_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = NULL;
    int sizes[1] = {c->P};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    int64_t shape[4] = {1, 10 * c->P, 2, 16};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_BF16, 4, shape, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(q, 5);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.tuning = c->tuning;
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, c->tuning ? &opts : NULL, &o, NULL);
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", st == DT_SUCCESS ? "" : dt_last_error());
    c->sum[r] = st == DT_SUCCESS ? checksum(o) : 0;
    dt_tensor_destroy(o);
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_kernel_env(void **state) {
    (void)state;
    env_case base = {.P = 2}, c = {.P = 2};
    char *saved = h_env_set("DT_ATTN_KERNEL", NULL);
    dt_status st0 = h_launch(2, rank_env, &base);
    /* the choice in the options: a forced LATEST form (the CPU ignores it),
     * and one past the enum */
    const dt_attention_tuning latest = {DT_ATTN_KERNEL_WGMMA_LATEST, 1, 1, 1},
                              past = {DT_ATTN_KERNEL_COUNT, 1, 1, 1};
    env_case by_opts = {.P = 2, .tuning = &latest}, bad_opts = {.P = 2, .tuning = &past};
    const dt_status st_opts = h_launch(2, rank_env, &by_opts);
    const dt_status st_bad_opts = h_launch(2, rank_env, &bad_opts);
    enum { NEAR = 3 };
    const char *near[NEAR] = {"mma_latest", "latest", "wgmma-verified"};
    env_case near_c[NEAR];
    dt_status st_near[NEAR];
    for (int i = 0; i < NEAR; i++) {
        near_c[i] = (env_case){.P = 2};
        setenv("DT_ATTN_KERNEL", near[i], 1);
        st_near[i] = h_launch(2, rank_env, &near_c[i]);
    }
    setenv("DT_ATTN_KERNEL", "bogus", 1);
    dt_status st1 = h_launch(2, rank_env, &c);
    enum { VALS = 10 };   /* every name, and three in other cases (as DT_BACKEND's) */
    env_case ok[VALS];
    for (int i = 0; i < VALS; i++) ok[i] = (env_case){.P = 2};
    dt_status st2[VALS];
    const char *vals[VALS] = {"auto", "simple", "mma", "wgmma", "mma-latest", "wgmma-latest",
                              "simple-latest", "Simple", "WGMMA", "MMA-Latest"};
    for (int i = 0; i < VALS; i++) {
        setenv("DT_ATTN_KERNEL", vals[i], 1);
        st2[i] = h_launch(2, rank_env, &ok[i]);
    }
    h_env_restore("DT_ATTN_KERNEL", saved);
    assert_int_equal(st0, DT_SUCCESS);
    assert_int_equal(st1, DT_ERR_INVALID_ARGUMENT);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(c.st[r], DT_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(c.msg[r], "DT_ATTN_KERNEL=bogus is not auto, simple, mma, wgmma, "
                                         "mma-latest, wgmma-latest or simple-latest"));
    }
    for (int i = 0; i < VALS; i++) {
        assert_int_equal(st2[i], DT_SUCCESS);
        for (int r = 0; r < 2; r++) assert_true(ok[i].sum[r] == base.sum[r]);
    }
    for (int i = 0; i < NEAR; i++) {
        assert_int_equal(st_near[i], DT_ERR_INVALID_ARGUMENT);
        for (int r = 0; r < 2; r++) assert_non_null(strstr(near_c[i].msg[r], "is not auto, simple"));
    }
    assert_int_equal(st_opts, DT_SUCCESS);
    for (int r = 0; r < 2; r++) assert_true(by_opts.sum[r] == base.sum[r]);
    assert_int_equal(st_bad_opts, DT_ERR_INVALID_ARGUMENT);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(bad_opts.st[r], DT_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(bad_opts.msg[r], "unknown kernel choice"));
    }
}

/* The CUDA kernel choice itself (attention/cuda/block.cu's table of the
 * paths verified on a GPU, through dt_attn_cuda_path_of; no GPU needed):
 * auto on compute capability 9.0 takes the wgmma kernel's VERIFIED form
 * (the mma kernel's in a build without the wgmma kernel), on an
 * architecture the table does not list (8.0, 8.9, 10.0) the simple kernel,
 * and the simple kernel where no tensor-core kernel can run the block;
 * mma and wgmma force the VERIFIED forms, mma-latest and wgmma-latest the
 * LATEST ones, wherever they can run, and elsewhere refuse, saying why;
 * simple-latest takes the simple kernel's LATEST form for every block; an
 * unknown choice is refused. Skipped in a build without the CUDA
 * backend. */
static void test_cuda_kernel_table(void **state) {
    (void)state;
#ifndef DT_HAVE_CUDA
    print_message("skipped: this build has no CUDA backend (attention/cuda/block.cu)\n");
    skip();
#else
    enum { V = DT_ATTN_FORM_VERIFIED, L = DT_ATTN_FORM_LATEST };
    enum { S = DT_ATTN_CUDA_SIMPLE, M = DT_ATTN_CUDA_MMA, W = DT_ATTN_CUDA_WGMMA };
    /* the wgmma kernel is in this build (NVCC_ARCH=sm_90, or the emulator) */
    const int built = dt_attn_wgmma_supported(DT_BF16, 64, 90, NULL, 0);
    const int w = built ? W : M;   /* auto's kernel on 9.0 */
    const char *const no_wgmma = built ? "needs a compute capability 9.0" : "was not built";
    static const char misaligned[] = "q is not 16-byte aligned (the block's own reason)";
    const struct {
        dt_attn_kernel_choice k;
        int cc;
        dt_dtype dtype;
        int64_t dim;
        int aligned, backward;
        int ok, kernel, form;   /* the path, or refused (ok 0) with why containing `why` */
        const char *why;
    } t[] = {
        {DT_ATTN_KERNEL_AUTO, 90, DT_BF16, 64, 1, 0, 1, w, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 90, DT_F16, 128, 1, 1, 1, w, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 90, DT_BF16, 128, 0, 0, 1, S, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 90, DT_F32, 64, 1, 0, 1, S, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 90, DT_BF16, 96, 1, 1, 1, S, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 80, DT_BF16, 64, 1, 0, 1, S, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 80, DT_F16, 128, 1, 1, 1, S, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 89, DT_BF16, 64, 1, 0, 1, S, V, NULL},
        {DT_ATTN_KERNEL_AUTO, 100, DT_BF16, 64, 1, 0, 1, S, V, NULL},
        {DT_ATTN_KERNEL_SIMPLE, 90, DT_BF16, 64, 1, 0, 1, S, V, NULL},
        {DT_ATTN_KERNEL_SIMPLE_LATEST, 90, DT_BF16, 64, 1, 0, 1, S, L, NULL},
        {DT_ATTN_KERNEL_SIMPLE_LATEST, 90, DT_F32, 96, 0, 1, 1, S, L, NULL},
        {DT_ATTN_KERNEL_SIMPLE_LATEST, 80, DT_F16, 128, 1, 1, 1, S, L, NULL},
        {DT_ATTN_KERNEL_MMA, 90, DT_BF16, 64, 1, 0, 1, M, V, NULL},
        {DT_ATTN_KERNEL_MMA, 80, DT_F16, 128, 1, 1, 1, M, V, NULL},
        {DT_ATTN_KERNEL_MMA_LATEST, 90, DT_BF16, 128, 1, 1, 1, M, L, NULL},
        {DT_ATTN_KERNEL_MMA_LATEST, 80, DT_F16, 64, 1, 0, 1, M, L, NULL},
        {DT_ATTN_KERNEL_WGMMA, 90, DT_BF16, 64, 1, 1, built, W, V, no_wgmma},
        {DT_ATTN_KERNEL_WGMMA_LATEST, 90, DT_F16, 128, 1, 0, built, W, L, no_wgmma},
        {DT_ATTN_KERNEL_WGMMA_LATEST, 80, DT_BF16, 64, 1, 0, 0, S, V, no_wgmma},
        {DT_ATTN_KERNEL_WGMMA, 89, DT_BF16, 64, 1, 1, 0, S, V, no_wgmma},
        {DT_ATTN_KERNEL_MMA_LATEST, 90, DT_F32, 64, 1, 0, 0, S, V, "takes bf16 or fp16, not fp32"},
        {DT_ATTN_KERNEL_MMA, 75, DT_BF16, 64, 1, 0, 0, S, V, "needs compute capability 8.0"},
        {DT_ATTN_KERNEL_MMA_LATEST, 90, DT_BF16, 64, 0, 0, 0, S, V, misaligned},
        {DT_ATTN_KERNEL_COUNT, 90, DT_BF16, 64, 1, 0, 0, S, V, "unknown kernel choice"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char why[256];
        snprintf(why, sizeof why, "%s", t[i].aligned ? "" : misaligned);
        dt_attn_cuda_path p = {DT_ATTN_CUDA_KERNEL_COUNT, DT_ATTN_FORM_COUNT};
        const int ok = dt_attn_cuda_path_of(t[i].k, t[i].cc, t[i].dtype, t[i].dim, t[i].aligned,
                                            t[i].backward, 0, &p, why, sizeof why);
        const int good = ok == t[i].ok &&
                         (ok ? (int)p.kernel == t[i].kernel && (int)p.form == t[i].form
                             : strstr(why, t[i].why) != NULL);
        if (!good)
            print_error("row %zu: %s on %d.%d, %s, D = %lld%s: got %s (%s %s, \"%s\")\n", i,
                        dt_attn_kernel_choice_name(t[i].k), t[i].cc / 10, t[i].cc % 10,
                        dt_dtype_name(t[i].dtype), (long long)t[i].dim,
                        t[i].backward ? ", backward" : "", ok ? "a path" : "a refusal",
                        dt_attn_cuda_kernel_name(p.kernel), dt_attn_form_name(p.form), why);
        assert_true(good);
    }
#endif
}

/* opts.timing: every step filled on every rank, forward and backward (and
 * the time before step 0: the backward's is never 0), and the blocks'
 * times follow the work. Contiguous causal sharding gives rank 0
 * nothing to compute after step 0 (every later key comes after its
 * queries) and rank P-1 a full block on every step: its later steps must
 * take clearly longer than rank 0's (ten times: c x c work against rank
 * 0's c rows of finish; each side the least of TIMING_CALLS calls, as a
 * rank thread's CPU clock takes in a VM's hiccups). The marks of each call
 * (before_ms included) sum to at most the call. DT_TEST_QUICK (the valgrind
 * run, where 512 tokens a rank took some 350 s) runs 64 and checks the
 * marks only. */
enum { TIMING_CALLS = 3 };
typedef struct timing_case {
    int64_t tokens;   /* per rank */
    dt_attention_timing fwd[TIMING_CALLS][MAXP], bwd[TIMING_CALLS][MAXP];
    double call_ms[TIMING_CALLS][MAXP][2];
} timing_case;

static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static dt_status rank_timing(dt_context *ctx, void *arg) {
    timing_case *c = arg;
    int r = dt_context_rank(ctx), P = dt_context_world_size(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    int sizes[1] = {P};
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    int64_t shape[4] = {1, c->tokens * P, 2, 64};
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, NULL, &mesh), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(q, 3), out);
    for (int i = 0; i < TIMING_CALLS; i++) {
        dt_tensor_destroy(dv);
        dt_tensor_destroy(dk);
        dt_tensor_destroy(dq);
        dt_tensor_destroy(lse);
        dt_tensor_destroy(o);
        o = lse = dq = dk = dv = NULL;
        double t0 = wall_ms();
        opts.timing = &c->fwd[i][r];
        DT_TRY_GOTO(st, dt_attention_forward(q, q, q, &opts, &o, &lse), out);
        double t1 = wall_ms();
        opts.timing = &c->bwd[i][r];
        DT_TRY_GOTO(st, dt_attention_backward(q, q, q, o, lse, o, &opts, &dq, &dk, &dv), out);
        c->call_ms[i][r][0] = t1 - t0;
        c->call_ms[i][r][1] = wall_ms() - t1;
    }
out:
    dt_tensor_destroy(dv);
    dt_tensor_destroy(dk);
    dt_tensor_destroy(dq);
    dt_tensor_destroy(lse);
    dt_tensor_destroy(o);
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return st;
}

/* The block time of steps 1..P-1 of one rank's timing. */
static double later_steps_ms(const dt_attention_timing *t) {
    double ms = 0;
    for (int s = 1; s < t->steps; s++) ms += t->blocks_ms[s];
    return ms;
}

static void test_timing(void **state) {
    const dt_backend_kind backend = *(const dt_backend_kind *)*state;
    enum { P = 4 };
    char why[512];
    if (!h_pair_available(P, backend, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    /* The CPU emulator of CUDA (make CUDA=emu) runs every kernel at its
     * launch, one rank at a time: its events time the host, work and
     * waits for the emulator alike, so only the bookkeeping is checked. */
#ifdef DT_CUDA_EMULATE
    int check_balance = backend != DT_BACKEND_CUDA;
    if (!check_balance) print_message("CUDA emulated: the work-follows-time check is left out\n");
#else
    int check_balance = 1;
#endif
    const int quick = getenv("DT_TEST_QUICK") != NULL;
    if (quick && check_balance)
        print_message("DT_TEST_QUICK: 64 tokens a rank, the work-follows-time check left out\n");
    check_balance = check_balance && !quick;
    timing_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->tokens = quick ? 64 : 512;
    assert_int_equal(h_launch_on(P, backend, DT_TRANSPORT_LOCAL, rank_timing, c), DT_SUCCESS);
    for (int pass = 0; pass < 2; pass++) {
        double idle = INFINITY, busy = INFINITY;   /* rank 0's, rank P-1's: the least */
        for (int i = 0; i < TIMING_CALLS; i++) {
            const dt_attention_timing *calls = pass ? c->bwd[i] : c->fwd[i];
            for (int r = 0; r < P; r++) {
                const dt_attention_timing *t = &calls[r];
                assert_int_equal(t->steps, P);
                /* the backward's zeroing of dQ and its delta pass come
                 * before step 0: some time, on every backend */
                assert_true(pass ? t->before_ms > 0 : t->before_ms >= 0);
                double sum = t->before_ms;
                for (int s = 0; s < P; s++) {
                    assert_true(t->blocks_ms[s] >= 0 && t->wait_ms[s] >= 0);
                    sum += t->blocks_ms[s] + t->wait_ms[s];
                }
                assert_true(sum <= c->call_ms[i][r][pass] + 1e-3);
            }
            idle = fmin(idle, later_steps_ms(&calls[0]));
            busy = fmin(busy, later_steps_ms(&calls[P - 1]));
        }
        if (check_balance && !(busy > 10 * idle))
            fail_msg("%s: rank %d's later steps took %.3f ms, rank 0's %.3f ms (the least of %d "
                     "calls)", pass ? "backward" : "forward", P - 1, busy, idle, TIMING_CALLS);
    }
    free(c);
}

/* CUDA: DT_ATTN_KERNEL=mma where the tensor-core kernel cannot run fails on
 * every rank with DT_ERR_NOT_SUPPORTED naming what is missing; =simple runs
 * the same calls. Skipped without a GPU. */
typedef struct forced_case {
    dt_dtype dtype;
    int64_t D;
    env_case r;
} forced_case;

static dt_status rank_forced(dt_context *ctx, void *arg) {
    forced_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = NULL;
    int sizes[1] = {c->r.P};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
    int64_t shape[4] = {1, 20 * c->r.P, 2, c->D};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, c->dtype, 4, shape, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(q, 5);
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, NULL, &o, NULL);
    c->r.st[r] = st;
    snprintf(c->r.msg[r], sizeof c->r.msg[r], "%s", st == DT_SUCCESS ? "" : dt_last_error());
    dt_tensor_destroy(o);
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_cuda_forced_mma_refused(void **state) {
    (void)state;
    char why[512];
    if (!h_pair_available(2, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    struct { dt_dtype dtype; int64_t D; const char *needle; } t[] = {
        {DT_F32, 64, "takes bf16 or fp16, not fp32"},
        {DT_BF16, 96, "takes head dim 64 or 128, not 96"},
    };
    forced_case mma[2], simple[2];
    dt_status st_mma[2], st_simple[2];
    char *saved = h_env_set("DT_ATTN_KERNEL", "mma");
    for (int i = 0; i < 2; i++) {
        mma[i] = (forced_case){.dtype = t[i].dtype, .D = t[i].D, .r = {.P = 2}};
        st_mma[i] = h_launch_on(2, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_forced, &mma[i]);
    }
    setenv("DT_ATTN_KERNEL", "simple", 1);
    for (int i = 0; i < 2; i++) {
        simple[i] = (forced_case){.dtype = t[i].dtype, .D = t[i].D, .r = {.P = 2}};
        st_simple[i] = h_launch_on(2, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_forced, &simple[i]);
    }
    h_env_restore("DT_ATTN_KERNEL", saved);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(st_mma[i], DT_ERR_NOT_SUPPORTED);
        for (int r = 0; r < 2; r++) {
            if (!strstr(mma[i].r.msg[r], t[i].needle))
                print_error("rank %d: %s (want \"%s\")\n", r, mma[i].r.msg[r], t[i].needle);
            assert_int_equal(mma[i].r.st[r], DT_ERR_NOT_SUPPORTED);
            assert_non_null(strstr(mma[i].r.msg[r], t[i].needle));
        }
        if (st_simple[i] != DT_SUCCESS) print_error("simple: %s\n", simple[i].r.msg[0]);
        assert_int_equal(st_simple[i], DT_SUCCESS);
    }
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

/* Rank 1 asks for groups of 2 ring steps where the others ask for 3:
 * their hops' pieces would not match, so every rank fails with
 * DT_ERR_MISMATCH naming the group before any block moves. */
static dt_status rank_group_disagree(dt_context *ctx, void *arg) {
    err_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *o = NULL;
    int sizes[1] = {c->P};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    int64_t qs[4] = {2, 8 * c->P, 2, 16};
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.group = r == 1 ? 2 : 3;
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, qs, &lay, &q);
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, &opts, &o, NULL);
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    dt_tensor_destroy(o);
    dt_tensor_destroy(q);
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
    err_case g = {.P = 4};
    assert_int_equal(h_launch(4, rank_group_disagree, &g), DT_ERR_MISMATCH);
    for (int r = 0; r < 4; r++) {
        if (!strstr(g.msg[r], "group = 2 but comm rank 0 has 3"))
            print_error("rank %d: %s\n", r, g.msg[r]);
        assert_int_equal(g.st[r], DT_ERR_MISMATCH);
        assert_non_null(strstr(g.msg[r], "group = 2 but comm rank 0 has 3"));
    }
}

/* Rank 1 passes NULL for q (k and v as the others): it fails with
 * DT_ERR_INVALID_ARGUMENT, and it still takes part in the entry check
 * through k's context, so the others fail at once, naming the failed
 * check, instead of waiting for the timeout (a minute here, for the slow
 * builds' sake: they would return DT_ERR_TIMEOUT then). The forward and
 * the backward. */
static dt_status rank_null_q(dt_context *ctx, void *arg) {
    err_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    int sizes[1] = {c->P};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    int64_t qs[4] = {1, 8 * c->P, 4, 16}, ks[4] = {1, 8 * c->P, 2, 16};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, qs, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, ks, &lay, &k);
    if (st == DT_SUCCESS) st = dt_attention_forward(q, k, k, NULL, &o, &lse);
    const dt_tensor *qb = r == 1 ? NULL : q;
    if (st == DT_SUCCESS) {
        dt_tensor *o2 = NULL;
        c->st[r] = dt_attention_forward(qb, k, k, NULL, &o2, NULL);
        snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
        dt_tensor_destroy(o2);
        c->bad[r] = dt_attention_backward(qb, k, k, o, lse, o, NULL, &dq, &dk, &dv);
        snprintf(c->msg[r] + strlen(c->msg[r]), sizeof c->msg[r] - strlen(c->msg[r]), " | %s",
                 dt_last_error());
    }
    dt_tensor_destroy(dq);
    dt_tensor_destroy(dk);
    dt_tensor_destroy(dv);
    dt_tensor_destroy(o);
    dt_tensor_destroy(lse);
    dt_tensor_destroy(q);
    dt_tensor_destroy(k);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_rank_with_null_q_fails_its_peers_at_once(void **state) {
    (void)state;
    for (int p = 2; p <= 3; p++) {
        err_case c = {.P = p};
        dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
        o.backend = DT_BACKEND_CPU;
        o.transport = DT_TRANSPORT_LOCAL;
        o.timeout_ms = 60 * 1000L;
        assert_int_equal(dt_launch(p, rank_null_q, &c, &o), DT_SUCCESS);
        for (int r = 0; r < p; r++) {
            print_message("P = %d rank %d: %s, %s: %s\n", p, r, dt_status_name(c.st[r]),
                          dt_status_name((dt_status)c.bad[r]), c.msg[r]);
            const dt_status want = r == 1 ? DT_ERR_INVALID_ARGUMENT : DT_ERR_MISMATCH;
            assert_int_equal(c.st[r], want);
            assert_int_equal(c.bad[r], want);
            /* the others carry rank 1's message */
            assert_non_null(strstr(c.msg[r], "must not be NULL"));
            if (r != 1) assert_non_null(strstr(c.msg[r], "comm rank 1 failed its own checks"));
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
/* One refused call of rank_bad_inputs: status `want`, a message holding
 * `needle`, and the handles it was given (o may be NULL: not given) set to
 * NULL; they are set to a non-NULL poison again for the next call. */
static void refused(err_case *c, int r, int i, dt_status got, dt_status want, const char *needle,
                    dt_tensor **o, dt_tensor **lse) {
    /* a rejected call writes no output handle: they keep the test's marker */
    if (got != want || !strstr(dt_last_error(), needle) || (o && *o != (dt_tensor *)1) ||
        *lse != (dt_tensor *)1) {
        c->bad[r]++;
        snprintf(c->msg[r], sizeof c->msg[r], "case %d: got %s, want %s naming \"%s\": %s", i,
                 dt_status_name(got), dt_status_name(want), needle, dt_last_error());
    }
    if (o) *o = (dt_tensor *)1;
    *lse = (dt_tensor *)1;
}

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
            s12[4] = {1, S, 4, 12}, s264[4] = {1, S, 4, 264}, s2d[4] = {1, S, 2, 24};
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
                         small_ws = DT_ATTENTION_OPTIONS_INIT, bad_group = DT_ATTENTION_OPTIONS_INIT;
    bad_mask.mask = (dt_attn_mask)5;
    bad_scale.scale = -1.0f;
    bad_group.group = -1;
    char ws[16];
    small_ws.workspace = ws;
    small_ws.workspace_bytes = sizeof ws;
    /* Each call's status, message and reset handles, checked at once (the
     * message is the last error's: read before the next call). */
    refused(c, r, 0, dt_attention_forward(NULL, kv, kv, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "NULL", &o, &lse);
    refused(c, r, 1, dt_attention_forward(q, kv, kv, NULL, NULL, &lse), DT_ERR_INVALID_ARGUMENT, "o is NULL", NULL, &lse);
    refused(c, r, 2, dt_attention_forward(q, kv3, kv3, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "do not divide", &o, &lse);
    refused(c, r, 3, dt_attention_forward(q, kv, kv3, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "k and v shapes differ", &o, &lse);
    refused(c, r, 4, dt_attention_forward(q12, q12, q12, NULL, &o, &lse), DT_ERR_NOT_SUPPORTED, "head dim 12", &o, &lse);
    refused(c, r, 5, dt_attention_forward(q264, q264, q264, NULL, &o, &lse), DT_ERR_NOT_SUPPORTED, "head dim 264", &o, &lse);
    refused(c, r, 6, dt_attention_forward(q, qb, qb, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "dtypes differ", &o, &lse);
    refused(c, r, 7, dt_attention_forward(q, kv, kv, &bad_mask, &o, &lse), DT_ERR_INVALID_ARGUMENT, "unknown mask", &o, &lse);
    refused(c, r, 8, dt_attention_forward(q, kv, kv, &bad_scale, &o, &lse), DT_ERR_INVALID_ARGUMENT, "scale", &o, &lse);
    refused(c, r, 9, dt_attention_forward(q, kv, kv, &bad_group, &o, &lse), DT_ERR_INVALID_ARGUMENT, "group -1", &o, &lse);
    refused(c, r, 10, dt_attention_forward(q, kv, kv, &small_ws, &o, &lse), DT_ERR_INVALID_ARGUMENT, "workspace", &o, &lse);
    refused(c, r, 11, dt_attention_forward(qr, kv, kv, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "one Layout", &o, &lse);
    refused(c, r, 12, dt_attention_forward(qp, qp, qp, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "Partial", &o, &lse);
    refused(c, r, 13, dt_attention_forward(qd, qd, qd, NULL, &o, &lse), DT_ERR_INVALID_ARGUMENT, "head dim D", &o, &lse);
    if (checksum(q) != cq || checksum(kv) != ckv) c->bad[r]++;
    /* o NULL: lse is left as it was, and every rank fails (after the check) */
    lse = (dt_tensor *)1;
    if (dt_attention_forward(q, kv, kv, NULL, NULL, &lse) != DT_ERR_INVALID_ARGUMENT ||
        lse != (dt_tensor *)1)
        c->bad[r]++;
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

/* Empty tensors (no batch rows, or no tokens): the forward and the backward
 * succeed and return empty tensors of the right shapes, on every backend
 * this machine has (the block kernels have nothing to start or finish). */
typedef struct empty_case {
    int P;
    int64_t shape[4];
    dt_dtype dtype;
    dt_status st[MAXP];
    int bad[MAXP];
    char msg[MAXP][256];
} empty_case;

static dt_status rank_empty(dt_context *ctx, void *arg) {
    empty_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    int sizes[1] = {c->P};
    dt_tensor *q = NULL, *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, c->dtype, 4, c->shape, &lay, &q);
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, NULL, &o, &lse);
    if (st == DT_SUCCESS) st = dt_attention_backward(q, q, q, o, lse, o, NULL, &dq, &dk, &dv);
    if (st == DT_SUCCESS) {
        const int64_t *so = dt_tensor_shape(o), *sl = dt_tensor_shape(lse);
        for (int d = 0; d < 4; d++) c->bad[r] += so[d] != c->shape[d];
        c->bad[r] += sl[0] != c->shape[0] || sl[1] != c->shape[2] || sl[2] != c->shape[1];
        c->bad[r] += dt_tensor_local_numel(dq) != 0 || dt_tensor_local_numel(dk) != 0;
    }
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", st == DT_SUCCESS ? "" : dt_last_error());
    dt_tensor_destroy(q), dt_tensor_destroy(o), dt_tensor_destroy(lse);
    dt_tensor_destroy(dq), dt_tensor_destroy(dk), dt_tensor_destroy(dv);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_empty_tensors(void **state) {
    (void)state;
    const dt_backend_kind backends[2] = {DT_BACKEND_CPU, DT_BACKEND_CUDA};
    for (int bi = 0; bi < 2; bi++) {
        char why[256];
        if (!h_pair_available(1, backends[bi], DT_TRANSPORT_LOCAL, why, sizeof why)) {
            print_message("empty tensors on %s: skipped (%s)\n",
                          dt_backend_kind_name(backends[bi]), why);
            continue;
        }
        for (int P = 1; P <= 2; P++)
            for (int which = 0; which < 2; which++) {
                empty_case c = {.P = P, .dtype = bi ? DT_BF16 : DT_F32};
                const int64_t no_batch[4] = {0, 4 * P, 2, 64}, no_tokens[4] = {1, 0, 2, 64};
                memcpy(c.shape, which ? no_tokens : no_batch, sizeof c.shape);
                dt_status st = h_launch_on(P, backends[bi], DT_TRANSPORT_LOCAL, rank_empty, &c);
                for (int r = 0; r < P; r++) {
                    if (c.st[r] != DT_SUCCESS || c.bad[r])
                        print_error("%s P=%d shape [%lld, %lld, %lld, %lld] rank %d: %s\n",
                                    dt_backend_kind_name(backends[bi]), P, (long long)c.shape[0],
                                    (long long)c.shape[1], (long long)c.shape[2],
                                    (long long)c.shape[3], r, c.msg[r]);
                    assert_int_equal(c.st[r], DT_SUCCESS);
                    assert_int_equal(c.bad[r], 0);
                }
                assert_int_equal(st, DT_SUCCESS);
            }
    }
}

/* A caller-provided workspace gives bit-identical results to an internal one,
 * whatever it held: it starts full of NaN (the call must write whatever it
 * reads of it). */
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
    /* one step a launch, then groups of 2 (the ring's 2 sets of 2 slots) */
    size_t bytes[2] = {0, 0};
    for (int g = 1; g <= 2 && st == DT_SUCCESS; g++) {
        dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT, own = DT_ATTENTION_OPTIONS_INIT;
        opts.group = own.group = g;
        st = dt_attention_workspace_size(q, q, q, &opts, &opts.workspace_bytes);
        bytes[g - 1] = opts.workspace_bytes;
        free(ws);
        if (st == DT_SUCCESS) opts.workspace = ws = malloc(opts.workspace_bytes);
        if (st == DT_SUCCESS && !ws) st = DT_ERR_OUT_OF_MEMORY;
        if (st == DT_SUCCESS) memset(ws, 0xff, opts.workspace_bytes);   /* NaN floats */
        for (int rep = 0; st == DT_SUCCESS && rep < 3; rep++) {
            dt_tensor_destroy(o2);
            o2 = NULL;
            st = dt_attention_forward(q, q, q, &opts, &o2, NULL);
        }
        dt_tensor_destroy(o1);
        o1 = NULL;
        if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, &own, &o1, NULL);
        if (st == DT_SUCCESS && checksum(o1) != checksum(o2)) c->bad[r]++;
    }
    /* the two extra slots: 2 sets x (K | V) x one more block of 2 x 12 x 2 x 8 fp32 */
    if (st == DT_SUCCESS && bytes[1] != bytes[0] + 4 * (size_t)(2 * 12 * 2 * 8) * sizeof(float))
        c->bad[r]++;
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

/* The group a striped causal ring takes: the greatest power of two up to
 * G and P - 1 (its launches' keys interleave: forward.c), where the full
 * mask takes G itself; seen in the workspace, 4 blocks of K a step of the
 * group (2 sets x K | V). P = 5: G = 2, 3, 4, 7 take 2, 2, 4, 4 causal and
 * 2, 3, 4, 4 under the full mask. */
static dt_status rank_striped_group(dt_context *ctx, void *arg) {
    err_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL;
    int sizes[1] = {c->P};
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    int64_t shape[4] = {1, 6 * c->P, 2, 8};
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &q);
    const int groups[4] = {2, 3, 4, 7}, want[2][4] = {{2, 2, 4, 4}, {2, 3, 4, 4}};
    const size_t block = (size_t)(6 * 2 * 8) * sizeof(float);
    for (int m = 0; m < 2 && st == DT_SUCCESS; m++) {
        size_t bytes[4] = {0};
        for (int i = 0; i < 4 && st == DT_SUCCESS; i++) {
            dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
            opts.mask = m ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
            opts.group = groups[i];
            st = dt_attention_workspace_size(q, q, q, &opts, &bytes[i]);
        }
        for (int i = 1; i < 4 && st == DT_SUCCESS; i++)
            if (bytes[i] != bytes[0] + 4 * (size_t)(want[m][i] - want[m][0]) * block) {
                c->bad[r]++;
                snprintf(c->msg[r], sizeof c->msg[r], "%s, group %d: %zu bytes, group 2: %zu",
                         m ? "full" : "causal", groups[i], bytes[i], bytes[0]);
            }
    }
    c->st[r] = st;
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_striped_group(void **state) {
    (void)state;
    err_case c = {.P = 5};
    assert_int_equal(h_launch(5, rank_striped_group, &c), DT_SUCCESS);
    for (int r = 0; r < 5; r++) {
        if (c.bad[r]) print_error("rank %d: %s\n", r, c.msg[r]);
        assert_int_equal(c.bad[r], 0);
    }
}

/* A call of one block (one rank) on a tensor-core kernel keeps no
 * fp32 running state (forward.c, fwd_stateless): on CUDA its workspace is
 * at least the B S H D fp32 of acc smaller than the simple kernel's, and a
 * caller's workspace of just that size gives the output of the library's
 * own workspace, bit for bit. Without a mesh and with a sequence mesh of
 * one rank (no ring). */
typedef struct stateless_case {
    size_t ws[2];          /* dt_attention_workspace_size, per mesh setting */
    uint64_t sum[2][2];    /* output checksums: own workspace, caller's */
    dt_status st;
    char msg[512];
} stateless_case;

enum { SL_B = 2, SL_S = 200, SL_H = 4, SL_HKV = 2, SL_D = 64 };

static dt_status rank_stateless(dt_context *ctx, void *arg) {
    stateless_case *c = arg;
    dt_status st = DT_SUCCESS;
    for (int meshed = 0; meshed < 2 && st == DT_SUCCESS; meshed++) {
        dt_mesh *mesh = NULL;
        dt_tensor *q = NULL, *k = NULL, *o = NULL, *ws = NULL;
        int sizes[1] = {1};
        dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
        int64_t qs[4] = {SL_B, SL_S, SL_H, SL_D}, ks[4] = {SL_B, SL_S, SL_HKV, SL_D};
        if (meshed) st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
        if (st == DT_SUCCESS)
            st = dt_tensor_create(ctx, mesh, DT_BF16, 4, qs, meshed ? &lay : NULL, &q);
        if (st == DT_SUCCESS)
            st = dt_tensor_create(ctx, mesh, DT_BF16, 4, ks, meshed ? &lay : NULL, &k);
        if (st == DT_SUCCESS) st = dt_tensor_fill_random(q, 31);
        if (st == DT_SUCCESS) st = dt_tensor_fill_random(k, 32);
        dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
        if (st == DT_SUCCESS) st = dt_attention_workspace_size(q, k, k, &opts, &c->ws[meshed]);
        for (int mine = 0; mine < 2 && st == DT_SUCCESS; mine++) {
            if (mine) {   /* the caller's workspace, in the backend's memory */
                int64_t n[1] = {c->ws[meshed] > 0 ? (int64_t)c->ws[meshed] : 1};
                st = dt_tensor_create(ctx, NULL, DT_U8, 1, n, NULL, &ws);
                opts.workspace = st == DT_SUCCESS ? dt_tensor_data(ws) : NULL;
                opts.workspace_bytes = c->ws[meshed];
            }
            if (st == DT_SUCCESS) st = dt_attention_forward(q, k, k, &opts, &o, NULL);
            if (st == DT_SUCCESS) c->sum[meshed][mine] = checksum(o);
            dt_tensor_destroy(o);
            o = NULL;
        }
        dt_tensor_destroy(ws);
        dt_tensor_destroy(q);
        dt_tensor_destroy(k);
        dt_mesh_destroy(mesh);
    }
    c->st = st;
    if (st != DT_SUCCESS) snprintf(c->msg, sizeof c->msg, "%s", dt_last_error());
    return st;
}

static void test_cuda_stateless_workspace(void **state) {
    (void)state;
    char why[512];
    if (!h_pair_available(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    /* auto, forced mma (DT_ERR_NOT_SUPPORTED where it cannot run), simple */
    static const char *const kernels[3] = {"auto", "mma", "simple"};
    stateless_case c[3];
    dt_status st[3];
    char *saved = h_env_set("DT_ATTN_KERNEL", "auto");
    for (int i = 0; i < 3; i++) {
        memset(&c[i], 0, sizeof c[i]);
        setenv("DT_ATTN_KERNEL", kernels[i], 1);
        st[i] = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_stateless, &c[i]);
        if (st[i] != DT_SUCCESS) print_message("%s: %s\n", kernels[i], c[i].msg);
    }
    h_env_restore("DT_ATTN_KERNEL", saved);
    assert_int_equal(st[0], DT_SUCCESS);
    assert_int_equal(st[2], DT_SUCCESS);
    const int tensor_cores = st[1] == DT_SUCCESS;
    if (!tensor_cores) {
        assert_int_equal(st[1], DT_ERR_NOT_SUPPORTED);
        print_message("the mma kernel cannot run here: only the simple kernel's sizes seen\n");
    }
    const size_t acc = (size_t)SL_B * SL_S * SL_H * SL_D * sizeof(float);
    for (int meshed = 0; meshed < 2; meshed++) {
        print_message("%s: workspace bytes auto %zu, mma %zu, simple %zu\n",
                      meshed ? "a mesh of one rank" : "no mesh", c[0].ws[meshed], c[1].ws[meshed],
                      c[2].ws[meshed]);
        assert_true(c[2].ws[meshed] >= acc);   /* the simple kernel works in acc */
        if (tensor_cores) {   /* auto takes a tensor-core kernel, as mma does */
            assert_true(c[1].ws[meshed] + acc <= c[2].ws[meshed]);
            assert_true(c[0].ws[meshed] == c[1].ws[meshed]);
        }
        for (int i = 0; i < 3; i++)
            if (st[i] == DT_SUCCESS) assert_true(c[i].sum[meshed][0] == c[i].sum[meshed][1]);
    }
}

/* The forward's blocks after a call's first as programmatic dependent
 * launches (dt_attention_tuning.dependent_launch; compute capability 9.0):
 * they start while the block before finishes and wait for it only before
 * they read what it wrote, so a missing or misplaced wait is a race. The
 * kernels compute the same thing either way, so the outputs must agree bit
 * for bit with the launches off, and again on: a striped causal ring of
 * two ranks sharing the GPU, on the kernel auto picks (wgmma on an H100)
 * and on the mma kernel. Large enough on a GPU that blocks overlap; small
 * on the CPU emulator, which runs a dependent launch after the one before
 * and checks its waits instead (test_mma_emu). The first three runs have
 * the wgmma forward's overlapped order and its loads by a producer
 * warpgroup (the defaults; D = 128 on a GPU: its warpgroups do not meet
 * at a query tile's end, so a missing wait there is a race too); a
 * fourth, dependent launches on, has the loads by thread 0
 * (tuning.producer = 0), a fifth the defaults but the
 * communication stream's copies and adds run the other way
 * (dt_backend_cuda_set_comm_ctas: in kernels of 2 CTAs where the default
 * is the driver's copy and wide kernels, a rank alone on its GPU; those
 * where the default is kernels of a few CTAs, ranks sharing one; the
 * backward's add beside, and where the ranks share a GPU the ring's
 * transfers of K, V and of dK, dV), and a sixth the defaults with the
 * forward's rows' waits
 * (tuning.dependent_launch = 2: a block waits for the
 * counts of the rows it merges, not for the block before): the same bits
 * again. Each run's backward too: its blocks after the call's
 * first start while the one before finishes (they add into the same dQ
 * and write other dK, dV rows or buffers), so dK and dV must agree bit
 * for bit as well (dQ's reductions may add in another order). */
enum { DEP_P = 2, DEP_RUNS = 6, DEP_SUMS = 4 };

typedef struct dep_case {
    uint64_t sum[DEP_P][DEP_RUNS][DEP_SUMS];   /* rank, run (on, off, on, on with thread
                                                  0's loads, on with the comm kernels, the
                                                  rows' waits), o / lse / dk / dv */
    dt_status st[DEP_P];
    char msg[DEP_P][512];
} dep_case;

static dt_status rank_dependent(dt_context *ctx, void *arg) {
    dep_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *dout = NULL;
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    int sizes[1] = {DEP_P};
#ifdef DT_CUDA_EMULATE
    const int64_t S = DEP_P * 300, H = 2, HKV = 1, D = 128;   /* D = 128: the overlapped order */
#else
    const int64_t S = DEP_P * 2048, H = 8, HKV = 2, D = 128;
#endif
    int64_t qs[4] = {1, S, H, D}, ks[4] = {1, S, HKV, D};
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    dt_status st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_BF16, 4, qs, &lay, &q);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_BF16, 4, ks, &lay, &k);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_BF16, 4, ks, &lay, &v);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(q, 61);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(k, 62);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(v, 63);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_BF16, 4, qs, &lay, &dout);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(dout, 64);
#ifdef DT_HAVE_CUDA
    const int comm_ctas = dt_backend_cuda_comm_ctas(ctx->backend);   /* the default */
#endif
    for (int run = 0; run < DEP_RUNS && st == DT_SUCCESS; run++) {
#ifdef DT_HAVE_CUDA
        dt_backend_cuda_set_comm_ctas(ctx->backend, run != 4 ? comm_ctas : comm_ctas ? 0 : 2);
#endif
        dt_attention_tuning tuning = DT_ATTENTION_TUNING_INIT;
        tuning.dependent_launch = run == 5 ? 2 : run != 1;
        tuning.producer = run != 3;
        dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
        opts.mask = DT_ATTN_CAUSAL;
        opts.tuning = &tuning;
        st = dt_attention_forward(q, k, v, &opts, &o, &lse);
        if (st == DT_SUCCESS) st = dt_attention_backward(q, k, v, o, lse, dout, &opts, &dq, &dk, &dv);
        if (st == DT_SUCCESS) {
            c->sum[r][run][0] = checksum(o);
            c->sum[r][run][1] = checksum(lse);
            c->sum[r][run][2] = checksum(dk);
            c->sum[r][run][3] = checksum(dv);
        }
        dt_tensor_destroy(o);
        dt_tensor_destroy(lse);
        dt_tensor_destroy(dq);
        dt_tensor_destroy(dk);
        dt_tensor_destroy(dv);
        o = lse = dq = dk = dv = NULL;
    }
#ifdef DT_HAVE_CUDA
    dt_backend_cuda_set_comm_ctas(ctx->backend, comm_ctas);
#endif
    dt_tensor_destroy(q);
    dt_tensor_destroy(k);
    dt_tensor_destroy(v);
    dt_tensor_destroy(dout);
    dt_mesh_destroy(mesh);
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    return st;
}

static void test_cuda_dependent_launch(void **state) {
    (void)state;
    char why[512];
    if (!h_pair_available(DEP_P, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    static const char *const kernels[2] = {"auto", "mma"};
    char *saved = h_env_set("DT_ATTN_KERNEL", "auto");
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        dep_case c;
        memset(&c, 0, sizeof c);
        setenv("DT_ATTN_KERNEL", kernels[i], 1);
        dt_status st = h_launch_on(DEP_P, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_dependent, &c);
        if (i == 1 && st == DT_ERR_NOT_SUPPORTED) {   /* no mma kernel on this device */
            print_message("mma: %s\n", c.msg[0]);
            continue;
        }
        if (st != DT_SUCCESS) {
            print_error("DT_ATTN_KERNEL=%s: %s\n", kernels[i], c.msg[0][0] ? c.msg[0] : c.msg[1]);
            bad++;
            continue;
        }
        for (int r = 0; r < DEP_P; r++)
            for (int x = 0; x < DEP_SUMS; x++)
                for (int run = 0; run < DEP_RUNS; run++)
                    if (c.sum[r][run][x] != c.sum[r][1][x]) {
                        print_error("DT_ATTN_KERNEL=%s, rank %d: %s with dependent launches on, "
                                    "off, on, on with thread 0's loads, on with the comm "
                                    "kernels, the rows' waits: checksums %016llx, %016llx, "
                                    "%016llx, %016llx, %016llx, %016llx\n",
                                    kernels[i], r, (const char *[]){"o", "lse", "dk", "dv"}[x],
                                    (unsigned long long)c.sum[r][0][x],
                                    (unsigned long long)c.sum[r][1][x],
                                    (unsigned long long)c.sum[r][2][x],
                                    (unsigned long long)c.sum[r][3][x],
                                    (unsigned long long)c.sum[r][4][x],
                                    (unsigned long long)c.sum[r][5][x]);
                        bad++;
                        break;
                    }
    }
    h_env_restore("DT_ATTN_KERNEL", saved);
    assert_int_equal(bad, 0);
}

/* A forward block whose keys all come after its queries, neither a call's
 * first block nor its last (a contiguous ring's middle block from a later
 * rank: 28 of the 64 at P = 8), launches nothing on CUDA (attention/cuda/block.cu's
 * fwd_idle) and leaves the running state as it was; the same block with
 * its keys before the queries launches and merges into it. Likewise a
 * backward block that adds into dq, dk, dv (not `first`). On the CPU
 * emulator the CTAs are counted; on a GPU the state is what is seen. */
typedef struct idle_case {
    uint64_t ctas[2][2];   /* [forward, backward][keys after the queries, before]: CTAs run (emulator) */
    int kept[2][2];        /* acc (forward), dq (backward) as it was before the block */
    char msg[512];
} idle_case;

static dt_status rank_idle_block(dt_context *ctx, void *arg) {
    idle_case *c = arg;
#ifdef DT_HAVE_CUDA
    dt_backend *be = ctx->backend;
    enum { N = 130, H = 2, D = 64 };
    const size_t kv = (size_t)N * H * D * 2, nacc = (size_t)N * H * D, nrow = (size_t)H * N;
    void *q = NULL, *k = NULL, *v = NULL, *scratch = NULL;
    float *acc = NULL, *m = NULL, *l = NULL, *dkv = NULL;
    float *h_acc = malloc(nacc * sizeof *h_acc), *h_row = malloc(nrow * sizeof *h_row);
    float *back = malloc(nacc * sizeof *back);
    dt_status st = h_acc && h_row && back ? DT_SUCCESS : DT_ERR_OUT_OF_MEMORY;
    if (st == DT_SUCCESS) st = be->ops->alloc(be, kv, &q);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, kv, &k);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, kv, &v);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, dt_attn_kernels_cuda.fwd_scratch(D, H, N) + 1, &scratch);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nacc * sizeof(float), (void **)&acc);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nrow * sizeof(float), (void **)&m);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nrow * sizeof(float), (void **)&l);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, 2 * nacc * sizeof(float), (void **)&dkv);
    for (size_t i = 0; st == DT_SUCCESS && i < nacc; i++) h_acc[i] = 0.25f + (float)(i % 7);
    for (size_t i = 0; st == DT_SUCCESS && i < nrow; i++) h_row[i] = 1.5f;
    /* k, v = 1 (bf16 0x3f80), q = 0: a merged block changes acc, an added
     * one dq (scale dS K) */
    uint16_t *ones = malloc(kv);
    if (st == DT_SUCCESS && !ones) st = DT_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; st == DT_SUCCESS && i < kv / 2; i++) ones[i] = 0x3f80;
    if (st == DT_SUCCESS) st = be->ops->upload(be, v, ones, kv);
    if (st == DT_SUCCESS) st = be->ops->upload(be, k, ones, kv);
    free(ones);
    for (int before = 0; before < 2 && st == DT_SUCCESS; before++) {
        st = be->ops->upload(be, acc, h_acc, nacc * sizeof(float));
        if (st == DT_SUCCESS) st = be->ops->upload(be, m, h_row, nrow * sizeof(float));
        if (st == DT_SUCCESS) st = be->ops->upload(be, l, h_row, nrow * sizeof(float));
        if (st == DT_SUCCESS) st = be->ops->sync(be);
        const dt_attn_block_args a = {
            .dtype = DT_BF16, .batch = 1, .heads = H, .kv_heads = H, .dim = D, .q = q,
            .q_batch_stride = N * H * D, .k = k, .v = v, .kv_batch_stride = N * H * D,
            .qseg = {0, 1, N, 0, 0}, .kseg = {before ? 0 : N, 1, N, 0, 0},
            .mask = DT_ATTN_CAUSAL, .scale = 0.125f, .m = m, .l = l, .ml_batch_stride = H * N,
            .ml_head_stride = N, .acc = acc, .acc_batch_stride = N * H * D};
        /* the backward, into dq (acc's layout; lse = m, delta = l: finite),
         * dk and dv (one kv head each side) */
        const dt_attn_block_bwd_args g = {
            .dtype = DT_BF16, .batch = 1, .heads = H, .kv_heads = H, .dim = D, .q = q,
            .dout = v, .q_batch_stride = N * H * D, .k = k, .v = v, .kv_batch_stride = N * H * D,
            .qseg = a.qseg, .kseg = a.kseg, .mask = DT_ATTN_CAUSAL, .scale = 0.125f, .lse = m,
            .delta = l, .ml_batch_stride = H * N, .ml_head_stride = N, .dq = acc,
            .dq_batch_stride = N * H * D, .dk = dkv, .dv = dkv + nacc};
        for (int dir = 0; dir < 2 && st == DT_SUCCESS; dir++) {
            st = be->ops->upload(be, acc, h_acc, nacc * sizeof(float));
            if (st == DT_SUCCESS) st = be->ops->sync(be);
#ifdef DT_CUDA_EMULATE
            const uint64_t ran = dt_emu_get_counts().blocks;
#endif
            if (st == DT_SUCCESS)
                st = dir ? dt_attn_kernels_cuda.bwd(be, &g, scratch)
                         : dt_attn_kernels_cuda.fwd(be, &a, scratch);
            if (st == DT_SUCCESS) st = be->ops->sync(be);
#ifdef DT_CUDA_EMULATE
            c->ctas[dir][before] = dt_emu_get_counts().blocks - ran;
#endif
            if (st == DT_SUCCESS) st = be->ops->download(be, back, acc, nacc * sizeof(float));
            c->kept[dir][before] = st == DT_SUCCESS && memcmp(back, h_acc, nacc * sizeof(float)) == 0;
        }
    }
    void *const device[] = {q, k, v, scratch, acc, m, l, dkv};
    for (size_t i = 0; i < sizeof device / sizeof device[0]; i++) be->ops->free(be, device[i]);
    free(h_acc);
    free(h_row);
    free(back);
    if (st != DT_SUCCESS) snprintf(c->msg, sizeof c->msg, "%s", dt_last_error());
    return st;
#else
    (void)ctx;
    (void)c;
    return DT_ERR_NOT_SUPPORTED;
#endif
}

static void test_cuda_idle_block(void **state) {
    (void)state;
    char why[512];
    if (!h_pair_available(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    idle_case c;
    memset(&c, 0, sizeof c);
    const dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_idle_block, &c);
    if (st != DT_SUCCESS) print_error("%s\n", c.msg);
    assert_int_equal(st, DT_SUCCESS);
    for (int dir = 0; dir < 2; dir++) {
        assert_true(c.kept[dir][0]);    /* nothing merged or added */
        assert_false(c.kept[dir][1]);   /* the control: its keys merged, its dq added */
#ifdef DT_CUDA_EMULATE
        print_message("%s: CTAs run: %llu with the keys after the queries, %llu before\n",
                      dir ? "backward" : "forward", (unsigned long long)c.ctas[dir][0],
                      (unsigned long long)c.ctas[dir][1]);
        assert_int_equal(c.ctas[dir][0], 0);
        assert_true(c.ctas[dir][1] > 0);
#endif
    }
}

/* ------------------------------------------------------------------ main */

int main(void) {
    enum { MAXC = 320 };
    static fwd_case cases[MAXC];
    static struct CMUnitTest tests[MAXC + 32];
    int n = 0, nc = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_segments_follow_the_orders);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ring_runs_keep_the_mask);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_tile_classes_and_pairs);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_fully_masked_block);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_backward_block_without_pairs);
    static const dt_backend_kind timing_backends[2] = {DT_BACKEND_CPU, DT_BACKEND_CUDA};
    tests[n++] = (struct CMUnitTest){"timing/cpu", test_timing, NULL, NULL, (void *)&timing_backends[0]};
    tests[n++] = (struct CMUnitTest){"timing/cuda", test_timing, NULL, NULL, (void *)&timing_backends[1]};
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_huge_logits);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ranks_that_disagree_fail_together);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_rank_with_null_q_fails_its_peers_at_once);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_inputs);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_workspace_reuse);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_striped_group);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_cuda_stateless_workspace);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_cuda_dependent_launch);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_cuda_idle_block);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_empty_tensors);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mma_fragments);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mma_tile_bounds);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mma_launch_order);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mma_division);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mma_launch_tail);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mma_bwd_fragments);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_kernel_env);
    tests[n++] = (struct CMUnitTest){"cuda-kernel-table", test_cuda_kernel_table, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_cuda_forced_mma_refused);
    /* Every order, P = 1..8, causal and full, fp32, bf16 and fp16; local
     * lengths on both sides of the kernel's 64-row tile; GQA ratios 1, 2, 4. */
    static const dt_dtype dtypes[3] = {DT_F32, DT_BF16, DT_F16};
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= MAXP; p++)
            for (int mk = 0; mk < 2; mk++)
                for (int dt = 0; dt < 3; dt++) {
                    fwd_case *c = &cases[nc++];
                    int64_t local = (p + mk) % 2 ? 6 : 66;
                    int64_t hkv = (int64_t[]){4, 2, 1}[(p + o) % 3];
                    c->s = (attn_shape){1 + (p % 2), local * p, 4, hkv, dt ? 32 : 16};
                    c->P = p;
                    c->tp = 1;
                    c->order = (dt_order)o;
                    c->mask = mk ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                    c->dtype = dtypes[dt];
                    c->seed = 100 + (uint64_t)nc;
                    snprintf(c->name, sizeof c->name, "forward/%s/P=%d,B=%lld,S=%lld,H=4,HKV=%lld,D=%lld,%s,%s",
                             dt_order_name(c->order), p, (long long)c->s.B, (long long)c->s.S,
                             (long long)hkv, (long long)c->s.D, dt_attn_mask_name(c->mask),
                             dt_dtype_name(c->dtype));
                }
    /* Local lengths over several of the CPU kernel's 64-query and 128-key
     * tiles, a multiple of neither (zigzag: segments of 150), so that full
     * tiles, the diagonal band's slices and a partial last tile meet. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 3; p++) {
            fwd_case *c = &cases[nc++];
            int64_t local = o == DT_ORDER_ZIGZAG ? 300 : 150;
            c->s = (attn_shape){1, local * p, 4, 2, 64};
            c->P = p;
            c->tp = 1;
            c->order = (dt_order)o;
            c->mask = p == 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
            c->dtype = (p + o) % 2 ? DT_BF16 : DT_F32;
            c->seed = 1700 + (uint64_t)nc;
            snprintf(c->name, sizeof c->name, "forward/%s/P=%d,B=1,S=%lld,H=4,HKV=2,D=64,%s,%s",
                     dt_order_name(c->order), p, (long long)c->s.S, dt_attn_mask_name(c->mask),
                     dt_dtype_name(c->dtype));
        }
    /* Heads sharded over a tensor-parallel mesh dim too (tp x sp); on a tp of
     * 1, sharded striped, which is no permutation there. */
    int meshes[][2] = {{2, 2}, {2, 3}, {4, 1}, {2, 4}, {1, 3}};
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++) {
        fwd_case *c = &cases[nc++];
        c->tp = meshes[i][0];
        c->P = meshes[i][1];
        c->head_order = c->tp == 1 ? DT_ORDER_STRIPED : DT_ORDER_CONTIGUOUS;
        c->s = (attn_shape){1, 10 * c->P, 8, 4, 16};
        c->order = i % 2 ? DT_ORDER_STRIPED : DT_ORDER_ZIGZAG;
        c->mask = DT_ATTN_CAUSAL;
        c->dtype = DT_F32;
        c->seed = 7 + i;
        snprintf(c->name, sizeof c->name,
                 "forward/%s/tp=%d%s,sp=%d,S=%lld,H=8,HKV=4,D=16,causal,fp32",
                 dt_order_name(c->order), c->tp, c->tp == 1 ? " (Shard(2, striped))" : "", c->P,
                 (long long)c->s.S);
    }
    /* The same on the CUDA backend (ranks sharing one GPU): skipped without a
     * GPU. P = 8 shares the emulator's 4 devices too (make CUDA=emu test). */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 8; p *= 2)
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
    /* Every CUDA forward kernel (DT_ATTN_KERNEL=simple, =mma, =wgmma) on every
     * order, P = 1..3, causal and full, bf16 and fp16, head dim 64 or 128
     * (alternating), GQA 1, 2, 4, local lengths 70, 134, 200 (never a multiple
     * of the 64-row tiles; zigzag segments of 35, 67, 100); then logits of
     * magnitude 1e4. Skipped without a GPU. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 3; p++)
            for (int mk = 0; mk < 2; mk++)
                for (int dt = 0; dt < 2; dt++) {
                    fwd_case *c = &cases[nc++];
                    int64_t local = (int64_t[]){70, 134, 200}[(p + o + mk) % 3];
                    int64_t hkv = (int64_t[]){4, 2, 1}[(p + o + dt) % 3];
                    int64_t D = (p + o + mk + dt) % 2 ? 128 : 64;
                    c->s = (attn_shape){1 + (p + dt) % 2, local * p, 4, hkv, D};
                    c->P = p;
                    c->tp = 1;
                    c->order = (dt_order)o;
                    c->mask = mk ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                    c->dtype = dt ? DT_F16 : DT_BF16;
                    c->seed = 900 + (uint64_t)nc;
                    c->backend = DT_BACKEND_CUDA;
                    c->kernels = 1;
                    snprintf(c->name, sizeof c->name,
                             "forward/cuda-kernels/%s/P=%d,B=%lld,S=%lld,H=4,HKV=%lld,D=%lld,%s,%s",
                             dt_order_name(c->order), p, (long long)c->s.B, (long long)c->s.S,
                             (long long)hkv, (long long)D, dt_attn_mask_name(c->mask),
                             dt_dtype_name(c->dtype));
                }
    for (int dt = 0; dt < 2; dt++) {
        fwd_case *c = &cases[nc++];
        c->s = (attn_shape){1, 2 * 134, 4, 2, 64};
        c->P = 2;
        c->tp = 1;
        c->order = DT_ORDER_STRIPED;
        c->mask = DT_ATTN_CAUSAL;
        c->dtype = dt ? DT_F16 : DT_BF16;
        c->seed = 990 + (uint64_t)dt;
        c->backend = DT_BACKEND_CUDA;
        c->kernels = 1;
        c->huge = 1;
        snprintf(c->name, sizeof c->name,
                 "forward/cuda-kernels/striped/P=2,B=1,S=268,H=4,HKV=2,D=64,causal,%s,logits=1e4",
                 dt_dtype_name(c->dtype));
    }
    /* The tensor-core kernels' LATEST forms (attention/cuda/kernels.h),
     * which auto does not run until a GPU has passed them, forced through
     * dt_attention_options.tuning (mma-latest, wgmma-latest; the wgmma
     * forward at D = 128 with its producer warpgroup and with thread 0's
     * loads): every order, causal bf16 at D = 64 over 2 ranks (v 0), full
     * fp16 at D = 128 over 3 (v 1; GQA 2, 4); logits of magnitude 1e4
     * (v 2, striped); one rank, causal bf16 at D = 128 (v 3, contiguous: a
     * case for compute-sanitizer's one-rank runs). Skipped without a GPU;
     * the emulator runs them. */
    for (int kc = 0; kc < 2; kc++)
        for (int o = 0; o < DT_ORDER_COUNT; o++)
            for (int v = 0; v < 4; v++) {
                if ((v == 2 && o != DT_ORDER_STRIPED) || (v == 3 && o != DT_ORDER_CONTIGUOUS))
                    continue;
                fwd_case *c = &cases[nc++];
                const int p = (int[]){2, 3, 2, 1}[v];
                const int64_t D = v % 2 ? 128 : 64, hkv = v == 1 ? 1 : 2;
                c->kernel = kc ? DT_ATTN_KERNEL_WGMMA_LATEST : DT_ATTN_KERNEL_MMA_LATEST;
                c->s = (attn_shape){v % 2 ? 2 : 1, (int64_t[]){70, 134, 70, 200}[v] * p, 4, hkv, D};
                c->P = p;
                c->tp = 1;
                c->order = (dt_order)o;
                c->mask = v == 1 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                c->dtype = v == 1 ? DT_F16 : DT_BF16;
                c->huge = v == 2;
                c->seed = 2600 + (uint64_t)nc;
                c->backend = DT_BACKEND_CUDA;
                snprintf(c->name, sizeof c->name,
                         "forward/cuda-latest/%s/%s/P=%d,B=%lld,S=%lld,H=4,HKV=%lld,D=%lld,%s,%s%s",
                         dt_attn_kernel_choice_name(c->kernel), dt_order_name(c->order), p,
                         (long long)c->s.B, (long long)c->s.S, (long long)hkv, (long long)D,
                         dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype),
                         c->huge ? ",logits=1e4" : "");
            }
    /* Ring steps grouped per launch (dt_attention_options.group): every
     * order causal and full, P = 3, 5, 8, G = 2, 3 and 7 (at most P - 1
     * take effect, and striped causal the greatest power of two up to
     * that, 4 slots interleaved at P = 8; runs end at the sources' wrap
     * and at the rank's last step with pairs, so every rank's runs
     * differ), two batch entries (the pieces per batch entry and chunk),
     * GQA, lengths that are no multiple of a tile. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int pi = 0; pi < 3; pi++)
            for (int gi = 0; gi < 3; gi++) {
                fwd_case *c = &cases[nc++];
                const int p = (int[]){3, 5, 8}[pi], g = (int[]){2, 3, 7}[gi];
                c->s = (attn_shape){2, (o == DT_ORDER_ZIGZAG ? 34 : 17) * p, 4, 2, 16};
                c->P = p;
                c->tp = 1;
                c->order = (dt_order)o;
                c->mask = (pi + gi) % 3 == 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                c->dtype = (pi + gi) % 2 ? DT_BF16 : DT_F32;
                c->group = g;
                c->seed = 2100 + (uint64_t)nc;
                snprintf(c->name, sizeof c->name,
                         "forward/group=%d/%s/P=%d,B=2,S=%lld,H=4,HKV=2,D=16,%s,%s", g,
                         dt_order_name(c->order), p, (long long)c->s.S,
                         dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype));
            }
    {   /* grouped with the heads sharded too */
        fwd_case *c = &cases[nc++];
        c->tp = 2;
        c->P = 4;
        c->s = (attn_shape){1, 10 * c->P, 8, 4, 16};
        c->order = DT_ORDER_ZIGZAG;
        c->mask = DT_ATTN_CAUSAL;
        c->dtype = DT_F32;
        c->group = 2;
        c->seed = 2300;
        snprintf(c->name, sizeof c->name, "forward/group=2/zigzag/tp=2,sp=4,S=40,H=8,HKV=4,D=16,causal,fp32");
    }
    /* Grouped on every CUDA forward kernel (skipped without a GPU; the
     * emulator runs them): the launches over several blocks side by side,
     * their batch stride G c rows, their segment's jump (zigzag), striped
     * causal keys interleaved from 2 slots (P = 4) and 4 (P = 8; the wgmma
     * kernel's 5-D tensor maps), 70 rows a slot: its last key tile's rows
     * past the slots' ends. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int gi = 0; gi < 2 + (o == DT_ORDER_STRIPED); gi++) {
            fwd_case *c = &cases[nc++];
            c->P = gi == 2 ? 8 : 4;
            c->tp = 1;
            c->order = (dt_order)o;
            c->mask = gi == 1 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
            c->dtype = gi ? DT_F16 : DT_BF16;
            c->group = gi == 2 ? 4 : 2 + gi;
            c->s = (attn_shape){2, (o == DT_ORDER_ZIGZAG ? 140 : 70) * c->P, 4, 2, gi ? 128 : 64};
            c->seed = 2400 + (uint64_t)nc;
            c->backend = DT_BACKEND_CUDA;
            c->kernels = 1;
            snprintf(c->name, sizeof c->name,
                     "forward/cuda-kernels/group=%d/%s/P=%d,B=2,S=%lld,H=4,HKV=2,D=%lld,%s,%s",
                     c->group, dt_order_name(c->order), c->P, (long long)c->s.S, (long long)c->s.D,
                     dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype));
        }
    /* Grouped over NCCL (a GPU a rank: 4 GPUs, or the emulator's), whose
     * chained hops are ordered after the communication stream only. */
    for (int o = 0; o < DT_ORDER_COUNT; o++) {
        fwd_case *c = &cases[nc++];
        c->P = 4;
        c->tp = 1;
        c->order = (dt_order)o;
        c->mask = DT_ATTN_CAUSAL;
        c->dtype = DT_BF16;
        c->group = o ? 3 : 2;
        c->s = (attn_shape){2, 70 * c->P, 4, 2, 64};
        c->seed = 2500 + (uint64_t)nc;
        c->backend = DT_BACKEND_CUDA;
        c->nccl = 1;
        snprintf(c->name, sizeof c->name,
                 "forward/cuda-nccl/group=%d/%s/P=4,B=2,S=280,H=4,HKV=2,D=64,causal,bf16",
                 c->group, dt_order_name(c->order));
    }
    for (int i = 0; i < nc; i++) {
        tests[n] = (struct CMUnitTest){cases[i].name, run_forward_case, NULL, NULL, &cases[i]};
        n++;
    }
    return h_run_cases("attention forward (cpu)", tests, (size_t)n);
}
