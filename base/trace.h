/* base/trace.h — PRIVATE. Named ranges for profilers: NVTX (header-only
 * nvtx3, shipped with CUDA), so Nsight Systems shows every collective,
 * send/recv group and attention ring step on its rank's thread, beside the
 * kernels and copies. Costs nothing without a profiler attached (NVTX calls
 * are no-ops until one injects itself); compiled out in builds without CUDA.
 *
 *   DT_TRACE_PUSH("dt all_reduce");  ...  DT_TRACE_POP();
 */
#ifndef DT_TRACE_H
#define DT_TRACE_H

#if defined(DT_HAVE_CUDA) && defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define DT_TRACE 1
#endif
#endif

#ifdef DT_TRACE
#define DT_TRACE_PUSH(name) nvtxRangePushA(name)
#define DT_TRACE_POP() nvtxRangePop()
#else
#define DT_TRACE_PUSH(name) ((void)(name))
#define DT_TRACE_POP() ((void)0)
#endif

#endif /* DT_TRACE_H */
