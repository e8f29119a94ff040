/*
Kernel lab: layernorm forward over N = B*T = 8192 rows of C = 768 channels, eps 1e-5:
  out = (x - mean) * rstd * weight + bias, with mean and rstd stored for the backward pass.

  variant 1  naive: a thread per row, two passes over the row
  variant 2  warp per row, float4, the row read from memory in each of three passes (L1 hits)
  variant 3  the trainer's layernorm_forward: warp per row, the row held in registers
  Fusion (a), x = residual + projection then its layernorm, the pair the trainer used to run:
  variant 4  the trainer's layernorm_forward with its second input: the add fused in, writing
             the sum x (the residual stream) and out in one pass
  variant 5  unfused: the residual add kernel, then layernorm_forward on its result

  ./layernorm_forward [variant ...]

Bytes counted: variants 1-3 read x and write out (2 N C), write mean and rstd (2 N), read weight
and bias (2 C); variant 4 reads the two summands and writes x and out (4 N C + 2 N + 2 C);
variant 5 adds a pass (read 2 N C, write N C) to a layernorm (2 N C + 2 N + 2 C).
*/
#include "common.h"

constexpr int NUM_VARIANTS = 5;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: thread per row",
    "2 warp per row, float4, row re-read per pass",
    "3 trainer: layernorm_forward, row in registers",
    "4 (a) fused: trainer's layernorm_forward(inp + inp2)",
    "5 (a) unfused: residual add, then layernorm_forward",
};

// fp32: the mean and variance are sums of C = 768 terms (~sqrt(C) * 6e-8 relative), each output a
// few roundings more; relative to the largest |value| of out, mean, rstd (and x).
constexpr double TOLERANCE = 1e-5;

// ----------------------------------------------------------------------------------------------

__global__ void naive_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                             const float* bias, int N, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) { return; }
    const float* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int c = 0; c < C; c++) { sum += x[c]; }
    float m = sum / C, sum_sq = 0.0f;
    for (int c = 0; c < C; c++) { sum_sq += (x[c] - m) * (x[c] - m); }
    float r = 1.0f / sqrtf(sum_sq / C + 1e-5f);
    for (int c = 0; c < C; c++) { out[(size_t)row * C + c] = (x[c] - m) * r * weight[c] + bias[c]; }
    mean[row] = m;
    rstd[row] = r;
}

__global__ void warp_reread_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                   const float* bias, int N, int C) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) { return; }
    int C4 = C / 4;
    const float4* x = (const float4*)inp + (size_t)row * C4;
    float sum = 0.0f;
    for (int c4 = warp.thread_rank(); c4 < C4; c4 += 32) { sum += sum4(x[c4]); }
    float m = cg::reduce(warp, sum, cg::plus<float>()) / C;
    float4 m4 = make_float4(m, m, m, m);
    float sum_sq = 0.0f;
    for (int c4 = warp.thread_rank(); c4 < C4; c4 += 32) { sum_sq += sum4((x[c4] - m4) * (x[c4] - m4)); }
    float r = 1.0f / sqrtf(cg::reduce(warp, sum_sq, cg::plus<float>()) / C + 1e-5f);
    float4* y = (float4*)out + (size_t)row * C4;
    for (int c4 = warp.thread_rank(); c4 < C4; c4 += 32) {
        y[c4] = (x[c4] - m4) * r * ((const float4*)weight)[c4] + ((const float4*)bias)[c4];
    }
    if (warp.thread_rank() == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

struct Buffers {
    float *out, *mean, *rstd, *x;  // x: the layernorm's input, written by variants 4 and 5
    float *residual, *projection;  // the two summands of variants 4 and 5
    float *weight, *bias;
    int N, C;
};

static void launch_variant(int variant, const Buffers& d) {
    if (variant == 1) {
        naive_kernel<<<ceil_div(d.N, 128), 128>>>(d.out, d.mean, d.rstd, d.x, d.weight, d.bias, d.N, d.C);
        cudaCheck(cudaGetLastError());
    } else if (variant == 2) {
        warp_reread_kernel<<<ceil_div(d.N, 8), 256>>>(d.out, d.mean, d.rstd, d.x, d.weight, d.bias, d.N, d.C);
        cudaCheck(cudaGetLastError());
    } else if (variant == 3) {
        layernorm_forward(d.out, d.mean, d.rstd, nullptr, d.x, nullptr, d.weight, d.bias, d.N, d.C);
    } else if (variant == 4) {
        layernorm_forward(d.out, d.mean, d.rstd, d.x, d.residual, d.projection, d.weight, d.bias, d.N, d.C);
    } else {
        residual_add(d.x, d.residual, d.projection, (size_t)d.N * d.C);
        layernorm_forward(d.out, d.mean, d.rstd, nullptr, d.x, nullptr, d.weight, d.bias, d.N, d.C);
    }
}

static bool fused_pair(int variant) { return variant >= 4; }

// ----------------------------------------------------------------------------------------------

// Fresh random inputs (for the fused pair x is an output, written over).
static void fill_inputs(const Buffers& d) {
    size_t nc = (size_t)d.N * d.C;
    fill_uniform(d.residual, nc, -2.0f, 3.0f);
    fill_uniform(d.projection, nc, -1.0f, 1.0f);
    fill_uniform(d.x, nc, -2.0f, 3.0f);
    fill_uniform(d.weight, d.C, -1.5f, 1.5f);
    fill_uniform(d.bias, d.C, -1.0f, 1.0f);
}

static void poison_outputs(const Buffers& d, int variant) {
    size_t nc = (size_t)d.N * d.C;
    if (fused_pair(variant)) { poison(d.x, nc); }
    poison(d.out, nc);
    poison(d.mean, d.N);
    poison(d.rstd, d.N);
}

static double check_variant(const Buffers& d, int variant) {
    size_t nc = (size_t)d.N * d.C;
    int C = d.C;
    fill_inputs(d);
    poison_outputs(d, variant);
    std::vector<float> x = download(d.x, nc), residual = download(d.residual, nc), projection = download(d.projection, nc);
    launch_variant(variant, d);
    std::vector<float> weight = download(d.weight, C), bias = download(d.bias, C);
    std::vector<double> out_ref(nc), mean_ref(d.N), rstd_ref(d.N), x_ref(nc);
    for (int row = 0; row < d.N; row++) {
        double sum = 0.0, sum_sq = 0.0;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)row * C + c;
            x_ref[i] = fused_pair(variant) ? (double)residual[i] + projection[i] : x[i];
            sum += x_ref[i];
        }
        double m = sum / C;
        for (int c = 0; c < C; c++) { sum_sq += (x_ref[(size_t)row * C + c] - m) * (x_ref[(size_t)row * C + c] - m); }
        double r = 1.0 / sqrt(sum_sq / C + 1e-5);
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)row * C + c;
            out_ref[i] = (x_ref[i] - m) * r * weight[c] + bias[c];
        }
        mean_ref[row] = m;
        rstd_ref[row] = r;
    }
    double error = std::max({relative_error(download(d.out, nc), out_ref), relative_error(download(d.mean, d.N), mean_ref),
                             relative_error(download(d.rstd, d.N), rstd_ref)});
    if (fused_pair(variant)) { error = std::max(error, relative_error(download(d.x, nc), x_ref)); }
    return error;
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int N = LAB_ROWS, C = LAB_C;
    size_t nc = (size_t)N * C;
    Buffers d = {gpu_floats(nc), gpu_floats(N), gpu_floats(N), gpu_floats(nc), gpu_floats(nc), gpu_floats(nc),
                 gpu_floats(C), gpu_floats(C), N, C};
    double layernorm_bytes = (2.0 * nc + 2.0 * N + 2.0 * C) * sizeof(float);
    const double bytes[] = {0, layernorm_bytes, layernorm_bytes, layernorm_bytes, layernorm_bytes + 2.0 * nc * sizeof(float),
                            layernorm_bytes + 3.0 * nc * sizeof(float)};
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        double error = check_variant(d, variant);
        Launch launch = [&] { launch_variant(variant, d); };
        Launch poison_all = [&] { poison_outputs(d, variant); };
        Determinism det = deterministic(launch, poison_all, {{d.out, nc}, {d.mean, (size_t)N}, {d.rstd, (size_t)N}, {d.x, nc}});
        print_row("layernorm_forward", VARIANT_NAMES[variant], bench_ms(launch), bytes[variant], CEILING_COPY, error,
                  TOLERANCE, det);
    }
    gpu_free_all();
    return lab_finish();
}
