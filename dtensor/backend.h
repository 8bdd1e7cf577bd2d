/* dtensor/backend.h — PRIVATE. The compute backend function table.
 *
 * A backend keeps tensor data where its device wants it and runs the local
 * kernels. Ops and primitives are written once against this table; backends
 * hold no model logic. backend_cpu.c implements it for host memory,
 * backend_cuda.cu (see backend_cuda.h) for device memory.
 *
 * Streams: on CUDA every call is enqueued on the rank's compute stream, in
 * call order; upload and download return when the host buffer may be reused
 * (download: holds the data). Other calls may return before the device is
 * done; sync waits (bounded by the rank's timeout) for all of the rank's work.
 */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "../base/dtype.h"
#include "op_kinds.h"
#include "../base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One table-driven copy, the mechanism behind every pack, unpack, slice and
 * permutation: for o < outer and i < n, copy (or add) one run of
 * run_elems elements from
 *     src + o*src_outer + src_off[i]   to   dst + o*dst_outer + dst_off[i]
 * (strides and offsets in elements). A NULL offset table means i*run_elems.
 * Offset tables are host arrays of n entries; src and dst are backend
 * memory and must not overlap. The destination runs must not overlap each
 * other (every ADD lands on its own elements). COPY moves bytes of any
 * dtype; ADD needs fp32, bf16 or fp16 (16-bit types: computed in fp32,
 * rounded once). */
typedef enum dt_runs_op { DT_RUNS_COPY = 0, DT_RUNS_ADD } dt_runs_op;

typedef struct dt_runs {
    dt_dtype dtype;
    dt_runs_op op;
    void *dst;              /* backend memory */
    const void *src;        /* backend memory */
    int64_t outer, n, run_elems;
    int64_t dst_outer, src_outer;
    const int64_t *dst_off, *src_off;
} dt_runs;

typedef struct dt_backend dt_backend;
typedef struct dt_memory_stats dt_memory_stats;   /* context.h */
enum { DT_MEMORY_RESET_PEAK = 1, DT_MEMORY_RELEASE = 2 };

typedef struct dt_backend_ops {
    const char *name;
    void (*destroy)(dt_backend *b);
    /* Zeroed memory of `bytes` (bytes may be 0: then a valid unique pointer). */
    dt_status (*alloc)(dt_backend *b, size_t bytes, void **out);
    /* The same, not zeroed: for memory its caller writes before it reads
     * it (an op's output, a workspace), where the zeroing would be a pass
     * over it for nothing (on CUDA, one memset of the whole size). */
    dt_status (*alloc_uninit)(dt_backend *b, size_t bytes, void **out);
    void (*free)(dt_backend *b, void *p);
    dt_status (*upload)(dt_backend *b, void *dst, const void *host, size_t bytes);
    dt_status (*download)(dt_backend *b, void *host, const void *src, size_t bytes);
    dt_status (*copy)(dt_backend *b, void *dst, const void *src, size_t bytes);
    dt_status (*zero)(dt_backend *b, void *p, size_t bytes);
    dt_status (*copy_runs)(dt_backend *b, const dt_runs *runs);
    /* C[M,N] = A[M,K] @ B[K,N], all row-major, contiguous. */
    dt_status (*gemm)(dt_backend *b, dt_dtype dtype, int64_t m, int64_t n, int64_t k,
                      const void *a, const void *bm, void *c);
    dt_status (*add)(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                     const void *y, void *out);
    /* out = x + y from fp32 x and y (y NULL: out = x), rounded once to
     * `dtype` (out may be x when dtype is fp32), beside the work queued
     * after it: it starts after this rank's work queued so far, and this
     * rank's later transfers (the sends and receives of its communicators,
     * transport.h) start after it, but its later compute work does not
     * wait for it (CUDA: it runs on the communication stream, beside the
     * compute stream's next kernels). So the caller must not write x, y or
     * out, nor read out, until a transfer's completion has ordered them
     * after it (dt_comm_p2p_wait, dt_comm_sendrecv). The CPU backend runs
     * it at once. (The backward's fp32 partial sums of dK|dV, and their
     * last hop's rounding to the gradients' dtype.) */
    dt_status (*add_beside)(dt_backend *b, dt_dtype dtype, int64_t n, const float *x,
                            const float *y, void *out);
    dt_status (*gelu)(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                      void *out, dt_gelu_approx approx);
    /* RMSNorm of each row of x [rows, n]:
     *     out[r, i] = x[r, i] * inv_r * w[i],  inv_r = 1 / sqrt(mean_i(x[r, i]^2) + eps)
     * w [n] may be NULL (no scaling); x, w, out are backend memory, out [rows, n].
     * Computed in fp32 (bf16/fp16: loaded, computed in fp32, rounded once);
     * the sum of squares is accumulated in double on the CPU, in fp32 on
     * CUDA (per-thread partial sums, then a tree); inv_r is formed in double. */
    dt_status (*rmsnorm)(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                         const void *w, float eps, void *out);
    /* Rotary embedding of x [outer, rows, inner, d] (d even) into out, same
     * shape: the pair (a, b) of outer row o, row s (dim 1), index i < d/2
     * (half: elements i and i + d/2; interleaved: 2i and 2i + 1) is rotated
     * by the angle positions[o * pos_stride + s] * theta_i,
     * theta_i = base^(-2i/d):
     *     a' = a cos - b sin,   b' = a sin + b cos.
     * positions: a HOST array (>= 0), borrowed for the call (the CUDA
     * backend stages it into device scratch): with pos_stride 0 `rows`
     * entries shared by every outer row, else pos_stride >= rows and
     * (outer - 1) pos_stride + rows entries. base > 0. Angles,
     * cos and sin in double, rounded to fp32; the rotation in fp32, each
     * product rounded (no fused multiply-add), so fp32 results agree across
     * backends up to the last bit of cos/sin. */
    dt_status (*rotary)(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows, int64_t inner,
                        int64_t d, const int64_t *positions, int64_t pos_stride, double base,
                        dt_rotary_style style, const void *x, void *out);
    /* Wait for all work of this rank on the device. */
    dt_status (*sync)(dt_backend *b);
    /* Timestamps for profiling a loop from the inside: marks_reserve(n)
     * makes marks 0..n-1 (once, before the loop: it may allocate); mark(i)
     * records mark i where this rank's work has got to (CPU: the rank
     * thread's CPU time, so only its own work counts; CUDA: an event on the
     * compute stream, so queued work counts); mark_ms gives
     * the milliseconds from mark i to mark j once both are recorded and
     * reached (CUDA: waits for them, bounded by the timeout). */
    dt_status (*marks_reserve)(dt_backend *b, int n);
    dt_status (*mark)(dt_backend *b, int i);
    dt_status (*mark_ms)(dt_backend *b, int i, int j, double *ms);

    /* ---- gradients, losses and the optimizer. Every pointer is backend
     * memory unless it says host; `accumulate` 1 adds into the output
     * (read, add in fp32, round once), 0 overwrites it. 16-bit dtypes are
     * computed in fp32 and rounded once. Calls that return a host value
     * wait for the work queued before them (bounded by the timeout). */

    /* C[M,N] = alpha op(A) op(B) + beta C, row-major and contiguous: op(A) is
     * A [M,K] or, with trans_a, A^T of A [K,M]; op(B) is B [K,N] or, with
     * trans_b, B^T of B [N,K]. beta 0 never reads C. fp32 accumulation. */
    dt_status (*gemm_ex)(dt_backend *b, dt_dtype dtype, int trans_a, int trans_b, int64_t m,
                         int64_t n, int64_t k, float alpha, const void *a, const void *bm,
                         float beta, void *c);
    /* dx = dy * gelu'(x), elementwise over n. */
    dt_status (*gelu_backward)(dt_backend *b, dt_dtype dtype, int64_t n, const void *x,
                               const void *dy, void *dx, dt_gelu_approx approx, int accumulate);
    /* out = silu(gate) * up, silu(g) = g / (1 + e^-g), elementwise over n. */
    dt_status (*swiglu)(dt_backend *b, dt_dtype dtype, int64_t n, const void *gate,
                        const void *up, void *out);
    /* dgate = dy * up * silu'(gate), dup = dy * silu(gate); either may be NULL. */
    dt_status (*swiglu_backward)(dt_backend *b, dt_dtype dtype, int64_t n, const void *gate,
                                 const void *up, const void *dy, void *dgate, void *dup,
                                 int accumulate);
    /* The gradients of rmsnorm (same x [rows, n], w [n] or NULL, eps), with
     * r = 1 / sqrt(mean(x^2) + eps) per row and g = dy * w (dy without w):
     *   dx = r g - x r^3 mean(g x)        (dx NULL: skipped)
     *   dw = sum over rows of dy x r      (dw [n], NULL: skipped; w NULL: no dw)
     * accumulate applies to both. */
    dt_status (*rmsnorm_backward)(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n,
                                  const void *x, const void *w, float eps, const void *dy,
                                  void *dx, void *dw, int accumulate);
    /* The rotary op's inverse: rotates by -angle (its gradient), the same
     * arguments and numerics as rotary. */
    dt_status (*rotary_inverse)(dt_backend *b, dt_dtype dtype, int64_t outer, int64_t rows,
                                int64_t inner, int64_t d, const int64_t *positions,
                                int64_t pos_stride, double base, dt_rotary_style style,
                                const void *x, void *out);
    /* Embedding rows: out[i, :] = table[tok[i] - lo, :] where lo <= tok[i] <
     * lo + rows, else 0; tok int32 [n], table [rows, d], out [n, d]. */
    dt_status (*embedding)(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d,
                           const int32_t *tok, int64_t lo, int64_t rows, const void *table,
                           void *out);
    /* dtable[tok[i] - lo, :] += dy[i, :] for the tokens in [lo, lo + rows),
     * summed in fp32 (with accumulate 0 the rows no token hits become 0). */
    dt_status (*embedding_backward)(dt_backend *b, dt_dtype dtype, int64_t n, int64_t d,
                                    const int32_t *tok, int64_t lo, int64_t rows, const void *dy,
                                    void *dtable, int accumulate);
    /* Over int32 x [n]: *valid (host) = how many are in [0, limit) and not
     * equal to `ignore` (an ignored target that is a class does not count),
     * *bad (host) = the first index of a value neither in [0, limit) nor
     * equal to `ignore`, or -1. */
    dt_status (*i32_check)(dt_backend *b, int64_t n, const int32_t *x, int64_t limit,
                           int32_t ignore, int64_t *valid, int64_t *bad);
    /* Cross-entropy over rows of logits x [rows, n] whose columns are the
     * classes [lo, lo + n) of the vocabulary; tgt int32 [rows], fp32 row
     * arrays [rows]:
     *   ce_max:  m[r] = max_j x[r, j] (NaN if any is NaN)
     *   ce_sum:  se[r] = sum_j e^(x[r, j] - m[r]); tl[r] = x[r, tgt[r] - lo] if
     *            tgt[r] is in [lo, lo + n), else 0
     *   ce_grad: dx[r, j] = (e^(x[r, j] - m[r]) / se[r] - [j == tgt[r] - lo]) *
     *            scale for rows with tgt[r] != ignore, 0 for the others (dx
     *            NULL: skipped); loss[r] = m[r] + log se[r] - tl[r] there, 0
     *            for the others */
    dt_status (*ce_max)(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                        float *m);
    dt_status (*ce_sum)(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                        const float *m, const int32_t *tgt, int64_t lo, float *se, float *tl);
    dt_status (*ce_grad)(dt_backend *b, dt_dtype dtype, int64_t rows, int64_t n, const void *x,
                         const float *m, const float *se, const float *tl, const int32_t *tgt,
                         int64_t lo, int32_t ignore, float scale, void *dx, float *loss);
    /* *out (host) = max |x[i]| over n values: NaN if any is NaN, else +inf if
     * any is infinite, 0 for n = 0. */
    dt_status (*absmax)(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, float *out);
    /* *out (host) = sum of x[i]^2 over n values, accumulated in double. */
    dt_status (*sumsq)(dt_backend *b, dt_dtype dtype, int64_t n, const void *x, double *out);
    /* dst[i] = src[i] converted (rounded to nearest even) for i < n; any two
     * float dtypes, or equal dtypes (a copy). */
    dt_status (*convert)(dt_backend *b, int64_t n, dt_dtype src_dtype, const void *src,
                         dt_dtype dst_dtype, void *dst);
    /* One AdamW step over n parameters, PyTorch's semantics, on the fp32
     * master copy `master` and moments m, v (fp32), with g = grad * gscale:
     *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
     *   master -= lr wd master;  master -= lr (m / bc1) / (sqrt(v / bc2) + eps)
     * (bc1 = 1 - b1^step, bc2 = 1 - b2^step); then param = master rounded to
     * dtype (param may be master itself when dtype is fp32). */
    dt_status (*adamw)(dt_backend *b, dt_dtype dtype, int64_t n, void *param, float *master,
                       float *m, float *v, const void *grad, float gscale, float lr, float b1,
                       float b2, float eps, float wd, int64_t step);
    /* The backend's memory counters (context.h's dt_memory_stats), after
     * what asks (DT_MEMORY_* bits): RELEASE frees the caching allocator's
     * blocks (CUDA: after the rank's queued work, bounded), RESET_PEAK sets
     * peak to in_use. */
    dt_status (*memory)(dt_backend *b, dt_memory_stats *out, int what);
} dt_backend_ops;

struct dt_backend {
    const dt_backend_ops *ops;
    void *impl;
    int rank;
};

/* The CPU backend (host memory, OpenBLAS). */
dt_status dt_backend_cpu_create(int rank, dt_backend **out);

#ifdef __cplusplus
}
#endif
#endif /* DT_BACKEND_H */
