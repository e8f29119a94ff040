/*
Checks train_gpt2_fp32.cu against the PyTorch reference (train_gpt2.py): the logits, the loss,
the gradient of every parameter tensor, and the losses and gradient norms of several AdamW steps
with the reference's gradient accumulation, clipping and learning-rate schedule. Prints a table
and PASS or FAIL; exits non-zero on FAIL and zero with a SKIPPED line when there is no GPU.

  ./test_gpt2_fp32 [-m MODEL -s STATE] [-f 0|1|2] (-f 0: FP32, split TF32; 1: TF32; 2: plain FP32)
  ./test_gpt2_fp32 --decode                        (generation: KV-cache steps against full forward passes)
MODEL is a model file or a Hugging Face GPT-2 directory; STATE a debug state (llmc/debug_state.h) of
version 4 (train_gpt2.py) or 2 (the classic gpt2_124M_debug_state.bin, no optimizer steps). Without -m
and -s: gpt2_124M.bin and gpt2_124M_debug_state.bin from the current directory if there, else the
bundled small fixture.
*/
#define TESTING
#include "train_gpt2_fp32.cu"

#include <algorithm>
#include <random>

#include "llmc/debug_state.h"  // defines: DebugState, the reference's debug state file, read and checked

// Tolerances: errors are max |ours - reference| relative to the tensor's largest |reference|
// (the loss ones are absolute). FP32 (-f 0 split TF32, -f 2 plain): the reference is FP32 too and
// only the order of the float sums differs (cuBLAS tiling, warp trees; the worst check of the small
// fixtures on an H100, the step-4 or step-7 gradient norm: 1.5e-5 and 8.8e-6 with -f 0, 1.3e-5 and
// 9.1e-6 with -f 2). Measured on the H200: logits 2e-6, losses 3e-6, gradients 1e-6 on the small
// fixtures and up to 8.4e-5 on GPT-2 124M (wpe, ln1w, qkvw: sums over 2048 positions with
// cancellation); the tolerances leave 5-10x headroom over those. A real
// bug (a missing 1/(t+1), a wrong bias gradient or GELU derivative, the decay mask) gives errors of
// 1e-2 to 1 (scripts/mutation_check.sh proves each is caught). TF32 (-f 1): the matrix products
// round their inputs to 10 mantissa bits (2^-11 ~ 5e-4 per product), which the passes compound;
// measured up to 2e-2 on the ReLU fixture's tiny qkvw gradient, so the TF32 ones are looser.
struct Tolerances {
    double logits;      // relative to max |logit|
    double loss;        // absolute, nats
    double grads;       // relative to each tensor's max |gradient|
    double step_loss;   // absolute, nats, after AdamW steps
    double grad_norm;   // relative to the reference norm
};

constexpr Tolerances FP32_TOLERANCES = {.logits = 2e-5, .loss = 2e-5, .grads = 5e-4, .step_loss = 5e-5, .grad_norm = 5e-5};
constexpr Tolerances TF32_TOLERANCES = {.logits = 5e-3, .loss = 2e-3, .grads = 1e-1, .step_loss = 1e-2, .grad_norm = 1e-2};

// One row of the results table; false when the error is over tolerance or not finite.
static bool report(const char* name, double error, double scale, double tolerance, bool relative) {
    bool ok = isfinite(error) && error <= tolerance;
    printf("%-22s %12.4e %12.4e %12.4e  %-8s %s\n", name, scale, error, tolerance, relative ? "relative" : "absolute",
           ok ? "ok" : "FAIL");
    return ok;
}

// logits[0..n) of row `row` of the last chunk of the model's last forward pass without targets.
static void gpt2_read_logits(const GPT2* model, size_t row, int n, float* logits) {
    size_t rows = (size_t)model->B * model->T % classifier_chunk_rows();
    if (rows == 0) { rows = std::min((size_t)model->B * model->T, classifier_chunk_rows()); }
    cudaCheck(cudaMemcpy2D(logits, sizeof(float), model->acts.logits + row, rows * sizeof(float), sizeof(float), n,
                           cudaMemcpyDeviceToHost));
}

// Max |got - expected| relative to max |expected|; NaN if any value is not finite.
static double relative_error(const float* got, const float* expected, size_t n, double* scale) {
    double max_error = 0.0, max_ref = 0.0;
    *scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) { return NAN; }
        max_error = fmax(max_error, fabs((double)got[i] - expected[i]));
        max_ref = fmax(max_ref, fabs((double)expected[i]));
    }
    *scale = max_ref;
    return max_ref > 0.0 ? max_error / max_ref : max_error;
}

static bool check_relative(const char* name, const float* got, const float* expected, size_t n, double tolerance) {
    double scale;
    double error = relative_error(got, expected, n, &scale);
    return report(name, error, scale, tolerance, true);
}

static bool check_absolute(const char* name, float got, float expected, double tolerance) {
    return report(name, fabs((double)got - expected), fabs(expected), tolerance, false);
}

static bool check_relative_scalar(const char* name, float got, float expected, double tolerance) {
    double error = isfinite(got) ? fabs((double)got - expected) / fabs(expected) : NAN;
    return report(name, error, fabs(expected), tolerance, true);
}

// Without -m and -s: the classic files in the current directory, as the classic test had them,
// or else the bundled small fixture.
// ----------------------------------------------------------------------------------------------
// Generation: every cached decode step's logits against a full forward pass over the same tokens
// (FP32: only the order of the float sums differs, measured up to 3.6e-6; the issue asks 1e-5),
// greedy tokens against the argmax, and the same seed giving the same tokens. The models are
// random with weights N(0, 0.1), large enough for sharp attention, so that a key or value read
// from the wrong position moves the logits far beyond the tolerance; maxT = 400 and a 250-token prompt put
// the steps in chunks 7 and 8 of attention_decode (DECODE_CHUNK = 32) and the prompt across eight.
constexpr double DECODE_TOLERANCE = 1e-5;

static std::vector<float> random_parameters(const ModelShape* config, uint64_t seed) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(config, sizes);
    std::vector<float> host(count_parameters(config));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        float mean = PARAMETER_TENSORS[i].init == INIT_ONE ? 1.0f : 0.0f;  // the layernorm weights
        for (size_t j = 0; j < sizes[i]; j++) { host[offset + j] = mean + normal(rng); }
        offset += sizes[i];
    }
    size_t V = config->vocab_size, Vp = config->padded_vocab_size, C = config->channels;
    std::fill(host.begin() + V * C, host.begin() + Vp * C, 0.0f);  // wte's padded rows
    return host;
}

// Generates `steps` tokens for M completions of prompt one step at a time; after each, checks the
// step's logits against `reference`'s full forward pass. Returns the tokens (M, n + steps).
static std::vector<std::vector<int>> check_decode_steps(GPT2* decoder, GPT2* reference, const std::vector<int>& prompt,
                                                        int M, int steps, SamplingParams sampling, double* max_error,
                                                        int* wrong_greedy) {
    const ModelShape* c = &decoder->config;
    int n = (int)prompt.size(), Vp = c->padded_vocab_size, V = c->vocab_size;
    Generator gen;
    generator_init(&gen, decoder, M, n + steps);
    generator_start(decoder, &gen, prompt, &sampling);
    std::vector<float> logits((size_t)M * Vp), expected(Vp);
    for (int step = 0; step < steps; step++) {
        generator_queue_step(decoder, &gen);
        cudaCheck(cudaMemcpy(logits.data(), decoder->acts.logits, logits.size() * sizeof(float), cudaMemcpyDeviceToHost));
        int T = n + step;  // tokens so far; the step's logits are those of position T - 1
        std::vector<int> rows((size_t)M * T);
        for (int m = 0; m < M; m++) { memcpy(&rows[(size_t)m * T], gen.tokens + (size_t)m * gen.max_T, T * sizeof(int)); }
        gpt2_forward(reference, rows.data(), nullptr, M, T);
        for (int m = 0; m < M; m++) {
            gpt2_read_logits(reference, (size_t)m * T + T - 1, Vp, expected.data());
            std::vector<float> got(logits.begin() + (size_t)m * Vp, logits.begin() + (size_t)m * Vp + V);
            double scale;
            *max_error = std::max(*max_error, relative_error(got.data(), expected.data(), V, &scale));
            int token = gen.tokens[(size_t)m * gen.max_T + T];
            int argmax = (int)(std::max_element(got.begin(), got.end()) - got.begin());
            if (sampling.temperature == 0.0f && token != argmax) { (*wrong_greedy)++; }
        }
    }
    std::vector<std::vector<int>> tokens(M);
    for (int m = 0; m < M; m++) { tokens[m].assign(gen.tokens + (size_t)m * gen.max_T, gen.tokens + (size_t)m * gen.max_T + n + steps); }
    generator_free(&gen);
    return tokens;
}

static int run_decode_checks() {
    printf("test_gpt2_fp32 --decode: KV-cache steps against full forward passes (FP32), tolerance %.0e\n", DECODE_TOLERANCE);
    int checks = 0, failures = 0;
    auto count = [&](bool ok) { checks++; failures += ok ? 0 : 1; };
    const int prompt_len = 250, steps = 20, M = 3, M_many = FEW_ROWS_MAX + 2;  // M_many: the cuBLAS path
    for (int hs : {32, 64, 128}) {
        for (AttentionKind kind : {ATTENTION_SOFTMAX, ATTENTION_RELU}) {
            ModelShape config = {.max_seq_len = 400, .vocab_size = 1000, .padded_vocab_size = 1024, .num_layers = 2,
                                 .num_heads = 256 / hs, .channels = 256, .attention = kind};
            std::vector<float> host = random_parameters(&config, 42 + hs);
            size_t device_bytes = g_device_bytes;  // what the two models' gpt2_free must give back
            GPT2 decoder, reference;
            gpt2_build_from_parameters(&decoder, &config, host);
            gpt2_build_from_parameters(&reference, &config, host);
            gpt2_allocate_activations(&decoder, 1, prompt_len);
            gpt2_allocate_activations(&reference, M_many, config.max_seq_len);
            std::mt19937 rng(hs);
            std::vector<int> prompt(prompt_len);
            for (int& id : prompt) { id = (int)(rng() % config.vocab_size); }
            SamplingParams greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
            SamplingParams sampled = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 7};
            double error = 0.0;
            int wrong_greedy = 0;
            check_decode_steps(&decoder, &reference, prompt, M, steps, greedy, &error, &wrong_greedy);
            check_decode_steps(&decoder, &reference, {prompt[0]}, 1, 4, greedy, &error, &wrong_greedy);  // no prefill
            check_decode_steps(&decoder, &reference, prompt, M_many, 6, greedy, &error, &wrong_greedy);
            auto first = check_decode_steps(&decoder, &reference, prompt, M, steps, sampled, &error, &wrong_greedy);
            auto again = check_decode_steps(&decoder, &reference, prompt, M, steps, sampled, &error, &wrong_greedy);
            char name[64];
            snprintf(name, sizeof(name), "decode hs=%d %s", hs, attention_name(kind));
            count(report(name, error, 1.0, DECODE_TOLERANCE, true));
            snprintf(name, sizeof(name), "greedy=argmax hs=%d %s", hs, attention_name(kind));
            count(report(name, wrong_greedy, 1.0, 0.0, false));
            bool distinct = first[0] != first[1] || first[1] != first[2];  // completions draw their own numbers
            snprintf(name, sizeof(name), "seeded hs=%d %s", hs, attention_name(kind));
            count(report(name, first == again && distinct ? 0.0 : 1.0, 1.0, 0.0, false));
            gpt2_free(&decoder);
            gpt2_free(&reference);
            snprintf(name, sizeof(name), "bytes not freed hs=%d %s", hs, attention_name(kind));
            count(report(name, (double)(g_device_bytes - device_bytes), 1.0, 0.0, false));
        }
    }
    printf("%d passed, %d failed\n", checks - failures, failures);
    printf("%s\n", failures == 0 ? "PASS" : "FAIL");
    return failures == 0 ? 0 : 1;
}

constexpr const char* CLASSIC_MODEL = "gpt2_124M.bin";
constexpr const char* CLASSIC_STATE = "gpt2_124M_debug_state.bin";
constexpr const char* FIXTURE_MODEL = "dev/test/fixtures/gpt2_small_softmax_model.bin";
constexpr const char* FIXTURE_STATE = "dev/test/fixtures/gpt2_small_softmax_state.bin";

int main(int argc, char** argv) {
    const char* model_path = nullptr;
    const char* state_path = nullptr;
    int precision = MATMUL_SPLIT_TF32;
    // -c: split TF32's chunk of summed values (-f 0; the trainer's 256 by default): 32 takes the
    // fixtures' products through both ways of adding the chunks (split_partial_floats)
    const char* usage = "usage: test_gpt2_fp32 [-m MODEL -s STATE] [-f 0|1|2] [-c CHUNK] | --decode";
    if (argc == 2 && strcmp(argv[1], "--decode") == 0) {
        if (!cuda_setup(MATMUL_FP32)) {
            printf("SKIPPED (no GPU): test_gpt2_fp32 --decode\n");
            return 0;
        }
        return run_decode_checks();
    }
    auto is_precision = [](const char* value) {
        return strcmp(value, "0") == 0 || strcmp(value, "1") == 0 || strcmp(value, "2") == 0;
    };
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fail("flag %s needs a value (%s)", argv[i], usage); }
        if (strcmp(argv[i], "-m") == 0) { model_path = argv[i + 1]; }
        else if (strcmp(argv[i], "-s") == 0) { state_path = argv[i + 1]; }
        else if (strcmp(argv[i], "-f") == 0 && is_precision(argv[i + 1])) { precision = atoi(argv[i + 1]); }
        else if (strcmp(argv[i], "-c") == 0 && atoi(argv[i + 1]) >= 32) { g_split_chunk = atoi(argv[i + 1]); }
        else { fail("unknown flag or value %s %s (%s)", argv[i], argv[i + 1], usage); }
    }
    if ((model_path == nullptr) != (state_path == nullptr)) { fail("flags -m and -s go together (%s)", usage); }
    std::string bundled_model, bundled_state;
    if (model_path == nullptr && (file_exists(CLASSIC_MODEL) || file_exists(CLASSIC_STATE))) {
        model_path = CLASSIC_MODEL;
        state_path = CLASSIC_STATE;
    } else if (model_path == nullptr) {
        bundled_model = find_bundled_file(FIXTURE_MODEL, nullptr, "-m");
        bundled_state = find_bundled_file(FIXTURE_STATE, nullptr, "-s");
        model_path = bundled_model.c_str();
        state_path = bundled_state.c_str();
    }
    std::vector<float> parameters;  // the files are checked with or without a GPU
    ModelShape config = read_model(model_path, &parameters);
    DebugState st;
    debug_state_read(&st, state_path, &config, classifier_chunk_rows());
    if (!cuda_setup(precision)) {
        printf("SKIPPED (no GPU): test_gpt2_fp32 %s\n", state_path);
        return 0;
    }
    GPT2 model;
    gpt2_build_from_parameters(&model, &config, parameters);
    const ModelShape* c = &model.config;
    const Tolerances tol = precision == MATMUL_TF32 ? TF32_TOLERANCES : FP32_TOLERANCES;
    printf("test_gpt2_fp32: %s (version %d), %s attention, %s, B=%d T=%d L=%d NH=%d C=%d V=%d Vp=%d\n",
           state_path, st.version, attention_name(c->attention), precision_name(precision), st.B, st.T,
           c->num_layers, c->num_heads, c->channels, c->vocab_size, c->padded_vocab_size);
    if (precision == MATMUL_SPLIT_TF32 && gemm_split_takes_model(c)) {
        printf("split TF32: our Hopper GEMM (gemm_split_tf32); cuBLASLt's, hi hi in chunks of %d, where it cannot\n",
               g_split_chunk);
    } else if (precision == MATMUL_SPLIT_TF32) {
        printf("split TF32: hi hi in chunks of %d summed values\n", g_split_chunk);
    }
    printf("%-22s %12s %12s %12s  %-8s %s\n", "check", "ref scale", "error", "tolerance", "kind", "");
    gpt2_allocate_activations(&model, st.B, st.T);
    size_t BT = (size_t)st.B * st.T;
    int checks = 0, failures = 0;
    auto count = [&](bool ok) { checks++; failures += ok ? 0 : 1; };

    // logits of the initial model (including the padded columns, which must be 0)
    if (BT > classifier_chunk_rows()) {
        fail("%s: B*T = %zu is over the %zu logit rows kept", state_path, BT, classifier_chunk_rows());
    }
    gpt2_forward(&model, st.inputs.data(), nullptr, st.B, st.T);
    std::vector<float> logits(BT * c->padded_vocab_size);
    for (size_t row = 0; row < BT; row++) {
        gpt2_read_logits(&model, row, c->padded_vocab_size, logits.data() + row * c->padded_vocab_size);
    }
    count(check_relative("logits", logits.data(), st.logits.data(), logits.size(), tol.logits));

    // AdamW steps on the reference's batch, each over its micro-batches; step 0's loss and
    // accumulated gradients are those of the initial model. A classic state has no steps: one
    // pass, without an update, gives its loss and gradients.
    const RunShape* r = &st.shape;
    int micro_B = st.B / r->micro_batches;
    // The backward pass writes every gradient, whatever the memory held: the gradients (and a later
    // micro-step's, once allocated) are filled with NaN first, which stays where a gradient is not written.
    auto poison = [&](float* grads) { cudaCheck(cudaMemset(grads, 0xff, model.num_parameters * sizeof(float))); };
    poison(model.grads_memory);
    for (int step = 0; step < std::max(st.num_steps, 1); step++) {
        gpt2_reset_loss(&model);
        for (int micro = 0; micro < r->micro_batches; micro++) {
            size_t rows = (size_t)micro * micro_B * st.T;
            gpt2_begin_micro_step(&model, micro, micro == r->micro_batches - 1);
            if (step == 0 && micro == 1) { poison(model.micro_grads_memory); }
            gpt2_forward(&model, st.inputs.data() + rows, st.targets.data() + rows, micro_B, st.T,
                         1.0f / r->micro_batches, true);
            gpt2_backward(&model);
            gpt2_end_micro_step(&model);
        }
        if (st.num_steps > 0) {
            gpt2_update(&model, learning_rate(r, step), r->beta1, r->beta2, r->eps, r->weight_decay, r->grad_clip, 0.0f);
        }
        const StepStats* stats = gpt2_read_stats(&model);
        float step_loss = stats->loss, grad_norm = stats->grad_norm;
        if (step == 0) {
            count(check_absolute("loss", step_loss, st.loss, tol.loss));
            std::vector<float> grads(model.num_parameters);
            cudaCheck(cudaMemcpy(grads.data(), model.grads_memory, grads.size() * sizeof(float), cudaMemcpyDeviceToHost));
            size_t offset = 0;
            for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
                char name[64];
                snprintf(name, sizeof(name), "grad %s", PARAMETER_TENSORS[i].name);
                count(check_relative(name, grads.data() + offset, st.grads.data() + offset, model.param_sizes[i], tol.grads));
                offset += model.param_sizes[i];
            }
        }
        if (step >= st.num_steps) { break; }
        char name[64];
        snprintf(name, sizeof(name), "step %d loss", step);
        count(check_absolute(name, step_loss, st.step_losses[step], tol.step_loss));
        snprintf(name, sizeof(name), "step %d grad norm", step);
        count(check_relative_scalar(name, grad_norm, st.grad_norms[step], tol.grad_norm));
    }

    if (st.num_steps == 0) { printf("(a version %d state has no optimizer steps to check)\n", st.version); }
    gpt2_free(&model);
    printf("%d passed, %d failed\n", checks - failures, failures);
    printf("%s\n", failures == 0 ? "PASS" : "FAIL");
    return failures == 0 ? 0 : 1;
}
