/*
Kernel lab: causal attention (softmax and ReLU), forward and backward.
  variant 1  materialised attention (below): cuBLASLt batched GEMMs over (B, NH, T, T), TF32
  variant 2  the trainer's flash attention, TF32, on mma.sync (what GPUs before Hopper run)
  variant 3  the trainer's flash attention, split-TF32 (FP32-accurate, what -f 0 runs)
  variant 4  the trainer's flash attention, TF32, the forward on Hopper's wgmma (what -f 1 runs there)
  variant 5  variant 4 with a dQ kernel on wgmma too (below; slower than the trainer's, kept here)
  variant 6  variant 4 with a dK/dV kernel on wgmma too (below; slower than the trainer's, kept here)
  variant 7  variant 4 with a pipelined forward: a producer warpgroup and two consumers (below;
             slower than the trainer's, kept here)
  variant 8  variant 4 with one backward kernel: dK/dV's CTAs add dQ's shares in a fixed order
             (below; slower than the trainer's, kept here)
  variant 9  variant 4 with dS through memory: the dK/dV kernel stores dS, dQ = dS K reads it back
             (below; slower than the trainer's, kept here)
  variant 10 the trainer's flash attention on the FP32 cores (fmaf only, no mma.sync or cp.async: what
             GPUs before Ampere run); also timed against the FP32 FMA peak of the device
  variant 11 the trainer's FP32-core path on 64 KB multiprocessors (T4, RTX 20, P100): variant 10's
             forward, the backward with its plans for them (each kernel within ~31 KB, two blocks
             where variant 10's fit one; fp32_*_tiling(hs, true))
LAB_SM_KB=64 holds the FP32-core kernels (variants 10 and 11) to 64 KB of shared memory per
multiprocessor (the carveout preference), so that as many of their blocks run at once as on a
64 KB multiprocessor; their rows then measure that occupancy on this GPU.
Checks each variant against a CPU reference in double precision (GPT-2 124M shapes on a subset of
heads, other head sizes and ragged T on all heads; fresh N(0, 1) inputs, ReLU's q and k on a grid,
see quantize_scores), times forward and backward on GPT-2 124M shapes and at hs 32 and 128 with the
same channels (CUDA events, median of 20 launches), checks that 10 runs give bit-identical outputs,
and prints one table at the end.
The flash backward writes the gradient transposed, dqkv_t (3C, B*T), and adds its sum over the
tokens to dbias (3C, the qkv bias gradient): the check transposes dqkv_t back (untimed) and compares
dbias with the double column sums of that dqkv; the determinism check compares dqkv_t and dbias.

  make attention && ./attention        all variants
  ./attention 2 3                      only the listed variants
  ./attention --small 2                only the small checks (for compute-sanitizer)
A build for compute capability 7.5 (make GPU_ARCH=compute_75: PTX, which a newer GPU compiles at
start) skips variants 2 to 9, whose kernels need 8.0.
*/
#define TESTING
#include "../../train_gpt2_fp32.cu"

#include <algorithm>
#include <random>
#include <string>
#include <thread>

// ----------------------------------------------------------------------------------------------
// Variant 1, materialised attention (the trainer's before flash attention): the scores as a
// (B, NH, T, T) tensor, multiplied through cuBLASLt batched over the B*NH heads, which need q, k, v
// in the head-major layout (B, NH, T, hs).

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

constexpr int ATTENTION_SCORES_BLOCK = 256;

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
    matmul(att, k, q, nullptr, T, T, hs, true, false, 1.0f / sqrtf((float)hs), 0.0f, batch, head_stride, head_stride,
           att_stride);
    attention_scores_forward(att, batch * T, T, kind);
    matmul(heads, v, att, nullptr, hs, T, T, false, false, 1.0f, 0.0f, batch, head_stride, att_stride, head_stride);
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
    matmul(datt, v, dheads, nullptr, T, T, hs, true, false, 1.0f, 0.0f, batch, head_stride, head_stride, att_stride);
    matmul(dv, dheads, att, nullptr, hs, T, T, false, true, 1.0f, 0.0f, batch, head_stride, att_stride, head_stride);
    attention_scores_backward(datt, att, batch * T, T, kind);
    matmul(dq, k, datt, nullptr, hs, T, T, false, false, scale, 0.0f, batch, head_stride, att_stride, head_stride);
    matmul(dk, q, datt, nullptr, hs, T, T, false, true, scale, 0.0f, batch, head_stride, att_stride, head_stride);
    transpose_heads<false>(dqkv, dqkvr, B, T, 3, NH, hs);
}

constexpr double TF32_PEAK_TFLOPS = 402.0;
// Tolerances on max |error| / max |reference|, forward and backward, and why.
struct Tolerance {
    double forward, backward;
    const char* reason;
};

constexpr Tolerance TF32_TOLERANCE = {5e-3, 1e-2,
                                      "TF32 10-bit mantissas; fwd: the trainer's TF32 logits tolerance; bwd: "
                                      "dS = P(dP - delta) cancels, the trainer's TF32 gradients take 1e-1"};
constexpr Tolerance FP32_TOLERANCE = {2e-5, 1e-4,
                                      "fp32 level; fwd: the trainer's -f 0 logits tolerance; bwd: dS sums to 0 "
                                      "over the keys (cancels), the trainer's -f 0 gradients take 5e-4"};
constexpr Tolerance FP32_CORES_TOLERANCE = {1e-5, 1e-5,
                                            "plain fp32 fmaf sums; on the CPU (build/draft/emulate, T <= 257) "
                                            "out 5e-7, dqkv 8e-7"};
constexpr const char* VARIANT_NAMES[] = {"", "1 materialised TF32", "2 flash TF32", "3 flash split-TF32",
                                      "4 flash TF32 wgmma", "5 4 + wgmma dQ", "6 4 + wgmma dK/dV",
                                      "7 4, pipelined fwd", "8 4 + fused bwd", "9 4 + dS in memory",
                                      "10 flash FP32 cores", "11 10, 64 KB-SM plans"};
constexpr int NUM_VARIANTS = sizeof(VARIANT_NAMES) / sizeof(VARIANT_NAMES[0]) - 1;
constexpr int FP32_CORES_VARIANT = 10, FP32_SMALL_SM_VARIANT = 11;

// Variants 10 and 11 run on the FP32 cores (no tensor cores: flash_plan takes that path).
static bool fp32_cores_variant(int variant) { return variant == FP32_CORES_VARIANT || variant == FP32_SMALL_SM_VARIANT; }

// Whether this build's code has the TF32 tensor cores (the trainer's g_tf32_cores after cuda_setup;
// a compute_75 PTX build has not): variants 2 to 9 need them, variant 10 runs without.
static bool g_build_tf32_cores;

// FP32 lanes per multiprocessor by compute capability (64: 6.0, 7.x, 8.0; 128: 6.1, 6.2, 8.6 on).
static int fp32_lanes_per_sm(int major, int minor) {
    if (major == 6) { return minor == 0 ? 64 : 128; }
    if (major == 7 || (major == 8 && minor == 0)) { return 64; }
    return 128;
}

// The device's FP32 FMA peak in TFLOP/s: SMs x lanes x 2 flops x the peak clock; and its terms.
static double fp32_peak_tflops(char* terms, size_t size) {
    int device = 0, sms = 0, clock_khz = 0, major = 0, minor = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cudaCheck(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    int lanes = fp32_lanes_per_sm(major, minor);
    snprintf(terms, size, "%d SMs x %d lanes x 2 x %.3f GHz", sms, lanes, clock_khz * 1e-6);
    return (double)sms * lanes * 2 * clock_khz * 1e3 * 1e-12;
}

struct Shape {
    int B, T, NH, hs;
};

static std::string shape_name(Shape s) {
    char text[64];
    snprintf(text, sizeof(text), "B%d T%d NH%d hs%d", s.B, s.T, s.NH, s.hs);
    return text;
}

static std::vector<std::string> g_table;

static void table_row(const char* what, Shape s, AttentionKind kind, int variant, const char* forward,
                      const char* backward, const char* note) {
    char line[512];
    snprintf(line, sizeof(line), "| %-11s | %-22s | %-7s | %-20s | %-30s | %-30s | %s", what, shape_name(s).c_str(),
             attention_name(kind), VARIANT_NAMES[variant], forward, backward, note);
    g_table.push_back(line);
}

// ----------------------------------------------------------------------------------------------
// Variants 5 to 7 run CTAs of two warpgroups, 128 queries or keys (the trainer's forward takes four
// at hs 64: wgmma_groups).
constexpr int WG_GROUPS = 2;
constexpr int WG_THREADS = 128 * WG_GROUPS;
constexpr int WG_CTA_QUERIES = WG_QUERIES * WG_GROUPS;

// ----------------------------------------------------------------------------------------------
// Variant 5: variant 4 with the dQ kernel on wgmma too (TF32, hs <= 64; hs = 128's tiles would pass
// the shared-memory limit, so it runs the trainer's dQ kernel): flash_backward_dq_kernel's work laid
// out as the trainer's Hopper forward (flash_forward_wgmma_kernel). Per key tile and warpgroup: S = Q K^T and dP = dO V^T (q, dout, k and v
// panels in shared memory), P and dS in registers, then dQ += dS K with K stored transposed by the
// threads (K^T, columns in value_position order). The 128 rows of dQ (times the scale) are staged
// transposed and written per block of FLASH_ROWS tokens as store_columns does.

// A warpgroup accumulator's rows of the CTA (times acc_scale; a warp's at warp_row + g, + 8), tokens
// row0 on: staged transposed (stage: HS x (WG_CTA_QUERIES + 4) floats, free), then drained per block
// of FLASH_ROWS rows into dst_t and the blocks' bias partials (partials, the next block's row_stride
// floats on), as store_columns does.

template <int HS>
__device__ void store_wgmma_columns(float* dst_t, size_t tokens, const float (&acc)[HS / 8][4], float acc_scale,
                                    int row0, int warp_row, int T, float* partials, size_t row_stride, float* stage,
                                    int g, int q) {
    constexpr int STAGE_STRIDE = WG_CTA_QUERIES + 4;
    cg::thread_block block = cg::this_thread_block();
    block.sync();  // every warpgroup is done with the tiles, or with a previous call's stage
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            stage[(8 * n + 2 * q + (i & 1)) * STAGE_STRIDE + warp_row + g + 8 * (i >> 1)] = acc[n][i] * acc_scale;
        }
    }
    block.sync();
    for (int half = 0; half < WG_GROUPS && row0 + WG_QUERIES * half < T; half++) {
        drain_columns<HS>(dst_t, tokens, stage + WG_QUERIES * half, STAGE_STRIDE, row0 + WG_QUERIES * half, T,
                          partials + half * row_stride);
    }
}

template <AttentionKind KIND, int HS>
__global__ void __launch_bounds__(WG_THREADS) flash_backward_dq_wgmma_kernel(float* dqkv_t, float* bias_partials,
                                                                             float* delta, const float* dout,
                                                                             const float* qkv, const float* out,
                                                                             const float* lse, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(WG_QUERIES == FLASH_ROWS, "a warpgroup's rows are one block of the bias partials");
    constexpr int TILE = WG_KEYS * HS, STAGE = 3 * TILE;
    extern __shared__ float shared_raw[];
    // q and dout (WG_CTA_QUERIES x HS each), then two stages of {K, V, K^T}; panels 1024-byte aligned
    float* q_tile = shared_aligned_1024(shared_raw);
    float* do_tile = q_tile + WG_CTA_QUERIES * HS;
    float* stages = do_tile + WG_CTA_QUERIES * HS;
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int group = threadIdx.x / 128, g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3;
    int C = NH * HS, h = blockIdx.x % NH, warp_row = WG_QUERIES * group + 16 * (warp.meta_group_rank() % 4);
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    int query0 = (gridDim.y - 1 - blockIdx.y) * WG_CTA_QUERIES;  // the heaviest query blocks start first
    int group_query0 = query0 + WG_QUERIES * group, warp_query0 = query0 + warp_row;
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    int num_tiles = ceil_div(min(query0 + WG_CTA_QUERIES, T), WG_KEYS);
    float scale = rsqrtf((float)HS), exp_scale = exponent_scale<false>(scale);

    load_panels<WG_CTA_QUERIES, HS, WG_THREADS>(q_tile, q_head, row_stride, query0, T);
    load_panels<WG_CTA_QUERIES, HS, WG_THREADS>(do_tile, do_head, C, query0, T);
    load_panels<WG_KEYS, HS, WG_THREADS>(stages, q_head + C, row_stride, 0, T);
    load_panels<WG_KEYS, HS, WG_THREADS>(stages + TILE, q_head + 2 * C, row_stride, 0, T);
    cp_async_commit();
    float4 k_next[value_chunks<HS, WG_THREADS>()];
    load_values<HS, WG_THREADS>(k_next, q_head + C, row_stride, 0, T);
    store_values_transposed<HS, WG_THREADS>(stages + 2 * TILE, k_next);
    float stat_a[2], stat_b[2];
    row_statistics<KIND, HS, false>(stat_a, stat_b, delta + head_rows, lse + head_rows, do_head,
                                    out + b * T * C + h * HS, C, warp_query0, T, warp);
    float dq[HS / 8][4] = {};
    const float* q_rows = q_tile + WG_QUERIES * group * 32;  // the warpgroup's rows of every panel
    const float* do_rows = do_tile + WG_QUERIES * group * 32;

    for (int tile = 0; tile < num_tiles; tile++) {
        cp_async_wait_all();
        fence_proxy_async();  // this thread's tile writes, visible to the tensor cores after the barrier
        block.sync();         // the tile is in; every warpgroup is done with the other stage
        const float* k_tile = stages + (tile & 1) * STAGE;
        float* next_stage = stages + ((tile + 1) & 1) * STAGE;
        bool next = tile + 1 < num_tiles;
        if (next) {
            load_panels<WG_KEYS, HS, WG_THREADS>(next_stage, q_head + C, row_stride, (tile + 1) * WG_KEYS, T);
            load_panels<WG_KEYS, HS, WG_THREADS>(next_stage + TILE, q_head + 2 * C, row_stride, (tile + 1) * WG_KEYS,
                                                 T);
            load_values<HS, WG_THREADS>(k_next, q_head + C, row_stride, (tile + 1) * WG_KEYS, T);
        }
        cp_async_commit();
        int key0 = tile * WG_KEYS;
        if (key0 <= group_query0 + WG_QUERIES - 1) {  // some key at or before some query of the warpgroup
            float s[WG_KEYS / 8][4], dp[WG_KEYS / 8][4];
            wgmma_fence();
            wgmma_scores<HS>(s, q_rows, WG_CTA_QUERIES, k_tile, WG_KEYS);
            wgmma_scores<HS>(dp, do_rows, WG_CTA_QUERIES, k_tile + TILE, WG_KEYS);
            wgmma_commit();
            wgmma_wait_all();
            pin_registers<WG_KEYS / 2>(&s[0][0]);
            pin_registers<WG_KEYS / 2>(&dp[0][0]);
            if (key0 + WG_KEYS - 1 > warp_query0) {
                mask_causal<WG_KEYS, false>(s, warp_query0, key0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
            }
#pragma unroll
            for (int n = 0; n < WG_KEYS / 8; n++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    probability_and_gradient<KIND, false>(s[n][i], dp[n][i], scale, exp_scale, stat_a[i / 2],
                                                          stat_b[i / 2]);
                    dp[n][i] = tf32_round_for_mma(dp[n][i]);
                }
            }
            wgmma_fence();
            wgmma_pv<HS>(dq, dp, k_tile + 2 * TILE);  // dS K, as P V
            wgmma_commit();
            wgmma_wait_all();
            pin_registers<HS / 2>(&dq[0][0]);
        }
        if (next) { store_values_transposed<HS, WG_THREADS>(next_stage + 2 * TILE, k_next); }
    }

    size_t tokens = gridDim.x / NH * (size_t)T;
    float* partials = bias_partials + (b * ceil_div(T, FLASH_ROWS) + query0 / FLASH_ROWS) * row_stride + h * HS;
    store_wgmma_columns<HS>(dqkv_t + h * HS * tokens + b * T, tokens, dq, scale, query0, warp_row, T, partials,
                            row_stride, q_tile, g, q);  // q_tile: free after the last tile
#endif
}

// The trainer's backward launcher with variant 5's dQ kernel in place of its own.
struct FlashBackwardWgmmaDq {
    FlashBackward trainer;
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        if constexpr (SPLIT || HS > 64) {
            trainer.run_dq<KIND, HS, SPLIT, FLASH_DQ_KEYS>();
        } else {
            static bool configured = false;
            size_t shared = (2 * WG_CTA_QUERIES * HS + 6 * WG_KEYS * HS) * sizeof(float) + 1024;  // + the alignment
            flash_set_shared(flash_backward_dq_wgmma_kernel<KIND, HS>, shared, &configured);
            const FlashBackward& t = trainer;
            dim3 grid(t.B * t.NH, ceil_div(t.T, WG_CTA_QUERIES));
            flash_backward_dq_wgmma_kernel<KIND, HS><<<grid, WG_THREADS, shared>>>(
                t.dqkv_t, t.bias_partials, t.delta, t.dout, t.qkv, t.out, t.lse, t.T, t.NH);
            cudaCheck(cudaGetLastError());
        }
        trainer.run_dkdv<KIND, HS, SPLIT, flash_dkdv_queries(HS, SPLIT)>();
        trainer.sum_bias(HS, FLASH_ROWS);
    }
};

// ----------------------------------------------------------------------------------------------
// Buffers and runs

// ----------------------------------------------------------------------------------------------
// Variant 6: variant 4 with the dK/dV kernel on wgmma (TF32, hs <= 64; hs = 128 runs the trainer's):
// flash_backward_dkdv_kernel's work with the roles of the Hopper forward. A CTA of two warpgroups
// owns 128 keys, 64 per warpgroup, and loops over query tiles of 64 from its first key's to T,
// double-buffered. Per tile and warpgroup (rows are keys, columns queries):
//   S^T = K Q^T and dP^T = V dO^T: the K and V panels (the CTA's rows) against the tile's q and
//         dout panels, all in shared memory;
//   P^T and dS^T in registers from the queries' lse and delta (or 1/(t+1));
//   dV += P^T dO and dK += dS^T Q, P^T and dS^T from registers: TF32 needs B K-major, so the tile's
//         q and dout are also stored transposed by the threads (query columns in value_position
//         order), one tile ahead.
// dK (times the scale) and dV are staged transposed and written per block of FLASH_ROWS keys, with
// their bias partials, as store_columns does.

template <AttentionKind KIND, int HS>
__global__ void __launch_bounds__(WG_THREADS) flash_backward_dkdv_wgmma_kernel(float* dqkv_t, float* bias_partials,
                                                                               const float* dout, const float* qkv,
                                                                               const float* lse, const float* delta,
                                                                               int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(WG_QUERIES == FLASH_ROWS, "a warpgroup's rows are one block of the bias partials");
    constexpr int KEYS = WG_CTA_QUERIES, QUERIES = WG_KEYS, TILE = QUERIES * HS, STAGE = 4 * TILE;
    extern __shared__ float shared_raw[];
    // K and V (KEYS x HS each), two stages of {q, dout, q^T, dout^T}, then two stages of the query
    // statistics (lse, delta); panels 1024-byte aligned
    float* k_panel = shared_aligned_1024(shared_raw);
    float* v_panel = k_panel + KEYS * HS;
    float* stages = v_panel + KEYS * HS;
    float* stats = stages + 2 * STAGE;
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    // the warpgroup from lane 0, uniform to the compiler (wgmma under a non-uniform branch is serialised)
    int group = warp.shfl(threadIdx.x / 128, 0), g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3;
    int C = NH * HS, h = blockIdx.x % NH, warp_row = WG_QUERIES * group + 16 * (warp.meta_group_rank() % 4);
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    int key0 = blockIdx.y * KEYS;  // the heaviest (earliest) key blocks start first
    int group_key0 = key0 + WG_QUERIES * group, warp_key0 = key0 + warp_row;
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    int first_tile = key0 / QUERIES, num_tiles = ceil_div(T, QUERIES);
    float scale = rsqrtf((float)HS), exp_scale = exponent_scale<false>(scale);

    // a tile's statistics: thread t < QUERIES loads lse (softmax) of query t, the next QUERIES delta
    auto load_stat = [&](int query0) {
        int t = threadIdx.x % QUERIES, query = query0 + t;
        const float* source = threadIdx.x < QUERIES ? lse : delta;
        return KIND == ATTENTION_SOFTMAX && threadIdx.x < 2 * QUERIES && query < T ? source[head_rows + query] : 0.0f;
    };
    auto store_stat = [&](float* stage_stats, float value) {
        if (threadIdx.x < 2 * QUERIES) { stage_stats[threadIdx.x] = value; }
    };
    load_panels<KEYS, HS, WG_THREADS>(k_panel, q_head + C, row_stride, key0, T);
    load_panels<KEYS, HS, WG_THREADS>(v_panel, q_head + 2 * C, row_stride, key0, T);
    load_panels<QUERIES, HS, WG_THREADS>(stages, q_head, row_stride, first_tile * QUERIES, T);
    load_panels<QUERIES, HS, WG_THREADS>(stages + TILE, do_head, C, first_tile * QUERIES, T);
    cp_async_commit();
    float4 q_next[value_chunks<HS, WG_THREADS>()], do_next[value_chunks<HS, WG_THREADS>()];
    load_values<HS, WG_THREADS>(q_next, q_head, row_stride, first_tile * QUERIES, T);
    load_values<HS, WG_THREADS>(do_next, do_head, C, first_tile * QUERIES, T);
    float stat_next = load_stat(first_tile * QUERIES);
    store_values_transposed<HS, WG_THREADS>(stages + 2 * TILE, q_next);
    store_values_transposed<HS, WG_THREADS>(stages + 3 * TILE, do_next);
    store_stat(stats, stat_next);
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    const float* k_rows = k_panel + WG_QUERIES * group * 32;  // the warpgroup's rows of every panel
    const float* v_rows = v_panel + WG_QUERIES * group * 32;

    for (int tile = first_tile; tile < num_tiles; tile++) {
        cp_async_wait_all();
        fence_proxy_async();  // this thread's tile writes, visible to the tensor cores after the barrier
        block.sync();         // the tile is in; every warpgroup is done with the other stage
        int parity = (tile - first_tile) & 1;
        const float* stage = stages + parity * STAGE;
        const float* stage_stats = stats + parity * 2 * QUERIES;
        float* next_stage = stages + (parity ^ 1) * STAGE;
        bool next = tile + 1 < num_tiles;
        int query0 = tile * QUERIES;
        if (next) {
            load_panels<QUERIES, HS, WG_THREADS>(next_stage, q_head, row_stride, query0 + QUERIES, T);
            load_panels<QUERIES, HS, WG_THREADS>(next_stage + TILE, do_head, C, query0 + QUERIES, T);
            load_values<HS, WG_THREADS>(q_next, q_head, row_stride, query0 + QUERIES, T);
            load_values<HS, WG_THREADS>(do_next, do_head, C, query0 + QUERIES, T);
            stat_next = load_stat(query0 + QUERIES);
        }
        cp_async_commit();
        if (query0 + QUERIES - 1 >= group_key0) {  // some query at or after some key of the warpgroup
            float s[QUERIES / 8][4], dp[QUERIES / 8][4];
            wgmma_fence();
            wgmma_scores<HS>(s, k_rows, KEYS, stage, QUERIES);  // S^T = K q^T
            wgmma_scores<HS>(dp, v_rows, KEYS, stage + TILE, QUERIES);  // dP^T = V dout^T
            wgmma_commit();
            wgmma_wait_all();
            pin_registers<QUERIES / 2>(&s[0][0]);
            pin_registers<QUERIES / 2>(&dp[0][0]);
            if (query0 < warp_key0 + 15) {
                mask_causal<QUERIES, true>(s, warp_key0, query0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
            }
#pragma unroll
            for (int n = 0; n < QUERIES / 8; n++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int column = 8 * n + 2 * q + (i & 1);
                    float column_a = KIND == ATTENTION_SOFTMAX ? lse_in_exponent_units<false>(stage_stats[column])
                                                               : relu_row_scale(query0 + column);
                    probability_and_gradient<KIND, false>(s[n][i], dp[n][i], scale, exp_scale, column_a,
                                                          stage_stats[QUERIES + column]);
                    s[n][i] = tf32_round_for_mma(s[n][i]);
                    dp[n][i] = tf32_round_for_mma(dp[n][i]);
                }
            }
            wgmma_fence();
            wgmma_pv<HS>(dv, s, stage + 3 * TILE);  // P^T dout, as P V
            wgmma_pv<HS>(dk, dp, stage + 2 * TILE);  // dS^T q
            wgmma_commit();
            wgmma_wait_all();
            pin_registers<HS / 2>(&dv[0][0]);
            pin_registers<HS / 2>(&dk[0][0]);
        }
        if (next) {
            store_values_transposed<HS, WG_THREADS>(next_stage + 2 * TILE, q_next);
            store_values_transposed<HS, WG_THREADS>(next_stage + 3 * TILE, do_next);
            store_stat(stats + (parity ^ 1) * 2 * QUERIES, stat_next);
        }
    }

    size_t tokens = gridDim.x / NH * (size_t)T, dk_row = C + h * HS;  // dK's first row of dqkv_t; dV's C on
    float* partials = bias_partials + (b * ceil_div(T, FLASH_ROWS) + key0 / FLASH_ROWS) * row_stride + dk_row;
    float* dk_t = dqkv_t + dk_row * tokens + b * T;
    store_wgmma_columns<HS>(dk_t, tokens, dk, scale, key0, warp_row, T, partials, row_stride, stages, g, q);
    store_wgmma_columns<HS>(dk_t + C * tokens, tokens, dv, 1.0f, key0, warp_row, T, partials + C, row_stride, stages,
                            g, q);  // stages: free after the last tile
#endif
}

// The trainer's backward launcher with variant 6's dK/dV kernel in place of its own.
struct FlashBackwardWgmmaDkdv {
    FlashBackward trainer;
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        trainer.run_dq<KIND, HS, SPLIT, FLASH_DQ_KEYS>();
        if constexpr (SPLIT || HS > 64) {
            trainer.run_dkdv<KIND, HS, SPLIT, flash_dkdv_queries(HS, SPLIT)>();
        } else {
            static bool configured = false;
            size_t shared = (2 * WG_CTA_QUERIES * HS + 8 * WG_KEYS * HS + 4 * WG_KEYS) * sizeof(float) + 1024;
            flash_set_shared(flash_backward_dkdv_wgmma_kernel<KIND, HS>, shared, &configured);
            const FlashBackward& t = trainer;
            dim3 grid(t.B * t.NH, ceil_div(t.T, WG_CTA_QUERIES));
            flash_backward_dkdv_wgmma_kernel<KIND, HS><<<grid, WG_THREADS, shared>>>(
                t.dqkv_t, t.bias_partials, t.dout, t.qkv, t.lse, t.delta, t.T, t.NH);
            cudaCheck(cudaGetLastError());
        }
        trainer.sum_bias(HS, FLASH_ROWS);
    }
};

// ----------------------------------------------------------------------------------------------
// Variant 7: variant 4 with a pipelined Hopper forward (TF32, hs <= 64; hs = 128 runs variant 4's
// kernel, its stages would pass the shared-memory limit). flash_forward_wgmma_kernel runs each
// warpgroup's tile as a chain (S = Q K^T, wait, softmax, O += P V, wait) and the CTA's warpgroups
// in step (one barrier per tile, the threads loading and transposing the next tile between). Here:
//   - a CTA of three warpgroups, one per multiprocessor: a producer and two consumers of 64 queries
//     each (setmaxnreg moves 16 registers per thread from the producer to the consumers: without
//     it the hs = 64 kernels spill 20 bytes; the producer's unrolled copies hold many addresses);
//   - the producer copies K (panels) and V (rows padded by 4 floats) with cp.async into one of
//     PP_STAGES stages, two tiles in flight, then writes V^T from the stage's rows; a stage's `full`
//     mbarrier says its K and V^T are in, its `empty` mbarrier that both consumers are done with it;
//   - a consumer issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1}, waits for S_j only, and runs
//     the softmax of tile j while the tensor cores multiply P_{j-1} V_{j-1} (P in its own registers).
// Same products in the same order as variant 4 (the checks print the same errors). Slower (H100,
// B=16 hs=64: 0.218-0.226 ms against 0.189-0.192 softmax): one CTA of two consumers per
// multiprocessor is half the warps of variant 4's two CTAs, and the overlap inside a consumer
// does not make up for it. Also measured, with no gain (within 0.01 ms): four stages with the V
// rows in a ring of their own, and the consumers taking turns to issue (FA3's ping-pong, named
// barriers), so that one's softmax runs beside the other's products.

constexpr int PP_STAGES = 3;
constexpr int PP_THREADS = 3 * 128;

template <int N>
__device__ __forceinline__ void cp_async_wait_pending() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void wgmma_wait_newest() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

// Rows [key0, key0 + WG_KEYS) of a head's v into a stage's padded rows (cp.async by the producer's
// 128 threads; rows >= T as 0).
template <int HS>
__device__ void load_value_rows(float* rows, const float* v_head, size_t row_stride, int key0, int T) {
    constexpr int CHUNKS = HS / 4;
#pragma unroll
    for (int pass = 0; pass < WG_KEYS * CHUNKS / 128; pass++) {
        int idx = threadIdx.x + pass * 128, row = idx / CHUNKS, c = idx % CHUNKS;
        bool valid = key0 + row < T;
        cp_async16(rows + row * (HS + 4) + 4 * c, valid ? v_head + (size_t)(key0 + row) * row_stride + 4 * c : v_head,
                   valid);
    }
}

// The padded rows into V^T as store_values_transposed writes it: producer thread t takes key t % 64
// and half t / 64 of the head dimension.
template <int HS>
__device__ void transpose_value_rows(float* v_t, const float* rows) {
    constexpr int PIECES = HS / 8;  // float4 per thread
    int key = threadIdx.x % WG_KEYS, d0 = threadIdx.x / WG_KEYS * (HS / 2), col = value_position(key);
#pragma unroll
    for (int i = 0; i < PIECES; i++) {
        float4 v = *(const float4*)(rows + key * (HS + 4) + d0 + 4 * i);
        int d = d0 + 4 * i;
        v_t[panel_offset(d, col, HS)] = v.x;
        v_t[panel_offset(d + 1, col, HS)] = v.y;
        v_t[panel_offset(d + 2, col, HS)] = v.z;
        v_t[panel_offset(d + 3, col, HS)] = v.w;
    }
}

template <int HS>
struct PipelinedShared {
    static constexpr int TILE = WG_KEYS * HS, ROWS = WG_KEYS * (HS + 4);
    // q, then PP_STAGES of K, of V^T and of padded V rows, then the mbarriers; + 1024 for the alignment
    static constexpr size_t BYTES = (WG_CTA_QUERIES * HS + PP_STAGES * (2 * TILE + ROWS)) * sizeof(float) +
                                    2 * PP_STAGES * sizeof(uint64_t) + 1024;
};

template <AttentionKind KIND, int HS>
__device__ __forceinline__ void pipelined_producer(float* q_tile, float* k_stages, float* vt_stages, float* v_rows, uint64_t* full,
                                   uint64_t* empty, const float* q_head, size_t row_stride, int C, int query0,
                                   int num_tiles, int T) {
    using S = PipelinedShared<HS>;
    // Iteration `tile` hands over tile - 2 (its copies are in), then starts copying `tile` into its
    // stage once both consumers are done with the stage's previous tile (handed over earlier).
    for (int tile = 0; tile < num_tiles + 2; tile++) {
        if (tile >= 2) {
            int stage = (tile - 2) % PP_STAGES;
            cp_async_wait_pending<1>();  // groups up to tile - 2 are in
            producer_sync();             // for every producer thread (and none still reads the rows it reuses)
            transpose_value_rows<HS>(vt_stages + stage * S::TILE, v_rows + stage * S::ROWS);
            fence_proxy_async();  // the copies and V^T, visible to the tensor cores
            mbarrier_arrive(&full[stage]);
        }
        if (tile < num_tiles) {
            int stage = tile % PP_STAGES;
            if (tile >= PP_STAGES) { mbarrier_wait(&empty[stage], (tile / PP_STAGES - 1) & 1); }
            if (tile == 0) { load_panels<WG_CTA_QUERIES, HS, 128>(q_tile, q_head, row_stride, query0, T); }
            load_panels<WG_KEYS, HS, 128>(k_stages + stage * S::TILE, q_head + C, row_stride, tile * WG_KEYS, T);
            load_value_rows<HS>(v_rows + stage * S::ROWS, q_head + 2 * C, row_stride, tile * WG_KEYS, T);
        }
        cp_async_commit();  // empty groups past the end keep the count
    }
}

template <AttentionKind KIND, int HS>
__device__ __forceinline__ void pipelined_consumer(float* out, float* lse, const float* q_tile, const float* k_stages,
                                   const float* vt_stages, uint64_t* full, uint64_t* empty, size_t b, int h, int NH,
                                   int T, int query0, int num_tiles, int consumer) {
    using S = PipelinedShared<HS>;
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3;
    int group_query0 = query0 + WG_QUERIES * consumer, warp_query0 = group_query0 + 16 * (warp.meta_group_rank() % 4);
    int my_tiles = min(num_tiles, group_query0 / WG_KEYS + 1);  // up to the diagonal
    const float* q_rows = q_tile + WG_QUERIES * consumer * 32;  // the warpgroup's rows of every panel
    float scale = rsqrtf((float)HS), exp_scale = exponent_scale<false>(scale);
    float o[HS / 8][4] = {}, p[WG_KEYS / 8][4];  // p: the previous tile's P, TF32, until its product is done
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    // One tile: S = Q K^T, with the previous tile's O += P V behind it when there is one (FIRST:
    // there is none), the softmax while that runs, then O rescaled and P for the next tile's product.
    auto step = [&](int tile, auto first) {
        constexpr bool FIRST = decltype(first)::value;
        int stage = tile % PP_STAGES, previous = (tile + PP_STAGES - 1) % PP_STAGES;
        mbarrier_wait(&full[stage], (tile / PP_STAGES) & 1);
        float s[WG_KEYS / 8][4];
        wgmma_fence();
        wgmma_scores<HS>(s, q_rows, WG_CTA_QUERIES, k_stages + stage * S::TILE, WG_KEYS);
        wgmma_commit();
        if constexpr (FIRST) {
            wgmma_wait_all();
        } else {
            wgmma_pv<HS>(o, p, vt_stages + previous * S::TILE);
            wgmma_commit();
            wgmma_wait_newest();  // S is in; P_{j-1} V_{j-1} may still run
        }
        pin_registers<WG_KEYS / 2>(&s[0][0]);
        int key0 = tile * WG_KEYS;
        if (key0 + WG_KEYS - 1 > warp_query0) {
            mask_causal<WG_KEYS, false>(s, warp_query0, key0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
        }
        float correction[2] = {1.0f, 1.0f};
        if (KIND == ATTENTION_SOFTMAX) { online_softmax<WG_KEYS, false>(s, row_max, row_sum, correction, exp_scale, warp); }
        if constexpr (!FIRST) {
            wgmma_wait_all();
            pin_registers<HS / 2>(&o[0][0]);
            pin_registers<WG_KEYS / 2>(&p[0][0]);
            mbarrier_arrive(&empty[previous]);
        }
        scale_accumulator_rows<HS>(o, correction);
        probabilities_for_pv<KIND>(p, s, scale);
    };
    step(0, std::true_type());
    for (int tile = 1; tile < my_tiles; tile++) { step(tile, std::false_type()); }
    int last = (my_tiles - 1) % PP_STAGES;
    wgmma_fence();
    wgmma_pv<HS>(o, p, vt_stages + last * S::TILE);
    wgmma_commit();
    wgmma_wait_all();
    pin_registers<HS / 2>(&o[0][0]);
    mbarrier_arrive(&empty[last]);
    store_forward_rows<KIND, HS>(out, lse, o, row_max, row_sum, b, h, NH, T, warp_query0, scale, warp);
}

template <AttentionKind KIND, int HS>
__global__ void __launch_bounds__(PP_THREADS, 1) flash_forward_pipelined_kernel(float* out, float* lse,
                                                                               const float* qkv, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = PipelinedShared<HS>;
    extern __shared__ float shared_raw[];
    float* q_tile = shared_aligned_1024(shared_raw);
    float* k_stages = q_tile + WG_CTA_QUERIES * HS;
    float* vt_stages = k_stages + PP_STAGES * S::TILE;
    float* v_rows = vt_stages + PP_STAGES * S::TILE;
    uint64_t* full = (uint64_t*)(v_rows + PP_STAGES * S::ROWS);
    uint64_t* empty = full + PP_STAGES;
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C;
    int query0 = (gridDim.y - 1 - blockIdx.y) * WG_CTA_QUERIES;  // the heaviest query blocks start first
    int num_tiles = ceil_div(min(query0 + WG_CTA_QUERIES, T), WG_KEYS);
    const float* q_head = qkv + b * T * row_stride + h * HS;
    if (threadIdx.x == 0) {
        for (int stage = 0; stage < PP_STAGES; stage++) {
            mbarrier_init(&full[stage], 128);   // the producer's threads
            mbarrier_init(&empty[stage], 256);  // both consumers' threads
        }
    }
    __syncthreads();
    // the role from lane 0, uniform to the compiler (wgmma under a non-uniform branch is serialised)
    int role = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);
    constexpr int PRODUCER_REGISTERS = 152, CONSUMER_REGISTERS = 176;  // 128 x 152 + 256 x 176 <= 64K
    if (role == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGISTERS));
        pipelined_producer<KIND, HS>(q_tile, k_stages, vt_stages, v_rows, full, empty, q_head, row_stride, C, query0,
                                     num_tiles, T);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGISTERS));
        pipelined_consumer<KIND, HS>(out, lse, q_tile, k_stages, vt_stages, full, empty, b, h, NH, T, query0,
                                     num_tiles, role - 1);
    }
#endif
}

// The trainer's forward launcher with variant 7's kernel for hs <= 64 in TF32 mode.
struct FlashForwardPipelined {
    FlashForward trainer;
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        if constexpr (SPLIT || HS > 64) {
            trainer.run<KIND, HS, SPLIT>();
        } else {
            static bool configured = false;
            size_t shared = PipelinedShared<HS>::BYTES;
            flash_set_shared(flash_forward_pipelined_kernel<KIND, HS>, shared, &configured);
            const FlashForward& t = trainer;
            dim3 grid(t.B * t.NH, ceil_div(t.T, WG_CTA_QUERIES));
            flash_forward_pipelined_kernel<KIND, HS><<<grid, PP_THREADS, shared>>>(t.out, t.lse, t.qkv, t.T, t.NH);
            cudaCheck(cudaGetLastError());
        }
    }
};

// ----------------------------------------------------------------------------------------------
// Variant 8: variant 4 with one backward kernel (TF32, hs <= 64, T % 4 == 0; else the trainer's
// two): the dK/dV kernel's CTA per 64 keys also multiplies its dS by its keys, dQ's share of those
// keys, and adds it into dQ (kept in dqkv_t) in a fixed order, so the bits do not depend on
// scheduling:
//   - a CTA takes query tiles from its diagonal to T, and tile i receives the shares of key blocks
//     i, i - 1, ..., 0 in that order: block j waits on the tile's counter to read i - j, adds (the
//     diagonal block stores), and sets it to i - j + 1 (block 0, which adds last, back to 0 for the
//     next launch); running side by side, block j + 1 has passed tile i a step before block j;
//   - CTAs take their (head, key block) from a counter (atomicInc), a head's blocks one after the
//     other from the last, so a block only ever waits on a block that already runs or ran (no
//     deadlock, whatever the hardware's launch order), and a tile's adds stay close in time (L2);
//   - the adds are bulk copies (cp.reduce.async.bulk .add.f32, done in L2) of the share staged in
//     shared memory, one 256-byte row per dimension, with the share's column sums (the tile's
//     bias partials) alike; the CTA waits for them at the top of its next tile;
//   - delta (softmax) comes from a small kernel before, as the dQ kernel no longer runs.
// dS goes through shared memory (dS^T rows are keys, as the dK/dV products hold it) to become the
// B operand of dQ^T (hs x 16 queries per warp) = K^T dS^T, K staying in shared memory as well.
// Slower than the trainer's two kernels (H100, B=16, backward ms, softmax / ReLU): 0.83 / 0.81
// against 0.68 / 0.65 (0.84 / 0.81 against 0.69 / 0.66 in a second call). Without the adds (dQ
// wrong) it took 0.62 / 0.56: the products gain 10% in one kernel, and the ordered adds cost
// more, the wait for each tile's adds being exposed (2 CTAs per multiprocessor, 255 registers,
// leave little to overlap). Also measured (softmax):
// the adds as loads and stores from registers 0.94 ms (1.95 with one load in flight); in
// key-block-major order (tiles from T down, the adds in order 0, 1, ..., i) 1.00 ms; as red.add
// 1.06 ms; with the wait deferred (warp 0 issuing, and passing the tile on after the next tile's
// products, or at the end of it) 0.99 and 1.04 ms: the next block then waits for it.

// delta[(b, h, t)] = dout . out over the head's hs columns; HS / 4 lanes per row.
template <int HS>
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* out, int rows, int T, int NH) {
    constexpr int LANES = HS / 4;
    cg::thread_block_tile<LANES> lanes = cg::tiled_partition<LANES>(cg::this_thread_block());
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / LANES;  // (b, t, h): token-major, as stored
    if (row >= (size_t)rows) { return; }
    float4 d = ((const float4*)dout)[row * LANES + lanes.thread_rank()];
    float4 o = ((const float4*)out)[row * LANES + lanes.thread_rank()];
    float sum = cg::reduce(lanes, sum4(d * o), cg::plus<float>());
    size_t bt = row / NH, b = bt / T;
    int h = row % NH, t = bt % T;
    if (lanes.thread_rank() == 0) { delta[(b * NH + h) * T + t] = sum; }
}

// delta for the softmax backward of the variants without the trainer's dQ kernel, which writes it.
template <AttentionKind KIND, int HS>
static void launch_attention_delta(const FlashBackward& t) {
    if (KIND != ATTENTION_SOFTMAX) { return; }
    int rows = t.B * t.NH * t.T;
    attention_delta_kernel<HS><<<ceil_div((size_t)rows * HS / 4, 256), 256>>>(t.delta, t.dout, t.out, rows, t.T, t.NH);
    cudaCheck(cudaGetLastError());
}

// A launcher's scratch, kept between launches and grown to `bytes` when smaller (then zeroed).
static void* lab_scratch(void** buffer, size_t* capacity, size_t bytes, const char* what) {
    if (bytes > *capacity) {
        if (*buffer != nullptr) { cudaCheck(cudaFree(*buffer)); }
        *buffer = device_malloc(bytes, what);
        cudaCheck(cudaMemset(*buffer, 0, bytes));
        *capacity = bytes;
    }
    return *buffer;
}

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(unsigned int* p, unsigned int v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Bulk copies shared -> global (sm_90): a plain store, or an add of fp32 values done in L2; each
// issuing thread commits its copies as a group and waits for their completion.
__device__ __forceinline__ void bulk_store(float* dst, const float* src, int bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
                 "r"((uint32_t)__cvta_generic_to_shared(src)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_add(float* dst, const float* src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
                 "r"((uint32_t)__cvta_generic_to_shared(src)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

constexpr int FUSED_QUERIES = 64;                   // queries per tile = FLASH_ROWS: one tile per dQ block
constexpr int FUSED_DS_STRIDE = FUSED_QUERIES + 4;  // dS^T rows: conflict-free B fragment loads

// counters: [0] the work counter, then one per (b, h, query tile), all 0 between launches.
template <AttentionKind KIND, int HS>
__global__ void __launch_bounds__(FLASH_THREADS, 2)
    flash_backward_fused_kernel(float* dqkv_t, float* bias_partials, unsigned int* counters, const float* dout,
                                const float* qkv, const float* lse, const float* delta, int B, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int QUERIES = FUSED_QUERIES, TILE = QUERIES * HS, STAGE = 2 * TILE + 2 * QUERIES;
    static_assert(QUERIES == FLASH_ROWS && HS <= 64, "a query tile is one block of dQ and of the bias partials");
    extern __shared__ float smem[];  // two stages of load_query_stage, the K tile, dS^T, column sums
    float* k_tile = smem + 2 * STAGE;
    float* ds_tile = k_tile + FLASH_ROWS * HS;
    float* q_sums = ds_tile + FLASH_ROWS * FUSED_DS_STRIDE;  // FLASH_WARPS x HS
    float* q_stage = q_sums + FLASH_WARPS * HS;              // HS: the tile's bias partials
    __shared__ unsigned int work;
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3, w = warp.meta_group_rank(), warp_row = 16 * w;
    FragmentOffsets off = fragment_offsets<HS>(g, q);
    int num_blocks = ceil_div(T, FLASH_ROWS), num_tiles = ceil_div(T, QUERIES);
    if (threadIdx.x == 0) { work = atomicInc(&counters[0], (unsigned int)(B * NH * num_blocks) - 1); }
    block.sync();
    int head = work / num_blocks, key_block = num_blocks - 1 - work % num_blocks;
    int C = NH * HS, h = head % NH;
    size_t b = head / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    size_t tokens = (size_t)B * T;
    int key0 = key_block * FLASH_ROWS, warp_key0 = key0 + warp_row;
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    float* dq_t = dqkv_t + h * HS * tokens + b * T;
    unsigned int* tile_counters = counters + 1 + (b * NH + h) * num_tiles;
    int first_tile = key0 / QUERIES;
    float scale = rsqrtf((float)HS), exp_scale = exponent_scale<false>(scale);

    load_query_stage<KIND, HS, QUERIES>(smem, q_head, do_head, lse + head_rows, delta + head_rows, row_stride, C,
                                        first_tile * QUERIES, T);
    load_tile<FLASH_ROWS, HS>(k_tile, q_head + C, row_stride, key0, T);
    cp_async_commit();
    float k_frag[HS / 8][4], v_frag[HS / 8][4];
    load_a_global<HS, false>(k_frag, q_head + C, row_stride, warp_key0, T, g, q);
    load_a_global<HS, false>(v_frag, q_head + 2 * C, row_stride, warp_key0, T, g, q);
    float dk[HS / 16][2][4] = {}, dv[HS / 16][2][4] = {};  // transposed

    // The previous tile's copies are complete (their issuing threads wait), then it is passed on.
    auto pass_on = [&](int previous) {
        if (threadIdx.x < HS) { bulk_wait_all(); }
        block.sync();
        if (threadIdx.x == 0) {
            fence_proxy_async_global();
            __threadfence();
            int last_block = min(previous * QUERIES + QUERIES - 1, T - 1) / FLASH_ROWS;
            store_release(&tile_counters[previous], key_block == 0 ? 0u : (unsigned int)(last_block - key_block) + 1);
        }
    };
    for (int tile = first_tile, step = 0; tile < num_tiles; tile++, step++) {
        cp_async_wait_all();
        if (step > 0) { pass_on(tile - 1); }
        else { block.sync(); }
        if (tile + 1 < num_tiles) {
            load_query_stage<KIND, HS, QUERIES>(smem + ((step + 1) & 1) * STAGE, q_head, do_head, lse + head_rows,
                                                delta + head_rows, row_stride, C, (tile + 1) * QUERIES, T);
        }
        cp_async_commit();
        int query0 = tile * QUERIES;
        const float* q_tile = smem + (step & 1) * STAGE;
        const float *do_tile = q_tile + TILE, *stat_a = q_tile + 2 * TILE, *stat_b = stat_a + QUERIES;
        float dp[QUERIES / 8][4];  // dS^T: rows are keys, columns queries
        if (query0 + QUERIES - 1 >= warp_key0) {
            float s[QUERIES / 8][4];
            scores_from_registers<HS, QUERIES, false>(s, k_frag, q_tile, off);
            if (query0 < warp_key0 + 15) {
                mask_causal<QUERIES, true>(s, warp_key0, query0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
            }
            scores_from_registers<HS, QUERIES, false>(dp, v_frag, do_tile, off);
#pragma unroll
            for (int n = 0; n < QUERIES / 8; n++) {
                float2 pair_a = *(const float2*)(stat_a + 8 * n + 2 * q);
                float2 pair_b = *(const float2*)(stat_b + 8 * n + 2 * q);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float column_a = (i & 1) ? pair_a.y : pair_a.x, column_b = (i & 1) ? pair_b.y : pair_b.x;
                    if (KIND == ATTENTION_SOFTMAX) { column_a = lse_in_exponent_units<false>(column_a); }
                    probability_and_gradient<KIND, false>(s[n][i], dp[n][i], scale, exp_scale, column_a, column_b);
                    s[n][i] = tf32_round_for_mma(s[n][i]);
                    dp[n][i] = tf32_round_for_mma(dp[n][i]);
                }
            }
            accumulate_transposed<HS, QUERIES, false>(dv, s, do_tile, off);
            accumulate_transposed<HS, QUERIES, false>(dk, dp, q_tile, off);
        } else {
            zero_fragments<QUERIES / 8>(dp);  // every query before every key of this warp
        }
#pragma unroll
        for (int n = 0; n < QUERIES / 8; n++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                *(float2*)(ds_tile + (warp_row + g + 8 * half) * FUSED_DS_STRIDE + 8 * n + 2 * q) =
                    make_float2(dp[n][2 * half], dp[n][2 * half + 1]);
            }
        }
        block.sync();
        // dQ^T share (hs x the warp's 16 queries) = K^T dS^T: dS (queries x keys) as C fragments
        float ds[FLASH_ROWS / 8][4], dq[HS / 16][2][4] = {};
        const float* ds_col = ds_tile + warp_row + g;
#pragma unroll
        for (int ks = 0; ks < FLASH_ROWS / 8; ks++) {
            const float* row = ds_col + (8 * ks + 2 * q) * FUSED_DS_STRIDE;
            ds[ks][0] = row[0], ds[ks][1] = row[FUSED_DS_STRIDE];
            ds[ks][2] = row[8], ds[ks][3] = row[FUSED_DS_STRIDE + 8];
        }
        block.sync();  // every warp holds its dS: the tile's space takes the share
        accumulate_transposed<HS, FLASH_ROWS, false>(dq, ds, k_tile, off);

        // The share times the scale into dq_stage[dimension][query], its sums per dimension over the
        // warp's queries into q_sums[warp][dimension]; thread rows 8nt + 2q + r, dims 16mt + 2g + e.
        float* dq_stage = ds_tile;
        int warp_query0 = query0 + warp_row;
#pragma unroll
        for (int mt = 0; mt < HS / 16; mt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    float2 v = make_float2(dq[mt][nt][2 * e] * scale, dq[mt][nt][2 * e + 1] * scale);
                    int row = warp_query0 + 8 * nt + 2 * q;  // T % 4 == 0: both rows or neither are < T
                    if (row >= T) { v = make_float2(0.0f, 0.0f); }
                    *(float2*)(dq_stage + (16 * mt + 2 * g + e) * FUSED_DS_STRIDE + warp_row + 8 * nt + 2 * q) = v;
                    sum += v.x + v.y;
                }
                sum += warp.shfl_xor(sum, 1);
                sum += warp.shfl_xor(sum, 2);
                if (q == 0) { q_sums[w * HS + 16 * mt + 2 * g + e] = sum; }
            }
        }
        // Added after the key blocks after this one (the diagonal block stores) by the bulk copy
        // engine, each dimension's row of the tile and the tile's bias partials, in the order the
        // counter sets; the tile is passed on at the top of the next one.
        int last_block = min(query0 + QUERIES - 1, T - 1) / FLASH_ROWS;
        bool first = key_block == last_block;
        if (threadIdx.x == 0) {
            while (load_acquire(&tile_counters[tile]) != (unsigned int)(last_block - key_block)) {}
        }
        fence_proxy_async();
        block.sync();
        if (threadIdx.x < HS) {
            int d = threadIdx.x, bytes = min(QUERIES, T - query0) * (int)sizeof(float);
            float* dst = dq_t + (size_t)d * tokens + query0;
            fence_proxy_async_global();
            if (first) { bulk_store(dst, dq_stage + d * FUSED_DS_STRIDE, bytes); }
            else { bulk_add(dst, dq_stage + d * FUSED_DS_STRIDE, bytes); }
            float sum = q_sums[d];
            for (int k = 1; k < FLASH_WARPS; k++) { sum += q_sums[k * HS + d]; }
            q_stage[d] = sum;
            fence_proxy_async();
            asm volatile("bar.sync 1, %0;" ::"r"(HS) : "memory");  // the HS issuing threads
            if (d == 0) {
                float* partials = bias_partials + (b * num_blocks + tile) * row_stride + h * HS;
                if (first) { bulk_store(partials, q_stage, HS * (int)sizeof(float)); }
                else { bulk_add(partials, q_stage, HS * (int)sizeof(float)); }
            }
            bulk_commit();
        }
    }
    pass_on(num_tiles - 1);
    float dk_scale[4] = {scale, scale, scale, scale}, dv_scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    float* dk_t = dqkv_t + (C + h * HS) * tokens + b * T;
    float* partials = bias_partials + (b * num_blocks + key_block) * row_stride + C + h * HS;
    store_columns<HS>(dk_t, tokens, dk, dk_scale, key0, warp_row, T, partials, smem, g, q);
    store_columns<HS>(dk_t + C * tokens, tokens, dv, dv_scale, key0, warp_row, T, partials + C, smem, g, q);
#endif
}

// The trainer's backward launcher with variant 8's kernels for hs <= 64 in TF32 mode.
struct FlashBackwardFused {
    FlashBackward trainer;
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        if constexpr (SPLIT || HS > 64) {
            trainer.run<KIND, HS, SPLIT>();
        } else if (trainer.T % 4 != 0) {  // the bulk copies move 16-byte pieces
            trainer.run<KIND, HS, SPLIT>();
        } else {
            const FlashBackward& t = trainer;
            launch_attention_delta<KIND, HS>(t);
            static void* buffer = nullptr;
            static size_t capacity = 0;
            size_t needed = 1 + (size_t)t.B * t.NH * ceil_div(t.T, FUSED_QUERIES);
            unsigned int* counters = (unsigned int*)lab_scratch(&buffer, &capacity, needed * sizeof(unsigned int),
                                                                "fused backward counters");
            static bool configured = false;
            size_t shared = (2 * (2 * FUSED_QUERIES * HS + 2 * FUSED_QUERIES) + FLASH_ROWS * HS +
                             FLASH_ROWS * FUSED_DS_STRIDE + (FLASH_WARPS + 1) * HS) * sizeof(float);
            flash_set_shared(flash_backward_fused_kernel<KIND, HS>, shared, &configured);
            unsigned int grid = t.B * t.NH * ceil_div(t.T, FLASH_ROWS);
            flash_backward_fused_kernel<KIND, HS><<<grid, FLASH_THREADS, shared>>>(
                t.dqkv_t, t.bias_partials, counters, t.dout, t.qkv, t.lse, t.delta, t.B, t.T, t.NH);
            cudaCheck(cudaGetLastError());
            t.sum_bias(HS, FLASH_ROWS);
        }
    }
};

// ----------------------------------------------------------------------------------------------
// Variant 9: variant 4 with dS through memory (TF32, hs <= 64; else the trainer's two kernels): the
// dK/dV kernel, which computes every dS of the causal half anyway, also stores it, and dQ = dS K
// reads it back instead of computing S, P, dP and dS a second time (5 products instead of 7):
//   1. delta = dout . out per query (softmax), by attention_delta_kernel (variant 8's);
//   2. the trainer's dK/dV kernel (its tiles by dkdv_tile), plus a store of each tile's dS^T: one
//      64 x 64 block per (query block i, key block j <= i) of a head, blocks in the order (0,0),
//      (1,0), (1,1), (2,0), ..., each [key][query] as the kernel holds it (every warp computes
//      every tile, as QUERIES is FLASH_ROWS, so the masked pairs are stored as 0);
//   3. dQ: one CTA per 64 queries of a head loops over its key blocks, each dS^T block and K tile
//      double-buffered in shared memory, dQ^T += K^T dS^T as the trainer's dQ kernel (C fragments
//      of dS from the padded block); written transposed with its bias partials by store_columns.
// The blocks take B NH n(n+1)/2 x 16 KB, n = ceil(T / 64): 428 MB at B=16, T=1024, NH=12.
// Correct and deterministic, but slower than the trainer's two kernels (H100, backward ms, softmax /
// ReLU): B=16 0.772-0.775 / 0.793-0.820 against 0.680 / 0.650-0.663, B=8 0.380 / 0.371 against
// 0.350 / 0.335.
// Each kernel alone (B=16, the other left out): the trainer's dQ kernel 0.28-0.31 ms and dK/dV 0.40;
// here dK/dV with the stores 0.49-0.54 and dQ from the stored dS 0.27. Writing the 428 MB costs the
// dK/dV kernel more than 0.1 ms, and reading it back (1.6 TB/s, with K from L2) takes as long as
// the three products it replaces.

constexpr int DS_BLOCK = FLASH_ROWS * FLASH_ROWS;  // floats in one dS^T block
constexpr int DS_STRIDE = FLASH_ROWS + 4;          // shared dS^T rows: conflict-free C fragment loads

__host__ __device__ inline size_t ds_blocks_per_head(int T) {
    size_t n = ceil_div(T, FLASH_ROWS);
    return n * (n + 1) / 2;
}

template <AttentionKind KIND, int HS>
__global__ void __launch_bounds__(FLASH_THREADS, 2)
    flash_backward_dkdv_ds_kernel(float* dqkv_t, float* bias_partials, float* ds, const float* dout,
                                  const float* qkv, const float* lse, const float* delta, int T, int NH) {
#if __CUDA_ARCH__ >= 800
    constexpr int QUERIES = FLASH_ROWS, TILE = QUERIES * HS, STAGE = 2 * TILE + 2 * QUERIES;
    extern __shared__ float smem[];  // two stages of load_query_stage
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3, warp_row = 16 * warp.meta_group_rank();
    FragmentOffsets off = fragment_offsets<HS>(g, q);
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    int key_block = blockIdx.y, key0 = key_block * FLASH_ROWS, warp_key0 = key0 + warp_row;
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    float* ds_head = ds + (b * NH + h) * ds_blocks_per_head(T) * DS_BLOCK;
    int num_tiles = ceil_div(T, QUERIES);
    float scale = rsqrtf((float)HS);

    load_query_stage<KIND, HS, QUERIES>(smem, q_head, do_head, lse + head_rows, delta + head_rows, row_stride, C,
                                        key0, T);
    cp_async_commit();
    float k_frag[HS / 8][4], v_frag[HS / 8][4];
    load_a_global<HS, false>(k_frag, q_head + C, row_stride, warp_key0, T, g, q);
    load_a_global<HS, false>(v_frag, q_head + 2 * C, row_stride, warp_key0, T, g, q);
    float dk[HS / 16][2][4] = {}, dv[HS / 16][2][4] = {};  // transposed

    for (int tile = key_block; tile < num_tiles; tile++) {
        cp_async_wait_all();
        block.sync();
        if (tile + 1 < num_tiles) {
            load_query_stage<KIND, HS, QUERIES>(smem + ((tile + 1 - key_block) & 1) * STAGE, q_head, do_head,
                                                lse + head_rows, delta + head_rows, row_stride, C,
                                                (tile + 1) * QUERIES, T);
        }
        cp_async_commit();
        float s[QUERIES / 8][4], dp[QUERIES / 8][4];
        dkdv_tile<KIND, HS, false, true, QUERIES>(dk, dv, s, dp, k_frag, v_frag, nullptr, nullptr,
                                                  smem + ((tile - key_block) & 1) * STAGE, warp_row, warp_key0,
                                                  tile * QUERIES, scale, off, g, q);
        float* ds_block = ds_head + ((size_t)tile * (tile + 1) / 2 + key_block) * DS_BLOCK;  // dS^T: rows are keys
#pragma unroll
        for (int n = 0; n < QUERIES / 8; n++) {
            float* ds_row = ds_block + (warp_row + g) * FLASH_ROWS + 8 * n + 2 * q;
            *(float2*)ds_row = make_float2(dp[n][0], dp[n][1]);
            *(float2*)(ds_row + 8 * FLASH_ROWS) = make_float2(dp[n][2], dp[n][3]);
        }
    }
    float dk_scale[4] = {scale, scale, scale, scale}, dv_scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    size_t tokens = gridDim.x / NH * (size_t)T;
    float* dk_t = dqkv_t + (C + h * HS) * tokens + b * T;
    float* partials = bias_partials + (b * gridDim.y + blockIdx.y) * row_stride + C + h * HS;
    store_columns<HS>(dk_t, tokens, dk, dk_scale, key0, warp_row, T, partials, smem, g, q);
    store_columns<HS>(dk_t + C * tokens, tokens, dv, dv_scale, key0, warp_row, T, partials + C, smem, g, q);
#endif
}

// Starts copying key block j's dS^T block (rows padded to DS_STRIDE) and K tile into a stage.
template <int HS>
__device__ void load_ds_stage(float* stage, const float* ds_row_blocks, const float* k_head, size_t row_stride,
                              int j, int T) {
    const float* src = ds_row_blocks + (size_t)j * DS_BLOCK;
    for (int idx = threadIdx.x; idx < DS_BLOCK / 4; idx += FLASH_THREADS) {
        int row = idx / (FLASH_ROWS / 4), c = 4 * (idx % (FLASH_ROWS / 4));
        cp_async16(stage + row * DS_STRIDE + c, src + row * FLASH_ROWS + c, true);
    }
    load_tile<FLASH_ROWS, HS>(stage + FLASH_ROWS * DS_STRIDE, k_head, row_stride, j * FLASH_ROWS, T);
}

template <int HS>
__global__ void __launch_bounds__(FLASH_THREADS, 3)
    flash_backward_dq_from_ds_kernel(float* dqkv_t, float* bias_partials, const float* ds, const float* qkv, int T,
                                     int NH) {
#if __CUDA_ARCH__ >= 800
    constexpr int STAGE = FLASH_ROWS * DS_STRIDE + FLASH_ROWS * HS;
    extern __shared__ float smem[];  // two stages of load_ds_stage
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3, warp_row = 16 * warp.meta_group_rank();
    FragmentOffsets off = fragment_offsets<HS>(g, q);
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C;
    int query_block = gridDim.y - 1 - blockIdx.y, query0 = query_block * FLASH_ROWS;  // the heaviest first
    const float* k_head = qkv + b * T * row_stride + C + h * HS;
    const float* ds_row_blocks = ds + ((b * NH + h) * ds_blocks_per_head(T) +
                                       (size_t)query_block * (query_block + 1) / 2) * DS_BLOCK;
    float dq[HS / 16][2][4] = {};  // transposed

    load_ds_stage<HS>(smem, ds_row_blocks, k_head, row_stride, 0, T);
    cp_async_commit();
    for (int j = 0; j <= query_block; j++) {
        cp_async_wait_all();
        __syncthreads();
        if (j < query_block) { load_ds_stage<HS>(smem + ((j + 1) & 1) * STAGE, ds_row_blocks, k_head, row_stride, j + 1, T); }
        cp_async_commit();
        const float* ds_t = smem + (j & 1) * STAGE;  // [key][query]
        float x[FLASH_ROWS / 8][4];  // the warp's 16 x 64 dS in the C layout
#pragma unroll
        for (int n = 0; n < FLASH_ROWS / 8; n++) {
            const float* col = ds_t + (8 * n + 2 * q) * DS_STRIDE + warp_row + g;
            x[n][0] = col[0], x[n][1] = col[DS_STRIDE], x[n][2] = col[8], x[n][3] = col[DS_STRIDE + 8];
        }
        accumulate_transposed<HS, FLASH_ROWS, false>(dq, x, ds_t + FLASH_ROWS * DS_STRIDE, off);
    }
    float scale = rsqrtf((float)HS), row_scale[4] = {scale, scale, scale, scale};
    size_t tokens = gridDim.x / NH * (size_t)T;
    float* partials = bias_partials + (b * gridDim.y + query_block) * row_stride + h * HS;
    store_columns<HS>(dqkv_t + h * HS * tokens + b * T, tokens, dq, row_scale, query0, warp_row, T, partials, smem,
                      g, q);
#endif
}

// The trainer's backward launcher with variant 9's kernels for hs <= 64 in TF32 mode.
struct FlashBackwardDsMemory {
    FlashBackward trainer;
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        if constexpr (SPLIT || HS > 64) {
            trainer.run<KIND, HS, SPLIT>();
        } else {
            const FlashBackward& t = trainer;
            launch_attention_delta<KIND, HS>(t);
            static void* buffer = nullptr;
            static size_t capacity = 0;
            size_t needed = (size_t)t.B * t.NH * ds_blocks_per_head(t.T) * DS_BLOCK;
            float* ds = (float*)lab_scratch(&buffer, &capacity, needed * sizeof(float), "dS blocks");
            dim3 grid(t.B * t.NH, ceil_div(t.T, FLASH_ROWS));
            static bool dkdv_configured = false, dq_configured = false;
            size_t dkdv_shared = 2 * (2 * FLASH_ROWS * HS + 2 * FLASH_ROWS) * sizeof(float);
            flash_set_shared(flash_backward_dkdv_ds_kernel<KIND, HS>, dkdv_shared, &dkdv_configured);
            flash_backward_dkdv_ds_kernel<KIND, HS><<<grid, FLASH_THREADS, dkdv_shared>>>(
                t.dqkv_t, t.bias_partials, ds, t.dout, t.qkv, t.lse, t.delta, t.T, t.NH);
            cudaCheck(cudaGetLastError());
            size_t dq_shared = 2 * (FLASH_ROWS * DS_STRIDE + FLASH_ROWS * HS) * sizeof(float);
            flash_set_shared(flash_backward_dq_from_ds_kernel<HS>, dq_shared, &dq_configured);
            flash_backward_dq_from_ds_kernel<HS><<<grid, FLASH_THREADS, dq_shared>>>(t.dqkv_t, t.bias_partials, ds,
                                                                                    t.qkv, t.T, t.NH);
            cudaCheck(cudaGetLastError());
            t.sum_bias(HS, FLASH_ROWS);
        }
    }
};

struct Buffers {
    Shape shape;
    float *qkv, *dout, *out, *lse, *dqkv, *delta;
    float *dqkv_t, *dbias, *partials;          // the flash variants' outputs and scratch
    float *qkvr, *heads, *att, *dqkvr, *datt;  // the materialised variant's scratch
};

// The flash backward's scratch: a row of 3C column-sum shares per block of FLASH_ROWS tokens
// (variant 10: of FP32_PARTIAL_ROWS tokens).
static size_t flash_partials_floats(Shape s) {
    return (size_t)s.B * ceil_div(s.T, std::min(FLASH_ROWS, FP32_PARTIAL_ROWS)) * 3 * s.NH * s.hs;
}

static Buffers buffers_create(Shape s, bool materialised) {
    size_t btc = (size_t)s.B * s.T * s.NH * s.hs, bht = (size_t)s.B * s.NH * s.T;
    Buffers d = {};
    d.shape = s;
    d.qkv = (float*)device_malloc(3 * btc * sizeof(float), "qkv");
    d.dout = (float*)device_malloc(btc * sizeof(float), "dout");
    d.out = (float*)device_malloc(btc * sizeof(float), "out");
    d.lse = (float*)device_malloc(bht * sizeof(float), "lse");
    d.dqkv = (float*)device_malloc(3 * btc * sizeof(float), "dqkv");
    d.delta = (float*)device_malloc(bht * sizeof(float), "delta");
    d.dqkv_t = (float*)device_malloc(3 * btc * sizeof(float), "dqkv_t");
    d.dbias = (float*)device_malloc(3 * s.NH * s.hs * sizeof(float), "dbias");
    d.partials = (float*)device_malloc(flash_partials_floats(s) * sizeof(float), "partials");
    if (materialised) {
        d.qkvr = (float*)device_malloc(3 * btc * sizeof(float), "qkvr");
        d.heads = (float*)device_malloc(btc * sizeof(float), "heads");
        d.att = (float*)device_malloc(bht * s.T * sizeof(float), "att");
        d.dqkvr = (float*)device_malloc(3 * btc * sizeof(float), "dqkvr");
        d.datt = (float*)device_malloc(bht * s.T * sizeof(float), "datt");
    }
    return d;
}

static void buffers_free(Buffers* d) {
    for (float* p : {d->qkv, d->dout, d->out, d->lse, d->dqkv, d->delta, d->dqkv_t, d->dbias, d->partials, d->qkvr,
                     d->heads, d->att, d->dqkvr, d->datt}) {
        if (p != nullptr) { cudaCheck(cudaFree(p)); }
    }
}

// Variant 11: the trainer's FP32-core path on 64 KB multiprocessors: its forward (variant 10's) and
// the backward's plans for them; the bias gradient from their partials as FlashBackward sums it.
struct FlashBackwardSmallSm {
    FlashBackward trainer;
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        const FlashBackward& t = trainer;
        FlashFp32Backward<true> launch = {.dqkv_t = t.dqkv_t, .bias_partials = t.bias_partials, .delta = t.delta,
                                          .dout = t.dout, .qkv = t.qkv, .out = t.out, .lse = t.lse, .B = t.B,
                                          .T = t.T, .NH = t.NH};
        launch.run<KIND, HS>();
        t.sum_bias(HS, FP32_PARTIAL_ROWS);
    }
};

// LAB_SM_KB (e.g. 64): every FP32-core kernel (variants 10 and 11, both kinds, every head size)
// prefers a shared-memory carveout of that many KB a multiprocessor, so that as many blocks fit at
// once as on a GPU with that much (a T4's 64 KB); printed with the blocks the occupancy API reports.
template <AttentionKind KIND, int HS, bool SMALL>
static void hold_fp32_kernels(int percent) {
    const void* kernels[] = {(const void*)flash_fp32_forward_kernel<KIND, HS>,
                             (const void*)flash_fp32_dq_kernel<KIND, HS, SMALL>,
                             (const void*)flash_fp32_dkdv_kernel<KIND, HS, SMALL>};
    const int threads[] = {fp32_forward_tiling(HS).threads, fp32_dq_tiling(HS, SMALL).threads,
                           fp32_dkdv_tiling(HS, SMALL).threads};
    const size_t shared[] = {fp32_forward_shared_floats(HS) * sizeof(float),
                             fp32_dq_shared_floats(HS, SMALL) * sizeof(float),
                             fp32_dkdv_shared_floats(HS, SMALL) * sizeof(float)};
    const char* names[] = {"forward", "dQ", "dK/dV"};
    for (int i = 0; i < 3; i++) {
        cudaCheck(cudaFuncSetAttribute(kernels[i], cudaFuncAttributePreferredSharedMemoryCarveout, percent));
        int blocks = 0;
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernels[i], threads[i], shared[i]));
        if (KIND == ATTENTION_SOFTMAX) {
            printf("# LAB_SM_KB: %s plans, hs %d, %s: %.1f KB a block, %d threads, %d blocks a multiprocessor\n",
                   SMALL ? "64 KB-SM" : "today's", HS, names[i], shared[i] / 1024.0, threads[i], blocks);
        }
    }
}

static void hold_fp32_shared_per_sm() {
    const char* text = getenv("LAB_SM_KB");
    if (text == nullptr) { return; }
    int kb = atoi(text);
    int per_sm = 0;
    cudaCheck(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
    if (kb < 16 || kb * 1024 > per_sm) { fail("LAB_SM_KB=%s: expected 16 to %d", text, per_sm / 1024); }
    int percent = kb * 1024 * 100 / per_sm;  // rounded down: the driver takes the next carveout it has
    printf("# LAB_SM_KB=%d: the FP32-core kernels prefer %d%% of %d KB of shared memory a multiprocessor\n", kb,
           percent, per_sm / 1024);
    auto hold_kind = [&](auto kind) {
        constexpr AttentionKind KIND = decltype(kind)::value;
        hold_fp32_kernels<KIND, 32, false>(percent), hold_fp32_kernels<KIND, 32, true>(percent);
        hold_fp32_kernels<KIND, 64, false>(percent), hold_fp32_kernels<KIND, 64, true>(percent);
        hold_fp32_kernels<KIND, 128, false>(percent), hold_fp32_kernels<KIND, 128, true>(percent);
    };
    hold_kind(std::integral_constant<AttentionKind, ATTENTION_SOFTMAX>());
    hold_kind(std::integral_constant<AttentionKind, ATTENTION_RELU>());
}

static void run_forward(Buffers* d, AttentionKind kind, int variant) {
    Shape s = d->shape;
    if (variant == 1) {
        attention_forward(d->out, d->att, d->qkvr, d->heads, d->qkv, s.B, s.T, s.NH * s.hs, s.NH, kind);
    } else {
        g_tf32_cores = g_build_tf32_cores && !fp32_cores_variant(variant);  // flash_plan then takes the FP32 cores
        g_wgmma = variant >= 4 && !fp32_cores_variant(variant);  // the trainer's choice on Hopper; variant 2 runs the mma.sync kernel
        if (variant == 7) {
            FlashForwardPipelined launch = {{d->out, d->lse, d->qkv, s.B, s.T, s.NH}};
            flash_dispatch(launch, s.hs, kind, false, "variant 7");
        } else {
            flash_attention_forward(d->out, d->lse, d->qkv, s.B, s.T, s.NH, s.hs, kind, variant == 3);
        }
    }
}

// A lab launcher (the trainer's FlashBackward with one of its kernels replaced; each sums the qkv
// bias gradient from its partials itself, as the trainer's does). Variants 5, 6, 8 and 9 are
// tensor-core kernels: set as the other runners set it, whichever variant ran before (10 clears it).
template <typename Launch>
static void run_lab_backward(Buffers* d, AttentionKind kind, const char* what) {
    Shape s = d->shape;
    g_tf32_cores = g_build_tf32_cores;
    g_wgmma = true;
    Launch launch = {{d->dqkv_t, d->dbias, d->partials, d->delta, d->dout, d->qkv, d->out, d->lse, s.B, s.T, s.NH}};
    flash_dispatch(launch, s.hs, kind, false, what);
}

static void run_backward(Buffers* d, AttentionKind kind, int variant) {
    Shape s = d->shape;
    if (variant == 1) {
        attention_backward(d->dqkv, d->dqkvr, d->datt, d->heads, d->qkvr, d->dout, d->qkv, d->att, s.B, s.T,
                           s.NH * s.hs, s.NH, kind);
    } else if (variant == 5) {
        run_lab_backward<FlashBackwardWgmmaDq>(d, kind, "variant 5");
    } else if (variant == 6) {
        run_lab_backward<FlashBackwardWgmmaDkdv>(d, kind, "variant 6");
    } else if (variant == 8) {
        run_lab_backward<FlashBackwardFused>(d, kind, "variant 8");
    } else if (variant == 9) {
        run_lab_backward<FlashBackwardDsMemory>(d, kind, "variant 9");
    } else if (variant == FP32_SMALL_SM_VARIANT) {
        run_lab_backward<FlashBackwardSmallSm>(d, kind, "variant 11");
    } else {
        g_tf32_cores = g_build_tf32_cores && variant != FP32_CORES_VARIANT;
        g_wgmma = variant == 4 || variant == 7;
        flash_attention_backward(d->dqkv_t, d->dbias, d->partials, d->delta, d->dout, d->qkv, d->out, d->lse, s.B,
                                 s.T, s.NH, s.hs, kind, variant == 3);
    }
}

// Outputs (dbias too) and the flash scratch set to NaN (all bits set) so that anything left
// unwritten shows.
static void poison_outputs(Buffers* d) {
    Shape s = d->shape;
    size_t btc = (size_t)s.B * s.T * s.NH * s.hs, bht = (size_t)s.B * s.NH * s.T;
    cudaCheck(cudaMemset(d->out, 0xff, btc * sizeof(float)));
    cudaCheck(cudaMemset(d->lse, 0xff, bht * sizeof(float)));
    cudaCheck(cudaMemset(d->dqkv, 0xff, 3 * btc * sizeof(float)));
    cudaCheck(cudaMemset(d->delta, 0xff, bht * sizeof(float)));
    cudaCheck(cudaMemset(d->dqkv_t, 0xff, 3 * btc * sizeof(float)));
    cudaCheck(cudaMemset(d->partials, 0xff, flash_partials_floats(s) * sizeof(float)));
    cudaCheck(cudaMemset(d->dbias, 0xff, 3 * s.NH * s.hs * sizeof(float)));
}

static std::vector<float> download(const float* device, size_t n) {
    std::vector<float> host(n);
    cudaCheck(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

static void fill_normal(std::vector<float>* v, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    v->resize(n);
    for (size_t i = 0; i < n; i++) { (*v)[i] = normal(rng); }
}

// ----------------------------------------------------------------------------------------------
// CPU reference in double precision, per head (b, h)

struct Reference {
    std::vector<float> out, lse, dqkv;  // full-size; only the checked heads are filled
};

static void cpu_attention_head(Reference* ref, const float* qkv, const float* dout, Shape s, AttentionKind kind,
                               int b, int h) {
    int T = s.T, hs = s.hs;
    size_t C = (size_t)s.NH * hs;
    double scale = 1.0 / sqrt((double)hs);
    auto q = [&](int t) { return qkv + ((size_t)b * T + t) * 3 * C + h * hs; };
    auto dy = [&](int t) { return dout + ((size_t)b * T + t) * C + h * hs; };
    std::vector<double> score(T), p(T), ds(T), dk((size_t)T * hs, 0.0), dv((size_t)T * hs, 0.0);
    for (int t = 0; t < T; t++) {
        const float *qt = q(t), *dyt = dy(t);
        double max_score = -1e300;
        for (int j = 0; j <= t; j++) {
            const float* kj = q(j) + C;
            double dot = 0.0;
            for (int d = 0; d < hs; d++) { dot += (double)qt[d] * kj[d]; }
            score[j] = scale * dot;
            max_score = std::max(max_score, score[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; j++) {
            p[j] = kind == ATTENTION_SOFTMAX ? exp(score[j] - max_score) : std::max(score[j], 0.0) / (t + 1);
            sum += p[j];
        }
        if (kind == ATTENTION_SOFTMAX) {
            for (int j = 0; j <= t; j++) { p[j] /= sum; }
            ref->lse[((size_t)b * s.NH + h) * T + t] = (float)(max_score + log(sum));
        }
        double delta = 0.0;
        for (int j = 0; j <= t; j++) {
            const float* vj = q(j) + 2 * C;
            double dp = 0.0;
            for (int d = 0; d < hs; d++) { dp += (double)dyt[d] * vj[d]; }
            ds[j] = dp;
            delta += p[j] * dp;
        }
        for (int j = 0; j <= t; j++) {
            if (kind == ATTENTION_SOFTMAX) { ds[j] = p[j] * (ds[j] - delta); }
            else { ds[j] = score[j] > 0.0 ? ds[j] / (t + 1) : 0.0; }
        }
        float* out_t = ref->out.data() + ((size_t)b * T + t) * C + h * hs;
        float* dq_t = ref->dqkv.data() + ((size_t)b * T + t) * 3 * C + h * hs;
        for (int d = 0; d < hs; d++) {
            double y = 0.0, dq = 0.0;
            for (int j = 0; j <= t; j++) {
                y += p[j] * q(j)[2 * C + d];
                dq += ds[j] * q(j)[C + d];
            }
            out_t[d] = (float)y;
            dq_t[d] = (float)(scale * dq);
        }
        for (int j = 0; j <= t; j++) {
            for (int d = 0; d < hs; d++) {
                dk[(size_t)j * hs + d] += scale * ds[j] * qt[d];
                dv[(size_t)j * hs + d] += p[j] * dyt[d];
            }
        }
    }
    for (int t = 0; t < T; t++) {
        float* dk_t = ref->dqkv.data() + ((size_t)b * T + t) * 3 * C + C + h * hs;
        for (int d = 0; d < hs; d++) {
            dk_t[d] = (float)dk[(size_t)t * hs + d];
            dk_t[C + d] = (float)dv[(size_t)t * hs + d];
        }
    }
}

// All heads of small shapes; four spread-out heads of large ones (the full CPU run is too slow).
static std::vector<std::pair<int, int>> checked_heads(Shape s) {
    std::vector<std::pair<int, int>> heads;
    if ((size_t)s.B * s.NH * s.T <= 16 * 1024) {
        for (int b = 0; b < s.B; b++) {
            for (int h = 0; h < s.NH; h++) { heads.push_back({b, h}); }
        }
    } else {
        heads = {{0, 0}, {s.B - 1, s.NH - 1}, {s.B / 2, s.NH / 2}, {1 % s.B, s.NH - 2}};
    }
    return heads;
}

static Reference cpu_reference(const std::vector<float>& qkv, const std::vector<float>& dout, Shape s,
                               AttentionKind kind, const std::vector<std::pair<int, int>>& heads) {
    size_t btc = (size_t)s.B * s.T * s.NH * s.hs;
    Reference ref = {std::vector<float>(btc), std::vector<float>((size_t)s.B * s.NH * s.T),
                     std::vector<float>(3 * btc)};
    std::vector<std::thread> threads;
    for (auto head : heads) {
        threads.emplace_back(cpu_attention_head, &ref, qkv.data(), dout.data(), s, kind, head.first, head.second);
    }
    for (auto& thread : threads) { thread.join(); }
    return ref;
}

// ----------------------------------------------------------------------------------------------
// Correctness

// max |got - ref| and max |ref| over the checked heads' `width` columns at `column` of rows of
// `row_width` floats; the error is NaN if any checked value is not finite.
struct ErrorScale {
    double max_err, max_ref;
};

static ErrorScale head_error(const std::vector<float>& got, const std::vector<float>& ref, Shape s,
                             const std::vector<std::pair<int, int>>& heads, int row_width, int column, int width) {
    ErrorScale e = {0.0, 0.0};
    for (auto head : heads) {
        for (int t = 0; t < s.T; t++) {
            size_t base = ((size_t)head.first * s.T + t) * row_width + column + head.second * width;
            for (int d = 0; d < width; d++) {
                double err = fabs((double)got[base + d] - ref[base + d]);
                e.max_err = isfinite(got[base + d]) ? std::max(e.max_err, err) : NAN;
                e.max_ref = std::max(e.max_ref, fabs((double)ref[base + d]));
            }
        }
    }
    return e;
}

static double relative(ErrorScale e, double max_ref) { return e.max_err / std::max(max_ref, 1e-30); }

// The flash variants' dbias against the column sums in double of their own dqkv (B*T rows of 3C):
// max |dbias - sum| / max |sum|, NaN if a dbias value is not finite. dbias sums the same float
// values in another order (per block of FLASH_ROWS tokens, then the blocks), so only float
// rounding separates the two, whatever the precision of dqkv: a float sum of n terms errs by
// ~sqrt(n) * 6e-8 of their scale, 5e-6 for the B*T = 8192 tokens of the largest check.
constexpr double DBIAS_TOLERANCE = 1e-5;

static double dbias_error(const std::vector<float>& dbias, const std::vector<float>& dqkv) {
    size_t width = dbias.size(), tokens = dqkv.size() / width;
    std::vector<double> sums(width, 0.0);
    for (size_t token = 0; token < tokens; token++) {
        for (size_t j = 0; j < width; j++) { sums[j] += dqkv[token * width + j]; }
    }
    ErrorScale e = {0.0, 0.0};
    for (size_t j = 0; j < width; j++) {
        e.max_err = isfinite(dbias[j]) ? std::max(e.max_err, fabs(dbias[j] - sums[j])) : NAN;
        e.max_ref = std::max(e.max_ref, fabs(sums[j]));
    }
    return relative(e, e.max_ref);
}

static size_t count_non_finite(const std::vector<float>& v) {
    size_t n = 0;
    for (float x : v) { n += !isfinite(x); }
    return n;
}

static bool check_variant(Buffers* d, const Reference& ref, const std::vector<std::pair<int, int>>& heads,
                          AttentionKind kind, int variant) {
    Shape s = d->shape;
    int C = s.NH * s.hs;
    size_t btc = (size_t)s.B * s.T * C;
    poison_outputs(d);
    run_forward(d, kind, variant);
    // the trainer's plan for this head size (what its forward just ran), for the tests to check
    std::string path = variant == 1 || variant == 7 ? "" : ", path: " + flash_path_name(s.hs, variant == 3);
    run_backward(d, kind, variant);
    bool flash = variant != 1;
    if (flash) { transpose_matrices(d->dqkv, d->dqkv_t, 3 * C, s.B * s.T, 1); }  // dqkv_t back to (B*T, 3C)
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> out = download(d->out, btc), dqkv = download(d->dqkv, 3 * btc);
    ErrorScale out_e = head_error(out, ref.out, s, heads, C, 0, s.hs);
    double out_err = relative(out_e, out_e.max_ref), lse_err = 0.0;
    if (flash && kind == ATTENTION_SOFTMAX) {
        std::vector<float> lse = download(d->lse, (size_t)s.B * s.NH * s.T);
        Shape rows = {s.B * s.NH, 1, 1, s.T};  // lse as rows of T, one per (b, h)
        std::vector<std::pair<int, int>> lse_heads;
        for (auto head : heads) { lse_heads.push_back({head.first * s.NH + head.second, 0}); }
        ErrorScale lse_e = head_error(lse, ref.lse, rows, lse_heads, s.T, 0, s.T);
        lse_err = relative(lse_e, lse_e.max_ref);
    }
    // dq, dk, dv relative to the largest |dqkv|: at T = 1 the softmax dq and dk are exactly 0
    ErrorScale dq_e = head_error(dqkv, ref.dqkv, s, heads, 3 * C, 0, s.hs);
    ErrorScale dk_e = head_error(dqkv, ref.dqkv, s, heads, 3 * C, C, s.hs);
    ErrorScale dv_e = head_error(dqkv, ref.dqkv, s, heads, 3 * C, 2 * C, s.hs);
    double dqkv_ref = std::max({dq_e.max_ref, dk_e.max_ref, dv_e.max_ref});
    double dq_err = relative(dq_e, dqkv_ref), dk_err = relative(dk_e, dqkv_ref), dv_err = relative(dv_e, dqkv_ref);
    double dbias_err = flash ? dbias_error(download(d->dbias, 3 * C), dqkv) : 0.0;
    size_t non_finite = count_non_finite(out) + count_non_finite(dqkv);
    Tolerance tol = variant == 3 ? FP32_TOLERANCE : fp32_cores_variant(variant) ? FP32_CORES_TOLERANCE : TF32_TOLERANCE;
    double forward_err = std::max(out_err, lse_err), backward_err = std::max({dq_err, dk_err, dv_err});
    bool ok = forward_err <= tol.forward && backward_err <= tol.backward && dbias_err <= DBIAS_TOLERANCE &&
              non_finite == 0;
    char dbias_text[32] = "", dbias_tol[32] = "";
    if (flash) {
        snprintf(dbias_text, sizeof(dbias_text), " dbias %.1e", dbias_err);
        snprintf(dbias_tol, sizeof(dbias_tol), ", dbias %.0e", DBIAS_TOLERANCE);
    }
    printf("check %-22s %-7s %-20s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e%s non-finite %zu (%zu heads) %s%s\n",
           shape_name(s).c_str(), attention_name(kind), VARIANT_NAMES[variant], out_err, lse_err, dq_err, dk_err,
           dv_err, dbias_text, non_finite, heads.size(), ok ? "ok" : "FAIL", path.c_str());
    fflush(stdout);
    char forward[64], backward[64], note[128];
    snprintf(forward, sizeof(forward), "err %.2e", forward_err);
    snprintf(backward, sizeof(backward), "err %.2e%s", backward_err, dbias_text);
    snprintf(note, sizeof(note), "tol %.0e / %.0e%s %s", tol.forward, tol.backward, dbias_tol, ok ? "ok" : "FAIL");
    table_row("check", s, kind, variant, forward, backward, note);
    return ok;
}

// ----------------------------------------------------------------------------------------------
// Benchmark

// FLOPs by the convention (causal half of the T x T products) and those the flash kernels execute
// (whole 16-row warp tiles up to the diagonal; split-TF32's three mma's counted as one product).
static double convention_forward_flops(Shape s) { return 4.0 * s.B * s.NH * (double)s.T * s.T * s.hs / 2; }

static void flash_executed_flops(Shape s, bool split, bool wgmma, bool wgmma_dq, bool wgmma_dkdv, bool fused,
                                 bool ds_memory, double* forward, double* backward) {
    int forward_keys = flash_forward_keys(s.hs), dq_keys = FLASH_DQ_KEYS;
    int queries = flash_dkdv_queries(s.hs, split);
    double forward_tiles = 0, dq_tiles = 0, dkdv_tiles = 0;  // 16 x tile x hs products per warp and tile
    double cta_tiles = 0;  // the fused backward's dQ shares: every warp of a key block's CTA, every tile
    double ds_keys = 0;    // dQ from stored dS: every warp of a query block, every key block up to it
    for (int block0 = 0; block0 < s.T; block0 += FLASH_ROWS) {
        cta_tiles += ceil_div(s.T, queries) - block0 / queries;
        ds_keys += FLASH_WARPS * (block0 + FLASH_ROWS);
        for (int w = 0; w < FLASH_WARPS; w++) {
            int row0 = block0 + 16 * w, rows_end = std::min(block0 + FLASH_ROWS, s.T);
            for (int key0 = 0; key0 < rows_end; key0 += forward_keys) { forward_tiles += key0 <= row0 + 15; }
            for (int key0 = 0; key0 < rows_end; key0 += dq_keys) { dq_tiles += key0 <= row0 + 15; }
            for (int query0 = block0 / queries * queries; query0 < s.T; query0 += queries) {
                dkdv_tiles += query0 + queries - 1 >= row0;
            }
        }
    }
    double heads = (double)s.B * s.NH, unit = 2.0 * 16 * s.hs;
    *forward = heads * unit * forward_tiles * forward_keys * 2;
    *backward = heads * unit * (dq_tiles * dq_keys * 3 + dkdv_tiles * queries * 4);
    if (fused && s.hs <= 64) {
        *backward = heads * unit * (dkdv_tiles * queries * 4 + cta_tiles * FLASH_WARPS * FLASH_ROWS);
    }
    if (ds_memory && !split && s.hs <= 64) { *backward = heads * unit * (dkdv_tiles * queries * 4 + ds_keys); }
    if (!wgmma) { return; }
    // 64 x WG_KEYS tiles per warpgroup: the forward's and dQ's from key 0 to the warpgroup's last
    // query, dK/dV's from its first key's query tile to T; the wgmma backward kernels for hs <= 64
    double group_tiles = 0, group_dkdv_tiles = 0;
    for (int block0 = 0; block0 < s.T; block0 += WG_CTA_QUERIES) {
        for (int row0 = block0; row0 < std::min(block0 + WG_CTA_QUERIES, s.T); row0 += WG_QUERIES) {
            group_tiles += ceil_div(std::min(row0 + WG_QUERIES, s.T), WG_KEYS);
            group_dkdv_tiles += ceil_div(s.T, WG_KEYS) - row0 / WG_KEYS;
        }
    }
    *forward = heads * unit * 4 * group_tiles * WG_KEYS * 2;
    if (s.hs > 64) { return; }
    if (wgmma_dq) { *backward += heads * unit * (4 * group_tiles * WG_KEYS - dq_tiles * dq_keys) * 3; }
    if (wgmma_dkdv) { *backward += heads * unit * (4 * group_dkdv_tiles * WG_KEYS - dkdv_tiles * queries) * 4; }
}

// Variant 10's and 11's (small: the backward's plans) executed FLOPs: per block, its whole tiles up to the diagonal; the
// forward 2 products per (query, key) pair, the dQ kernel 3 and the dK/dV kernel 4 (P recomputed in both).
static void fp32_executed_flops(Shape s, bool small, double* forward, double* backward) {
    Fp32Tiling fwd = fp32_forward_tiling(s.hs), dq = fp32_dq_tiling(s.hs, small);
    Fp32Tiling dkdv = fp32_dkdv_tiling(s.hs, small);
    double forward_pairs = 0, dq_pairs = 0, dkdv_pairs = 0;
    for (int query0 = 0; query0 < s.T; query0 += fwd.rows()) {
        forward_pairs += (double)fwd.rows() * ceil_div(std::min(query0 + fwd.rows(), s.T), fwd.tile()) * fwd.tile();
    }
    for (int query0 = 0; query0 < s.T; query0 += dq.rows()) {
        dq_pairs += (double)dq.rows() * ceil_div(std::min(query0 + dq.rows(), s.T), dq.tile()) * dq.tile();
    }
    for (int key0 = 0; key0 < s.T; key0 += dkdv.rows()) {
        dkdv_pairs += (double)dkdv.rows() * (ceil_div(s.T, dkdv.tile()) - key0 / dkdv.tile()) * dkdv.tile();
    }
    double heads = (double)s.B * s.NH, product = 2.0 * s.hs;
    *forward = heads * product * forward_pairs * 2;
    *backward = heads * product * (dq_pairs * 3 + dkdv_pairs * 4);
}

// Variant 10 against the device's FP32 FMA peak, FLOPs counted on the causal pairs, T(T+1)/2 per
// head: the forward's 2 products; the backward's 5 (S, dP, dV, dK, dQ) and, counting the dQ
// kernel's recomputed S and dP as work, 7.
static void fp32_peak_note(Shape s, double forward_ms, double backward_ms, char* note, size_t size) {
    char terms[128];
    double peak = fp32_peak_tflops(terms, sizeof(terms));
    double product = 2.0 * s.B * s.NH * s.hs * (double)s.T * (s.T + 1) / 2;
    double forward = 2 * product / forward_ms * 1e-9, backward5 = 5 * product / backward_ms * 1e-9;
    double backward7 = 7 * product / backward_ms * 1e-9;
    snprintf(note, size,
             "FP32 peak %.1f TF/s (%s); causal T(T+1)/2: fwd %.1f TF/s %.1f%%, bwd 5 products %.1f TF/s %.1f%%, "
             "7 with recompute %.1f TF/s %.1f%%",
             peak, terms, forward, 100 * forward / peak, backward5, 100 * backward5 / peak, backward7,
             100 * backward7 / peak);
}

template <typename Run>
static double median_ms(Run run) {
    const int WARMUP = 3, REPEATS = 20;
    for (int i = 0; i < WARMUP; i++) { run(); }
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    std::vector<float> times;
    for (int i = 0; i < REPEATS; i++) {
        cudaCheck(cudaEventRecord(start));
        run();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return (times[REPEATS / 2 - 1] + times[REPEATS / 2]) / 2;
}

static void benchmark_variant(Buffers* d, AttentionKind kind, int variant) {
    Shape s = d->shape;
    double forward_ms = median_ms([&] { run_forward(d, kind, variant); });
    run_forward(d, kind, variant);
    double backward_ms = median_ms([&] { run_backward(d, kind, variant); });
    double conv_forward = convention_forward_flops(s), conv_backward = 2.5 * conv_forward;
    double exec_forward = conv_forward * 2, exec_backward = conv_backward * 8 / 5;  // full T x T products
    if (fp32_cores_variant(variant)) {
        fp32_executed_flops(s, variant == FP32_SMALL_SM_VARIANT, &exec_forward, &exec_backward);
    } else if (variant != 1) {
        flash_executed_flops(s, variant == 3, variant >= 4, variant == 5, variant == 6, variant == 8, variant == 9,
                             &exec_forward, &exec_backward);
    }
    double tf_forward = conv_forward / forward_ms * 1e-9, tf_backward = conv_backward / backward_ms * 1e-9;
    char forward[64], backward[64], note[128];
    snprintf(forward, sizeof(forward), "%.3f ms %6.1f TF/s %4.1f%%", forward_ms, tf_forward,
             100 * tf_forward / TF32_PEAK_TFLOPS);
    snprintf(backward, sizeof(backward), "%.3f ms %6.1f TF/s %4.1f%%", backward_ms, tf_backward,
             100 * tf_backward / TF32_PEAK_TFLOPS);
    snprintf(note, sizeof(note), "executed/convention fwd %.2f bwd %.2f; executed TF/s %.1f / %.1f",
             exec_forward / conv_forward, exec_backward / conv_backward, exec_forward / forward_ms * 1e-9,
             exec_backward / backward_ms * 1e-9);
    printf("bench %-22s %-7s %-20s fwd %s  bwd %s  %s\n", shape_name(s).c_str(), attention_name(kind),
           VARIANT_NAMES[variant], forward, backward, note);
    table_row("bench", s, kind, variant, forward, backward, note);
    if (fp32_cores_variant(variant)) {
        char fp32_note[512];
        fp32_peak_note(s, forward_ms, backward_ms, fp32_note, sizeof(fp32_note));
        printf("bench %-22s %-7s %-20s %s\n", shape_name(s).c_str(), attention_name(kind), VARIANT_NAMES[variant],
               fp32_note);
        table_row("bench", s, kind, variant, "", "", fp32_note);
    }
    fflush(stdout);
}

// ----------------------------------------------------------------------------------------------
// Determinism: 10 forward + backward runs on the same inputs, compared bit for bit with the first.

static bool check_determinism(Buffers* d, AttentionKind kind, int variant) {
    Shape s = d->shape;
    size_t btc = (size_t)s.B * s.T * s.NH * s.hs, bht = (size_t)s.B * s.NH * s.T;
    bool flash = variant != 1;
    std::vector<float> first_out, first_lse, first_grad, first_dbias;
    int identical = 0;
    const int RUNS = 10;
    for (int run = 0; run < RUNS; run++) {
        poison_outputs(d);
        run_forward(d, kind, variant);
        run_backward(d, kind, variant);
        std::vector<float> out = download(d->out, btc), lse = download(d->lse, bht);
        std::vector<float> grad = download(flash ? d->dqkv_t : d->dqkv, 3 * btc);
        std::vector<float> dbias = download(d->dbias, 3 * (size_t)s.NH * s.hs);  // stays 0 in variant 1
        if (!flash || kind == ATTENTION_RELU) { lse.clear(); }
        if (run == 0) {
            first_out = out, first_lse = lse, first_grad = grad, first_dbias = dbias;
            continue;
        }
        identical += memcmp(out.data(), first_out.data(), btc * sizeof(float)) == 0 &&
                     memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(float)) == 0 &&
                     memcmp(grad.data(), first_grad.data(), 3 * btc * sizeof(float)) == 0 &&
                     memcmp(dbias.data(), first_dbias.data(), dbias.size() * sizeof(float)) == 0;
    }
    bool ok = identical == RUNS - 1;
    char note[128];
    snprintf(note, sizeof(note), "%d of %d runs bit-identical to the first (out, lse, %s) %s", identical + 1, RUNS,
             flash ? "dqkv_t, dbias" : "dqkv", ok ? "ok" : "FAIL");
    printf("determinism %-22s %-7s %-20s %s\n", shape_name(s).c_str(), attention_name(kind), VARIANT_NAMES[variant],
           note);
    table_row("determinism", s, kind, variant, "", "", note);
    return ok;
}

// ----------------------------------------------------------------------------------------------

// ReLU's derivative jumps at score 0, so a score within rounding of 0 can take the other branch on
// the GPU than in double, moving a whole dq or dk row by dP/(t+1) k (seen: 2e-2 to 7e-2 in TF32,
// both the materialised and the flash path, and 2e-3 in split-TF32). The ReLU checks therefore
// draw q and k on a grid of 1/4, where every score is exact in TF32 and FP32 alike; v and dout
// stay continuous.
static void quantize_scores(std::vector<float>* qkv, Shape s) {
    size_t C = (size_t)s.NH * s.hs;
    for (size_t token = 0; token < (size_t)s.B * s.T; token++) {
        for (size_t c = 0; c < 2 * C; c++) {
            float* x = &(*qkv)[token * 3 * C + c];
            *x = roundf(*x * 4.0f) / 4.0f;
        }
    }
}

static void upload_inputs(Buffers* d, const std::vector<float>& qkv, const std::vector<float>& dout) {
    cudaCheck(cudaMemcpy(d->qkv, qkv.data(), qkv.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d->dout, dout.data(), dout.size() * sizeof(float), cudaMemcpyHostToDevice));
}

int main(int argc, char** argv) {
    std::vector<int> variants;
    bool small_only = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--small") == 0) {
            small_only = true;
            continue;
        }
        int v = atoi(argv[i]);
        if (v < 1 || v > NUM_VARIANTS) { fail("variant '%s': expected 1 to %d", argv[i], NUM_VARIANTS); }
        variants.push_back(v);
    }
    if (!cuda_setup(MATMUL_TF32)) { fail("no CUDA device"); }
    g_build_tf32_cores = g_tf32_cores;
    bool hopper = g_wgmma, tensor_cores = g_tf32_cores;
    if (variants.empty()) {
        variants = hopper ? std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11} : std::vector<int>{1, 2, 3, 10, 11};
    }
    hold_fp32_shared_per_sm();
    if (!tensor_cores) {  // this build's code predates mma.sync and cp.async: only variants 1 and 10 run
        for (int v : variants) {
            if (v >= 2 && v <= 9) {
                printf("variant %d skipped: this build's code is for a GPU before Ampere, its kernels need 8.0\n", v);
            }
        }
        variants.erase(std::remove_if(variants.begin(), variants.end(), [](int v) { return v >= 2 && v <= 9; }),
                       variants.end());
    }
    if (!hopper && std::any_of(variants.begin(), variants.end(), [](int v) { return v >= 4 && v <= 9; })) {
        fail("variants 4 to 9 need a Hopper GPU and a build for it (sm_90a): %s", g_device_name);
    }
    bool materialised = std::find(variants.begin(), variants.end(), 1) != variants.end();
    const AttentionKind kinds[] = {ATTENTION_SOFTMAX, ATTENTION_RELU};
    int failures = 0;

    const Shape checks[] = {{8, 1024, 12, 64}, {2, 1024, 4, 32}, {2, 1000, 2, 128}, {3, 77, 5, 64},
                            {2, 1, 3, 64},     {1, 130, 2, 32},  {1, 200, 2, 128}, {1, 333, 2, 64}};
    uint64_t seed = 1;
    for (Shape s : checks) {
        if (small_only && (size_t)s.B * s.NH * s.T > 2048) { continue; }
        size_t btc = (size_t)s.B * s.T * s.NH * s.hs;
        Buffers d = buffers_create(s, materialised);
        for (AttentionKind kind : kinds) {
            std::vector<float> qkv, dout;
            fill_normal(&qkv, 3 * btc, seed++);
            fill_normal(&dout, btc, seed++);
            if (kind == ATTENTION_RELU) { quantize_scores(&qkv, s); }
            upload_inputs(&d, qkv, dout);
            std::vector<std::pair<int, int>> heads = checked_heads(s);
            Reference ref = cpu_reference(qkv, dout, s, kind, heads);
            for (int variant : variants) { failures += !check_variant(&d, ref, heads, kind, variant); }
        }
        buffers_free(&d);
    }

    // GPT-2's hs 64 at B = 4, 8, 16; the other head sizes at C = 768
    const Shape benches[] = {{4, 1024, 12, 64}, {8, 1024, 12, 64}, {16, 1024, 12, 64}, {16, 1024, 24, 32},
                             {16, 1024, 6, 128}};
    for (Shape s : benches) {
        if (small_only) { break; }
        size_t btc = (size_t)s.B * s.T * s.NH * s.hs;
        Buffers d = buffers_create(s, materialised);
        std::vector<float> qkv, dout;
        fill_normal(&qkv, 3 * btc, seed++);
        fill_normal(&dout, btc, seed++);
        upload_inputs(&d, qkv, dout);
        for (AttentionKind kind : kinds) {
            for (int variant : variants) { benchmark_variant(&d, kind, variant); }
        }
        if (s.B == 8) {
            for (AttentionKind kind : kinds) {
                for (int variant : variants) { failures += !check_determinism(&d, kind, variant); }
            }
        }
        buffers_free(&d);
    }

    printf("\ntolerances (max |err| / max |ref|, forward / backward):\n  TF32 %.0e / %.0e: %s\n"
           "  split-TF32 %.0e / %.0e: %s\n  FP32 cores %.0e / %.0e: %s\n",
           TF32_TOLERANCE.forward, TF32_TOLERANCE.backward, TF32_TOLERANCE.reason, FP32_TOLERANCE.forward,
           FP32_TOLERANCE.backward, FP32_TOLERANCE.reason, FP32_CORES_TOLERANCE.forward,
           FP32_CORES_TOLERANCE.backward, FP32_CORES_TOLERANCE.reason);
    printf("\n| %-11s | %-22s | %-7s | %-20s | %-30s | %-30s | %s\n", "what", "shape", "kind", "variant", "forward",
           "backward", "note");
    for (const std::string& line : g_table) { printf("%s\n", line.c_str()); }
    printf("%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
    return failures == 0 ? 0 : 1;
}
