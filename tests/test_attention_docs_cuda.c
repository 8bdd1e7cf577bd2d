/* tests/test_attention_docs_cuda.c — packed documents and sliding windows
 * (mask.h's rule: a query at i attends a key at j iff same document, j <= i
 * under the causal mask, and |i - j| < W with a window W) in the CUDA
 * backend's kernels: dt_attention_forward and dt_attention_backward with
 * DT_ATTN_KERNEL=simple-latest (attention/cuda/block.cu's rule kernels), and
 * on bf16 / fp16 cases at D = 64 and 128 also mma-latest and wgmma-latest
 * (the tensor-core kernels' rule kernels), on one device without a mesh and on
 * 2 to 8 ranks of the local transport, every order, causal and full,
 * random document lengths (a document of one token, one longer than a
 * shard; one list for every batch row, or one per row), windows of 1,
 * below a shard and beyond it, GQA, fp32 and bf16 (fp16 on a few), grouped
 * ring launches.
 *
 * Every case runs the same inputs and options on the CPU backend first (its
 * kernel, attention/block_cpu.c, implements the rule too), then on CUDA;
 * each rank checks its rows of o, lse, dq, dk, dv against the CPU's and
 * against a double-precision reference computed here on the whole
 * sequence, with the rule written out from its definition (doc_id below),
 * at |got - ref| <= tol + tol |ref| (fp32 1e-5 forward, 1e-4 backward;
 * bf16 2e-2, 3e-2; fp16 2e-3, 4e-3: test_attention's and
 * test_attention_backward's bounds). Also: on CUDA, auto and the VERIFIED
 * choices refuse a call with documents or a window (DT_ERR_NOT_SUPPORTED,
 * naming the LATEST ones) and change nothing.
 *
 * Without a CUDA backend (a CUDA=0 build, no GPU) every case says skipped.
 * The emulator (make CUDA=emu) runs them all. Rank threads record; the main
 * thread asserts.
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

#include "attention/attention.h"
#include "attn_ref.h"
#include "dtensor/dtensor.h"
#include "harness.h"

#define MAXP 8
#define MAXDOCS 512
#define NOUT 5   /* o, lse, dq, dk, dv */

static const char *const out_names[NOUT] = {"o", "lse", "dq", "dk", "dv"};

typedef struct docs_case {
    char name[192];
    attn_shape s;
    int P;                     /* sequence ranks; 1: one device, no mesh */
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    int64_t window;            /* 0: none */
    int docs;                  /* 0: none; 1: one list for every row; 2: a list per row */
    int group;                 /* dt_attention_options.group */
    int tensor_cores;          /* also run mma-latest and wgmma-latest (bf16 / fp16, D 64, 128) */
    uint64_t seed;
    /* filled by the test */
    int64_t lens[MAXDOCS], nlens;
    int lens_ok;                              /* each row's list as make_docs promises */
    double *q, *k, *v, *g;                    /* full inputs */
    double *ref[NOUT];                        /* full references: o, lse, dq, dk, dv */
    dt_backend_kind backend;                  /* of the launch in progress */
    float *cpu[MAXP][NOUT];                   /* the CPU backend's local results */
    dt_status st[MAXP];
    long bad_ref[MAXP], bad_cpu[MAXP];
    double err_ref[MAXP], err_cpu[MAXP];
    char msg[MAXP][256];
} docs_case;

/* |got - ref| <= tol + tol |ref|: forward (o, lse) and backward bounds. */
static double tol_of(dt_dtype dt, int backward) {
    if (dt == DT_F32) return backward ? 1e-4 : 1e-5;
    return dt == DT_F16 ? (backward ? 4e-3 : 2e-3) : (backward ? 3e-2 : 2e-2);
}

/* ---------------------------------------------------- the rule, written out */

/* Document of token i of batch row b: the index of the length it falls in
 * (lists summing to S are every row's, else row b's part of B lists). */
static int64_t doc_id(const docs_case *c, int64_t b, int64_t i) {
    if (!c->docs) return 0;
    int64_t pos = c->docs == 2 ? b * c->s.S + i : i, end = 0;
    for (int64_t d = 0; d < c->nlens; d++)
        if (pos < (end += c->lens[d])) return d;
    return -1;
}

static int allowed(const docs_case *c, int64_t b, int64_t i, int64_t j) {
    if (doc_id(c, b, i) != doc_id(c, b, j)) return 0;
    if (c->mask == DT_ATTN_CAUSAL && j > i) return 0;
    if (c->window > 0 && llabs(i - j) >= c->window) return 0;
    return 1;
}

/* The whole forward and backward in double: o, lse, dq, dk, dv into c->ref. */
static void reference(docs_case *c) {
    const attn_shape *s = &c->s;
    const int64_t S = s->S, H = s->H, G = s->Hkv, D = s->D;
    const double scale = 1.0 / sqrt((double)D);
    double *o = c->ref[0], *lse = c->ref[1], *dq = c->ref[2], *dk = c->ref[3], *dv = c->ref[4];
    memset(dq, 0, (size_t)(s->B * S * H * D) * sizeof *dq);
    memset(dk, 0, (size_t)(s->B * S * G * D) * sizeof *dk);
    memset(dv, 0, (size_t)(s->B * S * G * D) * sizeof *dv);
    double *p = malloc((size_t)S * sizeof *p);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / (H / G);
            for (int64_t i = 0; i < S; i++) {
                const double *qi = c->q + ((b * S + i) * H + h) * D;
                const double *gi = c->g + ((b * S + i) * H + h) * D;
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < S; j++) {
                    p[j] = -INFINITY;
                    if (!allowed(c, b, i, j)) continue;
                    const double *kj = c->k + ((b * S + j) * G + g) * D;
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                    p[j] = scale * dot;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j < S; j++) sum += p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - mx);
                lse[(b * H + h) * S + i] = sum > 0 ? mx + log(sum) : -INFINITY;
                double *oi = o + ((b * S + i) * H + h) * D, delta = 0.0;
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < S; j++)
                        if (p[j] != 0.0) acc += p[j] / sum * c->v[((b * S + j) * G + g) * D + d];
                    oi[d] = acc;
                    delta += acc * gi[d];
                }
                for (int64_t j = 0; j < S; j++) {
                    if (p[j] == 0.0) continue;
                    const double pj = p[j] / sum;
                    const double *kj = c->k + ((b * S + j) * G + g) * D;
                    const double *vj = c->v + ((b * S + j) * G + g) * D;
                    double dp = 0.0;
                    for (int64_t d = 0; d < D; d++) dp += gi[d] * vj[d];
                    const double ds = pj * (dp - delta);
                    for (int64_t d = 0; d < D; d++) {
                        dq[((b * S + i) * H + h) * D + d] += scale * ds * kj[d];
                        dk[((b * S + j) * G + g) * D + d] += scale * ds * qi[d];
                        dv[((b * S + j) * G + g) * D + d] += pj * gi[d];
                    }
                }
            }
        }
    free(p);
}

/* Lengths >= 1 summing to n from seed: one of 1 token, one longer than
 * `longer` (where it fits), the rest 1 .. longer / 2 + 1; the list rotated
 * by the seed, so that the long one is not always first. Returns the count. */
static int64_t make_lens(uint64_t seed, int64_t n, int64_t longer, int64_t *out) {
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
#define RND() (x = x * 6364136223846793005ull + 1442695040888963407ull, (int64_t)(x >> 33))
    int64_t cnt = 0, left = n;
    const int64_t first[3] = {1 + RND() % 3, 1, longer + 1 + RND() % (longer / 2 + 1)};
    for (int i = 0; i < 3 && left > 0; i++) {
        const int64_t len = first[i] < left ? first[i] : left;
        out[cnt++] = len;
        left -= len;
    }
    while (left > 0) {
        int64_t len = 1 + RND() % (longer / 2 + 1);
        if (len > left) len = left;
        out[cnt++] = len;
        left -= len;
    }
    const int64_t rot = RND() % cnt;
#undef RND
    int64_t tmp[MAXDOCS];
    for (int64_t i = 0; i < cnt; i++) tmp[i] = out[(i + rot) % cnt];
    memcpy(out, tmp, (size_t)cnt * sizeof *out);
    return cnt;
}

/* ------------------------------------------------------------ the ranks */

static long compare_rows(const docs_case *c, const char *what, const float *got,
                         const double *want, size_t n, double tol, double *err) {
    double e = 0.0;
    char label[256];
    snprintf(label, sizeof label, "%s %s", c->name, what);
    const long bad = h_compare(label, got, want, n, tol, tol, &e);
    if (e > *err) *err = e;
    return bad;
}

static dt_status rank_case(dt_context *ctx, void *arg) {
    docs_case *c = arg;
    const attn_shape *s = &c->s;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *in[4] = {NULL}, *out[NOUT] = {NULL};
    float *got[NOUT] = {NULL};
    double *buf = NULL;
    dt_status st;
    if (c->P > 1) DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &c->P, NULL, &mesh), out);
    const dt_layout lay = dt_layout_1d(dt_shard(1, c->order));
    const int j = mesh ? dt_mesh_coord(mesh, 0) : 0;
    const int64_t rows = s->S / c->P;
    const int64_t qshape[4] = {s->B, s->S, s->H, s->D}, kshape[4] = {s->B, s->S, s->Hkv, s->D};
    const size_t nq = (size_t)(s->B * rows * s->H * s->D), nkv = (size_t)(s->B * rows * s->Hkv * s->D);
    const size_t n[NOUT] = {nq, (size_t)(s->B * s->H * rows), nq, nkv, nkv};
    buf = malloc(nq * sizeof *buf);
    const double *full[4] = {c->q, c->k, c->v, c->g};
    for (int i = 0; i < 4; i++) {
        const int kv = i == 1 || i == 2;
        DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 4, kv ? kshape : qshape,
                                         mesh ? &lay : NULL, &in[i]), out);
        ref_local_rows(full[i], s->B, s->S, kv ? s->Hkv : s->H, s->D, c->order, c->P, j, 0,
                       kv ? s->Hkv : s->H, buf);
        DT_TRY_GOTO(st, ref_set_local(in[i], buf), out);
    }
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.mask = c->mask;
    opts.window = c->window;
    opts.group = c->group;
    opts.doc_lens = c->docs ? c->lens : NULL;
    opts.doc_count = c->docs ? c->nlens : 0;
    DT_TRY_GOTO(st, dt_attention_forward(in[0], in[1], in[2], &opts, &out[0], &out[1]), out);
    DT_TRY_GOTO(st, dt_attention_backward(in[0], in[1], in[2], out[0], out[1], in[3], &opts,
                                          &out[2], &out[3], &out[4]), out);
    for (int i = 0; i < NOUT; i++) {
        got[i] = malloc(n[i] * sizeof *got[i]);
        DT_TRY_GOTO(st, i == 1 ? dt_tensor_get_local(out[i], got[i], n[i] * sizeof *got[i])
                               : ref_get_f32(out[i], got[i]), out);
    }
    /* against the double reference */
    for (int i = 0; i < NOUT; i++) {
        const int kv = i >= 3;
        if (i == 1) ref_local_lse(c->ref[1], s->B, s->S, s->H, c->order, c->P, j, 0, s->H, buf);
        else
            ref_local_rows(c->ref[i], s->B, s->S, kv ? s->Hkv : s->H, s->D, c->order, c->P, j, 0,
                           kv ? s->Hkv : s->H, buf);
        c->bad_ref[r] += compare_rows(c, out_names[i], got[i], buf, n[i], tol_of(c->dtype, i >= 2),
                                      &c->err_ref[r]);
    }
    if (c->backend == DT_BACKEND_CPU) {   /* kept for the CUDA run */
        for (int i = 0; i < NOUT; i++) {
            c->cpu[r][i] = got[i];
            got[i] = NULL;
        }
    } else {   /* against the CPU backend's results */
        for (int i = 0; i < NOUT; i++) {
            char what[32];
            snprintf(what, sizeof what, "%s (cuda vs cpu)", out_names[i]);
            for (size_t e = 0; e < n[i]; e++) buf[e] = c->cpu[r][i][e];
            c->bad_cpu[r] += compare_rows(c, what, got[i], buf, n[i], tol_of(c->dtype, i >= 2),
                                          &c->err_cpu[r]);
        }
    }
out:
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    for (int i = 0; i < NOUT; i++) {
        free(got[i]);
        dt_tensor_destroy(out[i]);
    }
    for (int i = 0; i < 4; i++) dt_tensor_destroy(in[i]);
    free(buf);
    dt_mesh_destroy(mesh);
    return st;
}

/* One launch on `backend`: 1 if every rank ran and matched, else 0 after
 * saying what failed. */
static int launch(docs_case *c, dt_backend_kind backend) {
    c->backend = backend;
    memset(c->st, 0, sizeof c->st);
    memset(c->bad_ref, 0, sizeof c->bad_ref);
    memset(c->bad_cpu, 0, sizeof c->bad_cpu);
    memset(c->err_ref, 0, sizeof c->err_ref);
    memset(c->err_cpu, 0, sizeof c->err_cpu);
    const char *bk = backend == DT_BACKEND_CPU ? "cpu" : "cuda";
    const dt_status st = h_launch_on(c->P, backend, DT_TRANSPORT_LOCAL, rank_case, c);
    int ok = st == DT_SUCCESS;
    if (!ok) print_error("%s (%s): %s\n", c->name, bk, dt_last_error());
    for (int r = 0; r < c->P; r++) {
        if (c->st[r] != DT_SUCCESS) {
            print_error("rank %d (%s): %s\n", r, bk, c->msg[r]);
            ok = 0;
        } else if (c->bad_ref[r] || c->bad_cpu[r]) {
            print_error("rank %d (%s): %ld mismatches against the reference (max error %.3g), "
                        "%ld against the CPU backend (max error %.3g)\n", r, bk, c->bad_ref[r],
                        c->err_ref[r], c->bad_cpu[r], c->err_cpu[r]);
            ok = 0;
        }
    }
    return ok;
}

static void run_case(void **state) {
    docs_case *c = *state;
    const attn_shape *s = &c->s;
    char why[512];
    if (!h_pair_available(c->P, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: no CUDA backend here: %s\n", why);
        skip();
    }
    assert_true(c->lens_ok);   /* a document of 1 token and one longer than a shard */
    const int64_t nq = s->B * s->S * s->H * s->D, nk = s->B * s->S * s->Hkv * s->D;
    c->q = ref_input(c->seed, nq, c->dtype);
    c->k = ref_input(c->seed + 1, nk, c->dtype);
    c->v = ref_input(c->seed + 2, nk, c->dtype);
    c->g = ref_input(c->seed + 3, nq, c->dtype);
    const int64_t sizes[NOUT] = {nq, s->B * s->H * s->S, nq, nk, nk};
    for (int i = 0; i < NOUT; i++) c->ref[i] = malloc((size_t)sizes[i] * sizeof(double));
    reference(c);
    memset(c->cpu, 0, sizeof c->cpu);
    const int ok_cpu = launch(c, DT_BACKEND_CPU);
    int ok_cuda = ok_cpu;
    static const char *const kernels[3] = {"simple-latest", "mma-latest", "wgmma-latest"};
    for (int k = 0; ok_cuda && k < (c->tensor_cores ? 3 : 1); k++) {
        char *saved = h_env_set("DT_ATTN_KERNEL", kernels[k]);
        ok_cuda = launch(c, DT_BACKEND_CUDA);
        h_env_restore("DT_ATTN_KERNEL", saved);
        if (!ok_cuda) print_error("with DT_ATTN_KERNEL=%s\n", kernels[k]);
    }
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->g);
    for (int i = 0; i < NOUT; i++) {
        free(c->ref[i]);
        for (int r = 0; r < MAXP; r++) free(c->cpu[r][i]);
    }
    memset(c->cpu, 0, sizeof c->cpu);
    assert_true(ok_cpu);
    assert_true(ok_cuda);
}

/* ------------------------------------------------------------- refusal */

/* Any choice but a LATEST form refuses a ruled call on CUDA: the forward
 * leaves o, lse unset, the backward (after a forward with simple-latest)
 * dq, dk, dv, and neither touches its inputs. */
typedef struct refusal {
    dt_attn_kernel_choice kernel;   /* the forward's and backward's choice */
    int64_t window;
    int docs;
    dt_status st_fwd[2], st_bwd[2], st[2];
    int untouched[2];
    char msg_fwd[2][320], msg_bwd[2][320], msg[2][256];
} refusal;

static dt_status rank_refusal(dt_context *ctx, void *arg) {
    refusal *f = arg;
    enum { B = 1, S = 32, H = 2, D = 16, LOCAL = B * (S / 2) * H * D };
    const int r = dt_context_rank(ctx), P = 2;
    const int64_t shape[4] = {B, S, H, D};
    static const int64_t lens[3] = {5, 20, 7};
    dt_mesh *mesh = NULL;
    dt_tensor *in[4] = {NULL}, *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    dt_tensor *o_ok = NULL, *lse_ok = NULL;
    float before[4][LOCAL], after[LOCAL];
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh), out);
    const dt_layout lay = dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
    for (int i = 0; i < 4; i++) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_BF16, 4, shape, &lay, &in[i]), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(in[i], 4242 + (uint64_t)i), out);
        DT_TRY_GOTO(st, ref_get_f32(in[i], before[i]), out);
    }
    dt_attention_tuning latest = DT_ATTENTION_TUNING_INIT, other = DT_ATTENTION_TUNING_INIT;
    latest.kernel = DT_ATTN_KERNEL_SIMPLE_LATEST;
    other.kernel = f->kernel;
    dt_attention_options opts = DT_ATTENTION_OPTIONS_INIT;
    opts.window = f->window;
    opts.doc_lens = f->docs ? lens : NULL;
    opts.doc_count = f->docs ? 3 : 0;
    opts.tuning = &other;
    f->st_fwd[r] = dt_attention_forward(in[0], in[1], in[2], &opts, &o, &lse);
    snprintf(f->msg_fwd[r], sizeof f->msg_fwd[r], "%s", dt_last_error());
    opts.tuning = &latest;
    DT_TRY_GOTO(st, dt_attention_forward(in[0], in[1], in[2], &opts, &o_ok, &lse_ok), out);
    opts.tuning = &other;
    f->st_bwd[r] = dt_attention_backward(in[0], in[1], in[2], o_ok, lse_ok, in[3], &opts, &dq,
                                         &dk, &dv);
    snprintf(f->msg_bwd[r], sizeof f->msg_bwd[r], "%s", dt_last_error());
    f->untouched[r] = !o && !lse && !dq && !dk && !dv;
    for (int i = 0; i < 4; i++) {
        DT_TRY_GOTO(st, ref_get_f32(in[i], after), out);
        f->untouched[r] = f->untouched[r] && !memcmp(before[i], after, sizeof after);
    }
    st = DT_SUCCESS;
out:
    f->st[r] = st;
    if (st != DT_SUCCESS) snprintf(f->msg[r], sizeof f->msg[r], "%s", dt_last_error());
    dt_tensor *all[] = {in[0], in[1], in[2], in[3], o, lse, dq, dk, dv, o_ok, lse_ok};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_destroy(all[i]);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_other_kernels_refuse(void **state) {
    (void)state;
    char why[512];
    if (!h_pair_available(2, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, why, sizeof why)) {
        print_message("skipped: no CUDA backend here: %s\n", why);
        skip();
    }
    /* auto with DT_ATTN_KERNEL unset, and each other forced choice */
    const dt_attn_kernel_choice kernels[] = {DT_ATTN_KERNEL_AUTO, DT_ATTN_KERNEL_SIMPLE,
                                             DT_ATTN_KERNEL_MMA, DT_ATTN_KERNEL_WGMMA};
    char *saved = h_env_set("DT_ATTN_KERNEL", NULL);
    int ok = 1;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        for (int rule = 0; rule < 3; rule++) {
            refusal f = {.kernel = kernels[i], .window = rule != 1 ? 6 : 0, .docs = rule >= 1};
            const dt_status st = h_launch_on(2, DT_BACKEND_CUDA, DT_TRANSPORT_LOCAL, rank_refusal, &f);
            for (int r = 0; r < 2; r++) {
                const int good = st == DT_SUCCESS && f.st[r] == DT_SUCCESS &&
                                 f.st_fwd[r] == DT_ERR_NOT_SUPPORTED &&
                                 f.st_bwd[r] == DT_ERR_NOT_SUPPORTED && f.untouched[r] &&
                                 strstr(f.msg_fwd[r], "DT_ATTN_KERNEL=simple-latest") &&
                                 strstr(f.msg_bwd[r], "DT_ATTN_KERNEL=simple-latest");
                if (!good) {
                    print_error("%s, window %lld, %s documents, rank %d: forward %s (%s), "
                                "backward %s (%s), untouched %d; run: %s\n",
                                dt_attn_kernel_choice_name(kernels[i]), (long long)f.window,
                                f.docs ? "with" : "no", r, dt_status_name(f.st_fwd[r]),
                                f.msg_fwd[r], dt_status_name(f.st_bwd[r]), f.msg_bwd[r],
                                f.untouched[r], f.st[r] == DT_SUCCESS ? "ok" : f.msg[r]);
                    ok = 0;
                }
            }
        }
    h_env_restore("DT_ATTN_KERNEL", saved);
    assert_true(ok);
}

/* --------------------------------------------------------------- cases */

#define MAXC 64
static docs_case cases[MAXC];

static void name_case(docs_case *c) {
    char docs[32] = "none";
    if (c->docs) snprintf(docs, sizeof docs, "%s(%lld)", c->docs == 2 ? "per-row" : "shared",
                          (long long)c->nlens);
    char group[48] = "";
    if (c->group > 1) snprintf(group, sizeof group, ",group=%d", c->group);
    if (c->tensor_cores)
        snprintf(group + strlen(group), sizeof group - strlen(group), ",tensor-cores");
    snprintf(c->name, sizeof c->name,
             "docs-cuda/%s/P=%d,B=%lld,S=%lld,H=%lld,HKV=%lld,D=%lld,%s,%s,docs=%s,W=%lld%s",
             c->P == 1 ? "single" : dt_order_name(c->order), c->P, (long long)c->s.B,
             (long long)c->s.S, (long long)c->s.H, (long long)c->s.Hkv, (long long)c->s.D,
             dt_attn_mask_name(c->mask), dt_dtype_name(c->dtype), docs, (long long)c->window,
             group);
}

/* The documents of c: a list for every row (docs 1) or one per row (2),
 * each with a document longer than `longer` tokens and one of 1. */
static void make_docs(docs_case *c, int64_t longer) {
    c->nlens = 0;
    c->lens_ok = 1;
    if (!c->docs) return;
    for (int64_t b = 0; b < (c->docs == 2 ? c->s.B : 1); b++) {
        const int64_t *l = c->lens + c->nlens;
        const int64_t n = make_lens(c->seed * 7 + (uint64_t)b, c->s.S, longer, c->lens + c->nlens);
        int64_t sum = 0, ones = 0, long_ones = 0;
        for (int64_t i = 0; i < n; i++) {
            sum += l[i];
            ones += l[i] == 1;
            long_ones += l[i] > longer;
        }
        c->lens_ok = c->lens_ok && sum == c->s.S && ones > 0 && long_ones > 0;
        c->nlens += n;
    }
}

int main(void) {
    static struct CMUnitTest tests[MAXC + 1];
    int n = 0, nc = 0;
    tests[n++] = (struct CMUnitTest){"docs-cuda/other-kernels-refuse", test_other_kernels_refuse,
                                     NULL, NULL, NULL};
    /* One device, no mesh: S = 96 and 160 (two and three tiles of 64 rows
     * and keys: empty, full and partial tiles), windows of 1, 9 (inside a
     * tile) and 70 (across one). */
    for (int v = 0; v < 4; v++) {
        docs_case *c = &cases[nc++];
        const int64_t S = v < 2 ? 96 : 160;
        c->s = (attn_shape){1 + v % 2, S, 4, (int64_t[]){4, 2, 1, 2}[v], v % 2 ? 32 : 16};
        c->P = 1;
        c->order = DT_ORDER_CONTIGUOUS;
        c->mask = v == 1 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
        c->dtype = v % 2 ? DT_BF16 : DT_F32;
        c->window = (int64_t[]){9, 0, 70, 1}[v];
        c->docs = (int[]){1, 2, 0, 1}[v];
        c->seed = 7000 + (uint64_t)nc;
        make_docs(c, S / 3);
        name_case(c);
    }
    /* Rings of 2 to 8 ranks, every order, causal and full: the window
     * none, below a shard or beyond it, the documents none, shared or per
     * row (never neither), GQA 1, 2, 4, fp32 and bf16; contiguous and
     * zigzag causal at P >= 3 also grouped (P - 1 ring steps a launch, at
     * most 3). Shards of 8 to 32 rows, even (zigzag's halves). */
    for (int p = 2; p <= MAXP; p++)
        for (int o = 0; o < DT_ORDER_COUNT; o++)
            for (int mk = 0; mk < 2; mk++) {
                docs_case *c = &cases[nc++];
                const int v = (p + o + mk) % 6 + nc;
                const int64_t shard = (int64_t[]){0, 0, 24, 24, 16, 12, 10, 8, 8}[p] +
                                      (mk ? 0 : (p <= 4 ? 4 : 2) * (o % 2 + 1));
                const int64_t S = shard * p;   /* shards even: zigzag's halves */
                c->s = (attn_shape){1 + (v + p) % 2, S, 4, (int64_t[]){1, 2, 4}[(v + o) % 3],
                                    (p + mk) % 3 == 2 ? 32 : 16};
                c->P = p;
                c->order = (dt_order)o;
                c->mask = mk ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
                c->dtype = (p + o + mk) % 2 ? DT_BF16 : p >= 5 && o == 1 ? DT_F16 : DT_F32;
                const int wk = (p + 2 * o + mk) % 3, dk = (p + o + 2 * mk) % 3;
                const int64_t c_rows = S / p;
                c->window = (int64_t[]){0, c_rows / 3 + 1, c_rows + c_rows / 2 + 1}[wk];
                c->docs = wk == 0 && dk == 0 ? 1 : dk;
                c->group = p > 2 && o != DT_ORDER_STRIPED && mk == 0 ? (p - 1 < 3 ? p - 1 : 3) : 0;
                c->seed = 7100 + 10 * (uint64_t)nc;
                make_docs(c, c_rows);
                name_case(c);
            }
    /* The tensor-core kernels' LATEST forms too (mma-latest, wgmma-latest):
     * bf16 and fp16 at D = 64 and 128, one device and rings of 2 to 8. */
    for (int v = 0; v < 7; v++) {
        docs_case *c = &cases[nc++];
        c->P = (int[]){1, 2, 3, 4, 2, 6, 8}[v];
        const int64_t S = (int64_t[]){192, 128, 144, 128, 192, 144, 128}[v];
        c->s = (attn_shape){1 + v % 2, S, 4, (int64_t[]){2, 1, 4, 2, 2, 1, 2}[v],
                            v == 3 ? 128 : 64};
        c->order = (dt_order)(v % 3);
        c->mask = v == 2 || v == 6 ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
        c->dtype = v % 2 ? DT_F16 : DT_BF16;
        c->window = (int64_t[]){40, 0, S / 3 / 2, 80, 0, 30, 0}[v];
        c->docs = (int[]){1, 2, 2, 0, 1, 2, 1}[v];
        c->group = v == 4 ? 2 : 0;
        c->tensor_cores = 1;
        c->seed = 7800 + (uint64_t)nc;
        make_docs(c, c->P == 1 ? S / 3 : S / c->P);
        name_case(c);
    }
    for (int i = 0; i < nc; i++)
        tests[n++] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, &cases[i]};
    return h_run_cases("attention with documents and windows (cuda)", tests, (size_t)n);
}
