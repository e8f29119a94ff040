/*
Kernel lab: the fused classifier over N = B*T = 8192 rows of Vp = 50304 logits (V = 50257 real):
per row the loss -log softmax(x)[target] and, in place, dlogits = (softmax(x) - onehot(target)) *
dloss, 0 in the padded columns.

  variant 1  naive: a block per row, three passes (max, sum of exp, write)
  variant 2  the trainer's fused_classifier, on the logits transposed (Vp, N) as the trainer keeps
             them: a block per 128 rows (512-byte reads) and slice of the vocabulary, its warps
             striding over the slice; a first kernel writes each slice's running max and sum per
             row (4 loads in flight, one exp per value), a second combines them in slice order and
             writes
  variant 3  a block per row, the row held in shared memory (201 KB): read once from memory
  variant 4  UNROLL float4 loads in flight per thread in both passes, one exp per value (the
             running sum rescaled once per UNROLL float4), a multiply by dloss / sum
  Fusion (d), the LM head in row chunks, as the trainer's classifier_forward: per chunk the
  logits product, the classifier, then the two backward products (dlnf and dwte) use the chunk's
  dlogits before the next chunk reuses the buffer; the logits buffer shrinks with the chunk:
  variant 5  the trainer's lm_head_chunk (logits product, fused_classifier, dlnf in vocabulary
             chunks and dwte products, all on the transposed logits) per chunk of 8192 (all at
             once), 4096, 2048 and 1024 rows; one row each
  variant 6  the trainer's kernel before the transposed layout: a block per row, the running max
             and sum in one pass (4 float4 loads in flight per thread), then the write pass

  ./fused_classifier [variant ...]

Bytes counted (1-4): the logits read once, dlogits written once, targets read, losses written:
(2 N Vp + 2 N) * 4. FLOPs counted (5): the three products, 6 N C Vp.
*/
#include "common.h"

constexpr int NUM_VARIANTS = 6;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: block per row, three passes",
    "2 trainer: fused_classifier, transposed, 2 kernels",
    "3 block per row, row in shared memory",
    "4 both passes with 4 float4 loads in flight, 1 exp/value",
    "5 (d) trainer's LM head fwd+bwd in row chunks",
    "6 block per row, online max/sum (trainer before 2)",
};

// Relative to the largest |loss| and |dlogit|: float exp and log, sums of V = 50257 terms.
constexpr double TOLERANCE = 1e-5;
// Variant 5: TF32 products (operands rounded to 10 mantissa bits) upstream of everything checked.
constexpr double TF32_TOLERANCE = 5e-3;
constexpr int CHECKED_ROWS = 64;         // variants 1-4: rows compared with the CPU
constexpr int CHECKED_HEAD_ROWS = 4;     // variant 5: each row needs 2 Vp C multiply-adds
constexpr int CHECKED_WTE_ROWS = 16;     // variant 5: rows of dwte compared
constexpr int SHARED_ROW_BLOCK = 1024;
constexpr int UNROLL = 4;  // variant 4: float4 loads in flight per thread
static float* g_classifier_scratch;  // variant 2's per-row statistics

// ----------------------------------------------------------------------------------------------

__device__ float block_max(float value) { return block_reduce(value, cg::greater<float>(), -FLT_MAX); }

__global__ void naive_kernel(float* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    float* x = logits + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    float target_logit = x[target];  // read before the barriers below, so before any write
    float max_value = -FLT_MAX;
    for (int i = threadIdx.x; i < V; i += blockDim.x) { max_value = fmaxf(max_value, x[i]); }
    max_value = block_max(max_value);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) { sum += expf(x[i] - max_value); }
    sum = block_sum(sum);
    if (threadIdx.x == 0) { losses[blockIdx.x] = max_value + logf(sum) - target_logit; }
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        x[i] = i < V ? (expf(x[i] - max_value) / sum - (i == target ? 1.0f : 0.0f)) * dloss : 0.0f;
    }
}

// The row is copied to shared memory while its maximum is found; the sum of exp and the write
// pass then read shared memory only.
__global__ void __launch_bounds__(SHARED_ROW_BLOCK) shared_row_kernel(float* logits, float* losses, const int* targets,
                                                                     float dloss, int V, int Vp) {
    extern __shared__ float4 row[];  // [Vp / 4]
    float4* x4 = (float4*)(logits + (size_t)blockIdx.x * Vp);
    int target = targets[blockIdx.x];
    float max_value = -FLT_MAX;
    for (int i4 = threadIdx.x; i4 < Vp / 4; i4 += blockDim.x) {
        float4 v = x4[i4];
        row[i4] = v;
        float values[4] = {v.x, v.y, v.z, v.w};
        for (int k = 0; k < 4; k++) { max_value = 4 * i4 + k < V ? fmaxf(max_value, values[k]) : max_value; }
    }
    max_value = block_max(max_value);  // its barriers also publish the row
    const float* x = (const float*)row;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) { sum += expf(x[i] - max_value); }
    sum = block_sum(sum);
    if (threadIdx.x == 0) { losses[blockIdx.x] = max_value + logf(sum) - x[target]; }
    for (int i4 = threadIdx.x; i4 < Vp / 4; i4 += blockDim.x) {
        float out[4];
        for (int k = 0; k < 4; k++) {
            int i = 4 * i4 + k;
            out[k] = i < V ? (expf(x[i] - max_value) / sum - (i == target ? 1.0f : 0.0f)) * dloss : 0.0f;
        }
        x4[i4] = make_float4(out[0], out[1], out[2], out[3]);
    }
}

// Variant 6, the trainer's kernel before the transposed logits: a block per row, the running max
// and sum in one pass (4 float4 loads in flight per thread, one exp per value), then the write
// pass. The target's logit is read before the block reduction's barrier.
__global__ void row_online_kernel(float* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    __shared__ SoftmaxStats warp_stats[32];
    __shared__ float target_logit;
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    float4* row4 = (float4*)(logits + (size_t)blockIdx.x * Vp);
    int target = targets[blockIdx.x];
    if (threadIdx.x == 0) { target_logit = logits[(size_t)blockIdx.x * Vp + target]; }

    // Each thread: 4 float4 loads in flight, then one rescale of its running sum and one exp per value.
    SoftmaxStats stats = {-FLT_MAX, 0.0f};
    const int V4 = Vp / 4, UNROLL = 4;
    for (int first = threadIdx.x; first < V4; first += UNROLL * blockDim.x) {
        float x[UNROLL * 4];
        for (int u = 0; u < UNROLL; u++) {
            int i4 = first + u * blockDim.x;
            float4 x4 = i4 < V4 ? row4[i4] : make_float4(-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX);
            x[4 * u] = x4.x, x[4 * u + 1] = x4.y, x[4 * u + 2] = x4.z, x[4 * u + 3] = x4.w;
        }
        float chunk_max = stats.max;
        for (int u = 0; u < UNROLL * 4; u++) {
            if (4 * (first + u / 4 * blockDim.x) + u % 4 < V) { chunk_max = fmaxf(chunk_max, x[u]); }
        }
        stats.sum *= expf(stats.max - chunk_max);
        stats.max = chunk_max;
        for (int u = 0; u < UNROLL * 4; u++) {
            if (4 * (first + u / 4 * blockDim.x) + u % 4 < V) { stats.sum += expf(x[u] - chunk_max); }
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        SoftmaxStats other = {warp.shfl_xor(stats.max, offset), warp.shfl_xor(stats.sum, offset)};
        stats = softmax_stats_combine(stats, other);
    }
    if (warp.thread_rank() == 0) { warp_stats[warp.meta_group_rank()] = stats; }
    block.sync();
    stats = warp_stats[0];
    for (int w = 1; w < warp.meta_group_size(); w++) { stats = softmax_stats_combine(stats, warp_stats[w]); }

    if (threadIdx.x == 0) { losses[blockIdx.x] = stats.max + logf(stats.sum) - target_logit; }
    for (int i4 = threadIdx.x; i4 < Vp / 4; i4 += blockDim.x) {
        float4 x4 = row4[i4];
        float x[4] = {x4.x, x4.y, x4.z, x4.w};
        for (int k = 0; k < 4; k++) {
            int i = 4 * i4 + k;
            float prob = i < V ? expf(x[k] - stats.max) / stats.sum : 0.0f;
            x[k] = i < V ? (prob - (i == target ? 1.0f : 0.0f)) * dloss : 0.0f;
        }
        row4[i4] = make_float4(x[0], x[1], x[2], x[3]);
    }
}

// Variant 4. Loads UNROLL float4 of the row (-FLT_MAX past its end) at i4, i4 + blockDim.x, ...
__device__ inline void load_unrolled(float (*x)[4], const float4* row4, int i4, int Vp4) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int j4 = i4 + u * blockDim.x;
        float4 v = j4 < Vp4 ? row4[j4] : make_float4(-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX);
        x[u][0] = v.x, x[u][1] = v.y, x[u][2] = v.z, x[u][3] = v.w;
    }
}

__global__ void __launch_bounds__(1024) unrolled_kernel(float* logits, float* losses, const int* targets, float dloss,
                                                        int V, int Vp) {
    __shared__ SoftmaxStats warp_stats[32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    float4* row4 = (float4*)(logits + (size_t)blockIdx.x * Vp);
    int target = targets[blockIdx.x], Vp4 = Vp / 4;
    float target_logit = logits[(size_t)blockIdx.x * Vp + target];  // read before the barrier below
    SoftmaxStats stats = {-FLT_MAX, 0.0f};
    for (int i4 = threadIdx.x; i4 < Vp4; i4 += UNROLL * blockDim.x) {
        float x[UNROLL][4];
        load_unrolled(x, row4, i4, Vp4);
        float step_max = stats.max;
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            for (int k = 0; k < 4; k++) {
                if (4 * (i4 + u * blockDim.x) + k < V) { step_max = fmaxf(step_max, x[u][k]); }
            }
        }
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            for (int k = 0; k < 4; k++) {
                if (4 * (i4 + u * blockDim.x) + k < V) { sum += expf(x[u][k] - step_max); }
            }
        }
        stats = SoftmaxStats{step_max, stats.sum * expf(stats.max - step_max) + sum};
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        stats = softmax_stats_combine(stats, SoftmaxStats{warp.shfl_xor(stats.max, offset), warp.shfl_xor(stats.sum, offset)});
    }
    if (warp.thread_rank() == 0) { warp_stats[warp.meta_group_rank()] = stats; }
    block.sync();
    stats = warp_stats[0];
    for (int w = 1; w < warp.meta_group_size(); w++) { stats = softmax_stats_combine(stats, warp_stats[w]); }
    if (threadIdx.x == 0) { losses[blockIdx.x] = stats.max + logf(stats.sum) - target_logit; }
    float scale = dloss / stats.sum;
    for (int i4 = threadIdx.x; i4 < Vp4; i4 += UNROLL * blockDim.x) {
        float x[UNROLL][4];
        load_unrolled(x, row4, i4, Vp4);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int j4 = i4 + u * blockDim.x;
            if (j4 >= Vp4) { continue; }
            float out[4];
            for (int k = 0; k < 4; k++) {
                int i = 4 * j4 + k;
                out[k] = i < V ? expf(x[u][k] - stats.max) * scale - (i == target ? dloss : 0.0f) : 0.0f;
            }
            row4[j4] = make_float4(out[0], out[1], out[2], out[3]);
        }
    }
}

static void launch_classifier(int variant, float* logits, float* losses, const int* targets, float dloss, int N) {
    if (variant == 1) {
        naive_kernel<<<N, 1024>>>(logits, losses, targets, dloss, LAB_V, LAB_VP);
        cudaCheck(cudaGetLastError());
    } else if (variant == 2) {
        fused_classifier(logits, losses, g_classifier_scratch, targets, dloss, N, LAB_V, LAB_VP);
    } else if (variant == 6) {
        row_online_kernel<<<N, 1024>>>(logits, losses, targets, dloss, LAB_V, LAB_VP);
        cudaCheck(cudaGetLastError());
    } else if (variant == 4) {
        unrolled_kernel<<<N, 1024>>>(logits, losses, targets, dloss, LAB_V, LAB_VP);
        cudaCheck(cudaGetLastError());
    } else {
        size_t shared = LAB_VP * sizeof(float);
        cudaCheck(cudaFuncSetAttribute(shared_row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        shared_row_kernel<<<N, SHARED_ROW_BLOCK, shared>>>(logits, losses, targets, dloss, LAB_V, LAB_VP);
        cudaCheck(cudaGetLastError());
    }
}

// ----------------------------------------------------------------------------------------------
// Variant 5: the LM head as the trainer runs it, chunk_rows rows at a time.

struct Head {
    float *lnf, *lnf_t, *wte, *wte_t, *dwte, *dwte0, *dlnf, *dlnf_partials, *logits, *losses, *scratch;  // *_t: transposed
    int* targets;
    int N, C;
};

static void launch_head(const Head& h, int chunk_rows) {
    for (int first = 0; first < h.N; first += chunk_rows) {
        int rows = std::min(chunk_rows, h.N - first);
        lm_head_chunk(h.logits, h.losses + first, h.scratch, h.dlnf + (size_t)first * h.C, h.dlnf_partials, h.dwte,
                      first > 0, h.lnf_t, h.lnf + (size_t)first * h.C, h.wte, h.wte_t, h.targets + first, 1.0f / h.N,
                      rows, h.C, LAB_V, LAB_VP);
    }
}

// ----------------------------------------------------------------------------------------------
// CPU reference of one row in double: the loss and the dlogits from its logits.

static double cpu_row(const float* logits, int target, double dloss, double* dlogits) {
    double max_value = -1e300, sum = 0.0;
    for (int i = 0; i < LAB_V; i++) { max_value = std::max(max_value, (double)logits[i]); }
    for (int i = 0; i < LAB_V; i++) { sum += exp(logits[i] - max_value); }
    for (int i = 0; i < LAB_VP; i++) {
        dlogits[i] = i < LAB_V ? (exp(logits[i] - max_value) / sum - (i == target ? 1.0 : 0.0)) * dloss : 0.0;
    }
    return max_value + log(sum) - logits[target];
}

// Row `row` of N rows of logits, laid out as the variant takes them: (N, Vp), or (Vp, N) for 2.
static std::vector<float> download_row(int variant, const float* logits, int row, int N) {
    std::vector<float> values(LAB_VP);
    bool transposed = variant == 2;
    cudaCheck(cudaMemcpy2D(values.data(), sizeof(float), logits + (transposed ? row : (size_t)row * LAB_VP),
                           (transposed ? N : 1) * sizeof(float), sizeof(float), LAB_VP, cudaMemcpyDeviceToHost));
    return values;
}

static double check_classifier(int variant, float* logits, float* losses, int* targets, int N) {
    size_t n = (size_t)N * LAB_VP;
    fill_uniform(logits, n, -8.0f, 8.0f);
    fill_tokens(targets, N, LAB_V, false);
    poison(losses, N);
    std::vector<int> rows = sample_rows(N, CHECKED_ROWS);
    std::vector<std::vector<float>> inputs;
    for (int row : rows) { inputs.push_back(download_row(variant, logits, row, N)); }
    launch_classifier(variant, logits, losses, targets, 1.0f / N, N);
    std::vector<int> target = download_ints(targets, N);
    std::vector<float> loss = download(losses, N);
    ErrorMeter loss_error = {}, dlogits_error = {};
    std::vector<double> dlogits(LAB_VP);
    for (size_t k = 0; k < rows.size(); k++) {
        error_add(&loss_error, loss[rows[k]], cpu_row(inputs[k].data(), target[rows[k]], 1.0 / N, dlogits.data()));
        std::vector<float> got = download_row(variant, logits, rows[k], N);
        for (int i = 0; i < LAB_VP; i++) { error_add(&dlogits_error, got[i], dlogits[i]); }
    }
    bool all_written = count_non_finite(logits, n) + count_non_finite(losses, N) == 0;
    return all_written ? std::max(error_value(loss_error), error_value(dlogits_error)) : INFINITY;
}

// saved: the logits, restored before each timed run (the kernels work in place).
static void run_classifier(int variant, float* logits, float* saved, float* losses, int* targets, int N) {
    size_t n = (size_t)N * LAB_VP;
    double error = check_classifier(variant, logits, losses, targets, N);
    fill_uniform(saved, n, -8.0f, 8.0f);
    Launch launch = [&] { launch_classifier(variant, logits, losses, targets, 1.0f / N, N); };
    Launch restore = [&] { copy_floats(logits, saved, n); };
    Determinism det = deterministic(launch, restore, {{logits, n}, {losses, (size_t)N}});
    double bytes = (2.0 * n + 2.0 * N) * sizeof(float);
    print_row("fused_classifier", VARIANT_NAMES[variant], bench_ms(launch, restore), bytes, CEILING_COPY, error,
              TOLERANCE, det);
}

// The CPU reference of sampled rows (loss and dlnf) and, from the all-at-once run's dlogits,
// sampled rows of dwte; the chunked runs' dwte is compared with the all-at-once one.
struct HeadReference {
    std::vector<int> rows, wte_rows;
    std::vector<double> loss, dlnf;  // [row k], [row k][C]
    std::vector<double> dwte;        // [wte row k][C], filled by the all-at-once run
    std::vector<float> dwte_all;     // the all-at-once run's dwte
};

static HeadReference head_reference(const Head& h) {
    HeadReference ref;
    int C = h.C;
    std::vector<float> lnf = download(h.lnf, (size_t)h.N * C), wte = download(h.wte, (size_t)LAB_VP * C);
    std::vector<int> targets = download_ints(h.targets, h.N);
    ref.rows = sample_rows(h.N, CHECKED_HEAD_ROWS);
    ref.wte_rows = sample_rows(LAB_VP, CHECKED_WTE_ROWS);
    std::vector<float> logits(LAB_VP);
    std::vector<double> dlogits(LAB_VP);
    for (int row : ref.rows) {
        for (int v = 0; v < LAB_VP; v++) {
            double sum = 0.0;
            for (int c = 0; c < C; c++) { sum += (double)lnf[(size_t)row * C + c] * wte[(size_t)v * C + c]; }
            logits[v] = (float)sum;
        }
        ref.loss.push_back(cpu_row(logits.data(), targets[row], 1.0 / h.N, dlogits.data()));
        for (int c = 0; c < C; c++) {
            double sum = 0.0;
            for (int v = 0; v < LAB_VP; v++) { sum += dlogits[v] * wte[(size_t)v * C + c]; }
            ref.dlnf.push_back(sum);
        }
    }
    return ref;
}

static double check_head(const Head& h, HeadReference* ref, int chunk_rows) {
    int C = h.C;
    std::vector<float> losses = download(h.losses, h.N), dlnf = download(h.dlnf, (size_t)h.N * C);
    std::vector<float> dwte = download(h.dwte, (size_t)LAB_VP * C);
    ErrorMeter loss_error = {}, dlnf_error = {}, dwte_error = {};
    for (size_t k = 0; k < ref->rows.size(); k++) {
        error_add(&loss_error, losses[ref->rows[k]], ref->loss[k]);
        for (int c = 0; c < C; c++) { error_add(&dlnf_error, dlnf[(size_t)ref->rows[k] * C + c], ref->dlnf[k * C + c]); }
    }
    if (chunk_rows == h.N) {  // all rows' dlogits are in the buffer: sampled dwte rows from them
        std::vector<float> lnf = download(h.lnf, (size_t)h.N * C);
        std::vector<float> column(h.N);
        for (int v : ref->wte_rows) {
            column = download(h.logits + (size_t)v * h.N, h.N);  // the logits are kept transposed
            for (int c = 0; c < C; c++) {
                double sum = 0.0;  // the first chunk overwrites dwte0
                for (int row = 0; row < h.N; row++) { sum += (double)column[row] * lnf[(size_t)row * C + c]; }
                error_add(&dwte_error, dwte[(size_t)v * C + c], sum);
            }
        }
        ref->dwte_all = dwte;
    } else {
        for (size_t i = 0; i < dwte.size(); i++) { error_add(&dwte_error, dwte[i], ref->dwte_all[i]); }
    }
    return std::max({error_value(loss_error), error_value(dlnf_error), error_value(dwte_error)});
}

static void run_head(int N) {
    int C = LAB_C;
    Head h = {gpu_floats((size_t)N * C), gpu_floats((size_t)C * N), gpu_floats((size_t)LAB_VP * C),
              gpu_floats((size_t)C * LAB_VP), gpu_floats((size_t)LAB_VP * C), gpu_floats((size_t)LAB_VP * C),
              gpu_floats((size_t)N * C), gpu_floats((size_t)LM_HEAD_SPLITS * N * C), gpu_floats((size_t)N * LAB_VP),
              gpu_floats(N), gpu_floats((size_t)(2 * CLASSIFIER_MAX_SLICES + 1) * N), gpu_ints(N), N, C};
    fill_uniform(h.lnf, (size_t)N * C, -2.0f, 2.0f);
    fill_uniform(h.wte, (size_t)LAB_VP * C, -0.05f, 0.05f);
    transpose_wte(h.wte_t, h.wte, LAB_VP, C);
    fill_uniform(h.dwte0, (size_t)LAB_VP * C, -0.01f, 0.01f);
    fill_tokens(h.targets, N, LAB_V, false);
    HeadReference ref = head_reference(h);
    Launch restore = [&] {
        copy_floats(h.dwte, h.dwte0, (size_t)LAB_VP * C);
        poison(h.dlnf, (size_t)N * C);
        poison(h.losses, N);
    };
    for (int chunk_rows : {N, N / 2, N / 4, N / 8}) {
        restore();
        launch_head(h, chunk_rows);
        double error = check_head(h, &ref, chunk_rows);
        Launch launch = [&] { launch_head(h, chunk_rows); };
        Determinism det = deterministic(launch, restore, {{h.losses, (size_t)N}, {h.dlnf, (size_t)N * C},
                                                          {h.dwte, (size_t)LAB_VP * C}});
        char name[96];
        snprintf(name, sizeof(name), "5 (d) LM head, chunks of %d rows, logits %.2f GB", chunk_rows,
                 (double)chunk_rows * LAB_VP * sizeof(float) / 1e9);
        print_row("fused_classifier", name, bench_ms(launch, restore), 6.0 * N * C * LAB_VP, CEILING_TF32, error,
                  TF32_TOLERANCE, det);
    }
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int N = LAB_ROWS;
    float *logits = gpu_floats((size_t)N * LAB_VP), *saved = gpu_floats((size_t)N * LAB_VP), *losses = gpu_floats(N);
    int* targets = gpu_ints(N);
    g_classifier_scratch = gpu_floats((size_t)(2 * CLASSIFIER_MAX_SLICES + 1) * N);
    for (int variant : {1, 2, 3, 4, 6}) {
        if (variant_selected(variant)) { run_classifier(variant, logits, saved, losses, targets, N); }
    }
    gpu_free_all();
    if (variant_selected(5)) { run_head(N); }
    gpu_free_all();
    return lab_finish();
}
