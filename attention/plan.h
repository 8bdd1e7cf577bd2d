/* attention/plan.h — PRIVATE. What an attention call needs, derived from
 * its arguments without communicating: validated shapes, the sequence mesh
 * dim and order, local sizes; and the cross-rank agreement check. Shared by
 * the forward and backward passes. */
#ifndef DT_ATTN_PLAN_H
#define DT_ATTN_PLAN_H

#include "attention.h"
#include "block.h"
#include "../collectives/comm.h"

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
    float scale;
    dt_layout lse_layout;             /* of the [B, H, S] log-sum-exp */
    size_t kv_bytes;                  /* one local K (or V) block in its dtype */
    const dt_attn_kernels *kern;      /* the context's backend's kernels */
    dt_attention_tuning tuning;       /* opts->tuning, its kernel AUTO resolved from DT_ATTN_KERNEL */
} attn_plan;

/* Validate q, k, v and opts (NULL: defaults) and fill p. Touches nothing. */
dt_status attn_plan_make(const char *op, const dt_tensor *q, const dt_tensor *k,
                         const dt_tensor *v, const dt_attention_options *opts, attn_plan *p);

/* Whether the kernel the plan asks for (DT_ATTN_KERNEL; forward and
 * backward share the rule) can run
 * this call on this rank's backend: DT_SUCCESS, or DT_ERR_NOT_SUPPORTED
 * naming the rank, op and reason (DT_ATTN_KERNEL=mma on fp32, say). Local:
 * fold it into the status given to attn_plan_check_agreement. */
dt_status attn_plan_check_kernel(const attn_plan *p, const char *op);

/* Whether the caller's workspace (opts->workspace, if any) holds the
 * `needed` bytes the call asks of it: DT_SUCCESS, or DT_ERR_INVALID_ARGUMENT
 * naming the rank, op and size_fn (the size query). Local, as above. */
dt_status attn_plan_check_workspace(const attn_plan *p, const char *op,
                                    const dt_attention_options *opts, size_t needed,
                                    const char *size_fn);

/* COLLECTIVE over the world when q is on a mesh: every rank shares whether
 * its arguments passed its own checks (`local`) and the call's shapes,
 * dtype, mask, scale and Layout, so that a call that is bad or different on
 * one rank fails on all of them before any block moves. Returns `local` on a
 * rank whose own checks failed. */
dt_status attn_plan_check_agreement(const attn_plan *p, const char *op, dt_status local);

/* The segments (mask.h) of this rank's query rows and of rank src's key
 * rows: a ring step's one block. With one rank on the sequence, (0, 1, S):
 * every order keeps a lone rank's tokens in sequence order (zigzag's two
 * chunks are adjacent). */
void attn_plan_segments(const attn_plan *p, int src, dt_attn_segment *qs, dt_attn_segment *ks);

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
