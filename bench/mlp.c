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
 * problem) / time. Every timestamp is taken after the rank's device work
 * is done (the backend's sync: a no-op on the CPU; on CUDA the library's
 * calls only enqueue). The baseline is the same two GEMMs on one rank
 * without the library: on the CPU plain cblas_sgemm on [B*S, E] x [E, 4E]
 * and [B*S, 4E] x [4E, E], with OpenBLAS on 1 thread and on every core; on
 * CUDA cublasGemmEx in the same dtype with fp32 accumulation, timed with
 * CUDA events. "vs base" is the baseline's matmul time over the library's:
 * issue 6 asks for at least 0.9 on a GPU at P = 1.
 * COMPUTED from the shapes: the communication per step (bytes each rank
 * sends on a ring: 2(P-1)/P of one [B, S, E] activation in both modes).
 *
 * Ranks are threads of this process (dt_launch). On the CPU each runs
 * OpenBLAS on one thread (the bench sets that before every launch, also for
 * P = 1, so the library rows compare with the 1-thread baseline); on a
 * machine with fewer cores than ranks the ranks share the cores, and the
 * table says so. On one GPU the ranks share it (cuda+local).
 *
 * Defaults: X [4, 256, 512] fp32 on the CPU; X [4, 2048, 4096] bf16 on a GPU.
 *
 * Run: build/bench/mlp [--quick] [--iters N] [--batch B] [--seq S]
 *      [--embed E] [--ranks 1,2,4] [--dtype fp32|bf16|fp16]
 *      [--backend auto|cpu|cuda]
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtensor/context_internal.h"
#include "dtensor/dtensor.h"

#ifdef DT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

#define MAX_ITERS 1000
#define MAX_P 16
#define NAME "bench/mlp"

#include "examples/example_util.h" /* ex_now_s, ex_median, ex_parse_int */

typedef struct opts {
    int quick, iters, n_ranks, ranks[MAX_P];
    int64_t batch, seq, embed;
    dt_backend_kind backend;
    dt_dtype dtype;
    int iters_set, ranks_set, shape_set, dtype_set;
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

/* The time once this rank's device work is done (CPU: at once). */
static dt_status now_done(dt_backend *be, double *t) {
    DT_TRY(be->ops->sync(be));
    *t = ex_now_s();
    return DT_SUCCESS;
}

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
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, o->dtype, 3, xs, r->sp ? &seq : &rep, &x), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, 1), out);
    if (rank == 0) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, o->dtype, 2, w1s, NULL, &w1f), out);
        DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, o->dtype, 2, w2s, NULL, &w2f), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(w1f, 2), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(w2f, 3), out);
    }
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, w1f, &col, &w1), out);
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, w2f, &row, &w2), out);

    dt_comm *world = dt_context_comm(ctx);
    dt_backend *be = ctx->backend;
    for (int it = -1; it < o->iters; it++) {
        dt_tensor *xr = NULL, *h = NULL, *g = NULL, *yp = NULL, *y = NULL;
        double t0, m0, m1, m2, m3, m4;
        DT_TRY_GOTO(st, dt_comm_barrier(world), step_out);
        DT_TRY_GOTO(st, now_done(be, &t0), step_out);
        if (r->sp) DT_TRY_GOTO(st, dt_tensor_redistribute(x, &rep, &xr), step_out);
        DT_TRY_GOTO(st, now_done(be, &m0), step_out);
        DT_TRY_GOTO(st, dt_matmul(r->sp ? xr : x, w1, &h), step_out);
        DT_TRY_GOTO(st, now_done(be, &m1), step_out);
        DT_TRY_GOTO(st, dt_gelu(h, DT_GELU_ERF, &g), step_out);
        DT_TRY_GOTO(st, now_done(be, &m2), step_out);
        DT_TRY_GOTO(st, dt_matmul(g, w2, &yp), step_out);
        DT_TRY_GOTO(st, now_done(be, &m3), step_out);
        DT_TRY_GOTO(st, dt_tensor_redistribute(yp, r->sp ? &seq : &rep, &y), step_out);
        DT_TRY_GOTO(st, now_done(be, &m4), step_out);
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

#ifdef DT_HAVE_CUDA
/* The two GEMMs with cublasGemmEx on GPU 0, in o->dtype with fp32
 * accumulation (no TF32 for fp32, as the library's default), row-major
 * through the column-major identity C^T = B^T A^T: the median time of
 * --iters runs after one warm-up, from CUDA events. 0 (and why) on error. */
static double cublas_baseline(const opts *o, char *why, size_t why_size) {
    const int M = (int)(o->batch * o->seq), E = (int)o->embed, F = 4 * (int)o->embed;
    const size_t es = dt_dtype_size(o->dtype);
    const cudaDataType_t t = o->dtype == DT_F32    ? CUDA_R_32F
                             : o->dtype == DT_BF16 ? CUDA_R_16BF
                                                   : CUDA_R_16F;
    const size_t n[5] = {(size_t)M * E, (size_t)E * F, (size_t)F * E, (size_t)M * F,
                         (size_t)M * E};   /* x, w1, w2, h, y */
    void *d[5] = {NULL};
    cublasHandle_t hd = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double tm[MAX_ITERS], med = 0;
    const float alpha = 1.0f, beta = 0.0f;
    const char *fail = NULL;
    if (cudaSetDevice(0) != cudaSuccess) fail = "cudaSetDevice(0)";
    for (int i = 0; !fail && i < 5; i++)
        if (cudaMalloc(&d[i], n[i] * es) != cudaSuccess) fail = "cudaMalloc";
    for (int i = 0; !fail && i < 3; i++) {   /* x, w1, w2: fill_random's values */
        void *host = malloc(n[i] * es);
        if (!host) fail = "malloc";
        for (size_t k = 0; host && k < n[i]; k++)
            dt_value_set(host, o->dtype, k, dt_random_value((uint64_t)i + 1, k));
        if (host && cudaMemcpy(d[i], host, n[i] * es, cudaMemcpyHostToDevice) != cudaSuccess)
            fail = "cudaMemcpy";
        free(host);
    }
    if (!fail && cublasCreate(&hd) != CUBLAS_STATUS_SUCCESS) fail = "cublasCreate";
    if (!fail && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess))
        fail = "cudaEventCreate";
    for (int it = -1; !fail && it < o->iters; it++) {
        float ms = 0;
        if (cudaEventRecord(e0, 0) != cudaSuccess ||
            cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, F, M, E, &alpha, d[1], t, F, d[0], t, E,
                         &beta, d[3], t, F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, E, M, F, &alpha, d[2], t, E, d[3], t, F,
                         &beta, d[4], t, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
                CUBLAS_STATUS_SUCCESS ||
            cudaEventRecord(e1, 0) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            fail = "cublasGemmEx";
        else if (it >= 0)
            tm[it] = 1e-3 * ms;
    }
    if (!fail) med = ex_median(tm, o->iters);
    else snprintf(why, why_size, "%s failed", fail);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (hd) cublasDestroy(hd);
    for (int i = 0; i < 5; i++)
        if (d[i]) cudaFree(d[i]);
    return med;
}
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: " NAME " [flags]\n"
            "  --quick           a smoke run: small shapes, 3 iterations, P = 1, 2\n"
            "  --iters N         timed steps per row (median), default 20\n"
            "  --batch B --seq S --embed E   X [B, S, E], default 4, 256, 512 on the CPU,\n"
            "                    4, 2048, 4096 on a GPU\n"
            "  --ranks LIST      comma-separated rank counts, default 1,2,4\n"
            "  --dtype T         fp32 | bf16 | fp16, default fp32 on the CPU, bf16 on a GPU\n"
            "  --backend K       auto | cpu | cuda, default auto\n");
}

static int parse(int argc, char **argv, opts *o) {
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
            o->iters = (int)x, o->iters_set = 1;
        } else if (!strcmp(a, "--batch")) {
            if (!ex_parse_int(a, v, 1, 1 << 16, &x)) return 2;
            o->batch = x, o->shape_set = 1;
        } else if (!strcmp(a, "--seq")) {
            if (!ex_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            o->seq = x, o->shape_set = 1;
        } else if (!strcmp(a, "--embed")) {
            if (!ex_parse_int(a, v, 1, 1 << 15, &x)) return 2;
            o->embed = x, o->shape_set = 1;
        } else if (!strcmp(a, "--dtype")) {
            if (!ex_parse_dtype(a, v, &o->dtype)) return 2;
            o->dtype_set = 1;
        } else if (!strcmp(a, "--backend")) {
            if (!ex_parse_backend(a, v, &o->backend)) return 2;
        } else if (!strcmp(a, "--ranks")) {
            long r[MAX_P];
            if (!ex_parse_ints(a, v, 1, MAX_P, MAX_P, r, &o->n_ranks)) return 2;
            for (int k = 0; k < o->n_ranks; k++) o->ranks[k] = (int)r[k];
            o->ranks_set = 1;
        } else {
            fprintf(stderr, NAME ": unknown flag '%s' (--help lists them)\n", a);
            return 2;
        }
        i++;
    }
    return -1;
}

/* Defaults that depend on the backend, then the shape check. */
static int finish_opts(opts *o, dt_backend_kind backend) {
    const int gpu = backend == DT_BACKEND_CUDA;
    if (!o->dtype_set) o->dtype = gpu ? DT_BF16 : DT_F32;
    if (!o->shape_set && gpu) o->batch = 4, o->seq = 2048, o->embed = 4096;
    if (o->quick) {
        if (!o->iters_set) o->iters = 3;
        if (!o->shape_set) o->batch = 1, o->seq = 64, o->embed = 128;
        if (!o->ranks_set) o->n_ranks = 2;
    }
    if (o->batch * o->seq > INT_MAX) { /* the baselines' gemms take int sizes */
        fprintf(stderr, NAME ": --batch %lld x --seq %lld = %lld rows, more than %d\n",
                (long long)o->batch, (long long)o->seq, (long long)(o->batch * o->seq), INT_MAX);
        return 2;
    }
    for (int i = 0; i < o->n_ranks; i++)
        if ((4 * o->embed) % o->ranks[i] || o->seq % o->ranks[i]) {
            fprintf(stderr, NAME ": P = %d must divide --seq %lld and 4E = %lld\n", o->ranks[i],
                    (long long)o->seq, (long long)(4 * o->embed));
            return 2;
        }
    return -1;
}

static dt_status probe_rank(dt_context *ctx, void *arg) {
    *(dt_backend_kind *)arg = dt_context_backend(ctx);
    return DT_SUCCESS;
}

int main(int argc, char **argv) {
    opts o = {.quick = 0, .iters = 20, .n_ranks = 3, .ranks = {1, 2, 4}, .batch = 4, .seq = 256,
              .embed = 512, .backend = DT_BACKEND_AUTO, .dtype = DT_F32};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
    lo.backend = o.backend;
    dt_backend_kind kind = DT_BACKEND_AUTO;
    dt_status st = dt_launch(1, probe_rank, &kind, &lo);
    if (st != DT_SUCCESS) {
        fprintf(stderr, NAME ": %s: %s\n", dt_status_name(st), dt_last_error());
        return st == DT_ERR_NOT_SUPPORTED ? 3 : 1;
    }
    if ((rc = finish_opts(&o, kind)) >= 0) return rc;
    const int gpu = kind == DT_BACKEND_CUDA;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int64_t M = o.batch * o.seq, E = o.embed, F = 4 * o.embed;
    const double flops = 4.0 * (double)M * (double)E * (double)F;
    /* one [B, S, E] activation */
    const double act = (double)M * (double)E * (double)dt_dtype_size(o.dtype);

    printf(NAME ": Y = GELU(X W1) W2, X [%lld, %lld, %lld], W1 [%lld, %lld], W2 [%lld, %lld], %s;"
           " %.3f GFLOP per step; backend %s\n", (long long)o.batch, (long long)o.seq,
           (long long)E, (long long)E, (long long)F, (long long)F, (long long)E,
           dt_dtype_name(o.dtype), flops * 1e-9, dt_backend_kind_name(kind));
    if (gpu)
        printf("ranks are threads sharing the GPU(s) (rank r on GPU r mod count)\n");
    else
        printf("%ld CPU cores online; ranks are threads with one OpenBLAS thread each, so P ranks"
               " share %ld cores%s\n", cores, cores,
               cores <= 2 ? " (on a 2-core CPU the ranks share 2 cores: P > 2 cannot go faster)"
                          : "");
    FILE *la = fopen("/proc/loadavg", "r");
    double load = -1;
    if (la) {
        if (fscanf(la, "%lf", &load) != 1) load = -1;
        fclose(la);
    }
    printf("medians of %d steps after one warm-up%s", o.iters, o.quick ? " (--quick)" : "");
    if (load >= 0) printf("; load average %.2f at the start (other work skews the times)", load);
    printf("\n\n");

    /* The baseline: b1 is the "vs base" reference. */
    double b1 = 0, bn = 0;
    char why[128] = "";
    if (gpu) {
#ifdef DT_HAVE_CUDA
        b1 = cublas_baseline(&o, why, sizeof why);
#endif
    } else {
        b1 = sgemm_baseline(&o, 1);
        bn = sgemm_baseline(&o, (int)(cores > 0 ? cores : 1));
        if (bn <= 0) b1 = 0, snprintf(why, sizeof why, "out of memory");
    }
    if (b1 <= 0) {
        fprintf(stderr, NAME ": the baseline failed: %s\n", why);
        return 1;
    }
    printf("%-32s %3s %9s %8s %10s %8s %8s %8s %10s %8s\n", "what", "P", "step ms", "GFLOP/s",
           "matmul ms", "GFLOP/s", "gelu ms", "comm ms", "sent/rank", "vs base");
    if (gpu) {
        printf("%-32s %3d %9s %8s %10.3f %8.2f %8s %8s %10s %8s\n", "cublasGemmEx x2", 1, "-",
               "-", 1e3 * b1, flops / b1 * 1e-9, "-", "-", "-", "1.00");
    } else {
        printf("%-32s %3d %9s %8s %10.3f %8.2f %8s %8s %10s %8s\n", "cblas_sgemm x2, 1 thread", 1,
               "-", "-", 1e3 * b1, flops / b1 * 1e-9, "-", "-", "-", "1.00");
        printf("%-32s %3ld %9s %8s %10.3f %8.2f %8s %8s %10s %8.2f\n",
               "cblas_sgemm x2, all cores", cores, "-", "-", 1e3 * bn, flops / bn * 1e-9, "-",
               "-", "-", b1 / bn);
    }

    result *r = calloc(1, sizeof *r);
    if (!r) return 1;
    for (int sp = 0; sp < 2; sp++)
        for (int i = 0; i < o.n_ranks; i++) {
            memset(r, 0, sizeof *r);
            r->o = &o;
            r->P = o.ranks[i];
            r->sp = sp;
            openblas_set_num_threads(1);
            st = dt_launch(r->P, rank_bench, r, &lo);
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
                     !gpu && r->P > cores ? ", cores shared" : "");
            if (sent >= 1 << 20) snprintf(sent_s, sizeof sent_s, "%.2f MiB", sent / (1 << 20));
            else snprintf(sent_s, sizeof sent_s, "%.1f KiB", sent / (1 << 10));
            printf("%-32s %3d %9.3f %8.2f %10.3f %8.2f %8.3f %8.3f %10s %8.2f\n", what, r->P,
                   1e3 * step, flops / step * 1e-9, 1e3 * mmed, flops / mmed * 1e-9, 1e3 * gmed,
                   1e3 * cmed, sent_s, b1 / mmed);
            fflush(stdout);
        }
    printf("\nstep: barrier to barrier on rank 0 (the slowest rank sets it); matmul, gelu, comm: "
           "on the slowest rank\n(comm includes waiting for peers); GFLOP/s: the whole problem's "
           "%.3f GFLOP over that time;\nvs base: the baseline's matmul time (%s) / the library's "
           "matmul time; sent/rank: computed,\n2(P-1)/P x %.1f KiB per step on a ring in both "
           "modes\n", flops * 1e-9, gpu ? "cublasGemmEx" : "1-thread cblas_sgemm", act / 1024);
    free(r);
    return dt_finalize() == DT_SUCCESS ? 0 : 1;
}
