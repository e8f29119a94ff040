// The classic GPT-2 fp32 model file on the host: a header of 256 int32 ([0] magic 20240326, [1]
// version 3, [2..7] maxT V L NH C Vp, [8] the attention kind, [9..10] a checksum: slots other
// readers ignore), then the 16 parameter tensors in fp32, in the order and shapes of
// model_file_sizes. The trainer, the test binary and the conversion tools read and write it here.
#pragma once

#include <math.h>
#include <stdint.h>

#include <string>
#include <vector>

#include "llmc/checksum.h"
#include "llmc/utils.h"

static const int MODEL_FILE_MAGIC = 20240326;
static const int MODEL_FILE_VERSION = 3;
static const int MODEL_FILE_TENSORS = 16;
static const char* const MODEL_FILE_TENSOR_NAMES[MODEL_FILE_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
// Header slot 9 is 1 when slot 10 holds the CRC32C of the parameters' bytes (files from other
// writers have 0 there: not checked).
static const int MODEL_FILE_CHECKSUM_SLOT = 9;
enum { MODEL_ATTENTION_SOFTMAX = 0, MODEL_ATTENTION_RELU = 1 };

struct ModelShape {
    int max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size, attention;
};

// Tensor sizes in file order: wte (Vp, C), wpe (maxT, C), then per layer ln1w, ln1b (L, C), qkvw
// (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w, ln2b (L, C), fcw (L, 4C, C),
// fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), then lnfw, lnfb (C). Weights are (out, in).
static inline void model_file_sizes(const ModelShape* s, size_t sizes[MODEL_FILE_TENSORS]) {
    size_t Vp = s->padded_vocab_size, C = s->channels, L = s->num_layers, T = s->max_seq_len;
    size_t list[MODEL_FILE_TENSORS] = {Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                                       L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    for (int i = 0; i < MODEL_FILE_TENSORS; i++) { sizes[i] = list[i]; }
}

static inline size_t model_file_num_parameters(const ModelShape* s) {
    size_t sizes[MODEL_FILE_TENSORS], total = 0;
    model_file_sizes(s, sizes);
    for (size_t size : sizes) { total += size; }
    return total;
}

// The parameter count without overflow, for checking a shape read from a file.
static inline unsigned __int128 model_file_exact_parameters(const ModelShape* s) {
    unsigned __int128 Vp = s->padded_vocab_size, C = s->channels, L = s->num_layers, T = s->max_seq_len;
    return Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
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
    } else if (s->attention != MODEL_ATTENTION_SOFTMAX && s->attention != MODEL_ATTENTION_RELU) {
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
    size_t sizes[MODEL_FILE_TENSORS], begin = 0;
    model_file_sizes(s, sizes);
    for (int t = 0; t < MODEL_FILE_TENSORS; t++) {
        size_t bad = first_nonfinite(params + begin, sizes[t]);
        if (bad < sizes[t]) { return std::string(MODEL_FILE_TENSOR_NAMES[t]) + "[" + std::to_string(bad) + "]"; }
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
        if (file != NULL) { fclose(file); }
        *problem = message;
        return false;
    };
    FILE* file = fopen(path, "rb");
    if (file == NULL) {
        snprintf(message, sizeof(message), "cannot open %s: %s", path, strerror(errno));
        return refuse(NULL);
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
    *shape = ModelShape{header[2], header[3], header[4], header[5], header[6], header[7], header[8]};
    std::string shape_problem = model_shape_problem(shape);
    if (!shape_problem.empty()) {
        snprintf(message, sizeof(message), "%s: %s", path, shape_problem.c_str());
        return refuse(file);
    }
    size_t count = model_file_num_parameters(shape);
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
        return refuse(NULL);
    }
    std::string bad = model_file_first_nonfinite(shape, params->data());
    if (!bad.empty()) {
        snprintf(message, sizeof(message), "%s: %s is not finite: refusing a diverged model", path, bad.c_str());
        return refuse(NULL);
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
    size_t count = model_file_num_parameters(shape);
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
