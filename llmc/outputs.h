// A tool's outputs never destroy what the user had: an existing file is replaced only with --force,
// and never when it is one of the tool's inputs (the same file however named: through `..`,
// symbolic links or hard links), whatever the flags. Check every output before writing any.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "llmc/utils.h"

// Whether both paths exist and are the same file.
static inline bool same_file(const std::string& a, const std::string& b) {
    std::error_code ec;
    return std::filesystem::equivalent(a, b, ec) && !ec;
}

// Whether `output` may be written: false with the one-line *problem naming it if it is one of
// `inputs`, or if it exists and `force` is off.
static inline bool output_allowed(const std::string& output, const std::vector<std::string>& inputs, bool force,
                                  std::string* problem) {
    for (const std::string& input : inputs) {
        if (same_file(output, input)) {
            return set_problem(problem, "%s is the input %s: choose another output", output.c_str(), input.c_str());
        }
    }
    if (!force && file_exists(output.c_str())) {
        return set_problem(problem, "%s already exists (use --force to overwrite)", output.c_str());
    }
    return true;
}

// Fails with the first output that may not be written.
static inline void outputs_allowed_or_fail(const std::vector<std::string>& outputs,
                                           const std::vector<std::string>& inputs, bool force) {
    std::string problem;
    for (const std::string& output : outputs) {
        if (!output_allowed(output, inputs, force, &problem)) { fail("%s", problem.c_str()); }
    }
}
