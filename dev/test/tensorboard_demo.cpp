// Writes a run's record into DIR through llmc/logger.h's writers, as the trainer would with a
// resume, for dev/test/test_tensorboard.py to read back with TensorBoard: a first process logs
// steps 0..9 and is killed after its checkpoint of step 6; a second resumes at step 6 and logs
// steps 6..12 with other values (so that any step of the first left after the resume shows).
//
//   build/tensorboard_demo DIR
#include <string>

#include "llmc/logger.h"

constexpr int64_t DEMO_TOKENS_PER_STEP = 4096;
constexpr int DEMO_RESUME_STEP = 6;

// One process: its start at `first` (0: a new run), then its steps up to `last`.
static void demo_process(const std::string& dir, int first, int last, float offset) {
    RunLog log = run_log_open(dir, first > 0, false, true);
    log_tokens_per_step(&log, DEMO_TOKENS_PER_STEP);
    if (first > 0) { log_resumed(&log, first, 1); }
    log_config(&log, first, "| config | started at step " + std::to_string(first) + " |\n");
    for (int step = first; step <= last; step++) {
        float loss = 10.0f - 0.25f * step + offset;
        if (step % 5 == 0) { log_val_loss(&log, step, loss + 0.5f); }
        if (step % 5 == 0 && step > 0) { log_eval(&log, step, 0.25 + 0.01 * step + offset); }
        if (step % 4 == 0 && step > 0) {
            log_sample(&log, step, "sample at step " + std::to_string(step) + "\nprocess " + std::to_string(first > 0));
        }
        log_step(&log, {.step = step, .loss = loss, .lr = 6e-4f * (step + 1) / 13, .grad_norm = 1.0f + offset,
                        .ms = 40.0 + step, .tokens_per_second = 102400.0 - step, .mfu_percent = 30.5 + offset});
        if (step == 3 || step == 8) { log_skipped(&log, step, "non-finite norm", step == 3 ? 1 : 2); }
    }
    run_log_close(&log);
}

int main(int argc, char** argv) {
    if (argc != 2) { fail("usage: %s DIR", argv[0]); }
    demo_process(argv[1], 0, 9, 0.0f);
    demo_process(argv[1], DEMO_RESUME_STEP, 12, 0.125f);
    return 0;
}
