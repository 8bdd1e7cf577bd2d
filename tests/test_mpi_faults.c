/* tests/test_mpi_faults.c — process launches that go wrong, under mpirun.
 *
 * Runs as an ordinary test and starts `mpirun -np 3` of itself with
 * `--child SCENARIO` (MPIRUN, or mpirun from PATH), Open MPI told not to end
 * the job when a process exits non-zero (orte_abort_on_non_zero_status 0),
 * so that what is measured is the library's own behaviour. Each child runs
 * one launch and dt_finalize and prints one line per process; the parent
 * checks every process's statuses and how long each call took:
 *   healthy    every process succeeds (the baseline)
 *   dead       the last process dies inside its rank function: the others'
 *              dt_launch returns within the timeout and a grace, and their
 *              dt_finalize returns at once instead of entering MPI_Finalize
 *              (run many times: that hang came about once in 15 runs)
 *   late       the last process reaches dt_launch 3 s late with a 1 s
 *              timeout: the others return DT_ERR_TIMEOUT naming
 *              MPI_Init_thread within about the timeout
 *   badconfig  one process has DT_TIMEOUT_MS=abc: every process returns its
 *              error at once, not after the others' 20 s timeout
 * Skipped, with the reason, without MPI or mpirun.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtensor/dtensor.h"
#include "harness.h"

#define PROCS 3

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ the child */

static dt_status rank_barriers(dt_context *ctx, void *arg) {
    const char *scenario = arg;
    const int r = dt_context_rank(ctx), p = dt_context_world_size(ctx);
    if (!strcmp(scenario, "dead") && r == p - 1) {
        sleep_ms(100);
        _exit(3);   /* dies without a word to the others */
    }
    dt_status st = DT_SUCCESS;
    for (int k = 0; k < 3 && st == DT_SUCCESS; k++) st = dt_comm_barrier(dt_context_comm(ctx));
    return st;
}

static int child(const char *scenario) {
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    const int rank = r ? atoi(r) : -1;
    if (!strcmp(scenario, "late") && rank == PROCS - 1) sleep_ms(3000);
    if (!strcmp(scenario, "badconfig") && rank == 1) setenv("DT_TIMEOUT_MS", "abc", 1);
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CPU;
    o.transport = DT_TRANSPORT_MPI;
    const double t0 = now_ms();
    dt_status st = dt_launch(0, rank_barriers, (void *)scenario, &o);
    const double t1 = now_ms();
    char msg[600];
    snprintf(msg, sizeof msg, "%s", st == DT_SUCCESS ? "-" : dt_last_error());
    for (char *c = msg; *c; c++)
        if (*c == '\n') *c = ' ';
    dt_status fin = dt_finalize();
    const double t2 = now_ms();
    printf("R %d launch %s %.0f finalize %s %.0f msg %s\n", rank, dt_status_name(st), t1 - t0,
           dt_status_name(fin), t2 - t1, msg);
    fflush(stdout);
    return st == DT_SUCCESS ? 0 : 1;
}

/* ----------------------------------------------------------- the parent */

typedef struct proc_result {
    int seen;
    char launch[40], finalize[40];
    double launch_ms, finalize_ms;
    char msg[600];
} proc_result;

static char g_self[4096];
static const char *g_mpirun;

/* Runs `jobs` mpirun jobs of the scenario at once; res[j][rank]. Returns
 * the wall time of the slowest in ms. */
static double run_jobs(const char *scenario, long timeout_ms, int jobs,
                       proc_result (*res)[PROCS]) {
    FILE *pipes[8];
    const double t0 = now_ms();
    for (int j = 0; j < jobs; j++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd,
                 "DT_TIMEOUT_MS=%ld DT_LOG=error timeout -k 5 60 '%s' %s --oversubscribe --bind-to none "
                 "--mca orte_abort_on_non_zero_status 0 --mca btl self,vader -x DT_TIMEOUT_MS "
                 "-x DT_LOG -np %d '%s' --child %s 2>/dev/null",
                 timeout_ms, g_mpirun, geteuid() == 0 ? "--allow-run-as-root" : "", PROCS, g_self,
                 scenario);
        pipes[j] = popen(cmd, "r");
        assert_non_null(pipes[j]);
    }
    for (int j = 0; j < jobs; j++) {
        memset(res[j], 0, sizeof res[j]);
        char line[1024];
        while (fgets(line, sizeof line, pipes[j])) {
            int rank = -1;
            proc_result p;
            memset(&p, 0, sizeof p);
            int n = 0;
            if (sscanf(line, "R %d launch %39s %lf finalize %39s %lf msg %n", &rank, p.launch,
                       &p.launch_ms, p.finalize, &p.finalize_ms, &n) == 5 &&
                rank >= 0 && rank < PROCS) {
                p.seen = 1;
                line[strcspn(line, "\n")] = '\0';
                snprintf(p.msg, sizeof p.msg, "%s", line + n);
                res[j][rank] = p;
            }
        }
        pclose(pipes[j]);
    }
    return now_ms() - t0;
}

static int g_skip;
static char g_why[256];

static int require_mpirun(void) {
    if (g_skip) {
        print_message("skipped: %s\n", g_why);
        skip();
    }
    return 1;
}

static void print_job(const char *scenario, int j, const proc_result *res) {
    for (int r = 0; r < PROCS; r++)
        print_error("%s job %d rank %d: %s%s in %.0f ms, dt_finalize %s in %.0f ms: %s\n", scenario, j,
                    r, res[r].seen ? "" : "(no line) ", res[r].launch, res[r].launch_ms,
                    res[r].finalize, res[r].finalize_ms, res[r].msg);
}

static void test_healthy(void **state) {
    (void)state;
    require_mpirun();
    proc_result res[1][PROCS];
    run_jobs("healthy", 5000, 1, res);
    for (int r = 0; r < PROCS; r++) {
        if (!res[0][r].seen || strcmp(res[0][r].launch, "DT_SUCCESS") ||
            strcmp(res[0][r].finalize, "DT_SUCCESS"))
            print_job("healthy", 0, res[0]);
        assert_true(res[0][r].seen);
        assert_string_equal(res[0][r].launch, "DT_SUCCESS");
        assert_string_equal(res[0][r].finalize, "DT_SUCCESS");
    }
}

static void test_dead_peer(void **state) {
    (void)state;
    require_mpirun();
    const long t = 2000;   /* MPI's own start takes most of a second on a busy machine */
    const int rounds = getenv("DT_TEST_QUICK") ? 2 : 5, jobs = 3;
    int runs = 0;
    for (int round = 0; round < rounds; round++) {
        proc_result res[3][PROCS];
        run_jobs("dead", t, jobs, res);
        for (int j = 0; j < jobs; j++, runs++)
            for (int r = 0; r < PROCS - 1; r++) {
                const proc_result *p = &res[j][r];
                /* a barrier's timeout, then the exit exchange's grace */
                const int ok = p->seen && strcmp(p->launch, "DT_SUCCESS") &&
                               p->launch_ms < t + 1000 + 1500 && strcmp(p->finalize, "DT_SUCCESS") &&
                               p->finalize_ms < 500 && strstr(p->msg, "rank");
                if (!ok) print_job("dead", j, res[j]);
                assert_true(ok);
            }
    }
    print_message("%d runs of 3 processes, one dying: every survivor returned from dt_launch and "
                  "dt_finalize in time\n", runs);
}

static void test_late_process(void **state) {
    (void)state;
    require_mpirun();
    const long t = 1000;
    proc_result res[1][PROCS];
    const double wall = run_jobs("late", t, 1, res);
    for (int r = 0; r < PROCS - 1; r++) {
        const proc_result *p = &res[0][r];
        const int ok = p->seen && !strcmp(p->launch, "DT_ERR_TIMEOUT") && p->launch_ms < t + 1500 &&
                       strstr(p->msg, "MPI_Init_thread") && strcmp(p->finalize, "DT_SUCCESS") &&
                       p->finalize_ms < 500;
        if (!ok) print_job("late", 0, res[0]);
        assert_true(ok);
    }
    /* the late one is bounded by its own timeout too */
    print_message("late: the job ended in %.0f ms\n", wall);
    assert_true(wall < 3000 + t + 5000);
}

static void test_bad_config_on_one_process(void **state) {
    (void)state;
    require_mpirun();
    proc_result res[1][PROCS];
    run_jobs("badconfig", 20000, 1, res);
    for (int r = 0; r < PROCS; r++) {
        const proc_result *p = &res[0][r];
        const int ok = p->seen && !strcmp(p->launch, "DT_ERR_INVALID_ARGUMENT") &&
                       p->launch_ms < 5000 && strstr(p->msg, "rank 1") &&
                       strstr(p->msg, "DT_TIMEOUT_MS=abc");
        if (!ok) print_job("badconfig", 0, res[0]);
        assert_true(ok);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
    const char *why = NULL;
#ifndef DT_HAVE_MPI
    why = "this build has no MPI (MPI=0, or no mpicc)";
#endif
    g_mpirun = getenv("MPIRUN") && *getenv("MPIRUN") ? getenv("MPIRUN") : "mpirun";
    if (!why && system("command -v mpirun >/dev/null 2>&1") != 0 && !getenv("MPIRUN"))
        why = "no mpirun in PATH";
    if (!why && getenv("DT_TEST_MPI_SKIP")) why = getenv("DT_TEST_MPI_SKIP");
    if (why) {
        g_skip = 1;
        snprintf(g_why, sizeof g_why, "%s", why);
    }
    char cwd[2048] = "";
    if (argv[0][0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
    snprintf(g_self, sizeof g_self, "%s%s%s", cwd, cwd[0] ? "/" : "", argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthy),
        cmocka_unit_test(test_dead_peer),
        cmocka_unit_test(test_late_process),
        cmocka_unit_test(test_bad_config_on_one_process),
    };
    return cmocka_run_group_tests_name("mpi faults", tests, NULL, NULL);
}
