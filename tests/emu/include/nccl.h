/* tests/emu/include/nccl.h — the emulator's stand-in for NCCL's nccl.h,
 * implemented on the CPU by tests/emu/nccl.c (ranks are threads of one
 * process, devices those of the emulated CUDA runtime, tests/emu/cudart.c).
 *
 * Only what dtensor uses (collectives/transport_nccl.c, the Makefile's
 * probe) and a little more, under NCCL 2.28's names, numeric values and
 * signatures, so the same sources compile against this header or the real
 * one. How the emulation differs from NCCL: tests/emu/nccl.c. Plain C11;
 * also C++. Thread-safe. */
#ifndef DT_TEST_EMU_NCCL_H
#define DT_TEST_EMU_NCCL_H

#include <limits.h>
#include <stddef.h>

#include "cuda_runtime_api.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) \
    (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* NCCL 2.28's ncclConfig_v22800, field for field; the emulator reads
 * `blocking` (and checks size, magic and version, as NCCL does). */
typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                               \
    {                                                                         \
        sizeof(ncclConfig_t),                          /* size */             \
        0xcafebeef,                                    /* magic */            \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */       \
        NCCL_CONFIG_UNDEF_INT,                         /* blocking */         \
        NCCL_CONFIG_UNDEF_INT,                         /* cgaClusterSize */   \
        NCCL_CONFIG_UNDEF_INT,                         /* minCTAs */          \
        NCCL_CONFIG_UNDEF_INT,                         /* maxCTAs */          \
        NCCL_CONFIG_UNDEF_PTR,                         /* netName */          \
        NCCL_CONFIG_UNDEF_INT,                         /* splitShare */       \
        NCCL_CONFIG_UNDEF_INT,                         /* trafficClass */     \
        NCCL_CONFIG_UNDEF_PTR,                         /* commName */         \
        NCCL_CONFIG_UNDEF_INT,                         /* collnetEnable */    \
        NCCL_CONFIG_UNDEF_INT,                         /* CTAPolicy */        \
        NCCL_CONFIG_UNDEF_INT,                         /* shrinkShare */      \
        NCCL_CONFIG_UNDEF_INT,                         /* nvlsCTAs */         \
        NCCL_CONFIG_UNDEF_INT,                         /* nChannelsPerNetPeer */ \
        NCCL_CONFIG_UNDEF_INT,                         /* nvlinkCentricSched */ \
    }

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);

/* Communicators. With config->blocking = 0 the calls that create, split
 * and finalize return ncclInProgress and complete in the background:
 * poll ncclCommGetAsyncError. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

/* Collectives and send/receive: stream work, enqueued on `stream`. */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif /* DT_TEST_EMU_NCCL_H */
