// The own decode GEMV for dense EXL3 linears (included at the end of decode_moe.cu, one library): a linear
// is the MoE's down projection with one expert and every row routed to it, so the tensor-core GEMV of
// decode_mma.cuh runs unchanged (fp16 inputs, the codebook's affine map after the sums, split-K parts).
// Three launches with programmatic dependent launch, y = had(x * suh) W_hat, had(.) * svh (+ bias):
//   rot_in   warp per (row, 128-chunk of the input): x * suh, H128 / sqrt(128), fp16, the chunk's sum
//   gemv     gemv_mma_item (down): the weight prefetch starts while rot_in runs
//   out      warp per (row, 128-chunk of the output): k-parts summed in order, S * sum + O * sum x,
//            H128, * svh, + bias, stored in the output dtype at the row's stride (a shard's columns)
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

__global__ void linear_out_kernel(const LinearArgs l)
{
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int chunks = l.n_out >> 7;
    if (item >= l.rows * chunks) return;
    const int row = item / chunks, chunk = item % chunks;
    const int col = chunk * 128 + lane * 4;
    float v[4] = {0, 0, 0, 0};
    for (int p = 0; p < l.parts; ++p)
    {
        const float4 t = *(const float4*) (l.dd + ((size_t) p * l.rows + row) * l.n_out + col);
        v[0] += t.x; v[1] += t.y; v[2] += t.z; v[3] += t.w;
    }
    const int chunks_in = l.n_in >> 7;
    const float o = MUL1_O_F * sum_chunks(l.sums + (size_t) row * chunks_in, chunks_in, lane);
    #pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = fmaf(v[i], MUL1_S_F, o);
    had128(v[0], v[1], v[2], v[3], lane);
    #pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        float y = v[i] * __half2float(l.svh[col + i]);
        if (l.bias) y += load_as_float(l.bias, col + i, l.bias_dt);
        store_from_float(l.out, (int64_t) row * l.out_ld + col + i, l.out_dt, y);
    }
}

constexpr int LINEAR_PDL = 1;    // spark_decode_linear's flags: programmatic dependent launch
constexpr int LINEAR_KW2 = 2;    // GEMV blocks of 4 n-tiles x 2 k-warps (64 columns; else 2 x 4, 32)
constexpr int LINEAR_OCC6 = 4;   // GEMV built for 6 blocks per SM (else LINEAR_OCC5: 5, else 4)
constexpr int LINEAR_OCC5 = 8;
constexpr int LINEAR_MAX_ROWS = 64;

}  // namespace

extern "C" {

// One shard of a dense EXL3 linear, 1..64 rows: out[r, 0:n_out] (row stride out_ld) = had(x suh) W_hat had * svh
// (+ bias). tables: device int64[9] with [6] the trellis ([n_in/16, n_out/16, 16K] int16, MUL1, K 2..6); ids:
// device int32[rows] of zeros; scratch: xh rows*n_in halves, sums rows*n_in/128 and dd parts*rows*n_out floats.
// n_in and n_out multiples of 128 (n_out of 64 with LINEAR_KW2). Returns a cudaError_t.
int spark_decode_linear(const void* x, int x_dt, void* out, int out_dt, int64_t out_ld, const void* bias,
                        int bias_dt, const void* suh, const void* svh, const int64_t* tables, const int32_t* ids,
                        int rows, int n_in, int n_out, int k, void* xh, float* sums, float* dd, int parts, int flags,
                        cudaStream_t stream)
{
    const int kw2 = (flags & LINEAR_KW2) != 0;
    if (rows < 1 || rows > LINEAR_MAX_ROWS || n_in % 128 || n_out % 128 || parts < 1 || !spark_decode_supports(k))
        return (int) cudaErrorInvalidValue;
    LinearArgs l;
    l.x = x; l.x_dt = x_dt; l.out = out; l.out_dt = out_dt; l.out_ld = out_ld; l.bias = bias; l.bias_dt = bias_dt;
    l.suh = (const half*) suh; l.svh = (const half*) svh; l.rows = rows; l.n_in = n_in; l.n_out = n_out;
    l.parts = parts; l.xh = (half*) xh; l.sums = sums; l.dd = dd;
    // The GEMV's view: the MoE's down projection (input ah, I = n_in; output dd, H = n_out) of expert 0, top-1
    MoeArgs a = {};
    a.ids = ids; a.ids64 = 0; a.bsz = rows; a.topk = 1; a.H = n_out; a.I = n_in; a.n_local = 1; a.tables = tables;
    a.ah = (float*) xh; a.dd = dd; a.parts_a = 1; a.parts_b = parts; a.x16 = 1; a.nobias = 1;
    const int pdl = (flags & LINEAR_PDL) != 0;
    const int blocks = (flags & LINEAR_OCC6) ? 6 : (flags & LINEAR_OCC5) ? 5 : 4;
    cudaError_t err = launch(linear_rot_in_kernel, (rows * (n_in / 128) + 7) / 8, 256, stream, pdl, l);
    if (err != cudaSuccess) return (int) err;
    err = launch_gemv_mma_any(a, k, 1, 1, blocks, kw2, pdl, stream);
    if (err != cudaSuccess) return (int) err;
    return (int) launch(linear_out_kernel, (rows * (n_out / 128) + 7) / 8, 256, stream, pdl, l);
}

}  // extern "C"
