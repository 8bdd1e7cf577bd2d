/* attention/attention.h — Ring, Striped and Zigzag attention over a
 * sequence-sharded DTensor.
 *
 * q is [B, S, H, D]; k and v are [B, S, H_kv, D] with H_kv dividing H
 * (GQA / MQA: query head h reads key/value head h / (H / H_kv)). All three
 * share one Layout on one mesh: S (dim 1) sharded over the sequence-parallel
 * mesh dim, whose order picks the algorithm
 *     contiguous -> Ring Attention, striped -> Striped Attention,
 *     zigzag     -> dual-chunk balancing,
 * and optionally heads (dim 2) sharded contiguous over tensor-parallel mesh
 * dims (H_kv divisible by their sizes) and batch (dim 0) over others; D is
 * never sharded and nothing is Partial. Local tensors (mesh NULL) run
 * single-device attention. The sequence sharded over two mesh dims is the
 * Ulysses x ring hybrid: opts.a2a_dim names the one whose shards move to
 * the heads (all-to-all); the ring runs over the other. The algorithm
 * follows from the Layouts and that one option.
 *
 * The mask is one rule on global token positions (mask.h): a query attends to
 * a key of its own document (opts.doc_lens; one per batch row by default)
 * iff pos(q) >= pos(k) (DT_ATTN_CAUSAL) or always (DT_ATTN_FULL), and, with
 * a window W (opts.window), |pos(q) - pos(k)| < W. Every order takes it:
 * tiles and whole ring steps the rule leaves empty run nothing.
 * K and V travel the ring packed in one buffer, with H_kv heads (never
 * expanded), the next block in flight while the current one is computed.
 *
 * dtypes: fp32, bf16 and fp16 (the 16-bit ones computed in fp32, on the
 * CUDA backend by tensor cores); head dims: multiples of 8 up to 256.
 * Anything else returns DT_ERR_NOT_SUPPORTED with the reason.
 *
 * Test: tests/test_attention.c, tests/test_attention_backward.c (make test).
 */
#ifndef DT_ATTENTION_H
#define DT_ATTENTION_H

#include <stddef.h>
#include "../dtensor/tensor.h"
#include "mask.h"
#include "tuning.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_ATTN_MAX_HEAD_DIM 256

/* Where one call spent this rank's time (opts.timing). CUDA: events on the
 * compute stream (device time); CPU: the rank thread's CPU time (its own work,
 * not time blocked on a peer). */
#define DT_ATTN_MAX_STEPS DT_MAX_WORLD_SIZE
typedef struct dt_attention_timing {
    int steps;                            /* P: entries filled below */
    double before_ms;                     /* call start to step 0's kernels (agreement,
                                             set-up, first posts; backward: delta pass) */
    double blocks_ms[DT_ATTN_MAX_STEPS];  /* step t's block kernels (0 for an empty
                                             block; a grouped launch: on its first step) */
    double wait_ms[DT_ATTN_MAX_STEPS];    /* end of step t's kernels to step t+1's start:
                                             unhidden transfer plus loop work; the last
                                             to the end of the loop */
} dt_attention_timing;

typedef struct dt_attention_options {
    dt_attn_mask mask;        /* DT_ATTN_CAUSAL (default) or DT_ATTN_FULL */
    float scale;              /* softmax scale; 0 means 1/sqrt(D) */
    void *workspace;          /* optional, caller-owned backend memory of
                                 dt_attention_workspace_size bytes; NULL: per call */
    size_t workspace_bytes;
    dt_attention_timing *timing; /* optional, caller-owned; filled by the call */
    int group;                /* forward: G ring steps per kernel launch (0, 1: one;
                                 at most P - 1), ring up to G hops ahead in 2G K,V
                                 buffers; striped causal rounds G down to a power
                                 of two <= 64, striped with documents or a window
                                 takes 1. Backward ignores it. */
    const dt_attention_tuning *tuning; /* NULL: DT_ATTENTION_TUNING_INIT (tuning.h) */
    /* Packed documents (docs.h): NULL and 0, one document per batch row; else
     * doc_count lengths >= 1 in sequence order, summing to S (the same
     * documents in every row) or to B x S (row 0's, then row 1's, ...).
     * Global rows and positions whatever the Layout; host memory, borrowed
     * for the call, the same on every rank. */
    const int64_t *doc_lens;
    int64_t doc_count;
    int64_t window;           /* 0: none; else |pos(q) - pos(k)| < window */
    /* -1 (DT_ATTENTION_OPTIONS_INIT): none. Else a mesh dim that shards the
     * sequence of q, k, v: Ulysses attention over it (ulysses.c). The call
     * redistributes q, k, v so that it shards the heads instead (one
     * all-to-all), runs on the whole sequence, or over the ring of a second
     * mesh dim that still shards it (the Ulysses x ring hybrid), and brings
     * o, lse (backward: dq, dk, dv) back: the same results and Layouts. The
     * heads must be divisible by its size times that of any mesh dim
     * sharding them; kv heads that are not are repeated (their gradients
     * summed). The workspace is not used (the inner call makes its own). */
    int a2a_dim;
} dt_attention_options;

#define DT_ATTENTION_OPTIONS_INIT { DT_ATTN_CAUSAL, 0.0f, NULL, 0, NULL, 0, NULL, NULL, 0, 0, -1 }

/* Not collective. Workspace bytes a forward call on these inputs needs (depends
 * on the backend's kernel, DT_ATTN_KERNEL included; may be 0). */
dt_status dt_attention_workspace_size(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                      const dt_attention_options *opts, size_t *bytes);

/* COLLECTIVE over q's mesh: checks that ranks agree (DT_ERR_MISMATCH), then P
 * ring steps on the compute stream. New caller-owned tensors: *o [B, S, H, D]
 * like q; *lse [B, H, S] fp32 (-inf, o = 0 for a row with no key), q's Shards
 * moved (1 -> 2, 2 -> 1); lse may be NULL, opts too. On failure nothing changes. */
dt_status dt_attention_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_options *opts, dt_tensor **o, dt_tensor **lse);

/* Not collective. Workspace bytes a backward call on these inputs needs. */
dt_status dt_attention_backward_workspace_size(const dt_tensor *q, const dt_tensor *k,
                                               const dt_tensor *v,
                                               const dt_attention_options *opts, size_t *bytes);

/* COLLECTIVE over q's mesh. Gradients of dt_attention_forward from q, k, v, its
 * o and lse, and dout (o's shape, dtype, Layout); opts must be the forward's.
 * New caller-owned *dq (q's Layout), *dk, *dv (k's); dK, dV ride the ring in fp32.
 * Logits of magnitude L add a relative error of about L x 2^-24 (fp32 lse).
 * On failure nothing changes. */
dt_status dt_attention_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                const dt_tensor *o, const dt_tensor *lse, const dt_tensor *dout,
                                const dt_attention_options *opts, dt_tensor **dq, dt_tensor **dk,
                                dt_tensor **dv);

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTENTION_H */
