/* tests/test_nonfinite.c — NaN and Inf in attention, the range within which
 * attention is exact, and DT_CHECK's finiteness checks of attention and the
 * collectives (docs/RELIABILITY.md, "Non-finite values" and "Range").
 *
 *   poison/...     one NaN (or Inf) in q, k, v or dout at a chosen global
 *                  element; the distributed forward and backward (P = 1, 2, 4;
 *                  every order; causal and full) against a propagation
 *                  written here from the formulas of tests/attn_ref.h, over
 *                  the allowed pairs only, with a non-finite logit counted as
 *                  NaN: every output that formula reaches is NaN (o, lse) or
 *                  not finite (gradients; NaN for a NaN input); every other
 *                  output matches the double reference of the clean inputs.
 *                  A value of v or dout, and in the backward any input, may
 *                  also reach outputs of the same batch and key head that the
 *                  mask keeps from it (a masked pair inside a computed tile:
 *                  0 x NaN); those must be NaN or match, nothing outside them
 *                  may change. On CUDA (make CUDA=emu: the emulator) the
 *                  same for DT_ATTN_KERNEL = simple, mma and wgmma.
 *   masked/...     a query block whose keys are all masked, with NaN in those
 *                  keys and values, still gives o = 0 and lse = -inf (CPU
 *                  block kernel; on CUDA, each kernel's LATEST form with
 *                  the block's nonfinite set, and the CUDA table's
 *                  exact_nonfinite: 1 for the LATEST choices only).
 *   range/...      a scale of 3e38, q and k of 1e30, v of 1e37, and in the
 *                  backward dout of 1e35 are rejected with DT_ERR_OUT_OF_RANGE
 *                  on every rank, with no output written; over a grid of
 *                  magnitudes and scales every call either succeeds with
 *                  finite outputs that match the reference or is rejected,
 *                  and every call within the stated bound succeeds.
 *   check/...      DT_CHECK=1: a NaN in k (forward) or dout (backward) on one
 *                  rank fails every rank with DT_ERR_NONFINITE, the owner's
 *                  message naming the tensor, its rank and the global index;
 *                  a collective's NaN send fails every rank naming the comm
 *                  rank and index; an all_reduce whose sum overflows fails
 *                  every rank (the received buffer).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/block.h"
#include "attn_ref.h"
#include "dtensor/context_internal.h"
#include "dtensor/dtensor.h"
#include "harness.h"

#define MAXR 4

typedef enum { AT_Q, AT_K, AT_V, AT_DOUT } poison_at;
static const char *const at_name[] = {"q", "k", "v", "dout"};

typedef struct nf_case {
    char name[160];
    attn_shape s;
    int P;
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    dt_backend_kind backend;
    const char *kernel;       /* DT_ATTN_KERNEL for cuda (NULL: unset) */
    poison_at at;
    double value;             /* NAN or INFINITY */
    int64_t b, pos, head, d;  /* the poisoned element (head: of q, or of k/v) */
    /* set by run_poison */
    double *q, *k, *v, *dout;
    float *o, *lse, *dq, *dk, *dv;   /* gathered from the ranks */
    dt_status st[MAXR];
    char msg[MAXR][512];
} nf_case;

static int64_t row_of(const attn_shape *s, int64_t b, int64_t i, int64_t heads, int64_t h) {
    return (b * s->S + i) * heads + h;
}

/* Every rank: the inputs' local rows, the forward and backward, and the
 * outputs written back into the case's full arrays at their global rows. */
static dt_status rank_poison(dt_context *ctx, void *arg) {
    nf_case *c = arg;
    const attn_shape *s = &c->s;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *dout = NULL, *o = NULL, *lse = NULL;
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    const int64_t rows = s->S / c->P, D = s->D;
    const size_t nq = (size_t)(s->B * rows * s->H * D), nk = (size_t)(s->B * rows * s->Hkv * D);
    double *loc = malloc(nq * sizeof *loc);
    float *got = malloc(nq * sizeof *got);
    int64_t *idx = malloc((size_t)rows * sizeof *idx);
    dt_status st = loc && got && idx ? DT_SUCCESS : dt_error(DT_ERR_OUT_OF_MEMORY, "test: memory");
    if (st != DT_SUCCESS) goto out;
    int sizes[1] = {c->P};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, NULL, &mesh), out);
    const int j = dt_mesh_coord(mesh, 0);
    h_order_indices(c->order, s->S, c->P, j, idx);
    dt_layout lay = dt_layout_1d(dt_shard(1, c->order));
    int64_t qshape[4] = {s->B, s->S, s->H, D}, kshape[4] = {s->B, s->S, s->Hkv, D};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &q), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &k), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kshape, &lay, &v), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, qshape, &lay, &dout), out);
    ref_local_rows(c->q, s->B, s->S, s->H, D, c->order, c->P, j, 0, s->H, loc);
    DT_TRY_GOTO(st, ref_set_local(q, loc), out);
    ref_local_rows(c->dout, s->B, s->S, s->H, D, c->order, c->P, j, 0, s->H, loc);
    DT_TRY_GOTO(st, ref_set_local(dout, loc), out);
    ref_local_rows(c->k, s->B, s->S, s->Hkv, D, c->order, c->P, j, 0, s->Hkv, loc);
    DT_TRY_GOTO(st, ref_set_local(k, loc), out);
    ref_local_rows(c->v, s->B, s->S, s->Hkv, D, c->order, c->P, j, 0, s->Hkv, loc);
    DT_TRY_GOTO(st, ref_set_local(v, loc), out);
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    opts.scale = (float)(1.0 / sqrt((double)D));
    DT_TRY_GOTO(st, dt_attention_forward(q, k, v, &opts, &o, &lse), out);
    DT_TRY_GOTO(st, dt_attention_backward(q, k, v, o, lse, dout, &opts, &dq, &dk, &dv), out);
    /* back to global rows: local row x of this rank is global row idx[x] */
    struct { dt_tensor *t; float *full; int64_t heads; } outs[4] = {
        {o, c->o, s->H}, {dq, c->dq, s->H}, {dk, c->dk, s->Hkv}, {dv, c->dv, s->Hkv}};
    for (int w = 0; w < 4; w++) {
        DT_TRY_GOTO(st, ref_get_f32(outs[w].t, got), out);
        const int64_t hd = outs[w].heads * D;
        for (int64_t b = 0; b < s->B; b++)
            for (int64_t x = 0; x < rows; x++)
                memcpy(outs[w].full + (b * s->S + idx[x]) * hd, got + (b * rows + x) * hd,
                       (size_t)hd * sizeof *got);
    }
    (void)nk;
    DT_TRY_GOTO(st, dt_tensor_get_local(lse, got, (size_t)(s->B * s->H * rows) * sizeof *got), out);
    for (int64_t bh = 0; bh < s->B * s->H; bh++)
        for (int64_t x = 0; x < rows; x++) c->lse[bh * s->S + idx[x]] = got[bh * rows + x];
out:
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    dt_tensor *all[] = {q, k, v, dout, o, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    free(loc);
    free(got);
    free(idx);
    return st;
}

/* Which outputs the poisoned element reaches, by the formulas of
 * tests/attn_ref.h over the allowed pairs (1: reached). A logit formed with
 * a non-finite q or k element counts as NaN whatever its sign. */
typedef struct reach {
    unsigned char *o, *lse, *dq, *dk, *dv;
} reach;

static void propagate(const nf_case *c, reach *z) {
    const attn_shape *s = &c->s;
    const int64_t D = s->D, G = s->H / s->Hkv;
    const int64_t nq = s->B * s->S * s->H * D, nk = s->B * s->S * s->Hkv * D;
    z->o = calloc((size_t)nq, 1), z->dq = calloc((size_t)nq, 1);
    z->dk = calloc((size_t)nk, 1), z->dv = calloc((size_t)nk, 1);
    z->lse = calloc((size_t)(s->B * s->H * s->S), 1);
    unsigned char *qn = calloc((size_t)nq, 1), *kn = calloc((size_t)nk, 1);
    unsigned char *vn = calloc((size_t)nk, 1), *dn = calloc((size_t)nq, 1);
    const int64_t at_q = row_of(s, c->b, c->pos, s->H, c->head) * D + c->d;
    const int64_t at_k = row_of(s, c->b, c->pos, s->Hkv, c->head) * D + c->d;
    if (c->at == AT_Q) qn[at_q] = 1;
    if (c->at == AT_K) kn[at_k] = 1;
    if (c->at == AT_V) vn[at_k] = 1;
    if (c->at == AT_DOUT) dn[at_q] = 1;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < s->S; i++) {
                const int64_t g = h / G, n = c->mask == DT_ATTN_CAUSAL ? i + 1 : s->S;
                const int64_t qi = row_of(s, b, i, s->H, h) * D;
                int q_any = 0, rowbad = 0;
                for (int64_t d = 0; d < D; d++) q_any |= qn[qi + d];
                for (int64_t jj = 0; jj < n; jj++) {   /* the logits and the softmax */
                    int k_any = 0;
                    for (int64_t d = 0; d < D; d++) k_any |= kn[row_of(s, b, jj, s->Hkv, g) * D + d];
                    rowbad |= q_any | k_any;
                }
                z->lse[(b * s->H + h) * s->S + i] = (unsigned char)rowbad;
                int delta = 0;   /* rowsum(dout * o) */
                for (int64_t d = 0; d < D; d++) {
                    int od = rowbad;
                    for (int64_t jj = 0; jj < n; jj++) od |= vn[row_of(s, b, jj, s->Hkv, g) * D + d];
                    z->o[qi + d] = (unsigned char)od;
                    delta |= od | dn[qi + d];
                }
                for (int64_t jj = 0; jj < n; jj++) {
                    const int64_t kj = row_of(s, b, jj, s->Hkv, g) * D;
                    int dp = 0;
                    for (int64_t d = 0; d < D; d++) dp |= dn[qi + d] | vn[kj + d];
                    const int ds = rowbad | dp | delta;
                    for (int64_t d = 0; d < D; d++) {
                        z->dv[kj + d] |= (unsigned char)(rowbad | dn[qi + d]);
                        z->dq[qi + d] |= (unsigned char)(ds | kn[kj + d]);
                        z->dk[kj + d] |= (unsigned char)(ds | qn[qi + d]);
                    }
                }
            }
    free(qn), free(kn), free(vn), free(dn);
}

static void reach_free(reach *z) { free(z->o), free(z->lse), free(z->dq), free(z->dk), free(z->dv); }

/* got against the propagation and the clean reference; `spread_ok(x)` says
 * whether element x may also be NaN (the same batch and key head). Returns
 * the number of failures, printing the first few. */
typedef struct judge {
    const nf_case *c;
    const char *what;
    int want_nan;      /* reached elements must be NaN (else: not finite) */
    int spread;        /* may unreached elements of the poisoned batch and key head be NaN */
    int64_t heads;     /* of this output's rows (H, Hkv; lse: H) */
    int lse_layout;    /* [B, H, S] */
    long bad;
} judge;

static void judge_one(judge *j, int64_t x, float got, int reached, double ref, double tol) {
    const nf_case *c = j->c;
    const attn_shape *s = &c->s;
    int64_t b, h;
    if (j->lse_layout) {
        b = x / (s->H * s->S);
        h = (x / s->S) % s->H;
    } else {
        b = x / (s->S * j->heads * s->D);
        h = (x / s->D) % j->heads;
    }
    const int64_t g = j->heads == s->H ? h / (s->H / s->Hkv) : h;
    const int64_t g0 = c->at == AT_Q || c->at == AT_DOUT ? c->head / (s->H / s->Hkv) : c->head;
    const int near = b == c->b && g == g0;
    const char *why = NULL;
    if (reached) {
        if (j->want_nan ? !isnan(got) : isfinite(got)) why = j->want_nan ? "not NaN" : "finite";
    } else if (isnan(got)) {
        if (!(j->spread && near)) why = "NaN where nothing non-finite reaches";
    } else if (!(fabs((double)got - ref) <= tol + tol * fabs(ref))) {
        why = "differs from the clean reference";
    }
    if (!why) return;
    if (j->bad++ < 5)
        print_error("%s: %s[%lld] = %g (reference %g): %s\n", c->name, j->what, (long long)x,
                    (double)got, ref, why);
}

static long judge_all(const nf_case *c, const char *what, const float *got, const unsigned char *z,
                      const double *ref, int64_t n, int want_nan, int spread, int64_t heads,
                      int lse_layout, double tol) {
    judge j = {c, what, want_nan, spread, heads, lse_layout, 0};
    for (int64_t x = 0; x < n; x++) judge_one(&j, x, got[x], z[x], ref[x], tol);
    return j.bad;
}

static double tolerance(dt_dtype dt) { return dt == DT_F32 ? 1e-4 : dt == DT_F16 ? 4e-3 : 3e-2; }

static void run_poison(void **state) {
    nf_case *c = *state;
    const attn_shape *s = &c->s;
    char why[512];
    if (!h_pair_available(c->P, c->backend, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    const int64_t nq = s->B * s->S * s->H * s->D, nk = s->B * s->S * s->Hkv * s->D,
                  nl = s->B * s->H * s->S;
    c->q = ref_input(11, nq, c->dtype), c->k = ref_input(12, nk, c->dtype);
    c->v = ref_input(13, nk, c->dtype), c->dout = ref_input(14, nq, c->dtype);
    double *o_ref = malloc((size_t)nq * sizeof(double)), *lse_ref = malloc((size_t)nl * sizeof(double));
    double *dq_ref = malloc((size_t)nq * sizeof(double)), *dk_ref = malloc((size_t)nk * sizeof(double));
    double *dv_ref = malloc((size_t)nk * sizeof(double));
    const int causal = c->mask == DT_ATTN_CAUSAL;
    const double scale = 1.0 / sqrt((double)s->D);
    ref_attention_forward(s, c->q, c->k, c->v, causal, scale, o_ref, lse_ref);
    ref_attention_backward(s, c->q, c->k, c->v, c->dout, causal, scale, dq_ref, dk_ref, dv_ref);
    /* the poison, after the clean reference */
    double *in[] = {c->q, c->k, c->v, c->dout};
    const int64_t heads = c->at == AT_Q || c->at == AT_DOUT ? s->H : s->Hkv;
    in[c->at][row_of(s, c->b, c->pos, heads, c->head) * s->D + c->d] = c->value;
    c->o = malloc((size_t)nq * sizeof(float)), c->dq = malloc((size_t)nq * sizeof(float));
    c->dk = malloc((size_t)nk * sizeof(float)), c->dv = malloc((size_t)nk * sizeof(float));
    c->lse = malloc((size_t)nl * sizeof(float));
    memset(c->st, 0, sizeof c->st);
    char *saved = h_env_set("DT_ATTN_KERNEL", c->kernel);
    const dt_status st = h_launch_on(c->P, c->backend, DT_TRANSPORT_LOCAL, rank_poison, c);
    h_env_restore("DT_ATTN_KERNEL", saved);
    int refused = 0;
    long bad = 0;
    if (st != DT_SUCCESS) {
        refused = st == DT_ERR_NOT_SUPPORTED && c->kernel && !strncmp(c->kernel, "wgmma", 5) &&
                  (strstr(c->msg[0], "needs a compute capability 9.0") ||
                   strstr(c->msg[0], "wgmma kernel was not built"));
        if (!refused) {
            print_error("%s: %s\n", c->name, dt_last_error());
            for (int r = 0; r < c->P; r++)
                if (c->st[r]) print_error("rank %d: %s\n", r, c->msg[r]);
            bad = 1;
        }
    } else {
        reach z;
        propagate(c, &z);
        if (c->kernel && !strstr(c->kernel, "-latest")) {
            /* a VERIFIED form, which predates the NaN rules: every output of
             * a call with a non-finite input NaN (dout is the backward's only) */
            if (c->at != AT_DOUT) memset(z.o, 1, (size_t)nq), memset(z.lse, 1, (size_t)nl);
            memset(z.dq, 1, (size_t)nq);
            memset(z.dk, 1, (size_t)nk), memset(z.dv, 1, (size_t)nk);
        }
        const double tol = tolerance(c->dtype);
        const int isnan_in = isnan(c->value);
        /* forward: o NaN where reached; a v value may spread within its tile */
        bad += judge_all(c, "o", c->o, z.o, o_ref, nq, 1, c->at == AT_V, s->H, 0, tol);
        bad += judge_all(c, "lse", c->lse, z.lse, lse_ref, nl, 1, 0, s->H, 1, tol);
        bad += judge_all(c, "dq", c->dq, z.dq, dq_ref, nq, isnan_in, 1, s->H, 0, tol);
        bad += judge_all(c, "dk", c->dk, z.dk, dk_ref, nk, isnan_in, 1, s->Hkv, 0, tol);
        bad += judge_all(c, "dv", c->dv, z.dv, dv_ref, nk, isnan_in, 1, s->Hkv, 0, tol);
        reach_free(&z);
    }
    free(c->q), free(c->k), free(c->v), free(c->dout);
    free(c->o), free(c->lse), free(c->dq), free(c->dk), free(c->dv);
    free(o_ref), free(lse_ref), free(dq_ref), free(dk_ref), free(dv_ref);
    if (refused) {
        print_message("skipped: %s\n", c->msg[0]);
        skip();
    }
    assert_int_equal(bad, 0);
}

/* ---- masked/: a fully masked query block ---- */

static void test_masked_block_with_nan(void **state) {
    (void)state;
    enum { N = 40, D = 8 };
    float q[N * D], k[N * D], v[N * D], m[N], l[N], acc[N * D], o[N * D], lse[N];
    for (int i = 0; i < N * D; i++) q[i] = 0.5f, k[i] = NAN, v[i] = i % 3 ? NAN : INFINITY;
    static char scratch[1 << 16];
    assert_true(dt_attn_kernels_cpu.fwd_scratch(D, 1, N) <= sizeof scratch);
    dt_attn_block_args a = {.dtype = DT_F32, .batch = 1, .heads = 1, .kv_heads = 1, .dim = D,
                            .q = q, .q_batch_stride = N * D, .k = k, .v = v,
                            .kv_batch_stride = N * D, .qseg = {0, 1, N}, .kseg = {N, 1, N},
                            .mask = DT_ATTN_CAUSAL, .scale = 1.0f, .m = m, .l = l,
                            .ml_batch_stride = N, .ml_head_stride = N, .acc = acc,
                            .acc_batch_stride = N * D, .first = 1, .last = 1, .o = o, .lse = lse};
    assert_int_equal(dt_attn_kernels_cpu.fwd(NULL, &a, scratch), DT_SUCCESS);
    for (int i = 0; i < N; i++) {
        assert_true(isinf(lse[i]) && lse[i] < 0);
        for (int d = 0; d < D; d++) assert_true(o[i * D + d] == 0.0f);
    }
    /* Keys from position N - 10 on: the first 10 rows see none of them (0,
     * -inf), the others see NaN keys (NaN). */
    a.kseg.start = N - 10;
    assert_int_equal(dt_attn_kernels_cpu.fwd(NULL, &a, scratch), DT_SUCCESS);
    for (int i = 0; i < N; i++) {
        const int none = i < N - 10;
        assert_true(none ? isinf(lse[i]) && lse[i] < 0 : isnan(lse[i]));
        for (int d = 0; d < D; d++) assert_true(none ? o[i * D + d] == 0.0f : isnan(o[i * D + d]));
    }
}

/* The same on CUDA, through the kernel table (attention/cuda/block.cu) on
 * one rank's backend: 200 query rows at positions 0 .. 199, 200 keys at 100
 * .. 299 whose k and v are all NaN, bf16, D = 64, two query heads on one kv
 * head, one block (first and last) with nonfinite set, in each LATEST form:
 * rows 0 .. 99 see no key (o = 0, lse = -inf; rows 64 .. 99 share tiles with
 * rows that see NaN keys), the others NaN. And exact_nonfinite says 1 for
 * the LATEST choices, 0 for auto and the VERIFIED ones. */
typedef struct cuda_masked_case {
    long bad;
    int ran[3];   /* simple-latest, mma-latest, wgmma-latest ran (else not supported) */
    char msg[512];
} cuda_masked_case;

static dt_status rank_cuda_masked(dt_context *ctx, void *arg) {
    cuda_masked_case *c = arg;
#ifdef DT_HAVE_CUDA
    dt_backend *be = ctx->backend;
    enum { N = 200, H = 2, D = 64 };
    const size_t nq = (size_t)N * H * D, nk = (size_t)N * D, nrow = (size_t)H * N;
    void *q = NULL, *k = NULL, *o = NULL, *scratch = NULL;
    float *acc = NULL, *m = NULL, *l = NULL, *lse = NULL;
    uint16_t *hq = malloc(nq * 2), *ho = malloc(nq * 2);
    float *hl = malloc(nrow * sizeof *hl);
    dt_status st = hq && ho && hl ? DT_SUCCESS : DT_ERR_OUT_OF_MEMORY;
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nq * 2, &q);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nk * 2, &k);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nq * 2, &o);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, dt_attn_kernels_cuda.fwd_scratch(D, H, N) + 1, &scratch);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nq * sizeof(float), (void **)&acc);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nrow * sizeof(float), (void **)&m);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nrow * sizeof(float), (void **)&l);
    if (st == DT_SUCCESS) st = be->ops->alloc(be, nrow * sizeof(float), (void **)&lse);
    for (size_t i = 0; st == DT_SUCCESS && i < nq; i++)
        hq[i] = dt_f32_to_bf16((float)dt_random_value(61, i));
    if (st == DT_SUCCESS) st = be->ops->upload(be, q, hq, nq * 2);
    for (size_t i = 0; st == DT_SUCCESS && i < nk; i++) hq[i] = 0xffffu;   /* bf16 NaN */
    if (st == DT_SUCCESS) st = be->ops->upload(be, k, hq, nk * 2);   /* k and v alike */
    const dt_attn_kernel_choice latest[3] = {DT_ATTN_KERNEL_SIMPLE_LATEST,
                                             DT_ATTN_KERNEL_MMA_LATEST,
                                             DT_ATTN_KERNEL_WGMMA_LATEST};
    for (int kc = 0; kc < 3 && st == DT_SUCCESS; kc++) {
        dt_attn_block_args a = {
            .dtype = DT_BF16, .nonfinite = 1, .batch = 1, .heads = H, .kv_heads = 1, .dim = D,
            .q = q, .q_batch_stride = (int64_t)nq, .k = k, .v = k, .kv_batch_stride = (int64_t)nk,
            .qseg = {0, 1, N, 0, 0}, .kseg = {100, 1, N, 0, 0}, .mask = DT_ATTN_CAUSAL,
            .scale = 0.125f, .m = m, .l = l, .ml_batch_stride = H * N, .ml_head_stride = N,
            .acc = acc, .acc_batch_stride = (int64_t)nq, .first = 1, .last = 1, .o = o,
            .lse = lse, .tuning = {latest[kc], 1, 1, 1}};
        st = dt_attn_kernels_cuda.fwd(be, &a, scratch);
        if (st == DT_ERR_NOT_SUPPORTED) {   /* a tensor-core kernel this device lacks */
            st = DT_SUCCESS;
            continue;
        }
        if (st == DT_SUCCESS) st = be->ops->sync(be);
        if (st == DT_SUCCESS) st = be->ops->download(be, ho, o, nq * 2);
        if (st == DT_SUCCESS) st = be->ops->download(be, hl, lse, nrow * sizeof *hl);
        if (st != DT_SUCCESS) break;
        c->ran[kc] = 1;
        for (int64_t x = 0; x < N; x++)
            for (int64_t h = 0; h < H; h++) {
                const int none = x < 100;
                const float lv = hl[h * N + x];
                int ok = none ? isinf(lv) && lv < 0 : isnan(lv);
                for (int64_t d = 0; d < D; d++) {
                    const float ov = dt_bf16_to_f32(ho[(x * H + h) * D + d]);
                    ok = ok && (none ? ov == 0.0f : isnan(ov));
                }
                if (!ok && c->bad++ < 4)
                    print_error("%s: row %lld head %lld: lse %g, o[0] %g (want %s)\n",
                                dt_attn_kernel_choice_name(latest[kc]), (long long)x,
                                (long long)h, (double)lv,
                                (double)dt_bf16_to_f32(ho[(x * H + h) * D]),
                                none ? "0, -inf" : "NaN");
            }
    }
    /* the plan's question: LATEST choices keep the rules, auto and VERIFIED do not */
    for (int k2 = 0; k2 < DT_ATTN_KERNEL_COUNT && st == DT_SUCCESS; k2++) {
        const dt_attn_kernel_choice kc = (dt_attn_kernel_choice)k2;
        const int want = kc == DT_ATTN_KERNEL_SIMPLE_LATEST ||
                         ((kc == DT_ATTN_KERNEL_MMA_LATEST || kc == DT_ATTN_KERNEL_WGMMA_LATEST) &&
                          c->ran[kc == DT_ATTN_KERNEL_MMA_LATEST ? 1 : 2]);
        const int got = dt_attn_kernels_cuda.exact_nonfinite(be, DT_BF16, D, kc);
        if (got != want && c->bad++ < 8)
            print_error("exact_nonfinite(%s) = %d, want %d\n", dt_attn_kernel_choice_name(kc),
                        got, want);
    }
    void *const device[] = {q, k, o, scratch, acc, m, l, lse};
    for (size_t i = 0; i < sizeof device / sizeof device[0]; i++) be->ops->free(be, device[i]);
    free(hq), free(ho), free(hl);
    if (st != DT_SUCCESS) snprintf(c->msg, sizeof c->msg, "%s", dt_last_error());
    return st;
#else
    (void)ctx;
    (void)c;
    return DT_ERR_NOT_SUPPORTED;
#endif
}

static void test_masked_cuda_block_with_nan(void **state) {
    (void)state;
    char why[512];
    if (!h_pair_available(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    cuda_masked_case c;
    memset(&c, 0, sizeof c);
    const dt_status st = h_launch_on(1, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_cuda_masked, &c);
    if (st != DT_SUCCESS) print_error("%s\n", c.msg);
    assert_int_equal(st, DT_SUCCESS);
    assert_true(c.ran[0]);   /* the simple kernel runs everywhere */
    assert_int_equal(c.bad, 0);
}

/* ---- range/ ---- */

typedef struct range_case {
    double qmag, kmag, vmag, gmag;   /* every element of q, k, v, dout is +-mag x a random
                                        value of [0.5, 1) */
    float scale;
    int backward;
    int lse_low;   /* backward: lse lowered by one ulp, as a forward that rounds otherwise */
    int P;
    dt_status st[MAXR];
    char msg[MAXR][512];
    int wrote[MAXR];       /* a rejected call wrote an output handle */
    long nonfinite[MAXR];  /* outputs not finite after a success */
    long off[MAXR];        /* outputs off the reference after a success */
} range_case;

enum { RB = 1, RS = 32, RH = 2, RD = 16 };

static double range_value(uint64_t seed, int64_t i, double mag) {
    const double u = dt_random_value(seed, (uint64_t)i);   /* [-1, 1) */
    return mag * (u < 0 ? -0.5 + 0.5 * u : 0.5 + 0.5 * u);
}

static dt_status rank_range(dt_context *ctx, void *arg) {
    range_case *c = arg;
    const int r = dt_context_rank(ctx);
    const attn_shape s = {RB, RS, RH, RH, RD};
    const int64_t n = RB * RS * RH * RD, nl = n / c->P;
    dt_mesh *mesh = NULL;
    dt_tensor *t[4] = {NULL, NULL, NULL, NULL}, *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL,
              *dv = NULL;
    double *full[4], *loc = malloc((size_t)nl * sizeof *loc), *ref[5];
    float *got = malloc((size_t)nl * sizeof *got);
    const double mags[4] = {c->qmag, c->kmag, c->vmag, c->gmag};
    for (int i = 0; i < 4; i++) {
        full[i] = malloc((size_t)n * sizeof(double));
        for (int64_t x = 0; x < n; x++) full[i][x] = (double)(float)range_value(21 + (uint64_t)i, x, mags[i]);
    }
    for (int i = 0; i < 5; i++) ref[i] = malloc((size_t)n * sizeof(double));
    dt_status st;
    int sizes[1] = {c->P};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, NULL, &mesh), out);
    const int j = dt_mesh_coord(mesh, 0);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    int64_t shape[4] = {RB, RS, RH, RD};
    for (int i = 0; i < 4; i++) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, &t[i]), out);
        ref_local_rows(full[i], RB, RS, RH, RD, DT_ORDER_STRIPED, c->P, j, 0, RH, loc);
        DT_TRY_GOTO(st, ref_set_local(t[i], loc), out);
    }
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.scale = c->scale;
    o = lse = dq = dk = dv = NULL;
    if (c->backward) {
        DT_TRY_GOTO(st, dt_attention_forward(t[0], t[1], t[2], &opts, &o, &lse), out);
        if (c->lse_low) {
            const size_t nb = dt_tensor_local_bytes(lse);
            float *l = malloc(nb);
            st = l ? dt_tensor_get_local(lse, l, nb) : DT_ERR_OUT_OF_MEMORY;
            for (size_t x = 0; st == DT_SUCCESS && x < nb / sizeof *l; x++)
                l[x] = nextafterf(l[x], -INFINITY);
            if (st == DT_SUCCESS) st = dt_tensor_set_local(lse, l, nb);
            free(l);
            if (st != DT_SUCCESS) goto out;
        }
        st = dt_attention_backward(t[0], t[1], t[2], o, lse, t[3], &opts, &dq, &dk, &dv);
        c->wrote[r] = st != DT_SUCCESS && (dq || dk || dv);
    } else {
        st = dt_attention_forward(t[0], t[1], t[2], &opts, &o, &lse);
        c->wrote[r] = st != DT_SUCCESS && (o || lse);
    }
    if (st != DT_SUCCESS) goto out;
    ref_attention_forward(&s, full[0], full[1], full[2], 1, c->scale, ref[0], ref[1]);
    if (c->backward)
        ref_attention_backward(&s, full[0], full[1], full[2], full[3], 1, c->scale, ref[2], ref[3],
                               ref[4]);
    dt_tensor *outs[5] = {o, NULL, dq, dk, dv};
    for (int w = 0; w < 5; w++) {
        if (!outs[w]) continue;
        DT_TRY_GOTO(st, ref_get_f32(outs[w], got), out);
        ref_local_rows(ref[w], RB, RS, RH, RD, DT_ORDER_STRIPED, c->P, j, 0, RH, loc);
        /* Errors relative to the output's largest element, where the logits'
         * fp32 rounding (relative error about |logit| 2^-24 in p) allows. */
        double scale_ref = 0;
        for (int64_t x = 0; x < nl; x++) scale_ref = fmax(scale_ref, fabs(loc[x]));
        const int accurate = (double)c->scale * RD * c->qmag * c->kmag <= 64.0;
        for (int64_t x = 0; x < nl; x++) {
            if (!isfinite(got[x])) c->nonfinite[r]++;
            else if (accurate && !(fabs((double)got[x] - loc[x]) <= 1e-3 * scale_ref + 1e-30))
                c->off[r]++;
            else if (w == 0 && !(fabs((double)got[x]) <= c->vmag * (1 + 1e-6)))
                c->off[r]++;   /* o: a convex combination of rows of v */
        }
    }
out:
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    for (int i = 0; i < 4; i++) dt_tensor_destroy(t[i]), free(full[i]);
    for (int i = 0; i < 5; i++) free(ref[i]);
    dt_tensor_destroy(o), dt_tensor_destroy(lse);
    dt_tensor_destroy(dq), dt_tensor_destroy(dk), dt_tensor_destroy(dv);
    dt_mesh_destroy(mesh);
    free(loc);
    free(got);
    return st;
}

static range_case range(double q, double k, double v, double g, float scale, int backward,
                        int P) {
    range_case c;
    memset(&c, 0, sizeof c);
    c.qmag = q, c.kmag = k, c.vmag = v, c.gmag = g, c.scale = scale, c.backward = backward;
    c.P = P;
    return c;
}

static dt_status launch_range(range_case *c) {
    memset(c->st, 0, sizeof c->st);
    memset(c->wrote, 0, sizeof c->wrote);
    memset(c->nonfinite, 0, sizeof c->nonfinite);
    memset(c->off, 0, sizeof c->off);
    return h_launch(c->P, rank_range, c);
}

/* Rejected on every rank with DT_ERR_OUT_OF_RANGE, the message saying what. */
static void expect_rejected(range_case *c, const char *what) {
    launch_range(c);
    for (int r = 0; r < c->P; r++) {
        if (c->st[r] != DT_ERR_OUT_OF_RANGE || !strstr(c->msg[r], what))
            fail_msg("rank %d: status %s, message \"%s\" (want DT_ERR_OUT_OF_RANGE, \"%s\")", r,
                     dt_status_name(c->st[r]), c->msg[r], what);
        assert_false(c->wrote[r]);
    }
}

static void test_range_rejects(void **state) {
    (void)state;
    for (int P = 1; P <= 2; P++) {
        range_case c = range(1, 1, 1, 1, 3e38f, 0, P);   /* every logit overflows */
        expect_rejected(&c, "logits may leave fp32's range");
        c = range(1e30, 1e30, 1, 1, 0.25f, 0, P);
        expect_rejected(&c, "logits may leave fp32's range");
        c = range(1e30, 1e10, 1, 1, 1e-30f, 0, P);   /* q.k overflows before the scale */
        expect_rejected(&c, "logits may leave fp32's range");
        c = range(1, 1, 1e37, 1, 0.25f, 0, P);
        expect_rejected(&c, "output's sums may leave fp32's range");
        c = range(1, 1, 1, 1e35, 0.25f, 1, P);
        expect_rejected(&c, "gradients may leave fp32's range");
    }
}

/* Logits of 1e15 and more within the bound: one ulp of lse is far more
 * than 88, so a backward that recomputes a logit rounded otherwise than the
 * forward's sees exp(logit - lse) overflow unless it holds P <= 1. Here lse
 * is one ulp low: the gradients stay finite. */
static void test_range_rounded_lse(void **state) {
    (void)state;
    const double mags[] = {1e15, 1e17};
    for (size_t a = 0; a < sizeof mags / sizeof mags[0]; a++)
        for (int P = 1; P <= 2; P++) {
            range_case c = range(1, mags[a], mags[a], 1, 0.25f, 1, P);
            c.lse_low = 1;
            launch_range(&c);
            for (int r = 0; r < P; r++) {
                if (c.st[r] != DT_SUCCESS)
                    fail_msg("k, v %g P %d rank %d: %s", mags[a], P, r, c.msg[r]);
                if (c.nonfinite[r])
                    fail_msg("k, v %g P %d rank %d: %ld non-finite gradients", mags[a], P, r,
                             c.nonfinite[r]);
            }
        }
}

/* Over magnitudes and scales: success means finite outputs (matching the
 * reference where the logits are small enough for fp32 to be accurate, o a
 * convex combination of v's rows always); within the stated bound every
 * call succeeds. */
static void test_range_grid(void **state) {
    (void)state;
    const double mags[] = {1e-20, 1, 1e3, 1e8, 1e15, 1e19, 1e25};
    const float scales[] = {1e-12f, 0.25f, 1e4f};
    long ran = 0, rejected = 0;
    for (size_t a = 0; a < sizeof mags / sizeof mags[0]; a++)
        for (size_t b = 0; b < sizeof mags / sizeof mags[0]; b += 2)
            for (size_t sc = 0; sc < sizeof scales / sizeof scales[0]; sc++)
                for (int backward = 0; backward < 2; backward++) {
                    range_case c = range(mags[a], mags[b], backward ? mags[b] : 1.0, 1.0,
                                         scales[sc], backward, 2);
                    launch_range(&c);
                    /* the bound of docs/RELIABILITY.md, with the largest |x| here (mag) */
                    const double lim = FLT_MAX / 4.0, sm = fmax((double)c.scale, 1.0);
                    int within = sm * RD * c.qmag * c.kmag * 1.4426950408889634 < lim &&
                                 RS * c.vmag < lim;
                    if (backward)
                        within = within && sm * RS * 2.0 * RD * c.gmag * c.vmag *
                                                   fmax(c.qmag, c.kmag) < lim && RS * c.gmag < lim;
                    for (int r = 0; r < c.P; r++) {
                        if (c.st[r] == DT_SUCCESS) {
                            ran++;
                            if (c.nonfinite[r] || c.off[r])
                                fail_msg("q %g k %g v %g scale %g %s rank %d: success with %ld "
                                         "non-finite and %ld wrong outputs", c.qmag, c.kmag, c.vmag,
                                         (double)c.scale, backward ? "backward" : "forward", r,
                                         c.nonfinite[r], c.off[r]);
                        } else if (c.st[r] == DT_ERR_OUT_OF_RANGE) {
                            rejected++;
                            assert_false(c.wrote[r]);
                            if (within)
                                fail_msg("q %g k %g v %g scale %g: rejected within the bound: %s",
                                         c.qmag, c.kmag, c.vmag, (double)c.scale, c.msg[r]);
                        } else {
                            fail_msg("q %g k %g scale %g rank %d: %s", c.qmag, c.kmag,
                                     (double)c.scale, r, c.msg[r]);
                        }
                    }
                }
    print_message("%ld rank calls succeeded, %ld were rejected as out of range\n", ran, rejected);
    assert_true(ran > 0 && rejected > 0);
}

/* ---- check/: DT_CHECK=1 ---- */

typedef struct check_case {
    int P, backward;
    dt_status st[MAXR];
    char msg[MAXR][512];
    int wrote[MAXR];
} check_case;

/* NaN in k[1, 5, 0, 3] (forward) or dout[1, 6, 1, 2] (backward). */
static dt_status rank_check(dt_context *ctx, void *arg) {
    check_case *c = arg;
    const int r = dt_context_rank(ctx);
    enum { B = 2, S = 16, H = 2, D = 8 };
    const int64_t n = B * S * H * D, nl = n / c->P;
    dt_mesh *mesh = NULL;
    dt_tensor *q = NULL, *k = NULL, *v = NULL, *g = NULL, *o = NULL, *lse = NULL;
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    double *full = malloc((size_t)n * sizeof *full), *loc = malloc((size_t)nl * sizeof *loc);
    dt_status st;
    int sizes[1] = {c->P};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, NULL, &mesh), out);
    const int j = dt_mesh_coord(mesh, 0);
    dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
    int64_t shape[4] = {B, S, H, D};
    dt_tensor **ts[4] = {&q, &k, &v, &g};
    for (int i = 0; i < 4; i++) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_F32, 4, shape, &lay, ts[i]), out);
        for (int64_t x = 0; x < n; x++) full[x] = dt_random_value(31 + (uint64_t)i, (uint64_t)x);
        if (i == 1 && !c->backward) full[((1 * S + 5) * H + 0) * D + 3] = NAN;
        if (i == 3 && c->backward) full[((1 * S + 6) * H + 1) * D + 2] = NAN;
        ref_local_rows(full, B, S, H, D, DT_ORDER_ZIGZAG, c->P, j, 0, H, loc);
        DT_TRY_GOTO(st, ref_set_local(*ts[i], loc), out);
    }
    if (c->backward) {
        DT_TRY_GOTO(st, dt_attention_forward(q, k, v, NULL, &o, &lse), out);
        st = dt_attention_backward(q, k, v, o, lse, g, NULL, &dq, &dk, &dv);
        c->wrote[r] = st != DT_SUCCESS && (dq || dk || dv);
    } else {
        st = dt_attention_forward(q, k, v, NULL, &o, &lse);
        c->wrote[r] = st != DT_SUCCESS && (o || lse);
    }
out:
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", st != DT_SUCCESS ? dt_last_error() : "");
    dt_tensor *all[] = {q, k, v, g, o, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    free(full);
    free(loc);
    return st;
}

/* The rank holding sequence position pos of S under zigzag over P ranks. */
static int zigzag_owner(int64_t pos, int64_t S, int P) {
    int64_t idx[64];
    for (int r = 0; r < P; r++) {
        h_order_indices(DT_ORDER_ZIGZAG, S, P, r, idx);
        for (int64_t x = 0; x < S / P; x++)
            if (idx[x] == pos) return r;
    }
    return -1;
}

static void test_check_attention(void **state) {
    (void)state;
    char *saved = h_env_set("DT_CHECK", "1");
    for (int backward = 0; backward < 2; backward++)
        for (int P = 1; P <= 4; P *= 2) {
            check_case c = {.P = P, .backward = backward};
            h_launch(P, rank_check, &c);
            const int owner = zigzag_owner(backward ? 6 : 5, 16, P);
            char want[160];
            snprintf(want, sizeof want, "rank %d: %s: %s holds a NaN or Inf at %s (DT_CHECK)",
                     owner, backward ? "dt_attention_backward" : "dt_attention_forward",
                     backward ? "dout" : "k", backward ? "[1, 6, 1, 2]" : "[1, 5, 0, 3]");
            for (int r = 0; r < P; r++) {
                if (c.st[r] != DT_ERR_NONFINITE || !strstr(c.msg[r], want))
                    fail_msg("P %d rank %d: %s \"%s\" (want DT_ERR_NONFINITE, \"%s\")", P, r,
                             dt_status_name(c.st[r]), c.msg[r], want);
                assert_false(c.wrote[r]);
            }
        }
    /* without DT_CHECK the same calls succeed (and propagate: poison/...) */
    setenv("DT_CHECK", "0", 1);
    for (int backward = 0; backward < 2; backward++) {
        check_case c = {.P = 2, .backward = backward};
        assert_int_equal(h_launch(2, rank_check, &c), DT_SUCCESS);
    }
    h_env_restore("DT_CHECK", saved);
}

typedef struct coll_case {
    int mode;   /* 0: NaN in rank 1's send at index 7; 1: an all_reduce that overflows */
    dt_status st[MAXR];
    char msg[MAXR][512];
} coll_case;

static dt_status rank_coll(dt_context *ctx, void *arg) {
    coll_case *c = arg;
    const int r = dt_context_rank(ctx);
    float host[16], *dev = NULL;
    for (int i = 0; i < 16; i++) host[i] = (float)i;
    if (c->mode == 0 && r == 1) host[7] = NAN;
    if (c->mode == 1) host[3] = 3e38f;
    dt_tensor *t = NULL;
    int64_t shape[1] = {16};
    dt_status st = dt_tensor_create(ctx, NULL, DT_F32, 1, shape, NULL, &t);
    if (st == DT_SUCCESS) st = dt_tensor_set_local(t, host, sizeof host);
    if (st == DT_SUCCESS) {
        dev = dt_tensor_data(t);
        st = dt_comm_all_reduce(dt_context_comm(ctx), dev, dev, 16, DT_F32, DT_REDUCE_SUM);
    }
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", st != DT_SUCCESS ? dt_last_error() : "");
    dt_tensor_destroy(t);
    return st;
}

static void test_check_collectives(void **state) {
    (void)state;
    char *saved = h_env_set("DT_CHECK", "1");
    for (int mode = 0; mode < 2; mode++) {
        coll_case c = {.mode = mode};
        h_launch(3, rank_coll, &c);
        for (int r = 0; r < 3; r++) {
            const char *want = mode == 0 ? (r == 1 ? "rank 1: all_reduce: the send buffer holds a "
                                                     "NaN or Inf at index 7 of 16"
                                                   : "comm rank 1 failed its own checks: rank 1: "
                                                     "all_reduce: the send buffer holds a NaN or "
                                                     "Inf at index 7 of 16")
                                         : "the recv buffer holds a NaN or Inf at index 3";
            if (c.st[r] != DT_ERR_NONFINITE || !strstr(c.msg[r], want))
                fail_msg("mode %d rank %d: %s \"%s\" (want DT_ERR_NONFINITE, \"%s\")", mode, r,
                         dt_status_name(c.st[r]), c.msg[r], want);
        }
    }
    h_env_restore("DT_CHECK", saved);
}

/* ---- the case table ---- */

#define MAX_CASES 200
static nf_case cases[MAX_CASES];
static int ncases;

static void add_case(int P, dt_order order, dt_attn_mask mask, dt_dtype dtype,
                     dt_backend_kind backend, const char *kernel, poison_at at, double value,
                     int64_t pos, int64_t head, int64_t d) {
    if (ncases >= MAX_CASES) return;
    nf_case *c = &cases[ncases++];
    memset(c, 0, sizeof *c);
    c->s = (attn_shape){2, 64, 4, 2, 64};
    c->P = P, c->order = order, c->mask = mask, c->dtype = dtype, c->backend = backend;
    c->kernel = kernel, c->at = at, c->value = value, c->b = 1, c->pos = pos, c->head = head;
    c->d = d;
    snprintf(c->name, sizeof c->name, "poison/%s/%s/%s=%s@%lld/P=%d/%s/%s",
             backend == DT_BACKEND_CUDA ? (kernel ? kernel : "cuda") : "cpu", dt_dtype_name(dtype),
             at_name[at], isnan(value) ? "nan" : "inf", (long long)pos, P,
             order == DT_ORDER_CONTIGUOUS ? "ring" : order == DT_ORDER_STRIPED ? "striped" : "zigzag",
             mask == DT_ATTN_CAUSAL ? "causal" : "full");
}

int main(void) {
    const dt_order orders[] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
    /* CPU: every input, NaN and Inf, at a middle, first and last position,
     * over world sizes and orders */
    for (int at = AT_Q; at <= AT_DOUT; at++)
        for (int inf = 0; inf < 2; inf++) {
            const double val = inf ? INFINITY : NAN;
            add_case(1, DT_ORDER_CONTIGUOUS, DT_ATTN_CAUSAL, DT_F32, DT_BACKEND_CPU, NULL,
                     (poison_at)at, val, 37, 1, 5);
            add_case(2, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, DT_F32, DT_BACKEND_CPU, NULL,
                     (poison_at)at, val, 0, 0, 63);
            add_case(4, orders[at % 3], DT_ATTN_CAUSAL, DT_BF16, DT_BACKEND_CPU, NULL,
                     (poison_at)at, val, 63, 1, 0);
            add_case(4, orders[(at + 1) % 3], DT_ATTN_FULL, DT_F32, DT_BACKEND_CPU, NULL,
                     (poison_at)at, val, 21, at == AT_Q || at == AT_DOUT ? 3 : 1, 17);
        }
    /* CUDA: each kernel in each form, each input (NaN), and Inf in k and v */
    const char *kernels[] = {"simple-latest", "mma-latest", "wgmma-latest", "simple", "mma", "wgmma"};
    for (int kn = 0; kn < 6; kn++) {
        for (int at = AT_Q; at <= AT_DOUT; at++)
            add_case(2, orders[(at + kn) % 3], DT_ATTN_CAUSAL, DT_BF16, DT_BACKEND_CUDA,
                     kernels[kn], (poison_at)at, NAN, 45, 1, 9);
        add_case(2, DT_ORDER_ZIGZAG, DT_ATTN_FULL, DT_F16, DT_BACKEND_CUDA, kernels[kn], AT_K,
                 INFINITY, 3, 0, 60);
        add_case(2, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, DT_BF16, DT_BACKEND_CUDA, kernels[kn], AT_V,
                 INFINITY, 10, 1, 33);
    }
    struct CMUnitTest tests[MAX_CASES + 9];
    size_t n = 0;
    for (int i = 0; i < ncases; i++)
        tests[n++] = (struct CMUnitTest){cases[i].name, run_poison, NULL, NULL, &cases[i]};
    tests[n++] = (struct CMUnitTest){"masked/cpu-block-nan-keys-values", test_masked_block_with_nan,
                                     NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"masked/cuda-block-nan-keys-values",
                                     test_masked_cuda_block_with_nan, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"range/rejects", test_range_rejects, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"range/grid", test_range_grid, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"range/rounded-lse", test_range_rounded_lse, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"check/attention", test_check_attention, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"check/collectives", test_check_collectives, NULL, NULL, NULL};
    return h_run_cases("nonfinite", tests, n);
}
