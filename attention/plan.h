/* attention/plan.h — PRIVATE. What an attention call needs, derived from
 * its arguments without communicating: validated shapes, the sequence mesh
 * dim and order, local sizes; and the cross-rank agreement check. Shared by
 * the forward and backward passes. */
#ifndef DT_ATTN_PLAN_H
#define DT_ATTN_PLAN_H

#include "attention.h"
#include "block.h"
#include "../collectives/comm.h"
#include "../dtensor/docs.h"

typedef struct attn_plan {
    dt_context *ctx;
    const dt_mesh *mesh;
    dt_dtype dtype;
    int64_t B, S, H, Hkv, D;          /* global */
    int64_t b, c, h, hkv;             /* local: batch, rows, heads, kv heads */
    int sp_dim;                       /* mesh dim sharding S; -1 if none */
    int parts, rank;                  /* its size and this rank's coordinate */
    dt_order order;
    int group;                        /* ring steps per launch: mask.h's dt_attn_ring_group */
    dt_attn_mask mask;
    int64_t window;                   /* opts->window */
    const int64_t *doc_lens;          /* opts->doc_lens, doc_count (docs.h), borrowed */
    int64_t doc_count;
    int docs_per_row;                 /* a list per batch row (else one for all) */
    int ruled;                        /* documents or a window (mask.h's rule) */
    float scale;
    dt_layout lse_layout;             /* of the [B, H, S] log-sum-exp */
    size_t kv_bytes;                  /* one local K (or V) block in its dtype */
    const dt_attn_kernels *kern;      /* the context's backend's kernels */
    dt_attention_tuning tuning;       /* opts->tuning, its kernel AUTO resolved from DT_ATTN_KERNEL */
    int exact_nonfinite;              /* the kernels propagate NaN, Inf exactly (block.h) */
    int inputs_nonfinite;             /* some rank's input holds a NaN or Inf (check_call) */
} attn_plan;

/* Validate q, k, v and opts (NULL: defaults) and fill p. Touches nothing. */
dt_status attn_plan_make(const char *op, const dt_tensor *q, const dt_tensor *k,
                         const dt_tensor *v, const dt_attention_options *opts, attn_plan *p);

/* Local. DT_SUCCESS if the kernel asked for (DT_ATTN_KERNEL) can run this call
 * on this rank's backend, else DT_ERR_NOT_SUPPORTED with the reason; fold it
 * into the status given to attn_plan_check_agreement. Sets p->exact_nonfinite. */
dt_status attn_plan_check_kernel(attn_plan *p, const char *op);

/* Whether the caller's workspace (opts->workspace, if any) holds the
 * `needed` bytes the call asks of it: DT_SUCCESS, or DT_ERR_INVALID_ARGUMENT
 * naming the rank, op and size_fn (the size query). Local, as above. */
dt_status attn_plan_check_workspace(const attn_plan *p, const char *op,
                                    const dt_attention_options *opts, size_t needed,
                                    const char *size_fn);

/* COLLECTIVE over the world when q is on a mesh: ranks share `local` and the
 * call's shapes, dtype, mask, scale and Layout, so a call bad or different on
 * one rank fails on all before any block moves (that rank returns `local`). */
dt_status attn_plan_check_agreement(const attn_plan *p, const char *op, dt_status local);

/* The call's entry check: each input's largest |value| (a read of the local
 * shard; CUDA: waits for the queued work), with DT_CHECK a NaN or Inf among
 * them named (DT_ERR_NONFINITE), the agreement above, then, COLLECTIVE over
 * the world, the ranks' largest values against the bounds of fp32's range
 * (DT_ERR_OUT_OF_RANGE on every rank; non-finite inputs are not judged:
 * they propagate, and set p->inputs_nonfinite on every rank). in: q, k, v
 * and, backward, dout. */
dt_status attn_plan_check_call(attn_plan *p, const char *op, dt_status local,
                               const dt_tensor *const *in, const char *const *names, int n);

/* Where the inputs hold a NaN or Inf and the kernels do not propagate them
 * exactly (p->inputs_nonfinite && !p->exact_nonfinite): every element of the
 * n outputs becomes NaN, so that none is lost. Else nothing. Local. */
dt_status attn_plan_nonfinite_outputs(const attn_plan *p, dt_tensor *const *out, int n);

/* With DT_CHECK: an output holds no NaN or Inf (-inf allowed where
 * neg_inf_ok: lse), else DT_ERR_NONFINITE naming it and the global index. */
dt_status attn_plan_check_output(const attn_plan *p, const char *op, const dt_tensor *t,
                                 const char *name, int neg_inf_ok);

/* Segments (mask.h) of this rank's queries and rank src's keys: one ring
 * step's block. One rank on the sequence: (0, 1, S) in every order. */
void attn_plan_segments(const attn_plan *p, int src, dt_attn_segment *qs, dt_attn_segment *ks);

/* A call's documents as mask.h's rule reads them: per-position bounds of
 * `rows` tables (this rank's batch entries, or 1 for a list shared by all)
 * of S positions, on the host (for deciding which blocks run) and in backend
 * memory (for the kernels). Without documents both are NULL. */
typedef struct attn_docs {
    int64_t *host;      /* owned: malloc */
    int64_t *dev;       /* the same in the call's workspace (attn_docs_bytes) */
    int64_t rows, batch_stride;   /* batch_stride: elements between entries' tables, 0 if shared */
} attn_docs;

/* Workspace bytes of the call's document tables (0 without documents). */
size_t attn_docs_bytes(const attn_plan *p);

/* Builds the tables of q's local batch entries on the host and uploads them
 * to dev (attn_docs_bytes of backend memory; unused without documents).
 * Local. On failure d holds nothing to free. */
dt_status attn_docs_make(const attn_plan *p, const dt_tensor *q, void *dev, attn_docs *d);
void attn_docs_free(attn_docs *d);

/* The rule of the call for batch entry b, on the host's table. */
dt_attn_rule attn_plan_rule(const attn_plan *p, const attn_docs *d, int64_t b);

/* 1 if the rule allows some pair of the segments in some local batch entry:
 * a block that must run. */
int attn_plan_block_live(const attn_plan *p, const attn_docs *d, dt_attn_segment qs,
                         dt_attn_segment ks);

/* dt_attention_forward and _backward with opts->a2a_dim >= 0 (ulysses.c):
 * the same contract, COLLECTIVE over the world. */
dt_status attn_ulysses_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_options *opts, dt_tensor **o, dt_tensor **lse);
dt_status attn_ulysses_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                const dt_tensor *o, const dt_tensor *lse, const dt_tensor *dout,
                                const dt_attention_options *opts, dt_tensor **dq, dt_tensor **dk,
                                dt_tensor **dv);

/* Profiling of the ring loop (opts->timing; every call does nothing when it
 * is NULL): marks 2t and 2t+1 around step t's blocks, 2P after the loop.
 * begin reserves them before the loop; end reads them into *timing. */
dt_status attn_timing_begin(const attn_plan *p, const dt_attention_timing *timing);
dt_status attn_timing_mark(const attn_plan *p, const dt_attention_timing *timing, int i);
dt_status attn_timing_end(const attn_plan *p, dt_attention_timing *timing);

/* Rows of the local [b, h, c] per-row arrays (m, l, lse). */
static inline size_t attn_plan_rows(const attn_plan *p) { return (size_t)(p->b * p->h * p->c); }

/* Round a workspace part up to 64 bytes. */
static inline size_t attn_align(size_t n) { return (n + 63) & ~(size_t)63; }

#endif /* DT_ATTN_PLAN_H */
