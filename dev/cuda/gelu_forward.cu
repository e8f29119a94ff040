/*
Kernel lab: GELU forward, tanh form, over the MLP's N x 4C = 8192 x 3072 pre-activations:
  out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (the trainer's gelu())

  variant 1  naive: a thread per element
  variant 2  the trainer's gelu_forward: float4 per thread, 16-byte loads and stores

  ./gelu_forward [variant ...]

Bytes counted: x read once, out written once (2 n floats). Fusing the GELU into the matmul's
epilogue is measured in matmul_forward.cu (fusion b); its backward, fused into the fc bias
gradient, and recomputing it in the backward pass, in gelu_backward.cu (fusion e).
*/
#include "common.h"

constexpr int NUM_VARIANTS = 2;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: thread per element",
    "2 trainer: gelu_forward, float4",
};

// Relative to max |out|: tanhf is within a few ulp, plus a few float roundings (~1e-7).
constexpr double TOLERANCE = 1e-6;

__global__ void naive_kernel(float* out, const float* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = gelu(inp[i]); }
}

static void launch_variant(int variant, float* out, const float* inp, size_t n) {
    if (variant == 1) {
        naive_kernel<<<ceil_div(n, 256), 256>>>(out, inp, n);
        cudaCheck(cudaGetLastError());
    } else {
        gelu_forward(out, inp, n);
    }
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    size_t n = (size_t)LAB_ROWS * 4 * LAB_C;
    float *out = gpu_floats(n), *inp = gpu_floats(n);
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        fill_uniform(inp, n, -5.0f, 5.0f);
        poison(out, n);
        launch_variant(variant, out, inp, n);
        std::vector<float> x = download(inp, n);
        std::vector<double> ref(n);
        for (size_t i = 0; i < n; i++) { ref[i] = gelu_tanh(x[i]); }
        double error = relative_error(download(out, n), ref);
        Launch launch = [&] { launch_variant(variant, out, inp, n); };
        Determinism det = deterministic(launch, [&] { poison(out, n); }, {{out, n}});
        print_row("gelu_forward", VARIANT_NAMES[variant], bench_ms(launch), 2.0 * n * sizeof(float), CEILING_COPY,
                  error, TOLERANCE, det);
    }
    gpu_free_all();
    return lab_finish();
}
