/* dtensor/launch_env.c — reading the launcher's environment (see
 * launch_env.h). Every value that is set is checked; a message names the
 * variable, its value and what was expected, so a mistyped `RANK=1O` or a
 * WORLD_SIZE without RANK fails at dt_launch instead of hanging a job.
 *
 * Test: tests/test_launch_env.c (make test).
 */
#include "launch_env.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"

const char *dt_launcher_name(dt_launcher launcher) {
    switch (launcher) {
    case DT_LAUNCHER_NONE: return "none";
    case DT_LAUNCHER_MPI: return "mpi";
    case DT_LAUNCHER_ENV: return "env";
    default: return "unknown";
    }
}

static const char *plain_getenv(const char *name, void *arg) {
    (void)arg;
    return getenv(name);
}

typedef struct reader {
    dt_getenv_fn get;
    void *arg;
} reader;

static const char *look(const reader *r, const char *name) {
    const char *v = r->get(name, r->arg);
    return v && *v ? v : NULL;
}

/* *out := the integer in `name` if set, in [lo, hi]; *set says whether it was. */
static dt_status read_int(const reader *r, const char *name, long lo, long hi, int *out, int *set) {
    const char *v = look(r, name);
    *set = v != NULL;
    if (!v) return DT_SUCCESS;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || v[0] == ' ' || v[0] == '+')
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s=%s is not a decimal "
                        "integer", name, v);
    if (x < lo || x > hi)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s=%s is outside [%ld, %ld]",
                        name, v, lo, hi);
    *out = (int)x;
    return DT_SUCCESS;
}

typedef struct id_vars {
    const char *rank, *size, *local_rank, *local_size;
} id_vars;

typedef struct ids {
    int rank, size, local_rank, local_size;
    int has_rank, has_size, has_local_rank, has_local_size;
} ids;

/* One launcher's four variables: each checked alone, then together. */
static dt_status read_ids(const reader *r, const id_vars *n, ids *o) {
    memset(o, 0, sizeof *o);
    o->rank = o->size = o->local_rank = o->local_size = -1;
    DT_TRY(read_int(r, n->size, 1, DT_MAX_WORLD_SIZE, &o->size, &o->has_size));
    DT_TRY(read_int(r, n->rank, 0, DT_MAX_WORLD_SIZE - 1, &o->rank, &o->has_rank));
    if (n->local_size)
        DT_TRY(read_int(r, n->local_size, 1, DT_MAX_WORLD_SIZE, &o->local_size, &o->has_local_size));
    if (n->local_rank)
        DT_TRY(read_int(r, n->local_rank, 0, DT_MAX_WORLD_SIZE - 1, &o->local_rank,
                        &o->has_local_rank));
    if (o->has_rank && o->has_size && o->rank >= o->size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s=%d is not below "
                        "%s=%d", n->rank, o->rank, n->size, o->size);
    if (o->has_local_rank && o->has_local_size && o->local_rank >= o->local_size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s=%d is not below "
                        "%s=%d", n->local_rank, o->local_rank, n->local_size, o->local_size);
    if (o->has_local_size && o->has_size && o->local_size > o->size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s=%d is larger than "
                        "%s=%d", n->local_size, o->local_size, n->size, o->size);
    return DT_SUCCESS;
}

static int any_id(const ids *o) {
    return o->has_rank || o->has_size || o->has_local_rank || o->has_local_size;
}

static dt_status read_master(const reader *r, dt_launch_env *e) {
    const char *addr = look(r, "MASTER_ADDR");
    int set = 0;
    DT_TRY(read_int(r, "MASTER_PORT", 1, 65535, &e->master_port, &set));
    if (!set) e->master_port = 0;
    if (!addr) return DT_SUCCESS;
    size_t len = strlen(addr);
    if (len > DT_MASTER_ADDR_MAX)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: MASTER_ADDR is %zu "
                        "characters long (at most %d)", len, DT_MASTER_ADDR_MAX);
    for (size_t i = 0; i < len; i++)
        if (addr[i] <= ' ' || addr[i] == '/' || (unsigned char)addr[i] >= 127)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: MASTER_ADDR=%s is "
                            "not a host name or address (character %zu)", addr, i + 1);
    memcpy(e->master_addr, addr, len + 1);
    return DT_SUCCESS;
}

/* A launcher that only names the ids (torchrun's RANK / WORLD_SIZE, srun's
 * SLURM_PROCID / SLURM_NTASKS): alone it is the launcher; beside one found
 * before, it must agree with it and fills what that one left unknown. */
static dt_status env_ids(const ids *t, const id_vars *n, const char *who, dt_launch_env *out) {
    if (t->has_rank || t->has_size) {
        if (!t->has_rank || !t->has_size)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s is set but %s is "
                            "not (%s sets both)", t->has_rank ? n->rank : n->size,
                            t->has_rank ? n->size : n->rank, who);
        if (out->launcher == DT_LAUNCHER_NONE) {
            out->launcher = DT_LAUNCHER_ENV;
            out->rank = t->rank;
            out->size = t->size;
            out->local_rank = t->local_rank;
            out->local_size = t->local_size;
            snprintf(out->source, sizeof out->source, "%s/%s", n->rank, n->size);
        } else {
            if (t->rank != out->rank || (out->size >= 0 && t->size != out->size))
                return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s=%d %s=%d "
                                "disagree with %s (rank %d of %d)", n->rank, t->rank, n->size,
                                t->size, out->source, out->rank, out->size);
            if (out->size < 0) out->size = t->size;
            if (out->local_rank < 0) out->local_rank = t->local_rank;
            if (out->local_size < 0) out->local_size = t->local_size;
        }
    } else if (t->has_local_rank || t->has_local_size) {
        if (out->launcher == DT_LAUNCHER_NONE)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s is set without "
                            "%s and %s", t->has_local_rank ? n->local_rank : n->local_size,
                            n->rank, n->size);
        if (out->local_rank < 0) out->local_rank = t->local_rank;
        if (out->local_size < 0) out->local_size = t->local_size;
    }
    return DT_SUCCESS;
}

dt_status dt_launch_env_read(dt_getenv_fn get, void *arg, dt_launch_env *out) {
    if (!out) return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: out is NULL");
    memset(out, 0, sizeof *out);
    out->rank = out->size = out->local_rank = out->local_size = -1;
    reader r = {get ? get : plain_getenv, arg};

    static const id_vars ompi = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
    static const id_vars pmi = {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
    static const id_vars torch = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
    static const id_vars slurm = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL};
    ids o, p, t, sl;
    DT_TRY(read_ids(&r, &ompi, &o));
    DT_TRY(read_ids(&r, &pmi, &p));
    DT_TRY(read_ids(&r, &torch, &t));
    DT_TRY(read_ids(&r, &slurm, &sl));
    int pmix_rank = -1, has_pmix = 0;
    DT_TRY(read_int(&r, "PMIX_RANK", 0, DT_MAX_WORLD_SIZE - 1, &pmix_rank, &has_pmix));
    DT_TRY(read_master(&r, out));

    /* The MPI launcher, by precedence: Open MPI's own names, then PMI, then PMIx. */
    const ids *m = NULL;
    const id_vars *mn = NULL;
    if (o.has_rank || o.has_size) m = &o, mn = &ompi;
    else if (p.has_rank || p.has_size) m = &p, mn = &pmi;
    if (m) {
        if (!m->has_rank || !m->has_size)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s is set but %s is "
                            "not (an MPI launcher sets both)",
                            m->has_rank ? mn->rank : mn->size, m->has_rank ? mn->size : mn->rank);
        out->launcher = DT_LAUNCHER_MPI;
        out->rank = m->rank;
        out->size = m->size;
        out->local_rank = m->local_rank;
        out->local_size = m->local_size;
        snprintf(out->source, sizeof out->source, "%s/%s", mn->rank, mn->size);
        if (has_pmix && pmix_rank != m->rank)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: PMIX_RANK=%d but "
                            "%s=%d", pmix_rank, mn->rank, m->rank);
    } else if (has_pmix) {
        out->launcher = DT_LAUNCHER_MPI;
        out->rank = pmix_rank;
        snprintf(out->source, sizeof out->source, "PMIX_RANK");
    } else if (any_id(&o) || any_id(&p)) {
        const id_vars *n = any_id(&o) ? &ompi : &pmi;
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: %s or %s is set without "
                        "%s and %s", n->local_rank, n->local_size, n->rank, n->size);
    }

    /* torchrun's variables, then SLURM's (srun), as one launcher or agreeing
     * with the one found before */
    DT_TRY(env_ids(&t, &torch, "a launcher such as torchrun", out));
    DT_TRY(env_ids(&sl, &slurm, "srun", out));
    if (out->local_rank >= 0 && out->local_size >= 0 && out->local_rank >= out->local_size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: local rank %d is not "
                        "below the local size %d", out->local_rank, out->local_size);
    return DT_SUCCESS;
}

dt_status dt_launch_env_nccl_comm_id(const dt_launch_env *e, char *buf, size_t size) {
    if (!e || !buf || size == 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: bad arguments");
    if (!e->master_addr[0] || e->master_port == 0)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: NCCL needs MASTER_ADDR "
                        "and MASTER_PORT to bootstrap without MPI (%s%s%s unset); torchrun sets "
                        "them, or export them (MASTER_ADDR=<host of rank 0> MASTER_PORT=<free "
                        "port>)", !e->master_addr[0] ? "MASTER_ADDR" : "",
                        !e->master_addr[0] && !e->master_port ? " and " : "",
                        !e->master_port ? "MASTER_PORT" : "");
    /* MASTER_PORT itself is taken: torchrun's store listens there on the
     * master node, and NCCL's bootstrap root would have to bind it too. */
    if (e->master_port == 65535)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: NCCL bootstraps on "
                        "MASTER_PORT + 1, and MASTER_PORT=65535 has none (choose a lower port, or "
                        "set NCCL_COMM_ID=<host>:<port> yourself)");
    /* An IPv6 address has colons of its own: NCCL wants it bracketed. */
    int v6 = strchr(e->master_addr, ':') != NULL && e->master_addr[0] != '[';
    int n = snprintf(buf, size, v6 ? "[%s]:%d" : "%s:%d", e->master_addr, e->master_port + 1);
    if (n < 0 || (size_t)n >= size)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: buffer of %zu bytes too "
                        "small for the NCCL address", size);
    return DT_SUCCESS;
}

dt_status dt_launch_env_device(const dt_launch_env *e, int gpus, int restricted, int *device) {
    if (!e || !device)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "launcher environment: bad arguments");
    *device = -1;
    if (gpus <= 0)
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: no GPU is visible to this process",
                        e->rank);
    if (gpus == 1 && restricted) {
        *device = 0; /* CUDA_VISIBLE_DEVICES gave this process its own GPU */
        return DT_SUCCESS;
    }
    if (e->local_rank < 0)
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: cannot pick this process's GPU: the "
                        "launcher set no local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or "
                        "MPI_LOCALRANKID), and %d GPUs are visible (set CUDA_VISIBLE_DEVICES to "
                        "one GPU per process, or export LOCAL_RANK)", e->rank, gpus);
    if (e->local_size > gpus || e->local_rank >= gpus)
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: %d process(es) on this node but only %d "
                        "GPU(s) visible: local rank %d has no GPU of its own (NCCL needs one GPU "
                        "per rank: start at most %d processes per node)", e->rank,
                        e->local_size > 0 ? e->local_size : e->local_rank + 1, gpus,
                        e->local_rank, gpus);
    *device = e->local_rank;
    return DT_SUCCESS;
}
