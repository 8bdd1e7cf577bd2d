/* dtensor/launch_env.h — PRIVATE. What started this process: reading the
 * launcher's environment variables (mpirun, srun with PMI/PMIx, torchrun).
 *
 * dt_launch uses it to decide whether ranks are processes, and for NCCL how
 * to bootstrap and which GPU to drive. Pure functions of the environment (no
 * MPI, no CUDA): built and tested in every configuration.
 *
 * Variables, by launcher:
 *   Open MPI mpirun   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
 *                     OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
 *   MPICH / Hydra     PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
 *   PMIx (srun, prun) PMIX_RANK (the size then comes from MPI itself)
 *   torchrun & co.    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 *                     MASTER_ADDR, MASTER_PORT
 *   SLURM srun        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (read as RANK,
 *                     WORLD_SIZE, LOCAL_RANK)
 * The MPI launchers' variables mark the process as started by mpirun; the
 * torchrun ones alone mark an MPI-free launch (NCCL bootstraps from
 * MASTER_ADDR:MASTER_PORT). When both are present they must agree.
 *
 * Test: tests/test_launch_env.c (make test).
 */
#ifndef DT_LAUNCH_ENV_H
#define DT_LAUNCH_ENV_H

#include <stddef.h>

#include "../base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_launcher {
    DT_LAUNCHER_NONE = 0,   /* a plain process: ranks are threads */
    DT_LAUNCHER_MPI,        /* mpirun / mpiexec / srun with PMI or PMIx */
    DT_LAUNCHER_ENV,        /* torchrun-style RANK / WORLD_SIZE, no MPI launcher */
    DT_LAUNCHER_COUNT
} dt_launcher;

const char *dt_launcher_name(dt_launcher launcher);

/* Longest MASTER_ADDR accepted (a host name or an address). */
#define DT_MASTER_ADDR_MAX 255

typedef struct dt_launch_env {
    dt_launcher launcher;
    char source[96];        /* the variables that said so, for messages */
    int rank;               /* -1 when unknown (PMIX_RANK gives no size; MPI will tell) */
    int size;               /* -1 when unknown */
    int local_rank;         /* rank among the processes of this node; -1 when unknown */
    int local_size;         /* processes on this node; -1 when unknown */
    char master_addr[DT_MASTER_ADDR_MAX + 1]; /* "" when MASTER_ADDR is unset */
    int master_port;        /* 0 when MASTER_PORT is unset */
} dt_launch_env;

/* Looks up one variable: like getenv (NULL when unset). */
typedef const char *(*dt_getenv_fn)(const char *name, void *arg);

/* Reads the launcher's variables through `get` (NULL: getenv); nothing set:
 * launcher NONE. Each set variable must be a decimal in range (rank in [0, size),
 * size in [1, DT_MAX_WORLD_SIZE], port in [1, 65535]), pairs complete, launchers
 * consistent; else DT_ERR_INVALID_ARGUMENT naming the variable and value. */
dt_status dt_launch_env_read(dt_getenv_fn get, void *arg, dt_launch_env *out);

/* NCCL_COMM_ID "MASTER_ADDR:<MASTER_PORT + 1>" (IPv6 bracketed; +1 because
 * torchrun's store listens on MASTER_PORT). Fails when either is unset or the
 * port is 65535. */
dt_status dt_launch_env_nccl_comm_id(const dt_launch_env *env, char *buf, size_t size);

/* The GPU this process drives: its local rank when gpus >= local size; device 0
 * when CUDA_VISIBLE_DEVICES names a single device (`restricted`); else
 * DT_ERR_NOT_SUPPORTED with the counts. */
dt_status dt_launch_env_device(const dt_launch_env *env, int gpus, int restricted, int *device);

#ifdef __cplusplus
}
#endif
#endif /* DT_LAUNCH_ENV_H */
