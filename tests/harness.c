/* tests/harness.c — see harness.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

dt_status h_launch(int world, dt_rank_fn fn, void *arg) {
    return h_launch_on(world, DT_BACKEND_CPU, DT_TRANSPORT_LOCAL, fn, arg);
}

dt_status h_launch_on(int world, dt_backend_kind backend, dt_transport_kind transport,
                      dt_rank_fn fn, void *arg) {
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = backend;
    o.transport = transport;
    /* An explicit DT_TIMEOUT_MS wins; otherwise a hang costs 30 s, not 10 min. */
    o.timeout_ms = getenv("DT_TIMEOUT_MS") ? 0 : 30000;
    return dt_launch(world, fn, arg, &o);
}

static dt_status h_noop(dt_context *ctx, void *arg) {
    (void)ctx;
    (void)arg;
    return DT_SUCCESS;
}

int h_pair_available(int world, dt_backend_kind backend, dt_transport_kind transport, char *why,
                     size_t why_size) {
    dt_status st = h_launch_on(world, backend, transport, h_noop, NULL);
    if (st == DT_SUCCESS) return 1;
    if (why && why_size) snprintf(why, why_size, "%s: %s", dt_status_name(st), dt_last_error());
    return 0;
}

long h_compare(const char *what, const float *got, const double *ref, size_t n, double atol,
               double rtol, double *max_err) {
    long bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        int ok;
        if (!isfinite(r) || !isfinite(g)) {
            ok = (isnan(r) && isnan(g)) || (isinf(r) && isinf(g) && (r > 0) == (g > 0));
            if (!ok) worst = INFINITY;
        } else {
            double e = fabs(g - r);
            if (e > worst) worst = e;
            ok = e <= atol + rtol * fabs(r);
        }
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "  %s: [%zu] got %.9g, expected %.9g (atol %g, rtol %g)\n", what,
                        i, g, r, atol, rtol);
            bad++;
        }
    }
    if (bad > 0)
        fprintf(stderr, "  %s: %ld of %zu mismatches, max error %.3g\n", what, bad, n, worst);
    if (max_err) *max_err = worst;
    return bad;
}

void h_order_indices(dt_order order, int64_t n, int parts, int j, int64_t *out) {
    int64_t k = 0;
    if (order == DT_ORDER_CONTIGUOUS) {
        int64_t block = n / parts;
        for (int64_t g = j * block; g < (j + 1) * block; g++) out[k++] = g;
    } else if (order == DT_ORDER_STRIPED) {
        for (int64_t g = j; g < n; g += parts) out[k++] = g;
    } else {
        int64_t chunk = n / (2 * parts);
        int second = 2 * parts - 1 - j;
        for (int64_t g = j * chunk; g < (j + 1) * chunk; g++) out[k++] = g;
        for (int64_t g = second * chunk; g < (second + 1) * chunk; g++) out[k++] = g;
    }
}

void h_coords(int rank, int mesh_ndim, const int *mesh_sizes, int *coords) {
    for (int m = mesh_ndim - 1; m >= 0; m--) {
        coords[m] = rank % mesh_sizes[m];
        rank /= mesh_sizes[m];
    }
}

int64_t h_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* Per-dim index tables of the part at coords; returns local numel. */
static int64_t h_tables(int ndim, const int64_t *shape, const dt_layout *layout,
                        const int *mesh_sizes, const int *coords, int64_t **idx, int64_t *lshape) {
    for (int d = 0; d < ndim; d++) {
        lshape[d] = shape[d];
        idx[d] = NULL;
    }
    for (int m = 0; layout && m < layout->ndim; m++) {
        dt_placement p = layout->placements[m];
        if (p.kind != DT_SHARD) continue;
        lshape[p.dim] = shape[p.dim] / mesh_sizes[m];
        idx[p.dim] = malloc((size_t)(lshape[p.dim] + 1) * sizeof(int64_t));
        h_order_indices(p.order, shape[p.dim], mesh_sizes[m], coords[m], idx[p.dim]);
    }
    return h_numel(ndim, lshape);
}

static void h_local_generic(const void *full, size_t es, int ndim, const int64_t *shape,
                            const dt_layout *layout, const int *mesh_sizes, const int *coords,
                            void *out, int64_t *local_shape) {
    int64_t *idx[DT_MAX_DIMS];
    int64_t ls[DT_MAX_DIMS];
    int64_t n = h_tables(ndim, shape, layout, mesh_sizes, coords, idx, ls);
    int64_t x[DT_MAX_DIMS] = { 0 };
    for (int64_t i = 0; i < n; i++) {
        int64_t g = 0;
        for (int d = 0; d < ndim; d++) g = g * shape[d] + (idx[d] ? idx[d][x[d]] : x[d]);
        memcpy((char *)out + (size_t)i * es, (const char *)full + (size_t)g * es, es);
        for (int d = ndim - 1; d >= 0; d--) {
            if (++x[d] < ls[d]) break;
            x[d] = 0;
        }
    }
    for (int d = 0; d < ndim; d++) {
        free(idx[d]);
        if (local_shape) local_shape[d] = ls[d];
    }
}

void h_local_of(const float *full, int ndim, const int64_t *shape, const dt_layout *layout,
                const int *mesh_sizes, const int *coords, float *out, int64_t *local_shape) {
    h_local_generic(full, sizeof(float), ndim, shape, layout, mesh_sizes, coords, out, local_shape);
}

void h_local_of_u16(const uint16_t *full, int ndim, const int64_t *shape, const dt_layout *layout,
                    const int *mesh_sizes, const int *coords, uint16_t *out) {
    h_local_generic(full, sizeof(uint16_t), ndim, shape, layout, mesh_sizes, coords, out, NULL);
}

void h_local_of_f64(const double *full, int ndim, const int64_t *shape, const dt_layout *layout,
                    const int *mesh_sizes, const int *coords, double *out) {
    h_local_generic(full, sizeof(double), ndim, shape, layout, mesh_sizes, coords, out, NULL);
}

long h_compare_tol(const char *what, const float *got, const double *ref, const double *tol,
                   size_t n, double *max_err) {
    long bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        double e = fabs(g - r);
        int ok = isfinite(g) && isfinite(r) && e <= tol[i];
        if (!isfinite(g) || !isfinite(r)) e = INFINITY;
        if (e > worst) worst = e;
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "  %s: [%zu] got %.9g, expected %.9g, error %.3g > bound %.3g\n",
                        what, i, g, r, e, tol[i]);
            bad++;
        }
    }
    if (bad > 0)
        fprintf(stderr, "  %s: %ld of %zu mismatches, max error %.3g\n", what, bad, n, worst);
    if (max_err) *max_err = worst;
    return bad;
}

char *h_env_set(const char *name, const char *value) {
    const char *old = getenv(name);
    char *saved = old ? strdup(old) : NULL;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    return saved;
}

void h_env_restore(const char *name, char *saved) {
    if (saved) setenv(name, saved, 1);
    else unsetenv(name);
    free(saved);
}

int h_run_cases(const char *group, const struct CMUnitTest *tests, size_t n) {
    const char *filter = getenv("DT_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return _cmocka_run_group_tests(group, tests, n, NULL, NULL);
}

void h_layout_short(const dt_layout *l, char *buf, size_t size) {
    size_t pos = 0;
    buf[0] = '\0';
    for (int m = 0; m < l->ndim && pos < size; m++) {
        dt_placement p = l->placements[m];
        int w;
        const char *sep = m ? "," : "";
        if (p.kind == DT_REPLICATE)
            w = snprintf(buf + pos, size - pos, "%sR", sep);
        else if (p.kind == DT_PARTIAL)
            w = snprintf(buf + pos, size - pos, "%sP", sep);
        else
            w = snprintf(buf + pos, size - pos, "%sS(%d,%s)", sep, p.dim, dt_order_name(p.order));
        if (w < 0) return;
        pos += (size_t)w;
    }
}

/* Everything left in a stream, NUL-terminated (malloc'd), or NULL when out
 * of memory (what was read is then lost). */
static char *read_stream(FILE *f) {
    size_t cap = 1 << 16, len = 0, n;
    char *s = malloc(cap);
    while (s && (n = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 4096) {
            char *t = realloc(s, cap * 2);
            if (!t) {
                free(s);
                s = NULL;
                break;
            }
            s = t;
            cap *= 2;
        }
    }
    if (s) s[len] = '\0';
    return s;
}

const char *h_python_with(const char *modules) {
    const char *env = getenv("PYTHON");
    const char *const pythons[] = {env && *env ? env : "python3", "python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof pythons / sizeof pythons[0]; i++) {
        char probe[1024];
        snprintf(probe, sizeof probe, "'%s' -c 'import %s' >/dev/null 2>&1", pythons[i], modules);
        if (system(probe) == 0) return pythons[i];
    }
    return NULL;
}

int h_run_program(const char *program, const char *args, char **out) {
    char cmd[8192];
    const char *backend = getenv("DT_EXAMPLE_BACKEND");
    snprintf(cmd, sizeof cmd, "DT_BACKEND='%s' '%s' %s 2>&1", backend ? backend : "cpu", program,
             args);
    *out = NULL;
    FILE *p = popen(cmd, "r");
    if (!p) return -2;
    char *buf = read_stream(p);
    int status = pclose(p);
    if (!buf) return -2;
    *out = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

char *h_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = read_stream(f);
    fclose(f);
    return s;
}
