/*
Kernel lab: the residual add out = a + b over the N x C = 8192 x 768 residual stream.
The trainer no longer runs it alone: layernorm_forward adds its second input to its first while
it normalises (fusion a, measured in layernorm_forward.cu). What remains here is the add itself.

  variant 1  naive: a thread per element
  variant 2  float4 per thread (residual_add in common.h: the trainer's kernel before the fusion)

  ./residual_forward [variant ...]

Bytes counted: a and b read once, out written once (3 n floats).
*/
#include "common.h"

constexpr int NUM_VARIANTS = 2;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: thread per element",
    "2 float4 per thread (the trainer's, before fusion a)",
};

// One float rounding of the exact sum: at most 2^-24 of |out|.
constexpr double TOLERANCE = 1e-7;

__global__ void naive_kernel(float* out, const float* a, const float* b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = a[i] + b[i]; }
}

static void launch_variant(int variant, float* out, const float* a, const float* b, size_t n) {
    if (variant == 1) {
        naive_kernel<<<ceil_div(n, 256), 256>>>(out, a, b, n);
        cudaCheck(cudaGetLastError());
    } else {
        residual_add(out, a, b, n);
    }
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    size_t n = (size_t)LAB_ROWS * LAB_C;
    float *out = gpu_floats(n), *a = gpu_floats(n), *b = gpu_floats(n);
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        fill_uniform(a, n, -3.0f, 3.0f);
        fill_uniform(b, n, -1.0f, 1.0f);
        poison(out, n);
        launch_variant(variant, out, a, b, n);
        std::vector<float> a_host = download(a, n), b_host = download(b, n);
        std::vector<double> ref(n);
        for (size_t i = 0; i < n; i++) { ref[i] = (double)a_host[i] + b_host[i]; }
        double error = relative_error(download(out, n), ref);
        Launch launch = [&] { launch_variant(variant, out, a, b, n); };
        Determinism det = deterministic(launch, [&] { poison(out, n); }, {{out, n}});
        print_row("residual_forward", VARIANT_NAMES[variant], bench_ms(launch), 3.0 * n * sizeof(float), CEILING_COPY,
                  error, TOLERANCE, det);
    }
    gpu_free_all();
    return lab_finish();
}
