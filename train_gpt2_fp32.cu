/*
GPT-2 training in CUDA C++: FP32 weights and activations, TF32 tensor cores for matrix products
(FP32 accuracy from split TF32 products with -f 0, cuBLAS's plain FP32 with -f 2). Every forward and
backward kernel, the model and the training loop, and generation with a KV cache (--prompt) and
multiple-choice evaluation (--eval) for using the model.

Layouts (all row-major, float32):
  activations  (B, T, C): token b*T + t, channel c at ((b*T + t)*C + c)
  qkv          (B, T, 3, NH, hs): the 3C row of a token holds q, then k, then v; head h at h*hs
  attention    flash attention: no (T, T) tensor in memory, one log-sum-exp per (b, h, query)
  linear layer weights (OC, C) as PyTorch stores them: out = inp @ W^T + bias
  transposed   W^T (C, OC) and backward activations (C, B*T), so that the matrix products read
               their operands along the summed dimension (TF32 tensor-core kernels' fast case)
Every offset into a tensor is size_t: the activations together pass 2^31 floats at B=32, T=1024.

Sections, in data-flow order (each a banner below; the host front-end is in llmc/, see the includes):
   1 CUDA utilities            device memory, graphs, streams, ordered element-wise sums
   2 Encoder                   wte[token] + wpe[position], and its backward
   3 LayerNorm                 forward, backward, the transposed copies the products read
   4 GELU                      forward; its backward is fused into the fc layer's bias gradient (6)
   5 Hopper primitives         wgmma on shared-memory panels: descriptors, fences, fragments; TMA, mbarriers
   6 Matrix products           cuBLASLt (TF32, split TF32, FP32), our Hopper GEMMs (TF32, split TF32), bias gradients
   7 Attention                 flash attention forward and backward (wgmma, mma.sync, FP32 cores), KV-cache decode
   8 Fused classifier          softmax, cross-entropy and the logits' gradient
   9 Sampling                  the next token on the device
  10 AdamW                     the update, the gradient norm and the update's guards
  11 Data parallel             DataParallel: ZeRO-1's moves (buckets, owners' ordered sums, the gather)
  12 Initialisation
  13 The model                 parameters (llmc/model_file.h's table), activations, forward, backward, update
  14 Generation                the prompt, then one position per step from a captured graph
  15 Device setup
  16 Checkpoints               a snapshot in pinned memory for the writer, read back; the model a run starts from
  17 Between steps             validation loss, multiple-choice evaluation, samples
  18 The training loop         Run, run_init, run_step, run_report, run_periodic, run_finish
  19 main                      training, --prompt's generation, --eval alone
*/
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cublasLt.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <time.h>

#include <array>
#include <map>
#include <type_traits>
#include <vector>

#include "llmc/args.h"           // defines: TrainArgs, the flags (defaults, usage, checks), parsed once
#include "llmc/checkpoint_dir.h" // defines: the checkpoint folder (file names, latest, pruning, resume order)
#include "llmc/checkpoint_writer.h"  // defines: CheckpointWriter, checkpoints written in the background from a snapshot
#include "llmc/checksum.h"       // defines: crc32c_update (checkpoint checksums)
#include "llmc/comm.cuh"         // defines: Comm, g_comm, printf0, the collectives (NCCL when built with it)
#include "llmc/dataloader.h"     // defines: DataLoader, shards, each rank's micro-batches
#include "llmc/device_memory.cuh"  // defines: device_malloc, device_free, g_device_bytes (every device allocation)
#include "llmc/eval.h"           // defines: EvalSet, EvalBatch (HellaSwag-style multiple choice), scoring
#include "llmc/fingerprint.h"    // defines: fnv1a (weights checksum), run_fingerprint (same on every rank)
#include "llmc/gpt2_hf.h"        // defines: Hugging Face GPT-2 directories in (-e) and out, read_any_model
#include "llmc/launch.h"         // defines: LaunchInfo, launchers' variables, --gpus, rendezvous
#include "llmc/logger.h"         // defines: RunLog (main.log and TensorBoard events), one writer per kind of line
#include "llmc/mfu.h"            // defines: tf32_peak_tflops, the known GPUs' peaks for MFU
#include "llmc/model_file.h"     // defines: ModelShape, AttentionKind, the parameter tensors' table, the model file
#include "llmc/outlier.h"        // defines: OutlierWindow, the spike guard's z-score of the gradient norm
#include "llmc/overlap.h"        // defines: --overlap's modes, overlap_choose (the rule of auto), Link
#include "llmc/paths.h"          // defines: find_bundled_file (the vocabulary from any directory)
#include "llmc/prompt.h"         // defines: encode_prompt (--prompt, --prompt-file as token ids)
#include "llmc/run_shape.h"      // defines: RunShape (the flags that shape a run's numbers), learning_rate, Schedule
#include "llmc/signals.h"        // defines: signals_install, signals_pending, EXIT_PREEMPTED
#include "llmc/state_file.h"     // defines: RunState, the run-state file of a checkpoint, read and written
#include "llmc/tensorboard.h"    // defines: TensorBoard, event files (scalars, text, session starts) without TensorFlow
#include "llmc/tokenizer.h"      // defines: Tokenizer (GPT-2 BPE)
#include "llmc/utils.h"          // defines: fail, checked file I/O, atomic writes
#include "llmc/zero.h"           // defines: ZeRO-1 shards, gradient buckets, each rank's messages

namespace cg = cooperative_groups;

// Every launch goes to the calling thread's default stream, which graph capture relies on.
#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "build with nvcc --default-stream per-thread, as the Makefile does"
#endif

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
constexpr float LOG2E = 1.4426950408889634f;  // exp(x) = exp2(x * LOG2E)

static int g_num_sms;                 // multiprocessors of the device, for persistent-style grids
static char g_device_name[256];
// The matrix products' arithmetic (-f, whose values these are; saved in checkpoints): FP32 accuracy
// from split TF32 products on the tensor cores, TF32, or cuBLAS's plain FP32 (no tensor cores).
enum MatmulPrecision { MATMUL_SPLIT_TF32 = 0, MATMUL_TF32 = 1, MATMUL_FP32 = 2 };
static MatmulPrecision g_precision = MATMUL_TF32;

static const char* precision_name(int precision) {
    return precision == MATMUL_SPLIT_TF32 ? "FP32 (split TF32)" : precision == MATMUL_TF32 ? "TF32" : "FP32 (plain)";
}
static cublasLtHandle_t g_cublaslt;
static void* g_cublaslt_workspace;
// The backward pass queues the weight gradients on a second stream, where they overlap the main
// stream's chain of input gradients; it has its own cuBLASLt workspace.
static cudaStream_t g_side_stream;
static void* g_side_workspace;
constexpr size_t CUBLASLT_WORKSPACE_SIZE = 32 * 1024 * 1024;

// Programmatic dependent launch (Hopper): a kernel queued with launch_pdl may start while the
// kernel before it in the stream still runs. It may only prefetch what no earlier kernel writes
// (weights) before pdl_wait(), which every block calls before it reads its inputs or returns: it
// waits until the earlier kernel has finished and its writes are visible, then lets the next
// dependent kernel start (so at most one kernel runs ahead). Elsewhere both are plain launches.
static bool g_pdl;  // the running code was built for 9.0 or newer (pdl_wait is empty in older builds' code)

// The paths are chosen by the code the GPU runs, not only by the GPU: a build for compute_75 (PTX,
// which the driver compiles for any newer GPU) takes the FP32-core paths on an H100 too, so that
// every path is tested there. g_tf32_cores: the running code was built for 8.0 or newer (TF32
// mma.sync, cp.async); g_wgmma: it is the sm_90a code (Hopper's warpgroup MMA: the flash forward, our GEMMs).
static bool g_tf32_cores, g_wgmma;
// A block's shared memory on this device (its opt-in limit), or less under the test switch
// GPT2_TEST_SHARED_KB (to run, on this GPU, the plans of GPUs with less: flash_plan; at least
// SHARED_LIMIT_LEAST_KB).
static size_t g_shared_limit;
// A multiprocessor holds at most 64 KB of shared memory (T4, RTX 20), or GPT2_TEST_SHARED_KB caps a
// block at 64 or less: the FP32-core attention's backward takes its plans for such GPUs (flash_plan).
static bool g_small_sm;

__global__ void built_code_probe_kernel(int* built) {
#ifdef __CUDA_ARCH__
    built[0] = __CUDA_ARCH__;
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    built[1] = 1;
#else
    built[1] = 0;
#endif
}

// The architecture the running code was built for (e.g. 750, 800, 900) and whether it is sm_90a's.
static void probe_built_code(int* arch, bool* sm90a) {
    int* built = (int*)device_malloc(2 * sizeof(int), "built code probe");
    built_code_probe_kernel<<<1, 1>>>(built);
    cudaCheck(cudaGetLastError());
    int values[2] = {};
    cudaCheck(cudaMemcpy(values, built, sizeof(values), cudaMemcpyDeviceToHost));
    device_free(built);
    *arch = values[0];
    *sm90a = values[1] == 1;
}

__device__ inline void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Starts bringing bytes (a multiple of 16, from a 16-byte aligned address) into L2.
__device__ inline void prefetch_l2(const void* address, unsigned int bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(address), "r"(bytes) : "memory");
#endif
}

template <typename... Params, typename... Args>
static void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.stream = cudaStreamPerThread;
    config.attrs = &attribute;
    config.numAttrs = g_pdl ? 1 : 0;
    cudaCheck(cudaLaunchKernelEx(&config, kernel, (Params)args...));
}

// CUDA graphs: a sequence of launches on this thread's default stream (and on streams that join
// it) is captured once and then replayed with one launch, so that no gap opens between kernels
// while the host issues the next. GraphCache::run runs a sequence eagerly the first time its key
// is seen (one-time host work, such as the matrix products' plans and kernel attributes, happens
// outside any capture), captures it the second time and replays it from then on. The key holds
// everything the launches depend on besides buffers that stay put.
using GraphKey = std::array<int64_t, 7>;

// A memset node of a graph leaves the GPU idle for about 9 us (H100: 5 us from the kernel before
// it, 4 us to the kernel after it; dev/profile's tracer), a kernel node for well under one. cuBLASLt
// queues a 4-byte memset of its workspace before each product whose algorithm keeps a counter
// there (25 per d12 step at B=4), so a captured graph's small memsets become kernel nodes.
constexpr size_t SMALL_MEMSET_BYTES = 65536;

__global__ void memset_node_kernel(cudaMemsetParams p) {
    size_t count = p.width * p.height;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        char* element = (char*)p.dst + (i / p.width) * p.pitch + (i % p.width) * p.elementSize;
        if (p.elementSize == 1) { *(uint8_t*)element = (uint8_t)p.value; }
        else if (p.elementSize == 2) { *(uint16_t*)element = (uint16_t)p.value; }
        else { *(uint32_t*)element = p.value; }
    }
}

// The nodes before (incoming) or after a node.
static std::vector<cudaGraphNode_t> graph_neighbours(cudaGraphNode_t node, bool incoming) {
    size_t count = 0;
    auto get = incoming ? cudaGraphNodeGetDependencies : cudaGraphNodeGetDependentNodes;
#if CUDART_VERSION >= 13000  // CUDA 13 added the edges' data (nullptr: plain edges)
    cudaCheck(get(node, nullptr, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0) { cudaCheck(get(node, nodes.data(), nullptr, &count)); }
#else
    cudaCheck(get(node, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0) { cudaCheck(get(node, nodes.data(), &count)); }
#endif
    return nodes;
}

static void small_memsets_to_kernels(cudaGraph_t graph) {
    size_t count = 0;
    cudaCheck(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    cudaCheck(cudaGraphGetNodes(graph, nodes.data(), &count));
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        cudaCheck(cudaGraphNodeGetType(node, &type));
        if (type != cudaGraphNodeTypeMemset) { continue; }
        cudaMemsetParams memset;
        cudaCheck(cudaGraphMemsetNodeGetParams(node, &memset));
        size_t elements = memset.width * memset.height;
        if (elements * memset.elementSize > SMALL_MEMSET_BYTES) { continue; }
        std::vector<cudaGraphNode_t> before = graph_neighbours(node, true), after = graph_neighbours(node, false);
        void* args[] = {&memset};
        cudaKernelNodeParams kernel = {};
        kernel.func = (void*)memset_node_kernel;
        kernel.gridDim = dim3(ceil_div(elements, 256));
        kernel.blockDim = dim3(256);
        kernel.kernelParams = args;
        cudaGraphNode_t replacement;
        cudaCheck(cudaGraphAddKernelNode(&replacement, graph, before.data(), before.size(), &kernel));
#if CUDART_VERSION >= 13000
        for (cudaGraphNode_t next : after) { cudaCheck(cudaGraphAddDependencies(graph, &replacement, &next, nullptr, 1)); }
#else
        for (cudaGraphNode_t next : after) { cudaCheck(cudaGraphAddDependencies(graph, &replacement, &next, 1)); }
#endif
        cudaCheck(cudaGraphDestroyNode(node));
    }
}

// A pass that may be captured as a graph waits for a stream outside it (the parameters' arrival on
// the communication stream): while capturing, the wait becomes an external event node, which the
// graph performs at each launch; outside a capture, an ordinary wait.
static bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status;
    cudaCheck(cudaStreamIsCapturing(stream, &status));
    return status == cudaStreamCaptureStatusActive;
}

static void stream_waits_outside(cudaStream_t stream, cudaEvent_t event) {
    cudaCheck(cudaStreamWaitEvent(stream, event, capturing(stream) ? cudaEventWaitExternal : cudaEventWaitDefault));
}

// The same for an event recorded by such a pass for the host to read (a timing mark): while
// capturing, an external event record node, which records at each launch.
static void record_outside(cudaEvent_t event, cudaStream_t stream) {
    unsigned int flags = capturing(stream) ? cudaEventRecordExternal : cudaEventRecordDefault;
    cudaCheck(cudaEventRecordWithFlags(event, stream, flags));
}

template <typename Launches>
static cudaGraphExec_t graph_capture(const Launches& launches) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaCheck(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
    launches();
    cudaCheck(cudaStreamEndCapture(cudaStreamPerThread, &graph));
    small_memsets_to_kernels(graph);
    // the kernels keep their stream's priority (the side stream's weight gradients yield to the main chain)
    cudaCheck(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority));
    cudaCheck(cudaGraphDestroy(graph));
    return exec;
}

struct GraphCache {
    std::map<GraphKey, cudaGraphExec_t> graphs;  // nullptr: seen once, run eagerly

    template <typename Launches>
    void run(const GraphKey& key, const Launches& launches) {
        auto found = graphs.find(key);
        if (found == graphs.end()) {
            launches();
            graphs[key] = nullptr;
            return;
        }
        if (found->second == nullptr) { found->second = graph_capture(launches); }
        cudaCheck(cudaGraphLaunch(found->second, cudaStreamPerThread));
    }

    void clear() {
        for (auto& entry : graphs) {
            if (entry.second != nullptr) { cudaCheck(cudaGraphExecDestroy(entry.second)); }
        }
        graphs.clear();
    }
};

__device__ inline float4 operator+(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ inline float4 operator-(float4 a, float4 b) { return make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w); }
__device__ inline float4 operator*(float4 a, float4 b) { return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w); }
__device__ inline float4 operator*(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
__device__ inline float sum4(float4 a) { return (a.x + a.y) + (a.z + a.w); }

// Reduction over the block with op (identity: its neutral value), returned to every thread; a
// fixed reduction tree, so deterministic.
template <typename Op>
__device__ float block_reduce(float value, Op op, float identity) {
    __shared__ float warp_results[32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    float warp_result = cg::reduce(warp, value, op);
    if (warp.thread_rank() == 0) { warp_results[warp.meta_group_rank()] = warp_result; }
    block.sync();
    float partial = warp.thread_rank() < warp.meta_group_size() ? warp_results[warp.thread_rank()] : identity;
    float result = cg::reduce(warp, partial, op);
    block.sync();
    return result;
}

__device__ float block_sum(float value) { return block_reduce(value, cg::plus<float>(), 0.0f); }

// A 64-bit mix (SplitMix64's finaliser): counter-based random numbers on the host and the device.
__device__ __host__ inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Cross-block reductions without float atomics: each block of a group writes its partial sums,
// then calls this; it returns true in the one block that arrives last, which then sums all
// partials in block order. atomicInc wraps the counter back to 0 for the next launch.
__device__ bool arrive_last_in_group(unsigned int* counter, unsigned int group_size) {
    __shared__ bool is_last;
    __threadfence();  // this thread's partials are visible device-wide before the ticket
    __syncthreads();
    if (cg::this_thread_block().thread_rank() == 0) { is_last = atomicInc(counter, group_size - 1) == group_size - 1; }
    __syncthreads();
    return is_last;
}

// dst[c] = the sum over the rows of partials (rows, cols) of column c, in a fixed order: a block of
// 32 x 8 threads takes 32 columns, stripe y of it rows y, y + 8, ..., then the stripes in order.
__global__ void column_sums_kernel(float* dst, const float* partials, int rows, int cols) {
    __shared__ float stripe_sums[8][32];
    int col = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (col < cols) {
        for (int r = threadIdx.y; r < rows; r += 8) { sum += partials[(size_t)r * cols + col]; }
    }
    stripe_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float total = stripe_sums[0][threadIdx.x];
        for (int y = 1; y < 8; y++) { total += stripe_sums[y][threadIdx.x]; }
        dst[col] = total;
    }
}

static void column_sums(float* dst, const float* partials, int rows, int cols) {
    column_sums_kernel<<<ceil_div(cols, 32), dim3(32, 8)>>>(dst, partials, rows, cols);
    cudaCheck(cudaGetLastError());
}

// dst (n4 float4) = first + rest[0] + rest[1] + ... + rest[count - 1], added in that order, the
// rest stride4 float4 apart; dst may be first.
__global__ void sum_arrays_kernel(float4* dst, const float4* first, const float4* rest, size_t stride4, int count,
                                  size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) { return; }
    float4 sum = first[i];
    for (int k = 0; k < count; k++) { sum = sum + rest[k * stride4 + i]; }
    dst[i] = sum;
}

// n and stride multiples of 4.
static void sum_arrays(float* dst, const float* first, const float* rest, size_t stride, int count, size_t n,
                       cudaStream_t stream = 0) {
    sum_arrays_kernel<<<ceil_div(n / 4, 256), 256, 0, stream>>>((float4*)dst, (const float4*)first,
                                                                (const float4*)rest, stride / 4, count, n / 4);
    cudaCheck(cudaGetLastError());
}

// dst += src (n a multiple of 4), as one GPU adds a micro-step's gradients to those accumulated
// before it (and the backward pass adds the residual stream when it recomputes residual2).
static void add_inplace(float* dst, const float* src, size_t n, cudaStream_t stream) {
    sum_arrays(dst, dst, src, 0, 1, n, stream);
}

// ----------------------------------------------------------------------------------------------
// Encoder: out = wte[token] + wpe[position]

// Token (b, t) sits at position first_position + t: the device's *first_position when generating
// (a decode step's T = 1 token), else 0.
__global__ void encoder_forward_kernel(float4* out, const int* tokens, const float4* wte, const float4* wpe,
                                       const int* first_position, int B, int T, int C4) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C4) { return; }
    size_t bt = idx / C4;
    int c4 = (int)(idx % C4);
    int t = (int)(bt % T) + (first_position != nullptr ? *first_position : 0);
    out[idx] = wte[(size_t)tokens[bt] * C4 + c4] + wpe[(size_t)t * C4 + c4];
}

static void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                            const int* first_position, int B, int T, int C) {
    const int block_size = 256;
    size_t n = (size_t)B * T * C / 4;
    encoder_forward_kernel<<<ceil_div(n, block_size), block_size>>>((float4*)out, tokens, (const float4*)wte,
                                                                    (const float4*)wpe, first_position, B, T, C / 4);
    cudaCheck(cudaGetLastError());
}

// dwpe[t] = sum over b of dout[b, t] for t < T, 0 for T <= t < maxT: one thread per (t, 4 channels),
// batches summed in order.
__global__ void wpe_backward_kernel(float4* dwpe, const float4* dout, int B, int T, int maxT, int C4) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)maxT * C4) { return; }
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (idx < (size_t)T * C4) {
        for (int b = 0; b < B; b++) { sum = sum + dout[(size_t)b * T * C4 + idx]; }
    }
    dwpe[idx] = sum;
}

// The batch's positions grouped by token id (counting sort), for the deterministic wte gradient:
// a token's positions, in increasing order, fill one bucket, or several consecutive buckets of
// WTE_BUCKET_POSITIONS (the last one shorter) when the token is frequent. Such a token's buckets
// form a group; groups are numbered in token order.
constexpr int WTE_BUCKET_POSITIONS = 8;

// At most this many groups over n positions: a group's token has more positions than a bucket.
static size_t max_bucket_groups(size_t n) { return n / WTE_BUCKET_POSITIONS; }

struct TokenBuckets {
    int num_buckets, num_groups;
    std::vector<int> tokens;     // [num_buckets] token id of each bucket
    std::vector<int> starts;     // [num_buckets + 1] bucket i holds positions[starts[i] .. starts[i+1])
    std::vector<int> positions;  // [B*T] positions b*T + t, increasing within a token
    std::vector<int> groups;     // [num_buckets] the bucket's group, -1 for a token's only bucket
    std::vector<int> group_bounds;  // [2 num_groups] group g holds buckets [bounds[2g], bounds[2g+1])
    std::vector<int> counts;     // [V] scratch: each token's count, then its next slot in positions
};

static void token_buckets_build(TokenBuckets* tb, const int* tokens, int n, int vocab_size, int bucket_positions) {
    tb->counts.assign(vocab_size, 0);
    for (int i = 0; i < n; i++) { tb->counts[tokens[i]]++; }
    tb->tokens.clear();
    tb->starts.clear();
    tb->groups.clear();
    tb->group_bounds.clear();
    int offset = 0;
    for (int v = 0; v < vocab_size; v++) {  // counts[v] becomes where token v's next position goes
        int count = tb->counts[v];
        if (count == 0) { continue; }
        int group = count > bucket_positions ? (int)tb->group_bounds.size() / 2 : -1;
        if (group >= 0) { tb->group_bounds.push_back((int)tb->tokens.size()); }
        for (int first = 0; first < count; first += bucket_positions) {
            tb->tokens.push_back(v);
            tb->starts.push_back(offset + first);
            tb->groups.push_back(group);
        }
        if (group >= 0) { tb->group_bounds.push_back((int)tb->tokens.size()); }
        tb->counts[v] = offset;
        offset += count;
    }
    tb->starts.push_back(offset);
    tb->num_buckets = (int)tb->tokens.size();
    tb->num_groups = (int)tb->group_bounds.size() / 2;
    tb->positions.resize(n);
    for (int i = 0; i < n; i++) { tb->positions[tb->counts[tokens[i]]++] = i; }
}

// dwte[token] += sum of dout over the positions holding that token (TokenBuckets): a block takes
// buckets blockIdx.x, + gridDim.x, ... up to the device's *num_buckets (a grid that does not depend
// on the batch, as a CUDA graph needs), summing each one's positions in increasing order. A
// token's only bucket adds its sum directly; the buckets of a group write theirs to partials (one
// row per bucket), and the group's last block to finish adds them in bucket order.
__global__ void wte_backward_kernel(float4* dwte, float4* partials, unsigned int* counters, const float4* dout,
                                    const int* num_buckets, const int* bucket_tokens, const int* bucket_starts,
                                    const int* bucket_positions, const int* bucket_groups, const int* group_bounds,
                                    int C4) {
    for (int bucket = blockIdx.x; bucket < *num_buckets; bucket += gridDim.x) {
        int group = bucket_groups[bucket];
        size_t token = bucket_tokens[bucket];
        int begin = bucket_starts[bucket], end = bucket_starts[bucket + 1];
        for (int c4 = threadIdx.x; c4 < C4; c4 += blockDim.x) {
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int i = begin; i < end; i++) { sum = sum + dout[(size_t)bucket_positions[i] * C4 + c4]; }
            if (group < 0) { dwte[token * C4 + c4] = dwte[token * C4 + c4] + sum; }
            else { partials[(size_t)bucket * C4 + c4] = sum; }
        }
        if (group < 0) { continue; }
        int first = group_bounds[2 * group], last = group_bounds[2 * group + 1];
        if (!arrive_last_in_group(&counters[group], last - first)) { continue; }
        for (int c4 = threadIdx.x; c4 < C4; c4 += blockDim.x) {
            float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int b = first; b < last; b++) { total = total + __ldcg(&partials[(size_t)b * C4 + c4]); }
            dwte[token * C4 + c4] = dwte[token * C4 + c4] + total;
        }
    }
}

// The encoder's gradients from dout (B, T, C): dwte += those of the tokens (onto the LM head's share)
// and dwpe (maxT, C) = those of the positions; the positions in buckets as TokenBuckets (uploaded:
// num_buckets, tokens, starts, positions, groups, group_bounds) lays them out; partials (num_buckets
// x C floats, at most B*T x C) and counters (num_groups, zero) are scratch.
static void encoder_backward(float* dwte, float* dwpe, float* partials, unsigned int* counters, const float* dout,
                             const int* num_buckets, const int* bucket_tokens, const int* bucket_starts,
                             const int* bucket_positions, const int* bucket_groups, const int* group_bounds, int B,
                             int T, int maxT, int C) {
    unsigned int grid = std::min((unsigned int)B * T, 16u * g_num_sms);  // B*T positions: at most B*T buckets
    wte_backward_kernel<<<grid, std::min(1024u, ceil_div(C / 4, 32) * 32)>>>(
        (float4*)dwte, (float4*)partials, counters, (const float4*)dout, num_buckets, bucket_tokens, bucket_starts,
        bucket_positions, bucket_groups, group_bounds, C / 4);
    cudaCheck(cudaGetLastError());
    wpe_backward_kernel<<<ceil_div((size_t)maxT * C / 4, 256), 256>>>((float4*)dwpe, (const float4*)dout, B, T, maxT,
                                                                      C / 4);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// LayerNorm: out = (x - mean) * rstd * weight + bias over the C channels of each row, eps 1e-5

// One warp per row, the row in registers (CHUNKS float4 per lane, CHUNKS*128 >= C). With a
// second input the residual add is fused in: x = inp + inp2 is also written to residual_out.
template <int CHUNKS>
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, float* residual_out, const float* inp,
                                         const float* inp2, const float* weight, const float* bias, int N, int C) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) { return; }
    int C4 = C / 4, lane = warp.thread_rank();
    size_t offset = (size_t)row * C4;
    float4 x[CHUNKS];
    float sum = 0.0f;
    for (int k = 0; k < CHUNKS; k++) {  // all loads before the residual stores, which could alias them
        int c4 = lane + 32 * k;
        x[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c4 < C4) {
            x[k] = ((const float4*)inp)[offset + c4];
            if (inp2 != nullptr) { x[k] = x[k] + ((const float4*)inp2)[offset + c4]; }
        }
        sum += sum4(x[k]);
    }
    for (int k = 0; k < CHUNKS && inp2 != nullptr; k++) {
        if (lane + 32 * k < C4) { ((float4*)residual_out)[offset + lane + 32 * k] = x[k]; }
    }
    float m = cg::reduce(warp, sum, cg::plus<float>()) / C;
    float sum_sq = 0.0f;
    for (int k = 0; k < CHUNKS; k++) {
        float4 d = x[k] - make_float4(m, m, m, m);
        if (lane + 32 * k < C4) { sum_sq += sum4(d * d); }
    }
    float r = 1.0f / sqrtf(cg::reduce(warp, sum_sq, cg::plus<float>()) / C + 1e-5f);
    for (int k = 0; k < CHUNKS; k++) {
        int c4 = lane + 32 * k;
        if (c4 < C4) {
            float4 xhat = (x[k] - make_float4(m, m, m, m)) * r;
            ((float4*)out)[offset + c4] = xhat * ((const float4*)weight)[c4] + ((const float4*)bias)[c4];
        }
    }
    if (lane == 0 && mean != nullptr) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// Calls LAUNCH(K) with the smallest supported register chunk count K >= ceil(C / 128).
#define DISPATCH_CHUNKS(C, LAUNCH)                   \
    do {                                             \
        int chunks_ = ceil_div((C), 128);            \
        if (chunks_ <= 2) { LAUNCH(2); }             \
        else if (chunks_ <= 4) { LAUNCH(4); }        \
        else if (chunks_ <= 6) { LAUNCH(6); }        \
        else if (chunks_ <= 8) { LAUNCH(8); }        \
        else if (chunks_ <= 10) { LAUNCH(10); }      \
        else if (chunks_ <= 13) { LAUNCH(13); }      \
        else { LAUNCH(16); }                         \
    } while (0)

// out = layernorm(inp [+ inp2]); with inp2, residual_out = inp + inp2 as well; mean and rstd (per row)
// when given.
static void layernorm_forward(float* out, float* mean, float* rstd, float* residual_out, const float* inp,
                              const float* inp2, const float* weight, const float* bias, int N, int C) {
    const int block_size = 256;
    unsigned int grid = ceil_div(N, block_size / 32);
#define LAUNCH_LAYERNORM_FORWARD(K) \
    layernorm_forward_kernel<K><<<grid, block_size>>>(out, mean, rstd, residual_out, inp, inp2, weight, bias, N, C)
    DISPATCH_CHUNKS(C, LAUNCH_LAYERNORM_FORWARD);
#undef LAUNCH_LAYERNORM_FORWARD
    cudaCheck(cudaGetLastError());
}

// LayerNorm backward: dinp += dx, dweight = sum over rows of dout * xhat, dbias = sum of dout.
// A thread per float4 channel (the block spans a row; C <= 2048), the grid as many blocks as fit
// on the chip at once. A block takes LAYERNORM_BACKWARD_ROWS rows at a time, their dout, inp and
// dinp loaded before the first use; each row's two sums over C go through shared memory. Every
// block writes its dweight and dbias shares to partials[block][2C]; a second kernel adds the
// partials in block order, a block per group of columns. Deterministic for a fixed grid.
constexpr int LAYERNORM_BACKWARD_ROWS = 4;
constexpr int LAYERNORM_BACKWARD_MAX_BLOCKS_PER_SM = 8;
constexpr int FINAL_SUM_COLUMNS = 8;  // float4 columns per group of the final sum

__host__ __device__ inline int final_sum_groups(int C) { return ceil_div(2 * C / 4, FINAL_SUM_COLUMNS); }

// dweight, dbias = the sum over num_partials rows of partials (each 2 C4 float4: the dweight
// shares, then the dbias shares) of the FINAL_SUM_COLUMNS float4 columns of this group. Stripe s
// of the block adds rows s, s + stripes, ... in order, then the stripes' sums are added in stripe
// order: a fixed order with many loads in flight.
__device__ void final_sum_column_group(float* dweight, float* dbias, const float4* partials, int num_partials, int C4,
                                       int group) {
    const int max_stripes = 32;
    __shared__ float4 stripe_sums[max_stripes][FINAL_SUM_COLUMNS];
    int stripes = min(max_stripes, (int)blockDim.x / FINAL_SUM_COLUMNS);
    int lane = threadIdx.x % FINAL_SUM_COLUMNS, stripe = threadIdx.x / FINAL_SUM_COLUMNS;
    int column = FINAL_SUM_COLUMNS * group + lane;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (stripe < stripes && column < 2 * C4) {
        for (int p = stripe; p < num_partials; p += stripes) { sum = sum + __ldcg(&partials[(size_t)p * 2 * C4 + column]); }
    }
    if (stripe < stripes) { stripe_sums[stripe][lane] = sum; }
    __syncthreads();
    if (stripe == 0 && column < 2 * C4) {
        float4 total = stripe_sums[0][lane];
        for (int s = 1; s < stripes; s++) { total = total + stripe_sums[s][lane]; }
        float4* target = column < C4 ? (float4*)dweight + column : (float4*)dbias + (column - C4);
        *target = total;
    }
    __syncthreads();  // stripe_sums is reused by the next group
}

__global__ void layernorm_backward_kernel(float* dinp, float* partials, const float* dout, const float* inp,
                                          const float* weight, const float* mean, const float* rstd, int N, int C) {
    const int ROWS = LAYERNORM_BACKWARD_ROWS;
    __shared__ float2 warp_sums[2][ROWS][32];  // [step parity][row][warp]: sum of g, of g * xhat
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int C4 = C / 4, c4 = threadIdx.x;
    bool active = c4 < C4;
    float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 w = active ? ((const float4*)weight)[c4] : zero, dw = zero, db = zero;
    int parity = 0;
    for (int first = blockIdx.x * ROWS; first < N; first += gridDim.x * ROWS, parity ^= 1) {
        float4 d[ROWS], xhat[ROWS], old[ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            int row = first + j;
            bool valid = active && row < N;
            size_t i = (size_t)row * C4 + c4;
            d[j] = valid ? ((const float4*)dout)[i] : zero;
            old[j] = valid ? ((const float4*)dinp)[i] : zero;
            float4 x = valid ? ((const float4*)inp)[i] : zero;
            xhat[j] = valid ? (x - make_float4(mean[row], mean[row], mean[row], mean[row])) * rstd[row] : zero;
        }
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            float4 g = d[j] * w;  // the gradient wrt xhat
            float2 sums = make_float2(cg::reduce(warp, sum4(g), cg::plus<float>()),
                                      cg::reduce(warp, sum4(g * xhat[j]), cg::plus<float>()));
            if (warp.thread_rank() == 0) { warp_sums[parity][j][warp.meta_group_rank()] = sums; }
        }
        block.sync();  // one barrier per step: the other parity's buffer is free, all passed the last one
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            int row = first + j;
            if (!active || row >= N) { continue; }
            float sum_g = 0.0f, sum_g_xhat = 0.0f;
            for (int k = 0; k < warp.meta_group_size(); k++) {
                sum_g += warp_sums[parity][j][k].x;
                sum_g_xhat += warp_sums[parity][j][k].y;
            }
            float mean_g = sum_g / C, mean_g_xhat = sum_g_xhat / C;
            float4 dx = (d[j] * w - make_float4(mean_g, mean_g, mean_g, mean_g) - xhat[j] * mean_g_xhat) * rstd[row];
            ((float4*)dinp)[(size_t)row * C4 + c4] = old[j] + dx;
            dw = dw + d[j] * xhat[j];
            db = db + d[j];
        }
    }
    if (active) {
        ((float4*)partials)[(size_t)blockIdx.x * 2 * C4 + c4] = dw;
        ((float4*)partials)[(size_t)blockIdx.x * 2 * C4 + C4 + c4] = db;
    }
}

// dweight, dbias = the sums of the blocks' partials, a block per column group; queued with
// launch_pdl, so that it is launched while the row kernel's last blocks run.
__global__ void layernorm_backward_sums_kernel(float* dweight, float* dbias, const float* partials, int num_partials,
                                               int C) {
    pdl_wait();
    final_sum_column_group(dweight, dbias, (const float4*)partials, num_partials, C / 4, blockIdx.x);
}

static int layernorm_backward_block(int C) { return ceil_div(C / 4, 32) * 32; }

// As many blocks as fit at once, at most 8 per SM: each block loops over rows.
static int layernorm_backward_grid(int C) {
    static int cached_C = 0, cached_grid = 0;
    if (C != cached_C) {
        int per_sm = 0;
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, layernorm_backward_kernel,
                                                                layernorm_backward_block(C), 0));
        if (per_sm == 0) { fail("layernorm_backward: no block of %d threads fits on an SM", layernorm_backward_block(C)); }
        cached_C = C;
        cached_grid = g_num_sms * std::min(per_sm, LAYERNORM_BACKWARD_MAX_BLOCKS_PER_SM);
    }
    return cached_grid;
}

// partials: layernorm_backward_grid(C) * 2C floats of scratch.
static void layernorm_backward(float* dinp, float* dweight, float* dbias, float* partials, const float* dout,
                               const float* inp, const float* weight, const float* mean, const float* rstd, int N,
                               int C) {
    int grid = layernorm_backward_grid(C);
    layernorm_backward_kernel<<<grid, layernorm_backward_block(C)>>>(dinp, partials, dout, inp, weight, mean, rstd, N, C);
    cudaCheck(cudaGetLastError());
    launch_pdl(layernorm_backward_sums_kernel, final_sum_groups(C), 256, dweight, dbias, partials, grid, C);
}

// ----------------------------------------------------------------------------------------------
// GELU (tanh form)

// The GELU and its derivative.
constexpr float GELU_SCALING_FACTOR = 0.7978845608028654f;  // sqrt(2 / pi)

__device__ inline float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x)));
}

__device__ inline float gelu_grad(float x) {
    float th = tanhf(GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

// The GELU's backward is fused into the fc layer's bias gradient (bias_backward with gelu_inp).

__global__ void gelu_forward_kernel(float4* out, const float4* inp, size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) { return; }
    float4 x = inp[i];
    out[i] = make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w));
}

static void gelu_forward(float* out, const float* inp, size_t n) {
    gelu_forward_kernel<<<ceil_div(n / 4, 256), 256>>>((float4*)out, (const float4*)inp, n / 4);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// Hopper primitives (sm_90a): the warpgroup MMA (wgmma) on shared-memory panels, for the flash
// forward and our GEMM (section 6), which adds TMA copies completing on mbarriers.
// Shared tiles are panels of 32 columns, [rows][32] floats (128-byte rows), the 16-byte chunks of
// row r XOR-permuted by r % 8: wgmma's (and TMA's) 128-byte swizzle, each panel 1024-byte aligned
// (descriptor: 1024 bytes between 8-row core groups). TF32 wgmma reads shared operands only along
// the summed dimension (K-major); an A operand from registers may be loaded in any order. The
// accumulator fragment is mma.sync's C layout per warp w of the warpgroup: rows 16w + g and
// 16w + g + 8 (g = lane / 4), columns 8n + 2q and + 1 (q = lane % 4) at d[4n .. 4n + 3].

__device__ __forceinline__ uint32_t shared_address(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// The first 1024-byte-aligned float of the dynamic shared memory: an offset from the array, so that
// the compiler still knows the address space (an aligned integer cast back to a pointer would make
// every access through it a generic one, with 64-bit addresses: ST.E, not STS).
__device__ __forceinline__ float* shared_aligned_1024(float* shared_raw) {
    return shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023) / sizeof(float);
}

// Float offset of (row, col) in a panelled tile of `rows` rows.
__device__ __forceinline__ int panel_offset(int row, int col, int rows) {
    return (col >> 5) * rows * 32 + row * 32 + ((((col >> 2) & 7) ^ (row & 7)) << 2) + (col & 3);
}

// k-step ks (8 columns) of a panelled tile of `rows` rows.
__device__ __forceinline__ const float* panel_step(const float* tile, int ks, int rows) {
    return tile + (ks >> 2) * rows * 32 + 8 * (ks & 3);
}

// Shared-memory matrix descriptor: 128-byte swizzle, 1024 bytes between 8-row core groups.
__device__ __forceinline__ uint64_t wgmma_descriptor(const float* tile) {
    uint64_t address = shared_address(tile);
    return ((address & 0x3ffff) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Keeps the compiler from moving accesses to accumulators across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void pin_registers(float* r) {
#pragma unroll
    for (int i = 0; i < N; i++) { asm volatile("" : "+f"(r[i])::"memory"); }
}

#define WG_D8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_A4(a) "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])), \
                 "r"(__float_as_uint(a[3]))

// d (64 x 64) = [d +] A (64 x 8, shared) * B (64 x 8, shared)^T
__device__ __forceinline__ void wgmma_64x64_shared(float d[32], uint64_t a, uint64_t b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, "
        "%33, p, 1, 1;\n}\n"
        : WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24)
        : "l"(a), "l"(b), "r"((int)accumulate));
}

// d (64 x 64) += A (64 x 8, registers) * B (64 x 8, shared)^T
__device__ __forceinline__ void wgmma_64x64_registers(float d[32], const float a[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, "
        "%33, %34, %35}, %36, 1, 1, 1;\n"
        : WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24)
        : WG_A4(a), "l"(b));
}

// d (64 x 32) += A (64 x 8, registers) * B (32 x 8, shared)^T
__device__ __forceinline__ void wgmma_64x32_registers(float d[16], const float a[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1;\n"
        : WG_D8(d, 0), WG_D8(d, 8)
        : WG_A4(a), "l"(b));
}

// d (64 x 128) = [d +] A (64 x 8, registers) * B (128 x 8, shared)^T
__device__ __forceinline__ void wgmma_64x128_registers(float d[64], const float a[4], uint64_t b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24), WG_D8(d, 32), WG_D8(d, 40), WG_D8(d, 48),
          WG_D8(d, 56)
        : WG_A4(a), "l"(b), "r"((int)accumulate));
}

// Waits until at most one committed group of this warpgroup's MMAs is still running.
__device__ __forceinline__ void wgmma_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// d (64 x 192) += A (64 x 8) B (192 x 8)^T, both panels in shared memory
__device__ __forceinline__ void wgmma_64x192_accumulate(float d[96], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n192k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
        "}, %96, %97, 1, 1, 1;\n"
        : WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24), WG_D8(d, 32), WG_D8(d, 40), WG_D8(d, 48),
          WG_D8(d, 56), WG_D8(d, 64), WG_D8(d, 72), WG_D8(d, 80), WG_D8(d, 88)
        : "l"(a), "l"(b));
}

// mbarriers in shared memory: a phase completes when its count of arrivals has come and the bytes
// announced by expect_bytes have landed; waits name the phase's parity (0, 1, 0, ...).
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals));
}
// The inits, visible to the copy engine (then a barrier of the block).
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}

// Arrives and announces `bytes` that copies will bring in this phase.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* barrier, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(shared_address(barrier)), "r"(parity)
            : "memory");
    }
}

// The box of a 2D tensor map at (col, row) into shared memory, completing on barrier.
__device__ __forceinline__ void tma_load_2d(float* dst, const CUtensorMap* map, int col, int row, uint64_t* barrier) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(shared_address(dst)), "l"(map), "r"(col), "r"(row), "r"(shared_address(barrier))
        : "memory");
}

// The box of a 2D tensor map at (col, row) from shared memory (what lies outside the tensor is not
// written), in this thread's bulk group; commit, then wait until the group has read shared memory
// (the buffer is free) or has written all of it.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int col, int row, const float* src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 ::"l"(map), "r"(col), "r"(row), "r"(shared_address(src)) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(PENDING) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// A barrier of `threads` threads on hardware barrier `id` (1-15; 0 is __syncthreads'); arriving
// counts this thread without waiting.
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Four 8 x 8 matrices of 16-bit values from shared memory (ldmatrix .x4), lane l giving the address
// of row l % 8 of matrix l / 8 (16 bytes); of 32-bit values (8 x 4 each), r[i] is matrix i's at
// (row lane / 4, column lane % 4): mma's A fragment of a 16 x 8 tile from its four 8 x 4 quarters.
__device__ __forceinline__ void ldmatrix_x4(float r[4], const float* row) {
    uint32_t u[4];
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3])
                 : "r"(shared_address(row)));
    for (int i = 0; i < 4; i++) { r[i] = __uint_as_float(u[i]); }
}

// A warpgroup's registers per thread, raised or lowered (the kernel's cap at entry must allow the total).
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_registers_raise() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_registers_lower() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}

// cuTensorMapEncodeTiled, the driver's, reached through the runtime (no link to libcuda).
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (encode == nullptr) {
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault,
                                                   &found));
#else
        cudaCheck(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void**)&encode, cudaEnableDefault, &found));
#endif
        if (found != cudaDriverEntryPointSuccess) { fail("the CUDA driver has no cuTensorMapEncodeTiled"); }
    }
    return encode;
}

// A row-major (rows, cols) float matrix, leading dimension ld (a multiple of 4, 16-byte aligned base),
// copied in boxes of box_rows x 32 columns into 128-byte-swizzled panels; reads past the edges give 0.
static CUtensorMap tensor_map_panels(const float* base, size_t rows, size_t cols, size_t ld, int box_rows) {
    CUtensorMap map;
    cuuint64_t dims[2] = {cols, rows}, strides[1] = {ld * sizeof(float)};
    cuuint32_t box[2] = {32, (cuuint32_t)box_rows}, element_strides[2] = {1, 1};
    CUresult result = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void*)base, dims, strides, box,
                                           element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
        fail("tensor map of a %zu x %zu matrix (ld %zu): error %d", rows, cols, ld, (int)result);
    }
    return map;
}

// ----------------------------------------------------------------------------------------------
// Matrix products through cuBLASLt, in cuBLAS's column-major terms:
//   out (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * out  [+ bias[m] broadcast over n]
// A row-major (R x K) matrix is a column-major (K x R) one, so the row-major linear layer
// out (BT x OC) = inp (BT x C) @ W^T is out^T = W^T-as-stored(op T) * inp^T-as-stored(op N), m = OC.
// Plans (layouts, the heuristic's algorithm) are made once per shape and cached.

struct MatmulPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, out_layout;
    cublasLtMatmulAlgo_t algo;
};

static std::map<std::array<int64_t, 14>, MatmulPlan> g_matmul_plans;

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

// One product's shape: out (m x n) = op(A) (m x k) op(B) (k x n), A and B with leading dimensions
// lda and ldb, batch products stride_* floats apart; tf32: on the tensor cores.
struct MatmulShape {
    int m, n, k;
    bool trans_a, trans_b;
    int lda, ldb, batch;
    size_t stride_a, stride_b, stride_out;
    bool tf32;
};

static MatmulPlan* matmul_plan(const MatmulShape& s, bool has_bias, uint32_t alignment) {
    std::array<int64_t, 14> key = {s.m, s.n, s.k, s.trans_a, s.trans_b, s.lda, s.ldb, has_bias, s.batch,
                                   (int64_t)s.stride_a, (int64_t)s.stride_b, (int64_t)s.stride_out, alignment, s.tf32};
    auto found = g_matmul_plans.find(key);
    if (found != g_matmul_plans.end()) { return &found->second; }

    MatmulPlan plan;
    cublasComputeType_t compute = s.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasCheck(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
    cublasOperation_t op_a = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasLtEpilogue_t epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    plan.a_layout = s.trans_a ? make_layout(s.k, s.m, s.lda, s.batch, s.stride_a)
                              : make_layout(s.m, s.k, s.lda, s.batch, s.stride_a);
    plan.b_layout = s.trans_b ? make_layout(s.n, s.k, s.ldb, s.batch, s.stride_b)
                              : make_layout(s.k, s.n, s.ldb, s.batch, s.stride_b);
    plan.out_layout = make_layout(s.m, s.n, s.m, s.batch, s.stride_out);

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
        fail("cuBLASLt has no algorithm for m=%d n=%d k=%d transA=%d transB=%d bias=%d batch=%d", s.m, s.n, s.k,
             s.trans_a, s.trans_b, has_bias, s.batch);
    }
    plan.algo = heuristic.algo;
    return &(g_matmul_plans[key] = plan);
}

// One cuBLASLt call: out = alpha op(A) op(B) + beta out [+ bias].
static void matmul_call(float* out, const float* a, const float* b, const float* bias, const MatmulShape& s,
                        float alpha, float beta, cudaStream_t stream) {
    uint32_t alignment = common_alignment({(uint64_t)out, (uint64_t)a, (uint64_t)b, (uint64_t)bias, 4ull * s.m,
                                           4ull * s.lda, 4ull * s.ldb, 4 * s.stride_a, 4 * s.stride_b,
                                           4 * s.stride_out});
    MatmulPlan* plan = matmul_plan(s, bias != nullptr, alignment);
    if (bias != nullptr) {
        cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    // Stream 0 is this thread's default stream (nvcc --default-stream per-thread), which cuBLAS, built
    // apart, would read as the legacy stream: it is named explicitly.
    cublasCheck(cublasLtMatmul(g_cublaslt, plan->desc, &alpha, a, plan->a_layout, b, plan->b_layout, &beta, out,
                               plan->out_layout, out, plan->out_layout, &plan->algo,
                               stream == g_side_stream ? g_side_workspace : g_cublaslt_workspace,
                               CUBLASLT_WORKSPACE_SIZE, stream == 0 ? cudaStreamPerThread : stream));
}

// Round to nearest (ties away) to TF32 for finite x: the tensor cores then read the top 19 bits.
__device__ __forceinline__ float tf32_round(float x) {
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}

// x as the tensor cores read it: its top 19 bits.
__device__ __forceinline__ float tf32_truncate(float x) { return __uint_as_float(__float_as_uint(x) & 0xffffe000u); }

// Split TF32 (-f 0): x = hi + lo, hi = tf32_round(x) and lo = tf32_round(x - hi), both exact TF32
// values, so that a TF32 product reads them whole; hi lo + lo hi + hi hi (the dropped lo lo under
// 2^-22 of |x y|) is as accurate as an FP32 product. Each of batch matrices in (rows, cols), in_stride
// floats apart, goes to hi and lo with leading dimension ld, out_stride floats apart. Block (x, y, z)
// of 32 x 8 threads: 32 x V columns of every 8 gridDim.y-th row of matrix z, V values per thread.
template <int V>
__global__ void split_tf32_kernel(float* hi, float* lo, const float* in, int rows, int cols, size_t ld,
                                  size_t in_stride, size_t out_stride) {
    using Vec = std::conditional_t<V == 4, float4, float>;
    int col = (blockIdx.x * 32 + threadIdx.x) * V;
    if (col >= cols) { return; }
    for (size_t row = blockIdx.y * 8 + threadIdx.y; row < (size_t)rows; row += gridDim.y * 8) {
        Vec x = *(const Vec*)(in + blockIdx.z * in_stride + row * cols + col);
        Vec x_hi, x_lo;
        const float* xs = (const float*)&x;
        float *h = (float*)&x_hi, *l = (float*)&x_lo;
        for (int i = 0; i < V; i++) {
            h[i] = tf32_round(xs[i]);
            l[i] = tf32_round(xs[i] - h[i]);
        }
        size_t out = blockIdx.z * out_stride + row * ld + col;
        *(Vec*)(hi + out) = x_hi;
        *(Vec*)(lo + out) = x_lo;
    }
}

// float4 where every row starts 16-byte aligned in and out, else one value per thread.
static void split_tf32(float* hi, float* lo, const float* in, int rows, int cols, size_t ld, int batch,
                       size_t in_stride, size_t out_stride, cudaStream_t stream = 0) {
    bool vec = common_alignment({(uint64_t)hi, (uint64_t)lo, (uint64_t)in, 4ull * cols, 4 * ld, 4 * in_stride,
                                 4 * out_stride}) >= 16;
    auto kernel = vec ? split_tf32_kernel<4> : split_tf32_kernel<1>;
    dim3 grid(ceil_div(cols, 32 * (vec ? 4 : 1)), std::min((int)ceil_div(rows, 8), 65535), batch);
    kernel<<<grid, dim3(32, 8), 0, stream>>>(hi, lo, in, rows, cols, ld, in_stride, out_stride);
    cudaCheck(cudaGetLastError());
}

// The split products' operands, made per product into scratch of the stream: [0] the main
// stream's, [1] the side stream's (split_scratch_reserve).
static float* g_split_scratch[2];
static size_t g_split_scratch_floats[2];

static void split_scratch_reserve(size_t main_floats, size_t side_floats) {
    size_t wanted[2] = {main_floats, side_floats};
    for (int i = 0; i < 2; i++) {
        if (wanted[i] <= g_split_scratch_floats[i]) { continue; }
        if (g_split_scratch[i] != nullptr) { device_free(g_split_scratch[i]); }
        g_split_scratch[i] = (float*)device_malloc(wanted[i] * sizeof(float), "split TF32 operands");
        g_split_scratch_floats[i] = wanted[i];
    }
}

// An operand of a split product, its summed dimension doubled: the two parts side by side, in
// rows of 2 x summed values when the summed dimension is the contiguous one, else stacked.
struct SplitOperand {
    float* data;
    int ld;
    size_t stride;     // between batch matrices
    size_t hi_offset;  // where the hi part starts, as an operand of summed dimension k and leading dimension ld
};

// x: batch matrices stride floats apart, each (other, summed) if summed_contiguous, else (summed,
// other); hi_first: [hi | lo], else [lo | hi].
static SplitOperand split_operand(float* scratch, const float* x, int summed, int other, bool summed_contiguous,
                                  bool hi_first, int batch, size_t stride, cudaStream_t stream) {
    SplitOperand op;
    op.data = scratch;
    op.stride = 2 * (size_t)summed * other;
    op.ld = summed_contiguous ? 2 * summed : other;
    size_t second = summed_contiguous ? summed : (size_t)summed * other;  // where the second part starts
    op.hi_offset = hi_first ? 0 : second;
    float* hi = scratch + op.hi_offset;
    float* lo = scratch + (hi_first ? second : 0);
    int rows = summed_contiguous ? other : summed, cols = summed_contiguous ? summed : other;
    split_tf32(hi, lo, x, rows, cols, op.ld, batch, stride, op.stride, stream);
    return op;
}

// Over a long summed dimension the hi hi product drifts toward zero, as if the tensor cores added
// each group of 8 products into their FP32 accumulator rounding toward zero (H100, lab: 1.8e-6 of
// max |out| at K = 768, 7.3e-6 at 3072, 1.8e-5 at 8192, against plain FP32's 0.7-1.0e-6). So hi hi
// runs in chunks of at most g_split_chunk summed values (0: one product), each summed from zero and
// added in FP32: chunks of 256 gave 6-7.5e-7 at every shape, of 384 8.7-9.9e-7 (K = 768), of 512
// 1.2-1.4e-6.
static int g_split_chunk = 256;

// Equal chunks of a summed dimension k, each a multiple of 32 values (128-byte aligned operands);
// the last may be shorter.
static int split_chunk_size(int k) {
    int chunks = g_split_chunk > 0 ? (int)ceil_div(k, g_split_chunk) : 1;
    return (int)ceil_div(ceil_div(k, chunks), 32) * 32;
}

// A product of this many chunks or more adds them through partial sums made by one batched product
// (the weight gradients' 32, the input gradients' and fcproj's 12): one short product per chunk
// under-fills the GPU, with a memset of cuBLASLt's split-K counter each. H100, d12 B=8 -f 0: 124.2
// -> 116.0 ms a step; batching the forward's 3 chunks of K = 768 too cost 0.6 ms (more traffic).
constexpr int SPLIT_BATCHED_MIN_CHUNKS = 8;

// Floats of partial sums a product (m x n) over k needs for its hi hi chunks (0: one by one).
static size_t split_partial_floats(size_t m, size_t n, int k) {
    size_t chunks = ceil_div(k, split_chunk_size(k));
    return chunks >= SPLIT_BATCHED_MIN_CHUNKS ? chunks * m * n : 0;
}

// The product in split TF32: A = [A_hi | A_lo] and B = [B_lo ; B_hi] along a doubled summed
// dimension give the small terms A_hi B_lo + A_lo B_hi in one TF32 product, with the bias, then
// A_hi B_hi is added in chunks: through partial sums (split_partial_floats) where they fit the
// scratch beside the operands, added in chunk order; else one product per chunk added by its
// epilogue (beta = 1).
static void matmul_split(float* out, const float* a, const float* b, const float* bias, MatmulShape s, float alpha,
                         float beta, cudaStream_t stream) {
    int slot = stream == g_side_stream ? 1 : 0;
    size_t a_floats = 2 * (size_t)s.m * s.k * s.batch, b_floats = 2 * (size_t)s.k * s.n * s.batch;
    if (a_floats + b_floats > g_split_scratch_floats[slot]) {
        fail("matmul: split TF32 operands of m=%d n=%d k=%d batch=%d exceed the reserved scratch", s.m, s.n, s.k,
             s.batch);
    }
    float* scratch = g_split_scratch[slot];
    SplitOperand sa = split_operand(scratch, a, s.k, s.m, s.trans_a, true, s.batch, s.stride_a, stream);
    SplitOperand sb = split_operand(scratch + a_floats, b, s.k, s.n, !s.trans_b, false, s.batch, s.stride_b, stream);
    s.lda = sa.ld;
    s.ldb = sb.ld;
    s.stride_a = sa.stride;
    s.stride_b = sb.stride;
    s.tf32 = true;
    MatmulShape cross = s;
    cross.k = 2 * s.k;
    matmul_call(out, sa.data, sb.data, bias, cross, alpha, beta, stream);

    // a chunk's first summed value sits 1 apart along a contiguous summed dimension, else ld apart
    int chunk = split_chunk_size(s.k), full_chunks = s.k / chunk, last = s.k % chunk;
    size_t a_step = (s.trans_a ? 1 : s.lda) * (size_t)chunk, b_step = (s.trans_b ? s.ldb : 1) * (size_t)chunk;
    const float* a_hi = sa.data + sa.hi_offset;
    const float* b_hi = sb.data + sb.hi_offset;
    size_t n = (size_t)s.m * s.n;
    size_t operands = ceil_div(a_floats + b_floats, 4) * 4;  // the partial sums 16-byte aligned (sum_arrays)
    float* partials = scratch + operands;
    size_t partial_floats = split_partial_floats(s.m, s.n, s.k);
    bool at_once = s.batch == 1 && partial_floats > 0 && common_alignment({(uint64_t)out, 4 * n}) >= 16 &&
                   operands + partial_floats <= g_split_scratch_floats[slot];
    if (at_once) {
        MatmulShape part = s;
        part.k = chunk;
        part.batch = full_chunks;
        part.stride_a = a_step;
        part.stride_b = b_step;
        part.stride_out = n;
        matmul_call(partials, a_hi, b_hi, nullptr, part, alpha, 0.0f, stream);
        if (last > 0) {
            part.k = last;
            part.batch = 1;
            matmul_call(partials + full_chunks * n, a_hi + full_chunks * a_step, b_hi + full_chunks * b_step, nullptr,
                        part, alpha, 0.0f, stream);
        }
        sum_arrays(out, out, partials, n, full_chunks + (last > 0), n, stream);
        return;
    }
    for (int c = 0; c < full_chunks + (last > 0); c++) {
        MatmulShape part = s;
        part.k = c < full_chunks ? chunk : last;
        matmul_call(out, a_hi + c * a_step, b_hi + c * b_step, nullptr, part, alpha, 1.0f, stream);
    }
}

// Our GEMM on Hopper (sm_90a, TF32): out (M, N) = a (M, K) b (N, K)^T [+ bias[col]], both operands
// row-major with the summed dimension contiguous. A persistent CTA per multiprocessor takes tiles of
// GEMM_TILE_M x GEMM_TILE_N of out (blockIdx.x, + gridDim.x, ...) in turn to its two consumer
// warpgroups (ping-pong): their main loops take turns (each waits for the other's to end), so that
// while one multiplies its tile the other stores its last one. One thread of warpgroup 0 issues the
// TMA copies of every stage (128 x 32 of a, 192 x 32 of b) into a ring of GEMM_STAGES, in tile
// order, running ahead into the next tile; a consumer multiplies 2 x 64 rows by 192 per stage (4
// wgmma k-steps of 8), keeps one stage's MMAs in flight and frees a stage once the MMAs reading it
// are done; its tile leaves through its two staging buffers in turn and TMA stores (with the GELU,
// the fc layer's pre-activation and its GELU both). Each output has one writer that sums k in
// order: bit-identical run to run. Tiles are numbered in groups of GEMM_GROUP_ROWS row tiles, the
// column tiles swept within a group, so that the CTAs at work at once share their operands in L2.
// The lab (dev/cuda/matmul_wgmma.cu) measures it against cuBLASLt on the trainer's shapes; on an
// H200 it wins fc with the GELU against cuBLASLt then gelu_forward (0.93-0.95 of the time at d12
// B=16, d24, d48; 1.03 at d12 B=4) and the LM head's logits (0.91-1.00), where the trainer uses it
// (fc_forward, lm_head_logits); cuBLASLt is as fast or faster elsewhere. The tensor cores read its
// operands truncated to TF32 (cuBLASLt's come rounded): 6-8e-4 of max |out| against 2-3e-4.
constexpr int GEMM_TILE_M = 128, GEMM_TILE_N = 192;
constexpr int GEMM_STAGES = 4;
constexpr int GEMM_THREADS = 384;      // the producer warpgroup, then the two consumers
constexpr int GEMM_GROUP_ROWS = 16;    // row tiles per group of the raster
constexpr int GEMM_STAGING_FLOATS = 64 * 64;  // a staging buffer: two 32-column panels of 64 rows

// A stage of tiles of GEMM_TILE_M x tile_n: a's panel, then b's.
__host__ __device__ constexpr int gemm_stage_floats(int tile_n) { return (GEMM_TILE_M + tile_n) * 32; }

// The dynamic shared memory of a ring of `stages` for tiles tile_n wide: the stages, the consumers'
// two staging buffers each, the barriers, 1 KB for the alignment.
constexpr size_t gemm_shared_bytes(int stages, int tile_n) {
    return (size_t)stages * (gemm_stage_floats(tile_n) * sizeof(float) + 2 * sizeof(uint64_t)) +
           2 * sizeof(uint64_t) + 4 * GEMM_STAGING_FLOATS * sizeof(float) + 1024;
}

// The first row and column of out of tile `tile` (GEMM_TILE_M x tile_n) in the grouped raster.
__device__ __forceinline__ int2 gemm_tile_origin(int tile, int row_tiles, int col_tiles, int tile_n) {
    int group = tile / (GEMM_GROUP_ROWS * col_tiles), first_row_tile = group * GEMM_GROUP_ROWS;
    int group_rows = min(GEMM_GROUP_ROWS, row_tiles - first_row_tile);
    int in_group = tile - group * GEMM_GROUP_ROWS * col_tiles;
    return make_int2((first_row_tile + in_group % group_rows) * GEMM_TILE_M, in_group / group_rows * tile_n);
}

// 64 rows x COLS of a consumer warpgroup's accumulator (the fragment of "Hopper primitives") + bias
// into out at (row0, col0) through TMA stores, with GELU their GELU into gelu_out as well. Per
// chunk the values are written into one of the consumer's BUFFERS staging buffers in turn (`staged`
// counts the chunks; a buffer is two 128-byte-swizzled 32-column panels, the swizzle sparing shared
// memory's banks), then one thread stores both panels and goes on; before a buffer is written again
// that thread waits until the store of BUFFERS chunks before has read it. A chunk is 64 columns of
// out, or with GELU 32: panel 0 then holds out's and panel 1 their GELU, computed from panel 0
// element by element in a rolled loop (one tanhf in the code rather than one per register). TMA
// leaves out what lies outside out (edge tiles).
template <int COLS, bool GELU, int BUFFERS = 2>
__device__ __forceinline__ void gemm_store_tma(const CUtensorMap* out_map, const CUtensorMap* gelu_map,
                                               const float* bias, float* staging_buffers, int& staged,
                                               const float acc[COLS / 2], int row0, int col0, int N, int barrier_id) {
    constexpr int CHUNK_COLS = GELU ? 32 : 64, PANEL_FLOATS = 64 * 32;
    static_assert(BUFFERS == 1 || BUFFERS == 2, "staging buffers taken in turn by the chunk count's low bit");
    int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4, row = 16 * (threadIdx.x % 128 / 32) + g;
    bool leader = threadIdx.x % 128 == 0;
#pragma unroll
    for (int chunk = 0; chunk < COLS / CHUNK_COLS; chunk++, staged++) {
        float* staging = staging_buffers + (staged & (BUFFERS - 1)) * GEMM_STAGING_FLOATS;
        if (leader) { bulk_wait_read<BUFFERS - 1>(); }
        named_barrier(barrier_id, 128);
#pragma unroll
        for (int n = 0; n < CHUNK_COLS / 8; n++) {
            int c = 8 * n + 2 * q, col = col0 + chunk * CHUNK_COLS + c, i = 4 * (chunk * CHUNK_COLS / 8 + n);
            float2 b = bias != nullptr && col < N ? *(const float2*)(bias + col) : make_float2(0.0f, 0.0f);
            *(float2*)(staging + panel_offset(row, c, 64)) = make_float2(acc[i] + b.x, acc[i + 1] + b.y);
            *(float2*)(staging + panel_offset(row + 8, c, 64)) = make_float2(acc[i + 2] + b.x, acc[i + 3] + b.y);
        }
        if constexpr (GELU) {
            named_barrier(barrier_id, 128);
#pragma unroll 1
            for (int i = threadIdx.x % 128; i < PANEL_FLOATS / 4; i += 128) {
                float4 x = ((const float4*)staging)[i];
                ((float4*)(staging + PANEL_FLOATS))[i] = make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w));
            }
        }
        fence_proxy_async();  // the writes, visible to the copy engine
        named_barrier(barrier_id, 128);
        if (leader) {
            int col = col0 + chunk * CHUNK_COLS;
            tma_store_2d(out_map, col, row0, staging);
            if (GELU) {
                tma_store_2d(gelu_map, col, row0, staging + PANEL_FLOATS);
            } else {
                tma_store_2d(out_map, col + 32, row0, staging + PANEL_FLOATS);
            }
            bulk_commit();
        }
    }
}

// The ring's barriers: a stage's copies have landed (the producer's arrival and the bytes), and the
// `readers` consumer threads that multiply it are done with it.
__device__ __forceinline__ void gemm_ring_init(uint64_t* loaded, uint64_t* consumed, int stages, int readers) {
    for (int s = 0; s < stages; s++) {
        mbarrier_init(&loaded[s], 1);
        mbarrier_init(&consumed[s], readers);
    }
}

// A product's work items: tiles of GEMM_TILE_M x tile_n in the grouped raster, each over one of
// k_parts parts of the summed dimension (part_k_tiles stages of 32 values, the last part the rest);
// item i is tile i % tiles of part i / tiles. CTA c takes items c, c + gridDim.x, ...
struct GemmGrid {
    int row_tiles, col_tiles, tile_n, k_tiles, part_k_tiles, items;
};
struct GemmWork {
    int2 origin;  // out's first row and column
    int part, k_tile0, k_tiles;
};

__host__ __device__ inline GemmGrid gemm_grid(int M, int N, int K, int tile_n, int k_parts) {
    GemmGrid g;
    g.row_tiles = ceil_div(M, GEMM_TILE_M);
    g.col_tiles = ceil_div(N, tile_n);
    g.tile_n = tile_n;
    g.k_tiles = ceil_div(K, 32);
    g.part_k_tiles = ceil_div(g.k_tiles, k_parts);
    g.items = g.row_tiles * g.col_tiles * k_parts;
    return g;
}

__device__ __forceinline__ GemmWork gemm_work(int item, const GemmGrid& g) {
    int tiles = g.row_tiles * g.col_tiles;
    GemmWork w;
    w.origin = gemm_tile_origin(item % tiles, g.row_tiles, g.col_tiles, g.tile_n);
    w.part = item / tiles;
    w.k_tile0 = w.part * g.part_k_tiles;
    w.k_tiles = min(g.part_k_tiles, g.k_tiles - w.k_tile0);
    return w;
}

// The producer, one thread of warpgroup 0: it copies every stage of this CTA's work items in order
// into the ring of STAGES slots STAGE_FLOATS apart (a's GEMM_TILE_M x 32 panel, then b's tile_n x
// 32), a slot refilled once the consumers have freed it, running ahead into the next item. With
// A_T, a is stored transposed (K, M): its panel is GEMM_TILE_M / 32 panels of 32 k-rows x 32 rows of a.
template <int STAGES, int STAGE_FLOATS, bool A_T = false>
__device__ __forceinline__ void gemm_produce(float* stages, uint64_t* loaded, uint64_t* consumed,
                                             const CUtensorMap* a_map, const CUtensorMap* b_map, const GemmGrid& grid) {
    uint32_t bytes = gemm_stage_floats(grid.tile_n) * sizeof(float);
    int filled = 0;  // stages filled so far
    for (int item = blockIdx.x; item < grid.items; item += gridDim.x) {
        GemmWork work = gemm_work(item, grid);
        for (int kt = work.k_tile0; kt < work.k_tile0 + work.k_tiles; kt++, filled++) {
            int slot = filled % STAGES;
            if (filled >= STAGES) { mbarrier_wait(&consumed[slot], (filled / STAGES - 1) & 1); }
            float* stage = stages + slot * STAGE_FLOATS;
            mbarrier_expect_bytes(&loaded[slot], bytes);
            if constexpr (A_T) {
#pragma unroll
                for (int j = 0; j < GEMM_TILE_M / 32; j++) {
                    tma_load_2d(stage + 32 * 32 * j, a_map, work.origin.x + 32 * j, 32 * kt, &loaded[slot]);
                }
            } else {
                tma_load_2d(stage, a_map, 32 * kt, work.origin.x, &loaded[slot]);
            }
            tma_load_2d(stage + GEMM_TILE_M * 32, b_map, 32 * kt, work.origin.y, &loaded[slot]);
        }
    }
}

template <bool GELU>
__global__ void __launch_bounds__(GEMM_THREADS, 1) gemm_tf32_kernel(const __grid_constant__ CUtensorMap a_map,
                                                                    const __grid_constant__ CUtensorMap b_map,
                                                                    const __grid_constant__ CUtensorMap out_map,
                                                                    const __grid_constant__ CUtensorMap gelu_map,
                                                                    const float* bias, int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int STAGE_FLOATS = gemm_stage_floats(GEMM_TILE_N);
    static_assert(GEMM_STAGES > 2, "a consumer's main loop starts while the other's last two stages may be in use");
    extern __shared__ float shared_raw[];
    float* stages = shared_aligned_1024(shared_raw);  // [STAGES][a | b panel]
    float* staging = stages + GEMM_STAGES * STAGE_FLOATS;    // [consumer][2][GEMM_STAGING_FLOATS]
    uint64_t* loaded = (uint64_t*)(staging + 4 * GEMM_STAGING_FLOATS);  // [STAGES]: copies landed
    uint64_t* consumed = loaded + GEMM_STAGES;    // [STAGES]: the MMAs reading the stage are done
    uint64_t* turn_done = consumed + GEMM_STAGES; // [consumer]: its main loop of a tile has issued every MMA
    GemmGrid grid = gemm_grid(M, N, K, GEMM_TILE_N, 1);
    if (threadIdx.x == 0) {
        gemm_ring_init(loaded, consumed, GEMM_STAGES, 128);
        mbarrier_init(&turn_done[0], 128);
        mbarrier_init(&turn_done[1], 128);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (threadIdx.x < 128) {  // the producer warpgroup gives up registers
        warpgroup_registers_lower<40>();
        if (threadIdx.x == 0) {
            gemm_produce<GEMM_STAGES, STAGE_FLOATS>(stages, loaded, consumed, &a_map, &b_map, grid);
        }
        return;
    }
    warpgroup_registers_raise<232>();
    int consumer = threadIdx.x / 128 - 1;
    float* staging_buffers = staging + 2 * consumer * GEMM_STAGING_FLOATS;
    int staged = 0;  // chunks this consumer has staged
    // the CTA's j-th tile is consumer j % 2's; its stages are the ring's j * k_tiles onwards
    for (int j = consumer, item = blockIdx.x + consumer * gridDim.x; item < grid.items; j += 2, item += 2 * gridDim.x) {
        int2 origin = gemm_work(item, grid).origin;
        if (j > 0) { mbarrier_wait(&turn_done[1 - consumer], ((j - 1) / 2) & 1); }  // the other's turn on tile j - 1
        float acc[2][GEMM_TILE_N / 2] = {};  // rows 0-63 and 64-127 of the tile
        int first = j * grid.k_tiles;
        for (int kt = 0; kt < grid.k_tiles; kt++) {
            int n = first + kt, slot = n % GEMM_STAGES;
            mbarrier_wait(&loaded[slot], (n / GEMM_STAGES) & 1);
            const float* a = stages + slot * STAGE_FLOATS;
            const float* b = a + GEMM_TILE_M * 32;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint64_t b_descriptor = wgmma_descriptor(b + 8 * ks);
                wgmma_64x192_accumulate(acc[0], wgmma_descriptor(a + 8 * ks), b_descriptor);
                wgmma_64x192_accumulate(acc[1], wgmma_descriptor(a + 64 * 32 + 8 * ks), b_descriptor);
            }
            wgmma_commit();
            wgmma_wait_one();  // the stage before this one is read: free it
            if (kt > 0) { mbarrier_arrive(&consumed[(n - 1) % GEMM_STAGES]); }
        }
        mbarrier_arrive(&turn_done[consumer]);
        wgmma_wait_all();
        mbarrier_arrive(&consumed[(first + grid.k_tiles - 1) % GEMM_STAGES]);
        pin_registers<GEMM_TILE_N>(&acc[0][0]);
        gemm_store_tma<GEMM_TILE_N, GELU>(&out_map, &gelu_map, bias, staging_buffers, staged, acc[0], origin.x,
                                          origin.y, N, 1 + consumer);
        gemm_store_tma<GEMM_TILE_N, GELU>(&out_map, &gelu_map, bias, staging_buffers, staged, acc[1], origin.x + 64,
                                          origin.y, N, 1 + consumer);
    }
    if (threadIdx.x % 128 == 0) { bulk_wait_all(); }
#endif
}

// Whether gemm_tf32 can take out (M, N) = a (M, K) b (N, K)^T here: the sm_90a code on a Hopper GPU
// in TF32 mode (-f 1), its shared memory allowed, and rows TMA can address (N and K multiples of 4,
// 16-byte aligned bases).
static bool gemm_tf32_fits(const float* out, const float* gelu_out, const float* a, const float* b, int N, int K) {
    uint64_t second = (uint64_t)(gelu_out != nullptr ? gelu_out : out);
    return g_wgmma && g_precision == MATMUL_TF32 && g_shared_limit >= gemm_shared_bytes(GEMM_STAGES, GEMM_TILE_N) &&
           N % 4 == 0 && K % 4 == 0 && common_alignment({(uint64_t)out, second, (uint64_t)a, (uint64_t)b}) >= 16;
}

// out = a b^T + bias (bias optional), and with gelu_out (same layout as out) gelu_out = GELU(out).
static void gemm_tf32(float* out, float* gelu_out, const float* a, const float* b, const float* bias, int M, int N,
                      int K, cudaStream_t stream = 0) {
    constexpr size_t shared = gemm_shared_bytes(GEMM_STAGES, GEMM_TILE_N);
    static bool configured = false;
    if (!configured) {
        for (const void* kernel : {(const void*)gemm_tf32_kernel<false>, (const void*)gemm_tf32_kernel<true>}) {
            cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        }
        configured = true;
    }
    CUtensorMap a_map = tensor_map_panels(a, M, K, K, GEMM_TILE_M), b_map = tensor_map_panels(b, N, K, K, GEMM_TILE_N);
    CUtensorMap out_map = tensor_map_panels(out, M, N, N, 64);
    CUtensorMap gelu_map = gelu_out != nullptr ? tensor_map_panels(gelu_out, M, N, N, 64) : out_map;
    int grid = std::min(gemm_grid(M, N, K, GEMM_TILE_N, 1).items, g_num_sms);
    if (gelu_out != nullptr) {
        gemm_tf32_kernel<true><<<grid, GEMM_THREADS, shared, stream>>>(a_map, b_map, out_map, gelu_map, bias, M, N, K);
    } else {
        gemm_tf32_kernel<false><<<grid, GEMM_THREADS, shared, stream>>>(a_map, b_map, out_map, gelu_map, bias, M, N, K);
    }
    cudaCheck(cudaGetLastError());
}

// Split TF32 (-f 0) on our Hopper GEMM: out (M, N) = a (M, K) b (N, K)^T [+ bias] to FP32 accuracy,
// the operands split as the tiles arrive rather than into scratch per product. A ring of
// GEMM_SPLIT_STAGES holds a's 128 x 32 panel and b's 128 x 32 as TMA brings them, then b's lo part:
// b's hi part is b as the tensor cores read it (truncated to TF32), its lo part b - hi rounded to
// TF32, written beside it by warps 1-3 of the producer warpgroup (the splitters). Both consumers
// take every tile (rows 0-63 and 64-127, all 128 columns), load their rows of a as register
// fragments and split them there (hi rounded, lo the rest rounded); per k-step of 8 they issue
// a_hi b_hi, a_hi b_lo and a_lo b_hi into one accumulator (the lo lo left out is under 2^-21 of
// |a b|; the lab measured errors as small as with b's hi rounded), which each pair of stages (64
// summed values) starts from zero and adds in FP32 to the tile's sum: the tensor cores'
// accumulator, which drifts toward zero over long sums (matmul_split), sums 24 products at most
// (lab: 5-10e-7 of max |out|, plain FP32's 6-10e-7). A pair's second stage loads its a while the
// first's MMAs run, and the consumers take turns to issue a stage's MMAs (consumer 0 first), so
// that the tensor cores run one's while the other adds its sums and loads its next a.
// Since a goes through registers it may be stored transposed, (K, M) (A_T: the input gradients'
// transposed output gradients). Products with few tiles split K into k_parts (gemm_parts):
// part 0 goes to out with the bias, part p to partials + (p - 1) rows_pad N, added to out in part
// order (sum_arrays; accumulating into out, part 0 goes to partials too). Every sum has a fixed
// order: bit-identical run to run.
constexpr int GEMM_SPLIT_TILE_N = 128;
constexpr int GEMM_SPLIT_STAGES = 4;
constexpr int GEMM_SPLIT_BUFFERS = 1;       // staging buffers per consumer (gemm_store_tma)
constexpr int GEMM_SPLIT_PANEL = 128 * 32;  // floats of a panel: a's, b's and b's lo part
constexpr int GEMM_SPLITTERS = 96;          // warps 1-3 of warpgroup 0
[[maybe_unused]] constexpr int GEMM_ISSUED_BARRIER = 3;  // named barriers 3, 4: consumer 0, 1 issued a stage's MMAs
                                                        // (sm_90a code only)

// The stages (a | b | b lo), the consumers' staging buffers (one each lets 4 stages fit; the lab's 3
// stages with two buffers each were 1% slower, a transposed 10%), the barriers, the alignment.
constexpr size_t gemm_split_shared_bytes() {
    return GEMM_SPLIT_STAGES * (3 * GEMM_SPLIT_PANEL * sizeof(float) + 3 * sizeof(uint64_t)) +
           2 * GEMM_SPLIT_BUFFERS * GEMM_STAGING_FLOATS * sizeof(float) + 1024;
}

// The splitters (GEMM_SPLITTERS threads from thread 32): each stage's b panel, once landed, gets
// its lo part in the next panel, made visible to the MMAs (the async proxy) before the consumers
// are told.
__device__ __forceinline__ void gemm_split_stages(float* stages, uint64_t* loaded, uint64_t* split,
                                                  const GemmGrid& grid) {
    int n = 0;  // stages split so far
    for (int item = blockIdx.x; item < grid.items; item += gridDim.x) {
        for (int kt = gemm_work(item, grid).k_tiles; kt > 0; kt--, n++) {
            int slot = n % GEMM_SPLIT_STAGES;
            mbarrier_wait(&loaded[slot], (n / GEMM_SPLIT_STAGES) & 1);
            float4* b = (float4*)(stages + (size_t)slot * 3 * GEMM_SPLIT_PANEL + GEMM_SPLIT_PANEL);
            for (int i = threadIdx.x - 32; i < GEMM_SPLIT_PANEL / 4; i += GEMM_SPLITTERS) {
                float4 x = b[i], lo = x - make_float4(tf32_truncate(x.x), tf32_truncate(x.y), tf32_truncate(x.z),
                                                       tf32_truncate(x.w));
                b[GEMM_SPLIT_PANEL / 4 + i] = make_float4(tf32_round(lo.x), tf32_round(lo.y), tf32_round(lo.z),
                                                          tf32_round(lo.w));
            }
            fence_proxy_async();
            mbarrier_arrive(&split[slot]);
        }
    }
}

// A consumer's a fragments of a stage, k-step ks in a_hi[ks], a_lo[ks] (rows row0 + lane / 4 and + 8
// of columns 8 ks + lane % 4 and + 4, wgmma's register order), hi rounded to TF32, lo the rest
// rounded. a: the stage's a panel, GEMM_TILE_M x 32 (ldmatrix: one instruction a k-step) or with
// A_T 4 panels of 32 k-rows x 32 rows of a (a value at a time).
template <bool A_T>
__device__ __forceinline__ void gemm_split_fragments(float a_hi[4][4], float a_lo[4][4], const float* a, int row0) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        float x[4];
        if constexpr (A_T) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                x[i] = a[panel_offset(8 * ks + lane % 4 + 4 * (i >> 1), row0 + lane / 4 + 8 * (i & 1), 32)];
            }
        } else {  // lane l: row l % 8 of the quarter l / 8 (rows + 8 for quarters 1 and 3, columns + 4 for 2, 3)
            int row = row0 + lane % 8 + 8 * ((lane / 8) & 1);
            ldmatrix_x4(x, a + panel_offset(row, 8 * ks + 4 * (lane / 16), GEMM_TILE_M));
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            a_hi[ks][i] = tf32_round(x[i]);
            a_lo[ks][i] = tf32_round(x[i] - a_hi[ks][i]);
        }
    }
}

// A consumer's MMAs of stage n (acc = [acc +] a b in split TF32), issued in turn with the other
// consumer's (consumer 0 first; it waits for consumer 1's stage n - 1) and committed as one group;
// a_hi, a_lo: its a fragments, which must stay untouched until the group is done.
template <bool A_T>
__device__ __forceinline__ void gemm_split_stage(float acc[GEMM_SPLIT_TILE_N / 2], float a_hi[4][4], float a_lo[4][4],
                                                 bool accumulate, const float* stages, uint64_t* loaded,
                                                 uint64_t* split, int n, int consumer) {
    int slot = n % GEMM_SPLIT_STAGES;
    mbarrier_wait(&loaded[slot], (n / GEMM_SPLIT_STAGES) & 1);  // TMA's a, seen by this thread's own loads
    mbarrier_wait(&split[slot], (n / GEMM_SPLIT_STAGES) & 1);
    const float* a = stages + (size_t)slot * 3 * GEMM_SPLIT_PANEL;
    const float* b_hi = a + GEMM_SPLIT_PANEL;
    const float* b_lo = b_hi + GEMM_SPLIT_PANEL;
    gemm_split_fragments<A_T>(a_hi, a_lo, a, 64 * consumer + 16 * (threadIdx.x % 128 / 32));
    if (consumer == 1) {
        named_barrier(GEMM_ISSUED_BARRIER, 256);
    } else if (n > 0) {
        named_barrier(GEMM_ISSUED_BARRIER + 1, 256);
    }
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        uint64_t hi = wgmma_descriptor(b_hi + 8 * ks), lo = wgmma_descriptor(b_lo + 8 * ks);
        wgmma_64x128_registers(acc, a_hi[ks], hi, accumulate || ks > 0);
        wgmma_64x128_registers(acc, a_hi[ks], lo, true);
        wgmma_64x128_registers(acc, a_lo[ks], hi, true);
    }
    wgmma_commit();
    named_barrier_arrive(GEMM_ISSUED_BARRIER + consumer, 256);
}

template <bool A_T>
__global__ void __launch_bounds__(GEMM_THREADS, 1) gemm_split_tf32_kernel(
    const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
    const __grid_constant__ CUtensorMap out_map, const __grid_constant__ CUtensorMap partials_map,
    const float* bias, int M, int N, int K, int k_parts, int rows_pad) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int STAGES = GEMM_SPLIT_STAGES, STAGE_FLOATS = 3 * GEMM_SPLIT_PANEL;
    extern __shared__ float shared_raw[];
    float* stages = shared_aligned_1024(shared_raw);  // [STAGES][a | b | b lo]
    float* staging = stages + STAGES * STAGE_FLOATS;  // [consumer][GEMM_SPLIT_BUFFERS][GEMM_STAGING_FLOATS]
    uint64_t* loaded = (uint64_t*)(staging + 2 * GEMM_SPLIT_BUFFERS * GEMM_STAGING_FLOATS);  // [STAGES]: copies landed
    uint64_t* consumed = loaded + STAGES;  // [STAGES]: both consumers' MMAs reading the stage are done
    uint64_t* split = consumed + STAGES;   // [STAGES]: b's lo part written
    GemmGrid grid = gemm_grid(M, N, K, GEMM_SPLIT_TILE_N, k_parts);
    if (threadIdx.x == 0) {
        gemm_ring_init(loaded, consumed, STAGES, 256);
        for (int s = 0; s < STAGES; s++) { mbarrier_init(&split[s], GEMM_SPLITTERS); }
        mbarrier_init_fence();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        warpgroup_registers_lower<40>();
        if (threadIdx.x == 0) {
            gemm_produce<STAGES, STAGE_FLOATS, A_T>(stages, loaded, consumed, &a_map, &b_map, grid);
        } else if (threadIdx.x >= 32) {
            gemm_split_stages(stages, loaded, split, grid);
        }
        return;
    }
    warpgroup_registers_raise<232>();
    int consumer = threadIdx.x / 128 - 1, staged = 0, n = 0;  // n: stages taken so far
    float* staging_buffers = staging + consumer * GEMM_SPLIT_BUFFERS * GEMM_STAGING_FLOATS;
    for (int item = blockIdx.x; item < grid.items; item += gridDim.x) {
        GemmWork work = gemm_work(item, grid);
        float sum[GEMM_SPLIT_TILE_N / 2] = {}, acc[GEMM_SPLIT_TILE_N / 2];
        // stages in pairs, each pair's MMAs into acc from zero: the second's a loads while the first's
        // MMAs run; each a fragment set stays untouched until the MMAs reading it are done
        for (int kt = 0; kt < work.k_tiles; kt += 2) {
            float a_hi[2][4][4], a_lo[2][4][4];
            bool second = kt + 1 < work.k_tiles;
            gemm_split_stage<A_T>(acc, a_hi[0], a_lo[0], false, stages, loaded, split, n++, consumer);
            if (second) {
                gemm_split_stage<A_T>(acc, a_hi[1], a_lo[1], true, stages, loaded, split, n++, consumer);
                wgmma_wait_one();
                pin_registers<16>(&a_hi[0][0][0]);
                pin_registers<16>(&a_lo[0][0][0]);
                mbarrier_arrive(&consumed[(n - 2) % STAGES]);
            }
            wgmma_wait_all();
            pin_registers<GEMM_SPLIT_TILE_N / 2>(acc);
            pin_registers<32>(&a_hi[0][0][0]);
            pin_registers<32>(&a_lo[0][0][0]);
            mbarrier_arrive(&consumed[(n - 1) % STAGES]);
#pragma unroll
            for (int i = 0; i < GEMM_SPLIT_TILE_N / 2; i++) { sum[i] += acc[i]; }
        }
        // part 0 to out with the bias, part p to the partial sums' rows (p - 1) rows_pad on
        int row0 = work.origin.x + 64 * consumer;
        bool first = work.part == 0;
        gemm_store_tma<GEMM_SPLIT_TILE_N, false, GEMM_SPLIT_BUFFERS>(
            first ? &out_map : &partials_map, nullptr, first ? bias : nullptr, staging_buffers, staged, sum,
            first ? row0 : (work.part - 1) * rows_pad + row0, work.origin.y, N, 1 + consumer);
    }
    if (consumer == 0 && n > 0) { named_barrier(GEMM_ISSUED_BARRIER + 1, 256); }  // consumer 1's last arrival
    if (threadIdx.x % 128 == 0) { bulk_wait_all(); }
#endif
}

// Whether gemm_split_tf32 can take out (M, N) = a (M, K) b (N, K)^T here, a stored transposed if
// a_t: as gemm_tf32_fits, in split TF32 (-f 0), and M a multiple of 4 for a transposed a's rows.
static bool gemm_split_fits(const float* out, const float* a, bool a_t, const float* b, const float* bias, int M,
                            int N, int K) {
    return g_wgmma && g_precision == MATMUL_SPLIT_TF32 && g_shared_limit >= gemm_split_shared_bytes() &&
           N % 4 == 0 && K % 4 == 0 && (!a_t || M % 4 == 0) &&
           common_alignment({(uint64_t)out, (uint64_t)a, (uint64_t)b}) >= 16 && common_alignment({(uint64_t)bias}) >= 8;
}

// A part's floats in the partial sums: (M, N), its rows padded to whole tiles (edge tiles stay in
// their part).
static size_t gemm_part_floats(int M, int N) { return (size_t)ceil_div(M, GEMM_TILE_M) * GEMM_TILE_M * N; }

// Parts along K for a product on tiles tile_n wide: the count (up to 16) that minimises a model of
// its time, the waves of work items over the multiprocessors (a stage of 32 summed values taking
// stage_us) plus the partial sums' traffic (written and read at 3 TB/s), with the partials within
// partial_floats.
static int gemm_parts(int M, int N, int K, int tile_n, double stage_us, size_t partial_floats) {
    constexpr double BYTES_PER_US = 3e6;
    size_t part_floats = gemm_part_floats(M, N);
    int best = 1;
    double best_us = INFINITY;
    for (int parts = 1; parts <= std::min(16, (int)ceil_div(K, 32)); parts++) {
        GemmGrid g = gemm_grid(M, N, K, tile_n, parts);
        if ((parts - 1) * g.part_k_tiles >= g.k_tiles) { continue; }  // a part would be empty
        if ((parts - 1) * part_floats > partial_floats) { break; }
        double us = ceil_div(g.items, g_num_sms) * g.part_k_tiles * stage_us +
                    (parts - 1) * part_floats * 2 * sizeof(float) / BYTES_PER_US;
        if (us < best_us) { best = parts, best_us = us; }
    }
    return best;
}

// out = a b^T + bias (bias optional), or with accumulate out += a b^T + bias, in split TF32, a stored
// (M, K) or, with a_t, (K, M). partials: scratch of partial_floats for the parts along K, from part 1
// on, or accumulating every part's (at least gemm_part_floats(M, N)); they are added to out in
// part order.
static void gemm_split_tf32(float* out, const float* a, bool a_t, const float* b, const float* bias, int M, int N,
                            int K, bool accumulate, float* partials, size_t partial_floats, cudaStream_t stream = 0) {
    constexpr size_t shared = gemm_split_shared_bytes();
    static bool configured = false;
    if (!configured) {
        for (const void* kernel :
             {(const void*)gemm_split_tf32_kernel<false>, (const void*)gemm_split_tf32_kernel<true>}) {
            cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        }
        configured = true;
    }
    size_t part_floats = gemm_part_floats(M, N);
    float* first = accumulate ? partials : out;  // part 0's destination; part p > 0 at rest + (p - 1) part_floats
    float* rest = accumulate ? partials + part_floats : partials;
    constexpr double STAGE_US = 3 * 2.0 * GEMM_TILE_M * GEMM_SPLIT_TILE_N * 32 / 2e6;  // 3 MMAs at 2 TFLOP/s
    int k_parts = gemm_parts(M, N, K, GEMM_SPLIT_TILE_N, STAGE_US, partial_floats - (accumulate ? part_floats : 0));
    GemmGrid grid = gemm_grid(M, N, K, GEMM_SPLIT_TILE_N, k_parts);
    int rows_pad = grid.row_tiles * GEMM_TILE_M;
    CUtensorMap a_map = a_t ? tensor_map_panels(a, K, M, M, 32) : tensor_map_panels(a, M, K, K, GEMM_TILE_M);
    CUtensorMap b_map = tensor_map_panels(b, N, K, K, GEMM_SPLIT_TILE_N);
    CUtensorMap out_map = tensor_map_panels(first, M, N, N, 64);
    CUtensorMap partials_map =
        k_parts > 1 ? tensor_map_panels(rest, (size_t)(k_parts - 1) * rows_pad, N, N, 64) : out_map;
    auto kernel = a_t ? gemm_split_tf32_kernel<true> : gemm_split_tf32_kernel<false>;
    kernel<<<std::min(grid.items, g_num_sms), GEMM_THREADS, shared, stream>>>(a_map, b_map, out_map, partials_map,
                                                                             bias, M, N, K, k_parts, rows_pad);
    cudaCheck(cudaGetLastError());
    int summed = k_parts - 1 + accumulate;  // the partial sums, from partials on
    if (summed > 0) { sum_arrays(out, out, partials, part_floats, summed, (size_t)M * N, stream); }
}

// out = alpha op(a) op(b) + beta out [+ bias] in the precision g_precision, operands stored densely.
// Split TF32 goes through our GEMM where it takes the product (row-major: out (n, m) = b (n, k) a (m,
// k)^T, b stored (k, n) if trans_b; beta 0 or 1; a batch one product after another), else through
// cuBLASLt (matmul_split).
static void matmul(float* out, const float* a, const float* b, const float* bias, int m, int n, int k, bool trans_a,
                   bool trans_b, float alpha, float beta, int batch = 1, size_t stride_a = 0, size_t stride_b = 0,
                   size_t stride_out = 0, cudaStream_t stream = 0) {
    MatmulShape s = {.m = m, .n = n, .k = k, .trans_a = trans_a, .trans_b = trans_b, .lda = trans_a ? k : m,
                     .ldb = trans_b ? n : k, .batch = batch, .stride_a = stride_a, .stride_b = stride_b,
                     .stride_out = stride_out, .tf32 = g_precision == MATMUL_TF32};
    int slot = stream == g_side_stream ? 1 : 0;  // the stream's split scratch
    bool accumulate = beta == 1.0f;
    if (trans_a && alpha == 1.0f && (beta == 0.0f || accumulate) && gemm_split_fits(out, b, trans_b, a, bias, n, m, k) &&
        common_alignment({4 * stride_a, 4 * stride_b, 4 * stride_out}) >= 16 &&
        (!accumulate || gemm_part_floats(n, m) <= g_split_scratch_floats[slot])) {
        for (int i = 0; i < batch; i++) {
            gemm_split_tf32(out + i * stride_out, b + i * stride_b, trans_b, a + i * stride_a, bias, n, m, k,
                            accumulate, g_split_scratch[slot], g_split_scratch_floats[slot], stream);
        }
    } else if (g_precision == MATMUL_SPLIT_TF32) {
        matmul_split(out, a, b, bias, s, alpha, beta, stream);
    } else {
        matmul_call(out, a, b, bias, s, alpha, beta, stream);
    }
}

// Linear layer forward: out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC), bias optional.
static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
    matmul(out, weight, inp, bias, OC, N, C, true, false, 1.0f, 0.0f);
}

// Whether gemm_tf32 takes this model's fc + GELU and LM head logits here (the configuration table,
// the ranks' kernel fingerprint; the trainer's buffers are aligned).
static bool gemm_tf32_takes_model(const ModelShape* c) {
    return gemm_tf32_fits(nullptr, nullptr, nullptr, nullptr, 4, c->channels);
}

// Whether gemm_split_tf32 takes this model's split TF32 products read along their summed dimension
// (as gemm_tf32_takes_model: the configuration table, the fingerprint).
static bool gemm_split_takes_model(const ModelShape* c) {
    return gemm_split_fits(nullptr, nullptr, false, nullptr, nullptr, 4, 4, c->channels);
}

// The fc layer and its GELU: fch (N, OC) = inp (N, C) @ weight (OC, C)^T + bias, fch_gelu = GELU(fch):
// our GEMM with the GELU in its epilogue where it fits (faster in the lab than the two passes), else
// cuBLASLt and gelu_forward.
static void fc_forward(float* fch, float* fch_gelu, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC) {
    if (gemm_tf32_fits(fch, fch_gelu, inp, weight, OC, C)) {
        gemm_tf32(fch, fch_gelu, inp, weight, bias, N, OC, C);
    } else {
        matmul_forward(fch, inp, weight, bias, N, C, OC);
        gelu_forward(fch_gelu, fch, (size_t)N * OC);
    }
}

// A generation step's linear layers have N <= FEW_ROWS_MAX rows (one per completion): their time
// is that of reading the weight once, which cuBLAS's tiles (128 output columns or more per block)
// spread over too few multiprocessors, and the kernels around them (layernorm, GELU, the residual
// add) cost a launch each. This kernel fuses them: out (N, OC) = epilogue(prologue(inp) @ W^T + b),
// the prologue a layernorm of each input row (its statistics computed by every block, warp r
// taking row r), the epilogue a GELU or an add into out (the residual stream). A block streams
// FEW_ROWS_COLUMNS rows of the weight against all N input rows in full FP32, thread t taking the
// float4 columns t, t + 128, ... (every load of the block in flight at once, many blocks); each
// dot product is summed in a fixed tree (the warp's, then the warps' in order). Launched dependent
// (launch_pdl): the block's weight rows are prefetched into L2 while the previous kernel finishes.
constexpr int FEW_ROWS_MAX = 4;  // a thread holds N x FEW_ROWS_COLUMNS sums: more rows go through cuBLAS
constexpr int FEW_ROWS_COLUMNS = 4;
constexpr int FEW_ROWS_THREADS = 128;  // FEW_ROWS_MAX warps: one per row for the layernorm statistics
constexpr int FEW_ROWS_WARPS = FEW_ROWS_THREADS / 32;
static_assert(FEW_ROWS_WARPS >= FEW_ROWS_MAX && FEW_ROWS_MAX * FEW_ROWS_COLUMNS <= FEW_ROWS_THREADS,
              "a warp per row's statistics, a thread per output of the block");

struct LinearOps {
    const float* ln_weight;  // given: the input rows are layer-normalised (weight, ln_bias) first
    const float* ln_bias;
    bool gelu;               // out = gelu(product + bias)
    bool accumulate;         // out += product + bias (in place)
};

template <int ROWS>
__global__ void __launch_bounds__(FEW_ROWS_THREADS) linear_few_rows_kernel(
    float* out, const float4* __restrict__ inp, const float4* __restrict__ weight, const float* bias, LinearOps ops,
    int N, int C4, int OC) {
    __shared__ float2 row_stats[ROWS];  // (mean, rstd) of each input row
    __shared__ float warp_sums[FEW_ROWS_WARPS][ROWS][FEW_ROWS_COLUMNS];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int tid = block.thread_rank(), lane = warp.thread_rank(), w = warp.meta_group_rank();
    int o0 = blockIdx.x * FEW_ROWS_COLUMNS, columns = min(FEW_ROWS_COLUMNS, OC - o0);
    if (tid < columns) { prefetch_l2(weight + (size_t)(o0 + tid) * C4, C4 * sizeof(float4)); }
    // thread (i, j) < (N, columns) writes out[i, o0 + j]: its bias and previous value load early
    int i = tid / FEW_ROWS_COLUMNS, j = tid % FEW_ROWS_COLUMNS;
    bool writes = i < N && j < columns;
    float* target = out + (size_t)i * OC + o0 + j;
    float bias_value = writes && bias != nullptr ? bias[o0 + j] : 0.0f;
    pdl_wait();
    float previous = writes && ops.accumulate ? *target : 0.0f;
    bool normalise = ops.ln_weight != nullptr;
    if (normalise && w < N) {  // two passes over the row, as layernorm_forward_kernel
        float sum = 0.0f, sum_sq = 0.0f;
        for (int c4 = lane; c4 < C4; c4 += 32) { sum += sum4(inp[(size_t)w * C4 + c4]); }
        float mean = cg::reduce(warp, sum, cg::plus<float>()) / (4 * C4);
        for (int c4 = lane; c4 < C4; c4 += 32) {
            float4 d = inp[(size_t)w * C4 + c4] - make_float4(mean, mean, mean, mean);
            sum_sq += sum4(d * d);
        }
        row_stats[w] = make_float2(mean, 1.0f / sqrtf(cg::reduce(warp, sum_sq, cg::plus<float>()) / (4 * C4) + 1e-5f));
    }
    block.sync();
    float acc[ROWS][FEW_ROWS_COLUMNS] = {};
#pragma unroll 4
    for (int c4 = tid; c4 < C4; c4 += FEW_ROWS_THREADS) {
        float4 wt[FEW_ROWS_COLUMNS];
#pragma unroll
        for (int k = 0; k < FEW_ROWS_COLUMNS; k++) {
            wt[k] = k < columns ? weight[(size_t)(o0 + k) * C4 + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r >= N) { break; }
            float4 x = inp[(size_t)r * C4 + c4];
            if (normalise) {
                float2 s = row_stats[r];
                x = (x - make_float4(s.x, s.x, s.x, s.x)) * s.y * ((const float4*)ops.ln_weight)[c4] +
                    ((const float4*)ops.ln_bias)[c4];
            }
#pragma unroll
            for (int k = 0; k < FEW_ROWS_COLUMNS; k++) { acc[r][k] += sum4(x * wt[k]); }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
#pragma unroll
        for (int k = 0; k < FEW_ROWS_COLUMNS; k++) {
            float warp_sum = cg::reduce(warp, acc[r][k], cg::plus<float>());
            if (lane == 0) { warp_sums[w][r][k] = warp_sum; }
        }
    }
    block.sync();
    if (!writes) { return; }
    float dot = warp_sums[0][i][j];
    for (int k = 1; k < FEW_ROWS_WARPS; k++) { dot += warp_sums[k][i][j]; }
    *target = (ops.gelu ? gelu(dot + bias_value) : dot + bias_value) + previous;
}

// out (N, OC) = ops applied around inp (N, C) @ weight (OC, C)^T + bias, for N <= FEW_ROWS_MAX.
static void linear_few_rows(float* out, const float* inp, const float* weight, const float* bias, LinearOps ops,
                            int N, int C, int OC) {
    if (N > FEW_ROWS_MAX || C % 4 != 0) { fail("linear_few_rows: N = %d rows of C = %d are not supported", N, C); }
    unsigned int grid = ceil_div(OC, FEW_ROWS_COLUMNS);
    if (N == 1) {
        launch_pdl(linear_few_rows_kernel<1>, grid, FEW_ROWS_THREADS, out, (const float4*)inp, (const float4*)weight,
                   bias, ops, N, C / 4, OC);
    } else {
        launch_pdl(linear_few_rows_kernel<FEW_ROWS_MAX>, grid, FEW_ROWS_THREADS, out, (const float4*)inp,
                   (const float4*)weight, bias, ops, N, C / 4, OC);
    }
}

// Stores a 32 x 32 shared-memory tile (padded rows of 33) transposed at rows [out_row0, +32) and
// columns [out_col0, +32) of out (leading dimension ld), inside out_rows x out_cols; a block of
// 32 x 8 threads, each writing 4 elements, a warp 32 consecutive floats of a row.
__device__ inline void store_tile_transposed(float* out, size_t ld, const float (*tile)[33], int out_row0,
                                             int out_col0, int out_rows, int out_cols) {
    int out_col = out_col0 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        int out_row = out_row0 + threadIdx.y + j;
        if (out_row < out_rows && out_col < out_cols) {
            out[(size_t)out_row * ld + out_col] = tile[threadIdx.x][threadIdx.y + j];
        }
    }
}

// Rows that a block of 32 x 8 threads transposes at once (bias_backward_kernel, transpose_kernel),
// as TRANSPOSE_ROWS / 32 tiles of 32 x 32: each thread has TRANSPOSE_ROWS / 8 loads in flight.
constexpr int TRANSPOSE_ROWS = 64;

// Thread (tx, ty)'s elements of the step's rows from step_row: rows ty, ty + 8, ... (zero outside
// the chunk).
__device__ inline void bias_backward_load(float* d, float* x, const float* dout, const float* gelu_inp, int step_row,
                                          int row_end, int col, int OC) {
#pragma unroll
    for (int k = 0; k < TRANSPOSE_ROWS / 8; k++) {
        int row = step_row + threadIdx.y + 8 * k;
        bool inside = row < row_end && col < OC;
        d[k] = inside ? dout[(size_t)row * OC + col] : 0.0f;
        if (gelu_inp != nullptr) { x[k] = inside ? gelu_inp[(size_t)row * OC + col] : 0.0f; }
    }
}

// The output gradient of a linear layer, dout (N, OC), for the weight gradient and the bias:
// dout_t (OC, N) = dout^T and dbias[o] = the sum over rows of dout[row, o]. With gelu_inp (the
// GELU's input x, N x OC), dout is the gradient of the GELU's output and what is transposed and
// summed is the gradient before the GELU, dout * gelu'(x); gelu_t (OC, N) = gelu(x)^T is written
// too (the fcproj weight gradient's input, so the forward's GELU output need not be kept).
// Block (x, y) of 32 x 8 threads takes columns [32x, 32x + 32) over the rows of chunk y, in steps
// of TRANSPOSE_ROWS rows transposed through shared memory as 32 x 32 tiles, the next step's
// loads in flight while a step is stored; each thread sums its rows of every step in order. The
// chunks' partial sums are added in chunk order by the last block of column tile x.
__global__ void bias_backward_kernel(float* dbias, float* dout_t, float* gelu_t, float* partials,
                                     unsigned int* counters, const float* dout, const float* gelu_inp, int N, int OC) {
    constexpr int ROWS = TRANSPOSE_ROWS, PER_THREAD = ROWS / 8;
    __shared__ float tiles[2][ROWS][33];  // dout, gelu(x); padded against bank conflicts
    int tx = threadIdx.x, ty = threadIdx.y;
    int col = blockIdx.x * 32 + tx;
    int rows_per_chunk = ceil_div(N, gridDim.y * ROWS) * ROWS;
    int row_begin = blockIdx.y * rows_per_chunk, row_end = min(N, row_begin + rows_per_chunk);
    float sum = 0.0f;
    float d[PER_THREAD], x[PER_THREAD];
    bias_backward_load(d, x, dout, gelu_inp, row_begin, row_end, col, OC);
    for (int step_row = row_begin; step_row < row_end; step_row += ROWS) {
#pragma unroll
        for (int k = 0; k < PER_THREAD; k++) {
            if (gelu_inp != nullptr) {
                d[k] *= gelu_grad(x[k]);
                tiles[1][ty + 8 * k][tx] = gelu(x[k]);
            }
            tiles[0][ty + 8 * k][tx] = d[k];
            sum += d[k];
        }
        __syncthreads();
        // the next step's loads go out before this step's stores
        bias_backward_load(d, x, dout, gelu_inp, step_row + ROWS, row_end, col, OC);
        // the transposed outputs are (OC, N); the chunk's rows end at row_end
#pragma unroll
        for (int t = 0; t < ROWS / 32; t++) {
            int tile_row = step_row + 32 * t;
            store_tile_transposed(dout_t, N, tiles[0] + 32 * t, blockIdx.x * 32, tile_row, OC, row_end);
            if (gelu_inp != nullptr) {
                store_tile_transposed(gelu_t, N, tiles[1] + 32 * t, blockIdx.x * 32, tile_row, OC, row_end);
            }
        }
        __syncthreads();
    }
    tiles[0][ty][tx] = sum;
    __syncthreads();
    if (ty == 0 && col < OC) {
        float block_total = tiles[0][0][tx];
        for (int i = 1; i < 8; i++) { block_total += tiles[0][i][tx]; }
        partials[(size_t)blockIdx.y * OC + col] = block_total;
    }
    if (!arrive_last_in_group(&counters[blockIdx.x], gridDim.y)) { return; }
    if (ty == 0 && col < OC) {
        float total = 0.0f;
        for (unsigned int y = 0; y < gridDim.y; y++) { total += __ldcg(&partials[(size_t)y * OC + col]); }
        dbias[col] = total;
    }
}

constexpr int BIAS_BACKWARD_MAX_CHUNKS = 64;
constexpr int MAX_REDUCTION_COUNTERS = 4096;

// partials (BIAS_BACKWARD_MAX_CHUNKS x OC) and counters belong to the stream.
static void bias_backward(float* dbias, float* dout_t, float* gelu_t, float* partials, unsigned int* counters,
                          const float* dout, const float* gelu_inp, int N, int OC, cudaStream_t stream = 0) {
    unsigned int column_tiles = ceil_div(OC, 32);
    if (column_tiles > MAX_REDUCTION_COUNTERS) { fail("bias_backward: OC=%d too large", OC); }
    unsigned int steps = ceil_div(N, TRANSPOSE_ROWS);
    unsigned int chunks = std::max(1u, std::min({(unsigned int)BIAS_BACKWARD_MAX_CHUNKS, steps,
                                                 ceil_div(8 * g_num_sms, column_tiles)}));
    bias_backward_kernel<<<dim3(column_tiles, chunks), dim3(32, 8), 0, stream>>>(dbias, dout_t, gelu_t, partials,
                                                                                counters, dout, gelu_inp, N, OC);
    cudaCheck(cudaGetLastError());
}

// Linear layer backward, its two halves: dinp = dout @ weight, and dweight = dout^T @ inp.
// cuBLASLt's TF32 tensor-core kernels are fastest when the operands have the summed dimension
// contiguous: 10-30% slower with one operand read across it, about twice as slow with both. So
// dinp reads weight_t (C, OC), the weight transposed (transpose_matrices), and dout (N, OC) or
// dout_t (OC, N), whichever the caller has; dweight reads dout_t (OC, N) (bias_backward; for qkv,
// flash_attention_backward) and inp (N, C) or inp_t (C, N) (transpose_matrices), the faster for
// the layer's shape.
static void matmul_backward_input(float* dinp, const float* dout, bool dout_transposed, const float* weight_t, int N,
                                  int C, int OC) {
    matmul(dinp, weight_t, dout, nullptr, C, N, OC, true, dout_transposed, 1.0f, 0.0f);
}

static void matmul_backward_weight(float* dweight, const float* dout_t, const float* inp, bool inp_transposed, int N,
                                   int C, int OC, cudaStream_t stream = 0) {
    matmul(dweight, inp, dout_t, nullptr, C, OC, N, inp_transposed, false, 1.0f, 0.0f, 1, 0, 0, 0, stream);
}

// out[m] = in[m]^T for count row-major (rows, cols) matrices stored one after another: a block of
// 32 x 8 threads per TRANSPOSE_ROWS x 32 piece, through shared memory (padded against bank
// conflicts). With ln_mean (count 1), each row is first layer-normalised as the forward pass did,
// from its saved mean and rstd: in[r][c] -> (in[r][c] - ln_mean[r]) * ln_rstd[r] * ln_weight[c] +
// ln_bias[c].
__global__ void transpose_kernel(float* out, const float* in, int rows, int cols, const float* ln_mean,
                                 const float* ln_rstd, const float* ln_weight, const float* ln_bias) {
    constexpr int ROWS = TRANSPOSE_ROWS, PER_THREAD = ROWS / 8;
    __shared__ float tile[ROWS][33];
    size_t matrix = (size_t)blockIdx.z * rows * cols;
    int col = blockIdx.x * 32 + threadIdx.x, row0 = blockIdx.y * ROWS, row = row0 + threadIdx.y;
    float x[PER_THREAD];  // the thread's rows of the piece, all loads in flight at once
#pragma unroll
    for (int j = 0; j < PER_THREAD; j++) {
        bool inside = col < cols && row + 8 * j < rows;
        x[j] = inside ? in[matrix + (size_t)(row + 8 * j) * cols + col] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < PER_THREAD; j++) {
        if (ln_mean != nullptr && col < cols && row + 8 * j < rows) {
            x[j] = (x[j] - ln_mean[row + 8 * j]) * ln_rstd[row + 8 * j] * ln_weight[col] + ln_bias[col];
        }
        tile[threadIdx.y + 8 * j][threadIdx.x] = x[j];
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < ROWS / 32; t++) {  // (cols, rows)
        store_tile_transposed(out + matrix, rows, tile + 32 * t, blockIdx.x * 32, row0 + 32 * t, cols, rows);
    }
}

static void transpose_matrices(float* out, const float* in, int rows, int cols, int count, cudaStream_t stream = 0) {
    dim3 grid(ceil_div(cols, 32), ceil_div(rows, TRANSPOSE_ROWS), count);
    transpose_kernel<<<grid, dim3(32, 8), 0, stream>>>(out, in, rows, cols, nullptr, nullptr, nullptr, nullptr);
    cudaCheck(cudaGetLastError());
}

// out_t (C, N) = layernorm(inp)^T, inp (N, C), recomputed from the forward pass's mean and rstd:
// the layernorm outputs are not kept for the backward pass, which needs them only transposed.
static void layernorm_transposed(float* out_t, const float* inp, const float* mean, const float* rstd,
                                 const float* weight, const float* bias, int N, int C, cudaStream_t stream = 0) {
    dim3 grid(ceil_div(C, 32), ceil_div(N, TRANSPOSE_ROWS), 1);
    transpose_kernel<<<grid, dim3(32, 8), 0, stream>>>(out_t, inp, N, C, mean, rstd, weight, bias);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// Attention
// Flash attention: causal softmax or ReLU attention fused on the tensor cores (TF32 mma.sync m16n8k8,
// fp32 accumulate; in TF32 mode on Hopper the forward uses the warpgroup MMA, wgmma, see "Forward on
// Hopper"), forward and backward, never materialising a (B, NH, T, T) tensor.
//
// Layouts (row-major float32):
//   qkv         (B, T, 3C): token (b, t) holds q, then k, then v; head h at columns h*hs .. h*hs + hs-1
//   dqkv_t      (3C, B*T): the gradient of qkv transposed, for the weight gradient's product
//   out, dout   (B, T, C): head h at columns h*hs
//   lse, delta  (B, NH, T): softmax log-sum-exp of query t's scaled scores; sum_d dout * out
//   shared tiles [rows][hs]: the 16-byte chunks of each row XOR-permuted within groups of 8
//               (tile_offset), so that every fragment load below is free of bank conflicts
//
// Work split: a CTA of 4 warps owns 64 rows, 16 per warp, and loops over tiles of the other side,
// double-buffered in shared memory with cp.async: the forward (64 queries; key tiles of 64, 32 for
// hs = 128) and the dQ kernel (64 queries; key tiles of 32) up to the diagonal, the dK/dV kernel (64
// keys; query tiles of 64, 32 for hs = 128) from the diagonal to T. Tiles wholly above the diagonal
// are skipped per warp, diagonal tiles are masked, and the heaviest blocks are launched first. dQ and
// dK/dV come from two kernels that each recompute P (from q, k and lse) and dP, so every output
// element has one writer and no atomics are needed: the results are bit-identical run to run. The dQ
// kernel also computes delta, read by the dK/dV kernel launched after it.
//
// Fragments (PTX m16n8k8 .tf32; g = lane / 4, q = lane % 4):
//   A (16 x 8): a0 (g, q)  a1 (g+8, q)  a2 (g, q+4)  a3 (g+8, q+4)
//   B (8 x 8):  b0 (q, g)  b1 (q+4, g)
//   C (16 x 8): c0 (g, 2q) c1 (g, 2q+1) c2 (g+8, 2q) c3 (g+8, 2q+1)
// Two products per tile and warp:
//   scores  S (16 rows x tile rows) = A (the warp's 16 rows of q, k, v or dout, held in registers) times
//           tile^T. Their k index (the head dimension) is permuted alike in A and B: a thread's float4
//           of columns 16j + 4q .. +3 serves k = q, q+4 of step 2j and then of step 2j+1.
//   sums    acc^T (hs x 16) += tile^T (hs x tile rows) times X^T, X being the warp's 16 x tile-rows
//           C fragments (P or dS): the transposed form takes X's C fragment as the B fragment as is
//           (k = q, q+4 taken as tile rows 2q, 2q+1) and, with m = g, g+8 taken as head dimensions 2g,
//           2g+1, A as two float2 of the tile. acc^T holds dimensions 16mt + 2g, +1 of rows 8nt + 2q, +1.
// TF32 mode rounds the operands held in registers (A of scores, P, dS) to TF32; tiles enter as raw
// fp32 (the tensor cores read their top 19 bits). FP32-accurate mode splits both operands x = hi + lo,
// hi = tf32(x), and adds lo*hi + hi*lo + hi*hi (three mma's).

constexpr int FLASH_WARPS = 4;
constexpr int FLASH_THREADS = 32 * FLASH_WARPS;
constexpr int FLASH_ROWS = 16 * FLASH_WARPS;  // queries (forward, dQ) or keys (dK/dV) per CTA
constexpr int FLASH_DQ_KEYS = 32;             // keys per tile of the dQ kernel
constexpr int FLASH_SMALL_TILE = 16;  // dQ keys and dK/dV queries per tile where the above do not fit (flash_plan)

// A log-sum-exp (natural units) in exponent_scale's units (below).
template <bool SPLIT>
__device__ __forceinline__ float lse_in_exponent_units(float lse) { return SPLIT ? lse : lse * LOG2E; }

// ReLU attention's normalisation of query t: 1 / its keys (t + 1).
__device__ __forceinline__ float relu_row_scale(int t) { return 1.0f / (t + 1); }

// The first of a query's two statistics for the backward (probability_and_gradient): softmax its
// log-sum-exp in exponent units (0 past T), ReLU its relu_row_scale.
template <AttentionKind KIND, bool SPLIT>
__device__ __forceinline__ float query_statistic(const float* lse_head, int t, int T) {
    if (KIND == ATTENTION_RELU) { return relu_row_scale(t); }
    return t < T ? lse_in_exponent_units<SPLIT>(lse_head[t]) : 0.0f;
}

// The second, softmax's delta = dout . out of a query row: PARTS neighbouring lanes sum the float4s
// part, part + PARTS, ... of the head's dimensions in order, then their sums are added by shuffles
// (every one of the lanes gets it); rows past T (`inside` false) give 0.
template <int HS, int PARTS>
__device__ __forceinline__ float query_delta(const float* do_row, const float* out_row, bool inside, int part,
                                             const cg::thread_block_tile<32>& warp) {
    float sum = 0.0f;
    if (inside) {
#pragma unroll
        for (int m = part; m < HS / 4; m += PARTS) {
            sum += sum4(((const float4*)do_row)[m] * ((const float4*)out_row)[m]);
        }
    }
#pragma unroll
    for (int lanes = 1; lanes < PARTS; lanes *= 2) { sum += warp.shfl_xor(sum, lanes); }
    return sum;
}

// Whether the score of a pair is masked by causality: its key after its query (rows are queries and
// columns keys, or with KEY_ROWS the other way round).
template <bool KEY_ROWS>
__device__ __forceinline__ bool causal_masked(int row, int col) { return KEY_ROWS ? row > col : col > row; }

// Keys per tile of the forward kernel, queries per tile of the dK/dV kernel, and the CTAs per
// multiprocessor the register allocation must allow: chosen on an H200 for hs = 64, smaller for
// hs = 128 and for the split products, which need more registers.
__host__ __device__ constexpr int flash_forward_keys(int hs) { return hs == 128 ? 32 : 64; }
__host__ __device__ constexpr int flash_dkdv_queries(int hs, bool split) { return hs == 128 || split ? 32 : 64; }
__host__ __device__ constexpr int flash_forward_min_blocks(int hs, bool split) { return hs <= 64 && !split ? 3 : 1; }
__host__ __device__ constexpr int flash_dq_min_blocks(int hs, bool split) { return hs <= 64 && !split ? 3 : 1; }
__host__ __device__ constexpr int flash_dkdv_min_blocks(int hs, bool split) { return hs <= 64 && !split ? 2 : 1; }

// Up to hs = 64 the backward kernels hold their warp's rows of q and dout (dQ) or k and v (dK/dV) in
// registers; for hs = 128 those stay in shared memory and are re-read per tile.
__host__ __device__ constexpr bool flash_holds_rows(int hs) { return hs <= 64; }

// Each kernel's dynamic shared memory in bytes: the double-buffered tiles and the tiles of the rows
// not held in registers; the backward kernels' outputs also leave through it (store_columns: hs
// rows of FLASH_STAGE_STRIDE), so theirs is at least that.
constexpr int FLASH_STAGE_STRIDE = FLASH_ROWS + 4;  // float4-aligned, and fewer bank conflicts
constexpr size_t flash_held_rows(int hs) { return flash_holds_rows(hs) ? 0 : 2 * FLASH_ROWS * hs; }
constexpr size_t flash_forward_shared(int hs) { return 4 * flash_forward_keys(hs) * hs * sizeof(float); }
constexpr size_t flash_backward_shared(int hs, size_t tiles) {
    return std::max(tiles + flash_held_rows(hs), (size_t)hs * FLASH_STAGE_STRIDE) * sizeof(float);
}
constexpr size_t flash_dq_shared(int hs, int keys) { return flash_backward_shared(hs, 4 * keys * hs); }
constexpr size_t flash_dkdv_shared(int hs, int queries) {
    return flash_backward_shared(hs, 2 * (2 * queries * hs + 2 * queries));
}

// ----------------------------------------------------------------------------------------------
// Tensor-core and copy primitives

// tf32_round (see the matrix products) as the tensor cores see it: they read only the top 19 bits,
// so the carry into them is all the rounding needs (one instruction; the low bits are left, not cleared).
__device__ __forceinline__ float tf32_round_for_mma(float x) { return __uint_as_float(__float_as_uint(x) + 0x1000u); }

// An operand held in registers: rounded to TF32, or kept whole for the split products.
template <bool SPLIT>
__device__ __forceinline__ float tf32_operand(float x) { return SPLIT ? x : tf32_round_for_mma(x); }

// TF32 mma.sync and cp.async are sm_80's: the kernels that use them compile their bodies for 8.0 or
// newer only (#if __CUDA_ARCH__ >= 800), as code built for an older GPU never runs them (the launchers
// choose the FP32-core kernels there).
__device__ __forceinline__ void mma_m16n8k8(float d[4], const float a[4], const float b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
}

// d += a * b; SPLIT: ~fp32 accuracy from three TF32 products, the small terms first.
template <bool SPLIT>
__device__ __forceinline__ void mma_tf32(float d[4], const float a[4], const float b[2]) {
    if constexpr (SPLIT) {
        float a_hi[4], a_lo[4], b_hi[2], b_lo[2];
        for (int i = 0; i < 4; i++) {
            a_hi[i] = tf32_round(a[i]);
            a_lo[i] = a[i] - a_hi[i];
        }
        for (int i = 0; i < 2; i++) {
            b_hi[i] = tf32_round(b[i]);
            b_lo[i] = b[i] - b_hi[i];
        }
        mma_m16n8k8(d, a_lo, b_hi);
        mma_m16n8k8(d, a_hi, b_lo);
        mma_m16n8k8(d, a_hi, b_hi);
    } else {
        mma_m16n8k8(d, a, b);
    }
}

// 16 bytes global -> shared, bypassing L1; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
    uint32_t dst_shared = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_shared), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
    uint32_t dst_shared = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst_shared), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// ----------------------------------------------------------------------------------------------
// Shared-memory tiles and fragments

// Float offset of (row, col) in a swizzled [rows][HS] tile: chunk c of row r sits at c ^ 2v(r),
// v = (r/2 % 4) ^ 2(r % 2). Conflict-free: float4 loads of rows 8n + g (two rows per 8 lanes) and
// float2 loads of rows 8ks + 2q (+1) at columns 16mt + 2g (four rows per 16 lanes).
template <int HS>
__device__ __forceinline__ int tile_offset(int row, int col) {
    int chunk = (col >> 2) ^ ((((row >> 1) & 3) ^ ((row & 1) << 1)) << 1);
    return row * HS + (chunk << 2) + (col & 3);
}

// The per-thread parts of fragment offsets; the rest of each offset is a compile-time constant.
struct FragmentOffsets {
    int scores[2];   // float4 at (8n + g, 16j + 4q): scores[j % 2] + 8n*HS + 32(j / 2)
    int sums[2][2];  // float2 at (8ks + 2q + r, 16mt + 2g): sums[r][mt % 2] + 8ks*HS + 32(mt / 2)
};

template <int HS>
__device__ FragmentOffsets fragment_offsets(int g, int q) {
    FragmentOffsets off;
    for (int i = 0; i < 2; i++) {
        off.scores[i] = tile_offset<HS>(g, 16 * i + 4 * q);
        for (int r = 0; r < 2; r++) { off.sums[r][i] = tile_offset<HS>(2 * q + r, 16 * i + 2 * g); }
    }
    return off;
}

template <int HS>
__device__ __forceinline__ float4 scores_quad(const float* tile, const FragmentOffsets& off, int n, int j) {
    return *(const float4*)(tile + off.scores[j & 1] + 8 * n * HS + 32 * (j >> 1));
}

template <int HS>
__device__ __forceinline__ float2 sums_pair(const float* tile, const FragmentOffsets& off, int ks, int r, int mt) {
    return *(const float2*)(tile + off.sums[r][mt & 1] + 8 * ks * HS + 32 * (mt >> 1));
}

// A fragments of k-steps 2j and 2j+1 from the quads of rows g (top) and g + 8 (bottom).
__device__ __forceinline__ void a_pair(float a[2][4], float4 top, float4 bottom) {
    a[0][0] = top.x, a[0][1] = bottom.x, a[0][2] = top.y, a[0][3] = bottom.y;
    a[1][0] = top.z, a[1][1] = bottom.z, a[1][2] = top.w, a[1][3] = bottom.w;
}

// Rows [row0, row0 + ROWS) of one head's q, k, v or dout (rows row_stride floats apart) into a
// tile; rows >= T read as 0. Each thread copies one 16-byte column chunk of every PASS-th row; the
// swizzle repeats every 8 rows, so the shared offsets are CYCLE values plus constants.
template <int ROWS, int HS>
__device__ void load_tile(float* tile, const float* head, size_t row_stride, int row0, int T) {
    constexpr int CHUNKS = HS / 4, PASS = FLASH_THREADS / CHUNKS, CYCLE = PASS >= 8 ? 1 : 8 / PASS;
    int r = threadIdx.x / CHUNKS, c = (threadIdx.x % CHUNKS) * 4;
    int offsets[CYCLE];
#pragma unroll
    for (int k = 0; k < CYCLE; k++) { offsets[k] = tile_offset<HS>(r + k * PASS, c); }
    const float* src = head + (size_t)(row0 + r) * row_stride + c;
#pragma unroll
    for (int pass = 0; pass < ROWS / PASS; pass++) {
        bool valid = row0 + r + pass * PASS < T;
        float* dst = tile + offsets[pass % CYCLE] + (pass / CYCLE) * CYCLE * PASS * HS;
        cp_async16(dst, valid ? src + pass * PASS * row_stride : head, valid);
    }
}

// Starts copying key tile `tile`'s k and v rows into its half of the double buffer (k, then v, each
// KEYS x HS); q_head points at the head's q columns, k and v follow C and 2C floats later.
template <int KEYS, int HS>
__device__ __forceinline__ void load_key_tiles(float* smem, const float* q_head, int C, size_t row_stride, int tile,
                                               int T) {
    float* half = smem + (tile & 1) * 2 * KEYS * HS;
    load_tile<KEYS, HS>(half, q_head + C, row_stride, tile * KEYS, T);
    load_tile<KEYS, HS>(half + KEYS * HS, q_head + 2 * C, row_stride, tile * KEYS, T);
}

// A fragments of rows [row0, row0 + 16) straight from global memory; rows >= T read as 0.
template <int HS, bool SPLIT>
__device__ void load_a_global(float a[HS / 8][4], const float* head, size_t row_stride, int row0, int T, int g,
                              int q) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float* top_row = head + (size_t)(row0 + g) * row_stride + 4 * q;
    const float* bottom_row = top_row + 8 * row_stride;
#pragma unroll
    for (int j = 0; j < HS / 16; j++) {
        float4 top = row0 + g < T ? *(const float4*)(top_row + 16 * j) : zero;
        float4 bottom = row0 + g + 8 < T ? *(const float4*)(bottom_row + 16 * j) : zero;
        a_pair(&a[2 * j], top, bottom);
    }
#pragma unroll
    for (int ks = 0; ks < HS / 8; ks++) {
#pragma unroll
        for (int i = 0; i < 4; i++) { a[ks][i] = tf32_operand<SPLIT>(a[ks][i]); }
    }
}

template <int COUNT>
__device__ __forceinline__ void zero_fragments(float s[COUNT][4]) {
#pragma unroll
    for (int n = 0; n < COUNT; n++) { s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f; }
}

// s (16 x N) += the k-steps 2j and 2j+1 of a * tile^T, the tile's rows [0, N) being the n columns.
template <int HS, int N, bool SPLIT>
__device__ __forceinline__ void scores_step_pair(float s[N / 8][4], const float a[2][4], const float* tile,
                                                 const FragmentOffsets& off, int j) {
#pragma unroll
    for (int n = 0; n < N / 8; n++) {
        float4 b = scores_quad<HS>(tile, off, n, j);
        float b_even[2] = {b.x, b.y}, b_odd[2] = {b.z, b.w};
        mma_tf32<SPLIT>(s[n], a[0], b_even);
        mma_tf32<SPLIT>(s[n], a[1], b_odd);
    }
}

// s (16 x N) = a (16 x HS, registers) * tile^T.
template <int HS, int N, bool SPLIT>
__device__ void scores_from_registers(float s[N / 8][4], const float a[HS / 8][4], const float* tile,
                                      const FragmentOffsets& off) {
    zero_fragments<N / 8>(s);
#pragma unroll
    for (int j = 0; j < HS / 16; j++) { scores_step_pair<HS, N, SPLIT>(s, &a[2 * j], tile, off, j); }
}

// s (16 x N) = a_tile rows [a_row0, a_row0 + 16) times tile^T.
template <int HS, int N, bool SPLIT>
__device__ void scores_from_tile(float s[N / 8][4], const float* a_tile, int a_row0, const float* tile,
                                 const FragmentOffsets& off) {
    zero_fragments<N / 8>(s);
    const float* a_rows = a_tile + a_row0 * HS;
#pragma unroll
    for (int j = 0; j < HS / 16; j++) {
        float a[2][4];
        a_pair(a, scores_quad<HS>(a_rows, off, 0, j), scores_quad<HS>(a_rows, off, 1, j));
        scores_step_pair<HS, N, SPLIT>(s, a, tile, off, j);
    }
}

// The scores of the warp's rows of a (registers, or the A tile when it is not held) against a tile.
template <int HS, int N, bool SPLIT, bool HOLD>
__device__ __forceinline__ void warp_scores(float s[N / 8][4], const float a[HS / 8][4], const float* a_tile,
                                           int a_row0, const float* tile, const FragmentOffsets& off) {
    if constexpr (HOLD) { scores_from_registers<HS, N, SPLIT>(s, a, tile, off); }
    else { scores_from_tile<HS, N, SPLIT>(s, a_tile, a_row0, tile, off); }
}

// acc^T (HS x 16) += tile^T (HS x K) * x^T, x the warp's 16 x K C fragments (TF32-ready).
template <int HS, int K, bool SPLIT>
__device__ void accumulate_transposed(float acc[HS / 16][2][4], const float x[K / 8][4], const float* tile,
                                      const FragmentOffsets& off) {
#pragma unroll
    for (int ks = 0; ks < K / 8; ks++) {
        float b_top[2] = {x[ks][0], x[ks][1]}, b_bottom[2] = {x[ks][2], x[ks][3]};
#pragma unroll
        for (int mt = 0; mt < HS / 16; mt++) {
            float2 lo = sums_pair<HS>(tile, off, ks, 0, mt), hi = sums_pair<HS>(tile, off, ks, 1, mt);
            float a[4] = {lo.x, lo.y, hi.x, hi.y};
            mma_tf32<SPLIT>(acc[mt][0], a, b_top);
            mma_tf32<SPLIT>(acc[mt][1], a, b_bottom);
        }
    }
}

// The warp rows a thread holds in acc^T: 2q, 2q + 1, 2q + 8, 2q + 9 (index 2nt + r).
__device__ __forceinline__ int transposed_row(int i, int q) { return 8 * (i >> 1) + 2 * q + (i & 1); }

// Values kept per row g (v[0]) and g + 8 (v[1]) of the C layout, gathered for the acc^T rows.
__device__ __forceinline__ void gather_rows(float out[4], const float v[2], int q,
                                            const cg::thread_block_tile<32>& warp) {
#pragma unroll
    for (int i = 0; i < 4; i++) { out[i] = warp.shfl(v[i >> 1], 4 * (transposed_row(i, q) & 7)); }
}

// The end of a forward row, the same on every path: softmax adds the partial sums of the LANES
// neighbouring lanes that share the row (in a fixed order), writes the row's log-sum-exp to
// lse[head_rows + row] (the first of those lanes, rows < T) and scales the output by 1 / sum; ReLU
// (no lse) by 1 / (row + 1), the row's keys.
template <AttentionKind KIND, int LANES>
__device__ __forceinline__ float forward_row_scale(float* lse, size_t head_rows, float row_max, float sum, float scale,
                                                   int row, int T, bool first_lane,
                                                   const cg::thread_block_tile<32>& warp) {
    if constexpr (KIND != ATTENTION_SOFTMAX) {
        return relu_row_scale(row);
    } else {
#pragma unroll
        for (int offset = 1; offset < LANES; offset *= 2) { sum += warp.shfl_xor(sum, offset); }
        if (first_lane && row < T) { lse[head_rows + row] = row_max * scale + logf(sum); }
        return 1.0f / sum;
    }
}

// Multiplies each row of a warp's acc^T by its factor (transposed_row order).
template <int HS>
__device__ __forceinline__ void scale_rows(float acc[HS / 16][2][4], const float factor[4]) {
#pragma unroll
    for (int mt = 0; mt < HS / 16; mt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc[mt][i >> 1][i & 1] *= factor[i];
            acc[mt][i >> 1][(i & 1) + 2] *= factor[i];
        }
    }
}

// Rows of a warp's acc^T, each times its row_scale, to rows row0 + transposed_row of dst (rows
// row_stride floats apart); rows >= T are skipped.
template <int HS>
__device__ void store_transposed(float* dst, size_t row_stride, const float acc[HS / 16][2][4],
                                 const float row_scale[4], int row0, int T, int g, int q) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = row0 + transposed_row(i, q), nt = i >> 1, r = i & 1;
        if (row >= T) { continue; }
        float* dst_row = dst + (size_t)row * row_stride + 2 * g;
#pragma unroll
        for (int mt = 0; mt < HS / 16; mt++) {
            float2 v = make_float2(acc[mt][nt][r] * row_scale[i], acc[mt][nt][r + 2] * row_scale[i]);
            *(float2*)(dst_row + 16 * mt) = v;
        }
    }
}

// FLASH_ROWS rows staged transposed (stage[d * stride + row], stride a multiple of 4), tokens row0
// on: each dimension d's rows become contiguous in dst_t (dst_t[d * tokens + row0 + row], rows >= T
// skipped) and their sum, in row order, goes to column_sums[d].
template <int HS>
__device__ void drain_columns(float* dst_t, size_t tokens, const float* stage, int stride, int row0, int T,
                              float* column_sums) {
    int rows = min(FLASH_ROWS, T - row0);
    for (int idx = threadIdx.x; idx < HS * FLASH_ROWS / 4; idx += blockDim.x) {
        int d = idx / (FLASH_ROWS / 4), row = 4 * (idx % (FLASH_ROWS / 4));
        const float* src = stage + d * stride + row;
        float* dst = dst_t + d * tokens + row0 + row;
        if (T % 4 == 0 && row + 4 <= rows) {  // dst is 16-byte aligned: tokens and row0 are multiples of 4
            *(float4*)dst = *(const float4*)src;
        } else {
            for (int j = 0; j < 4 && row + j < rows; j++) { dst[j] = src[j]; }
        }
    }
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        float sum = 0.0f;
        for (int row = 0; row < rows; row++) { sum += stage[d * stride + row]; }
        column_sums[d] = sum;
    }
}

// Backward outputs, transposed through shared memory: the CTA's rows of acc^T (each times its
// row_scale; a warp's at warp_row + transposed_row) go to stage[d][row], then to dst_t and
// column_sums (drain_columns). stage: HS x FLASH_STAGE_STRIDE floats, free once the CTA is past its
// last tile.
template <int HS>
__device__ void store_columns(float* dst_t, size_t tokens, const float acc[HS / 16][2][4], const float row_scale[4],
                              int cta_row0, int warp_row, int T, float* column_sums, float* stage, int g, int q) {
    cg::thread_block block = cg::this_thread_block();
    block.sync();  // every warp is done with the tiles (or with a previous call's stage)
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = warp_row + transposed_row(i, q), nt = i >> 1, r = i & 1;
#pragma unroll
        for (int mt = 0; mt < HS / 16; mt++) {
            stage[(16 * mt + 2 * g) * FLASH_STAGE_STRIDE + row] = acc[mt][nt][r] * row_scale[i];
            stage[(16 * mt + 2 * g + 1) * FLASH_STAGE_STRIDE + row] = acc[mt][nt][r + 2] * row_scale[i];
        }
    }
    block.sync();
    drain_columns<HS>(dst_t, tokens, stage, FLASH_STAGE_STRIDE, cta_row0, T, column_sums);
}

// Causal mask on a warp's 16 x N scores: the rows are queries from row0 (or keys, KEY_ROWS), the
// columns queries or keys from col0; pairs with key > query become `masked`.
template <int N, bool KEY_ROWS>
__device__ void mask_causal(float s[N / 8][4], int row0, int col0, float masked, int g, int q) {
#pragma unroll
    for (int n = 0; n < N / 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = row0 + g + (i >= 2 ? 8 : 0), col = col0 + 8 * n + 2 * q + (i & 1);
            if (causal_masked<KEY_ROWS>(row, col)) { s[n][i] = masked; }
        }
    }
}

// exp in the units of exponent_scale: exp2 (log2 e folded into the scale) in TF32 mode, the
// accurate expf in FP32-accurate mode.
template <bool SPLIT>
__device__ __forceinline__ float flash_exp(float x) {
    if constexpr (SPLIT) { return expf(x); }
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <bool SPLIT>
__device__ __forceinline__ float exponent_scale(float scale) { return SPLIT ? scale : scale * LOG2E; }

// ----------------------------------------------------------------------------------------------
// Forward: out = P v per query block, online softmax (running max and sum per row) or ReLU.

// Online softmax over one key tile for rows g and g+8: s becomes P (unnormalised), row_sum is
// rescaled to the new row maxima, and correction says by how much (for the output). Every row of a
// processed tile sees at least one key.
template <int N, bool SPLIT>
__device__ void online_softmax(float s[N / 8][4], float row_max[2], float row_sum[2], float correction[2],
                               float exp_scale, const cg::thread_block_tile<32>& warp) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float m = row_max[half];
#pragma unroll
        for (int n = 0; n < N / 8; n++) { m = fmaxf(m, fmaxf(s[n][2 * half], s[n][2 * half + 1])); }
        m = fmaxf(m, warp.shfl_xor(m, 1));
        m = fmaxf(m, warp.shfl_xor(m, 2));
        correction[half] = flash_exp<SPLIT>((row_max[half] - m) * exp_scale);
        row_max[half] = m;
        float offset = m * exp_scale, sum = 0.0f;
#pragma unroll
        for (int n = 0; n < N / 8; n++) {
#pragma unroll
            for (int i = 2 * half; i < 2 * half + 2; i++) {
                s[n][i] = flash_exp<SPLIT>(fmaf(s[n][i], exp_scale, -offset));
                sum += s[n][i];
            }
        }
        row_sum[half] = row_sum[half] * correction[half] + sum;
    }
}

template <AttentionKind KIND, int HS, bool SPLIT>
__global__ void __launch_bounds__(FLASH_THREADS, flash_forward_min_blocks(HS, SPLIT)) flash_forward_kernel(
    float* out, float* lse, const float* qkv, int T, int NH) {
#if __CUDA_ARCH__ >= 800
    constexpr int KEYS = flash_forward_keys(HS), TILE = KEYS * HS;
    extern __shared__ float smem[];  // two stages of {K tile, V tile}, KEYS x HS each
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3;
    FragmentOffsets off = fragment_offsets<HS>(g, q);
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C;
    int query0 = (gridDim.y - 1 - blockIdx.y) * FLASH_ROWS;  // the heaviest query blocks start first
    int warp_query0 = query0 + 16 * warp.meta_group_rank();
    const float* q_head = qkv + b * T * row_stride + h * HS;
    int num_tiles = ceil_div(min(query0 + FLASH_ROWS, T), KEYS);
    float scale = rsqrtf((float)HS), exp_scale = exponent_scale<SPLIT>(scale);

    load_key_tiles<KEYS, HS>(smem, q_head, C, row_stride, 0, T);
    cp_async_commit();
    float q_frag[HS / 8][4], o[HS / 16][2][4] = {};  // o: the output transposed (accumulate_transposed)
    load_a_global<HS, SPLIT>(q_frag, q_head, row_stride, warp_query0, T, g, q);
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int tile = 0; tile < num_tiles; tile++) {
        cp_async_wait_all();
        block.sync();  // tile landed for all; everyone is done with the other stage
        if (tile + 1 < num_tiles) { load_key_tiles<KEYS, HS>(smem, q_head, C, row_stride, tile + 1, T); }
        cp_async_commit();
        int key0 = tile * KEYS;
        if (key0 > warp_query0 + 15) { continue; }  // every key after every query of this warp
        const float* k_tile = smem + (tile & 1) * 2 * TILE;
        float s[KEYS / 8][4];
        scores_from_registers<HS, KEYS, SPLIT>(s, q_frag, k_tile, off);
        if (key0 + KEYS - 1 > warp_query0) {
            mask_causal<KEYS, false>(s, warp_query0, key0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
        }
        if (KIND == ATTENTION_SOFTMAX) {
            float correction[2], row_correction[4];
            online_softmax<KEYS, SPLIT>(s, row_max, row_sum, correction, exp_scale, warp);
            gather_rows(row_correction, correction, q, warp);
            scale_rows<HS>(o, row_correction);
        }
#pragma unroll
        for (int n = 0; n < KEYS / 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float p = KIND == ATTENTION_SOFTMAX ? s[n][i] : fmaxf(s[n][i] * scale, 0.0f);
                s[n][i] = tf32_operand<SPLIT>(p);
            }
        }
        accumulate_transposed<HS, KEYS, SPLIT>(o, s, k_tile + TILE, off);
    }

    float row_scale[4];
    if (KIND == ATTENTION_SOFTMAX) {
        float inverse_sum[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int row = warp_query0 + g + 8 * half;
            inverse_sum[half] = forward_row_scale<KIND, 4>(lse, (b * NH + h) * T, row_max[half], row_sum[half], scale,
                                                           row, T, q == 0, warp);
        }
        gather_rows(row_scale, inverse_sum, q, warp);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = warp_query0 + transposed_row(i, q);
            row_scale[i] = forward_row_scale<KIND, 4>(lse, 0, 0.0f, 0.0f, scale, row, T, false, warp);
        }
    }
    store_transposed<HS>(out + b * T * C + h * HS, C, o, row_scale, warp_query0, T, g, q);
#endif
}

// ----------------------------------------------------------------------------------------------
// Forward on Hopper (TF32 mode, built for sm_90a): the warpgroup MMA, wgmma, in place of mma.sync.
// A CTA of wgmma_groups(hs) warpgroups owns 64 queries per warpgroup and loops over key tiles of 64
// up to the diagonal, double-buffered. Per tile and warpgroup two wgmma chains:
//   S (64 x 64)  = Q (64 x hs, shared) K^T: K's tile [keys][hs] is the K-major B operand as it is;
//   O (64 x hs) += P (64 x 64, registers) V: TF32 needs B K-major, so V is stored transposed,
//                  [hs][keys], by the threads (loaded into registers one tile ahead).
// Shared tiles are panels (see "Hopper primitives"); A from registers has mma.sync's A layout
// (columns q, q + 4 of each k-step of 8); S's accumulator layout serves as P's A layout when the
// keys of each group of 8 are taken in the order 0 2 4 6 1 3 5 7, the order in which V^T's columns
// are stored (value_position). The kernel body exists only in the sm_90a build (g_wgmma says
// whether the GPU runs it).

constexpr int WG_QUERIES = 64;  // per warpgroup: wgmma's M
constexpr int WG_KEYS = 64;     // keys per tile: S's N, O's K
// Warpgroups a CTA, as the lab measured them (H200): four at hs 64, so that each K and V^T tile is
// loaded and transposed once for 256 queries (d12 shapes 2-10% faster than two); two at hs 32 (four:
// softmax 4% slower, ReLU 3.5% faster) and at hs 128 (four do not fit). Each warpgroup's rows are
// computed alike either way: the same bits.
__host__ __device__ constexpr int wgmma_groups(int hs) { return hs == 64 ? 4 : 2; }
__host__ __device__ constexpr int wgmma_threads(int hs) { return 128 * wgmma_groups(hs); }
__host__ __device__ constexpr int wgmma_cta_queries(int hs) { return WG_QUERIES * wgmma_groups(hs); }
// its dynamic shared memory: the queries' panels and two stages of K and V^T, + 1 KB for the alignment
constexpr size_t flash_wgmma_shared(int hs) {
    return (wgmma_cta_queries(hs) * hs + 4 * WG_KEYS * hs) * sizeof(float) + 1024;
}

// d (64 x 64) = A B^T over HS columns, A and B each 64 rows of a panelled tile (of a_rows and b_rows
// rows) in shared memory.
template <int HS>
__device__ __forceinline__ void wgmma_scores(float d[WG_KEYS / 8][4], const float* a, int a_rows, const float* b,
                                             int b_rows) {
#pragma unroll
    for (int ks = 0; ks < HS / 8; ks++) {
        wgmma_64x64_shared(&d[0][0], wgmma_descriptor(panel_step(a, ks, a_rows)),
                           wgmma_descriptor(panel_step(b, ks, b_rows)), ks > 0);
    }
}

// Rows [row0, row0 + ROWS) of a head's q or k into a panelled tile (cp.async; rows >= T as 0), by
// the block's first THREADS threads.
template <int ROWS, int HS, int THREADS>
__device__ void load_panels(float* tile, const float* head, size_t row_stride, int row0, int T) {
    constexpr int CHUNKS = HS / 4;
    static_assert(ROWS * CHUNKS % THREADS == 0, "whole passes");
#pragma unroll
    for (int pass = 0; pass < ROWS * CHUNKS / THREADS; pass++) {
        int idx = threadIdx.x + pass * THREADS, row = idx / CHUNKS, c = idx % CHUNKS;
        bool valid = row0 + row < T;
        const float* src = valid ? head + (size_t)(row0 + row) * row_stride + 4 * c : head;
        cp_async16(tile + panel_offset(row, 4 * c, ROWS), src, valid);
    }
}

// 16-byte chunks of a tile's values a thread of THREADS holds.
template <int HS, int THREADS>
__host__ __device__ constexpr int value_chunks() {
    static_assert(HS / 4 * WG_KEYS % THREADS == 0 && HS / 4 * WG_KEYS >= THREADS, "whole chunks a thread");
    return HS / 4 * WG_KEYS / THREADS;
}

// A thread's share of a tile's values: key tid % 64, value_chunks consecutive 16-byte chunks.
template <int HS, int THREADS>
__device__ void load_values(float4 v[value_chunks<HS, THREADS>()], const float* v_head, size_t row_stride, int key0,
                            int T) {
    constexpr int CHUNKS = value_chunks<HS, THREADS>();
    int key = threadIdx.x % WG_KEYS, chunk0 = threadIdx.x / WG_KEYS * CHUNKS;
    bool valid = key0 + key < T;
    const float4* src = (const float4*)(v_head + (size_t)(key0 + key) * row_stride) + chunk0;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) { v[i] = valid ? src[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
}

// Where key k of a tile sits among V^T's columns: 0 2 4 6 1 3 5 7 within each group of 8.
__device__ __forceinline__ int value_position(int k) { return (k & ~7) | ((k & 1) << 2) | ((k & 7) >> 1); }

// The values of load_values into V^T (HS rows of WG_KEYS columns, panelled); a warp writes 32
// columns of one row at a time, free of bank conflicts.
template <int HS, int THREADS>
__device__ void store_values_transposed(float* v_t, const float4 v[value_chunks<HS, THREADS>()]) {
    constexpr int CHUNKS = value_chunks<HS, THREADS>();
    int key = threadIdx.x % WG_KEYS, chunk0 = threadIdx.x / WG_KEYS * CHUNKS, col = value_position(key);
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        int d = 4 * (chunk0 + i);
        v_t[panel_offset(d, col, HS)] = v[i].x;
        v_t[panel_offset(d + 1, col, HS)] = v[i].y;
        v_t[panel_offset(d + 2, col, HS)] = v[i].z;
        v_t[panel_offset(d + 3, col, HS)] = v[i].w;
    }
}

// A warp's rows g and g + 8 of a wgmma accumulator times their factors (o by online_softmax's corrections).
template <int N>
__device__ __forceinline__ void scale_accumulator_rows(float acc[N / 8][4], const float factor[2]) {
#pragma unroll
    for (int n = 0; n < N / 8; n++) {
        acc[n][0] *= factor[0], acc[n][1] *= factor[0];
        acc[n][2] *= factor[1], acc[n][3] *= factor[1];
    }
}

// P for the P V product, rounded to TF32: the softmax's (s after online_softmax) or ReLU's, relu(s * scale).
template <AttentionKind KIND>
__device__ __forceinline__ void probabilities_for_pv(float p[WG_KEYS / 8][4], const float s[WG_KEYS / 8][4],
                                                     float scale) {
#pragma unroll
    for (int n = 0; n < WG_KEYS / 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p[n][i] = tf32_round_for_mma(KIND == ATTENTION_SOFTMAX ? s[n][i] : fmaxf(s[n][i] * scale, 0.0f));
        }
    }
}

// o (64 x HS) += P (s, 64 x WG_KEYS, TF32-rounded) V, V^T panelled in shared memory.
template <int HS>
__device__ __forceinline__ void wgmma_pv(float o[HS / 8][4], const float s[WG_KEYS / 8][4], const float* v_t) {
#pragma unroll
    for (int j = 0; j < WG_KEYS / 8; j++) {
        float a[4] = {s[j][0], s[j][2], s[j][1], s[j][3]};
        const float* b = panel_step(v_t, j, HS);
        if constexpr (HS == 32) {
            wgmma_64x32_registers(&o[0][0], a, wgmma_descriptor(b));
        } else {
#pragma unroll
            for (int n = 0; n < HS / 64; n++) { wgmma_64x64_registers(&o[8 * n][0], a, wgmma_descriptor(b + 64 * 32 * n)); }
        }
    }
}

// A warp's rows warp_query0 + g and + 8 of the output, o normalised: softmax by the row sums (and
// their log-sum-exp written to lse), ReLU by 1/(t+1).
template <AttentionKind KIND, int HS>
__device__ void store_forward_rows(float* out, float* lse, const float o[HS / 8][4], const float row_max[2],
                                   const float row_sum[2], size_t b, int h, int NH, int T, int warp_query0,
                                   float scale, const cg::thread_block_tile<32>& warp) {
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3;
    float row_scale[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int row = warp_query0 + g + 8 * half;
        row_scale[half] = forward_row_scale<KIND, 4>(lse, (b * NH + h) * T, row_max[half], row_sum[half], scale, row, T,
                                                     q == 0, warp);
        if (row >= T) { continue; }
        float* out_row = out + (b * T + row) * NH * HS + h * HS + 2 * q;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            *(float2*)(out_row + 8 * n) = make_float2(o[n][2 * half] * row_scale[half], o[n][2 * half + 1] * row_scale[half]);
        }
    }
}

template <AttentionKind KIND, int HS>
__global__ void __launch_bounds__(wgmma_threads(HS)) flash_forward_wgmma_kernel(float* out, float* lse,
                                                                                 const float* qkv, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int TILE = WG_KEYS * HS;  // a K or V^T tile
    constexpr int THREADS = wgmma_threads(HS), CTA_QUERIES = wgmma_cta_queries(HS);
    extern __shared__ float shared_raw[];
    // q (CTA_QUERIES x HS), then two stages of {K, V^T}; panels 1024-byte aligned
    float* q_tile = shared_aligned_1024(shared_raw);
    float* stages = q_tile + CTA_QUERIES * HS;
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int group = threadIdx.x / 128, g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3;
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C;
    int query0 = (gridDim.y - 1 - blockIdx.y) * CTA_QUERIES;  // the heaviest query blocks start first
    int group_query0 = query0 + WG_QUERIES * group, warp_query0 = group_query0 + 16 * (warp.meta_group_rank() % 4);
    const float* q_head = qkv + b * T * row_stride + h * HS;
    int num_tiles = ceil_div(min(query0 + CTA_QUERIES, T), WG_KEYS);
    float scale = rsqrtf((float)HS), exp_scale = exponent_scale<false>(scale);

    load_panels<CTA_QUERIES, HS, THREADS>(q_tile, q_head, row_stride, query0, T);
    load_panels<WG_KEYS, HS, THREADS>(stages, q_head + C, row_stride, 0, T);
    cp_async_commit();
    float4 v_next[value_chunks<HS, THREADS>()];
    load_values<HS, THREADS>(v_next, q_head + 2 * C, row_stride, 0, T);
    store_values_transposed<HS, THREADS>(stages + TILE, v_next);
    float o[HS / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    const float* q_rows = q_tile + WG_QUERIES * group * 32;  // the warpgroup's rows of every panel

    for (int tile = 0; tile < num_tiles; tile++) {
        cp_async_wait_all();
        fence_proxy_async();  // this thread's tile writes, visible to the tensor cores after the barrier
        block.sync();         // the tile is in; every warpgroup is done with the other stage
        const float* k_tile = stages + (tile & 1) * 2 * TILE;
        float* next_stage = stages + ((tile + 1) & 1) * 2 * TILE;
        bool next = tile + 1 < num_tiles;
        if (next) {
            load_panels<WG_KEYS, HS, THREADS>(next_stage, q_head + C, row_stride, (tile + 1) * WG_KEYS, T);
            load_values<HS, THREADS>(v_next, q_head + 2 * C, row_stride, (tile + 1) * WG_KEYS, T);
        }
        cp_async_commit();
        int key0 = tile * WG_KEYS;
        if (key0 <= group_query0 + WG_QUERIES - 1) {  // some key at or before some query of the warpgroup
            float s[WG_KEYS / 8][4];
            wgmma_fence();
            wgmma_scores<HS>(s, q_rows, CTA_QUERIES, k_tile, WG_KEYS);
            wgmma_commit();
            wgmma_wait_all();
            pin_registers<WG_KEYS / 2>(&s[0][0]);
            if (key0 + WG_KEYS - 1 > warp_query0) {
                mask_causal<WG_KEYS, false>(s, warp_query0, key0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
            }
            if (KIND == ATTENTION_SOFTMAX) {
                float correction[2];  // rows g and g + 8 have seen key 0 in tile 0: the maxima are finite
                online_softmax<WG_KEYS, false>(s, row_max, row_sum, correction, exp_scale, warp);
                scale_accumulator_rows<HS>(o, correction);
            }
            probabilities_for_pv<KIND>(s, s, scale);
            wgmma_fence();
            wgmma_pv<HS>(o, s, k_tile + TILE);
            wgmma_commit();
            wgmma_wait_all();
            pin_registers<HS / 2>(&o[0][0]);
        }
        if (next) { store_values_transposed<HS, THREADS>(next_stage + TILE, v_next); }
    }

    store_forward_rows<KIND, HS>(out, lse, o, row_max, row_sum, b, h, NH, T, warp_query0, scale, warp);
#endif
}

// ----------------------------------------------------------------------------------------------
// Backward. Per (query t, key s <= t): P from the recomputed score, dP = dout_t . v_s,
// dS = P (dP - delta_t) (softmax) or dP / (t+1) where the score is positive (ReLU);
// dq_t = scale sum_s dS k_s, dk_s = scale sum_t dS q_t, dv_s = sum_t P dout_t.

// P and dS from a score s and its dP, in place, given the query's statistics: softmax (lse in
// exponent units, delta), ReLU (1/(t+1)). Masked scores are -inf (softmax) or 0 (ReLU).
template <AttentionKind KIND, bool SPLIT>
__device__ __forceinline__ void probability_and_gradient(float& s, float& dp, float scale, float exp_scale,
                                                         float stat_a, float stat_b) {
    if (KIND == ATTENTION_SOFTMAX) {
        float p = flash_exp<SPLIT>(fmaf(s, exp_scale, -stat_a));
        dp = p * (dp - stat_b);
        s = p;
    } else {
        dp = s > 0.0f ? dp * stat_a : 0.0f;
        s = fmaxf(s * scale, 0.0f) * stat_a;
    }
}

// The statistics of rows row0 + g and row0 + g + 8 of a warp (query_statistic, query_delta), for
// probability_and_gradient: lane pair 2r, 2r+1 computes row r's delta, also written to delta_head
// for the dK/dV kernel.
template <AttentionKind KIND, int HS, bool SPLIT>
__device__ void row_statistics(float stat_a[2], float stat_b[2], float* delta_head, const float* lse_head,
                               const float* do_head, const float* out_head, int C, int row0, int T,
                               const cg::thread_block_tile<32>& warp) {
    int lane = warp.thread_rank(), g = lane >> 2;
    stat_b[0] = stat_b[1] = 0.0f;
    if (KIND == ATTENTION_SOFTMAX) {
        int row = row0 + lane / 2;
        float sum = query_delta<HS, 2>(do_head + (size_t)row * C, out_head + (size_t)row * C, row < T, lane & 1, warp);
        if ((lane & 1) == 0 && row < T) { delta_head[row] = sum; }
        stat_b[0] = warp.shfl(sum, 2 * g);
        stat_b[1] = warp.shfl(sum, 2 * (g + 8));
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        stat_a[half] = query_statistic<KIND, SPLIT>(lse_head, row0 + g + 8 * half, T);
    }
}

// dQ: one CTA per 64 queries of a head, looping over key tiles up to the diagonal. Softmax also
// computes delta for its rows (read by the dK/dV kernel, launched after).
template <AttentionKind KIND, int HS, bool SPLIT, int KEYS>
__global__ void __launch_bounds__(FLASH_THREADS, flash_dq_min_blocks(HS, SPLIT)) flash_backward_dq_kernel(
    float* dqkv_t, float* bias_partials, float* delta, const float* dout, const float* qkv, const float* out,
    const float* lse, int T, int NH) {
#if __CUDA_ARCH__ >= 800
    constexpr int TILE = KEYS * HS;
    constexpr bool HOLD = flash_holds_rows(HS);
    extern __shared__ float smem[];  // two stages of {K tile, V tile}, then (!HOLD) the Q and dO tiles
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3, warp_row = 16 * warp.meta_group_rank();
    FragmentOffsets off = fragment_offsets<HS>(g, q);
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    int query0 = (gridDim.y - 1 - blockIdx.y) * FLASH_ROWS;  // the heaviest query blocks start first
    int warp_query0 = query0 + warp_row;
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    float *q_tile = smem + 4 * TILE, *do_tile = q_tile + FLASH_ROWS * HS;
    int num_tiles = ceil_div(min(query0 + FLASH_ROWS, T), KEYS);
    float scale = rsqrtf((float)HS), exp_scale = exponent_scale<SPLIT>(scale);

    load_key_tiles<KEYS, HS>(smem, q_head, C, row_stride, 0, T);
    if constexpr (!HOLD) {
        load_tile<FLASH_ROWS, HS>(q_tile, q_head, row_stride, query0, T);
        load_tile<FLASH_ROWS, HS>(do_tile, do_head, C, query0, T);
    }
    cp_async_commit();
    float q_frag[HOLD ? HS / 8 : 1][4], do_frag[HOLD ? HS / 8 : 1][4];
    if constexpr (HOLD) {
        load_a_global<HS, SPLIT>(q_frag, q_head, row_stride, warp_query0, T, g, q);
        load_a_global<HS, SPLIT>(do_frag, do_head, C, warp_query0, T, g, q);
    }
    float stat_a[2], stat_b[2];
    row_statistics<KIND, HS, SPLIT>(stat_a, stat_b, delta + head_rows, lse + head_rows, do_head,
                                    out + b * T * C + h * HS, C, warp_query0, T, warp);
    float dq[HS / 16][2][4] = {};  // transposed

    for (int tile = 0; tile < num_tiles; tile++) {
        cp_async_wait_all();
        block.sync();
        if (tile + 1 < num_tiles) { load_key_tiles<KEYS, HS>(smem, q_head, C, row_stride, tile + 1, T); }
        cp_async_commit();
        int key0 = tile * KEYS;
        if (key0 > warp_query0 + 15) { continue; }
        const float* k_tile = smem + (tile & 1) * 2 * TILE;
        float s[KEYS / 8][4], dp[KEYS / 8][4];
        warp_scores<HS, KEYS, SPLIT, HOLD>(s, q_frag, q_tile, warp_row, k_tile, off);
        if (key0 + KEYS - 1 > warp_query0) {
            mask_causal<KEYS, false>(s, warp_query0, key0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
        }
        warp_scores<HS, KEYS, SPLIT, HOLD>(dp, do_frag, do_tile, warp_row, k_tile + TILE, off);
#pragma unroll
        for (int n = 0; n < KEYS / 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                probability_and_gradient<KIND, SPLIT>(s[n][i], dp[n][i], scale, exp_scale, stat_a[i / 2],
                                                      stat_b[i / 2]);
                dp[n][i] = tf32_operand<SPLIT>(dp[n][i]);
            }
        }
        accumulate_transposed<HS, KEYS, SPLIT>(dq, dp, k_tile, off);
    }
    float row_scale[4] = {scale, scale, scale, scale};
    size_t tokens = gridDim.x / NH * (size_t)T;
    float* partials = bias_partials + (b * gridDim.y + query0 / FLASH_ROWS) * row_stride + h * HS;
    store_columns<HS>(dqkv_t + h * HS * tokens + b * T, tokens, dq, row_scale, query0, warp_row, T, partials, smem, g,
                      q);
#endif
}

// One stage of the dK/dV kernel: queries [query0, query0 + QUERIES) as Q and dO tiles plus per-query
// statistics: lse and delta (softmax) or 1/(t+1) (ReLU).
template <AttentionKind KIND, int HS, int QUERIES>
__device__ void load_query_stage(float* stage, const float* q_head, const float* do_head, const float* lse_head,
                                 const float* delta_head, size_t row_stride, int C, int query0, int T) {
    constexpr int TILE = QUERIES * HS;
    load_tile<QUERIES, HS>(stage, q_head, row_stride, query0, T);
    load_tile<QUERIES, HS>(stage + TILE, do_head, C, query0, T);
    float* stats = stage + 2 * TILE;
    for (int i = threadIdx.x; i < QUERIES; i += FLASH_THREADS) {
        int t = query0 + i;
        if (KIND == ATTENTION_SOFTMAX) {
            cp_async4(stats + i, lse_head + (t < T ? t : 0), t < T);
            cp_async4(stats + QUERIES + i, delta_head + (t < T ? t : 0), t < T);
        } else {
            stats[i] = relu_row_scale(t);
        }
    }
}

// One query tile of the dK/dV kernel for a warp's 16 keys: S^T and dP^T (rows are keys, columns
// queries) against the q and dout tiles of a load_query_stage stage, then P^T and dS^T in s and dp
// (TF32-ready), then dv += P^T dout and dk += dS^T q.
template <AttentionKind KIND, int HS, bool SPLIT, bool HOLD, int QUERIES>
__device__ __forceinline__ void dkdv_tile(float dk[HS / 16][2][4], float dv[HS / 16][2][4], float s[QUERIES / 8][4],
                                          float dp[QUERIES / 8][4], const float k_frag[][4], const float v_frag[][4],
                                          const float* k_tile, const float* v_tile, const float* stage, int warp_row,
                                          int warp_key0, int query0, float scale, const FragmentOffsets& off, int g,
                                          int q) {
    constexpr int TILE = QUERIES * HS;
    const float *q_tile = stage, *do_tile = stage + TILE, *stat_a = stage + 2 * TILE, *stat_b = stat_a + QUERIES;
    float exp_scale = exponent_scale<SPLIT>(scale);
    warp_scores<HS, QUERIES, SPLIT, HOLD>(s, k_frag, k_tile, warp_row, q_tile, off);
    if (query0 < warp_key0 + 15) {
        mask_causal<QUERIES, true>(s, warp_key0, query0, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f, g, q);
    }
    warp_scores<HS, QUERIES, SPLIT, HOLD>(dp, v_frag, v_tile, warp_row, do_tile, off);
#pragma unroll
    for (int n = 0; n < QUERIES / 8; n++) {
        float2 pair_a = *(const float2*)(stat_a + 8 * n + 2 * q), pair_b = *(const float2*)(stat_b + 8 * n + 2 * q);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float column_a = (i & 1) ? pair_a.y : pair_a.x, column_b = (i & 1) ? pair_b.y : pair_b.x;
            if (KIND == ATTENTION_SOFTMAX) { column_a = lse_in_exponent_units<SPLIT>(column_a); }
            probability_and_gradient<KIND, SPLIT>(s[n][i], dp[n][i], scale, exp_scale, column_a, column_b);
            s[n][i] = tf32_operand<SPLIT>(s[n][i]);
            dp[n][i] = tf32_operand<SPLIT>(dp[n][i]);
        }
    }
    accumulate_transposed<HS, QUERIES, SPLIT>(dv, s, do_tile, off);
    accumulate_transposed<HS, QUERIES, SPLIT>(dk, dp, q_tile, off);
}

// dK, dV: one CTA per 64 keys of a head, looping over query tiles from the diagonal to T.
template <AttentionKind KIND, int HS, bool SPLIT, int QUERIES>
__global__ void __launch_bounds__(FLASH_THREADS, flash_dkdv_min_blocks(HS, SPLIT)) flash_backward_dkdv_kernel(
    float* dqkv_t, float* bias_partials, const float* dout, const float* qkv, const float* lse, const float* delta,
    int T, int NH) {
#if __CUDA_ARCH__ >= 800
    constexpr int TILE = QUERIES * HS, STAGE = 2 * TILE + 2 * QUERIES;
    constexpr bool HOLD = flash_holds_rows(HS);
    extern __shared__ float smem[];  // two stages of load_query_stage, then (!HOLD) the K and V tiles
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int g = warp.thread_rank() >> 2, q = warp.thread_rank() & 3, warp_row = 16 * warp.meta_group_rank();
    FragmentOffsets off = fragment_offsets<HS>(g, q);
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    int key0 = blockIdx.y * FLASH_ROWS;  // the heaviest (earliest) key blocks start first
    int warp_key0 = key0 + warp_row;
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    float *k_tile = smem + 2 * STAGE, *v_tile = k_tile + FLASH_ROWS * HS;
    int first_tile = key0 / QUERIES, num_tiles = ceil_div(T, QUERIES);
    float scale = rsqrtf((float)HS);

    load_query_stage<KIND, HS, QUERIES>(smem, q_head, do_head, lse + head_rows, delta + head_rows, row_stride, C,
                               first_tile * QUERIES, T);
    if constexpr (!HOLD) {
        load_tile<FLASH_ROWS, HS>(k_tile, q_head + C, row_stride, key0, T);
        load_tile<FLASH_ROWS, HS>(v_tile, q_head + 2 * C, row_stride, key0, T);
    }
    cp_async_commit();
    float k_frag[HOLD ? HS / 8 : 1][4], v_frag[HOLD ? HS / 8 : 1][4];
    if constexpr (HOLD) {
        load_a_global<HS, SPLIT>(k_frag, q_head + C, row_stride, warp_key0, T, g, q);
        load_a_global<HS, SPLIT>(v_frag, q_head + 2 * C, row_stride, warp_key0, T, g, q);
    }
    float dk[HS / 16][2][4] = {}, dv[HS / 16][2][4] = {};  // transposed

    for (int tile = first_tile; tile < num_tiles; tile++) {
        cp_async_wait_all();
        block.sync();
        if (tile + 1 < num_tiles) {
            load_query_stage<KIND, HS, QUERIES>(smem + ((tile + 1 - first_tile) & 1) * STAGE, q_head, do_head,
                                                lse + head_rows, delta + head_rows, row_stride, C,
                                                (tile + 1) * QUERIES, T);
        }
        cp_async_commit();
        int query0 = tile * QUERIES;
        if (query0 + QUERIES - 1 < warp_key0) { continue; }  // every query before every key of this warp
        float s[QUERIES / 8][4], dp[QUERIES / 8][4];
        dkdv_tile<KIND, HS, SPLIT, HOLD, QUERIES>(dk, dv, s, dp, k_frag, v_frag, k_tile, v_tile,
                                                  smem + ((tile - first_tile) & 1) * STAGE, warp_row, warp_key0,
                                                  query0, scale, off, g, q);
    }
    float dk_scale[4] = {scale, scale, scale, scale}, dv_scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    size_t tokens = gridDim.x / NH * (size_t)T;
    float* dk_t = dqkv_t + (C + h * HS) * tokens + b * T;
    float* partials = bias_partials + (b * gridDim.y + blockIdx.y) * row_stride + C + h * HS;
    store_columns<HS>(dk_t, tokens, dk, dk_scale, key0, warp_row, T, partials, smem, g, q);
    store_columns<HS>(dk_t + C * tokens, tokens, dv, dv_scale, key0, warp_row, T, partials + C, smem, g, q);
#endif
}

// ----------------------------------------------------------------------------------------------
// Flash attention on the FP32 cores: the path for GPUs before Ampere (compute capability 6.0 to 7.5:
// P100, V100, T4), which have neither mma.sync nor cp.async. Plain fmaf products, both kinds, head
// sizes 32, 64 and 128, any T; the inputs, outputs and scratch of flash_attention_forward and
// flash_attention_backward (lse: the natural log of the sum of exp(score * scale) per query, as
// the forward above writes it; ReLU writes no lse), so it can stand in for them.
//
// Layouts (row-major float32; global ones as in the section's header):
//   shared tiles  [rows][W + 4] floats (W a multiple of 16; the 4 floats of padding shift each row
//                 by one 16-byte chunk, fp32_offset). Row tiles [rows][hs] hold q, k, v or dout; the
//                 P and dS tiles hold, per row of the streamed side, each thread's RA values side by
//                 side (thread ta's at columns RA ta .. RA ta + RA - 1).
// Work split, the register tiling of an SGEMM: a block owns ROWS rows (the forward and dQ kernels:
// queries; dK/dV: keys) and loops over tiles of TILE rows of the other side. Thread tid is
// (ta, tb) = (tid / 8, tid % 8), so the 8 threads of a row group are 8 consecutive lanes:
//   scores (S = q k^T, dP = dout v^T; dK/dV: their transposes): an RA x RB block of dot products,
//       rows ta + TA i (TA = threads / 8) of the block against rows tb + 8 j of the tile, over hs
//       in float4 steps: RA + RB shared loads per 4 RA RB fmaf;
//   sums (O += P v, dQ += dS k, dV += P^T dout, dK += dS^T q): the same RA rows times hs / 8
//       dimensions, 4 (tb + 8 m) + e, summed over the tile's rows n: per n one RA-vector of P or dS
//       and hs / 32 float4 of values. The padding makes every shared load of a warp conflict-free
//       (4 or 8 consecutive rows at one chunk, or one row at distinct chunks) while keeping each
//       thread's addresses affine in the loop counters (few address registers).
// The forward's row maxima are three shuffles over a row group; P goes through shared memory to
// the threads that own its rows' output dimensions.
// Tiles wholly above the diagonal are skipped per block, diagonal tiles masked; the next tile is
// loaded into registers during the sums and stored after them (single-buffered shared memory, at
// most 48 KB per block for every head size: no opt-in, a P100's limit). The heaviest blocks start
// first. dQ (with delta) and dK/dV come from two kernels that each recompute P, every output
// element has one writer, and the bias gradient's partial sums are per FP32_PARTIAL_ROWS tokens,
// summed in a fixed order: bit-identical results run to run.

// A kernel's tiling: THREADS threads, each with RA rows of the block's side and RB rows of each
// streamed tile; MIN_BLOCKS blocks per multiprocessor for the register allocation.
struct Fp32Tiling {
    int threads, ra, rb, min_blocks;
    __host__ __device__ constexpr int rows() const { return threads / 8 * ra; }  // the block's rows
    __host__ __device__ constexpr int tile() const { return 8 * rb; }             // a streamed tile's rows
};

// Chosen for hs = 64: 4 x 4 per thread where the tiles fit (8 shared loads per 64 fmaf), the dQ
// kernel (q and dout rows both held) in 64 threads; hs = 128 halves the tiles to stay within 48 KB.
// The backward's `small` plans, for multiprocessors of 64 KB (T4, RTX 20, P100): each kernel within
// ~31 KB, so that two blocks fit on one where the others' 34-43 KB fit one (lab: attention.cu variant
// 11). The forward has one plan: its small one (30 KB at hs 64) was slower there too (dev/cuda/README.md).
__host__ __device__ constexpr Fp32Tiling fp32_forward_tiling(int hs) {
    return hs <= 64 ? Fp32Tiling{128, 4, 4, 4} : Fp32Tiling{128, 2, 2, 4};
}
__host__ __device__ constexpr Fp32Tiling fp32_dq_tiling(int hs, bool small = false) {
    if (small) {
        return hs <= 32 ? Fp32Tiling{128, 4, 4, 4} : hs <= 64 ? Fp32Tiling{64, 4, 2, 5} : Fp32Tiling{64, 2, 1, 4};
    }
    return hs <= 32 ? Fp32Tiling{128, 4, 4, 4} : hs <= 64 ? Fp32Tiling{64, 4, 4, 5} : Fp32Tiling{64, 2, 2, 4};
}
__host__ __device__ constexpr Fp32Tiling fp32_dkdv_tiling(int hs, bool small = false) {
    if (small) { return hs <= 64 ? Fp32Tiling{64, 2, 4, 4} : Fp32Tiling{64, 2, 1, 4}; }
    return hs <= 64 ? Fp32Tiling{128, 2, 4, 3} : Fp32Tiling{64, 2, 2, 4};
}

constexpr int FP32_PAD = 4;                       // floats of padding per tile row
constexpr int FP32_SHARED_LIMIT = 48 * 1024 / 4;  // floats a block may use without opting in
constexpr int FP32_PARTIAL_ROWS = 16;             // tokens per row of the bias gradient's partial sums

// Shared memory (floats) per block: the forward's q rows, a K and a V tile and P^T; dQ's q and dout
// rows, a K tile and a V tile that dS^T replaces once dP is done; dK/dV's k and v rows, a q and a
// dout tile, P and dS, and two statistics per query of the tile.

__host__ __device__ constexpr int fp32_forward_shared_floats(int hs) {
    Fp32Tiling t = fp32_forward_tiling(hs);
    return (t.rows() + 2 * t.tile()) * (hs + FP32_PAD) + t.tile() * (t.rows() + FP32_PAD);
}
__host__ __device__ constexpr int fp32_dq_shared_floats(int hs, bool small = false) {
    Fp32Tiling t = fp32_dq_tiling(hs, small);
    return (2 * t.rows() + t.tile()) * (hs + FP32_PAD) + t.tile() * (hs > t.rows() ? hs : t.rows()) +
           t.tile() * FP32_PAD;
}
__host__ __device__ constexpr int fp32_dkdv_shared_floats(int hs, bool small = false) {
    Fp32Tiling t = fp32_dkdv_tiling(hs, small);
    return 2 * (t.rows() + t.tile()) * (hs + FP32_PAD) + 2 * t.tile() * (t.rows() + FP32_PAD) + 2 * t.tile();
}

// Float offset of (row, col) in a [rows][W] tile, rows W + FP32_PAD floats apart.
template <int W>
__device__ __forceinline__ int fp32_offset(int row, int col) {
    static_assert(W % 16 == 0, "a tile row is a multiple of four 16-byte chunks");
    return row * (W + FP32_PAD) + col;
}

// N consecutive floats (N = 1, 2 or 4, aligned to N) from or to shared memory.
template <int N>
__device__ __forceinline__ void fp32_load_vector(float (&v)[N], const float* src) {
    if constexpr (N == 4) {
        float4 x = *(const float4*)src;
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else if constexpr (N == 2) {
        float2 x = *(const float2*)src;
        v[0] = x.x, v[1] = x.y;
    } else {
        v[0] = src[0];
    }
}

template <int N>
__device__ __forceinline__ void fp32_store_vector(float* dst, const float (&v)[N]) {
    if constexpr (N == 4) { *(float4*)dst = make_float4(v[0], v[1], v[2], v[3]); }
    else if constexpr (N == 2) { *(float2*)dst = make_float2(v[0], v[1]); }
    else { dst[0] = v[0]; }
}

// Rows [row0, row0 + ROWS) of one head's q, k, v or dout (rows row_stride floats apart; rows >= T
// read as 0) in flight in registers: chunk THREADS k + tid of the rows' float4 chunks in row-major
// order, so that a warp reads whole rows.
template <int ROWS, int HS, int THREADS>
struct Fp32Rows {
    static constexpr int CHUNKS = HS / 4, COUNT = ROWS * CHUNKS / THREADS, ROW_STEP = THREADS / CHUNKS;
    static_assert(THREADS % CHUNKS == 0 && ROWS % ROW_STEP == 0, "whole rows per pass");
    float4 chunk[COUNT];
};

template <int ROWS, int HS, int THREADS>
__device__ __forceinline__ void fp32_fetch_rows(Fp32Rows<ROWS, HS, THREADS>& rows, const float* head,
                                                size_t row_stride, int row0, int T) {
    using R = Fp32Rows<ROWS, HS, THREADS>;
    int row = row0 + threadIdx.x / R::CHUNKS, col = 4 * (threadIdx.x % R::CHUNKS);
#pragma unroll
    for (int k = 0; k < R::COUNT; k++, row += R::ROW_STEP) {
        rows.chunk[k] = row < T ? *(const float4*)(head + (size_t)row * row_stride + col)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

template <int ROWS, int HS, int THREADS>
__device__ __forceinline__ void fp32_store_rows(float* tile, const Fp32Rows<ROWS, HS, THREADS>& rows) {
    using R = Fp32Rows<ROWS, HS, THREADS>;
    int row = threadIdx.x / R::CHUNKS, col = 4 * (threadIdx.x % R::CHUNKS);
#pragma unroll
    for (int k = 0; k < R::COUNT; k++, row += R::ROW_STEP) {
        *(float4*)(tile + fp32_offset<HS>(row, col)) = rows.chunk[k];
    }
}

// Key tile key0's k and v rows into registers (q_head: the head's q columns; k and v follow C and 2C
// floats later), fetched while the current tiles are in use.
template <int KEYS, int HS, int THREADS>
__device__ __forceinline__ void fp32_fetch_keys(Fp32Rows<KEYS, HS, THREADS>& k, Fp32Rows<KEYS, HS, THREADS>& v,
                                                const float* q_head, int C, size_t row_stride, int key0, int T) {
    fp32_fetch_rows(k, q_head + C, row_stride, key0, T);
    fp32_fetch_rows(v, q_head + 2 * C, row_stride, key0, T);
}

// Rows straight into a tile (the first tiles, before the loop).
template <int ROWS, int HS, int THREADS>
__device__ void fp32_load_rows(float* tile, const float* head, size_t row_stride, int row0, int T) {
    Fp32Rows<ROWS, HS, THREADS> rows;
    fp32_fetch_rows(rows, head, row_stride, row0, T);
    fp32_store_rows(tile, rows);
}

// acc[i][j] = row ta + A_STEP i of a_tile . row tb + 8 j of b_tile, over the HS columns (row tiles).
// The column loop stays rolled: unrolled, the compiler hoists later steps' loads and spills; the
// other warps of the multiprocessor hide a step's load latency.
template <int RA, int RB, int A_STEP, int HS>
__device__ __forceinline__ void fp32_scores(float (&acc)[RA][RB], const float* a_tile, const float* b_tile, int ta,
                                            int tb) {
#pragma unroll
    for (int i = 0; i < RA; i++) {
#pragma unroll
        for (int j = 0; j < RB; j++) { acc[i][j] = 0.0f; }
    }
    const float* a_row = a_tile + fp32_offset<HS>(ta, 0);
    const float* b_row = b_tile + fp32_offset<HS>(tb, 0);
#pragma unroll 1
    for (int col = 0; col < HS; col += 4, a_row += 4, b_row += 4) {
        float4 a[RA], b[RB];
#pragma unroll
        for (int i = 0; i < RA; i++) { a[i] = *(const float4*)(a_row + fp32_offset<HS>(A_STEP * i, 0)); }
#pragma unroll
        for (int j = 0; j < RB; j++) { b[j] = *(const float4*)(b_row + fp32_offset<HS>(8 * j, 0)); }
#pragma unroll
        for (int i = 0; i < RA; i++) {
#pragma unroll
            for (int j = 0; j < RB; j++) {
                acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
                acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
                acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
                acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
            }
        }
    }
}

// Causal mask on a thread's scores: rows row + A_STEP i, columns col + 8 j, queries and keys or
// (KEY_ROWS) keys and queries; pairs with key > query become `masked`.
template <int RA, int RB, int A_STEP, bool KEY_ROWS>
__device__ __forceinline__ void fp32_mask_causal(float (&s)[RA][RB], int row, int col, float masked) {
#pragma unroll
    for (int i = 0; i < RA; i++) {
#pragma unroll
        for (int j = 0; j < RB; j++) {
            if (causal_masked<KEY_ROWS>(row + A_STEP * i, col + 8 * j)) { s[i][j] = masked; }
        }
    }
}

// A thread's P or dS into an [RB * 8][XW] tile: x_tile[tb + 8 j][RA ta + i] = v[i][j].
template <int RA, int RB, int XW>
__device__ __forceinline__ void fp32_store_transposed(float* x_tile, const float (&v)[RA][RB], int ta, int tb) {
#pragma unroll
    for (int j = 0; j < RB; j++) {
        float column[RA];
#pragma unroll
        for (int i = 0; i < RA; i++) { column[i] = v[i][j]; }
        fp32_store_vector<RA>(x_tile + fp32_offset<XW>(tb + 8 * j, RA * ta), column);
    }
}

// acc[i][4 m + e] += sum over the N tile rows n of x[n][RA ta + i] * v[n][4 (tb + 8 m) + e]: x an
// [N][XW] tile of P or dS (fp32_store_transposed), v a row tile.
template <int RA, int HS, int N, int XW>
__device__ __forceinline__ void fp32_accumulate(float (&acc)[RA][HS / 8], const float* x_tile, const float* v_tile,
                                                int ta, int tb) {
#pragma unroll
    for (int n = 0; n < N; n++) {
        float x[RA];
        fp32_load_vector<RA>(x, x_tile + fp32_offset<XW>(n, RA * ta));
#pragma unroll
        for (int m = 0; m < HS / 32; m++) {
            float4 v = *(const float4*)(v_tile + fp32_offset<HS>(n, 4 * (tb + 8 * m)));
#pragma unroll
            for (int i = 0; i < RA; i++) {
                acc[i][4 * m + 0] = fmaf(x[i], v.x, acc[i][4 * m + 0]);
                acc[i][4 * m + 1] = fmaf(x[i], v.y, acc[i][4 * m + 1]);
                acc[i][4 * m + 2] = fmaf(x[i], v.z, acc[i][4 * m + 2]);
                acc[i][4 * m + 3] = fmaf(x[i], v.w, acc[i][4 * m + 3]);
            }
        }
    }
}

// Backward outputs transposed: the block's ROWS rows of acc (a thread's rows ta + TA i, dimensions
// 4 (tb + 8 m) + e), each times factor, staged as stage[d][row] (HS x (ROWS + 1) floats, free:
// every thread is past its last tile), then dimension d's rows to dst_t[d * tokens + row0 + row]
// (rows >= T skipped) and, per FP32_PARTIAL_ROWS rows, their sum in row order to
// partials[p * partial_stride + d].
template <int RA, int HS, int THREADS>
__device__ void fp32_store_columns(float* dst_t, size_t tokens, const float (&acc)[RA][HS / 8], float factor, int row0,
                                   int T, float* partials, size_t partial_stride, float* stage, int ta, int tb) {
    constexpr int TA = THREADS / 8, ROWS = TA * RA, STRIDE = ROWS + 1;  // odd: conflict-free staging
    static_assert(ROWS % FP32_PARTIAL_ROWS == 0, "whole rows of partials per block");
    cg::thread_block block = cg::this_thread_block();
    block.sync();  // every thread is done with the tiles, or with a previous call's stage
#pragma unroll
    for (int i = 0; i < RA; i++) {
#pragma unroll
        for (int m = 0; m < HS / 32; m++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                stage[(4 * (tb + 8 * m) + e) * STRIDE + ta + TA * i] = acc[i][4 * m + e] * factor;
            }
        }
    }
    block.sync();
    int rows = min(ROWS, T - row0);
    for (int idx = threadIdx.x; idx < HS * ROWS; idx += THREADS) {
        int d = idx / ROWS, row = idx % ROWS;
        if (row < rows) { dst_t[(size_t)d * tokens + row0 + row] = stage[d * STRIDE + row]; }
    }
    for (int idx = threadIdx.x; idx < HS * (ROWS / FP32_PARTIAL_ROWS); idx += THREADS) {
        int d = idx % HS, part = idx / HS, first = part * FP32_PARTIAL_ROWS;
        if (first >= rows) { continue; }
        int last = min(first + FP32_PARTIAL_ROWS, rows);
        float sum = 0.0f;
        for (int row = first; row < last; row++) { sum += stage[d * STRIDE + row]; }
        partials[part * partial_stride + d] = sum;
    }
}

// ----------------------------------------------------------------------------------------------
// Forward: out = P v per block of queries, online softmax (a row's maximum over its 8 threads,
// its sum kept per thread until the end) or ReLU.

template <AttentionKind KIND, int HS>
__global__ void __launch_bounds__(fp32_forward_tiling(HS).threads, fp32_forward_tiling(HS).min_blocks)
    flash_fp32_forward_kernel(float* out, float* lse, const float* qkv, int T, int NH) {
    constexpr Fp32Tiling TILING = fp32_forward_tiling(HS);
    constexpr int THREADS = TILING.threads, RQ = TILING.ra, RK = TILING.rb, TQ = THREADS / 8;
    constexpr int QUERIES = TILING.rows(), KEYS = TILING.tile(), DIMS = HS / 8;
    static_assert(fp32_forward_shared_floats(HS) <= FP32_SHARED_LIMIT, "48 KB of shared memory");
    extern __shared__ float smem[];
    constexpr int ROW = HS + FP32_PAD;       // floats per row of a row tile
    float* q_tile = smem;                    // QUERIES x HS
    float* k_tile = q_tile + QUERIES * ROW;  // KEYS x HS
    float* v_tile = k_tile + KEYS * ROW;     // KEYS x HS
    float* p_tile = v_tile + KEYS * ROW;     // P^T: KEYS x QUERIES
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int ta = threadIdx.x / 8, tb = threadIdx.x % 8;
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C;
    int query0 = (gridDim.y - 1 - blockIdx.y) * QUERIES;  // the heaviest query blocks start first
    const float* q_head = qkv + b * T * row_stride + h * HS;
    int num_tiles = ceil_div(min(query0 + QUERIES, T), KEYS);
    float scale = rsqrtf((float)HS), exp_scale = scale * LOG2E;

    fp32_load_rows<QUERIES, HS, THREADS>(q_tile, q_head, row_stride, query0, T);
    fp32_load_rows<KEYS, HS, THREADS>(k_tile, q_head + C, row_stride, 0, T);
    fp32_load_rows<KEYS, HS, THREADS>(v_tile, q_head + 2 * C, row_stride, 0, T);
    block.sync();
    float o[RQ][DIMS] = {};
    float row_max[RQ], row_sum[RQ];  // row_sum: this thread's keys only
#pragma unroll
    for (int i = 0; i < RQ; i++) { row_max[i] = -INFINITY, row_sum[i] = 0.0f; }

    for (int tile = 0; tile < num_tiles; tile++) {
        int key0 = tile * KEYS;
        bool next = tile + 1 < num_tiles;
        float s[RQ][RK];
        fp32_scores<RQ, RK, TQ, HS>(s, q_tile, k_tile, ta, tb);
        if (key0 + KEYS - 1 > query0) {
            float masked = KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f;
            fp32_mask_causal<RQ, RK, TQ, false>(s, query0 + ta, key0 + tb, masked);
        }
#pragma unroll
        for (int i = 0; i < RQ; i++) {
            if (KIND == ATTENTION_SOFTMAX) {  // every row saw key 0 in tile 0: the maxima are finite
                float m = row_max[i];
#pragma unroll
                for (int j = 0; j < RK; j++) { m = fmaxf(m, s[i][j]); }
                m = fmaxf(m, warp.shfl_xor(m, 1));
                m = fmaxf(m, warp.shfl_xor(m, 2));
                m = fmaxf(m, warp.shfl_xor(m, 4));
                float correction = flash_exp<false>((row_max[i] - m) * exp_scale), offset = m * exp_scale, sum = 0.0f;
                row_max[i] = m;
#pragma unroll
                for (int j = 0; j < RK; j++) {
                    s[i][j] = flash_exp<false>(fmaf(s[i][j], exp_scale, -offset));
                    sum += s[i][j];
                }
                row_sum[i] = row_sum[i] * correction + sum;
#pragma unroll
                for (int d = 0; d < DIMS; d++) { o[i][d] *= correction; }
            } else {
#pragma unroll
                for (int j = 0; j < RK; j++) { s[i][j] = fmaxf(s[i][j] * scale, 0.0f); }
            }
        }
        fp32_store_transposed<RQ, RK, QUERIES>(p_tile, s, ta, tb);
        block.sync();  // P is in
        Fp32Rows<KEYS, HS, THREADS> k_next, v_next;
        if (next) { fp32_fetch_keys(k_next, v_next, q_head, C, row_stride, key0 + KEYS, T); }
        fp32_accumulate<RQ, HS, KEYS, QUERIES>(o, p_tile, v_tile, ta, tb);
        block.sync();  // every thread is done with K, V and P
        if (next) {
            fp32_store_rows(k_tile, k_next);
            fp32_store_rows(v_tile, v_next);
            block.sync();
        }
    }

    float row_scale[RQ];
#pragma unroll
    for (int i = 0; i < RQ; i++) {
        int row = query0 + ta + TQ * i;
        row_scale[i] = forward_row_scale<KIND, 8>(lse, (b * NH + h) * T, row_max[i], row_sum[i], scale, row, T, tb == 0,
                                                  warp);
    }
#pragma unroll
    for (int i = 0; i < RQ; i++) {
        int row = query0 + ta + TQ * i;
        if (row >= T) { continue; }
        float* out_row = out + (b * T + row) * C + h * HS;
#pragma unroll
        for (int m = 0; m < HS / 32; m++) {
            float4 y = make_float4(o[i][4 * m], o[i][4 * m + 1], o[i][4 * m + 2], o[i][4 * m + 3]);
            *(float4*)(out_row + 4 * (tb + 8 * m)) = y * row_scale[i];
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Backward (see "Backward" above for P, dP and dS): the dQ kernel per block of queries over the
// key tiles up to the diagonal, also writing delta; the dK/dV kernel per block of keys over the
// query tiles from the diagonal to T.

template <AttentionKind KIND, int HS, bool SMALL = false>
__global__ void __launch_bounds__(fp32_dq_tiling(HS, SMALL).threads, fp32_dq_tiling(HS, SMALL).min_blocks)
    flash_fp32_dq_kernel(float* dqkv_t, float* bias_partials, float* delta, const float* dout, const float* qkv,
                         const float* out, const float* lse, int T, int NH) {
    constexpr Fp32Tiling TILING = fp32_dq_tiling(HS, SMALL);
    constexpr int THREADS = TILING.threads, RQ = TILING.ra, RK = TILING.rb, TQ = THREADS / 8;
    constexpr int QUERIES = TILING.rows(), KEYS = TILING.tile(), DIMS = HS / 8;
    static_assert(fp32_dq_shared_floats(HS, SMALL) <= FP32_SHARED_LIMIT, "48 KB of shared memory");
    static_assert(HS * (QUERIES + 1) <= fp32_dq_shared_floats(HS, SMALL), "the output stage fits");
    extern __shared__ float smem[];
    constexpr int ROW = HS + FP32_PAD;         // floats per row of a row tile
    float* q_tile = smem;                      // QUERIES x HS
    float* do_tile = q_tile + QUERIES * ROW;   // QUERIES x HS
    float* k_tile = do_tile + QUERIES * ROW;   // KEYS x HS
    float* v_tile = k_tile + KEYS * ROW;       // KEYS x HS, until dP is done
    float* ds_tile = v_tile;                   // then dS^T: KEYS x QUERIES
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int ta = threadIdx.x / 8, tb = threadIdx.x % 8;
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    int query0 = (gridDim.y - 1 - blockIdx.y) * QUERIES;  // the heaviest query blocks start first
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    const float* out_head = out + b * T * C + h * HS;
    int num_tiles = ceil_div(min(query0 + QUERIES, T), KEYS);
    float scale = rsqrtf((float)HS), exp_scale = scale * LOG2E;

    fp32_load_rows<QUERIES, HS, THREADS>(q_tile, q_head, row_stride, query0, T);
    fp32_load_rows<QUERIES, HS, THREADS>(do_tile, do_head, C, query0, T);
    fp32_load_rows<KEYS, HS, THREADS>(k_tile, q_head + C, row_stride, 0, T);
    fp32_load_rows<KEYS, HS, THREADS>(v_tile, q_head + 2 * C, row_stride, 0, T);
    // The statistics of the thread's rows for probability_and_gradient (query_statistic; query_delta
    // over a row's 8 threads, written for the dK/dV kernel).
    float stat_a[RQ], stat_b[RQ];
#pragma unroll
    for (int i = 0; i < RQ; i++) {
        int row = query0 + ta + TQ * i;
        stat_a[i] = query_statistic<KIND, false>(lse + head_rows, row, T);
        stat_b[i] = 0.0f;
        if (KIND == ATTENTION_SOFTMAX) {
            size_t at = (size_t)row * C;
            stat_b[i] = query_delta<HS, 8>(do_head + at, out_head + at, row < T, tb, warp);
            if (tb == 0 && row < T) { delta[head_rows + row] = stat_b[i]; }
        }
    }
    block.sync();
    float dq[RQ][DIMS] = {};

    for (int tile = 0; tile < num_tiles; tile++) {
        int key0 = tile * KEYS;
        bool next = tile + 1 < num_tiles;
        float s[RQ][RK], dp[RQ][RK];
        fp32_scores<RQ, RK, TQ, HS>(s, q_tile, k_tile, ta, tb);
        if (key0 + KEYS - 1 > query0) {
            float masked = KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f;
            fp32_mask_causal<RQ, RK, TQ, false>(s, query0 + ta, key0 + tb, masked);
        }
        fp32_scores<RQ, RK, TQ, HS>(dp, do_tile, v_tile, ta, tb);
#pragma unroll
        for (int i = 0; i < RQ; i++) {
#pragma unroll
            for (int j = 0; j < RK; j++) {
                probability_and_gradient<KIND, false>(s[i][j], dp[i][j], scale, exp_scale, stat_a[i], stat_b[i]);
            }
        }
        block.sync();  // every thread is done with V
        fp32_store_transposed<RQ, RK, QUERIES>(ds_tile, dp, ta, tb);
        block.sync();  // dS is in
        Fp32Rows<KEYS, HS, THREADS> k_next, v_next;
        if (next) { fp32_fetch_keys(k_next, v_next, q_head, C, row_stride, key0 + KEYS, T); }
        fp32_accumulate<RQ, HS, KEYS, QUERIES>(dq, ds_tile, k_tile, ta, tb);
        block.sync();  // every thread is done with K and dS
        if (next) {
            fp32_store_rows(k_tile, k_next);
            fp32_store_rows(v_tile, v_next);
            block.sync();
        }
    }
    size_t tokens = gridDim.x / NH * (size_t)T;
    size_t parts = ceil_div(T, FP32_PARTIAL_ROWS);
    float* partials = bias_partials + (b * parts + query0 / FP32_PARTIAL_ROWS) * row_stride + h * HS;
    fp32_store_columns<RQ, HS, THREADS>(dqkv_t + (size_t)h * HS * tokens + b * T, tokens, dq, scale, query0, T,
                                        partials, row_stride, smem, ta, tb);
}

// One query tile's statistics (dK/dV), per query: query_statistic, then delta (softmax; 0 for ReLU
// and past T). Thread tid < 2 QUERIES fetches one.
template <AttentionKind KIND, int QUERIES>
__device__ __forceinline__ float fp32_fetch_statistic(const float* lse_head, const float* delta_head, int query0,
                                                      int T) {
    int t = query0 + threadIdx.x % QUERIES;
    bool is_lse = threadIdx.x < QUERIES;
    if (threadIdx.x >= 2 * QUERIES) { return 0.0f; }
    if (is_lse) { return query_statistic<KIND, false>(lse_head, t, T); }
    return KIND == ATTENTION_SOFTMAX && t < T ? delta_head[t] : 0.0f;
}

template <AttentionKind KIND, int HS, bool SMALL = false>
__global__ void __launch_bounds__(fp32_dkdv_tiling(HS, SMALL).threads, fp32_dkdv_tiling(HS, SMALL).min_blocks)
    flash_fp32_dkdv_kernel(float* dqkv_t, float* bias_partials, const float* dout, const float* qkv, const float* lse,
                           const float* delta, int T, int NH) {
    constexpr Fp32Tiling TILING = fp32_dkdv_tiling(HS, SMALL);
    constexpr int THREADS = TILING.threads, RK = TILING.ra, RQ = TILING.rb, TK = THREADS / 8;
    constexpr int KEYS = TILING.rows(), QUERIES = TILING.tile(), DIMS = HS / 8;
    static_assert(fp32_dkdv_shared_floats(HS, SMALL) <= FP32_SHARED_LIMIT, "48 KB of shared memory");
    static_assert(HS * (KEYS + 1) <= fp32_dkdv_shared_floats(HS, SMALL) && 2 * QUERIES <= THREADS, "the stage fits");
    extern __shared__ float smem[];
    constexpr int ROW = HS + FP32_PAD;                      // floats per row of a row tile
    float* k_tile = smem;                                   // KEYS x HS
    float* v_tile = k_tile + KEYS * ROW;                    // KEYS x HS
    float* q_tile = v_tile + KEYS * ROW;                    // QUERIES x HS
    float* do_tile = q_tile + QUERIES * ROW;                // QUERIES x HS
    float* p_tile = do_tile + QUERIES * ROW;                // P: QUERIES x KEYS
    float* ds_tile = p_tile + QUERIES * (KEYS + FP32_PAD);  // dS: QUERIES x KEYS
    float* stats = ds_tile + QUERIES * (KEYS + FP32_PAD);   // 2 x QUERIES: fp32_fetch_statistic's
    cg::thread_block block = cg::this_thread_block();
    int ta = threadIdx.x / 8, tb = threadIdx.x % 8;
    int C = NH * HS, h = blockIdx.x % NH;
    size_t b = blockIdx.x / NH, row_stride = 3 * (size_t)C, head_rows = (b * NH + h) * T;
    int key0 = blockIdx.y * KEYS;  // the heaviest (earliest) key blocks start first
    const float* q_head = qkv + b * T * row_stride + h * HS;
    const float* do_head = dout + b * T * C + h * HS;
    int first_tile = key0 / QUERIES, num_tiles = ceil_div(T, QUERIES);
    float scale = rsqrtf((float)HS), exp_scale = scale * LOG2E;

    fp32_load_rows<KEYS, HS, THREADS>(k_tile, q_head + C, row_stride, key0, T);
    fp32_load_rows<KEYS, HS, THREADS>(v_tile, q_head + 2 * C, row_stride, key0, T);
    fp32_load_rows<QUERIES, HS, THREADS>(q_tile, q_head, row_stride, first_tile * QUERIES, T);
    fp32_load_rows<QUERIES, HS, THREADS>(do_tile, do_head, C, first_tile * QUERIES, T);
    float stat = fp32_fetch_statistic<KIND, QUERIES>(lse + head_rows, delta + head_rows, first_tile * QUERIES, T);
    if (threadIdx.x < 2 * QUERIES) { stats[threadIdx.x] = stat; }
    block.sync();
    float dk[RK][DIMS] = {}, dv[RK][DIMS] = {};

    for (int tile = first_tile; tile < num_tiles; tile++) {
        int query0 = tile * QUERIES;
        bool next = tile + 1 < num_tiles;
        float s[RK][RQ], dp[RK][RQ];  // S^T and dP^T: rows are keys, columns queries
        fp32_scores<RK, RQ, TK, HS>(s, k_tile, q_tile, ta, tb);
        if (query0 < key0 + KEYS - 1) {
            fp32_mask_causal<RK, RQ, TK, true>(s, key0 + ta, query0 + tb, KIND == ATTENTION_SOFTMAX ? -INFINITY : 0.0f);
        }
        fp32_scores<RK, RQ, TK, HS>(dp, v_tile, do_tile, ta, tb);
#pragma unroll
        for (int j = 0; j < RQ; j++) {
            float stat_a = stats[tb + 8 * j], stat_b = stats[QUERIES + tb + 8 * j];
#pragma unroll
            for (int i = 0; i < RK; i++) {
                probability_and_gradient<KIND, false>(s[i][j], dp[i][j], scale, exp_scale, stat_a, stat_b);
            }
        }
        fp32_store_transposed<RK, RQ, KEYS>(p_tile, s, ta, tb);
        fp32_store_transposed<RK, RQ, KEYS>(ds_tile, dp, ta, tb);
        block.sync();  // P and dS are in
        Fp32Rows<QUERIES, HS, THREADS> q_next, do_next;
        float stat_next = 0.0f;
        if (next) {
            fp32_fetch_rows(q_next, q_head, row_stride, query0 + QUERIES, T);
            fp32_fetch_rows(do_next, do_head, C, query0 + QUERIES, T);
            stat_next = fp32_fetch_statistic<KIND, QUERIES>(lse + head_rows, delta + head_rows, query0 + QUERIES, T);
        }
        fp32_accumulate<RK, HS, QUERIES, KEYS>(dv, p_tile, do_tile, ta, tb);
        fp32_accumulate<RK, HS, QUERIES, KEYS>(dk, ds_tile, q_tile, ta, tb);
        block.sync();  // every thread is done with the tile, P, dS and the statistics
        if (next) {
            fp32_store_rows(q_tile, q_next);
            fp32_store_rows(do_tile, do_next);
            if (threadIdx.x < 2 * QUERIES) { stats[threadIdx.x] = stat_next; }
            block.sync();
        }
    }
    size_t tokens = gridDim.x / NH * (size_t)T;
    size_t parts = ceil_div(T, FP32_PARTIAL_ROWS);
    float* dk_t = dqkv_t + (size_t)(C + h * HS) * tokens + b * T;
    float* partials = bias_partials + (b * parts + key0 / FP32_PARTIAL_ROWS) * row_stride + C + h * HS;
    fp32_store_columns<RK, HS, THREADS>(dk_t, tokens, dk, scale, key0, T, partials, row_stride, smem, ta, tb);
    fp32_store_columns<RK, HS, THREADS>(dk_t + (size_t)C * tokens, tokens, dv, 1.0f, key0, T, partials + C, row_stride,
                                        smem, ta, tb);
}

// Launchers of the FP32-core kernels, which the section's launchers call (FlashForward, FlashBackward):
// at most 48 KB of dynamic shared memory a block, so no attribute to set. The backward's SMALL: its
// plans for 64 KB multiprocessors, which it takes on such GPUs (g_small_sm).

struct FlashFp32Forward {
    float* out;
    float* lse;
    const float* qkv;
    int B, T, NH;
    template <AttentionKind KIND, int HS>
    void run() const {
        constexpr Fp32Tiling TILING = fp32_forward_tiling(HS);
        dim3 grid(B * NH, ceil_div(T, TILING.rows()));
        size_t shared = fp32_forward_shared_floats(HS) * sizeof(float);
        flash_fp32_forward_kernel<KIND, HS><<<grid, TILING.threads, shared>>>(out, lse, qkv, T, NH);
        cudaCheck(cudaGetLastError());
    }
};

template <bool SMALL = false>
struct FlashFp32Backward {
    float *dqkv_t, *bias_partials;
    float* delta;
    const float *dout, *qkv, *out, *lse;
    int B, T, NH;
    // The dQ kernel (which also writes delta), then the dK/dV kernel that reads it.
    template <AttentionKind KIND, int HS>
    void run() const {
        constexpr Fp32Tiling DQ = fp32_dq_tiling(HS, SMALL), DKDV = fp32_dkdv_tiling(HS, SMALL);
        size_t dq_shared = fp32_dq_shared_floats(HS, SMALL) * sizeof(float);
        flash_fp32_dq_kernel<KIND, HS, SMALL><<<dim3(B * NH, ceil_div(T, DQ.rows())), DQ.threads, dq_shared>>>(
            dqkv_t, bias_partials, delta, dout, qkv, out, lse, T, NH);
        cudaCheck(cudaGetLastError());
        size_t dkdv_shared = fp32_dkdv_shared_floats(HS, SMALL) * sizeof(float);
        flash_fp32_dkdv_kernel<KIND, HS, SMALL><<<dim3(B * NH, ceil_div(T, DKDV.rows())), DKDV.threads, dkdv_shared>>>(
            dqkv_t, bias_partials, dout, qkv, lse, delta, T, NH);
        cudaCheck(cudaGetLastError());
    }
};

// ----------------------------------------------------------------------------------------------
// Host launchers: the runtime head size, kind and accuracy pick a kernel instantiation.

template <int HS, typename Launch>
static void flash_dispatch_hs(const Launch& launch, AttentionKind kind, bool fp32_accurate) {
    if (kind == ATTENTION_SOFTMAX) {
        if (fp32_accurate) { launch.template run<ATTENTION_SOFTMAX, HS, true>(); }
        else { launch.template run<ATTENTION_SOFTMAX, HS, false>(); }
    } else {
        if (fp32_accurate) { launch.template run<ATTENTION_RELU, HS, true>(); }
        else { launch.template run<ATTENTION_RELU, HS, false>(); }
    }
}

template <typename Launch>
static void flash_dispatch(const Launch& launch, int hs, AttentionKind kind, bool fp32_accurate, const char* what) {
    if (hs == 32) { flash_dispatch_hs<32>(launch, kind, fp32_accurate); }
    else if (hs == 64) { flash_dispatch_hs<64>(launch, kind, fp32_accurate); }
    else if (hs == 128) { flash_dispatch_hs<128>(launch, kind, fp32_accurate); }
    else { fail("%s: head size %d is not supported (32, 64 or 128)", what, hs); }
}

// Raises a kernel's dynamic shared-memory limit the first time it is launched.
template <typename Kernel>
static void flash_set_shared(Kernel kernel, size_t shared, bool* done) {
    if (*done) { return; }
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    *done = true;
}

// The kernels this device runs for head size hs (split: the FP32-accurate products): the mma.sync
// family where the running code has TF32 tensor cores (g_tf32_cores) and its tiles fit a block's
// shared memory (g_shared_limit), with the dQ and dK/dV tiles shrunk to FLASH_SMALL_TILE where only
// those fit (hs = 128 on GPUs of 99 KB a block), and the forward on wgmma where Hopper's sm_90a code
// runs (TF32 mode) and its tiles fit; otherwise the FP32-core kernels (FlashFp32Forward, FlashFp32Backward,
// the latter with the plans for 64 KB multiprocessors on those).
struct FlashPlan {
    bool tensor_cores, wgmma;
    int dq_keys, dkdv_queries;
    bool fp32_small_sm;  // the FP32-core backward with the plans for 64 KB multiprocessors
};

// The least shared memory a block has as the plans see it (g_shared_limit), in KB: every GPU gives
// 48 or more, and GPT2_TEST_SHARED_KB may cap it no lower than the FP32-core kernels take at any head
// size (they read no limit, so a lower cap would not hold): 44 (43.25, dK/dV at hs 64).
constexpr int fp32_most_shared_floats() {
    int most = 0;
    for (int hs : MODEL_HEAD_SIZES) {
        most = std::max({most, fp32_forward_shared_floats(hs), fp32_dq_shared_floats(hs), fp32_dkdv_shared_floats(hs)});
    }
    return most;
}
constexpr int SHARED_LIMIT_LEAST_KB = (fp32_most_shared_floats() * (int)sizeof(float) + 1023) / 1024;

// Whether a tile of FLASH_SMALL_TILE rows (small bytes, against preferred's) is ever chosen at head
// size hs: at some limit from SHARED_LIMIT_LEAST_KB up the forward's tiles and the small one fit and
// the preferred one does not. Only those are instantiated (hs 128's dQ and dK/dV, hs 64's dK/dV in TF32).
constexpr bool flash_small_tile_chosen(int hs, size_t preferred, size_t small) {
    return std::max({(size_t)SHARED_LIMIT_LEAST_KB * 1024, flash_forward_shared(hs), small}) < preferred;
}
constexpr bool flash_small_dq_chosen(int hs) {
    return flash_small_tile_chosen(hs, flash_dq_shared(hs, FLASH_DQ_KEYS), flash_dq_shared(hs, FLASH_SMALL_TILE));
}
constexpr bool flash_small_dkdv_chosen(int hs, bool split) {
    return flash_small_tile_chosen(hs, flash_dkdv_shared(hs, flash_dkdv_queries(hs, split)),
                                   flash_dkdv_shared(hs, FLASH_SMALL_TILE));
}

// Decided at each launch, not cached: a few comparisons beside a launch's microseconds, met only
// at eager launches (a step replays from its CUDA graph after the first), and the lab changes
// g_tf32_cores between its variants.
static FlashPlan flash_plan(int hs, bool split) {
    auto fits = [](size_t bytes) { return bytes <= g_shared_limit; };
    auto tile = [&](int preferred, bool small_chosen, size_t (*bytes)(int, int)) {
        if (fits(bytes(hs, preferred))) { return preferred; }
        return small_chosen && fits(bytes(hs, FLASH_SMALL_TILE)) ? FLASH_SMALL_TILE : 0;
    };
    FlashPlan plan = {};
    plan.dq_keys = tile(FLASH_DQ_KEYS, flash_small_dq_chosen(hs),
                        [](int h, int keys) { return flash_dq_shared(h, keys); });
    plan.dkdv_queries = tile(flash_dkdv_queries(hs, split), flash_small_dkdv_chosen(hs, split),
                             [](int h, int queries) { return flash_dkdv_shared(h, queries); });
    plan.tensor_cores = g_tf32_cores && fits(flash_forward_shared(hs)) && plan.dq_keys > 0 && plan.dkdv_queries > 0;
    plan.wgmma = plan.tensor_cores && g_wgmma && !split && fits(flash_wgmma_shared(hs));
    plan.fp32_small_sm = !plan.tensor_cores && g_small_sm;
    return plan;
}

// The plan in words, for the configuration table.
static std::string flash_path_name(int hs, bool split) {
    FlashPlan plan = flash_plan(hs, split);
    char name[128];
    if (!plan.tensor_cores) {
        snprintf(name, sizeof(name), "FP32 cores (hs %d, %zu KB shared a block%s)", hs, g_shared_limit / 1024,
                 plan.fp32_small_sm ? ", the backward planned for 64 KB multiprocessors" : "");
    } else {
        snprintf(name, sizeof(name), "%s forward, mma.sync backward (dQ %d keys, dK/dV %d queries a tile)",
                 plan.wgmma ? "wgmma" : "mma.sync", plan.dq_keys, plan.dkdv_queries);
    }
    return name;
}

struct FlashForward {
    float* out;
    float* lse;
    const float* qkv;
    int B, T, NH;
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        FlashPlan plan = flash_plan(HS, SPLIT);
        if (!plan.tensor_cores) {
            FlashFp32Forward launch = {.out = out, .lse = lse, .qkv = qkv, .B = B, .T = T, .NH = NH};
            launch.run<KIND, HS>();
        } else if (plan.wgmma) {
            if constexpr (!SPLIT) {
                static bool configured = false;
                flash_set_shared(flash_forward_wgmma_kernel<KIND, HS>, flash_wgmma_shared(HS), &configured);
                dim3 grid(B * NH, ceil_div(T, wgmma_cta_queries(HS)));
                flash_forward_wgmma_kernel<KIND, HS>
                    <<<grid, wgmma_threads(HS), flash_wgmma_shared(HS)>>>(out, lse, qkv, T, NH);
            }
        } else {
            static bool configured = false;
            flash_set_shared(flash_forward_kernel<KIND, HS, SPLIT>, flash_forward_shared(HS), &configured);
            dim3 grid(B * NH, ceil_div(T, FLASH_ROWS));
            flash_forward_kernel<KIND, HS, SPLIT><<<grid, FLASH_THREADS, flash_forward_shared(HS)>>>(out, lse, qkv, T, NH);
        }
        cudaCheck(cudaGetLastError());
    }
};

struct FlashBackward {
    float *dqkv_t, *dbias, *bias_partials;
    float* delta;
    const float *dout, *qkv, *out, *lse;
    int B, T, NH;
    // The dQ kernel (which also writes delta), then the dK/dV kernel that reads it, then the bias
    // gradient from their partial sums (sum_bias).
    void sum_bias(int hs, int rows_per_part) const {
        column_sums(dbias, bias_partials, B * ceil_div(T, rows_per_part), 3 * NH * hs);
    }
    template <AttentionKind KIND, int HS, bool SMALL_SM>
    void run_fp32() const {
        FlashFp32Backward<SMALL_SM> launch = {.dqkv_t = dqkv_t, .bias_partials = bias_partials, .delta = delta,
                                              .dout = dout, .qkv = qkv, .out = out, .lse = lse, .B = B, .T = T, .NH = NH};
        launch.template run<KIND, HS>();
    }
    template <AttentionKind KIND, int HS, bool SPLIT, int KEYS>
    void run_dq() const {
        static bool configured = false;
        flash_set_shared(flash_backward_dq_kernel<KIND, HS, SPLIT, KEYS>, flash_dq_shared(HS, KEYS), &configured);
        dim3 grid(B * NH, ceil_div(T, FLASH_ROWS));
        flash_backward_dq_kernel<KIND, HS, SPLIT, KEYS><<<grid, FLASH_THREADS, flash_dq_shared(HS, KEYS)>>>(
            dqkv_t, bias_partials, delta, dout, qkv, out, lse, T, NH);
        cudaCheck(cudaGetLastError());
    }
    template <AttentionKind KIND, int HS, bool SPLIT, int QUERIES>
    void run_dkdv() const {
        static bool configured = false;
        size_t shared = flash_dkdv_shared(HS, QUERIES);
        flash_set_shared(flash_backward_dkdv_kernel<KIND, HS, SPLIT, QUERIES>, shared, &configured);
        dim3 grid(B * NH, ceil_div(T, FLASH_ROWS));
        flash_backward_dkdv_kernel<KIND, HS, SPLIT, QUERIES><<<grid, FLASH_THREADS, shared>>>(dqkv_t, bias_partials,
                                                                                          dout, qkv, lse, delta, T, NH);
        cudaCheck(cudaGetLastError());
    }
    template <AttentionKind KIND, int HS, bool SPLIT>
    void run() const {
        FlashPlan plan = flash_plan(HS, SPLIT);
        if (!plan.tensor_cores) {
            if (plan.fp32_small_sm) { run_fp32<KIND, HS, true>(); }
            else { run_fp32<KIND, HS, false>(); }
            sum_bias(HS, FP32_PARTIAL_ROWS);
            return;
        }
        if (plan.dq_keys == FLASH_DQ_KEYS) { run_dq<KIND, HS, SPLIT, FLASH_DQ_KEYS>(); }
        else if constexpr (flash_small_dq_chosen(HS)) { run_dq<KIND, HS, SPLIT, FLASH_SMALL_TILE>(); }
        constexpr int QUERIES = flash_dkdv_queries(HS, SPLIT);
        if (plan.dkdv_queries == QUERIES) { run_dkdv<KIND, HS, SPLIT, QUERIES>(); }
        else if constexpr (flash_small_dkdv_chosen(HS, SPLIT)) { run_dkdv<KIND, HS, SPLIT, FLASH_SMALL_TILE>(); }
        sum_bias(HS, FLASH_ROWS);
    }
};

// out (B, T, C) and, for softmax, lse (B, NH, T) from qkv (B, T, 3C).
static void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int hs,
                                    AttentionKind kind, bool fp32_accurate) {
    FlashForward launch = {.out = out, .lse = lse, .qkv = qkv, .B = B, .T = T, .NH = NH};
    flash_dispatch(launch, hs, kind, fp32_accurate, "flash_attention_forward");
}

// dqkv_t (3C, B*T), the gradient of qkv transposed, and dbias (3C) = its sum over the
// B*T tokens, from dout (B, T, C) and the forward's qkv, out and lse. Scratch: delta (B, NH, T)
// (softmax) and partials, the sums' shares of each block of FLASH_ROWS tokens of a sequence
// (FP32_PARTIAL_ROWS on the FP32 cores): at most B * ceil(T / 16) rows of 3C floats, within 4 B*T*C.
static void flash_attention_backward(float* dqkv_t, float* dbias, float* partials, float* delta, const float* dout,
                                     const float* qkv, const float* out, const float* lse, int B, int T, int NH,
                                     int hs, AttentionKind kind, bool fp32_accurate) {
    FlashBackward launch = {.dqkv_t = dqkv_t, .dbias = dbias, .bias_partials = partials, .delta = delta,
                            .dout = dout, .qkv = qkv, .out = out, .lse = lse, .B = B, .T = T, .NH = NH};
    flash_dispatch(launch, hs, kind, fp32_accurate, "flash_attention_backward");
}

// ----------------------------------------------------------------------------------------------
// Attention over a KV cache (generation): each completion's one new query attends over the cached
// keys and values of positions 0..pos, both kinds (ReLU keeps the 1/(pos+1) of the position).
//
// Layouts: kv (M, maxT, 2C) for one layer: position t's key at t*2C + h*hs, its value C further;
//   qkv (M, 3C) the new token's q, k and v; out (M, C).
// Block (m*NH + h, chunk) appends the new key and value to the cache (the last chunk's block),
// scores its chunk of DECODE_CHUNK positions, and leaves (max, sum, unnormalised out) in partials;
// the last of (m, h)'s blocks to finish combines the chunks in chunk order (arrive_last_in_group),
// so the result does not depend on which block finishes when. The grid covers maxT; blocks past
// pos return at once, so one captured launch serves every position.

constexpr int DECODE_CHUNK = 32;     // positions per block: many blocks, so that many keys load at once
constexpr int DECODE_THREADS = 128;  // hs divides it: 128 / hs groups of positions for the values

template <int HS>  // the head size, 32, 64 or 128: the loops over it unroll, every load in flight at once
__global__ void __launch_bounds__(DECODE_THREADS) attention_decode_kernel(
    float* out, float* partials, unsigned int* counters, float* kv, const float* qkv, const int* position, int maxT,
    int NH, AttentionKind kind) {
    constexpr int hs = HS, groups = DECODE_THREADS / hs;
    __shared__ __align__(16) float q[hs], k_new[hs];
    __shared__ float v_new[hs], p[DECODE_CHUNK], sums[DECODE_THREADS];
    cg::thread_block block = cg::this_thread_block();
    pdl_wait();
    int pos = *position, chunks = pos / DECODE_CHUNK + 1, chunk = blockIdx.y;
    if (chunk >= chunks) { return; }
    int C = NH * hs, h = blockIdx.x % NH, tid = block.thread_rank(), group = tid / hs, d = tid % hs;
    size_t m = blockIdx.x / NH, row_stride = 2 * (size_t)C;
    const float* new_qkv = qkv + m * 3 * C + h * hs;
    float* head_kv = kv + m * maxT * row_stride + h * hs;
    int first = chunk * DECODE_CHUNK, count = min(DECODE_CHUNK, pos + 1 - first);
    // One trip to memory: the new q, k, v and the cached keys and values this thread reads (thread
    // i < count scores position first + i; thread (group, d) sums dimension d over positions
    // first + group, + groups, ...). Position pos is not in the cache yet: its key and value come
    // from qkv (and are appended by the last chunk's block).
    float new_q = 0.0f, new_k = 0.0f, new_v = 0.0f;
    if (tid < hs) {
        new_q = new_qkv[tid];
        new_k = new_qkv[C + tid];
        new_v = new_qkv[2 * C + tid];
    }
    bool cached_key = tid < count && first + tid < pos;
    const float4* key_row = (const float4*)(head_kv + (first + tid) * row_stride);
    float4 key[hs / 4];
#pragma unroll
    for (int d4 = 0; d4 < hs / 4; d4++) { key[d4] = cached_key ? key_row[d4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    float value[DECODE_CHUNK / groups];
#pragma unroll
    for (int k = 0; k < DECODE_CHUNK / groups; k++) {
        int i = group + k * groups;
        value[k] = i < count && first + i < pos ? head_kv[(first + i) * row_stride + C + d] : 0.0f;
    }
    if (tid < hs) {
        q[tid] = new_q;
        k_new[tid] = new_k;
        v_new[tid] = new_v;
        if (chunk == chunks - 1) {
            head_kv[pos * row_stride + tid] = new_k;
            head_kv[pos * row_stride + C + tid] = new_v;
        }
    }
    block.sync();

    float score = -INFINITY;
    if (tid < count) {
        float dot = 0.0f;
#pragma unroll
        for (int d4 = 0; d4 < hs / 4; d4++) {
            float4 k4 = cached_key ? key[d4] : ((const float4*)k_new)[d4];
            dot += sum4(k4 * ((const float4*)q)[d4]);
        }
        score = dot * rsqrtf((float)hs);
    }
    float chunk_max = kind == ATTENTION_SOFTMAX ? block_reduce(score, cg::greater<float>(), -INFINITY) : 0.0f;
    float weight = tid >= count ? 0.0f : kind == ATTENTION_SOFTMAX ? expf(score - chunk_max) : fmaxf(score, 0.0f);
    float chunk_sum = block_sum(weight);
    if (tid < count) { p[tid] = weight; }
    block.sync();

    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < DECODE_CHUNK / groups; k++) {
        int i = group + k * groups;
        if (i < count) { acc = fmaf(p[i], first + i < pos ? value[k] : v_new[d], acc); }
    }
    sums[tid] = acc;
    block.sync();
    float* partial = partials + ((size_t)blockIdx.x * gridDim.y + chunk) * (hs + 2);  // max, sum, out[hs]
    if (tid < hs) {
        float o = 0.0f;
        for (int g = 0; g < groups; g++) { o += sums[g * hs + tid]; }
        partial[2 + tid] = o;
    }
    if (tid == 0) {
        partial[0] = chunk_max;
        partial[1] = chunk_sum;
    }
    if (!arrive_last_in_group(&counters[blockIdx.x], chunks) || tid >= hs) { return; }

    // the chunks in order, in one pass: the softmax's running maximum rescales what came before
    const float* head_partials = partials + (size_t)blockIdx.x * gridDim.y * (hs + 2);
    float running_max = -INFINITY, numerator = 0.0f, denominator = 0.0f;
    for (int c = 0; c < chunks; c++) {
        const float* part = head_partials + c * (hs + 2);
        float part_max = __ldcg(&part[0]), part_sum = __ldcg(&part[1]), part_out = __ldcg(&part[2 + tid]);
        float new_max = fmaxf(running_max, part_max);
        float rescale = kind == ATTENTION_SOFTMAX ? expf(running_max - new_max) : 1.0f;
        float w = kind == ATTENTION_SOFTMAX ? expf(part_max - new_max) : 1.0f;
        numerator = fmaf(w, part_out, numerator * rescale);
        denominator = fmaf(w, part_sum, denominator * rescale);
        running_max = new_max;
    }
    if (kind == ATTENTION_RELU) { denominator = (float)(pos + 1); }
    out[m * C + h * hs + tid] = numerator / denominator;
}

// Launched over maxT's chunks (partials: M * NH * ceil(maxT / DECODE_CHUNK) * (hs + 2) floats,
// counters: M * NH, zero before the first launch).
static void attention_decode(float* out, float* partials, unsigned int* counters, float* kv, const float* qkv,
                             const int* position, int M, int maxT, int NH, int hs, AttentionKind kind) {
    dim3 grid(M * NH, ceil_div(maxT, DECODE_CHUNK));
    auto launch = [&](auto kernel) {
        launch_pdl(kernel, grid, DECODE_THREADS, out, partials, counters, kv, qkv, position, maxT, NH, kind);
    };
    switch (hs) {
        case 32: launch(attention_decode_kernel<32>); break;
        case 64: launch(attention_decode_kernel<64>); break;
        case 128: launch(attention_decode_kernel<128>); break;
        default: fail("attention_decode: head size %d is not supported (32, 64 or 128)", hs);
    }
}

// The prompt's keys and values into every completion's cache: kv (L, M, maxT, 2C) positions
// 0..T-1 from the prefill's qkv (L, 1, T, 3C).
__global__ void kv_cache_fill_kernel(float4* kv, const float4* qkv, int M, size_t rows, int T, int maxT, int C4) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * 2 * C4) { return; }
    size_t row = idx / (2 * C4), lm = row / T, l = lm / M;  // row: (l, m, t); lm = l * M + m
    int c = (int)(idx % (2 * C4)), t = (int)(row % T);
    kv[(lm * maxT + t) * 2 * C4 + c] = qkv[(l * T + t) * 3 * C4 + C4 + c];
}

static void kv_cache_fill(float* kv, const float* qkv, int L, int M, int T, int maxT, int C) {
    size_t rows = (size_t)L * M * T, n = rows * 2 * (C / 4);
    kv_cache_fill_kernel<<<ceil_div(n, 256), 256>>>((float4*)kv, (const float4*)qkv, M, rows, T, maxT, C / 4);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// Fused classifier: softmax, cross-entropy and the logit gradient over the logits, read twice

struct SoftmaxStats {
    float max;  // running maximum
    float sum;  // sum of exp(x - max)
};

__device__ SoftmaxStats softmax_stats_combine(SoftmaxStats a, SoftmaxStats b) {
    float m = fmaxf(a.max, b.max);
    return SoftmaxStats{m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// On the logits of R rows transposed, logits_t (Vp, R), of which V entries are real: row r is
// column r. Block (x, y) takes 128 rows, a lane rows lane + 32k (k < 4), so that a warp reads one
// vocabulary entry of 128 rows, 512 contiguous bytes; and slice y of the vocabulary, its warps
// striding over the slice. Two kernels: the first writes each slice's running max and sum per
// row (and the target's logit, read by the slice holding it); the second combines a row's slices
// in order, writes the loss and, in place, dlogits = (softmax - onehot(target)) * dloss, 0 in
// the padded entries. scratch: (CLASSIFIER_MAX_SLICES * 2 + 1) * R floats.
constexpr int CLASSIFIER_BLOCK = 256;
constexpr int CLASSIFIER_MAX_SLICES = 16;
constexpr int CLASSIFIER_ROWS_PER_LANE = 4;
constexpr int CLASSIFIER_ROWS = 32 * CLASSIFIER_ROWS_PER_LANE;  // rows per block

__device__ inline int classifier_slice_size(int Vp) { return ceil_div(Vp, gridDim.y); }

// x[u][k] = the logit of vocabulary entry first + u * stride for the lane's row k (row0 + 32k), or
// fill where the entry is at or past end or the row at or past R.
template <int UNROLL>
__device__ inline void classifier_load(float (*x)[CLASSIFIER_ROWS_PER_LANE], const float* logits_t, int first,
                                       int stride, int end, int row0, int R, float fill) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int v = first + u * stride;
#pragma unroll
        for (int k = 0; k < CLASSIFIER_ROWS_PER_LANE; k++) {
            int row = row0 + 32 * k;
            x[u][k] = v < end && row < R ? logits_t[(size_t)v * R + row] : fill;
        }
    }
}

__global__ void __launch_bounds__(CLASSIFIER_BLOCK) classifier_stats_kernel(SoftmaxStats* slice_stats,
                                                                            float* target_logits,
                                                                            const float* logits_t, const int* targets,
                                                                            int R, int V, int Vp) {
    const int K = CLASSIFIER_ROWS_PER_LANE;
    __shared__ SoftmaxStats warp_stats[CLASSIFIER_BLOCK / 32][CLASSIFIER_ROWS];  // [warp][row of the block]
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int w = warp.meta_group_rank(), warps = warp.meta_group_size(), first_row = blockIdx.x * CLASSIFIER_ROWS;
    int begin = blockIdx.y * classifier_slice_size(Vp), end = min(V, begin + classifier_slice_size(Vp));
    SoftmaxStats stats[K];
    for (int k = 0; k < K; k++) { stats[k] = SoftmaxStats{-FLT_MAX, 0.0f}; }
    // 4 vocabulary entries of the K rows in flight, then one rescale of each running sum and one exp2
    // per value (exp(d) = exp2(d log2(e)): no range reduction, which expf spends instructions on)
    const int UNROLL = 4;
    for (int first = begin + w; first < end; first += UNROLL * warps) {
        float x[UNROLL][K];
        classifier_load<UNROLL>(x, logits_t, first, warps, end, first_row + warp.thread_rank(), R, -FLT_MAX);
#pragma unroll
        for (int k = 0; k < K; k++) {
            float chunk_max = stats[k].max;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) { chunk_max = fmaxf(chunk_max, x[u][k]); }
            stats[k].sum *= exp2f((stats[k].max - chunk_max) * LOG2E);
            stats[k].max = chunk_max;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (first + u * warps < end) { stats[k].sum += exp2f((x[u][k] - chunk_max) * LOG2E); }
            }
        }
    }
    for (int k = 0; k < K; k++) {
        int i = warp.thread_rank() + 32 * k, row = first_row + i;
        warp_stats[w][i] = stats[k];
        if (w == 0 && row < R && targets[row] >= begin && targets[row] < end) {
            target_logits[row] = logits_t[(size_t)targets[row] * R + row];
        }
    }
    block.sync();
    for (int i = threadIdx.x; i < CLASSIFIER_ROWS; i += blockDim.x) {
        int row = first_row + i;
        if (row >= R) { continue; }
        SoftmaxStats total = warp_stats[0][i];
        for (int k = 1; k < warps; k++) { total = softmax_stats_combine(total, warp_stats[k][i]); }
        slice_stats[(size_t)blockIdx.y * R + row] = total;
    }
}

__global__ void __launch_bounds__(CLASSIFIER_BLOCK) classifier_write_kernel(float* logits_t, float* losses,
                                                                            const SoftmaxStats* slice_stats,
                                                                            const float* target_logits,
                                                                            const int* targets, float dloss, int R,
                                                                            int V, int Vp) {
    const int K = CLASSIFIER_ROWS_PER_LANE;
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int w = warp.meta_group_rank(), warps = warp.meta_group_size(), first_row = blockIdx.x * CLASSIFIER_ROWS;
    int begin = blockIdx.y * classifier_slice_size(Vp), end = min(Vp, begin + classifier_slice_size(Vp));
    // softmax = exp2(x log2(e) - max_log2) * dloss / sum: one fma, one exp2 and one product per entry
    float max_log2[K], scale[K];
    int target[K];
    for (int k = 0; k < K; k++) {
        int row = first_row + warp.thread_rank() + 32 * k;
        if (row >= R) { continue; }
        SoftmaxStats stats = slice_stats[row];
        for (unsigned int y = 1; y < gridDim.y; y++) {
            stats = softmax_stats_combine(stats, slice_stats[(size_t)y * R + row]);
        }
        max_log2[k] = stats.max * LOG2E;
        scale[k] = dloss / stats.sum;
        target[k] = targets[row];
        if (blockIdx.y == 0 && w == 0) { losses[row] = stats.max + logf(stats.sum) - target_logits[row]; }
    }
    // UNROLL entries of the K rows loaded before any is written (stores could alias later loads)
    const int UNROLL = 4;
    for (int first = begin + w; first < end; first += UNROLL * warps) {
        float x[UNROLL][K];
        classifier_load<UNROLL>(x, logits_t, first, warps, min(end, V), first_row + warp.thread_rank(), R, 0.0f);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int v = first + u * warps;
#pragma unroll
            for (int k = 0; k < K; k++) {
                int row = first_row + warp.thread_rank() + 32 * k;
                if (v >= end || row >= R) { continue; }
                float d = exp2f(fmaf(x[u][k], LOG2E, -max_log2[k])) * scale[k] - (v == target[k] ? dloss : 0.0f);
                logits_t[(size_t)v * R + row] = v < V ? d : 0.0f;
            }
        }
    }
}

static void fused_classifier(float* logits_t, float* losses, float* scratch, const int* targets, float dloss, int R,
                             int V, int Vp) {
    unsigned int row_groups = ceil_div(R, CLASSIFIER_ROWS);
    unsigned int slices = std::max(1u, std::min((unsigned int)CLASSIFIER_MAX_SLICES, ceil_div(4 * g_num_sms, row_groups)));
    SoftmaxStats* slice_stats = (SoftmaxStats*)scratch;
    float* target_logits = scratch + (size_t)2 * CLASSIFIER_MAX_SLICES * R;
    dim3 grid(row_groups, slices);
    classifier_stats_kernel<<<grid, CLASSIFIER_BLOCK>>>(slice_stats, target_logits, logits_t, targets, R, V, Vp);
    cudaCheck(cudaGetLastError());
    classifier_write_kernel<<<grid, CLASSIFIER_BLOCK>>>(logits_t, losses, slice_stats, target_logits, targets, dloss, R,
                                                       V, Vp);
    cudaCheck(cudaGetLastError());
}

// loss_sum[0] += weight * mean of losses[0..n), summed in a fixed order.
__global__ void accumulate_loss_kernel(float* loss_sum, const float* losses, int n, float weight) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { sum += losses[i]; }
    sum = block_sum(sum);
    if (threadIdx.x == 0) { loss_sum[0] += weight * (sum / n); }
}

// ----------------------------------------------------------------------------------------------
// Sampling: each completion's next token from its row of the LM head's logits, on the device so
// that a generation step needs no host round trip.
//
// x = logit / temperature over the V real tokens; top-k keeps the tokens with x at or above the
// k-th largest, top-p then the fewest largest whose probabilities sum to at least p (ties at either
// threshold are kept); the token is drawn from the kept softmax(x) by inverse CDF in token order,
// with a uniform keyed on (seed, completion, position). Temperature 0: the first largest logit.

struct SamplingParams {
    float temperature;  // 0: greedy
    int top_k;          // 0 or >= V: off
    float top_p;        // 1: off
    uint64_t seed;
};

constexpr int SAMPLE_THREADS = 1024;

// Order-preserving map of a float's bits to an unsigned integer.
__device__ inline unsigned int float_order(float x) {
    unsigned int bits = __float_as_uint(x);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// The largest key k with fn(k) true, where fn(key) = (a block-wide sum over tokens with order >= key)
// is non-increasing in key: a bitwise binary search from the top bit, fn(0) being true.
template <typename Fn>
__device__ unsigned int largest_key_where(Fn fn) {
    unsigned int key = 0;
    for (int bit = 31; bit >= 0; bit--) {
        unsigned int candidate = key | (1u << bit);
        if (fn(candidate)) { key = candidate; }
    }
    return key;
}

// logits (M, Vp): row m is completion m's. Writes the token to next_tokens[m] (the next step's
// input) and to tokens[m * maxT + pos + 1].
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(
    int* next_tokens, int* tokens, const float* logits, const SamplingParams* params, const int* position, int V,
    int Vp, int maxT) {
    __shared__ float inclusive[SAMPLE_THREADS];
    int m = blockIdx.x, tid = threadIdx.x, pos = *position;
    int per_thread = ceil_div(V, SAMPLE_THREADS), begin = min(tid * per_thread, V), end = min(begin + per_thread, V);
    SamplingParams sp = *params;
    const float* row = logits + (size_t)m * Vp;
    auto logit = [&](int v) { return row[v]; };

    float local_max = -INFINITY;  // the block-wide passes take strided tokens (coalesced); the CDF, contiguous ones
    for (int v = tid; v < V; v += SAMPLE_THREADS) { local_max = fmaxf(local_max, logit(v)); }
    float max_logit = block_reduce(local_max, cg::greater<float>(), -INFINITY);
    int token;
    if (sp.temperature == 0.0f) {
        float first = (float)V;  // token ids below 2^24 are exact as floats
        for (int v = tid; v < V && first == (float)V; v += SAMPLE_THREADS) {
            if (logit(v) == max_logit) { first = (float)v; }
        }
        token = (int)block_reduce(first, cg::less<float>(), (float)V);
    } else {
        float inv_t = 1.0f / sp.temperature;
        auto weight = [&](int v) { return expf((logit(v) - max_logit) * inv_t); };
        auto mass_from = [&](unsigned int key, bool count) {  // tokens at or above key: how many, or their weight
            float sum = 0.0f;
            for (int v = tid; v < V; v += SAMPLE_THREADS) {
                if (float_order(logit(v)) >= key) { sum += count ? 1.0f : weight(v); }
            }
            return block_sum(sum);
        };
        unsigned int kept_from = 0;
        if (sp.top_k > 0 && sp.top_k < V) {
            kept_from = largest_key_where([&](unsigned int key) { return mass_from(key, true) >= (float)sp.top_k; });
        }
        if (sp.top_p < 1.0f) {
            float target = sp.top_p * mass_from(kept_from, false);
            unsigned int key = largest_key_where([&](unsigned int key) {
                return mass_from(max(key, kept_from), false) >= target;
            });
            kept_from = max(kept_from, key);
        }
        // Inverse CDF: thread t's tokens cover [inclusive[t-1], inclusive[t]) of the kept mass.
        float local = 0.0f;
        for (int v = begin; v < end; v++) {
            if (float_order(logit(v)) >= kept_from) { local += weight(v); }
        }
        cg::thread_block block = cg::this_thread_block();
        inclusive[tid] = local;
        block.sync();
        for (int offset = 1; offset < SAMPLE_THREADS; offset *= 2) {  // Hillis-Steele scan
            float add = tid >= offset ? inclusive[tid - offset] : 0.0f;
            block.sync();
            inclusive[tid] += add;
            block.sync();
        }
        float total = inclusive[SAMPLE_THREADS - 1], below = tid > 0 ? inclusive[tid - 1] : 0.0f;
        uint64_t bits = splitmix64(sp.seed ^ splitmix64(((uint64_t)m << 32) | (uint32_t)pos));
        float u = (bits >> 40) / 16777216.0f;  // [0, 1)
        float target = fminf(u * total, nextafterf(total, 0.0f));
        int chosen = V;
        if (below <= target && target < inclusive[tid]) {
            float cumulative = below;
            int last_kept = V;
            for (int v = begin; v < end && chosen == V; v++) {
                if (float_order(logit(v)) < kept_from) { continue; }
                last_kept = v;
                cumulative += weight(v);
                if (cumulative > target) { chosen = v; }
            }
            if (chosen == V) { chosen = last_kept; }  // rounding never crossed the target
        }
        token = (int)block_reduce((float)chosen, cg::less<float>(), (float)V);
    }
    if (tid == 0) {
        next_tokens[m] = token;
        tokens[(size_t)m * maxT + pos + 1] = token;
    }
}

// The step's position advances once every kernel of the step has read it.
__global__ void advance_position_kernel(int* position) { *position += 1; }

// ----------------------------------------------------------------------------------------------
// AdamW over all parameters in one launch, as torch.optim.AdamW: p *= 1 - lr*wd (only for the
// tensors in decay_mask), then p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps).

struct TensorTable {
    size_t end[NUM_PARAMETER_TENSORS];  // end offset of each tensor in the flat parameter array
    unsigned int decay_mask;            // bit i: weight decay applies to tensor i
};

// AdamW's table of tensors of these sizes (PARAMETER_TENSORS' order and weight decay).
static TensorTable tensor_table(const size_t sizes[NUM_PARAMETER_TENSORS]) {
    TensorTable table = {};
    size_t end = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        table.end[i] = end += sizes[i];
        table.decay_mask |= (unsigned int)PARAMETER_TENSORS[i].decayed << i;
    }
    return table;
}

// A step's numbers, kept on the device so that no step waits for the host: the update reads
// its clipping factor, Adam's step count and whether to skip from here (grad_norm_finish_kernel
// decides), and the host reads them back a step later (gpt2_queue_stats).
enum SkipReason { SKIP_NONE = 0, SKIP_NONFINITE = 1, SKIP_SPIKE = 2 };

struct StepStats {
    float loss;        // the step's mean loss (all micro-steps, summed over the ranks)
    float grad_norm;   // global gradient norm, before clipping
    float grad_scale;  // clipping factor applied to the gradients
    float norm_z;      // the norm's z-score against the recent norms (0: no spike guard, or warming up)
    int32_t skipped;   // SkipReason: the update was skipped, nothing changed
    int32_t adam_step;  // updates applied so far: AdamW's t
    float bias_correction1, bias_correction2_sqrt;  // 1 - beta1^t, sqrt(1 - beta2^t)
    int32_t stop_requested;  // some rank had a stop signal (llmc/signals.h) when the step was queued
    OutlierWindow recent_norms;  // the spike guard's window (llmc/outlier.h)
};

// What the host reads back each step: everything before the window.
constexpr size_t STEP_STATS_REPORTED = offsetof(StepStats, recent_norms);

// The gradient is multiplied by stats->grad_scale, the clipping factor from grad_norm_finish_kernel;
// nothing changes when it skipped the step. Over n4 x 4 parameters from parameter 4*first4 on (a
// rank's slice; m and v hold the slice only). One thread per 4 parameters (every tensor's size is
// a multiple of 4, so they share a tensor).
__global__ void adamw_kernel(float4* params, float4* m_memory, float4* v_memory, const float4* grads, size_t n4,
                             size_t first4, TensorTable table, const StepStats* stats, float lr, float beta1,
                             float beta2, float eps, float weight_decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4 || stats->skipped != SKIP_NONE) { return; }
    float grad_scale = stats->grad_scale, bias_correction1 = stats->bias_correction1;
    float bias_correction2_sqrt = stats->bias_correction2_sqrt;
    int tensor = 0;
    while (4 * (first4 + i) >= table.end[tensor]) { tensor++; }
    float decay = (table.decay_mask >> tensor) & 1u ? weight_decay : 0.0f;
    float4 g4 = grads[i], m4 = m_memory[i], v4 = v_memory[i], p4 = params[i];
    float* g = &g4.x;
    float* m = &m4.x;
    float* v = &v4.x;
    float* p = &p4.x;
    for (int k = 0; k < 4; k++) {
        float grad = g[k] * grad_scale;
        m[k] = beta1 * m[k] + (1.0f - beta1) * grad;
        v[k] = beta2 * v[k] + (1.0f - beta2) * grad * grad;
        p[k] = p[k] * (1.0f - lr * decay);
        p[k] -= (lr / bias_correction1) * m[k] / (sqrtf(v[k]) / bias_correction2_sqrt + eps);
    }
    m_memory[i] = m4;
    v_memory[i] = v4;
    params[i] = p4;
}

// Global gradient norm and clipping, as torch.nn.utils.clip_grad_norm_, in two kernels so that
// the ranks of a data-parallel run can exchange their shares of the step in between (StepShares):
// block b of grad_norm_partials_kernel sums the squares of chunk first_chunk + b (ZERO_CHUNK
// floats) into the rank's share; grad_norm_finish_kernel combines the ranks' losses and stop
// requests, sums the partials in chunk order into ||g|| and decides the update (UpdateGuard):
// skipped if the loss or the norm is not finite, or if the norm is a spike (more than spike_z
// standard deviations above the recent norms' mean); else clipped by min(1, max_norm / (||g|| +
// 1e-6)) (1 if max_norm <= 0), and Adam's step count advances. The chunks do not depend on the
// number of ranks, so neither does the norm.
constexpr int GRAD_NORM_THREADS = 1024;

// The ranks' shares of a step lie one after the other, so that one all-gather hands every rank
// all of them: rank r's (floats() floats at r * floats()) holds the norm's partial sums of its
// chunks (ZeroShard's chunks_per_rank; the last rank's may end early), then r's loss and its stop
// request (1 if a signal asked it to stop).
struct StepShares {
    size_t num_chunks, chunks_per_rank;
    int world;
    __host__ __device__ size_t floats() const { return chunks_per_rank + 2; }
    __host__ __device__ size_t partial(size_t chunk) const {
        return chunk / chunks_per_rank * floats() + chunk % chunks_per_rank;
    }
    __host__ __device__ size_t loss(int rank) const { return rank * floats() + chunks_per_rank; }
    __host__ __device__ size_t stop(int rank) const { return loss(rank) + 1; }
};

// own_partials[b] = the sum of squares of chunk first_chunk + b
__global__ void grad_norm_partials_kernel(float* own_partials, const float4* grads, size_t n4, size_t first_chunk) {
    size_t begin = (first_chunk + blockIdx.x) * (ZERO_CHUNK / 4), end = min(n4, begin + ZERO_CHUNK / 4);
    float sum = 0.0f;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) { sum += sum4(grads[i] * grads[i]); }
    sum = block_sum(sum);
    if (threadIdx.x == 0) { own_partials[blockIdx.x] = sum; }
}

struct UpdateGuard {
    float max_norm;  // clipping, 0 = off
    float spike_z;   // skip a norm this many standard deviations above the recent ones, 0 = off
    float beta1, beta2;
};

// The loss is summed in rank order; a stop if any rank asked for one.
__global__ void grad_norm_finish_kernel(StepStats* stats, const float* shares, StepShares layout, UpdateGuard guard) {
    float total = 0.0f;
    for (size_t chunk = threadIdx.x; chunk < layout.num_chunks; chunk += blockDim.x) {
        total += shares[layout.partial(chunk)];
    }
    total = block_sum(total);
    if (threadIdx.x != 0) { return; }
    float loss = shares[layout.loss(0)], stop = shares[layout.stop(0)];
    for (int r = 1; r < layout.world; r++) {
        loss += shares[layout.loss(r)];
        stop = fmaxf(stop, shares[layout.stop(r)]);
    }
    stats->loss = loss;
    stats->stop_requested = stop != 0.0f;
    float norm = sqrtf(total);
    bool finite = isfinite(norm) && isfinite(stats->loss);
    float z = finite && guard.spike_z > 0.0f ? (float)outlier_zscore(&stats->recent_norms, norm) : 0.0f;
    if (finite) { outlier_push(&stats->recent_norms, norm); }
    stats->grad_norm = norm;
    stats->norm_z = z;
    stats->skipped = !finite ? SKIP_NONFINITE : guard.spike_z > 0.0f && z > guard.spike_z ? SKIP_SPIKE : SKIP_NONE;
    if (stats->skipped != SKIP_NONE) { return; }
    stats->grad_scale = guard.max_norm > 0.0f ? fminf(1.0f, guard.max_norm / (norm + 1e-6f)) : 1.0f;
    int t = ++stats->adam_step;
    stats->bias_correction1 = 1.0f - powf(guard.beta1, (float)t);
    stats->bias_correction2_sqrt = sqrtf(1.0f - powf(guard.beta2, (float)t));
}

// The partial sums of chunks [first_chunk, end_chunk) of grads (num_parameters floats) into
// own_partials (the rank's share).
static void grad_norm_partials(float* own_partials, const float* grads, size_t num_parameters, size_t first_chunk,
                               size_t end_chunk, cudaStream_t stream = 0) {
    if (end_chunk == first_chunk) { return; }
    grad_norm_partials_kernel<<<end_chunk - first_chunk, GRAD_NORM_THREADS, 0, stream>>>(
        own_partials, (const float4*)grads, num_parameters / 4, first_chunk);
    cudaCheck(cudaGetLastError());
}

static void grad_norm_finish(StepStats* stats, const float* shares, StepShares layout, UpdateGuard guard,
                             cudaStream_t stream = 0) {
    grad_norm_finish_kernel<<<1, GRAD_NORM_THREADS, 0, stream>>>(stats, shares, layout, guard);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// Data parallel: gradients move to the owners of their parameters (ZeRO-1, llmc/zero.h). The
// owner adds the ranks' contributions in rank order, as one GPU adds micro-step gradients in
// micro-step order (gpt2_end_micro_step), so N GPUs with one micro-step each are bit-identical to
// N micro-steps on one.

// dst (n floats, rank `self`'s own contribution) = the world ranks' contributions summed in rank
// order, starting from rank 0's; rank i's (i != self) is at received + zero_sender_slot(i, self) * stride.
__global__ void ordered_sum_kernel(float4* dst, const float4* received, size_t stride4, size_t n4, int self,
                                   int world) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) { return; }
    float4 own = dst[i];
    float4 sum = self == 0 ? own : received[i];
    for (int r = 1; r < world; r++) {
        sum = sum + (r == self ? own : received[zero_sender_slot(r, self) * stride4 + i]);
    }
    dst[i] = sum;
}

static void ordered_sum(float* dst, const float* received, size_t stride, size_t n, const Comm* comm) {
    ordered_sum_kernel<<<ceil_div(n / 4, 256), 256, 0, comm->stream>>>((float4*)dst, (const float4*)received,
                                                                        stride / 4, n / 4, comm->rank, comm->world);
    cudaCheck(cudaGetLastError());
}

// The moves of a step, all on g_comm.stream, as a few entry points; with one rank each returns at
// once, so the model's code reads as the one-GPU algorithm:
//   dp_send_bucket   (--overlap on) during the backward pass, bucket k's gradients to their owners
//                    as soon as both streams have written them (llmc/zero.h: a layer's, from the
//                    top, then the rest); captured with the pass, so the GPU starts each move
//   dp_reduce        in the update: the gradients not yet sent (all of them without the overlap),
//                    then each owner's sum of its slice over the ranks, in rank order
//   dp_gather        after the update: every rank receives the updated parameters; with the overlap,
//                    bucket by bucket in the forward pass's order, each marked for the layer that
//                    reads it (dp_wait_bucket), the embeddings' bucket waited for at once
//   dp_join          the main stream waits for everything queued on g_comm.stream
// With the overlap, the passes' own waits for the moves (each layer's parameters in the forward,
// the last bucket's move at the backward's end) are timed into wait_marks when a step sets
// timing_slot (dp_time_waits), so that the exposed communication counts them (dp_waited_ms).
struct DataParallel {
    bool overlap;  // --overlap's decision (dp_plan): the buckets' moves beside the backward and the next forward pass
    // with the overlap: the buckets, each one's messages, its parameters arrived (dp_gather)
    std::vector<std::vector<ZeroRange>> buckets;
    std::vector<std::vector<ZeroMessage>> to_owners, from_owners;
    std::vector<cudaEvent_t> gathered;
    std::vector<ZeroMessage> all_to_owners;  // without it: every gradient's messages
    float* received;        // the other ranks' gradients of this rank's slice: world - 1 slots of it
    cudaEvent_t handoff;    // a stream's work so far, for g_comm.stream to wait for
    cudaEvent_t joined;     // g_comm.stream's work so far, for the main stream
    // [slot][2 * wait]: before and after wait 0..L-1 (the forward's, for buckets 0..L-1) and L (the
    // backward's last join), for the two steps in flight; timing_slot: the slot the passes being
    // queued record into, or -1 (not timed; part of the passes' graph keys)
    std::vector<cudaEvent_t> wait_marks[2];
    int timing_slot = -1;
};

static void dp_init(DataParallel* dp, size_t chunks_per_rank) {
    int world = g_comm.world;
    *dp = DataParallel();
    cudaCheck(cudaEventCreateWithFlags(&dp->handoff, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&dp->joined, cudaEventDisableTiming));
    if (world == 1) { return; }
    // the same size on every rank: the largest slice's
    dp->received = (float*)device_malloc((world - 1) * chunks_per_rank * ZERO_CHUNK * sizeof(float),
                                         "gradients from other ranks");
}

// The messages of the moves as --overlap's decision `overlap` (the same on every rank) makes them,
// for a model of param_sizes (num_parameters in all) and `layers` layers; set before the first step.
static void dp_plan(DataParallel* dp, bool overlap, const size_t* param_sizes, size_t num_parameters, int layers) {
    dp->overlap = overlap;
    if (g_comm.world == 1) { return; }
    auto messages = [&](const std::vector<ZeroRange>& ranges, bool to_owners) {
        return zero_messages(ranges, num_parameters, g_comm.rank, g_comm.world, to_owners, COMM_MESSAGE_FLOATS);
    };
    if (!overlap) {
        dp->all_to_owners = messages({{0, num_parameters}}, true);
        return;
    }
    bool layered[NUM_PARAMETER_TENSORS];
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { layered[i] = PARAMETER_TENSORS[i].per_layer; }
    dp->buckets = zero_gradient_buckets(param_sizes, layered, NUM_PARAMETER_TENSORS, layers);
    for (const std::vector<ZeroRange>& bucket : dp->buckets) {
        dp->to_owners.push_back(messages(bucket, true));
        dp->from_owners.push_back(messages(bucket, false));
    }
    dp->gathered.resize(dp->buckets.size());
    for (cudaEvent_t& event : dp->gathered) { cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
    for (std::vector<cudaEvent_t>& marks : dp->wait_marks) {
        marks.resize(2 * dp->buckets.size());
        for (cudaEvent_t& event : marks) { cudaCheck(cudaEventCreate(&event)); }
    }
}

static void dp_free(DataParallel* dp) {
    device_free(dp->received);
    for (cudaEvent_t event : dp->gathered) { cudaCheck(cudaEventDestroy(event)); }
    for (const std::vector<cudaEvent_t>& marks : dp->wait_marks) {
        for (cudaEvent_t event : marks) { cudaCheck(cudaEventDestroy(event)); }
    }
    cudaCheck(cudaEventDestroy(dp->handoff));
    cudaCheck(cudaEventDestroy(dp->joined));
}

// Whether the backward pass sends its buckets: with the overlap, on a step's last micro-step.
static bool dp_sends_buckets(const DataParallel* dp, bool last_micro) {
    return g_comm.world > 1 && dp->overlap && last_micro;
}

// g_comm.stream waits for the work queued so far on `stream` (in a captured pass, this joins it to
// the capture: the move becomes part of the graph).
static void dp_comm_waits(DataParallel* dp, cudaStream_t stream) { stream_waits(g_comm.stream, stream, dp->handoff); }

static void dp_join(DataParallel* dp) { stream_waits(0, g_comm.stream, dp->joined); }

// Bucket k of grads moves to its owners once the streams queued so far have written it (the caller
// has made g_comm.stream wait for them). grads holds the earlier micro-steps' sum, to which this
// micro-step's gradients `latest` are first added (nullptr: the first micro-step wrote grads
// itself): the same additions, in the same order, as gpt2_end_micro_step's.
static void dp_send_bucket(DataParallel* dp, size_t k, float* grads, const float* latest) {
    if (latest != nullptr) {
        for (ZeroRange r : dp->buckets[k]) {
            add_inplace(grads + r.begin, latest + r.begin, r.end - r.begin, g_comm.stream);
        }
    }
    comm_post(&g_comm, dp->to_owners[k], grads, dp->received);
}

// The owner's slice [shard.begin, shard.end) of grads becomes the sum over the ranks.
static void dp_reduce(DataParallel* dp, float* grads, const ZeroShard* shard) {
    if (g_comm.world == 1) { return; }
    dp_comm_waits(dp, 0);
    if (!dp->overlap) { comm_post(&g_comm, dp->all_to_owners, grads, dp->received); }
    size_t owned = shard->end - shard->begin;
    if (owned > 0) { ordered_sum(grads + shard->begin, dp->received, owned, owned, &g_comm); }
}

// Every rank's params receive the owners' slices. Without the overlap, the caller joins before
// reading them; with it, bucket by bucket (the last, with the embeddings, first), and the main
// stream waits here for that first bucket only (wte's transpose reads it).
static void dp_gather(DataParallel* dp, float* params, size_t chunks_per_rank) {
    if (g_comm.world == 1) { return; }
    dp_comm_waits(dp, 0);
    if (!dp->overlap) {
        comm_all_gather(&g_comm, params, chunks_per_rank * ZERO_CHUNK);
        return;
    }
    for (size_t k = dp->buckets.size(); k-- > 0;) {
        comm_post(&g_comm, dp->from_owners[k], params, params);
        cudaCheck(cudaEventRecord(dp->gathered[k], g_comm.stream));
    }
    cudaCheck(cudaStreamWaitEvent(0, dp->gathered.back(), 0));
}

// The passes queued next record their waits into slot `slot` (0 or 1, the step's), or do not time
// them (-1: validation, evaluation, micro-steps whose waits are already satisfied).
static void dp_time_waits(DataParallel* dp, int slot) { dp->timing_slot = dp->wait_marks[0].empty() ? -1 : slot; }

// The main stream's wait `index` (see wait_marks), between timing marks when a slot is set.
template <typename Wait>
static void dp_timed_wait(DataParallel* dp, size_t index, const Wait& wait) {
    if (dp->timing_slot < 0) {
        wait();
        return;
    }
    record_outside(dp->wait_marks[dp->timing_slot][2 * index], 0);
    wait();
    record_outside(dp->wait_marks[dp->timing_slot][2 * index + 1], 0);
}

// The forward pass's main stream waits for bucket k's parameters (dp_gather, with the overlap).
static void dp_wait_bucket(DataParallel* dp, size_t k) {
    if (g_comm.world > 1 && dp->overlap) {
        dp_timed_wait(dp, k, [&] { stream_waits_outside(0, dp->gathered[k]); });
    }
}

// The backward pass's end (with the overlap): the main stream joins the moves, the last bucket's
// among them.
static void dp_join_moves(DataParallel* dp) {
    dp_timed_wait(dp, dp->buckets.size() - 1, [&] { dp_join(dp); });
}

// The milliseconds the passes of the step in `slot` waited for the moves (its events are done).
static double dp_waited_ms(const DataParallel* dp, int slot) {
    double total = 0.0;
    const std::vector<cudaEvent_t>& marks = dp->wait_marks[slot];
    for (size_t i = 0; i + 1 < marks.size(); i += 2) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, marks[i], marks[i + 1]));
        total += ms;
    }
    return total;
}

// ----------------------------------------------------------------------------------------------
// Initialisation: p[i] = mean + std * N(0, 1) from a counter-based generator keyed on (seed,
// first_index + i), so the values do not depend on the launch shape and every run is identical.

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

// The model's shape (ModelShape) and its parameter tensors (ParameterTensors, PARAMETER_TENSORS:
// name, shape, weight decay, initialisation) are llmc/model_file.h's, shared with the model file.

// Points each tensor of the table into one flat array of their sizes.
static void point_parameters(ParameterTensors* tensors, float* memory, const size_t sizes[NUM_PARAMETER_TENSORS]) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        tensors->*PARAMETER_TENSORS[i].field = memory;
        memory += sizes[i];
    }
}

// One layer's matrix weights transposed, for the input-gradient products (matmul_backward_input):
// the backward pass transposes each layer's into one of two slots while the layer above runs.
struct LayerWeightsT {
    float* qkvw;      // (C, 3C)
    float* attprojw;  // (C, C)
    float* fcw;       // (C, 4C)
    float* fcprojw;   // (4C, C)
};

// The classifier works on this many rows of logits at a time (1.6 GB at Vp = 50304); the lab
// measured the LM head 7% slower in chunks of 4096 rows, 33% in chunks of 2048. Split TF32 takes
// 4096: its products' split copies of the logits (2 x the chunk) then stay within memory.
static size_t classifier_chunk_rows() { return g_precision == MATMUL_SPLIT_TF32 ? 4096 : 8192; }

// dlnf (rows, C) = dlogits @ wte sums over the whole vocabulary into only rows x C outputs: as one
// product it leaves multiprocessors idle (H100, 4096 rows: 0.73 waves of tiles, 0.93 ms), so it runs
// as lm_head_splits(Vp) products over vocabulary chunks in one batched call (0.71 ms), whose partial
// sums are then added in chunk order. wte_t holds wte^T by chunks: (splits, C, Vp / splits).
constexpr int LM_HEAD_SPLITS = 4;

static int lm_head_splits(int Vp) { return Vp % LM_HEAD_SPLITS == 0 ? LM_HEAD_SPLITS : 1; }

static void transpose_wte(float* wte_t, const float* wte, int Vp, int C) {
    int splits = lm_head_splits(Vp);
    transpose_matrices(wte_t, wte, Vp / splits, C, splits);
}

// The activations: what the forward pass keeps for the backward pass, and the scratch of each
// phase of a step. The three phases (the forward's layers, the LM head, the backward pass) run
// one after another on the main stream, so their scratch tensors share one region
// (layout_activations). R = min(B*T, classifier_chunk_rows()).
struct ActivationTensors {
    // kept
    float* encoded;    // (B, T, C)
    float* ln1_mean;   // (L, B, T)
    float* ln1_rstd;   // (L, B, T)
    float* qkv;        // (L, B, T, 3C)
    float* atty;       // (L, B, T, C)
    float* lse;        // (L, B, NH, T): softmax log-sum-exp of each query's scores
    float* residual2;  // (L, B, T, C), or one layer's (B, T, C) when the backward pass recomputes it (-r 1)
    float* ln2_mean;   // (L, B, T)
    float* ln2_rstd;   // (L, B, T)
    float* fch;        // (L, B, T, 4C)
    float* residual3;  // (L, B, T, C)
    float* lnf;        // (B, T, C)
    float* lnf_mean;   // (B, T)
    float* lnf_rstd;   // (B, T)
    float* losses;     // (B, T)
    float* dbtc;       // (B, T, C): a projection's output in the forward; dlnf from the LM head, then dln, datty
    // scratch of the forward's layers
    float* ln;         // (B, T, C): the layernorm output of ln1 or ln2, for the next product
    float* fch_gelu;   // (B, T, 4C): the GELU's output for the fcproj product (bias_backward recomputes it)
    // scratch of the LM head
    float* logits;     // (Vp, R): one chunk of rows, transposed; dlogits in place. A generation step's: (M, Vp)
    float* lnf_t;      // (C, R): the chunk's rows of lnf, transposed
    float* dlnf_partials;  // (lm_head_splits(Vp), R, C): the vocabulary chunks' shares of dlnf (none if 1)
    float* classifier_scratch;  // (2 CLASSIFIER_MAX_SLICES + 1, R): fused_classifier's per-row statistics
    // scratch of the backward pass
    float* dresidual;  // (B, T, C): gradient of the residual stream
    float* dbt4c;      // (B, T, 4C): the GELU output's gradient; scratch of the attention and the encoder
    float* delta;      // (B, NH, T): attention backward scratch
    // transposed (rows = channels, B*T columns) for the weight gradients (matmul_backward_weight)
    float* dresidual_t;  // (C, B*T): dresidual, the attproj and fcproj output gradient
    float* inp_t;        // (C, B*T): ln2 or ln1, the input of the fc or qkv layer (layernorm_transposed)
    float* dqkv_t;       // (3C, B*T) (flash_attention_backward)
    float* dfch_t;       // (4C, B*T)
    float* gelu_t;       // (4C, B*T): the GELU's output
};

// Points the activations for batches of B x T into memory (nullptr: only measures) and returns the
// floats they take: the kept tensors, then one region as large as the largest phase's scratch.
static size_t layout_activations(ActivationTensors* acts, float* memory, const ModelShape* config, int B, int T,
                                 bool recompute_residual2) {
    enum Phase { KEPT, LAYERS, LM_HEAD, BACKWARD, NUM_PHASES };
    size_t C = config->channels, L = config->num_layers, NH = config->num_heads, BT = (size_t)B * T;
    size_t R = std::min(BT, classifier_chunk_rows()), splits = lm_head_splits(config->padded_vocab_size);
    struct { float** tensor; size_t size; Phase phase; } tensors[] = {
        {&acts->encoded, BT * C, KEPT}, {&acts->ln1_mean, L * BT, KEPT}, {&acts->ln1_rstd, L * BT, KEPT},
        {&acts->qkv, L * BT * 3 * C, KEPT}, {&acts->atty, L * BT * C, KEPT}, {&acts->lse, L * BT * NH, KEPT},
        {&acts->residual2, (recompute_residual2 ? 1 : L) * BT * C, KEPT}, {&acts->ln2_mean, L * BT, KEPT},
        {&acts->ln2_rstd, L * BT, KEPT},
        {&acts->fch, L * BT * 4 * C, KEPT}, {&acts->residual3, L * BT * C, KEPT}, {&acts->lnf, BT * C, KEPT},
        {&acts->lnf_mean, BT, KEPT}, {&acts->lnf_rstd, BT, KEPT}, {&acts->losses, BT, KEPT},
        {&acts->dbtc, BT * C, KEPT},
        {&acts->ln, BT * C, LAYERS}, {&acts->fch_gelu, BT * 4 * C, LAYERS},
        {&acts->logits, R * config->padded_vocab_size, LM_HEAD}, {&acts->lnf_t, R * C, LM_HEAD},
        {&acts->dlnf_partials, (splits > 1 ? splits : 0) * R * C, LM_HEAD},
        {&acts->classifier_scratch, R * (2 * CLASSIFIER_MAX_SLICES + 1), LM_HEAD},
        {&acts->dresidual, BT * C, BACKWARD}, {&acts->dbt4c, BT * 4 * C, BACKWARD}, {&acts->delta, BT * NH, BACKWARD},
        {&acts->dresidual_t, BT * C, BACKWARD}, {&acts->inp_t, BT * C, BACKWARD},
        {&acts->dqkv_t, BT * 3 * C, BACKWARD}, {&acts->dfch_t, BT * 4 * C, BACKWARD},
        {&acts->gelu_t, BT * 4 * C, BACKWARD},
    };
    size_t used[NUM_PHASES] = {};  // floats per phase, each tensor 256-byte aligned
    for (auto& t : tensors) {
        if (memory != nullptr) { *t.tensor = memory + used[t.phase]; }
        used[t.phase] += (t.size + 63) / 64 * 64;
    }
    size_t scratch = std::max({used[LAYERS], used[LM_HEAD], used[BACKWARD]});
    if (memory != nullptr) {  // the scratch region follows the kept tensors
        for (auto& t : tensors) {
            if (t.phase != KEPT) { *t.tensor += used[KEPT]; }
        }
    }
    return used[KEPT] + scratch;
}

struct GPT2 {
    ModelShape config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    ParameterTensors params, grads;
    // parameters (padded to world equal slices for the all-gather) and gradients; AdamW's moments
    // m, v only for this rank's slice [shard.begin, shard.end)
    float *params_memory, *grads_memory, *m_memory, *v_memory;
    ZeroShard shard;
    float* micro_grads_memory;  // a micro-step's gradients after the first (gpt2_begin_micro_step)
    int micro;                  // the micro-step in progress
    bool last_micro;            // it is the step's last
    DataParallel dp;            // the moves between ranks
    StepShares share_layout;
    float* step_shares;  // every rank's share of a step: the norm's partials, loss, stop request
    float* wte_t;                   // wte^T by vocabulary chunks (transpose_wte), for dlnf; rebuilt whenever
                                    // the parameters change (gpt2_transpose_wte)
    LayerWeightsT layer_weights_t[2];  // layer l's in slot l % 2 during the backward pass
    float* weights_t_memory;
    // activations, sized for batches of at most max_B x max_T tokens
    int max_B, max_T;
    int B, T;  // shape of the last forward pass
    ActivationTensors acts;
    float* acts_memory;
    size_t num_activations;
    // the batch on the device, and its positions grouped by token for the wte gradient, uploaded
    // through pinned staging (reused once upload_done has passed)
    int *inputs, *targets;
    int *num_buckets, *bucket_tokens, *bucket_starts, *bucket_positions, *bucket_groups, *group_bounds;
    unsigned int* group_counters;  // encoder_backward's, one per group
    int* staging;  // pinned host: inputs, targets, bucket tokens, starts, positions, groups, group bounds, count
    cudaEvent_t upload_done;
    TokenBuckets buckets;
    bool grads_pending;  // the last forward computed the classifier's gradients for gpt2_backward
    // cross-block reductions: partial sums and arrival counters, for each stream
    float *reduce_partials, *side_partials;
    unsigned int *reduce_counters, *side_counters;
    // hand-offs between the streams in the backward pass (gpt2_backward)
    cudaEvent_t main_ready, dresidual_read, dqkv_t_read, mlp_grads_done, weights_t_ready, grads_done;
    StepStats* stats;         // device: the step's loss, norm and update decision
    StepStats* stats_copies;  // pinned host [2]: their reported part, for the two steps in flight
    float* stop_request;      // pinned host: 1 once this process was asked to stop (a signal)
    cudaEvent_t stats_copied[2];
    GraphCache graphs;  // the forward and backward passes as CUDA graphs (gpt2_forward, gpt2_backward)
    bool recompute_residual2;  // -r 1: the backward pass recomputes each layer's residual2 (set before allocating)
};

// Layer l's residual2: its own, or the one buffer that the backward pass recomputes it into.
static float* layer_residual2(const GPT2* model, int l) {
    size_t btc = (size_t)model->B * model->T * model->config.channels;
    return model->acts.residual2 + (model->recompute_residual2 ? 0 : l * btc);
}

// A shape the model file can hold (model_shape_check) and these kernels run: Vp a multiple of 4,
// a head size of 32, 64 or 128, C at most 2048 (model_shape_runs).
static void validate_config(const ModelShape* c, const char* source) {
    model_shape_check(c, source);
    if (c->padded_vocab_size % 4 != 0) {
        fail("%s: padded vocab %d must be a multiple of 4", source, c->padded_vocab_size);
    }
    if (!model_shape_runs(c->channels, c->num_heads)) {
        fail("%s: C=%d and NH=%d: the head size C/NH must be 32, 64 or 128, and C at most 2048", source,
             c->channels, c->num_heads);
    }
}

// What the moves between ranks need (the owners' slots; dp_plan adds the messages once --overlap is
// decided), the ranks' shares of a step.
static void gpt2_allocate_comm(GPT2* model) {
    int world = g_comm.world;
    dp_init(&model->dp, model->shard.chunks_per_rank);
    model->share_layout = StepShares{model->shard.num_chunks, model->shard.chunks_per_rank, world};
    size_t shares = world * model->share_layout.floats();
    model->step_shares = (float*)device_malloc(shares * sizeof(float), "step shares");
    cudaCheck(cudaMemset(model->step_shares, 0, shares * sizeof(float)));
}

// The step statistics start with no update applied and an empty spike window of `window` norms.
static void gpt2_reset_step_stats(GPT2* model, int window) {
    StepStats initial = {};
    outlier_init(&initial.recent_norms, window);
    cudaCheck(cudaMemcpy(model->stats, &initial, sizeof(initial), cudaMemcpyHostToDevice));
}

static void gpt2_allocate_step_stats(GPT2* model) {
    model->stats = (StepStats*)device_malloc(sizeof(StepStats), "step statistics");
    gpt2_reset_step_stats(model, SPIKE_WINDOW_DEFAULT);
    cudaCheck(cudaMallocHost(&model->stats_copies, 2 * sizeof(StepStats)));
    cudaCheck(cudaMallocHost(&model->stop_request, sizeof(float)));
    *model->stop_request = 0.0f;
    for (cudaEvent_t& event : model->stats_copied) { cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
}

// Allocates parameters, gradients and this rank's AdamW moments on the device (values not set).
static void gpt2_allocate_parameters(GPT2* model, const ModelShape* config) {
    *model = GPT2();
    model->config = *config;
    parameter_sizes(config, model->param_sizes);
    model->num_parameters = count_parameters(config);
    model->shard = zero_shard(model->num_parameters, g_comm.rank, g_comm.world);
    size_t bytes = model->num_parameters * sizeof(float);
    size_t owned_bytes = std::max<size_t>(model->shard.end - model->shard.begin, 4) * sizeof(float);
    size_t padded_bytes = g_comm.world * model->shard.chunks_per_rank * ZERO_CHUNK * sizeof(float);
    model->params_memory = (float*)device_malloc(padded_bytes, "parameters");
    model->grads_memory = (float*)device_malloc(bytes, "gradients");
    model->m_memory = (float*)device_malloc(owned_bytes, "AdamW first moments");
    model->v_memory = (float*)device_malloc(owned_bytes, "AdamW second moments");
    cudaCheck(cudaMemset(model->params_memory, 0, padded_bytes));
    cudaCheck(cudaMemset(model->grads_memory, 0, bytes));
    cudaCheck(cudaMemset(model->m_memory, 0, owned_bytes));
    cudaCheck(cudaMemset(model->v_memory, 0, owned_bytes));
    gpt2_allocate_comm(model);
    gpt2_allocate_step_stats(model);
    point_parameters(&model->params, model->params_memory, model->param_sizes);
    point_parameters(&model->grads, model->grads_memory, model->param_sizes);
    size_t Vp = config->padded_vocab_size, C = config->channels;
    model->weights_t_memory = (float*)device_malloc((Vp * C + 2 * 12 * C * C) * sizeof(float), "transposed weights");
    model->wte_t = model->weights_t_memory;
    float* slot = model->wte_t + Vp * C;
    for (LayerWeightsT& t : model->layer_weights_t) {
        t.qkvw = slot;
        t.attprojw = t.qkvw + 3 * C * C;
        t.fcw = t.attprojw + C * C;
        t.fcprojw = t.fcw + 4 * C * C;
        slot = t.fcprojw + 4 * C * C;
    }
}

static void gpt2_transpose_wte(GPT2* model) {
    transpose_wte(model->wte_t, model->params.wte, model->config.padded_vocab_size, model->config.channels);
}

// Layer l's matrix weights into its slot of layer_weights_t.
static void gpt2_transpose_layer_weights(GPT2* model, int l, cudaStream_t stream) {
    size_t C = model->config.channels;
    const ParameterTensors* p = &model->params;
    const LayerWeightsT* t = &model->layer_weights_t[l % 2];
    transpose_matrices(t->qkvw, p->qkvw + l * 3 * C * C, 3 * C, C, 1, stream);
    transpose_matrices(t->attprojw, p->attprojw + l * C * C, C, C, 1, stream);
    transpose_matrices(t->fcw, p->fcw + l * 4 * C * C, 4 * C, C, 1, stream);
    transpose_matrices(t->fcprojw, p->fcprojw + l * 4 * C * C, C, 4 * C, 1, stream);
}

// A model file or Hugging Face model's shape and parameters (llmc/gpt2_hf.h's read_any_model), of a
// shape these kernels run (host only, no GPU needed). Checkpoints are written as model files.
static ModelShape read_model(const char* path, std::vector<float>* params) {
    ModelShape shape;
    read_any_model(path, &shape, params);
    validate_config(&shape, path);
    return shape;
}

// A model of this config with these parameters (in model-file order) on the device.
static void gpt2_build_from_parameters(GPT2* model, const ModelShape* config, const std::vector<float>& host) {
    gpt2_allocate_parameters(model, config);
    cudaCheck(cudaMemcpy(model->params_memory, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    gpt2_transpose_wte(model);
}

static void gpt2_build_from_file(GPT2* model, const char* path) {
    std::vector<float> host;
    ModelShape config = read_model(path, &host);
    gpt2_build_from_parameters(model, &config, host);
}

// GPT-2 initialisation (the table's): weights N(0, 0.02), the two residual projections
// N(0, 0.02/sqrt(2L)), biases 0, layernorm weights 1; the padded vocabulary rows of wte are 0.
static void gpt2_build_from_scratch(GPT2* model, const ModelShape* config, uint64_t seed) {
    validate_config(config, "model");
    gpt2_allocate_parameters(model, config);
    float residual_std = 0.02f / sqrtf(2.0f * config->num_layers);
    float* tensor = model->params_memory;  // zero where nothing else is written
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        ParameterInit init = PARAMETER_TENSORS[i].init;
        size_t n = i == 0 ? (size_t)config->vocab_size * config->channels : model->param_sizes[i];
        float mean = init == INIT_ONE ? 1.0f : 0.0f;
        float std = init == INIT_NORMAL ? 0.02f : init == INIT_RESIDUAL ? residual_std : 0.0f;
        if (init != INIT_ZERO) { init_normal(tensor, n, mean, std, seed, tensor - model->params_memory); }
        tensor += model->param_sizes[i];
    }
    gpt2_transpose_wte(model);
}

// Split TF32's scratch for every product of a step over B x T tokens. Where our GEMM takes them all
// (gemm_split_takes_model, and B x T a multiple of 4 for the operands it reads transposed), the
// partial sums of its parts: the largest of dwte's accumulating product (every part in partials,
// one if no more fit) and 15 parts of a weight gradient or of dlnf. Else cuBLASLt's (matmul_split):
// two copies of both operands, at most the fc layer's weight gradient (dfch_t, inp_t) and weight,
// and the partial sums of the products that chunk through them: the layers' forward and
// input-gradient products on the main stream, their weight gradients on the side stream; the LM
// head's operands, chunks of R rows (wte, logits, lnf), on the main stream.
static void reserve_split_operands(const ModelShape* c, int B, int T) {
    size_t C = c->channels, Vp = c->padded_vocab_size, BT = (size_t)B * T;
    size_t R = std::min(BT, classifier_chunk_rows());
    if (gemm_split_takes_model(c) && BT % 4 == 0) {
        size_t ours = std::max({gemm_part_floats(Vp, C), 15 * gemm_part_floats(4 * C, C),
                                15 * gemm_part_floats(R, C)});
        split_scratch_reserve(ours, ours);
        return;
    }
    size_t layer = 2 * (5 * C * BT + 4 * C * C) + 4, lm_head = 2 * (Vp * (C + R) + C * R);
    size_t main_partials = 0, side_partials = 0;
    for (size_t OC : {3 * C, C, 4 * C}) {
        size_t forward = split_partial_floats(OC, BT, (int)C), input_grad = split_partial_floats(C, BT, (int)OC);
        main_partials = std::max({main_partials, forward, input_grad});
        side_partials = std::max(side_partials, split_partial_floats(C, OC, (int)BT));
    }
    split_scratch_reserve(std::max(layer + main_partials, lm_head), layer + side_partials);
}

// Activations and batch buffers for batches of at most B x T.
static void gpt2_allocate_activations(GPT2* model, int B, int T) {
    const ModelShape* c = &model->config;
    model->num_activations = layout_activations(&model->acts, nullptr, c, B, T, model->recompute_residual2);
    char what[128];
    snprintf(what, sizeof(what), "activations for B=%d, T=%d", B, T);
    model->acts_memory = (float*)device_malloc(model->num_activations * sizeof(float), what);
    layout_activations(&model->acts, model->acts_memory, c, B, T, model->recompute_residual2);
    if (g_precision == MATMUL_SPLIT_TF32) { reserve_split_operands(c, B, T); }
    model->max_B = B;
    model->max_T = T;
    size_t BT = (size_t)B * T;
    model->inputs = (int*)device_malloc(BT * sizeof(int), "inputs");
    model->targets = (int*)device_malloc(BT * sizeof(int), "targets");
    model->num_buckets = (int*)device_malloc(sizeof(int), "token buckets");
    model->bucket_tokens = (int*)device_malloc(BT * sizeof(int), "token buckets");
    model->bucket_starts = (int*)device_malloc((BT + 1) * sizeof(int), "token buckets");
    model->bucket_positions = (int*)device_malloc(BT * sizeof(int), "token buckets");
    model->bucket_groups = (int*)device_malloc(BT * sizeof(int), "token buckets");
    size_t max_groups = max_bucket_groups(BT);
    model->group_bounds = (int*)device_malloc(std::max(2 * max_groups, (size_t)1) * sizeof(int), "token buckets");
    model->group_counters = (unsigned int*)device_malloc(std::max(max_groups, (size_t)1) * sizeof(unsigned int),
                                                         "token buckets");
    cudaCheck(cudaMemset(model->group_counters, 0, std::max(max_groups, (size_t)1) * sizeof(unsigned int)));
    size_t ln_partials = (size_t)layernorm_backward_grid(c->channels) * 2 * c->channels;
    size_t bias_partials = (size_t)BIAS_BACKWARD_MAX_CHUNKS * 4 * c->channels;
    size_t partials = std::max(ln_partials, bias_partials);
    model->reduce_partials = (float*)device_malloc(partials * sizeof(float), "reductions");
    model->reduce_counters = (unsigned int*)device_malloc(MAX_REDUCTION_COUNTERS * sizeof(unsigned int), "reductions");
    cudaCheck(cudaMemset(model->reduce_counters, 0, MAX_REDUCTION_COUNTERS * sizeof(unsigned int)));
    model->side_partials = (float*)device_malloc(bias_partials * sizeof(float), "reductions");
    model->side_counters = (unsigned int*)device_malloc(MAX_REDUCTION_COUNTERS * sizeof(unsigned int), "reductions");
    cudaCheck(cudaMemset(model->side_counters, 0, MAX_REDUCTION_COUNTERS * sizeof(unsigned int)));
    for (cudaEvent_t* event : {&model->main_ready, &model->dresidual_read, &model->dqkv_t_read, &model->mlp_grads_done,
                               &model->weights_t_ready, &model->grads_done}) {
        cudaCheck(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
    }
    cudaCheck(cudaMallocHost(&model->staging, (6 * BT + 2 * max_groups + 2) * sizeof(int)));
    cudaCheck(cudaEventCreateWithFlags(&model->upload_done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(model->upload_done));
}

// Copies count ints to the device through the pinned staging area at staging_offset.
static void upload(GPT2* model, int* device_dst, const int* host_src, size_t count, size_t staging_offset) {
    int* staged = model->staging + staging_offset;
    memcpy(staged, host_src, count * sizeof(int));
    cudaCheck(cudaMemcpyAsync(device_dst, staged, count * sizeof(int), cudaMemcpyHostToDevice));
}

// dlnf (rows, C) from dlogits_t (Vp, rows) in lm_head_splits(Vp) products; partials: (splits, rows, C).
static void lm_head_dlnf(float* dlnf, float* partials, const float* wte_t, const float* dlogits_t, int rows, int C,
                         int Vp) {
    int splits = lm_head_splits(Vp), chunk = Vp / splits;
    float* out = splits > 1 ? partials : dlnf;
    matmul(out, wte_t, dlogits_t, nullptr, C, rows, chunk, true, true, 1.0f, 0.0f, splits, (size_t)C * chunk,
           (size_t)chunk * rows, (size_t)rows * C);
    if (splits == 1) { return; }
    size_t n = (size_t)rows * C;
    sum_arrays(dlnf, partials, partials + n, n, splits - 1, n);  // the chunks' shares in chunk order
}

// logits_t (Vp, rows) = wte (Vp, C) @ lnf^T: our GEMM where it fits (it beats cuBLASLt at this
// shape in the lab), else cuBLASLt.
static void lm_head_logits(float* logits_t, const float* wte, const float* lnf, int rows, int C, int Vp) {
    if (gemm_tf32_fits(logits_t, nullptr, wte, lnf, rows, C)) {
        gemm_tf32(logits_t, nullptr, wte, lnf, nullptr, Vp, rows, C);
    } else {
        matmul(logits_t, lnf, wte, nullptr, rows, Vp, C, true, false, 1.0f, 0.0f);
    }
}

// The LM head on one chunk of rows of lnf (rows, C): logits_t (Vp, rows) = wte @ lnf^T, the
// logits transposed. With targets, each row's loss and, in place, dlogits (scratch: see
// fused_classifier); with dwte, also dlnf (rows, C) = dlogits @ wte (lm_head_dlnf) and dwte =
// dlogits^T @ lnf, or += for a chunk after the first (dwte_accumulate; lnf_t: (C, rows) scratch).
// The transposed logits let the three products read every operand along its summed dimension (what
// the TF32 tensor-core kernels need for full speed) except dlogits in the dlnf one; the dwte
// product, summed over rows, would otherwise read both operands across their rows and take 1.6x
// as long.
static void lm_head_chunk(float* logits_t, float* losses, float* scratch, float* dlnf, float* dlnf_partials,
                          float* dwte, bool dwte_accumulate, float* lnf_t, const float* lnf, const float* wte,
                          const float* wte_t, const int* targets, float dloss, int rows, int C, int V, int Vp) {
    lm_head_logits(logits_t, wte, lnf, rows, C, Vp);
    if (targets == nullptr) { return; }
    fused_classifier(logits_t, losses, scratch, targets, dloss, rows, V, Vp);
    if (dwte == nullptr) { return; }
    lm_head_dlnf(dlnf, dlnf_partials, wte_t, logits_t, rows, C, Vp);
    transpose_matrices(lnf_t, lnf, rows, C, 1);
    matmul(dwte, lnf_t, logits_t, nullptr, C, Vp, rows, true, false, 1.0f, dwte_accumulate ? 1.0f : 0.0f);
}

// The classifier over the rows of lnf in chunks of classifier_chunk_rows() (lm_head_chunk); with
// grads, dlnf goes to acts.dbtc, each chunk's share before the next chunk reuses the logits
// buffer. Without targets, acts.logits holds the last chunk's logits (gpt2_read_logits).
static void classifier_forward(GPT2* model, bool with_targets, bool with_grads, float loss_weight) {
    const ModelShape* c = &model->config;
    int C = c->channels;
    size_t BT = (size_t)model->B * model->T;
    ActivationTensors a = model->acts;
    size_t chunk_rows = classifier_chunk_rows();
    for (size_t first = 0; first < BT; first += chunk_rows) {
        int rows = (int)std::min(chunk_rows, BT - first);
        lm_head_chunk(a.logits, a.losses + first, a.classifier_scratch, a.dbtc + first * C, a.dlnf_partials,
                      with_grads ? model->grads.wte : nullptr, first > 0, a.lnf_t, a.lnf + first * C, model->params.wte,
                      model->wte_t, with_targets ? model->targets + first : nullptr, loss_weight / BT, rows, C,
                      c->vocab_size, c->padded_vocab_size);
    }
    if (with_targets) {
        accumulate_loss_kernel<<<1, 1024>>>(&model->stats->loss, a.losses, (int)BT, loss_weight);
        cudaCheck(cudaGetLastError());
    }
}

// The embeddings, the layers (flash attention) and the final layernorm (into acts.lnf) over the
// B x T tokens in model->inputs, token (b, t) at position t.
static void gpt2_forward_layers(GPT2* model, int B, int T) {
    const ModelShape* c = &model->config;
    int L = c->num_layers, NH = c->num_heads, C = c->channels;
    size_t BT = (size_t)B * T, btc = BT * C;
    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    // the embeddings' bucket has arrived: dp_gather waited for it (wte's transpose reads it)
    encoder_forward(a.encoded, model->inputs, p.wte, p.wpe, nullptr, B, T, C);
    for (int l = 0; l < L; l++) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        dp_wait_bucket(&model->dp, L - 1 - l);
        float* qkv = a.qkv + l * 3 * btc;
        float* atty = a.atty + l * btc;
        float* fch = a.fch + l * 4 * btc;
        // a.dbtc holds each projection's output until the next layernorm adds it to the residual
        // stream: residual3 of the previous layer is written by this layer's first layernorm
        if (l == 0) {
            layernorm_forward(a.ln, a.ln1_mean, a.ln1_rstd, nullptr, a.encoded, nullptr, p.ln1w, p.ln1b, BT, C);
        } else {
            layernorm_forward(a.ln, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, (float*)residual,
                              layer_residual2(model, l - 1), a.dbtc, p.ln1w + l * C, p.ln1b + l * C, BT, C);
        }
        matmul_forward(qkv, a.ln, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C);
        flash_attention_forward(atty, a.lse + l * BT * NH, qkv, B, T, NH, C / NH, c->attention,
                                g_precision != MATMUL_TF32);
        matmul_forward(a.dbtc, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, BT, C, C);
        layernorm_forward(a.ln, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, layer_residual2(model, l), residual,
                          a.dbtc, p.ln2w + l * C, p.ln2b + l * C, BT, C);
        fc_forward(fch, a.fch_gelu, a.ln, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, BT, C, 4 * C);
        matmul_forward(a.dbtc, a.fch_gelu, p.fcprojw + (size_t)l * 4 * C * C, p.fcprojb + l * C, BT, 4 * C, C);
    }
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + (L - 1) * btc, layer_residual2(model, L - 1),
                      a.dbtc, p.lnfw, p.lnfb, BT, C);
}

// Uploads inputs (B, T) (host, ids < V) and, if given, targets; with_grads also the wte
// gradient's token buckets. Nothing here waits for the GPU but the previous upload.
static void gpt2_upload_batch(GPT2* model, const int* inputs, const int* targets, int B, int T, bool with_grads) {
    const ModelShape* c = &model->config;
    if ((size_t)B * T > (size_t)model->max_B * model->max_T || T > c->max_seq_len) {
        fail("batch %dx%d larger than the allocated %dx%d or the model's maxT %d", B, T, model->max_B, model->max_T,
             c->max_seq_len);
    }
    size_t BT = (size_t)B * T;
    comm_wait(&g_comm, model->upload_done);  // the staging area is free (polled: it may follow a step's moves)
    upload(model, model->inputs, inputs, BT, 0);
    if (targets != nullptr) { upload(model, model->targets, targets, BT, BT); }
    if (with_grads) {
        TokenBuckets* tb = &model->buckets;
        token_buckets_build(tb, inputs, (int)BT, c->vocab_size, WTE_BUCKET_POSITIONS);
        upload(model, model->bucket_tokens, tb->tokens.data(), tb->num_buckets, 2 * BT);
        upload(model, model->bucket_starts, tb->starts.data(), tb->num_buckets + 1, 3 * BT);
        upload(model, model->bucket_positions, tb->positions.data(), BT, 4 * BT + 1);
        upload(model, model->bucket_groups, tb->groups.data(), tb->num_buckets, 5 * BT + 1);
        upload(model, model->group_bounds, tb->group_bounds.data(), 2 * tb->num_groups, 6 * BT + 1);
        upload(model, model->num_buckets, &tb->num_buckets, 1, 6 * BT + 1 + 2 * max_bucket_groups(BT));
    }
    cudaCheck(cudaEventRecord(model->upload_done));
}

// Forward pass over inputs (B, T) (host, ids < V; B * T within the allocated activations). With
// targets, adds loss_weight x the mean loss to the device loss sum (gpt2_reset_loss,
// gpt2_read_stats) and leaves each position's loss in acts.losses; with_grads also computes the
// classifier's gradients for gpt2_backward, scaled as the gradient of loss_weight x the mean loss
// (1/micro-steps when accumulating). Nothing here waits for the GPU.
static void gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T, float loss_weight = 1.0f,
                         bool with_grads = false) {
    if (with_grads && targets == nullptr) { fail("gpt2_forward: gradients need targets"); }
    gpt2_upload_batch(model, inputs, targets, B, T, with_grads);
    model->B = B;
    model->T = T;
    model->grads_pending = with_grads;
    uint32_t weight_bits;
    memcpy(&weight_bits, &loss_weight, sizeof(weight_bits));
    GraphKey key = {0, B, T, targets != nullptr, weight_bits, with_grads ? (int64_t)model->grads.wte : 0,
                    model->dp.timing_slot};
    model->graphs.run(key, [&] {
        gpt2_forward_layers(model, B, T);
        classifier_forward(model, targets != nullptr, with_grads, loss_weight);
    });
}

static void gpt2_reset_loss(GPT2* model) { cudaCheck(cudaMemsetAsync(&model->stats->loss, 0, sizeof(float))); }

// Micro-step `micro` of this rank's micro-steps of an optimizer step: the first writes the
// gradients; each later one computes its gradients apart (micro_grads_memory) and
// gpt2_end_micro_step adds them in one addition. So the sum is g0 + g1 + ... in micro-step
// order, whatever the kernels add inside a micro-step: the sum the owners of a data-parallel run
// form in rank order (gpt2_update).
static void gpt2_begin_micro_step(GPT2* model, int micro, bool last) {
    model->micro = micro;
    model->last_micro = last;
    float* grads = model->grads_memory;
    if (micro > 0) {
        if (model->micro_grads_memory == nullptr) {
            model->micro_grads_memory =
                (float*)device_malloc(model->num_parameters * sizeof(float), "micro-step gradients");
        }
        grads = model->micro_grads_memory;
    }
    point_parameters(&model->grads, grads, model->param_sizes);
}

// Micro-steps after the first add their gradients to the sum, unless the backward pass sent them
// (dp_send_bucket adds them there).
static void gpt2_end_micro_step(GPT2* model) {
    if (model->micro > 0 && !dp_sends_buckets(&model->dp, model->last_micro)) {
        add_inplace(model->grads_memory, model->micro_grads_memory, model->num_parameters, 0);
    }
}

// With -r 1, layer l's residual2 = residual + the attention projection, which the forward pass did
// not keep (L x B*T*C floats: 2.5 GB for GPT-2 XL at B=8): the forward's product again (the same
// plan, so the same bits) and the forward's add, for one C x C product per layer.
static void recompute_residual2(GPT2* model, int l) {
    const ModelShape* c = &model->config;
    int C = c->channels;
    size_t BT = (size_t)model->B * model->T, btc = BT * C;
    const ActivationTensors* a = &model->acts;
    const float* residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * btc;
    matmul_forward(a->residual2, a->atty + l * btc, model->params.attprojw + (size_t)l * C * C,
                   model->params.attprojb + l * C, BT, C, C);
    add_inplace(a->residual2, residual, btc, 0);
}

// The backward pass's launches (gpt2_backward).
static void gpt2_backward_launches(GPT2* model) {
    const ModelShape* c = &model->config;
    int B = model->B, T = model->T;
    int L = c->num_layers, NH = c->num_heads, C = c->channels;
    size_t BT = (size_t)B * T, btc = BT * C;
    ParameterTensors p = model->params, g = model->grads;
    ActivationTensors a = model->acts;
    float* partials = model->reduce_partials;
    unsigned int* counters = model->reduce_counters;

    // The weight and bias gradients go to the side stream as soon as their inputs are ready
    // (main_ready), with the transposes they read; the main stream waits for the side stream to
    // have read a buffer (or to be done with one it reads) before it overwrites it; the top layer
    // waits for nothing (the previous pass ended joined, and a captured pass may wait only for
    // events recorded in it). The attention backward writes dqkv_t and the qkv bias gradient itself.
    // Layer l's transposed weights (slot l % 2) are made on the side stream once layer l + 2 is
    // done with the slot: the top layer's at the start, each other's as the layer above begins.
    cudaStream_t side = g_side_stream;
    float* side_partials = model->side_partials;
    unsigned int* side_counters = model->side_counters;
    auto side_waits_for_main = [&]() {
        cudaCheck(cudaEventRecord(model->main_ready, 0));
        cudaCheck(cudaStreamWaitEvent(side, model->main_ready, 0));
    };
    auto side_marks = [&](cudaEvent_t event) { cudaCheck(cudaEventRecord(event, side)); };
    auto main_waits_for = [&](cudaEvent_t event) { cudaCheck(cudaStreamWaitEvent(0, event, 0)); };
    // bucket k's gradients are written on both streams: they move to their owners (the last bucket
    // after the side stream has joined the main one); the pass ends joined to the moves
    bool sends = dp_sends_buckets(&model->dp, model->last_micro);
    auto bucket_done = [&](size_t k) {
        if (!sends) { return; }
        dp_comm_waits(&model->dp, 0);
        if (k < (size_t)L) { dp_comm_waits(&model->dp, side); }
        dp_send_bucket(&model->dp, k, model->grads_memory, model->micro > 0 ? model->micro_grads_memory : nullptr);
    };

    side_waits_for_main();
    gpt2_transpose_layer_weights(model, L - 1, side);
    side_marks(model->weights_t_ready);
    cudaCheck(cudaMemsetAsync(a.dresidual, 0, btc * sizeof(float)));
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, partials, a.dbtc, a.residual3 + (L - 1) * btc, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, BT, C);
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        float* dgelu = a.dbt4c;  // the gradient of the GELU's output (bias_backward turns it into dfch_t)
        const LayerWeightsT* wt = &model->layer_weights_t[l % 2];
        main_waits_for(model->weights_t_ready);
        // MLP: dresidual holds d residual3, which flows unchanged into d residual2
        side_waits_for_main();
        if (l > 0) {
            gpt2_transpose_layer_weights(model, l - 1, side);
            side_marks(model->weights_t_ready);
        }
        bias_backward(g.fcprojb + l * C, a.dresidual_t, nullptr, side_partials, side_counters, a.dresidual, nullptr, BT, C,
                      side);
        side_marks(model->dresidual_read);
        matmul_backward_input(dgelu, a.dresidual, false, wt->fcprojw, BT, 4 * C, C);
        // the layer above read dfch_t, gelu_t and residual2
        if (l < L - 1) { main_waits_for(model->mlp_grads_done); }
        if (model->recompute_residual2) { recompute_residual2(model, l); }
        const float* residual2 = layer_residual2(model, l);
        bias_backward(g.fcb + l * 4 * C, a.dfch_t, a.gelu_t, partials, counters, dgelu, a.fch + l * 4 * btc, BT, 4 * C);
        side_waits_for_main();
        matmul_backward_weight(g.fcprojw + (size_t)l * 4 * C * C, a.dresidual_t, a.gelu_t, true, BT, 4 * C, C, side);
        layernorm_transposed(a.inp_t, residual2, a.ln2_mean + l * BT, a.ln2_rstd + l * BT,
                             p.ln2w + l * C, p.ln2b + l * C, BT, C, side);
        matmul_backward_weight(g.fcw + (size_t)l * 4 * C * C, a.dfch_t, a.inp_t, true, BT, C, 4 * C, side);
        side_marks(model->mlp_grads_done);
        matmul_backward_input(a.dbtc, a.dfch_t, true, wt->fcw, BT, C, 4 * C);
        main_waits_for(model->dresidual_read);
        layernorm_backward(a.dresidual, g.ln2w + l * C, g.ln2b + l * C, partials, a.dbtc,
                           residual2, p.ln2w + l * C, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, BT, C);
        // attention: dresidual now holds d residual2, which flows unchanged into d residual
        side_waits_for_main();
        bias_backward(g.attprojb + l * C, a.dresidual_t, nullptr, side_partials, side_counters, a.dresidual, nullptr, BT, C,
                      side);
        side_marks(model->dresidual_read);
        // our split TF32 GEMM reads atty transposed (into inp_t, free until qkv's layernorm_transposed)
        const float* atty = a.atty + l * btc;
        bool atty_t = gemm_split_takes_model(c);
        if (atty_t) { transpose_matrices(a.inp_t, atty, BT, C, 1, side); }
        matmul_backward_weight(g.attprojw + (size_t)l * C * C, a.dresidual_t, atty_t ? a.inp_t : atty, atty_t, BT, C, C,
                               side);
        matmul_backward_input(a.dbtc, a.dresidual, false, wt->attprojw, BT, C, C);
        if (l < L - 1) { main_waits_for(model->dqkv_t_read); }  // the layer above read dqkv_t
        flash_attention_backward(a.dqkv_t, g.qkvb + l * 3 * C, a.dbt4c, a.delta, a.dbtc, a.qkv + l * 3 * btc,
                                 a.atty + l * btc, a.lse + l * BT * NH, B, T, NH, C / NH, c->attention,
                                 g_precision != MATMUL_TF32);
        side_waits_for_main();
        layernorm_transposed(a.inp_t, residual, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, p.ln1w + l * C,
                             p.ln1b + l * C, BT, C, side);
        matmul_backward_weight(g.qkvw + (size_t)l * 3 * C * C, a.dqkv_t, a.inp_t, true, BT, C, 3 * C, side);
        side_marks(model->dqkv_t_read);
        matmul_backward_input(a.dbtc, a.dqkv_t, true, wt->qkvw, BT, C, 3 * C);
        main_waits_for(model->dresidual_read);
        layernorm_backward(a.dresidual, g.ln1w + l * C, g.ln1b + l * C, partials, a.dbtc, residual,
                           p.ln1w + l * C, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C);
        bucket_done(L - 1 - l);
    }
    side_marks(model->grads_done);
    main_waits_for(model->grads_done);  // every weight gradient is in before the optimizer or the next forward
    encoder_backward(g.wte, g.wpe, a.dbt4c, model->group_counters, a.dresidual, model->num_buckets,
                     model->bucket_tokens, model->bucket_starts, model->bucket_positions, model->bucket_groups,
                     model->group_bounds, B, T, c->max_seq_len, C);  // dbt4c (4 B*T*C floats) holds the partials
    bucket_done(L);
    if (sends) { dp_join_moves(&model->dp); }
}

// Backward pass of the last forward (which must have computed the classifier's gradients, and
// so dlnf in acts.dbtc and the LM head's share of dwte): every parameter's gradient is written
// (=) into model->grads, so nothing needs zeroing between steps.
static void gpt2_backward(GPT2* model) {
    if (!model->grads_pending) { fail("gpt2_backward: the last forward pass did not compute gradients"); }
    model->grads_pending = false;
    bool sends = dp_sends_buckets(&model->dp, model->last_micro);  // the moves are part of the graph
    GraphKey key = {1, model->B, model->T, (int64_t)model->grads.wte, sends, 0, model->dp.timing_slot};
    model->graphs.run(key, [&] { gpt2_backward_launches(model); });
}

// The main stream waits for g_comm.stream; with marks (two timing events), records the wait.
static void gpt2_wait_for_comm(GPT2* model, cudaEvent_t* marks) {
    if (marks != nullptr) { cudaCheck(cudaEventRecord(marks[0])); }
    dp_join(&model->dp);
    if (marks != nullptr) { cudaCheck(cudaEventRecord(marks[1])); }
}

// AdamW step on the accumulated gradients, clipped to a global norm of max_norm (none if <= 0),
// or skipped when the loss or norm is not finite or the norm is a spike (spike_z > 0); the
// decision and the norm stay on the device (gpt2_read_stats reads them). With several ranks
// (ZeRO-1), each owner sums the ranks' gradients of its slice (dp_reduce), the ranks' shares of the
// step (the norm's partial sums, the loss, a stop request) go to every rank, so that all make the
// same decisions (skip, stop) from the same numbers, each rank updates its slice, and every rank
// gathers the parameters (dp_gather). comm_marks: 6 timing events around the three waits for
// communication (the gradients, the shares, the parameters: with the overlap, only the
// embeddings' bucket), or nullptr.
static void gpt2_update(GPT2* model, float lr, float beta1, float beta2, float eps, float weight_decay,
                        float max_norm, float spike_z, cudaEvent_t* comm_marks = nullptr) {
    const ZeroShard* shard = &model->shard;
    DataParallel* dp = &model->dp;
    bool several = g_comm.world > 1;
    auto marks = [&](int wait) { return comm_marks != nullptr ? comm_marks + 2 * wait : nullptr; };
    dp_reduce(dp, model->grads_memory, shard);
    if (several) { gpt2_wait_for_comm(model, marks(0)); }
    const StepShares& layout = model->share_layout;
    float* own = model->step_shares + g_comm.rank * layout.floats();
    grad_norm_partials(own, model->grads_memory, model->num_parameters, shard->first_chunk, shard->end_chunk);
    float* own_loss = own + layout.chunks_per_rank;
    cudaCheck(cudaMemcpyAsync(own_loss, &model->stats->loss, sizeof(float), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpyAsync(own_loss + 1, model->stop_request, sizeof(float), cudaMemcpyHostToDevice));
    if (several) {
        dp_comm_waits(dp, 0);
        comm_all_gather(&g_comm, model->step_shares, layout.floats());
        gpt2_wait_for_comm(model, marks(1));
    }
    grad_norm_finish(model->stats, model->step_shares, layout, UpdateGuard{max_norm, spike_z, beta1, beta2});
    TensorTable table = tensor_table(model->param_sizes);
    size_t owned4 = (shard->end - shard->begin) / 4;
    if (owned4 > 0) {
        adamw_kernel<<<ceil_div(owned4, 256), 256>>>((float4*)(model->params_memory + shard->begin),
                                                    (float4*)model->m_memory, (float4*)model->v_memory,
                                                    (const float4*)(model->grads_memory + shard->begin), owned4,
                                                    shard->begin / 4, table, model->stats, lr, beta1, beta2,
                                                    eps, weight_decay);
        cudaCheck(cudaGetLastError());
    }
    if (several) {
        if (marks(2) != nullptr) { cudaCheck(cudaEventRecord(marks(2)[0])); }
        dp_gather(dp, model->params_memory, shard->chunks_per_rank);
        if (!dp->overlap) { dp_join(dp); }
        if (marks(2) != nullptr) { cudaCheck(cudaEventRecord(marks(2)[1])); }
    }
    gpt2_transpose_wte(model);
}

// FNV-1a over the bits of every parameter: equal checksums mean bit-identical weights.
static uint64_t gpt2_weights_checksum(const GPT2* model) {
    std::vector<uint32_t> bits(model->num_parameters);
    cudaCheck(cudaMemcpy(bits.data(), model->params_memory, bits.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    return fnv1a(FNV1A_OFFSET, bits.data(), bits.size());
}

// The step's statistics (loss, norm, the update's decision): queued into copy slot 0 or 1 without
// waiting, so that the next step can be queued before this one is read (gpt2_wait_stats);
// gpt2_read_stats does both.
static void gpt2_queue_stats(GPT2* model, int slot) {
    cudaCheck(cudaMemcpyAsync(model->stats_copies + slot, model->stats, STEP_STATS_REPORTED, cudaMemcpyDeviceToHost));
    cudaCheck(cudaEventRecord(model->stats_copied[slot]));
}

static const StepStats* gpt2_wait_stats(const GPT2* model, int slot) {
    comm_wait(&g_comm, model->stats_copied[slot]);
    return &model->stats_copies[slot];
}

[[maybe_unused]] static const StepStats* gpt2_read_stats(GPT2* model) {
    gpt2_queue_stats(model, 0);
    return gpt2_wait_stats(model, 0);
}

static void gpt2_free(GPT2* model) {
    model->graphs.clear();
    dp_free(&model->dp);
    void* buffers[] = {model->params_memory, model->grads_memory, model->m_memory, model->v_memory,
                       model->micro_grads_memory, model->step_shares, model->acts_memory,
                       model->reduce_partials, model->stats, model->inputs, model->targets, model->num_buckets,
                       model->bucket_tokens, model->bucket_starts, model->bucket_positions, model->bucket_groups, model->group_bounds,
                       model->group_counters, model->weights_t_memory, model->reduce_counters,
                       model->side_partials, model->side_counters};
    for (void* buffer : buffers) { device_free(buffer); }
    for (cudaEvent_t event : {model->main_ready, model->dresidual_read, model->dqkv_t_read, model->mlp_grads_done,
                              model->weights_t_ready, model->grads_done}) {
        cudaCheck(cudaEventDestroy(event));
    }
    cudaCheck(cudaFreeHost(model->staging));
    cudaCheck(cudaFreeHost(model->stats_copies));
    cudaCheck(cudaFreeHost(model->stop_request));
    for (cudaEvent_t event : model->stats_copied) { cudaCheck(cudaEventDestroy(event)); }
    cudaCheck(cudaEventDestroy(model->upload_done));
}

// ----------------------------------------------------------------------------------------------
// Generation: M completions of one prompt with a KV cache. The prompt but its last token runs once
// (B = 1) through the forward pass with flash attention, and its keys and values are copied to
// every completion's cache; then each step (gpt2_decode_step) runs one position per completion
// through the model, attending over the cache, and samples the next tokens on the device. The
// step is captured once as a CUDA graph and replayed; what changes from step to step (the
// position, the tokens, the sampling flags) lives in device memory.

constexpr int GENERATE_LOOKAHEAD = 4;  // steps queued ahead of the one whose tokens are read

struct Generator {
    int M, max_T;              // completions; positions the cache holds (prompt and new tokens)
    size_t device_bytes;       // of the one allocation that starts at kv and holds the buffers to sampling
    float* kv;                 // (L, M, max_T, 2C): every layer's keys and values (attention_decode)
    float* partials;           // attention_decode's per-chunk results
    unsigned int* counters;    // attention_decode's, one per (completion, head)
    int* position;             // device: the position the next step processes
    SamplingParams* sampling;  // device
    int* tokens;               // pinned, mapped (M, max_T): each completion's tokens; the sampler writes its picks
    int* tokens_device;        // the device's address of tokens
    GraphCache step;           // gpt2_decode_step as a CUDA graph
    cudaEvent_t step_done[GENERATE_LOOKAHEAD];
};

static void generator_init(Generator* gen, const GPT2* model, int M, int max_T) {
    const ModelShape* c = &model->config;
    int NH = c->num_heads, hs = c->channels / NH;
    *gen = Generator();
    gen->M = M;
    gen->max_T = max_T;
    // one device allocation, carved into the buffers below (each 256-byte aligned)
    size_t kv_bytes = (size_t)c->num_layers * M * max_T * 2 * c->channels * sizeof(float);
    size_t partial_bytes = (size_t)M * NH * ceil_div(max_T, DECODE_CHUNK) * (hs + 2) * sizeof(float);
    size_t counter_bytes = (size_t)M * NH * sizeof(unsigned int);
    auto aligned = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    gen->device_bytes = aligned(kv_bytes) + aligned(partial_bytes) + aligned(counter_bytes) + aligned(sizeof(int)) +
                        sizeof(SamplingParams);
    char* memory = (char*)device_malloc(gen->device_bytes, "the KV cache");
    gen->kv = (float*)memory;
    gen->partials = (float*)(memory += aligned(kv_bytes));
    gen->counters = (unsigned int*)(memory += aligned(partial_bytes));
    gen->position = (int*)(memory += aligned(counter_bytes));
    gen->sampling = (SamplingParams*)(memory += aligned(sizeof(int)));
    cudaCheck(cudaMemset(gen->counters, 0, counter_bytes));
    cudaCheck(cudaHostAlloc(&gen->tokens, (size_t)M * max_T * sizeof(int), cudaHostAllocMapped));
    cudaCheck(cudaHostGetDevicePointer(&gen->tokens_device, gen->tokens, 0));
    for (cudaEvent_t& event : gen->step_done) { cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
}

static void generator_free(Generator* gen) {
    device_free(gen->kv);
    cudaCheck(cudaFreeHost(gen->tokens));
    gen->step.clear();
    for (cudaEvent_t event : gen->step_done) { cudaCheck(cudaEventDestroy(event)); }
}

// A linear layer of the decode step with what surrounds it (LinearOps): one fused kernel for a few
// rows, else layernorm (into ln_out), cuBLAS (adding into out for accumulate) and the GELU.
static void decode_linear(float* out, const float* inp, const float* weight, const float* bias, LinearOps ops,
                          float* ln_out, int M, int C, int OC) {
    if (M <= FEW_ROWS_MAX) {
        linear_few_rows(out, inp, weight, bias, ops, M, C, OC);
        return;
    }
    if (ops.ln_weight != nullptr) {
        layernorm_forward(ln_out, nullptr, nullptr, nullptr, inp, nullptr, ops.ln_weight, ops.ln_bias, M, C);
        inp = ln_out;
    }
    matmul(out, weight, inp, bias, OC, M, C, true, false, 1.0f, ops.accumulate ? 1.0f : 0.0f);
    if (ops.gelu) { gelu_forward(out, out, (size_t)M * OC); }
}

// One position of each completion through the model at *position, then its next token sampled
// into model->inputs (the next step's input) and gen->tokens, and the position advanced. The
// residual stream (M, C) lives in acts.residual3, each layer adding its two projections in place.
static void gpt2_decode_step(GPT2* model, Generator* gen) {
    const ModelShape* c = &model->config;
    int M = gen->M, L = c->num_layers, NH = c->num_heads, C = c->channels;
    size_t layer_kv = (size_t)M * gen->max_T * 2 * C;
    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    float* residual = a.residual3;
    encoder_forward(residual, model->inputs, p.wte, p.wpe, gen->position, M, 1, C);
    for (int l = 0; l < L; l++) {
        decode_linear(a.qkv, residual, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C,
                      {p.ln1w + l * C, p.ln1b + l * C, false, false}, a.ln, M, C, 3 * C);
        attention_decode(a.atty, gen->partials, gen->counters, gen->kv + l * layer_kv, a.qkv, gen->position, M,
                         gen->max_T, NH, C / NH, c->attention);
        decode_linear(residual, a.atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, {nullptr, nullptr, false, true},
                      a.ln, M, C, C);
        decode_linear(a.fch_gelu, residual, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C,
                      {p.ln2w + l * C, p.ln2b + l * C, true, false}, a.ln, M, C, 4 * C);
        decode_linear(residual, a.fch_gelu, p.fcprojw + (size_t)l * 4 * C * C, p.fcprojb + l * C,
                      {nullptr, nullptr, false, true}, a.ln, M, 4 * C, C);
    }
    decode_linear(a.logits, residual, p.wte, nullptr, {p.lnfw, p.lnfb, false, false}, a.lnf, M, C,
                  c->padded_vocab_size);  // (M, Vp); a.ln shares its memory with the logits
    sample_kernel<<<M, SAMPLE_THREADS>>>(model->inputs, gen->tokens_device, a.logits, gen->sampling, gen->position,
                                         c->vocab_size, c->padded_vocab_size, gen->max_T);
    cudaCheck(cudaGetLastError());
    advance_position_kernel<<<1, 1>>>(gen->position);
    cudaCheck(cudaGetLastError());
}

// Queues a step (the same launches every time: the position and the tokens are on the device).
static void generator_queue_step(GPT2* model, Generator* gen) {
    gen->step.run(GraphKey{}, [&] { gpt2_decode_step(model, gen); });
}

// Queues the prompt (n >= 1 ids < V) for all M completions: its first n - 1 tokens through the
// forward pass into the cache, its last as the first step's input at position n - 1.
static void generator_start(GPT2* model, Generator* gen, const std::vector<int>& prompt, const SamplingParams* sp) {
    const ModelShape* c = &model->config;
    int n = (int)prompt.size(), M = gen->M;
    if (n < 1 || n >= gen->max_T) { fail("generation: a prompt of %d tokens leaves no room in %d positions", n, gen->max_T); }
    if (n > 1) {
        gpt2_upload_batch(model, prompt.data(), nullptr, 1, n - 1, false);
        model->B = 1;
        model->T = n - 1;
        model->grads_pending = false;
        gpt2_forward_layers(model, 1, n - 1);
        kv_cache_fill(gen->kv, model->acts.qkv, c->num_layers, M, n - 1, gen->max_T, c->channels);
    }
    cudaCheck(cudaStreamSynchronize(cudaStreamPerThread));  // gen->tokens is no longer being written
    std::vector<int> last(M, prompt[n - 1]);
    gpt2_upload_batch(model, last.data(), nullptr, M, 1, false);
    for (int m = 0; m < M; m++) { memcpy(gen->tokens + (size_t)m * gen->max_T, prompt.data(), n * sizeof(int)); }
    int position = n - 1;
    cudaCheck(cudaMemcpyAsync(gen->position, &position, sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpyAsync(gen->sampling, sp, sizeof(SamplingParams), cudaMemcpyHostToDevice));
}

// Runs up to max_new steps after generator_start with a prompt of n tokens, calling
// on_token(m, id) for each new token of every completion still going (one ends after eot) as soon
// as its step is done. Returns the steps run.
template <typename OnToken>
static int generator_run(GPT2* model, Generator* gen, int n, int max_new, int eot, OnToken on_token) {
    int steps = std::min(max_new, gen->max_T - n), queued = 0, live = gen->M;
    std::vector<bool> ended(gen->M, false);
    for (int step = 0; step < steps && live > 0; step++) {
        for (; queued < steps && queued < step + GENERATE_LOOKAHEAD; queued++) {
            generator_queue_step(model, gen);
            cudaCheck(cudaEventRecord(gen->step_done[queued % GENERATE_LOOKAHEAD], cudaStreamPerThread));
        }
        cudaCheck(cudaEventSynchronize(gen->step_done[step % GENERATE_LOOKAHEAD]));
        for (int m = 0; m < gen->M; m++) {
            if (ended[m]) { continue; }
            int id = gen->tokens[(size_t)m * gen->max_T + n + step];
            on_token(m, id);
            if (id == eot) {
                ended[m] = true;
                live--;
            }
        }
    }
    cudaCheck(cudaStreamSynchronize(cudaStreamPerThread));
    return queued;
}

// ----------------------------------------------------------------------------------------------
// Device setup

// Returns false when no CUDA device is usable (the tests then skip). The device is the one of
// this node's rank local_rank (device 0 where a launcher shows each process one GPU).
static bool cuda_setup(int precision, int local_rank = 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return false;
    }
    int device = count == 1 ? 0 : local_rank;
    if (device >= count) { fail("local rank %d has no GPU: this node shows %d GPUs", local_rank, count); }
    cudaCheck(cudaSetDevice(device));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 6) { fail("GPU %s has compute capability %d.%d; 6.0 or newer is needed", prop.name, prop.major, prop.minor); }
    g_num_sms = prop.multiProcessorCount;
    int built_arch;
    probe_built_code(&built_arch, &g_wgmma);
    g_pdl = built_arch >= 900;  // a compute_80 build on a Hopper or Blackwell must not overlap kernels it cannot order
    g_tf32_cores = built_arch >= 800;
    g_shared_limit = prop.sharedMemPerBlockOptin;
    int cap_kb = env_int("GPT2_TEST_SHARED_KB", SHARED_LIMIT_LEAST_KB, 1024, 0);
    if (cap_kb > 0) {  // said, so that a test can see the cap took effect on this process
        g_shared_limit = std::min(g_shared_limit, (size_t)cap_kb * 1024);
        printf("GPT2_TEST_SHARED_KB: the kernels planned for %zu KB of shared memory a block (this GPU: %zu KB)\n",
               g_shared_limit / 1024, (size_t)prop.sharedMemPerBlockOptin / 1024);
    }
    g_small_sm = std::min(prop.sharedMemPerMultiprocessor, g_shared_limit) <= 64 * 1024;
    snprintf(g_device_name, sizeof(g_device_name), "%s", prop.name);
    g_precision = g_tf32_cores ? (MatmulPrecision)precision : MATMUL_FP32;
    cublasCheck(cublasLtCreate(&g_cublaslt));
    g_cublaslt_workspace = device_malloc(CUBLASLT_WORKSPACE_SIZE, "cuBLASLt workspace");
    g_side_workspace = device_malloc(CUBLASLT_WORKSPACE_SIZE, "cuBLASLt workspace");
    int lowest_priority, highest_priority;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&lowest_priority, &highest_priority));
    cudaCheck(cudaStreamCreateWithPriority(&g_side_stream, cudaStreamNonBlocking, lowest_priority));
    return true;
}

static double wall_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifndef TESTING
// ----------------------------------------------------------------------------------------------
// Checkpoints: the folder's files and rules are llmc/checkpoint_dir.h's; rank 0's writer
// (llmc/checkpoint_writer.h) writes them atomically from a snapshot in host memory, in the
// background. Then the model a run starts from: a checkpoint's, or -e's.

// Page-locked host memory for the writer's snapshot, which the GPU copies into at full speed, or
// nullptr where the machine cannot lock that much. Allocated here and registered with CUDA (not
// cudaMallocHost), so that it stays mapped for a write in flight when the process exits (fail())
// and CUDA's teardown runs first.
static void* pinned_host_malloc(size_t bytes) {
    void* ptr = nullptr;
    if (posix_memalign(&ptr, 4096, bytes) != 0) { return nullptr; }
    if (cudaHostRegister(ptr, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        (void)cudaGetLastError();  // an allocation failure, not sticky: the run goes on without it
        free(ptr);
        return nullptr;
    }
    return ptr;
}

static void pinned_host_free(void* ptr) {
    cudaCheck(cudaHostUnregister(ptr));
    free(ptr);
}

// Every rank calls it (the owners' moments are gathered on rank 0, through the gradients' memory,
// free between steps); rank 0 copies the parameters, the moments and the run state into its
// writer's snapshot and starts the write. The write in flight, if any, has been waited for.
static void write_checkpoint(CheckpointWriter* writer, const TrainArgs* args, int step, const GPT2* model,
                             const DataLoader* loader) {
    size_t P = model->num_parameters;
    CheckpointSnapshot* s = g_comm.rank == 0 ? checkpoint_writer_snapshot(writer) : nullptr;
    size_t buffer_floats = std::min(P, (size_t)1 << 26);
    comm_gather_slices(&g_comm, model->m_memory, P, s ? s->m : nullptr, model->grads_memory, buffer_floats);
    comm_gather_slices(&g_comm, model->v_memory, P, s ? s->v : nullptr, model->grads_memory, buffer_floats);
    if (g_comm.rank != 0) { return; }
    cudaCheck(cudaMemcpy(s->params, model->params_memory, P * sizeof(float), cudaMemcpyDeviceToHost));
    StepStats stats;
    cudaCheck(cudaMemcpy(&stats, model->stats, sizeof(stats), cudaMemcpyDeviceToHost));
    s->config = model->config;
    s->state.step = step;
    s->state.adam_step = stats.adam_step;
    s->state.shape = args->shape;
    s->state.loader = dataloader_state(loader);
    s->state.recent_norms = stats.recent_norms;
    checkpoint_writer_start(writer, args->output_dir, step, args->checkpoint_keep);
}

// A checkpoint read back to resume from: the model and this rank's slice of the run state.
struct Checkpoint {
    ModelShape config;
    std::vector<float> params;  // in model-file order, until they are on the device
    RunState state;             // AdamW's m and v of this rank's ZeRO-1 shard
};

// Reads the newest checkpoint, at or before `latest`, whose model and state files are intact, each
// file once; each damaged one is named on the way. Fails if none is intact.
static void find_intact_checkpoint(const char* dir, Checkpoint* checkpoint) {
    std::string newest_problem;
    for (int step : checkpoint_resume_order(dir, checkpoint_read_latest(dir))) {
        ModelShape shape;
        std::string model_path = checkpoint_path(dir, "model", step), problem;
        if (model_file_load(model_path.c_str(), &shape, &checkpoint->params, &problem)) {
            size_t P = checkpoint->params.size();
            ZeroShard shard = zero_shard(P, g_comm.rank, g_comm.world);
            std::string state_path = checkpoint_path(dir, "state", step);
            if (state_file_load(state_path.c_str(), step, P, shard.begin, shard.end, &checkpoint->state, &problem)) {
                checkpoint->config = shape;
                validate_config(&checkpoint->config, model_path.c_str());
                return;
            }
        }
        printf0("checkpoint of step %d is damaged: %s; trying the one before\n", step, problem.c_str());
        if (newest_problem.empty()) { newest_problem = problem; }
    }
    fail("flag -y: no intact checkpoint in %s%s%s", dir, newest_problem.empty() ? "" : " (the newest: ",
         newest_problem.empty() ? "" : (newest_problem + ")").c_str());
}

// Restores the run state read from dir's checkpoint into model (built from its model file) and
// loader: Adam's step, the spike guard's window and this rank's slice of the AdamW moments.
static void load_run_state(const char* dir, const RunState* state, GPT2* model, const RunShape* current,
                           DataLoader* loader) {
    const char* flag = run_shape_mismatch(state->shape, *current);
    if (flag != nullptr) {
        fail("flag %s: differs from the run being resumed (%s); resume with the run's flags", flag,
             checkpoint_path(dir, "state", state->step).c_str());
    }
    StepStats restored = {};
    restored.adam_step = state->adam_step;
    restored.recent_norms = state->recent_norms;
    cudaCheck(cudaMemcpy(model->stats, &restored, sizeof(restored), cudaMemcpyHostToDevice));
    dataloader_restore(loader, &state->loader);
    size_t owned = state->m.size();  // model->shard's: both are zero_shard(P, rank, world)
    cudaCheck(cudaMemcpy(model->m_memory, state->m.data(), owned * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->v_memory, state->v.data(), owned * sizeof(float), cudaMemcpyHostToDevice));
}

// The model of the checkpoint resumed from (its host parameters freed once on the device), or -e's.
static void build_model(GPT2* model, const TrainArgs* args, Checkpoint* resume) {
    ModelShape config;
    std::string shape_problem;  // none: llmc/args.h checked the name
    const RunShape* r = &args->shape;
    if (resume != nullptr) {
        gpt2_build_from_parameters(model, &resume->config, resume->params);
        std::vector<float>().swap(resume->params);
    } else if (model_shape_by_name(args->model, &config, &shape_problem)) {
        config.attention = r->attention == ATTENTION_OF_MODEL ? ATTENTION_SOFTMAX : r->attention;
        gpt2_build_from_scratch(model, &config, r->seed);
    } else {
        if (!file_exists(args->model)) {
            fail("flag -e: '%s' is neither a model file, a Hugging Face model, one of %s nor %s", args->model,
                 model_shape_names(", ").c_str(), MODEL_SHAPE_FORM);
        }
        gpt2_build_from_file(model, args->model);
    }
    if (r->attention != ATTENTION_OF_MODEL && r->attention != model->config.attention) {
        fail("flag -A %s: the model uses %s attention", attention_name(r->attention),
             attention_name(model->config.attention));
    }
}

// ----------------------------------------------------------------------------------------------
// Between steps: the validation loss, multiple-choice evaluation (llmc/eval.h) and samples

// The mean loss over `rows` validation rows (llmc/dataloader.h's evaluation rows), the same bits
// on any number of GPUs: each rank scores its share of the rows in forward passes of the loader's
// B rows (one GPU's shape; a short pass repeats its last row), each row's losses are summed in
// position order, and the row sums, shared exactly, are added in row order.
static float validation_loss(GPT2* model, DataLoader* loader, int64_t rows) {
    int B = loader->B, T = loader->T;
    RowRange mine = split_rows(rows, g_comm.rank, g_comm.world);
    std::vector<double> row_sums((size_t)rows, 0.0);
    std::vector<float> losses((size_t)B * T);
    for (int64_t first = mine.begin; first < mine.end; first += B) {
        int count = (int)std::min<int64_t>(B, mine.end - first);
        dataloader_read_rows(loader, first, count);
        gpt2_forward(model, loader->inputs, loader->targets, B, T);
        cudaCheck(cudaMemcpy(losses.data(), model->acts.losses, losses.size() * sizeof(float), cudaMemcpyDeviceToHost));
        for (int r = 0; r < count; r++) {
            double sum = 0.0;
            for (int t = 0; t < T; t++) { sum += losses[(size_t)r * T + t]; }
            row_sums[(size_t)(first + r)] = sum;
        }
    }
    comm_sum_disjoint(&g_comm, row_sums.data(), row_sums.size());
    double total = 0.0;
    for (double sum : row_sums) { total += sum; }
    return (float)(total / ((double)rows * T));
}

// Multiple-choice evaluation: each batch of (context, ending) rows is one forward pass with
// targets, whose per-position losses (acts.losses) score the endings on the host.

// Loads --eval's file and plans this rank's batches of at most B x T tokens.
static void eval_prepare(const TrainArgs* args, const Tokenizer* tokenizer, int vocab_size, EvalSet* set,
                         std::vector<EvalBatch>* batches) {
    const RunShape* r = &args->shape;
    std::string error;
    if (!eval_load(args->eval_path, tokenizer, vocab_size, r->T, set, &error) ||
        !eval_plan(*set, (size_t)r->B * r->T, g_comm.rank, g_comm.world, batches, &error)) {
        fail("flag --eval: %s", error.c_str());
    }
    printf0("eval: %zu examples from %s", set->examples.size(), args->eval_path);
    if (set->skipped_empty + set->skipped_long > 0) { printf0(", skipped %s", eval_skip_reasons(*set).c_str()); }
    if (set->truncated > 0) { printf0(", %d with contexts cut from the left to fit T = %d", set->truncated, r->T); }
    printf0("\n");
}

// Scores the set, prints and logs the accuracy (s:STEP eval:ACCURACY) and writes --eval-report.
static void evaluate(GPT2* model, const TrainArgs* args, const EvalSet* set, const std::vector<EvalBatch>& batches,
                     int step, RunLog* log) {
    double start = wall_seconds();
    std::vector<EvalLosses> losses(set->examples.size(), EvalLosses{});
    std::vector<float> row_losses;
    for (const EvalBatch& b : batches) {
        gpt2_forward(model, b.inputs.data(), b.targets.data(), b.rows, b.T);
        row_losses.resize((size_t)b.rows * b.T);
        cudaCheck(cudaMemcpy(row_losses.data(), model->acts.losses, row_losses.size() * sizeof(float),
                             cudaMemcpyDeviceToHost));
        eval_score_batch(b, row_losses.data(), &losses);
    }
    comm_sum_disjoint(&g_comm, losses.data()->data(), losses.size() * EVAL_ENDINGS);  // each example scored on one rank
    EvalResult result = eval_result(*set, losses);
    printf0("eval: accuracy %.4f (%d/%d) at step %d in %.2f s\n", result.accuracy(), result.correct, result.evaluated,
            step, wall_seconds() - start);
    log_eval(log, step, result.accuracy());
    if (args->eval_report != nullptr && g_comm.rank == 0) { eval_write_report(args->eval_report, *set, losses, result); }
}

// A training sample: up to num_tokens after <|endoftext|> at temperature 1, keyed on the step;
// prints it and returns its text.
static std::string print_sample(GPT2* model, Generator* gen, const Tokenizer* tokenizer, uint64_t seed,
                                int num_tokens) {
    SamplingParams sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed};
    int eot = (int)tokenizer->eot_token;
    generator_start(model, gen, std::vector<int>{eot}, &sampling);
    Utf8Printer utf8;
    std::string text;
    generator_run(model, gen, 1, num_tokens, eot, [&](int, int id) {
        if (id != eot) { utf8.append_token(tokenizer, id, &text); }
    });
    utf8.finish(&text);
    printf("generated: ");
    fwrite(text.data(), 1, text.size(), stdout);
    printf("\n");
    return text;
}

// ----------------------------------------------------------------------------------------------
// The training loop: Run holds a run's state; main calls run_init, then per step run_periodic
// (what is due between steps), run_step (queued on the GPU) and run_report (the step before).

// Appends "| name | value |" to the configuration table, the value formatted as by printf.
static void table_row(std::string* table, const char* name, const char* fmt, ...) {
    char value[256], row[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(value, sizeof(value), fmt, args);
    va_end(args);
    snprintf(row, sizeof(row), "| %-22s | %-52s |\n", name, value);
    *table += row;
}

// Device time of the phases of the steps so far: events around each forward, backward and update,
// and around the update's waits for communication (several GPUs), one set for each of the two
// steps in flight (slots 0 and 1). exposed_comm_ms adds, with the overlap, the passes' own waits
// for the moves (DataParallel's wait_marks).
struct PhaseTimes {
    std::vector<cudaEvent_t> marks[2];  // start, then after each forward and backward, then after the update
    std::vector<cudaEvent_t> comm_marks[2];  // gpt2_update's comm_marks (several GPUs)
    double forward_ms, backward_ms, update_ms, exposed_comm_ms;
};

static void phase_times_init(PhaseTimes* times, int micro_steps) {
    *times = PhaseTimes();
    for (int slot = 0; slot < 2; slot++) {
        times->marks[slot].resize(2 * micro_steps + 2);
        times->comm_marks[slot].resize(g_comm.world > 1 ? 6 : 0);
        for (std::vector<cudaEvent_t>* marks : {&times->marks[slot], &times->comm_marks[slot]}) {
            for (cudaEvent_t& mark : *marks) { cudaCheck(cudaEventCreate(&mark)); }
        }
    }
}

// Adds the phases of the step in the slot (its events have completed).
static void phase_times_add(PhaseTimes* times, int slot) {
    const std::vector<cudaEvent_t>& marks = times->marks[slot];
    for (size_t i = 0; i + 1 < marks.size(); i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, marks[i], marks[i + 1]));
        *(i + 2 == marks.size() ? &times->update_ms : i % 2 == 0 ? &times->forward_ms : &times->backward_ms) += ms;
    }
    const std::vector<cudaEvent_t>& comm_marks = times->comm_marks[slot];
    for (size_t i = 0; i + 1 < comm_marks.size(); i += 2) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, comm_marks[i], comm_marks[i + 1]));
        times->exposed_comm_ms += ms;
    }
}

// A training run: the model, the data, and the bookkeeping of the steps in flight.
struct Run {
    TrainArgs args;
    GPT2 model;
    DataLoader train_loader, val_loader;
    Tokenizer tokenizer;
    Generator sampler;   // rank 0's, for the samples every -s steps (sampler.M = 0: none)
    EvalSet eval_set;    // --eval's examples, and this rank's batches of them
    std::vector<EvalBatch> eval_batches;
    RunLog log;          // rank 0's main.log and TensorBoard events (other ranks: none)
    int start_step;
    int micro_steps;     // this rank's micro-steps per optimizer step
    std::string overlap_why;  // --overlap's decision (model.dp.overlap) and why, for the configuration table
    int64_t val_rows;    // validation rows, split over the ranks (validation_loss)
    float peak_tflops;   // one GPU's, for MFU
    double flops_per_step;
    PhaseTimes phases;
    // Steps are pipelined: step s + 1 is queued before the host waits for step s's loss, so the GPU
    // does not idle while the host loads a batch, logs and launches. A step's time is the GPU's,
    // from the step's first event (when the GPU could start it: queued, and the work before it
    // done) to its last, so accumulation and pipelining cannot move time between steps' lines.
    int pending;  // the queued step not yet reported, or -1
    int skips_in_a_row;   // updates skipped since the last applied one
    bool stop_requested;  // a signal: the next step is the last
    cudaEvent_t first_step_end;  // the end of the process's first step, untimed (one-time setup)
    double timed_seconds;        // the steps after it, summed
    int timed_steps, last_step;
    cudaEvent_t periodic_marks[2];  // around run_periodic's work between two steps
    double periodic_ms;             // that work's time after the first step, summed
    CheckpointWriter writer;        // rank 0's, with -o: checkpoints written beside the steps
};

// Where rank 0's TensorBoard events go, or why there are none.
static const char* tensorboard_destination(const Run* run) {
    if (run->log.events.file != nullptr) { return run->log.events.path.c_str(); }
    if (run->args.output_dir == nullptr) { return "off (no -o)"; }
    return run->args.tensorboard ? "off (the event file could not be created)" : "off (--tensorboard 0)";
}

// How rank 0 writes checkpoints, for the configuration table.
static std::string checkpoint_writes(const Run* run) {
    double snapshot_gb = 3.0 * run->model.num_parameters * sizeof(float) / 1e9;
    char text[128];
    if (run->args.output_dir == nullptr) {
        snprintf(text, sizeof(text), "none (no -o)");
    } else if (run->writer.background) {
        snprintf(text, sizeof(text), "in the background, %.2f GB pinned host snapshot", snapshot_gb);
    } else if (run->args.checkpoint_sync) {
        snprintf(text, sizeof(text), "synchronous (--checkpoint-sync 1)");
    } else {
        snprintf(text, sizeof(text), "synchronous: no %.2f GB of pinned host memory", snapshot_gb);
    }
    return text;
}

// The configuration table, as the console shows it and TensorBoard's text "config" holds it.
static std::string run_config_table(const Run* run, int val_B) {
    const ModelShape* c = &run->model.config;
    const TrainArgs* args = &run->args;
    const RunShape* r = &args->shape;
    const char* rule = "+------------------------+------------------------------------------------------+\n";
    std::string table = rule;
    table_row(&table, "model", "%s (L=%d NH=%d C=%d maxT=%d V=%d Vp=%d)", args->model, c->num_layers,
              c->num_heads, c->channels, c->max_seq_len, c->vocab_size, c->padded_vocab_size);
    table_row(&table, "parameters", "%zu", run->model.num_parameters);
    table_row(&table, "attention", "%s", attention_name(c->attention));
    table_row(&table, "train data", "%s (%zu batches/epoch)", args->train_pattern.c_str(),
              dataloader_batches_per_epoch(&run->train_loader));
    table_row(&table, "val data", "%s (%lld batches of B=%d, %lld rows split over %d GPU%s)",
              args->val_pattern.c_str(), (long long)(run->val_rows / val_B), val_B, (long long)run->val_rows,
              g_comm.world, g_comm.world > 1 ? "s" : "");
    table_row(&table, "GPUs", "%d (%s)", g_comm.world,
              g_comm.world > 1 ? "NCCL, ZeRO-1 optimizer shards" : "one process");
    table_row(&table, "overlap", "%s", run->overlap_why.c_str());
    table_row(&table, "batch per GPU", "B=%d T=%d x %d micro-steps", r->B, r->T, run->micro_steps);
    table_row(&table, "batch", "%d micro-batches = %lld tokens per step", r->micro_batches,
              (long long)args->total_batch_tokens);
    table_row(&table, "steps", "%d", r->max_steps);
    table_row(&table, "learning rate", "%g, warmup %d, %s to %g x", r->lr, r->warmup_steps,
              schedule_name(r->schedule), r->final_lr_frac);
    table_row(&table, "AdamW", "beta1 %g beta2 %g eps %g weight decay %g", r->beta1, r->beta2, r->eps,
              r->weight_decay);
    table_row(&table, "gradient clipping", r->grad_clip > 0.0f ? "global norm %g" : "off", r->grad_clip);
    table_row(&table, "matmul precision", "%s%s", precision_name(g_precision),
              g_tf32_cores ? "" : ", every -f: no TF32 tensor cores in this GPU or build");
    table_row(&table, "matrix products", "cuBLASLt%s",
              gemm_tf32_takes_model(c)    ? "; fc + GELU and the LM head's logits: gemm_tf32 (TMA, wgmma)"
              : gemm_split_takes_model(c) ? "; split TF32: gemm_split_tf32 (TMA, wgmma)"
                                          : "");
    std::string attention_path = flash_path_name(c->channels / c->num_heads, g_precision != MATMUL_TF32);
    table_row(&table, "attention kernels", "%s", attention_path.c_str());
    table_row(&table, "seed", "%llu", (unsigned long long)r->seed);
    table_row(&table, "output", "%s", args->output_dir ? args->output_dir : "(none)");
    table_row(&table, "checkpoint writes", "%s", checkpoint_writes(run).c_str());
    table_row(&table, "TensorBoard", "%s", tensorboard_destination(run));
    table_row(&table, "GPU", "%s, TF32 peak %s", g_device_name,
              run->peak_tflops > 0 ? "known" : "unknown (--peak-tflops)");
    const ZeroShard* shard = &run->model.shard;
    table_row(&table, "optimizer memory", "%.3f GB per GPU (AdamW m, v of %zu parameters)",
              2.0 * (shard->end - shard->begin) * sizeof(float) / 1e9, shard->end - shard->begin);
    table_row(&table, "activation memory", "%.2f GiB%s", run->model.num_activations * 4.0 / 1073741824.0,
              run->model.recompute_residual2 ? " (residual2 recomputed, -r 1)" : "");
    return table + rule;
}

// -y 1's checkpoint, read into *checkpoint: its step, or -1 to start from scratch when no checkpoint
// in -o DIR was ever complete (a job killed before its first and requeued with the same command).
// Checkpoints that exist but are all damaged stop the run (find_intact_checkpoint).
static int find_resume_step(const TrainArgs* args, Checkpoint* checkpoint) {
    if (!args->resume) { return -1; }
    if (!checkpoint_ever_completed(args->output_dir)) {
        printf0("-y 1: no checkpoint in %s was ever completed: starting from scratch\n", args->output_dir);
        return -1;
    }
    find_intact_checkpoint(args->output_dir, checkpoint);
    return checkpoint->state.step;
}

// This rank's training and validation data (the model built); returns the validation batch size.
static int run_init_data(Run* run) {
    RunShape* r = &run->args.shape;
    const TrainArgs* args = &run->args;
    int world = g_comm.world, vocab_size = run->model.config.vocab_size;
    run->micro_steps = r->micro_batches / world;
    dataloader_init(&run->train_loader, args->train_pattern.c_str(), r->B, r->T, g_comm.rank, world, run->micro_steps, false,
                    r->seed, vocab_size);
    // validation: the rows of one GPU's -m batches (all with -m 0), whatever the number of GPUs
    int val_B = std::min(r->B, dataloader_max_batch(args->val_pattern.c_str(), r->T, 1));
    if (val_B < 1) { fail("flag -j: %s has a shard with fewer than T+1 = %d tokens", args->val_pattern.c_str(), r->T + 1); }
    dataloader_init(&run->val_loader, args->val_pattern.c_str(), val_B, r->T, 0, 1, 1, false, r->seed, vocab_size);
    int64_t val_per_epoch = (int64_t)dataloader_batches_per_epoch(&run->val_loader);
    run->val_rows = val_B * (args->val_batches == 0 ? val_per_epoch : std::min<int64_t>(args->val_batches, val_per_epoch));
    if (r->max_steps < 0) {
        r->max_steps = std::max<int>(1, dataloader_batches_per_epoch(&run->train_loader));
    }
    return val_B;
}

// Whether this rank's GPU reaches the memory of the GPUs of the run's other ranks on its host
// (places: every rank's). One this process cannot see counts as reached, as NCCL's p2pCanConnect
// counts it (CUDA 10.1 and later reach invisible devices).
static bool peer_access_on_host(const std::vector<GpuPlace>& places) {
    const GpuPlace* mine = &places[g_comm.rank];
    int device;
    cudaCheck(cudaGetDevice(&device));
    bool reached = true;
    for (const GpuPlace& other : places) {
        int other_device, can = 1;
        if (other.host != mine->host || strcmp(other.bus_id, mine->bus_id) == 0) { continue; }
        if (cudaDeviceGetByPCIBusId(&other_device, other.bus_id) == cudaSuccess) {
            cudaCheck(cudaDeviceCanAccessPeer(&can, device, other_device));
        } else {
            (void)cudaGetLastError();  // not visible here (CUDA_VISIBLE_DEVICES): the error cleared
        }
        reached = reached && can;
    }
    return reached;
}

// --overlap's decision (llmc/overlap.h), made once from every rank's view of the link (its GPU's
// peer access to the run's other GPUs on its host, its NCCL switches, its RDMA devices), so the
// same on every rank.
static void run_choose_overlap(Run* run) {
    std::vector<GpuPlace> places = comm_gpu_places(&g_comm);
    LinkView mine = link_view(places[g_comm.rank].host, peer_access_on_host(places),
                              nccl_link_switches_from_environment(), rdma_device_present());
    std::vector<LinkView> views(g_comm.world);
    comm_all_gather_to_host(&g_comm, &mine, views.data(), sizeof(mine), "the links the ranks see");
    Link link = overlap_run_link(views.data(), g_comm.world);
    OverlapChoice choice = overlap_choose(run->args.overlap, g_comm.world, link);
    comm_check_same(&g_comm, choice.on, "the overlap decisions (--overlap)");
    run->overlap_why = choice.why;
    GPT2* model = &run->model;
    dp_plan(&model->dp, choice.on, model->param_sizes, model->num_parameters, model->config.num_layers);
}

// Restores the checkpoint resumed from (nullptr: none), saying so in the console and main.log; a
// -y 1 run that found none logs its start from scratch.
static void run_restore(Run* run, const Checkpoint* resume) {
    const TrainArgs* args = &run->args;
    if (resume == nullptr) {
        if (args->resume) { log_restarted(&run->log); }
        return;
    }
    int step = resume->state.step, world = g_comm.world;
    load_run_state(args->output_dir, &resume->state, &run->model, &args->shape, &run->train_loader);
    run->start_step = step;
    printf0("resumed from %s at step %d on %d GPU%s\n", args->output_dir, step, world, world > 1 ? "s" : "");
    log_resumed(&run->log, step, world);
}

// Rank 0's checkpoint writer, with -o: in the background from pinned host memory, unless
// --checkpoint-sync 1 or the memory cannot be had (one line says so). GPT2_TEST_CHECKPOINT_DELAY_MS,
// a test switch, pauses the writer before each file, so that fault tests land during a write.
static void run_init_writer(Run* run) {
    const TrainArgs* args = &run->args;
    if (args->output_dir == nullptr || g_comm.rank != 0) { return; }
    size_t P = run->model.num_parameters;
    int delay_ms = env_int("GPT2_TEST_CHECKPOINT_DELAY_MS", 0, 60000, 0);
    bool background = checkpoint_writer_init(&run->writer, P, args->checkpoint_sync == 0,
                                             {pinned_host_malloc, pinned_host_free}, delay_ms);
    if (!background && args->checkpoint_sync == 0) {
        printf0("checkpoints written synchronously (the GPU waits): no pinned host memory for their %.2f GB snapshot\n",
                3.0 * P * sizeof(float) / 1e9);
    }
}

// The kernels this GPU computes the model with: the products' precision and whether our GEMM takes
// its shapes, and the attention's plan. Every rank must run the same ones for its gradients to have
// the bits of one GPU's, so the ranks compare this hash; GPUs that differ only in what no plan
// uses (a larger shared-memory limit, more multiprocessors) agree.
static uint64_t kernel_paths_fingerprint(const ModelShape* c) {
    FlashPlan plan = flash_plan(c->channels / c->num_heads, g_precision != MATMUL_TF32);
    uint32_t paths[] = {(uint32_t)g_precision, g_tf32_cores, gemm_tf32_takes_model(c), gemm_split_takes_model(c),
                        plan.tensor_cores, plan.wgmma, (uint32_t)plan.dq_keys, (uint32_t)plan.dkdv_queries,
                        plan.fp32_small_sm};
    return fnv1a(FNV1A_OFFSET, paths, sizeof(paths) / sizeof(paths[0]));
}

// Joins the run (its GPU, its rank), builds the model and the data, restores a checkpoint.
static void run_init(Run* run, const LaunchInfo* me, const TrainArgs& parsed) {
    *run = Run();
    TrainArgs* args = &run->args;
    *args = parsed;
    signals_install();
    RunShape* r = &args->shape;
    if (!cuda_setup(r->precision, me->local_rank)) {
        fail("no CUDA GPU found: training needs an NVIDIA GPU of compute capability 6.0+");
    }
    comm_init(&g_comm, me, args->rendezvous_dir);
    if (args->output_dir != nullptr && g_comm.rank == 0) {
        int removed = remove_stale_temp_files(args->output_dir);
        if (removed > 0) { printf0("removed %d temporary files of killed writers from %s\n", removed, args->output_dir); }
    }
    Checkpoint resume;  // read once, when resuming
    int resume_step = find_resume_step(args, &resume);
    GPT2* model = &run->model;
    build_model(model, args, resume_step >= 0 ? &resume : nullptr);
    gpt2_reset_step_stats(model, r->spike_window);
    const ModelShape* c = &model->config;
    r->attention = c->attention;
    if (r->T > c->max_seq_len) { fail("flag -t: sequence length %d exceeds the model's maxT %d", r->T, c->max_seq_len); }

    int val_B = run_init_data(run);
    run_choose_overlap(run);
    tokenizer_init(&run->tokenizer, args->tokenizer.c_str());
    comm_check_same(&g_comm, run_fingerprint(r, c, &run->train_loader, &run->val_loader, resume_step),
                    "the flags, model or data");
    comm_check_same(&g_comm, kernel_paths_fingerprint(c),
                    "the kernels the GPUs run (products' precision, our GEMM, attention plan; the configuration table's rows)");
    bool logs = args->output_dir != nullptr && g_comm.rank == 0;
    if (logs) { run->log = run_log_open(args->output_dir, args->resume, args->force, args->tensorboard); }
    log_tokens_per_step(&run->log, args->total_batch_tokens);
    run_restore(run, resume_step >= 0 ? &resume : nullptr);
    model->recompute_residual2 = args->recompute;
    gpt2_allocate_activations(model, r->B, r->T);
    bool samples = args->sample_every > 0 && args->gen_tokens > 0 && g_comm.rank == 0;
    if (samples && run->tokenizer.eot_token >= (uint32_t)c->vocab_size) {
        printf0("samples off: the model's vocabulary of %d has no <|endoftext|> (%u) to start from\n", c->vocab_size,
                run->tokenizer.eot_token);
        samples = false;
    }
    if (samples) { generator_init(&run->sampler, model, 1, std::min(args->gen_tokens + 1, c->max_seq_len)); }
    if (args->eval_path != nullptr) { eval_prepare(args, &run->tokenizer, c->vocab_size, &run->eval_set, &run->eval_batches); }
    run->peak_tflops = args->peak_tflops > 0 ? args->peak_tflops : tf32_peak_tflops(g_device_name);
    run_init_writer(run);
    std::string config = run_config_table(run, val_B);
    printf0("%s", config.c_str());
    log_config(&run->log, run->start_step, config);
    run->flops_per_step =
        (6.0 * model->num_parameters + 6.0 * c->num_layers * r->T * c->channels) * (double)args->total_batch_tokens;
    phase_times_init(&run->phases, run->micro_steps);
    cudaCheck(cudaEventCreate(&run->first_step_end));
    for (cudaEvent_t& mark : run->periodic_marks) { cudaCheck(cudaEventCreate(&mark)); }
    run->pending = -1;
}

// One optimizer step over this rank's micro-batches, queued on the GPU without waiting; its
// loss (over all ranks) and norm are queued into stats slot step % 2.
static void run_step(Run* run, int step) {
    GPT2* model = &run->model;
    const RunShape* r = &run->args.shape;
    int slot = step % 2;
    const std::vector<cudaEvent_t>& marks = run->phases.marks[slot];
    cudaCheck(cudaEventRecord(marks[0]));
    if (signals_pending() != 0) { *model->stop_request = 1.0f; }
    gpt2_reset_loss(model);
    for (int micro = 0; micro < run->micro_steps; micro++) {
        if (!r->overfit_single_batch || (step == 0 && micro == 0)) { dataloader_next_batch(&run->train_loader); }
        bool last = micro == run->micro_steps - 1;
        gpt2_begin_micro_step(model, micro, last);
        // the waits for the moves: the first forward's (the parameters), the last backward's (its sends)
        dp_time_waits(&model->dp, micro == 0 ? slot : -1);
        gpt2_forward(model, run->train_loader.inputs, run->train_loader.targets, r->B, r->T,
                     1.0f / r->micro_batches, true);
        cudaCheck(cudaEventRecord(marks[2 * micro + 1]));
        dp_time_waits(&model->dp, last ? slot : -1);
        gpt2_backward(model);
        dp_time_waits(&model->dp, -1);
        gpt2_end_micro_step(model);
        cudaCheck(cudaEventRecord(marks[2 * micro + 2]));
    }
    if (step == run->args.debug_nan_step) { cudaCheck(cudaMemsetAsync(model->grads_memory, 0xff, sizeof(float))); }
    std::vector<cudaEvent_t>& comm_marks = run->phases.comm_marks[slot];
    gpt2_update(model, learning_rate(r, step), r->beta1, r->beta2, r->eps, r->weight_decay, r->grad_clip,
                r->spike_z, comm_marks.empty() ? nullptr : comm_marks.data());
    cudaCheck(cudaEventRecord(marks.back()));
    if (step == run->start_step) { cudaCheck(cudaEventRecord(run->first_step_end)); }
    gpt2_queue_stats(model, slot);
}

// Waits for the pending step and reports it (rank 0: console and main.log).
// A skipped update is logged; max_skips of them in a row end the run. A stop request (a signal on
// some rank) makes the next step the last: every rank reads the same numbers, so all stop there.
static void run_guard(Run* run, int step, const StepStats* stats) {
    run->stop_requested |= stats->stop_requested != 0;
    if (stats->skipped == SKIP_NONE) {
        run->skips_in_a_row = 0;
        return;
    }
    char why[64];
    if (stats->skipped == SKIP_SPIKE) {
        snprintf(why, sizeof(why), "norm spike (z %.1f > %g)", stats->norm_z, run->args.shape.spike_z);
    } else {
        snprintf(why, sizeof(why), "non-finite %s", isfinite(stats->loss) ? "norm" : "loss");
    }
    printf0("s:%d skipped: %s\n", step, why);
    log_skipped(&run->log, step, why, step + 1 - stats->adam_step);  // steps 0..step, less the updates applied
    if (++run->skips_in_a_row >= run->args.max_skips) {
        fail("step %d: %d updates in a row skipped, the last for a %s: the run diverged (lower -l, or resume from "
             "an earlier checkpoint)", step + 1, run->skips_in_a_row, why);
    }
}

static void run_report(Run* run) {
    if (run->pending < 0) { return; }
    int step = run->pending, slot = step % 2;
    const RunShape* r = &run->args.shape;
    run->pending = -1;
    const StepStats* stats = gpt2_wait_stats(&run->model, slot);
    float loss = stats->loss, grad_norm = stats->grad_norm;
    float step_ms;
    cudaCheck(cudaEventElapsedTime(&step_ms, run->phases.marks[slot].front(), run->phases.marks[slot].back()));
    double seconds = step_ms / 1e3;
    run->last_step = step;
    if (step > run->start_step) {  // the first step of a process includes one-time setup
        run->timed_seconds += seconds;
        run->timed_steps++;
        phase_times_add(&run->phases, slot);
        if (!run->model.dp.wait_marks[slot].empty()) {
            run->phases.exposed_comm_ms += dp_waited_ms(&run->model.dp, slot);  // the passes' own waits
        }
    }
    double mean_seconds = run->timed_steps > 0 ? run->timed_seconds / run->timed_steps : seconds;
    double peak = run->peak_tflops * 1e12 * g_comm.world;
    double mfu = peak > 0 ? 100.0 * run->flops_per_step / seconds / peak : 0.0;
    double eta_minutes = (r->max_steps - step - 1) * mean_seconds / 60.0;
    double tokens = (double)run->args.total_batch_tokens;
    float lr = learning_rate(r, step);
    printf0("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.2f ms | %.0f tok/s | MFU %.1f%% | ETA %.1f min\n",
            step + 1, r->max_steps, loss, lr, grad_norm, seconds * 1e3, tokens / seconds, mfu, eta_minutes);
    log_step(&run->log, {.step = step, .loss = loss, .lr = lr, .grad_norm = grad_norm, .ms = seconds * 1e3,
                         .tokens_per_second = tokens / seconds, .mfu_percent = mfu});
    run_guard(run, step, stats);
}

// Reports a finished checkpoint write (rank 0; done->step -1: none): its time, or the failure it
// ended in, with which the run stops as when the write was synchronous (`latest` still names the
// previous checkpoint, intact).
static void run_checkpoint_written(Run* run, const CheckpointResult& done) {
    if (done.step < 0) { return; }
    if (!done.error.empty()) { fail("%s", done.error.c_str()); }
    bool background = run->writer.background;
    printf0("checkpoint at step %d: written in %.2f s%s\n", done.step, done.seconds, background ? " in the background" : "");
    log_checkpoint_written(&run->log, done.step, done.seconds, background);
    remove_stale_temp_files(run->args.output_dir);  // of killed writers: no atomic write of this process is open
}

// The write that finished since the last step, if any.
static void run_checkpoint_poll(Run* run) {
    CheckpointResult done;
    if (checkpoint_writer_poll(&run->writer, &done)) { run_checkpoint_written(run, done); }
}

// The checkpoint of `step` (every rank): waits for the write in flight, copies the state to rank 0's
// snapshot and starts its write. The GPU stalls for that time, which is reported.
static void run_checkpoint(Run* run, int step) {
    double start = wall_seconds();
    CheckpointResult previous;
    double waited_ms = checkpoint_writer_wait(&run->writer, &previous) * 1e3;
    run_checkpoint_written(run, previous);
    write_checkpoint(&run->writer, &run->args, step, &run->model, &run->train_loader);
    double stall_ms = (wall_seconds() - start) * 1e3;
    printf0("checkpoint at step %d: the GPU stalled %.1f ms", step, stall_ms);
    if (waited_ms >= 0.1) { printf0(", %.1f ms of it waiting for the previous write", waited_ms); }
    printf0("\n");
    log_checkpoint_stall(&run->log, step, stall_ms);
    run_checkpoint_poll(run);  // a synchronous write is done
}

// What is due before step `step` (or at the end): the report of the step in flight, a finished
// checkpoint write, a checkpoint, the validation loss, a sample. Every rank takes the same
// decisions. At the end, the write in flight finishes before the process exits.
static void run_periodic(Run* run, int step, bool last_step) {
    const TrainArgs* args = &run->args;
    GPT2* model = &run->model;
    run_checkpoint_poll(run);
    bool checkpoint_due = args->output_dir != nullptr && step > run->start_step &&
                          (last_step || (args->checkpoint_every > 0 && step % args->checkpoint_every == 0));
    bool val_due = args->val_every > 0 && run->val_rows > 0 && (step % args->val_every == 0 || last_step);
    bool sample_due = args->sample_every > 0 && args->gen_tokens > 0 && step > 0 &&
                      (step % args->sample_every == 0 || last_step);
    bool eval_due = args->eval_path != nullptr && (last_step || (args->eval_every > 0 && step % args->eval_every == 0 && step > 0));
    if (!(checkpoint_due || val_due || sample_due || eval_due || last_step)) { return; }
    run_report(run);
    dp_join(&model->dp);  // all parameters are in, for the host and for the work below
    bool timed = step > run->start_step && !last_step;  // between two steps that the step times span
    if (timed) { cudaCheck(cudaEventRecord(run->periodic_marks[0])); }
    if (checkpoint_due) { run_checkpoint(run, step); }
    if (val_due) {
        float val_loss = validation_loss(model, &run->val_loader, run->val_rows);
        printf0("step %d: val loss %.6f\n", step, val_loss);
        log_val_loss(&run->log, step, val_loss);
    }
    if (eval_due) { evaluate(model, args, &run->eval_set, run->eval_batches, step, &run->log); }
    if (sample_due && run->sampler.M > 0) {
        log_sample(&run->log, step,
                   print_sample(model, &run->sampler, &run->tokenizer, args->shape.seed + step, args->gen_tokens));
    }
    if (timed) {
        float ms;
        cudaCheck(cudaEventRecord(run->periodic_marks[1]));
        comm_wait(&g_comm, run->periodic_marks[1]);
        cudaCheck(cudaEventElapsedTime(&ms, run->periodic_marks[0], run->periodic_marks[1]));
        run->periodic_ms += ms;
    }
    if (last_step) {
        CheckpointResult done;
        checkpoint_writer_wait(&run->writer, &done);
        run_checkpoint_written(run, done);
    }
    if (last_step && run->stop_requested) {
        if (checkpoint_due) {
            printf0("stopped by a signal after step %d: checkpoint %s/model_%08d.bin; resume with the same flags and "
                    "-y 1 (exit status %d)\n", step, args->output_dir, step, EXIT_PREEMPTED);
        } else {
            printf0("stopped by a signal after step %d, no checkpoint written (%s; exit status %d)\n", step,
                    args->output_dir == nullptr ? "no -o" : "none since the start", EXIT_PREEMPTED);
        }
    }
}

static void run_finish(Run* run) {
    const PhaseTimes* phases = &run->phases;
    int n = run->timed_steps;
    if (n > 0) {
        printf0("average step: %.2f ms (forward %.2f, backward %.2f, update %.2f ms on the GPU)\n",
                run->timed_seconds / n * 1e3, phases->forward_ms / n, phases->backward_ms / n, phases->update_ms / n);
        if (g_comm.world > 1) { printf0("exposed communication: %.2f ms per step\n", phases->exposed_comm_ms / n); }
        float run_ms;  // what the step lines must add up to: from the first timed step to the last step's end
        cudaCheck(cudaEventElapsedTime(&run_ms, run->first_step_end, run->phases.marks[run->last_step % 2].back()));
        printf0("step times: %d steps, %.2f ms summed, %.2f ms wall clock (the GPU's, less checkpoints, validation, "
                "evaluation and samples)\n", n, run->timed_seconds * 1e3, run_ms - run->periodic_ms);
    }
    printf0("GPU memory allocated: %.3f GB\n", g_device_bytes / 1e9);
    if (g_comm.rank == 0) { printf("weights checksum: %016llx\n", (unsigned long long)gpt2_weights_checksum(&run->model)); }
    run_log_close(&run->log);
    tokenizer_free(&run->tokenizer);
    if (run->sampler.M > 0) { generator_free(&run->sampler); }
    dataloader_free(&run->train_loader);
    dataloader_free(&run->val_loader);
    checkpoint_writer_free(&run->writer);
    gpt2_free(&run->model);
    comm_free(&g_comm);
}

// ----------------------------------------------------------------------------------------------
// main: training, or --prompt's generation, or --eval on its own (-x 0)

// --prompt: prints the completions, the first as it is generated, and the speed.
static void generate_main(const TrainArgs* args) {
    if (!cuda_setup(args->shape.precision)) { fail("no CUDA GPU found: generation needs an NVIDIA GPU"); }
    GPT2 model;
    build_model(&model, args, nullptr);
    const ModelShape* c = &model.config;
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, args->tokenizer.c_str());
    std::vector<int> prompt = encode_prompt(args->prompt, args->prompt_file, &tokenizer, c->vocab_size);
    int n = (int)prompt.size(), M = args->batch_samples, eot = (int)tokenizer.eot_token;
    if (n >= c->max_seq_len) {
        fail("flag --prompt: %d tokens leave no room to generate within the model's maxT of %d", n, c->max_seq_len);
    }
    gpt2_allocate_activations(&model, 1, std::max(n - 1, M));
    Generator gen;
    generator_init(&gen, &model, M, std::min(c->max_seq_len, n + args->gen_new));

    double start = wall_seconds();
    SamplingParams sampling = {args->temperature, args->top_k, args->top_p, args->shape.seed};
    generator_start(&model, &gen, prompt, &sampling);
    cudaCheck(cudaStreamSynchronize(cudaStreamPerThread));
    double prefilled = wall_seconds(), first_step = 0.0;
    std::vector<std::vector<int>> completions(M);
    Utf8Printer printer;
    for (int id : prompt) {
        if (id != eot) { printer.print_token(&tokenizer, id, stdout); }
    }
    int steps = generator_run(&model, &gen, n, args->gen_new, eot, [&](int m, int id) {
        if (first_step == 0.0) { first_step = wall_seconds(); }
        completions[m].push_back(id);
        if (m == 0 && id != eot) { printer.print_token(&tokenizer, id, stdout); }
    });
    double done = wall_seconds();
    printer.finish(stdout);
    printf("\n");
    for (int m = 1; m < M; m++) {
        printf("--- completion %d\n", m);
        Utf8Printer completion;
        for (int id : completions[m]) {
            if (id != eot) { completion.print_token(&tokenizer, id, stdout); }
        }
        completion.finish(stdout);
        printf("\n");
    }
    for (int m = 0; m < M && args->show_ids; m++) {
        printf("ids %d:", m);
        for (int id : completions[m]) { printf(" %d", id); }
        printf("\n");
    }
    printf("prefill: %d tokens in %.1f ms\n", n - 1, (prefilled - start) * 1e3);
    // The first step also captures the step's graph: the speed is that of the steps after it.
    printf("decode: %d steps x %d completions in %.1f ms: %.0f tokens/s\n", steps, M, (done - prefilled) * 1e3,
           steps > 1 ? (steps - 1) * M / (done - first_step) : 0.0);
    generator_free(&gen);
    tokenizer_free(&tokenizer);
    gpt2_free(&model);
}

// --eval with -x 0: evaluates the -e model and exits; no training data is read.
static void evaluate_main(const TrainArgs* args, const LaunchInfo* me) {
    const RunShape* r = &args->shape;
    if (!cuda_setup(r->precision, me->local_rank)) { fail("no CUDA GPU found: evaluation needs an NVIDIA GPU"); }
    comm_init(&g_comm, me, args->rendezvous_dir);
    GPT2 model;
    build_model(&model, args, nullptr);
    if (r->T > model.config.max_seq_len) {
        fail("flag -t: sequence length %d exceeds the model's maxT %d", r->T, model.config.max_seq_len);
    }
    gpt2_reset_step_stats(&model, r->spike_window);
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, args->tokenizer.c_str());
    EvalSet set;
    std::vector<EvalBatch> batches;
    eval_prepare(args, &tokenizer, model.config.vocab_size, &set, &batches);
    gpt2_allocate_activations(&model, r->B, r->T);
    RunLog none;  // --eval alone prints its accuracy only
    evaluate(&model, args, &set, batches, 0, &none);
    tokenizer_free(&tokenizer);
    gpt2_free(&model);
    comm_free(&g_comm);
}

// The run's number of processes: --gpus's, or the launcher's that started this one (not both).
static int run_world(int gpus, const LaunchInfo& me) {
    if (gpus > 0 && me.world > 1) {
        fail("flag --gpus: this process is already rank %d of %d (%s); give the GPUs to one or the other", me.rank,
             me.world, me.source);
    }
    if (std::max(gpus, me.world) > 1 && !comm_available()) {
        fail("%d GPUs asked for (%s), but this build has no NCCL: install it (libnccl-dev, or NCCL_HOME=DIR) and "
             "rebuild with make", std::max(gpus, me.world), gpus > 1 ? "flag --gpus" : me.source);
    }
    return std::max({gpus, me.world, 1});
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // a step's line reaches a log file as it is printed
    int gpus = launch_gpus_flag(argc, argv);
    LaunchInfo me = launch_info_from_env();
    int world = run_world(gpus, me);
    g_fail_quiet = me.world > 1 && me.rank != 0;  // what every rank finds alike, rank 0 reports
    TrainArgs args = args_parse_or_fail(argc, argv, world);  // bad flags and data fail here, before any process starts
    if (args_trains(&args)) {
        dataloader_check_pattern(args.train_pattern.c_str());
        dataloader_check_pattern(args.val_pattern.c_str());
    }
    g_fail_quiet = false;
    if (args_generates(&args)) {
        if (world > 1) { fail("flag --prompt: generation runs on one GPU (no --gpus, no launcher)"); }
        generate_main(&args);
        return 0;
    }
    if (gpus > 1) { return launch_local(gpus, argc, argv); }
    if (args.shape.max_steps == 0) {  // --eval only (args_parse allows -x 0 only with it)
        evaluate_main(&args, &me);
        return 0;
    }
    Run run;
    run_init(&run, &me, args);
    int max_steps = run.args.shape.max_steps, stop_at = run.args.stop_at;
    for (int step = run.start_step; step <= max_steps; step++) {
        bool last_step = step == max_steps || (stop_at > 0 && step == stop_at) || run.stop_requested;
        run_periodic(&run, step, last_step);
        if (last_step) { break; }
        run_step(&run, step);
        run_report(&run);  // the previous step, while this one runs
        run.pending = step;
    }
    bool preempted = run.stop_requested;
    run_finish(&run);
    return preempted ? EXIT_PREEMPTED : 0;
}
#endif
