/* tests/test_layers.c — the library's layers stay in order.
 *
 * Reads every #include "..." of the library's sources (harness.h's H_LIB_DIRS:
 * base, collectives, dtensor, attention, attention/cuda) and fails when
 *   - a file includes a header of a higher layer
 *     (base < collectives < dtensor < attention = attention/cuda), or a
 *     quoted header that is not in the library (tests/emu's, under
 *     DT_CUDA_EMULATE, are the one exception: only base/ may name them);
 *   - a transport's own header (collectives/transport_local.h, _mpi.h,
 *     _nccl.h) is included anywhere but its .c file and dtensor/launch.c,
 *     the one file that picks the backend and transport;
 *   - the includes form a cycle.
 * The checker runs first on made-up sources that break each rule, so the
 * test shows it can fail. Run from the repository root (make test does).
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"

#define MAX_FILES 256
#define MAX_INCS 48

typedef struct src_file {
    char path[128];               /* "dtensor/ops.c" */
    int layer;
    int n;
    char raw[MAX_INCS][128];      /* as written: "../base/status.h" */
    char inc[MAX_INCS][128];      /* resolved against the file's folder: "base/status.h" */
} src_file;

typedef struct tree {
    src_file f[MAX_FILES];
    int n;
} tree;

static const char *const g_dirs[] = H_LIB_DIRS;
static const int g_layer[H_LIB_NDIRS] = {0, 1, 2, 3, 3};

static int layer_of(const char *path) {
    int best = -1;
    size_t best_len = 0;
    for (int d = 0; d < H_LIB_NDIRS; d++) {
        size_t n = strlen(g_dirs[d]);
        if (strncmp(path, g_dirs[d], n) == 0 && path[n] == '/' && !strchr(path + n + 1, '/') &&
            n > best_len)
            best = g_layer[d], best_len = n;
    }
    return best;
}

/* dir/rel with "." and ".." folded: "attention/cuda" + "../../base/x.h" -> "base/x.h". */
static void resolve(const char *dir, const char *rel, char *out, size_t size) {
    char buf[256], *parts[32];
    int n = 0;
    snprintf(buf, sizeof buf, "%s/%s", dir, rel);
    for (char *save = NULL, *t = strtok_r(buf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (!strcmp(t, ".")) continue;
        if (!strcmp(t, "..")) {
            if (n > 0) n--;
            continue;
        }
        if (n < 32) parts[n++] = t;
    }
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        strncat(out, parts[i], size - strlen(out) - 1);
        if (i + 1 < n) strncat(out, "/", size - strlen(out) - 1);
    }
}

static int tree_find(const tree *t, const char *path) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->f[i].path, path)) return i;
    return -1;
}

/* Adds `path` with the quoted includes of `text` (resolved against the
 * file's folder, and kept when that names a file of the tree's folders). */
static void tree_add(tree *t, const char *path, const char *text) {
    assert_true(t->n < MAX_FILES);
    src_file *f = &t->f[t->n++];
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->layer = layer_of(path);
    char dir[128];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    for (const char *p = text; (p = strstr(p, "#include")) != NULL; p += 8) {
        const char *line = p;
        while (line > text && line[-1] != '\n') line--;
        const char *q = line;
        while (*q == ' ' || *q == '\t') q++;
        if (q != p) continue;   /* not at the start of a line: a comment's mention */
        q = p + 8;
        while (*q == ' ' || *q == '\t') q++;
        if (*q != '"') continue;
        const char *end = strchr(q + 1, '"');
        if (!end) continue;
        char rel[128];
        snprintf(rel, sizeof rel, "%.*s", (int)(end - q - 1), q + 1);
        assert_true(f->n < MAX_INCS);
        snprintf(f->raw[f->n], sizeof f->raw[f->n], "%s", rel);
        resolve(dir, rel, f->inc[f->n], sizeof f->inc[f->n]);
        f->n++;
    }
}

static int is_transport_header(const char *path) {
    return !strcmp(path, "collectives/transport_local.h") ||
           !strcmp(path, "collectives/transport_mpi.h") ||
           !strcmp(path, "collectives/transport_nccl.h");
}

/* The transport's own source: collectives/transport_X.h -> collectives/transport_X.c. */
static int owns(const char *file, const char *header) {
    size_t n = strlen(header);
    return !strncmp(file, header, n - 1) && !strcmp(file + n - 1, "c");
}

/* 0: unvisited, 1: on the stack, 2: done. Returns 1 and prints the cycle if
 * one is reachable from file i. */
static int cycle_from(const tree *t, int i, int *state, int *stack, int depth) {
    state[i] = 1;
    stack[depth] = i;
    const src_file *f = &t->f[i];
    for (int k = 0; k < f->n; k++) {
        int j = tree_find(t, f->inc[k]);
        if (j < 0) continue;
        if (state[j] == 1) {
            print_error("include cycle:");
            int from = 0;
            while (stack[from] != j) from++;
            for (int s = from; s <= depth; s++) print_error(" %s ->", t->f[stack[s]].path);
            print_error(" %s\n", t->f[j].path);
            return 1;
        }
        if (state[j] == 0 && cycle_from(t, j, state, stack, depth + 1)) return 1;
    }
    state[i] = 2;
    return 0;
}

/* The rules of the top comment; returns the number of breaches (each printed). */
static int check_tree(const tree *t) {
    int bad = 0;
    for (int i = 0; i < t->n; i++) {
        const src_file *f = &t->f[i];
        for (int k = 0; k < f->n; k++) {
            const char *inc = f->inc[k], *raw = f->raw[k];
            if (tree_find(t, inc) < 0) {
                /* tests/emu's headers, reached through -Itests/emu, from base/ only */
                const int emu = f->layer == 0 && strstr(raw, "_emu.h") && !strchr(raw, '/');
                if (!emu) {
                    bad++;
                    print_error("%s includes \"%s\", which is no library header\n", f->path, raw);
                }
                continue;
            }
            if (layer_of(inc) > f->layer) {
                bad++;
                print_error("%s (layer %d) includes %s of a higher layer (%d)\n", f->path, f->layer,
                            inc, layer_of(inc));
            }
            if (is_transport_header(inc) && strcmp(f->path, "dtensor/launch.c") && !owns(f->path, inc)) {
                bad++;
                print_error("%s includes %s: only its transport and dtensor/launch.c may\n", f->path,
                            inc);
            }
        }
    }
    int state[MAX_FILES] = {0}, stack[MAX_FILES];
    for (int i = 0; i < t->n; i++)
        if (state[i] == 0 && cycle_from(t, i, state, stack, 0)) {
            bad++;
            break;
        }
    return bad;
}

static int is_source(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") ||
                   !strcmp(dot, ".cuh"));
}

static void load_library(tree *t) {
    memset(t, 0, sizeof *t);
    for (int d = 0; d < H_LIB_NDIRS; d++) {
        DIR *dp = opendir(g_dirs[d]);
        assert_non_null(dp);
        struct dirent *e;
        while ((e = readdir(dp)) != NULL) {
            if (!is_source(e->d_name)) continue;
            char path[600];
            snprintf(path, sizeof path, "%s/%s", g_dirs[d], e->d_name);
            assert_true(strlen(path) < sizeof t->f[0].path);
            char *text = h_read_text(path);
            assert_non_null(text);
            tree_add(t, path, text);
            free(text);
        }
        closedir(dp);
    }
}

/* Made-up trees, each breaking one rule: the checker must see it. */
static void test_checker_fails_on_bad_includes(void **state) {
    (void)state;
    static tree t;
    static const struct {
        const char *name, *files[3][2];
    } bad[] = {
        {"a lower layer includes a higher one",
         {{"base/status.h", "#include \"../dtensor/tensor.h\"\n"}, {"dtensor/tensor.h", ""}}},
        {"collectives includes attention",
         {{"collectives/ring.c", "  #include \"../attention/mask.h\"\n"}, {"attention/mask.h", ""}}},
        {"a transport header outside launch.c",
         {{"dtensor/context.c", "#include \"../collectives/transport_mpi.h\"\n"},
          {"collectives/transport_mpi.h", ""}}},
        {"a cycle",
         {{"dtensor/a.h", "#include \"b.h\"\n"}, {"dtensor/b.h", "#include \"a.h\"\n"}}},
        {"a header that does not exist", {{"dtensor/a.c", "#include \"nowhere.h\"\n"}}},
        {"a header outside the library", {{"dtensor/a.c", "#include \"cudart_emu.h\"\n"}}},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        memset(&t, 0, sizeof t);
        for (int i = 0; i < 3 && bad[c].files[i][0]; i++)
            tree_add(&t, bad[c].files[i][0], bad[c].files[i][1]);
        print_message("made-up: %s\n", bad[c].name);
        assert_true(check_tree(&t) > 0);
    }
    /* and a good one passes: each layer includes its own and lower ones */
    memset(&t, 0, sizeof t);
    tree_add(&t, "base/status.h", "");
    tree_add(&t, "collectives/comm.h", "#include \"../base/status.h\"\n");
    tree_add(&t, "dtensor/launch.c",
             "#include \"../collectives/comm.h\"\n#include \"../collectives/transport_mpi.h\"\n");
    tree_add(&t, "collectives/transport_mpi.h", "#include \"comm.h\"\n");
    tree_add(&t, "attention/cuda/block.cu", "#include \"../../dtensor/launch.c\"\n// #include \"x.h\"\n");
    assert_int_equal(check_tree(&t), 0);
}

static void test_library_layers(void **state) {
    (void)state;
    static tree t;
    load_library(&t);
    int includes = 0;
    for (int i = 0; i < t.n; i++) includes += t.f[i].n;
    print_message("%d includes of %d library sources checked\n", includes, t.n);
    assert_true(t.n > 50);
    assert_int_equal(check_tree(&t), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_fails_on_bad_includes),
        cmocka_unit_test(test_library_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
