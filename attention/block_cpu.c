/* attention/block_cpu.c — the CPU attention block kernel.
 *
 * Online softmax over tiles of TQ queries x TK keys, per (batch, head):
 *   S = scale * Q_t K_t^T                   (OpenBLAS sgemm, fp32)
 *   mask S where pos(q) < pos(k)            (partial tiles only; empty tiles skipped)
 *   m' = max(m, rowmax S);  P = exp(S - m')
 *   l  = l * exp(m - m') + rowsum P
 *   acc = acc * exp(m - m') + P V_t         (sgemm into the strided acc rows)
 * Rows that have seen no allowed key keep m = -inf, l = 0 and acc = 0, and
 * are never touched by exp(-inf - -inf). Tiles are packed into contiguous
 * fp32 scratch (which also converts bf16), so one path serves both dtypes.
 *
 * Test: tests/test_attention.c (make test).
 */
#include "block.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#define TQ 64
#define TK 128

size_t dt_attn_block_cpu_scratch(int64_t dim) {
    return (size_t)(TQ * dim + 2 * TK * dim + TQ * TK) * sizeof(float);
}

/* rows x [x0, x0+n) of one head into a contiguous fp32 [n, dim] tile */
static void pack_rows(float *dst, const void *base, dt_dtype dtype, int64_t row_stride,
                      int64_t x0, int64_t n, int64_t dim) {
    for (int64_t i = 0; i < n; i++) {
        int64_t off = (x0 + i) * row_stride;
        if (dtype == DT_F32) {
            memcpy(dst + i * dim, (const float *)base + off, (size_t)dim * sizeof(float));
        } else {
            const dt_bf16 *src = (const dt_bf16 *)base + off;
            for (int64_t d = 0; d < dim; d++) dst[i * dim + d] = dt_bf16_to_f32(src[d]);
        }
    }
}

dt_status dt_attn_block_cpu(const dt_attn_block_args *a, void *scratch) {
    const int64_t H = a->heads, G = a->kv_heads, D = a->dim, group = H / G;
    const int64_t nq = a->qseg.len, nk = a->kseg.len;
    const size_t es = dt_dtype_size(a->dtype);
    float *qt = scratch, *kt = qt + TQ * D, *vt = kt + TK * D, *s = vt + TK * D;

    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / group;
            const char *qb = (const char *)a->q + (size_t)(b * a->q_batch_stride + h * D) * es;
            const char *kb = (const char *)a->k + (size_t)(b * a->kv_batch_stride + g * D) * es;
            const char *vb = (const char *)a->v + (size_t)(b * a->kv_batch_stride + g * D) * es;
            float *m = a->m + b * a->ml_batch_stride + h * a->ml_head_stride;
            float *l = a->l + b * a->ml_batch_stride + h * a->ml_head_stride;
            float *acc = a->acc + b * a->acc_batch_stride + h * D;
            for (int64_t x0 = 0; x0 < nq; x0 += TQ) {
                const int64_t tq = nq - x0 < TQ ? nq - x0 : TQ;
                int packed_q = 0;
                for (int64_t y0 = 0; y0 < nk; y0 += TK) {
                    const int64_t tk = nk - y0 < TK ? nk - y0 : TK;
                    dt_attn_tile cls = dt_attn_tile_class(a->mask, a->qseg, x0, x0 + tq, a->kseg,
                                                          y0, y0 + tk);
                    if (cls == DT_TILE_EMPTY) continue;
                    if (!packed_q) {
                        pack_rows(qt, qb, a->dtype, H * D, x0, tq, D);
                        packed_q = 1;
                    }
                    pack_rows(kt, kb, a->dtype, G * D, y0, tk, D);
                    pack_rows(vt, vb, a->dtype, G * D, y0, tk, D);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tq, (int)tk, (int)D,
                                a->scale, qt, (int)D, kt, (int)D, 0.0f, s, (int)tk);
                    for (int64_t i = 0; i < tq; i++) {
                        float *row = s + i * tk;
                        if (cls == DT_TILE_PARTIAL) {
                            const int64_t pq = dt_attn_pos(a->qseg, x0 + i);
                            for (int64_t j = 0; j < tk; j++)
                                if (pq < dt_attn_pos(a->kseg, y0 + j)) row[j] = -INFINITY;
                        }
                        float mx = -INFINITY;
                        for (int64_t j = 0; j < tk; j++) mx = row[j] > mx ? row[j] : mx;
                        const float m_old = m[x0 + i];
                        const float m_new = mx > m_old ? mx : m_old;
                        float *acc_row = acc + (x0 + i) * H * D;
                        if (m_new == -INFINITY) {
                            /* nothing allowed yet for this row: P = 0 */
                            memset(row, 0, (size_t)tk * sizeof(float));
                            continue;
                        }
                        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                        float sum = 0.0f;
                        for (int64_t j = 0; j < tk; j++) {
                            row[j] = expf(row[j] - m_new);
                            sum += row[j];
                        }
                        l[x0 + i] = l[x0 + i] * alpha + sum;
                        m[x0 + i] = m_new;
                        if (alpha != 1.0f)
                            for (int64_t d = 0; d < D; d++) acc_row[d] *= alpha;
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)tq, (int)D, (int)tk,
                                1.0f, s, (int)tk, vt, (int)D, 1.0f, acc + x0 * H * D, (int)(H * D));
                }
            }
        }
    return DT_SUCCESS;
}

void dt_attn_finalize_cpu(dt_dtype dtype, int64_t batch, int64_t rows, int64_t heads, int64_t dim,
                          const float *acc, const float *m, const float *l, void *o, float *lse) {
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t x = 0; x < rows; x++) {
                const int64_t ml = (b * heads + h) * rows + x;
                const float inv = l[ml] > 0.0f ? 1.0f / l[ml] : 0.0f;
                lse[ml] = l[ml] > 0.0f ? m[ml] + logf(l[ml]) : -INFINITY;
                const int64_t base = ((b * rows + x) * heads + h) * dim;
                for (int64_t d = 0; d < dim; d++) {
                    const float v = acc[base + d] * inv;
                    if (dtype == DT_F32) ((float *)o)[base + d] = v;
                    else ((dt_bf16 *)o)[base + d] = dt_f32_to_bf16(v);
                }
            }
}
