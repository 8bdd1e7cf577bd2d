/* tests/test_mma_emu.c — the tensor-core attention kernels
 * (attention/cuda/mma_fwd.cu forward, attention/cuda/mma_bwd.cu backward,
 * attention/cuda/wgmma_fwd.cu and attention/cuda/wgmma_bwd.cu the Hopper forward and
 * backward), compiled from their unchanged
 * sources by the host C++ compiler and run on the CPU emulator of tests/emu
 * (emu.h: fibers for the CUDA threads, ldmatrix / mma.sync / wgmma /
 * cp.async / mbarrier / TMA / shuffles written from the PTX ISA), in every
 * `make test`, GPU or not. The emulator's own semantics and checks have
 * cases of their own (emulator/...: small kernels in C).
 *
 * Each case splits a sequence over P "ranks" (contiguous, striped or
 * zigzag, mask.h's segments: zigzag's with a jump) and runs the kernel on
 * every (query rank, key rank) block as the ring does, accumulating into the fp32 running
 * state: the forward's m, l, acc for each query rank, finalised here; the
 * backward's dq of each query rank and dk, dv of each key rank. The results
 * must match the double-precision reference on the whole sequence
 * (attn_ref.c) at the tolerances of the GPU tests: 2e-2 forward, 3e-2
 * backward, for bf16 and fp16. So the kernels' fragment layouts, swizzle,
 * cp.async pipeline, barriers, mask and tile bounds, online softmax and
 * fused accumulation all run here; the emulator also fails a launch on an
 * out-of-bounds or misaligned shared-memory access, a read of a tile before
 * its cp.async completed, lanes at different warp instructions, or a
 * deadlock, and for wgmma a missing fence (wgmma.fence, fence.proxy.async),
 * accumulators read or written before their wait_group, or a tile
 * overwritten while a wgmma reads it. Every block also runs traced
 * (dt_attn_block_args.trace): each CTA of the grid must write its record,
 * none past the grid, and the records' tiles must add up to the tiles with
 * a pair that may attend, counted pair by pair; a forward CTA with key
 * tiles marks its loop's start and end between its own (the wgmma kernel
 * at D = 128 only), and no other CTA marks. What it cannot show: speed, and
 * hardware behaviour the PTX ISA leaves open (the mma's internal summation
 * order, for one) or shows only in figures (the emulator's reading of
 * wgmma's fragment layouts is its own, runtime.c says from what).
 *
 * forward/nonfinite/latest and backward/nonfinite/latest run each kernel's
 * LATEST form on blocks with a NaN or an Inf in q, k, v or dout and
 * dt_attn_block_args.nonfinite set (attention/block.h's rules): what the
 * poison reaches is NaN, a row with no allowed key o = 0 and lse = -inf,
 * every other output the clean run's bits (nonfinite 0), and clean inputs
 * give the same bits with nonfinite set as without.
 *
 * Every kernel case runs in both of the kernels' forms
 * (attention/cuda/kernels.h's dt_attn_form: VERIFIED, what auto runs on a
 * GPU, and LATEST, which only this emulator has run), its name ending in
 * the form's. DT_TEST_QUICK (the valgrind run) keeps one case per
 * direction, kernel and form (forward and backward, mma.sync and wgmma).
 *
 * Documents and windows (attention/mask.h's rule beyond the mask) run in
 * the LATEST forms only: forward-rule/..., backward-rule/...,
 * forward-wgmma-rule/... and backward-wgmma-rule/... split sequences with
 * documents of random lengths (one of length 1, one longer than a shard;
 * one list for every batch row or one per row) and windows shorter and
 * longer than a shard as above, against the reference of the whole
 * sequence under the rule, their traces' tiles counted pair by pair under
 * the rule; rule/keyless-rows/latest takes rows with no allowed key to o =
 * 0, lse = -inf, and rule/verified-refuses checks that every VERIFIED
 * form refuses such a block. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_MMA_EMU_PREFIX 1
#include "attention/cuda/kernels.h"
#include "attention/cuda/mma_layout.h"
#include "attn_ref.h"
#include "dtensor/docs.h"
#include "emu/emu.h"
#include "emu/include/cuda.h"
#include "emu/include/cuda_runtime_api.h"
#include "emu/include/cudaTypedefs.h"
#include "harness.h"

#define MAXP 4

typedef struct emu_case {
    char name[160];
    attn_shape s;
    int P;
    dt_order order;
    dt_attn_mask mask;
    dt_dtype dtype;
    uint64_t seed;
    int huge;   /* logits of magnitude 1e4 */
    dt_attn_kernel_choice kernel;   /* forward: DT_ATTN_KERNEL_MMA or _WGMMA */
    int64_t l2;     /* the L2 size the launch order plans for (attention/cuda/mma_layout.h) */
    int sections;   /* > 0: instead, an L2 that gives sections of this many units */
    int sms;        /* the wgmma forward: > 0 persistent on this many SMs, 0 a CTA per tile */
    int dependent;  /* blocks launched as programmatic dependents: forward, those
                       after a query rank's first; backward, all but the first;
                       2 (forward): with the rows' waits (block.h's visits) */
    int producer;   /* the wgmma forward at D = 128: its loads by a producer warpgroup */
    dt_attn_form form;   /* the kernel's form (attention/cuda/kernels.h) */
    /* Documents and a window (attention/mask.h's rule; LATEST forms only):
     * window 0 none; docs 0 none, 1 one list of lengths for every batch
     * row, 2 a list per row (emu_doc_lengths) */
    int64_t window;
    int docs;
} emu_case;

/* Document lengths summing to S, from seed: random ones of 1 .. S/4,
 * the (seed % 3)-th of length 1 and the (3 + seed / 3 % 3)-th longer than
 * a shard (S / P rows). Returns the count (at most S). */
static int64_t emu_doc_lengths(uint64_t seed, int64_t S, int64_t shard, int64_t *lens) {
    const int64_t at_one = (int64_t)(seed % 3), at_long = 3 + (int64_t)(seed / 3 % 3);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    int64_t n = 0, left = S;
    while (left > 0) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int64_t len = n == at_one    ? 1
                      : n == at_long ? shard + 1 + (int64_t)((x >> 40) % 8)
                                     : 1 + (int64_t)((x >> 33) % (uint64_t)(S / 4));
        if (len > left) len = left;
        lens[n++] = len;
        left -= len;
    }
    return n;
}

/* A case's rule: the reference's (*rr; its doc_lens in *lens, to free)
 * and the kernels' (the documents' table in emulated device memory, one
 * [S][2] table per batch row or one for all: *stride 2 S or 0; NULL
 * without documents). */
static int64_t *emu_rule(const emu_case *c, attn_ref_rule *rr, int64_t **lens, int64_t *stride) {
    const int64_t S = c->s.S, B = c->s.B, rows = c->docs == 2 ? B : 1;
    *rr = (attn_ref_rule){.causal = c->mask == DT_ATTN_CAUSAL, .window = c->window};
    *lens = NULL;
    *stride = 0;
    if (!c->docs) return NULL;
    *lens = malloc((size_t)(rows * S) * sizeof **lens);
    int64_t count = 0;
    for (int64_t b = 0; b < rows; b++)
        count += emu_doc_lengths(c->seed + 7 * (uint64_t)b, S, S / c->P, *lens + count);
    rr->doc_lens = *lens;
    rr->doc_count = count;
    int64_t *table = NULL;
    assert_int_equal(cudaMalloc((void **)&table, (size_t)(rows * 2 * S) * sizeof *table),
                     cudaSuccess);
    for (int64_t b = 0; b < rows; b++)   /* emulated device memory is host memory */
        dt_docs_bounds(*lens, count, S, b, table + b * 2 * S);
    *stride = rows > 1 ? 2 * S : 0;
    return table;
}

/* The L2 size passed with a block whose units each re-read unit_bytes. */
static int64_t l2_for(const emu_case *c, int64_t unit_bytes) {
    return c->sections ? 2 * c->sections * unit_bytes : c->l2;
}

/* Logits of magnitude 1e4: multiples of 25, exact in bf16 and fp16, so every
 * q.k is an exact integer in fp32. */
static double *huge_input(int64_t n, int which) {
    double *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = 25.0 * (double)(((i * (which ? 3 : 7)) % 5) - 2);
    return x;
}

/* x as an array of dtype in emulated device memory (cudaMalloc: aligned
 * for cp.async, and known to the emulated TMA, which reads only inside
 * allocations CUDA made); the emulator's device memory is host memory. */
static void *as_dtype(const double *x, size_t n, dt_dtype dtype) {
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, n * dt_dtype_size(dtype)), cudaSuccess);
    for (size_t i = 0; i < n; i++) dt_value_set(p, dtype, i, (float)x[i]);
    return p;
}

static float *zeros_f32(size_t n) {
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    memset(p, 0, n * sizeof(float));
    return p;
}

/* The same in emulated device memory (cudaMalloc, cudaFree): what a bulk
 * copy's global side must be (the wgmma backward's dq). */
static float *device_zeros_f32(size_t n) {
    float *p = NULL;
    assert_int_equal(cudaMalloc((void **)&p, n * sizeof(float)), cudaSuccess);
    memset(p, 0, n * sizeof(float));   /* emulated device memory is host memory */
    return p;
}

/* One rank's local rows of a full [B, S, heads, D] array, as dtype. */
static void *local_rows(const emu_case *c, const double *full, int64_t heads, int j) {
    const attn_shape *s = &c->s;
    size_t n = (size_t)(s->B * (s->S / c->P) * heads * s->D);
    double *loc = malloc(n * sizeof *loc);
    ref_local_rows(full, s->B, s->S, heads, s->D, c->order, c->P, j, 0, heads, loc);
    void *out = as_dtype(loc, n, c->dtype);
    free(loc);
    return out;
}

/* The inputs of a case, per rank: q, k, v (and for the backward dout, o). */
typedef struct ranks {
    dt_attn_segment seg[MAXP];   /* rank j's rows and positions */
    void *q[MAXP], *k[MAXP], *v[MAXP];
} ranks;

static void make_ranks(const emu_case *c, const double *q, const double *k, const double *v,
                       ranks *R) {
    for (int j = 0; j < c->P; j++) {
        R->seg[j] = dt_attn_segment_of(c->order, c->s.S, c->P, j);
        R->q[j] = local_rows(c, q, c->s.H, j);
        R->k[j] = local_rows(c, k, c->s.Hkv, j);
        R->v[j] = local_rows(c, v, c->s.Hkv, j);
    }
}

static void free_ranks(const emu_case *c, ranks *R) {
    for (int j = 0; j < c->P; j++) {
        cudaFree(R->q[j]);
        cudaFree(R->k[j]);
        cudaFree(R->v[j]);
    }
}

#ifdef DT_EMU_NO_CXX
/* Built without a C++ compiler (Makefile): the kernels could not be
 * compiled for the emulator. */
static void run_forward(void **state) {
    (void)state;
    print_message("skipped: no C++ compiler (%s) to build the kernels for the emulator; "
                  "apt-get install g++, or make CXX=...\n", DT_EMU_NO_CXX);
    skip();
}
#define run_backward run_forward
#else
/* ------------------------------------------------------------ CTA traces */

/* Tiles of bq query rows x bk key rows with at least one pair that the
 * case's rule rr lets attend (attn_ref.h, from the global positions),
 * counted pair by pair, summed over the batch rows, times `heads`. */
static int64_t tiles_with_pairs(const attn_shape *s, const attn_ref_rule *rr, dt_attn_segment q,
                                int64_t bq, dt_attn_segment k, int64_t bk, int64_t heads) {
    int64_t n = 0;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t x0 = 0; x0 < q.len; x0 += bq)
            for (int64_t y0 = 0; y0 < k.len; y0 += bk) {
                int any = 0;
                for (int64_t x = x0; x < x0 + bq && x < q.len && !any; x++)
                    for (int64_t y = y0; y < y0 + bk && y < k.len && !any; y++)
                        any = ref_rule_allows(s, rr, b, dt_attn_pos(q, x), dt_attn_pos(k, y));
                n += any;
            }
    return n * heads;
}

/* Whether a record's marks are in order between its start and end: the
 * first key tile landed, then the last one done (32-bit clocks, modulo
 * 2^32). */
static int marks_in_order(const dt_attn_cta_trace *r) {
    const uint32_t c0 = (uint32_t)r->clock[0];
    const uint32_t to0 = r->mark[0] - c0, to1 = r->mark[1] - c0, to_end = (uint32_t)r->clock[1] - c0;
    return to0 <= to1 && to1 <= to_end;
}

/* A traced block's records (dt_attn_block_args.trace, room for grid + 3):
 * CTAs 0 .. grid-1 each wrote theirs (end after start), none past the grid,
 * and their tiles add up to `tiles`; `marks`: every record with tiles
 * carries its two marks in order (dt_attn_cta_trace.mark), and the others
 * none; otherwise no record carries any. Returns the number of faults. */
static long check_trace(const char *name, const dt_attn_cta_trace *tr, int64_t grid,
                        int64_t tiles, int marks) {
    long bad = 0;
    int64_t sum = 0;
    for (int64_t i = 0; i < grid + 3; i++) {
        const int wrote = tr[i].ns[1] != 0;
        if (wrote != (i < grid) || tr[i].ns[1] < tr[i].ns[0] || tr[i].clock[1] < tr[i].clock[0]) {
            if (!bad++)
                print_error("%s: CTA record %lld of a grid of %lld: %s\n", name, (long long)i,
                            (long long)grid, wrote ? "written" : "missing");
        }
        const int marked = tr[i].mark[0] != 0 && tr[i].mark[1] != 0;
        const int unmarked = tr[i].mark[0] == 0 && tr[i].mark[1] == 0;
        const int want = marks && tr[i].work > 0;
        if (want ? !marked || !marks_in_order(&tr[i]) : !unmarked) {
            if (!bad++)
                print_error("%s: CTA record %lld of %u tiles: marks %u, %u between clocks %llu "
                            "and %llu (%s)\n", name, (long long)i, tr[i].work, tr[i].mark[0],
                            tr[i].mark[1], (unsigned long long)tr[i].clock[0],
                            (unsigned long long)tr[i].clock[1],
                            want ? "wanted, in order" : "wanted none");
        }
        sum += tr[i].work;
    }
    if (sum != tiles) {
        print_error("%s: the CTAs' records count %lld tiles; %lld have pairs that may attend\n",
                    name, (long long)sum, (long long)tiles);
        bad++;
    }
    return bad;
}

/* Under ThreadSanitizer (make SANITIZE=thread) the kernel cases skip:
 * they run on this one thread, so it has nothing to check in them, at
 * about 20 times their time (10 minutes instead of 35 s here); the
 * emulator's own tests below still run, its fibers announced to it
 * (tests/emu/runtime.c). */
#if defined(__SANITIZE_THREAD__)
#define TSAN_ON 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN_ON 1
#endif
#endif
static int skipped_under_tsan(void) {
#ifdef TSAN_ON
    print_message("skipped: under ThreadSanitizer: one thread's work, at 20x its time\n");
    return 1;
#else
    return 0;
#endif
}

/* --------------------------------------------------------------- forward */

static void run_forward(void **state) {
    if (skipped_under_tsan()) {
        skip();
        return;
    }
    const emu_case *c = *state;
    const attn_shape *s = &c->s;
    const int64_t n = s->S / c->P, H = s->H, G = s->Hkv, D = s->D, B = s->B;
    char why[256];
    const int wgmma = c->kernel == DT_ATTN_KERNEL_WGMMA;
    assert_true(wgmma ? dt_emu_attn_wgmma_supported(c->dtype, D, 90, why, sizeof why)
                      : dt_emu_attn_mma_supported(c->dtype, D, 90, why, sizeof why));
    const int64_t nq = B * s->S * H * D, nk = B * s->S * G * D;
    double *q = c->huge ? huge_input(nq, 0) : ref_input(c->seed, nq, c->dtype);
    double *k = c->huge ? huge_input(nk, 1) : ref_input(c->seed + 1, nk, c->dtype);
    double *v = ref_input(c->seed + 2, nk, c->dtype);
    double *o_ref = malloc((size_t)nq * sizeof *o_ref), *lse_ref = malloc((size_t)(B * H * s->S) * sizeof *lse_ref);
    attn_ref_rule rr;
    int64_t *doc_lens, docs_stride;
    int64_t *const docs = emu_rule(c, &rr, &doc_lens, &docs_stride);
    ref_attention_forward_rule(s, &rr, q, k, v, 1.0 / sqrt((double)D), o_ref, lse_ref);
    ranks R;
    make_ranks(c, q, k, v, &R);
    const uint64_t mma_before = dt_emu_get_counts().mma;
    const uint64_t dependent_before = dt_emu_get_counts().dependent;

    const size_t nrow = (size_t)(B * H * n), nacc = nrow * (size_t)D;
    float *m = zeros_f32(nrow), *l = zeros_f32(nrow), *acc = zeros_f32(nacc), *o = zeros_f32(nacc);
    float *lse = zeros_f32(nrow);
    void *ot = NULL, *queue = NULL;   /* the kernel's o, in the dtype; the wgmma tile queue */
    assert_int_equal(cudaMalloc(&ot, nacc * dt_dtype_size(c->dtype)), cudaSuccess);
    assert_int_equal(cudaMalloc(&queue, DT_ATTN_WGMMA_QUEUE_BYTES), cudaSuccess);
    uint32_t *const qw = queue;   /* emulated device memory is host memory */
    /* dependent 2: the rows' counts, one per 16 query rows of each (batch, head) */
    const size_t ncount = (size_t)(B * H * ((n + 15) / 16));
    uint32_t *visits = NULL;
    if (c->dependent == 2)
        assert_int_equal(cudaMalloc((void **)&visits, ncount * sizeof *visits), cudaSuccess);
    double *ref = malloc(nacc * sizeof *ref), *ref_lse = malloc(nrow * sizeof *ref_lse);
    /* the kernels' query and key tiles (their files' comments) */
    const int64_t bm = wgmma ? 128 : DT_MMA_BM, bn = wgmma ? 128 : DT_MMA_BN;
    const int64_t trace_len = (n + bm - 1) / bm * H * B + 3;
    dt_attn_cta_trace *trace = malloc((size_t)trace_len * sizeof *trace);
    long bad = 0;
    uint64_t continuing = 0;   /* blocks that are not their rank's first */
    for (int j = 0; j < c->P && !bad; j++) {
        /* NaN: the rank's first block must not read them */
        for (size_t i = 0; i < nrow; i++) m[i] = l[i] = lse[i] = NAN;
        for (size_t i = 0; i < nacc; i++) acc[i] = NAN;
        /* the queue as new memory: the call's first block must clear it */
        qw[0] = qw[1] = 0xdeadbeefu;
        /* the counts as the call's first block finds them: cleared by the caller */
        if (visits) memset(visits, 0, ncount * sizeof *visits);
        for (int step = 0; step < c->P && !bad; step++) {   /* key ranks in ring order */
            const int r = (j - step + c->P) % c->P;
            dt_attn_block_args a = {
                .dtype = c->dtype, .batch = B, .heads = H, .kv_heads = G, .dim = D,
                .q = R.q[j], .q_batch_stride = n * H * D, .k = R.k[r], .v = R.v[r],
                .kv_batch_stride = n * G * D, .qseg = R.seg[j], .kseg = R.seg[r],
                .mask = c->mask, .scale = (float)(1.0 / sqrt((double)D)), .m = m, .l = l,
                .ml_batch_stride = H * n, .ml_head_stride = n, .acc = acc,
                .acc_batch_stride = n * H * D, .first = step == 0,
                .last = step == c->P - 1, .o = ot, .lse = lse, .tuning = {c->kernel, 1, 1, 1},
                .trace = trace, .trace_len = trace_len, .visits = visits,
                .visit = (uint32_t)step, .window = c->window, .docs = docs,
                .docs_batch_stride = docs_stride};
            memset(trace, 0, (size_t)trace_len * sizeof *trace);
            continuing += !a.first;
            if (!dt_emu_attn_mma_block_ok(&a, why, sizeof why)) {
                print_error("%s: block refused: %s\n", c->name, why);
                bad = 1;
            } else if ((wgmma ? dt_emu_attn_wgmma_fwd(NULL, &a, l2_for(c, 4 * a.kseg.len * D / (H / G)),
                                                      c->sms, queue, c->dependent, c->producer,
                                                      c->form)
                              : dt_emu_attn_mma_fwd(NULL, &a, l2_for(c, 4 * a.kseg.len * D / (H / G)),
                                                    c->dependent, c->form)) != DT_SUCCESS) {
                print_error("%s: rank %d, keys of rank %d: %s\n", c->name, j, r, dt_last_error());
                bad = 1;
            } else {
                /* marks: the forward's, but the wgmma kernel's at D = 128 only */
                bad += check_trace(c->name, trace, (a.qseg.len + bm - 1) / bm * H * B,
                                   tiles_with_pairs(s, &rr, a.qseg, bm, a.kseg, bn, H),
                                   !wgmma || D == 128);
                /* every launch leaves the queue clear for the next block's */
                if (wgmma && (qw[0] || qw[1])) {
                    print_error("%s: rank %d, keys of rank %d: the tile queue is left at "
                                "%u, %u\n", c->name, j, r, qw[0], qw[1]);
                    bad++;
                }
            }
        }
        if (bad) break;
        /* every block counted every 16 rows of the rank's once (rows past
         * its segment have no count) */
        for (size_t i = 0; visits && i < ncount; i++) {
            const int64_t per = (R.seg[j].len + 15) / 16;
            const uint32_t want = (int64_t)i < B * H * per ? (uint32_t)c->P : 0u;
            if (visits[i] != want) {
                print_error("%s: query rank %d: rows' count %zu is %u, not %u\n", c->name, j, i,
                            visits[i], want);
                bad++;
                break;
            }
        }
        if (bad) break;
        for (size_t i = 0; i < nacc; i++) o[i] = dt_value_get(ot, c->dtype, i);
        ref_local_rows(o_ref, B, s->S, H, D, c->order, c->P, j, 0, H, ref);
        ref_local_lse(lse_ref, B, s->S, H, c->order, c->P, j, 0, H, ref_lse);
        bad += h_compare("o", o, ref, nacc, 2e-2, 2e-2, NULL);
        bad += h_compare("lse", lse, ref_lse, nrow, 2e-2, 2e-2, NULL);
        if (bad) print_error("%s: query rank %d\n", c->name, j);
    }
    const uint64_t mma_ran = dt_emu_get_counts().mma - mma_before;
    /* dependent launches ran where asked for (every block but a query
     * rank's first), and only there */
    const uint64_t dependent_ran = dt_emu_get_counts().dependent - dependent_before;
    free_ranks(c, &R);
    free(q), free(k), free(v), free(o_ref), free(lse_ref), free(ref), free(ref_lse);
    free(m), free(l), free(acc), free(o), free(lse), free(trace), free(doc_lens);
    cudaFree(ot);
    cudaFree(queue);
    cudaFree(visits);
    cudaFree(docs);
    assert_int_equal(bad, 0);
    assert_true(mma_ran > 0);
    assert_int_equal(dependent_ran, c->dependent ? continuing : 0);
}

/* -------------------------------------------------------------- backward */

static void run_backward(void **state) {
    if (skipped_under_tsan()) {
        skip();
        return;
    }
    const emu_case *c = *state;
    const attn_shape *s = &c->s;
    const int64_t n = s->S / c->P, H = s->H, G = s->Hkv, D = s->D, B = s->B;
    const double scale = 1.0 / sqrt((double)D);
    char why[256];
    const int wgmma = c->kernel == DT_ATTN_KERNEL_WGMMA;
    assert_true(wgmma ? dt_emu_attn_wgmma_supported(c->dtype, D, 90, why, sizeof why)
                      : dt_emu_attn_mma_supported(c->dtype, D, 80, why, sizeof why));
    const int64_t nq = B * s->S * H * D, nk = B * s->S * G * D;
    double *q = ref_input(c->seed, nq, c->dtype), *k = ref_input(c->seed + 1, nk, c->dtype);
    double *v = ref_input(c->seed + 2, nk, c->dtype), *dout = ref_input(c->seed + 3, nq, c->dtype);
    double *o = malloc((size_t)nq * sizeof *o), *lse_full = malloc((size_t)(B * H * s->S) * sizeof *lse_full);
    double *dq_ref = malloc((size_t)nq * sizeof *dq_ref), *dk_ref = malloc((size_t)nk * sizeof *dk_ref);
    double *dv_ref = malloc((size_t)nk * sizeof *dv_ref);
    attn_ref_rule rr;
    int64_t *doc_lens, docs_stride;
    int64_t *const docs = emu_rule(c, &rr, &doc_lens, &docs_stride);
    ref_attention_forward_rule(s, &rr, q, k, v, scale, o, lse_full);
    ref_attention_backward_rule(s, &rr, q, k, v, dout, scale, dq_ref, dk_ref, dv_ref);
    /* delta = rowsum(dout * o) with o as the forward stores it (rounded to
     * the dtype), the way the library's delta kernel computes it */
    double *delta_full = malloc((size_t)(B * H * s->S) * sizeof *delta_full);
    for (int64_t b = 0; b < B; b++)
        for (int64_t x = 0; x < s->S; x++)
            for (int64_t h = 0; h < H; h++) {
                double sum = 0;
                for (int64_t d = 0; d < D; d++) {
                    const size_t i = (size_t)(((b * s->S + x) * H + h) * D + d);
                    sum += dout[i] * (double)dt_value_round((float)o[i], c->dtype);
                }
                delta_full[(b * H + h) * s->S + x] = sum;
            }
    ranks R;
    make_ranks(c, q, k, v, &R);
    void *dor[MAXP];
    float *lse[MAXP], *delta[MAXP], *dq[MAXP], *dk[MAXP], *dv[MAXP];
    const size_t nrow = (size_t)(B * H * n), nql = nrow * (size_t)D, nkl = (size_t)(B * n * G * D);
    double *tmp = malloc(nql * sizeof *tmp);
    for (int j = 0; j < c->P; j++) {
        dor[j] = local_rows(c, dout, H, j);
        lse[j] = zeros_f32(nrow);
        delta[j] = zeros_f32(nrow);
        ref_local_lse(lse_full, B, s->S, H, c->order, c->P, j, 0, H, tmp);
        for (size_t i = 0; i < nrow; i++) lse[j][i] = (float)tmp[i];
        ref_local_lse(delta_full, B, s->S, H, c->order, c->P, j, 0, H, tmp);
        for (size_t i = 0; i < nrow; i++) delta[j][i] = (float)tmp[i];
        dq[j] = device_zeros_f32(nql);
        dk[j] = zeros_f32(nkl);
        dv[j] = zeros_f32(nkl);
        for (size_t i = 0; i < nkl; i++)   /* the first block on a key rank writes them */
            dk[j][i] = dv[j][i] = NAN;
    }
    const uint64_t bulk_before = dt_emu_get_counts().bulk;
    const uint64_t mma_before = dt_emu_get_counts().mma;
    const uint64_t dependent_before = dt_emu_get_counts().dependent;
    /* the kernels' key tiles (a CTA each) and query tiles (their files' comments) */
    const int64_t bn = DT_MMA_BWD_BN, bm = wgmma ? 8192 / D : DT_MMA_BM;
    const int64_t trace_len = (n + bn - 1) / bn * G * B + 3;
    dt_attn_cta_trace *trace = malloc((size_t)trace_len * sizeof *trace);
    long bad = 0;
    /* every (query rank, key rank) block; each after the first continues
     * the one before (block.h: it adds into the same dq, and writes
     * another rank's dk, dv, or with P = 1 none after it) */
    uint64_t continuing = 0;
    for (int j = 0; j < c->P && !bad; j++)
        for (int r = 0; r < c->P && !bad; r++) {
            dt_attn_block_bwd_args a = {
                .dtype = c->dtype, .batch = B, .heads = H, .kv_heads = G, .dim = D,
                .q = R.q[j], .dout = dor[j], .q_batch_stride = n * H * D, .k = R.k[r],
                .v = R.v[r], .kv_batch_stride = n * G * D, .qseg = R.seg[j],
                .kseg = R.seg[r], .mask = c->mask, .scale = (float)scale, .lse = lse[j],
                .delta = delta[j], .ml_batch_stride = H * n, .ml_head_stride = n,
                .dq = dq[j], .dq_batch_stride = n * H * D, .dk = dk[r], .dv = dv[r],
                .first = j == 0, .continues = j > 0 || r > 0, .tuning = {c->kernel, 1, 1, 1},
                .trace = trace, .trace_len = trace_len, .window = c->window, .docs = docs,
                .docs_batch_stride = docs_stride};
            memset(trace, 0, (size_t)trace_len * sizeof *trace);
            continuing += a.continues;
            const int64_t l2 = l2_for(c, (H / G) * a.qseg.len * D * 8);
            if (!bad && !dt_emu_attn_mma_bwd_block_ok(&a, why, sizeof why)) {
                print_error("%s: block refused: %s\n", c->name, why);
                bad = 1;
            } else if (!bad && (wgmma ? dt_emu_attn_wgmma_bwd(NULL, &a, l2, c->dependent, c->form)
                                      : dt_emu_attn_mma_bwd(NULL, &a, l2, c->dependent, c->form)) !=
                                   DT_SUCCESS) {
                print_error("%s: queries of rank %d, keys of rank %d: %s\n", c->name, j,
                            r, dt_last_error());
                bad = 1;
            } else if (!bad) {   /* a tile of keys per CTA, its query tiles its work;
                                  * marks by the wgmma backward only (block.h) */
                bad += check_trace(c->name, trace, (a.kseg.len + bn - 1) / bn * G * B,
                                   tiles_with_pairs(s, &rr, a.qseg, bm, a.kseg, bn, H), wgmma);
            }
        }
    const double tol = 3e-2;
    double *ref = malloc(nql * sizeof *ref);
    for (int j = 0; j < c->P && !bad; j++) {
        ref_local_rows(dq_ref, B, s->S, H, D, c->order, c->P, j, 0, H, ref);
        bad += h_compare("dq", dq[j], ref, nql, tol, tol, NULL);
        ref_local_rows(dk_ref, B, s->S, G, D, c->order, c->P, j, 0, G, ref);
        bad += h_compare("dk", dk[j], ref, nkl, tol, tol, NULL);
        ref_local_rows(dv_ref, B, s->S, G, D, c->order, c->P, j, 0, G, ref);
        bad += h_compare("dv", dv[j], ref, nkl, tol, tol, NULL);
        if (bad) print_error("%s: rank %d\n", c->name, j);
    }
    const uint64_t mma_ran = dt_emu_get_counts().mma - mma_before;
    const uint64_t dependent_ran = dt_emu_get_counts().dependent - dependent_before;
    /* the wgmma kernel's dQ by bulk reductions in its LATEST form (its
     * VERIFIED form's and the mma kernel's by float2 ones) */
    const uint64_t bulk_ran = dt_emu_get_counts().bulk - bulk_before;
    for (int j = 0; j < c->P; j++) {
        cudaFree(dor[j]), free(lse[j]), free(delta[j]), cudaFree(dq[j]), free(dk[j]), free(dv[j]);
    }
    free_ranks(c, &R);
    free(q), free(k), free(v), free(dout), free(o), free(lse_full), free(delta_full);
    free(dq_ref), free(dk_ref), free(dv_ref), free(tmp), free(ref), free(trace), free(doc_lens);
    cudaFree(docs);
    assert_int_equal(bad, 0);
    assert_true(mma_ran > 0);
    assert_int_equal(dependent_ran, c->dependent ? continuing : 0);
    assert_true(wgmma && c->form == DT_ATTN_FORM_LATEST ? bulk_ran > 0 : bulk_ran == 0);
}

/* Documents and windows run in the kernels' LATEST forms only: a VERIFIED
 * form refuses a block with a window or with documents (DT_ERR_NOT_SUPPORTED,
 * no CTA launched), forward and backward, mma.sync and wgmma. */
static void test_rule_verified_refused(void **state) {
    (void)state;
    const int64_t n = 64, D = 64;
    void *q = NULL, *k = NULL, *v = NULL, *ot = NULL, *queue = NULL;
    int64_t *docs = NULL;
    assert_int_equal(cudaMalloc(&q, (size_t)(n * D) * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&k, (size_t)(n * D) * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&v, (size_t)(n * D) * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&ot, (size_t)(n * D) * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&queue, DT_ATTN_WGMMA_QUEUE_BYTES), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&docs, (size_t)(2 * n) * sizeof *docs), cudaSuccess);
    const int64_t lens[2] = {20, 44};
    dt_docs_bounds(lens, 2, n, 0, docs);
    float *lse = zeros_f32((size_t)n), *delta = zeros_f32((size_t)n);
    float *dq = device_zeros_f32((size_t)(n * D)), *dk = zeros_f32((size_t)(n * D));
    float *dv = zeros_f32((size_t)(n * D));
    const dt_attn_segment seg = {0, 1, n, 0, 0};
    for (int which = 0; which < 2; which++) {   /* a window; documents */
        const int64_t window = which ? 0 : 5;
        const int64_t *const dd = which ? docs : NULL;
        dt_attn_block_args f = {
            .dtype = DT_BF16, .batch = 1, .heads = 1, .kv_heads = 1, .dim = D, .q = q,
            .q_batch_stride = n * D, .k = k, .v = v, .kv_batch_stride = n * D, .qseg = seg,
            .kseg = seg, .mask = DT_ATTN_CAUSAL, .scale = 0.125f, .ml_head_stride = n,
            .first = 1, .last = 1, .o = ot, .lse = lse, .window = window, .docs = dd};
        dt_attn_block_bwd_args b = {
            .dtype = DT_BF16, .batch = 1, .heads = 1, .kv_heads = 1, .dim = D, .q = q,
            .dout = ot, .q_batch_stride = n * D, .k = k, .v = v, .kv_batch_stride = n * D,
            .qseg = seg, .kseg = seg, .mask = DT_ATTN_CAUSAL, .scale = 0.125f, .lse = lse,
            .delta = delta, .ml_head_stride = n, .dq = dq, .dq_batch_stride = n * D, .dk = dk,
            .dv = dv, .first = 1, .window = window, .docs = dd};
        const uint64_t ctas = dt_emu_get_counts().blocks;
        assert_int_equal(dt_emu_attn_mma_fwd(NULL, &f, 0, 0, DT_ATTN_FORM_VERIFIED),
                         DT_ERR_NOT_SUPPORTED);
        assert_non_null(strstr(dt_last_error(), "LATEST"));
        assert_int_equal(dt_emu_attn_mma_bwd(NULL, &b, 0, 0, DT_ATTN_FORM_VERIFIED),
                         DT_ERR_NOT_SUPPORTED);
        assert_int_equal(dt_emu_attn_wgmma_fwd(NULL, &f, 0, 1, queue, 0, 0, DT_ATTN_FORM_VERIFIED),
                         DT_ERR_NOT_SUPPORTED);
        assert_int_equal(dt_emu_attn_wgmma_bwd(NULL, &b, 0, 0, DT_ATTN_FORM_VERIFIED),
                         DT_ERR_NOT_SUPPORTED);
        assert_int_equal(dt_emu_get_counts().blocks, ctas);
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(ot), cudaFree(queue), cudaFree(docs);
    free(lse), free(delta), free(dk), free(dv);
    cudaFree(dq);
}

/* Rows with no allowed key, under documents and a window: one block (a
 * call's first and last) of queries at positions 0 .. 127 against keys at
 * 128 .. 255 of a sequence of 256, and the other way round (full mask,
 * window 40, documents of lengths 110, 1, 145): queries at 0 .. 110 see no
 * later key (too far, in a document that ends before 128, or alone in
 * theirs), those at 167 .. 255 no earlier one (too far). Those rows must
 * end as o = 0, lse = -inf, never NaN; the others as a double-precision
 * reference of the block; then the backward from the kernel's o and lse:
 * the keyless rows' dq exactly 0, and dq, dk, dv as the reference. The
 * instances for non-finite inputs (nonfinite set) give the same bits on
 * these inputs, forward and backward, and keep a NaN or an Inf in key 64,
 * which the rule keeps from every query, out of every forward output
 * (masked by select, by either end of the rows' ranges: a computed tile
 * may hold it). Each kernel's LATEST
 * form, bf16, D = 64 and 128, two query heads on one kv head. */
enum { KL_N = 128, KL_H = 2 };

static int keyless_allows(const int64_t *docs, int64_t pq, int64_t pk) {
    return (pq - pk < 40 && pk - pq < 40) && docs[2 * pq] <= pk && pk < docs[2 * pq + 1];
}

static void test_rule_keyless_rows(void **state) {
    (void)state;
    if (skipped_under_tsan()) {
        skip();
        return;
    }
    const int64_t lens[3] = {110, 1, 145};
    int64_t *docs = NULL;
    assert_int_equal(cudaMalloc((void **)&docs, 2 * 2 * KL_N * sizeof *docs), cudaSuccess);
    dt_docs_bounds(lens, 3, 2 * KL_N, 0, docs);
    long bad = 0;
    for (int run = 0; run < 8; run++) {   /* mma, wgmma; D = 64, 128; keys after, before */
        if (getenv("DT_TEST_QUICK") && run & 2) continue;   /* valgrind: D = 64 */
        const int wgmma = run & 1, after = run < 4;
        const int64_t D = run & 2 ? 128 : 64, nq = KL_N * KL_H * D, nk = KL_N * D;
        const dt_attn_segment qseg = {after ? 0 : KL_N, 1, KL_N, 0, 0};
        const dt_attn_segment kseg = {after ? KL_N : 0, 1, KL_N, 0, 0};
        const double scale = 1.0 / sqrt((double)D);
        double *q = ref_input(610 + (uint64_t)run, nq, DT_BF16), *k = ref_input(620, nk, DT_BF16);
        double *v = ref_input(630, nk, DT_BF16), *dout = ref_input(640, nq, DT_BF16);
        void *qd = as_dtype(q, (size_t)nq, DT_BF16), *kd = as_dtype(k, (size_t)nk, DT_BF16);
        void *vd = as_dtype(v, (size_t)nk, DT_BF16), *gd = as_dtype(dout, (size_t)nq, DT_BF16);
        void *od = NULL, *queue = NULL;
        assert_int_equal(cudaMalloc(&od, (size_t)nq * 2), cudaSuccess);
        assert_int_equal(cudaMalloc(&queue, DT_ATTN_WGMMA_QUEUE_BYTES), cudaSuccess);
        float *lse = zeros_f32(KL_H * KL_N), *o = zeros_f32((size_t)nq);
        dt_attn_block_args a = {
            .dtype = DT_BF16, .batch = 1, .heads = KL_H, .kv_heads = 1, .dim = D, .q = qd,
            .q_batch_stride = nq, .k = kd, .v = vd, .kv_batch_stride = nk, .qseg = qseg,
            .kseg = kseg, .mask = DT_ATTN_FULL, .scale = (float)scale,
            .ml_batch_stride = KL_H * KL_N, .ml_head_stride = KL_N, .first = 1, .last = 1,
            .o = od, .lse = lse, .window = 40, .docs = docs};
        const dt_attn_form LATEST = DT_ATTN_FORM_LATEST;
        assert_int_equal(wgmma ? dt_emu_attn_wgmma_fwd(NULL, &a, 0, 1, queue, 0, 0, LATEST)
                               : dt_emu_attn_mma_fwd(NULL, &a, 0, 0, LATEST),
                         DT_SUCCESS);
        for (int64_t i = 0; i < nq; i++) o[i] = dt_value_get(od, DT_BF16, (size_t)i);
        long b0 = bad;
        /* nonfinite set: the same bits, and key 64's NaN or Inf nowhere */
        uint16_t *const o_bits = malloc((size_t)nq * 2);
        float *const lse_bits = malloc(KL_H * KL_N * sizeof *lse_bits);
        memcpy(o_bits, od, (size_t)nq * 2);   /* emulated device memory is host memory */
        memcpy(lse_bits, lse, KL_H * KL_N * sizeof *lse);
        a.nonfinite = 1;
        for (int poison = 0; poison < 3; poison++) {   /* none, NaN, +Inf in k[64][3] */
            const float k64 = poison == 1 ? NAN : poison ? INFINITY : (float)k[64 * D + 3];
            dt_value_set(kd, DT_BF16, (size_t)(64 * D + 3), k64);
            memset(od, 0xff, (size_t)nq * 2);
            assert_int_equal(wgmma ? dt_emu_attn_wgmma_fwd(NULL, &a, 0, 1, queue, 0, 0, LATEST)
                                   : dt_emu_attn_mma_fwd(NULL, &a, 0, 0, LATEST),
                             DT_SUCCESS);
            if ((memcmp(od, o_bits, (size_t)nq * 2) ||
                 memcmp(lse, lse_bits, KL_H * KL_N * sizeof *lse)) && bad++ == b0)
                print_error("nonfinite forward (k[64][3] %s): not the clean bits\n",
                            (const char *[]){"clean", "NaN", "+Inf"}[poison]);
        }
        dt_value_set(kd, DT_BF16, (size_t)(64 * D + 3), (float)k[64 * D + 3]);
        memcpy(od, o_bits, (size_t)nq * 2);
        memcpy(lse, lse_bits, KL_H * KL_N * sizeof *lse);
        a.nonfinite = 0;
        /* the block's reference, forward and backward (from o as stored) */
        double *o_ref = calloc((size_t)nq, sizeof *o_ref);
        double *lse_ref = malloc(KL_H * KL_N * sizeof *lse_ref);
        double *dq_ref = calloc((size_t)nq, sizeof *dq_ref);
        double *dk_ref = calloc((size_t)nk, sizeof *dk_ref);
        double *dv_ref = calloc((size_t)nk, sizeof *dv_ref), *pr = malloc(KL_N * sizeof *pr);
        float *delta = zeros_f32(KL_H * KL_N);
        for (int64_t h = 0; h < KL_H; h++)
            for (int64_t x = 0; x < KL_N; x++) {
                const double *qx = q + (x * KL_H + h) * D, *gx = dout + (x * KL_H + h) * D;
                double mx = -INFINITY, sum = 0, dl = 0;
                for (int64_t y = 0; y < KL_N; y++) {
                    pr[y] = -INFINITY;
                    if (!keyless_allows(docs, qseg.start + x, kseg.start + y)) continue;
                    double d = 0;
                    for (int64_t c = 0; c < D; c++) d += qx[c] * k[y * D + c];
                    mx = fmax(mx, pr[y] = d * scale);
                }
                for (int64_t y = 0; y < KL_N; y++)
                    sum += pr[y] = pr[y] == -INFINITY ? 0 : exp(pr[y] - mx);
                for (int64_t y = 0; y < KL_N && sum > 0; y++)
                    for (int64_t c = 0; c < D; c++)
                        o_ref[(x * KL_H + h) * D + c] += pr[y] / sum * v[y * D + c];
                lse_ref[h * KL_N + x] = sum > 0 ? mx + log(sum) : -INFINITY;
                for (int64_t c = 0; c < D; c++) dl += gx[c] * o[(x * KL_H + h) * D + c];
                delta[h * KL_N + x] = (float)dl;
                for (int64_t y = 0; y < KL_N && sum > 0; y++) {
                    const double p = pr[y] / sum;
                    if (p == 0) continue;
                    double dp = 0;
                    for (int64_t c = 0; c < D; c++) dp += gx[c] * v[y * D + c];
                    const double ds = p * (dp - dl);
                    for (int64_t c = 0; c < D; c++) {
                        dv_ref[y * D + c] += p * gx[c];
                        dq_ref[(x * KL_H + h) * D + c] += scale * ds * k[y * D + c];
                        dk_ref[y * D + c] += scale * ds * qx[c];
                    }
                }
            }
        bad += h_compare("keyless o", o, o_ref, (size_t)nq, 2e-2, 2e-2, NULL);
        bad += h_compare("keyless lse", lse, lse_ref, KL_H * KL_N, 2e-2, 2e-2, NULL);
        for (int64_t i = 0; i < nq; i++)   /* exactly 0 (h_compare allows 2e-2) */
            if (o_ref[i] == 0 && o[i] != 0 && bad++ == b0)
                print_error("keyless o[%lld] = %g, not 0\n", (long long)i, (double)o[i]);
        float *dq = device_zeros_f32((size_t)nq), *dk = zeros_f32((size_t)nk);
        float *dv = zeros_f32((size_t)nk);
        dt_attn_block_bwd_args g = {
            .dtype = DT_BF16, .batch = 1, .heads = KL_H, .kv_heads = 1, .dim = D, .q = qd,
            .dout = gd, .q_batch_stride = nq, .k = kd, .v = vd, .kv_batch_stride = nk,
            .qseg = qseg, .kseg = kseg, .mask = DT_ATTN_FULL, .scale = (float)scale, .lse = lse,
            .delta = delta, .ml_batch_stride = KL_H * KL_N, .ml_head_stride = KL_N, .dq = dq,
            .dq_batch_stride = nq, .dk = dk, .dv = dv, .first = 1, .window = 40, .docs = docs};
        assert_int_equal(wgmma ? dt_emu_attn_wgmma_bwd(NULL, &g, 0, 0, LATEST)
                               : dt_emu_attn_mma_bwd(NULL, &g, 0, 0, LATEST),
                         DT_SUCCESS);
        /* nonfinite set, clean inputs: the same bits */
        float *dq1 = device_zeros_f32((size_t)nq), *dk1 = zeros_f32((size_t)nk);
        float *dv1 = zeros_f32((size_t)nk);
        dt_attn_block_bwd_args g1 = g;
        g1.nonfinite = 1, g1.dq = dq1, g1.dk = dk1, g1.dv = dv1;
        assert_int_equal(wgmma ? dt_emu_attn_wgmma_bwd(NULL, &g1, 0, 0, LATEST)
                               : dt_emu_attn_mma_bwd(NULL, &g1, 0, 0, LATEST),
                         DT_SUCCESS);
        if ((memcmp(dq1, dq, (size_t)nq * 4) || memcmp(dk1, dk, (size_t)nk * 4) ||
             memcmp(dv1, dv, (size_t)nk * 4)) && bad++ == b0)
            print_error("nonfinite backward: not the clean bits\n");
        cudaFree(dq1), free(dk1), free(dv1);
        bad += h_compare("keyless dq", dq, dq_ref, (size_t)nq, 3e-2, 3e-2, NULL);
        bad += h_compare("keyless dk", dk, dk_ref, (size_t)nk, 3e-2, 3e-2, NULL);
        bad += h_compare("keyless dv", dv, dv_ref, (size_t)nk, 3e-2, 3e-2, NULL);
        int64_t keyless = 0;
        for (int64_t i = 0; i < nq; i++)   /* a row without keys: dq untouched */
            if (lse_ref[(i / D % KL_H) * KL_N + i / D / KL_H] == -INFINITY) {
                keyless++;
                if (dq[i] != 0 && bad++ == b0)
                    print_error("keyless dq[%lld] = %g, not 0\n", (long long)i, (double)dq[i]);
            }
        if (keyless != (after ? 111 : 89) * KL_H * D && bad++ == b0)
            print_error("%lld keyless values, not %d\n", (long long)keyless,
                        (after ? 111 : 89) * KL_H * (int)D);
        if (bad > b0)
            print_error("%s, D = %lld, keys %s\n", wgmma ? "wgmma" : "mma", (long long)D,
                        after ? "after" : "before");
        free(q), free(k), free(v), free(dout), free(lse), free(o), free(o_ref), free(lse_ref);
        free(dq_ref), free(dk_ref), free(dv_ref), free(pr), free(delta), free(dk), free(dv);
        free(o_bits), free(lse_bits);
        cudaFree(qd), cudaFree(kd), cudaFree(vd), cudaFree(gd), cudaFree(od), cudaFree(queue);
        cudaFree(dq);
    }
    cudaFree(docs);
    assert_int_equal(bad, 0);
}

/* The backward kernels walk a CTA's query heads and tiles with 32-bit
 * counters: a block whose group x query tiles passes 2^31 - 1 is refused,
 * one just below is not; and dq must be 16-byte aligned. (Only the
 * arguments: no kernel runs.) */
static void test_bwd_walk_bound(void **state) {
    (void)state;
    char why[256] = "";
    dt_attn_segment q = {0, 1, (int64_t)1 << 16, 0, 0}, k = {0, 1, 128, 0, 0};
    dt_attn_block_bwd_args a = {.dtype = DT_BF16, .batch = 1, .heads = (int64_t)1 << 20,
                                .kv_heads = 1, .dim = 64, .qseg = q, .kseg = k};
    /* 2^20 heads x 2^10 tiles: 2^30 iterations */
    assert_true(dt_emu_attn_mma_bwd_block_ok(&a, why, sizeof why));
    a.qseg.len = (int64_t)1 << 17;   /* 2^31 */
    assert_false(dt_emu_attn_mma_bwd_block_ok(&a, why, sizeof why));
    assert_non_null(strstr(why, "more than 2^31 - 1 iterations"));
    /* dq's rows go by 16-byte bulk reductions (the wgmma kernel): an
     * 8-byte aligned dq, or a batch stride of 2 values more, is refused */
    a.qseg.len = 64;
    static float dq[68] __attribute__((aligned(16)));
    a.dq = dq;
    a.dq_batch_stride = 64;
    assert_true(dt_emu_attn_mma_bwd_block_ok(&a, why, sizeof why));
    a.dq = dq + 2;
    assert_false(dt_emu_attn_mma_bwd_block_ok(&a, why, sizeof why));
    assert_non_null(strstr(why, "not 16-byte aligned"));
    a.dq = dq;
    a.dq_batch_stride = 66;
    assert_false(dt_emu_attn_mma_bwd_block_ok(&a, why, sizeof why));
}

/* The tensor-core kernels divide by the key stride in 32 bits
 * (attention/cuda/mma_layout.h's dt_mma_keys): a block whose key positions span more than
 * 2^32 - 1 is refused, forward and backward, one that spans exactly that
 * is not. (Only the arguments: no kernel runs.) */
static void test_key_span_bound(void **state) {
    (void)state;
    char why[256] = "";
    const int64_t stride = ((int64_t)1 << 32) - 1;   /* two keys: a span of 2^32 - 1 */
    dt_attn_segment q = {0, 1, 64, 0, 0}, k = {0, stride, 2, 0, 0};
    dt_attn_block_args f = {.dtype = DT_BF16, .batch = 1, .heads = 1, .kv_heads = 1, .dim = 64,
                            .qseg = q, .kseg = k};
    dt_attn_block_bwd_args b = {.dtype = DT_BF16, .batch = 1, .heads = 1, .kv_heads = 1,
                                .dim = 64, .qseg = q, .kseg = k};
    assert_true(dt_emu_attn_mma_block_ok(&f, why, sizeof why));
    assert_true(dt_emu_attn_mma_bwd_block_ok(&b, why, sizeof why));
    f.kseg.stride = b.kseg.stride = stride + 1;
    assert_false(dt_emu_attn_mma_block_ok(&f, why, sizeof why));
    assert_non_null(strstr(why, "span more than 2^32 - 1"));
    why[0] = 0;
    assert_false(dt_emu_attn_mma_bwd_block_ok(&b, why, sizeof why));
    assert_non_null(strstr(why, "span more than 2^32 - 1"));
}

/* The persistent wgmma forward past a query tile without keys. Queries at
 * positions 0 .. 399, keys at 200 .. 499, causal: query tile 0 sees no key,
 * tiles 1 to 3 one or two key tiles. Four heads in sections of three units
 * (the narrower, head 0, first), on one SM: the CTA that takes head 0's
 * keyless tile (the last of its section) goes on to head 1's first, whose
 * loads the keyless tile issues. One block (first and last: o and lse),
 * against a double-precision reference, its wgmma counted against the
 * warpgroups' key tiles (narrow ones at D = 128); then the same block beside a ring
 * transfer, which runs a CTA per tile, and both with the producer
 * warpgroup; all of it in both of the kernel's forms. */
static void test_wgmma_persistent_keyless(void **state) {
    (void)state;
    if (skipped_under_tsan()) {
        skip();
        return;
    }
    const int64_t H = 4, G = 2, nq = 400, nk = 300, kstart = 200;
    for (int run = 0; run < 2 * DT_ATTN_FORM_COUNT; run++) {   /* D = 64, 128; each form */
        const int64_t D = run < DT_ATTN_FORM_COUNT ? 64 : 128;
        const dt_attn_form form = (dt_attn_form)(run % DT_ATTN_FORM_COUNT);
        double *q = ref_input(71, nq * H * D, DT_BF16), *k = ref_input(72, nk * G * D, DT_BF16);
        double *v = ref_input(73, nk * G * D, DT_BF16);
        void *qd = as_dtype(q, (size_t)(nq * H * D), DT_BF16);
        void *kd = as_dtype(k, (size_t)(nk * G * D), DT_BF16);
        void *vd = as_dtype(v, (size_t)(nk * G * D), DT_BF16);
        void *od = NULL, *queue = NULL;
        assert_int_equal(cudaMalloc(&od, (size_t)(nq * H * D) * 2), cudaSuccess);
        assert_int_equal(cudaMalloc(&queue, DT_ATTN_WGMMA_QUEUE_BYTES), cudaSuccess);
        float *lse = zeros_f32((size_t)(H * nq)), *o = zeros_f32((size_t)(nq * H * D));
        const double scale = 1.0 / sqrt((double)D);
        dt_attn_block_args a = {
            .dtype = DT_BF16, .batch = 1, .heads = H, .kv_heads = G, .dim = D, .q = qd,
            .k = kd, .v = vd, .qseg = {0, 1, nq, 0, 0}, .kseg = {kstart, 1, nk, 0, 0},
            .mask = DT_ATTN_CAUSAL, .scale = (float)scale, .ml_head_stride = nq, .first = 1,
            .last = 1, .o = od, .lse = lse, .tuning = {DT_ATTN_KERNEL_WGMMA, 1, 1, 1}};
        char why[256];
        assert_true(dt_emu_attn_mma_block_ok(&a, why, sizeof why));
        const int64_t unit_bytes = 2 * nk * D * 2 / (H / G);   /* dt_mma_fwd_grid's section */
        const uint64_t ctas_before = dt_emu_get_counts().blocks;
        const uint64_t wgmma_before = dt_emu_get_counts().wgmma;
        assert_int_equal(dt_emu_attn_wgmma_fwd(NULL, &a, 2 * 3 * unit_bytes, 1, queue, 1, 0, form),
                         DT_SUCCESS);
        /* persistent: the CTAs one SM holds (two at D = 64), not one per tile */
        const int64_t tiles = (nq + 127) / 128 * H;
        assert_int_equal(dt_emu_get_counts().blocks - ctas_before, D == 64 ? 2 : 1);
        /* The tensor-core work: each warpgroup (64 query rows) runs D / 16
         * k-steps of S and 8 of P V (128 keys, 16 each) per key tile its
         * last row sees, none for the others; at D = 128 only 4 of P V
         * where that row sees no more than the first 64 keys of its last
         * tile (S there on 64 keys: as many wgmma, each half as wide),
         * unless a build compiled them out (DT_WGMMA_NARROW 0). */
        int64_t expect = 0;
        for (int64_t w0 = 0; w0 < nq; w0 += 64) {
            const int64_t last = w0 + 63 < nq ? w0 + 63 : nq - 1;
            const int64_t seen = last - kstart + 1 < 0 ? 0 : last - kstart + 1;
            const int64_t kt = (seen + 127) / 128;
            const int narrow = DT_WGMMA_NARROW && D == 128 && kt > 0 && seen - 128 * (kt - 1) <= 64;
            expect += kt * (D / 16 + 8) - (narrow ? 4 : 0);
        }
        assert_int_equal(dt_emu_get_counts().wgmma - wgmma_before, expect * H);
        for (size_t i = 0; i < (size_t)(nq * H * D); i++) o[i] = dt_value_get(od, DT_BF16, i);
        /* Beside a ring transfer, a CTA per tile (block.h's transfer), and
         * the same o, bit for bit. */
        void *o_persistent = malloc((size_t)(nq * H * D) * 2);
        assert_int_equal(cudaMemcpy(o_persistent, od, (size_t)(nq * H * D) * 2, cudaMemcpyDefault),
                         cudaSuccess);
        a.transfer = 1;
        const uint64_t ctas_beside = dt_emu_get_counts().blocks;
        assert_int_equal(dt_emu_attn_wgmma_fwd(NULL, &a, 2 * 3 * unit_bytes, 1, queue, 1, 0, form),
                         DT_SUCCESS);
        assert_int_equal(dt_emu_get_counts().blocks - ctas_beside, tiles);
        assert_memory_equal(od, o_persistent, (size_t)(nq * H * D) * 2);
        /* The producer warpgroup, at D = 128 (at D = 64 the switch changes
         * nothing); persistent past the keyless tile and a CTA per tile:
         * the same o, bit for bit (each row's arithmetic is the same). */
        for (int transfer = 0; D == 128 && transfer <= 1; transfer++) {
            a.transfer = transfer;
            memset(od, 0xff, (size_t)(nq * H * D) * 2);   /* emulated device memory is host memory */
            assert_int_equal(dt_emu_attn_wgmma_fwd(NULL, &a, 2 * 3 * unit_bytes, 1, queue, 1, 1, form),
                             DT_SUCCESS);
            assert_memory_equal(od, o_persistent, (size_t)(nq * H * D) * 2);
        }
        free(o_persistent);

        double *ref = calloc((size_t)(nq * H * D), sizeof *ref), *ref_lse = malloc((size_t)(H * nq) * sizeof *ref_lse);
        double *p = malloc((size_t)nk * sizeof *p);
        for (int64_t h = 0; h < H; h++)
            for (int64_t x = 0; x < nq; x++) {
                const int64_t g = h / (H / G), seen = x - kstart + 1 < 0 ? 0 : x - kstart + 1;
                double mx = -INFINITY, sum = 0;
                for (int64_t y = 0; y < seen; y++) {
                    double d = 0;
                    for (int64_t c = 0; c < D; c++) d += q[(x * H + h) * D + c] * k[(y * G + g) * D + c];
                    p[y] = d * scale;
                    mx = fmax(mx, p[y]);
                }
                for (int64_t y = 0; y < seen; y++) sum += p[y] = exp(p[y] - mx);
                for (int64_t y = 0; y < seen; y++)
                    for (int64_t c = 0; c < D; c++) ref[(x * H + h) * D + c] += p[y] / sum * v[(y * G + g) * D + c];
                ref_lse[h * nq + x] = seen ? mx + log(sum) : -INFINITY;
            }
        long bad = h_compare("o", o, ref, (size_t)(nq * H * D), 2e-2, 2e-2, NULL);
        bad += h_compare("lse", lse, ref_lse, (size_t)(H * nq), 2e-2, 2e-2, NULL);
        if (bad) print_error("D = %lld, %s form\n", (long long)D, dt_attn_form_name(form));
        free(q), free(k), free(v), free(o), free(lse), free(ref), free(ref_lse), free(p);
        cudaFree(qd), cudaFree(kd), cudaFree(vd), cudaFree(od), cudaFree(queue);
        assert_int_equal(bad, 0);
    }
}

/* ------------------------------------------ non-finite inputs (LATEST) */

/* Blocks of one query segment of NF_N rows (batch 1, NF_H query heads on
 * one kv head, causal, bf16) with a NaN or an Inf in their inputs, run by
 * a kernel's LATEST form with dt_attn_block_args.nonfinite = 1 (the
 * instance that keeps attention/block.h's non-finite rules), against the
 * same blocks on clean inputs with nonfinite = 0: what the poison reaches
 * must be NaN, a row with no allowed key o = 0 and lse = -inf, and every
 * other output the clean run's bit for bit (a row's arithmetic does not
 * depend on other rows, and the rules' instance does the same arithmetic
 * on finite values). */
enum { NF_N = 200, NF_H = 2 };

typedef struct nf_blocks {
    int wgmma;                  /* the kernel: wgmma (1) or mma.sync (0) */
    int64_t D;
    int nb;                     /* key blocks (1 or 2), the query segment's first to last */
    dt_attn_segment kseg[2];    /* the query segment is (0, 1, NF_N) */
    double *q, *dout;           /* [NF_N][NF_H][D], bf16 values */
    double *k[2], *v[2];        /* [NF_N][1][D] each */
} nf_blocks;

static const dt_attn_segment NF_QSEG = {0, 1, NF_N, 0, 0};

static nf_blocks nf_make(int wgmma, int64_t D, uint64_t seed) {
    nf_blocks f = {.wgmma = wgmma, .D = D, .nb = 1, .kseg = {NF_QSEG, NF_QSEG}};
    f.q = ref_input(seed, NF_N * NF_H * D, DT_BF16);
    f.dout = ref_input(seed + 1, NF_N * NF_H * D, DT_BF16);
    for (int i = 0; i < 2; i++) {
        f.k[i] = ref_input(seed + 2 + 2 * (uint64_t)i, NF_N * D, DT_BF16);
        f.v[i] = ref_input(seed + 3 + 2 * (uint64_t)i, NF_N * D, DT_BF16);
    }
    return f;
}

static void nf_free(nf_blocks *f) {
    free(f->q), free(f->dout);
    for (int i = 0; i < 2; i++) free(f->k[i]), free(f->v[i]);
}

/* The forward over the key blocks: o [NF_N][NF_H][D] (as stored, bf16),
 * lse [NF_H][NF_N]. */
static void nf_forward(const nf_blocks *f, int nonfinite, float *o, float *lse) {
    const int64_t D = f->D, nq = NF_N * NF_H * D;
    void *qd = as_dtype(f->q, (size_t)nq, DT_BF16), *kd[2], *vd[2], *od = NULL, *queue = NULL;
    for (int i = 0; i < f->nb; i++) {
        kd[i] = as_dtype(f->k[i], NF_N * (size_t)D, DT_BF16);
        vd[i] = as_dtype(f->v[i], NF_N * (size_t)D, DT_BF16);
    }
    assert_int_equal(cudaMalloc(&od, (size_t)nq * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&queue, DT_ATTN_WGMMA_QUEUE_BYTES), cudaSuccess);
    float *m = zeros_f32(NF_H * NF_N), *l = zeros_f32(NF_H * NF_N), *acc = zeros_f32((size_t)nq);
    char why[256];
    for (int i = 0; i < f->nb; i++) {
        dt_attn_block_args a = {
            .dtype = DT_BF16, .nonfinite = nonfinite, .batch = 1, .heads = NF_H, .kv_heads = 1,
            .dim = D, .q = qd, .q_batch_stride = nq, .k = kd[i], .v = vd[i],
            .kv_batch_stride = NF_N * D, .qseg = NF_QSEG, .kseg = f->kseg[i],
            .mask = DT_ATTN_CAUSAL, .scale = (float)(1.0 / sqrt((double)D)), .m = m, .l = l,
            .ml_batch_stride = NF_H * NF_N, .ml_head_stride = NF_N, .acc = acc,
            .acc_batch_stride = nq, .first = i == 0, .last = i == f->nb - 1, .o = od,
            .lse = lse,
            .tuning = {f->wgmma ? DT_ATTN_KERNEL_WGMMA_LATEST : DT_ATTN_KERNEL_MMA_LATEST, 1, 1, 1}};
        assert_true(dt_emu_attn_mma_block_ok(&a, why, sizeof why));
        const dt_status st =
            f->wgmma ? dt_emu_attn_wgmma_fwd(NULL, &a, 0, 1, queue, 0, 1, DT_ATTN_FORM_LATEST)
                     : dt_emu_attn_mma_fwd(NULL, &a, 0, 0, DT_ATTN_FORM_LATEST);
        if (st != DT_SUCCESS) fail_msg("forward block %d: %s", i, dt_last_error());
    }
    for (int64_t i = 0; i < nq; i++) o[i] = dt_value_get(od, DT_BF16, (size_t)i);
    cudaFree(qd), cudaFree(od), cudaFree(queue);
    for (int i = 0; i < f->nb; i++) cudaFree(kd[i]), cudaFree(vd[i]);
    free(m), free(l), free(acc);
}

/* The backward over the key blocks from the forward's o and lse (delta =
 * rowsum(dout o) here): dq [NF_N][NF_H][D], dk, dv of block 0 [NF_N][D]. */
static void nf_backward(const nf_blocks *f, int nonfinite, const float *o, const float *lse,
                        float *dq_out, float *dk_out, float *dv_out) {
    const int64_t D = f->D, nq = NF_N * NF_H * D;
    void *qd = as_dtype(f->q, (size_t)nq, DT_BF16), *gd = as_dtype(f->dout, (size_t)nq, DT_BF16);
    float *delta = zeros_f32(NF_H * NF_N), *dq = device_zeros_f32((size_t)nq);
    for (int64_t x = 0; x < NF_N; x++)
        for (int64_t h = 0; h < NF_H; h++) {
            float sum = 0.0f;
            for (int64_t d = 0; d < D; d++)
                sum += o[(x * NF_H + h) * D + d] * (float)f->dout[(x * NF_H + h) * D + d];
            delta[h * NF_N + x] = sum;
        }
    char why[256];
    for (int i = 0; i < f->nb; i++) {
        void *kd = as_dtype(f->k[i], NF_N * (size_t)D, DT_BF16);
        void *vd = as_dtype(f->v[i], NF_N * (size_t)D, DT_BF16);
        float *dk = zeros_f32(NF_N * (size_t)D), *dv = zeros_f32(NF_N * (size_t)D);
        dt_attn_block_bwd_args a = {
            .dtype = DT_BF16, .nonfinite = nonfinite, .batch = 1, .heads = NF_H, .kv_heads = 1,
            .dim = D, .q = qd, .dout = gd, .q_batch_stride = nq, .k = kd, .v = vd,
            .kv_batch_stride = NF_N * D, .qseg = NF_QSEG, .kseg = f->kseg[i],
            .mask = DT_ATTN_CAUSAL, .scale = (float)(1.0 / sqrt((double)D)), .lse = lse,
            .delta = delta, .ml_batch_stride = NF_H * NF_N, .ml_head_stride = NF_N, .dq = dq,
            .dq_batch_stride = nq, .dk = dk, .dv = dv, .first = 1, .continues = i > 0,
            .tuning = {f->wgmma ? DT_ATTN_KERNEL_WGMMA_LATEST : DT_ATTN_KERNEL_MMA_LATEST, 1, 1, 1}};
        assert_true(dt_emu_attn_mma_bwd_block_ok(&a, why, sizeof why));
        const dt_status st = f->wgmma ? dt_emu_attn_wgmma_bwd(NULL, &a, 0, 0, DT_ATTN_FORM_LATEST)
                                      : dt_emu_attn_mma_bwd(NULL, &a, 0, 0, DT_ATTN_FORM_LATEST);
        if (st != DT_SUCCESS) fail_msg("backward block %d: %s", i, dt_last_error());
        if (i == 0) {
            memcpy(dk_out, dk, NF_N * (size_t)D * sizeof *dk);
            memcpy(dv_out, dv, NF_N * (size_t)D * sizeof *dv);
        }
        cudaFree(kd), cudaFree(vd), free(dk), free(dv);
    }
    memcpy(dq_out, dq, (size_t)nq * sizeof *dq);
    cudaFree(qd), cudaFree(gd), cudaFree(dq), free(delta);
}

/* got against want over rows [0, rows) of `width` values: rows where
 * reached(row) must be all NaN, the others want's bits, but that column
 * maybe_col (>= 0) may also be NaN. Returns the failures, printing the
 * first few. */
typedef int (*nf_reach)(int64_t row);
static long nf_judge(const char *what, const float *got, const float *want, int64_t rows,
                     int64_t width, nf_reach reached, int64_t maybe_col) {
    long bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < width; c++) {
            const float g = got[r * width + c], w = want[r * width + c];
            const int nan_wanted = reached && reached(r);
            const int ok = nan_wanted ? isnan(g)
                                      : memcmp(&g, &w, sizeof g) == 0 || (c == maybe_col && isnan(g));
            if (!ok && bad++ < 4)
                print_error("%s[%lld][%lld] = %g, want %s%g\n", what, (long long)r, (long long)c,
                            (double)g, nan_wanted ? "NaN, not " : "the clean run's ", (double)w);
        }
    return bad;
}

/* o rows [x][h] (NF_N x NF_H rows of D), lse rows [h][x] (one value each:
 * judged with a reach on x = row % NF_N). */
static int64_t nf_row_at;   /* the poisoned query row, for the reaches below */
static int reach_o_row(int64_t r) { return r == nf_row_at * NF_H + 1; }      /* head 1 */
static int reach_lse_row(int64_t r) { return r == NF_N + nf_row_at; }       /* head 1 */
static int reach_o_from(int64_t r) { return r / NF_H >= nf_row_at; }        /* rows x >= y */
static int reach_lse_from(int64_t r) { return r % NF_N >= nf_row_at; }
static int reach_key(int64_t r) { return r == nf_row_at; }
static int reach_dq_row0(int64_t r) { return r == nf_row_at * NF_H; }        /* head 0 */

static void test_nonfinite_forward(void **state) {
    (void)state;
    if (skipped_under_tsan()) {
        skip();
        return;
    }
    long bad = 0;
    const int64_t D_max = getenv("DT_TEST_QUICK") ? 64 : 128;   /* valgrind: D = 64 */
    for (int kc = 0; kc < 2; kc++)
        for (int64_t D = 64; D <= D_max; D += 64) {
            nf_blocks f = nf_make(kc, D, 8100 + 10 * (uint64_t)kc + (uint64_t)D);
            const int64_t nq = NF_N * NF_H * D, nl = NF_H * NF_N;
            float *o0 = malloc((size_t)nq * 4), *lse0 = malloc((size_t)nl * 4);
            float *o = malloc((size_t)nq * 4), *lse = malloc((size_t)nl * 4);
            const char *kn = kc ? "wgmma" : "mma";
            long b0 = bad;
            /* clean inputs: the rules' instance gives the finite path's bits */
            nf_forward(&f, 0, o0, lse0);
            nf_forward(&f, 1, o, lse);
            bad += nf_judge("clean o", o, o0, NF_N * NF_H, D, NULL, -1);
            bad += nf_judge("clean lse", lse, lse0, nl, 1, NULL, -1);
            /* NaN in q[150][1][3]: that row's o and lse */
            nf_row_at = 150;
            const size_t qi = (size_t)((150 * NF_H + 1) * D + 3);
            const double q_saved = f.q[qi];
            f.q[qi] = NAN;
            nf_forward(&f, 1, o, lse);
            f.q[qi] = q_saved;
            bad += nf_judge("q NaN: o", o, o0, NF_N * NF_H, D, reach_o_row, -1);
            bad += nf_judge("q NaN: lse", lse, lse0, nl, 1, reach_lse_row, -1);
            /* +inf, -inf in k[70][0][5]: every row that may attend key 70
             * (x >= 70, both heads) NaN, a logit of either sign */
            nf_row_at = 70;
            for (int sign = 1; sign >= -1; sign -= 2) {
                const size_t ki = (size_t)(70 * D + 5);
                const double k_saved = f.k[0][ki];
                f.k[0][ki] = sign * INFINITY;
                nf_forward(&f, 1, o, lse);
                f.k[0][ki] = k_saved;
                bad += nf_judge(sign > 0 ? "k +inf: o" : "k -inf: o", o, o0, NF_N * NF_H, D,
                                reach_o_from, -1);
                bad += nf_judge(sign > 0 ? "k +inf: lse" : "k -inf: lse", lse, lse0, nl, 1,
                                reach_lse_from, -1);
            }
            /* Keys at positions 100 .. 299, all NaN in k and v: rows 0 ..
             * 99 have no allowed key (o = 0, lse = -inf; rows 64 .. 99 in
             * a computed tile with them), the others NaN. */
            nf_blocks g = f;
            g.kseg[0] = (dt_attn_segment){100, 1, NF_N, 0, 0};
            double *kn_saved = g.k[0], *vn_saved = g.v[0];
            g.k[0] = malloc(NF_N * (size_t)D * sizeof(double));
            g.v[0] = malloc(NF_N * (size_t)D * sizeof(double));
            for (int64_t i = 0; i < NF_N * D; i++) g.k[0][i] = g.v[0][i] = NAN;
            nf_forward(&g, 1, o, lse);
            float *zeros = calloc((size_t)nq, 4), *ninf = malloc((size_t)nl * 4);
            for (int64_t i = 0; i < nl; i++) ninf[i] = -INFINITY;
            nf_row_at = 100;
            bad += nf_judge("masked NaN keys: o", o, zeros, NF_N * NF_H, D, reach_o_from, -1);
            bad += nf_judge("masked NaN keys: lse", lse, ninf, nl, 1, reach_lse_from, -1);
            /* Two blocks: clean keys, then keys at 100 .. 299 with NaN in
             * every k (v clean): rows 0 .. 99 see none of those, and keep
             * the clean two blocks' bits through the merge; the others NaN. */
            for (int64_t i = 0; i < NF_N * D; i++) g.k[0][i] = kn_saved[i];
            for (int64_t i = 0; i < NF_N * D; i++) g.v[0][i] = vn_saved[i];
            g.nb = 2;
            g.kseg[0] = NF_QSEG;
            g.kseg[1] = (dt_attn_segment){100, 1, NF_N, 0, 0};
            nf_forward(&g, 0, o0, lse0);
            double *k1_saved = g.k[1];
            g.k[1] = malloc(NF_N * (size_t)D * sizeof(double));
            for (int64_t i = 0; i < NF_N * D; i++) g.k[1][i] = NAN;
            nf_forward(&g, 1, o, lse);
            bad += nf_judge("second block NaN keys: o", o, o0, NF_N * NF_H, D, reach_o_from, -1);
            bad += nf_judge("second block NaN keys: lse", lse, lse0, nl, 1, reach_lse_from, -1);
            free(g.k[0]), free(g.v[0]), free(g.k[1]);
            g.k[1] = k1_saved;
            if (bad > b0) print_error("%s forward, D = %lld: %ld failures\n", kn, (long long)D, bad - b0);
            free(o0), free(lse0), free(o), free(lse), free(zeros), free(ninf);
            nf_free(&f);
        }
    assert_int_equal(bad, 0);
}

static void test_nonfinite_backward(void **state) {
    (void)state;
    if (skipped_under_tsan()) {
        skip();
        return;
    }
    long bad = 0;
    const int64_t D_max = getenv("DT_TEST_QUICK") ? 64 : 128;   /* valgrind: D = 64 */
    for (int kc = 0; kc < 2; kc++)
        for (int64_t D = 64; D <= D_max; D += 64) {
            nf_blocks f = nf_make(kc, D, 8300 + 10 * (uint64_t)kc + (uint64_t)D);
            const int64_t nq = NF_N * NF_H * D, nl = NF_H * NF_N, nk = NF_N * D;
            float *o0 = malloc((size_t)nq * 4), *lse0 = malloc((size_t)nl * 4);
            float *o = malloc((size_t)nq * 4), *lse = malloc((size_t)nl * 4);
            float *dq0 = malloc((size_t)nq * 4), *dk0 = malloc((size_t)nk * 4), *dv0 = malloc((size_t)nk * 4);
            float *dq = malloc((size_t)nq * 4), *dk = malloc((size_t)nk * 4), *dv = malloc((size_t)nk * 4);
            const char *kn = kc ? "wgmma" : "mma";
            long b0 = bad;
            nf_forward(&f, 0, o0, lse0);
            /* clean inputs: the rules' instance gives the finite path's bits */
            nf_backward(&f, 0, o0, lse0, dq0, dk0, dv0);
            nf_backward(&f, 1, o0, lse0, dq, dk, dv);
            bad += nf_judge("clean dq", dq, dq0, NF_N * NF_H, D, NULL, -1);
            bad += nf_judge("clean dk", dk, dk0, NF_N, D, NULL, -1);
            bad += nf_judge("clean dv", dv, dv0, NF_N, D, NULL, -1);
            /* NaN in dout[120][0][7] (delta of that row NaN): its dq row;
             * dk of every key it attends (y <= 120), dv of those in column
             * 7; the other dq rows keep their bits */
            nf_row_at = 120;
            const size_t gi = (size_t)((120 * NF_H + 0) * D + 7);
            const double g_saved = f.dout[gi];
            f.dout[gi] = NAN;
            nf_backward(&f, 1, o0, lse0, dq, dk, dv);
            f.dout[gi] = g_saved;
            bad += nf_judge("dout NaN: dq", dq, dq0, NF_N * NF_H, D, reach_dq_row0, -1);
            for (int64_t y = 0; y <= 120; y++)
                for (int64_t d = 0; d < D; d++)
                    if (!isnan(dk[y * D + d]) || (d == 7 && !isnan(dv[y * D + d]))) {
                        if (bad++ < 4)
                            print_error("dout NaN: dk[%lld][%lld] = %g, dv = %g: want NaN\n",
                                        (long long)y, (long long)d, (double)dk[y * D + d],
                                        (double)dv[y * D + d]);
                    }
            /* NaN in q[150][1][3], through the forward (o, lse of the row
             * NaN): its dq row, and dk, dv of every key it attends */
            nf_row_at = 150;
            const size_t qi = (size_t)((150 * NF_H + 1) * D + 3);
            const double q_saved = f.q[qi];
            f.q[qi] = NAN;
            nf_forward(&f, 1, o, lse);
            nf_backward(&f, 1, o, lse, dq, dk, dv);
            f.q[qi] = q_saved;
            bad += nf_judge("q NaN: dq", dq, dq0, NF_N * NF_H, D, reach_o_row, -1);
            for (int64_t y = 0; y <= 150; y++)
                for (int64_t d = 0; d < D; d++)
                    if (!isnan(dk[y * D + d]) || !isnan(dv[y * D + d])) {
                        if (bad++ < 4)
                            print_error("q NaN: dk[%lld][%lld] = %g, dv = %g: want NaN\n",
                                        (long long)y, (long long)d, (double)dk[y * D + d],
                                        (double)dv[y * D + d]);
                    }
            /* -inf in k[70][0][5] with the clean forward's lse: the logits
             * of key 70 are infinite, so P of every row that attends it
             * (x >= 70) is NaN: those dq rows, and dk, dv of key 70; the
             * other dq rows keep their bits but in column 5, where a row of
             * a tile computed with key 70 may get its 0 x -inf (dQ = dS K:
             * block.h), and dk, dv of the other keys keep theirs */
            nf_row_at = 70;
            const size_t ki = (size_t)(70 * D + 5);
            const double k_saved = f.k[0][ki];
            f.k[0][ki] = -INFINITY;
            nf_backward(&f, 1, o0, lse0, dq, dk, dv);
            f.k[0][ki] = k_saved;
            bad += nf_judge("k -inf: dq", dq, dq0, NF_N * NF_H, D, reach_o_from, 5);
            bad += nf_judge("k -inf: dk", dk, dk0, NF_N, D, reach_key, -1);
            bad += nf_judge("k -inf: dv", dv, dv0, NF_N, D, reach_key, -1);
            if (bad > b0) print_error("%s backward, D = %lld: %ld failures\n", kn, (long long)D, bad - b0);
            free(o0), free(lse0), free(o), free(lse), free(dq0), free(dk0), free(dv0);
            free(dq), free(dk), free(dv);
            nf_free(&f);
        }
    assert_int_equal(bad, 0);
}

#endif /* DT_EMU_NO_CXX */

/* ------------------------------------------------------ the emulator itself
 *
 * Small kernels written in C against emu.h: the emulator must reject what
 * the CUDA and PTX documents call undefined or a hang, and give cp.async
 * its asynchronous meaning, or the kernel tests above could pass for the
 * wrong reason. */

static const dt_emu_dim3 ONE = {1, 1, 1}, WARP = {32, 1, 1}, TWO_WARPS = {64, 1, 1};

/* Launches body on `block` threads; returns the error message ("" if none). */
static const char *emu_run(dt_emu_dim3 block, size_t smem, void (*body)(void *), void *arg) {
    static char err[512];
    err[0] = 0;
    int rc = dt_emu_launch(ONE, block, smem, 0, body, arg, err, sizeof err);
    assert_true(rc == 0 ? err[0] == 0 : err[0] != 0);
    return err;
}

static int lane(void) { return (int)dt_emu_thread_idx()->x; }

/* Lane l gets lane l ^ 1's value; thread 0 of each block stores it. */
static void k_shfl(void *arg) {
    float got = dt_emu_shfl_xor(0xffffffffu, (float)lane(), 1);
    ((float *)arg)[lane() % 32] = got;
}

/* Half the warp at a shuffle, the other half at ldmatrix. */
static void k_divergent(void *arg) {
    (void)arg;
    uint32_t r[4];
    if (lane() < 16) (void)dt_emu_shfl_xor(0xffffffffu, 1.0f, 1);
    else dt_emu_ldmatrix_x4(r, dt_emu_dynamic_smem(), 0);
}

/* Lane 0 exits; the others shuffle without it. */
static void k_exited_lane(void *arg) {
    (void)arg;
    if (lane() == 0) return;
    (void)dt_emu_shfl_xor(0xffffffffu, 1.0f, 1);
}

/* Warp 0 and lane 32 wait in __syncthreads, the rest of warp 1 in a
 * shuffle that lane 32 never joins: a hang on a GPU. */
static void k_deadlock(void *arg) {
    (void)arg;
    if (lane() <= 32) dt_emu_syncthreads();
    else (void)dt_emu_shfl_xor(0xffffffffu, 1.0f, 1);
}

/* One lane's ldmatrix row address 16 bytes past the end of shared memory. */
static void k_ldmatrix_oob(void *arg) {
    (void)arg;
    uint32_t r[4];
    unsigned char *smem = dt_emu_dynamic_smem();
    dt_emu_ldmatrix_x4(r, smem + (lane() == 7 ? 4096 : 16 * (lane() % 8)), 0);
}

/* cp.async of 16 bytes: read before its wait_group (garbage: 0xff), after
 * it (the data), and a zero fill. */
typedef struct cp_state {
    unsigned char src[32] __attribute__((aligned(16)));
    unsigned char early[16], late[16], zero[16];
} cp_state;
static void k_cp_async(void *arg) {
    cp_state *c = arg;
    unsigned char *smem = dt_emu_dynamic_smem();
    dt_emu_cp_async16(smem, c->src, 16);
    dt_emu_cp_async16(smem + 16, c->src + 16, 0);
    dt_emu_cp_commit();
    memcpy(c->early, smem, 16);
    dt_emu_cp_wait(0);
    memcpy(c->late, smem, 16);
    memcpy(c->zero, smem + 16, 16);
}

/* ldmatrix .x4 reads the 8x8 matrices as the PTX ISA's figure shows (lane
 * l: row l/4, columns 2(l%4), +1 of each; .trans: the transpose), with the
 * rows at the lanes' addresses (matrix m's row r from lane 8m + r). */
static void k_ldmatrix(void *arg) {
    uint32_t *out = arg;
    uint16_t *smem = (uint16_t *)dt_emu_dynamic_smem();
    if (lane() == 0)
        for (int i = 0; i < 4 * 64; i++) smem[i] = (uint16_t)i;   /* matrix m at 64 m */
    dt_emu_syncthreads();
    /* matrix m's row r at element 64 m + 8 (7 - r): rows given in reverse */
    const int m = lane() / 8, r = lane() % 8;
    uint32_t reg[4], regt[4];
    dt_emu_ldmatrix_x4(reg, smem + 64 * m + 8 * (7 - r), 0);
    dt_emu_ldmatrix_x4(regt, smem + 64 * m + 8 * (7 - r), 1);
    for (int j = 0; j < 4; j++) {
        out[8 * lane() + j] = reg[j];
        out[8 * lane() + 4 + j] = regt[j];
    }
}

/* stmatrix .x4 stores the registers as the PTX ISA's figure shows them
 * (ldmatrix's layout: lane l holds row l/4, columns 2(l%4), +1 of each
 * matrix; .trans stores the transpose), each matrix row at its lane's
 * address: matrix m's row r at element 64 m + 8 (7 - r), the plain store
 * in the first 256 elements, the transposed one in the next 256. Lane l's
 * register m holds 64 m + 2 l (low half) and 64 m + 2 l + 1 (high). With
 * `misaligned`, lane 13's row is 8 bytes off: the error instead. */
typedef struct st_state {
    int misaligned;
    uint16_t out[512];   /* the shared memory after both stores */
} st_state;
static void k_stmatrix(void *arg) {
    st_state *st = arg;
    uint16_t *smem = (uint16_t *)dt_emu_dynamic_smem();
    const int m = lane() / 8, r = lane() % 8;
    uint32_t reg[4];
    for (int j = 0; j < 4; j++) reg[j] = (64u * j + 2u * lane()) | (64u * j + 2u * lane() + 1) << 16;
    uint16_t *row = smem + 64 * m + 8 * (7 - r) + (st->misaligned && lane() == 13 ? 4 : 0);
    dt_emu_stmatrix_x4(row, reg, 0);
    dt_emu_stmatrix_x4(row + 256, reg, 1);
    if (lane() == 0) memcpy(st->out, smem, sizeof st->out);   /* both are complete */
}

/* Named barriers: warp 1 waits in bar.sync 1 until warp 0's bar.arrive,
 * and sees what warp 0 stored before it; warp 0 never waits. Three rounds,
 * so the barrier's phases restart. */
static void k_named(void *arg) {
    int *seen = arg;
    volatile int *box = (volatile int *)dt_emu_dynamic_smem();
    for (int round = 0; round < 3; round++) {
        if (lane() < 32) {
            if (lane() == 0) *box = 10 + round;
            dt_emu_bar_arrive(1, 64);
            dt_emu_bar_sync(2, 64);   /* warp 1 has read the box */
        } else {
            dt_emu_bar_sync(1, 64);
            if (lane() == 32) seen[round] = *box;
            dt_emu_bar_arrive(2, 64);
        }
    }
}
/* Warp 1 waits for an arrival that never comes. */
static void k_named_deadlock(void *arg) {
    (void)arg;
    if (lane() >= 32) dt_emu_bar_sync(1, 64);
}
/* Warp 0 arrives and nobody completes the phase. */
static void k_named_left(void *arg) {
    (void)arg;
    if (lane() < 32) dt_emu_bar_arrive(3, 64);
}
/* The two warps disagree on the thread count. */
static void k_named_count(void *arg) {
    (void)arg;
    if (lane() < 32) dt_emu_bar_arrive(1, 64);
    else dt_emu_bar_sync(1, 32);   /* warp 0 (the lead warp of block 0) arrives first */
}

static void test_named_barriers(void **state) {
    (void)state;
    int seen[3] = {0, 0, 0};
    assert_string_equal(emu_run(TWO_WARPS, 16, k_named, seen), "");
    for (int r = 0; r < 3; r++) assert_int_equal(seen[r], 10 + r);
    assert_non_null(strstr(emu_run(TWO_WARPS, 0, k_named_deadlock, NULL), "in bar.sync 1 (32 of 64"));
    assert_non_null(strstr(emu_run(TWO_WARPS, 0, k_named_left, NULL), "named barrier 3 ended the block"));
    assert_non_null(strstr(emu_run(TWO_WARPS, 0, k_named_count, NULL), "that counts 64 threads"));
}

/* ex2.approx.ftz (the kernels' exp2_ftz, attention/cuda/common.cuh): 2^x for normal
 * results, against ldexp's exact powers and the host's exp2f; a result
 * below the smallest normal float, 2^-126, is 0, not exp2f's subnormal; a
 * subnormal x counts as 0; -inf gives 0 and NaN stays NaN. */
/* cp.reduce.async.bulk.add.f32 (emu.h): lane l of a warp stores 4 fp32
 * values of 512 bytes of shared memory, 4 l + i each, and lane 0 adds them
 * into dst in two bulk reductions of 256 bytes, a commit group each, then
 * waits. mode 0: as it should be (fence.proxy.async, a barrier, the
 * reductions, wait_group 1 then 0, the first half of the source rewritten
 * between them: its reduction was complete); 1: no fence before the
 * barrier; 2: the second half rewritten before the wait that completes
 * its reduction; 3: no wait at all (the thread exits reading). */
typedef struct bulk_case {
    int mode;
    float *dst;   /* 128 values in emulated device memory */
} bulk_case;
static void k_bulk(void *arg) {
    const bulk_case *c = arg;
    float *smem = (float *)dt_emu_dynamic_smem();
    for (int i = 0; i < 4; i++) smem[4 * lane() + i] = (float)(4 * lane() + i);
    if (c->mode != 1) dt_emu_fence_proxy_async();
    dt_emu_syncthreads();
    if (lane() != 0) return;
    dt_emu_bulk_reduce_add_f32(c->dst, smem, 256);
    dt_emu_bulk_commit();
    dt_emu_bulk_reduce_add_f32(c->dst + 64, smem + 64, 256);
    dt_emu_bulk_commit();
    if (c->mode == 3) return;
    dt_emu_bulk_wait(1);   /* the first is complete, the second may still read */
    smem[0] = -1.0f;       /* the first's source: free again */
    if (c->mode == 2) smem[64] = -1.0f;
    dt_emu_bulk_wait(0);
}

static void test_bulk_reduce(void **state) {
    (void)state;
    static const char *const want[4] = {"", "no fence.proxy.async and barrier",
                                        "was written while a cp.reduce.async.bulk read it",
                                        "exited with 2 cp.reduce.async.bulk"};
    const uint64_t before = dt_emu_get_counts().bulk;
    for (int mode = 0; mode < 4; mode++) {
        bulk_case c = {mode, NULL};
        assert_int_equal(cudaMalloc((void **)&c.dst, 128 * sizeof(float)), cudaSuccess);
        for (int i = 0; i < 128; i++) c.dst[i] = 1000.0f + (float)i;   /* host memory here */
        const char *err = emu_run(WARP, 512, k_bulk, &c);
        if (mode == 0) {
            assert_string_equal(err, "");
            for (int i = 0; i < 128; i++) assert_true(c.dst[i] == 1000.0f + 2.0f * (float)i);
        } else if (!strstr(err, want[mode])) {
            print_error("mode %d: got \"%s\"\n", mode, err);
            fail();
        }
        cudaFree(c.dst);
    }
    assert_int_equal(dt_emu_get_counts().bulk - before, 2 + 0 + 2 + 2);
}

/* max.NaN.f32: the larger value, +0 above -0, the canonical NaN if either
 * operand is NaN (fmaxf would return the other operand). */
static void test_max_nan(void **state) {
    (void)state;
    const float canonical = dt_emu_max_nan(NAN, 1.0f);
    uint32_t bits;
    memcpy(&bits, &canonical, sizeof bits);
    assert_int_equal(bits, 0x7fffffffu);
    assert_true(isnan(dt_emu_max_nan(1.0f, NAN)) && isnan(dt_emu_max_nan(-INFINITY, NAN)));
    assert_true(isnan(dt_emu_max_nan(NAN, INFINITY)) && isnan(dt_emu_max_nan(-NAN, -NAN)));
    assert_true(!isnan(fmaxf(-INFINITY, NAN)));   /* what the kernels' finite path does */
    assert_true(dt_emu_max_nan(2.0f, -3.0f) == 2.0f && dt_emu_max_nan(-3.0f, 2.0f) == 2.0f);
    assert_true(dt_emu_max_nan(-INFINITY, -1e30f) == -1e30f);
    assert_true(dt_emu_max_nan(INFINITY, 1.0f) == INFINITY);
    assert_true(dt_emu_max_nan(-INFINITY, -INFINITY) == -INFINITY);
    assert_false(signbit(dt_emu_max_nan(-0.0f, 0.0f)));
    assert_false(signbit(dt_emu_max_nan(0.0f, -0.0f)));
    assert_true(signbit(dt_emu_max_nan(-0.0f, -0.0f)));
}

static void test_ex2_ftz(void **state) {
    (void)state;
    for (int e = -126; e <= 127; e++) assert_true(dt_emu_ex2_ftz((float)e) == ldexpf(1.0f, e));
    const float xs[] = {-125.9f, -87.3f, -1.5f, -1e-3f, 0.3f, 10.25f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        assert_true(dt_emu_ex2_ftz(xs[i]) == exp2f(xs[i]));
    const float below = nextafterf(-126.0f, -INFINITY);   /* exp2f: a subnormal */
    assert_true(exp2f(below) > 0.0f && exp2f(below) < ldexpf(1.0f, -126));
    assert_true(dt_emu_ex2_ftz(below) == 0.0f);
    assert_true(dt_emu_ex2_ftz(-140.0f) == 0.0f && exp2f(-140.0f) > 0.0f);
    assert_true(dt_emu_ex2_ftz(-1e4f) == 0.0f);
    assert_true(dt_emu_ex2_ftz(-INFINITY) == 0.0f);
    assert_true(dt_emu_ex2_ftz(ldexpf(1.0f, -140)) == 1.0f);   /* subnormal x: 2^0 */
    assert_true(isnan(dt_emu_ex2_ftz(NAN)));
}

/* setmaxnreg (the wgmma forward's producer warpgroup gives its registers
 * to the two consumers): arg[0], arg[1] the counts warpgroups 0, 1 take
 * with .inc, granted once warpgroup 2 has given up all but arg[2] with
 * .dec (the emulator runs warpgroups 0 and 1 first: their .inc waits);
 * arg[3]: one thread of warpgroup 0 asks for 8 more than the others. */
static void k_setmaxnreg(void *arg) {
    const int *n = arg, t = lane(), wg = t / 128;
    if (wg == 2) {
        dt_emu_setmaxnreg(0, n[2]);
        return;
    }
    dt_emu_setmaxnreg(1, n[wg] + (n[3] && t == 5 ? 8 : 0));
}

static void test_setmaxnreg(void **state) {
    (void)state;
    const dt_emu_dim3 three = {384, 1, 1};
    /* the forward's split: 2 x 224 + 56 = 3 x 168 */
    assert_string_equal(emu_run(three, 0, k_setmaxnreg, (int[]){224, 224, 56, 0}), "");
    assert_string_equal(emu_run(three, 0, k_setmaxnreg, (int[]){240, 240, 24, 0}), "");
    /* 2 x 240 + 40 is more than the SM has: the second .inc waits forever */
    const char *err = emu_run(three, 0, k_setmaxnreg, (int[]){240, 240, 40, 0});
    assert_non_null(strstr(err, "deadlock"));
    assert_non_null(strstr(err, "in setmaxnreg.inc, waiting for registers"));
    /* an .inc below the 168 a CTA of 384 threads starts with */
    assert_non_null(strstr(emu_run(three, 0, k_setmaxnreg, (int[]){160, 224, 56, 0}),
                           "setmaxnreg.inc 160 by warpgroup 0, which has 168 registers per thread"));
    assert_non_null(strstr(emu_run(three, 0, k_setmaxnreg, (int[]){224, 224, 20, 0}),
                           "setmaxnreg.dec 20: the count must be a multiple of 8 from 24 to 256"));
    assert_non_null(strstr(emu_run(three, 0, k_setmaxnreg, (int[]){224, 224, 56, 1}),
                           "threads of warpgroup 0 disagree on setmaxnreg"));
    /* a warpgroup of a 64-thread block is not whole */
    assert_non_null(strstr(emu_run(TWO_WARPS, 0, k_setmaxnreg, (int[]){224, 224, 56, 0}),
                           "its warpgroups must be whole"));
}

/* Programmatic dependent launch: arg[0] says when each thread runs
 * griddepcontrol.wait (0 never, 1 before the marked read, 2 after it);
 * with arg[1], warp 0 of the two neither waits nor reads. */
static void k_griddep(void *arg) {
    const int *how = arg;
    const int waits = !how[1] || lane() >= 32;
    dt_emu_griddep_launch();
    if (waits && how[0] == 1) dt_emu_griddep_wait();
    if (waits) dt_emu_griddep_require("the marked read");
    if (waits && how[0] == 2) dt_emu_griddep_wait();
}

static const char *emu_run_dependent(int dependent, const int *how) {
    static char err[512];
    err[0] = 0;
    int rc = dt_emu_launch(ONE, TWO_WARPS, 0, dependent, k_griddep, (void *)how, err, sizeof err);
    assert_true(rc == 0 ? err[0] == 0 : err[0] != 0);
    return err;
}

static void test_griddep(void **state) {
    (void)state;
    const uint64_t before = dt_emu_get_counts().dependent;
    /* not a dependent launch: nothing to wait for */
    assert_string_equal(emu_run_dependent(0, (const int[]){0, 0}), "");
    assert_string_equal(emu_run_dependent(0, (const int[]){2, 0}), "");
    assert_int_equal(dt_emu_get_counts().dependent, before);
    /* dependent: the wait before the read, and before the exit */
    assert_string_equal(emu_run_dependent(1, (const int[]){1, 0}), "");
    assert_non_null(strstr(emu_run_dependent(1, (const int[]){2, 0}),
                           "the marked read in a programmatic dependent launch before "
                           "griddepcontrol.wait"));
    assert_non_null(strstr(emu_run_dependent(1, (const int[]){0, 0}), "before griddepcontrol.wait"));
    /* warp 0 never waits (and skips the read): its exit fails */
    assert_non_null(strstr(emu_run_dependent(1, (const int[]){1, 1}), "exiting in a programmatic "
                                                                        "dependent launch"));
    assert_int_equal(dt_emu_get_counts().dependent, before + 4);
}

static void test_emulator(void **state) {
    (void)state;
    float shfl[32];
    assert_string_equal(emu_run(WARP, 0, k_shfl, shfl), "");
    for (int l = 0; l < 32; l++) assert_true(shfl[l] == (float)(l ^ 1));

    assert_non_null(strstr(emu_run(WARP, 64, k_divergent, NULL), "different warp instructions"));
    assert_non_null(strstr(emu_run(WARP, 0, k_exited_lane, NULL), "has exited"));
    assert_non_null(strstr(emu_run(TWO_WARPS, 0, k_deadlock, NULL), "deadlock"));
    assert_non_null(strstr(emu_run(WARP, 4096, k_ldmatrix_oob, NULL), "lane 7"));

    cp_state c;
    for (int i = 0; i < 32; i++) c.src[i] = (unsigned char)(i + 1);
    assert_string_equal(emu_run(ONE, 32, k_cp_async, &c), "");
    for (int i = 0; i < 16; i++) {
        assert_int_equal(c.early[i], 0xff);
        assert_int_equal(c.late[i], i + 1);
        assert_int_equal(c.zero[i], 0);
    }

    static uint32_t ld[32 * 8];
    assert_string_equal(emu_run(WARP, 4 * 64 * 2, k_ldmatrix, ld), "");
    for (int l = 0; l < 32; l++)
        for (int m = 0; m < 4; m++)
            for (int h = 0; h < 2; h++) {
                /* element (row, col) of matrix m as loaded holds 64 m +
                 * 8 (7 - row) + col (its rows were given in reverse) */
                const uint32_t plain = 64u * m + 8u * (7 - l / 4) + 2u * (l % 4) + h;
                const uint32_t trans = 64u * m + 8u * (7 - (2 * (l % 4) + h)) + (l / 4);
                assert_int_equal((ld[8 * l + m] >> (16 * h)) & 0xffff, plain);
                assert_int_equal((ld[8 * l + 4 + m] >> (16 * h)) & 0xffff, trans);
            }

    /* stmatrix: element (row, col) of matrix m is lane 4 row + col / 2's,
     * half col % 2, that is 64 m + 8 row + col; transposed, (col, row)'s */
    static st_state st;
    assert_string_equal(emu_run(WARP, sizeof st.out, k_stmatrix, &st), "");
    for (int m = 0; m < 4; m++)
        for (int row = 0; row < 8; row++)
            for (int col = 0; col < 8; col++) {
                const int at = 64 * m + 8 * (7 - row) + col;
                assert_int_equal(st.out[at], 64 * m + 8 * row + col);
                assert_int_equal(st.out[256 + at], 64 * m + 8 * col + row);
            }
    st.misaligned = 1;
    assert_non_null(strstr(emu_run(WARP, sizeof st.out, k_stmatrix, &st),
                           "stmatrix.x4: lane 13's row address"));
}

/* ------------------------------------------ the emulator's mbarrier and TMA
 *
 * cp.async.bulk.tensor boxes checked byte by byte against an image built
 * here from the PTX ISA's swizzle tables (16-byte chunk c of the 128-byte
 * shared-memory line L at chunk c ^ (L % 8) for the 128-byte swizzle,
 * c ^ (L % 4) for 64, c ^ (L % 2) for 32, lines counted from address 0 of
 * the shared window) and the out-of-bound rule (zeros); the mbarrier's
 * phases and parity in a double-buffered pipeline; and each misuse's
 * message. Global tensors live in cudaMalloc memory (the emulated
 * runtime's: the TMA bounds its reads by that allocation). */

/* The emulated driver's encoder, found as a kernel's host code finds it. */
static PFN_cuTensorMapEncodeTiled_v12000 tma_encoder(void) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                      cudaEnableDefault, &st),
                     cudaSuccess);
    assert_int_equal(st, cudaDriverEntryPointSuccess);
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* A bf16 tensor map with swizzle sw: dims[0] innermost, strides in bytes
 * for dims 1.., box of `rank` extents. */
static void tma_map(CUtensorMap *map, void *base, int rank, const uint64_t *dims,
                    const uint64_t *strides, const uint32_t *box, CUtensorMapSwizzle sw) {
    const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
    assert_int_equal(tma_encoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, base,
                                   dims, strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                     CUDA_SUCCESS);
}

enum { TMA_SMEM = 12288, TMA_BOX = 64 * 32 * 2, TMA_MAXLOADS = 2 };

/* Loads of one box each (box[0] x 32 16-bit elements: 64 x 32, 64 x 1 x
 * 32 x 1, 32 x 32, 16 x 32) into shared offsets dst[i], all completing on
 * one barrier at bar_off; the map's swizzle repeats every `period` lines
 * (8, 4, 2; 1: none). */
typedef struct tma_case {
    const CUtensorMap *map;
    int rank, nloads, period;
    uint32_t box[5], box_bytes;
    int32_t at[TMA_MAXLOADS][5];
    uint32_t dst[TMA_MAXLOADS], bar_off;
    unsigned char early[TMA_BOX];   /* load 0's box right after the issue */
    unsigned char smem[TMA_SMEM];   /* all shared memory after the wait */
} tma_case;

static void k_tma_load(void *arg) {
    tma_case *c = arg;
    unsigned char *smem = dt_emu_dynamic_smem();
    void *bar = smem + c->bar_off;
    if (lane() == 0) {
        dt_emu_mbar_init(bar, 1);
        dt_emu_fence_mbarrier_init();
    }
    dt_emu_syncthreads();
    if (lane() == 0) {
        dt_emu_mbar_arrive_expect_tx(bar, (uint32_t)c->nloads * c->box_bytes);
        for (int i = 0; i < c->nloads; i++)
            dt_emu_tma_load(smem + c->dst[i], c->map, c->at[i], c->rank, bar);
        memcpy(c->early, smem + c->dst[0], c->box_bytes);
    }
    dt_emu_mbar_wait(bar, 0);
    dt_emu_syncthreads();
    if (lane() == 0) memcpy(c->smem, smem, TMA_SMEM);
}

/* The element bits a box element should hold: in-bounds elements their
 * global value, the others zero. */
typedef uint16_t (*tma_value_fn)(const void *ctx, const int64_t *coord);

/* Compares the box of load i (box row r = the element's position in
 * dimensions 1.., rows of box[0] elements) with the image the PTX ISA's
 * swizzle tables give; returns the mismatches (printing the first few). */
static long tma_check_box(const tma_case *c, int i, tma_value_fn value, const void *ctx) {
    long bad = 0;
    const uint32_t addr0 = 16 + c->dst[i];   /* shared-window address (dt_emu_smem_addr) */
    for (int r = 0; r < 32; r++)
        for (int e = 0; e < (int)c->box[0]; e++) {
            /* global coordinates of box element (e, r): row r spans dims 1.. */
            int64_t coord[5] = {c->at[i][0] + e, 0, 0, 0, 0};
            int rem = r;
            for (int d = 1; d < c->rank; d++) {
                coord[d] = c->at[i][d] + rem % (int)c->box[d];
                rem /= (int)c->box[d];
            }
            const uint16_t want = value(ctx, coord);
            /* unswizzled at address A: line A / 128, chunk A % 128 / 16 */
            const uint32_t a = addr0 + 2u * ((uint32_t)r * c->box[0] + (uint32_t)e);
            const uint32_t line = a / 128u;
            const uint32_t chunk = (a % 128u / 16u) ^ (line % (uint32_t)c->period);
            const uint32_t at = 128u * line + 16u * chunk + a % 16u - 16u;
            uint16_t got;
            memcpy(&got, c->smem + at, 2);
            if (got != want && bad++ < 5)
                print_error("load %d: box element (%d, %d) at shared offset %u: %#x, want %#x\n", i,
                            e, r, at, got, want);
        }
    return bad;
}

/* A 2D tensor of 100 x 50 bf16 bit patterns, rows of 104 (208 bytes). */
static uint16_t tma_2d_value(const void *ctx, const int64_t *coord) {
    (void)ctx;
    const int64_t x = coord[0], y = coord[1];
    return x < 0 || x >= 100 || y < 0 || y >= 50 ? 0 : (uint16_t)(0x1000 + 104 * y + x);
}

/* A 4D tensor [B = 2][rows = 40][H = 3][64] (dims {64, 3, 40, 2}). */
static uint16_t tma_4d_value(const void *ctx, const int64_t *coord) {
    (void)ctx;
    const int64_t d = coord[0], h = coord[1], s = coord[2], b = coord[3];
    if (d < 0 || d >= 64 || h < 0 || h >= 3 || s < 0 || s >= 40 || b < 0 || b >= 2) return 0;
    return (uint16_t)(1 + ((b * 40 + s) * 3 + h) * 64 + d);
}

/* The double-buffered pipeline: thread 128 produces tile it (32 rows of a
 * 64 x 96 tensor) into stage it % 2 for it = 0, 1, 2, behind the stage's
 * "empty" barrier (128 arrivals); threads 0..127 consume it behind its
 * "full" barrier (1 arrival + the box's bytes), each checking 16 elements.
 * Stage 0 serves phases 0 and 1 of its barriers. */
typedef struct pipe_case {
    const CUtensorMap *map;
    long errors[128];
    int rounds[128];
} pipe_case;

enum { PIPE_STAGE0 = 1008, PIPE_STAGE1 = PIPE_STAGE0 + 4096, PIPE_BARS = PIPE_STAGE1 + 4096,
       PIPE_SMEM = PIPE_BARS + 32 };

static void k_pipeline(void *arg) {
    pipe_case *c = arg;
    const int tid = lane();
    unsigned char *smem = dt_emu_dynamic_smem();
    void *full[2] = {smem + PIPE_BARS, smem + PIPE_BARS + 8};
    void *empty[2] = {smem + PIPE_BARS + 16, smem + PIPE_BARS + 24};
    const uint32_t stage[2] = {PIPE_STAGE0, PIPE_STAGE1};
    if (tid == 128) {
        for (int s = 0; s < 2; s++) {
            dt_emu_mbar_init(full[s], 1);
            dt_emu_mbar_init(empty[s], 128);
        }
        dt_emu_fence_mbarrier_init();
    }
    dt_emu_syncthreads();
    if (tid > 128) return;
    for (int it = 0; it < 3; it++) {
        const int s = it % 2;
        const uint32_t phase = (uint32_t)(it / 2) & 1;
        if (tid == 128) {
            /* the stage is free once the consumers released its last use:
             * its first use waits on parity 1, the phase before phase 0 */
            dt_emu_mbar_wait(empty[s], phase ^ 1);
            dt_emu_mbar_arrive_expect_tx(full[s], 4096);
            const int32_t at[2] = {0, 32 * it};
            dt_emu_tma_load(smem + stage[s], c->map, at, 2, full[s]);
            continue;
        }
        dt_emu_mbar_wait(full[s], phase);
        /* row tid % 32, columns 16 (tid / 32) .. +15 of tile it */
        const int r = tid % 32;
        for (int e = 16 * (tid / 32); e < 16 * (tid / 32) + 16; e++) {
            const uint32_t line = (16 + stage[s] + 128u * (uint32_t)r) / 128u;
            const uint32_t at = 128u * line + 16u * (((uint32_t)e / 8u) ^ (line % 8u)) +
                                2u * ((uint32_t)e % 8u) - 16u;
            uint16_t got;
            memcpy(&got, smem + at, 2);
            c->errors[tid] += got != (uint16_t)(7 + 64 * (32 * it + r) + e);
        }
        c->rounds[tid]++;
        dt_emu_mbar_arrive(empty[s]);
    }
}

/* Misuse of mbarriers and tensor copies, one launch each. */
typedef enum {
    MB_PLAIN_ARRIVALS, MB_MISSING_TMA, MB_TX_SHORT, MB_UNINIT_WAIT, MB_UNINIT_ARRIVE, MB_UNINIT_TMA,
    MB_NO_FENCE, MB_SYNC_FOR_FENCE, MB_OVERFLOW, MB_MISALIGNED, MB_OUTSIDE, MB_REINIT,
    MB_OVERWRITTEN, MB_NO_SYNC_OTHER, MB_BAD_PARITY, TMA_WRITE_PENDING, TMA_OVERLAP,
    TMA_CP_ASYNC_INTO, TMA_CP_ASYNC_UNDER, TMA_DST_ALIGN, TMA_NOT_A_MAP, TMA_RANK,
    TMA_PAST_ALLOCATION, TMA_HOST_MEMORY, TMA_NEVER_WAITED, TMA_NEVER_WAITED_WRITTEN,
    TMA_COVERS_BAR, TMA_CHANGED_MAP, TMA_PREFETCH, TMA_PREFETCH_NOT_A_MAP,
} mb_misuse;

typedef struct mb_case {
    mb_misuse misuse;
    const CUtensorMap *map, *host_map, *past_map, *changed_map;
    unsigned char src[16] __attribute__((aligned(16)));
} mb_case;

enum { MB_DST = 1008, MB_BAR = 6000, MB_SMEM = 8192 };

static void k_misuse(void *arg) {
    const mb_case *c = arg;
    const int tid = lane();
    unsigned char *smem = dt_emu_dynamic_smem();
    unsigned char *dst = smem + MB_DST;
    void *bar = smem + MB_BAR;
    const int32_t at[2] = {0, 0};
    switch (c->misuse) {
    case MB_PLAIN_ARRIVALS:   /* two arrivals, no transactions: phase 0 completes */
        if (tid == 0) dt_emu_mbar_init(bar, 2);
        dt_emu_syncthreads();
        dt_emu_mbar_wait(bar, 1);   /* in phase 0, parity 1 is the phase before: done */
        dt_emu_mbar_arrive(bar);
        dt_emu_mbar_wait(bar, 0);
        dt_emu_mbar_wait(bar, 0);   /* still complete, in phase 1 */
        return;
    case MB_MISSING_TMA:      /* bytes expected, no copy: never completes */
    case MB_TX_SHORT:         /* two boxes expected, one copied */
        if (tid == 0) {
            dt_emu_mbar_init(bar, 1);
            dt_emu_fence_mbarrier_init();
            dt_emu_mbar_arrive_expect_tx(bar, c->misuse == MB_TX_SHORT ? 2 * TMA_BOX : TMA_BOX);
            if (c->misuse == MB_TX_SHORT) dt_emu_tma_load(dst, c->map, at, 2, bar);
        }
        dt_emu_syncthreads();
        dt_emu_mbar_wait(bar, 0);
        return;
    case MB_UNINIT_WAIT: dt_emu_mbar_wait(bar, 0); return;
    case MB_UNINIT_ARRIVE: dt_emu_mbar_arrive(bar); return;
    case MB_UNINIT_TMA: dt_emu_tma_load(dst, c->map, at, 2, bar); return;
    case MB_NO_FENCE:         /* the async proxy may not see the init */
    case MB_SYNC_FOR_FENCE:   /* a __syncthreads orders it */
        if (tid == 0) dt_emu_mbar_init(bar, 1);
        if (c->misuse == MB_SYNC_FOR_FENCE) dt_emu_syncthreads();
        if (tid == 0) {
            dt_emu_mbar_arrive_expect_tx(bar, TMA_BOX);
            dt_emu_tma_load(dst, c->map, at, 2, bar);
            dt_emu_mbar_wait(bar, 0);
        }
        return;
    case MB_OVERFLOW:         /* the one arrival of phase 0 made, another one */
        dt_emu_mbar_init(bar, 1);
        dt_emu_mbar_arrive_expect_tx(bar, TMA_BOX);
        dt_emu_mbar_arrive(bar);
        return;
    case MB_MISALIGNED: dt_emu_mbar_init(smem + MB_BAR + 4, 1); return;
    case MB_OUTSIDE: dt_emu_mbar_init(smem + MB_SMEM, 1); return;
    case MB_REINIT:
        dt_emu_mbar_init(bar, 1);
        dt_emu_mbar_init(bar, 1);
        return;
    case MB_OVERWRITTEN:
        dt_emu_mbar_init(bar, 1);
        smem[MB_BAR + 7] = 0;
        dt_emu_mbar_arrive(bar);
        return;
    case MB_NO_SYNC_OTHER:    /* thread 1 uses thread 0's barrier unordered */
        if (tid == 0) dt_emu_mbar_init(bar, 2);
        else dt_emu_mbar_arrive(bar);
        return;
    case MB_BAD_PARITY:
        dt_emu_mbar_init(bar, 1);
        dt_emu_mbar_wait(bar, 2);
        return;
    default: break;
    }
    /* tensor copies: one thread */
    dt_emu_mbar_init(bar, 1);
    dt_emu_fence_mbarrier_init();
    dt_emu_mbar_arrive_expect_tx(bar, TMA_BOX);
    switch (c->misuse) {
    case TMA_CP_ASYNC_UNDER:  /* a cp.async in flight where the box goes */
        dt_emu_cp_async16(dst + 512, c->src, 16);
        dt_emu_tma_load(dst, c->map, at, 2, bar);
        return;
    case TMA_DST_ALIGN: dt_emu_tma_load(dst + 64, c->map, at, 2, bar); return;
    case TMA_NOT_A_MAP: {
        static CUtensorMap zero;
        dt_emu_tma_load(dst, &zero, at, 2, bar);
        return;
    }
    case TMA_RANK: {
        const int32_t at3[3] = {0, 0, 0};
        dt_emu_tma_load(dst, c->map, at3, 3, bar);
        return;
    }
    case TMA_PAST_ALLOCATION: {   /* rows 40..71 of a tensor declared 80 rows, allocated 50 */
        const int32_t rows40[2] = {0, 40};
        dt_emu_tma_load(dst, c->past_map, rows40, 2, bar);
        return;
    }
    case TMA_HOST_MEMORY: dt_emu_tma_load(dst, c->host_map, at, 2, bar); return;
    case TMA_CHANGED_MAP: dt_emu_tma_load(dst, c->changed_map, at, 2, bar); return;
    case TMA_PREFETCH: dt_emu_tma_prefetch(c->map); return;   /* a hint: nothing else */
    case TMA_PREFETCH_NOT_A_MAP: dt_emu_tma_prefetch(c->changed_map); return;
    case TMA_COVERS_BAR: dt_emu_tma_load(smem + 3056, c->map, at, 2, bar); return;   /* [3056, 7152) */
    default: break;
    }
    dt_emu_tma_load(dst, c->map, at, 2, bar);
    switch (c->misuse) {
    case TMA_WRITE_PENDING: dst[100] = 0; break;
    case TMA_OVERLAP: dt_emu_tma_load(dst + 2048, c->map, at, 2, bar); break;
    case TMA_CP_ASYNC_INTO: dt_emu_cp_async16(dst + 4080, c->src, 16); break;
    case TMA_NEVER_WAITED: return;
    case TMA_NEVER_WAITED_WRITTEN: dst[5] = 1; return;
    default: break;
    }
    dt_emu_mbar_wait(bar, 0);
}

/* ldmatrix over a pending box: every lane of the warp. */
static void k_tma_ldmatrix(void *arg) {
    const mb_case *c = arg;
    unsigned char *smem = dt_emu_dynamic_smem();
    void *bar = smem + MB_BAR;
    if (lane() == 0) {
        const int32_t at[2] = {0, 0};
        dt_emu_mbar_init(bar, 1);
        dt_emu_fence_mbarrier_init();
        dt_emu_mbar_arrive_expect_tx(bar, TMA_BOX);
        dt_emu_tma_load(smem + MB_DST, c->map, at, 2, bar);
    }
    dt_emu_syncthreads();
    uint32_t r[4];
    dt_emu_ldmatrix_x4(r, smem + MB_DST + 16 * lane(), 0);
}

/* test_tma's 2D tensor in emulated device memory: 100 x 50, rows padded
 * to 104 elements (0xdead, never to be read). */
static uint16_t *tma_2d_tensor(void) {
    uint16_t *g2 = NULL;
    assert_int_equal(cudaMalloc((void **)&g2, 50 * 208), cudaSuccess);
    for (int y = 0; y < 50; y++)
        for (int x = 0; x < 104; x++) {
            const int64_t at[5] = {x, y, 0, 0, 0};
            g2[104 * y + x] = x < 100 ? tma_2d_value(NULL, at) : 0xdead;
        }
    return g2;
}

static void test_tma(void **state) {
    (void)state;
    const uint64_t tma_before = dt_emu_get_counts().tma;
    uint16_t *g2 = tma_2d_tensor();
    static CUtensorMap map2;
    const uint64_t dims2[2] = {100, 50}, strides2[1] = {208};
    const uint32_t box2[2] = {64, 32};
    tma_map(&map2, g2, 2, dims2, strides2, box2, CU_TENSOR_MAP_SWIZZLE_128B);

    /* two boxes on one barrier: at (60, -5) (columns 100.. and rows -5..-1
     * out of bounds) into a 1024-aligned address, at (-16, 30) (columns
     * -16..-1, rows 50..61 out) into one that is 128- but not 1024-aligned */
    static tma_case c;
    memset(&c, 0, sizeof c);
    c.map = &map2;
    c.rank = 2;
    c.nloads = 2;
    c.period = 8;
    memcpy(c.box, box2, sizeof box2);
    c.box_bytes = TMA_BOX;
    c.at[0][0] = 60, c.at[0][1] = -5;
    c.at[1][0] = -16, c.at[1][1] = 30;
    c.dst[0] = 1008;                 /* address 1024 */
    c.dst[1] = 1008 + 5 * 1024 + 384;   /* address 6528 = 51 x 128 */
    c.bar_off = 11008;
    assert_string_equal(emu_run((dt_emu_dim3){64, 1, 1}, TMA_SMEM, k_tma_load, &c), "");
    for (int i = 0; i < TMA_BOX; i++) assert_int_equal(c.early[i], 0xff);   /* before the wait */
    assert_int_equal(tma_check_box(&c, 0, tma_2d_value, NULL), 0);
    assert_int_equal(tma_check_box(&c, 1, tma_2d_value, NULL), 0);
    /* nothing written outside the boxes (the barrier's stamp aside) */
    for (uint32_t b = 0; b < TMA_SMEM; b++) {
        const int in_box = (b >= c.dst[0] && b < c.dst[0] + TMA_BOX) ||
                           (b >= c.dst[1] && b < c.dst[1] + TMA_BOX) ||
                           (b >= c.bar_off && b < c.bar_off + 8);
        if (!in_box && c.smem[b] != 0xff) print_error("shared byte %u written: %#x\n", b, c.smem[b]);
        assert_true(in_box || c.smem[b] == 0xff);
    }

    /* the 4D tensor {64, H = 3, rows = 40, B = 2}, box {64, 1, 32, 1}: rows
     * 20..51 of head 2, batch 1 (40.. out of bounds), rows -8..23 of head 1,
     * batch 0 */
    uint16_t *g4 = NULL;
    assert_int_equal(cudaMalloc((void **)&g4, 2 * 40 * 3 * 64 * 2), cudaSuccess);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t s = 0; s < 40; s++)
            for (int64_t h = 0; h < 3; h++)
                for (int64_t d = 0; d < 64; d++) {
                    const int64_t at[5] = {d, h, s, b, 0};
                    g4[((b * 40 + s) * 3 + h) * 64 + d] = tma_4d_value(NULL, at);
                }
    static CUtensorMap map4;
    const uint64_t dims4[4] = {64, 3, 40, 2}, strides4[3] = {128, 384, 384 * 40};
    const uint32_t box4[4] = {64, 1, 32, 1};
    tma_map(&map4, g4, 4, dims4, strides4, box4, CU_TENSOR_MAP_SWIZZLE_128B);
    memset(&c, 0, sizeof c);
    c.map = &map4;
    c.rank = 4;
    c.nloads = 2;
    c.period = 8;
    memcpy(c.box, box4, sizeof box4);
    c.box_bytes = TMA_BOX;
    const int32_t at4[2][4] = {{0, 2, 20, 1}, {0, 1, -8, 0}};
    memcpy(c.at[0], at4[0], sizeof at4[0]);
    memcpy(c.at[1], at4[1], sizeof at4[1]);
    c.dst[0] = 1008 + 4096 + 128;   /* address 5248 = 41 x 128 */
    c.dst[1] = 1008;
    c.bar_off = 11008;
    assert_string_equal(emu_run((dt_emu_dim3){32, 1, 1}, TMA_SMEM, k_tma_load, &c), "");
    assert_int_equal(tma_check_box(&c, 0, tma_4d_value, NULL), 0);
    assert_int_equal(tma_check_box(&c, 1, tma_4d_value, NULL), 0);

    /* the other swizzles, on the 2D tensor: 64 bytes (box 32 x 32; the
     * destinations at lines 11 and 50 of the window, not 512-aligned), 32
     * (box 16 x 32), none (64 x 32) */
    static const struct {
        CUtensorMapSwizzle sw;
        uint32_t box0;
        int period;
    } modes[] = {{CU_TENSOR_MAP_SWIZZLE_64B, 32, 4}, {CU_TENSOR_MAP_SWIZZLE_32B, 16, 2},
                 {CU_TENSOR_MAP_SWIZZLE_NONE, 64, 1}};
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        static CUtensorMap mapk;
        const uint32_t boxk[2] = {modes[k].box0, 32};
        tma_map(&mapk, g2, 2, dims2, strides2, boxk, modes[k].sw);
        memset(&c, 0, sizeof c);
        c.map = &mapk;
        c.rank = 2;
        c.nloads = 2;
        c.period = modes[k].period;
        memcpy(c.box, boxk, sizeof boxk);
        c.box_bytes = 2 * 32 * modes[k].box0;
        c.at[0][0] = 90, c.at[0][1] = 40;    /* columns 100.., rows 50.. out */
        c.at[1][0] = -7, c.at[1][1] = -3;    /* columns -7..-1, rows -3..-1 out */
        c.dst[0] = 11 * 128 - 16;
        c.dst[1] = 50 * 128 - 16;
        c.bar_off = 11008;
        assert_string_equal(emu_run((dt_emu_dim3){32, 1, 1}, TMA_SMEM, k_tma_load, &c), "");
        assert_int_equal(tma_check_box(&c, 0, tma_2d_value, NULL), 0);
        assert_int_equal(tma_check_box(&c, 1, tma_2d_value, NULL), 0);
    }

    /* the pipeline: a 64 x 96 tensor, three tiles through two stages */
    uint16_t *gp = NULL;
    assert_int_equal(cudaMalloc((void **)&gp, 96 * 128), cudaSuccess);
    for (int i = 0; i < 96 * 64; i++) gp[i] = (uint16_t)(7 + i);
    static CUtensorMap mapp;
    const uint64_t dimsp[2] = {64, 96}, stridesp[1] = {128};
    tma_map(&mapp, gp, 2, dimsp, stridesp, box2, CU_TENSOR_MAP_SWIZZLE_128B);
    static pipe_case p;
    memset(&p, 0, sizeof p);
    p.map = &mapp;
    assert_string_equal(emu_run((dt_emu_dim3){160, 1, 1}, PIPE_SMEM, k_pipeline, &p), "");
    for (int t = 0; t < 128; t++) {
        if (p.errors[t]) print_error("pipeline: consumer %d read %ld wrong elements\n", t, p.errors[t]);
        assert_int_equal(p.errors[t], 0);
        assert_int_equal(p.rounds[t], 3);
    }
    assert_true(dt_emu_get_counts().tma - tma_before == 2 + 2 + 3 * 2 + 3);

    /* misuse, each failing the launch with its message */
    void *host = aligned_alloc(256, 41 * 256);   /* 50 rows of 208 bytes */
    static CUtensorMap host_map, past_map;
    tma_map(&host_map, host, 2, dims2, strides2, box2, CU_TENSOR_MAP_SWIZZLE_128B);
    const uint64_t dims_past[2] = {100, 80};
    tma_map(&past_map, g2, 2, dims_past, strides2, box2, CU_TENSOR_MAP_SWIZZLE_128B);
    static const struct {
        mb_misuse misuse;
        unsigned threads;
        const char *msg;
    } bad[] = {
        {MB_PLAIN_ARRIVALS, 2, ""},
        {MB_MISSING_TMA, 2,
         "deadlock: thread 0 is waiting on the mbarrier at shared offset 6000, parity 0 (its "
         "phase 0 has 0 of 1 arrivals missing, tx-count 4096)"},
        {MB_TX_SHORT, 1, "waiting on the mbarrier at shared offset 6000, parity 0 (its phase 0 "
                         "has 0 of 1 arrivals missing, tx-count 4096)"},
        {MB_UNINIT_WAIT, 1,
         "mbarrier.try_wait.parity on shared offset 6000: no mbarrier was initialised there"},
        {MB_UNINIT_ARRIVE, 1, "mbarrier.arrive on shared offset 6000: no mbarrier was initialised"},
        {MB_UNINIT_TMA, 1, "cp.async.bulk.tensor on shared offset 6000: no mbarrier"},
        {MB_NO_FENCE, 1, "whose mbarrier.init (by thread 0) the async proxy may not see yet"},
        {MB_SYNC_FOR_FENCE, 2, ""},
        {MB_OVERFLOW, 1, "phase overflow"},
        {MB_MISALIGNED, 1, "is not 8 aligned bytes inside the 8192 bytes of dynamic shared memory"},
        {MB_OUTSIDE, 1, "is not 8 aligned bytes inside the 8192 bytes of dynamic shared memory"},
        {MB_REINIT, 1, "mbarrier.init of the mbarrier at shared offset 6000, initialised already"},
        {MB_OVERWRITTEN, 1, "the 8 bytes of the mbarrier at shared offset 6000 were overwritten"},
        {MB_NO_SYNC_OTHER, 2, "before a __syncthreads ordered it after its mbarrier.init by thread 0"},
        {MB_BAD_PARITY, 1, "mbarrier.try_wait.parity with phaseParity 2"},
        {TMA_WRITE_PENDING, 1, "shared memory at offset 1108 was written while a "
                               "cp.async.bulk.tensor into it (issued by thread 0) was in flight"},
        {TMA_OVERLAP, 1, "cp.async.bulk.tensor into shared offset 3056: inside the destination of "
                         "a cp.async.bulk.tensor (issued by thread 0"},
        {TMA_CP_ASYNC_INTO, 1, "cp.async into shared offset 5088: inside the destination"},
        {TMA_CP_ASYNC_UNDER, 1, "where a cp.async of thread 0 is in flight"},
        {TMA_DST_ALIGN, 1, "is not 128-byte aligned"},
        {TMA_NOT_A_MAP, 1, "is not a tensor map that cuTensorMapEncodeTiled wrote"},
        {TMA_RANK, 1, "cp.async.bulk.tensor.3d with a tensor map of rank 2"},
        {TMA_PAST_ALLOCATION, 1, "the box at coordinates (0, 40) reads global bytes"},
        {TMA_HOST_MEMORY, 1, "is not in memory CUDA knows"},
        {TMA_NEVER_WAITED, 1, ""},
        {TMA_NEVER_WAITED_WRITTEN, 1, "never waited for"},
        {TMA_COVERS_BAR, 1, "its destination covers the mbarrier at shared offset 6000"},
        {TMA_CHANGED_MAP, 1, "is not a tensor map that cuTensorMapEncodeTiled wrote (or it was "
                             "changed since)"},
        {TMA_PREFETCH, 1, ""},
        {TMA_PREFETCH_NOT_A_MAP, 1, "prefetch.tensormap: 0x"},
    };
    static mb_case m;
    memset(&m, 0, sizeof m);
    m.map = &map2;
    m.host_map = &host_map;
    m.past_map = &past_map;
    static CUtensorMap changed_map;   /* map2 with one of its words changed by hand */
    changed_map = map2;
    changed_map.opaque[2] *= 2;
    m.changed_map = &changed_map;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m.misuse = bad[i].misuse;
        const char *err = emu_run((dt_emu_dim3){bad[i].threads, 1, 1}, MB_SMEM, k_misuse, &m);
        if (bad[i].msg[0] ? !strstr(err, bad[i].msg) : err[0] != 0)
            print_error("case %zu: got \"%s\"\n", i, err);
        if (bad[i].msg[0]) assert_non_null(strstr(err, bad[i].msg));
        else assert_string_equal(err, "");
    }
    const char *err = emu_run(WARP, MB_SMEM, k_tma_ldmatrix, &m);
    if (!strstr(err, "ldmatrix.x4 shared offset 1008: inside the destination"))
        print_error("ldmatrix: got \"%s\"\n", err);
    assert_non_null(strstr(err, "ldmatrix.x4 shared offset 1008: inside the destination"));
    free(host);
    assert_int_equal(cudaFree(g2), cudaSuccess);
    assert_int_equal(cudaFree(g4), cudaSuccess);
    assert_int_equal(cudaFree(gp), cudaSuccess);
}

/* ---------------------------------------------- the emulator's wgmma
 *
 * wgmma.mma_async.m64nNk16 on operands laid out here from the PTX ISA's
 * pictures (128-byte swizzle atoms: 8 rows of 128 bytes whose 16-byte
 * chunks are permuted by the row, chunk c of row r stored at chunk c ^ r),
 * with the register fragments of its figures, against a plain product of
 * the logical matrices. The values are small integers, exact in bf16 and
 * fp16, so every sum is exact and the comparison is equality. */

enum {
    WG_IMG = 16384,            /* shared-memory image: A at 0, B at WG_B_OFF */
    WG_B_OFF = 8192,
    WG_NB_LBO = 4096,          /* N-major B: the next 64 columns */
    WG_ATOM = 1024,            /* an atom of 8 rows of 128 bytes; SBO */
    WG_SMEM = WG_IMG + 1024,   /* room to align the image by shared address */
};

typedef enum {
    WGM_OK, WGM_NO_FENCE, WGM_CP_NO_PROXY_FENCE, WGM_CP_PROXY_FENCE, WGM_STORE_NO_PROXY_FENCE,
    WGM_DIFFERENT_N,
    WGM_EXIT_PENDING, WGM_DESC_OUTSIDE, WGM_WRITE_D, WGM_SMEM_RACE, WGM_NO_SWIZZLE, WGM_DIVERGE,
    WGM_TMA, WGM_TMA_NO_WAIT,   /* the image by a tensor copy; read before its wait */
    WGM_TMA_OVER_PENDING,       /* a second copy into the image before the wgmma's wait */
} wg_misuse;

typedef struct wg_case {
    int n, ksteps, a_regs, trans_b, scale_d0;   /* scale_d of the first k step */
    int pipelined;   /* a commit per k step; wait_group 1, then 0 */
    dt_dtype ab;
    wg_misuse misuse;
    float d0;                                   /* the accumulators' initial value */
    float A[64][32], B[32][128];                /* logical operands, K = 16 ksteps */
    unsigned char img[WG_IMG] __attribute__((aligned(16)));
    float early[256][64], d[256][64];           /* per thread: before and after the wait */
    float mid[256][64];                         /* pipelined: after wait_group 1 */
    const CUtensorMap *tmap;                    /* WGM_TMA*: img as 128 x 128 bytes */
} wg_case;

/* Byte offset of element (r, c) of an atom (r < 8, c < 64 16-bit columns). */
static size_t sw128(int r, int c) { return (size_t)(128 * r + 16 * ((c / 8) ^ r) + 2 * (c % 8)); }

/* Where the image keeps A[i][k] (K-major: rows i, 8 to an atom) and
 * B[k][j] (K-major: rows j; N-major: rows k of 64 columns j, 8 k to an
 * atom, the next 8 k an atom further, the next 64 j WG_NB_LBO further). */
static size_t img_a(int i, int k) { return (size_t)(i / 8) * WG_ATOM + sw128(i % 8, k); }
static size_t img_b(int trans_b, int k, int j) {
    if (!trans_b) return WG_B_OFF + (size_t)(j / 8) * WG_ATOM + sw128(j % 8, k);
    return WG_B_OFF + (size_t)(j / 64) * WG_NB_LBO + (size_t)(k / 8) * WG_ATOM +
           sw128(k % 8, j % 64);
}

static uint16_t wg_bits(float v, dt_dtype ab) {
    return ab == DT_BF16 ? dt_f32_to_bf16(v) : dt_f32_to_f16(v);
}

static void wg_prepare(wg_case *c, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < 64; i++)
        for (int k = 0; k < 32; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            c->A[i][k] = (float)((int)(s >> 33) % 7 - 3);
        }
    for (int k = 0; k < 32; k++)
        for (int j = 0; j < 128; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            c->B[k][j] = (float)((int)(s >> 33) % 7 - 3);
        }
    /* NaN everywhere no element belongs: a read from a wrong place shows */
    for (size_t b = 0; b < WG_IMG; b += 2) {
        const uint16_t nan = 0xffff;
        memcpy(c->img + b, &nan, 2);
    }
    for (int i = 0; i < 64; i++)
        for (int k = 0; k < 32; k++) {
            const uint16_t v = wg_bits(c->A[i][k], c->ab);
            memcpy(c->img + img_a(i, k), &v, 2);
        }
    for (int k = 0; k < 32; k++)
        for (int j = 0; j < c->n; j++) {
            const uint16_t v = wg_bits(c->B[k][j], c->ab);
            memcpy(c->img + img_b(c->trans_b, k, j), &v, 2);
        }
}

/* A descriptor: 128-byte swizzle, base offset 0. */
static uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lbo & 0x3ffff) >> 4) << 16 |
           (uint64_t)((sbo & 0x3ffff) >> 4) << 32 | 1ull << 62;
}

/* Each warpgroup computes D (64 x n) = A (64 x 16 ksteps) B, k step s
 * from columns 16 s of A (32 bytes further in its K-major rows) and rows
 * 16 s of B (32 bytes further when K-major, two atoms when N-major). */
static void k_wgmma(void *arg) {
    wg_case *c = arg;
    const int tid = lane(), w = tid % 128 / 32, g = tid % 32 / 4, t = tid % 4;
    unsigned char *smem = dt_emu_dynamic_smem();
    const uint32_t pad = (1024 - dt_emu_smem_addr(smem) % 1024) % 1024;
    unsigned char *img = smem + pad;   /* at a 1024-aligned shared address */
    const uint32_t base = dt_emu_smem_addr(img);
    if (c->misuse == WGM_CP_NO_PROXY_FENCE || c->misuse == WGM_CP_PROXY_FENCE) {
        for (int ch = tid; ch < WG_IMG / 16; ch += (int)dt_emu_block_dim()->x)
            dt_emu_cp_async16(img + 16 * ch, c->img + 16 * ch, 16);
        dt_emu_cp_commit();
        dt_emu_cp_wait(0);
        if (c->misuse == WGM_CP_PROXY_FENCE) dt_emu_fence_proxy_async();
    } else if (c->misuse == WGM_TMA || c->misuse == WGM_TMA_NO_WAIT ||
               c->misuse == WGM_TMA_OVER_PENDING) {
        /* thread 0 loads the image by a tensor copy (async proxy: no
         * fence.proxy.async), everyone waits for it on the barrier past it */
        void *bar = smem + WG_SMEM - 8;
        if (tid == 0) {
            const int32_t at[2] = {0, 0};
            dt_emu_mbar_init(bar, 1);
            dt_emu_fence_mbarrier_init();
            dt_emu_mbar_arrive_expect_tx(bar, WG_IMG);
            dt_emu_tma_load(img, c->tmap, at, 2, bar);
        }
        dt_emu_syncthreads();
        if (c->misuse != WGM_TMA_NO_WAIT) dt_emu_mbar_wait(bar, 0);
    } else if (tid == 0) {   /* ordinary stores: visible to wgmma after a proxy fence */
        memcpy(img, c->img, WG_IMG);
        if (c->misuse != WGM_STORE_NO_PROXY_FENCE) dt_emu_fence_proxy_async();
    }
    dt_emu_syncthreads();
    /* A's registers (the figure for m64nNk16): warp w rows 16w.., register
     * r rows g + 8 (r & 1), columns 2t + 8 (r >> 1) (+1 in the high half) */
    uint32_t a[2][4];
    for (int s = 0; s < c->ksteps; s++)
        for (int r = 0; r < 4; r++) {
            const int row = 16 * w + g + 8 * (r & 1), col = 16 * s + 8 * (r >> 1) + 2 * t;
            a[s][r] = (uint32_t)wg_bits(c->A[row][col], c->ab) |
                      (uint32_t)wg_bits(c->A[row][col + 1], c->ab) << 16;
        }
    float d[64];
    for (int e = 0; e < 64; e++) d[e] = c->d0;
    if (c->misuse != WGM_NO_FENCE) dt_emu_wgmma_fence();
    for (int s = 0; s < c->ksteps; s++) {
        uint64_t da = wg_desc(base + 32u * s, 16, WG_ATOM);
        uint64_t db = c->trans_b ? wg_desc(base + WG_B_OFF + 2u * WG_ATOM * s, WG_NB_LBO, WG_ATOM)
                                 : wg_desc(base + WG_B_OFF + 32u * s, 16, WG_ATOM);
        if (c->misuse == WGM_DESC_OUTSIDE) db = wg_desc(base + WG_IMG, 16, WG_ATOM);
        if (c->misuse == WGM_NO_SWIZZLE) db &= ~(3ull << 62);
        const int n = c->misuse == WGM_DIFFERENT_N && tid == 70 ? c->n - 8 : c->n;
        if (c->misuse == WGM_DIVERGE && tid == 20) (void)dt_emu_shfl_xor(0xffffffffu, 1.0f, 1);
        dt_emu_wgmma(d, n, c->a_regs ? a[s] : NULL, da, db, s > 0 || c->scale_d0, c->trans_b,
                     c->ab);
        if (c->pipelined) dt_emu_wgmma_commit();
    }
    if (c->misuse == WGM_EXIT_PENDING) return;
    if (!c->pipelined) dt_emu_wgmma_commit();
    memcpy(c->early[tid], d, sizeof d);
    if (c->pipelined) {
        dt_emu_wgmma_wait(1);
        memcpy(c->mid[tid], d, sizeof d);
    }
    if (c->misuse == WGM_WRITE_D) d[5] = 1.0f;
    if (c->misuse == WGM_SMEM_RACE) {
        /* B[0][0] changes while the instruction may still read it */
        if (tid == 0) img[img_b(c->trans_b, 0, 0)] ^= 1;
        dt_emu_syncthreads();
    }
    if (c->misuse == WGM_TMA_OVER_PENDING && tid == 0) {
        /* the image again, by a tensor copy issued before the wait (a
         * pipeline refilling a stage that a product still reads) */
        void *bar = smem + WG_SMEM - 16;
        const int32_t at[2] = {0, 0};
        dt_emu_mbar_init(bar, 1);
        dt_emu_fence_mbarrier_init();
        dt_emu_mbar_arrive_expect_tx(bar, WG_IMG);
        dt_emu_tma_load(img, c->tmap, at, 2, bar);
    }
    dt_emu_wgmma_wait(0);
    memcpy(c->d[tid], d, sizeof d);
}

/* Runs c on `threads` threads; "" or the error. On success every thread's
 * accumulators must hold a NaN (the emulator's garbage) before the wait and
 * the product after it. */
static const char *wg_run(wg_case *c, unsigned threads) {
    const char *err = emu_run((dt_emu_dim3){threads, 1, 1}, WG_SMEM, k_wgmma, c);
    if (err[0]) return err;
    long bad = 0;
    for (unsigned tid = 0; tid < threads; tid++)
        for (int e = 0; e < c->n / 2; e++) {
            const int w = tid % 128 / 32, g = tid % 32 / 4, t = tid % 4;
            const int row = 16 * w + g + 8 * ((e >> 1) & 1), col = 8 * (e / 4) + 2 * t + (e & 1);
            double want = c->scale_d0 ? c->d0 : 0.0;
            for (int k = 0; k < 16 * c->ksteps; k++) want += (double)c->A[row][k] * c->B[k][col];
            /* pipelined: the first k step alone after wait_group 1 */
            double mid = c->scale_d0 ? c->d0 : 0.0;
            for (int k = 0; k < 16 && c->pipelined; k++) mid += (double)c->A[row][k] * c->B[k][col];
            if (c->pipelined && c->mid[tid][e] != (float)mid) {
                if (bad++ < 5)
                    print_error("pipelined: thread %u d[%d] after wait_group 1: %g, want %g\n", tid,
                                e, c->mid[tid][e], mid);
            }
            if (c->d[tid][e] != (float)want || !isnan(c->early[tid][e])) {
                if (bad++ < 5)
                    print_error("n=%d ksteps=%d a_regs=%d trans_b=%d: thread %u d[%d] (row %d, "
                                "column %d): %g, want %g; before the wait %g, want NaN\n", c->n,
                                c->ksteps, c->a_regs, c->trans_b, tid, e, row, col, c->d[tid][e],
                                want, c->early[tid][e]);
            }
        }
    return bad ? "wrong results" : "";
}

static wg_case *wg_make(int n, int ksteps, int a_regs, int trans_b, dt_dtype ab, wg_misuse misuse) {
    wg_case *c = aligned_alloc(64, (sizeof(wg_case) + 63) / 64 * 64);
    memset(c, 0, sizeof *c);
    c->n = n;
    c->ksteps = ksteps;
    c->a_regs = a_regs;
    c->trans_b = trans_b;
    c->ab = ab;
    c->misuse = misuse;
    c->scale_d0 = ksteps == 1;   /* chained: the first step must ignore d0 */
    c->d0 = ksteps == 1 ? 5.0f : 1000.0f;
    wg_prepare(c, 77 + (uint64_t)(4 * n + 2 * a_regs + trans_b));
    return c;
}

static void test_wgmma(void **state) {
    (void)state;
    const uint64_t wgmma_before = dt_emu_get_counts().wgmma;
    /* A from registers or K-major shared memory; B K-major (N = 64) or
     * N-major (N = 128: the second 64 columns LBO away); one k step, or two
     * chained on the same accumulators (one commit, one wait). */
    for (int ksteps = 1; ksteps <= 2; ksteps++)
        for (int a_regs = 0; a_regs < 2; a_regs++)
            for (int trans_b = 0; trans_b < 2; trans_b++) {
                wg_case *c = wg_make(trans_b ? 128 : 64, ksteps, a_regs, trans_b, DT_BF16, WGM_OK);
                assert_string_equal(wg_run(c, 128), "");
                free(c);
            }
    /* fp16; two warpgroups (rows 128..255 of the block: warpgroup 1) */
    wg_case *c = wg_make(64, 2, 1, 1, DT_F16, WGM_OK);
    assert_string_equal(wg_run(c, 256), "");
    free(c);
    c = wg_make(128, 1, 0, 1, DT_BF16, WGM_OK);
    assert_string_equal(wg_run(c, 256), "");
    free(c);
    /* a group per k step, completed one at a time (wait_group 1, 0) */
    c = wg_make(128, 2, 1, 1, DT_BF16, WGM_OK);
    c->pipelined = 1;
    assert_string_equal(wg_run(c, 128), "");
    free(c);
    assert_true(dt_emu_get_counts().wgmma - wgmma_before == 4 * 1 + 4 * 2 + 2 * 2 + 2 * 1 + 2);

    /* cp.async data reaches wgmma only through fence.proxy.async */
    c = wg_make(64, 1, 0, 0, DT_BF16, WGM_CP_PROXY_FENCE);
    assert_string_equal(wg_run(c, 128), "");
    free(c);

    /* tensor-copy data needs no fence.proxy.async, only its barrier wait;
     * a wgmma before the wait reads a pending destination; a copy issued
     * while a wgmma that reads its destination is pending fails */
    static CUtensorMap img_map;
    const cuuint64_t img_dims[2] = {128, 128}, img_strides[1] = {128};
    const cuuint32_t img_box[2] = {128, 128}, ones[2] = {1, 1};
    for (int variant = 0; variant < 3; variant++) {
        c = wg_make(64, 2, 0, 1, DT_BF16,
                    (wg_misuse[]){WGM_TMA, WGM_TMA_NO_WAIT, WGM_TMA_OVER_PENDING}[variant]);
        void *dimg = NULL;
        assert_int_equal(cudaMalloc(&dimg, WG_IMG), cudaSuccess);
        memcpy(dimg, c->img, WG_IMG);
        assert_int_equal(tma_encoder()(&img_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dimg, img_dims,
                                       img_strides, img_box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                       CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                         CUDA_SUCCESS);
        c->tmap = &img_map;
        const char *err = wg_run(c, 128);
        const char *want = variant == 1 ? "wgmma.mma_async reading A from shared offset 1008: "
                                          "inside the destination of a cp.async.bulk.tensor"
                           : variant == 2 ? "that a wgmma.mma_async reads as A, which "
                                            "thread 0 has not completed with wgmma.wait_group"
                                          : "";
        if (variant ? !strstr(err, want) : err[0] != 0) print_error("tma: got \"%s\"\n", err);
        if (variant) assert_non_null(strstr(err, want));
        else assert_string_equal(err, "");
        assert_int_equal(cudaFree(dimg), cudaSuccess);
        free(c);
    }

    /* misuse, each failing the launch with its message */
    static const struct {
        wg_misuse misuse;
        unsigned threads;
        const char *msg;
    } bad[] = {
        {WGM_NO_FENCE, 128, "wgmma.mma_async without wgmma.fence"},
        {WGM_CP_NO_PROXY_FENCE, 128,
         "shared memory written by cp.async reaches wgmma without fence.proxy.async"},
        {WGM_STORE_NO_PROXY_FENCE, 128,
         "wgmma.mma_async reads A[0][0] at shared offset 1008 (shared address 0x400), written by "
         "ordinary stores that no fence.proxy.async and barrier after it made visible"},
        {WGM_DIFFERENT_N, 128,
         "threads of warpgroup 0 disagree on wgmma.mma_async's n: thread 0 has 64, thread 70 "
         "has 56"},
        {WGM_EXIT_PENDING, 128, "exited with 1 wgmma.mma_async pending (1 of them uncommitted)"},
        {WGM_DESC_OUTSIDE, 128, "is outside the dynamic shared memory"},
        {WGM_WRITE_D, 128,
         "accumulator register d[5] of a wgmma.mma_async.m64n64k16 was written before the "
         "wgmma.wait_group"},
        {WGM_SMEM_RACE, 128,
         "read by a wgmma.mma_async as B[0][0], was written before the wgmma.wait_group"},
        {WGM_NO_SWIZZLE, 128, "swizzle mode 0 with base offset 0 is not emulated"},
        {WGM_OK, 64, "of a block of 64 threads: its warpgroup (threads 0 ..) is not whole"},
        {WGM_OK, 160, "of a block of 160 threads: its warpgroup (threads 128 ..) is not whole"},
        {WGM_DIVERGE, 128,
         "lanes of warp 0 at different warp instructions: lane 0 at wgmma.mma_async, lane 20 "
         "at shfl.sync.bfly"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = wg_make(64, 1, 0, 0, DT_BF16, bad[i].misuse);
        const char *err = emu_run((dt_emu_dim3){bad[i].threads, 1, 1}, WG_SMEM, k_wgmma, c);
        if (!strstr(err, bad[i].msg)) print_error("case %zu: got \"%s\"\n", i, err);
        assert_non_null(strstr(err, bad[i].msg));
        free(c);
    }
}

/* ----------------------------------------------------------------- cases */

typedef struct shape_row {
    int P;
    dt_order order;
    dt_attn_mask mask;
    attn_shape s;
    int huge;
} shape_row;

/* A case of documents and a window (emu_case's window, docs). */
typedef struct rule_row {
    int P;
    dt_order order;
    dt_attn_mask mask;
    attn_shape s;
    int64_t window;
    int docs;
    dt_dtype dtype;
} rule_row;

int main(void) {
    /* Local lengths that are not multiples of the 64-row tiles, GQA, batch
     * 2, every order, causal and full, both head dims. */
    static const shape_row rows[] = {
        {1, DT_ORDER_CONTIGUOUS, DT_ATTN_CAUSAL, {1, 200, 2, 1, 64}, 0},
        {3, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, {2, 210, 2, 2, 128}, 0},
        {2, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {1, 200, 4, 2, 64}, 0},
        {2, DT_ORDER_CONTIGUOUS, DT_ATTN_FULL, {1, 200, 2, 1, 128}, 0},
        {2, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, {1, 268, 2, 1, 64}, 1},
        /* zigzag at D = 128 over four ranks: each rank's jump (mask.h)
         * inside a query and a key tile */
        {4, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {1, 320, 2, 1, 128}, 0},
    };
    /* The same for the wgmma kernel's 128-row query and key tiles: at least
     * three key tiles per block somewhere (the cp.async stages are reused),
     * lengths that are not multiples of 128 (a warpgroup with no rows in a
     * last short query tile: 300 = 2 x 128 + 44). */
    static const shape_row wg_rows[] = {
        {1, DT_ORDER_CONTIGUOUS, DT_ATTN_CAUSAL, {1, 400, 2, 1, 64}, 0},
        {2, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, {2, 600, 2, 2, 128}, 0},
        {2, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {1, 1040, 4, 2, 64}, 0},
        {3, DT_ORDER_CONTIGUOUS, DT_ATTN_FULL, {1, 870, 2, 1, 128}, 0},
        {2, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, {1, 600, 2, 1, 64}, 1},
        {4, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {1, 1040, 2, 1, 128}, 0},
    };
    _Static_assert(sizeof wg_rows == sizeof rows, "one wgmma row per mma row");
    /* fp16 takes the rows that instantiate its kernels for both head dims
     * (and the 1e4 logits): the rest differs from bf16 only in the element
     * conversions, and the emulator is slow (~1 s per 10^5 mma). */
    static const int fp16_rows[] = {0, 1, 1, 0, 1, 0};
    enum { NROWS = sizeof rows / sizeof rows[0] };
    /* dir 0: forward (mma.sync), 1: backward (mma.sync), 2: forward
     * (wgmma), 3: backward (wgmma); every case in each of the kernels'
     * forms (attention/cuda/kernels.h: VERIFIED, what auto runs, and
     * LATEST) */
    enum { PER_FORM = 4 * 2 * NROWS + 3 };   /* + the variants beyond the first (below) */
    static emu_case cases[DT_ATTN_FORM_COUNT * PER_FORM];
    /* Documents and windows (attention/mask.h's rule), the LATEST forms
     * alone (the VERIFIED ones refuse them: rule/verified-refuses): every
     * order over P = 1 .. 4, causal and full, documents of random lengths
     * (emu_doc_lengths: one of length 1, one longer than a shard) in one
     * list (docs=shared) or one per batch row (docs=per-row), windows
     * shorter and longer than a shard (S / P rows), GQA, both dtypes and
     * head dims, lengths that are not multiples of the tiles. */
    static const rule_row rule_rows_mma[] = {
        {1, DT_ORDER_CONTIGUOUS, DT_ATTN_CAUSAL, {1, 320, 2, 1, 64}, 0, 1, DT_BF16},
        {2, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, {2, 256, 4, 2, 128}, 9, 2, DT_F16},
        {3, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {1, 384, 2, 1, 64}, 200, 0, DT_BF16},
        {4, DT_ORDER_CONTIGUOUS, DT_ATTN_FULL, {2, 256, 2, 1, 128}, 100, 2, DT_BF16},
        {4, DT_ORDER_ZIGZAG, DT_ATTN_FULL, {2, 384, 4, 1, 64}, 20, 1, DT_F16},
        {3, DT_ORDER_STRIPED, DT_ATTN_FULL, {1, 300, 4, 1, 64}, 7, 0, DT_BF16},
        {2, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {2, 264, 2, 2, 128}, 200, 2, DT_F16},
        {1, DT_ORDER_CONTIGUOUS, DT_ATTN_FULL, {1, 200, 2, 1, 128}, 30, 1, DT_BF16},
        /* zigzag chunks of 96 rows: a tile of 64 across the jump pairs with
         * rows near both of its ends, and a whole tile between them with
         * none (several runs of tiles: common.cuh) */
        {2, DT_ORDER_ZIGZAG, DT_ATTN_FULL, {1, 384, 2, 1, 64}, 20, 0, DT_BF16},
        {2, DT_ORDER_ZIGZAG, DT_ATTN_FULL, {2, 384, 4, 2, 128}, 0, 2, DT_F16},
    };
    /* The same for the wgmma kernels' tiles (forward 128 x 128, backward
     * 128 keys x 8192 / D queries): several tiles a block, and the jumps of
     * zigzag chunks of 192 rows inside a tile. */
    static const rule_row rule_rows_wg[] = {
        {1, DT_ORDER_CONTIGUOUS, DT_ATTN_CAUSAL, {1, 400, 2, 1, 64}, 0, 1, DT_BF16},
        {2, DT_ORDER_STRIPED, DT_ATTN_CAUSAL, {2, 512, 4, 2, 128}, 9, 2, DT_F16},
        {3, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {1, 768, 2, 1, 64}, 300, 0, DT_BF16},
        {4, DT_ORDER_CONTIGUOUS, DT_ATTN_FULL, {2, 512, 2, 1, 128}, 200, 2, DT_BF16},
        {4, DT_ORDER_ZIGZAG, DT_ATTN_FULL, {2, 512, 4, 1, 64}, 20, 1, DT_F16},
        {3, DT_ORDER_STRIPED, DT_ATTN_FULL, {1, 390, 4, 1, 128}, 7, 0, DT_BF16},
        {2, DT_ORDER_ZIGZAG, DT_ATTN_CAUSAL, {2, 520, 2, 2, 128}, 300, 2, DT_F16},
        {1, DT_ORDER_CONTIGUOUS, DT_ATTN_FULL, {1, 300, 2, 1, 128}, 30, 1, DT_BF16},
        {2, DT_ORDER_ZIGZAG, DT_ATTN_FULL, {1, 768, 2, 1, 64}, 20, 0, DT_BF16},
        {2, DT_ORDER_ZIGZAG, DT_ATTN_FULL, {2, 768, 4, 2, 128}, 0, 2, DT_F16},
    };
    enum { NRULE = sizeof rule_rows_mma / sizeof rule_rows_mma[0] };
    _Static_assert(sizeof rule_rows_wg == sizeof rule_rows_mma, "one wgmma row per mma row");
    static emu_case rule_cases[4 * NRULE];
    struct CMUnitTest tests[DT_ATTN_FORM_COUNT * PER_FORM + 4 * NRULE + 7 + 9];
    const int quick = getenv("DT_TEST_QUICK") != NULL;
    size_t nt = 0;
    for (int form = 0; form < DT_ATTN_FORM_COUNT; form++)
    for (int dir = 0; dir < 4; dir++)
        for (int dt = 0; dt < 2; dt++)
            for (int i = 0; i < NROWS; i++)
                /* the wgmma forward's variants at D = 128 on the three D = 128
                 * rows, bf16 (persistent with dependent launches, and a CTA
                 * per tile without): v = 0 thread 0's loads, 1 the producer
                 * warpgroup (the producer mode) */
                for (int v = 0; v <= (dir == 2 && !dt && (i == 1 || i == 3 || i == 5) ? 1 : 0); v++) {
                    if (quick && (dt || i || v)) continue;   /* valgrind: one case per direction */
                    if (dt && !fp16_rows[i]) continue;
                    if (dir % 2 && rows[i].huge) continue;  /* the forward's numerics case */
                    const shape_row *row = dir >= 2 ? &wg_rows[i] : &rows[i];
                    emu_case *c = &cases[nt];
                    c->s = row->s;
                    c->P = row->P;
                    c->order = row->order;
                    c->mask = row->mask;
                    c->dtype = dt ? DT_F16 : DT_BF16;
                    c->seed = 4000 + 10 * nt;
                    c->huge = row->huge;
                    c->kernel = dir >= 2 ? DT_ATTN_KERNEL_WGMMA : DT_ATTN_KERNEL_MMA;
                    /* launch orders: sections of three units on the rows with
                     * four (a narrower first section), one unit after another (no
                     * L2) on row 0, all units in one section (an H100's L2) */
                    c->l2 = i == 0 ? 0 : 50 << 20;
                    c->sections = i == 1 || i == 2 ? 3 : 0;
                    /* the wgmma forward persistent (one SM: one or two CTAs, each
                     * taking many query tiles, tiles without keys among them on
                     * the zigzag rows) on rows 0 to 2 and 5, a CTA per tile on 3,
                     * 4; every kernel with dependent launches but on row 3, the
                     * forward's on the zigzag rows 2 and 5 with the rows' waits
                     * (whose blocks after the first then run a CTA per tile) */
                    c->sms = i <= 2 || i == 5;
                    c->dependent = i == 3 ? 0 : dir % 2 == 0 && (i == 2 || i == 5) ? 2 : 1;
                    c->producer = v;
                    c->form = (dt_attn_form)form;
                    snprintf(c->name, sizeof c->name, "%s/%s/P=%d,B=%lld,S=%lld,H=%lld,HKV=%lld,D=%lld,%s,%s%s%s%s%s,%s",
                             (const char *[]){"forward", "backward", "forward-wgmma",
                                              "backward-wgmma"}[dir],
                             dt_order_name(c->order), c->P,
                             (long long)c->s.B, (long long)c->s.S, (long long)c->s.H,
                             (long long)c->s.Hkv, (long long)c->s.D, dt_attn_mask_name(c->mask),
                             dt_dtype_name(c->dtype), c->huge ? ",logits=1e4" : "",
                             dir == 2 && c->sms ? ",persistent" : "",
                             c->dependent == 2 ? ",dependent,rows" : c->dependent ? ",dependent" : "",
                             c->producer ? ",producer" : "", dt_attn_form_name(c->form));
                    tests[nt] = (struct CMUnitTest){c->name, dir % 2 ? run_backward : run_forward, NULL, NULL, c};
                    nt++;
                }
    /* dir as above */
    for (int dir = 0; dir < 4; dir++)
        for (int i = 0; i < NRULE; i++) {
            if (quick && i) continue;   /* valgrind: one case per direction */
            const rule_row *row = dir >= 2 ? &rule_rows_wg[i] : &rule_rows_mma[i];
            emu_case *c = &rule_cases[dir * NRULE + i];
            *c = (emu_case){.s = row->s, .P = row->P, .order = row->order, .mask = row->mask,
                            .dtype = row->dtype, .seed = 9000 + 10 * (uint64_t)i,
                            .kernel = dir >= 2 ? DT_ATTN_KERNEL_WGMMA : DT_ATTN_KERNEL_MMA,
                            .l2 = 50 << 20, .sections = i == 1 ? 3 : 0,
                            .form = DT_ATTN_FORM_LATEST, .window = row->window, .docs = row->docs};
            /* dependent launches on half the rows, the forward's rows' waits
             * on two; the wgmma forward offered the persistent launch (which
             * a ruled block does not take: a CTA per tile) on some */
            c->dependent = i % 2 == 0 ? 0 : dir % 2 == 0 && (i == 1 || i == 5) ? 2 : 1;
            c->sms = dir == 2 && i % 3 == 0;
            snprintf(c->name, sizeof c->name,
                     "%s/%s/P=%d,B=%lld,S=%lld,H=%lld,HKV=%lld,D=%lld,%s,window=%lld,docs=%s,%s%s,%s",
                     (const char *[]){"forward-rule", "backward-rule", "forward-wgmma-rule",
                                      "backward-wgmma-rule"}[dir],
                     dt_order_name(c->order), c->P,
                     (long long)c->s.B, (long long)c->s.S, (long long)c->s.H, (long long)c->s.Hkv,
                     (long long)c->s.D, dt_attn_mask_name(c->mask), (long long)c->window,
                     (const char *[]){"none", "shared", "per-row"}[c->docs], dt_dtype_name(c->dtype),
                     c->dependent == 2 ? ",dependent,rows" : c->dependent ? ",dependent" : "",
                     dt_attn_form_name(c->form));
            tests[nt++] = (struct CMUnitTest){c->name, dir % 2 ? run_backward : run_forward, NULL,
                                              NULL, c};
        }
#ifndef DT_EMU_NO_CXX
    tests[nt++] = (struct CMUnitTest){"rule/verified-refuses", test_rule_verified_refused, NULL,
                                      NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"rule/keyless-rows/latest", test_rule_keyless_rows, NULL,
                                      NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"backward/block-ok/walk-within-2^31", test_bwd_walk_bound,
                                      NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"block-ok/key-span-within-2^32", test_key_span_bound, NULL,
                                      NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"forward-wgmma/persistent/past-a-keyless-tile",
                                      test_wgmma_persistent_keyless, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"forward/nonfinite/latest", test_nonfinite_forward, NULL,
                                      NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"backward/nonfinite/latest", test_nonfinite_backward, NULL,
                                      NULL, NULL};
#endif
    tests[nt++] = (struct CMUnitTest){"emulator/checks-and-semantics", test_emulator, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/wgmma", test_wgmma, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/mbarrier-and-tma", test_tma, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/named-barriers", test_named_barriers, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/setmaxnreg", test_setmaxnreg, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/ex2-approx-ftz", test_ex2_ftz, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/max-nan", test_max_nan, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/bulk-reduce-add", test_bulk_reduce, NULL, NULL, NULL};
    tests[nt++] = (struct CMUnitTest){"emulator/programmatic-dependent-launch", test_griddep, NULL,
                                      NULL, NULL};
    return h_run_cases("tensor-core kernels on the CPU emulator", tests, nt);
}
