/* dtensor/primitives.c — shard, gather, redistribute, replicate, permute.
 *
 * One data-movement mechanism: every pack, unpack, slice and permutation is
 * a dt_select (below): a copy of src[idx_0[x_0], idx_1[x_1], ...] to
 * dst[idx'_0[x_0], ...] where each per-dim index table comes from the Layout
 * index maps (dt_order_global etc.) and a NULL table means the identity. A
 * dt_select becomes ONE dt_runs (backend copy_runs): trailing untouched dims
 * form the contiguous run, leading untouched dims the outer loop, and the
 * dims in between are flattened into host offset tables.
 *
 * Redistribution changes one mesh dim at a time, on that dim's communicator:
 *   Partial -> Replicate        all-reduce
 *   Partial -> Shard(d, o)      pack (rank r's chunk contiguous), reduce-scatter
 *   Shard(d, o) -> Replicate    all-gather, unpack chunk r by the order map
 *   Replicate -> Shard(d, o)    local slice
 *   Shard(d, o) -> Partial      zero padding (own indices kept)
 *   Replicate -> Partial        coordinate 0 keeps the data, others zero
 *   Shard(i, o1) -> Shard(j, o2) all-to-all: pack per destination along the
 *                               new dim, dt_comm_all_to_all (i == j: by
 *                               new owner, chunks of differing sizes by
 *                               grouped send/recv), unpack per source
 * A tensor dim may be sharded over several mesh dims, outer (lower) first.
 * A step on mesh dim m is direct when m is the innermost mesh dim of the
 * tensor dim it shards, before and after: the ranks of m's communicator then
 * share every other coordinate, so they hold one piece of that dim (the
 * outer mesh dims' cut) sharded over m alone, and the step is the
 * one-mesh-dim step above on that piece (its order lists over the piece's
 * length). An outer mesh dim's split cannot move while inner ones remain:
 * it changes which piece they cut.
 * The plan (dt_plan_*): between Layouts that shard no tensor dim twice, the
 * greedy one-mesh-dim plan: a direct step whenever its result still shards
 * no dim twice, else a differing Shard/Partial mesh dim to Replicate first.
 * Otherwise, the cheapest path of direct steps (elements sent, then passes
 * over the data) over the Layouts whose mesh dims hold their source, target
 * or Replicate placement: at most 27, and all-Replicate between the two
 * always gives one.
 *
 * Every public function validates all arguments before it allocates or
 * communicates (all ranks reject together), returns a new tensor and never
 * modifies its input. Test: tests/test_tensor.c.
 */
#include "primitives.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_internal.h"

/* ---------------------------------------------------------------------- */
/* The one copy mechanism                                                  */
/* ---------------------------------------------------------------------- */

typedef struct dt_select {
    int ndim;
    int64_t ext[DT_MAX_DIMS];             /* iteration extent per dim */
    int64_t src_shape[DT_MAX_DIMS];       /* row-major shapes of the buffers */
    int64_t dst_shape[DT_MAX_DIMS];
    const int64_t *src_idx[DT_MAX_DIMS];  /* NULL: identity */
    const int64_t *dst_idx[DT_MAX_DIMS];
} dt_select;

/* A selection over `ndim` dims that copies src (src_shape) to dst
 * (dst_shape), extents from `ext`; callers then set index tables. */
static void dt_select_init(dt_select *s, int ndim, const int64_t *src_shape,
                           const int64_t *dst_shape, const int64_t *ext) {
    memset(s, 0, sizeof *s);
    s->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        s->src_shape[d] = src_shape[d];
        s->dst_shape[d] = dst_shape[d];
        s->ext[d] = ext[d];
    }
}

static int dt_select_plain(const dt_select *s, int d) {
    return s->src_idx[d] == NULL && s->dst_idx[d] == NULL && s->ext[d] == s->src_shape[d] &&
           s->ext[d] == s->dst_shape[d];
}

static dt_status dt_select_copy(dt_backend *be, dt_dtype dtype, dt_runs_op op, void *dst,
                                const void *src, const dt_select *s) {
    int nd = s->ndim;
    int64_t sstride[DT_MAX_DIMS], dstride[DT_MAX_DIMS];
    int64_t a = 1, b = 1;
    for (int d = nd - 1; d >= 0; d--) {
        sstride[d] = a;
        dstride[d] = b;
        a *= s->src_shape[d];
        b *= s->dst_shape[d];
    }
    for (int d = 0; d < nd; d++)
        if (s->ext[d] == 0) return DT_SUCCESS;

    int hi = nd;
    int64_t run = 1;
    while (hi > 0 && dt_select_plain(s, hi - 1)) run *= s->ext[--hi];
    int lo = 0;
    int64_t outer = 1;
    while (lo < hi && dt_select_plain(s, lo)) outer *= s->ext[lo++];
    int64_t n = 1;
    for (int d = lo; d < hi; d++) n *= s->ext[d];

    int64_t *soff = malloc((size_t)n * sizeof *soff);
    int64_t *doff = malloc((size_t)n * sizeof *doff);
    dt_status st = DT_SUCCESS;
    if (soff == NULL || doff == NULL) {
        st = dt_error(DT_ERR_OUT_OF_MEMORY, "copy tables: out of host memory for %" PRId64
                      " offsets", n);
        goto out;
    }
    int64_t x[DT_MAX_DIMS] = { 0 };
    for (int64_t i = 0; i < n; i++) {
        int64_t so = 0, dof = 0;
        for (int d = lo; d < hi; d++) {
            so += (s->src_idx[d] ? s->src_idx[d][x[d]] : x[d]) * sstride[d];
            dof += (s->dst_idx[d] ? s->dst_idx[d][x[d]] : x[d]) * dstride[d];
        }
        soff[i] = so;
        doff[i] = dof;
        for (int d = hi - 1; d >= lo; d--) { /* odometer, last dim fastest */
            if (++x[d] < s->ext[d]) break;
            x[d] = 0;
        }
    }
    dt_runs r = {
        .dtype = dtype, .op = op, .dst = dst, .src = src,
        .outer = outer, .n = n, .run_elems = run,
        .dst_outer = lo > 0 ? dstride[lo - 1] : 0,
        .src_outer = lo > 0 ? sstride[lo - 1] : 0,
        .dst_off = doff, .src_off = soff,
    };
    st = be->ops->copy_runs(be, &r);
out:
    free(soff);
    free(doff);
    return st;
}

/* ---------------------------------------------------------------------- */
/* Small helpers                                                           */
/* ---------------------------------------------------------------------- */

static int64_t dt_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

static void *dt_byte_offset(void *p, int64_t elems, size_t es) {
    return (char *)p + (size_t)elems * es;
}

static dt_status dt_host_alloc(const char *op, size_t bytes, void **out) {
    *out = malloc(bytes > 0 ? bytes : 1);
    if (*out == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu bytes", op, bytes);
    return DT_SUCCESS;
}

/* Scratch in the backend's memory, not zeroed: every caller writes all it
 * reads of it (dt_shard_impl's send buffer, which must start zeroed, asks
 * the backend's zeroing alloc itself). */
static dt_status dt_dev_alloc(dt_backend *be, size_t bytes, void **out) {
    return be->ops->alloc_uninit(be, bytes, out);
}

static void dt_dev_free(dt_backend *be, void *p) {
    if (p != NULL) be->ops->free(be, p);
}

/* Index lists of every rank for one order: flat[r*cnt + x] = global index of
 * local x on rank r; offs[r] = r*cnt (offs has parts+1 entries). */
static dt_status dt_order_lists(const char *op, dt_order order, int64_t n, int parts,
                                int64_t **flat, int64_t **offs) {
    int64_t cnt = n / parts;
    *flat = NULL;
    *offs = NULL;
    dt_status st = dt_host_alloc(op, (size_t)n * sizeof(int64_t), (void **)flat);
    if (st == DT_SUCCESS)
        st = dt_host_alloc(op, (size_t)(parts + 1) * sizeof(int64_t), (void **)offs);
    if (st != DT_SUCCESS) {
        free(*flat);
        *flat = NULL;
        return st;
    }
    for (int r = 0; r <= parts; r++) (*offs)[r] = r * cnt;
    for (int r = 0; r < parts; r++)
        for (int64_t x = 0; x < cnt; x++) (*flat)[r * cnt + x] = dt_order_global(order, n, parts, r, x);
    return DT_SUCCESS;
}

/* Pack: chunk s (shape L with [dim] = offs[s+1]-offs[s]) of buf, laid out one
 * after the other, takes src[..., flat[offs[s] + k], ...] along dim. */
static dt_status dt_pack_chunks(dt_backend *be, dt_dtype dtype, int ndim, const void *src,
                                const int64_t *L, int dim, const int64_t *flat,
                                const int64_t *offs, int parts, void *buf) {
    size_t es = dt_dtype_size(dtype);
    int64_t base = 0;
    for (int s = 0; s < parts; s++) {
        int64_t chunk[DT_MAX_DIMS];
        for (int d = 0; d < ndim; d++) chunk[d] = L[d];
        chunk[dim] = offs[s + 1] - offs[s];
        dt_select sel;
        dt_select_init(&sel, ndim, L, chunk, chunk);
        sel.src_idx[dim] = flat + offs[s];
        DT_TRY(dt_select_copy(be, dtype, DT_RUNS_COPY, dt_byte_offset(buf, base, es), src, &sel));
        base += dt_numel(ndim, chunk);
    }
    return DT_SUCCESS;
}

/* Unpack, the inverse: chunk r of buf (shape L2 with [dim] = offs[r+1]-offs[r])
 * goes to dst[..., flat[offs[r] + k], ...] along dim. */
static dt_status dt_unpack_chunks(dt_backend *be, dt_dtype dtype, int ndim, const void *buf,
                                  void *dst, const int64_t *L2, int dim, const int64_t *flat,
                                  const int64_t *offs, int parts) {
    size_t es = dt_dtype_size(dtype);
    int64_t base = 0;
    for (int r = 0; r < parts; r++) {
        int64_t chunk[DT_MAX_DIMS];
        for (int d = 0; d < ndim; d++) chunk[d] = L2[d];
        chunk[dim] = offs[r + 1] - offs[r];
        dt_select sel;
        dt_select_init(&sel, ndim, chunk, L2, chunk);
        sel.dst_idx[dim] = flat + offs[r];
        DT_TRY(dt_select_copy(be, dtype, DT_RUNS_COPY, dst,
                              dt_byte_offset((void *)(uintptr_t)buf, base, es), &sel));
        base += dt_numel(ndim, chunk);
    }
    return DT_SUCCESS;
}

/* Coordinates of world rank w on the mesh (row-major, last mesh dim fastest). */
static void dt_mesh_coords_of(const dt_mesh *mesh, int w, int *coords) {
    int nd = dt_mesh_ndim(mesh);
    const int *sizes = dt_mesh_sizes(mesh);
    for (int m = nd - 1; m >= 0; m--) {
        coords[m] = w % sizes[m];
        w /= sizes[m];
    }
}

/* For the rank at `coords`: global indices of its local rows along every
 * dim sharded by `lay` (through every mesh dim that shards it, composed:
 * dt_layout_global_index), written into `tables` (room for the sum of the
 * local extents L) and pointed to by idx[dim]; idx of unsharded dims is
 * NULL. The one place that maps a whole shard to global positions (shard
 * and gather). */
static void dt_global_tables(const dt_mesh *mesh, const dt_layout *lay, const int *coords,
                             int ndim, const int64_t *shape, const int64_t *L, int64_t *tables,
                             const int64_t **idx) {
    const int *sizes = dt_mesh_sizes(mesh);
    for (int d = 0; d < DT_MAX_DIMS; d++) idx[d] = NULL;
    for (int d = 0; d < ndim; d++) {
        if (dt_layout_shard_dims(lay, d, NULL) == 0) continue;
        for (int64_t x = 0; x < L[d]; x++)
            tables[x] = dt_layout_global_index(lay, sizes, coords, d, shape[d], x);
        idx[d] = tables;
        tables += L[d];
    }
}

/* 1 if no tensor dim is sharded by two mesh dims (a one-mesh-dim Layout). */
static int dt_layout_legal(const dt_layout *l) {
    for (int a = 0; a < l->ndim; a++)
        for (int b = a + 1; b < l->ndim; b++)
            if (l->placements[a].kind == DT_SHARD && l->placements[b].kind == DT_SHARD &&
                l->placements[a].dim == l->placements[b].dim)
                return 0;
    return 1;
}

static dt_status dt_check_tensor_dtype(const char *op, const dt_tensor *t) {
    return dt_context_check_dtype(dt_tensor_context(t), op, dt_tensor_dtype(t));
}

/* Validates a Layout for tensor t's shape on `mesh`, naming the op. */
static dt_status dt_check_layout_for(const char *op, const dt_mesh *mesh, const dt_layout *layout,
                                     int ndim, const int64_t *shape) {
    DT_REQUIRE(layout != NULL, "%s: layout is NULL", op);
    DT_REQUIRE(layout->ndim == dt_mesh_ndim(mesh),
               "%s: layout has %d mesh dims but the mesh has %d", op, layout->ndim,
               dt_mesh_ndim(mesh));
    dt_status st = dt_layout_check(layout, ndim, shape, dt_mesh_sizes(mesh));
    if (st != DT_SUCCESS) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        return dt_error(st, "%s: %s", op, msg);
    }
    return DT_SUCCESS;
}

/* ---------------------------------------------------------------------- */
/* One redistribution step on mesh dim m                                   */
/* ---------------------------------------------------------------------- */

/* The all-to-all Shard(i, o1) -> Shard(j, o2) on mesh dim m. */
static dt_status dt_step_shard_to_shard(const dt_tensor *in, dt_tensor *out, int m) {
    dt_context *ctx = dt_tensor_context(in);
    dt_backend *be = ctx->backend;
    const dt_mesh *mesh = dt_tensor_mesh(in);
    dt_comm *comm = dt_mesh_comm(mesh, m);
    int P = dt_mesh_size(mesh, m), c = dt_mesh_coord(mesh, m);
    dt_placement from = dt_tensor_layout(in)->placements[m];
    dt_placement to = dt_tensor_layout(out)->placements[m];
    int nd = dt_tensor_ndim(in);
    const int64_t *L = dt_tensor_local_shape(in), *L2 = dt_tensor_local_shape(out);
    dt_dtype dtype = dt_tensor_dtype(in);
    size_t es = dt_dtype_size(dtype);
    const char *op = "dt_tensor_redistribute";

    dt_status st = DT_SUCCESS;
    int64_t *sflat = NULL, *soffs = NULL, *rflat = NULL, *roffs = NULL;
    void *sendbuf = NULL, *recvbuf = NULL;
    dt_p2p_op *ops = NULL;

    if (from.dim != to.dim) {
        /* Send to s the indices of the new dim j that s will own; receive from
         * r the indices of the old dim i that r owned (within the piece of j
         * the input holds whole on m, and the piece of i the output does). */
        DT_TRY_GOTO(st, dt_order_lists(op, to.order, L[to.dim], P, &sflat, &soffs), out);
        DT_TRY_GOTO(st, dt_order_lists(op, from.order, L2[from.dim], P, &rflat, &roffs), out);
    } else {
        /* Same dim, new order: element x goes to the new owner of its global
         * index, in increasing x; the receiver places it at its new local
         * index. Counts differ per pair, and both sides derive them. */
        int d = from.dim;
        int64_t n = L[d] * P, cnt = L[d];
        DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(cnt > 0 ? cnt : 1) * sizeof(int64_t),
                                      (void **)&sflat), out);
        DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(P + 1) * sizeof(int64_t), (void **)&soffs), out);
        DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(cnt > 0 ? cnt : 1) * sizeof(int64_t),
                                      (void **)&rflat), out);
        DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(P + 1) * sizeof(int64_t), (void **)&roffs), out);
        for (int s = 0; s <= P; s++) soffs[s] = 0;
        for (int64_t x = 0; x < cnt; x++) {
            int64_t g = dt_order_global(from.order, n, P, c, x);
            soffs[dt_order_owner(to.order, n, P, g) + 1]++;
        }
        for (int s = 0; s < P; s++) soffs[s + 1] += soffs[s];
        /* roffs doubles as the fill cursor of each destination; it is
         * rebuilt for the receive side just below. */
        for (int s = 0; s < P; s++) roffs[s] = soffs[s];
        for (int64_t x = 0; x < cnt; x++) {
            int64_t g = dt_order_global(from.order, n, P, c, x);
            sflat[roffs[dt_order_owner(to.order, n, P, g)]++] = x;
        }
        int64_t k = 0;
        for (int r = 0; r < P; r++) {
            roffs[r] = k;
            for (int64_t x = 0; x < cnt; x++) {
                int64_t g = dt_order_global(from.order, n, P, r, x);
                if (dt_order_owner(to.order, n, P, g) == c) rflat[k++] = dt_order_local(to.order, n, P, g);
            }
        }
        roffs[P] = k;
    }

    DT_TRY_GOTO(st, dt_dev_alloc(be, dt_tensor_local_bytes(in), &sendbuf), out);
    DT_TRY_GOTO(st, dt_dev_alloc(be, dt_tensor_local_bytes(out), &recvbuf), out);
    DT_TRY_GOTO(st, dt_pack_chunks(be, dtype, nd, dt_tensor_data_const(in), L, to.dim, sflat, soffs,
                                   P, sendbuf), out);

    if (from.dim != to.dim) {   /* every rank's chunk for every other has one size */
        const size_t n = (size_t)dt_tensor_local_numel(in) / (size_t)P;
        if (n > 0) DT_TRY_GOTO(st, dt_comm_all_to_all(comm, sendbuf, recvbuf, n, dtype), out);
        DT_TRY_GOTO(st, dt_unpack_chunks(be, dtype, nd, recvbuf, dt_tensor_data(out), L2, from.dim,
                                         rflat, roffs, P), out);
        goto out;
    }
    DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(2 * P) * sizeof *ops, (void **)&ops), out);
    int nops = 0;
    int64_t sbase = 0, rbase = 0;
    for (int s = 0; s < P; s++) {
        int64_t chunk[DT_MAX_DIMS];
        for (int d = 0; d < nd; d++) chunk[d] = L[d];
        chunk[to.dim] = soffs[s + 1] - soffs[s];
        int64_t cn = dt_numel(nd, chunk);
        if (cn > 0)
            ops[nops++] = (dt_p2p_op){ DT_P2P_SEND, s, dt_byte_offset(sendbuf, sbase, es),
                                       (size_t)cn, dtype };
        sbase += cn;
    }
    for (int r = 0; r < P; r++) {
        int64_t chunk[DT_MAX_DIMS];
        for (int d = 0; d < nd; d++) chunk[d] = L2[d];
        chunk[from.dim] = roffs[r + 1] - roffs[r];
        int64_t cn = dt_numel(nd, chunk);
        if (cn > 0)
            ops[nops++] = (dt_p2p_op){ DT_P2P_RECV, r, dt_byte_offset(recvbuf, rbase, es),
                                       (size_t)cn, dtype };
        rbase += cn;
    }
    if (nops > 0) DT_TRY_GOTO(st, dt_comm_sendrecv(comm, ops, nops), out);
    DT_TRY_GOTO(st, dt_unpack_chunks(be, dtype, nd, recvbuf, dt_tensor_data(out), L2, from.dim,
                                     rflat, roffs, P), out);
out:
    free(ops);
    dt_dev_free(be, sendbuf);
    dt_dev_free(be, recvbuf);
    free(sflat);
    free(soffs);
    free(rflat);
    free(roffs);
    return st;
}

/* Applies the step that changes mesh dim m of in's Layout to `to` (one that
 * dt_plan_step_cost allows). Along a dim that m shards, before or after, the
 * ranks of m's communicator share every other coordinate, so between them
 * the dim is a one-mesh-dim shard of the piece the outer mesh dims leave:
 * its length is the dim's local length without m's split (L[d] where the
 * input holds it whole on m, L2[d] where the output does), and the order
 * lists below are over that piece. */
static dt_status dt_redistribute_step(const dt_tensor *in, int m, dt_placement to,
                                      dt_tensor **out) {
    dt_context *ctx = dt_tensor_context(in);
    dt_backend *be = ctx->backend;
    const dt_mesh *mesh = dt_tensor_mesh(in);
    dt_comm *comm = dt_mesh_comm(mesh, m);
    int P = dt_mesh_size(mesh, m), c = dt_mesh_coord(mesh, m);
    dt_layout lay = *dt_tensor_layout(in);
    dt_placement from = lay.placements[m];
    lay.placements[m] = to;
    int nd = dt_tensor_ndim(in);
    const int64_t *shape = dt_tensor_shape(in);
    dt_dtype dtype = dt_tensor_dtype(in);
    size_t es = dt_dtype_size(dtype);
    const char *op = "dt_tensor_redistribute";

    /* On one rank, or between equal placements, the local data stays as it
     * is: the output shares the input's buffer. */
    if (P == 1 || (from.kind == to.kind && (to.kind != DT_SHARD || (from.dim == to.dim &&
                                                                    from.order == to.order))))
        return dt_tensor_view(in, nd, shape, &lay, out);

    dt_tensor *o = NULL;
    void *tmp = NULL;
    int64_t *flat = NULL, *offs = NULL;
    dt_status st = DT_SUCCESS;
    /* Every step writes all of its output but those to Partial, where the
     * summands away from this rank's part (or coordinate) stay zero. */
    if (to.kind == DT_PARTIAL && from.kind != DT_PARTIAL)
        DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, dtype, nd, shape, &lay, &o), fail);
    else
        DT_TRY_GOTO(st, dt_tensor_create_uninit(ctx, mesh, dtype, nd, shape, &lay, &o), fail);
    const int64_t *L = dt_tensor_local_shape(in), *L2 = dt_tensor_local_shape(o);
    const void *src = dt_tensor_data_const(in);
    void *dst = dt_tensor_data(o);
    int64_t numel = dt_tensor_local_numel(in), numel2 = dt_tensor_local_numel(o);

    if (from.kind == DT_PARTIAL && to.kind == DT_REPLICATE) {
        DT_TRY_GOTO(st, dt_comm_all_reduce(comm, src, dst, (size_t)numel, dtype, DT_REDUCE_SUM),
                    fail);
    } else if (from.kind == DT_PARTIAL && to.kind == DT_SHARD) {
        DT_TRY_GOTO(st, dt_order_lists(op, to.order, L[to.dim], P, &flat, &offs), fail);
        DT_TRY_GOTO(st, dt_dev_alloc(be, (size_t)numel * es, &tmp), fail);
        DT_TRY_GOTO(st, dt_pack_chunks(be, dtype, nd, src, L, to.dim, flat, offs, P, tmp), fail);
        DT_TRY_GOTO(st, dt_comm_reduce_scatter(comm, tmp, dst, (size_t)numel2, dtype,
                                               DT_REDUCE_SUM), fail);
    } else if (from.kind == DT_SHARD && to.kind == DT_REPLICATE) {
        DT_TRY_GOTO(st, dt_order_lists(op, from.order, L2[from.dim], P, &flat, &offs), fail);
        DT_TRY_GOTO(st, dt_dev_alloc(be, (size_t)numel2 * es, &tmp), fail);
        DT_TRY_GOTO(st, dt_comm_all_gather(comm, src, tmp, (size_t)numel, dtype), fail);
        DT_TRY_GOTO(st, dt_unpack_chunks(be, dtype, nd, tmp, dst, L2, from.dim, flat, offs, P),
                    fail);
    } else if (from.kind == DT_REPLICATE && to.kind == DT_SHARD) {
        DT_TRY_GOTO(st, dt_order_lists(op, to.order, L[to.dim], P, &flat, &offs), fail);
        dt_select sel;
        dt_select_init(&sel, nd, L, L2, L2);
        sel.src_idx[to.dim] = flat + offs[c];
        DT_TRY_GOTO(st, dt_select_copy(be, dtype, DT_RUNS_COPY, dst, src, &sel), fail);
    } else if (from.kind == DT_SHARD && to.kind == DT_PARTIAL) {
        DT_TRY_GOTO(st, dt_order_lists(op, from.order, L2[from.dim], P, &flat, &offs), fail);
        dt_select sel;
        dt_select_init(&sel, nd, L, L2, L);
        sel.dst_idx[from.dim] = flat + offs[c];
        DT_TRY_GOTO(st, dt_select_copy(be, dtype, DT_RUNS_COPY, dst, src, &sel), fail);
    } else if (from.kind == DT_REPLICATE && to.kind == DT_PARTIAL) {
        if (c == 0) DT_TRY_GOTO(st, be->ops->copy(be, dst, src, dt_tensor_local_bytes(in)), fail);
    } else {
        DT_TRY_GOTO(st, dt_step_shard_to_shard(in, o, m), fail);
    }
    goto out;
fail:
    dt_tensor_destroy(o);
    o = NULL;
out:
    dt_dev_free(be, tmp);
    free(flat);
    free(offs);
    if (st == DT_SUCCESS) *out = o;
    return st;
}

/* ---------------------------------------------------------------------- */
/* Public primitives                                                       */
/* ---------------------------------------------------------------------- */

static dt_status dt_check_distributed(const char *op, const dt_tensor *t) {
    DT_REQUIRE(t != NULL, "%s: tensor is NULL", op);
    DT_REQUIRE(dt_tensor_mesh(t) != NULL,
               "%s: the tensor is local (no mesh); use dt_tensor_shard to place it on a mesh", op);
    return DT_SUCCESS;
}

/* The values every rank shows the others at the entry check of a collective
 * primitive (dt_context_check_call): the tensor's dtype, shape and Layout,
 * the target Layout (if any) and the root (if any). */
enum { DT_CALL_VALUES = 3 + DT_MAX_DIMS + 2 * DT_MAX_MESH_DIMS };

static const char *const dt_call_names[DT_CALL_VALUES] = {
    "dtype", "ndim", "root", "shape[0]", "shape[1]", "shape[2]", "shape[3]", "shape[4]",
    "shape[5]", "shape[6]", "shape[7]", "Layout mesh dim 0", "Layout mesh dim 1",
    "Layout mesh dim 2", "target Layout mesh dim 0", "target Layout mesh dim 1",
    "target Layout mesh dim 2",
};

static int64_t dt_placement_code(dt_placement p) {
    return p.kind == DT_SHARD ? 1000 + 100 * p.dim + p.order : p.kind;
}

/* Only read when the call's arguments passed this rank's checks. */
static void dt_call_values(const dt_tensor *t, const dt_layout *target, int root, int64_t *v) {
    memset(v, 0, DT_CALL_VALUES * sizeof *v);
    v[2] = root;
    if (t) {
        v[0] = dt_tensor_dtype(t);
        v[1] = dt_tensor_ndim(t);
        for (int d = 0; d < dt_tensor_ndim(t); d++) v[3 + d] = dt_tensor_shape(t)[d];
        const dt_layout *l = dt_tensor_layout(t);
        for (int m = 0; m < l->ndim; m++) v[3 + DT_MAX_DIMS + m] = dt_placement_code(l->placements[m]);
    }
    if (target)
        for (int m = 0; m < target->ndim; m++)
            v[3 + DT_MAX_DIMS + DT_MAX_MESH_DIMS + m] = dt_placement_code(target->placements[m]);
}

/* Local checks, then (with DT_CHECK) the cross-rank entry check. */
static dt_status dt_call_entry(dt_context *ctx, const char *op, dt_status local,
                               const dt_tensor *t, const dt_layout *target, int root) {
    int64_t v[DT_CALL_VALUES];
    dt_call_values(local == DT_SUCCESS ? t : NULL, local == DT_SUCCESS ? target : NULL, root, v);
    return dt_context_check_call(ctx, op, local, v, dt_call_names, DT_CALL_VALUES, DT_CHECK_AUTO);
}

static dt_status dt_redistribute_check(const dt_tensor *t, const dt_layout *layout,
                                       dt_tensor **out) {
    const char *op = "dt_tensor_redistribute";
    DT_TRY(dt_check_distributed(op, t));
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    DT_TRY(dt_check_layout_for(op, dt_tensor_mesh(t), layout, dt_tensor_ndim(t),
                               dt_tensor_shape(t)));
    return dt_check_tensor_dtype(op, t);
}

/* ---------------------------------------------------------------------- */
/* The plan: which mesh dim changes to what, in which order                */
/* ---------------------------------------------------------------------- */

typedef struct dt_plan_step {
    int m;            /* the mesh dim that changes */
    dt_placement to;  /* its new placement */
} dt_plan_step;

/* Sizes of the search below: 3 placements per mesh dim (source, target,
 * Replicate), so at most 27 Layouts, and a path visits each at most once. */
enum { DT_PLAN_CHOICES = 3, DT_PLAN_STATES = 27, DT_PLAN_MAX_STEPS = DT_PLAN_STATES };

/* Local element count under l; *divides: 0 if some split length does not
 * divide (dt_layout_check's test without a message, for intermediates). */
static int64_t dt_plan_numel(const dt_layout *l, int ndim, const int64_t *shape, const int *sizes,
                             int *divides) {
    int64_t left[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) left[d] = shape[d];
    *divides = 1;
    for (int m = 0; m < l->ndim; m++) {
        dt_placement p = l->placements[m];
        if (p.kind != DT_SHARD) continue;
        int64_t div = p.order == DT_ORDER_ZIGZAG ? 2 * (int64_t)sizes[m] : sizes[m];
        if (left[p.dim] % div != 0) *divides = 0;
        left[p.dim] /= sizes[m];
    }
    return dt_numel(ndim, left);
}

/* 1 if no mesh dim after m shards tensor dim d under l. */
static int dt_plan_innermost(const dt_layout *l, int m, int d) {
    for (int k = m + 1; k < l->ndim; k++)
        if (l->placements[k].kind == DT_SHARD && l->placements[k].dim == d) return 0;
    return 1;
}

/* The cost of the step that changes mesh dim m of cl to `to`, or -1 if
 * dt_redistribute_step cannot make it: the result must divide, and m must be
 * the innermost mesh dim of the tensor dim it shards before and of the one
 * it shards after (then m's communicator sees a one-mesh-dim shard; an
 * outer mesh dim's split changes what the inner ones hold, so it moves only
 * once they are gone). The cost is the elements a rank sends or reduces
 * ((P-1)/P of the data, twice for an all-reduce) weighted 64, plus a pass
 * over its input and output and 1 for the step. */
static int64_t dt_plan_step_cost(const dt_layout *cl, int m, dt_placement to, int ndim,
                                 const int64_t *shape, const int *sizes) {
    dt_placement from = cl->placements[m];
    dt_layout cand = *cl;
    cand.placements[m] = to;
    if (from.kind == DT_SHARD && !dt_plan_innermost(cl, m, from.dim)) return -1;
    if (to.kind == DT_SHARD && !dt_plan_innermost(&cand, m, to.dim)) return -1;
    int ok_in, ok_out;
    int64_t n_in = dt_plan_numel(cl, ndim, shape, sizes, &ok_in);
    int64_t n_out = dt_plan_numel(&cand, ndim, shape, sizes, &ok_out);
    if (!ok_out) return -1;
    int64_t moved = 0;
    if (from.kind == DT_PARTIAL && to.kind == DT_REPLICATE) moved = 2 * n_in;
    else if (from.kind == DT_PARTIAL && to.kind == DT_SHARD) moved = n_in;
    else if (from.kind == DT_SHARD && to.kind == DT_REPLICATE) moved = n_out;
    else if (from.kind == DT_SHARD && to.kind == DT_SHARD) moved = n_in;
    int P = sizes[m];
    return 64 * (moved / P * (P - 1)) + n_in + n_out + 1;
}

/* One-mesh-dim Layouts (neither shards a tensor dim over two mesh dims):
 * change the first mesh dim whose target placement keeps that so; if none,
 * turn the first differing Shard/Partial mesh dim into Replicate. Direct
 * steps only ever fix mesh dims, and once every differing mesh dim is
 * Replicate a direct step is always legal, so this ends within
 * nd * (nd + 2) steps. Returns the number of steps. */
static int dt_plan_greedy(const dt_layout *src, const dt_layout *target, dt_plan_step *steps) {
    dt_layout cl = *src;
    int nd = target->ndim, n = 0;
    for (int iter = 0; iter <= nd * (nd + 2) && n < DT_PLAN_MAX_STEPS; iter++) {
        if (dt_layout_equal(&cl, target)) break;
        int pick = -1;
        dt_placement to = dt_replicate();
        for (int m = 0; m < nd && pick < 0; m++) {
            if (dt_placement_equal(cl.placements[m], target->placements[m])) continue;
            dt_layout cand = cl;
            cand.placements[m] = target->placements[m];
            if (dt_layout_legal(&cand)) {
                pick = m;
                to = target->placements[m];
            }
        }
        for (int m = 0; m < nd && pick < 0; m++)
            if (!dt_placement_equal(cl.placements[m], target->placements[m]) &&
                cl.placements[m].kind != DT_REPLICATE)
                pick = m; /* to stays Replicate */
        if (pick < 0) return -1;
        steps[n++] = (dt_plan_step){ pick, to };
        cl.placements[pick] = to;
    }
    return dt_layout_equal(&cl, target) ? n : -1;
}

/* Layouts that shard a tensor dim over several mesh dims: the cheapest
 * path (dt_plan_step_cost; ties to the lower state, so every rank plans
 * alike) over the Layouts whose every mesh dim holds its source, target or
 * Replicate placement. One always exists: Replicate the mesh dims from the
 * last to the first (each then innermost), then place the target's from
 * the first to the last (each then innermost, and a prefix of a valid
 * chain divides). Returns the number of steps, -1 if none was found. */
static int dt_plan_search(const dt_layout *src, const dt_layout *target, int ndim,
                          const int64_t *shape, const int *sizes, dt_plan_step *steps) {
    const int nm = src->ndim;
    dt_placement choice[DT_MAX_MESH_DIMS][DT_PLAN_CHOICES];
    int nc[DT_MAX_MESH_DIMS], stride[DT_MAX_MESH_DIMS], goal = 0, nstates = 1;
    for (int m = 0; m < nm; m++) {
        dt_placement cand[3] = { src->placements[m], target->placements[m], dt_replicate() };
        nc[m] = 0;
        for (int k = 0; k < 3; k++) {
            int seen = 0;
            for (int j = 0; j < nc[m]; j++) seen |= dt_placement_equal(choice[m][j], cand[k]);
            if (!seen) choice[m][nc[m]++] = cand[k];
        }
        stride[m] = nstates;
        nstates *= nc[m];
        for (int j = 0; j < nc[m]; j++)
            if (dt_placement_equal(choice[m][j], target->placements[m])) goal += j * stride[m];
    }
    int64_t dist[DT_PLAN_STATES];
    int prev[DT_PLAN_STATES], prev_m[DT_PLAN_STATES], done[DT_PLAN_STATES];
    for (int k = 0; k < nstates; k++) dist[k] = -1, prev[k] = -1, prev_m[k] = -1, done[k] = 0;
    dist[0] = 0; /* state 0: every mesh dim at its source placement */
    for (;;) {
        int u = -1;
        for (int k = 0; k < nstates; k++)
            if (!done[k] && dist[k] >= 0 && (u < 0 || dist[k] < dist[u])) u = k;
        if (u < 0 || u == goal) break;
        done[u] = 1;
        dt_layout cl = *src;
        int digit[DT_MAX_MESH_DIMS];
        for (int m = 0; m < nm; m++) {
            digit[m] = (u / stride[m]) % nc[m];
            cl.placements[m] = choice[m][digit[m]];
        }
        for (int m = 0; m < nm; m++)
            for (int j = 0; j < nc[m]; j++) {
                if (j == digit[m]) continue;
                int64_t c = dt_plan_step_cost(&cl, m, choice[m][j], ndim, shape, sizes);
                int v = u + (j - digit[m]) * stride[m];
                if (c < 0 || done[v] || (dist[v] >= 0 && dist[v] <= dist[u] + c)) continue;
                dist[v] = dist[u] + c;
                prev[v] = u;
                prev_m[v] = m;
            }
    }
    if (dist[goal] < 0) return -1;
    int n = 0;
    for (int v = goal; v != 0; v = prev[v]) n++;
    if (n > DT_PLAN_MAX_STEPS) return -1;
    int k = n;
    for (int v = goal; v != 0; v = prev[v]) {
        int m = prev_m[v];
        steps[--k] = (dt_plan_step){ m, choice[m][(v / stride[m]) % nc[m]] };
    }
    return n;
}

/* The steps from t's Layout to `layout` (*target: layout normalised), or
 * DT_ERR_INTERNAL. */
static dt_status dt_redistribute_plan(const char *op, const dt_tensor *t, const dt_layout *layout,
                                      dt_layout *target, dt_plan_step *steps, int *nsteps) {
    *target = *layout;
    for (int m = 0; m < target->ndim; m++)
        if (target->placements[m].kind != DT_SHARD) target->placements[m] = (dt_placement){
                target->placements[m].kind, 0, DT_ORDER_CONTIGUOUS };
    const dt_layout *src = dt_tensor_layout(t);
    *nsteps = dt_layout_legal(src) && dt_layout_legal(target)
                  ? dt_plan_greedy(src, target, steps)
                  : dt_plan_search(src, target, dt_tensor_ndim(t), dt_tensor_shape(t),
                                   dt_mesh_sizes(dt_tensor_mesh(t)), steps);
    if (*nsteps < 0) return dt_error(DT_ERR_INTERNAL, "%s: no plan found (please report)", op);
    return DT_SUCCESS;
}

/* Arguments checked by dt_redistribute_check. */
static dt_status dt_redistribute_impl(const dt_tensor *t, const dt_layout *layout,
                                      dt_tensor **out) {
    const char *op = "dt_tensor_redistribute";
    dt_layout target;
    dt_plan_step steps[DT_PLAN_MAX_STEPS];
    int nsteps;
    DT_TRY(dt_redistribute_plan(op, t, layout, &target, steps, &nsteps));

    dt_status st = DT_SUCCESS;
    dt_tensor *owned = NULL;
    const dt_tensor *cur = t;
    for (int k = 0; k < nsteps; k++) {
        dt_tensor *next = NULL;
        DT_TRY_GOTO(st, dt_redistribute_step(cur, steps[k].m, steps[k].to, &next), fail);
        dt_tensor_destroy(owned);
        owned = next;
        cur = next;
    }
    if (!dt_layout_equal(dt_tensor_layout(cur), &target)) {
        st = dt_error(DT_ERR_INTERNAL, "%s: the plan did not converge (please report)", op);
        goto fail;
    }
    if (owned == NULL)   /* already in the target Layout: t's buffer, shared */
        DT_TRY_GOTO(st, dt_tensor_view(t, dt_tensor_ndim(t), dt_tensor_shape(t), &target, &owned),
                    fail);
    *out = owned;
    return DT_SUCCESS;
fail:
    dt_tensor_destroy(owned);
    return st;
}

dt_status dt_tensor_redistribute(const dt_tensor *t, const dt_layout *layout, dt_tensor **out) {
    dt_context *ctx = dt_tensor_context(t);
    dt_status st = dt_call_entry(ctx, "dt_tensor_redistribute", dt_redistribute_check(t, layout, out),
                                 t, layout, 0);
    if (st == DT_SUCCESS) st = dt_redistribute_impl(t, layout, out);
    return dt_context_note(ctx, st);
}

dt_status dt_tensor_replicate(const dt_tensor *t, dt_tensor **out) {
    dt_status st = dt_check_distributed("dt_tensor_replicate", t);
    if (st != DT_SUCCESS)   /* the others learn of it at their redistribute's check */
        return dt_context_note(dt_tensor_context(t), dt_call_entry(dt_tensor_context(t),
                               "dt_tensor_replicate", st, NULL, NULL, 0));
    dt_layout rep = dt_layout_replicated(dt_mesh_ndim(dt_tensor_mesh(t)));
    return dt_tensor_redistribute(t, &rep, out);
}

/* ---------------------------------------------------------------------- */
/* Several redistributions at once: all-reduces in buckets                 */
/* ---------------------------------------------------------------------- */

/* The most bytes one bucket's all-reduce carries (a tensor larger than this
 * is a bucket of its own). */
#define DT_BUCKET_BYTES ((size_t)32 << 20)

/* A redistribution whose plan is only Partial -> Replicate steps: *dims
 * (ascending plan order) gets the mesh dims of more than one rank it
 * all-reduces over, *ndims their count (0: the data stays as it is).
 * Returns 0 for any other plan. */
static int dt_sums_only(const dt_tensor *t, const dt_plan_step *steps, int nsteps, int *dims,
                        int *ndims) {
    const dt_layout *l = dt_tensor_layout(t);
    *ndims = 0;
    for (int k = 0; k < nsteps; k++) {
        const int m = steps[k].m;
        if (l->placements[m].kind != DT_PARTIAL || steps[k].to.kind != DT_REPLICATE) return 0;
        for (int j = 0; j < k; j++)
            if (steps[j].m == m) return 0;
        if (dt_mesh_size(dt_tensor_mesh(t), m) > 1) dims[(*ndims)++] = m;
    }
    return 1;
}

/* The tensors idx[0..n) (one dtype, the same mesh dims to sum over, in one
 * order) summed in one buffer: packed, one in-place all-reduce per mesh
 * dim, unpacked into new tensors of their target Layouts. */
static dt_status dt_bucket_run(const dt_tensor *const *ts, const dt_layout *targets,
                               const int *idx, int n, const int *dims, int ndims,
                               dt_tensor **outs) {
    dt_context *ctx = dt_tensor_context(ts[idx[0]]);
    dt_backend *be = ctx->backend;
    const dt_mesh *mesh = dt_tensor_mesh(ts[idx[0]]);
    const dt_dtype dtype = dt_tensor_dtype(ts[idx[0]]);
    size_t bytes = 0;
    for (int j = 0; j < n; j++) bytes += dt_tensor_local_bytes(ts[idx[j]]);
    void *flat = NULL;
    dt_status st = dt_dev_alloc(be, bytes ? bytes : 1, &flat);
    size_t off = 0;
    for (int j = 0; j < n && st == DT_SUCCESS; j++) {
        const size_t b = dt_tensor_local_bytes(ts[idx[j]]);
        st = be->ops->copy(be, (char *)flat + off, dt_tensor_data_const(ts[idx[j]]), b);
        off += b;
    }
    const size_t count = bytes / dt_dtype_size(dtype);
    for (int k = 0; k < ndims && st == DT_SUCCESS; k++)
        st = dt_comm_all_reduce(dt_mesh_comm(mesh, dims[k]), flat, flat, count, dtype,
                                DT_REDUCE_SUM);
    off = 0;
    for (int j = 0; j < n && st == DT_SUCCESS; j++) {
        const dt_tensor *t = ts[idx[j]];
        const size_t b = dt_tensor_local_bytes(t);
        st = dt_tensor_create_uninit(ctx, mesh, dtype, dt_tensor_ndim(t), dt_tensor_shape(t),
                                     &targets[idx[j]], &outs[idx[j]]);
        if (st == DT_SUCCESS) st = be->ops->copy(be, dt_tensor_data(outs[idx[j]]), (char *)flat + off, b);
        off += b;
    }
    if (flat) dt_dev_free(be, flat);
    return st;
}

/* The entry check's values of n redistributions: n and a hash of every
 * tensor's and target's description (dt_call_values). */
static void dt_call_values_n(const dt_tensor *const *ts, const dt_layout *layouts, int n,
                             int ok, int64_t *v) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a over the values */
    for (int i = 0; ok && i < n; i++) {
        int64_t w[DT_CALL_VALUES];
        dt_call_values(ts[i], &layouts[i], 0, w);
        for (int k = 0; k < DT_CALL_VALUES; k++) h = (h ^ (uint64_t)w[k]) * 1099511628211ull;
    }
    v[0] = ok ? n : -1;
    v[1] = (int64_t)(h >> 1);
}

static dt_status dt_redistribute_n_impl(const dt_tensor *const *ts, const dt_layout *layouts,
                                        int n, dt_tensor **outs) {
    const char *op = "dt_tensor_redistribute_n";
    dt_layout *targets = malloc((size_t)n * sizeof *targets);
    dt_tensor **made = calloc((size_t)n, sizeof *made);
    /* key[i]: -2 redistributed alone, -1 a view, else the first tensor of
     * its bucket kind (dtype and the mesh dims summed over, dims[i][0..nd[i])) */
    int *key = malloc((size_t)n * (3 + DT_MAX_MESH_DIMS) * sizeof *key);
    if (!targets || !made || !key) {
        free(targets), free(made), free(key);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    }
    int *idx = key + n, *nd = idx + n;
    int(*dims)[DT_MAX_MESH_DIMS] = (int(*)[DT_MAX_MESH_DIMS])(nd + n);
    dt_status st = DT_SUCCESS;
    for (int i = 0; i < n && st == DT_SUCCESS; i++) {
        dt_plan_step steps[DT_PLAN_MAX_STEPS];
        int nsteps;
        st = dt_redistribute_plan(op, ts[i], &layouts[i], &targets[i], steps, &nsteps);
        if (st != DT_SUCCESS) break;
        key[i] = -2;
        if (!dt_sums_only(ts[i], steps, nsteps, dims[i], &nd[i])) continue;
        key[i] = nd[i] == 0 ? -1 : i;
        for (int j = 0; j < i && key[i] == i; j++)
            if (key[j] == j && nd[j] == nd[i] && dt_tensor_dtype(ts[j]) == dt_tensor_dtype(ts[i]) &&
                !memcmp(dims[j], dims[i], (size_t)nd[i] * sizeof **dims))
                key[i] = j;
    }
    /* every rank runs the same calls in the same order: the others one by
     * one, then each kind's buckets, in index order */
    for (int i = 0; i < n && st == DT_SUCCESS; i++) {
        if (key[i] == -2) st = dt_redistribute_impl(ts[i], &layouts[i], &made[i]);
        else if (key[i] == -1)
            st = dt_tensor_view(ts[i], dt_tensor_ndim(ts[i]), dt_tensor_shape(ts[i]), &targets[i],
                                &made[i]);
    }
    for (int first = 0; first < n && st == DT_SUCCESS; first++) {
        if (key[first] != first) continue;
        int m = 0;
        size_t bytes = 0;
        for (int i = first; i < n && st == DT_SUCCESS; i++) {
            if (key[i] != first) continue;
            const size_t b = dt_tensor_local_bytes(ts[i]);
            if (m > 0 && bytes + b > DT_BUCKET_BYTES) {
                st = dt_bucket_run(ts, targets, idx, m, dims[first], nd[first], made);
                m = 0, bytes = 0;
            }
            idx[m++] = i, bytes += b;
        }
        if (st == DT_SUCCESS && m > 0)
            st = dt_bucket_run(ts, targets, idx, m, dims[first], nd[first], made);
    }
    for (int i = 0; i < n; i++) {
        if (st == DT_SUCCESS) outs[i] = made[i];
        else dt_tensor_destroy(made[i]);
    }
    free(key);
    free(made);
    free(targets);
    return st;
}

dt_status dt_tensor_redistribute_n(const dt_tensor *const *ts, const dt_layout *layouts, int n,
                                   dt_tensor **outs) {
    const char *op = "dt_tensor_redistribute_n";
    dt_context *ctx = ts && n > 0 && ts[0] ? dt_tensor_context(ts[0]) : NULL;
    dt_status local = DT_SUCCESS;
    if (!ts || !layouts || !outs || n < 1)
        local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: ts, layouts and outs must not be NULL, "
                         "n (%d) >= 1", op, n);
    for (int i = 0; local == DT_SUCCESS && i < n; i++) {
        local = dt_redistribute_check(ts[i], &layouts[i], &outs[i]);
        if (local == DT_SUCCESS && (dt_tensor_context(ts[i]) != ctx ||
                                    dt_tensor_mesh(ts[i]) != dt_tensor_mesh(ts[0])))
            local = dt_error(DT_ERR_INVALID_ARGUMENT, "%s: tensor %d is on another context or "
                             "mesh than tensor 0", op, i);
    }
    int64_t v[2];
    static const char *const names[2] = {"n", "tensors and Layouts (hash)"};
    dt_call_values_n(ts, layouts, n, local == DT_SUCCESS, v);
    dt_status st = dt_context_check_call(ctx, op, local, v, names, 2, DT_CHECK_AUTO);
    if (st == DT_SUCCESS) st = dt_redistribute_n_impl(ts, layouts, n, outs);
    return dt_context_note(ctx, st);
}

/* Root's header for dt_tensor_shard: ok flag, dtype, ndim, shape as lo/hi
 * 32-bit halves. Sent as fp32 elements: broadcast moves bits, no arithmetic. */
enum { DT_SHARD_HDR = 3 + 2 * DT_MAX_DIMS };

/* What every rank can check alone; root's `full` is checked by root, which
 * tells the others (below). */
static dt_status dt_shard_check(const dt_mesh *mesh, int root, const dt_layout *layout,
                                dt_tensor **out) {
    const char *op = "dt_tensor_shard";
    DT_REQUIRE(mesh != NULL, "%s: mesh is NULL", op);
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    DT_REQUIRE(layout != NULL, "%s: layout is NULL", op);
    int wsize = dt_context_world_size(dt_mesh_context(mesh));
    DT_REQUIRE(root >= 0 && root < wsize, "%s: root %d is out of range [0, %d)", op, root, wsize);
    DT_REQUIRE(layout->ndim == dt_mesh_ndim(mesh),
               "%s: layout has %d mesh dims but the mesh has %d", op, layout->ndim,
               dt_mesh_ndim(mesh));
    return DT_SUCCESS;
}

/* Arguments checked by dt_shard_check. */
static dt_status dt_shard_impl(const dt_mesh *mesh, int root, const dt_tensor *full,
                               const dt_layout *layout, dt_tensor **out) {
    const char *op = "dt_tensor_shard";
    dt_context *ctx = dt_mesh_context(mesh);
    dt_comm *world = dt_context_comm(ctx);
    int wsize = dt_context_world_size(ctx), rank = dt_context_rank(ctx);
    dt_backend *be = ctx->backend;

    /* Root states whether `full` is usable, so that every rank fails together
     * (with root's status: hdr[1] when hdr[0] is 0) instead of leaving the
     * others waiting in the broadcast. */
    int32_t hdr[DT_SHARD_HDR];
    memset(hdr, 0, sizeof hdr);
    char why[512] = "";
    hdr[1] = DT_ERR_INVALID_ARGUMENT;
    if (rank == root) {
        if (full == NULL)
            snprintf(why, sizeof why, "full tensor is NULL on root %d", root);
        else if (dt_tensor_mesh(full) != NULL)
            snprintf(why, sizeof why, "full tensor on root %d must be local (mesh NULL)", root);
        else if (dt_tensor_context(full) != ctx)
            snprintf(why, sizeof why, "full tensor on root %d belongs to another context", root);
        else if ((hdr[1] = dt_context_check_dtype(ctx, "the full tensor",
                                                  dt_tensor_dtype(full))) != DT_SUCCESS)
            snprintf(why, sizeof why, "%s", dt_last_error());
        if (why[0] == '\0') {
            hdr[0] = 1;
            hdr[1] = (int32_t)dt_tensor_dtype(full);
            hdr[2] = dt_tensor_ndim(full);
            for (int d = 0; d < dt_tensor_ndim(full); d++) {
                uint64_t v = (uint64_t)dt_tensor_shape(full)[d];
                hdr[3 + 2 * d] = (int32_t)(uint32_t)(v & 0xffffffffu);
                hdr[4 + 2 * d] = (int32_t)(uint32_t)(v >> 32);
            }
        }
    }
    dt_status st = DT_SUCCESS;
    void *dhdr = NULL, *sendbuf = NULL;
    int64_t *tables = NULL;
    dt_p2p_op *ops = NULL;
    dt_tensor *o = NULL;
    DT_TRY_GOTO(st, dt_dev_alloc(be, sizeof hdr, &dhdr), out);
    DT_TRY_GOTO(st, be->ops->upload(be, dhdr, hdr, sizeof hdr), out);
    DT_TRY_GOTO(st, dt_comm_broadcast(world, dhdr, DT_SHARD_HDR, DT_F32, root), out);
    DT_TRY_GOTO(st, be->ops->download(be, hdr, dhdr, sizeof hdr), out);
    if (hdr[0] != 1) {
        dt_status reject = hdr[1] == DT_ERR_NOT_SUPPORTED ? DT_ERR_NOT_SUPPORTED
                                                          : DT_ERR_INVALID_ARGUMENT;
        if (rank == root)
            st = dt_error(reject, "%s: %s", op, why);
        else
            st = dt_error(reject, "%s: root %d rejected its full tensor%s", op, root,
                          reject == DT_ERR_NOT_SUPPORTED
                              ? ": its dtype is not supported on this backend" : "");
        goto out;
    }
    dt_dtype dtype = (dt_dtype)hdr[1];
    int nd = hdr[2];
    int64_t shape[DT_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        shape[d] = (int64_t)((uint64_t)(uint32_t)hdr[3 + 2 * d] |
                             ((uint64_t)(uint32_t)hdr[4 + 2 * d] << 32));
    DT_TRY_GOTO(st, dt_check_layout_for(op, mesh, layout, nd, shape), out);
    DT_TRY_GOTO(st, dt_tensor_create_uninit(ctx, mesh, dtype, nd, shape, layout, &o), out);

    size_t es = dt_dtype_size(dtype);
    int64_t numel = dt_tensor_local_numel(o);
    const int64_t *L = dt_tensor_local_shape(o);
    const dt_layout *lay = dt_tensor_layout(o);
    if (numel > 0) {
        int nops = 0;
        DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(wsize + 1) * sizeof *ops, (void **)&ops), out);
        if (rank == root) {
            int64_t tl = 0;
            for (int d = 0; d < nd; d++) tl += L[d];
            DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(tl > 0 ? tl : 1) * sizeof(int64_t),
                                          (void **)&tables), out);
            /* zeroed: a Partial summand's chunk away from coordinate 0 is sent as is */
            DT_TRY_GOTO(st, be->ops->alloc(be, (size_t)wsize * (size_t)numel * es, &sendbuf), out);
            for (int w = 0; w < wsize; w++) {
                int coords[DT_MAX_MESH_DIMS];
                dt_mesh_coords_of(mesh, w, coords);
                void *chunk = dt_byte_offset(sendbuf, (int64_t)w * numel, es);
                int zero = 0;
                for (int m = 0; m < lay->ndim; m++)
                    if (lay->placements[m].kind == DT_PARTIAL && coords[m] != 0) zero = 1;
                dt_select sel;
                dt_select_init(&sel, nd, shape, L, L);
                dt_global_tables(mesh, lay, coords, nd, shape, L, tables, sel.src_idx);
                if (!zero) /* a Partial summand away from coordinate 0 stays zero */
                    DT_TRY_GOTO(st, dt_select_copy(be, dtype, DT_RUNS_COPY, chunk,
                                                   dt_tensor_data_const(full), &sel), out);
                ops[nops++] = (dt_p2p_op){ DT_P2P_SEND, w, chunk, (size_t)numel, dtype };
            }
        }
        ops[nops++] = (dt_p2p_op){ DT_P2P_RECV, root, dt_tensor_data(o), (size_t)numel, dtype };
        DT_TRY_GOTO(st, dt_comm_sendrecv(world, ops, nops), out);
    }
out:
    dt_dev_free(be, dhdr);
    dt_dev_free(be, sendbuf);
    free(tables);
    free(ops);
    if (st == DT_SUCCESS)
        *out = o;
    else
        dt_tensor_destroy(o);
    return st;
}

dt_status dt_tensor_shard(const dt_mesh *mesh, int root, const dt_tensor *full,
                          const dt_layout *layout, dt_tensor **out) {
    dt_context *ctx = dt_mesh_context(mesh);
    dt_status st = dt_call_entry(ctx, "dt_tensor_shard", dt_shard_check(mesh, root, layout, out),
                                 NULL, layout, root);
    if (st == DT_SUCCESS) st = dt_shard_impl(mesh, root, full, layout, out);
    return dt_context_note(ctx, st);
}

static dt_status dt_gather_check(const dt_tensor *t, int root, dt_tensor **out) {
    const char *op = "dt_tensor_gather";
    DT_TRY(dt_check_distributed(op, t));
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    int wsize = dt_context_world_size(dt_tensor_context(t));
    DT_REQUIRE(root >= 0 && root < wsize, "%s: root %d is out of range [0, %d)", op, root, wsize);
    return dt_check_tensor_dtype(op, t);
}

/* Arguments checked by dt_gather_check. */
static dt_status dt_gather_impl(const dt_tensor *t, int root, dt_tensor **out) {
    const char *op = "dt_tensor_gather";
    dt_context *ctx = dt_tensor_context(t);
    int wsize = dt_context_world_size(ctx), rank = dt_context_rank(ctx);
    const dt_mesh *mesh = dt_tensor_mesh(t);
    dt_comm *world = dt_context_comm(ctx);
    dt_backend *be = ctx->backend;
    const dt_layout *lay = dt_tensor_layout(t);
    int nd = dt_tensor_ndim(t);
    const int64_t *shape = dt_tensor_shape(t), *L = dt_tensor_local_shape(t);
    dt_dtype dtype = dt_tensor_dtype(t);
    size_t es = dt_dtype_size(dtype);
    int64_t numel = dt_tensor_local_numel(t);

    dt_status st = DT_SUCCESS;
    dt_tensor *o = NULL;
    void *recvbuf = NULL;
    int64_t *tables = NULL;
    dt_p2p_op *ops = NULL;
    if (rank == root) DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, dtype, nd, shape, NULL, &o), out);
    if (numel == 0) goto out;

    int partial = 0;
    for (int m = 0; m < lay->ndim; m++)
        if (lay->placements[m].kind == DT_PARTIAL) partial = 1;
    DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(wsize + 1) * sizeof *ops, (void **)&ops), out);
    int nops = 0;
    ops[nops++] = (dt_p2p_op){ DT_P2P_SEND, root, (void *)(uintptr_t)dt_tensor_data_const(t),
                               (size_t)numel, dtype };
    if (rank == root) {
        DT_TRY_GOTO(st, dt_dev_alloc(be, (size_t)wsize * (size_t)numel * es, &recvbuf), out);
        for (int w = 0; w < wsize; w++)
            ops[nops++] = (dt_p2p_op){ DT_P2P_RECV, w, dt_byte_offset(recvbuf, (int64_t)w * numel, es),
                                       (size_t)numel, dtype };
    }
    DT_TRY_GOTO(st, dt_comm_sendrecv(world, ops, nops), out);
    if (rank != root) goto out;

    int64_t tl = 0;
    for (int d = 0; d < nd; d++) tl += L[d];
    DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(tl > 0 ? tl : 1) * sizeof(int64_t), (void **)&tables),
                out);
    for (int w = 0; w < wsize; w++) {
        int coords[DT_MAX_MESH_DIMS];
        dt_mesh_coords_of(mesh, w, coords);
        /* Replicated copies are equal: take the one at coordinate 0. */
        int skip = 0;
        for (int m = 0; m < lay->ndim; m++)
            if (lay->placements[m].kind == DT_REPLICATE && coords[m] != 0) skip = 1;
        if (skip) continue;
        dt_select sel;
        dt_select_init(&sel, nd, L, shape, L);
        dt_global_tables(mesh, lay, coords, nd, shape, L, tables, sel.dst_idx);
        /* Summands of Partial mesh dims add up in the zeroed output. */
        DT_TRY_GOTO(st, dt_select_copy(be, dtype, partial ? DT_RUNS_ADD : DT_RUNS_COPY,
                                       dt_tensor_data(o),
                                       dt_byte_offset(recvbuf, (int64_t)w * numel, es), &sel),
                    out);
    }
out:
    dt_dev_free(be, recvbuf);
    free(tables);
    free(ops);
    if (st == DT_SUCCESS) {
        *out = o;
    } else {
        dt_tensor_destroy(o);
    }
    return st;
}

dt_status dt_tensor_gather(const dt_tensor *t, int root, dt_tensor **out) {
    dt_context *ctx = dt_tensor_context(t);
    dt_status st = dt_call_entry(ctx, "dt_tensor_gather", dt_gather_check(t, root, out), t, NULL,
                                 root);
    if (st == DT_SUCCESS) st = dt_gather_impl(t, root, out);
    return dt_context_note(ctx, st);
}

static dt_status dt_permute_impl(const char *op, const dt_tensor *t, int dim, int parts,
                                 int inverse, dt_tensor **out) {
    DT_REQUIRE(t != NULL, "%s: tensor is NULL", op);
    DT_REQUIRE(out != NULL, "%s: out is NULL", op);
    int nd = dt_tensor_ndim(t);
    DT_REQUIRE(dim >= 0 && dim < nd, "%s: dim %d is out of range for a %d-dim tensor", op, dim, nd);
    DT_REQUIRE(parts >= 1, "%s: parts %d must be >= 1", op, parts);
    const int64_t *shape = dt_tensor_shape(t);
    DT_REQUIRE(shape[dim] % parts == 0, "%s: dim %d of length %" PRId64 " is not divisible by %d",
               op, dim, shape[dim], parts);
    const dt_mesh *mesh = dt_tensor_mesh(t);
    const dt_layout *lay = dt_tensor_layout(t);
    for (int m = 0; m < lay->ndim; m++) {
        dt_placement p = lay->placements[m];
        if (p.kind == DT_SHARD && p.dim == dim) {
            char buf[128];
            dt_layout_format(lay, buf, sizeof buf);
            return dt_error(DT_ERR_INVALID_ARGUMENT,
                            "%s: dim %d is sharded by mesh dim %d (Layout %s); replicate it first",
                            op, dim, m, buf);
        }
    }
    DT_TRY(dt_check_tensor_dtype(op, t));

    dt_context *ctx = dt_tensor_context(t);
    dt_backend *be = ctx->backend;
    dt_status st = DT_SUCCESS;
    dt_tensor *o = NULL;
    int64_t *idx = NULL;
    int64_t len = shape[dim], n = len / parts;
    DT_TRY_GOTO(st, dt_tensor_create_uninit(ctx, mesh, dt_tensor_dtype(t), nd, shape,
                                            mesh ? lay : NULL, &o), fail);
    DT_TRY_GOTO(st, dt_host_alloc(op, (size_t)(len > 0 ? len : 1) * sizeof *idx, (void **)&idx),
                fail);
    for (int64_t i = 0; i < len; i++)
        idx[i] = inverse ? (i % parts) * n + i / parts : (i % n) * parts + i / n;
    const int64_t *L = dt_tensor_local_shape(t);
    dt_select sel;
    dt_select_init(&sel, nd, L, L, L);
    sel.src_idx[dim] = idx;
    DT_TRY_GOTO(st, dt_select_copy(be, dt_tensor_dtype(t), DT_RUNS_COPY, dt_tensor_data(o),
                                   dt_tensor_data_const(t), &sel), fail);
    free(idx);
    *out = o;
    return DT_SUCCESS;
fail:
    free(idx);
    dt_tensor_destroy(o);
    return st;
}

dt_status dt_tensor_permute_striped(const dt_tensor *t, int dim, int parts, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(t),
                           dt_permute_impl("dt_tensor_permute_striped", t, dim, parts, 0, out));
}

dt_status dt_tensor_unpermute_striped(const dt_tensor *t, int dim, int parts, dt_tensor **out) {
    return dt_context_note(dt_tensor_context(t),
                           dt_permute_impl("dt_tensor_unpermute_striped", t, dim, parts, 1, out));
}
