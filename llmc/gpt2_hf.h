// GPT-2 in Hugging Face's format (a directory with config.json and model.safetensors) to and from
// the classic model file's flat parameters (llmc/model_file.h), on the host:
//   gpt2_from_hf: reads config.json and model.safetensors (F32, F16 or BF16), checks every field,
//     name, dtype and shape, transposes the Conv1D weights (stored (in, out)), pads the vocabulary
//     to a multiple of 128; keys as on the hub ("h.0.ln_1.weight") or as save_pretrained writes
//     them ("transformer.h.0.ln_1.weight"); the attention-mask buffers are ignored, and an output
//     layer must equal wte (GPT-2 ties them).
//   gpt2_to_hf: writes config.json, model.safetensors (F32), vocab.json, merges.txt and
//     tokenizer_config.json, which transformers' GPT2LMHeadModel and AutoTokenizer load.
// A ReLU-attention model (our relu(q.k/sqrt(hs))/(t+1)) has model_type "gpt2fp32_relu", which
// stock transformers refuses rather than running it as softmax attention.
#pragma once

#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "llmc/json.h"
#include "llmc/model_file.h"
#include "llmc/safetensors.h"
#include "llmc/tokenizer.h"
#include "llmc/utf8.h"

constexpr const char* HF_RELU_MODEL_TYPE = "gpt2fp32_relu";

// The Hugging Face name of each parameter tensor (llmc/model_file.h's table, in its order), and
// whether it is a Conv1D weight, stored (in, out) where the model file has (out, in).
struct HfTensor {
    const char* name;
    bool conv1d;
};

constexpr HfTensor HF_TENSORS[] = {
    {"wte.weight", false},         {"wpe.weight", false},        {"ln_1.weight", false},
    {"ln_1.bias", false},          {"attn.c_attn.weight", true}, {"attn.c_attn.bias", false},
    {"attn.c_proj.weight", true},  {"attn.c_proj.bias", false},  {"ln_2.weight", false},
    {"ln_2.bias", false},          {"mlp.c_fc.weight", true},    {"mlp.c_fc.bias", false},
    {"mlp.c_proj.weight", true},   {"mlp.c_proj.bias", false},   {"ln_f.weight", false},
    {"ln_f.bias", false},
};
static_assert(sizeof(HF_TENSORS) / sizeof(HF_TENSORS[0]) == NUM_PARAMETER_TENSORS, "one name per parameter tensor");

// The name (without "transformer.") of tensor t of layer l.
static inline std::string hf_tensor_name(int t, int l) {
    return PARAMETER_TENSORS[t].per_layer ? "h." + std::to_string(l) + "." + HF_TENSORS[t].name : HF_TENSORS[t].name;
}

// The Hugging Face shape of one copy of tensor t: the model file's, but wte without the padded
// rows and Conv1D weights transposed.
static inline std::vector<int64_t> hf_tensor_shape(const ModelShape* s, int t) {
    const ParameterTensor& p = PARAMETER_TENSORS[t];
    int64_t rows = t == 0 ? s->vocab_size : (int64_t)parameter_dim(s, p.rows), cols = (int64_t)parameter_dim(s, p.cols);
    if (p.cols == DIM_ONE) { return {rows}; }
    return HF_TENSORS[t].conv1d ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
}

// Copies a (rows, cols) matrix into dst transposed (cols, rows).
static inline void hf_transpose(float* dst, const float* src, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++) { dst[c * rows + r] = src[r * cols + c]; }
    }
}

// ----------------------------------------------------------------------------
// config.json

static inline const JsonValue* hf_field(const JsonValue* config, const char* key, JsonType type, const char* path) {
    const JsonValue* v = config->find(key);
    if (v != nullptr && v->type != type && v->type != JSON_NULL) { fail("%s: field %s has the wrong type", path, key); }
    return v != nullptr && v->type == type ? v : nullptr;
}

static inline int hf_int_field(const JsonValue* config, const char* key, const char* path) {
    const JsonValue* v = hf_field(config, key, JSON_NUMBER, path);
    if (v == nullptr) { fail("%s: field %s is missing", path, key); }
    if (!v->is_integer || v->integer <= 0 || v->integer > INT32_MAX) { fail("%s: field %s must be a positive integer", path, key); }
    return (int)v->integer;
}

// A boolean field that must keep the value this trainer implements (its default when absent).
static inline void hf_require_bool(const JsonValue* config, const char* key, bool expected, const char* path) {
    const JsonValue* v = hf_field(config, key, JSON_BOOL, path);
    if (v != nullptr && v->boolean != expected) {
        fail("%s: field %s = %s is not supported (this trainer implements %s)", path, key, v->boolean ? "true" : "false",
             expected ? "true" : "false");
    }
}

// The model's shape from config.json (Vp: V rounded up to a multiple of 128); every field that
// this trainer cannot honour is refused, naming it. *tied: tie_word_embeddings.
static inline void hf_read_config(const char* path, ModelShape* shape, bool* tied) {
    std::vector<char> text;
    FILE* file = fopen_or_fail(path, "rb");
    int64_t size = file_size(path);
    if (size < 0 || size > (1 << 24)) { fail("%s: not a config file (%lld bytes)", path, (long long)size); }
    text.resize((size_t)size);
    fread_or_fail(text.data(), 1, text.size(), file, path);
    fclose(file);
    JsonValue config;
    char error[256];
    if (!json_parse(text.data(), text.size(), &config, error, sizeof(error))) { fail("%s: %s", path, error); }
    if (config.type != JSON_OBJECT) { fail("%s: not a JSON object", path); }
    const JsonValue* type = hf_field(&config, "model_type", JSON_STRING, path);
    bool relu = type != nullptr && type->string == HF_RELU_MODEL_TYPE;
    if (type != nullptr && type->string != "gpt2" && !relu) {
        fail("%s: field model_type = \"%s\" is not GPT-2 (gpt2 or %s)", path, type->string.c_str(), HF_RELU_MODEL_TYPE);
    }
    const JsonValue* activation = hf_field(&config, "activation_function", JSON_STRING, path);
    if (activation != nullptr && activation->string != "gelu_new" && activation->string != "gelu_pytorch_tanh") {
        fail("%s: field activation_function = \"%s\" is not supported (the tanh GELU: gelu_new)", path,
             activation->string.c_str());
    }
    const JsonValue* eps = hf_field(&config, "layer_norm_epsilon", JSON_NUMBER, path);
    if (eps != nullptr && eps->number != 1e-5) {
        fail("%s: field layer_norm_epsilon = %g is not supported (1e-5)", path, eps->number);
    }
    hf_require_bool(&config, "scale_attn_weights", true, path);
    hf_require_bool(&config, "scale_attn_by_inverse_layer_idx", false, path);
    hf_require_bool(&config, "reorder_and_upcast_attn", false, path);
    const JsonValue* tie = hf_field(&config, "tie_word_embeddings", JSON_BOOL, path);
    *tied = tie == nullptr || tie->boolean;
    int C = hf_int_field(&config, "n_embd", path);
    const JsonValue* inner = hf_field(&config, "n_inner", JSON_NUMBER, path);
    if (inner != nullptr && inner->integer != 4 * (int64_t)C) {
        fail("%s: field n_inner = %lld is not supported (4 n_embd = %d)", path, (long long)inner->integer, 4 * C);
    }
    int V = hf_int_field(&config, "vocab_size", path);
    *shape = ModelShape{.max_seq_len = hf_int_field(&config, "n_positions", path), .vocab_size = V,
                        .padded_vocab_size = (V + 127) / 128 * 128, .num_layers = hf_int_field(&config, "n_layer", path),
                        .num_heads = hf_int_field(&config, "n_head", path), .channels = C,
                        .attention = relu ? ATTENTION_RELU : ATTENTION_SOFTMAX};
    model_shape_check(shape, path);
}

// ----------------------------------------------------------------------------
// Reading model.safetensors

// The directory of a model: `path` itself, or the directory of a model.safetensors given directly.
static inline std::string hf_model_dir(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) { fail("%s: %s", path, strerror(errno)); }
    if (S_ISDIR(st.st_mode)) { return path; }
    std::string p = path;
    size_t slash = p.rfind('/');
    return slash == std::string::npos ? "." : p.substr(0, slash);
}

// The weights of a model: DIR/model.safetensors, or the .safetensors file given directly.
static inline std::string hf_weights_path(const char* path) {
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    return dir ? std::string(path) + "/model.safetensors" : std::string(path);
}

// Whether `path` is a Hugging Face model: a directory holding config.json, or a .safetensors file.
static inline bool hf_is_model(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) { return false; }
    if (S_ISDIR(st.st_mode)) { return file_exists((std::string(path) + "/config.json").c_str()); }
    size_t n = strlen(path);
    return n > 12 && strcmp(path + n - 12, ".safetensors") == 0;
}

// A tensor the model must hold, checked against its expected shape; read as float32.
static inline std::vector<float> hf_read_tensor(const char* path, const SafeFile* file, const std::string& prefix,
                                                const std::string& name, const std::vector<int64_t>& shape) {
    const SafeTensor* t = safetensors_find(file, (prefix + name).c_str());
    if (t == nullptr) { fail("%s: tensor %s%s is missing", path, prefix.c_str(), name.c_str()); }
    if (t->shape != shape) {
        std::string expected, got;
        for (int64_t d : shape) { expected += (expected.empty() ? "" : ", ") + std::to_string(d); }
        for (int64_t d : t->shape) { got += (got.empty() ? "" : ", ") + std::to_string(d); }
        fail("%s: tensor %s has shape (%s), expected (%s) for config.json", path, t->name.c_str(), got.c_str(),
             expected.c_str());
    }
    std::vector<float> values(safetensors_numel(t));
    safetensors_read_f32(path, file, t, values.data());
    return values;
}

// Every tensor of the file is one the model uses, a mask buffer, or the (tied) output layer.
static inline void hf_check_names(const char* path, const SafeFile* file, const std::string& prefix, int L) {
    for (const SafeTensor& t : file->tensors) {
        const std::string& name = t.name;
        size_t n = name.size();
        bool buffer = (n > 10 && name.compare(n - 10, 10, ".attn.bias") == 0) ||
                      (n > 17 && name.compare(n - 17, 17, ".attn.masked_bias") == 0);
        bool known = buffer || name == "lm_head.weight";
        for (int tensor = 0; tensor < NUM_PARAMETER_TENSORS && !known; tensor++) {
            for (int l = 0; l < (PARAMETER_TENSORS[tensor].per_layer ? L : 1) && !known; l++) {
                known = name == prefix + hf_tensor_name(tensor, l);
            }
        }
        if (!known) { fail("%s: unexpected tensor %s (not a GPT-2 tensor)", path, name.c_str()); }
    }
}

// Reads a Hugging Face GPT-2 (a directory, or its model.safetensors with config.json beside it)
// into the model file's shape and flat parameters.
static inline void gpt2_from_hf(const char* path, ModelShape* shape, std::vector<float>* params) {
    std::string dir = hf_model_dir(path);
    std::string config_path = dir + "/config.json";
    bool tied;
    hf_read_config(config_path.c_str(), shape, &tied);
    std::string weights = hf_weights_path(path);
    const char* wpath = weights.c_str();
    SafeFile file;
    safetensors_open(wpath, &file);
    std::string prefix = safetensors_find(&file, "transformer.wte.weight") != nullptr ? "transformer." : "";
    int L = shape->num_layers;
    hf_check_names(wpath, &file, prefix, L);
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(shape, sizes);
    params->assign(count_parameters(shape), 0.0f);  // the padded vocabulary rows stay 0
    float* tensor = params->data();
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t slice = parameter_slice(shape, t);
        std::vector<int64_t> hf_shape = hf_tensor_shape(shape, t);
        for (int l = 0; l < (PARAMETER_TENSORS[t].per_layer ? L : 1); l++) {
            std::vector<float> values = hf_read_tensor(wpath, &file, prefix, hf_tensor_name(t, l), hf_shape);
            float* dst = tensor + (size_t)l * slice;
            if (HF_TENSORS[t].conv1d) {
                hf_transpose(dst, values.data(), (size_t)hf_shape[0], (size_t)hf_shape[1]);
            } else {
                memcpy(dst, values.data(), values.size() * sizeof(float));
            }
        }
        tensor += sizes[t];
    }
    const SafeTensor* head = safetensors_find(&file, "lm_head.weight");
    if (head != nullptr) {  // must be wte: the trainer ties them
        std::vector<float> lm_head = hf_read_tensor(wpath, &file, "", "lm_head.weight", hf_tensor_shape(shape, 0));
        if (memcmp(lm_head.data(), params->data(), lm_head.size() * sizeof(float)) != 0) {
            fail("%s: lm_head.weight differs from wte (%s): untied output weights are not supported", wpath,
                 tied ? "tie_word_embeddings is true" : "field tie_word_embeddings = false");
        }
    } else if (!tied) {
        fail("%s: field tie_word_embeddings = false, but the file has no lm_head.weight", config_path.c_str());
    }
}

// ----------------------------------------------------------------------------
// Writing

// GPT-2's byte alphabet: the character each byte is written as in vocab.json and merges.txt.
static inline std::string gpt2_alphabet_string(const uint8_t* bytes, size_t n) {
    static const std::vector<uint32_t> char_of_byte = [] {
        std::vector<uint32_t> table(256);
        for (uint32_t cp = 0; cp < 256 + 68; cp++) {
            int b = gpt2_alphabet_byte(cp);
            if (b >= 0) { table[b] = cp; }
        }
        return table;
    }();
    std::string out;
    for (size_t i = 0; i < n; i++) { utf8_append(&out, char_of_byte[bytes[i]]); }
    return out;
}

// The pair of tokens whose merge makes token `id` (>= 256): BPE of the token's own bytes with
// only the tokens below id, which must end in two parts.
static inline void tokenizer_merge_pair(const Tokenizer* tok, uint32_t id, uint32_t* left, uint32_t* right) {
    const uint8_t* s = tok->token_bytes.data() + tok->token_offsets[id];
    size_t n = tok->token_offsets[id + 1] - tok->token_offsets[id];
    std::vector<size_t> starts(n + 1);  // part i is [starts[i], starts[i + 1])
    for (size_t i = 0; i <= n; i++) { starts[i] = i; }
    for (;;) {
        size_t best = 0;
        uint32_t best_rank = NO_TOKEN;
        for (size_t i = 0; i + 2 < starts.size(); i++) {
            uint32_t rank = token_with_bytes(tok, s + starts[i], starts[i + 2] - starts[i]);
            if (rank < id && rank < best_rank) { best = i, best_rank = rank; }
        }
        if (best_rank == NO_TOKEN) { break; }
        starts.erase(starts.begin() + best + 1);
    }
    if (starts.size() != 3) { fail("token %u: its bytes do not merge into two tokens below it (not a BPE vocabulary)", id); }
    *left = token_with_bytes(tok, s, starts[1]);
    *right = token_with_bytes(tok, s + starts[1], n - starts[1]);
}

static inline void hf_write_text(const std::string& path, const std::string& text) {
    AtomicFile out;
    open_atomic(&out, path.c_str());
    fwrite_or_fail(text.data(), 1, text.size(), out.file, out.tmp_path.c_str());
    commit_atomic(&out);
}

// vocab.json (every token, in GPT-2's byte alphabet, with its id) and merges.txt (token 256 + k
// is merge k; the end-of-text token is no merge).
static inline void hf_write_tokenizer(const std::string& dir, const Tokenizer* tok, int max_seq_len) {
    std::string vocab = "{", merges = "#version: 0.2\n";
    for (uint32_t id = 0; id < tok->vocab_size; id++) {
        const uint8_t* bytes = tok->token_bytes.data() + tok->token_offsets[id];
        size_t n = tok->token_offsets[id + 1] - tok->token_offsets[id];
        std::string token = id == tok->eot_token ? "<|endoftext|>" : gpt2_alphabet_string(bytes, n);
        vocab += (id == 0 ? "" : ", ") + json_quote(token) + ": " + std::to_string(id);
        if (id < 256 || id == tok->eot_token) { continue; }
        uint32_t left, right;
        tokenizer_merge_pair(tok, id, &left, &right);
        const uint8_t* base = tok->token_bytes.data();
        merges += gpt2_alphabet_string(base + tok->token_offsets[left], tok->token_offsets[left + 1] - tok->token_offsets[left]) +
                  " " + gpt2_alphabet_string(base + tok->token_offsets[right], tok->token_offsets[right + 1] - tok->token_offsets[right]) +
                  "\n";
    }
    hf_write_text(dir + "/vocab.json", vocab + "}\n");
    hf_write_text(dir + "/merges.txt", merges);
    char config[512];
    snprintf(config, sizeof(config),
             "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"model_max_length\": %d,\n  \"bos_token\": \"<|endoftext|>\",\n"
             "  \"eos_token\": \"<|endoftext|>\",\n  \"unk_token\": \"<|endoftext|>\",\n  \"add_prefix_space\": false\n}\n",
             max_seq_len);
    hf_write_text(dir + "/tokenizer_config.json", config);
}

// The files gpt2_to_hf writes in dir, the tokenizer's too if with_tokenizer.
static inline std::vector<std::string> hf_written_files(const std::string& dir, bool with_tokenizer) {
    std::vector<std::string> files = {dir + "/model.safetensors", dir + "/config.json"};
    if (with_tokenizer) {
        for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json"}) { files.push_back(dir + "/" + name); }
    }
    return files;
}

// A model from disk: a Hugging Face directory (or its model.safetensors), else a model file.
static inline void read_any_model(const char* path, ModelShape* shape, std::vector<float>* params) {
    struct stat st;
    if (hf_is_model(path)) {
        gpt2_from_hf(path, shape, params);
    } else if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fail("%s: a directory without config.json (not a Hugging Face model)", path);
    } else {
        model_file_read(path, shape, params);
    }
}

// Writes the model (shape, flat parameters) and the tokenizer (when tok is given) as a Hugging
// Face GPT-2 directory (the files of hf_written_files).
static inline void gpt2_to_hf(const char* dir, const ModelShape* shape, const float* params, const Tokenizer* tok) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) { fail("cannot create directory %s: %s", dir, strerror(errno)); }
    if (tok != nullptr && (int)tok->vocab_size != shape->vocab_size) {
        fail("the tokenizer has %u tokens, the model %d", tok->vocab_size, shape->vocab_size);
    }
    uint32_t eot = tok != nullptr ? tok->eot_token : (uint32_t)shape->vocab_size - 1;
    int L = shape->num_layers;
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(shape, sizes);
    std::vector<std::vector<float>> transposed;  // the Conv1D weights, stored (in, out)
    transposed.reserve(4 * (size_t)L);
    std::vector<SafeTensorOut> tensors;
    const float* tensor = params;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t slice = parameter_slice(shape, t);
        std::vector<int64_t> hf_shape = hf_tensor_shape(shape, t);
        for (int l = 0; l < (PARAMETER_TENSORS[t].per_layer ? L : 1); l++) {
            const float* src = tensor + (size_t)l * slice;
            if (HF_TENSORS[t].conv1d) {
                transposed.emplace_back(slice);
                hf_transpose(transposed.back().data(), src, (size_t)hf_shape[1], (size_t)hf_shape[0]);
                src = transposed.back().data();
            }
            tensors.push_back({"transformer." + hf_tensor_name(t, l), hf_shape, src});
        }
        tensor += sizes[t];
    }
    safetensors_write_f32((std::string(dir) + "/model.safetensors").c_str(), tensors, {{"format", "pt"}});
    bool relu = shape->attention == ATTENTION_RELU;
    char config[2048];
    snprintf(config, sizeof(config),
             "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"%s\",\n  \"vocab_size\": %d,\n"
             "  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
             "  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
             "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n  \"initializer_range\": 0.02,\n"
             "  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
             "  \"reorder_and_upcast_attn\": false,\n  \"tie_word_embeddings\": true,\n  \"bos_token_id\": %u,\n"
             "  \"eos_token_id\": %u,\n  \"torch_dtype\": \"float32\",\n  \"attention\": \"%s\"\n}\n",
             relu ? HF_RELU_MODEL_TYPE : "gpt2", shape->vocab_size, shape->max_seq_len, shape->max_seq_len,
             shape->channels, L, shape->num_heads, eot, eot, attention_name(shape->attention));
    hf_write_text(std::string(dir) + "/config.json", config);
    if (tok != nullptr) { hf_write_tokenizer(dir, tok, shape->max_seq_len); }
}
