// The checkpoint folder's rules: DIR/model_%08d.bin (the classic model file) and DIR/state_%08d.bin
// (the run state, llmc/state_file.h) of each step checkpointed, and DIR/latest, the step of the
// newest pair as text, written only once both of its files are complete. A resume tries the pairs at
// or before `latest`, newest first; pruning keeps the newest K. A folder whose `latest` was never
// written holds no checkpoint (a run killed before its first completed): -y 1 starts from scratch.
#pragma once

#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/utils.h"

// DIR/KIND_%08d.bin, KIND "model" or "state".
static inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/%s_%08d.bin", kind, step);
    return dir + name;
}

static inline std::string checkpoint_latest_path(const std::string& dir) { return dir + "/latest"; }

// Names `step` in DIR/latest, atomically: call once both of its files are complete.
static inline void checkpoint_write_latest(const std::string& dir, int step) {
    std::string text = std::to_string(step) + "\n";
    AtomicFile out;
    open_atomic(&out, checkpoint_latest_path(dir).c_str());
    atomic_write_or_fail(&out, text.data(), 1, text.size());
    commit_atomic(&out);
}

// Whether a checkpoint in dir was ever complete: -y 1 resumes from one, else starts from scratch.
static inline bool checkpoint_ever_completed(const std::string& dir) {
    return file_exists(checkpoint_latest_path(dir).c_str());
}

// The step DIR/latest names; fails naming the file if it holds none.
static inline int checkpoint_read_latest(const std::string& dir) {
    std::string path = checkpoint_latest_path(dir);
    FILE* file = fopen_or_fail(path.c_str(), "r");
    int step = -1;
    bool read = fscanf(file, "%d", &step) == 1 && step >= 0;
    fclose(file);
    if (!read) { fail("%s: does not hold a step number", path.c_str()); }
    return step;
}

// The step of a model file's name "model_%08d.bin", or -1 for any other name.
static inline int checkpoint_step_of(const std::string& name) {
    const char* digits = name.c_str() + strlen("model_");
    size_t count = name.size() - strlen("model_.bin");
    bool model = name.size() >= strlen("model_00000000.bin") && name.compare(0, 6, "model_") == 0 &&
                 name.compare(name.size() - 4, 4, ".bin") == 0 && strspn(digits, "0123456789") == count;
    return model ? atoi(digits) : -1;
}

// The steps of dir's model files, oldest first (none if dir does not exist).
static inline std::vector<int> checkpoint_steps(const std::string& dir) {
    std::vector<int> steps;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        int step = checkpoint_step_of(entry.path().filename().string());
        if (step >= 0) { steps.push_back(step); }
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

// The steps a resume tries, in order: each model file's at or before `latest`, newest first.
static inline std::vector<int> checkpoint_resume_order(const std::string& dir, int latest) {
    std::vector<int> steps = checkpoint_steps(dir);
    steps.erase(std::remove_if(steps.begin(), steps.end(), [latest](int step) { return step > latest; }), steps.end());
    std::reverse(steps.begin(), steps.end());
    return steps;
}

// Deletes all but the newest `keep` checkpoints in dir, model and state files.
static inline void checkpoint_prune(const std::string& dir, int keep) {
    std::vector<int> steps = checkpoint_steps(dir);
    for (size_t i = 0; i + keep < steps.size(); i++) {
        remove(checkpoint_path(dir, "model", steps[i]).c_str());
        remove(checkpoint_path(dir, "state", steps[i]).c_str());
    }
}
