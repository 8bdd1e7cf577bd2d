/* examples/tensor_parallel_mlp.c — the Megatron tensor-parallel MLP,
 * Y = GELU(X W1) W2, on P ranks, with and without sequence parallelism.
 *
 * X is [B, S, E], W1 [E, F] and W2 [F, E] with F = 4E. The weights are made
 * in full on rank 0 (dt_tensor_fill_random on a local tensor, scaled by a
 * power of two near sqrt(3/fan_in) so that activations stay O(1) and the
 * scaling is exact) and handed out by dt_tensor_shard:
 *   W1 Shard(1)  column-parallel: rank j holds columns j*F/P ..   (no comm in the step)
 *   W2 Shard(0)  row-parallel:    rank j holds the matching rows
 * The step (what is timed):
 *   tensor parallel (default)      X [Replicate]
 *     H = X @ W1                   [Shard(2)]   dt_matmul reads the Layouts
 *     G = GELU(H)                  [Shard(2)]   elementwise, local
 *     Y = G @ W2                   [Partial]    every rank holds a summand
 *     Y -> Replicate               all-reduce   (the only communication)
 *   sequence parallel (--sp)       X [Shard(1)]: each rank keeps S/P tokens
 *     X -> Replicate               all-gather
 *     H, G, Y as above
 *     Y -> Shard(1)                reduce-scatter: back to S/P tokens per rank
 * Both move the same bytes per step (an all-reduce is a reduce-scatter plus
 * an all-gather); sequence parallelism keeps the activations outside the
 * MLP (X, Y, and in a real block the norms, dropout and residuals) at 1/P.
 *
 * Y is gathered to rank 0 and checked against a one-rank MLP in double
 * precision on the same inputs (plain loops here, not the library):
 * PASS or FAIL. The communication per step is computed from the shapes and
 * what each mode does; the time per step is the median over --iters steps
 * (barrier, step, barrier on every rank).
 *
 * --backend cuda runs every op on the GPU (cuda+local when ranks share GPUs,
 * cuda+nccl with one GPU per rank): the program touches tensor data only
 * through dt_tensor_set_local / dt_tensor_get_local, so it runs unchanged on
 * any backend.
 *
 * Exit status: 0 PASS, 1 FAIL or a library error, 2 bad flags or shapes,
 * 3 not supported here (--backend cuda without a CUDA build or a GPU).
 *
 * Run: build/examples/tensor_parallel_mlp [--ranks 4] [--sp] [--dtype bf16]
 * Test: tests/test_mlp.c (make test).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

#define MAX_RANKS 64
#define MAX_ITERS 1000
#define NAME "tensor_parallel_mlp"

#include "examples/example_util.h"

typedef struct config {
    int ranks, sp, iters;
    int64_t batch, seq, embed;
    dt_dtype dtype;
    dt_backend_kind backend;
    uint64_t seed;
} config;

/* The stages of one step, for printing the Layouts that rank 0 saw. */
enum { L_X, L_XFULL, L_H, L_G, L_Y, L_OUT, L_W1, L_W2, L_COUNT };

typedef struct run {
    const config *cfg;
    /* Written by rank 0, read by the main thread after dt_launch returns. */
    float *y;                      /* [B, S, E], gathered, widened to fp32 */
    double step_s[MAX_ITERS];      /* barrier-to-barrier time of each step */
    char layout[L_COUNT][128];
    dt_backend_kind backend;
} run;

static void note_layout(char *buf, const dt_tensor *t) {
    if (buf) dt_layout_format(dt_tensor_layout(t), buf, 128);
}

/* One MLP step. x is [B, S, E] under [Replicate] (or [Shard(1)] with sp);
 * *y gets Y under the same Layout. lay (may be NULL) receives the Layout of
 * every stage. Collective over the mesh. */
static dt_status mlp_step(const dt_tensor *x, const dt_tensor *w1, const dt_tensor *w2, int sp,
                          dt_tensor **y, char (*lay)[128]) {
    dt_tensor *xfull = NULL;
    dt_status st;
    const dt_layout rep = dt_layout_1d(dt_replicate());
    const dt_layout seq = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    if (sp) /* sequence parallel: all-gather the tokens before the first matmul */
        DT_TRY_GOTO(st, dt_tensor_redistribute(x, &rep, &xfull), out);
    const dt_tensor *xin = sp ? xfull : x;
    /* H = X @ W1, G = GELU(H), Y = G @ W2 [Partial], then the all-reduce (tp)
     * or reduce-scatter over the sequence (sp) */
    DT_TRY_GOTO(st, ex_mlp_forward(xin, w1, w2, sp ? &seq : &rep, y, lay ? lay[L_H] : NULL,
                                   lay ? lay[L_G] : NULL, lay ? lay[L_Y] : NULL), out);
    if (lay) {
        note_layout(lay[L_X], x);
        note_layout(lay[L_XFULL], xin);
        note_layout(lay[L_OUT], *y);
    }
out:
    dt_tensor_destroy(xfull);
    return st;
}

static dt_status rank_mlp(dt_context *ctx, void *arg) {
    run *r = arg;
    const config *c = r->cfg;
    const int rank = dt_context_rank(ctx);
    const int64_t E = c->embed, F = 4 * c->embed;
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *w1 = NULL, *w2 = NULL, *y = NULL, *yg = NULL;
    dt_status st;
    const int sizes[1] = {c->ranks};
    const char *names[1] = {"tp"};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, names, &mesh), out);

    /* X: every rank writes its part of the same global tensor. */
    const int64_t xshape[3] = {c->batch, c->seq, E};
    const dt_layout xl = c->sp ? dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS))
                               : dt_layout_1d(dt_replicate());
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 3, xshape, &xl, &x), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, c->seed), out);

    /* The weights: whole on rank 0, then scattered. */
    const dt_layout col = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout row = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, E, F, c->seed + 1, &col, &w1), out);
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, F, E, c->seed + 2, &row, &w2), out);
    if (rank == 0) {
        note_layout(r->layout[L_W1], w1);
        note_layout(r->layout[L_W2], w2);
    }

    /* One warm-up step, then the timed ones. */
    dt_comm *world = dt_context_comm(ctx);
    for (int it = -1; it < c->iters; it++) {
        dt_tensor_destroy(y);
        y = NULL;
        DT_TRY_GOTO(st, dt_comm_barrier(world), out);
        const double t0 = ex_now_s();
        DT_TRY_GOTO(st, mlp_step(x, w1, w2, c->sp, &y, rank == 0 ? r->layout : NULL), out);
        DT_TRY_GOTO(st, dt_comm_barrier(world), out);
        if (rank == 0 && it >= 0) r->step_s[it] = ex_now_s() - t0;
    }

    DT_TRY_GOTO(st, dt_tensor_gather(y, 0, &yg), out);
    if (rank == 0) {
        DT_TRY_GOTO(st, ex_to_host_f32(yg, &r->y), out);
        r->backend = dt_context_backend(ctx);
    }
out:
    dt_tensor_destroy(yg);
    dt_tensor_destroy(y);
    dt_tensor_destroy(w2);
    dt_tensor_destroy(w1);
    dt_tensor_destroy(x);
    dt_mesh_destroy(mesh);
    return st;
}

/* ------------------------------------------------------------------------
 * The one-rank reference, in double, from the same (seed, index) recipe.
 * ---------------------------------------------------------------------- */

static double stored(dt_dtype dtype, float v) {
    return (double)dt_value_round(v, dtype);
}

/* Y = GELU(X W1) W2 in double. Returns NULL when out of memory. */
static double *reference(const config *c) {
    const int64_t M = c->batch * c->seq, E = c->embed, F = 4 * c->embed;
    const double s1 = ex_weight_scale(E), s2 = ex_weight_scale(F);
    double *x = malloc((size_t)(M * E) * sizeof *x), *w1 = malloc((size_t)(E * F) * sizeof *w1);
    double *w2 = malloc((size_t)(F * E) * sizeof *w2), *g = malloc((size_t)F * sizeof *g);
    double *y = malloc((size_t)(M * E) * sizeof *y);
    if (!x || !w1 || !w2 || !g || !y) {
        free(y);
        y = NULL;
        goto out;
    }
    for (int64_t i = 0; i < M * E; i++) x[i] = stored(c->dtype, dt_random_value(c->seed, (uint64_t)i));
    for (int64_t i = 0; i < E * F; i++) {
        w1[i] = s1 * stored(c->dtype, dt_random_value(c->seed + 1, (uint64_t)i));
        w2[i] = s2 * stored(c->dtype, dt_random_value(c->seed + 2, (uint64_t)i));
    }
    for (int64_t m = 0; m < M; m++) { /* a row at a time: g holds one row of G */
        ex_ref_matmul(x + m * E, w1, 1, E, F, g);
        ex_ref_gelu(g, F);
        ex_ref_matmul(g, w2, 1, F, E, y + m * E);
    }
out:
    free(x);
    free(w1);
    free(w2);
    free(g);
    return y;
}

/* ------------------------------------------------------------------------
 * Flags.
 * ---------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: " NAME " [flags]\n"
            "  --ranks P          ranks (threads of this process), 1..%d, default 4\n"
            "  --batch B          batch, default 2\n"
            "  --seq S            tokens (a multiple of P with --sp), default 64\n"
            "  --embed E          hidden size; the MLP is E -> 4E -> E, 4E a multiple of P;\n"
            "                     default 256\n"
            "  --dtype T          fp32 | bf16 | fp16, default fp32\n"
            "  --backend K        auto | cpu | cuda, default auto (DT_BACKEND, else the best built)\n"
            "  --seed N           X from seed N, W1 from N+1, W2 from N+2, default 1\n"
            "  --sp               sequence parallel (Megatron): X sharded on S, all-gather before\n"
            "                     the MLP, reduce-scatter after it\n"
            "  --iters N          timed steps (the median is printed), 1..%d, default 10\n"
            "  --help             this text\n"
            "exit status: 0 PASS, 1 FAIL or a library error, 2 bad flags or shapes,\n"
            "3 not supported here (--backend cuda without a CUDA build or a GPU)\n",
            MAX_RANKS, MAX_ITERS);
}

/* Parses argv into c; returns -1 to go on, else the exit status. */
static int parse_flags(int argc, char **argv, config *c) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--sp")) {
            c->sp = 1;
            continue;
        } else if (!strcmp(a, "--ranks")) {
            if (!ex_parse_int(a, v, 1, MAX_RANKS, &x)) return 2;
            c->ranks = (int)x;
        } else if (!strcmp(a, "--batch")) {
            if (!ex_parse_int(a, v, 1, 1 << 16, &x)) return 2;
            c->batch = x;
        } else if (!strcmp(a, "--seq")) {
            if (!ex_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            c->seq = x;
        } else if (!strcmp(a, "--embed")) {
            if (!ex_parse_int(a, v, 1, 1 << 16, &x)) return 2;
            c->embed = x;
        } else if (!strcmp(a, "--iters")) {
            if (!ex_parse_int(a, v, 1, MAX_ITERS, &x)) return 2;
            c->iters = (int)x;
        } else if (!strcmp(a, "--dtype")) {
            if (!ex_parse_dtype(a, v, &c->dtype)) return 2;
        } else if (!strcmp(a, "--backend")) {
            if (!ex_parse_backend(a, v, &c->backend)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!ex_parse_seed(v, &c->seed)) return 2;
        } else {
            fprintf(stderr, NAME ": unknown flag '%s' (--help lists them)\n", a);
            return 2;
        }
        i++; /* the flag's value */
    }
    if ((4 * c->embed) % c->ranks) {
        fprintf(stderr, NAME ": the hidden size 4E = %lld is not divisible by --ranks %d "
                "(W1 is split by columns, W2 by rows)\n", (long long)(4 * c->embed), c->ranks);
        return 2;
    }
    if (c->sp && c->seq % c->ranks) {
        fprintf(stderr, NAME ": --sp shards the sequence: --seq %lld is not divisible by --ranks %d\n",
                (long long)c->seq, c->ranks);
        return 2;
    }
    /* The double reference costs B*S*E*4E*2 multiply-adds. */
    double work = (double)c->batch * (double)c->seq * (double)c->embed * (double)c->embed * 8.0;
    if (work > 4e10) {
        fprintf(stderr, NAME ": B*S*E*4E*2 = %.3g multiply-adds is more than the double-precision "
                "check should take here (4e10); use bench/mlp for large shapes\n", work);
        return 2;
    }
    return -1;
}

static void print_bytes(const char *label, double bytes) {
    if (bytes >= 1 << 20)
        printf("%s%.2f MiB", label, bytes / (1 << 20));
    else if (bytes >= 1 << 10)
        printf("%s%.1f KiB", label, bytes / (1 << 10));
    else
        printf("%s%.0f B", label, bytes);
}

int main(int argc, char **argv) {
    config c = {
        .ranks = 4, .sp = 0, .iters = 10, .batch = 2, .seq = 64, .embed = 256,
        .dtype = DT_F32, .backend = DT_BACKEND_AUTO, .seed = 1,
    };
    int rc = parse_flags(argc, argv, &c);
    if (rc >= 0) return rc;
    const int P = c.ranks;
    const int64_t B = c.batch, S = c.seq, E = c.embed, F = 4 * c.embed, M = B * S;
    const double es = (double)dt_dtype_size(c.dtype);

    printf(NAME ": Y = GELU(X W1) W2, X [%lld, %lld, %lld], W1 [%lld, %lld], W2 [%lld, %lld], %s,\n"
           "  %d ranks (threads of this process), mode: %s\n",
           (long long)B, (long long)S, (long long)E, (long long)E, (long long)F, (long long)F,
           (long long)E, dt_dtype_name(c.dtype), P,
           c.sp ? "sequence parallel (--sp)" : "tensor parallel");
    fflush(stdout);

    run *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, NAME ": out of memory\n");
        return 1;
    }
    r->cfg = &c;
    dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
    lo.backend = c.backend;
    dt_status st = dt_launch(P, rank_mlp, r, &lo);
    if (st != DT_SUCCESS) {
        fprintf(stderr, NAME ": %s: %s\n", dt_status_name(st), dt_last_error());
        free(r->y);
        free(r);
        return st == DT_ERR_NOT_SUPPORTED ? 3 : 1;
    }

    printf("\nlayouts on a mesh of %d (\"tp\"), as dt_tensor_layout reports them on rank 0:\n", P);
    printf("  W1 %s (column-parallel), W2 %s (row-parallel), sharded once from rank 0\n",
           r->layout[L_W1], r->layout[L_W2]);
    if (c.sp)
        printf("  X %s -> all-gather -> %s\n", r->layout[L_X], r->layout[L_XFULL]);
    else
        printf("  X %s\n", r->layout[L_X]);
    printf("  H = X @ W1 %s -> G = GELU(H) %s -> Y = G @ W2 %s -> %s -> %s\n", r->layout[L_H],
           r->layout[L_G], r->layout[L_Y], c.sp ? "reduce-scatter" : "all-reduce",
           r->layout[L_OUT]);

    /* Communication per step, from the shapes: an all-reduce of n elements
     * sends 2(P-1)/P * n per rank on a ring; an all-gather or a
     * reduce-scatter with n elements in total sends (P-1)/P * n. */
    const double act = (double)M * (double)E * es; /* one [B, S, E] activation */
    const double ring = P > 1 ? (double)(P - 1) / P : 0.0;
    printf("\ncommunication per step (computed from the shapes; ring algorithms):\n");
    if (c.sp) {
        printf("  2 calls: all-gather of X and reduce-scatter of Y, [%lld, %lld, %lld] %s each",
               (long long)B, (long long)S, (long long)E, dt_dtype_name(c.dtype));
        print_bytes(" (", act);
        printf(")\n");
    } else {
        printf("  1 call: all-reduce of Y, [%lld, %lld, %lld] %s", (long long)B, (long long)S,
               (long long)E, dt_dtype_name(c.dtype));
        print_bytes(" (", act);
        printf(")\n");
    }
    print_bytes("  sent per rank: 2(P-1)/P x ", act);
    print_bytes(" = ", 2.0 * ring * act);
    printf(" (the same in both modes)\n");
    print_bytes("  X and Y held per rank: ", c.sp ? act / P : act);
    printf(" each%s\n", c.sp ? " (1/P of the tensor-parallel mode)" : "");
    print_bytes("  once, at setup: W1 and W2 scattered from rank 0, ", 2.0 * ring * (double)E * F * es);
    printf(" sent\n");

    double sorted[MAX_ITERS];
    memcpy(sorted, r->step_s, (size_t)c.iters * sizeof *sorted);
    const double med = ex_median(sorted, c.iters); /* sorts: [0] min, [iters - 1] max */
    const double flops = 4.0 * (double)M * (double)E * (double)F;
    printf("\ntime per step on the %s backend: median %.3f ms of %d (min %.3f, max %.3f);"
           " matmuls %.2f GFLOP/s\n", dt_backend_kind_name(r->backend), 1e3 * med, c.iters,
           1e3 * sorted[0], 1e3 * sorted[c.iters - 1], flops / med * 1e-9);

    double *ref = reference(&c);
    if (!ref) {
        fprintf(stderr, NAME ": out of memory for the reference\n");
        free(r->y);
        free(r);
        return 1;
    }
    /* fp32: accumulation order only. bf16: inputs are the same bf16 values
     * in both, but H, G and each summand of Y are rounded to bf16 (2^-9
     * relative) on the way; fp16 the same, eight times finer (2^-12). The
     * bounds of tests/test_mlp.c and TUTORIAL.md. */
    const double atol = c.dtype == DT_F32 ? 1e-5 : c.dtype == DT_F16 ? 3e-3 : 2e-2;
    const double rtol = c.dtype == DT_F32 ? 1e-4 : c.dtype == DT_F16 ? 3e-3 : 2e-2;
    const ex_check chk = ex_check_result(r->y, ref, M * E, atol, rtol);
    printf("max |Y - Y_ref| = %.3g against a one-rank MLP in double precision (rms of Y_ref %.3g)\n"
           "  tolerance %g + %g*|ref|: %ld of %lld outside, worst error/tolerance %.3f\n",
           chk.max_err, sqrt(chk.ref_ss / (double)(M * E)), atol, rtol, chk.bad,
           (long long)(M * E), chk.worst);
    printf("result: %s\n", chk.bad ? "FAIL" : "PASS");
    free(ref);
    free(r->y);
    free(r);
    return chk.bad ? 1 : 0;
}
