/* tests/test_ring.c — the ring rotator on the local transport, P = 1..8,
 * both directions, each way of making one (own buffers, the caller's, the
 * caller's without the agreement check), each with its first block in the
 * ring's buffer or sent from three buffers of the caller's
 * (dt_ring_start_from): at step t rank j holds the block rank (j -/+ t) mod
 * P filled in, every block is seen exactly once in P steps, the two buffers
 * are the only ones ever handed out, and misuse is rejected; and steps
 * over the caller's memory (dt_ring_start_into), scattered. Rank threads
 * only record; the main thread asserts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/ring.h"
#include "dtensor/context.h"

#define MAXP 8
#define BYTES 1001 /* odd: the ring moves bytes, not elements */

/* cpu + local, whatever the machine has: the ring's buffers are read on the host. */
static dt_status launch_cpu(int p, dt_rank_fn fn, void *arg) {
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CPU;
    o.transport = DT_TRANSPORT_LOCAL;
    o.timeout_ms = 10000;
    return dt_launch(p, fn, arg, &o);
}

/* How a case makes its ring. */
enum { MAKE_OWN, MAKE_IN, MAKE_IN_AGREED, MAKE_COUNT };
static const char *const make_names[MAKE_COUNT] = {"create", "create_in", "create_in_agreed"};

typedef struct ring_case {
    int p;
    dt_ring_direction dir;
    int make;                 /* MAKE_* */
    int from;                 /* step 0 sends FROM_SIZES's parts (dt_ring_start_from) */
    dt_status st[MAXP];
    char msg[MAXP][256];
    int wrong_block[MAXP];    /* steps whose block was not the expected one */
    int wrong_source[MAXP];   /* steps where dt_ring_source disagreed */
    int seen[MAXP][MAXP];     /* seen[j][k]: times rank j saw rank k's block in P steps */
    int buffers[MAXP];        /* distinct buffer addresses handed out */
    int alternates[MAXP];     /* 1 if the current buffer alternated every step */
} ring_case;

static unsigned char pattern(int owner, size_t i) { return (unsigned char)(owner * 37 + i * 11 + 5); }

/* The parts a rank's first block is sent from in the `from` cases: uneven,
 * one a single byte. */
#define FROM_PARTS 3
static const size_t from_sizes[FROM_PARTS] = {400, 1, BYTES - 401};
#define POISON 0xEE /* no owner's pattern: pattern() takes every byte value */

/* Which rank's block does `buf` hold? -1 if none exactly. */
static int owner_of(const unsigned char *buf, int p) {
    for (int k = 0; k < p; k++) {
        size_t i = 0;
        while (i < BYTES && buf[i] == pattern(k, i)) i++;
        if (i == BYTES) return k;
    }
    return -1;
}

static dt_status rank_ring(dt_context *ctx, void *arg) {
    ring_case *c = arg;
    int j = dt_context_rank(ctx), p = c->p;
    dt_ring *ring = NULL;
    unsigned char *mine = c->make == MAKE_OWN ? NULL : malloc(2 * BYTES);   /* the caller's */
    unsigned char *part[FROM_PARTS] = {NULL};
    dt_status st = c->make == MAKE_OWN ? dt_ring_create(dt_context_comm(ctx), BYTES, c->dir, &ring)
                   : c->make == MAKE_IN
                       ? dt_ring_create_in(dt_context_comm(ctx), BYTES, c->dir, mine, &ring)
                       : dt_ring_create_in_agreed(dt_context_comm(ctx), BYTES, c->dir, mine, &ring);
    if (st != DT_SUCCESS) goto out;
    if (mine && dt_ring_current(ring) != mine) c->wrong_block[j]++;   /* not the caller's buffer */
    unsigned char *b = dt_ring_current(ring);
    /* The block: in the ring's buffer, or in the parts with the buffer poisoned. */
    for (int i = 0, off = 0; c->from && i < FROM_PARTS; off += (int)from_sizes[i++]) {
        part[i] = malloc(from_sizes[i]);
        if (!part[i]) {
            st = DT_ERR_OUT_OF_MEMORY;
            goto out;
        }
        for (size_t e = 0; e < from_sizes[i]; e++) part[i][e] = pattern(j, off + e);
    }
    for (size_t i = 0; i < BYTES; i++) b[i] = c->from ? POISON : pattern(j, i);
    void *addr[2] = {dt_ring_current(ring), NULL};
    c->alternates[j] = 1;
    /* Steps 0..P: P blocks seen, then the own block back home. */
    for (int t = 0; t <= p; t++) {
        int want = c->dir == DT_RING_FORWARD ? ((j - t) % p + p) % p : (j + t) % p;
        const unsigned char *cur = dt_ring_current(ring);
        int from = c->from && t == 0;   /* this step's block is in the parts */
        int got = from ? (cur[0] == POISON && owner_of(cur, p) < 0 ? j : -1) : owner_of(cur, p);
        if (got != want) c->wrong_block[j]++;
        if (dt_ring_source(ring) != want || dt_ring_step_index(ring) != t) c->wrong_source[j]++;
        if (t < p && got >= 0) c->seen[j][got]++;
        void *expect_addr = addr[t % 2];
        if (t == 1) addr[1] = (void *)cur;
        else if (t > 0 && cur != expect_addr) c->alternates[j] = 0;
        if (t == p) break;
        st = from ? dt_ring_start_from(ring, (const void *const *)part, from_sizes, FROM_PARTS)
                  : dt_ring_start(ring);
        if (st != DT_SUCCESS) goto out;
        /* Compute overlaps the transfer: the current block stays readable
         * (and a step sending from the parts leaves it alone). */
        if (from ? cur[0] != POISON || owner_of(cur, p) >= 0 : owner_of(cur, p) != want)
            c->wrong_block[j]++;
        st = dt_ring_wait(ring);
        if (st != DT_SUCCESS) goto out;
        for (int i = 0, off = 0; from && i < FROM_PARTS; off += (int)from_sizes[i++])
            for (size_t e = 0; e < from_sizes[i]; e++)
                if (part[i][e] != pattern(j, off + e)) c->wrong_block[j]++;   /* written */
    }
    c->buffers[j] = p == 1 || addr[1] == addr[0] ? 1 : 2;
    if (p > 1 && addr[1] == addr[0]) c->alternates[j] = 0;
out:
    c->st[j] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[j], sizeof c->msg[j], "%s", dt_last_error());
    dt_ring_destroy(ring);
    free(mine);
    for (int i = 0; i < FROM_PARTS; i++) free(part[i]);
    return st;
}

static void test_ring_delivers_every_block_once(void **state) {
    (void)state;
    for (int from = 0; from < 2; from++)
    for (int make = 0; make < MAKE_COUNT; make++)
        for (int dir = 0; dir < DT_RING_DIRECTION_COUNT; dir++)
            for (int p = 1; p <= MAXP; p++) {
                ring_case c = {.p = p, .dir = (dt_ring_direction)dir, .make = make, .from = from};
                dt_status st = launch_cpu(p, rank_ring, &c);
                if (st != DT_SUCCESS)
                    print_error("ring/%s/%s/P=%d%s: %s\n", make_names[make],
                                dt_ring_direction_name(c.dir), p, from ? "/from parts" : "",
                                dt_last_error());
                assert_int_equal(st, DT_SUCCESS);
                for (int j = 0; j < p; j++) {
                    assert_int_equal(c.st[j], DT_SUCCESS);
                    assert_int_equal(c.wrong_block[j], 0);
                    assert_int_equal(c.wrong_source[j], 0);
                    for (int k = 0; k < p; k++) assert_int_equal(c.seen[j][k], 1);
                    assert_int_equal(c.alternates[j], 1);
                    assert_int_equal(c.buffers[j], p == 1 ? 1 : 2);
                }
            }
}

/* dt_ring_start_into on a ring of no buffers (0 bytes): each block moves
 * in INTO_PARTS uneven parts (more than DT_RING_MAX_PARTS: dt_ring_reserve),
 * sent from where the step before landed them and landing scattered,
 * reversed, in a slot of the step's own; every other step chained. At step
 * t rank j's slot t holds rank (j -/+ t) mod P's block, after P steps its
 * own again, and the slots the ring did not write keep their poison. */
#define INTO_PARTS 6
static const size_t into_sizes[INTO_PARTS] = {300, 1, 200, 0, 250, BYTES - 751};

/* Offset of part i within a slot: the parts in reverse order. */
static size_t into_offset(int i) {
    size_t off = 0;
    for (int k = INTO_PARTS - 1; k > i; k--) off += into_sizes[k];
    return off;
}

/* The block a slot holds, put back in order (-1: none exactly). */
static int into_owner(const unsigned char *slot, int p) {
    unsigned char block[BYTES];
    for (int i = 0, off = 0; i < INTO_PARTS; off += (int)into_sizes[i++])
        memcpy(block + off, slot + into_offset(i), into_sizes[i]);
    return owner_of(block, p);
}

static dt_status rank_into(dt_context *ctx, void *arg) {
    ring_case *c = arg;
    int j = dt_context_rank(ctx), p = c->p;
    dt_ring *ring = NULL;
    unsigned char *slots = malloc((size_t)(p + 2) * BYTES), *own = malloc(BYTES);
    dt_status st = slots && own ? DT_SUCCESS : DT_ERR_OUT_OF_MEMORY;
    if (st == DT_SUCCESS) {
        memset(slots, POISON, (size_t)(p + 2) * BYTES);
        for (size_t i = 0; i < BYTES; i++) own[i] = pattern(j, i);
        st = dt_ring_create_in_agreed(dt_context_comm(ctx), 0, c->dir, own, &ring);
    }
    const void *from[INTO_PARTS];
    void *into[INTO_PARTS];
    if (st == DT_SUCCESS) {   /* one part too many before the reserve */
        for (int i = 0; i < INTO_PARTS; i++) from[i] = into[i] = own;
        if (dt_ring_start_into(ring, from, into, into_sizes, INTO_PARTS, 0) !=
            DT_ERR_INVALID_ARGUMENT)
            c->wrong_block[j]++;
        st = dt_ring_reserve(ring, INTO_PARTS);
    }
    for (int t = 1; st == DT_SUCCESS && t <= p; t++) {
        for (int i = 0, off = 0; i < INTO_PARTS; off += (int)into_sizes[i++]) {
            from[i] = t == 1 ? own + off : slots + (size_t)(t - 1) * BYTES + into_offset(i);
            into[i] = slots + (size_t)t * BYTES + into_offset(i);
        }
        st = dt_ring_start_into(ring, from, into, into_sizes, INTO_PARTS, t % 2);
        if (st == DT_SUCCESS) st = dt_ring_wait(ring);
        if (st != DT_SUCCESS) break;
        int want = c->dir == DT_RING_FORWARD ? ((j - t) % p + p) % p : (j + t) % p;
        if (into_owner(slots + (size_t)t * BYTES, p) != want) c->wrong_block[j]++;
        if (dt_ring_source(ring) != (t == p ? j : want) || dt_ring_step_index(ring) != t)
            c->wrong_source[j]++;
    }
    if (st == DT_SUCCESS)   /* slot 0 and the one past the last: never landed in */
        for (size_t i = 0; i < BYTES; i++)
            if (slots[i] != POISON || slots[(size_t)(p + 1) * BYTES + i] != POISON) {
                c->wrong_block[j]++;
                break;
            }
    c->st[j] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[j], sizeof c->msg[j], "%s", dt_last_error());
    dt_ring_destroy(ring);
    free(slots);
    free(own);
    return st;
}

static void test_ring_start_into(void **state) {
    (void)state;
    for (int dir = 0; dir < DT_RING_DIRECTION_COUNT; dir++)
        for (int p = 1; p <= MAXP; p++) {
            ring_case c = {.p = p, .dir = (dt_ring_direction)dir};
            dt_status st = launch_cpu(p, rank_into, &c);
            if (st != DT_SUCCESS)
                print_error("ring/into/%s/P=%d: %s\n", dt_ring_direction_name(c.dir), p, c.msg[0]);
            assert_int_equal(st, DT_SUCCESS);
            for (int j = 0; j < p; j++) {
                assert_int_equal(c.st[j], DT_SUCCESS);
                assert_int_equal(c.wrong_block[j], 0);
                assert_int_equal(c.wrong_source[j], 0);
            }
        }
}

/* 10,000 steps on 3 ranks: the rotation stays exact. */
static dt_status rank_many_steps(dt_context *ctx, void *arg) {
    ring_case *c = arg;
    int j = dt_context_rank(ctx), p = c->p;
    dt_ring *ring = NULL;
    dt_status st = dt_ring_create(dt_context_comm(ctx), BYTES, DT_RING_FORWARD, &ring);
    if (st == DT_SUCCESS) {
        unsigned char *b = dt_ring_current(ring);
        for (size_t i = 0; i < BYTES; i++) b[i] = pattern(j, i);
    }
    for (int t = 1; st == DT_SUCCESS && t <= 10000; t++) {
        st = dt_ring_step(ring);
        if (st == DT_SUCCESS && owner_of(dt_ring_current(ring), p) != ((j - t) % p + p) % p)
            c->wrong_block[j]++;
    }
    c->st[j] = st;
    dt_ring_destroy(ring);
    return st;
}

static void test_ring_10000_steps(void **state) {
    (void)state;
    ring_case c = {.p = 3};
    assert_int_equal(launch_cpu(3, rank_many_steps, &c), DT_SUCCESS);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(c.st[j], DT_SUCCESS);
        assert_int_equal(c.wrong_block[j], 0);
    }
}

/* Misuse: NULL arguments, wait before start, start twice, unknown direction,
 * ranks disagreeing on the size. */
static dt_status rank_misuse(dt_context *ctx, void *arg) {
    ring_case *c = arg;
    int j = dt_context_rank(ctx);
    dt_comm *comm = dt_context_comm(ctx);
    dt_ring *ring = NULL, *bad = (dt_ring *)1;
    int fails = 0;
    fails += dt_ring_create(NULL, 8, DT_RING_FORWARD, &ring) != DT_ERR_INVALID_ARGUMENT;
    fails += dt_ring_create(comm, 8, DT_RING_FORWARD, NULL) != DT_ERR_INVALID_ARGUMENT;
    fails += dt_ring_create(comm, 8, (dt_ring_direction)9, &bad) != DT_ERR_INVALID_ARGUMENT;
    fails += bad != (dt_ring *)1;   /* a rejected call writes no output handle */
    fails += dt_ring_start(NULL) != DT_ERR_INVALID_ARGUMENT;
    dt_status st = dt_ring_create(comm, 64, DT_RING_BACKWARD, &ring);
    if (st == DT_SUCCESS) {
        fails += dt_ring_wait(ring) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start(ring) != DT_SUCCESS;
        fails += dt_ring_start(ring) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_wait(ring) != DT_SUCCESS;
        fails += dt_ring_step_index(ring) != 1;
        /* dt_ring_start_from: the parts must hold the ring's bytes, 1 to
         * DT_RING_MAX_PARTS of them, none NULL; one step at a time. */
        char a[64], z[64];
        const void *two[2] = {a, z}, *holed[2] = {a, NULL}, *many[DT_RING_MAX_PARTS + 1];
        const size_t halves[2] = {32, 32}, short_[2] = {32, 31}, wraps[2] = {SIZE_MAX, 65};
        size_t sixteenths[DT_RING_MAX_PARTS + 1];
        for (int i = 0; i <= DT_RING_MAX_PARTS; i++) {
            many[i] = a;
            sixteenths[i] = i < DT_RING_MAX_PARTS ? 64 / DT_RING_MAX_PARTS : 0;
        }
        fails += dt_ring_start_from(NULL, two, halves, 2) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_from(ring, two, halves, 0) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_from(ring, NULL, halves, 2) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_from(ring, two, NULL, 2) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_from(ring, holed, halves, 2) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_from(ring, two, short_, 2) != DT_ERR_INVALID_ARGUMENT;
        fails += !strstr(dt_last_error(), "63 bytes");
        fails += dt_ring_start_from(ring, two, wraps, 2) != DT_ERR_INVALID_ARGUMENT;   /* sums to 64 */
        fails += !strstr(dt_last_error(), "more than");
        fails += dt_ring_start_from(ring, many, sixteenths, DT_RING_MAX_PARTS + 1) !=
                 DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_step_index(ring) != 1;   /* none of those started a step */
        memset(a, 1, sizeof a);
        memset(z, 2, sizeof z);
        fails += dt_ring_start_from(ring, two, halves, 2) != DT_SUCCESS;
        fails += dt_ring_start_from(ring, two, halves, 2) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start(ring) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_wait(ring) != DT_SUCCESS;
        fails += dt_ring_step_index(ring) != 2;
        /* dt_ring_start_into and dt_ring_reserve: 1 to the reserved parts,
         * none NULL on either side where it moves bytes (landing apart
         * from the parts sent: a peer reads those meanwhile). */
        char ra[64], rz[64];
        void *dst[2] = {ra, rz}, *dst_holed[2] = {ra, NULL};
        fails += dt_ring_start_into(NULL, two, dst, halves, 2, 0) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_into(ring, two, NULL, halves, 2, 0) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_into(ring, two, dst, halves, 0, 0) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_start_into(ring, two, dst_holed, halves, 2, 0) != DT_ERR_INVALID_ARGUMENT;
        fails += !strstr(dt_last_error(), "receiving");
        fails += dt_ring_start_into(ring, holed, dst, halves, 2, 1) != DT_ERR_INVALID_ARGUMENT;
        fails += !strstr(dt_last_error(), "sending");
        fails += dt_ring_reserve(NULL, 2) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_reserve(ring, 0) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_reserve(ring, DT_RING_RESERVE_MAX + 1) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_step_index(ring) != 2;   /* none of those started a step */
        fails += dt_ring_start_into(ring, two, dst, halves, 2, 1) != DT_SUCCESS;
        fails += dt_ring_reserve(ring, 8) != DT_ERR_INVALID_ARGUMENT;   /* a step in flight */
        fails += dt_ring_start_into(ring, two, dst, halves, 2, 0) != DT_ERR_INVALID_ARGUMENT;
        fails += dt_ring_wait(ring) != DT_SUCCESS;
        fails += dt_ring_step_index(ring) != 3;
    }
    dt_ring_destroy(ring);
    ring = NULL;
    /* Rank 0 asks for a different size: every rank learns it at creation. */
    st = dt_ring_create(comm, j == 0 ? 32 : 64, DT_RING_FORWARD, &ring);
    fails += (c->p > 1 ? st != DT_ERR_MISMATCH : st != DT_SUCCESS) || (st != DT_SUCCESS && ring);
    if (st == DT_ERR_MISMATCH && !strstr(dt_last_error(), "disagree")) fails++;
    dt_ring_destroy(ring);
    c->wrong_block[j] = fails;
    c->st[j] = DT_SUCCESS;
    return DT_SUCCESS;
}

static void test_ring_misuse(void **state) {
    (void)state;
    for (int p = 1; p <= 4; p++) {
        ring_case c = {.p = p};
        assert_int_equal(launch_cpu(p, rank_misuse, &c), DT_SUCCESS);
        for (int j = 0; j < p; j++) assert_int_equal(c.wrong_block[j], 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_delivers_every_block_once),
        cmocka_unit_test(test_ring_start_into),
        cmocka_unit_test(test_ring_10000_steps),
        cmocka_unit_test(test_ring_misuse),
    };
    return cmocka_run_group_tests_name("ring rotator (cpu+local, P=1..8)", tests, NULL, NULL);
}
