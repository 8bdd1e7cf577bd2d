/* examples/transformer_block.c — one pre-norm transformer block on a 2-D mesh
 * tp x sp: tensor parallelism over heads and the MLP's hidden dim (tp),
 * sequence parallelism with ring / striped / zigzag attention (sp).
 *
 *   X [B, S, E]              [Replicate, Shard(1, order)]   residual stream
 *   H  = RMSNorm(X) * g1     (needs E whole: it is)          dt_rmsnorm
 *   Q  = H @ Wq, K, V        Wq [Shard(1), Replicate]: column-parallel over
 *                            heads -> [Shard(2), Shard(1, order)]
 *   [B, S, H*D] -> [B, S, H, D]  Shard(2) stays Shard(2)    dt_tensor_reshape
 *   Q, K = rotary(Q, K)      at each token's GLOBAL position dt_rotary
 *   A  = attention(Q, K, V)  causal, over the sp ring        dt_attention_forward
 *   A @ Wo                   Wo [Shard(0), Replicate]: row-parallel -> Partial
 *   X1 = X + allreduce(..)   Partial -> Replicate on tp      dt_tensor_redistribute, dt_add
 *   X2 = X1 + MLP(RMSNorm(X1) * g2), the MLP as in tensor_parallel_mlp
 *
 * With striping, token i lives on sp rank i mod sp; a rank's local row x is
 * global token dt_order_global(order, S, sp, coord, x), and that is the
 * position dt_rotary uses, read from the Layout. Every weight is made whole
 * on rank 0 (dt_tensor_fill_random on a local tensor, scaled exactly by a
 * power of two) and scattered by dt_tensor_shard. The output is gathered to
 * rank 0 and checked against the same block computed on one rank in double
 * precision with plain loops: PASS or FAIL. --sweep runs the meshes 1x1,
 * 1x4, 2x2, 4x1 and 2x3 with every order and prints a table.
 *
 * --backend cuda runs every op on the GPU (cuda+local when ranks share GPUs,
 * cuda+nccl with one GPU per rank): the program touches tensor data only
 * through dt_tensor_set_local / dt_tensor_get_local, so it runs unchanged on
 * any backend.
 *
 * Exit status: 0 PASS, 1 FAIL or a library error, 2 bad flags or shapes,
 * 3 not supported here (--backend cuda without a CUDA build or a GPU).
 *
 * Run: build/examples/transformer_block [--tp 2 --sp 2 --order striped] [--sweep]
 * Test: tests/test_transformer.c (make test).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "dtensor/dtensor.h"

#define NAME "transformer_block"
#define MAX_RANKS 64
#define SHOW_TOKENS 8
#define EPS 1e-5f

#include "examples/example_util.h"

typedef struct config {
    int tp, sp, sweep;
    int64_t batch, seq, embed, heads, kv_heads;
    dt_dtype dtype;
    dt_order order;
    dt_backend_kind backend;
    uint64_t seed;
} config;

/* Seeds of the inputs, offsets from --seed. */
enum { S_X, S_G1, S_WQ, S_WK, S_WV, S_WO, S_G2, S_W1, S_W2 };

/* Stages whose Layout rank 0 records. */
enum { L_X, L_H, L_QKV, L_Q4, L_ATT, L_OPROJ, L_X1, L_U, L_Y, L_OUT, L_COUNT };
static const char *const stage_names[L_COUNT] = {
    "X", "RMSNorm(X)", "H @ Wq", "Q as [B,S,H,D], rotary", "attention", "A @ Wo",
    "X1 = X + allreduce", "RMSNorm(X1) @ W1, GELU", "G @ W2", "X2 = X1 + allreduce",
};

typedef struct run {
    const config *cfg;
    /* Written by ranks, read by the main thread after dt_launch returns. */
    float *out;                              /* rank 0: [B, S, E] gathered, fp32 */
    char layout[L_COUNT][128];               /* rank 0 */
    int64_t tokens[MAX_RANKS][SHOW_TOKENS];  /* tp coordinate 0, per sp coordinate */
    int64_t n_tokens;
    double seconds;                          /* rank 0, barrier to barrier */
    dt_backend_kind backend;
} run;

/* Parameters: w = offset + scale * r, r the stored random value, computed in
 * fp32 and stored in the dtype. Matrices: offset 0, scale 2^-k with 2^k near
 * sqrt(fan_in / 3) (exact). Norm weights: 1 + r/2, in [0.5, 1.5). */
static float stored(dt_dtype dtype, float v) {
    return dt_value_round(v, dtype);
}

static float param_value(dt_dtype dtype, uint64_t seed, uint64_t i, float offset, float scale) {
    float r = stored(dtype, dt_random_value(seed, i));
    return stored(dtype, offset + scale * r);
}

/* A norm weight [E], Replicate: every rank fills its (whole) copy. */
static dt_status make_norm_weight(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int64_t E,
                                  uint64_t seed, dt_tensor **out) {
    const dt_layout rep = dt_layout_replicated(dt_mesh_ndim(mesh));
    DT_TRY(dt_tensor_create(ctx, mesh, dtype, 1, &E, &rep, out));
    dt_status st = dt_tensor_fill_random(*out, seed);
    if (st == DT_SUCCESS) st = ex_transform_local(*out, 1.0f, 0.5f);
    return st;
}

typedef struct block_weights {
    dt_tensor *g1, *wq, *wk, *wv, *wo, *g2, *w1, *w2;
} block_weights;

static void weights_destroy(block_weights *w) {
    dt_tensor_destroy(w->g1);
    dt_tensor_destroy(w->wq);
    dt_tensor_destroy(w->wk);
    dt_tensor_destroy(w->wv);
    dt_tensor_destroy(w->wo);
    dt_tensor_destroy(w->g2);
    dt_tensor_destroy(w->w1);
    dt_tensor_destroy(w->w2);
}

static void note(char (*lay)[128], int stage, const dt_tensor *t) {
    if (lay) dt_layout_format(dt_tensor_layout(t), lay[stage], 128);
}

/* x [B, S, E] under [Replicate, Shard(1, order)] -> *out, same Layout.
 * Collective over the mesh (tp x sp). */
static dt_status block_forward(const config *c, const dt_tensor *x, const block_weights *w,
                               dt_tensor **out, char (*lay)[128]) {
    const int64_t B = c->batch, S = c->seq, E = c->embed, H = c->heads, G = c->kv_heads;
    const int64_t D = E / H;
    dt_tensor *h = NULL, *q2 = NULL, *k2 = NULL, *v2 = NULL, *q = NULL, *k = NULL, *v = NULL;
    dt_tensor *qr = NULL, *kr = NULL, *a = NULL, *a2 = NULL, *op = NULL, *o = NULL, *x1 = NULL;
    dt_tensor *h2 = NULL, *y = NULL;
    dt_status st;
    const dt_layout *xl = dt_tensor_layout(x); /* [Replicate, Shard(1, order)] */
    note(lay, L_X, x);

    /* Attention half. */
    DT_TRY_GOTO(st, dt_rmsnorm(x, w->g1, EPS, &h), out);
    note(lay, L_H, h);
    DT_TRY_GOTO(st, dt_matmul(h, w->wq, &q2), out);    /* column-parallel over heads */
    DT_TRY_GOTO(st, dt_matmul(h, w->wk, &k2), out);
    DT_TRY_GOTO(st, dt_matmul(h, w->wv, &v2), out);
    note(lay, L_QKV, q2);
    const int64_t qs[4] = {B, S, H, D}, ks[4] = {B, S, G, D}, fs[3] = {B, S, H * D};
    DT_TRY_GOTO(st, dt_tensor_reshape(q2, 4, qs, &q), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(k2, 4, ks, &k), out);
    DT_TRY_GOTO(st, dt_tensor_reshape(v2, 4, ks, &v), out);
    DT_TRY_GOTO(st, dt_rotary(q, NULL, &qr), out);     /* positions from the Layout */
    DT_TRY_GOTO(st, dt_rotary(k, NULL, &kr), out);
    note(lay, L_Q4, qr);
    DT_TRY_GOTO(st, dt_attention_forward(qr, kr, v, NULL, &a, NULL), out);
    note(lay, L_ATT, a);
    DT_TRY_GOTO(st, dt_tensor_reshape(a, 3, fs, &a2), out);
    DT_TRY_GOTO(st, dt_matmul(a2, w->wo, &op), out);   /* row-parallel: Partial on tp */
    note(lay, L_OPROJ, op);
    DT_TRY_GOTO(st, dt_tensor_redistribute(op, xl, &o), out); /* all-reduce over tp */
    DT_TRY_GOTO(st, dt_add(x, o, &x1), out);
    note(lay, L_X1, x1);

    /* MLP half. */
    DT_TRY_GOTO(st, dt_rmsnorm(x1, w->g2, EPS, &h2), out);
    /* W1 column-parallel, W2 row-parallel: Partial on tp, all-reduced to xl */
    DT_TRY_GOTO(st, ex_mlp_forward(h2, w->w1, w->w2, xl, &y, NULL, lay ? lay[L_U] : NULL,
                                   lay ? lay[L_Y] : NULL), out);
    DT_TRY_GOTO(st, dt_add(x1, y, out), out);
    note(lay, L_OUT, *out);
out:
    dt_tensor_destroy(y);
    dt_tensor_destroy(h2);
    dt_tensor_destroy(x1);
    dt_tensor_destroy(o);
    dt_tensor_destroy(op);
    dt_tensor_destroy(a2);
    dt_tensor_destroy(a);
    dt_tensor_destroy(kr);
    dt_tensor_destroy(qr);
    dt_tensor_destroy(v);
    dt_tensor_destroy(k);
    dt_tensor_destroy(q);
    dt_tensor_destroy(v2);
    dt_tensor_destroy(k2);
    dt_tensor_destroy(q2);
    dt_tensor_destroy(h);
    return st;
}

static dt_status rank_block(dt_context *ctx, void *arg) {
    run *r = arg;
    const config *c = r->cfg;
    const int rank = dt_context_rank(ctx);
    const int64_t E = c->embed, H = c->heads, G = c->kv_heads, D = E / H, F = 4 * E;
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *out = NULL, *gathered = NULL;
    block_weights w;
    memset(&w, 0, sizeof w);
    dt_status st;
    const int sizes[2] = {c->tp, c->sp};
    const char *names[2] = {"tp", "sp"};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 2, sizes, names, &mesh), out);

    /* The residual stream: whole on tp, tokens sharded on sp. */
    const dt_layout xl = dt_layout_2d(dt_replicate(), dt_shard(1, c->order));
    const int64_t xs[3] = {c->batch, c->seq, E};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 3, xs, &xl, &x), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, c->seed + S_X), out);

    const dt_layout col = dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_replicate());
    const dt_layout row = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate());
    const uint64_t s = c->seed;
    DT_TRY_GOTO(st, make_norm_weight(ctx, mesh, c->dtype, E, s + S_G1, &w.g1), out);
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, E, H * D, s + S_WQ, &col, &w.wq), out);
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, E, G * D, s + S_WK, &col, &w.wk), out);
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, E, G * D, s + S_WV, &col, &w.wv), out);
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, H * D, E, s + S_WO, &row, &w.wo), out);
    DT_TRY_GOTO(st, make_norm_weight(ctx, mesh, c->dtype, E, s + S_G2, &w.g2), out);
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, E, F, s + S_W1, &col, &w.w1), out);
    DT_TRY_GOTO(st, ex_make_weight(ctx, mesh, c->dtype, F, E, s + S_W2, &row, &w.w2), out);

    /* The tokens this rank holds: the positions the rotary embedding uses. */
    const int sp_coord = dt_mesh_coord(mesh, 1);
    if (dt_mesh_coord(mesh, 0) == 0) {
        const int64_t local = dt_tensor_local_shape(x)[1];
        const int64_t n = local < SHOW_TOKENS ? local : SHOW_TOKENS;
        if (sp_coord == 0) r->n_tokens = n;   /* one writer: every sp rank holds as many */
        for (int64_t i = 0; i < n; i++)
            r->tokens[sp_coord][i] = dt_order_global(c->order, c->seq, c->sp, sp_coord, i);
    }

    dt_comm *world = dt_context_comm(ctx);
    DT_TRY_GOTO(st, dt_comm_barrier(world), out);
    const double t0 = ex_now_s();
    DT_TRY_GOTO(st, block_forward(c, x, &w, &out, rank == 0 ? r->layout : NULL), out);
    DT_TRY_GOTO(st, dt_comm_barrier(world), out);
    if (rank == 0) r->seconds = ex_now_s() - t0;

    DT_TRY_GOTO(st, dt_tensor_gather(out, 0, &gathered), out);
    if (rank == 0) {
        DT_TRY_GOTO(st, ex_to_host_f32(gathered, &r->out), out);
        r->backend = dt_context_backend(ctx);
    }
out:
    dt_tensor_destroy(gathered);
    dt_tensor_destroy(out);
    weights_destroy(&w);
    dt_tensor_destroy(x);
    dt_mesh_destroy(mesh);
    return st;
}

/* ------------------------------------------------------------------------
 * The one-rank reference: the same block in double precision, plain loops.
 * ---------------------------------------------------------------------- */

static void param_array(const config *c, uint64_t seed, int64_t n, float offset, float scale,
                        double *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = param_value(c->dtype, c->seed + seed, (uint64_t)i, offset, scale);
}

static void ref_rmsnorm(const double *x, const double *g, int64_t M, int64_t E, double *y) {
    for (int64_t m = 0; m < M; m++) {
        double ss = 0;
        for (int64_t e = 0; e < E; e++) ss += x[m * E + e] * x[m * E + e];
        const double inv = 1.0 / sqrt(ss / (double)E + (double)EPS);
        for (int64_t e = 0; e < E; e++) y[m * E + e] = x[m * E + e] * inv * g[e];
    }
}

/* Rotary, half style, base 10000, position = the token index s. */
static void ref_rotary(double *t, int64_t B, int64_t S, int64_t NH, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < NH; h++) {
                double *v = t + ((b * S + s) * NH + h) * D;
                for (int64_t i = 0; i < D / 2; i++) {
                    const double ang = (double)s * pow(10000.0, -2.0 * (double)i / (double)D);
                    const double a = v[i], bb = v[i + D / 2];
                    v[i] = a * cos(ang) - bb * sin(ang);
                    v[i + D / 2] = a * sin(ang) + bb * cos(ang);
                }
            }
}

/* Causal attention with GQA, scale 1/sqrt(D): o [B, S, H, D]. */
static void ref_attention(const double *q, const double *k, const double *v, int64_t B, int64_t S,
                          int64_t H, int64_t G, int64_t D, double *o, double *w) {
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                const int64_t g = h / (H / G);
                const double *qi = q + ((b * S + i) * H + h) * D;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *kj = k + ((b * S + j) * G + g) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                    w[j] = scale * dot;
                    if (w[j] > mx) mx = w[j];
                }
                double *oi = o + ((b * S + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++) oi[d] = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double p = exp(w[j] - mx);
                    const double *vj = v + ((b * S + j) * G + g) * D;
                    sum += p;
                    for (int64_t d = 0; d < D; d++) oi[d] += p * vj[d];
                }
                for (int64_t d = 0; d < D; d++) oi[d] /= sum;
            }
}

/* The block's output [B, S, E] in double; NULL when out of memory. */
static double *reference(const config *c) {
    const int64_t B = c->batch, S = c->seq, E = c->embed, H = c->heads, G = c->kv_heads;
    const int64_t D = E / H, F = 4 * E, M = B * S;
    double *x = malloc((size_t)(M * E) * sizeof *x), *g1 = malloc((size_t)E * sizeof *g1);
    double *g2 = malloc((size_t)E * sizeof *g2), *wq = malloc((size_t)(E * H * D) * sizeof *wq);
    double *wk = malloc((size_t)(E * G * D) * sizeof *wk), *wv = malloc((size_t)(E * G * D) * sizeof *wv);
    double *wo = malloc((size_t)(H * D * E) * sizeof *wo), *w1 = malloc((size_t)(E * F) * sizeof *w1);
    double *w2 = malloc((size_t)(F * E) * sizeof *w2), *h = malloc((size_t)(M * E) * sizeof *h);
    double *q = malloc((size_t)(M * H * D) * sizeof *q), *k = malloc((size_t)(M * G * D) * sizeof *k);
    double *v = malloc((size_t)(M * G * D) * sizeof *v), *a = malloc((size_t)(M * H * D) * sizeof *a);
    double *t = malloc((size_t)(M * F) * sizeof *t), *y = malloc((size_t)(M * E) * sizeof *y);
    double *sc = malloc((size_t)S * sizeof *sc);
    double *res = NULL;
    if (!x || !g1 || !g2 || !wq || !wk || !wv || !wo || !w1 || !w2 || !h || !q || !k || !v || !a ||
        !t || !y || !sc)
        goto out;
    for (int64_t i = 0; i < M * E; i++) x[i] = stored(c->dtype, dt_random_value(c->seed + S_X, (uint64_t)i));
    param_array(c, S_G1, E, 1.0f, 0.5f, g1);
    param_array(c, S_G2, E, 1.0f, 0.5f, g2);
    param_array(c, S_WQ, E * H * D, 0.0f, ex_weight_scale(E), wq);
    param_array(c, S_WK, E * G * D, 0.0f, ex_weight_scale(E), wk);
    param_array(c, S_WV, E * G * D, 0.0f, ex_weight_scale(E), wv);
    param_array(c, S_WO, H * D * E, 0.0f, ex_weight_scale(H * D), wo);
    param_array(c, S_W1, E * F, 0.0f, ex_weight_scale(E), w1);
    param_array(c, S_W2, F * E, 0.0f, ex_weight_scale(F), w2);

    ref_rmsnorm(x, g1, M, E, h);
    ex_ref_matmul(h, wq, M, E, H * D, q);
    ex_ref_matmul(h, wk, M, E, G * D, k);
    ex_ref_matmul(h, wv, M, E, G * D, v);
    ref_rotary(q, B, S, H, D);
    ref_rotary(k, B, S, G, D);
    ref_attention(q, k, v, B, S, H, G, D, a, sc);
    ex_ref_matmul(a, wo, M, H * D, E, y);
    for (int64_t i = 0; i < M * E; i++) x[i] += y[i]; /* x is now X1 */
    ref_rmsnorm(x, g2, M, E, h);
    ex_ref_matmul(h, w1, M, E, F, t);
    ex_ref_gelu(t, M * F);
    ex_ref_matmul(t, w2, M, F, E, y);
    for (int64_t i = 0; i < M * E; i++) y[i] += x[i];
    res = y;
    y = NULL;
out:
    free(x), free(g1), free(g2), free(wq), free(wk), free(wv), free(wo), free(w1), free(w2);
    free(h), free(q), free(k), free(v), free(a), free(t), free(y), free(sc);
    return res;
}

/* ------------------------------------------------------------------------
 * Flags and shapes.
 * ---------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: " NAME " [flags]\n"
            "  --tp T             tensor-parallel ranks (heads, MLP hidden), default 2\n"
            "  --sp S             sequence-parallel ranks (the attention ring), default 2;\n"
            "                     world = T*S threads, at most %d\n"
            "  --batch B          batch, default 2\n"
            "  --seq S            tokens, a multiple of sp (of 2*sp for zigzag), default 48\n"
            "  --embed E          hidden size, E = heads * D, default 256\n"
            "  --heads H          query heads, default 8 (D = E/H: a multiple of 8 up to %d)\n"
            "  --kv-heads HKV     key/value heads, dividing H and divisible by tp, default H/2\n"
            "                     (H where H/2 is not a multiple of tp)\n"
            "  --order O          contiguous | striped | zigzag (the sp sharding), default striped\n"
            "  --dtype T          fp32 | bf16 | fp16, default fp32\n"
            "  --backend K        auto | cpu | cuda, default auto (DT_BACKEND, else the best built)\n"
            "  --seed N           inputs from seeds N .. N+8, default 1\n"
            "  --sweep            run the meshes 1x1, 1x4, 2x2, 4x1, 2x3 with every order\n"
            "  --help             this text\n"
            "exit status: 0 PASS, 1 FAIL or a library error, 2 bad flags or shapes,\n"
            "3 not supported here (--backend cuda without a CUDA build or a GPU)\n",
            MAX_RANKS, DT_ATTN_MAX_HEAD_DIM);
}

/* Why this mesh and order cannot run these shapes, or NULL if they can. */
static const char *shape_problem(const config *c, char *buf, size_t size) {
    const int64_t E = c->embed, H = c->heads, G = c->kv_heads;
    if (c->tp * c->sp > MAX_RANKS) {
        snprintf(buf, size, "--tp %d x --sp %d = %d ranks, more than %d", c->tp, c->sp,
                 c->tp * c->sp, MAX_RANKS);
    } else if (E % H) {
        snprintf(buf, size, "--heads %lld does not divide --embed %lld", (long long)H, (long long)E);
    } else if ((E / H) % 8 || E / H > DT_ATTN_MAX_HEAD_DIM) {
        snprintf(buf, size, "head dim E/H = %lld: the attention kernels take multiples of 8 up "
                 "to %d", (long long)(E / H), DT_ATTN_MAX_HEAD_DIM);
    } else if (H % G) {
        snprintf(buf, size, "--kv-heads %lld does not divide --heads %lld", (long long)G,
                 (long long)H);
    } else if (H % c->tp) {
        snprintf(buf, size, "--heads %lld is not divisible by --tp %d (heads are split over tp)",
                 (long long)H, c->tp);
    } else if (G % c->tp) {
        snprintf(buf, size, "--kv-heads %lld is not divisible by --tp %d (heads are split over "
                 "tp, whole kv groups per rank)", (long long)G, c->tp);
    } else if (c->seq % c->sp) {
        snprintf(buf, size, "--seq %lld is not divisible by --sp %d", (long long)c->seq, c->sp);
    } else if (c->order == DT_ORDER_ZIGZAG && c->seq % (2 * c->sp)) {
        snprintf(buf, size, "zigzag needs --seq %lld divisible by 2*sp = %d", (long long)c->seq,
                 2 * c->sp);
    } else {
        return NULL;
    }
    return buf;
}

static int parse_flags(int argc, char **argv, config *c) {
    static const char *const order_names[] = {"contiguous", "striped", "zigzag"};
    static const dt_order orders[] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        int k;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--sweep")) {
            c->sweep = 1;
            continue;
        } else if (!strcmp(a, "--tp")) {
            if (!ex_parse_int(a, v, 1, MAX_RANKS, &x)) return 2;
            c->tp = (int)x;
        } else if (!strcmp(a, "--sp")) {
            if (!ex_parse_int(a, v, 1, MAX_RANKS, &x)) return 2;
            c->sp = (int)x;
        } else if (!strcmp(a, "--batch")) {
            if (!ex_parse_int(a, v, 1, 4096, &x)) return 2;
            c->batch = x;
        } else if (!strcmp(a, "--seq")) {
            if (!ex_parse_int(a, v, 1, 1 << 16, &x)) return 2;
            c->seq = x;
        } else if (!strcmp(a, "--embed")) {
            if (!ex_parse_int(a, v, 1, 1 << 14, &x)) return 2;
            c->embed = x;
        } else if (!strcmp(a, "--heads")) {
            if (!ex_parse_int(a, v, 1, 4096, &x)) return 2;
            c->heads = x;
        } else if (!strcmp(a, "--kv-heads")) {
            if (!ex_parse_int(a, v, 1, 4096, &x)) return 2;
            c->kv_heads = x;
        } else if (!strcmp(a, "--order")) {
            if ((k = ex_parse_choice(a, v, order_names, 3)) < 0) return 2;
            c->order = orders[k];
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
        i++;
    }
    if (!c->kv_heads) c->kv_heads = ex_default_kv_heads(c->heads, c->tp);   /* not given */
    /* A sweep picks its meshes and orders; the shapes must still suit one
     * rank (the reference needs whole heads and kv groups). */
    config one = *c;
    if (c->sweep) one.tp = 1, one.sp = 1, one.order = DT_ORDER_CONTIGUOUS;
    char why[256];
    if (shape_problem(&one, why, sizeof why)) {
        fprintf(stderr, NAME ": %s\n", why);
        return 2;
    }
    const double work = (double)c->batch * (double)c->seq *
                        ((double)c->embed * (double)c->embed * 12.0 + (double)c->seq * c->embed);
    if (work > 4e10) {
        fprintf(stderr, NAME ": about %.3g multiply-adds is more than the double-precision check "
                "should take here (4e10)\n", work);
        return 2;
    }
    return -1;
}

/* Runs one mesh and order; prints details unless quiet. Returns 0 PASS,
 * 1 FAIL or error (message printed), 3 not supported. */
static int run_one(const config *c, const double *ref, int quiet, double *max_err, double *ms) {
    const int64_t n = c->batch * c->seq * c->embed;
    run *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, NAME ": out of memory\n");
        return 1;
    }
    r->cfg = c;
    dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
    lo.backend = c->backend;
    dt_status st = dt_launch(c->tp * c->sp, rank_block, r, &lo);
    if (st != DT_SUCCESS) {
        fprintf(stderr, NAME ": %dx%d %s: %s: %s\n", c->tp, c->sp, dt_order_name(c->order),
                dt_status_name(st), dt_last_error());
        free(r->out);
        free(r);
        return st == DT_ERR_NOT_SUPPORTED ? 3 : 1;
    }
    if (!quiet) {
        printf("\nLayouts (mesh dims tp, sp) as rank 0 saw them:\n");
        for (int l = 0; l < L_COUNT; l++) printf("  %-24s %s\n", stage_names[l], r->layout[l]);
        printf("\ntokens each sp rank holds (%s order): these are the positions dt_rotary uses\n",
               dt_order_name(c->order));
        for (int j = 0; j < c->sp && j < 16; j++) {
            printf("  sp rank %d:", j);
            for (int64_t i = 0; i < r->n_tokens; i++) printf(" %lld", (long long)r->tokens[j][i]);
            printf("%s\n", c->seq / c->sp > SHOW_TOKENS ? " ..." : "");
        }
        printf("\nblock forward on the %s backend: %.2f ms (%d ranks as threads)\n",
               dt_backend_kind_name(r->backend), 1e3 * r->seconds, c->tp * c->sp);
    }
    /* fp32: summation order and fp32 kernels. bf16: every op's output is
     * rounded to bf16 (2^-9 relative) and the residual stream is bf16;
     * fp16 likewise, finer. The bounds of tests/test_transformer.c and
     * TUTORIAL.md. */
    const double atol = c->dtype == DT_F32 ? 1e-4 : c->dtype == DT_F16 ? 1e-2 : 8e-2;
    const double rtol = c->dtype == DT_F32 ? 1e-4 : c->dtype == DT_F16 ? 5e-3 : 4e-2;
    const ex_check chk = ex_check_result(r->out, ref, n, atol, rtol);
    if (!quiet)
        printf("max |out - ref| = %.3g against the block in double precision on one rank\n"
               "  tolerance %g + %g*|ref|: %ld of %lld outside, worst error/tolerance %.3f\n",
               chk.max_err, atol, rtol, chk.bad, (long long)n, chk.worst);
    *max_err = chk.max_err;
    *ms = 1e3 * r->seconds;
    free(r->out);
    free(r);
    return chk.bad ? 1 : 0;
}

int main(int argc, char **argv) {
    config c = {
        .tp = 2, .sp = 2, .sweep = 0, .batch = 2, .seq = 48, .embed = 256, .heads = 8,
        .kv_heads = 0, .dtype = DT_F32, .order = DT_ORDER_STRIPED, .backend = DT_BACKEND_AUTO,
        .seed = 1,
    };
    int rc = parse_flags(argc, argv, &c);
    if (rc >= 0) return rc;
    printf(NAME ": X [%lld, %lld, %lld], %lld heads (%lld kv heads) of D = %lld, MLP %lld -> %lld"
           " -> %lld, %s\n", (long long)c.batch, (long long)c.seq, (long long)c.embed,
           (long long)c.heads, (long long)c.kv_heads, (long long)(c.embed / c.heads),
           (long long)c.embed, (long long)(4 * c.embed), (long long)c.embed,
           dt_dtype_name(c.dtype));
    fflush(stdout);
    double *ref = reference(&c);
    if (!ref) {
        fprintf(stderr, NAME ": out of memory for the reference\n");
        return 1;
    }
    int status = 0;
    double err = 0, ms = 0;
    if (!c.sweep) {
        printf("mesh tp x sp = %d x %d, sequence %s over sp\n", c.tp, c.sp, dt_order_name(c.order));
        status = run_one(&c, ref, 0, &err, &ms);
        if (status != 3) printf("result: %s\n", status ? "FAIL" : "PASS");
    } else {
        static const int meshes[][2] = {{1, 1}, {1, 4}, {2, 2}, {4, 1}, {2, 3}};
        static const dt_order orders[] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
        printf("\n  %-6s %-11s %12s %10s  %s\n", "tp x sp", "order", "max error", "ms", "result");
        int failed = 0;
        for (size_t m = 0; m < sizeof meshes / sizeof meshes[0] && status != 3; m++)
            for (int o = 0; o < 3 && status != 3; o++) {
                config one = c;
                one.tp = meshes[m][0];
                one.sp = meshes[m][1];
                one.order = orders[o];
                char why[256], mesh[16];
                snprintf(mesh, sizeof mesh, "%dx%d", one.tp, one.sp);
                if (shape_problem(&one, why, sizeof why)) {
                    printf("  %-6s %-11s %12s %10s  n/a: %s\n", mesh, dt_order_name(one.order), "",
                           "", why);
                    continue;
                }
                int s = run_one(&one, ref, 1, &err, &ms);
                if (s == 3) { /* the backend is missing: so for every mesh */
                    status = 3;
                    continue;
                }
                failed += s != 0;
                printf("  %-6s %-11s %12.3g %10.2f  %s\n", mesh, dt_order_name(one.order), err, ms,
                       s ? "FAIL" : "PASS");
            }
        if (status != 3) {
            status = failed ? 1 : 0;
            printf("result: %s\n", failed ? "FAIL" : "PASS");
        }
    }
    free(ref);
    return status;
}
