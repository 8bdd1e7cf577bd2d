/* dtensor/layout.c — placements, orders, Layout checks and index maps.
 *
 * Pure functions only: no allocation, no communication, no state. The index
 * maps are the single source of truth for "which global index does rank j
 * hold": tensor.c (fill_random), primitives.c (pack/unpack tables) and ops.c
 * all derive their offsets from dt_order_owner/local/global, or from their
 * composition for a dim sharded over several mesh dims.
 *
 * Invariants (for n divisible by P, by 2P for zigzag; c = n/P, h = n/(2P)):
 *   global(j, local(g)) == g with owner(g) == j, for every g < n;
 *   each rank holds exactly c indices, and local is a bijection onto 0..c-1.
 * A dim sharded over several mesh dims composes these maps, outer (lower
 * mesh dim) first: dt_layout_global_index applies the innermost map first
 * and dt_layout_owner peels the outermost first, so the invariants carry
 * over to the composition (tests/test_layout.c checks both ways).
 *
 * Test: tests/test_layout.c (make test).
 */
#include "layout.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *dt_placement_kind_name(dt_placement_kind kind) {
    switch (kind) {
    case DT_REPLICATE: return "Replicate";
    case DT_SHARD: return "Shard";
    case DT_PARTIAL: return "Partial";
    default: return "unknown";
    }
}

const char *dt_order_name(dt_order order) {
    switch (order) {
    case DT_ORDER_CONTIGUOUS: return "contiguous";
    case DT_ORDER_STRIPED: return "striped";
    case DT_ORDER_ZIGZAG: return "zigzag";
    default: return "unknown";
    }
}

dt_layout dt_layout_replicated(int mesh_ndim) {
    dt_layout l;
    memset(&l, 0, sizeof l);
    l.ndim = mesh_ndim;
    for (int m = 0; m < DT_MAX_MESH_DIMS; m++) l.placements[m] = dt_replicate();
    return l;
}

dt_layout dt_layout_grad(const dt_layout *l) {
    dt_layout g = *l;
    for (int m = 0; m < g.ndim && m < DT_MAX_MESH_DIMS; m++)
        if (g.placements[m].kind == DT_PARTIAL) g.placements[m] = dt_replicate();
    return g;
}

int dt_placement_equal(dt_placement a, dt_placement b) {
    if (a.kind != b.kind) return 0;
    if (a.kind == DT_SHARD) return a.dim == b.dim && a.order == b.order;
    return 1;
}

int dt_layout_equal(const dt_layout *a, const dt_layout *b) {
    if (a == NULL || b == NULL) return a == b;
    if (a->ndim != b->ndim) return 0;
    if (a->ndim < 0 || a->ndim > DT_MAX_MESH_DIMS) return 0;
    for (int m = 0; m < a->ndim; m++)
        if (!dt_placement_equal(a->placements[m], b->placements[m])) return 0;
    return 1;
}

/* Appends to buf at *pos without ever overflowing; keeps buf terminated. */
static void dt_append(char *buf, size_t size, size_t *pos, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static void dt_append(char *buf, size_t size, size_t *pos, const char *fmt, ...) {
    if (*pos >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *pos, size - *pos, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    *pos += (size_t)w;
    if (*pos >= size) *pos = size; /* truncated: stay at the end */
}

static void dt_placement_format(dt_placement p, char *buf, size_t size, size_t *pos) {
    switch (p.kind) {
    case DT_REPLICATE: dt_append(buf, size, pos, "Replicate"); break;
    case DT_PARTIAL: dt_append(buf, size, pos, "Partial(sum)"); break;
    case DT_SHARD:
        if ((int)p.order >= 0 && p.order < DT_ORDER_COUNT)
            dt_append(buf, size, pos, "Shard(%d, %s)", p.dim, dt_order_name(p.order));
        else
            dt_append(buf, size, pos, "Shard(%d, order=%d)", p.dim, (int)p.order);
        break;
    default: dt_append(buf, size, pos, "Placement(kind=%d)", (int)p.kind); break;
    }
}

void dt_layout_format(const dt_layout *layout, char *buf, size_t size) {
    if (buf == NULL || size == 0) return;
    buf[0] = '\0';
    size_t pos = 0;
    if (layout == NULL) {
        dt_append(buf, size, &pos, "(null layout)");
        return;
    }
    if (layout->ndim < 0 || layout->ndim > DT_MAX_MESH_DIMS) {
        dt_append(buf, size, &pos, "(layout with %d mesh dims)", layout->ndim);
        return;
    }
    dt_append(buf, size, &pos, "[");
    for (int m = 0; m < layout->ndim; m++) {
        if (m > 0) dt_append(buf, size, &pos, ", ");
        dt_placement_format(layout->placements[m], buf, size, &pos);
    }
    dt_append(buf, size, &pos, "]");
}

dt_status dt_layout_check(const dt_layout *layout, int ndim, const int64_t *shape,
                          const int *mesh_sizes) {
    DT_REQUIRE(layout != NULL, "dt_layout_check: layout is NULL");
    DT_REQUIRE(ndim >= 1 && ndim <= DT_MAX_DIMS,
               "dt_layout_check: tensor ndim %d is out of range 1..%d", ndim, DT_MAX_DIMS);
    DT_REQUIRE(shape != NULL, "dt_layout_check: shape is NULL");
    DT_REQUIRE(mesh_sizes != NULL, "dt_layout_check: mesh sizes are NULL");
    DT_REQUIRE(layout->ndim >= 1 && layout->ndim <= DT_MAX_MESH_DIMS,
               "dt_layout_check: layout has %d mesh dims, expected 1..%d", layout->ndim,
               DT_MAX_MESH_DIMS);
    for (int d = 0; d < ndim; d++)
        DT_REQUIRE(shape[d] >= 0, "dt_layout_check: tensor dim %d has negative length %" PRId64,
                   d, shape[d]);

    /* The length each tensor dim still has where the next mesh dim splits
     * it, and the first and last mesh dims that split it. */
    int64_t left[DT_MAX_DIMS];
    int first_by[DT_MAX_DIMS], sharded_by[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) left[d] = shape[d];
    for (int d = 0; d < DT_MAX_DIMS; d++) first_by[d] = sharded_by[d] = -1;

    for (int m = 0; m < layout->ndim; m++) {
        dt_placement p = layout->placements[m];
        char pl[64];
        size_t pos = 0;
        pl[0] = '\0';
        dt_placement_format(p, pl, sizeof pl, &pos);
        DT_REQUIRE(mesh_sizes[m] >= 1, "dt_layout_check: mesh dim %d has size %d (must be >= 1)",
                   m, mesh_sizes[m]);
        DT_REQUIRE((int)p.kind >= 0 && p.kind < DT_PLACEMENT_KIND_COUNT,
                   "dt_layout_check: mesh dim %d has unknown placement kind %d", m, (int)p.kind);
        if (p.kind != DT_SHARD) continue;
        DT_REQUIRE((int)p.order >= 0 && p.order < DT_ORDER_COUNT,
                   "dt_layout_check: mesh dim %d has unknown shard order %d (%s)", m,
                   (int)p.order, pl);
        DT_REQUIRE(p.dim >= 0 && p.dim < ndim,
                   "dt_layout_check: mesh dim %d shards tensor dim %d, out of range for a "
                   "%d-dim tensor (%s)", m, p.dim, ndim, pl);
        int64_t len = left[p.dim];
        int64_t div = p.order == DT_ORDER_ZIGZAG ? 2 * (int64_t)mesh_sizes[m] : mesh_sizes[m];
        if (len % div != 0) {
            /* Sharded before by an outer mesh dim: name what that left. */
            char what[160];
            if (sharded_by[p.dim] >= 0 && first_by[p.dim] != sharded_by[p.dim])
                snprintf(what, sizeof what, "tensor dim %d of length %" PRId64 " is cut to %"
                         PRId64 " by outer mesh dims %d and %d, and %" PRId64, p.dim,
                         shape[p.dim], len, first_by[p.dim], sharded_by[p.dim], len);
            else if (sharded_by[p.dim] >= 0)
                snprintf(what, sizeof what, "tensor dim %d of length %" PRId64 " is cut to %"
                         PRId64 " by outer mesh dim %d, and %" PRId64, p.dim, shape[p.dim], len,
                         sharded_by[p.dim], len);
            else
                snprintf(what, sizeof what, "tensor dim %d of length %" PRId64, p.dim, len);
            if (p.order == DT_ORDER_ZIGZAG)
                return dt_error(DT_ERR_INVALID_ARGUMENT,
                                "%s is not divisible by %" PRId64 " = 2 x %d (mesh dim %d, %s)",
                                what, div, mesh_sizes[m], m, pl);
            return dt_error(DT_ERR_INVALID_ARGUMENT, "%s is not divisible by %" PRId64
                            " (mesh dim %d, %s)", what, div, m, pl);
        }
        left[p.dim] = len / mesh_sizes[m];
        if (first_by[p.dim] < 0) first_by[p.dim] = m;
        sharded_by[p.dim] = m;
    }
    return DT_SUCCESS;
}

dt_status dt_layout_local_shape(const dt_layout *layout, int ndim, const int64_t *shape,
                                const int *mesh_sizes, int64_t *local_shape) {
    DT_REQUIRE(local_shape != NULL, "dt_layout_local_shape: local_shape is NULL");
    DT_TRY(dt_layout_check(layout, ndim, shape, mesh_sizes));
    for (int d = 0; d < ndim; d++) local_shape[d] = shape[d];
    for (int m = 0; m < layout->ndim; m++) {
        const dt_placement *p = &layout->placements[m];
        if (p->kind == DT_SHARD) local_shape[p->dim] /= mesh_sizes[m];
    }
    return DT_SUCCESS;
}

/* The maps below do no validation (the header says so) but never divide by
 * zero: a zero-length dim or a bad `parts` yields 0 rather than a trap. */

int64_t dt_order_owner(dt_order order, int64_t n, int parts, int64_t g) {
    if (parts <= 0) return 0;
    switch (order) {
    case DT_ORDER_CONTIGUOUS: {
        int64_t c = n / parts;
        return c > 0 ? g / c : 0;
    }
    case DT_ORDER_STRIPED: return g % parts;
    case DT_ORDER_ZIGZAG: {
        int64_t h = n / (2 * (int64_t)parts);
        if (h <= 0) return 0;
        int64_t chunk = g / h;
        return chunk < parts ? chunk : 2 * (int64_t)parts - 1 - chunk;
    }
    default: return 0;
    }
}

int64_t dt_order_local(dt_order order, int64_t n, int parts, int64_t g) {
    if (parts <= 0) return 0;
    switch (order) {
    case DT_ORDER_CONTIGUOUS: {
        int64_t c = n / parts;
        return c > 0 ? g % c : 0;
    }
    case DT_ORDER_STRIPED: return g / parts;
    case DT_ORDER_ZIGZAG: {
        int64_t h = n / (2 * (int64_t)parts);
        if (h <= 0) return 0;
        int64_t chunk = g / h;
        return (chunk < parts ? 0 : h) + g % h;
    }
    default: return 0;
    }
}

int64_t dt_order_global(dt_order order, int64_t n, int parts, int rank, int64_t x) {
    if (parts <= 0) return 0;
    switch (order) {
    case DT_ORDER_CONTIGUOUS: return (int64_t)rank * (n / parts) + x;
    case DT_ORDER_STRIPED: return x * parts + rank;
    case DT_ORDER_ZIGZAG: {
        int64_t h = n / (2 * (int64_t)parts);
        if (x < h) return (int64_t)rank * h + x;
        return (2 * (int64_t)parts - 1 - rank) * h + (x - h);
    }
    default: return 0;
    }
}

int dt_layout_shard_dims(const dt_layout *layout, int dim, int *mesh_dims) {
    int k = 0;
    if (layout == NULL) return 0;
    for (int m = 0; m < layout->ndim && m < DT_MAX_MESH_DIMS; m++)
        if (layout->placements[m].kind == DT_SHARD && layout->placements[m].dim == dim) {
            if (mesh_dims) mesh_dims[k] = m;
            k++;
        }
    return k;
}

int64_t dt_layout_global_index(const dt_layout *layout, const int *mesh_sizes, const int *coords,
                               int dim, int64_t n, int64_t x) {
    int ms[DT_MAX_MESH_DIMS];
    int k = dt_layout_shard_dims(layout, dim, ms);
    int64_t len[DT_MAX_MESH_DIMS]; /* the length mesh dim ms[i] splits */
    for (int i = 0; i < k; i++) {
        len[i] = n;
        n = mesh_sizes[ms[i]] > 0 ? n / mesh_sizes[ms[i]] : 0;
    }
    for (int i = k - 1; i >= 0; i--) {
        const dt_placement *p = &layout->placements[ms[i]];
        x = dt_order_global(p->order, len[i], mesh_sizes[ms[i]], coords[ms[i]], x);
    }
    return x;
}

int64_t dt_layout_owner(const dt_layout *layout, const int *mesh_sizes, int dim, int64_t n,
                        int64_t g, int *coords) {
    int ms[DT_MAX_MESH_DIMS];
    int k = dt_layout_shard_dims(layout, dim, ms);
    for (int i = 0; i < k; i++) {
        const dt_placement *p = &layout->placements[ms[i]];
        int parts = mesh_sizes[ms[i]];
        if (coords) coords[ms[i]] = (int)dt_order_owner(p->order, n, parts, g);
        g = dt_order_local(p->order, n, parts, g);
        n = parts > 0 ? n / parts : 0;
    }
    return g;
}
