// Converts GPT-2 models between the classic model file (what train_gpt2_fp32 reads and writes) and
// Hugging Face's format (a directory with config.json and model.safetensors, and the tokenizer's
// vocab.json and merges.txt), through llmc/gpt2_hf.h.
//   hf_convert export MODEL.bin DIR [--vocab PATH] [--force]   for transformers: GPT2LMHeadModel.from_pretrained(DIR)
//   hf_convert import HF_MODEL MODEL.bin [--force]             HF_MODEL: a directory, or its model.safetensors
// An existing output is replaced only with --force, and never when it is one of the inputs
// (llmc/outputs.h).
#include <string.h>

#include <string>
#include <vector>

#include "llmc/gpt2_hf.h"
#include "llmc/model_file.h"
#include "llmc/outputs.h"
#include "llmc/paths.h"
#include "llmc/tokenizer.h"

constexpr const char* USAGE =
    "usage: hf_convert export MODEL.bin DIR [--vocab PATH]   a model file to a Hugging Face GPT-2 directory\n"
    "       hf_convert import HF_MODEL MODEL.bin             a Hugging Face GPT-2 (directory or .safetensors)\n"
    "                                                        to a model file\n"
    "       --force                                          replace existing outputs (never an input)\n";

struct ConvertArgs {
    std::vector<const char*> positional;  // the mode and two paths
    const char* vocab = nullptr;          // --vocab
    bool force = false;                   // --force
};

static ConvertArgs parse_convert_args(int argc, char** argv) {
    ConvertArgs args;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--vocab") == 0) {
            if (i + 1 >= argc) { fail("flag --vocab needs a value"); }
            args.vocab = argv[++i];
        } else if (strcmp(argv[i], "--force") == 0) {
            args.force = true;
        } else {
            args.positional.push_back(argv[i]);
        }
    }
    if (args.positional.size() != 3) { fail("expected a mode and two paths\n%s", USAGE); }
    return args;
}

static void export_model(const char* model_path, const char* dir, const ConvertArgs& args) {
    ModelShape shape;
    std::vector<float> params;
    model_file_read(model_path, &shape, &params);
    std::string vocab = find_bundled_file("dev/data/gpt2_encoder.json", args.vocab, "--vocab");
    Tokenizer tok;
    tokenizer_init(&tok, vocab.c_str());
    bool gpt2_vocab = (int)tok.vocab_size == shape.vocab_size;  // else the model has its own vocabulary
    outputs_allowed_or_fail(hf_written_files(dir, gpt2_vocab), {model_path, vocab}, args.force);
    gpt2_to_hf(dir, &shape, params.data(), gpt2_vocab ? &tok : nullptr);
    tokenizer_free(&tok);
    printf("wrote %s (config.json, model.safetensors%s) from %s\n", dir,
           gpt2_vocab ? ", vocab.json, merges.txt" : "; no tokenizer: the model's vocabulary is not GPT-2's", model_path);
}

static void import_model(const char* hf_path, const char* model_path, const ConvertArgs& args) {
    std::vector<std::string> inputs = {hf_model_dir(hf_path) + "/config.json", hf_weights_path(hf_path)};
    outputs_allowed_or_fail({model_path}, inputs, args.force);
    ModelShape shape;
    std::vector<float> params;
    gpt2_from_hf(hf_path, &shape, &params);
    model_file_write(model_path, &shape, params.data());
    printf("wrote %s (L=%d NH=%d C=%d V=%d, %s attention) from %s\n", model_path, shape.num_layers, shape.num_heads,
           shape.channels, shape.vocab_size, attention_name(shape.attention), hf_path);
}

int main(int argc, char** argv) {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("%s", USAGE);
        return 0;
    }
    ConvertArgs args = parse_convert_args(argc, argv);
    const char* mode = args.positional[0];
    if (strcmp(mode, "export") == 0) {
        export_model(args.positional[1], args.positional[2], args);
    } else if (strcmp(mode, "import") == 0) {
        import_model(args.positional[1], args.positional[2], args);
    } else {
        fail("unknown mode %s\n%s", mode, USAGE);
    }
    return 0;
}
