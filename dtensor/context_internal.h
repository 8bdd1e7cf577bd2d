/* dtensor/context_internal.h — PRIVATE. The context's fields and failure
 * notes, for the tensor layer and above (ops reach the backend through it). */
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
/* Sets it for this thread (dt_launch, around the rank's function). */
void dt_context_set_current(dt_context *ctx);

#endif /* DT_CONTEXT_INTERNAL_H */
