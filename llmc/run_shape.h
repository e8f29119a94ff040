// The flags that shape a run's numbers (RunShape, stored in checkpoints and compared on resume)
// and the learning-rate schedule they define: linear warmup, then cosine, linear or constant.
#pragma once

#include <math.h>
#include <stdint.h>

enum Schedule { SCHEDULE_COSINE = 0, SCHEDULE_LINEAR = 1, SCHEDULE_CONSTANT = 2 };

static inline const char* schedule_name(int schedule) {
    return schedule == SCHEDULE_LINEAR ? "linear" : schedule == SCHEDULE_CONSTANT ? "constant" : "cosine";
}

// A checkpoint stores these and a resumed run must match; micro_batches counts the micro-batches
// of B x T per optimizer step over all GPUs (-d / B*T), so a run may resume on another number of
// GPUs. use_tf32 holds -f: 0 FP32 accuracy (split TF32 since 2026-11-26; plain FP32 before), 1
// TF32, 2 plain FP32.
struct RunShape {
    int32_t B, T, micro_batches, max_steps, warmup_steps, schedule, attention, use_tf32, overfit_single_batch;
    float lr, final_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    float spike_z;         // -sg: skip an update whose norm is this many std devs above the recent ones
    int32_t spike_window;  // --spike-window: how many recent norms
};

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
