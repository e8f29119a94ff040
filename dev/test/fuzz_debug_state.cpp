// libFuzzer target for the reader of the reference's debug state, llmc/debug_state.h
// (debug_state_read): each input is a whole debug state, read for a tiny model (maxT 8, V 10,
// Vp 12, L 1, C 4) whose forward pass takes at most 16 rows. A rejected input must fail with
// FailError (built with -DFAIL_THROWS), never crash, allocate for a size the file does not hold
// (the Makefile caps a single allocation at 64 MB), leak or trip a sanitizer; an accepted one must
// be exactly the header and the arrays its header and the model give, with tokens in the
// vocabulary (checked below; a violation traps).
// Build and run from the repo root (seeds in dev/test/fuzz/debug_state/, made by test_debug_state):
//   clang++ -g -O1 -std=c++17 -I. -DFAIL_THROWS -fsanitize=fuzzer,address,undefined dev/test/fuzz_debug_state.cpp -o build/fuzz_debug_state
//   build/fuzz_debug_state -max_total_time=30 -max_len=4096 -malloc_limit_mb=64 dev/test/fuzz/debug_state/
#include <stddef.h>
#include <stdint.h>

#include "dev/test/fuzz_input.h"
#include "llmc/debug_state.h"

constexpr ModelShape MODEL = {.max_seq_len = 8, .vocab_size = 10, .padded_vocab_size = 12, .num_layers = 1,
                                  .num_heads = 1, .channels = 4, .attention = ATTENTION_SOFTMAX};
constexpr size_t MAX_ROWS = 16;

static void check_accepted(const DebugState& st, size_t size) {
    bool classic = st.version == DEBUG_STATE_CLASSIC;
    if (!classic && st.version != DEBUG_STATE_VERSION) { __builtin_trap(); }
    if (st.B < 1 || st.T < 1 || st.T > MODEL.max_seq_len || (size_t)st.B * st.T > MAX_ROWS) { __builtin_trap(); }
    if (classic ? st.num_steps != 0 : st.num_steps < 1 || st.B % st.shape.micro_batches != 0) { __builtin_trap(); }
    size_t BT = (size_t)st.B * st.T, V = MODEL.vocab_size, Vp = MODEL.padded_vocab_size;
    size_t P = count_parameters(&MODEL), columns = classic ? V : Vp, steps = st.num_steps;
    if (size != 4 * (256 + 2 * BT + BT * columns + 1 + P + 2 * steps)) { __builtin_trap(); }
    if (st.inputs.size() != BT || st.targets.size() != BT || st.logits.size() != BT * Vp || st.grads.size() != P) {
        __builtin_trap();
    }
    if (st.step_losses.size() != steps || st.grad_norms.size() != steps) { __builtin_trap(); }
    for (size_t i = 0; i < BT; i++) {
        if (st.inputs[i] < 0 || st.inputs[i] >= (int)V || st.targets[i] < 0 || st.targets[i] >= (int)V) {
            __builtin_trap();
        }
        for (size_t column = V; column < Vp; column++) {
            if (st.logits[i * Vp + column] != 0.0f) { __builtin_trap(); }
        }
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_path(data, size);
    try {
        DebugState st;
        debug_state_read(&st, path, &MODEL, MAX_ROWS);
        check_accepted(st, size);
    } catch (const FailError&) {
    }
    return 0;
}
