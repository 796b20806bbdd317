// Shared by spark-kit's decode kernels (included by decode_moe.cu, one translation unit): the dtype
// codes the launchers take, loads and stores in any of them, programmatic dependent launch, and the
// one launch helper every kernel goes through.

#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <utility>

namespace {

enum Dtype { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

__device__ __forceinline__ float load_as_float(const void* p, int64_t i, int dt)
{
    if (dt == DT_F16) return __half2float(((const half*) p)[i]);
    if (dt == DT_BF16) return __bfloat162float(((const __nv_bfloat16*) p)[i]);
    return ((const float*) p)[i];
}

// 4 consecutive elements from a 4-aligned index i, as floats
__device__ __forceinline__ float4 load4_as_float(const void* p, int64_t i, int dt)
{
    if (dt == DT_F32) return *(const float4*) ((const float*) p + i);
    const uint2 raw = *(const uint2*) ((const char*) p + 2 * i);
    float2 lo, hi;
    if (dt == DT_F16)
    {
        lo = __half22float2(*(const __half2*) &raw.x);
        hi = __half22float2(*(const __half2*) &raw.y);
    }
    else
    {
        lo = __bfloat1622float2(*(const __nv_bfloat162*) &raw.x);
        hi = __bfloat1622float2(*(const __nv_bfloat162*) &raw.y);
    }
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ void store_from_float(void* p, int64_t i, int dt, float v)
{
    if (dt == DT_F16) ((half*) p)[i] = __float2half_rn(v);
    else if (dt == DT_BF16) ((__nv_bfloat16*) p)[i] = __float2bfloat16_rn(v);
    else ((float*) p)[i] = v;
}

// Programmatic dependent launch (sm_90+): a kernel launched with the PDL attribute may start while
// its predecessor runs. Each kernel here waits (pdl_wait) before it reads anything an earlier kernel
// wrote, and only then lets its successor start (pdl_trigger), so a successor's pre-wait part (the
// gemv's routing scan and first weight loads: inputs older than the layer call) never sees data
// that is still being written. Without the attribute both are no-ops.
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Every launch goes through here: with pdl set it carries the programmatic-stream-serialization attribute
// (captured into CUDA graphs as a programmatic edge), else it is a plain launch. Dynamic shared memory (smem)
// only caps the blocks per SM (decode_mma.cuh's cap_smem).
template <typename... KArgs, typename... Args>
cudaError_t launch_smem(void (*kern)(KArgs...), int grid, int block, size_t smem, cudaStream_t stream, int pdl, Args&&... args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kern)(KArgs...), int grid, int block, cudaStream_t stream, int pdl, Args&&... args)
{
    return launch_smem(kern, grid, block, 0, stream, pdl, std::forward<Args>(args)...);
}

}  // namespace
