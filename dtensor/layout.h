/* dtensor/layout.h — placements, orders and Layouts: pure metadata.
 *
 * A Layout says, for each dim of a mesh, how a tensor is placed on it:
 *   Shard(d, order)  tensor dim d is split across that mesh dim;
 *   Replicate        every rank of that mesh dim holds the same data;
 *   Partial          every rank holds a summand; the value is their sum.
 * The order of a sharded dim of length n over P ranks says which global
 * indices rank j holds (c = n / P):
 *   contiguous  j*c .. j*c + c-1
 *   striped     j, j+P, j+2P, ...            (einops "(n d) -> (d n)")
 *   zigzag      chunks j and 2P-1-j of 2P chunks of n/(2P)
 * n must be divisible by P (by 2P for zigzag).
 *
 * A tensor dim may be sharded over several mesh dims in turn, outer first
 * (lower mesh dim index first, as PyTorch DTensor's Shard(d) on several mesh
 * dims), each with its own order. For dim d of length n sharded by mesh dims
 * m1 < m2 (sizes P1, P2, orders o1, o2): the dim is split over m1 by o1 into
 * pieces of n1 = n/P1, then the rank's piece over m2 by o2 into n1/P2, so the
 * global index of local x on coordinates (r1, r2) is
 *   dt_order_global(o1, n, P1, r1, dt_order_global(o2, n1, P2, r2, x))
 * (dt_layout_global_index). Each length along the way must be divisible:
 * n by P1 (2 P1 for zigzag), n1 by P2 (2 P2 for zigzag), and so on.
 * [Shard(1, striped), Shard(1, contiguous)] stripes the sequence over mesh
 * dim 0 and cuts each rank's stripes into contiguous runs over mesh dim 1.
 *
 * Everything here is a pure function of its arguments.
 * Test: tests/test_layout.c (make test).
 */
#ifndef DT_LAYOUT_H
#define DT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include "../base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MAX_MESH_DIMS 3
#define DT_MAX_DIMS 8

typedef enum dt_placement_kind {
    DT_REPLICATE = 0,
    DT_SHARD,
    DT_PARTIAL,          /* Partial(sum) */
    DT_PLACEMENT_KIND_COUNT
} dt_placement_kind;

typedef enum dt_order {
    DT_ORDER_CONTIGUOUS = 0,
    DT_ORDER_STRIPED,
    DT_ORDER_ZIGZAG,
    DT_ORDER_COUNT
} dt_order;

const char *dt_placement_kind_name(dt_placement_kind kind);
const char *dt_order_name(dt_order order);

typedef struct dt_placement {
    dt_placement_kind kind;
    int dim;             /* DT_SHARD: the tensor dim; ignored otherwise */
    dt_order order;      /* DT_SHARD: which indices a rank holds; ignored otherwise */
} dt_placement;

/* placements[m] is the placement on mesh dim m, m < ndim. */
typedef struct dt_layout {
    int ndim;
    dt_placement placements[DT_MAX_MESH_DIMS];
} dt_layout;

static inline dt_placement dt_shard(int dim, dt_order order) {
    dt_placement p = { DT_SHARD, dim, order };
    return p;
}
static inline dt_placement dt_replicate(void) {
    dt_placement p = { DT_REPLICATE, 0, DT_ORDER_CONTIGUOUS };
    return p;
}
static inline dt_placement dt_partial(void) {
    dt_placement p = { DT_PARTIAL, 0, DT_ORDER_CONTIGUOUS };
    return p;
}
static inline dt_layout dt_layout_1d(dt_placement a) {
    dt_layout l = { 1, { a, dt_replicate(), dt_replicate() } };
    return l;
}
static inline dt_layout dt_layout_2d(dt_placement a, dt_placement b) {
    dt_layout l = { 2, { a, b, dt_replicate() } };
    return l;
}
static inline dt_layout dt_layout_3d(dt_placement a, dt_placement b, dt_placement c) {
    dt_layout l = { 3, { a, b, c } };
    return l;
}
/* Every mesh dim Replicate. */
dt_layout dt_layout_replicated(int mesh_ndim);

/* The Layout of a gradient of a tensor under `l`: l with every Partial
 * read as Replicate (the gradient of a sum reaches every summand whole). */
dt_layout dt_layout_grad(const dt_layout *l);

/* 1 if equal (fields ignored by a placement's kind are not compared). */
int dt_placement_equal(dt_placement a, dt_placement b);
int dt_layout_equal(const dt_layout *a, const dt_layout *b);

/* Writes e.g. "[Shard(1, striped), Replicate]" (always NUL-terminated). */
void dt_layout_format(const dt_layout *layout, char *buf, size_t size);

/* Check a Layout against a shape and mesh sizes: kinds, orders and dims in
 * range, every sharded length divisible (for a dim sharded over several mesh
 * dims, the length each mesh dim splits, as above); else
 * DT_ERR_INVALID_ARGUMENT naming the dim, length, mesh dim and placement. */
dt_status dt_layout_check(const dt_layout *layout, int ndim, const int64_t *shape,
                          const int *mesh_sizes);

/* Local shape of the rank at any coordinate (the same on every rank): each
 * dim's length divided by the sizes of the mesh dims that shard it. */
dt_status dt_layout_local_shape(const dt_layout *layout, int ndim, const int64_t *shape,
                                const int *mesh_sizes, int64_t *local_shape);

/* Index maps of one sharded dim of length n over `parts` ranks (n divisible
 * as above; no checks: call dt_layout_check first. Out-of-contract inputs
 * such as parts < 1 or an unknown order give 0, never a trap).
 *   owner:  rank holding global index g
 *   local:  index of g within its owner's shard
 *   global: global index of local index x on rank j */
int64_t dt_order_owner(dt_order order, int64_t n, int parts, int64_t g);
int64_t dt_order_local(dt_order order, int64_t n, int parts, int64_t g);
int64_t dt_order_global(dt_order order, int64_t n, int parts, int rank, int64_t x);

/* The mesh dims that shard tensor dim `dim` under `layout`, outer first, into
 * mesh_dims (room for DT_MAX_MESH_DIMS; may be NULL); returns how many (0:
 * the dim is whole on every rank; 2 or more: sharded over several). */
int dt_layout_shard_dims(const dt_layout *layout, int dim, int *mesh_dims);

/* The composed index maps of tensor dim `dim` (global length n) under a
 * Layout that dt_layout_check accepted for mesh_sizes (no checks here, as
 * for dt_order_*). coords[m] is a rank's coordinate on mesh dim m; only the
 * mesh dims that shard `dim` are read or written. A dim no mesh dim shards
 * maps x to x.
 *   global: global index of local index x on the rank at coords
 *   owner:  writes into coords the coordinates (on the mesh dims that shard
 *           `dim`) of the ranks holding global index g; returns g's local
 *           index there (coords may be NULL: the local index only)
 * so dt_layout_global_index(l, s, c, dim, n, dt_layout_owner(l, s, dim, n, g,
 * c)) == g for every g < n. */
int64_t dt_layout_global_index(const dt_layout *layout, const int *mesh_sizes, const int *coords,
                               int dim, int64_t n, int64_t x);
int64_t dt_layout_owner(const dt_layout *layout, const int *mesh_sizes, int dim, int64_t n,
                        int64_t g, int *coords);

#ifdef __cplusplus
}
#endif
#endif /* DT_LAYOUT_H */
