// CPU tests of llmc/fingerprint.h: FNV-1a against its published test vectors, in bytes and in
// 32-bit words (the weights checksum's units), streaming, and the run fingerprint changing with each
// thing it covers (a flag, the model's shape, a shard's path or size, the start step).
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/fingerprint.h"

TEST(fnv1a_test_vectors) {
    CHECK(fnv1a_bytes(FNV1A_OFFSET, "", 0) == 0xcbf29ce484222325ull);
    CHECK(fnv1a_bytes(FNV1A_OFFSET, "a", 1) == 0xaf63dc4c8601ec8cull);
    CHECK(fnv1a_bytes(FNV1A_OFFSET, "foobar", 6) == 0x85944171f73967e8ull);
}

TEST(fnv1a_streams) {
    uint64_t whole = fnv1a_bytes(FNV1A_OFFSET, "foobar", 6);
    CHECK(fnv1a_bytes(fnv1a_bytes(FNV1A_OFFSET, "foo", 3), "bar", 3) == whole);
}

// A 32-bit word is one unit: words below 256 hash as the bytes of the same values.
TEST(fnv1a_words) {
    const uint32_t words[3] = {'f', 'o', 'o'};
    CHECK(fnv1a(FNV1A_OFFSET, words, 3) == fnv1a_bytes(FNV1A_OFFSET, "foo", 3));
    const uint32_t one = 0x3f800000;  // 1.0f: a word, not its four bytes
    CHECK(fnv1a(FNV1A_OFFSET, &one, 1) != fnv1a_bytes(FNV1A_OFFSET, &one, 4));
    CHECK(fnv1a(FNV1A_OFFSET, &one, 1) == ((FNV1A_OFFSET ^ one) * FNV1A_PRIME));
}

static DataLoader loader_of(std::vector<std::string> paths, std::vector<int64_t> tokens) {
    DataLoader loader{};
    loader.shard_paths = paths;
    loader.shard_tokens = tokens;
    return loader;
}

TEST(run_fingerprint_covers_each_part) {
    RunShape shape = {};
    shape.B = 4;
    ModelShape model = {.max_seq_len = 1024, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = 12,
                        .num_heads = 12, .channels = 768, .attention = ATTENTION_SOFTMAX};
    DataLoader train = loader_of({"a.bin", "b.bin"}, {1000, 2000}), val = loader_of({"v.bin"}, {500});
    uint64_t base = run_fingerprint(&shape, &model, &train, &val, -1);
    CHECK(run_fingerprint(&shape, &model, &train, &val, -1) == base);
    CHECK(run_fingerprint(&shape, &model, &train, &val, 10) != base);
    RunShape other_shape = shape;
    other_shape.lr = 1e-3f;
    CHECK(run_fingerprint(&other_shape, &model, &train, &val, -1) != base);
    ModelShape other_model = model;
    other_model.num_layers = 24;
    CHECK(run_fingerprint(&shape, &other_model, &train, &val, -1) != base);
    DataLoader renamed = loader_of({"a.bin", "c.bin"}, {1000, 2000}), resized = loader_of({"a.bin", "b.bin"}, {1000, 2001});
    CHECK(run_fingerprint(&shape, &model, &renamed, &val, -1) != base);
    CHECK(run_fingerprint(&shape, &model, &resized, &val, -1) != base);
    CHECK(run_fingerprint(&shape, &model, &val, &train, -1) != base);  // the splits swapped
}

TEST_MAIN()
