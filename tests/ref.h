/* tests/ref.h — input data and read-back helpers shared by the op and model
 * suites (test_ops, test_tensor, test_mlp, test_transformer, test_cuda).
 *
 * The values are defined here from dt_random_value alone, and the
 * references the suites compute from them stay in each suite, written
 * independently of the library code they test.
 */
#ifndef DT_TEST_REF_H
#define DT_TEST_REF_H

#include <stdint.h>

#include "dtensor/dtensor.h"

/* v as the dtype stores it: rounded to bf16 or fp16, else v. */
float h_stored(dt_dtype dtype, float v);

/* The relative error of one rounding to dtype (half its ulp at 1): 2^-24
 * for fp32, 2^-8 for bf16, 2^-11 for fp16 (normal values; fp16's
 * subnormals, below 2^-14, add at most 2^-25 absolute). */
double h_half_ulp(dt_dtype dtype);

/* The power of two 2^-k with 2^k nearest sqrt(fan_in / 3): scales a weight
 * so that a matmul keeps the variance of uniform [-1, 1) inputs, exactly in
 * any dtype. */
float h_weight_scale(int64_t fan_in);

/* offset + scale * r for the stored random value r = dt_random_value(seed,
 * i), computed in fp32 and stored in the dtype. */
float h_input_value(dt_dtype dtype, uint64_t seed, int64_t i, float offset, float scale);

/* A tensor of `shape` under `l` (mesh NULL: a local tensor) holding
 * h_input_value(dtype, seed, g, offset, scale) at each global index g:
 * every rank sets its own part (h_local_of), no communication. */
dt_status h_make_tensor(dt_context *ctx, const dt_mesh *mesh, dt_dtype dtype, int ndim,
                        const int64_t *shape, const dt_layout *l, uint64_t seed, float offset,
                        float scale, dt_tensor **out);

/* t's local data as a new float array (bf16 widened); NULL when out of
 * memory or the download fails. The caller frees it. */
float *h_local_floats(const dt_tensor *t);

/* The summand a rank holds under `l`: its coordinates on the Partial mesh
 * dims, linearised; 0 when there are none. */
int h_partial_index(const dt_layout *l, const int *mesh, const int *coords);

/* The number of summands under `l`: the product of the Partial mesh dims. */
int h_partial_count(const dt_layout *l, const int *mesh);

/* GELU in double: the erf form, or the tanh approximation. */
double h_gelu_ref(double x, dt_gelu_approx approx);

#endif /* DT_TEST_REF_H */
