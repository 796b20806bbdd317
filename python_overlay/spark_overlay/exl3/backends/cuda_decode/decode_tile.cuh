// One lane's part of a 16x16 MUL1 weight tile, shared by both GEMVs of the own decode kernel (the
// CUDA-core one in decode_moe.cu, the tensor-core one in decode_mma.cuh): where its bits sit, the 8
// states' products with the MUL1 multiplier (each GEMV turns those into values its own way), and the
// k-tiles of one warp.

#pragma once

#include <stdint.h>

namespace {

constexpr uint32_t MUL1_MULT = 0x83DCD12Du;

// The lane's bits of a tile: positions 8*lane .. 8*lane+7 of a K-bit stream, 16-bit windows from bit
// base (the stream wraps), read from words w0, w1, w2 shifted by off
struct TileBits
{
    int w0, w1, w2, off;
};

template <int K>
__device__ __forceinline__ TileBits tile_bits(int lane)
{
    constexpr int WORDS = 8 * K;
    constexpr int R = 256 * K;
    const int base = ((8 * K * lane + K - 16) % R + R) % R;
    const int w0 = base >> 5;
    return {w0, (w0 + 1) % WORDS, (w0 + 2) % WORDS, base & 31};
}

// m[j] = state_j * MUL1_MULT for the lane's 8 positions of the tile at tw (its byte sum is the weight)
template <int K>
__device__ __forceinline__ void mul1_products(const uint32_t* tw, const TileBits& b, uint32_t (&m)[8])
{
    const uint32_t wa = tw[b.w0], wb = tw[b.w1], wc = tw[b.w2];
    const uint32_t h0 = __funnelshift_l(wb, wa, b.off);
    const uint32_t h1 = __funnelshift_l(wc, wb, b.off);
    #pragma unroll
    for (int j = 0; j < 8; ++j)
    {
        const int sh = j * K;
        uint32_t st;
        if (sh == 0) st = h0 >> 16;
        else if (sh < 32) st = __funnelshift_l(h1, h0, sh) >> 16;
        else st = (h1 << (sh - 32)) >> 16;
        m[j] = st * MUL1_MULT;
    }
}

// The k-tiles [kb, ke) of k-warp kw of kws in k-part `part` of `parts` over ktiles
__device__ __forceinline__ void warp_k_range(int ktiles, int parts, int part, int kw, int kws, int& kb, int& ke)
{
    const int per_part = (ktiles + parts - 1) / parts;
    const int k_lo = part * per_part;
    const int k_hi = min(ktiles, k_lo + per_part);
    const int per_warp = (k_hi - k_lo + kws - 1) / kws;
    kb = k_lo + kw * per_warp;
    ke = min(k_hi, kb + per_warp);
}

// A warp's U tiles of one ring stage: a full stage unrolled with no bound check (the compiler interleaves
// the tiles), the last one partial
template <int U, typename Tile>
__device__ __forceinline__ void run_tiles(int valid, Tile&& tile)
{
    if (valid >= U)
    {
        #pragma unroll
        for (int u = 0; u < U; ++u) tile(u);
    }
    else
    {
        for (int u = 0; u < valid; ++u) tile(u);
    }
}

}  // namespace
