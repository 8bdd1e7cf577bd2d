/* tests/test_bench.c — a smoke test of build/bench/attention: every section
 * and both passes run with --quick, and the flags are checked. It checks that
 * the benchmark runs and reports what it says it reports, not its figures.
 *
 *   - --quick --json: exit 0, a closed object whose kernel, ring and
 *     ring_cost rows carry "pass" for fwd and bwd, no NaN or Inf;
 *   - --quick --pass bwd (text and JSON): the backward alone, with the
 *     computed pairs columns in its table since it is the only one;
 *   - exit 2 with a message for bad --pass, --section and other flags.
 * The binary is found beside this test's build tree (build/tests/test_bench
 * -> build/bench/attention; make test builds it). When it is missing every
 * case is skipped with the reason (run `make`).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static char g_bench[4096] = "build/bench/attention";

#define REQUIRE_BENCH()                                                                   \
    do {                                                                                  \
        if (access(g_bench, X_OK) != 0) {                                                 \
            print_message("skipped: %s is not built (run `make`)\n", g_bench);            \
            skip();                                                                       \
        }                                                                                 \
    } while (0)

static int run_bench(const char *args, char **out) {
    int rc = h_run_program(g_bench, args, out);
    assert_true(rc != -2);
    return rc;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* printf writes a non-finite double as nan, -nan, inf or -inf. */
static int no_nonfinite(const char *json) {
    return !strstr(json, ": nan") && !strstr(json, ": -nan") && !strstr(json, ": inf") &&
           !strstr(json, ": -inf");
}

static void show(const char *args, const char *out) {
    print_error("bench/attention %s printed:\n%s\n", args, out);
}

/* ------------------------------------------------------------ both passes */

static void test_quick_json_both_passes(void **state) {
    (void)state;
    REQUIRE_BENCH();
    const char *args = "--quick --json";
    char *out = NULL;
    int rc = run_bench(args, &out);
    const char *kernel = strstr(out, "\"kernel\": ["), *ring = strstr(out, "\"ring\": [");
    const char *cost = strstr(out, "\"ring_cost\": [");
    int ok = rc == 0 && strstr(out, "\"passes\": [\"fwd\", \"bwd\"]") && kernel && ring && cost &&
             kernel < ring && ring < cost && strstr(out, "\"complete\": true\n}") &&
             no_nonfinite(out);
    if (ok) {
        /* Every section holds rows of both passes, in its own array. */
        const char *ends[3] = {ring, cost, out + strlen(out)};
        const char *starts[3] = {kernel, ring, cost};
        const char *rows[3] = {"\", \"B\": ", "\", \"P\": ", "\", \"P\": "};
        for (int s = 0; s < 3 && ok; s++) {
            for (int p = 0; p < 2 && ok; p++) {
                char key[64];
                snprintf(key, sizeof key, "{\"pass\": \"%s%s", p ? "bwd" : "fwd", rows[s]);
                const char *hit = strstr(starts[s], key);
                ok = hit && hit < ends[s];
            }
        }
        ok = ok && count(out, "\"pass\": \"fwd\"") == count(out, "\"pass\": \"bwd\"");
    }
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

static void test_quick_text_both_passes(void **state) {
    (void)state;
    REQUIRE_BENCH();
    const char *args = "--quick --section a,b";
    char *out = NULL;
    int rc = run_bench(args, &out);
    const char *fwd = strstr(out, "\n    pass fwd: dt_attention_forward");
    const char *bwd = strstr(out, "\n    pass bwd: dt_attention_backward");
    /* The pairs columns once, in the fwd table; the bwd table points to it. */
    int ok = rc == 0 && fwd && bwd && fwd < bwd && strstr(fwd, "(crit)") &&
             !strstr(bwd, "(crit)") && strstr(bwd, "as in the fwd table") &&
             count(out, " fwd  ") == 4 && count(out, " bwd  ") == 4;
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

/* ------------------------------------------------------------- bwd alone */

static void test_quick_backward_alone(void **state) {
    (void)state;
    REQUIRE_BENCH();
    const char *args = "--quick --pass bwd --section a,b";
    char *out = NULL;
    int rc = run_bench(args, &out);
    const char *bwd = strstr(out, "\n    pass bwd: dt_attention_backward");
    int ok = rc == 0 && bwd && strstr(bwd, "(crit)") && !strstr(out, "\n    pass fwd") &&
             count(out, " bwd  ") == 4 && count(out, " fwd  ") == 0;
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);

    args = "--quick --pass bwd --json --section a,c";
    rc = run_bench(args, &out);
    ok = rc == 0 && strstr(out, "\"passes\": [\"bwd\"]") && !strstr(out, "\"pass\": \"fwd\"") &&
         count(out, "\"pass\": \"bwd\"") > 0 && strstr(out, "\"complete\": true\n}") &&
         no_nonfinite(out);
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

/* ------------------------------------------------------------- bad flags */

typedef struct bad_case {
    char name[96];
    const char *args, *message;
} bad_case;

static void test_bad_flags(void **state) {
    const bad_case *c = *state;
    REQUIRE_BENCH();
    char *out = NULL;
    int rc = run_bench(c->args, &out);
    /* Refused before anything ran: a message naming the flag, no table. */
    int ok = rc == 2 && strstr(out, c->message) && !strstr(out, "(a) ") && !strstr(out, "{");
    if (!ok) show(c->args, out);
    free(out);
    assert_int_equal(rc, 2);
    assert_true(ok);
}

int main(int argc, char **argv) {
    (void)argc;
    /* build[-variant]/tests/test_bench -> build[-variant]/bench/attention */
    const char *slash = argv[0] ? strrchr(argv[0], '/') : NULL;
    if (slash && slash - argv[0] < 4000) {
        snprintf(g_bench, sizeof g_bench, "%.*s/../bench/attention", (int)(slash - argv[0]),
                 argv[0]);
        if (access(g_bench, X_OK) != 0) snprintf(g_bench, sizeof g_bench, "build/bench/attention");
    }
    static bad_case bad[] = {
        {"", "--pass", "--pass takes fwd, bwd or fwd,bwd"},
        {"", "--pass sideways", "--pass takes fwd, bwd or fwd,bwd"},
        {"", "--pass fwd,fwd", "--pass takes fwd, bwd or fwd,bwd"},
        {"", "--pass fwd,", "--pass takes fwd, bwd or fwd,bwd"},
        {"", "--section d", "--section takes letters a, b, c"},
        {"", "--section ,", "--section names no section"},
        {"", "--iters 0", "--iters takes an integer"},
        {"", "--frobnicate", "unknown flag '--frobnicate'"},
    };
    struct CMUnitTest tests[16];
    size_t n = 0;
    tests[n++] = (struct CMUnitTest){"bench_attention/quick/json,pass=fwd+bwd",
                                     test_quick_json_both_passes, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_attention/quick/text,section=a+b,pass=fwd+bwd",
                                     test_quick_text_both_passes, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_attention/quick/pass=bwd", test_quick_backward_alone,
                                     NULL, NULL, NULL};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(bad[i].name, sizeof bad[i].name, "bench_attention/exit2/%s", bad[i].args);
        tests[n++] = (struct CMUnitTest){bad[i].name, test_bad_flags, NULL, NULL, &bad[i]};
    }
    return h_run_cases("bench", tests, n) ? 1 : 0;
}
