// main.log, the run's record for plots (scripts/plot.py): log_open's rule for which folder may
// hold it, then one writer per kind of line, each flushed as written so that a killed run keeps
// what it logged. The writers take the log or nullptr (other ranks, or no -o) and then write nothing.
//   s:STEP trl:LOSS lr:LR norm:NORM ms:MS tok/s:TOKS mfu:PERCENT   a training step
//   s:STEP tel:LOSS                                              a validation loss
//   s:STEP eval:ACCURACY                                         a multiple-choice evaluation
//   s:STEP skipped: WHY                                          an update the guards skipped
//   # ...                                                        a comment: a resume, a restart
// A step logged again after a resume or a restart supersedes its earlier line.
#pragma once

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <string>

#include "llmc/checkpoint_dir.h"
#include "llmc/utils.h"

// Opens DIR/main.log (creating DIR): a new run refuses a DIR that holds another run (a main.log or
// a completed checkpoint) unless `force`, and starts the log afresh; a -y 1 run (`resume`) appends,
// whether it resumes or starts from scratch where no checkpoint was completed.
static inline FILE* log_open(const std::string& dir, bool resume, bool force) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        fail("flag -o: cannot create directory %s: %s", dir.c_str(), strerror(errno));
    }
    std::string path = dir + "/main.log";
    if (!resume && !force && (file_exists(path.c_str()) || checkpoint_ever_completed(dir))) {
        fail("flag -o: %s already holds a run; resume it with -y 1, or pass --force to start over", dir.c_str());
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

// What a step reports: its numbers and its speed.
struct StepLine {
    int step;
    float loss, lr, grad_norm;
    double ms, tokens_per_second, mfu_percent;
};

static inline void log_step(FILE* log, const StepLine& s) {
    log_line(log, "s:%d trl:%.6f lr:%.6e norm:%.6f ms:%.3f tok/s:%.0f mfu:%.2f\n", s.step, s.loss, s.lr, s.grad_norm,
             s.ms, s.tokens_per_second, s.mfu_percent);
}

static inline void log_val_loss(FILE* log, int step, float loss) { log_line(log, "s:%d tel:%.6f\n", step, loss); }

static inline void log_eval(FILE* log, int step, double accuracy) { log_line(log, "s:%d eval:%.4f\n", step, accuracy); }

// why: "non-finite loss", "norm spike (z 7.1 > 6)", ...
static inline void log_skipped(FILE* log, int step, const char* why) { log_line(log, "s:%d skipped: %s\n", step, why); }

static inline void log_resumed(FILE* log, int step, int gpus) {
    log_line(log, "# resumed at step %d on %d GPUs\n", step, gpus);
}

// -y 1 in a folder with no checkpoint yet (a run stopped before its first): the steps logged
// before this line are superseded by those after it.
static inline void log_restarted(FILE* log) { log_line(log, "# no checkpoint to resume from: started from scratch\n"); }
