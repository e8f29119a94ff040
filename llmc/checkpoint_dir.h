// The checkpoint folder's rules: DIR/model_%08d.bin (the classic model file) and DIR/state_%08d.bin
// (the run state, llmc/state_file.h) of each step checkpointed, and DIR/latest, the step of the
// newest pair as text, written only once both of its files are complete. Only these names count:
// a file named otherwise is not a checkpoint. A resume tries the pairs at or before `latest`,
// newest first; pruning keeps the newest K intact pairs of those and deletes every other checkpoint
// file (those above `latest` a killed writer's, which no resume reads). A folder whose `latest`
// was never written holds no checkpoint (a run killed before its first completed): -y 1 starts
// from scratch.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

// The step of a file's name as checkpoint_path writes it, "KIND_%08d.bin" (KIND "model" or
// "state"), or -1 for any other name: "model_000000300.bin" is not step 300's file, and pruning by
// it would delete the real one.
static inline int checkpoint_step_of(const std::string& name, const char* kind = "model") {
    size_t prefix = strlen(kind) + 1;  // "KIND_"
    size_t digits = name.size() >= prefix + 4 ? name.size() - prefix - 4 : 0;
    if (digits < 8 || digits > 10 || name.compare(0, prefix, std::string(kind) + "_") != 0 ||
        strspn(name.c_str() + prefix, "0123456789") != digits) {
        return -1;
    }
    long long step = atoll(name.c_str() + prefix);
    bool canonical = step <= INT32_MAX && checkpoint_path("", kind, (int)step) == "/" + name;
    return canonical ? (int)step : -1;
}

// The steps of dir's checkpoint files of each kind, oldest first, from one scan (none if dir does
// not exist).
struct CheckpointFiles {
    std::vector<int> model, state;
};

static inline CheckpointFiles checkpoint_scan(const std::string& dir) {
    CheckpointFiles files;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        std::string name = entry.path().filename().string();
        int model = checkpoint_step_of(name, "model"), state = checkpoint_step_of(name, "state");
        if (model >= 0) { files.model.push_back(model); }
        if (state >= 0) { files.state.push_back(state); }
    }
    std::sort(files.model.begin(), files.model.end());
    std::sort(files.state.begin(), files.state.end());
    return files;
}

// The steps of dir's model files, oldest first.
static inline std::vector<int> checkpoint_steps(const std::string& dir) { return checkpoint_scan(dir).model; }

// The steps a resume tries, in order: each model file's at or before `latest`, newest first.
static inline std::vector<int> checkpoint_resume_order(const std::string& dir, int latest) {
    std::vector<int> steps = checkpoint_steps(dir);
    steps.erase(std::remove_if(steps.begin(), steps.end(), [latest](int step) { return step > latest; }), steps.end());
    std::reverse(steps.begin(), steps.end());
    return steps;
}

// Keeps the newest `keep` pairs (model and state file both there) at or below `latest`, the step
// its caller just named in DIR/latest; every other checkpoint file goes: older steps, a model or
// state file without its partner (a pair with one file gone is no checkpoint), and files above
// `latest`, left by a writer killed before it named them. Counting those would keep an orphan and
// delete the pair that `latest` names, and the next -y 1 would find no intact checkpoint.
static inline void checkpoint_prune(const std::string& dir, int latest, int keep) {
    CheckpointFiles files = checkpoint_scan(dir);
    std::vector<int> kept;
    for (auto step = files.model.rbegin(); step != files.model.rend() && (int)kept.size() < keep; ++step) {
        bool paired = std::binary_search(files.state.begin(), files.state.end(), *step);
        if (*step <= latest && paired) { kept.push_back(*step); }
    }
    auto remove_unkept = [&](const char* kind, const std::vector<int>& steps) {
        for (int step : steps) {
            bool unkept = std::find(kept.begin(), kept.end(), step) == kept.end();
            if (unkept) { remove(checkpoint_path(dir, kind, step).c_str()); }
        }
    };
    remove_unkept("model", files.model);
    remove_unkept("state", files.state);
}
