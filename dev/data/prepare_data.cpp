// prepare_data: GPT-2 tokenization and token shards.
//   ./prepare_data encode FILE        token ids of FILE's bytes, on one line
//   ./prepare_data decode             ids from stdin, their bytes to stdout
//   ./prepare_data tinyshakespeare [-o DIR] [--force] [--threads N]
//       dev/data/tiny_shakespeare.txt -> DIR/tiny_shakespeare_{val,train}.bin
//       (DIR: dev/data/tinyshakespeare under the current directory unless -o says otherwise)
//   ./prepare_data shards -o OUT_PREFIX [--shard-size N] [--threads N] [--force] INPUT...
//       INPUT: a .txt file (one document), a .jsonl file (one document per line, its "text"
//       field) or a directory (its .txt and .jsonl files, recursively, sorted by path).
//       Writes OUT_PREFIX_val_000000.bin, then OUT_PREFIX_train_000001.bin, ...; inputs that
//       do not fill the validation shard and give at least one token more are refused.
// Every mode takes --vocab PATH. The bundled vocabulary and tiny Shakespeare text are found
// from any current directory (llmc/paths.h); outputs are relative to the current directory.
#include "dev/data/prepare_data.h"
#include "llmc/paths.h"

constexpr const char* ENCODER_PATH = "dev/data/gpt2_encoder.json";
constexpr const char* TINYSHAKESPEARE_TEXT = "dev/data/tiny_shakespeare.txt";
constexpr const char* TINYSHAKESPEARE_DIR = "dev/data/tinyshakespeare";

constexpr const char* USAGE =
    "usage: ./prepare_data encode FILE | decode | tinyshakespeare [-o DIR] [--force] [--threads N] | "
    "shards -o OUT_PREFIX [--shard-size N] [--threads N] [--force] INPUT...; every mode takes [--vocab PATH]";

[[noreturn]] static void usage_error(const char* problem, const char* arg) {
    fprintf(stderr, "%s\n", USAGE);
    fail("%s%s", problem, arg);
}

static int64_t parse_positive(const char* flag, const char* text, int64_t max) {
    char* end = nullptr;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || value <= 0 || value > max) {
        fprintf(stderr, "%s\n", USAGE);
        fail("%s needs an integer in [1, %lld], got \"%s\"", flag, (long long)max, text);
    }
    return value;
}

static int default_threads(void) {
    unsigned cores = std::thread::hardware_concurrency();
    return cores > 0 ? (int)cores : 1;
}

// Takes "--vocab PATH" out of the arguments after the mode; returns PATH, or nullptr if not given.
static const char* take_vocab_flag(int* argc, char** argv) {
    const char* vocab = nullptr;
    int kept = 2;
    for (int i = 2; i < *argc; i++) {
        if (strcmp(argv[i], "--vocab") != 0) {
            argv[kept++] = argv[i];
        } else if (i + 1 < *argc) {
            vocab = argv[++i];
        } else {
            usage_error("--vocab needs a PATH", "");
        }
    }
    *argc = kept;
    return vocab;
}

// Parses the flags of the tinyshakespeare and shards modes (argv[2] onwards, --vocab taken out).
static PrepareOptions parse_options(int argc, char** argv, bool allow_inputs) {
    PrepareOptions options;
    options.threads = default_threads();
    for (int i = 2; i < argc; i++) {
        std::string arg = argv[i];
        bool has_value = i + 1 < argc;
        if (arg == "--force") {
            options.force = true;
        } else if (arg == "--threads" && has_value) {
            options.threads = (int)parse_positive("--threads", argv[++i], 1024);
        } else if (arg == "--shard-size" && has_value && allow_inputs) {
            options.shard_size = parse_positive("--shard-size", argv[++i], INT32_MAX);
        } else if (arg == "-o" && has_value) {
            options.out_prefix = argv[++i];
        } else if (allow_inputs && arg[0] != '-') {
            options.inputs.push_back(arg);
        } else {
            usage_error("bad argument: ", argv[i]);
        }
    }
    if (allow_inputs && options.out_prefix.empty()) { usage_error("shards needs -o OUT_PREFIX", ""); }
    if (allow_inputs && options.inputs.empty()) { usage_error("shards needs at least one INPUT", ""); }
    return options;
}

int main(int argc, char** argv) {
    if (argc < 2) { usage_error("no mode given", ""); }
    std::string mode = argv[1];
    if (mode == "-h" || mode == "--help") {
        printf("%s\n"
               "  encode FILE       print the token ids of FILE's bytes on one line\n"
               "  decode            read ids from standard input, write their bytes\n"
               "  tinyshakespeare   write DIR/tiny_shakespeare_{val,train}.bin from the bundled tiny Shakespeare\n"
               "                    (-o DIR; default %s under the current directory)\n"
               "  shards            .txt files (a document each) and .jsonl files (a document per line, its\n"
               "                    \"text\") from the INPUT files and directories (recursively, sorted), each\n"
               "                    document after <|endoftext|>, into OUT_PREFIX_val_000000.bin (the first\n"
               "                    shard) and OUT_PREFIX_train_NNNNNN.bin of --shard-size tokens (default 1e8);\n"
               "                    the inputs must give more tokens than one shard\n"
               "  --threads N       encoding threads (output identical for any N)\n"
               "  --force           overwrite existing outputs\n"
               "  --vocab PATH      the vocabulary (default: the bundled %s, looked for under\n"
               "                    the current directory, this program's directory and the two above it,\n"
               "                    then the source tree it was built from)\n",
               USAGE, TINYSHAKESPEARE_DIR, ENCODER_PATH);
        return 0;
    }
    const char* vocab_flag = take_vocab_flag(&argc, argv);
    bool known = mode == "encode" || mode == "decode" || mode == "tinyshakespeare" || mode == "shards";
    if (!known) { usage_error("unknown mode: ", argv[1]); }
    if (mode == "encode" && argc != 3) { usage_error("encode takes one FILE", ""); }
    if (mode == "decode" && argc != 2) { usage_error("decode takes no arguments", ""); }
    PrepareOptions options;
    if (mode == "tinyshakespeare" || mode == "shards") { options = parse_options(argc, argv, mode == "shards"); }

    std::string vocab = find_bundled_file(ENCODER_PATH, vocab_flag, "--vocab");
    std::string text = mode == "tinyshakespeare" ? find_bundled_file(TINYSHAKESPEARE_TEXT, nullptr, nullptr) : "";
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, vocab.c_str());
    if (mode == "encode") {
        print_encoding(&tokenizer, argv[2], stdout);
    } else if (mode == "decode") {
        decode_ids(&tokenizer, stdin, stdout);
    } else if (mode == "tinyshakespeare") {
        const char* out_dir = options.out_prefix.empty() ? TINYSHAKESPEARE_DIR : options.out_prefix.c_str();
        prepare_tinyshakespeare(&tokenizer, text.c_str(), out_dir, &options);
    } else {
        prepare_shards(&tokenizer, &options);
    }
    tokenizer_free(&tokenizer);
    if (fflush(stdout) != 0) { fail("cannot write to stdout: %s", strerror(errno)); }
    return 0;
}
