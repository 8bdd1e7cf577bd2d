/* tests/test_mlp.c — the Megatron tensor-parallel MLP, Y = GELU(X W1) W2,
 * built from the library's primitives and ops on P = 1..8 ranks:
 *   tp: X [Replicate]; W1 Shard(1) and W2 Shard(0) by dt_tensor_shard from
 *       rank 0; Y Partial -> all-reduce -> Replicate;
 *   sp: X [Shard(1)] -> all-gather -> the same -> reduce-scatter -> Shard(1);
 * in fp32, bf16 and fp16, against a double-precision MLP computed here with plain
 * loops from (seed, global index). Each rank compares its own part of Y
 * (h_local_of_f64 of the reference under Y's Layout) and records; the main
 * thread asserts. The Layout of every stage is checked too.
 *
 * Every case runs on the CPU backend and again on CUDA ("mlp/cuda/...":
 * cuda+local, the ranks sharing one GPU; cuBLAS with TF32 off, so the same
 * tolerances hold), which skips with the reason where cuda+local cannot run
 * (no GPU, or no CUDA build).
 *
 * The communication of a forward and a backward, counted by the mesh dim's
 * communicator (test_counts, "mlp/counts/..."): tp one all-reduce of the
 * output each way; sp an all-gather and a reduce-scatter each way; exact
 * bytes from the shapes, on P = 1..4, fp32 and bf16.
 *
 * The example program examples/tensor_parallel_mlp is run as a user would:
 * PASS and exit 0 for good flags, exit 2 and a message for bad ones
 * (skipped when it is not built), on the CPU backend (DT_EXAMPLE_BACKEND
 * picks another).
 *
 * Tolerances |got - ref| <= atol + rtol*|ref| (Y has rms ~0.5 here):
 *   fp32  atol 1e-5, rtol 1e-4   fp32 accumulation order only
 *   bf16  atol 2e-2, rtol 2e-2   H, GELU(H), the summands of Y and Y are each
 *                                rounded to bf16 (2^-9 relative); the inputs
 *                                are the same bf16 values in both
 *   fp16  atol 3e-3, rtol 3e-3   the same roundings to fp16 (2^-12 relative:
 *                                the bf16 tolerance over 8, rounded up)
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
#include <sys/wait.h>
#include <unistd.h>

#include "dtensor/dtensor.h"
#include "harness.h"
#include "ref.h"

#define MAXW H_MAX_RANKS

typedef struct mlp_case {
    int P, sp;
    dt_dtype dtype;
    dt_backend_kind backend;  /* cpu or cuda */
    int64_t B, S, E, F;
    uint64_t seed;
    double *ref;  /* [B, S, E], made by the main thread */
    /* recorded by the ranks */
    long bad[MAXW];
    double max_err[MAXW];
    int layouts_ok[MAXW];
    int shape_ok[MAXW];
} mlp_case;

static int layout_is(const dt_tensor *t, dt_layout want) {
    return dt_layout_equal(dt_tensor_layout(t), &want);
}

static dt_status rank_mlp(dt_context *ctx, void *arg) {
    mlp_case *c = arg;
    const int r = dt_context_rank(ctx);
    const int64_t xs[3] = {c->B, c->S, c->E}, w1s[2] = {c->E, c->F}, w2s[2] = {c->F, c->E};
    const dt_layout rep = dt_layout_1d(dt_replicate());
    const dt_layout seq = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout col = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout row = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    const dt_layout hid = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS));
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *w1f = NULL, *w2f = NULL, *w1 = NULL, *w2 = NULL;
    dt_tensor *xr = NULL, *h = NULL, *g = NULL, *yp = NULL, *y = NULL;
    double *lref = NULL;
    float *got = NULL;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &c->P, NULL, &mesh), out);
    DT_TRY_GOTO(st, h_make_tensor(ctx, mesh, c->dtype, 3, xs, c->sp ? &seq : &rep, c->seed, 0.0f,
                                  1.0f, &x), out);
    if (r == 0) {
        DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, c->dtype, 2, w1s, NULL, c->seed + 1, 0.0f,
                                      h_weight_scale(c->E), &w1f), out);
        DT_TRY_GOTO(st, h_make_tensor(ctx, NULL, c->dtype, 2, w2s, NULL, c->seed + 2, 0.0f,
                                      h_weight_scale(c->F), &w2f), out);
    }
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, w1f, &col, &w1), out);
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, w2f, &row, &w2), out);

    if (c->sp) DT_TRY_GOTO(st, dt_tensor_redistribute(x, &rep, &xr), out); /* all-gather */
    DT_TRY_GOTO(st, dt_matmul(c->sp ? xr : x, w1, &h), out);
    DT_TRY_GOTO(st, dt_gelu(h, DT_GELU_ERF, &g), out);
    DT_TRY_GOTO(st, dt_matmul(g, w2, &yp), out);
    DT_TRY_GOTO(st, dt_tensor_redistribute(yp, c->sp ? &seq : &rep, &y), out);

    c->layouts_ok[r] = layout_is(w1, col) && layout_is(w2, row) && (!c->sp || layout_is(xr, rep)) &&
                       layout_is(h, hid) && layout_is(g, hid) &&
                       layout_is(yp, dt_layout_1d(dt_partial())) &&
                       layout_is(y, c->sp ? seq : rep);
    const int64_t *ls = dt_tensor_local_shape(y);
    c->shape_ok[r] = ls[0] == c->B && ls[1] == (c->sp ? c->S / c->P : c->S) && ls[2] == c->E &&
                     dt_tensor_local_shape(h)[2] == c->F / c->P;

    int64_t n = dt_tensor_local_numel(y);
    lref = malloc((size_t)(c->B * c->S * c->E) * sizeof *lref);
    got = h_local_floats(y);
    if (!lref || !got) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    int coords[1] = {r};
    h_local_of_f64(c->ref, 3, xs, c->sp ? &seq : &rep, &c->P, coords, lref);
    const double atol = c->dtype == DT_F32 ? 1e-5 : c->dtype == DT_F16 ? 3e-3 : 2e-2;
    const double rtol = c->dtype == DT_F32 ? 1e-4 : c->dtype == DT_F16 ? 3e-3 : 2e-2;
    c->bad[r] = h_compare("mlp Y", got, lref, (size_t)n, atol, rtol, &c->max_err[r]);
out:
    free(lref);
    free(got);
    dt_tensor_destroy(y);
    dt_tensor_destroy(yp);
    dt_tensor_destroy(g);
    dt_tensor_destroy(h);
    dt_tensor_destroy(xr);
    dt_tensor_destroy(w2);
    dt_tensor_destroy(w1);
    dt_tensor_destroy(w2f);
    dt_tensor_destroy(w1f);
    dt_tensor_destroy(x);
    dt_mesh_destroy(mesh);
    return st;
}

/* The MLP in double from the same values: an independent reference. */
static double *mlp_reference(const mlp_case *c) {
    const int64_t M = c->B * c->S, E = c->E, F = c->F;
    double *y = calloc((size_t)(M * E), sizeof *y), *hrow = malloc((size_t)F * sizeof *hrow);
    double *w1 = malloc((size_t)(E * F) * sizeof *w1), *w2 = malloc((size_t)(F * E) * sizeof *w2);
    if (!y || !hrow || !w1 || !w2) {
        free(y);
        y = NULL;
        goto out;
    }
    for (int64_t i = 0; i < E * F; i++) {
        w1[i] = h_input_value(c->dtype, c->seed + 1, i, 0.0f, h_weight_scale(E));
        w2[i] = h_input_value(c->dtype, c->seed + 2, i, 0.0f, h_weight_scale(F));
    }
    for (int64_t m = 0; m < M; m++) {
        for (int64_t f = 0; f < F; f++) {
            double s = 0;
            for (int64_t e = 0; e < E; e++)
                s += (double)h_input_value(c->dtype, c->seed, m * E + e, 0.0f, 1.0f) *
                     w1[e * F + f];
            hrow[f] = 0.5 * s * (1.0 + erf(s / sqrt(2.0)));
        }
        for (int64_t e = 0; e < E; e++) {
            double s = 0;
            for (int64_t f = 0; f < F; f++) s += hrow[f] * w2[f * E + e];
            y[m * E + e] = s;
        }
    }
out:
    free(hrow);
    free(w1);
    free(w2);
    return y;
}

/* Whether `world` ranks can run on (backend, local) here, asked once per
 * (backend, world); *why gets the reason when not. */
static int backend_usable(dt_backend_kind backend, int world, const char **why) {
    static int known[DT_BACKEND_KIND_COUNT][MAXW + 1];
    static char reason[DT_BACKEND_KIND_COUNT][MAXW + 1][640];
    if (world < 1 || world > MAXW) world = 1;
    if (!known[backend][world])
        known[backend][world] = h_pair_available(world, backend, DT_TRANSPORT_LOCAL,
                                                 reason[backend][world],
                                                 sizeof reason[backend][world]) ? 1 : -1;
    *why = reason[backend][world];
    return known[backend][world] > 0;
}

static void test_mlp(void **state) {
    mlp_case *c = *state;
    const char *why = NULL;
    if (!backend_usable(c->backend, c->P, &why)) {
        print_message("skipped: %s\n", why);
        skip();
        return;
    }
    c->ref = mlp_reference(c);
    assert_non_null(c->ref);
    dt_status st = h_launch_on(c->P, c->backend, DT_TRANSPORT_LOCAL, rank_mlp, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    free(c->ref);
    c->ref = NULL;
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->P; r++) {
        assert_true(c->layouts_ok[r]);
        assert_true(c->shape_ok[r]);
        assert_int_equal(c->bad[r], 0);
        assert_true(isfinite(c->max_err[r]));
    }
}

/* ------------------------------------------------------------ the counters */

/* The communication of one MLP forward and backward, from the mesh dim's
 * communicator's counters (collectives/comm.h), on P = 1..4 ranks. Nothing
 * in dt_matmul, dt_gelu or their backwards communicates (dtensor/ops.c);
 * each dt_tensor_redistribute (dtensor/primitives.c) here is one step on
 * mesh dim 0, one collective; its entry check is an agreement exchange,
 * which counts nothing. With es = the dtype's size and P ranks:
 *   tp (x, dY Replicate; n = B S E, the whole output):
 *     forward   Y Partial -> Replicate            1 all_reduce of n:
 *               sent = recv = 2 (P-1) ceil(n/P) es (a reduce-scatter and an
 *               all-gather of n padded to a multiple of P)
 *     backward  dY is Replicate already (the row-parallel matmul's dy);
 *               dX Partial -> Replicate (grad_reduce) 1 all_reduce of n
 *   sp (x, Y, dY Shard(1); m = B (S/P) E, a rank's block):
 *     forward   X Shard(1) -> Replicate            1 all_gather of m
 *               Y Partial -> Shard(1)             1 reduce_scatter of m
 *     backward  dY Shard(1) -> Replicate           1 all_gather of m
 *               dX Partial -> Shard(1)            1 reduce_scatter of m
 *               each sent = recv = (P-1) m es
 * and no other kind on the mesh dim, nothing at all on the world's
 * communicator. P = 1 makes no call at all (a redistribution on a mesh dim
 * of one rank moves nothing: its output shares the input's buffer). tp's n
 * is chosen not divisible by P = 3 and 4, so the padding shows. */
typedef struct count_case {
    int P, sp;
    dt_dtype dtype;
    int64_t B, S, E, F;
    dt_comm_counters fwd[MAXW], bwd[MAXW], world[MAXW];
    dt_status st[MAXW];
} count_case;

static dt_status rank_count(dt_context *ctx, void *arg) {
    count_case *c = arg;
    const int r = dt_context_rank(ctx);
    const int64_t xs[3] = {c->B, c->S, c->E}, w1s[2] = {c->E, c->F}, w2s[2] = {c->F, c->E};
    const dt_layout rep = dt_layout_1d(dt_replicate());
    const dt_layout seq = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout col = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout row = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *w1 = NULL, *w2 = NULL, *xr = NULL, *y = NULL, *dy = NULL, *dyr = NULL;
    dt_tensor *h = NULL, *g = NULL, *yp = NULL, *dg = NULL, *dh = NULL, *dx = NULL, *dxr = NULL;
    dt_tensor *dw1 = NULL, *dw2 = NULL;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &c->P, NULL, &mesh), out);
    const dt_layout *act = c->sp ? &seq : &rep;
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 3, xs, act, &x), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 3, xs, act, &dy), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 2, w1s, &col, &w1), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 2, w2s, &row, &w2), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, 1), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(dy, 2), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(w1, 3), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(w2, 4), out);
    dt_comm *comm = dt_mesh_comm(mesh, 0), *world = dt_context_comm(ctx);
    dt_comm_counters_reset(comm);
    dt_comm_counters_reset(world);
    /* forward: as rank_mlp */
    if (c->sp) DT_TRY_GOTO(st, dt_tensor_redistribute(x, &rep, &xr), out);
    const dt_tensor *xin = c->sp ? xr : x;
    DT_TRY_GOTO(st, dt_matmul(xin, w1, &h), out);
    DT_TRY_GOTO(st, dt_gelu(h, DT_GELU_ERF, &g), out);
    DT_TRY_GOTO(st, dt_matmul(g, w2, &yp), out);
    DT_TRY_GOTO(st, dt_tensor_redistribute(yp, act, &y), out);
    DT_TRY_GOTO(st, dt_comm_counters_get(comm, &c->fwd[r]), out);
    dt_comm_counters_reset(comm);
    /* backward: dY to the Layout the row-parallel matmul's dy takes
     * (Replicate), then back through both matmuls; dX reduced to X's */
    DT_TRY_GOTO(st, dt_tensor_redistribute(dy, &rep, &dyr), out);
    DT_TRY_GOTO(st, dt_matmul_backward(g, w2, dyr, &dg, &dw2), out);
    DT_TRY_GOTO(st, dt_gelu_backward(h, DT_GELU_ERF, dg, &dh), out);
    DT_TRY_GOTO(st, dt_matmul_backward(xin, w1, dh, &dx, &dw1), out);
    DT_TRY_GOTO(st, dt_tensor_grad_reduce(dx, x, &dxr), out);
    DT_TRY_GOTO(st, dt_comm_counters_get(comm, &c->bwd[r]), out);
    DT_TRY_GOTO(st, dt_comm_counters_get(world, &c->world[r]), out);
    if (!dt_layout_equal(dt_tensor_layout(dxr), act) || !dt_layout_equal(dt_tensor_layout(y), act))
        st = dt_error(DT_ERR_INTERNAL, "rank %d: Y or dX is not in X's Layout", r);
out:
    c->st[r] = st;
    dt_tensor *all[] = {x, w1, w2, xr, y, dy, dyr, h, g, yp, dg, dh, dx, dxr, dw1, dw2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    return st;
}

/* Asserts that k is the one kind with calls in *got: `calls` of them, each
 * way `bytes`. */
static void assert_only(const char *what, int r, const dt_comm_counters *got, dt_comm_kind k,
                        uint64_t calls, uint64_t bytes) {
    for (int i = 0; i < DT_COMM_KIND_COUNT; i++) {
        const uint64_t wc = i == (int)k ? calls : 0, wb = i == (int)k ? bytes : 0;
        if (got->calls[i] != wc || got->bytes_sent[i] != wb || got->bytes_recv[i] != wb)
            print_error("%s, rank %d, %s: calls %llu sent %llu recv %llu; want %llu, %llu, %llu\n",
                        what, r, dt_comm_kind_name((dt_comm_kind)i),
                        (unsigned long long)got->calls[i], (unsigned long long)got->bytes_sent[i],
                        (unsigned long long)got->bytes_recv[i], (unsigned long long)wc,
                        (unsigned long long)wb, (unsigned long long)wb);
        assert_int_equal(got->calls[i], wc);
        assert_int_equal(got->bytes_sent[i], wb);
        assert_int_equal(got->bytes_recv[i], wb);
    }
}

/* As assert_only for two kinds with `calls` (0 or 1) each, of `bytes` each
 * way. */
static void assert_pair(const char *what, int r, const dt_comm_counters *got, dt_comm_kind a,
                        dt_comm_kind b, uint64_t calls, uint64_t bytes) {
    for (int i = 0; i < DT_COMM_KIND_COUNT; i++) {
        const int on = (i == (int)a || i == (int)b) && calls;
        if (got->calls[i] != (uint64_t)on || got->bytes_sent[i] != (on ? bytes : 0) ||
            got->bytes_recv[i] != (on ? bytes : 0))
            print_error("%s, rank %d, %s: calls %llu sent %llu recv %llu; want %d, %llu each way\n",
                        what, r, dt_comm_kind_name((dt_comm_kind)i),
                        (unsigned long long)got->calls[i], (unsigned long long)got->bytes_sent[i],
                        (unsigned long long)got->bytes_recv[i], on,
                        (unsigned long long)(on ? bytes : 0));
        assert_int_equal(got->calls[i], on);
        assert_int_equal(got->bytes_sent[i], on ? bytes : 0);
        assert_int_equal(got->bytes_recv[i], on ? bytes : 0);
    }
}

static void test_counts(void **state) {
    count_case *c = *state;
    for (int r = 0; r < MAXW; r++) c->st[r] = DT_SUCCESS;
    dt_status st = h_launch(c->P, rank_count, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    const uint64_t P = (uint64_t)c->P, es = dt_dtype_size(c->dtype);
    const uint64_t n = (uint64_t)(c->B * c->S * c->E), m = n / P;
    for (int r = 0; r < c->P; r++) {
        assert_int_equal(c->st[r], DT_SUCCESS);
        const uint64_t calls = P > 1;
        if (c->sp) {
            const uint64_t b = (P - 1) * m * es;
            assert_pair("forward", r, &c->fwd[r], DT_COMM_ALL_GATHER, DT_COMM_REDUCE_SCATTER,
                        calls, b);
            assert_pair("backward", r, &c->bwd[r], DT_COMM_ALL_GATHER, DT_COMM_REDUCE_SCATTER,
                        calls, b);
        } else {
            const uint64_t b = 2 * (P - 1) * ((n + P - 1) / P) * es;
            assert_only("forward", r, &c->fwd[r], DT_COMM_ALL_REDUCE, calls, b);
            assert_only("backward", r, &c->bwd[r], DT_COMM_ALL_REDUCE, calls, b);
        }
        assert_only("world", r, &c->world[r], DT_COMM_P2P, 0, 0);
    }
}

/* ------------------------------------------------- the example program */

static char g_example[4096] = "build/examples/tensor_parallel_mlp";

typedef struct example_case {
    const char *args;
    int want_status;
    const char *want_text; /* must appear in the output */
} example_case;


static void test_example(void **state) {
    const example_case *c = *state;
    if (access(g_example, X_OK) != 0) {
        print_message("skipped: %s is not built (run `make` first)\n", g_example);
        skip();
    }
    char *out = NULL;
    int status = h_run_program(g_example, c->args, &out);
    assert_non_null(out);
    int ok = status == c->want_status && strstr(out, c->want_text) != NULL;
    if (!ok)
        print_error("tensor_parallel_mlp %s: exit %d (want %d), output lacks '%s'?\n%s\n", c->args,
                    status, c->want_status, c->want_text, out);
    free(out);
    assert_int_equal(status, c->want_status);
    assert_true(ok);
}

/* ------------------------------------------------------------ the table */

int main(int argc, char **argv) {
    (void)argc;
    /* build[-variant]/tests/test_mlp -> build[-variant]/examples/tensor_parallel_mlp */
    const char *slash = argv[0] ? strrchr(argv[0], '/') : NULL;
    if (slash && slash - argv[0] < 4000) {
        snprintf(g_example, sizeof g_example, "%.*s/../examples/tensor_parallel_mlp",
                 (int)(slash - argv[0]), argv[0]);
        if (access(g_example, X_OK) != 0)
            snprintf(g_example, sizeof g_example, "build/examples/tensor_parallel_mlp");
    }

    enum { N_CASES = 2 * 2 * 3 * MAXW, N_COUNTS = 2 * 2 * 4 };
    static mlp_case cases[N_CASES];
    static count_case counts[N_COUNTS];
    static char names[N_CASES + N_COUNTS + 16][160];
    static const example_case examples[] = {
        {"", 0, "result: PASS"},
        {"--sp --ranks 3 --batch 1 --seq 48 --embed 48 --dtype bf16 --iters 3", 0, "result: PASS"},
        {"--ranks 5 --seq 10 --embed 40 --seed 9 --iters 2", 0, "result: PASS"},
        {"--ranks 0", 2, "--ranks takes an integer"},
        {"--dtype fp64", 2, "--dtype takes one of fp32, bf16, fp16"},
        {"--backend cpu --dtype fp16 --ranks 3 --seq 12 --embed 24 --iters 2", 0, "result: PASS"},
        {"--frobnicate", 2, "unknown flag '--frobnicate'"},
        {"--sp --ranks 3 --seq 10 --embed 48", 2, "--seq 10 is not divisible by --ranks 3"},
        {"--ranks 3 --embed 10", 2, "4E = 40 is not divisible by --ranks 3"},
        {"--iters", 2, "--iters takes an integer"},
    };
    struct CMUnitTest tests[N_CASES + N_COUNTS + 16];
    size_t n = 0;
    for (int bk = 0; bk < 2; bk++)
        for (int sp = 0; sp < 2; sp++)
            for (int dt = 0; dt < 3; dt++)
                for (int P = 1; P <= MAXW; P++) {
                    mlp_case *c = &cases[n];
                    c->P = P;
                    c->sp = sp;
                    c->dtype = dt == 2 ? DT_F16 : dt ? DT_BF16 : DT_F32;
                    c->backend = bk ? DT_BACKEND_CUDA : DT_BACKEND_CPU;
                    c->B = 2;
                    c->S = 3 * P;
                    c->E = 8 * P;
                    c->F = 4 * c->E;
                    c->seed = 100 + 10 * (uint64_t)P + (uint64_t)dt;
                    snprintf(names[n], sizeof names[n],
                             "mlp/%s%s,P=%d,B=%lld,S=%lld,E=%lld,F=%lld,%s", bk ? "cuda/" : "",
                             sp ? "sp" : "tp", P, (long long)c->B, (long long)c->S,
                             (long long)c->E, (long long)c->F, dt_dtype_name(c->dtype));
                    tests[n] = (struct CMUnitTest){names[n], test_mlp, NULL, NULL, c};
                    n++;
                }
    /* tp: n = B S E = 70 is not divisible by P = 3 or 4 (the all-reduce's
     * padding); sp: S = 12 divides over every P */
    for (int sp = 0, k = 0; sp < 2; sp++)
        for (int dt = 0; dt < 2; dt++)
            for (int P = 1; P <= 4; P++, k++) {
                count_case *c = &counts[k];
                c->P = P;
                c->sp = sp;
                c->dtype = dt ? DT_BF16 : DT_F32;
                c->B = 2;
                c->S = sp ? 12 : 5;
                c->E = 7;
                c->F = 24;
                snprintf(names[n], sizeof names[n],
                         "mlp/counts/%s,P=%d,B=%lld,S=%lld,E=%lld,F=%lld,%s", sp ? "sp" : "tp", P, (long long)c->B, (long long)c->S, (long long)c->E,
                         (long long)c->F, dt_dtype_name(c->dtype));
                tests[n] = (struct CMUnitTest){names[n], test_counts, NULL, NULL, c};
                n++;
            }
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        snprintf(names[n], sizeof names[n], "example/tensor_parallel_mlp %s%s-> exit %d",
                 examples[i].args, *examples[i].args ? " " : "", examples[i].want_status);
        tests[n] = (struct CMUnitTest){names[n], test_example, NULL, NULL, (void *)&examples[i]};
        n++;
    }
    return h_run_cases("mlp", tests, n);
}
