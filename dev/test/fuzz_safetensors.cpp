// libFuzzer target for llmc/safetensors.h and llmc/json.h: each input is parsed as a whole
// safetensors file (its header) and as a JSON text. Neither may crash, exit, leak or trip a
// sanitizer; what they accept must hold together (checked below; a violation traps).
// Build and run from the repo root (seeds in dev/test/fuzz/safetensors/):
//   clang++ -g -O1 -std=c++17 -I. -fsanitize=fuzzer,address,undefined dev/test/fuzz_safetensors.cpp -o build/fuzz_safetensors
//   build/fuzz_safetensors -max_total_time=30 -max_len=4096 dev/test/fuzz/safetensors/
#include <stddef.h>
#include <stdint.h>

#include "llmc/safetensors.h"

// A parsed file's tensors must tile the data section exactly, each sized by dtype and shape.
static void check_layout(const SafeFile& file, size_t size) {
    uint64_t total = 0;
    for (const SafeTensor& t : file.tensors) {
        if (t.end < t.begin || t.end - t.begin != safetensors_numel(&t) * safetensors_dtype_size(t.dtype)) { __builtin_trap(); }
        total += t.end - t.begin;
    }
    if (file.data_offset > size || file.data_offset + total != size || file.file_size != size) { __builtin_trap(); }
}

// A parsed string must come back unchanged through json_quote and json_parse.
static void check_string_round_trip(const JsonValue& value) {
    if (value.type != JSON_STRING) { return; }
    std::string quoted = json_quote(value.string);
    JsonValue again;
    if (!json_parse(quoted.data(), quoted.size(), &again, nullptr, 0) || again.string != value.string) { __builtin_trap(); }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    SafeFile file;
    char error[256];
    if (safetensors_parse_header(data, size, size, &file, error, sizeof(error))) { check_layout(file, size); }
    JsonValue value;
    if (json_parse((const char*)data, size, &value, error, sizeof(error))) {
        check_string_round_trip(value);
        for (const JsonValue& item : value.items) { check_string_round_trip(item); }
        for (const std::string& key : value.keys) {
            JsonValue as_string;
            as_string.type = JSON_STRING;
            as_string.string = key;
            check_string_round_trip(as_string);
        }
    }
    return 0;
}
