/* dtensor/context.h — ranks, their contexts, and launching them.
 *
 * SPMD: every rank runs the same function with its own dt_context (rank, world
 * size, backend, world communicator), created before and destroyed after fn;
 * fn must not keep it. Ranks are threads of this process (dt_launch(N, ...):
 * local transport, or NCCL with one GPU per thread), or processes started by a
 * launcher (mpirun, srun, torchrun): each calls dt_launch(0 or N, ...) and runs
 * fn for its own rank (mpi on CPU, nccl on CUDA with one GPU per process).
 * dt_launch initialises MPI if nobody has; call dt_finalize() at the end.
 *
 * Environment (read by dt_launch; explicit options win):
 *   DT_TIMEOUT_MS   bound on every wait, default 600000 (10 minutes)
 *   DT_LOG          error | warn | info | debug (default warn)
 *   DT_BACKEND      cpu | cuda            (when options say AUTO)
 *   DT_TRANSPORT    local | nccl | mpi    (when options say AUTO)
 *   DT_CHECK        0 | 1: check cross-rank agreement before every collective
 *                   call (one small all_gather; default 1 in DEBUG builds)
 *   DT_LOCAL_COPIES 1 | 0: 0 makes local p2p move no data (benchmarks only;
 *                   results are wrong, a warning says so); default 1
 * and the launcher's (dtensor/launch_env.h). Under a launcher, AUTO picks
 * cuda+nccl with a GPU per local rank, else cpu+mpi under mpirun, else fails
 * saying why. NCCL bootstraps over MPI, else from NCCL_COMM_ID (default
 * MASTER_ADDR:MASTER_PORT+1). With threads, OpenBLAS runs one thread per call.
 *
 * Test: tests/test_context.c, tests/test_launch_env.c, tests/test_mpi.c.
 */
#ifndef DT_CONTEXT_H
#define DT_CONTEXT_H

#include <stdint.h>

#include "../base/log.h"
#include "../base/status.h"
#include "../collectives/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest world size dt_launch accepts (threads or processes). */
#define DT_MAX_WORLD_SIZE 1024
/* Default bound on every wait, in milliseconds. */
#define DT_DEFAULT_TIMEOUT_MS 600000L

typedef struct dt_context dt_context;

typedef enum dt_backend_kind {
    DT_BACKEND_AUTO = 0,
    DT_BACKEND_CPU,
    DT_BACKEND_CUDA,
    DT_BACKEND_KIND_COUNT
} dt_backend_kind;

typedef enum dt_transport_kind {
    DT_TRANSPORT_AUTO = 0,
    DT_TRANSPORT_LOCAL,
    DT_TRANSPORT_NCCL,
    DT_TRANSPORT_MPI,
    DT_TRANSPORT_KIND_COUNT
} dt_transport_kind;

const char *dt_backend_kind_name(dt_backend_kind kind);
const char *dt_transport_kind_name(dt_transport_kind kind);

typedef enum dt_check_mode {
    DT_CHECK_AUTO = 0,   /* DT_CHECK from the environment, else on in DEBUG builds */
    DT_CHECK_OFF,
    DT_CHECK_ON,         /* every collective call first checks cross-rank agreement */
    DT_CHECK_MODE_COUNT
} dt_check_mode;

/* "auto", "off", "on"; "unknown" otherwise. */
const char *dt_check_mode_name(dt_check_mode mode);

typedef struct dt_launch_options {
    dt_backend_kind backend;      /* AUTO: DT_BACKEND, else the best available */
    dt_transport_kind transport;  /* AUTO: DT_TRANSPORT, else the best available */
    long timeout_ms;              /* 0: DT_TIMEOUT_MS, else DT_DEFAULT_TIMEOUT_MS */
    dt_check_mode checks;         /* AUTO: DT_CHECK, else on in DEBUG builds */
} dt_launch_options;

#define DT_LAUNCH_OPTIONS_INIT { DT_BACKEND_AUTO, DT_TRANSPORT_AUTO, 0, DT_CHECK_AUTO }

/* The per-rank function. Return DT_SUCCESS, or a failure (with dt_error) to
 * abort the launch: peers blocked in collectives then return
 * DT_ERR_PEER_FAILED instead of waiting. */
typedef dt_status (*dt_rank_fn)(dt_context *ctx, void *arg);

/* Run fn on world_size ranks (1..DT_MAX_WORLD_SIZE threads; under a launcher 0
 * or its size: this process's rank) and block until all return. DT_SUCCESS, or
 * the first failing rank's status and message (dt_last_error). opts may be NULL.
 * As processes it is COLLECTIVE: every process calls it as often and returns the
 * same status (the lowest rank whose failure was its own). Never exits. */
dt_status dt_launch(int world_size, dt_rank_fn fn, void *arg,
                    const dt_launch_options *opts);

/* Once at the end of main: MPI_Finalize if dt_launch initialised MPI (waits,
 * bounded, for every process), else nothing. No MPI dt_launch may follow. */
dt_status dt_finalize(void);

int dt_context_rank(const dt_context *ctx);
int dt_context_world_size(const dt_context *ctx);
dt_backend_kind dt_context_backend(const dt_context *ctx);
dt_transport_kind dt_context_transport(const dt_context *ctx);
long dt_context_timeout_ms(const dt_context *ctx);
/* 1 if collective calls first check that all ranks agree (DT_CHECK=1, and
 * by default in DEBUG builds). */
int dt_context_checks(const dt_context *ctx);
/* The world communicator; owned by the context. */
dt_comm *dt_context_comm(dt_context *ctx);
/* CUDA device index and compute stream (cudaStream_t) on which the library
 * queues all of the rank's work in call order; the caller's kernels queued
 * there from the rank's thread are ordered with it (dt_tensor_get_local waits
 * for it). CPU backend: -1 and NULL, every call done when it returns. */
int dt_context_cuda_device(const dt_context *ctx);
void *dt_context_cuda_stream(const dt_context *ctx);
/* The status of the last failing library call made with this context. */
dt_status dt_context_last_status(const dt_context *ctx);

/* The rank's backend memory (tensors and workspaces, in the backend's
 * caching allocator's rounded sizes): bytes held now, the most held at once
 * since the context started or the last reset, bytes the allocator keeps
 * for reuse, and how many blocks it has taken from the system (malloc,
 * cudaMalloc): flat once a loop has run once. Host counters, not
 * collective, no wait. */
typedef struct dt_memory_stats {
    size_t in_use, peak, cached;
    uint64_t system_allocs;
} dt_memory_stats;
dt_status dt_context_memory(const dt_context *ctx, dt_memory_stats *out);
/* dt_context_memory, then peak := in_use. */
dt_status dt_context_memory_reset_peak(dt_context *ctx, dt_memory_stats *out);
/* Frees the blocks the allocator keeps for reuse (CUDA: after the rank's
 * queued work, within the timeout), then dt_context_memory. */
dt_status dt_context_memory_release(dt_context *ctx, dt_memory_stats *out);

/* Entry check of a collective op. `local`: this rank's own argument check
 * (its message in dt_last_error()); values[n] (names[n], n < 64) describe the
 * call. mode AUTO follows DT_CHECK. Checked, it is COLLECTIVE over the world
 * (dt_comm_check_call): a call bad on one rank or differing between ranks
 * fails on all, not leaving them waiting: the bad rank returns `local`, the
 * others DT_ERR_MISMATCH (DT_ERR_NONFINITE, DT_ERR_OUT_OF_RANGE: the same)
 * with the bad rank's message. Unchecked: `local`. ctx NULL: this thread's
 * launch's. */
dt_status dt_context_check_call(dt_context *ctx, const char *op, dt_status local,
                                const int64_t *values, const char *const *names, int n,
                                dt_check_mode mode);

/* Log one line, prefixed with the rank, if `level` passes DT_LOG. */
void dt_context_log(const dt_context *ctx, dt_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* DT_CONTEXT_H */
