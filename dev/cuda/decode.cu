/*
Kernel lab: the kernels of a generation (decode) step, M <= 4 completions at one new position
each, on GPT-2 124M shapes (C = 768, NH = 12, hs = 64, Vp = 50304); the linear layers also on
d48's (C = 1600). A linear layer is out (N, OC) = epilogue(prologue(inp) @ W^T + b), N = M rows.

  variant 1  cuBLASLt: the trainer's matmul_forward (matmul, TF32, as the trainer runs), plain
             linear layer, N = 1: the baseline a few-row kernel must beat
  variant 2  the trainer's linear_few_rows without ops (plain linear), N = 1 and 4
  variant 3  linear_few_rows with the fusions gpt2_decode_step gives it, N = 1 and 4: layernorm +
             qkv, attproj added into the residual, layernorm + fc + GELU, fcproj added into the
             residual, layernorm + LM head (no bias)
  variant 4  the trainer's attention_decode over a cache of maxT = 1024 positions, at positions
             31, 255 and 1023, M = 1 and 4, softmax and ReLU
  variant 5  a layer's chain as gpt2_decode_step runs it (decode_linear qkv + ln1,
             attention_decode, attproj +=, fc + ln2 + GELU, fcproj +=), 12 layers in a row, each
             with its own weights (28 MB; 340 MB in all, beyond the L2), M = 1 at position 255
             (softmax), captured as a CUDA graph and replayed: with programmatic dependent launch
             (g_pdl, as the trainer on compute capability 9.0 and newer) and with plain launches.
             Its kernels are checked by 2-4; here only that its outputs are finite.

  ./decode [variant ...]

Bytes counted, against the copy ceiling: a linear layer reads its weight, bias, layernorm weight
and bias and its input rows once and writes its output rows (reads them too when it adds into
them); attention_decode reads the cached keys and values of positions 0..pos-1 and the new q, k,
v, writes the new key and value into the cache and its output, and writes then reads its
per-chunk partials. Variant 5 counts its five kernels' bytes per layer, its ms column is one
replay's time / 12 (per layer), each replay timed by CUDA events, the median of 500 queued back
to back, with no L2 flush (the 12 layers' weights do not fit). Variants 1-4 use bench_ms, which
flushes the L2 before each launch: in a step the weights come from DRAM too.
*/
#include "common.h"

constexpr int NUM_VARIANTS = 5;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 cuBLASLt: matmul_forward, TF32",
    "2 trainer: linear_few_rows",
    "3 trainer: linear_few_rows fused",
    "4 trainer: attention_decode",
    "5 decode layer x12, CUDA graph",
};

// Relative to max |out|. FP32 (variants 2-4): a dot product of K <= 6400 terms, each lane's share
// summed in order and the 32 shares in a tree (~sqrt(K) * 6e-8 at worst), a few roundings more
// for the layernorm, tanhf, expf and the chunks' combination. TF32 (variant 1): both operands
// rounded to 10 mantissa bits, as in matmul_forward.cu.
constexpr double FP32_TOLERANCE = 1e-5, TF32_TOLERANCE = 5e-3;
constexpr int D48_C = 1600, HS = 64, MAX_T = 1024;
constexpr int M_MAX = FEW_ROWS_MAX;  // completions: the most the few-row kernel takes
constexpr int CHAIN_LAYERS = 12, CHAIN_POSITION = 255, REPLAY_WARMUP = 10, REPLAYS = 500;

struct Layer {
    const char *name, *fused;  // plain (variants 1, 2) and with its decode-step fusions (variant 3)
    int K, OC;
    bool has_bias, ln, gelu, accumulate;  // the fusions
};

// The linear layers of a decode step for C channels, in the order the step runs them.
static std::vector<Layer> layers_of(int C) {
    return {{"qkv", "ln1 + qkv", C, 3 * C, true, true, false, false},
            {"attproj", "attproj +=", C, C, true, false, false, true},
            {"fc", "ln2 + fc + GELU", C, 4 * C, true, true, true, false},
            {"fcproj", "fcproj +=", 4 * C, C, true, false, false, true},
            {"lm head", "lnf + lm head", C, LAB_VP, false, true, false, false}};
}

static double linear_bytes(const Layer& s, bool fused, int N) {
    double floats = (double)s.OC * s.K + (s.has_bias ? s.OC : 0) + (double)N * s.K +
                    (fused && s.accumulate ? 2.0 : 1.0) * N * s.OC + (fused && s.ln ? 2.0 * s.K : 0.0);
    return floats * sizeof(float);
}

static double attention_bytes(int M, int pos) {
    int chunks = pos / DECODE_CHUNK + 1;
    double floats = (double)M * pos * 2 * LAB_C + M * (3.0 + 2.0 + 1.0) * LAB_C + 2.0 * M * LAB_NH * chunks * (HS + 2);
    return floats * sizeof(float);
}

// ----------------------------------------------------------------------------------------------
// Variants 1-3: one linear layer

struct LinearBuffers {
    float *out, *out0, *inp, *weight, *bias, *ln_weight, *ln_bias;  // out0: out's start value (+=)
};

static LinearOps ops_of(int variant, const LinearBuffers& d, const Layer& s) {
    if (variant != 3) { return {nullptr, nullptr, false, false}; }
    return {s.ln ? d.ln_weight : nullptr, s.ln ? d.ln_bias : nullptr, s.gelu, s.accumulate};
}

static void launch_linear(int variant, const LinearBuffers& d, const Layer& s, LinearOps ops, int N) {
    const float* bias = s.has_bias ? d.bias : nullptr;
    if (variant == 1) { matmul_forward(d.out, d.inp, d.weight, bias, N, s.K, s.OC); }
    else { linear_few_rows(d.out, d.inp, d.weight, bias, ops, N, s.K, s.OC); }
}

// out set to its start value (adding into it) or poisoned.
static void reset_out(const LinearBuffers& d, LinearOps ops, size_t n_out) {
    if (ops.accumulate) { copy_floats(d.out, d.out0, n_out); }
    else { poison(d.out, n_out); }
}

// Every output against the CPU in double: layernorm (biased variance, eps 1e-5), product, bias,
// then GELU or the add into out's start value, as ops says.
static double check_linear(const LinearBuffers& d, const Layer& s, LinearOps ops, int variant, int N) {
    int K = s.K, OC = s.OC;
    size_t n_out = (size_t)N * OC;
    fill_uniform(d.inp, (size_t)N * K, -1.0f, 2.0f);  // rows of nonzero mean for the layernorm
    fill_uniform(d.weight, (size_t)OC * K, -0.1f, 0.1f);
    fill_uniform(d.bias, OC, -1.0f, 1.0f);
    fill_uniform(d.ln_weight, K, -1.5f, 1.5f);
    fill_uniform(d.ln_bias, K, -1.0f, 1.0f);
    fill_uniform(d.out0, n_out, -1.0f, 1.0f);
    reset_out(d, ops, n_out);
    launch_linear(variant, d, s, ops, N);
    std::vector<float> inp = download(d.inp, (size_t)N * K), weight = download(d.weight, (size_t)OC * K);
    std::vector<float> bias = download(d.bias, OC), ln_weight = download(d.ln_weight, K);
    std::vector<float> ln_bias = download(d.ln_bias, K), out0 = download(d.out0, n_out), out = download(d.out, n_out);
    ErrorMeter error = {};
    std::vector<double> x(K);
    for (int i = 0; i < N; i++) {
        double mean = 0.0, var = 0.0;
        for (int k = 0; k < K; k++) { mean += inp[(size_t)i * K + k] / (double)K; }
        for (int k = 0; k < K; k++) { var += (inp[(size_t)i * K + k] - mean) * (inp[(size_t)i * K + k] - mean) / K; }
        for (int k = 0; k < K; k++) {
            double v = inp[(size_t)i * K + k];
            x[k] = ops.ln_weight == nullptr ? v : (v - mean) / sqrt(var + 1e-5) * ln_weight[k] + ln_bias[k];
        }
        for (int o = 0; o < OC; o++) {
            double sum = s.has_bias ? bias[o] : 0.0;
            for (int k = 0; k < K; k++) { sum += x[k] * weight[(size_t)o * K + k]; }
            if (ops.gelu) { sum = gelu_tanh(sum); }
            if (ops.accumulate) { sum += out0[(size_t)i * OC + o]; }
            error_add(&error, out[(size_t)i * OC + o], sum);
        }
    }
    return error_value(error);
}

static void run_linear(const LinearBuffers& d, const Layer& s, int variant, int N) {
    LinearOps ops = ops_of(variant, d, s);
    size_t n_out = (size_t)N * s.OC;
    double error = check_linear(d, s, ops, variant, N);
    Launch launch = [&] { launch_linear(variant, d, s, ops, N); };
    Launch reset = [&] { reset_out(d, ops, n_out); };
    Determinism det = deterministic(launch, reset, {{d.out, n_out}});
    char name[96];
    snprintf(name, sizeof(name), "%s, %s %d->%d, N=%d", VARIANT_NAMES[variant], variant == 3 ? s.fused : s.name, s.K,
             s.OC, N);
    print_row("decode", name, bench_ms(launch, reset), linear_bytes(s, variant == 3, N), CEILING_COPY, error,
              variant == 1 ? TF32_TOLERANCE : FP32_TOLERANCE, det);
}

// ----------------------------------------------------------------------------------------------
// Variant 4: attention over the KV cache

struct AttentionBuffers {
    float *out, *partials, *kv, *qkv;  // kv (M, MAX_T, 2C), qkv (M, 3C), out (M, C)
    unsigned int* counters;            // zeroed once: each launch leaves them at 0
    int* position;
};

static void set_position(int* position, int pos) {
    cudaCheck(cudaMemcpy(position, &pos, sizeof(int), cudaMemcpyHostToDevice));
}

static void launch_attention(const AttentionBuffers& d, int M, AttentionKind kind) {
    attention_decode(d.out, d.partials, d.counters, d.kv, d.qkv, d.position, M, MAX_T, LAB_NH, HS, kind);
}

// out against the CPU in double over positions 0..pos, position pos's key and value from qkv; the
// cache afterwards against the cache before with qkv's key and value at pos (an exact copy).
static double check_attention(const AttentionBuffers& d, int M, int pos, AttentionKind kind) {
    const int C = LAB_C;
    size_t n_kv = (size_t)M * MAX_T * 2 * C;
    fill_uniform(d.kv, n_kv, -2.0f, 2.0f);  // scores of std ~1.3: weights far from uniform
    fill_uniform(d.qkv, (size_t)M * 3 * C, -2.0f, 2.0f);
    poison(d.out, (size_t)M * C);
    set_position(d.position, pos);
    std::vector<float> kv = download(d.kv, n_kv), qkv = download(d.qkv, (size_t)M * 3 * C);
    launch_attention(d, M, kind);
    std::vector<float> out = download(d.out, (size_t)M * C), kv_after = download(d.kv, n_kv);
    ErrorMeter out_error = {}, kv_error = {};
    std::vector<double> w(pos + 1);
    for (int m = 0; m < M; m++) {
        for (int h = 0; h < LAB_NH; h++) {
            const float* q = &qkv[(size_t)m * 3 * C + h * HS];
            // position t's key; its value is C further in both layouts
            auto key = [&](int t) { return t == pos ? q + C : &kv[((size_t)m * MAX_T + t) * 2 * C + h * HS]; };
            double max_score = -INFINITY, sum = 0.0;
            for (int t = 0; t <= pos; t++) {
                double dot = 0.0;
                for (int i = 0; i < HS; i++) { dot += (double)q[i] * key(t)[i]; }
                w[t] = dot / sqrt((double)HS);
                max_score = std::max(max_score, w[t]);
            }
            for (int t = 0; t <= pos; t++) {
                w[t] = kind == ATTENTION_SOFTMAX ? exp(w[t] - max_score) : std::max(w[t], 0.0);
                sum += w[t];
            }
            double denominator = kind == ATTENTION_SOFTMAX ? sum : pos + 1.0;
            for (int i = 0; i < HS; i++) {
                double o = 0.0;
                for (int t = 0; t <= pos; t++) { o += w[t] * key(t)[C + i]; }
                error_add(&out_error, out[(size_t)m * C + h * HS + i], o / denominator);
            }
        }
        for (int t = 0; t < MAX_T; t++) {
            for (int c = 0; c < 2 * C; c++) {
                size_t i = ((size_t)m * MAX_T + t) * 2 * C + c;
                error_add(&kv_error, kv_after[i], t == pos ? qkv[(size_t)m * 3 * C + C + c] : kv[i]);
            }
        }
    }
    return std::max(error_value(out_error), error_value(kv_error));
}

static void run_attention(const AttentionBuffers& d, int M, int pos, AttentionKind kind) {
    double error = check_attention(d, M, pos, kind);
    Launch launch = [&] { launch_attention(d, M, kind); };
    Launch poison_out = [&] { poison(d.out, (size_t)M * LAB_C); };
    Determinism det = deterministic(launch, poison_out, {{d.out, (size_t)M * LAB_C}});
    char name[96];
    snprintf(name, sizeof(name), "%s, %s, pos %d, M=%d", VARIANT_NAMES[4], attention_name(kind), pos, M);
    print_row("decode", name, bench_ms(launch, poison_out), attention_bytes(M, pos), CEILING_COPY, error,
              FP32_TOLERANCE, det);
}

// ----------------------------------------------------------------------------------------------
// Variant 5: 12 layers of the decode step, replayed as a CUDA graph

struct LayerParams {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
    float* kv;  // the layer's cache (1, MAX_T, 2C)
};

struct ChainBuffers {
    float *all, *residual, *qkv, *atty, *fch;  // all: the four, (1, 9C), for the NaN check
    float *residual0, *partials;               // residual0: the residual's start value
    unsigned int* counters;
    int* position;
};

static float* random_floats(size_t n, float lo, float hi) {
    float* p = gpu_floats(n);
    fill_uniform(p, n, lo, hi);
    return p;
}

static LayerParams random_layer(int C) {
    LayerParams p;
    p.ln1w = random_floats(C, 0.5f, 1.5f);
    p.ln1b = random_floats(C, -0.5f, 0.5f);
    p.qkvw = random_floats((size_t)3 * C * C, -0.1f, 0.1f);
    p.qkvb = random_floats(3 * C, -0.5f, 0.5f);
    p.attprojw = random_floats((size_t)C * C, -0.1f, 0.1f);
    p.attprojb = random_floats(C, -0.5f, 0.5f);
    p.ln2w = random_floats(C, 0.5f, 1.5f);
    p.ln2b = random_floats(C, -0.5f, 0.5f);
    p.fcw = random_floats((size_t)4 * C * C, -0.1f, 0.1f);
    p.fcb = random_floats(4 * C, -0.5f, 0.5f);
    p.fcprojw = random_floats((size_t)4 * C * C, -0.1f, 0.1f);
    p.fcprojb = random_floats(C, -0.5f, 0.5f);
    p.kv = random_floats((size_t)MAX_T * 2 * C, -1.0f, 1.0f);
    return p;
}

// The loop body of gpt2_decode_step for M = 1, over the given layers.
static void decode_layers(const std::vector<LayerParams>& layers, const ChainBuffers& a) {
    const int C = LAB_C;
    for (const LayerParams& p : layers) {
        decode_linear(a.qkv, a.residual, p.qkvw, p.qkvb, {p.ln1w, p.ln1b, false, false}, nullptr, 1, C, 3 * C);
        attention_decode(a.atty, a.partials, a.counters, p.kv, a.qkv, a.position, 1, MAX_T, LAB_NH, HS,
                         ATTENTION_SOFTMAX);
        decode_linear(a.residual, a.atty, p.attprojw, p.attprojb, {nullptr, nullptr, false, true}, nullptr, 1, C, C);
        decode_linear(a.fch, a.residual, p.fcw, p.fcb, {p.ln2w, p.ln2b, true, false}, nullptr, 1, C, 4 * C);
        decode_linear(a.residual, a.fch, p.fcprojw, p.fcprojb, {nullptr, nullptr, false, true}, nullptr, 1, 4 * C, C);
    }
}

// Median ms of a replay, each between its own pair of events; all queued before the first ends,
// so that the GPU never waits for the host (the warm-ups absorb the first launches' gap).
static double replay_ms(cudaGraphExec_t graph) {
    std::vector<cudaEvent_t> events(2 * (REPLAY_WARMUP + REPLAYS));
    for (cudaEvent_t& event : events) { cudaCheck(cudaEventCreate(&event)); }
    for (size_t i = 0; i < events.size(); i += 2) {
        cudaCheck(cudaEventRecord(events[i], cudaStreamPerThread));
        cudaCheck(cudaGraphLaunch(graph, cudaStreamPerThread));
        cudaCheck(cudaEventRecord(events[i + 1], cudaStreamPerThread));
    }
    cudaCheck(cudaStreamSynchronize(cudaStreamPerThread));
    std::vector<float> times;
    for (size_t i = 2 * REPLAY_WARMUP; i < events.size(); i += 2) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
        times.push_back(ms);
    }
    for (cudaEvent_t event : events) { cudaCheck(cudaEventDestroy(event)); }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

static void run_chain() {
    const int C = LAB_C;
    std::vector<LayerParams> layers;
    for (int l = 0; l < CHAIN_LAYERS; l++) { layers.push_back(random_layer(C)); }
    ChainBuffers a = {};
    a.all = gpu_floats(9 * C);
    a.residual = a.all;
    a.qkv = a.residual + C;
    a.atty = a.qkv + 3 * C;
    a.fch = a.atty + C;
    a.residual0 = random_floats(C, -1.0f, 1.0f);
    a.partials = gpu_floats((size_t)LAB_NH * ceil_div(MAX_T, DECODE_CHUNK) * (HS + 2));
    a.counters = (unsigned int*)gpu_ints(LAB_NH);
    cudaCheck(cudaMemset(a.counters, 0, LAB_NH * sizeof(unsigned int)));
    a.position = gpu_ints(1);
    set_position(a.position, CHAIN_POSITION);
    std::vector<Layer> shapes = layers_of(C);
    double layer_bytes = attention_bytes(1, CHAIN_POSITION);
    for (int i = 0; i < 4; i++) { layer_bytes += linear_bytes(shapes[i], true, 1); }
    Launch reset = [&] { copy_floats(a.residual, a.residual0, C); };
    bool device_pdl = g_pdl;
    for (bool pdl : {true, false}) {
        if (pdl && !device_pdl) {
            note("5: no programmatic dependent launch before compute capability 9.0");
            continue;
        }
        g_pdl = pdl;
        reset();
        decode_layers(layers, a);  // eager first: the kernels load outside the capture
        cudaGraphExec_t graph = graph_capture([&] { decode_layers(layers, a); });  // the trainer's
        Launch replay = [&] { cudaCheck(cudaGraphLaunch(graph, cudaStreamPerThread)); };
        Determinism det = deterministic(replay, reset, {{a.all, (size_t)9 * C}});
        double ms = replay_ms(graph);
        bool finite = count_non_finite(a.all, (size_t)9 * C) == 0;
        char name[96];
        snprintf(name, sizeof(name), "%s, PDL %s (per layer; NaN check)", VARIANT_NAMES[5], pdl ? "on" : "off");
        // no tolerance ("-") while the outputs are finite; an infinite error, a FAIL, if not
        print_row("decode", name, ms / CHAIN_LAYERS, layer_bytes, CEILING_COPY, finite ? 0.0 : INFINITY,
                  finite ? -1.0 : 0.0, det);
        note("5, PDL %s: %.1f us per replay of %d layers (%.1f us per layer), position %d", pdl ? "on" : "off",
             1000.0 * ms, CHAIN_LAYERS, 1000.0 * ms / CHAIN_LAYERS, CHAIN_POSITION);
        cudaCheck(cudaGraphExecDestroy(graph));
    }
    g_pdl = device_pdl;
}

// ----------------------------------------------------------------------------------------------

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int max_K = 4 * D48_C, max_OC = LAB_VP;
    LinearBuffers lin = {gpu_floats((size_t)M_MAX * max_OC), gpu_floats((size_t)M_MAX * max_OC),
                         gpu_floats((size_t)M_MAX * max_K), gpu_floats((size_t)max_OC * D48_C), gpu_floats(max_OC),
                         gpu_floats(max_K), gpu_floats(max_K)};
    AttentionBuffers att = {gpu_floats((size_t)M_MAX * LAB_C),
                            gpu_floats((size_t)M_MAX * LAB_NH * ceil_div(MAX_T, DECODE_CHUNK) * (HS + 2)),
                            gpu_floats((size_t)M_MAX * MAX_T * 2 * LAB_C), gpu_floats((size_t)M_MAX * 3 * LAB_C),
                            (unsigned int*)gpu_ints((size_t)M_MAX * LAB_NH), gpu_ints(1)};
    cudaCheck(cudaMemset(att.counters, 0, (size_t)M_MAX * LAB_NH * sizeof(unsigned int)));
    for (int variant = 1; variant <= 3; variant++) {
        if (!variant_selected(variant)) { continue; }
        for (int C : {LAB_C, D48_C}) {
            for (const Layer& s : layers_of(C)) {
                for (int N : {1, M_MAX}) {
                    if (variant > 1 || N == 1) { run_linear(lin, s, variant, N); }
                }
            }
        }
    }
    if (variant_selected(4)) {
        for (AttentionKind kind : {ATTENTION_SOFTMAX, ATTENTION_RELU}) {
            for (int M : {1, M_MAX}) {
                for (int pos : {31, 255, MAX_T - 1}) { run_attention(att, M, pos, kind); }
            }
        }
    }
    if (variant_selected(5)) { run_chain(); }
    gpu_free_all();
    return lab_finish();
}
