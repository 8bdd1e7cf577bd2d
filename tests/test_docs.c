/* tests/test_docs.c — the docs show what the code does.
 *
 * - docs/TUTORIAL.md says its code excerpts are taken from the sources: each
 *   ```c block must be a run of consecutive lines of one file under
 *   examples/, dtensor/, collectives/ or attention/ (indentation and
 *   trailing blanks aside), so an excerpt goes stale as a failure here, not
 *   as a tutorial that teaches code that no longer exists.
 * - docs/RELIABILITY.md backs each guarantee with tests by name: each is
 *   a test of the suite it names. Two of its guarantees are about the code
 *   itself, and are read there: the library calls nothing that ends the
 *   process (abort, exit, assert) or waits without a deadline
 *   (pthread_cond_wait, cudaStreamSynchronize, a blocking MPI call, ...).
 * - docs/ARCHITECTURE.md's file map names every source file of the
 *   library (dtensor/, collectives/, attention/), and only files that exist.
 * - docs/API.md documents what a user gets: every dt_* / DT_* name in it is
 *   in a header that `make install` installs, or is an environment variable
 *   the library reads (a string literal of its sources: getenv("DT_LOG")).
 *   Internal names stay out of the reference. The other way round, every
 *   dt_* function those headers declare or call is in it.
 * - README.md's first program, built with the README's own commands (read
 *   from it) against what `make install` puts under a prefix the loader does
 *   not search: its pkg-config line, and its CMakeLists.txt with
 *   find_package(dtensor); each program must start without LD_LIBRARY_PATH,
 *   load that prefix's libdtensor.so and exit 0 (it shards a tensor over 4
 *   ranks and gathers it back).
 *
 * Run from the repository root (make test does). The last three read the
 * prefix that make test installs into (BUILD/stage, $DT_DOCS_STAGE, with
 * $DT_DOCS_CC and $DT_DOCS_CFLAGS: how the build compiles) and skip, with
 * the reason, without it, without pkg-config or without cmake.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* ------------------------------------------------------------ text helpers */

/* Lines of a text with their leading and trailing blanks cut: the text is
 * changed in place and line[i] points into it. */
typedef struct lines {
    char **line;
    int n;
} lines;

static lines split_trimmed(char *text) {
    lines l = {NULL, 0};
    int cap = 0;
    for (char *p = text; p && *p;) {
        char *end = strchr(p, '\n');
        char *next = end ? end + 1 : NULL;
        if (!end) end = p + strlen(p);
        while (end > p && isspace((unsigned char)end[-1])) end--;
        *end = '\0';
        while (isspace((unsigned char)*p)) p++;
        if (l.n == cap) {
            cap = cap ? 2 * cap : 256;
            char **t = realloc(l.line, (size_t)cap * sizeof *t);
            assert_non_null(t);
            l.line = t;
        }
        l.line[l.n++] = p;
        p = next;
    }
    return l;
}

/* The body of the k-th ```lang block of a Markdown text (malloc'd; its
 * first line in *at, 1-based), or NULL when it has fewer. */
static char *md_block(const char *md, const char *lang, int k, int *at) {
    char fence[32];
    snprintf(fence, sizeof fence, "```%s\n", lang);
    const char *p = md;
    for (int i = 0;; i++) {
        p = strstr(p, fence);
        while (p && p != md && p[-1] != '\n') p = strstr(p + 1, fence);
        if (!p) return NULL;
        const char *body = p + strlen(fence), *end = strstr(body, "\n```");
        if (!end) return NULL;
        if (i == k) {
            int line = 2;
            for (const char *q = md; q < body - 1; q++) line += *q == '\n';
            *at = line;
            size_t n = (size_t)(end - body) + 1;
            char *s = malloc(n + 1);
            assert_non_null(s);
            memcpy(s, body, n);
            s[n] = '\0';
            return s;
        }
        p = end + 4;
    }
}

/* Blanks out comments and string and character literals of C / CUDA
 * source, in place, keeping its newlines. */
static void blank_comments_and_literals(char *s) {
    for (char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e ? e + 2 : p + strlen(p);
            for (; p < end; p++)
                if (*p != '\n') *p = ' ';
            p--;
        } else if (p[0] == '/' && p[1] == '/') {
            for (; *p && *p != '\n'; p++) *p = ' ';
            p--;
        } else if (*p == '"' || *p == '\'') {
            const char q = *p;
            for (p++; *p && *p != q && *p != '\n'; p++) {
                if (*p == '\\' && p[1]) *p++ = ' ';
                *p = ' ';
            }
            if (!*p) p--;
        }
    }
}

/* ------------------------------------------------- TUTORIAL.md's excerpts */

typedef struct source {
    char path[512];
    char *raw;    /* the file */
    char *text;   /* the same, cut into l */
    lines l;
} source;

static void free_sources(source *src, int n) {
    for (int s = 0; s < n; s++) {
        free(src[s].l.line);
        free(src[s].text);
        free(src[s].raw);
    }
}

/* Whether a file name is C or CUDA source: .c, .h, .cu, .cuh. */
static int is_source(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") ||
                   !strcmp(dot, ".cuh"));
}

/* Every source file of the dirs (into src, at most cap). */
static int load_sources(const char *const *dirs, int ndirs, source *src, int cap) {
    int n = 0;
    for (int d = 0; d < ndirs; d++) {
        DIR *dir = opendir(dirs[d]);
        assert_non_null(dir);
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (!is_source(e->d_name)) continue;
            assert_true(n < cap);
            snprintf(src[n].path, sizeof src[n].path, "%s/%s", dirs[d], e->d_name);
            src[n].raw = h_read_text(src[n].path);
            assert_non_null(src[n].raw);
            src[n].text = strdup(src[n].raw);
            assert_non_null(src[n].text);
            src[n].l = split_trimmed(src[n].text);
            n++;
        }
        closedir(dir);
    }
    return n;
}

/* The most leading lines of ex that some run of consecutive lines of the
 * sources matches (ex->n when one matches all), and its file in *where. */
static int best_match(const lines *ex, const source *src, int nsrc, const char **where) {
    int best = 0;
    *where = NULL;
    for (int s = 0; s < nsrc; s++)
        for (int i = 0; i < src[s].l.n; i++) {
            int j = 0;
            while (j < ex->n && i + j < src[s].l.n && strcmp(ex->line[j], src[s].l.line[i + j]) == 0)
                j++;
            if (j > best) {
                best = j;
                *where = src[s].path;
            }
        }
    return best;
}

static void test_tutorial_excerpts(void **state) {
    (void)state;
    const char *const dirs[] = {"examples", "base", "collectives", "dtensor", "attention",
                                "attention/cuda"};
    static source src[512];
    const int nsrc = load_sources(dirs, 6, src, 512);
    char *md = h_read_text("docs/TUTORIAL.md");
    assert_non_null(md);
    int blocks = 0, stale = 0, at = 0;
    for (char *body; (body = md_block(md, "c", blocks, &at)) != NULL; blocks++) {
        lines ex = split_trimmed(body);
        while (ex.n > 0 && ex.line[ex.n - 1][0] == '\0') ex.n--;   /* the block's last newline */
        const char *where;
        const int got = best_match(&ex, src, nsrc, &where);
        if (got < ex.n) {
            stale++;
            print_error("docs/TUTORIAL.md:%d: the excerpt's line %d is not in the sources: "
                        "\"%s\"%s%s%s\n",
                        at + got, got + 1, ex.line[got], where ? " (its lines before it are in " : "",
                        where ? where : "", where ? ")" : "");
        }
        free(ex.line);
        free(body);
    }
    print_message("%d excerpts checked against %d source files\n", blocks, nsrc);
    free(md);
    free_sources(src, nsrc);
    assert_true(blocks >= 5);   /* the tutorial shows code: a broken fence finds none */
    assert_int_equal(stale, 0);
}

/* ------------------------------------------- ARCHITECTURE.md's file map */

#define MAP_MAX 512

/* The files (and folders) ARCHITECTURE.md's tables name in their first
 * cells: `dtensor/ops.[ch]` is dtensor/ops.c and dtensor/ops.h, and a name
 * without a folder (`ops_norm.c`) is in the cell's folder before it. Names
 * that are not paths (`dt_tensor_shard(...)`) are passed over. */
static int architecture_map(const char *md, char (*named)[256], int cap) {
    int n = 0;
    for (const char *l = md; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, "| `", 3) != 0) continue;
        const char *cell_end = strchr(l + 1, '|');
        if (!cell_end) continue;
        char dir[256] = "";
        for (const char *p = strchr(l + 1, '`'); p && p < cell_end; p = strchr(p + 1, '`')) {
            const char *item = p + 1, *end = strchr(item, '`');
            if (!end || end > cell_end) break;
            p = end;
            size_t len = (size_t)(end - item), base = 0, i;
            for (i = 0; i < len; i++) {
                if (!(isalnum((unsigned char)item[i]) || strchr("_./[]", item[i]))) break;
                if (item[i] == '/') base = i + 1;
            }
            if (i < len) continue;   /* not a path */
            if (base > 0) snprintf(dir, sizeof dir, "%.*s", (int)base, item);
            if (!dir[0]) continue;
            const char *stem = item + base;
            size_t sl = len - base;
            if (sl == 0) {   /* a folder */
                assert_true(n < cap);
                snprintf(named[n++], 256, "%s", dir);
                continue;
            }
            if (!memchr(stem, '.', sl)) continue;
            const char *alt = sl > 4 && stem[sl - 1] == ']' ? memchr(stem, '[', sl) : NULL;
            if (!alt) {
                assert_true(n < cap);
                snprintf(named[n++], 256, "%s%.*s", dir, (int)sl, stem);
                continue;
            }
            for (const char *c = alt + 1; *c != ']'; c++) {   /* x.[ch] */
                assert_true(n < cap);
                snprintf(named[n++], 256, "%s%.*s%c", dir, (int)(alt - stem), stem, *c);
            }
        }
    }
    return n;
}

/* ARCHITECTURE.md's file map names every source file of the library, and
 * only files that exist. */
static void test_architecture_map(void **state) {
    (void)state;
    char *md = h_read_text("docs/ARCHITECTURE.md");
    assert_non_null(md);
    static char named[MAP_MAX][256];
    const int n = architecture_map(md, named, MAP_MAX);
    free(md);
    int wrong = 0;
    for (int i = 0; i < n; i++)
        if (access(named[i], F_OK) != 0) {
            wrong++;
            print_error("docs/ARCHITECTURE.md's file map names %s, which does not exist\n", named[i]);
        }
    const char *const dirs[] = H_LIB_DIRS;
    int files = 0;
    for (int d = 0; d < H_LIB_NDIRS; d++) {
        DIR *dp = opendir(dirs[d]);
        assert_non_null(dp);
        struct dirent *e;
        while ((e = readdir(dp)) != NULL) {
            if (!is_source(e->d_name)) continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            files++;
            int in = 0;
            for (int i = 0; i < n && !in; i++) in = strcmp(named[i], path) == 0;
            if (!in) {
                wrong++;
                print_error("docs/ARCHITECTURE.md's file map leaves out %s\n", path);
            }
        }
        closedir(dp);
    }
    print_message("%d names of the file map, %d library sources\n", n, files);
    assert_true(files >= 30);
    assert_int_equal(wrong, 0);
}

/* ------------------------------------------------ what make install gives */

/* The prefix make test installed into, or skip with the reason. */
static const char *require_stage(void) {
    const char *stage = getenv("DT_DOCS_STAGE");
    char pc[4096];
    if (!stage || !*stage) {
        print_message("skipped: DT_DOCS_STAGE is not set (make test installs the library under "
                      "BUILD/stage and sets it)\n");
        skip();
    }
    snprintf(pc, sizeof pc, "%s/lib/pkgconfig/dtensor.pc", stage);
    if (access(pc, R_OK) != 0) {
        print_message("skipped: %s is missing (run make test)\n", pc);
        skip();
    }
    return stage;
}

/* Whether name occurs in text as a whole identifier. */
static int has_word(const char *text, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = strstr(text, name); p; p = strstr(p + 1, name)) {
        const int before = p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
        const int after = isalnum((unsigned char)p[n]) || p[n] == '_';
        if (!before && !after) return 1;
    }
    return 0;
}

static void test_api_names_installed(void **state) {
    (void)state;
    const char *stage = require_stage();
    /* The installed headers, and the library's sources (for the
     * environment variables it reads). */
    const char *const sub[] = H_LIB_DIRS;
    char hdirs[H_LIB_NDIRS][4096];
    const char *hdir[H_LIB_NDIRS];
    int nhdir = 0;   /* the folders with an installed header */
    for (int d = 0; d < H_LIB_NDIRS; d++) {
        snprintf(hdirs[nhdir], sizeof hdirs[nhdir], "%s/include/dtensor/%s", stage, sub[d]);
        if (access(hdirs[nhdir], F_OK) == 0) hdir[nhdir] = hdirs[nhdir], nhdir++;
    }
    static source hdr[512], src[512];
    const int nh = load_sources(hdir, nhdir, hdr, 512),
              nsrc = load_sources(sub, H_LIB_NDIRS, src, 512);
    char *md = h_read_text("docs/API.md");
    assert_non_null(md);
    int names = 0, missing = 0;
    for (const char *p = md; *p; p++) {
        if (!((p[0] == 'd' && p[1] == 't' && p[2] == '_') || (p[0] == 'D' && p[1] == 'T' && p[2] == '_')))
            continue;
        if (p > md && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) continue;
        char name[128];
        size_t n = 0;
        while ((isalnum((unsigned char)p[n]) || p[n] == '_') && n + 1 < sizeof name) {
            name[n] = p[n];
            n++;
        }
        name[n] = '\0';
        names++;
        char quoted[132];
        snprintf(quoted, sizeof quoted, "\"%s\"", name);
        int found = 0;
        for (int i = 0; !found && i < nh; i++) found = has_word(hdr[i].raw, name);
        for (int i = 0; !found && i < nsrc; i++) found = strstr(src[i].raw, quoted) != NULL;
        if (!found) {
            missing++;
            print_error("docs/API.md names %s, which no installed header (%s/include) declares "
                        "and the library does not read from the environment\n",
                        name, stage);
        }
        p += n - 1;
    }
    /* ... every function an installed header declares (or calls in an
     * inline body or a macro: a user's code compiles those calls) is in the
     * reference, but for the helpers named with a trailing underscore (not
     * for direct use) */
    int functions = 0;
    for (int i = 0; i < nh; i++) {
        char *code = strdup(hdr[i].raw);
        assert_non_null(code);
        blank_comments_and_literals(code);
        for (const char *p = code; (p = strstr(p, "dt_")) != NULL; p++) {
            if (p > code && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) continue;
            size_t n = 0;
            while (isalnum((unsigned char)p[n]) || p[n] == '_') n++;
            size_t after = n;
            while (p[after] == ' ' || p[after] == '\t' || p[after] == '\n') after++;
            if (p[after] != '(' || p[n - 1] == '_' || n >= 128) continue;
            char name[128];
            memcpy(name, p, n);
            name[n] = '\0';
            functions++;
            if (!has_word(md, name)) {
                missing++;
                print_error("%s declares or calls %s, which docs/API.md does not name\n",
                            hdr[i].path, name);
            }
            p += n - 1;
        }
        free(code);
    }
    /* ... and no installed header calls itself private (the Makefile
     * leaves out those whose first line says PRIVATE; another spelling
     * slipped through) */
    for (int i = 0; i < nh; i++) {
        const char *eol = strchr(hdr[i].raw, '\n');
        const size_t len = eol ? (size_t)(eol - hdr[i].raw) : strlen(hdr[i].raw);
        for (size_t x = 0; x + 7 <= len; x++)
            if (strncasecmp(hdr[i].raw + x, "private", 7) == 0) {
                missing++;
                print_error("%s is installed but its first line says it is private\n", hdr[i].path);
                break;
            }
    }
    print_message("%d names of docs/API.md against %d installed headers, %d function names "
                  "of those against docs/API.md\n", names, nh, functions);
    free(md);
    free_sources(hdr, nh);
    free_sources(src, nsrc);
    assert_true(names > 100);      /* the reference names the API */
    assert_true(functions > 100);  /* and the headers declare it */
    assert_int_equal(missing, 0);
}

/* ------------------------------------- RELIABILITY.md's table of evidence */

/* RELIABILITY.md backs each guarantee with tests, `suite: test_name` (and
 * more `test_name`s of that suite after it on the line): each must be a test
 * function of tests/suite.c. */
static void test_reliability_tests_exist(void **state) {
    (void)state;
    char *md = h_read_text("docs/RELIABILITY.md");
    assert_non_null(md);
    int named = 0, gone = 0, line = 1;
    char suite[64] = "", *text = NULL;
    for (const char *p = md; *p; p++) {
        if (*p == '\n') {
            line++;
            suite[0] = '\0';   /* a suite holds for the rest of its line only */
            continue;
        }
        if (*p != '`' || strncmp(p + 1, "test_", 5) != 0) continue;
        const char *id = p + 1, *colon = NULL;
        size_t n = 0;
        while (isalnum((unsigned char)id[n]) || id[n] == '_') n++;
        if (id[n] == ':' && id[n + 1] == ' ' && n < sizeof suite) {   /* `suite: test_name` */
            memcpy(suite, id, n);
            suite[n] = '\0';
            free(text);
            char path[128];
            snprintf(path, sizeof path, "tests/%s.c", suite);
            text = h_read_text(path);
            if (!text) print_error("docs/RELIABILITY.md:%d: no suite %s\n", line, path);
            gone += !text;
            colon = id + n + 2;
        }
        if (!suite[0] || !text) continue;
        const char *name = colon ? colon : id;
        size_t m = 0;
        while (isalnum((unsigned char)name[m]) || name[m] == '_') m++;
        char fn[160];
        snprintf(fn, sizeof fn, "void %.*s(void **state)", (int)m, name);
        named++;
        if (!strstr(text, fn)) {
            gone++;
            print_error("docs/RELIABILITY.md:%d: tests/%s.c has no test %.*s\n", line, suite, (int)m,
                        name);
        }
        p = name + m - 1;
    }
    print_message("%d tests named by docs/RELIABILITY.md\n", named);
    free(text);
    free(md);
    assert_true(named >= 10);
    assert_int_equal(gone, 0);
}

/* RELIABILITY.md: "Library code never aborts the process" (no abort, exit
 * or assert) and "Every wait is bounded": the library's sources (dtensor/,
 * collectives/, attention/) call none of the calls below, which end the
 * process or wait without a deadline; their waits poll with one
 * (dt_backoff). pthread_join is dt_launch's, for rank threads whose every
 * wait is bounded; mutexes guard short critical sections, never a peer. A
 * member call (ops->abort(...)) is the library's own. Comments and string
 * and character literals are left out. */
static const char *const forbidden_calls[] = {
    "abort", "exit", "_exit", "_Exit", "quick_exit", "assert", "pthread_cond_wait", "sem_wait",
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "MPI_Wait", "MPI_Waitall", "MPI_Waitany", "MPI_Waitsome", "MPI_Recv", "MPI_Send", "MPI_Ssend",
    "MPI_Sendrecv", "MPI_Probe", "MPI_Barrier", "MPI_Bcast", "MPI_Reduce", "MPI_Allreduce",
    "MPI_Gather", "MPI_Allgather", "MPI_Scatter", "MPI_Alltoall", "MPI_Reduce_scatter",
};

static void test_library_never_aborts_or_waits_unbounded(void **state) {
    (void)state;
    const char *const dirs[] = H_LIB_DIRS;
    static source src[512];
    const int nsrc = load_sources(dirs, H_LIB_NDIRS, src, 512);
    int calls = 0, found = 0;
    for (int i = 0; i < nsrc; i++) {
        char *code = src[i].raw;
        blank_comments_and_literals(code);
        int line = 1;
        for (const char *p = code; *p; p++) {
            if (*p == '\n') line++;
            if (!(isalpha((unsigned char)*p) || *p == '_') ||
                (p > code && (isalnum((unsigned char)p[-1]) || p[-1] == '_')))
                continue;
            size_t n = 0;
            while (isalnum((unsigned char)p[n]) || p[n] == '_') n++;
            const char *after = p + n;
            while (*after == ' ' || *after == '\t') after++;
            const char *before = p;
            while (before > code && (before[-1] == ' ' || before[-1] == '\t')) before--;
            const int member = before > code && (before[-1] == '.' || (before - code >= 2 &&
                                                                        before[-2] == '-' &&
                                                                        before[-1] == '>'));
            for (size_t k = 0; *after == '(' && !member && k < sizeof forbidden_calls / sizeof *forbidden_calls; k++)
                if (strlen(forbidden_calls[k]) == n && strncmp(p, forbidden_calls[k], n) == 0) {
                    found++;
                    print_error("%s:%d: calls %s, which %s\n", src[i].path, line, forbidden_calls[k],
                                k < 6 ? "ends the process" : "waits without a deadline");
                }
            calls++;
            p += n - 1;
        }
    }
    print_message("%d identifiers of %d library sources checked\n", calls, nsrc);
    free_sources(src, nsrc);
    assert_true(nsrc >= 30);
    assert_int_equal(found, 0);
}

/* README.md's code, run as its text says. The first ```c block is the
 * program (prog.c); the first ```sh block with `pkg-config` builds it against
 * an installed prefix and runs it, the first with `cmake -B` builds it with
 * the first ```cmake block as CMakeLists.txt. The prefix in the README is
 * $HOME/.local: here HOME is a temporary directory whose .local is the stage
 * (what `make install` gives), and the block's `make install` lines are left
 * out. `cc` and CMake compile with the build's compiler, -Wall -Wextra
 * -Werror and its sanitizer flags (a sanitized library needs its runtime in
 * the program). LD_LIBRARY_PATH is unset: the program must find the stage's
 * libdtensor.so by itself, and the test checks that it is that one (not a
 * copy under /usr/local). */
typedef struct readme_run {
    char dir[64];     /* temporary: prog.c, CMakeLists.txt, home/.local -> stage */
    char *prog;       /* README's first ```c block */
    int prog_line;    /* its first line in README.md */
} readme_run;

/* The first ```sh block of md that contains needle (malloc'd), or NULL. */
static char *md_sh_block_with(const char *md, const char *needle, int *at) {
    for (int k = 0;; k++) {
        char *b = md_block(md, "sh", k, at);
        if (!b || strstr(b, needle)) return b;
        free(b);
    }
}

static void readme_setup(readme_run *r, const char *stage) {
    char *md = h_read_text("README.md");
    assert_non_null(md);
    r->prog = md_block(md, "c", 0, &r->prog_line);
    free(md);
    assert_non_null(r->prog);
    assert_non_null(strstr(r->prog, "int main"));
    snprintf(r->dir, sizeof r->dir, "/tmp/dt_test_docs.XXXXXX");
    assert_non_null(mkdtemp(r->dir));
    char path[256], local[256];
    snprintf(path, sizeof path, "%s/prog.c", r->dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(r->prog, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/home", r->dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(local, sizeof local, "%s/home/.local", r->dir);
    assert_int_equal(symlink(stage, local), 0);
}

/* Runs the README lines `block` (minus `make ...` lines) in r->dir after
 * the setup above, then checks that `bin` loads the stage's libdtensor.so.
 * Returns the exit status; prints the script and its output on failure. */
static int readme_run_block(readme_run *r, const char *stage, const char *what, const char *block,
                            int at, const char *bin) {
    const char *cc = getenv("DT_DOCS_CC"), *san = getenv("DT_DOCS_CFLAGS");
    cc = cc && *cc ? cc : "cc";
    san = san ? san : "";
    char script[256];
    snprintf(script, sizeof script, "%s/run.sh", r->dir);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fprintf(f,
            "set -e\n"
            "cd '%s'\n"
            "unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH\n"
            "export HOME='%s/home'\n"
            "cc() { command %s -std=c11 -Wall -Wextra -Werror %s \"$@\"; }\n"
            "export CC='%s' CFLAGS='-Wall -Wextra -Werror %s'\n"
            "# README.md line %d:\n",
            r->dir, r->dir, cc, san, cc, san, at);
    char *copy = strdup(block);
    assert_non_null(copy);
    lines l = split_trimmed(copy);
    for (int i = 0; i < l.n; i++)
        if (strncmp(l.line[i], "make ", 5) != 0) fprintf(f, "%s\n", l.line[i]);
    free(l.line);
    free(copy);
    fprintf(f,
            "lib=$(LD_TRACE_LOADED_OBJECTS=1 %s | sed -n 's/.*libdtensor.so => \\([^ ]*\\).*/\\1/p')\n"
            "if [ \"$(readlink -f \"$lib\")\" != \"$(readlink -f '%s/lib/libdtensor.so')\" ]; then\n"
            "    echo \"%s loads libdtensor.so from '$lib', not from the prefix %s\"; exit 1\n"
            "fi\n",
            bin, stage, bin, stage);
    fclose(f);
    char *out = NULL;
    const int rc = h_run_program("/bin/sh", script, &out);
    if (rc != 0) {
        char *text = h_read_text(script);
        print_error("README.md's %s (program at line %d, commands at line %d): exit %d from\n%s"
                    "printing:\n%s\n",
                    what, r->prog_line, at, rc, text ? text : script, out ? out : "");
        free(text);
    }
    free(out);
    return rc;
}

static void readme_cleanup(readme_run *r) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
    if (system(cmd) != 0) print_message("could not remove %s\n", r->dir);
    free(r->prog);
}

/* README.md's program, built with its pkg-config line against the stage,
 * starts without LD_LIBRARY_PATH and exits 0 (4 ranks shard and gather). */
static void test_readme_program(void **state) {
    (void)state;
    const char *stage = require_stage();
    if (system("pkg-config --version >/dev/null 2>&1") != 0) {
        print_message("skipped: pkg-config is not installed (README.md builds with it)\n");
        skip();
    }
    char *md = h_read_text("README.md");
    assert_non_null(md);
    int at = 0;
    char *block = md_sh_block_with(md, "pkg-config", &at);
    free(md);
    if (!block) fail_msg("README.md has no ```sh block that builds with pkg-config");
    readme_run r;
    readme_setup(&r, stage);
    const int rc = readme_run_block(&r, stage, "pkg-config build", block, at, "./prog");
    free(block);
    readme_cleanup(&r);
    assert_int_equal(rc, 0);
}

/* The same program built with CMake: README.md's CMakeLists.txt
 * (find_package(dtensor), dtensor::dtensor: the shared library) and its
 * cmake lines; then a second program from the same source linked to
 * dtensor::dtensor_static, which must run as well. */
static void test_readme_cmake(void **state) {
    (void)state;
    const char *stage = require_stage();
    if (system("cmake --version >/dev/null 2>&1") != 0) {
        print_message("skipped: cmake is not installed (scripts/deps.sh installs it; README.md's "
                      "CMake build needs it)\n");
        skip();
    }
    char *md = h_read_text("README.md");
    assert_non_null(md);
    int at = 0, lists_at = 0;
    char *lists = md_block(md, "cmake", 0, &lists_at);
    char *block = md_sh_block_with(md, "cmake -B", &at);
    free(md);
    if (!lists || !block) fail_msg("README.md lacks a ```cmake block or a ```sh block with `cmake -B`");
    assert_non_null(strstr(lists, "dtensor::dtensor"));
    readme_run r;
    readme_setup(&r, stage);
    char path[256];
    snprintf(path, sizeof path, "%s/CMakeLists.txt", r.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n# test_docs: the static target too\n"
               "add_executable(prog_static prog.c)\n"
               "target_link_libraries(prog_static PRIVATE dtensor::dtensor_static)\n",
            lists);
    fclose(f);
    free(lists);
    int rc = readme_run_block(&r, stage, "CMake build", block, at, "build/prog");
    if (rc == 0) {
        /* The static program has no libdtensor.so to check: just run it. */
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof cmd, "-c 'cd %s && build/prog_static'", r.dir);
        rc = h_run_program("/bin/sh", cmd, &out);
        if (rc != 0) print_error("prog_static (dtensor::dtensor_static): exit %d:\n%s\n", rc, out);
        free(out);
    }
    free(block);
    readme_cleanup(&r);
    assert_int_equal(rc, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tutorial_excerpts),
        cmocka_unit_test(test_reliability_tests_exist),
        cmocka_unit_test(test_library_never_aborts_or_waits_unbounded),
        cmocka_unit_test(test_architecture_map),
        cmocka_unit_test(test_api_names_installed),
        cmocka_unit_test(test_readme_program),
        cmocka_unit_test(test_readme_cmake),
    };
    return h_run_cases("docs", tests, sizeof tests / sizeof tests[0]);
}
