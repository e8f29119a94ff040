/*
Kernel lab: the encoder, out[b, t] = wte[token[b, t]] + wpe[t], for B*T = 8192 tokens of C = 768
channels from the 50304 x 768 token table.

  variant 1  naive: a thread per output element
  variant 2  the trainer's encoder_forward: float4 per thread

  ./encoder_forward [variant ...]

Bytes counted: the tokens read, the 8192 gathered rows of wte read once each, the T rows of wpe
read once, out written once: (B T + 2 B T C + T C) * 4.
*/
#include "common.h"

constexpr int NUM_VARIANTS = 2;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: thread per element",
    "2 trainer: encoder_forward, float4",
};

// One float rounding of the exact sum: at most 2^-24 of |out|.
constexpr double TOLERANCE = 1e-7;

__global__ void naive_kernel(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) { return; }
    size_t bt = idx / C;
    int c = idx % C, t = bt % T;
    out[idx] = wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)t * C + c];
}

static void launch_variant(int variant, float* out, const int* tokens, const float* wte, const float* wpe, int B,
                           int T, int C) {
    if (variant == 1) {
        naive_kernel<<<ceil_div((size_t)B * T * C, 256), 256>>>(out, tokens, wte, wpe, B, T, C);
        cudaCheck(cudaGetLastError());
    } else {
        encoder_forward(out, tokens, wte, wpe, nullptr, B, T, C);
    }
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int B = LAB_B, T = LAB_T, C = LAB_C;
    size_t n = (size_t)B * T * C;
    float *out = gpu_floats(n), *wte = gpu_floats((size_t)LAB_VP * C), *wpe = gpu_floats((size_t)T * C);
    int* tokens = gpu_ints((size_t)B * T);
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        fill_tokens(tokens, (size_t)B * T, LAB_V, false);
        fill_uniform(wte, (size_t)LAB_VP * C, -1.0f, 1.0f);
        fill_uniform(wpe, (size_t)T * C, -1.0f, 1.0f);
        poison(out, n);
        launch_variant(variant, out, tokens, wte, wpe, B, T, C);
        std::vector<int> tok = download_ints(tokens, (size_t)B * T);
        std::vector<float> wte_host = download(wte, (size_t)LAB_VP * C), wpe_host = download(wpe, (size_t)T * C);
        std::vector<double> ref(n);
        for (size_t bt = 0; bt < (size_t)B * T; bt++) {
            for (int c = 0; c < C; c++) {
                ref[bt * C + c] = (double)wte_host[(size_t)tok[bt] * C + c] + wpe_host[(bt % T) * C + c];
            }
        }
        double error = relative_error(download(out, n), ref);
        Launch launch = [&] { launch_variant(variant, out, tokens, wte, wpe, B, T, C); };
        Determinism det = deterministic(launch, [&] { poison(out, n); }, {{out, n}});
        double bytes = ((double)B * T + 2.0 * n + (double)T * C) * 4;
        print_row("encoder_forward", VARIANT_NAMES[variant], bench_ms(launch), bytes, CEILING_COPY, error, TOLERANCE, det);
    }
    gpu_free_all();
    return lab_finish();
}
