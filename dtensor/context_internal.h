/* dtensor/context_internal.h — PRIVATE. The context's fields, for the
 * dtensor/ layer (tensors, primitives and ops reach the backend through it). */
#ifndef DT_CONTEXT_INTERNAL_H
#define DT_CONTEXT_INTERNAL_H

#include "backend.h"
#include "context.h"

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

/* Record `st` as the context's last status (if it is a failure); returns st. */
static inline dt_status dt_context_note(dt_context *ctx, dt_status st) {
    if (st != DT_SUCCESS && ctx) ctx->last_status = st;
    return st;
}

#endif /* DT_CONTEXT_INTERNAL_H */
