// The GPT-2 tokenizer from the bundled vocabulary, loaded once for all of a runner's tests.
#pragma once

#include "llmc/tokenizer.h"

constexpr const char* ENCODER_PATH = "dev/data/gpt2_encoder.json";

static const Tokenizer& gpt2() {
    static const Tokenizer tok = [] {
        Tokenizer loaded;
        tokenizer_init(&loaded, ENCODER_PATH);
        return loaded;
    }();
    return tok;
}
