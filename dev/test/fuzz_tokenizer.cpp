// libFuzzer target for the tokenizer loader of llmc/tokenizer.h (tokenizer_init: the classic
// .bin and encoder.json): each input is a whole vocabulary file. A rejected input must fail with
// FailError (built with -DFAIL_THROWS), never crash, allocate for a size the file does not hold,
// leak or trip a sanitizer. A vocabulary it accepts must encode text (here the input itself, as
// bytes) into ids that decode back to that text, and merge each short piece of it the same way
// by both BPE methods (linear and heap); a violation traps.
// Build and run from the repo root (seeds in dev/test/fuzz/tokenizer/):
//   clang++ -g -O1 -std=c++17 -I. -DFAIL_THROWS -fsanitize=fuzzer,address,undefined dev/test/fuzz_tokenizer.cpp -o build/fuzz_tokenizer
//   build/fuzz_tokenizer -max_total_time=30 -max_len=16384 -dict=dev/test/fuzz/tokenizer.dict dev/test/fuzz/tokenizer/
#include <stddef.h>
#include <stdint.h>

#include "dev/test/fuzz_input.h"
#include "llmc/tokenizer.h"

static void check_round_trip(const Tokenizer& tok, const uint8_t* text, size_t size) {
    std::vector<uint32_t> ids;
    tokenizer_encode(&tok, (const char*)text, size, &ids);
    std::string decoded;
    tokenizer_decode_append(&tok, ids.data(), ids.size(), &decoded);
    if (decoded.size() != size || memcmp(decoded.data(), text, size) != 0) { __builtin_trap(); }
    for (uint32_t id : ids) {
        if (id == tok.eot_token) { __builtin_trap(); }  // never produced by encoding
    }
}

static void check_merges_agree(const Tokenizer& tok, const uint8_t* text, size_t size) {
    for (size_t pos = 0; pos < size;) {
        size_t end = piece_end(char_class_table(), text, pos, size);
        if (end - pos <= LINEAR_BPE_MAX_LEN) {
            std::vector<uint32_t> linear, heap;
            bpe_merge_linear(&tok, text + pos, end - pos, &linear);
            bpe_merge_heap(&tok, text + pos, end - pos, &heap);
            if (linear != heap) { __builtin_trap(); }
        }
        pos = end;
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_path(data, size);
    try {
        Tokenizer tok;
        tokenizer_init(&tok, path);
        check_round_trip(tok, data, size);
        check_merges_agree(tok, data, size);
    } catch (const FailError&) {
    }
    return 0;
}
