/* dtensor/ops.h — local ops that read Layouts. None communicates: each
 * derives its output Layout from its inputs' and fails with
 * DT_ERR_NOT_SUPPORTED (naming a redistribution that would work) otherwise.
 *
 * Test: tests/test_ops.c (make test).
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

/* out = a + b: same mesh, dtype, shape and Layout. Partial + Partial stays
 * Partial; Partial mixed with anything else is rejected. */
dt_status dt_add(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);

/* out = gelu(x), elementwise; same Layout. Partial input is rejected (GELU is
 * not linear: replicate or reduce first). */
dt_status dt_gelu(const dt_tensor *x, dt_gelu_approx approx, dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* DT_OPS_H */
