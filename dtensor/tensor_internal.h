/* dtensor/tensor_internal.h — PRIVATE. What ops and primitives share about
 * making output tensors and naming shapes in messages. */
#ifndef DT_TENSOR_INTERNAL_H
#define DT_TENSOR_INTERNAL_H

#include "context_internal.h"
#include "tensor.h"

/* dt_tensor_create without zeroing the local buffer (dt_backend_ops
 * alloc_uninit): for an op's output that the op writes in full. */
dt_status dt_tensor_create_uninit(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                                  const int64_t *shape, const dt_layout *layout, dt_tensor **out);

/* shape as "[2, 3]" ("[]" for ndim 0) into buf, cut to size: for messages. */
void dt_shape_format(int ndim, const int64_t *shape, char *buf, size_t size);

/* An op's last step: with st DT_SUCCESS hands o to the caller (*out = o),
 * else destroys o; returns st. */
static inline dt_status dt_op_output(dt_status st, dt_tensor *o, dt_tensor **out) {
    if (st == DT_SUCCESS) *out = o;
    else dt_tensor_destroy(o);
    return st;
}

#endif /* DT_TENSOR_INTERNAL_H */
