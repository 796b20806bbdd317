// The small steps of the own MoE decode kernel around its GEMVs (included by decode_moe.cu after MoeArgs
// and its helpers): the activation of one (slot, 128-chunk) and one output (row, 128-chunk) from its picks,
// each by one warp, as their own launches (mid_kernel, out_kernel) or from the GEMVs' last blocks
// (decode_mma.cuh, fuse_mid / fuse_out: their loads then go through L2).

#pragma once

namespace {

// Loads a float4 of another block's output: through L2 when the block reads it in the same launch (L2)
template <bool L2>
__device__ __forceinline__ float4 load4(const float* p)
{
    return L2 ? __ldcg((const float4*) p) : *(const float4*) p;
}

// The activation of one (slot, 128-chunk) by one warp: sum of gate/up k-parts (the codebook's affine map
// unless the gate/up blocks applied it), H128 * svh for gate and up, silu(g) * u, * down suh, H128 -> down input
template <bool L2>
__device__ __forceinline__ void mid_chunk(const MoeArgs& a, int slot, int chunk, int lane)
{
    const int chunks = a.I >> 7;
    const int slots = a.bsz * a.topk;
    const int e = expert_of(a.ids, a.ids64, slot);
    if (e < 0 || e >= a.n_local) return;
    const int col = chunk * 128 + lane * 4;
    float g[4] = {0, 0, 0, 0}, u[4] = {0, 0, 0, 0};
    for (int p = 0; p < a.parts_a; ++p)
    {
        const float4 gv = load4<L2>(a.gu + (((size_t) p * slots + slot) * 2 + 0) * a.I + col);
        const float4 uv = load4<L2>(a.gu + (((size_t) p * slots + slot) * 2 + 1) * a.I + col);
        g[0] += gv.x; g[1] += gv.y; g[2] += gv.z; g[3] += gv.w;
        u[0] += uv.x; u[1] += uv.y; u[2] += uv.z; u[3] += uv.w;
    }
    const int chunks_h = a.H >> 7;
    if (a.nobias && !a.fuse_in)  // the codebook's affine map over the k-sums: S * sum x (1024 + b) + O * sum x
    {
        const float og = MUL1_O_F * sum_chunks(a.sums + ((size_t) slot * 2 + 0) * chunks_h, chunks_h, lane);
        const float ou = MUL1_O_F * sum_chunks(a.sums + ((size_t) slot * 2 + 1) * chunks_h, chunks_h, lane);
        #pragma unroll
        for (int i = 0; i < 4; ++i)
        {
            g[i] = fmaf(g[i], MUL1_S_F, og);
            u[i] = fmaf(u[i], MUL1_S_F, ou);
        }
    }
    had128(g[0], g[1], g[2], g[3], lane);
    had128(u[0], u[1], u[2], u[3], lane);
    const half* gs = (const half*) table(a, 0, 2, e);
    const half* us = (const half*) table(a, 1, 2, e);
    const half* ds = (const half*) table(a, 2, 1, e);
    float v[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        const float gg = g[i] * __half2float(gs[col + i]);
        const float uu = u[i] * __half2float(us[col + i]);
        v[i] = gg / (1.0f + __expf(-gg)) * uu * __half2float(ds[col + i]);
    }
    had128(v[0], v[1], v[2], v[3], lane);
    store_in4(a, a.ah, (size_t) slot * a.I + col, v);
    if (a.nobias)
    {
        const float t = chunk_sum16(v);
        if (lane == 0) a.sums[(size_t) slots * 2 * chunks_h + (size_t) slot * chunks + chunk] = t;
    }
}

__global__ void mid_kernel(const MoeArgs a)
{
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int chunks = a.I >> 7;
    if (item >= a.bsz * a.topk * chunks) return;
    mid_chunk<false>(a, item / chunks, item % chunks, lane);
}

constexpr int OUT_MAX_TOPK = 8;  // picks per row the out kernel takes (a warp each)

// Pick k of one output (row, 128-chunk) by one warp into dst[128]: k-part sum, the codebook's affine map,
// H128, * svh * routing weight (zeros for a pick outside this rank's experts)
template <bool L2>
__device__ __forceinline__ void out_pick(const MoeArgs& a, int row, int k, int chunk, int lane, float* dst)
{
    const int chunks = a.H >> 7;
    const int slots = a.bsz * a.topk;
    const int col = chunk * 128 + lane * 4;
    const int slot = row * a.topk + k;
    const int e = expert_of(a.ids, a.ids64, slot);
    dst += lane * 4;
    if (e < 0 || e >= a.n_local)
    {
        dst[0] = 0; dst[1] = 0; dst[2] = 0; dst[3] = 0;
        return;
    }
    float v0 = 0, v1 = 0, v2 = 0, v3 = 0;
    for (int p = 0; p < a.parts_b; ++p)
    {
        const float4 t = load4<L2>(a.dd + ((size_t) p * slots + slot) * a.H + col);
        v0 += t.x; v1 += t.y; v2 += t.z; v3 += t.w;
    }
    if (a.nobias)
    {
        const int chunks_i = a.I >> 7;
        const float o = MUL1_O_F * sum_chunks(a.sums + (size_t) slots * 2 * chunks + (size_t) slot * chunks_i,
                                              chunks_i, lane);
        v0 = fmaf(v0, MUL1_S_F, o); v1 = fmaf(v1, MUL1_S_F, o);
        v2 = fmaf(v2, MUL1_S_F, o); v3 = fmaf(v3, MUL1_S_F, o);
    }
    had128(v0, v1, v2, v3, lane);
    const half* svh = (const half*) table(a, 2, 2, e) + col;
    const float rw = load_as_float(a.w, slot, a.w_dt);
    dst[0] = rw * v0 * __half2float(svh[0]); dst[1] = rw * v1 * __half2float(svh[1]);
    dst[2] = rw * v2 * __half2float(svh[2]); dst[3] = rw * v3 * __half2float(svh[3]);
}

// The picks of one output (row, 128-chunk) summed in pick order and stored in the output dtype (one warp)
__device__ __forceinline__ void out_store(const MoeArgs& a, int row, int chunk, int lane, const float (*part)[128])
{
    const int col = chunk * 128 + lane * 4;
    float o[4] = {0, 0, 0, 0};
    for (int j = 0; j < a.topk; ++j)
        for (int i = 0; i < 4; ++i) o[i] += part[j][lane * 4 + i];
    #pragma unroll
    for (int i = 0; i < 4; ++i) store_from_float(a.out, (int64_t) row * a.H + col + i, a.out_dt, o[i]);
}

// Block per (row, 128-chunk): warp k takes pick k into shared memory, warp 0 sums the picks in order and
// stores the chunk in the output dtype.
__global__ void __launch_bounds__(256) out_kernel(const MoeArgs a)
{
    __shared__ float part[OUT_MAX_TOPK][128];
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int k = threadIdx.x >> 5;
    const int chunks = a.H >> 7;
    const int chunk = blockIdx.x % chunks;
    const int row = blockIdx.x / chunks;
    if (k < a.topk) out_pick<false>(a, row, k, chunk, lane, part[k]);
    __syncthreads();
    if (k == 0) out_store(a, row, chunk, lane, part);
}

}  // namespace
