/* tests/test_layout.c — the pure Layout functions: index maps against the
 * definitions (enumerated by tests/harness.c, not computed by layout.c),
 * owner/local/global round trips for P = 1..8, local shapes, dt_layout_check
 * errors and their messages, formatting, equality and names. */
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
    l = dt_layout_2d(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_shard(0, DT_ORDER_STRIPED));
    assert_int_equal(dt_layout_check(&l, 2, s4, m22), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "sharded by mesh dims 0 and 1"));

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

#define N_ORDERS 3
#define MAX_P 8

int main(void) {
    static const dt_order orders[N_ORDERS] = { DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED,
                                               DT_ORDER_ZIGZAG };
    map_case cases[N_ORDERS * MAX_P];
    char names[N_ORDERS * MAX_P][64];
    struct CMUnitTest tests[N_ORDERS * MAX_P + 8];
    size_t n = 0;
    for (int o = 0; o < N_ORDERS; o++)
        for (int P = 1; P <= MAX_P; P++) {
            size_t k = (size_t)(o * MAX_P + P - 1);
            cases[k] = (map_case){ orders[o], P };
            snprintf(names[k], sizeof names[k], "order_maps/%s,P=%d", dt_order_name(orders[o]), P);
            tests[n++] = (struct CMUnitTest){ names[k], test_order_maps, NULL, NULL, &cases[k] };
        }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_order_examples);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_local_shape);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_check_errors);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_format);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_equal_and_names);
    return h_run_cases("layout", tests, n);
}
