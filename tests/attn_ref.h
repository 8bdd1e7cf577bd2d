/* tests/attn_ref.h — double-precision reference attention on a whole
 * sequence, written from the definitions (not from the library):
 *   s[i,j] = scale q[b,i,h].k[b,j,g], g = h / (H / Hkv), over keys j <= i
 *   (causal) or all j (and, with attn_ref_rule, of i's document and window); p = softmax_j s; o = p v; lse = log sum_j exp s;
 *   dv[j] += p[i,j] do[i]; dp = do.v; ds = p (dp - rowsum(do * o));
 *   dq = scale ds k; dk += scale ds^T q.
 * Shapes: q, o, dq [B, S, H, D]; k, v, dk, dv [B, S, Hkv, D]; lse [B, H, S]. */
#ifndef DT_TEST_ATTN_REF_H
#define DT_TEST_ATTN_REF_H

#include <stdint.h>

#include "base/dtype.h"
#include "dtensor/layout.h"

typedef struct attn_shape {
    int64_t B, S, H, Hkv, D;
} attn_shape;

/* n values dt_random_value(seed, i) as the dtype (fp32, bf16, fp16) stores
 * them, in double. */
double *ref_input(uint64_t seed, int64_t n, dt_dtype dtype);

void ref_attention_forward(const attn_shape *s, const double *q, const double *k,
                           const double *v, int causal, double scale, double *o, double *lse);

/* dq, dk, dv are overwritten. */
void ref_attention_backward(const attn_shape *s, const double *q, const double *k,
                            const double *v, const double *dout, int causal, double scale,
                            double *dq, double *dk, double *dv);

/* The mask rule with documents and a window, written out: query i and key j
 * of batch row b pair iff (j <= i when causal), (|i - j| < window when
 * window > 0) and they lie in the same document. doc_lens (NULL: one
 * document a row): doc_count lengths summing to S (the same documents in
 * every row) or to B x S (row 0's, then row 1's, ...). A row with no key
 * has o = 0, lse = -inf. */
typedef struct attn_ref_rule {
    int causal;
    int64_t window;
    const int64_t *doc_lens;
    int64_t doc_count;
} attn_ref_rule;

int ref_rule_allows(const attn_shape *s, const attn_ref_rule *r, int64_t b, int64_t i, int64_t j);
void ref_attention_forward_rule(const attn_shape *s, const attn_ref_rule *r, const double *q,
                                const double *k, const double *v, double scale, double *o,
                                double *lse);
void ref_attention_backward_rule(const attn_shape *s, const attn_ref_rule *r, const double *q,
                                 const double *k, const double *v, const double *dout,
                                 double scale, double *dq, double *dk, double *dv);



/* The rows of a full [B, S, heads, D] array that sequence rank j of P (order)
 * and head-group t (heads_local heads each) holds, in local order:
 * out [B, S/P, heads_local, D]. */
void ref_local_rows(const double *full, int64_t B, int64_t S, int64_t heads, int64_t D,
                    dt_order order, int P, int j, int t, int64_t heads_local, double *out);

/* The same for a full [B, heads, S] array (lse): out [B, heads_local, S/P]. */
void ref_local_lse(const double *full, int64_t B, int64_t S, int64_t heads, dt_order order,
                   int P, int j, int t, int64_t heads_local, double *out);

struct dt_tensor;
/* The local data of a fp32, bf16 or fp16 tensor, widened to fp32. */
dt_status ref_get_f32(const struct dt_tensor *t, float *out);

/* Sets the local data of a fp32, bf16 or fp16 tensor from doubles (each
 * rounded to nearest even in the tensor's dtype): the way to give a tensor
 * chosen inputs, such as logits of magnitude 1e4. */
dt_status ref_set_local(struct dt_tensor *t, const double *local);
#endif /* DT_TEST_ATTN_REF_H */
