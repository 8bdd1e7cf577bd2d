/* dtensor/primitives.h — the primitives that move data and update Layouts.
 *
 * Each returns a new tensor (the caller owns it) and leaves its input as it
 * was, so a rejected call changes nothing (*out is written only on success).
 * All but permute are COLLECTIVE over the mesh of their input (or the given
 * mesh): every rank calls them in the same order with the same arguments.
 * Every argument is validated before anything is allocated or sent, but
 * for shard's Layout, checked against the shape that root broadcasts (every
 * rank then rejects it together). fp32, bf16 and fp16; pure data movement
 * is bit-exact.
 *
 * | primitive                         | communication                      |
 * | shard: full on root -> Layout     | scatter (grouped send/recv)        |
 * | gather: Layout -> full on root    | gather (grouped send/recv)         |
 * | Shard -> Replicate                | all-gather                         |
 * | Partial -> Replicate / Shard      | all-reduce / reduce-scatter        |
 * | Replicate -> Shard, Shard->Partial| none (local slice / zero padding)  |
 * | Shard(i) -> Shard(j), any orders  | all-to-all (grouped send/recv)     |
 * | permute_striped / unpermute       | none (local gather along one dim)  |
 *
 * A tensor dim sharded over several mesh dims (layout.h) moves the same way,
 * one mesh dim at a time: a mesh dim's placement changes in one step only
 * while no later mesh dim shards the tensor dims involved, so an outer split
 * changes after the inner ones are undone (and redone after); the plan is
 * the cheapest such sequence (primitives.c).
 *
 * Test: tests/test_tensor.c (make test).
 */
#ifndef DT_PRIMITIVES_H
#define DT_PRIMITIVES_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* COLLECTIVE over mesh. `full` is a local tensor (mesh NULL) on world rank
 * `root` and is ignored elsewhere (may be NULL); its dtype and shape reach the
 * other ranks from root. Every rank gets its part of `full` under `layout`. */
dt_status dt_tensor_shard(const dt_mesh *mesh, int root, const dt_tensor *full,
                          const dt_layout *layout, dt_tensor **out);

/* COLLECTIVE. The whole global tensor as a local tensor on world rank root
 * (Partial dims summed on root in rank order; bf16 rounds after each
 * addition); *out = NULL on the other ranks. */
dt_status dt_tensor_gather(const dt_tensor *t, int root, dt_tensor **out);

/* COLLECTIVE. The same global tensor under another Layout on the same mesh. */
dt_status dt_tensor_redistribute(const dt_tensor *t, const dt_layout *layout,
                                 dt_tensor **out);

/* COLLECTIVE. outs[i] = dt_tensor_redistribute(ts[i], &layouts[i]) for n
 * tensors of one mesh, in fewer calls: those whose plan only sums
 * (Partial -> Replicate on each mesh dim it changes) are packed by dtype
 * and mesh dims into buckets of up to 32 MiB, each summed by one in-place
 * all-reduce per mesh dim (the same bits as one by one on the local and
 * MPI transports); the others are redistributed one by one. On an error no
 * outs[i] is written. */
dt_status dt_tensor_redistribute_n(const dt_tensor *const *ts, const dt_layout *layouts, int n,
                                   dt_tensor **outs);

/* COLLECTIVE. grad, a gradient of t (t's shape, as a backward function left
 * it: Partial where it is a sum of the ranks' parts), redistributed to the
 * Layout t's gradient has: t's Layout with Partial read as Replicate
 * (dt_layout_grad). All-reduce where grad is Partial and t Replicate,
 * reduce-scatter where t is Shard: Megatron's backward all-reduce, and
 * sequence parallelism's reduce-scatter, in one call. */
dt_status dt_tensor_grad_reduce(const dt_tensor *grad, const dt_tensor *t, dt_tensor **out);

/* COLLECTIVE. outs[i] = dt_tensor_grad_reduce(grads[i], ts[i]) for n
 * gradients of one mesh through dt_tensor_redistribute_n: data
 * parallelism's bucketed all-reduce (one call per mesh dim and bucket,
 * not per parameter). On an error no outs[i] is written. */
dt_status dt_tensor_grad_reduce_n(const dt_tensor *const *grads, const dt_tensor *const *ts, int n,
                                  dt_tensor **outs);

/* COLLECTIVE. dt_tensor_redistribute to every mesh dim Replicate. */
dt_status dt_tensor_replicate(const dt_tensor *t, dt_tensor **out);

/* Not collective. On a dim that is not sharded, with n = len / parts:
 *   permute:   out[i] = in[(i % n) * parts + i / n]
 *   unpermute: out[i] = in[(i % parts) * n + i / parts]
 * so contiguous sharding of the permuted tensor over `parts` ranks holds what
 * striped sharding of the original does. Every other dim is carried intact. */
dt_status dt_tensor_permute_striped(const dt_tensor *t, int dim, int parts,
                                    dt_tensor **out);
dt_status dt_tensor_unpermute_striped(const dt_tensor *t, int dim, int parts,
                                      dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* DT_PRIMITIVES_H */
