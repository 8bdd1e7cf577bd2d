/* tests/emu/runtime.c — the CPU emulator of emu.h: fibers, barriers, the
 * warp-wide instructions and cp.async. The instruction semantics are
 * written from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with
 * floating point type", "ldmatrix", "cp.async", "shfl.sync"), not from the
 * kernels' index helpers (attention/mma_layout.h), which they test. */
#define _GNU_SOURCE
#include "emu.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

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
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define EMU_VALGRIND 1
#endif
#endif

enum { EMU_STACK = 256 * 1024, EMU_MAX_THREADS = 1024, EMU_POISON = 0xff };

typedef enum { T_RUNNABLE, T_WAIT_WARP, T_WAIT_BLOCK, T_DONE } thread_state;

typedef enum { OP_SHFL_XOR = 1, OP_LDMATRIX, OP_LDMATRIX_T, OP_MMA_BF16, OP_MMA_F16 } warp_op_kind;

static const char *op_name(int op) {
    switch (op) {
    case OP_SHFL_XOR: return "shfl.sync.bfly";
    case OP_LDMATRIX: return "ldmatrix.x4";
    case OP_LDMATRIX_T: return "ldmatrix.x4.trans";
    case OP_MMA_BF16: return "mma.m16n8k16.bf16";
    case OP_MMA_F16: return "mma.m16n8k16.f16";
    default: return "?";
    }
}

typedef struct emu_copy {
    unsigned char *dst;
    const unsigned char *src;
    int bytes;   /* 16, or 0: zero fill */
    long group;  /* commit group; -1 until committed */
} emu_copy;

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
    /* cp.async in flight */
    emu_copy *copies;
    int ncopies, cap;
    long next_group;
    /* the operands of the warp instruction it waits in */
    int op, arg;
    const void *in;
    void *out;
} emu_thread;

/* The launch in progress. */
static struct {
    pthread_mutex_t lock;
    dt_emu_dim3 grid, block, block_idx;
    int nthreads;
    emu_thread *threads;
    emu_thread *cur;
    unsigned char *smem;
    size_t smem_bytes;
    void (*body)(void *);
    void *arg;
    int block_arrived;
    int warp_arrived[EMU_MAX_THREADS / 32];
    int done;                                /* threads of the block that exited */
    int warp_exited[EMU_MAX_THREADS / 32];
#ifdef EMU_ASM_SWITCH
    void *sched_sp;
#else
    ucontext_t sched;
#endif
    const void *sched_stack;
    size_t sched_stack_size;
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
static void yield_fiber(int dying) {
    emu_thread *t = E.cur;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? NULL : &t->asan_fake, E.sched_stack, E.sched_stack_size);
#else
    (void)dying;
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

/* --------------------------------------------------------------- cp.async */

static int in_smem(const void *p, size_t bytes) {
    const unsigned char *c = p;
    return c >= E.smem && c + bytes <= E.smem + E.smem_bytes;
}

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
    if (t->ncopies == t->cap) {
        int cap = t->cap ? 2 * t->cap : 32;
        emu_copy *c = realloc(t->copies, sizeof *c * (size_t)cap);
        if (!c) dt_emu_fail("out of memory");
        t->copies = c;
        t->cap = cap;
    }
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

/* Completes the committed groups older than the newest n, in order. */
static void wait_groups(emu_thread *t, long n) {
    const long cutoff = t->next_group - n;
    int kept = 0;
    for (int i = 0; i < t->ncopies; i++) {
        emu_copy c = t->copies[i];
        if (c.group >= 0 && c.group < cutoff) complete_copy(&c);
        else t->copies[kept++] = c;
    }
    t->ncopies = kept;
}

void dt_emu_cp_wait(int n) { wait_groups(E.cur, n); }

/* ------------------------------------------------------------ barriers */

static int alive_in_block(void) { return E.nthreads - E.done; }

static void release(thread_state waiting, int warp) {
    for (int i = 0; i < E.nthreads; i++) {
        emu_thread *t = &E.threads[i];
        if (t->state == waiting && (warp < 0 || t->linear / 32 == warp)) t->state = T_RUNNABLE;
    }
}

/* A block barrier is complete when every thread still alive arrived. */
static void maybe_release_block(void) {
    if (E.block_arrived > 0 && E.block_arrived == alive_in_block()) {
        E.block_arrived = 0;
        release(T_WAIT_BLOCK, -1);
    }
}

void dt_emu_syncthreads(void) {
    emu_thread *t = E.cur;
    E.block_arrived++;
    t->state = T_WAIT_BLOCK;
    maybe_release_block();
    if (t->state == T_WAIT_BLOCK) yield_fiber(0);
}

/* --------------------------------------------------- warp instructions */

static uint16_t half_of(uint32_t r, int h) { return (uint16_t)(h ? r >> 16 : r & 0xffffu); }

static double elem_value(uint16_t bits, int op) {
    return op == OP_MMA_BF16 ? (double)dt_bf16_to_f32(bits) : (double)dt_f16_to_f32(bits);
}

typedef struct mma_in {
    const uint32_t *a;
    uint32_t b0, b1;
} mma_in;

/* The last lane to arrive computes every lane's result. */
static void complete_warp_op(emu_thread *lanes, int n, int op) {
    E.counts.warp_ops++;
    switch (op) {
    case OP_SHFL_XOR:
        for (int l = 0; l < n; l++) {
            int src = l ^ lanes[l].arg;
            if (lanes[l].arg != lanes[0].arg) dt_emu_fail("shfl.bfly lanes disagree on the lane mask");
            *(float *)lanes[l].out = *(const float *)lanes[src < n ? src : l].in;
        }
        break;
    case OP_LDMATRIX:
    case OP_LDMATRIX_T: {
        /* Lane 8m + r gives the address of row r of 8x8 matrix m (16
         * bytes); register m of lane l gets M_m[l/4][2(l%4) + h] (h = 0 in
         * the low half), or with .trans M_m[2(l%4) + h][l/4]. */
        const int trans = op == OP_LDMATRIX_T;
        for (int l = 0; l < 32; l++) {
            const unsigned char *p = lanes[l].in;
            if (!in_smem(p, 16) || (uintptr_t)(p - E.smem) % 16)
                dt_emu_fail("%s: lane %d's row address (shared offset %td) is not 16 aligned "
                            "bytes inside the %zu bytes of shared memory", op_name(op), l,
                            p - E.smem, E.smem_bytes);
        }
        for (int l = 0; l < 32; l++) {
            uint32_t *r = lanes[l].out;
            for (int m = 0; m < 4; m++) {
                uint32_t v = 0;
                for (int h = 0; h < 2; h++) {
                    const int row = trans ? 2 * (l % 4) + h : l / 4;
                    const int col = trans ? l / 4 : 2 * (l % 4) + h;
                    uint16_t e;
                    memcpy(&e, (const unsigned char *)lanes[8 * m + row].in + 2 * col, 2);
                    v |= (uint32_t)e << (16 * h);
                }
                r[m] = v;
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
        double A[16][16], B[16][8];
        for (int l = 0; l < 32; l++) {
            const mma_in *in = lanes[l].in;
            const int g = l / 4, t = l % 4;
            for (int reg = 0; reg < 4; reg++)
                for (int h = 0; h < 2; h++)
                    A[g + 8 * (reg & 1)][2 * t + h + 8 * (reg >> 1)] = elem_value(half_of(in->a[reg], h), op);
            for (int h = 0; h < 2; h++) {
                B[2 * t + h][g] = elem_value(half_of(in->b0, h), op);
                B[2 * t + h + 8][g] = elem_value(half_of(in->b1, h), op);
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

/* Every lane of the calling thread's warp must arrive here with the same
 * op; the last one computes the results and releases the others. */
static void warp_op(int op, int arg, const void *in, void *out) {
    emu_thread *t = E.cur;
    const int warp = t->linear / 32, first = 32 * warp;
    const int n = E.nthreads - first < 32 ? E.nthreads - first : 32;
    if ((op == OP_LDMATRIX || op == OP_LDMATRIX_T || op == OP_MMA_BF16 || op == OP_MMA_F16) && n != 32)
        dt_emu_fail("%s in a warp of %d threads", op_name(op), n);
    if (E.warp_exited[warp])
        for (int l = 0; l < n; l++)
            if (E.threads[first + l].state == T_DONE)
                dt_emu_fail("%s (full mask) while lane %d of the warp has exited", op_name(op), l);
    t->op = op;
    t->arg = arg;
    t->in = in;
    t->out = out;
    t->state = T_WAIT_WARP;
    if (++E.warp_arrived[warp] < n) {
        yield_fiber(0);
        return;
    }
    E.warp_arrived[warp] = 0;
    for (int l = 0; l < n; l++)
        if (E.threads[first + l].op != op)
            dt_emu_fail("lanes of warp %d at different warp instructions: lane %d at %s, lane %d "
                        "at %s", warp, l, op_name(E.threads[first + l].op), t->linear - first,
                        op_name(op));
    complete_warp_op(&E.threads[first], n, op);
    release(T_WAIT_WARP, warp);
}

float dt_emu_shfl_xor(unsigned mask, float v, int lane_mask) {
    if (mask != 0xffffffffu) dt_emu_fail("shfl with a partial mask %#x", mask);
    float out;
    warp_op(OP_SHFL_XOR, lane_mask, &v, &out);
    return out;
}

void dt_emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans) {
    warp_op(trans ? OP_LDMATRIX_T : OP_LDMATRIX, 0, row, r);
}

void dt_emu_mma_m16n8k16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, dt_dtype ab) {
    if (ab != DT_BF16 && ab != DT_F16) dt_emu_fail("mma with operand type %d", (int)ab);
    mma_in in = {a, b0, b1};
    warp_op(ab == DT_BF16 ? OP_MMA_BF16 : OP_MMA_F16, 0, &in, d);
}

/* ------------------------------------------------------------- launch */

const dt_emu_dim3 *dt_emu_thread_idx(void) { return &E.cur->idx; }
const dt_emu_dim3 *dt_emu_block_idx(void) { return &E.block_idx; }
const dt_emu_dim3 *dt_emu_block_dim(void) { return &E.block; }
const dt_emu_dim3 *dt_emu_grid_dim(void) { return &E.grid; }
unsigned char *dt_emu_dynamic_smem(void) { return E.smem; }

static void fiber_main(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &E.sched_stack, &E.sched_stack_size);
#endif
    E.body(E.arg);
    emu_thread *t = E.cur;
    wait_groups(t, 0);   /* copies still in flight land anyway */
    thread_exits(t);
    /* a __syncthreads the others wait in may now be complete; a warp
     * instruction they wait in never will be (deadlock, reported) */
    maybe_release_block();
    yield_fiber(1);
}

static const char *state_name(thread_state s) {
    switch (s) {
    case T_RUNNABLE: return "runnable";
    case T_WAIT_WARP: return "in a warp instruction";
    case T_WAIT_BLOCK: return "in __syncthreads";
    default: return "exited";
    }
}

/* A fresh fiber that will run fiber_main. (Alone in its function:
 * getcontext returns twice.) */
static void start_fiber(emu_thread *t) {
    t->state = T_RUNNABLE;
    t->ncopies = 0;
    t->next_group = 0;
    t->op = 0;
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

static int run_block(void) {
    memset(E.smem, EMU_POISON, E.smem_bytes);
    E.block_arrived = 0;
    memset(E.warp_arrived, 0, sizeof E.warp_arrived);
    E.done = 0;
    memset(E.warp_exited, 0, sizeof E.warp_exited);
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
    const int lead = 32 * (int)(block_linear % nwarps);
    for (;;) {
        if (E.done == E.nthreads) return 0;
        emu_thread *next = NULL;
        for (int i = 0; i < E.nthreads && !next; i++) {
            emu_thread *t = &E.threads[(lead + i) % E.nthreads];
            if (t->state == T_RUNNABLE) next = t;
        }
        if (next) {
            run_fiber(next);
            if (E.failed) return -1;
            continue;
        }
        int a = -1, b = -1;
        for (int i = 0; i < E.nthreads; i++) {
            if (E.threads[i].state == T_DONE) continue;
            if (a < 0) a = i;
            if (E.threads[i].state != E.threads[a].state) b = i;
        }
        snprintf(E.err, sizeof E.err, "block (%u,%u,%u): deadlock: thread %d is %s%s%s%s, %d of "
                 "%d threads have exited", E.block_idx.x, E.block_idx.y, E.block_idx.z, a,
                 state_name(E.threads[a].state), b >= 0 ? ", thread " : "",
                 b >= 0 ? "another " : "", b >= 0 ? state_name(E.threads[b].state) : "", E.done,
                 E.nthreads);
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

int dt_emu_launch(dt_emu_dim3 grid, dt_emu_dim3 block, size_t smem_bytes, void (*body)(void *),
                  void *arg, char *err, size_t err_size) {
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
    E.body = body;
    E.arg = arg;
    E.failed = 0;
    E.err[0] = 0;
    E.smem_bytes = smem_bytes;
    E.smem = malloc(smem_bytes ? smem_bytes : 1);
    E.threads = calloc((size_t)n, sizeof *E.threads);
    int rc = E.smem && E.threads ? 0 : -1;
    if (rc) snprintf(E.err, sizeof E.err, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        emu_thread *t = &E.threads[i];
        t->linear = i;
        t->idx = (dt_emu_dim3){(unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                               (unsigned)(i / block.x / block.y)};
        t->stack = fiber_stack(i);
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
    for (int i = 0; E.threads && i < n; i++) free(E.threads[i].copies);
    free(E.threads);
    free(E.smem);
    E.threads = NULL;
    E.smem = NULL;
    pthread_mutex_unlock(&E.lock);
    return rc;
}
