// The own decode GEMV for dense EXL3 linears (included at the end of decode_moe.cu, one library): a linear
// is the MoE's down projection with one expert and every row routed to it, so the tensor-core GEMV of
// decode_mma.cuh runs unchanged (fp16 inputs, the codebook's affine map after the sums, split-K parts).
// Launches with programmatic dependent launch, y = had(x * suh) W_hat, had(.) * svh (+ bias):
//   rot_in   warp per (row, 128-chunk of the input): x * suh, H128 / sqrt(128), fp16, the chunk's sum
//   gemv     gemv_mma_item (down): the weight prefetch starts while rot_in runs
//   out      warp per (row, 128-chunk of the output): k-parts summed in order, S * sum + O * sum x,
//            H128, * svh, + bias, stored in the output dtype at the row's stride (a shard's columns)
// LINEAR_FUSED: two launches, the out step run by the last gemv block of each (run of 8 rows, 128-column
// chunk) to finish (a counter per pair, reset by that block, so the next call and a graph replay find 0).
// Every sum has a fixed order, so a graph replay equals the eager call bit for bit.

#pragma once

#include "decode_util.cuh"

namespace {

struct LinearArgs
{
    const void* x; int x_dt;           // [rows, n_in]
    void* out; int out_dt;             // [rows, out_ld], columns [0, n_out)
    int64_t out_ld;
    const void* bias; int bias_dt;     // [n_out] or null
    const half* suh;                   // [n_in]
    const half* svh;                   // [n_out]
    int rows, n_in, n_out, parts;
    int affine;                        // the GEMV's sums are sum x (1024 + b): apply S, O here (runs of 8)
    half* xh;                          // [rows, n_in] the GEMV's fp16 inputs
    float* sums;                       // [rows, n_in / 128] their chunk sums
    const float* dd;                   // [parts, rows, n_out] the GEMV's k-part sums
};

__global__ void linear_rot_in_kernel(const LinearArgs l)
{
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int chunks = l.n_in >> 7;
    if (item >= l.rows * chunks) return;
    const int row = item / chunks, chunk = item % chunks;
    const int col = chunk * 128 + lane * 4;
    float v[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        v[i] = load_as_float(l.x, (int64_t) row * l.n_in + col + i, l.x_dt) * __half2float(l.suh[col + i]);
    had128(v[0], v[1], v[2], v[3], lane);
    __half2* dst = (__half2*) (l.xh + (size_t) row * l.n_in + col);
    dst[0] = __floats2half2_rn(v[0], v[1]);
    dst[1] = __floats2half2_rn(v[2], v[3]);
    const float t = chunk_sum16(v);
    if (lane == 0) l.sums[(size_t) row * chunks + chunk] = t;
}

// One warp: output chunk `chunk` (128 columns) of `row` (k-parts read through L2: other blocks wrote them)
__device__ __forceinline__ void linear_out_chunk(const LinearArgs& l, int row, int chunk, int lane)
{
    const int col = chunk * 128 + lane * 4;
    float v[4] = {0, 0, 0, 0};
    for (int p = 0; p < l.parts; ++p)
    {
        const float4 t = __ldcg((const float4*) (l.dd + ((size_t) p * l.rows + row) * l.n_out + col));
        v[0] += t.x; v[1] += t.y; v[2] += t.z; v[3] += t.w;
    }
    if (l.affine)
    {
        const int chunks_in = l.n_in >> 7;
        const float o = MUL1_O_F * sum_chunks(l.sums + (size_t) row * chunks_in, chunks_in, lane);
        #pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = fmaf(v[i], MUL1_S_F, o);
    }
    had128(v[0], v[1], v[2], v[3], lane);
    #pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        float y = v[i] * __half2float(l.svh[col + i]);
        if (l.bias) y += load_as_float(l.bias, col + i, l.bias_dt);
        store_from_float(l.out, (int64_t) row * l.out_ld + col + i, l.out_dt, y);
    }
}

__global__ void linear_out_kernel(const LinearArgs l)
{
    pdl_wait();
    pdl_trigger();
    const int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int chunks = l.n_out >> 7;
    if (item >= l.rows * chunks) return;
    linear_out_chunk(l, item / chunks, item % chunks, threadIdx.x & 31);
}

// The GEMV block of item blockIdx.x (every row takes expert 0, so runs of 8 * NT rows start at rows 8 NT j:
// the blocks of other rows exit at once), then the out step of its (run, chunk) where it is the last to finish.
// counters: [runs, n_out / 128] ints, 0 between calls. Runs of 8 leave the codebook's affine map to the out step.
template <int K, int D, int MINB, int KW, int NT>
__global__ void __launch_bounds__(256, MINB) linear_gemv_kernel(const MoeArgs a, const LinearArgs l, int* counters)
{
    constexpr int COLS = 16 * (8 / KW);
    constexpr int RUN = 8 * NT;
    const GemvItem it = gemv_item_of(a, 1, blockIdx.x, COLS);
    if (it.slot % RUN) return;
    gemv_mma_item<K, NT, 8, D, NT == 1, KW>(a, 1, blockIdx.x);
    __shared__ int last;
    __threadfence();
    __syncthreads();
    const int chunk = it.group * COLS / 128;
    int* ctr = counters + (it.slot / RUN) * (l.n_out >> 7) + chunk;
    if (threadIdx.x == 0)
    {
        last = atomicAdd(ctr, 1) == it.parts * (128 / COLS) - 1;
        if (last) *ctr = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int end = min(l.rows, it.slot + RUN);
    for (int row = it.slot + (threadIdx.x >> 5); row < end; row += 8) linear_out_chunk(l, row, chunk, threadIdx.x & 31);
}

template <auto KERN>
cudaError_t launch_linear_gemv(int items, const MoeArgs& a, const LinearArgs& l, int* counters, int pdl,
                               cudaStream_t stream)
{
    prefer_shared<KERN>();
    return launch(KERN, items, 256, stream, pdl, a, l, counters);
}

// Stages of 8 tiles, 4 deep at K <= 4, 3 above (as the MoE GEMV); 4 blocks per SM asked of the compiler
// nt: 8-row groups per run (1 or 2)
template <int K>
cudaError_t launch_linear_fused(const MoeArgs& a, const LinearArgs& l, int kw2, int nt, int* counters, int pdl,
                                cudaStream_t stream)
{
    constexpr int D = K <= 4 ? 4 : 3;
    const int items = a.bsz * (a.H >> 5) * a.parts_b;
    if (nt >= 2)
    {
        if (kw2) return launch_linear_gemv<linear_gemv_kernel<K, D, 4, 2, 2>>(items / 2, a, l, counters, pdl, stream);
        return launch_linear_gemv<linear_gemv_kernel<K, D, 4, 4, 2>>(items, a, l, counters, pdl, stream);
    }
    if (kw2) return launch_linear_gemv<linear_gemv_kernel<K, D, 4, 2, 1>>(items / 2, a, l, counters, pdl, stream);
    return launch_linear_gemv<linear_gemv_kernel<K, D, 4, 4, 1>>(items, a, l, counters, pdl, stream);
}

using LinearFused = cudaError_t (*)(const MoeArgs&, const LinearArgs&, int, int, int*, int, cudaStream_t);
// by K (2..6; spark_decode_linear checks k first)
constexpr LinearFused LINEAR_FUSED_K[] = {nullptr, nullptr, launch_linear_fused<2>, launch_linear_fused<3>,
                                          launch_linear_fused<4>, launch_linear_fused<5>, launch_linear_fused<6>};

constexpr int LINEAR_PDL = 1;    // spark_decode_linear's flags: programmatic dependent launch
constexpr int LINEAR_KW2 = 2;    // GEMV blocks of 4 n-tiles x 2 k-warps (64 columns; else 2 x 4, 32)
constexpr int LINEAR_OCC6 = 4;   // three launches: GEMV built for 6 blocks per SM (else LINEAR_OCC5: 5, else 4)
constexpr int LINEAR_OCC5 = 8;
constexpr int LINEAR_FUSED = 16;  // two launches: the out step in the GEMV's last blocks (4 blocks per SM)
constexpr int LINEAR_RUN16 = 32;  // runs of 16 rows (two MMAs per decoded tile; the affine map per weight pair;
                                  // three launches: blocks of 2 n-tiles x 4 k-warps)
constexpr int LINEAR_MAX_ROWS = 64;

}  // namespace

extern "C" {

// One shard of a dense EXL3 linear, 1..64 rows: out[r, 0:n_out] (row stride out_ld) = had(x suh) W_hat had * svh
// (+ bias). tables: device int64[9] with [6] the trellis ([n_in/16, n_out/16, 16K] int16, MUL1, K 2..6); ids:
// device int32[rows] of zeros; scratch: xh rows*n_in halves, sums rows*n_in/128 and dd parts*rows*n_out floats;
// counters (LINEAR_FUSED): ceil(rows/8)*n_out/128 ints, zero before the first call (the kernel leaves them zero).
// n_in and n_out multiples of 128. Returns a cudaError_t.
int spark_decode_linear(const void* x, int x_dt, void* out, int out_dt, int64_t out_ld, const void* bias,
                        int bias_dt, const void* suh, const void* svh, const int64_t* tables, const int32_t* ids,
                        int rows, int n_in, int n_out, int k, void* xh, float* sums, float* dd, int* counters, int parts,
                        int flags, cudaStream_t stream)
{
    const int kw2 = (flags & LINEAR_KW2) != 0;
    if (rows < 1 || rows > LINEAR_MAX_ROWS || n_in % 128 || n_out % 128 || parts < 1 || !spark_decode_supports(k))
        return (int) cudaErrorInvalidValue;
    LinearArgs l;
    l.x = x; l.x_dt = x_dt; l.out = out; l.out_dt = out_dt; l.out_ld = out_ld; l.bias = bias; l.bias_dt = bias_dt;
    l.suh = (const half*) suh; l.svh = (const half*) svh; l.rows = rows; l.n_in = n_in; l.n_out = n_out;
    l.parts = parts; l.xh = (half*) xh; l.sums = sums; l.dd = dd;
    const int nt = (flags & LINEAR_RUN16) ? 2 : 1;
    l.affine = nt == 1;
    // The GEMV's view: the MoE's down projection (input ah, I = n_in; output dd, H = n_out) of expert 0, top-1
    MoeArgs a = {};
    a.ids = ids; a.ids64 = 0; a.bsz = rows; a.topk = 1; a.H = n_out; a.I = n_in; a.n_local = 1; a.tables = tables;
    a.ah = (float*) xh; a.dd = dd; a.parts_a = 1; a.parts_b = parts; a.x16 = 1; a.nobias = nt == 1;
    const int pdl = (flags & LINEAR_PDL) != 0;
    const int blocks = (flags & LINEAR_OCC6) ? 6 : (flags & LINEAR_OCC5) ? 5 : 4;
    cudaError_t err = launch(linear_rot_in_kernel, (rows * (n_in / 128) + 7) / 8, 256, stream, pdl, l);
    if (err != cudaSuccess) return (int) err;
    if (flags & LINEAR_FUSED) return (int) LINEAR_FUSED_K[k](a, l, kw2, nt, counters, pdl, stream);
    err = launch_gemv_mma_any(a, k, 1, nt, blocks, kw2, pdl, stream);
    if (err != cudaSuccess) return (int) err;
    return (int) launch(linear_out_kernel, (rows * (n_out / 128) + 7) / 8, 256, stream, pdl, l);
}

}  // extern "C"
