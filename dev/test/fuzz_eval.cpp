// libFuzzer target for llmc/eval.h (eval_load, eval_plan): each input is a whole evaluation file,
// loaded with GPT-2's tokenizer at two vocabulary sizes and sequence lengths, then planned for a
// few forward-pass sizes and numbers of ranks. Nothing may crash, exit, leak or trip a sanitizer;
// a refusal must be one line naming the file; what loads must hold together and plan into
// batches that score every ending exactly once (checked below; a violation traps).
// Build and run from the repo root (seeds in dev/test/fuzz/eval/):
//   clang++ -g -O1 -std=c++17 -I. -DFAIL_THROWS -fsanitize=fuzzer,address,undefined dev/test/fuzz_eval.cpp -o build/fuzz_eval
//   build/fuzz_eval -max_total_time=30 -max_len=4096 -dict=dev/test/fuzz/eval.dict dev/test/fuzz/eval/
#include <stddef.h>
#include <stdint.h>

#include "dev/test/fuzz_input.h"
#include "llmc/eval.h"

static const Tokenizer& gpt2() {
    static const Tokenizer tok = [] {
        Tokenizer loaded;
        tokenizer_init(&loaded, "dev/data/gpt2_encoder.json");
        return loaded;
    }();
    return tok;
}

// Every kept example: a context, ids below the vocabulary, rows that fit T, the context as
// long as the longest row keeps.
static bool ids_below(const std::vector<int>& ids, int vocab_size) {
    return std::all_of(ids.begin(), ids.end(), [&](int id) { return id >= 0 && id < vocab_size; });
}

static void check_set(const EvalSet& set, int vocab_size) {
    for (const EvalExample& ex : set.examples) {
        int longest_kept = 0;
        for (int i = 0; i < EVAL_ENDINGS; i++) {
            if (ex.context_len[i] < 1 || eval_row_length(ex, i) > set.T || !ids_below(ex.endings[i], vocab_size)) { __builtin_trap(); }
            longest_kept = std::max(longest_kept, ex.context_len[i]);
        }
        if (longest_kept != (int)ex.context.size() || !ids_below(ex.context, vocab_size)) { __builtin_trap(); }
        if (ex.label < 0 || ex.label >= EVAL_ENDINGS) { __builtin_trap(); }
    }
}

// The batches of all `world` ranks fit max_tokens and score each ending of each example once,
// at targets that are the ending's tokens.
static void check_plan(const EvalSet& set, size_t max_tokens, int world) {
    std::vector<int> scored(set.examples.size() * EVAL_ENDINGS, 0);
    for (int rank = 0; rank < world; rank++) {
        std::vector<EvalBatch> batches;
        std::string error;
        if (!eval_plan(set, max_tokens, rank, world, &batches, &error)) { __builtin_trap(); }
        for (const EvalBatch& b : batches) {
            if ((size_t)b.rows * b.T > max_tokens || b.T > set.T || (int)b.used.size() != b.rows) { __builtin_trap(); }
            for (int r = 0; r < b.rows; r++) {
                const EvalRow& row = b.used[r];
                const std::vector<int>& ending = set.examples[row.example].endings[row.ending];
                const int* target = &b.targets[(size_t)r * b.T + row.first];
                if (row.first < 0 || row.first + row.count > b.T || !std::equal(ending.begin(), ending.end(), target)) {
                    __builtin_trap();
                }
                scored[row.example * EVAL_ENDINGS + row.ending]++;
            }
        }
    }
    for (int count : scored) {
        if (count != 1) { __builtin_trap(); }
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_path(data, size);
    const int configs[2][2] = {{50257, 64}, {1000, 8}};  // vocabulary size, T
    for (const auto& config : configs) {
        int vocab_size = config[0], T = config[1];
        EvalSet set;
        std::string error;
        if (!eval_load(path, &gpt2(), vocab_size, T, &set, &error)) {
            if (error.compare(0, strlen(path), path) != 0 || error.find('\n') != std::string::npos) { __builtin_trap(); }
            continue;
        }
        check_set(set, vocab_size);
        check_plan(set, EVAL_ENDINGS * T, 1);
        check_plan(set, EVAL_ENDINGS * T + 13, 3);
    }
    return 0;
}
