/* attention/forward.c — the distributed attention forward pass.
 *
 * Algorithm (DESIGN.md section 6). Rank j of the P ranks of the sequence
 * mesh dim holds a query shard and a key/value shard, each one or two
 * position segments (mask.h). K and V are packed into one ring buffer. For
 * t = 0..P-1: the ring's current block is that of rank src = (j - t) mod P;
 * the transfer of the next block is posted before the block kernel runs on
 * the current one (q segments x src's k segments, each with its own
 * positions), and completed after. The kernel accumulates m, l and acc in
 * fp32; after the last step the output is normalised once and the
 * log-sum-exp kept for the backward pass.
 *
 * Invariants: everything the loop touches (ring buffers, accumulators,
 * kernel scratch) lives in one workspace sized by dt_attention_workspace_size
 * and allocated before the loop, or given by the caller; ranks agree on the
 * call (checked by one small all_gather) before any block moves; a rank that
 * fails after that aborts the communicators, so no peer waits for it.
 *
 * Test: tests/test_attention.c (make test).
 */
#include "attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../collectives/ring.h"
#include "../dtensor/context_internal.h"
#include "block.h"

/* Everything a call needs, derived from its arguments without communicating. */
typedef struct attn_plan {
    dt_context *ctx;
    const dt_mesh *mesh;
    dt_dtype dtype;
    int64_t B, S, H, Hkv, D;          /* global */
    int64_t b, c, h, hkv;             /* local: batch, rows, heads, kv heads */
    int sp_dim;                       /* mesh dim sharding S; -1 if none */
    int parts, rank;                  /* its size and this rank's coordinate */
    dt_order order;
    dt_attn_mask mask;
    float scale;
    dt_layout lse_layout;
    size_t kv_bytes;                  /* one local K (or V) block */
    size_t off_acc, off_m, off_l, off_scratch, total;   /* workspace layout */
} attn_plan;

static size_t align_up(size_t n) { return (n + 63) & ~(size_t)63; }

static dt_status attn_error(const attn_plan *p, dt_status st, const char *op, const char *msg) {
    return dt_error(st, "rank %d: %s: %s", p->ctx ? dt_context_rank(p->ctx) : -1, op, msg);
}

/* Validate and derive the plan. Touches nothing. */
static dt_status plan_attention(const char *op, const dt_tensor *q, const dt_tensor *k,
                                const dt_tensor *v, const dt_attention_options *opts,
                                attn_plan *p) {
    char msg[512];
    memset(p, 0, sizeof *p);
    DT_REQUIRE(q && k && v, "%s: q, k and v must not be NULL (got %p, %p, %p)", op, (const void *)q,
               (const void *)k, (const void *)v);
    p->ctx = dt_tensor_context(q);
    p->mesh = dt_tensor_mesh(q);
#define FAIL(st, ...)                                 \
    do {                                              \
        snprintf(msg, sizeof msg, __VA_ARGS__);       \
        return attn_error(p, (st), op, msg);          \
    } while (0)
    if (dt_tensor_context(k) != p->ctx || dt_tensor_context(v) != p->ctx ||
        dt_tensor_mesh(k) != p->mesh || dt_tensor_mesh(v) != p->mesh)
        FAIL(DT_ERR_INVALID_ARGUMENT, "q, k and v must share one context and one mesh");
    p->dtype = dt_tensor_dtype(q);
    if (dt_tensor_dtype(k) != p->dtype || dt_tensor_dtype(v) != p->dtype)
        FAIL(DT_ERR_INVALID_ARGUMENT, "dtypes differ: q %s, k %s, v %s", dt_dtype_name(p->dtype),
             dt_dtype_name(dt_tensor_dtype(k)), dt_dtype_name(dt_tensor_dtype(v)));
    if (dt_tensor_ndim(q) != 4 || dt_tensor_ndim(k) != 4 || dt_tensor_ndim(v) != 4)
        FAIL(DT_ERR_INVALID_ARGUMENT, "q, k and v must be [B, S, H, D] (ndim %d, %d, %d)",
             dt_tensor_ndim(q), dt_tensor_ndim(k), dt_tensor_ndim(v));
    const int64_t *qs = dt_tensor_shape(q), *ks = dt_tensor_shape(k), *vs = dt_tensor_shape(v);
    p->B = qs[0], p->S = qs[1], p->H = qs[2], p->D = qs[3], p->Hkv = ks[2];
    for (int d = 0; d < 4; d++)
        if (ks[d] != vs[d])
            FAIL(DT_ERR_INVALID_ARGUMENT, "k and v shapes differ on dim %d: %lld vs %lld", d,
                 (long long)ks[d], (long long)vs[d]);
    if (ks[0] != p->B || ks[1] != p->S || ks[3] != p->D)
        FAIL(DT_ERR_INVALID_ARGUMENT, "q [%lld, %lld, %lld, %lld] and k [%lld, %lld, %lld, %lld] "
             "must agree on B, S and D", (long long)qs[0], (long long)qs[1], (long long)qs[2],
             (long long)qs[3], (long long)ks[0], (long long)ks[1], (long long)ks[2],
             (long long)ks[3]);
    if (p->Hkv < 1 || p->H % p->Hkv)
        FAIL(DT_ERR_INVALID_ARGUMENT, "kv heads %lld do not divide query heads %lld",
             (long long)p->Hkv, (long long)p->H);
    if (p->D < 8 || p->D > DT_ATTN_MAX_HEAD_DIM || p->D % 8)
        FAIL(DT_ERR_NOT_SUPPORTED, "head dim %lld is not supported (multiples of 8 up to %d)",
             (long long)p->D, DT_ATTN_MAX_HEAD_DIM);
    if (p->dtype != DT_F32 && p->dtype != DT_BF16)
        FAIL(DT_ERR_NOT_SUPPORTED, "dtype %s is not supported on the %s backend (fp32, bf16)",
             dt_dtype_name(p->dtype), dt_backend_kind_name(dt_context_backend(p->ctx)));
    if (dt_context_backend(p->ctx) != DT_BACKEND_CPU)
        FAIL(DT_ERR_NOT_SUPPORTED, "no attention kernel for the %s backend in this build",
             dt_backend_kind_name(dt_context_backend(p->ctx)));

    dt_attention_options def = DT_ATTENTION_OPTIONS_INIT;
    if (!opts) opts = &def;
    if ((int)opts->mask < 0 || opts->mask >= DT_ATTN_MASK_COUNT)
        FAIL(DT_ERR_INVALID_ARGUMENT, "unknown mask %d", (int)opts->mask);
    if (!(opts->scale >= 0.0f) || isinf(opts->scale))
        FAIL(DT_ERR_INVALID_ARGUMENT, "scale %g must be finite and >= 0 (0: 1/sqrt(D))",
             (double)opts->scale);
    p->mask = opts->mask;
    p->scale = opts->scale > 0.0f ? opts->scale : 1.0f / sqrtf((float)p->D);

    /* Layouts: one for all three; S over at most one mesh dim; heads only
     * contiguous and divisible in kv heads; D never; nothing Partial. */
    p->sp_dim = -1;
    p->parts = 1;
    p->order = DT_ORDER_CONTIGUOUS;
    p->b = p->B, p->c = p->S, p->h = p->H, p->hkv = p->Hkv;
    if (p->mesh) {
        const dt_layout *lq = dt_tensor_layout(q);
        char fq[128], fk[128], fv[128];
        dt_layout_format(lq, fq, sizeof fq);
        dt_layout_format(dt_tensor_layout(k), fk, sizeof fk);
        dt_layout_format(dt_tensor_layout(v), fv, sizeof fv);
        if (!dt_layout_equal(lq, dt_tensor_layout(k)) || !dt_layout_equal(lq, dt_tensor_layout(v)))
            FAIL(DT_ERR_INVALID_ARGUMENT, "q, k and v must share one Layout: q %s, k %s, v %s", fq,
                 fk, fv);
        p->lse_layout = *lq;
        for (int m = 0; m < lq->ndim; m++) {
            dt_placement pl = lq->placements[m];
            int size = dt_mesh_size(p->mesh, m);
            if (pl.kind == DT_PARTIAL)
                FAIL(DT_ERR_INVALID_ARGUMENT, "Layout %s has a Partial mesh dim %d: reduce first",
                     fq, m);
            if (pl.kind != DT_SHARD) continue;
            if (pl.dim == 1) {
                p->sp_dim = m;
                p->parts = size;
                p->rank = dt_mesh_coord(p->mesh, m);
                p->order = pl.order;
                p->c = p->S / size;
                p->lse_layout.placements[m].dim = 2;
            } else if (pl.dim == 2) {
                if (pl.order != DT_ORDER_CONTIGUOUS || p->Hkv % size)
                    FAIL(DT_ERR_NOT_SUPPORTED, "heads sharded %s over %d ranks: need contiguous "
                         "order and kv heads (%lld) divisible by %d", dt_order_name(pl.order),
                         size, (long long)p->Hkv, size);
                p->h = p->H / size;
                p->hkv = p->Hkv / size;
                p->lse_layout.placements[m].dim = 1;
            } else if (pl.dim == 3) {
                FAIL(DT_ERR_INVALID_ARGUMENT, "Layout %s shards the head dim D", fq);
            } else {
                p->b = p->B / size;   /* batch: independent rows */
            }
        }
        if (p->sp_dim >= 0 && p->order == DT_ORDER_ZIGZAG && p->S % (2 * p->parts))
            FAIL(DT_ERR_INVALID_ARGUMENT, "zigzag needs S (%lld) divisible by 2P (%d)",
                 (long long)p->S, 2 * p->parts);
    }
#undef FAIL
    size_t es = dt_dtype_size(p->dtype);
    p->kv_bytes = (size_t)(p->b * p->c * p->hkv * p->D) * es;
    size_t rows = (size_t)(p->b * p->h * p->c);
    p->off_acc = align_up(4 * p->kv_bytes);               /* ring: 2 buffers of K|V */
    p->off_m = p->off_acc + align_up(rows * (size_t)p->D * sizeof(float));
    p->off_l = p->off_m + align_up(rows * sizeof(float));
    p->off_scratch = p->off_l + align_up(rows * sizeof(float));
    p->total = p->off_scratch + align_up(dt_attn_block_cpu_scratch(p->D));
    return DT_SUCCESS;
}

dt_status dt_attention_workspace_size(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                      const dt_attention_options *opts, size_t *bytes) {
    DT_REQUIRE(bytes != NULL, "dt_attention_workspace_size: bytes is NULL");
    attn_plan p;
    DT_TRY(plan_attention("dt_attention_workspace_size", q, k, v, opts, &p));
    *bytes = p.total;
    return DT_SUCCESS;
}

/* All ranks must run the same call: compare everything the plan depends on. */
static dt_status check_ranks_agree(const attn_plan *p, dt_comm *comm, const char *op) {
    static const char *const names[] = {
        "dtype", "B", "S", "H", "H_kv", "D", "mask", "scale (bits)", "mesh dims",
        "placement[0]", "placement[1]", "placement[2]",
    };
    int32_t scale_bits;
    memcpy(&scale_bits, &p->scale, sizeof scale_bits);
    const dt_layout *l = &p->lse_layout;
    int64_t v[12] = {p->dtype, p->B, p->S, p->H, p->Hkv, p->D, p->mask, scale_bits, l->ndim,
                     0, 0, 0};
    for (int m = 0; m < l->ndim; m++)
        v[9 + m] = l->placements[m].kind * 10000 + l->placements[m].dim * 100 +
                   l->placements[m].order;
    return dt_comm_check_agreement(comm, op, v, names, 12);
}

/* The block kernel on every (q segment, k segment) pair of one ring step. */
static dt_status run_blocks(const attn_plan *p, const void *q, const void *kv, int src,
                            float *acc, float *m, float *l, void *scratch) {
    dt_attn_segment qs[2], ks[2];
    int nq = 1, nk = 1;
    if (p->sp_dim >= 0) {
        nq = dt_attn_segments(p->order, p->S, p->parts, p->rank, qs);
        nk = dt_attn_segments(p->order, p->S, p->parts, src, ks);
    } else {
        qs[0] = ks[0] = (dt_attn_segment){0, 1, p->S};
    }
    size_t es = dt_dtype_size(p->dtype);
    const char *k = kv, *v = (const char *)kv + p->kv_bytes;
    int64_t qoff = 0;
    for (int i = 0; i < nq; i++) {
        int64_t koff = 0;
        for (int j = 0; j < nk; j++) {
            dt_attn_block_args a = {
                .dtype = p->dtype, .batch = p->b, .heads = p->h, .kv_heads = p->hkv, .dim = p->D,
                .q = (const char *)q + (size_t)(qoff * p->h * p->D) * es,
                .q_batch_stride = p->c * p->h * p->D,
                .k = k + (size_t)(koff * p->hkv * p->D) * es,
                .v = v + (size_t)(koff * p->hkv * p->D) * es,
                .kv_batch_stride = p->c * p->hkv * p->D,
                .qseg = qs[i], .kseg = ks[j], .mask = p->mask, .scale = p->scale,
                .m = m + qoff, .l = l + qoff,
                .ml_batch_stride = p->h * p->c, .ml_head_stride = p->c,
                .acc = acc + qoff * p->h * p->D, .acc_batch_stride = p->c * p->h * p->D,
            };
            DT_TRY(dt_attn_block_cpu(&a, scratch));
            koff += ks[j].len;
        }
        qoff += qs[i].len;
    }
    return DT_SUCCESS;
}

dt_status dt_attention_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_options *opts, dt_tensor **o, dt_tensor **lse) {
    const char *op = "dt_attention_forward";
    DT_REQUIRE(o != NULL, "%s: o is NULL", op);
    *o = NULL;
    if (lse) *lse = NULL;
    attn_plan p;
    DT_TRY(plan_attention(op, q, k, v, opts, &p));
    if (opts && opts->workspace && opts->workspace_bytes < p.total)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: %s: workspace of %zu bytes is smaller "
                        "than the %zu needed (dt_attention_workspace_size)",
                        dt_context_rank(p.ctx), op, opts->workspace_bytes, p.total);
    dt_comm *comm = p.sp_dim >= 0 ? dt_mesh_comm(p.mesh, p.sp_dim) : NULL;
    if (p.mesh) DT_TRY(check_ranks_agree(&p, dt_context_comm(p.ctx), op));

    dt_backend *be = p.ctx->backend;
    dt_tensor *out = NULL, *out_lse = NULL;
    dt_ring *ring = NULL;
    char *ws = opts ? opts->workspace : NULL;
    int own_ws = ws == NULL;
    dt_status st;
    if (own_ws) DT_TRY_GOTO(st, be->ops->alloc(be, p.total, (void **)&ws), fail);
    int64_t lse_shape[3] = {p.B, p.H, p.S};
    DT_TRY_GOTO(st, dt_tensor_create(p.ctx, p.mesh, p.dtype, 4, dt_tensor_shape(q),
                                     dt_tensor_layout(q)->ndim ? dt_tensor_layout(q) : NULL, &out),
                fail);
    DT_TRY_GOTO(st, dt_tensor_create(p.ctx, p.mesh, DT_F32, 3, lse_shape,
                                     p.mesh ? &p.lse_layout : NULL, &out_lse), fail);

    float *acc = (float *)(ws + p.off_acc), *m = (float *)(ws + p.off_m);
    float *l = (float *)(ws + p.off_l);
    size_t rows = (size_t)(p.b * p.h * p.c);
    memset(acc, 0, rows * (size_t)p.D * sizeof(float));
    memset(l, 0, rows * sizeof(float));
    for (size_t i = 0; i < rows; i++) m[i] = -INFINITY;

    /* Pack this rank's K and V into the ring's first buffer. */
    if (comm) {
        DT_TRY_GOTO(st, dt_ring_create_in(comm, 2 * p.kv_bytes, DT_RING_FORWARD, ws, &ring), fail);
    }
    char *kv = ring ? dt_ring_current(ring) : ws;
    memcpy(kv, dt_tensor_data_const(k), p.kv_bytes);
    memcpy(kv + p.kv_bytes, dt_tensor_data_const(v), p.kv_bytes);

    for (int t = 0; t < p.parts; t++) {
        int more = t + 1 < p.parts;
        if (more) DT_TRY_GOTO(st, dt_ring_start(ring), fail);
        int src = ring ? dt_ring_source(ring) : 0;
        DT_TRY_GOTO(st, run_blocks(&p, dt_tensor_data_const(q), ring ? dt_ring_current(ring) : kv,
                                   src, acc, m, l, ws + p.off_scratch), fail);
        if (more) DT_TRY_GOTO(st, dt_ring_wait(ring), fail);
    }
    dt_attn_finalize_cpu(p.dtype, p.b, p.c, p.h, p.D, acc, m, l, dt_tensor_data(out),
                         dt_tensor_data(out_lse));
    dt_ring_destroy(ring);
    if (own_ws) be->ops->free(be, ws);
    *o = out;
    if (lse) *lse = out_lse;
    else dt_tensor_destroy(out_lse);
    return DT_SUCCESS;
fail:
    /* Peers may be waiting for this rank's next block: release them. */
    if (comm) dt_comm_abort(comm, st, dt_last_error());
    dt_ring_destroy(ring);
    if (own_ws && ws) be->ops->free(be, ws);
    dt_tensor_destroy(out);
    dt_tensor_destroy(out_lse);
    return st;
}
