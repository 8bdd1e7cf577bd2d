/* bench/ring.c — the ring rotator's step alone, for docs/PERFORMANCE.md:
 * what a ring step's transfer costs on a transport, without the attention
 * around it.
 *
 * For each block size it MEASURES, over --iters steps after one warm-up,
 * the step of a dt_ring (every rank sends its current block of that many
 * bytes to the next rank and receives the previous rank's:
 * dt_ring_start, then dt_ring_wait, then the backend's sync, after a
 * barrier) on the slowest rank: the median and the best over the steps.
 * It derives GB/s = bytes / median step (what each rank sends, and
 * receives, in a step). Nothing computes beside the transfer, so the step
 * is the transfer's whole time, not the part a ring leaves exposed.
 *
 * Ranks: --ranks P threads of this process (transport local, or nccl with
 * a GPU per rank), or --ranks 0 under mpirun, one rank per process
 * (transport mpi on the CPU, nccl with GPUs). On one GPU the ranks share
 * it (cuda+local), and a step's copies are same-device copies: --comm-ctas
 * N runs them in kernels of at most N CTAs a rank, 0 by the driver's copy
 * (dt_backend_cuda_set_comm_ctas; not given: the backend's default).
 *
 * Run: build/bench/ring [--ranks P] [--mib 1,8,32] [--iters N]
 *      [--backend auto|cpu|cuda] [--transport auto|local|mpi|nccl]
 *      [--comm-ctas N]
 *      mpirun -np 2 build/bench/ring --ranks 0
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/ring.h"
#include "dtensor/context_internal.h"
#include "dtensor/dtensor.h"
#ifdef DT_HAVE_CUDA
#include "dtensor/backend_cuda.h"
#endif

#define NAME "bench/ring"
#define MAX_SIZES 8
#define MAX_ITERS 1000
#define MAX_P 64

#include "examples/example_util.h" /* ex_now_s, ex_median, ex_parse_* */

typedef struct opts {
    int ranks, iters, n_sizes;
    int comm_ctas;   /* --comm-ctas (-1: the backend's default) */
    long mib[MAX_SIZES];
    dt_backend_kind backend;
    dt_transport_kind transport;
} opts;

typedef struct result {
    const opts *o;
    double step_s[MAX_SIZES][MAX_ITERS]; /* the slowest rank's, per step (rank 0 writes) */
    dt_backend_kind backend;
    dt_transport_kind transport;
    int world, comm_ctas;   /* rank 0's comm CTAs (CUDA), as the steps ran */
} result;

/* One size: the steps' times on this rank, then each step's slowest rank
 * (an all-gather of every rank's times) into r->step_s[k] on rank 0. */
static dt_status run_size(dt_context *ctx, result *r, int k) {
    dt_comm *comm = dt_context_comm(ctx);
    dt_backend *be = ctx->backend;
    const int P = dt_context_world_size(ctx), iters = r->o->iters;
    const size_t bytes = (size_t)r->o->mib[k] << 20;
    double mine[MAX_ITERS], *all = malloc((size_t)P * (size_t)iters * sizeof *all);
    dt_ring *ring = NULL;
    dt_status st;
    if (!all) return dt_error(DT_ERR_OUT_OF_MEMORY, NAME ": out of memory");
    DT_TRY_GOTO(st, dt_ring_create(comm, bytes, DT_RING_FORWARD, &ring), out);
    for (int i = -1; i < iters; i++) {
        DT_TRY_GOTO(st, be->ops->sync(be), out);
        DT_TRY_GOTO(st, dt_comm_barrier(comm), out);
        const double t0 = ex_now_s();
        DT_TRY_GOTO(st, dt_ring_start(ring), out);
        DT_TRY_GOTO(st, dt_ring_wait(ring), out);
        DT_TRY_GOTO(st, be->ops->sync(be), out);
        if (i >= 0) mine[i] = ex_now_s() - t0;
    }
    DT_TRY_GOTO(st, dt_comm_all_gather(comm, mine, all, (size_t)iters * sizeof(double), DT_U8), out);
    if (dt_context_rank(ctx) == 0)
        for (int i = 0; i < iters; i++) {
            double slowest = 0;
            for (int q = 0; q < P; q++)
                if (all[(size_t)q * iters + i] > slowest) slowest = all[(size_t)q * iters + i];
            r->step_s[k][i] = slowest;
        }
out:
    dt_ring_destroy(ring);
    free(all);
    return st;
}

static dt_status rank_main(dt_context *ctx, void *arg) {
    result *r = arg;
#ifdef DT_HAVE_CUDA
    if (r->o->comm_ctas >= 0) dt_backend_cuda_set_comm_ctas(ctx->backend, r->o->comm_ctas);
    if (dt_context_rank(ctx) == 0) r->comm_ctas = dt_backend_cuda_comm_ctas(ctx->backend);
#endif
    if (dt_context_rank(ctx) == 0) {
        r->backend = dt_context_backend(ctx);
        r->transport = dt_context_transport(ctx);
        r->world = dt_context_world_size(ctx);
    }
    for (int k = 0; k < r->o->n_sizes; k++) DT_TRY(run_size(ctx, r, k));
    return DT_SUCCESS;
}

static void usage(FILE *f) {
    fprintf(f, "usage: " NAME " [--ranks P] [--mib 1,8,32] [--iters N]\n"
               "       [--backend auto|cpu|cuda] [--transport auto|local|mpi|nccl]\n"
               "       [--comm-ctas N]\n"
               "  --ranks P     ranks as threads of this process (default 2); 0: one rank per\n"
               "                process, as many as mpirun started\n"
               "  --mib LIST    block sizes in MiB (default 1,8,32)\n"
               "  --iters N     timed steps per size after one warm-up (default 20)\n"
               "  --comm-ctas N CUDA: same-device copies in kernels of at most N CTAs a rank,\n"
               "                0 the driver's copy (default: the backend's)\n");
}

static int parse(int argc, char **argv, opts *o) {
    static const char *const transports[] = {"auto", "local", "mpi", "nccl"};
    static const dt_transport_kind tkinds[] = {DT_TRANSPORT_AUTO, DT_TRANSPORT_LOCAL,
                                               DT_TRANSPORT_MPI, DT_TRANSPORT_NCCL};
    *o = (opts){.ranks = 2, .iters = 20, .n_sizes = 3, .mib = {1, 8, 32},
                .backend = DT_BACKEND_AUTO, .transport = DT_TRANSPORT_AUTO, .comm_ctas = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        int k;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--ranks")) {
            if (!ex_parse_int(a, v, 0, MAX_P, &x)) return 0;
            o->ranks = (int)x;
        } else if (!strcmp(a, "--iters")) {
            if (!ex_parse_int(a, v, 1, MAX_ITERS, &x)) return 0;
            o->iters = (int)x;
        } else if (!strcmp(a, "--mib")) {
            if (!ex_parse_ints(a, v, 1, 4096, MAX_SIZES, o->mib, &o->n_sizes)) return 0;
        } else if (!strcmp(a, "--backend")) {
            if (!ex_parse_backend(a, v, &o->backend)) return 0;
        } else if (!strcmp(a, "--comm-ctas")) {
            if (!ex_parse_int(a, v, 0, 1024, &x)) return 0;
            o->comm_ctas = (int)x;
        } else if (!strcmp(a, "--transport")) {
            if ((k = ex_parse_choice(a, v, transports, 4)) < 0) return 0;
            o->transport = tkinds[k];
        } else {
            fprintf(stderr, NAME ": unknown flag '%s'\n", a);
            usage(stderr);
            return 0;
        }
        i++;
    }
    return 1;
}

int main(int argc, char **argv) {
    opts o;
    if (!parse(argc, argv, &o)) return 2;
    result *r = calloc(1, sizeof *r);
    if (!r) return 1;
    r->o = &o;
    dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
    lo.backend = o.backend;
    lo.transport = o.transport;
    dt_status st = dt_launch(o.ranks, rank_main, r, &lo);
    int printer = st == DT_SUCCESS && r->world > 0; /* rank 0 of the launch is here */
    if (st != DT_SUCCESS) {
        fprintf(stderr, NAME ": %s: %s\n", dt_status_name(st), dt_last_error());
    } else if (printer) {
        printf(NAME ": a ring step's transfer alone, %d ranks, backend %s, transport %s, "
               "%d steps per size", r->world, dt_backend_kind_name(r->backend),
               dt_transport_kind_name(r->transport), o.iters);
        if (r->backend == DT_BACKEND_CUDA && r->comm_ctas > 0)
            printf(", same-device copies in kernels of at most %d CTAs a rank", r->comm_ctas);
        else if (r->backend == DT_BACKEND_CUDA)
            printf(", same-device copies by the driver");
        printf("\n");
        printf("| MiB | step median (ms) | step best (ms) | GB/s (median) |\n");
        printf("|---|---|---|---|\n");
        for (int k = 0; k < o.n_sizes; k++) {
            double med = ex_median(r->step_s[k], o.iters), best = r->step_s[k][0];
            for (int i = 1; i < o.iters; i++)
                if (r->step_s[k][i] < best) best = r->step_s[k][i];
            printf("| %ld | %.3f | %.3f | %.2f |\n", o.mib[k], 1e3 * med, 1e3 * best,
                   (double)((size_t)o.mib[k] << 20) / med * 1e-9);
        }
    }
    free(r);
    dt_status fin = dt_finalize();
    return st != DT_SUCCESS || fin != DT_SUCCESS;
}
