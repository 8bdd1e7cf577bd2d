/* dtensor/mesh.c — the device mesh and its per-dim communicators.
 *
 * World rank r sits at row-major coordinates (last mesh dim fastest). The
 * communicator of mesh dim m is a split of the world communicator with
 * color = r with coordinate m removed (r - coord[m]*stride[m]) and
 * key = coord[m], so its rank is exactly the coordinate on m.
 *
 * Test: tests/test_tensor.c (make test).
 */
#include "mesh.h"

#include "context_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_MESH_NAME_MAX 32

struct dt_mesh {
    dt_context *ctx;                    /* borrowed */
    int ndim;
    int sizes[DT_MAX_MESH_DIMS];
    int coords[DT_MAX_MESH_DIMS];
    char names[DT_MAX_MESH_DIMS][DT_MESH_NAME_MAX];
    dt_comm *comms[DT_MAX_MESH_DIMS];  /* owned */
};

/* "2 x 2" into buf. */
static void format_sizes(int ndim, const int64_t *sizes, char *buf, size_t size) {
    int pos = 0;
    buf[0] = '\0';
    for (int m = 0; m < ndim && pos < (int)size; m++)
        pos += snprintf(buf + pos, size - (size_t)pos, m ? " x %lld" : "%lld", (long long)sizes[m]);
}

/* This rank's own checks of the arguments, communicating nothing. */
static dt_status mesh_args_check(dt_context *ctx, int ndim, const int *sizes, dt_mesh **out) {
    DT_REQUIRE(ctx != NULL, "dt_mesh_create: ctx is NULL");
    DT_REQUIRE(out != NULL, "dt_mesh_create: out is NULL");
    DT_REQUIRE(ndim >= 1 && ndim <= DT_MAX_MESH_DIMS,
               "dt_mesh_create: ndim %d is out of range 1..%d", ndim, DT_MAX_MESH_DIMS);
    DT_REQUIRE(sizes != NULL, "dt_mesh_create: sizes is NULL");
    int64_t s[DT_MAX_MESH_DIMS];
    long long product = 1;
    for (int m = 0; m < ndim; m++) {
        DT_REQUIRE(sizes[m] >= 1, "dt_mesh_create: mesh dim %d has size %d (must be >= 1)", m,
                   sizes[m]);
        s[m] = sizes[m];
        /* world <= DT_MAX_WORLD_SIZE, so stop multiplying before overflow */
        if (product <= (long long)DT_MAX_WORLD_SIZE) product *= sizes[m];
    }
    const int world = dt_context_world_size(ctx);
    if (product != world) {
        char desc[96];
        format_sizes(ndim, s, desc, sizeof desc);
        return dt_error(DT_ERR_INVALID_ARGUMENT,
                        "dt_mesh_create: mesh %s has %lld ranks but the world size is %d", desc,
                        product, world);
    }
    DT_REQUIRE(dt_context_comm(ctx) != NULL, "dt_mesh_create: the context has no world communicator");
    return DT_SUCCESS;
}

/* COLLECTIVE over the world: every rank shows the others whether its
 * arguments passed its own checks and the sizes it asks for, so that ranks
 * that disagree all fail (DT_ERR_MISMATCH naming the ranks and their
 * meshes; a rank whose own checks failed keeps its own error) before any
 * communicator is split. */
#define MESH_VALUES (2 + DT_MAX_MESH_DIMS)
static dt_status mesh_agree(dt_context *ctx, dt_status local, int ndim, const int *sizes) {
    dt_context *c = ctx ? ctx : dt_context_current();
    dt_comm *comm = c ? dt_context_comm(c) : NULL;
    if (!comm) return local;
    const int world = dt_comm_size(comm);
    int64_t mine[MESH_VALUES] = {local == DT_SUCCESS, local == DT_SUCCESS ? ndim : 0};
    for (int m = 0; local == DT_SUCCESS && m < ndim; m++) mine[2 + m] = sizes[m];
    int64_t *all = malloc((size_t)world * sizeof mine);
    if (!all) return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_mesh_create: out of host memory");
    char keep[1024];
    dt_error_save_(keep, sizeof keep);
    /* a peer that found the disagreement first may abort the world while
     * this rank still waits: then its notice, which names both meshes, is
     * this rank's error */
    dt_status st = dt_comm_all_gather(comm, mine, all, sizeof mine, DT_U8);
    if (local != DT_SUCCESS) dt_error_restore_(keep);
    if (st == DT_SUCCESS && local == DT_SUCCESS) {
        for (int r = 1; r < world && st == DT_SUCCESS; r++) {
            const int64_t *a = all, *b = all + (size_t)r * MESH_VALUES;
            if (!memcmp(a, b, sizeof mine)) continue;
            char da[96] = "invalid arguments", db[96] = "invalid arguments";
            if (a[0]) format_sizes((int)a[1], a + 2, da, sizeof da);
            if (b[0]) format_sizes((int)b[1], b + 2, db, sizeof db);
            st = dt_error(DT_ERR_MISMATCH, "rank %d: dt_mesh_create: ranks disagree on the mesh: "
                          "rank %d asks for %s but rank 0 for %s", dt_comm_rank(comm), r, db, da);
        }
    }
    free(all);
    return local != DT_SUCCESS ? local : st;
}

static dt_status dt_mesh_create_impl(dt_context *ctx, int ndim, const int *sizes,
                                     const char *const *names, dt_mesh **out) {
    DT_TRY(mesh_agree(ctx, mesh_args_check(ctx, ndim, sizes, out), ndim, sizes));
    const int rank = dt_context_rank(ctx);
    dt_comm *world_comm = dt_context_comm(ctx);

    dt_mesh *mesh = calloc(1, sizeof *mesh);
    if (mesh == NULL)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_mesh_create: out of host memory (rank %d)",
                        rank);
    mesh->ctx = ctx;
    mesh->ndim = ndim;
    int stride[DT_MAX_MESH_DIMS];
    int s = 1;
    for (int m = ndim - 1; m >= 0; m--) {
        mesh->sizes[m] = sizes[m];
        stride[m] = s;
        mesh->coords[m] = (rank / s) % sizes[m];
        s *= sizes[m];
    }
    for (int m = 0; m < ndim; m++) {
        if (names != NULL && names[m] != NULL)
            snprintf(mesh->names[m], DT_MESH_NAME_MAX, "%s", names[m]);
        else
            snprintf(mesh->names[m], DT_MESH_NAME_MAX, "d%d", m);
    }

    dt_status st = DT_SUCCESS;
    for (int m = 0; m < ndim; m++) {
        int color = rank - mesh->coords[m] * stride[m];
        DT_TRY_GOTO(st, dt_comm_split(world_comm, color, mesh->coords[m], &mesh->comms[m]), fail);
        if (mesh->comms[m] == NULL || dt_comm_rank(mesh->comms[m]) != mesh->coords[m] ||
            dt_comm_size(mesh->comms[m]) != sizes[m]) {
            st = dt_error(DT_ERR_INTERNAL,
                          "dt_mesh_create: the communicator of mesh dim %d has rank %d of %d, "
                          "expected %d of %d (rank %d)",
                          m, mesh->comms[m] ? dt_comm_rank(mesh->comms[m]) : -1,
                          mesh->comms[m] ? dt_comm_size(mesh->comms[m]) : -1, mesh->coords[m],
                          sizes[m], rank);
            goto fail;
        }
    }
    *out = mesh;
    return DT_SUCCESS;

fail:
    dt_mesh_destroy(mesh);
    return st;
}

dt_status dt_mesh_create(dt_context *ctx, int ndim, const int *sizes,
                         const char *const *names, dt_mesh **out) {
    return dt_context_note(ctx, dt_mesh_create_impl(ctx, ndim, sizes, names, out));
}

void dt_mesh_destroy(dt_mesh *mesh) {
    if (mesh == NULL) return;
    for (int m = 0; m < DT_MAX_MESH_DIMS; m++) dt_comm_destroy(mesh->comms[m]);
    free(mesh);
}

int dt_mesh_ndim(const dt_mesh *mesh) { return mesh ? mesh->ndim : 0; }

const int *dt_mesh_sizes(const dt_mesh *mesh) { return mesh ? mesh->sizes : NULL; }

int dt_mesh_size(const dt_mesh *mesh, int mesh_dim) {
    if (mesh == NULL || mesh_dim < 0 || mesh_dim >= mesh->ndim) return 0;
    return mesh->sizes[mesh_dim];
}

int dt_mesh_coord(const dt_mesh *mesh, int mesh_dim) {
    if (mesh == NULL || mesh_dim < 0 || mesh_dim >= mesh->ndim) return -1;
    return mesh->coords[mesh_dim];
}

const char *dt_mesh_dim_name(const dt_mesh *mesh, int mesh_dim) {
    if (mesh == NULL || mesh_dim < 0 || mesh_dim >= mesh->ndim) return NULL;
    return mesh->names[mesh_dim];
}

dt_comm *dt_mesh_comm(const dt_mesh *mesh, int mesh_dim) {
    if (mesh == NULL || mesh_dim < 0 || mesh_dim >= mesh->ndim) return NULL;
    return mesh->comms[mesh_dim];
}

dt_context *dt_mesh_context(const dt_mesh *mesh) { return mesh ? mesh->ctx : NULL; }

int dt_mesh_rank_at(const dt_mesh *mesh, const int *coords) {
    if (mesh == NULL || coords == NULL) return -1;
    int r = 0;
    for (int m = 0; m < mesh->ndim; m++) {
        if (coords[m] < 0 || coords[m] >= mesh->sizes[m]) return -1;
        r = r * mesh->sizes[m] + coords[m];
    }
    return r;
}
