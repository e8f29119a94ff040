/*
Kernel lab: the AdamW update over all 124.5M parameters of GPT-2 124M (16 tensors, one flat
array), as torch.optim.AdamW with the gradient scaled by the clipping factor:
  g = grad * scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
  p = p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), wd only for 2-D tensors

  variant 1  naive: one launch per parameter tensor, its weight decay passed in, scalar
  variant 2  the trainer's adamw_kernel, launched as gpt2_update does: one launch, float4 per
             thread (every tensor's size is a multiple of 4), each thread finding its tensor in the
             TensorTable (for the decay mask)
  variant 3  as 2 with one parameter per thread (the trainer's kernel before it took float4)

  ./adamw [variant ...]

Bytes counted: params, m, v and grads read, params, m and v written: 7 n floats.
*/
#include "common.h"

constexpr int NUM_VARIANTS = 3;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: a launch per tensor, scalar",
    "2 trainer: adamw_kernel, one launch, float4, table lookup",
    "3 one launch, scalar, table lookup",
};

// Relative to the largest |value| of params, m and v: a dozen float roundings per element.
constexpr double TOLERANCE = 1e-6;

struct Hyper {
    float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2_sqrt;
};

// One parameter's AdamW update, scalar.
__device__ inline void adamw_scalar(float* params, float* m_memory, float* v_memory, const float* grads, size_t i,
                                    float grad_scale, const Hyper& h, float decay) {
    float g = grads[i] * grad_scale;
    float m = h.beta1 * m_memory[i] + (1.0f - h.beta1) * g;
    float v = h.beta2 * v_memory[i] + (1.0f - h.beta2) * g * g;
    m_memory[i] = m;
    v_memory[i] = v;
    params[i] = params[i] * (1.0f - h.lr * decay) -
                (h.lr / h.bias_correction1) * m / (sqrtf(v) / h.bias_correction2_sqrt + h.eps);
}

__global__ void naive_kernel(float* params, float* m_memory, float* v_memory, const float* grads, size_t n,
                             const float* grad_scale, Hyper h, float decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { adamw_scalar(params, m_memory, v_memory, grads, i, *grad_scale, h, decay); }
}

__global__ void scalar_table_kernel(float* params, float* m_memory, float* v_memory, const float* grads, size_t n,
                                    TensorTable table, const float* grad_scale, Hyper h) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    int tensor = 0;
    while (i >= table.end[tensor]) { tensor++; }
    float decay = (table.decay_mask >> tensor) & 1u ? h.weight_decay : 0.0f;
    adamw_scalar(params, m_memory, v_memory, grads, i, *grad_scale, h, decay);
}

struct Buffers {
    float *params, *m, *v, *grads, *grad_scale;
    StepStats* stats;  // variant 2 reads the clipping factor and bias corrections from the step's stats
    float *params0, *m0, *v0;  // start values, restored before each run
    size_t n;
    TensorTable table;
    Hyper h;
};

static void launch_variant(int variant, const Buffers& d) {
    const Hyper& h = d.h;
    if (variant == 1) {
        size_t begin = 0;
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
            size_t count = d.table.end[t] - begin;
            float decay = (d.table.decay_mask >> t) & 1u ? h.weight_decay : 0.0f;
            naive_kernel<<<ceil_div(count, 256), 256>>>(d.params + begin, d.m + begin, d.v + begin, d.grads + begin,
                                                        count, d.grad_scale, h, decay);
            cudaCheck(cudaGetLastError());
            begin = d.table.end[t];
        }
    } else if (variant == 2) {
        adamw_kernel<<<ceil_div(d.n / 4, 256), 256>>>((float4*)d.params, (float4*)d.m, (float4*)d.v,
                                                      (const float4*)d.grads, d.n / 4, 0, d.table, d.stats, h.lr,
                                                      h.beta1, h.beta2, h.eps, h.weight_decay);
        cudaCheck(cudaGetLastError());
    } else {
        scalar_table_kernel<<<ceil_div(d.n, 256), 256>>>(d.params, d.m, d.v, d.grads, d.n, d.table, d.grad_scale, h);
        cudaCheck(cudaGetLastError());
    }
}

static void reset(const Buffers& d) {
    copy_floats(d.params, d.params0, d.n);
    copy_floats(d.m, d.m0, d.n);
    copy_floats(d.v, d.v0, d.n);
}

static double check_variant(const Buffers& d, int variant) {
    size_t n = d.n;
    fill_uniform(d.params0, n, -0.1f, 0.1f);
    fill_uniform(d.m0, n, -1e-3f, 1e-3f);
    fill_uniform(d.v0, n, 0.0f, 1e-5f);
    fill_uniform(d.grads, n, -1e-2f, 1e-2f);
    reset(d);
    launch_variant(variant, d);
    std::vector<float> p = download(d.params0, n), m = download(d.m0, n), v = download(d.v0, n);
    std::vector<float> g = download(d.grads, n);
    float scale = download(d.grad_scale, 1)[0];
    const Hyper& h = d.h;
    std::vector<double> p_ref(n), m_ref(n), v_ref(n);
    int tensor = 0;
    for (size_t i = 0; i < n; i++) {
        while (i >= d.table.end[tensor]) { tensor++; }
        double decay = (d.table.decay_mask >> tensor) & 1u ? h.weight_decay : 0.0;
        double gi = (double)g[i] * scale;
        m_ref[i] = h.beta1 * (double)m[i] + (1.0 - h.beta1) * gi;
        v_ref[i] = h.beta2 * (double)v[i] + (1.0 - h.beta2) * gi * gi;
        p_ref[i] = p[i] * (1.0 - (double)h.lr * decay) -
                   (double)h.lr / h.bias_correction1 * m_ref[i] / (sqrt(v_ref[i]) / h.bias_correction2_sqrt + h.eps);
    }
    return std::max({relative_error(download(d.params, n), p_ref), relative_error(download(d.m, n), m_ref),
                      relative_error(download(d.v, n), v_ref)});
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_124m_parameter_sizes(sizes);
    Buffers d = {};
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        if (sizes[t] % 4 != 0) { fail("tensor %d: size %zu not a multiple of 4 (variant 2)", t, sizes[t]); }
    }
    d.table = tensor_table(sizes);
    d.n = d.table.end[NUM_PARAMETER_TENSORS - 1];
    int step = 3;  // bias corrections of the third update
    float beta1 = 0.9f, beta2 = 0.95f;
    d.h = Hyper{6e-4f, beta1, beta2, 1e-8f, 0.1f, 1.0f - powf(beta1, step), sqrtf(1.0f - powf(beta2, step))};
    d.params = gpu_floats(d.n), d.m = gpu_floats(d.n), d.v = gpu_floats(d.n), d.grads = gpu_floats(d.n);
    d.params0 = gpu_floats(d.n), d.m0 = gpu_floats(d.n), d.v0 = gpu_floats(d.n), d.grad_scale = gpu_floats(1);
    fill_uniform(d.grad_scale, 1, 0.5f, 1.0f);  // a clipping factor
    StepStats stats = {};
    stats.grad_scale = download(d.grad_scale, 1)[0];
    stats.adam_step = step;
    stats.bias_correction1 = d.h.bias_correction1;
    stats.bias_correction2_sqrt = d.h.bias_correction2_sqrt;
    cudaCheck(cudaMalloc(&d.stats, sizeof(StepStats)));
    cudaCheck(cudaMemcpy(d.stats, &stats, sizeof(stats), cudaMemcpyHostToDevice));
    note("%zu parameters in %d tensors", d.n, NUM_PARAMETER_TENSORS);
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        double error = check_variant(d, variant);
        Launch launch = [&] { launch_variant(variant, d); };
        Launch restore = [&] { reset(d); };
        Determinism det = deterministic(launch, restore, {{d.params, d.n}, {d.m, d.n}, {d.v, d.n}});
        print_row("adamw", VARIANT_NAMES[variant], bench_ms(launch, restore), 7.0 * d.n * sizeof(float), CEILING_COPY,
                  error, TOLERANCE, det);
    }
    cudaCheck(cudaFree(d.stats));
    gpu_free_all();
    return lab_finish();
}
