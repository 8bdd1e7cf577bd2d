/* dtensor/context.c — contexts, backend/transport selection, and dt_launch
 * (N ranks as threads of this process over the local transport).
 *
 * Failure handling: a rank whose function fails aborts the world, so peers
 * blocked in (or later entering) a collective return DT_ERR_PEER_FAILED at
 * once instead of waiting for the timeout. The world keeps the first failure;
 * dt_launch returns it with its message.
 *
 * Test: tests/test_context.c (make test).
 */
#include "context_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../collectives/transport_local.h"

/* OpenBLAS's own call: with N ranks as threads, one BLAS thread each. */
void openblas_set_num_threads(int num_threads);

const char *dt_backend_kind_name(dt_backend_kind kind) {
    switch (kind) {
    case DT_BACKEND_AUTO: return "auto";
    case DT_BACKEND_CPU: return "cpu";
    case DT_BACKEND_CUDA: return "cuda";
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
dt_transport_kind dt_context_transport(const dt_context *ctx) {
    return ctx ? ctx->transport_kind : DT_TRANSPORT_AUTO;
}
long dt_context_timeout_ms(const dt_context *ctx) { return ctx ? ctx->timeout_ms : 0; }
int dt_context_checks(const dt_context *ctx) { return ctx ? ctx->check : 0; }
dt_comm *dt_context_comm(dt_context *ctx) { return ctx ? ctx->comm : NULL; }
dt_status dt_context_last_status(const dt_context *ctx) {
    return ctx ? ctx->last_status : DT_ERR_INVALID_ARGUMENT;
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

/* ---------------------------------------------------------- selection */

/* Parse an enum from the environment: names[i] for i in [1, count). */
static dt_status env_choice(const char *var, const char *const *names, int count, int *out) {
    const char *v = getenv(var);
    *out = 0;
    if (!v || !*v) return DT_SUCCESS;
    for (int i = 0; i < count; i++)
        if (strcasecmp(v, names[i]) == 0) {
            *out = i;
            return DT_SUCCESS;
        }
    char list[128] = "";
    for (int i = 0; i < count; i++) {
        strncat(list, names[i], sizeof list - strlen(list) - 1);
        if (i + 1 < count) strncat(list, "|", sizeof list - strlen(list) - 1);
    }
    return dt_error(DT_ERR_INVALID_ARGUMENT, "%s=%s is not one of %s", var, v, list);
}

typedef struct launch_config {
    dt_backend_kind backend;
    dt_transport_kind transport;
    dt_comm_config comm;
} launch_config;

static dt_status resolve_config(const dt_launch_options *opts, launch_config *cfg) {
    dt_launch_options def = DT_LAUNCH_OPTIONS_INIT;
    if (!opts) opts = &def;
    if ((int)opts->backend < 0 || opts->backend >= DT_BACKEND_KIND_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: unknown backend %d", (int)opts->backend);
    if ((int)opts->transport < 0 || opts->transport >= DT_TRANSPORT_KIND_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: unknown transport %d",
                        (int)opts->transport);
    if (opts->timeout_ms < 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: timeout_ms %ld < 0", opts->timeout_ms);

    cfg->comm.log_level = dt_log_level_from_env();
#ifdef DT_DEBUG
    cfg->comm.check = 1;
#else
    cfg->comm.check = 0;
#endif
    if ((int)opts->checks < 0 || opts->checks >= DT_CHECK_MODE_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: unknown check mode %d",
                        (int)opts->checks);
    const char *chk = getenv("DT_CHECK");
    if (opts->checks != DT_CHECK_AUTO) {
        cfg->comm.check = opts->checks == DT_CHECK_ON;
    } else if (chk && *chk) {
        if (strcmp(chk, "0") != 0 && strcmp(chk, "1") != 0)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "DT_CHECK=%s is not 0 or 1", chk);
        cfg->comm.check = chk[0] == '1';
    }
    cfg->comm.timeout_ms = opts->timeout_ms;
    if (cfg->comm.timeout_ms == 0) {
        const char *v = getenv("DT_TIMEOUT_MS");
        cfg->comm.timeout_ms = DT_DEFAULT_TIMEOUT_MS;
        if (v && *v) {
            char *end = NULL;
            errno = 0;
            long ms = strtol(v, &end, 10);
            if (errno || end == v || *end || ms <= 0)
                return dt_error(DT_ERR_INVALID_ARGUMENT,
                                "DT_TIMEOUT_MS=%s is not a positive number of milliseconds", v);
            cfg->comm.timeout_ms = ms;
        }
    }

    static const char *const backends[] = {"auto", "cpu", "cuda"};
    static const char *const transports[] = {"auto", "local", "nccl", "mpi"};
    int b = opts->backend, t = opts->transport;
    if (b == DT_BACKEND_AUTO) DT_TRY(env_choice("DT_BACKEND", backends, 3, &b));
    if (t == DT_TRANSPORT_AUTO) DT_TRY(env_choice("DT_TRANSPORT", transports, 4, &t));
    /* This build has the CPU backend and the local transport. */
    if (b == DT_BACKEND_AUTO) b = DT_BACKEND_CPU;
    if (t == DT_TRANSPORT_AUTO) t = DT_TRANSPORT_LOCAL;
    if (b != DT_BACKEND_CPU)
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: backend %s is not built into this "
                        "library (available: cpu)", dt_backend_kind_name((dt_backend_kind)b));
    if (t != DT_TRANSPORT_LOCAL)
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport %s is not built into this "
                        "library (available: local)", dt_transport_kind_name((dt_transport_kind)t));
    cfg->backend = (dt_backend_kind)b;
    cfg->transport = (dt_transport_kind)t;
    return DT_SUCCESS;
}

/* ------------------------------------------------------------- launch */

typedef struct rank_job {
    dt_local_world *world;
    const launch_config *cfg;
    int rank, world_size;
    dt_rank_fn fn;
    void *arg;
    dt_status status;
} rank_job;

static void context_destroy(dt_context *ctx) {
    if (!ctx) return;
    dt_comm_destroy(ctx->comm);
    if (ctx->backend) ctx->backend->ops->destroy(ctx->backend);
    free(ctx);
}

static dt_status context_create(const rank_job *job, dt_context **out) {
    dt_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: out of memory for a context",
                              job->rank);
    ctx->rank = job->rank;
    ctx->world_size = job->world_size;
    ctx->backend_kind = job->cfg->backend;
    ctx->transport_kind = job->cfg->transport;
    ctx->timeout_ms = job->cfg->comm.timeout_ms;
    ctx->log_level = job->cfg->comm.log_level;
    ctx->check = job->cfg->comm.check;
    dt_status st;
    DT_TRY_GOTO(st, dt_local_world_comm(job->world, job->rank, &ctx->comm), fail);
    DT_TRY_GOTO(st, dt_backend_cpu_create(job->rank, &ctx->backend), fail);
    *out = ctx;
    return DT_SUCCESS;
fail:
    context_destroy(ctx);
    return st;
}

static void *rank_main(void *p) {
    rank_job *job = p;
    dt_context *ctx = NULL;
    dt_clear_error();
    dt_status st = context_create(job, &ctx);
    if (st == DT_SUCCESS) {
        if (job->rank == 0)
            dt_context_log(ctx, DT_LOG_INFO, "launch: %d ranks, backend %s, transport %s, "
                           "timeout %ld ms, checks %s", job->world_size,
                           dt_backend_kind_name(ctx->backend_kind),
                           dt_transport_kind_name(ctx->transport_kind), ctx->timeout_ms,
                           ctx->check ? "on" : "off");
        st = job->fn(ctx, job->arg);
    }
    if (st != DT_SUCCESS) {
        char msg[1200];
        const char *e = dt_last_error();
        char prefix[32];
        snprintf(prefix, sizeof prefix, "rank %d", job->rank);
        /* Library messages already start with the rank; user ones may not. */
        if (strncmp(e, prefix, strlen(prefix)) == 0)
            snprintf(msg, sizeof msg, "%s", e);
        else
            snprintf(msg, sizeof msg, "%s: %s", prefix, *e ? e : dt_status_name(st));
        dt_local_world_abort(job->world, job->rank, st, msg);
    }
    context_destroy(ctx);
    job->status = st;
    return NULL;
}

dt_status dt_launch(int world_size, dt_rank_fn fn, void *arg, const dt_launch_options *opts) {
    if (world_size < 1 || world_size > DT_MAX_WORLD_SIZE)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: world size %d is outside [1, %d]",
                        world_size, DT_MAX_WORLD_SIZE);
    if (!fn) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: rank function is NULL");
    launch_config cfg;
    DT_TRY(resolve_config(opts, &cfg));

    dt_local_world *world = NULL;
    DT_TRY(dt_local_world_create(world_size, &cfg.comm, &world));
    rank_job *jobs = calloc((size_t)world_size, sizeof *jobs);
    pthread_t *threads = calloc((size_t)world_size, sizeof *threads);
    if (!jobs || !threads) {
        free(jobs);
        free(threads);
        dt_local_world_destroy(world);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: out of memory for %d ranks", world_size);
    }
    if (world_size > 1) openblas_set_num_threads(1);

    int started = 0;
    dt_status st = DT_SUCCESS;
    for (; started < world_size; started++) {
        jobs[started] = (rank_job){world, &cfg, started, world_size, fn, arg, DT_SUCCESS};
        int rc = pthread_create(&threads[started], NULL, rank_main, &jobs[started]);
        if (rc != 0) {
            char msg[256];
            snprintf(msg, sizeof msg, "dt_launch: cannot start the thread of rank %d of %d: %s",
                     started, world_size, strerror(rc));
            dt_local_world_abort(world, started, DT_ERR_SYSTEM, msg);
            break;
        }
    }
    for (int r = 0; r < started; r++) pthread_join(threads[r], NULL);

    int rank = -1;
    char msg[1024];
    st = dt_local_world_first_failure(world, &rank, msg, sizeof msg);
    if (st != DT_SUCCESS) dt_error(st, "%s", msg);
    free(jobs);
    free(threads);
    dt_local_world_destroy(world);
    return st;
}
