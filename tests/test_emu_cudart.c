/* tests/test_emu_cudart.c — the CPU emulation of the CUDA runtime and
 * cuBLAS (tests/emu/cudart.c) that lets the CUDA backend run without a GPU.
 *
 * gemm/...: cublasGemmEx against a double-precision triple loop, for every
 * transpose pair, the fp32, bf16 and fp16 operand types with a 16-bit or
 * fp32 C, odd sizes, leading dimensions beyond the rows (whose padding holds
 * NaN in A and B, never read, and a sentinel in C, never written), alpha and
 * beta (beta = 0 over a NaN C, which must not be read), k = 0 and
 * alpha = 0. Bound per element, with mag = |alpha| sum |a b| + |beta c|:
 * fp32 C: 1e-5 mag; 16-bit C: that plus one rounding, u (|ref| + 1e-5 mag)
 * with u = 2^-8 (bf16), 2^-11 (fp16).
 * The rest: argument checks, devices (DT_EMU_DEVICES), allocations and
 * pointer attributes, copies, streams and events, the thread-local last
 * error, and all of it from several threads at once; the driver entry
 * point of cuTensorMapEncodeTiled and that function's argument rules (the
 * copies its maps describe run in test_mma_emu, emulator/tma). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "emu/cudart_emu.h"
#include "emu/include/cublas_v2.h"
#include "emu/include/cuda.h"
#include "emu/include/cuda_runtime_api.h"
#include "emu/include/cudaTypedefs.h"
#include "harness.h"

/* ------------------------------------------------------------------ data */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), never exactly zero. */
static float uniform(uint64_t *s) {
    float x = (float)((double)(splitmix(s) >> 11) * 0x1p-52 - 1.0);
    return x != 0.0f ? x : 0.5f;
}

static size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

static const char *type_name(cudaDataType t) {
    return t == CUDA_R_32F ? "f32" : t == CUDA_R_16BF ? "bf16" : "f16";
}

/* Stores v rounded to t at element i; returns the stored value. */
static double put(void *p, cudaDataType t, size_t i, float v) {
    switch (t) {
    case CUDA_R_16BF:
        ((uint16_t *)p)[i] = dt_f32_to_bf16(v);
        return dt_bf16_to_f32(((uint16_t *)p)[i]);
    case CUDA_R_16F:
        ((uint16_t *)p)[i] = dt_f32_to_f16(v);
        return dt_f16_to_f32(((uint16_t *)p)[i]);
    default: ((float *)p)[i] = v; return v;
    }
}

static double get(const void *p, cudaDataType t, size_t i) {
    switch (t) {
    case CUDA_R_16BF: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_16F: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Copies n bytes to a fresh cudaMalloc buffer (NULL for n = 0). */
static void *upload(const void *h, size_t n) {
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, n), cudaSuccess);
    if (n) assert_int_equal(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* ------------------------------------------------------------------ gemm */

typedef struct gemm_case {
    char name[128];
    cublasOperation_t ta, tb;
    int m, n, k, pad;   /* lda, ldb and ldc exceed the stored rows by pad */
    float alpha, beta;
    cudaDataType ab, c;
    uint64_t seed;
} gemm_case;

static void test_gemm(void **state) {
    const gemm_case *g = *state;
    const int m = g->m, n = g->n, k = g->k;
    const int ar = g->ta == CUBLAS_OP_N ? m : k, ac = g->ta == CUBLAS_OP_N ? k : m;
    const int br = g->tb == CUBLAS_OP_N ? k : n, bc = g->tb == CUBLAS_OP_N ? n : k;
    const int lda = (ar > 1 ? ar : 1) + g->pad, ldb = (br > 1 ? br : 1) + g->pad, ldc = m + g->pad;
    const size_t na = (size_t)lda * ac, nb = (size_t)ldb * bc, nc = (size_t)ldc * n;
    const size_t es = type_size(g->ab), ec = type_size(g->c);
    void *ha = malloc(na * es + 1), *hb = malloc(nb * es + 1), *hc = malloc(nc * ec),
         *out = malloc(nc * ec);
    double *da = malloc(na * sizeof(double) + 1), *db = malloc(nb * sizeof(double) + 1),
           *dc = malloc(nc * sizeof(double)), *ref = malloc((size_t)m * n * sizeof(double)),
           *tol = malloc((size_t)m * n * sizeof(double));
    float *got = malloc((size_t)m * n * sizeof(float));
    assert_true(ha && hb && hc && out && da && db && dc && ref && tol && got);

    /* Stored elements random, padding NaN (A, B) or a sentinel (C); C all
     * NaN when beta = 0 (not read). */
    uint64_t s = g->seed;
    for (size_t i = 0; i < na; i++)
        da[i] = put(ha, g->ab, i, (int)(i % lda) < ar ? uniform(&s) : NAN);
    for (size_t i = 0; i < nb; i++)
        db[i] = put(hb, g->ab, i, (int)(i % ldb) < br ? uniform(&s) : NAN);
    for (size_t i = 0; i < nc; i++)
        dc[i] = put(hc, g->c, i, (int)(i % ldc) >= m ? 7.0f : g->beta != 0.0f ? uniform(&s) : NAN);

    const double u = g->c == CUDA_R_16BF ? 0x1p-8 : g->c == CUDA_R_16F ? 0x1p-11 : 0.0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double sum = 0.0, mag = 0.0;
            for (int l = 0; l < k; l++) {
                double a = g->ta == CUBLAS_OP_N ? da[(size_t)l * lda + i] : da[(size_t)i * lda + l];
                double b = g->tb == CUBLAS_OP_N ? db[(size_t)j * ldb + l] : db[(size_t)l * ldb + j];
                sum += a * b;
                mag += fabs(a * b);
            }
            double c0 = g->beta != 0.0f ? dc[(size_t)j * ldc + i] : 0.0;
            double r = g->alpha * sum + g->beta * c0;
            double acc = 1e-5 * (fabs(g->alpha) * mag + fabs(g->beta * c0));
            ref[(size_t)j * m + i] = r;
            tol[(size_t)j * m + i] = acc + u * (fabs(r) + acc);
        }

    cublasHandle_t h = NULL;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    void *A = upload(ha, na * es), *B = upload(hb, nb * es), *C = upload(hc, nc * ec);
    assert_int_equal(cublasGemmEx(h, g->ta, g->tb, m, n, k, &g->alpha, A, g->ab, lda, B, g->ab, ldb,
                                  &g->beta, C, g->c, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaMemcpy(out, C, nc * ec, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < ldc; i++) {
            double v = get(out, g->c, (size_t)j * ldc + i);
            if (i < m) got[(size_t)j * m + i] = (float)v;
            else assert_true(v == 7.0);   /* C's padding untouched */
        }
    assert_int_equal(h_compare_tol(g->name, got, ref, tol, (size_t)m * n, NULL), 0);

    assert_int_equal(cudaFree(A), cudaSuccess);
    assert_int_equal(cudaFree(B), cudaSuccess);
    assert_int_equal(cudaFree(C), cudaSuccess);
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    free(ha), free(hb), free(hc), free(out), free(da), free(db), free(dc), free(ref), free(tol),
        free(got);
}

static cublasStatus_t gemm_f32(cublasHandle_t h, cublasOperation_t ta, int m, int n, int k,
                               const void *A, int lda, const void *B, int ldb, void *C, int ldc) {
    const float one = 1.0f, zero = 0.0f;
    return cublasGemmEx(h, ta, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb,
                        &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static void test_gemm_bad_arguments(void **state) {
    (void)state;
    cublasHandle_t h = NULL;
    assert_int_equal(cublasCreate(NULL), CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    void *A = NULL, *B = NULL, *C = NULL;
    assert_int_equal(cudaMalloc(&A, 64 * 4), cudaSuccess);   /* 8 x 8 fp32 each */
    assert_int_equal(cudaMalloc(&B, 64 * 4), cudaSuccess);
    assert_int_equal(cudaMalloc(&C, 64 * 4), cudaSuccess);
    const float one = 1.0f;

    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 8, 8, A, 8, B, 8, C, 8), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(gemm_f32(NULL, CUBLAS_OP_N, 8, 8, 8, A, 8, B, 8, C, 8),
                     CUBLAS_STATUS_NOT_INITIALIZED);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, -1, 8, 8, A, 8, B, 8, C, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, -1, 8, A, 8, B, 8, C, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 8, -1, A, 8, B, 8, C, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 4, 4, A, 7, B, 8, C, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_T, 4, 4, 8, A, 7, B, 8, C, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 4, 4, 8, A, 4, B, 7, C, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 4, 4, A, 8, B, 8, C, 7),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(gemm_f32(h, (cublasOperation_t)7, 8, 8, 8, A, 8, B, 8, C, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, NULL, A, CUDA_R_32F, 8, B,
                                  CUDA_R_32F, 8, &one, C, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* Type combinations outside CUBLAS_COMPUTE_32F's table, other compute types. */
    static const cudaDataType combos[][3] = {{CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F},
                                             {CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF},
                                             {CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16F},
                                             {CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F}};
    for (size_t i = 0; i < sizeof combos / sizeof combos[0]; i++)
        assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, A, combos[i][0],
                                      8, B, combos[i][1], 8, &one, C, combos[i][2], 8,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         CUBLAS_STATUS_NOT_SUPPORTED);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, A, CUDA_R_32F, 8, B,
                                  CUDA_R_32F, 8, &one, C, CUDA_R_32F, 8,
                                  (cublasComputeType_t)64 /* CUBLAS_COMPUTE_16F */,
                                  CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    /* TF32 and the other fp32 compute types are accepted (computed in fp32). */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, A, CUDA_R_32F, 8, B,
                                  CUDA_R_32F, 8, &one, C, CUDA_R_32F, 8,
                                  CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    /* Operands outside device memory, or running past their allocation. */
    float host[64] = {0};
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 8, 8, host, 8, B, 8, C, 8),
                     CUBLAS_STATUS_EXECUTION_FAILED);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 8, 8, A, 8, B, 8, host, 8),
                     CUBLAS_STATUS_EXECUTION_FAILED);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 8, 8, A, 9, B, 8, C, 8),
                     CUBLAS_STATUS_EXECUTION_FAILED);
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 8, 8, 8, A, 8, (float *)B + 1, 8, C, 8),
                     CUBLAS_STATUS_EXECUTION_FAILED);
    /* Empty products touch nothing. */
    assert_int_equal(gemm_f32(h, CUBLAS_OP_N, 0, 8, 8, host, 1, host, 8, host, 1),
                     CUBLAS_STATUS_SUCCESS);

    assert_int_equal(cublasSetStream(h, NULL), CUBLAS_STATUS_SUCCESS);
    const cublasMath_t tf32 = (cublasMath_t)(CUBLAS_TF32_TENSOR_OP_MATH |
                                             CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    assert_int_equal(cublasSetMathMode(h, tf32), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSetMathMode(h, (cublasMath_t)7), CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasSetMathMode(NULL, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_NOT_INITIALIZED);
    assert_int_equal(cublasDestroy(NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    assert_string_equal(cublasGetStatusName(CUBLAS_STATUS_ALLOC_FAILED),
                        "CUBLAS_STATUS_ALLOC_FAILED");
    assert_string_equal(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED),
                        "the requested functionality is not supported");
    assert_string_equal(cublasGetStatusName((cublasStatus_t)99), "unrecognized status");

    assert_int_equal(cudaFree(A), cudaSuccess);
    assert_int_equal(cudaFree(B), cudaSuccess);
    assert_int_equal(cudaFree(C), cudaSuccess);
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    (void)cudaGetLastError();
}

/* ---------------------------------------------------------------- devices */

static void *set_device_2(void *arg) {
    int *seen = arg;
    seen[0] = cudaSetDevice(2);
    seen[1] = cudaGetDevice(&seen[2]);
    return NULL;
}

static void test_devices(void **state) {
    (void)state;
    char *saved = h_env_set("DT_EMU_DEVICES", NULL);
    int n = -1, v = -1;
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 1);
    assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    assert_int_equal(v, 132);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    assert_int_equal(v, 9);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
    assert_int_equal(v, 0);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
                     cudaSuccess);
    assert_int_equal(v, 227 * 1024);
    assert_int_equal(cudaDeviceGetAttribute(&v, (enum cudaDeviceAttr)12345, 0),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 1), cudaErrorInvalidDevice);

    static const int kernel_stand_in = 0;
    const enum cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    assert_int_equal(cudaFuncSetAttribute(&kernel_stand_in, smem, 227 * 1024), cudaSuccess);
    assert_int_equal(cudaFuncSetAttribute(&kernel_stand_in, smem, 227 * 1024 + 1),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaFuncSetAttribute(NULL, cudaFuncAttributeMaxDynamicSharedMemorySize, 0),
                     cudaErrorInvalidDeviceFunction);

    /* Several devices; the current one is per thread. */
    setenv("DT_EMU_DEVICES", "3", 1);
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 3);
    int seen[3] = {-1, -1, -1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, set_device_2, seen), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(seen[0], cudaSuccess);
    assert_int_equal(seen[1], cudaSuccess);
    assert_int_equal(seen[2], 2);
    assert_int_equal(cudaGetDevice(&v), cudaSuccess);
    assert_int_equal(v, 0);
    assert_int_equal(cudaSetDevice(2), cudaSuccess);
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, 100), cudaSuccess);
    struct cudaPointerAttributes a;
    assert_int_equal(cudaPointerGetAttributes(&a, p), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeDevice);
    assert_int_equal(a.device, 2);
    assert_int_equal(cudaFree(p), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);

    /* No device: 0, or not a number. */
    static const char *none[] = {"0", "x", "-1", "65"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        setenv("DT_EMU_DEVICES", none[i], 1);
        n = -1;
        assert_int_equal(cudaGetDeviceCount(&n), cudaErrorNoDevice);
        assert_int_equal(n, 0);
        assert_int_equal(cudaMalloc(&p, 16), cudaErrorNoDevice);
        assert_int_equal(cudaSetDevice(0), cudaErrorNoDevice);
    }
    h_env_restore("DT_EMU_DEVICES", saved);
    (void)cudaGetLastError();
}

/* ----------------------------------------------------------------- memory */

static void test_allocations(void **state) {
    (void)state;
    size_t free0 = 0, total = 0, free1 = 0;
    assert_int_equal(cudaMemGetInfo(&free0, &total), cudaSuccess);
    assert_true(free0 <= total && total > 0);

    unsigned char *d = NULL, *h = NULL;
    assert_int_equal(cudaMalloc((void **)&d, 1000), cudaSuccess);
    assert_int_equal((uintptr_t)d % 256, 0);
    for (int i = 0; i < 1000; i++) assert_int_equal(d[i], 0xcd);   /* not zeroed */
    assert_int_equal(cudaMemGetInfo(&free1, &total), cudaSuccess);
    assert_int_equal(free0 - free1, 1000);
    assert_int_equal(cudaHostAlloc((void **)&h, 500, cudaHostAllocDefault), cudaSuccess);
    assert_int_equal((uintptr_t)h % 256, 0);

    struct cudaPointerAttributes a;
    assert_int_equal(cudaPointerGetAttributes(&a, d + 999), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeDevice);
    assert_int_equal(a.device, 0);
    assert_ptr_equal(a.devicePointer, d + 999);
    assert_null(a.hostPointer);
    assert_int_equal(cudaPointerGetAttributes(&a, h + 10), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeHost);
    assert_ptr_equal(a.hostPointer, h + 10);
    int local = 0;
    assert_int_equal(cudaPointerGetAttributes(&a, &local), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeUnregistered);
    assert_int_equal(a.device, cudaInvalidDeviceId);
    assert_int_equal(cudaPointerGetAttributes(NULL, d), cudaErrorInvalidValue);

    /* Frees reject what they did not allocate, and set the last error. */
    (void)cudaGetLastError();
    void *foreign = malloc(64);
    assert_int_equal(cudaFree(foreign), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(d + 1), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(h), cudaErrorInvalidValue);
    assert_int_equal(cudaFreeHost(d), cudaErrorInvalidValue);
    assert_int_equal(cudaFreeHost(foreign), cudaErrorInvalidValue);
    free(foreign);
    assert_int_equal(cudaFree(NULL), cudaSuccess);
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(cudaFree(d), cudaErrorInvalidValue);   /* twice */
    assert_int_equal(cudaFreeHost(h), cudaSuccess);
    assert_int_equal(cudaMemGetInfo(&free1, &total), cudaSuccess);
    assert_int_equal(free1, free0);

    void *p = &local;
    assert_int_equal(cudaMalloc(&p, 0), cudaSuccess);
    assert_null(p);
    assert_int_equal(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
    assert_int_equal(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
    assert_null(p);
    assert_int_equal(cudaHostAlloc(&p, 16, 0x100), cudaErrorInvalidValue);
    (void)cudaGetLastError();
}

static void test_copies(void **state) {
    (void)state;
    enum { N = 1000 };
    unsigned char src[N], back[N], host[N];
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + 1);
    unsigned char *d1 = NULL, *d2 = NULL, *pinned = NULL;
    assert_int_equal(cudaMalloc((void **)&d1, N), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&d2, N), cudaSuccess);
    assert_int_equal(cudaHostAlloc((void **)&pinned, N, cudaHostAllocDefault), cudaSuccess);
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);

    /* Stream work runs when the host waits for it: pinned memory shows the
     * copies only after cudaStreamQuery (the NULL stream's copy does not
     * wait for a non-blocking stream); a copy into pageable memory is done
     * on return. */
    memset(pinned, 0, N);
    assert_int_equal(cudaMemcpy(d1, src, N, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(d2, d1, N, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(pinned, d2, N, cudaMemcpyDefault, s), cudaSuccess);
    assert_int_equal(cudaMemcpy(back, pinned, N, cudaMemcpyHostToHost), cudaSuccess);
    for (int i = 0; i < N; i++) assert_int_equal(back[i], 0);
    assert_int_equal(cudaStreamQuery(s), cudaSuccess);
    assert_int_equal(cudaMemcpy(back, pinned, N, cudaMemcpyHostToHost), cudaSuccess);
    assert_memory_equal(back, src, N);
    assert_int_equal(cudaMemsetAsync(d2 + 10, 0xab, 20, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(back, d2, N, cudaMemcpyDeviceToHost, s), cudaSuccess);
    for (int i = 0; i < N; i++) assert_int_equal(back[i], i >= 10 && i < 30 ? 0xab : src[i]);
    /* A copy from pageable memory reads it at the call. */
    unsigned char staged[N];
    memcpy(staged, src, N);
    assert_int_equal(cudaMemcpyAsync(d1, staged, N, cudaMemcpyHostToDevice, s), cudaSuccess);
    memset(staged, 0, N);
    assert_int_equal(cudaMemcpyAsync(back, d1, N, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_memory_equal(back, src, N);

    /* Past an allocation's end, the device side not device memory, a bad
     * direction, a memset of unknown memory; nothing is written. */
    memset(host, 0, N);
    assert_int_equal(cudaMemcpy(d1 + 1, src, N, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(host, d1 + 1, N, cudaMemcpyDefault), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(host, src, N, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(host, src, N, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(d1, src, N, (enum cudaMemcpyKind)9),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaMemsetAsync(host, 1, N, s), cudaErrorInvalidValue);
    assert_int_equal(cudaMemsetAsync(d1, 1, N + 1, s), cudaErrorInvalidValue);
    for (int i = 0; i < N; i++) assert_int_equal(host[i], 0);
    assert_int_equal(cudaMemcpy(NULL, NULL, 0, cudaMemcpyDefault), cudaSuccess);
    uint32_t fake[4] = {0};
    assert_int_equal(cudaMemcpyAsync(d2, d1, N, cudaMemcpyDefault, (cudaStream_t)(void *)fake),
                     cudaErrorInvalidResourceHandle);

    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamCreateWithFlags(&s, 0x10), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(d1), cudaSuccess);
    assert_int_equal(cudaFree(d2), cudaSuccess);
    assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
    (void)cudaGetLastError();
}

static void test_events(void **state) {
    (void)state;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL, quiet = NULL, never = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e0), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e1), cudaSuccess);
    assert_int_equal(cudaEventCreate(&never), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&quiet, cudaEventDisableTiming), cudaSuccess);

    /* A record runs when the host waits for it: before, no time. */
    float ms = -1.0f;
    assert_int_equal(cudaEventRecord(e0, s), cudaSuccess);
    assert_int_equal(cudaEventElapsedTime(&ms, e0, e0), cudaErrorNotReady);
    assert_int_equal(cudaEventQuery(e0), cudaSuccess);
    struct timespec nap = {0, 2000000};
    nanosleep(&nap, NULL);
    assert_int_equal(cudaEventRecord(e1, s), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(e1), cudaSuccess);
    assert_int_equal(cudaEventQuery(e1), cudaSuccess);
    assert_int_equal(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    assert_true(ms >= 1.9f && ms < 10000.0f);
    assert_int_equal(cudaEventElapsedTime(&ms, e0, e0), cudaSuccess);
    assert_true(ms == 0.0f);

    assert_int_equal(cudaEventRecord(quiet, s), cudaSuccess);
    assert_int_equal(cudaEventQuery(quiet), cudaSuccess);
    assert_int_equal(cudaEventElapsedTime(&ms, e0, quiet), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventElapsedTime(&ms, never, e1), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventElapsedTime(NULL, e0, e1), cudaErrorInvalidValue);
    assert_int_equal(cudaEventQuery(NULL), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventCreateWithFlags(&never, 0x100), cudaErrorInvalidValue);

    assert_int_equal(cudaEventDestroy(e0), cudaSuccess);
    assert_int_equal(cudaEventDestroy(e1), cudaSuccess);
    assert_int_equal(cudaEventDestroy(quiet), cudaSuccess);
    assert_int_equal(cudaEventDestroy(never), cudaSuccess);
    assert_int_equal(cudaEventDestroy(NULL), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    (void)cudaGetLastError();
}

/* -------------------------------------------------------------- last error */

static void *other_thread_errors(void *arg) {
    int *seen = arg;
    seen[0] = cudaPeekAtLastError();          /* the main thread's error is not here */
    seen[1] = cudaSetDevice(-1);
    seen[2] = cudaPeekAtLastError();
    return NULL;
}

static void test_last_error(void **state) {
    (void)state;
    (void)cudaGetLastError();
    assert_int_equal(cudaGetLastError(), cudaSuccess);

    /* Set by a failing call; kept across successful ones; peek keeps it,
     * get clears it; the latest failure wins. */
    assert_int_equal(cudaSetDevice(99), cudaErrorInvalidDevice);
    int d = -1;
    assert_int_equal(cudaGetDevice(&d), cudaSuccess);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    int x = 0;
    assert_int_equal(cudaFree(&x), cudaErrorInvalidValue);
    assert_int_equal(cudaEventQuery(NULL), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidResourceHandle);

    /* Per thread. */
    int seen[3] = {-1, -1, -1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_thread_errors, seen), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(seen[0], cudaSuccess);
    assert_int_equal(seen[1], cudaErrorInvalidDevice);
    assert_int_equal(seen[2], cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);

    /* A failed launch, as the launch path reports it. */
    assert_string_equal(dt_emu_cuda_launch_error(), "");
    dt_emu_cuda_set_launch_error("block (1,0,0) thread 5: __trap() (expected by the test)");
    assert_non_null(strstr(dt_emu_cuda_launch_error(), "__trap()"));
    assert_int_equal(cudaPeekAtLastError(), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaSuccess);

    assert_string_equal(cudaGetErrorString(cudaSuccess), "no error");
    assert_string_equal(cudaGetErrorString(cudaErrorLaunchFailure), "unspecified launch failure");
    assert_string_equal(cudaGetErrorName(cudaErrorLaunchFailure), "cudaErrorLaunchFailure");
    assert_string_equal(cudaGetErrorString(cudaErrorNotReady), "device not ready");
    assert_string_equal(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
    assert_string_equal(cudaGetErrorString((cudaError_t)12345), "unrecognized error code");
    assert_string_equal(cudaGetErrorName((cudaError_t)12345), "unrecognized error code");
}

/* ----------------------------------------------------------------- threads */

enum { THREADS = 8, ROUNDS = 200 };

typedef struct thread_work {
    int device;
    long failures;
} thread_work;

/* Allocate, check attributes, copy, multiply (C = A I), free: over and
 * over, on the thread's own device, while the others do the same. */
static void *hammer(void *arg) {
    thread_work *w = arg;
    cublasHandle_t h = NULL;
    if (cudaSetDevice(w->device) != cudaSuccess || cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        w->failures++;
        return NULL;
    }
    uint64_t s = (uint64_t)w->device * 1000003u;
    for (int r = 0; r < ROUNDS; r++) {
        const int m = 1 + (int)(splitmix(&s) % 9), k = 1 + (int)(splitmix(&s) % 9);
        float a[81], eye[81], c[81];
        for (int i = 0; i < m * k; i++) a[i] = uniform(&s);
        for (int i = 0; i < k * k; i++) eye[i] = i % (k + 1) == 0 ? 1.0f : 0.0f;
        void *A = NULL, *I = NULL, *C = NULL;
        struct cudaPointerAttributes at;
        if (cudaMalloc(&A, sizeof a) != cudaSuccess || cudaMalloc(&I, sizeof eye) != cudaSuccess ||
            cudaMalloc(&C, sizeof c) != cudaSuccess ||
            cudaPointerGetAttributes(&at, A) != cudaSuccess || at.type != cudaMemoryTypeDevice ||
            at.device != w->device ||
            cudaMemcpy(A, a, (size_t)m * k * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(I, eye, (size_t)k * k * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
            gemm_f32(h, CUBLAS_OP_N, m, k, k, A, m, I, k, C, m) != CUBLAS_STATUS_SUCCESS ||
            cudaMemcpy(c, C, (size_t)m * k * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
            memcmp(a, c, (size_t)m * k * 4) != 0)
            w->failures++;
        if (cudaFree(A) != cudaSuccess || cudaFree(I) != cudaSuccess || cudaFree(C) != cudaSuccess)
            w->failures++;
    }
    if (cublasDestroy(h) != CUBLAS_STATUS_SUCCESS || cudaPeekAtLastError() != cudaSuccess)
        w->failures++;
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    char *saved = h_env_set("DT_EMU_DEVICES", "8");
    size_t free0[THREADS], free1, total;
    for (int t = 0; t < THREADS; t++) {
        assert_int_equal(cudaSetDevice(t), cudaSuccess);
        assert_int_equal(cudaMemGetInfo(&free0[t], &total), cudaSuccess);
    }
    thread_work w[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t] = (thread_work){t, 0};
        assert_int_equal(pthread_create(&th[t], NULL, hammer, &w[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) assert_int_equal(pthread_join(th[t], NULL), 0);
    for (int t = 0; t < THREADS; t++) {
        assert_int_equal(w[t].failures, 0);
        assert_int_equal(cudaSetDevice(t), cudaSuccess);
        assert_int_equal(cudaMemGetInfo(&free1, &total), cudaSuccess);
        assert_int_equal(free1, free0[t]);   /* everything freed, per device */
    }
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    h_env_restore("DT_EMU_DEVICES", saved);
}

/* ------------------------------------------------------------ tensor maps */

/* The arguments of one cuTensorMapEncodeTiled call, a valid 2D bf16 map
 * by default: 100 x 50 elements, rows 208 bytes apart, box 64 x 32, 128-byte
 * swizzle. */
typedef struct encode_args {
    CUtensorMapDataType type;
    cuuint32_t rank;
    void *addr;
    cuuint64_t dim[5], stride[4];
    cuuint32_t box[5], estride[5];
    CUtensorMapInterleave il;
    CUtensorMapSwizzle sw;
    CUtensorMapL2promotion l2;
    CUtensorMapFloatOOBfill oob;
} encode_args;

static encode_args default_args(void *addr) {
    return (encode_args){CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, addr, {100, 50, 1, 1, 1},
                         {208, 0, 0, 0}, {64, 32, 1, 1, 1}, {1, 1, 1, 1, 1},
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE};
}

static CUresult encode(PFN_cuTensorMapEncodeTiled_v12000 fn, CUtensorMap *map, const encode_args *a) {
    return fn(map, a->type, a->rank, a->addr, a->dim, a->stride, a->box, a->estride, a->il, a->sw,
              a->l2, a->oob);
}

static void test_tensor_map(void **state) {
    (void)state;
    /* the entry point: found from CUDA 12.0 on, in a driver of 13.0 */
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                      cudaEnableDefault, &st),
                     cudaSuccess);
    assert_int_equal(st, cudaDriverEntryPointSuccess);
    assert_non_null(fn);
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    assert_true(enc == cuTensorMapEncodeTiled);
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 13000,
                                                      cudaEnableLegacyStream, NULL),
                     cudaSuccess);
    assert_non_null(fn);
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault,
                                                      &st),
                     cudaSuccess);
    assert_int_equal(st, cudaDriverEntryPointSymbolNotFound);
    assert_null(fn);
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 11080,
                                                      cudaEnableDefault, &st),
                     cudaSuccess);
    assert_int_equal(st, cudaDriverEntryPointVersionNotSufficent);
    assert_null(fn);
    (void)cudaGetLastError();
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 13010,
                                                      cudaEnableDefault, &st),
                     cudaErrorInvalidValue);   /* newer than the driver */
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, 4, &st),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaGetDriverEntryPointByVersion(NULL, &fn, 12000, 0, &st),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", NULL, 12000, 0, &st),
                     cudaErrorInvalidValue);
    (void)cudaGetLastError();

    unsigned char *d = NULL;
    assert_int_equal(cudaMalloc((void **)&d, 50 * 208), cudaSuccess);
    CUtensorMap map;
    assert_int_equal((uintptr_t)&map % 128, 0);
    encode_args a = default_args(d);
    memset(&map, 0, sizeof map);
    assert_int_equal(encode(enc, &map, &a), CUDA_SUCCESS);
    int nonzero = 0;
    for (int i = 0; i < CU_TENSOR_MAP_NUM_QWORDS; i++) nonzero += map.opaque[i] != 0;
    assert_true(nonzero > 4);

    /* each of the driver's documented rules broken once (invalid), the
     * valid maps the emulator cannot copy, and the valid edges */
    enum { ADDR, RANK, DIM, STRIDE, BOX, ESTRIDE, INTERLEAVE, SWIZZLE, L2, OOB, TYPE };
    static const struct {
        const char *what;
        int field, index;
        uint64_t value;
        CUresult want;
    } rules[] = {
        {"address 8 bytes off 16-byte alignment", ADDR, 0, 8, CUDA_ERROR_INVALID_VALUE},
        {"rank 0", RANK, 0, 0, CUDA_ERROR_INVALID_VALUE},
        {"rank 6", RANK, 0, 6, CUDA_ERROR_INVALID_VALUE},
        {"globalDim 0", DIM, 1, 0, CUDA_ERROR_INVALID_VALUE},
        {"globalDim 2^32 + 1", DIM, 0, (1ull << 32) + 1, CUDA_ERROR_INVALID_VALUE},
        {"stride not a multiple of 16", STRIDE, 0, 200, CUDA_ERROR_INVALID_VALUE},
        {"stride 2^40", STRIDE, 0, 1ull << 40, CUDA_ERROR_INVALID_VALUE},
        {"box 0", BOX, 1, 0, CUDA_ERROR_INVALID_VALUE},
        {"box 257", BOX, 1, 257, CUDA_ERROR_INVALID_VALUE},
        {"inner box of 8 bytes", BOX, 0, 4, CUDA_ERROR_INVALID_VALUE},
        {"inner box of 256 bytes with the 128-byte swizzle", BOX, 0, 128,
         CUDA_ERROR_INVALID_VALUE},
        {"element stride 0", ESTRIDE, 1, 0, CUDA_ERROR_INVALID_VALUE},
        {"element stride 9", ESTRIDE, 1, 9, CUDA_ERROR_INVALID_VALUE},
        {"interleave 32B in rank 2", INTERLEAVE, 0, CU_TENSOR_MAP_INTERLEAVE_32B,
         CUDA_ERROR_INVALID_VALUE},
        {"interleave enum 3", INTERLEAVE, 0, 3, CUDA_ERROR_INVALID_VALUE},
        {"swizzle enum 7", SWIZZLE, 0, 7, CUDA_ERROR_INVALID_VALUE},
        {"64-byte swizzle, 128-byte inner box", SWIZZLE, 0, CU_TENSOR_MAP_SWIZZLE_64B,
         CUDA_ERROR_INVALID_VALUE},
        {"32-byte swizzle, 128-byte inner box", SWIZZLE, 0, CU_TENSOR_MAP_SWIZZLE_32B,
         CUDA_ERROR_INVALID_VALUE},
        {"L2 promotion enum 4", L2, 0, 4, CUDA_ERROR_INVALID_VALUE},
        {"OOB fill enum 2", OOB, 0, 2, CUDA_ERROR_INVALID_VALUE},
        {"data type enum 16", TYPE, 0, 16, CUDA_ERROR_INVALID_VALUE},
        {"element stride 2 in dimension 1", ESTRIDE, 1, 2, CUDA_ERROR_NOT_SUPPORTED},
        {"OOB NaN fill", OOB, 0, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
         CUDA_ERROR_NOT_SUPPORTED},
        {"128-byte swizzle with 32-byte atoms", SWIZZLE, 0, CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B,
         CUDA_ERROR_NOT_SUPPORTED},
        {"TF32", TYPE, 0, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, CUDA_ERROR_NOT_SUPPORTED},
        {"globalDim 2^32", DIM, 1, 1ull << 32, CUDA_SUCCESS},
        {"box 256 in dimension 1", BOX, 1, 256, CUDA_SUCCESS},
        {"element stride 8 in dimension 0 (ignored)", ESTRIDE, 0, 8, CUDA_SUCCESS},
        {"stride 2^40 - 16", STRIDE, 0, (1ull << 40) - 16, CUDA_SUCCESS},
        {"no swizzle, 256-byte inner box", SWIZZLE, 0, CU_TENSOR_MAP_SWIZZLE_NONE, CUDA_SUCCESS},
        {"float32", TYPE, 0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, CUDA_ERROR_INVALID_VALUE},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        a = default_args(d);
        const uint64_t v = rules[i].value;
        const int k = rules[i].index;
        switch (rules[i].field) {
        case ADDR: a.addr = d + v; break;
        case RANK: a.rank = (cuuint32_t)v; break;
        case DIM: a.dim[k] = v; break;
        case STRIDE: a.stride[k] = v; break;
        case BOX: a.box[k] = (cuuint32_t)v; break;
        case ESTRIDE: a.estride[k] = (cuuint32_t)v; break;
        case INTERLEAVE: a.il = (CUtensorMapInterleave)v; break;
        case SWIZZLE:
            a.sw = (CUtensorMapSwizzle)v;
            if (v == CU_TENSOR_MAP_SWIZZLE_NONE) a.box[0] = 128;   /* 256 bytes */
            break;
        case L2: a.l2 = (CUtensorMapL2promotion)v; break;
        case OOB: a.oob = (CUtensorMapFloatOOBfill)v; break;
        default: a.type = (CUtensorMapDataType)v; break;
        }
        const CUresult got = encode(enc, &map, &a);
        if (got != rules[i].want)
            print_error("%s: got %d, want %d\n", rules[i].what, (int)got, (int)rules[i].want);
        assert_int_equal(got, rules[i].want);
    }
    /* the OOB NaN fill is for floating-point types only */
    a = default_args(d);
    a.type = CU_TENSOR_MAP_DATA_TYPE_UINT16;
    a.oob = CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
    assert_int_equal(encode(enc, &map, &a), CUDA_ERROR_INVALID_VALUE);
    /* interleaved layouts: rank 3 or more, then not emulated */
    a = default_args(d);
    a.rank = 3;
    a.stride[1] = 208 * 50;
    a.il = CU_TENSOR_MAP_INTERLEAVE_16B;
    a.sw = CU_TENSOR_MAP_SWIZZLE_NONE;
    assert_int_equal(encode(enc, &map, &a), CUDA_ERROR_NOT_SUPPORTED);
    /* the map 64-byte aligned; NULL pointers */
    static _Alignas(128) unsigned char raw[256];
    a = default_args(d);
    assert_int_equal(encode(enc, (CUtensorMap *)(void *)(raw + 32), &a), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(encode(enc, (CUtensorMap *)(void *)(raw + 64), &a), CUDA_SUCCESS);
    assert_int_equal(encode(enc, NULL, &a), CUDA_ERROR_INVALID_VALUE);
    a.addr = NULL;
    assert_int_equal(encode(enc, &map, &a), CUDA_ERROR_INVALID_VALUE);
    a = default_args(d);
    assert_int_equal(enc(&map, a.type, a.rank, a.addr, a.dim, NULL, a.box, a.estride, a.il, a.sw,
                         a.l2, a.oob),
                     CUDA_ERROR_INVALID_VALUE);
    a.rank = 1;   /* no strides to give */
    assert_int_equal(enc(&map, a.type, a.rank, a.addr, a.dim, NULL, a.box, a.estride, a.il, a.sw,
                         a.l2, a.oob),
                     CUDA_SUCCESS);
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(cudaGetLastError(), cudaSuccess);   /* driver calls leave it alone */
}

/* ------------------------------------------------------------------- main */

/* Queued work runs in order when the host waits, once; a failed operation
 * makes its stream, and events recorded after it there, report
 * cudaErrorLaunchFailure; other streams go on. */
typedef struct step {
    int *log, *n, value, fail;
} step;
static int run_step(void *ctx, char *err, size_t err_size) {
    step *t = ctx;
    t->log[(*t->n)++] = t->value;
    if (t->fail) snprintf(err, err_size, "step %d fails (a test)", t->value);
    int rc = t->fail ? -1 : 0;
    free(t);
    return rc;
}
static void test_deferred(void **state) {
    (void)state;
    int log[8], n = 0;
    cudaStream_t s = NULL, other = NULL;
    cudaEvent_t after = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaEventCreate(&after), cudaSuccess);
    for (int i = 0; i < 3; i++) {
        step *t = malloc(sizeof *t);
        *t = (step){log, &n, i, i == 1};
        assert_int_equal(dt_emu_cuda_enqueue(s, run_step, t), cudaSuccess);
    }
    assert_int_equal(cudaEventRecord(after, s), cudaSuccess);
    step *t = malloc(sizeof *t);
    *t = (step){log, &n, 7, 0};
    assert_int_equal(dt_emu_cuda_enqueue(other, run_step, t), cudaSuccess);
    assert_int_equal(n, 0);   /* nothing ran yet */
    assert_int_equal(cudaEventQuery(after), cudaErrorLaunchFailure);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(log[i], i);
    assert_non_null(strstr(dt_emu_cuda_launch_error(), "step 1 fails"));
    assert_int_equal(cudaStreamQuery(s), cudaErrorLaunchFailure);
    assert_int_equal(cudaStreamQuery(other), cudaSuccess);
    assert_int_equal(n, 4);
    assert_int_equal(log[3], 7);
    assert_int_equal(cudaEventDestroy(after), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(other), cudaSuccess);
    (void)cudaGetLastError();
}

int main(void) {
    static const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    static const cudaDataType types[][2] = {{CUDA_R_32F, CUDA_R_32F},
                                            {CUDA_R_16BF, CUDA_R_16BF},
                                            {CUDA_R_16BF, CUDA_R_32F},
                                            {CUDA_R_16F, CUDA_R_16F},
                                            {CUDA_R_16F, CUDA_R_32F}};
    static const struct {
        int m, n, k, pad;
        float alpha, beta;
    } shapes[] = {
        {1, 1, 1, 0, 1.0f, 0.0f},     {7, 5, 13, 3, 1.5f, -0.5f}, {33, 17, 64, 0, -1.0f, 1.0f},
        {5, 9, 1, 2, 0.25f, 0.0f},    {16, 3, 40, 1, 0.0f, 2.0f}, {4, 6, 0, 0, 1.0f, 0.5f},
        {65, 70, 129, 5, 1.0f, 0.0f},
    };
    enum { NSHAPES = sizeof shapes / sizeof shapes[0], NTYPES = sizeof types / sizeof types[0] };
    static gemm_case cases[NSHAPES * NTYPES * 4];
    struct CMUnitTest tests[NSHAPES * NTYPES * 4 + 10];
    size_t nt = 0;
    for (int sh = 0; sh < NSHAPES; sh++)
        for (int ty = 0; ty < NTYPES; ty++)
            for (int tr = 0; tr < 4; tr++) {
                gemm_case *g = &cases[nt];
                g->ta = ops[tr >> 1];
                g->tb = ops[tr & 1];
                g->m = shapes[sh].m;
                g->n = shapes[sh].n;
                g->k = shapes[sh].k;
                g->pad = shapes[sh].pad;
                g->alpha = shapes[sh].alpha;
                g->beta = shapes[sh].beta;
                g->ab = types[ty][0];
                g->c = types[ty][1];
                g->seed = 1000u * (uint64_t)sh + 10u * (uint64_t)ty + (uint64_t)tr + 1u;
                snprintf(g->name, sizeof g->name,
                         "gemm/%s->%s,%c%c,m=%d,n=%d,k=%d,ld+%d,alpha=%g,beta=%g", type_name(g->ab),
                         type_name(g->c), g->ta == CUBLAS_OP_N ? 'N' : 'T',
                         g->tb == CUBLAS_OP_N ? 'N' : 'T', g->m, g->n, g->k, g->pad,
                         (double)g->alpha, (double)g->beta);
                tests[nt] = (struct CMUnitTest){g->name, test_gemm, NULL, NULL, g};
                nt++;
            }
#define CASE(name, fn) (struct CMUnitTest){name, fn, NULL, NULL, NULL}
    tests[nt++] = CASE("gemm/bad-arguments", test_gemm_bad_arguments);
    tests[nt++] = CASE("devices/count,attributes,per-thread", test_devices);
    tests[nt++] = CASE("memory/allocations,pointer-attributes,foreign-frees", test_allocations);
    tests[nt++] = CASE("memory/copies,memsets,bounds", test_copies);
    tests[nt++] = CASE("streams/events,elapsed-time", test_events);
    tests[nt++] = CASE("errors/last-error,thread-local,launch", test_last_error);
    tests[nt++] = CASE("threads/8-devices,alloc,gemm,free", test_threads);
    tests[nt++] = CASE("driver/tensor-map-encode,entry-point", test_tensor_map);
    /* last: it leaves a launch-failure message behind */
    tests[nt++] = CASE("streams/deferred,in-order,sticky-failure", test_deferred);
    return h_run_cases("CUDA runtime and cuBLAS on the CPU (tests/emu/cudart.c)", tests, nt);
}
