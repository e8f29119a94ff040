// The run-state file of a checkpoint (DIR/state_%08d.bin, beside the model file of its step): a
// header of 256 int32, then AdamW's m and v of every parameter in fp32, whatever the number of
// GPUs that wrote it. Header slots: [0] magic 20240417, [1] version 3, [2] steps done, [3] AdamW's
// step (updates applied), [4] the CRC32C of the header (this slot taken as 0) followed by the
// moments, [16..64) the RunShape, [64..96) the training DataLoaderState, [112..) the spike guard's
// OutlierWindow, the rest 0 ([96..98) held a sampling RNG in older runs). RunState is the file in
// memory; state_file_write writes it atomically, state_file_load reads it back in one pass that
// checks everything and keeps one slice of the moments (a rank's ZeRO-1 shard).
#pragma once

#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "llmc/checksum.h"
#include "llmc/dataloader.h"
#include "llmc/outlier.h"
#include "llmc/run_shape.h"
#include "llmc/utils.h"

constexpr int STATE_MAGIC = 20240417;
constexpr int STATE_VERSION = 3;  // 3: a checksum and the spike guard's window
constexpr int STATE_HEADER_INTS = 256;
constexpr int STATE_CHECKSUM_SLOT = 4;
constexpr int STATE_SHAPE_SLOT = 16;
constexpr int STATE_LOADER_SLOT = 64;
constexpr int STATE_WINDOW_SLOT = 112;
static_assert(sizeof(RunShape) <= (STATE_LOADER_SLOT - STATE_SHAPE_SLOT) * sizeof(int32_t),
              "RunShape must fit slots 16..63");
static_assert(sizeof(DataLoaderState) <= 32 * sizeof(int32_t), "DataLoaderState must fit slots 64..95");
static_assert(STATE_WINDOW_SLOT * sizeof(int32_t) + sizeof(OutlierWindow) <= STATE_HEADER_INTS * sizeof(int32_t),
              "the spike guard's window must fit the header");

constexpr size_t STATE_HEADER_BYTES = STATE_HEADER_INTS * sizeof(int32_t);
constexpr size_t STATE_CHUNK_FLOATS = (size_t)1 << 22;  // the moments are read 16 MB at a time
constexpr const char* STATE_MOMENT_NAMES[2] = {"m", "v"};

struct RunState {
    int32_t step;                // optimizer steps done
    int32_t adam_step;           // updates applied (skipped steps do not count): AdamW's t
    RunShape shape;              // the flags that shape the run's numbers
    DataLoaderState loader;      // where the training data goes on
    OutlierWindow recent_norms;  // the spike guard's window
    std::vector<float> m, v;     // AdamW's moments: all P parameters' when written, a slice when read
};

static inline void state_header_encode(const RunState* s, int32_t header[STATE_HEADER_INTS]) {
    memset(header, 0, STATE_HEADER_BYTES);
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = s->step;
    header[3] = s->adam_step;
    memcpy(&header[STATE_SHAPE_SLOT], &s->shape, sizeof(s->shape));
    memcpy(&header[STATE_LOADER_SLOT], &s->loader, sizeof(s->loader));
    memcpy(&header[STATE_WINDOW_SLOT], &s->recent_norms, sizeof(s->recent_norms));
}

static inline void state_header_decode(const int32_t header[STATE_HEADER_INTS], RunState* s) {
    s->step = header[2];
    s->adam_step = header[3];
    memcpy(&s->shape, &header[STATE_SHAPE_SLOT], sizeof(s->shape));
    memcpy(&s->loader, &header[STATE_LOADER_SLOT], sizeof(s->loader));
    memcpy(&s->recent_norms, &header[STATE_WINDOW_SLOT], sizeof(s->recent_norms));
}

// Where a file's checksum starts: the CRC32C of its header with the checksum slot taken as 0.
static inline uint32_t state_header_crc(const int32_t header[STATE_HEADER_INTS]) {
    int32_t copy[STATE_HEADER_INTS];
    memcpy(copy, header, sizeof(copy));
    copy[STATE_CHECKSUM_SLOT] = 0;
    return crc32c_update(0, copy, sizeof(copy));
}

// Writes s's header fields and the moments m and v of all P parameters (s's own m and v are not
// read) atomically to path; refuses a non-finite moment, naming it (the previous files are kept).
static inline void state_file_write(const char* path, const RunState* s, const float* m, const float* v, size_t P) {
    const float* moments[2] = {m, v};
    int32_t header[STATE_HEADER_INTS];
    state_header_encode(s, header);
    uint32_t crc = state_header_crc(header);
    for (int k = 0; k < 2; k++) {
        size_t bad = first_nonfinite(moments[k], P);
        if (bad < P) {
            fail("%s: not written, AdamW's %s[%zu] is not finite (the previous checkpoints are kept)", path,
                 STATE_MOMENT_NAMES[k], bad);
        }
        crc = crc32c_update(crc, moments[k], P * sizeof(float));
    }
    header[STATE_CHECKSUM_SLOT] = (int32_t)crc;
    AtomicFile out;
    open_atomic(&out, path);
    atomic_write_or_fail(&out, header, sizeof(int32_t), STATE_HEADER_INTS);
    for (const float* moment : moments) { atomic_write_or_fail(&out, moment, sizeof(float), P); }
    commit_atomic(&out);
}

// Writes s with its own m and v (all P parameters').
static inline void state_file_write(const char* path, const RunState* s) {
    size_t P = s->m.size();
    if (s->v.size() != P) { fail("%s: not written, m holds %zu moments and v %zu", path, P, s->v.size()); }
    state_file_write(path, s, s->m.data(), s->v.data(), P);
}

// What is wrong with a state header, read from a file of `size` bytes, for step `step` of a model
// of P parameters; false with the one-line *problem.
static inline bool state_header_check(const int32_t* header, int64_t size, const char* path, int step, size_t P,
                                      std::string* problem) {
    if (header[0] != STATE_MAGIC || header[1] != STATE_VERSION) {
        return set_problem(problem, "%s: magic %d version %d, expected %d version %d (not a state file of this version)",
                           path, header[0], header[1], STATE_MAGIC, STATE_VERSION);
    }
    if (header[2] != step) { return set_problem(problem, "%s: holds step %d, expected %d", path, header[2], step); }
    int64_t expected = (int64_t)STATE_HEADER_BYTES + 2 * (int64_t)P * (int64_t)sizeof(float);
    if (size != expected) {
        return set_problem(problem, "%s: %lld bytes, expected %lld for a model of %zu parameters (%s)", path,
                           (long long)size, (long long)expected, P,
                           size < expected ? "truncated, or a smaller model's" : "a larger model's");
    }
    return true;
}

// Streams m then v (P floats each) through the checksum *crc, chunk floats at a time, keeping
// those of parameters [begin, end) in s->m and s->v; *nonfinite names the first non-finite moment
// ("" if none). False with *problem if the file ends early.
static inline bool state_moments_read(FILE* file, const char* path, size_t P, size_t begin, size_t end, size_t chunk,
                                      RunState* s, uint32_t* crc, std::string* nonfinite, std::string* problem) {
    std::vector<float> buffer(std::min(chunk, P));
    std::vector<float>* kept[2] = {&s->m, &s->v};
    for (int k = 0; k < 2; k++) {
        kept[k]->resize(end - begin);
        for (size_t at = 0; at < P; at += buffer.size()) {
            size_t n = std::min(buffer.size(), P - at);
            if (fread(buffer.data(), sizeof(float), n, file) != n) {
                return set_problem(problem, "%s: %s reading %s[%zu..]", path,
                                   ferror(file) ? strerror(errno) : "truncated", STATE_MOMENT_NAMES[k], at);
            }
            *crc = crc32c_update(*crc, buffer.data(), n * sizeof(float));
            size_t bad = first_nonfinite(buffer.data(), n);
            if (bad < n && nonfinite->empty()) {
                *nonfinite = std::string(STATE_MOMENT_NAMES[k]) + "[" + std::to_string(at + bad) + "]";
            }
            size_t from = std::max(at, begin), to = std::min(at + n, end);
            if (from < to) {
                memcpy(kept[k]->data() + (from - begin), buffer.data() + (from - at), (to - from) * sizeof(float));
            }
        }
    }
    return true;
}

static inline bool state_file_read(FILE* file, const char* path, int step, size_t P, size_t begin, size_t end,
                                   size_t chunk, RunState* s, std::string* problem) {
    struct stat st;
    if (fstat(fileno(file), &st) != 0) { return set_problem(problem, "cannot stat %s: %s", path, strerror(errno)); }
    int32_t header[STATE_HEADER_INTS];
    if (fread(header, sizeof(int32_t), STATE_HEADER_INTS, file) != (size_t)STATE_HEADER_INTS) {
        return set_problem(problem, "%s: %lld bytes, shorter than its %zu-byte header (truncated)", path,
                           (long long)st.st_size, STATE_HEADER_BYTES);
    }
    if (!state_header_check(header, st.st_size, path, step, P, problem)) { return false; }
    uint32_t crc = state_header_crc(header);
    std::string nonfinite;
    if (!state_moments_read(file, path, P, begin, end, chunk, s, &crc, &nonfinite, problem)) { return false; }
    if ((uint32_t)header[STATE_CHECKSUM_SLOT] != crc) {
        return set_problem(problem, "%s: checksum %08x, but the contents give %08x (the file is corrupt)", path,
                           (uint32_t)header[STATE_CHECKSUM_SLOT], crc);
    }
    if (!nonfinite.empty()) { return set_problem(problem, "%s: AdamW's %s is not finite", path, nonfinite.c_str()); }
    state_header_decode(header, s);
    if (s->adam_step < 0 || s->adam_step > s->step) {
        return set_problem(problem, "%s: AdamW's step %d is outside [0, %d] (the steps done)", path, s->adam_step,
                           s->step);
    }
    if (!outlier_valid(&s->recent_norms)) {
        return set_problem(problem, "%s: the spike guard's window is malformed", path);
    }
    return true;
}

// Reads the state file of `step` for a model of P parameters into *s in one pass, `chunk` floats
// at a time, keeping the moments of parameters [begin, end) only. Checks the header, the size, the
// checksum, that every moment is finite and that the rest of the header is one the writer makes;
// false with a one-line *problem naming the file otherwise (never exits: a resume falls back to
// an older checkpoint then).
static inline bool state_file_load(const char* path, int step, size_t P, size_t begin, size_t end, RunState* s,
                                   std::string* problem, size_t chunk = STATE_CHUNK_FLOATS) {
    if (begin > end || end > P || chunk == 0) {
        fail("state_file_load: slice [%zu, %zu) of %zu parameters, chunks of %zu", begin, end, P, chunk);
    }
    FILE* file = fopen(path, "rb");
    if (file == nullptr) { return set_problem(problem, "cannot open %s: %s", path, strerror(errno)); }
    bool ok = state_file_read(file, path, step, P, begin, end, chunk, s, problem);
    fclose(file);
    return ok;
}
