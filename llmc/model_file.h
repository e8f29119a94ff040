// The classic GPT-2 fp32 model file on the host: a header of 256 int32 ([0] magic 20240326, [1]
// version 3, [2..7] maxT V L NH C Vp, [8] the attention kind, a slot other readers ignore), then
// the 16 parameter tensors in fp32, in the order and shapes of model_file_sizes. For the tools
// that convert models; the trainer reads and writes the same format.
#pragma once

#include <stdint.h>

#include <vector>

#include "llmc/utils.h"

static const int MODEL_FILE_MAGIC = 20240326;
static const int MODEL_FILE_VERSION = 3;
static const int MODEL_FILE_TENSORS = 16;
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

// A shape this format can hold (positive sizes, C divisible by NH, V <= Vp); fails naming `source`.
static inline void model_shape_check(const ModelShape* s, const char* source) {
    if (s->max_seq_len <= 0 || s->vocab_size <= 0 || s->num_layers <= 0 || s->num_heads <= 0 || s->channels <= 0) {
        fail("%s: a non-positive size (maxT=%d V=%d L=%d NH=%d C=%d)", source, s->max_seq_len, s->vocab_size,
             s->num_layers, s->num_heads, s->channels);
    }
    if (s->channels % s->num_heads != 0 || s->channels % 4 != 0) {
        fail("%s: C=%d must be a multiple of 4 and of NH=%d", source, s->channels, s->num_heads);
    }
    if (s->padded_vocab_size < s->vocab_size) { fail("%s: padded vocab %d < vocab %d", source, s->padded_vocab_size, s->vocab_size); }
    if (s->attention != MODEL_ATTENTION_SOFTMAX && s->attention != MODEL_ATTENTION_RELU) {
        fail("%s: unknown attention kind %d (0 softmax, 1 relu)", source, s->attention);
    }
}

static inline void model_file_read(const char* path, ModelShape* shape, std::vector<float>* params) {
    FILE* file = fopen_or_fail(path, "rb");
    int32_t header[256];
    fread_or_fail(header, sizeof(int32_t), 256, file, path);
    if (header[0] != MODEL_FILE_MAGIC) { fail("%s: bad magic %d, expected %d (not a GPT-2 model file)", path, header[0], MODEL_FILE_MAGIC); }
    if (header[1] != MODEL_FILE_VERSION) { fail("%s: version %d not supported, expected %d", path, header[1], MODEL_FILE_VERSION); }
    *shape = ModelShape{header[2], header[3], header[4], header[5], header[6], header[7], header[8]};
    model_shape_check(shape, path);
    size_t count = model_file_num_parameters(shape);
    int64_t expected = 256 * sizeof(int32_t) + (int64_t)count * sizeof(float);
    if (file_size(path) != expected) {
        fail("%s: %lld bytes, expected %lld for its shape (truncated or corrupt)", path, (long long)file_size(path),
             (long long)expected);
    }
    params->resize(count);
    fread_or_fail(params->data(), sizeof(float), count, file, path);
    fclose(file);
}

static inline void model_file_write(const char* path, const ModelShape* shape, const float* params) {
    int32_t header[256] = {MODEL_FILE_MAGIC,      MODEL_FILE_VERSION, shape->max_seq_len, shape->vocab_size,
                           shape->num_layers,     shape->num_heads,   shape->channels,    shape->padded_vocab_size,
                           shape->attention};
    AtomicFile out;
    open_atomic(&out, path);
    fwrite_or_fail(header, sizeof(int32_t), 256, out.file, out.tmp_path);
    fwrite_or_fail(params, sizeof(float), model_file_num_parameters(shape), out.file, out.tmp_path);
    commit_atomic(&out);
}
