// The tensor-core GEMV of the own MoE decode kernel (included by decode_moe.cu after MoeArgs): each
// 16x16 weight tile is decoded once per warp straight into the A fragment of one
// mma.sync.m16n8k16 (W^T: 16 output columns x 16 k) and multiplied with up to 8 token rows of fp16
// inputs per MMA (the B fragment), so the per-weight cost no longer grows with the rows.
//
// MUL1 decode per weight: the 16-bit state (funnel shift, shift), one integer multiply, one dp4a
// byte sum b whose bias 0x6400 makes the fp16 bits of 1024 + b (exact: b <= 1020); two of those
// packed into a half2 (byte permute) and one fp16x2 FMA (1024 + b) * S + O per pair, the codebook's
// value rounded once to fp16 (the reference table's value exactly). NB (no bias): the MMA takes the
// exact 1024 + b itself and the next launch applies the codebook's affine map to the sums,
// y = S * sum_k x_k (1024 + b_k) + O * sum_k x_k, with sum_k x_k from the same fp16 inputs (the
// launch that wrote them also wrote their 128-chunk sums): one instruction less per two weights and
// the weights exact before the fp32 sums instead of rounded to fp16. Fragment layout: the lane's
// tile position j holds k = 2q + (j & 1) + 8 ((j >> 1) & 1), n = g + 8 (j >> 2) (q = lane % 4,
// g = lane / 4), so A = {j0 j1}, {j4 j5}, {j2 j3}, {j6 j7}; B = x[row g][k 2q, 2q+1], [2q+8, 2q+9];
// C = y[n g, g+8][rows 2q, 2q+1].
//
// Fusions of the small launches (MoeArgs.fuse_*): fuse_in, each gate/up block builds its k-range of
// x * suh * H itself (1-2 rows) and applies the affine map to its k-part; fuse_mid / fuse_out, the last
// block of each 128-chunk (self-resetting counters) runs the activation / output step (decode_steps.cuh).

#pragma once

#include "decode_tile.cuh"
#include "decode_timeline.cuh"
#include "decode_util.cuh"

namespace {

constexpr uint32_t MUL1_H16_BIAS = 0x6400u;             // fp16 1024.0: 0x6400 + b = fp16(1024 + b)
constexpr uint32_t MUL1_S_H2 = 0x1EEE1EEEu;              // fp16x2 S
constexpr uint32_t MUL1_O_H2 = 0xC931C931u;              // fp16x2 O
constexpr int FI_ROWS = 2;                               // fuse_in: rows per call (the block's input buffer)
constexpr int FI_MAX_K = 2560;                           // fuse_in: inputs per k-part (the block's input buffer)
constexpr int FI_STRIDE = FI_MAX_K + 8;                  // its row stride in halves (rows on different banks)
constexpr int FI_BATCH = 3;                              // fuse_in: chunks a warp loads before it transforms them
constexpr int XC_ROWS = 4;                               // FI_COPY: rows per run (the block's input buffer)
constexpr int XC_MAX_K = 1280;                           // FI_COPY: inputs per k-part

// The B operand of the tensor-core GEMV (its template parameter FI): FI_GLOBAL, each tile's fragment loaded from
// the fp16 inputs in global memory; FI_FUSED (fuse_in, gate/up, <= FI_ROWS rows), the block builds x * suh * H of
// its k-range in shared memory; FI_COPY (down, one run of 8 rows), the block copies its k-range of the fp16 inputs
// into shared memory (<= XC_ROWS rows): one 8-byte shared load per tile instead of two global loads and their
// addresses.
constexpr int FI_GLOBAL = 0, FI_FUSED = 1, FI_COPY = 2;

// fuse_in: item i of a block's input build -> (row r, 128-chunk c) of nch chunks per row. At most FI_ROWS = 2
// rows (the launcher refuses more), so a compare instead of the integer division and remainder (~20 instructions
// each on the CUDA cores; docs/performance.md, "The 1-row gate/up kernel read instruction by instruction").
__device__ __forceinline__ void fi_row_chunk(int i, int nch, int& r, int& c)
{
    static_assert(FI_ROWS == 2, "fi_row_chunk: one compare covers two rows");
    r = i >= nch;
    c = r ? i - nch : i;
}

__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fuse_out: a row with no pick among this rank's experts gets zeros from its first down block of each
// column group (no down block counts it)
__device__ __forceinline__ void fused_out_empty_row(const MoeArgs& a, int row, int col0, int cols)
{
    for (int k = 0; k < a.topk; ++k)
    {
        const int e = expert_of(a.ids, a.ids64, row * a.topk + k);
        if (e >= 0 && e < a.n_local) return;
    }
    pdl_wait();  // the output may still be read by the kernel before
    for (int c = threadIdx.x; c < cols; c += blockDim.x) store_from_float(a.out, (int64_t) row * a.H + col0 + c, a.out_dt, 0.0f);
}

// fuse_mid / fuse_out, after a block stored its run's outputs for columns [col0, col0 + cols): it counts
// itself done for its 128-chunk (gate/up: per run, down: per row of the run); the block that completes a
// count resets it and computes that chunk's activation (warp r: row r of the run) or output (warp k: pick k,
// then warp 0 sums the picks in order). Every block of a chunk stores before it counts, so the last one
// reads all of them (through L2); the order of every sum is fixed, so graph replay stays equal to eager.
__device__ __forceinline__ void fused_tail(const MoeArgs& a, int down, int slot, int col0, int cols, int nr,
                                        const int* sh_slot, int* sh_last, float (*part)[128])
{
    const int chunk = col0 >> 7;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __threadfence();
    __syncthreads();
    if (!down)
    {
        if (threadIdx.x == 0)
        {
            int* c = a.cnt + (size_t) slot * (a.I >> 7) + chunk;
            const int expected = (128 / cols) * 2 * a.parts_a;
            const bool last = atomicAdd(c, 1) == expected - 1;
            if (last) *c = 0;
            sh_last[0] = last;
        }
        __syncthreads();
        if (!sh_last[0]) return;
        __threadfence();
        for (int r = warp; r < nr; r += blockDim.x >> 5) mid_chunk<true>(a, sh_slot[r], chunk, lane);
        return;
    }
    int* cnt_out = a.cnt + (size_t) MMA_MAX_ROWS * OUT_MAX_TOPK * (a.I >> 7);
    if (threadIdx.x < nr)
    {
        const int row = sh_slot[threadIdx.x] / a.topk;
        int valid = 0;
        for (int k = 0; k < a.topk; ++k)
        {
            const int e = expert_of(a.ids, a.ids64, row * a.topk + k);
            valid += e >= 0 && e < a.n_local;
        }
        int* c = cnt_out + (size_t) row * (a.H >> 7) + chunk;
        const bool last = atomicAdd(c, 1) == valid * (128 / cols) * a.parts_b - 1;
        if (last) *c = 0;
        sh_last[threadIdx.x] = last;
    }
    __syncthreads();
    __threadfence();
    for (int r = 0; r < nr; ++r)
    {
        if (!sh_last[r]) continue;  // the same for every thread of the block
        const int row = sh_slot[r] / a.topk;
        if (warp < a.topk) out_pick<true>(a, row, warp, chunk, lane, part[warp]);
        __syncthreads();
        if (warp == 0) out_store(a, row, chunk, lane, part);
        __syncthreads();
    }
}

// One 16x16 tile's A fragment (W^T, decode_mma.cuh's head): 8 MUL1 products, byte sums biased to fp16 1024 + b,
// packed in pairs; with the bias (!NB) the codebook's affine map per pair
template <int K, bool NB>
__device__ __forceinline__ void decode_a(const uint32_t* tw, const TileBits& bits, uint32_t (&af)[4])
{
    uint32_t f[8];
    mul1_products<K>(tw, bits, f);
    #pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = __dp4a(f[j], 0x01010101u, MUL1_H16_BIAS);
    af[0] = __byte_perm(f[0], f[1], 0x5410);
    af[1] = __byte_perm(f[4], f[5], 0x5410);
    af[2] = __byte_perm(f[2], f[3], 0x5410);
    af[3] = __byte_perm(f[6], f[7], 0x5410);
    if (!NB)
    {
        #pragma unroll
        for (int i = 0; i < 4; ++i) af[i] = hfma2_bits(af[i], MUL1_S_H2, MUL1_O_H2);
    }
}

// GEMV over one projection for a run of up to 8 * NT rows that picked the item's expert (fp16 inputs).
// Block: WARPS warps = WARPS / KW warps along n (NPW n-tiles of 16 columns each) x KW k-warps; item: (slot, proj,
// n-group, k-part). NPW 2 (runs of 8): a warp's two n-tiles are neighbours, so each k-step's 2 tiles are one
// contiguous piece of the trellis and share one B fragment; the block has twice the columns, and its input build
// (FI_FUSED) or copy (FI_COPY) serves twice the weights. The expert's slots are taken in runs of 8 * NT in slot
// order: the block of the slot that starts a run takes the run, every other block of that expert exits, so each
// weight is decoded once per run.
template <int K, int NT, int U, int D, bool NB, int KW, int FI = FI_GLOBAL, int WARPS = 8, int NPW = 1>
__device__ __forceinline__ void gemv_mma_item(const MoeArgs& a, int down, int item)
{
    static_assert(NPW == 1 || NT == 1, "two n-tiles per warp only in runs of 8 rows");
    constexpr int WORDS = 8 * K;  // uint32 words per 16x16 tile
    constexpr int RUN = 8 * NT;
    constexpr int NWN = WARPS / KW;   // warps along n
    constexpr int NTB = NWN * NPW;    // n-tiles per block
    constexpr int COLS = 16 * NTB;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    tl_mark(down, TL_SM);
    tl_mark(down, TL_GT_ENTRY);
    tl_mark(down, TL_ENTRY);
    const GemvItem it = gemv_item_of(a, down, item, COLS);
    const int n_in = it.n_in, n_out = it.n_out, parts = it.parts, part = it.part, group = it.group;
    const int proj_i = it.proj_i, proj = it.proj, slot = it.slot, slots = it.slots;

    __shared__ int sh_slot[RUN];
    __shared__ int sh_n;
    __shared__ float sh_red[KW][RUN][COLS];
    __shared__ int sh_last[RUN];
    const int e = expert_of(a.ids, a.ids64, slot);
    if (down && a.fuse_out && part == 0 && slot % a.topk == 0) fused_out_empty_row(a, slot / a.topk, group * COLS, COLS);
    if (e < 0 || e >= a.n_local) return;
    if (warp == 0)
    {
        // rank = the expert's slots before this one; the run is ranks [rank, rank + RUN)
        int n = 0, rank = -1;
        for (int base = 0; base < slots; base += 32)
        {
            const int s = base + lane;
            const bool hit = s < slots && expert_of(a.ids, a.ids64, s) == e;
            const unsigned m = __ballot_sync(0xffffffffu, hit);
            if (slot >= base && slot < base + 32) rank = n + __popc(m & ((1u << (slot - base)) - 1u));
            if (hit && rank >= 0)
            {
                const int rs = n + __popc(m & ((1u << lane) - 1u));
                if (rs >= rank && rs < rank + RUN) sh_slot[rs - rank] = s;
            }
            n += __popc(m);
            if (rank >= 0 && n >= rank + RUN) break;
        }
        if (lane == 0) sh_n = rank % RUN == 0 ? min(n - rank, RUN) : 0;
    }
    __syncthreads();
    const int nr = sh_n;
    if (nr == 0) return;

    const uint32_t* trellis = (const uint32_t*) table(a, proj, 0, e);
    const int ntiles_n = n_out >> 4;
    const int ktiles = n_in >> 4;
    const int ntile = group * NTB + (warp % NWN) * NPW;
    const int kw = warp / NWN;
    int kb, ke;
    warp_k_range(ktiles, parts, part, kw, KW, kb, ke);

    const TileBits bits = tile_bits<K>(lane);
    const int q = lane & 3;
    const int g = lane >> 2;

    // The B fragment's row of each 8-row group: rows past the run repeat its last row (their
    // output columns are never stored)
    const half* xrow[NT];
    #pragma unroll
    for (int t = 0; t < NT; ++t)
    {
        const int s = sh_slot[min(t * 8 + g, nr - 1)];
        const half* xh = (const half*) a.xh;
        const half* ah = (const half*) a.ah;
        xrow[t] = (down ? ah + (size_t) s * a.I : xh + ((size_t) s * 2 + proj_i) * a.H) + 2 * q;
    }

    float acc[NT * NPW][4];  // [8-row group t][n-tile j] at t * NPW + j
    #pragma unroll
    for (int t = 0; t < NT * NPW; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

    // Each warp streams its k-steps (NPW neighbouring tiles each) through a ring of D stages of U k-steps in
    // shared memory (cp.async, 16-byte pieces, L1 bypassed). The lane's pieces of a stage and their offsets are
    // fixed, so one stage's issue is a compare, an address and a copy per piece.
    constexpr int PPT = NPW * WORDS / 4;      // 16-byte pieces per k-step
    constexpr int PIECES = U * PPT;           // per stage
    constexpr int PPL = (PIECES + 31) / 32;   // per lane
    __shared__ uint4 ring[WARPS][D][PIECES];
    const size_t tile_stride = (size_t) ntiles_n * WORDS;
    const uint32_t* tp = trellis + (size_t) ntile * WORDS + (size_t) kb * tile_stride;
    const int ntile_k = ke - kb;
    const int batches = ntile_k > 0 ? (ntile_k + U - 1) / U : 0;
    // per piece of this lane: the tiles left when it is past the stage's end, its next source, its slot
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
    const unsigned ring_base = (unsigned) __cvta_generic_to_shared(&ring[warp][0][lane]);
    // issues the next batch (batches in order, once each)
    int next = 0;
    auto issue = [&] ()
    {
        const unsigned dst = ring_base + (unsigned) ((next % D) * PIECES * 16);
        const int t0 = next * U;
        #pragma unroll
        for (int c = 0; c < PPL; ++c)
        {
            if (t0 < p_left[c])
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
    // Everything above reads only the routing ids and the weights; the inputs come from the kernel before
    pdl_wait();
    pdl_trigger();
    // fuse_in: this block's k-range of x * suh * H for its rows in shared memory, each 16-group in the
    // B fragment's order (a lane's k 2q, 2q+1, 2q+8, 2q+9 side by side: one 8-byte load per tile), and
    // the sums of those fp16 values per row for the affine map of this k-part; FI_COPY: the run's rows of the
    // fp16 inputs' k-range, in the same order
    constexpr int XS_ROWS = FI == FI_FUSED ? FI_ROWS : FI == FI_COPY ? XC_ROWS : 1;
    constexpr int XS_STRIDE = FI == FI_FUSED ? FI_STRIDE : FI == FI_COPY ? XC_MAX_K + 8 : 8;
    __shared__ __align__(16) half xs[XS_ROWS][XS_STRIDE];
    __shared__ float xsum_w[FI == FI_FUSED ? WARPS : 1][FI_ROWS];
    const int k_lo = FI ? part * ((ktiles + parts - 1) / parts) : 0;
    if (FI == FI_COPY)
    {
        // a 16-group's words w0..w7 (k 2j, 2j + 1) go in the order w0 w4 w1 w5 w2 w6 w3 w7
        const int groups = min(ktiles, k_lo + (ktiles + parts - 1) / parts) - k_lo;
        for (int i = threadIdx.x; i < nr * groups; i += blockDim.x)
        {
            const int r = i / groups, gi = i - r * groups;
            const uint4* src = (const uint4*) ((const half*) a.ah + (size_t) sh_slot[r] * a.I + (k_lo + gi) * 16);
            const uint4 lo = src[0], hi = src[1];
            uint4* dst = (uint4*) (xs[r] + gi * 16);
            dst[0] = make_uint4(lo.x, hi.x, lo.y, hi.y);
            dst[1] = make_uint4(lo.z, hi.z, lo.w, hi.w);
        }
        __syncthreads();
    }
    if (FI == FI_FUSED)
    {
        const int nch = (min(ktiles, k_lo + (ktiles + parts - 1) / parts) - k_lo) >> 3;
        const half* suh = (const half*) table(a, proj, 1, e);
        float t0 = 0.0f, t1 = 0.0f;
        // FI_BATCH chunks per warp at a time, every load issued before the first Hadamard
        for (int i0 = warp; i0 < nr * nch; i0 += WARPS * FI_BATCH)
        {
            float v[FI_BATCH][4];
            #pragma unroll
            for (int u = 0; u < FI_BATCH; ++u)
            {
                const int i = i0 + WARPS * u;
                if (i < nr * nch)
                {
                    int r, c;
                    fi_row_chunk(i, nch, r, c);
                    const int col = (k_lo >> 3) * 128 + c * 128 + lane * 4;
                    const float4 xv = load4_as_float(a.x, (int64_t) (sh_slot[r] / a.topk) * a.H + col, a.x_dt);
                    const uint2 sv = *(const uint2*) (suh + col);
                    const float2 s01 = __half22float2(*(const __half2*) &sv.x);
                    const float2 s23 = __half22float2(*(const __half2*) &sv.y);
                    v[u][0] = xv.x * s01.x; v[u][1] = xv.y * s01.y; v[u][2] = xv.z * s23.x; v[u][3] = xv.w * s23.y;
                }
            }
            #pragma unroll
            for (int u = 0; u < FI_BATCH; ++u)
            {
                const int i = i0 + WARPS * u;
                if (i >= nr * nch) break;
                int r, c;
                fi_row_chunk(i, nch, r, c);
                had128(v[u][0], v[u][1], v[u][2], v[u][3], lane);
                // k = 4m + {0..3} within its 16-group: positions p, p + 1, p + 4, p + 5 with p = 8 (m & 1) + 2 (m >> 1)
                const int m = lane & 3;
                half* dst = xs[r] + c * 128 + (lane >> 2) * 16 + 8 * (m & 1) + 2 * (m >> 1);
                const __half2 lo = __floats2half2_rn(v[u][0], v[u][1]), hi = __floats2half2_rn(v[u][2], v[u][3]);
                *(__half2*) dst = lo;
                *(__half2*) (dst + 4) = hi;
                const float t = chunk_sum16(v[u]);
                if (r == 0) t0 += t;
                else t1 += t;
            }
        }
        if (lane == 0)
        {
            xsum_w[warp][0] = t0;
            xsum_w[warp][1] = t1;
        }
        __syncthreads();
    }
    tl_mark(down, TL_LOOP);
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
            uint32_t af[NPW][4];
            #pragma unroll
            for (int j = 0; j < NPW; ++j) decode_a<K, NB>(stage + (u * NPW + j) * WORDS, bits, af[j]);
            if (FI)
            {
                const uint2 b = *(const uint2*) (xs[min(g, nr - 1)] + (kt - k_lo) * 16 + 4 * q);
                #pragma unroll
                for (int j = 0; j < NPW; ++j) mma16816(acc[j], af[j], b.x, b.y);
            }
            else
            {
                #pragma unroll
                for (int t = 0; t < NT; ++t)
                {
                    if (t * 8 >= nr) break;
                    const uint32_t b0 = __ldg((const unsigned int*) (xrow[t] + kt * 16));
                    const uint32_t b1 = __ldg((const unsigned int*) (xrow[t] + kt * 16 + 8));
                    #pragma unroll
                    for (int j = 0; j < NPW; ++j) mma16816(acc[t * NPW + j], af[j], b0, b1);
                }
            }
        };
        run_tiles<U>(ntile_k - batch * U, tile);
        __syncwarp();
    }
    asm volatile("cp.async.wait_all;\n" ::);
    tl_mark(down, TL_LOOP_END);
    // C fragment: acc[t * NPW + j] = y[n g][rows 8t + 2q, +1], y[n g + 8][same rows] of n-tile j; then the k-warps
    // in a fixed order
    #pragma unroll
    for (int t = 0; t < NT * NPW; ++t)
    {
        const int c = (warp % NWN) * 16 * NPW + (t % NPW) * 16 + g;
        const int r = t / NPW * 8 + 2 * q;
        if (r < nr)
        {
            sh_red[kw][r][c] = acc[t][0];
            sh_red[kw][r][c + 8] = acc[t][2];
        }
        if (r + 1 < nr)
        {
            sh_red[kw][r + 1][c] = acc[t][1];
            sh_red[kw][r + 1][c + 8] = acc[t][3];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nr * COLS; i += blockDim.x)
    {
        const int r = i / COLS, cc = i % COLS;
        float v = sh_red[0][r][cc];
        #pragma unroll
        for (int w = 1; w < KW; ++w) v += sh_red[w][r][cc];
        if (FI == FI_FUSED)
        {
            float xsum = 0.0f;
            #pragma unroll
            for (int w = 0; w < WARPS; ++w) xsum += xsum_w[w][r];
            v = fmaf(v, MUL1_S_F, MUL1_O_F * xsum);
        }
        const int s = sh_slot[r];
        const int col = group * COLS + cc;
        if (down) a.dd[((size_t) part * slots + s) * a.H + col] = v;
        else a.gu[(((size_t) part * slots + s) * 2 + proj_i) * a.I + col] = v;
    }
    if (down ? a.fuse_out : a.fuse_mid) fused_tail(a, down, slot, group * COLS, COLS, nr, sh_slot, sh_last,
                                                  (float (*)[128]) &sh_red[0][0][0]);
}

template <int K, int NT, int U, int D, int MINB, bool NB, int KW = 4, int FI = FI_GLOBAL, int WARPS = 8, int NPW = 1>
__global__ void __launch_bounds__(32 * WARPS, MINB) gemv_mma_kernel(const MoeArgs a, int down)
{
    gemv_mma_item<K, NT, U, D, NB, KW, FI, WARPS, NPW>(a, down, blockIdx.x);
    tl_mark(down, TL_EXIT);
    tl_mark(down, TL_GT_EXIT);
}

// The largest shared-memory carveout for a kernel, asked once (5-6 blocks of ~29 KB need more than the default)
template <auto KERN>
void prefer_shared()
{
    static const cudaError_t done = cudaFuncSetAttribute(KERN, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                         (int) cudaSharedmemCarveoutMaxShared);
    (void) done;
}

// MoeArgs.cap_a / cap_b: the dynamic shared memory that leaves room for at most `cap` blocks of KERN per SM (0: none
// needed; CAP_AUTO: the launch's blocks over the SMs, rounded up, when that is below what fits). A launch's blocks
// go to the SMs as the launch before frees them, each SM taking as many as fit, so with no cap the first SMs free
// fill up to the registers' limit and a launch under one wave ends when they are done.
constexpr int CAP_AUTO = 31;

template <auto KERN>
size_t cap_smem(int cap, int items, int threads)
{
    if (cap <= 0) return 0;
    static int static_smem = -1;
    if (static_smem < 0)
    {
        cudaFuncAttributes attr;
        static_smem = cudaFuncGetAttributes(&attr, KERN) == cudaSuccess ? (int) attr.sharedSizeBytes : 0;
    }
    int dev = 0, per_sm = 0, reserved = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess
        || cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess
        || cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess
        || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
        return 0;
    if (cap == CAP_AUTO)
    {
        static int fit = -1;  // blocks per SM with no padding, asked once
        if (fit < 0 && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, KERN, threads, 0) != cudaSuccess) fit = 0;
        cap = (items + sms - 1) / sms;
        if (cap >= fit) return 0;  // more than one wave (or exactly full): nothing to balance
    }
    const int per_block = per_sm / (cap + 1) + 1;  // cap + 1 blocks of this size do not fit
    const int pad = per_block - static_smem - reserved;
    return pad > 0 && pad <= 48 * 1024 ? (size_t) pad : 0;
}

// FI_COPY only where its larger shared memory costs no blocks per SM against the FI_GLOBAL kernel it replaces,
// asked once per pair (one kind of GPU per process). H100 / H200 (228 KB per SM): the same blocks either way at
// K <= 3; a GPU with 100 KB per SM (compute capability 12.x per the CUDA guide's table) would fit fewer: keep the
// global loads there.
template <auto KCOPY, auto KGLOBAL>
bool copy_keeps_blocks(int threads)
{
    static int keeps = -1;
    if (keeps < 0)
    {
        prefer_shared<KCOPY>();
        prefer_shared<KGLOBAL>();
        int c = 0, g = 0;
        keeps = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, KCOPY, threads, 0) == cudaSuccess
                && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&g, KGLOBAL, threads, 0) == cudaSuccess && c >= g;
    }
    return keeps == 1;
}

template <auto KERN, int WARPS = 8>
cudaError_t launch_mma(int items, const MoeArgs& a, int down, int pdl, cudaStream_t stream)
{
    prefer_shared<KERN>();
    return launch_smem(KERN, items, 32 * WARPS, cap_smem<KERN>(down ? a.cap_b : a.cap_a, items, 32 * WARPS), stream, pdl,
                       a, down);
}

// FI_COPY for down: at most XC_ROWS rows, a k-part of at most XC_MAX_K inputs, 16-byte aligned rows
__host__ inline bool copy_fits(const MoeArgs& a)
{
    return a.bsz <= XC_ROWS && a.I % 8 == 0 && (a.I / 16 + a.parts_b - 1) / a.parts_b * 16 <= XC_MAX_K;
}

// Smaller blocks (MoeArgs.warps_a / warps_b: 4 or 2 warps; bias folded, runs of 8 rows): kw2 -> 2 k-warps per
// n-tile, else 1; the compiler asked for 32 / WARPS blocks per SM (64 registers, as the 8-warp blocks at 4): the
// same warps per SM in finer pieces, so a launch under one wave spreads its warps more evenly over the SMs.
// items32: items of 32 columns.
template <int K, int D, int WARPS, int KW>
cudaError_t launch_gemv_mma_small_kw(int items32, const MoeArgs& a, int down, int pdl, cudaStream_t stream)
{
    constexpr int COLS = 16 * (WARPS / KW);
    const int npw = down ? a.npw_b : a.npw_a;
    const int items = (int) ((int64_t) items32 * 32 / (COLS * npw));
    if (a.fuse_in && !down)
    {
        // The ring of these blocks: 2 stages of 16 tiles (the shared memory of 4 of 8, fewer instructions per tile
        // on the ring: 1-row layer 47.5 vs 48.2 us on an H200, docs/performance.md); SPARK_FI_U / SPARK_FI_D
        // override them in a bench build
#ifdef SPARK_FI_U
        constexpr int FU = SPARK_FI_U;
#else
        constexpr int FU = 16;
#endif
#ifdef SPARK_FI_D
        constexpr int FD = SPARK_FI_D;
#else
        constexpr int FD = 2;
#endif
        if constexpr (K <= 3)
        {
            // npw 2 (4 warps of 1 k-warp): stages of the same tiles, FU / 2 k-steps of 2
            if constexpr (WARPS == 4 && KW == 1)
            {
                if (npw == 2)
                    return launch_mma<gemv_mma_kernel<K, 1, FU / 2, FD, 32 / WARPS, true, KW, FI_FUSED, WARPS, 2>, WARPS>(items, a, down, pdl, stream);
            }
            if (npw != 1) return cudaErrorInvalidValue;
            return launch_mma<gemv_mma_kernel<K, 1, FU, FD, 32 / WARPS, true, KW, FI_FUSED, WARPS>, WARPS>(items, a, down, pdl, stream);
        }
        else
        {
            return cudaErrorInvalidValue;
        }
    }
    if (npw != 1) return cudaErrorInvalidValue;
    constexpr auto global = gemv_mma_kernel<K, 1, 8, D, 32 / WARPS, true, KW, FI_GLOBAL, WARPS>;
#ifndef SPARK_DN_GLOBAL
    if constexpr (K <= 4)
    {
        constexpr auto copy = gemv_mma_kernel<K, 1, 8, D, 32 / WARPS, true, KW, FI_COPY, WARPS>;
        if (down && copy_fits(a) && copy_keeps_blocks<copy, global>(32 * WARPS))
            return launch_mma<copy, WARPS>(items, a, down, pdl, stream);
    }
#endif
    return launch_mma<global, WARPS>(items, a, down, pdl, stream);
}

template <int K, int D>
cudaError_t launch_gemv_mma_small(int items32, const MoeArgs& a, int down, int warps, int kw2, int pdl, cudaStream_t stream)
{
    if (warps == 4) return kw2 ? launch_gemv_mma_small_kw<K, D, 4, 2>(items32, a, down, pdl, stream)
                               : launch_gemv_mma_small_kw<K, D, 4, 1>(items32, a, down, pdl, stream);
    if (warps == 2) return kw2 ? launch_gemv_mma_small_kw<K, D, 2, 2>(items32, a, down, pdl, stream)
                               : launch_gemv_mma_small_kw<K, D, 2, 1>(items32, a, down, pdl, stream);
    return cudaErrorInvalidValue;
}

}  // namespace

namespace {

// 8-warp blocks of 4 x NPW n-tiles x 2 k-warps, 4 per SM (stages of 8 tiles: 8 / NPW k-steps). Down's inputs are
// copied into shared memory (FI_COPY) at <= XC_ROWS rows where that costs no blocks per SM: 1-row layer 46.2 vs
// 47.3 us on an H100 at NPW 1 (docs/performance.md); static shared memory fits K <= 4 at NPW 1, K <= 3 at NPW 2.
// The bench build SPARK_DN_GLOBAL keeps the global loads. items32: items of 32 columns.
template <int K, int D, int NPW>
cudaError_t launch_gemv_mma_kw2(int items32, const MoeArgs& a, int down, int pdl, cudaStream_t stream)
{
    constexpr auto global = gemv_mma_kernel<K, 1, 8 / NPW, D, 4, true, 2, FI_GLOBAL, 8, NPW>;
    const int items = items32 / (2 * NPW);
#ifndef SPARK_DN_GLOBAL
    if constexpr (K <= (NPW == 1 ? 4 : 3))
    {
        constexpr auto copy = gemv_mma_kernel<K, 1, 8 / NPW, D, 4, true, 2, FI_COPY, 8, NPW>;
        if (down && copy_fits(a) && copy_keeps_blocks<copy, global>(256)) return launch_mma<copy>(items, a, down, pdl, stream);
    }
#endif
    return launch_mma<global>(items, a, down, pdl, stream);
}

// Stages of 8 tiles (4 deep at K <= 4, 3 deep above: static shared memory). blocks: 4, 5 or 6 blocks per SM
// asked of the compiler (64 / 48 / 40 registers); nt 2 (runs of 16 rows): 4 blocks, no bias folding;
// kw2: 4 n-tiles x 2 k-warps per block (twice the k-tiles per warp), with bias folding, 4 or 6 blocks.
template <int K, int D>
cudaError_t launch_gemv_mma_d(int items, const MoeArgs& a, int down, int nt, int blocks, int kw2, int pdl,
                              cudaStream_t stream)
{
    if (nt >= 2) return launch_mma<gemv_mma_kernel<K, 2, 8, D, 4, false>>(items, a, down, pdl, stream);
    const int warps = down ? a.warps_b : a.warps_a;
    if (a.nobias && warps && warps != 8) return launch_gemv_mma_small<K, D>(items, a, down, warps, kw2, pdl, stream);
    // two n-tiles per warp: here only the 8-warp kw2 blocks (4 per SM) without the input build
    const int npw = down ? a.npw_b : a.npw_a;
    if (npw != 1 && ((a.fuse_in && !down) || !kw2 || blocks >= 6)) return cudaErrorInvalidValue;
    if (a.fuse_in && !down)  // 4 blocks per SM (the input buffer's shared memory fits K <= 3 only)
    {
        if constexpr (K <= 3)
        {
            if (kw2) return launch_mma<gemv_mma_kernel<K, 1, 8, D, 4, true, 2, FI_FUSED>>(items / 2, a, down, pdl, stream);
            return launch_mma<gemv_mma_kernel<K, 1, 8, D, 4, true, 4, FI_FUSED>>(items, a, down, pdl, stream);
        }
        else
        {
            return cudaErrorInvalidValue;
        }
    }
    if (kw2)
    {
        if (blocks >= 6) return launch_mma<gemv_mma_kernel<K, 1, 8, D, 6, true, 2>>(items / 2, a, down, pdl, stream);
        return npw == 2 ? launch_gemv_mma_kw2<K, D, 2>(items, a, down, pdl, stream)
                        : launch_gemv_mma_kw2<K, D, 1>(items, a, down, pdl, stream);
    }
    if (a.nobias)
    {
        if (blocks >= 6) return launch_mma<gemv_mma_kernel<K, 1, 8, D, 6, true>>(items, a, down, pdl, stream);
        if (blocks == 5) return launch_mma<gemv_mma_kernel<K, 1, 8, D, 5, true>>(items, a, down, pdl, stream);
        return launch_mma<gemv_mma_kernel<K, 1, 8, D, 4, true>>(items, a, down, pdl, stream);
    }
    if (blocks >= 6) return launch_mma<gemv_mma_kernel<K, 1, 8, D, 6, false>>(items, a, down, pdl, stream);
    if (blocks == 5) return launch_mma<gemv_mma_kernel<K, 1, 8, D, 5, false>>(items, a, down, pdl, stream);
    return launch_mma<gemv_mma_kernel<K, 1, 8, D, 4, false>>(items, a, down, pdl, stream);
}

template <int K>
cudaError_t launch_gemv_mma(const MoeArgs& a, int down, int nt, int blocks, int kw2, int pdl, cudaStream_t stream)
{
    const int slots = a.bsz * a.topk;
    const int nproj = down ? 1 : 2;
    const int groups = (down ? a.H : a.I) >> 5;
    const int parts = down ? a.parts_b : a.parts_a;
    const int items = slots * nproj * groups * parts;
    if constexpr (K <= 4) return launch_gemv_mma_d<K, 4>(items, a, down, nt, blocks, kw2, pdl, stream);
    else return launch_gemv_mma_d<K, 3>(items, a, down, nt, blocks, kw2, pdl, stream);
}

// nt: 8-row groups per run (1: runs of 8 rows, 2: runs of 16)
cudaError_t launch_gemv_mma_any(const MoeArgs& a, int k, int down, int nt, int blocks, int kw2, int pdl,
                                cudaStream_t stream)
{
    kw2 = kw2 && nt == 1 && a.nobias;
    switch (k)
    {
        case 2: return launch_gemv_mma<2>(a, down, nt, blocks, kw2, pdl, stream);
        case 3: return launch_gemv_mma<3>(a, down, nt, blocks, kw2, pdl, stream);
        case 4: return launch_gemv_mma<4>(a, down, nt, blocks, kw2, pdl, stream);
        case 5: return launch_gemv_mma<5>(a, down, nt, blocks, kw2, pdl, stream);
        case 6: return launch_gemv_mma<6>(a, down, nt, blocks, kw2, pdl, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace
