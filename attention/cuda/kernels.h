/* attention/cuda/kernels.h — PRIVATE. The tensor-core block kernels,
 * forward (mma_fwd.cu, and for Hopper wgmma_fwd.cu) and
 * backward (mma_bwd.cu, and for Hopper wgmma_bwd.cu), each in two forms
 * (dt_attn_form), for the CUDA kernel table in block.cu, which chooses
 * between them and the simple kernels (DT_ATTN_KERNEL, tuning.h) by its
 * table of the paths verified on a GPU (dt_attn_cuda_path_of). All pass
 * their tests on the CPU emulator of CUDA (tests/emu); which passed on
 * which GPU, block.cu's table says.
 * Plain C; the stream crosses as void * (a cudaStream_t).
 */
#ifndef DT_ATTN_BLOCK_CUDA_MMA_H
#define DT_ATTN_BLOCK_CUDA_MMA_H

#include <stddef.h>
#include <stdint.h>
#include "../block.h"

/* Built a second time for test_mma_emu (DT_MMA_EMU_PREFIX, with
 * DT_CUDA_EMULATE: see common.cuh), the same functions carry an emu
 * prefix, so that they link beside the library's. */
#ifdef DT_MMA_EMU_PREFIX
#define dt_attn_mma_supported dt_emu_attn_mma_supported
#define dt_attn_mma_block_ok dt_emu_attn_mma_block_ok
#define dt_attn_mma_bwd_block_ok dt_emu_attn_mma_bwd_block_ok
#define dt_attn_mma_fwd dt_emu_attn_mma_fwd
#define dt_attn_mma_bwd dt_emu_attn_mma_bwd
#define dt_attn_wgmma_supported dt_emu_attn_wgmma_supported
#define dt_attn_wgmma_slots_ok dt_emu_attn_wgmma_slots_ok
#define dt_attn_wgmma_fwd dt_emu_attn_wgmma_fwd
#define dt_attn_wgmma_bwd dt_emu_attn_wgmma_bwd
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The two forms of every kernel, one source each (`if constexpr` where
 * they differ): VERIFIED, the code that has passed the CUDA suites and
 * compute-sanitizer on a GPU (block.cu's table says where), and LATEST,
 * the code with the changes no GPU has run yet. Where they differ: LATEST's
 * exponentials are exp2_ftz's, VERIFIED's exp2f's (common.cuh), in every
 * tensor-core kernel; the wgmma backward's LATEST stores dS by stmatrix,
 * adds dQ by bulk reductions, makes its k-steps' descriptors by
 * wg_desc_plus and loads lse and delta in pairs (wgmma_bwd.cu). The same
 * results either way up to rounding, for finite inputs. Non-finite
 * inputs: a LATEST block with nonfinite set (block.h) runs a second
 * instance of its kernel, which keeps block.h's non-finite rules (NaN row
 * maxima, non-finite logits made NaN, masking by select, o = 0 and lse =
 * -inf where l = 0); with nonfinite 0 it runs the same code as without
 * the rules. VERIFIED forms may lose a NaN or Inf (block.cu's
 * exact_nonfinite says 0 for them). Documents and windows (mask.h's rule
 * beyond the mask) run only in LATEST forms: block.cu's ruled_path says
 * which. The simple kernels' forms differ only in these two. */
typedef enum dt_attn_form {
    DT_ATTN_FORM_VERIFIED = 0,
    DT_ATTN_FORM_LATEST,
    DT_ATTN_FORM_COUNT
} dt_attn_form;

/* "verified", "latest"; "unknown" otherwise. */
static inline const char *dt_attn_form_name(dt_attn_form f) {
    return f == DT_ATTN_FORM_VERIFIED ? "verified" : f == DT_ATTN_FORM_LATEST ? "latest" : "unknown";
}

/* The CUDA kernels that can run a block. */
typedef enum dt_attn_cuda_kernel {
    DT_ATTN_CUDA_SIMPLE = 0,   /* block.cu's: every dtype and head dim */
    DT_ATTN_CUDA_MMA,          /* mma_fwd.cu, mma_bwd.cu */
    DT_ATTN_CUDA_WGMMA,        /* wgmma_fwd.cu, wgmma_bwd.cu */
    DT_ATTN_CUDA_KERNEL_COUNT
} dt_attn_cuda_kernel;

/* "simple", "mma", "wgmma"; "unknown" otherwise. */
static inline const char *dt_attn_cuda_kernel_name(dt_attn_cuda_kernel k) {
    return k == DT_ATTN_CUDA_SIMPLE ? "simple" : k == DT_ATTN_CUDA_MMA ? "mma"
           : k == DT_ATTN_CUDA_WGMMA ? "wgmma" : "unknown";
}

/* A kernel and its form. */
typedef struct dt_attn_cuda_path {
    dt_attn_cuda_kernel kernel;
    dt_attn_form form;
} dt_attn_cuda_path;

/* Which path runs a block (block.cu): choice k (tuning.h; AUTO as
 * resolved, not the environment) on a device of compute capability cc, for
 * dtype and head dim; `aligned`: the block's pointers suit the tensor-core
 * kernels (dt_attn_mma_block_ok or dt_attn_mma_bwd_block_ok, its reason
 * already in why otherwise); `backward`: the backward pass; kv_slots the
 * forward block's (block.h; 0 for the backward). AUTO takes the first entry
 * of block.cu's table of verified paths for cc that can run the block,
 * else the simple kernel; SIMPLE, MMA, WGMMA their VERIFIED forms, the
 * _LATEST choices their LATEST forms. 1 and *path; 0 if a forced kernel
 * cannot run the block, the reason in why (may be NULL). Host only, no device call
 * but the driver's tensor-map check where kv_slots > 1. */
int dt_attn_cuda_path_of(dt_attn_kernel_choice k, int cc, dt_dtype dtype, int64_t dim, int aligned,
                         int backward, int64_t kv_slots, dt_attn_cuda_path *path, char *why,
                         size_t why_size);

/* 1 if the kernels handle this dtype and head dim on a device of compute
 * capability cc (major * 10 + minor): bf16 or fp16, dim 64 or 128, cc >= 80.
 * Otherwise 0 and the reason in why (may be NULL). */
int dt_attn_mma_supported(dt_dtype dtype, int64_t dim, int cc, char *why, size_t why_size);

/* 1 if one block's arguments also meet the kernel's other needs: q, k, v
 * 16-byte aligned with batch strides of whole 16-byte rows (cp.async), acc
 * 8-byte aligned, o (a last block's) 4-byte aligned, segment lengths below
 * 2^31 - 64, a grid within 2^31 - 1 blocks. Otherwise 0 and why. */
int dt_attn_mma_block_ok(const dt_attn_block_args *a, char *why, size_t why_size);

/* The same for one backward block: q, dout, k, v 16-byte aligned with
 * batch strides of whole 16-byte rows, dk, dv 8-byte aligned, dq 16-byte
 * aligned with a batch stride of whole 16 bytes,
 * segment lengths below 2^31 - 64, a grid within 2^31 - 1 blocks, and
 * heads / kv_heads x ceil(qseg.len / 64) within 2^31 - 1 (a CTA's walk). */
int dt_attn_mma_bwd_block_ok(const dt_attn_block_bwd_args *a, char *why, size_t why_size);

/* Runs one forward block (same contract as dt_attn_kernels.fwd) on `stream`.
 * The caller has checked dt_attn_mma_supported and dt_attn_mma_block_ok.
 * l2_bytes: the device's L2 size, for the launch order (mma_layout.h;
 * any value gives the same results). With dependent != 0 (only on a
 * device of compute capability 9.0 or newer), a block that is not the
 * call's first is launched as a programmatic dependent of the kernel
 * before it on the stream (the call's block before): it starts while that
 * one finishes and waits for it only before its rows' merge
 * (wgmma_fwd.cu says more), or with a->visits only for its rows'
 * counts (block.h). form: which of the kernel's forms runs
 * (dt_attn_form); a block with documents or a window (block.h's docs,
 * window) runs in the LATEST form only, the VERIFIED one returning
 * DT_ERR_NOT_SUPPORTED before it launches (the same in the three kernels
 * below). Returns DT_ERR_BACKEND with CUDA's message if the launch fails. */
dt_status dt_attn_mma_fwd(void *stream, const dt_attn_block_args *a, int64_t l2_bytes,
                          int dependent, dt_attn_form form);

/* Runs one backward block (same contract as dt_attn_kernels.bwd, dq added
 * with atomics) on `stream` (mma_bwd.cu). The caller has checked
 * dt_attn_mma_supported and dt_attn_mma_bwd_block_ok; l2_bytes as for the
 * forward. With dependent != 0 (only on a device of compute capability 9.0
 * or newer), a block that continues a call (a->continues) is launched as a
 * programmatic dependent of the block before it: every CTA lets the next
 * block start at its own start and waits for the block before only before
 * it exits, so that a block completes after the one before. form: as for
 * the forward. Returns DT_ERR_BACKEND with CUDA's message if the launch
 * fails. */
dt_status dt_attn_mma_bwd(void *stream, const dt_attn_block_bwd_args *a, int64_t l2_bytes,
                          int dependent, dt_attn_form form);

/* The Hopper forward kernel (wgmma_fwd.cu: wgmma, sm_90a). 1 if it
 * handles this dtype and head dim on a device of compute capability cc:
 * what dt_attn_mma_supported takes, on a 9.0 device, in a build whose
 * device code is for sm_90 (NVCC_ARCH); otherwise 0 and why. Its blocks
 * have the needs of dt_attn_mma_block_ok. */
int dt_attn_wgmma_supported(dt_dtype dtype, int64_t dim, int cc, char *why, size_t why_size);

/* 1 if the wgmma forward can read keys interleaved from slots
 * (dt_attn_block_args.kv_slots): whether the CUDA driver takes the 5-D
 * tensor maps they need (ptx_sm90.cuh's encode_map), asked once per
 * process. Otherwise 0 and the reason in why (may be NULL); the forward's
 * auto choice then runs such blocks on the next verified path (the mma
 * kernel). */
int dt_attn_wgmma_slots_ok(char *why, size_t why_size);

/* The wgmma forward's narrow tiles at D = 128 (docs/KERNELS.md): 1,
 * or 0 to compile them out (make WGMMA_NARROW=0), for measuring the kernel
 * without them (scripts/gpu_pack.sh --bisect "HEAD:WGMMA_NARROW=0"). */
#ifndef DT_WGMMA_NARROW
#define DT_WGMMA_NARROW 1
#endif

/* Bytes of the wgmma forward's tile queue. */
#define DT_ATTN_WGMMA_QUEUE_BYTES 8

/* Runs one forward block on `stream` with the wgmma kernel, as
 * dt_attn_mma_fwd (same contract, l2_bytes, form and error). With sms > 0 and a
 * queue (DT_ATTN_WGMMA_QUEUE_BYTES of device memory, 4-byte aligned), the
 * kernel runs persistent where the block has more query tiles than the
 * device holds CTAs: as many CTAs as sms SMs hold, each taking the next
 * tile in the launch order from the queue when it starts the last key tile
 * of its current one, whose loads then fly beside that tile's math.
 * Otherwise (sms = 0, no queue, or a->transfer) a CTA per query tile. The queue is
 * cleared on `stream` before a call's first block (a->first) and left
 * clear by every launch: the blocks of a call share it, one after another
 * on one stream. dependent: as for dt_attn_mma_fwd; a dependent block
 * waits for the one before also before it takes from the queue, and one
 * with a->visits (the rows' waits, block.h) runs a CTA per query tile.
 * producer: at D = 128, nonzero for the loads by a producer warpgroup
 * (wgmma_fwd.cu), 0 for thread 0's; the same results either way,
 * only the speed may differ. */
dt_status dt_attn_wgmma_fwd(void *stream, const dt_attn_block_args *a, int64_t l2_bytes, int sms,
                            void *queue, int dependent, int producer, dt_attn_form form);

/* Runs one backward block on `stream` with the wgmma backward kernel
 * (wgmma_bwd.cu), as dt_attn_mma_bwd (same contract, l2_bytes,
 * dependent, form and error). It runs where dt_attn_wgmma_supported says the
 * forward does; its blocks have the needs of dt_attn_mma_bwd_block_ok. */
dt_status dt_attn_wgmma_bwd(void *stream, const dt_attn_block_bwd_args *a, int64_t l2_bytes,
                            int dependent, dt_attn_form form);

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_BLOCK_CUDA_MMA_H */
