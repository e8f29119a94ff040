/*
Kernel lab: the linear layer backward on the MLP up-projection of GPT-2 124M (N = B*T = 8192 rows,
C = 768 in, OC = 3072 out), from dout (N, OC), inp (N, C), weight (OC, C):
  dinp (N, C) = dout @ weight,   dweight (OC, C) = dout^T @ inp,   dbias (OC) = column sums of dout
(every output written, not added to: the trainer needs no zeroing of its gradients between steps)
The trainer's products read transposed copies, so that both operands have the summed dimension
contiguous: weight_t (C, OC) (transpose_matrices, rebuilt when the weights change), dout_t (OC, N)
(written by bias_backward while it sums dbias) and inp_t (C, N) (transpose_matrices).

  variant 1  naive: a thread per output of each (dinp, dweight, dbias), FP32
  variant 2  the trainer's fc layer: bias_backward (dbias and dout_t; per-chunk partials, the last
             block of each column group adds them in order), transpose_matrices (inp_t), then
             matmul_backward_weight (dweight from dout_t, inp_t) and matmul_backward_input (dinp
             from weight_t, dout_t), cuBLASLt TF32
  variant 3  the same in cuBLAS's plain FP32, no tensor cores (the trainer's -f 2)
  variant 4  cuBLASLt TF32 on the operands as stored (dinp from the weight and dout, dweight from
             inp and dout), the bias gradient fused into the dweight product (BGRADB epilogue)
  Fusion (c), the MLP's down-projection backward and the GELU backward (fcproj: in 3072, out 768,
  its weight fcprojw (768, 3072)), from dresidual (N, C) and fch (N, OC), the GELU's input:
  variant 5  the dinp product with the CUBLASLT_EPILOGUE_DGELU_BGRAD epilogue: dfch = (dresidual @
             fcprojw) * gelu'(fch) and the fc bias gradient, in one call
  variant 6  as the trainer does it: matmul_backward_input (dgelu from fcprojw_t and dresidual), then
             bias_backward with gelu_inp = fch, in one pass: dfch_t = (dgelu * gelu'(fch))^T, gelu_t =
             gelu(fch)^T (the fcproj dweight product's input) and the fc bias gradient
  variant 7  as 2, each product with the fastest of cuBLASLt's first 16 heuristic algorithms,
             timed here on these shapes (autotuning, instead of the heuristic's first choice)
  variant 8  as 2 in split TF32 through cuBLASLt (the trainer's -f 0 before Hopper; on Hopper it runs
             gemm_split_tf32, matmul_wgmma.cu's variant 5, which these variants set aside; see
             matmul_forward.cu's variant 8): hi hi in chunks of at most 256 summed values, dweight's
             32 and dinp's 12 as one batched TF32 product into partial sums, which sum_arrays adds
             to the small terms in chunk order (scratch: 32 x OC x C)
  variant 9  as 8, hi hi in one product
  variant 10 as 8, hi hi in chunks of at most 384
  variant 11 as 8, every chunk a product of its own added by its epilogue (beta = 1), no room
             reserved for partial sums (the trainer's form until 2026-11-26)
Variants 2, 3 and 8-11 also print dinp's and dweight's max and mean error (mean |out - ref| over mean
|ref|) against FP64.

After variant 2, its parts timed alone, and for comparison the layouts they replace: the dinp
product from dout as stored and from the weight as stored, the dweight product from inp and dout
as stored (the trainer's before: both read across the summed dimension), the weight transposition.

  ./matmul_backward [variant ...]

FLOPs counted: 4 N C OC for variants 1-4 and 7 (two products), 2 N C OC for 5-6 (one); the bias
gradient, the transposes and the GELU are not counted. The memory-bound parts count the bytes they
read and write.
*/
#include "common.h"

constexpr int NUM_VARIANTS = 11;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: thread per output, FP32",
    "2 trainer: bias_backward, inp_t, dweight + dinp GEMMs, TF32",
    "3 trainer's launchers in plain FP32 (-f 2)",
    "4 TF32, dbias by the dweight GEMM's BGRADB epilogue",
    "5 (c) fcproj dinp GEMM + DGELU_BGRAD epilogue",
    "6 (c) trainer's: dinp GEMM, bias_backward(gelu_inp)",
    "7 as 2, each GEMM autotuned over 16 cuBLASLt algorithms",
    "8 trainer's launchers in split TF32 (-f 0)",
    "9 as 8, hi hi in one product",
    "10 as 8, hi hi in chunks of 384",
    "11 as 8, every hi hi chunk a product of its own",
};

// Relative to each output's max |value|. FP32: sums of up to N = 8192 terms (naive: in sequence);
// split TF32 is held to the same.
// TF32: both operands rounded to 10 mantissa bits, errors adding up at random over the sums.
constexpr double FP32_TOLERANCE = 5e-5, TF32_TOLERANCE = 5e-3;
constexpr int CHECKED_ROWS = 64, CHECKED_WEIGHTS = 4096;
constexpr int AUTOTUNE_CANDIDATES = 16;

static bool uses_tf32(int variant) { return variant != 1 && variant != 3 && variant < 8; }
static bool precision_variant(int variant) { return variant == 2 || variant == 3 || variant >= 8; }
static bool gelu_pair(int variant) { return variant == 5 || variant == 6; }
static bool writes_transposes(int variant) { return variant == 2 || variant == 3 || variant >= 7; }  // dout_t, inp_t

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
    dweight[idx] = sum;
}

__global__ void naive_dbias_kernel(float* dbias, const float* dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) { return; }
    float sum = 0.0f;
    for (int row = 0; row < N; row++) { sum += dout[(size_t)row * OC + o]; }
    dbias[o] = sum;
}

struct Buffers {
    // variants 1-4 and 7: the fc layer; weight_t (C, OC), dout_t (OC, N), inp_t (C, N): transposed
    float *dinp, *dweight, *dbias, *dout, *inp, *weight, *weight_t, *dout_t, *inp_t;
    // variants 5-6: the fcproj layer's dinp and the fc bias gradient; fcprojw (C, OC), fcprojw_t
    // (OC, C) its transpose; variant 6 writes dgelu (N, OC), dfch_t and gelu_t (OC, N)
    float *dfch, *dfcb, *dresidual, *fch, *fcprojw, *fcprojw_t, *dgelu, *dfch_t, *gelu_t;
    float* partials;
    unsigned int* counters;
    size_t split_operands;  // split TF32's scratch for the operands alone (variant 11)
    LtPlan bgradb_plan, dgelu_plan, dinp_plan, dweight_plan;  // the last two autotuned
    int N, C, OC;
};

// What variants 2, 3 and 7 run before their products: dbias and dout_t, then inp_t.
static void bias_and_transposes(const Buffers& d) {
    bias_backward(d.dbias, d.dout_t, nullptr, d.partials, d.counters, d.dout, nullptr, d.N, d.OC);
    transpose_matrices(d.inp_t, d.inp, d.N, d.C, 1);
}

static void launch_variant(int variant, const Buffers& d) {
    int N = d.N, C = d.C, OC = d.OC;
    if (variant == 1) {
        naive_dinp_kernel<<<ceil_div((size_t)N * C, 256), 256>>>(d.dinp, d.dout, d.weight, N, C, OC);
        naive_dweight_kernel<<<ceil_div((size_t)OC * C, 256), 256>>>(d.dweight, d.dout, d.inp, N, C, OC);
        naive_dbias_kernel<<<ceil_div(OC, 256), 256>>>(d.dbias, d.dout, N, OC);
        cudaCheck(cudaGetLastError());
    } else if (variant == 2 || variant == 3 || variant >= 8) {
        g_precision = variant == 2 ? MATMUL_TF32 : variant == 3 ? MATMUL_FP32 : MATMUL_SPLIT_TF32;
        int trainer_chunk = g_split_chunk;
        size_t reserved = g_split_scratch_floats[0];
        g_split_chunk = variant == 9 ? 0 : variant == 10 ? 384 : trainer_chunk;
        if (variant == 11) { g_split_scratch_floats[0] = d.split_operands; }  // the partial sums do not fit
        bool wgmma = g_wgmma;
        g_wgmma = false;  // cuBLASLt's split path, not gemm_split_tf32
        bias_and_transposes(d);
        matmul_backward_weight(d.dweight, d.dout_t, d.inp_t, true, N, C, OC);
        matmul_backward_input(d.dinp, d.dout_t, true, d.weight_t, N, C, OC);
        g_wgmma = wgmma;
        g_split_chunk = trainer_chunk;
        g_split_scratch_floats[0] = reserved;
        g_precision = MATMUL_TF32;
    } else if (variant == 4) {
        matmul(d.dinp, d.weight, d.dout, nullptr, C, N, OC, false, false, 1.0f, 0.0f);
        lt_run(&d.bgradb_plan, d.dweight, d.inp, d.dout, 0.0f);
    } else if (variant == 5) {
        lt_run(&d.dgelu_plan, d.dfch, d.fcprojw, d.dresidual, 0.0f);
    } else if (variant == 6) {
        matmul_backward_input(d.dgelu, d.dresidual, false, d.fcprojw_t, N, OC, C);
        bias_backward(d.dfcb, d.dfch_t, d.gelu_t, d.partials, d.counters, d.dgelu, d.fch, N, OC);
    } else {
        bias_and_transposes(d);
        lt_run(&d.dweight_plan, d.dweight, d.inp_t, d.dout_t, 0.0f);
        lt_run(&d.dinp_plan, d.dinp, d.weight_t, d.dout_t, 0.0f);
    }
}

// The parts of variant 2 alone (the first four), then what they replace: the dinp product from
// dout as stored (weight_t), from the weight as stored (cuBLASLt then reads the weight along its
// rows' stride), the dweight product from inp and dout as stored, and the weight transposition.
constexpr int NUM_PARTS = 8;
constexpr const char* PART_NAMES[] = {"2 trainer, part: dinp GEMM (weight_t, dout_t)",
                                         "2 trainer, part: dweight GEMM (dout_t, inp_t)",
                                         "2 trainer, part: bias_backward (dbias + dout_t)",
                                         "2 trainer, part: transpose_matrices of inp",
                                         "dinp GEMM from dout as stored (weight_t)",
                                         "dinp GEMM from the weight as stored",
                                         "dweight GEMM from both as stored (the trainer's before)",
                                         "transpose_matrices of the weight"};

static void launch_part(int part, const Buffers& d) {
    int N = d.N, C = d.C, OC = d.OC;
    if (part == 0) { matmul_backward_input(d.dinp, d.dout_t, true, d.weight_t, N, C, OC); }
    else if (part == 1) { matmul_backward_weight(d.dweight, d.dout_t, d.inp_t, true, N, C, OC); }
    else if (part == 2) { bias_backward(d.dbias, d.dout_t, nullptr, d.partials, d.counters, d.dout, nullptr, N, OC); }
    else if (part == 3) { transpose_matrices(d.inp_t, d.inp, N, C, 1); }
    else if (part == 4) { matmul_backward_input(d.dinp, d.dout, false, d.weight_t, N, C, OC); }
    else if (part == 5) { matmul(d.dinp, d.weight, d.dout, nullptr, C, N, OC, false, false, 1.0f, 0.0f); }
    else if (part == 6) { matmul(d.dweight, d.inp, d.dout, nullptr, C, OC, N, false, true, 1.0f, 0.0f); }
    else { transpose_matrices(d.weight_t, d.weight, OC, C, 1); }
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
    transpose_matrices(d.weight_t, d.weight, d.OC, d.C, 1);
    transpose_matrices(d.fcprojw_t, d.fcprojw, d.C, d.OC, 1);
}

// Every output and transposed copy the variants write poisoned (NaN stays where one is not written).
static void reset_outputs(const Buffers& d) {
    size_t n_in = (size_t)d.N * d.C, n_out = (size_t)d.N * d.OC;
    poison(d.dinp, n_in);
    poison(d.inp_t, n_in);
    poison(d.dweight, (size_t)d.OC * d.C);
    for (float* p : {d.dbias, d.dfcb}) { poison(p, d.OC); }
    for (float* p : {d.dout_t, d.dfch, d.dgelu, d.dfch_t, d.gelu_t}) { poison(p, n_out); }
}

// fc layer: CHECKED_ROWS rows of dinp, CHECKED_WEIGHTS entries of dweight, all of dbias, and
// (variants 2, 3, 7) all of dout_t and inp_t against dout and inp transposed.
static double check_fc(const Buffers& d, int variant) {
    int N = d.N, C = d.C, OC = d.OC;
    std::vector<float> dout = download(d.dout, (size_t)N * OC), inp = download(d.inp, (size_t)N * C);
    std::vector<float> weight = download(d.weight, (size_t)OC * C), dinp = download(d.dinp, (size_t)N * C);
    std::vector<float> dweight = download(d.dweight, (size_t)OC * C), dbias = download(d.dbias, OC);
    ErrorMeter dinp_error = {}, dweight_error = {}, dbias_error = {}, transpose_error = {};
    for (int row : sample_rows(N, CHECKED_ROWS)) {
        for (int c = 0; c < C; c++) {
            double sum = 0.0;
            for (int o = 0; o < OC; o++) { sum += (double)dout[(size_t)row * OC + o] * weight[(size_t)o * C + c]; }
            error_add(&dinp_error, dinp[(size_t)row * C + c], sum);
        }
    }
    for (int i : sample_rows(OC * C, CHECKED_WEIGHTS)) {
        int o = i / C, c = i % C;
        double sum = 0.0;
        for (int row = 0; row < N; row++) { sum += (double)dout[(size_t)row * OC + o] * inp[(size_t)row * C + c]; }
        error_add(&dweight_error, dweight[i], sum);
    }
    std::vector<double> column_sums(OC, 0.0);
    for (int row = 0; row < N; row++) {
        for (int o = 0; o < OC; o++) { column_sums[o] += dout[(size_t)row * OC + o]; }
    }
    for (int o = 0; o < OC; o++) { error_add(&dbias_error, dbias[o], column_sums[o]); }
    if (writes_transposes(variant)) {
        std::vector<float> dout_t = download(d.dout_t, (size_t)OC * N), inp_t = download(d.inp_t, (size_t)C * N);
        for (size_t i = 0; i < dout_t.size(); i++) { error_add(&transpose_error, dout_t[i], dout[i % N * OC + i / N]); }
        for (size_t i = 0; i < inp_t.size(); i++) { error_add(&transpose_error, inp_t[i], inp[i % N * C + i / N]); }
    }
    if (precision_variant(variant)) {
        note("error against FP64, %s: dinp max %.2e mean %.2e, dweight max %.2e mean %.2e", VARIANT_NAMES[variant],
             error_value(dinp_error), error_mean(dinp_error), error_value(dweight_error), error_mean(dweight_error));
    }
    double error = std::max({error_value(dinp_error), error_value(dweight_error), error_value(dbias_error),
                             error_value(transpose_error)});
    return count_non_finite(d.dinp, (size_t)N * C) + count_non_finite(d.dweight, (size_t)OC * C) == 0 ? error : INFINITY;
}

// fcproj + GELU: CHECKED_ROWS rows of dfch (variant 6: of dfch_t, and of gelu_t against gelu(fch))
// against the CPU; dfcb against the column sums of the GPU's own dfch (a full CPU dfch would take
// N * C * OC multiply-adds).
static double check_gelu_pair(const Buffers& d, int variant) {
    int N = d.N, C = d.C, OC = d.OC;
    size_t n_out = (size_t)N * OC;
    bool transposed = variant == 6;
    std::vector<float> dres = download(d.dresidual, (size_t)N * C), fch = download(d.fch, n_out);
    std::vector<float> w = download(d.fcprojw, (size_t)C * OC), dfch = download(transposed ? d.dfch_t : d.dfch, n_out);
    std::vector<float> gelu_t = transposed ? download(d.gelu_t, n_out) : std::vector<float>();
    std::vector<float> dfcb = download(d.dfcb, OC);
    ErrorMeter dfch_error = {}, gelu_error = {}, dfcb_error = {};
    for (int row : sample_rows(N, CHECKED_ROWS)) {
        for (int j = 0; j < OC; j++) {
            double sum = 0.0;
            for (int c = 0; c < C; c++) { sum += (double)dres[(size_t)row * C + c] * w[(size_t)c * OC + j]; }
            double x = fch[(size_t)row * OC + j];
            size_t at = transposed ? (size_t)j * N + row : (size_t)row * OC + j;  // [row, j] as stored
            error_add(&dfch_error, dfch[at], sum * gelu_tanh_grad(x));
            if (transposed) { error_add(&gelu_error, gelu_t[at], gelu_tanh(x)); }
        }
    }
    std::vector<double> column_sums(OC, 0.0);
    for (size_t i = 0; i < n_out; i++) { column_sums[transposed ? i / N : i % OC] += dfch[i]; }
    for (int j = 0; j < OC; j++) { error_add(&dfcb_error, dfcb[j], column_sums[j]); }
    double error = std::max({error_value(dfch_error), error_value(gelu_error), error_value(dfcb_error)});
    unsigned long long non_finite = transposed ? count_non_finite(d.dfch_t, n_out) + count_non_finite(d.gelu_t, n_out)
                                               : count_non_finite(d.dfch, n_out);
    return non_finite == 0 ? error : INFINITY;
}

static double check_variant(const Buffers& d, int variant) {
    fill_inputs(d);
    reset_outputs(d);
    launch_variant(variant, d);
    return gelu_pair(variant) ? check_gelu_pair(d, variant) : check_fc(d, variant);
}

static std::vector<Output> outputs_of(const Buffers& d, int variant) {
    size_t n_in = (size_t)d.N * d.C, n_out = (size_t)d.N * d.OC;
    if (variant == 5) { return {{d.dfch, n_out}, {d.dfcb, (size_t)d.OC}}; }
    if (variant == 6) { return {{d.dgelu, n_out}, {d.dfch_t, n_out}, {d.gelu_t, n_out}, {d.dfcb, (size_t)d.OC}}; }
    std::vector<Output> outputs = {{d.dinp, n_in}, {d.dweight, (size_t)d.OC * d.C}, {d.dbias, (size_t)d.OC}};
    if (writes_transposes(variant)) {
        outputs.push_back({d.dout_t, n_out});
        outputs.push_back({d.inp_t, n_in});
    }
    return outputs;
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int N = LAB_ROWS, C = LAB_C, OC = 4 * LAB_C;
    size_t n_in = (size_t)N * C, n_out = (size_t)N * OC, n_weight = (size_t)OC * C;
    Buffers d = {};
    d.N = N, d.C = C, d.OC = OC;
    d.dinp = gpu_floats(n_in), d.dweight = gpu_floats(n_weight), d.dbias = gpu_floats(OC);
    d.dout = gpu_floats(n_out), d.inp = gpu_floats(n_in), d.weight = gpu_floats(n_weight);
    d.weight_t = gpu_floats(n_weight), d.dout_t = gpu_floats(n_out), d.inp_t = gpu_floats(n_in);
    d.dfch = gpu_floats(n_out), d.dfcb = gpu_floats(OC), d.dresidual = gpu_floats(n_in), d.fch = gpu_floats(n_out);
    d.fcprojw = gpu_floats(n_weight), d.fcprojw_t = gpu_floats(n_weight);
    d.dgelu = gpu_floats(n_out), d.dfch_t = gpu_floats(n_out), d.gelu_t = gpu_floats(n_out);
    d.partials = gpu_floats((size_t)BIAS_BACKWARD_MAX_CHUNKS * OC);
    d.counters = (unsigned int*)gpu_ints(MAX_REDUCTION_COUNTERS);
    cudaCheck(cudaMemset(d.counters, 0, MAX_REDUCTION_COUNTERS * sizeof(unsigned int)));
    // split TF32: the dweight product's two operands, then the partial sums of dweight's or dinp's chunks
    d.split_operands = 2 * (n_out + n_in) + 4;
    size_t split_partials = std::max(split_partial_floats(C, OC, N), split_partial_floats(C, N, OC));
    split_scratch_reserve(d.split_operands + split_partials, 0);
    d.bgradb_plan = lt_plan(C, OC, N, false, true, CUBLASLT_EPILOGUE_BGRADB, d.dbias, nullptr);
    d.dgelu_plan = lt_plan(OC, N, C, false, false, CUBLASLT_EPILOGUE_DGELU_BGRAD, d.dfcb, d.fch);
    d.dinp_plan = lt_plan(C, N, OC, true, true, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr);      // weight_t, dout_t
    d.dweight_plan = lt_plan(C, OC, N, true, false, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr);  // inp_t, dout_t
    if (variant_selected(7)) {
        fill_inputs(d);
        reset_outputs(d);
        bias_and_transposes(d);
        int dinp_rank = lt_autotune(&d.dinp_plan, d.dinp, d.weight_t, d.dout_t, 0.0f, AUTOTUNE_CANDIDATES);
        int dweight_rank = lt_autotune(&d.dweight_plan, d.dweight, d.inp_t, d.dout_t, 0.0f, AUTOTUNE_CANDIDATES);
        note("7: the fastest algorithm is the heuristic's number %d for dinp, %d for dweight (0: its own choice)",
             dinp_rank, dweight_rank);
    }
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        LtPlan* plan = variant == 4 ? &d.bgradb_plan : variant == 5 ? &d.dgelu_plan : nullptr;
        bool plan_works = variant == 7 ? d.dinp_plan.supported && d.dweight_plan.supported
                          : plan == nullptr || (variant == 4 ? lt_try(plan, d.dweight, d.inp, d.dout, 0.0f)
                                                          : lt_try(plan, d.dfch, d.fcprojw, d.dresidual, 0.0f));
        if (!plan_works) {
            note("%s: cuBLASLt has no algorithm for this epilogue with FP32 data", VARIANT_NAMES[variant]);
            continue;
        }
        double error = check_variant(d, variant);
        Launch launch = [&] { launch_variant(variant, d); };
        Launch reset = [&] { reset_outputs(d); };
        Determinism det = deterministic(launch, reset, outputs_of(d, variant));
        if (plan != nullptr) {
            Output bias = variant == 4 ? Output{d.dbias, (size_t)OC} : Output{d.dfcb, (size_t)OC};
            note("%s: its bias gradient alone bit-identical over 10 runs: %s", VARIANT_NAMES[variant],
                 deterministic(launch, reset, {bias}) == DETERMINISM_YES ? "yes" : "NO");
        }
        double flops = (gelu_pair(variant) ? 2.0 : 4.0) * N * C * OC;
        print_row("matmul_backward", VARIANT_NAMES[variant], bench_ms(launch, reset), flops,
                  uses_tf32(variant) ? CEILING_TF32 : CEILING_FP32, error,
                  uses_tf32(variant) ? TF32_TOLERANCE : FP32_TOLERANCE, det);
        if (variant != 2) { continue; }
        // The parts: dout_t and inp_t computed once for the products that read them. Bytes (0: a
        // product, FLOPs counted): bias_backward reads dout and writes dout_t and dbias; a
        // transposition reads and writes.
        reset_outputs(d);
        bias_and_transposes(d);
        const double part_bytes[NUM_PARTS] = {0.0, 0.0, (2.0 * n_out + OC) * sizeof(float),
                                              2.0 * n_in * sizeof(float), 0.0, 0.0, 0.0,
                                              2.0 * n_weight * sizeof(float)};
        for (int part = 0; part < NUM_PARTS; part++) {
            double part_ms = bench_ms([&] { launch_part(part, d); });
            bool product = part_bytes[part] == 0.0;
            print_row("matmul_backward", PART_NAMES[part], part_ms, product ? 2.0 * N * C * OC : part_bytes[part],
                      product ? CEILING_TF32 : CEILING_COPY, 0.0, -1.0, DETERMINISM_UNCHECKED);
        }
    }
    for (LtPlan* plan : {&d.bgradb_plan, &d.dgelu_plan, &d.dinp_plan, &d.dweight_plan}) { lt_plan_destroy(plan); }
    gpu_free_all();
    return lab_finish();
}
