/* bench/mlp.c — the tensor-parallel MLP, Y = GELU(X W1) W2 (X [B, S, E],
 * W1 [E, 4E], W2 [4E, E]), for docs/PERFORMANCE.md.
 *
 * For each mode (tp: X replicated, all-reduce after; sp: X sharded on S,
 * all-gather before and reduce-scatter after) and each rank count P it
 * MEASURES, over --iters steps after one warm-up (medians reported):
 *   step     the whole step, barrier to barrier: the slowest rank's time;
 *   matmul   the two dt_matmul calls, timed on every rank; the slowest rank;
 *   gelu     dt_gelu (erf) on the slowest rank;
 *   comm     the redistributes (all-reduce, or all-gather + reduce-scatter)
 *            on the slowest rank, waiting for peers included;
 * and derives GFLOP/s = 4*B*S*E*4E flops (both matmuls, the whole global
 * problem) / time. The baseline is the same two GEMMs on one rank without
 * the library: plain cblas_sgemm on [B*S, E] x [E, 4E] and [B*S, 4E] x
 * [4E, E], with OpenBLAS on 1 thread and on every core.
 * COMPUTED from the shapes: the communication per step (bytes each rank
 * sends on a ring: 2(P-1)/P of one [B, S, E] activation in both modes).
 *
 * Ranks are threads of this process (dt_launch); each runs OpenBLAS on one
 * thread (the bench sets that before every launch, also for P = 1, so the
 * library rows compare with the 1-thread baseline). On a machine with fewer
 * cores than ranks the ranks share the cores: on a 2-core CPU, P = 4 runs
 * four ranks on 2 cores, and the table says so.
 *
 * Run: build/bench/mlp [--quick] [--iters N] [--batch B] [--seq S]
 *      [--embed E] [--ranks 1,2,4] [--backend auto|cpu|cuda]
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtensor/dtensor.h"

#define MAX_ITERS 1000
#define MAX_P 16
#define NAME "bench/mlp"

#include "examples/example_util.h" /* ex_now_s, ex_median, ex_parse_int */

typedef struct opts {
    int quick, iters, n_ranks, ranks[MAX_P];
    int64_t batch, seq, embed;
    dt_backend_kind backend;
} opts;

typedef struct result {
    const opts *o;
    int P, sp;
    /* per iteration, per rank; reduced by the main thread */
    double step_s[MAX_ITERS];                /* rank 0, barrier to barrier */
    double mm_s[MAX_P][MAX_ITERS];           /* each rank's two dt_matmul calls */
    double gelu_s[MAX_P][MAX_ITERS];         /* each rank's dt_gelu */
    double comm_s[MAX_P][MAX_ITERS];         /* each rank's redistributes */
    dt_backend_kind backend;
} result;

static dt_status rank_bench(dt_context *ctx, void *arg) {
    result *r = arg;
    const opts *o = r->o;
    const int rank = dt_context_rank(ctx);
    const int64_t E = o->embed, F = 4 * o->embed;
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *w1f = NULL, *w2f = NULL, *w1 = NULL, *w2 = NULL;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &r->P, NULL, &mesh), out);
    const dt_layout rep = dt_layout_1d(dt_replicate());
    const dt_layout seq = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout col = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    const dt_layout row = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    const int64_t xs[3] = {o->batch, o->seq, E}, w1s[2] = {E, F}, w2s[2] = {F, E};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_F32, 3, xs, r->sp ? &seq : &rep, &x), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, 1), out);
    if (rank == 0) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 2, w1s, NULL, &w1f), out);
        DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 2, w2s, NULL, &w2f), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(w1f, 2), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(w2f, 3), out);
    }
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, w1f, &col, &w1), out);
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, w2f, &row, &w2), out);

    dt_comm *world = dt_context_comm(ctx);
    for (int it = -1; it < o->iters; it++) {
        dt_tensor *xr = NULL, *h = NULL, *g = NULL, *yp = NULL, *y = NULL;
        DT_TRY_GOTO(st, dt_comm_barrier(world), step_out);
        const double t0 = ex_now_s();
        if (r->sp) DT_TRY_GOTO(st, dt_tensor_redistribute(x, &rep, &xr), step_out);
        const double m0 = ex_now_s();
        DT_TRY_GOTO(st, dt_matmul(r->sp ? xr : x, w1, &h), step_out);
        const double m1 = ex_now_s();
        DT_TRY_GOTO(st, dt_gelu(h, DT_GELU_ERF, &g), step_out);
        const double m2 = ex_now_s();
        DT_TRY_GOTO(st, dt_matmul(g, w2, &yp), step_out);
        const double m3 = ex_now_s();
        DT_TRY_GOTO(st, dt_tensor_redistribute(yp, r->sp ? &seq : &rep, &y), step_out);
        const double m4 = ex_now_s();
        DT_TRY_GOTO(st, dt_comm_barrier(world), step_out);
        if (it >= 0) {
            if (rank == 0) r->step_s[it] = ex_now_s() - t0;
            r->mm_s[rank][it] = (m1 - m0) + (m3 - m2);
            r->gelu_s[rank][it] = m2 - m1;
            r->comm_s[rank][it] = (m0 - t0) + (m4 - m3);
        }
    step_out:
        dt_tensor_destroy(y);
        dt_tensor_destroy(yp);
        dt_tensor_destroy(g);
        dt_tensor_destroy(h);
        dt_tensor_destroy(xr);
        if (st != DT_SUCCESS) goto out;
    }
    if (rank == 0) r->backend = dt_context_backend(ctx);
out:
    dt_tensor_destroy(w2);
    dt_tensor_destroy(w1);
    dt_tensor_destroy(w2f);
    dt_tensor_destroy(w1f);
    dt_tensor_destroy(x);
    dt_mesh_destroy(mesh);
    return st;
}

/* The two GEMMs with plain cblas_sgemm on `threads` OpenBLAS threads:
 * the median time of --iters runs after one warm-up; 0 if out of memory. */
static double sgemm_baseline(const opts *o, int threads) {
    const int M = (int)(o->batch * o->seq), E = (int)o->embed, F = 4 * (int)o->embed;
    float *x = malloc((size_t)M * E * sizeof *x), *w1 = malloc((size_t)E * F * sizeof *w1);
    float *w2 = malloc((size_t)F * E * sizeof *w2), *h = malloc((size_t)M * F * sizeof *h);
    float *y = malloc((size_t)M * E * sizeof *y);
    double t[MAX_ITERS], med = 0;
    if (x && w1 && w2 && h && y) {
        for (int64_t i = 0; i < (int64_t)M * E; i++) x[i] = dt_random_value(1, (uint64_t)i);
        for (int64_t i = 0; i < (int64_t)E * F; i++) {
            w1[i] = dt_random_value(2, (uint64_t)i);
            w2[i] = dt_random_value(3, (uint64_t)i);
        }
        openblas_set_num_threads(threads);
        for (int it = -1; it < o->iters; it++) {
            const double t0 = ex_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, F, E, 1.0f, x, E, w1, F,
                        0.0f, h, F);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, E, F, 1.0f, h, F, w2, E,
                        0.0f, y, E);
            if (it >= 0) t[it] = ex_now_s() - t0;
        }
        med = ex_median(t, o->iters);
    }
    free(x);
    free(w1);
    free(w2);
    free(h);
    free(y);
    return med;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: " NAME " [flags]\n"
            "  --quick           a smoke run: small shapes, 3 iterations, P = 1, 2\n"
            "  --iters N         timed steps per row (median), default 20\n"
            "  --batch B --seq S --embed E   X [B, S, E], default 4, 256, 512\n"
            "  --ranks LIST      comma-separated rank counts, default 1,2,4\n"
            "  --backend K       auto | cpu | cuda, default auto\n");
}

static int parse(int argc, char **argv, opts *o) {
    int iters_set = 0, ranks_set = 0, shape_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quick")) {
            o->quick = 1;
            continue;
        } else if (!strcmp(a, "--iters")) {
            if (!ex_parse_int(a, v, 1, MAX_ITERS, &x)) return 2;
            o->iters = (int)x, iters_set = 1;
        } else if (!strcmp(a, "--batch")) {
            if (!ex_parse_int(a, v, 1, 1 << 16, &x)) return 2;
            o->batch = x, shape_set = 1;
        } else if (!strcmp(a, "--seq")) {
            if (!ex_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            o->seq = x, shape_set = 1;
        } else if (!strcmp(a, "--embed")) {
            if (!ex_parse_int(a, v, 1, 1 << 15, &x)) return 2;
            o->embed = x, shape_set = 1;
        } else if (!strcmp(a, "--backend")) {
            if (v && !strcmp(v, "auto")) o->backend = DT_BACKEND_AUTO;
            else if (v && !strcmp(v, "cpu")) o->backend = DT_BACKEND_CPU;
            else if (v && !strcmp(v, "cuda")) o->backend = DT_BACKEND_CUDA;
            else {
                fprintf(stderr, NAME ": --backend takes auto, cpu or cuda, got '%s'\n",
                        v ? v : "(nothing)");
                return 2;
            }
        } else if (!strcmp(a, "--ranks")) {
            o->n_ranks = 0, ranks_set = 1;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v ? v : "");
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (o->n_ranks == MAX_P || !ex_parse_int(a, tok, 1, MAX_P, &x)) return 2;
                o->ranks[o->n_ranks++] = (int)x;
            }
            if (o->n_ranks == 0) {
                fprintf(stderr, NAME ": --ranks takes a list such as 1,2,4\n");
                return 2;
            }
        } else {
            fprintf(stderr, NAME ": unknown flag '%s' (--help lists them)\n", a);
            return 2;
        }
        i++;
    }
    if (o->quick) {
        if (!iters_set) o->iters = 3;
        if (!shape_set) o->batch = 1, o->seq = 64, o->embed = 128;
        if (!ranks_set) o->n_ranks = 2;
    }
    for (int i = 0; i < o->n_ranks; i++)
        if ((4 * o->embed) % o->ranks[i] || o->seq % o->ranks[i]) {
            fprintf(stderr, NAME ": P = %d must divide --seq %lld and 4E = %lld\n", o->ranks[i],
                    (long long)o->seq, (long long)(4 * o->embed));
            return 2;
        }
    return -1;
}

int main(int argc, char **argv) {
    opts o = {.quick = 0, .iters = 20, .n_ranks = 3, .ranks = {1, 2, 4}, .batch = 4, .seq = 256,
              .embed = 512, .backend = DT_BACKEND_AUTO};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int64_t M = o.batch * o.seq, E = o.embed, F = 4 * o.embed;
    const double flops = 4.0 * (double)M * (double)E * (double)F;
    const double act = (double)M * (double)E * 4.0; /* one [B, S, E] fp32 activation */

    printf(NAME ": Y = GELU(X W1) W2, X [%lld, %lld, %lld], W1 [%lld, %lld], W2 [%lld, %lld], fp32;"
           " %.3f GFLOP per step\n", (long long)o.batch, (long long)o.seq, (long long)E,
           (long long)E, (long long)F, (long long)F, (long long)E, flops * 1e-9);
    printf("%ld CPU cores online; ranks are threads with one OpenBLAS thread each, so P ranks"
           " share %ld cores%s\n", cores, cores,
           cores <= 2 ? " (on a 2-core CPU the ranks share 2 cores: P > 2 cannot go faster)" : "");
    FILE *la = fopen("/proc/loadavg", "r");
    double load = -1;
    if (la) {
        if (fscanf(la, "%lf", &load) != 1) load = -1;
        fclose(la);
    }
    printf("medians of %d steps after one warm-up%s", o.iters, o.quick ? " (--quick)" : "");
    if (load >= 0) printf("; load average %.2f at the start (other work skews the times)", load);
    printf("\n\n");

    const double b1 = sgemm_baseline(&o, 1);
    const double bn = sgemm_baseline(&o, (int)(cores > 0 ? cores : 1));
    if (b1 <= 0 || bn <= 0) {
        fprintf(stderr, NAME ": out of memory for the baseline\n");
        return 1;
    }
    printf("%-32s %3s %9s %8s %10s %8s %8s %8s %10s %8s\n", "what", "P", "step ms", "GFLOP/s",
           "matmul ms", "GFLOP/s", "gelu ms", "comm ms", "sent/rank", "vs sgemm");
    printf("%-32s %3d %9s %8s %10.3f %8.2f %8s %8s %10s %8s\n", "cblas_sgemm x2, 1 thread", 1, "-",
           "-", 1e3 * b1, flops / b1 * 1e-9, "-", "-", "-", "1.00");
    printf("%-32s %3ld %9s %8s %10.3f %8.2f %8s %8s %10s %8.2f\n", "cblas_sgemm x2, all cores",
           cores, "-", "-", 1e3 * bn, flops / bn * 1e-9, "-", "-", "-", b1 / bn);

    result *r = calloc(1, sizeof *r);
    if (!r) return 1;
    for (int sp = 0; sp < 2; sp++)
        for (int i = 0; i < o.n_ranks; i++) {
            memset(r, 0, sizeof *r);
            r->o = &o;
            r->P = o.ranks[i];
            r->sp = sp;
            openblas_set_num_threads(1);
            dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
            lo.backend = o.backend;
            dt_status st = dt_launch(r->P, rank_bench, r, &lo);
            if (st != DT_SUCCESS) {
                fprintf(stderr, NAME ": %s: %s\n", dt_status_name(st), dt_last_error());
                free(r);
                return st == DT_ERR_NOT_SUPPORTED ? 3 : 1;
            }
            double mm[MAX_ITERS], ge[MAX_ITERS], cm[MAX_ITERS];
            for (int it = 0; it < o.iters; it++) {
                mm[it] = ge[it] = cm[it] = 0;
                for (int k = 0; k < r->P; k++) {
                    mm[it] = fmax(mm[it], r->mm_s[k][it]);
                    ge[it] = fmax(ge[it], r->gelu_s[k][it]);
                    cm[it] = fmax(cm[it], r->comm_s[k][it]);
                }
            }
            const double step = ex_median(r->step_s, o.iters), mmed = ex_median(mm, o.iters);
            const double gmed = ex_median(ge, o.iters), cmed = ex_median(cm, o.iters);
            const double sent = r->P > 1 ? 2.0 * (r->P - 1) / r->P * act : 0.0;
            char what[64], sent_s[32];
            snprintf(what, sizeof what, "dt MLP %s%s", sp ? "sp (AG+RS)" : "tp (AR)",
                     r->P > cores ? ", cores shared" : "");
            if (sent >= 1 << 20) snprintf(sent_s, sizeof sent_s, "%.2f MiB", sent / (1 << 20));
            else snprintf(sent_s, sizeof sent_s, "%.1f KiB", sent / (1 << 10));
            printf("%-32s %3d %9.3f %8.2f %10.3f %8.2f %8.3f %8.3f %10s %8.2f\n", what, r->P,
                   1e3 * step, flops / step * 1e-9, 1e3 * mmed, flops / mmed * 1e-9, 1e3 * gmed,
                   1e3 * cmed, sent_s, b1 / step);
            fflush(stdout);
        }
    printf("\nstep: barrier to barrier on rank 0 (the slowest rank sets it); matmul, gelu, comm: "
           "on the slowest rank\n(comm includes waiting for peers); GFLOP/s: the whole problem's "
           "%.3f GFLOP over that time;\nvs sgemm: 1-thread cblas_sgemm time / step time; "
           "sent/rank: computed, 2(P-1)/P x %.1f KiB per step\non a ring in both modes (the local "
           "transport copies through memory)\n", flops * 1e-9, act / 1024);
    free(r);
    return 0;
}
