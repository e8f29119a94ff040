// libFuzzer target for the token shard readers of llmc/dataloader.h (dl_shard_token_count,
// dl_read_shard): each input is a whole shard file. A rejected input must fail with FailError
// (built with -DFAIL_THROWS), never crash, allocate for a size the file does not hold, leak or
// trip a sanitizer; what they accept must hold together (checked below; a violation traps).
// Build and run from the repo root (seeds in dev/test/fuzz/shard/):
//   clang++ -g -O1 -std=c++17 -I. -DFAIL_THROWS -fsanitize=fuzzer,address,undefined dev/test/fuzz_shard.cpp -o build/fuzz_shard
//   build/fuzz_shard -max_total_time=30 -max_len=4096 dev/test/fuzz/shard/
#include <stddef.h>
#include <stdint.h>

#include "dev/test/fuzz_input.h"
#include "llmc/dataloader.h"

constexpr uint32_t GPT2_VOCAB = 50257;

// An accepted shard is the header plus its tokens exactly, each a valid id.
static void check_tokens(const std::vector<uint16_t>& tokens, int64_t count, size_t size) {
    if ((int64_t)tokens.size() != count || DATALOADER_HEADER_BYTES + 2 * (size_t)count != size) { __builtin_trap(); }
    for (uint16_t id : tokens) {
        if (id >= GPT2_VOCAB) { __builtin_trap(); }
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_path(data, size);
    try {
        int64_t count = dl_shard_token_count(path);
        std::vector<uint16_t> tokens;
        dl_read_shard(path, GPT2_VOCAB, &tokens);
        check_tokens(tokens, count, size);
    } catch (const FailError&) {
    }
    return 0;
}
