/* tests/test_train.c — examples/train_gpt, run as a user would, against a
 * double-precision reference of the whole model (tests/gpt_ref.c) and
 * against itself on other meshes.
 *
 *   reference   the reference's gradients match central finite differences
 *               of its own loss; the one-rank run's losses, gradient norms,
 *               first-step gradients (grad0.bin) and final parameters match
 *               the reference replaying its --dump files
 *   meshes      dp x tp x cp in (1,1,1) (2,1,1) (1,2,1) (1,1,4) (2,2,2)
 *               (1,2,3) (1,4,2), every order: the one-rank run's losses
 *               (relative 1e-5) and final parameters
 *   sp, recompute  change no result: --sp on tp 2, and on tp 2 x cp 2 (the
 *               sequence sharded over both, every order)
 *   resume      a run saved at step 2 and resumed gives the uninterrupted
 *               run's losses bit for bit; saved on dp2 x tp2 x cp2 and
 *               resumed on tp4 x cp2, the next losses match
 *   dump        every file of --dump has its format and size; tokens.bin
 *               rows are the corpus's bytes in order
 *   export      a safetensors file that parses, with the final parameters
 *   flags       bad flags and meshes that do not divide the model: exit 2
 *   comm counts --comm-counts: every communicator's calls and bytes in the
 *               first step (dp, tp, cp and the world's) exactly as derived
 *               from the model's shapes, on 7 meshes, --sp and bf16 among them
 *   mpirun      the same binary as 4 processes: the threads' losses and
 *               final parameters bit for bit
 *   memory      no step after the first takes new memory (backend
 *               counters; CUDA: no cudaMalloc), resident memory flat over
 *               1,000 steps, a rank's peak falling with cp and --recompute
 *   cuda        the same run on the CUDA backend (the emulator under
 *               `make CUDA=emu`), and bf16 within 3% of fp32's losses
 *   pytorch     a dp2 x tp2 x cp2 dump, and a packed tp2 x cp2 one, replay in
 *               PyTorch from their own files (scripts/check_dump.py; skipped
 *               without PyTorch)
 * The binary is found beside this test's build tree; without it every case
 * is skipped with the reason.
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

#include "dtensor/dtensor.h"
#include "gpt_ref.h"
#include "harness.h"

static char g_bin[4096] = "build/examples/train_gpt";
static char g_tmp[512];

/* The tiny model every case trains: Dh 8 (heads of 8 dims), GQA 2:1, tp up
 * to 4, cp up to 4 with zigzag (S = 24). */
#define TINY "--layers 2 --dim 64 --heads 8 --kv-heads 4 --ffn 96 --seq 24 --batch 4 " \
             "--sample 0 --peak-tflops 1 --lr 3e-3 --clip 1.0 --weight-decay 0.1 --seed 7"

#define REQUIRE_BIN()                                                              \
    do {                                                                           \
        if (access(g_bin, X_OK) != 0) {                                            \
            print_message("skipped: %s is not built (run `make` first)\n", g_bin); \
            skip();                                                                \
        }                                                                          \
    } while (0)

/* Runs train_gpt with args (and --dump DIR when dir); returns the exit
 * status, prints the output when it is not `want`. */
static int train(const char *args, const char *dir, int want) {
    char full[2048], *out = NULL;
    snprintf(full, sizeof full, "%s%s%s", args, dir ? " --dump " : "", dir ? dir : "");
    const int rc = h_run_program(g_bin, full, &out);
    if (rc != want) print_error("train_gpt %s exited %d:\n%s\n", full, rc, out ? out : "");
    free(out);
    return rc;
}

static char *dir_of(const char *name) {
    static char paths[64][700];
    static int next;
    char *p = paths[next++ % 64];
    snprintf(p, 700, "%s/%s", g_tmp, name);
    for (char *c = p + strlen(g_tmp) + 1; *c; c++)
        if (*c == '/' || *c == ',') *c = '_';
    return p;
}

/* loss.txt: n lines of step, loss, norm, lr. */
static int read_losses(const char *dir, double *loss, double *norm, int max) {
    char path[900];
    snprintf(path, sizeof path, "%s/loss.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    long long s;
    double l, g, lr;
    while (n < max && fscanf(f, "%lld %lf %lf %lf", &s, &l, &g, &lr) == 4) {
        loss[n] = l;
        if (norm) norm[n] = g;
        n++;
    }
    fclose(f);
    return n;
}

static float *read_floats(const char *dir, const char *name, size_t *n) {
    char path[900];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *v = malloc((size_t)bytes + 4);
    *n = (size_t)bytes / sizeof(float);
    if (v && fread(v, sizeof *v, *n, f) != *n) *n = 0;
    fclose(f);
    return v;
}

/* |a - b| <= rtol |b| + atol over n values; prints the worst. */
static int close_all(const char *what, const float *a, const float *b, size_t n, double rtol,
                     double atol) {
    size_t bad = 0, worst = 0;
    double wd = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= rtol * fabs((double)b[i]) + atol)) bad++;
        if (!(d <= wd)) wd = d, worst = i;
    }
    if (bad)
        print_error("%s: %zu of %zu differ, worst at %zu: %.9g vs %.9g\n", what, bad, n, worst,
                    n ? (double)a[worst] : 0.0, n ? (double)b[worst] : 0.0);
    return bad == 0;
}

/* Final parameters: AdamW divides each gradient by its own running
 * magnitude, so an element whose gradient is mostly fp32 cancellation (the
 * query and key projections at initialisation, whose attention is near
 * uniform) moves by an amount that follows that noise whatever the order of
 * the sums, and one whose gradient is near AdamW's eps (1e-8) by an amount
 * that follows its size. So every element must agree within 1% of the most
 * AdamW moves one in 4 steps at lr 3e-3, but one in 10,000, each within
 * that most (2 x 4 x lr). The losses are compared at relative 1e-5. */
#define ADAM_ATOL (1e-2 * 4 * 3e-3)
#define ADAM_MOST (2 * 4 * 3e-3)

static int close_params(const char *what, const float *a, const float *b, size_t n) {
    size_t loose = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= 1e-4 * fabs((double)b[i]) + ADAM_ATOL)) loose++;
        if (!(d <= ADAM_MOST)) bad++;
    }
    if (loose > n / 10000 || bad)
        return close_all(what, a, b, n, 1e-4, ADAM_ATOL);   /* prints the worst */
    if (loose) print_message("%s: %zu of %zu beyond 1%% of AdamW's reach, within its reach\n", what, loose, n);
    return 1;
}

/* ------------------------------------------------------------ reference */

static const char *g_base;   /* the one-rank fp32 run of TINY, 4 steps */

static const char *base_run(void) {
    if (g_base) return g_base;
    static char d[600];
    snprintf(d, sizeof d, "%s/base", g_tmp);
    if (train(TINY " --ranks 1 --steps 4", d, 0) != 0) return NULL;
    return g_base = d;
}

static int32_t *read_tokens(const char *dir, const gpt_ref *r, int64_t steps) {
    char path[900];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    FILE *f = fopen(path, "rb");
    const size_t n = (size_t)(steps * r->batch * (r->seq + 1));
    int32_t *t = malloc(n * sizeof *t);
    if (!f || !t || fread(t, sizeof *t, n, f) != n) {
        if (f) fclose(f);
        free(t);
        return NULL;
    }
    fclose(f);
    return t;
}

/* The reference's own gradients against central differences of its loss,
 * at entries spread over every parameter. */
static void test_reference_finite_differences(void **state) {
    (void)state;
    REQUIRE_BIN();
    const char *dir = base_run();
    assert_non_null(dir);
    gpt_ref r;
    assert_int_equal(gpt_ref_load(&r, dir), 0);
    int32_t *tok = read_tokens(dir, &r, 1);
    assert_non_null(tok);
    gpt_ref_loss_grad(&r, tok);
    double *g = malloc((size_t)r.total * sizeof *g);
    memcpy(g, r.grad, (size_t)r.total * sizeof *g);
    int bad = 0, checked = 0;
    double worst = 0;
    for (int i = 0; i < r.np; i++) {
        const int64_t n = r.shape[i][0] * r.shape[i][1];
        for (int k = 0; k < 3; k++) {
            const int64_t j = r.offset[i] + (int64_t)((uint64_t)(i * 7919 + k * 104729) % (uint64_t)n);
            const double w0 = r.w[j], h = 1e-5 * fmax(1.0, fabs(w0));
            r.w[j] = w0 + h;
            const double lp = gpt_ref_loss(&r, tok);
            r.w[j] = w0 - h;
            const double lm = gpt_ref_loss(&r, tok);
            r.w[j] = w0;
            const double fd = (lp - lm) / (2 * h), err = fabs(fd - g[j]);
            worst = fmax(worst, err);
            checked++;
            if (err > 1e-7 + 1e-4 * fabs(fd)) {
                bad++;
                print_error("%s[%lld]: finite difference %.9g, gradient %.9g\n", r.name[i],
                            (long long)(j - r.offset[i]), fd, g[j]);
            }
        }
    }
    print_message("%d entries of %d parameters: max |fd - grad| = %.3g\n", checked, r.np, worst);
    free(g), free(tok);
    gpt_ref_free(&r);
    assert_int_equal(bad, 0);
}

/* The one-rank run against the reference replaying its files. */
static void test_one_rank_matches_reference(void **state) {
    (void)state;
    REQUIRE_BIN();
    const char *dir = base_run();
    assert_non_null(dir);
    gpt_ref r;
    assert_int_equal(gpt_ref_load(&r, dir), 0);
    int32_t *tok = read_tokens(dir, &r, r.steps);
    assert_non_null(tok);
    double loss[16], norm[16];
    assert_int_equal(read_losses(dir, loss, norm, 16), (int)r.steps);
    size_t ng = 0, nf = 0;
    float *g0 = read_floats(dir, "grad0.bin", &ng), *fin = read_floats(dir, "final.bin", &nf);
    assert_true(g0 && fin && ng == (size_t)r.total && nf == (size_t)r.total);
    int ok = 1;
    for (int64_t s = 0; s < r.steps; s++) {
        double n = 0;
        const double l = gpt_ref_step(&r, tok + s * r.batch * (r.seq + 1), s + 1, r.lr, &n);
        if (s == 0) {   /* every gradient of the first step */
            float *ref = malloc((size_t)r.total * sizeof *ref);
            double gmax = 0;
            for (int64_t j = 0; j < r.total; j++) gmax = fmax(gmax, fabs(r.grad[j]));
            for (int64_t j = 0; j < r.total; j++) ref[j] = (float)r.grad[j];
            ok &= close_all("grad0.bin", g0, ref, ng, 1e-3, 1e-5 * gmax);
            free(ref);
        }
        if (fabs(l - loss[s]) > 1e-5 * fabs(l) || fabs(n - norm[s]) > 1e-4 * fabs(n)) {
            ok = 0;
            print_error("step %lld: loss %.9g (reference %.9g), norm %.9g (reference %.9g)\n",
                        (long long)s, loss[s], l, norm[s], n);
        }
    }
    float *ref = malloc((size_t)r.total * sizeof *ref);
    for (int64_t j = 0; j < r.total; j++) ref[j] = (float)r.w[j];
    ok &= close_params("final.bin", fin, ref, nf);
    print_message("4 steps of %d parameters (%lld values): losses, norms, grad0.bin and final.bin "
                  "match the double reference\n", r.np, (long long)r.total);
    free(ref), free(g0), free(fin), free(tok);
    gpt_ref_free(&r);
    assert_true(ok);
}

/* ------------------------------------------------------------ packed */

/* --packed, documents ending after each newline (rows of 24 bytes hold
 * several): one rank's losses, norms and first gradients against the double
 * reference, which splits the tokens itself; then tp 2 x cp 2 (striped and
 * zigzag, each document spread over both cp ranks) against the one rank. */
static void test_packed(void **state) {
    (void)state;
    REQUIRE_BIN();
    char *one = dir_of("packed_one");
    assert_int_equal(train(TINY " --ranks 1 --steps 3 --packed --separator '\\n'", one, 0), 0);
    gpt_ref r;
    assert_int_equal(gpt_ref_load(&r, one), 0);
    assert_true(r.packed && r.sep_len == 1 && r.sep[0] == '\n');
    int32_t *tok = read_tokens(one, &r, r.steps);
    assert_non_null(tok);
    long inner = 0;   /* separators inside the rows' inputs: documents that start mid-row */
    for (int64_t i = 0; i < r.steps * r.batch; i++)
        for (int64_t t = 0; t + 1 < r.seq; t++) inner += tok[i * (r.seq + 1) + t] == '\n';
    assert_true(inner >= r.steps * r.batch / 2);
    double loss[16], norm[16];
    assert_int_equal(read_losses(one, loss, norm, 16), (int)r.steps);
    size_t ng = 0;
    float *g0 = read_floats(one, "grad0.bin", &ng);
    assert_true(g0 && ng == (size_t)r.total);
    int ok = 1;
    for (int64_t s = 0; s < r.steps; s++) {
        double n = 0;
        const double l = gpt_ref_step(&r, tok + s * r.batch * (r.seq + 1), s + 1, r.lr, &n);
        if (s == 0) {
            float *ref = malloc((size_t)r.total * sizeof *ref);
            double gmax = 0;
            for (int64_t j = 0; j < r.total; j++) gmax = fmax(gmax, fabs(r.grad[j]));
            for (int64_t j = 0; j < r.total; j++) ref[j] = (float)r.grad[j];
            ok &= close_all("grad0.bin", g0, ref, ng, 1e-3, 1e-5 * gmax);
            free(ref);
        }
        if (fabs(l - loss[s]) > 1e-5 * fabs(l) || fabs(n - norm[s]) > 1e-4 * fabs(n)) {
            ok = 0;
            print_error("packed step %lld: loss %.9g (reference %.9g), norm %.9g (reference "
                        "%.9g)\n", (long long)s, loss[s], l, norm[s], n);
        }
    }
    free(g0), free(tok);
    gpt_ref_free(&r);
    static const char *const orders[2] = {"striped", "zigzag"};
    for (int o = 0; o < 2; o++) {
        char name[64], args[512];
        snprintf(name, sizeof name, "packed_tp2_cp2_%s", orders[o]);
        char *dir = dir_of(name);
        snprintf(args, sizeof args, TINY " --steps 3 --packed --separator '\\n' --tp 2 --cp 2 "
                 "--order %s", orders[o]);
        assert_int_equal(train(args, dir, 0), 0);
        double a[16];
        assert_int_equal(read_losses(dir, a, NULL, 16), 3);
        for (int s = 0; s < 3; s++)
            if (fabs(a[s] - loss[s]) > 1e-5 * fabs(loss[s])) {
                ok = 0;
                print_error("%s step %d: loss %.9g, one rank %.9g\n", name, s, a[s], loss[s]);
            }
    }
    assert_true(ok);
}

/* ------------------------------------------------------------ meshes */

typedef struct mesh_case {
    char name[96];
    char args[256];
    int exact;     /* the same sums in the same order: bit for bit */
} mesh_case;

/* The run `args` against the base run: losses and final parameters. */
static void test_mesh(void **state) {
    const mesh_case *c = *state;
    REQUIRE_BIN();
    const char *base = base_run();
    assert_non_null(base);
    char *dir = dir_of(c->name);
    char args[512];
    snprintf(args, sizeof args, TINY " --steps 4 %s", c->args);
    assert_int_equal(train(args, dir, 0), 0);
    double a[16], b[16];
    const int na = read_losses(dir, a, NULL, 16), nb = read_losses(base, b, NULL, 16);
    assert_int_equal(na, 4);
    assert_int_equal(nb, 4);
    int ok = 1;
    for (int s = 0; s < 4; s++)
        if (c->exact ? a[s] != b[s] : fabs(a[s] - b[s]) > 1e-5 * fabs(b[s])) {
            ok = 0;
            print_error("%s step %d: loss %.9g, one rank %.9g\n", c->name, s, a[s], b[s]);
        }
    size_t n1 = 0, n2 = 0;
    float *f1 = read_floats(dir, "final.bin", &n1), *f2 = read_floats(base, "final.bin", &n2);
    assert_true(f1 && f2 && n1 == n2);
    ok &= c->exact ? !memcmp(f1, f2, n1 * sizeof *f1) : close_params(c->name, f1, f2, n1);
    free(f1), free(f2);
    assert_true(ok);
}

/* ------------------------------------------------------------ resume */

static void test_resume_exact(void **state) {
    (void)state;
    REQUIRE_BIN();
    char args[1024];
    char *full = dir_of("r-full"), *first = dir_of("r-first"), *second = dir_of("r-second");
    char *ck = dir_of("r-ckpt");
    const char *mesh = "--tp 2 --cp 2";
    snprintf(args, sizeof args, TINY " %s --steps 4", mesh);
    assert_int_equal(train(args, full, 0), 0);
    snprintf(args, sizeof args, TINY " %s --steps 2 --save %s", mesh, ck);
    assert_int_equal(train(args, first, 0), 0);
    snprintf(args, sizeof args, TINY " %s --steps 4 --resume %s", mesh, ck);
    assert_int_equal(train(args, second, 0), 0);
    double a[16], b[16], c[16];
    assert_int_equal(read_losses(full, a, NULL, 16), 4);
    assert_int_equal(read_losses(first, b, NULL, 16), 2);
    assert_int_equal(read_losses(second, c, NULL, 16), 2);   /* steps 2 and 3 */
    for (int s = 0; s < 4; s++) {
        const double got = s < 2 ? b[s] : c[s - 2];
        if (got != a[s]) print_error("step %d: %.9g resumed, %.9g straight\n", s, got, a[s]);
        assert_true(got == a[s]);
    }
    size_t n1 = 0, n2 = 0;
    float *f1 = read_floats(full, "final.bin", &n1), *f2 = read_floats(second, "final.bin", &n2);
    assert_true(f1 && f2 && n1 == n2 && !memcmp(f1, f2, n1 * sizeof *f1));
    free(f1), free(f2);
    /* the numbering continues: loss.txt of the resumed run starts at step 2 */
    char path[900];
    snprintf(path, sizeof path, "%s/loss.txt", second);
    char *text = h_read_text(path);
    assert_non_null(text);
    assert_true(!strncmp(text, "2 ", 2));
    free(text);
}

/* dst := src (bytes); 0 on success. first_line, when not NULL, replaces
 * src's first line. */
static int copy_file(const char *src, const char *dst, const char *first_line) {
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    int rc = in && out ? 0 : -1, c, skipping = first_line != NULL;
    if (rc == 0 && first_line) fputs(first_line, out);
    while (rc == 0 && (c = fgetc(in)) != EOF) {
        if (skipping) {
            skipping = c != '\n';
            continue;
        }
        if (fputc(c, out) == EOF) rc = -1;
    }
    if (in) fclose(in);
    if (out && fclose(out) != 0) rc = -1;
    return rc;
}

/* A version 1 checkpoint of the dp2 x tp2 x cp2 one in `from`: version 1
 * numbered the ranks on the mesh (dp, tp, cp), cp fastest; version 2 on
 * (dp, cp, tp), tp fastest. The same bytes, the rank files renamed. */
static int as_version1(const char *from, const char *to) {
    char a[900], b[900];
    if (mkdir(to, 0700) != 0) return -1;
    snprintf(a, sizeof a, "%s/manifest.txt", from);
    snprintf(b, sizeof b, "%s/manifest.txt", to);
    if (copy_file(a, b, "dtensor-checkpoint 1\n") != 0) return -1;
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 2; t++)
            for (int c = 0; c < 2; c++) {
                snprintf(a, sizeof a, "%s/rank-%d.bin", from, (d * 2 + c) * 2 + t);
                snprintf(b, sizeof b, "%s/rank-%d.bin", to, (d * 2 + t) * 2 + c);
                if (copy_file(a, b, NULL) != 0) return -1;
            }
    return 0;
}

static void test_resume_on_another_mesh(void **state) {
    (void)state;
    REQUIRE_BIN();
    char args[1024];
    char *full = dir_of("m-full"), *first = dir_of("m-first"), *second = dir_of("m-second");
    char *ck = dir_of("m-ckpt");
    snprintf(args, sizeof args, TINY " --dp 2 --tp 2 --cp 2 --steps 4");
    assert_int_equal(train(args, full, 0), 0);
    snprintf(args, sizeof args, TINY " --dp 2 --tp 2 --cp 2 --steps 2 --save %s", ck);
    assert_int_equal(train(args, first, 0), 0);
    snprintf(args, sizeof args, TINY " --tp 4 --cp 2 --steps 4 --resume %s", ck);
    assert_int_equal(train(args, second, 0), 0);
    double a[16], c[16];
    assert_int_equal(read_losses(full, a, NULL, 16), 4);
    assert_int_equal(read_losses(second, c, NULL, 16), 2);
    for (int s = 2; s < 4; s++) {
        if (fabs(c[s - 2] - a[s]) > 1e-5 * fabs(a[s]))
            print_error("step %d: %.9g resumed on tp4 x cp2, %.9g straight on dp2 x tp2 x cp2\n", s,
                        c[s - 2], a[s]);
        assert_true(fabs(c[s - 2] - a[s]) <= 1e-5 * fabs(a[s]));
    }
    /* without the model's flags and --seed (7, not the default 1), on the
     * saved mesh: the checkpoint's model and data order, and the
     * uninterrupted run's losses to the bit */
    char *third = dir_of("m-third");
    snprintf(args, sizeof args, "--seq 24 --batch 4 --sample 0 --peak-tflops 1 --lr 3e-3 --clip 1.0 "
             "--weight-decay 0.1 --dp 2 --tp 2 --cp 2 --steps 4 --resume %s", ck);
    assert_int_equal(train(args, third, 0), 0);
    assert_int_equal(read_losses(third, c, NULL, 16), 2);
    for (int s = 2; s < 4; s++) assert_true(c[s - 2] == a[s]);
    /* a version 1 checkpoint (ranks numbered on (dp, tp, cp)) resumes on
     * its mesh to the bit, and on tp4 x cp2 */
    char *v1 = dir_of("m-ckpt-v1"), *fourth = dir_of("m-fourth"), *fifth = dir_of("m-fifth");
    assert_int_equal(as_version1(ck, v1), 0);
    snprintf(args, sizeof args, TINY " --dp 2 --tp 2 --cp 2 --steps 4 --resume %s", v1);
    assert_int_equal(train(args, fourth, 0), 0);
    assert_int_equal(read_losses(fourth, c, NULL, 16), 2);
    for (int s = 2; s < 4; s++) assert_true(c[s - 2] == a[s]);
    snprintf(args, sizeof args, TINY " --tp 4 --cp 2 --steps 4 --resume %s", v1);
    assert_int_equal(train(args, fifth, 0), 0);
    assert_int_equal(read_losses(fifth, c, NULL, 16), 2);
    for (int s = 2; s < 4; s++) assert_true(fabs(c[s - 2] - a[s]) <= 1e-5 * fabs(a[s]));
}

/* ------------------------------------------------------------ files */

static long file_size(const char *dir, const char *name) {
    char path[900];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static void test_dump_format(void **state) {
    (void)state;
    REQUIRE_BIN();
    const char *dir = base_run();
    assert_non_null(dir);
    gpt_ref r;   /* parses config.txt (17 keys) and params.txt */
    assert_int_equal(gpt_ref_load(&r, dir), 0);
    assert_int_equal(r.vocab, 256);
    assert_int_equal(r.np, 2 + 9 * 2 + 1);
    assert_string_equal(r.name[0], "tok_emb");
    assert_string_equal(r.name[1], "layers.0.attn_norm");
    assert_string_equal(r.name[9], "layers.0.w_down");
    assert_string_equal(r.name[r.np - 2], "norm");
    assert_string_equal(r.name[r.np - 1], "lm_head");
    assert_int_equal(r.shape[2][0], 64);    /* wq [d, H*Dh] */
    assert_int_equal(r.shape[2][1], 64);
    assert_int_equal(r.shape[3][1], 32);    /* wk [d, Hkv*Dh] */
    assert_int_equal(file_size(dir, "init.bin"), 4 * r.total);
    assert_int_equal(file_size(dir, "final.bin"), 4 * r.total);
    assert_int_equal(file_size(dir, "grad0.bin"), 4 * r.total);
    assert_int_equal(file_size(dir, "tokens.bin"), 4 * r.steps * r.batch * (r.seq + 1));
    /* each sequence is S + 1 consecutive bytes of the corpus */
    int32_t *tok = read_tokens(dir, &r, r.steps);
    char *corpus = h_read_text("examples/data/tinyshakespeare.txt");
    assert_true(tok && corpus);
    for (int64_t i = 0; i < r.steps * r.batch; i++) {
        char s[64];
        for (int64_t t = 0; t <= r.seq; t++) s[t] = (char)tok[i * (r.seq + 1) + t];
        s[r.seq + 1] = '\0';
        if (!strstr(corpus, s)) print_error("tokens.bin row %lld is not in the corpus\n", (long long)i);
        assert_non_null(strstr(corpus, s));
    }
    free(tok), free(corpus);
    gpt_ref_free(&r);
}

static void test_export(void **state) {
    (void)state;
    REQUIRE_BIN();
    char args[1024], path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", g_tmp);
    char *dir = dir_of("export");
    snprintf(args, sizeof args, TINY " --tp 2 --steps 2 --export %s", path);
    assert_int_equal(train(args, dir, 0), 0);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char n8[8];
    assert_int_equal(fread(n8, 1, 8, f), 8);
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--) hl = hl << 8 | n8[b];
    assert_true(hl > 0 && hl < 100000 && hl % 8 == 0);
    char *h = calloc(hl + 1, 1);
    assert_int_equal(fread(h, 1, hl, f), hl);
    assert_true(h[0] == '{' && strstr(h, "\"tok_emb\":{\"dtype\":\"F32\",\"shape\":[256,64],\"data_offsets\":[0,65536]}"));
    assert_non_null(strstr(h, "\"layers.1.w_down\":{\"dtype\":\"F32\",\"shape\":[96,64]"));
    /* the data: final.bin's values, in the same order */
    size_t n = 0;
    float *fin = read_floats(dir, "final.bin", &n);
    float *data = malloc(n * sizeof *data);
    assert_true(fin && data && fread(data, sizeof *data, n, f) == n);
    assert_int_equal(memcmp(data, fin, n * sizeof *data), 0);
    fclose(f);
    free(h), free(fin), free(data);
}

static void test_bad_flags(void **state) {
    (void)state;
    REQUIRE_BIN();
    static const struct {
        const char *args, *needle;
    } cases[] = {
        {"--dp 2 --tp 2 --ranks 3", "is not --ranks 3"},
        {"--heads 3 --dim 64", "does not divide --dim"},
        {"--tp 3", "must divide --heads"},
        {"--cp 5 --seq 24", "not divisible by 5"},
        {"--cp 2 --seq 6 --order zigzag", "2 x 2"},
        {"--dp 3 --batch 4", "does not divide --batch"},
        {"--sp --tp 4 --cp 2 --seq 12", "--sp: --seq 12 is not divisible"},
        {"--separator x", "--separator needs --packed"},
        {"--frobnicate", "unknown flag"},
        {"--lr", "needs a value"},
        {"--lr -1", "--lr takes a number"},
        {"--order spiral", "--order"},
        {"--dtype fp64", "--dtype"},
        {"--ffn 97 --tp 2", "must divide --ffn"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        const int rc = h_run_program(g_bin, cases[i].args, &out);
        if (rc != 2 || !strstr(out, cases[i].needle))
            print_error("train_gpt %s: exit %d, wanted 2 naming '%s':\n%s\n", cases[i].args, rc,
                        cases[i].needle, out);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, cases[i].needle));
        free(out);
    }
    char *out = NULL;
    assert_int_equal(h_run_program(g_bin, "--help", &out), 0);
    assert_non_null(strstr(out, "--resume DIR"));
    free(out);
    /* a checkpoint of another model is refused */
    char args[1024];
    char *ck = dir_of("bad-ckpt");
    snprintf(args, sizeof args, TINY " --steps 1 --save %s", ck);
    assert_int_equal(train(args, NULL, 0), 0);
    snprintf(args, sizeof args, TINY " --steps 2 --layers 1 --resume %s", ck);
    out = NULL;
    assert_int_equal(h_run_program(g_bin, args, &out), 1);
    assert_non_null(strstr(out, "is not this run's"));
    free(out);
}

/* ------------------------------------------------------------ cuda, bf16 */

static void test_bf16(void **state) {
    (void)state;
    REQUIRE_BIN();
    const char *base = base_run();
    assert_non_null(base);
    double b[16], x[16];
    assert_int_equal(read_losses(base, b, NULL, 16), 4);
    char *bf = dir_of("bf16");
    assert_int_equal(train(TINY " --tp 2 --cp 2 --steps 4 --dtype bf16", bf, 0), 0);
    assert_int_equal(read_losses(bf, x, NULL, 16), 4);
    for (int s = 0; s < 4; s++) {
        if (fabs(x[s] - b[s]) > 0.03 * b[s]) print_error("bf16 step %d: %.6g, fp32 %.6g\n", s, x[s], b[s]);
        assert_true(fabs(x[s] - b[s]) <= 0.03 * b[s]);
    }
}

/* ------------------------------------------------------------ pytorch */

/* A dump of a dp2 x tp2 x cp2 zigzag run, and one of a packed tp2 x cp2
 * run (the replay says it splits at the separator), replay in PyTorch from
 * their own files (scripts/check_dump.py, float64: losses, norms, grad0.bin
 * and final.bin within the script's stated fp32 tolerances). Skipped without
 * a Python that imports torch: $PYTHON, python3, /usr/bin/python3 in turn. */
static void test_dump_replays_in_pytorch(void **state) {
    (void)state;
    REQUIRE_BIN();
    const char *python = h_python_with("numpy, torch");
    if (!python) {
        print_message("skipped: PyTorch is not installed (apt-get install python3-torch)\n");
        skip();
    }
    /* a dp2 x tp2 x cp2 run, and a packed one on tp2 x cp2 (documents end
     * after each space: several a sequence) */
    static const char *const runs[2][2] = {
        {"pytorch-dp2,tp2,cp2", TINY " --dp 2 --tp 2 --cp 2 --order zigzag --steps 4"},
        {"pytorch-packed,tp2,cp2", TINY " --tp 2 --cp 2 --packed --separator ' ' --steps 4"},
    };
    for (int k = 0; k < 2; k++) {
        char *dir = dir_of(runs[k][0]);
        assert_int_equal(train(runs[k][1], dir, 0), 0);
        char args[900], *out = NULL;
        snprintf(args, sizeof args, "scripts/check_dump.py '%s'", dir);
        const int rc = h_run_program(python, args, &out);
        print_message("%s %s exited %d:\n%s", python, args, rc, out ? out : "");
        const int packed = out && strstr(out, "check_dump: packed: documents end after each b' '");
        free(out);
        assert_int_equal(rc, 0);
        assert_int_equal(packed, k == 1);
    }
}

/* train_gpt's output (malloc'd) when it exits 0, else NULL after printing it. */
static char *train_output(const char *args) {
    char *out = NULL;
    const int rc = h_run_program(g_bin, args, &out);
    if (rc == 0) return out;
    print_error("train_gpt %s exited %d:\n%s\n", args, rc, out ? out : "");
    free(out);
    return NULL;
}

/* The first rank's peak (MiB) from "peak memory per rank (MiB): ..." */
static double peak_of(const char *out) {
    const char *p = out ? strstr(out, "peak memory per rank (MiB):") : NULL;
    return p ? strtod(p + strlen("peak memory per rank (MiB):"), NULL) : -1.0;
}

/* Memory: a step after the first takes none (backend counters), and the
 * process's resident memory stays flat over 1,000 steps; a rank's peak
 * falls with cp (the sequence-sharded activations) and with --recompute. */
static void test_memory(void **state) {
    (void)state;
    REQUIRE_BIN();
    char *out = train_output("--ranks 2 --tp 2 --layers 1 --dim 16 --heads 2 --seq 8 --batch 2 "
                             "--steps 1000 --log-every 500 --sample 0 --peak-tflops 1");
    assert_non_null(out);
    assert_non_null(strstr(out, "after the first step: no step took new memory on any rank"));
    const char *r = strstr(out, "resident memory (rank 0's process) ");
    double first = -1, last = -1;
    if (r)
        sscanf(r, "resident memory (rank 0's process) %lf KiB after the first step, %lf KiB at the "
               "end", &first, &last);
    print_message("resident memory %.0f KiB after step 0, %.0f KiB after step 999\n", first, last);
    assert_true(first > 0 && last > 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* the sanitizers hold freed memory back (quarantine, shadow): the bound
     * is for the plain build */
    print_message("resident-memory bound not checked under a sanitizer\n");
#else
    assert_true(last <= first + 1024);
#endif
    free(out);
    const char *shape = "--layers 2 --dim 64 --heads 4 --seq 512 --batch 2 --steps 2 --sample 0 "
                        "--peak-tflops 1";
    char args[512];
    double peak[4];
    const char *variants[4] = {"--ranks 1", "--ranks 4 --cp 4", "--ranks 1 --recompute",
                               "--ranks 4 --cp 4 --recompute"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "%s %s", variants[i], shape);
        out = train_output(args);
        peak[i] = peak_of(out);
        assert_non_null(strstr(out, "no step took new memory on any rank"));
        free(out);
        print_message("%s: peak %.2f MiB a rank\n", variants[i], peak[i]);
    }
    assert_true(peak[0] > 0 && peak[1] > 0 && peak[2] > 0 && peak[3] > 0);
    assert_true(peak[1] < 0.5 * peak[0]);   /* cp 4: a quarter of the activations */
    assert_true(peak[2] < 0.75 * peak[0] && peak[3] < peak[1]);
}

/* --profile: rank 0's line parses, with a step, matmuls and attention that
 * took time and the rest their difference (its percentage of matmuls +
 * attention); on a mesh the maxima over the ranks too; and the calls a
 * step makes: 7 matmuls a layer and the head's, each with its backward,
 * and one attention each way a layer. (step >= matmuls + attention is
 * not asserted: they are timed apart, on a shared machine.) */
static void test_profile(void **state) {
    (void)state;
    REQUIRE_BIN();
    static const char *const meshes[2] = {"--ranks 1", "--tp 2 --cp 2"};
    for (int m = 0; m < 2; m++) {
        char args[1024];
        snprintf(args, sizeof args, TINY " %s --steps 1 --profile", meshes[m]);
        char *out = train_output(args);
        assert_non_null(out);
        const char *lines[2] = {strstr(out, "profile (rank 0, median of 5): "),
                                strstr(out, "profile (maximum over 4 ranks, each figure): ")};
        for (int k = 0; k < 2; k++) {
            if (k == 1 && m == 0) {
                assert_null(lines[1]);
                continue;
            }
            double step = -1, mm = -1, at = -1, rest = NAN, pct = NAN;
            const char *p = lines[k] ? strstr(lines[k], ": step ") : NULL;
            const int got = p ? sscanf(p, ": step %lf ms; matmuls %lf ms; attention %lf ms; the rest "
                                       "%lf ms = %lf%% on top of matmuls + attention", &step, &mm,
                                       &at, &rest, &pct) : 0;
            print_message("%s, line %d: step %g ms, matmuls %g, attention %g, rest %g (%g%%)\n",
                          meshes[m], k, step, mm, at, rest, pct);
            assert_int_equal(got, 5);
            assert_true(step > 0 && mm > 0 && at > 0 && isfinite(rest) && isfinite(pct));
            if (k == 0) {   /* from figures printed to 0.005 ms and 0.05% */
                const double want = 100.0 * rest / (mm + at);
                assert_true(fabs(rest - (step - mm - at)) <= 0.02);
                assert_true(fabs(pct - want) <= 0.1 + 2.0 * (0.5 + 0.01 * fabs(want)) / (mm + at));
            }
        }
        assert_non_null(strstr(out, "a step's calls on each rank: 15 dt_matmul, 15 dt_matmul_backward, "
                                    "2 dt_attention_forward, 2 dt_attention_backward"));
        free(out);
    }
}

/* --comm-counts: rank 0's calls and bytes in the first step on each
 * communicator, against counts derived here from TINY's shapes and the code
 * path (examples/train_gpt.c and the library calls it makes). Bytes are
 * collectives/comm.h's: AR(n, P, es) = 2 (P-1) ceil(n/P) es for an
 * all_reduce of n elements of es bytes over P ranks; (P-1) n es for an
 * all_gather or a reduce_scatter of n a rank; a p2p group its sends. A
 * redistribution on a mesh dim of size 1 makes no call (its output shares
 * its input's buffer); the collectives the ops call themselves (the loss's
 * sums, the range check, the norm) call there too, with 0 bytes, and so
 * they do on the world of one rank.
 * TINY: L = 2 layers, d = 64, H = 8, Hkv = 4, Dh = d/H = 8, F = 96,
 * S = 24, B = 4, V = 256 (train_gpt's vocabulary); es = the --dtype's size
 * (activations and gradients), the loss's reductions fp32. On a mesh
 * dp x tp x cp of W ranks: B_l = B/dp, S_l = S/cp, a rank's residual
 * T = B_l S_l d, its logits' rows R = B_l S_l; NP = 9L + 3 = 21 parameters
 * of local sizes n_i (tp shards tok_emb, the projections and lm_head).
 *   dp, cp  all_reduce: the parameters' gradients, Partial over dp and cp,
 *           to Replicate in one bucket (dt_tensor_grad_reduce_n: one
 *           all-reduce a mesh dim, dp then cp; none where P = 1); the loss's
 *           two row sums (dt_cross_entropy: the count of targets, then the
 *           loss, 4 fp32 pieces each)
 *             calls [P > 1] + 2, bytes AR(sum_i n_i, P, es) + 2 AR(4, P, 4)
 *   tp      all_reduce: forward, per layer the two row-parallel outputs
 *           (wo, w_down: Partial -> Replicate) and the embedding's lookup;
 *           backward, per layer the two column-parallel inputs' gradients
 *           (Megatron's f) and the head's; the vocab-parallel loss's row max
 *           (R fp32) and sum|target logit (2R fp32)
 *             calls [tp > 1] (4L + 2) + 2, bytes (4L + 2) AR(T, tp, es)
 *                                  + AR(R, tp, 4) + AR(2R, tp, 4)
 *   cp      p2p (cp > 1): the ring, per layer: forward cp - 1 hops of K|V;
 *           backward (attention/backward.c) cp groups (K|V ahead, the fp32
 *           dK|dV sums behind) and the finished dK|dV home in two halves;
 *           kv = B_l S_l (Hkv/tp) Dh es a rank's K, g = the same in fp32
 *             calls L (2cp + 1), bytes L ((cp-1) 2kv + (cp-1)(2kv + 2g) + 2kv)
 *   world   all_reduce: attention's range check, the max of |q|, |k|, |v|
 *           (and |dout| backward) over the world (attention/plan.c), one per
 *           call, even with DT_CHECK off
 *             calls 2L, bytes L (AR(3, W, 4) + AR(4, W, 4))
 *           all_gather: the global norm, one double a parameter in one
 *           exchange (dt_tensor_sum_squares_n)
 *             calls 1, bytes NP (W-1) 8
 * Under --sp: tp all_gathers the norms' outputs before the
 * column-parallel matmuls (2 a layer and the head's) and the row-parallel
 * outputs' gradients (2 a layer) and the embedding's; it reduce_scatters the
 * row-parallel outputs and the embedding's (forward) and the
 * column-parallel inputs' gradients and the head's (backward): 4L + 2 each
 * of B_l (S_l/tp) d a rank (cp's part of the sequence, cut over tp: a
 * direct step, tp being the innermost mesh dim); all_reduce: the 2L + 1
 * norms' gradients (Partial over tp: a bucket of their own, summed over
 * dp, cp and tp, the other parameters' over dp and cp) and the loss's two
 * (R = B_l S_l); cp as above, and nothing with cp = 1. */
enum { TL = 2, TD = 64, TH = 8, THKV = 4, TDH = TD / TH, TF = 96, TS = 24, TB = 4, TV = 256,
       TNP = 9 * TL + 3 };
enum { C_DP, C_TP, C_CP, C_WORLD, C_COMMS };
static const char *const comm_names[C_COMMS] = {"dp", "tp", "cp", "world"};

typedef struct comm_table {
    uint64_t calls[C_COMMS][DT_COMM_KIND_COUNT], sent[C_COMMS][DT_COMM_KIND_COUNT],
             recv[C_COMMS][DT_COMM_KIND_COUNT];
} comm_table;

static uint64_t ar(uint64_t n, uint64_t P, uint64_t es) {
    return 2 * (P - 1) * ((n + P - 1) / P) * es;
}

static void put(comm_table *t, int c, dt_comm_kind k, uint64_t calls, uint64_t bytes) {
    t->calls[c][k] = calls, t->sent[c][k] = bytes, t->recv[c][k] = bytes;
}

static void comm_expected(uint64_t dp, uint64_t tp, uint64_t cp, int sp, uint64_t es,
                          comm_table *t) {
    memset(t, 0, sizeof *t);
    const uint64_t W = dp * tp * cp, Bl = TB / dp, Sl = TS / cp, T = Bl * Sl * TD;
    uint64_t n[TNP], k = 0;
    n[k++] = TV * TD / tp;                                    /* tok_emb */
    for (int l = 0; l < TL; l++) {
        n[k++] = TD;                                          /* attn_norm */
        n[k++] = TD * TH * TDH / tp;                          /* wq */
        n[k++] = TD * THKV * TDH / tp, n[k++] = TD * THKV * TDH / tp;   /* wk, wv */
        n[k++] = TH * TDH * TD / tp;                          /* wo */
        n[k++] = TD;                                          /* mlp_norm */
        n[k++] = TD * TF / tp, n[k++] = TD * TF / tp, n[k++] = TF * TD / tp;   /* gate, up, down */
    }
    n[k++] = TD;                                              /* norm */
    n[k++] = TD * TV / tp;                                    /* lm_head */
    assert_int_equal(k, TNP);
    /* the norms' elements (attn_norm, mlp_norm and norm: local size d),
     * and the other parameters' */
    uint64_t nn = 0, nw = 0;
    for (int i = 0; i < TNP; i++) *(n[i] == TD ? &nn : &nw) += n[i];
    static const int row_comms[2] = {C_DP, C_CP};
    for (int j = 0; j < 2; j++) {
        const int c = row_comms[j];
        const uint64_t P = c == C_DP ? dp : cp;
        if (c == C_CP && sp && cp == 1) continue;   /* nothing is sharded over cp */
        const uint64_t b = 2 * ar(4, P, 4) + (sp ? ar(nw, P, es) + ar(nn, P, es)
                                                 : ar(nw + nn, P, es));
        put(t, c, DT_COMM_ALL_REDUCE, (P > 1) * (sp ? 2 : 1) + 2, b);
    }
    const uint64_t R = Bl * Sl;
    if (!sp) {
        put(t, C_TP, DT_COMM_ALL_REDUCE, (tp > 1) * (4 * TL + 2) + 2,
            (4 * TL + 2) * ar(T, tp, es) + ar(R, tp, 4) + ar(2 * R, tp, 4));
    } else {
        const uint64_t blk = (tp - 1) * Bl * (Sl / tp) * TD * es;
        put(t, C_TP, DT_COMM_ALL_GATHER, 4 * TL + 2, (4 * TL + 2) * blk);
        put(t, C_TP, DT_COMM_REDUCE_SCATTER, 4 * TL + 2, (4 * TL + 2) * blk);
        put(t, C_TP, DT_COMM_ALL_REDUCE, 3, ar(nn, tp, es) + ar(R, tp, 4) + ar(2 * R, tp, 4));
    }
    if (cp > 1) {
        const uint64_t kv = Bl * Sl * (THKV / tp) * TDH * es, g = kv / es * 4;
        put(t, C_CP, DT_COMM_P2P, TL * (2 * cp + 1),
            TL * ((cp - 1) * 2 * kv + (cp - 1) * (2 * kv + 2 * g) + 2 * kv));
    }
    put(t, C_WORLD, DT_COMM_ALL_REDUCE, 2 * TL, TL * (ar(3, W, 4) + ar(4, W, 4)));
    put(t, C_WORLD, DT_COMM_ALL_GATHER, 1, TNP * (W - 1) * 8);
}

/* The "comm NAME KIND calls N sent N recv N" lines of out; 0 if one does
 * not parse or repeats. */
static int comm_parse(const char *out, comm_table *t) {
    memset(t, 0, sizeof *t);
    int lines = 0;
    for (const char *p = out; (p = strstr(p, "comm ")) != NULL; p++) {
        if (p != out && p[-1] != '\n') continue;
        char name[16], kind[32];
        unsigned long long calls, sent, recv;
        if (sscanf(p, "comm %15s %31s calls %llu sent %llu recv %llu", name, kind, &calls, &sent,
                   &recv) != 5) {
            print_error("does not parse: %.80s\n", p);
            return 0;
        }
        int c = -1, k = -1;
        for (int i = 0; i < C_COMMS; i++)
            if (!strcmp(name, comm_names[i])) c = i;
        for (int i = 0; i < DT_COMM_KIND_COUNT; i++)
            if (!strcmp(kind, dt_comm_kind_name((dt_comm_kind)i))) k = i;
        if (c < 0 || k < 0 || t->calls[c][k] || !calls) {
            print_error("unknown, repeated or empty: %.80s\n", p);
            return 0;
        }
        t->calls[c][k] = calls, t->sent[c][k] = sent, t->recv[c][k] = recv;
        lines++;
    }
    return lines > 0;
}

static void test_comm_counts(void **state) {
    (void)state;
    REQUIRE_BIN();
    static const struct {
        const char *args;
        int dp, tp, cp, sp, es;
    } runs[] = {
        {"--tp 2 --cp 2", 1, 2, 2, 0, 4},
        {"--tp 2 --cp 2 --order zigzag --dtype bf16", 1, 2, 2, 0, 2},
        {"--dp 2 --tp 2", 2, 2, 1, 0, 4},
        {"--dp 2 --tp 2 --cp 2 --order contiguous", 2, 2, 2, 0, 4},
        {"--tp 2 --cp 3", 1, 2, 3, 0, 4},
        {"--tp 2 --sp", 1, 2, 1, 1, 4},
        {"--tp 2 --cp 2 --sp --order zigzag", 1, 2, 2, 1, 4},
        {"--ranks 1", 1, 1, 1, 0, 4},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        char args[1024];
        snprintf(args, sizeof args, TINY " %s --steps 2 --comm-counts", runs[r].args);
        char *out = train_output(args);
        assert_non_null(out);
        comm_table got, want;
        const int parsed = comm_parse(out, &got);
        free(out);
        assert_true(parsed);
        comm_expected((uint64_t)runs[r].dp, (uint64_t)runs[r].tp, (uint64_t)runs[r].cp, runs[r].sp,
                      (uint64_t)runs[r].es, &want);
        int bad = 0;
        for (int c = 0; c < C_COMMS; c++)
            for (int k = 0; k < DT_COMM_KIND_COUNT; k++) {
                if (got.calls[c][k] == want.calls[c][k] && got.sent[c][k] == want.sent[c][k] &&
                    got.recv[c][k] == want.recv[c][k])
                    continue;
                print_error("%s: comm %s %s: calls %llu sent %llu recv %llu, want %llu %llu %llu\n",
                            runs[r].args, comm_names[c], dt_comm_kind_name((dt_comm_kind)k),
                            (unsigned long long)got.calls[c][k], (unsigned long long)got.sent[c][k],
                            (unsigned long long)got.recv[c][k],
                            (unsigned long long)want.calls[c][k],
                            (unsigned long long)want.sent[c][k],
                            (unsigned long long)want.recv[c][k]);
                bad++;
            }
        print_message("%s: every communicator's calls and bytes as derived%s\n", runs[r].args,
                      bad ? " but for the above" : "");
        assert_int_equal(bad, 0);
    }
}

/* The same binary as processes under mpirun (MPIRUN, or mpirun from PATH;
 * skipped without): the threads' losses and final parameters to the bit
 * (both transports sum in rank order in fp32). */
static void test_mpirun(void **state) {
    (void)state;
    REQUIRE_BIN();
#ifndef DT_HAVE_MPI
    print_message("skipped: this build has no MPI (MPI=0, or no mpicc)\n");
    skip();
#endif
    const char *mpirun = getenv("MPIRUN") && *getenv("MPIRUN") ? getenv("MPIRUN") : "mpirun";
    if (!getenv("MPIRUN") && system("command -v mpirun >/dev/null 2>&1") != 0) {
        print_message("skipped: no mpirun in PATH\n");
        skip();
    }
    char *thr = dir_of("mpi-threads"), *pro = dir_of("mpi-processes"), args[6000];
    assert_int_equal(train(TINY " --tp 2 --cp 2 --order zigzag --steps 3", thr, 0), 0);
    snprintf(args, sizeof args, "--allow-run-as-root --oversubscribe --bind-to none -np 4 %s "
             TINY " --tp 2 --cp 2 --order zigzag --steps 3 --dump %s", g_bin, pro);
    /* Sanitizer builds: no leak report for these processes (Open MPI keeps
     * allocations until exit that LeakSanitizer cannot attribute; the MPI
     * suite runs so too, tests/run_tests.sh); the threads' run checks ours. */
    const char *asan = getenv("ASAN_OPTIONS");
    char *saved = asan ? strdup(asan) : NULL, opts[2048];
    snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    char *out = NULL;
    const int rc = h_run_program(mpirun, args, &out);
    if (saved) setenv("ASAN_OPTIONS", saved, 1);
    else unsetenv("ASAN_OPTIONS");
    free(saved);
    if (rc != 0) print_error("%s %s exited %d:\n%s\n", mpirun, args, rc, out ? out : "");
    free(out);
    assert_int_equal(rc, 0);
    double a[8], b[8];
    assert_int_equal(read_losses(thr, a, NULL, 8), 3);
    assert_int_equal(read_losses(pro, b, NULL, 8), 3);
    for (int s = 0; s < 3; s++) assert_true(a[s] == b[s]);
    size_t na = 0, nb = 0;
    float *fa = read_floats(thr, "final.bin", &na), *fb = read_floats(pro, "final.bin", &nb);
    assert_true(fa && fb && na == nb && na > 0);
    assert_int_equal(memcmp(fa, fb, na * sizeof *fa), 0);
    free(fa), free(fb);
}

/* The CUDA backend (the emulator under make CUDA=emu): the CPU's losses. */
static void test_cuda(void **state) {
    (void)state;
    REQUIRE_BIN();
    char why[512];
    if (!h_pair_available(2, DT_BACKEND_CUDA, DT_TRANSPORT_AUTO, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    const char *base = base_run();
    assert_non_null(base);
    double b[16], x[16];
    assert_int_equal(read_losses(base, b, NULL, 16), 4);
    char *cu = dir_of("cuda");
    assert_int_equal(train(TINY " --tp 2 --steps 4 --backend cuda", cu, 0), 0);
    assert_int_equal(read_losses(cu, x, NULL, 16), 4);
    for (int s = 0; s < 4; s++) {
        if (fabs(x[s] - b[s]) > 1e-4 * b[s]) print_error("cuda step %d: %.9g, cpu %.9g\n", s, x[s], b[s]);
        assert_true(fabs(x[s] - b[s]) <= 1e-4 * b[s]);
    }
    /* after the first step no cudaMalloc: every block from the caching allocator */
    char *out = train_output(TINY " --tp 2 --steps 6 --backend cuda");
    assert_non_null(out);
    assert_non_null(strstr(out, "no step took new memory on any rank"));
    free(out);
}

int main(int argc, char **argv) {
    (void)argc;
    const char *slash = argv[0] ? strrchr(argv[0], '/') : NULL;
    if (slash && slash - argv[0] < 4000)
        snprintf(g_bin, sizeof g_bin, "%.*s/../examples/train_gpt", (int)(slash - argv[0]), argv[0]);
    snprintf(g_tmp, sizeof g_tmp, "%s/dt-train-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    static const struct {
        const char *name, *args;
        int exact;
    } meshes[] = {
        {"dp2", "--dp 2", 0},
        {"tp2", "--tp 2", 0},
        {"cp4", "--cp 4", 0},
        {"dp2,tp2,cp2", "--dp 2 --tp 2 --cp 2", 0},
        {"tp2,cp3", "--tp 2 --cp 3", 0},
        {"tp4,cp2", "--tp 4 --cp 2", 0},
        {"tp2,sp", "--tp 2 --sp", 0},
        {"tp2,cp2,sp", "--tp 2 --cp 2 --sp", 0},
        {"recompute", "--ranks 1 --recompute", 1},
        {"tp2,cp2,recompute", "--tp 2 --cp 2 --recompute", 0},
    };
    static const char *const orders[] = {"contiguous", "striped", "zigzag"};
    static mesh_case cases[64];
    struct CMUnitTest tests[96];
    int n = 0, nc = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_reference_finite_differences);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_one_rank_matches_reference);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_dump_format);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_packed);
    for (size_t m = 0; m < sizeof meshes / sizeof meshes[0]; m++)
        for (int o = 0; o < 3; o++) {
            const int has_cp = strstr(meshes[m].args, "--cp") != NULL;
            if (!has_cp && o != 1) continue;   /* the order only matters with cp */
            if (getenv("DT_TEST_QUICK") && o != 1) continue;
            mesh_case *c = &cases[nc++];
            snprintf(c->name, sizeof c->name, "mesh/%s,%s", meshes[m].name, orders[o]);
            snprintf(c->args, sizeof c->args, "%s --order %s", meshes[m].args, orders[o]);
            c->exact = meshes[m].exact;
            tests[n++] = (struct CMUnitTest){c->name, test_mesh, NULL, NULL, c};
        }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_resume_exact);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_resume_on_another_mesh);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_export);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_flags);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bf16);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_dump_replays_in_pytorch);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_memory);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_profile);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_comm_counts);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mpirun);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_cuda);
    const int failed = h_run_cases("train_gpt", tests, (size_t)n);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return failed;
}
