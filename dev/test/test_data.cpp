// Tests of the data loader (llmc/dataloader.h) and the data preparation tool
// (dev/data/prepare_data.h, ./prepare_data). Run from the repository root, after
// ./prepare_data is built. Every test works in its own temporary directory.
#include <set>

#include "dev/data/prepare_data.h"
#include "dev/test/files.h"
#include "dev/test/sha256.h"
#include "dev/test/testing.h"

constexpr const char* ENCODER_PATH = "dev/data/gpt2_encoder.json";
constexpr const char* TINYSHAKESPEARE_TEXT = "dev/data/tiny_shakespeare.txt";
constexpr uint32_t GPT2_VOCAB = 50257;

// ---------------------------------------------------------------------------------
// Fixtures.

// A file's bytes, or "" if it cannot be read.

// Exit status of a shell command (-1 if it did not exit normally).
static int run_command(const std::string& command) {
    int status = system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static const Tokenizer* gpt2_tokenizer(void) {
    static Tokenizer tokenizer;
    static bool loaded = false;
    if (!loaded) {
        tokenizer_init(&tokenizer, ENCODER_PATH);
        loaded = true;
    }
    return &tokenizer;
}

static PrepareOptions quiet_options(int threads) {
    PrepareOptions options;
    options.threads = threads;
    options.verbose = false;
    return options;
}

// Test shards hold consecutive ids: token i of shard s is s*10000 + i, so a row's first
// input tells which shard and sample it came from.
static uint16_t test_token(int shard, int64_t i) { return (uint16_t)(shard * 10000 + i); }

static void write_test_shard(const std::string& path, int shard, int64_t num_tokens) {
    std::vector<uint16_t> tokens;
    for (int64_t i = 0; i < num_tokens; i++) { tokens.push_back(test_token(shard, i)); }
    write_shard(path, tokens.data(), tokens.size(), true, false);
}

// A shard with a hand-made header, for the corruption tests.
static void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t count,
                            const std::vector<uint16_t>& tokens) {
    int32_t header[DATALOADER_HEADER_INTS] = {magic, version, count};
    std::string bytes((const char*)header, sizeof(header));
    bytes.append((const char*)tokens.data(), tokens.size() * sizeof(uint16_t));
    write_file(path, bytes);
}

// The first input of each row; CHECKs that every row is consecutive ids with targets
// shifted by one.
static std::vector<int32_t> batch_row_starts(const DataLoader* dl) {
    std::vector<int32_t> starts;
    for (int b = 0; b < dl->B; b++) {
        const int32_t* inputs = dl->inputs + b * dl->T;
        const int32_t* targets = dl->targets + b * dl->T;
        bool consecutive = true;
        for (int t = 0; t < dl->T; t++) {
            consecutive = consecutive && inputs[t] == inputs[0] + t && targets[t] == inputs[0] + t + 1;
        }
        CHECK(consecutive);
        starts.push_back(inputs[0]);
    }
    return starts;
}

// The row starts of the next `num_batches` batches, in order.
static std::vector<int32_t> next_row_starts(DataLoader* dl, int64_t num_batches) {
    std::vector<int32_t> all;
    for (int64_t k = 0; k < num_batches; k++) {
        dataloader_next_batch(dl);
        std::vector<int32_t> starts = batch_row_starts(dl);
        all.insert(all.end(), starts.begin(), starts.end());
    }
    return all;
}

// Shards of 12, 8 and 16 samples of T=8: with B*world_size = 4 every sample is used.
static std::string make_three_shards(void) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/shard_1.bin", 1, 8 * 8 + 1);
    write_test_shard(dir + "/shard_0.bin", 0, 12 * 8 + 1);
    write_test_shard(dir + "/shard_2.bin", 2, 16 * 8 + 1);
    return dir;
}

// All (shard, sample start) ids of make_three_shards(), as row starts.
static std::multiset<int32_t> every_sample_of_three_shards(void) {
    std::multiset<int32_t> all;
    int samples[3] = {12, 8, 16};
    for (int s = 0; s < 3; s++) {
        for (int j = 0; j < samples[s]; j++) { all.insert(test_token(s, j * 8)); }
    }
    return all;
}

// ---------------------------------------------------------------------------------
// Data loader: batches.

TEST(loader_batch_contents_and_target_shift) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/only.bin", 0, 100);
    DataLoader dl;
    dataloader_init(&dl, (dir + "/*.bin").c_str(), 2, 8, 0, 1, 1, false, 0, GPT2_VOCAB);
    CHECK(dataloader_batches_per_epoch(&dl) == 6);  // floor(floor(99 / 8) / 2)
    dataloader_next_batch(&dl);
    for (int i = 0; i < 16; i++) {
        CHECK(dl.inputs[i] == i);
        CHECK(dl.targets[i] == i + 1);
    }
    for (int k = 1; k < 6; k++) {
        dataloader_next_batch(&dl);
        std::vector<int32_t> starts = batch_row_starts(&dl);
        CHECK(starts[0] == 16 * k && starts[1] == 16 * k + 8);
    }
    dataloader_free(&dl);
    remove_dir(dir);
}

TEST(loader_reads_shards_in_sorted_order_and_wraps_epochs) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/shard_2.bin", 2, 50);  // 6 samples of T=8
    write_test_shard(dir + "/shard_0.bin", 0, 70);  // 8
    write_test_shard(dir + "/shard_1.bin", 1, 33);  // 4
    DataLoader dl;
    dataloader_init(&dl, (dir + "/shard_*.bin").c_str(), 1, 8, 0, 1, 1, false, 0, GPT2_VOCAB);
    CHECK(dataloader_batches_per_epoch(&dl) == 18);
    std::vector<int32_t> epoch0 = next_row_starts(&dl, 18);
    for (int k = 0; k < 18; k++) {
        int expected_shard = k < 8 ? 0 : k < 12 ? 1 : 2;
        int expected_sample = k < 8 ? k : k < 12 ? k - 8 : k - 12;
        CHECK(epoch0[k] == test_token(expected_shard, expected_sample * 8));
    }
    CHECK(dl.epoch == 1 && dl.shard_index == 0 && dl.batch_index == 0);
    std::vector<int32_t> epoch1 = next_row_starts(&dl, 18);
    CHECK(epoch1 == epoch0);
    CHECK(dl.epoch == 2);
    dataloader_reset(&dl);
    CHECK(next_row_starts(&dl, 3) == std::vector<int32_t>(epoch0.begin(), epoch0.begin() + 3));
    dataloader_free(&dl);
    remove_dir(dir);
}

// Every rank gets the same number of batches, and their samples never overlap.
static void check_rank_sharding(bool shuffle) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/a.bin", 0, 8 * 29 + 5);  // 29 samples: 4 batches of 2 x 3 ranks, 5 unused
    write_test_shard(dir + "/b.bin", 1, 8 * 13 + 1);  // 13 samples: 2 batches, 1 unused
    std::multiset<int32_t> seen;
    for (int rank = 0; rank < 3; rank++) {
        DataLoader dl;
        dataloader_init(&dl, (dir + "/*.bin").c_str(), 2, 8, rank, 3, 1, shuffle, 11, GPT2_VOCAB);
        CHECK(dataloader_batches_per_epoch(&dl) == 6);
        std::vector<int32_t> starts = next_row_starts(&dl, 6);
        seen.insert(starts.begin(), starts.end());
        CHECK(dl.epoch == 1);
        dataloader_free(&dl);
    }
    CHECK(seen.size() == 36);
    CHECK(std::set<int32_t>(seen.begin(), seen.end()).size() == 36);
    if (!shuffle) {  // the identity order uses each shard's first samples
        for (int j = 0; j < 24; j++) { CHECK(seen.count(test_token(0, j * 8)) == 1); }
        for (int j = 0; j < 12; j++) { CHECK(seen.count(test_token(1, j * 8)) == 1); }
    }
    remove_dir(dir);
}

TEST(loader_ranks_take_disjoint_samples) {
    check_rank_sharding(false);
    check_rank_sharding(true);
}

// One process with 3 micro-steps per optimizer step reads, micro-step by micro-step, exactly
// what 3 processes with one micro-step each read rank by rank (shard ends included), and a
// position saved by one split of the micro-batches continues under the other.
TEST(loader_micro_steps_match_ranks) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/a.bin", 0, 8 * 29 + 5);  // 29 samples: 4 batches of 2 x 3 micro-batches, 5 unused
    write_test_shard(dir + "/b.bin", 1, 8 * 13 + 1);  // 13 samples: 2 batches, 1 unused
    std::string pattern = dir + "/*.bin";
    for (bool shuffle : {false, true}) {
        DataLoader one, ranks[3];
        dataloader_init(&one, pattern.c_str(), 2, 8, 0, 1, 3, shuffle, 11, GPT2_VOCAB);
        for (int r = 0; r < 3; r++) { dataloader_init(&ranks[r], pattern.c_str(), 2, 8, r, 3, 1, shuffle, 11, GPT2_VOCAB); }
        CHECK(dataloader_batches_per_epoch(&one) == 6);
        for (int step = 0; step < 14; step++) {  // past the end of the epoch
            for (int r = 0; r < 3; r++) { CHECK(next_row_starts(&one, 1) == next_row_starts(&ranks[r], 1)); }
        }
        DataLoaderState saved = dataloader_state(&one);
        CHECK(saved.micro_batches == 3 && dataloader_state(&ranks[1]).micro_batches == 3);
        DataLoader resumed;
        dataloader_init(&resumed, pattern.c_str(), 2, 8, 2, 3, 1, shuffle, 11, GPT2_VOCAB);
        dataloader_restore(&resumed, &saved);
        std::vector<int32_t> expected;
        for (int step = 0; step < 4; step++) {
            std::vector<int32_t> micro = next_row_starts(&one, 3);
            expected.insert(expected.end(), micro.begin() + 4, micro.end());  // micro-step 2: rank 2's rows
        }
        CHECK(next_row_starts(&resumed, 4) == expected);
        dataloader_free(&one);
        dataloader_free(&resumed);
        for (DataLoader& dl : ranks) { dataloader_free(&dl); }
    }
    remove_dir(dir);
}

TEST(loader_shuffle_is_deterministic_per_seed) {
    std::string dir = make_three_shards();
    std::string pattern = dir + "/*.bin";
    auto two_epochs = [&](uint64_t seed) {
        DataLoader dl;
        dataloader_init(&dl, pattern.c_str(), 4, 8, 0, 1, 1, true, seed, GPT2_VOCAB);
        std::vector<int32_t> starts = next_row_starts(&dl, 2 * (int64_t)dataloader_batches_per_epoch(&dl));
        dataloader_free(&dl);
        return starts;
    };
    std::vector<int32_t> seed7 = two_epochs(7);
    CHECK(seed7 == two_epochs(7));
    CHECK(seed7 != two_epochs(8));
    std::vector<int32_t> epoch0(seed7.begin(), seed7.begin() + 36), epoch1(seed7.begin() + 36, seed7.end());
    CHECK(epoch0 != epoch1);
    remove_dir(dir);
}

TEST(loader_shuffle_reorders_a_single_shard_every_epoch) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/only.bin", 0, 32 * 8 + 1);
    DataLoader dl;
    dataloader_init(&dl, (dir + "/only.bin").c_str(), 4, 8, 0, 1, 1, true, 3, GPT2_VOCAB);
    std::vector<int32_t> epoch0 = next_row_starts(&dl, 8);
    std::vector<int32_t> epoch1 = next_row_starts(&dl, 8);
    CHECK(epoch0 != epoch1);
    CHECK(std::set<int32_t>(epoch0.begin(), epoch0.end()) == std::set<int32_t>(epoch1.begin(), epoch1.end()));
    dataloader_free(&dl);
    remove_dir(dir);
}

TEST(loader_shuffle_covers_every_sample_once_per_epoch) {
    std::string dir = make_three_shards();
    DataLoader dl;
    dataloader_init(&dl, (dir + "/*.bin").c_str(), 4, 8, 0, 1, 1, true, 5, GPT2_VOCAB);
    CHECK(dataloader_batches_per_epoch(&dl) == 9);
    std::multiset<int32_t> every_sample = every_sample_of_three_shards();
    std::vector<int32_t> identity(every_sample.begin(), every_sample.end());
    std::set<std::vector<int32_t>> shard_orders;
    for (int epoch = 0; epoch < 4; epoch++) {
        std::vector<int32_t> starts = next_row_starts(&dl, 9);
        CHECK(std::multiset<int32_t>(starts.begin(), starts.end()) == every_sample);
        CHECK(starts != identity);
        std::vector<int32_t> shard_order;
        for (size_t i = 0; i < starts.size(); i += 4) {  // a batch never mixes shards
            CHECK(starts[i] / 10000 == starts[i + 3] / 10000);
            int32_t shard = starts[i] / 10000;
            if (shard_order.empty() || shard_order.back() != shard) { shard_order.push_back(shard); }
        }
        CHECK(shard_order.size() == 3);  // each shard's batches come together
        shard_orders.insert(shard_order);
    }
    CHECK(shard_orders.size() > 1);  // the shard order changes between epochs
    dataloader_free(&dl);
    remove_dir(dir);
}

// ---------------------------------------------------------------------------------
// Data loader: checkpointing.

// Saves the state after `skip` batches, restores it into a fresh loader and into one
// that has already moved on, and expects both to continue exactly like the original.
static void check_restore(const std::string& pattern, bool shuffle, int world_size, int64_t skip) {
    DataLoader original, fresh, moved;
    dataloader_init(&original, pattern.c_str(), 2, 8, world_size - 1, world_size, 1, shuffle, 99, GPT2_VOCAB);
    next_row_starts(&original, skip);
    DataLoaderState saved = dataloader_state(&original);
    unsigned char bytes[sizeof(DataLoaderState)];  // as a checkpoint would store it
    memcpy(bytes, &saved, sizeof(bytes));
    DataLoaderState loaded;
    memcpy(&loaded, bytes, sizeof(loaded));
    int64_t horizon = 2 * (int64_t)dataloader_batches_per_epoch(&original) + 3;
    std::vector<int32_t> expected = next_row_starts(&original, horizon);

    dataloader_init(&fresh, pattern.c_str(), 2, 8, world_size - 1, world_size, 1, shuffle, 99, GPT2_VOCAB);
    dataloader_restore(&fresh, &loaded);
    CHECK(next_row_starts(&fresh, horizon) == expected);

    dataloader_init(&moved, pattern.c_str(), 2, 8, world_size - 1, world_size, 1, shuffle, 99, GPT2_VOCAB);
    next_row_starts(&moved, skip + 7);
    dataloader_restore(&moved, &loaded);
    CHECK(next_row_starts(&moved, horizon) == expected);

    dataloader_free(&original);
    dataloader_free(&fresh);
    dataloader_free(&moved);
}

TEST(loader_restore_continues_exactly) {
    std::string dir = make_three_shards();
    std::string pattern = dir + "/*.bin";
    // B=2: shards of 6, 4 and 8 batches (world_size 1) or 3, 2 and 4 (world_size 2).
    for (bool shuffle : {false, true}) {
        for (int64_t skip : {0, 1, 5, 6, 9, 17, 18, 23}) { check_restore(pattern, shuffle, 1, skip); }
        for (int64_t skip : {2, 3, 8, 9}) { check_restore(pattern, shuffle, 2, skip); }
    }
    remove_dir(dir);
}

TEST(loader_restore_rejects_other_runs) {
    std::string dir = make_three_shards();
    std::string other = make_temp_dir();
    write_test_shard(other + "/x.bin", 0, 200);
    std::string pattern = dir + "/*.bin", other_pattern = other + "/*.bin";
    DataLoader dl;
    dataloader_init(&dl, pattern.c_str(), 2, 8, 0, 1, 1, true, 5, GPT2_VOCAB);
    dataloader_next_batch(&dl);
    DataLoaderState state = dataloader_state(&dl);
    auto restore_into = [&](const std::string& into, int B, bool shuffle, uint64_t seed, DataLoaderState s) {
        return [=]() {
            DataLoader target;
            dataloader_init(&target, into.c_str(), B, 8, 0, 1, 1, shuffle, seed, GPT2_VOCAB);
            dataloader_restore(&target, &s);
        };
    };
    CHECK(expect_exit_failure(restore_into(pattern, 4, true, 5, state), "data loader state does not match"));
    CHECK(expect_exit_failure(restore_into(pattern, 2, true, 6, state), "seed=5"));
    CHECK(expect_exit_failure(restore_into(pattern, 2, false, 5, state), "shuffle=1"));
    CHECK(expect_exit_failure(restore_into(other_pattern, 2, true, 5, state), "another data set"));
    DataLoaderState past_end = state;
    past_end.batch_index = 100;
    CHECK(expect_exit_failure(restore_into(pattern, 2, true, 5, past_end), "out of range"));
    dataloader_free(&dl);
    remove_dir(dir);
    remove_dir(other);
}

// ---------------------------------------------------------------------------------
// Data loader: bad input.

static bool init_fails(const std::string& pattern, int B, int T, const std::string& fragment) {
    return expect_exit_failure(
        [&]() {
            DataLoader dl;
            dataloader_init(&dl, pattern.c_str(), B, T, 0, 1, 1, false, 0, GPT2_VOCAB);
        },
        fragment.c_str());
}

TEST(loader_rejects_corrupt_shards) {
    std::string dir = make_temp_dir();
    std::vector<uint16_t> tokens(100, 7);
    std::string path = dir + "/shard.bin";
    write_raw_shard(path, DATALOADER_MAGIC, 1, 200, tokens);
    CHECK(init_fails(path, 2, 8, path + ": truncated shard: header says 200 tokens"));
    write_file(path, "tiny");
    CHECK(init_fails(path, 2, 8, path + ": truncated shard: 4 bytes"));
    write_raw_shard(path, 20240521, 1, 100, tokens);
    CHECK(init_fails(path, 2, 8, path + ": bad magic number 20240521"));
    write_raw_shard(path, DATALOADER_MAGIC, 2, 100, tokens);
    CHECK(init_fails(path, 2, 8, path + ": unsupported shard version 2"));
    write_raw_shard(path, DATALOADER_MAGIC, 1, 50, tokens);
    CHECK(init_fails(path, 2, 8, path + ": token count mismatch: header says 50 tokens"));
    tokens[17] = 60000;
    write_raw_shard(path, DATALOADER_MAGIC, 1, 100, tokens);
    CHECK(init_fails(path, 2, 8, path + ": token id 60000 at token offset 17 (byte offset 1058)"));
    tokens[17] = GPT2_VOCAB - 1;  // the largest valid id loads, one more does not
    tokens[60] = GPT2_VOCAB;
    write_raw_shard(path, DATALOADER_MAGIC, 1, 100, tokens);
    CHECK(init_fails(path, 2, 8, "token id 50257 at token offset 60 (byte offset 1144) is out of range"));
    remove_dir(dir);
}

TEST(loader_rejects_bad_setup) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/a.bin", 0, 100);
    write_test_shard(dir + "/b.bin", 0, 16);  // one batch of B=2, T=8 needs 17 tokens
    CHECK(init_fails(dir + "/nothing_*.bin", 2, 8, "no data shards match the pattern " + dir + "/nothing_*.bin"));
    CHECK(init_fails(dir + "/*.bin", 2, 8, dir + "/b.bin: shard too small: 16 tokens"));
    CHECK(init_fails(dir + "/a.bin", 0, 8, "batch size B must be positive, got 0"));
    CHECK(init_fails(dir + "/a.bin", 2, -1, "sequence length T must be positive, got -1"));
    remove_dir(dir);
}

TEST(loader_checks_a_later_shards_tokens_when_it_loads) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/a.bin", 0, 17);  // exactly one batch of B=2, T=8
    std::vector<uint16_t> tokens(17, 5);
    tokens[3] = GPT2_VOCAB;
    write_raw_shard(dir + "/b.bin", DATALOADER_MAGIC, 1, 17, tokens);
    std::string pattern = dir + "/*.bin";
    auto second_batch = [&]() {
        DataLoader dl;
        dataloader_init(&dl, pattern.c_str(), 2, 8, 0, 1, 1, false, 0, GPT2_VOCAB);
        dataloader_next_batch(&dl);  // shard a: fine
        dataloader_next_batch(&dl);  // shard b: its bad token is found here
    };
    CHECK(expect_exit_failure(second_batch, (dir + "/b.bin: token id 50257 at token offset 3").c_str()));
    remove_dir(dir);
}

// Every rows count over N = 1..9 ranks: contiguous shares in rank order that cover [0, rows)
// once, sizes differing by at most one.
TEST(split_rows_covers_every_row_once) {
    for (int world = 1; world <= 9; world++) {
        for (int64_t rows = 0; rows <= 40; rows++) {
            int64_t next = 0, smallest = rows, largest = 0;
            for (int rank = 0; rank < world; rank++) {
                RowRange share = split_rows(rows, rank, world);
                CHECK(share.begin == next && share.end >= share.begin);
                next = share.end;
                smallest = std::min(smallest, share.end - share.begin);
                largest = std::max(largest, share.end - share.begin);
            }
            CHECK(next == rows);
            CHECK(largest - smallest <= 1);
        }
    }
}

// Rows read by number are the rows one process reads batch by batch (across shards, shuffled
// or not), whichever rank's share they fall in; a short read repeats its last row.
TEST(read_rows_match_one_process_batches) {
    std::string dir = make_three_shards();
    std::string pattern = dir + "/*.bin";
    for (bool shuffle : {false, true}) {
        DataLoader batches, rows;
        dataloader_init(&batches, pattern.c_str(), 3, 8, 0, 1, 1, shuffle, 5, GPT2_VOCAB);
        dataloader_init(&rows, pattern.c_str(), 3, 8, 0, 1, 1, shuffle, 5, GPT2_VOCAB);
        int64_t total = 3 * (int64_t)dataloader_batches_per_epoch(&batches);
        std::vector<int32_t> expected = next_row_starts(&batches, total / 3);
        for (int world = 1; world <= 9; world++) {
            std::vector<int32_t> got;
            for (int rank = 0; rank < world; rank++) {
                RowRange share = split_rows(total, rank, world);
                for (int64_t first = share.begin; first < share.end; first += 3) {
                    int count = (int)std::min<int64_t>(3, share.end - first);
                    dataloader_read_rows(&rows, first, count);
                    std::vector<int32_t> starts = batch_row_starts(&rows);
                    got.insert(got.end(), starts.begin(), starts.begin() + count);
                    for (int b = count; b < 3; b++) { CHECK(starts[b] == starts[count - 1]); }
                }
            }
            CHECK(got == expected);
        }
        dataloader_free(&batches);
        dataloader_free(&rows);
    }
    remove_dir(dir);
}

TEST(loader_max_batch_fits_the_smallest_shard) {
    std::string dir = make_temp_dir();
    write_test_shard(dir + "/a.bin", 0, 100);  // 12 samples of T=8
    write_test_shard(dir + "/b.bin", 1, 41);   // 5 samples of T=8
    std::string pattern = dir + "/*.bin";
    CHECK(dataloader_max_batch(pattern.c_str(), 8, 1) == 5);
    CHECK(dataloader_max_batch(pattern.c_str(), 8, 2) == 2);
    CHECK(dataloader_max_batch(pattern.c_str(), 41, 1) == 0);
    DataLoader dl;
    dataloader_init(&dl, pattern.c_str(), 5, 8, 0, 1, 1, false, 0, GPT2_VOCAB);
    dataloader_free(&dl);
    remove_dir(dir);
}

// ---------------------------------------------------------------------------------
// SHA-256 itself (FIPS 180-2 example vectors).

TEST(sha256_known_vectors) {
    CHECK(sha256_hex("", 0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(sha256_hex("abc", 3) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char* two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    CHECK(sha256_hex(two_blocks, strlen(two_blocks)) ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    std::string million_a(1000000, 'a');
    CHECK(sha256_hex(million_a.data(), million_a.size()) ==
          "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// ---------------------------------------------------------------------------------
// prepare_data.

// How many times `part` occurs in `text`.
static size_t occurrences(const std::string& text, const std::string& part) {
    size_t count = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) { count++; }
    return count;
}

static std::vector<uint16_t> shard_tokens(const std::string& path) {
    std::string bytes = read_file(path);
    std::vector<uint16_t> tokens;
    if (bytes.size() < (size_t)DATALOADER_HEADER_BYTES) { return tokens; }
    tokens.resize((bytes.size() - DATALOADER_HEADER_BYTES) / 2);
    memcpy(tokens.data(), bytes.data() + DATALOADER_HEADER_BYTES, tokens.size() * 2);
    return tokens;
}

TEST(tinyshakespeare_shards_match_sha256) {
    std::string dir = make_temp_dir();
    PrepareOptions options = quiet_options(4);
    prepare_tinyshakespeare(gpt2_tokenizer(), TINYSHAKESPEARE_TEXT, dir.c_str(), &options);
    std::string val = dir + "/tiny_shakespeare_val.bin", train = dir + "/tiny_shakespeare_train.bin";
    CHECK(sha256_file(val.c_str()) == "fe99db720dc7c83e694806d4e047a952909411da1daccde4ccc2e55f40882a62");
    CHECK(sha256_file(train.c_str()) == "8a70606be574040c26d225694f5f9759973b419852d22f7fe5c118e1b359dcc8");
    CHECK(file_size(val.c_str()) == DATALOADER_HEADER_BYTES + 2 * 32768);
    CHECK(file_size(train.c_str()) == DATALOADER_HEADER_BYTES + 2 * 305260);
    const int32_t first[16] = {50256, 5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502, 2740, 13, 628};
    DataLoader dl;
    dataloader_init(&dl, val.c_str(), 4, 64, 0, 1, 1, false, 0, GPT2_VOCAB);
    dataloader_next_batch(&dl);
    CHECK(memcmp(dl.inputs, first, sizeof(first)) == 0);
    dataloader_free(&dl);
    auto prepare_again = [&]() {
        prepare_tinyshakespeare(gpt2_tokenizer(), TINYSHAKESPEARE_TEXT, dir.c_str(), &options);
    };
    CHECK(expect_exit_failure(prepare_again, (val + " already exists (use --force to overwrite)").c_str()));
    remove_dir(dir);
}

TEST(tool_encode_decode_round_trip) {
    std::string dir = make_temp_dir();
    std::string text = "Hello world";
    write_file(dir + "/hello.txt", text);
    CHECK(run_command("./prepare_data encode " + dir + "/hello.txt > " + dir + "/hello.ids") == 0);
    CHECK(read_file(dir + "/hello.ids") == "15496 995\n");
    std::string any_bytes = "First Citizen:\nBefore we proceed, caf\xc3\xa9 \xf0\x9f\x98\x80 <|endoftext|>  \t\r\n";
    for (int b = 0; b < 256; b++) { any_bytes.push_back((char)b); }
    any_bytes += "\xff\xfe\xc3 truncated \xe2\x82";
    write_file(dir + "/any.bin", any_bytes);
    CHECK(run_command("./prepare_data encode " + dir + "/any.bin > " + dir + "/any.ids 2> " + dir + "/any.err") == 0);
    CHECK(read_file(dir + "/any.err").find("/any.bin: 133 bytes are not UTF-8 (the first at byte offset 191)") !=
          std::string::npos);
    std::string ids = read_file(dir + "/any.ids");
    CHECK(!ids.empty() && ids.back() == '\n' && ids.find('\n') == ids.size() - 1);
    CHECK(ids.find("  ") == std::string::npos && ids[0] != ' ');
    CHECK(run_command("./prepare_data decode < " + dir + "/any.ids > " + dir + "/any.out") == 0);
    CHECK(read_file(dir + "/any.out") == any_bytes);
    write_file(dir + "/bad.ids", "15496 50257 995");
    std::string decode_bad = "./prepare_data decode < " + dir + "/bad.ids > " + dir + "/bad.out";
    CHECK(run_command(decode_bad + " 2> " + dir + "/bad.err") == 1);
    CHECK(read_file(dir + "/bad.err").find("error: decode: bad token id \"50257\"") != std::string::npos);
    CHECK(read_file(dir + "/bad.out").empty());
    CHECK(run_command("./prepare_data frobnicate 2> " + dir + "/usage.err") == 1);
    CHECK(read_file(dir + "/usage.err").find("usage: ./prepare_data") != std::string::npos);
    remove_dir(dir);
}

// Escapes text as a JSON string, with non-ASCII as \u escapes (surrogate pairs above U+FFFF)
// when `escape_unicode` is set. The text must be valid UTF-8 in that case.
static std::string json_quote(const std::string& text, bool escape_unicode) {
    std::string out = "\"";
    for (size_t i = 0; i < text.size(); i++) {
        unsigned char c = (unsigned char)text[i];
        char hex[16];
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char)c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c < 0x20) {
            snprintf(hex, sizeof(hex), "\\u%04x", c);
            out += hex;
        } else if (c < 0x80 || !escape_unicode) {
            out += (char)c;
        } else {
            int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
            uint32_t cp = c & (0x3F >> extra);
            for (int k = 1; k <= extra; k++) { cp = cp << 6 | ((unsigned char)text[i + k] & 0x3F); }
            i += extra;
            if (cp >= 0x10000) {
                uint32_t high = 0xD800 + ((cp - 0x10000) >> 10), low = 0xDC00 + ((cp - 0x10000) & 0x3FF);
                snprintf(hex, sizeof(hex), "\\u%04X\\u%04X", high, low);
            } else {
                snprintf(hex, sizeof(hex), "\\u%04x", cp);
            }
            out += hex;
        }
    }
    return out + "\"";
}

// A small corpus: a directory with .txt and .jsonl files (one nested) and a file of
// another kind to ignore. Returns the documents in the order the tool must read them.
static std::vector<std::string> make_corpus(const std::string& dir) {
    std::string shakespeare = read_file(TINYSHAKESPEARE_TEXT);
    std::vector<std::string> docs;
    std::filesystem::create_directories(dir + "/corpus/sub");
    docs.push_back(shakespeare.substr(0, 3000));
    write_file(dir + "/corpus/a.txt", docs.back());
    std::string lines;
    for (int i = 0; i < 120; i++) {
        std::string doc = shakespeare.substr(3000 + (size_t)i * 997, 50 + (size_t)(i * 37) % 900);
        if (i % 5 == 3) { doc += " caf\xc3\xa9 \xf0\x9f\x98\x80 \"quoted\" back\\slash \t tab"; }
        docs.push_back(doc);
        lines += "{\"id\": " + std::to_string(i) + ", \"meta\": {\"tags\": [1, -2.5e3, true, null, \"x\"]}, ";
        lines += "\"text\": " + json_quote(doc, i % 2 == 0) + "}\n";
        if (i % 40 == 0) { lines += "\n"; }
    }
    write_file(dir + "/corpus/b.jsonl", lines);
    docs.push_back("bytes \xff\xfe\xc3 that are not UTF-8\n");
    write_file(dir + "/corpus/sub/c.txt", docs.back());
    docs.push_back("");
    write_file(dir + "/corpus/sub/d.txt", docs.back());
    write_file(dir + "/corpus/notes.md", "not an input");
    return docs;
}

// The shards of a prefix, in order, concatenated.
static std::vector<uint16_t> all_shard_tokens(const std::string& prefix, int64_t* num_shards) {
    std::vector<uint16_t> tokens;
    for (*num_shards = 0; file_exists(shard_path(prefix, *num_shards).c_str()); (*num_shards)++) {
        std::vector<uint16_t> shard = shard_tokens(shard_path(prefix, *num_shards));
        tokens.insert(tokens.end(), shard.begin(), shard.end());
    }
    return tokens;
}

// Splits tokens at each end-of-text (which must come first) and decodes the documents.
static std::vector<std::string> decode_documents(const std::vector<uint16_t>& tokens) {
    std::vector<std::string> docs;
    for (uint16_t id : tokens) {
        if (id == gpt2_tokenizer()->eot_token) {
            docs.push_back("");
            continue;
        }
        const uint8_t* bytes;
        size_t len;
        tokenizer_decode(gpt2_tokenizer(), id, &bytes, &len);
        if (docs.empty()) { docs.push_back("<no end-of-text first>"); }
        docs.back().append((const char*)bytes, len);
    }
    return docs;
}

TEST(shards_mode_keeps_documents_and_is_thread_count_independent) {
    std::string dir = make_temp_dir();
    std::vector<std::string> docs = make_corpus(dir);
    PrepareOptions options = quiet_options(1);
    options.shard_size = 2000;
    options.out_prefix = dir + "/one/data";
    options.inputs = {dir + "/corpus"};
    std::string c_warning = "warning: " + dir + "/corpus/sub/c.txt: 3 bytes are not UTF-8 (the first at byte offset 6)";
    std::string err = stderr_of_success([&] { prepare_shards(gpt2_tokenizer(), &options); });
    CHECK(occurrences(err, "warning: ") == 1 && err.find(c_warning) != std::string::npos);
    int64_t num_shards = 0;
    std::vector<uint16_t> tokens = all_shard_tokens(options.out_prefix, &num_shards);
    CHECK(decode_documents(tokens) == docs);
    CHECK(num_shards == (int64_t)(tokens.size() + 1999) / 2000 && num_shards > 3);
    CHECK(file_size(shard_path(options.out_prefix, 0).c_str()) == DATALOADER_HEADER_BYTES + 2 * 2000);
    CHECK(file_exists((options.out_prefix + "_val_000000.bin").c_str()));
    CHECK(file_exists((options.out_prefix + "_train_000001.bin").c_str()));

    std::string four = dir + "/four/data";
    CHECK(run_command("./prepare_data shards -o " + four + " --shard-size 2000 --threads 4 " + dir +
                      "/corpus > /dev/null 2>&1") == 0);
    for (int64_t i = 0; i <= num_shards; i++) {
        CHECK(read_file(shard_path(options.out_prefix, i)) == read_file(shard_path(four, i)));
    }
    options.threads = 4;
    options.out_prefix = dir + "/four_direct/data";
    CHECK(stderr_of_success([&] { prepare_shards(gpt2_tokenizer(), &options); }).find(c_warning) != std::string::npos);
    for (int64_t i = 0; i <= num_shards; i++) {
        CHECK(read_file(shard_path(dir + "/one/data", i)) == read_file(shard_path(options.out_prefix, i)));
    }

    DataLoader dl;  // the shards are valid input for the loader
    std::string loadable = dir + "/one/data_*_00000[01].bin";
    dataloader_init(&dl, loadable.c_str(), 1, 64, 0, 1, 1, false, 0, GPT2_VOCAB);
    CHECK(dl.shard_paths.size() == 2 && dl.total_tokens == 4000);
    dataloader_free(&dl);
    remove_dir(dir);
}

// About 6.7 MB of text: several encoding rounds, whose size depends on the thread count.
TEST(shards_mode_output_spans_rounds_in_document_order) {
    std::string dir = make_temp_dir();
    std::string shakespeare = read_file(TINYSHAKESPEARE_TEXT);
    std::vector<std::string> docs;
    std::filesystem::create_directories(dir + "/corpus");
    for (int copy = 0; copy < 5; copy++) {
        docs.push_back(shakespeare);
        write_file(dir + "/corpus/copy_" + std::to_string(copy) + ".txt", shakespeare);
    }
    std::string lines;
    for (size_t start = 0; start < shakespeare.size(); start += 2000) {
        docs.push_back(shakespeare.substr(start, 2000));
        lines += "{\"text\": " + json_quote(docs.back(), false) + "}\n";
    }
    write_file(dir + "/corpus/pieces.jsonl", lines);
    std::vector<std::vector<uint16_t>> outputs;
    for (int threads : {1, 3}) {
        PrepareOptions options = quiet_options(threads);
        options.shard_size = 300000;
        options.out_prefix = dir + "/out" + std::to_string(threads) + "/data";
        options.inputs = {dir + "/corpus"};
        prepare_shards(gpt2_tokenizer(), &options);
        int64_t num_shards = 0;
        outputs.push_back(all_shard_tokens(options.out_prefix, &num_shards));
        CHECK(num_shards == (int64_t)(outputs.back().size() + 299999) / 300000);
    }
    CHECK(outputs[0] == outputs[1]);
    CHECK(decode_documents(outputs[0]) == docs);
    remove_dir(dir);
}

TEST(shards_mode_refuses_to_overwrite_without_force) {
    std::string dir = make_temp_dir();
    make_corpus(dir);
    PrepareOptions options = quiet_options(2);
    options.shard_size = 2000;
    options.out_prefix = dir + "/out/data";
    options.inputs = {dir + "/corpus/a.txt", dir + "/corpus/b.jsonl"};
    prepare_shards(gpt2_tokenizer(), &options);
    int64_t num_shards = 0;
    all_shard_tokens(options.out_prefix, &num_shards);
    std::string first_shard = shard_path(options.out_prefix, 0);
    std::string before = read_file(first_shard);
    CHECK(expect_exit_failure([&]() { prepare_shards(gpt2_tokenizer(), &options); },
                              (first_shard + " already exists (use --force to overwrite)").c_str()));
    std::string rerun = "./prepare_data shards -o " + options.out_prefix + " " + dir + "/corpus/a.txt";
    CHECK(run_command(rerun + " 2> /dev/null") == 1);
    CHECK(read_file(first_shard) == before);
    // With --force the shards are rewritten, and those the new run does not produce go.
    options.force = true;
    options.shard_size = (int64_t)all_shard_tokens(options.out_prefix, &num_shards).size() - 1;
    prepare_shards(gpt2_tokenizer(), &options);
    int64_t forced_shards = 0;
    all_shard_tokens(options.out_prefix, &forced_shards);
    CHECK(num_shards > 2 && forced_shards == 2);
    std::vector<std::string> kept = {first_shard, shard_path(options.out_prefix, 1)};
    CHECK(existing_shards(options.out_prefix) == kept);
    CHECK(shard_tokens(shard_path(options.out_prefix, 1)).size() == 1);
    remove_dir(dir);
}

// Inputs that only fill the validation shard (or not even that) give no training data: the run
// fails naming them and the counts, and writes, creates and removes nothing.
TEST(shards_mode_refuses_inputs_without_training_data) {
    std::string dir = make_temp_dir();
    std::string text = "A small document, too small for a shard of training data.\n";
    write_file(dir + "/a.txt", text);
    std::vector<uint32_t> ids;
    tokenizer_encode(gpt2_tokenizer(), text.data(), text.size(), &ids);
    int64_t tokens = 1 + (int64_t)ids.size();  // the end-of-text token first
    PrepareOptions options = quiet_options(2);
    options.out_prefix = dir + "/out/data";
    options.inputs = {dir + "/a.txt"};
    for (int64_t shard_size : {tokens, tokens + 1, (int64_t)100000000}) {
        options.shard_size = shard_size;
        std::string expected = "error: the inputs (" + dir + "/a.txt) give 1 document of " + std::to_string(tokens) +
                               " tokens in all, too few: the validation shard takes the first " +
                               std::to_string(shard_size) + " (--shard-size) and training needs at least one more; "
                               "nothing written\n";
        char err[4096];
        int status = run_in_child([&] { prepare_shards(gpt2_tokenizer(), &options); }, err, sizeof(err));
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && err == expected);
        CHECK(!std::filesystem::exists(dir + "/out"));
    }
    std::string tool = "./prepare_data shards -o " + options.out_prefix + " " + dir + "/a.txt";
    CHECK(run_command(tool + " > " + dir + "/tool.out 2> " + dir + "/tool.err") == 1);
    CHECK(read_file(dir + "/tool.err").find("\nerror: the inputs (" + dir + "/a.txt) give 1 document of") !=
          std::string::npos);
    CHECK(read_file(dir + "/tool.out").empty() && !std::filesystem::exists(dir + "/out"));

    // One token more than a shard: a validation shard and a training shard of one token.
    options.shard_size = tokens - 1;
    prepare_shards(gpt2_tokenizer(), &options);
    CHECK(shard_tokens(shard_path(options.out_prefix, 0)).size() == (size_t)tokens - 1);
    CHECK(shard_tokens(shard_path(options.out_prefix, 1)).size() == 1);
    // A refused run with --force leaves an earlier run's shards as they were.
    std::string val_before = read_file(shard_path(options.out_prefix, 0));
    options.force = true;
    options.shard_size = tokens;
    CHECK(expect_exit_failure([&] { prepare_shards(gpt2_tokenizer(), &options); }, "nothing written"));
    CHECK(read_file(shard_path(options.out_prefix, 0)) == val_before);
    CHECK(shard_tokens(shard_path(options.out_prefix, 1)).size() == 1);

    // No documents at all (blank lines); many inputs are named by the first three.
    write_file(dir + "/blank.jsonl", "\n  \n");
    options.inputs = {dir + "/blank.jsonl"};
    options.out_prefix = dir + "/blank/data";
    CHECK(expect_exit_failure([&] { prepare_shards(gpt2_tokenizer(), &options); },
                              ") give 0 documents of 0 tokens in all, too few"));
    options.inputs = {dir + "/a.txt", dir + "/a.txt", dir + "/blank.jsonl", dir + "/a.txt", dir + "/a.txt"};
    options.shard_size = 4 * tokens;
    std::string named = "the inputs (" + dir + "/a.txt, " + dir + "/a.txt, " + dir + "/blank.jsonl and 2 more) " +
                        "give 4 documents of " + std::to_string(4 * tokens) + " tokens in all";
    CHECK(expect_exit_failure([&] { prepare_shards(gpt2_tokenizer(), &options); }, named.c_str()));
    CHECK(!std::filesystem::exists(dir + "/blank"));
    remove_dir(dir);
}

TEST(tinyshakespeare_refuses_text_without_training_data) {
    std::string dir = make_temp_dir();
    write_file(dir + "/short.txt", "Too short.");
    PrepareOptions options = quiet_options(1);
    std::string text = dir + "/short.txt", out = dir + "/out";
    CHECK(expect_exit_failure(
        [&] { prepare_tinyshakespeare(gpt2_tokenizer(), text.c_str(), out.c_str(), &options); },
        (dir + "/short.txt: too little text for a training split: 4 tokens, and the validation shard takes the first "
               "32768 (at least 32769 needed)").c_str()));
    CHECK(!std::filesystem::exists(dir + "/out"));
    remove_dir(dir);
}

TEST(utf8_invalid_bytes_counts_what_the_tokenizer_takes_as_bytes) {
    struct Case {
        std::string bytes;
        size_t count, first;
    };
    const Case cases[] = {
        {"", 0, 0},
        {"plain ASCII", 0, 11},
        {"caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac", 0, 14},
        {"a\x80" "b", 1, 1},
        {"ok \xff\xfe text \xe2\x82", 4, 3},      // a sequence cut short: each of its bytes
        {"\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80", 9, 0},  // overlong, surrogate, above U+10FFFF
        {"\xe2\x82x", 2, 0},
    };
    for (const Case& c : cases) {
        size_t first = 99;
        size_t count = utf8_invalid_bytes((const uint8_t*)c.bytes.data(), c.bytes.size(), &first);
        CHECK(count == c.count && first == c.first);
        if (count != c.count || first != c.first) {
            fprintf(stderr, "  %zu bytes: %zu invalid from %zu\n", c.bytes.size(), count, first);
        }
    }
}

// Bytes that are not UTF-8: one warning per file in every mode that reads text files, and the
// bytes encoded as they are.
TEST(invalid_utf8_is_warned_once_per_file_and_kept) {
    std::string dir = make_temp_dir();
    std::vector<std::string> docs = {"ok \xff\xfe text \xe2\x82", "plain caf\xc3\xa9", "a\x80" "b \x80"};
    for (size_t i = 0; i < docs.size(); i++) { write_file(dir + "/" + std::to_string(i) + ".txt", docs[i]); }
    std::string warning0 = "warning: " + dir + "/0.txt: 4 bytes are not UTF-8 (the first at byte offset 3); "
                           "encoded as raw bytes, which decode back unchanged\n";
    std::string warning2 = "warning: " + dir + "/2.txt: 2 bytes are not UTF-8 (the first at byte offset 1); "
                           "encoded as raw bytes, which decode back unchanged\n";
    PrepareOptions options = quiet_options(2);
    options.shard_size = 4;
    options.out_prefix = dir + "/out/data";
    options.inputs = {dir + "/0.txt", dir + "/1.txt", dir + "/2.txt"};
    CHECK(stderr_of_success([&] { prepare_shards(gpt2_tokenizer(), &options); }) == warning0 + warning2);
    int64_t num_shards = 0;
    CHECK(decode_documents(all_shard_tokens(options.out_prefix, &num_shards)) == docs);

    // encode: the warning on stderr, the ids on stdout decode back to the bytes.
    std::string encode = "./prepare_data encode " + dir + "/0.txt > " + dir + "/0.ids 2> " + dir + "/0.err";
    CHECK(run_command(encode) == 0 && read_file(dir + "/0.err") == warning0);
    CHECK(run_command("./prepare_data decode < " + dir + "/0.ids > " + dir + "/0.out") == 0);
    CHECK(read_file(dir + "/0.out") == docs[0]);
    CHECK(run_command("./prepare_data encode " + dir + "/1.txt > /dev/null 2> " + dir + "/1.err") == 0);
    CHECK(read_file(dir + "/1.err").empty());
    write_file(dir + "/one.txt", "a\xfe");
    CHECK(run_command("./prepare_data encode " + dir + "/one.txt > /dev/null 2> " + dir + "/one.err") == 0);
    CHECK(read_file(dir + "/one.err") == "warning: " + dir + "/one.txt: 1 byte is not UTF-8 (the first at byte " +
                                             "offset 1); encoded as raw bytes, which decode back unchanged\n");

    // tinyshakespeare: its text with a stray byte.
    std::string text = read_file(TINYSHAKESPEARE_TEXT) + "\xff";
    write_file(dir + "/shakespeare.txt", text);
    std::string err = stderr_of_success([&] {
        prepare_tinyshakespeare(gpt2_tokenizer(), (dir + "/shakespeare.txt").c_str(), (dir + "/ts").c_str(), &options);
    });
    CHECK(err == "warning: " + dir + "/shakespeare.txt: 1 byte is not UTF-8 (the first at byte offset " +
                     std::to_string(text.size() - 1) + "); encoded as raw bytes, which decode back unchanged\n");
    std::vector<uint16_t> tokens = shard_tokens(dir + "/ts/tiny_shakespeare_val.bin");
    std::vector<uint16_t> train = shard_tokens(dir + "/ts/tiny_shakespeare_train.bin");
    tokens.insert(tokens.end(), train.begin(), train.end());
    std::string decoded;
    for (const std::string& doc : decode_documents(tokens)) { decoded += doc; }
    CHECK(decoded == text);
    remove_dir(dir);
}

TEST(jsonl_text_extraction) {
    std::string text, error;
    auto parse = [&](const std::string& line) { return parse_jsonl_text(line.data(), line.size(), &text, &error); };
    CHECK(parse("{\"text\": \"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\u20AC\\ud83d\\ude00\"}\n"));
    CHECK(text == "a\"b\\c/d\b\f\n\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    CHECK(parse(" { \"a\" : [ {}, [], \"}\" ], \"text\" : \"x\" , \"b\": -0.5E+2 }\r\n") && text == "x");
    CHECK(parse("{\"text\": \"first\", \"text\": \"last\"}") && text == "last");
    CHECK(parse("{\"text\": \"raw \xc3\xa9 bytes\"}") && text == "raw \xc3\xa9 bytes");
    const char* bad_lines[][2] = {
        {"{\"id\": 1}", "no \"text\" field"},
        {"{\"text\": 5}", "not a string"},
        {"{\"text\": \"a\\ud83d\"}", "lone high surrogate"},
        {"{\"text\": \"a\\ude00\"}", "lone low surrogate"},
        {"{\"text\": \"a\\u12g4\"}", "bad hex digit"},
        {"{\"text\": \"a\\q\"}", "bad escape"},
        {"{\"text\": \"a\tb\"}", "control character"},
        {"{\"text\": \"abc", "unterminated string"},
        {"{\"text\": \"a\"} x", "unexpected characters after the object"},
        {"{\"text\": \"a\",}", "expected a string"},
        {"{\"n\": 01, \"text\": \"a\"}", "leading zero in a number (column 7)"},
        {"{\"n\": 1 2, \"text\": \"a\"}", "expected ',' or '}'"},
        {"{\"text\": \"a\xff\"}", "invalid UTF-8 in string"},
        {"[\"text\"]", "expected an object"},
    };
    for (const auto& bad : bad_lines) {
        bool parsed = parse(bad[0]);
        CHECK(!parsed && error.find(bad[1]) != std::string::npos);
        if (parsed || error.find(bad[1]) == std::string::npos) {
            fprintf(stderr, "  line %s: %s\n", bad[0], error.c_str());
        }
    }
    std::string dir = make_temp_dir();
    write_file(dir + "/bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"no end}\n");
    PrepareOptions options = quiet_options(1);
    options.out_prefix = dir + "/out";
    options.inputs = {dir + "/bad.jsonl"};
    CHECK(expect_exit_failure([&]() { prepare_shards(gpt2_tokenizer(), &options); },
                              (dir + "/bad.jsonl:3: bad JSON line: unterminated string").c_str()));
    remove_dir(dir);
}

TEST_MAIN()
