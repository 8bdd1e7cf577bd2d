/* dtensor/ops.h — local ops that read Layouts, each with its backward beside
 * it. None communicates: each derives its output Layout from its inputs'
 * and fails with DT_ERR_NOT_SUPPORTED (naming a redistribution that would
 * work) otherwise. Not collective; CUDA: enqueued on the rank's compute
 * stream.
 *
 * Backward functions take what the forward took plus dy, the gradient of its
 * output, which must have the output's Layout with Partial read as
 * Replicate (dt_layout_grad), and return the inputs' gradients. Each
 * gradient argument is NULL (not wanted), the address of a NULL pointer (a
 * new tensor, the caller's), or the address of a tensor that the gradient is
 * added into (same shape, dtype, mesh and Layout as the gradient: dW summed
 * over micro-batches, a weight used twice). A gradient has its tensor's
 * shape and the Layout the rule gives (docs/API.md has the table); where
 * that is Partial, dt_tensor_grad_reduce reduces it. On a rejected call
 * nothing is written.
 *
 * Test: tests/test_ops.c, tests/test_grad.c (make test).
 */
#ifndef DT_OPS_H
#define DT_OPS_H

#include "op_kinds.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = x @ w, x [..., K], w [K, N], out [..., N]; same mesh, same dtype.
 * Per mesh dim (x, w) -> out:
 *   (Replicate, Replicate)            -> Replicate
 *   (Replicate, Shard(1, o))          -> Shard(last, o)   column-parallel
 *   (Shard(last, o), Shard(0, o))     -> Partial          row-parallel
 *   (Shard(d, o), Replicate), d<last  -> Shard(d, o)      batch / sequence
 *   (Partial, Replicate), (Replicate, Partial) -> Partial
 * fp32, bf16 and fp16 (OpenBLAS on the CPU, cuBLAS on CUDA): bf16 and fp16
 * accumulated in fp32 and rounded once. */
dt_status dt_matmul(const dt_tensor *x, const dt_tensor *w, dt_tensor **out);

/* dx = dy @ w^T (x's shape), dw = x^T @ dy (w's shape). Per mesh dim
 * (x, w) -> (dy, dx, dw):
 *   (Replicate, Replicate)        -> (Replicate, Replicate, Replicate)
 *   (Replicate, Shard(1, o))      -> (Shard(last, o), Partial, Shard(1, o))
 *   (Shard(last, o), Shard(0, o)) -> (Replicate, Shard(last, o), Shard(0, o))
 *   (Shard(d, o), Replicate)      -> (Shard(d, o), Shard(d, o), Partial)
 *   (Partial, Replicate)          -> (Replicate, Replicate, Partial)
 *   (Replicate, Partial)          -> (Replicate, Partial, Replicate)
 * cuBLAS / OpenBLAS with their transposes (no copies); fp32 accumulation. */
dt_status dt_matmul_backward(const dt_tensor *x, const dt_tensor *w, const dt_tensor *dy,
                             dt_tensor **dx, dt_tensor **dw);

/* out = a + b: same mesh, dtype, shape and Layout. Partial + Partial stays
 * Partial; Partial mixed with anything else is rejected. */
dt_status dt_add(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);

/* da = db = dy (the residual's gradient passes through), with a's Layout
 * Partial read as Replicate; new ones share dy's buffer (dt_tensor_data). */
dt_status dt_add_backward(const dt_tensor *a, const dt_tensor *b, const dt_tensor *dy,
                          dt_tensor **da, dt_tensor **db);

/* out = gelu(x), elementwise; same Layout. Partial input is rejected (GELU is
 * not linear: replicate or reduce first). */
dt_status dt_gelu(const dt_tensor *x, dt_gelu_approx approx, dt_tensor **out);

/* dx = dy * gelu'(x), x's Layout. */
dt_status dt_gelu_backward(const dt_tensor *x, dt_gelu_approx approx, const dt_tensor *dy,
                           dt_tensor **dx);

/* out = silu(gate) * up, silu(g) = g / (1 + e^-g), elementwise (Llama's MLP:
 * silu(x @ w_gate) * (x @ w_up)). gate and up: one shape and one Layout, not
 * Partial; out has it too. */
dt_status dt_swiglu(const dt_tensor *gate, const dt_tensor *up, dt_tensor **out);

/* dgate = dy * up * silu'(gate), dup = dy * silu(gate), gate's Layout. Both
 * new or both added into, when both are wanted. */
dt_status dt_swiglu_backward(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy,
                             dt_tensor **dgate, dt_tensor **dup);

#ifdef __cplusplus
}
#endif
#endif /* DT_OPS_H */
