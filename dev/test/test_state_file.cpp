// Tests of the run-state file of a checkpoint (llmc/state_file.h): the round trip, the layout slot
// by slot, slices of the moments read in chunks of any size, and a one-line problem naming the
// file for every defect (never an exit: a resume falls back to an older checkpoint).
// Run from the repo root: build/test_state_file [name filter]
#include <math.h>

#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/state_file.h"
#include "llmc/zero.h"

// ----------------------------------------------------------------------------
// helpers

constexpr int STEP = 12;

// A state of P parameters after STEP steps: varied finite moments, a window of a few norms.
static RunState sample_state(size_t P) {
    RunState s = {};
    s.step = STEP;
    s.adam_step = STEP - 1;  // one step skipped
    s.shape = RunShape{.B = 4,
                       .T = 64,
                       .micro_batches = 8,
                       .max_steps = 100,
                       .warmup_steps = 3,
                       .schedule = SCHEDULE_COSINE,
                       .attention = ATTENTION_SOFTMAX,
                       .precision = 1,
                       .overfit_single_batch = 0,
                       .lr = 6e-4f,
                       .final_lr_frac = 0.1f,
                       .weight_decay = 0.1f,
                       .beta1 = 0.9f,
                       .beta2 = 0.95f,
                       .eps = 1e-8f,
                       .grad_clip = 1.0f,
                       .seed = 7,
                       .spike_z = 6.0f,
                       .spike_window = 8};
    s.loader = DataLoaderState{.epoch = 2,
                               .shard_index = 1,
                               .batch_index = 5,
                               .seed = 7,
                               .num_shards = 3,
                               .num_tokens = 123456,
                               .B = 4,
                               .T = 64,
                               .micro_batches = 8,
                               .shuffle = 1};
    outlier_init(&s.recent_norms, 8);
    for (double norm : {1.5, 1.25, 1.75}) { outlier_push(&s.recent_norms, norm); }
    for (size_t i = 0; i < P; i++) {
        s.m.push_back((float)((int)(i * 37 % 101) - 50) * 1e-5f);
        s.v.push_back(s.m.back() * s.m.back() + 1e-12f);
    }
    return s;
}

// A new directory holding the state file's path, removed with it.
struct Scratch {
    std::string dir = make_temp_dir("test_state_file");
    std::string path = dir + "/state_00000012.bin";
    ~Scratch() { remove_dir(dir); }
};

static std::string file_bytes(const RunState& s) {
    Scratch scratch;
    state_file_write(scratch.path.c_str(), &s);
    return read_file(scratch.path);
}

static void set_slot(std::string* bytes, int slot, int32_t value) { memcpy(&(*bytes)[4 * slot], &value, 4); }

static void set_float(std::string* bytes, size_t offset, float value) { memcpy(&(*bytes)[offset], &value, 4); }

// The byte offset of moment k (0 m, 1 v) of parameter i in a file of P parameters.
static size_t moment_offset(int k, size_t i, size_t P) { return STATE_HEADER_BYTES + 4 * (k * P + i); }

// Puts the right checksum in slot 4, so that a defect planted before is the only one.
static void reseal(std::string* bytes) {
    set_slot(bytes, STATE_CHECKSUM_SLOT, 0);
    set_slot(bytes, STATE_CHECKSUM_SLOT, (int32_t)crc32c_update(0, bytes->data(), bytes->size()));
}

// Loads `bytes` as the state file of step STEP for P parameters, keeping [begin, end); the problem
// ("" if it loads). A problem must be one line and a load must report one exactly when it fails.
static std::string load_bytes(const std::string& bytes, size_t P, RunState* s, size_t begin, size_t end,
                              size_t chunk = STATE_CHUNK_FLOATS) {
    Scratch scratch;
    write_file(scratch.path, bytes);
    std::string problem;
    bool ok = state_file_load(scratch.path.c_str(), STEP, P, begin, end, s, &problem, chunk);
    if (ok != problem.empty() || problem.find('\n') != std::string::npos) { return "not one line: " + problem; }
    return problem;
}

// Whether `bytes` is refused for P parameters with "<path>: ..." holding `fragment`.
static bool refused_with(const std::string& bytes, size_t P, const std::string& fragment) {
    RunState s;
    std::string problem = load_bytes(bytes, P, &s, 0, P);
    bool ok = problem.rfind("/tmp/test_state_file_", 0) == 0 &&
              problem.find("/state_00000012.bin: ") != std::string::npos && problem.find(fragment) != std::string::npos;
    if (!ok) { fprintf(stderr, "  expected a problem with \"%s\", got \"%s\"\n", fragment.c_str(), problem.c_str()); }
    return ok;
}

static bool same_bytes(const void* a, const void* b, size_t n) { return memcmp(a, b, n) == 0; }

// ----------------------------------------------------------------------------
// writing and reading back

TEST(round_trip) {
    for (size_t P : {0, 1, 10, 1000}) {
        RunState written = sample_state(P), read;
        CHECK(load_bytes(file_bytes(written), P, &read, 0, P).empty());
        CHECK(read.step == written.step && read.adam_step == written.adam_step);
        CHECK(same_bytes(&read.shape, &written.shape, sizeof(RunShape)));
        CHECK(same_bytes(&read.loader, &written.loader, sizeof(DataLoaderState)));
        CHECK(same_bytes(&read.recent_norms, &written.recent_norms, sizeof(OutlierWindow)));
        CHECK(read.m == written.m && read.v == written.v);
    }
}

// The layout the trainer has always written (magic, version 3, the slots), built here by hand:
// the checkpoints of earlier runs still load.
TEST(layout_of_version_3) {
    const size_t P = 10;
    RunState s = sample_state(P);
    std::string expected(1024 + 8 * P, '\0');
    int32_t first[4] = {20240417, 3, STEP, STEP - 1};
    memcpy(&expected[0], first, sizeof(first));
    memcpy(&expected[16 * 4], &s.shape, sizeof(s.shape));
    memcpy(&expected[64 * 4], &s.loader, sizeof(s.loader));
    memcpy(&expected[112 * 4], &s.recent_norms, sizeof(s.recent_norms));
    memcpy(&expected[1024], s.m.data(), 4 * P);
    memcpy(&expected[1024 + 4 * P], s.v.data(), 4 * P);
    uint32_t crc = crc32c_update(crc32c_update(0, expected.data(), 1024), expected.data() + 1024, 8 * P);
    set_slot(&expected, 4, (int32_t)crc);
    CHECK(file_bytes(s) == expected);
}

// Each slice [begin, end), read in chunks of each size, holds exactly those moments.
TEST(slices_in_any_chunks) {
    const size_t P = 1000;
    RunState written = sample_state(P);
    std::string bytes = file_bytes(written);
    std::vector<std::pair<size_t, size_t>> slices = {{0, 0}, {0, 1}, {0, P}, {5, 17}, {63, 65}, {P - 3, P}, {P, P}};
    for (int world = 1; world <= 5; world++) {
        for (int rank = 0; rank < world; rank++) {
            ZeroShard shard = zero_shard(P, rank, world);
            slices.push_back({shard.begin, shard.end});
        }
    }
    bool all_same = true;
    for (size_t chunk : {(size_t)1, (size_t)7, (size_t)64, P - 1, P, STATE_CHUNK_FLOATS}) {
        for (auto [begin, end] : slices) {
            RunState read;
            bool loaded = load_bytes(bytes, P, &read, begin, end, chunk).empty();
            std::vector<float> m(written.m.begin() + begin, written.m.begin() + end);
            std::vector<float> v(written.v.begin() + begin, written.v.begin() + end);
            all_same = all_same && loaded && read.m == m && read.v == v;
        }
    }
    CHECK(all_same);
}

// A checkpoint never holds a non-finite moment: the previous files are kept.
TEST(write_refuses_non_finite_moments) {
    Scratch scratch;
    RunState s = sample_state(10);
    state_file_write(scratch.path.c_str(), &s);
    std::string before = read_file(scratch.path);
    s.v[3] = INFINITY;
    CHECK(expect_exit_failure([&] { state_file_write(scratch.path.c_str(), &s); },
                              (scratch.path + ": not written, AdamW's v[3] is not finite").c_str()));
    s.m[9] = NAN;
    CHECK(expect_exit_failure([&] { state_file_write(scratch.path.c_str(), &s); }, "AdamW's m[9] is not finite"));
    s.m.pop_back();
    CHECK(expect_exit_failure([&] { state_file_write(scratch.path.c_str(), &s); }, "m holds 9 moments and v 10"));
    CHECK(read_file(scratch.path) == before);
    CHECK(remove_stale_temp_files(scratch.dir.c_str()) == 0);
}

TEST(slice_outside_the_parameters_is_a_caller_error) {
    RunState s;
    std::string problem;
    CHECK(expect_exit_failure([&] { state_file_load("unused", STEP, 10, 4, 11, &s, &problem); },
                              "state_file_load: slice [4, 11) of 10 parameters"));
    CHECK(expect_exit_failure([&] { state_file_load("unused", STEP, 10, 5, 4, &s, &problem); }, "slice [5, 4)"));
}

// ----------------------------------------------------------------------------
// defects: each a one-line problem naming the file

TEST(missing_file) {
    RunState s;
    std::string problem;
    CHECK(!state_file_load("/nonexistent/state_00000012.bin", STEP, 10, 0, 10, &s, &problem, 4));
    CHECK(problem == "cannot open /nonexistent/state_00000012.bin: No such file or directory");
}

TEST(header_defects) {
    const size_t P = 10;
    std::string good = file_bytes(sample_state(P));
    std::string bytes = good;
    set_slot(&bytes, 0, 20240326);
    CHECK(refused_with(bytes, P, "magic 20240326 version 3, expected 20240417 version 3"));
    bytes = good;
    set_slot(&bytes, 1, 2);
    CHECK(refused_with(bytes, P, "magic 20240417 version 2, expected 20240417 version 3"));
    bytes = good;
    set_slot(&bytes, 2, STEP - 1);
    CHECK(refused_with(bytes, P, "holds step 11, expected 12"));
    CHECK(refused_with(good, P + 1,
                       "1104 bytes, expected 1112 for a model of 11 parameters (truncated, or a smaller model's)"));
    CHECK(refused_with(good, P - 1, "1104 bytes, expected 1096 for a model of 9 parameters (a larger model's)"));
}

// Cut anywhere, a file is refused as truncated.
TEST(truncated_anywhere) {
    const size_t P = 10;
    std::string good = file_bytes(sample_state(P));
    for (size_t cut : {(size_t)0, (size_t)1, (size_t)4, (size_t)1023}) {
        std::string problem = std::to_string(cut) + " bytes, shorter than its 1024-byte header (truncated)";
        CHECK(refused_with(good.substr(0, cut), P, problem));
    }
    for (size_t cut : {(size_t)1024, (size_t)1025, (size_t)1024 + 4 * P, good.size() - 1}) {
        std::string problem = std::to_string(cut) + " bytes, expected 1104 for a model of 10 parameters (truncated";
        CHECK(refused_with(good.substr(0, cut), P, problem));
    }
}

// Every single flipped byte is caught: by the checksum, or first by the slot it lands in.
TEST(flipped_byte_anywhere) {
    const size_t P = 8;
    std::string good = file_bytes(sample_state(P));
    int caught = 0, by_checksum = 0;
    for (size_t i = 0; i < good.size(); i++) {
        std::string bytes = good;
        bytes[i] ^= 0x5a;
        RunState s;
        std::string problem = load_bytes(bytes, P, &s, 0, P);
        caught += problem.empty() ? 0 : 1;
        by_checksum += problem.find("(the file is corrupt)") != std::string::npos ? 1 : 0;
    }
    CHECK(caught == (int)good.size());
    CHECK(by_checksum == (int)good.size() - 12);  // all but the magic, version and step slots
    std::string bytes = good;
    bytes[moment_offset(1, 5, P)] ^= 1;
    CHECK(refused_with(bytes, P, "checksum "));
    CHECK(refused_with(bytes, P, "(the file is corrupt)"));
}

// A NaN or Inf that the checksum covers (a writer's bug, not damage): named, first in file order.
TEST(non_finite_moments_named) {
    const size_t P = 1000;
    std::string good = file_bytes(sample_state(P));
    std::string bytes = good;
    set_float(&bytes, moment_offset(0, 777, P), NAN);
    reseal(&bytes);
    CHECK(refused_with(bytes, P, "AdamW's m[777] is not finite"));
    bytes = good;
    set_float(&bytes, moment_offset(1, 0, P), -INFINITY);
    set_float(&bytes, moment_offset(1, 999, P), NAN);
    reseal(&bytes);
    CHECK(refused_with(bytes, P, "AdamW's v[0] is not finite"));
    set_float(&bytes, moment_offset(0, 999, P), INFINITY);
    reseal(&bytes);
    CHECK(refused_with(bytes, P, "AdamW's m[999] is not finite"));
    RunState s;  // found wherever the slice and the chunks lie
    CHECK(load_bytes(bytes, P, &s, 0, 10, 7).find("AdamW's m[999] is not finite") != std::string::npos);
}

// Slots only a writer's bug could get wrong (the checksum covers them).
TEST(run_slots_checked) {
    const size_t P = 10;
    RunState s = sample_state(P);
    s.adam_step = STEP + 1;
    CHECK(refused_with(file_bytes(s), P, "AdamW's step 13 is outside [0, 12] (the steps done)"));
    s.adam_step = -1;
    CHECK(refused_with(file_bytes(s), P, "AdamW's step -1 is outside [0, 12]"));
    s = sample_state(P);
    s.recent_norms.next = 7;  // 3 values, so the ring's next slot is 3
    CHECK(refused_with(file_bytes(s), P, "the spike guard's window is malformed"));
    s.recent_norms.next = 3;
    s.recent_norms.values[1] = NAN;
    CHECK(refused_with(file_bytes(s), P, "the spike guard's window is malformed"));
}

// ----------------------------------------------------------------------------
// the fuzz target's seeds

// dev/test/fuzz/state_file/, read by fuzz_state_file as step 12's of 64 parameters: valid files and
// one of each defect. UPDATE_SEEDS=1 build/test_state_file seeds rewrites them.
static std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    const size_t P = 64;
    std::string valid = file_bytes(sample_state(P));
    RunState full = sample_state(P);
    for (int i = 0; i < 10; i++) { outlier_push(&full.recent_norms, 1.0 + 0.1 * i); }
    std::string nan_in_v = valid, wrong_step = valid, flipped = valid;
    set_float(&nan_in_v, moment_offset(1, 40, P), NAN);
    reseal(&nan_in_v);
    set_slot(&wrong_step, 2, STEP + 1);
    flipped[moment_offset(0, 3, P)] ^= 0x10;
    return {{"valid.bin", valid}, {"full_window.bin", file_bytes(full)}, {"nan_in_v.bin", nan_in_v},
            {"wrong_step.bin", wrong_step}, {"flipped.bin", flipped}, {"truncated.bin", valid.substr(0, 1124)}};
}

TEST(fuzz_seeds_are_current) { CHECK(fuzz_seeds_committed("state_file", fuzz_seeds())); }

TEST_MAIN()
