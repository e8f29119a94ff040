// main.log, the run's record for plots (scripts/plot.py), and TensorBoard's event file beside it
// (llmc/tensorboard.h): log_open's rule for which folder may hold them, then one writer per kind
// of line, writing both, each flushed as written so that a killed run keeps what it logged. The
// writers take a RunLog; with nothing open in it (other ranks, no -o) they write nothing.
//   s:STEP trl:LOSS lr:LR norm:NORM ms:MS tok/s:TOKS mfu:PERCENT   a training step
//   s:STEP tel:LOSS                                              a validation loss
//   s:STEP eval:ACCURACY                                         a multiple-choice evaluation
//   s:STEP skipped: WHY                                          an update the guards skipped
//   # tokens per step: N                                         at each process start: the x axis in tokens
//   # ...                                                        a comment: a resume, a restart, a checkpoint
// A step logged again after a resume or a restart supersedes its earlier line.
// TensorBoard, at main.log's steps: scalars train/loss, train/lr, train/grad_norm, perf/step_ms,
// perf/tok_per_s, perf/mfu_percent (a step line), val/loss, eval/accuracy, train/skipped_updates
// (the count so far, at a skipped step), perf/checkpoint_stall_ms (at a checkpoint's step); text config (at the step a process starts from) and
// samples. A resume (a restart) starts a TensorBoard session at its step (at 0): TensorBoard drops
// the events logged before it at that step or later, which are logged again.
#pragma once

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <filesystem>
#include <string>
#include <vector>

#include "llmc/checkpoint_dir.h"
#include "llmc/tensorboard.h"
#include "llmc/utils.h"

// Whether a file of dir, by its name, belongs to the run there: main.log, latest, a checkpoint file,
// an event file.
static inline bool log_run_file(const std::string& name) {
    return name == "main.log" || name == "latest" || checkpoint_step_of(name, "model") >= 0 ||
           checkpoint_step_of(name, "state") >= 0 || name.rfind(TENSORBOARD_FILE_PREFIX, 0) == 0;
}

// --force over a folder holding a run: the run's files (log_run_file) move into a new subfolder
// DIR/replaced_<local date and time>, so that -y 1 cannot resume the discarded run and TensorBoard
// shows the new run alone, and nothing is deleted. Returns that subfolder ("": nothing to move).
static inline std::string log_set_aside(const std::string& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        std::string name = entry.path().filename().string();
        if (entry.is_regular_file(ec) && log_run_file(name)) { names.push_back(name); }
    }
    if (names.empty()) { return ""; }
    char stamp[32];
    time_t now = time(nullptr);
    strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", localtime(&now));
    std::string aside = dir + "/replaced_" + stamp;
    for (int n = 2; mkdir(aside.c_str(), 0755) != 0; n++) {
        if (errno != EEXIST) { fail("--force: cannot create %s: %s", aside.c_str(), strerror(errno)); }
        aside = dir + "/replaced_" + stamp + "_" + std::to_string(n);
    }
    for (const std::string& name : names) {
        if (rename((dir + "/" + name).c_str(), (aside + "/" + name).c_str()) != 0) {
            fail("--force: cannot move %s/%s into %s: %s", dir.c_str(), name.c_str(), aside.c_str(), strerror(errno));
        }
    }
    return aside;
}

// Opens DIR/main.log (creating DIR): a new run refuses a DIR that holds another run (a main.log or
// a completed checkpoint) unless `force`, which sets that run's files aside (log_set_aside, saying
// where) and starts the log afresh; a -y 1 run (`resume`) appends, whether it resumes or starts
// from scratch where no checkpoint was completed.
static inline FILE* log_open(const std::string& dir, bool resume, bool force) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        fail("flag -o: cannot create directory %s: %s", dir.c_str(), strerror(errno));
    }
    std::string path = dir + "/main.log";
    if (!resume && !force && (file_exists(path.c_str()) || checkpoint_ever_completed(dir))) {
        fail("flag -o: %s already holds a run; resume it with -y 1, or pass --force to start over", dir.c_str());
    }
    if (!resume && force) {
        std::string aside = log_set_aside(dir);
        if (!aside.empty()) { printf("--force: the run that was in %s moved to %s\n", dir.c_str(), aside.c_str()); }
    }
    return fopen_or_fail(path.c_str(), resume ? "a" : "w");
}

// Writes one line to log (nothing if log is nullptr) and flushes it.
__attribute__((format(printf, 2, 3))) static inline void log_line(FILE* log, const char* fmt, ...) {
    if (log == nullptr) { return; }
    va_list args;
    va_start(args, fmt);
    vfprintf(log, fmt, args);
    va_end(args);
    fflush(log);
}

// The run's record: main.log and the TensorBoard events.
struct RunLog {
    FILE* file = nullptr;  // main.log, or nullptr
    TensorBoard events;    // closed: --tensorboard 0, or its file could not be written
};

// log_open's main.log in dir and, with `tensorboard`, a new event file beside it. A new run's
// events start a session at step 0.
static inline RunLog run_log_open(const std::string& dir, bool resume, bool force, bool tensorboard) {
    RunLog log;
    log.file = log_open(dir, resume, force);
    if (tensorboard && tensorboard_open(&log.events, dir) && !resume) { tensorboard_session_start(&log.events, 0); }
    return log;
}

static inline void run_log_close(RunLog* log) {
    if (log->file != nullptr) { fclose(log->file); }
    log->file = nullptr;
    tensorboard_close(&log->events);
}

// What a step reports: its numbers and its speed.
struct StepLine {
    int step;
    float loss, lr, grad_norm;
    double ms, tokens_per_second, mfu_percent;
};

static inline void log_step(RunLog* log, const StepLine& s) {
    log_line(log->file, "s:%d trl:%.6f lr:%.6e norm:%.6f ms:%.3f tok/s:%.0f mfu:%.2f\n", s.step, s.loss, s.lr,
             s.grad_norm, s.ms, s.tokens_per_second, s.mfu_percent);
    tensorboard_scalars(&log->events, s.step,
                        {{"train/loss", s.loss}, {"train/lr", s.lr}, {"train/grad_norm", s.grad_norm},
                         {"perf/step_ms", (float)s.ms}, {"perf/tok_per_s", (float)s.tokens_per_second},
                         {"perf/mfu_percent", (float)s.mfu_percent}});
}

static inline void log_val_loss(RunLog* log, int step, float loss) {
    log_line(log->file, "s:%d tel:%.6f\n", step, loss);
    tensorboard_scalars(&log->events, step, {{"val/loss", loss}});
}

static inline void log_eval(RunLog* log, int step, double accuracy) {
    log_line(log->file, "s:%d eval:%.4f\n", step, accuracy);
    tensorboard_scalars(&log->events, step, {{"eval/accuracy", (float)accuracy}});
}

// why: "non-finite loss", "norm spike (z 7.1 > 6)", ...; skipped: the updates skipped so far in the
// run, this one included.
static inline void log_skipped(RunLog* log, int step, const char* why, int skipped) {
    log_line(log->file, "s:%d skipped: %s\n", step, why);
    tensorboard_scalars(&log->events, step, {{"train/skipped_updates", (float)skipped}});
}

// The x axis of curves in tokens (scripts/plot.py), written by each process at its start.
static inline void log_tokens_per_step(RunLog* log, int64_t tokens) {
    log_line(log->file, "# tokens per step: %lld\n", (long long)tokens);
}

// A resume from the checkpoint of `step`, whose first line is s:step: TensorBoard drops what the
// processes before logged at `step` or later. (A stopped run's validation, evaluation and sample
// at its last step go too where they are off the -v, --eval-every, -s schedule: main.log keeps them.)
static inline void log_resumed(RunLog* log, int step, int gpus) {
    log_line(log->file, "# resumed at step %d on %d GPUs\n", step, gpus);
    tensorboard_session_start(&log->events, step);
}

// -y 1 in a folder with no checkpoint yet (a run stopped before its first): the steps logged
// before this line are superseded by those after it.
static inline void log_restarted(RunLog* log) {
    log_line(log->file, "# no checkpoint to resume from: started from scratch\n");
    tensorboard_session_start(&log->events, 0);
}

// A checkpoint's stall: how long the GPU waited for it (the copy to host memory, any wait for the
// previous write, and the write itself when synchronous).
static inline void log_checkpoint_stall(RunLog* log, int step, double stall_ms) {
    log_line(log->file, "# checkpoint at step %d: the GPU stalled %.1f ms\n", step, stall_ms);
    tensorboard_scalars(&log->events, step, {{"perf/checkpoint_stall_ms", (float)stall_ms}});
}

// A checkpoint's files written and `latest` moved, in `seconds` (in the background, or synchronously).
static inline void log_checkpoint_written(RunLog* log, int step, double seconds, bool background) {
    log_line(log->file, "# checkpoint at step %d: written in %.2f s%s\n", step, seconds,
             background ? " in the background" : "");
}

// Text as a Markdown code block (each line indented by 4 spaces), which TensorBoard's text
// dashboard shows as written.
static inline std::string markdown_code_block(const std::string& text) {
    std::string block = "    ";
    for (char c : text) {
        block += c;
        if (c == '\n') { block += "    "; }
    }
    return block;
}

// The configuration table, at the step the process starts from (TensorBoard only).
static inline void log_config(RunLog* log, int step, const std::string& table) {
    tensorboard_text(&log->events, "config", step, markdown_code_block(table));
}

// A training sample's text (TensorBoard only).
static inline void log_sample(RunLog* log, int step, const std::string& text) {
    tensorboard_text(&log->events, "samples", step, markdown_code_block(text));
}
