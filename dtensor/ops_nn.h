/* dtensor/ops_nn.h — ops for transformer layers: Layout rules in
 * dtensor/ops_norm.c (the worked example of docs/TUTORIAL.md), kernels in
 * the compute backends (dtensor/backend.h):
 *
 *   dt_tensor_reshape  split / merge dims, carrying the Layout across
 *   dt_rmsnorm         RMSNorm over the last dim (optional weight)
 *   dt_rotary          rotary position embedding at GLOBAL token positions
 *   dt_embedding       token embedding, vocab-parallel when the table is
 *   dt_cross_entropy   the mean loss and its gradient, vocab-parallel (COLLECTIVE)
 * each with its backward (ops.h says how gradients are passed and added).
 *
 * None but dt_cross_entropy communicates or is collective: each reads its inputs' Layouts,
 * derives the output Layout mesh dim by mesh dim, and works on the local
 * buffer. A Layout with no local meaning is rejected with
 * DT_ERR_NOT_SUPPORTED and a message naming a redistribution that works.
 * Every argument is checked before anything is allocated; on failure *out
 * is left as it was. Each returns a new tensor that the caller owns
 * (dt_tensor_destroy); inputs are never modified.
 *
 * dtypes: fp32, bf16 and fp16 (the 16-bit ones computed in fp32 and rounded
 * once).
 * Backends: every backend (the kernels are entries of the backend table).
 * On CUDA each op enqueues its kernel (or, for dt_tensor_reshape, one
 * device-to-device copy) on the rank's compute stream and returns without
 * waiting for it; the data never passes through host memory.
 *
 * Test: tests/test_transformer.c (make test).
 */
#ifndef DT_OPS_NN_H
#define DT_OPS_NN_H

#include "op_kinds.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = t viewed with a new global shape (ndim entries, each >= 1, same
 * number of elements), as a new tensor that shares t's local buffer (no
 * copy; either gets a copy of its own when it is written: dt_tensor_data).
 *
 * Layout: the dims of both shapes are cut into the smallest groups of
 * consecutive dims with equal products ([B, S, E] -> [B, S, H, D]: {B}->{B},
 * {S}->{S}, {E}->{H, D}; dims of length 1 join the group after them).
 * Per mesh dim:
 *   Replicate, Partial     -> unchanged
 *   Shard(d, o), contiguous or zigzag, d the outer dim of its group (only
 *                             dims of length 1 before it in the group)
 *                          -> Shard(n, o), n the outer dim of the new group
 *                             (skipping dims of length 1 it cannot divide)
 *   Shard(d, striped), only where d keeps its length (every other dim of
 *                             its group, old and new, has length 1)
 *                          -> Shard(n, striped)
 * because blocks (contiguous) and chunk pairs (zigzag) of the outer dim of
 * a group are blocks and chunk pairs of the flattened group: every rank
 * already holds exactly its part, in row-major order, and the local buffer
 * is the same bytes. Shard(2) on [B, S, E] with E = H*D is Shard(2) on
 * [B, S, H, D] (needs H divisible by the mesh size, 2x for zigzag), and
 * back. Anything else (an inner dim of a group sharded, a striped dim that
 * is split or merged, a new outer dim not divisible) is
 * DT_ERR_NOT_SUPPORTED, naming the tensor dim and mesh dim. On a mesh dim of
 * size 1 such a placement becomes Replicate (the same data).
 * Not collective; a local tensor (mesh NULL) gives a local tensor. */
dt_status dt_tensor_reshape(const dt_tensor *t, int ndim, const int64_t *shape,
                            dt_tensor **out);

/* dx = dy reshaped to x's shape, with x's Layout (Partial read as
 * Replicate): dy must be the gradient of dt_tensor_reshape(x, ...)'s output.
 * A new dx shares dy's buffer (dt_tensor_reshape's view). */
dt_status dt_tensor_reshape_backward(const dt_tensor *x, const dt_tensor *dy, dt_tensor **dx);

/* out = x / sqrt(mean(x^2) + eps) * weight, the mean over the last dim E
 * of x [..., E]; weight [E] may be NULL (no scaling).
 *
 * Layouts: x's last dim must not be sharded, because every output element
 * needs the sum of squares of its whole row: Shard(last) on a mesh dim is
 * DT_ERR_NOT_SUPPORTED ("redistribute x to ..."), and so is Partial (the
 * norm is not linear). Every other Shard and Replicate passes through: out
 * has x's Layout. weight must be on x's mesh (or local when x is) with every
 * mesh dim Replicate, shape [E], x's dtype.
 * eps: finite and >= 0. Sums of squares are accumulated in double (on
 * CUDA per-thread partial sums reduced as a tree) and 1/sqrt(mean + eps)
 * is formed in double; with eps 0 a row of subnormals is normalised too
 * (its inverse applied as x 2^64 times inv 2^-64). */
dt_status dt_rmsnorm(const dt_tensor *x, const dt_tensor *weight, float eps, dt_tensor **out);

/* dx (x's Layout) and dweight ([E]: Partial on the mesh dims that shard x's
 * rows, whose ranks each sum their own, Replicate elsewhere; reduce it with
 * dt_tensor_grad_reduce). dy has x's Layout. dweight needs a weight. */
dt_status dt_rmsnorm_backward(const dt_tensor *x, const dt_tensor *weight, float eps,
                              const dt_tensor *dy, dt_tensor **dx, dt_tensor **dweight);

typedef struct dt_rotary_options {
    float base;               /* theta_i = base^(-2i/D), i < D/2; 0 means 10000 */
    dt_rotary_style style;
    const int64_t *positions; /* optional host array [S], borrowed for the call:
                                 the position of global token g is positions[g]
                                 (>= 0); NULL: position g */
    int64_t n_positions;      /* entries in positions: S, or 0 when NULL */
    /* Packed documents (docs.h), as dt_attention_options takes them: NULL
     * and 0, none; else doc_count lengths >= 1 in sequence order, summing to
     * S (the same documents in every batch row) or to B x S (row 0's, then
     * row 1's, ...); each document starts at position 0. Host memory,
     * borrowed for the call. Not together with positions. */
    const int64_t *doc_lens;
    int64_t doc_count;
} dt_rotary_options;

#define DT_ROTARY_OPTIONS_INIT { 10000.0f, DT_ROTARY_HALF, NULL, 0, NULL, 0 }

/* Rotary position embedding: x [B, S, ..., D] (ndim >= 3; dim 0 is the
 * batch, dim 1 the sequence, the last dim is rotated, D even). Each pair
 * (a, b) of a token at position p is rotated by the angle p * theta_i:
 *     a' = a cos - b sin,   b' = a sin + b cos.
 *
 * Positions come from the Layout, so the op is right under any order: if a
 * mesh dim m shards dim 1 as Shard(1, o) over P ranks, local row x of the
 * rank at coordinate c on m is global token
 *     g = dt_order_global(o, S, P, c, x)
 * (striped: token c + x*P, not x) and its position is positions[g] (or g);
 * sequences sharded over several mesh dims map through their composition
 * (dt_layout_global_index).
 * With documents, token g of global batch row b (dim 0 may be sharded too)
 * is at position g - start, start the first token of its document in row b
 * (dt_docs_bounds), so a packed sequence sees each document from 0.
 * The last dim D must not be sharded (a pair must be local):
 * DT_ERR_NOT_SUPPORTED. Partial is allowed (the rotation is linear) and,
 * like every other placement, passes through: out has x's Layout.
 * Angles, cos and sin are formed in double (large positions keep their
 * precision) and rounded to fp32; the rotation is in fp32 (no fused
 * multiply-add, so the CPU and CUDA backends agree to the last bit of
 * cos/sin). opts may be NULL (defaults). Errors: D odd, ndim < 3,
 * base not finite or < 0, unknown style, positions given with n_positions
 * != S, n_positions != 0 without positions, a negative position, documents
 * that dt_docs_check refuses (a length < 1, a sum other than S or B x S, a
 * document across a row boundary, lens and count not both given), documents
 * and positions both given: DT_ERR_INVALID_ARGUMENT naming the value. */
dt_status dt_rotary(const dt_tensor *x, const dt_rotary_options *opts, dt_tensor **out);

/* dx = dy rotated back (by -angle) at the same positions (documents too);
 * the forward's x and opts, dy with x's Layout (Partial read as Replicate),
 * dx likewise. */
dt_status dt_rotary_backward(const dt_tensor *x, const dt_rotary_options *opts,
                             const dt_tensor *dy, dt_tensor **dx);

/* out [..., E] = the rows of table [V, E] at tokens [...] (DT_I32, each in
 * [0, V): DT_ERR_INVALID_ARGUMENT names the first that is not). Per mesh dim
 * (table, tokens) -> out:
 *   (Replicate, Replicate)          -> Replicate
 *   (Replicate, Shard(d, o))        -> Shard(d, o)       batch / sequence
 *   (Shard(0, contiguous), Replicate) -> Partial         vocab-parallel: a rank
 *                                      looks up the tokens in its rows, 0 elsewhere
 *   (Shard(1, o), Replicate)        -> Shard(last, o)
 * A vocabulary sharded over several mesh dims: DT_ERR_NOT_SUPPORTED.
 * Reads the tokens' range on the host (CUDA: waits for the work queued before). */
dt_status dt_embedding(const dt_tensor *table, const dt_tensor *tokens, dt_tensor **out);

/* dtable [V, E] += the rows of dy [..., E] scattered to their tokens (into the
 * rank's own rows only): table's Layout where it shards, Partial where the
 * tokens are sharded and the table is not, Replicate elsewhere. dy has
 * out's Layout with Partial read as Replicate. */
dt_status dt_embedding_backward(const dt_tensor *table, const dt_tensor *tokens,
                                const dt_tensor *dy, dt_tensor **dtable);

typedef enum dt_loss_reduction {
    DT_LOSS_MEAN = 0,   /* over the targets that are not ignored, of the global batch */
    DT_LOSS_SUM,
    DT_LOSS_REDUCTION_COUNT
} dt_loss_reduction;

typedef struct dt_cross_entropy_options {
    int32_t ignore_index;         /* targets equal to it count nowhere; -1 by default */
    dt_loss_reduction reduction;
} dt_cross_entropy_options;

#define DT_CROSS_ENTROPY_OPTIONS_INIT { -1, DT_LOSS_MEAN }

/* COLLECTIVE over the mesh of logits. The cross-entropy of logits [..., V]
 * against targets [...] (DT_I32, each in [0, V) or the ignore index): *loss
 * (host, may be NULL) = the mean (or sum) over the global batch of
 * log-sum-exp(row) - row[target], the same on every rank (NaN when no target
 * counts, as PyTorch); *dlogits (NULL: not wanted; must point to NULL) its
 * gradient, logits' Layout. Per mesh dim (logits, targets):
 *   (Shard(last, contiguous), Replicate)  vocab-parallel: max and sum
 *                                         all-reduced over the dim, fp32
 *   (Shard(d, o), Shard(d, o)), d < last  rows split: counts and sums reduced
 *   (Replicate, Replicate)
 * anything else (a vocabulary split over several mesh dims included)
 * DT_ERR_NOT_SUPPORTED. Every rank checks its targets first and
 * all agree before any data moves (a bad target on one rank fails all). */
dt_status dt_cross_entropy(const dt_tensor *logits, const dt_tensor *targets,
                           const dt_cross_entropy_options *opts, float *loss,
                           dt_tensor **dlogits);

#ifdef __cplusplus
}
#endif
#endif /* DT_OPS_NN_H */
