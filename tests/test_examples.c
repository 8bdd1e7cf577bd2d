/* tests/test_examples.c — runs the built example programs as a user would
 * and checks what they print, their exit status and the files they write.
 *
 * examples/striped_attention:
 *   - exit 0 and "result: PASS" for fp32, bf16 and fp16 on every order;
 *   - exit 2, before launching anything, for bad flags and shapes;
 *   - --dump: files of exactly the right sizes, a meta.txt that parses (its
 *     eighth field the window), a docs.txt with each batch row's document
 *     lengths (the --docs list on every row, or each row's slice of a list per
 *     row, or S; drawn ones summing to S), inputs in global token order
 *     (q.bin[i] is dt_random_value(seed, i)), and an o.bin (with --backward
 *     dq, dk, dv) that matches attention computed here, in double precision,
 *     from the dumped q, k, v under the mask rule written out from docs.txt
 *     and meta.txt (same document, j <= i when causal, |i - j| < window): an
 *     independent check of both the dump and the library, over packed
 *     documents (one of length 1, one longer than a shard, drawn ones) and
 *     windows smaller and larger than a shard, on every order and several P;
 *   - the work table (section 5) of those runs: each order's total and
 *     critical path in pairs equal the ones counted here by enumeration from
 *     the ranks' tokens (h_order_indices) and the rule;
 *   - --docs random:MEAN: the same draws from the same seed, others from
 *     another, a draw per batch row, and a sample mean near MEAN;
 *   - --svg: a complete SVG document with the three heat maps;
 *   - --ulysses U, the Ulysses x ring hybrid on a (P/U ring) x (U Ulysses)
 *     mesh (U = P: Ulysses alone), for P = 4 (U = 2, 4), 8 (U = 2), 6
 *     (U = 3), every order, causal and full, kv heads U divides and fewer
 *     (repeated): exit 0, the PASS lines, and the bytes per rank the
 *     example read from the communicators' counters equal to the ones
 *     written out here (all-to-alls of (U-1)/U of q, k, v, o, lse forward,
 *     of q, k, v, o, lse, dout and dq, dk, dv backward; the ring's
 *     K|V blocks, and backward its fp32 dK|dV and the last home); --dump
 *     and --backward --dump checked against the reference here as above,
 *     the work table against the ring of R = P/U ranks; a U that does not
 *     divide P or H exits 2.
 * The binary is found beside this test's build tree (build/tests/test_examples
 * -> build/examples/striped_attention; make test runs from the repo root).
 * When it is missing every case is skipped with the reason (run `make`).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtensor/dtensor.h"
#include "attn_ref.h"
#include "harness.h"

static char g_example[4096] = "build/examples/striped_attention";

/* Skips the calling test when the example binary is not built. */
#define REQUIRE_EXAMPLE()                                                                 \
    do {                                                                                  \
        if (access(g_example, X_OK) != 0) {                                               \
            print_message("skipped: %s is not built (run `make` first)\n", g_example);   \
            skip();                                                                       \
        }                                                                                 \
    } while (0)

/* Runs `g_example args` (on the CPU unless DT_EXAMPLE_BACKEND says otherwise)
 * with stderr merged; returns its exit status and its output in *out. */
static int run_example(const char *args, char **out) {
    int rc = h_run_program(g_example, args, out);
    assert_true(rc != -2);
    return rc;
}

static void show_output_on_failure(const char *args, const char *out) {
    print_error("striped_attention %s printed:\n%s\n", args, out);
}

/* ------------------------------------------------------- PASS on every order */

typedef struct pass_case {
    char name[128];
    char args[256];
    const char *expect; /* a line the output must hold too, or NULL */
} pass_case;

static void test_passes(void **state) {
    const pass_case *c = *state;
    REQUIRE_EXAMPLE();
    char *out = NULL;
    int rc = run_example(c->args, &out);
    int ok = rc == 0 && strstr(out, "result: PASS") && !strstr(out, "FAIL") &&
             strstr(out, "critical path") && strstr(out, "next: build/examples/tensor_parallel_mlp") &&
             strstr(out, "next: build/examples/transformer_block") &&
             (!c->expect || strstr(out, c->expect));
    if (!ok) show_output_on_failure(c->args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

/* ------------------------------------------------------------- bad flags */

static void test_bad_flags(void **state) {
    const pass_case *c = *state;
    REQUIRE_EXAMPLE();
    char *out = NULL;
    int rc = run_example(c->args, &out);
    /* Refused before anything ran: no demo, no attention, and a message
     * (c->expect: what it must say). */
    int ok = rc == 2 && !strstr(out, "permute_striped") && !strstr(out, "4. attention") &&
             strstr(out, "striped_attention: ") && (!c->expect || strstr(out, c->expect));
    if (!ok) show_output_on_failure(c->args, out);
    free(out);
    assert_int_equal(rc, 2);
    assert_true(ok);
}

static void test_help(void **state) {
    (void)state;
    REQUIRE_EXAMPLE();
    char *out = NULL;
    int rc = run_example("--help", &out);
    int ok = rc == 0 && strstr(out, "usage: striped_attention") && strstr(out, "--dump DIR") &&
             strstr(out, "--docs L1,L2,...") && strstr(out, "--docs random:MEAN") &&
             strstr(out, "log-normal") && strstr(out, "--window W") &&
             strstr(out, "(B S H HKV D causal scale window)") && strstr(out, "docs.txt") &&
             strstr(out, "--ulysses U") && strstr(out, "a2a_dim");
    if (!ok) show_output_on_failure("--help", out);
    free(out);
    assert_true(ok);
}

/* --backend cuda without a GPU (or a CUDA build) is refused by the library
 * with DT_ERR_NOT_SUPPORTED: exit 3 and a clear message. Where it can run,
 * it must PASS instead. */
static void test_not_supported(void **state) {
    const pass_case *c = *state;
    REQUIRE_EXAMPLE();
    char *out = NULL;
    int rc = run_example(c->args, &out);
    int ok = (rc == 3 && strstr(out, "not supported")) || (rc == 0 && strstr(out, "result: PASS"));
    if (!ok) show_output_on_failure(c->args, out);
    free(out);
    assert_true(ok);
}

/* A grouped striped ring on CUDA where the driver refuses the wgmma
 * kernel's tensor maps of interleaved keys (the emulator's
 * DT_EMU_TMAP_SORTED=1, tests/emu/cudart.c): the library's auto choice
 * runs those launches on the mma kernel and the example PASSes; with the
 * wgmma kernel forced (DT_ATTN_KERNEL=wgmma) it stops, exit 3, naming the
 * refusal. A real driver ignores the variable: there the forced run may
 * PASS too. Without CUDA both are refused (exit 3, not supported). */
static void test_wgmma_refused_maps(void **state) {
    (void)state;
    REQUIRE_EXAMPLE();
    const char *args = "--backend cuda --ranks 5 --seq 160 --order striped --group 4 --dtype bf16 "
                       "--dim 64";
    char *sorted = h_env_set("DT_EMU_TMAP_SORTED", "1");
    char *out = NULL;
    int rc = run_example(args, &out);
    const int no_cuda = rc == 3 && strstr(out, "not supported") && !strstr(out, "interleaved");
    int ok = no_cuda || (rc == 0 && strstr(out, "result: PASS"));
    if (!ok) show_output_on_failure(args, out);
    free(out);
    out = NULL;
    if (ok && !no_cuda) {
        char *kernel = h_env_set("DT_ATTN_KERNEL", "wgmma");
        rc = run_example(args, &out);
        h_env_restore("DT_ATTN_KERNEL", kernel);
#ifdef DT_CUDA_EMULATE
        ok = rc == 3 && strstr(out, "refuses the wgmma kernel's tensor maps of keys interleaved");
#else
        ok = (rc == 0 && strstr(out, "result: PASS")) ||
             (rc == 3 && strstr(out, "refuses the wgmma kernel's tensor maps of keys interleaved"));
#endif
        if (!ok) show_output_on_failure(args, out);
        free(out);
    }
    h_env_restore("DT_EMU_TMAP_SORTED", sorted);
    if (no_cuda) {
        print_message("skipped: --backend cuda is not supported here (no CUDA device)\n");
        skip();
    }
    assert_true(ok);
}

/* ------------------------------------------------------------------ dump */

typedef struct dump_case {
    char name[160];
    int P, causal;
    int64_t B, S, H, Hkv, D;
    const char *order, *dtype;
    uint64_t seed;
    const char *docs;   /* --docs, or NULL */
    int64_t window;     /* --window, 0 for none */
    int ulysses;        /* --ulysses U, 0 for none */
} dump_case;

/* n little-endian fp32 values from dir/name, which must be exactly 4n bytes. */
static float *read_f32_le(const char *dir, const char *name, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        print_error("%s: %s\n", path, strerror(errno));
        return NULL;
    }
    if ((size_t)sb.st_size != 4 * n) {
        print_error("%s is %lld bytes, expected %zu\n", path, (long long)sb.st_size, 4 * n);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    unsigned char *raw = malloc(4 * n);
    float *x = malloc(n * sizeof *x);
    if (!f || !raw || !x || fread(raw, 1, 4 * n, f) != 4 * n) {
        if (f) fclose(f);
        free(raw);
        free(x);
        return NULL;
    }
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                     (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
        memcpy(&x[i], &u, sizeof u);
    }
    free(raw);
    return x;
}

/* The mask rule, written out: query i may attend key j of batch row b iff
 * they are in the same document (doc [B, S]: a label per token), j <= i
 * when causal, and |i - j| < window when a window is set. */
static int allows(const dump_case *c, const int64_t *doc, int64_t window, int64_t b, int64_t i,
                  int64_t j) {
    return doc[b * c->S + i] == doc[b * c->S + j] && (!c->causal || j <= i) &&
           (window == 0 || (i > j ? i - j : j - i) < window);
}

/* o [B, S, H, D] from the definition, in double, over the keys allows()
 * gives each query (positions are the global token indices of the dump;
 * every query has one: itself). */
static void attention_from_dump(const dump_case *c, const int64_t *doc, int64_t window,
                                const float *q, const float *k, const float *v, double scale,
                                double *o) {
    const int64_t B = c->B, S = c->S, H = c->H, G = c->Hkv, D = c->D;
    double *w = malloc((size_t)S * sizeof *w);
    assert_non_null(w);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                const int64_t g = h / (H / G);
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < S; j++) {
                    w[j] = -INFINITY;
                    if (!allows(c, doc, window, b, i, j)) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += (double)q[((b * S + i) * H + h) * D + d] *
                               (double)k[((b * S + j) * G + g) * D + d];
                    w[j] = scale * dot;
                    if (w[j] > mx) mx = w[j];
                }
                for (int64_t j = 0; j < S; j++) sum += (w[j] = exp(w[j] - mx));
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < S; j++) acc += w[j] * v[((b * S + j) * G + g) * D + d];
                    o[((b * S + i) * H + h) * D + d] = acc / sum;
                }
            }
    free(w);
}

/* The lengths of a --docs list "L1,L2,..." (at most max); their number. */
static int64_t parse_lengths(const char *list, int64_t *lens, int64_t max) {
    int64_t n = 0;
    for (const char *p = list; *p && n < max;) {
        char *end = NULL;
        lens[n++] = strtoll(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
    }
    return n;
}

/* 1 if the case's documents are a list per batch row (drawn ones, or a list
 * summing to B*S with B > 1): the work table then sums over the rows. */
static int docs_per_row(const dump_case *c) {
    if (!c->docs || c->B == 1) return 0;
    if (!strncmp(c->docs, "random:", 7)) return 1;
    int64_t lens[512], n = parse_lengths(c->docs, lens, 512), sum = 0;
    for (int64_t i = 0; i < n; i++) sum += lens[i];
    return sum == c->B * c->S;
}

/* dir/docs.txt: B lines of lengths >= 1 summing to S each, as the case asks
 * (with no --docs "S"; a list summing to S on every line; one summing to B*S
 * cut at the rows; drawn ones a draw per row, so rows 0 and 1 differ). 1 and
 * doc [B, S], each token's document label (its index in the row), and
 * (lens not NULL) *lens, the lengths row after row (new, summing to B*S),
 * and *count, else 0 with a message. */
static int read_docs(const dump_case *c, const char *dir, int64_t *doc, int64_t **lens,
                     int64_t *count) {
    char path[600];
    snprintf(path, sizeof path, "%s/docs.txt", dir);
    char *text = h_read_text(path);
    if (!text) {
        print_error("%s: cannot read it\n", path);
        return 0;
    }
    const int64_t S = c->S;
    int64_t *rows = malloc((size_t)(c->B * S) * sizeof *rows);   /* lengths, row after row */
    int64_t *first = calloc((size_t)c->B + 1, sizeof *first);    /* row b: rows[first[b] ..] */
    assert_true(rows && first);
    int ok = 1;
    int64_t n = 0, b = 0;
    const char *p = text;
    for (; ok && b < c->B && *p; b++) {
        int64_t sum = 0;
        first[b] = n;
        while (ok && *p && *p != '\n') {
            char *end = NULL;
            const long long x = strtoll(p, &end, 10);
            ok = end != p && x >= 1 && x <= S - sum && (*end == ' ' || *end == '\n');
            if (ok) rows[n++] = x, sum += x;
            p = *end == ' ' ? end + 1 : end;
        }
        ok = ok && sum == S && *p == '\n';
        if (ok) p++;
        /* labels: the token's document, from the lengths of its row */
        for (int64_t i = first[b], at = 0; ok && i < n; at += rows[i], i++)
            for (int64_t t = at; t < at + rows[i]; t++) doc[b * S + t] = i - first[b];
    }
    first[b] = n;
    ok = ok && b == c->B && *p == '\0';
    if (!ok) print_error("%s is not %lld lines of lengths summing to S = %lld:\n%s\n", path,
                         (long long)c->B, (long long)S, text);
    /* What the case asked for. */
    int64_t want[512], nwant = 0;
    if (ok && !c->docs) {
        want[0] = S, nwant = 1;
    } else if (ok && strncmp(c->docs, "random:", 7)) {
        nwant = parse_lengths(c->docs, want, 512);
    }
    for (int64_t r = 0; ok && nwant && r < c->B; r++) {
        /* a list for every row: the whole list on each; a list per row: its slice */
        const int64_t *w = want, nr = first[r + 1] - first[r];
        int64_t nw = nwant;
        if (docs_per_row(c)) {
            w = want + first[r];
            nw = nr;
            ok = first[c->B] == nwant;
        }
        ok = ok && nr == nw && !memcmp(rows + first[r], w, (size_t)nw * sizeof *w);
        if (!ok) print_error("%s: row %lld is not the --docs list %s:\n%s\n", path, (long long)r,
                             c->docs ? c->docs : "(none: S)", text);
    }
    if (ok && c->docs && !strncmp(c->docs, "random:", 7) && c->B > 1) {
        ok = first[1] - first[0] != first[2] - first[1] ||
             memcmp(rows, rows + first[1], (size_t)(first[1] - first[0]) * sizeof *rows);
        if (!ok) print_error("%s: rows 0 and 1 hold the same draw:\n%s\n", path, text);
    }
    if (lens) {
        *lens = rows;
        *count = n;
    } else {
        free(rows);
    }
    free(first);
    free(text);
    return ok;
}

/* Each order's critical path (sum over ring steps of the busiest rank) and
 * total of the work table, counted here: at step t rank j holds the keys of
 * rank (j - t) mod P; its pairs are those of its queries and those keys that
 * allows() gives, per head, for row 0 (one list of documents for every row)
 * or summed over the rows (a list per row). Tokens of a rank from
 * h_order_indices. */
static void count_work(const dump_case *c, const int64_t *doc, int64_t window, dt_order order,
                       long long *crit, long long *total) {
    const int P = c->ulysses ? c->P / c->ulysses : c->P;   /* the ring's ranks */
    const int64_t n = c->S / P, rows = docs_per_row(c) ? c->B : 1;
    int64_t *idx = malloc((size_t)(P * n) * sizeof *idx);
    assert_non_null(idx);
    for (int j = 0; j < P; j++) h_order_indices(order, c->S, P, j, idx + j * n);
    *crit = *total = 0;
    for (int t = 0; t < P; t++) {
        long long busiest = 0;
        for (int j = 0; j < P; j++) {
            const int src = ((j - t) % P + P) % P;
            long long pairs = 0;
            for (int64_t b = 0; b < rows; b++)
                for (int64_t x = 0; x < n; x++)
                    for (int64_t y = 0; y < n; y++)
                        pairs += allows(c, doc, window, b, idx[j * n + x], idx[src * n + y]);
            *total += pairs;
            if (pairs > busiest) busiest = pairs;
        }
        *crit += busiest;
    }
    free(idx);
}

/* The example's work table agrees with count_work on every order. */
static int check_work(const dump_case *c, const int64_t *doc, int64_t window, const char *out) {
    static const char *const lines[2] = {"critical path (sum over steps of the busiest rank):",
                                         "total pairs (over ranks and steps):"};
    static const dt_order ords[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
    long long got[2][3], want[2][3];
    const char *a = out ? strstr(out, lines[0]) : NULL, *b = out ? strstr(out, lines[1]) : NULL;
    if (!a || !b ||
        sscanf(a + strlen(lines[0]), " contiguous %lld, striped %lld, zigzag %lld", &got[0][0],
               &got[0][1], &got[0][2]) != 3 ||
        sscanf(b + strlen(lines[1]), " contiguous %lld, striped %lld, zigzag %lld", &got[1][0],
               &got[1][1], &got[1][2]) != 3) {
        print_error("%s: no work table totals in the output\n", c->name);
        return 0;
    }
    int ok = 1;
    for (int o = 0; o < 3; o++) {
        count_work(c, doc, window, ords[o], &want[0][o], &want[1][o]);
        for (int w = 0; w < 2; w++)
            if (got[w][o] != want[w][o]) {
                print_error("%s: %s %s %lld, counted here %lld\n", c->name, dt_order_name(ords[o]),
                            w ? "total pairs" : "critical path", got[w][o], want[w][o]);
                ok = 0;
            }
    }
    return ok;
}

/* "fp32", "bf16" or "fp16" as its dtype. */
static dt_dtype dtype_of(const char *name) {
    return !strcmp(name, "bf16") ? DT_BF16 : !strcmp(name, "fp16") ? DT_F16 : DT_F32;
}

/* Every value of a dumped input is the one the seed puts at that global
 * index, as the dtype stores it: the dump is in global token order. */
static long check_input(const char *what, const float *x, size_t n, uint64_t seed, dt_dtype dt) {
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float want = dt_value_round(dt_random_value(seed, i), dt);
        if (x[i] != want) {
            if (bad < 3) print_error("%s[%zu] = %.9g, expected %.9g\n", what, i, x[i], want);
            bad++;
        }
    }
    return bad;
}

static void remove_dump(const char *top, const char *dir) {
    static const char *const files[] = {"meta.txt", "docs.txt", "q.bin", "k.bin", "v.bin",
                                        "o.bin", "dout.bin", "dq.bin", "dk.bin", "dv.bin"};
    char path[4200];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    rmdir(top);
}

/* meta.txt: "B S H HKV D causal scale window". */
typedef struct dump_meta {
    int fields;          /* how many parsed: 8 */
    long long shape[5];  /* B S H HKV D */
    int causal;
    double scale;
    long long window;
} dump_meta;

/* Runs the example on case c (--backward if backward) with --dump into
 * top/sub, a directory it must create, and reads its meta.txt. Returns the
 * exit status, the output in *out (the caller frees it). */
static int run_dump(const dump_case *c, int backward, char top[256], char dir[512], char **out,
                    dump_meta *meta) {
    char args[1024], rule[300] = "";
    snprintf(top, 256, "%s/dt_example_dump.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(top));
    snprintf(dir, 512, "%s/sub", top);
    if (c->docs) snprintf(rule, sizeof rule, " --docs %s", c->docs);
    if (c->window)
        snprintf(rule + strlen(rule), sizeof rule - strlen(rule), " --window %lld",
                 (long long)c->window);
    if (c->ulysses)
        snprintf(rule + strlen(rule), sizeof rule - strlen(rule), " --ulysses %d", c->ulysses);
    snprintf(args, sizeof args,
             "--ranks %d --batch %lld --seq %lld --heads %lld --kv-heads %lld --dim %lld "
             "--order %s --dtype %s --seed %llu %s%s%s --dump '%s'",
             c->P, (long long)c->B, (long long)c->S, (long long)c->H, (long long)c->Hkv,
             (long long)c->D, c->order, c->dtype, (unsigned long long)c->seed,
             c->causal ? "--causal" : "--no-causal", rule, backward ? " --backward" : "", dir);
    int rc = run_example(args, out);
    if (rc != 0) show_output_on_failure(args, *out);
    memset(meta, 0, sizeof *meta);
    meta->causal = -1;
    char path[600];
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        meta->fields = fscanf(f, "%lld %lld %lld %lld %lld %d %lf %lld", &meta->shape[0],
                              &meta->shape[1], &meta->shape[2], &meta->shape[3], &meta->shape[4],
                              &meta->causal, &meta->scale, &meta->window);
        fclose(f);
    }
    return rc;
}

/* meta.txt holds the case's shape, mask, scale and window. */
static void assert_meta(const dump_case *c, const dump_meta *m) {
    assert_int_equal(m->fields, 8);
    assert_int_equal(m->shape[0], c->B);
    assert_int_equal(m->shape[1], c->S);
    assert_int_equal(m->shape[2], c->H);
    assert_int_equal(m->shape[3], c->Hkv);
    assert_int_equal(m->shape[4], c->D);
    assert_int_equal(m->causal, c->causal);
    assert_true(fabs(m->scale - 1.0 / sqrt((double)c->D)) < 1e-7);
    assert_int_equal(m->window, c->window);
}

static void test_dump(void **state) {
    const dump_case *c = *state;
    REQUIRE_EXAMPLE();
    char top[256], dir[512];
    char *out = NULL;
    dump_meta meta;
    int rc = run_dump(c, 0, top, dir, &out, &meta);

    float *q = NULL, *k = NULL, *v = NULL, *o = NULL;
    double *ref = NULL;
    int64_t *doc = malloc((size_t)(c->B * c->S) * sizeof *doc);
    assert_non_null(doc);
    const size_t nq = (size_t)(c->B * c->S * c->H * c->D), nk = (size_t)(c->B * c->S * c->Hkv * c->D);
    const dt_dtype dt = dtype_of(c->dtype);
    long bad_in = -1, bad_o = -1;
    double max_err = 0;
    const int docs_ok = rc == 0 && read_docs(c, dir, doc, NULL, NULL);
    const int work_ok = docs_ok && check_work(c, doc, meta.window, out);
    if (docs_ok && meta.fields == 8) {
        q = read_f32_le(dir, "q.bin", nq);
        k = read_f32_le(dir, "k.bin", nk);
        v = read_f32_le(dir, "v.bin", nk);
        o = read_f32_le(dir, "o.bin", nq);
    }
    if (q && k && v && o) {
        bad_in = check_input("q", q, nq, c->seed, dt) + check_input("k", k, nk, c->seed + 1, dt) +
                 check_input("v", v, nk, c->seed + 2, dt);
        ref = malloc(nq * sizeof *ref);
        assert_non_null(ref);
        attention_from_dump(c, doc, meta.window, q, k, v, meta.scale, ref);
        const double tol = dt == DT_BF16 ? 2e-2 : dt == DT_F16 ? 2e-3 : 1e-5;
        bad_o = h_compare(c->name, o, ref, nq, tol, tol, &max_err);
    }
    free(out);
    free(q);
    free(k);
    free(v);
    free(o);
    free(ref);
    free(doc);
    remove_dump(top, dir);

    assert_int_equal(rc, 0);
    assert_meta(c, &meta);
    assert_true(docs_ok);
    assert_true(work_ok);
    assert_int_equal(bad_in, 0);   /* also -1 if a file was missing or had the wrong size */
    assert_int_equal(bad_o, 0);
}

/* --backward --dump: the dumped gradients match reference gradients
 * computed here, in double, from the dumped q, k, v and dout under the rule
 * of docs.txt and meta.txt (attn_ref.c): an independent check of the
 * backward pass and of its dump. */
static void test_dump_backward(void **state) {
    const dump_case *c = *state;
    REQUIRE_EXAMPLE();
    char top[256], dir[512];
    char *out = NULL;
    dump_meta meta;
    int rc = run_dump(c, 1, top, dir, &out, &meta);
    int said_pass = out && strstr(out, "backward result: PASS") != NULL;
    free(out);
    const size_t nq = (size_t)(c->B * c->S * c->H * c->D), nk = (size_t)(c->B * c->S * c->Hkv * c->D);
    const char *names[7] = {"q.bin", "k.bin", "v.bin", "dout.bin", "dq.bin", "dk.bin", "dv.bin"};
    const size_t sizes[7] = {nq, nk, nk, nq, nq, nk, nk};
    float *x[7] = {NULL};
    int64_t *doc = malloc((size_t)(c->B * c->S) * sizeof *doc);
    assert_non_null(doc);
    int64_t *lens = NULL, count = 0;
    const int docs_ok = rc == 0 && read_docs(c, dir, doc, &lens, &count);
    int all = docs_ok && meta.fields == 8;
    for (int i = 0; i < 7 && all; i++) all = (x[i] = read_f32_le(dir, names[i], sizes[i])) != NULL;
    long bad = -1;
    if (all) {
        double *in[4], *ref[3];
        for (int i = 0; i < 4; i++) {
            in[i] = malloc(sizes[i] * sizeof(double));
            for (size_t e = 0; e < sizes[i]; e++) in[i][e] = x[i][e];
        }
        for (int i = 0; i < 3; i++) ref[i] = malloc(sizes[4 + i] * sizeof(double));
        attn_shape s = {c->B, c->S, c->H, c->Hkv, c->D};
        /* docs.txt's lengths row after row: a list per row (B*S) */
        attn_ref_rule r = {meta.causal, meta.window, lens, count};
        ref_attention_backward_rule(&s, &r, in[0], in[1], in[2], in[3], 1.0 / sqrt((double)c->D),
                                    ref[0], ref[1], ref[2]);
        const dt_dtype dt = dtype_of(c->dtype);
        const double tol = dt == DT_BF16 ? 3e-2 : dt == DT_F16 ? 4e-3 : 1e-4;
        bad = 0;
        for (int i = 0; i < 3; i++) bad += h_compare(c->name, x[4 + i], ref[i], sizes[4 + i], tol, tol, NULL);
        for (int i = 0; i < 4; i++) free(in[i]);
        for (int i = 0; i < 3; i++) free(ref[i]);
    }
    for (int i = 0; i < 7; i++) free(x[i]);
    free(doc);
    free(lens);
    remove_dump(top, dir);
    assert_int_equal(rc, 0);
    assert_meta(c, &meta);
    assert_true(said_pass);
    assert_true(docs_ok);
    assert_true(all);
    assert_int_equal(bad, 0);
}

/* --docs random:MEAN: the draws are the seed's (the same twice, others from
 * another seed), a draw per batch row, each row's lengths >= 1 summing to S
 * (read_docs), and their mean, less each row's last (cut to fit), within a
 * quarter of MEAN: 8 rows of 512 tokens, about 400 draws, whose sample mean
 * has a standard deviation near 0.07 MEAN for sigma 1. */
static void test_docs_random(void **state) {
    (void)state;
    REQUIRE_EXAMPLE();
    dump_case c = {"striped_attention/docs-random/mean=8,B=8,S=512", 2, 1, 8, 512, 1, 1, 8,
                   "contiguous", "fp32", 5, "random:8", 0, 0};
    char *text[3] = {NULL, NULL, NULL};
    int ok = 1;
    int64_t *doc = malloc((size_t)(c.B * c.S) * sizeof *doc);
    assert_non_null(doc);
    for (int r = 0; r < 3; r++) {
        c.seed = r < 2 ? 5 : 6;   /* runs 0 and 1 the same seed, run 2 another */
        char top[256], dir[512], path[600];
        char *out = NULL;
        dump_meta meta;
        int rc = run_dump(&c, 0, top, dir, &out, &meta);
        free(out);
        ok = ok && rc == 0 && read_docs(&c, dir, doc, NULL, NULL);
        snprintf(path, sizeof path, "%s/docs.txt", dir);
        text[r] = h_read_text(path);
        remove_dump(top, dir);
    }
    ok = ok && text[0] && text[1] && text[2] && !strcmp(text[0], text[1]) &&
         strcmp(text[0], text[2]);
    double sum = 0;
    long n = 0;
    for (const char *line = ok ? text[0] : NULL; line && *line;) {
        const char *eol = strchr(line, '\n');
        for (const char *p = line; p < eol;) {
            char *end = NULL;
            const long long x = strtoll(p, &end, 10);
            if (end < eol) sum += (double)x, n++;   /* not the row's last */
            p = end;
        }
        line = eol + 1;
    }
    const double mean = n ? sum / (double)n : 0;
    if (!ok || !(mean >= 6 && mean <= 10))
        print_error("%s: draws (mean %.3f over %ld):\n%s\nseed 6:\n%s\n", c.name, mean, n,
                    text[0] ? text[0] : "(none)", text[2] ? text[2] : "(none)");
    for (int r = 0; r < 3; r++) free(text[r]);
    free(doc);
    assert_true(ok);
    assert_true(n > 200);
    assert_true(mean >= 6 && mean <= 10);
}

/* --------------------------------------------------------------- ulysses */

typedef struct ulysses_case {
    char name[160];
    char args[320];
    int P, U, causal, backward, group;
    int64_t B, S, H, Hkv, D;
    const char *order, *dtype;
} ulysses_case;

/* The bytes a rank sends (and receives) per call, [0] forward, [1]
 * backward, written out: U ranks all-to-all a tensor by sending each
 * other rank 1/U of its part (collectives/comm.h: (U-1)/U of it); kv
 * heads that U does not divide are repeated e = lcm(H_kv, U) / H_kv times
 * first. The ring of R = P/U ranks (after the all-to-all: S/R tokens,
 * H_kv e / U kv heads) sends its K and V R-1 times; backward also R-1
 * fp32 dK|dV partial sums and the finished dK|dV home in the dtype. */
typedef struct ulysses_bytes {
    unsigned long long a2a[2], p2p[2];
} ulysses_bytes;

static ulysses_bytes ulysses_bytes_of(const ulysses_case *c) {
    ulysses_bytes b = {{0, 0}, {0, 0}};
    const unsigned long long es = dt_dtype_size(dtype_of(c->dtype)), U = (unsigned)c->U;
    int64_t e = 1;
    while ((c->Hkv * e) % c->U) e++;   /* the least e with U | H_kv e */
    const unsigned long long q = (unsigned long long)(c->B * (c->S / c->P) * c->H * c->D) * es;
    const unsigned long long kv =
        (unsigned long long)(c->B * (c->S / c->P) * c->Hkv * e * c->D) * es;
    const unsigned long long lse = (unsigned long long)(c->B * c->H * (c->S / c->P)) * 4;
    b.a2a[0] = (q + kv + kv + q + lse) / U * (U - 1);                       /* q k v; o lse */
    b.a2a[1] = (q + kv + kv + q + lse + q + q + kv + kv) / U * (U - 1);   /* + dout; dq dk dv */
    const int64_t R = c->P / c->U;
    const unsigned long long block = (unsigned long long)(c->B * (c->S / R) * (c->Hkv * e / c->U) *
                                                          c->D);
    b.p2p[0] = (unsigned long long)(R - 1) * 2 * block * es;
    b.p2p[1] = R > 1 ? (unsigned long long)(R - 1) * 2 * block * (es + 4) + 2 * block * es : 0;
    return b;
}

/* The counters line of a pass and kind the example printed: calls, bytes
 * sent and received; 0 when it is missing. */
static int read_counters(const char *out, const char *head, unsigned long long v[3]) {
    const char *p = strstr(out, head);
    if (!p) return 0;
    p = strstr(p, "): ");
    return p && sscanf(p, "): %llu calls, %llu bytes sent, %llu received", &v[0], &v[1], &v[2]) == 3;
}

static void test_ulysses(void **state) {
    const ulysses_case *c = *state;
    REQUIRE_EXAMPLE();
    char *out = NULL;
    int rc = run_example(c->args, &out);
    const int R = c->P / c->U;
    const ulysses_bytes want = ulysses_bytes_of(c);
    int ok = rc == 0 && strstr(out, "result: PASS") && !strstr(out, "FAIL") &&
             (!c->backward || strstr(out, "backward result: PASS")) &&
             strstr(out, "the ring alone over all P = ") &&
             strstr(out, "critical path (sum over steps of the busiest rank):");
    for (int pass = 0; ok && pass < 1 + c->backward; pass++) {
        static const char *const names[2] = {"forward", "backward"};
        char head[128];
        unsigned long long v[3];
        /* every counters line of the pass said PASS: the all-to-all, the
         * ring (R > 1) and the world's communicator */
        snprintf(head, sizeof head, "\n   %s: bytes per rank", names[pass]);
        const char *from = strstr(out, head), *to = from ? strstr(from + 1, "\n\n") : NULL;
        int passes = 0;
        for (const char *p = from; p && to && (p = strstr(p + 1, ": PASS\n")) && p < to;) passes++;
        ok = from && passes == 2 + (R > 1);
        snprintf(head, sizeof head, "%s Ulysses all-to-all over mesh dim %d (U = %d)", names[pass],
                 R > 1 ? 1 : 0, c->U);
        ok = ok && read_counters(out, head, v) && v[0] == (pass ? 9u : 5u) &&
             v[1] == want.a2a[pass] && v[2] == want.a2a[pass];
        if (!ok) print_error("%s: %s: expected %s, %llu bytes\n", c->name, names[pass], head,
                             want.a2a[pass]);
        if (ok && R > 1) {
            snprintf(head, sizeof head, "%s ring p2p over mesh dim 0 (R = %d)", names[pass], R);
            ok = read_counters(out, head, v) && v[1] == want.p2p[pass] && v[2] == want.p2p[pass];
            if (!ok) print_error("%s: %s: expected %s, %llu bytes\n", c->name, names[pass], head,
                                 want.p2p[pass]);
        }
    }
    if (!ok) show_output_on_failure(c->args, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_true(ok);
}

/* ------------------------------------------------------------------- svg */

static void test_svg(void **state) {
    (void)state;
    REQUIRE_EXAMPLE();
    char top[256], file[512], args[1024];
    snprintf(top, sizeof top, "%s/dt_example_svg.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(top));
    snprintf(file, sizeof file, "%s/work.svg", top);
    snprintf(args, sizeof args, "--ranks 5 --seq 80 --order contiguous --svg '%s'", file);
    char *out = NULL;
    int rc = run_example(args, &out);
    if (rc != 0) show_output_on_failure(args, out);
    free(out);
    char *svg = h_read_text(file);
    const long len = svg ? (long)strlen(svg) : 0;
    unlink(file);
    rmdir(top);
    int rects = 0;
    for (const char *s = svg; s && (s = strstr(s, "<rect")); s++) rects++;
    int ok = svg && len > 0 && !strncmp(svg, "<?xml", 5) && strstr(svg, "<svg xmlns=") &&
             strstr(svg, "<title>") && strstr(svg, "contiguous") && strstr(svg, "striped") &&
             strstr(svg, "zigzag") && strstr(svg, "linearGradient") &&
             len >= 7 && !strcmp(svg + len - 7, "</svg>\n");
    free(svg);
    assert_int_equal(rc, 0);
    assert_true(ok);
    assert_true(rects >= 3 * 5 * 5); /* one cell per (rank, step) per order */
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    (void)argc;
    /* build[-variant]/tests/test_examples -> build[-variant]/examples/striped_attention */
    const char *slash = argv[0] ? strrchr(argv[0], '/') : NULL;
    if (slash && slash - argv[0] < 4000) {
        snprintf(g_example, sizeof g_example, "%.*s/../examples/striped_attention",
                 (int)(slash - argv[0]), argv[0]);
        if (access(g_example, X_OK) != 0)
            snprintf(g_example, sizeof g_example, "build/examples/striped_attention");
    }

    static const char *const order_names[] = {"contiguous", "striped", "zigzag"};
    static const char *const dtype_names[] = {"fp32", "bf16", "fp16"};
    static pass_case passes[20], bad[32], unsupported[1];
    struct CMUnitTest tests[128];
    size_t n = 0, np = 0;
    for (int o = 0; o < 3; o++)
        for (int d = 0; d < 3; d++) {
            pass_case *c = &passes[np++];
            snprintf(c->args, sizeof c->args, "--ranks 4 --seq 128 --heads 4 --kv-heads 2 --dim 32 "
                     "--order %s --dtype %s", order_names[o], dtype_names[d]);
            snprintf(c->name, sizeof c->name, "striped_attention/pass/%s,%s,P=4,S=128",
                     order_names[o], dtype_names[d]);
            tests[n++] = (struct CMUnitTest){c->name, test_passes, NULL, NULL, c};
        }
    {
        pass_case *c = &passes[np++];
        snprintf(c->args, sizeof c->args, "%s", "");
        snprintf(c->name, sizeof c->name, "striped_attention/pass/defaults");
        tests[n++] = (struct CMUnitTest){c->name, test_passes, NULL, NULL, c};
        c = &passes[np++];
        snprintf(c->args, sizeof c->args, "--ranks 3 --batch 2 --seq 48 --heads 6 --kv-heads 1 "
                 "--dim 16 --order striped --no-causal --seed 9");
        snprintf(c->name, sizeof c->name, "striped_attention/pass/striped,no-causal,P=3,MQA");
        tests[n++] = (struct CMUnitTest){c->name, test_passes, NULL, NULL, c};
        /* --heads alone, odd: K and V default to H heads (H/2 is no whole number) */
        c = &passes[np++];
        snprintf(c->args, sizeof c->args, "--ranks 2 --seq 16 --heads 3 --dim 8");
        snprintf(c->name, sizeof c->name, "striped_attention/pass/odd-heads,default-kv-heads");
        c->expect = "k and v [1, 16, 3, 8]";
        tests[n++] = (struct CMUnitTest){c->name, test_passes, NULL, NULL, c};
        /* ring steps grouped 3 to a launch (zigzag's chunks nested) */
        c = &passes[np++];
        snprintf(c->args, sizeof c->args, "--ranks 5 --batch 2 --seq 100 --order zigzag --group 3");
        snprintf(c->name, sizeof c->name, "striped_attention/pass/zigzag,group=3,P=5,B=2");
        tests[n++] = (struct CMUnitTest){c->name, test_passes, NULL, NULL, c};
        /* striped causal, grouped 4 to a launch (their keys interleaved) */
        c = &passes[np++];
        snprintf(c->args, sizeof c->args, "--ranks 6 --seq 96 --order striped --group 4");
        snprintf(c->name, sizeof c->name, "striped_attention/pass/striped,group=4,P=6");
        tests[n++] = (struct CMUnitTest){c->name, test_passes, NULL, NULL, c};
    }
    /* Packed documents and a window (the example's own reference follows the
     * rule); grouped rings with them, and the 16-bit dtypes. */
    static const struct {
        const char *args, *name, *expect;
    } rule_passes[] = {
        {"--ranks 5 --batch 2 --seq 100 --order zigzag --group 3 --docs random:15 --window 30",
         "zigzag,group=3,docs=random:15,window=30,P=5,B=2",
         "documents drawn log-normal (mean 15)"},
        {"--ranks 6 --seq 96 --order striped --group 4 --docs 1,50,45 --window 10",
         "striped,group=4,docs=1+50+45,window=10,P=6", "3 documents per row (1,50,45), window 10"},
        {"--ranks 4 --seq 128 --heads 4 --kv-heads 2 --dim 32 --order striped --dtype bf16 "
         "--docs 7,1,100,20 --window 24", "striped,bf16,docs=7+1+100+20,window=24,P=4", NULL},
        {"--ranks 4 --seq 128 --heads 4 --kv-heads 2 --dim 32 --order zigzag --dtype fp16 "
         "--no-causal --docs random:20", "zigzag,fp16,no-causal,docs=random:20,P=4", NULL},
        {"--ranks 3 --batch 2 --seq 48 --order contiguous --window 7 --backward",
         "contiguous,window=7,backward,P=3,B=2", "causal mask, window 7"},
    };
    for (size_t i = 0; i < sizeof rule_passes / sizeof *rule_passes; i++) {
        pass_case *c = &passes[np++];
        snprintf(c->args, sizeof c->args, "%s", rule_passes[i].args);
        snprintf(c->name, sizeof c->name, "striped_attention/pass/%s", rule_passes[i].name);
        c->expect = rule_passes[i].expect;
        tests[n++] = (struct CMUnitTest){c->name, test_passes, NULL, NULL, c};
    }
    static const char *const bad_args[][2] = {
        {"--seq 10 --ranks 4", NULL}, {"--order diagonal", NULL},
        {"--kv-heads 3 --heads 4", NULL}, {"--order zigzag --seq 12 --ranks 4", NULL},
        {"--dim 12", NULL}, {"--frobnicate", NULL}, {"--seed ' -1'", NULL}, {"--group 0", NULL},
        {"--seq 64 --docs 1,2,x", "--docs takes lengths L1,L2,... (integers >= 1) or random:MEAN; "
                                  "entry 3 is 'x'"},
        {"--seq 64 --docs 10,20", "--docs lengths sum to 30, not --seq 64"},
        {"--seq 64 --batch 2 --docs 10,20", "not --seq 64 (one list for every batch row) nor B*S = 128"},
        {"--seq 64 --docs 0,64", "entry 1 is '0'"},
        {"--seq 64 --docs 32,,32", "entry 2 is ''"},
        {"--seq 64 --batch 2 --docs 60,8,60", "crosses the end of batch row 0"},
        {"--docs random:0.5", "--docs random:MEAN takes a mean length of at least 1"},
        {"--docs random:", "--docs random:MEAN takes a mean length of at least 1"},
        {"--window -1", "--window takes an integer in [0, "},
        {"--window 2x", "--window takes an integer"},
        {"--ulysses 3", "--ulysses 3 does not divide --ranks 4"},
        {"--ranks 6 --seq 96 --heads 4 --ulysses 3", "--ulysses 3 does not divide --heads 4"},
        {"--ulysses 0", "--ulysses takes an integer in [1, "},
    };
    for (size_t i = 0; i < sizeof bad_args / sizeof *bad_args; i++) {
        pass_case *c = &bad[i];
        snprintf(c->args, sizeof c->args, "%s", bad_args[i][0]);
        snprintf(c->name, sizeof c->name, "striped_attention/exit2/%s", bad_args[i][0]);
        c->expect = bad_args[i][1];
        tests[n++] = (struct CMUnitTest){c->name, test_bad_flags, NULL, NULL, c};
    }
    static const char *const unsupported_args[] = {"--backend cuda"};
    for (size_t i = 0; i < sizeof unsupported_args / sizeof *unsupported_args; i++) {
        pass_case *c = &unsupported[i];
        snprintf(c->args, sizeof c->args, "%s", unsupported_args[i]);
        snprintf(c->name, sizeof c->name, "striped_attention/not_supported/%s", unsupported_args[i]);
        tests[n++] = (struct CMUnitTest){c->name, test_not_supported, NULL, NULL, c};
    }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_wgmma_refused_maps);
    /* Documents: lists with a document of length 1 and one longer than a
     * shard (S/P), a list per row (summing to B*S), drawn ones; windows
     * smaller and larger than a shard. */
    static dump_case dumps[] = {
        {"", 3, 1, 2, 48, 4, 2, 16, "zigzag", "fp32", 7, NULL, 0, 0},
        {"", 4, 1, 1, 64, 2, 2, 32, "striped", "fp32", 11, NULL, 0, 0},
        {"", 2, 1, 1, 32, 4, 1, 8, "contiguous", "fp32", 5, NULL, 0, 0},
        {"", 3, 0, 1, 36, 2, 1, 16, "striped", "bf16", 3, NULL, 0, 0},
        {"", 2, 1, 2, 32, 4, 2, 16, "zigzag", "fp16", 13, NULL, 0, 0},
        {"", 4, 1, 2, 64, 2, 1, 16, "striped", "fp32", 41, "1,40,23", 0, 0},
        {"", 3, 1, 1, 48, 4, 2, 8, "zigzag", "fp32", 43, "1,5,30,12", 7, 0},
        {"", 2, 0, 2, 64, 2, 2, 8, "contiguous", "fp32", 47, "random:48", 40, 0},
        {"", 5, 0, 1, 80, 2, 1, 8, "striped", "fp32", 53, NULL, 5, 0},
        {"", 4, 1, 1, 128, 2, 1, 16, "zigzag", "bf16", 59, "random:64", 48, 0},
        {"", 6, 1, 2, 96, 2, 2, 8, "contiguous", "fp32", 61, "1,63,32,50,46", 0, 0},
        {"", 1, 1, 1, 32, 2, 1, 8, "striped", "fp32", 67, "3,1,28", 4, 0},
        {"", 7, 0, 1, 112, 2, 1, 8, "zigzag", "fp32", 71, "20,1,1,90", 20, 0},
    };
    static dump_case bdumps[] = {
        {"", 3, 1, 2, 48, 4, 2, 16, "zigzag", "fp32", 17, NULL, 0, 0},
        {"", 4, 1, 1, 64, 2, 2, 32, "striped", "fp32", 19, NULL, 0, 0},
        {"", 2, 0, 1, 32, 4, 1, 8, "contiguous", "fp32", 23, NULL, 0, 0},
        {"", 3, 1, 1, 36, 2, 1, 16, "striped", "bf16", 29, NULL, 0, 0},
        {"", 4, 1, 1, 32, 2, 2, 8, "contiguous", "fp16", 31, NULL, 0, 0},
        {"", 4, 1, 1, 64, 2, 1, 16, "zigzag", "fp32", 73, "1,40,23", 12, 0},
        {"", 3, 0, 2, 48, 2, 2, 8, "striped", "fp32", 79, "random:8", 0, 0},
        {"", 2, 1, 1, 64, 2, 1, 8, "contiguous", "fp32", 83, NULL, 40, 0},
        {"", 5, 0, 1, 80, 2, 1, 8, "zigzag", "fp32", 89, "16,1,63", 20, 0},
        {"", 3, 1, 2, 48, 2, 1, 8, "contiguous", "fp32", 97, "random:6", 5, 0},
        {"", 8, 1, 1, 64, 2, 1, 8, "striped", "fp32", 101, "1,2,61", 3, 0},
    };
    /* The forward dumps, then the backward ones (--backward --dump). */
    const size_t nd = sizeof dumps / sizeof *dumps, nbd = sizeof bdumps / sizeof *bdumps;
    for (size_t i = 0; i < nd + nbd; i++) {
        int backward = i >= nd;
        dump_case *c = backward ? &bdumps[i - nd] : &dumps[i];
        char rule[96] = "";
        if (c->docs) snprintf(rule, sizeof rule, ",docs=%s", c->docs);
        for (char *p = rule; *p; p++) *p = p > rule && *p == ',' ? '+' : *p;   /* one parameter */
        if (c->window)
            snprintf(rule + strlen(rule), sizeof rule - strlen(rule), ",window=%lld",
                     (long long)c->window);
        snprintf(c->name, sizeof c->name,
                 "striped_attention/%s/%s,%s,%s%s,P=%d,B=%lld,S=%lld,H=%lld,Hkv=%lld,D=%lld",
                 backward ? "backward-dump" : "dump", c->order, c->dtype,
                 c->causal ? "causal" : "no-causal", rule, c->P, (long long)c->B, (long long)c->S,
                 (long long)c->H, (long long)c->Hkv, (long long)c->D);
        tests[n++] = (struct CMUnitTest){c->name, backward ? test_dump_backward : test_dump, NULL,
                                         NULL, c};
    }
    /* --ulysses: the counters against the bytes written out here. */
    static ulysses_case ulysses[] = {
        {"", "", 4, 2, 1, 1, 0, 1, 64, 4, 2, 16, "striped", "bf16"},
        {"", "", 4, 4, 0, 0, 0, 2, 32, 4, 1, 8, "zigzag", "fp32"},
        {"", "", 8, 2, 1, 1, 0, 1, 64, 4, 1, 8, "contiguous", "fp32"},
        {"", "", 6, 3, 0, 1, 0, 1, 36, 6, 2, 8, "striped", "fp32"},
        {"", "", 8, 2, 1, 0, 3, 1, 128, 2, 2, 8, "zigzag", "fp16"},
    };
    for (size_t i = 0; i < sizeof ulysses / sizeof *ulysses; i++) {
        ulysses_case *c = &ulysses[i];
        char group[32] = "";
        if (c->group) snprintf(group, sizeof group, " --group %d", c->group);
        snprintf(c->args, sizeof c->args,
                 "--ranks %d --ulysses %d --batch %lld --seq %lld --heads %lld --kv-heads %lld "
                 "--dim %lld --order %s --dtype %s %s%s%s", c->P, c->U, (long long)c->B,
                 (long long)c->S, (long long)c->H, (long long)c->Hkv, (long long)c->D, c->order,
                 c->dtype, c->causal ? "--causal" : "--no-causal", c->backward ? " --backward" : "",
                 group);
        snprintf(c->name, sizeof c->name,
                 "striped_attention/ulysses/P=%d,U=%d,%s,%s,%s%s%s,B=%lld,S=%lld,H=%lld,Hkv=%lld,"
                 "D=%lld", c->P, c->U, c->order, c->dtype, c->causal ? "causal" : "no-causal",
                 c->backward ? ",backward" : "", c->group ? ",group=3" : "", (long long)c->B,
                 (long long)c->S, (long long)c->H, (long long)c->Hkv, (long long)c->D);
        tests[n++] = (struct CMUnitTest){c->name, test_ulysses, NULL, NULL, c};
    }
    /* --ulysses --dump and --backward --dump: the reference here, and the
     * work table of the ring of P/U ranks. */
    static dump_case udumps[] = {
        {"", 4, 1, 1, 64, 4, 2, 16, "striped", "fp32", 107, NULL, 0, 2},
        {"", 4, 0, 2, 32, 4, 1, 8, "contiguous", "fp32", 109, NULL, 0, 4},
        {"", 8, 1, 1, 64, 2, 1, 8, "zigzag", "fp32", 113, "1,40,23", 12, 2},
        {"", 6, 1, 1, 48, 3, 3, 8, "striped", "bf16", 127, NULL, 0, 3},
        {"", 4, 1, 1, 64, 4, 1, 8, "zigzag", "fp32", 131, NULL, 0, 2},
        {"", 4, 0, 1, 32, 4, 2, 8, "striped", "fp32", 137, NULL, 5, 4},
        {"", 8, 1, 1, 64, 2, 2, 8, "striped", "fp32", 139, "random:8", 0, 2},
        {"", 6, 0, 1, 36, 6, 2, 8, "contiguous", "fp32", 149, NULL, 0, 3},
    };
    for (size_t i = 0; i < sizeof udumps / sizeof *udumps; i++) {
        dump_case *c = &udumps[i];
        const int backward = i >= 4;
        char rule[96] = "";
        if (c->docs) snprintf(rule, sizeof rule, ",docs=%s", c->docs);
        for (char *p = rule; *p; p++) *p = p > rule && *p == ',' ? '+' : *p;
        if (c->window)
            snprintf(rule + strlen(rule), sizeof rule - strlen(rule), ",window=%lld",
                     (long long)c->window);
        snprintf(c->name, sizeof c->name,
                 "striped_attention/ulysses-%s/U=%d,%s,%s,%s%s,P=%d,B=%lld,S=%lld,H=%lld,Hkv=%lld,"
                 "D=%lld", backward ? "backward-dump" : "dump", c->ulysses, c->order, c->dtype,
                 c->causal ? "causal" : "no-causal", rule, c->P, (long long)c->B, (long long)c->S,
                 (long long)c->H, (long long)c->Hkv, (long long)c->D);
        tests[n++] = (struct CMUnitTest){c->name, backward ? test_dump_backward : test_dump, NULL,
                                         NULL, c};
    }
    tests[n++] = (struct CMUnitTest){"striped_attention/docs-random/mean=8,B=8,S=512",
                                     test_docs_random, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"striped_attention/help", test_help, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"striped_attention/svg/P=5,S=80", test_svg, NULL, NULL, NULL};
    return h_run_cases("examples", tests, n) ? 1 : 0;
}
