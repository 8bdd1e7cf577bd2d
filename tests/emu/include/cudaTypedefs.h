/* tests/emu/include/cudaTypedefs.h — the emulator's stand-in for CUDA's
 * driver function pointer typedefs: the one for cuTensorMapEncodeTiled
 * (cudaTypedefs.h of CUDA 13), whose pointer
 * cudaGetDriverEntryPointByVersion returns (tests/emu/cudart.c). Plain C;
 * also C++. */
#ifndef DT_TEST_EMU_CUDA_TYPEDEFS_H
#define DT_TEST_EMU_CUDA_TYPEDEFS_H

#include "cuda.h"

typedef CUresult(CUDAAPI *PFN_cuTensorMapEncodeTiled_v12000)(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
    void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
    const cuuint32_t *boxDim, const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
    CUtensorMapFloatOOBfill oobFill);

#endif /* DT_TEST_EMU_CUDA_TYPEDEFS_H */
