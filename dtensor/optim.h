/* dtensor/optim.h — what a training step needs beyond the ops: the global
 * sum of squares of a sharded tensor (the gradient norm), dtype
 * conversion (fp32 master weights), and AdamW on local shards.
 *
 * Test: tests/test_grad.c (make test).
 */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* COLLECTIVE over t's mesh. *out (host) = the sum of the squares of t's
 * global elements, accumulated in double, the same on every rank: each
 * rank's share counted once however it is replicated. t must not be
 * Partial (a sum's square is not the sum of squares). CUDA: waits for the
 * rank's queued work. */
dt_status dt_tensor_sum_squares(const dt_tensor *t, double *out);

/* COLLECTIVE over the world. out[i] = dt_tensor_sum_squares(t[i]), the
 * same bits, for n >= 1 tensors of one context in one exchange (one world
 * all_gather of n doubles, not n of one): a global gradient norm in one
 * call. Any tensor refused (NULL, Partial, another context): nothing
 * written, no exchange. */
dt_status dt_tensor_sum_squares_n(const dt_tensor *const *t, int n, double *out);

/* out = t converted to dtype (fp32, bf16, fp16; round to nearest even),
 * same mesh, shape and Layout. Not collective. */
dt_status dt_tensor_convert(const dt_tensor *t, dt_dtype dtype, dt_tensor **out);

typedef struct dt_adamw_options {
    float lr;
    float beta1, beta2, eps;
    float weight_decay;       /* decoupled: p -= lr * weight_decay * p */
} dt_adamw_options;

#define DT_ADAMW_OPTIONS_INIT { 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f }

/* One AdamW step (PyTorch's torch.optim.AdamW: bias-corrected moments,
 * decoupled weight decay) on this rank's shard, step >= 1 counting from 1:
 *   g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
 *   w -= lr wd w; w -= lr (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
 * w is master (fp32) when given, then written to param rounded to its dtype;
 * else param itself (fp32). m, v: fp32. Every tensor has param's mesh,
 * shape and Layout, and grad param's dtype (not Partial: reduce it first,
 * dt_tensor_grad_reduce). grad_scale > 0 applies gradient clipping. Not
 * collective: the shards of a replicated parameter stay equal because their
 * inputs are. CUDA: one kernel on the compute stream. */
dt_status dt_adamw_step(dt_tensor *param, dt_tensor *master, dt_tensor *m, dt_tensor *v,
                        const dt_tensor *grad, float grad_scale, const dt_adamw_options *opts,
                        int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* DT_OPTIM_H */
