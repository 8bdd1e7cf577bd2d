/* tests/emu/emu.h — a CPU emulator for CUDA kernels, enough to run the
 * tensor-core attention kernels (attention/block_cuda_mma*.cu) on machines
 * without a GPU, in `make test`.
 *
 * The CUDA sources are compiled unchanged by the host C++ compiler with
 * -DDT_CUDA_EMULATE and tests/emu/include first on the include path: there
 * cuda_runtime.h, cuda_bf16.h and cuda_fp16.h are this emulator's
 * (cuda_emu.h; the host API: cuda_runtime_api.h, cublas_v2.h and
 * cudart.c), base/cuda_launch.cuh launches kernels with dt_emu_launch,
 * and attention/cuda/common.cuh calls the functions below in place of its
 * inline PTX. Every CUDA thread of a block is a fiber
 * (ucontext) with its own stack; the blocks of a grid run one after
 * another, the fibers of a block each until it waits (or completes a named
 * barrier's phase), then the first runnable one from a leading warp that
 * changes from block to block, so that one warp runs ahead of the others
 * as far as its synchronisation lets it.
 *
 * What is emulated, from the PTX ISA and the CUDA programming guide:
 *   - __syncthreads: waits for every thread of the block that has not
 *     exited; named barriers (bar.sync / bar.arrive with an id and a thread
 *     count);
 *   - warp-wide instructions (shfl.bfly, ldmatrix and stmatrix .x4 [.trans],
 *     mma.sync.m16n8k16 bf16/f16 -> f32): every lane of the warp must reach
 *     the same instruction; the last to arrive computes all 32 results
 *     from the 32 lanes' operands;
 *   - cp.async 16 bytes, commit_group, wait_group N: a copy's destination
 *     holds garbage (0xff bytes: NaN in bf16 and fp16) from the issue until
 *     the wait_group that completes it, and is written then. Reading a
 *     destination too early, or writing it while the copy is pending,
 *     therefore shows (NaN results, or an error);
 *   - Hopper warpgroup MMA (wgmma.mma_async.m64nNk16.f32.{bf16,f16}, A from
 *     registers or shared memory, B from shared memory, 128-byte swizzle;
 *     wgmma.fence, commit_group, wait_group; fence.proxy.async): every
 *     thread of the warpgroup (128 consecutive threads) must reach the same
 *     instruction; the last to arrive computes all 128 results, which reach
 *     the accumulator registers only at the wgmma.wait_group that completes
 *     them (until then the registers hold a NaN);
 *   - the bulk reduction cp.reduce.async.bulk .add.f32 from shared to
 *     global memory, with its bulk groups (dt_emu_bulk_reduce_add_f32);
 *   - Hopper mbarriers (init, arrive, arrive.expect_tx, try_wait.parity,
 *     fence.mbarrier_init) and the tensor copy cp.async.bulk.tensor (TMA:
 *     tiled boxes of a tensor map from cuTensorMapEncodeTiled, zero fill out
 *     of bounds, 32/64/128-byte swizzle), the copies deferred until a wait
 *     on their mbarrier needs them (see dt_emu_tma_load);
 *   - dynamic shared memory: one heap block of exactly the launch's size,
 *     filled with 0xff bytes before each block (AddressSanitizer sees any
 *     access past it);
 *   - atomicAdd on fp32 (fibers never run at the same time);
 *   - ex2.approx.ftz.f32 and max.NaN.f32 (dt_emu_ex2_ftz, dt_emu_max_nan);
 *   - __syncwarp (every lane of the warp at the same one);
 *   - programmatic dependent launches: run after the launch before, as any,
 *     with their waits checked instead (dt_emu_griddep_require).
 * What is checked, each failing the launch with a message: ldmatrix,
 * stmatrix and cp.async addresses inside shared memory and 16-byte
 * aligned; a warp instruction with lanes missing (exited) or lanes at
 * different instructions; a deadlock (no thread can run: a __syncthreads
 * some threads never reach, say; an mbarrier wait that nothing can
 * complete); __trap;
 * for wgmma what dt_emu_wgmma lists, and for mbarriers and TMA what
 * dt_emu_mbar_wait and dt_emu_tma_load list.
 *
 * Not emulated: timing, memory ordering between blocks (blocks are
 * sequential), and everything the kernels do not use.
 *
 * One launch at a time per process (a mutex serialises them). C API.
 */
#ifndef DT_TEST_EMU_H
#define DT_TEST_EMU_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_emu_dim3 {
    unsigned x, y, z;
} dt_emu_dim3;

/* Runs body(arg) as every thread of every block of `grid`, blocks of
 * `block` threads (at most 1024) with `smem_bytes` of dynamic shared
 * memory; dependent: a programmatic dependent launch (see
 * dt_emu_griddep_require). 0 on success; -1 with the reason in err (naming
 * the block and thread) when the kernel did something the emulator
 * rejects. */
int dt_emu_launch(dt_emu_dim3 grid, dt_emu_dim3 block, size_t smem_bytes, int dependent,
                  void (*body)(void *), void *arg, char *err, size_t err_size);

/* Counts since the process started (tests use them to see that work ran):
 * blocks run; warp and warpgroup instructions completed (warp_ops); matrix
 * instructions, mma.sync and wgmma.mma_async (mma); cp.async copies
 * (copies); wgmma.mma_async alone (wgmma); cp.async.bulk.tensor issued
 * (tma); programmatic dependent launches run (dependent); cp.reduce.async.bulk
 * issued (bulk). */
typedef struct dt_emu_counts {
    uint64_t blocks, warp_ops, mma, copies, wgmma, tma, dependent, bulk;
} dt_emu_counts;
dt_emu_counts dt_emu_get_counts(void);

/* ---- called from kernel code (inside dt_emu_launch) ---- */
const dt_emu_dim3 *dt_emu_thread_idx(void);
const dt_emu_dim3 *dt_emu_block_idx(void);
const dt_emu_dim3 *dt_emu_block_dim(void);
const dt_emu_dim3 *dt_emu_grid_dim(void);
unsigned char *dt_emu_dynamic_smem(void);

void dt_emu_syncthreads(void);
/* bar.sync id, n and bar.arrive id, n: named barrier id (1..15) completes a
 * phase when n threads (a multiple of 32) have arrived by either; bar.sync
 * waits for that, bar.arrive does not. */
void dt_emu_bar_sync(int id, int n);
void dt_emu_bar_arrive(int id, int n);
/* shfl.sync.bfly.b32 with a full mask: lane l receives lane l ^ lane_mask's v. */
float dt_emu_shfl_xor(unsigned mask, float v, int lane_mask);
/* __syncwarp (full mask only): every lane of the warp waits here until all
 * have arrived; the lanes must reach the same one. */
void dt_emu_syncwarp(unsigned mask);
/* cp.async.cg.shared.global 16 bytes; src_bytes 16 or 0 (zero fill). */
void dt_emu_cp_async16(void *smem, const void *gmem, int src_bytes);
void dt_emu_cp_commit(void);
/* cp.async.wait_group n. */
void dt_emu_cp_wait(int n);
/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16; row: this lane's row address. */
void dt_emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans);
/* stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (sm_90): the inverse of
 * ldmatrix; row: this lane's row address. */
void dt_emu_stmatrix_x4(void *row, const uint32_t r[4], int trans);
/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, d += A B
 * (ab: DT_BF16 or DT_F16). */
void dt_emu_mma_m16n8k16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, dt_dtype ab);
/* ex2.approx.ftz.f32: 2^x, a result below 2^-126 (subnormal) flushed to 0,
 * a subnormal x taken as 0; otherwise the host's exp2f (the GPU's SFU
 * approximates it within 2 ulp). Any thread, no warp involved. */
float dt_emu_ex2_ftz(float x);
/* max.NaN.f32 (sm_80): the larger of a and b (+0 above -0); the canonical
 * NaN (0x7fffffff) if either is NaN. Any thread, no warp involved. */
float dt_emu_max_nan(float a, float b);

/* ---- Hopper warpgroup MMA (sm_90a), from the PTX ISA's "Asynchronous
 * Warpgroup Level Matrix Multiply-Accumulate" sections ----
 *
 * __cvta_generic_to_shared: the shared-window address of p, a pointer into
 * the dynamic shared memory (or one past its end). The emulated window puts
 * the dynamic shared memory at address 16 (NOT 1024-aligned, on purpose:
 * kernels that need 1024-byte aligned swizzle atoms must align by address
 * themselves). */
uint32_t dt_emu_smem_addr(const void *p);
/* fence.proxy.async.shared::cta: this thread's completed cp.async copies
 * and ordinary shared-memory stores become visible to the async proxy
 * (wgmma's shared-memory reads), once a barrier publishes them. */
void dt_emu_fence_proxy_async(void);
/* setmaxnreg.{inc,dec}.sync.aligned.u32 count (inc: 1 or 0): every thread
 * of the calling warpgroup, the same count (24 .. 256, a multiple of 8);
 * an .inc below or a .dec above the warpgroup's count fails, and so does
 * an .inc that would leave the block's warpgroups holding more than an
 * SM's 65,536 registers (the hardware would wait forever). No effect
 * beyond those checks. */
void dt_emu_setmaxnreg(int inc, int count);
/* wgmma.fence.sync.aligned */
void dt_emu_wgmma_fence(void);
/* wgmma.commit_group.sync.aligned: this thread's uncommitted
 * wgmma.mma_async become one group (an empty one if there are none). */
void dt_emu_wgmma_commit(void);
/* wgmma.wait_group.sync.aligned n: completes this thread's committed groups
 * but the newest n, in issue order, writing their results into the
 * accumulator registers. */
void dt_emu_wgmma_wait(int n);
/* wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}.{bf16,f16}:
 * n = N (a multiple of 8, 8..256); d = this thread's N/2 fp32 accumulator
 * registers; D = A B + (scale_d ? D : 0). A (64x16): a != NULL: this
 * thread's four .b32 registers (the PTX ISA's register fragment layout of
 * m64nNk16); a == NULL: from shared memory via the matrix descriptor desc_a,
 * K-major (imm-trans-a = 0). B (16xN): via the descriptor desc_b,
 * trans_b 0 = K-major, 1 = N-major (imm-trans-b). ab = DT_BF16 or DT_F16.
 * imm-scale-a = imm-scale-b = 1.
 *
 * Descriptors: 128-byte swizzle (mode 1) with base offset 0 only; the
 * element addresses are documented in runtime.c (wgmma_elem_addr).
 * Asynchronous: the results are written into d at the wgmma.wait_group
 * that completes the instruction's group; a second mma_async on the same d
 * (same n) before that takes the first's pending result as its input, as
 * the hardware orders same-shape accumulator accesses.
 * Checked (each fails the launch with a message): a block that is not a
 * multiple of 128 threads; the threads of the warpgroup at different
 * instructions or with different n, A form, descriptors, scale_d, trans_b
 * or ab; a warpgroup thread that has exited; a descriptor with another
 * swizzle mode, a base offset, reserved bits, or an element outside the
 * dynamic shared memory; no wgmma.fence by the thread since the launch or
 * its last wgmma.wait_group; shared memory written by cp.async or by
 * ordinary stores and published by a barrier without fence.proxy.async
 * (see runtime.c for exactly what is tracked); accumulators overlapping a pending
 * wgmma.mma_async's other than the same d with the same n; d written, or
 * the shared memory the instruction read changed, before the wait_group
 * that completes it; a thread exiting with wgmma.mma_async pending
 * (uncommitted or not waited for). Reads of d before the wait see a NaN.
 * Not checked: A registers changed before the wait (their values are taken
 * at the issue). */
void dt_emu_wgmma(float *d, int n, const uint32_t *a, uint64_t desc_a, uint64_t desc_b, int scale_d,
                  int trans_b, dt_dtype ab);

/* ---- Hopper mbarrier and tensor copy (TMA), from the PTX ISA's "mbarrier"
 * sections, "cp.async.bulk.tensor" and "Tensors" (5.5), and the CUDA
 * driver API's cuTensorMapEncodeTiled; the semantics and every check are
 * described in runtime.c ("mbarrier and TMA"). In short: ----
 *
 * An mbarrier is an 8-byte, 8-aligned object in dynamic shared memory; its
 * phase completes when all mbarrier.init's count of arrivals and all
 * expected transaction bytes are in, then the next phase begins.
 * mbarrier.init.shared::cta.b64 (count 1 .. 2^20 - 1; once per barrier and
 * block). */
void dt_emu_mbar_init(void *bar, unsigned count);
/* fence.mbarrier_init.release.cluster: this thread's earlier inits become
 * visible to the async proxy (a TMA may complete on them; so does a
 * __syncthreads after the init). */
void dt_emu_fence_mbarrier_init(void);
/* mbarrier.arrive.shared::cta.b64: one arrival. */
void dt_emu_mbar_arrive(void *bar);
/* mbarrier.arrive.expect_tx.shared::cta.b64: tx-count += bytes, then one
 * arrival. */
void dt_emu_mbar_arrive_expect_tx(void *bar, uint32_t bytes);
/* A loop of mbarrier.try_wait.parity.shared::cta.b64 until it succeeds:
 * returns once the phase with parity `parity` (0 or 1) has completed, that
 * is when the current phase's parity differs from it (after the init,
 * parity 1 returns at once, parity 0 waits for phase 0). Meanwhile the
 * thread blocks, the others run; the barrier's pending tensor copies
 * complete here, oldest first, as far as the phase needs them. A wait that
 * nothing can complete is reported as a deadlock naming the barrier
 * ("mbarrier at shared offset X, parity P"). */
void dt_emu_mbar_wait(void *bar, uint32_t parity);
/* cp.async.bulk.tensor.{1..5}d.shared::cluster.global.tile.mbarrier::
 * complete_tx::bytes [dst], [tensor_map, {coords}], [bar], issued by the
 * calling thread alone: the box of the tensor map (cuTensorMapEncodeTiled,
 * include/cuda.h) at element coordinates coords[0 .. rank) (dimension 0
 * innermost; coordinates may be negative or past the end: those elements
 * are zeros, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE, and are not read), stored
 * in box order (dimension 0 fastest) at dst with the map's swizzle, then
 * the box's bytes counted as complete_tx on bar. dst: a 128-byte aligned
 * shared-window address (dt_emu_smem_addr) in dynamic shared memory; the
 * swizzle permutes 16-byte chunks by address bits 7-9 (128B; 7-8 for 64B,
 * 7 for 32B): with dst 1024-aligned and 128-byte rows, chunk c of row r at
 * c ^ (r % 8), as wgmma's 128-byte swizzle reads it.
 * Deferred: from the issue the destination holds 0xff bytes; the copy
 * happens when a wait on bar needs it, or when the block ends. Checked: the
 * map (written by cuTensorMapEncodeTiled, unchanged, 64-byte aligned, of
 * rank `rank`), dst, the barrier (initialised, its init visible to the
 * async proxy), a destination free of pending copies (TMA or cp.async),
 * of barriers and of the shared operands of every wgmma.mma_async that some
 * thread has not yet completed with wgmma.wait_group (a pipeline refilling
 * a stage too early: the deferred copy would not show it), the reads inside the cudaMalloc / cudaHostAlloc allocation
 * holding the tensor's address; later, a write into the destination
 * before completion (plain stores show at completion; cp.async, another
 * TMA, ldmatrix and wgmma.mma_async reads fail at once). TMA writes come
 * through the async proxy: no fence.proxy.async is needed before wgmma. */
void dt_emu_tma_load(void *dst, const void *tensor_map, const int32_t *coords, int rank, void *bar);
/* prefetch.tensormap: a hint on the GPU (the map into the SM's cache
 * before its first cp.async.bulk.tensor); here it checks the map as
 * dt_emu_tma_load does (written by cuTensorMapEncodeTiled, unchanged,
 * 64-byte aligned) and does nothing else. */
void dt_emu_tma_prefetch(const void *tensor_map);
/* cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32: the `bytes`
 * (a multiple of 16) of fp32 at src (shared memory, 16-byte aligned) added
 * into dst (global, 16-byte aligned, inside one cudaMalloc allocation),
 * element by element, as the float2 reductions add (a reduction: allowed
 * before griddepcontrol.wait, as dt_emu_reduce_add). The bulk copy reads
 * shared memory through the async proxy, so it reads what a barrier
 * published after a fence.proxy.async (emulated: the add is made at the
 * issue, from that view); checked: that view and shared memory agree on
 * src at the issue (a store not yet published fails), and src is unchanged
 * until the thread's cp.async.bulk.wait_group[.read] completes the op (a
 * store before fails there), and no thread exits before that wait.
 * Completed by groups: dt_emu_bulk_commit (cp.async.bulk.commit_group),
 * dt_emu_bulk_wait (cp.async.bulk.wait_group N, .read or not: the same
 * here) completes all but the newest n committed groups. */
void dt_emu_bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes);
void dt_emu_bulk_commit(void);
void dt_emu_bulk_wait(int n);

/* Programmatic dependent launch (griddepcontrol). The emulator runs a
 * dependent launch after the one before, as any other, so it cannot show
 * a read that came too early by its value; instead it checks the rule:
 * in a dependent launch, a thread must have run griddepcontrol.wait
 * (dt_emu_griddep_wait) before an atomic on global memory (not before a
 * reduction the kernel declares commutative: cuda_emu.h's
 * dt_emu_reduce_add), before
 * whatever the kernel marks with dt_emu_griddep_require (a read of what
 * the grid before wrote), and before it exits (so that the grid completes
 * after the one it depends on). launch_dependents only counts. */
void dt_emu_griddep_launch(void);
void dt_emu_griddep_wait(void);
void dt_emu_griddep_require(const char *what);

/* The rows' waits of the forward kernels (attention/block.h, visits): a
 * thread in a dependent launch may also read what the grid before wrote
 * to rows whose count it has acquired (dt_emu_griddep_require_rows with
 * that count), and exit without griddepcontrol.wait where the kernel
 * declares that nothing after it needs the grid before complete
 * (dt_emu_griddep_waive: the later blocks wait for the rows' counts).
 * Launches run one after another, so at an acquire (a wait until the count
 * reaches `visit`) and at a release (an add of 1 by the block of that
 * visit) the count must be `visit` exactly: else the launch fails, naming
 * the count (one left uncounted would leave a GPU waiting; one counted
 * twice would let a block read rows too early). */
void dt_emu_griddep_require_rows(const char *what, const uint32_t *count);
void dt_emu_griddep_waive(void);
void dt_emu_rows_acquire(const uint32_t *count, uint32_t visit);
void dt_emu_rows_release(uint32_t *count, uint32_t visit);

/* Ends the launch with an error (__trap, or a failed check). */
void dt_emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#ifdef __cplusplus
}
#endif
#endif /* DT_TEST_EMU_H */
