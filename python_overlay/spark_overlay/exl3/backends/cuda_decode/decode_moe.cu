// spark-kit's own EXL3 MoE decode kernels (1-8 token rows on CUDA cores, 1-64 with the tensor-core GEMVs of
// decode_mma.cuh; MUL1 codebook); the activation and output steps are in decode_steps.cuh, the conversions
// around exllamav3's decode kernel and the bench's cold-read floor in decode_glue.cuh, the helpers all
// share in decode_util.cuh (one translation unit). Plain CUDA, no torch headers: the launchers are
// extern "C", take raw device pointers and a stream, and return the launch's cudaError_t, so the
// overlay loads the library with ctypes (loader.py) and CUDA graphs capture the launches.
//
// One MoE layer call, slots = rows x top_k (row r, pick k; expert e = ids[r, k]):
//   rot_in   warp per (slot, 128-chunk, gate/up): xh = H128(x * suh) / sqrt(128), fp32 (tensor cores:
//            fp16, and with the bias folded each chunk's sum of those fp16 values)
//   gemv     block per (slot, projection, 32 output columns, k-part): W_hat decoded in registers
//            from the trellis (MUL1: state * 0x83DCD12D, byte sum by dp4a, one fp32 FMA to the
//            codebook's affine value), CUDA-core FMAs for every row that picked the expert. The
//            block of a slot whose expert an earlier slot also picked exits: the first one takes
//            all rows of that expert, so each expert's weights are decoded once per call.
//   mid      warp per (slot, 128-chunk): sum of k-parts, H128 * svh for gate and up,
//            silu(g) * u, * down suh, H128 -> down input
//   gemv     (down) as above on the down input
//   out      warp per (row, 128-chunk): per pick H128 * svh, * routing weight, summed in pick
//            order, written in the output dtype (f32 / f16 / bf16): no conversion kernels around
// With the tensor-core GEMVs rot_in, mid and out can each be folded into a GEMV (STAGE_FUSE_*,
// decode_mma.cuh): then a call is as few as two launches.
//
// Tile bitstream, element order and codebook: docs/exl3-overlay.md and the format notes
// (W = diag(suh) H W_hat H diag(svh); 16x16 tiles, tensor-core element order; MUL1).

#include "decode_util.cuh"
#include "decode_tile.cuh"

namespace {

constexpr float R_SCALE = 0.088388347648f;  // 1 / sqrt(128)
// fp32 bits of 2^23 + 1024: the dp4a byte sum b lands in the mantissa, value 2^23 + 1024 + b
constexpr uint32_t MUL1_BIAS_BITS = 0x4B000000u + 1024u;
// value = (1024 + b) * S + O (S = fp16 0x1EEE, O = fp16 0xC931) = f * S + (O - 2^23 * S), exact in fp32
constexpr float MUL1_S = 0.00676727294921875f;
constexpr float MUL1_C = -56778.3828125f;

__device__ __forceinline__ int expert_of(const void* ids, int ids64, int slot)
{
    return ids64 ? (int) ((const int64_t*) ids)[slot] : ((const int32_t*) ids)[slot];
}

// 128-point Sylvester Hadamard over a warp, 4 consecutive elements per lane, scaled by 1/sqrt(128). Each
// butterfly is one fma with the lane's sign, s * v + o (s = -1 in the upper half: o - v; else v + o): bit for bit
// the values of a select and an add (multiplying by +-1 is exact, so the fma rounds once, as the add does), one
// instruction less each.
__device__ __forceinline__ void had128(float& v0, float& v1, float& v2, float& v3, int lane)
{
    float a = v0 + v1, b = v0 - v1, c = v2 + v3, d = v2 - v3;
    v0 = a + c; v1 = b + d; v2 = a - c; v3 = b - d;
    #pragma unroll
    for (int m = 1; m < 32; m <<= 1)
    {
        const float o0 = __shfl_xor_sync(0xffffffffu, v0, m);
        const float o1 = __shfl_xor_sync(0xffffffffu, v1, m);
        const float o2 = __shfl_xor_sync(0xffffffffu, v2, m);
        const float o3 = __shfl_xor_sync(0xffffffffu, v3, m);
        const float s = (lane & m) ? -1.0f : 1.0f;
        v0 = __fmaf_rn(s, v0, o0);
        v1 = __fmaf_rn(s, v1, o1);
        v2 = __fmaf_rn(s, v2, o2);
        v3 = __fmaf_rn(s, v3, o3);
    }
    v0 *= R_SCALE; v1 *= R_SCALE; v2 *= R_SCALE; v3 *= R_SCALE;
}

struct MoeArgs
{
    const void* x; int x_dt;           // [bsz, H]
    const void* ids; int ids64;        // [bsz, topk] local expert ids (outside [0, n_local): skipped)
    const void* w; int w_dt;           // [bsz, topk] routing weights
    void* out; int out_dt;             // [bsz, H]
    int bsz, topk, H, I, n_local;
    const int64_t* tables;             // 9 x n_local pointers: g/u/d x trellis/suh/svh
    float* xh;                         // [slots, 2, H] (fp16 when x16)
    float* gu;                         // [parts_a, slots, 2, I]
    float* ah;                         // [slots, I] (fp16 when x16)
    float* dd;                         // [parts_b, slots, H]
    int parts_a, parts_b;
    int x16;                           // the tensor-core gemv: inputs xh and ah stored as fp16
    int nobias;                        // x16 gemv without the codebook's affine map: mid and out apply it
    float* sums;                       // nobias: [slots, 2, H/128] sums of xh's fp16 chunks, then [slots, I/128] of ah's
    // tensor cores, bias folded (decode_mma.cuh): fuse_in: each gate/up block builds its k-range of xh itself
    // (no rot_in launch) and applies the affine map to its k-part; fuse_mid: the last gate/up block of each
    // (run, 128-chunk) computes that chunk's activation (no mid launch); fuse_out: the last down block of each
    // (row, 128-chunk) computes that output chunk (no out launch). cnt: their self-resetting counters.
    int fuse_in, fuse_mid, fuse_out;
    int warps_a, warps_b;              // bias folded: warps per gate/up / down GEMV block (8, 4 or 2; decode_mma.cuh)
    int cap_a, cap_b;                  // tensor cores: at most this many gate/up / down GEMV blocks per SM (0: no cap)
    int npw_a, npw_b;                  // tensor cores, runs of 8: n-tiles per warp of gate/up / down (1, or 2: decode_mma.cuh)
    int* cnt;                          // [MMA_MAX_ROWS * OUT_MAX_TOPK * I/128] mid, then [MMA_MAX_ROWS * H/128] out
};

constexpr float MUL1_S_F = 0.00676727294921875f;  // fp16 0x1EEE
constexpr float MUL1_O_F = -10.3828125f;           // fp16 0xC931

// Sum over a warp of each lane's 4 values as the fp16 store rounds them (fixed order: graph == eager)
__device__ __forceinline__ float chunk_sum16(const float (&v)[4])
{
    float t = 0.0f;
    #pragma unroll
    for (int i = 0; i < 4; ++i) t += __half2float(__float2half_rn(v[i]));
    #pragma unroll
    for (int m = 16; m >= 1; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
    return t;
}

// Sum of n chunk sums over a warp (fixed order)
__device__ __forceinline__ float sum_chunks(const float* p, int n, int lane)
{
    float t = 0.0f;
    for (int c = lane; c < n; c += 32) t += p[c];
    #pragma unroll
    for (int m = 16; m >= 1; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
    return t;
}

__device__ __forceinline__ const void* table(const MoeArgs& a, int proj, int kind, int e)
{
    return (const void*) a.tables[(proj * 3 + kind) * a.n_local + e];
}

// A gemv block's item (slot, projection, n-group of `cols` columns, k-part; k-part fastest) and its shape
struct GemvItem
{
    int n_in, n_out, parts, part, group, proj_i, proj, slot, slots;
};

__device__ __forceinline__ GemvItem gemv_item_of(const MoeArgs& a, int down, int item, int cols)
{
    const int n_in = down ? a.I : a.H, n_out = down ? a.H : a.I;
    const int nproj = down ? 1 : 2;
    const int groups = n_out / cols;
    const int parts = down ? a.parts_b : a.parts_a;
    const int part = item % parts; item /= parts;
    const int group = item % groups; item /= groups;
    const int proj_i = item % nproj;
    return {n_in, n_out, parts, part, group, proj_i, down ? 2 : proj_i, item / nproj, a.bsz * a.topk};
}

// Stores 4 consecutive floats of a gemv input row (fp16 for the tensor-core gemv, else fp32)
__device__ __forceinline__ void store_in4(const MoeArgs& a, float* base, size_t i, const float (&v)[4])
{
    if (a.x16)
    {
        __half2* dst = (__half2*) ((half*) base + i);
        dst[0] = __floats2half2_rn(v[0], v[1]);
        dst[1] = __floats2half2_rn(v[2], v[3]);
    }
    else
    {
        *(float4*) (base + i) = make_float4(v[0], v[1], v[2], v[3]);
    }
}

__global__ void rot_in_kernel(const MoeArgs a)
{
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int chunks = a.H >> 7;
    const int slots = a.bsz * a.topk;
    if (item >= slots * chunks * 2) return;
    const int proj = item & 1;
    const int chunk = (item >> 1) % chunks;
    const int slot = (item >> 1) / chunks;
    const int e = expert_of(a.ids, a.ids64, slot);
    if (e < 0 || e >= a.n_local) return;
    const half* suh = (const half*) table(a, proj, 1, e);
    const int row = slot / a.topk;
    const int col = chunk * 128 + lane * 4;
    float v[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        v[i] = load_as_float(a.x, (int64_t) row * a.H + col + i, a.x_dt) * __half2float(suh[col + i]);
    had128(v[0], v[1], v[2], v[3], lane);
    store_in4(a, a.xh, ((size_t) slot * 2 + proj) * a.H + col, v);
    if (a.nobias)
    {
        const float t = chunk_sum16(v);
        if (lane == 0) a.sums[((size_t) slot * 2 + proj) * chunks + chunk] = t;
    }
}

// GEMV over one projection for every row that picked the item's expert.
// Block: 8 warps = 2 n-tiles (16 columns each) x 4 k-warps; item: (slot, proj, n-group, k-part).
template <int K, int NR, int U, int D, bool XS>
__device__ __forceinline__ void gemv_item(const MoeArgs& a, int down, int item)
{
    constexpr int WORDS = 8 * K;  // uint32 words per 16x16 tile
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const GemvItem it = gemv_item_of(a, down, item, 32);
    const int n_in = it.n_in, n_out = it.n_out, parts = it.parts, part = it.part, group = it.group;
    const int proj_i = it.proj_i, proj = it.proj, slot = it.slot, slots = it.slots;

    // Rows of this expert (the first slot that picked it takes them all)
    __shared__ int sh_slot[NR];
    __shared__ int sh_n;
    __shared__ float sh_red[4][NR][32];
    const int e = expert_of(a.ids, a.ids64, slot);
    if (e < 0 || e >= a.n_local) return;
    if (warp == 0)
    {
        int n = 0;
        bool first = true;
        for (int base = 0; base < slots; base += 32)
        {
            const int s = base + lane;
            const bool hit = s < slots && expert_of(a.ids, a.ids64, s) == e;
            const unsigned m = __ballot_sync(0xffffffffu, hit);
            if (m && base + __ffs(m) - 1 < slot && n == 0) first = false;
            if (hit)
            {
                const int rank = n + __popc(m & ((1u << lane) - 1));
                if (rank < NR) sh_slot[rank] = s;
            }
            n += __popc(m);
        }
        if (lane == 0) sh_n = first ? min(n, NR) : 0;
    }
    __syncthreads();
    const int nr = sh_n;
    if (nr == 0) return;

    const uint32_t* trellis = (const uint32_t*) table(a, proj, 0, e);
    const int ntiles_n = n_out >> 4;
    const int ktiles = n_in >> 4;
    const int ntile = group * 2 + (warp & 1);
    const int kw = warp >> 1;
    int kb, ke;
    warp_k_range(ktiles, parts, part, kw, 4, kb, ke);

    const TileBits bits = tile_bits<K>(lane);
    const int q = lane & 3;

    const float* xin[NR];
    #pragma unroll
    for (int r = 0; r < NR; ++r)
    {
        const int s = sh_slot[r < nr ? r : 0];
        xin[r] = down ? a.ah + (size_t) s * a.I : a.xh + ((size_t) s * 2 + proj_i) * a.H;
    }

    float acc0[NR], acc1[NR];
    #pragma unroll
    for (int r = 0; r < NR; ++r) { acc0[r] = 0.0f; acc1[r] = 0.0f; }

    // Each warp streams its k-tiles through a ring of D stages of U tiles in shared memory
    // (cp.async, 16-byte pieces, L1 bypassed): D - 1 stages of loads stay in flight without
    // holding registers, and the decode reads each tile's words from there.
    constexpr int PIECES = U * WORDS / 4;  // 16-byte pieces per stage
    __shared__ uint4 ring[8][D][PIECES];
    const size_t tile_stride = (size_t) ntiles_n * WORDS;
    const uint32_t* tp = trellis + (size_t) ntile * WORDS;
    const int batches = ke > kb ? (ke - kb + U - 1) / U : 0;
    // XS: the rows' input slices ride in the same ring (16 floats per tile and row), so the dot products
    // read shared memory instead of waiting on global loads; issued only after pdl_wait (the kernel
    // before writes them), as one extra commit group for the first D - 1 stages
    constexpr int XP = XS ? U * 4 * NR : 0;  // 16-byte x pieces per stage
    __shared__ float4 xring[XS ? 8 : 1][XS ? D : 1][XS ? U * 4 * NR : 1];
    auto issue_w = [&] (int batch)
    {
        if (batch < batches)
        {
            for (int i = lane; i < PIECES; i += 32)
            {
                const int t = kb + batch * U + i / (WORDS / 4);
                if (t < ke)
                {
                    const uint4* src = (const uint4*) (tp + (size_t) t * tile_stride) + i % (WORDS / 4);
                    const unsigned dst = (unsigned) __cvta_generic_to_shared(&ring[warp][batch % D][i]);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
                }
            }
        }
    };
    auto issue_x = [&] (int batch)
    {
        if (XS && batch < batches)
        {
            for (int i = lane; i < XP; i += 32)
            {
                const int r = i / (U * 4), u = (i / 4) % U, p = i % 4;
                const int t = kb + batch * U + u;
                if (t < ke && r < nr)
                {
                    const int s = sh_slot[r];
                    const float* row = down ? a.ah + (size_t) s * a.I : a.xh + ((size_t) s * 2 + proj_i) * a.H;
                    const float* src = row + t * 16 + p * 4;
                    const unsigned dst = (unsigned) __cvta_generic_to_shared(&xring[warp][batch % D][i]);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
                }
            }
        }
    };
    auto commit = [] () { asm volatile("cp.async.commit_group;\n" ::); };
    #pragma unroll
    for (int i = 0; i < D - 1; ++i)
    {
        issue_w(i);
        commit();
    }
    // Everything above reads only the routing ids and the weights; the inputs come from the kernel before
    pdl_wait();
    pdl_trigger();
    if (XS)
    {
        #pragma unroll
        for (int i = 0; i < D - 1; ++i) issue_x(i);
        commit();
    }
    for (int batch = 0; batch < batches; ++batch)
    {
        issue_w(batch + D - 1);
        issue_x(batch + D - 1);
        commit();
        // groups: D - 1 weight stages, (XS) the first stages' inputs, then one per batch
        if (XS && batch == 0) asm volatile("cp.async.wait_group 1;\n" ::);
        else asm volatile("cp.async.wait_group %0;\n" :: "n"(D - 1));
        __syncwarp();
        const uint32_t* stage = (const uint32_t*) ring[warp][batch % D];
        // A full stage runs its U tiles with no bound check (the compiler interleaves them); the last may be partial
        auto tile = [&] (int u)
        {
            const int kt = kb + batch * U + u;
            uint32_t m[8];
            mul1_products<K>(stage + u * WORDS, bits, m);
            float wv[8];
            #pragma unroll
            for (int j = 0; j < 8; ++j)
            {
                const uint32_t f = __dp4a(m[j], 0x01010101u, MUL1_BIAS_BITS);
                wv[j] = fmaf(__uint_as_float(f), MUL1_S, MUL1_C);
            }
            // element (r, c) of position j: r = 2q + (j & 1) + 8 * ((j >> 1) & 1), c = lane / 4 + 8 * (j >> 2)
            const int k0 = kt * 16 + 2 * q;
            #pragma unroll
            for (int r = 0; r < NR; ++r)
            {
                if (r >= nr) break;
                float2 xa, xb;
                if (XS)
                {
                    const float* xs = (const float*) xring[warp][batch % D] + (r * U + u) * 16 + 2 * q;
                    xa = *(const float2*) xs;
                    xb = *(const float2*) (xs + 8);
                }
                else
                {
                    xa = __ldg((const float2*) (xin[r] + k0));
                    xb = __ldg((const float2*) (xin[r] + k0 + 8));
                }
                acc0[r] = fmaf(wv[0], xa.x, acc0[r]);
                acc0[r] = fmaf(wv[1], xa.y, acc0[r]);
                acc0[r] = fmaf(wv[2], xb.x, acc0[r]);
                acc0[r] = fmaf(wv[3], xb.y, acc0[r]);
                acc1[r] = fmaf(wv[4], xa.x, acc1[r]);
                acc1[r] = fmaf(wv[5], xa.y, acc1[r]);
                acc1[r] = fmaf(wv[6], xb.x, acc1[r]);
                acc1[r] = fmaf(wv[7], xb.y, acc1[r]);
            }
        };
        run_tiles<U>(ke - (kb + batch * U), tile);
        __syncwarp();
    }
    asm volatile("cp.async.wait_all;\n" ::);
    // Reduce over the 4 lanes of a column (q), then over the 4 k-warps in a fixed order
    #pragma unroll
    for (int r = 0; r < NR; ++r)
    {
        acc0[r] += __shfl_xor_sync(0xffffffffu, acc0[r], 1);
        acc0[r] += __shfl_xor_sync(0xffffffffu, acc0[r], 2);
        acc1[r] += __shfl_xor_sync(0xffffffffu, acc1[r], 1);
        acc1[r] += __shfl_xor_sync(0xffffffffu, acc1[r], 2);
        if (q == 0)
        {
            const int c = (warp & 1) * 16 + (lane >> 2);
            sh_red[kw][r][c] = acc0[r];
            sh_red[kw][r][c + 8] = acc1[r];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nr * 32; i += blockDim.x)
    {
        const int r = i >> 5, c = i & 31;
        const float v = sh_red[0][r][c] + sh_red[1][r][c] + sh_red[2][r][c] + sh_red[3][r][c];
        const int s = sh_slot[r];
        const int col = group * 32 + c;
        if (down) a.dd[((size_t) part * slots + s) * a.H + col] = v;
        else a.gu[(((size_t) part * slots + s) * 2 + proj_i) * a.I + col] = v;
    }
}

// One block per item. (A persistent grid looping over items, tried to avoid the partial last
// wave, ran gate/up 18 % slower on the H200: 64 instead of 48 registers, 4 blocks per SM instead of 5.)
template <int K, int NR, int U, int D, int MINB, bool XS = false>
__global__ void __launch_bounds__(256, MINB) gemv_kernel(const MoeArgs a, int down)
{
    gemv_item<K, NR, U, D, XS>(a, down, blockIdx.x);
}

}  // namespace

#include "decode_steps.cuh"

namespace {

constexpr int STAGE_PDL = 32;   // spark_decode_moe's stages: launch with programmatic dependent launch
constexpr int STAGE_OCC6 = 64;  // gemv kernels built for 6 blocks per SM (fewer registers)
constexpr int STAGE_XS = 128;   // gemv kernels stage the inputs through shared memory (1-2 rows)
constexpr int STAGE_MMA = 256;  // the tensor-core gemv (decode_mma.cuh), runs of 8 rows; fp16 inputs; 1..64 rows
constexpr int STAGE_RUN16 = 512;  // with STAGE_MMA: runs of 16 rows (two MMAs per tile)
constexpr int STAGE_NOBIAS = 1024;  // with STAGE_MMA (runs of 8): the codebook's affine map after the sums
constexpr int STAGE_OCC5 = 2048;  // with STAGE_MMA: gemv built for 5 blocks per SM (STAGE_OCC6: 6; else 4)
constexpr int STAGE_KW2_A = 4096;  // with STAGE_NOBIAS: gate/up blocks of 4 n-tiles x 2 k-warps
constexpr int STAGE_KW2_B = 8192;  // with STAGE_NOBIAS: down blocks of 4 n-tiles x 2 k-warps
constexpr int STAGE_FUSE_IN = 16384;   // with STAGE_NOBIAS, <= FI_ROWS rows: no rot_in launch (MoeArgs.fuse_in)
constexpr int STAGE_FUSE_MID = 32768;  // with STAGE_NOBIAS and counters: no mid launch (MoeArgs.fuse_mid)
constexpr int STAGE_FUSE_OUT = 65536;  // with STAGE_NOBIAS and counters: no out launch (MoeArgs.fuse_out)
constexpr int STAGE_W4_A = 131072;     // with STAGE_NOBIAS: gate/up blocks of 4 warps (MoeArgs.warps_a)
constexpr int STAGE_W4_B = 262144;     // with STAGE_NOBIAS, without STAGE_FUSE_OUT: down blocks of 4 warps
constexpr int STAGE_W2_A = 524288;     // as STAGE_W4_A with blocks of 2 warps
constexpr int STAGE_W2_B = 1048576;    // as STAGE_W4_B with blocks of 2 warps
constexpr int STAGE_CAP_A = 21;        // with STAGE_MMA: bits 21-25 of stages, MoeArgs.cap_a; bits 26-30, cap_b
constexpr int STAGE_CAP_B = 26;
constexpr long long STAGE_NPW2_A = 1LL << 31;  // with STAGE_NOBIAS: gate/up warps of 2 n-tiles (MoeArgs.npw_a)
constexpr long long STAGE_NPW2_B = 1LL << 32;  // with STAGE_NOBIAS: down warps of 2 n-tiles (MoeArgs.npw_b)
constexpr int MMA_MAX_ROWS = 64;

template <int K, int NR, int MINB>
cudaError_t launch_gemv_b(int items, const MoeArgs& a, int down, int unroll, int pdl, int xs, cudaStream_t stream)
{
    // unroll: 2 -> stages of 2 tiles, 4 deep; 4 -> 4 tiles, 4 deep; 8 -> 4 tiles, 8 deep; 16 -> 8 tiles, 4 deep
    // (the deeper rings only for K <= 5: 48 KiB of static shared memory). xs (1-2 rows): inputs staged
    // through the ring too, 4 tiles 4 deep.
    if constexpr (NR <= 2)
    {
        if (xs) return launch(gemv_kernel<K, NR, 4, 4, MINB, true>, items, 256, stream, pdl, a, down);
    }
    if constexpr (K <= 5)
    {
        if (unroll >= 16) return launch(gemv_kernel<K, NR, 8, 4, MINB>, items, 256, stream, pdl, a, down);
        if (unroll >= 8) return launch(gemv_kernel<K, NR, 4, 8, MINB>, items, 256, stream, pdl, a, down);
    }
    if (unroll >= 4) return launch(gemv_kernel<K, NR, 4, 4, MINB>, items, 256, stream, pdl, a, down);
    return launch(gemv_kernel<K, NR, 2, 4, MINB>, items, 256, stream, pdl, a, down);
}

template <int K, int NR>
cudaError_t launch_gemv(const MoeArgs& a, int down, int unroll, int pdl, int occ6, int xs, cudaStream_t stream)
{
    const int slots = a.bsz * a.topk;
    const int nproj = down ? 1 : 2;
    const int groups = (down ? a.H : a.I) >> 5;
    const int parts = down ? a.parts_b : a.parts_a;
    const int items = slots * nproj * groups * parts;
    // Register budget from the blocks per SM asked of the compiler: 5 (48 registers) at 1-2 rows, 4 (64) at
    // 3-4, 3 (80) at 5-8; occ6 caps 1-2 rows at 6 blocks (40 registers, a few bytes of spill)
    constexpr int MINB = NR <= 2 ? 5 : NR <= 4 ? 4 : 3;
    if constexpr (NR <= 2)
    {
        if (occ6) return launch_gemv_b<K, NR, 6>(items, a, down, unroll, pdl, xs, stream);
    }
    return launch_gemv_b<K, NR, MINB>(items, a, down, unroll, pdl, xs, stream);
}

template <int K>
cudaError_t launch_gemv_k(const MoeArgs& a, int down, int nr, int unroll, int pdl, int occ6, int xs,
                          cudaStream_t stream)
{
    if (nr <= 1) return launch_gemv<K, 1>(a, down, unroll, pdl, occ6, xs, stream);
    if (nr <= 2) return launch_gemv<K, 2>(a, down, unroll, pdl, occ6, xs, stream);
    if (nr <= 4) return launch_gemv<K, 4>(a, down, unroll, pdl, occ6, xs, stream);
    return launch_gemv<K, 8>(a, down, unroll, pdl, occ6, xs, stream);
}

cudaError_t launch_gemv_any(const MoeArgs& a, int k, int down, int nr, int unroll, int pdl, int occ6, int xs,
                            cudaStream_t stream)
{
    switch (k)
    {
        case 2: return launch_gemv_k<2>(a, down, nr, unroll, pdl, occ6, xs, stream);
        case 3: return launch_gemv_k<3>(a, down, nr, unroll, pdl, occ6, xs, stream);
        case 4: return launch_gemv_k<4>(a, down, nr, unroll, pdl, occ6, xs, stream);
        case 5: return launch_gemv_k<5>(a, down, nr, unroll, pdl, occ6, xs, stream);
        case 6: return launch_gemv_k<6>(a, down, nr, unroll, pdl, occ6, xs, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

#include "decode_mma.cuh"

extern "C" {

// Supported bits per weight of the own kernel (MUL1 only); the overlay falls back to exllamav3's
// decode kernel for anything else.
int spark_decode_supports(int k) { return k >= 2 && k <= 6; }

// One MoE layer call, 1..8 rows (bsz * topk <= 64; 1..64 rows with STAGE_MMA). Scratch sizes: xh slots*2*H,
// gu parts_a*slots*2*I, ah slots*I, dd parts_b*slots*H floats. unroll: k-tiles streamed per warp (2, 4, 8, 16: see launch_gemv_b); stages: bit mask
// of the five launches to run (31 = all; fewer only to time them one by one), plus STAGE_PDL (32): launch
// them with programmatic dependent launch, STAGE_OCC6 (64): the gemv variant capped for 6 blocks per SM,
// STAGE_XS (128): the gemv variant that stages its inputs through shared memory, STAGE_MMA (256): the
// tensor-core gemv (fp16 inputs, runs of 8 rows; + STAGE_RUN16: runs of 16), STAGE_FUSE_*: the small launches
// folded into the GEMVs (cnt: MMA_MAX_ROWS * (OUT_MAX_TOPK * I/128 + H/128) zeroed ints, left zeroed). Returns a cudaError_t.
int spark_decode_moe(const void* x, int x_dt, const void* ids, int ids64, const void* w, int w_dt, void* out,
                     int out_dt, int bsz, int topk, int H, int I, int n_local, const int64_t* tables, int k,
                     float* xh, float* gu, float* ah, float* dd, int parts_a, int parts_b, int unroll, long long stages,
                     int* cnt, cudaStream_t stream)
{
    const int mma = (stages & STAGE_MMA) != 0;
    if (bsz < 1 || bsz > (mma ? MMA_MAX_ROWS : 8) || topk < 1 || topk > OUT_MAX_TOPK || H % 128 || I % 128 || !spark_decode_supports(k))
        return (int) cudaErrorInvalidValue;
    if (parts_a < 1 || parts_b < 1) return (int) cudaErrorInvalidValue;
    MoeArgs a;
    a.x = x; a.x_dt = x_dt; a.ids = ids; a.ids64 = ids64; a.w = w; a.w_dt = w_dt; a.out = out; a.out_dt = out_dt;
    a.bsz = bsz; a.topk = topk; a.H = H; a.I = I; a.n_local = n_local; a.tables = tables;
    a.xh = xh; a.gu = gu; a.ah = ah; a.dd = dd; a.parts_a = parts_a; a.parts_b = parts_b;
    a.x16 = mma;
    const int nt = (stages & STAGE_RUN16) ? 2 : 1;
    a.nobias = mma && nt == 1 && (stages & STAGE_NOBIAS) != 0;
    // x16: the fp16 inputs fill the first half of xh; the chunk sums go in its second half
    a.sums = xh + (size_t) bsz * topk * H;
    const long long fused = a.nobias ? stages : 0;
    a.fuse_in = (fused & STAGE_FUSE_IN) != 0;
    a.fuse_mid = (fused & STAGE_FUSE_MID) != 0;
    a.fuse_out = (fused & STAGE_FUSE_OUT) != 0;
    a.cnt = cnt;
    a.warps_a = (fused & STAGE_W2_A) ? 2 : (fused & STAGE_W4_A) ? 4 : 8;
    a.warps_b = (fused & STAGE_W2_B) ? 2 : (fused & STAGE_W4_B) ? 4 : 8;
    if (a.warps_b < 8 && a.fuse_out) return (int) cudaErrorInvalidValue;  // the output step wants a warp per pick
    a.cap_a = mma ? (int) (stages >> STAGE_CAP_A) & 31 : 0;
    a.cap_b = mma ? (int) (stages >> STAGE_CAP_B) & 31 : 0;
    a.npw_a = (fused & STAGE_NPW2_A) ? 2 : 1;
    a.npw_b = (fused & STAGE_NPW2_B) ? 2 : 1;
    if ((a.fuse_mid || a.fuse_out) && cnt == nullptr) return (int) cudaErrorInvalidValue;
    // fuse_in: a gate/up k-part is whole 128-chunks and fits the block's input buffer
    if (a.fuse_in && (bsz > FI_ROWS || H % (128 * parts_a) || H / parts_a > FI_MAX_K)) return (int) cudaErrorInvalidValue;
    const int blocks = (stages & STAGE_OCC6) ? 6 : (stages & STAGE_OCC5) ? 5 : 4;
    const int slots = bsz * topk;
    const int pdl = (stages & STAGE_PDL) != 0;
    const int occ6 = (stages & STAGE_OCC6) != 0;
    const int xs = (stages & STAGE_XS) != 0;
    const int warps_in = slots * (H / 128) * 2;
    cudaError_t err = cudaSuccess;
    if ((stages & 1) && !a.fuse_in) err = launch(rot_in_kernel, (warps_in + 7) / 8, 256, stream, pdl, a);
    if (err != cudaSuccess) return (int) err;
    if (stages & 2)
        err = mma ? launch_gemv_mma_any(a, k, 0, nt, blocks, (stages & STAGE_KW2_A) != 0, pdl, stream)
                  : launch_gemv_any(a, k, 0, bsz, unroll, pdl, occ6, xs, stream);
    if (err != cudaSuccess) return (int) err;
    const int warps_mid = slots * (I / 128);
    if ((stages & 4) && !a.fuse_mid) err = launch(mid_kernel, (warps_mid + 7) / 8, 256, stream, pdl, a);
    if (err != cudaSuccess) return (int) err;
    if (stages & 8)
        err = mma ? launch_gemv_mma_any(a, k, 1, nt, blocks, (stages & STAGE_KW2_B) != 0, pdl, stream)
                  : launch_gemv_any(a, k, 1, bsz, unroll, pdl, occ6, xs, stream);
    if (err != cudaSuccess) return (int) err;
    if ((stages & 16) && !a.fuse_out) err = launch(out_kernel, bsz * (H / 128), 32 * topk, stream, pdl, a);
    return (int) err;
}

}  // extern "C"

#include "decode_glue.cuh"
#include "decode_linear.cuh"
