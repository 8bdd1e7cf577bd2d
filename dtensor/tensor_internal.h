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

/* A tensor of t's context, mesh and dtype with `shape` (ndim dims) and
 * `layout` (ignored for a local tensor) whose local buffer is t's, shared:
 * the two must hold the same local bytes (DT_ERR_INTERNAL if not). How ops
 * return what is the input's data as it is (a reshape, a redistribution
 * that moves nothing). A tensor that shares its buffer is written only
 * after dt_tensor_own; each frees the buffer's last reference. t and its
 * views belong to one rank. */
dt_status dt_tensor_view(const dt_tensor *t, int ndim, const int64_t *shape,
                         const dt_layout *layout, dt_tensor **out);

/* Makes t's buffer its own before t is written: a copy where another tensor
 * shares it (views stay as they were), nothing otherwise. Errors: the
 * backend's, for the copy's memory; t unchanged then. */
dt_status dt_tensor_own(dt_tensor *t);

/* shape as "[2, 3]" ("[]" for ndim 0) into buf, cut to size: for messages. */
void dt_shape_format(int ndim, const int64_t *shape, char *buf, size_t size);

/* An op's last step: with st DT_SUCCESS hands o to the caller (*out = o),
 * else destroys o; returns st. */
static inline dt_status dt_op_output(dt_status st, dt_tensor *o, dt_tensor **out) {
    if (st == DT_SUCCESS) *out = o;
    else dt_tensor_destroy(o);
    return st;
}

/* ---- gradient outputs of the ops' backward functions (grad.c).
 * A caller's slot (dt_tensor **) is NULL (not wanted), the address of NULL
 * (a new tensor is made and handed over on success) or the address of a
 * tensor the gradient is added into, which must have the gradient's
 * context, mesh, dtype, shape and Layout. */
typedef struct dt_grad {
    dt_tensor **slot;
    dt_tensor *t;         /* what the op writes: the caller's, or the new one */
    int accumulate;       /* 1: add into the caller's tensor */
    /* the gradient's description */
    dt_context *ctx;
    const dt_mesh *mesh;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    dt_layout layout;
} dt_grad;

/* Describes the gradient `name` of `op` and checks the caller's slot
 * against it (touches no value; a tensor to add into gets a buffer of its
 * own, dt_tensor_own). like: a tensor with the gradient's context, mesh and
 * dtype; layout NULL for a local tensor. */
dt_status dt_grad_check(const char *op, const char *name, dt_tensor **slot, const dt_tensor *like,
                        int ndim, const int64_t *shape, const dt_layout *layout, dt_grad *g);
/* Makes g->t where the caller gave none (zeroed if `zero`). */
dt_status dt_grad_make(dt_grad *g, int zero);
/* With st DT_SUCCESS hands a new g->t to the caller, else destroys it. */
dt_status dt_grad_finish(dt_status st, dt_grad *g);

/* dy, the gradient of an output of x's shape (an elementwise op's, a
 * norm's): x's context, mesh, dtype and shape, and x's Layout with Partial
 * read as Replicate; else the error names the redistribution. */
dt_status dt_grad_check_dy(const char *op, const char *xname, const dt_tensor *x,
                           const dt_tensor *dy);

/* `what` (named for messages) must have Layout `want`: DT_SUCCESS, or
 * DT_ERR_NOT_SUPPORTED naming both Layouts and the redistribution that fixes
 * it ("dy [Partial] must be [Replicate]: redistribute dy to [Replicate]"). */
dt_status dt_layout_require(const char *op, const char *what, const dt_tensor *t,
                            const dt_layout *want, const char *why);

#endif /* DT_TENSOR_INTERNAL_H */
