/* tests/test_tensor.c — meshes, tensors and the primitives (shard, gather,
 * redistribute, replicate, permute) on world sizes 1..8 and 2-D/3-D meshes,
 * fp32, bf16 and fp16; then Layouts that shard a tensor dim over two or three
 * mesh dims (every order combination on meshes 2x2, 2x3, 3x2, 2x4, 4x2 and
 * 2x2x2, with the other mesh dim Replicate, Partial or sharding another dim):
 * fill_random, global indices, set/get_global, shard, gather, replicate, and
 * redistribute from each to every Layout of its mesh (the one-dim ones
 * included) and back; and the ops that read positions or Layouts per dim
 * (rotary, with documents; matmul; reshape) against the same op on
 * Replicate data.
 *
 * Expected data never comes from the code under test: every rank builds the
 * global tensor from (seed, global index) with dt_random_value and cuts its
 * own part with test-local index maps (local_of below: tests/harness.c's
 * one-dim maps, composed over the mesh dims that shard a dim). Partial data is
 * a set of rank-dependent summands quantised to multiples of 1/16, so their
 * sums are exact in fp32, bf16 and fp16 and every check below is exact (pure data
 * movement is bit-exact; sums of such summands are too).
 *
 * Rank functions only record (mismatch counts, statuses); the main thread
 * asserts after the launch returns.
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

#include "dtensor/context.h"
#include "base/dtype.h"
#include "dtensor/mesh.h"
#include "dtensor/ops.h"
#include "dtensor/optim.h"
#include "dtensor/ops_nn.h"
#include "dtensor/primitives.h"
#include "dtensor/tensor.h"
#include "harness.h"
#include "ref.h"

#define MAXW H_MAX_RANKS
#define MAX_DST 64

/* ------------------------------------------------------------------ */
/* Test-local index maps                                               */
/* ------------------------------------------------------------------ */

/* The global indices the rank at coords holds along dim (length n) under
 * l, in local order, from the definitions: the first mesh dim that shards
 * the dim picks its list of the whole dim (h_order_indices), the next picks
 * positions within that list, and so on (outer mesh dim first). out holds
 * the local length; returns it. */
static int64_t dim_indices(const dt_layout *l, const int *mesh, const int *coords, int dim,
                           int64_t n, int64_t *out) {
    int64_t *pick = malloc((size_t)(n + 1) * sizeof *pick);
    int64_t len = n;
    for (int64_t g = 0; g < n; g++) out[g] = g;
    for (int m = 0; l && m < l->ndim; m++) {
        if (l->placements[m].kind != DT_SHARD || l->placements[m].dim != dim) continue;
        h_order_indices(l->placements[m].order, len, mesh[m], coords[m], pick);
        for (int64_t x = 0; x < len / mesh[m]; x++) pick[x] = out[pick[x]];
        len /= mesh[m];
        memcpy(out, pick, (size_t)len * sizeof *out);
    }
    free(pick);
    return len;
}

/* The part of `full` (global shape) the rank at coords holds under l, in
 * local row-major order (Partial dims: the whole values). */
static void local_of(const float *full, int ndim, const int64_t *shape, const dt_layout *l,
                     const int *mesh, const int *coords, float *out) {
    int64_t *idx[DT_MAX_DIMS], ls[DT_MAX_DIMS], n = 1;
    for (int d = 0; d < ndim; d++) {
        idx[d] = malloc((size_t)(shape[d] + 1) * sizeof(int64_t));
        ls[d] = dim_indices(l, mesh, coords, d, shape[d], idx[d]);
        n *= ls[d];
    }
    int64_t x[DT_MAX_DIMS] = { 0 };
    for (int64_t i = 0; i < n; i++) {
        int64_t g = 0;
        for (int d = 0; d < ndim; d++) g = g * shape[d] + idx[d][x[d]];
        out[i] = full[g];
        for (int d = ndim - 1; d >= 0; d--) {
            if (++x[d] < ls[d]) break;
            x[d] = 0;
        }
    }
    for (int d = 0; d < ndim; d++) free(idx[d]);
}

static const dt_dtype k_dtypes[3] = {DT_F32, DT_BF16, DT_F16};

/* ------------------------------------------------------------------ */
/* Data helpers                                                        */
/* ------------------------------------------------------------------ */

/* A summand in [-1, 1), a multiple of 1/16: sums of up to 16 are exact in bf16. */
static float summand(uint64_t seed, int64_t g, int pc) {
    float v = dt_random_value(seed * 131 + 7 + (uint64_t)pc, (uint64_t)g);
    return floorf(v * 16.0f) / 16.0f;
}

/* The global tensor of summand pc under a source Layout: plain values
 * (rounded to dtype) without Partial dims, quantised summands with. */
static void source_full(const dt_layout *src, const int *mesh, dt_dtype dtype, uint64_t seed,
                        int pc, int64_t numel, float *full) {
    (void)mesh;
    int partial = 0;
    for (int m = 0; m < src->ndim; m++)
        if (src->placements[m].kind == DT_PARTIAL) partial = 1;
    for (int64_t g = 0; g < numel; g++)
        full[g] = partial ? summand(seed, g, pc) : h_stored(dtype, dt_random_value(seed, (uint64_t)g));
}

/* The true global value under the source Layout (sum of its summands). */
static void reference_full(const dt_layout *src, const int *mesh, dt_dtype dtype, uint64_t seed,
                           int64_t numel, float *ref) {
    int np = h_partial_count(src, mesh);
    int partial = 0;
    for (int m = 0; m < src->ndim; m++)
        if (src->placements[m].kind == DT_PARTIAL) partial = 1;
    if (!partial) {
        source_full(src, mesh, dtype, seed, 0, numel, ref);
        return;
    }
    for (int64_t g = 0; g < numel; g++) {
        double s = 0;
        for (int pc = 0; pc < np; pc++) s += summand(seed, g, pc);
        ref[g] = (float)s;
    }
}

static void to_dtype(dt_dtype dtype, const float *src, int64_t n, void *dst) {
    for (int64_t i = 0; i < n; i++) dt_value_set(dst, dtype, (size_t)i, src[i]);
}

/* Mismatches between t's local data and the part of `full` it should hold
 * at `coords` under its Layout (Partial dims: the whole `full`). Exact. */
static long check_local_part(const char *what, const dt_tensor *t, const float *full,
                             const int *mesh, const int *coords) {
    int64_t n = dt_tensor_local_numel(t);
    float *exp = malloc((size_t)(n + 1) * sizeof *exp);
    double *ref = malloc((size_t)(n + 1) * sizeof *ref);
    float *got = h_local_floats(t);
    if (exp == NULL || ref == NULL || got == NULL) {
        free(exp);
        free(ref);
        free(got);
        return -1;
    }
    local_of(full, dt_tensor_ndim(t), dt_tensor_shape(t), dt_tensor_layout(t), mesh, coords, exp);
    for (int64_t i = 0; i < n; i++) ref[i] = exp[i];
    long bad = h_compare(what, got, ref, (size_t)n, 0.0, 0.0, NULL);
    free(exp);
    free(ref);
    free(got);
    return bad;
}

/* Creates t on mesh under `src` holding this rank's summand of the data
 * described by (src, dtype, seed). */
static dt_status make_source(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                             const int64_t *shape, const dt_layout *src, uint64_t seed,
                             dt_tensor **out) {
    const int *ms = dt_mesh_sizes(mesh);
    int coords[3];
    h_coords(dt_context_rank(ctx), dt_mesh_ndim(mesh), ms, coords);
    int64_t numel = h_numel(ndim, shape);
    float *full = malloc((size_t)(numel + 1) * sizeof *full);
    float *loc = malloc((size_t)(numel + 1) * sizeof *loc);
    void *raw = malloc((size_t)(numel + 1) * sizeof(float));
    dt_tensor *t = NULL;
    dt_status st = DT_ERR_OUT_OF_MEMORY;
    if (full == NULL || loc == NULL || raw == NULL) goto out;
    source_full(src, ms, dtype, seed, h_partial_index(src, ms, coords), numel, full);
    local_of(full, ndim, shape, src, ms, coords, loc);
    st = dt_tensor_create(ctx, mesh, dtype, ndim, shape, src, &t);
    if (st != DT_SUCCESS) goto out;
    to_dtype(dtype, loc, dt_tensor_local_numel(t), raw);
    st = dt_tensor_set_local(t, raw, dt_tensor_local_bytes(t));
out:
    free(full);
    free(loc);
    free(raw);
    if (st == DT_SUCCESS)
        *out = t;
    else
        dt_tensor_destroy(t);
    return st;
}

/* Local bytes of t compared with a saved copy: 0 if unchanged. */
static long changed_since(const dt_tensor *t, const void *saved) {
    size_t b = dt_tensor_local_bytes(t);
    void *now = malloc(b + 1);
    if (now == NULL || dt_tensor_get_local(t, now, b) != DT_SUCCESS) {
        free(now);
        return -1;
    }
    long diff = memcmp(now, saved, b) != 0;
    free(now);
    return diff;
}

static void *save_local(const dt_tensor *t) {
    size_t b = dt_tensor_local_bytes(t);
    void *p = malloc(b + 1);
    if (p && dt_tensor_get_local(t, p, b) != DT_SUCCESS) {
        free(p);
        return NULL;
    }
    return p;
}

static const char *mesh_name(int nd, const int *m, char *buf, size_t size) {
    if (nd == 1) snprintf(buf, size, "%d", m[0]);
    else if (nd == 2) snprintf(buf, size, "%dx%d", m[0], m[1]);
    else snprintf(buf, size, "%dx%dx%d", m[0], m[1], m[2]);
    return buf;
}

/* ------------------------------------------------------------------ */
/* Meshes                                                              */
/* ------------------------------------------------------------------ */

typedef struct mesh_case {
    int ndim, sizes[3], world;
    int coords[MAXW][3], comm_rank[MAXW][3], comm_size[MAXW][3], rank_at[MAXW];
    float group_sum[MAXW][3];
    char name0[MAXW][32];
} mesh_case;

static dt_status rank_mesh(dt_context *ctx, void *arg) {
    mesh_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    const char *names[3] = { "tp", NULL, "pp" };
    DT_TRY(dt_mesh_create(ctx, c->ndim, c->sizes, names, &mesh));
    dt_status st = DT_SUCCESS;
    for (int m = 0; m < c->ndim; m++) {
        c->coords[r][m] = dt_mesh_coord(mesh, m);
        c->comm_rank[r][m] = dt_comm_rank(dt_mesh_comm(mesh, m));
        c->comm_size[r][m] = dt_comm_size(dt_mesh_comm(mesh, m));
        float x = (float)r;
        /* the group of mesh dim m: the world ranks that differ only in m */
        DT_TRY_GOTO(st, dt_comm_all_reduce(dt_mesh_comm(mesh, m), &x, &c->group_sum[r][m], 1,
                                           DT_F32, DT_REDUCE_SUM), out);
    }
    c->rank_at[r] = dt_mesh_rank_at(mesh, c->coords[r]);
    snprintf(c->name0[r], sizeof c->name0[r], "%s/%s", dt_mesh_dim_name(mesh, 0),
             c->ndim > 1 ? dt_mesh_dim_name(mesh, 1) : "-");
out:
    dt_mesh_destroy(mesh);
    return st;
}

static void test_mesh(void **state) {
    mesh_case *c = *state;
    assert_int_equal(h_launch(c->world, rank_mesh, c), DT_SUCCESS);
    for (int r = 0; r < c->world; r++) {
        int exp[3];
        h_coords(r, c->ndim, c->sizes, exp);
        for (int m = 0; m < c->ndim; m++) {
            assert_int_equal(c->coords[r][m], exp[m]);
            assert_int_equal(c->comm_rank[r][m], exp[m]);
            assert_int_equal(c->comm_size[r][m], c->sizes[m]);
            /* sum of world ranks over the ranks sharing every other coordinate */
            double s = 0;
            for (int q = 0; q < c->world; q++) {
                int qc[3], same = 1;
                h_coords(q, c->ndim, c->sizes, qc);
                for (int k = 0; k < c->ndim; k++)
                    if (k != m && qc[k] != exp[k]) same = 0;
                if (same) s += q;
            }
            assert_float_equal(c->group_sum[r][m], s, 0);
        }
        assert_int_equal(c->rank_at[r], r);
        assert_string_equal(c->name0[r], c->ndim > 1 ? "tp/d1" : "tp/-");
    }
}

typedef struct mesh_err_case {
    dt_status st[16][MAXW];
    char msg[MAXW][256];
    int null_out[MAXW];
} mesh_err_case;

static dt_status rank_mesh_errors(dt_context *ctx, void *arg) {
    mesh_err_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    int k = 0;
    int s23[] = { 2, 3 }, s0[] = { 0, 4 }, s4[] = { 4, 1, 1, 1 };
    c->st[k++][r] = dt_mesh_create(ctx, 2, s23, NULL, &mesh);
    snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    c->st[k++][r] = dt_mesh_create(ctx, 0, s4, NULL, &mesh);
    c->st[k++][r] = dt_mesh_create(ctx, 4, s4, NULL, &mesh);
    c->st[k++][r] = dt_mesh_create(ctx, 2, s0, NULL, &mesh);
    c->st[k++][r] = dt_mesh_create(ctx, 1, NULL, NULL, &mesh);
    c->st[k++][r] = dt_mesh_create(ctx, 1, s4, NULL, NULL);
    c->st[k++][r] = dt_context_last_status(ctx);
    c->null_out[r] = mesh == NULL;
    return DT_SUCCESS;
}

static void test_mesh_errors(void **state) {
    (void)state;
    mesh_err_case c;
    memset(&c, 0, sizeof c);
    assert_int_equal(h_launch(4, rank_mesh_errors, &c), DT_SUCCESS);
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < 7; k++) assert_int_equal(c.st[k][r], DT_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(c.msg[r], "2 x 3 has 6 ranks but the world size is 4"));
        assert_true(c.null_out[r]);
    }
    dt_mesh *mesh = NULL;
    int s1[] = { 1 };
    assert_int_equal(dt_mesh_create(NULL, 1, s1, NULL, &mesh), DT_ERR_INVALID_ARGUMENT);
    assert_null(mesh);
    /* accessors tolerate NULL and out-of-range dims */
    assert_int_equal(dt_mesh_ndim(NULL), 0);
    assert_int_equal(dt_mesh_coord(NULL, 0), -1);
    assert_null(dt_mesh_comm(NULL, 0));
    dt_mesh_destroy(NULL);
}

/* ------------------------------------------------------------------ */
/* Tensors: create, accessors, set/get, fill_random                    */
/* ------------------------------------------------------------------ */

typedef struct basics_case {
    dt_status st[24];
    long bad[8];
    int64_t local_shape[2];
    size_t bytes;
} basics_case;

static dt_status rank_basics_record(dt_context *ctx, basics_case *c);

/* Both ranks run the same calls (mesh creation is collective); rank 0's
 * results are kept, so no two threads write the same record. */
static dt_status rank_basics(dt_context *ctx, void *arg) {
    basics_case mine;
    memset(&mine, 0, sizeof mine);
    dt_status st = rank_basics_record(ctx, &mine);
    if (dt_context_rank(ctx) == 0) *(basics_case *)arg = mine;
    return st;
}

static dt_status rank_basics_record(dt_context *ctx, basics_case *c) {
    int k = 0, b = 0;
    int64_t shape[] = { 6, 8 };
    dt_tensor *t = NULL, *u = NULL;
    dt_mesh *mesh = NULL;
    int ms[] = { 2 };
    /* local tensor: accessors, set/get round trip */
    c->st[k++] = dt_tensor_create(ctx, NULL, DT_F32, 2, shape, NULL, &t);
    if (t == NULL) return DT_ERR_INTERNAL;
    float in[48], outb[48];
    for (int i = 0; i < 48; i++) in[i] = (float)i * 0.5f - 3.0f;
    c->st[k++] = dt_tensor_set_local(t, in, sizeof in);
    c->st[k++] = dt_tensor_get_local(t, outb, sizeof outb);
    c->bad[b++] = memcmp(in, outb, sizeof in) != 0;
    c->st[k++] = dt_tensor_set_local(t, in, sizeof in - 4);     /* wrong size */
    c->st[k++] = dt_tensor_get_local(t, outb, sizeof outb + 4); /* wrong size */
    c->st[k++] = dt_tensor_set_local(t, NULL, sizeof in);
    c->bad[b++] = dt_tensor_mesh(t) != NULL || dt_tensor_layout(t)->ndim != 0 ||
                  dt_tensor_ndim(t) != 2 || dt_tensor_local_numel(t) != 48 ||
                  dt_tensor_local_bytes(t) != 192 || dt_tensor_context(t) != ctx ||
                  dt_tensor_dtype(t) != DT_F32;
    /* fill_random on a local tensor: element i = dt_random_value(seed, i) */
    c->st[k++] = dt_tensor_fill_random(t, 99);
    c->st[k++] = dt_tensor_get_local(t, outb, sizeof outb);
    long bad = 0;
    for (int i = 0; i < 48; i++) bad += outb[i] != dt_random_value(99, (uint64_t)i);
    c->bad[b++] = bad;
    dt_tensor_destroy(t);
    t = NULL;

    /* creation errors */
    int64_t odd[] = { 5, 8 }, neg[] = { 4, -2 };
    dt_layout l1 = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    dt_layout l2 = dt_layout_2d(dt_replicate(), dt_replicate());
    c->st[k++] = dt_mesh_create(ctx, 1, ms, NULL, &mesh);
    if (mesh == NULL) return DT_ERR_INTERNAL;
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 2, odd, &l1, &u);  /* 5 % 2 */
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 2, shape, NULL, &u);
    c->st[k++] = dt_tensor_create(ctx, NULL, DT_F32, 2, shape, &l1, &u);
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 2, shape, &l2, &u); /* 2 mesh dims */
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 0, shape, &l1, &u);
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, DT_MAX_DIMS + 1, shape, &l1, &u);
    c->st[k++] = dt_tensor_create(ctx, mesh, (dt_dtype)17, 2, shape, &l1, &u);
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 2, neg, &l1, &u);
    c->st[k++] = dt_tensor_create(NULL, mesh, DT_F32, 2, shape, &l1, &u);
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 2, shape, &l1, NULL);
    c->bad[b++] = u != NULL;
    /* a sharded tensor */
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_BF16, 2, shape, &l1, &u);
    if (u == NULL) return DT_ERR_INTERNAL;
    c->local_shape[0] = dt_tensor_local_shape(u)[0];
    c->local_shape[1] = dt_tensor_local_shape(u)[1];
    c->bytes = dt_tensor_local_bytes(u);
    dt_tensor_destroy(u);
    /* a zero-length tensor is valid */
    int64_t empty[] = { 0, 8 };
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 2, empty, &l1, &u);
    c->bad[b++] = u == NULL || dt_tensor_local_numel(u) != 0 || dt_tensor_data(u) == NULL;
    if (u) c->st[k++] = dt_tensor_fill_random(u, 5);
    dt_tensor_destroy(u);
    /* ... and moves: an empty Partial summed into Replicate */
    dt_layout lp = dt_layout_1d(dt_partial()), lr = dt_layout_1d(dt_replicate());
    dt_tensor *v = NULL;
    u = NULL;
    c->st[k++] = dt_tensor_create(ctx, mesh, DT_F32, 2, empty, &lp, &u);
    if (u) c->st[k++] = dt_tensor_redistribute(u, &lr, &v);
    c->bad[b++] = v == NULL || dt_tensor_local_numel(v) != 0 || dt_tensor_shape(v)[1] != 8;
    dt_tensor_destroy(v);
    dt_tensor_destroy(u);
    dt_tensor_destroy(NULL);
    dt_mesh_destroy(mesh);
    return DT_SUCCESS;
}

static void test_tensor_basics(void **state) {
    (void)state;
    basics_case c;
    memset(&c, 0, sizeof c);
    assert_int_equal(h_launch(2, rank_basics, &c), DT_SUCCESS);
    const dt_status expect[] = {
        DT_SUCCESS, DT_SUCCESS, DT_SUCCESS, DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_INVALID_ARGUMENT, DT_SUCCESS, DT_SUCCESS, DT_SUCCESS,
        DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT, DT_ERR_INVALID_ARGUMENT,
        DT_ERR_INVALID_ARGUMENT, DT_SUCCESS, DT_SUCCESS, DT_SUCCESS, DT_SUCCESS, DT_SUCCESS,
    };
    for (size_t k = 0; k < sizeof expect / sizeof expect[0]; k++) {
        if (c.st[k] != expect[k]) fprintf(stderr, "  step %zu: %s\n", k, dt_status_name(c.st[k]));
        assert_int_equal(c.st[k], expect[k]);
    }
    for (int b = 0; b < 6; b++) assert_int_equal(c.bad[b], 0);
    assert_int_equal(c.local_shape[0], 3);
    assert_int_equal(c.local_shape[1], 8);
    assert_int_equal(c.bytes, 3 * 8 * 2);
}

/* ------------------------------------------------------------------ */
/* Views: ops that return their input's data as it is share its buffer  */
/* ------------------------------------------------------------------ */

/* On a 2 x 1 mesh (the second mesh dim of one rank), each rank checks that
 * reshape, a redistribution to the same Layout or over the mesh dim of one
 * rank, and add_backward's new gradients share their input's buffer (same
 * pointer, no memory taken, no call on that mesh dim's communicator), and
 * that writing either tensor (set_local, fill_random, dt_tensor_data,
 * gradients added into, dt_adamw_step) leaves the other's values as they
 * were, whichever is destroyed first. Values are compared with host copies
 * taken before; a failure names its check. */
enum { V_CHECKS = 16 };
typedef struct views_case {
    long bad[MAXW][V_CHECKS];
    dt_status st[MAXW];
} views_case;

static const char *const view_check_names[V_CHECKS] = {
    "reshape shares the buffer",        "reshape takes no memory",
    "set_local on the view: the original keeps its values",
    "set_local on the view: the view has the new values and memory of its own",
    "the view outlives the original",   "same Layout: shared",
    "Partial -> Replicate on a mesh dim of one rank: shared, no call",
    "its values",                       "dt_tensor_data: a pointer of its own",
    "dt_tensor_data: the original keeps its values",
    "add_backward: new gradients share dy",
    "added into: dy and the other gradient keep their values",
    "added into: da = 2 dy",            "adamw: the view of the param keeps its values",
    "adamw: the param moved",           "fill_random on a view: the original keeps its values",
};

static long view_diff(const dt_tensor *t, const float *want, size_t n) {
    float got[64];
    if (n > 64 || dt_tensor_get_local(t, got, n * sizeof *got) != DT_SUCCESS) return 1;
    long bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != want[i];
    return bad;
}

static size_t view_in_use(dt_context *ctx) {
    dt_memory_stats m;
    return dt_context_memory(ctx, &m) == DT_SUCCESS ? m.in_use : 0;
}

static dt_status rank_views(dt_context *ctx, void *arg) {
    views_case *c = arg;
    long *bad = c->bad[dt_context_rank(ctx)];
    const int sizes[2] = {2, 1};
    dt_mesh *mesh = NULL;
    DT_TRY(dt_mesh_create(ctx, 2, sizes, NULL, &mesh));
    const int64_t s2[2] = {4, 6}, s3[3] = {4, 2, 3}, s1[1] = {24};
    const dt_layout sr = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate()),
                    sp = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_partial());
    enum { N = 12 };   /* local elements: 2 rows of 6 */
    float A[N], ones[N], D[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    dt_tensor *a = NULL, *r = NULL, *b = NULL, *p = NULL, *q = NULL, *dy = NULL, *da = NULL,
              *db = NULL, *m = NULL, *v = NULL;
    dt_status st = dt_tensor_create(ctx, mesh, DT_F32, 2, s2, &sr, &a);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(a, 3);
    if (st == DT_SUCCESS) st = dt_tensor_get_local(a, A, sizeof A);
    /* reshape */
    const size_t mem0 = view_in_use(ctx);
    if (st == DT_SUCCESS) st = dt_tensor_reshape(a, 3, s3, &r);
    if (st != DT_SUCCESS) goto out;
    bad[0] = dt_tensor_data_const(r) != dt_tensor_data_const(a);
    bad[1] = view_in_use(ctx) != mem0;
    if ((st = dt_tensor_set_local(r, ones, sizeof ones)) != DT_SUCCESS) goto out;
    bad[2] = view_diff(a, A, N);
    bad[3] = view_diff(r, ones, N) + (view_in_use(ctx) <= mem0) +
             (dt_tensor_data_const(r) == dt_tensor_data_const(a));
    dt_tensor_destroy(r);
    if ((st = dt_tensor_reshape(a, 3, s3, &r)) != DT_SUCCESS) goto out;
    dt_tensor_destroy(a);
    a = NULL;
    bad[4] = view_diff(r, A, N);
    /* redistributions that move nothing */
    if ((st = dt_tensor_redistribute(r, dt_tensor_layout(r), &b)) != DT_SUCCESS) goto out;
    bad[5] = dt_tensor_data_const(b) != dt_tensor_data_const(r) || view_diff(b, A, N);
    if ((st = dt_tensor_create(ctx, mesh, DT_F32, 2, s2, &sp, &p)) != DT_SUCCESS) goto out;
    if ((st = dt_tensor_set_local(p, A, sizeof A)) != DT_SUCCESS) goto out;
    dt_comm *c1 = dt_mesh_comm(mesh, 1);
    dt_comm_counters cnt;
    dt_comm_counters_reset(c1);
    if ((st = dt_tensor_redistribute(p, &sr, &q)) != DT_SUCCESS) goto out;
    if ((st = dt_comm_counters_get(c1, &cnt)) != DT_SUCCESS) goto out;
    long calls = 0;
    for (int k = 0; k < DT_COMM_KIND_COUNT; k++) calls += (long)cnt.calls[k];
    bad[6] = dt_tensor_data_const(q) != dt_tensor_data_const(p) || calls != 0 ||
             !dt_layout_equal(dt_tensor_layout(q), &sr);
    bad[7] = view_diff(q, A, N);
    /* dt_tensor_data on a shared buffer */
    float *w = dt_tensor_data(q);
    bad[8] = w == NULL || w == dt_tensor_data_const(p);
    if (w) w[0] = 42.0f;
    bad[9] = view_diff(p, A, N);
    /* gradients: new ones share dy; one added into leaves the rest */
    if ((st = dt_tensor_create(ctx, mesh, DT_F32, 2, s2, &sr, &dy)) != DT_SUCCESS) goto out;
    if ((st = dt_tensor_fill_random(dy, 4)) != DT_SUCCESS) goto out;
    if ((st = dt_tensor_get_local(dy, D, sizeof D)) != DT_SUCCESS) goto out;
    if ((st = dt_add_backward(q, q, dy, &da, &db)) != DT_SUCCESS) goto out;
    bad[10] = dt_tensor_data_const(da) != dt_tensor_data_const(dy) ||
              dt_tensor_data_const(db) != dt_tensor_data_const(dy);
    if ((st = dt_add_backward(q, q, dy, &da, NULL)) != DT_SUCCESS) goto out;
    bad[11] = view_diff(dy, D, N) + view_diff(db, D, N);
    float D2[N];
    for (int i = 0; i < N; i++) D2[i] = 2.0f * D[i];
    bad[12] = view_diff(da, D2, N);
    /* the optimizer writes the param; a view of it stays */
    dt_tensor *pv = NULL;
    if ((st = dt_tensor_reshape(dy, 1, s1, &pv)) != DT_SUCCESS) goto out;
    st = dt_tensor_create(ctx, mesh, DT_F32, 2, s2, &sr, &m);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 2, s2, &sr, &v);
    if (st == DT_SUCCESS) st = dt_adamw_step(dy, NULL, m, v, db, 1.0f, NULL, 1);
    if (st == DT_SUCCESS) {
        bad[13] = view_diff(pv, D, N);
        bad[14] = view_diff(dy, D, N) == 0;
    }
    dt_tensor_destroy(pv);
    if (st != DT_SUCCESS) goto out;
    /* fill_random on a view */
    dt_tensor_destroy(r);
    if ((st = dt_tensor_reshape(db, 3, s3, &r)) != DT_SUCCESS) goto out;
    if ((st = dt_tensor_fill_random(r, 9)) != DT_SUCCESS) goto out;
    bad[15] = view_diff(db, D, N);
out:
    dt_tensor_destroy(a), dt_tensor_destroy(r), dt_tensor_destroy(b), dt_tensor_destroy(p);
    dt_tensor_destroy(q), dt_tensor_destroy(dy), dt_tensor_destroy(da), dt_tensor_destroy(db);
    dt_tensor_destroy(m), dt_tensor_destroy(v);
    dt_mesh_destroy(mesh);
    c->st[dt_context_rank(ctx)] = st;
    return st;
}

static void test_views(void **state) {
    (void)state;
    views_case c;
    memset(&c, 0, sizeof c);
    const dt_status st = h_launch(2, rank_views, &c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < V_CHECKS; k++) {
            if (c.bad[r][k]) print_error("rank %d: %s: %ld wrong\n", r, view_check_names[k],
                                         c.bad[r][k]);
            assert_int_equal(c.bad[r][k], 0);
        }
}

/* ------------------------------------------------------------------ */
/* dt_tensor_redistribute_n: many redistributions, all-reduces bucketed  */
/* ------------------------------------------------------------------ */

/* On a 2 x 2 mesh, seven tensors: sums over both mesh dims (two fp32, one
 * bf16: two buckets), over one of them (two more buckets), one that is no
 * sum (Shard -> Replicate: alone) and one already in its Layout (a view).
 * Each output must equal dt_tensor_redistribute's of the same tensor bit
 * for bit (local summands are multiples of 1/16: every sum is exact); each
 * mesh dim's communicator makes one all-reduce per bucket (3 each) and the
 * Shard -> Replicate its all-gather; a call with a bad Layout writes no
 * output. */
enum { RN_T = 7 };
typedef struct rn_case {
    long bad[MAXW][RN_T + 3];
} rn_case;

static dt_status rank_redistribute_n(dt_context *ctx, void *arg) {
    rn_case *c = arg;
    const int r = dt_context_rank(ctx);
    long *bad = c->bad[r];
    const int sizes[2] = {2, 2};
    dt_mesh *mesh = NULL;
    DT_TRY(dt_mesh_create(ctx, 2, sizes, NULL, &mesh));
    const dt_placement P = dt_partial(), R = dt_replicate(), S0 = dt_shard(0, DT_ORDER_CONTIGUOUS);
    const struct {
        int64_t s0, s1;
        dt_dtype dt;
        dt_layout from, to;
    } cs[RN_T] = {
        {6, 4, DT_F32, dt_layout_2d(P, P), dt_layout_2d(R, R)},
        {4, 6, DT_F32, dt_layout_2d(P, S0), dt_layout_2d(R, S0)},
        {8, 3, DT_BF16, dt_layout_2d(P, P), dt_layout_2d(R, R)},
        {4, 4, DT_F32, dt_layout_2d(S0, R), dt_layout_2d(R, R)},
        {3, 5, DT_F32, dt_layout_2d(R, R), dt_layout_2d(R, R)},
        {7, 2, DT_F32, dt_layout_2d(P, P), dt_layout_2d(R, R)},
        {2, 9, DT_F32, dt_layout_2d(R, P), dt_layout_2d(R, R)},
    };
    dt_tensor *t[RN_T] = {0}, *got[RN_T] = {0}, *want[RN_T] = {0};
    dt_layout to[RN_T];
    dt_status st = DT_SUCCESS;
    for (int i = 0; i < RN_T && st == DT_SUCCESS; i++) {
        const int64_t shape[2] = {cs[i].s0, cs[i].s1};
        to[i] = cs[i].to;
        st = dt_tensor_create(ctx, mesh, cs[i].dt, 2, shape, &cs[i].from, &t[i]);
        float h[64];
        const int64_t n = dt_tensor_local_numel(t[i]);
        for (int64_t k = 0; k < n; k++)
            h[k] = (float)((int)(dt_random_value(100 + (uint64_t)i, (uint64_t)(r * 64 + k)) * 64.0f)) /
                   16.0f;
        if (st == DT_SUCCESS && cs[i].dt == DT_F32) st = dt_tensor_set_local(t[i], h, (size_t)n * 4);
        if (st == DT_SUCCESS && cs[i].dt == DT_BF16) {
            uint16_t b[64];
            for (int64_t k = 0; k < n; k++) {
                uint32_t u;
                memcpy(&u, &h[k], 4);
                b[k] = (uint16_t)(u >> 16);   /* k/16 with |k| < 64: exact in bf16 */
            }
            st = dt_tensor_set_local(t[i], b, (size_t)n * 2);
        }
    }
    for (int i = 0; i < RN_T && st == DT_SUCCESS; i++)
        st = dt_tensor_redistribute(t[i], &to[i], &want[i]);
    dt_comm_counters k0, k1;
    dt_comm_counters_reset(dt_mesh_comm(mesh, 0));
    dt_comm_counters_reset(dt_mesh_comm(mesh, 1));
    if (st == DT_SUCCESS) st = dt_tensor_redistribute_n((const dt_tensor *const *)t, to, RN_T, got);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(dt_mesh_comm(mesh, 0), &k0);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(dt_mesh_comm(mesh, 1), &k1);
    for (int i = 0; i < RN_T && st == DT_SUCCESS; i++) {
        char a[256], b[256];
        const size_t bytes = dt_tensor_local_bytes(want[i]);
        bad[i] = got[i] == NULL || dt_tensor_local_bytes(got[i]) != bytes ||
                 !dt_layout_equal(dt_tensor_layout(got[i]), &to[i]);
        if (!bad[i] && dt_tensor_get_local(got[i], a, bytes) == DT_SUCCESS &&
            dt_tensor_get_local(want[i], b, bytes) == DT_SUCCESS)
            bad[i] = memcmp(a, b, bytes) != 0;
    }
    if (st == DT_SUCCESS) {
        bad[RN_T] = k0.calls[DT_COMM_ALL_REDUCE] != 3 || k1.calls[DT_COMM_ALL_REDUCE] != 3 ||
                    k0.calls[DT_COMM_ALL_GATHER] != 1 || k1.calls[DT_COMM_ALL_GATHER] != 0;
        bad[RN_T + 1] = dt_tensor_data_const(got[4]) != dt_tensor_data_const(t[4]);
        /* a bad target Layout (Shard(2) of a 2-dim tensor): nothing written */
        dt_tensor *none[RN_T];
        for (int i = 0; i < RN_T; i++) none[i] = (dt_tensor *)&none;
        dt_layout worse[RN_T];
        memcpy(worse, to, sizeof worse);
        worse[5] = dt_layout_2d(dt_shard(2, DT_ORDER_CONTIGUOUS), R);
        const dt_status e = dt_tensor_redistribute_n((const dt_tensor *const *)t, worse, RN_T, none);
        bad[RN_T + 2] = e == DT_SUCCESS;
        for (int i = 0; i < RN_T; i++) bad[RN_T + 2] += none[i] != (dt_tensor *)&none;
    }
    for (int i = 0; i < RN_T; i++)
        dt_tensor_destroy(t[i]), dt_tensor_destroy(got[i]), dt_tensor_destroy(want[i]);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_redistribute_n(void **state) {
    (void)state;
    rn_case c;
    memset(&c, 0, sizeof c);
    const dt_status st = h_launch(4, rank_redistribute_n, &c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    static const char *const what[3] = {"all-reduces 3 a mesh dim, the all-gather 1",
                                        "the tensor in its Layout is a view",
                                        "a bad Layout writes no output"};
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < RN_T + 3; k++) {
            if (c.bad[r][k])
                print_error("rank %d: %s%d\n", r, k < RN_T ? "output differs from "
                            "dt_tensor_redistribute's: tensor " : what[k - RN_T],
                            k < RN_T ? k : 0);
            assert_int_equal(c.bad[r][k], 0);
        }
}

/* Buckets hold at most 32 MiB: three Partial fp32 tensors of 12 MiB each on
 * two ranks are summed in two all-reduces (24 MiB, then 12), with the
 * outputs of one by one dt_tensor_redistribute calls. */
enum { RNB_T = 3, RNB_N = 3 << 20 };
static dt_status rank_redistribute_n_buckets(dt_context *ctx, void *arg) {
    long *bad = (long *)arg + dt_context_rank(ctx);
    const int size = 2;
    dt_mesh *mesh = NULL;
    DT_TRY(dt_mesh_create(ctx, 1, &size, NULL, &mesh));
    const dt_layout from = dt_layout_1d(dt_partial()), to[RNB_T] = {
        dt_layout_1d(dt_replicate()), dt_layout_1d(dt_replicate()), dt_layout_1d(dt_replicate())};
    const int64_t shape[1] = {RNB_N};
    dt_tensor *t[RNB_T] = {0}, *got[RNB_T] = {0}, *want[RNB_T] = {0};
    float *a = malloc((size_t)RNB_N * sizeof *a), *b = malloc((size_t)RNB_N * sizeof *b);
    dt_status st = a && b ? DT_SUCCESS : DT_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < RNB_T && st == DT_SUCCESS; i++) {
        for (int64_t k = 0; k < RNB_N; k++) a[k] = (float)((k * (i + 3) + dt_context_rank(ctx)) % 64) / 16.0f;
        st = dt_tensor_create(ctx, mesh, DT_F32, 1, shape, &from, &t[i]);
        if (st == DT_SUCCESS) st = dt_tensor_set_local(t[i], a, (size_t)RNB_N * sizeof *a);
        if (st == DT_SUCCESS) st = dt_tensor_redistribute(t[i], &to[i], &want[i]);
    }
    dt_comm_counters k;
    dt_comm_counters_reset(dt_mesh_comm(mesh, 0));
    if (st == DT_SUCCESS) st = dt_tensor_redistribute_n((const dt_tensor *const *)t, to, RNB_T, got);
    if (st == DT_SUCCESS) st = dt_comm_counters_get(dt_mesh_comm(mesh, 0), &k);
    if (st == DT_SUCCESS) *bad = k.calls[DT_COMM_ALL_REDUCE] != 2;
    for (int i = 0; i < RNB_T && st == DT_SUCCESS; i++) {
        st = dt_tensor_get_local(got[i], a, (size_t)RNB_N * sizeof *a);
        if (st == DT_SUCCESS) st = dt_tensor_get_local(want[i], b, (size_t)RNB_N * sizeof *b);
        if (st == DT_SUCCESS) *bad += memcmp(a, b, (size_t)RNB_N * sizeof *a) != 0;
    }
    for (int i = 0; i < RNB_T; i++)
        dt_tensor_destroy(t[i]), dt_tensor_destroy(got[i]), dt_tensor_destroy(want[i]);
    free(a), free(b);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_redistribute_n_buckets(void **state) {
    (void)state;
    if (getenv("DT_TEST_QUICK")) {
        print_message("skipped: about 300 MiB of buffers (DT_TEST_QUICK: valgrind, ThreadSanitizer)\n");
        skip();
    }
    long bad[2] = {0, 0};
    const dt_status st = h_launch(2, rank_redistribute_n_buckets, bad);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    assert_int_equal(bad[0], 0);
    assert_int_equal(bad[1], 0);
}

static void test_random_value(void **state) {
    (void)state;
    double sum = 0, lo = 1, hi = -1;
    long repeats = 0;
    for (uint64_t i = 0; i < 100000; i++) {
        float v = dt_random_value(7, i);
        assert_true(v >= -1.0f && v < 1.0f);
        sum += v;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
        if (i > 0 && v == dt_random_value(7, i - 1)) repeats++;
    }
    assert_true(fabs(sum / 100000) < 0.02); /* roughly centred */
    assert_true(lo < -0.99 && hi > 0.99);
    assert_true(repeats < 10);
    assert_true(dt_random_value(7, 3) == dt_random_value(7, 3));
    assert_true(dt_random_value(7, 3) != dt_random_value(8, 3));
}

typedef struct fill_case {
    int ndim_mesh, mesh[3], world;
    int64_t shape[3];   /* 0: [4 W, 3, 2 W] */
    dt_layout layout;
    dt_dtype dtype;
    long bad[MAXW];
} fill_case;

static dt_status rank_fill(dt_context *ctx, void *arg) {
    fill_case *c = arg;
    int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *t = NULL;
    int64_t shape[] = { 4 * c->world, 3, 2 * c->world };
    if (c->shape[0]) memcpy(shape, c->shape, sizeof shape);
    int64_t numel = h_numel(3, shape);
    float *full = malloc((size_t)numel * sizeof *full);
    dt_status st = DT_SUCCESS;
    if (full == NULL) return DT_ERR_OUT_OF_MEMORY;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, c->ndim_mesh, c->mesh, NULL, &mesh), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 3, shape, &c->layout, &t), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(t, 1234), out);
    int coords[3];
    h_coords(r, c->ndim_mesh, c->mesh, coords);
    int zero = 0;
    for (int m = 0; m < c->ndim_mesh; m++)
        if (c->layout.placements[m].kind == DT_PARTIAL && coords[m] != 0) zero = 1;
    for (int64_t g = 0; g < numel; g++)
        full[g] = zero ? 0.0f : h_stored(c->dtype, dt_random_value(1234, (uint64_t)g));
    c->bad[r] = check_local_part("fill_random", t, full, c->mesh, coords);
out:
    free(full);
    dt_tensor_destroy(t);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_fill(void **state) {
    fill_case *c = *state;
    assert_int_equal(h_launch(c->world, rank_fill, c), DT_SUCCESS);
    for (int r = 0; r < c->world; r++) assert_int_equal(c->bad[r], 0);
}

/* ------------------------------------------------------------------ */
/* shard then gather                                                   */
/* ------------------------------------------------------------------ */

typedef struct sg_case {
    int ndim_mesh, mesh[3], world, root;
    int64_t shape[3];   /* 0: [2 W, 3, 4 W] */
    dt_layout layout;
    dt_dtype dtype;
    long bad_shard[MAXW], bad_gather[MAXW];
    int got_null[MAXW];
} sg_case;

static dt_status rank_shard_gather(dt_context *ctx, void *arg) {
    sg_case *c = arg;
    int r = dt_context_rank(ctx);
    int64_t shape[] = { 2 * c->world, 3, 4 * c->world };
    if (c->shape[0]) memcpy(shape, c->shape, sizeof shape);
    int64_t numel = h_numel(3, shape);
    dt_mesh *mesh = NULL;
    dt_tensor *full = NULL, *t = NULL, *back = NULL;
    float *ref = malloc((size_t)numel * sizeof *ref);
    dt_status st = DT_SUCCESS;
    if (ref == NULL) return DT_ERR_OUT_OF_MEMORY;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, c->ndim_mesh, c->mesh, NULL, &mesh), out);
    if (r == c->root) {
        DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, c->dtype, 3, shape, NULL, &full), out);
        DT_TRY_GOTO(st, dt_tensor_fill_random(full, 42 + (uint64_t)c->world), out);
    }
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, c->root, full, &c->layout, &t), out);
    int coords[3];
    h_coords(r, c->ndim_mesh, c->mesh, coords);
    int zero = 0;
    for (int m = 0; m < c->ndim_mesh; m++)
        if (c->layout.placements[m].kind == DT_PARTIAL && coords[m] != 0) zero = 1;
    for (int64_t g = 0; g < numel; g++)
        ref[g] = zero ? 0.0f : h_stored(c->dtype, dt_random_value(42 + (uint64_t)c->world, (uint64_t)g));
    c->bad_shard[r] = check_local_part("shard", t, ref, c->mesh, coords);
    DT_TRY_GOTO(st, dt_tensor_gather(t, c->root, &back), out);
    if (r == c->root) {
        for (int64_t g = 0; g < numel; g++)
            ref[g] = h_stored(c->dtype, dt_random_value(42 + (uint64_t)c->world, (uint64_t)g));
        c->bad_gather[r] = back ? check_local_part("gather", back, ref, c->mesh, coords) : -1;
    } else {
        c->got_null[r] = back == NULL;
    }
out:
    free(ref);
    dt_tensor_destroy(back);
    dt_tensor_destroy(t);
    dt_tensor_destroy(full);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_shard_gather(void **state) {
    sg_case *c = *state;
    assert_int_equal(h_launch(c->world, rank_shard_gather, c), DT_SUCCESS);
    for (int r = 0; r < c->world; r++) {
        assert_int_equal(c->bad_shard[r], 0);
        assert_int_equal(c->bad_gather[r], 0);
        if (r != c->root) assert_true(c->got_null[r]);
    }
}

/* ------------------------------------------------------------------ */
/* redistribute: every pair of Layouts                                 */
/* ------------------------------------------------------------------ */

typedef struct rd_case {
    int ndim_mesh, mesh[3], world;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    dt_layout src;
    int n_dst;
    dt_layout dst[MAX_DST];
    long bad[MAX_DST][MAXW];      /* target data wrong */
    long bad_sum[MAX_DST][MAXW];  /* Partial target: replicated sum wrong */
    long changed[MAX_DST][MAXW];  /* input modified */
} rd_case;

static dt_status rank_redistribute(dt_context *ctx, void *arg) {
    rd_case *c = arg;
    int r = dt_context_rank(ctx);
    uint64_t seed = 1000 + (uint64_t)c->world;
    int64_t numel = h_numel(c->ndim, c->shape);
    dt_mesh *mesh = NULL;
    dt_tensor *src = NULL;
    void *saved = NULL;
    float *ref = malloc((size_t)numel * sizeof *ref);
    dt_status st = DT_SUCCESS;
    if (ref == NULL) return DT_ERR_OUT_OF_MEMORY;
    int coords[3];
    h_coords(r, c->ndim_mesh, c->mesh, coords);
    reference_full(&c->src, c->mesh, c->dtype, seed, numel, ref);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, c->ndim_mesh, c->mesh, NULL, &mesh), out);
    DT_TRY_GOTO(st, make_source(ctx, mesh, c->dtype, c->ndim, c->shape, &c->src, seed, &src), out);
    saved = save_local(src);
    if (saved == NULL) {
        st = DT_ERR_OUT_OF_MEMORY;
        goto out;
    }
    for (int k = 0; k < c->n_dst; k++) {
        dt_tensor *o = NULL, *rep = NULL;
        DT_TRY_GOTO(st, dt_tensor_redistribute(src, &c->dst[k], &o), out);
        c->changed[k][r] = changed_since(src, saved);
        int partial = 0;
        for (int m = 0; m < c->ndim_mesh; m++)
            if (c->dst[k].placements[m].kind == DT_PARTIAL) partial = 1;
        if (!dt_layout_equal(dt_tensor_layout(o), &c->dst[k])) c->bad[k][r] = -2;
        if (!partial) {
            c->bad[k][r] = check_local_part("redistribute", o, ref, c->mesh, coords);
        } else {
            /* The summands must add up to the value: replicate and compare. */
            st = dt_tensor_replicate(o, &rep);
            if (st == DT_SUCCESS)
                c->bad_sum[k][r] = check_local_part("redistribute+replicate", rep, ref, c->mesh,
                                                    coords);
        }
        dt_tensor_destroy(rep);
        dt_tensor_destroy(o);
        if (st != DT_SUCCESS) goto out;
    }
out:
    free(ref);
    free(saved);
    dt_tensor_destroy(src);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_redistribute(void **state) {
    rd_case *c = *state;
    dt_status st = h_launch(c->world, rank_redistribute, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    long total = 0;
    for (int k = 0; k < c->n_dst; k++) {
        long bad = 0;
        for (int r = 0; r < c->world; r++) bad += c->bad[k][r] + c->bad_sum[k][r] + c->changed[k][r];
        if (bad) {
            char s[64], d[64];
            h_layout_short(&c->src, s, sizeof s);
            h_layout_short(&c->dst[k], d, sizeof d);
            fprintf(stderr, "  %s -> %s: %ld bad\n", s, d, bad);
        }
        total += bad;
    }
    assert_int_equal(total, 0);
    assert_true(c->n_dst > 0);
}

/* contiguous -> striped -> zigzag -> contiguous on [B, S, H], S sharded */
typedef struct rt_case {
    int world;
    dt_dtype dtype;
    long bad[4][MAXW];
} rt_case;

static dt_status rank_round_trip(dt_context *ctx, void *arg) {
    rt_case *c = arg;
    int r = dt_context_rank(ctx);
    int P = c->world;
    int64_t shape[] = { 2, 4 * P, 5 };
    int64_t numel = h_numel(3, shape);
    dt_mesh *mesh = NULL;
    dt_tensor *t[4] = { 0 };
    float *ref = malloc((size_t)numel * sizeof *ref);
    dt_status st = DT_SUCCESS;
    if (ref == NULL) return DT_ERR_OUT_OF_MEMORY;
    for (int64_t g = 0; g < numel; g++) ref[g] = h_stored(c->dtype, dt_random_value(77, (uint64_t)g));
    const dt_order orders[4] = { DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG,
                                 DT_ORDER_CONTIGUOUS };
    int coords[1] = { r };
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &P, NULL, &mesh), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, c->dtype, 3, shape,
                                     &(dt_layout){ 1, { dt_shard(1, orders[0]) } }, &t[0]), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(t[0], 77), out);
    c->bad[0][r] = check_local_part("start", t[0], ref, &P, coords);
    for (int k = 1; k < 4; k++) {
        dt_layout l = dt_layout_1d(dt_shard(1, orders[k]));
        DT_TRY_GOTO(st, dt_tensor_redistribute(t[k - 1], &l, &t[k]), out);
        c->bad[k][r] = check_local_part("round trip", t[k], ref, &P, coords);
    }
    /* back where it started: bit-identical */
    void *a = save_local(t[0]);
    c->bad[3][r] += a ? changed_since(t[3], a) : 1;
    free(a);
out:
    free(ref);
    for (int k = 0; k < 4; k++) dt_tensor_destroy(t[k]);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_round_trip(void **state) {
    rt_case *c = *state;
    assert_int_equal(h_launch(c->world, rank_round_trip, c), DT_SUCCESS);
    for (int k = 0; k < 4; k++)
        for (int r = 0; r < c->world; r++) assert_int_equal(c->bad[k][r], 0);
}

/* replicate() from Shard, Partial and mixed 2-D Layouts */
typedef struct rep_case {
    int ndim_mesh, mesh[3], world;
    dt_layout src;
    dt_dtype dtype;
    long bad[MAXW];
    int layout_ok[MAXW];
} rep_case;

static dt_status rank_replicate(dt_context *ctx, void *arg) {
    rep_case *c = arg;
    int r = dt_context_rank(ctx);
    int64_t shape[] = { 4 * c->world, 2 * c->world };
    int64_t numel = h_numel(2, shape);
    dt_mesh *mesh = NULL;
    dt_tensor *src = NULL, *rep = NULL;
    float *ref = malloc((size_t)numel * sizeof *ref);
    dt_status st = DT_SUCCESS;
    if (ref == NULL) return DT_ERR_OUT_OF_MEMORY;
    reference_full(&c->src, c->mesh, c->dtype, 555, numel, ref);
    int coords[3];
    h_coords(r, c->ndim_mesh, c->mesh, coords);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, c->ndim_mesh, c->mesh, NULL, &mesh), out);
    DT_TRY_GOTO(st, make_source(ctx, mesh, c->dtype, 2, shape, &c->src, 555, &src), out);
    DT_TRY_GOTO(st, dt_tensor_replicate(src, &rep), out);
    dt_layout all = dt_layout_replicated(c->ndim_mesh);
    c->layout_ok[r] = dt_layout_equal(dt_tensor_layout(rep), &all);
    c->bad[r] = check_local_part("replicate", rep, ref, c->mesh, coords);
out:
    free(ref);
    dt_tensor_destroy(rep);
    dt_tensor_destroy(src);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_replicate(void **state) {
    rep_case *c = *state;
    assert_int_equal(h_launch(c->world, rank_replicate, c), DT_SUCCESS);
    for (int r = 0; r < c->world; r++) {
        assert_true(c->layout_ok[r]);
        assert_int_equal(c->bad[r], 0);
    }
}

/* ------------------------------------------------------------------ */
/* permute_striped / unpermute_striped                                 */
/* ------------------------------------------------------------------ */

typedef struct perm_case {
    int parts;        /* also the world size of the sharding check */
    int64_t S;
    dt_dtype dtype;
    long bad_perm[MAXW], bad_round[MAXW], bad_shard[MAXW], bad_other[MAXW];
} perm_case;

/* The [B, S, H] property: out[b, i, h] = in[b, (i % n)*d + i/n, h], n = S/d,
 * d = parts; then unpermute restores the input bit for bit; and a contiguous
 * shard of the permuted tensor equals the striped shard of the original. */
static dt_status rank_permute(dt_context *ctx, void *arg) {
    perm_case *c = arg;
    int r = dt_context_rank(ctx);
    const int64_t B = 2, H = 3, S = c->S;
    int d = c->parts;
    int64_t n = S / d;
    int64_t shape[] = { B, S, H };
    dt_tensor *x = NULL, *p = NULL, *u = NULL, *xs = NULL, *ps = NULL, *xd = NULL, *pd = NULL;
    dt_mesh *mesh = NULL;
    float *in = NULL, *out = NULL, *a = NULL, *b = NULL;
    dt_status st = DT_SUCCESS;
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, c->dtype, 3, shape, NULL, &x), done);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, 31), done);
    DT_TRY_GOTO(st, dt_tensor_permute_striped(x, 1, d, &p), done);
    in = h_local_floats(x);
    out = h_local_floats(p);
    if (in == NULL || out == NULL) {
        st = DT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    long bad = 0;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t h = 0; h < H; h++) {
                int64_t src_i = (i % n) * d + i / n;
                bad += out[(bb * S + i) * H + h] != in[(bb * S + src_i) * H + h];
            }
    c->bad_perm[r] = bad;
    DT_TRY_GOTO(st, dt_tensor_unpermute_striped(p, 1, d, &u), done);
    void *sx = save_local(x);
    c->bad_round[r] = sx ? changed_since(u, sx) : 1;
    free(sx);

    /* permuted + contiguous == original + striped, on a world of `parts` ranks */
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, &d, NULL, &mesh), done);
    dt_layout rep = dt_layout_1d(dt_replicate());
    dt_layout contig = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    dt_layout striped = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, r == 0 ? x : NULL, &rep, &xd), done);
    DT_TRY_GOTO(st, dt_tensor_permute_striped(xd, 1, d, &pd), done); /* on a Replicate DTensor */
    DT_TRY_GOTO(st, dt_tensor_redistribute(pd, &contig, &ps), done);
    DT_TRY_GOTO(st, dt_tensor_redistribute(xd, &striped, &xs), done);
    a = h_local_floats(ps);
    b = h_local_floats(xs);
    c->bad_shard[r] = (a && b) ? memcmp(a, b, (size_t)dt_tensor_local_numel(xs) * sizeof *a) != 0
                               : 1;
    /* a distributed tensor sharded on another dim permutes locally too */
    dt_tensor *t0 = NULL, *t1 = NULL, *t2 = NULL;
    dt_layout on_b = dt_layout_1d(dt_shard(2, DT_ORDER_STRIPED));
    int64_t shape2[] = { B, S, 2 * (int64_t)d };
    st = dt_tensor_create(ctx, mesh, c->dtype, 3, shape2, &on_b, &t0);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(t0, 8);
    if (st == DT_SUCCESS) st = dt_tensor_permute_striped(t0, 1, d, &t1);
    if (st == DT_SUCCESS) st = dt_tensor_unpermute_striped(t1, 1, d, &t2);
    if (st == DT_SUCCESS) {
        void *s0 = save_local(t0);
        c->bad_other[r] = (s0 ? changed_since(t2, s0) : 1) +
                          !dt_layout_equal(dt_tensor_layout(t1), &on_b);
        free(s0);
    }
    dt_tensor_destroy(t0);
    dt_tensor_destroy(t1);
    dt_tensor_destroy(t2);
done:
    free(in);
    free(out);
    free(a);
    free(b);
    dt_tensor_destroy(x);
    dt_tensor_destroy(p);
    dt_tensor_destroy(u);
    dt_tensor_destroy(xs);
    dt_tensor_destroy(ps);
    dt_tensor_destroy(xd);
    dt_tensor_destroy(pd);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_permute(void **state) {
    perm_case *c = *state;
    dt_status st = h_launch(c->parts, rank_permute, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->parts; r++) {
        assert_int_equal(c->bad_perm[r], 0);
        assert_int_equal(c->bad_round[r], 0);
        assert_int_equal(c->bad_shard[r], 0);
        assert_int_equal(c->bad_other[r], 0);
    }
}

/* ------------------------------------------------------------------ */
/* Bad inputs: rejected, nothing changed, nothing leaked               */
/* ------------------------------------------------------------------ */

#define N_BAD 40

typedef struct bad_case {
    dt_status st[N_BAD][MAXW];
    char msg[N_BAD][MAXW][200];
    int out_untouched[MAXW];
    long changed[MAXW];
    dt_status last[MAXW];
    int n;
} bad_case;

static dt_status rank_bad_inputs(dt_context *ctx, void *arg) {
    bad_case *c = arg;
    int r = dt_context_rank(ctx);
    int W = dt_context_world_size(ctx); /* 4 */
    int m4[] = { 4 }, m22[] = { 2, 2 };
    dt_mesh *mesh = NULL, *mesh2 = NULL;
    dt_tensor *t = NULL, *t2 = NULL, *loc = NULL;
    void *saved = NULL;
    dt_status st = DT_SUCCESS;
    int64_t shape[] = { 8, 6, 4 };
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, m4, NULL, &mesh), out);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 2, m22, NULL, &mesh2), out);
    dt_layout s0 = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_F32, 3, shape, &s0, &t), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(t, 3), out);
    dt_layout s2x = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate());
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh2, DT_F32, 3, shape, &s2x, &t2), out);
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 3, shape, NULL, &loc), out);
    saved = save_local(t);

    dt_tensor *sentinel = (dt_tensor *)(uintptr_t)0x1;
    dt_tensor *o = sentinel;
    int k = 0;
#define BAD(expr)                                                              \
    do {                                                                       \
        c->st[k][r] = (expr);                                                  \
        snprintf(c->msg[k][r], sizeof c->msg[k][r], "%s", dt_last_error());    \
        k++;                                                                   \
    } while (0)
    dt_layout l;
    /* redistribute */
    l = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));       /* 6 % 4 != 0 */
    BAD(dt_tensor_redistribute(t, &l, &o));                    /* 0 */
    l = dt_layout_1d(dt_shard(3, DT_ORDER_CONTIGUOUS));       /* dim out of range */
    BAD(dt_tensor_redistribute(t, &l, &o));                    /* 1 */
    l = dt_layout_1d(dt_replicate());
    l.placements[0].kind = (dt_placement_kind)7;               /* unknown kind */
    BAD(dt_tensor_redistribute(t, &l, &o));                    /* 2 */
    l = dt_layout_1d(dt_shard(0, (dt_order)9));                /* unknown order */
    BAD(dt_tensor_redistribute(t, &l, &o));                    /* 3 */
    l = dt_layout_2d(dt_replicate(), dt_replicate());          /* 2 mesh dims on a 1-D mesh */
    BAD(dt_tensor_redistribute(t, &l, &o));                    /* 4 */
    l = dt_layout_1d(dt_replicate());
    BAD(dt_tensor_redistribute(NULL, &l, &o));                 /* 5 */
    BAD(dt_tensor_redistribute(t, NULL, &o));                  /* 6 */
    BAD(dt_tensor_redistribute(t, &l, NULL));                  /* 7 */
    BAD(dt_tensor_redistribute(loc, &l, &o));                  /* 8: local tensor */
    l = dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_STRIPED));
    BAD(dt_tensor_redistribute(t2, &l, &o));                   /* 9: 6 / 2 = 3, 3 % 2 */
    l = dt_layout_1d(dt_shard(2, DT_ORDER_ZIGZAG));            /* 4 % 8 != 0 */
    BAD(dt_tensor_redistribute(t, &l, &o));                    /* 10 */
    BAD(dt_tensor_replicate(NULL, &o));                        /* 11 */
    BAD(dt_tensor_replicate(loc, &o));                         /* 12 */
    /* shard */
    l = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    BAD(dt_tensor_shard(mesh, -1, loc, &l, &o));               /* 13 */
    BAD(dt_tensor_shard(mesh, W, loc, &l, &o));                /* 14 */
    BAD(dt_tensor_shard(NULL, 0, loc, &l, &o));                /* 15 */
    BAD(dt_tensor_shard(mesh, 0, loc, NULL, &o));              /* 16 */
    l = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));           /* root's shape: 6 % 4 */
    BAD(dt_tensor_shard(mesh, 1, loc, &l, &o));                /* 17: all ranks reject */
    l = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    BAD(dt_tensor_shard(mesh, 2, NULL, &l, &o));               /* 18: root has no tensor */
    BAD(dt_tensor_shard(mesh, 3, t, &l, &o));                  /* 19: root's is distributed */
    /* gather */
    BAD(dt_tensor_gather(t, -1, &o));                          /* 20 */
    BAD(dt_tensor_gather(t, W, &o));                           /* 21 */
    BAD(dt_tensor_gather(NULL, 0, &o));                        /* 22 */
    BAD(dt_tensor_gather(t, 0, NULL));                         /* 23 */
    BAD(dt_tensor_gather(loc, 0, &o));                         /* 24 */
    /* permute */
    BAD(dt_tensor_permute_striped(t, 0, 2, &o));               /* 25: dim 0 is sharded */
    BAD(dt_tensor_permute_striped(t, 3, 2, &o));               /* 26 */
    BAD(dt_tensor_permute_striped(t, -1, 2, &o));              /* 27 */
    BAD(dt_tensor_permute_striped(t, 1, 0, &o));               /* 28 */
    BAD(dt_tensor_permute_striped(t, 1, 4, &o));               /* 29: 6 % 4 */
    BAD(dt_tensor_unpermute_striped(NULL, 1, 2, &o));          /* 30 */
    BAD(dt_tensor_unpermute_striped(t, 1, 2, NULL));           /* 31 */
    c->last[r] = dt_context_last_status(ctx);
#undef BAD
    if (r == 0) c->n = k;
    c->out_untouched[r] = o == sentinel;
    c->changed[r] = saved ? changed_since(t, saved) : 1;
out:
    free(saved);
    dt_tensor_destroy(t);
    dt_tensor_destroy(t2);
    dt_tensor_destroy(loc);
    dt_mesh_destroy(mesh);
    dt_mesh_destroy(mesh2);
    return st;
}

static void test_bad_inputs(void **state) {
    (void)state;
    bad_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    dt_status st = h_launch(4, rank_bad_inputs, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    assert_int_equal(c->n, 32);
    /* messages that must name the values */
    const struct { int k; const char *text; } msgs[] = {
        { 0, "tensor dim 1 of length 6 is not divisible by 4" },
        { 1, "tensor dim 3" },
        { 2, "kind 7" },
        { 3, "order 9" },
        { 4, "layout has 2 mesh dims but the mesh has 1" },
        { 8, "local" },
        { 9, "tensor dim 1 of length 6 is cut to 3 by outer mesh dim 0, and 3 is not divisible by 2" },
        { 10, "not divisible by 8 = 2 x 4" },
        { 13, "root -1 is out of range" },
        { 14, "root 4 is out of range" },
        { 17, "tensor dim 1 of length 6" },
        { 20, "root -1" },
        { 25, "dim 0 is sharded" },
        { 29, "length 6 is not divisible by 4" },
    };
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < c->n; k++) {
            if (c->st[k][r] != DT_ERR_INVALID_ARGUMENT)
                fprintf(stderr, "  case %d rank %d: %s (%s)\n", k, r, dt_status_name(c->st[k][r]),
                        c->msg[k][r]);
            assert_int_equal(c->st[k][r], DT_ERR_INVALID_ARGUMENT);
        }
        for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
            if (!strstr(c->msg[msgs[i].k][r], msgs[i].text))
                fprintf(stderr, "  case %d: '%s' lacks '%s'\n", msgs[i].k, c->msg[msgs[i].k][r],
                        msgs[i].text);
            assert_non_null(strstr(c->msg[msgs[i].k][r], msgs[i].text));
        }
        assert_true(c->out_untouched[r]);
        assert_int_equal(c->changed[r], 0);
        assert_int_equal(c->last[r], DT_ERR_INVALID_ARGUMENT);
    }
    /* root's reasons reach every rank */
    assert_non_null(strstr(c->msg[18][2], "NULL"));
    assert_non_null(strstr(c->msg[18][0], "root 2 rejected"));
    assert_non_null(strstr(c->msg[19][3], "local"));
    free(c);
}

/* ------------------------------------------------------------------ */
/* A tensor dim sharded over several mesh dims                         */
/* ------------------------------------------------------------------ */

static int has_partial(const dt_layout *l) {
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_PARTIAL) return 1;
    return 0;
}

/* One source Layout on a mesh: its global indices, set/get_global,
 * replicate, and redistribute to each of dst[0..n_dst). */
typedef struct multi_case {
    int ndim_mesh, mesh[3], world;
    dt_dtype dtype;
    int64_t shape[3];
    dt_layout src;
    const dt_layout *dst; /* owned by main */
    int n_dst;
    long *bad;            /* [n_dst * MAXW]: wrong data, wrong sums, input changed */
    long bad_idx[MAXW], bad_set[MAXW], bad_get[MAXW], bad_rep[MAXW];
} multi_case;

static dt_status rank_multi(dt_context *ctx, void *arg) {
    multi_case *c = arg;
    const int r = dt_context_rank(ctx);
    const uint64_t seed = 3000 + (uint64_t)c->world;
    const int64_t numel = h_numel(3, c->shape);
    int coords[3];
    h_coords(r, c->ndim_mesh, c->mesh, coords);
    dt_mesh *mesh = NULL;
    dt_tensor *src = NULL, *t = NULL, *rep = NULL;
    float *ref = malloc((size_t)numel * sizeof *ref), *idxf = calloc((size_t)numel, sizeof *idxf);
    float *mine = calloc((size_t)numel, sizeof *mine);
    int64_t *got = malloc((size_t)(numel + 1) * sizeof *got);
    int64_t *exp = malloc((size_t)(numel + 1) * sizeof *exp);
    void *raw = malloc((size_t)numel * sizeof(float)), *saved = NULL;
    dt_status st = DT_SUCCESS;
    if (!ref || !idxf || !mine || !got || !exp || !raw) {
        st = DT_ERR_OUT_OF_MEMORY;
        goto out;
    }
    reference_full(&c->src, c->mesh, c->dtype, seed, numel, ref);
    DT_TRY_GOTO(st, dt_mesh_create(ctx, c->ndim_mesh, c->mesh, NULL, &mesh), out);
    DT_TRY_GOTO(st, make_source(ctx, mesh, c->dtype, 3, c->shape, &c->src, seed, &src), out);
    saved = save_local(src);

    /* global indices along every dim */
    for (int d = 0; d < 3; d++) {
        DT_TRY_GOTO(st, dt_tensor_global_indices(src, d, got), out);
        int64_t n = dim_indices(&c->src, c->mesh, coords, d, c->shape[d], exp);
        c->bad_idx[r] += n != dt_tensor_local_shape(src)[d];
        for (int64_t x = 0; x < n && x < dt_tensor_local_shape(src)[d]; x++)
            c->bad_idx[r] += got[x] != exp[x];
    }

    /* set_global: this rank's part (Partial: coordinate 0's, zero elsewhere);
     * get_global: the local elements to their places, nothing else */
    const float *value = ref;
    float *plain = NULL;
    if (has_partial(&c->src)) {  /* set_global takes plain values */
        plain = malloc((size_t)numel * sizeof *plain);
        if (!plain) {
            st = DT_ERR_OUT_OF_MEMORY;
            goto out;
        }
        for (int64_t g = 0; g < numel; g++)
            plain[g] = h_stored(c->dtype, dt_random_value(seed + 1, (uint64_t)g));
        value = plain;
    }
    to_dtype(c->dtype, value, numel, raw);
    st = dt_tensor_create(ctx, mesh, c->dtype, 3, c->shape, &c->src, &t);
    if (st == DT_SUCCESS) st = dt_tensor_set_global(t, raw);
    if (st == DT_SUCCESS) {
        int zero = 0;
        for (int m = 0; m < c->ndim_mesh; m++)
            if (c->src.placements[m].kind == DT_PARTIAL && coords[m] != 0) zero = 1;
        for (int64_t g = 0; g < numel; g++) mine[g] = zero ? 0.0f : value[g];
        c->bad_set[r] = check_local_part("set_global", t, mine, c->mesh, coords);
    }
    if (st == DT_SUCCESS && !has_partial(&c->src)) {
        for (int64_t g = 0; g < numel; g++) dt_value_set(raw, c->dtype, (size_t)g, -9.0f);
        st = dt_tensor_get_global(t, raw);
        for (int64_t g = 0; g < numel; g++) idxf[g] = (float)g; /* exact: numel < 2^24 */
        local_of(idxf, 3, c->shape, &c->src, c->mesh, coords, mine);
        for (int64_t g = 0; g < numel; g++) idxf[g] = -9.0f;
        for (int64_t i = 0; i < dt_tensor_local_numel(t); i++) idxf[(int64_t)mine[i]] = value[(int64_t)mine[i]];
        for (int64_t g = 0; st == DT_SUCCESS && g < numel; g++)
            c->bad_get[r] += dt_value_get(raw, c->dtype, (size_t)g) != idxf[g];
    }
    free(plain);
    if (st != DT_SUCCESS) goto out;

    /* replicate */
    DT_TRY_GOTO(st, dt_tensor_replicate(src, &rep), out);
    dt_layout all = dt_layout_replicated(c->ndim_mesh);
    c->bad_rep[r] = check_local_part("replicate", rep, ref, c->mesh, coords) +
                    !dt_layout_equal(dt_tensor_layout(rep), &all);

    /* redistribute to every target */
    for (int k = 0; k < c->n_dst; k++) {
        dt_tensor *o = NULL, *sum = NULL;
        long *bad = &c->bad[(size_t)k * MAXW + (size_t)r];
        DT_TRY_GOTO(st, dt_tensor_redistribute(src, &c->dst[k], &o), out);
        *bad += saved ? changed_since(src, saved) : 1;
        *bad += !dt_layout_equal(dt_tensor_layout(o), &c->dst[k]);
        if (!has_partial(&c->dst[k])) {
            *bad += check_local_part("redistribute", o, ref, c->mesh, coords);
        } else {   /* the summands must add up to the value */
            st = dt_tensor_replicate(o, &sum);
            if (st == DT_SUCCESS)
                *bad += check_local_part("redistribute+replicate", sum, ref, c->mesh, coords);
        }
        dt_tensor_destroy(sum);
        dt_tensor_destroy(o);
        if (st != DT_SUCCESS) goto out;
    }
out:
    free(ref);
    free(idxf);
    free(mine);
    free(got);
    free(exp);
    free(raw);
    free(saved);
    dt_tensor_destroy(rep);
    dt_tensor_destroy(t);
    dt_tensor_destroy(src);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_multi(void **state) {
    multi_case *c = *state;
    c->bad = calloc((size_t)c->n_dst * MAXW, sizeof *c->bad);
    assert_non_null(c->bad);
    dt_status st = h_launch(c->world, rank_multi, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    long total = 0;
    for (int k = 0; k < c->n_dst; k++) {
        long bad = 0;
        for (int r = 0; r < c->world; r++) bad += c->bad[(size_t)k * MAXW + (size_t)r];
        if (bad) {
            char a[96], b[96];
            h_layout_short(&c->src, a, sizeof a);
            h_layout_short(&c->dst[k], b, sizeof b);
            fprintf(stderr, "  %s -> %s: %ld bad\n", a, b, bad);
        }
        total += bad;
    }
    free(c->bad);
    c->bad = NULL;
    for (int r = 0; r < c->world; r++) {
        if (c->bad_idx[r] + c->bad_set[r] + c->bad_get[r] + c->bad_rep[r])
            fprintf(stderr, "  rank %d: indices %ld set %ld get %ld replicate %ld\n", r,
                    c->bad_idx[r], c->bad_set[r], c->bad_get[r], c->bad_rep[r]);
        total += c->bad_idx[r] + c->bad_set[r] + c->bad_get[r] + c->bad_rep[r];
    }
    assert_int_equal(total, 0);
}

/* The ops that read Layouts per dim, with the sequence (dim 1) sharded over
 * both dims of a 2-D mesh: each against the op on Replicate data,
 * redistributed to the output's Layout. Rotary and reshape move no
 * arithmetic across rows: bit-exact; matmul within 1e-5. */
typedef struct ops_case {
    int mesh[2], world;
    dt_order o1, o2;
    long bad_rot[3][MAXW], bad_rs[2][MAXW], bad_mm[2][MAXW];
    dt_status refuse[2][MAXW];
} ops_case;

/* Max |a - b| over the local elements (a, b: same shape and Layout). */
static double local_diff(const dt_tensor *a, const dt_tensor *b) {
    float *x = h_local_floats(a), *y = h_local_floats(b);
    double worst = (x && y) ? 0.0 : INFINITY;
    for (int64_t i = 0; x && y && i < dt_tensor_local_numel(a); i++) {
        double e = fabs((double)x[i] - (double)y[i]);
        if (!(e <= worst)) worst = e;
    }
    free(x);
    free(y);
    return worst;
}

/* t against ref (Replicate) redistributed to t's Layout: max |difference|,
 * -1 if the call fails. */
static double against(const dt_tensor *t, const dt_tensor *ref) {
    dt_tensor *e = NULL;
    if (dt_tensor_redistribute(ref, dt_tensor_layout(t), &e) != DT_SUCCESS) return -1.0;
    double d = local_diff(t, e);
    dt_tensor_destroy(e);
    return d;
}

static dt_status rank_ops(dt_context *ctx, void *arg) {
    ops_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *x = NULL, *xr = NULL, *t[8] = { 0 };
    dt_status st = DT_SUCCESS;
    const dt_layout L = dt_layout_2d(dt_shard(1, c->o1), dt_shard(1, c->o2));
    const dt_layout R = dt_layout_replicated(2);
    const int64_t B = 2, S = 48, H = 2, D = 4;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 2, c->mesh, NULL, &mesh), out);

    /* rotary [B, S, H, D]: default positions, a positions table, documents per row */
    const int64_t xs[] = { B, S, H, D };
    DT_TRY_GOTO(st, dt_tensor_create(ctx, mesh, DT_F32, 4, xs, &L, &x), out);
    DT_TRY_GOTO(st, dt_tensor_fill_random(x, 91), out);
    DT_TRY_GOTO(st, dt_tensor_redistribute(x, &R, &xr), out);
    int64_t positions[48], docs[] = { 10, 14, 24, 5, 43 };
    for (int64_t g = 0; g < S; g++) positions[g] = (g * 7) % 50;
    for (int v = 0; v < 3; v++) {
        dt_rotary_options o = DT_ROTARY_OPTIONS_INIT;
        if (v == 1) o.positions = positions, o.n_positions = S;
        if (v == 2) o.doc_lens = docs, o.doc_count = 5;
        DT_TRY_GOTO(st, dt_rotary(x, &o, &t[0]), out);
        DT_TRY_GOTO(st, dt_rotary(xr, &o, &t[1]), out);
        c->bad_rot[v][r] = against(t[0], t[1]) != 0.0 || !dt_layout_equal(dt_tensor_layout(t[0]), &L);
        dt_tensor_destroy(t[0]);
        dt_tensor_destroy(t[1]);
        t[0] = t[1] = NULL;
    }

    /* reshape: split the last dim (the Layout carries over), merge S with
     * the rest (only block orders carry over; striped is refused) */
    const int64_t split[] = { B, S, H * D / 2, 2 }, merged[] = { B, S * H * D };
    const int64_t x3s[] = { B, S, H * D };
    dt_tensor *x3 = NULL, *x3r = NULL;
    st = dt_tensor_reshape(x, 3, x3s, &x3);
    if (st == DT_SUCCESS) st = dt_tensor_reshape(xr, 3, x3s, &x3r);
    if (st == DT_SUCCESS) c->bad_rs[0][r] += against(x3, x3r) != 0.0;
    if (st == DT_SUCCESS) st = dt_tensor_reshape(x3, 4, split, &t[0]);
    if (st == DT_SUCCESS) st = dt_tensor_reshape(x3r, 4, split, &t[1]);
    if (st == DT_SUCCESS)
        c->bad_rs[0][r] += against(t[0], t[1]) != 0.0 || !dt_layout_equal(dt_tensor_layout(t[0]), &L);
    if (st == DT_SUCCESS) {
        dt_status ms = dt_tensor_reshape(x3, 2, merged, &t[2]);
        if (c->o1 == DT_ORDER_STRIPED || c->o2 == DT_ORDER_STRIPED) {
            c->bad_rs[1][r] = ms != DT_ERR_NOT_SUPPORTED;
        } else if (ms != DT_SUCCESS) {
            c->bad_rs[1][r] = 1;
        } else {
            st = dt_tensor_reshape(x3r, 2, merged, &t[3]);
            if (st == DT_SUCCESS) c->bad_rs[1][r] = against(t[2], t[3]) != 0.0;
        }
    }
    for (int k = 0; k < 4; k++) dt_tensor_destroy(t[k]), t[k] = NULL;
    if (st != DT_SUCCESS) {
        dt_tensor_destroy(x3);
        dt_tensor_destroy(x3r);
        goto out;
    }

    /* matmul: x3 [B, S, E] (rows sharded over both) @ w [E, 6] Replicate
     * keeps the rows' Layout; x [B, 4, K] with K sharded over both @ w [K, 6]
     * with K sharded alike is Partial on both */
    const int64_t ws[] = { H * D, 6 }, xk[] = { B, 4, 24 }, wk[] = { 24, 6 };
    const dt_layout LK = dt_layout_2d(dt_shard(2, c->o1), dt_shard(2, c->o2));
    const dt_layout LW = dt_layout_2d(dt_shard(0, c->o1), dt_shard(0, c->o2));
    const dt_layout PP = dt_layout_2d(dt_partial(), dt_partial());
    st = dt_tensor_create(ctx, mesh, DT_F32, 2, ws, &R, &t[0]);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(t[0], 5);
    if (st == DT_SUCCESS) st = dt_matmul(x3, t[0], &t[1]);
    if (st == DT_SUCCESS) st = dt_matmul(x3r, t[0], &t[2]);
    if (st == DT_SUCCESS) {
        double e = against(t[1], t[2]);
        c->bad_mm[0][r] = !(e >= 0.0 && e <= 1e-5) || !dt_layout_equal(dt_tensor_layout(t[1]), &L);
    }
    dt_tensor_destroy(x3);
    dt_tensor_destroy(x3r);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 3, xk, &LK, &t[3]);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(t[3], 6);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 2, wk, &LW, &t[4]);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(t[4], 7);
    if (st == DT_SUCCESS) st = dt_matmul(t[3], t[4], &t[5]);
    if (st == DT_SUCCESS) {
        dt_tensor *ar = NULL, *br = NULL, *yr = NULL, *ys = NULL;
        st = dt_tensor_redistribute(t[3], &R, &ar);
        if (st == DT_SUCCESS) st = dt_tensor_redistribute(t[4], &R, &br);
        if (st == DT_SUCCESS) st = dt_matmul(ar, br, &yr);
        if (st == DT_SUCCESS) st = dt_tensor_redistribute(t[5], &R, &ys);
        if (st == DT_SUCCESS) {
            double e = local_diff(ys, yr);
            c->bad_mm[1][r] = !(e <= 1e-5) || !dt_layout_equal(dt_tensor_layout(t[5]), &PP);
        }
        dt_tensor_destroy(ar);
        dt_tensor_destroy(br);
        dt_tensor_destroy(yr);
        dt_tensor_destroy(ys);
    }
    for (int k = 0; k < 6; k++) dt_tensor_destroy(t[k]), t[k] = NULL;
    if (st != DT_SUCCESS) goto out;

    /* refused: a vocabulary over two mesh dims (embedding, cross-entropy) */
    const int64_t tab[] = { 24, 4 }, tok[] = { 3 }, lg[] = { 3, 24 };
    const dt_layout LV = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(0, DT_ORDER_CONTIGUOUS));
    const dt_layout LL = dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_CONTIGUOUS));
    st = dt_tensor_create(ctx, mesh, DT_F32, 2, tab, &LV, &t[0]);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_I32, 1, tok, &R, &t[1]);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, mesh, DT_F32, 2, lg, &LL, &t[2]);
    if (st == DT_SUCCESS) {
        c->refuse[0][r] = dt_embedding(t[0], t[1], &t[3]);
        float loss = 0.0f;
        c->refuse[1][r] = dt_cross_entropy(t[2], t[1], NULL, &loss, NULL);
    }
out:
    for (int k = 0; k < 8; k++) dt_tensor_destroy(t[k]);
    dt_tensor_destroy(x);
    dt_tensor_destroy(xr);
    dt_mesh_destroy(mesh);
    return st;
}

static void test_ops_multi(void **state) {
    ops_case *c = *state;
    dt_status st = h_launch(c->world, rank_ops, c);
    if (st != DT_SUCCESS) fprintf(stderr, "  %s\n", dt_last_error());
    assert_int_equal(st, DT_SUCCESS);
    for (int r = 0; r < c->world; r++) {
        for (int v = 0; v < 3; v++) assert_int_equal(c->bad_rot[v][r], 0);
        for (int v = 0; v < 2; v++) assert_int_equal(c->bad_rs[v][r], 0);
        for (int v = 0; v < 2; v++) assert_int_equal(c->bad_mm[v][r], 0);
        for (int v = 0; v < 2; v++) assert_int_equal(c->refuse[v][r], DT_ERR_NOT_SUPPORTED);
    }
}

/* ------------------------------------------------------------------ */
/* Case tables                                                         */
/* ------------------------------------------------------------------ */

static const dt_placement *placements_1d(int *n) {
    static const dt_placement p[] = {
        { DT_REPLICATE, 0, DT_ORDER_CONTIGUOUS }, { DT_PARTIAL, 0, DT_ORDER_CONTIGUOUS },
        { DT_SHARD, 0, DT_ORDER_CONTIGUOUS },     { DT_SHARD, 0, DT_ORDER_STRIPED },
        { DT_SHARD, 0, DT_ORDER_ZIGZAG },         { DT_SHARD, 1, DT_ORDER_CONTIGUOUS },
        { DT_SHARD, 1, DT_ORDER_STRIPED },        { DT_SHARD, 1, DT_ORDER_ZIGZAG },
    };
    *n = (int)(sizeof p / sizeof p[0]);
    return p;
}

static const dt_placement *placements_2d(int *n) {
    static const dt_placement p[] = {
        { DT_REPLICATE, 0, DT_ORDER_CONTIGUOUS }, { DT_PARTIAL, 0, DT_ORDER_CONTIGUOUS },
        { DT_SHARD, 0, DT_ORDER_CONTIGUOUS },     { DT_SHARD, 0, DT_ORDER_ZIGZAG },
        { DT_SHARD, 1, DT_ORDER_STRIPED },        { DT_SHARD, 1, DT_ORDER_CONTIGUOUS },
    };
    *n = (int)(sizeof p / sizeof p[0]);
    return p;
}

typedef struct table {
    struct CMUnitTest *tests;
    char (*names)[200];
    size_t n, cap;
} table;

static void add_test(table *t, const char *name, CMUnitTestFunction fn, void *state) {
    if (t->n >= t->cap) {
        fprintf(stderr, "test table full\n");
        return;
    }
    snprintf(t->names[t->n], sizeof t->names[t->n], "%s", name);
    t->tests[t->n] = (struct CMUnitTest){ t->names[t->n], fn, NULL, NULL, state };
    t->n++;
}

int main(void) {
    table tb;
    tb.cap = 8192;
    tb.n = 0;
    tb.tests = calloc(tb.cap, sizeof *tb.tests);
    tb.names = calloc(tb.cap, sizeof *tb.names);
    /* Every case struct lives until the end of main; freed there. */
    void **owned = calloc(tb.cap, sizeof *owned);
    size_t n_owned = 0;
    if (!tb.tests || !tb.names || !owned) return 1;
    char name[320], ms[16], a[96], b[96];
#define NEW(type) ((type *)(owned[n_owned++] = calloc(1, sizeof(type))))

    /* meshes */
    for (int w = 1; w <= MAXW; w++) {
        mesh_case *c = NEW(mesh_case);
        c->ndim = 1;
        c->sizes[0] = w;
        c->world = w;
        snprintf(name, sizeof name, "mesh/%d", w);
        add_test(&tb, name, test_mesh, c);
    }
    const int meshes[][4] = { { 2, 2, 2, 0 }, { 2, 2, 3, 0 }, { 2, 3, 2, 0 }, { 2, 1, 4, 0 },
                              { 2, 4, 1, 0 }, { 3, 2, 2, 2 }, { 3, 1, 3, 2 } };
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++) {
        mesh_case *c = NEW(mesh_case);
        c->ndim = meshes[i][0];
        c->world = 1;
        for (int m = 0; m < c->ndim; m++) {
            c->sizes[m] = meshes[i][1 + m];
            c->world *= c->sizes[m];
        }
        snprintf(name, sizeof name, "mesh/%s", mesh_name(c->ndim, c->sizes, ms, sizeof ms));
        add_test(&tb, name, test_mesh, c);
    }
    add_test(&tb, "mesh_errors", test_mesh_errors, NULL);
    add_test(&tb, "tensor_basics", test_tensor_basics, NULL);
    add_test(&tb, "views", test_views, NULL);
    add_test(&tb, "redistribute_n", test_redistribute_n, NULL);
    add_test(&tb, "redistribute_n/buckets", test_redistribute_n_buckets, NULL);
    add_test(&tb, "random_value", test_random_value, NULL);

    /* fill_random under many Layouts */
    {
        const dt_layout l1[] = {
            dt_layout_1d(dt_replicate()), dt_layout_1d(dt_partial()),
            dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)), dt_layout_1d(dt_shard(0, DT_ORDER_ZIGZAG)),
            dt_layout_1d(dt_shard(2, DT_ORDER_STRIPED)), dt_layout_1d(dt_shard(2, DT_ORDER_ZIGZAG)),
        };
        for (int w = 1; w <= MAXW; w++)
            for (size_t i = 0; i < sizeof l1 / sizeof l1[0]; i++)
                for (int dt = 0; dt < 3; dt++) {
                    fill_case *c = NEW(fill_case);
                    c->ndim_mesh = 1;
                    c->mesh[0] = w;
                    c->world = w;
                    c->layout = l1[i];
                    c->dtype = k_dtypes[dt];
                    h_layout_short(&c->layout, a, sizeof a);
                    snprintf(name, sizeof name, "fill_random/P=%d,%s,%s", w, a, dt_dtype_name(c->dtype));
                    add_test(&tb, name, test_fill, c);
                }
        const int m2[][2] = { { 2, 2 }, { 2, 3 }, { 3, 2 } };
        const dt_layout l2[] = {
            dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(2, DT_ORDER_STRIPED)),
            dt_layout_2d(dt_shard(2, DT_ORDER_ZIGZAG), dt_partial()),
            dt_layout_2d(dt_partial(), dt_shard(0, DT_ORDER_STRIPED)),
        };
        for (size_t i = 0; i < 3; i++)
            for (size_t j = 0; j < 3; j++) {
                fill_case *c = NEW(fill_case);
                c->ndim_mesh = 2;
                c->mesh[0] = m2[i][0];
                c->mesh[1] = m2[i][1];
                c->world = m2[i][0] * m2[i][1];
                c->layout = l2[j];
                c->dtype = DT_F32;
                h_layout_short(&c->layout, a, sizeof a);
                snprintf(name, sizeof name, "fill_random/mesh=%dx%d,%s", m2[i][0], m2[i][1], a);
                add_test(&tb, name, test_fill, c);
            }
    }

    /* shard then gather */
    {
        const dt_layout l1[] = {
            dt_layout_1d(dt_replicate()), dt_layout_1d(dt_partial()),
            dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS)), dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED)),
            dt_layout_1d(dt_shard(2, DT_ORDER_ZIGZAG)), dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS)),
        };
        for (int w = 1; w <= MAXW; w++)
            for (size_t i = 0; i < sizeof l1 / sizeof l1[0]; i++)
                for (int dt = 0; dt < 3; dt++) {
                    sg_case *c = NEW(sg_case);
                    c->ndim_mesh = 1;
                    c->mesh[0] = w;
                    c->world = w;
                    c->root = w - 1;
                    c->layout = l1[i];
                    c->dtype = k_dtypes[dt];
                    h_layout_short(&c->layout, a, sizeof a);
                    snprintf(name, sizeof name, "shard_gather/P=%d,root=%d,%s,%s", w, c->root, a,
                             dt_dtype_name(c->dtype));
                    add_test(&tb, name, test_shard_gather, c);
                }
        const int m[][3] = { { 2, 2, 0 }, { 2, 3, 0 }, { 3, 2, 0 }, { 2, 2, 2 } };
        const dt_layout l2[] = {
            dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(2, DT_ORDER_STRIPED)),
            dt_layout_2d(dt_replicate(), dt_shard(2, DT_ORDER_ZIGZAG)),
            dt_layout_2d(dt_partial(), dt_shard(0, DT_ORDER_STRIPED)),
            dt_layout_2d(dt_shard(2, DT_ORDER_CONTIGUOUS), dt_partial()),
            dt_layout_2d(dt_partial(), dt_replicate()),
        };
        const dt_layout l3[] = {
            dt_layout_3d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_partial(), dt_shard(2, DT_ORDER_ZIGZAG)),
            dt_layout_3d(dt_replicate(), dt_shard(2, DT_ORDER_STRIPED), dt_partial()),
        };
        for (size_t i = 0; i < 4; i++) {
            int nd = m[i][2] ? 3 : 2;
            const dt_layout *ls = nd == 3 ? l3 : l2;
            size_t nl = nd == 3 ? 2 : 5;
            for (size_t j = 0; j < nl; j++)
                for (int root = 0; root < 2; root++) {
                    sg_case *c = NEW(sg_case);
                    c->ndim_mesh = nd;
                    c->world = 1;
                    for (int k = 0; k < nd; k++) {
                        c->mesh[k] = m[i][k];
                        c->world *= m[i][k];
                    }
                    c->root = root ? 1 : 0;
                    c->layout = ls[j];
                    c->dtype = (j % 2) ? DT_BF16 : DT_F32;
                    h_layout_short(&c->layout, a, sizeof a);
                    snprintf(name, sizeof name, "shard_gather/mesh=%s,root=%d,%s,%s",
                             mesh_name(nd, c->mesh, ms, sizeof ms), c->root, a,
                             dt_dtype_name(c->dtype));
                    add_test(&tb, name, test_shard_gather, c);
                }
        }
    }

    /* redistribute: every pair of 1-D Layouts, P = 1..8, fp32 and bf16 */
    {
        int np;
        const dt_placement *p = placements_1d(&np);
        for (int dt = 0; dt < 3; dt++)
            for (int w = 1; w <= MAXW; w++)
                for (int i = 0; i < np; i++)
                    for (int j = 0; j < np; j++) {
                        rd_case *c = NEW(rd_case);
                        c->ndim_mesh = 1;
                        c->mesh[0] = w;
                        c->world = w;
                        c->dtype = k_dtypes[dt];
                        c->ndim = 3;
                        c->shape[0] = 4 * w;
                        c->shape[1] = 2 * w;
                        c->shape[2] = 3;
                        c->src = dt_layout_1d(p[i]);
                        c->n_dst = 1;
                        c->dst[0] = dt_layout_1d(p[j]);
                        h_layout_short(&c->src, a, sizeof a);
                        h_layout_short(&c->dst[0], b, sizeof b);
                        snprintf(name, sizeof name, "redistribute/P=%d,%s->%s,%s", w, a, b,
                                 dt_dtype_name(c->dtype));
                        add_test(&tb, name, test_redistribute, c);
                    }
    }
    /* redistribute on 2-D meshes: every legal source, all legal targets per test */
    {
        int np;
        const dt_placement *p = placements_2d(&np);
        const int m2[][2] = { { 2, 2 }, { 2, 3 }, { 3, 2 } };
        for (size_t mi = 0; mi < 3; mi++) {
            dt_layout legal[64];
            int nl = 0;
            for (int i = 0; i < np; i++)
                for (int j = 0; j < np; j++) {
                    if (p[i].kind == DT_SHARD && p[j].kind == DT_SHARD && p[i].dim == p[j].dim)
                        continue;
                    legal[nl++] = dt_layout_2d(p[i], p[j]);
                }
            for (int s = 0; s < nl; s++) {
                rd_case *c = NEW(rd_case);
                c->ndim_mesh = 2;
                c->mesh[0] = m2[mi][0];
                c->mesh[1] = m2[mi][1];
                c->world = m2[mi][0] * m2[mi][1];
                c->dtype = (s % 3 == 0) ? DT_BF16 : DT_F32;
                c->ndim = 3;
                c->shape[0] = 2 * c->world;
                c->shape[1] = 2 * c->world;
                c->shape[2] = 2;
                c->src = legal[s];
                c->n_dst = nl;
                for (int d = 0; d < nl; d++) c->dst[d] = legal[d];
                h_layout_short(&c->src, a, sizeof a);
                snprintf(name, sizeof name, "redistribute/mesh=%dx%d,[%s]->all,%s", m2[mi][0],
                         m2[mi][1], a, dt_dtype_name(c->dtype));
                add_test(&tb, name, test_redistribute, c);
            }
        }
        /* a 2x2x2 mesh: a handful of 3-D Layouts, all pairs */
        const dt_layout l3[] = {
            dt_layout_replicated(3),
            dt_layout_3d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_STRIPED), dt_partial()),
            dt_layout_3d(dt_partial(), dt_shard(0, DT_ORDER_ZIGZAG), dt_shard(1, DT_ORDER_CONTIGUOUS)),
            dt_layout_3d(dt_shard(1, DT_ORDER_ZIGZAG), dt_partial(), dt_partial()),
            dt_layout_3d(dt_shard(2, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_CONTIGUOUS),
                         dt_shard(0, DT_ORDER_STRIPED)),
            dt_layout_3d(dt_shard(0, DT_ORDER_STRIPED), dt_shard(2, DT_ORDER_CONTIGUOUS),
                         dt_shard(1, DT_ORDER_ZIGZAG)),
        };
        for (int s = 0; s < 6; s++) {
            rd_case *c = NEW(rd_case);
            c->ndim_mesh = 3;
            c->mesh[0] = c->mesh[1] = c->mesh[2] = 2;
            c->world = 8;
            c->dtype = DT_F32;
            c->ndim = 3;
            c->shape[0] = 8;
            c->shape[1] = 4;
            c->shape[2] = 4;
            c->src = l3[s];
            c->n_dst = 6;
            for (int d = 0; d < 6; d++) c->dst[d] = l3[d];
            h_layout_short(&c->src, a, sizeof a);
            snprintf(name, sizeof name, "redistribute/mesh=2x2x2,[%s]->all,fp32", a);
            add_test(&tb, name, test_redistribute, c);
        }
    }
    for (int dt = 0; dt < 3; dt++)
        for (int w = 1; w <= MAXW; w++) {
            rt_case *c = NEW(rt_case);
            c->world = w;
            c->dtype = k_dtypes[dt];
            snprintf(name, sizeof name, "round_trip/P=%d,contiguous->striped->zigzag->contiguous,%s",
                     w, dt_dtype_name(c->dtype));
            add_test(&tb, name, test_round_trip, c);
        }
    {
        const dt_layout l1[] = { dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG)), dt_layout_1d(dt_partial()),
                                 dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED)) };
        for (int w = 1; w <= MAXW; w++)
            for (int i = 0; i < 3; i++) {
                rep_case *c = NEW(rep_case);
                c->ndim_mesh = 1;
                c->mesh[0] = w;
                c->world = w;
                c->src = l1[i];
                c->dtype = (w % 2) ? DT_F32 : DT_BF16;
                h_layout_short(&c->src, a, sizeof a);
                snprintf(name, sizeof name, "replicate/P=%d,%s,%s", w, a, dt_dtype_name(c->dtype));
                add_test(&tb, name, test_replicate, c);
            }
        const dt_layout l2[] = {
            dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_partial()),
            dt_layout_2d(dt_partial(), dt_partial()),
            dt_layout_2d(dt_shard(1, DT_ORDER_STRIPED), dt_shard(0, DT_ORDER_ZIGZAG)),
        };
        for (int i = 0; i < 3; i++) {
            rep_case *c = NEW(rep_case);
            c->ndim_mesh = 2;
            c->mesh[0] = 2;
            c->mesh[1] = 3;
            c->world = 6;
            c->src = l2[i];
            c->dtype = DT_F32;
            h_layout_short(&c->src, a, sizeof a);
            snprintf(name, sizeof name, "replicate/mesh=2x3,%s", a);
            add_test(&tb, name, test_replicate, c);
        }
    }
    {
        for (int parts = 1; parts <= MAXW; parts++)
            for (int dt = 0; dt < 3; dt++) {
                perm_case *c = NEW(perm_case);
                c->parts = parts;
                c->S = 3 * parts;
                c->dtype = k_dtypes[dt];
                snprintf(name, sizeof name, "permute/B=2,S=%lld,H=3,parts=%d,%s", (long long)c->S,
                         parts, dt_dtype_name(c->dtype));
                add_test(&tb, name, test_permute, c);
            }
    }
    /* Layouts that shard a tensor dim over several mesh dims: per mesh, the
     * multi-sharded Layouts and the one-dim ones; each multi-sharded source
     * to every Layout, each one-dim source to every multi-sharded one. */
    {
        static const dt_order ords[3] = { DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG };
        const int m2[][2] = { { 2, 2 }, { 2, 3 }, { 3, 2 }, { 2, 4 }, { 4, 2 } };
        int np;
        const dt_placement *p = placements_2d(&np);
        for (size_t mi = 0; mi < 6; mi++) {
            const int nm = mi < 5 ? 2 : 3;
            int sizes[3] = { 2, 2, 2 };
            if (nm == 2) sizes[0] = m2[mi][0], sizes[1] = m2[mi][1];
            const int world = sizes[0] * sizes[1] * (nm == 3 ? sizes[2] : 1);
            dt_layout *all = (dt_layout *)(owned[n_owned++] = calloc(160, sizeof(dt_layout)));
            int na = 0, n_multi;
            int64_t shape[3];
            if (nm == 2) {
                shape[0] = shape[1] = 4 * world;
                shape[2] = 2;
                for (int d = 0; d < 2; d++)
                    for (int oa = 0; oa < 3; oa++)
                        for (int ob = 0; ob < 3; ob++)
                            all[na++] = dt_layout_2d(dt_shard(d, ords[oa]), dt_shard(d, ords[ob]));
                n_multi = na;
                for (int i = 0; i < np; i++)
                    for (int j = 0; j < np; j++)
                        if (!(p[i].kind == DT_SHARD && p[j].kind == DT_SHARD && p[i].dim == p[j].dim))
                            all[na++] = dt_layout_2d(p[i], p[j]);
            } else {
                /* [B, S, H] = [4, 64, 4]: S over two mesh dims (the third
                 * Replicate, Partial, or sharding B or H) or over all three */
                shape[0] = 4;
                shape[1] = 64;
                shape[2] = 4;
                const dt_placement others[4] = { dt_replicate(), dt_partial(),
                                                 dt_shard(0, DT_ORDER_ZIGZAG),
                                                 dt_shard(2, DT_ORDER_STRIPED) };
                for (int skip = 0; skip < 3; skip++)
                    for (int oa = 0; oa < 3; oa++)
                        for (int ob = 0; ob < 3; ob++) {
                            dt_layout l = dt_layout_replicated(3);
                            int k = 0;
                            for (int m = 0; m < 3; m++)
                                l.placements[m] = m == skip ? others[(3 * oa + ob + skip) % 4]
                                                            : dt_shard(1, ords[k++ ? ob : oa]);
                            all[na++] = l;
                        }
                for (int oa = 0; oa < 3; oa++)
                    for (int ob = 0; ob < 3; ob++)
                        for (int c3 = 0; c3 < 3; c3++)
                            all[na++] = dt_layout_3d(dt_shard(1, ords[oa]), dt_shard(1, ords[ob]),
                                                     dt_shard(1, ords[c3]));
                n_multi = na;
                const dt_layout one[] = {
                    dt_layout_replicated(3),
                    dt_layout_3d(dt_shard(1, DT_ORDER_ZIGZAG), dt_replicate(), dt_replicate()),
                    dt_layout_3d(dt_replicate(), dt_shard(1, DT_ORDER_STRIPED), dt_partial()),
                    dt_layout_3d(dt_partial(), dt_replicate(), dt_shard(1, DT_ORDER_CONTIGUOUS)),
                    dt_layout_3d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_STRIPED),
                                 dt_partial()),
                    dt_layout_3d(dt_partial(), dt_shard(0, DT_ORDER_ZIGZAG),
                                 dt_shard(1, DT_ORDER_CONTIGUOUS)),
                    dt_layout_3d(dt_shard(2, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_CONTIGUOUS),
                                 dt_shard(0, DT_ORDER_STRIPED)),
                    dt_layout_3d(dt_shard(1, DT_ORDER_STRIPED), dt_shard(2, DT_ORDER_CONTIGUOUS),
                                 dt_shard(0, DT_ORDER_ZIGZAG)),
                };
                for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) all[na++] = one[i];
            }
            for (int s = 0; s < na; s++) {
                multi_case *c = NEW(multi_case);
                c->ndim_mesh = nm;
                c->world = world;
                for (int m = 0; m < 3; m++) c->mesh[m] = sizes[m];
                c->dtype = k_dtypes[s % 3];
                memcpy(c->shape, shape, sizeof shape);
                c->src = all[s];
                c->dst = all;
                c->n_dst = s < n_multi ? na : n_multi;
                h_layout_short(&c->src, a, sizeof a);
                snprintf(name, sizeof name, "multi/mesh=%s,[%s]->%s,%s",
                         mesh_name(nm, c->mesh, ms, sizeof ms), a,
                         s < n_multi ? "all" : "multi", dt_dtype_name(c->dtype));
                add_test(&tb, name, test_multi, c);
            }
            /* fill_random and shard/gather under each multi-sharded Layout */
            for (int s = 0; s < n_multi; s++) {
                fill_case *f = NEW(fill_case);
                f->ndim_mesh = nm;
                f->world = world;
                for (int m = 0; m < 3; m++) f->mesh[m] = sizes[m];
                memcpy(f->shape, shape, sizeof shape);
                f->layout = all[s];
                f->dtype = k_dtypes[(s + 1) % 3];
                h_layout_short(&f->layout, a, sizeof a);
                snprintf(name, sizeof name, "fill_random/mesh=%s,%s,%s",
                         mesh_name(nm, f->mesh, ms, sizeof ms), a, dt_dtype_name(f->dtype));
                add_test(&tb, name, test_fill, f);
                sg_case *g = NEW(sg_case);
                g->ndim_mesh = nm;
                g->world = world;
                for (int m = 0; m < 3; m++) g->mesh[m] = sizes[m];
                memcpy(g->shape, shape, sizeof shape);
                g->root = s % world;
                g->layout = all[s];
                g->dtype = k_dtypes[(s + 2) % 3];
                snprintf(name, sizeof name, "shard_gather/mesh=%s,root=%d,%s,%s",
                         mesh_name(nm, g->mesh, ms, sizeof ms), g->root, a,
                         dt_dtype_name(g->dtype));
                add_test(&tb, name, test_shard_gather, g);
            }
        }
        const int mo[][2] = { { 2, 2 }, { 2, 3 } };
        for (int mi = 0; mi < 2; mi++)
            for (int a2 = 0; a2 < 3; a2++)
                for (int b2 = 0; b2 < 3; b2++) {
                    ops_case *c = NEW(ops_case);
                    c->mesh[0] = mo[mi][0];
                    c->mesh[1] = mo[mi][1];
                    c->world = mo[mi][0] * mo[mi][1];
                    c->o1 = ords[a2];
                    c->o2 = ords[b2];
                    snprintf(name, sizeof name, "ops_multi/mesh=%dx%d,S(1,%s),S(1,%s)",
                             mo[mi][0], mo[mi][1], dt_order_name(c->o1), dt_order_name(c->o2));
                    add_test(&tb, name, test_ops_multi, c);
                }
    }
    add_test(&tb, "bad_inputs/P=4", test_bad_inputs, NULL);
#undef NEW

    int failed = h_run_cases("tensor", tb.tests, tb.n);
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    free(tb.tests);
    free(tb.names);
    return failed;
}
