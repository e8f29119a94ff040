// libFuzzer target for the run-state reader of llmc/state_file.h (state_file_load): each input is a
// whole state file, read as step 12's of a model of 64 parameters, once whole and once as the slice
// [13, 41) in chunks of 5 floats. The reader must never fail() (that would throw here, built with
// -DFAIL_THROWS), crash, allocate for a size the file does not hold, leak or trip a sanitizer; both
// reads must agree, a refusal is one line naming the file, and an accepted file is exactly the
// header and the moments, all finite, with a window and an Adam step the writer can make (checked
// below; a violation traps).
// Build and run from the repo root (seeds in dev/test/fuzz/state_file/, made by test_state_file):
//   clang++ -g -O1 -std=c++17 -I. -DFAIL_THROWS -fsanitize=fuzzer,address,undefined dev/test/fuzz_state_file.cpp -o build/fuzz_state_file
//   build/fuzz_state_file -max_total_time=30 -max_len=4096 dev/test/fuzz/state_file/
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "dev/test/fuzz_input.h"
#include "llmc/state_file.h"

constexpr int STEP = 12;
constexpr size_t PARAMETERS = 64, BEGIN = 13, END = 41, CHUNK = 5;

static void check_refusal(const std::string& problem, const char* path) {
    if (problem.compare(0, strlen(path), path) != 0 || problem.find('\n') != std::string::npos) { __builtin_trap(); }
}

static void check_accepted(const RunState& whole, const RunState& slice, size_t size) {
    if (size != STATE_HEADER_BYTES + 8 * PARAMETERS || whole.step != STEP) { __builtin_trap(); }
    if (whole.adam_step < 0 || whole.adam_step > STEP || !outlier_valid(&whole.recent_norms)) { __builtin_trap(); }
    if (whole.m.size() != PARAMETERS || whole.v.size() != PARAMETERS) { __builtin_trap(); }
    for (size_t i = 0; i < PARAMETERS; i++) {
        if (!isfinite(whole.m[i]) || !isfinite(whole.v[i])) { __builtin_trap(); }
    }
    std::vector<float> m(whole.m.begin() + BEGIN, whole.m.begin() + END);
    std::vector<float> v(whole.v.begin() + BEGIN, whole.v.begin() + END);
    if (slice.m != m || slice.v != v || memcmp(&slice.shape, &whole.shape, sizeof(RunShape)) != 0) { __builtin_trap(); }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_path(data, size);
    RunState whole, slice;
    std::string problem, slice_problem;
    bool accepted = state_file_load(path, STEP, PARAMETERS, 0, PARAMETERS, &whole, &problem);
    bool slice_accepted = state_file_load(path, STEP, PARAMETERS, BEGIN, END, &slice, &slice_problem, CHUNK);
    if (accepted != slice_accepted || problem != slice_problem) { __builtin_trap(); }
    if (accepted) {
        check_accepted(whole, slice, size);
    } else {
        check_refusal(problem, path);
    }
    return 0;
}
