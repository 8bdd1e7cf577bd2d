/* bench/attention.c — attention benchmarks for docs/PERFORMANCE.md.
 *
 * Every section runs for each selected pass (--pass fwd,bwd, default both):
 *   fwd  times dt_attention_forward;
 *   bwd  times dt_attention_backward alone: each rank runs the forward once,
 *        before the warmup and outside every timed region, and the timed calls
 *        reuse its o and lse with a random dout.
 * Flops: the forward counts 4*B*H*S*S*D (QK^T and PV), the backward 2.5x that
 * (10*B*H*S*S*D: QK^T recomputed, dV, dP, dQ, dK, the convention of
 * FlashAttention's benchmarks), both halved for causal.
 *
 * Three sections, all through the public API (dtensor/dtensor.h,
 * attention/attention.h):
 *   (a) block kernel throughput: one single-device call (local tensors, mesh
 *       NULL) per shape, dtype, mask and pass; TFLOPS = flops / median time.
 *       On the CPU backend the issue's shapes (B=1, H=16, S=4096 and 16384,
 *       D=128; B=1, H=32, S=8192, D=64) would take minutes, so scaled-down
 *       shapes run instead and the table says so; --shapes full forces the
 *       issue's shapes.
 *   (b) ring balance: for P = 2, 4, 8 ranks and C tokens per rank, the causal
 *       distributed call with contiguous, striped and zigzag sharding, one
 *       table per pass. MEASURED per order: the wall time of the whole call
 *       (slowest rank, starts aligned by a barrier) and, on the CPU backend,
 *       each rank's thread CPU time of its call; the largest of those is the
 *       critical path the ring would have if every rank had its own core
 *       (for these three orders one rank is the busiest on every step).
 *       COMPUTED from the mask rule (dt_attn_pairs): the critical path in
 *       query-key pairs, sum over steps of the busiest rank, and its ratio.
 *       The backward visits the same (query block, key block) pairs with the
 *       same masks on the same steps, so its computed critical path is the
 *       same pair count: the text output prints the pairs columns once, in
 *       the first pass's table (the JSON repeats them on every row).
 *       MEASURED per (rank, step) with dt_attention_options.timing: the
 *       kernels' critical path (sum over steps of the slowest rank's
 *       blocks) and the largest per-rank sum of waits between steps (the
 *       transfers the kernels did not hide); of those, the largest per-rank
 *       time before step 0's kernels (the agreement, the set-up, the
 *       backward's delta pass) and after the last step's.
 *   (c) ring cost: the distributed call's work summed over ranks (thread CPU
 *       time on the CPU backend) against one single-device causal call of the
 *       same pass on the whole sequence.
 *   (d) work from the mask, COUNTED, nothing run (not in the default list):
 *       for P ranks (--ranks, default 8) and S tokens (--seq, default 65536),
 *       each order's critical path in query-key pairs (sum over ring steps
 *       of the busiest rank, from dt_attn_pairs) and total, under the causal
 *       mask with packed documents (--docs) and a sliding window (--window)
 *       as attention/mask.h's rule takes them; ideal = total / P. Given
 *       --docs, --window, --seq, --ranks or --seed without --section, (d)
 *       alone runs.
 *   (e) ring, Ulysses and the hybrid (not in the default list): on P ranks
 *       (--ranks, default 8), causal, H = H_kv (the least multiple of P
 *       from 8), the ring over all P contiguous and striped, Ulysses alone
 *       (dt_attention_options.a2a_dim over all P) and the hybrids on a
 *       (P/U ring) x (U Ulysses) mesh for U = 2, 4 below P, striped over
 *       the ring: MEASURED each rank's bytes per kind, from the counters of
 *       its mesh dims' communicators and the world's (collectives/comm.h),
 *       reset before the timed call and read after, against the FORMULA
 *       (ul_formula); MEASURED the call's wall time (slowest rank, median)
 *       and the largest per-rank thread CPU time. On a GPU S = 32k, 64k,
 *       128k; on the CPU S = 4096 and 8192, then 32k, 64k and 128k once
 *       each with a sliding window of 128 (the bytes do not depend on the
 *       mask; the CPU could not compute the full mask there in minutes).
 *       --seq S runs that S alone (with --window W).
 * Timing: CLOCK_MONOTONIC (and CLOCK_THREAD_CPUTIME_ID), one warmup, then
 * --iters iterations; the median is reported. Each timed call ends with a
 * read-back of a one-element tensor of the rank (wait_done): the public API
 * has no device synchronise, and on CUDA every call of a rank is enqueued on
 * its one compute stream in call order, so the read-back returns only when
 * the call's work is done. On the CPU it is a 4-byte memcpy.
 *
 * Ranks are threads of this process (dt_launch). On a machine with fewer
 * cores than ranks they contend for the cores, and the output says so.
 * OpenBLAS runs one thread per call in every section: dt_launch sets that
 * for the duration of a multi-rank launch (context.h), so the single-device
 * calls of (a) and (c) run on rank 0 of a two-rank launch whose rank 1 does
 * nothing; their CPU numbers are then per core and comparable with the ring's
 * per-rank thread CPU times.
 *
 * Run: build/bench/attention [--quick] [--json] [--backend cpu] [--iters N]
 *      [--tokens-per-rank C] [--shapes auto|scaled|full] [--section a,b,c]
 *      [--dtype bf16,fp32,fp16] [--dependent 0|1|2] [--persistent 0|1|2]
 *      [--producer 0|1] [--copies 0|1] [--comm-ctas N] [--pass fwd,bwd]
 *      [--group G] [--seq S] [--ranks P] [--docs L1,L2,...|random:MEAN]
 *      [--window W] [--seed N]     (--section e: --ranks, --seq, --window)
 *
 * --group G runs the forward rings of (b) and (c) with up to G ring steps
 * per launch (dt_attention_options.group; striped causal: the greatest
 * power of two up to G); a launch's time counts on its first step. The
 * backward runs a launch per step whatever it is.
 *
 * --copies 0 sets DT_LOCAL_COPIES=0 for its launches (context.h): the local
 * transport's transfers then move no data, so (b) times the ring without
 * its copies (issue 8 item 6's "without the copies"; every output that
 * depends on a transfer is wrong, and none is checked here). --comm-ctas N
 * (CUDA) runs the communication stream's own work (the local transport's
 * same-device copies, the backward's add beside) in kernels of at most N
 * CTAs (dt_backend_cuda_set_comm_ctas; 0: the driver's copy and a kernel
 * on as many SMs as it gets; not given: the backend's default, its
 * DT_CUDA_COMM_CTAS shared by the ranks on a device).
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attention/attention.h"
#include "dtensor/docs.h"
#include "dtensor/dtensor.h"
#ifdef DT_HAVE_CUDA
#include "dtensor/backend_cuda.h"
#include "dtensor/context_internal.h"
#endif

#define NAME "bench/attention"
#include "examples/example_util.h" /* ex_now_s, ex_median, ex_parse_int */

#define MAX_ITERS 100
#define MAX_P 8
/* (e) on the CPU: the timed sequences, and the window of the issue's
 * sequences (32k to 128k tokens), run once each for their bytes */
static const int64_t ul_cpu_seqs[2] = {4096, 8192};
#define UL_CPU_WINDOW 128

/* ------------------------------------------------------------------- passes */

typedef enum bench_pass { PASS_FWD, PASS_BWD, PASS_COUNT } bench_pass;

static const char *pass_name(bench_pass p) {
    return p == PASS_FWD ? "fwd" : p == PASS_BWD ? "bwd" : "unknown";
}

/* The call a pass times, for messages and table titles. */
static const char *pass_call(bench_pass p) {
    return p == PASS_FWD ? "dt_attention_forward" : "dt_attention_backward";
}

/* ------------------------------------------------------------------ options */

typedef struct bench_opts {
    dt_backend_kind backend;
    int json, quick, iters, tokens_per_rank;
    int shapes;                /* 0 auto, 1 scaled, 2 full */
    int sections[5];           /* a, b, c, d, e */
    int passes[PASS_COUNT];    /* fwd, bwd */
    int dtypes[3];             /* (a): bf16, fp32, fp16 (--dtype); none set: bf16, fp32 */
    int dependent;             /* --dependent: CUDA's dependent launches (default 1) */
    int persistent;            /* --persistent: CUDA's persistent mode (backend_cuda.h; 1) */
    int producer;              /* --producer: the wgmma forward's producer warpgroup (1) */
    int copies;                /* --copies 0: DT_LOCAL_COPIES=0 for the launches (1) */
    int comm_ctas;             /* --comm-ctas: the comm stream's kernels' CTAs (-1: the backend's) */
    int group;                 /* --group: the forward rings' steps per launch (1) */
    /* (d) */
    int64_t seq;               /* --seq: tokens (65536) */
    int ranks;                 /* --ranks: P (8) */
    const char *docs;          /* --docs as given; NULL: one document */
    int64_t window;            /* --window: 0 none */
    uint64_t seed;             /* --seed: --docs random:MEAN draws from seed + 4 (1) */
    int sections_given;        /* --section was given */
    int mask_flags;            /* one of (d)'s flags was given */
    int d_only_flags;          /* --docs or --seed: (d)'s alone ((e) takes --seq, --ranks,
                                  --window too) */
    int seq_given;             /* --seq was given */
} bench_opts;

static dt_backend_kind g_backend_used = DT_BACKEND_AUTO;
static int g_dependent = 1;   /* bench_opts.dependent, for every rank's backend */
static int g_persistent = 1;  /* bench_opts.persistent, likewise */
static int g_producer = 1;    /* bench_opts.producer, likewise */
static int g_comm_ctas = -1;  /* bench_opts.comm_ctas, likewise (-1: left as it is) */
static int g_group = 1;       /* bench_opts.group */

static double cpu_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return NAN;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, dt_status st) {
    fprintf(stderr, "bench/attention: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    exit(st == DT_ERR_NOT_SUPPORTED ? 3 : 1);
}

static dt_status launch(int ranks, dt_rank_fn fn, void *arg, const bench_opts *o) {
    dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
    lo.backend = o->backend;
    return dt_launch(ranks, fn, arg, &lo);
}

static dt_status noop_rank(dt_context *ctx, void *arg) {
    (void)arg;
    if (dt_context_rank(ctx) == 0) g_backend_used = dt_context_backend(ctx);
    return DT_SUCCESS;
}

/* --------------------------------------------- one rank's timed attention call */

/* Everything one rank needs to time one pass, made once before the warmup:
 * inputs, one workspace large enough for the forward and (bwd) the backward,
 * and for bwd the forward's o and lse and a random dout. Each timed call's
 * results land in out[] and are destroyed after the clock stops. */
typedef struct attn_call {
    bench_pass pass;
    dt_tensor *q, *k, *v, *ws, *done;
    dt_tensor *o, *lse, *dout;   /* bwd only */
    dt_tensor *out[3];           /* fwd: o, lse; bwd: dq, dk, dv */
    dt_attention_options opts;
    dt_attention_tuning tuning;  /* opts.tuning */
} attn_call;

static void call_release(attn_call *c) {
    for (int i = 0; i < 3; i++) {
        dt_tensor_destroy(c->out[i]);
        c->out[i] = NULL;
    }
}

static void call_destroy(attn_call *c) {
    call_release(c);
    dt_tensor *all[] = {c->dout, c->lse, c->o, c->done, c->ws, c->v, c->k, c->q};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    memset(c, 0, sizeof *c);
}

/* q, k, v (and dout) of global shape [B, S, H, D] under `lay` on `mesh`, or
 * local tensors when mesh is NULL; a2a_dim and window as
 * dt_attention_options takes them (-1, 0: none). On failure the caller
 * still calls call_destroy. */
static dt_status call_create(dt_context *ctx, const dt_mesh *mesh, const dt_layout *lay,
                             dt_dtype dtype, const int64_t shp[4], dt_attn_mask mask,
                             bench_pass pass, int group, int a2a_dim, int64_t window,
                             attn_call *c) {
    const dt_attention_options init = DT_ATTENTION_OPTIONS_INIT;
    memset(c, 0, sizeof *c);
#ifdef DT_HAVE_CUDA
    if (g_comm_ctas >= 0) dt_backend_cuda_set_comm_ctas(ctx->backend, g_comm_ctas);
#endif
    c->pass = pass;
    c->opts = init;
    c->opts.mask = mask;
    c->opts.group = group;
    c->opts.a2a_dim = a2a_dim;
    c->opts.window = window;
    c->tuning = (dt_attention_tuning){DT_ATTN_KERNEL_AUTO, g_persistent, g_dependent, g_producer};
    c->opts.tuning = &c->tuning;
    DT_TRY(dt_tensor_create(ctx, mesh, dtype, 4, shp, lay, &c->q));
    DT_TRY(dt_tensor_create(ctx, mesh, dtype, 4, shp, lay, &c->k));
    DT_TRY(dt_tensor_create(ctx, mesh, dtype, 4, shp, lay, &c->v));
    DT_TRY(dt_tensor_fill_random(c->q, 1));
    DT_TRY(dt_tensor_fill_random(c->k, 2));
    DT_TRY(dt_tensor_fill_random(c->v, 3));
    size_t bytes = 0, bwd_bytes = 0;
    DT_TRY(dt_attention_workspace_size(c->q, c->k, c->v, &c->opts, &bytes));
    if (pass == PASS_BWD) {
        DT_TRY(dt_attention_backward_workspace_size(c->q, c->k, c->v, &c->opts, &bwd_bytes));
        if (bwd_bytes > bytes) bytes = bwd_bytes;
    }
    /* Backend memory for the workspace: a local fp32 tensor is the public
     * way to get some. None asked (an all-to-all dim: the call makes its
     * own): none given. */
    int64_t n = (int64_t)((bytes + 3) / 4);
    if (n > 0) {
        DT_TRY(dt_tensor_create(ctx, NULL, DT_F32, 1, &n, NULL, &c->ws));
        c->opts.workspace = dt_tensor_data(c->ws);
        c->opts.workspace_bytes = dt_tensor_local_bytes(c->ws);
    }
    int64_t one = 1;
    DT_TRY(dt_tensor_create(ctx, NULL, DT_F32, 1, &one, NULL, &c->done));
    if (pass == PASS_BWD) {
        DT_TRY(dt_tensor_create(ctx, mesh, dtype, 4, shp, lay, &c->dout));
        DT_TRY(dt_tensor_fill_random(c->dout, 4));
        DT_TRY(dt_attention_forward(c->q, c->k, c->v, &c->opts, &c->o, &c->lse));
    }
    return DT_SUCCESS;
}

/* The public API has no device synchronise: on CUDA a call may return
 * before its kernels finish. A download is enqueued behind all the rank's
 * earlier work (backend.h: one compute stream, call order) and returns when
 * it is done, so reading back one float waits for the timed call. */
static dt_status wait_done(const attn_call *c) {
    float x;
    return dt_tensor_get_local(c->done, &x, sizeof x);
}

/* The pass's call (on CUDA it may return before its kernels finish). */
static dt_status call_enqueue(attn_call *c) {
    if (c->pass == PASS_FWD)
        return dt_attention_forward(c->q, c->k, c->v, &c->opts, &c->out[0], &c->out[1]);
    return dt_attention_backward(c->q, c->k, c->v, c->o, c->lse, c->dout, &c->opts, &c->out[0],
                                 &c->out[1], &c->out[2]);
}

/* The timed part: the pass's call, then the wait. */
static dt_status call_run(attn_call *c) {
    DT_TRY(call_enqueue(c));
    return wait_done(c);
}

/* The same calls back to back, as a training step enqueues them: no
 * read-back and no timing marks between them, one read-back after the
 * last; *s the time per call. What a call does on the host (checks,
 * set-up, launches) then overlaps the device's work on the call before,
 * unless it waits for it. */
static dt_status call_b2b(attn_call *c, int iters, double *s) {
    const double t0 = ex_now_s();
    for (int i = 0; i < iters; i++) {
        DT_TRY(call_enqueue(c));
        call_release(c);
    }
    DT_TRY(wait_done(c));
    *s = (ex_now_s() - t0) / iters;
    return DT_SUCCESS;
}

/* ------------------------------------------------------- (a) kernel throughput */

typedef struct shape {
    int64_t B, H, S, D;
} shape;

typedef struct kernel_case {
    shape s, from;             /* from: the issue's shape this one stands for */
    int scaled;
    dt_dtype dtype;
    dt_attn_mask mask;
    bench_pass pass;
    int iters;
    int b2b;                   /* (c): also the calls back to back */
    double t[MAX_ITERS];
    double median_s, tflops;
    double b2b_s;              /* per call, iters calls back to back, one read-back (b2b) */
} kernel_case;

/* Forward 4*B*H*S*S*D, backward 2.5x; halved for causal (see the top). */
static double attn_flops(shape s, dt_attn_mask mask, bench_pass pass) {
    double f = 4.0 * (double)s.B * (double)s.H * (double)s.S * (double)s.S * (double)s.D;
    if (pass == PASS_BWD) f *= 2.5;
    return mask == DT_ATTN_CAUSAL ? f / 2 : f;
}

/* Rank 0 of a two-rank launch (see the note on OpenBLAS above); rank 1 idles. */
static dt_status rank_kernel(dt_context *ctx, void *arg) {
    kernel_case *k = arg;
    if (dt_context_rank(ctx) != 0) return DT_SUCCESS;
    int64_t shp[4] = {k->s.B, k->s.S, k->s.H, k->s.D};
    attn_call c;
    dt_status st;
    DT_TRY_GOTO(st, call_create(ctx, NULL, NULL, k->dtype, shp, k->mask, k->pass, 1, -1, 0, &c),
                out);
    for (int i = -1; i < k->iters; i++) {  /* i = -1: warmup */
        double t0 = ex_now_s();
        DT_TRY_GOTO(st, call_run(&c), out);
        double t1 = ex_now_s();
        if (i >= 0) k->t[i] = t1 - t0;
        call_release(&c);
    }
    if (k->b2b) DT_TRY_GOTO(st, call_b2b(&c, k->iters, &k->b2b_s), out);
out:
    call_destroy(&c);
    return st;
}

/* ----------------------------------------------------------- (b) ring balance */

static const dt_order orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};

typedef struct ring_case {
    int P;
    int64_t B, H, D, C;        /* S = P * C */
    dt_order order;
    dt_dtype dtype;
    bench_pass pass;
    int iters;
    double wall[MAX_ITERS][MAX_P], cpu[MAX_ITERS][MAX_P];
    double b2b[MAX_P];         /* per call, the iterations' calls back to back */
    /* dt_attention_options.timing, seconds: [iteration][rank][step] */
    double blocks[MAX_ITERS][MAX_P][MAX_P], waits[MAX_ITERS][MAX_P][MAX_P];
    double before[MAX_ITERS][MAX_P];   /* [iteration][rank]: to step 0's kernels */
    /* results */
    double wall_s, cpu_max_s, cpu_sum_s;
    double b2b_s;              /* the slowest rank's b2b */
    double steps_crit_s;       /* sum over steps of the slowest rank's blocks */
    double kernels_sum_s;      /* every rank's blocks of every step, summed */
    double waits_max_s;        /* the largest per-rank sum of waits */
    double before_max_s;       /* the largest per-rank time before step 0's kernels */
    double after_max_s;        /* the largest per-rank wait after the last step's */
    int64_t crit_pairs, total_pairs;
} ring_case;

static dt_status rank_ring(dt_context *ctx, void *arg) {
    ring_case *r = arg;
    const int rank = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_attention_timing *tm = NULL;
    attn_call c;
    memset(&c, 0, sizeof c);
    dt_status st;
    int sizes[1] = {r->P};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, NULL, &mesh), out);
    dt_layout lay = dt_layout_1d(dt_shard(1, r->order));
    int64_t shp[4] = {r->B, r->P * r->C, r->H, r->D};
    DT_TRY_GOTO(st, call_create(ctx, mesh, &lay, r->dtype, shp, DT_ATTN_CAUSAL, r->pass,
                                g_group, -1, 0, &c), out);
    tm = malloc(sizeof *tm);
    if (!tm) DT_TRY_GOTO(st, dt_error(DT_ERR_OUT_OF_MEMORY, "bench: out of memory"), out);
    c.opts.timing = tm;
    for (int i = -1; i < r->iters; i++) {
        DT_TRY_GOTO(st, dt_comm_barrier(dt_context_comm(ctx)), out);
        double w0 = ex_now_s(), c0 = cpu_s();
        DT_TRY_GOTO(st, call_run(&c), out);
        double w1 = ex_now_s(), c1 = cpu_s();
        if (i >= 0) {
            r->wall[i][rank] = w1 - w0;
            r->cpu[i][rank] = c1 - c0;
            r->before[i][rank] = 1e-3 * tm->before_ms;
            for (int t = 0; t < r->P; t++) {
                r->blocks[i][rank][t] = 1e-3 * tm->blocks_ms[t];
                r->waits[i][rank][t] = 1e-3 * tm->wait_ms[t];
            }
        }
        call_release(&c);
    }
    /* back to back, without the timing marks */
    c.opts.timing = NULL;
    DT_TRY_GOTO(st, dt_comm_barrier(dt_context_comm(ctx)), out);
    DT_TRY_GOTO(st, call_b2b(&c, r->iters, &r->b2b[rank]), out);
out:
    free(tm);
    call_destroy(&c);
    dt_mesh_destroy(mesh);
    return st;
}

/* Critical path (sum over steps of the busiest rank) and total of the
 * query-key pairs rule r allows, per (batch, head): at step t rank j holds
 * the keys of rank (j - t) mod P. */
static void ring_pairs_rule(dt_attn_rule r, dt_order order, int64_t S, int P, int64_t *crit,
                            int64_t *total) {
    *crit = *total = 0;
    for (int t = 0; t < P; t++) {
        int64_t mx = 0;
        for (int j = 0; j < P; j++) {
            int src = ((j - t) % P + P) % P;
            const int64_t n = dt_attn_pairs(r, dt_attn_segment_of(order, S, P, j),
                                            dt_attn_segment_of(order, S, P, src));
            if (n > mx) mx = n;
            *total += n;
        }
        *crit += mx;
    }
}

/* The same for the causal mask alone. */
static void ring_pairs(dt_order order, int64_t S, int P, int64_t *crit, int64_t *total) {
    ring_pairs_rule(dt_attn_rule_of(DT_ATTN_CAUSAL), order, S, P, crit, total);
}

static void ring_summarise(ring_case *r) {
    double w[MAX_ITERS], cm[MAX_ITERS], cs[MAX_ITERS];
    for (int i = 0; i < r->iters; i++) {
        w[i] = cm[i] = cs[i] = 0;
        for (int j = 0; j < r->P; j++) {
            if (r->wall[i][j] > w[i]) w[i] = r->wall[i][j];
            if (r->cpu[i][j] > cm[i]) cm[i] = r->cpu[i][j];
            cs[i] += r->cpu[i][j];
        }
    }
    r->wall_s = ex_median(w, r->iters);
    r->b2b_s = 0;
    for (int j = 0; j < r->P; j++) r->b2b_s = fmax(r->b2b_s, r->b2b[j]);
    r->cpu_max_s = ex_median(cm, r->iters);
    r->cpu_sum_s = ex_median(cs, r->iters);
    double kc[MAX_ITERS], ks[MAX_ITERS], wx[MAX_ITERS], bx[MAX_ITERS], ax[MAX_ITERS];
    for (int i = 0; i < r->iters; i++) {
        kc[i] = ks[i] = wx[i] = bx[i] = ax[i] = 0;
        for (int t = 0; t < r->P; t++) {
            double slowest = 0;
            for (int j = 0; j < r->P; j++) {
                slowest = fmax(slowest, r->blocks[i][j][t]);
                ks[i] += r->blocks[i][j][t];
            }
            kc[i] += slowest;
        }
        for (int j = 0; j < r->P; j++) {
            double sum = 0;
            for (int t = 0; t < r->P; t++) sum += r->waits[i][j][t];
            wx[i] = fmax(wx[i], sum);
            bx[i] = fmax(bx[i], r->before[i][j]);
            ax[i] = fmax(ax[i], r->waits[i][j][r->P - 1]);
        }
    }
    r->steps_crit_s = ex_median(kc, r->iters);
    r->kernels_sum_s = ex_median(ks, r->iters);
    r->waits_max_s = ex_median(wx, r->iters);
    r->before_max_s = ex_median(bx, r->iters);
    r->after_max_s = ex_median(ax, r->iters);
    ring_pairs(r->order, r->P * r->C, r->P, &r->crit_pairs, &r->total_pairs);
}

/* The ranks' work on the ring, section (c), and where it comes from. On the
 * CPU each rank's thread CPU time (time blocked on a peer or waiting for a
 * core left out). On CUDA a GPU's kernels run while the host waits, so the
 * work is the block kernels' event times, summed over ranks and steps,
 * where each rank has a GPU of its own; ranks sharing GPUs (dt_launch puts
 * rank r on GPU r mod n) also share their SMs, which stretches each one's
 * events, and then the bound is the GPUs' time: a call's time (call_s: its
 * wall time, or b2b's per call) times the GPUs in use, within which all of
 * the ring's work ran. */
static double ring_work(const ring_case *c, int gpu, double call_s, const char **from) {
    if (!gpu) {
        *from = "cpu time";
        return c->cpu_sum_s;
    }
#ifdef DT_HAVE_CUDA
    int ndev = dt_cuda_device_count(NULL, 0);
#else
    int ndev = 0;   /* not reached: no CUDA ranks in this build */
#endif
    if (ndev >= c->P) {
        *from = "kernel events";
        return c->kernels_sum_s;
    }
    *from = "devices x wall";
    return (ndev > 0 ? ndev : 1) * call_s;
}

/* Text output of (b): a line per P with two figures of each order's ring,
 * the ring_case members at offsets a and b, in ms, `fmt` in cells of
 * `width`. */
static void print_ring_figures(FILE *out, const char *title, const char *fmt, int width,
                               ring_case *const rings[3][3], size_t a, size_t b) {
    fprintf(out, "    %-28s", title);
    for (int r = 0; r < 3; r++) fprintf(out, " %-*s", width, dt_order_name(orders[r]));
    fprintf(out, "\n");
    for (int p = 0; p < 3; p++) {
        fprintf(out, "    P = %-24d", rings[p][0]->P);
        for (int r = 0; r < 3; r++) {
            const char *c = (const char *)rings[p][r];
            char cell[48];
            snprintf(cell, sizeof cell, fmt, 1e3 * *(const double *)(c + a),
                     1e3 * *(const double *)(c + b));
            fprintf(out, " %-*s", width, cell);
        }
        fprintf(out, "\n");
    }
}

/* ------------------------------------------------- (d) work from the mask */

/* (d): each order's pairs under the causal mask with o's documents (one
 * batch row of o->seq tokens) and window, as text or JSON rows. */
static void mask_work(FILE *out, const bench_opts *o, const int64_t *lens, int64_t count,
                      double mean) {
    const int64_t S = o->seq;
    const int P = o->ranks;
    int64_t *bounds = NULL;
    if (lens) {
        bounds = malloc((size_t)(2 * S) * sizeof *bounds);
        if (!bounds) die("(d): the documents' bounds", DT_ERR_OUT_OF_MEMORY);
        dt_docs_bounds(lens, count, S, 0, bounds);
    }
    const dt_attn_rule rule = {DT_ATTN_CAUSAL, o->window, bounds};
    int64_t longest = 0;
    for (int64_t i = 0; i < count; i++) longest = lens[i] > longest ? lens[i] : longest;
    char docs[160], window[48] = "no window";
    if (!lens) snprintf(docs, sizeof docs, "one document");
    else if (mean > 0)
        snprintf(docs, sizeof docs, "%lld documents drawn log-normal (mean %g, sigma 1) from seed "
                 "%llu, the longest %lld", (long long)count, mean,
                 (unsigned long long)o->seed + 4, (long long)longest);
    else
        snprintf(docs, sizeof docs, "%lld documents (--docs), the longest %lld", (long long)count,
                 (long long)longest);
    if (o->window) snprintf(window, sizeof window, "window %lld", (long long)o->window);
    if (o->json)
        fprintf(out, "  \"mask_work\": [\n");
    else
        fprintf(out, "\n(d) work from the mask: query-key pairs per (batch, head) the causal "
                     "rule allows, COUNTED from\n"
                     "    dt_attn_pairs, nothing run; critical = sum over ring steps of the "
                     "busiest rank's pairs,\n"
                     "    ideal = total / P\n"
                     "    S = %lld, P = %d, causal, %s, %s\n\n"
                     "    %-10s %16s %16s %10s %10s\n",
                (long long)S, P, docs, window, "order", "critical pairs", "total pairs",
                "crit/ideal", "contig/this");
    int64_t crit0 = 0;
    for (int r = 0; r < 3; r++) {
        const int have = S % (orders[r] == DT_ORDER_ZIGZAG ? 2 * P : P) == 0;
        int64_t crit = 0, total = 0;
        if (have) ring_pairs_rule(rule, orders[r], S, P, &crit, &total);
        if (r == 0) crit0 = crit;
        const double ideal = (double)total / P, ratio = total ? (double)crit / ideal : 0;
        if (o->json && have)
            fprintf(out, "%s    {\"order\": \"%s\", \"S\": %lld, \"P\": %d, \"mask\": "
                         "\"causal\", \"docs\": %s%s%s, \"doc_count\": %lld, "
                         "\"longest_doc\": %lld, \"window\": %lld, \"critical_pairs\": %lld, "
                         "\"total_pairs\": %lld, \"ideal_pairs\": %.1f, \"ratio_ideal\": %.4f, "
                         "\"ratio_contiguous\": %.4f}",
                    r ? ",\n" : "", dt_order_name(orders[r]), (long long)S, P,
                    o->docs ? "\"" : "", o->docs ? o->docs : "null", o->docs ? "\"" : "",
                    (long long)(lens ? count : 1),
                    (long long)(lens ? longest : S), (long long)o->window, (long long)crit,
                    (long long)total, ideal, ratio, crit ? (double)crit0 / (double)crit : 0.0);
        else if (o->json)
            fprintf(out, "%s    {\"order\": \"%s\", \"S\": %lld, \"P\": %d, \"n/a\": "
                         "\"S is not divisible by 2P\"}", r ? ",\n" : "",
                    dt_order_name(orders[r]), (long long)S, P);
        else if (have)
            fprintf(out, "    %-10s %16lld %16lld %10.3f %10.3f\n", dt_order_name(orders[r]),
                    (long long)crit, (long long)total, ratio,
                    crit ? (double)crit0 / (double)crit : 0.0);
        else
            fprintf(out, "    %-10s n/a: S = %lld is not divisible by 2P = %d\n",
                    dt_order_name(orders[r]), (long long)S, 2 * P);
    }
    if (o->json) fprintf(out, "\n  ]\n");
    free(bounds);
}

/* ------------------------------------ (e) ring, Ulysses and the hybrid */

/* One algorithm of (e) on P ranks: U = 0 the ring over all P by `order`;
 * U = P Ulysses alone (one mesh dim, a2a_dim 0); else the hybrid on a
 * (P/U ring) x (U Ulysses) mesh, [Shard(1, order), Shard(1, contiguous)],
 * a2a_dim 1. q, k, v [B, S, H, D] (H_kv = H), causal, an optional window. */
typedef struct ul_case {
    int P, U;
    dt_order order;
    int64_t B, S, H, D, window;
    dt_dtype dtype;
    bench_pass pass;
    int iters;
    double wall[MAX_ITERS][MAX_P], cpu[MAX_ITERS][MAX_P];
    /* each rank's counters of its last timed call: [rank][UL_RING, UL_A2A, UL_WORLD] */
    dt_comm_counters cnt[MAX_P][3];
    /* results */
    double wall_s, cpu_max_s;
} ul_case;

enum { UL_RING, UL_A2A, UL_WORLD };   /* the communicators, and the kind each carries */
static const dt_comm_kind ul_kinds[3] = {DT_COMM_P2P, DT_COMM_ALL_TO_ALL, DT_COMM_ALL_REDUCE};

typedef struct ul_mesh {
    int ndim, sizes[2], ring, a2a;   /* the ring's and the all-to-all's mesh dims, -1: none */
    dt_layout layout;
} ul_mesh;

static ul_mesh ul_mesh_of(const ul_case *u) {
    ul_mesh m = {1, {u->P, 1}, 0, -1, dt_layout_1d(dt_shard(1, u->order))};
    if (u->U == u->P) {
        m.ring = -1;
        m.a2a = 0;
    } else if (u->U) {
        m.ndim = 2;
        m.sizes[0] = u->P / u->U;
        m.sizes[1] = u->U;
        m.a2a = 1;
        m.layout = dt_layout_2d(dt_shard(1, u->order), dt_shard(1, DT_ORDER_CONTIGUOUS));
    }
    return m;
}

static dt_status rank_ulysses(dt_context *ctx, void *arg) {
    ul_case *u = arg;
    const int rank = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    attn_call c;
    memset(&c, 0, sizeof c);
    dt_status st;
    const ul_mesh m = ul_mesh_of(u);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, m.ndim, m.sizes, NULL, &mesh), out);
    const int64_t shp[4] = {u->B, u->S, u->H, u->D};
    DT_TRY_GOTO(st, call_create(ctx, mesh, &m.layout, u->dtype, shp, DT_ATTN_CAUSAL, u->pass,
                                g_group, m.a2a, u->window, &c), out);
    dt_comm *comms[3] = {m.ring >= 0 ? dt_mesh_comm(mesh, m.ring) : NULL,
                         m.a2a >= 0 ? dt_mesh_comm(mesh, m.a2a) : NULL, dt_context_comm(ctx)};
    for (int i = -1; i < u->iters; i++) {   /* i = -1: warmup */
        DT_TRY_GOTO(st, dt_comm_barrier(dt_context_comm(ctx)), out);
        for (int k = 0; k < 3; k++) dt_comm_counters_reset(comms[k]);
        const double w0 = ex_now_s(), c0 = cpu_s();
        DT_TRY_GOTO(st, call_run(&c), out);
        const double w1 = ex_now_s(), c1 = cpu_s();
        for (int k = 0; k < 3; k++) {
            memset(&u->cnt[rank][k], 0, sizeof u->cnt[rank][k]);
            if (comms[k]) DT_TRY_GOTO(st, dt_comm_counters_get(comms[k], &u->cnt[rank][k]), out);
        }
        if (i >= 0) {
            u->wall[i][rank] = w1 - w0;
            u->cpu[i][rank] = c1 - c0;
        }
        call_release(&c);
    }
out:
    call_destroy(&c);
    dt_mesh_destroy(mesh);
    return st;
}

/* What one call moves per rank, by collectives/comm.h's definitions (a
 * rank's own block never counts; sent = received), on each communicator:
 *   UL_A2A   Ulysses: the all-to-alls of q, k, v out and o, lse back
 *            (forward, 5), of q, k, v, o, lse, dout out and dq, dk, dv back
 *            (backward, 9), each (U-1)/U of a rank's part;
 *   UL_RING  the ring of R = P/U ranks (R = P without Ulysses): forward R-1
 *            hops of the packed K|V block [2, B, S/R, H/U, D]; backward R-1
 *            of it and R-1 of its fp32 dK|dV sums in R groups, then the
 *            finished dK|dV home in the dtype in two groups (attention/
 *            backward.c);
 *   UL_WORLD the call's range check, one all_reduce (max) of n = 3 floats
 *            (backward 4) over the world: 2 (P-1) ceil(n/P) x 4 bytes. */
typedef struct ul_expect {
    uint64_t calls[3], bytes[3];
} ul_expect;

static ul_expect ul_formula(const ul_case *u) {
    ul_expect f;
    memset(&f, 0, sizeof f);
    const int bwd = u->pass == PASS_BWD;
    const uint64_t es = dt_dtype_size(u->dtype), P = (uint64_t)u->P, U = (uint64_t)u->U;
    const uint64_t R = U ? P / U : P, hu = (uint64_t)u->H / (U ? U : 1);
    const uint64_t x = (uint64_t)(u->B * (u->S / u->P) * u->H * u->D) * es;   /* q, k, v, o */
    const uint64_t lse = (uint64_t)(u->B * u->H * (u->S / u->P)) * sizeof(float);
    if (U) {
        const uint64_t sx = (U - 1) * (x / U), sl = (U - 1) * (lse / U);
        f.calls[UL_A2A] = bwd ? 9 : 5;
        f.bytes[UL_A2A] = (bwd ? 8 : 4) * sx + sl;
    }
    const uint64_t rows = (uint64_t)u->B * ((uint64_t)u->S / R);
    const uint64_t block = 2 * rows * hu * (uint64_t)u->D * es;
    const uint64_t grads = 2 * rows * hu * (uint64_t)u->D * sizeof(float);
    if (R > 1) {
        f.calls[UL_RING] = bwd ? R + (rows / 2 > 0) + 1 : R - 1;
        f.bytes[UL_RING] = bwd ? (R - 1) * (block + grads) + block : (R - 1) * block;
    }
    const uint64_t n = bwd ? 4 : 3;
    f.calls[UL_WORLD] = 1;
    f.bytes[UL_WORLD] = 2 * (P - 1) * ((n + P - 1) / P) * sizeof(float);
    return f;
}

/* 1 if every rank's counters are the formula's: on each communicator its
 * kind's calls and bytes (both ways), nothing of any other kind. */
static int ul_match(const ul_case *u, const ul_expect *f) {
    for (int r = 0; r < u->P; r++)
        for (int k = 0; k < 3; k++)
            for (int kind = 0; kind < DT_COMM_KIND_COUNT; kind++) {
                const dt_comm_counters *c = &u->cnt[r][k];
                const int mine = kind == (int)ul_kinds[k];
                if (c->calls[kind] != (mine ? f->calls[k] : 0) ||
                    c->bytes_sent[kind] != (mine ? f->bytes[k] : 0) ||
                    c->bytes_recv[kind] != (mine ? f->bytes[k] : 0))
                    return 0;
            }
    return 1;
}

static void ul_summarise(ul_case *u) {
    double w[MAX_ITERS], cm[MAX_ITERS];
    for (int i = 0; i < u->iters; i++) {
        w[i] = cm[i] = 0;
        for (int j = 0; j < u->P; j++) {
            w[i] = fmax(w[i], u->wall[i][j]);
            cm[i] = fmax(cm[i], u->cpu[i][j]);
        }
    }
    u->wall_s = ex_median(w, u->iters);
    u->cpu_max_s = ex_median(cm, u->iters);
}

/* "ring contiguous", "ulysses U=8", "hybrid 4x2 striped". */
static void ul_name(const ul_case *u, char *buf, size_t size) {
    if (!u->U) snprintf(buf, size, "ring %s", dt_order_name(u->order));
    else if (u->U == u->P) snprintf(buf, size, "ulysses U=%d", u->U);
    else snprintf(buf, size, "hybrid %dx%d %s", u->P / u->U, u->U, dt_order_name(u->order));
}

/* The rows of (e): for each S (the timed ones, then the long ones, with a
 * window) and pass, the ring contiguous and striped, Ulysses alone, and
 * the hybrids with U = 2 and 4 where U < P divides P. */
typedef struct ul_rows {
    int P;
    int64_t B, H, D;
    dt_dtype dtype;
    int n;                    /* sequences */
    int64_t S[8], window[8];
    int iters[8];
} ul_rows;

static void ulysses_section(FILE *out, const bench_opts *o, const ul_rows *rows,
                            const bench_pass *passes, int npass, int gpu, long cores,
                            int comma_before) {
    const int P = rows->P;
    if (o->json) {
        fprintf(out, "%s  \"ulysses\": [\n", comma_before ? "," : "");
    } else {
        fprintf(out, "\n(e) ring, Ulysses and the hybrid: bytes and time per rank, P = %d, B = %lld, "
                     "H = H_kv = %lld, D = %lld, %s,\n"
                     "    causal; q, k, v sharded over the sequence (dim 1)\n"
                     "    ring X          the ring over all P, Shard(1, X)\n"
                     "    ulysses U=P     all-to-alls over all P (dt_attention_options.a2a_dim): "
                     "no ring\n"
                     "    hybrid RxU X    a (R = P/U ring) x (U Ulysses) mesh, [Shard(1, X), "
                     "Shard(1, contiguous)],\n"
                     "                    a2a_dim 1: all-to-alls over U, then the ring over R\n"
                     "    MEASURED bytes: each rank's counters (collectives/comm.h) of its mesh "
                     "dims' communicators and\n"
                     "      the world's, reset before the timed call and read after; p2p is the "
                     "ring's, a2a the\n"
                     "      all-to-alls, all_reduce the call's range check (3 floats forward, 4 "
                     "backward, on the world)\n"
                     "    FORMULA: forward ring (R-1) x K|V block [2, B, S/R, H/U, D]; backward "
                     "(R-1) x (K|V + fp32 dK|dV)\n"
                     "      + dK|dV home; Ulysses forward 5 all-to-alls, (U-1)/U x (q + k + v + o "
                     "+ lse), backward 9,\n"
                     "      (U-1)/U x (q + k + v + o + lse + dout + dq + dk + dv); all_reduce "
                     "2 (P-1) ceil(n/P) x 4\n"
                     "    match: every rank's counters equal the formula, sent and received, "
                     "every kind (rank 0's shown)\n"
                     "    MEASURED wall: the slowest rank's wall time of the call (starts aligned "
                     "by a barrier), median;\n"
                     "      cpu-max: the largest per-rank thread CPU time of the call%s\n",
                P, (long long)rows->B, (long long)rows->H, (long long)rows->D,
                dt_dtype_name(rows->dtype),
                gpu ? " (not meaningful on a GPU)" : "");
        int windowed = 0;
        for (int si = 0; si < rows->n; si++) windowed |= rows->window[si] > 0;
        if (windowed)
            fprintf(out, "    window > 0: causal with a sliding window, so that little is "
                         "computed; every ring hop and\n      all-to-all still moves all its "
                         "bytes (they do not depend on the mask); the times are not the\n"
                         "      full mask's\n");
        if (!gpu && cores < P)
            fprintf(out, "    NOTE: ranks are threads on %ld cores: wall time tracks the total "
                         "work of all ranks, and the\n      local transport's copies stand for "
                         "the network; CPU times, not GPU figures\n", cores);
        fprintf(out, "\n    %-7s %-6s %-4s %-20s %10s %10s %10s %11s %11s %-5s %9s %9s\n", "S",
                "window", "pass", "algorithm", "p2p", "a2a", "all_reduce", "sent", "formula",
                "match", "wall ms", "cpu-max");
    }
    int first = 1;
    static const int us[2] = {2, 4};
    for (int si = 0; si < rows->n; si++)
        for (int q = 0; q < npass; q++) {
            ul_case cases[5];
            int nc = 0;
            for (int r = 0; r < 2; r++)
                cases[nc++] = (ul_case){.P = P, .U = 0, .order = orders[r]};
            cases[nc++] = (ul_case){.P = P, .U = P, .order = DT_ORDER_CONTIGUOUS};
            for (int i = 0; i < 2; i++)
                if (us[i] < P && P % us[i] == 0)
                    cases[nc++] = (ul_case){.P = P, .U = us[i], .order = DT_ORDER_STRIPED};
            for (int a = 0; a < nc; a++) {
                ul_case *u = calloc(1, sizeof *u);
                if (!u) die("calloc", DT_ERR_OUT_OF_MEMORY);
                *u = cases[a];
                u->B = rows->B, u->S = rows->S[si], u->H = rows->H, u->D = rows->D;
                u->window = rows->window[si];
                u->dtype = rows->dtype;
                u->pass = passes[q];
                u->iters = rows->iters[si];
                const dt_status st = launch(P, rank_ulysses, u, o);
                if (st != DT_SUCCESS) die(pass_call(u->pass), st);
                ul_summarise(u);
                const ul_expect f = ul_formula(u);
                const int match = ul_match(u, &f);
                const dt_comm_counters *c = u->cnt[0];
                uint64_t sent = 0, recv = 0, want = 0;
                for (int k = 0; k < 3; k++) {
                    sent += c[k].bytes_sent[ul_kinds[k]];
                    recv += c[k].bytes_recv[ul_kinds[k]];
                    want += f.bytes[k];
                }
                char name[48];
                ul_name(u, name, sizeof name);
                if (o->json)
                    fprintf(out, "%s    {\"pass\": \"%s\", \"algorithm\": \"%s\", \"P\": %d, "
                                 "\"R\": %d, \"U\": %d, \"order\": \"%s\", \"S\": %lld, "
                                 "\"window\": %lld, \"B\": %lld, \"H\": %lld, \"H_kv\": %lld, "
                                 "\"D\": %lld, \"dtype\": \"%s\", \"iters\": %d, "
                                 "\"p2p_calls\": %llu, \"p2p_sent\": %llu, \"p2p_recv\": %llu, "
                                 "\"a2a_calls\": %llu, \"a2a_sent\": %llu, \"a2a_recv\": %llu, "
                                 "\"all_reduce_calls\": %llu, \"all_reduce_sent\": %llu, "
                                 "\"all_reduce_recv\": %llu, \"sent\": %llu, \"recv\": %llu, "
                                 "\"formula_p2p\": %llu, \"formula_a2a\": %llu, "
                                 "\"formula_all_reduce\": %llu, \"formula\": %llu, "
                                 "\"match\": %s, \"wall_ms\": %.4f, \"cpu_max_ms\": %.4f}",
                            first ? "" : ",\n", pass_name(u->pass), name, P,
                            u->U ? P / u->U : P, u->U ? u->U : 1, dt_order_name(u->order),
                            (long long)u->S, (long long)u->window, (long long)u->B,
                            (long long)u->H, (long long)u->H, (long long)u->D,
                            dt_dtype_name(u->dtype), u->iters,
                            (unsigned long long)c[UL_RING].calls[DT_COMM_P2P],
                            (unsigned long long)c[UL_RING].bytes_sent[DT_COMM_P2P],
                            (unsigned long long)c[UL_RING].bytes_recv[DT_COMM_P2P],
                            (unsigned long long)c[UL_A2A].calls[DT_COMM_ALL_TO_ALL],
                            (unsigned long long)c[UL_A2A].bytes_sent[DT_COMM_ALL_TO_ALL],
                            (unsigned long long)c[UL_A2A].bytes_recv[DT_COMM_ALL_TO_ALL],
                            (unsigned long long)c[UL_WORLD].calls[DT_COMM_ALL_REDUCE],
                            (unsigned long long)c[UL_WORLD].bytes_sent[DT_COMM_ALL_REDUCE],
                            (unsigned long long)c[UL_WORLD].bytes_recv[DT_COMM_ALL_REDUCE],
                            (unsigned long long)sent, (unsigned long long)recv,
                            (unsigned long long)f.bytes[UL_RING],
                            (unsigned long long)f.bytes[UL_A2A],
                            (unsigned long long)f.bytes[UL_WORLD], (unsigned long long)want,
                            match ? "true" : "false", 1e3 * u->wall_s, 1e3 * u->cpu_max_s);
                else
                    fprintf(out, "%s    %-7lld %-6lld %-4s %-20s %10llu %10llu %10llu %11llu "
                                 "%11llu %-5s %9.2f %9.2f\n",
                            a == 0 && !first ? "\n" : "", (long long)u->S, (long long)u->window,
                            pass_name(u->pass), name,
                            (unsigned long long)c[UL_RING].bytes_sent[DT_COMM_P2P],
                            (unsigned long long)c[UL_A2A].bytes_sent[DT_COMM_ALL_TO_ALL],
                            (unsigned long long)c[UL_WORLD].bytes_sent[DT_COMM_ALL_REDUCE],
                            (unsigned long long)sent, (unsigned long long)want,
                            match ? "yes" : "NO", 1e3 * u->wall_s, 1e3 * u->cpu_max_s);
                fflush(out);
                first = 0;
                free(u);
            }
        }
    if (o->json) fprintf(out, "\n  ]\n");
}

/* ------------------------------------------------------------ machine info */

static void cpu_model(char *buf, size_t size) {
    snprintf(buf, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t') c++;
                c[strcspn(c, "\n")] = '\0';
                snprintf(buf, size, "%s", c);
                for (char *x = buf; *x; x++)
                    if (*x == '"' || *x == '\\') *x = '\'';   /* safe inside JSON */
            }
            break;
        }
    }
    fclose(f);
}

/* --------------------------------------------------------------------- main */

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench/attention [flags]\n"
            "  --backend K          auto | cpu | cuda (default auto)\n"
            "  --json               print one JSON object instead of tables\n"
            "  --iters N            timed iterations after one warmup, median reported\n"
            "                       (default 5; 2 with --quick)\n"
            "  --quick              tiny sizes, a smoke test of a few seconds\n"
            "  --tokens-per-rank C  (b), (c): tokens per rank (default 4096 on a GPU, 512 on the CPU)\n"
            "  --shapes W           (a): auto (the issue's shapes on a GPU, scaled-down on the CPU),\n"
            "                       scaled, or full (the issue's shapes anywhere)\n"
            "  --section LIST       which sections to run, e.g. a,b (default a,b,c; d, e: see\n"
            "                       below)\n"
            "  --pass LIST          which passes each section times: fwd (dt_attention_forward),\n"
            "                       bwd (dt_attention_backward alone), or fwd,bwd (default)\n"
            "  --dtype LIST         (a): bf16, fp32, fp16 or a list (default bf16,fp32)\n"
            "  --dependent 0|1|2    CUDA: whether the blocks after a call's first are programmatic\n"
            "                       dependent launches (default 1); 2: the forward's with the\n"
            "                       rows' waits (dt_attention_tuning)\n"
            "  --copies 0|1         0: the local transport moves no data (DT_LOCAL_COPIES=0):\n"
            "                       the ring's time without its copies; outputs wrong (default 1)\n"
            "  --comm-ctas N        CUDA: the communication stream's own work (the local\n"
            "                       transport's copies within one GPU, the backward's add\n"
            "                       beside) in kernels of at most N CTAs (0: the driver's\n"
            "                       copy and kernels on as many SMs as they get; default:\n"
            "                       the backend's, DT_CUDA_COMM_CTAS shared by the ranks\n"
            "                       on a GPU, 0 for a rank alone)\n"
            "  --persistent 0|1|2   CUDA: whether the wgmma forward runs persistent: 1 (default)\n"
            "                       but beside the ring's transfers (a CTA per query tile\n"
            "                       there), 2 there too, 0 never\n"
            "  --producer 0|1       CUDA: whether the wgmma forward at D = 128 issues its\n"
            "                       loads from a producer warpgroup of its own (default 1;\n"
            "                       0: from thread 0)\n"
            "  --group G            (b), (c): the forward rings' ring steps per launch\n"
            "                       (dt_attention_options.group; default 1; striped: the\n"
            "                       greatest power of two up to G)\n"
            "  (d) work from the mask, counted (nothing run); any of these without --section\n"
            "  runs (d) alone:\n"
            "  --seq S              tokens, default 65536\n"
            "  --ranks P            ranks, 1..64, default 8; S a multiple of P (of 2P for zigzag)\n"
            "  --docs L1,L2,...     packed documents: lengths >= 1 summing to S\n"
            "  --docs random:MEAN   documents of log-normal lengths (sigma 1, mean MEAN tokens),\n"
            "                       rounded, at least 1, the last cut to end at S, drawn from\n"
            "                       seed N+4 (--seed N; the draws examples/striped_attention\n"
            "                       makes for one batch row with the same --seed)\n"
            "  --window W           sliding window: keys less than W positions away (0: none,\n"
            "                       default)\n"
            "  --seed N             default 1\n"
            "  (e) ring, Ulysses and the hybrid (--section e): bytes per rank from the\n"
            "  communicators' counters against the formula, and the call's time, for the\n"
            "  ring (contiguous, striped), Ulysses over all P and the (P/U ring) x (U Ulysses)\n"
            "  hybrids, U = 2, 4; it takes --ranks P (at most 8, default 8), --seq S (one\n"
            "  sequence instead of the default list) and --window W\n"
            "  --help\n");
}

/* "fwd", "bwd", "fwd,bwd" or "bwd,fwd": each name once, nothing else. */
static int parse(int argc, char **argv, bench_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--quick")) {
            o->quick = 1;
        } else if (!strcmp(a, "--iters")) {
            long x;
            if (!ex_parse_int(a, v, 1, MAX_ITERS, &x)) return 2;
            o->iters = (int)x;
            i++;
        } else if (!strcmp(a, "--tokens-per-rank")) {
            long x;
            if (!ex_parse_int(a, v, 16, 1 << 20, &x)) return 2;
            o->tokens_per_rank = (int)x;
            if (o->tokens_per_rank % 2) {
                fprintf(stderr, "bench/attention: --tokens-per-rank must be even (zigzag)\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--backend")) {
            if (!ex_parse_backend(a, v, &o->backend)) return 2;
            i++;
        } else if (!strcmp(a, "--dependent")) {
            long x;
            if (!ex_parse_int(a, v, 0, 2, &x)) return 2;
            o->dependent = (int)x;
            i++;
        } else if (!strcmp(a, "--copies")) {
            long x;
            if (!ex_parse_int(a, v, 0, 1, &x)) return 2;
            o->copies = (int)x;
            i++;
        } else if (!strcmp(a, "--comm-ctas")) {
            long x;
            if (!ex_parse_int(a, v, 0, 1024, &x)) return 2;
            o->comm_ctas = (int)x;
            i++;
        } else if (!strcmp(a, "--persistent")) {
            long x;
            if (!ex_parse_int(a, v, 0, 2, &x)) return 2;
            o->persistent = (int)x;
            i++;
        } else if (!strcmp(a, "--group")) {
            long x;
            if (!ex_parse_int(a, v, 1, MAX_P, &x)) return 2;
            o->group = (int)x;
            i++;
        } else if (!strcmp(a, "--producer")) {
            long x;
            if (!ex_parse_int(a, v, 0, 1, &x)) return 2;
            o->producer = (int)x;
            i++;
        } else if (!strcmp(a, "--shapes")) {
            static const char *const shapes[] = {"auto", "scaled", "full"};
            if ((o->shapes = ex_parse_choice(a, v, shapes, 3)) < 0) return 2;
            i++;
        } else if (!strcmp(a, "--section")) {
            static const char *const names[5] = {"a", "b", "c", "d", "e"};
            if (!ex_parse_choices(a, v, names, 5, o->sections)) return 2;
            o->sections_given = 1;
            i++;
        } else if (!strcmp(a, "--seq")) {
            long x;
            if (!ex_parse_int(a, v, 1, 1L << 22, &x)) return 2;
            o->seq = x;
            o->mask_flags = 1;
            o->seq_given = 1;
            i++;
        } else if (!strcmp(a, "--ranks")) {
            long x;
            if (!ex_parse_int(a, v, 1, 64, &x)) return 2;
            o->ranks = (int)x;
            o->mask_flags = 1;
            i++;
        } else if (!strcmp(a, "--docs")) {
            if (!v || !*v) {
                fprintf(stderr, "bench/attention: --docs needs lengths L1,L2,... or random:MEAN\n");
                return 2;
            }
            o->docs = v;
            o->mask_flags = o->d_only_flags = 1;
            i++;
        } else if (!strcmp(a, "--window")) {
            long x;
            if (!ex_parse_int(a, v, 0, 1L << 30, &x)) return 2;
            o->window = x;
            o->mask_flags = 1;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (!ex_parse_seed(v, &o->seed)) return 2;
            o->mask_flags = o->d_only_flags = 1;
            i++;
        } else if (!strcmp(a, "--pass")) {
            static const char *const names[PASS_COUNT] = {"fwd", "bwd"};
            if (!ex_parse_choices(a, v, names, PASS_COUNT, o->passes)) return 2;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            static const char *const names[] = {"bf16", "fp32", "fp16"};
            if (!ex_parse_choices(a, v, names, 3, o->dtypes)) return 2;
            i++;
        } else {
            fprintf(stderr, "bench/attention: unknown flag '%s' (--help lists them)\n", a);
            return 2;
        }
    }
    if (o->mask_flags && !o->sections_given) {
        memset(o->sections, 0, sizeof o->sections);
        o->sections[3] = 1;
    } else if (o->d_only_flags && !o->sections[3]) {
        fprintf(stderr, "bench/attention: --docs and --seed set section (d); --section leaves it "
                        "out\n");
        return 2;
    } else if (o->mask_flags && !o->sections[3] && !o->sections[4]) {
        fprintf(stderr, "bench/attention: --seq, --ranks, --docs, --window and --seed set section "
                        "(d), and --seq, --ranks and --window (e); --section leaves them out\n");
        return 2;
    }
    if ((o->sections[3] || (o->sections[4] && o->seq_given)) && o->seq % o->ranks) {
        fprintf(stderr, "bench/attention: --seq %lld is not divisible by --ranks %d\n",
                (long long)o->seq, o->ranks);
        return 2;
    }
    if (o->sections[4] && o->ranks > MAX_P) {
        fprintf(stderr, "bench/attention: (e) runs at most %d ranks; --ranks %d\n", MAX_P,
                o->ranks);
        return 2;
    }
    return -1;
}

/* o->docs (--docs) as lengths summing to o->seq: 1 and a new *lens of
 * *count (with *mean the drawn ones' mean, 0 for a list), 1 and NULL with
 * no --docs, else 0 with a message. */
static int docs_resolve(const bench_opts *o, int64_t **lens, int64_t *count, double *mean) {
    const char *v = o->docs;
    *lens = NULL;
    *count = 0;
    *mean = 0;
    if (!v) return 1;
    if (!strncmp(v, "random:", 7)) {
        char *end = NULL;
        errno = 0;
        const double m = strtod(v + 7, &end);
        if (end == v + 7 || *end || errno || !(m >= 1 && m <= 1e12)) {
            fprintf(stderr, NAME ": --docs random:MEAN takes a mean length of at least 1 token; "
                    "got '%s'\n", v);
            return 0;
        }
        *mean = m;
        *lens = ex_docs_draw(m, o->seed + 4, 1, o->seq, count);
        if (!*lens) fprintf(stderr, NAME ": out of memory for --docs\n");
        return *lens != NULL;
    }
    if (!ex_docs_parse_list(v, lens, count)) return 0;
    int64_t sum = 0;
    for (int64_t i = 0; i < *count; i++) sum += (*lens)[i];
    if (sum != o->seq) {
        fprintf(stderr, NAME ": --docs lengths sum to %lld, not --seq %lld\n", (long long)sum,
                (long long)o->seq);
        free(*lens);
        *lens = NULL;
        return 0;
    }
    return 1;
}


int main(int argc, char **argv) {
    bench_opts o = {.backend = DT_BACKEND_AUTO, .sections = {1, 1, 1, 0}, .passes = {1, 1},
                    .dependent = 1, .persistent = 1, .producer = 1, .copies = 1,
                    .comm_ctas = -1, .group = 1, .seq = 65536, .ranks = 8, .seed = 1};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    int64_t *doc_lens = NULL, doc_count = 0;
    double doc_mean = 0;
    if (o.sections[3] && !docs_resolve(&o, &doc_lens, &doc_count, &doc_mean)) return 2;
    if (!o.copies) setenv("DT_LOCAL_COPIES", "0", 1);
    g_dependent = o.dependent;
    g_persistent = o.persistent;
    g_producer = o.producer;
    g_comm_ctas = o.comm_ctas;
    g_group = o.group;
    if (o.iters == 0) o.iters = o.quick ? 2 : 5;
    bench_pass passes[PASS_COUNT];   /* the selected ones, in order */
    int npass = 0;
    for (int k = 0; k < PASS_COUNT; k++)
        if (o.passes[k]) passes[npass++] = (bench_pass)k;

    /* A launch first: it names the backend and fails early if it is not
     * available here. */
    dt_status st = launch(2, noop_rank, NULL, &o);
    if (st != DT_SUCCESS) die("dt_launch", st);
    const int gpu = g_backend_used == DT_BACKEND_CUDA;
    const char *be = dt_backend_kind_name(g_backend_used);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char model[256], date[32], pass_list[32] = "", pass_json[32] = "";
    cpu_model(model, sizeof model);
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%d", &tmv);
    for (int q = 0; q < npass; q++) {
        size_t n = strlen(pass_list), m = strlen(pass_json);
        snprintf(pass_list + n, sizeof pass_list - n, "%s%s", q ? "," : "", pass_name(passes[q]));
        snprintf(pass_json + m, sizeof pass_json - m, "%s\"%s\"", q ? ", " : "",
                 pass_name(passes[q]));
    }
    FILE *out = stdout;
    char comm_ctas_json[16] = "null";   /* not given: the backend's default */
    if (o.comm_ctas >= 0) snprintf(comm_ctas_json, sizeof comm_ctas_json, "%d", o.comm_ctas);

    if (o.json)
        fprintf(out, "{\n  \"bench\": \"attention\", \"date\": \"%s\", \"backend\": \"%s\", "
                     "\"cores\": %ld, \"cpu\": \"%s\", \"iters\": %d, \"quick\": %s, "
                     "\"passes\": [%s], \"dependent\": %s, \"rows_waits\": %s, \"persistent\": %d, "
                     "\"producer\": %d, \"copies\": %s, \"comm_ctas\": %s, \"group\": %d,\n",
                date, be, cores, model, o.iters, o.quick ? "true" : "false", pass_json,
                o.dependent ? "true" : "false", o.dependent == 2 ? "true" : "false",
                o.persistent, o.producer,
                o.copies ? "true" : "false", comm_ctas_json, o.group);
    if (o.json)
        fprintf(out, "  \"notes\": [\"ranks are threads of one process; with fewer cores than "
                     "ranks they contend for the cores\", \"OpenBLAS runs one thread per call\", "
                     "\"pass fwd times dt_attention_forward; pass bwd times "
                     "dt_attention_backward alone, its forward run once per rank outside the "
                     "timed region\", \"tflops counts 4*B*H*S*S*D flops for fwd and 2.5x that "
                     "for bwd, halved for causal\", "
                     "\"cpu_max_ms and cpu_sum_ms are per-rank thread CPU times of the timed "
                     "call\", \"critical_pairs and total_pairs are computed from dt_attn_pairs, "
                     "not measured, and are the same for fwd and bwd\"],\n");
    else if (!o.sections[0] && !o.sections[1] && !o.sections[2])   /* (d) alone: nothing timed */
        fprintf(out, "bench/attention  %s  backend %s  %ld cores (%s)\n", date, be, cores, model);
    else {
        fprintf(out, "bench/attention  %s  backend %s  %ld cores (%s)\n"
                     "timing: CLOCK_MONOTONIC, 1 warmup + %d iterations, median; OpenBLAS 1 thread "
                     "per call\n"
                     "passes: %s\n",
                date, be, cores, model, o.iters, pass_list);
        if (gpu)
            fprintf(out, "CUDA: dependent launches %s (--dependent); wgmma "
                         "forward %s (--persistent)\n", o.dependent ? "on" : "off",
                    (const char *[]){"a CTA per query tile", "persistent but beside the ring's "
                                     "transfers", "persistent"}[o.persistent]);
        if (gpu && o.comm_ctas > 0)
            fprintf(out, "CUDA: the communication stream's copies and adds in kernels of at most "
                         "%d CTAs (--comm-ctas)\n", o.comm_ctas);
        else if (gpu && o.comm_ctas == 0)
            fprintf(out, "CUDA: the communication stream's copies by the driver, its adds on as "
                         "many SMs as they get (--comm-ctas 0)\n");
        if (!o.copies)
            fprintf(out, "--copies 0: the local transport moves no data (DT_LOCAL_COPIES=0); "
                         "times only\n");
        if (o.group > 1)
            fprintf(out, "--group %d: the forward rings of (b) and (c) launch up to %d ring steps "
                         "at once, contiguous and zigzag (striped: a launch a step); a launch's "
                         "time on its first step\n", o.group, o.group);
        if (o.passes[PASS_FWD]) fprintf(out, "  fwd: dt_attention_forward\n");
        if (o.passes[PASS_BWD])
            fprintf(out, "  bwd: dt_attention_backward alone; its forward runs once per rank "
                         "before the warmup, untimed\n");
    }

    /* ---------------------------------------------------------------- (a) */
    if (o.sections[0]) {
        static const shape issue[3] = {{1, 16, 4096, 128}, {1, 16, 16384, 128}, {1, 32, 8192, 64}};
        static const shape cpu_scaled[3] = {{1, 2, 1024, 128}, {1, 2, 2048, 128}, {1, 4, 1024, 64}};
        static const shape quick[1] = {{1, 2, 256, 64}};
        const shape *shapes = issue;
        int nshapes = 3, scaled = 0;
        if (o.quick) shapes = quick, nshapes = 1, scaled = 1;
        else if (o.shapes == 1 || (o.shapes == 0 && !gpu)) shapes = cpu_scaled, scaled = 1;
        static const dt_dtype dtypes[3] = {DT_BF16, DT_F32, DT_F16};
        if (!o.dtypes[0] && !o.dtypes[1] && !o.dtypes[2]) o.dtypes[0] = o.dtypes[1] = 1;
        static const dt_attn_mask masks[2] = {DT_ATTN_CAUSAL, DT_ATTN_FULL};
        if (o.json) fprintf(out, "  \"kernel\": [\n");
        else {
            fprintf(out, "\n(a) attention kernel throughput: one single-device call per shape, "
                         "dtype, mask and pass\n"
                         "    (mesh NULL), H_kv = H; pass fwd: dt_attention_forward, bwd: "
                         "dt_attention_backward\n"
                         "    MEASURED: median wall time per call; TFLOPS = flops / time, flops "
                         "= 4*B*H*S*S*D for fwd,\n"
                         "      2.5x that (10*B*H*S*S*D) for bwd, halved for causal\n");
            if (scaled)
                fprintf(out, "    NOTE: %s shapes, not the issue's (B=1,H=16,S=4096|16384,D=128; "
                             "B=1,H=32,S=8192,D=64):\n    on the %s backend those are too slow for a "
                             "routine run; --shapes full runs them\n",
                        o.quick ? "--quick" : "scaled-down", be);
            fprintf(out, "\n    %-22s %-22s %-4s %-5s %-7s %10s %9s\n", "shape (B,H,S,D)",
                    "stands for", "pass", "dtype", "mask", "ms", "TFLOPS");
        }
        int first = 1;
        for (int q = 0; q < npass; q++)
            for (int s = 0; s < nshapes; s++)
                for (int m = 0; m < 2; m++)
                    for (int d = 0; d < 3; d++) {
                        if (!o.dtypes[d]) continue;
                        kernel_case *k = calloc(1, sizeof *k);
                        if (!k) die("calloc", DT_ERR_OUT_OF_MEMORY);
                        k->s = shapes[s];
                        k->from = o.quick ? shapes[s] : issue[s];
                        k->scaled = scaled;
                        k->dtype = dtypes[d];
                        k->mask = masks[m];
                        k->pass = passes[q];
                        k->iters = o.iters;
                        st = launch(2, rank_kernel, k, &o);
                        if (st != DT_SUCCESS) die(pass_call(k->pass), st);
                        k->median_s = ex_median(k->t, k->iters);
                        k->tflops = attn_flops(k->s, k->mask, k->pass) / k->median_s / 1e12;
                        char sh[64], fr[64];
                        snprintf(sh, sizeof sh, "%lld,%lld,%lld,%lld", (long long)k->s.B,
                                 (long long)k->s.H, (long long)k->s.S, (long long)k->s.D);
                        snprintf(fr, sizeof fr, "%lld,%lld,%lld,%lld", (long long)k->from.B,
                                 (long long)k->from.H, (long long)k->from.S,
                                 (long long)k->from.D);
                        if (o.json)
                            fprintf(out, "%s    {\"pass\": \"%s\", \"B\": %lld, \"H\": %lld, "
                                         "\"S\": %lld, \"D\": %lld, \"stands_for\": [%s], "
                                         "\"scaled\": %s, \"dtype\": \"%s\", \"causal\": %s, "
                                         "\"median_ms\": %.4f, \"tflops\": %.6f}",
                                    first ? "" : ",\n", pass_name(k->pass), (long long)k->s.B,
                                    (long long)k->s.H, (long long)k->s.S, (long long)k->s.D, fr,
                                    k->scaled ? "true" : "false", dt_dtype_name(k->dtype),
                                    k->mask == DT_ATTN_CAUSAL ? "true" : "false",
                                    1e3 * k->median_s, k->tflops);
                        else
                            fprintf(out, "%s    %-22s %-22s %-4s %-5s %-7s %10.2f %9.4f\n",
                                    q > 0 && s == 0 && m == 0 && d == 0 ? "\n" : "", sh,
                                    k->scaled ? fr : "(itself)", pass_name(k->pass),
                                    dt_dtype_name(k->dtype),
                                    k->mask == DT_ATTN_CAUSAL ? "causal" : "none",
                                    1e3 * k->median_s, k->tflops);
                        fflush(out);
                        first = 0;
                        free(k);
                    }
        if (o.json) fprintf(out, "\n  ],\n");
    }

    /* ------------------------------------------------------------ (b), (c) */
    static const int Ps[3] = {2, 4, 8};
    const int C = o.tokens_per_rank ? o.tokens_per_rank : o.quick ? 64 : gpu ? 4096 : 512;
    const int64_t RB = 1, RH = o.quick ? 2 : gpu ? 16 : 4, RD = o.quick ? 64 : 128;
    const dt_dtype rdt = gpu ? DT_BF16 : DT_F32;
    ring_case *rings[PASS_COUNT][3][3] = {{{NULL}}};
    if (o.sections[1] || o.sections[2]) {
        for (int q = 0; q < npass; q++)
            for (int p = 0; p < 3; p++)
                for (int r = 0; r < 3; r++) {
                    ring_case *c = calloc(1, sizeof *c);
                    if (!c) die("calloc", DT_ERR_OUT_OF_MEMORY);
                    *c = (ring_case){.P = Ps[p], .B = RB, .H = RH, .D = RD, .C = C,
                                     .order = orders[r], .dtype = rdt, .pass = passes[q],
                                     .iters = o.iters};
                    st = launch(Ps[p], rank_ring, c, &o);
                    if (st != DT_SUCCESS) die(pass_call(c->pass), st);
                    ring_summarise(c);
                    rings[q][p][r] = c;
                }
    }
    if (o.sections[1]) {
        if (o.json) fprintf(out, "  \"ring\": [\n");
        else {
            fprintf(out, "\n(b) ring balance: causal distributed attention, B=%lld H=%lld D=%lld %s, "
                         "C = %d tokens per rank, S = P*C;\n"
                         "    one table per pass\n",
                    (long long)RB, (long long)RH, (long long)RD, dt_dtype_name(rdt), C);
            fprintf(out, "    MEASURED wall: slowest rank's wall time of the call (starts "
                         "aligned by a barrier)\n"
                         "    MEASURED cpu-max: the largest per-rank thread CPU time of its "
                         "call = the ring's critical\n"
                         "      path if every rank had its own core%s\n"
                         "    COMPUTED pairs: critical path in causal query-key pairs per "
                         "(batch, head) from dt_attn_pairs,\n"
                         "      sum over steps of the busiest rank (the kernel works in tiles, "
                         "so it computes a little more).\n"
                         "      The same for fwd and bwd (the backward visits the same blocks "
                         "with the same masks on the\n"
                         "      same steps): printed once, in the first table.\n"
                         "    MEASURED steps (dt_attention_options.timing, each rank's own "
                         "marks around its block kernels):\n"
                         "      kernels = sum over steps of the slowest rank's blocks; waits = "
                         "the largest per-rank sum of the\n"
                         "      time between one step's kernels and the next (transfers not "
                         "hidden by the kernels); after each table,\n"
                         "      with the largest per-rank time before step 0's kernels (the "
                         "agreement, the set-up, the\n"
                         "      backward's delta pass) and after the last step's (its last "
                         "transfers and stores)\n",
                    gpu ? " (not meaningful on a GPU: kernels run asynchronously)" : "");
            if (!gpu && cores < 8)
                fprintf(out, "    NOTE: ranks are threads; this machine has %ld cores, so at P > %ld "
                             "the ranks contend for them and\n      wall time tracks total work, "
                             "not the critical path; cpu-max is the balance measure there.\n",
                        cores, cores);
        }
        int first = 1;
        for (int q = 0; q < npass; q++) {
            const int with_pairs = q == 0;
            if (!o.json) {
                fprintf(out, "\n    pass %s: %s%s\n", pass_name(passes[q]), pass_call(passes[q]),
                        passes[q] == PASS_BWD ? " (its forward run once per rank, untimed)" : "");
                if (with_pairs) {
                    fprintf(out, "    %-3s %-10s %9s %9s %12s | %9s %9s %9s | %7s\n", "P", "order",
                            "wall ms", "cpu-max", "pairs", "wall", "cpu-max", "pairs", "theory");
                    fprintf(out, "    %-3s %-10s %9s %9s %12s | %29s | %7s\n", "", "", "", "ms",
                            "(crit)", "ratio contiguous / this order", "2(1-1/2P)");
                } else {
                    fprintf(out, "    %-3s %-10s %9s %9s | %9s %9s | (pairs, theory: as in "
                                 "the %s table)\n",
                            "P", "order", "wall ms", "cpu-max", "wall", "cpu-max",
                            pass_name(passes[0]));
                    fprintf(out, "    %-3s %-10s %9s %9s | %19s |\n", "", "", "", "ms",
                            "ratio contig./this");
                }
            }
            for (int p = 0; p < 3; p++)
                for (int r = 0; r < 3; r++) {
                    const ring_case *c = rings[q][p][r], *c0 = rings[q][p][0];
                    double theory = 2.0 * (1.0 - 1.0 / (2.0 * c->P));
                    double rw = c0->wall_s / c->wall_s, rcpu = c0->cpu_max_s / c->cpu_max_s;
                    double rp = (double)c0->crit_pairs / (double)c->crit_pairs;
                    if (o.json)
                        fprintf(out, "%s    {\"pass\": \"%s\", \"P\": %d, \"order\": \"%s\", "
                                     "\"C\": %d, \"B\": %lld, \"H\": %lld, \"D\": %lld, "
                                     "\"dtype\": \"%s\", \"wall_ms\": %.4f, \"cpu_max_ms\": %.4f, "
                                     "\"cpu_sum_ms\": %.4f, \"critical_pairs\": %lld, "
                                     "\"total_pairs\": %lld, \"ratio_wall\": %.4f, "
                                     "\"ratio_cpu_max\": %.4f, \"ratio_pairs\": %.4f, "
                                     "\"theory\": %.4f, \"steps_crit_ms\": %.4f, "
                                     "\"waits_max_ms\": %.4f, \"before_max_ms\": %.4f, "
                                     "\"after_max_ms\": %.4f, \"b2b_ms\": %.4f}",
                                first ? "" : ",\n", pass_name(c->pass), c->P,
                                dt_order_name(c->order), C, (long long)RB, (long long)RH,
                                (long long)RD, dt_dtype_name(rdt), 1e3 * c->wall_s,
                                1e3 * c->cpu_max_s, 1e3 * c->cpu_sum_s, (long long)c->crit_pairs,
                                (long long)c->total_pairs, rw, rcpu, rp, theory,
                                1e3 * c->steps_crit_s, 1e3 * c->waits_max_s,
                                1e3 * c->before_max_s, 1e3 * c->after_max_s, 1e3 * c->b2b_s);
                    else if (with_pairs)
                        fprintf(out, "    %-3d %-10s %9.2f %9.2f %12lld | %9.3f %9.3f %9.3f | "
                                     "%7.3f\n",
                                c->P, dt_order_name(c->order), 1e3 * c->wall_s,
                                1e3 * c->cpu_max_s, (long long)c->crit_pairs, rw, rcpu, rp,
                                theory);
                    else
                        fprintf(out, "    %-3d %-10s %9.2f %9.2f | %9.3f %9.3f |\n", c->P,
                                dt_order_name(c->order), 1e3 * c->wall_s, 1e3 * c->cpu_max_s, rw,
                                rcpu);
                    first = 0;
                }
            if (!o.json) {
                print_ring_figures(out, "steps: kernels ms / waits ms", "%.2f / %.2f", 17,
                                   rings[q], offsetof(ring_case, steps_crit_s),
                                   offsetof(ring_case, waits_max_s));
                print_ring_figures(out, "before step 0 / after: ms", "%.2f / %.2f", 17,
                                   rings[q], offsetof(ring_case, before_max_s),
                                   offsetof(ring_case, after_max_s));
                print_ring_figures(out, "back to back: ms per call", "%.2f (wall %.2f)", 19,
                                   rings[q], offsetof(ring_case, b2b_s),
                                   offsetof(ring_case, wall_s));
            }
        }
        if (o.json) fprintf(out, "\n  ]%s\n", o.sections[2] || o.sections[3] ? "," : "");
    }
    if (o.sections[2]) {
        if (!o.json) {
            fprintf(out, "\n(c) ring cost: the distributed causal call's work summed over ranks "
                         "vs one single-device call\n"
                         "    of the same pass on the whole sequence (local tensors, mesh NULL), "
                         "same B, H, D, dtype\n"
                         "    MEASURED single: median wall time of the single-device call (one "
                         "thread)\n"
                         "    MEASURED work: the ranks' work on the ring, from (column 'from'):\n"
                         "      cpu time        the sum over ranks of each rank's thread CPU time "
                         "of its call (CPU)\n"
                         "      kernel events   the sum over ranks and steps of the block kernels' "
                         "time (CUDA events;\n"
                         "                      a GPU per rank)\n"
                         "      devices x wall  the call's wall time times the GPUs the ranks "
                         "share: all the ring's\n"
                         "                      work ran on them within it (an upper bound; "
                         "ranks sharing GPUs)\n"
                         "    medians over iterations; overhead = work / single - 1: ring "
                         "transfers, per-step setup,\n"
                         "    smaller blocks\n"
                         "    b2b (CUDA): the same from the calls back to back, the iterations' "
                         "calls enqueued one\n"
                         "    after another and one read-back after the last (per call; a "
                         "pipeline's figure: a call's\n"
                         "    host work overlaps the device's on the call before): single b2b, "
                         "work b2b (devices x\n"
                         "    b2b where ranks share GPUs, the kernel events otherwise), overhead "
                         "b2b\n\n");
            fprintf(out, "    %-3s %-6s %-10s %-4s %11s %11s %-15s %9s %11s %11s %9s\n", "P",
                    "S", "order", "pass", "single ms", "work ms", "from", "overhead",
                    "single b2b", "work b2b", "over b2b");
        } else {
            fprintf(out, "  \"ring_cost\": [\n");
        }
        int first = 1;
        for (int q = 0; q < npass; q++)
            for (int p = 0; p < 3; p++) {
                kernel_case *k = calloc(1, sizeof *k);
                if (!k) die("calloc", DT_ERR_OUT_OF_MEMORY);
                k->s = (shape){RB, RH, (int64_t)Ps[p] * C, RD};
                k->dtype = rdt;
                k->mask = DT_ATTN_CAUSAL;
                k->pass = passes[q];
                k->iters = o.iters;
                k->b2b = gpu;
                st = launch(2, rank_kernel, k, &o);
                if (st != DT_SUCCESS) die(pass_call(k->pass), st);
                k->median_s = ex_median(k->t, k->iters);
                for (int r = 0; r < 3; r++) {
                    const ring_case *c = rings[q][p][r];
                    const char *from;
                    double work = ring_work(c, gpu, c->wall_s, &from);
                    double over = work / k->median_s - 1.0;
                    /* b2b: CUDA only (on the CPU the work is CPU time) */
                    double work_b2b = gpu ? ring_work(c, gpu, c->b2b_s, &from) : NAN;
                    double over_b2b = work_b2b / k->b2b_s - 1.0;
                    char b2b[3][32] = {"-", "-", "-"};
                    if (gpu) {
                        snprintf(b2b[0], sizeof b2b[0], "%.2f", 1e3 * k->b2b_s);
                        snprintf(b2b[1], sizeof b2b[1], "%.2f", 1e3 * work_b2b);
                        snprintf(b2b[2], sizeof b2b[2], "%.1f%%", 100 * over_b2b);
                    }
                    if (o.json) {
                        fprintf(out, "%s    {\"pass\": \"%s\", \"P\": %d, \"S\": %lld, "
                                     "\"order\": \"%s\", \"single_ms\": %.4f, "
                                     "\"work_ms\": %.4f, \"work_from\": \"%s\", "
                                     "\"overhead\": %.4f",
                                first ? "" : ",\n", pass_name(k->pass), c->P, (long long)k->s.S,
                                dt_order_name(c->order), 1e3 * k->median_s, 1e3 * work, from,
                                over);
                        if (gpu)
                            fprintf(out, ", \"single_b2b_ms\": %.4f, \"work_b2b_ms\": %.4f, "
                                         "\"overhead_b2b\": %.4f}",
                                    1e3 * k->b2b_s, 1e3 * work_b2b, over_b2b);
                        else
                            fprintf(out, ", \"single_b2b_ms\": null, \"work_b2b_ms\": null, "
                                         "\"overhead_b2b\": null}");
                    } else {
                        fprintf(out, "%s    %-3d %-6lld %-10s %-4s %11.2f %11.2f %-15s %8.1f%% "
                                     "%11s %11s %9s\n",
                                q > 0 && p == 0 && r == 0 ? "\n" : "", c->P, (long long)k->s.S,
                                dt_order_name(c->order), pass_name(k->pass), 1e3 * k->median_s,
                                1e3 * work, from, 100 * over, b2b[0], b2b[1], b2b[2]);
                    }
                    first = 0;
                }
                free(k);
            }
        if (o.json) fprintf(out, "\n  ]%s\n", o.sections[3] ? "," : "");
    }
    if (o.sections[3]) mask_work(out, &o, doc_lens, doc_count, doc_mean);
    free(doc_lens);
    if (o.sections[4]) {
        /* (e): on a GPU the issue's sequences, timed; on the CPU a shorter
         * one timed and the issue's run once each with a window, so that
         * little is computed: every ring hop and all-to-all still moves
         * (the bytes do not depend on the mask), the times are not the
         * full mask's. --seq: that one S (with --window); --quick: tiny. */
        ul_rows rows = {.P = o.ranks, .B = 1, .D = gpu ? 128 : 64,
                        .dtype = gpu ? DT_BF16 : DT_F32};
        rows.H = (int64_t)o.ranks * ((8 + o.ranks - 1) / o.ranks);   /* P | H, at least 8 */
        static const int64_t issue[3] = {32768, 65536, 131072};
        if (o.seq_given || o.quick) {
            rows.S[rows.n] = o.seq_given ? o.seq : 32 * o.ranks;
            rows.window[rows.n] = o.window;
            rows.iters[rows.n++] = o.iters;
            if (o.quick) rows.D = 8;
        } else {
            for (int i = 0; !gpu && i < 2; i++) {
                rows.S[rows.n] = ul_cpu_seqs[i];
                rows.window[rows.n] = 0;
                rows.iters[rows.n++] = o.iters;
            }
            for (int i = 0; i < 3; i++) {
                rows.S[rows.n] = issue[i];
                rows.window[rows.n] = gpu ? 0 : UL_CPU_WINDOW;
                rows.iters[rows.n++] = gpu ? o.iters : 1;
            }
        }
        ulysses_section(out, &o, &rows, passes, npass, gpu, cores,
                        o.json && (o.sections[1] || o.sections[2] || o.sections[3]));
    }
    if (o.json) {
        /* Close the object whatever sections ran (a trailing member keeps
         * the commas simple). */
        fprintf(out, "%s  \"complete\": true\n}\n",
                o.sections[1] || o.sections[2] || o.sections[3] || o.sections[4] ? "," : "");
    }
    for (int q = 0; q < PASS_COUNT; q++)
        for (int p = 0; p < 3; p++)
            for (int r = 0; r < 3; r++) free(rings[q][p][r]);
    return 0;
}
