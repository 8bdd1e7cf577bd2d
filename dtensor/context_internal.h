/* dtensor/context_internal.h — PRIVATE. The context's fields, for the
 * dtensor/ layer (tensors, primitives and ops reach the backend through it). */
#ifndef DT_CONTEXT_INTERNAL_H
#define DT_CONTEXT_INTERNAL_H

#include "backend.h"
#include "context.h"
#include "tensor.h"

struct dt_context {
    int rank, world_size;
    dt_backend_kind backend_kind;
    dt_transport_kind transport_kind;
    long timeout_ms;
    dt_log_level log_level;
    int check;              /* DT_CHECK: cross-rank agreement checks before collective calls */
    dt_comm *comm;          /* world communicator, owned */
    dt_backend *backend;    /* owned */
    dt_status last_status;
};

/* DT_SUCCESS if ctx's backend computes `dtype` (every backend computes
 * fp32, bf16 and fp16), else DT_ERR_NOT_SUPPORTED naming op. The one rule
 * the dtensor layer's ops, primitives and attention apply. */
dt_status dt_context_check_dtype(const dt_context *ctx, const char *op, dt_dtype dtype);

/* Record `st` as the context's last status (if it is a failure) and make
 * sure the message names the rank ("rank 3: ..."); returns st. Public
 * functions of the dtensor layer end with it. */
dt_status dt_context_note_failure(dt_context *ctx, dt_status st);
static inline dt_status dt_context_note(dt_context *ctx, dt_status st) {
    return st == DT_SUCCESS || !ctx ? st : dt_context_note_failure(ctx, st);
}

/* The context of the rank this thread runs (the one dt_launch passed to
 * its function, while that runs), or NULL: other threads, and outside
 * dt_launch. dt_context_check_call's context where the call has none. */
dt_context *dt_context_current(void);

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

#endif /* DT_CONTEXT_INTERNAL_H */
