// Small kernels beside the MoE decode (included at the end of decode_moe.cu): the input and output
// conversions around exllamav3's decode kernel (coop_rows.py) and the cold-read floor the GPU bench
// times. Each launcher returns the launch's cudaError_t.

#pragma once

#include "decode_util.cuh"

namespace {

__global__ void prep_kernel(const void* x, int x_dt, const void* ids, int ids64, const void* w, int w_dt, void* x16,
                            int64_t* ids_out, void* w16, int nx, int nw)
{
    pdl_wait();
    pdl_trigger();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nx + nw; i += stride)
    {
        if (i < nx)
        {
            ((half*) x16)[i] = __float2half_rn(load_as_float(x, i, x_dt));
        }
        else
        {
            const int j = i - nx;
            ids_out[j] = ids64 ? ((const int64_t*) ids)[j] : (int64_t) ((const int32_t*) ids)[j];
            ((half*) w16)[j] = __float2half_rn(load_as_float(w, j, w_dt));
        }
    }
}

__global__ void cast_kernel(const float* src, void* dst, int dst_dt, int64_t n)
{
    pdl_wait();
    pdl_trigger();
    const int64_t stride = (int64_t) gridDim.x * blockDim.x;
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        store_from_float(dst, i, dst_dt, src[i]);
}

__global__ void floor_read_kernel(const uint4* p, size_t n16, unsigned* sink)
{
    unsigned acc = 0;
    const size_t stride = (size_t) gridDim.x * blockDim.x;
    size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride)
    {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                    d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride)
    {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads; practically never taken
}

}  // namespace

extern "C" {

// exllamav3's decode kernel's inputs in one launch: x (f16 / bf16 / f32) to f16, the routing ids
// (int32 / int64) to int64, the routing weights (f32 / f16 / bf16) to f16.
int spark_decode_prep(const void* x, int x_dt, const void* ids, int ids64, const void* w, int w_dt, void* x16,
                      int64_t* ids_out, void* w16, int rows, int topk, int H, int pdl, cudaStream_t stream)
{
    const int n = rows * H + rows * topk;
    const int blocks = (n / 4 + 255) / 256 + 1;
    return (int) launch(prep_kernel, blocks, 256, stream, pdl, x, x_dt, ids, ids64, w, w_dt, x16, ids_out, w16,
                        rows * H, rows * topk);
}

// float32 [n] -> out (f16 / bf16), the decode kernel's output in the caller's dtype
int spark_decode_cast(const float* src, void* dst, int dst_dt, int64_t n, int pdl, cudaStream_t stream)
{
    const int blocks = (int) ((n / 4 + 255) / 256 + 1);
    return (int) launch(cast_kernel, blocks, 256, stream, pdl, src, dst, dst_dt, n);
}

// Cold read of n16 16-byte words (the bench's floor).
int spark_floor_read(const void* p, size_t n16, unsigned* sink, int blocks, cudaStream_t stream)
{
    return (int) launch(floor_read_kernel, blocks, 512, stream, 0, (const uint4*) p, n16, sink);
}

}  // extern "C"
