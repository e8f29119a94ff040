/*
Kernel lab: GELU backward, tanh form, over the MLP's N x 4C = 8192 x 3072 elements: the gradient
before the GELU, d * gelu'(x), from d (the gradient of its output) and x (its input, stored by the
forward pass). The trainer has no separate GELU backward: its fc bias gradient applies it while it
sums and transposes (bias_backward with gelu_inp), and recomputes gelu(x) in the same pass, written
transposed for the fcproj weight gradient. The fusion is measured here against the passes it
replaces.

  variant 1  naive: a thread per element, out of place
  variant 2  float4 per thread, in place (the GELU backward alone)
  variant 3  the trainer's bias_backward with gelu_inp: reads d and x, writes dfch_t = (d * gelu'(x))^T
             and gelu_t = gelu(x)^T (both 4C x N) and the fc bias gradient (column sums of d * gelu'(x))
  variant 4  unfused, the passes 3 replaces: 5 (row-major), then bias_backward without the GELU
             (dfch_t and the bias gradient), then transpose_matrices of gelu(x) (gelu_t)
  Fusion (e), gelu(x) recomputed in the backward pass instead of stored for each layer: the
  backward needs it again as the input of the MLP down-projection's dweight product. Row-major,
  against variant 2 (gelu(x) stored, nothing to recompute):
  variant 5  fused: one pass reads x and d, writes d * gelu'(x) in place and gelu(x) (float4)
  variant 6  unfused: the trainer's gelu_forward recomputes gelu(x), then 2

  ./gelu_backward [variant ...]

Bytes counted: variants 1-2 read x and d and write the gradient (3 n floats); 3 reads x and d and
writes dfch_t and gelu_t (4 n), plus dbias written; 4 does 5 (4 n), reads d and writes
dfch_t (2 n), reads gelu(x) and writes gelu_t (2 n): 8 n, plus dbias; 5 writes gelu(x) too (4 n);
6 reads x and writes gelu(x), then 3 n (5 n).
*/
#include "common.h"

constexpr int NUM_VARIANTS = 6;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: thread per element, out of place",
    "2 float4 per thread, in place",
    "3 trainer: bias_backward(gelu_inp): dfch_t, gelu_t, fc dbias",
    "4 unfused: 5, bias_backward without GELU, transpose gelu(x)",
    "5 (e) fused: gradient + recomputed gelu(x), float4",
    "6 (e) unfused: gelu_forward again, then 2",
};

// Relative to max |value|: tanhf within a few ulp, then a dozen float operations; the bias
// gradient sums N = 8192 rows (~sqrt(N) * 6e-8).
constexpr double TOLERANCE = 1e-5;

// The trainer's gelu_grad on a float4.
__device__ inline float4 gelu_grad4(float4 x) {
    return make_float4(gelu_grad(x.x), gelu_grad(x.y), gelu_grad(x.z), gelu_grad(x.w));
}

__global__ void naive_kernel(float* dinp, const float* dout, const float* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dinp[i] = dout[i] * gelu_grad(inp[i]); }
}

__global__ void float4_kernel(float4* d, const float4* inp, size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) { d[i] = d[i] * gelu_grad4(inp[i]); }
}

__global__ void recompute_kernel(float4* d, float4* gelu_out, const float4* inp, size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) { return; }
    float4 x = inp[i];
    d[i] = d[i] * gelu_grad4(x);
    gelu_out[i] = make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w));
}

struct Buffers {
    float *d, *d0, *dinp, *x, *gelu_out;  // d0: the incoming gradient, restored before each run
    float *dfch_t, *gelu_t;               // variants 3, 4: (OC, N), the transposed outputs
    float *dbias, *partials;              // variants 3, 4: the fc bias gradient (written)
    unsigned int* counters;
    int N, OC;
    size_t n;
};

static bool out_of_place(int variant) { return variant == 1; }
static bool transposed(int variant) { return variant == 3 || variant == 4; }  // writes dfch_t, gelu_t, dbias
static bool writes_d(int variant) { return variant != 1 && variant != 3; }
static bool writes_gelu_out(int variant) { return variant >= 4; }

static void launch_float4(const Buffers& b) {
    float4_kernel<<<ceil_div(b.n / 4, 256), 256>>>((float4*)b.d, (const float4*)b.x, b.n / 4);
    cudaCheck(cudaGetLastError());
}

static void launch_recompute(const Buffers& b) {
    recompute_kernel<<<ceil_div(b.n / 4, 256), 256>>>((float4*)b.d, (float4*)b.gelu_out, (const float4*)b.x, b.n / 4);
    cudaCheck(cudaGetLastError());
}

static void launch_variant(int variant, const Buffers& b) {
    size_t n = b.n;
    if (variant == 1) {
        naive_kernel<<<ceil_div(n, 256), 256>>>(b.dinp, b.d, b.x, n);
        cudaCheck(cudaGetLastError());
    } else if (variant == 2) {
        launch_float4(b);
    } else if (variant == 3) {
        bias_backward(b.dbias, b.dfch_t, b.gelu_t, b.partials, b.counters, b.d, b.x, b.N, b.OC);
    } else if (variant == 4) {
        launch_recompute(b);
        bias_backward(b.dbias, b.dfch_t, nullptr, b.partials, b.counters, b.d, nullptr, b.N, b.OC);
        transpose_matrices(b.gelu_t, b.gelu_out, b.N, b.OC, 1);
    } else if (variant == 5) {
        launch_recompute(b);
    } else {
        gelu_forward(b.gelu_out, b.x, n);
        launch_float4(b);
    }
}

// Restores the incoming gradient, poisons what the variant writes.
static void reset(const Buffers& b, int variant) {
    copy_floats(b.d, b.d0, b.n);
    if (out_of_place(variant)) { poison(b.dinp, b.n); }
    if (writes_gelu_out(variant)) { poison(b.gelu_out, b.n); }
    if (transposed(variant)) {
        poison(b.dfch_t, b.n);
        poison(b.gelu_t, b.n);
        poison(b.dbias, b.OC);
    }
}

// got (OC, N) against want (N, OC): got[o * N + row] is want[row * OC + o].
static double transposed_error(const std::vector<float>& got, const std::vector<double>& want, int N, int OC) {
    ErrorMeter e = {};
    for (int row = 0; row < N; row++) {
        for (int o = 0; o < OC; o++) { error_add(&e, got[(size_t)o * N + row], want[(size_t)row * OC + o]); }
    }
    return error_value(e);
}

// Variants 3-4: dfch_t, gelu_t and dbias; the others: the gradient and, where written, gelu(x).
static double check_variant(const Buffers& b, int variant) {
    size_t n = b.n;
    fill_uniform(b.x, n, -5.0f, 5.0f);
    fill_uniform(b.d0, n, -1.0f, 1.0f);
    reset(b, variant);
    launch_variant(variant, b);
    std::vector<float> x = download(b.x, n), d0 = download(b.d0, n);
    std::vector<double> ref(n), gelu_ref(n), dbias_ref(b.OC, 0.0);
    for (size_t i = 0; i < n; i++) {
        ref[i] = d0[i] * gelu_tanh_grad(x[i]);
        gelu_ref[i] = gelu_tanh(x[i]);
        dbias_ref[i % b.OC] += ref[i];
    }
    if (transposed(variant)) {
        return std::max({transposed_error(download(b.dfch_t, n), ref, b.N, b.OC),
                         transposed_error(download(b.gelu_t, n), gelu_ref, b.N, b.OC),
                         relative_error(download(b.dbias, b.OC), dbias_ref)});
    }
    double error = relative_error(download(out_of_place(variant) ? b.dinp : b.d, n), ref);
    if (writes_gelu_out(variant)) { error = std::max(error, relative_error(download(b.gelu_out, n), gelu_ref)); }
    return error;
}

static std::vector<Output> outputs_of(const Buffers& b, int variant) {
    std::vector<Output> outputs;
    if (out_of_place(variant)) { outputs.push_back({b.dinp, b.n}); }
    if (writes_d(variant)) { outputs.push_back({b.d, b.n}); }
    if (writes_gelu_out(variant)) { outputs.push_back({b.gelu_out, b.n}); }
    if (transposed(variant)) {
        outputs.push_back({b.dfch_t, b.n});
        outputs.push_back({b.gelu_t, b.n});
        outputs.push_back({b.dbias, (size_t)b.OC});
    }
    return outputs;
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int N = LAB_ROWS, OC = 4 * LAB_C;
    size_t n = (size_t)N * OC;
    Buffers b = {gpu_floats(n), gpu_floats(n), gpu_floats(n), gpu_floats(n), gpu_floats(n), gpu_floats(n),
                 gpu_floats(n), gpu_floats(OC), gpu_floats((size_t)BIAS_BACKWARD_MAX_CHUNKS * OC),
                 (unsigned int*)gpu_ints(MAX_REDUCTION_COUNTERS), N, OC, n};
    cudaCheck(cudaMemset(b.counters, 0, MAX_REDUCTION_COUNTERS * sizeof(unsigned int)));
    const double bytes_per_element[] = {0, 3, 3, 4, 8, 4, 5};
    double ms_of[NUM_VARIANTS + 1] = {};  // per variant, for the fusion (e) verdict
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        double error = check_variant(b, variant);
        Launch launch = [&] { launch_variant(variant, b); };
        Launch restore = [&] { reset(b, variant); };
        Determinism det = deterministic(launch, restore, outputs_of(b, variant));
        ms_of[variant] = bench_ms(launch, restore);
        double bytes = bytes_per_element[variant] * n * sizeof(float) + (transposed(variant) ? OC * 4.0 : 0.0);
        print_row("gelu_backward", VARIANT_NAMES[variant], ms_of[variant], bytes, CEILING_COPY, error, TOLERANCE, det);
    }
    if (ms_of[2] > 0.0 && ms_of[5] > 0.0 && ms_of[6] > 0.0) {
        double saved_gb = 11.0 * n * sizeof(float) / 1e9;  // 12 layers of gelu(x) at B = 8, less one scratch
        note("(e) recomputing gelu(x) rather than storing it (2) costs %+.3f ms (fused, 5) or %+.3f ms (unfused, 6) "
             "per layer, %+.2f / %+.2f ms per step of 12 layers; storing it would take %.2f GB more at B=8 (%.2f GB "
             "at B=16). The trainer recomputes it inside 3.",
             ms_of[5] - ms_of[2], ms_of[6] - ms_of[2], 12 * (ms_of[5] - ms_of[2]), 12 * (ms_of[6] - ms_of[2]),
             saved_gb, 2 * saved_gb);
    }
    gpu_free_all();
    return lab_finish();
}
