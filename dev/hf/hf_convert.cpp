// Converts GPT-2 models between the classic model file (what train_gpt2_fp32 reads and writes) and
// Hugging Face's format (a directory with config.json and model.safetensors, and the tokenizer's
// vocab.json and merges.txt), through llmc/gpt2_hf.h.
//   hf_convert export MODEL.bin DIR [--vocab PATH]   for transformers: GPT2LMHeadModel.from_pretrained(DIR)
//   hf_convert import HF_MODEL MODEL.bin             HF_MODEL: a directory, or its model.safetensors
#include <string.h>

#include <string>
#include <vector>

#include "llmc/gpt2_hf.h"
#include "llmc/model_file.h"
#include "llmc/paths.h"
#include "llmc/tokenizer.h"

static const char* const USAGE =
    "usage: hf_convert export MODEL.bin DIR [--vocab PATH]   a model file to a Hugging Face GPT-2 directory\n"
    "       hf_convert import HF_MODEL MODEL.bin             a Hugging Face GPT-2 (directory or .safetensors)\n"
    "                                                        to a model file\n";

int main(int argc, char** argv) {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("%s", USAGE);
        return 0;
    }
    const char* vocab = NULL;
    std::vector<const char*> args;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--vocab") == 0) {
            if (i + 1 >= argc) { fail("flag --vocab needs a value"); }
            vocab = argv[++i];
        } else {
            args.push_back(argv[i]);
        }
    }
    if (args.size() != 3) { fail("expected a mode and two paths\n%s", USAGE); }
    ModelShape shape;
    std::vector<float> params;
    if (strcmp(args[0], "export") == 0) {
        model_file_read(args[1], &shape, &params);
        Tokenizer tok;
        tokenizer_init(&tok, find_bundled_file("dev/data/gpt2_encoder.json", vocab, "--vocab").c_str());
        bool gpt2_vocab = (int)tok.vocab_size == shape.vocab_size;  // else the model has its own vocabulary
        gpt2_to_hf(args[2], &shape, params.data(), gpt2_vocab ? &tok : NULL);
        tokenizer_free(&tok);
        printf("wrote %s (config.json, model.safetensors%s) from %s\n", args[2],
               gpt2_vocab ? ", vocab.json, merges.txt" : "; no tokenizer: the model's vocabulary is not GPT-2's", args[1]);
    } else if (strcmp(args[0], "import") == 0) {
        gpt2_from_hf(args[1], &shape, &params);
        model_file_write(args[2], &shape, params.data());
        printf("wrote %s (L=%d NH=%d C=%d V=%d, %s attention) from %s\n", args[2], shape.num_layers, shape.num_heads,
               shape.channels, shape.vocab_size, shape.attention == MODEL_ATTENTION_RELU ? "relu" : "softmax", args[1]);
    } else {
        fail("unknown mode %s\n%s", args[0], USAGE);
    }
    return 0;
}
