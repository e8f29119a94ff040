// The reference's debug state, which test_gpt2_fp32 checks the trainer against: magic 20240327,
// then by version
//   4 (train_gpt2.py --write-state): header [2..7] B T V Vp attention steps, [8..17] the steps'
//     lr, AdamW, accumulation, clipping and schedule; inputs, targets (B, T) int32; logits
//     (B, T, Vp); the loss; the gradients; each step's loss and gradient norm.
//   2 (the classic state, e.g. gpt2_124M_debug_state.bin): header [2..3] B T; inputs, targets;
//     logits (B, T, V) unpadded; the loss; the gradients. No optimizer steps.
// The gradients are every parameter's, in model-file order (wte padded to Vp). debug_state_read
// checks the header against the model and the file's size before it allocates anything.
#pragma once

#include <stdint.h>
#include <string.h>

#include <vector>

#include "llmc/model_file.h"
#include "llmc/run_shape.h"
#include "llmc/utils.h"

constexpr int DEBUG_STATE_MAGIC = 20240327;
constexpr int DEBUG_STATE_CLASSIC = 2;
constexpr int DEBUG_STATE_VERSION = 4;
constexpr int DEBUG_STATE_HEADER_INTS = 256;
constexpr int DEBUG_STATE_MAX_STEPS = 10000;

struct DebugState {
    int version, B, T, num_steps;
    RunShape shape;  // lr, AdamW, accumulation, clipping and schedule of the steps
    std::vector<int> inputs, targets;  // (B, T)
    std::vector<float> logits;         // (B, T, Vp), the padded columns 0
    float loss;
    std::vector<float> grads;          // every parameter, in the model file's layout
    std::vector<float> step_losses;    // loss of each of the num_steps AdamW steps
    std::vector<float> grad_norms;     // global gradient norm (before clipping) of each step
};

static inline float debug_header_float(const int32_t* header, int slot) {
    float value;
    memcpy(&value, &header[slot], sizeof(value));
    return value;
}

// Version 4's header past B and T: it must describe the model; the steps' run shape.
static inline void debug_state_steps(DebugState* st, const int32_t* header, const char* path, const ModelShape* model) {
    int V = header[4], Vp = header[5], attention = header[6];
    st->num_steps = header[7];
    RunShape* r = &st->shape;
    r->lr = debug_header_float(header, 8);
    r->beta1 = debug_header_float(header, 9);
    r->beta2 = debug_header_float(header, 10);
    r->eps = debug_header_float(header, 11);
    r->weight_decay = debug_header_float(header, 12);
    r->micro_batches = header[13];
    r->grad_clip = debug_header_float(header, 14);
    r->warmup_steps = header[15];
    r->schedule = (Schedule)header[16];
    r->final_lr_frac = debug_header_float(header, 17);
    r->max_steps = st->num_steps;
    if (st->num_steps < 1 || st->num_steps > DEBUG_STATE_MAX_STEPS) {
        fail("%s: %d steps, expected 1..%d", path, st->num_steps, DEBUG_STATE_MAX_STEPS);
    }
    if (r->micro_batches < 1 || st->B % r->micro_batches != 0 || r->schedule < 0 || r->schedule > 2) {
        fail("%s: bad accumulation %d (must divide B=%d) or schedule %d", path, r->micro_batches, st->B, r->schedule);
    }
    if (V != model->vocab_size || Vp != model->padded_vocab_size || attention != model->attention) {
        fail("%s: V=%d Vp=%d attention=%d, but the model has V=%d Vp=%d attention=%d", path, V, Vp, attention,
             model->vocab_size, model->padded_vocab_size, model->attention);
    }
}

// The classic state's logits are unpadded.
static inline size_t debug_state_logit_columns(const DebugState* st, const ModelShape* model) {
    return st->version == DEBUG_STATE_CLASSIC ? model->vocab_size : model->padded_vocab_size;
}

// Reads and checks the header (B*T at most max_rows) and the file's size.
static inline void debug_state_header(DebugState* st, const char* path, const ModelShape* model, size_t max_rows) {
    FILE* file = fopen_or_fail(path, "rb");
    int32_t header[DEBUG_STATE_HEADER_INTS];
    bool complete = fread(header, sizeof(int32_t), DEBUG_STATE_HEADER_INTS, file) == DEBUG_STATE_HEADER_INTS;
    fclose(file);  // before the checks: with FAIL_THROWS a failed one does not end the process
    if (!complete) { fail("%s: shorter than its 1024-byte header (truncated)", path); }
    if (header[0] != DEBUG_STATE_MAGIC) {
        fail("%s: bad magic %d, expected %d (not a debug state file)", path, header[0], DEBUG_STATE_MAGIC);
    }
    st->version = header[1];
    st->B = header[2];
    st->T = header[3];
    if (st->B <= 0 || st->T <= 0 || st->T > model->max_seq_len || (size_t)st->B * st->T > max_rows) {
        fail("%s: B=%d T=%d do not fit the model (maxT %d, B*T at most %zu)", path, st->B, st->T, model->max_seq_len,
             max_rows);
    }
    st->shape = RunShape{};
    if (st->version == DEBUG_STATE_VERSION) {
        debug_state_steps(st, header, path, model);
    } else if (st->version == DEBUG_STATE_CLASSIC) {
        st->num_steps = 0;
        st->shape.micro_batches = 1;
    } else {
        fail("%s: version %d not supported, expected %d (train_gpt2.py) or %d (classic)", path, st->version,
             DEBUG_STATE_VERSION, DEBUG_STATE_CLASSIC);
    }
    size_t BT = (size_t)st->B * st->T;
    int64_t expected = 4 * (int64_t)(DEBUG_STATE_HEADER_INTS + 2 * BT + BT * debug_state_logit_columns(st, model) + 1 +
                                     count_parameters(model) + 2 * (size_t)st->num_steps);
    int64_t size = file_size(path);
    if (size != expected) {
        fail("%s: %lld bytes, expected %lld for this model and header (truncated or not its state)", path,
             (long long)size, (long long)expected);
    }
}

// The reference state for a model of this shape whose forward pass takes at most max_rows rows.
static inline void debug_state_read(DebugState* st, const char* path, const ModelShape* model, size_t max_rows) {
    debug_state_header(st, path, model, max_rows);
    size_t BT = (size_t)st->B * st->T, V = model->vocab_size, Vp = model->padded_vocab_size;
    size_t logit_columns = debug_state_logit_columns(st, model);
    st->inputs.resize(BT);
    st->targets.resize(BT);
    st->grads.resize(count_parameters(model));
    st->step_losses.resize(st->num_steps);
    st->grad_norms.resize(st->num_steps);
    std::vector<float> logits(BT * logit_columns);
    FILE* file = fopen_or_fail(path, "rb");
    if (fseek(file, DEBUG_STATE_HEADER_INTS * sizeof(int32_t), SEEK_SET) != 0) {
        fail("%s: cannot seek past the header", path);
    }
    fread_or_fail(st->inputs.data(), sizeof(int), BT, file, path);
    fread_or_fail(st->targets.data(), sizeof(int), BT, file, path);
    fread_or_fail(logits.data(), sizeof(float), logits.size(), file, path);
    fread_or_fail(&st->loss, sizeof(float), 1, file, path);
    fread_or_fail(st->grads.data(), sizeof(float), st->grads.size(), file, path);
    fread_or_fail(st->step_losses.data(), sizeof(float), st->step_losses.size(), file, path);
    fread_or_fail(st->grad_norms.data(), sizeof(float), st->grad_norms.size(), file, path);
    fclose(file);
    st->logits.assign(BT * Vp, 0.0f);
    for (size_t row = 0; row < BT; row++) {
        memcpy(&st->logits[row * Vp], &logits[row * logit_columns], V * sizeof(float));
    }
    for (size_t i = 0; i < BT; i++) {
        if (st->inputs[i] < 0 || st->inputs[i] >= (int)V || st->targets[i] < 0 || st->targets[i] >= (int)V) {
            fail("%s: token at position %zu is outside [0, %zu)", path, i, V);
        }
    }
}
