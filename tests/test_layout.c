/* tests/test_layout.c — the pure Layout functions: index maps against the
 * definitions (enumerated by tests/harness.c, not computed by layout.c),
 * owner/local/global round trips for P = 1..8, the composed maps of a dim
 * sharded over two or three mesh dims (every order combination on meshes
 * 2x2, 2x3, 3x2, 2x4, 4x2, 2x2x2 and 3x2x2: global/owner/local against the
 * definitions composed here, round trips, coverage, and dt_layout_check's
 * divisibility against the definition for every length up to a bound),
 * local shapes, dt_layout_check errors and their messages, formatting,
 * equality and names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/layout.h"
#include "harness.h"

typedef struct map_case {
    dt_order order;
    int parts;
} map_case;

/* For several lengths n: rank j's indices from the definition equal
 * dt_order_global, owner/local invert it, and every index has one owner. */
static void test_order_maps(void **state) {
    const map_case *c = *state;
    int P = c->parts;
    int64_t unit = c->order == DT_ORDER_ZIGZAG ? 2 * P : P;
    const int64_t mults[] = { 0, 1, 2, 3, 5 };
    for (size_t k = 0; k < sizeof mults / sizeof mults[0]; k++) {
        int64_t n = unit * mults[k];
        int64_t cnt = n / P;
        int64_t *list = malloc((size_t)(cnt + 1) * sizeof *list);
        int *seen = calloc((size_t)n + 1, sizeof *seen);
        assert_non_null(list);
        assert_non_null(seen);
        long bad_global = 0, bad_owner = 0, bad_local = 0;
        for (int j = 0; j < P; j++) {
            h_order_indices(c->order, n, P, j, list);
            for (int64_t x = 0; x < cnt; x++) {
                int64_t g = list[x];
                if (dt_order_global(c->order, n, P, j, x) != g) bad_global++;
                if (dt_order_owner(c->order, n, P, g) != j) bad_owner++;
                if (dt_order_local(c->order, n, P, g) != x) bad_local++;
                seen[g]++;
            }
        }
        long bad_cover = 0;
        for (int64_t g = 0; g < n; g++) bad_cover += seen[g] != 1;
        /* And the other direction: global(owner(g), local(g)) == g for all g. */
        long bad_round = 0;
        for (int64_t g = 0; g < n; g++) {
            int64_t j = dt_order_owner(c->order, n, P, g);
            int64_t x = dt_order_local(c->order, n, P, g);
            if (j < 0 || j >= P || x < 0 || x >= cnt ||
                dt_order_global(c->order, n, P, (int)j, x) != g)
                bad_round++;
        }
        if (bad_global + bad_owner + bad_local + bad_cover + bad_round)
            fprintf(stderr, "  n=%lld: global %ld owner %ld local %ld cover %ld round %ld\n",
                    (long long)n, bad_global, bad_owner, bad_local, bad_cover, bad_round);
        assert_int_equal(bad_global, 0);
        assert_int_equal(bad_owner, 0);
        assert_int_equal(bad_local, 0);
        assert_int_equal(bad_cover, 0);
        assert_int_equal(bad_round, 0);
        free(list);
        free(seen);
    }
}

/* Hand-written examples straight from the header's definitions. */
static void test_order_examples(void **state) {
    (void)state;
    /* contiguous n=6, P=3: rank 1 holds 2, 3 */
    assert_int_equal(dt_order_global(DT_ORDER_CONTIGUOUS, 6, 3, 1, 0), 2);
    assert_int_equal(dt_order_global(DT_ORDER_CONTIGUOUS, 6, 3, 1, 1), 3);
    /* striped n=6, P=3: rank 1 holds 1, 4 */
    assert_int_equal(dt_order_global(DT_ORDER_STRIPED, 6, 3, 1, 0), 1);
    assert_int_equal(dt_order_global(DT_ORDER_STRIPED, 6, 3, 1, 1), 4);
    /* zigzag n=8, P=2: chunks of 2; rank 0 holds 0,1,6,7; rank 1 holds 2,3,4,5 */
    const int64_t r0[] = { 0, 1, 6, 7 }, r1[] = { 2, 3, 4, 5 };
    for (int x = 0; x < 4; x++) {
        assert_int_equal(dt_order_global(DT_ORDER_ZIGZAG, 8, 2, 0, x), r0[x]);
        assert_int_equal(dt_order_global(DT_ORDER_ZIGZAG, 8, 2, 1, x), r1[x]);
    }
    assert_int_equal(dt_order_owner(DT_ORDER_ZIGZAG, 8, 2, 6), 0);
    assert_int_equal(dt_order_local(DT_ORDER_ZIGZAG, 8, 2, 6), 2);
    assert_int_equal(dt_order_owner(DT_ORDER_STRIPED, 6, 3, 5), 2);
    assert_int_equal(dt_order_local(DT_ORDER_STRIPED, 6, 3, 5), 1);
}

static void test_local_shape(void **state) {
    (void)state;
    int m4[] = { 4 }, m23[] = { 2, 3 };
    int64_t shape[] = { 8, 16 }, out[2];
    dt_layout l = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_local_shape(&l, 2, shape, m4, out), DT_SUCCESS);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 16);
    l = dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
    assert_int_equal(dt_layout_local_shape(&l, 2, shape, m4, out), DT_SUCCESS);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 4);
    l = dt_layout_1d(dt_partial());
    assert_int_equal(dt_layout_local_shape(&l, 2, shape, m4, out), DT_SUCCESS);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 16);
    int64_t s2[] = { 6, 4 };
    l = dt_layout_2d(dt_shard(1, DT_ORDER_STRIPED), dt_shard(0, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_local_shape(&l, 2, s2, m23, out), DT_SUCCESS);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 2);
    l = dt_layout_2d(dt_replicate(), dt_partial());
    assert_int_equal(dt_layout_local_shape(&l, 2, s2, m23, out), DT_SUCCESS);
    assert_int_equal(out[0], 6);
    assert_int_equal(out[1], 4);
    /* a failing check leaves local_shape alone and reports */
    out[0] = -7;
    l = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    int m3[] = { 3 };
    assert_int_equal(dt_layout_local_shape(&l, 2, shape, m3, out), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(out[0], -7);
    assert_int_equal(dt_layout_local_shape(&l, 2, shape, m4, NULL), DT_ERR_INVALID_ARGUMENT);
}

static void test_check_errors(void **state) {
    (void)state;
    int m3[] = { 3 }, m22[] = { 2, 2 };
    int64_t shape[] = { 4, 1000 };
    dt_layout l = dt_layout_1d(dt_shard(1, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_check(&l, 2, shape, m3), DT_ERR_INVALID_ARGUMENT);
    assert_string_equal(dt_last_error(), "tensor dim 1 of length 1000 is not divisible by 3 "
                                         "(mesh dim 0, Shard(1, contiguous))");

    /* zigzag needs 2P */
    int64_t s2[] = { 4, 1002 };
    l = dt_layout_1d(dt_shard(1, DT_ORDER_STRIPED));
    assert_int_equal(dt_layout_check(&l, 2, s2, m3), DT_SUCCESS);
    l = dt_layout_1d(dt_shard(1, DT_ORDER_ZIGZAG));
    s2[1] = 1005; /* divisible by 3, not by 6 */
    assert_int_equal(dt_layout_check(&l, 2, s2, m3), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "length 1005"));
    assert_non_null(strstr(dt_last_error(), "2 x 3"));
    assert_non_null(strstr(dt_last_error(), "zigzag"));
    s2[1] = 1002;
    assert_int_equal(dt_layout_check(&l, 2, s2, m3), DT_SUCCESS);
    s2[1] = 15; /* divisible by 3, not by 6 */
    assert_int_equal(dt_layout_check(&l, 2, s2, m3), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "not divisible by 6"));

    l = dt_layout_1d(dt_shard(2, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_check(&l, 2, shape, m3), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "tensor dim 2"));
    l = dt_layout_1d(dt_shard(-1, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_check(&l, 2, shape, m3), DT_ERR_INVALID_ARGUMENT);

    int64_t s4[] = { 4, 4 };
    /* a dim sharded over two mesh dims is fine where each split divides */
    l = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(0, DT_ORDER_STRIPED));
    assert_int_equal(dt_layout_check(&l, 2, s4, m22), DT_SUCCESS);

    l = dt_layout_1d(dt_replicate());
    l.placements[0].kind = (dt_placement_kind)7;
    assert_int_equal(dt_layout_check(&l, 2, s4, m3), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "kind 7"));
    l = dt_layout_1d(dt_shard(0, (dt_order)9));
    assert_int_equal(dt_layout_check(&l, 2, s4, m3), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "order 9"));
    /* an unknown order is harmless where it is ignored (Replicate) */
    l = dt_layout_1d(dt_replicate());
    l.placements[0].order = (dt_order)9;
    assert_int_equal(dt_layout_check(&l, 2, s4, m3), DT_SUCCESS);

    l = dt_layout_1d(dt_replicate());
    l.ndim = 0;
    assert_int_equal(dt_layout_check(&l, 2, s4, m3), DT_ERR_INVALID_ARGUMENT);
    l.ndim = 4;
    assert_int_equal(dt_layout_check(&l, 2, s4, m3), DT_ERR_INVALID_ARGUMENT);
    l = dt_layout_1d(dt_replicate());
    int m0[] = { 0 };
    assert_int_equal(dt_layout_check(&l, 2, s4, m0), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_layout_check(NULL, 2, s4, m3), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_layout_check(&l, 2, NULL, m3), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_layout_check(&l, 2, s4, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_layout_check(&l, 0, s4, m3), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_layout_check(&l, DT_MAX_DIMS + 1, s4, m3), DT_ERR_INVALID_ARGUMENT);
    int64_t neg[] = { 4, -1 };
    assert_int_equal(dt_layout_check(&l, 2, neg, m3), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "-1"));
}

static void test_format(void **state) {
    (void)state;
    char buf[128];
    dt_layout l = dt_layout_2d(dt_shard(1, DT_ORDER_STRIPED), dt_replicate());
    dt_layout_format(&l, buf, sizeof buf);
    assert_string_equal(buf, "[Shard(1, striped), Replicate]");
    l = dt_layout_3d(dt_partial(), dt_shard(0, DT_ORDER_ZIGZAG),
                     dt_shard(2, DT_ORDER_CONTIGUOUS));
    dt_layout_format(&l, buf, sizeof buf);
    assert_string_equal(buf, "[Partial(sum), Shard(0, zigzag), Shard(2, contiguous)]");
    l = dt_layout_1d(dt_shard(0, (dt_order)9));
    dt_layout_format(&l, buf, sizeof buf);
    assert_string_equal(buf, "[Shard(0, order=9)]");
    dt_layout_format(NULL, buf, sizeof buf);
    assert_string_equal(buf, "(null layout)");
    /* truncation keeps the buffer terminated */
    char small[6];
    memset(small, 'x', sizeof small);
    l = dt_layout_1d(dt_replicate());
    dt_layout_format(&l, small, sizeof small);
    assert_int_equal(strlen(small), 5);
    assert_memory_equal(small, "[Repl", 5);
    l = dt_layout_replicated(3);
    dt_layout_format(&l, buf, sizeof buf);
    assert_string_equal(buf, "[Replicate, Replicate, Replicate]");
}

static void test_equal_and_names(void **state) {
    (void)state;
    dt_placement a = dt_replicate(), b = dt_replicate();
    b.dim = 5; /* ignored for Replicate */
    b.order = DT_ORDER_ZIGZAG;
    assert_true(dt_placement_equal(a, b));
    assert_true(dt_placement_equal(dt_partial(), dt_partial()));
    assert_false(dt_placement_equal(dt_partial(), dt_replicate()));
    assert_true(dt_placement_equal(dt_shard(1, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_STRIPED)));
    assert_false(dt_placement_equal(dt_shard(1, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_ZIGZAG)));
    assert_false(dt_placement_equal(dt_shard(1, DT_ORDER_STRIPED), dt_shard(0, DT_ORDER_STRIPED)));
    dt_layout x = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate());
    dt_layout y = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), b);
    assert_true(dt_layout_equal(&x, &y));
    y.placements[2] = dt_partial(); /* beyond ndim: ignored */
    assert_true(dt_layout_equal(&x, &y));
    dt_layout z = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    assert_false(dt_layout_equal(&x, &z));
    assert_false(dt_layout_equal(&x, NULL));
    assert_string_equal(dt_placement_kind_name(DT_SHARD), "Shard");
    assert_string_equal(dt_placement_kind_name(DT_PARTIAL), "Partial");
    assert_string_equal(dt_placement_kind_name((dt_placement_kind)42), "unknown");
    assert_string_equal(dt_order_name(DT_ORDER_ZIGZAG), "zigzag");
    assert_string_equal(dt_order_name((dt_order)-1), "unknown");
    dt_layout r = dt_layout_replicated(2);
    assert_int_equal(r.ndim, 2);
    assert_int_equal(r.placements[1].kind, DT_REPLICATE);
}

/* ---- a tensor dim sharded over several mesh dims ---------------------- */

typedef struct composed_case {
    int nm, sizes[DT_MAX_MESH_DIMS];
    dt_layout layout;   /* shards tensor dim 1 of 3 over two or three mesh dims */
} composed_case;

/* The chain of tensor dim `dim` under l, read here from the placements. */
static int chain_of(const dt_layout *l, int dim, int *ms) {
    int k = 0;
    for (int m = 0; m < l->ndim; m++)
        if (l->placements[m].kind == DT_SHARD && l->placements[m].dim == dim) ms[k++] = m;
    return k;
}

/* 1 if n splits along the chain by the definition: each length divisible
 * by its mesh dim's size (twice that for zigzag). */
static int chain_divides(const dt_layout *l, const int *sizes, const int *ms, int k, int64_t n) {
    for (int i = 0; i < k; i++) {
        const dt_placement p = l->placements[ms[i]];
        int64_t div = (p.order == DT_ORDER_ZIGZAG ? 2 : 1) * (int64_t)sizes[ms[i]];
        if (n % div) return 0;
        n /= sizes[ms[i]];
    }
    return 1;
}

/* The global indices the rank at coords holds along the chain, in local
 * order, by the definition: the outer mesh dim's list of the whole dim,
 * then the next one's list picking positions within that, and so on.
 * out holds n / (product of the chain's sizes) entries. */
static void composed_indices(const dt_layout *l, const int *sizes, const int *ms, int k,
                             const int *coords, int64_t n, int64_t *out) {
    int64_t *cur = malloc((size_t)(n + 1) * sizeof *cur), *pick = malloc((size_t)(n + 1) * sizeof *pick);
    assert_non_null(cur);
    assert_non_null(pick);
    int64_t len = n;
    for (int64_t g = 0; g < n; g++) cur[g] = g;
    for (int i = 0; i < k; i++) {
        const int P = sizes[ms[i]];
        h_order_indices(l->placements[ms[i]].order, len, P, coords[ms[i]], pick);
        for (int64_t x = 0; x < len / P; x++) pick[x] = cur[pick[x]];
        len /= P;
        memcpy(cur, pick, (size_t)len * sizeof *cur);
    }
    memcpy(out, cur, (size_t)len * sizeof *out);
    free(cur);
    free(pick);
}

static void test_composed_maps(void **state) {
    const composed_case *c = *state;
    const dt_layout *l = &c->layout;
    int ms[DT_MAX_MESH_DIMS];
    const int k = chain_of(l, 1, ms);
    assert_true(k >= 2);
    int got_ms[DT_MAX_MESH_DIMS];
    assert_int_equal(dt_layout_shard_dims(l, 1, got_ms), k);
    for (int i = 0; i < k; i++) assert_int_equal(got_ms[i], ms[i]);
    int64_t unit = 1, parts = 1; /* the smallest length every order divides */
    for (int i = 0; i < k; i++) {
        unit *= (l->placements[ms[i]].order == DT_ORDER_ZIGZAG ? 2 : 1) * (int64_t)c->sizes[ms[i]];
        parts *= c->sizes[ms[i]];
    }
    long bad_global = 0, bad_owner = 0, bad_local = 0, bad_cover = 0, bad_round = 0,
         bad_check = 0, bad_shape = 0, bad_other = 0;
    /* Every length up to 3 units: dt_layout_check agrees with the definition. */
    int64_t whole = 2; /* the other dims: divisible by anything on the mesh */
    for (int m = 0; m < c->nm; m++) whole *= c->sizes[m];
    for (int64_t n = 0; n <= 3 * unit; n++) {
        int64_t shape[3] = { whole, n, whole };
        int64_t ls[3];
        const int ok = chain_divides(l, c->sizes, ms, k, n);
        const dt_status st = dt_layout_check(l, 3, shape, c->sizes);
        bad_check += (st == DT_SUCCESS) != ok;
        if (ok && dt_layout_local_shape(l, 3, shape, c->sizes, ls) == DT_SUCCESS)
            bad_shape += ls[1] != n / parts;
    }
    const int64_t mults[] = { 0, 1, 2, 3 };
    for (size_t mi = 0; mi < sizeof mults / sizeof mults[0]; mi++) {
        const int64_t n = unit * mults[mi], cnt = n / parts;
        int64_t *list = malloc((size_t)(cnt + 1) * sizeof *list);
        int *seen = calloc((size_t)n + 1, sizeof *seen);
        assert_non_null(list);
        assert_non_null(seen);
        /* every coordinate of the mesh (those off the chain must not matter) */
        int world = 1;
        for (int m = 0; m < c->nm; m++) world *= c->sizes[m];
        for (int w = 0; w < world; w++) {
            int coords[DT_MAX_MESH_DIMS] = { 0 };
            h_coords(w, c->nm, c->sizes, coords);
            int on_chain_zero = 1; /* count each chain rank's indices once */
            for (int m = 0; m < c->nm; m++) {
                int in = 0;
                for (int i = 0; i < k; i++) in |= ms[i] == m;
                if (!in && coords[m] != 0) on_chain_zero = 0;
            }
            composed_indices(l, c->sizes, ms, k, coords, n, list);
            for (int64_t x = 0; x < cnt; x++) {
                const int64_t g = list[x];
                if (dt_layout_global_index(l, c->sizes, coords, 1, n, x) != g) bad_global++;
                int oc[DT_MAX_MESH_DIMS] = { -7, -7, -7 };
                if (dt_layout_owner(l, c->sizes, 1, n, g, oc) != x) bad_local++;
                for (int m = 0; m < c->nm; m++) {
                    int in = 0;
                    for (int i = 0; i < k; i++) in |= ms[i] == m;
                    if (in && oc[m] != coords[m]) bad_owner++;
                    if (!in && oc[m] != -7) bad_other++;
                }
                if (on_chain_zero) seen[g]++;
            }
        }
        for (int64_t g = 0; g < n; g++) {
            bad_cover += seen[g] != 1;
            int oc[DT_MAX_MESH_DIMS] = { 0, 0, 0 };
            const int64_t x = dt_layout_owner(l, c->sizes, 1, n, g, oc);
            int in_range = x >= 0 && x < cnt;
            for (int i = 0; i < k; i++) in_range &= oc[ms[i]] >= 0 && oc[ms[i]] < c->sizes[ms[i]];
            if (!in_range || dt_layout_global_index(l, c->sizes, oc, 1, n, x) != g) bad_round++;
            if (dt_layout_owner(l, c->sizes, 1, n, g, NULL) != x) bad_round++;
        }
        free(list);
        free(seen);
    }
    if (bad_global + bad_owner + bad_local + bad_cover + bad_round + bad_check + bad_shape + bad_other)
        fprintf(stderr, "  global %ld owner %ld local %ld cover %ld round %ld check %ld shape %ld "
                "other %ld\n", bad_global, bad_owner, bad_local, bad_cover, bad_round, bad_check,
                bad_shape, bad_other);
    assert_int_equal(bad_global, 0);
    assert_int_equal(bad_owner, 0);
    assert_int_equal(bad_local, 0);
    assert_int_equal(bad_cover, 0);
    assert_int_equal(bad_round, 0);
    assert_int_equal(bad_check, 0);
    assert_int_equal(bad_shape, 0);
    assert_int_equal(bad_other, 0);
}

/* The examples by hand, errors that name what does not divide, and
 * the one-dim maps through the composed entry points. */
static void test_composed_examples(void **state) {
    (void)state;
    int m22[] = { 2, 2 }, m222[] = { 2, 2, 2 }, m4[] = { 4 };
    /* striped over mesh dim 0, then contiguous over mesh dim 1: n = 16 */
    dt_layout l = dt_layout_2d(dt_shard(0, DT_ORDER_STRIPED), dt_shard(0, DT_ORDER_CONTIGUOUS));
    const int64_t sc[2][2][4] = { { { 0, 2, 4, 6 }, { 8, 10, 12, 14 } },
                                  { { 1, 3, 5, 7 }, { 9, 11, 13, 15 } } };
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int x = 0; x < 4; x++) {
                int co[2] = { a, b };
                assert_int_equal(dt_layout_global_index(&l, m22, co, 0, 16, x), sc[a][b][x]);
            }
    /* zigzag, then contiguous: n = 8 */
    l = dt_layout_2d(dt_shard(0, DT_ORDER_ZIGZAG), dt_shard(0, DT_ORDER_CONTIGUOUS));
    const int64_t zc[2][2][2] = { { { 0, 1 }, { 6, 7 } }, { { 2, 3 }, { 4, 5 } } };
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int x = 0; x < 2; x++) {
                int co[2] = { a, b };
                assert_int_equal(dt_layout_global_index(&l, m22, co, 0, 8, x), zc[a][b][x]);
            }
    int co[3] = { 0, 0, 0 };
    assert_int_equal(dt_layout_owner(&l, m22, 0, 8, 6, co), 0);
    assert_int_equal(co[0], 0);
    assert_int_equal(co[1], 1);
    /* a dim no mesh dim shards maps x to x; one mesh dim is dt_order_global */
    assert_int_equal(dt_layout_global_index(&l, m22, co, 1, 8, 5), 5);
    assert_int_equal(dt_layout_owner(&l, m22, 1, 8, 5, NULL), 5);
    dt_layout one = dt_layout_1d(dt_shard(0, DT_ORDER_ZIGZAG));
    int c1[1] = { 1 };
    assert_int_equal(dt_layout_global_index(&one, m4, c1, 0, 16, 3),
                     dt_order_global(DT_ORDER_ZIGZAG, 16, 4, 1, 3));
    assert_int_equal(dt_layout_shard_dims(&one, 0, NULL), 1);
    assert_int_equal(dt_layout_shard_dims(&one, 1, NULL), 0);
    assert_int_equal(dt_layout_shard_dims(NULL, 0, NULL), 0);

    /* local shapes */
    int64_t s[] = { 8, 3 }, ls[2];
    l = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(0, DT_ORDER_STRIPED));
    assert_int_equal(dt_layout_local_shape(&l, 2, s, m22, ls), DT_SUCCESS);
    assert_int_equal(ls[0], 2);
    assert_int_equal(ls[1], 3);
    l = dt_layout_3d(dt_shard(0, DT_ORDER_ZIGZAG), dt_shard(1, DT_ORDER_CONTIGUOUS),
                     dt_shard(0, DT_ORDER_STRIPED));
    int64_t s3[] = { 16, 4 };
    assert_int_equal(dt_layout_local_shape(&l, 2, s3, m222, ls), DT_SUCCESS);
    assert_int_equal(ls[0], 4);
    assert_int_equal(ls[1], 2);

    /* errors name the length each mesh dim splits */
    int64_t s6[] = { 4, 6 };
    l = dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_check(&l, 2, s6, m22), DT_ERR_INVALID_ARGUMENT);
    assert_string_equal(dt_last_error(), "tensor dim 1 of length 6 is cut to 3 by outer mesh dim "
                                         "0, and 3 is not divisible by 2 (mesh dim 1, Shard(1, "
                                         "contiguous))");
    int64_t s4[] = { 4, 4 };
    l = dt_layout_2d(dt_shard(1, DT_ORDER_CONTIGUOUS), dt_shard(1, DT_ORDER_ZIGZAG));
    assert_int_equal(dt_layout_check(&l, 2, s4, m22), DT_ERR_INVALID_ARGUMENT);
    assert_string_equal(dt_last_error(), "tensor dim 1 of length 4 is cut to 2 by outer mesh dim "
                                         "0, and 2 is not divisible by 4 = 2 x 2 (mesh dim 1, "
                                         "Shard(1, zigzag))");
    l = dt_layout_3d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(0, DT_ORDER_STRIPED),
                     dt_shard(0, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_check(&l, 2, s4, m222), DT_ERR_INVALID_ARGUMENT);
    assert_string_equal(dt_last_error(), "tensor dim 0 of length 4 is cut to 1 by outer mesh dims "
                                         "0 and 1, and 1 is not divisible by 2 (mesh dim 2, "
                                         "Shard(0, contiguous))");
    l = dt_layout_2d(dt_shard(1, DT_ORDER_ZIGZAG), dt_shard(1, DT_ORDER_CONTIGUOUS));
    assert_int_equal(dt_layout_check(&l, 2, s6, m22), DT_ERR_INVALID_ARGUMENT);
    assert_string_equal(dt_last_error(), "tensor dim 1 of length 6 is not divisible by 4 = 2 x 2 "
                                         "(mesh dim 0, Shard(1, zigzag))");
    int64_t s8[] = { 4, 8 };
    assert_int_equal(dt_layout_check(&l, 2, s8, m22), DT_SUCCESS);

    /* formatting: each mesh dim's placement, as before */
    char buf[128];
    l = dt_layout_2d(dt_shard(1, DT_ORDER_STRIPED), dt_shard(1, DT_ORDER_CONTIGUOUS));
    dt_layout_format(&l, buf, sizeof buf);
    assert_string_equal(buf, "[Shard(1, striped), Shard(1, contiguous)]");
}

#define N_ORDERS 3
#define MAX_P 8

int main(void) {
    static const dt_order orders[N_ORDERS] = { DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED,
                                               DT_ORDER_ZIGZAG };
    map_case cases[N_ORDERS * MAX_P];
    char names[N_ORDERS * MAX_P][64];
    enum { MAX_COMPOSED = 256 };
    static composed_case ccases[MAX_COMPOSED];
    static char cnames[MAX_COMPOSED][160];
    struct CMUnitTest tests[N_ORDERS * MAX_P + MAX_COMPOSED + 8];
    size_t n = 0;
    for (int o = 0; o < N_ORDERS; o++)
        for (int P = 1; P <= MAX_P; P++) {
            size_t k = (size_t)(o * MAX_P + P - 1);
            cases[k] = (map_case){ orders[o], P };
            snprintf(names[k], sizeof names[k], "order_maps/%s,P=%d", dt_order_name(orders[o]), P);
            tests[n++] = (struct CMUnitTest){ names[k], test_order_maps, NULL, NULL, &cases[k] };
        }
    /* dim 1 over both mesh dims of a 2-D mesh, every pair of orders; over
     * two of a 3-D mesh's dims (the third Replicate, Partial or sharding
     * dim 0 or 2), and over all three, every combination */
    size_t nc = 0;
    const int m2[][2] = { { 2, 2 }, { 2, 3 }, { 3, 2 }, { 2, 4 }, { 4, 2 } };
    for (size_t mi = 0; mi < sizeof m2 / sizeof m2[0]; mi++)
        for (int a = 0; a < N_ORDERS; a++)
            for (int b = 0; b < N_ORDERS; b++)
                ccases[nc++] = (composed_case){ 2, { m2[mi][0], m2[mi][1], 1 },
                                                dt_layout_2d(dt_shard(1, orders[a]),
                                                             dt_shard(1, orders[b])) };
    const int m3[][3] = { { 2, 2, 2 }, { 3, 2, 2 } };
    const dt_placement others[] = { dt_replicate(), dt_partial(), dt_shard(0, DT_ORDER_ZIGZAG),
                                    dt_shard(2, DT_ORDER_STRIPED) };
    for (size_t mi = 0; mi < 2; mi++) {
        for (int skip = 0; skip < 3; skip++)   /* the mesh dim not on the chain */
            for (int a = 0; a < N_ORDERS; a++)
                for (int b = 0; b < N_ORDERS; b++) {
                    composed_case cc = { 3, { m3[mi][0], m3[mi][1], m3[mi][2] },
                                         dt_layout_replicated(3) };
                    int k = 0;
                    for (int m = 0; m < 3; m++)
                        cc.layout.placements[m] =
                            m == skip ? others[(a + b + skip) % 4]
                                      : dt_shard(1, orders[k++ == 0 ? a : b]);
                    ccases[nc++] = cc;
                }
        for (int a = 0; a < N_ORDERS; a++)
            for (int b = 0; b < N_ORDERS; b++)
                for (int c = 0; c < N_ORDERS; c++)
                    ccases[nc++] = (composed_case){ 3, { m3[mi][0], m3[mi][1], m3[mi][2] },
                                                    dt_layout_3d(dt_shard(1, orders[a]),
                                                                 dt_shard(1, orders[b]),
                                                                 dt_shard(1, orders[c])) };
    }
    for (size_t i = 0; i < nc; i++) {
        char ls[80], ms[16];
        h_layout_short(&ccases[i].layout, ls, sizeof ls);
        if (ccases[i].nm == 2)
            snprintf(ms, sizeof ms, "%dx%d", ccases[i].sizes[0], ccases[i].sizes[1]);
        else
            snprintf(ms, sizeof ms, "%dx%dx%d", ccases[i].sizes[0], ccases[i].sizes[1],
                     ccases[i].sizes[2]);
        snprintf(cnames[i], sizeof cnames[i], "composed_maps/mesh=%s,%s", ms, ls);
        tests[n++] = (struct CMUnitTest){ cnames[i], test_composed_maps, NULL, NULL, &ccases[i] };
    }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_composed_examples);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_order_examples);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_local_shape);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_check_errors);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_format);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_equal_and_names);
    return h_run_cases("layout", tests, n);
}
