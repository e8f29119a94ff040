// The checkpoint folder's rules: DIR/model_%08d.bin (the classic model file) and DIR/state_%08d.bin
// (the run state, llmc/state_file.h) of each step checkpointed, and DIR/latest, the step of the
// newest pair as text, written only once both of its files are complete. A resume tries the pairs at
// or before `latest`, newest first; pruning keeps the newest K of those and deletes the files above
// `latest` (a killed writer's, which no resume reads). A folder whose `latest` was never
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

// The step of a file's name "KIND_%08d.bin" (KIND "model" or "state"), or -1 for any other name.
static inline int checkpoint_step_of(const std::string& name, const char* kind = "model") {
    size_t prefix = strlen(kind) + 1;  // "KIND_"
    const char* digits = name.c_str() + prefix;
    bool match = name.size() >= prefix + 8 + 4 && name.compare(0, prefix - 1, kind) == 0 && name[prefix - 1] == '_' &&
                 name.compare(name.size() - 4, 4, ".bin") == 0 && strspn(digits, "0123456789") == name.size() - prefix - 4;
    return match ? atoi(digits) : -1;
}

// The steps of dir's KIND files, oldest first (none if dir does not exist).
static inline std::vector<int> checkpoint_steps(const std::string& dir, const char* kind = "model") {
    std::vector<int> steps;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        int step = checkpoint_step_of(entry.path().filename().string(), kind);
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

// Keeps the newest `keep` checkpoints at or below `latest` (call it once `latest` names the pair just
// written): the model and state files of older steps go, and so do those above `latest`, left by a
// writer killed before it named them. Counting those would keep an orphan and delete the pair that
// `latest` names, and the next -y 1 would find no intact checkpoint.
static inline void checkpoint_prune(const std::string& dir, int keep) {
    int latest = checkpoint_read_latest(dir);
    for (const char* kind : {"model", "state"}) {
        std::vector<int> steps = checkpoint_steps(dir, kind);
        int kept = 0;
        for (auto step = steps.rbegin(); step != steps.rend(); ++step) {
            bool keep_it = *step <= latest && kept < keep;
            kept += keep_it ? 1 : 0;
            if (!keep_it) { remove(checkpoint_path(dir, kind, *step).c_str()); }
        }
    }
}
