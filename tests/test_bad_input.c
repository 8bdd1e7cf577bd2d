/* tests/test_bad_input.c — a table of invalid calls across the public API.
 * Each must return the stated status with a message naming what is wrong,
 * write no output handle, and leave every input tensor as it was (checked by
 * a checksum of every fixture tensor before and after each call). Every rank
 * runs the same table, so collective calls are rejected on all ranks alike.
 * Rank threads record; the main thread asserts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "dtensor/dtensor.h"
#include "harness.h"

#define P 2

typedef struct fixture {
    dt_context *ctx;
    dt_comm *comm;
    dt_mesh *mesh;
    dt_tensor *x;      /* [4P, 6] fp32, Shard(0) */
    dt_tensor *xb;     /* [4P, 6] bf16, Shard(0) */
    dt_tensor *w;      /* [6, 8] fp32, Replicate */
    dt_tensor *part;   /* [4P, 6] fp32, Partial */
    dt_tensor *local;  /* [5, 3] fp32, local */
    dt_tensor *q;      /* [1, 8P, 4, 16] fp32, Shard(1, striped) */
    dt_tensor *kv;     /* [1, 8P, 2, 16] fp32, Shard(1, striped) */
    dt_tensor *kv3;    /* [1, 8P, 3, 16] */
    dt_tensor *q12;    /* [1, 8P, 4, 12] */
    dt_tensor *qb;     /* [1, 8P, 4, 16] bf16 */
    dt_tensor *qrep;   /* [1, 8P, 4, 16] Replicate */
    dt_tensor *o, *lse;
    /* Output handles of the calls, set to SENTINEL before each: a rejected
     * call must leave them so (it writes no output handle, not even NULL). */
    dt_tensor *out, *out2, *out3;
    dt_ring *ring;
    dt_comm *comm_out;
    dt_mesh *mesh_out;
} fixture;

static char g_sentinel;
#define SENTINEL ((void *)&g_sentinel)

#define N_FIX 13

static dt_tensor **fixture_tensors(fixture *f, int i) {
    dt_tensor **all[N_FIX] = {&f->x, &f->xb, &f->w, &f->part, &f->local, &f->q, &f->kv,
                              &f->kv3, &f->q12, &f->qb, &f->qrep, &f->o, &f->lse};
    return all[i];
}

static uint64_t checksum(const dt_tensor *t) {
    size_t n = dt_tensor_local_bytes(t);
    unsigned char *b = malloc(n + 1);
    dt_tensor_get_local(t, b, n);
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    free(b);
    return h;
}

typedef dt_status (*bad_call)(fixture *f);
typedef struct bad_case {
    const char *name;
    bad_call call;
    dt_status want;
    const char *needle;
} bad_case;

static const dt_layout *lay_of(const dt_tensor *t) { return dt_tensor_layout(t); }

/* ---- communicators and ring ---- */
static dt_status c01(fixture *f) { (void)f; float x[2] = {1, 2}; return dt_comm_all_reduce(NULL, x, x, 2, DT_F32, DT_REDUCE_SUM); }
static dt_status c02(fixture *f) { float x[2] = {1, 2}; return dt_comm_all_reduce(f->comm, x, x, 2, (dt_dtype)42, DT_REDUCE_SUM); }
static dt_status c03(fixture *f) { float x[2] = {1, 2}; return dt_comm_all_reduce(f->comm, x, x, 2, DT_F32, (dt_reduce_op)9); }
static dt_status c04(fixture *f) { float x[2] = {1, 2}; return dt_comm_all_reduce(f->comm, NULL, x, 2, DT_F32, DT_REDUCE_SUM); }
static dt_status c05(fixture *f) { float x[2] = {1, 2}; return dt_comm_all_reduce(f->comm, x, x, SIZE_MAX / 3, DT_F32, DT_REDUCE_SUM); }
static dt_status c06(fixture *f) { unsigned char x[2] = {1, 2}; return dt_comm_all_reduce(f->comm, x, x, 2, DT_U8, DT_REDUCE_SUM); }
static dt_status c07(fixture *f) { float x[2] = {1, 2}; return dt_comm_broadcast(f->comm, x, 2, DT_F32, -1); }
static dt_status c08(fixture *f) { float x[2] = {1, 2}; return dt_comm_broadcast(f->comm, x, 2, DT_F32, P); }
static dt_status c09(fixture *f) { float x[2] = {1, 2}; return dt_comm_all_gather(f->comm, x, NULL, 2, DT_F32); }
static dt_status c10(fixture *f) { float x[2] = {1, 2}; dt_p2p_op op = {DT_P2P_SEND, P, x, 2, DT_F32}; return dt_comm_sendrecv(f->comm, &op, 1); }
static dt_status c11(fixture *f) { float x[2] = {1, 2}; dt_p2p_op op = {(dt_p2p_kind)7, 0, x, 2, DT_F32}; return dt_comm_sendrecv(f->comm, &op, 1); }
static dt_status c12(fixture *f) { return dt_comm_sendrecv(f->comm, NULL, 3); }
static dt_status c13(fixture *f) { return dt_comm_p2p_wait(f->comm); }
static dt_status c14(fixture *f) { return dt_comm_split(f->comm, 0, 0, NULL); }
static dt_status c22(fixture *f) { return dt_comm_split(NULL, 0, 0, &f->comm_out); }
static dt_status c23(fixture *f) { return dt_ring_create(f->comm, SIZE_MAX / 2, DT_RING_FORWARD, &f->ring); }
static dt_status c15(fixture *f) { return dt_comm_check_agreement(f->comm, "op", NULL, NULL, 2); }
static dt_status c16(fixture *f) { return dt_ring_create(NULL, 8, DT_RING_FORWARD, &f->ring); }
static dt_status c17(fixture *f) { return dt_ring_create(f->comm, 8, DT_RING_FORWARD, NULL); }
static dt_status c18(fixture *f) { return dt_ring_create(f->comm, 8, (dt_ring_direction)5, &f->ring); }
static dt_status c19(fixture *f) { (void)f; return dt_ring_start(NULL); }
static dt_status c20(fixture *f) { (void)f; return dt_ring_wait(NULL); }
static dt_status c21(fixture *f) { return dt_ring_create_in(f->comm, 8, DT_RING_FORWARD, NULL, &f->ring); }
/* ---- meshes ---- */
static dt_status m01(fixture *f) { int s[1] = {P}; return dt_mesh_create(NULL, 1, s, NULL, &f->mesh_out); }
static dt_status m02(fixture *f) { int s[1] = {P}; return dt_mesh_create(f->ctx, 0, s, NULL, &f->mesh_out); }
static dt_status m03(fixture *f) { int s[4] = {1, 1, 1, P}; return dt_mesh_create(f->ctx, 4, s, NULL, &f->mesh_out); }
static dt_status m04(fixture *f) { int s[2] = {P, 0}; return dt_mesh_create(f->ctx, 2, s, NULL, &f->mesh_out); }
static dt_status m05(fixture *f) { int s[2] = {P, 3}; return dt_mesh_create(f->ctx, 2, s, NULL, &f->mesh_out); }
static dt_status m06(fixture *f) { int s[1] = {P}; return dt_mesh_create(f->ctx, 1, s, NULL, NULL); }
/* ---- tensors ---- */
static int64_t sh2[2] = {4 * P, 6};
static dt_status t01(fixture *f) { dt_layout l = dt_layout_1d(dt_replicate()); return dt_tensor_create(NULL, f->mesh, DT_F32, 2, sh2, &l, &f->out); }
static dt_status t02(fixture *f) { dt_layout l = dt_layout_1d(dt_replicate()); return dt_tensor_create(f->ctx, f->mesh, DT_F32, 0, sh2, &l, &f->out); }
static dt_status t03(fixture *f) { int64_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}; return dt_tensor_create(f->ctx, NULL, DT_F32, 9, s, NULL, &f->out); }
static dt_status t04(fixture *f) { int64_t s[2] = {4, -2}; return dt_tensor_create(f->ctx, NULL, DT_F32, 2, s, NULL, &f->out); }
static dt_status t05(fixture *f) { return dt_tensor_create(f->ctx, NULL, (dt_dtype)77, 2, sh2, NULL, &f->out); }
static dt_status t06(fixture *f) { dt_layout l = dt_layout_1d(dt_replicate()); return dt_tensor_create(f->ctx, NULL, DT_F32, 2, sh2, &l, &f->out); }
static dt_status t07(fixture *f) { return dt_tensor_create(f->ctx, f->mesh, DT_F32, 2, sh2, NULL, &f->out); }
static dt_status t08(fixture *f) { dt_layout l = dt_layout_2d(dt_replicate(), dt_replicate()); return dt_tensor_create(f->ctx, f->mesh, DT_F32, 2, sh2, &l, &f->out); }
static dt_status t09(fixture *f) { dt_layout l = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS)); return dt_tensor_create(f->ctx, f->mesh, DT_F32, 2, sh2, &l, &f->out); }
static dt_status t10(fixture *f) { int64_t s[2] = {5, 6}; dt_layout l = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)); return dt_tensor_create(f->ctx, f->mesh, DT_F32, 2, s, &l, &f->out); }
static dt_status t11(fixture *f) { int64_t s[2] = {6, 6}; dt_layout l = dt_layout_1d(dt_shard(0, DT_ORDER_ZIGZAG)); return dt_tensor_create(f->ctx, f->mesh, DT_F32, 2, s, &l, &f->out); }
static dt_status t12(fixture *f) { dt_placement p = {(dt_placement_kind)9, 0, DT_ORDER_CONTIGUOUS}; dt_layout l = dt_layout_1d(p); return dt_tensor_create(f->ctx, f->mesh, DT_F32, 2, sh2, &l, &f->out); }
static dt_status t13(fixture *f) { dt_layout l = dt_layout_1d(dt_shard(0, (dt_order)8)); return dt_tensor_create(f->ctx, f->mesh, DT_F32, 2, sh2, &l, &f->out); }
static dt_status t14(fixture *f) { int64_t s[3] = {1LL << 40, 1LL << 30, 64}; return dt_tensor_create(f->ctx, NULL, DT_F32, 3, s, NULL, &f->out); }
static dt_status t15(fixture *f) { float b[4] = {0}; return dt_tensor_set_local(f->x, b, sizeof b); }
static dt_status t16(fixture *f) { float b[4] = {0}; return dt_tensor_get_local(f->x, b, sizeof b); }
static dt_status t17(fixture *f) { return dt_tensor_set_local(f->x, NULL, dt_tensor_local_bytes(f->x)); }
static dt_status t18(fixture *f) { (void)f; return dt_tensor_fill_random(NULL, 1); }
static dt_status t19(fixture *f) { return dt_tensor_create(f->ctx, NULL, DT_F32, 2, NULL, NULL, &f->out); }
/* ---- primitives ---- */
static dt_status p01(fixture *f) { dt_layout l = dt_layout_1d(dt_replicate()); return dt_tensor_redistribute(NULL, &l, &f->out); }
static dt_status p02(fixture *f) { dt_layout l = dt_layout_1d(dt_replicate()); return dt_tensor_redistribute(f->local, &l, &f->out); }
static dt_status p03(fixture *f) { dt_layout l = dt_layout_1d(dt_replicate()); return dt_tensor_redistribute(f->x, &l, NULL); }
static dt_status p04(fixture *f) { dt_layout l = dt_layout_1d(dt_shard(5, DT_ORDER_CONTIGUOUS)); return dt_tensor_redistribute(f->x, &l, &f->out); }
static dt_status p05(fixture *f) { dt_layout l = dt_layout_1d(dt_shard(0, DT_ORDER_ZIGZAG)); return dt_tensor_redistribute(f->w, &l, &f->out); }
static dt_status p06(fixture *f) { dt_layout l = dt_layout_2d(dt_replicate(), dt_replicate()); return dt_tensor_redistribute(f->x, &l, &f->out); }
static dt_status p07(fixture *f) { return dt_tensor_gather(f->x, P, &f->out); }
static dt_status p08(fixture *f) { return dt_tensor_gather(f->x, 0, NULL); }
static dt_status p09(fixture *f) { return dt_tensor_shard(NULL, 0, f->local, lay_of(f->x), &f->out); }
static dt_status p10(fixture *f) { return dt_tensor_shard(f->mesh, -1, f->local, lay_of(f->x), &f->out); }
static dt_status p11(fixture *f) { return dt_tensor_permute_striped(f->local, 2, 1, &f->out); }
static dt_status p12(fixture *f) { return dt_tensor_permute_striped(f->local, 0, 0, &f->out); }
static dt_status p13(fixture *f) { return dt_tensor_permute_striped(f->local, 0, 2, &f->out); }
static dt_status p14(fixture *f) { return dt_tensor_permute_striped(f->x, 0, 2, &f->out); }
static dt_status p15(fixture *f) { return dt_tensor_replicate(f->local, &f->out); }
/* ---- ops ---- */
static dt_status o01(fixture *f) { return dt_matmul(f->xb, f->w, &f->out); }
static dt_status o02(fixture *f) { return dt_matmul(f->w, f->w, &f->out); }
static dt_status o03(fixture *f) { return dt_matmul(f->x, f->local, &f->out); }
static dt_status o04(fixture *f) { return dt_add(f->x, f->w, &f->out); }
static dt_status o05(fixture *f) { return dt_add(f->part, f->x, &f->out); }
static dt_status o06(fixture *f) { return dt_gelu(f->part, DT_GELU_ERF, &f->out); }
static dt_status o07(fixture *f) { return dt_gelu(f->x, (dt_gelu_approx)5, &f->out); }
static dt_status o08(fixture *f) { return dt_matmul(NULL, f->w, &f->out); }
/* ---- attention ---- */
static dt_status a01(fixture *f) { return dt_attention_forward(f->q, f->kv3, f->kv3, NULL, &f->out, &f->out2); }
static dt_status a02(fixture *f) { return dt_attention_forward(f->q12, f->q12, f->q12, NULL, &f->out, NULL); }
static dt_status a03(fixture *f) { return dt_attention_forward(f->q, f->qb, f->qb, NULL, &f->out, NULL); }
static dt_status a04(fixture *f) { return dt_attention_forward(f->qrep, f->kv, f->kv, NULL, &f->out, NULL); }
static dt_status a05(fixture *f) { dt_attention_options o = DT_ATTENTION_OPTIONS_INIT; o.mask = (dt_attn_mask)4; return dt_attention_forward(f->q, f->kv, f->kv, &o, &f->out, NULL); }
static dt_status a06(fixture *f) { dt_attention_options o = DT_ATTENTION_OPTIONS_INIT; o.scale = -2.0f; return dt_attention_forward(f->q, f->kv, f->kv, &o, &f->out, NULL); }
static dt_status a07(fixture *f) { char ws[8]; dt_attention_options o = DT_ATTENTION_OPTIONS_INIT; o.workspace = ws; o.workspace_bytes = sizeof ws; return dt_attention_forward(f->q, f->kv, f->kv, &o, &f->out, NULL); }
static dt_status a08(fixture *f) { return dt_attention_forward(f->x, f->x, f->x, NULL, &f->out, NULL); }
static dt_status a09(fixture *f) { return dt_attention_backward(f->q, f->kv, f->kv, f->o, f->lse, NULL, NULL, &f->out, &f->out2, &f->out3); }
static dt_status a10(fixture *f) { return dt_attention_backward(f->q, f->kv, f->kv, f->o, f->o, f->o, NULL, &f->out, &f->out2, &f->out3); }
static dt_status a11(fixture *f) { return dt_attention_backward(f->q, f->kv, f->kv, f->q12, f->lse, f->o, NULL, &f->out, &f->out2, &f->out3); }
static dt_status a12(fixture *f) { size_t b; return dt_attention_workspace_size(f->q, f->kv3, f->kv3, NULL, &b); }
static dt_status a13(fixture *f) { char ws[8]; dt_attention_options o = DT_ATTENTION_OPTIONS_INIT; o.workspace = ws; o.workspace_bytes = sizeof ws; return dt_attention_backward(f->q, f->kv, f->kv, f->o, f->lse, f->o, &o, &f->out, &f->out2, &f->out3); }

#define BAD(fn, st, needle) {#fn, fn, st, needle}
#define INV DT_ERR_INVALID_ARGUMENT
#define UNSUP DT_ERR_NOT_SUPPORTED
static const bad_case cases[] = {
    BAD(c01, INV, "comm is NULL"), BAD(c02, INV, "unknown dtype 42"), BAD(c03, INV, "unknown reduce op 9"),
    BAD(c04, INV, "send buffer is NULL"), BAD(c05, INV, "overflow"), BAD(c06, UNSUP, "u8"),
    BAD(c07, INV, "root -1"), BAD(c08, INV, "root 2"), BAD(c09, INV, "recv buffer is NULL"),
    BAD(c10, INV, "peer 2 is out of range"), BAD(c11, INV, "unknown kind 7"), BAD(c12, INV, "3 operations"),
    BAD(c13, INV, "no send/recv group"), BAD(c14, INV, "out is NULL"), BAD(c15, INV, "2 values"),
    BAD(c16, INV, "comm is NULL"), BAD(c17, INV, "out is NULL"), BAD(c18, INV, "unknown direction 5"),
    BAD(c19, INV, "ring is NULL"), BAD(c20, INV, "ring is NULL"), BAD(c21, INV, "buffers is NULL"),
    BAD(c22, INV, "comm is NULL"), BAD(c23, DT_ERR_OUT_OF_MEMORY, "bytes"),
    BAD(m01, INV, "ctx is NULL"), BAD(m02, INV, "ndim 0"), BAD(m03, INV, "ndim 4"),
    BAD(m04, INV, "size 0"), BAD(m05, INV, "6"), BAD(m06, INV, "out is NULL"),
    BAD(t01, INV, "ctx is NULL"), BAD(t02, INV, "ndim 0"), BAD(t03, INV, "ndim 9"),
    BAD(t04, INV, "negative"), BAD(t05, INV, "unknown dtype 77"), BAD(t06, INV, "takes no layout"),
    BAD(t07, INV, "layout is NULL"), BAD(t08, INV, "2 mesh dims"), BAD(t09, INV, "dim 2"),
    BAD(t10, INV, "not divisible"), BAD(t11, INV, "not divisible"), BAD(t12, INV, "kind"),
    BAD(t13, INV, "order"), BAD(t14, INV, "overflow"), BAD(t15, INV, "bytes"),
    BAD(t16, INV, "bytes"), BAD(t17, INV, "NULL"), BAD(t18, INV, "NULL"), BAD(t19, INV, "shape is NULL"),
    BAD(p01, INV, "NULL"), BAD(p02, INV, "local"), BAD(p03, INV, "out is NULL"),
    BAD(p04, INV, "dim 5"), BAD(p05, INV, "not divisible"), BAD(p06, INV, "mesh"),
    BAD(p07, INV, "root 2"), BAD(p08, INV, "out is NULL"), BAD(p09, INV, "mesh is NULL"),
    BAD(p10, INV, "root -1"), BAD(p11, INV, "dim 2"), BAD(p12, INV, "parts 0"),
    BAD(p13, INV, "not divisible"), BAD(p14, INV, "sharded"), BAD(p15, INV, "local"),
    BAD(o01, INV, "x is bf16 but w is fp32"), BAD(o02, INV, "8"), BAD(o03, INV, "mesh"),
    BAD(o04, INV, "shape"), BAD(o05, UNSUP, "mixes Partial"), BAD(o06, UNSUP, "GELU is not linear"),
    BAD(o07, INV, "5"), BAD(o08, INV, "NULL"),
    BAD(a01, INV, "do not divide"), BAD(a02, UNSUP, "head dim 12"), BAD(a03, INV, "dtypes differ"),
    BAD(a04, INV, "one Layout"), BAD(a05, INV, "unknown mask 4"), BAD(a06, INV, "scale"),
    BAD(a07, INV, "workspace of 8 bytes"), BAD(a08, INV, "[B, S, H, D]"), BAD(a09, INV, "NULL"),
    BAD(a10, INV, "lse must be"), BAD(a11, INV, "o must have"), BAD(a12, INV, "do not divide"),
    BAD(a13, INV, "workspace of 8 bytes is smaller than the"),
};
#define N_CASES (sizeof cases / sizeof cases[0])

typedef struct run_result {
    dt_status got[P][N_CASES];
    int changed[P][N_CASES], wrote[P][N_CASES];
    char msg[P][N_CASES][200];
    dt_status setup[P];
} run_result;

static dt_status make_fixture(dt_context *ctx, fixture *f) {
    memset(f, 0, sizeof *f);
    f->ctx = ctx;
    f->comm = dt_context_comm(ctx);
    int s[1] = {P};
    DT_TRY(dt_mesh_create(ctx, 1, s, NULL, &f->mesh));
    dt_layout sh0 = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)), rep = dt_layout_1d(dt_replicate());
    dt_layout par = dt_layout_1d(dt_partial()), seq = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    int64_t w[2] = {6, 8}, loc[2] = {5, 3}, q[4] = {1, 8 * P, 4, 16}, kv[4] = {1, 8 * P, 2, 16},
            kv3[4] = {1, 8 * P, 3, 16}, q12[4] = {1, 8 * P, 4, 12};
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 2, sh2, &sh0, &f->x));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_BF16, 2, sh2, &sh0, &f->xb));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 2, w, &rep, &f->w));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 2, sh2, &par, &f->part));
    DT_TRY(dt_tensor_create(ctx, NULL, DT_F32, 2, loc, NULL, &f->local));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 4, q, &seq, &f->q));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 4, kv, &seq, &f->kv));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 4, kv3, &seq, &f->kv3));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 4, q12, &seq, &f->q12));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_BF16, 4, q, &seq, &f->qb));
    DT_TRY(dt_tensor_create(ctx, f->mesh, DT_F32, 4, q, &rep, &f->qrep));
    for (int i = 0; i < N_FIX - 2; i++) DT_TRY(dt_tensor_fill_random(*fixture_tensors(f, i), 10 + (uint64_t)i));
    return dt_attention_forward(f->q, f->kv, f->kv, NULL, &f->o, &f->lse);
}

static void outs_reset(fixture *f) {
    f->out = f->out2 = f->out3 = SENTINEL;
    f->ring = SENTINEL;
    f->comm_out = SENTINEL;
    f->mesh_out = SENTINEL;
}

/* Whether a call wrote any output handle; destroys what it made. */
static int outs_written(fixture *f) {
    int wrote = 0;
    dt_tensor **t[3] = {&f->out, &f->out2, &f->out3};
    for (int i = 0; i < 3; i++)
        if (*t[i] != SENTINEL) wrote = 1, dt_tensor_destroy(*t[i]);
    if (f->ring != SENTINEL) wrote = 1, dt_ring_destroy(f->ring);
    if (f->comm_out != SENTINEL) wrote = 1, dt_comm_destroy(f->comm_out);
    if (f->mesh_out != SENTINEL) wrote = 1, dt_mesh_destroy(f->mesh_out);
    outs_reset(f);
    return wrote;
}

static void free_fixture(fixture *f) {
    for (int i = 0; i < N_FIX; i++) dt_tensor_destroy(*fixture_tensors(f, i));
    dt_mesh_destroy(f->mesh);
}

static dt_status rank_table(dt_context *ctx, void *arg) {
    run_result *res = arg;
    int r = dt_context_rank(ctx);
    fixture f;
    dt_status st = make_fixture(ctx, &f);
    res->setup[r] = st;
    for (size_t i = 0; st == DT_SUCCESS && i < N_CASES; i++) {
        uint64_t before[N_FIX];
        for (int k = 0; k < N_FIX; k++) before[k] = checksum(*fixture_tensors(&f, k));
        outs_reset(&f);
        dt_clear_error();
        res->got[r][i] = cases[i].call(&f);
        snprintf(res->msg[r][i], sizeof res->msg[r][i], "%s", dt_last_error());
        res->wrote[r][i] = outs_written(&f);
        for (int k = 0; k < N_FIX; k++) res->changed[r][i] += before[k] != checksum(*fixture_tensors(&f, k));
    }
    free_fixture(&f);
    return st;
}

static void test_bad_input_table(void **state) {
    (void)state;
    static run_result res;
    memset(&res, 0, sizeof res);
    assert_true(N_CASES >= 50);
    assert_int_equal(h_launch(P, rank_table, &res), DT_SUCCESS);
    int failures = 0;
    for (int r = 0; r < P; r++) {
        assert_int_equal(res.setup[r], DT_SUCCESS);
        for (size_t i = 0; i < N_CASES; i++) {
            int ok = res.got[r][i] == cases[i].want && strstr(res.msg[r][i], cases[i].needle) &&
                     !res.changed[r][i] && !res.wrote[r][i];
            if (!ok) {
                failures++;
                print_error("rank %d %s: got %s (want %s), changed %d, wrote %d: \"%s\" (want \"%s\")\n",
                            r, cases[i].name, dt_status_name(res.got[r][i]), dt_status_name(cases[i].want),
                            res.changed[r][i], res.wrote[r][i], res.msg[r][i], cases[i].needle);
            }
        }
    }
    print_message("%zu invalid calls on %d ranks\n", N_CASES, P);
    assert_int_equal(failures, 0);
}

/* dt_launch itself, on the main thread. */
static dt_status noop(dt_context *ctx, void *arg) {
    (void)ctx, (void)arg;
    return DT_SUCCESS;
}

static void test_bad_launches(void **state) {
    (void)state;
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    assert_int_equal(dt_launch(0, noop, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_launch(DT_MAX_WORLD_SIZE + 1, noop, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "1025"));
    assert_int_equal(dt_launch(2, NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    o.backend = (dt_backend_kind)9;
    assert_int_equal(dt_launch(2, noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    o = (dt_launch_options)DT_LAUNCH_OPTIONS_INIT;
    o.checks = (dt_check_mode)9;
    assert_int_equal(dt_launch(2, noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "check mode 9"));
    o = (dt_launch_options)DT_LAUNCH_OPTIONS_INIT;
    o.timeout_ms = -1;
    assert_int_equal(dt_launch(2, noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_input_table),
        cmocka_unit_test(test_bad_launches),
    };
    return cmocka_run_group_tests_name("bad input across the public API", tests, NULL, NULL);
}
