// A per-block timeline of the tensor-core GEMVs, for the bench only (built with -DSPARK_TIMELINE; without it
// every mark is empty): thread 0 of each block writes its SM, the global timer at entry and exit and its SM's
// cycle counter at entry, at the start and end of its weight loop, and at exit. spark_timeline_read copies them
// out: [2 GEMVs (gate/up, down)][TL_BLOCKS][TL_FIELDS] 64-bit values, zero where no block wrote.

#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int TL_BLOCKS = 4096;
enum TlField { TL_SM = 0, TL_GT_ENTRY, TL_ENTRY, TL_LOOP, TL_LOOP_END, TL_EXIT, TL_GT_EXIT, TL_FIELDS };

#ifdef SPARK_TIMELINE
__device__ unsigned long long g_timeline[2][TL_BLOCKS][TL_FIELDS];

__device__ __forceinline__ void tl_mark(int down, int field)
{
    if (threadIdx.x != 0 || blockIdx.x >= TL_BLOCKS) return;
    unsigned long long v;
    if (field == TL_SM)
    {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        v = s;
    }
    else if (field == TL_GT_ENTRY || field == TL_GT_EXIT)
    {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    }
    else
    {
        v = clock64();
    }
    g_timeline[down != 0][blockIdx.x][field] = v;
}
#else
__device__ __forceinline__ void tl_mark(int, int) {}
#endif

}  // namespace

extern "C" {

// Copies the timeline to host memory `dst` (2 * TL_BLOCKS * TL_FIELDS uint64) and zeroes it; without
// SPARK_TIMELINE returns cudaErrorNotSupported.
int spark_timeline_read(void* dst)
{
#ifdef SPARK_TIMELINE
    const size_t n = sizeof(unsigned long long) * 2 * TL_BLOCKS * TL_FIELDS;
    cudaError_t err = cudaMemcpyFromSymbol(dst, g_timeline, n);
    if (err != cudaSuccess) return (int) err;
    void* p = nullptr;
    err = cudaGetSymbolAddress(&p, g_timeline);
    if (err != cudaSuccess) return (int) err;
    return (int) cudaMemset(p, 0, n);
#else
    (void) dst;
    return (int) cudaErrorNotSupported;
#endif
}

}  // extern "C"
