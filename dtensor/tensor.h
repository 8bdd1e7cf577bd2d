/* dtensor/tensor.h — the DTensor: (context, dtype, global shape, Layout,
 * local buffer) on a mesh, or a plain local tensor when mesh is NULL.
 *
 * Shapes are row-major, last dim fastest; the local shape follows from the
 * global shape and the Layout (dt_layout_local_shape). The local buffer lives
 * where the context's backend keeps data (host memory on the CPU backend) and
 * belongs to the tensor; tensors that ops return as views of their inputs
 * share it until one of them is written (dt_tensor_data).
 *
 * Nothing here communicates: setting local data under a sharded Layout
 * trusts the caller. The primitives (primitives.h) move data.
 *
 * Test: tests/test_tensor.c (make test).
 */
#ifndef DT_TENSOR_H
#define DT_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "context.h"
#include "../base/dtype.h"
#include "layout.h"
#include "mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tensor dt_tensor;

/* A tensor of global `shape` (ndim entries, 1..DT_MAX_DIMS) placed by
 * `layout` on `mesh`, local buffer zeroed. mesh NULL makes a local tensor
 * (layout must then be NULL). The tensor borrows ctx and mesh. */
dt_status dt_tensor_create(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype,
                           int ndim, const int64_t *shape, const dt_layout *layout,
                           dt_tensor **out);
/* Accepts NULL. */
void dt_tensor_destroy(dt_tensor *t);

dt_context *dt_tensor_context(const dt_tensor *t);
const dt_mesh *dt_tensor_mesh(const dt_tensor *t);   /* NULL for local tensors */
dt_dtype dt_tensor_dtype(const dt_tensor *t);
int dt_tensor_ndim(const dt_tensor *t);
/* Global and local shapes (ndim entries, owned by the tensor). */
const int64_t *dt_tensor_shape(const dt_tensor *t);
const int64_t *dt_tensor_local_shape(const dt_tensor *t);
/* The Layout (ndim 0 for local tensors; owned by the tensor). */
const dt_layout *dt_tensor_layout(const dt_tensor *t);
int64_t dt_tensor_local_numel(const dt_tensor *t);
size_t dt_tensor_local_bytes(const dt_tensor *t);
/* The local buffer (backend memory; the tensor's). Ops may return tensors
 * that share their input's buffer (dt_tensor_reshape, a redistribution
 * that moves nothing, a gradient that is its input's): both read the same
 * memory until one is written. dt_tensor_data is for writing: where the
 * buffer is shared it first gives t a copy of its own (NULL if that fails:
 * out of memory, the message in dt_last_error), so the others keep their
 * values; call it again after any op that took t as an input before
 * writing through the pointer. dt_tensor_data_const only reads. */
void *dt_tensor_data(dt_tensor *t);
const void *dt_tensor_data_const(const dt_tensor *t);

/* Not collective. Copy `bytes` (= dt_tensor_local_bytes) of host memory into
 * the local buffer, or out of it; returns once the host buffer is free (get: holds
 * the data, after the rank's queued work). */
dt_status dt_tensor_set_local(dt_tensor *t, const void *host, size_t bytes);
dt_status dt_tensor_get_local(const dt_tensor *t, void *host, size_t bytes);

/* Not collective. Each element := a value in [-1, 1) of (seed, global linear
 * index) only, so ranks fill their parts of one global tensor (Partial: coord 0
 * holds it, others 0; bf16/fp16 rounded, bf16 may reach 1.0). fp32/bf16/fp16. */
dt_status dt_tensor_fill_random(dt_tensor *t, uint64_t seed);

/* The global index along dim of each of this rank's local indices along it
 * (the Layout's index map, composed over every mesh dim that shards dim:
 * dt_layout_global_index); out holds dt_tensor_local_shape(t)[dim] entries.
 * Not collective. */
dt_status dt_tensor_global_indices(const dt_tensor *t, int dim, int64_t *out);

/* Not collective. full: a host array of the global shape and dtype. set copies
 * this rank's part in (Partial: as fill_random); get writes the local elements
 * to their places in full, others untouched (t not Partial). Blocks the host. */
dt_status dt_tensor_set_global(dt_tensor *t, const void *full);
dt_status dt_tensor_get_global(const dt_tensor *t, void *full);

/* The value dt_tensor_fill_random writes at global linear index i. */
float dt_random_value(uint64_t seed, uint64_t i);

#ifdef __cplusplus
}
#endif
#endif /* DT_TENSOR_H */
