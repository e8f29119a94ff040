// A generation's prompt as token ids: --prompt's text or --prompt-file's bytes, encoded with the
// GPT-2 tokenizer; an empty prompt is <|endoftext|> alone (generation starts from a document's
// beginning), and every id must be inside the model's vocabulary.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <string>
#include <vector>

#include "llmc/tokenizer.h"
#include "llmc/utils.h"

// The text of --prompt (text, or nullptr) or of --prompt-file (file, or nullptr).
static inline std::string prompt_text(const char* text, const char* file) {
    if (file == nullptr) { return text != nullptr ? text : ""; }
    std::string bytes(std::max<int64_t>(file_size(file), 0), '\0');
    FILE* f = fopen_or_fail(file, "rb");
    fread_or_fail(&bytes[0], 1, bytes.size(), f, file);
    fclose(f);
    return bytes;
}

// The prompt's token ids; fails naming the flag if one is outside a vocabulary of vocab_size.
static inline std::vector<int> encode_prompt(const char* text, const char* file, const Tokenizer* tokenizer,
                                             int vocab_size) {
    std::string prompt = prompt_text(text, file);
    std::vector<uint32_t> ids;
    tokenizer_encode(tokenizer, prompt.data(), prompt.size(), &ids);
    if (ids.empty()) { ids.push_back(tokenizer->eot_token); }
    for (uint32_t id : ids) {
        if (id >= (uint32_t)vocab_size) {
            fail("flag %s: token %u of the prompt is outside the model's vocabulary of %d",
                 file != nullptr ? "--prompt-file" : "--prompt", id, vocab_size);
        }
    }
    return std::vector<int>(ids.begin(), ids.end());
}
