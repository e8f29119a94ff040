// The GPT-2 tokenizer from the bundled vocabulary, loaded once for all of a runner's tests.
#pragma once

#include "llmc/tokenizer.h"

static const char* kEncoderPath = "dev/data/gpt2_encoder.json";

static const Tokenizer& gpt2() {
    static const Tokenizer tok = [] {
        Tokenizer loaded;
        tokenizer_init(&loaded, kEncoderPath);
        return loaded;
    }();
    return tok;
}
