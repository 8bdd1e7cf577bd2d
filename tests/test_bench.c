/* tests/test_bench.c — a smoke test of build/bench/attention,
 * build/bench/blocks, build/bench/mlp and bench/attention_report.py: every
 * section and both passes run with --quick, and the flags are checked. It checks that the benchmarks run and report what
 * they say they report, not their figures.
 *
 *   - --quick --json: exit 0, a closed object whose kernel, ring and
 *     ring_cost rows carry "pass" for fwd and bwd, no NaN or Inf;
 *   - --quick --pass bwd (text and JSON): the backward alone, with the
 *     computed pairs columns in its table since it is the only one;
 *   - exit 2 with a message for bad --pass, --section and other flags;
 *   - (d), the work from the mask with packed documents and a window: each
 *     order's critical path and total in pairs equal the ones counted here by
 *     enumeration from the ranks' tokens (h_order_indices) and the rule
 *     written out (same document, j <= i, |i - j| < W); drawn documents: the
 *     same total for every order, a critical path of at least total / P;
 *     exit 2 for bad --docs, --window, --seq and --section d's flags;
 *   - (e), ring, Ulysses and the hybrid (P = 4, S = 64, both passes, JSON
 *     and text): a row per pass for the ring contiguous and striped,
 *     Ulysses over all 4 and the 2 x 2 hybrid, each with the bytes per kind
 *     the counters gave equal to the ones written out here (all-to-alls of
 *     (U-1)/U of q, k, v, o, lse forward, of those, dout, dq, dk, dv
 *     backward; the ring's R-1 K|V blocks, backward its fp32 dK|dV and the
 *     last home; the range check's all_reduce), "match" true, and a time;
 *     exit 2 for (d)'s flags with (e) alone and for --ranks above 8;
 *   - bench/blocks --quick: both sections and passes, one row per c and per
 *     order, every figure finite and positive; bad flags exit 2;
 *   - bench/blocks --quick --json: the configuration, one (r) row per pass
 *     and c and one (p) row per pass and order, each row's figures
 *     consistent with its times (r = causal / full, the flop count,
 *     ceiling = (r + P - 1) / (P r), achieved = ratio / ceiling, ...);
 *   - bench/blocks --group: each order's ring with a rank's steps G to a
 *     launch, their launches counted by hand, their outputs
 *     compared with the ring's (on the CPU, and on the wgmma forward where
 *     CUDA runs, the emulator included, with the tile model's K and V);
 *     bad --group values exit 2;
 *   - the summary of a traced launch (attention/cta_trace.c, bench/blocks
 *     --trace) on a timeline worked out by hand: CTAs, SMs, slots (a CTA
 *     starting as another ends takes its slot), span, drain, fill, the
 *     fitted cycles per tile and fixed cycles, the clock, and the fixed
 *     cost's split by the CTAs' marks (start, the loop's line, end; 32-bit
 *     marks that wrap);
 *   - the timeline of launches run back to back (bench/blocks (p) --trace)
 *     on records worked out by hand: per SM the union of its records busy,
 *     the holes between them, the time before its first and after its last;
 *     overlapping and touching records, records out of order; and bench/
 *     blocks (p) --trace on the wgmma forward where CUDA runs (the
 *     emulator under make CUDA=emu, a GPU): a timeline per order and for
 *     the one call, a record per query tile of each block that runs, its
 *     parts adding up to its wall; and the tile model's key tiles and
 *     visits (worked out by hand) and its F's (each giving back its ratio);
 *   - bench/attention_report.py --backend cpu --quick --no-torch (when
 *     python3 is on PATH; else skipped): exit 0, every table's heading in
 *     order, every step run;
 *     and with a bench/attention that hangs on --persistent 2: that
 *     launch's first step timed out, its later one skipped, every other
 *     step run;
 *   - bench/ncu_source.py on a small Nsight Compute source export written
 *     here, its shares and spans worked out by hand (python3 too);
 *   - bench/train_gpt_sdpa.py on the CPU, a tiny model: a result line whose
 *     MFU is train_gpt's formula worked out here (skipped without PyTorch);
 *   - bench/mlp --quick: the baseline rows and one row per mode and P, every
 *     figure finite and positive (fp32, and fp16 on the CPU); bad flags exit 2;
 *   - bench/ring: the configuration it ran, one row per block size, each
 *     row's best no more than its median and its GB/s the size over that
 *     median; bad flags exit 2.
 * The binary is found beside this test's build tree (build/tests/test_bench
 * -> build/bench/attention; make test builds it). When it is missing every
 * case is skipped with the reason (run `make`).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attention/cta_trace.h"
#include "harness.h"

static char g_bench[4096] = "build/bench/attention", g_blocks[4096] = "build/bench/blocks",
            g_mlp[4096] = "build/bench/mlp", g_ring[4096] = "build/bench/ring";

#define REQUIRE(path)                                                                     \
    do {                                                                                  \
        if (access(path, X_OK) != 0) {                                                    \
            print_message("skipped: %s is not built (run `make`)\n", path);               \
            skip();                                                                       \
        }                                                                                 \
    } while (0)
#define REQUIRE_BENCH() REQUIRE(g_bench)

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
         no_nonfinite(out) && strstr(out, "\"copies\": true");
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);

    /* Without the copies (DT_LOCAL_COPIES=0): the same ring, timed; the
     * configuration says so. */
    args = "--quick --pass bwd --json --section b --copies 0";
    rc = run_bench(args, &out);
    ok = rc == 0 && strstr(out, "\"copies\": false") && count(out, "\"b2b_ms\": ") > 0 &&
         strstr(out, "\"complete\": true\n}");
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

/* ------------------------------------------------------------ bench/blocks */

/* Rows of a table between from and to: indented lines that start with a digit. */
static int table_rows(const char *from, const char *to) {
    int n = 0;
    for (const char *p = strstr(from, "\n    "); p && (!to || p < to); p = strstr(p + 1, "\n    ")) {
        const char *c = p + 1;
        while (*c == ' ') c++;
        n += *c >= '0' && *c <= '9';
    }
    return n;
}

/* Every number printed after the header line is finite and positive. */
static int all_positive(const char *out) {
    const char *p = strchr(out, '\n');
    for (; p && *p; p++) {
        if ((*p == '-' && p[1] >= '0' && p[1] <= '9') || !strncmp(p, "nan", 3) ||
            !strncmp(p, "inf", 3))
            return 0;
    }
    return p != NULL;
}

static void test_blocks_quick(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    char *out = NULL;
    int rc = h_run_program(g_blocks, "--quick --backend cpu", &out);
    const char *rf = strstr(out, "(r) causal efficiency, pass fwd");
    const char *pf = strstr(out, "(p) the ring on one device, pass fwd");
    const char *rb = strstr(out, "(r) causal efficiency, pass bwd");
    const char *pb = strstr(out, "(p) the ring on one device, pass bwd");
    /* --quick: c = 64, 128 in (r); one ring size, three orders, in (p) */
    int ok = rc == 0 && rf && pf && rb && pb && rf < pf && pf < rb && rb < pb &&
             table_rows(rf, pf) == 2 && table_rows(pf, rb) == 3 && table_rows(rb, pb) == 2 &&
             table_rows(pb, NULL) == 3 && all_positive(out);
    if (!ok) print_error("bench/blocks --quick printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
}

/* A bench run with bad flags: 1 if it exits 2 and says `message` (and,
 * absent not NULL, prints no `absent`: no table was started); else
 * prints what it said and returns 0. */
static int exits_2(const char *program, const char *args, const char *message,
                   const char *absent) {
    char *out = NULL;
    int rc = h_run_program(program, args, &out);
    int ok = rc == 2 && strstr(out, message) && !(absent && strstr(out, absent));
    if (!ok) print_error("%s %s (rc %d) printed:\n%s\n", program, args, rc, out);
    free(out);
    return ok;
}

static void test_blocks_bad_flags(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    static const char *const bad[][2] = {
        {"--pass up", "--pass takes one or more of"}, {"--section q", "--section takes one or more of"},
        {"--pass ,", "--pass takes one or more of"}, {"--c 1,2,3,4,5,6,7,8,9", "at most 8 entries"},
        {"--ring-c 0", "--ring-c takes an integer"},
        {"--ring-c 32,33", "--ring-c 33: the tokens per rank must be even"},
        {"--dim 12", "--dim 12: the attention kernels take head dims"},
        {"--c", "--c takes a list"}, {"--dtype fp8", "--dtype takes one of"},
        {"--heads 6 --kv-heads 4", "--kv-heads 4 does not divide --heads 6"},
        {"--rows all", "--rows takes one of"},
        {"--group 8", "--group 8: a group holds 1 to P - 1 = 7 steps"},
        {"--ranks 4 --group 2,4", "--group 4: a group holds 1 to P - 1 = 3 steps"},
        {"--group 0", "--group takes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_true(exits_2(g_blocks, bad[i][0], bad[i][1], "(r) "));
}

/* The number after "key": at or after `from`, within the row that starts
 * there (up to the next '}'): 1 and *out, or 0. */
static int json_num(const char *from, const char *key, double *out) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *hit = strstr(from, pat), *end = strchr(from, '}');
    if (!hit || (end && hit > end)) return 0;
    char *stop = NULL;
    *out = strtod(hit + strlen(pat), &stop);
    return stop != hit + strlen(pat) && isfinite(*out);
}

/* a and b agree to what 6 printed decimals of each figure allow. */
static int near(double a, double b) {
    return fabs(a - b) <= 1e-3 * fmax(fabs(a), fabs(b)) + 1e-5;
}

/* One (r) row: r = causal / full, each striped r its ms over full, and the
 * TFLOPS the flop count of bench/blocks (4 H c c D, 2.5x for bwd, halved for
 * causal; H = 2, D = 64 with --quick) gives for the times. */
static int r_row_ok(const char *row, int bwd) {
    double c, full, causal, r, le, le_r, lt, lt_r, tf_full, tf_causal;
    if (!json_num(row, "c", &c) || !json_num(row, "full_ms", &full) ||
        !json_num(row, "causal_ms", &causal) || !json_num(row, "r", &r) ||
        !json_num(row, "striped_le_ms", &le) || !json_num(row, "striped_le_r", &le_r) ||
        !json_num(row, "striped_lt_ms", &lt) || !json_num(row, "striped_lt_r", &lt_r) ||
        !json_num(row, "tflops_full", &tf_full) || !json_num(row, "tflops_causal", &tf_causal))
        return 0;
    double flops = 4.0 * 2 * c * c * 64 * (bwd ? 2.5 : 1.0);
    return (c == 64 || c == 128) && full > 0 && causal > 0 && le > 0 && lt > 0 && r > 0 &&
           near(r, causal / full) && near(le_r, le / full) &&
           near(lt_r, lt / full) && near(tf_full, flops / (full * 1e9)) &&
           near(tf_causal, flops / 2 / (causal * 1e9));
}

/* One (p) row: ceiling = (r + P - 1) / (P r) with P = 8, achieved = ratio /
 * ceiling, S = P c, contiguous's ratio 1, times positive, the back-to-back
 * ring's ratio its time over the one call's; no serial b2b on the CPU
 * (there are no dependent launches to leave out). */
static int p_row_ok(const char *row) {
    double c, crit, total, ratio, ceiling, achieved, vs, r, S, single, b2b, b2b_vs;
    if (!json_num(row, "c", &c) || !json_num(row, "crit_ms", &crit) ||
        !json_num(row, "total_ms", &total) || !json_num(row, "ratio", &ratio) ||
        !json_num(row, "ceiling", &ceiling) || !json_num(row, "achieved", &achieved) ||
        !json_num(row, "vs_1_call", &vs) || !json_num(row, "r", &r) || !json_num(row, "S", &S) ||
        !json_num(row, "single_ms", &single) || !json_num(row, "b2b_ms", &b2b) ||
        !json_num(row, "b2b_vs_1_call", &b2b_vs))
        return 0;
    const char *serial = strstr(row, "\"b2b_serial_ms\": null"), *end = strchr(row, '}');
    if (!serial || serial > end || b2b <= 0 || !near(b2b_vs, b2b / single)) return 0;
    const char *order = strstr(row, "\"order\": ");
    if (!order) return 0;
    int contiguous = strncmp(order + 9, "\"contiguous\"", 12) == 0;
    return c == 32 && S == 256 && crit > 0 && total >= crit && single > 0 && r > 0 &&
           ratio > 0 && (!contiguous || ratio == 1.0) && near(ceiling, (r + 7) / (8 * r)) &&
           near(achieved, ratio / ceiling) && near(vs, total / single);
}

static void test_blocks_quick_json(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    char *out = NULL;
    int rc = h_run_program(g_blocks, "--quick --backend cpu --json", &out);
    static const char *const keys[] = {
        "\"bench\": \"blocks\"", "\"backend\": \"cpu\"", "\"kernels\": \"cpu\"",
        "\"kernel\": \"auto\"", "\"H\": 2,", "\"HKV\": 2,", "\"D\": 64,", "\"dtype\": \"fp32\"",
        "\"P\": 8,", "\"iters\": 2,", "\"passes\": [\"fwd\", \"bwd\"]",
        "\"sections\": [\"r\", \"p\"]", "\"c\": [64, 128]", "\"ring_c\": [32]",
    };
    int ok = rc == 0 && out[0] == '{' && !strstr(out, "(r) causal efficiency") &&
             strstr(out, "\n  \"complete\": true\n}\n") && no_nonfinite(out);
    for (size_t i = 0; ok && i < sizeof keys / sizeof *keys; i++) ok = strstr(out, keys[i]) != NULL;
    const char *r = ok ? strstr(out, "\"r\": [") : NULL, *p = ok ? strstr(out, "\"p\": [") : NULL;
    ok = r && p && r < p;
    /* (r): c = 64, 128 for fwd then bwd; (p): three orders per pass. */
    int n_r = 0, n_p = 0;
    for (const char *row = ok ? strstr(r, "{\"pass\": ") : NULL; ok && row;
         row = strstr(row + 1, "{\"pass\": ")) {
        int bwd = !strncmp(row + 10, "bwd", 3);
        if (row < p) ok = r_row_ok(row, bwd) && bwd == (n_r++ >= 2);
        else ok = p_row_ok(row) && bwd == (n_p++ >= 3);
    }
    ok = ok && n_r == 4 && n_p == 6;
    if (!ok) print_error("bench/blocks --quick --json printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
}

/* One shape flag alone (--dim): the head counts as by default. (It used to
 * leave both at 0, and the bench divided by them.) */
static void test_blocks_one_shape_flag(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    char *out = NULL;
    int rc = h_run_program(g_blocks, "--quick --backend cpu --json --section r --pass fwd --dim 64", &out);
    int ok = rc == 0 && strstr(out, "\"H\": 2,") && strstr(out, "\"HKV\": 2,") &&
             strstr(out, "\"D\": 64,") && strstr(out, "\n  \"complete\": true\n}\n");
    if (!ok) print_error("bench/blocks --dim 64 printed (rc %d):\n%s\n", rc, out);
    free(out);
    rc = h_run_program(g_blocks, "--quick --backend cpu --json --section r --pass fwd --kv-heads 1", &out);
    ok = ok && rc == 0 && strstr(out, "\"H\": 1,") && strstr(out, "\"HKV\": 1,");
    if (!ok) print_error("bench/blocks --kv-heads 1 printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
}

/* --rows own: (r)'s forward blocks as a call's only block; the JSON says
 * so and its rows are (r)'s rows, with the same invariants. */
static void test_blocks_rows_own(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    char *out = NULL;
    int rc = h_run_program(g_blocks, "--quick --backend cpu --json --section r --pass fwd --rows own",
                           &out);
    int ok = rc == 0 && out[0] == '{' && strstr(out, "\"rows\": \"own\"") &&
             strstr(out, "\n  \"complete\": true\n}\n") && no_nonfinite(out);
    int n_r = 0;
    const char *r = ok ? strstr(out, "\"r\": [") : NULL;
    for (const char *row = r ? strstr(r, "{\"pass\": ") : NULL; ok && row;
         row = strstr(row + 1, "{\"pass\": ")) {
        ok = r_row_ok(row, 0);
        n_r++;
    }
    ok = ok && r && n_r == 2;
    if (!ok) print_error("bench/blocks --rows own --json printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
    rc = h_run_program(g_blocks, "--quick --backend cpu --section r --pass fwd --rows own", &out);
    ok = rc == 0 && strstr(out, "forward blocks that start and finish their rows (--rows own)");
    if (!ok) print_error("bench/blocks --rows own printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
}

/* The "groups" entry of G in the (p) row of `order`: the group it took,
 * its launches and, where `model`, K and V; its time finite and positive,
 * its ratio to the one call its time over the row's single_ms, and its
 * outputs within `tol` of the ring's (G = 1: exactly the ring's, 0). */
static int group_ok(const char *out, const char *order, int G, double taken, double launches,
                    int model, double k, double v, double tol) {
    char at[64];
    snprintf(at, sizeof at, "\"order\": \"%s\"", order);
    const char *row = strstr(out, at);
    char key[32];
    snprintf(key, sizeof key, "{\"G\": %d,", G);
    const char *e = row ? strstr(row, key) : NULL, *next = row ? strstr(row + 1, "\"order\": ") : NULL;
    double g, n, ms, vs, single, o_err, lse_err, kk, vv;
    int ok = e && (!next || e < next) && json_num(e, "group", &g) && g == taken &&
             json_num(e, "launches", &n) && n == launches &&
             json_num(e, "b2b_ms", &ms) && ms > 0 && json_num(e, "b2b_vs_1_call", &vs) &&
             json_num(row, "single_ms", &single) && near(vs, ms / single) &&
             json_num(e, "o_err", &o_err) && json_num(e, "lse_err", &lse_err) &&
             o_err >= 0 && o_err <= tol && lse_err >= 0 && lse_err <= 1e-4 &&
             (G > 1 || (o_err == 0 && lse_err == 0));
    if (ok && model)
        ok = json_num(e, "tiles", &kk) && kk == k && json_num(e, "visits", &vv) && vv == v;
    return ok;
}

/* --group (forward): each order's ring once more with a rank's steps
 * grouped as the library groups them (bench/blocks' group_plan_make), on
 * the CPU's block kernel, P = 4 ranks. A rank's remote steps split where
 * its sources wrap from 0 to 3 (rank 0: 3 2 1; 1: 0 | 3 2; 2: 1 0 | 3; 3:
 * 2 1 0). Striped takes a power of two, 2 for G = 2 and 3 alike: 16
 * blocks, 4 + 2 + 2 + 2 + 2 = 12 launches (rank 0: 3 2 | 1; 1: 0 | 3 2;
 * 2: 1 0 | 3; 3: 2 1 | 0), the JSON's "group" 2. Contiguous:
 * the ring launches the 10 blocks with a pair (rank j's steps 0 to j); G
 * = 2 launches step 0's 4, then steps 1 and 2 of ranks 1 to 3 as 3 blocks
 * and step 3 of rank 3 as 1: 8; G = 3 the 4, then steps 1 to 3 of ranks 1
 * to 3 as 3: 7. Zigzag: the ring's 16; G = 2 launches 4 + 2 + 2 + 2 + 2
 * = 12 and G = 3 4 + 1 + 2 + 2 + 1 = 10. The bench itself fails where a grouped ring's outputs differ
 * from the ring's by more than the tolerance; the JSON shows that they
 * were compared (fp32: 1e-5). */
static void test_blocks_group(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    char *out = NULL;
    int rc = h_run_program(g_blocks, "--backend cpu --section p --pass fwd --ranks 4 --ring-c 32 "
                           "--iters 1 --group 2,3 --json", &out);
    int ok = rc == 0 && out && strstr(out, "\"group\": [2, 3]") &&
             strstr(out, "\n  \"complete\": true\n}\n") && no_nonfinite(out) &&
             group_ok(out, "contiguous", 1, 1, 10, 0, 0, 0, 0) &&
             group_ok(out, "contiguous", 2, 2, 8, 0, 0, 0, 1e-5) &&
             group_ok(out, "contiguous", 3, 3, 7, 0, 0, 0, 1e-5) &&
             group_ok(out, "zigzag", 1, 1, 16, 0, 0, 0, 0) &&
             group_ok(out, "zigzag", 2, 2, 12, 0, 0, 0, 1e-5) &&
             group_ok(out, "zigzag", 3, 3, 10, 0, 0, 0, 1e-5) &&
             group_ok(out, "striped", 1, 1, 16, 0, 0, 0, 0) &&
             group_ok(out, "striped", 2, 2, 12, 0, 0, 0, 1e-5) &&
             group_ok(out, "striped", 3, 2, 12, 0, 0, 0, 1e-5);
    if (!ok) print_error("bench/blocks --group 2,3 --json printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
    rc = h_run_program(g_blocks, "--backend cpu --section p --pass fwd --ranks 4 --ring-c 32 "
                       "--iters 1 --group 3", &out);
    ok = rc == 0 && strstr(out, "(g) a rank's steps grouped as dt_attention_options.group = G");
    if (!ok) print_error("bench/blocks --group 3 printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
}

/* ------------------------------------------- the CTA trace's summary (--trace) */

/* A record of a CTA on SM sm from t0 to t1 ns whose SM clock runs at 2 GHz
 * (its cycle counter starts at an SM's own base; SM 2's just below 2^32,
 * so that its 32-bit marks wrap), with `work` tiles and no marks. */
static dt_attn_cta_trace cta(uint32_t sm, uint64_t t0, uint64_t t1, uint32_t work) {
    const uint64_t base = sm == 2 ? (1ull << 32) - 300 : 1000000u * (sm + 1);
    return (dt_attn_cta_trace){{t0, t1}, {base + 2 * t0, base + 2 * t1}, sm, work, {0, 0}};
}

/* r with its marks: its first key tile landed `start` cycles after its
 * start, its loop 1900 work + 250 cycles long. */
static dt_attn_cta_trace marked(dt_attn_cta_trace r, uint64_t start) {
    r.mark[0] = (uint32_t)(r.clock[0] + start);
    r.mark[1] = (uint32_t)(r.clock[0] + start + 1900u * r.work + 250);
    return r;
}

/* A timeline worked out by hand. Two SMs; a CTA of w tiles lasts 1000 w +
 * 300 ns (2000 w + 600 cycles); SM 7 runs CTAs of 3 and 1 tiles from 0,
 * back to back, SM 2 CTAs of 2 and 0 tiles from 100; one record never
 * written. Then: 4 CTAs, 2 SMs, 2 slots (a CTA starting at the instant
 * another ends takes its slot), 6 tiles, span 4.6 us, drain 4600 - 3300 ns,
 * busy 3300 + 1300 + 2300 + 300 ns of 2 x 4600, and the CTAs with work on
 * the line 2000 w + 600. A third SM's CTA inside SM 7's first makes 3
 * slots; CTAs of one work give no line; no record gives zeros. */
static void test_trace_summary(void **state) {
    (void)state;
    dt_attn_cta_trace rec[6] = {cta(7, 0, 3300, 3), cta(2, 100, 2400, 2), {{0, 0}, {0, 0}, 0, 0, {0, 0}},
                                cta(2, 2400, 2700, 0), cta(7, 3300, 4600, 1)};
    dt_attn_trace_stats t;
    assert_int_equal(dt_attn_trace_summarize(rec, 5, &t), DT_SUCCESS);
    assert_int_equal(t.ctas, 4);
    assert_int_equal(t.sms, 2);
    assert_int_equal(t.slots, 2);
    assert_int_equal(t.work, 6);
    assert_true(fabs(t.span_us - 4.6) < 1e-12);
    assert_true(fabs(t.drain_us - 1.3) < 1e-12);
    assert_true(fabs(t.fill - 7200.0 / 9200.0) < 1e-12);
    assert_true(fabs(t.cycles_per_tile - 2000) < 1e-9);
    assert_true(fabs(t.overhead_cycles - 600) < 1e-9);
    assert_true(fabs(t.ghz - 2.0) < 1e-12);
    assert_int_equal(t.marked, 0);   /* no marks: no split of the fixed cost */
    assert_true(isnan(t.start_cycles) && isnan(t.end_cycles) && isnan(t.loop_fixed_cycles));

    /* The CTAs of 3, 2 and 1 tiles marked, their first key tile landed 100,
     * 200 and 150 cycles in (SM 2's marks past 2^32 where its clock is
     * not): start 150 on average, the loop on 1900 w + 250, so the end
     * 2000 w + 600 - start - loop = 100 w + 350 - start: 550, 350, 300. */
    rec[0] = marked(rec[0], 100);
    rec[1] = marked(rec[1], 200);
    rec[4] = marked(rec[4], 150);
    assert_int_equal(dt_attn_trace_summarize(rec, 5, &t), DT_SUCCESS);
    assert_int_equal(t.marked, 3);
    assert_true(fabs(t.start_cycles - 150) < 1e-9);
    assert_true(fabs(t.loop_cycles_per_tile - 1900) < 1e-9);
    assert_true(fabs(t.loop_fixed_cycles - 250) < 1e-9);
    assert_true(fabs(t.end_cycles - 1200.0 / 3) < 1e-9);
    assert_true(fabs(t.cycles_per_tile - 2000) < 1e-9);   /* the marks change nothing else */
    assert_true(fabs(t.overhead_cycles - 600) < 1e-9);

    rec[5] = cta(40, 500, 1500, 1);   /* inside SM 7's first CTA and SM 2's; unmarked */
    assert_int_equal(dt_attn_trace_summarize(rec, 6, &t), DT_SUCCESS);
    assert_int_equal(t.ctas, 5);
    assert_int_equal(t.sms, 3);
    assert_int_equal(t.slots, 3);
    assert_int_equal(t.marked, 3);

    /* one SM whose records overlap (a persistent CTA's query tiles in the
     * overlapped order): 2 slots, and the SM never idle */
    dt_attn_cta_trace overlapping[2] = {cta(5, 0, 2000, 2), cta(5, 1500, 3000, 1)};
    assert_int_equal(dt_attn_trace_summarize(overlapping, 2, &t), DT_SUCCESS);
    assert_int_equal(t.slots, 2);
    assert_true(fabs(t.fill - 1.0) < 1e-12);

    dt_attn_cta_trace same[3] = {cta(0, 0, 5000, 4), cta(1, 0, 5200, 4), cta(0, 5000, 9000, 4)};
    assert_int_equal(dt_attn_trace_summarize(same, 3, &t), DT_SUCCESS);
    assert_int_equal(t.slots, 2);
    assert_true(isnan(t.cycles_per_tile) && isnan(t.overhead_cycles));
    assert_true(fabs(t.drain_us - 4.0) < 1e-12);

    assert_int_equal(dt_attn_trace_summarize(rec + 2, 1, &t), DT_SUCCESS);
    assert_int_equal(t.ctas, 0);
    assert_int_equal(t.slots, 0);
    assert_true(t.span_us == 0 && t.drain_us == 0);
}

/* Launches back to back as one timeline, worked out by hand (records
 * given out of order, one never written). SM 7 runs [0, 3300] and [3300,
 * 4600] (no hole where one ends as the next starts), then [5000, 6000];
 * SM 2 [100, 2400] with [200, 1000] inside it, [2400, 2700] and [2600,
 * 3000] overlapping it (two CTAs an SM). The wall is 0 to 6000 ns. SM 7:
 * busy 4600 + 1000, idle 400 between; SM 2: idle 100 before its first,
 * busy 2900, idle 3000 after its last. Means over the 2 SMs: busy 4.25 us,
 * idle 0.05 before, 0.2 between, 1.5 after, which add up to the wall. */
static void test_trace_timeline(void **state) {
    (void)state;
    const dt_attn_cta_trace rec[8] = {cta(2, 2600, 3000, 1), cta(7, 5000, 6000, 1),
                                      cta(7, 3300, 4600, 1), cta(2, 100, 2400, 2),
                                      {{0, 0}, {0, 0}, 0, 0, {0, 0}}, cta(2, 200, 1000, 1),
                                      cta(7, 0, 3300, 3), cta(2, 2400, 2700, 0)};
    dt_attn_trace_timeline t;
    assert_int_equal(dt_attn_trace_timeline_of(rec, 8, &t), DT_SUCCESS);
    assert_int_equal(t.records, 7);
    assert_int_equal(t.sms, 2);
    assert_true(fabs(t.wall_us - 6.0) < 1e-12);
    assert_true(fabs(t.busy_us - 4.25) < 1e-12);
    assert_true(fabs(t.idle_start_us - 0.05) < 1e-12);
    assert_true(fabs(t.idle_between_us - 0.2) < 1e-12);
    assert_true(fabs(t.idle_end_us - 1.5) < 1e-12);

    /* one SM's records alone: no idle but its holes */
    assert_int_equal(dt_attn_trace_timeline_of(rec + 1, 2, &t), DT_SUCCESS);
    assert_int_equal(t.sms, 1);
    assert_true(fabs(t.wall_us - 2.7) < 1e-12 && fabs(t.busy_us - 2.3) < 1e-12);
    assert_true(t.idle_start_us == 0 && t.idle_end_us == 0);
    assert_true(fabs(t.idle_between_us - 0.4) < 1e-12);

    assert_int_equal(dt_attn_trace_timeline_of(rec + 4, 1, &t), DT_SUCCESS);
    assert_int_equal(t.records, 0);
    assert_true(t.sms == 0 && t.wall_us == 0 && t.busy_us == 0);
}

#ifdef DT_HAVE_CUDA
/* The tile model's per-visit cost F under `key` of the (m) object at
 * `model`, for a ring of K tiles and V visits against a call of Kc and Vc
 * that takes `ratio` times the call: K + F V = ratio (Kc + F Vc). No such
 * F where V <= ratio Vc (a ratio that timing on the emulator can give): then
 * null. */
static int model_f_ok(const char *model, const char *key, double ratio, double k, double v,
                      double kc, double vc) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": null", key);
    const char *null = strstr(model, pat), *end = strchr(model, '}');
    if (null && (!end || null < end)) return v <= ratio * vc * (1 + 1e-6);
    double f;
    return json_num(model, key, &f) && v > ratio * vc && near((k + f * v) / (kc + f * vc), ratio);
}

/* bench/blocks (p) --trace on the wgmma forward (the CUDA emulator, or a
 * GPU): every p row carries the b2b ring's timeline and the one call's,
 * with a record per query tile of every block that runs (P = 2, c = 128,
 * one head: contiguous's step-1 block of rank 0 has no pair and does not
 * launch, so 3 records, striped and zigzag 4, the call on S = 256 2), and
 * the mean SM's busy and idle parts adding up to the wall; with the
 * producer warpgroup (the default) and with thread 0's loads (--producer
 * 0), and the
 * default with the rows' waits (--dependent 2), which the JSON reports,
 * the same records. Skipped where no CUDA device answers. One run with
 * --producer `producer` --dependent `dependent`: 1 if it printed what it
 * should, 0 if not, -1 if no CUDA device answered. */
static int blocks_trace_timeline(int producer, int dependent) {
    char *out = NULL;
    char args[256];
    snprintf(args, sizeof args, "--backend cuda --kernel wgmma --section p --pass fwd --ranks 2 "
             "--ring-c 128 --heads 1 --kv-heads 1 --dim 128 --dtype bf16 --iters 1 --trace "
             "--json --producer %d --dependent %d", producer, dependent);
    int rc = h_run_program(g_blocks, args, &out);
    if (rc != 0 && out && strstr(out, "needs a CUDA device")) {
        free(out);
        return -1;
    }
    static const char *const orders[] = {"contiguous", "striped", "zigzag"};
    static const double records[] = {3, 4, 4};
    /* The tile model's counts, worked out by hand for P = 2, c = 128 and
     * 128 x 128 tiles: every block that has a pair takes one key tile in
     * its one query tile (contiguous: rank 0 against rank 1's keys has
     * none); the one call on 256 positions 1 + 2 key tiles, 2 visits. */
    static const double tiles[] = {3, 4, 4};
    double reported = -1;
    int ok = rc == 0 && out != NULL && json_num(out, "producer", &reported) &&
             reported == producer &&
             strstr(out, dependent == 2 ? "\"rows_waits\": true" : "\"rows_waits\": false");
    for (int i = 0; ok && i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "\"order\": \"%s\"", orders[i]);
        const char *row = strstr(out, key);
        const char *tl[2] = {row ? strstr(row, "\"b2b_timeline\"") : NULL,
                             row ? strstr(row, "\"single_timeline\"") : NULL};
        const char *model = row ? strstr(row, "\"model\"") : NULL;
        double bm, bn, kr, vr, kc, vc, b2b_vs, busy_ms[2];
        ok = model && json_num(model, "bm", &bm) && json_num(model, "bn", &bn) &&
             json_num(model, "tiles", &kr) && json_num(model, "visits", &vr) &&
             json_num(model, "single_tiles", &kc) && json_num(model, "single_visits", &vc) &&
             json_num(row, "b2b_vs_1_call", &b2b_vs) && tl[0] && tl[1] &&
             json_num(tl[0], "busy_ms", &busy_ms[0]) && json_num(tl[1], "busy_ms", &busy_ms[1]);
        /* F: the per-visit cost with which K + F V over the call's Kc + F Vc
         * is the ratio (b2b's; the traced busy times'; 1.05) */
        ok = ok && bm == 128 && bn == 128 && kr == tiles[i] && vr == tiles[i] && kc == 3 &&
             vc == 2 && model_f_ok(model, "f_b2b", b2b_vs, kr, vr, kc, vc) &&
             model_f_ok(model, "f_busy", busy_ms[0] / busy_ms[1], kr, vr, kc, vc) &&
             model_f_ok(model, "f_for_1_05", 1.05, kr, vr, kc, vc);
        for (int k = 0; ok && k < 2; k++) {
            double n, sms, wall, busy, idle, start, between, end;
            ok = tl[k] && json_num(tl[k], "records", &n) && json_num(tl[k], "sms", &sms) &&
                 json_num(tl[k], "wall_ms", &wall) && json_num(tl[k], "busy_ms", &busy) &&
                 json_num(tl[k], "idle", &idle) && json_num(tl[k], "idle_start_ms", &start) &&
                 json_num(tl[k], "idle_between_ms", &between) &&
                 json_num(tl[k], "idle_end_ms", &end);
            ok = ok && n == (k == 0 ? records[i] : 2) && sms >= 1 && busy > 0 && wall >= busy &&
                 start >= 0 && between >= 0 && end >= 0 &&
                 near(busy + start + between + end, wall) && near(idle, 1 - busy / wall);
        }
    }
    if (!ok) print_error("bench/blocks %s printed (rc %d):\n%s\n", args, rc, out ? out : "");
    free(out);
    return ok;
}

/* --group on the wgmma forward where CUDA runs: P = 4 ranks of c = 128,
 * one head, 128 x 128 tiles. Contiguous: every block of the ring is one
 * query tile against its keys' one tile: 10 blocks, 10 key tiles, 10
 * visits; with G = 3 step 0's 4 diagonal blocks, then rank j's steps 1 to
 * j as one block of j key tiles: 7 launches, 10 key tiles, 7 visits.
 * Zigzag (chunks of 64 tokens): the ring's 16 blocks of one key tile and
 * one visit each; with G = 3 (launches as in test_blocks_group) 10 blocks
 * and visits, 14 key tiles (a group's two runs of 64-row chunks share
 * tiles), as mask.h's dt_attn_tiles counts them. Striped: the ring's 16
 * blocks of one key tile each; with G = 3 (taking 2, launches as in
 * test_blocks_group) a launch of two blocks reads their keys in turns
 * from two slots, two key tiles: 12 launches, 16 key tiles, 12 visits. The
 * outputs within bf16's 2e-2 of the ring's. With --trace each G's back to
 * back run as one timeline: a record per query tile's visit (the wgmma
 * forward's), so as many records as visits, and its F busy. 1 if it
 * printed that, 0 if not, -1 if no CUDA device answered. */
static int blocks_group_wgmma(void) {
    char *out = NULL;
    const char *args = "--backend cuda --kernel wgmma --section p --pass fwd --ranks 4 --ring-c 128 "
                       "--heads 1 --kv-heads 1 --dim 128 --dtype bf16 --iters 1 --group 3 --json "
                       "--trace";
    int rc = h_run_program(g_blocks, args, &out);
    if (rc != 0 && out && strstr(out, "needs a CUDA device")) {
        free(out);
        return -1;
    }
    int ok = rc == 0 && out && group_ok(out, "contiguous", 1, 1, 10, 1, 10, 10, 0) &&
             group_ok(out, "contiguous", 3, 3, 7, 1, 10, 7, 2e-2) &&
             group_ok(out, "zigzag", 1, 1, 16, 1, 16, 16, 0) &&
             group_ok(out, "zigzag", 3, 3, 10, 1, 14, 10, 2e-2) &&
             group_ok(out, "striped", 1, 1, 16, 1, 16, 16, 0) &&
             group_ok(out, "striped", 3, 2, 12, 1, 16, 12, 2e-2);
    static const char *const orders[] = {"contiguous", "striped", "zigzag"};
    static const double visits[3][2] = {{10, 7}, {16, 12}, {16, 10}};   /* G = 1, 3 */
    for (int i = 0; ok && i < 3; i++)
        for (int g = 0; ok && g < 2; g++) {
            char at[64], key[32];
            snprintf(at, sizeof at, "\"order\": \"%s\"", orders[i]);
            snprintf(key, sizeof key, "{\"G\": %d,", g ? 3 : 1);
            const char *row = strstr(out, at), *e = row ? strstr(row, key) : NULL;
            const char *tl = e ? strstr(e, "\"b2b_timeline\"") : NULL;
            double records, busy, wall, f;
            ok = tl && json_num(tl, "records", &records) && records == visits[i][g] &&
                 json_num(tl, "busy_ms", &busy) && busy > 0 && json_num(tl, "wall_ms", &wall) &&
                 wall >= busy && (json_num(e, "f_busy", &f) || strstr(e, "\"f_busy\": null"));
        }
    if (!ok) print_error("bench/blocks %s printed (rc %d):\n%s\n", args, rc, out ? out : "");
    free(out);
    return ok;
}
#endif

static void test_blocks_group_wgmma(void **state) {
    (void)state;
    REQUIRE(g_blocks);
#ifndef DT_HAVE_CUDA
    print_message("skipped: a build without CUDA (the wgmma kernel is CUDA's)\n");
    skip();
#else
    const int ok = blocks_group_wgmma();
    if (ok < 0) {
        print_message("skipped: no CUDA device (make CUDA=emu test runs it on the emulator)\n");
        skip();
    }
    assert_int_equal(ok, 1);
#endif
}

static void test_blocks_trace_timeline(void **state) {
    (void)state;
    REQUIRE(g_blocks);
#ifndef DT_HAVE_CUDA
    print_message("skipped: a build without CUDA (the CTA records are the CUDA kernels')\n");
    skip();
#else
    for (int run = 0; run < 3; run++) {   /* producer 1, 0; 1 with the rows' waits */
        const int ok = blocks_trace_timeline(run < 2 ? 1 - run : 1, run < 2 ? 1 : 2);
        if (ok < 0) {
            print_message("skipped: no CUDA device (make CUDA=emu test runs it on the emulator)\n");
            skip();
        }
        assert_int_equal(ok, 1);
    }
#endif
}

/* ------------------------------- bench/attention (e) ring, Ulysses, hybrid */

/* The bytes per rank of an (e) row, written out (sent = received): [0]
 * p2p (the ring), [1] all-to-all (Ulysses), [2] all_reduce (the call's
 * range check over the world), and their calls. A rank's part x of q, k,
 * v, o (B S/P H D elements) and lse (B H S/P fp32); an all-to-all over U
 * ranks sends (U-1)/U of it. */
static void ulysses_expected(int bwd, double P, double R, double U, double S, double B, double H,
                             double D, double es, double bytes[3], double calls[3]) {
    const double x = B * (S / P) * H * D * es, lse = B * H * (S / P) * 4;
    bytes[1] = (U - 1) / U * ((bwd ? 8 : 4) * x + lse);   /* q k v o (dout dq dk dv) and lse */
    calls[1] = U > 1 ? (bwd ? 9 : 5) : 0;
    const double kv = 2 * B * (S / R) * (H / U) * D;      /* K|V after the all-to-all */
    bytes[0] = bwd ? (R - 1) * kv * (es + 4) + (R > 1 ? kv * es : 0) : (R - 1) * kv * es;
    calls[0] = R > 1 ? (bwd ? R + 2 : R - 1) : 0;
    const double n = bwd ? 4 : 3;
    bytes[2] = 2 * (P - 1) * ceil(n / P) * 4;
    calls[2] = 1;
}

static void test_ulysses_json(void **state) {
    (void)state;
    REQUIRE_BENCH();
    const char *args = "--section e --json --ranks 4 --seq 64";
    char *out = NULL;
    int rc = run_bench(args, &out);
    const char *sec = strstr(out, "\"ulysses\": [");
    int ok = rc == 0 && sec && strstr(out, "\"complete\": true\n}") && no_nonfinite(out) &&
             count(out, "\"algorithm\": ") == 8 && count(out, "\"match\": true") == 8;
    static const char *const algs[4] = {"ring contiguous", "ring striped", "ulysses U=4",
                                        "hybrid 2x2 striped"};
    static const char *const kinds[3] = {"p2p", "a2a", "all_reduce"};
    for (int pass = 0; ok && pass < 2; pass++)
        for (int a = 0; ok && a < 4; a++) {
            char key[96];
            snprintf(key, sizeof key, "{\"pass\": \"%s\", \"algorithm\": \"%s\"",
                     pass ? "bwd" : "fwd", algs[a]);
            const char *row = strstr(sec, key);
            double P, R, U, S, B, H, D, got, total = 0, sent, recv, wall;
            ok = row && json_num(row, "P", &P) && json_num(row, "R", &R) &&
                 json_num(row, "U", &U) && json_num(row, "S", &S) && json_num(row, "B", &B) &&
                 json_num(row, "H", &H) && json_num(row, "D", &D) && json_num(row, "sent", &sent) &&
                 json_num(row, "recv", &recv) && json_num(row, "wall_ms", &wall) &&
                 strstr(row, "\"dtype\": \"fp32\"") && P == 4 && S == 64 &&
                 R * U == P && (a < 2 ? R == 4 : a == 2 ? U == 4 : U == 2) && wall > 0;
            double bytes[3], calls[3];
            if (ok) ulysses_expected(pass, P, R, U, S, B, H, D, 4, bytes, calls);
            for (int k = 0; ok && k < 3; k++) {
                char name[48];
                double c, f;
                snprintf(name, sizeof name, "%s_calls", kinds[k]);
                ok = json_num(row, name, &c) && c == calls[k];
                snprintf(name, sizeof name, "%s_sent", kinds[k]);
                ok = ok && json_num(row, name, &got) && got == bytes[k];
                snprintf(name, sizeof name, "%s_recv", kinds[k]);
                ok = ok && json_num(row, name, &got) && got == bytes[k];
                snprintf(name, sizeof name, "formula_%s", kinds[k]);
                ok = ok && json_num(row, name, &f) && f == bytes[k];
                total += bytes[k];
                if (!ok)
                    print_error("%s %s: %s: expected %.0f calls, %.0f bytes\n", pass ? "bwd" : "fwd",
                                algs[a], kinds[k], calls[k], bytes[k]);
            }
            ok = ok && sent == total && recv == total && json_num(row, "formula", &got) &&
                 got == total;
        }
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);

    /* The text table: its rows and their "match" column. */
    args = "--section e --ranks 4 --seq 64 --pass fwd";
    rc = run_bench(args, &out);
    ok = rc == 0 && strstr(out, "(e) ring, Ulysses and the hybrid") &&
         strstr(out, "\n    64      0      fwd  ring contiguous ") &&
         strstr(out, "\n    64      0      fwd  hybrid 2x2 striped ") &&
         count(out, " yes ") == 4 && !strstr(out, " NO ") && !strstr(out, "(a) ") &&
         !strstr(out, "(d) ");
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

/* --------------------------------------------- bench/attention (d) mask work */

/* Critical path (sum over ring steps of the busiest rank) and total of the
 * causal pairs of a sequence of S tokens, documents `lens` (count of them,
 * summing to S) and a window (0: none) on P ranks of `order`, counted by
 * enumeration: at step t rank j pairs its tokens with those of rank
 * (j - t) mod P. */
static void count_mask_work(dt_order order, int64_t S, int P, const int64_t *lens, int count,
                            int64_t window, long long *crit, long long *total) {
    const int64_t n = S / P;
    int64_t *doc = malloc((size_t)S * sizeof *doc), *idx = malloc((size_t)S * sizeof *idx);
    assert_true(doc && idx);
    for (int64_t d = 0, at = 0; d < count; at += lens[d++])
        for (int64_t t = at; t < at + lens[d]; t++) doc[t] = d;
    if (count == 0)
        for (int64_t t = 0; t < S; t++) doc[t] = 0;
    for (int j = 0; j < P; j++) h_order_indices(order, S, P, j, idx + j * n);
    *crit = *total = 0;
    for (int t = 0; t < P; t++) {
        long long busiest = 0;
        for (int j = 0; j < P; j++) {
            const int src = ((j - t) % P + P) % P;
            long long pairs = 0;
            for (int64_t x = 0; x < n; x++)
                for (int64_t y = 0; y < n; y++) {
                    const int64_t qi = idx[j * n + x], kj = idx[src * n + y];
                    pairs += doc[qi] == doc[kj] && kj <= qi && (window == 0 || qi - kj < window);
                }
            *total += pairs;
            if (pairs > busiest) busiest = pairs;
        }
        *crit += busiest;
    }
    free(doc);
    free(idx);
}

typedef struct mask_case {
    char name[96];
    int64_t S;
    int P;
    const char *docs;   /* a list, or NULL */
    int64_t window;
} mask_case;

/* --section d --json on an explicit list: every order's row agrees with
 * count_mask_work, its ratio_ideal is critical * P / total. */
static void test_mask_work(void **state) {
    const mask_case *c = *state;
    REQUIRE_BENCH();
    char args[256], docs[128] = "", window[32] = "";
    if (c->docs) snprintf(docs, sizeof docs, " --docs %s", c->docs);
    if (c->window) snprintf(window, sizeof window, " --window %lld", (long long)c->window);
    snprintf(args, sizeof args, "--section d --json --seq %lld --ranks %d%s%s", (long long)c->S,
             c->P, docs, window);
    char *out = NULL;
    int rc = run_bench(args, &out);
    int64_t lens[64];
    int count = 0;
    for (const char *p = c->docs; p && *p && count < 64;) {
        char *end = NULL;
        lens[count++] = strtoll(p, &end, 10);
        p = *end ? end + 1 : end;
    }
    static const dt_order ords[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
    int ok = rc == 0 && strstr(out, "\"mask_work\": [") && strstr(out, "\"complete\": true\n}") &&
             no_nonfinite(out);
    for (int o = 0; o < 3 && ok; o++) {
        char key[64];
        snprintf(key, sizeof key, "{\"order\": \"%s\"", dt_order_name(ords[o]));
        const char *row = strstr(out, key);
        double crit = -1, total = -1, ratio = -1, window_got = -1;
        long long want_crit, want_total;
        count_mask_work(ords[o], c->S, c->P, lens, count, c->window, &want_crit, &want_total);
        ok = row && json_num(row, "critical_pairs", &crit) && json_num(row, "total_pairs", &total) &&
             json_num(row, "ratio_ideal", &ratio) && json_num(row, "window", &window_got) &&
             crit == (double)want_crit && total == (double)want_total &&
             fabs(ratio - want_crit * (double)c->P / want_total) < 1e-4 &&
             window_got == (double)c->window;
        if (!ok)
            print_error("%s: %s: critical %.0f total %.0f ratio %.4f, counted here %lld, %lld\n",
                        c->name, dt_order_name(ords[o]), crit, total, ratio, want_crit, want_total);
    }
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

/* (d) with drawn documents: the text table (its three rows and what it
 * counts), and in JSON the same total for every order (the rule's pairs do
 * not depend on the sharding), a critical path of at least total / P, the
 * draws the seed's (the same twice). */
static void test_mask_work_random(void **state) {
    (void)state;
    REQUIRE_BENCH();
    const char *args = "--seq 4096 --ranks 8 --docs random:256 --seed 3 --window 300";
    char *out = NULL;
    int rc = run_bench(args, &out);
    int ok = rc == 0 && strstr(out, "(d) work from the mask") && strstr(out, "COUNTED") &&
             strstr(out, "documents drawn log-normal (mean 256, sigma 1) from seed 7") &&
             strstr(out, "window 300") && strstr(out, "\n    contiguous ") &&
             strstr(out, "\n    striped ") && strstr(out, "\n    zigzag ") && !strstr(out, "(a) ") &&
             !strstr(out, "(b) ");
    if (!ok) show(args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);

    char *runs[2] = {NULL, NULL};
    const char *jargs = "--json --seq 4096 --ranks 8 --docs random:256 --seed 3";
    for (int r = 0; r < 2; r++) rc |= run_bench(jargs, &runs[r]);
    double total[3], crit[3], docs = 0;
    static const char *const names[3] = {"contiguous", "striped", "zigzag"};
    ok = rc == 0;
    for (int o = 0; o < 3 && ok; o++) {
        char key[64];
        snprintf(key, sizeof key, "{\"order\": \"%s\"", names[o]);
        const char *row = strstr(runs[0], key), *again = strstr(runs[1], key);
        double crit2 = -1;
        ok = row && again && json_num(row, "critical_pairs", &crit[o]) &&
             json_num(row, "total_pairs", &total[o]) && json_num(row, "doc_count", &docs) &&
             json_num(again, "critical_pairs", &crit2) && crit2 == crit[o] &&
             total[o] == total[0] && crit[o] * 8 >= total[o] && docs > 1 &&
             total[o] >= 4096 && total[o] <= 4096.0 * 4097 / 2;
    }
    if (!ok) show(jargs, runs[0]);
    free(runs[0]);
    free(runs[1]);
    assert_true(ok);
}

/* -------------------------------------------------- bench/attention_report.py */

static char g_report[4096] = "bench/attention_report.py", g_build[4096] = "build";

/* Whether an executable `name` is on PATH. */
static int on_path(const char *name) {
    const char *path = getenv("PATH");
    char dir[4096];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)(n < 4000 ? n : 4000), path, name);
        if (n > 0 && access(dir, X_OK) == 0) return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

/* Where the last of want[0..n-1] begins if each is in text after the one
 * before, else NULL. */
static const char *in_order(const char *text, const char *const *want, size_t n) {
    const char *at = text;
    for (size_t i = 0; at && i < n; i++)
        if ((at = strstr(at, want[i])) && i + 1 < n) at += strlen(want[i]);
    return at;
}

/* Skips the calling case where python3 is not on PATH. */
static void require_python3(void) {
    if (!on_path("python3")) {
        print_message("skipped: no python3\n");
        skip();
    }
}

/* The smoke test of the GPU report's one command: the CPU backend, tiny
 * shapes, no PyTorch. Every table in the order run, every step run (none
 * refused, failed or skipped), the torch columns n/a. */
static void test_report_quick(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    REQUIRE(g_bench);
    require_python3();
    char args[9000];
    snprintf(args, sizeof args, "'%s' --backend cpu --quick --no-torch --build '%s'", g_report,
             g_build);
    char *out = NULL;
    int rc = h_run_program("python3", args, &out);
    static const char *const headings[] = {
        "# dtensor attention report (bench/attention_report.py)\n",
        "\n## causal efficiency: r = causal time / full time, forward\n",
        "\n## causal efficiency, CTA timelines: where a block's time goes\n",
        "\n## the ring on one device, forward\n",
        "\n## the ring, CTA timelines: its launches against one call\n",
        "\n## the ring, one timeline: back to back against one call\n",
        "\n## exposed communication of the ring\n",
        "\n## exposed communication, one timeline: the backward ring (P = 8) back to back "
        "against one call\n",
        "\n## forward TFLOPS, bf16\n",
        "\n## backward TFLOPS, bf16\n",
        "\n## backward CTA timelines: where a backward block's time goes\n",
        "\n## forward through the public API: dt_attention_forward, bf16\n",
        "\n## the ring, steps grouped: fewer visits\n",
        "\n## summary\n",
    };
    const char *at = NULL;   /* where the last heading, the summary, begins */
    int ok = rc == 0 && (at = in_order(out, headings, sizeof headings / sizeof *headings));
    /* The summary's steps line names one status: ok. */
    const char *steps = ok ? strstr(at, "\n- steps: ") : NULL;
    int n = 0, len = 0;
    ok = steps && sscanf(steps, "\n- steps: %d ok%n", &n, &len) == 1 && n > 0 &&
         steps[len] == '\n' && strstr(out, "| n/a: --no-torch |") &&
         strstr(out, "- torch: not run (--no-torch)\n") && !strstr(out, "Traceback") &&
         strstr(out, "| wall ms | b2b ms | no-copy ms | exposed | mark | blocks ms | "
                     "exposed (blocks) | exposed (wall) |");
    if (!ok) print_error("python3 %s (rc %d) printed:\n%s\n", args, rc, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

/* path made absolute (from the working directory) into out. */
static int absolute(char *out, size_t size, const char *path) {
    char cwd[2048];
    if (path[0] == '/') return snprintf(out, size, "%s", path) < (int)size ? 0 : -1;
    if (!getcwd(cwd, sizeof cwd)) return -1;
    return snprintf(out, size, "%s/%s", cwd, path) < (int)size ? 0 : -1;
}

/* Writes `text` to `path` with mode 0755. */
static int write_script(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    ok = fclose(f) == 0 && ok;
    return ok && chmod(path, 0755) == 0 ? 0 : -1;
}

/* A launch variant that hangs takes only its own later steps with it: a
 * build directory whose bench/attention sleeps on --persistent 2 (and runs
 * the real one otherwise), attention_report.py with a 10 s step timeout
 * (each step here takes under a second). The exposed communication's first
 * --persistent 2 step (bench/attention (b)) times out, its later one (the
 * same without the copies)
 * is skipped and says why, and every other step (the wgmma kernel's
 * default launch, bench/blocks among them) runs. */
static void test_report_hung_variant(void **state) {
    (void)state;
    REQUIRE(g_blocks);
    REQUIRE(g_bench);
    require_python3();
    char dir[] = "/tmp/dt_report_XXXXXX", real_blocks[4096], real_bench[4096];
    assert_non_null(mkdtemp(dir));
    assert_int_equal(absolute(real_blocks, sizeof real_blocks, g_blocks), 0);
    assert_int_equal(absolute(real_bench, sizeof real_bench, g_bench), 0);
    char path[4200], text[9000];
    snprintf(path, sizeof path, "%s/bench", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/bench/blocks", dir);
    snprintf(text, sizeof text, "#!/bin/sh\nexec '%s' \"$@\"\n", real_blocks);
    assert_int_equal(write_script(path, text), 0);
    snprintf(path, sizeof path, "%s/bench/attention", dir);
    snprintf(text, sizeof text,
             "#!/bin/sh\ncase \" $* \" in *\" --persistent 2 \"*) exec sleep 100 ;; esac\n"
             "exec '%s' \"$@\"\n", real_bench);
    assert_int_equal(write_script(path, text), 0);

    char args[9000];
    snprintf(args, sizeof args,
             "'%s' --backend cpu --quick --no-torch --kernels wgmma --step-timeout 10 --build '%s'",
             g_report, dir);
    char *out = NULL;
    int rc = h_run_program("python3", args, &out);
    /* The summary: "- steps: N ok, ..." and a line "- STATUS: COMMAND
     * (DETAIL)" per step not ok, each command naming `dir`. */
    const char *summary = strstr(out, "\n## summary\n");
    int timed_out = 0, skipped = 0, others = 0, ok_steps = 0;
    for (const char *ln = summary; ln && *ln;) {
        const size_t len = strcspn(ln, "\n");
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)len, ln);
        ln += len + (ln[len] != 0);
        sscanf(line, "- steps: %d ok", &ok_steps);
        if (!strstr(line, dir)) continue;
        const int variant = strstr(line, " --persistent 2") != NULL;
        if (variant && strncmp(line, "- timed out: ", 13) == 0) timed_out++;
        else if (variant && strncmp(line, "- skipped: ", 11) == 0 &&
                 strstr(line, "(wgmma --persistent 2 timed out in an earlier step)"))
            skipped++;
        else others++;
    }
    const int ok = summary && rc == 1 && timed_out == 1 && skipped == 1 && others == 0 &&
                   ok_steps > 10 && !strstr(out, "Traceback");
    if (!ok)
        print_error("python3 %s (rc %d; %d timed out, %d skipped, %d others, %d ok) printed:\n%s\n",
                    args, rc, timed_out, skipped, others, ok_steps, out);
    free(out);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_true(ok);
}

/* --------------------------------------------------- bench/train_gpt_sdpa.py */

/* The PyTorch side of the training comparison on the CPU, tiny: it trains
 * (a result line), and its MFU is train_gpt's formula, worked out here for
 * 1 layer, d 32, 2 heads, ffn 64, S 16: 6 (d d + 2 d d + d d + 3 d F + d V)
 * + 6 L S H Dh = 113,664 flops a token. Skipped without PyTorch. */
static void test_train_gpt_sdpa(void **state) {
    (void)state;
    const char *python = h_python_with("torch");
    if (!python) {
        print_message("skipped: no python3 with PyTorch (apt-get install python3-torch)\n");
        skip();
    }
    char script[sizeof g_report + 32];
    const char *slash = strrchr(g_report, '/');
    snprintf(script, sizeof script, "%.*strain_gpt_sdpa.py", slash ? (int)(slash - g_report + 1) : 0,
             g_report);
    char args[9000];
    snprintf(args, sizeof args, "'%s' --device cpu --sdpa math --layers 1 --dim 32 --heads 2 "
             "--ffn 64 --seq 16 --batch 2 --steps 3 --warmup-steps 1 --peak-tflops 1", script);
    char *out = NULL;
    const int rc = h_run_program(python, args, &out);
    const char *res = out ? strstr(out, "result sdpa=math seq=16 batch=2 step_ms=") : NULL;
    double ms = 0, tok = 0, mfu = 0;
    const int got = res ? sscanf(res, "result sdpa=math seq=16 batch=2 step_ms=%lf tok_s=%lf mfu=%lf",
                                 &ms, &tok, &mfu) : 0;
    const double want = tok * 113664.0 / 1e12;
    const int ok = rc == 0 && got == 3 && ms > 0 && tok > 0 && fabs(mfu - want) <= 1e-3 * want;
    if (!ok) print_error("%s %s (rc %d; mfu %g, want %g) printed:\n%s\n", python, args, rc, mfu,
                         want, out ? out : "");
    free(out);
    assert_true(ok);
}

/* ------------------------------------------------------- bench/ncu_source.py */

/* An `ncu --page source --csv --print-source cuda,sass` export in small: two
 * files, three source lines, four instructions, 100 samples. By hand: k.cu
 * line 20 holds 60 (all "barrier"), line 10 30 (20 "wait", 10 "barrier"),
 * m.cuh line 5 30 (its own 10 and the 20 of line 10's instruction 0x110,
 * inlined from it, listed under both lines but one instruction of the
 * kernel); cut at line 20's first instruction (0x200) and m.cuh line 5's
 * own (0x300), the spans hold 30, 60 and 10. The Not Issued column is no
 * stall reason of its own. */
static const char ncu_export[] =
    "\"File Path\",\"/src/attention/k.cu\"\n"
    "\"Function Name\",\"kern\"\n"
    "\"Line No\",\"Source\",\"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\","
    "\"Warp Stall Sampling (Not-issued Samples)\",\"# Samples\",\"stall_wait\",\"stall_barrier\","
    "\"stall_wait (Not Issued)\"\n"
    "\"10\",\"a = b;\",\"\",\"\",\"30\",\"0\",\"30\",\"20\",\"10\",\"25\"\n"
    "\"\",\"\",\"0x110\",\"IADD3 R2\",\"20\",\"0\",\"20\",\"10\",\"10\",\"0\"\n"
    "\"\",\"\",\"0x100\",\"IADD3 R1\",\"10\",\"0\",\"10\",\"10\",\"0\",\"0\"\n"
    "\"20\",\"loop();\",\"\",\"\",\"60\",\"0\",\"60\",\"0\",\"60\",\"0\"\n"
    "\"\",\"\",\"0x200\",\"BAR.SYNC\",\"60\",\"0\",\"60\",\"0\",\"60\",\"0\"\n"
    "\"File Path\",\"/src/attention/m.cuh\"\n"
    "\"Function Name\",\"kern\"\n"
    "\"Line No\",\"Source\",\"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\","
    "\"Warp Stall Sampling (Not-issued Samples)\",\"# Samples\",\"stall_wait\",\"stall_barrier\","
    "\"stall_wait (Not Issued)\"\n"
    "\"5\",\"x = y;\",\"\",\"\",\"30\",\"0\",\"30\",\"30\",\"0\",\"0\"\n"
    "\"\",\"\",\"0x110\",\"IADD3 R2\",\"20\",\"0\",\"20\",\"10\",\"10\",\"0\"\n"
    "\"\",\"\",\"0x300\",\"LDG.E\",\"10\",\"0\",\"10\",\"10\",\"0\",\"0\"\n";

static void test_ncu_source(void **state) {
    (void)state;
    require_python3();
    char script[sizeof g_report + 32], csv[] = "/tmp/dt_ncu_source_XXXXXX";
    const char *slash = strrchr(g_report, '/');
    snprintf(script, sizeof script, "%.*sncu_source.py", slash ? (int)(slash - g_report + 1) : 0,
             g_report);
    const int fd = mkstemp(csv);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    assert_int_equal(fputs(ncu_export, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);

    char args[9000];
    snprintf(args, sizeof args, "'%s' '%s' --split k.cu:20,m.cuh:5", script, csv);
    char *out = NULL;
    int rc = h_run_program("python3", args, &out);
    static const char *const expect[] = {
        "100 warp stall samples, 3 source lines, 4 instructions\n",
        " 60.0%       60  k.cu:20: loop(); | barrier 60.0%\n",
        " 30.0%       30  k.cu:10: a = b; | wait 20.0%, barrier 10.0%\n",
        " 30.0%       30  m.cuh:5: x = y; | wait 30.0%\n",
        "  from the kernel's start (0x0): 30 samples, 30.0%\n",
        "  from k.cu:20 (0x200): 60 samples, 60.0%\n",
        "  from m.cuh:5 (0x300): 10 samples, 10.0%\n",
    };
    int ok = rc == 0 && in_order(out, expect, sizeof expect / sizeof *expect);
    if (!ok) print_error("python3 %s (rc %d) printed:\n%s\n", args, rc, out);
    free(out);

    /* a line with no instruction is an error, not an empty span */
    snprintf(args, sizeof args, "'%s' '%s' --split k.cu:11", script, csv);
    out = NULL;
    const int rc_bad = h_run_program("python3", args, &out);
    const int said = out && strstr(out, "no instruction of k.cu:11") != NULL;
    if (rc_bad == 0 || !said) print_error("python3 %s (rc %d) printed:\n%s\n", args, rc_bad, out);
    free(out);
    unlink(csv);
    assert_true(ok);
    assert_int_not_equal(rc_bad, 0);
    assert_true(said);
}

/* ------------------------------------------------------------ bench/mlp */

/* state: the flags (fp32, or --dtype fp16: every dtype runs on the CPU) */
static void test_mlp_quick(void **state) {
    const char *args = *state;
    REQUIRE(g_mlp);
    char *out = NULL;
    int rc = h_run_program(g_mlp, args, &out);
    /* The table: from its header line to the notes after it. */
    const char *table = strstr(out, "what ");
    const char *end = table ? strstr(table, "\n\nstep:") : NULL;
    char *rows = end ? strndup(table, (size_t)(end - table)) : NULL;
    /* --quick: P = 1, 2 in two modes, after two sgemm baseline rows */
    int ok = rc == 0 && rows && count(rows, "\ndt MLP tp") == 2 &&
             count(rows, "\ndt MLP sp") == 2 && count(rows, "\ncblas_sgemm x2") == 2 &&
             all_positive(rows);
    free(rows);
    if (!ok) print_error("bench/mlp %s printed (rc %d):\n%s\n", args, rc, out);
    free(out);
    assert_true(ok);
}

static void test_mlp_bad_flags(void **state) {
    (void)state;
    REQUIRE(g_mlp);
    static const char *const bad[][2] = {
        {"--dtype fp64", "--dtype takes one of fp32, bf16, fp16"},
        {"--ranks 3 --quick", "P = 3 must divide --seq 64"},
        {"--iters 0", "--iters takes an integer"},
        {"--ranks 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "--ranks takes at most 16 entries"},
        {"--batch 65536 --seq 65536", "rows, more than 2147483647"},
        {"--frobnicate", "unknown flag '--frobnicate'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_true(exits_2(g_mlp, bad[i][0], bad[i][1], NULL));
}

/* ----------------------------------------------------------- bench/ring */

static void test_ring_rows(void **state) {
    (void)state;
    REQUIRE(g_ring);
    char *out = NULL;
    int rc = h_run_program(g_ring, "--ranks 3 --mib 2,4 --iters 3 --backend cpu", &out);
    int ok = rc == 0 && strstr(out, "3 ranks, backend cpu, transport local, 3 steps per size") &&
             all_positive(out);
    static const long mib[] = {2, 4};
    for (int k = 0; ok && k < 2; k++) {
        char head[16];
        snprintf(head, sizeof head, "\n| %ld | ", mib[k]);
        const char *row = strstr(out, head);
        double med = 0, best = 0, gbs = 0;
        ok = row && sscanf(row + strlen(head), "%lf | %lf | %lf |", &med, &best, &gbs) == 3 &&
             med > 0 && best > 0 && best <= med &&
             fabs(gbs - (double)(mib[k] << 20) / (med * 1e-3) * 1e-9) <= 0.02 * gbs + 0.01;
    }
    if (!ok) print_error("bench/ring printed (rc %d):\n%s\n", rc, out);
    free(out);
    assert_true(ok);
}

static void test_ring_bad_flags(void **state) {
    (void)state;
    REQUIRE(g_ring);
    static const char *const bad[][2] = {
        {"--mib 0", "--mib takes an integer in [1, 4096]"},
        {"--ranks 65", "--ranks takes an integer in [0, 64]"},
        {"--iters 0", "--iters takes an integer in [1, 1000]"},
        {"--transport pigeon", "--transport takes one of auto, local, mpi, nccl"},
        {"--frobnicate", "unknown flag '--frobnicate'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_true(exits_2(g_ring, bad[i][0], bad[i][1], NULL));
}

/* build[-variant]/tests/test_bench -> build[-variant]/bench/NAME */
static void locate(char *path, size_t size, const char *argv0, const char *name) {
    const char *slash = argv0 ? strrchr(argv0, '/') : NULL;
    if (slash && slash - argv0 < 4000) {
        snprintf(path, size, "%.*s/../bench/%s", (int)(slash - argv0), argv0, name);
        if (access(path, X_OK) == 0) return;
    }
    snprintf(path, size, "build/bench/%s", name);
}

/* build[-variant]/tests/test_bench -> build[-variant] and, beside it,
 * bench/attention_report.py; else build and bench/attention_report.py from
 * here. */
static void locate_report(const char *argv0) {
    const char *slash = argv0 ? strrchr(argv0, '/') : NULL;
    if (!slash || slash - argv0 >= 4000) return;
    snprintf(g_build, sizeof g_build, "%.*s/..", (int)(slash - argv0), argv0);
    char script[sizeof g_report];
    snprintf(script, sizeof script, "%.4000s/../bench/attention_report.py", g_build);
    if (access(script, R_OK) == 0) memcpy(g_report, script, sizeof script);
}

int main(int argc, char **argv) {
    (void)argc;
    /* The benches' output is parsed with their stderr merged in: the
     * library's info lines (DT_LOG=info, as scripts/gpu_check.sh sets for
     * its logs) are not part of it; a warning still is, and fails. */
    setenv("DT_LOG", "warn", 1);
    locate_report(argv[0]);
    locate(g_bench, sizeof g_bench, argv[0], "attention");
    locate(g_blocks, sizeof g_blocks, argv[0], "blocks");
    locate(g_mlp, sizeof g_mlp, argv[0], "mlp");
    locate(g_ring, sizeof g_ring, argv[0], "ring");
    static bad_case bad[] = {
        {"", "--pass", "--pass takes one or more of fwd, bwd"},
        {"", "--pass sideways", "--pass takes one or more of fwd, bwd"},
        {"", "--pass fwd,fwd", "--pass takes one or more of fwd, bwd"},
        {"", "--pass fwd,", "--pass takes one or more of fwd, bwd"},
        {"", "--dtype ,,", "--dtype takes one or more of bf16, fp32, fp16"},
        {"", "--section f", "--section takes one or more of a, b, c, d, e"},
        {"", "--section ,", "--section takes one or more of a, b, c, d, e"},
        {"", "--section a,a", "--section takes one or more of a, b, c, d, e"},
        {"", "--section e --docs 1,63 --seq 64", "--docs and --seed set section (d)"},
        {"", "--section e --ranks 16", "(e) runs at most 8 ranks"},
        {"", "--section e --seq 100", "--seq 100 is not divisible by --ranks 8"},
        {"", "--docs 1,x", "--docs takes lengths L1,L2,... (integers >= 1) or random:MEAN; entry "
                           "2 is 'x'"},
        {"", "--docs 10,20", "--docs lengths sum to 30, not --seq 65536"},
        {"", "--seq 64 --docs 0,64", "entry 1 is '0'"},
        {"", "--docs random:x", "--docs random:MEAN takes a mean length of at least 1 token"},
        {"", "--window -1", "--window takes an integer in [0, "},
        {"", "--seq 100", "--seq 100 is not divisible by --ranks 8"},
        {"", "--ranks 0", "--ranks takes an integer in [1, 64]"},
        {"", "--section a,b --window 8", "--section leaves them out"},
        {"", "--iters 0", "--iters takes an integer"},
        {"", "--copies 2", "--copies takes an integer"},
        {"", "--comm-ctas -1", "--comm-ctas takes an integer"},
        {"", "--frobnicate", "unknown flag '--frobnicate'"},
    };
    static mask_case masks[] = {
        {"", 48, 3, "1,20,27", 9},      /* a document of 1, one longer than a shard; W < shard */
        {"", 64, 4, "1,40,23", 0},
        {"", 64, 4, NULL, 24},          /* W > shard */
        {"", 96, 6, "30,1,1,64", 40},
        {"", 64, 1, "3,61", 5},
        {"", 56, 7, NULL, 0},
    };
    struct CMUnitTest tests[64];
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
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        mask_case *c = &masks[i];
        char docs[64] = "none";
        if (c->docs) snprintf(docs, sizeof docs, "%s", c->docs);
        for (char *p = docs; *p; p++) *p = *p == ',' ? '+' : *p;
        snprintf(c->name, sizeof c->name, "bench_attention/mask-work/S=%lld,P=%d,docs=%s,window=%lld",
                 (long long)c->S, c->P, docs, (long long)c->window);
        tests[n++] = (struct CMUnitTest){c->name, test_mask_work, NULL, NULL, c};
    }
    tests[n++] = (struct CMUnitTest){"bench_attention/mask-work/S=4096,P=8,docs=random:256",
                                     test_mask_work_random, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_attention/ulysses/P=4,S=64,pass=fwd+bwd",
                                     test_ulysses_json, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/quick,section=r+p,pass=fwd+bwd",
                                     test_blocks_quick, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/exit2", test_blocks_bad_flags, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/quick/json", test_blocks_quick_json, NULL, NULL,
                                     NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/quick/rows=own", test_blocks_rows_own, NULL,
                                     NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/quick/one-shape-flag", test_blocks_one_shape_flag,
                                     NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/group,backend=cpu", test_blocks_group, NULL,
                                     NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/group,kernel=wgmma", test_blocks_group_wgmma,
                                     NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/trace-summary", test_trace_summary, NULL, NULL,
                                     NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/trace-timeline", test_trace_timeline, NULL,
                                     NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_blocks/trace-timeline-run",
                                     test_blocks_trace_timeline, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_attention_report/quick,backend=cpu,no-torch",
                                     test_report_quick, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_attention_report/hung-variant",
                                     test_report_hung_variant, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_train_gpt_sdpa/cpu,tiny", test_train_gpt_sdpa, NULL,
                                     NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_ncu_source/export-by-hand", test_ncu_source, NULL,
                                     NULL, NULL};
    static const char *const mlp_quick[] = {"--quick --backend cpu",
                                            "--quick --backend cpu --dtype fp16"};
    tests[n++] = (struct CMUnitTest){"bench_mlp/quick", test_mlp_quick, NULL, NULL,
                                     (void *)mlp_quick[0]};
    tests[n++] = (struct CMUnitTest){"bench_mlp/quick,fp16", test_mlp_quick, NULL, NULL,
                                     (void *)mlp_quick[1]};
    tests[n++] = (struct CMUnitTest){"bench_mlp/exit2", test_mlp_bad_flags, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_ring/rows", test_ring_rows, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"bench_ring/exit2", test_ring_bad_flags, NULL, NULL, NULL};
    return h_run_cases("bench", tests, n) ? 1 : 0;
}
