// The flags that shape a run's numbers (RunShape, stored in checkpoints and compared on resume)
// and the learning-rate schedule they define: linear warmup, then cosine, linear or constant.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <utility>

#include "llmc/model_file.h"

enum Schedule : int32_t { SCHEDULE_COSINE = 0, SCHEDULE_LINEAR = 1, SCHEDULE_CONSTANT = 2 };
constexpr const char* SCHEDULE_NAMES[] = {"cosine", "linear", "constant"};  // by Schedule, as -k spells them

static inline const char* schedule_name(Schedule schedule) {
    return schedule >= 0 && schedule <= SCHEDULE_CONSTANT ? SCHEDULE_NAMES[schedule] : "unknown";
}

// A checkpoint stores these and a resumed run must match; micro_batches counts the micro-batches
// of B x T per optimizer step over all GPUs (-d / B*T), so a run may resume on another number of
// GPUs. precision holds -f, the matrix products' arithmetic: 0 FP32 accuracy (split TF32 since
// 2026-11-26; plain FP32 before), 1 TF32, 2 plain FP32 (the trainer's MatmulPrecision).
struct RunShape {
    int32_t B, T, micro_batches, max_steps, warmup_steps;
    Schedule schedule;        // -k
    AttentionKind attention;  // -A; ATTENTION_OF_MODEL until the model is built
    int32_t precision, overfit_single_batch;
    float lr, final_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    float spike_z;         // -sg: skip an update whose norm is this many std devs above the recent ones
    int32_t spike_window;  // --spike-window: how many recent norms
};

// The flag of the first field (bit for bit) in which a run differs from the run it resumes, or
// nullptr when they agree.
static inline const char* run_shape_mismatch(const RunShape& saved, const RunShape& current) {
    auto differ = [](const auto& a, const auto& b) { return memcmp(&a, &b, sizeof(a)) != 0; };
    const RunShape &s = saved, &c = current;
    const std::pair<bool, const char*> fields[] = {
        {differ(s.B, c.B), "-b"}, {differ(s.T, c.T), "-t"}, {differ(s.micro_batches, c.micro_batches), "-d"},
        {differ(s.max_steps, c.max_steps), "-x"}, {differ(s.warmup_steps, c.warmup_steps), "-u"},
        {differ(s.schedule, c.schedule), "-k"}, {differ(s.precision, c.precision), "-f"},
        {differ(s.overfit_single_batch, c.overfit_single_batch), "-a"}, {differ(s.lr, c.lr), "-l"},
        {differ(s.final_lr_frac, c.final_lr_frac), "-q"}, {differ(s.weight_decay, c.weight_decay), "-c"},
        {differ(s.beta1, c.beta1), "--beta1"}, {differ(s.beta2, c.beta2), "--beta2"}, {differ(s.eps, c.eps), "--eps"},
        {differ(s.grad_clip, c.grad_clip), "-gc"}, {differ(s.seed, c.seed), "--seed"},
        {differ(s.spike_z, c.spike_z), "-sg"}, {differ(s.spike_window, c.spike_window), "--spike-window"},
    };
    for (const auto& [differs, flag] : fields) {
        if (differs) { return flag; }
    }
    return nullptr;
}

// Learning rate of step (0-based): linear warmup to lr, then the decay to final_lr_frac * lr.
static inline float learning_rate(const RunShape* r, int step) {
    if (step < r->warmup_steps) { return (float)((double)r->lr * (step + 1) / r->warmup_steps); }
    int decay_steps = r->max_steps - r->warmup_steps;
    double progress = decay_steps > 0 ? (double)(step - r->warmup_steps) / decay_steps : 0.0;
    double f = r->final_lr_frac, factor = 1.0;
    if (r->schedule == SCHEDULE_COSINE) { factor = f + (1.0 - f) * 0.5 * (1.0 + cos(M_PI * progress)); }
    if (r->schedule == SCHEDULE_LINEAR) { factor = 1.0 - (1.0 - f) * progress; }
    return (float)(r->lr * factor);
}
