// The model's shape and its parameter tensors (one table: name, shape, weight decay,
// initialisation), and the classic GPT-2 fp32 model file on the host: a header of 256 int32 ([0]
// magic 20240326, [1] version 3, [2..7] maxT V L NH C Vp, [8] the attention kind, [9..10] a
// checksum: slots other readers ignore), then the 16 parameter tensors in fp32, in the table's
// order and shapes. The trainer, the test binary and the conversion tools read and write it here.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#include "llmc/checksum.h"
#include "llmc/utils.h"

constexpr int MODEL_FILE_MAGIC = 20240326;
constexpr int MODEL_FILE_VERSION = 3;
// Header slot 9 is 1 when slot 10 holds the CRC32C of the parameters' bytes (files from other
// writers have 0 there: not checked).
constexpr int MODEL_FILE_CHECKSUM_SLOT = 9;

// The attention of a model (header slot 8): softmax, or relu(q.k/sqrt(hs))/(t+1) over the visible
// keys. ATTENTION_OF_MODEL stands for "the model's own" where a flag may leave it open (-A).
enum AttentionKind : int32_t { ATTENTION_OF_MODEL = -1, ATTENTION_SOFTMAX = 0, ATTENTION_RELU = 1 };
constexpr const char* ATTENTION_NAMES[] = {"softmax", "relu"};  // by AttentionKind, as -A spells them

static inline const char* attention_name(AttentionKind kind) {
    return kind == ATTENTION_SOFTMAX || kind == ATTENTION_RELU ? ATTENTION_NAMES[kind] : "the model's";
}

// The model's shape: header slots 2..8 (in the file's order: maxT V L NH C Vp attention).
struct ModelShape {
    int max_seq_len;        // maxT
    int vocab_size;         // V
    int padded_vocab_size;  // Vp >= V, a multiple of 128 for aligned matrix products
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    AttentionKind attention;
};

// The parameters on the device: one pointer per tensor into one flat array, in the table's order.
struct ParameterTensors {
    float* wte;       // (Vp, C)
    float* wpe;       // (maxT, C)
    float* ln1w;      // (L, C)
    float* ln1b;      // (L, C)
    float* qkvw;      // (L, 3C, C)
    float* qkvb;      // (L, 3C)
    float* attprojw;  // (L, C, C)
    float* attprojb;  // (L, C)
    float* ln2w;      // (L, C)
    float* ln2b;      // (L, C)
    float* fcw;       // (L, 4C, C)
    float* fcb;       // (L, 4C)
    float* fcprojw;   // (L, C, 4C)
    float* fcprojb;   // (L, C)
    float* lnfw;      // (C)
    float* lnfb;      // (C)
};

// A size of a parameter tensor's shape, in terms of the model's shape.
enum ParameterDim { DIM_ONE, DIM_C, DIM_3C, DIM_4C, DIM_VP, DIM_MAXT };
// From scratch (GPT-2's): 0, 1, N(0, 0.02), or N(0, 0.02 / sqrt(2L)) for the two projections
// that add into the residual stream.
enum ParameterInit { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_RESIDUAL };

// The parameter tensors, in the model file's order (which is also the flat array's, the
// gradients', AdamW's and ZeRO-1's): one copy of (rows, cols) each, or L of them (one per layer).
// Weights are (out, in); only the 2-D tensors (embeddings, weight matrices) get weight decay.
using ParameterField = float* ParameterTensors::*;  // which pointer of ParameterTensors
struct ParameterTensor {
    const char* name;
    ParameterField field;
    bool per_layer;
    ParameterDim rows, cols;
    bool decayed;
    ParameterInit init;
};
constexpr ParameterTensor PARAMETER_TENSORS[] = {
    {"wte", &ParameterTensors::wte, false, DIM_VP, DIM_C, true, INIT_NORMAL},
    {"wpe", &ParameterTensors::wpe, false, DIM_MAXT, DIM_C, true, INIT_NORMAL},
    {"ln1w", &ParameterTensors::ln1w, true, DIM_C, DIM_ONE, false, INIT_ONE},
    {"ln1b", &ParameterTensors::ln1b, true, DIM_C, DIM_ONE, false, INIT_ZERO},
    {"qkvw", &ParameterTensors::qkvw, true, DIM_3C, DIM_C, true, INIT_NORMAL},
    {"qkvb", &ParameterTensors::qkvb, true, DIM_3C, DIM_ONE, false, INIT_ZERO},
    {"attprojw", &ParameterTensors::attprojw, true, DIM_C, DIM_C, true, INIT_RESIDUAL},
    {"attprojb", &ParameterTensors::attprojb, true, DIM_C, DIM_ONE, false, INIT_ZERO},
    {"ln2w", &ParameterTensors::ln2w, true, DIM_C, DIM_ONE, false, INIT_ONE},
    {"ln2b", &ParameterTensors::ln2b, true, DIM_C, DIM_ONE, false, INIT_ZERO},
    {"fcw", &ParameterTensors::fcw, true, DIM_4C, DIM_C, true, INIT_NORMAL},
    {"fcb", &ParameterTensors::fcb, true, DIM_4C, DIM_ONE, false, INIT_ZERO},
    {"fcprojw", &ParameterTensors::fcprojw, true, DIM_C, DIM_4C, true, INIT_RESIDUAL},
    {"fcprojb", &ParameterTensors::fcprojb, true, DIM_C, DIM_ONE, false, INIT_ZERO},
    {"lnfw", &ParameterTensors::lnfw, false, DIM_C, DIM_ONE, false, INIT_ONE},
    {"lnfb", &ParameterTensors::lnfb, false, DIM_C, DIM_ONE, false, INIT_ZERO},
};
constexpr int NUM_PARAMETER_TENSORS = sizeof(PARAMETER_TENSORS) / sizeof(PARAMETER_TENSORS[0]);

// The table names each field of ParameterTensors once: as many entries as fields, none twice.
constexpr bool parameter_fields_distinct() {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        for (int j = 0; j < i; j++) {
            if (PARAMETER_TENSORS[i].field == PARAMETER_TENSORS[j].field) { return false; }
        }
    }
    return true;
}
static_assert(sizeof(ParameterTensors) == NUM_PARAMETER_TENSORS * sizeof(float*) && parameter_fields_distinct(),
              "PARAMETER_TENSORS must list every field of ParameterTensors once");

static inline size_t parameter_dim(const ModelShape* s, ParameterDim dim) {
    size_t C = s->channels;
    switch (dim) {
        case DIM_C: return C;
        case DIM_3C: return 3 * C;
        case DIM_4C: return 4 * C;
        case DIM_VP: return s->padded_vocab_size;
        case DIM_MAXT: return s->max_seq_len;
        default: return 1;
    }
}

// The floats of one copy of tensor t (one layer's, for a per-layer tensor).
static inline size_t parameter_slice(const ModelShape* s, int t) {
    return parameter_dim(s, PARAMETER_TENSORS[t].rows) * parameter_dim(s, PARAMETER_TENSORS[t].cols);
}

// The floats of each tensor, in table order.
static inline void parameter_sizes(const ModelShape* s, size_t sizes[NUM_PARAMETER_TENSORS]) {
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        sizes[t] = parameter_slice(s, t) * (PARAMETER_TENSORS[t].per_layer ? (size_t)s->num_layers : 1);
    }
}

static inline size_t count_parameters(const ModelShape* s) {
    size_t sizes[NUM_PARAMETER_TENSORS], total = 0;
    parameter_sizes(s, sizes);
    for (size_t size : sizes) { total += size; }
    return total;
}

// What the trainer's kernels run (its validate_config checks every model against these): a head
// size C/NH the attention is built for, and C up to the layer norms' one block a row (a thread per
// float4 channel). L has no kernel limit; MODEL_MAX_LAYERS only bounds the names below.
constexpr int MODEL_HEAD_SIZES[] = {32, 64, 128};
constexpr int MODEL_MAX_CHANNELS = 2048;
constexpr int MODEL_MAX_LAYERS = 256;

// The shapes -e names (and train_gpt2.py's --model, which reads this table from this file: keep
// one row a line). GPT-2's vocabulary and maxT, softmax attention unless -A says otherwise.
struct NamedShape {
    const char* name;
    int layers, heads, channels;
};
constexpr NamedShape MODEL_SHAPES[] = {
    {"d6", 6, 6, 384},      // 30M, for quick experiments
    {"d12", 12, 12, 768},   // GPT-2 small, 124M
    {"d24", 24, 16, 1024},  // GPT-2 medium, 350M
    {"d36", 36, 20, 1280},  // GPT-2 large, 774M
    {"d48", 48, 25, 1600},  // GPT-2 XL, 1558M
};
// Any other shape as L<layers>C<channels>H<heads>, e.g. L6C384H6 (d6).
constexpr const char* MODEL_SHAPE_FORM = "L<layers>C<channels>H<heads>";

// The table's names, "d6|d12|..." (the usage text's and the errors' list).
static inline std::string model_shape_names(const char* separator) {
    std::string names;
    for (const NamedShape& named : MODEL_SHAPES) {
        names += (names.empty() ? "" : separator) + std::string(named.name);
    }
    return names;
}

// Whether C channels in NH heads run on the trainer's kernels (the limits above, L aside).
static inline bool model_shape_runs(int C, int NH) {
    bool head_size_ok = false;
    for (int hs : MODEL_HEAD_SIZES) { head_size_ok = head_size_ok || (NH > 0 && C == hs * NH); }
    return head_size_ok && C <= MODEL_MAX_CHANNELS && C % 4 == 0;
}

// What keeps a named shape from being one the trainer runs (every limit named), or "".
static inline std::string model_shape_limits_problem(int L, int C, int NH) {
    if (L >= 1 && L <= MODEL_MAX_LAYERS && model_shape_runs(C, NH)) { return ""; }
    char message[256];
    snprintf(message, sizeof(message),
             "L=%d C=%d NH=%d: the trainer runs 1 <= L <= %d, C <= %d a multiple of 4 and of NH, "
             "head size C/NH 32, 64 or 128", L, C, NH, MODEL_MAX_LAYERS, MODEL_MAX_CHANNELS);
    return message;
}

// Reads "L6C384H6" into its three numbers (each 1 to 6 digits); false for any other text.
static inline bool model_shape_parse_form(const char* name, int* L, int* C, int* NH) {
    const char letters[3] = {'L', 'C', 'H'};
    int* values[3] = {L, C, NH};
    for (int i = 0; i < 3; i++) {
        if (*name++ != letters[i]) { return false; }
        int digits = 0;
        for (*values[i] = 0; *name >= '0' && *name <= '9'; name++) {  // at most 6 digits: no overflow
            if (++digits > 6) { return false; }
            *values[i] = *values[i] * 10 + (*name - '0');
        }
        if (digits == 0) { return false; }
    }
    return *name == '\0';
}

// Whether -e's name is a shape (a row of MODEL_SHAPES or the custom form) rather than a file:
// then *shape is that shape, from scratch, and *problem what the trainer cannot run ("" if none).
static inline bool model_shape_by_name(const char* name, ModelShape* shape, std::string* problem) {
    int L = 0, C = 0, NH = 0;
    bool found = model_shape_parse_form(name, &L, &C, &NH);
    for (const NamedShape& named : MODEL_SHAPES) {
        if (strcmp(name, named.name) == 0) {
            L = named.layers, C = named.channels, NH = named.heads;
            found = true;
        }
    }
    if (!found) { return false; }
    *shape = ModelShape{.max_seq_len = 1024, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = L,
                        .num_heads = NH, .channels = C, .attention = ATTENTION_SOFTMAX};
    *problem = model_shape_limits_problem(L, C, NH);
    return true;
}

// The parameter count (the table's) without overflow, for checking a shape read from a file.
static inline unsigned __int128 model_file_exact_parameters(const ModelShape* s) {
    unsigned __int128 total = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        const ParameterTensor& p = PARAMETER_TENSORS[t];
        total += (unsigned __int128)parameter_dim(s, p.rows) * parameter_dim(s, p.cols) * (p.per_layer ? s->num_layers : 1);
    }
    return total;
}

// What makes a shape one this format cannot hold (a non-positive size, C not divisible by NH or
// 4, V > Vp, an unknown attention kind), or "" if it can.
static inline std::string model_shape_problem(const ModelShape* s) {
    char message[256];
    if (s->max_seq_len <= 0 || s->vocab_size <= 0 || s->num_layers <= 0 || s->num_heads <= 0 || s->channels <= 0) {
        snprintf(message, sizeof(message), "a non-positive size (maxT=%d V=%d L=%d NH=%d C=%d)", s->max_seq_len,
                 s->vocab_size, s->num_layers, s->num_heads, s->channels);
    } else if (s->channels % s->num_heads != 0 || s->channels % 4 != 0) {
        snprintf(message, sizeof(message), "C=%d must be a multiple of 4 and of NH=%d", s->channels, s->num_heads);
    } else if (s->padded_vocab_size < s->vocab_size) {
        snprintf(message, sizeof(message), "padded vocab %d < vocab %d", s->padded_vocab_size, s->vocab_size);
    } else if (model_file_exact_parameters(s) > ((unsigned __int128)1 << 40)) {
        snprintf(message, sizeof(message), "over 2^40 parameters (maxT=%d V=%d Vp=%d L=%d C=%d)", s->max_seq_len,
                 s->vocab_size, s->padded_vocab_size, s->num_layers, s->channels);
    } else if (s->attention != ATTENTION_SOFTMAX && s->attention != ATTENTION_RELU) {
        snprintf(message, sizeof(message), "unknown attention kind %d (0 softmax, 1 relu)", s->attention);
    } else {
        return "";
    }
    return message;
}

static inline void model_shape_check(const ModelShape* s, const char* source) {
    std::string problem = model_shape_problem(s);
    if (!problem.empty()) { fail("%s: %s", source, problem.c_str()); }
}

// The first non-finite value among n floats of the model file's tensors, as "ln1w[17]", or "".
static inline std::string model_file_first_nonfinite(const ModelShape* s, const float* params) {
    size_t sizes[NUM_PARAMETER_TENSORS], begin = 0;
    parameter_sizes(s, sizes);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t bad = first_nonfinite(params + begin, sizes[t]);
        if (bad < sizes[t]) { return std::string(PARAMETER_TENSORS[t].name) + "[" + std::to_string(bad) + "]"; }
        begin += sizes[t];
    }
    return "";
}

// Reads a model file, checking its header, size, checksum (when it has one) and that every value
// is finite; false with a one-line *problem naming the file otherwise (the resume fallback tries
// an older checkpoint then).
static inline bool model_file_load(const char* path, ModelShape* shape, std::vector<float>* params, std::string* problem) {
    char message[4096 + 256];
    auto refuse = [&](FILE* file) {
        if (file != nullptr) { fclose(file); }
        *problem = message;
        return false;
    };
    FILE* file = fopen(path, "rb");
    if (file == nullptr) {
        snprintf(message, sizeof(message), "cannot open %s: %s", path, strerror(errno));
        return refuse(nullptr);
    }
    int32_t header[256];
    if (fread(header, sizeof(int32_t), 256, file) != 256) {
        snprintf(message, sizeof(message), "%s: shorter than its 1024-byte header (truncated)", path);
        return refuse(file);
    }
    if (header[0] != MODEL_FILE_MAGIC || header[1] != MODEL_FILE_VERSION) {
        snprintf(message, sizeof(message), "%s: magic %d version %d, expected %d version %d (not a GPT-2 fp32 model file)",
                 path, header[0], header[1], MODEL_FILE_MAGIC, MODEL_FILE_VERSION);
        return refuse(file);
    }
    *shape = ModelShape{.max_seq_len = header[2], .vocab_size = header[3], .padded_vocab_size = header[7],
                        .num_layers = header[4], .num_heads = header[5], .channels = header[6],
                        .attention = (AttentionKind)header[8]};
    std::string shape_problem = model_shape_problem(shape);
    if (!shape_problem.empty()) {
        snprintf(message, sizeof(message), "%s: %s", path, shape_problem.c_str());
        return refuse(file);
    }
    size_t count = count_parameters(shape);
    int64_t expected = 256 * sizeof(int32_t) + (int64_t)count * sizeof(float);
    if (file_size(path) != expected) {
        snprintf(message, sizeof(message), "%s: %lld bytes, expected %lld for its shape (truncated or corrupt)", path,
                 (long long)file_size(path), (long long)expected);
        return refuse(file);
    }
    params->resize(count);
    if (fread(params->data(), sizeof(float), count, file) != count) {
        snprintf(message, sizeof(message), "%s: read failed: %s", path, strerror(errno));
        return refuse(file);
    }
    fclose(file);
    uint32_t crc = crc32c_update(0, params->data(), count * sizeof(float));
    if (header[MODEL_FILE_CHECKSUM_SLOT] == 1 && (uint32_t)header[MODEL_FILE_CHECKSUM_SLOT + 1] != crc) {
        snprintf(message, sizeof(message), "%s: checksum %08x, but the parameters give %08x (the file is corrupt)",
                 path, (uint32_t)header[MODEL_FILE_CHECKSUM_SLOT + 1], crc);
        return refuse(nullptr);
    }
    std::string bad = model_file_first_nonfinite(shape, params->data());
    if (!bad.empty()) {
        snprintf(message, sizeof(message), "%s: %s is not finite: refusing a diverged model", path, bad.c_str());
        return refuse(nullptr);
    }
    return true;
}

static inline void model_file_read(const char* path, ModelShape* shape, std::vector<float>* params) {
    std::string problem;
    if (!model_file_load(path, shape, params, &problem)) { fail("%s", problem.c_str()); }
}

// Writes the model file atomically, with the CRC32C of the parameters in the header; refuses
// non-finite parameters (the previous file, if any, is kept).
static inline void model_file_write(const char* path, const ModelShape* shape, const float* params) {
    std::string bad = model_file_first_nonfinite(shape, params);
    if (!bad.empty()) { fail("%s: not written, %s is not finite (the previous files are kept)", path, bad.c_str()); }
    size_t count = count_parameters(shape);
    int32_t header[256] = {MODEL_FILE_MAGIC,      MODEL_FILE_VERSION, shape->max_seq_len, shape->vocab_size,
                           shape->num_layers,     shape->num_heads,   shape->channels,    shape->padded_vocab_size,
                           shape->attention};
    header[MODEL_FILE_CHECKSUM_SLOT] = 1;
    header[MODEL_FILE_CHECKSUM_SLOT + 1] = (int32_t)crc32c_update(0, params, count * sizeof(float));
    AtomicFile out;
    open_atomic(&out, path);
    atomic_write_or_fail(&out, header, sizeof(int32_t), 256);
    atomic_write_or_fail(&out, params, sizeof(float), count);
    commit_atomic(&out);
}
