/* dtensor/tensor.c — the DTensor object: metadata plus one local buffer.
 *
 * A tensor never communicates. fill_random is the self-verifying data source
 * of the tests and benchmarks: each element's value depends only on (seed,
 * global linear index), and the global index of a local element comes from
 * the Layout index maps, one tensor dim at a time (a dim sharded over
 * several mesh dims maps through their composition, dt_layout_global_index).
 *
 * Test: tests/test_tensor.c (make test).
 */
#include "tensor.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_internal.h"

struct dt_tensor {
    dt_context *ctx;          /* borrowed */
    const dt_mesh *mesh;      /* borrowed; NULL for a local tensor */
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];        /* global [d0, d1, ...], row-major */
    int64_t local_shape[DT_MAX_DIMS];  /* this rank's part */
    dt_layout layout;                  /* ndim 0 for local tensors */
    int64_t local_numel;
    size_t local_bytes;
    void *data;                        /* backend memory, owned or shared */
    /* NULL: data is this tensor's alone. Else the count of the tensors that
     * share data (dt_tensor_view), in one block each holds a reference to;
     * the last to go frees data and the count. */
    atomic_int *shared;
};

/* A tensor's header (no buffer: data NULL) for dt_tensor_create's
 * arguments, checked as it documents. */
static dt_status dt_tensor_header(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                                  const int64_t *shape, const dt_layout *layout, dt_tensor **out) {
    DT_REQUIRE(ctx != NULL, "dt_tensor_create: ctx is NULL");
    DT_REQUIRE(ctx->backend != NULL, "dt_tensor_create: the context has no compute backend");
    DT_REQUIRE(dt_dtype_valid(dtype), "dt_tensor_create: unknown dtype %d", (int)dtype);
    DT_REQUIRE(ndim >= 1 && ndim <= DT_MAX_DIMS, "dt_tensor_create: ndim %d is out of range 1..%d",
               ndim, DT_MAX_DIMS);
    DT_REQUIRE(shape != NULL, "dt_tensor_create: shape is NULL");
    for (int d = 0; d < ndim; d++)
        DT_REQUIRE(shape[d] >= 0, "dt_tensor_create: dim %d has negative length %" PRId64, d,
                   shape[d]);
    if (mesh == NULL) {
        DT_REQUIRE(layout == NULL,
                   "dt_tensor_create: a local tensor (mesh NULL) takes no layout");
    } else {
        DT_REQUIRE(layout != NULL, "dt_tensor_create: layout is NULL (mesh given)");
        DT_REQUIRE(dt_mesh_context(mesh) == ctx,
                   "dt_tensor_create: the mesh belongs to another context");
        DT_REQUIRE(layout->ndim == dt_mesh_ndim(mesh),
                   "dt_tensor_create: layout has %d mesh dims but the mesh has %d", layout->ndim,
                   dt_mesh_ndim(mesh));
    }

    int64_t local[DT_MAX_DIMS];
    if (mesh != NULL) {
        DT_TRY(dt_layout_local_shape(layout, ndim, shape, dt_mesh_sizes(mesh), local));
    } else {
        for (int d = 0; d < ndim; d++) local[d] = shape[d];
    }
    size_t es = dt_dtype_size(dtype);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (local[d] != 0 && numel > (INT64_MAX / (int64_t)es) / local[d])
            return dt_error(DT_ERR_INVALID_ARGUMENT,
                            "dt_tensor_create: local size overflows (dim %d of length %" PRId64 ")",
                            d, local[d]);
        numel *= local[d];
    }
    if ((uint64_t)numel * es > (uint64_t)SIZE_MAX)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_create: local size overflows size_t");

    dt_tensor *t = calloc(1, sizeof *t);
    if (t == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_tensor_create: out of host memory (rank %d)",
                        ctx->rank);
    t->ctx = ctx;
    t->mesh = mesh;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->local_shape[d] = local[d];
    }
    if (mesh != NULL) {
        t->layout = *layout;
        /* Ignored fields are normalised so that copies compare and print alike. */
        for (int m = layout->ndim; m < DT_MAX_MESH_DIMS; m++) t->layout.placements[m] = dt_replicate();
        for (int m = 0; m < layout->ndim; m++)
            if (t->layout.placements[m].kind != DT_SHARD) {
                t->layout.placements[m].dim = 0;
                t->layout.placements[m].order = DT_ORDER_CONTIGUOUS;
            }
    } else {
        t->layout = dt_layout_replicated(0);
    }
    t->local_numel = numel;
    t->local_bytes = (size_t)numel * es;
    *out = t;
    return DT_SUCCESS;
}

static dt_status dt_tensor_create_impl(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype,
                                       int ndim, const int64_t *shape, const dt_layout *layout,
                                       int zero, dt_tensor **out) {
    DT_REQUIRE(out != NULL, "dt_tensor_create: out is NULL");
    dt_tensor *t = NULL;
    DT_TRY(dt_tensor_header(ctx, mesh, dtype, ndim, shape, layout, &t));
    dt_status st = zero ? ctx->backend->ops->alloc(ctx->backend, t->local_bytes, &t->data)
                        : ctx->backend->ops->alloc_uninit(ctx->backend, t->local_bytes, &t->data);
    if (st != DT_SUCCESS) {
        free(t);
        return st;
    }
    *out = t;
    return DT_SUCCESS;
}

static dt_status dt_tensor_view_impl(const dt_tensor *t, int ndim, const int64_t *shape,
                                     const dt_layout *layout, dt_tensor **out) {
    DT_REQUIRE(t != NULL && out != NULL, "dt_tensor_view: t and out must not be NULL");
    dt_tensor *v = NULL;
    DT_TRY(dt_tensor_header(t->ctx, t->mesh, t->dtype, ndim, shape, t->mesh ? layout : NULL, &v));
    if (v->local_bytes != t->local_bytes) {
        const size_t bytes = v->local_bytes;
        free(v);
        return dt_error(DT_ERR_INTERNAL, "dt_tensor_view: %zu local bytes, the buffer holds %zu",
                        bytes, t->local_bytes);
    }
    dt_tensor *src = (dt_tensor *)t;   /* the sharing count, not t's value, changes */
    if (src->shared == NULL) {
        src->shared = malloc(sizeof *src->shared);
        if (src->shared == NULL) {
            free(v);
            return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_tensor_view: out of host memory (rank %d)",
                            t->ctx->rank);
        }
        atomic_init(src->shared, 1);
    }
    atomic_fetch_add(src->shared, 1);
    v->data = src->data;
    v->shared = src->shared;
    *out = v;
    return DT_SUCCESS;
}

dt_status dt_tensor_view(const dt_tensor *t, int ndim, const int64_t *shape,
                         const dt_layout *layout, dt_tensor **out) {
    return dt_context_note(t ? t->ctx : NULL, dt_tensor_view_impl(t, ndim, shape, layout, out));
}

/* Drops t's reference to its buffer: frees it if no other tensor shares it. */
static void dt_tensor_release(dt_tensor *t) {
    if (t->shared != NULL && atomic_fetch_sub(t->shared, 1) > 1) {
        t->data = NULL;
        t->shared = NULL;
        return;
    }
    free(t->shared);
    t->shared = NULL;
    if (t->data != NULL) t->ctx->backend->ops->free(t->ctx->backend, t->data);
    t->data = NULL;
}

static dt_status dt_tensor_own_impl(dt_tensor *t) {
    if (atomic_load(t->shared) == 1) {   /* the others are gone */
        free(t->shared);
        t->shared = NULL;
        return DT_SUCCESS;
    }
    dt_backend *be = t->ctx->backend;
    void *mine = NULL;
    DT_TRY(be->ops->alloc_uninit(be, t->local_bytes, &mine));
    dt_status st = be->ops->copy(be, mine, t->data, t->local_bytes);
    if (st != DT_SUCCESS) {
        be->ops->free(be, mine);
        return st;
    }
    dt_tensor_release(t);
    t->data = mine;
    return DT_SUCCESS;
}

dt_status dt_tensor_own(dt_tensor *t) {
    if (t == NULL || t->shared == NULL) return DT_SUCCESS;
    return dt_context_note(t->ctx, dt_tensor_own_impl(t));
}

dt_status dt_tensor_create(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                           const int64_t *shape, const dt_layout *layout, dt_tensor **out) {
    return dt_context_note(ctx,
                           dt_tensor_create_impl(ctx, mesh, dtype, ndim, shape, layout, 1, out));
}

dt_status dt_tensor_create_uninit(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                                  const int64_t *shape, const dt_layout *layout, dt_tensor **out) {
    return dt_context_note(ctx,
                           dt_tensor_create_impl(ctx, mesh, dtype, ndim, shape, layout, 0, out));
}

void dt_shape_format(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t pos = 0;
    buf[0] = '\0';
    for (int d = 0; d < ndim && pos < size; d++) {
        int w = snprintf(buf + pos, size - pos, "%s%" PRId64, d ? ", " : "[", shape[d]);
        if (w < 0) return;
        pos += (size_t)w;
    }
    if (pos < size) snprintf(buf + pos, size - pos, "%s", ndim > 0 ? "]" : "[]");
}

void dt_tensor_destroy(dt_tensor *t) {
    if (t == NULL) return;
    dt_tensor_release(t);
    free(t);
}

dt_context *dt_tensor_context(const dt_tensor *t) { return t ? t->ctx : NULL; }
const dt_mesh *dt_tensor_mesh(const dt_tensor *t) { return t ? t->mesh : NULL; }
dt_dtype dt_tensor_dtype(const dt_tensor *t) { return t ? t->dtype : DT_DTYPE_COUNT; }
int dt_tensor_ndim(const dt_tensor *t) { return t ? t->ndim : 0; }
const int64_t *dt_tensor_shape(const dt_tensor *t) { return t ? t->shape : NULL; }
const int64_t *dt_tensor_local_shape(const dt_tensor *t) { return t ? t->local_shape : NULL; }
const dt_layout *dt_tensor_layout(const dt_tensor *t) { return t ? &t->layout : NULL; }
int64_t dt_tensor_local_numel(const dt_tensor *t) { return t ? t->local_numel : 0; }
size_t dt_tensor_local_bytes(const dt_tensor *t) { return t ? t->local_bytes : 0; }
void *dt_tensor_data(dt_tensor *t) {
    return t && dt_tensor_own(t) == DT_SUCCESS ? t->data : NULL;
}
const void *dt_tensor_data_const(const dt_tensor *t) { return t ? t->data : NULL; }

dt_status dt_tensor_set_local(dt_tensor *t, const void *host, size_t bytes) {
    DT_REQUIRE(t != NULL, "dt_tensor_set_local: tensor is NULL");
    if (bytes != t->local_bytes)
        return dt_context_note(t->ctx, dt_error(DT_ERR_INVALID_ARGUMENT,
                                                "dt_tensor_set_local: %zu bytes given, the local "
                                                "buffer holds %zu", bytes, t->local_bytes));
    if (host == NULL && bytes > 0)
        return dt_context_note(t->ctx, dt_error(DT_ERR_INVALID_ARGUMENT,
                                                "dt_tensor_set_local: host buffer is NULL"));
    dt_backend *b = t->ctx->backend;
    DT_TRY(dt_tensor_own(t));
    return dt_context_note(t->ctx, b->ops->upload(b, t->data, host, bytes));
}

dt_status dt_tensor_get_local(const dt_tensor *t, void *host, size_t bytes) {
    DT_REQUIRE(t != NULL, "dt_tensor_get_local: tensor is NULL");
    if (bytes != t->local_bytes)
        return dt_context_note(t->ctx, dt_error(DT_ERR_INVALID_ARGUMENT,
                                                "dt_tensor_get_local: %zu bytes asked, the local "
                                                "buffer holds %zu", bytes, t->local_bytes));
    if (host == NULL && bytes > 0)
        return dt_context_note(t->ctx, dt_error(DT_ERR_INVALID_ARGUMENT,
                                                "dt_tensor_get_local: host buffer is NULL"));
    dt_backend *b = t->ctx->backend;
    return dt_context_note(t->ctx, b->ops->download(b, host, t->data, bytes));
}

/* splitmix64's finaliser: a bijection on 64 bits with good avalanche. */
static uint64_t dt_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

float dt_random_value(uint64_t seed, uint64_t i) {
    /* Counter-based: hash (seed, i) rather than advance a stream, so any rank
     * can produce any element without the ones before it. */
    uint64_t h = dt_mix64(dt_mix64(seed + 0x9e3779b97f4a7c15ULL) ^ (i * 0x9e3779b97f4a7c15ULL + 1));
    /* 24 random bits: k * 2^-23 - 1 is exact in fp32 and lies in [-1, 1). */
    uint32_t k = (uint32_t)(h >> 40);
    return (float)k * (1.0f / 8388608.0f) - 1.0f;
}

/* gidx[d] (malloc'd, the caller frees each) = the global index of each local
 * index along dim d, from the Layout's index maps. */
static dt_status global_indices(const dt_tensor *t, int64_t **gidx) {
    for (int d = 0; d < t->ndim; d++) {
        gidx[d] = malloc((size_t)(t->local_shape[d] > 0 ? t->local_shape[d] : 1) * sizeof(int64_t));
        if (gidx[d] == NULL) {
            for (int e = 0; e < d; e++) free(gidx[e]), gidx[e] = NULL;
            return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: out of host memory", t->ctx->rank);
        }
    }
    int coords[DT_MAX_MESH_DIMS] = { 0 };
    for (int m = 0; m < t->layout.ndim; m++) coords[m] = dt_mesh_coord(t->mesh, m);
    const int *sizes = t->mesh ? dt_mesh_sizes(t->mesh) : NULL;
    for (int d = 0; d < t->ndim; d++) {
        int sharded = t->mesh && dt_layout_shard_dims(&t->layout, d, NULL) > 0;
        for (int64_t x = 0; x < t->local_shape[d]; x++)
            gidx[d][x] = sharded ? dt_layout_global_index(&t->layout, sizes, coords, d,
                                                          t->shape[d], x)
                                 : x;
    }
    return DT_SUCCESS;
}

dt_status dt_tensor_global_indices(const dt_tensor *t, int dim, int64_t *out) {
    DT_REQUIRE(t != NULL && out != NULL, "dt_tensor_global_indices: t and out must not be NULL");
    DT_REQUIRE(dim >= 0 && dim < t->ndim, "dt_tensor_global_indices: dim %d is out of range for "
               "a %d-dim tensor", dim, t->ndim);
    int64_t *gidx[DT_MAX_DIMS] = { 0 };
    DT_TRY(global_indices(t, gidx));
    memcpy(out, gidx[dim], (size_t)t->local_shape[dim] * sizeof *out);
    for (int d = 0; d < DT_MAX_DIMS; d++) free(gidx[d]);
    return DT_SUCCESS;
}

/* Walks the local elements through the index maps, each with its offset g
 * in the row-major full tensor: FROM_FULL copies full[g] to the host copy
 * `local`, TO_FULL local to full[g], RANDOM sets local to
 * dt_random_value(seed, g). */
enum { TO_FULL, FROM_FULL, RANDOM };
static void local_walk(const dt_tensor *t, int64_t *const *gidx, char *local, char *full,
                       int mode, uint64_t seed) {
    const size_t es = dt_dtype_size(t->dtype);
    int64_t gstride[DT_MAX_DIMS];
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        gstride[d] = s;
        s *= t->shape[d];
    }
    int64_t x[DT_MAX_DIMS] = { 0 };
    for (int64_t i = 0; i < t->local_numel; i++) {
        int64_t g = 0;
        for (int d = 0; d < t->ndim; d++) g += gidx[d][x[d]] * gstride[d];
        if (mode == TO_FULL) memcpy(full + (size_t)g * es, local + (size_t)i * es, es);
        else if (mode == FROM_FULL) memcpy(local + (size_t)i * es, full + (size_t)g * es, es);
        else dt_value_set(local, t->dtype, (size_t)i, dt_random_value(seed, (uint64_t)g));
        for (int d = t->ndim - 1; d >= 0; d--) { /* odometer, last dim fastest */
            if (++x[d] < t->local_shape[d]) break;
            x[d] = 0;
        }
    }
}

/* 1 where a non-zero coordinate on a Partial mesh dim makes the local part
 * a zero summand. */
static int is_partial_nonzero(const dt_tensor *t) {
    for (int m = 0; m < t->layout.ndim; m++)
        if (t->layout.placements[m].kind == DT_PARTIAL && dt_mesh_coord(t->mesh, m) != 0) return 1;
    return 0;
}

static dt_status global_copy(dt_tensor *t, void *full, int to_full) {
    const char *op = to_full ? "dt_tensor_get_global" : "dt_tensor_set_global";
    DT_REQUIRE(t != NULL && full != NULL, "%s: t and full must not be NULL", op);
    for (int m = 0; to_full && m < t->layout.ndim; m++)
        DT_REQUIRE(t->layout.placements[m].kind != DT_PARTIAL,
                   "%s: the tensor is Partial on mesh dim %d (its local part is a summand): "
                   "redistribute it first", op, m);
    int64_t *gidx[DT_MAX_DIMS] = { 0 };
    DT_TRY(global_indices(t, gidx));
    dt_backend *be = t->ctx->backend;
    char *host = malloc(t->local_bytes > 0 ? t->local_bytes : 1);
    dt_status st = host ? DT_SUCCESS : dt_error(DT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    if (st == DT_SUCCESS && to_full) st = be->ops->download(be, host, t->data, t->local_bytes);
    if (st == DT_SUCCESS) {
        if (!to_full && is_partial_nonzero(t)) memset(host, 0, t->local_bytes);
        else local_walk(t, gidx, host, full, to_full ? TO_FULL : FROM_FULL, 0);
    }
    if (st == DT_SUCCESS && !to_full) st = dt_tensor_own(t);
    if (st == DT_SUCCESS && !to_full) st = be->ops->upload(be, t->data, host, t->local_bytes);
    free(host);
    for (int d = 0; d < DT_MAX_DIMS; d++) free(gidx[d]);
    return st;
}

dt_status dt_tensor_set_global(dt_tensor *t, const void *full) {
    return dt_context_note(t ? t->ctx : NULL, global_copy(t, (void *)full, 0));
}

dt_status dt_tensor_get_global(const dt_tensor *t, void *full) {
    return dt_context_note(t ? t->ctx : NULL, global_copy((dt_tensor *)t, full, 1));
}

static dt_status dt_tensor_fill_random_impl(dt_tensor *t, uint64_t seed) {
    DT_REQUIRE(t != NULL, "dt_tensor_fill_random: tensor is NULL");
    if (!dt_dtype_is_float(t->dtype))
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_tensor_fill_random: dtype %s is not supported",
                        dt_dtype_name(t->dtype));
    dt_status st = DT_SUCCESS;
    int64_t *gidx[DT_MAX_DIMS] = { 0 };
    void *host = NULL;
    if (global_indices(t, gidx) != DT_SUCCESS) goto oom;
    host = malloc(t->local_bytes > 0 ? t->local_bytes : 1);
    if (host == NULL) goto oom;
    if (is_partial_nonzero(t)) memset(host, 0, t->local_bytes);
    else local_walk(t, gidx, host, NULL, RANDOM, seed);
    st = dt_tensor_own(t);
    if (st == DT_SUCCESS)
        st = t->ctx->backend->ops->upload(t->ctx->backend, t->data, host, t->local_bytes);
    goto out;
oom:
    st = dt_error(DT_ERR_OUT_OF_MEMORY, "dt_tensor_fill_random: out of host memory (rank %d)",
                  t->ctx->rank);
out:
    free(host);
    for (int d = 0; d < DT_MAX_DIMS; d++) free(gidx[d]);
    return st;
}

dt_status dt_tensor_fill_random(dt_tensor *t, uint64_t seed) {
    return dt_context_note(t ? t->ctx : NULL, dt_tensor_fill_random_impl(t, seed));
}
