// Tests of the reader of the reference's debug state (llmc/debug_state.h), versions 4 and 2, and
// its refusal of hostile headers (huge or negative sizes and step counts) with a one-line error
// before it allocates for them.
// Run from the repo root: build/test_debug_state [name filter]
#include <limits.h>

#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/debug_state.h"

// ----------------------------------------------------------------------------
// helpers

constexpr ModelShape MODEL = {.max_seq_len = 8, .vocab_size = 10, .padded_vocab_size = 12, .num_layers = 1,
                                  .num_heads = 1, .channels = 4, .attention = ATTENTION_SOFTMAX};
constexpr size_t MAX_ROWS = 16;

template <typename T>
static void append(std::string* bytes, T value) { bytes->append((const char*)&value, sizeof(value)); }

static void set_int(std::string* bytes, int slot, int32_t value) { memcpy(&(*bytes)[4 * slot], &value, 4); }

// Every value is a function of its position, for the reader's output to be checked against.
static int input_at(size_t i) { return (int)(i % MODEL.vocab_size); }
static int target_at(size_t i) { return (int)((i + 3) % MODEL.vocab_size); }
static float logit_at(size_t row, size_t column) { return 0.5f * row - 0.01f * column; }
static float grad_at(size_t i) { return 1e-3f * i; }

// A debug state of `version` for MODEL: B x T tokens and, for version 4, `steps` AdamW steps.
static std::string state_bytes(int version, int B, int T, int steps = 2) {
    std::string bytes;
    bool classic = version == DEBUG_STATE_CLASSIC;
    int32_t head[8] = {DEBUG_STATE_MAGIC,         version,          B, T, MODEL.vocab_size,
                       MODEL.padded_vocab_size, MODEL.attention, steps};
    for (int i = 0; i < (classic ? 4 : 8); i++) { append(&bytes, head[i]); }
    if (!classic) {  // lr, beta1, beta2, eps, weight decay, micro-batches, clip, warmup, schedule, final fraction
        for (float value : {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}) { append(&bytes, value); }
        append(&bytes, (int32_t)2);
        append(&bytes, 1.5f);
        append(&bytes, (int32_t)3);
        append(&bytes, (int32_t)SCHEDULE_COSINE);
        append(&bytes, 0.1f);
    }
    bytes.resize(4 * DEBUG_STATE_HEADER_INTS, '\0');
    size_t BT = (size_t)B * T, columns = classic ? MODEL.vocab_size : MODEL.padded_vocab_size;
    for (size_t i = 0; i < BT; i++) { append(&bytes, (int32_t)input_at(i)); }
    for (size_t i = 0; i < BT; i++) { append(&bytes, (int32_t)target_at(i)); }
    for (size_t row = 0; row < BT; row++) {
        for (size_t column = 0; column < columns; column++) {
            append(&bytes, column < (size_t)MODEL.vocab_size ? logit_at(row, column) : 0.0f);
        }
    }
    append(&bytes, 2.25f);
    for (size_t i = 0; i < count_parameters(&MODEL); i++) { append(&bytes, grad_at(i)); }
    for (int s = 0; s < (classic ? 0 : steps); s++) { append(&bytes, 2.0f - 0.1f * s); }
    for (int s = 0; s < (classic ? 0 : steps); s++) { append(&bytes, 1.0f + s); }
    return bytes;
}

// The file of B=2, T=4 (and 2 steps) with these header slots (or ints past it) set.
static std::string with_slots(std::initializer_list<std::pair<int, int32_t>> slots, int version = DEBUG_STATE_VERSION) {
    std::string bytes = state_bytes(version, 2, 4);
    for (auto [slot, value] : slots) { set_int(&bytes, slot, value); }
    return bytes;
}

static void read_state(const char* path) {
    DebugState st;
    debug_state_read(&st, path, &MODEL, MAX_ROWS);
}

static bool refused(const std::string& bytes, const std::string& problem) {
    return file_refused_with(bytes, problem, read_state);
}

static DebugState read_bytes(const std::string& bytes) {
    std::string dir = make_temp_dir("test_debug_state");
    write_file(dir + "/state.bin", bytes);
    DebugState st;
    debug_state_read(&st, (dir + "/state.bin").c_str(), &MODEL, MAX_ROWS);
    remove_dir(dir);
    return st;
}

// The tokens, the logits (padded with zeros to Vp), the loss and the gradients of state_bytes.
static bool holds_the_written_values(const DebugState& st) {
    size_t BT = (size_t)st.B * st.T, Vp = MODEL.padded_vocab_size;
    bool same = st.inputs.size() == BT && st.targets.size() == BT && st.logits.size() == BT * Vp && st.loss == 2.25f &&
                st.grads.size() == count_parameters(&MODEL);
    for (size_t i = 0; same && i < BT; i++) { same = st.inputs[i] == input_at(i) && st.targets[i] == target_at(i); }
    for (size_t i = 0; same && i < BT * Vp; i++) {
        size_t row = i / Vp, column = i % Vp;
        same = st.logits[i] == (column < (size_t)MODEL.vocab_size ? logit_at(row, column) : 0.0f);
    }
    for (size_t i = 0; same && i < st.grads.size(); i++) { same = st.grads[i] == grad_at(i); }
    return same;
}

// ----------------------------------------------------------------------------
// reading

TEST(version_4_with_steps) {
    DebugState st = read_bytes(state_bytes(DEBUG_STATE_VERSION, 2, 4, 3));
    CHECK(st.version == 4 && st.B == 2 && st.T == 4 && st.num_steps == 3);
    CHECK(holds_the_written_values(st));
    CHECK(st.step_losses == std::vector<float>({2.0f, 1.9f, 1.8f}));
    CHECK(st.grad_norms == std::vector<float>({1.0f, 2.0f, 3.0f}));
    const RunShape* r = &st.shape;
    CHECK(r->lr == 1e-3f && r->beta1 == 0.9f && r->beta2 == 0.95f && r->eps == 1e-8f && r->weight_decay == 0.1f);
    CHECK(r->micro_batches == 2 && r->grad_clip == 1.5f && r->warmup_steps == 3 && r->schedule == SCHEDULE_COSINE);
    CHECK(r->final_lr_frac == 0.1f && r->max_steps == 3);
}

TEST(classic_version_2) {
    DebugState st = read_bytes(state_bytes(DEBUG_STATE_CLASSIC, 4, 4));
    CHECK(st.version == 2 && st.B == 4 && st.T == 4 && st.num_steps == 0 && st.shape.micro_batches == 1);
    CHECK(holds_the_written_values(st));
    CHECK(st.step_losses.empty() && st.grad_norms.empty());
}

// ----------------------------------------------------------------------------
// refusals: each a one-line error naming the file, before any allocation for the sizes

TEST(hostile_sizes) {
    CHECK(refused(with_slots({{2, INT_MAX}, {3, INT_MAX}}),
                  "B=2147483647 T=2147483647 do not fit the model (maxT 8, B*T at most 16)"));
    CHECK(refused(with_slots({{2, -1}}), "B=-1 T=4 do not fit the model"));
    CHECK(refused(with_slots({{2, 0}}), "B=0 T=4 do not fit the model"));
    CHECK(refused(with_slots({{3, 0}}), "B=2 T=0 do not fit the model"));
    CHECK(refused(with_slots({{3, 9}}), "B=2 T=9 do not fit the model (maxT 8"));
    CHECK(refused(with_slots({{2, 3}, {3, 8}}), "B=3 T=8 do not fit the model (maxT 8, B*T at most 16)"));
}

TEST(hostile_steps) {
    for (int steps : {INT_MAX, DEBUG_STATE_MAX_STEPS + 1, 0, -5, INT_MIN}) {
        CHECK(refused(with_slots({{7, steps}}), std::to_string(steps) + " steps, expected 1..10000"));
    }
    CHECK(refused(with_slots({{13, 0}}), "bad accumulation 0 (must divide B=2) or schedule 0"));
    CHECK(refused(with_slots({{13, 3}}), "bad accumulation 3 (must divide B=2)"));
    CHECK(refused(with_slots({{16, -1}}), "bad accumulation 2 (must divide B=2) or schedule -1"));
}

TEST(another_model_or_format) {
    CHECK(refused(with_slots({{4, 11}}), "V=11 Vp=12 attention=0, but the model has V=10 Vp=12 attention=0"));
    CHECK(refused(with_slots({{6, ATTENTION_RELU}}),
                  "V=10 Vp=12 attention=1, but the model has V=10 Vp=12 attention=0"));
    CHECK(refused(with_slots({{0, 20240326}}), "bad magic 20240326, expected 20240327 (not a debug state file)"));
    CHECK(refused(with_slots({{1, 3}}), "version 3 not supported, expected 4 (train_gpt2.py) or 2 (classic)"));
}

TEST(wrong_file_size) {
    std::string good = state_bytes(DEBUG_STATE_VERSION, 2, 4);
    std::string expected = "expected " + std::to_string(good.size()) + " for this model and header";
    CHECK(refused(good.substr(0, 1000), "shorter than its 1024-byte header (truncated)"));
    CHECK(refused("", "shorter than its 1024-byte header (truncated)"));
    CHECK(refused(good.substr(0, good.size() - 1), std::to_string(good.size() - 1) + " bytes, " + expected));
    CHECK(refused(good + "xxxx", std::to_string(good.size() + 4) + " bytes, " + expected));
    CHECK(refused(state_bytes(DEBUG_STATE_CLASSIC, 2, 4).substr(0, 1024), "1024 bytes, expected"));
}

TEST(tokens_outside_the_vocabulary) {
    CHECK(refused(with_slots({{DEBUG_STATE_HEADER_INTS + 3, MODEL.vocab_size}}),  // the fourth input
                  "token at position 3 is outside [0, 10)"));
    CHECK(refused(with_slots({{DEBUG_STATE_HEADER_INTS + 8 + 7, -1}}, DEBUG_STATE_CLASSIC),  // the last target
                  "token at position 7 is outside [0, 10)"));
}

// ----------------------------------------------------------------------------
// the fuzz target's seeds

// dev/test/fuzz/debug_state/, read by fuzz_debug_state for MODEL and MAX_ROWS: valid files of both
// versions and a few hostile ones. UPDATE_SEEDS=1 build/test_debug_state seeds rewrites them.
static std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    return {{"version_4.bin", state_bytes(DEBUG_STATE_VERSION, 2, 4)},
            {"version_4_short.bin", state_bytes(DEBUG_STATE_VERSION, 2, 1, 1)},
            {"classic.bin", state_bytes(DEBUG_STATE_CLASSIC, 4, 4)},
            {"huge_steps.bin", with_slots({{7, INT_MAX}})},
            {"bad_token.bin", with_slots({{DEBUG_STATE_HEADER_INTS, 10}}, DEBUG_STATE_CLASSIC)}};
}

TEST(fuzz_seeds_are_current) { CHECK(fuzz_seeds_committed("debug_state", fuzz_seeds())); }

TEST_MAIN()
