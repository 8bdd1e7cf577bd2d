/* tests/test_launch_env.c — reading the launcher's environment
 * (dtensor/launch_env.h): Open MPI, MPICH/PMI, PMIx and torchrun variables,
 * their combinations, the NCCL bootstrap address, the GPU of a process, and
 * clear errors for bad or missing values. Variables come from a table, not
 * the process environment, so nothing here depends on how the suite runs;
 * one case checks dt_launch's own use of the real environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/context.h"
#include "dtensor/launch_env.h"

/* NULL-terminated name, value pairs. */
static const char *lookup(const char *name, void *arg) {
    const char *const *kv = arg;
    for (; kv[0]; kv += 2)
        if (strcmp(kv[0], name) == 0) return kv[1];
    return NULL;
}

static dt_status read_env(const char *const *kv, dt_launch_env *e) {
    return dt_launch_env_read(lookup, (void *)kv, e);
}

static void test_none(void **state) {
    (void)state;
    const char *kv[] = {"HOME", "/root", "PATH", "/bin", NULL};
    dt_launch_env e;
    assert_int_equal(read_env(kv, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_NONE);
    assert_int_equal(e.rank, -1);
    assert_int_equal(e.size, -1);
    assert_string_equal(dt_launcher_name(e.launcher), "none");
}

static void test_open_mpi(void **state) {
    (void)state;
    const char *kv[] = {"OMPI_COMM_WORLD_RANK", "3", "OMPI_COMM_WORLD_SIZE", "8",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "2",
                        "PMIX_RANK", "3", NULL};
    dt_launch_env e;
    assert_int_equal(read_env(kv, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_MPI);
    assert_int_equal(e.rank, 3);
    assert_int_equal(e.size, 8);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_size, 2);
    assert_non_null(strstr(e.source, "OMPI_COMM_WORLD_RANK"));
}

static void test_mpich_and_pmix(void **state) {
    (void)state;
    const char *pmi[] = {"PMI_RANK", "0", "PMI_SIZE", "2", "MPI_LOCALRANKID", "0",
                         "MPI_LOCALNRANKS", "2", NULL};
    dt_launch_env e;
    assert_int_equal(read_env(pmi, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_MPI);
    assert_int_equal(e.size, 2);
    assert_int_equal(e.local_size, 2);
    /* PMIx alone: the rank, and the size comes later from MPI. */
    const char *pmix[] = {"PMIX_RANK", "5", NULL};
    assert_int_equal(read_env(pmix, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_MPI);
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.size, -1);
    assert_string_equal(e.source, "PMIX_RANK");
}

static void test_torchrun(void **state) {
    (void)state;
    const char *kv[] = {"RANK", "5", "WORLD_SIZE", "16", "LOCAL_RANK", "1",
                        "LOCAL_WORLD_SIZE", "8", "MASTER_ADDR", "node-0.cluster",
                        "MASTER_PORT", "29500", NULL};
    dt_launch_env e;
    assert_int_equal(read_env(kv, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_ENV);
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.size, 16);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_size, 8);
    assert_string_equal(e.master_addr, "node-0.cluster");
    assert_int_equal(e.master_port, 29500);
    char id[300];
    assert_int_equal(dt_launch_env_nccl_comm_id(&e, id, sizeof id), DT_SUCCESS);
    assert_string_equal(id, "node-0.cluster:29501");   /* torchrun's store has 29500 */
    /* IPv6 is bracketed for NCCL_COMM_ID. */
    const char *v6[] = {"RANK", "0", "WORLD_SIZE", "1", "MASTER_ADDR", "fe80::1",
                        "MASTER_PORT", "1234", NULL};
    assert_int_equal(read_env(v6, &e), DT_SUCCESS);
    assert_int_equal(dt_launch_env_nccl_comm_id(&e, id, sizeof id), DT_SUCCESS);
    assert_string_equal(id, "[fe80::1]:1235");
    /* No port after 65535. */
    const char *top[] = {"RANK", "0", "WORLD_SIZE", "1", "MASTER_ADDR", "h", "MASTER_PORT", "65535",
                         NULL};
    assert_int_equal(read_env(top, &e), DT_SUCCESS);
    assert_int_equal(dt_launch_env_nccl_comm_id(&e, id, sizeof id), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "MASTER_PORT + 1"));
}

/* srun without an MPI plugin: SLURM's ids alone are the launcher; with
 * PMI (srun --mpi=pmix) they must agree with it; with torchrun's too. */
static void test_slurm(void **state) {
    (void)state;
    const char *kv[] = {"SLURM_PROCID", "3", "SLURM_NTASKS", "8", "SLURM_LOCALID", "1", NULL};
    dt_launch_env e;
    assert_int_equal(read_env(kv, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_ENV);
    assert_int_equal(e.rank, 3);
    assert_int_equal(e.size, 8);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_size, -1);
    assert_string_equal(e.source, "SLURM_PROCID/SLURM_NTASKS");
    const char *with_pmi[] = {"PMI_RANK", "3", "PMI_SIZE", "8", "SLURM_PROCID", "3",
                              "SLURM_NTASKS", "8", "SLURM_LOCALID", "1", NULL};
    assert_int_equal(read_env(with_pmi, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_MPI);
    assert_int_equal(e.local_rank, 1);   /* SLURM's fills what PMI left out */
    const char *bad[] = {"PMIX_RANK", "2", "SLURM_PROCID", "3", "SLURM_NTASKS", "8", NULL};
    assert_int_equal(read_env(bad, &e), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "SLURM_PROCID=3 SLURM_NTASKS=8 disagree"));
    const char *half[] = {"SLURM_PROCID", "3", NULL};
    assert_int_equal(read_env(half, &e), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "SLURM_PROCID is set but SLURM_NTASKS is not"));
}

static void test_mpi_and_torchrun_together(void **state) {
    (void)state;
    /* mpirun -x RANK ...: they must agree; torchrun's fill what MPI left out. */
    const char *ok[] = {"PMIX_RANK", "2", "RANK", "2", "WORLD_SIZE", "4", "LOCAL_RANK", "0",
                        NULL};
    dt_launch_env e;
    assert_int_equal(read_env(ok, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_MPI);
    assert_int_equal(e.size, 4);
    assert_int_equal(e.local_rank, 0);
    const char *bad[] = {"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "4", "RANK", "2",
                         "WORLD_SIZE", "4", NULL};
    assert_int_equal(read_env(bad, &e), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "RANK=2 WORLD_SIZE=4 disagree"));
    const char *pmix_bad[] = {"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "4",
                              "PMIX_RANK", "3", NULL};
    assert_int_equal(read_env(pmix_bad, &e), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "PMIX_RANK=3 but OMPI_COMM_WORLD_RANK=1"));
}

typedef struct bad_case {
    const char *kv[12];
    const char *expect;   /* in the message */
} bad_case;

static void test_bad_values(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {{"RANK", "1O", "WORLD_SIZE", "16", NULL}, "RANK=1O is not a decimal integer"},
        {{"RANK", "-1", "WORLD_SIZE", "16", NULL}, "RANK=-1 is outside [0, 1023]"},
        {{"RANK", "4", "WORLD_SIZE", "4", NULL}, "RANK=4 is not below WORLD_SIZE=4"},
        {{"RANK", "0", "WORLD_SIZE", "0", NULL}, "WORLD_SIZE=0 is outside [1, 1024]"},
        {{"RANK", "0", "WORLD_SIZE", "99999999999", NULL}, "WORLD_SIZE=99999999999"},
        {{"RANK", " 1", "WORLD_SIZE", "2", NULL}, "RANK= 1 is not a decimal integer"},
        {{"RANK", "1", NULL}, "RANK is set but WORLD_SIZE is not"},
        {{"WORLD_SIZE", "8", NULL}, "WORLD_SIZE is set but RANK is not"},
        {{"LOCAL_RANK", "0", NULL}, "LOCAL_RANK is set without RANK and WORLD_SIZE"},
        {{"RANK", "1", "WORLD_SIZE", "8", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2", NULL},
         "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
        {{"RANK", "1", "WORLD_SIZE", "2", "LOCAL_WORLD_SIZE", "4", NULL},
         "LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2"},
        {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "70000", NULL},
         "MASTER_PORT=70000 is outside [1, 65535]"},
        {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "http", NULL},
         "MASTER_PORT=http is not a decimal integer"},
        {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "a b", NULL},
         "MASTER_ADDR=a b is not a host name or address"},
        {{"OMPI_COMM_WORLD_RANK", "0", NULL},
         "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"},
        {{"PMI_SIZE", "x", NULL}, "PMI_SIZE=x is not a decimal integer"},
        {{"OMPI_COMM_WORLD_LOCAL_RANK", "0", NULL}, "is set without OMPI_COMM_WORLD_RANK"},
        {{"PMIX_RANK", "two", NULL}, "PMIX_RANK=two is not a decimal integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_launch_env e;
        dt_status st = read_env(cases[i].kv, &e);
        if (st != DT_ERR_INVALID_ARGUMENT || !strstr(dt_last_error(), cases[i].expect))
            print_error("case %zu: %s: \"%s\" (wanted \"%s\")\n", i, dt_status_name(st),
                        dt_last_error(), cases[i].expect);
        assert_int_equal(st, DT_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(dt_last_error(), cases[i].expect));
    }
    /* An empty value counts as unset. */
    const char *empty[] = {"RANK", "", "WORLD_SIZE", "", NULL};
    dt_launch_env e;
    assert_int_equal(read_env(empty, &e), DT_SUCCESS);
    assert_int_equal(e.launcher, DT_LAUNCHER_NONE);
}

static void test_nccl_bootstrap_needs_master(void **state) {
    (void)state;
    const char *kv[] = {"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "29500", NULL};
    dt_launch_env e;
    char id[64];
    assert_int_equal(read_env(kv, &e), DT_SUCCESS);
    assert_int_equal(dt_launch_env_nccl_comm_id(&e, id, sizeof id), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "MASTER_ADDR unset"));
    const char *none[] = {"RANK", "0", "WORLD_SIZE", "2", NULL};
    assert_int_equal(read_env(none, &e), DT_SUCCESS);
    assert_int_equal(dt_launch_env_nccl_comm_id(&e, id, sizeof id), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "MASTER_ADDR and MASTER_PORT unset"));
}

static void test_gpu_of_a_process(void **state) {
    (void)state;
    const char *kv[] = {"RANK", "5", "WORLD_SIZE", "16", "LOCAL_RANK", "1",
                        "LOCAL_WORLD_SIZE", "8", NULL};
    dt_launch_env e;
    int dev = -1;
    assert_int_equal(read_env(kv, &e), DT_SUCCESS);
    assert_int_equal(dt_launch_env_device(&e, 8, 0, &dev), DT_SUCCESS);
    assert_int_equal(dev, 1);
    /* Fewer GPUs than processes on the node: said plainly. */
    assert_int_equal(dt_launch_env_device(&e, 4, 0, &dev), DT_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(dt_last_error(), "8 process(es) on this node but only 4 GPU(s) visible"));
    assert_int_equal(dev, -1);
    assert_int_equal(dt_launch_env_device(&e, 0, 0, &dev), DT_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(dt_last_error(), "no GPU"));
    /* One GPU per process through CUDA_VISIBLE_DEVICES: device 0. */
    assert_int_equal(dt_launch_env_device(&e, 1, 1, &dev), DT_SUCCESS);
    assert_int_equal(dev, 0);
    /* No local rank: cannot pick among several GPUs. */
    const char *nolocal[] = {"RANK", "1", "WORLD_SIZE", "2", NULL};
    assert_int_equal(read_env(nolocal, &e), DT_SUCCESS);
    assert_int_equal(dt_launch_env_device(&e, 2, 0, &dev), DT_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(dt_last_error(), "set no local rank"));
    /* A local rank past the GPUs, local size unknown. */
    const char *past[] = {"OMPI_COMM_WORLD_RANK", "3", "OMPI_COMM_WORLD_SIZE", "4",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "3", NULL};
    assert_int_equal(read_env(past, &e), DT_SUCCESS);
    assert_int_equal(dt_launch_env_device(&e, 2, 0, &dev), DT_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(dt_last_error(), "local rank 3 has no GPU of its own"));
}

static dt_status rank_noop(dt_context *ctx, void *arg) {
    (void)ctx;
    (void)arg;
    return DT_SUCCESS;
}

/* dt_launch reads the real environment: bad values stop it with the
 * message; transport local ignores the launcher; world size 0 needs one. */
static void test_dt_launch_uses_it(void **state) {
    (void)state;
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CPU;
    o.timeout_ms = 5000;
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "RANK", "WORLD_SIZE"};
    int launched = 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) launched |= getenv(vars[i]) != NULL;
    if (launched) {
        print_message("started by a launcher: the environment cases would change it\n");
        skip();
    }
    assert_int_equal(dt_launch(0, rank_noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "not started by a launcher"));
    setenv("RANK", "x", 1);
    setenv("WORLD_SIZE", "2", 1);
    assert_int_equal(dt_launch(2, rank_noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "RANK=x is not a decimal integer"));
    o.transport = DT_TRANSPORT_LOCAL;
    assert_int_equal(dt_launch(2, rank_noop, NULL, &o), DT_SUCCESS);
    /* A torchrun-style process with a CPU backend and no MPI launcher: no
     * transport can connect processes, and the message says what to do. */
    setenv("RANK", "1", 1);
    o.transport = DT_TRANSPORT_AUTO;
    assert_int_equal(dt_launch(0, rank_noop, NULL, &o), DT_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(dt_last_error(), "no transport here connects processes"));
    assert_non_null(strstr(dt_last_error(), "DT_TRANSPORT=local"));
    assert_int_equal(dt_launch(3, rank_noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "dt_launch asks for 3 ranks"));
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    assert_int_equal(dt_finalize(), DT_SUCCESS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none),
        cmocka_unit_test(test_open_mpi),
        cmocka_unit_test(test_mpich_and_pmix),
        cmocka_unit_test(test_torchrun),
        cmocka_unit_test(test_slurm),
        cmocka_unit_test(test_mpi_and_torchrun_together),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_nccl_bootstrap_needs_master),
        cmocka_unit_test(test_gpu_of_a_process),
        cmocka_unit_test(test_dt_launch_uses_it),
    };
    return cmocka_run_group_tests_name("launcher environment", tests, NULL, NULL);
}
