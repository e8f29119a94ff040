// CPU tests of llmc/prompt.h with the bundled GPT-2 vocabulary: --prompt's text and --prompt-file's
// bytes give the same ids, an empty prompt is <|endoftext|>, an unreadable file and an id outside
// the model's vocabulary are refused naming the flag. Run from the repository root.
#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/gpt2_tokenizer.h"
#include "dev/test/testing.h"
#include "llmc/prompt.h"

TEST(text_and_file_give_the_same_ids) {
    CHECK(encode_prompt("Hello world", nullptr, &gpt2(), 50257) == std::vector<int>({15496, 995}));
    std::string dir = make_temp_dir("test_prompt");
    write_file(dir + "/prompt.txt", "Hello world");
    CHECK(encode_prompt(nullptr, (dir + "/prompt.txt").c_str(), &gpt2(), 50257) == std::vector<int>({15496, 995}));
    remove_dir(dir);
}

TEST(empty_prompt_is_end_of_text) {
    CHECK(encode_prompt("", nullptr, &gpt2(), 50257) == std::vector<int>({50256}));
    CHECK(encode_prompt(nullptr, "/dev/null", &gpt2(), 50257) == std::vector<int>({50256}));
}

TEST(ids_outside_the_vocabulary_are_refused) {
    CHECK(expect_exit_failure([] { encode_prompt("Hello world", nullptr, &gpt2(), 1000); },
                              "error: flag --prompt: token 15496 of the prompt is outside the model's vocabulary of 1000"));
    CHECK(expect_exit_failure([] { encode_prompt("", "/dev/null", &gpt2(), 256); },
                              "error: flag --prompt-file: token 50256 of the prompt is outside the model's vocabulary of 256"));
    CHECK(expect_exit_failure([] { encode_prompt(nullptr, "/nonexistent/prompt.txt", &gpt2(), 50257); },
                              "/nonexistent/prompt.txt"));
}

TEST_MAIN()
