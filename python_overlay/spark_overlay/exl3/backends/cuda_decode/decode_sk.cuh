// The own MoE decode kernel's gate/up GEMV at 1 row, split evenly over every warp the GPU holds at once
// (included by decode_moe.cu after decode_mma.cuh). At 1 row the block-per-(column group, k-part) GEMV
// leaves the SMs unevenly loaded (432 or 864 blocks over 4 x 132 block slots), so here each warp takes an
// equal run of the flattened (slot, projection, n-tile, k-tile) space (a.sk_w tiles): its columns (n-tiles),
// each finished into its own 16 partial sums P[warp][segment], which the
// activation launch sums per column over the warps that cover it, in warp order (graph replay == eager).
// Same tile decode and tensor-core MMA as decode_mma.cuh; bias folded (the activation applies the affine map).

#pragma once

#include "decode_mma.cuh"

namespace {

// Warp w covers flattened tiles [w * sk_w, min((w + 1) * sk_w, total)); a column is (slot * 2 + proj) * n-tiles
// + n-tile with H / 16 k-tiles. P: [warps, a.sk_segs, 16] floats in a.gu.
template <int K, int D>
__global__ void __launch_bounds__(256, 4) gemv_sk_kernel(const MoeArgs a)
{
    constexpr int WORDS = 8 * K;
    constexpr int U = 8;
    constexpr int PPT = WORDS / 4;
    constexpr int PIECES = U * PPT;
    constexpr int PPL = (PIECES + 31) / 32;
    __shared__ uint4 ring[8][D][PIECES];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * 8 + warp;
    const int kt_col = a.H >> 4;       // k-tiles per column
    const int ntiles_n = a.I >> 4;
    const int total = a.topk * 2 * ntiles_n * kt_col;
    const int start = gw * a.sk_w;
    const int end = min(start + a.sk_w, total);
    const TileBits bits = tile_bits<K>(lane);
    const int q = lane & 3, g = lane >> 2;
    const size_t tile_stride = (size_t) ntiles_n * WORDS;
    const unsigned ring_base = (unsigned) __cvta_generic_to_shared(&ring[warp][0][lane]);
    bool waited = false;
    for (int t0 = start; t0 < end;)
    {
        const int col = t0 / kt_col;
        const int kb = t0 - col * kt_col;
        const int ke = min(end - col * kt_col, kt_col);
        const int seg = col - start / kt_col;
        t0 = col * kt_col + ke;
        const int nt = col % ntiles_n;
        const int proj = (col / ntiles_n) & 1;
        const int slot = col / ntiles_n / 2;
        const int e = expert_of(a.ids, a.ids64, slot);
        if (e < 0 || e >= a.n_local) continue;
        const uint32_t* tp = (const uint32_t*) table(a, proj, 0, e) + (size_t) nt * WORDS + (size_t) kb * tile_stride;
        const half* xrow = (const half*) a.xh + ((size_t) slot * 2 + proj) * a.H + 2 * q;
        const int ntile_k = ke - kb;
        const int batches = (ntile_k + U - 1) / U;
        int p_left[PPL];
        const uint32_t* p_src[PPL];
        #pragma unroll
        for (int c = 0; c < PPL; ++c)
        {
            const int i = lane + 32 * c;
            p_left[c] = i < PIECES ? ntile_k - i / PPT : 0;
            p_src[c] = tp + (size_t) (i / PPT) * tile_stride + (i % PPT) * 4;
        }
        const size_t batch_stride = (size_t) U * tile_stride;
        int next = 0;
        auto issue = [&] ()
        {
            const unsigned dst = ring_base + (unsigned) ((next % D) * PIECES * 16);
            const int tt = next * U;
            #pragma unroll
            for (int c = 0; c < PPL; ++c)
            {
                if (tt < p_left[c])
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst + c * 512), "l"(p_src[c]));
                p_src[c] += batch_stride;
            }
            ++next;
        };
        auto commit = [] () { asm volatile("cp.async.commit_group;\n" ::); };
        #pragma unroll
        for (int i = 0; i < D - 1; ++i)
        {
            issue();
            commit();
        }
        if (!waited)  // the inputs come from the launch before
        {
            pdl_wait();
            pdl_trigger();
            waited = true;
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int batch = 0; batch < batches; ++batch)
        {
            issue();
            commit();
            asm volatile("cp.async.wait_group %0;\n" :: "n"(D - 1));
            __syncwarp();
            const uint32_t* stage = (const uint32_t*) ring[warp][batch % D];
            auto tile = [&] (int u)
            {
                const int kt = kb + batch * U + u;
                uint32_t f[8];
                mul1_products<K>(stage + u * WORDS, bits, f);
                #pragma unroll
                for (int j = 0; j < 8; ++j) f[j] = __dp4a(f[j], 0x01010101u, MUL1_H16_BIAS);
                uint32_t af[4];
                af[0] = __byte_perm(f[0], f[1], 0x5410);
                af[1] = __byte_perm(f[4], f[5], 0x5410);
                af[2] = __byte_perm(f[2], f[3], 0x5410);
                af[3] = __byte_perm(f[6], f[7], 0x5410);
                const uint32_t b0 = __ldg((const unsigned int*) (xrow + kt * 16));
                const uint32_t b1 = __ldg((const unsigned int*) (xrow + kt * 16 + 8));
                mma16816(acc, af, b0, b1);
            };
            run_tiles<U>(ntile_k - batch * U, tile);
            __syncwarp();
        }
        asm volatile("cp.async.wait_all;\n" ::);
        __syncwarp();
        // C fragment row 0 (q == 0): columns g and g + 8 of this n-tile
        if (q == 0)
        {
            float* p = a.gu + ((size_t) gw * a.sk_segs + seg) * 16;
            p[g] = acc[0];
            p[g + 8] = acc[2];
        }
    }
    if (!waited)
    {
        pdl_wait();
        pdl_trigger();
    }
}

// a.sk_w and a.sk_segs (the activation launch reads them too) and the grid: about one wave of 4 blocks per SM
cudaError_t sk_shape(MoeArgs& a, int& grid)
{
    static int sms = 0;
    if (sms == 0)
    {
        int dev = 0;
        cudaError_t err = cudaGetDevice(&dev);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (err != cudaSuccess) return err;
    }
    const int warps = sms * 4 * 8;
    const int total = a.topk * 2 * (a.I >> 4) * (a.H >> 4);
    a.sk_w = (total + warps - 1) / warps;
    a.sk_segs = a.sk_w / (a.H >> 4) + 2;
    grid = (total + a.sk_w * 8 - 1) / (a.sk_w * 8);
    return cudaSuccess;
}

template <int K>
cudaError_t launch_sk_k(const MoeArgs& a, int grid, int pdl, cudaStream_t stream)
{
    if constexpr (K <= 4)
    {
        prefer_shared<gemv_sk_kernel<K, 4>>();
        return launch(gemv_sk_kernel<K, 4>, grid, 256, stream, pdl, a);
    }
    else
    {
        prefer_shared<gemv_sk_kernel<K, 3>>();
        return launch(gemv_sk_kernel<K, 3>, grid, 256, stream, pdl, a);
    }
}

cudaError_t launch_sk(const MoeArgs& a, int k, int grid, int pdl, cudaStream_t stream)
{
    switch (k)
    {
        case 2: return launch_sk_k<2>(a, grid, pdl, stream);
        case 3: return launch_sk_k<3>(a, grid, pdl, stream);
        case 4: return launch_sk_k<4>(a, grid, pdl, stream);
        case 5: return launch_sk_k<5>(a, grid, pdl, stream);
        case 6: return launch_sk_k<6>(a, grid, pdl, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace
