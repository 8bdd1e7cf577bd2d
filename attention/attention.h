/* attention/attention.h — Ring, Striped and Zigzag attention over a
 * sequence-sharded DTensor.
 *
 * q is [B, S, H, D]; k and v are [B, S, H_kv, D] with H_kv dividing H
 * (GQA / MQA: query head h reads key/value head h / (H / H_kv)). All three
 * share one Layout on one mesh: S (dim 1) sharded over the sequence-parallel
 * mesh dim, whose order picks the algorithm
 *     contiguous -> Ring Attention, striped -> Striped Attention,
 *     zigzag     -> dual-chunk balancing,
 * and optionally heads (dim 2) sharded contiguous over a tensor-parallel mesh
 * dim (H_kv divisible by its size) and batch (dim 0) over another; D is never
 * sharded and nothing is Partial. Local tensors (mesh NULL) run single-device
 * attention.
 *
 * The mask is one rule on global token positions (mask.h): a query attends to
 * a key iff pos(q) >= pos(k) (DT_ATTN_CAUSAL), or always (DT_ATTN_FULL).
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

/* Where one call spent this rank's time, for profiling
 * (dt_attention_options.timing). Step t's blocks are timed from just before
 * the block kernels of step t to just after them; before_ms from the call's
 * start to step 0's. CUDA: events on the
 * rank's compute stream, so queued device work counts and host time that
 * overlaps it does not. CPU: the rank thread's CPU time, so only its own
 * work counts (the copies of the transfers, not time blocked on a peer or
 * waiting for a core). */
#define DT_ATTN_MAX_STEPS DT_MAX_WORLD_SIZE
typedef struct dt_attention_timing {
    int steps;                            /* P: the entries filled below */
    double before_ms;                     /* from the call's start (before the
                                             ranks' agreement) to step 0's block
                                             kernels: the agreement, the set-up,
                                             the first transfers' posting
                                             (backward: dQ's zeroing and the delta
                                             pass) */
    double blocks_ms[DT_ATTN_MAX_STEPS];  /* step t's block kernels (the backward's
                                             last step: its two parts and the wait
                                             for the sums between them; 0 when the
                                             mask leaves its block no pair, the wait
                                             then in wait_ms; a launch over several
                                             steps, opts.group: on its first step,
                                             0 on the others) */
    double wait_ms[DT_ATTN_MAX_STEPS];    /* from the end of step t's kernels to the
                                             start of step t+1's: the transfer the
                                             kernels did not hide, plus the loop's own
                                             work (CPU: the work only); after the last
                                             step, to the end of the loop (backward:
                                             the second half of dK|dV's hop home
                                             and the stores) */
} dt_attention_timing;

typedef struct dt_attention_options {
    dt_attn_mask mask;        /* DT_ATTN_CAUSAL (default) or DT_ATTN_FULL */
    float scale;              /* softmax scale; 0 means 1/sqrt(D) */
    void *workspace;          /* optional: dt_attention_workspace_size bytes of
                                 backend memory reused across calls; NULL to
                                 let each call allocate its own */
    size_t workspace_bytes;
    dt_attention_timing *timing; /* optional, this rank's: filled by the call
                                    (two marks per step; NULL: none) */
    int group;                /* forward: ring steps per kernel launch after the
                                 rank's own block (0 or 1: one, the default; at
                                 most P - 1 take effect). G > 1 launches the
                                 block kernel over G blocks at once, received
                                 side by side, so each query tile is visited
                                 once per launch instead of once per step; the
                                 ring runs up to G hops ahead of the kernels, in
                                 2G K, V buffers instead of 2. Every order;
                                 a striped causal ring, whose kernels read a
                                 launch's blocks row by row in turns, takes
                                 the greatest power of two up to G and 64.
                                 The backward runs a launch per step
                                 whatever it is. */
    const dt_attention_tuning *tuning; /* NULL: DT_ATTENTION_TUNING_INIT (tuning.h) */
} dt_attention_options;

#define DT_ATTENTION_OPTIONS_INIT { DT_ATTN_CAUSAL, 0.0f, NULL, 0, NULL, 0, NULL }

/* Bytes of workspace a forward call on these inputs needs (not collective;
 * it depends on the backend's kernel for them, DT_ATTN_KERNEL included: a
 * call with one rank on the sequence on a tensor-core kernel may need 0). */
dt_status dt_attention_workspace_size(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                      const dt_attention_options *opts, size_t *bytes);

/* COLLECTIVE over the mesh of q. Checks first that all ranks agree on
 * shapes, dtype, Layout and options (DT_ERR_MISMATCH naming what differs),
 * then runs P ring steps. Returns new tensors owned by the caller:
 *   *o    [B, S, H, D], q's dtype and Layout;
 *   *lse  [B, H, S] fp32 log-sum-exp of each query row (-inf for a row that
 *         may attend to no key, whose output is 0), sharded like q with the
 *         dims moved: q's Shard(1) becomes Shard(2), Shard(2) becomes Shard(1).
 * lse may be NULL if not wanted. opts may be NULL (defaults). On failure
 * nothing is written or changed. */
dt_status dt_attention_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_options *opts, dt_tensor **o, dt_tensor **lse);

/* Bytes of workspace a backward call on these inputs needs (not collective). */
dt_status dt_attention_backward_workspace_size(const dt_tensor *q, const dt_tensor *k,
                                               const dt_tensor *v,
                                               const dt_attention_options *opts, size_t *bytes);

/* COLLECTIVE over the mesh of q. The gradients of dt_attention_forward:
 * from its inputs q, k, v, its outputs o and lse, and dout (the gradient of
 * o: q's shape, dtype and Layout), returns new tensors owned by the caller:
 * *dq with q's Layout, *dk and *dv with k's. opts must be the forward's.
 * dQ stays home; dK and dV accumulate in fp32 and travel the ring with K and
 * V, arriving home after P steps; they are rounded to the dtype once.
 * Precision: the probabilities are recomputed as exp(scale q.k - lse) from
 * the fp32 lse, so with logits of magnitude L the gradients carry a
 * relative error of up to about L x 2^-24 beyond the forward's (6e-4 at
 * L = 1e4; FlashAttention's backward, with its fp32 lse, is alike). On
 * failure nothing is written or changed. */
dt_status dt_attention_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                const dt_tensor *o, const dt_tensor *lse, const dt_tensor *dout,
                                const dt_attention_options *opts, dt_tensor **dq, dt_tensor **dk,
                                dt_tensor **dv);

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTENTION_H */
