// Tokenizer speed on one core: tiny Shakespeare repeated to over 10 MB, and the varied
// exactness test text. "cold" encodes on a fresh thread (empty BPE memo), "warm" on a
// thread that has just encoded the same text. Each figure is the best of a few runs.
// Run from the repo root: build/bench_tokenizer
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dev/test/files.h"
#include "llmc/tokenizer.h"

constexpr const char* ENCODER_PATH = "dev/data/gpt2_encoder.json";
constexpr int RUNS = 5;


// Seconds to encode `text` once, appending to a fresh vector.
static double time_encode(const Tokenizer* tok, const std::string& text, size_t* num_tokens) {
    std::vector<uint32_t> ids;
    auto start = std::chrono::steady_clock::now();
    tokenizer_encode(tok, text.data(), text.size(), &ids);
    auto stop = std::chrono::steady_clock::now();
    *num_tokens = ids.size();
    return std::chrono::duration<double>(stop - start).count();
}

static void bench(const Tokenizer* tok, const char* name, const std::string& text) {
    double best_cold = 1e30, best_warm = 1e30;
    size_t num_tokens = 0;
    for (int run = 0; run < RUNS; run++) {
        // a new thread starts with an empty memo
        std::thread cold([&] { best_cold = std::min(best_cold, time_encode(tok, text, &num_tokens)); });
        cold.join();
    }
    std::thread warm([&] {
        time_encode(tok, text, &num_tokens);
        for (int run = 0; run < RUNS; run++) { best_warm = std::min(best_warm, time_encode(tok, text, &num_tokens)); }
    });
    warm.join();
    double mb = text.size() / 1e6;
    printf("%-28s %7.2f MB %9zu tokens   cold %6.1f MB/s   warm %6.1f MB/s\n", name, mb, num_tokens,
           mb / best_cold, mb / best_warm);
}

int main() {
    Tokenizer tok;
    tokenizer_init(&tok, ENCODER_PATH);
    std::string shakespeare = read_file("dev/data/tiny_shakespeare.txt");
    std::string repeated;
    while (repeated.size() < 10 * 1000 * 1000) { repeated += shakespeare; }
    bench(&tok, "tiny_shakespeare (repeated)", repeated);
    bench(&tok, "tokenizer_text (varied)", read_file("dev/test/vectors/tokenizer_text.txt"));
    tokenizer_free(&tok);
    return 0;
}
