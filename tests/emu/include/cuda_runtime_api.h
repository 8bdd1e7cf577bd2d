/* tests/emu/include/cuda_runtime_api.h — the emulator's stand-in for the
 * CUDA runtime API (host side), implemented on the CPU by tests/emu/cudart.c.
 *
 * Only what dtensor uses (dtensor/backend_cuda.cu, attention/block_cuda*.cu,
 * bench/mlp.c, tests/test_reliability.c; cudaGetDriverEntryPointByVersion
 * for the emulated driver's cuTensorMapEncodeTiled, include/cuda.h), under
 * CUDA's own names, numeric
 * values and signatures (driver_types.h, cuda_runtime_api.h and
 * library_types.h of CUDA 13), so the same sources compile against this
 * header or the real one. Plain C11; also C++ (kernel sources reach it
 * through cuda_emu.h), where cudaFuncSetAttribute also takes any kernel
 * pointer, as with cuda_runtime.h.
 *
 * How the emulation differs from a GPU is described in tests/emu/cudart.c:
 * in short, one or more devices whose memory is host memory, and every
 * stream operation deferred until the host waits for it. Thread-safe. */
#ifndef DT_TEST_EMU_CUDA_RUNTIME_API_H
#define DT_TEST_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* driver_types.h: the codes used, and those the emulation returns. */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorECCUncorrectable = 214,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchTimeout = 702,
    cudaErrorAssert = 710,
    cudaErrorHardwareStackError = 714,
    cudaErrorIllegalInstruction = 715,
    cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidAddressSpace = 717,
    cudaErrorInvalidPc = 718,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

/* Opaque handles (cudart.c defines the structs). */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4   /* direction from the pointers (unified addressing) */
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;           /* the owning device; cudaInvalidDeviceId if unregistered */
    void *devicePointer;  /* NULL unless the memory is device-accessible */
    void *hostPointer;    /* NULL unless the memory is host-accessible */
    long reserved[8];
};
typedef struct cudaPointerAttributes cudaPointerAttributes;

#define cudaInvalidDeviceId ((int)-2)

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01

#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

#define cudaEventWaitDefault 0x00
#define cudaEventWaitExternal 0x01

#define cudaHostAllocDefault 0x00

/* driver_types.h: cudaGetDriverEntryPointByVersion's flags and status. */
enum cudaGetDriverEntryPointFlags {
    cudaEnableDefault = 0x0,
    cudaEnableLegacyStream = 0x1,
    cudaEnablePerThreadDefaultStream = 0x2
};

enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2
};

/* ---- errors: the calling thread's last error ---- */
cudaError_t cudaGetLastError(void);      /* returns it and resets it to cudaSuccess */
cudaError_t cudaPeekAtLastError(void);   /* returns it */
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

/* ---- devices (the current device is per host thread, 0 at first) ---- */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* ---- memory ---- */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);

/* ---- streams and events (stream 0 / NULL is the default stream) ---- */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* ---- driver entry points: the emulated driver (include/cuda.h) has one,
 * cuTensorMapEncodeTiled (introduced in CUDA 12.0; the emulated driver is
 * CUDA 13.0). cudaSuccess with *funcPtr set and status
 * cudaDriverEntryPointSuccess for it; cudaSuccess with *funcPtr = NULL and
 * cudaDriverEntryPointSymbolNotFound for any other symbol, or
 * cudaDriverEntryPointVersionNotSufficent for cudaVersion < 12000;
 * cudaErrorInvalidValue for NULL symbol or funcPtr, unknown flags, or
 * cudaVersion above the driver's 13000. driverStatus may be NULL. ---- */
#ifdef __cplusplus
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus = NULL);
#else
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus);
#endif

/* library_types.h */
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14
} cudaDataType;
typedef enum cudaDataType_t cudaDataType_t;

#ifdef __cplusplus
}

/* cuda_runtime.h's overload: any kernel, without a cast. */
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}
#endif

#endif /* DT_TEST_EMU_CUDA_RUNTIME_API_H */
