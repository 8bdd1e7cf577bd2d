/* tests/emu/include/cublas_v2.h — the emulator's stand-in for cuBLAS: the
 * subset dtensor uses (dtensor/backend_cuda.cu, bench/mlp.c), with cuBLAS's
 * names and values (cublas_api.h of CUDA 13), implemented by
 * tests/emu/cudart.c.
 *
 * cublasGemmEx computes C = alpha op(A) op(B) + beta C, column-major, in
 * fp32 (OpenBLAS sgemm on operands converted to fp32), synchronously in the
 * calling thread; A, B and C must lie inside cudaMalloc allocations, as
 * they must lie in device memory on a GPU. Plain C11; also C++. */
#ifndef DT_TEST_EMU_CUBLAS_V2_H
#define DT_TEST_EMU_CUBLAS_V2_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2   /* = CUBLAS_OP_T for real types */
} cublasOperation_t;

/* A mode, optionally or'ed with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION. */
typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
} cublasMath_t;

typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;

typedef enum {
    CUBLAS_GEMM_DEFAULT = -1
} cublasGemmAlgo_t;

typedef struct cublasContext *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char *cublasGetStatusName(cublasStatus_t status);
const char *cublasGetStatusString(cublasStatus_t status);

/* A is lda x (transa == N ? k : m), B ldb x (transb == N ? n : k), C ldc x n,
 * column-major; alpha and beta point to floats (host). Types: A and B
 * CUDA_R_32F with C CUDA_R_32F, or A and B both CUDA_R_16BF or both
 * CUDA_R_16F with C of the same type or CUDA_R_32F; computeType one of the
 * CUBLAS_COMPUTE_32F* (all computed in full fp32 here). */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif

#endif /* DT_TEST_EMU_CUBLAS_V2_H */
