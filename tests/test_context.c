/* tests/test_context.c — dt_launch and contexts: world sizes 1..64, the
 * first failing status and its message, environment (DT_TIMEOUT_MS, DT_LOG,
 * DT_BACKEND, DT_TRANSPORT), bad arguments, the status/dtype basics, and
 * the memory counters (dt_context_memory) on the CPU and CUDA backends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "attention/mask.h"
#include "collectives/comm.h"
#include "dtensor/context.h"
#include "dtensor/tensor.h"
#include "harness.h"

#define MAXR 64

/* cpu + local unless a test is about the selection itself. */
static const dt_launch_options *cpu(void) {
    static const dt_launch_options o = {DT_BACKEND_CPU, DT_TRANSPORT_LOCAL, 0, DT_CHECK_AUTO};
    return &o;
}

typedef struct ctx_case {
    int ranks_seen[MAXR];
    int sizes_seen[MAXR];
    float sum[MAXR];
    long timeout[MAXR];
} ctx_case;

static dt_status rank_identity(dt_context *ctx, void *arg) {
    ctx_case *c = arg;
    int r = dt_context_rank(ctx);
    c->ranks_seen[r]++;
    c->sizes_seen[r] = dt_context_world_size(ctx);
    c->timeout[r] = dt_context_timeout_ms(ctx);
    float x = (float)r;
    return dt_comm_all_reduce(dt_context_comm(ctx), &x, &c->sum[r], 1, DT_F32, DT_REDUCE_SUM);
}

static void test_launch_world_sizes(void **state) {
    (void)state;
    int sizes[] = {1, 2, 3, 5, 7, 8, 16, 33, 64};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k];
        ctx_case c = {0};
        assert_int_equal(dt_launch(n, rank_identity, &c, cpu()), DT_SUCCESS);
        for (int r = 0; r < n; r++) {
            assert_int_equal(c.ranks_seen[r], 1);
            assert_int_equal(c.sizes_seen[r], n);
            assert_float_equal(c.sum[r], (float)(n * (n - 1) / 2), 0);
        }
    }
}

static dt_status rank_noop(dt_context *ctx, void *arg) {
    (void)ctx;
    (void)arg;
    return DT_SUCCESS;
}

static void test_launch_bad_arguments(void **state) {
    (void)state;
    assert_int_equal(dt_launch(0, rank_noop, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "world size 0"));
    assert_int_equal(dt_launch(DT_MAX_WORLD_SIZE + 1, rank_noop, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_launch(-3, rank_noop, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt_launch(2, NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = (dt_backend_kind)42;
    assert_int_equal(dt_launch(2, rank_noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    o = (dt_launch_options)DT_LAUNCH_OPTIONS_INIT;
    o.transport = (dt_transport_kind)-1;
    assert_int_equal(dt_launch(2, rank_noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    o = (dt_launch_options)DT_LAUNCH_OPTIONS_INIT;
    o.timeout_ms = -5;
    assert_int_equal(dt_launch(2, rank_noop, NULL, &o), DT_ERR_INVALID_ARGUMENT);
}

/* Rank 2 fails; launch returns its status and message, prefixed once. */
static dt_status rank_two_fails(dt_context *ctx, void *arg) {
    (void)arg;
    if (dt_context_rank(ctx) == 2) return dt_error(DT_ERR_NOT_SUPPORTED, "rank 2 cannot do that");
    return dt_comm_barrier(dt_context_comm(ctx));
}

static void test_launch_returns_first_failure(void **state) {
    (void)state;
    assert_int_equal(dt_launch(4, rank_two_fails, NULL, cpu()), DT_ERR_NOT_SUPPORTED);
    assert_string_equal(dt_last_error(), "rank 2 cannot do that");
}

static void test_environment(void **state) {
    (void)state;
    ctx_case c = {0};
    setenv("DT_TIMEOUT_MS", "1234", 1);
    assert_int_equal(dt_launch(2, rank_identity, &c, cpu()), DT_SUCCESS);
    assert_int_equal(c.timeout[1], 1234);
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = DT_BACKEND_CPU;
    o.timeout_ms = 77; /* explicit options win */
    assert_int_equal(dt_launch(2, rank_identity, &c, &o), DT_SUCCESS);
    assert_int_equal(c.timeout[0], 77);
    setenv("DT_TIMEOUT_MS", "soon", 1);
    assert_int_equal(dt_launch(2, rank_identity, &c, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "DT_TIMEOUT_MS=soon"));
    unsetenv("DT_TIMEOUT_MS");
    assert_int_equal(dt_launch(1, rank_identity, &c, cpu()), DT_SUCCESS);
    assert_int_equal(c.timeout[0], DT_DEFAULT_TIMEOUT_MS);

    setenv("DT_BACKEND", "tpu", 1);
    assert_int_equal(dt_launch(2, rank_noop, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dt_last_error(), "DT_BACKEND=tpu"));
    setenv("DT_BACKEND", "cpu", 1);
    assert_int_equal(dt_launch(2, rank_noop, NULL, NULL), DT_SUCCESS);
    unsetenv("DT_BACKEND");
    setenv("DT_TRANSPORT", "local", 1);
    assert_int_equal(dt_launch(2, rank_noop, NULL, NULL), DT_SUCCESS);
    unsetenv("DT_TRANSPORT");
}

static dt_status rank_logs(dt_context *ctx, void *arg) {
    (void)arg;
    dt_context_log(ctx, DT_LOG_INFO, "hello from %d", dt_context_rank(ctx));
    dt_context_log(ctx, DT_LOG_DEBUG, "debug detail");
    return DT_SUCCESS;
}

/* Runs a 3-rank launch of rank_logs with DT_LOG=level and returns stderr. */
static void capture_log(const char *level, char *out, size_t size) {
    char path[] = "/tmp/dt_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    setenv("DT_LOG", level, 1);
    dt_status st = dt_launch(3, rank_logs, NULL, cpu());
    unsetenv("DT_LOG");
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    assert_int_equal(st, DT_SUCCESS);
    FILE *f = fdopen(fd, "r");
    rewind(f);
    size_t n = fread(out, 1, size - 1, f);
    out[n] = '\0';
    fclose(f);
    unlink(path);
}

static void test_log_levels_and_rank_prefix(void **state) {
    (void)state;
    char buf[4096];
    capture_log("info", buf, sizeof buf);
    for (int r = 0; r < 3; r++) {
        char line[64];
        snprintf(line, sizeof line, "[dtensor rank %d] info: hello from %d\n", r, r);
        assert_non_null(strstr(buf, line));
    }
    assert_null(strstr(buf, "debug detail"));
    capture_log("debug", buf, sizeof buf);
    assert_non_null(strstr(buf, "[dtensor rank 1] debug: debug detail"));
    capture_log("warn", buf, sizeof buf);
    assert_null(strstr(buf, "hello"));
}

static void test_status_and_dtype_names(void **state) {
    (void)state;
    assert_string_equal(dt_status_name(DT_SUCCESS), "DT_SUCCESS");
    assert_string_equal(dt_status_name(DT_ERR_TIMEOUT), "DT_ERR_TIMEOUT");
    assert_string_equal(dt_status_name((dt_status)999), "DT_STATUS_UNKNOWN");
    assert_string_equal(dt_dtype_name(DT_BF16), "bf16");
    assert_int_equal(dt_dtype_size(DT_F32), 4);
    assert_int_equal(dt_dtype_size((dt_dtype)77), 0);
    assert_string_equal(dt_backend_kind_name(DT_BACKEND_CUDA), "cuda");
    assert_string_equal(dt_transport_kind_name(DT_TRANSPORT_NCCL), "nccl");
    assert_string_equal(dt_check_mode_name(DT_CHECK_ON), "on");
    assert_string_equal(dt_check_mode_name(DT_CHECK_MODE_COUNT), "unknown");
    assert_string_equal(dt_p2p_kind_name(DT_P2P_RECV), "recv");
    assert_string_equal(dt_p2p_kind_name((dt_p2p_kind)5), "unknown");
    assert_string_equal(dt_attn_tile_name(DT_TILE_PARTIAL), "partial");
    assert_string_equal(dt_attn_tile_name((dt_attn_tile)-1), "unknown");
    /* bf16 rounding: nearest even, NaN stays NaN, exact values round-trip. */
    assert_int_equal(dt_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(dt_f32_to_bf16(1.00390625f), 0x3f80);   /* tie -> even */
    assert_int_equal(dt_f32_to_bf16(1.01171875f), 0x3f82);   /* tie -> even (up) */
    assert_true(dt_bf16_to_f32(dt_f32_to_bf16(0.0f / 0.0f)) != dt_bf16_to_f32(dt_f32_to_bf16(0.0f / 0.0f)));
    assert_float_equal(dt_bf16_to_f32(dt_f32_to_bf16(-3.5f)), -3.5f, 0);
    /* The first failure is kept through teardown. */
    dt_status st = DT_SUCCESS;
    DT_KEEP_FIRST(st, dt_error(DT_ERR_TIMEOUT, "first"));
    DT_KEEP_FIRST(st, dt_error(DT_ERR_BACKEND, "second"));
    assert_int_equal(st, DT_ERR_TIMEOUT);
    assert_string_equal(dt_last_error(), "first");
}

/* fp16 by arithmetic, independent of the bit manipulation in dtype.h. */
static double ref_f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 1024, e - 25);
    return (h >> 15) ? -v : v;
}

/* Nearest fp16 of f (ties to even), found by scaling to the quantum. */
static uint16_t ref_f32_to_f16(float f) {
    uint16_t s = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isnan(f)) return s | 0x7e00;                /* quiet, sign kept */
    if (a >= 65520.0) return s | 0x7c00;
    int e;
    frexp(a, &e);                                   /* a in [2^(e-1), 2^e) */
    int exp = e - 1, q = exp < -14 ? -24 : exp - 10; /* the quantum 2^q */
    uint32_t k = (uint32_t)nearbyint(ldexp(a, -q)); /* default rounding: to even */
    if (a == 0 || exp < -14) return s | (uint16_t)k; /* subnormal (k = 1024: normal, same bits) */
    if (k == 2048) { k = 1024; exp++; }
    return s | (uint16_t)((exp + 15) << 10) | (uint16_t)(k & 1023);
}

static void check_f32_to_f16(float f) {
    uint16_t got = dt_f32_to_f16(f), want = ref_f32_to_f16(f);
    if (got != want) fail_msg("dt_f32_to_f16(%a) = 0x%04x, want 0x%04x", (double)f, got, want);
}

static void test_fp16_conversions(void **state) {
    (void)state;
    /* Every fp16 value, widened exactly; NaNs stay NaN. */
    for (uint32_t h = 0; h < 65536; h++) {
        double want = ref_f16_value((uint16_t)h);
        float got = dt_f16_to_f32((dt_f16)h);
        if (isnan(want)) assert_true(isnan(got));
        else if ((double)got != want || !signbit(got) != !signbit(want))
            fail_msg("dt_f16_to_f32(0x%04x) = %a, want %a", (unsigned)h, (double)got, want);
    }
    /* Rounding: every fp16 value, every tie between neighbours and one fp32
     * ulp to either side of it, then a million random fp32 bit patterns. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float lo = dt_f16_to_f32((dt_f16)h), hi = dt_f16_to_f32((dt_f16)(h + 1));
        float mid = (float)(((double)lo + (double)hi) / 2);  /* exact in fp32 */
        float vals[5] = {lo, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), hi};
        for (int i = 0; i < 5; i++) {
            check_f32_to_f16(vals[i]);
            check_f32_to_f16(-vals[i]);
        }
    }
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        uint32_t u = (uint32_t)x;
        float f;
        memcpy(&f, &u, sizeof f);
        check_f32_to_f16(f);
    }
    float specials[] = {INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f, 1e10f, 1e-10f, 0.0f};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) check_f32_to_f16(specials[i]);
    assert_true(isnan(dt_f16_to_f32(dt_f32_to_f16(NAN))));
    /* The generic accessors agree with the typed conversions. */
    uint16_t buf[2];
    dt_value_set(buf, DT_F16, 1, 1.0f / 3.0f);
    assert_int_equal(buf[1], dt_f32_to_f16(1.0f / 3.0f));
    assert_true(dt_value_get(buf, DT_F16, 1) == dt_value_round(1.0f / 3.0f, DT_F16));
    dt_value_set(buf, DT_BF16, 0, 1.0f / 3.0f);
    assert_true(dt_value_get(buf, DT_BF16, 0) == dt_value_round(1.0f / 3.0f, DT_BF16));
    assert_true(dt_value_round(1.0f / 3.0f, DT_F32) == 1.0f / 3.0f);
}

/* bf16 by arithmetic, as ref_f16_value. */
static double ref_bf16_value(uint16_t h) {
    int e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(m | 128, e - 134);
    return (h >> 15) ? -v : v;
}

/* dst[i] against ref(src[i]): the same value and sign, NaN for NaN. */
static void check_widened(const char *what, const uint16_t *src, const float *dst, size_t n,
                          double (*ref)(uint16_t)) {
    for (size_t i = 0; i < n; i++) {
        double want = ref(src[i]);
        if (isnan(want) ? !isnan(dst[i]) : (double)dst[i] != want || !signbit(dst[i]) != !signbit(want))
            fail_msg("%s of 0x%04x (element %zu) = %a, want %a", what, (unsigned)src[i], i,
                     (double)dst[i], want);
    }
}

/* dt_values_get on whole arrays (vectorized in runs of 8, then a tail):
 * every bit pattern, from an odd start and with an odd length; and fp16's
 * subnormals again, both ways, with the CPU flushing subnormal operands and
 * results to zero (x86's DAZ and FTZ), which a conversion must not depend
 * on. */
static void test_array_conversions(void **state) {
    (void)state;
    enum { N = 65536 };
    uint16_t *src = malloc(N * sizeof *src);
    float *dst = malloc(N * sizeof *dst);
    assert_non_null(src);
    assert_non_null(dst);
    for (uint32_t h = 0; h < N; h++) src[h] = (uint16_t)h;
    const size_t skip = 3, n = N - skip - 2;
    dst[n] = 7.0f;
    dt_values_get(src + skip, DT_F16, n, dst);
    check_widened("dt_values_get(fp16)", src + skip, dst, n, ref_f16_value);
    dt_values_get(src + skip, DT_BF16, n, dst);
    check_widened("dt_values_get(bf16)", src + skip, dst, n, ref_bf16_value);
    assert_true(dst[n] == 7.0f);   /* nothing written past n */
#if defined(__SSE2__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);     /* FTZ (bit 15), DAZ (bit 6) */
    float f[1024];
    for (int sign = 0; sign < 2; sign++) {
        uint16_t *sub = src + (sign ? 0x8000 : 0);   /* exponent 0: zero, subnormals */
        dt_values_get(sub, DT_F16, 1024, dst);
        uint16_t back[1024];
        for (int i = 0; i < 1024; i++) {
            f[i] = dt_f16_to_f32(sub[i]);
            back[i] = dt_f32_to_f16((float)ref_f16_value(sub[i]));
        }
        _mm_setcsr(csr);           /* cmocka's checks with the usual mode */
        check_widened("dt_values_get(fp16) under DAZ", sub, dst, 1024, ref_f16_value);
        check_widened("dt_f16_to_f32 under DAZ", sub, f, 1024, ref_f16_value);
        for (int i = 0; i < 1024; i++)
            if (back[i] != sub[i])
                fail_msg("dt_f32_to_f16(%a) under DAZ = 0x%04x, want 0x%04x",
                         ref_f16_value(sub[i]), back[i], sub[i]);
        _mm_setcsr(csr | 0x8040u);
    }
    _mm_setcsr(csr);
#endif
    free(dst);
    free(src);
}

/* dt_context_memory: a tensor's bytes count in while it lives and out when
 * destroyed; the peak keeps the most; reset_peak brings it to in_use; a
 * second tensor of the same size after a destroy takes no new system block
 * (the caching allocator); release empties the cache; per rank. */
typedef struct mem_case {
    dt_memory_stats s[4][2];
    dt_status st[2];
    char msg[2][256];
} mem_case;

static dt_status rank_memory(dt_context *ctx, void *arg) {
    mem_case *c = arg;
    const int r = dt_context_rank(ctx);
    dt_tensor *t = NULL, *u = NULL;
    const int64_t shape[2] = {1000 + 1000 * (int64_t)r, 3};   /* 12 kB, 24 kB of fp32 */
    dt_status st = dt_context_memory(ctx, &c->s[0][r]);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, NULL, DT_F32, 2, shape, NULL, &t);
    if (st == DT_SUCCESS) st = dt_context_memory(ctx, &c->s[1][r]);
    dt_tensor_destroy(t);
    if (st == DT_SUCCESS) st = dt_context_memory(ctx, &c->s[2][r]);
    if (st == DT_SUCCESS) st = dt_tensor_create(ctx, NULL, DT_F32, 2, shape, NULL, &u);
    dt_tensor_destroy(u);
    if (st == DT_SUCCESS) st = dt_context_memory_reset_peak(ctx, &c->s[3][r]);
    dt_memory_stats after;
    if (st == DT_SUCCESS) st = dt_context_memory(ctx, &after);
    if (st == DT_SUCCESS && after.peak != after.in_use)
        st = dt_error(DT_ERR_INTERNAL, "test: peak %zu after a reset, in use %zu", after.peak,
                      after.in_use);
    if (st == DT_SUCCESS) st = dt_context_memory_release(ctx, &after);
    if (st == DT_SUCCESS && after.cached != 0)
        st = dt_error(DT_ERR_INTERNAL, "test: %zu bytes cached after a release", after.cached);
    c->st[r] = st;
    if (st != DT_SUCCESS) snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_last_error());
    return st;
}

static void test_memory_counters(void **state) {
    (void)state;
    const dt_backend_kind kinds[2] = {DT_BACKEND_CPU, DT_BACKEND_CUDA};
    for (int k = 0; k < 2; k++) {
        char why[512];
        if (!h_pair_available(2, kinds[k], DT_TRANSPORT_LOCAL, why, sizeof why)) {
            print_message("%s: skipped: %s\n", dt_backend_kind_name(kinds[k]), why);
            continue;
        }
        mem_case c;
        memset(&c, 0, sizeof c);
        assert_int_equal(h_launch_on(2, kinds[k], DT_TRANSPORT_LOCAL, rank_memory, &c), DT_SUCCESS);
        for (int r = 0; r < 2; r++) {
            const size_t bytes = (size_t)(1000 + 1000 * r) * 3 * sizeof(float);
            const dt_memory_stats *s = c.s[0] + r, *live = c.s[1] + r, *gone = c.s[2] + r,
                                  *again = c.s[3] + r;
            print_message("%s rank %d: in use %zu -> %zu -> %zu, peak %zu, cached %zu, "
                          "system blocks %llu -> %llu\n", dt_backend_kind_name(kinds[k]), r,
                          s->in_use, live->in_use, gone->in_use, live->peak, gone->cached,
                          (unsigned long long)live->system_allocs,
                          (unsigned long long)again->system_allocs);
            assert_true(live->in_use >= s->in_use + bytes);   /* CUDA rounds up to 512 B */
            assert_true(live->in_use <= s->in_use + bytes + 512);
            assert_true(gone->in_use == s->in_use);
            assert_true(live->peak >= live->in_use && gone->peak == live->peak);
            assert_true(gone->cached >= bytes);                        /* kept for reuse */
            assert_true(again->system_allocs == live->system_allocs);  /* and reused */
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_world_sizes),
        cmocka_unit_test(test_launch_bad_arguments),
        cmocka_unit_test(test_launch_returns_first_failure),
        cmocka_unit_test(test_environment),
        cmocka_unit_test(test_log_levels_and_rank_prefix),
        cmocka_unit_test(test_status_and_dtype_names),
        cmocka_unit_test(test_fp16_conversions),
        cmocka_unit_test(test_array_conversions),
        cmocka_unit_test(test_memory_counters),
    };
    return cmocka_run_group_tests_name("context and launch", tests, NULL, NULL);
}
