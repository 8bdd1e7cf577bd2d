/* dtensor/ops_nn.h — ops for transformer layers: Layout rules in
 * dtensor/ops_norm.c (the worked example of docs/TUTORIAL.md), kernels in
 * the compute backends (dtensor/backend.h):
 *
 *   dt_tensor_reshape  split / merge dims, carrying the Layout across
 *   dt_rmsnorm         RMSNorm over the last dim (optional weight)
 *   dt_rotary          rotary position embedding at GLOBAL token positions
 *
 * None communicates and none is collective: each reads its inputs' Layouts,
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
 * number of elements), as a new tensor with its own copy of the data.
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
 * is copied as it is. Shard(2) on [B, S, E] with E = H*D is Shard(2) on
 * [B, S, H, D] (needs H divisible by the mesh size, 2x for zigzag), and
 * back. Anything else (an inner dim of a group sharded, a striped dim that
 * is split or merged, a new outer dim not divisible) is
 * DT_ERR_NOT_SUPPORTED, naming the tensor dim and mesh dim. On a mesh dim of
 * size 1 such a placement becomes Replicate (the same data).
 * Not collective; a local tensor (mesh NULL) gives a local tensor. */
dt_status dt_tensor_reshape(const dt_tensor *t, int ndim, const int64_t *shape,
                            dt_tensor **out);

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

typedef struct dt_rotary_options {
    float base;               /* theta_i = base^(-2i/D), i < D/2; 0 means 10000 */
    dt_rotary_style style;
    const int64_t *positions; /* optional host array [S], borrowed for the call:
                                 the position of global token g is positions[g]
                                 (>= 0); NULL: position g */
    int64_t n_positions;      /* entries in positions: S, or 0 when NULL */
} dt_rotary_options;

#define DT_ROTARY_OPTIONS_INIT { 10000.0f, DT_ROTARY_HALF, NULL, 0 }

/* Rotary position embedding: x [B, S, ..., D] (ndim >= 3; dim 1 is the
 * sequence, the last dim is rotated, D even). Each pair (a, b) of a token at
 * position p is rotated by the angle p * theta_i:
 *     a' = a cos - b sin,   b' = a sin + b cos.
 *
 * Positions come from the Layout, so the op is right under any order: if a
 * mesh dim m shards dim 1 as Shard(1, o) over P ranks, local row x of the
 * rank at coordinate c on m is global token
 *     g = dt_order_global(o, S, P, c, x)
 * (striped: token c + x*P, not x) and its position is positions[g] (or g).
 * The last dim D must not be sharded (a pair must be local):
 * DT_ERR_NOT_SUPPORTED. Partial is allowed (the rotation is linear) and,
 * like every other placement, passes through: out has x's Layout.
 * Angles, cos and sin are formed in double (large positions keep their
 * precision) and rounded to fp32; the rotation is in fp32 (no fused
 * multiply-add, so the CPU and CUDA backends agree to the last bit of
 * cos/sin). opts may be NULL (defaults). Errors: D odd, ndim < 3,
 * base not finite or < 0, unknown style, positions given with n_positions
 * != S, n_positions != 0 without positions, a negative position:
 * DT_ERR_INVALID_ARGUMENT naming the value. */
dt_status dt_rotary(const dt_tensor *x, const dt_rotary_options *opts, dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* DT_OPS_NN_H */
