/* dtensor/launch.c — backend/transport selection and dt_launch:
 * N ranks as threads of this process (local or NCCL transport), or one rank
 * per process when a launcher started the program (MPI transport, or NCCL
 * with one GPU per process).
 *
 * Selection (once per launch): explicit options, then DT_BACKEND /
 * DT_TRANSPORT, then automatic. Threads: cuda+nccl when there are at least
 * as many GPUs as ranks (one GPU per rank), cuda+local when there are fewer
 * but at least one (ranks share GPUs: rank r uses device r mod GPUs),
 * cpu+local when there is none. Processes (the launcher's variables are set,
 * see launch_env.h, and world size is 0 or the launcher's; or transport mpi
 * asked for): cuda+nccl when NCCL is built in and the node has a GPU per
 * local rank, else cpu+mpi when mpirun started the process and MPI is built
 * in. A request that cannot be met fails with DT_ERR_NOT_SUPPORTED and the
 * reason. The choice and its reason are logged at info level by rank 0.
 * DT_HAVE_CUDA / DT_HAVE_NCCL / DT_HAVE_MPI appear only here and in the
 * backend/transport files.
 *
 * Failure handling: a rank whose function fails aborts the world, so peers
 * blocked in (or later entering) a collective return DT_ERR_PEER_FAILED at
 * once instead of waiting for the timeout (across processes: a notice over
 * MPI). The world keeps the first failure; dt_launch returns it with its
 * message (as processes, after an exit exchange in which every rank learns
 * every other's outcome, so all return the same).
 *
 * Test: tests/test_context.c, tests/test_launch_env.c, tests/test_mpi.c
 * (make test).
 */
#include "context_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <unistd.h>

#include "launch_env.h"
#include "../collectives/transport_local.h"
#ifdef DT_HAVE_MPI
#include "../collectives/transport_mpi.h"
#endif
#ifdef DT_HAVE_CUDA
#include "backend_cuda.h"
#endif
#ifdef DT_HAVE_NCCL
#include "../collectives/transport_nccl.h"
#endif

/* OpenBLAS's own call: with N ranks as threads, one BLAS thread each. */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
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
    int gpus;               /* visible CUDA devices (0 without CUDA or a driver) */
    int tf32;               /* DT_TF32=1: fp32 gemm may use TF32 on CUDA */
    int process;            /* ranks are processes started by a launcher: one rank here */
    int device;             /* process mode with nccl: this process's GPU */
    dt_launch_env env;      /* what started this process */
    char why[400];          /* how the pair was chosen, for the log */
} launch_config;

/* What this build and machine offer: GPUs (and why none), NCCL, MPI. */
static int count_gpus(char *reason, size_t size) {
#ifdef DT_HAVE_CUDA
    return dt_cuda_device_count(reason, size);
#else
    snprintf(reason, size, "built without CUDA: CUDA=0, or no nvcc + cuBLAS at build time");
    return 0;
#endif
}

static int have_cuda(void) {
#ifdef DT_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

static int have_nccl(void) {
#ifdef DT_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

static int have_mpi(void) {
#ifdef DT_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

static const char *const no_mpi_why = "this library was built without MPI (MPI=0, or no mpicc at "
                                      "build time)";

/* CUDA_VISIBLE_DEVICES names exactly one device: the launcher gave this
 * process its own GPU. */
static int visible_restricted(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    return v && *v && !strchr(v, ',');
}

/* "rank 1 of 4 (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)" */
static void describe_launcher(const dt_launch_env *e, char *buf, size_t size) {
    if (e->size >= 0)
        snprintf(buf, size, "rank %d of %d (%s)", e->rank, e->size, e->source);
    else
        snprintf(buf, size, "rank %d (%s)", e->rank, e->source);
}

/* Ranks are processes: one here, the others started by the launcher.
 * t is MPI, NCCL or AUTO; fills cfg or explains why not. */
static dt_status choose_process_pair(int world, int b, int t, launch_config *cfg) {
    const dt_launch_env *e = &cfg->env;
    char who[160], gpu_why[200] = "not probed (backend cpu asked for)";
    describe_launcher(e, who, sizeof who);
    int asked_b = b != DT_BACKEND_AUTO, asked_t = t != DT_TRANSPORT_AUTO;
    if (world != 0 && e->size >= 0 && world != e->size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: this process was started as %s, but "
                        "dt_launch asks for %d ranks: pass 0 (or %d) to run one rank per process, "
                        "or set DT_TRANSPORT=local to run %d ranks as threads in every process",
                        who, world, e->size, world);
    if (b == DT_BACKEND_CUDA && t == DT_TRANSPORT_MPI)
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport mpi moves host memory; with "
                        "backend cuda use transport nccl");
    if (b == DT_BACKEND_CPU && t == DT_TRANSPORT_NCCL)
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport nccl moves device memory; it "
                        "needs backend cuda, not cpu");
    int gpus = b == DT_BACKEND_CPU || t == DT_TRANSPORT_MPI ? 0 : count_gpus(gpu_why, sizeof gpu_why);
    cfg->gpus = gpus;

    /* NCCL: one GPU per process, picked from the local rank. */
    char nccl_why[400] = "";
    int device = -1;
    if (!have_nccl()) {
        snprintf(nccl_why, sizeof nccl_why, "this library was built without NCCL");
    } else if (!have_cuda()) {
        snprintf(nccl_why, sizeof nccl_why, "this library was built without CUDA");
    } else if (gpus == 0) {
        snprintf(nccl_why, sizeof nccl_why, "no GPU: %s", gpu_why);
    } else if (dt_launch_env_device(e, gpus, visible_restricted(), &device) != DT_SUCCESS) {
        snprintf(nccl_why, sizeof nccl_why, "%s", dt_last_error());
    }
    /* MPI: a launcher that speaks MPI, and MPI built in. */
    const char *mpi_why = !have_mpi() ? no_mpi_why
                          : e->launcher != DT_LAUNCHER_MPI
                              ? "the process was not started by mpirun (no OMPI_COMM_WORLD_SIZE, "
                                "PMI_SIZE or PMIX_RANK)"
                              : "";
    if (t == DT_TRANSPORT_AUTO) {
        if (!nccl_why[0] && b != DT_BACKEND_CPU) t = DT_TRANSPORT_NCCL;
        else if (!mpi_why[0] && b != DT_BACKEND_CUDA) t = DT_TRANSPORT_MPI;
        else
            return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: this process was started as %s, but "
                            "no transport here connects processes: nccl: %s; mpi: %s (or set "
                            "DT_TRANSPORT=local to run ranks as threads in every process)", who,
                            b == DT_BACKEND_CPU ? "backend cpu asked for" : nccl_why,
                            b == DT_BACKEND_CUDA ? "backend cuda asked for" : mpi_why);
    }
    if (t == DT_TRANSPORT_NCCL) {
        if (nccl_why[0])
            return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport nccl across processes (%s): "
                            "%s", who, nccl_why);
        if (e->launcher != DT_LAUNCHER_MPI || !have_mpi()) {
            /* Bootstrap from MASTER_ADDR:MASTER_PORT+1: checked now, used at launch. */
            char id[300];
            DT_TRY(dt_launch_env_nccl_comm_id(e, id, sizeof id));
            if (e->size < 0)
                return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport nccl across processes "
                                "(%s) needs the world size: set WORLD_SIZE", who);
        }
        cfg->backend = DT_BACKEND_CUDA;
        cfg->device = device;
    } else {
        if (mpi_why[0])
            return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport mpi is not available: %s",
                            mpi_why);
        cfg->backend = DT_BACKEND_CPU;
    }
    cfg->transport = (dt_transport_kind)t;
    cfg->process = 1;
    const char *how = asked_b && asked_t ? "as asked" : asked_b || asked_t ? "partly automatic" : "automatic";
    if (t == DT_TRANSPORT_NCCL)
        snprintf(cfg->why, sizeof cfg->why, "%s; one rank per process, %s; GPU %d of %d", how, who,
                 device, gpus);
    else
        snprintf(cfg->why, sizeof cfg->why, "%s; one rank per process, %s", how, who);
    return DT_SUCCESS;
}

/* Picks (backend, transport) for `world` ranks; b and t are AUTO or asked for. */
static dt_status choose_pair(int world, int b, int t, launch_config *cfg) {
    /* Processes: transport mpi, or nccl/auto in a process a launcher started
     * (with world 0 or the launcher's size). */
    int launched = cfg->env.launcher != DT_LAUNCHER_NONE;
    if (t == DT_TRANSPORT_MPI) {
        if (!have_mpi())
            return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport mpi is not available: %s "
                            "(available: local%s)", no_mpi_why, have_nccl() ? ", nccl" : "");
        return choose_process_pair(world, b, t, cfg);
    }
    if (launched && (t == DT_TRANSPORT_AUTO ||
                     (t == DT_TRANSPORT_NCCL && (world == 0 || world == cfg->env.size))))
        return choose_process_pair(world, b, t, cfg);
    if (world == 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: world size 0 means \"as many ranks "
                        "as the launcher started processes\", but %s (give a world size to run "
                        "ranks as threads)", t == DT_TRANSPORT_LOCAL
                            ? "transport local runs ranks as threads of this process"
                            : "this process was not started by a launcher (mpirun, srun, "
                              "torchrun: no OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK or "
                              "RANK/WORLD_SIZE in the environment)");

    char gpu_why[200] = "not probed (backend cpu asked for)";
    /* Asking the driver costs its initialisation: only when a GPU could be used. */
    int gpus = b == DT_BACKEND_CPU && t != DT_TRANSPORT_NCCL ? 0 : count_gpus(gpu_why, sizeof gpu_why);
    cfg->gpus = gpus;
    const char *nccl_why = have_nccl() ? "" : "this library was built without NCCL";
    int asked_b = b != DT_BACKEND_AUTO, asked_t = t != DT_TRANSPORT_AUTO;

    if (t == DT_TRANSPORT_NCCL && !have_nccl())
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport nccl is not available: %s",
                        nccl_why);
    if (b == DT_BACKEND_AUTO) {
        if (t == DT_TRANSPORT_NCCL) b = DT_BACKEND_CUDA;
        else b = gpus > 0 ? DT_BACKEND_CUDA : DT_BACKEND_CPU;
    }
    if (t == DT_TRANSPORT_AUTO) {
        if (b == DT_BACKEND_CUDA && have_nccl() && gpus >= world) t = DT_TRANSPORT_NCCL;
        else t = DT_TRANSPORT_LOCAL;
    }
    if (b == DT_BACKEND_CUDA && !have_cuda())
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: backend cuda is not built into this "
                        "library (%s; available: cpu)", gpu_why);
    if (b == DT_BACKEND_CUDA && gpus == 0)
        return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: backend cuda%s needs a CUDA device, and "
                        "there is none: %s", t == DT_TRANSPORT_NCCL ? " (for transport nccl)" : "",
                        gpu_why);
    if (t == DT_TRANSPORT_NCCL) {
        if (b != DT_BACKEND_CUDA)
            return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport nccl moves device memory; "
                            "it needs backend cuda, not %s", dt_backend_kind_name((dt_backend_kind)b));
        if (world > gpus)
            return dt_error(DT_ERR_NOT_SUPPORTED, "dt_launch: transport nccl needs one GPU per rank: "
                            "%d ranks, %d GPU(s) visible (ranks can share GPUs over transport "
                            "local)", world, gpus);
    }
    cfg->backend = (dt_backend_kind)b;
    cfg->transport = (dt_transport_kind)t;
    const char *how = asked_b && asked_t ? "as asked" : asked_b || asked_t ? "partly automatic" : "automatic";
    if (gpus > 0)
        snprintf(cfg->why, sizeof cfg->why, "%s; %d GPU(s) for %d rank(s)%s%s", how, gpus, world,
                 have_nccl() ? "" : ", ", nccl_why);
    else
        snprintf(cfg->why, sizeof cfg->why, "%s; no GPU: %s", how, gpu_why);
    return DT_SUCCESS;
}

static dt_status resolve_config(int world, const dt_launch_options *opts, launch_config *cfg) {
    dt_launch_options def = DT_LAUNCH_OPTIONS_INIT;
    if (!opts) opts = &def;
    memset(cfg, 0, sizeof *cfg);
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
    const char *copies = getenv("DT_LOCAL_COPIES");
    if (copies && *copies) {
        if (strcmp(copies, "0") != 0 && strcmp(copies, "1") != 0)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "DT_LOCAL_COPIES=%s is not 0 or 1", copies);
        cfg->comm.skip_copies = copies[0] == '0';
    }
    const char *tf32 = getenv("DT_TF32");
    if (tf32 && *tf32) {
        if (strcmp(tf32, "0") != 0 && strcmp(tf32, "1") != 0)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "DT_TF32=%s is not 0 or 1", tf32);
        cfg->tf32 = tf32[0] == '1';
    }

    static const char *const backends[] = {"auto", "cpu", "cuda"};
    static const char *const transports[] = {"auto", "local", "nccl", "mpi"};
    int b = opts->backend, t = opts->transport;
    if (b == DT_BACKEND_AUTO) DT_TRY(env_choice("DT_BACKEND", backends, 3, &b));
    if (t == DT_TRANSPORT_AUTO) DT_TRY(env_choice("DT_TRANSPORT", transports, 4, &t));
    /* Threads asked for: the launcher's variables do not matter. */
    if (t != DT_TRANSPORT_LOCAL) DT_TRY(dt_launch_env_read(NULL, NULL, &cfg->env));
    return choose_pair(world, b, t, cfg);
}

/* The world the ranks share: the local transport's, NCCL's or MPI's (in
 * process mode with NCCL under mpirun, both: MPI bootstraps NCCL, carries
 * failure notices and the exit exchange). */
typedef struct launch_world {
    dt_transport_kind kind;
    dt_local_world *local;
#ifdef DT_HAVE_NCCL
    dt_nccl_world *nccl;
#endif
#ifdef DT_HAVE_MPI
    dt_mpi_world *mpi;
#endif
#ifdef DT_HAVE_CUDA
    dt_cuda_pool *cuda_pool;   /* ranks as threads on CUDA: their caches reclaim each other's */
#endif
} launch_world;

static void world_destroy(launch_world *w);

static dt_status world_create(launch_world *w, int size, const launch_config *cfg) {
    memset(w, 0, sizeof *w);
    w->kind = cfg->transport;
#ifdef DT_HAVE_CUDA
    if (cfg->backend == DT_BACKEND_CUDA) DT_TRY(dt_cuda_pool_create(&w->cuda_pool));
#endif
#ifdef DT_HAVE_NCCL
    if (w->kind == DT_TRANSPORT_NCCL) {
        dt_status st = dt_nccl_world_create(size, &cfg->comm, &w->nccl);
        if (st != DT_SUCCESS) world_destroy(w);
        return st;
    }
#endif
    dt_status st = dt_local_world_create(size, &cfg->comm, &w->local);
    if (st != DT_SUCCESS) world_destroy(w);
    return st;
}

static void world_abort(launch_world *w, int rank, dt_status st, const char *msg) {
#ifdef DT_HAVE_NCCL
    if (w->nccl) {
        /* In process mode under mpirun it also notifies through MPI. */
        dt_nccl_world_abort(w->nccl, rank, st, msg);
        return;
    }
#endif
#ifdef DT_HAVE_MPI
    if (w->mpi) {
        dt_mpi_world_abort(w->mpi, st, msg);
        return;
    }
#endif
    dt_local_world_abort(w->local, rank, st, msg);
}

static dt_status world_first_failure(launch_world *w, int *rank, char *msg, size_t size) {
#ifdef DT_HAVE_NCCL
    if (w->kind == DT_TRANSPORT_NCCL) return dt_nccl_world_first_failure(w->nccl, rank, msg, size);
#endif
    return dt_local_world_first_failure(w->local, rank, msg, size);
}

static void world_destroy(launch_world *w) {
#ifdef DT_HAVE_NCCL
    dt_nccl_world_destroy(w->nccl);
#endif
#ifdef DT_HAVE_MPI
    dt_mpi_world_destroy(w->mpi);
#endif
    dt_local_world_destroy(w->local);
#ifdef DT_HAVE_CUDA
    dt_cuda_pool_destroy(w->cuda_pool);
#endif
    memset(w, 0, sizeof *w);
}

/* ------------------------------------------------------------- launch */

typedef struct rank_job {
    launch_world *world;
    const launch_config *cfg;
    int rank, world_size;
    int device;             /* cuda: the rank's GPU */
    int device_ranks;       /* cuda: the launch's ranks on that GPU, this one included */
    dt_rank_fn fn;
    void *arg;
    dt_status status;
    char msg[1200];         /* the failure, prefixed with the rank */
} rank_job;

#if defined(DT_HAVE_CUDA) && defined(DT_HAVE_NCCL)
/* The CUDA backend's abort poll (see dt_backend_cuda_set_abort_poll). */
static int comm_aborted(void *comm) { return dt_comm_aborted(comm); }
#endif

static void context_destroy(dt_context *ctx) {
    if (!ctx) return;
#ifdef DT_HAVE_CUDA
    /* The poll reads the communicator: unhook it before it goes. */
    if (ctx->backend && dt_backend_is_cuda(ctx->backend))
        dt_backend_cuda_set_abort_poll(ctx->backend, NULL, NULL);
#endif
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
    dt_status st = DT_SUCCESS;
    /* The backend first: the communicator keeps its memory hooks (and, for
     * NCCL, its device and streams). Destroyed in the reverse order. */
    const dt_mem *mem = NULL;
#ifdef DT_HAVE_CUDA
    dt_mem cuda_mem;
    if (ctx->backend_kind == DT_BACKEND_CUDA) {
        dt_cuda_options o = {job->device, ctx->timeout_ms, job->cfg->tf32,
                             job->world->cuda_pool, job->device_ranks};
        DT_TRY_GOTO(st, dt_backend_cuda_create(job->rank, &o, &ctx->backend), fail);
        cuda_mem = dt_backend_cuda_mem(ctx->backend);
        mem = &cuda_mem;
    }
#endif
    if (ctx->backend_kind == DT_BACKEND_CPU)
        DT_TRY_GOTO(st, dt_backend_cpu_create(job->rank, &ctx->backend), fail);
    if (!ctx->backend) {
        st = dt_error(DT_ERR_INTERNAL, "rank %d: backend %s is not built in", job->rank,
                      dt_backend_kind_name(ctx->backend_kind));
        goto fail;
    }
#ifdef DT_HAVE_NCCL
    if (ctx->transport_kind == DT_TRANSPORT_NCCL) {
        dt_nccl_rank r = {dt_backend_cuda_device(ctx->backend),
                          dt_backend_cuda_compute_stream(ctx->backend),
                          dt_backend_cuda_comm_stream(ctx->backend), *mem};
        DT_TRY_GOTO(st, dt_nccl_world_comm(job->world->nccl, job->rank, &r, &ctx->comm), fail);
        /* A peer's failure leaves NCCL kernels, and the streams behind them,
         * waiting: backend waits give up once the world is aborted. */
        dt_backend_cuda_set_abort_poll(ctx->backend, comm_aborted, ctx->comm);
    }
#endif
#ifdef DT_HAVE_MPI
    if (ctx->transport_kind == DT_TRANSPORT_MPI)
        DT_TRY_GOTO(st, dt_mpi_world_comm(job->world->mpi, mem, &ctx->comm), fail);
#endif
    if (ctx->transport_kind == DT_TRANSPORT_LOCAL)
        DT_TRY_GOTO(st, dt_local_world_comm(job->world->local, job->rank, mem, &ctx->comm), fail);
    if (!ctx->comm) {
        st = dt_error(DT_ERR_INTERNAL, "rank %d: transport %s is not built in", job->rank,
                      dt_transport_kind_name(ctx->transport_kind));
        goto fail;
    }
    *out = ctx;
    return DT_SUCCESS;
fail:
    context_destroy(ctx);
    return st;
}

/* job->msg := the current message, prefixed with the rank once. */
static void note_failure(rank_job *job, dt_status st) {
    const char *e = dt_last_error();
    char prefix[32];
    snprintf(prefix, sizeof prefix, "rank %d", job->rank);
    /* Library messages already start with the rank; user ones may not. */
    if (strncmp(e, prefix, strlen(prefix)) == 0)
        snprintf(job->msg, sizeof job->msg, "%s", e);
    else
        snprintf(job->msg, sizeof job->msg, "%s: %s", prefix, *e ? e : dt_status_name(st));
}

/* One rank: its context, its function, and on failure the world's abort. */
static dt_status run_rank(rank_job *job) {
    dt_context *ctx = NULL;
    dt_clear_error();
    dt_status st = context_create(job, &ctx);
    if (st == DT_SUCCESS) {
        if (job->rank == 0)
            dt_context_log(ctx, DT_LOG_INFO, "launch: %d ranks, backend %s, transport %s (%s), "
                           "timeout %ld ms, checks %s%s", job->world_size,
                           dt_backend_kind_name(ctx->backend_kind),
                           dt_transport_kind_name(ctx->transport_kind), job->cfg->why,
                           ctx->timeout_ms, ctx->check ? "on" : "off",
                           ctx->backend_kind == DT_BACKEND_CUDA && job->cfg->tf32 ? ", TF32 on" : "");
        dt_context *outer = dt_context_current();   /* a launch within a rank's function */
        dt_context_set_current(ctx);
        st = job->fn(ctx, job->arg);
        dt_context_set_current(outer);
    }
    if (st != DT_SUCCESS) {
        note_failure(job, st);
        world_abort(job->world, job->rank, st, job->msg);
    }
    context_destroy(ctx);
    job->status = st;
    return st;
}

static void *rank_main(void *p) {
    run_rank(p);
    return NULL;
}

/* OpenBLAS threads for one rank per process: the cores of the node shared
 * by its processes. */
static void share_blas_threads(const dt_launch_env *e) {
    if (e->local_size <= 1) return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long n = cores > 0 ? cores / e->local_size : 1;
    openblas_set_num_threads(n > 0 ? (int)n : 1);
}

/* Ranks are processes: this one runs fn once for its own rank. */
static dt_status launch_process(int world_size, dt_rank_fn fn, void *arg, const launch_config *cfg) {
    launch_world wstore, *world = &wstore;
    memset(world, 0, sizeof *world);
    world->kind = cfg->transport;
    int rank = cfg->env.rank, size = cfg->env.size;
    dt_status st = DT_SUCCESS;
    char msg[1200] = "";
#ifdef DT_HAVE_MPI
    int use_mpi = cfg->transport == DT_TRANSPORT_MPI || cfg->env.launcher == DT_LAUNCHER_MPI;
    if (use_mpi) {
        DT_TRY(dt_mpi_init(cfg->comm.timeout_ms, &rank, &size));
        DT_TRY(dt_mpi_world_create(&cfg->comm, &world->mpi));
        /* This process's own checks, agreed with the others before any
         * rank runs: a process that cannot go on fails them all at once. */
        if (world_size != 0 && world_size != size)
            st = dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: world size %d, but MPI_COMM_WORLD "
                          "has %d processes: pass 0 (or %d) to run one rank per process, or set "
                          "DT_TRANSPORT=local to run %d ranks as threads in every process",
                          world_size, size, size, world_size);
        else if (cfg->env.rank >= 0 && cfg->env.rank != rank)
            st = dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: the launcher says rank %d (%s) "
                          "but MPI says rank %d", cfg->env.rank, cfg->env.source, rank);
        char verdict[1200];
        snprintf(msg, sizeof msg, "rank %d: %s", rank, st != DT_SUCCESS ? dt_last_error() : "");
        dt_status agreed = dt_mpi_world_agree(world->mpi, st, msg, verdict, sizeof verdict);
        if (agreed != DT_SUCCESS) {
            world_destroy(world);
            return st != DT_SUCCESS ? dt_error(st, "%s", msg) : dt_error(agreed, "%s", verdict);
        }
    }
#endif
    if (size < 1 || rank < 0 || rank >= size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: the launcher gave no usable rank and "
                        "size (rank %d of %d, %s)", rank, size, cfg->env.source);
    if (world_size != 0 && world_size != size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: world size %d, but the launcher "
                        "started %d processes (%s)", world_size, size, cfg->env.source);
#ifdef DT_HAVE_NCCL
    if (cfg->transport == DT_TRANSPORT_NCCL) {
        const void *idp = NULL;
        dt_peer_channel ch = {NULL, NULL, NULL};
#ifdef DT_HAVE_MPI
        struct {
            int32_t status;
            char msg[500];
            unsigned char id[DT_NCCL_ID_BYTES];
        } boot;
        if (world->mpi) {
            /* Rank 0 takes the id and MPI broadcasts it with its status:
             * every rank joins the broadcast, so a failure on rank 0 leaves
             * the world's collectives in step and every rank learns it at
             * once. */
            memset(&boot, 0, sizeof boot);
            if (rank == 0 && (st = dt_nccl_unique_id(boot.id, sizeof boot.id)) != DT_SUCCESS) {
                boot.status = (int32_t)st;
                snprintf(boot.msg, sizeof boot.msg, "%s", dt_last_error());
            }
            dt_status bst = dt_mpi_world_bcast(world->mpi, &boot, sizeof boot, 0);
            if (bst != DT_SUCCESS) {
                st = bst;
            } else if (boot.status != DT_SUCCESS && rank != 0) {
                boot.msg[sizeof boot.msg - 1] = '\0';
                st = dt_error(DT_ERR_PEER_FAILED, "dt_launch: rank 0 could not make the NCCL "
                              "id: %s", boot.msg);
            }
            idp = boot.id;
            ch = dt_mpi_world_channel(world->mpi);
        }
#endif
        if (st == DT_SUCCESS && !idp && !getenv("NCCL_COMM_ID")) {
            /* NCCL bootstraps from NCCL_COMM_ID: rank 0 listens there. */
            char addr[300];
            st = dt_launch_env_nccl_comm_id(&cfg->env, addr, sizeof addr);
            if (st == DT_SUCCESS && setenv("NCCL_COMM_ID", addr, 1) != 0)
                st = dt_error(DT_ERR_SYSTEM, "dt_launch: cannot set NCCL_COMM_ID=%s", addr);
        }
        if (st == DT_SUCCESS)
            st = dt_nccl_world_create_process(size, idp, &cfg->comm, ch.poll ? &ch : NULL,
                                              &world->nccl);
        if (st != DT_SUCCESS) {
            snprintf(msg, sizeof msg, "rank %d: %s", rank, dt_last_error());
#ifdef DT_HAVE_MPI
            if (world->mpi) dt_mpi_world_abort(world->mpi, st, msg);
#endif
        }
    }
#endif
    if (st == DT_SUCCESS) {
        share_blas_threads(&cfg->env);
        rank_job job = {world, cfg, rank, size, cfg->device, 1, fn, arg, DT_SUCCESS, ""};
        st = run_rank(&job);
        if (st != DT_SUCCESS) snprintf(msg, sizeof msg, "%s", job.msg);
    }
#ifdef DT_HAVE_MPI
    if (world->mpi) {
        /* Every rank learns how the launch went, so all return the same. */
        char verdict[1200];
        dt_status fin = dt_mpi_world_finish(world->mpi, st, msg, verdict, sizeof verdict);
        world_destroy(world);
        if (fin != DT_SUCCESS) return dt_error(fin, "%s", verdict);
        return DT_SUCCESS;
    }
#endif
    /* Without MPI (NCCL from MASTER_ADDR): this process's own outcome. */
    world_destroy(world);
    if (st != DT_SUCCESS) return dt_error(st, "%s", msg);
    return DT_SUCCESS;
}

#ifdef DT_HAVE_MPI
/* A process that mpirun started (one rank per process, world size 0) but
 * whose own configuration is bad: it still starts MPI and joins the start
 * agreement, so that every process returns its failure at once instead of
 * waiting for it; then it returns `st` with its message. */
static dt_status launch_refused_process(dt_status st) {
    char msg[1200];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    dt_launch_env env;
    if (dt_launch_env_read(NULL, NULL, &env) != DT_SUCCESS || env.launcher != DT_LAUNCHER_MPI)
        return dt_error(st, "%s", msg);
    dt_comm_config comm;
    memset(&comm, 0, sizeof comm);
    comm.timeout_ms = DT_DEFAULT_TIMEOUT_MS;   /* DT_TIMEOUT_MS may be what is bad */
    comm.log_level = dt_log_level_from_env();
    const char *v = getenv("DT_TIMEOUT_MS");
    char *end = NULL;
    long ms = v && *v ? strtol(v, &end, 10) : 0;
    if (v && *v && end && !*end && ms > 0) comm.timeout_ms = ms;
    int rank = -1, size = 0;
    dt_mpi_world *w = NULL;
    if (dt_mpi_init(comm.timeout_ms, &rank, &size) == DT_SUCCESS &&
        dt_mpi_world_create(&comm, &w) == DT_SUCCESS) {
        char full[1300], verdict[1200];
        snprintf(full, sizeof full, "rank %d: %s", rank, msg);
        (void)dt_mpi_world_agree(w, st, full, verdict, sizeof verdict);
        dt_mpi_world_destroy(w);
        return dt_error(st, "%s", full);
    }
    return dt_error(st, "%s", msg);
}
#endif

dt_status dt_launch(int world_size, dt_rank_fn fn, void *arg, const dt_launch_options *opts) {
    if (world_size < 0 || world_size > DT_MAX_WORLD_SIZE)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: world size %d is outside [0, %d] "
                        "(0: one rank per process a launcher started)", world_size,
                        DT_MAX_WORLD_SIZE);
    if (!fn) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_launch: rank function is NULL");
    launch_config cfg;
    dt_status cst = resolve_config(world_size, opts, &cfg);
#ifdef DT_HAVE_MPI
    if (cst != DT_SUCCESS && world_size == 0) return launch_refused_process(cst);
#endif
    DT_TRY(cst);
    if (cfg.process) return launch_process(world_size, fn, arg, &cfg);

    launch_world wstore, *world = &wstore;
    DT_TRY(world_create(world, world_size, &cfg));
    rank_job *jobs = calloc((size_t)world_size, sizeof *jobs);
    pthread_t *threads = calloc((size_t)world_size, sizeof *threads);
    if (!jobs || !threads) {
        free(jobs);
        free(threads);
        world_destroy(world);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: out of memory for %d ranks", world_size);
    }
    /* N ranks as threads: one BLAS thread each, for this launch only. */
    int blas_threads = openblas_get_num_threads();
    if (world_size > 1) openblas_set_num_threads(1);

    int started = 0;
    dt_status st = DT_SUCCESS;
    /* CUDA: the ranks take the GPUs in turn, rank r GPU r mod gpus */
    const int gpus = cfg.gpus > 0 ? cfg.gpus : 1;
    for (; started < world_size; started++) {
        const int device = started % gpus;
        const int device_ranks = world_size / gpus + (device < world_size % gpus);
        jobs[started] = (rank_job){world, &cfg, started, world_size, device, device_ranks,
                                   fn, arg, DT_SUCCESS, ""};
        int rc = pthread_create(&threads[started], NULL, rank_main, &jobs[started]);
        if (rc != 0) {
            char msg[256];
            snprintf(msg, sizeof msg, "dt_launch: cannot start the thread of rank %d of %d: %s",
                     started, world_size, strerror(rc));
            world_abort(world, started, DT_ERR_SYSTEM, msg);
            break;
        }
    }
    for (int r = 0; r < started; r++) pthread_join(threads[r], NULL);
    if (world_size > 1) openblas_set_num_threads(blas_threads);

    int rank = -1;
    char msg[1024];
    st = world_first_failure(world, &rank, msg, sizeof msg);
    if (st != DT_SUCCESS) dt_error(st, "%s", msg);
    free(jobs);
    free(threads);
    world_destroy(world);
    return st;
}

dt_status dt_finalize(void) {
#ifdef DT_HAVE_MPI
    return dt_mpi_finalize();
#else
    return DT_SUCCESS;
#endif
}

