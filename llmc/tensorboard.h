// TensorBoard event files, written without TensorFlow, protobuf or Python: scalars, text and the
// session starts that make TensorBoard drop what a killed run logged after its checkpoint.
//
// A file is a sequence of TFRecords: uint64 length (little-endian), uint32 masked CRC32C of those
// 8 bytes, the data, uint32 masked CRC32C of the data; mask(crc) = ((crc >> 15) | (crc << 17)) +
// 0xa282ead8. Each record's data is a tensorflow.Event protobuf, encoded here field by field in
// field order as protobuf does (proto3: a zero wall_time or step is left out, a oneof is kept):
//   Event {1: double wall_time, 2: int64 step, 3: string file_version, 5: Summary, 7: SessionLog}
//   Summary {1: repeated Value}; Value {1: tag, 2: float simple_value, 8: TensorProto, 9: metadata}
//   text: TensorProto {1: dtype DT_STRING = 7, 2: shape {} (a scalar), 8: bytes string_val} with
//         SummaryMetadata {1: PluginData {1: plugin_name "text"}}
//   SessionLog {1: status START = 1}
// The first record is Event {wall_time, file_version "brain.Event:2"}; the file is
// DIR/events.out.tfevents.<unix seconds>.<host>, a new one for each open (".001", ".002", ...
// added to a name in use, so that nothing is overwritten and the names sort in the order written:
// TensorBoard reads a folder's files in the order of their names).
//
// tensorboard_session_start(step): where TensorBoard's EventAccumulator (tensorboard 2.21, checked
// by dev/test/test_tensorboard.py) reads a SessionLog START at step S in a file of version 2, it
// discards the events read before it (from this file and those whose names sort before it) whose
// step is >= S, and keeps those after it. plugin_event_accumulator, which the TensorBoard app's
// Python loader uses (--load_fast=false), discards them in every tag; the older
// event_accumulator.EventAccumulator only in scalars (and histograms, images, audio), not in
// tensors such as text. The Rust data server (the app's default where installed; from its source,
// untested here) ignores SessionLog but drops a tag's points at steps >= s when the tag logs step
// s, so a resumed run's curves come out the same.
//
// Each event is flushed as written, so a live TensorBoard follows the run. A failed write or flush
// (a full disk, the file or its folder removed) prints one line to stderr and closes the writer:
// later calls do nothing, and the run goes on.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <initializer_list>
#include <string>

#include "llmc/checksum.h"
#include "llmc/utf8.h"
#include "llmc/utils.h"

constexpr uint32_t TENSORBOARD_CRC_MASK_DELTA = 0xa282ead8;
constexpr const char* TENSORBOARD_FILE_VERSION = "brain.Event:2";
constexpr const char* TENSORBOARD_FILE_PREFIX = "events.out.tfevents.";  // then <unix seconds>.<host>
constexpr int TENSORBOARD_MAX_SUFFIX = 999;  // ".001" to ".999": names tried past the first

// Event's fields (tensorflow/core/util/event.proto) and the others written here.
constexpr int PB_EVENT_WALL_TIME = 1, PB_EVENT_STEP = 2, PB_EVENT_FILE_VERSION = 3, PB_EVENT_SUMMARY = 5;
constexpr int PB_EVENT_SESSION_LOG = 7;
constexpr int PB_SUMMARY_VALUE = 1;
constexpr int PB_VALUE_TAG = 1, PB_VALUE_SIMPLE_VALUE = 2, PB_VALUE_TENSOR = 8, PB_VALUE_METADATA = 9;
constexpr int PB_TENSOR_DTYPE = 1, PB_TENSOR_SHAPE = 2, PB_TENSOR_STRING_VAL = 8;
constexpr int PB_DT_STRING = 7;
constexpr int PB_METADATA_PLUGIN_DATA = 1, PB_PLUGIN_NAME = 1;
constexpr int PB_SESSION_LOG_STATUS = 1, PB_SESSION_LOG_START = 1;
// Protobuf wire types.
constexpr int PB_WIRE_VARINT = 0, PB_WIRE_FIXED64 = 1, PB_WIRE_BYTES = 2, PB_WIRE_FIXED32 = 5;

static inline double tensorboard_wall_time() {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

// One event file being written; file == nullptr: not open, or closed after an error.
struct TensorBoard {
    FILE* file = nullptr;
    std::string path;
    double (*clock)() = tensorboard_wall_time;  // the events' wall_time (tests fix it)
};

struct TensorBoardScalar {
    const char* tag;
    float value;
};

// ----------------------------------------------------------------------------------------------
// Encoding

static inline uint32_t tensorboard_masked_crc(const void* data, size_t n) {
    uint32_t crc = crc32c_update(0, data, n);
    return ((crc >> 15) | (crc << 17)) + TENSORBOARD_CRC_MASK_DELTA;
}

static inline void pb_varint(std::string* out, uint64_t v) {
    for (; v >= 0x80; v >>= 7) { out->push_back((char)(v | 0x80)); }
    out->push_back((char)v);
}

static inline void pb_key(std::string* out, int field, int wire_type) {
    pb_varint(out, (uint64_t)(field << 3 | wire_type));
}

static inline void pb_little_endian(std::string* out, uint64_t bits, int bytes) {
    for (int i = 0; i < bytes; i++) { out->push_back((char)(bits >> (8 * i))); }
}

static inline void pb_int(std::string* out, int field, int64_t v) {
    pb_key(out, field, PB_WIRE_VARINT);
    pb_varint(out, (uint64_t)v);  // a negative one as its 64 bits, 10 bytes
}

static inline void pb_bytes(std::string* out, int field, const std::string& bytes) {
    pb_key(out, field, PB_WIRE_BYTES);
    pb_varint(out, bytes.size());
    out->append(bytes);
}

static inline void pb_float(std::string* out, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    pb_key(out, field, PB_WIRE_FIXED32);
    pb_little_endian(out, bits, 4);
}

// wall_time and step are proto3 fields of implicit presence: left out when zero (all bits zero:
// -0.0 is written), as protobuf does.
static inline std::string tensorboard_event(double wall_time, int64_t step, int what_field, const std::string& what) {
    std::string event;
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    if (bits != 0) {
        pb_key(&event, PB_EVENT_WALL_TIME, PB_WIRE_FIXED64);
        pb_little_endian(&event, bits, 8);
    }
    if (step != 0) { pb_int(&event, PB_EVENT_STEP, step); }
    pb_bytes(&event, what_field, what);
    return event;
}

static inline std::string tensorboard_scalars_summary(std::initializer_list<TensorBoardScalar> scalars) {
    std::string summary;
    for (const TensorBoardScalar& s : scalars) {
        std::string value;
        pb_bytes(&value, PB_VALUE_TAG, s.tag);
        pb_float(&value, PB_VALUE_SIMPLE_VALUE, s.value);  // in a oneof: written even when 0
        pb_bytes(&summary, PB_SUMMARY_VALUE, value);
    }
    return summary;
}

static inline std::string tensorboard_text_summary(const std::string& tag, const std::string& text) {
    std::string tensor, plugin, metadata, value, summary;
    pb_int(&tensor, PB_TENSOR_DTYPE, PB_DT_STRING);
    pb_bytes(&tensor, PB_TENSOR_SHAPE, "");
    pb_bytes(&tensor, PB_TENSOR_STRING_VAL, text);
    pb_bytes(&plugin, PB_PLUGIN_NAME, "text");
    pb_bytes(&metadata, PB_METADATA_PLUGIN_DATA, plugin);
    pb_bytes(&value, PB_VALUE_TAG, tag);
    pb_bytes(&value, PB_VALUE_TENSOR, tensor);
    pb_bytes(&value, PB_VALUE_METADATA, metadata);
    pb_bytes(&summary, PB_SUMMARY_VALUE, value);
    return summary;
}

// The TFRecord holding `data`.
static inline std::string tensorboard_record(const std::string& data) {
    std::string record;
    pb_little_endian(&record, data.size(), 8);
    uint32_t length_crc = tensorboard_masked_crc(record.data(), 8);
    pb_little_endian(&record, length_crc, 4);
    record.append(data);
    pb_little_endian(&record, tensorboard_masked_crc(data.data(), data.size()), 4);
    return record;
}

// ----------------------------------------------------------------------------------------------
// The writer

// Reports the error (an errno value) in one line and closes the writer.
static inline void tensorboard_stop(TensorBoard* tb, int error) {
    fprintf(stderr, "tensorboard: cannot write %s: %s; no more TensorBoard events are written (the run goes on)\n",
            tb->path.c_str(), strerror(error));
    fclose(tb->file);
    tb->file = nullptr;
}

// Writes one event and flushes it; a file no longer linked in its folder (removed) is an error.
static inline void tensorboard_write(TensorBoard* tb, double wall_time, int64_t step, int what_field,
                                     const std::string& what) {
    if (tb->file == nullptr) { return; }
    std::string record = tensorboard_record(tensorboard_event(wall_time, step, what_field, what));
    struct stat st;
    if (fwrite(record.data(), 1, record.size(), tb->file) != record.size() || fflush(tb->file) != 0) {
        tensorboard_stop(tb, errno);
    } else if (fstat(fileno(tb->file), &st) == 0 && st.st_nlink == 0) {
        tensorboard_stop(tb, ENOENT);
    }
}

// A new file in dir (which must exist) named from the clock's seconds and this host; false, having
// said why in one line, if it cannot be created.
static inline bool tensorboard_open(TensorBoard* tb, const std::string& dir,
                                    double (*clock)() = tensorboard_wall_time) {
    *tb = TensorBoard();
    tb->clock = clock;
    double now = clock();
    char seconds[32];
    snprintf(seconds, sizeof(seconds), "%010lld", (long long)now);  // as TensorFlow names them
    std::string base = dir + "/" + TENSORBOARD_FILE_PREFIX + seconds + "." + host_name();
    int fd = -1;
    for (int suffix = 0; fd < 0 && suffix <= TENSORBOARD_MAX_SUFFIX; suffix++) {
        char tail[16];
        snprintf(tail, sizeof(tail), ".%03d", suffix);
        tb->path = suffix == 0 ? base : base + tail;
        fd = open(tb->path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0 && errno != EEXIST) { break; }
    }
    if (fd < 0 || (tb->file = fdopen(fd, "wb")) == nullptr) {
        fprintf(stderr, "tensorboard: cannot create %s: %s; no TensorBoard events are written (the run goes on)\n",
                tb->path.c_str(), strerror(errno));
        if (fd >= 0) { close(fd); }
        return false;
    }
    tensorboard_write(tb, now, 0, PB_EVENT_FILE_VERSION, TENSORBOARD_FILE_VERSION);
    return tb->file != nullptr;
}

// One event holding the scalars, all at `step`.
static inline void tensorboard_scalars(TensorBoard* tb, int64_t step,
                                       std::initializer_list<TensorBoardScalar> scalars) {
    if (tb->file == nullptr) { return; }
    tensorboard_write(tb, tb->clock(), step, PB_EVENT_SUMMARY, tensorboard_scalars_summary(scalars));
}

// Text, rendered as Markdown by TensorBoard's text dashboard, which fails on ill-formed UTF-8: each
// such byte (a raw byte of a path, a character cut short) is written as U+FFFD.
static inline void tensorboard_text(TensorBoard* tb, const std::string& tag, int64_t step, const std::string& text) {
    if (tb->file == nullptr) { return; }
    std::string repaired = utf8_repaired((const uint8_t*)text.data(), text.size());
    tensorboard_write(tb, tb->clock(), step, PB_EVENT_SUMMARY, tensorboard_text_summary(tag, repaired));
}

// A SessionLog START at `step`: see the top of this file.
static inline void tensorboard_session_start(TensorBoard* tb, int64_t step) {
    std::string session_log;
    pb_int(&session_log, PB_SESSION_LOG_STATUS, PB_SESSION_LOG_START);
    tensorboard_write(tb, tb->clock(), step, PB_EVENT_SESSION_LOG, session_log);
}

static inline void tensorboard_close(TensorBoard* tb) {
    if (tb->file == nullptr) { return; }
    if (fclose(tb->file) != 0) {
        fprintf(stderr, "tensorboard: cannot write %s: %s\n", tb->path.c_str(), strerror(errno));
    }
    tb->file = nullptr;
}
