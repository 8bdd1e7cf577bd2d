/* dtensor/dtensor.h — the umbrella header: include this one.
 *
 *   status.h      status codes, dt_last_error(), check macros
 *   dtype.h       fp32; bf16 and fp16 (stored 16-bit, computed fp32)
 *   log.h         DT_LOG levels, rank-prefixed lines
 *   context.h     dt_launch: N ranks as threads, the per-rank context
 *   comm.h        communicators and collectives (collectives/)
 *   ring.h        the ring rotator (collectives/)
 *   layout.h      placements, orders, Layouts, index maps (pure)
 *   mesh.h        device meshes of 1 to 3 dims
 *   tensor.h      the DTensor
 *   primitives.h  shard, gather, redistribute, replicate, permute_striped
 *   ops.h         matmul, add, gelu, swiglu reading Layouts, with their backward
 *   ops_nn.h      reshape, RMSNorm, rotary, embedding, cross-entropy, with their backward
 *   optim.h       the gradient norm, dtype conversion, AdamW
 */
#ifndef DT_DTENSOR_H
#define DT_DTENSOR_H

#include "../base/status.h"
#include "../base/dtype.h"
#include "../base/log.h"
#include "context.h"
#include "../collectives/comm.h"
#include "../collectives/ring.h"
#include "layout.h"
#include "mesh.h"
#include "tensor.h"
#include "primitives.h"
#include "ops.h"
#include "ops_nn.h"
#include "optim.h"

#endif /* DT_DTENSOR_H */
