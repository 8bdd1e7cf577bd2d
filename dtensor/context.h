/* dtensor/context.h — ranks, their contexts, and launching them.
 *
 * Execution is SPMD: every rank runs the same function on its own shard,
 * with its own dt_context (rank, world size, compute backend, world
 * communicator, last status). The contexts are created before and destroyed
 * after `fn`; fn must not keep them. Ranks are either
 *
 *   threads of this process: dt_launch(N, ...) runs fn on N threads (the
 *   local transport, or NCCL with one GPU per thread); or
 *
 *   processes started by a launcher: under `mpirun -np N prog` (or srun,
 *   torchrun) every process calls dt_launch(0, ...) -- or dt_launch(N, ...)
 *   with the launcher's N -- and it runs fn once, for this process's own
 *   rank (transport mpi on the CPU backend; nccl on CUDA, one GPU per
 *   process, picked from the local rank). dt_launch initialises MPI when
 *   nobody has (MPI_Init_thread, MPI_THREAD_SERIALIZED); call dt_finalize()
 *   once at the end of main, which finalizes MPI if dt_launch initialised it.
 *   A program that initialised MPI itself finalizes it itself.
 *
 * Environment (read by dt_launch; explicit options win over it):
 *   DT_TIMEOUT_MS   bound on every wait, default 600000 (10 minutes)
 *   DT_LOG          error | warn | info | debug (default warn)
 *   DT_BACKEND      cpu | cuda            (used when options say AUTO)
 *   DT_TRANSPORT    local | nccl | mpi    (used when options say AUTO)
 *   DT_CHECK        0 | 1: before every collective call, check that all ranks
 *                   agree on op, dtype, shape, Layout and call number (one
 *                   small all_gather per call; default 1 in DEBUG builds)
 *   DT_LOCAL_COPIES 1 | 0: 0 makes the local transport's point-to-point
 *                   transfers move no data (benchmarks only: a ring's time
 *                   without its copies; results that depend on them are
 *                   wrong; a warning says so); default 1
 * and the launcher's (see dtensor/launch_env.h): OMPI_COMM_WORLD_RANK/SIZE
 * (Open MPI), PMI_RANK/PMI_SIZE (MPICH), PMIX_RANK, or torchrun's RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. With
 * transport AUTO, a process started by a launcher runs one rank per process:
 * cuda+nccl when NCCL is built in and this node has a GPU per local rank,
 * else cpu+mpi when mpirun started it and MPI is built in, else an error
 * that says why (DT_TRANSPORT=local runs threads in each process instead).
 * NCCL bootstraps over MPI under mpirun (rank 0's ncclUniqueId is
 * broadcast), else from NCCL_COMM_ID, set (unless already set) to
 * MASTER_ADDR:<MASTER_PORT + 1>: torchrun's store holds MASTER_PORT itself.
 *
 * When ranks are threads (world size > 1), dt_launch sets OpenBLAS to one
 * thread per call for the launch (N ranks use N cores rather than N x cores)
 * and restores the previous setting when it returns; when ranks are
 * processes, to the node's cores divided by its processes.
 *
 * Test: tests/test_context.c, tests/test_launch_env.c, tests/test_mpi.c
 * (make test; the last runs under mpirun -np 1..4).
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

/* Run fn on world_size ranks and wait for all of them. Blocks the calling
 * thread. Returns DT_SUCCESS if every rank did, else the status of the first
 * rank that failed, whose message (prefixed with its rank) becomes this
 * thread's dt_last_error(). opts may be NULL (defaults).
 *
 * world_size: 1..DT_MAX_WORLD_SIZE ranks as threads of this process; or,
 * in a process a launcher started (mpirun, srun, torchrun), 0 or the
 * launcher's size: one rank here, the others in the other processes (see
 * the top of this file). 0 anywhere else is DT_ERR_INVALID_ARGUMENT.
 *
 * As processes, dt_launch is COLLECTIVE over all of them: each process
 * calls it the same number of times. It ends with an exchange (bounded by
 * the timeout) in which every rank learns how every other did, so every
 * process returns the same status and message; "first" is then the lowest
 * rank whose failure was its own (not DT_ERR_PEER_FAILED). A rank that fails
 * tells the others at once (a message), so they stop with
 * DT_ERR_PEER_FAILED instead of waiting for the timeout; a process that
 * dies or hangs outside the library is noticed only by the timeout. The
 * library never calls MPI_Abort or exit(): after a failure, return non-zero
 * from main (mpirun then stops the other processes) or call MPI_Abort. */
dt_status dt_launch(int world_size, dt_rank_fn fn, void *arg,
                    const dt_launch_options *opts);

/* Call once at the end of main, after the last dt_launch, in a program that
 * may run under mpirun: finalizes MPI if dt_launch initialised it (MPI_Finalize
 * waits for every process to call it); otherwise does nothing. No dt_launch
 * over MPI may follow. Not needed, and harmless, without MPI. */
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
/* Where the rank's tensors live and its work runs, for a caller's own
 * kernels on tensor buffers (dt_tensor_data): on the CUDA backend the CUDA
 * device index and the compute stream (a cudaStream_t), on which the
 * library queues all of the rank's work (ops, primitives, attention; the
 * transports' copies are ordered with it by events) in call order. Work
 * the caller queues there on that device, from the rank's thread, is
 * ordered with the library's calls made before and after it, with no other
 * synchronisation; results are read back with dt_tensor_get_local, which
 * waits for the stream. On the CPU backend: -1 and NULL (each call's work
 * is done when it returns; buffers are host memory). */
int dt_context_cuda_device(const dt_context *ctx);
void *dt_context_cuda_stream(const dt_context *ctx);
/* The status of the last failing library call made with this context. */
dt_status dt_context_last_status(const dt_context *ctx);

/* The entry check of a collective op, for the library's primitives and for
 * users' own sharded ops. `local` is the result of this rank's own argument
 * checks; `values` (n of them, named for messages) describe the call (dtype,
 * shapes, Layouts, root...).
 *   mode DT_CHECK_AUTO: check only if the context's checks are on
 *   (DT_CHECK); DT_CHECK_ON: always; DT_CHECK_OFF: never.
 * Without a check it returns `local`. With one it is COLLECTIVE over the
 * world: every rank shares whether its arguments were valid and its values,
 * so a call that is bad on one rank, or that differs between ranks, fails on
 * every rank at once (DT_ERR_MISMATCH naming the first rank and value that
 * differ) instead of leaving the others waiting. A rank whose own checks
 * failed returns `local` with its own message. ctx NULL (a call that had
 * no tensor to take it from): the context dt_launch passed to the function
 * this thread runs, so that such a rank still shows its peers its bad call;
 * on other threads, `local` without a check. */
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
