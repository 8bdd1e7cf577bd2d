/* tests/test_attention_backward.c — the attention backward pass (Ring,
 * Striped, Zigzag) against double-precision reference gradients on the
 * gathered sequence (attn_ref.c), a finite-difference check of the CPU
 * kernel through the public API, and the error across world sizes on the
 * same data. Rank threads record; the main thread asserts.
 *
 * On a GPU, the "backward/cuda-kernels/..." cases run the distributed
 * forward and backward with DT_ATTN_KERNEL=simple, then =mma (the
 * tensor-core kernels, attention/block_cuda_mma*.cu), then =wgmma (the
 * Hopper kernels, block_cuda_wgmma*.cu, where they can run: a 9.0 device
 * and an sm_90 build), each against the reference at its dtype's tolerance;
 * skipped without a GPU. Run just them
 * with DT_TEST_FILTER='backward/cuda-kernels*'. Those force the kernels'
 * VERIFIED forms (attention/cuda/kernels.h); the "backward/cuda-latest/..."
 * cases force their LATEST forms through dt_attention_options.tuning
 * (mma-latest, wgmma-latest), forward and backward alike. The emulator
 * (make CUDA=emu test) runs all of them. */
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
#include "attn_ref.h"
#include "dtensor/dtensor.h"
#include "harness.h"
#ifdef DT_CUDA_EMULATE
#include "emu/emu.h"
#endif

#define MAXR 8

typedef struct bwd_case {
    char name[128];
    attn_shape s;
    int P, tp;
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    uint64_t seed;
    dt_backend_kind backend;   /* cpu (0 means cpu too) or cuda; cuda cases skip without a GPU */
    int kernels;               /* cuda: run with DT_ATTN_KERNEL=simple, =mma, =wgmma, each checked */
    dt_attn_kernel_choice kernel;   /* cuda: dt_attention_tuning.kernel of both passes (0: auto) */
    double *q, *k, *v, *g;     /* the full inputs (set by run_case) */
    double *dq_ref, *dk_ref, *dv_ref;
    dt_status st[MAXR];
    long bad[MAXR];
    double max_err[MAXR];
    char msg[MAXR][256];
} bwd_case;

/* |got - ref| <= tol + tol |ref|: fp32 1e-4, bf16 3e-2, fp16 4e-3 (bf16's
 * over 8: fp16 rounds to 2^-12 relative, bf16 to 2^-9). */
static double tolerance(dt_dtype dt) { return dt == DT_F32 ? 1e-4 : dt == DT_F16 ? 4e-3 : 3e-2; }

/* Compare one local gradient with its reference rows. */
static long check_grad(const bwd_case *c, const char *what, const dt_tensor *g, const double *full,
                       int64_t heads, int j, int t, double *max_err) {
    const attn_shape *s = &c->s;
    int64_t hl = heads / c->tp;
    size_t n = (size_t)(s->B * (s->S / c->P) * hl * s->D);
    float *got = malloc(n * sizeof *got);
    double *ref = malloc(n * sizeof *ref), err = 0;
    long bad = 1;
    if (ref_get_f32(g, got) == DT_SUCCESS) {
        ref_local_rows(full, s->B, s->S, heads, s->D, c->order, c->P, j, t, hl, ref);
        char label[192];
        snprintf(label, sizeof label, "%s %s", c->name, what);
        bad = h_compare(label, got, ref, n, tolerance(c->dtype), tolerance(c->dtype), &err);
    }
    if (err > *max_err) *max_err = err;
    free(got);
    free(ref);
    return bad;
}

static dt_status rank_backward(dt_context *ctx, void *arg) {
    bwd_case *c = arg;
    int r = dt_context_rank(ctx);
    const attn_shape *s = &c->s;
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *dout = NULL;
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL, *ws = NULL;
    dt_status st;
    int sizes[2] = {c->tp, c->P};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 2, sizes, NULL, &mesh), out);
    dt_layout lay = dt_layout_2d(c->tp > 1 ? dt_shard(2, DT_ORDER_CONTIGUOUS) : dt_replicate(),
                                 dt_shard(1, c->order));
    int64_t qs[4] = {s->B, s->S, s->H, s->D}, ks[4] = {s->B, s->S, s->Hkv, s->D};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qs, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, ks, &lay, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, ks, &lay, &v), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qs, &lay, &dout), out);
    int t = dt_mesh_coord(mesh, 0), j = dt_mesh_coord(mesh, 1);
    if (c->kernels || c->kernel) {
        /* each rank sets its rows of the test's own inputs (any dtype) */
        int64_t rows = s->S / c->P, hl = s->H / c->tp, hkvl = s->Hkv / c->tp;
        double *mine = malloc((size_t)(s->B * rows * hl * s->D) * sizeof *mine);
        const double *full[4] = {c->q, c->k, c->v, c->g};
        dt_tensor *dst[4] = {q, k, v, dout};
        for (int i = 0; i < 4 && st == DT_SUCCESS; i++) {
            int64_t heads = i == 1 || i == 2 ? s->Hkv : s->H;
            ref_local_rows(full[i], s->B, s->S, heads, s->D, c->order, c->P, j, t,
                           i == 1 || i == 2 ? hkvl : hl, mine);
            st = ref_set_local(dst[i], mine);
        }
        free(mine);
        if (st != DT_SUCCESS) goto out;
    } else {
        DT_TRY_GOTO(st, dt_tensor_fill_random(q, c->seed), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(k, c->seed + 1), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(v, c->seed + 2), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(dout, c->seed + 3), out);
    }
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    dt_attention_tuning tuning = DT_ATTENTION_TUNING_INIT;
    tuning.kernel = c->kernel;
    if (c->kernel) opts.tuning = &tuning;
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);
    /* The backward in a workspace of the caller's full of NaN: the call must
     * write whatever it reads of it (its dK|dV buffers are never zeroed). */
    DT_TRY_GOTO(st, dt_attention_backward_workspace_size(q, k, v, &opts, &opts.workspace_bytes),
                out);
    int64_t nws = (int64_t)(opts.workspace_bytes / sizeof(float)) + 1;
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 1, &nws, NULL, &ws), out);
    double *nan = malloc((size_t)nws * sizeof *nan);
    if (!nan) DT_TRY_GOTO(st, dt_error(DT_ERR_OUT_OF_MEMORY, "test: out of memory"), out);
    for (int64_t i = 0; i < nws; i++) nan[i] = NAN;
    st = ref_set_local(ws, nan);
    free(nan);
    if (st != DT_SUCCESS) goto out;
    opts.workspace = dt_tensor_data(ws);
    DT_TRY_GOTO(st, dt_attention_backward(q, k, v, o, lse, dout, &opts, &dq, &dk, &dv), out);
    c->bad[r] = check_grad(c, "dq", dq, c->dq_ref, s->H, j, t, &c->max_err[r]) +
                check_grad(c, "dk", dk, c->dk_ref, s->Hkv, j, t, &c->max_err[r]) +
                check_grad(c, "dv", dv, c->dv_ref, s->Hkv, j, t, &c->max_err[r]);
out:
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    dt_tensor *all[] = {q, k, v, o, lse, dout, dq, dk, dv, ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    return st;
}

/* One launch of the case on every rank; each rank's status and message in
 * c->st, c->msg. */
static dt_status launch_ranks(bwd_case *c, dt_backend_kind backend) {
    memset(c->st, 0, sizeof c->st);
    memset(c->bad, 0, sizeof c->bad);
    memset(c->max_err, 0, sizeof c->max_err);
    return h_launch_on(c->P * c->tp, backend, DT_TRANSPORT_LOCAL, rank_backward, c);
}

/* 1 if every rank of a launch (its status st) succeeded and matched the
 * reference, else 0 after printing what failed; *worst: the largest error
 * over ranks. `kernel`: the DT_ATTN_KERNEL value in force (NULL: not set by
 * the test). The caller asserts, after restoring the environment. */
static int judge_case(bwd_case *c, dt_status st, const char *kernel, double *worst) {
    const char *k = kernel ? kernel : "unset";
    int ok = st == DT_SUCCESS;
    if (!ok) print_error("%s (DT_ATTN_KERNEL %s): %s\n", c->name, k, dt_last_error());
    *worst = 0;
    for (int r = 0; r < c->P * c->tp; r++) {
        if (c->st[r] != DT_SUCCESS) {
            print_error("rank %d (DT_ATTN_KERNEL %s): %s\n", r, k, c->msg[r]);
            ok = 0;
        } else if (c->bad[r]) {
            print_error("rank %d (DT_ATTN_KERNEL %s): %ld mismatches, max error %.3g\n", r, k,
                        c->bad[r], c->max_err[r]);
            ok = 0;
        }
        *worst = fmax(*worst, c->max_err[r]);
    }
    return ok;
}

static int launch_case(bwd_case *c, dt_backend_kind backend, const char *kernel, double *worst) {
    return judge_case(c, launch_ranks(c, backend), kernel, worst);
}

/* launch_case with the wgmma kernels forced (DT_ATTN_KERNEL=wgmma, or
 * c->kernel wgmma-latest): 1 if it passed, or if every rank refused with
 * DT_ERR_NOT_SUPPORTED for a reason outside the case (not a 9.0 device, or
 * no sm_90 build: *refused = 1). */
static int wgmma_case(bwd_case *c, dt_backend_kind backend, double *worst, int *refused) {
    const dt_status st = launch_ranks(c, backend);
    *refused = st == DT_ERR_NOT_SUPPORTED;
    for (int r = 0; r < c->P * c->tp && *refused; r++)
        *refused = c->st[r] == DT_ERR_NOT_SUPPORTED &&
                   (strstr(c->msg[r], "needs a compute capability 9.0") ||
                    strstr(c->msg[r], "wgmma kernel was not built"));
    *worst = 0;
    return *refused ||
           judge_case(c, st, c->kernel ? dt_attn_kernel_choice_name(c->kernel) : "wgmma", worst);
}

/* The bulk reductions run so far (the emulator counts them: make CUDA=emu),
 * by which the wgmma backward's LATEST form adds dQ and its VERIFIED form
 * does not: which form a forced choice reached. -1 without the emulator. */
static int64_t bulk_reductions(void) {
#ifdef DT_CUDA_EMULATE
    return (int64_t)dt_emu_get_counts().bulk;
#else
    return -1;
#endif
}

/* Runs one case; returns the largest error over ranks (for the P sweep). */
static double run_case(bwd_case *c) {
    const attn_shape *s = &c->s;
    dt_backend_kind backend = c->backend ? c->backend : DT_BACKEND_CPU;
    char why[512];
    if (!h_pair_available(c->P * c->tp, backend, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    int64_t nq = s->B * s->S * s->H * s->D, nk = s->B * s->S * s->Hkv * s->D;
    c->q = ref_input(c->seed, nq, c->dtype), c->k = ref_input(c->seed + 1, nk, c->dtype);
    c->v = ref_input(c->seed + 2, nk, c->dtype), c->g = ref_input(c->seed + 3, nq, c->dtype);
    c->dq_ref = malloc((size_t)nq * sizeof(double));
    c->dk_ref = malloc((size_t)nk * sizeof(double));
    c->dv_ref = malloc((size_t)nk * sizeof(double));
    ref_attention_backward(s, c->q, c->k, c->v, c->g, c->mask == DT_ATTN_CAUSAL,
                           1.0 / sqrt((double)s->D), c->dq_ref, c->dk_ref, c->dv_ref);
    int ok_simple = 1, ok, ok_wgmma = 1;
    double worst = 0, worst_simple = 0, worst_wgmma = 0;
    if (c->kernels) {
        /* Every CUDA kernel pair on the same inputs, each against the
         * reference; the variable is read when each call's plan is made.
         * wgmma runs only on a 9.0 device with an sm_90 build: elsewhere
         * every rank must refuse it, saying which of the two is missing. */
        char *saved = h_env_set("DT_ATTN_KERNEL", "simple");
        ok_simple = launch_case(c, backend, "simple", &worst_simple);
        setenv("DT_ATTN_KERNEL", "mma", 1);
        ok = launch_case(c, backend, "mma", &worst);
        setenv("DT_ATTN_KERNEL", "wgmma", 1);
        int refused = 0;
        const int64_t bulk0 = bulk_reductions();
        ok_wgmma = wgmma_case(c, backend, &worst_wgmma, &refused);
        if (bulk0 >= 0 && !refused && bulk_reductions() != bulk0) {   /* the VERIFIED form */
            print_error("DT_ATTN_KERNEL=wgmma ran %lld bulk reductions: the LATEST form\n",
                        (long long)(bulk_reductions() - bulk0));
            ok_wgmma = 0;
        }
        h_env_restore("DT_ATTN_KERNEL", saved);
        if (refused) print_message("wgmma kernels not run: %s\n", c->msg[0]);
        print_message("%s: max |error| simple %.3g, mma %.3g, wgmma %.3g\n", c->name, worst_simple,
                      worst, worst_wgmma);
    } else if (c->kernel == DT_ATTN_KERNEL_WGMMA_LATEST) {   /* where it can run, as =wgmma */
        int refused = 0;
        const int64_t bulk0 = bulk_reductions();
        ok = wgmma_case(c, backend, &worst, &refused);
        if (bulk0 >= 0 && !refused && bulk_reductions() == bulk0) {   /* the LATEST form */
            print_error("wgmma-latest ran no bulk reduction: not the LATEST form\n");
            ok = 0;
        }
        if (refused) print_message("wgmma kernels not run: %s\n", c->msg[0]);
    } else if (c->kernel) {
        ok = launch_case(c, backend, dt_attn_kernel_choice_name(c->kernel), &worst);
    } else {
        ok = launch_case(c, backend, NULL, &worst);
    }
    free(c->q), free(c->k), free(c->v), free(c->g);
    free(c->dq_ref), free(c->dk_ref), free(c->dv_ref);
    assert_true(ok_simple);
    assert_true(ok);
    assert_true(ok_wgmma);
    return worst;
}

static void run_backward_case(void **state) { run_case(*state); }

/* The same data at P = 1, 2, 4, 8: the error must not grow with P. */
static void test_error_does_not_grow_with_world_size(void **state) {
    (void)state;
    for (int o = 0; o < DT_ORDER_COUNT; o++) {
        double err[4];
        for (int i = 0; i < 4; i++) {
            bwd_case c = {.s = {1, 128, 4, 2, 32}, .P = 1 << i, .tp = 1, .order = (dt_order)o,
                          .mask = DT_ATTN_CAUSAL, .dtype = DT_F32, .seed = 77};
            snprintf(c.name, sizeof c.name, "backward/%s/P=%d", dt_order_name(c.order), c.P);
            err[i] = run_case(&c);
        }
        print_message("backward/%s: max |error| at P=1,2,4,8: %.3g %.3g %.3g %.3g\n",
                      dt_order_name((dt_order)o), err[0], err[1], err[2], err[3]);
        for (int i = 1; i < 4; i++) assert_true(err[i] <= 2.0 * err[0] + 1e-7);
    }
}

/* ----------------------------------------------------- finite differences */

typedef struct fd_case {
    attn_shape s;
    int causal;
    dt_status st;
    long bad;
    double worst;
} fd_case;

/* L = sum(o * w) with a fixed random w; returns L for the given inputs. */
static dt_status loss(dt_context *ctx, const attn_shape *s, const float *q, const float *k,
                      const float *v, const float *w, const dt_attention_options *opts, double *out,
                      dt_tensor **keep_q, dt_tensor **keep_k, dt_tensor **keep_v, dt_tensor **keep_o,
                      dt_tensor **keep_lse) {
    int64_t qs[4] = {s->B, s->S, s->H, s->D}, ks[4] = {s->B, s->S, s->Hkv, s->D};
    dt_tensor *tq = NULL, *tk = NULL, *tv = NULL, *o = NULL, *lse = NULL;
    size_t nq = (size_t)(s->B * s->S * s->H * s->D), nk = (size_t)(s->B * s->S * s->Hkv * s->D);
    dt_status st;
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 4, qs, NULL, &tq), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 4, ks, NULL, &tk), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 4, ks, NULL, &tv), out);
    DT_TRY_GOTO(st, dt_tensor_set_local(tq, q, nq * sizeof *q), out);
    DT_TRY_GOTO(st, dt_tensor_set_local(tk, k, nk * sizeof *k), out);
    DT_TRY_GOTO(st, dt_tensor_set_local(tv, v, nk * sizeof *v), out);
    DT_TRY_GOTO(st, dt_attention_forward(tq, tk, tv, opts, &o, &lse), out);
    const float *od = dt_tensor_data_const(o);
    double l = 0;
    for (size_t i = 0; i < nq; i++) l += (double)od[i] * w[i];
    *out = l;
out:
    if (keep_q && st == DT_SUCCESS) {
        *keep_q = tq, *keep_k = tk, *keep_v = tv, *keep_o = o, *keep_lse = lse;
    } else {
        dt_tensor_destroy(tq), dt_tensor_destroy(tk), dt_tensor_destroy(tv);
        dt_tensor_destroy(o), dt_tensor_destroy(lse);
    }
    return st;
}

static dt_status rank_finite_differences(dt_context *ctx, void *arg) {
    fd_case *c = arg;
    const attn_shape *s = &c->s;
    size_t nq = (size_t)(s->B * s->S * s->H * s->D), nk = (size_t)(s->B * s->S * s->Hkv * s->D);
    float *x[3], *w = malloc(nq * sizeof *w);
    size_t n[3] = {nq, nk, nk};
    for (int a = 0; a < 3; a++) {
        x[a] = malloc(n[a] * sizeof(float));
        for (size_t i = 0; i < n[a]; i++) x[a][i] = dt_random_value(40 + (uint64_t)a, i);
    }
    for (size_t i = 0; i < nq; i++) w[i] = dt_random_value(50, i);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->causal ? DT_ATTN_CAUSAL : DT_ATTN_FULL;
    dt_tensor *tq = NULL, *tk = NULL, *tv = NULL, *o = NULL, *lse = NULL, *dout = NULL;
    dt_tensor *g[3] = {NULL, NULL, NULL};
    double l0;
    int64_t qs[4] = {s->B, s->S, s->H, s->D};
    dt_status st = loss(ctx, s, x[0], x[1], x[2], w, &opts, &l0, &tq, &tk, &tv, &o, &lse);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, NULL, DT_F32, 4, qs, NULL, &dout);
    if (st == DT_SUCCESS) st = dt_tensor_set_local(dout, w, nq * sizeof *w);
    if (st == DT_SUCCESS) st = dt_attention_backward(tq, tk, tv, o, lse, dout, &opts, &g[0], &g[1], &g[2]);
    /* Central differences in fp32 with h = 1e-2: truncation O(h^2), rounding
     * about 1e-7 / h; the bound below is far above both and far below the
     * gradients' size (about 0.1 to 1). */
    const float h = 1e-2f;
    for (int a = 0; st == DT_SUCCESS && a < 3; a++) {
        const float *grad = dt_tensor_data_const(g[a]);
        for (size_t i = 0; st == DT_SUCCESS && i < n[a]; i++) {
            float keep = x[a][i];
            double lp, lm;
            x[a][i] = keep + h;
            st = loss(ctx, s, x[0], x[1], x[2], w, &opts, &lp, NULL, NULL, NULL, NULL, NULL);
            x[a][i] = keep - h;
            if (st == DT_SUCCESS) st = loss(ctx, s, x[0], x[1], x[2], w, &opts, &lm, NULL, NULL, NULL, NULL, NULL);
            x[a][i] = keep;
            double fd = (lp - lm) / (2.0 * h), err = fabs(fd - grad[i]);
            c->worst = fmax(c->worst, err);
            if (err > 2e-3 + 2e-3 * fabs(fd)) c->bad++;
        }
    }
    c->st = st;
    for (int a = 0; a < 3; a++) free(x[a]), dt_tensor_destroy(g[a]);
    free(w);
    dt_tensor *all[] = {tq, tk, tv, o, lse, dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    return st;
}

static void test_finite_differences(void **state) {
    (void)state;
    for (int causal = 0; causal < 2; causal++) {
        fd_case c = {.s = {1, 5, 2, 1, 8}, .causal = causal};
        assert_int_equal(h_launch(1, rank_finite_differences, &c), DT_SUCCESS);
        assert_int_equal(c.st, DT_SUCCESS);
        print_message("finite differences (%s): max |fd - grad| = %.3g\n", causal ? "causal" : "full", c.worst);
        assert_int_equal(c.bad, 0);
    }
}

/* ------------------------------------------------------------ bad input */

static dt_status rank_bad(dt_context *ctx, void *arg) {
    long *bad = arg;
    int64_t qs[4] = {1, 16, 2, 8};
    dt_tensor *q = NULL, *o = NULL, *lse = NULL, *dq = (dt_tensor *)1, *dk = NULL, *dv = NULL;
    dt_tensor *wrong = NULL;
    int64_t ws[4] = {1, 16, 2, 16};
    dt_status st = dt_tensor_create(ctx, NULL, DT_F32, 4, qs, NULL, &q);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, NULL, DT_F32, 4, ws, NULL, &wrong);
    if (st == DT_SUCCESS) st = dt_attention_forward(q, q, q, NULL, &o, &lse);
    if (st != DT_SUCCESS) return st;
    /* a rejected call writes no output handle */
    *bad += dt_attention_backward(q, q, q, o, lse, NULL, NULL, &dq, &dk, &dv) != DT_ERR_INVALID_ARGUMENT;
    *bad += dq != (dt_tensor *)1;
    *bad += dt_attention_backward(q, q, q, o, lse, wrong, NULL, &dq, &dk, &dv) != DT_ERR_INVALID_ARGUMENT;
    *bad += strstr(dt_last_error(), "dout must have") == NULL;
    *bad += dt_attention_backward(q, q, q, o, o, o, NULL, &dq, &dk, &dv) != DT_ERR_INVALID_ARGUMENT;
    *bad += strstr(dt_last_error(), "lse must be") == NULL;
    dk = dv = (dt_tensor *)1; /* dq NULL: dk and dv are left as they were too */
    *bad += dt_attention_backward(q, q, q, o, lse, o, NULL, NULL, &dk, &dv) != DT_ERR_INVALID_ARGUMENT;
    *bad += dk != (dt_tensor *)1 || dv != (dt_tensor *)1;
    dt_tensor_destroy(q), dt_tensor_destroy(o), dt_tensor_destroy(lse), dt_tensor_destroy(wrong);
    return DT_SUCCESS;
}

/* One rank on the sequence: the backward keeps no ring, so its workspace
 * is the fp32 dK, dV and dQ sums, delta and the kernel's scratch (here
 * bounded by 1 MiB), not the ring's two K|V copies and three dK|dV
 * buffers (6 MiB more at this size). A caller's workspace of exactly that
 * size gives the library's own results, bit for bit. Without a mesh and
 * with a sequence mesh of one rank. DT_TEST_QUICK (the valgrind run, where
 * 512 tokens took 113 s) runs 128, where the ring's buffers would still be
 * 1.5 MiB more. */
enum { WS_B = 2, WS_H = 4, WS_D = 64 };

typedef struct ws_case {
    int64_t S;
    size_t ws[2];
    int same[2];
} ws_case;

static int same_data(const dt_tensor *a, const dt_tensor *b) {
    size_t n = dt_tensor_local_bytes(a);
    unsigned char *x = malloc(n), *y = malloc(n);
    int same = x && y && n == dt_tensor_local_bytes(b) && dt_tensor_get_local(a, x, n) == DT_SUCCESS &&
               dt_tensor_get_local(b, y, n) == DT_SUCCESS && memcmp(x, y, n) == 0;
    free(x);
    free(y);
    return same;
}

static dt_status rank_workspace(dt_context *ctx, void *arg) {
    ws_case *c = arg;
    dt_status st = DT_SUCCESS;
    for (int meshed = 0; meshed < 2 && st == DT_SUCCESS; meshed++) {
        dt_mesh *mesh = NULL;
        dt_tensor *t[4] = {NULL}, *o = NULL, *lse = NULL, *g[2][3] = {{NULL}};
        int sizes[1] = {1};
        dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
        int64_t shape[4] = {WS_B, c->S, WS_H, WS_D};
        if (meshed) st = dt_mesh_create(ctx, 1, sizes, NULL, &mesh);
        for (int i = 0; i < 4 && st == DT_SUCCESS; i++) {   /* q, k, v, dout */
            st = dt_tensor_create(ctx, mesh, DT_F32, 4, shape, meshed ? &lay : NULL, &t[i]);
            if (st == DT_SUCCESS) st = dt_tensor_fill_random(t[i], 60 + (uint64_t)i);
        }
        if (st == DT_SUCCESS) st = dt_attention_forward(t[0], t[1], t[2], NULL, &o, &lse);
        dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
        if (st == DT_SUCCESS)
            st = dt_attention_backward_workspace_size(t[0], t[1], t[2], &opts, &c->ws[meshed]);
        void *ws = st == DT_SUCCESS ? malloc(c->ws[meshed] ? c->ws[meshed] : 1) : NULL;
        for (int mine = 0; mine < 2 && st == DT_SUCCESS; mine++) {
            opts.workspace = mine ? ws : NULL;
            opts.workspace_bytes = mine ? c->ws[meshed] : 0;
            st = dt_attention_backward(t[0], t[1], t[2], o, lse, t[3], &opts, &g[mine][0],
                                       &g[mine][1], &g[mine][2]);
        }
        c->same[meshed] = st == DT_SUCCESS;
        for (int i = 0; i < 3 && st == DT_SUCCESS; i++) c->same[meshed] &= same_data(g[0][i], g[1][i]);
        free(ws);
        for (int i = 0; i < 3; i++) dt_tensor_destroy(g[0][i]), dt_tensor_destroy(g[1][i]);
        for (int i = 0; i < 4; i++) dt_tensor_destroy(t[i]);
        dt_tensor_destroy(o);
        dt_tensor_destroy(lse);
        dt_mesh_destroy(mesh);
    }
    return st;
}

static void test_one_rank_workspace(void **state) {
    (void)state;
    ws_case c;
    memset(&c, 0, sizeof c);
    c.S = getenv("DT_TEST_QUICK") ? 128 : 512;
    assert_int_equal(h_launch(1, rank_workspace, &c), DT_SUCCESS);
    const size_t n = (size_t)(WS_B * c.S * WS_H * WS_D), rows = (size_t)(WS_B * WS_H * c.S);
    const size_t bound = 3 * n * sizeof(float) + rows * sizeof(float) + ((size_t)1 << 20);
    for (int meshed = 0; meshed < 2; meshed++) {
        print_message("%s: backward workspace %zu bytes (bound %zu)\n",
                      meshed ? "a mesh of one rank" : "no mesh", c.ws[meshed], bound);
        assert_true(c.ws[meshed] <= bound);
        assert_true(c.same[meshed]);
    }
}

static void test_bad_inputs(void **state) {
    (void)state;
    long bad = 0;
    assert_int_equal(h_launch(1, rank_bad, &bad), DT_SUCCESS);
    assert_int_equal(bad, 0);
}

int main(void) {
    enum { MAXC = 112 };
    static bwd_case cases[MAXC];
    static struct CMUnitTest tests[MAXC + 8];
    int n = 0, nc = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_finite_differences);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_inputs);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_one_rank_workspace);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_error_does_not_grow_with_world_size);
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 8; p++) {
            bwd_case *c = &cases[nc++];
            int64_t local = p % 2 ? 6 : 70;
            int64_t hkv = (int64_t[]){4, 2, 1}[(p + o) % 3];
            /* B = 3 at P = 2 and 5: the last step's two parts of the
             * batch-major key rows split a batch (backward.c) */
            c->s = (attn_shape){1 + (p % 3), local * p, 4, hkv, 16};
            c->P = p;
            c->tp = 1;
            c->order = (dt_order)o;
            c->mask = (p + o) % 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
            c->dtype = p % 3 == 0 ? DT_BF16 : DT_F32;
            c->seed = 300 + (uint64_t)nc;
            snprintf(c->name, sizeof c->name, "backward/%s/P=%d,B=%lld,S=%lld,H=4,HKV=%lld,D=16,%s,%s",
                     dt_order_name(c->order), p, (long long)c->s.B, (long long)c->s.S,
                     (long long)hkv, dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype));
        }
    /* bf16 and fp16, causal, on every order at P = 4, and a tp x sp mesh. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int dt = 0; dt < 2; dt++) {
            bwd_case *c = &cases[nc++];
            *c = (bwd_case){.s = {1, 96, 4, 2, 32}, .P = 4, .tp = 1, .order = (dt_order)o,
                            .mask = DT_ATTN_CAUSAL, .dtype = dt ? DT_F16 : DT_BF16,
                            .seed = 900 + (uint64_t)(2 * o + dt)};
            snprintf(c->name, sizeof c->name, "backward/%s/P=4,S=96,H=4,HKV=2,D=32,causal,%s",
                     dt_order_name(c->order), dt_dtype_name(c->dtype));
        }
    /* Local lengths over several of the CPU kernel's tiles (as in
     * test_attention): 150 tokens a rank, zigzag segments of 150. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 3; p++) {
            bwd_case *c = &cases[nc++];
            int64_t local = o == DT_ORDER_ZIGZAG ? 300 : 150;
            *c = (bwd_case){.s = {1, local * p, 4, 2, 32}, .P = p, .tp = 1, .order = (dt_order)o,
                            .mask = p == 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL,
                            .dtype = (p + o) % 2 ? DT_BF16 : DT_F32, .seed = 1700 + (uint64_t)nc};
            snprintf(c->name, sizeof c->name, "backward/%s/P=%d,B=1,S=%lld,H=4,HKV=2,D=32,%s,%s",
                     dt_order_name(c->order), p, (long long)c->s.S, dt_attn_mask_name(c->mask),
                     dt_dtype_name(c->dtype));
        }
    bwd_case *c = &cases[nc++];
    *c = (bwd_case){.s = {1, 48, 8, 4, 16}, .P = 3, .tp = 2, .order = DT_ORDER_STRIPED,
                    .mask = DT_ATTN_CAUSAL, .dtype = DT_F32, .seed = 5};
    snprintf(c->name, sizeof c->name, "backward/striped/tp=2,sp=3,S=48,H=8,HKV=4,D=16,causal,fp32");
    /* The same on the CUDA backend (ranks sharing one GPU): skipped without a
     * GPU. P = 8 shares the emulator's 4 devices too (make CUDA=emu test). */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 8; p *= 2) {
            bwd_case *cc = &cases[nc++];
            *cc = (bwd_case){.s = {1, 40 * p, 4, 2, 64}, .P = p, .tp = 1, .order = (dt_order)o,
                             .mask = p == 2 ? DT_ATTN_FULL : DT_ATTN_CAUSAL,
                             .dtype = p >= 4 ? DT_BF16 : DT_F32, .seed = 700 + (uint64_t)nc,
                             .backend = DT_BACKEND_CUDA};
            snprintf(cc->name, sizeof cc->name, "backward/cuda/%s/P=%d,S=%lld,H=4,HKV=2,D=64,%s,%s",
                     dt_order_name(cc->order), p, (long long)cc->s.S, dt_attn_mask_name(cc->mask),
                     dt_dtype_name(cc->dtype));
        }
    /* Every CUDA backward kernel (DT_ATTN_KERNEL=simple, =mma, =wgmma; the
     * forward follows the same variable) on every order, P = 1..3, causal
     * and full, bf16 and fp16, head dim 64 or 128 (alternating), GQA 1, 2,
     * 4, local lengths 70, 134, 200 (never a multiple of the 64-row tiles;
     * zigzag segments of 35, 67, 100). Skipped without a GPU. */
    for (int o = 0; o < DT_ORDER_COUNT; o++)
        for (int p = 1; p <= 3; p++)
            for (int mk = 0; mk < 2; mk++)
                for (int dt = 0; dt < 2; dt++) {
                    bwd_case *cc = &cases[nc++];
                    int64_t local = (int64_t[]){70, 134, 200}[(p + o + mk) % 3];
                    int64_t hkv = (int64_t[]){4, 2, 1}[(p + o + dt) % 3];
                    int64_t D = (p + o + mk + dt) % 2 ? 128 : 64;
                    *cc = (bwd_case){.s = {1 + (p + dt) % 2, local * p, 4, hkv, D}, .P = p, .tp = 1,
                                     .order = (dt_order)o,
                                     .mask = mk ? DT_ATTN_FULL : DT_ATTN_CAUSAL,
                                     .dtype = dt ? DT_F16 : DT_BF16, .seed = 1300 + (uint64_t)nc,
                                     .backend = DT_BACKEND_CUDA, .kernels = 1};
                    snprintf(cc->name, sizeof cc->name,
                             "backward/cuda-kernels/%s/P=%d,B=%lld,S=%lld,H=4,HKV=%lld,D=%lld,%s,%s",
                             dt_order_name(cc->order), p, (long long)cc->s.B, (long long)cc->s.S,
                             (long long)hkv, (long long)D, dt_attn_mask_name(cc->mask),
                             dt_dtype_name(cc->dtype));
                }
    /* The tensor-core kernels' LATEST forms (attention/cuda/kernels.h),
     * which auto does not run until a GPU has passed them, forced through
     * dt_attention_options.tuning (mma-latest, wgmma-latest): every order,
     * causal bf16 at D = 64 over 2 ranks (v 0), full fp16 at D = 128 over
     * 3 (v 1; GQA 2, 4); one rank, causal bf16 at D = 128 (v 2, contiguous:
     * a case for compute-sanitizer's one-rank runs). Skipped without a GPU;
     * the emulator runs them. */
    for (int kc = 0; kc < 2; kc++)
        for (int o = 0; o < DT_ORDER_COUNT; o++)
            for (int v = 0; v < 3; v++) {
                if (v == 2 && o != DT_ORDER_CONTIGUOUS) continue;
                bwd_case *cc = &cases[nc++];
                const int p = (int[]){2, 3, 1}[v];
                const int64_t D = v ? 128 : 64, hkv = v == 1 ? 1 : 2;
                *cc = (bwd_case){.s = {v ? 2 : 1, (int64_t[]){70, 134, 200}[v] * p, 4, hkv, D},
                                 .P = p, .tp = 1, .order = (dt_order)o,
                                 .mask = v == 1 ? DT_ATTN_FULL : DT_ATTN_CAUSAL,
                                 .dtype = v == 1 ? DT_F16 : DT_BF16, .seed = 1500 + (uint64_t)nc,
                                 .backend = DT_BACKEND_CUDA,
                                 .kernel = kc ? DT_ATTN_KERNEL_WGMMA_LATEST : DT_ATTN_KERNEL_MMA_LATEST};
                snprintf(cc->name, sizeof cc->name,
                         "backward/cuda-latest/%s/%s/P=%d,B=%lld,S=%lld,H=4,HKV=%lld,D=%lld,%s,%s",
                         dt_attn_kernel_choice_name(cc->kernel), dt_order_name(cc->order), p,
                         (long long)cc->s.B, (long long)cc->s.S, (long long)hkv, (long long)D,
                         dt_attn_mask_name(cc->mask), dt_dtype_name(cc->dtype));
            }
    for (int i = 0; i < nc; i++)
        tests[n++] = (struct CMUnitTest){cases[i].name, run_backward_case, NULL, NULL, &cases[i]};
    return h_run_cases("attention backward (cpu)", tests, (size_t)n);
}
