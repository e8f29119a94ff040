/*
Kernel lab: the linear layer backward on the MLP up-projection of GPT-2 124M (N = B*T = 8192 rows,
C = 768 in, OC = 3072 out), from dout (N, OC), inp (N, C), weight (OC, C):
  dinp (N, C) = dout @ weight,   dweight (OC, C) += dout^T @ inp,   dbias (OC) += column sums of dout

  variant 1  naive: a thread per output of each (dinp, dweight, dbias), FP32
  variant 2  the trainer's matmul_backward_input and matmul_backward_weight: cuBLASLt TF32 for
             dinp (from the transposed weight copy, weight_t) and dweight, bias_backward (per-chunk partials, the last block of
             each column group adds them in order)
  variant 3  the same launcher in full FP32 (the trainer's -f 0)
  variant 4  cuBLASLt TF32, the bias gradient fused into the dweight product (BGRADB epilogue;
             it writes, so a small kernel adds it into dbias)
  Fusion (c), the MLP's down-projection backward and the GELU backward (fcproj: in 3072, out 768):
  variant 5  the dinp product with the CUBLASLT_EPILOGUE_DGELU_BGRAD epilogue: dfch = (dout @ W) *
             gelu'(fch) and the fc bias gradient, in one call (plus the same small add kernel)
  variant 6  as the trainer does it: the dinp product, then bias_backward with gelu_inp (the GELU
             backward applied in place while the fc bias gradient is summed)
  variant 7  as 2, each product with the fastest of cuBLASLt's first 16 heuristic algorithms,
             timed here on these shapes (autotuning, instead of the heuristic's first choice)

  ./matmul_backward [variant ...]

FLOPs counted: 4 N C OC for variants 1-4 and 7 (two products), 2 N C OC for 5-6 (one); the bias
gradient and the GELU are not counted.
*/
#include "common.h"

static const int NUM_VARIANTS = 7;
static const char* const VARIANT_NAMES[] = {
    NULL,
    "1 naive: thread per output, FP32",
    "2 trainer: dinp + dweight GEMMs, TF32, bias_backward",
    "3 trainer's launcher in FP32 (-f 0)",
    "4 TF32, dbias by the dweight GEMM's BGRADB epilogue",
    "5 (c) fcproj dinp GEMM + DGELU_BGRAD epilogue",
    "6 (c) trainer's: dinp GEMM, bias_backward(gelu_inp)",
    "7 as 2, each GEMM autotuned over 16 cuBLASLt algorithms",
};

// Relative to each output's max |value|. FP32: sums of up to N = 8192 terms (naive: in sequence).
// TF32: both operands rounded to 10 mantissa bits, errors adding up at random over the sums.
static const double FP32_TOLERANCE = 5e-5, TF32_TOLERANCE = 5e-3;
static const int CHECKED_ROWS = 64, CHECKED_WEIGHTS = 4096;
static const int AUTOTUNE_CANDIDATES = 16;

static bool uses_tf32(int variant) { return variant != 1 && variant != 3; }
static bool gelu_pair(int variant) { return variant == 5 || variant == 6; }

// ----------------------------------------------------------------------------------------------

__global__ void naive_dinp_kernel(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) { return; }
    size_t row = idx / C;
    int c = idx % C;
    float sum = 0.0f;
    for (int o = 0; o < OC; o++) { sum += dout[row * OC + o] * weight[(size_t)o * C + c]; }
    dinp[idx] = sum;
}

__global__ void naive_dweight_kernel(float* dweight, const float* dout, const float* inp, int N, int C, int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)OC * C) { return; }
    int o = idx / C, c = idx % C;
    float sum = 0.0f;
    for (int row = 0; row < N; row++) { sum += dout[(size_t)row * OC + o] * inp[(size_t)row * C + c]; }
    dweight[idx] += sum;
}

__global__ void naive_dbias_kernel(float* dbias, const float* dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) { return; }
    float sum = 0.0f;
    for (int row = 0; row < N; row++) { sum += dout[(size_t)row * OC + o]; }
    dbias[o] += sum;
}

// dst += src: accumulates a bias gradient that a cuBLASLt epilogue wrote (it cannot add).
__global__ void add_kernel(float* dst, const float* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dst[i] += src[i]; }
}

typedef struct {
    // variants 1-4: the fc layer
    float *dinp, *dweight, *dbias, *dout, *inp, *weight, *weight_t;  // weight_t (C, OC): weight transposed
    // variants 5-6: the fcproj layer's dinp and the fc bias gradient
    float *dfch, *dfcb, *dresidual, *fch, *fcprojw;
    float *dweight0, *dbias0, *dfcb0;  // start values of the accumulated outputs
    float *bias_scratch, *partials;
    unsigned int* counters;
    LtPlan bgradb_plan, dgelu_plan, dinp_plan, dweight_plan;  // the last two autotuned
    int N, C, OC;
} Buffers;

static void launch_variant(int variant, const Buffers& d) {
    int N = d.N, C = d.C, OC = d.OC;
    if (variant == 1) {
        naive_dinp_kernel<<<ceil_div((size_t)N * C, 256), 256>>>(d.dinp, d.dout, d.weight, N, C, OC);
        naive_dweight_kernel<<<ceil_div((size_t)OC * C, 256), 256>>>(d.dweight, d.dout, d.inp, N, C, OC);
        naive_dbias_kernel<<<ceil_div(OC, 256), 256>>>(d.dbias, d.dout, N, OC);
        cudaCheck(cudaGetLastError());
    } else if (variant == 2 || variant == 3) {
        g_use_tf32 = variant == 2;
        matmul_backward_input(d.dinp, d.dout, d.weight_t, N, C, OC);
        matmul_backward_weight(d.dweight, d.dbias, d.partials, d.counters, d.dout, d.inp, N, C, OC);
        g_use_tf32 = true;
    } else if (variant == 4) {
        matmul(d.dinp, d.weight, d.dout, NULL, C, N, OC, false, false, 1.0f, 0.0f);
        lt_run(&d.bgradb_plan, d.dweight, d.inp, d.dout, 1.0f);
        add_kernel<<<ceil_div(OC, 256), 256>>>(d.dbias, d.bias_scratch, OC);
        cudaCheck(cudaGetLastError());
    } else if (variant == 5) {
        lt_run(&d.dgelu_plan, d.dfch, d.fcprojw, d.dresidual, 0.0f);
        add_kernel<<<ceil_div(OC, 256), 256>>>(d.dfcb, d.bias_scratch, OC);
        cudaCheck(cudaGetLastError());
    } else if (variant == 6) {
        matmul(d.dfch, d.fcprojw, d.dresidual, NULL, OC, N, C, false, false, 1.0f, 0.0f);
        bias_backward(d.dfcb, d.partials, d.counters, d.dfch, d.fch, N, OC);
    } else {
        lt_run(&d.dinp_plan, d.dinp, d.weight, d.dout, 0.0f);
        lt_run(&d.dweight_plan, d.dweight, d.inp, d.dout, 1.0f);
        bias_backward(d.dbias, d.partials, d.counters, d.dout, NULL, N, OC);
    }
}

// The parts of variant 2 alone (the trainer's dinp and dweight products and bias_backward), the
// dinp product from the weight as stored (the trainer's before weight_t; cuBLASLt then reads the
// weight along its rows' stride) and the weight transposition itself.
static const int NUM_PARTS = 5;
static const char* const PART_NAMES[] = {"2 trainer, part: dinp GEMM (weight_t)", "2 trainer, part: dweight GEMM",
                                         "2 trainer, part: bias_backward", "dinp GEMM from the weight as stored",
                                         "transpose_matrices of the weight"};

static void launch_part(int part, const Buffers& d) {
    if (part == 0) { matmul_backward_input(d.dinp, d.dout, d.weight_t, d.N, d.C, d.OC); }
    else if (part == 1) { matmul(d.dweight, d.inp, d.dout, NULL, d.C, d.OC, d.N, false, true, 1.0f, 1.0f); }
    else if (part == 2) { bias_backward(d.dbias, d.partials, d.counters, d.dout, NULL, d.N, d.OC); }
    else if (part == 3) { matmul(d.dinp, d.weight, d.dout, NULL, d.C, d.N, d.OC, false, false, 1.0f, 0.0f); }
    else { transpose_matrices(d.weight_t, d.weight, d.OC, d.C, 1); }
}

// ----------------------------------------------------------------------------------------------

static void fill_inputs(const Buffers& d) {
    size_t n_in = (size_t)d.N * d.C, n_out = (size_t)d.N * d.OC;
    fill_uniform(d.dout, n_out, -1.0f, 1.0f);
    fill_uniform(d.inp, n_in, -1.0f, 1.0f);
    fill_uniform(d.weight, (size_t)d.OC * d.C, -0.1f, 0.1f);
    fill_uniform(d.dresidual, n_in, -1.0f, 1.0f);
    fill_uniform(d.fch, n_out, -4.0f, 4.0f);
    fill_uniform(d.fcprojw, (size_t)d.C * d.OC, -0.1f, 0.1f);
    fill_uniform(d.dweight0, (size_t)d.OC * d.C, -1.0f, 1.0f);
    fill_uniform(d.dbias0, d.OC, -1.0f, 1.0f);
    fill_uniform(d.dfcb0, d.OC, -1.0f, 1.0f);
    transpose_matrices(d.weight_t, d.weight, d.OC, d.C, 1);
}

// Outputs poisoned, accumulated outputs set to their start values.
static void reset_outputs(const Buffers& d) {
    poison(d.dinp, (size_t)d.N * d.C);
    poison(d.dfch, (size_t)d.N * d.OC);
    copy_floats(d.dweight, d.dweight0, (size_t)d.OC * d.C);
    copy_floats(d.dbias, d.dbias0, d.OC);
    copy_floats(d.dfcb, d.dfcb0, d.OC);
}

// fc layer: CHECKED_ROWS rows of dinp, CHECKED_WEIGHTS entries of dweight, all of dbias.
static double check_fc(const Buffers& d) {
    int N = d.N, C = d.C, OC = d.OC;
    std::vector<float> dout = download(d.dout, (size_t)N * OC), inp = download(d.inp, (size_t)N * C);
    std::vector<float> weight = download(d.weight, (size_t)OC * C), dinp = download(d.dinp, (size_t)N * C);
    std::vector<float> dweight = download(d.dweight, (size_t)OC * C), dweight0 = download(d.dweight0, (size_t)OC * C);
    std::vector<float> dbias = download(d.dbias, OC), dbias0 = download(d.dbias0, OC);
    ErrorMeter dinp_error = {}, dweight_error = {}, dbias_error = {};
    for (int row : sample_rows(N, CHECKED_ROWS)) {
        for (int c = 0; c < C; c++) {
            double sum = 0.0;
            for (int o = 0; o < OC; o++) { sum += (double)dout[(size_t)row * OC + o] * weight[(size_t)o * C + c]; }
            error_add(&dinp_error, dinp[(size_t)row * C + c], sum);
        }
    }
    for (int i : sample_rows(OC * C, CHECKED_WEIGHTS)) {
        int o = i / C, c = i % C;
        double sum = dweight0[i];
        for (int row = 0; row < N; row++) { sum += (double)dout[(size_t)row * OC + o] * inp[(size_t)row * C + c]; }
        error_add(&dweight_error, dweight[i], sum);
    }
    std::vector<double> column_sums(dbias0.begin(), dbias0.end());
    for (int row = 0; row < N; row++) {
        for (int o = 0; o < OC; o++) { column_sums[o] += dout[(size_t)row * OC + o]; }
    }
    for (int o = 0; o < OC; o++) { error_add(&dbias_error, dbias[o], column_sums[o]); }
    double error = std::max({error_value(dinp_error), error_value(dweight_error), error_value(dbias_error)});
    return count_non_finite(d.dinp, (size_t)N * C) + count_non_finite(d.dweight, (size_t)OC * C) == 0 ? error : INFINITY;
}

// fcproj + GELU: CHECKED_ROWS rows of dfch against the CPU; dfcb against the column sums of the
// GPU's own dfch (a full CPU dfch would take N * C * OC multiply-adds).
static double check_gelu_pair(const Buffers& d) {
    int N = d.N, C = d.C, OC = d.OC;
    std::vector<float> dres = download(d.dresidual, (size_t)N * C), fch = download(d.fch, (size_t)N * OC);
    std::vector<float> w = download(d.fcprojw, (size_t)C * OC), dfch = download(d.dfch, (size_t)N * OC);
    std::vector<float> dfcb = download(d.dfcb, OC), dfcb0 = download(d.dfcb0, OC);
    ErrorMeter dfch_error = {}, dfcb_error = {};
    for (int row : sample_rows(N, CHECKED_ROWS)) {
        for (int j = 0; j < OC; j++) {
            double sum = 0.0;
            for (int c = 0; c < C; c++) { sum += (double)dres[(size_t)row * C + c] * w[(size_t)c * OC + j]; }
            error_add(&dfch_error, dfch[(size_t)row * OC + j], sum * gelu_tanh_grad(fch[(size_t)row * OC + j]));
        }
    }
    std::vector<double> column_sums(dfcb0.begin(), dfcb0.end());
    for (int row = 0; row < N; row++) {
        for (int j = 0; j < OC; j++) { column_sums[j] += dfch[(size_t)row * OC + j]; }
    }
    for (int j = 0; j < OC; j++) { error_add(&dfcb_error, dfcb[j], column_sums[j]); }
    double error = std::max(error_value(dfch_error), error_value(dfcb_error));
    return count_non_finite(d.dfch, (size_t)N * OC) == 0 ? error : INFINITY;
}

static double check_variant(const Buffers& d, int variant) {
    fill_inputs(d);
    reset_outputs(d);
    launch_variant(variant, d);
    return gelu_pair(variant) ? check_gelu_pair(d) : check_fc(d);
}

static std::vector<Output> outputs_of(const Buffers& d, int variant) {
    if (gelu_pair(variant)) { return {{d.dfch, (size_t)d.N * d.OC}, {d.dfcb, (size_t)d.OC}}; }
    return {{d.dinp, (size_t)d.N * d.C}, {d.dweight, (size_t)d.OC * d.C}, {d.dbias, (size_t)d.OC}};
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int N = LAB_ROWS, C = LAB_C, OC = 4 * LAB_C;
    size_t n_in = (size_t)N * C, n_out = (size_t)N * OC, n_weight = (size_t)OC * C;
    Buffers d = {};
    d.N = N, d.C = C, d.OC = OC;
    d.dinp = gpu_floats(n_in), d.dweight = gpu_floats(n_weight), d.dbias = gpu_floats(OC);
    d.dout = gpu_floats(n_out), d.inp = gpu_floats(n_in), d.weight = gpu_floats(n_weight);
    d.weight_t = gpu_floats(n_weight);
    d.dfch = gpu_floats(n_out), d.dfcb = gpu_floats(OC), d.dresidual = gpu_floats(n_in), d.fch = gpu_floats(n_out);
    d.fcprojw = gpu_floats(n_weight);
    d.dweight0 = gpu_floats(n_weight), d.dbias0 = gpu_floats(OC), d.dfcb0 = gpu_floats(OC);
    d.bias_scratch = gpu_floats(OC), d.partials = gpu_floats((size_t)BIAS_BACKWARD_MAX_CHUNKS * OC);
    d.counters = (unsigned int*)gpu_ints(MAX_REDUCTION_COUNTERS);
    cudaCheck(cudaMemset(d.counters, 0, MAX_REDUCTION_COUNTERS * sizeof(unsigned int)));
    d.bgradb_plan = lt_plan(C, OC, N, false, true, CUBLASLT_EPILOGUE_BGRADB, d.bias_scratch, NULL);
    d.dgelu_plan = lt_plan(OC, N, C, false, false, CUBLASLT_EPILOGUE_DGELU_BGRAD, d.bias_scratch, d.fch);
    d.dinp_plan = lt_plan(C, N, OC, false, false, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
    d.dweight_plan = lt_plan(C, OC, N, false, true, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
    if (variant_selected(7)) {
        fill_inputs(d);
        reset_outputs(d);
        int dinp_rank = lt_autotune(&d.dinp_plan, d.dinp, d.weight, d.dout, 0.0f, AUTOTUNE_CANDIDATES);
        int dweight_rank = lt_autotune(&d.dweight_plan, d.dweight, d.inp, d.dout, 1.0f, AUTOTUNE_CANDIDATES);
        note("7: the fastest algorithm is the heuristic's number %d for dinp, %d for dweight (0: its own choice)",
             dinp_rank, dweight_rank);
    }
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        LtPlan* plan = variant == 4 ? &d.bgradb_plan : variant == 5 ? &d.dgelu_plan : NULL;
        bool plan_works = variant == 7 ? d.dinp_plan.supported && d.dweight_plan.supported
                          : plan == NULL || (variant == 4 ? lt_try(plan, d.dweight, d.inp, d.dout, 1.0f)
                                                          : lt_try(plan, d.dfch, d.fcprojw, d.dresidual, 0.0f));
        if (!plan_works) {
            note("%s: cuBLASLt has no algorithm for this epilogue with FP32 data", VARIANT_NAMES[variant]);
            continue;
        }
        double error = check_variant(d, variant);
        Launch launch = [&] { launch_variant(variant, d); };
        Launch reset = [&] { reset_outputs(d); };
        Determinism det = deterministic(launch, reset, outputs_of(d, variant));
        if (plan != NULL) {
            Output bias = variant == 4 ? Output{d.dbias, (size_t)OC} : Output{d.dfcb, (size_t)OC};
            note("%s: its bias gradient alone bit-identical over 10 runs: %s", VARIANT_NAMES[variant],
                 deterministic(launch, reset, {bias}) == DETERMINISM_YES ? "yes" : "NO");
        }
        double flops = (gelu_pair(variant) ? 2.0 : 4.0) * N * C * OC;
        print_row("matmul_backward", VARIANT_NAMES[variant], bench_ms(launch, reset), flops,
                  uses_tf32(variant) ? CEILING_TF32 : CEILING_FP32, error,
                  uses_tf32(variant) ? TF32_TOLERANCE : FP32_TOLERANCE, det);
        for (int part = 0; variant == 2 && part < NUM_PARTS; part++) {  // the trainer's parts alone
            Launch launch_one = [&] { launch_part(part, d); };
            double part_ms = bench_ms(launch_one, reset);
            if (part != 2 && part != 4) {
                print_row("matmul_backward", PART_NAMES[part], part_ms, 2.0 * N * C * OC, CEILING_TF32, 0.0, -1.0,
                          DETERMINISM_UNCHECKED);
            } else {  // bytes: dout read once and dbias read and written, or the weight read and written
                double bytes = part == 4 ? 2.0 * OC * C * sizeof(float) : (n_out + 2.0 * OC) * sizeof(float);
                print_row("matmul_backward", PART_NAMES[part], part_ms, bytes, CEILING_COPY, 0.0, -1.0,
                          DETERMINISM_UNCHECKED);
            }
        }
    }
    for (LtPlan* plan : {&d.bgradb_plan, &d.dgelu_plan, &d.dinp_plan, &d.dweight_plan}) { lt_plan_destroy(plan); }
    gpu_free_all();
    return lab_finish();
}
