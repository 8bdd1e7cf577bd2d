/* attention/cuda/block.cu — the CUDA attention kernels.
 *
 * STATUS: everything here is built (nvcc, sm_90 by default), runs on the
 * CPU emulator of CUDA (tests/emu: `make CUDA=emu test`, and test_mma_emu
 * for the tensor-core kernels in every `make test`), and passed the
 * "forward/cuda-kernels/..." and "backward/cuda-kernels/..." cases on an
 * H100 (2026-11-22) and an H200 (2026-11-26; racecheck and synccheck
 * too).
 *
 * Same contract and mask rule as block_cpu.c (block.h). Forward: three
 * kernels, chosen per block by fwd():
 *   - wgmma (wgmma_fwd.cu): Hopper warpgroup MMA fed by TMA, bf16 /
 *     fp16, head dim 64 or 128, compute capability 9.0 and an sm_90 build,
 *     16-byte aligned q, k, v; used by default where it can run (1.16x to
 *     1.62x FlashAttention-2's forward on an H200: docs/PERFORMANCE.md).
 *   - mma (mma_fwd.cu): FlashAttention-2 style on tensor cores, for
 *     bf16 / fp16, head dim 64 or 128, compute capability >= 8.0, with
 *     16-byte aligned q, k, v; used by default where wgmma cannot run.
 *   - simple (here): one thread per query row of one (batch, head), blocks
 *     of 64 rows; key tiles of 64 whose class (mask.h) is computed once per
 *     thread block: empty tiles are skipped, full tiles are not masked.
 *     Each thread keeps its row's running max and sum in registers and its
 *     unnormalised output in the fp32 acc array, which it alone writes. K
 *     and V tiles are staged in shared memory as fp32 (bf16 / fp16 are
 *     widened on load). Every dtype and head dim; the fallback, and the
 *     in-tree cross-check of the tensor-core kernels.
 * DT_ATTN_KERNEL=auto|simple|mma|wgmma (read by the attention plan, once
 * per call, and passed in dt_attn_block_args.kernel) picks: auto as above,
 * simple always, mma or wgmma or DT_ERR_NOT_SUPPORTED naming what is
 * missing (checked before the ring loop by kernel_check; alignment per
 * block).
 *
 * Backward: three kernels too, chosen per block by bwd() with the
 * forward's checks (dt_attn_mma_supported or dt_attn_wgmma_supported, and
 * dt_attn_mma_bwd_block_ok for alignment):
 *   - wgmma (wgmma_bwd.cu): Hopper warpgroup MMA fed by TMA, a
 *     CTA per 128 keys of a kv head. The default backward where it can run
 *     (1.5x to 1.8x the mma one on an H200, 2026-11-26:
 *     docs/PERFORMANCE_HISTORY.md).
 *   - mma (mma_bwd.cu): FlashAttention-2 structure on tensor
 *     cores (a CTA per 128 keys of a kv head, dK and dV in registers over
 *     the query tiles of its group's heads, dQ added with atomics). The
 *     default backward elsewhere from compute capability 8.0.
 *   - simple (here; FlashAttention-2 math, no atomics): one kernel in which
 *     each thread owns a query row and accumulates dQ over the keys; one in
 *     which each thread owns a key row of a kv head and accumulates dK, dV
 *     over the queries of every head in its group.
 * All recompute P from the forward's lse.
 *
 * Everything runs on the backend's compute stream; errors of a launch are
 * read with cudaGetLastError and returned as DT_ERR_BACKEND.
 *
 * Test: tests/test_attention.c, tests/test_attention_backward.c on a GPU
 * (make test), against the CPU backend's results and the double reference.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "../block.h"
#include "kernels.h"
#include "../../dtensor/backend_cuda.h"
}
#include "../../base/cuda_launch.cuh"

#define TQ 64
#define TK 64

namespace {

__device__ __forceinline__ float load(const void *p, dt_dtype dt, int64_t i) {
    if (dt == DT_F32) return static_cast<const float *>(p)[i];
    if (dt == DT_BF16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    return __half2float(static_cast<const __half *>(p)[i]);
}

__device__ __forceinline__ void store_val(void *p, dt_dtype dt, int64_t i, float v) {
    if (dt == DT_F32) static_cast<float *>(p)[i] = v;
    else if (dt == DT_BF16) static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
    else static_cast<__half *>(p)[i] = __float2half_rn(v);
}

__device__ __forceinline__ int64_t pos(dt_attn_segment s, int64_t x) { return dt_attn_pos(s, x); }

/* grid: (ceil(nq / TQ), heads, batch); block: TQ threads; shared: 2 * TK * D floats. */
__global__ void fwd_kernel(dt_attn_block_args a) {
    DT_DYNAMIC_SMEM(float, smem);
    const int64_t D = a.dim, H = a.heads, G = a.kv_heads;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G);
    const int64_t x0 = (int64_t)blockIdx.x * TQ, x = x0 + threadIdx.x;
    const int64_t nq = a.qseg.len, nk = a.kseg.len;
    const int64_t x1 = x0 + TQ < nq ? x0 + TQ : nq;
    const bool active = x < nq;
    float *ks = smem, *vs = smem + TK * D;
    const int64_t qoff = b * a.q_batch_stride + (x * H + h) * D;
    const int64_t kvb = b * a.kv_batch_stride + g * D;
    float *m = a.m + b * a.ml_batch_stride + h * a.ml_head_stride;
    float *l = a.l + b * a.ml_batch_stride + h * a.ml_head_stride;
    float *acc = a.acc + b * a.acc_batch_stride + (x * H + h) * D;
    float mi = active && !a.first ? m[x] : -INFINITY, li = active && !a.first ? l[x] : 0.0f;
    if (active && a.first)
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    const int64_t pq = active ? pos(a.qseg, x) : 0;
    float s[TK];
    for (int64_t y0 = 0; y0 < nk; y0 += TK) {
        const int64_t y1 = y0 + TK < nk ? y0 + TK : nk, tk = y1 - y0;
        const dt_attn_tile cls = dt_attn_tile_class(a.mask, a.qseg, x0, x1, a.kseg, y0, y1);
        if (cls == DT_TILE_EMPTY) continue;   /* uniform across the block */
        __syncthreads();
        for (int64_t e = threadIdx.x; e < tk * D; e += blockDim.x) {
            const int64_t j = e / D, d = e % D;
            const int64_t off = kvb + dt_attn_key_row(y0 + j, a.kv_slots, a.kv_slot_rows) * G * D + d;
            ks[e] = load(a.k, a.dtype, off);
            vs[e] = load(a.v, a.dtype, off);
        }
        __syncthreads();
        if (!active) continue;
        float mx = -INFINITY;
        for (int64_t j = 0; j < tk; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++) dot += load(a.q, a.dtype, qoff + d) * ks[j * D + d];
            dot *= a.scale;
            if (cls == DT_TILE_PARTIAL && pq < pos(a.kseg, y0 + j)) dot = -INFINITY;
            s[j] = dot;
            mx = fmaxf(mx, dot);
        }
        const float m_new = fmaxf(mi, mx);
        if (m_new == -INFINITY) continue;
        const float alpha = mi == -INFINITY ? 0.0f : __expf(mi - m_new);
        float sum = 0.0f;
        for (int64_t j = 0; j < tk; j++) {
            s[j] = __expf(s[j] - m_new);
            sum += s[j];
        }
        li = li * alpha + sum;
        mi = m_new;
        for (int64_t d = 0; d < D; d++) {
            float o = acc[d] * alpha;
            for (int64_t j = 0; j < tk; j++) o += s[j] * vs[j * D + d];
            acc[d] = o;
        }
    }
    if (!active) return;
    if (a.last) {   /* the call's last block: o and lse instead of m, l, acc */
        const float inv = li > 0.0f ? 1.0f / li : 0.0f;
        a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x] =
            li > 0.0f ? mi + logf(li) : -INFINITY;
        for (int64_t d = 0; d < D; d++) store_val(a.o, a.dtype, qoff + d, acc[d] * inv);
    } else {
        m[x] = mi;
        l[x] = li;
    }
}

/* delta: one warp per output row r (of batch x rows x heads), its lanes over
 * the row's dim elements, so every access of a warp is one contiguous run
 * (a thread per row made each access a 32-way scatter). */
constexpr int ROW_WARPS = 8;   /* rows per block of 256 threads */

__device__ __forceinline__ int64_t ml_index(int64_t r, int64_t rows, int64_t heads) {
    const int64_t h = r % heads, x = (r / heads) % rows, b = r / (heads * rows);
    return (b * heads + h) * rows + x;
}

__global__ void delta_kernel(dt_dtype dt, int64_t batch, int64_t rows, int64_t heads, int64_t dim,
                             const void *o, const void *dout, float *delta) {
    const int64_t n = batch * rows * heads;
    const int lane = (int)threadIdx.x & 31;
    for (int64_t r = blockIdx.x * (int64_t)ROW_WARPS + (threadIdx.x >> 5); r < n;
         r += (int64_t)gridDim.x * ROW_WARPS) {
        float sum = 0.0f;
        for (int64_t d = lane; d < dim; d += 32)
            sum += load(o, dt, r * dim + d) * load(dout, dt, r * dim + d);
        for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
        if (lane == 0) delta[ml_index(r, rows, heads)] = sum;
    }
}

__global__ void store_kernel(dt_dtype dt, size_t n, const float *src, void *dst) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        store_val(dst, dt, (int64_t)i, src[i]);
}

/* P and dS of one (query x of head h, key y) pair; returns 0 for masked pairs. */
__device__ __forceinline__ void pair_grad(const dt_attn_block_bwd_args &a, int64_t b, int64_t h,
                                          int64_t g, int64_t x, int64_t y, float lse, float delta,
                                          float *p_out, float *ds_out) {
    const int64_t D = a.dim, H = a.heads, G = a.kv_heads;
    *p_out = *ds_out = 0.0f;
    if (lse == -INFINITY) return;
    if (a.mask == DT_ATTN_CAUSAL && pos(a.qseg, x) < pos(a.kseg, y)) return;
    const int64_t qo = b * a.q_batch_stride + (x * H + h) * D;
    const int64_t ko = b * a.kv_batch_stride + (y * G + g) * D;
    float dot = 0.0f, dp = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        dot += load(a.q, a.dtype, qo + d) * load(a.k, a.dtype, ko + d);
        dp += load(a.dout, a.dtype, qo + d) * load(a.v, a.dtype, ko + d);
    }
    const float p = __expf(a.scale * dot - lse);
    *p_out = p;
    *ds_out = p * (dp - delta);
}

/* grid: (ceil(nq / 128), heads, batch): each thread owns dQ of one query row. */
__global__ void bwd_dq_kernel(dt_attn_block_bwd_args a) {
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (a.heads / a.kv_heads);
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= a.qseg.len) return;
    const int64_t D = a.dim, G = a.kv_heads;
    const float lse = a.lse[b * a.ml_batch_stride + h * a.ml_head_stride + x];
    const float delta = a.delta[b * a.ml_batch_stride + h * a.ml_head_stride + x];
    float *dq = a.dq + b * a.dq_batch_stride + (x * a.heads + h) * D;
    for (int64_t y = 0; y < a.kseg.len; y++) {
        /* Skip keys after the query's position (causal) without touching memory. */
        if (a.mask == DT_ATTN_CAUSAL && pos(a.qseg, x) < pos(a.kseg, y)) continue;
        float p, ds;
        pair_grad(a, b, h, g, x, y, lse, delta, &p, &ds);
        if (ds == 0.0f) continue;
        const int64_t ko = b * a.kv_batch_stride + (y * G + g) * D;
        for (int64_t d = 0; d < D; d++) dq[d] += a.scale * ds * load(a.k, a.dtype, ko + d);
    }
}

/* grid: (ceil(nk / 128), kv_heads, batch): each thread owns dK, dV of one key row. */
__global__ void bwd_dkv_kernel(dt_attn_block_bwd_args a) {
    const int64_t b = blockIdx.z, g = blockIdx.y, group = a.heads / a.kv_heads;
    const int64_t y = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (y >= a.kseg.len) return;
    const int64_t D = a.dim, H = a.heads;
    float *dk = a.dk + b * a.kv_batch_stride + (y * a.kv_heads + g) * D;
    float *dv = a.dv + b * a.kv_batch_stride + (y * a.kv_heads + g) * D;
    if (a.first)   /* written, not added into: this thread owns the row */
        for (int64_t d = 0; d < D; d++) dk[d] = dv[d] = 0.0f;
    for (int64_t h = g * group; h < (g + 1) * group; h++)
        for (int64_t x = 0; x < a.qseg.len; x++) {
            if (a.mask == DT_ATTN_CAUSAL && pos(a.qseg, x) < pos(a.kseg, y)) continue;
            const int64_t r = b * a.ml_batch_stride + h * a.ml_head_stride + x;
            float p, ds;
            pair_grad(a, b, h, g, x, y, a.lse[r], a.delta[r], &p, &ds);
            const int64_t qo = b * a.q_batch_stride + (x * H + h) * D;
            for (int64_t d = 0; d < D; d++) {
                dv[d] += p * load(a.dout, a.dtype, qo + d);
                dk[d] += a.scale * ds * load(a.q, a.dtype, qo + d);
            }
        }
}

dt_status launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return DT_SUCCESS;
    return dt_error(DT_ERR_BACKEND, "attention (cuda): %s: %s", what, cudaGetErrorString(e));
}

cudaStream_t stream_of(dt_backend *be) {
    return static_cast<cudaStream_t>(dt_backend_cuda_compute_stream(be));
}

unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 ? (b ? b : 1) : 65535);
}

/* The forward's scratch: the persistent wgmma kernel's tile queue, then
 * the rows' counts of dependent launch mode 2 (block.h's visits), one
 * per 16 query rows of each query sequence. */
int64_t rows_counts(int64_t seqs, int64_t len) { return seqs * ((len + 15) / 16); }
size_t fwd_scratch(int64_t dim, int64_t seqs, int64_t len) {
    (void)dim;
    return DT_ATTN_WGMMA_QUEUE_BYTES + (size_t)rows_counts(seqs, len) * sizeof(uint32_t);
}
size_t bwd_scratch(int64_t dim) { (void)dim; return 0; }

/* Plan time (once per call): can the requested kernel run this dtype and
 * head dim on this device? Only a forced mma or wgmma can fail (the same
 * answer for the forward and the backward). */
dt_status kernel_check(dt_backend *be, dt_dtype dtype, int64_t dim, dt_attn_kernel_choice want,
                       char *why, size_t why_size) {
    const int cc = dt_backend_cuda_compute_capability(be);
    int ok = 1;
    if (want == DT_ATTN_KERNEL_MMA) ok = dt_attn_mma_supported(dtype, dim, cc, why, why_size);
    if (want == DT_ATTN_KERNEL_WGMMA) ok = dt_attn_wgmma_supported(dtype, dim, cc, why, why_size);
    return ok ? DT_SUCCESS : DT_ERR_NOT_SUPPORTED;
}

/* The kernel that runs a block, forward and backward alike: the choice's
 * (auto: wgmma where it can run, else mma, else simple). `aligned`: the
 * block's pointers suit the tensor-core kernels (dt_attn_mma_block_ok or
 * dt_attn_mma_bwd_block_ok, its reason in why otherwise). 0 if a forced
 * mma or wgmma cannot run it, with the reason in why. */
enum kernel_path { PATH_SIMPLE, PATH_MMA, PATH_WGMMA };

int path_of(dt_backend *be, dt_attn_kernel_choice k, dt_dtype dtype, int64_t dim, int aligned,
            kernel_path *path, char *why, size_t why_size) {
    *path = PATH_SIMPLE;
    if (k == DT_ATTN_KERNEL_SIMPLE) return 1;
    const int cc = dt_backend_cuda_compute_capability(be);
    const int auto_ = k == DT_ATTN_KERNEL_AUTO;
    if ((auto_ || k == DT_ATTN_KERNEL_WGMMA) &&
        dt_attn_wgmma_supported(dtype, dim, cc, why, why_size) && aligned)
        *path = PATH_WGMMA;
    else if ((auto_ || k == DT_ATTN_KERNEL_MMA) &&
             dt_attn_mma_supported(dtype, dim, cc, why, why_size) && aligned)
        *path = PATH_MMA;
    else if (!auto_)
        return 0;
    return 1;
}

/* How the tensor-core kernels' blocks that continue a call are launched
 * (dt_attention_tuning.dependent_launch): 0 after the block before has
 * completed, 1 as its programmatic dependents, 2 the same with the
 * forward's rows' waits; dependent launches need compute capability 9.0. */
int dependent_launches(dt_backend *be, const dt_attention_tuning &t) {
    return dt_backend_cuda_compute_capability(be) >= 90 ? t.dependent_launch : 0;
}

/* The forward's: path_of, but a block with no key (its rows only started
 * or finished) takes the simple kernel: a tensor map of 0 rows cannot even
 * be made. */
int fwd_path_of(dt_backend *be, const dt_attn_block_args *a, kernel_path *path, char *why,
                size_t why_size) {
    *path = PATH_SIMPLE;
    if (a->tuning.kernel == DT_ATTN_KERNEL_SIMPLE || a->kseg.len == 0) return 1;
    const int ok = path_of(be, a->tuning.kernel, a->dtype, a->dim, dt_attn_mma_block_ok(a, why, why_size),
                           path, why, why_size);
    /* keys interleaved (a grouped striped ring) where the driver takes no
     * tensor map of them: the mma kernel, or for a forced wgmma none */
    if (ok && *path == PATH_WGMMA && a->kv_slots > 1 && !dt_attn_wgmma_slots_ok(why, why_size)) {
        if (a->tuning.kernel == DT_ATTN_KERNEL_WGMMA) return 0;
        *path = PATH_MMA;
    }
    return ok;
}

/* Nothing to do: no row, or no pair the mask allows (no key, or every key
 * after every query: a contiguous ring's blocks from ranks after this one)
 * and nothing to start or finish (28 of the 64 blocks at P = 8: forward.c
 * finishes a rank's rows at its last block with a pair). Then nothing is
 * launched; the stream order and the next block's dependence on the one
 * before are the same without the launch, which would write nothing. */
bool fwd_idle(const dt_attn_block_args *a) {
    if (a->qseg.len == 0 || a->batch == 0 || a->heads == 0) return true;
    return !a->first && !a->last && dt_attn_no_pairs(a->mask, a->qseg, a->kseg);
}

/* Dependent launch mode 2 (the rows' waits): the counts in scratch,
 * zeroed on the stream before the call's first block, and the call's
 * count of counted blocks so far restarted there (block.h's launches). */
dt_status rows_start(dt_backend *be, const dt_attn_block_args *a, void *scratch) {
    *a->launches = 0;
    const size_t bytes = (size_t)rows_counts(a->batch * a->heads, a->qseg.len) * sizeof(uint32_t);
    if (cudaMemsetAsync(static_cast<char *>(scratch) + DT_ATTN_WGMMA_QUEUE_BYTES, 0, bytes,
                        stream_of(be)) == cudaSuccess)
        return DT_SUCCESS;
    return launched("forward block: clearing the rows' counts");
}

dt_status fwd(dt_backend *be, const dt_attn_block_args *a, void *scratch) {
    if (fwd_idle(a)) return DT_SUCCESS;
    kernel_path path;
    char why[256] = "";
    if (!fwd_path_of(be, a, &path, why, sizeof why))
        return dt_error(DT_ERR_NOT_SUPPORTED, "rank %d: attention (cuda): DT_ATTN_KERNEL=%s: %s",
                        be->rank, dt_attn_kernel_choice_name(a->tuning.kernel), why);
    const int dependent = dependent_launches(be, a->tuning);
    const bool counted = dependent == 2 && a->launches;
    if (counted && a->first) DT_TRY(rows_start(be, a, scratch));
    dt_attn_block_args b = *a;
    if (counted && path != PATH_SIMPLE) {   /* the simple kernel's blocks do not count */
        b.visits = reinterpret_cast<uint32_t *>(static_cast<char *>(scratch) +
                                                DT_ATTN_WGMMA_QUEUE_BYTES);
        b.visit = (*a->launches)++;
    }
    if (path == PATH_WGMMA) {
        const int persistent = a->tuning.persistent;
        if (persistent == 2) b.transfer = 0;   /* persistent even beside a transfer */
        return dt_attn_wgmma_fwd(stream_of(be), &b, dt_backend_cuda_l2_bytes(be),
                                 persistent ? dt_backend_cuda_sms(be) : 0, scratch, dependent,
                                 a->tuning.producer);
    }
    if (path == PATH_MMA)
        return dt_attn_mma_fwd(stream_of(be), &b, dt_backend_cuda_l2_bytes(be), dependent);
    if (!a->acc || !a->m || !a->l)   /* fwd_stateless promised a tensor-core kernel */
        return dt_error(DT_ERR_INTERNAL, "rank %d: attention (cuda): a block without running "
                        "state reached the simple forward kernel", be->rank);
    dim3 grid((unsigned)((a->qseg.len + TQ - 1) / TQ), (unsigned)a->heads, (unsigned)a->batch);
    size_t smem = 2 * TK * (size_t)a->dim * sizeof(float);   /* up to 128 KiB at D = 256 */
    if (cudaFuncSetAttribute(fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess)
        return launched("forward block: shared memory size");
    dt_cuda_launch(fwd_kernel, grid, TQ, smem, stream_of(be), *a);
    return launched("forward block");
}

/* The tensor-core kernels start and finish a block's rows in registers
 * (mma_fwd.cu, wgmma_fwd.cu); the simple one works in acc. */
int fwd_stateless(dt_backend *be, const dt_attn_block_args *a) {
    if (!a->first || !a->last) return 0;
    if (fwd_idle(a)) return 1;
    kernel_path path;
    char why[256];
    return fwd_path_of(be, a, &path, why, sizeof why) && path != PATH_SIMPLE;
}

dt_status delta_rows(dt_backend *be, dt_dtype dtype, int64_t batch, int64_t rows, int64_t heads,
                     int64_t dim, const void *o, const void *dout, float *delta) {
    size_t n = (size_t)(batch * rows * heads);
    dt_cuda_launch(delta_kernel, blocks_for(n, ROW_WARPS), 32 * ROW_WARPS, 0, stream_of(be),
                   dtype, batch, rows, heads, dim, o, dout, delta);
    return launched("delta");
}

dt_status bwd(dt_backend *be, const dt_attn_block_bwd_args *a, void *scratch) {
    (void)scratch;
    if (a->kseg.len == 0 || a->batch == 0 || a->heads == 0) return DT_SUCCESS;   /* no rows */
    /* no pair: dq, dk, dv unchanged (nothing launched), or (first) dk, dv 0 */
    if (!a->first && dt_attn_no_pairs(a->mask, a->qseg, a->kseg)) return DT_SUCCESS;
    const bool no_query = a->qseg.len == 0;
    if (!no_query) {
        kernel_path path;
        char why[256] = "";
        if (!path_of(be, a->tuning.kernel, a->dtype, a->dim, dt_attn_mma_bwd_block_ok(a, why, sizeof why),
                     &path, why, sizeof why))
            return dt_error(DT_ERR_NOT_SUPPORTED,
                            "rank %d: attention (cuda): backward: DT_ATTN_KERNEL=%s: %s", be->rank,
                            dt_attn_kernel_choice_name(a->tuning.kernel), why);
        const int dependent = dependent_launches(be, a->tuning);
        if (path == PATH_WGMMA)
            return dt_attn_wgmma_bwd(stream_of(be), a, dt_backend_cuda_l2_bytes(be), dependent);
        if (path == PATH_MMA)
            return dt_attn_mma_bwd(stream_of(be), a, dt_backend_cuda_l2_bytes(be), dependent);
    }
    if (!no_query) {
        dim3 gq((unsigned)((a->qseg.len + 127) / 128), (unsigned)a->heads, (unsigned)a->batch);
        dt_cuda_launch(bwd_dq_kernel, gq, 128, 0, stream_of(be), *a);
        DT_TRY(launched("backward dq"));
    }
    dim3 gk((unsigned)((a->kseg.len + 127) / 128), (unsigned)a->kv_heads, (unsigned)a->batch);
    dt_cuda_launch(bwd_dkv_kernel, gk, 128, 0, stream_of(be), *a);
    return launched("backward dk dv");
}

dt_status store(dt_backend *be, dt_dtype dtype, size_t n, const float *src, void *dst) {
    dt_cuda_launch(store_kernel, blocks_for(n, 256), 256, 0, stream_of(be), dtype, n, src, dst);
    return launched("store");
}

}  // namespace

extern "C" const dt_attn_kernels dt_attn_kernels_cuda = {
    "cuda", fwd_scratch, bwd_scratch, kernel_check, fwd, fwd_stateless, delta_rows, bwd, store,
};
