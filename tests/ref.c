/* tests/ref.c — see ref.h. */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

float h_stored(dt_dtype dtype, float v) {
    return dt_value_round(v, dtype);
}

double h_half_ulp(dt_dtype dtype) {
    return ldexp(1.0, dtype == DT_BF16 ? -8 : dtype == DT_F16 ? -11 : -24);
}

float h_weight_scale(int64_t fan_in) {
    return ldexpf(1.0f, -(int)lround(0.5 * log2((double)fan_in / 3.0)));
}

float h_input_value(dt_dtype dtype, uint64_t seed, int64_t i, float offset, float scale) {
    return h_stored(dtype, offset + scale * h_stored(dtype, dt_random_value(seed, (uint64_t)i)));
}

dt_status h_make_tensor(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                        const int64_t *shape, const dt_layout *l, uint64_t seed, float offset,
                        float scale, dt_tensor **out) {
    int64_t n = h_numel(ndim, shape);
    float *full = malloc((size_t)(n + 1) * sizeof *full), *loc = malloc((size_t)(n + 1) * sizeof *loc);
    void *h = malloc((size_t)(n + 1) * sizeof(float));   /* room for any dtype */
    dt_tensor *t = NULL;
    dt_status st = DT_ERR_OUT_OF_MEMORY;
    if (!full || !loc || !h) goto out;
    for (int64_t i = 0; i < n; i++) full[i] = h_input_value(dtype, seed, i, offset, scale);
    int coords[3] = {0, 0, 0};
    if (mesh) {
        h_coords(dt_context_rank(ctx), dt_mesh_ndim(mesh), dt_mesh_sizes(mesh), coords);
        h_local_of(full, ndim, shape, l, dt_mesh_sizes(mesh), coords, loc, NULL);
    } else {
        memcpy(loc, full, (size_t)n * sizeof *loc);
    }
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, dtype, ndim, shape, l, &t), out);
    for (int64_t i = 0; i < dt_tensor_local_numel(t); i++) dt_value_set(h, dtype, (size_t)i, loc[i]);
    st = dt_tensor_set_local(t, h, dt_tensor_local_bytes(t));
out:
    free(full);
    free(loc);
    free(h);
    if (st == DT_SUCCESS)
        *out = t;
    else
        dt_tensor_destroy(t);
    return st;
}

float *h_local_floats(const dt_tensor *t) {
    int64_t n = dt_tensor_local_numel(t);
    size_t b = dt_tensor_local_bytes(t);
    void *raw = malloc(b + 1);
    float *f = malloc((size_t)(n + 1) * sizeof *f);
    if (!raw || !f || dt_tensor_get_local(t, raw, b) != DT_SUCCESS) {
        free(raw);
        free(f);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) f[i] = dt_value_get(raw, dt_tensor_dtype(t), (size_t)i);
    free(raw);
    return f;
}

int h_partial_index(const dt_layout *l, const int *mesh, const int *coords) {
    int k = 0;
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_PARTIAL) k = k * mesh[m] + coords[m];
    return k;
}

int h_partial_count(const dt_layout *l, const int *mesh) {
    int k = 1;
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_PARTIAL) k *= mesh[m];
    return k;
}

double h_gelu_ref(double x, dt_gelu_approx approx) {
    if (approx == DT_GELU_ERF) return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    const double k = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}
