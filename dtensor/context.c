/* dtensor/context.c — the per-rank context: its accessors, log lines,
 * failure notes, and the context of the rank this thread runs. dt_launch
 * (launch.c) creates contexts; nothing here picks a backend or transport.
 */
#include "context_internal.h"

#include <stdarg.h>
#include <stdio.h>

#ifdef DT_HAVE_CUDA
#include "backend_cuda.h"
#endif

const char *dt_backend_kind_name(dt_backend_kind kind) {
    switch (kind) {
    case DT_BACKEND_AUTO: return "auto";
    case DT_BACKEND_CPU: return "cpu";
    case DT_BACKEND_CUDA: return "cuda";
    default: return "unknown";
    }
}

const char *dt_check_mode_name(dt_check_mode mode) {
    switch (mode) {
    case DT_CHECK_AUTO: return "auto";
    case DT_CHECK_OFF: return "off";
    case DT_CHECK_ON: return "on";
    default: return "unknown";
    }
}

const char *dt_transport_kind_name(dt_transport_kind kind) {
    switch (kind) {
    case DT_TRANSPORT_AUTO: return "auto";
    case DT_TRANSPORT_LOCAL: return "local";
    case DT_TRANSPORT_NCCL: return "nccl";
    case DT_TRANSPORT_MPI: return "mpi";
    default: return "unknown";
    }
}

int dt_context_rank(const dt_context *ctx) { return ctx ? ctx->rank : -1; }
int dt_context_world_size(const dt_context *ctx) { return ctx ? ctx->world_size : 0; }
dt_backend_kind dt_context_backend(const dt_context *ctx) {
    return ctx ? ctx->backend_kind : DT_BACKEND_AUTO;
}
int dt_context_cuda_device(const dt_context *ctx) {
#ifdef DT_HAVE_CUDA
    if (ctx && ctx->backend_kind == DT_BACKEND_CUDA) return dt_backend_cuda_device(ctx->backend);
#endif
    (void)ctx;
    return -1;
}
void *dt_context_cuda_stream(const dt_context *ctx) {
#ifdef DT_HAVE_CUDA
    if (ctx && ctx->backend_kind == DT_BACKEND_CUDA) return dt_backend_cuda_compute_stream(ctx->backend);
#endif
    (void)ctx;
    return NULL;
}
dt_transport_kind dt_context_transport(const dt_context *ctx) {
    return ctx ? ctx->transport_kind : DT_TRANSPORT_AUTO;
}
long dt_context_timeout_ms(const dt_context *ctx) { return ctx ? ctx->timeout_ms : 0; }
int dt_context_checks(const dt_context *ctx) { return ctx ? ctx->check : 0; }
dt_comm *dt_context_comm(dt_context *ctx) { return ctx ? ctx->comm : NULL; }
dt_status dt_context_last_status(const dt_context *ctx) {
    return ctx ? ctx->last_status : DT_ERR_INVALID_ARGUMENT;
}

static dt_status memory_of(const dt_context *ctx, dt_memory_stats *out, int what, const char *fn) {
    if (!ctx || !out) return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, ctx ? "out" : "ctx");
    if (!ctx->backend->ops->memory) {
        *out = (dt_memory_stats){0, 0, 0, 0};
        return DT_SUCCESS;
    }
    return ctx->backend->ops->memory(ctx->backend, out, what);
}

dt_status dt_context_memory(const dt_context *ctx, dt_memory_stats *out) {
    return memory_of(ctx, out, 0, "dt_context_memory");
}

dt_status dt_context_memory_reset_peak(dt_context *ctx, dt_memory_stats *out) {
    return memory_of(ctx, out, DT_MEMORY_RESET_PEAK, "dt_context_memory_reset_peak");
}

dt_status dt_context_memory_release(dt_context *ctx, dt_memory_stats *out) {
    return dt_context_note(ctx, memory_of(ctx, out, DT_MEMORY_RELEASE, "dt_context_memory_release"));
}

void dt_context_log(const dt_context *ctx, dt_log_level level, const char *fmt, ...) {
    if (!ctx || level > ctx->log_level) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_log_write(ctx->log_level, ctx->rank, level, "%s", msg);
}

/* The context dt_launch passed to the function this thread runs, while it
 * runs (dt_context_current). */
static _Thread_local dt_context *dt_current_ctx;

void dt_context_set_current(dt_context *ctx) { dt_current_ctx = ctx; }

dt_context *dt_context_current(void) {
    return dt_current_ctx;
}

dt_status dt_context_check_dtype(const dt_context *ctx, const char *op, dt_dtype dtype) {
    if (dt_dtype_is_float(dtype)) return DT_SUCCESS;
    return dt_error(DT_ERR_NOT_SUPPORTED, "%s: dtype %s is not supported on the %s backend "
                    "(fp32, bf16, fp16)", op, dt_dtype_name(dtype),
                    ctx ? dt_backend_kind_name(ctx->backend_kind) : "unknown");
}
