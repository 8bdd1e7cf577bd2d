/* examples/striped_attention.c — Striped Attention: the permutation, then the
 * attention itself over a ring of P ranks.
 *
 * With P ranks, striping puts token i on rank i mod P, so that under a causal
 * mask every rank does about the same work on every ring step. This example
 * shows the permutation that does it, then runs it, on P ranks of this
 * process:
 *   1. the token order after permute_striped, which tokens each rank holds
 *      under Shard(0, striped), and the round trip back;
 *   2. a [S, 4] tensor with value token*10 + hidden permuted on dim 0: every
 *      hidden vector travels intact with its token;
 *   3. striped sharding by the library (dt_tensor_shard with the striped
 *      order) gives every rank the same tokens as contiguous sharding of the
 *      permuted tensor;
 *   4. distributed attention (dt_attention_forward) on q [B, S, H, D] and
 *      k, v [B, S, H_kv, D] sharded Shard(1, order) over the ring, o and lse
 *      gathered to rank 0 and checked against a double-precision reference
 *      on the full sequence: PASS or FAIL; with the measured time of each
 *      ring step's block kernels on the slowest rank and the waits between
 *      steps (dt_attention_options.timing); and the bytes each rank moved,
 *      read from the mesh dims' communicators' counters (collectives/comm.h)
 *      and checked against the formula: PASS or FAIL. With --ulysses U the
 *      mesh is (P/U ring) x (U Ulysses), the sequence sharded over the ring
 *      dim by the order and then contiguous over the Ulysses dim, and
 *      dt_attention_options.a2a_dim names the Ulysses dim: the call moves
 *      the sequence's shards to the heads by all-to-alls and runs the ring
 *      over the P/U ranks left (U = P: Ulysses alone);
 *   5. the work of every rank on every ring step (query-key pairs that the
 *      mask allows, from dt_attn_pairs) for contiguous, striped and zigzag
 *      sharding, and the critical path of each: why striping is faster
 *      (with --ulysses, for the ring of P/U ranks).
 * The mask is attention/mask.h's rule: causal or none, and optionally packed
 * documents (--docs: a query attends keys of its own document only) and a
 * sliding window (--window W: keys less than W positions away); (4) and (5)
 * both follow it, so (5) shows how each order balances packed documents.
 * Optionally an SVG heat map of (5) (--svg) and a dump of q, k, v, o in
 * global token order, with the documents and the window, for checking
 * elsewhere (--dump).
 *
 * Exit status: 0 PASS, 1 FAIL or a library error, 2 bad flags or shapes,
 * 3 the library returned DT_ERR_NOT_SUPPORTED (--backend cuda without a GPU
 * or a CUDA build).
 *
 * Run: make run   or   build/examples/striped_attention --ranks 4 --seq 256 --order striped
 *      build/examples/striped_attention --ranks 8 --seq 256 --heads 4 --ulysses 2
 * Test: tests/test_examples.c (make test).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "attention/attention.h"
#include "dtensor/docs.h"
#include "dtensor/dtensor.h"

#define NAME "striped_attention"
#include "example_util.h"

#define HIDDEN 4
#define MAX_SEQ 4096
#define MAX_RANKS 64

typedef struct demo {
    int ranks, seq;
    float striped[DT_MAX_WORLD_SIZE][MAX_SEQ];    /* tokens each rank holds, striped shard */
    float permuted[DT_MAX_WORLD_SIZE][MAX_SEQ];   /* contiguous shard of the permuted tensor */
    int local_len;
} demo;

static void fail(const char *what, dt_status st) {
    if (st == DT_ERR_NOT_SUPPORTED) {
        fprintf(stderr, "striped_attention: not supported here (DT_ERR_NOT_SUPPORTED): %s: %s\n",
                what, dt_last_error());
        exit(3);
    }
    fprintf(stderr, "striped_attention: %s failed: %s: %s\n", what, dt_status_name(st),
            dt_last_error());
    exit(1);
}

/* The tokens 0..S-1 as a local fp32 tensor [S]. */
static dt_status token_ids(dt_context *ctx, int seq, dt_tensor **out) {
    int64_t shape[1] = {seq};
    DT_TRY(dt_tensor_create(ctx, NULL, DT_F32, 1, shape, NULL, out));
    float *ids = malloc((size_t)seq * sizeof *ids);
    if (!ids) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < seq; i++) ids[i] = (float)i;
    dt_status st = dt_tensor_set_local(*out, ids, (size_t)seq * sizeof *ids);
    free(ids);
    return st;
}

/* Every rank: shard the token ids striped, and shard the permuted ids
 * contiguously; record what each rank holds. */
static dt_status rank_demo(dt_context *ctx, void *arg) {
    demo *d = arg;
    int rank = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *ids = NULL, *perm = NULL, *a = NULL, *b = NULL;
    dt_status st;
    int sizes[1] = {d->ranks};
    const char *names[1] = {"sp"};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, names, &mesh), out);
    if (rank == 0) {
        DT_TRY_GOTO(st, token_ids(ctx, d->seq, &ids), out);
        DT_TRY_GOTO(st, dt_tensor_permute_striped(ids, 0, d->ranks, &perm), out);
    }
    dt_layout striped = dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED));
    dt_layout contiguous = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, ids, &striped, &a), out);
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, perm, &contiguous, &b), out);
    if (rank == 0) d->local_len = (int)dt_tensor_local_numel(a);   /* every rank holds as many */
    DT_TRY_GOTO(st, dt_tensor_get_local(a, d->striped[rank], dt_tensor_local_bytes(a)), out);
    DT_TRY_GOTO(st, dt_tensor_get_local(b, d->permuted[rank], dt_tensor_local_bytes(b)), out);
out:
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_tensor_destroy(perm);
    dt_tensor_destroy(ids);
    dt_mesh_destroy(mesh);
    return st;
}

/* One rank: the permutation itself, printed. */
static dt_status show_permutation(dt_context *ctx, void *arg) {
    demo *d = arg;
    int seq = d->seq, p = d->ranks, bad = 0;
    dt_tensor *ids = NULL, *perm = NULL, *back = NULL, *x = NULL, *xp = NULL;
    float *buf = malloc((size_t)seq * HIDDEN * sizeof *buf);
    dt_status st = buf ? DT_SUCCESS : dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != DT_SUCCESS) return st;

    DT_TRY_GOTO(st, token_ids(ctx, seq, &ids), out);
    DT_TRY_GOTO(st, dt_tensor_permute_striped(ids, 0, p, &perm), out);
    DT_TRY_GOTO(st, dt_tensor_unpermute_striped(perm, 0, p, &back), out);

    DT_TRY_GOTO(st, dt_tensor_get_local(perm, buf, (size_t)seq * sizeof *buf), out);
    printf("1. %d tokens on %d ranks, striped: token i lives on rank i mod %d\n", seq, p, p);
    printf("   permute_striped order: ");
    for (int i = 0; i < seq; i++) printf("%s%d", i ? " " : "", (int)buf[i]);
    printf("\n");
    for (int i = 0; i < seq; i++) {
        int n = seq / p;
        bad += (int)buf[i] != (i % n) * p + i / n;
    }
    DT_TRY_GOTO(st, dt_tensor_get_local(back, buf, (size_t)seq * sizeof *buf), out);
    int round_trip = 1;
    for (int i = 0; i < seq; i++) round_trip &= (int)buf[i] == i;
    printf("   unpermute_striped gives back 0..%d: %s\n", seq - 1, round_trip ? "yes" : "NO");
    bad += !round_trip;

    /* 2. A [S, 4] tensor: value token*10 + hidden. */
    int64_t shape[2] = {seq, HIDDEN};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 2, shape, NULL, &x), out);
    for (int t = 0; t < seq; t++)
        for (int h = 0; h < HIDDEN; h++) buf[t * HIDDEN + h] = (float)(t * 10 + h);
    DT_TRY_GOTO(st, dt_tensor_set_local(x, buf, (size_t)seq * HIDDEN * sizeof *buf), out);
    DT_TRY_GOTO(st, dt_tensor_permute_striped(x, 0, p, &xp), out);
    DT_TRY_GOTO(st, dt_tensor_get_local(xp, buf, (size_t)seq * HIDDEN * sizeof *buf), out);
    printf("\n2. a [%d, %d] tensor with value token*10 + hidden, permuted on dim 0:\n", seq, HIDDEN);
    int intact = 1;
    for (int i = 0; i < seq; i++) {
        int token = (int)buf[i * HIDDEN] / 10;
        if (i < 8 || i >= seq - 2) {
            printf("   row %2d:", i);
            for (int h = 0; h < HIDDEN; h++) printf(" %5g", buf[i * HIDDEN + h]);
            printf("   (token %d)\n", token);
        } else if (i == 8) {
            printf("   ...\n");
        }
        for (int h = 0; h < HIDDEN; h++) intact &= buf[i * HIDDEN + h] == (float)(token * 10 + h);
    }
    printf("   every hidden vector intact: %s\n", intact ? "yes" : "NO");
    bad += !intact;
    if (bad) st = dt_error(DT_ERR_INTERNAL, "the permutation demo found %d wrong values", bad);
out:
    free(buf);
    dt_tensor_destroy(xp);
    dt_tensor_destroy(x);
    dt_tensor_destroy(back);
    dt_tensor_destroy(perm);
    dt_tensor_destroy(ids);
    return st;
}

/* ------------------------------------------------------------------------
 * 4. Distributed attention, checked against a double-precision reference.
 * ---------------------------------------------------------------------- */

typedef struct config {
    int ranks;
    int64_t batch, seq, heads, kv_heads, dim;
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    dt_backend_kind backend;
    uint64_t seed;
    float scale;               /* the softmax scale passed to the library: 1/sqrt(D) */
    const char *svg, *dump;
    int backward;              /* --backward: also the gradients, from dout of seed N+3 */
    int group;                 /* --group: the forward's ring steps per launch */
    const char *docs;          /* --docs as given; NULL: one document per batch row */
    int64_t *doc_lens;         /* the documents' lengths (docs.h): summing to S, the same in
                                  every row, or to B*S, a list per row; NULL with no --docs */
    int64_t doc_count;
    int docs_per_row;          /* 1: doc_lens is a list per row (B*S), 0: one list for all */
    double docs_mean;          /* --docs random:MEAN; 0 for a list */
    int64_t window;            /* --window: |i - j| < window; 0 none */
    int ulysses;               /* --ulysses U: the Ulysses mesh dim's ranks; 0 none */
} config;

/* The ranks of the ring: P, or P/U with --ulysses U. */
static int ring_ranks(const config *c) {
    return c->ulysses ? c->ranks / c->ulysses : c->ranks;
}

typedef struct attn_run {
    const config *cfg;
    /* Written by rank 0, read by the main thread after dt_launch returns. */
    float *o;                  /* [B, S, H, D] gathered, global token order, widened to fp32 */
    float *lse;                /* [B, H, S] gathered */
    float *q, *k, *v;          /* with --dump: the gathered inputs, widened to fp32 */
    float *dout, *dq, *dk, *dv;/* with --backward: the gradients (and with --dump dout) */
    dt_backend_kind backend;   /* the backend the ranks ran on */
    double seconds[MAX_RANKS]; /* wall time of dt_attention_forward on each rank */
    double backward_seconds[MAX_RANKS];
    dt_attention_timing steps[MAX_RANKS]; /* each rank's forward, per ring step */
    /* Each rank's communication counters (collectives/comm.h) of the forward
     * [0] and the backward [1] calls: of its mesh dims' communicators
     * [pass][rank][mesh dim], and of the world's [pass][rank]. */
    dt_comm_counters dims[2][MAX_RANKS][2], world[2][MAX_RANKS];
} attn_run;

/* The mesh of a run: P ranks on one dim "sp"; with --ulysses U < P, the ring
 * dim of R = P/U ranks, then the Ulysses dim of U ("ring", "ulysses");
 * U = P: one dim "ulysses". a2a: the Ulysses dim (-1: none); ring: the
 * ring's dim (-1: none, U = P). The Layout of q, k, v: the sequence (dim 1)
 * over the ring dim by the order, then contiguous over the Ulysses dim. */
typedef struct run_mesh {
    int ndim, sizes[2];
    const char *names[2];
    int a2a, ring;
    dt_layout layout;
} run_mesh;

static run_mesh run_mesh_of(const config *c) {
    run_mesh m = {1, {c->ranks, 1}, {"sp", NULL}, -1, 0, dt_layout_1d(dt_shard(1, c->order))};
    if (c->ulysses && c->ulysses == c->ranks) {
        m.names[0] = "ulysses";
        m.a2a = 0;
        m.ring = -1;
    } else if (c->ulysses) {
        m.ndim = 2;
        m.sizes[0] = ring_ranks(c);
        m.sizes[1] = c->ulysses;
        m.names[0] = "ring";
        m.names[1] = "ulysses";
        m.a2a = 1;
        m.layout = dt_layout_2d(dt_shard(1, c->order), dt_shard(1, DT_ORDER_CONTIGUOUS));
    }
    return m;
}

/* Zero the counters of the mesh dims' and the world's communicators. */
static void counters_reset(dt_context *ctx, const dt_mesh *mesh, int ndim) {
    for (int m = 0; m < ndim; m++) dt_comm_counters_reset(dt_mesh_comm(mesh, m));
    dt_comm_counters_reset(dt_context_comm(ctx));
}

/* Read them into dims[m] and *world. */
static dt_status counters_read(dt_context *ctx, const dt_mesh *mesh, int ndim,
                               dt_comm_counters dims[2], dt_comm_counters *world) {
    for (int m = 0; m < ndim; m++) DT_TRY(dt_comm_counters_get(dt_mesh_comm(mesh, m), &dims[m]));
    return dt_comm_counters_get(dt_context_comm(ctx), world);
}

/* Gather t to rank 0 and, there, widen it into *host. Collective. */
static dt_status gather_to_host(const dt_tensor *t, float **host) {
    dt_tensor *g = NULL;
    DT_TRY(dt_tensor_gather(t, 0, &g));
    dt_status st = g ? ex_to_host_f32(g, host) : DT_SUCCESS;
    dt_tensor_destroy(g);
    return st;
}

/* Every rank: its shards of q, k, v from the seeds, the ring forward, and
 * o, lse (and with --dump q, k, v) gathered to rank 0. */
static dt_status rank_attention(dt_context *ctx, void *arg) {
    attn_run *r = arg;
    const config *c = r->cfg;
    int rank = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL;
    dt_tensor *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    dt_status st;
    const run_mesh rm = run_mesh_of(c);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, rm.ndim, rm.sizes, rm.names, &mesh), out);
    const dt_layout lay = rm.layout;
    int64_t qshape[4] = {c->batch, c->seq, c->heads, c->dim};
    int64_t kshape[4] = {c->batch, c->seq, c->kv_heads, c->dim};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &v), out);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    opts.scale = c->scale;
    opts.group = c->group;
    opts.doc_lens = c->doc_lens;
    opts.doc_count = c->doc_count;
    opts.window = c->window;
    opts.a2a_dim = rm.a2a;   /* --ulysses: the Ulysses mesh dim; -1 without */
    /* Validates the call (dtype, backend, head dim) without touching
     * anything, so an unsupported configuration is named by the attention
     * code itself rather than by the first op that happens to refuse it. */
    size_t ws = 0;
    DT_TRY_GOTO(st, dt_attention_workspace_size(q, k, v, &opts, &ws), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(q, c->seed), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(k, c->seed + 1), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(v, c->seed + 2), out);
    opts.timing = &r->steps[rank];
    counters_reset(ctx, mesh, rm.ndim);
    double t0 = ex_now_s();
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);
    r->seconds[rank] = ex_now_s() - t0;
    DT_TRY_GOTO(st, counters_read(ctx, mesh, rm.ndim, r->dims[0][rank], &r->world[0][rank]), out);
    opts.timing = NULL;
    DT_TRY_GOTO(st, gather_to_host(o, &r->o), out);
    DT_TRY_GOTO(st, gather_to_host(lse, &r->lse), out);
    if (c->dump) {
        DT_TRY_GOTO(st, gather_to_host(q, &r->q), out);
        DT_TRY_GOTO(st, gather_to_host(k, &r->k), out);
        DT_TRY_GOTO(st, gather_to_host(v, &r->v), out);
    }
    if (c->backward) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &dout), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(dout, c->seed + 3), out);
        counters_reset(ctx, mesh, rm.ndim);
        t0 = ex_now_s();
        DT_TRY_GOTO(st, dt_attention_backward(q, k, v, o, lse, dout, &opts, &dq, &dk, &dv), out);
        r->backward_seconds[rank] = ex_now_s() - t0;
        DT_TRY_GOTO(st, counters_read(ctx, mesh, rm.ndim, r->dims[1][rank], &r->world[1][rank]),
                    out);
        DT_TRY_GOTO(st, gather_to_host(dq, &r->dq), out);
        DT_TRY_GOTO(st, gather_to_host(dk, &r->dk), out);
        DT_TRY_GOTO(st, gather_to_host(dv, &r->dv), out);
        if (c->dump) DT_TRY_GOTO(st, gather_to_host(dout, &r->dout), out);
    }
    if (rank == 0) r->backend = dt_context_backend(ctx);
out:
    dt_tensor_destroy(dv);
    dt_tensor_destroy(dk);
    dt_tensor_destroy(dq);
    dt_tensor_destroy(dout);
    dt_tensor_destroy(lse);
    dt_tensor_destroy(o);
    dt_tensor_destroy(v);
    dt_tensor_destroy(k);
    dt_tensor_destroy(q);
    dt_mesh_destroy(mesh);
    return st;
}

/* The full input as the dtype stores it, widened to double. */
static double *full_input(uint64_t seed, int64_t n, dt_dtype dtype) {
    double *x = malloc((size_t)n * sizeof *x);
    if (!x) return NULL;
    for (int64_t i = 0; i < n; i++) {
        x[i] = dt_value_round(dt_random_value(seed, (uint64_t)i), dtype);
    }
    return x;
}

/* The document of each token, [B, S]: its index in its row's list, from
 * the lengths alone (all 0 with no --docs). NULL when out of memory. */
static int64_t *doc_index(const config *c) {
    const int64_t B = c->batch, S = c->seq;
    int64_t *doc = malloc((size_t)(B * S) * sizeof *doc);
    if (!doc) return NULL;
    int64_t i = 0, left = c->doc_lens ? c->doc_lens[0] : B * S;   /* tokens left in document i */
    for (int64_t b = 0; b < B; b++) {
        if (!c->docs_per_row) i = 0, left = c->doc_lens ? c->doc_lens[0] : S;
        else if (b > 0) left = c->doc_lens[++i];   /* row b - 1 ended its last document */
        for (int64_t p = 0, n = 0; p < S; p++) {
            if (left == 0) left = c->doc_lens[++i], n++;
            doc[b * S + p] = n;
            left--;
        }
    }
    return doc;
}

/* The mask rule, written out: query i may attend key j of batch row b. */
static int allowed(const config *c, const int64_t *doc, int64_t b, int64_t i, int64_t j) {
    const int64_t S = c->seq;
    return doc[b * S + i] == doc[b * S + j] && (c->mask != DT_ATTN_CAUSAL || j <= i) &&
           (c->window == 0 || llabs(i - j) < c->window);
}

/* o [B, S, H, D] and lse [B, H, S] in double, from the definition:
 * o[b,i,h] = sum_j softmax_j(scale q[b,i,h].k[b,j,g]) v[b,j,g], g = h / (H / HKV),
 * over the keys j that allowed() gives query i (every row has one: itself).
 * Returns 0 when out of memory. */
static int reference(const config *c, const double *q, const double *k, const double *v,
                     double *o, double *lse) {
    const int64_t B = c->batch, S = c->seq, H = c->heads, G = c->kv_heads, D = c->dim;
    const int64_t group = H / G;
    const double scale = c->scale;
    double *w = malloc((size_t)S * sizeof *w), *acc = malloc((size_t)D * sizeof *acc);
    int64_t *doc = doc_index(c);
    if (!w || !acc || !doc) {
        free(w);
        free(acc);
        free(doc);
        return 0;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                const int64_t g = h / group;
                const double *qi = q + ((b * S + i) * H + h) * D;
                double mx = -INFINITY;
                for (int64_t j = 0; j < S; j++) {
                    w[j] = -INFINITY;
                    if (!allowed(c, doc, b, i, j)) continue;
                    const double *kj = k + ((b * S + j) * G + g) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                    w[j] = scale * dot;
                    if (w[j] > mx) mx = w[j];
                }
                double sum = 0;
                for (int64_t d = 0; d < D; d++) acc[d] = 0;
                for (int64_t j = 0; j < S; j++) {
                    if (w[j] == -INFINITY) continue;
                    const double p = exp(w[j] - mx);
                    const double *vj = v + ((b * S + j) * G + g) * D;
                    sum += p;
                    for (int64_t d = 0; d < D; d++) acc[d] += p * vj[d];
                }
                double *oi = o + ((b * S + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++) oi[d] = acc[d] / sum;
                lse[(b * H + h) * S + i] = mx + log(sum);
            }
    free(w);
    free(acc);
    free(doc);
    return 1;
}

/* dq, dk, dv in double from the definition (FlashAttention-2 form):
 * p = softmax row, dv[j] += p[i,j] dout[i], dp = dout[i].v[j],
 * ds = p (dp - rowsum(dout[i] * o[i])), dq[i] += scale ds k[j],
 * dk[j] += scale ds q[i]; dk and dv sum over the query heads of a kv head.
 * o is the reference output. Returns 0 when out of memory. */
static int reference_backward(const config *c, const double *q, const double *k, const double *v,
                              const double *o, const double *dout, double *dq, double *dk,
                              double *dv) {
    const int64_t B = c->batch, S = c->seq, H = c->heads, G = c->kv_heads, D = c->dim;
    const int64_t group = H / G;
    const double scale = c->scale;
    double *p = malloc((size_t)S * sizeof *p);
    int64_t *doc = doc_index(c);
    if (!p || !doc) {
        free(p);
        free(doc);
        return 0;
    }
    memset(dq, 0, (size_t)(B * S * H * D) * sizeof *dq);
    memset(dk, 0, (size_t)(B * S * G * D) * sizeof *dk);
    memset(dv, 0, (size_t)(B * S * G * D) * sizeof *dv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                const int64_t g = h / group;
                const int64_t qi = ((b * S + i) * H + h) * D;
                double mx = -INFINITY, sum = 0, delta = 0;
                for (int64_t j = 0; j < S; j++) {
                    p[j] = -INFINITY;
                    if (!allowed(c, doc, b, i, j)) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += q[qi + d] * k[((b * S + j) * G + g) * D + d];
                    p[j] = scale * dot;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < S; j++) sum += (p[j] = exp(p[j] - mx));
                for (int64_t d = 0; d < D; d++) delta += dout[qi + d] * o[qi + d];
                for (int64_t j = 0; j < S; j++) {
                    if (p[j] == 0) continue;   /* not allowed, or no weight */
                    const int64_t kj = ((b * S + j) * G + g) * D;
                    double dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += dout[qi + d] * v[kj + d];
                    const double pj = p[j] / sum, ds = pj * (dp - delta);
                    for (int64_t d = 0; d < D; d++) {
                        dv[kj + d] += pj * dout[qi + d];
                        dq[qi + d] += scale * ds * k[kj + d];
                        dk[kj + d] += scale * ds * q[qi + d];
                    }
                }
            }
    free(p);
    free(doc);
    return 1;
}

/* Elements outside |got - ref| <= tol + tol*|ref| (non-finite values must
 * match exactly); *max_err gets the largest |got - ref| (inf if any value is
 * non-finite where the reference is not). */
static long compare(const float *got, const double *ref, size_t n, double tol, double *max_err) {
    long bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double g = got[i], r = ref[i];
        int ok;
        if (!isfinite(g) || !isfinite(r)) {
            ok = isinf(g) && isinf(r) && (g > 0) == (r > 0);
            if (!ok) worst = INFINITY;
        } else {
            const double e = fabs(g - r);
            if (e > worst) worst = e;
            ok = e <= tol + tol * fabs(r);
        }
        bad += !ok;
    }
    *max_err = worst;
    return bad;
}

/* ------------------------------------------------------------------------
 * 4, communication: the bytes a rank moves, by collectives/comm.h's
 * definitions (a rank's own block never counts), against the counters.
 * ---------------------------------------------------------------------- */

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* What one call moves per rank on P ranks, U of them on the Ulysses dim
 * (0: none); every rank sends as many bytes as it receives. */
typedef struct comm_formula {
    int P, U, R;                /* R = P/U ring ranks (U = 0: R = P) */
    int64_t e;                  /* kv heads repeated e times before the all-to-all
                                   (attention.h: lcm(H_kv, U) / H_kv) */
    uint64_t x[3];              /* one rank's q (= o, dout, dq), k (= v, dk, dv; repeated)
                                   and lse, in bytes, sequence sharded over all P */
    uint64_t kv_block;          /* the ring's packed K|V [2, B, S/R, H_kv e/U, D], dtype */
    uint64_t grad_block;        /* its dK|dV in fp32 */
    uint64_t a2a_calls[2], a2a[2];   /* [forward, backward] */
    uint64_t p2p_calls[2], p2p[2];
    /* the world's communicator: the call's range check takes the largest
     * magnitude of each input over the world (attention/plan.c), one
     * all_reduce of n = 3 floats (forward: q, k, v) or 4 (backward: dout
     * too), 2 (P-1) ceil(n/P) x 4 bytes each way */
    uint64_t world_calls[2], world[2];
} comm_formula;

static comm_formula comm_formula_of(const config *c, int P, int U) {
    comm_formula f;
    memset(&f, 0, sizeof f);
    const uint64_t es = dt_dtype_size(c->dtype);
    const int64_t B = c->batch, S = c->seq, H = c->heads, G = c->kv_heads, D = c->dim;
    f.P = P, f.U = U, f.R = U ? P / U : P;
    f.e = U ? U / gcd64(G, U) : 1;
    const int64_t n = S / P, rows = B * (S / f.R), hk = U ? G * f.e / U : G;
    f.x[0] = (uint64_t)(B * n * H * D) * es;
    f.x[1] = (uint64_t)(B * n * G * f.e * D) * es;
    f.x[2] = (uint64_t)(B * H * n) * sizeof(float);
    if (U) {   /* an all-to-all of a tensor moves (U-1)/U of it */
        uint64_t share[3];
        for (int i = 0; i < 3; i++) share[i] = (uint64_t)(U - 1) * (f.x[i] / (uint64_t)U);
        f.a2a_calls[0] = 5;   /* q, k, v out; o, lse back */
        f.a2a[0] = 2 * share[0] + 2 * share[1] + share[2];
        f.a2a_calls[1] = 9;   /* q, k, v, o, lse, dout out; dq, dk, dv back */
        f.a2a[1] = 4 * share[0] + 4 * share[1] + share[2];
    }
    f.kv_block = 2 * (uint64_t)(rows * hk * D) * es;
    f.grad_block = 2 * (uint64_t)(rows * hk * D) * sizeof(float);
    if (f.R > 1) {
        /* forward: R-1 hops of K|V; backward (attention/backward.c): R-1
         * hops of K|V and R-1 of the fp32 sums in R groups, then the last
         * sums home in the dtype in two groups (rows [0, rows/2), the rest) */
        f.p2p_calls[0] = (uint64_t)(f.R - 1);
        f.p2p[0] = (uint64_t)(f.R - 1) * f.kv_block;
        f.p2p_calls[1] = (uint64_t)f.R + (rows / 2 > 0) + 1;
        f.p2p[1] = (uint64_t)(f.R - 1) * (f.kv_block + f.grad_block) + f.kv_block;
    }
    for (int pass = 0; pass < 2; pass++) {
        const uint64_t floats = 3 + (uint64_t)pass;
        f.world_calls[pass] = 1;
        f.world[pass] = 2 * (uint64_t)(P - 1) * ((floats + (uint64_t)P - 1) / (uint64_t)P) *
                        sizeof(float);
    }
    return f;
}

/* 1 if every rank's counters (ranks 0..P-1 of cnt, stride `stride`) hold
 * `calls` calls of `kind` moving `bytes` each way and nothing else (kind
 * DT_COMM_KIND_COUNT: nothing at all); else 0 and the first difference in
 * why. */
static int counters_are(const dt_comm_counters *cnt, size_t stride, int P, dt_comm_kind kind,
                        uint64_t calls, uint64_t bytes, char *why, size_t size) {
    for (int r = 0; r < P; r++) {
        const dt_comm_counters *x = (const dt_comm_counters *)((const char *)cnt + r * stride);
        for (int k = 0; k < DT_COMM_KIND_COUNT; k++) {
            const uint64_t wc = k == (int)kind ? calls : 0, wb = k == (int)kind ? bytes : 0;
            if (x->calls[k] == wc && x->bytes_sent[k] == wb && x->bytes_recv[k] == wb) continue;
            snprintf(why, size, "rank %d: %llu %s calls, %llu bytes sent, %llu received; "
                     "expected %llu, %llu", r, (unsigned long long)x->calls[k],
                     dt_comm_kind_name((dt_comm_kind)k), (unsigned long long)x->bytes_sent[k],
                     (unsigned long long)x->bytes_recv[k], (unsigned long long)wc,
                     (unsigned long long)wb);
            return 0;
        }
    }
    return 1;
}

/* Section 4's communication of one pass (0 forward, 1 backward): per mesh
 * dim, rank 0's counters and the formula, PASS when every rank's equal it.
 * Returns the number of FAILs. */
static int print_comm(const config *c, const attn_run *r, int pass) {
    const comm_formula f = comm_formula_of(c, c->ranks, c->ulysses);
    const run_mesh rm = run_mesh_of(c);
    const char *name = pass ? "backward" : "forward";
    const size_t stride = sizeof r->dims[0][0];
    char why[256];
    int bad = 0;
    printf("\n   %s: bytes per rank, from the counters of the mesh dims' communicators\n"
           "   (dt_comm_counters_get: reset before the call, read after), every rank's against "
           "the formula\n", name);
    if (rm.a2a >= 0) {
        const dt_comm_counters *x = &r->dims[pass][0][rm.a2a];
        const int ok = counters_are(&r->dims[pass][0][rm.a2a], stride, c->ranks,
                                    DT_COMM_ALL_TO_ALL, f.a2a_calls[pass], f.a2a[pass], why,
                                    sizeof why);
        printf("   %s Ulysses all-to-all over mesh dim %d (U = %d): %llu calls, %llu bytes sent, "
               "%llu received\n", name, rm.a2a, f.U,
               (unsigned long long)x->calls[DT_COMM_ALL_TO_ALL],
               (unsigned long long)x->bytes_sent[DT_COMM_ALL_TO_ALL],
               (unsigned long long)x->bytes_recv[DT_COMM_ALL_TO_ALL]);
        char kv[96] = "";
        if (f.e > 1)
            snprintf(kv, sizeof kv, "; k, v: their %lld kv heads repeated %lld times",
                     (long long)c->kv_heads, (long long)f.e);
        const uint64_t *s = f.x;
        if (pass == 0)
            printf("     formula 5 all-to-alls, (U-1)/U x (q + k + v + o + lse)\n"
                   "       = %d/%d x (%llu + %llu + %llu + %llu + %llu) = %llu%s: %s",
                   f.U - 1, f.U, (unsigned long long)s[0], (unsigned long long)s[1],
                   (unsigned long long)s[1], (unsigned long long)s[0], (unsigned long long)s[2],
                   (unsigned long long)f.a2a[0], kv, ok ? "PASS\n" : "FAIL ");
        else
            printf("     formula 9 all-to-alls, (U-1)/U x (q + k + v + o + lse + dout, and back "
                   "dq + dk + dv)\n"
                   "       = %d/%d x (4 x %llu + 4 x %llu + %llu) = %llu%s: %s",
                   f.U - 1, f.U, (unsigned long long)s[0], (unsigned long long)s[1],
                   (unsigned long long)s[2], (unsigned long long)f.a2a[1], kv,
                   ok ? "PASS\n" : "FAIL ");
        if (!ok) printf("(%s)\n", why);
        bad += !ok;
    }
    if (rm.ring >= 0) {
        const dt_comm_counters *x = &r->dims[pass][0][rm.ring];
        const int ok = counters_are(&r->dims[pass][0][rm.ring], stride, c->ranks, DT_COMM_P2P,
                                    f.p2p_calls[pass], f.p2p[pass], why, sizeof why);
        printf("   %s ring p2p over mesh dim %d (R = %d): %llu calls, %llu bytes sent, %llu "
               "received\n", name, rm.ring, f.R, (unsigned long long)x->calls[DT_COMM_P2P],
               (unsigned long long)x->bytes_sent[DT_COMM_P2P],
               (unsigned long long)x->bytes_recv[DT_COMM_P2P]);
        if (pass == 0)
            printf("     formula (R-1) x K|V block = %d x %llu = %llu: %s", f.R - 1,
                   (unsigned long long)f.kv_block, (unsigned long long)f.p2p[0],
                   ok ? "PASS\n" : "FAIL ");
        else
            printf("     formula (R-1) x (K|V block + fp32 dK|dV) + dK|dV home\n"
                   "       = %d x (%llu + %llu) + %llu = %llu: %s", f.R - 1,
                   (unsigned long long)f.kv_block, (unsigned long long)f.grad_block,
                   f.R > 1 ? (unsigned long long)f.kv_block : 0ULL,
                   (unsigned long long)f.p2p[1], ok ? "PASS\n" : "FAIL ");
        if (!ok) printf("(%s)\n", why);
        bad += !ok;
    } else {
        printf("   %s ring: none (U = P: a rank attends the whole sequence for H/U = %lld "
               "head%s)\n", name, (long long)(c->heads / f.U), c->heads / f.U > 1 ? "s" : "");
    }
    const dt_comm_counters *x = &r->world[pass][0];
    const int ok = counters_are(r->world[pass], sizeof r->world[pass][0], c->ranks,
                                DT_COMM_ALL_REDUCE, f.world_calls[pass], f.world[pass], why,
                                sizeof why);
    printf("   %s world communicator: %llu calls, %llu bytes sent, %llu received\n"
           "     formula 1 all_reduce of the inputs' largest magnitudes (the range check),\n"
           "       2 (P-1) ceil(%d/P) x 4 = %llu: %s", name,
           (unsigned long long)x->calls[DT_COMM_ALL_REDUCE],
           (unsigned long long)x->bytes_sent[DT_COMM_ALL_REDUCE],
           (unsigned long long)x->bytes_recv[DT_COMM_ALL_REDUCE], 3 + pass,
           (unsigned long long)f.world[pass], ok ? "PASS\n" : "FAIL ");
    if (!ok) printf("(%s)\n", why);
    return bad + !ok;
}

/* The other algorithm's bytes for the same problem, from the formula: the
 * ring over all P ranks beside a --ulysses run; Ulysses over all P beside a
 * ring. */
static void print_comm_other(const config *c) {
    const int P = c->ranks;
    if (c->ulysses) {
        const comm_formula f = comm_formula_of(c, P, 0);
        printf("\n   the ring alone over all P = %d ranks (Shard(1, %s), run without --ulysses)"
               " would move\n   per rank: forward (P-1) x K|V block = %d x %llu = %llu bytes",
               P, dt_order_name(c->order), P - 1, (unsigned long long)f.kv_block,
               (unsigned long long)f.p2p[0]);
        if (c->backward)
            printf(", backward %llu", (unsigned long long)f.p2p[1]);
        printf(" (formula)\n");
    } else if (P > 1 && c->heads % P == 0) {
        const comm_formula f = comm_formula_of(c, P, P);
        printf("\n   Ulysses alone over all P = %d ranks (--ulysses %d) would move per rank: "
               "forward\n   5 all-to-alls, %llu bytes", P, P, (unsigned long long)f.a2a[0]);
        if (c->backward) printf(", backward 9, %llu", (unsigned long long)f.a2a[1]);
        printf(" (formula)\n");
    }
}

/* ------------------------------------------------------------------------
 * 5. Work per rank and per ring step, from the mask rule alone.
 * ---------------------------------------------------------------------- */

static const dt_order orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};

static const char *mask_phrase(dt_attn_mask mask) {
    return mask == DT_ATTN_CAUSAL ? "causal mask" : "no mask";
}

/* The whole rule for headers: the mask, then the documents and the window. */
static void rule_phrase(const config *c, char *buf, size_t size) {
    char docs[112] = "", window[48] = "";
    if (c->doc_lens && c->docs_mean > 0) {
        snprintf(docs, sizeof docs, ", documents drawn log-normal (mean %g): %lld in %lld row%s",
                 c->docs_mean, (long long)c->doc_count, (long long)c->batch,
                 c->batch > 1 ? "s" : "");
    } else if (c->doc_lens) {
        const int n = snprintf(docs, sizeof docs, ", %lld documents %s (%s)",
                               (long long)c->doc_count, c->docs_per_row ? "in the rows" : "per row",
                               c->docs);
        if (n >= (int)sizeof docs) memcpy(docs + sizeof docs - 5, "...)", 5);   /* a long list */
    }
    if (c->window) snprintf(window, sizeof window, ", window %lld", (long long)c->window);
    snprintf(buf, size, "%s%s%s", mask_phrase(c->mask), docs, window);
}

/* The rule's tables of document bounds (docs.h's dt_docs_bounds): *rows
 * tables of 2S entries, one per batch row with a list per row, else one for
 * every row; NULL (and *rows 1) with no documents. */
static int64_t *rule_bounds(const config *c, int64_t *rows, int *oom) {
    *rows = c->docs_per_row ? c->batch : 1;
    *oom = 0;
    if (!c->doc_lens) return NULL;
    int64_t *bounds = malloc((size_t)(*rows * 2 * c->seq) * sizeof *bounds);
    if (!bounds) {
        *oom = 1;
        return NULL;
    }
    for (int64_t r = 0; r < *rows; r++)
        dt_docs_bounds(c->doc_lens, c->doc_count, c->seq, r, bounds + r * 2 * c->seq);
    return bounds;
}

/* Pairs the rule allows rank j when it holds the K/V block of rank src, per
 * head: per batch row with one list of documents (or none), summed over
 * the rows with a list per row. */
static int64_t block_pairs(const config *c, const int64_t *bounds, int64_t rows, dt_order order,
                           int j, int src) {
    const dt_attn_segment q = dt_attn_segment_of(order, c->seq, c->ranks, j);
    const dt_attn_segment k = dt_attn_segment_of(order, c->seq, c->ranks, src);
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        dt_attn_rule rule = {c->mask, c->window, bounds ? bounds + r * 2 * c->seq : NULL};
        n += dt_attn_pairs(rule, q, k);
    }
    return n;
}

typedef struct work_table {
    int have;                  /* 0: this order cannot shard S over P (zigzag needs 2P | S) */
    int64_t *pairs;            /* [P ranks][P steps]: pairs[j * P + t] */
    int64_t *step_max;         /* [P]: the busiest rank of each step */
    int64_t critical;          /* sum over steps of step_max */
    int64_t total;             /* sum over ranks and steps */
} work_table;

static int work_tables(const config *c, work_table w[3]) {
    const int P = c->ranks;
    int64_t rows;
    int oom;
    int64_t *bounds = rule_bounds(c, &rows, &oom);
    for (int o = 0; o < 3; o++) {
        w[o].have = c->seq % (orders[o] == DT_ORDER_ZIGZAG ? 2 * P : P) == 0;
        w[o].pairs = calloc((size_t)P * P, sizeof *w[o].pairs);
        w[o].step_max = calloc((size_t)P, sizeof *w[o].step_max);
        w[o].critical = w[o].total = 0;
        if (!w[o].pairs || !w[o].step_max) oom = 1;
        if (oom || !w[o].have) continue;
        for (int t = 0; t < P; t++) {
            for (int j = 0; j < P; j++) {
                int src = ((j - t) % P + P) % P;
                int64_t n = block_pairs(c, bounds, rows, orders[o], j, src);
                w[o].pairs[j * P + t] = n;
                w[o].total += n;
                if (n > w[o].step_max[t]) w[o].step_max[t] = n;
            }
            w[o].critical += w[o].step_max[t];
        }
    }
    free(bounds);
    return !oom;
}

static void work_tables_free(work_table w[3]) {
    for (int o = 0; o < 3; o++) {
        free(w[o].pairs);
        free(w[o].step_max);
    }
}

static int digits(int64_t x) {
    int n = 1;
    while (x >= 10) x /= 10, n++;
    return n;
}

static void print_work(const config *c, const work_table w[3]) {
    const int P = c->ranks;
    const int64_t cc = c->seq / P;
    int width = digits(cc * cc) + 2;
    if (width < 8) width = 8;
    char rule[256];
    rule_phrase(c, rule, sizeof rule);
    printf("\n5. work per ring step: query-key pairs each rank computes, %s, %s\n",
           c->docs_per_row ? "per head, summed over the batch rows" : "per (batch, head)", rule);
    if (c->ulysses)
        printf("   --ulysses %d: the ring of R = P/U = %d rank%s after the all-to-all, each on its "
               "S/R tokens\n   for its H/U = %lld heads: P below is R%s\n", c->ulysses, P,
               P > 1 ? "s" : "", (long long)(c->heads / c->ulysses),
               P > 1 ? "" : " (no ring: a rank attends the whole sequence in one step)");
    printf("   c = S/P = %lld tokens per rank, a full block is c*c = %lld pairs; at step t rank j\n"
           "   holds the K/V block of rank (j - t) mod P. Counted from dt_attn_pairs, not timed.\n",
           (long long)cc, (long long)(cc * cc));
    if (P <= 8) {
        for (int o = 0; o < 3; o++) {
            printf("\n   %-11s", dt_order_name(orders[o]));
            if (!w[o].have) {
                printf(" n/a: S = %lld is not divisible by 2P = %d\n", (long long)c->seq, 2 * P);
                continue;
            }
            for (int t = 0; t < P; t++) printf("%*s%d", width - digits(t), "step ", t);
            printf("\n");
            for (int j = 0; j < P; j++) {
                printf("     rank %-4d", j);
                for (int t = 0; t < P; t++) printf("%*lld", width, (long long)w[o].pairs[j * P + t]);
                printf("\n");
            }
            printf("     max      ");
            for (int t = 0; t < P; t++) printf("%*lld", width, (long long)w[o].step_max[t]);
            printf("   critical path %lld\n", (long long)w[o].critical);
        }
    } else {
        /* Large P: the busiest rank of each step only, and only the first
         * and last steps when there are many. */
        printf("\n   step   %*s %*s %*s   (max over ranks)\n", width, "contiguous", width,
               "striped", width, "zigzag");
        for (int t = 0; t < P; t++) {
            if (P > 16 && t == 8) printf("   ...\n");
            if (P > 16 && t >= 8 && t < P - 2) continue;
            printf("   %-6d", t);
            for (int o = 0; o < 3; o++) {
                if (w[o].have) printf(" %*lld", width, (long long)w[o].step_max[t]);
                else printf(" %*s", width, "n/a");
            }
            printf("\n");
        }
    }
    printf("\n   critical path (sum over steps of the busiest rank):");
    for (int o = 0; o < 3; o++) {
        if (w[o].have) printf(" %s %lld", dt_order_name(orders[o]), (long long)w[o].critical);
        else printf(" %s n/a", dt_order_name(orders[o]));
        printf(o < 2 ? "," : "\n");
    }
    printf("   total pairs (over ranks and steps):");
    for (int o = 0; o < 3; o++) {
        if (w[o].have) printf(" %s %lld", dt_order_name(orders[o]), (long long)w[o].total);
        else printf(" %s n/a", dt_order_name(orders[o]));
        printf(o < 2 ? "," : "\n");
    }
    printf("   critical path / ideal (total / P):");
    for (int o = 0; o < 3; o++) {
        if (w[o].have && w[o].total > 0)
            printf(" %s %.3f", dt_order_name(orders[o]),
                   (double)w[o].critical * P / (double)w[o].total);
        else printf(" %s n/a", dt_order_name(orders[o]));
        printf(o < 2 ? "," : "\n");
    }
    printf("   speedup of the critical path:");
    for (int o = 1; o < 3; o++) {
        if (w[o].have && w[o].critical > 0)
            printf(" contiguous/%s %.3f%s", dt_order_name(orders[o]),
                   (double)w[0].critical / (double)w[o].critical, o == 1 ? "," : "");
        else
            printf(" contiguous/%s n/a%s", dt_order_name(orders[o]), o == 1 ? "," : "");
    }
    printf("\n");
    if (c->doc_lens || c->window) return;   /* the figures below are for the mask alone */
    printf("   theory for causal striping, 2(1 - 1/(2P)) = %.3f at P = %d (approached as c grows)\n",
           2.0 * (1.0 - 1.0 / (2.0 * P)), P);
    if (c->mask == DT_ATTN_FULL)
        printf("   (no mask: every block is full, so every order does the same work)\n");
}

/* ------------------------------------------------------------------------
 * --svg: three heat maps, x = ring step, y = rank, colour = pairs / (c*c).
 * ---------------------------------------------------------------------- */

/* White -> mid blue -> dark blue, linear between the three stops (the
 * legend's gradient uses the same stops). */
static void colour(double f, int rgb[3]) {
    static const int stops[3][3] = {{247, 251, 255}, {107, 174, 214}, {8, 48, 107}};
    if (!(f > 0)) f = 0;
    if (f > 1) f = 1;
    int s = f < 0.5 ? 0 : 1;
    double u = f < 0.5 ? f / 0.5 : (f - 0.5) / 0.5;
    for (int i = 0; i < 3; i++)
        rgb[i] = (int)lround(stops[s][i] + u * (stops[s + 1][i] - stops[s][i]));
}

static int write_svg(const char *path, const config *c, const work_table w[3]) {
    const int P = c->ranks;
    const double full = (double)(c->seq / P) * (double)(c->seq / P);
    int cell = 260 / P;
    if (cell > 48) cell = 48;
    if (cell < 3) cell = 3;
    const int map = cell * P, left = 56, top = 78, gap = 56, legend_w = 110;
    const int width = left + 3 * map + 2 * gap + 30 + legend_w, height = top + map + 64;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "striped_attention: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            width, height, width, height);
    char rule[256];
    rule_phrase(c, rule, sizeof rule);
    fprintf(f, "<title>Work per ring step: attention with %s, P = %d, S = %lld</title>\n", rule,
            P, (long long)c->seq);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Query-key pairs per "
               "rank and ring step (%s, P = %d, S = %lld, c = %lld)</text>\n",
            left, rule, P, (long long)c->seq, (long long)(c->seq / P));
    fprintf(f, "<text x=\"%d\" y=\"40\" fill=\"#444\">colour = pairs / (c*c); at step t rank j holds "
               "the K/V block of rank (j - t) mod P; each step waits for its busiest rank</text>\n",
            left);
    int tick = P <= 16 ? 1 : P / 8;
    for (int o = 0; o < 3; o++) {
        const int x0 = left + o * (map + gap);
        fprintf(f, "<g>\n<title>%s</title>\n", dt_order_name(orders[o]));
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s</text>\n", x0, top - 10,
                dt_order_name(orders[o]));
        if (!w[o].have) {
            fprintf(f, "<text x=\"%d\" y=\"%d\">n/a: S not divisible by 2P</text>\n</g>\n", x0,
                    top + 20);
            continue;
        }
        for (int j = 0; j < P; j++)
            for (int t = 0; t < P; t++) {
                int64_t n = w[o].pairs[j * P + t];
                int rgb[3];
                colour(full > 0 ? (double)n / full : 0, rgb);
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                           "fill=\"rgb(%d,%d,%d)\"><title>rank %d, step %d: %lld pairs "
                           "(%.3f of c*c)</title></rect>\n",
                        x0 + t * cell, top + j * cell, cell, cell, rgb[0], rgb[1], rgb[2], j, t,
                        (long long)n, full > 0 ? (double)n / full : 0.0);
            }
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                   "stroke=\"#333\"/>\n", x0, top, map, map);
        for (int t = 0; t < P; t += tick)
            fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n",
                    x0 + t * cell + cell / 2, top + map + 13, t);
        if (o == 0)
            for (int j = 0; j < P; j += tick)
                fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">%d</text>\n",
                        x0 - 4, top + j * cell + cell / 2 + 4, j);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">ring step t</text>\n",
                x0 + map / 2, top + map + 28);
        fprintf(f, "<text x=\"%d\" y=\"%d\">critical path %lld pairs (%.2f c*c)</text>\n", x0,
                top + map + 46, (long long)w[o].critical, full > 0 ? (double)w[o].critical / full : 0);
        fprintf(f, "</g>\n");
    }
    fprintf(f, "<text x=\"14\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 14 %d)\">"
               "rank j</text>\n", top + map / 2, top + map / 2);
    /* Legend: a vertical bar, 1 at the top. */
    const int lx = left + 3 * map + 2 * gap + 10, lh = map < 120 ? 120 : map;
    fprintf(f, "<g>\n<title>legend</title>\n<defs><linearGradient id=\"scale\" x1=\"0\" y1=\"1\" "
               "x2=\"0\" y2=\"0\"><stop offset=\"0\" stop-color=\"rgb(247,251,255)\"/>"
               "<stop offset=\"0.5\" stop-color=\"rgb(107,174,214)\"/>"
               "<stop offset=\"1\" stop-color=\"rgb(8,48,107)\"/></linearGradient></defs>\n");
    fprintf(f, "<text x=\"%d\" y=\"%d\">pairs / (c*c)</text>\n", lx, top - 10);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"%d\" fill=\"url(#scale)\" "
               "stroke=\"#333\"/>\n", lx, top, lh);
    fprintf(f, "<text x=\"%d\" y=\"%d\">1 (full block)</text>\n", lx + 22, top + 4);
    fprintf(f, "<text x=\"%d\" y=\"%d\">0.5</text>\n", lx + 22, top + lh / 2 + 4);
    fprintf(f, "<text x=\"%d\" y=\"%d\">0 (empty)</text>\n", lx + 22, top + lh + 4);
    fprintf(f, "</g>\n</svg>\n");
    int ok = !ferror(f);
    ok &= fclose(f) == 0;
    if (!ok) fprintf(stderr, "striped_attention: error writing %s\n", path);
    return ok;
}

/* ------------------------------------------------------------------------
 * --dump DIR: meta.txt and raw little-endian fp32 arrays, global token order.
 * ---------------------------------------------------------------------- */

/* mkdir -p */
static int make_dirs(const char *dir) {
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return 0;
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char keep = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return 0;
        path[i] = keep;
    }
    struct stat sb;
    return stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int write_f32_le(const char *dir, const char *name, const float *x, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "striped_attention: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    unsigned char buf[4096];
    size_t fill = 0;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        for (int b = 0; b < 4; b++) buf[fill++] = (unsigned char)(u >> (8 * b));
        if (fill == sizeof buf || i + 1 == n) {
            ok = fwrite(buf, 1, fill, f) == fill;
            fill = 0;
        }
    }
    ok &= fclose(f) == 0;
    if (!ok) fprintf(stderr, "striped_attention: error writing %s\n", path);
    return ok;
}

static int write_dump(const config *c, const attn_run *r) {
    if (!make_dirs(c->dump)) {
        fprintf(stderr, "striped_attention: cannot create directory %s: %s\n", c->dump,
                strerror(errno));
        return 0;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/meta.txt", c->dump);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "striped_attention: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    fprintf(f, "%lld %lld %lld %lld %lld %d %.9g %lld\n", (long long)c->batch, (long long)c->seq,
            (long long)c->heads, (long long)c->kv_heads, (long long)c->dim,
            c->mask == DT_ATTN_CAUSAL, (double)c->scale, (long long)c->window);
    if (fclose(f) != 0) return 0;
    /* docs.txt: each batch row's document lengths, a line per row. */
    snprintf(path, sizeof path, "%s/docs.txt", c->dump);
    if (!(f = fopen(path, "w"))) {
        fprintf(stderr, "striped_attention: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    for (int64_t b = 0, i = 0; b < c->batch; b++) {
        if (!c->doc_lens) {
            fprintf(f, "%lld\n", (long long)c->seq);
            continue;
        }
        if (!c->docs_per_row) i = 0;
        for (int64_t sum = 0; sum < c->seq; sum += c->doc_lens[i++])
            fprintf(f, "%s%lld", sum ? " " : "", (long long)c->doc_lens[i]);
        fprintf(f, "\n");
    }
    if (ferror(f) | (fclose(f) != 0)) {
        fprintf(stderr, "striped_attention: error writing %s\n", path);
        return 0;
    }
    const size_t nq = (size_t)(c->batch * c->seq * c->heads * c->dim);
    const size_t nk = (size_t)(c->batch * c->seq * c->kv_heads * c->dim);
    int ok = write_f32_le(c->dump, "q.bin", r->q, nq) && write_f32_le(c->dump, "k.bin", r->k, nk) &&
             write_f32_le(c->dump, "v.bin", r->v, nk) && write_f32_le(c->dump, "o.bin", r->o, nq);
    if (ok && c->backward)
        ok = write_f32_le(c->dump, "dout.bin", r->dout, nq) &&
             write_f32_le(c->dump, "dq.bin", r->dq, nq) &&
             write_f32_le(c->dump, "dk.bin", r->dk, nk) && write_f32_le(c->dump, "dv.bin", r->dv, nk);
    return ok;
}

/* ------------------------------------------------------------------------
 * Flags.
 * ---------------------------------------------------------------------- */

/* c->docs (the --docs flag) as c->doc_lens, once B, S and the seed are
 * known: 1, else 0 with a message. */
static int docs_resolve(config *c) {
    const char *v = c->docs;
    if (!strncmp(v, "random:", 7)) {
        char *end = NULL;
        errno = 0;
        const double mean = strtod(v + 7, &end);
        if (end == v + 7 || *end || errno || !(mean >= 1 && mean <= 1e12)) {
            fprintf(stderr, NAME ": --docs random:MEAN takes a mean length of at least 1 token; "
                    "got '%s'\n", v);
            return 0;
        }
        c->docs_mean = mean;
        c->doc_lens = ex_docs_draw(mean, c->seed + 4, c->batch, c->seq, &c->doc_count);
        if (!c->doc_lens) {
            fprintf(stderr, NAME ": out of memory for --docs\n");
            return 0;
        }
        c->docs_per_row = c->batch > 1;
        return 1;
    }
    if (!ex_docs_parse_list(v, &c->doc_lens, &c->doc_count)) return 0;
    int64_t sum = 0;
    for (int64_t i = 0; i < c->doc_count; i++) sum += c->doc_lens[i];
    if (sum != c->seq && sum != c->batch * c->seq) {
        char per_row[64] = "";
        if (c->batch > 1)
            snprintf(per_row, sizeof per_row, " nor B*S = %lld (a list per row)",
                     (long long)(c->batch * c->seq));
        fprintf(stderr, NAME ": --docs lengths sum to %lld, not --seq %lld (one list for every "
                "batch row)%s\n", (long long)sum, (long long)c->seq, per_row);
    } else if (dt_docs_check("--docs", c->doc_lens, c->doc_count, c->batch, c->seq,
                             &c->docs_per_row) != DT_SUCCESS) {
        fprintf(stderr, NAME ": %s\n", dt_last_error());
    } else {
        return 1;
    }
    free(c->doc_lens);
    c->doc_lens = NULL;
    c->doc_count = 0;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: striped_attention [flags]\n"
            "  --ranks P          ranks (threads of this process), 1..%d, default 4\n"
            "  --batch B          batch, default 1\n"
            "  --seq S            tokens, a multiple of P (of 2P for zigzag), default 256\n"
            "  --heads H          query heads, default 4\n"
            "  --kv-heads HKV     key/value heads, dividing H (GQA/MQA), default H/2 (H if odd)\n"
            "  --dim D            head dim, a multiple of 8 up to %d, default 64\n"
            "  --order O          contiguous (Ring Attention) | striped | zigzag, default striped\n"
            "  --causal           causal mask (default)\n"
            "  --no-causal        no mask\n"
            "  --docs L1,L2,...   packed documents: a query attends keys of its own document\n"
            "                     only; lengths >= 1 summing to S (the same documents in\n"
            "                     every batch row) or to B*S (row 0's, then row 1's, ...)\n"
            "  --docs random:MEAN documents of log-normal lengths (sigma 1, mean MEAN tokens),\n"
            "                     rounded, at least 1, each row's last cut to end at S; drawn\n"
            "                     for each batch row in turn from seed N+4 (--seed N)\n"
            "  --window W         sliding window: a query attends keys less than W positions\n"
            "                     away (0: none, default)\n"
            "  --dtype T          fp32 | bf16 | fp16, default fp32\n"
            "  --backend K        auto | cpu | cuda, default auto (DT_BACKEND, else the best built)\n"
            "  --seed N           q, k, v from seeds N, N+1, N+2, default 1\n"
            "  --group G          the forward launches its kernel over up to G ring steps at\n"
            "                     once (striped causal: the greatest power of two up to G),\n"
            "                     default 1\n"
            "  --backward         also run the backward pass (dout from seed N+3) and check\n"
            "                     dq, dk, dv against double-precision reference gradients\n"
            "  --ulysses U        the Ulysses x ring hybrid on a (P/U ring) x (U Ulysses) mesh:\n"
            "                     S sharded over the ring dim by --order, then contiguous\n"
            "                     over the Ulysses dim (dt_attention_options.a2a_dim):\n"
            "                     all-to-alls move q, k, v from the sequence to the heads and\n"
            "                     o, lse back; the ring runs over the P/U ranks left (U = P:\n"
            "                     Ulysses alone, no ring). U divides P and H; kv heads that\n"
            "                     U does not divide are repeated by the library. Default:\n"
            "                     none, the ring over all P. Every run prints the bytes per\n"
            "                     rank from the communicators' counters beside the formula\n"
            "  --svg FILE         write the work-per-step heat maps (section 5) as SVG\n"
            "  --dump DIR         write DIR/meta.txt (B S H HKV D causal scale window),\n"
            "                     DIR/docs.txt (each batch row's document lengths, a line\n"
            "                     per row; S with no --docs) and q.bin k.bin v.bin o.bin\n"
            "                     (and with --backward dout.bin dq.bin dk.bin dv.bin):\n"
            "                     little-endian fp32, global token order\n"
            "  --help             this text\n"
            "exit status: 0 PASS, 1 FAIL or a library error, 2 bad flags or shapes,\n"
            "3 not supported here (the library returned DT_ERR_NOT_SUPPORTED)\n",
            MAX_RANKS, DT_ATTN_MAX_HEAD_DIM);
}

/* Parses argv into c; returns -1 to go on, else the exit status. */
static int parse_flags(int argc, char **argv, config *c) {
    static const char *const order_names[] = {"contiguous", "striped", "zigzag"};
    static const char *const dtype_names[] = {"fp32", "bf16", "fp16"};
    static const dt_dtype dtypes[] = {DT_F32, DT_BF16, DT_F16};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        int k = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--causal")) {
            c->mask = DT_ATTN_CAUSAL;
            continue;
        } else if (!strcmp(a, "--no-causal")) {
            c->mask = DT_ATTN_FULL;
            continue;
        } else if (!strcmp(a, "--backward")) {
            c->backward = 1;
            continue;
        } else if (!strcmp(a, "--ranks")) {
            if (!ex_parse_int(a, v, 1, MAX_RANKS, &x)) return 2;
            c->ranks = x;
        } else if (!strcmp(a, "--batch")) {
            if (!ex_parse_int(a, v, 1, 4096, &x)) return 2;
            c->batch = x;
        } else if (!strcmp(a, "--seq")) {
            if (!ex_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            c->seq = x;
        } else if (!strcmp(a, "--heads")) {
            if (!ex_parse_int(a, v, 1, 4096, &x)) return 2;
            c->heads = x;
        } else if (!strcmp(a, "--kv-heads")) {
            if (!ex_parse_int(a, v, 1, 4096, &x)) return 2;
            c->kv_heads = x;
        } else if (!strcmp(a, "--dim")) {
            if (!ex_parse_int(a, v, 1, 1 << 16, &x)) return 2;
            c->dim = x;
        } else if (!strcmp(a, "--order")) {
            if ((k = ex_parse_choice(a, v, order_names, 3)) < 0) return 2;
            c->order = orders[k];
        } else if (!strcmp(a, "--dtype")) {
            if ((k = ex_parse_choice(a, v, dtype_names, 3)) < 0) return 2;
            c->dtype = dtypes[k];
        } else if (!strcmp(a, "--backend")) {
            if (!ex_parse_backend(a, v, &c->backend)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!ex_parse_seed(v, &c->seed)) return 2;
        } else if (!strcmp(a, "--group")) {
            if (!ex_parse_int(a, v, 1, MAX_RANKS, &x)) return 2;
            c->group = (int)x;
        } else if (!strcmp(a, "--ulysses")) {
            if (!ex_parse_int(a, v, 1, MAX_RANKS, &x)) return 2;
            c->ulysses = (int)x;
        } else if (!strcmp(a, "--docs")) {
            if (!v || !*v) {
                fprintf(stderr, "striped_attention: --docs needs lengths L1,L2,... or "
                        "random:MEAN\n");
                return 2;
            }
            c->docs = v;
        } else if (!strcmp(a, "--window")) {
            if (!ex_parse_int(a, v, 0, 1L << 30, &x)) return 2;
            c->window = x;
        } else if (!strcmp(a, "--svg") || !strcmp(a, "--dump")) {
            if (!v || !*v) {
                fprintf(stderr, "striped_attention: %s needs a %s\n", a,
                        a[2] == 's' ? "file name" : "directory");
                return 2;
            }
            if (a[2] == 's') c->svg = v;
            else c->dump = v;
        } else {
            fprintf(stderr, "striped_attention: unknown flag '%s' (--help lists them)\n", a);
            return 2;
        }
        i++; /* the flag's value */
    }

    /* Shapes, before anything is launched. */
    if (!c->kv_heads) c->kv_heads = ex_default_kv_heads(c->heads, 1);   /* not given */
    if (c->seq % c->ranks) {
        fprintf(stderr, "striped_attention: --seq %lld is not divisible by --ranks %d\n",
                (long long)c->seq, c->ranks);
        return 2;
    }
    if (c->order == DT_ORDER_ZIGZAG && c->seq % (2 * c->ranks)) {
        fprintf(stderr, "striped_attention: zigzag cuts the sequence into 2P = %d chunks: --seq %lld "
                "is not divisible by %d\n", 2 * c->ranks, (long long)c->seq, 2 * c->ranks);
        return 2;
    }
    if (c->ulysses && c->ranks % c->ulysses) {
        fprintf(stderr, "striped_attention: --ulysses %d does not divide --ranks %d: the mesh "
                "is (P/U ring) x (U Ulysses) ranks\n", c->ulysses, c->ranks);
        return 2;
    }
    if (c->ulysses && c->heads % c->ulysses) {
        fprintf(stderr, "striped_attention: --ulysses %d does not divide --heads %lld: the "
                "all-to-all shards the heads over the U Ulysses ranks\n", c->ulysses,
                (long long)c->heads);
        return 2;
    }
    if (c->heads % c->kv_heads) {
        fprintf(stderr, "striped_attention: --kv-heads %lld does not divide --heads %lld\n",
                (long long)c->kv_heads, (long long)c->heads);
        return 2;
    }
    if (c->dim % 8 || c->dim > DT_ATTN_MAX_HEAD_DIM) {
        fprintf(stderr, "striped_attention: --dim %lld: the attention kernels take head dims that "
                "are multiples of 8 up to %d\n", (long long)c->dim, DT_ATTN_MAX_HEAD_DIM);
        return 2;
    }
    /* The example keeps the full q, k, v, o and a double reference in memory. */
    double numel = (double)c->batch * (double)c->seq * (double)c->heads * (double)c->dim;
    if (numel > (double)(1 << 26)) {
        fprintf(stderr, "striped_attention: B*S*H*D = %.0f is more than this example keeps in "
                "memory (%d); use bench/attention for large shapes\n", numel, 1 << 26);
        return 2;
    }
    return c->docs && !docs_resolve(c) ? 2 : -1;
}

int main(int argc, char **argv) {
    config c = {
        .ranks = 4, .batch = 1, .seq = 256, .heads = 4, .kv_heads = 0, .dim = 64,
        .order = DT_ORDER_STRIPED, .mask = DT_ATTN_CAUSAL, .dtype = DT_F32,
        .backend = DT_BACKEND_AUTO, .seed = 1, .scale = 0, .svg = NULL, .dump = NULL,
    };
    int rc = parse_flags(argc, argv, &c);
    if (rc >= 0) return rc;
    c.scale = 1.0f / sqrtf((float)c.dim);
    dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
    lo.backend = c.backend;

    /* 1-3: the permutation, on a short sequence so that it fits a line. */
    static demo d;
    d.ranks = c.ranks;
    d.seq = (int)(c.seq < 4 * c.ranks ? c.seq : 4 * c.ranks);
    dt_status st = dt_launch(1, show_permutation, &d, &lo);
    if (st != DT_SUCCESS) fail("the permutation", st);

    st = dt_launch(d.ranks, rank_demo, &d, &lo);
    if (st != DT_SUCCESS) fail("sharding", st);
    printf("\n3. Shard(0, striped) over %d ranks, and Shard(0, contiguous) of the permuted tokens:\n",
           d.ranks);
    int same = 1;
    for (int r = 0; r < d.ranks; r++) {
        printf("   rank %d holds", r);
        for (int x = 0; x < d.local_len; x++) {
            printf(" %g", d.striped[r][x]);
            same &= d.striped[r][x] == d.permuted[r][x] && (int)d.striped[r][x] % d.ranks == r;
        }
        printf("\n");
    }
    printf("   both shardings agree, token i on rank i mod %d: %s\n", d.ranks, same ? "yes" : "NO");
    if (!same) return 1;

    /* 4: the attention. */
    const int64_t B = c.batch, S = c.seq, H = c.heads, G = c.kv_heads, D = c.dim;
    const int R = ring_ranks(&c);
    char sharding[256];
    if (!c.ulysses)
        snprintf(sharding, sizeof sharding, "Shard(1, %s) over %d ranks", dt_order_name(c.order),
                 c.ranks);
    else if (R == 1)
        snprintf(sharding, sizeof sharding, "Shard(1, %s) over %d ranks, the all-to-all dim "
                 "(--ulysses %d: Ulysses alone)", dt_order_name(c.order), c.ranks, c.ulysses);
    else
        snprintf(sharding, sizeof sharding, "[Shard(1, %s), Shard(1, contiguous)] on a %d x %d "
                 "mesh (ring x Ulysses, a2a_dim 1)", dt_order_name(c.order), R, c.ulysses);
    printf("\n4. attention: q [%lld, %lld, %lld, %lld], k and v [%lld, %lld, %lld, %lld], %s, %s,\n"
           "   %s, seeds %llu/%llu/%llu, scale %.9g\n",
           (long long)B, (long long)S, (long long)H, (long long)D, (long long)B, (long long)S,
           (long long)G, (long long)D, dt_dtype_name(c.dtype), mask_phrase(c.mask), sharding,
           (unsigned long long)c.seed, (unsigned long long)c.seed + 1,
           (unsigned long long)c.seed + 2, (double)c.scale);
    if (c.ulysses)
        printf("   --ulysses %d: all-to-alls over the %d Ulysses ranks move q, k, v from the sequence "
               "to the heads\n   (%lld a rank), o and lse back; %s\n", c.ulysses, c.ulysses,
               (long long)(H / c.ulysses),
               R > 1 ? "the ring runs over the other mesh dim" : "no ring (U = P)");
    if (c.doc_lens || c.window) {
        char rule[256];
        rule_phrase(&c, rule, sizeof rule);
        printf("   mask rule: %s\n", rule);
    }
    fflush(stdout);
    attn_run *run = calloc(1, sizeof *run);
    if (!run) {
        fprintf(stderr, "striped_attention: out of memory\n");
        return 1;
    }
    run->cfg = &c;
    st = dt_launch(c.ranks, rank_attention, run, &lo);
    if (st != DT_SUCCESS) fail(c.backward ? "the attention forward or backward pass" : "dt_attention_forward", st);
    double slowest = 0;
    for (int r = 0; r < c.ranks; r++) slowest = run->seconds[r] > slowest ? run->seconds[r] : slowest;
    printf("   dt_attention_forward on the %s backend: %.2f ms on the slowest rank (%d ranks as threads)\n",
           dt_backend_kind_name(run->backend), 1e3 * slowest, c.ranks);
    /* Measured per ring step (dt_attention_options.timing): the slowest
     * rank's block kernels, and the waits between steps. */
    double crit = 0, waits = 0;
    printf("   block kernels per ring step, slowest rank (ms):");
    for (int t = 0; t < R; t++) {
        double step = 0;
        for (int r = 0; r < c.ranks; r++) step = fmax(step, run->steps[r].blocks_ms[t]);
        crit += step;
        if (t < 16) printf(" %.2f", step);
    }
    for (int r = 0; r < c.ranks; r++) {
        double w = 0;
        for (int t = 0; t < R; t++) w += run->steps[r].wait_ms[t];
        waits = fmax(waits, w);
    }
    printf("%s\n   their sum (the ring's critical path in kernel time) %.2f ms; the largest "
           "per-rank wait between steps %.2f ms\n", R > 16 ? " ..." : "", crit, waits);

    const int64_t nq = B * S * H * D, nk = B * S * G * D, nl = B * H * S;
    double *q = full_input(c.seed, nq, c.dtype), *k = full_input(c.seed + 1, nk, c.dtype);
    double *v = full_input(c.seed + 2, nk, c.dtype);
    double *o_ref = malloc((size_t)nq * sizeof *o_ref), *lse_ref = malloc((size_t)nl * sizeof *lse_ref);
    if (!q || !k || !v || !o_ref || !lse_ref || !reference(&c, q, k, v, o_ref, lse_ref)) {
        fprintf(stderr, "striped_attention: out of memory for the reference\n");
        return 1;
    }
    const double tol = c.dtype == DT_F32 ? 1e-5 : 2e-2;
    double err_o = 0, err_lse = 0;
    long bad = compare(run->o, o_ref, (size_t)nq, tol, &err_o);
    bad += compare(run->lse, lse_ref, (size_t)nl, tol, &err_lse);
    printf("   vs a double-precision reference on the full sequence (tolerance %g + %g*|ref|):\n"
           "   max abs error: o %.3g, lse %.3g; %ld of %lld values outside the tolerance\n",
           tol, tol, err_o, err_lse, bad, (long long)(nq + nl));
    printf("   result: %s\n", bad ? "FAIL" : "PASS");
    bad += print_comm(&c, run, 0);
    if (c.backward) {
        double slow_b = 0;
        for (int r = 0; r < c.ranks; r++)
            slow_b = run->backward_seconds[r] > slow_b ? run->backward_seconds[r] : slow_b;
        double *dout = full_input(c.seed + 3, nq, c.dtype);
        double *dq_ref = malloc((size_t)nq * sizeof *dq_ref);
        double *dk_ref = malloc((size_t)nk * sizeof *dk_ref), *dv_ref = malloc((size_t)nk * sizeof *dv_ref);
        if (!dout || !dq_ref || !dk_ref || !dv_ref ||
            !reference_backward(&c, q, k, v, o_ref, dout, dq_ref, dk_ref, dv_ref)) {
            fprintf(stderr, "striped_attention: out of memory for the reference gradients\n");
            return 1;
        }
        const double gtol = c.dtype == DT_F32 ? 1e-4 : 3e-2;
        double err_dq = 0, err_dk = 0, err_dv = 0;
        long gbad = compare(run->dq, dq_ref, (size_t)nq, gtol, &err_dq);
        gbad += compare(run->dk, dk_ref, (size_t)nk, gtol, &err_dk);
        gbad += compare(run->dv, dv_ref, (size_t)nk, gtol, &err_dv);
        printf("\n   dt_attention_backward (dout from seed %llu): %.2f ms on the slowest rank\n"
               "   vs double-precision reference gradients (tolerance %g + %g*|ref|):\n"
               "   max abs error: dq %.3g, dk %.3g, dv %.3g; %ld of %lld values outside the tolerance\n"
               "   backward result: %s\n",
               (unsigned long long)c.seed + 3, 1e3 * slow_b, gtol, gtol, err_dq, err_dk, err_dv, gbad,
               (long long)(nq + 2 * nk), gbad ? "FAIL" : "PASS");
        bad += gbad;
        bad += print_comm(&c, run, 1);
        free(dout);
        free(dq_ref);
        free(dk_ref);
        free(dv_ref);
    }
    free(q);
    free(k);
    free(v);
    free(o_ref);
    free(lse_ref);
    print_comm_other(&c);

    /* 5: work per rank and step, and the SVG; with --ulysses, of the ring
     * of R ranks that runs after the all-to-all. */
    config ring = c;
    ring.ranks = R;
    work_table w[3];
    int ok = work_tables(&ring, w);
    if (ok) print_work(&ring, w);
    else fprintf(stderr, "striped_attention: out of memory for the work tables\n");
    int files_ok = 1;
    if (ok && c.svg) {
        files_ok &= write_svg(c.svg, &ring, w);
        if (files_ok) printf("\n   wrote %s (the heat maps above as SVG)\n", c.svg);
    }
    work_tables_free(w);
    if (c.dump) {
        int dump_ok = write_dump(&c, run);
        files_ok &= dump_ok;
        if (dump_ok)
            printf("   wrote %s/{meta.txt,docs.txt,q.bin,k.bin,v.bin,o.bin%s}: fp32 "
                   "little-endian, global token order\n", c.dump,
                   c.backward ? ",dout.bin,dq.bin,dk.bin,dv.bin" : "");
    }
    free(run->o);
    free(run->lse);
    free(run->q);
    free(run->k);
    free(run->v);
    free(run->dout);
    free(run->dq);
    free(run->dk);
    free(run->dv);
    free(run);
    free(c.doc_lens);

    printf("\nnext: build/examples/tensor_parallel_mlp\n");
    printf("next: build/examples/transformer_block\n");
    return bad || !ok || !files_ok ? 1 : 0;
}
