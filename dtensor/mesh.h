/* dtensor/mesh.h — a device mesh: the world's ranks arranged in 1 to 3
 * named dims (for example "tp" x "sp"), with one communicator per mesh dim.
 *
 * World rank r has coordinates in row-major order, the last mesh dim fastest:
 * on a 2 x 3 mesh rank 4 is at (1, 1). The communicator of mesh dim m joins
 * the ranks that share every coordinate but m; its rank is the coordinate m.
 *
 * Test: tests/test_tensor.c (make test).
 */
#ifndef DT_MESH_H
#define DT_MESH_H

#include "context.h"
#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_mesh dt_mesh;

/* COLLECTIVE over the world. sizes[0..ndim-1] must multiply to the world
 * size; names may be NULL (then "d0", "d1", ...; a name is copied, and cut
 * to 31 characters). The mesh borrows ctx. */
dt_status dt_mesh_create(dt_context *ctx, int ndim, const int *sizes,
                         const char *const *names, dt_mesh **out);
/* Accepts NULL. Not collective. */
void dt_mesh_destroy(dt_mesh *mesh);

/* Accessors return 0 (sizes), -1 (coordinates, ranks) or NULL for a NULL
 * mesh or a mesh_dim out of range. */
int dt_mesh_ndim(const dt_mesh *mesh);
/* Sizes of all mesh dims (array of dt_mesh_ndim entries, owned by the mesh). */
const int *dt_mesh_sizes(const dt_mesh *mesh);
int dt_mesh_size(const dt_mesh *mesh, int mesh_dim);
/* This rank's coordinate on mesh_dim. */
int dt_mesh_coord(const dt_mesh *mesh, int mesh_dim);
const char *dt_mesh_dim_name(const dt_mesh *mesh, int mesh_dim);
/* Communicator of mesh_dim (owned by the mesh). */
dt_comm *dt_mesh_comm(const dt_mesh *mesh, int mesh_dim);
dt_context *dt_mesh_context(const dt_mesh *mesh);
/* World rank at the given coordinates (ndim entries). */
int dt_mesh_rank_at(const dt_mesh *mesh, const int *coords);

#ifdef __cplusplus
}
#endif
#endif /* DT_MESH_H */
