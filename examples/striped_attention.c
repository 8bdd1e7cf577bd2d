/* examples/striped_attention.c — Striped Attention, step 1: the permutation.
 *
 * With P ranks, striping puts token i on rank i mod P, so that under a causal
 * mask every rank does about the same work on every ring step. This example
 * shows the permutation that does it and checks it, on P ranks of this
 * process:
 *   1. the token order after permute_striped, which tokens each rank holds
 *      under Shard(0, striped), and the round trip back;
 *   2. a [S, 4] tensor with value token*10 + hidden permuted on dim 0: every
 *      hidden vector travels intact with its token;
 *   3. striped sharding by the library (dt_tensor_shard with the striped
 *      order) gives every rank the same tokens as contiguous sharding of the
 *      permuted tensor.
 * The attention itself (forward and backward over the ring) comes next.
 *
 * Run: make run   or   build/examples/striped_attention --ranks 4 --seq 16
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

#define HIDDEN 4
#define MAX_SEQ 4096

typedef struct demo {
    int ranks, seq;
    float striped[DT_MAX_WORLD_SIZE][MAX_SEQ];    /* tokens each rank holds, striped shard */
    float permuted[DT_MAX_WORLD_SIZE][MAX_SEQ];   /* contiguous shard of the permuted tensor */
    int local_len;
} demo;

static void usage(FILE *f) {
    fprintf(f, "usage: striped_attention [--ranks P] [--seq S]\n"
               "  --ranks P  ranks (threads of this process), 1..64, default 4\n"
               "  --seq S    tokens, a multiple of P, at most %d, default 16\n", MAX_SEQ);
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi) {
        fprintf(stderr, "striped_attention: %s takes an integer in [%d, %d], got '%s'\n", flag, lo,
                hi, v ? v : "(nothing)");
        return 0;
    }
    *out = (int)x;
    return 1;
}

static void fail(const char *what, dt_status st) {
    fprintf(stderr, "striped_attention: %s failed: %s: %s\n", what, dt_status_name(st),
            dt_last_error());
    exit(1);
}

/* The tokens 0..S-1 as a local fp32 tensor [S]. */
static dt_status token_ids(dt_context *ctx, int seq, dt_tensor **out) {
    int64_t shape[1] = {seq};
    DT_TRY(dt_tensor_create(ctx, NULL, DT_F32, 1, shape, NULL, out));
    float *ids = malloc((size_t)seq * sizeof *ids);
    if (!ids) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < seq; i++) ids[i] = (float)i;
    dt_status st = dt_tensor_set_local(*out, ids, (size_t)seq * sizeof *ids);
    free(ids);
    return st;
}

/* Every rank: shard the token ids striped, and shard the permuted ids
 * contiguously; record what each rank holds. */
static dt_status rank_demo(dt_context *ctx, void *arg) {
    demo *d = arg;
    int rank = dt_context_rank(ctx);
    dt_mesh *mesh = NULL;
    dt_tensor *ids = NULL, *perm = NULL, *a = NULL, *b = NULL;
    dt_status st;
    int sizes[1] = {d->ranks};
    const char *names[1] = {"sp"};
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 1, sizes, names, &mesh), out);
    if (rank == 0) {
        DT_TRY_GOTO(st, token_ids(ctx, d->seq, &ids), out);
        DT_TRY_GOTO(st, dt_tensor_permute_striped(ids, 0, d->ranks, &perm), out);
    }
    dt_layout striped = dt_layout_1d(dt_shard(0, DT_ORDER_STRIPED));
    dt_layout contiguous = dt_layout_1d(dt_shard(0, DT_ORDER_CONTIGUOUS));
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, ids, &striped, &a), out);
    DT_TRY_GOTO(st, dt_tensor_shard(mesh, 0, perm, &contiguous, &b), out);
    d->local_len = (int)dt_tensor_local_numel(a);
    DT_TRY_GOTO(st, dt_tensor_get_local(a, d->striped[rank], dt_tensor_local_bytes(a)), out);
    DT_TRY_GOTO(st, dt_tensor_get_local(b, d->permuted[rank], dt_tensor_local_bytes(b)), out);
out:
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_tensor_destroy(perm);
    dt_tensor_destroy(ids);
    dt_mesh_destroy(mesh);
    return st;
}

/* One rank: the permutation itself, printed. */
static dt_status show_permutation(dt_context *ctx, void *arg) {
    demo *d = arg;
    int seq = d->seq, p = d->ranks, bad = 0;
    dt_tensor *ids = NULL, *perm = NULL, *back = NULL, *x = NULL, *xp = NULL;
    float *buf = malloc((size_t)seq * HIDDEN * sizeof *buf);
    dt_status st = buf ? DT_SUCCESS : dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != DT_SUCCESS) return st;

    DT_TRY_GOTO(st, token_ids(ctx, seq, &ids), out);
    DT_TRY_GOTO(st, dt_tensor_permute_striped(ids, 0, p, &perm), out);
    DT_TRY_GOTO(st, dt_tensor_unpermute_striped(perm, 0, p, &back), out);

    DT_TRY_GOTO(st, dt_tensor_get_local(perm, buf, (size_t)seq * sizeof *buf), out);
    printf("1. %d tokens on %d ranks, striped: token i lives on rank i mod %d\n", seq, p, p);
    printf("   permute_striped order: ");
    for (int i = 0; i < seq; i++) printf("%s%d", i ? " " : "", (int)buf[i]);
    printf("\n");
    for (int i = 0; i < seq; i++) {
        int n = seq / p;
        bad += (int)buf[i] != (i % n) * p + i / n;
    }
    DT_TRY_GOTO(st, dt_tensor_get_local(back, buf, (size_t)seq * sizeof *buf), out);
    int round_trip = 1;
    for (int i = 0; i < seq; i++) round_trip &= (int)buf[i] == i;
    printf("   unpermute_striped gives back 0..%d: %s\n", seq - 1, round_trip ? "yes" : "NO");
    bad += !round_trip;

    /* 2. A [S, 4] tensor: value token*10 + hidden. */
    int64_t shape[2] = {seq, HIDDEN};
    DT_TRY_GOTO(st, dt_tensor_create(ctx, NULL, DT_F32, 2, shape, NULL, &x), out);
    for (int t = 0; t < seq; t++)
        for (int h = 0; h < HIDDEN; h++) buf[t * HIDDEN + h] = (float)(t * 10 + h);
    DT_TRY_GOTO(st, dt_tensor_set_local(x, buf, (size_t)seq * HIDDEN * sizeof *buf), out);
    DT_TRY_GOTO(st, dt_tensor_permute_striped(x, 0, p, &xp), out);
    DT_TRY_GOTO(st, dt_tensor_get_local(xp, buf, (size_t)seq * HIDDEN * sizeof *buf), out);
    printf("\n2. a [%d, %d] tensor with value token*10 + hidden, permuted on dim 0:\n", seq, HIDDEN);
    int intact = 1;
    for (int i = 0; i < seq; i++) {
        int token = (int)buf[i * HIDDEN] / 10;
        if (i < 8 || i >= seq - 2) {
            printf("   row %2d:", i);
            for (int h = 0; h < HIDDEN; h++) printf(" %5g", buf[i * HIDDEN + h]);
            printf("   (token %d)\n", token);
        } else if (i == 8) {
            printf("   ...\n");
        }
        for (int h = 0; h < HIDDEN; h++) intact &= buf[i * HIDDEN + h] == (float)(token * 10 + h);
    }
    printf("   every hidden vector intact: %s\n", intact ? "yes" : "NO");
    bad += !intact;
    if (bad) st = dt_error(DT_ERR_INTERNAL, "the permutation demo found %d wrong values", bad);
out:
    free(buf);
    dt_tensor_destroy(xp);
    dt_tensor_destroy(x);
    dt_tensor_destroy(back);
    dt_tensor_destroy(perm);
    dt_tensor_destroy(ids);
    return st;
}

int main(int argc, char **argv) {
    static demo d;
    d.ranks = 4;
    d.seq = 16;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--ranks")) {
            if (!parse_int("--ranks", v, 1, 64, &d.ranks)) return 2;
            i++;
        } else if (!strcmp(argv[i], "--seq")) {
            if (!parse_int("--seq", v, 1, MAX_SEQ, &d.seq)) return 2;
            i++;
        } else {
            fprintf(stderr, "striped_attention: unknown flag '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (d.seq % d.ranks) {
        fprintf(stderr, "striped_attention: --seq %d is not divisible by --ranks %d\n", d.seq,
                d.ranks);
        return 2;
    }

    dt_status st = dt_launch(1, show_permutation, &d, NULL);
    if (st != DT_SUCCESS) fail("the permutation", st);

    st = dt_launch(d.ranks, rank_demo, &d, NULL);
    if (st != DT_SUCCESS) fail("sharding", st);
    printf("\n3. Shard(0, striped) over %d ranks, and Shard(0, contiguous) of the permuted tokens:\n",
           d.ranks);
    int same = 1;
    for (int r = 0; r < d.ranks; r++) {
        printf("   rank %d holds", r);
        for (int x = 0; x < d.local_len; x++) {
            printf(" %g", d.striped[r][x]);
            same &= d.striped[r][x] == d.permuted[r][x] && (int)d.striped[r][x] % d.ranks == r;
        }
        printf("\n");
    }
    printf("   both shardings agree, token i on rank i mod %d: %s\n", d.ranks, same ? "yes" : "NO");
    if (!same) return 1;
    return 0;
}
