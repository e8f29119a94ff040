/*
The kernel lab's harness, shared by every .cu file of dev/cuda. It includes the trainer (its main()
left out by TESTING), so every kernel and launcher of train_gpt2_fp32.cu can be called as is, and
adds what each lab file needs to check and time its variants:
  lab_init / lab_finish      command line (which variants), device setup, the table, exit status
  fill_uniform, fill_tokens  fresh random device data for every check (never zeros)
  poison                     outputs set to NaN, so anything left unwritten shows
  relative_error, ErrorMeter max |got - want| / max |want| against a CPU reference in double
  bench_ms                   CUDA events, warm-up, median of BENCH_REPEATS launches, L2 flushed
  deterministic              10 runs, the output bits hashed, all equal?
  print_row                  the one table row every file prints
  LtPlan                     a cuBLASLt product with an epilogue the trainer's matmul() lacks
*/
#pragma once
#define TESTING
#include "../../train_gpt2_fp32.cu"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

// GPT-2 124M shapes: B=8 sequences of T=1024 tokens, C=768 channels, 12 heads, the vocabulary
// and its padding to a multiple of 128.
constexpr int LAB_B = 8, LAB_T = 1024, LAB_C = 768, LAB_NH = 12, LAB_V = 50257, LAB_VP = 50304;
constexpr int LAB_ROWS = LAB_B * LAB_T;

// The chip's measured ceilings (shared/ANCHORS.md, one H200).
constexpr double COPY_CEILING_GBS = 4280.0;    // device-to-device copy, bytes read + written
constexpr double TF32_CEILING_TFLOPS = 402.0;  // TF32 tensor-core GEMM 8192^3 (cuBLAS)
constexpr double FP32_CEILING_TFLOPS = 50.5;   // plain FP32 GEMM 8192^3, no tensor cores

using Launch = std::function<void()>;

// ----------------------------------------------------------------------------------------------
// Command line, setup and the table

static std::vector<int> g_variants;  // variants named on the command line; empty: all
static int g_failures;               // rows whose error is over their tolerance
static uint64_t g_seed;              // advances with every fill: each check gets fresh data
static float* g_flush_buffer;        // several times the L2, read between timed launches
static size_t g_flush_floats;
static float* g_flush_sink;

static bool variant_selected(int variant) {
    return g_variants.empty() || std::find(g_variants.begin(), g_variants.end(), variant) != g_variants.end();
}

// Parses `./name [variant ...]` (1..num_variants), sets the device up (TF32 on, as the trainer
// runs) and prints the table's header. Exits 0 with SKIPPED when there is no GPU.
static void lab_init(int argc, char** argv, int num_variants) {
    for (int i = 1; i < argc; i++) {
        int v = atoi(argv[i]);
        if (v < 1 || v > num_variants) { fail("variant '%s': expected a number from 1 to %d", argv[i], num_variants); }
        g_variants.push_back(v);
    }
    if (!cuda_setup(MATMUL_TF32)) {
        printf("SKIPPED: no CUDA device\n");
        exit(0);
    }
    int l2_bytes = 0;
    cudaCheck(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
    g_flush_floats = 3 * (size_t)l2_bytes / sizeof(float);
    g_flush_buffer = (float*)device_malloc(g_flush_floats * sizeof(float), "L2 flush");
    g_flush_sink = (float*)device_malloc(sizeof(float), "L2 flush");
    cudaCheck(cudaMemset(g_flush_buffer, 0, g_flush_floats * sizeof(float)));
    g_seed = splitmix64((uint64_t)time(nullptr));
    printf("# %s, %d SMs, L2 %d MB, seed %llu\n", g_device_name, g_num_sms, l2_bytes >> 20, (unsigned long long)g_seed);
    printf("| %-18s | %-64s | %8s | %-12s | %-11s | %-13s | %-9s | %-13s |\n", "kernel", "variant", "ms",
           "GB/s, TFLOP/s", "% ceiling", "max error", "tolerance", "deterministic");
    printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(20, '-').c_str(), std::string(66, '-').c_str(),
           std::string(10, '-').c_str(), std::string(14, '-').c_str(), std::string(13, '-').c_str(),
           std::string(15, '-').c_str(), std::string(11, '-').c_str(), std::string(15, '-').c_str());
    fflush(stdout);
}

static int lab_finish() {
    printf("# %s: %d row(s) over tolerance\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
    return g_failures == 0 ? 0 : 1;
}

enum Ceiling { CEILING_COPY, CEILING_TF32, CEILING_FP32 };
enum Determinism { DETERMINISM_UNCHECKED, DETERMINISM_YES, DETERMINISM_NO };

// One row: `work` is the bytes moved (CEILING_COPY) or the FLOPs done (the GEMM ceilings) as each
// file counts them; a negative tolerance means no correctness check belongs to this row.
static void print_row(const char* kernel, const char* variant, double ms, double work, Ceiling ceiling, double error,
                      double tolerance, Determinism determinism) {
    static const char* ceiling_names[] = {"copy", "tf32", "fp32"};
    static const double ceilings[] = {COPY_CEILING_GBS, TF32_CEILING_TFLOPS, FP32_CEILING_TFLOPS};
    double rate = ceiling == CEILING_COPY ? work / ms * 1e-6 : work / ms * 1e-9;
    char rate_text[32], percent_text[32], error_text[32] = "-", tolerance_text[32] = "-";
    snprintf(rate_text, sizeof(rate_text), ceiling == CEILING_COPY ? "%.0f GB/s" : "%.1f TF/s", rate);
    snprintf(percent_text, sizeof(percent_text), "%.1f%% %s", 100.0 * rate / ceilings[ceiling], ceiling_names[ceiling]);
    bool checked = tolerance >= 0.0;
    bool over = checked && !(error <= tolerance);
    if (checked) {
        snprintf(error_text, sizeof(error_text), "%.1e%s", error, over ? " FAIL" : "");
        snprintf(tolerance_text, sizeof(tolerance_text), "%.0e", tolerance);
    }
    const char* determinism_text[] = {"-", "yes", "NO"};
    printf("| %-18s | %-64s | %8.4f | %-12s | %-11s | %-13s | %-9s | %-13s |\n", kernel, variant, ms, rate_text,
           percent_text, error_text, tolerance_text, determinism_text[determinism]);
    fflush(stdout);
    g_failures += over;
}

// A line of commentary between the rows (the table readers skip it).
static void note(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    printf("# ");
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
    fflush(stdout);
}

// ----------------------------------------------------------------------------------------------
// Device data

static std::vector<void*> g_allocations;

static float* gpu_floats(size_t n) {
    g_allocations.push_back(device_malloc(n * sizeof(float), "lab buffer"));
    return (float*)g_allocations.back();
}

static int* gpu_ints(size_t n) {
    g_allocations.push_back(device_malloc(n * sizeof(int), "lab buffer"));
    return (int*)g_allocations.back();
}

static void gpu_free_all() {
    for (void* p : g_allocations) { cudaCheck(cudaFree(p)); }
    g_allocations.clear();
}

// Uniform in [lo, hi) from a counter-based generator: element i of fill number g_seed.
__global__ void fill_uniform_kernel(float* p, size_t n, float lo, float hi, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    uint64_t bits = splitmix64(seed ^ splitmix64(i));
    p[i] = lo + (hi - lo) * ((uint32_t)(bits >> 40) / 16777216.0f);
}

__global__ void fill_tokens_kernel(int* p, size_t n, int vocab, bool skewed, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    double u = (splitmix64(seed ^ splitmix64(i)) >> 11) * (1.0 / 9007199254740992.0);
    p[i] = (int)(vocab * (skewed ? u * u * u * u : u));  // u^4: small ids frequent, as in text
}

static void fill_uniform(float* p, size_t n, float lo, float hi) {
    fill_uniform_kernel<<<ceil_div(n, 256), 256>>>(p, n, lo, hi, g_seed++);
    cudaCheck(cudaGetLastError());
}

static void fill_tokens(int* p, size_t n, int vocab, bool skewed) {
    fill_tokens_kernel<<<ceil_div(n, 256), 256>>>(p, n, vocab, skewed, g_seed++);
    cudaCheck(cudaGetLastError());
}

// All bits set: a NaN that no kernel computes by accident.
static void poison(float* p, size_t n) { cudaCheck(cudaMemset(p, 0xff, n * sizeof(float))); }

static void copy_floats(float* dst, const float* src, size_t n) {
    cudaCheck(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice));
}

static std::vector<float> download(const float* p, size_t n) {
    std::vector<float> host(n);
    cudaCheck(cudaMemcpy(host.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

static std::vector<int> download_ints(const int* p, size_t n) {
    std::vector<int> host(n);
    cudaCheck(cudaMemcpy(host.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost));
    return host;
}

// ----------------------------------------------------------------------------------------------
// Errors against the CPU reference

// max |got - want| over max |want| of the values added; a non-finite value makes it infinite. The
// mean error: mean |got - want| over mean |want|.
struct ErrorMeter {
    double max_diff, max_want, sum_diff, sum_want;
    bool non_finite;
};

static void error_add(ErrorMeter* e, float got, double want) {
    e->non_finite |= !isfinite(got);
    e->max_diff = std::max(e->max_diff, fabs((double)got - want));
    e->max_want = std::max(e->max_want, fabs(want));
    e->sum_diff += fabs((double)got - want);
    e->sum_want += fabs(want);
}

static double error_value(const ErrorMeter& e) {
    return e.non_finite ? INFINITY : e.max_diff / std::max(e.max_want, 1e-30);
}

static double error_mean(const ErrorMeter& e) {
    return e.non_finite ? INFINITY : e.sum_diff / std::max(e.sum_want, 1e-30);
}

static double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
    ErrorMeter e = {};
    for (size_t i = 0; i < got.size(); i++) { error_add(&e, got[i], want[i]); }
    return error_value(e);
}

// Count of NaN and infinite values, for outputs checked only in part against the CPU.
__global__ void count_non_finite_kernel(unsigned long long* count, const float* p, size_t n) {
    unsigned long long local = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        local += !isfinite(p[i]);
    }
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    local = cg::reduce(warp, local, cg::plus<unsigned long long>());
    if (warp.thread_rank() == 0 && local > 0) { atomicAdd(count, local); }
}

static unsigned long long count_non_finite(const float* p, size_t n) {
    unsigned long long* count = (unsigned long long*)device_malloc(sizeof(unsigned long long), "count");
    cudaCheck(cudaMemset(count, 0, sizeof(unsigned long long)));
    count_non_finite_kernel<<<4 * g_num_sms, 256>>>(count, p, n);
    cudaCheck(cudaGetLastError());
    unsigned long long host = 0;
    cudaCheck(cudaMemcpy(&host, count, sizeof(host), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(count));
    return host;
}

// ----------------------------------------------------------------------------------------------
// Timing

constexpr int BENCH_WARMUP = 3, BENCH_REPEATS = 25;

// Reads the flush buffer, evicting whatever the last launch left in the L2 (dirty lines are
// written back here, not inside the next timed launch). The sink is never written: the buffer is 0.
__global__ void flush_l2_kernel(float* sink, const float4* buffer, size_t n4) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        sum = sum + buffer[i];
    }
    if (sum4(sum) != 0.0f) { sink[0] = sum4(sum); }
}

static void flush_l2() {
    flush_l2_kernel<<<2 * g_num_sms, 1024>>>(g_flush_sink, (const float4*)g_flush_buffer, g_flush_floats / 4);
    cudaCheck(cudaGetLastError());
}

// Median device time (ms) of `launch`, each launch timed alone by events after `prepare`
// (untimed: restores what an in-place kernel overwrote) and an L2 flush. The flush runs long
// enough on the GPU that the launch is queued before the start event: no host gap is timed.
static double bench_ms(const Launch& launch, const Launch& prepare = Launch()) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    std::vector<float> times;
    for (int i = 0; i < BENCH_WARMUP + BENCH_REPEATS; i++) {
        if (prepare) { prepare(); }
        flush_l2();
        cudaCheck(cudaEventRecord(start));
        launch();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        if (i >= BENCH_WARMUP) { times.push_back(ms); }
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// ----------------------------------------------------------------------------------------------
// Determinism

// Sum over i of splitmix64(i, bits[i]) in 64-bit integers: the order of the additions does not
// matter (so the hash itself is deterministic) and any changed bit changes it.
__global__ void hash_bits_kernel(unsigned long long* hash, const uint32_t* bits, size_t n) {
    unsigned long long local = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        local += splitmix64(((uint64_t)i << 32) ^ bits[i]);
    }
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    local = cg::reduce(warp, local, cg::plus<unsigned long long>());
    if (warp.thread_rank() == 0) { atomicAdd(hash, local); }
}

struct Output {
    const float* data;
    size_t n;
};

static uint64_t hash_outputs(const std::vector<Output>& outputs) {
    unsigned long long* hash = (unsigned long long*)device_malloc(sizeof(unsigned long long), "hash");
    cudaCheck(cudaMemset(hash, 0, sizeof(unsigned long long)));
    for (size_t k = 0; k < outputs.size(); k++) {
        hash_bits_kernel<<<4 * g_num_sms, 256>>>(hash, (const uint32_t*)outputs[k].data, outputs[k].n);
        cudaCheck(cudaGetLastError());
    }
    unsigned long long host = 0;
    cudaCheck(cudaMemcpy(&host, hash, sizeof(host), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(hash));
    return host;
}

// 10 runs of prepare + launch on the same inputs: are the outputs' bits the same every time?
static Determinism deterministic(const Launch& launch, const Launch& prepare, const std::vector<Output>& outputs) {
    uint64_t first = 0;
    bool same = true;
    for (int run = 0; run < 10; run++) {
        prepare();
        launch();
        uint64_t hash = hash_outputs(outputs);
        if (run == 0) { first = hash; }
        same &= hash == first;
    }
    return same ? DETERMINISM_YES : DETERMINISM_NO;
}

// ----------------------------------------------------------------------------------------------
// cuBLASLt with an epilogue the trainer's matmul() does not offer, in the same column-major terms:
// out (m x n) = op(A) (m x k) * op(B) (k x n) + beta * out, then the epilogue. `bias` is the bias
// read (BIAS, GELU_AUX_BIAS) or the bias gradient written (BGRADB, DGELU_BGRAD); `aux` (ld m) the
// GELU input written (GELU_AUX_BIAS) or read (DGELU_BGRAD). The pointers are fixed per plan.

struct LtPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, out_layout;
    cublasLtMatmulAlgo_t algo;
    bool supported;  // cuBLASLt found an algorithm
};

// The heuristic's best `count` algorithms for the plan's shapes (its first is cuBLASLt's choice).
static int lt_heuristics(const LtPlan* plan, cublasLtMatmulHeuristicResult_t* results, int count) {
    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &CUBLASLT_WORKSPACE_SIZE, sizeof(CUBLASLT_WORKSPACE_SIZE)));
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(g_cublaslt, plan->desc, plan->a_layout, plan->b_layout,
                                                           plan->out_layout, plan->out_layout, preference, count,
                                                           results, &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    return status == CUBLAS_STATUS_SUCCESS ? found : 0;
}

static LtPlan lt_plan(int m, int n, int k, bool trans_a, bool trans_b, cublasLtEpilogue_t epilogue, const void* bias,
                      const void* aux) {
    LtPlan plan = {};
    cublasComputeType_t compute = g_precision == MATMUL_FP32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
    cublasCheck(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias != nullptr) {
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (aux != nullptr) {
        int64_t aux_ld = m;
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
    plan.a_layout = trans_a ? make_layout(k, m, k, 1, 0) : make_layout(m, k, m, 1, 0);
    plan.b_layout = trans_b ? make_layout(n, k, n, 1, 0) : make_layout(k, n, k, 1, 0);
    plan.out_layout = make_layout(m, n, m, 1, 0);
    cublasLtMatmulHeuristicResult_t heuristic;
    plan.supported = lt_heuristics(&plan, &heuristic, 1) > 0;
    if (plan.supported) { plan.algo = heuristic.algo; }
    return plan;
}

static void lt_run(const LtPlan* plan, float* out, const float* a, const float* b, float beta) {
    const float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(g_cublaslt, plan->desc, &alpha, a, plan->a_layout, b, plan->b_layout, &beta, out,
                               plan->out_layout, out, plan->out_layout, &plan->algo, g_cublaslt_workspace,
                               CUBLASLT_WORKSPACE_SIZE, 0));
}

// One trial run: false, and the plan marked unsupported, if cuBLASLt has no algorithm for it or
// refuses to run it.
static bool lt_try(LtPlan* plan, float* out, const float* a, const float* b, float beta) {
    if (plan->supported) {
        const float alpha = 1.0f;
        cublasStatus_t status = cublasLtMatmul(g_cublaslt, plan->desc, &alpha, a, plan->a_layout, b, plan->b_layout,
                                               &beta, out, plan->out_layout, out, plan->out_layout, &plan->algo,
                                               g_cublaslt_workspace, CUBLASLT_WORKSPACE_SIZE, 0);
        plan->supported = status == CUBLAS_STATUS_SUCCESS && cudaDeviceSynchronize() == cudaSuccess;
    }
    return plan->supported;
}

// Times the heuristic's first `candidates` algorithms on these operands and keeps the fastest;
// returns its rank in the heuristic's list (0: cuBLASLt's own choice was the fastest).
static int lt_autotune(LtPlan* plan, float* out, const float* a, const float* b, float beta, int candidates) {
    std::vector<cublasLtMatmulHeuristicResult_t> results(candidates);
    int found = lt_heuristics(plan, results.data(), candidates), best = 0;
    double best_ms = INFINITY;
    for (int i = 0; i < found; i++) {
        plan->algo = results[i].algo;
        plan->supported = true;
        if (!lt_try(plan, out, a, b, beta)) { continue; }
        double ms = bench_ms([&] { lt_run(plan, out, a, b, beta); });
        if (ms < best_ms) {
            best_ms = ms;
            best = i;
        }
    }
    plan->algo = results[best].algo;
    plan->supported = best_ms < INFINITY;
    return best;
}

static void lt_plan_destroy(LtPlan* plan) {
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->a_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->b_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->out_layout));
    cublasCheck(cublasLtMatmulDescDestroy(plan->desc));
}

// ----------------------------------------------------------------------------------------------
// CPU references shared by several files

static double gelu_tanh(double x) {
    const double s = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(s * (x + 0.044715 * x * x * x)));
}

static double gelu_tanh_grad(double x) {
    const double s = sqrt(2.0 / M_PI);
    double th = tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// The sizes of GPT-2 124M's 16 parameter tensors, as the trainer lays them out.
static void gpt2_124m_parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS]) {
    ModelShape config = {};
    std::string problem;
    if (!model_shape_by_name("d12", &config, &problem)) { fail("no d12 config"); }
    parameter_sizes(&config, sizes);
}

// Row `row` of a linear layer in double: inp (rows, K) @ weight (N, K)^T + bias (none: empty).
static std::vector<double> linear_reference_row(const std::vector<float>& inp, const std::vector<float>& weight,
                                                const std::vector<float>& bias, int K, int N, int row) {
    std::vector<double> out(N);
    for (int o = 0; o < N; o++) {
        double sum = bias.empty() ? 0.0 : bias[o];
        for (int k = 0; k < K; k++) { sum += (double)inp[(size_t)row * K + k] * weight[(size_t)o * K + k]; }
        out[o] = sum;
    }
    return out;
}

// Row indices spread over [0, rows): the rows a CPU check covers when all would take too long.
static std::vector<int> sample_rows(int rows, int count) {
    std::vector<int> picked;
    uint64_t state = g_seed++;
    for (int i = 0; i < count; i++) { picked.push_back((int)(splitmix64(state + i) % rows)); }
    return picked;
}

// A linear layer's check against the CPU in double: fresh inputs (inp (M, K) in [-1, 1), weight
// (N, K) in [-0.1, 0.1), bias (N) in [-1, 1); bias nullptr: none), the outputs poisoned, launch(),
// then sampled rows (about 150M multiply-adds) of out = inp weight^T + bias and, where given, of
// gelu_out = gelu(out); every element of both is checked for NaN and infinity.
struct LinearCheck {
    ErrorMeter out, gelu;  // out's and gelu_out's errors over the sampled rows
    bool finite;           // no element of either output is NaN or infinite
};

static LinearCheck linear_check(float* inp, float* weight, float* bias, float* out, float* gelu_out, int M, int N,
                                int K, const Launch& launch) {
    size_t n_out = (size_t)M * N;
    fill_uniform(inp, (size_t)M * K, -1.0f, 1.0f);
    fill_uniform(weight, (size_t)N * K, -0.1f, 0.1f);
    if (bias != nullptr) { fill_uniform(bias, N, -1.0f, 1.0f); }
    poison(out, n_out);
    if (gelu_out != nullptr) { poison(gelu_out, n_out); }
    launch();
    std::vector<float> inp_host = download(inp, (size_t)M * K), weight_host = download(weight, (size_t)N * K);
    std::vector<float> bias_host = bias != nullptr ? download(bias, N) : std::vector<float>();
    std::vector<float> out_host = download(out, n_out);
    std::vector<float> gelu_host = gelu_out != nullptr ? download(gelu_out, n_out) : std::vector<float>();
    LinearCheck check = {};
    int rows = std::max(4, (int)(64LL * 768 * 3072 / ((long long)K * N)));
    for (int row : sample_rows(M, rows)) {
        std::vector<double> want = linear_reference_row(inp_host, weight_host, bias_host, K, N, row);
        for (int o = 0; o < N; o++) {
            size_t i = (size_t)row * N + o;
            error_add(&check.out, out_host[i], want[o]);
            if (gelu_out != nullptr) { error_add(&check.gelu, gelu_host[i], gelu_tanh(want[o])); }
        }
    }
    check.finite = count_non_finite(out, n_out) == 0 && (gelu_out == nullptr || count_non_finite(gelu_out, n_out) == 0);
    return check;
}

// ----------------------------------------------------------------------------------------------
// The residual add out = a + b, float4 per thread, as the trainer had it before fusing it into
// layernorm_forward: residual_forward.cu times it, layernorm_forward.cu uses it as the unfused pair.
__global__ void residual_add_kernel(float4* out, const float4* a, const float4* b, size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) { out[i] = a[i] + b[i]; }
}

static void residual_add(float* out, const float* a, const float* b, size_t n) {
    residual_add_kernel<<<ceil_div(n / 4, 256), 256>>>((float4*)out, (const float4*)a, (const float4*)b, n / 4);
    cudaCheck(cudaGetLastError());
}
