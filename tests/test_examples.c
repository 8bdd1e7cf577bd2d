/* tests/test_examples.c — runs the built example programs as a user would
 * and checks what they print, their exit status and the files they write.
 *
 * examples/striped_attention:
 *   - exit 0 and "result: PASS" for fp32, bf16 and fp16 on every order;
 *   - exit 2, before launching anything, for bad flags and shapes;
 *   - --dump: files of exactly the right sizes, a meta.txt that parses, inputs
 *     in global token order (q.bin[i] is dt_random_value(seed, i)), and an
 *     o.bin that matches attention computed here, in double precision, from
 *     the dumped q, k, v with the causal mask by position: an independent
 *     check of both the dump and the library;
 *   - --svg: a complete SVG document with the three heat maps.
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
    /* Refused before anything ran: no demo, no attention, and a message. */
    int ok = rc == 2 && !strstr(out, "permute_striped") && !strstr(out, "4. attention") &&
             strstr(out, "striped_attention: ");
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
    int ok = rc == 0 && strstr(out, "usage: striped_attention") && strstr(out, "--dump DIR");
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
    char name[128];
    int P, causal;
    int64_t B, S, H, Hkv, D;
    const char *order, *dtype;
    uint64_t seed;
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

/* o [B, S, H, D] from the definition, in double: query i attends key j iff
 * j <= i (positions are the global token indices of the dump) or always. */
static void attention_from_dump(const dump_case *c, const float *q, const float *k,
                                const float *v, double scale, double *o) {
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
                    if (c->causal && j > i) continue;
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
    static const char *const files[] = {"meta.txt", "q.bin", "k.bin", "v.bin", "o.bin",
                                        "dout.bin", "dq.bin", "dk.bin", "dv.bin"};
    char path[4200];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    rmdir(top);
}

static void test_dump(void **state) {
    const dump_case *c = *state;
    REQUIRE_EXAMPLE();
    char top[256], dir[512], args[1024];
    snprintf(top, sizeof top, "%s/dt_example_dump.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(top));
    snprintf(dir, sizeof dir, "%s/sub", top); /* missing: the example must create it */
    snprintf(args, sizeof args,
             "--ranks %d --batch %lld --seq %lld --heads %lld --kv-heads %lld --dim %lld "
             "--order %s --dtype %s --seed %llu %s --dump '%s'",
             c->P, (long long)c->B, (long long)c->S, (long long)c->H, (long long)c->Hkv,
             (long long)c->D, c->order, c->dtype, (unsigned long long)c->seed,
             c->causal ? "--causal" : "--no-causal", dir);
    char *out = NULL;
    int rc = run_example(args, &out);
    if (rc != 0) show_output_on_failure(args, out);
    free(out);

    float *q = NULL, *k = NULL, *v = NULL, *o = NULL;
    double *ref = NULL;
    long long m[5];
    int causal = -1;
    double scale = 0;
    int parsed = 0;
    char path[600];
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        parsed = fscanf(f, "%lld %lld %lld %lld %lld %d %lf", &m[0], &m[1], &m[2], &m[3], &m[4],
                        &causal, &scale);
        fclose(f);
    }
    const size_t nq = (size_t)(c->B * c->S * c->H * c->D), nk = (size_t)(c->B * c->S * c->Hkv * c->D);
    const dt_dtype dt = dtype_of(c->dtype);
    long bad_in = -1, bad_o = -1;
    double max_err = 0;
    if (rc == 0 && parsed == 7) {
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
        attention_from_dump(c, q, k, v, scale, ref);
        const double tol = dt == DT_BF16 ? 2e-2 : dt == DT_F16 ? 2e-3 : 1e-5;
        bad_o = h_compare(c->name, o, ref, nq, tol, tol, &max_err);
    }
    free(q);
    free(k);
    free(v);
    free(o);
    free(ref);
    remove_dump(top, dir);

    assert_int_equal(rc, 0);
    assert_int_equal(parsed, 7);
    assert_int_equal(m[0], c->B);
    assert_int_equal(m[1], c->S);
    assert_int_equal(m[2], c->H);
    assert_int_equal(m[3], c->Hkv);
    assert_int_equal(m[4], c->D);
    assert_int_equal(causal, c->causal);
    assert_true(fabs(scale - 1.0 / sqrt((double)c->D)) < 1e-7);
    assert_int_equal(bad_in, 0);   /* also -1 if a file was missing or had the wrong size */
    assert_int_equal(bad_o, 0);
}

/* ------------------------------------------------------------------- svg */

/* --backward --dump: the dumped gradients match reference gradients
 * computed here, in double, from the dumped q, k, v and dout (attn_ref.c):
 * an independent check of the backward pass and of its dump. */
static void test_dump_backward(void **state) {
    const dump_case *c = *state;
    REQUIRE_EXAMPLE();
    char top[256], dir[512], args[1024];
    snprintf(top, sizeof top, "%s/dt_example_dump.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(top));
    snprintf(dir, sizeof dir, "%s/sub", top);
    snprintf(args, sizeof args,
             "--ranks %d --batch %lld --seq %lld --heads %lld --kv-heads %lld --dim %lld "
             "--order %s --dtype %s --seed %llu %s --backward --dump '%s'",
             c->P, (long long)c->B, (long long)c->S, (long long)c->H, (long long)c->Hkv,
             (long long)c->D, c->order, c->dtype, (unsigned long long)c->seed,
             c->causal ? "--causal" : "--no-causal", dir);
    char *out = NULL;
    int rc = run_example(args, &out);
    if (rc != 0) show_output_on_failure(args, out);
    int said_pass = out && strstr(out, "backward result: PASS") != NULL;
    free(out);
    const size_t nq = (size_t)(c->B * c->S * c->H * c->D), nk = (size_t)(c->B * c->S * c->Hkv * c->D);
    const char *names[7] = {"q.bin", "k.bin", "v.bin", "dout.bin", "dq.bin", "dk.bin", "dv.bin"};
    const size_t sizes[7] = {nq, nk, nk, nq, nq, nk, nk};
    float *x[7] = {NULL};
    int all = rc == 0;
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
        ref_attention_backward(&s, in[0], in[1], in[2], in[3], c->causal, 1.0 / sqrt((double)c->D),
                               ref[0], ref[1], ref[2]);
        const dt_dtype dt = dtype_of(c->dtype);
        const double tol = dt == DT_BF16 ? 3e-2 : dt == DT_F16 ? 4e-3 : 1e-4;
        bad = 0;
        for (int i = 0; i < 3; i++) bad += h_compare(c->name, x[4 + i], ref[i], sizes[4 + i], tol, tol, NULL);
        for (int i = 0; i < 4; i++) free(in[i]);
        for (int i = 0; i < 3; i++) free(ref[i]);
    }
    for (int i = 0; i < 7; i++) free(x[i]);
    remove_dump(top, dir);
    assert_int_equal(rc, 0);
    assert_true(said_pass);
    assert_true(all);
    assert_int_equal(bad, 0);
}

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
    static pass_case passes[14], bad[8], unsupported[1];
    struct CMUnitTest tests[40];
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
    static const char *const bad_args[] = {
        "--seq 10 --ranks 4", "--order diagonal", "--kv-heads 3 --heads 4",
        "--order zigzag --seq 12 --ranks 4", "--dim 12", "--frobnicate", "--seed ' -1'",
        "--group 0",
    };
    for (size_t i = 0; i < sizeof bad_args / sizeof *bad_args; i++) {
        pass_case *c = &bad[i];
        snprintf(c->args, sizeof c->args, "%s", bad_args[i]);
        snprintf(c->name, sizeof c->name, "striped_attention/exit2/%s", bad_args[i]);
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
    static dump_case dumps[] = {
        {"", 3, 1, 2, 48, 4, 2, 16, "zigzag", "fp32", 7},
        {"", 4, 1, 1, 64, 2, 2, 32, "striped", "fp32", 11},
        {"", 2, 1, 1, 32, 4, 1, 8, "contiguous", "fp32", 5},
        {"", 3, 0, 1, 36, 2, 1, 16, "striped", "bf16", 3},
        {"", 2, 1, 2, 32, 4, 2, 16, "zigzag", "fp16", 13},
    };
    static dump_case bdumps[] = {
        {"", 3, 1, 2, 48, 4, 2, 16, "zigzag", "fp32", 17},
        {"", 4, 1, 1, 64, 2, 2, 32, "striped", "fp32", 19},
        {"", 2, 0, 1, 32, 4, 1, 8, "contiguous", "fp32", 23},
        {"", 3, 1, 1, 36, 2, 1, 16, "striped", "bf16", 29},
        {"", 4, 1, 1, 32, 2, 2, 8, "contiguous", "fp16", 31},
    };
    /* The forward dumps, then the backward ones (--backward --dump). */
    for (size_t i = 0; i < 2 * sizeof dumps / sizeof *dumps; i++) {
        size_t nd = sizeof dumps / sizeof *dumps;
        int backward = i >= nd;
        dump_case *c = backward ? &bdumps[i - nd] : &dumps[i];
        snprintf(c->name, sizeof c->name,
                 "striped_attention/%s/%s,%s,%s,P=%d,B=%lld,S=%lld,H=%lld,Hkv=%lld,D=%lld",
                 backward ? "backward-dump" : "dump", c->order, c->dtype,
                 c->causal ? "causal" : "no-causal", c->P, (long long)c->B, (long long)c->S,
                 (long long)c->H, (long long)c->Hkv, (long long)c->D);
        tests[n++] = (struct CMUnitTest){c->name, backward ? test_dump_backward : test_dump, NULL,
                                         NULL, c};
    }
    tests[n++] = (struct CMUnitTest){"striped_attention/help", test_help, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"striped_attention/svg/P=5,S=80", test_svg, NULL, NULL, NULL};
    return h_run_cases("examples", tests, n) ? 1 : 0;
}
