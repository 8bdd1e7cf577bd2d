/* bench/blocks.c — the attention block kernel alone, on one device: the
 * block-level measurements of docs/PERFORMANCE.md.
 *
 * bench/attention goes through the public API; this drives the backend's
 * block kernels (attention/block.h, private) one block at a time, with the
 * device synchronised before and after, so every block's time is its own
 * even where ranks would share one device. Ranks' blocks run one after
 * another, as on one GPU. Two sections:
 *
 *   (r) causal efficiency. r = time(causal c x c block) / time(full c x c
 *       block) for c in --c, for the single-device diagonal block, segments
 *       (0,1,c) x (0,1,c), and the two striped blocks of P ranks: queries
 *       (1,P,c) against keys (0,P,c), diagonal included (y <= x), and
 *       (0,P,c) against (1,P,c), diagonal excluded (y < x). A kernel that
 *       skips masked tiles perfectly has r near 1/2. Each block merges into
 *       the rows' stored state, as a ring's middle step; with --rows own
 *       the forward's start and finish their rows instead, as a call's only
 *       block (the merge's cost is the difference).
 *   (p) the ring on one device. P ranks of --ring-c tokens; for contiguous,
 *       striped and zigzag sharding every (rank j, step t) block is timed
 *       alone as the ring runs it: the query segment of rank j against the
 *       key segment of rank (j - t) mod P (mask.h), accumulating into the
 *       rank's fp32 m, l, acc (forward: step 0 starts them and the rank's
 *       last block with a pair writes o and lse, as in dt_attention_forward)
 *       or dQ, dK, dV (backward, as dt_attention_backward runs a rank's
 *       blocks: dq added into, dk and dv written into a buffer of the
 *       block's own; back to back, step P-1's block in two launches, one
 *       per half of its keys, the second adding into dk, dv; a block after
 *       step 0 with no pair the mask allows is skipped, as the forward's
 *       launch nothing). Each rank's rows sit in buffers of their own (rank
 *       j's queries, state and gradients from row j c, the keys of rank
 *       src from row src c), as the ranks' memory on one device.
 *         critical path  sum over steps of the slowest rank's block;
 *         total          sum of every block (the ring's work on one device);
 *         ratio          contiguous critical path / this order's;
 *         ceiling        (r + P - 1) / (P r), the striped/contiguous ratio a
 *                        kernel with causal efficiency r allows (r measured
 *                        here at c = --ring-c, in the launch of the ring's
 *                        steps before its last: beside a transfer, on CUDA
 *                        a CTA per query tile); achieved = ratio / ceiling;
 *         vs one call    total / the time of one causal call on the whole
 *                        sequence S = P c (forward: one block that starts
 *                        and finishes its rows; the cost of the ring's fused
 *                        accumulation and of cutting the work into blocks).
 *         b2b            every block of the order launched back to back
 *                        (steps in turn, the ranks' blocks of a step one
 *                        after another), timed as one: the ring on one
 *                        device with nothing between its blocks; / one call
 *                        as above. On CUDA with dependent launches on
 *                        (--dependent 1, the default, or 2: each rank's
 *                        blocks with their rows' waits, a scratch and a
 *                        count of counted blocks per rank, as its calls
 *                        have): once more without them, "b2b serial".
 *         (m)            forward, --kernel mma or wgmma: the tile model,
 *                        time as K key tiles + F per query tile's visit
 *                        of a block (dt_attn_tiles); the F that b2b/call
 *                        implies, and the largest F that would allow
 *                        b2b/call <= 1.05.
 *         (g)            forward, --group LIST: each order's ring once
 *                        more with a rank's steps grouped as the library
 *                        groups them for dt_attention_options.group = G
 *                        (group_plan_make: a launch's keys one key
 *                        segment, so each query tile merges into its
 *                        rows' state once a launch), back to back as
 *                        b2b, its outputs checked against the ring's;
 *                        with the tile model's K, V and F.
 *
 * --pass fwd,bwd picks the forward and/or backward block kernel. Backward
 * blocks use the lse of a forward pass over the same rows, so P stays
 * finite, and write their dk, dv (block.h's first) as a ring's steps do.
 * Timing (time_block): the device drained before each block; CUDA
 * events around its kernels on a GPU, the stream kept busy for 200 us
 * before the first event (the host's work for the first launch is then
 * not timed), CLOCK_MONOTONIC on the CPU; one warm-up, then --iters
 * repetitions; the median. On the CPU, OpenBLAS uses
 * its own thread count (one rank, every core).
 * Inputs are fill_random values; the timed code does not depend on them.
 *
 * --trace (CUDA tensor-core kernels): after timing each block, one more
 * run of it records every CTA's start, end, SM and tiles
 * (dt_attn_block_args.trace) and prints where the launch's time went
 * (attention/cta_trace.h). (r): the SMs' idle share (fill), the time after
 * the last CTA started (drain), and a CTA's cycles per tile and fixed cost
 * (a line fitted through the CTAs' cycles against their tiles), which the
 * kernels' marks split into the start (to the first tile landed), the
 * main loop's own fixed cost and the end (forward: the rows' merge and
 * write-back; backward: dK and dV out; the wgmma forward marks at D = 128
 * only, the wgmma backward at both, the mma backward not). (p): per
 * order, every launch of its blocks summed (span, drain, packed time: the
 * SMs' mean busy time), and the same for the one call; then the b2b ring
 * run once more with every launch recording into its own slice, as one
 * device timeline (timeline_run): the mean SM's busy time and its idle
 * time before its first record, between records and after its last, so
 * that b2b/call splits into the ring's extra work (busy ring / busy call)
 * and its idle time (wall / busy); the one call's, a launch alone, from its
 * traced run above.
 *
 * --json prints one JSON object instead of the tables, after the last
 * measurement: the configuration, then every row of (r) and of (p), each
 * with its pass, under the text columns' names (docs/PERFORMANCE.md).
 *
 * Run: build/bench/blocks [--backend auto|cpu|cuda] [--quick] [--iters N]
 *      [--pass fwd,bwd] [--section r,p] [--c LIST] [--ring-c LIST]
 *      [--ranks P] [--heads H] [--kv-heads G] [--dim D] [--dtype T]
 *      [--kernel auto|simple|mma|wgmma|simple-latest|mma-latest|wgmma-latest] [--l2 BYTES]
 *      [--persistent 0|1|2] [--dependent 0|1|2] [--producer 0|1] [--rows merge|own]
 *      [--group LIST] [--trace]
 *      [--json]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/block.h"
#include "attention/cta_trace.h"
#include "attention/mask.h"
#include "attention/cuda/mma_layout.h"
#include "dtensor/context_internal.h"
#include "dtensor/dtensor.h"
#ifdef DT_HAVE_CUDA
#include "dtensor/backend_cuda.h"
#endif

#define NAME "bench/blocks"
#include "examples/example_util.h" /* ex_now_s, ex_median, flag parsers */

#define MAX_ITERS 100
#define MAX_LIST 8
#define MAX_RANKS 64   /* --ranks */

typedef struct opts {
    dt_backend_kind backend;
    int quick, json, trace, iters, ranks, passes[2], sections[2];
    int64_t heads, kv_heads, dim;
    dt_dtype dtype;
    int n_c, n_ring_c;
    int64_t c[MAX_LIST], ring_c[MAX_LIST];
    int set_c, set_ring_c, set_dtype, set_iters;
    dt_attn_kernel_choice kernel;   /* --kernel: which CUDA block kernel */
    int64_t l2;                     /* --l2: the L2 size the CTA order plans for (-1: the device's) */
    int persistent;                 /* --persistent: the backend's mode (backend_cuda.h) */
    int dependent;                  /* --dependent: 0 no programmatic dependent launches, 2
                                       the forward's with the rows' waits (backend_cuda.h) */
    int producer;                   /* --producer: the wgmma forward's producer warpgroup (1) */
    int own;                        /* --rows own: (r)'s forward blocks start and finish their rows */
    /* --group: (p)'s forward rings with a rank's steps after its first G
     * to a launch (G >= 2) */
    int n_group;
    int64_t group[MAX_LIST];
} opts;

/* ------------------------------------------------------------ the buffers */

/* --trace: what traced launches add up to (attention/cta_trace.h). */
typedef struct launch_sum {
    int launches;                          /* those whose CTAs recorded (a block with nothing
                                              to do launches none: attention/cuda/block.cu's fwd_idle) */
    int64_t ctas;
    double span_us, drain_us, packed_us;   /* summed; packed: the SMs' mean busy time */
    dt_attn_trace_stats last;              /* the last launch's */
    dt_attn_trace_timeline last_timeline;  /* the last launch's, as a timeline */
} launch_sum;

/* Everything one rank's blocks touch, for `rows` query and key rows. */
typedef struct bufs {
    dt_backend *be;
    int events;                        /* CUDA: time blocks with events (time_block) */
    const dt_attn_kernels *kern;
    dt_attention_tuning tuning;     /* the kernel and its launch, from the options */
    dt_dtype dtype;
    int64_t rows, H, G, D;
    void *q, *k, *v, *dout, *o;        /* dtype */
    int64_t kv_slots, kv_slot_rows;    /* k, v's rows in turns from slots (block.h; 0: not) */
    float *acc, *m, *l, *lse, *delta;  /* fp32; lse: of a full pass, for the backward blocks */
    float *lse_out;                    /* the forward blocks' lse (the last of a ring's) */
    float *dq, *dk, *dv;               /* fp32; dk, dv: two buffers of rows x G x D each */
    void *scratch;                     /* rank j's at scratch + j scratch_bytes ((p)'s ring) */
    size_t scratch_bytes;
    uint32_t *ring_launches;           /* (p)'s ring: rank j's count of its counted blocks */
    uint32_t *launches;                /* block.h's launches: NULL, or (run_ring) rank j's */
    dt_attn_cta_trace *trace;          /* --trace: backend memory for trace_slices slices */
    int64_t trace_len, trace_slices;   /* of trace_len records each: a launch's records */
    launch_sum *tracing;               /* non-NULL: run_block traces each launch into it */
    int64_t *slice;                    /* non-NULL: each launch records into the next slice,
                                          *slice of them so far (timeline_run) */
} bufs;

static const dt_attn_kernels *kernels_of(dt_context *ctx) {
#ifdef DT_HAVE_CUDA
    if (dt_context_backend(ctx) == DT_BACKEND_CUDA) return &dt_attn_kernels_cuda;
#endif
    return dt_context_backend(ctx) == DT_BACKEND_CPU ? &dt_attn_kernels_cpu : NULL;
}

static void bufs_free(bufs *b) {
    void *all[] = {b->q, b->k, b->v, b->dout, b->o, b->acc, b->m, b->l, b->lse, b->delta,
                   b->lse_out, b->dq, b->dk, b->dv, b->scratch, b->trace};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]) b->be->ops->free(b->be, all[i]);
    free(b->ring_launches);
}

/* Backend memory of n elements of dtype, filled with fill_random values. */
static dt_status random_buffer(dt_backend *be, dt_dtype dtype, size_t n, uint64_t seed,
                               void **out) {
    size_t es = dt_dtype_size(dtype);
    void *host = malloc(n * es + 1);
    if (!host) return dt_error(DT_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    for (size_t i = 0; i < n; i++) dt_value_set(host, dtype, i, dt_random_value(seed, i));
    dt_status st = be->ops->alloc(be, n * es, out);
    if (st == DT_SUCCESS) st = be->ops->upload(be, *out, host, n * es);
    free(host);
    return st;
}

static dt_status bufs_make(dt_context *ctx, const opts *o, int64_t rows, bufs *b) {
    memset(b, 0, sizeof *b);
    b->be = ctx->backend;
    b->events = dt_context_backend(ctx) == DT_BACKEND_CUDA;
    b->kern = kernels_of(ctx);
    if (!b->kern) return dt_error(DT_ERR_NOT_SUPPORTED, "bench: no attention kernels here");
    b->dtype = o->dtype;
    b->tuning = (dt_attention_tuning){o->kernel, o->persistent, o->dependent, o->producer};
    b->rows = rows;
    b->H = o->heads;
    b->G = o->kv_heads;
    b->D = o->dim;
    size_t nq = (size_t)(rows * b->H * b->D), nk = (size_t)(rows * b->G * b->D);
    size_t nr = (size_t)(rows * b->H);
    dt_backend *be = b->be;
    dt_status st;
    DT_TRY(random_buffer(be, b->dtype, nq, 1, &b->q));
    DT_TRY(random_buffer(be, b->dtype, nk, 2, &b->k));
    DT_TRY(random_buffer(be, b->dtype, nk, 3, &b->v));
    DT_TRY(random_buffer(be, b->dtype, nq, 4, &b->dout));
    DT_TRY(be->ops->alloc(be, nq * dt_dtype_size(b->dtype), &b->o));
    float **f32[] = {&b->acc, &b->dq, &b->m, &b->l, &b->lse, &b->delta, &b->lse_out, &b->dk,
                     &b->dv};
    size_t n32[] = {nq, nq, nr, nr, nr, nr, nr, 2 * nk, 2 * nk};
    for (int i = 0; i < 9; i++) DT_TRY(be->ops->alloc(be, n32[i] * sizeof(float), (void **)f32[i]));
    /* a scratch per rank of (p)'s ring (its rows' counts: block.h), each for
     * all the rows, as (r)'s blocks take them */
    const int ranks = o->sections[1] ? o->ranks : 1;
    size_t sb = b->kern->fwd_scratch(b->D, b->H, rows), bb = b->kern->bwd_scratch(b->D);
    b->scratch_bytes = ((sb > bb ? sb : bb) + 255) / 256 * 256;
    DT_TRY(be->ops->alloc(be, b->scratch_bytes * (size_t)ranks, &b->scratch));
    b->ring_launches = calloc((size_t)ranks, sizeof *b->ring_launches);
    if (!b->ring_launches) return dt_error(DT_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    if (o->trace) {   /* a CTA per 64 query rows (or 128 keys) and head at most */
        b->trace_len = (rows / 64 + 1) * b->H;
        /* a slice per launch of (p)'s ring: P^2 blocks, P more backward */
        b->trace_slices = o->sections[1] ? (int64_t)o->ranks * (o->ranks + 1) : 1;
        DT_TRY(be->ops->alloc(be, (size_t)(b->trace_len * b->trace_slices) * sizeof *b->trace,
                              (void **)&b->trace));
    }
    /* lse and delta of a full (non-causal) pass over these rows: finite
     * everywhere, the scale of a real backward. */
    dt_attn_segment all = {0, 1, rows, 0, 0};
    dt_attn_block_args a = {
        .dtype = b->dtype, .batch = 1, .heads = b->H, .kv_heads = b->G, .dim = b->D,
        .q = b->q, .q_batch_stride = 0, .k = b->k, .v = b->v, .kv_batch_stride = 0,
        .qseg = all, .kseg = all, .mask = DT_ATTN_FULL, .scale = 1.0f / sqrtf((float)b->D),
        .m = b->m, .l = b->l, .ml_batch_stride = 0, .ml_head_stride = rows,
        .acc = b->acc, .acc_batch_stride = 0, .first = 1, .last = 1, .o = b->o, .lse = b->lse,
        .tuning = b->tuning,
    };
    DT_TRY(b->kern->fwd(be, &a, b->scratch));
    DT_TRY(b->kern->delta(be, b->dtype, 1, rows, b->H, b->D, b->o, b->dout, b->delta));
    /* m, l, acc: a running state to accumulate into (the blocks of (r) and
     * the middle steps of (p) read it): the start of a block with no keys */
    dt_attn_segment none = {0, 1, 0, 0, 0};
    a.kseg = none;
    a.last = 0;
    DT_TRY(b->kern->fwd(be, &a, b->scratch));
    st = be->ops->sync(be);
    return st;
}

/* --------------------------------------------------------------- one block */

/* --trace: the records of the launch just made, summed up into
 * b->tracing; the records zeroed again for the next one. */
static dt_status trace_launch(const bufs *b) {
    size_t bytes = (size_t)b->trace_len * sizeof *b->trace;
    dt_attn_cta_trace *host = malloc(bytes);
    if (!host) return dt_error(DT_ERR_OUT_OF_MEMORY, "bench: no host memory for the trace");
    dt_attn_trace_stats t;
    dt_status st = b->be->ops->sync(b->be);
    if (st == DT_SUCCESS) st = b->be->ops->download(b->be, host, b->trace, bytes);
    if (st == DT_SUCCESS) st = dt_attn_trace_summarize(host, b->trace_len, &t);
    if (st == DT_SUCCESS)
        st = dt_attn_trace_timeline_of(host, b->trace_len, &b->tracing->last_timeline);
    if (st == DT_SUCCESS) {
        launch_sum *sum = b->tracing;
        sum->launches += t.ctas > 0;
        sum->ctas += t.ctas;
        sum->span_us += t.span_us;
        sum->drain_us += t.drain_us;
        sum->packed_us += t.ctas ? t.fill * t.span_us : 0;
        sum->last = t;
        memset(host, 0, bytes);
        st = b->be->ops->upload(b->be, b->trace, host, bytes);
    }
    free(host);
    return st;
}

/* The records the next launch writes: --trace's, or in a timeline run the
 * next slice (none past the last: timeline_run fails then). */
static dt_attn_cta_trace *trace_of(const bufs *b) {
    if (b->slice) {
        const int64_t s = (*b->slice)++;
        return s < b->trace_slices ? b->trace + s * b->trace_len : NULL;
    }
    return b->tracing ? b->trace : NULL;
}

/* b as rank j's blocks of a ring see it: its queries, running state,
 * outputs and gradients from row qrow, the keys and values it holds (rank
 * src's) from row krow, as P ranks' buffers would sit side by side on one
 * device (the one call's are rows 0 to S). Per-row buffers are [row, head,
 * d]; m, l, lse, delta and the forward's lse are [head, row] with head
 * stride b->rows, which stays. */
static bufs bufs_at(const bufs *b, int64_t qrow, int64_t krow) {
    bufs r = *b;
    const size_t es = dt_dtype_size(b->dtype);
    const int64_t qe = qrow * b->H * b->D, ke = krow * b->G * b->D;
    r.q = (char *)b->q + (size_t)qe * es;
    r.dout = (char *)b->dout + (size_t)qe * es;
    r.o = (char *)b->o + (size_t)qe * es;
    r.k = (char *)b->k + (size_t)ke * es;
    r.v = (char *)b->v + (size_t)ke * es;
    r.acc = b->acc + qe;
    r.dq = b->dq + qe;
    r.dk = b->dk + qrow * b->G * b->D;
    r.dv = b->dv + qrow * b->G * b->D;
    r.m = b->m + qrow;
    r.l = b->l + qrow;
    r.lse = b->lse + qrow;
    r.delta = b->delta + qrow;
    r.lse_out = b->lse_out + qrow;
    return r;
}

/* The backward block of qs against rows [y0, y1) of ks (the whole block,
 * or a part of the keys of a ring's last step), as attention/backward.c
 * runs it: dq added into, dk and dv written (first) into buffer `buf` (0
 * or 1: a ring's blocks take them in turn, as its steps' do) or added into
 * (the second part of a ring's last step); continues: as block.h's, the
 * blocks of a ring after its first. */
static dt_status run_bwd_rows(const bufs *b, dt_attn_mask mask, dt_attn_segment qs,
                              dt_attn_segment ks, int64_t y0, int64_t y1, int first, int buf,
                              int continues) {
    const int64_t off = y0 * b->G * b->D, goff = off + buf * b->rows * b->G * b->D;
    dt_attn_block_bwd_args a = {
        .dtype = b->dtype, .batch = 1, .heads = b->H, .kv_heads = b->G, .dim = b->D,
        .q = b->q, .dout = b->dout,
        .k = (const char *)b->k + (size_t)off * dt_dtype_size(b->dtype),
        .v = (const char *)b->v + (size_t)off * dt_dtype_size(b->dtype),
        .qseg = qs, .kseg = dt_attn_segment_rows(ks, y0, y1 - y0), .mask = mask,
        .scale = 1.0f / sqrtf((float)b->D), .lse = b->lse, .delta = b->delta,
        .ml_head_stride = b->rows, .dq = b->dq, .dk = b->dk + goff, .dv = b->dv + goff,
        .first = first, .continues = continues, .tuning = b->tuning, .trace = trace_of(b),
        .trace_len = b->trace_len,
    };
    DT_TRY(b->kern->bwd(b->be, &a, b->scratch));
    return b->tracing ? trace_launch(b) : DT_SUCCESS;
}

/* The block of query segment qs against key segment ks, rows from row 0 (as
 * a rank's shard), forward or backward, accumulating into b's fp32 buffers.
 * Forward, as a ring step of dt_attention_forward: first, the block starts
 * its rows; last, it writes o and lse; transfer, the ring's next K, V would
 * be in flight beside it (block.h). */
static dt_status run_block(const bufs *b, int bwd, dt_attn_mask mask, dt_attn_segment qs,
                           dt_attn_segment ks, int first, int last, int transfer) {
    if (bwd) return run_bwd_rows(b, mask, qs, ks, 0, ks.len, 1, 0, 0);
    dt_attn_block_args a = {
        .dtype = b->dtype, .batch = 1, .heads = b->H, .kv_heads = b->G, .dim = b->D,
        .q = b->q, .k = b->k, .v = b->v, .kv_slots = b->kv_slots, .kv_slot_rows = b->kv_slot_rows,
        .qseg = qs, .kseg = ks, .mask = mask,
        .scale = 1.0f / sqrtf((float)b->D), .m = b->m, .l = b->l, .ml_head_stride = b->rows,
        .acc = b->acc, .first = first, .last = last, .o = b->o, .lse = b->lse_out,
        .tuning = b->tuning, .transfer = transfer, .trace = trace_of(b), .trace_len = b->trace_len,
        .launches = b->launches,
    };
    DT_TRY(b->kern->fwd(b->be, &a, b->scratch));
    return b->tracing ? trace_launch(b) : DT_SUCCESS;
}

/* Median seconds of run_block over o->iters repetitions after one warm-up,
 * the device drained before each. On CUDA the time between two events on
 * the compute stream around the block's kernels (the backend's marks),
 * the stream kept busy for BUSY_US before the first (the host prepares and
 * launches the first kernel meanwhile: on an idle GPU the start event
 * would fire at once and the span hold that host work, some 10 us a
 * launch), so the launch latency and the host's synchronisation are left
 * out, as bench/attention_sdpa.py leaves them out of PyTorch's; on the
 * CPU the wall clock (OpenBLAS runs the block on every core, which the
 * rank thread's CPU time of the CPU backend's marks would not count). */
#define BUSY_US 200.0
typedef struct timed {   /* what time_runs runs: run_block's blocks, or a ring's */
    int bwd, ring, first, last, transfer;
    dt_attn_mask mask;
    dt_attn_segment qs, ks;
    dt_order order;   /* ring: P ranks of c tokens */
    int P;
    int64_t c;
    const struct group_plan *plan;   /* ring: NULL, or a forward ring's steps grouped */
} timed;

static dt_status run_ring(const bufs *b, int bwd, dt_order order, int P, int64_t c);
static dt_status run_grouped(const bufs *b, const struct group_plan *plan);

static dt_status run_timed(const bufs *b, const timed *w) {
    if (w->ring && w->plan) return run_grouped(b, w->plan);
    if (w->ring) return run_ring(b, w->bwd, w->order, w->P, w->c);
    return run_block(b, w->bwd, w->mask, w->qs, w->ks, w->first, w->last, w->transfer);
}

static dt_status time_runs(const bufs *b, const opts *o, const timed *w, double *median_s) {
    double t[MAX_ITERS];
    if (b->events) DT_TRY(b->be->ops->marks_reserve(b->be, 2));
    for (int i = -1; i < o->iters; i++) {
        DT_TRY(b->be->ops->sync(b->be));
        double t0 = ex_now_s();
#ifdef DT_HAVE_CUDA
        /* the GPU busy while the host prepares the first launch */
        if (b->events) DT_TRY(dt_backend_cuda_busy(b->be, BUSY_US));
#endif
        if (b->events) DT_TRY(b->be->ops->mark(b->be, 0));
        DT_TRY(run_timed(b, w));
        if (b->events) DT_TRY(b->be->ops->mark(b->be, 1));
        DT_TRY(b->be->ops->sync(b->be));
        double s = ex_now_s() - t0, ms = 0.0;
        if (b->events) {
            DT_TRY(b->be->ops->mark_ms(b->be, 0, 1, &ms));
            s = ms / 1e3;
        }
        if (i >= 0) t[i] = s;
    }
    *median_s = ex_median(t, o->iters);
    return DT_SUCCESS;
}

static dt_status time_block(const bufs *b, const opts *o, int bwd, dt_attn_mask mask,
                            dt_attn_segment qs, dt_attn_segment ks, int first, int last,
                            int transfer, double *median_s) {
    const timed w = {.bwd = bwd, .first = first, .last = last, .transfer = transfer,
                     .mask = mask, .qs = qs, .ks = ks};
    return time_runs(b, o, &w, median_s);
}

/* One more run of run_block's blocks with their CTAs recording themselves
 * (--trace), every launch summed up into *sum (attention/cta_trace.h;
 * ctas = 0 where the kernel keeps no record: the CPU's, the simple CUDA
 * ones). Not timed: the timed runs carry no trace. */
static dt_status trace_run(const bufs *b, int bwd, dt_attn_mask mask, dt_attn_segment qs,
                           dt_attn_segment ks, int first, int last, int transfer,
                           launch_sum *sum) {
    size_t bytes = (size_t)b->trace_len * sizeof *b->trace;
    dt_attn_cta_trace *zeros = calloc(1, bytes);
    if (!zeros) return dt_error(DT_ERR_OUT_OF_MEMORY, "bench: no host memory for the trace");
    dt_status st = b->be->ops->upload(b->be, b->trace, zeros, bytes);   /* unwritten records */
    free(zeros);
    bufs t = *b;
    t.tracing = sum;
    if (st == DT_SUCCESS) st = run_block(&t, bwd, mask, qs, ks, first, last, transfer);
    return st;
}

/* One more run of time_runs' launches, back to back as timed, each
 * recording into a slice of its own (--trace in (p)), summed up as one
 * timeline into *out (attention/cta_trace.h). Not timed. */
static dt_status timeline_run(const bufs *b, const timed *w, dt_attn_trace_timeline *out) {
    const size_t bytes = (size_t)(b->trace_len * b->trace_slices) * sizeof *b->trace;
    dt_attn_cta_trace *host = calloc(1, bytes);
    if (!host) return dt_error(DT_ERR_OUT_OF_MEMORY, "bench: no host memory for the trace");
    int64_t used = 0;
    bufs t = *b;
    t.slice = &used;
    dt_status st = b->be->ops->upload(b->be, b->trace, host, bytes);   /* unwritten records */
    if (st == DT_SUCCESS) st = b->be->ops->sync(b->be);
    if (st == DT_SUCCESS) st = run_timed(&t, w);
    if (st == DT_SUCCESS) st = b->be->ops->sync(b->be);
    if (st == DT_SUCCESS && used > b->trace_slices)
        st = dt_error(DT_ERR_INTERNAL, "bench: %lld launches traced, room for %lld",
                      (long long)used, (long long)b->trace_slices);
    if (st == DT_SUCCESS)
        st = b->be->ops->download(b->be, host, b->trace,
                                  (size_t)(used * b->trace_len) * sizeof *host);
    if (st == DT_SUCCESS) st = dt_attn_trace_timeline_of(host, used * b->trace_len, out);
    free(host);
    return st;
}

/* --------------------------------------------------- (r) causal efficiency */

/* The blocks of (r): full, causal, striped diagonal included, excluded. */
enum { R_FULL, R_CAUSAL, R_INCL, R_EXCL, R_BLOCKS };
static const char *const r_block_names[R_BLOCKS] = {"full", "causal", "striped_le", "striped_lt"};

typedef struct r_row {
    int64_t c;
    double full_s, causal_s, incl_s, excl_s;   /* medians */
    int traced;
    dt_attn_trace_stats trace[R_BLOCKS];       /* --trace */
} r_row;

static dt_status measure_r(const bufs *b, const opts *o, int bwd, int64_t c, r_row *r) {
    int P = o->ranks;
    dt_attn_segment one = {0, 1, c, 0, 0}, s0 = {0, P, c, 0, 0}, s1 = {1, P, c, 0, 0};
    const dt_attn_segment qs[R_BLOCKS] = {one, one, s1, s0}, ks[R_BLOCKS] = {one, one, s0, s1};
    double *const t[R_BLOCKS] = {&r->full_s, &r->causal_s, &r->incl_s, &r->excl_s};
    r->c = c;
    r->traced = o->trace;
    for (int i = 0; i < R_BLOCKS; i++) {
        dt_attn_mask mask = i == R_FULL ? DT_ATTN_FULL : DT_ATTN_CAUSAL;
        DT_TRY(time_block(b, o, bwd, mask, qs[i], ks[i], o->own, o->own, 0, t[i]));
        if (o->trace) {
            launch_sum sum = {0};
            DT_TRY(trace_run(b, bwd, mask, qs[i], ks[i], o->own, o->own, 0, &sum));
            r->trace[i] = sum.last;
        }
    }
    return DT_SUCCESS;
}

/* ------------------------------------------------- (p) the ring on one device */

static const dt_order orders[3] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};

typedef struct p_row {
    double crit_s[3], total_s[3];
    double b2b_s[3], b2b_serial_s[3];   /* back to back; serial: NAN where not measured */
    double single_s, r;
    int traced;
    launch_sum ring[3], single;   /* --trace: every block's launches; the one call's */
    dt_attn_trace_timeline ring_tl[3];   /* --trace: b2b's (the one call's: single) */
    /* The tile model (forward, --kernel mma or wgmma; model = 0 otherwise):
     * per (batch, head) the key tiles K and query tiles' visits V of every
     * block of the order, and of the one call (dt_attn_tiles) */
    int model;
    int64_t bm, bn, tiles[3], visits[3], single_tiles, single_visits;
    /* --group (forward): the rings with a rank's steps after its first G
     * to a launch (group_plan_make), G = 1 the ring as above; groups[oi]
     * for order oi */
    int n_groups;
    struct p_group {
        int G, group, launches;    /* asked, taken (dt_attn_ring_group); blocks launched
                                      (those with a pair the mask allows) */
        int64_t tiles, visits;     /* the tile model's K and V, as above (model) */
        double b2b_s;              /* back to back, as b2b */
        double o_err, lse_err;     /* against the ring's outputs (ring_outputs) */
        dt_attn_trace_timeline tl; /* --trace: b2b as one timeline, as ring_tl */
    } groups[3][MAX_LIST + 1];
} p_row;

/* A backward block the ring skips, as dt_attention_backward does: after
 * step 0 (whose block starts the sums), one with no pair the mask allows
 * (a contiguous ring's blocks from later ranks). The forward's launch
 * nothing by themselves. */
static int bwd_idle(int t, dt_attn_segment qs, dt_attn_segment ks) {
    return t > 0 && dt_attn_no_pairs(DT_ATTN_CAUSAL, qs, ks);
}

/* Every (rank j, step t) block of the ring, steps in turn, the ranks'
 * blocks of a step one after another, as measure_p times them alone.
 * Backward as backward.c runs a rank's: each block writes dk, dv into a
 * buffer of its own (the two in turn), the last step in two parts of its
 * keys, the second adding into what the first's buffer holds, and every
 * block after the first continues the one before. */
static dt_status run_ring(const bufs *b, int bwd, dt_order order, int P, int64_t c) {
    const int64_t S = (int64_t)P * c;
    int n = 0;   /* backward blocks launched so far */
    for (int t = 0; t < P; t++)
        for (int j = 0; j < P; j++) {
            const int src = (j - t + P) % P;
            const dt_attn_segment qs = dt_attn_segment_of(order, S, P, j);
            const dt_attn_segment ks = dt_attn_segment_of(order, S, P, src);
            const int last = t == dt_attn_ring_last_step(order, DT_ATTN_CAUSAL, S, P, j);
            bufs rb = bufs_at(b, j * c, src * c);
            /* the rank's scratch and count of counted blocks, as its own
             * calls' (dependent launch mode 2: block.h's launches) */
            rb.scratch = (char *)b->scratch + (size_t)j * b->scratch_bytes;
            rb.launches = b->ring_launches + j;
            if (!bwd) {   /* an idle block launches nothing (attention/cuda/block.cu) */
                DT_TRY(run_block(&rb, bwd, DT_ATTN_CAUSAL, qs, ks, t == 0, last, t + 1 < P));
            } else if (bwd_idle(t, qs, ks)) {
                continue;
            } else if (P > 1 && t == P - 1) {
                DT_TRY(run_bwd_rows(&rb, DT_ATTN_CAUSAL, qs, ks, 0, c / 2, 1, n % 2, n > 0));
                DT_TRY(run_bwd_rows(&rb, DT_ATTN_CAUSAL, qs, ks, c / 2, c, 0, n % 2, 1));
                n++;
            } else {
                DT_TRY(run_bwd_rows(&rb, DT_ATTN_CAUSAL, qs, ks, 0, c, 1, n % 2, n > 0));
                n++;
            }
        }
    return DT_SUCCESS;
}

/* --group: a forward ring with a rank's steps grouped as
 * dt_attention_forward groups them for dt_attention_options.group = G
 * (mask.h: dt_attn_ring_group, dt_attn_ring_runs, dt_attn_ring_run_keys),
 * the kernels as they are: after step 0, runs of consecutive steps whose
 * sources are neighbours in the sequence, each one launch whose keys make
 * one key segment, so that each query tile merges into its rows' stored
 * state once a launch instead of once a step (the tile model's steps per
 * launch, docs/PERFORMANCE.md). A run's n blocks lie lowest source first,
 * as the ring lands them: contiguous, side by side; striped causal, in n
 * slots of c rows read in turns (block.h's kv_slots, at the virtual
 * positions of dt_attn_ring_run_keys); zigzag, the first chunks then the
 * second ones nested (one jump). The ranks' shards side by side in b's
 * buffers (rank s's at row s c) already hold the first two so; zigzag's
 * rows are copied into place before timing. The runs after the one with a
 * rank's last step with pairs launch nothing, as in the ring.
 * The launches run rounds in turn (a rank's round 0 its step 0, round r
 * its r-th launch after), the ranks' launches of a round one after
 * another, as run_ring runs the steps. */
typedef struct group_launch {
    int j;                         /* rank j's steps of the launch: */
    int first, last, transfer;     /* as run_block's, for those steps */
    dt_attn_segment qs, ks;        /* rank j's queries; their keys, rows from 0 of k, v */
    const void *k, *v;
    int64_t slots;                 /* the keys' (block.h's kv_slots), of c rows each */
} group_launch;

typedef struct group_plan {
    int n;                         /* launches, in run order */
    int64_t c;                     /* tokens per rank */
    group_launch *l;
    void *kv;                      /* zigzag's rows where copied (b's memory) */
} group_plan;

static void group_plan_free(const bufs *b, group_plan *gp) {
    if (gp->kv) b->be->ops->free(b->be, gp->kv);
    free(gp->l);
    memset(gp, 0, sizeof *gp);
}

static dt_status group_plan_make(const bufs *b, dt_order order, int P, int64_t c, int G,
                                 group_plan *gp) {
    memset(gp, 0, sizeof *gp);
    gp->c = c;
    const int64_t S = (int64_t)P * c, h = c / 2;
    const size_t row = (size_t)(b->G * b->D) * dt_dtype_size(b->dtype);
    const int group = dt_attn_ring_group(order, DT_ATTN_CAUSAL, P, G);
    int first[MAX_RANKS][MAX_RANKS + 1], nr[MAX_RANKS], last[MAX_RANKS], most = 0;
    int64_t copied = 0;   /* rows of zigzag's launches of more than one block */
    for (int j = 0; j < P; j++) {
        nr[j] = dt_attn_ring_runs(order, DT_ATTN_CAUSAL, S, P, j, group, first[j]);
        last[j] = dt_attn_ring_last_step(order, DT_ATTN_CAUSAL, S, P, j);
        while (first[j][nr[j] - 1] > last[j]) nr[j]--;   /* they launch nothing */
        most = nr[j] > most ? nr[j] : most;
        for (int r = 1; r < nr[j] && order == DT_ORDER_ZIGZAG; r++)
            if (first[j][r + 1] - first[j][r] > 1) copied += (first[j][r + 1] - first[j][r]) * c;
    }
    gp->l = calloc((size_t)(P * most), sizeof *gp->l);
    if (!gp->l) return dt_error(DT_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    if (copied) DT_TRY(b->be->ops->alloc(b->be, 2 * (size_t)copied * row, &gp->kv));
    char *kdst = gp->kv, *vdst = kdst ? kdst + (size_t)copied * row : NULL;
    for (int round = 0; round < most; round++)   /* rounds in turn, ranks in turn */
        for (int j = 0; j < P; j++) {
            if (round >= nr[j]) continue;
            group_launch *e = &gp->l[gp->n++];
            const int t0 = first[j][round], t1 = first[j][round + 1], n = t1 - t0;
            const int s_hi = ((j - t0) % P + P) % P, s_lo = s_hi - n + 1;   /* no wrap */
            *e = (group_launch){.j = j, .first = t0 == 0,
                                .last = t0 <= last[j] && last[j] < t1, .transfer = t1 < P};
            e->slots = dt_attn_ring_run_keys(order, DT_ATTN_CAUSAL, S, P, j, t0, t1, &e->qs,
                                             &e->ks);
            e->k = (const char *)b->k + (size_t)(s_lo * c) * row;   /* rank s's at row s c */
            e->v = (const char *)b->v + (size_t)(s_lo * c) * row;
            if (order != DT_ORDER_ZIGZAG || n == 1) continue;
            /* zigzag: chunks s_lo .. s_hi, then 2P - 1 - s_hi .. 2P - 1 - s_lo */
            e->k = kdst;
            e->v = vdst;
            for (int x = 0; x < 2 * n; x++) {
                const int src = x < n ? s_lo + x : s_hi - (x - n);   /* its half x < n ? 0 : 1 */
                const size_t from = (size_t)(src * c + (x < n ? 0 : h)) * row;
                DT_TRY(b->be->ops->copy(b->be, kdst, (const char *)b->k + from, (size_t)h * row));
                DT_TRY(b->be->ops->copy(b->be, vdst, (const char *)b->v + from, (size_t)h * row));
                kdst += (size_t)h * row;
                vdst += (size_t)h * row;
            }
        }
    return b->be->ops->sync(b->be);
}

/* run_ring's forward with its steps grouped: the plan's launches in turn. */
static dt_status run_grouped(const bufs *b, const group_plan *gp) {
    const int64_t c = gp->c;
    for (int i = 0; i < gp->n; i++) {
        const group_launch *e = &gp->l[i];
        bufs rb = bufs_at(b, e->j * c, 0);
        rb.k = (void *)e->k;
        rb.v = (void *)e->v;
        rb.kv_slots = e->slots;
        rb.kv_slot_rows = c;
        rb.scratch = (char *)b->scratch + (size_t)e->j * b->scratch_bytes;
        rb.launches = b->ring_launches + e->j;
        DT_TRY(run_block(&rb, 0, DT_ATTN_CAUSAL, e->qs, e->ks, e->first, e->last, e->transfer));
    }
    return DT_SUCCESS;
}

/* The forward kernel's tile (query rows x keys) for the tile model: the
 * kernels --kernel names (mma, wgmma, in either form); 0 for the others,
 * whose cost does not go by such tiles (the simple kernel's thread per
 * row, the CPU's slices of the diagonal band). */
static int fwd_tile_of(const opts *o, int64_t *bm, int64_t *bn) {
    if (o->kernel == DT_ATTN_KERNEL_MMA || o->kernel == DT_ATTN_KERNEL_MMA_LATEST) {
        *bm = DT_MMA_BM;
        *bn = DT_MMA_BN;
        return 1;
    }
    if (o->kernel == DT_ATTN_KERNEL_WGMMA || o->kernel == DT_ATTN_KERNEL_WGMMA_LATEST) {
        *bm = DT_WGMMA_BM;
        *bn = DT_WGMMA_BN;
        return 1;
    }
    return 0;
}

/* The per-visit cost F, in key tiles, with which a ring of K tiles and V
 * visits takes `ratio` times one call of Kc and Vc, if time goes as K + F
 * V: F = (ratio Kc - K) / (V - ratio Vc); NAN where V <= ratio Vc (no such
 * F). */
static double model_f_of(double ratio, int64_t tiles, int64_t visits, const p_row *x) {
    const double den = (double)visits - ratio * (double)x->single_visits;
    return den > 0 ? (ratio * (double)x->single_tiles - (double)tiles) / den : NAN;
}

static double model_f(double ratio, const p_row *x, int oi) {
    return model_f_of(ratio, x->tiles[oi], x->visits[oi], x);
}

/* One untimed run of w's ring (forward), then its outputs on the host as
 * floats: o [S][H][D] and lse [H][S] (the rows 0 to S of every head). */
static dt_status ring_outputs(const bufs *b, const timed *w, float *o, float *lse) {
    const int64_t S = (int64_t)w->P * w->c, n = S * b->H * b->D;
    const size_t es = dt_dtype_size(b->dtype);
    void *host = malloc((size_t)n * es);
    float *all = malloc((size_t)(b->H * b->rows) * sizeof *all);
    dt_status st = host && all ? DT_SUCCESS
                               : dt_error(DT_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    if (st == DT_SUCCESS) st = run_timed(b, w);
    if (st == DT_SUCCESS) st = b->be->ops->sync(b->be);
    if (st == DT_SUCCESS) st = b->be->ops->download(b->be, host, b->o, (size_t)n * es);
    if (st == DT_SUCCESS)
        st = b->be->ops->download(b->be, all, b->lse_out, (size_t)(b->H * b->rows) * sizeof *all);
    if (st == DT_SUCCESS) {
        for (int64_t i = 0; i < n; i++) o[i] = dt_value_get(host, b->dtype, (size_t)i);
        for (int64_t h = 0; h < b->H; h++)
            memcpy(lse + h * S, all + h * b->rows, (size_t)S * sizeof *lse);
    }
    free(host);
    free(all);
    return st;
}

/* The largest difference of got from ref, over ref's largest magnitude
 * (o), or each over 1 + |ref| (lse); infinite where one is finite and the
 * other not, or they are infinities of different signs. */
static double max_err(const float *got, const float *ref, int64_t n, int relative_each) {
    double scale = 0, err = 0;
    for (int64_t i = 0; i < n && !relative_each; i++)
        scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) {
            if (got[i] != ref[i]) return INFINITY;
            continue;
        }
        double d = fabs((double)got[i] - ref[i]) / (relative_each ? 1 + fabs(ref[i]) : 1);
        err = d > err ? d : err;
    }
    return relative_each ? err : err / (scale > 0 ? scale : 1);
}

/* --group, for each order: for G = 1 (the ring as run_ring runs
 * it) and each G of the list, the blocks launched and the tile model's K
 * and V; for each G >= 2 its time back to back and its outputs against
 * the ring's (the same sums in another order: within 1e-5 in fp32, 2e-2
 * in bf16 and fp16 for o, as the attention tests allow, 1e-4 for lse,
 * whose sums are fp32 in every dtype). A difference past that fails the
 * bench (a wrong block would time something else). */
static dt_status measure_groups(const bufs *b, const opts *o, int64_t c, p_row *out) {
    const int P = o->ranks;
    const int64_t S = (int64_t)P * c, n = S * b->H * b->D;
    const double o_tol = b->dtype == DT_F32 ? 1e-5 : 2e-2, lse_tol = 1e-4;
    float *ref_o = malloc((size_t)n * sizeof *ref_o), *got_o = malloc((size_t)n * sizeof *got_o);
    float *ref_lse = malloc((size_t)(S * b->H) * sizeof *ref_lse);
    float *got_lse = malloc((size_t)(S * b->H) * sizeof *got_lse);
    dt_status st = ref_o && got_o && ref_lse && got_lse
                       ? DT_SUCCESS
                       : dt_error(DT_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    out->n_groups = 0;
    for (int oi = 0; st == DT_SUCCESS && oi < 3; oi++) {
        timed w = {.ring = 1, .order = orders[oi], .P = P, .c = c};
        st = ring_outputs(b, &w, ref_o, ref_lse);
        int ng = 0;
        for (int i = -1; st == DT_SUCCESS && i < o->n_group; i++) {
            const int G = i < 0 ? 1 : (int)o->group[i];
            if (i >= 0 && G < 2) continue;   /* G = 1 is the ring itself, row 0 */
            struct p_group *e = &out->groups[oi][ng++];
            memset(e, 0, sizeof *e);
            e->G = G;
            e->group = dt_attn_ring_group(orders[oi], DT_ATTN_CAUSAL, P, G);
            group_plan gp;
            st = group_plan_make(b, orders[oi], P, c, G, &gp);
            for (int l = 0; st == DT_SUCCESS && l < gp.n; l++) {
                const group_launch *gl = &gp.l[l];
                /* a block with no pair that neither starts nor finishes
                 * the rows launches nothing (attention/cuda/block.cu), as in the ring */
                e->launches +=
                    gl->first || gl->last || !dt_attn_no_pairs(DT_ATTN_CAUSAL, gl->qs, gl->ks);
                if (out->model) {
                    int64_t v = 0;
                    e->tiles +=
                        dt_attn_tiles(dt_attn_rule_of(DT_ATTN_CAUSAL), gl->qs, gl->ks, out->bm, out->bn, &v);
                    e->visits += v;
                }
            }
            if (st == DT_SUCCESS && G == 1) {   /* the order's own row */
                e->b2b_s = out->b2b_s[oi];
                e->tl = out->ring_tl[oi];
            } else if (st == DT_SUCCESS) {
                w.plan = &gp;
                st = time_runs(b, o, &w, &e->b2b_s);
                if (st == DT_SUCCESS && o->trace) st = timeline_run(b, &w, &e->tl);
                if (st == DT_SUCCESS) st = ring_outputs(b, &w, got_o, got_lse);
                w.plan = NULL;
            }
            group_plan_free(b, &gp);
            if (st != DT_SUCCESS || G == 1) continue;
            e->o_err = max_err(got_o, ref_o, n, 0);
            e->lse_err = max_err(got_lse, ref_lse, S * b->H, 1);
            if (!(e->o_err <= o_tol && e->lse_err <= lse_tol))
                st = dt_error(DT_ERR_INTERNAL, "bench: the %s ring with its steps grouped %d to a "
                              "launch differs from the ring: o by %.3g (limit %.0e), lse by %.3g "
                              "(limit %.0e)", dt_order_name(orders[oi]), G, e->o_err, o_tol,
                              e->lse_err, lse_tol);
        }
        out->n_groups = ng;
    }
    free(ref_o);
    free(got_o);
    free(ref_lse);
    free(got_lse);
    return st;
}

static dt_status measure_p(const bufs *b, const opts *o, int bwd, int64_t c, p_row *out) {
    int P = o->ranks;
    int64_t S = (int64_t)P * c;
    memset(out, 0, sizeof *out);
    out->traced = o->trace;
    out->model = !bwd && fwd_tile_of(o, &out->bm, &out->bn);
    for (int oi = 0; oi < 3; oi++) {
        for (int t = 0; t < P; t++) {
            double slowest = 0;
            for (int j = 0; j < P; j++) {
                const int src = (j - t + P) % P;
                const dt_attn_segment qs = dt_attn_segment_of(orders[oi], S, P, j);
                const dt_attn_segment ks = dt_attn_segment_of(orders[oi], S, P, src);
                const int last = t == dt_attn_ring_last_step(orders[oi], DT_ATTN_CAUSAL, S, P, j);
                const bufs rb = bufs_at(b, j * c, src * c);
                if (out->model) {
                    int64_t v = 0;
                    out->tiles[oi] += dt_attn_tiles(dt_attn_rule_of(DT_ATTN_CAUSAL), qs, ks, out->bm, out->bn, &v);
                    out->visits[oi] += v;
                }
                if (bwd && bwd_idle(t, qs, ks)) continue;
                double s;
                DT_TRY(time_block(&rb, o, bwd, DT_ATTN_CAUSAL, qs, ks, t == 0, last, t + 1 < P,
                                  &s));
                if (o->trace)
                    DT_TRY(trace_run(&rb, bwd, DT_ATTN_CAUSAL, qs, ks, t == 0, last, t + 1 < P,
                                     &out->ring[oi]));
                slowest = s > slowest ? s : slowest;
                out->total_s[oi] += s;
            }
            out->crit_s[oi] += slowest;
        }
        timed w = {.bwd = bwd, .ring = 1, .order = orders[oi], .P = P, .c = c};
        DT_TRY(time_runs(b, o, &w, &out->b2b_s[oi]));
        if (o->trace) DT_TRY(timeline_run(b, &w, &out->ring_tl[oi]));
        out->b2b_serial_s[oi] = NAN;
        if (b->events && b->tuning.dependent_launch) {   /* CUDA: the same without them */
            bufs serial = *b;
            serial.tuning.dependent_launch = 0;
            DT_TRY(time_runs(&serial, o, &w, &out->b2b_serial_s[oi]));
        }
    }
    if (!bwd && o->n_group > 0) DT_TRY(measure_groups(b, o, c, out));
    dt_attn_segment whole = {0, 1, S, 0, 0}, one = {0, 1, c, 0, 0};
    if (out->model)
        out->single_tiles = dt_attn_tiles(dt_attn_rule_of(DT_ATTN_CAUSAL), whole, whole, out->bm, out->bn,
                                          &out->single_visits);
    DT_TRY(time_block(b, o, bwd, DT_ATTN_CAUSAL, whole, whole, 1, 1, 0, &out->single_s));
    if (o->trace) DT_TRY(trace_run(b, bwd, DT_ATTN_CAUSAL, whole, whole, 1, 1, 0, &out->single));
    /* r for the ceiling in the launch the ring's blocks before its last
     * step take (beside a transfer: on CUDA a CTA per query tile, where
     * (r) times the persistent launch) */
    double full_s, causal_s;
    DT_TRY(time_block(b, o, bwd, DT_ATTN_FULL, one, one, 0, 0, 1, &full_s));
    DT_TRY(time_block(b, o, bwd, DT_ATTN_CAUSAL, one, one, 0, 0, 1, &causal_s));
    out->r = causal_s / full_s;
    return DT_SUCCESS;
}

/* ------------------------------------------------------------------ the run */

/* Every measured row, kept for --json (printed after the last one). */
typedef struct results {
    int n_r[2], n_p[2];            /* [pass] */
    r_row r[2][MAX_LIST];
    p_row p[2][MAX_LIST];
} results;

typedef struct run {
    const opts *o;
    dt_backend_kind backend;
    results res;
} run;

static double tflops(const bufs *b, int bwd, int64_t c, int causal, double s) {
    double f = 4.0 * (double)b->H * (double)c * (double)c * (double)b->D * (bwd ? 2.5 : 1.0);
    return (causal ? f / 2 : f) / s / 1e12;
}

/* (r + P - 1) / (P r): the striped / contiguous ratio causal efficiency r allows. */
static double ceiling_of(const opts *o, double r) {
    return (r + o->ranks - 1) / (o->ranks * r);
}

/* The L2 size the CUDA kernels order their CTAs for; -1 off CUDA. */
static long long l2_of(const bufs *b) {
#ifdef DT_HAVE_CUDA
    if (dt_backend_is_cuda(b->be)) return (long long)dt_backend_cuda_l2_bytes(b->be);
#endif
    (void)b;
    return -1;
}

/* ------------------------------------------------------------- text output */

static void text_header(const run *r, const bufs *b) {
    const opts *o = r->o;
    printf("bench/blocks  backend %s, kernels %s (DT_ATTN_KERNEL %s)  H=%lld HKV=%lld D=%lld %s  "
           "P=%d  %d iterations after 1 warm-up, median\n", dt_backend_kind_name(r->backend),
           b->kern->name, dt_attn_kernel_choice_name(o->kernel), (long long)o->heads, (long long)o->kv_heads, (long long)o->dim,
           dt_dtype_name(o->dtype), o->ranks, o->iters);
    if (l2_of(b) >= 0)
        printf("CTA launch order for an L2 of %lld bytes; wgmma forward %s%s, %s\n", l2_of(b),
               (const char *[]){"a CTA per query tile", "persistent (a CTA per query tile "
                                "beside a ring transfer)", "persistent"}[o->persistent],
               o->producer ? ", producer warpgroup" : ", loads by thread 0",
               (const char *[]){"no dependent launches", "dependent launches",
                                "dependent launches with the rows' waits"}[o->dependent]);
    if (o->own) printf("(r): forward blocks that start and finish their rows (--rows own)\n");
}

static void text_r_title(const char *pass) {
    printf("\n(r) causal efficiency, pass %s: time of a masked c x c block / a full one\n"
           "    %7s %10s %10s %8s | %10s %7s | %10s %7s | TFLOPS full, causal\n", pass,
           "c", "full ms", "causal ms", "r", "striped<= ms", "r", "striped< ms", "r");
}

static void text_r_row(const bufs *b, int bwd, const r_row *x) {
    printf("    %7lld %10.3f %10.3f %8.3f | %10.3f %7.3f | %10.3f %7.3f | %.2f, %.2f\n",
           (long long)x->c, 1e3 * x->full_s, 1e3 * x->causal_s, x->causal_s / x->full_s,
           1e3 * x->incl_s, x->incl_s / x->full_s, 1e3 * x->excl_s, x->excl_s / x->full_s,
           tflops(b, bwd, x->c, 0, x->full_s), tflops(b, bwd, x->c, 1, x->causal_s));
}

/* --trace: one line per block of each (r) row. */
static void text_trace(const r_row *rows, int n, const char *pass) {
    int any = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < R_BLOCKS; k++) any |= rows[i].trace[k].ctas > 0;
    if (!any) {
        printf("\n(t) pass %s: no CTA records (only the CUDA tensor-core kernels, mma and "
               "wgmma, keep them)\n", pass);
        return;
    }
    printf("\n(t) CTA timeline of one more run of each (r) block, pass %s: fill = the SMs' busy "
           "time /\n    (SMs x span), drain = last CTA start to the end; a CTA's cycles = "
           "cyc/tile x tiles + fixed (least squares);\n    the fixed cost split by the forward "
           "kernels' marks (nan: none): start = to the first\n    key tile landed, loop = the "
           "main loop's own fixed cycles (on its own line), end = after\n    the last key tile "
           "(the rows' merge and write-back)\n"
           "    %7s %-10s %6s %4s %5s %9s %6s %9s %7s %9s %9s %7s %5s %7s %7s %7s\n", pass, "c",
           "block", "CTAs", "SMs", "slots", "span us", "fill", "drain us", "tiles", "cyc/tile",
           "fixed cyc", "fixed/t", "GHz", "start", "loop", "end");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < R_BLOCKS; k++) {
            const dt_attn_trace_stats *t = &rows[i].trace[k];
            printf("    %7lld %-10s %6lld %4lld %5lld %9.1f %6.3f %9.1f %7lld %9.0f %9.0f %7.2f "
                   "%5.2f %7.0f %7.0f %7.0f\n", (long long)rows[i].c, r_block_names[k],
                   (long long)t->ctas, (long long)t->sms, (long long)t->slots, t->span_us,
                   t->fill, t->drain_us, (long long)t->work, t->cycles_per_tile,
                   t->overhead_cycles, t->overhead_cycles / t->cycles_per_tile, t->ghz,
                   t->start_cycles, t->loop_fixed_cycles, t->end_cycles);
        }
}

static void text_p_title(const opts *o, const char *pass) {
    printf("\n(p) the ring on one device, pass %s: P = %d, every (rank, step) block alone;\n"
           "    b2b: all of them back to back, timed as one (serial: no dependent launches)\n"
           "    %7s %-11s %10s %10s %9s %9s %9s %10s %10s %10s %10s\n", pass, o->ranks, "c",
           "order", "crit ms", "total ms", "ratio", "ceiling", "achieved", "vs 1 call", "b2b ms",
           "b2b/call", "serial/call");
}

static void text_p_rows(const opts *o, int64_t c, const p_row *x) {
    double ceiling = ceiling_of(o, x->r);
    for (int oi = 0; oi < 3; oi++) {
        double ratio = x->crit_s[0] / x->crit_s[oi];
        char serial[16] = "-";   /* not measured: no dependent launches here */
        if (!isnan(x->b2b_serial_s[oi]))
            snprintf(serial, sizeof serial, "%.3f", x->b2b_serial_s[oi] / x->single_s);
        printf("    %7lld %-11s %10.3f %10.3f %9.3f %9.3f %9.3f %10.3f %10.3f %10.3f %10s\n",
               (long long)c, dt_order_name(orders[oi]), 1e3 * x->crit_s[oi],
               1e3 * x->total_s[oi], ratio, ceiling, ratio / ceiling,
               x->total_s[oi] / x->single_s, 1e3 * x->b2b_s[oi], x->b2b_s[oi] / x->single_s,
               serial);
    }
    printf("    (r = %.3f at c = %lld; one causal call on S = %lld: %.3f ms)\n", x->r,
           (long long)c, (long long)(c * o->ranks), 1e3 * x->single_s);
    if (x->model) {
        printf("    (m) tile model, %lld x %lld tiles: per (batch, head) K key tiles and V query\n"
               "        tiles' visits of the blocks (one call: of its one block); if time goes\n"
               "        as K + F V, F = a visit's cost beyond its key tiles (its start and end),\n"
               "        in key tiles, that b2b/call implies (busy: that busy ring / busy call\n"
               "        implies, --trace); F for 1.05 = the largest F with b2b/call <= 1.05\n"
               "        (below 0: none)\n"
               "        %-11s %10s %8s %10s %10s %10s\n", (long long)x->bm, (long long)x->bn,
               "order", "K", "V", "F b2b", "F busy", "F for 1.05");
        for (int oi = 0; oi <= 3; oi++) {
            char busy[16] = "-";
            if (oi < 3 && x->traced && x->single.ctas > 0)
                snprintf(busy, sizeof busy, "%.2f",
                         model_f(x->ring_tl[oi].busy_us / x->single.last_timeline.busy_us, x, oi));
            if (oi < 3)
                printf("        %-11s %10lld %8lld %10.2f %10s %10.2f\n", dt_order_name(orders[oi]),
                       (long long)x->tiles[oi], (long long)x->visits[oi],
                       model_f(x->b2b_s[oi] / x->single_s, x, oi), busy, model_f(1.05, x, oi));
            else
                printf("        %-11s %10lld %8lld\n", "one call", (long long)x->single_tiles,
                       (long long)x->single_visits);
        }
    }
    if (x->n_groups > 0) {
        printf("    (g) a rank's steps grouped as dt_attention_options.group = G groups them\n"
               "        (taken: the group the order takes; their keys one segment, each query\n"
               "        tile's rows merged once a launch); G = 1 is the ring above; err: the\n"
               "        outputs' largest difference from the ring's; --trace: F busy as (m)'s,\n"
               "        and wall / busy of its b2b timeline\n"
               "        %-11s %4s %5s %8s %10s %8s %10s %10s %10s %10s %10s %10s %10s\n", "order",
               "G", "taken", "launches", "K", "V", "b2b ms", "b2b/call", "F b2b", "F busy",
               "wall/busy", "o err", "lse err");
        for (int oi = 0; oi < 3; oi++)
            for (int i = 0; i < x->n_groups; i++) {
                const struct p_group *e = &x->groups[oi][i];
                const int traced = x->traced && x->single.ctas > 0 && e->tl.busy_us > 0;
                char k[24] = "-", v[24] = "-", f[24] = "-", fb[24] = "-", wb[24] = "-";
                if (x->model) {
                    snprintf(k, sizeof k, "%lld", (long long)e->tiles);
                    snprintf(v, sizeof v, "%lld", (long long)e->visits);
                    snprintf(f, sizeof f, "%.2f",
                             model_f_of(e->b2b_s / x->single_s, e->tiles, e->visits, x));
                }
                if (x->model && traced)
                    snprintf(fb, sizeof fb, "%.2f",
                             model_f_of(e->tl.busy_us / x->single.last_timeline.busy_us,
                                        e->tiles, e->visits, x));
                if (traced) snprintf(wb, sizeof wb, "%.3f", e->tl.wall_us / e->tl.busy_us);
                printf("        %-11s %4d %5d %8d %10s %8s %10.3f %10.3f %10s %10s %10s %10.2e "
                       "%10.2e\n", dt_order_name(orders[oi]), e->G, e->group, e->launches, k, v,
                       1e3 * e->b2b_s, e->b2b_s / x->single_s, f, fb, wb, e->o_err, e->lse_err);
            }
    }
    if (!x->traced) return;
    if (x->single.ctas == 0) {
        printf("    (t) no CTA records (only the CUDA tensor-core kernels, mma and wgmma, keep "
               "them)\n");
        return;
    }
    printf("    (t) traced once more (--trace): every launch of the order's blocks, its span,\n"
           "        drain and packed time (the SMs' mean busy time) summed; fill = packed / span\n"
           "        %-11s %8s %10s %10s %10s %6s\n", "order", "launches", "span ms", "drain ms",
           "packed ms", "fill");
    for (int oi = 0; oi <= 3; oi++) {
        const launch_sum *t = oi < 3 ? &x->ring[oi] : &x->single;
        printf("        %-11s %8d %10.3f %10.3f %10.3f %6.3f\n",
               oi < 3 ? dt_order_name(orders[oi]) : "one call", t->launches, t->span_us / 1e3,
               t->drain_us / 1e3, t->packed_us / 1e3, t->packed_us / t->span_us);
    }
    printf("    (b) b2b traced once more: the launches back to back as one timeline; per SM\n"
           "        (mean) busy = running a record, idle before its first, between, after\n"
           "        its last; busy ring / busy call = the ring's extra work, wall / busy its\n"
           "        idle\n"
           "        %-11s %10s %10s %6s %10s %10s %10s\n", "order", "wall ms", "busy ms", "idle",
           "start ms", "between ms", "end ms");
    for (int oi = 0; oi <= 3; oi++) {
        const dt_attn_trace_timeline *t = oi < 3 ? &x->ring_tl[oi] : &x->single.last_timeline;
        printf("        %-11s %10.3f %10.3f %6.3f %10.3f %10.3f %10.3f\n",
               oi < 3 ? dt_order_name(orders[oi]) : "one call", t->wall_us / 1e3,
               t->busy_us / 1e3, 1 - t->busy_us / t->wall_us, t->idle_start_us / 1e3,
               t->idle_between_us / 1e3, t->idle_end_us / 1e3);
    }
}

/* ------------------------------------------------------------- JSON output */

/* A list of names as a JSON array: ["fwd", "bwd"]. */
static void json_names(const char *key, const int *on, const char *const *names, int n) {
    printf("\"%s\": [", key);
    for (int i = 0, first = 1; i < n; i++)
        if (on[i]) {
            printf("%s\"%s\"", first ? "" : ", ", names[i]);
            first = 0;
        }
    printf("]");
}

static void json_list(const char *key, const int64_t *v, int n) {
    printf("\"%s\": [", key);
    for (int i = 0; i < n; i++) printf("%s%lld", i ? ", " : "", (long long)v[i]);
    printf("]");
}

/* ", KEY: V", V null when it is not finite (a block too small for the
 * clock can time as 0, and a ratio over it is inf or nan, which JSON lacks). */
static void json_num(const char *key, double v) {
    if (isfinite(v))
        printf(", \"%s\": %.6f", key, v);
    else
        printf(", \"%s\": null", key);
}

/* --trace: ", "trace": {"full": {...}, ...}" with cta_trace.h's fields. */
static void json_trace(const r_row *x) {
    printf(", \"trace\": {");
    for (int k = 0; k < R_BLOCKS; k++) {
        const dt_attn_trace_stats *t = &x->trace[k];
        printf("%s\"%s\": {\"ctas\": %lld, \"sms\": %lld, \"slots\": %lld, \"tiles\": %lld",
               k ? ", " : "", r_block_names[k], (long long)t->ctas, (long long)t->sms,
               (long long)t->slots, (long long)t->work);
        json_num("span_us", t->span_us);
        json_num("fill", t->fill);
        json_num("drain_us", t->drain_us);
        json_num("cycles_per_tile", t->cycles_per_tile);
        json_num("fixed_cycles", t->overhead_cycles);
        json_num("fixed_tiles", t->overhead_cycles / t->cycles_per_tile);
        json_num("ghz", t->ghz);
        printf(", \"marked\": %lld", (long long)t->marked);
        json_num("start_cycles", t->start_cycles);
        json_num("loop_cycles_per_tile", t->loop_cycles_per_tile);
        json_num("loop_fixed_cycles", t->loop_fixed_cycles);
        json_num("end_cycles", t->end_cycles);
        printf("}");
    }
    printf("}");
}

/* --trace in (p): ", KEY: {"launches": .., "span_ms": .., ...}". */
static void json_launches(const char *key, const launch_sum *t) {
    printf(", \"%s\": {\"launches\": %d, \"ctas\": %lld", key, t->launches,
           (long long)t->ctas);
    json_num("span_ms", t->span_us / 1e3);
    json_num("drain_ms", t->drain_us / 1e3);
    json_num("packed_ms", t->packed_us / 1e3);
    json_num("fill", t->packed_us / t->span_us);
    printf("}");
}

/* --trace in (p): ", KEY: {"records": .., "wall_ms": .., ...}" (cta_trace.h's
 * timeline). */
static void json_timeline(const char *key, const dt_attn_trace_timeline *t) {
    printf(", \"%s\": {\"records\": %lld, \"sms\": %lld", key, (long long)t->records,
           (long long)t->sms);
    json_num("wall_ms", t->wall_us / 1e3);
    json_num("busy_ms", t->busy_us / 1e3);
    json_num("idle", 1 - t->busy_us / t->wall_us);
    json_num("idle_start_ms", t->idle_start_us / 1e3);
    json_num("idle_between_ms", t->idle_between_us / 1e3);
    json_num("idle_end_ms", t->idle_end_us / 1e3);
    printf("}");
}

/* The configuration, then the rows of (r) and (p) of every pass; the
 * names are the text columns' (r after each striped ms is its own). */
static void json_print(const run *r, const bufs *b) {
    static const char *const pass_names[] = {"fwd", "bwd"}, *const section_names[] = {"r", "p"};
    const opts *o = r->o;
    const results *res = &r->res;
    printf("{\n  \"bench\": \"blocks\", \"backend\": \"%s\", \"kernels\": \"%s\", \"kernel\": \"%s\", "
           "\"H\": %lld, \"HKV\": %lld, \"D\": %lld, \"dtype\": \"%s\", \"P\": %d, \"iters\": %d, "
           "\"warmup\": 1, \"quick\": %s, \"trace\": %s,\n  ", dt_backend_kind_name(r->backend),
           b->kern->name, dt_attn_kernel_choice_name(o->kernel), (long long)o->heads,
           (long long)o->kv_heads, (long long)o->dim, dt_dtype_name(o->dtype), o->ranks, o->iters,
           o->quick ? "true" : "false", o->trace ? "true" : "false");
    json_names("passes", o->passes, pass_names, 2);
    printf(", ");
    json_names("sections", o->sections, section_names, 2);
    printf(", ");
    json_list("c", o->c, o->sections[0] ? o->n_c : 0);
    printf(", ");
    json_list("ring_c", o->ring_c, o->sections[1] ? o->n_ring_c : 0);
    printf(", ");
    json_list("group", o->group, o->n_group);
    if (l2_of(b) >= 0)   /* CUDA */
        printf(", \"l2_bytes\": %lld, \"persistent\": %d, \"dependent\": %s, \"rows_waits\": %s, "
               "\"producer\": %d", l2_of(b), o->persistent,
               o->dependent ? "true" : "false", o->dependent == 2 ? "true" : "false", o->producer);
    printf(", \"rows\": \"%s\"", o->own ? "own" : "merge");
    printf(",\n  \"timing\": \"%s; median\",\n  \"r\": [",
           r->backend == DT_BACKEND_CUDA ? "CUDA events around each block's kernels"
                                         : "CLOCK_MONOTONIC around each block");
    int first = 1;
    for (int bwd = 0; bwd < 2; bwd++)
        for (int i = 0; i < res->n_r[bwd]; i++, first = 0) {
            const r_row *x = &res->r[bwd][i];
            printf("%s\n    {\"pass\": \"%s\", \"c\": %lld", first ? "" : ",", pass_names[bwd],
                   (long long)x->c);
            json_num("full_ms", 1e3 * x->full_s);
            json_num("causal_ms", 1e3 * x->causal_s);
            json_num("r", x->causal_s / x->full_s);
            json_num("striped_le_ms", 1e3 * x->incl_s);
            json_num("striped_le_r", x->incl_s / x->full_s);
            json_num("striped_lt_ms", 1e3 * x->excl_s);
            json_num("striped_lt_r", x->excl_s / x->full_s);
            json_num("tflops_full", tflops(b, bwd, x->c, 0, x->full_s));
            json_num("tflops_causal", tflops(b, bwd, x->c, 1, x->causal_s));
            if (x->traced) json_trace(x);
            printf("}");
        }
    printf("%s],\n  \"p\": [", first ? "" : "\n  ");
    first = 1;
    for (int bwd = 0; bwd < 2; bwd++)
        for (int i = 0; i < res->n_p[bwd]; i++) {
            const p_row *x = &res->p[bwd][i];
            double ceiling = ceiling_of(o, x->r);
            for (int oi = 0; oi < 3; oi++, first = 0) {
                double ratio = x->crit_s[0] / x->crit_s[oi];
                printf("%s\n    {\"pass\": \"%s\", \"c\": %lld, \"order\": \"%s\", \"S\": %lld",
                       first ? "" : ",", pass_names[bwd], (long long)o->ring_c[i],
                       dt_order_name(orders[oi]), (long long)(o->ring_c[i] * o->ranks));
                json_num("crit_ms", 1e3 * x->crit_s[oi]);
                json_num("total_ms", 1e3 * x->total_s[oi]);
                json_num("ratio", ratio);
                json_num("ceiling", ceiling);
                json_num("achieved", ratio / ceiling);
                json_num("vs_1_call", x->total_s[oi] / x->single_s);
                json_num("b2b_ms", 1e3 * x->b2b_s[oi]);
                json_num("b2b_vs_1_call", x->b2b_s[oi] / x->single_s);
                json_num("b2b_serial_ms", 1e3 * x->b2b_serial_s[oi]);
                json_num("b2b_serial_vs_1_call", x->b2b_serial_s[oi] / x->single_s);
                json_num("r", x->r);
                json_num("single_ms", 1e3 * x->single_s);
                if (x->model) {
                    printf(", \"model\": {\"bm\": %lld, \"bn\": %lld, \"tiles\": %lld, "
                           "\"visits\": %lld, \"single_tiles\": %lld, \"single_visits\": %lld",
                           (long long)x->bm, (long long)x->bn, (long long)x->tiles[oi],
                           (long long)x->visits[oi], (long long)x->single_tiles,
                           (long long)x->single_visits);
                    json_num("f_b2b", model_f(x->b2b_s[oi] / x->single_s, x, oi));
                    if (x->traced && x->single.ctas > 0)
                        json_num("f_busy", model_f(x->ring_tl[oi].busy_us /
                                                   x->single.last_timeline.busy_us, x, oi));
                    json_num("f_for_1_05", model_f(1.05, x, oi));
                    printf("}");
                }
                if (x->n_groups > 0) {   /* --group */
                    printf(", \"groups\": [");
                    for (int g = 0; g < x->n_groups; g++) {
                        const struct p_group *e = &x->groups[oi][g];
                        printf("%s{\"G\": %d, \"group\": %d, \"launches\": %d", g ? ", " : "",
                               e->G, e->group, e->launches);
                        json_num("b2b_ms", 1e3 * e->b2b_s);
                        json_num("b2b_vs_1_call", e->b2b_s / x->single_s);
                        const int traced =
                            x->traced && x->single.ctas > 0 && e->tl.busy_us > 0;
                        if (x->model) {
                            printf(", \"tiles\": %lld, \"visits\": %lld", (long long)e->tiles,
                                   (long long)e->visits);
                            json_num("f_b2b", model_f_of(e->b2b_s / x->single_s, e->tiles,
                                                         e->visits, x));
                            if (traced)
                                json_num("f_busy",
                                         model_f_of(e->tl.busy_us /
                                                        x->single.last_timeline.busy_us,
                                                    e->tiles, e->visits, x));
                        }
                        json_num("o_err", e->o_err);
                        json_num("lse_err", e->lse_err);
                        if (x->traced) json_timeline("b2b_timeline", &e->tl);
                        printf("}");
                    }
                    printf("]");
                }
                if (x->traced) {
                    json_launches("trace", &x->ring[oi]);
                    json_launches("single_trace", &x->single);
                    json_timeline("b2b_timeline", &x->ring_tl[oi]);
                    json_timeline("single_timeline", &x->single.last_timeline);
                }
                printf("}");
            }
        }
    printf("%s],\n  \"complete\": true\n}\n", first ? "" : "\n  ");
}

/* ------------------------------------------------------------------ rank 0 */

static dt_status rank_main(dt_context *ctx, void *arg) {
    run *r = arg;
    const opts *o = r->o;
    results *res = &r->res;
    r->backend = dt_context_backend(ctx);
    int64_t rows = 0;
    for (int i = 0; o->sections[0] && i < o->n_c; i++) rows = o->c[i] > rows ? o->c[i] : rows;
    for (int i = 0; o->sections[1] && i < o->n_ring_c; i++) {
        int64_t s = o->ring_c[i] * o->ranks;
        rows = s > rows ? s : rows;
    }
    bufs b;
    dt_status st = bufs_make(ctx, o, rows, &b);
    if (st != DT_SUCCESS) goto out;
#ifdef DT_HAVE_CUDA
    if (o->l2 >= 0) dt_backend_cuda_set_l2_bytes(b.be, o->l2);   /* no-op off CUDA */
#endif
    if (!o->json) text_header(r, &b);
    for (int bwd = 0; bwd < 2; bwd++) {
        if (!o->passes[bwd]) continue;
        const char *pass = bwd ? "bwd" : "fwd";
        if (o->sections[0]) {
            if (!o->json) text_r_title(pass);
            for (int i = 0; i < o->n_c; i++) {
                r_row *x = &res->r[bwd][res->n_r[bwd]];
                DT_TRY_GOTO(st, measure_r(&b, o, bwd, o->c[i], x), out);
                res->n_r[bwd]++;
                if (!o->json) text_r_row(&b, bwd, x);
                fflush(stdout);
            }
            if (o->trace && !o->json) text_trace(res->r[bwd], res->n_r[bwd], pass);
        }
        if (o->sections[1]) {
            if (!o->json) text_p_title(o, pass);
            for (int i = 0; i < o->n_ring_c; i++) {
                p_row *x = &res->p[bwd][res->n_p[bwd]];
                DT_TRY_GOTO(st, measure_p(&b, o, bwd, o->ring_c[i], x), out);
                res->n_p[bwd]++;
                if (!o->json) text_p_rows(o, o->ring_c[i], x);
                fflush(stdout);
            }
        }
    }
    if (o->json) json_print(r, &b);
out:
    if (b.be) bufs_free(&b);
    return st;
}

/* ------------------------------------------------------------------ flags */

static void usage(FILE *f) {
    fprintf(f,
            "usage: " NAME " [flags]\n"
            "  --backend K       auto | cpu | cuda (default auto)\n"
            "  --quick           small sizes and (unless --iters) 2 iterations: a smoke test\n"
            "  --iters N         repetitions after one warm-up, median (default 5)\n"
            "  --pass LIST       fwd, bwd or fwd,bwd (default fwd,bwd)\n"
            "  --section LIST    r, p or r,p (default r,p)\n"
            "  --c LIST          (r) block sizes, e.g. 1024,2048 (GPU default 1024..16384)\n"
            "  --ring-c LIST     (p) tokens per rank (GPU default 4096,8192)\n"
            "  --ranks P         ranks of (p) and the stride of (r)'s striped blocks (default 8)\n"
            "  --heads H --kv-heads G --dim D   (GPU default 32, 32, 128; CPU 2, 2, 64)\n"
            "  --dtype T         fp32 | bf16 | fp16 (GPU default bf16; CPU fp32)\n"
            "  --kernel K        CUDA block kernel: auto | simple | mma | wgmma | simple-latest |\n"
            "                    mma-latest | wgmma-latest (default: the DT_ATTN_KERNEL environment\n"
            "                    variable, else auto); the backward of auto is wgmma's where\n"
            "                    it runs\n"
            "  --l2 BYTES        CUDA: the L2 size the tensor-core kernels order their CTAs\n"
            "                    for (attention/cuda/mma_layout.h; default the device's; 0: one\n"
            "                    head after another)\n"
            "  --persistent 0|1|2  CUDA: whether the wgmma forward runs persistent, as many\n"
            "                    CTAs as the SMs hold taking query tiles from a queue:\n"
            "                    1 (default) but for (p)'s blocks with the ring's next K, V\n"
            "                    in flight beside them (every step's but the last), 2 there\n"
            "                    too, 0 never (a CTA per query tile)\n"
            "  --dependent 0|1|2 CUDA: whether the tensor-core kernels' blocks after a\n"
            "                    call's first are launched as programmatic dependents of\n"
            "                    the block before (compute capability 9.0; default 1;\n"
            "                    (p)'s b2b is then also timed with 0); 2: the forward's\n"
            "                    with the rows' waits (a block waits for the counts of\n"
            "                    its rows, not for the block before: (p)'s b2b ring)\n"
            "  --producer 0|1    CUDA: whether the wgmma forward at D = 128 issues its loads\n"
            "                    from a producer warpgroup of its own (default 1; 0: from\n"
            "                    thread 0 between its warpgroup's products)\n"
            "  --rows merge|own  (r)'s forward blocks: merge (default) as a ring's middle\n"
            "                    step, merging into the rows' stored state; own as a\n"
            "                    call's only block, which starts and finishes its rows\n"
            "                    (reads no state, writes o and lse)\n"
            "  --group LIST      (p), forward: each order's ring once more with a rank's\n"
            "                    steps grouped as dt_attention_options.group = G groups\n"
            "                    them, for each G of the list (2 to P - 1; striped takes\n"
            "                    a power of two), timed back to back and checked\n"
            "                    against the ring's outputs\n"
            "  --trace           one more run of each block with its CTAs recording\n"
            "                    their start, end, SM and tiles (CUDA mma and wgmma\n"
            "                    kernels): (r) the launch's idle SM time, its drain, a\n"
            "                    CTA's cycles per tile and fixed cost; (p) the ring's\n"
            "                    launches summed: span, drain, packed time; and the\n"
            "                    b2b ring as one timeline: busy, idle between launches\n"
            "  --json            one JSON object (the configuration and every row of (r)\n"
            "                    and (p)) instead of the tables\n");
}

static int parse_list(const char *flag, const char *v, int64_t *out, int *n) {
    long x[MAX_LIST];
    if (!ex_parse_ints(flag, v, 1, 1L << 20, MAX_LIST, x, n)) return 0;
    for (int i = 0; i < *n; i++) out[i] = x[i];
    return 1;
}

static int parse(int argc, char **argv, opts *o) {
    static const char *const pass_names[] = {"fwd", "bwd"};
    static const char *const section_names[] = {"r", "p"};
    static const char *const dtype_names[] = {"fp32", "bf16", "fp16"};
    static const char *const rows_names[] = {"merge", "own"};
    static const dt_dtype dtypes[] = {DT_F32, DT_BF16, DT_F16};
    const char *kernel_names[DT_ATTN_KERNEL_COUNT];
    for (int k = 0; k < DT_ATTN_KERNEL_COUNT; k++)
        kernel_names[k] = dt_attn_kernel_choice_name((dt_attn_kernel_choice)k);
    memset(o, 0, sizeof *o);
    const char *env = getenv("DT_ATTN_KERNEL");
    if (env && *env) {
        int k = ex_parse_choice("DT_ATTN_KERNEL", env, kernel_names, DT_ATTN_KERNEL_COUNT);
        if (k < 0) return 0;
        o->kernel = (dt_attn_kernel_choice)k;
    }
    o->iters = 5;
    o->ranks = 8;
    o->l2 = -1;
    o->persistent = 1;
    o->dependent = 1;
    o->producer = 1;
    o->passes[0] = o->passes[1] = o->sections[0] = o->sections[1] = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        int k;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--quick")) {
            o->quick = 1;
            continue;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        } else if (!strcmp(a, "--trace")) {
            o->trace = 1;
            continue;
        } else if (!strcmp(a, "--backend")) {
            if (!ex_parse_backend(a, v, &o->backend)) return 0;
        } else if (!strcmp(a, "--iters")) {
            if (!ex_parse_int(a, v, 1, MAX_ITERS, &x)) return 0;
            o->iters = (int)x;
            o->set_iters = 1;
        } else if (!strcmp(a, "--pass")) {
            if (!ex_parse_choices(a, v, pass_names, 2, o->passes)) return 0;
        } else if (!strcmp(a, "--section")) {
            if (!ex_parse_choices(a, v, section_names, 2, o->sections)) return 0;
        } else if (!strcmp(a, "--c")) {
            if (!parse_list(a, v, o->c, &o->n_c)) return 0;
            o->set_c = 1;
        } else if (!strcmp(a, "--group")) {
            if (!parse_list(a, v, o->group, &o->n_group)) return 0;
        } else if (!strcmp(a, "--ring-c")) {
            if (!parse_list(a, v, o->ring_c, &o->n_ring_c)) return 0;
            o->set_ring_c = 1;
        } else if (!strcmp(a, "--ranks")) {
            if (!ex_parse_int(a, v, 2, MAX_RANKS, &x)) return 0;
            o->ranks = (int)x;
        } else if (!strcmp(a, "--heads") || !strcmp(a, "--kv-heads") || !strcmp(a, "--dim")) {
            if (!ex_parse_int(a, v, 1, DT_ATTN_MAX_HEAD_DIM * 16, &x)) return 0;
            *(a[2] == 'h' ? &o->heads : a[2] == 'k' ? &o->kv_heads : &o->dim) = x;
        } else if (!strcmp(a, "--kernel")) {
            if ((k = ex_parse_choice(a, v, kernel_names, DT_ATTN_KERNEL_COUNT)) < 0) return 0;
            o->kernel = (dt_attn_kernel_choice)k;
        } else if (!strcmp(a, "--l2")) {
            if (!ex_parse_int(a, v, 0, 1L << 40, &x)) return 0;
            o->l2 = x;
        } else if (!strcmp(a, "--persistent")) {
            if (!ex_parse_int(a, v, 0, 2, &x)) return 0;
            o->persistent = (int)x;
        } else if (!strcmp(a, "--dependent")) {
            if (!ex_parse_int(a, v, 0, 2, &x)) return 0;
            o->dependent = (int)x;
        } else if (!strcmp(a, "--producer")) {
            if (!ex_parse_int(a, v, 0, 1, &x)) return 0;
            o->producer = (int)x;
        } else if (!strcmp(a, "--rows")) {
            if ((k = ex_parse_choice(a, v, rows_names, 2)) < 0) return 0;
            o->own = k;
        } else if (!strcmp(a, "--dtype")) {
            if ((k = ex_parse_choice(a, v, dtype_names, 3)) < 0) return 0;
            o->dtype = dtypes[k];
            o->set_dtype = 1;
        } else {
            fprintf(stderr, NAME ": unknown flag '%s' (--help lists them)\n", a);
            return 0;
        }
        i++; /* the flag's value */
    }
    return 1;
}

/* Defaults that depend on the backend: the shapes on a GPU, shapes
 * that finish in seconds on the CPU. */
static void defaults(opts *o, dt_backend_kind backend) {
    int gpu = backend == DT_BACKEND_CUDA && !o->quick;
    /* any of --heads, --kv-heads, --dim alone: the others as by default
     * (one of the head counts gives the other) */
    if (!o->heads && !o->kv_heads) o->heads = o->kv_heads = gpu ? 32 : 2;
    if (!o->kv_heads) o->kv_heads = o->heads;
    if (!o->heads) o->heads = o->kv_heads;
    if (!o->dim) o->dim = gpu ? 128 : 64;
    if (!o->set_dtype) o->dtype = backend == DT_BACKEND_CUDA ? DT_BF16 : DT_F32;
    static const int64_t gpu_c[] = {1024, 2048, 4096, 8192, 16384}, cpu_c[] = {256, 512, 1024};
    static const int64_t quick_c[] = {64, 128};
    const int64_t *c = o->quick ? quick_c : gpu ? gpu_c : cpu_c;
    int nc = o->quick ? 2 : gpu ? 5 : 3;
    if (!o->set_c) {
        memcpy(o->c, c, (size_t)nc * sizeof *c);
        o->n_c = nc;
    }
    if (!o->set_ring_c) {
        o->ring_c[0] = o->quick ? 32 : gpu ? 4096 : 256;
        o->ring_c[1] = 8192;
        o->n_ring_c = gpu ? 2 : 1;
    }
    if (o->quick && !o->set_iters) o->iters = 2;
}

static dt_status probe_rank(dt_context *ctx, void *arg) {
    *(dt_backend_kind *)arg = dt_context_backend(ctx);
    return DT_SUCCESS;
}

int main(int argc, char **argv) {
    opts o;
    if (!parse(argc, argv, &o)) return 2;
    dt_launch_options lo = DT_LAUNCH_OPTIONS_INIT;
    lo.backend = o.backend;
    dt_backend_kind kind = DT_BACKEND_AUTO;
    dt_status st = dt_launch(1, probe_rank, &kind, &lo);
    if (st == DT_SUCCESS) {
        defaults(&o, kind);
        int64_t odd = 0;
        for (int i = 0; i < o.n_ring_c && !odd; i++)
            if (o.ring_c[i] % 2) odd = o.ring_c[i];
        if (o.heads % o.kv_heads) {
            fprintf(stderr, NAME ": --kv-heads %lld does not divide --heads %lld\n",
                    (long long)o.kv_heads, (long long)o.heads);
            return 2;
        }
        if (o.dim % 8 || o.dim > DT_ATTN_MAX_HEAD_DIM) {
            fprintf(stderr, NAME ": --dim %lld: the attention kernels take head dims that are "
                    "multiples of 8 up to %d\n", (long long)o.dim, DT_ATTN_MAX_HEAD_DIM);
            return 2;
        }
        for (int i = 0; i < o.n_group; i++)
            if (o.group[i] > o.ranks - 1) {
                fprintf(stderr, NAME ": --group %lld: a group holds 1 to P - 1 = %d steps\n",
                        (long long)o.group[i], o.ranks - 1);
                return 2;
            }
        if (odd) {
            fprintf(stderr, NAME ": --ring-c %lld: the tokens per rank must be even (zigzag halves "
                    "each shard)\n", (long long)odd);
            return 2;
        }
        run r = {.o = &o, .backend = kind};
        st = dt_launch(1, rank_main, &r, &lo);
    }
    if (st != DT_SUCCESS) {
        fprintf(stderr, NAME ": %s: %s\n", dt_status_name(st), dt_last_error());
        return st == DT_ERR_NOT_SUPPORTED ? 3 : 1;
    }
    return dt_finalize() == DT_SUCCESS ? 0 : 1;
}
