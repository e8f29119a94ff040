/*
GPT-2 training in CUDA C++: FP32 weights and activations, TF32 tensor cores for matrix products
(full FP32 with -f 0). Every forward and backward kernel, the model and the training loop.

Layouts (all row-major, float32):
  activations  (B, T, C): token b*T + t, channel c at ((b*T + t)*C + c)
  attention    (B, NH, T, T): scores of query t against key s at (((b*NH + h)*T + t)*T + s)
  qkv          (B, T, 3, NH, hs): the 3C row of a token holds q, then k, then v; head h at h*hs
  linear layer weights (OC, C) as PyTorch stores them: out = inp @ W^T + bias
Every offset into a tensor is size_t: B*NH*T*T alone passes 2^31 at B=16, T=1024.
*/
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <time.h>

#include <array>
#include <map>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------------------------
// CUDA utilities

static void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) { fail("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err)); }
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)

static void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) { fail("cuBLAS error at %s:%d: %s", file, line, cublasLtGetStatusString(status)); }
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

__host__ __device__ inline unsigned int ceil_div(size_t a, size_t b) { return (unsigned int)((a + b - 1) / b); }

static int g_num_sms;                 // multiprocessors of the device, for persistent-style grids
static bool g_use_tf32 = true;        // TF32 tensor cores in the matrix products (-f)
static cublasLtHandle_t g_cublaslt;
static void* g_cublaslt_workspace;
static const size_t CUBLASLT_WORKSPACE_SIZE = 32 * 1024 * 1024;

// cudaMalloc that names what it was for when the GPU is out of memory.
static void* device_malloc(size_t bytes, const char* what) {
    void* ptr = NULL;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fail("out of GPU memory: %s needs %.2f GiB, %.2f GiB of %.2f GiB free (try a smaller -b or -t)",
             what, bytes / 1073741824.0, free_bytes / 1073741824.0, total_bytes / 1073741824.0);
    }
    return ptr;
}

__device__ inline float4 operator+(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ inline float4 operator-(float4 a, float4 b) { return make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w); }
__device__ inline float4 operator*(float4 a, float4 b) { return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w); }
__device__ inline float4 operator*(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
__device__ inline float sum4(float4 a) { return (a.x + a.y) + (a.z + a.w); }

// Sum over the block, returned to every thread; a fixed reduction tree, so deterministic.
__device__ float block_sum(float value) {
    __shared__ float warp_sums[32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    float warp_sum = cg::reduce(warp, value, cg::plus<float>());
    if (warp.thread_rank() == 0) { warp_sums[warp.meta_group_rank()] = warp_sum; }
    block.sync();
    float partial = warp.thread_rank() < warp.meta_group_size() ? warp_sums[warp.thread_rank()] : 0.0f;
    float total = cg::reduce(warp, partial, cg::plus<float>());
    block.sync();
    return total;
}

// Cross-block reductions without float atomics: each block of a group writes its partial sums,
// then calls this; it returns true in the one block that arrives last, which then sums all
// partials in block order. atomicInc wraps the counter back to 0 for the next launch.
__device__ bool arrive_last_in_group(unsigned int* counter, unsigned int group_size) {
    __shared__ bool is_last;
    __threadfence();  // this thread's partials are visible device-wide before the ticket
    __syncthreads();
    if (threadIdx.x == 0) { is_last = atomicInc(counter, group_size - 1) == group_size - 1; }
    __syncthreads();
    return is_last;
}

// ----------------------------------------------------------------------------------------------
// Encoder: out = wte[token] + wpe[position]

__global__ void encoder_forward_kernel(float4* out, const int* tokens, const float4* wte, const float4* wpe,
                                       int B, int T, int C4) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C4) { return; }
    size_t bt = idx / C4;
    int c4 = (int)(idx % C4);
    int t = (int)(bt % T);
    out[idx] = wte[(size_t)tokens[bt] * C4 + c4] + wpe[(size_t)t * C4 + c4];
}

static void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) {
    const int block_size = 256;
    size_t n = (size_t)B * T * C / 4;
    encoder_forward_kernel<<<ceil_div(n, block_size), block_size>>>((float4*)out, tokens, (const float4*)wte,
                                                                    (const float4*)wpe, B, T, C / 4);
    cudaCheck(cudaGetLastError());
}

// dwpe[t] += sum over b of dout[b, t]: one thread per (t, 4 channels), batches summed in order.
__global__ void wpe_backward_kernel(float4* dwpe, const float4* dout, int B, int T, int C4) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C4) { return; }
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int b = 0; b < B; b++) { sum = sum + dout[(size_t)b * T * C4 + idx]; }
    dwpe[idx] = dwpe[idx] + sum;
}

// dwte[token] += sum of dout over the positions holding that token. The positions are grouped by
// token on the host (TokenBuckets); one block per token sums its positions in increasing order.
__global__ void wte_backward_kernel(float4* dwte, const float4* dout, const int* bucket_tokens,
                                    const int* bucket_starts, const int* bucket_positions, int C4) {
    int bucket = blockIdx.x;
    size_t token = bucket_tokens[bucket];
    int begin = bucket_starts[bucket], end = bucket_starts[bucket + 1];
    for (int c4 = threadIdx.x; c4 < C4; c4 += blockDim.x) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int i = begin; i < end; i++) { sum = sum + dout[(size_t)bucket_positions[i] * C4 + c4]; }
        dwte[token * C4 + c4] = dwte[token * C4 + c4] + sum;
    }
}

// The batch's positions grouped by token id (counting sort), for the deterministic wte gradient.
typedef struct {
    int num_buckets;
    std::vector<int> tokens;     // [num_buckets] token id of each bucket
    std::vector<int> starts;     // [num_buckets + 1] bucket i holds positions[starts[i] .. starts[i+1])
    std::vector<int> positions;  // [B*T] positions b*T + t, increasing within a bucket
    std::vector<int> counts;     // [V] scratch
} TokenBuckets;

static void token_buckets_build(TokenBuckets* tb, const int* tokens, int n, int vocab_size) {
    tb->counts.assign(vocab_size, 0);
    for (int i = 0; i < n; i++) { tb->counts[tokens[i]]++; }
    tb->tokens.clear();
    tb->starts.clear();
    std::vector<int> next(vocab_size);
    int offset = 0;
    for (int v = 0; v < vocab_size; v++) {
        if (tb->counts[v] == 0) { continue; }
        tb->tokens.push_back(v);
        tb->starts.push_back(offset);
        next[v] = offset;
        offset += tb->counts[v];
    }
    tb->starts.push_back(offset);
    tb->num_buckets = (int)tb->tokens.size();
    tb->positions.resize(n);
    for (int i = 0; i < n; i++) { tb->positions[next[tokens[i]]++] = i; }
}

// ----------------------------------------------------------------------------------------------
// LayerNorm: out = (x - mean) * rstd * weight + bias over the C channels of each row, eps 1e-5

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) { return; }
    int C4 = C / 4;
    const float4* x = (const float4*)(inp + (size_t)row * C);
    float sum = 0.0f;
    for (int c4 = warp.thread_rank(); c4 < C4; c4 += 32) { sum += sum4(x[c4]); }
    float m = cg::reduce(warp, sum, cg::plus<float>()) / C;
    float sum_sq = 0.0f;
    for (int c4 = warp.thread_rank(); c4 < C4; c4 += 32) {
        float4 d = x[c4] - make_float4(m, m, m, m);
        sum_sq += sum4(d * d);
    }
    float r = 1.0f / sqrtf(cg::reduce(warp, sum_sq, cg::plus<float>()) / C + 1e-5f);
    float4* y = (float4*)(out + (size_t)row * C);
    for (int c4 = warp.thread_rank(); c4 < C4; c4 += 32) {
        float4 xhat = (x[c4] - make_float4(m, m, m, m)) * r;
        y[c4] = xhat * ((const float4*)weight)[c4] + ((const float4*)bias)[c4];
    }
    if (warp.thread_rank() == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, int N, int C) {
    const int block_size = 256;
    layernorm_forward_kernel<<<ceil_div(N, block_size / 32), block_size>>>(out, mean, rstd, inp, weight, bias, N, C);
    cudaCheck(cudaGetLastError());
}

// LayerNorm backward, one warp per row: dinp += dx. The dweight and dbias sums of a block are
// kept in registers per warp (CHUNKS float4 per lane, CHUNKS*128 >= C), summed over the warps in
// order into shared memory, written to partials[block][2C], and summed in block order by the
// last block to finish. Deterministic for a fixed grid.
template <int CHUNKS>
__global__ void layernorm_backward_kernel(float* dinp, float* dweight, float* dbias, float* partials,
                                          unsigned int* counter, const float* dout, const float* inp,
                                          const float* weight, const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float4 block_sums[];  // [2 * C/4]: dweight sums, then dbias sums
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int C4 = C / 4, lane = warp.thread_rank();
    const float4* weight4 = (const float4*)weight;
    float4 dw[CHUNKS], db[CHUNKS];
    for (int k = 0; k < CHUNKS; k++) { dw[k] = db[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

    for (int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank(); row < N;
         row += gridDim.x * warp.meta_group_size()) {
        const float4* dout_row = (const float4*)(dout + (size_t)row * C);
        const float4* inp_row = (const float4*)(inp + (size_t)row * C);
        float4 m = make_float4(mean[row], mean[row], mean[row], mean[row]);
        float r = rstd[row];
        float sum_g = 0.0f, sum_g_xhat = 0.0f;  // g = dout * weight, the gradient wrt xhat
        for (int k = 0; k < CHUNKS; k++) {
            int c4 = lane + 32 * k;
            if (c4 < C4) {
                float4 d = dout_row[c4], xhat = (inp_row[c4] - m) * r, g = d * weight4[c4];
                sum_g += sum4(g);
                sum_g_xhat += sum4(g * xhat);
                dw[k] = dw[k] + d * xhat;
                db[k] = db[k] + d;
            }
        }
        float mean_g = cg::reduce(warp, sum_g, cg::plus<float>()) / C;
        float mean_g_xhat = cg::reduce(warp, sum_g_xhat, cg::plus<float>()) / C;
        float4* dinp_row = (float4*)(dinp + (size_t)row * C);
        for (int k = 0; k < CHUNKS; k++) {
            int c4 = lane + 32 * k;
            if (c4 < C4) {
                float4 xhat = (inp_row[c4] - m) * r, g = dout_row[c4] * weight4[c4];
                float4 dx = (g - make_float4(mean_g, mean_g, mean_g, mean_g) - xhat * mean_g_xhat) * r;
                dinp_row[c4] = dinp_row[c4] + dx;
            }
        }
    }

    for (int w = 0; w < warp.meta_group_size(); w++) {
        if (warp.meta_group_rank() == w) {
            for (int k = 0; k < CHUNKS; k++) {
                int c4 = lane + 32 * k;
                if (c4 < C4) {
                    block_sums[c4] = w == 0 ? dw[k] : block_sums[c4] + dw[k];
                    block_sums[C4 + c4] = w == 0 ? db[k] : block_sums[C4 + c4] + db[k];
                }
            }
        }
        block.sync();
    }
    float4* partials4 = (float4*)partials;
    for (int i = threadIdx.x; i < 2 * C4; i += blockDim.x) { partials4[(size_t)blockIdx.x * 2 * C4 + i] = block_sums[i]; }
    if (!arrive_last_in_group(counter, gridDim.x)) { return; }
    for (int i = threadIdx.x; i < 2 * C4; i += blockDim.x) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned int b = 0; b < gridDim.x; b++) { sum = sum + __ldcg(&partials4[(size_t)b * 2 * C4 + i]); }
        float4* target = i < C4 ? (float4*)dweight + i : (float4*)dbias + (i - C4);
        *target = *target + sum;
    }
}

static const int LAYERNORM_BACKWARD_BLOCK = 512;

static int layernorm_backward_grid() { return g_num_sms; }

static void layernorm_backward(float* dinp, float* dweight, float* dbias, float* partials, unsigned int* counter,
                               const float* dout, const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C) {
    int grid = layernorm_backward_grid();
    size_t shared = 2 * C * sizeof(float);
    int chunks = ceil_div(C, 128);
#define LAUNCH_LAYERNORM_BACKWARD(K)                                                                         \
    layernorm_backward_kernel<K><<<grid, LAYERNORM_BACKWARD_BLOCK, shared>>>(dinp, dweight, dbias, partials, \
                                                                             counter, dout, inp, weight,     \
                                                                             mean, rstd, N, C)
    if (chunks <= 2) { LAUNCH_LAYERNORM_BACKWARD(2); }
    else if (chunks <= 4) { LAUNCH_LAYERNORM_BACKWARD(4); }
    else if (chunks <= 6) { LAUNCH_LAYERNORM_BACKWARD(6); }
    else if (chunks <= 8) { LAUNCH_LAYERNORM_BACKWARD(8); }
    else if (chunks <= 10) { LAUNCH_LAYERNORM_BACKWARD(10); }
    else if (chunks <= 13) { LAUNCH_LAYERNORM_BACKWARD(13); }
    else { LAUNCH_LAYERNORM_BACKWARD(16); }
#undef LAUNCH_LAYERNORM_BACKWARD
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// Matrix products through cuBLASLt, in cuBLAS's column-major terms:
//   out (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * out  [+ bias[m] broadcast over n]
// A row-major (R x K) matrix is a column-major (K x R) one, so the row-major linear layer
// out (BT x OC) = inp (BT x C) @ W^T is out^T = W^T-as-stored(op T) * inp^T-as-stored(op N), m = OC.
// Plans (layouts, the heuristic's algorithm) are made once per shape and cached.

typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, out_layout;
    cublasLtMatmulAlgo_t algo;
} MatmulPlan;

static std::map<std::array<int64_t, 12>, MatmulPlan> g_matmul_plans;

static cublasLtMatrixLayout_t make_layout(int rows, int cols, int ld, int batch, size_t stride) {
    cublasLtMatrixLayout_t layout;
    cublasCheck(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, rows, cols, ld));
    if (batch > 1) {
        int64_t stride64 = (int64_t)stride;
        cublasCheck(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
        cublasCheck(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride64,
                                                     sizeof(stride64)));
    }
    return layout;
}

// The largest power of two up to 256 bytes dividing every address and stride given.
static uint32_t common_alignment(std::initializer_list<uint64_t> byte_values) {
    uint32_t alignment = 256;
    for (uint64_t v : byte_values) {
        while (v % alignment != 0) { alignment /= 2; }
    }
    return alignment;
}

static MatmulPlan* matmul_plan(int m, int n, int k, bool trans_a, bool trans_b, bool has_bias, int batch,
                               size_t stride_a, size_t stride_b, size_t stride_out, uint32_t alignment) {
    std::array<int64_t, 12> key = {m, n, k, trans_a, trans_b, has_bias, batch, (int64_t)stride_a, (int64_t)stride_b,
                                   (int64_t)stride_out, alignment, g_use_tf32};
    auto found = g_matmul_plans.find(key);
    if (found != g_matmul_plans.end()) { return &found->second; }

    MatmulPlan plan;
    cublasComputeType_t compute = g_use_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasCheck(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasLtEpilogue_t epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    plan.a_layout = trans_a ? make_layout(k, m, k, batch, stride_a) : make_layout(m, k, m, batch, stride_a);
    plan.b_layout = trans_b ? make_layout(n, k, n, batch, stride_b) : make_layout(k, n, k, batch, stride_b);
    plan.out_layout = make_layout(m, n, m, batch, stride_out);

    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &CUBLASLT_WORKSPACE_SIZE, sizeof(CUBLASLT_WORKSPACE_SIZE)));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, attr, &alignment, sizeof(alignment)));
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found_count = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(g_cublaslt, plan.desc, plan.a_layout, plan.b_layout, plan.out_layout,
                                               plan.out_layout, preference, 1, &heuristic, &found_count));
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    if (found_count == 0) {
        fail("cuBLASLt has no algorithm for m=%d n=%d k=%d transA=%d transB=%d bias=%d batch=%d", m, n, k, trans_a,
             trans_b, has_bias, batch);
    }
    plan.algo = heuristic.algo;
    return &(g_matmul_plans[key] = plan);
}

static void matmul(float* out, const float* a, const float* b, const float* bias, int m, int n, int k, bool trans_a,
                   bool trans_b, float alpha, float beta, int batch = 1, size_t stride_a = 0, size_t stride_b = 0,
                   size_t stride_out = 0) {
    uint32_t alignment = common_alignment({(uint64_t)out, (uint64_t)a, (uint64_t)b, (uint64_t)bias, 4ull * m,
                                           4ull * (trans_a ? k : m), 4ull * (trans_b ? n : k), 4 * stride_a,
                                           4 * stride_b, 4 * stride_out});
    MatmulPlan* plan = matmul_plan(m, n, k, trans_a, trans_b, bias != NULL, batch, stride_a, stride_b, stride_out,
                                   alignment);
    if (bias != NULL) {
        cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasCheck(cublasLtMatmul(g_cublaslt, plan->desc, &alpha, a, plan->a_layout, b, plan->b_layout, &beta, out,
                               plan->out_layout, out, plan->out_layout, &plan->algo, g_cublaslt_workspace,
                               CUBLASLT_WORKSPACE_SIZE, 0));
}

// Linear layer forward: out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC), bias optional.
static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
    matmul(out, weight, inp, bias, OC, N, C, true, false, 1.0f, 0.0f);
}

// dbias[o] += sum over rows of dout[row, o], dout (N, OC). Block (x, y) sums the float4 columns
// [32x, 32x + 32) over the rows of chunk y, its warps in order; the last block of column group x
// adds the chunks' partials in chunk order.
__global__ void bias_backward_kernel(float* dbias, float* partials, unsigned int* counters, const float* dout, int N,
                                     int OC) {
    __shared__ float4 warp_sums[32][32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int OC4 = OC / 4, lane = warp.thread_rank(), w = warp.meta_group_rank();
    int c4 = blockIdx.x * 32 + lane;
    int rows_per_chunk = ceil_div(N, gridDim.y);
    int row_end = min(N, (int)(blockIdx.y + 1) * rows_per_chunk);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c4 < OC4) {
        for (int row = blockIdx.y * rows_per_chunk + w; row < row_end; row += warp.meta_group_size()) {
            sum = sum + ((const float4*)dout)[(size_t)row * OC4 + c4];
        }
    }
    warp_sums[w][lane] = sum;
    block.sync();
    float4* partials4 = (float4*)partials;
    if (w == 0 && c4 < OC4) {
        float4 block_total = warp_sums[0][lane];
        for (int i = 1; i < warp.meta_group_size(); i++) { block_total = block_total + warp_sums[i][lane]; }
        partials4[(size_t)blockIdx.y * OC4 + c4] = block_total;
    }
    if (!arrive_last_in_group(&counters[blockIdx.x], gridDim.y)) { return; }
    if (w == 0 && c4 < OC4) {
        float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned int y = 0; y < gridDim.y; y++) { total = total + __ldcg(&partials4[(size_t)y * OC4 + c4]); }
        ((float4*)dbias)[c4] = ((float4*)dbias)[c4] + total;
    }
}

static const int BIAS_BACKWARD_MAX_CHUNKS = 64;
static const int MAX_REDUCTION_COUNTERS = 4096;

static void bias_backward(float* dbias, float* partials, unsigned int* counters, const float* dout, int N, int OC) {
    unsigned int column_groups = ceil_div(OC / 4, 32);
    if (column_groups > MAX_REDUCTION_COUNTERS) { fail("bias_backward: OC=%d too large", OC); }
    unsigned int chunks = std::max(1u, std::min((unsigned int)BIAS_BACKWARD_MAX_CHUNKS,
                                                std::min(ceil_div(N, 64), ceil_div(2 * g_num_sms, column_groups))));
    bias_backward_kernel<<<dim3(column_groups, chunks), 256>>>(dbias, partials, counters, dout, N, OC);
    cudaCheck(cudaGetLastError());
}

// Linear layer backward: dinp = dout @ weight; dweight += dout^T @ inp; dbias += column sums of dout.
static void matmul_backward(float* dinp, float* dweight, float* dbias, float* partials, unsigned int* counters,
                            const float* dout, const float* inp, const float* weight, int N, int C, int OC) {
    matmul(dinp, weight, dout, NULL, C, N, OC, false, false, 1.0f, 0.0f);
    matmul(dweight, inp, dout, NULL, C, OC, N, false, true, 1.0f, 1.0f);
    if (dbias != NULL) { bias_backward(dbias, partials, counters, dout, N, OC); }
}

// ----------------------------------------------------------------------------------------------
// Attention. The scores are materialised per layer as (B, NH, T, T) and multiplied through
// cuBLASLt batched over the B*NH heads, which need q, k, v in the head-major layout (B, NH, T, hs).

typedef enum { ATTENTION_SOFTMAX = 0, ATTENTION_RELU = 1 } AttentionKind;

static const char* attention_name(AttentionKind kind) { return kind == ATTENTION_RELU ? "relu" : "softmax"; }

// Copies between the token-major layout (B, T, G, NH, hs) of the linear layers and the head-major
// layout G x (B, NH, T, hs); G = 3 for q, k, v, and 1 for the attention output.
template <bool TO_HEADS>
__global__ void transpose_heads_kernel(float* dst, const float* src, int B, int T, int G, int NH, int hs) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t per_group = (size_t)B * NH * T * hs;
    if (idx >= G * per_group) { return; }
    size_t g = idx / per_group, rest = idx % per_group;
    int d = (int)(rest % hs);
    int t = (int)((rest / hs) % T);
    int h = (int)((rest / ((size_t)hs * T)) % NH);
    size_t b = rest / ((size_t)hs * T * NH);
    size_t token_idx = (((b * T + t) * G + g) * NH + h) * hs + d;
    if (TO_HEADS) { dst[idx] = src[token_idx]; }
    else { dst[token_idx] = src[idx]; }
}

template <bool TO_HEADS>
static void transpose_heads(float* dst, const float* src, int B, int T, int G, int NH, int hs) {
    const int block_size = 256;
    size_t n = (size_t)G * B * NH * T * hs;
    transpose_heads_kernel<TO_HEADS><<<ceil_div(n, block_size), block_size>>>(dst, src, B, T, G, NH, hs);
    cudaCheck(cudaGetLastError());
}

// In place, one warp per row (b, h, t) of scaled scores q_t.k_s/sqrt(hs): softmax over s <= t, or
// relu(score)/(t+1); 0 for s > t.
template <AttentionKind KIND>
__global__ void attention_scores_forward_kernel(float* att, int rows, int T) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= rows) { return; }
    int t = row % T;
    float* x = att + (size_t)row * T;
    if (KIND == ATTENTION_SOFTMAX) {
        float max_score = -FLT_MAX;
        for (int s = warp.thread_rank(); s <= t; s += 32) { max_score = fmaxf(max_score, x[s]); }
        max_score = cg::reduce(warp, max_score, cg::greater<float>());
        float sum = 0.0f;
        for (int s = warp.thread_rank(); s <= t; s += 32) { sum += expf(x[s] - max_score); }
        sum = cg::reduce(warp, sum, cg::plus<float>());
        for (int s = warp.thread_rank(); s < T; s += 32) { x[s] = s <= t ? expf(x[s] - max_score) / sum : 0.0f; }
    } else {
        float inv_visible = 1.0f / (t + 1);
        for (int s = warp.thread_rank(); s < T; s += 32) { x[s] = s <= t ? fmaxf(x[s], 0.0f) * inv_visible : 0.0f; }
    }
}

// In place, datt -> d(scaled score), one warp per row. Softmax: att * (datt - sum_s att * datt);
// ReLU: datt / (t+1) where the score was positive (att > 0).
template <AttentionKind KIND>
__global__ void attention_scores_backward_kernel(float* datt, const float* att, int rows, int T) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= rows) { return; }
    int t = row % T;
    float* d = datt + (size_t)row * T;
    const float* a = att + (size_t)row * T;
    if (KIND == ATTENTION_SOFTMAX) {
        float dot = 0.0f;
        for (int s = warp.thread_rank(); s <= t; s += 32) { dot += a[s] * d[s]; }
        dot = cg::reduce(warp, dot, cg::plus<float>());
        for (int s = warp.thread_rank(); s < T; s += 32) { d[s] = s <= t ? a[s] * (d[s] - dot) : 0.0f; }
    } else {
        float inv_visible = 1.0f / (t + 1);
        for (int s = warp.thread_rank(); s < T; s += 32) { d[s] = s <= t && a[s] > 0.0f ? d[s] * inv_visible : 0.0f; }
    }
}

static const int ATTENTION_SCORES_BLOCK = 256;

static void attention_scores_forward(float* att, int rows, int T, AttentionKind kind) {
    unsigned int grid = ceil_div(rows, ATTENTION_SCORES_BLOCK / 32);
    if (kind == ATTENTION_SOFTMAX) { attention_scores_forward_kernel<ATTENTION_SOFTMAX><<<grid, ATTENTION_SCORES_BLOCK>>>(att, rows, T); }
    else { attention_scores_forward_kernel<ATTENTION_RELU><<<grid, ATTENTION_SCORES_BLOCK>>>(att, rows, T); }
    cudaCheck(cudaGetLastError());
}

static void attention_scores_backward(float* datt, const float* att, int rows, int T, AttentionKind kind) {
    unsigned int grid = ceil_div(rows, ATTENTION_SCORES_BLOCK / 32);
    if (kind == ATTENTION_SOFTMAX) { attention_scores_backward_kernel<ATTENTION_SOFTMAX><<<grid, ATTENTION_SCORES_BLOCK>>>(datt, att, rows, T); }
    else { attention_scores_backward_kernel<ATTENTION_RELU><<<grid, ATTENTION_SCORES_BLOCK>>>(datt, att, rows, T); }
    cudaCheck(cudaGetLastError());
}

// out (B, T, C) and att (B, NH, T, T) from qkv (B, T, 3C). Scratch: qkvr (3, B, NH, T, hs) and
// heads (B, NH, T, hs).
static void attention_forward(float* out, float* att, float* qkvr, float* heads, const float* qkv, int B, int T,
                              int C, int NH, AttentionKind kind) {
    int hs = C / NH, batch = B * NH;
    size_t btc = (size_t)B * T * C, head_stride = (size_t)T * hs, att_stride = (size_t)T * T;
    float *q = qkvr, *k = qkvr + btc, *v = qkvr + 2 * btc;
    transpose_heads<true>(qkvr, qkv, B, T, 3, NH, hs);
    matmul(att, k, q, NULL, T, T, hs, true, false, 1.0f / sqrtf((float)hs), 0.0f, batch, head_stride, head_stride,
           att_stride);
    attention_scores_forward(att, batch * T, T, kind);
    matmul(heads, v, att, NULL, hs, T, T, false, false, 1.0f, 0.0f, batch, head_stride, att_stride, head_stride);
    transpose_heads<false>(out, heads, B, T, 1, NH, hs);
}

// dqkv (B, T, 3C) from dout (B, T, C). Scratch: qkvr and dqkvr (3, B, NH, T, hs), dheads
// (B, NH, T, hs), datt (B, NH, T, T).
static void attention_backward(float* dqkv, float* dqkvr, float* datt, float* dheads, float* qkvr, const float* dout,
                               const float* qkv, const float* att, int B, int T, int C, int NH, AttentionKind kind) {
    int hs = C / NH, batch = B * NH;
    size_t btc = (size_t)B * T * C, head_stride = (size_t)T * hs, att_stride = (size_t)T * T;
    float *q = qkvr, *k = qkvr + btc, *v = qkvr + 2 * btc;
    float *dq = dqkvr, *dk = dqkvr + btc, *dv = dqkvr + 2 * btc;
    float scale = 1.0f / sqrtf((float)hs);
    transpose_heads<true>(qkvr, qkv, B, T, 3, NH, hs);
    transpose_heads<true>(dheads, dout, B, T, 1, NH, hs);
    matmul(datt, v, dheads, NULL, T, T, hs, true, false, 1.0f, 0.0f, batch, head_stride, head_stride, att_stride);
    matmul(dv, dheads, att, NULL, hs, T, T, false, true, 1.0f, 0.0f, batch, head_stride, att_stride, head_stride);
    attention_scores_backward(datt, att, batch * T, T, kind);
    matmul(dq, k, datt, NULL, hs, T, T, false, false, scale, 0.0f, batch, head_stride, att_stride, head_stride);
    matmul(dk, q, datt, NULL, hs, T, T, false, true, scale, 0.0f, batch, head_stride, att_stride, head_stride);
    transpose_heads<false>(dqkv, dqkvr, B, T, 3, NH, hs);
}

// ----------------------------------------------------------------------------------------------
// GELU (tanh form) and the residual add

#define GELU_SCALING_FACTOR 0.7978845608028654f  // sqrt(2 / pi)

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x)));
}

// In place: dinp = dout * gelu'(inp).
__global__ void gelu_backward_kernel(float* dinp_dout, const float* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float x = inp[i];
    float th = tanhf(GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
    dinp_dout[i] *= grad;
}

static void gelu_forward(float* out, const float* inp, size_t n) {
    gelu_forward_kernel<<<ceil_div(n, 256), 256>>>(out, inp, n);
    cudaCheck(cudaGetLastError());
}

static void gelu_backward(float* dinp_dout, const float* inp, size_t n) {
    gelu_backward_kernel<<<ceil_div(n, 256), 256>>>(dinp_dout, inp, n);
    cudaCheck(cudaGetLastError());
}

__global__ void residual_forward_kernel(float4* out, const float4* a, const float4* b, size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) { out[i] = a[i] + b[i]; }
}

static void residual_forward(float* out, const float* a, const float* b, size_t n) {
    residual_forward_kernel<<<ceil_div(n / 4, 256), 256>>>((float4*)out, (const float4*)a, (const float4*)b, n / 4);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// Fused classifier: softmax, cross-entropy and the logit gradient in one pass over the logits

typedef struct {
    float max;  // running maximum
    float sum;  // sum of exp(x - max)
} SoftmaxStats;

__device__ SoftmaxStats softmax_stats_combine(SoftmaxStats a, SoftmaxStats b) {
    float m = fmaxf(a.max, b.max);
    return SoftmaxStats{m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// One block per row of logits (B*T rows, Vp columns of which V are real). Writes the row's loss
// and, in place, dlogits = (softmax - onehot(target)) * dloss; the padded columns get 0. The
// target's logit is read before the block reduction's barrier, so before any thread overwrites it.
__global__ void fused_classifier_kernel(float* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    __shared__ SoftmaxStats warp_stats[32];
    __shared__ float target_logit;
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    float4* row4 = (float4*)(logits + (size_t)blockIdx.x * Vp);
    int target = targets[blockIdx.x];
    if (threadIdx.x == 0) { target_logit = logits[(size_t)blockIdx.x * Vp + target]; }

    SoftmaxStats stats = {-FLT_MAX, 0.0f};
    for (int i4 = threadIdx.x; i4 < Vp / 4; i4 += blockDim.x) {
        float4 x4 = row4[i4];
        float x[4] = {x4.x, x4.y, x4.z, x4.w};
        for (int k = 0; k < 4; k++) {
            if (4 * i4 + k < V) { stats = softmax_stats_combine(stats, SoftmaxStats{x[k], 1.0f}); }
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        SoftmaxStats other = {warp.shfl_xor(stats.max, offset), warp.shfl_xor(stats.sum, offset)};
        stats = softmax_stats_combine(stats, other);
    }
    if (warp.thread_rank() == 0) { warp_stats[warp.meta_group_rank()] = stats; }
    block.sync();
    stats = warp_stats[0];
    for (int w = 1; w < warp.meta_group_size(); w++) { stats = softmax_stats_combine(stats, warp_stats[w]); }

    if (threadIdx.x == 0) { losses[blockIdx.x] = stats.max + logf(stats.sum) - target_logit; }
    for (int i4 = threadIdx.x; i4 < Vp / 4; i4 += blockDim.x) {
        float4 x4 = row4[i4];
        float x[4] = {x4.x, x4.y, x4.z, x4.w};
        for (int k = 0; k < 4; k++) {
            int i = 4 * i4 + k;
            float prob = i < V ? expf(x[k] - stats.max) / stats.sum : 0.0f;
            x[k] = i < V ? (prob - (i == target ? 1.0f : 0.0f)) * dloss : 0.0f;
        }
        row4[i4] = make_float4(x[0], x[1], x[2], x[3]);
    }
}

static void fused_classifier(float* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    fused_classifier_kernel<<<N, 1024>>>(logits, losses, targets, dloss, V, Vp);
    cudaCheck(cudaGetLastError());
}

// mean_loss[0] = mean of losses[0..n), summed in a fixed order.
__global__ void mean_loss_kernel(float* mean_loss, const float* losses, int n) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { sum += losses[i]; }
    sum = block_sum(sum);
    if (threadIdx.x == 0) { mean_loss[0] = sum / n; }
}

// ----------------------------------------------------------------------------------------------
// AdamW over all parameters in one launch, as torch.optim.AdamW: p *= 1 - lr*wd (only for the
// tensors in decay_mask), then p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps).

#define NUM_PARAMETER_TENSORS 16

typedef struct {
    size_t end[NUM_PARAMETER_TENSORS];  // end offset of each tensor in the flat parameter array
    unsigned int decay_mask;            // bit i: weight decay applies to tensor i
} TensorTable;

__global__ void adamw_kernel(float* params, float* m_memory, float* v_memory, const float* grads, size_t n,
                             TensorTable table, float lr, float beta1, float beta2, float bias_correction1,
                             float bias_correction2_sqrt, float eps, float weight_decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    int tensor = 0;
    while (i >= table.end[tensor]) { tensor++; }
    float decay = (table.decay_mask >> tensor) & 1u ? weight_decay : 0.0f;
    float g = grads[i];
    float m = beta1 * m_memory[i] + (1.0f - beta1) * g;
    float v = beta2 * v_memory[i] + (1.0f - beta2) * g * g;
    m_memory[i] = m;
    v_memory[i] = v;
    float p = params[i] * (1.0f - lr * decay);
    params[i] = p - (lr / bias_correction1) * m / (sqrtf(v) / bias_correction2_sqrt + eps);
}

// ----------------------------------------------------------------------------------------------
// Initialisation: p[i] = mean + std * N(0, 1) from a counter-based generator keyed on (seed,
// first_index + i), so the values do not depend on the launch shape and every run is identical.

__device__ __host__ inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void init_normal_kernel(float* p, size_t n, float mean, float std, uint64_t seed, size_t first_index) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    uint64_t bits = splitmix64(seed ^ splitmix64(first_index + i));
    float u1 = ((uint32_t)(bits >> 40) + 1.0f) / 16777217.0f;  // (0, 1]
    float u2 = ((uint32_t)bits & 0xFFFFFF) / 16777216.0f;      // [0, 1)
    p[i] = mean + std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

static void init_normal(float* p, size_t n, float mean, float std, uint64_t seed, size_t first_index) {
    init_normal_kernel<<<ceil_div(n, 256), 256>>>(p, n, mean, std, seed, first_index);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// The model

typedef struct {
    int max_seq_len;        // maxT
    int vocab_size;         // V
    int padded_vocab_size;  // Vp >= V, a multiple of 128 for aligned matrix products
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    AttentionKind attention;
} GPT2Config;

[[maybe_unused]] static inline const char* parameter_name(int i) {
    static const char* names[NUM_PARAMETER_TENSORS] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb",
                                                       "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb",
                                                       "fcprojw", "fcprojb", "lnfw", "lnfb"};
    return names[i];
}

// Weight decay applies to the 2-D tensors: both embeddings and the four weight matrices.
static const unsigned int DECAYED_TENSORS = (1u << 0) | (1u << 1) | (1u << 4) | (1u << 6) | (1u << 10) | (1u << 12);

typedef struct {
    float* wte;       // (Vp, C)
    float* wpe;       // (maxT, C)
    float* ln1w;      // (L, C)
    float* ln1b;      // (L, C)
    float* qkvw;      // (L, 3C, C)
    float* qkvb;      // (L, 3C)
    float* attprojw;  // (L, C, C)
    float* attprojb;  // (L, C)
    float* ln2w;      // (L, C)
    float* ln2b;      // (L, C)
    float* fcw;       // (L, 4C, C)
    float* fcb;       // (L, 4C)
    float* fcprojw;   // (L, C, 4C)
    float* fcprojb;   // (L, C)
    float* lnfw;      // (C)
    float* lnfb;      // (C)
} ParameterTensors;

static void parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS], const GPT2Config* config) {
    size_t Vp = config->padded_vocab_size, C = config->channels, L = config->num_layers;
    size_t list[NUM_PARAMETER_TENSORS] = {Vp * C, (size_t)config->max_seq_len * C, L * C, L * C,
                                          L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                                          L * C, L * C, L * 4 * C * C, L * 4 * C,
                                          L * C * 4 * C, L * C, C, C};
    memcpy(sizes, list, sizeof(list));
}

static void point_parameters(ParameterTensors* tensors, float* memory, const size_t sizes[NUM_PARAMETER_TENSORS]) {
    float** ptrs[NUM_PARAMETER_TENSORS] = {
        &tensors->wte, &tensors->wpe, &tensors->ln1w, &tensors->ln1b, &tensors->qkvw, &tensors->qkvb,
        &tensors->attprojw, &tensors->attprojb, &tensors->ln2w, &tensors->ln2b, &tensors->fcw, &tensors->fcb,
        &tensors->fcprojw, &tensors->fcprojb, &tensors->lnfw, &tensors->lnfb};
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        *ptrs[i] = memory;
        memory += sizes[i];
    }
}

#define NUM_ACTIVATION_TENSORS 26

// Everything the forward pass keeps for the backward pass, plus the scratch both passes share.
typedef struct {
    float* encoded;    // (B, T, C)
    float* ln1;        // (L, B, T, C)
    float* ln1_mean;   // (L, B, T)
    float* ln1_rstd;   // (L, B, T)
    float* qkv;        // (L, B, T, 3C)
    float* atty;       // (L, B, T, C)
    float* att;        // (L, B, NH, T, T)
    float* residual2;  // (L, B, T, C)
    float* ln2;        // (L, B, T, C)
    float* ln2_mean;   // (L, B, T)
    float* ln2_rstd;   // (L, B, T)
    float* fch;        // (L, B, T, 4C)
    float* fch_gelu;   // (L, B, T, 4C)
    float* residual3;  // (L, B, T, C)
    float* lnf;        // (B, T, C)
    float* lnf_mean;   // (B, T)
    float* lnf_rstd;   // (B, T)
    float* logits;     // (B, T, Vp); the classifier turns them into dlogits in place
    float* losses;     // (B, T)
    float* qkvr;       // scratch (3, B, NH, T, hs): q, k, v in head layout
    float* heads;      // scratch (B, NH, T, hs): attention output or its gradient in head layout
    float* dresidual;  // backward (B, T, C): gradient of the residual stream
    float* dbtc;       // backward (B, T, C): dln, datty
    float* dbt4c;      // backward (B, T, 4C): dfch, dqkv
    float* dqkvr;      // backward (3, B, NH, T, hs): dq, dk, dv in head layout
    float* datt;       // backward (B, NH, T, T)
} ActivationTensors;

static void activation_sizes(size_t sizes[NUM_ACTIVATION_TENSORS], const GPT2Config* config, int B, int T) {
    size_t C = config->channels, L = config->num_layers, NH = config->num_heads, BT = (size_t)B * T;
    size_t att = (size_t)B * NH * T * T;
    size_t list[NUM_ACTIVATION_TENSORS] = {BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C,
                                           L * att, L * BT * C, L * BT * C, L * BT, L * BT, L * BT * 4 * C,
                                           L * BT * 4 * C, L * BT * C, BT * C, BT, BT,
                                           BT * config->padded_vocab_size, BT, 3 * BT * C, BT * C,
                                           BT * C, BT * C, BT * 4 * C, 3 * BT * C, att};
    memcpy(sizes, list, sizeof(list));
}

static void point_activations(ActivationTensors* acts, float* memory, const size_t sizes[NUM_ACTIVATION_TENSORS]) {
    float** ptrs[NUM_ACTIVATION_TENSORS] = {
        &acts->encoded, &acts->ln1, &acts->ln1_mean, &acts->ln1_rstd, &acts->qkv, &acts->atty, &acts->att,
        &acts->residual2, &acts->ln2, &acts->ln2_mean, &acts->ln2_rstd, &acts->fch, &acts->fch_gelu,
        &acts->residual3, &acts->lnf, &acts->lnf_mean, &acts->lnf_rstd, &acts->logits, &acts->losses,
        &acts->qkvr, &acts->heads, &acts->dresidual, &acts->dbtc, &acts->dbt4c, &acts->dqkvr, &acts->datt};
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) {
        *ptrs[i] = memory;
        memory += (sizes[i] + 63) / 64 * 64;  // each tensor 256-byte aligned
    }
}

typedef struct {
    GPT2Config config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    ParameterTensors params, grads;
    float *params_memory, *grads_memory, *m_memory, *v_memory;  // m, v: AdamW moments
    int adam_step;
    // activations, sized for at most max_B x max_T
    int max_B, max_T;
    int B, T;  // shape of the last forward pass
    ActivationTensors acts;
    float* acts_memory;
    size_t num_activations;
    // the batch on the device, and its positions grouped by token for the wte gradient
    int *inputs, *targets;
    int *bucket_tokens, *bucket_starts, *bucket_positions;
    TokenBuckets buckets;
    bool has_targets;
    // cross-block reductions: partial sums and arrival counters
    float* reduce_partials;
    unsigned int* reduce_counters;
    float* mean_loss_device;
    float mean_loss;  // of the last forward pass with targets
} GPT2;

static void validate_config(const GPT2Config* c, const char* source) {
    if (c->max_seq_len <= 0 || c->vocab_size <= 0 || c->num_layers <= 0 || c->num_heads <= 0 || c->channels <= 0) {
        fail("%s: config has a non-positive size (maxT=%d V=%d L=%d NH=%d C=%d)", source, c->max_seq_len,
             c->vocab_size, c->num_layers, c->num_heads, c->channels);
    }
    if (c->padded_vocab_size < c->vocab_size || c->padded_vocab_size % 4 != 0) {
        fail("%s: padded vocab %d must be >= vocab %d and a multiple of 4", source, c->padded_vocab_size, c->vocab_size);
    }
    if (c->channels % c->num_heads != 0 || c->channels % 4 != 0 || c->channels > 2048) {
        fail("%s: channels C=%d must be a multiple of 4 and of NH=%d, and at most 2048", source, c->channels,
             c->num_heads);
    }
    if (c->attention != ATTENTION_SOFTMAX && c->attention != ATTENTION_RELU) {
        fail("%s: unknown attention kind %d (0 softmax, 1 relu)", source, (int)c->attention);
    }
}

// Allocates parameters, gradients and AdamW moments on the device (values not set).
static void gpt2_allocate_parameters(GPT2* model, const GPT2Config* config) {
    *model = GPT2();
    model->config = *config;
    parameter_sizes(model->param_sizes, config);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { model->num_parameters += model->param_sizes[i]; }
    size_t bytes = model->num_parameters * sizeof(float);
    model->params_memory = (float*)device_malloc(bytes, "parameters");
    model->grads_memory = (float*)device_malloc(bytes, "gradients");
    model->m_memory = (float*)device_malloc(bytes, "AdamW first moments");
    model->v_memory = (float*)device_malloc(bytes, "AdamW second moments");
    cudaCheck(cudaMemset(model->grads_memory, 0, bytes));
    cudaCheck(cudaMemset(model->m_memory, 0, bytes));
    cudaCheck(cudaMemset(model->v_memory, 0, bytes));
    point_parameters(&model->params, model->params_memory, model->param_sizes);
    point_parameters(&model->grads, model->grads_memory, model->param_sizes);
}

// Checkpoint header: 256 int32, [0] magic, [1] version, [2..7] maxT V L NH C Vp, [8] attention
// kind (a slot other readers of this format ignore), rest 0; then all parameters in fp32.
static const int CHECKPOINT_MAGIC = 20240326;
static const int CHECKPOINT_VERSION = 3;

static void gpt2_build_from_checkpoint(GPT2* model, const char* path) {
    FILE* file = fopen_or_fail(path, "rb");
    int header[256];
    fread_or_fail(header, sizeof(int), 256, file, path);
    if (header[0] != CHECKPOINT_MAGIC) {
        fail("%s: bad magic %d, expected %d (not a GPT-2 model file)", path, header[0], CHECKPOINT_MAGIC);
    }
    if (header[1] != CHECKPOINT_VERSION) {
        fail("%s: version %d not supported, expected %d (fp32, padded vocab)", path, header[1], CHECKPOINT_VERSION);
    }
    GPT2Config config = {header[2], header[3], header[7], header[4], header[5], header[6], (AttentionKind)header[8]};
    validate_config(&config, path);
    gpt2_allocate_parameters(model, &config);
    int64_t expected = 256 * sizeof(int) + (int64_t)model->num_parameters * sizeof(float);
    if (file_size(path) != expected) {
        fail("%s: %lld bytes, expected %lld for its config (truncated or corrupt)", path, (long long)file_size(path),
             (long long)expected);
    }
    std::vector<float> host(model->num_parameters);
    fread_or_fail(host.data(), sizeof(float), host.size(), file, path);
    fclose(file);
    cudaCheck(cudaMemcpy(model->params_memory, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
}

static void gpt2_write_checkpoint(const GPT2* model, const char* path) {
    const GPT2Config* c = &model->config;
    int header[256] = {CHECKPOINT_MAGIC, CHECKPOINT_VERSION, c->max_seq_len, c->vocab_size, c->num_layers,
                       c->num_heads, c->channels, c->padded_vocab_size, (int)c->attention};
    std::vector<float> host(model->num_parameters);
    cudaCheck(cudaMemcpy(host.data(), model->params_memory, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    AtomicFile out;
    open_atomic(&out, path);
    fwrite_or_fail(header, sizeof(int), 256, out.file, out.tmp_path);
    fwrite_or_fail(host.data(), sizeof(float), host.size(), out.file, out.tmp_path);
    commit_atomic(&out);
}

// GPT-2 shapes by depth: d12 small (124M), d24 medium, d36 large, d48 XL.
static bool gpt2_config_by_depth(const char* name, GPT2Config* config) {
    const int depths[4] = {12, 24, 36, 48}, heads[4] = {12, 16, 20, 25}, channels[4] = {768, 1024, 1280, 1600};
    for (int i = 0; i < 4; i++) {
        char expected[8];
        snprintf(expected, sizeof(expected), "d%d", depths[i]);
        if (strcmp(name, expected) == 0) {
            *config = GPT2Config{1024, 50257, 50304, depths[i], heads[i], channels[i], ATTENTION_SOFTMAX};
            return true;
        }
    }
    return false;
}

// GPT-2 initialisation: weights N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2L)),
// biases 0, layernorm weights 1; the padded vocabulary rows of wte are 0.
static void gpt2_build_from_scratch(GPT2* model, const GPT2Config* config, uint64_t seed) {
    validate_config(config, "model");
    gpt2_allocate_parameters(model, config);
    cudaCheck(cudaMemset(model->params_memory, 0, model->num_parameters * sizeof(float)));
    float residual_std = 0.02f / sqrtf(2.0f * config->num_layers);
    const float stds[NUM_PARAMETER_TENSORS] = {0.02f, 0.02f, 0.0f, 0.0f, 0.02f, 0.0f, residual_std, 0.0f,
                                               0.0f, 0.0f, 0.02f, 0.0f, residual_std, 0.0f, 0.0f, 0.0f};
    const float means[NUM_PARAMETER_TENSORS] = {0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0};
    float* tensor = model->params_memory;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = i == 0 ? (size_t)config->vocab_size * config->channels : model->param_sizes[i];
        if (stds[i] != 0.0f || means[i] != 0.0f) { init_normal(tensor, n, means[i], stds[i], seed, tensor - model->params_memory); }
        tensor += model->param_sizes[i];
    }
}

// Activations and batch buffers for batches of at most B x T.
static void gpt2_allocate_activations(GPT2* model, int B, int T) {
    const GPT2Config* c = &model->config;
    size_t sizes[NUM_ACTIVATION_TENSORS];
    activation_sizes(sizes, c, B, T);
    model->num_activations = 0;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) { model->num_activations += (sizes[i] + 63) / 64 * 64; }
    char what[128];
    snprintf(what, sizeof(what), "activations for B=%d, T=%d", B, T);
    model->acts_memory = (float*)device_malloc(model->num_activations * sizeof(float), what);
    point_activations(&model->acts, model->acts_memory, sizes);
    model->max_B = B;
    model->max_T = T;
    size_t BT = (size_t)B * T;
    model->inputs = (int*)device_malloc(BT * sizeof(int), "inputs");
    model->targets = (int*)device_malloc(BT * sizeof(int), "targets");
    model->bucket_tokens = (int*)device_malloc(BT * sizeof(int), "token buckets");
    model->bucket_starts = (int*)device_malloc((BT + 1) * sizeof(int), "token buckets");
    model->bucket_positions = (int*)device_malloc(BT * sizeof(int), "token buckets");
    size_t ln_partials = (size_t)layernorm_backward_grid() * 2 * c->channels;
    size_t bias_partials = (size_t)BIAS_BACKWARD_MAX_CHUNKS * 4 * c->channels;
    model->reduce_partials = (float*)device_malloc(std::max(ln_partials, bias_partials) * sizeof(float), "reductions");
    model->reduce_counters = (unsigned int*)device_malloc(MAX_REDUCTION_COUNTERS * sizeof(unsigned int), "reductions");
    cudaCheck(cudaMemset(model->reduce_counters, 0, MAX_REDUCTION_COUNTERS * sizeof(unsigned int)));
    model->mean_loss_device = (float*)device_malloc(sizeof(float), "loss");
}

// Forward pass over inputs (B, T) (host, ids < V). With targets, also the loss: the classifier
// leaves d loss/d logits in acts.logits for the backward pass, scaled so that the gradient is
// that of the mean loss divided by grad_divisor (the number of accumulated micro-batches).
static float gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T, float grad_divisor = 1.0f) {
    const GPT2Config* c = &model->config;
    if (B > model->max_B || T > model->max_T) {
        fail("batch %dx%d larger than the allocated %dx%d", B, T, model->max_B, model->max_T);
    }
    int L = c->num_layers, NH = c->num_heads, C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    model->B = B;
    model->T = T;
    model->has_targets = targets != NULL;
    cudaCheck(cudaMemcpy(model->inputs, inputs, BT * sizeof(int), cudaMemcpyHostToDevice));

    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    encoder_forward(a.encoded, model->inputs, p.wte, p.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        size_t btc = BT * C;
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        float* ln1 = a.ln1 + l * btc;
        float* qkv = a.qkv + l * 3 * btc;
        float* atty = a.atty + l * btc;
        float* att = a.att + l * (size_t)B * NH * T * T;
        float* residual2 = a.residual2 + l * btc;
        float* ln2 = a.ln2 + l * btc;
        float* fch = a.fch + l * 4 * btc;
        float* fch_gelu = a.fch_gelu + l * 4 * btc;
        float* residual3 = a.residual3 + l * btc;
        // a.dbtc holds the attention and MLP projections before the residual adds
        layernorm_forward(ln1, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, residual, p.ln1w + l * C, p.ln1b + l * C, BT, C);
        matmul_forward(qkv, ln1, p.qkvw + l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C);
        attention_forward(atty, att, a.qkvr, a.heads, qkv, B, T, C, NH, c->attention);
        matmul_forward(a.dbtc, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, BT, C, C);
        residual_forward(residual2, residual, a.dbtc, btc);
        layernorm_forward(ln2, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C);
        matmul_forward(fch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, BT, C, 4 * C);
        gelu_forward(fch_gelu, fch, 4 * btc);
        matmul_forward(a.dbtc, fch_gelu, p.fcprojw + (size_t)l * 4 * C * C, p.fcprojb + l * C, BT, 4 * C, C);
        residual_forward(residual3, residual2, a.dbtc, btc);
    }
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + (L - 1) * BT * C, p.lnfw, p.lnfb, BT, C);
    matmul_forward(a.logits, a.lnf, p.wte, NULL, BT, C, Vp);
    if (targets == NULL) { return -1.0f; }

    cudaCheck(cudaMemcpy(model->targets, targets, BT * sizeof(int), cudaMemcpyHostToDevice));
    fused_classifier(a.logits, a.losses, model->targets, 1.0f / (BT * grad_divisor), BT, V, Vp);
    mean_loss_kernel<<<1, 1024>>>(model->mean_loss_device, a.losses, BT);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(&model->mean_loss, model->mean_loss_device, sizeof(float), cudaMemcpyDeviceToHost));

    token_buckets_build(&model->buckets, inputs, (int)BT, V);
    TokenBuckets* tb = &model->buckets;
    cudaCheck(cudaMemcpy(model->bucket_tokens, tb->tokens.data(), tb->num_buckets * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->bucket_starts, tb->starts.data(), (tb->num_buckets + 1) * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->bucket_positions, tb->positions.data(), BT * sizeof(int), cudaMemcpyHostToDevice));
    return model->mean_loss;
}

static void gpt2_zero_grad(GPT2* model) {
    cudaCheck(cudaMemset(model->grads_memory, 0, model->num_parameters * sizeof(float)));
}

// Backward pass of the last forward (which must have had targets); gradients accumulate (+=).
static void gpt2_backward(GPT2* model) {
    if (!model->has_targets) { fail("gpt2_backward: the last forward pass had no targets"); }
    const GPT2Config* c = &model->config;
    int B = model->B, T = model->T;
    int L = c->num_layers, NH = c->num_heads, C = c->channels, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T, btc = BT * C;
    ParameterTensors p = model->params, g = model->grads;
    ActivationTensors a = model->acts;
    float* partials = model->reduce_partials;
    unsigned int* counters = model->reduce_counters;

    cudaCheck(cudaMemset(a.dresidual, 0, btc * sizeof(float)));
    matmul_backward(a.dbtc, g.wte, NULL, partials, counters, a.logits, a.lnf, p.wte, BT, C, Vp);
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, partials, counters, a.dbtc, a.residual3 + (L - 1) * btc, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, BT, C);
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        float* dfch = a.dbt4c;  // dfch_gelu, then dfch in place
        float* dqkv = a.dbt4c;
        // MLP: dresidual holds d residual3, which flows unchanged into d residual2
        matmul_backward(dfch, g.fcprojw + (size_t)l * 4 * C * C, g.fcprojb + l * C, partials, counters, a.dresidual,
                        a.fch_gelu + l * 4 * btc, p.fcprojw + (size_t)l * 4 * C * C, BT, 4 * C, C);
        gelu_backward(dfch, a.fch + l * 4 * btc, 4 * btc);
        matmul_backward(a.dbtc, g.fcw + (size_t)l * 4 * C * C, g.fcb + l * 4 * C, partials, counters, dfch,
                        a.ln2 + l * btc, p.fcw + (size_t)l * 4 * C * C, BT, C, 4 * C);
        layernorm_backward(a.dresidual, g.ln2w + l * C, g.ln2b + l * C, partials, counters, a.dbtc,
                           a.residual2 + l * btc, p.ln2w + l * C, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, BT, C);
        // attention: dresidual now holds d residual2, which flows unchanged into d residual
        matmul_backward(a.dbtc, g.attprojw + (size_t)l * C * C, g.attprojb + l * C, partials, counters, a.dresidual,
                        a.atty + l * btc, p.attprojw + (size_t)l * C * C, BT, C, C);
        attention_backward(dqkv, a.dqkvr, a.datt, a.heads, a.qkvr, a.dbtc, a.qkv + l * 3 * btc,
                           a.att + l * (size_t)B * NH * T * T, B, T, C, NH, c->attention);
        matmul_backward(a.dbtc, g.qkvw + (size_t)l * 3 * C * C, g.qkvb + l * 3 * C, partials, counters, dqkv,
                        a.ln1 + l * btc, p.qkvw + (size_t)l * 3 * C * C, BT, C, 3 * C);
        layernorm_backward(a.dresidual, g.ln1w + l * C, g.ln1b + l * C, partials, counters, a.dbtc, residual,
                           p.ln1w + l * C, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C);
    }
    TokenBuckets* tb = &model->buckets;
    wte_backward_kernel<<<tb->num_buckets, 256>>>((float4*)g.wte, (const float4*)a.dresidual, model->bucket_tokens,
                                                   model->bucket_starts, model->bucket_positions, C / 4);
    cudaCheck(cudaGetLastError());
    wpe_backward_kernel<<<ceil_div((size_t)T * C / 4, 256), 256>>>((float4*)g.wpe, (const float4*)a.dresidual, B, T, C / 4);
    cudaCheck(cudaGetLastError());
}

static void gpt2_update(GPT2* model, float lr, float beta1, float beta2, float eps, float weight_decay) {
    model->adam_step++;
    TensorTable table;
    size_t end = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { table.end[i] = end += model->param_sizes[i]; }
    table.decay_mask = DECAYED_TENSORS;
    float bias_correction1 = 1.0f - powf(beta1, (float)model->adam_step);
    float bias_correction2_sqrt = sqrtf(1.0f - powf(beta2, (float)model->adam_step));
    adamw_kernel<<<ceil_div(model->num_parameters, 256), 256>>>(model->params_memory, model->m_memory, model->v_memory,
                                                                model->grads_memory, model->num_parameters, table, lr,
                                                                beta1, beta2, bias_correction1, bias_correction2_sqrt,
                                                                eps, weight_decay);
    cudaCheck(cudaGetLastError());
}

static void gpt2_free(GPT2* model) {
    float* buffers[] = {model->params_memory, model->grads_memory, model->m_memory, model->v_memory,
                        model->acts_memory, model->reduce_partials, model->mean_loss_device};
    for (float* buffer : buffers) { cudaCheck(cudaFree(buffer)); }
    int* int_buffers[] = {model->inputs, model->targets, model->bucket_tokens, model->bucket_starts,
                          model->bucket_positions};
    for (int* buffer : int_buffers) { cudaCheck(cudaFree(buffer)); }
    cudaCheck(cudaFree(model->reduce_counters));
}

// ----------------------------------------------------------------------------------------------
// Device setup

// Returns false when no CUDA device is usable (the tests then skip).
static bool cuda_setup(bool use_tf32) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return false;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 8) { fail("GPU %s has compute capability %d.%d; 8.0 or newer is needed", prop.name, prop.major, prop.minor); }
    g_num_sms = prop.multiProcessorCount;
    g_use_tf32 = use_tf32;
    cublasCheck(cublasLtCreate(&g_cublaslt));
    g_cublaslt_workspace = device_malloc(CUBLASLT_WORKSPACE_SIZE, "cuBLASLt workspace");
    return true;
}

static double wall_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifndef TESTING
// ----------------------------------------------------------------------------------------------
// Sampling

static uint64_t g_sample_rng_state;

static float sample_uniform() {
    g_sample_rng_state = splitmix64(g_sample_rng_state);
    return (g_sample_rng_state >> 40) / 16777216.0f;
}

// Samples a token from softmax(logits[0..V)).
static int sample_token(const float* logits, int V) {
    float max_logit = -FLT_MAX;
    for (int i = 0; i < V; i++) { max_logit = fmaxf(max_logit, logits[i]); }
    double sum = 0.0;
    for (int i = 0; i < V; i++) { sum += exp(logits[i] - max_logit); }
    double threshold = sample_uniform() * sum, cumulative = 0.0;
    for (int i = 0; i < V; i++) {
        cumulative += exp(logits[i] - max_logit);
        if (cumulative > threshold) { return i; }
    }
    return V - 1;
}

// Generates num_tokens after <|endoftext|> and prints them. Each step runs the model on the
// tokens so far as one sequence (B = 1); causality makes the last position's logits exact.
static void generate(GPT2* model, const Tokenizer* tokenizer, int num_tokens) {
    const GPT2Config* c = &model->config;
    std::vector<int> tokens = {(int)tokenizer->eot_token};
    std::vector<float> logits(c->vocab_size);
    Utf8Printer printer;
    printf("generated: ");
    for (int i = 0; i < num_tokens; i++) {
        int T = (int)tokens.size();
        gpt2_forward(model, tokens.data(), NULL, 1, T);
        cudaCheck(cudaMemcpy(logits.data(), model->acts.logits + (size_t)(T - 1) * c->padded_vocab_size,
                             c->vocab_size * sizeof(float), cudaMemcpyDeviceToHost));
        int next = sample_token(logits.data(), c->vocab_size);
        tokens.push_back(next);
        printer.print_token(tokenizer, next, stdout);
    }
    printer.finish(stdout);
    printf("\n");
}

// ----------------------------------------------------------------------------------------------
// Training

typedef struct {
    const char* train_pattern;
    const char* val_pattern;
    const char* model;        // checkpoint path or d12|d24|d36|d48
    const char* output_dir;   // -o: main.log and the final model
    const char* tokenizer;
    int B, T;
    float lr, weight_decay;
    int val_every, val_batches, sample_every, gen_tokens, max_steps;
    int attention;            // -1: from the checkpoint (softmax from scratch)
    int use_tf32, overfit_single_batch, force;
    uint64_t seed;
} TrainArgs;

static void print_usage() {
    printf(
        "usage: train_gpt2_fp32 [flags]\n"
        "  -i PATTERN  training shards (default dev/data/tinyshakespeare/tiny_shakespeare_train.bin)\n"
        "  -j PATTERN  validation shards (default dev/data/tinyshakespeare/tiny_shakespeare_val.bin)\n"
        "  -e MODEL    checkpoint file, or d12|d24|d36|d48 to start from scratch (default d12)\n"
        "  -o DIR      write DIR/main.log and, at the end, DIR/model.bin (refuses an existing run without --force)\n"
        "  -b B        batch size (default 4)\n"
        "  -t T        sequence length, 1..maxT (default 1024)\n"
        "  -l LR       learning rate (default 3e-4)\n"
        "  -c WD       AdamW weight decay on the 2-D tensors (default 0.0)\n"
        "  -x STEPS    training steps (default: one epoch of the training data)\n"
        "  -v N        validation loss every N steps (default 20)\n"
        "  -m N        validation batches (default 20)\n"
        "  -s N        sample every N steps (default 20; 0 never)\n"
        "  -g N        tokens to generate per sample (default 64)\n"
        "  -A KIND     attention: softmax or relu (default softmax, or the checkpoint's)\n"
        "  -f 0|1      TF32 tensor cores for matrix products (default 1; 0 = full FP32)\n"
        "  -a 0|1      overfit a single batch (default 0)\n"
        "  --seed N    seed for initialisation and sampling (default 1337)\n"
        "  --tokenizer FILE  vocabulary for printing samples (default dev/data/gpt2_encoder.json)\n"
        "  --force     reuse an -o DIR that already holds a run\n"
        "  -h          this help\n");
}

static int parse_int_flag(const char* flag, const char* value) {
    char* end;
    long v = strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || v < INT32_MIN || v > INT32_MAX) { fail("flag %s: '%s' is not an integer", flag, value); }
    return (int)v;
}

static float parse_float_flag(const char* flag, const char* value) {
    char* end;
    float v = strtof(value, &end);
    if (*value == '\0' || *end != '\0' || !isfinite(v)) { fail("flag %s: '%s' is not a number", flag, value); }
    return v;
}

static TrainArgs parse_args(int argc, char** argv) {
    TrainArgs args = {"dev/data/tinyshakespeare/tiny_shakespeare_train.bin",
                      "dev/data/tinyshakespeare/tiny_shakespeare_val.bin", "d12", NULL, "dev/data/gpt2_encoder.json",
                      4, 1024, 3e-4f, 0.0f, 20, 20, 20, 64, -1, -1, 1, 0, 0, 1337};
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) {
            print_usage();
            exit(0);
        }
        if (strcmp(flag, "--force") == 0) {
            args.force = 1;
            continue;
        }
        if (i + 1 >= argc) { fail("flag %s needs a value (see -h)", flag); }
        const char* value = argv[++i];
        if (strcmp(flag, "-i") == 0) { args.train_pattern = value; }
        else if (strcmp(flag, "-j") == 0) { args.val_pattern = value; }
        else if (strcmp(flag, "-e") == 0) { args.model = value; }
        else if (strcmp(flag, "-o") == 0) { args.output_dir = value; }
        else if (strcmp(flag, "--tokenizer") == 0) { args.tokenizer = value; }
        else if (strcmp(flag, "-b") == 0) { args.B = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-t") == 0) { args.T = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-l") == 0) { args.lr = parse_float_flag(flag, value); }
        else if (strcmp(flag, "-c") == 0) { args.weight_decay = parse_float_flag(flag, value); }
        else if (strcmp(flag, "-x") == 0) { args.max_steps = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-v") == 0) { args.val_every = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-m") == 0) { args.val_batches = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-s") == 0) { args.sample_every = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-g") == 0) { args.gen_tokens = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-f") == 0) { args.use_tf32 = parse_int_flag(flag, value); }
        else if (strcmp(flag, "-a") == 0) { args.overfit_single_batch = parse_int_flag(flag, value); }
        else if (strcmp(flag, "--seed") == 0) { args.seed = (uint64_t)parse_int_flag(flag, value); }
        else if (strcmp(flag, "-A") == 0) {
            if (strcmp(value, "softmax") == 0) { args.attention = ATTENTION_SOFTMAX; }
            else if (strcmp(value, "relu") == 0) { args.attention = ATTENTION_RELU; }
            else { fail("flag -A: '%s' is not an attention kind (softmax or relu)", value); }
        } else {
            fail("unknown flag %s (see -h)", flag);
        }
    }
    if (args.B <= 0) { fail("flag -b: batch size must be positive, got %d", args.B); }
    if (args.T <= 0) { fail("flag -t: sequence length must be positive, got %d", args.T); }
    if (args.lr < 0.0f || args.weight_decay < 0.0f) { fail("flags -l and -c must not be negative"); }
    if (args.val_every <= 0) { fail("flag -v: must be positive, got %d", args.val_every); }
    if (args.val_batches < 0 || args.sample_every < 0 || args.gen_tokens < 0) { fail("flags -m, -s and -g must not be negative"); }
    if (args.use_tf32 != 0 && args.use_tf32 != 1) { fail("flag -f: must be 0 or 1, got %d", args.use_tf32); }
    if (args.overfit_single_batch != 0 && args.overfit_single_batch != 1) { fail("flag -a: must be 0 or 1"); }
    return args;
}

static void build_model(GPT2* model, const TrainArgs* args) {
    GPT2Config config;
    if (gpt2_config_by_depth(args->model, &config)) {
        config.attention = args->attention < 0 ? ATTENTION_SOFTMAX : (AttentionKind)args->attention;
        gpt2_build_from_scratch(model, &config, args->seed);
        return;
    }
    if (!file_exists(args->model)) { fail("flag -e: '%s' is neither a file nor one of d12, d24, d36, d48", args->model); }
    gpt2_build_from_checkpoint(model, args->model);
    if (args->attention >= 0 && args->attention != model->config.attention) {
        fail("flag -A %s: the checkpoint %s uses %s attention", attention_name((AttentionKind)args->attention),
             args->model, attention_name(model->config.attention));
    }
}

static FILE* open_run_log(const TrainArgs* args, char* model_path, size_t model_path_size) {
    if (args->output_dir == NULL) { return NULL; }
    if (mkdir(args->output_dir, 0755) != 0 && errno != EEXIST) {
        fail("flag -o: cannot create directory %s: %s", args->output_dir, strerror(errno));
    }
    char log_path[4096];
    snprintf(log_path, sizeof(log_path), "%s/main.log", args->output_dir);
    snprintf(model_path, model_path_size, "%s/model.bin", args->output_dir);
    if (!args->force && (file_exists(log_path) || file_exists(model_path))) {
        fail("flag -o: %s already holds a run (main.log or model.bin); choose another directory or pass --force",
             args->output_dir);
    }
    return fopen_or_fail(log_path, "w");
}

static float validation_loss(GPT2* model, DataLoader* loader, int batches, int B, int T) {
    dataloader_reset(loader);
    float sum = 0.0f;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(loader);
        sum += gpt2_forward(model, loader->inputs, loader->targets, B, T);
    }
    return sum / batches;
}

static void print_config(const GPT2* model, const TrainArgs* args, size_t train_batches, int val_batches, int max_steps) {
    const GPT2Config* c = &model->config;
    printf("+-----------------------+----------------------------------------------------+\n");
    printf("| %-21s | %-50s |\n", "model", args->model);
    printf("| %-21s | %-50s |\n", "train data", args->train_pattern);
    printf("| %-21s | %-50s |\n", "val data", args->val_pattern);
    printf("| %-21s | %-50s |\n", "output dir", args->output_dir ? args->output_dir : "(none)");
    printf("| %-21s | %-50d |\n", "max_seq_len maxT", c->max_seq_len);
    printf("| %-21s | %-50d |\n", "vocab_size V", c->vocab_size);
    printf("| %-21s | %-50d |\n", "padded_vocab_size Vp", c->padded_vocab_size);
    printf("| %-21s | %-50d |\n", "num_layers L", c->num_layers);
    printf("| %-21s | %-50d |\n", "num_heads NH", c->num_heads);
    printf("| %-21s | %-50d |\n", "channels C", c->channels);
    printf("| %-21s | %-50s |\n", "attention", attention_name(c->attention));
    printf("| %-21s | %-50zu |\n", "num_parameters", model->num_parameters);
    printf("| %-21s | %-50d |\n", "batch size B", args->B);
    printf("| %-21s | %-50d |\n", "sequence length T", args->T);
    printf("| %-21s | %-50g |\n", "learning rate", args->lr);
    printf("| %-21s | %-50g |\n", "weight decay", args->weight_decay);
    printf("| %-21s | %-50s |\n", "matmul precision", g_use_tf32 ? "TF32 tensor cores" : "FP32");
    printf("| %-21s | %-50zu |\n", "train batches/epoch", train_batches);
    printf("| %-21s | %-50d |\n", "val batches", val_batches);
    printf("| %-21s | %-50d |\n", "steps", max_steps);
    printf("| %-21s | %-50llu |\n", "seed", (unsigned long long)args->seed);
    printf("| %-21s | %-50.2f |\n", "activation memory GiB", model->num_activations * 4.0 / 1073741824.0);
    printf("+-----------------------+----------------------------------------------------+\n");
}

int main(int argc, char** argv) {
    TrainArgs args = parse_args(argc, argv);
    if (!cuda_setup(args.use_tf32 == 1)) { fail("no CUDA GPU found: training needs an NVIDIA GPU of compute capability 8.0+"); }
    GPT2 model;
    build_model(&model, &args);
    const GPT2Config* c = &model.config;
    if (args.T > c->max_seq_len) { fail("flag -t: sequence length %d exceeds the model's maxT %d", args.T, c->max_seq_len); }
    int B = args.B, T = args.T;

    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, args.train_pattern, B, T, 0, 1, false, args.seed, c->vocab_size);
    dataloader_init(&val_loader, args.val_pattern, B, T, 0, 1, false, args.seed, c->vocab_size);
    int val_batches = (int)std::min((size_t)args.val_batches, dataloader_batches_per_epoch(&val_loader));
    int max_steps = args.max_steps > 0 ? args.max_steps : (int)dataloader_batches_per_epoch(&train_loader);
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, args.tokenizer);

    char model_path[4096];
    FILE* log = open_run_log(&args, model_path, sizeof(model_path));
    gpt2_allocate_activations(&model, B, std::max(T, std::min(args.gen_tokens + 1, c->max_seq_len)));
    print_config(&model, &args, dataloader_batches_per_epoch(&train_loader), val_batches, max_steps);
    g_sample_rng_state = args.seed;

    double total_seconds = 0.0;
    for (int step = 0; step <= max_steps; step++) {
        bool last_step = step == max_steps;
        if (val_batches > 0 && (step % args.val_every == 0 || last_step)) {
            float val_loss = validation_loss(&model, &val_loader, val_batches, B, T);
            printf("step %d: val loss %.6f\n", step, val_loss);
            if (log) { fprintf(log, "s:%d tel:%.6f\n", step, val_loss); fflush(log); }
        }
        if (args.sample_every > 0 && args.gen_tokens > 0 && step > 0 && (step % args.sample_every == 0 || last_step)) {
            generate(&model, &tokenizer, std::min(args.gen_tokens, model.max_T - 1));
        }
        if (last_step) { break; }

        double start = wall_seconds();
        if (!args.overfit_single_batch || step == 0) { dataloader_next_batch(&train_loader); }
        float loss = gpt2_forward(&model, train_loader.inputs, train_loader.targets, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, args.lr, 0.9f, 0.95f, 1e-8f, args.weight_decay);
        cudaCheck(cudaDeviceSynchronize());
        double seconds = wall_seconds() - start;
        if (step > 0) { total_seconds += seconds; }  // the first step includes one-time setup
        printf("step %4d/%d: train loss %.6f (%.2f ms, %.0f tok/s)\n", step + 1, max_steps, loss, seconds * 1e3,
               B * T / seconds);
        if (log) { fprintf(log, "s:%d trl:%.6f\n", step, loss); fflush(log); }
    }
    if (max_steps > 1) { printf("average step: %.2f ms\n", total_seconds / (max_steps - 1) * 1e3); }
    if (log) {
        gpt2_write_checkpoint(&model, model_path);
        printf("wrote %s\n", model_path);
        fclose(log);
    }

    tokenizer_free(&tokenizer);
    dataloader_free(&train_loader);
    dataloader_free(&val_loader);
    gpt2_free(&model);
    return 0;
}
#endif
