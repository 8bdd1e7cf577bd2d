/* attention/plan.c — validation and geometry shared by the attention
 * forward and backward passes (see plan.h). */
#include "plan.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../dtensor/context.h"
#include "../dtensor/context_internal.h"
#include "../dtensor/mesh.h"

static dt_status attn_error(const attn_plan *p, dt_status st, const char *op, const char *msg) {
    return dt_error(st, "rank %d: %s: %s", p->ctx ? dt_context_rank(p->ctx) : -1, op, msg);
}

const char *dt_attn_kernel_choice_name(dt_attn_kernel_choice k) {
    switch (k) {
    case DT_ATTN_KERNEL_AUTO: return "auto";
    case DT_ATTN_KERNEL_SIMPLE: return "simple";
    case DT_ATTN_KERNEL_MMA: return "mma";
    case DT_ATTN_KERNEL_WGMMA: return "wgmma";
    case DT_ATTN_KERNEL_MMA_LATEST: return "mma-latest";
    case DT_ATTN_KERNEL_WGMMA_LATEST: return "wgmma-latest";
    case DT_ATTN_KERNEL_SIMPLE_LATEST: return "simple-latest";
    default: return "unknown";
    }
}

/* DT_ATTN_KERNEL: unset or empty is auto; the names in any case, as
 * DT_BACKEND's. Read here, once per attention call (not per block), so a
 * program or test may change it between calls. */
static int kernel_from_env(dt_attn_kernel_choice *out) {
    const char *v = getenv("DT_ATTN_KERNEL");
    *out = DT_ATTN_KERNEL_AUTO;
    if (!v || !*v) return 1;
    for (int k = 0; k < DT_ATTN_KERNEL_COUNT; k++)
        if (strcasecmp(v, dt_attn_kernel_choice_name((dt_attn_kernel_choice)k)) == 0) {
            *out = (dt_attn_kernel_choice)k;
            return 1;
        }
    return 0;
}

/* Validate and derive the plan. Touches nothing. */
dt_status attn_plan_make(const char *op, const dt_tensor *q, const dt_tensor *k,
                                const dt_tensor *v, const dt_attention_options *opts,
                                attn_plan *p) {
    char msg[512];
    memset(p, 0, sizeof *p);
    /* The context and mesh of any of them, so that a rank that passed a
     * NULL among them still shows its peers its failure at the entry check
     * (attn_plan_check_agreement) instead of leaving them to time out. */
    const dt_tensor *any = q ? q : k ? k : v;
    if (any) {
        p->ctx = dt_tensor_context(any);
        p->mesh = dt_tensor_mesh(any);
    }
    DT_REQUIRE(q && k && v, "%s: q, k and v must not be NULL (got %p, %p, %p)", op, (const void *)q,
               (const void *)k, (const void *)v);
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
    if (!dt_dtype_is_float(p->dtype))
        FAIL(DT_ERR_NOT_SUPPORTED, "dtype %s is not supported (fp32, bf16, fp16)",
             dt_dtype_name(p->dtype));
    /* The one place that picks a backend's kernels. */
    p->kern = NULL;
    if (dt_context_backend(p->ctx) == DT_BACKEND_CPU) p->kern = &dt_attn_kernels_cpu;
#ifdef DT_HAVE_CUDA
    if (dt_context_backend(p->ctx) == DT_BACKEND_CUDA) p->kern = &dt_attn_kernels_cuda;
#endif
    if (!p->kern)
        FAIL(DT_ERR_NOT_SUPPORTED, "no attention kernel for the %s backend in this build",
             dt_backend_kind_name(dt_context_backend(p->ctx)));
    dt_attention_options def = DT_ATTENTION_OPTIONS_INIT;
    if (!opts) opts = &def;
    const dt_attention_tuning tdef = DT_ATTENTION_TUNING_INIT;
    p->tuning = opts->tuning ? *opts->tuning : tdef;
    if ((int)p->tuning.kernel < 0 || p->tuning.kernel >= DT_ATTN_KERNEL_COUNT)
        FAIL(DT_ERR_INVALID_ARGUMENT, "unknown kernel choice %d", (int)p->tuning.kernel);
    if (p->tuning.kernel == DT_ATTN_KERNEL_AUTO && !kernel_from_env(&p->tuning.kernel))
        FAIL(DT_ERR_INVALID_ARGUMENT, "DT_ATTN_KERNEL=%s is not auto, simple, mma, wgmma, "
             "mma-latest, wgmma-latest or simple-latest", getenv("DT_ATTN_KERNEL"));
    if ((int)opts->mask < 0 || opts->mask >= DT_ATTN_MASK_COUNT)
        FAIL(DT_ERR_INVALID_ARGUMENT, "unknown mask %d", (int)opts->mask);
    if (!(opts->scale >= 0.0f) || isinf(opts->scale))
        FAIL(DT_ERR_INVALID_ARGUMENT, "scale %g must be finite and >= 0 (0: 1/sqrt(D))",
             (double)opts->scale);
    if (opts->group < 0)
        FAIL(DT_ERR_INVALID_ARGUMENT, "group %d must be >= 0 (0 or 1: a launch per ring step)",
             opts->group);
    if (opts->window < 0)
        FAIL(DT_ERR_INVALID_ARGUMENT, "window %lld must be >= 0 (0: none)", (long long)opts->window);
    p->mask = opts->mask;
    p->window = opts->window;
    p->doc_lens = opts->doc_lens;
    p->doc_count = opts->doc_count;
    DT_TRY(dt_docs_check(op, p->doc_lens, p->doc_count, p->B, p->S, &p->docs_per_row));
    p->ruled = p->doc_lens != NULL || p->window > 0;
    p->scale = opts->scale > 0.0f ? opts->scale : 1.0f / sqrtf((float)p->D);

    /* Layouts: one for all three; S over at most one mesh dim (the
     * all-to-all dim's call, attention.h, moves it to the heads first);
     * heads, over any mesh dims, only contiguous and divisible in kv heads
     * at each; D never; nothing Partial. */
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
        int mdims[DT_MAX_MESH_DIMS];
        if (dt_layout_shard_dims(lq, 1, mdims) > 1)
            FAIL(DT_ERR_NOT_SUPPORTED, "Layout %s shards the sequence (dim 1) over several mesh "
                 "dims: name the inner one dt_attention_options.a2a_dim (Ulysses), or shard it "
                 "over one", fq);
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
                if ((size > 1 && pl.order != DT_ORDER_CONTIGUOUS) || p->hkv % size)
                    FAIL(DT_ERR_NOT_SUPPORTED, "heads sharded %s over %d ranks: need contiguous "
                         "order and kv heads (%lld there) divisible by %d",
                         dt_order_name(pl.order), size, (long long)p->hkv, size);
                p->h /= size;
                p->hkv /= size;
                p->lse_layout.placements[m].dim = 1;
            } else if (pl.dim == 3) {
                FAIL(DT_ERR_INVALID_ARGUMENT, "Layout %s shards the head dim D", fq);
            } else {
                p->b /= size;   /* batch: independent rows */
            }
        }
        if (p->sp_dim >= 0 && p->order == DT_ORDER_ZIGZAG && p->S % (2 * p->parts))
            FAIL(DT_ERR_INVALID_ARGUMENT, "zigzag needs S (%lld) divisible by 2P (%d)",
                 (long long)p->S, 2 * p->parts);
    }
    /* a grouped striped launch compares made-up positions (mask.h): causal only */
    p->group = p->ruled && p->order == DT_ORDER_STRIPED
                   ? 1
                   : dt_attn_ring_group(p->order, p->mask, p->parts, opts->group);
    /* A row of q, o or the fp32 acc holds the local heads: its stride is an
     * int for BLAS and the CUDA kernels alike. */
    if (p->h * p->D > INT_MAX)
        FAIL(DT_ERR_NOT_SUPPORTED, "%lld local heads x head dim %lld: a token's row of more than "
             "%d elements", (long long)p->h, (long long)p->D, INT_MAX);
    /* The CUDA kernels launch one grid row per local head and batch entry. */
    if (dt_context_backend(p->ctx) == DT_BACKEND_CUDA && (p->h > 65535 || p->b > 65535))
        FAIL(DT_ERR_NOT_SUPPORTED, "%lld local heads x %lld local batch: the CUDA kernels take "
             "at most 65535 of each", (long long)p->h, (long long)p->b);
#undef FAIL
    p->kv_bytes = (size_t)(p->b * p->c * p->hkv * p->D) * dt_dtype_size(p->dtype);
    return DT_SUCCESS;
}

dt_status attn_plan_check_kernel(attn_plan *p, const char *op) {
    char why[256] = "";
    p->exact_nonfinite = !p->kern || !p->kern->exact_nonfinite ||
                         p->kern->exact_nonfinite(p->ctx->backend, p->dtype, p->D, p->tuning.kernel);
    if (!p->kern || !p->kern->kernel_check) return DT_SUCCESS;
    if (p->kern->kernel_check(p->ctx->backend, p->dtype, p->D, p->tuning.kernel, p->ruled, why,
                              sizeof why) == DT_SUCCESS)
        return DT_SUCCESS;
    char msg[320];
    snprintf(msg, sizeof msg, "DT_ATTN_KERNEL=%s: %s", dt_attn_kernel_choice_name(p->tuning.kernel), why);
    return attn_error(p, DT_ERR_NOT_SUPPORTED, op, msg);
}

dt_status attn_plan_check_workspace(const attn_plan *p, const char *op,
                                    const dt_attention_options *opts, size_t needed,
                                    const char *size_fn) {
    if (!opts || !opts->workspace || opts->workspace_bytes >= needed) return DT_SUCCESS;
    char msg[200];
    snprintf(msg, sizeof msg, "workspace of %zu bytes is smaller than the %zu needed (%s)",
             opts->workspace_bytes, needed, size_fn);
    return attn_error(p, DT_ERR_INVALID_ARGUMENT, op, msg);
}

/* All ranks must run the same call: compare everything the plan depends on. */
dt_status attn_plan_check_agreement(const attn_plan *p, const char *op, dt_status local) {
    if (!p->mesh) return local;
    static const char *const names[] = {
        "dtype", "B", "S", "H", "H_kv", "D", "mask", "scale (bits)", "group", "mesh dims",
        "placement[0]", "placement[1]", "placement[2]", "window", "documents", "documents (hash)",
    };
    int32_t scale_bits;
    memcpy(&scale_bits, &p->scale, sizeof scale_bits);
    const dt_layout *l = &p->lse_layout;
    /* the document lengths by FNV-1a, as a non-negative int64 */
    uint64_t hash = 14695981039346656037ull;
    for (int64_t i = 0; p->doc_lens && i < p->doc_count; i++)
        for (int byte = 0; byte < 8; byte++)
            hash = (hash ^ (((uint64_t)p->doc_lens[i] >> (8 * byte)) & 0xff)) * 1099511628211ull;
    int64_t v[16] = {p->dtype, p->B, p->S, p->H, p->Hkv, p->D, p->mask, scale_bits, p->group,
                     l->ndim, 0, 0, 0, p->window, p->doc_count, (int64_t)(hash >> 1)};
    for (int m = 0; m < l->ndim; m++)
        v[10 + m] = l->placements[m].kind * 10000 + l->placements[m].dim * 100 +
                    l->placements[m].order;
    return dt_context_check_call(p->ctx, op, local, v, names, 16, DT_CHECK_ON);
}

/* "[b, s, h, d]": the global index of local element i of t. */
static void global_index(const dt_tensor *t, int64_t i, char *buf, size_t size) {
    const int nd = dt_tensor_ndim(t);
    const int64_t *ls = dt_tensor_local_shape(t);
    int64_t x[DT_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        x[d] = ls[d] ? i % ls[d] : 0;
        i = ls[d] ? i / ls[d] : 0;
    }
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < nd && at < size; d++) {
        int64_t *g = malloc((size_t)(ls[d] ? ls[d] : 1) * sizeof *g);
        int64_t gi = x[d];
        if (g && dt_tensor_global_indices(t, d, g) == DT_SUCCESS) gi = g[x[d]];
        free(g);
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", d ? ", " : "[", (long long)gi);
    }
    if (at < size) snprintf(buf + at, size - at, "]");
}

/* The first local element of t that is NaN or infinite (-inf allowed where
 * `neg_inf_ok`), through the host; -1 if none. */
static dt_status first_nonfinite(const dt_tensor *t, int neg_inf_ok, int64_t *first) {
    *first = -1;
    const size_t n = (size_t)dt_tensor_local_numel(t), bytes = dt_tensor_local_bytes(t);
    if (!n) return DT_SUCCESS;
    void *h = malloc(bytes);
    if (!h) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    dt_status st = dt_tensor_get_local(t, h, bytes);
    for (size_t i = 0; st == DT_SUCCESS && i < n; i++) {
        const float v = dt_value_get(h, dt_tensor_dtype(t), i);
        if (!isfinite(v) && !(neg_inf_ok && v == -INFINITY)) {
            *first = (int64_t)i;
            break;
        }
    }
    free(h);
    return st;
}

dt_status attn_plan_check_output(const attn_plan *p, const char *op, const dt_tensor *t,
                                 const char *name, int neg_inf_ok) {
    if (!dt_context_checks(p->ctx)) return DT_SUCCESS;
    int64_t first = -1;
    DT_TRY(first_nonfinite(t, neg_inf_ok, &first));
    if (first < 0) return DT_SUCCESS;
    char at[160];
    global_index(t, first, at, sizeof at);
    return dt_error(DT_ERR_NONFINITE, "rank %d: %s: %s holds a NaN or Inf at %s (its inputs were "
                    "finite; DT_CHECK)", dt_context_rank(p->ctx), op, name, at);
}

/* The bounds within which the kernels' fp32 arithmetic stays finite
 * (docs/RELIABILITY.md states them): from the largest |q|, |k|, |v| and,
 * backward, |dout| of every rank. */
static dt_status check_range(const attn_plan *p, const char *op, const float *mx, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(mx[i])) return DT_SUCCESS;   /* non-finite inputs propagate */
    /* max(scale, 1): a kernel may form q.k before scaling it, or after */
    const double lim = FLT_MAX / 4.0, S = (double)p->S, D = (double)p->D,
                 sc = fmax((double)p->scale, 1.0);
    const double logits = sc * D * (double)mx[0] * (double)mx[1] * 1.4426950408889634;
    const double acc = S * (double)mx[2];
    char msg[400];
    if (logits >= lim) {
        snprintf(msg, sizeof msg, "the logits may leave fp32's range: max(scale %g, 1) x D %lld x "
                 "max|q| %g x max|k| %g x log2(e) = %.3g is not below %.3g; scale q or k down",
                 (double)p->scale, (long long)p->D, (double)mx[0], (double)mx[1], logits, lim);
        return attn_error(p, DT_ERR_OUT_OF_RANGE, op, msg);
    }
    if (acc >= lim) {
        snprintf(msg, sizeof msg, "the output's sums may leave fp32's range: S %lld x max|v| %g = "
                 "%.3g is not below %.3g; scale v down", (long long)p->S, (double)mx[2], acc, lim);
        return attn_error(p, DT_ERR_OUT_OF_RANGE, op, msg);
    }
    if (n > 3) {   /* dQ, dK: max(scale, 1) S 2D |dout| |v| max(|k|, |q|); dV: S |dout| */
        const double g = sc * S * 2.0 * D * (double)mx[3] * (double)mx[2] *
                         fmax((double)mx[0], (double)mx[1]);
        if (g >= lim || S * (double)mx[3] >= lim) {
            snprintf(msg, sizeof msg, "the gradients may leave fp32's range: max(scale %g, 1) x S "
                     "%lld x 2D %lld x max|dout| %g x max|v| %g x max(max|q|, max|k|) = %.3g is "
                     "not below %.3g; scale the inputs down", (double)p->scale, (long long)p->S,
                     (long long)(2 * p->D), (double)mx[3], (double)mx[2], g, lim);
            return attn_error(p, DT_ERR_OUT_OF_RANGE, op, msg);
        }
    }
    return DT_SUCCESS;
}

/* The largest of mx[0..n) over the world's ranks (through backend memory:
 * a transport may take device memory only); a NaN counts as +inf, which
 * every transport's max keeps. */
static dt_status world_max(const attn_plan *p, float *mx, int n) {
    dt_backend *be = p->ctx->backend;
    for (int i = 0; i < n; i++)
        if (isnan(mx[i])) mx[i] = INFINITY;
    void *buf = NULL;
    DT_TRY(be->ops->alloc(be, (size_t)n * sizeof *mx, &buf));
    dt_status st = be->ops->upload(be, buf, mx, (size_t)n * sizeof *mx);
    if (st == DT_SUCCESS)
        st = dt_comm_all_reduce(dt_context_comm(p->ctx), buf, buf, (size_t)n, DT_F32,
                                DT_REDUCE_MAX);
    if (st == DT_SUCCESS) st = be->ops->download(be, mx, buf, (size_t)n * sizeof *mx);
    be->ops->free(be, buf);
    return st;
}

dt_status attn_plan_check_call(attn_plan *p, const char *op, dt_status local,
                               const dt_tensor *const *in, const char *const *names, int n) {
    float mx[4] = {0, 0, 0, 0};
    dt_backend *be = p->ctx ? p->ctx->backend : NULL;
    for (int i = 0; local == DT_SUCCESS && i < n; i++) {
        local = be->ops->absmax(be, dt_tensor_dtype(in[i]), dt_tensor_local_numel(in[i]),
                                dt_tensor_data_const(in[i]), &mx[i]);
        if (local != DT_SUCCESS || isfinite(mx[i]) || !dt_context_checks(p->ctx)) continue;
        int64_t first = -1;
        local = first_nonfinite(in[i], 0, &first);
        if (local != DT_SUCCESS || first < 0) continue;
        char at[160], msg[300];
        global_index(in[i], first, at, sizeof at);
        snprintf(msg, sizeof msg, "%s holds a NaN or Inf at %s (DT_CHECK)", names[i], at);
        local = attn_error(p, DT_ERR_NONFINITE, op, msg);
    }
    DT_TRY(attn_plan_check_agreement(p, op, local));
    if (p->mesh) DT_TRY(world_max(p, mx, n));
    p->inputs_nonfinite = 0;
    for (int i = 0; i < n; i++) p->inputs_nonfinite |= !isfinite(mx[i]);
    return check_range(p, op, mx, n);
}

dt_status attn_plan_nonfinite_outputs(const attn_plan *p, dt_tensor *const *out, int n) {
    if (!p->inputs_nonfinite || p->exact_nonfinite) return DT_SUCCESS;
    for (int i = 0; i < n; i++) {
        /* all bits set: a NaN in fp32, bf16 and fp16 alike */
        const size_t bytes = dt_tensor_local_bytes(out[i]);
        void *h = malloc(bytes ? bytes : 1);
        if (!h) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
        memset(h, 0xff, bytes);
        const dt_status st = dt_tensor_set_local(out[i], h, bytes);
        free(h);
        DT_TRY(st);
    }
    return DT_SUCCESS;
}

void attn_plan_segments(const attn_plan *p, int src, dt_attn_segment *qs, dt_attn_segment *ks) {
    if (p->parts > 1) {
        *qs = dt_attn_segment_of(p->order, p->S, p->parts, p->rank);
        *ks = dt_attn_segment_of(p->order, p->S, p->parts, src);
    } else {   /* one rank holds the sequence in order, whatever the order's name */
        *qs = *ks = (dt_attn_segment){0, 1, p->S, 0, 0};
    }
}

size_t attn_docs_bytes(const attn_plan *p) {
    if (!p->doc_lens) return 0;
    return attn_align((size_t)((p->docs_per_row ? p->b : 1) * p->S) * 2 * sizeof(int64_t));
}

dt_status attn_docs_make(const attn_plan *p, const dt_tensor *q, void *dev, attn_docs *d) {
    memset(d, 0, sizeof *d);
    if (!p->doc_lens) return DT_SUCCESS;
    const int64_t rows = p->docs_per_row ? p->b : 1, S = p->S;
    const size_t bytes = (size_t)(rows * S) * 2 * sizeof(int64_t);
    int64_t *host = malloc(bytes ? bytes : 1), *g = malloc((size_t)(p->b ? p->b : 1) * sizeof *g);
    dt_status st = host && g ? DT_SUCCESS
                             : dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: out of host memory for "
                                        "%zu bytes of document bounds", dt_context_rank(p->ctx),
                                        bytes);
    /* local batch entry i is global row g[i] */
    if (st == DT_SUCCESS) {
        if (p->mesh) st = dt_tensor_global_indices(q, 0, g);
        else
            for (int64_t i = 0; i < p->b; i++) g[i] = i;
    }
    for (int64_t i = 0; st == DT_SUCCESS && i < rows; i++)
        dt_docs_bounds(p->doc_lens, p->doc_count, S, g[i], host + i * 2 * S);
    if (st == DT_SUCCESS) st = p->ctx->backend->ops->upload(p->ctx->backend, dev, host, bytes);
    free(g);
    if (st != DT_SUCCESS) {
        free(host);
        return st;
    }
    *d = (attn_docs){.host = host, .dev = dev, .rows = rows,
                     .batch_stride = p->docs_per_row ? 2 * S : 0};
    return DT_SUCCESS;
}

void attn_docs_free(attn_docs *d) {
    free(d->host);
    memset(d, 0, sizeof *d);
}

dt_attn_rule attn_plan_rule(const attn_plan *p, const attn_docs *d, int64_t b) {
    return (dt_attn_rule){p->mask, p->window, d->host ? d->host + b * d->batch_stride : NULL};
}

int attn_plan_block_live(const attn_plan *p, const attn_docs *d, dt_attn_segment qs,
                         dt_attn_segment ks) {
    for (int64_t b = 0; b < (d->host ? d->rows : 1); b++)
        if (dt_attn_has_pairs(attn_plan_rule(p, d, b), qs, ks)) return 1;
    return 0;
}

/* Marks 0 .. 2P: the steps' (attn_timing_mark); 2P + 1: the call's start. */
dt_status attn_timing_begin(const attn_plan *p, const dt_attention_timing *timing) {
    if (!timing) return DT_SUCCESS;
    dt_backend *be = p->ctx->backend;
    DT_TRY(be->ops->marks_reserve(be, 2 * p->parts + 2));
    return be->ops->mark(be, 2 * p->parts + 1);
}

dt_status attn_timing_mark(const attn_plan *p, const dt_attention_timing *timing, int i) {
    if (!timing) return DT_SUCCESS;
    dt_backend *be = p->ctx->backend;
    return be->ops->mark(be, i);
}

dt_status attn_timing_end(const attn_plan *p, dt_attention_timing *timing) {
    if (!timing) return DT_SUCCESS;
    dt_backend *be = p->ctx->backend;
    timing->steps = p->parts;
    DT_TRY(be->ops->mark_ms(be, 2 * p->parts + 1, 0, &timing->before_ms));
    for (int t = 0; t < p->parts; t++) {
        DT_TRY(be->ops->mark_ms(be, 2 * t, 2 * t + 1, &timing->blocks_ms[t]));
        DT_TRY(be->ops->mark_ms(be, 2 * t + 1, 2 * t + 2, &timing->wait_ms[t]));
    }
    return DT_SUCCESS;
}
