// Hugging Face safetensors files: a pure, fuzzable header parser with strict validation,
// file-level wrappers that fail with one-line errors, reading tensors as float32 (F32,
// F16, BF16) and writing F32 tensors atomically.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON, then the data. The JSON
// maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// (byte offsets from the start of the data), plus an optional "__metadata__" object of
// strings. The tensors must cover the data exactly: no overlaps, no holes, no trailing bytes.
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "llmc/json.h"
#include "llmc/utils.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.h reads and writes in host byte order");

constexpr uint64_t SAFETENSORS_MAX_HEADER = 100000000;  // the format's own limit on N
constexpr size_t SAFETENSORS_NAME_IN_ERROR = 64;         // bytes of a name quoted in an error

struct SafeTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

struct SafeFile {
    std::vector<SafeTensor> tensors;                               // in header order
    std::vector<std::pair<std::string, std::string>> metadata;    // "__metadata__", in header order
    uint64_t data_offset = 0;                                      // 8 + N: where the data section starts
    uint64_t file_size = 0;
};

struct SafeTensorOut {
    std::string name;
    std::vector<int64_t> shape;
    const float* data;
};

// ----------------------------------------------------------------------------
// Header parsing (pure: no I/O, no exit)

// Bytes per element of a standard dtype name, or 0 if unknown.
static inline size_t safetensors_dtype_size(const std::string& dtype) {
    static constexpr struct { const char* name; size_t size; } DTYPES[] = {
        {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2}, {"F16", 2},
        {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4}, {"U64", 8}, {"I64", 8}, {"F64", 8},
    };
    for (const auto& known : DTYPES) {
        if (dtype == known.name) { return known.size; }
    }
    return 0;
}

// Writes a formatted one-line message to error (if error_size > 0); returns false.
static inline bool safetensors_error(char* error, size_t error_size, const char* fmt, ...) {
    if (error == nullptr || error_size == 0) { return false; }
    va_list args;
    va_start(args, fmt);
    vsnprintf(error, error_size, fmt, args);
    va_end(args);
    return false;
}

// A name for an error message: JSON-quoted (so it stays on one line), long ones cut short.
static inline std::string safetensors_quoted(const std::string& name) {
    if (name.size() <= SAFETENSORS_NAME_IN_ERROR) { return json_quote(name); }
    size_t cut = SAFETENSORS_NAME_IN_ERROR;
    while (cut > 0 && ((uint8_t)name[cut] & 0xC0) == 0x80) { cut--; }  // not inside a UTF-8 sequence
    return json_quote(name.substr(0, cut)) + "...";
}

// The first name that occurs twice in `names`, or nullptr.
static inline const std::string* safetensors_first_duplicate(const std::vector<const std::string*>& names) {
    std::vector<const std::string*> sorted = names;
    std::sort(sorted.begin(), sorted.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    for (size_t i = 1; i < sorted.size(); i++) {
        if (*sorted[i] == *sorted[i - 1]) { return sorted[i]; }
    }
    return nullptr;
}

static inline uint64_t safetensors_read_u64_le(const uint8_t* p) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) { value = value << 8 | p[i]; }
    return value;
}

// Reads the header length N from the first 8 bytes and checks it against the file and the limit.
static inline bool safetensors_header_length(const uint8_t* bytes, size_t available, uint64_t file_size,
                                             uint64_t* header_length, char* error, size_t error_size) {
    if (file_size < 8) {
        return safetensors_error(error, error_size, "file is %llu bytes, too short for the 8-byte header length",
                                 (unsigned long long)file_size);
    }
    if (available < 8) { return safetensors_error(error, error_size, "the header length's 8 bytes are not available"); }
    uint64_t n = safetensors_read_u64_le(bytes);
    if (n > file_size - 8) {
        return safetensors_error(error, error_size, "header length %llu runs past the end of the file (%llu bytes)",
                                 (unsigned long long)n, (unsigned long long)file_size);
    }
    if (n > SAFETENSORS_MAX_HEADER) {
        return safetensors_error(error, error_size, "header length %llu is over the limit of %llu bytes",
                                 (unsigned long long)n, (unsigned long long)SAFETENSORS_MAX_HEADER);
    }
    *header_length = n;
    return true;
}

// Bytes of a tensor of this shape: false if a dimension is negative or the product
// overflows (a zero dimension makes 0, however large the others).
static inline bool safetensors_shape_bytes(const std::vector<int64_t>& shape, size_t element_size, uint64_t* bytes) {
    *bytes = element_size;
    for (int64_t dim : shape) {
        if (dim < 0) { return false; }
        if (dim == 0) { *bytes = 0; }
    }
    for (size_t i = 0; i < shape.size() && *bytes > 0; i++) {
        if (__builtin_mul_overflow(*bytes, (uint64_t)shape[i], bytes)) { return false; }
    }
    return true;
}

constexpr const char* SAFETENSOR_KEYS[3] = {"dtype", "shape", "data_offsets"};

// One header parse: the cursor over its JSON, and where a format error (a defect other than
// bad JSON) goes. A failed step returns false with either the cursor's problem set or
// format_error true and the message written.
struct SafeHeaderParse {
    JsonCursor c;
    char* error;
    size_t error_size;
    bool format_error;
};

static inline bool safetensors_format_error(SafeHeaderParse* p, const char* fmt, ...) {
    p->format_error = true;
    if (p->error == nullptr || p->error_size == 0) { return false; }
    va_list args;
    va_start(args, fmt);
    vsnprintf(p->error, p->error_size, fmt, args);
    va_end(args);
    return false;
}

// Reads the value at the cursor (at nesting `depth`) as JSON, keeping nothing: a value of the
// wrong type is refused only once it is known to be JSON, so JSON errors come first.
static inline bool safetensors_skip(SafeHeaderParse* p, int depth) { return json_value(&p->c, nullptr, depth); }

// An array (shape, data_offsets) read whole into *values; *first_bad is the index of its
// first entry that is not a non-negative integer, SIZE_MAX if none.
static inline bool safetensors_counts(SafeHeaderParse* p, int depth, std::vector<int64_t>* values, size_t* first_bad) {
    JsonCursor* c = &p->c;
    values->clear();
    *first_bad = SIZE_MAX;
    return json_array(c, depth, [&](size_t index) {
        int next = json_peek(c);
        JsonNumber number = {};
        bool is_number = next == '-' || (next >= '0' && next <= '9');
        if (!(is_number ? json_number(c, &number) : json_value(c, nullptr, depth + 1))) { return false; }
        bool is_count = is_number && number.is_integer && number.integer >= 0;
        if (!is_count && *first_bad == SIZE_MAX) { *first_bad = index; }
        values->push_back(number.integer);
        return true;
    });
}

// What a tensor entry's members held, before they are checked against each other.
struct SafeTensorFields {
    bool seen[3] = {false, false, false};                // dtype, shape, data_offsets
    std::vector<int64_t> offsets;
    size_t bad_shape = SIZE_MAX, bad_offset = SIZE_MAX;  // the first entry that is not a non-negative integer
    std::string unknown;                                 // the first unknown key, quoted
};

// The members of one tensor entry (q: its quoted name): dtype into t->dtype, shape into
// t->shape, each once and of the right JSON type.
static inline bool safetensors_tensor_members(SafeHeaderParse* p, SafeTensor* t, const char* q, SafeTensorFields* f) {
    JsonCursor* c = &p->c;
    return json_object(c, 1, [&](std::string& key) {
        int k = 0;
        while (k < 3 && key != SAFETENSOR_KEYS[k]) { k++; }
        if (k == 3) {
            if (f->unknown.empty()) { f->unknown = safetensors_quoted(key); }
            return safetensors_skip(p, 2);
        }
        if (f->seen[k]) { return safetensors_format_error(p, "tensor %s: \"%s\" appears twice", q, SAFETENSOR_KEYS[k]); }
        f->seen[k] = true;
        int next = json_peek(c);
        if (k == 0 && next != '"') { return safetensors_skip(p, 2) && safetensors_format_error(p, "tensor %s: dtype is not a string", q); }
        if (k == 1 && next != '[') { return safetensors_skip(p, 2) && safetensors_format_error(p, "tensor %s: shape is not an array", q); }
        if (k == 2 && next != '[') {
            return safetensors_skip(p, 2) &&
                   safetensors_format_error(p, "tensor %s: data_offsets is not [begin, end] of non-negative integers", q);
        }
        if (k == 0) { return json_string(c, &t->dtype); }
        return k == 1 ? safetensors_counts(p, 2, &t->shape, &f->bad_shape) : safetensors_counts(p, 2, &f->offsets, &f->bad_offset);
    });
}

// One tensor entry {"dtype": ..., "shape": [...], "data_offsets": [begin, end]} into *t
// (t->name set), checked on its own.
static inline bool safetensors_parse_tensor(SafeHeaderParse* p, SafeTensor* t) {
    std::string quoted = safetensors_quoted(t->name);
    const char* q = quoted.c_str();
    if (json_peek(&p->c) != '{') { return safetensors_skip(p, 1) && safetensors_format_error(p, "tensor %s: entry is not an object", q); }
    SafeTensorFields f;
    if (!safetensors_tensor_members(p, t, q, &f)) { return false; }
    for (int k = 0; k < 3; k++) {
        if (!f.seen[k]) { return safetensors_format_error(p, "tensor %s: no \"%s\"", q, SAFETENSOR_KEYS[k]); }
    }
    if (!f.unknown.empty()) { return safetensors_format_error(p, "tensor %s: unknown key %s", q, f.unknown.c_str()); }
    size_t element_size = safetensors_dtype_size(t->dtype);
    if (element_size == 0) { return safetensors_format_error(p, "tensor %s: unknown dtype %s", q, safetensors_quoted(t->dtype).c_str()); }
    if (f.bad_shape != SIZE_MAX) { return safetensors_format_error(p, "tensor %s: shape entry %zu is not a non-negative integer", q, f.bad_shape); }
    if (f.bad_offset != SIZE_MAX || f.offsets.size() != 2) {
        return safetensors_format_error(p, "tensor %s: data_offsets is not [begin, end] of non-negative integers", q);
    }
    uint64_t bytes;
    if (!safetensors_shape_bytes(t->shape, element_size, &bytes)) { return safetensors_format_error(p, "tensor %s: shape product overflows", q); }
    t->begin = (uint64_t)f.offsets[0];
    t->end = (uint64_t)f.offsets[1];
    unsigned long long begin = t->begin, end = t->end;
    if (end < begin) { return safetensors_format_error(p, "tensor %s: data_offsets [%llu, %llu] end before they begin", q, begin, end); }
    if (end - begin != bytes) {
        return safetensors_format_error(p, "tensor %s: data_offsets [%llu, %llu] hold %llu bytes, but its dtype and shape need %llu", q,
                                        begin, end, end - begin, (unsigned long long)bytes);
    }
    return true;
}

// "__metadata__": an object of strings, each key once.
static inline bool safetensors_parse_metadata(SafeHeaderParse* p, SafeFile* out) {
    JsonCursor* c = &p->c;
    if (json_peek(c) != '{') { return safetensors_skip(p, 1) && safetensors_format_error(p, "__metadata__ is not an object"); }
    size_t first = out->metadata.size();
    bool ok = json_object(c, 1, [&](std::string& key) {
        if (json_peek(c) != '"') {
            return safetensors_skip(p, 2) && safetensors_format_error(p, "__metadata__ %s is not a string", safetensors_quoted(key).c_str());
        }
        out->metadata.emplace_back(std::move(key), std::string());
        return json_string(c, &out->metadata.back().second);
    });
    if (!ok) { return false; }
    std::vector<const std::string*> keys;
    for (size_t i = first; i < out->metadata.size(); i++) { keys.push_back(&out->metadata[i].first); }
    const std::string* duplicate = safetensors_first_duplicate(keys);
    if (duplicate != nullptr) { return safetensors_format_error(p, "__metadata__ has the key %s twice", safetensors_quoted(*duplicate).c_str()); }
    return true;
}

// The whole header JSON: an object of tensor entries and at most one "__metadata__", read
// member by member (memory grows with what is kept, never with a tree of the text).
static inline bool safetensors_parse_json(SafeHeaderParse* p, SafeFile* out) {
    JsonCursor* c = &p->c;
    if (json_peek(c) != '{') {
        bool is_json = json_value(c, nullptr, 0) && (json_peek(c) == -1 || json_error(c, "unexpected text after the value"));
        return is_json && safetensors_format_error(p, "header is not a JSON object");
    }
    if (c->pos != 0) { return safetensors_format_error(p, "header does not start with '{'"); }
    bool has_metadata = false;
    bool ok = json_object(c, 0, [&](std::string& key) {
        if (key == "__metadata__") {
            if (has_metadata) { return safetensors_format_error(p, "\"__metadata__\" appears twice"); }
            has_metadata = true;
            return safetensors_parse_metadata(p, out);
        }
        out->tensors.emplace_back();
        out->tensors.back().name = std::move(key);
        return safetensors_parse_tensor(p, &out->tensors.back());
    });
    if (!ok) { return false; }
    if (json_peek(c) != -1) { return json_error(c, "unexpected text after the value"); }
    std::vector<const std::string*> names;
    for (const SafeTensor& t : out->tensors) { names.push_back(&t.name); }
    const std::string* duplicate = safetensors_first_duplicate(names);
    if (duplicate != nullptr) { return safetensors_format_error(p, "%s appears twice", safetensors_quoted(*duplicate).c_str()); }
    return true;
}

// The tensors, in order of their data, must cover the data section [0, data_size) exactly.
static inline bool safetensors_check_layout(const SafeFile& file, uint64_t data_size, char* error, size_t error_size) {
    std::vector<const SafeTensor*> order;
    for (const SafeTensor& t : file.tensors) {
        if (t.end > data_size) {
            return safetensors_error(error, error_size, "tensor %s: data_offsets [%llu, %llu] run past the end of the data (%llu bytes)",
                                     safetensors_quoted(t.name).c_str(), (unsigned long long)t.begin,
                                     (unsigned long long)t.end, (unsigned long long)data_size);
        }
        order.push_back(&t);
    }
    std::sort(order.begin(), order.end(), [](const SafeTensor* a, const SafeTensor* b) {
        return a->begin != b->begin ? a->begin < b->begin : a->end != b->end ? a->end < b->end : a < b;
    });
    uint64_t covered = 0;  // the data before this offset belongs to the tensors so far
    const SafeTensor* previous = nullptr;
    for (const SafeTensor* t : order) {
        if (t->begin < covered) {
            return safetensors_error(error, error_size, "tensor %s overlaps tensor %s", safetensors_quoted(t->name).c_str(),
                                     safetensors_quoted(previous->name).c_str());
        }
        if (t->begin > covered) {
            return safetensors_error(error, error_size, "bytes [%llu, %llu) of the data before tensor %s belong to no tensor",
                                     (unsigned long long)covered, (unsigned long long)t->begin, safetensors_quoted(t->name).c_str());
        }
        covered = t->end;
        previous = t;
    }
    if (covered < data_size) {
        return safetensors_error(error, error_size, "the last %llu bytes of the data belong to no tensor",
                                 (unsigned long long)(data_size - covered));
    }
    return true;
}

// Parses the header from the first `available` bytes of a file of file_size bytes (all of
// the header must be there: 8 + N bytes). On any defect returns false with a one-line
// message in error; JSON errors count bytes from the start of the JSON (file byte 8).
static inline bool safetensors_parse_header(const uint8_t* bytes, size_t available, uint64_t file_size, SafeFile* out,
                                            char* error, size_t error_size) {
    *out = SafeFile();
    uint64_t n = 0;
    if (!safetensors_header_length(bytes, available, file_size, &n, error, error_size)) { return false; }
    if (available - 8 < n) {
        return safetensors_error(error, error_size, "only %zu of the header's %llu bytes are available", available - 8,
                                 (unsigned long long)n);
    }
    SafeHeaderParse p = {json_cursor(bytes + 8, (size_t)n), error, error_size, false};
    if (!safetensors_parse_json(&p, out)) {
        if (!p.format_error) {
            char json_error[128];
            json_format_error(p.c, json_error, sizeof(json_error));
            safetensors_error(error, error_size, "header: %s", json_error);
        }
        *out = SafeFile();
        return false;
    }
    out->data_offset = 8 + n;
    out->file_size = file_size;
    return safetensors_check_layout(*out, file_size - out->data_offset, error, error_size);
}

// ----------------------------------------------------------------------------
// Tensors

// The tensor named `name`, or nullptr.
static inline const SafeTensor* safetensors_find(const SafeFile* file, const char* name) {
    for (const SafeTensor& t : file->tensors) {
        if (t.name == name) { return &t; }
    }
    return nullptr;
}

// Number of elements (1 for a scalar); a parsed header guarantees it fits.
static inline size_t safetensors_numel(const SafeTensor* t) {
    uint64_t numel;
    safetensors_shape_bytes(t->shape, 1, &numel);
    return (size_t)numel;
}

// float32 of an IEEE half: exact, subnormals, infinities and NaN payloads included.
static inline float safetensors_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1F;
    uint32_t mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | mantissa << 13;
    } else if (exponent != 0) {
        bits = sign | (exponent + 112) << 23 | mantissa << 13;  // rebias 15 -> 127
    } else {
        float magnitude = (float)mantissa * 5.9604644775390625e-8f;  // subnormal: mantissa * 2^-24, exact
        return sign ? -magnitude : magnitude;
    }
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

// float32 of a bfloat16: its bits are the top half of a float32's.
static inline float safetensors_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

// Reads `bytes` bytes of tensor t's data, starting `skip` bytes into it; fails naming file and tensor.
static inline void safetensors_read_bytes(FILE* f, const char* path, const SafeFile* file, const SafeTensor* t,
                                          uint64_t skip, void* dst, size_t bytes) {
    uint64_t offset = file->data_offset + t->begin + skip;
    bool ok = fseeko(f, (off_t)offset, SEEK_SET) == 0 && fread(dst, 1, bytes, f) == bytes;
    if (!ok) {
        fail("%s: tensor %s: cannot read %zu bytes at byte %llu: %s", path, safetensors_quoted(t->name).c_str(), bytes,
             (unsigned long long)offset, ferror(f) ? strerror(errno) : "file is truncated");
    }
}

// Reads tensor t of `file` (parsed from `path`) into out[numel] as float32: F32 as is, F16
// and BF16 converted exactly. Fails naming the file and tensor on another dtype or a read error.
static inline void safetensors_read_f32(const char* path, const SafeFile* file, const SafeTensor* t, float* out) {
    bool is_f16 = t->dtype == "F16", is_bf16 = t->dtype == "BF16";
    if (t->dtype != "F32" && !is_f16 && !is_bf16) {
        fail("%s: tensor %s has dtype %s; only F32, F16 and BF16 can be read as float32", path,
             safetensors_quoted(t->name).c_str(), t->dtype.c_str());
    }
    size_t numel = safetensors_numel(t);
    if (numel == 0) { return; }
    FILE* f = fopen_or_fail(path, "rb");
    if (!is_f16 && !is_bf16) {
        safetensors_read_bytes(f, path, file, t, 0, out, numel * sizeof(float));
        fclose(f);
        return;
    }
    std::vector<uint16_t> chunk(std::min(numel, (size_t)1 << 20));
    for (size_t done = 0; done < numel; done += chunk.size()) {
        size_t count = std::min(chunk.size(), numel - done);
        safetensors_read_bytes(f, path, file, t, done * 2, chunk.data(), count * 2);
        for (size_t i = 0; i < count; i++) {
            out[done + i] = is_f16 ? safetensors_f16_to_f32(chunk[i]) : safetensors_bf16_to_f32(chunk[i]);
        }
    }
    fclose(f);
}

// ----------------------------------------------------------------------------
// Files

// Reads and checks the header of the safetensors file at path; fails with "PATH: problem".
static inline void safetensors_open(const char* path, SafeFile* out) {
    FILE* f = fopen_or_fail(path, "rb");
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { fail("cannot stat %s: %s", path, strerror(errno)); }
    uint64_t size = (uint64_t)st.st_size;
    std::vector<uint8_t> header(8);
    size_t got = fread(header.data(), 1, std::min(size, (uint64_t)8), f);
    uint64_t n = 0;
    char error[512];
    bool ok = safetensors_header_length(header.data(), got, size, &n, error, sizeof(error));
    if (ok) {
        header.resize(8 + n);
        fread_or_fail(header.data() + 8, 1, n, f, path);
        ok = safetensors_parse_header(header.data(), header.size(), size, out, error, sizeof(error));
    }
    fclose(f);
    if (!ok) { fail("%s: %s", path, error); }
}

// The header JSON of F32 tensors laid out in order, then padded with spaces so the data
// starts at a multiple of 8 bytes.
static inline std::string safetensors_header_json(const std::vector<SafeTensorOut>& tensors,
                                                  const std::vector<std::pair<std::string, std::string>>& metadata) {
    std::string json = "{";
    if (!metadata.empty()) {
        json += "\"__metadata__\":{";
        for (size_t i = 0; i < metadata.size(); i++) {
            json += (i > 0 ? "," : "") + json_quote(metadata[i].first) + ":" + json_quote(metadata[i].second);
        }
        json += "}";
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); i++) {
        uint64_t bytes;
        safetensors_shape_bytes(tensors[i].shape, sizeof(float), &bytes);
        std::string shape;
        for (size_t d = 0; d < tensors[i].shape.size(); d++) { shape += (d > 0 ? "," : "") + std::to_string(tensors[i].shape[d]); }
        json += (i > 0 || !metadata.empty() ? "," : "") + json_quote(tensors[i].name) + ":{\"dtype\":\"F32\",\"shape\":[" +
                shape + "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
        offset += bytes;
    }
    json += "}";
    while ((8 + json.size()) % 8 != 0) { json += ' '; }
    return json;
}

// Fails (naming path) on what the writer cannot store faithfully or the reader would refuse.
static inline void safetensors_check_output(const char* path, const std::vector<SafeTensorOut>& tensors,
                                            const std::vector<std::pair<std::string, std::string>>& metadata) {
    std::vector<const std::string*> names, keys;
    uint64_t total = 0;  // bytes of data
    for (const SafeTensorOut& t : tensors) {
        std::string q = safetensors_quoted(t.name);
        if (t.name == "__metadata__") { fail("%s: a tensor cannot be named \"__metadata__\"", path); }
        if (!utf8_is_valid((const uint8_t*)t.name.data(), t.name.size())) { fail("%s: tensor name %s is not UTF-8", path, q.c_str()); }
        uint64_t bytes;
        if (!safetensors_shape_bytes(t.shape, sizeof(float), &bytes) || __builtin_add_overflow(total, bytes, &total)) {
            fail("%s: tensor %s has a bad shape", path, q.c_str());
        }
        if (t.data == nullptr && bytes > 0) { fail("%s: tensor %s has no data", path, q.c_str()); }
        names.push_back(&t.name);
    }
    for (const auto& entry : metadata) {
        bool utf8 = utf8_is_valid((const uint8_t*)entry.first.data(), entry.first.size()) &&
                    utf8_is_valid((const uint8_t*)entry.second.data(), entry.second.size());
        if (!utf8) { fail("%s: metadata %s is not UTF-8", path, safetensors_quoted(entry.first).c_str()); }
        keys.push_back(&entry.first);
    }
    const std::string* duplicate = safetensors_first_duplicate(names);
    if (duplicate != nullptr) { fail("%s: tensor %s appears twice", path, safetensors_quoted(*duplicate).c_str()); }
    duplicate = safetensors_first_duplicate(keys);
    if (duplicate != nullptr) { fail("%s: metadata key %s appears twice", path, safetensors_quoted(*duplicate).c_str()); }
}

// Writes F32 tensors (data in the given order, no holes) and string metadata to path
// atomically (temporary file + rename).
static inline void safetensors_write_f32(const char* path, const std::vector<SafeTensorOut>& tensors,
                                         const std::vector<std::pair<std::string, std::string>>& metadata) {
    safetensors_check_output(path, tensors, metadata);
    std::string json = safetensors_header_json(tensors, metadata);
    if (json.size() > SAFETENSORS_MAX_HEADER) { fail("%s: header of %zu bytes is over the format's limit", path, json.size()); }
    uint8_t length[8];
    for (int i = 0; i < 8; i++) { length[i] = (uint8_t)((uint64_t)json.size() >> (8 * i)); }
    AtomicFile af;
    open_atomic(&af, path);
    atomic_write_or_fail(&af, length, 1, 8);
    atomic_write_or_fail(&af, json.data(), 1, json.size());
    for (const SafeTensorOut& t : tensors) {
        uint64_t bytes;
        safetensors_shape_bytes(t.shape, sizeof(float), &bytes);
        atomic_write_or_fail(&af, t.data, 1, bytes);
    }
    commit_atomic(&af);
}
