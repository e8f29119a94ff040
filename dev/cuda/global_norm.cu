/*
Kernel lab: the global gradient norm over all 124.5M gradients of GPT-2 124M and the clipping
factor, as torch.nn.utils.clip_grad_norm_: norm = sqrt(sum g^2), scale = min(1, max_norm /
(norm + 1e-6)); both written to norm_scale[0, 1] on the device.

  variant 1  naive: one block, double accumulators
  variant 2  float4, a resident grid, block sums added with float atomicAdd (not deterministic),
             then a one-thread kernel for the square root
  variant 3  float4, a resident grid, block partials, then a one-block kernel adds them in order
  variant 4  the trainer's grad_norm_partials + grad_norm_finish as gpt2_update launches them:
             one block per chunk of ZERO_CHUNK floats (the chunks a data-parallel run shards), then
             one block adds the chunk partials in order (the same sum for any number of GPUs)
  variant 5  scalar loads, 1024 blocks, the last block to finish adds the partials (the trainer's
             kernel before float4)

  ./global_norm [variant ...]

Bytes counted: the gradients read once (4 n).
*/
#include "common.h"

constexpr int NUM_VARIANTS = 5;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: one block, double accumulators",
    "2 float4, float atomicAdd of block sums",
    "3 float4, block partials + finalize kernel",
    "4 trainer: a block per chunk + ordered finish",
    "5 scalar, 1024 blocks, last block sums",
};

// Relative: the sum of 124.5M positive squares, per thread then in trees (~1e-7 expected).
constexpr double TOLERANCE = 1e-5;
constexpr float MAX_NORM = 1.0f;

__device__ void write_norm_scale(float* norm_scale, float sum_squares, float max_norm) {
    float norm = sqrtf(sum_squares);
    norm_scale[0] = norm;
    norm_scale[1] = max_norm > 0.0f ? fminf(1.0f, max_norm / (norm + 1e-6f)) : 1.0f;
}

__global__ void naive_kernel(float* norm_scale, const float* grads, size_t n, float max_norm) {
    __shared__ double thread_sums[1024];
    double sum = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) { sum += (double)grads[i] * grads[i]; }
    thread_sums[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x != 0) { return; }
    double total = 0.0;
    for (int t = 0; t < blockDim.x; t++) { total += thread_sums[t]; }
    write_norm_scale(norm_scale, (float)total, max_norm);
}

// The block's sum of squares over a grid-stride float4 loop (n a multiple of 4).
__device__ float block_sum_squares(const float4* grads, size_t n4) {
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 g = grads[i];
        sum += sum4(g * g);
    }
    return block_sum(sum);
}

__global__ void atomic_kernel(float* total, const float4* grads, size_t n4) {
    float sum = block_sum_squares(grads, n4);
    if (threadIdx.x == 0) { atomicAdd(total, sum); }
}

__global__ void finish_kernel(float* norm_scale, const float* total, float max_norm) {
    write_norm_scale(norm_scale, *total, max_norm);
}

__global__ void partials_kernel(float* partials, const float4* grads, size_t n4) {
    float sum = block_sum_squares(grads, n4);
    if (threadIdx.x == 0) { partials[blockIdx.x] = sum; }
}

// The partials summed in a fixed order: per thread strided, then the block's tree.
__device__ float sum_partials(const float* partials, int count) {
    float sum = 0.0f;
    for (int b = threadIdx.x; b < count; b += blockDim.x) { sum += __ldcg(&partials[b]); }
    return block_sum(sum);
}

__global__ void finalize_kernel(float* norm_scale, const float* partials, int count, float max_norm) {
    float total = sum_partials(partials, count);
    if (threadIdx.x == 0) { write_norm_scale(norm_scale, total, max_norm); }
}

__global__ void scalar_last_block_kernel(float* norm_scale, float* partials, unsigned int* counter, const float* grads,
                                         size_t n, float max_norm) {
    size_t per_block = (n + gridDim.x - 1) / gridDim.x;
    size_t begin = blockIdx.x * per_block, end = min(n, begin + per_block);
    float sum = 0.0f;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) { sum += grads[i] * grads[i]; }
    sum = block_sum(sum);
    if (threadIdx.x == 0) { partials[blockIdx.x] = sum; }
    if (!arrive_last_in_group(counter, gridDim.x)) { return; }
    float total = sum_partials(partials, gridDim.x);
    if (threadIdx.x == 0) { write_norm_scale(norm_scale, total, max_norm); }
}

struct Buffers {
    float *norm_scale, *grads, *partials, *total;
    StepStats* stats;  // variant 4 writes the norm and the clipping factor there
    unsigned int* counter;
    size_t n;
};

constexpr int BLOCK = 1024, SCALAR_BLOCKS = 1024;

static void launch_variant(int variant, const Buffers& d) {
    int resident = 2 * g_num_sms;  // two blocks of 1024 threads fill an SM
    const float4* grads4 = (const float4*)d.grads;
    if (variant == 1) {
        naive_kernel<<<1, BLOCK>>>(d.norm_scale, d.grads, d.n, MAX_NORM);
    } else if (variant == 2) {
        cudaCheck(cudaMemsetAsync(d.total, 0, sizeof(float)));
        atomic_kernel<<<resident, BLOCK>>>(d.total, grads4, d.n / 4);
        cudaCheck(cudaGetLastError());
        finish_kernel<<<1, 1>>>(d.norm_scale, d.total, MAX_NORM);
    } else if (variant == 3) {
        partials_kernel<<<resident, BLOCK>>>(d.partials, grads4, d.n / 4);
        cudaCheck(cudaGetLastError());
        finalize_kernel<<<1, BLOCK>>>(d.norm_scale, d.partials, resident, MAX_NORM);
    } else if (variant == 4) {
        size_t chunks = zero_div_up(d.n, ZERO_CHUNK);  // one rank's share: the partials, loss 0, no stop
        grad_norm_partials(d.partials, d.grads, d.n, 0, chunks);
        grad_norm_finish(d.stats, d.partials, StepShares{chunks, chunks, 1}, UpdateGuard{MAX_NORM, 0.0f, 0.9f, 0.95f});
        cudaCheck(cudaMemcpyAsync(d.norm_scale, &d.stats->grad_norm, 2 * sizeof(float), cudaMemcpyDeviceToDevice));
    } else {
        scalar_last_block_kernel<<<SCALAR_BLOCKS, BLOCK>>>(d.norm_scale, d.partials, d.counter, d.grads, d.n, MAX_NORM);
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_124m_parameter_sizes(sizes);
    Buffers d = {};
    for (size_t size : sizes) { d.n += size; }
    if (d.n % 4 != 0) { fail("%zu gradients: not a multiple of 4", d.n); }
    d.norm_scale = gpu_floats(2), d.grads = gpu_floats(d.n), d.partials = gpu_floats(std::max({(size_t)SCALAR_BLOCKS, zero_div_up(d.n, ZERO_CHUNK) + 2, (size_t)(2 * g_num_sms)}));
    d.total = gpu_floats(1), d.counter = (unsigned int*)gpu_ints(1);
    cudaCheck(cudaMemset(d.partials, 0, (zero_div_up(d.n, ZERO_CHUNK) + 2) * sizeof(float)));  // variant 4's loss, stop
    cudaCheck(cudaMemset(d.counter, 0, sizeof(unsigned int)));
    StepStats stats = {};  // a finite loss, an empty spike window
    outlier_init(&stats.recent_norms, 2);
    cudaCheck(cudaMalloc(&d.stats, sizeof(StepStats)));
    cudaCheck(cudaMemcpy(d.stats, &stats, sizeof(stats), cudaMemcpyHostToDevice));
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        fill_uniform(d.grads, d.n, -1e-2f, 1e-2f);
        poison(d.norm_scale, 2);
        launch_variant(variant, d);
        std::vector<float> grads = download(d.grads, d.n), got = download(d.norm_scale, 2);
        double sum_squares = 0.0;
        for (float g : grads) { sum_squares += (double)g * g; }
        double norm = sqrt(sum_squares);
        double error = std::max(relative_error({got[0]}, {norm}),
                                relative_error({got[1]}, {std::min(1.0, MAX_NORM / (norm + 1e-6))}));
        Launch launch = [&] { launch_variant(variant, d); };
        Determinism det = deterministic(launch, [&] { poison(d.norm_scale, 2); }, {{d.norm_scale, 2}});
        print_row("global_norm", VARIANT_NAMES[variant], bench_ms(launch), 4.0 * d.n, CEILING_COPY, error, TOLERANCE,
                  det);
    }
    cudaCheck(cudaFree(d.stats));
    gpu_free_all();
    return lab_finish();
}
