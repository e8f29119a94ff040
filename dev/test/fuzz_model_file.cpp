// libFuzzer target for the model file reader of llmc/model_file.h (model_file_read): each input
// is a whole model file. A rejected input must fail with FailError (built with -DFAIL_THROWS),
// never crash, allocate for a size the file does not hold, leak or trip a sanitizer; a file it
// accepts must be exactly the header and the parameters of a valid shape, counted without
// overflow, all finite (checked below; a violation traps).
// Build and run from the repo root (seeds in dev/test/fuzz/model_file/):
//   clang++ -g -O1 -std=c++17 -I. -DFAIL_THROWS -fsanitize=fuzzer,address,undefined dev/test/fuzz_model_file.cpp -o build/fuzz_model_file
//   build/fuzz_model_file -max_total_time=30 -max_len=4096 dev/test/fuzz/model_file/
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "dev/test/fuzz_input.h"
#include "llmc/model_file.h"

// The parameter count of a shape in exact (128-bit) arithmetic.
static unsigned __int128 exact_parameters(const ModelShape& s) {
    unsigned __int128 Vp = (uint32_t)s.padded_vocab_size, C = (uint32_t)s.channels, L = (uint32_t)s.num_layers;
    unsigned __int128 T = (uint32_t)s.max_seq_len;
    return Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
}

static void check_accepted(const ModelShape& shape, const std::vector<float>& params, size_t size) {
    if (!model_shape_problem(&shape).empty()) { __builtin_trap(); }
    if (exact_parameters(shape) != params.size() || 1024 + 4 * params.size() != size) { __builtin_trap(); }
    for (float value : params) {
        if (!isfinite(value)) { __builtin_trap(); }
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_path(data, size);
    try {
        ModelShape shape;
        std::vector<float> params;
        model_file_read(path, &shape, &params);
        check_accepted(shape, params, size);
    } catch (const FailError&) {
    }
    return 0;
}
