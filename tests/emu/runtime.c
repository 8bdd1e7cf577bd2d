/* tests/emu/runtime.c — the CPU emulator of emu.h: fibers, barriers, the
 * warp-wide instructions, cp.async, the warpgroup MMA, mbarriers and the
 * tensor copy (TMA). The instruction semantics are written from the PTX ISA
 * ("Matrix Fragments for mma.m16n8k16 with floating point type",
 * "ldmatrix", "cp.async", "shfl.sync"; for wgmma "Register Fragments and
 * Shared Memory Matrix Layouts", "wgmma.mma_async", "wgmma.fence",
 * "wgmma.commit_group", "wgmma.wait_group"; for the TMA "mbarrier" and its
 * subsections, "cp.async.bulk.tensor", "Tensors" (tiled mode, bounding box,
 * out-of-bound access, swizzling modes)) and the CUDA driver API
 * (cuTensorMapEncodeTiled), not from the kernels' index helpers
 * (attention/cuda/mma_layout.h), which they test. */
#define _GNU_SOURCE
#include "emu.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "cudart_emu.h"
#include "tmap_emu.h"

/* Fiber switches. glibc's swapcontext makes a system call (the signal mask)
 * each time, and a warp instruction costs 64 switches, so on x86-64 a
 * six-register switch in assembly does it instead (about 30x faster here).
 * It keeps no shadow stack, so runtime.c is built with -fcf-protection=none
 * there (Makefile): the test program is then not marked for CET shadow
 * stacks, which the switch would violate. Elsewhere: ucontext. */
#if defined(__x86_64__) && !defined(DT_EMU_UCONTEXT)
#define EMU_ASM_SWITCH 1
/* Saves rbp, rbx, r12-r15 on the current stack, stores rsp in *save,
 * switches to stack `to` and pops the same registers from it. */
void dt_emu_switch_(void **save, void *to);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl dt_emu_switch_\n"
        ".hidden dt_emu_switch_\n"
        ".type dt_emu_switch_, @function\n"
        "dt_emu_switch_:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size dt_emu_switch_, .-dt_emu_switch_\n");
#endif

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif
/* ThreadSanitizer follows the fibers' switches only when told of them: a
 * TSan fiber per emulated thread of a launch, and each switch announced
 * just before it (with a happens-before edge: the emulated threads of a
 * block are one host thread's work, their races the emulator's own
 * checks'). A fiber runs one block's thread after another, each from
 * fiber_main, which never returns: it and yield_fiber, the frames a
 * finished thread leaves on its stack, are not instrumented (EMU_NO_TSAN),
 * so that TSan's record of the fiber's calls stays balanced. (A failed
 * launch leaves deeper frames; its fibers go with it.) */
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif
#ifdef EMU_TSAN
#include <sanitizer/tsan_interface.h>
#define EMU_NO_TSAN __attribute__((no_sanitize("thread")))
#else
#define EMU_NO_TSAN
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define EMU_VALGRIND 1
#endif
#endif

/* What a wgmma's accumulator registers hold from its issue to its wait: a
 * quiet NaN. */
#define EMU_WG_POISON 0x7fc0deadu

enum { EMU_STACK = 256 * 1024, EMU_MAX_THREADS = 1024, EMU_POISON = 0xff };
/* The shared-window address of the dynamic shared memory's first byte
 * (dt_emu_smem_addr): 16, not 1024-aligned, so a kernel that assumes an
 * aligned window gets a wrong swizzle here rather than by luck. */
enum { EMU_SMEM_BASE = 16 };
/* wgmma.mma_async.m64nNk16: M, K, the largest N, and the accumulator
 * registers per thread at that N. */
enum { WG_M = 64, WG_K = 16, WG_NMAX = 256, WG_DMAX = WG_NMAX / 2 };

typedef enum { T_RUNNABLE, T_WAIT_WARP, T_WAIT_BLOCK, T_WAIT_BAR, T_WAIT_MBAR, T_WAIT_REGS, T_DONE } thread_state;

typedef enum {
    OP_SHFL_XOR = 1, OP_LDMATRIX, OP_LDMATRIX_T, OP_STMATRIX, OP_STMATRIX_T, OP_MMA_BF16,
    OP_MMA_F16, OP_SYNCWARP,     /* per warp */
    OP_WGMMA, OP_SETMAXNREG      /* per warpgroup */
} warp_op_kind;

static const char *op_name(int op) {
    switch (op) {
    case OP_SHFL_XOR: return "shfl.sync.bfly";
    case OP_LDMATRIX: return "ldmatrix.x4";
    case OP_LDMATRIX_T: return "ldmatrix.x4.trans";
    case OP_STMATRIX: return "stmatrix.x4";
    case OP_STMATRIX_T: return "stmatrix.x4.trans";
    case OP_MMA_BF16: return "mma.m16n8k16.bf16";
    case OP_MMA_F16: return "mma.m16n8k16.f16";
    case OP_SYNCWARP: return "bar.warp.sync";
    case OP_WGMMA: return "wgmma.mma_async";
    case OP_SETMAXNREG: return "setmaxnreg";
    default: return "?";
    }
}

typedef struct emu_copy {
    unsigned char *dst;
    const unsigned char *src;
    int bytes;   /* 16, or 0: zero fill */
    long group;  /* commit group; -1 until committed */
} emu_copy;

/* One wgmma.mma_async of a warpgroup, shared by the 128 threads' pending
 * records: the raw 16-bit elements it read from shared memory, so that the
 * first wgmma.wait_group completing it can see whether that memory changed
 * meanwhile (the hardware reads it at some point before the wait: a write
 * in between is a race). */
typedef struct wgmma_op {
    int refs;      /* pending records pointing here */
    int checked;   /* a wait_group compared the shared memory already */
    int n, a_smem, trans_b;
    uint32_t lo[2], hi[2];   /* the shared offsets A, B read: [lo, hi) covers them */
    uint64_t desc_a, desc_b;
    uint16_t a[WG_M * WG_K];     /* A[i][k] at 16 i + k, when a_smem */
    uint16_t b[WG_K * WG_NMAX];  /* B[k][j] at n k + j */
} wgmma_op;

/* One thread's cp.reduce.async.bulk whose read of shared memory no
 * cp.async.bulk.wait_group has completed: its source, as it read it. */
typedef struct emu_bulk {
    uint32_t src;          /* shared offset */
    uint32_t bytes;
    long group;            /* commit group; -1 until committed */
    unsigned char *seen;   /* the source's bytes at the issue (malloc) */
} emu_bulk;

/* One thread's pending wgmma.mma_async. */
typedef struct emu_wgmma {
    float *d;
    int nreg;                    /* n / 2 */
    long group;                  /* commit group; -1 until committed */
    wgmma_op *op;                /* NULL once completed */
    float result[WG_DMAX];       /* written into d at completion */
    float expect[WG_DMAX];       /* what d must hold then: the poison written
                                    at the issue, or the result of the pending
                                    mma_async on the same d before it */
} emu_wgmma;

typedef struct emu_thread {
#ifdef EMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t ctx;
#endif
    unsigned char *stack;
    dt_emu_dim3 idx;
    int linear;
    thread_state state;
    void *asan_fake;
    void *tsan_fiber;   /* EMU_TSAN */
    /* cp.async in flight */
    emu_copy *copies;
    int ncopies, cap;
    long next_group;
    /* the operands of the warp instruction it waits in */
    int op, arg;
    const void *in;
    void *out;
    /* wgmma.mma_async in flight, in issue order */
    emu_wgmma *wg;
    int nwg, wgcap;
    long wg_next_group;
    int wg_fenced;     /* wgmma.fence since the start or the last wgmma.wait_group */
    int cp_unfenced;   /* completed cp.async copies since its last fence.proxy.async */
    /* cp.reduce.async.bulk reading shared memory, in issue order */
    struct emu_bulk *bulks;
    int nbulk, bulkcap;
    long bulk_next_group;
    /* the mbarrier wait it is blocked in (T_WAIT_MBAR) */
    uint32_t mbar_off, mbar_parity;
    int bar_id;   /* the named barrier it waits in (T_WAIT_BAR) */
    int griddep_waited;   /* ran griddepcontrol.wait */
    int griddep_waived;   /* declared it exits without that wait (dt_emu_griddep_waive) */
    const uint32_t *rows_acquired;   /* the rows' count it waited for (dt_emu_rows_acquire) */
} emu_thread;

/* An mbarrier object of the block (PTX ISA "Contents of the mbarrier
 * object", "Phase Completion of the mbarrier object"): the state lives
 * here, beside the shared memory; the object's 8 bytes there hold a stamp
 * (mbar_stamp) that every mbarrier instruction checks, so that a plain
 * store over a live barrier shows. */
typedef struct emu_mbar {
    uint32_t off;        /* shared offset of its 8 bytes */
    uint32_t expected;   /* arrivals per phase: mbarrier.init's count */
    uint32_t pending;    /* arrivals still missing in the current phase */
    int64_t tx;          /* tx-count: expect_tx bytes less complete_tx bytes */
    uint64_t phase;      /* the current phase (0 at the init); its parity is phase & 1 */
    int init_thread;     /* the thread that initialised it */
    int fenced;          /* init_thread ran fence.mbarrier_init after the init */
    int synced;          /* a __syncthreads completed after the init */
} emu_mbar;

/* A cp.async.bulk.tensor in flight: its box is read and written, and its
 * bytes counted on the mbarrier, only at completion (tma_perform). */
typedef struct emu_tma {
    uint32_t dst, bytes;   /* the box's shared offset (before the swizzle), its size */
    uint32_t bar;          /* shared offset of the mbarrier it completes on */
    int thread;            /* the issuing thread */
    dt_emu_tmap map;
    int64_t coord[DT_EMU_TMAP_MAX_RANK];
} emu_tma;

/* The launch in progress. */
static struct {
    pthread_mutex_t lock;
    dt_emu_dim3 grid, block, block_idx;
    int nthreads;
    int dependent;   /* a programmatic dependent launch */
    emu_thread *threads;
    emu_thread *cur;
    unsigned char *smem;
    size_t smem_bytes;
    void (*body)(void *);
    void *arg;
    int block_arrived;
    int bar_arrived[16], bar_count[16];      /* named barriers 1..15: this phase's arrivals, of how many */
    int warp_arrived[EMU_MAX_THREADS / 32];  /* lanes waiting in a warp or warpgroup instruction */
    int warp_at[EMU_MAX_THREADS / 32];       /* ... which one (valid while warp_arrived > 0) */
    int wg_arrived[EMU_MAX_THREADS / 128];   /* threads waiting in a warpgroup instruction */
    int wg_regs[EMU_MAX_THREADS / 128];      /* a warpgroup's registers per thread (setmaxnreg) */
    int wg_want[EMU_MAX_THREADS / 128];      /* an .inc's count not granted yet, or 0 */
    int async_stale;  /* the last __syncthreads published cp.async data without fence.proxy.async */
    /* what the async proxy (wgmma) may read of shared memory: the block's
     * shared memory as of the last barrier that completed after a
     * fence.proxy.async, with every TMA write since (see publish_to_async) */
    unsigned char *smem_async;
    int proxy_fenced;   /* a fence.proxy.async since the last barrier completed */
    int done;                                /* threads of the block that exited */
    /* the scheduler's order starts at thread `lead`; no thread before
     * position `cursor` of that order is runnable (wake keeps it so) */
    int lead, cursor;
    int warp_exited[EMU_MAX_THREADS / 32];
#ifdef EMU_ASM_SWITCH
    void *sched_sp;
#else
    ucontext_t sched;
#endif
    const void *sched_stack;
    size_t sched_stack_size;
    void *tsan_sched;   /* EMU_TSAN: the scheduler's fiber (the launching thread) */
    wgmma_op *wg_new;  /* a wgmma being completed: freed by the launch if that fails */
    /* the block's mbarriers and pending TMAs (in issue order); tma_busy[i]
     * is 1 while shared byte i is in a pending TMA's destination */
    emu_mbar *mbars;
    int nmbar, mbarcap;
    emu_tma *tmas;
    int ntma, tmacap;
    unsigned char *tma_busy;
    int failed;
    char err[512];
    dt_emu_counts counts;
} E = {.lock = PTHREAD_MUTEX_INITIALIZER};

dt_emu_counts dt_emu_get_counts(void) { return E.counts; }

/* ------------------------------------------------------------ switching */

/* Scheduler -> fiber t, until t waits, finishes or fails. */
static void run_fiber(emu_thread *t) {
    E.cur = t;
#ifdef EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, t->stack, EMU_STACK);
#endif
#ifdef EMU_TSAN
    E.tsan_sched = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(t->tsan_fiber, 0);
#endif
#ifdef EMU_ASM_SWITCH
    dt_emu_switch_(&E.sched_sp, t->sp);
#else
    swapcontext(&E.sched, &t->ctx);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
    E.cur = NULL;
}

/* Fiber -> scheduler. `dying`: the fiber is never resumed. */
static EMU_NO_TSAN void yield_fiber(int dying) {
    emu_thread *t = E.cur;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? NULL : &t->asan_fake, E.sched_stack, E.sched_stack_size);
#else
    (void)dying;
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(E.tsan_sched, 0);
#endif
#ifdef EMU_ASM_SWITCH
    dt_emu_switch_(&t->sp, E.sched_sp);
#else
    swapcontext(&t->ctx, &E.sched);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(t->asan_fake, &E.sched_stack, &E.sched_stack_size);
#endif
    E.cur = t;
}

static void thread_exits(emu_thread *t) {
    t->state = T_DONE;
    E.done++;
    E.warp_exited[t->linear / 32]++;
}

void dt_emu_fail(const char *fmt, ...) {
    emu_thread *t = E.cur;
    if (!E.failed) {
        int n = snprintf(E.err, sizeof E.err, "block (%u,%u,%u) thread (%u,%u,%u): ",
                         E.block_idx.x, E.block_idx.y, E.block_idx.z, t ? t->idx.x : 0,
                         t ? t->idx.y : 0, t ? t->idx.z : 0);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < sizeof E.err) vsnprintf(E.err + n, sizeof E.err - (size_t)n, fmt, ap);
        va_end(ap);
        E.failed = 1;
    }
    if (t) thread_exits(t);
    for (;;) yield_fiber(1);   /* never resumed */
}

/* ------------------------------------------- programmatic dependent launch */

void dt_emu_griddep_launch(void) {}

void dt_emu_griddep_wait(void) { E.cur->griddep_waited = 1; }

void dt_emu_griddep_require(const char *what) {
    if (E.dependent && !E.cur->griddep_waited)
        dt_emu_fail("%s in a programmatic dependent launch before griddepcontrol.wait: the grid "
                    "before may still be running", what);
}

void dt_emu_griddep_require_rows(const char *what, const uint32_t *count) {
    if (count && E.cur->rows_acquired == count) return;
    dt_emu_griddep_require(what);
}

void dt_emu_griddep_waive(void) { E.cur->griddep_waived = 1; }

/* Launches run one after another here, so every earlier block is done with
 * the rows: their count is the blocks before this one, exactly. */
void dt_emu_rows_acquire(const uint32_t *count, uint32_t visit) {
    if (*count != visit)
        dt_emu_fail("the rows' count at %p is %u where the block, visit %u of the call, waits "
                    "for %u: %s", (const void *)count, *count, visit, visit,
                    *count < visit ? "an earlier block did not count them (on a GPU this "
                                     "wait would run until its trap)"
                                   : "a block counted them twice, or the count was not cleared");
    E.cur->rows_acquired = count;
}

void dt_emu_rows_release(uint32_t *count, uint32_t visit) {
    if (*count != visit)
        dt_emu_fail("the rows' count at %p is %u when the block, visit %u of the call, adds "
                    "its 1: a block counted them twice, or one before did not count them",
                    (const void *)count, *count, visit);
    (*count)++;
}

/* Room for one more element of an array (n in use, *cap allocated, each
 * `size` bytes): doubles it when full. Out of memory fails the launch. */
static void *room(void *arr, int n, int *cap, size_t size) {
    if (n < *cap) return arr;
    const int c = *cap ? 2 * *cap : 16;
    void *p = realloc(arr, size * (size_t)c);
    if (!p) dt_emu_fail("out of memory");
    *cap = c;
    return p;
}

/* --------------------------------------------------------------- cp.async */

static int in_smem(const void *p, size_t bytes) {
    const unsigned char *c = p;
    return c >= E.smem && c + bytes <= E.smem + E.smem_bytes;
}

static void tma_check_idle(uint32_t off, uint32_t bytes, const char *what);

static void complete_copy(const emu_copy *c) {
    for (int i = 0; i < 16; i++)
        if (c->dst[i] != EMU_POISON)
            dt_emu_fail("shared memory at offset %td was written while a cp.async into it "
                        "was in flight", c->dst + i - E.smem);
    if (c->bytes) memcpy(c->dst, c->src, 16);
    else memset(c->dst, 0, 16);
}

void dt_emu_cp_async16(void *smem, const void *gmem, int src_bytes) {
    emu_thread *t = E.cur;
    if (!in_smem(smem, 16) || ((uintptr_t)smem - (uintptr_t)E.smem) % 16)
        dt_emu_fail("cp.async destination %p is not 16 aligned bytes inside the %zu bytes of "
                    "shared memory", smem, E.smem_bytes);
    if (src_bytes != 0 && src_bytes != 16) dt_emu_fail("cp.async src-size %d", src_bytes);
    if (src_bytes && (uintptr_t)gmem % 16) dt_emu_fail("cp.async source %p not 16-byte aligned", gmem);
    for (int i = 0; i < t->ncopies; i++)
        if (t->copies[i].dst == smem)
            dt_emu_fail("second cp.async into shared offset %td while the first is in flight",
                        (unsigned char *)smem - E.smem);
    tma_check_idle((uint32_t)((unsigned char *)smem - E.smem), 16, "cp.async into");
    t->copies = room(t->copies, t->ncopies, &t->cap, sizeof *t->copies);
    t->copies[t->ncopies++] = (emu_copy){smem, gmem, src_bytes, -1};
    memset(smem, EMU_POISON, 16);   /* undefined until completed */
    E.counts.copies++;
}

void dt_emu_cp_commit(void) {
    emu_thread *t = E.cur;
    for (int i = 0; i < t->ncopies; i++)
        if (t->copies[i].group < 0) t->copies[i].group = t->next_group;
    t->next_group++;
}

/* Completes the committed groups older than the newest n, in order;
 * returns how many copies that completed. */
static int wait_groups(emu_thread *t, long n) {
    const long cutoff = t->next_group - n;
    int kept = 0;
    for (int i = 0; i < t->ncopies; i++) {
        emu_copy c = t->copies[i];
        if (c.group >= 0 && c.group < cutoff) complete_copy(&c);
        else t->copies[kept++] = c;
    }
    const int completed = t->ncopies - kept;
    t->ncopies = kept;
    return completed;
}

void dt_emu_cp_wait(int n) {
    if (wait_groups(E.cur, n)) E.cur->cp_unfenced = 1;   /* generic-proxy writes, see below */
}

/* ------------------------------------------------------------ barriers */

static int alive_in_block(void) { return E.nthreads - E.done; }

/* Thread t may run again: every blocked thread becomes runnable here. */
static void wake(emu_thread *t) {
    t->state = T_RUNNABLE;
    const int pos = (t->linear - E.lead + E.nthreads) % E.nthreads;
    if (pos < E.cursor) E.cursor = pos;
}

/* Threads first .. first + n - 1 waiting in `waiting` may run again. */
static void release(thread_state waiting, int first, int n) {
    for (int i = first; i < first + n; i++)
        if (E.threads[i].state == waiting) wake(&E.threads[i]);
}

/* A block barrier is complete when every thread still alive arrived.
 *
 * It is also where the emulator follows cp.async data on its way to wgmma.
 * cp.async writes shared memory through the generic proxy and wgmma reads it
 * through the async proxy; the PTX ISA asks for a fence.proxy.async between
 * the two ("wgmma.fence": "An async proxy fence must be used to establish
 * an ordering between prior writes to shared memory matrices and subsequent
 * reads of the same matrices in a wgmma.mma_async instruction"). What is
 * checked: a thread whose cp.async.wait_group completed copies is marked
 * until its next fence.proxy.async; a __syncthreads that completes while
 * any thread of the block is marked makes the block "async proxy stale"
 * (and clears the marks), one that completes with none marked clears it;
 * a wgmma.mma_async issued while the block is stale fails. So the fence
 * must come between the cp.async wait and the __syncthreads that publishes
 * the data. Not checked: copies completed by a thread's exit, and a wgmma
 * that reads cp.async data without a __syncthreads after the copies (its
 * own thread's copies, say). TMA writes come through the async proxy and
 * need no fence.
 *
 * Plain stores to shared memory (P or dS tiles a kernel writes for a later
 * wgmma) need the same fence: each writer runs fence.proxy.async, then a
 * barrier publishes the stores. The emulator keeps the async proxy's view
 * of shared memory (smem_async): a barrier (__syncthreads or a named
 * barrier's phase) that completes after any thread's fence.proxy.async
 * copies the block's shared memory into it, TMA writes go into both, and a
 * wgmma.mma_async whose operand differs between shared memory and that
 * view fails: something wrote it without a fence and a barrier after. Not
 * caught: a thread that stores without fencing while another thread's
 * fence precedes the same barrier (one fence publishes all).
 *
 * A completed __syncthreads also orders every mbarrier.init before it with
 * every later use of the barrier, by any thread or the async proxy
 * (emu_mbar.synced). */
static void publish_to_async(void) {
    if (!E.proxy_fenced) return;
    memcpy(E.smem_async, E.smem, E.smem_bytes);
    E.proxy_fenced = 0;
}

static void maybe_release_block(void) {
    if (E.block_arrived > 0 && E.block_arrived == alive_in_block()) {
        E.block_arrived = 0;
        int stale = 0;
        for (int i = 0; i < E.nthreads; i++) {
            stale |= E.threads[i].cp_unfenced;
            E.threads[i].cp_unfenced = 0;
        }
        E.async_stale = stale;
        publish_to_async();
        for (int i = 0; i < E.nmbar; i++) E.mbars[i].synced = 1;   /* inits now visible */
        release(T_WAIT_BLOCK, 0, E.nthreads);
    }
}

void dt_emu_syncthreads(void) {
    emu_thread *t = E.cur;
    E.block_arrived++;
    t->state = T_WAIT_BLOCK;
    maybe_release_block();
    if (t->state == T_WAIT_BLOCK) yield_fiber(0);
}

/* Named barriers (PTX "bar.sync", "bar.arrive" with a barrier id and a
 * thread count): a phase of barrier id completes when n threads have
 * arrived, by bar.sync (which waits for the completion) or bar.arrive
 * (which does not); the next phase starts empty. Checked: id 1..15 (0 is
 * __syncthreads's), n a multiple of 32 within the block, every arrival of
 * a phase with the same n; a phase left incomplete when the block ends
 * fails it (block_end), and threads blocked in one are a deadlock. Not
 * modelled: the warp granularity of the counts (each thread counts one). */
static void named_barrier(int id, int n, int wait) {
    emu_thread *t = E.cur;
    const char *what = wait ? "bar.sync" : "bar.arrive";
    if (id < 1 || id > 15)
        dt_emu_fail("%s %d: named barriers are 1..15 (0 is __syncthreads's)", what, id);
    if (n < 32 || n % 32 || n > E.nthreads)
        dt_emu_fail("%s %d, %d: the thread count must be a multiple of 32 up to the block's %d",
                    what, id, n, E.nthreads);
    if (E.bar_arrived[id] == 0) E.bar_count[id] = n;
    else if (E.bar_count[id] != n)
        dt_emu_fail("%s %d, %d in a phase of barrier %d that counts %d threads", what, id, n, id,
                    E.bar_count[id]);
    if (++E.bar_arrived[id] == n) {
        E.bar_arrived[id] = 0;
        publish_to_async();
        for (int i = 0; i < E.nthreads; i++)
            if (E.threads[i].state == T_WAIT_BAR && E.threads[i].bar_id == id)
                wake(&E.threads[i]);
        /* the scheduler goes on with the first runnable thread from the
         * leading warp: the threads this phase released run first where
         * they lead, before this one's next steps (a warpgroup that passes
         * its turn on then still has its product pending: a producer that
         * refills the product's stage too early meets it) */
        yield_fiber(0);
        return;
    }
    if (!wait) return;
    t->state = T_WAIT_BAR;
    t->bar_id = id;
    yield_fiber(0);
}

void dt_emu_bar_sync(int id, int n) { named_barrier(id, n, 1); }
void dt_emu_bar_arrive(int id, int n) { named_barrier(id, n, 0); }

/* --------------------------------------------------- warp instructions */

static uint16_t half_of(uint32_t r, int h) { return (uint16_t)(h ? r >> 16 : r & 0xffffu); }

static double elem_value(uint16_t bits, dt_dtype ab) {
    return ab == DT_BF16 ? (double)dt_bf16_to_f32(bits) : (double)dt_f16_to_f32(bits);
}

typedef struct mma_in {
    const uint32_t *a;
    uint32_t b0, b1;
} mma_in;

/* setmaxnreg.inc: a warpgroup's new count is granted once the block's
 * warpgroups would hold at most the SM's 65,536 registers with it (the
 * others' .dec release theirs); its threads wait until then. */
static void grant_registers(void) {
    for (int g = 0; g < E.nthreads / 128; g++) {
        if (!E.wg_want[g]) continue;
        int sum = 0;
        for (int h = 0; h < E.nthreads / 128; h++) sum += 128 * (h == g ? E.wg_want[g] : E.wg_regs[h]);
        if (sum > 65536) continue;
        E.wg_regs[g] = E.wg_want[g];
        E.wg_want[g] = 0;
        release(T_WAIT_REGS, 128 * g, 128);
    }
}

/* The last lane to arrive computes every lane's result. */
static void complete_warp_op(emu_thread *lanes, int n, int op) {
    E.counts.warp_ops++;
    switch (op) {
    case OP_SYNCWARP: break;   /* every lane arrived: that is all */
    case OP_SETMAXNREG: {
        /* arg: inc << 16 | count, the same for the whole warpgroup */
        const int w = lanes[0].linear / 128, inc = lanes[0].arg >> 16, count = lanes[0].arg & 0xffff;
        for (int l = 1; l < n; l++)
            if (lanes[l].arg != lanes[0].arg)
                dt_emu_fail("threads of warpgroup %d disagree on setmaxnreg: thread %d has .%s %d, "
                            "thread %d has .%s %d", w, lanes[0].linear, inc ? "inc" : "dec", count,
                            lanes[l].linear, lanes[l].arg >> 16 ? "inc" : "dec",
                            lanes[l].arg & 0xffff);
        if (inc ? count < E.wg_regs[w] : count > E.wg_regs[w])
            dt_emu_fail("setmaxnreg.%s %d by warpgroup %d, which has %d registers per thread",
                        inc ? "inc" : "dec", count, w, E.wg_regs[w]);
        if (inc) E.wg_want[w] = count;   /* granted below when the SM has them */
        else E.wg_regs[w] = count;
        grant_registers();
        break;
    }
    case OP_SHFL_XOR:
        for (int l = 0; l < n; l++) {
            int src = l ^ lanes[l].arg;
            if (lanes[l].arg != lanes[0].arg) dt_emu_fail("shfl.bfly lanes disagree on the lane mask");
            *(float *)lanes[l].out = *(const float *)lanes[src < n ? src : l].in;
        }
        break;
    case OP_LDMATRIX:
    case OP_LDMATRIX_T:
    case OP_STMATRIX:
    case OP_STMATRIX_T: {
        /* Lane 8m + r gives the address of row r of 8x8 matrix m (16
         * bytes); register m of lane l holds M_m[l/4][2(l%4) + h] (h = 0
         * in the low half), or with .trans M_m[2(l%4) + h][l/4]: ldmatrix
         * loads the registers from the rows, stmatrix stores them there. */
        const int store = op == OP_STMATRIX || op == OP_STMATRIX_T;
        const int trans = op == OP_LDMATRIX_T || op == OP_STMATRIX_T;
        unsigned char *rows[32];
        for (int l = 0; l < 32; l++) {
            rows[l] = store ? lanes[l].out : (unsigned char *)lanes[l].in;
            if (!in_smem(rows[l], 16) || (uintptr_t)(rows[l] - E.smem) % 16)
                dt_emu_fail("%s: lane %d's row address (shared offset %td) is not 16 aligned "
                            "bytes inside the %zu bytes of shared memory", op_name(op), l,
                            rows[l] - E.smem, E.smem_bytes);
            tma_check_idle((uint32_t)(rows[l] - E.smem), 16, op_name(op));
        }
        for (int l = 0; l < 32; l++) {
            const uint32_t *src = lanes[l].in;   /* stmatrix's registers */
            uint32_t *dst = lanes[l].out;        /* ldmatrix's */
            for (int m = 0; m < 4; m++)
                for (int h = 0; h < 2; h++) {
                    const int row = trans ? 2 * (l % 4) + h : l / 4;
                    const int col = trans ? l / 4 : 2 * (l % 4) + h;
                    unsigned char *e = rows[8 * m + row] + 2 * col;
                    uint16_t x;
                    if (store) {
                        x = (uint16_t)(src[m] >> (16 * h));
                        memcpy(e, &x, 2);
                    } else {
                        memcpy(&x, e, 2);
                        dst[m] = (h ? dst[m] : 0) | (uint32_t)x << (16 * h);
                    }
                }
        }
        break;
    }
    case OP_MMA_BF16:
    case OP_MMA_F16: {
        /* g = l / 4, t = l % 4. A (16x16): a0 = A[g][2t..2t+1], a1 =
         * A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]. B (16x8):
         * b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]. C, D (16x8 fp32):
         * c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]. */
        const dt_dtype ab = op == OP_MMA_BF16 ? DT_BF16 : DT_F16;
        double A[16][16], B[16][8];
        for (int l = 0; l < 32; l++) {
            const mma_in *in = lanes[l].in;
            const int g = l / 4, t = l % 4;
            for (int reg = 0; reg < 4; reg++)
                for (int h = 0; h < 2; h++)
                    A[g + 8 * (reg & 1)][2 * t + h + 8 * (reg >> 1)] =
                        elem_value(half_of(in->a[reg], h), ab);
            for (int h = 0; h < 2; h++) {
                B[2 * t + h][g] = elem_value(half_of(in->b0, h), ab);
                B[2 * t + h + 8][g] = elem_value(half_of(in->b1, h), ab);
            }
        }
        E.counts.mma++;
        for (int l = 0; l < 32; l++) {
            float *d = lanes[l].out;
            const int g = l / 4, t = l % 4;
            for (int i = 0; i < 4; i++) {
                const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
                double sum = d[i];
                for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
                d[i] = (float)sum;
            }
        }
        break;
    }
    default: dt_emu_fail("unknown warp op %d", op);
    }
}

static void complete_wgmma(emu_thread *threads, int first);

/* A warp instruction (width 32) or warpgroup instruction (width 128, the
 * 128 threads 128w .. 128w + 127 of the block): every thread of the calling
 * thread's warp or warpgroup must arrive here with the same op; the last
 * one computes the results and releases the others. The lanes of a warp
 * execute these .sync.aligned instructions together, so a lane arriving
 * while lanes of its warp wait at another one is a divergence, reported at
 * once; a warpgroup's warps arrive independently. */
static void collective_op(int op, int width, int arg, const void *in, void *out) {
    emu_thread *t = E.cur;
    const int first = t->linear / width * width, warp = t->linear / 32;
    const int n = E.nthreads - first < width ? E.nthreads - first : width;
    const char *unit = width == 32 ? "warp" : "warpgroup";
    if (op != OP_SHFL_XOR && n != width)
        dt_emu_fail("%s in a %s of %d threads", op_name(op), unit, n);
    for (int w = first / 32; w < (first + n + 31) / 32; w++)
        if (E.warp_exited[w])
            for (int l = 0; l < n; l++)
                if (E.threads[first + l].state == T_DONE)
                    dt_emu_fail("%s (full mask) while %s %d of the %s has exited", op_name(op),
                                width == 32 ? "lane" : "thread", l, unit);
    if (E.warp_arrived[warp] > 0 && E.warp_at[warp] != op)
        for (int l = 32 * warp; l < 32 * warp + 32 && l < E.nthreads; l++)
            if (E.threads[l].state == T_WAIT_WARP)
                dt_emu_fail("lanes of warp %d at different warp instructions: lane %d at %s, "
                            "lane %d at %s", warp, l - 32 * warp, op_name(E.threads[l].op),
                            t->linear - 32 * warp, op_name(op));
    E.warp_at[warp] = op;
    E.warp_arrived[warp]++;
    t->op = op;
    t->arg = arg;
    t->in = in;
    t->out = out;
    t->state = T_WAIT_WARP;
    const int arrived = width == 32 ? E.warp_arrived[warp] : ++E.wg_arrived[first / 128];
    if (arrived < n) {
        yield_fiber(0);
        return;
    }
    for (int w = first / 32; w < (first + n + 31) / 32; w++) E.warp_arrived[w] = 0;
    if (width == 128) E.wg_arrived[first / 128] = 0;
    /* every thread counted arrived at op: a lane of the warp at another
     * instruction failed above, and only op counts in wg_arrived */
    if (op == OP_WGMMA) complete_wgmma(&E.threads[first], first);
    else complete_warp_op(&E.threads[first], n, op);
    release(T_WAIT_WARP, first, n);
}

float dt_emu_shfl_xor(unsigned mask, float v, int lane_mask) {
    if (mask != 0xffffffffu) dt_emu_fail("shfl with a partial mask %#x", mask);
    float out;
    collective_op(OP_SHFL_XOR, 32, lane_mask, &v, &out);
    return out;
}

void dt_emu_setmaxnreg(int inc, int count) {
    if (count < 24 || count > 256 || count % 8)
        dt_emu_fail("setmaxnreg.%s %d: the count must be a multiple of 8 from 24 to 256",
                    inc ? "inc" : "dec", count);
    if (E.nthreads % 128)
        dt_emu_fail("setmaxnreg in a block of %d threads: its warpgroups must be whole", E.nthreads);
    collective_op(OP_SETMAXNREG, 128, (inc ? 1 << 16 : 0) | count, NULL, NULL);
    emu_thread *t = E.cur;
    while (E.wg_want[t->linear / 128]) {   /* an .inc not granted yet */
        t->state = T_WAIT_REGS;
        yield_fiber(0);
    }
}

void dt_emu_syncwarp(unsigned mask) {
    if (mask != 0xffffffffu) dt_emu_fail("__syncwarp with a partial mask %#x", mask);
    collective_op(OP_SYNCWARP, 32, 0, NULL, NULL);
}

void dt_emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans) {
    collective_op(trans ? OP_LDMATRIX_T : OP_LDMATRIX, 32, 0, row, r);
}

void dt_emu_stmatrix_x4(void *row, const uint32_t r[4], int trans) {
    collective_op(trans ? OP_STMATRIX_T : OP_STMATRIX, 32, 0, r, row);
}

void dt_emu_mma_m16n8k16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, dt_dtype ab) {
    if (ab != DT_BF16 && ab != DT_F16) dt_emu_fail("mma with operand type %d", (int)ab);
    mma_in in = {a, b0, b1};
    collective_op(ab == DT_BF16 ? OP_MMA_BF16 : OP_MMA_F16, 32, 0, &in, d);
}

float dt_emu_ex2_ftz(float x) {
    if (fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
    const float y = exp2f(x);
    return fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

float dt_emu_max_nan(float a, float b) {
    if (isnan(a) || isnan(b)) {
        const uint32_t canonical = 0x7fffffffu;
        float y;
        memcpy(&y, &canonical, sizeof y);
        return y;
    }
    if (a == b) return signbit(a) ? b : a;   /* max(-0, +0) = +0 */
    return a > b ? a : b;
}

/* ------------------------------------------------ warpgroup MMA (wgmma) */

uint32_t dt_emu_smem_addr(const void *p) {
    const unsigned char *c = p;
    if (!E.smem || c < E.smem || c > E.smem + E.smem_bytes)
        dt_emu_fail("__cvta_generic_to_shared(%p): not a pointer into the %zu bytes of dynamic "
                    "shared memory", p, E.smem_bytes);
    return EMU_SMEM_BASE + (uint32_t)(c - E.smem);
}

void dt_emu_fence_proxy_async(void) {
    E.cur->cp_unfenced = 0;
    E.proxy_fenced = 1;
}

void dt_emu_wgmma_fence(void) { E.cur->wg_fenced = 1; }

void dt_emu_wgmma_commit(void) {
    emu_thread *t = E.cur;
    for (int i = 0; i < t->nwg; i++)
        if (t->wg[i].group < 0) t->wg[i].group = t->wg_next_group;
    t->wg_next_group++;
}

/* A matrix descriptor ("Matrix Descriptor Format"): bits 0-13 the start
 * address, 16-29 the leading dimension byte offset (LBO), 32-45 the stride
 * dimension byte offset (SBO), each encoded as (x & 0x3ffff) >> 4; bits
 * 49-51 the base offset; bits 62-63 the swizzle mode (0 none, 1 128-byte,
 * 2 64-byte, 3 32-byte); the other bits reserved. Decoded: byte values. */
typedef struct wg_desc {
    uint32_t start, lbo, sbo;
} wg_desc;

static wg_desc decode_desc(uint64_t desc, const char *which) {
    const uint64_t reserved = 3ull << 14 | 3ull << 30 | 7ull << 46 | 0x3ffull << 52;
    const int base = (int)(desc >> 49 & 7), mode = (int)(desc >> 62);
    if (mode != 1 || base != 0)
        dt_emu_fail("wgmma.mma_async: %s descriptor %#llx: swizzle mode %d with base offset %d is "
                    "not emulated (only the 128-byte swizzle, mode 1, with base offset 0)", which,
                    (unsigned long long)desc, mode, base);
    if (desc & reserved)
        dt_emu_fail("wgmma.mma_async: %s descriptor %#llx sets reserved bits %#llx", which,
                    (unsigned long long)desc, (unsigned long long)(desc & reserved));
    return (wg_desc){(uint32_t)(desc & 0x3fff) << 4, (uint32_t)(desc >> 16 & 0x3fff) << 4,
                     (uint32_t)(desc >> 32 & 0x3fff) << 4};
}

/* The shared-window address the hardware reads element (mn, k) of a 16-bit
 * operand at: mn its M index (A) or N index (B), k its K index (0..15).
 *
 * From "Canonical Layouts" of the PTX ISA (CuTe layouts in elements,
 * T = 128 / 16 = 8 elements = 16 bytes; their LBO and SBO are the
 * descriptor's byte offsets in elements, as the PTX examples' "LBO =
 * 128*sizeof(bf16)", encoded LBO >> 4, show) and the 128-byte swizzle
 * Swizzle<3,4,3>:
 *   K-major  ((8,m),(T,2k)):((8T,SBO),(1,T)): mn = mn0 + 8 mn1 (mn0 < 8),
 *            k = k0 + T k1 (k0 < T): mn0 8T + mn1 SBO + k0 + k1 T elements,
 *            that is  start + 128 (mn % 8) + SBO (mn / 8) + 2 k  bytes:
 *            rows of 128 bytes, 8 rows to an atom, the next 8 rows SBO
 *            further; the 16 k of one instruction are 32 contiguous bytes
 *            of a row. LBO is unused ("not used, assumed to be 1").
 *   MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): mn = mn0 + T mn1 +
 *            8T mn2 (mn0 < T, mn1 < 8), k = k0 + 8 k1 (k0 < 8):
 *            mn0 + T mn1 + LBO mn2 + 8T k0 + SBO k1 elements, that is
 *            start + 2 (mn % 64) + LBO (mn / 64) + 128 (k % 8) + SBO (k / 8)
 *            bytes: each k a 128-byte row of 64 consecutive mn, 8 k to an
 *            atom, the next 8 k SBO further, the next 64 mn LBO further.
 * The swizzle then permutes the 16-byte chunks of each 128-byte row by the
 * row's place in its 1024-byte pattern: address bits 4-6 ^= bits 7-9. It
 * acts on the address itself, not on the offset from the start address:
 * the descriptor's base offset, (pattern start >> 7) & 7, exists for
 * patterns that do not start at a 1024-byte boundary, so with base offset
 * 0 the patterns are anchored at 1024-byte boundaries of the shared window.
 * A start address inside a pattern (advanced 32 bytes per K step of 16
 * within a 128-byte K-major row, say) thus reads what a kernel wrote with
 * the swizzle of the whole atom at its 1024-aligned address. The emulated
 * window puts the dynamic shared memory at 16, so a kernel must align its
 * atoms by shared address (dt_emu_smem_addr), as on the hardware. */
static uint32_t wgmma_elem_addr(const wg_desc *d, int mn_major, int mn, int k) {
    const uint32_t m = (uint32_t)mn, kk = (uint32_t)k;
    const uint32_t a = mn_major ? d->start + 2 * (m % 64) + d->lbo * (m / 64) + 128 * (kk % 8) +
                                      d->sbo * (kk / 8)
                                : d->start + 128 * (m % 8) + d->sbo * (m / 8) + 2 * kk;
    return a ^ (((a >> 7) & 7u) << 4);
}

/* The operands one thread gives a wgmma.mma_async. */
typedef struct wgmma_in {
    float *d;
    const uint32_t *a;   /* NULL: A from desc_a */
    uint64_t desc_a, desc_b;
    int n, scale_d, trans_b;
    dt_dtype ab;
} wgmma_in;

/* Reads op's shared-memory operands (A when a_smem, and B) into op->a,
 * op->b; or, `compare`, fails if shared memory no longer holds them. */
static void sweep_operands(wgmma_op *op, int compare) {
    for (int which = op->a_smem ? 0 : 1; which < 2; which++) {
        const uint64_t desc = which ? op->desc_b : op->desc_a;
        const wg_desc dd = decode_desc(desc, which ? "B" : "A");
        const int mn_major = which && op->trans_b, nmn = which ? op->n : WG_M;
        for (int mn = 0; mn < nmn; mn++)
            for (int k = 0; k < WG_K; k++) {
                const uint32_t addr = wgmma_elem_addr(&dd, mn_major, mn, k);
                /* A[mn][k], or B[k][mn] */
                const int row = which ? k : mn, col = which ? mn : k;
                uint16_t *kept = which ? &op->b[op->n * k + mn] : &op->a[WG_K * mn + k];
                if (addr < EMU_SMEM_BASE || addr - EMU_SMEM_BASE > E.smem_bytes ||
                    E.smem_bytes - (addr - EMU_SMEM_BASE) < 2)
                    dt_emu_fail("wgmma.mma_async: %s descriptor %#llx: %s[%d][%d] at shared "
                                "address %#x is outside the dynamic shared memory (shared "
                                "addresses [%#x, %#zx))",
                                which ? "B" : "A", (unsigned long long)desc, which ? "B" : "A", row,
                                col, addr, (unsigned)EMU_SMEM_BASE,
                                (size_t)EMU_SMEM_BASE + E.smem_bytes);
                if (!compare && (E.tma_busy[addr - EMU_SMEM_BASE] ||
                                 E.tma_busy[addr - EMU_SMEM_BASE + 1]))
                    tma_check_idle(addr - EMU_SMEM_BASE, 2,
                                   which ? "wgmma.mma_async reading B from"
                                         : "wgmma.mma_async reading A from");
                uint16_t v, seen;
                memcpy(&v, E.smem + (addr - EMU_SMEM_BASE), 2);
                memcpy(&seen, E.smem_async + (addr - EMU_SMEM_BASE), 2);
                if (!compare && v != seen)
                    dt_emu_fail("wgmma.mma_async reads %s[%d][%d] at shared offset %u (shared "
                                "address %#x), written by ordinary stores that no "
                                "fence.proxy.async and barrier after it made visible to the "
                                "async proxy", which ? "B" : "A", row, col, addr - EMU_SMEM_BASE,
                                addr);
                if (!compare) {
                    *kept = v;
                    const uint32_t o = addr - EMU_SMEM_BASE;
                    if (o < op->lo[which]) op->lo[which] = o;
                    if (o + 2 > op->hi[which]) op->hi[which] = o + 2;
                } else if (v != *kept)
                    dt_emu_fail("shared memory at offset %u (shared address %#x), read by a "
                                "wgmma.mma_async as %s[%d][%d], was written before the "
                                "wgmma.wait_group that completes it", addr - EMU_SMEM_BASE, addr,
                                which ? "B" : "A", row, col);
            }
    }
}

static void release_op(wgmma_op *op) {
    if (--op->refs == 0) free(op);
}

/* The last thread of the warpgroup to arrive: checks that all 128 issued
 * the same instruction, reads A and B, computes every thread's result and
 * leaves it pending in the thread's records. Register fragments (PTX ISA,
 * "Matrix Fragments for wgmma.mma_async.m64nNk16", figures for A and D):
 * warp w of the warpgroup holds rows 16w .. 16w + 15; with lane l, g =
 * l / 4, t = l % 4, element e of a thread (A: register e / 2, low half for
 * even e; D: register e) is at
 *   row 16 w + g + 8 ((e >> 1) & 1),  column 8 (e >> 2) + 2 t + (e & 1),
 * e in 0..7 for A (16 columns), 0..N/2-1 for D (N columns). Sums in double,
 * rounded to fp32 once per instruction. */
static void complete_wgmma(emu_thread *threads, int first) {
    static const char *const field[] = {"n", "A operand (0 registers, 1 descriptor)", "desc_a",
                                        "desc_b", "scale_d", "trans_b", "type"};
    const wgmma_in *in0 = threads[0].in;
    for (int l = 1; l < 128; l++) {
        const wgmma_in *in = threads[l].in;
        const unsigned long long v[2][7] = {
            {(unsigned long long)in0->n, !in0->a, in0->desc_a, in0->desc_b,
             (unsigned long long)in0->scale_d, (unsigned long long)in0->trans_b,
             (unsigned long long)in0->ab},
            {(unsigned long long)in->n, !in->a, in->desc_a, in->desc_b,
             (unsigned long long)in->scale_d, (unsigned long long)in->trans_b,
             (unsigned long long)in->ab}};
        for (int f = 0; f < 7; f++)
            if (v[0][f] != v[1][f]) {
                char x[2][24];
                for (int i = 0; i < 2; i++)
                    snprintf(x[i], sizeof x[i], f == 2 || f == 3 ? "%#llx" : "%llu", v[i][f]);
                dt_emu_fail("threads of warpgroup %d disagree on wgmma.mma_async's %s: thread %d "
                            "has %s, thread %d has %s", first / 128, field[f], first, x[0],
                            first + l, x[1]);
            }
    }
    const int n = in0->n, nreg = n / 2;
    const dt_dtype ab = in0->ab;
    wgmma_op *op = calloc(1, sizeof *op);
    if (!op) dt_emu_fail("out of memory");
    E.wg_new = op;   /* freed by the launch if a check below fails */
    op->n = n;
    op->a_smem = !in0->a;
    op->trans_b = in0->trans_b;
    op->desc_a = in0->desc_a;
    op->desc_b = in0->desc_b;
    op->lo[0] = op->lo[1] = UINT32_MAX;   /* none read yet (A from registers: none) */
    sweep_operands(op, 0);
    /* the launch mutex serialises every use: static, off the fiber stack */
    static double A[WG_M][WG_K], B[WG_K][WG_NMAX];
    for (int k = 0; k < WG_K; k++)
        for (int j = 0; j < n; j++) B[k][j] = elem_value(op->b[n * k + j], ab);
    for (int i = 0; i < WG_M; i++)
        for (int k = 0; k < WG_K && op->a_smem; k++) A[i][k] = elem_value(op->a[WG_K * i + k], ab);
    for (int l = 0; l < 128 && !op->a_smem; l++) {
        const uint32_t *a = ((const wgmma_in *)threads[l].in)->a;
        const int w = l / 32, g = l % 32 / 4, t = l % 4;
        for (int e = 0; e < 8; e++)
            A[16 * w + g + 8 * ((e >> 1) & 1)][8 * (e >> 2) + 2 * t + (e & 1)] =
                elem_value(half_of(a[e / 2], e & 1), ab);
    }
    for (int l = 0; l < 128; l++) {
        emu_thread *th = &threads[l];
        const wgmma_in *in = th->in;
        th->wg = room(th->wg, th->nwg, &th->wgcap, sizeof *th->wg);
        /* the input accumulator: the pending result of the latest
         * mma_async on the same d (dt_emu_wgmma allowed no other overlap),
         * else d's registers as they are, which then hold garbage (a NaN)
         * until the wait: a read before it shows, and a write is caught
         * there; with scale_d = 0 their contents are never looked at */
        const emu_wgmma *prev = NULL;
        for (int i = 0; i < th->nwg; i++)
            if (th->wg[i].d == in->d) prev = &th->wg[i];
        emu_wgmma *r = &th->wg[th->nwg];
        const float *src = prev ? prev->result : in->d;
        const int w = l / 32, g = l % 32 / 4, t = l % 4;
        for (int e = 0; e < nreg; e++) {
            const int row = 16 * w + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t + (e & 1);
            double sum = in->scale_d ? (double)src[e] : 0.0;
            for (int k = 0; k < WG_K; k++) sum += A[row][k] * B[k][col];
            r->result[e] = (float)sum;
        }
        if (prev) {
            memcpy(r->expect, prev->result, sizeof(float) * (size_t)nreg);
        } else {
            const uint32_t poison = EMU_WG_POISON;
            for (int e = 0; e < nreg; e++) memcpy(&in->d[e], &poison, sizeof poison);
            memcpy(r->expect, in->d, sizeof(float) * (size_t)nreg);
        }
        r->d = in->d;
        r->nreg = nreg;
        r->group = -1;
        r->op = op;
        op->refs++;
        th->nwg++;
    }
    E.wg_new = NULL;
    E.counts.warp_ops++;
    E.counts.mma++;
    E.counts.wgmma++;
}

void dt_emu_wgmma(float *d, int n, const uint32_t *a, uint64_t desc_a, uint64_t desc_b, int scale_d,
                  int trans_b, dt_dtype ab) {
    emu_thread *t = E.cur;
    /* a warpgroup is four contiguous warps, the first's rank a multiple
     * of 4 (PTX ISA, "Warpgroup"): the caller's must be whole; the block
     * may have more warps (a producer warpgroup, or warps that issue none) */
    if (t->linear / 128 * 128 + 128 > E.nthreads)
        dt_emu_fail("wgmma.mma_async by thread %d of a block of %d threads: its warpgroup (threads "
                    "%d ..) is not whole", t->linear, E.nthreads, t->linear / 128 * 128);
    if (n < 8 || n > WG_NMAX || n % 8)
        dt_emu_fail("wgmma.mma_async.m64n%dk16: N must be a multiple of 8 from 8 to 256", n);
    if (ab != DT_BF16 && ab != DT_F16)
        dt_emu_fail("wgmma.mma_async with operand type %d (bf16 and f16 are emulated)", (int)ab);
    if (trans_b != 0 && trans_b != 1) dt_emu_fail("wgmma.mma_async with imm-trans-b %d", trans_b);
    if (!d) dt_emu_fail("wgmma.mma_async without accumulator registers (d = NULL)");
    if (!t->wg_fenced)
        dt_emu_fail("wgmma.mma_async without wgmma.fence (one is needed after the kernel's start "
                    "and after each wgmma.wait_group, before the next wgmma.mma_async)");
    if (E.async_stale)
        dt_emu_fail("shared memory written by cp.async reaches wgmma without fence.proxy.async (a "
                    "__syncthreads published the copies of a thread that ran no fence.proxy.async "
                    "after its cp.async.wait_group)");
    const uintptr_t lo = (uintptr_t)d, hi = (uintptr_t)(d + n / 2);
    for (int i = 0; i < t->nwg; i++) {
        const emu_wgmma *r = &t->wg[i];
        const uintptr_t rlo = (uintptr_t)r->d, rhi = (uintptr_t)(r->d + r->nreg);
        if (lo < rhi && rlo < hi && (r->d != d || r->nreg != n / 2))
            dt_emu_fail("wgmma.mma_async.m64n%dk16's accumulators overlap those of a pending "
                        "wgmma.mma_async.m64n%dk16 without being the same registers with the same "
                        "shape (only those are ordered without a wgmma.wait_group)", n,
                        2 * r->nreg);
    }
    (void)decode_desc(desc_b, "B");
    if (!a) (void)decode_desc(desc_a, "A");
    const wgmma_in in = {d, a, a ? 0 : desc_a, desc_b, n, scale_d != 0, trans_b, ab};
    collective_op(OP_WGMMA, 128, 0, &in, NULL);
}

void dt_emu_wgmma_wait(int n) {
    emu_thread *t = E.cur;
    if (n < 0) dt_emu_fail("wgmma.wait_group %d", n);
    const long cutoff = t->wg_next_group - n;
    for (int i = 0; i < t->nwg; i++) {
        emu_wgmma *r = &t->wg[i];
        if (r->group < 0 || r->group >= cutoff) continue;
        wgmma_op *op = r->op;
        if (!op->checked) {
            sweep_operands(op, 1);
            op->checked = 1;
        }
        for (int e = 0; e < r->nreg; e++)
            if (memcmp(&r->d[e], &r->expect[e], sizeof(float)))
                dt_emu_fail("accumulator register d[%d] of a wgmma.mma_async.m64n%dk16 was written "
                            "before the wgmma.wait_group that completes it", e, 2 * r->nreg);
        memcpy(r->d, r->result, sizeof(float) * (size_t)r->nreg);
        r->op = NULL;   /* completed: the launch's clean-up skips it */
        release_op(op);
    }
    int kept = 0;
    for (int i = 0; i < t->nwg; i++)
        if (t->wg[i].op) t->wg[kept++] = t->wg[i];
    t->nwg = kept;
    t->wg_fenced = 0;   /* the next mma_async needs a wgmma.fence again */
}

/* ------------------------------------------------ mbarrier and TMA (sm_90)
 *
 * mbarrier (PTX ISA "Parallel Synchronization and Communication
 * Instructions: mbarrier"): mbarrier.init sets the expected arrival count
 * (1 .. 2^20 - 1), phase 0 and tx-count 0. A phase completes when its
 * pending arrivals are 0 and its tx-count is 0; the next phase then starts
 * with the arrivals reloaded ("Phase Completion of the mbarrier object").
 * arrive.expect_tx adds its bytes to the tx-count, then arrives; the
 * complete_tx of a tensor copy subtracts the box's bytes. try_wait.parity p
 * succeeds when the phase of parity p has completed, that is when the
 * current phase's parity differs from p: p is the parity of "the current
 * phase or the immediately preceding phase", and only the preceding one is
 * complete (so right after the init, parity 1 succeeds and parity 0 waits).
 *
 * cp.async.bulk.tensor (tiled, global -> shared, mbarrier::complete_tx):
 * the copy is deferred as late as CUDA allows. At the issue its destination
 * becomes 0xff bytes (NaN in bf16 / fp16) and it is recorded as pending on
 * its mbarrier; it is performed, box and complete_tx at once, only when a
 * thread waiting on that mbarrier needs it (dt_emu_mbar_wait: while the
 * awaited phase is incomplete, the barrier's oldest pending copy completes,
 * then the next), or at the end of the block. So data read without the
 * wait is garbage, and a phase whose expect_tx does not match its copies
 * never completes (a deadlock, reported).
 *
 * Checked, each failing the launch with a message: a barrier address that
 * is not 8 aligned bytes inside the dynamic shared memory; an mbarrier
 * instruction on a barrier not initialised in this block; its 8 bytes
 * overwritten since the init; mbarrier.init of a live barrier (PTX: undefined
 * without mbarrier.inval, which is not emulated) or a count outside
 * 1 .. 2^20 - 1; a barrier used by a thread other than the one that
 * initialised it before a __syncthreads completed after the init; a tensor
 * copy completing on a barrier whose init neither its thread's
 * fence.mbarrier_init nor a __syncthreads has ordered before the copy
 * (checked at the issue); an arrival beyond the expected count in a phase
 * (the phase had all its arrivals and waits for transactions: "phase
 * overflow"); a tx-count outside +-(2^20 - 1); a parity other than 0 or 1;
 * a deadlock (every live thread blocked, in mbarrier waits, __syncthreads or
 * warp instructions), naming a thread and its barrier. For the copies, see
 * dt_emu_tma_load. */

enum { MBAR_MAX = (1 << 20) - 1 };   /* arrival count and |tx-count| limit */

/* What a live barrier's 8 bytes hold ("MBAR" and its offset). */
static uint64_t mbar_stamp(uint32_t off) { return 0x4d42415200000000ull | off; }

static emu_mbar *mbar_find(uint32_t off) {
    for (int i = 0; i < E.nmbar; i++)
        if (E.mbars[i].off == off) return &E.mbars[i];
    return NULL;
}

/* The shared offset of a barrier address, which must be 8 aligned bytes
 * inside the dynamic shared memory. */
static uint32_t mbar_offset(const void *bar, const char *op) {
    const unsigned char *p = bar;
    if (!in_smem(p, 8) || (p - E.smem) % 8)
        dt_emu_fail("%s: mbarrier address %p is not 8 aligned bytes inside the %zu bytes of "
                    "dynamic shared memory", op, bar, E.smem_bytes);
    return (uint32_t)(p - E.smem);
}

/* The live barrier at `bar`, usable by the calling thread. Not to be kept
 * across a yield or an init (E.mbars may move). */
static emu_mbar *mbar_use(const void *bar, const char *op) {
    const uint32_t off = mbar_offset(bar, op);
    emu_mbar *b = mbar_find(off);
    if (!b)
        dt_emu_fail("%s on shared offset %u: no mbarrier was initialised there in this block "
                    "(mbarrier.init first)", op, off);
    uint64_t v;
    memcpy(&v, E.smem + off, 8);
    if (v != mbar_stamp(off))
        dt_emu_fail("%s: the 8 bytes of the mbarrier at shared offset %u were overwritten since "
                    "its mbarrier.init (only mbarrier instructions may access them)", op, off);
    if (E.cur->linear != b->init_thread && !b->synced)
        dt_emu_fail("%s on the mbarrier at shared offset %u before a __syncthreads ordered it "
                    "after its mbarrier.init by thread %d", op, off, b->init_thread);
    return b;
}

/* Threads blocked on the barrier at off re-check it. */
static void mbar_wake(uint32_t off) {
    for (int i = 0; i < E.nthreads; i++)
        if (E.threads[i].state == T_WAIT_MBAR && E.threads[i].mbar_off == off)
            wake(&E.threads[i]);
}

/* Completes b's current phase if its arrivals and transactions are in. */
static void mbar_advance(emu_mbar *b) {
    if (b->pending == 0 && b->tx == 0) {
        b->phase++;
        b->pending = b->expected;
    }
    mbar_wake(b->off);
}

void dt_emu_mbar_init(void *bar, unsigned count) {
    const uint32_t off = mbar_offset(bar, "mbarrier.init");
    if (count < 1 || count > MBAR_MAX)
        dt_emu_fail("mbarrier.init at shared offset %u with count %u (1 .. 2^20 - 1)", off, count);
    const emu_mbar *old = mbar_find(off);
    if (old)
        dt_emu_fail("mbarrier.init of the mbarrier at shared offset %u, initialised already in "
                    "this block by thread %d (its phase %llu has %u of %u arrivals missing, "
                    "tx-count %lld): mbarrier.init on a live mbarrier is undefined", off,
                    old->init_thread, (unsigned long long)old->phase, old->pending, old->expected,
                    (long long)old->tx);
    tma_check_idle(off, 8, "mbarrier.init at");
    E.mbars = room(E.mbars, E.nmbar, &E.mbarcap, sizeof *E.mbars);
    E.mbars[E.nmbar++] = (emu_mbar){off, count, count, 0, 0, E.cur->linear, 0, 0};
    const uint64_t stamp = mbar_stamp(off);
    memcpy(E.smem + off, &stamp, 8);
}

void dt_emu_fence_mbarrier_init(void) {
    for (int i = 0; i < E.nmbar; i++)
        if (E.mbars[i].init_thread == E.cur->linear) E.mbars[i].fenced = 1;
}

static void mbar_arrive_on(emu_mbar *b, uint32_t tx_bytes, const char *op) {
    if (b->pending == 0)
        dt_emu_fail("%s on the mbarrier at shared offset %u: its phase %llu had all %u expected "
                    "arrivals already and waits for tx-count %lld (phase overflow: more "
                    "arrivals than mbarrier.init's count in one phase)", op, b->off,
                    (unsigned long long)b->phase, b->expected, (long long)b->tx);
    if (b->tx + (int64_t)tx_bytes > MBAR_MAX)
        dt_emu_fail("%s of %u bytes on the mbarrier at shared offset %u: its tx-count %lld would "
                    "pass 2^20 - 1", op, tx_bytes, b->off, (long long)b->tx);
    b->tx += tx_bytes;   /* the expect-tx comes before the arrive-on */
    b->pending--;
    mbar_advance(b);
}

void dt_emu_mbar_arrive(void *bar) {
    mbar_arrive_on(mbar_use(bar, "mbarrier.arrive"), 0, "mbarrier.arrive");
}

void dt_emu_mbar_arrive_expect_tx(void *bar, uint32_t bytes) {
    const char *op = "mbarrier.arrive.expect_tx";
    emu_mbar *b = mbar_use(bar, op);
    if (bytes > MBAR_MAX)
        dt_emu_fail("%s of %u bytes (at most 2^20 - 1) on the mbarrier at shared offset %u", op,
                    bytes, b->off);
    mbar_arrive_on(b, bytes, op);
}

static void tma_complete(int i);

void dt_emu_mbar_wait(void *bar, uint32_t parity) {
    emu_thread *t = E.cur;
    const char *op = "mbarrier.try_wait.parity";
    if (parity > 1) dt_emu_fail("%s with phaseParity %u (0 or 1)", op, parity);
    for (;;) {
        const emu_mbar *b = mbar_use(bar, op);
        if ((b->phase & 1) != parity) return;   /* the phase of that parity completed */
        int oldest = -1;
        for (int i = 0; i < E.ntma && oldest < 0; i++)
            if (E.tmas[i].bar == b->off) oldest = i;
        if (oldest >= 0) {
            tma_complete(oldest);   /* the latest moment it could complete */
            continue;
        }
        /* blocked until an arrival or a new copy on the barrier */
        t->mbar_off = b->off;
        t->mbar_parity = parity;
        t->state = T_WAIT_MBAR;
        yield_fiber(0);
    }
}

/* ---- the tensor copy */

/* Where byte `off` (a shared offset) of a box lands with swizzle mode sw
 * (CUtensorMapSwizzle 0..3), from the PTX ISA's "Swizzling Modes": the
 * 16-byte chunk index, address bits 4-6, is XORed with bits 7-9 of the
 * shared-window address for 128 bytes (bits 4-5 with 7-8 for 64, bit 4
 * with 7 for 32), the patterns being anchored at 1024- (512-, 256-) byte
 * boundaries of the window ("the swizzle base offset is 0 when the dstMem
 * shared memory address is located at" such a boundary, "(dstMem / 128) %
 * 8" otherwise: the same rule). An involution that keeps bytes in their
 * 128-byte line. */
static uint32_t tma_swizzle(uint32_t off, uint32_t sw) {
    const uint32_t a = EMU_SMEM_BASE + off, mask = sw == 3 ? 7u : sw == 2 ? 3u : sw == 1 ? 1u : 0u;
    return (a ^ ((a >> 7 & mask) << 4)) - EMU_SMEM_BASE;
}

/* 1 if shared byte off is in pending copy x's destination (the swizzle
 * is its own inverse). */
static int tma_covers(const emu_tma *x, uint32_t off) {
    return tma_swizzle(off, x->map.swizzle) - x->dst < x->bytes;
}

/* Fails if [off, off + bytes) meets the destination of a pending copy. */
static void tma_check_idle(uint32_t off, uint32_t bytes, const char *what) {
    for (uint32_t k = 0; k < bytes; k++) {
        if (!E.tma_busy[off + k]) continue;
        for (int i = 0; i < E.ntma; i++)
            if (tma_covers(&E.tmas[i], off + k))
                dt_emu_fail("%s shared offset %u: inside the destination of a cp.async.bulk.tensor "
                            "(issued by thread %d, completing on the mbarrier at shared offset %u) "
                            "that has not completed: wait on its mbarrier first", what, off + k,
                            E.tmas[i].thread, E.tmas[i].bar);
        dt_emu_fail("%s shared offset %u: inside a pending cp.async.bulk.tensor's destination", what,
                    off + k);
    }
}

/* Performs pending copy x: the in-bounds elements of its box from global
 * memory, zeros for the others, in box order (dimension 0 fastest) at the
 * swizzled places; clears its busy marks. Returns -1, or (writing nothing)
 * a shared offset of its destination that no longer holds the 0xff of the
 * issue: written meanwhile. */
static long tma_perform(const emu_tma *x) {
    const dt_emu_tmap *m = &x->map;
    for (uint32_t o = 0; o < x->bytes; o += 16) {
        const uint32_t c = tma_swizzle(x->dst + o, m->swizzle);
        for (uint32_t k = 0; k < 16; k++)
            if (E.smem[c + k] != EMU_POISON) return (long)(c + k);
    }
    const uint32_t esize = (uint32_t)m->stride[0], row_bytes = m->box[0] * esize;
    for (uint32_t r = 0; r < x->bytes / row_bytes; r++) {
        /* this row's place in dimensions 1.. of the box */
        uint64_t rem = r, goff = 0;
        int inside = 1;
        for (uint32_t i = 1; i < m->rank; i++) {
            const int64_t c = x->coord[i] + (int64_t)(rem % m->box[i]);
            rem /= m->box[i];
            if (c < 0 || (uint64_t)c >= m->dim[i]) inside = 0;
            else goff += (uint64_t)c * m->stride[i];
        }
        for (uint32_t j = 0; j < m->box[0]; j++) {
            const int64_t c = x->coord[0] + (int64_t)j;
            const uint32_t at = tma_swizzle(x->dst + r * row_bytes + j * esize, m->swizzle);
            unsigned char *to = E.smem + at;
            if (inside && c >= 0 && (uint64_t)c < m->dim[0])
                memcpy(to, (const void *)(uintptr_t)(m->addr + goff + (uint64_t)c * esize), esize);
            else
                memset(to, 0, esize);   /* out of bounds: zero (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) */
            memcpy(E.smem_async + at, to, esize);   /* written through the async proxy */
        }
    }
    for (uint32_t o = 0; o < x->bytes; o += 16)
        memset(E.tma_busy + tma_swizzle(x->dst + o, m->swizzle), 0, 16);
    return -1;
}

static void tma_remove(int i) {
    memmove(&E.tmas[i], &E.tmas[i + 1], sizeof *E.tmas * (size_t)(E.ntma - i - 1));
    E.ntma--;
}

/* Completes pending copy i (from a fiber): the data, then complete_tx of
 * its bytes on its barrier. */
static void tma_complete(int i) {
    const emu_tma x = E.tmas[i];
    const long bad = tma_perform(&x);
    if (bad >= 0)
        dt_emu_fail("shared memory at offset %ld was written while a cp.async.bulk.tensor into it "
                    "(issued by thread %d) was in flight", bad, x.thread);
    tma_remove(i);
    emu_mbar *b = mbar_find(x.bar);   /* live: barriers last the block */
    if (!b) dt_emu_fail("cp.async.bulk.tensor completing on a vanished mbarrier");
    if (b->tx - (int64_t)x.bytes < -(int64_t)MBAR_MAX)
        dt_emu_fail("complete_tx of %u bytes on the mbarrier at shared offset %u: its tx-count "
                    "%lld would pass -(2^20 - 1)", x.bytes, x.bar, (long long)b->tx);
    b->tx -= x.bytes;
    mbar_advance(b);
}

/* The map at tensor_map, decoded into *m, for the instruction op. */
static void tmap_read(const char *op, const void *tensor_map, dt_emu_tmap *m) {
    if (!tensor_map || (uintptr_t)tensor_map % 64)
        dt_emu_fail("%s: tensor map address %p is not 64-byte aligned", op, tensor_map);
    if (dt_emu_tmap_unpack(tensor_map, m))
        dt_emu_fail("%s: %p is not a tensor map that cuTensorMapEncodeTiled wrote (or it was "
                    "changed since)", op, tensor_map);
}

void dt_emu_tma_prefetch(const void *tensor_map) {
    dt_emu_tmap m;
    tmap_read("prefetch.tensormap", tensor_map, &m);
}

void dt_emu_tma_load(void *dst, const void *tensor_map, const int32_t *coords, int rank, void *bar) {
    const char *op = "cp.async.bulk.tensor";
    dt_emu_tmap m;
    tmap_read(op, tensor_map, &m);
    if (rank != (int)m.rank)
        dt_emu_fail("%s.%dd with a tensor map of rank %u", op, rank, m.rank);
    if (!coords) dt_emu_fail("%s without coordinates", op);
    /* the box: its bytes, the destination */
    uint64_t bytes = m.stride[0];
    for (uint32_t i = 0; i < m.rank; i++) bytes *= m.box[i];
    const unsigned char *d = dst;
    if (!in_smem(d, 1) || bytes > E.smem_bytes - (size_t)(d - E.smem) ||
        (EMU_SMEM_BASE + (d - E.smem)) % 128)
        dt_emu_fail("%s: destination %p (a box of %llu bytes) is not 128-byte aligned (by shared "
                    "address) inside the %zu bytes of dynamic shared memory", op, dst,
                    (unsigned long long)bytes, E.smem_bytes);
    const uint32_t off = (uint32_t)(d - E.smem);
    emu_mbar *b = mbar_use(bar, op);
    if (!b->fenced && !b->synced)
        dt_emu_fail("%s completing on the mbarrier at shared offset %u, whose mbarrier.init (by "
                    "thread %d) the async proxy may not see yet: fence.mbarrier_init by that "
                    "thread, or a __syncthreads, must come between them", op, b->off,
                    b->init_thread);
    const uint32_t bar_off = b->off;
    /* the destination's chunks, swizzled: in shared memory, free of pending
     * copies (TMA or cp.async) and of barriers */
    for (uint32_t o = 0; o < bytes; o += 16) {
        const uint32_t c = tma_swizzle(off + o, m.swizzle);
        if (c + 16 > E.smem_bytes)
            dt_emu_fail("%s: byte %u of the box lands at shared offset %u (swizzled), past the %zu "
                        "bytes of dynamic shared memory", op, o, c, E.smem_bytes);
        tma_check_idle(c, 16, "cp.async.bulk.tensor into");
        for (int i = 0; i < E.nmbar; i++)
            if (E.mbars[i].off / 16 * 16 == c)
                dt_emu_fail("%s: its destination covers the mbarrier at shared offset %u", op,
                            E.mbars[i].off);
        memset(E.tma_busy + c, 1, 16);
    }
    for (int i = 0; i < E.nthreads; i++)
        for (int j = 0; j < E.threads[i].ncopies; j++) {
            const uint32_t c = (uint32_t)(E.threads[i].copies[j].dst - E.smem);
            if (E.tma_busy[c])
                dt_emu_fail("%s: its destination covers shared offset %u, where a cp.async of "
                            "thread %d is in flight", op, c, i);
        }
    /* ... and of the operands of every wgmma.mma_async that some thread has
     * not yet completed with its wgmma.wait_group (the hardware reads them at
     * some point before the wait) */
    for (int i = 0; i < E.nthreads; i++)
        for (int j = 0; j < E.threads[i].nwg; j++) {
            const wgmma_op *w = E.threads[i].wg[j].op;
            for (int ab = 0; w && ab < 2; ab++)
                if (off < w->hi[ab] && w->lo[ab] < off + bytes)
                    dt_emu_fail("%s: its destination, shared offsets [%u, %llu), meets shared "
                                "memory [%u, %u) that a wgmma.mma_async reads as %s, which thread "
                                "%d has not completed with wgmma.wait_group", op, off,
                                (unsigned long long)(off + bytes), w->lo[ab], w->hi[ab],
                                ab ? "B" : "A", i);
        }
    /* the global reads: the in-bounds part of the box, inside the allocation
     * holding the tensor's address */
    const void *alloc;
    size_t alloc_bytes;
    if (!dt_emu_cuda_allocation((const void *)(uintptr_t)m.addr, &alloc, &alloc_bytes))
        dt_emu_fail("%s: the tensor map's global address %#llx is not in memory CUDA knows "
                    "(cudaMalloc, cudaHostAlloc)", op, (unsigned long long)m.addr);
    uint64_t lo = 0, hi = 0;
    int empty = 0, overflow = 0;
    for (uint32_t i = 0; i < m.rank; i++) {
        const int64_t first = coords[i] > 0 ? coords[i] : 0;
        const int64_t end = (int64_t)coords[i] + m.box[i] < (int64_t)m.dim[i]
                                ? (int64_t)coords[i] + m.box[i] : (int64_t)m.dim[i];
        if (first >= end) {
            empty = 1;
            break;
        }
        uint64_t a, z;
        overflow |= __builtin_mul_overflow((uint64_t)first, m.stride[i], &a) |
                    __builtin_mul_overflow((uint64_t)(end - 1), m.stride[i], &z) |
                    __builtin_add_overflow(lo, a, &lo) | __builtin_add_overflow(hi, z, &hi);
    }
    const uint64_t start = m.addr - (uint64_t)(uintptr_t)alloc;   /* the tensor in its allocation */
    if (!empty && (overflow || __builtin_add_overflow(hi, m.stride[0], &hi) ||
                   start + hi > alloc_bytes || start + hi < start)) {
        char at[80] = "";
        for (uint32_t i = 0, n = 0; i < m.rank && n < sizeof at; i++)
            n += (uint32_t)snprintf(at + n, sizeof at - n, "%s%d", i ? ", " : "", coords[i]);
        dt_emu_fail("%s: the box at coordinates (%s) reads global bytes [%#llx, %#llx), past the "
                    "end of the %zu-byte allocation at %p that holds the tensor's address", op, at,
                    (unsigned long long)(m.addr + lo), (unsigned long long)(m.addr + hi),
                    alloc_bytes, alloc);
    }
    E.tmas = room(E.tmas, E.ntma, &E.tmacap, sizeof *E.tmas);
    emu_tma *x = &E.tmas[E.ntma++];
    *x = (emu_tma){off, (uint32_t)bytes, bar_off, E.cur->linear, m, {0}};
    for (uint32_t i = 0; i < m.rank; i++) x->coord[i] = coords[i];
    for (uint32_t o = 0; o < bytes; o += 16)   /* undefined until completed */
        memset(E.smem + tma_swizzle(off + o, m.swizzle), EMU_POISON, 16);
    E.counts.tma++;
    mbar_wake(bar_off);
}

/* ---- the bulk reduction */

void dt_emu_bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes) {
    const char *op = "cp.reduce.async.bulk.add.f32";
    emu_thread *t = E.cur;
    const unsigned char *s = src;
    if (bytes == 0 || bytes % 16 || !in_smem(s, bytes) || (uintptr_t)(s - E.smem) % 16)
        dt_emu_fail("%s: source %p, %u bytes: not a multiple of 16 bytes, 16-byte aligned, inside "
                    "the %zu bytes of dynamic shared memory", op, src, bytes, E.smem_bytes);
    const void *alloc;
    size_t alloc_bytes;
    if ((uintptr_t)dst % 16 || !dt_emu_cuda_allocation(dst, &alloc, &alloc_bytes) ||
        (const char *)dst + bytes > (const char *)alloc + alloc_bytes)
        dt_emu_fail("%s: destination %p, %u bytes: not 16-byte aligned inside one allocation "
                    "CUDA knows (cudaMalloc, cudaHostAlloc)", op, (void *)dst, bytes);
    const uint32_t off = (uint32_t)(s - E.smem);
    tma_check_idle(off, bytes, op);
    if (memcmp(E.smem + off, E.smem_async + off, bytes))
        dt_emu_fail("%s: its source, shared offsets [%u, %u), holds stores that no "
                    "fence.proxy.async and barrier after it published to the async proxy", op,
                    off, off + bytes);
    /* a reduction that commutes with the grid before's (dt_emu_reduce_add) */
    for (uint32_t i = 0; i < bytes; i += 4) {
        float x, y;
        memcpy(&x, E.smem_async + off + i, 4);
        memcpy(&y, (char *)dst + i, 4);
        y += x;
        memcpy((char *)dst + i, &y, 4);
    }
    unsigned char *seen = malloc(bytes);
    if (!seen) dt_emu_fail("%s: out of host memory", op);
    memcpy(seen, E.smem + off, bytes);
    t->bulks = room(t->bulks, t->nbulk, &t->bulkcap, sizeof *t->bulks);
    t->bulks[t->nbulk++] = (emu_bulk){off, bytes, -1, seen};
    E.counts.bulk++;
}

void dt_emu_bulk_commit(void) {
    emu_thread *t = E.cur;
    for (int i = 0; i < t->nbulk; i++)
        if (t->bulks[i].group < 0) t->bulks[i].group = t->bulk_next_group;
    t->bulk_next_group++;
}

void dt_emu_bulk_wait(int n) {
    emu_thread *t = E.cur;
    if (n < 0) dt_emu_fail("cp.async.bulk.wait_group %d", n);
    int kept = 0;
    for (int i = 0; i < t->nbulk; i++) {
        emu_bulk *b = &t->bulks[i];
        if (b->group < 0 || b->group >= t->bulk_next_group - n) {   /* not this wait's */
            t->bulks[kept++] = *b;
            continue;
        }
        if (memcmp(E.smem + b->src, b->seen, b->bytes))
            dt_emu_fail("shared memory in [%u, %u) was written while a cp.reduce.async.bulk "
                        "read it: cp.async.bulk.wait_group.read must complete it first", b->src,
                        b->src + b->bytes);
        free(b->seen);
    }
    t->nbulk = kept;
}

/* ------------------------------------------------------------- launch */

const dt_emu_dim3 *dt_emu_thread_idx(void) { return &E.cur->idx; }
const dt_emu_dim3 *dt_emu_block_idx(void) { return &E.block_idx; }
const dt_emu_dim3 *dt_emu_block_dim(void) { return &E.block; }
const dt_emu_dim3 *dt_emu_grid_dim(void) { return &E.grid; }
unsigned char *dt_emu_dynamic_smem(void) { return E.smem; }

static EMU_NO_TSAN void fiber_main(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &E.sched_stack, &E.sched_stack_size);
#endif
    E.body(E.arg);
    emu_thread *t = E.cur;
    if (!t->griddep_waived) dt_emu_griddep_require("exiting");
    wait_groups(t, 0);   /* copies still in flight land anyway */
    if (t->nbulk)
        dt_emu_fail("exited with %d cp.reduce.async.bulk still reading shared memory: "
                    "cp.async.bulk.commit_group and cp.async.bulk.wait_group[.read] 0 must "
                    "complete them first", t->nbulk);
    if (t->nwg) {
        int uncommitted = 0;
        for (int i = 0; i < t->nwg; i++) uncommitted += t->wg[i].group < 0;
        dt_emu_fail("exited with %d wgmma.mma_async pending (%d of them uncommitted): "
                    "wgmma.commit_group and wgmma.wait_group must complete them first", t->nwg,
                    uncommitted);
    }
    thread_exits(t);
    /* a __syncthreads the others wait in may now be complete; a warp
     * instruction they wait in never will be (deadlock, reported) */
    maybe_release_block();
    yield_fiber(1);
}

static const char *state_name(thread_state s) {
    switch (s) {
    case T_RUNNABLE: return "runnable";
    case T_WAIT_WARP: return "in a warp or warpgroup instruction";
    case T_WAIT_BLOCK: return "in __syncthreads";
    case T_WAIT_BAR: return "in bar.sync";
    case T_WAIT_MBAR: return "waiting on an mbarrier";
    case T_WAIT_REGS: return "in setmaxnreg.inc, waiting for registers";
    default: return "exited";
    }
}

/* A fresh fiber that will run fiber_main. (Alone in its function:
 * getcontext returns twice.) */
static void start_fiber(emu_thread *t) {
    t->state = T_RUNNABLE;
    t->ncopies = 0;
    t->next_group = 0;
    t->nbulk = 0;   /* none left by an exit (checked there) */
    t->bulk_next_group = 0;
    t->op = 0;
    t->nwg = 0;   /* all completed by the previous block's exits */
    t->wg_next_group = 0;
    t->wg_fenced = 0;
    t->cp_unfenced = 0;
    t->mbar_off = t->mbar_parity = 0;
    t->griddep_waited = 0;
    t->griddep_waived = 0;
    t->rows_acquired = NULL;
#ifdef EMU_ASAN
    /* a fiber of a failed launch was abandoned mid-call: its frames' redzones
     * are still poisoned on the reused stack */
    __asan_unpoison_memory_region(t->stack, EMU_STACK);
#endif
#ifdef EMU_ASM_SWITCH
    /* From the 16-byte aligned top down: a null return address for
     * fiber_main (it never returns), fiber_main's address for the switch's
     * ret, six zero registers; fiber_main then starts with rsp = 8 mod 16,
     * as after a call. */
    uintptr_t top = ((uintptr_t)t->stack + EMU_STACK) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = NULL;
    *--sp = (void *)(uintptr_t)fiber_main;
    for (int i = 0; i < 6; i++) *--sp = NULL;
    t->sp = sp;
#else
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = t->stack;
    t->ctx.uc_stack.ss_size = EMU_STACK;
    t->ctx.uc_link = NULL;
    makecontext(&t->ctx, fiber_main, 0);
#endif
}

/* What blocked thread t waits for, for a deadlock message. */
static void describe_wait(const emu_thread *t, char *buf, size_t size) {
    const emu_mbar *b = t->state == T_WAIT_MBAR ? mbar_find(t->mbar_off) : NULL;
    if (b)
        snprintf(buf, size, "waiting on the mbarrier at shared offset %u, parity %u (its phase "
                 "%llu has %u of %u arrivals missing, tx-count %lld)", t->mbar_off,
                 t->mbar_parity, (unsigned long long)b->phase, b->pending, b->expected,
                 (long long)b->tx);
    else if (t->state == T_WAIT_BAR)
        snprintf(buf, size, "in bar.sync %d (%d of %d threads arrived)", t->bar_id,
                 E.bar_arrived[t->bar_id], E.bar_count[t->bar_id]);
    else
        snprintf(buf, size, "%s", state_name(t->state));
}

/* Every thread of the block exited: the copies still in flight land (no
 * thread waits for them any more, and that is no error), then the block's
 * barriers go. 0, or -1 if a copy's destination was written meanwhile. */
static int block_end(void) {
    for (int i = 0; i < E.ntma; i++) {
        const long bad = tma_perform(&E.tmas[i]);
        if (bad >= 0) {
            snprintf(E.err, sizeof E.err, "block (%u,%u,%u): shared memory at offset %ld was "
                     "written while a cp.async.bulk.tensor into it (issued by thread %d, never "
                     "waited for) was in flight", E.block_idx.x, E.block_idx.y, E.block_idx.z,
                     bad, E.tmas[i].thread);
            E.failed = 1;
            return -1;
        }
    }
    E.ntma = 0;
    E.nmbar = 0;
    for (int id = 1; id < 16; id++)
        if (E.bar_arrived[id]) {
            snprintf(E.err, sizeof E.err, "block (%u,%u,%u): named barrier %d ended the block with "
                     "%d of its %d threads arrived (a bar.arrive no bar.sync completed)",
                     E.block_idx.x, E.block_idx.y, E.block_idx.z, id, E.bar_arrived[id],
                     E.bar_count[id]);
            E.failed = 1;
            return -1;
        }
    return 0;
}

static int run_block(void) {
    memset(E.smem, EMU_POISON, E.smem_bytes);
    memset(E.smem_async, EMU_POISON, E.smem_bytes);
    E.proxy_fenced = 0;
    E.block_arrived = 0;
    memset(E.bar_arrived, 0, sizeof E.bar_arrived);
    memset(E.warp_arrived, 0, sizeof E.warp_arrived);
    memset(E.wg_arrived, 0, sizeof E.wg_arrived);
    /* as launched: an even share of the SM's 65,536 registers, as ptxas
     * gives one CTA per SM (a multiple of 8, at most 256) */
    const int share = 65536 / E.nthreads / 8 * 8;
    for (int g = 0; g < EMU_MAX_THREADS / 128; g++) E.wg_regs[g] = share < 256 ? share : 256;
    memset(E.wg_want, 0, sizeof E.wg_want);
    E.async_stale = 0;
    E.done = 0;
    memset(E.warp_exited, 0, sizeof E.warp_exited);
    E.nmbar = 0;   /* barriers and copies live as long as their block */
    E.ntma = 0;
    memset(E.tma_busy, 0, E.smem_bytes);
    for (int i = 0; i < E.nthreads; i++) start_fiber(&E.threads[i]);
    E.counts.blocks++;
    /* Scheduling: always the first runnable thread in an order that starts
     * at warp `lead`, so the leading warp runs ahead as far as its barriers
     * let it before the others start; this exposes a missing barrier (the
     * leader's cp.async into a stage the others still read poisons it).
     * The lead rotates with the block, so every warp leads somewhere. */
    const int nwarps = (E.nthreads + 31) / 32;
    const long block_linear =
        ((long)E.block_idx.z * E.grid.y + E.block_idx.y) * E.grid.x + E.block_idx.x;
    E.lead = 32 * (int)(block_linear % nwarps);
    E.cursor = 0;
    for (;;) {
        if (E.done == E.nthreads) return block_end();
        emu_thread *next = NULL;
        for (; E.cursor < E.nthreads; E.cursor++) {
            const int i = E.lead + E.cursor;
            emu_thread *t = &E.threads[i < E.nthreads ? i : i - E.nthreads];
            if (t->state == T_RUNNABLE) {
                next = t;
                break;
            }
        }
        if (next) {
            run_fiber(next);
            if (E.failed) return -1;
            continue;
        }
        /* a deadlock: name a thread (one in an mbarrier wait if any), and
         * one blocked elsewhere if any */
        int a = -1, b = -1;
        for (int i = 0; i < E.nthreads; i++)
            if (E.threads[i].state == T_WAIT_MBAR && a < 0) a = i;
        for (int i = 0; i < E.nthreads; i++) {
            const emu_thread *t = &E.threads[i];
            if (t->state == T_DONE) continue;
            if (a < 0) a = i;
            const emu_thread *ta = &E.threads[a];
            if (b < 0 && (t->state != ta->state ||
                          (t->state == T_WAIT_MBAR && (t->mbar_off != ta->mbar_off ||
                                                       t->mbar_parity != ta->mbar_parity)) ||
                          (t->state == T_WAIT_BAR && t->bar_id != ta->bar_id)))
                b = i;
        }
        char da[160], db[160], other[200] = "";
        describe_wait(&E.threads[a], da, sizeof da);
        if (b >= 0) {
            describe_wait(&E.threads[b], db, sizeof db);
            snprintf(other, sizeof other, "; thread %d is %s", b, db);
        }
        snprintf(E.err, sizeof E.err, "block (%u,%u,%u): deadlock: thread %d is %s%s; %d of %d "
                 "threads have exited", E.block_idx.x, E.block_idx.y, E.block_idx.z, a, da, other,
                 E.done, E.nthreads);
        E.failed = 1;
        return -1;
    }
}

/* Fiber i's stack: made on first use, kept for every later launch (E.lock
 * held), so launches do not churn 256 KiB blocks through the allocator. */
static unsigned char *fiber_stack(int i) {
    static unsigned char *stacks[EMU_MAX_THREADS];
    if (!stacks[i]) {
        stacks[i] = malloc(EMU_STACK);
#ifdef EMU_VALGRIND
        if (stacks[i]) (void)VALGRIND_STACK_REGISTER(stacks[i], stacks[i] + EMU_STACK);
#endif
    }
    return stacks[i];
}

int dt_emu_launch(dt_emu_dim3 grid, dt_emu_dim3 block, size_t smem_bytes, int dependent,
                  void (*body)(void *), void *arg, char *err, size_t err_size) {
    const long n = (long)block.x * block.y * block.z;
    if (n < 1 || n > EMU_MAX_THREADS || !grid.x || !grid.y || !grid.z) {
        if (err && err_size) snprintf(err, err_size, "bad launch: grid %ux%ux%u, block %ld threads",
                                      grid.x, grid.y, grid.z, n);
        return -1;
    }
    pthread_mutex_lock(&E.lock);
    E.grid = grid;
    E.block = block;
    E.nthreads = (int)n;
    E.dependent = dependent != 0;
    E.counts.dependent += E.dependent;
    E.body = body;
    E.arg = arg;
    E.failed = 0;
    E.err[0] = 0;
    E.smem_bytes = smem_bytes;
    E.smem = malloc(smem_bytes ? smem_bytes : 1);
    E.tma_busy = malloc(smem_bytes ? smem_bytes : 1);
    E.smem_async = malloc(smem_bytes ? smem_bytes : 1);
    E.threads = calloc((size_t)n, sizeof *E.threads);
    int rc = E.smem && E.tma_busy && E.smem_async && E.threads ? 0 : -1;
    if (rc) snprintf(E.err, sizeof E.err, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        emu_thread *t = &E.threads[i];
        t->linear = i;
        t->idx = (dt_emu_dim3){(unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                               (unsigned)(i / block.x / block.y)};
        t->stack = fiber_stack(i);
#ifdef EMU_TSAN
        t->tsan_fiber = __tsan_create_fiber(0);
#endif
        if (!t->stack) {
            snprintf(E.err, sizeof E.err, "out of memory");
            rc = -1;
        }
    }
    for (unsigned z = 0; z < grid.z && !rc; z++)
        for (unsigned y = 0; y < grid.y && !rc; y++)
            for (unsigned x = 0; x < grid.x && !rc; x++) {
                E.block_idx = (dt_emu_dim3){x, y, z};
                rc = run_block();
            }
    if (rc && err && err_size) snprintf(err, err_size, "%s", E.err);
    /* a failed launch leaves wgmma records pending: their shared operand
     * records go with the last reference (or unreferenced, with E.wg_new) */
    if (E.wg_new && E.wg_new->refs == 0) free(E.wg_new);
    E.wg_new = NULL;
    for (int i = 0; E.threads && i < n; i++) {
        emu_thread *t = &E.threads[i];
        for (int j = 0; j < t->nwg; j++)
            if (t->wg[j].op) release_op(t->wg[j].op);
        free(t->wg);
        free(t->copies);
        for (int j = 0; j < t->nbulk; j++) free(t->bulks[j].seen);   /* a failed launch's */
        free(t->bulks);
#ifdef EMU_TSAN
        if (t->tsan_fiber) __tsan_destroy_fiber(t->tsan_fiber);
#endif
    }
    free(E.threads);
    free(E.smem);
    free(E.tma_busy);
    free(E.smem_async);
    free(E.mbars);
    free(E.tmas);
    E.threads = NULL;
    E.smem = NULL;
    E.tma_busy = NULL;
    E.smem_async = NULL;
    E.mbars = NULL;
    E.tmas = NULL;
    E.nmbar = E.mbarcap = E.ntma = E.tmacap = 0;
    pthread_mutex_unlock(&E.lock);
    return rc;
}
