// Tests of llmc/safetensors.h: write then read back, F16/BF16 conversion, metadata, every
// malformed header the parser must refuse (with its message), and the file-level failures.
// Run from the repo root: build/test_safetensors [name filter]
#include <math.h>
#include <stdlib.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/safetensors.h"

using Metadata = std::vector<std::pair<std::string, std::string>>;

// ----------------------------------------------------------------------------
// helpers

static std::string u64_le(uint64_t value) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; i++) { bytes[i] = (char)(value >> (8 * i)); }
    return bytes;
}

// A file image: the header's length, the header, then `data`.
static std::string image(const std::string& header, const std::string& data = "") { return u64_le(header.size()) + header + data; }

static std::string float_bytes(const std::vector<float>& values) { return std::string((const char*)values.data(), values.size() * 4); }

static std::string u16_bytes(const std::vector<uint16_t>& values) { return std::string((const char*)values.data(), values.size() * 2); }

// One tensor's header entry.
static std::string entry(const std::string& name, const char* dtype, const char* shape, uint64_t begin, uint64_t end) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// Parses a whole image with the pure parser; its error, or "(parsed)".
static std::string parse_error(const std::string& bytes, SafeFile* file = nullptr) {
    SafeFile local;
    char error[512] = "";
    bool ok = safetensors_parse_header((const uint8_t*)bytes.data(), bytes.size(), bytes.size(), file ? file : &local, error,
                                       sizeof(error));
    return ok ? "(parsed)" : error;
}

// True if the image is refused with exactly `message`; prints what came instead.
static bool refuses(const std::string& bytes, const std::string& message) {
    std::string error = parse_error(bytes);
    if (error != message) { fprintf(stderr, "  got \"%s\"\n  expected \"%s\"\n", error.c_str(), message.c_str()); }
    return error == message;
}

// The image of a header object with these entries and `data_size` zero bytes of data.
static std::string header_image(const std::string& entries, size_t data_size) {
    return image("{" + entries + "}", std::string(data_size, '\0'));
}

static uint32_t bits_of(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    return bits;
}

// ----------------------------------------------------------------------------
// writing and reading back

TEST(write_then_read_back) {
    std::string dir = make_temp_dir("test_safetensors");
    std::string path = dir + "/model.safetensors";
    std::vector<float> matrix = {1.0f, -2.5f, 3.25f, 1e-42f, -0.0f, 65504.0f};
    uint32_t nan_bits = 0x7FC12345;
    std::vector<float> vector = {INFINITY, -INFINITY, 0.0f, 1.0f / 3.0f};
    memcpy(&vector[2], &nan_bits, 4);
    float scalar = 42.0f;
    std::vector<SafeTensorOut> tensors = {
        {"h.0.attn.w", {2, 3}, matrix.data()}, {"wte", {4}, vector.data()}, {"scale", {}, &scalar}, {"empty", {0, 5}, nullptr}};
    Metadata metadata = {{"format", "pt"}, {"note", "two\nlines, \"quoted\", caf\xC3\xA9"}};
    safetensors_write_f32(path.c_str(), tensors, metadata);
    SafeFile file;
    safetensors_open(path.c_str(), &file);
    CHECK(file.tensors.size() == 4 && file.metadata == metadata);
    CHECK(file.data_offset % 8 == 0 && file.file_size == file.data_offset + 4 * (6 + 4 + 1));
    CHECK(file.file_size == (uint64_t)file_size(path.c_str()));
    uint64_t offset = 0;
    for (size_t i = 0; i < file.tensors.size() && i < tensors.size(); i++) {
        const SafeTensor& t = file.tensors[i];
        CHECK(t.name == tensors[i].name && t.dtype == "F32" && t.shape == tensors[i].shape);
        CHECK(t.begin == offset && t.end == offset + 4 * safetensors_numel(&t));  // in order, no holes
        offset = t.end;
    }
    std::vector<float> got_matrix(6, 7.0f), got_vector(4, 7.0f);
    float got_scalar = 0.0f;
    safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "h.0.attn.w"), got_matrix.data());
    safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "wte"), got_vector.data());
    safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "scale"), &got_scalar);
    safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "empty"), nullptr);
    CHECK(memcmp(got_matrix.data(), matrix.data(), 24) == 0);  // bit-exact, -0 and the subnormal included
    CHECK(memcmp(got_vector.data(), vector.data(), 16) == 0);  // the NaN's payload included
    CHECK(got_scalar == 42.0f);
    remove_dir(dir);
}

// The header is exactly what the format asks for, padded with spaces to 8-byte alignment.
TEST(written_header_is_exact) {
    std::string dir = make_temp_dir("test_safetensors");
    std::string path = dir + "/small.safetensors";
    float values[3] = {1.0f, 2.0f, 3.0f};
    safetensors_write_f32(path.c_str(), {{"a", {1}, values}, {"b\"\n", {2}, values + 1}}, {{"k", "v"}});
    std::string json = "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"b\\\"\\n\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    std::string padded = json + std::string((8 - (8 + json.size()) % 8) % 8, ' ');
    CHECK((8 + padded.size()) % 8 == 0 && padded.size() > json.size());
    CHECK(read_file(path) == image(padded, float_bytes({1.0f, 2.0f, 3.0f})));
    safetensors_write_f32(path.c_str(), {}, {});  // replaces the file; no tensors, no metadata
    CHECK(read_file(path) == image("{}      "));
    SafeFile file;
    safetensors_open(path.c_str(), &file);
    CHECK(file.tensors.empty() && file.metadata.empty() && file.data_offset == 16);
    remove_dir(dir);
}

TEST(write_leaves_no_temporary_file) {
    std::string dir = make_temp_dir("test_safetensors");
    std::string path = dir + "/w.safetensors";
    float one = 1.0f;
    safetensors_write_f32(path.c_str(), {{"x", {1}, &one}}, {});
    safetensors_write_f32(path.c_str(), {{"x", {1}, &one}}, {});  // over the first
    size_t entries = 0;
    for (const auto& file : std::filesystem::directory_iterator(dir)) { entries += file.path() == path ? 1 : 2; }
    CHECK(entries == 1);  // the file itself and nothing else
    remove_dir(dir);
}

TEST(writer_refuses_what_it_cannot_store) {
    float one = 1.0f;
    std::string dir = make_temp_dir("test_safetensors");
    std::string never_written = dir + "/never_written.safetensors";
    const char* path = never_written.c_str();
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {{"a", {1}, &one}, {"a", {1}, &one}}, {}); },
                              "never_written.safetensors: tensor \"a\" appears twice"));
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {{"__metadata__", {1}, &one}}, {}); },
                              "a tensor cannot be named \"__metadata__\""));
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {{"bad\xFF", {1}, &one}}, {}); },
                              "tensor name \"bad\\ufffd\" is not UTF-8"));
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {{"a", {2, -1}, &one}}, {}); }, "tensor \"a\" has a bad shape"));
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {{"a", {1LL << 62, 4}, &one}}, {}); }, "tensor \"a\" has a bad shape"));
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {{"a", {1LL << 61}, &one}, {"b", {1LL << 61}, &one}}, {}); },
                              "tensor \"b\" has a bad shape"));  // 2^63 bytes each: the offsets would overflow
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {{"a", {2}, nullptr}}, {}); }, "tensor \"a\" has no data"));
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {}, {{"k", "1"}, {"k", "2"}}); },
                              "metadata key \"k\" appears twice"));
    CHECK(expect_exit_failure([&] { safetensors_write_f32(path, {}, {{"k", "\xC3"}}); }, "metadata \"k\" is not UTF-8"));
    CHECK(std::filesystem::is_empty(dir));  // no file, no temporary left behind
    remove_dir(dir);
}

// ----------------------------------------------------------------------------
// F16 and BF16

// Hand-written bit patterns and the float32 bits they must become.
constexpr uint16_t F16_BITS[] = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x8000, 0x8001, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00};
constexpr uint32_t F16_AS_F32[] = {
    0x3F800000,  // 1.0
    0xC0200000,  // -2.5
    0x477FE000,  // 65504, the largest half
    0x33800000,  // 2^-24, the smallest subnormal
    0x387FC000,  // 1023 * 2^-24, the largest subnormal
    0x38800000,  // 2^-14, the smallest normal
    0x80000000,  // -0
    0xB3800000,  // -2^-24
    0x7F800000,  // inf
    0xFF800000,  // -inf
    0x7FC00000,  // quiet NaN
    0x7F802000,  // signalling NaN, payload kept
    0xFFC00000,  // negative NaN
};
constexpr uint16_t BF16_BITS[] = {0x3F80, 0xC020, 0x7F7F, 0x0001, 0x0080, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81};
constexpr uint32_t BF16_AS_F32[] = {
    0x3F800000,  // 1.0
    0xC0200000,  // -2.5
    0x7F7F0000,  // the largest bfloat16
    0x00010000,  // 2^-133, the smallest subnormal
    0x00800000,  // 2^-126, the smallest normal
    0x80000000,  // -0
    0x7F800000,  // inf
    0xFF800000,  // -inf
    0x7FC00000,  // quiet NaN
    0x7F810000,  // signalling NaN, payload kept
};

TEST(f16_and_bf16_known_patterns) {
    for (size_t i = 0; i < sizeof(F16_BITS) / 2; i++) { CHECK(bits_of(safetensors_f16_to_f32(F16_BITS[i])) == F16_AS_F32[i]); }
    for (size_t i = 0; i < sizeof(BF16_BITS) / 2; i++) { CHECK(bits_of(safetensors_bf16_to_f32(BF16_BITS[i])) == BF16_AS_F32[i]); }
    CHECK(safetensors_f16_to_f32(0x3C00) == 1.0f && safetensors_f16_to_f32(0xC100) == -2.5f);
    CHECK(safetensors_f16_to_f32(0x7BFF) == 65504.0f && safetensors_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(isinf(safetensors_f16_to_f32(0x7C00)) && isnan(safetensors_f16_to_f32(0x7E00)));
    CHECK(safetensors_bf16_to_f32(0x0001) == ldexpf(1.0f, -133) && isnan(safetensors_bf16_to_f32(0x7FC0)));
}

// Every half against its definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m when e = 0.
TEST(f16_all_patterns) {
    int wrong = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
        float got = safetensors_f16_to_f32((uint16_t)h);
        bool negative = (h & 0x8000) != 0;
        bool ok;
        if (e == 31) {
            ok = m == 0 ? isinf(got) && signbit(got) == negative : isnan(got);
        } else {
            double magnitude = e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, (int)e - 25);
            ok = (double)got == (negative ? -magnitude : magnitude) && (signbit(got) != 0) == negative;
        }
        wrong += ok ? 0 : 1;
    }
    CHECK(wrong == 0);
}

// A hand-written file of F16 and BF16 tensors read through the file-level API.
TEST(read_f16_and_bf16_files) {
    std::string dir = make_temp_dir("test_safetensors");
    std::string path = dir + "/half.safetensors";
    size_t nh = sizeof(F16_BITS) / 2, nb = sizeof(BF16_BITS) / 2;
    std::string header = "{" + entry("h", "F16", ("[" + std::to_string(nh) + "]").c_str(), 0, 2 * nh) + "," +
                         entry("b", "BF16", ("[2," + std::to_string(nb / 2) + "]").c_str(), 2 * nh, 2 * (nh + nb)) + "}";
    write_file(path, image(header, u16_bytes(std::vector<uint16_t>(F16_BITS, F16_BITS + nh)) +
                                       u16_bytes(std::vector<uint16_t>(BF16_BITS, BF16_BITS + nb))));
    SafeFile file;
    safetensors_open(path.c_str(), &file);
    std::vector<float> h(nh), b(nb);
    safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "h"), h.data());
    safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "b"), b.data());
    for (size_t i = 0; i < nh; i++) { CHECK(bits_of(h[i]) == F16_AS_F32[i]); }
    for (size_t i = 0; i < nb; i++) { CHECK(bits_of(b[i]) == BF16_AS_F32[i]); }
    CHECK(safetensors_numel(safetensors_find(&file, "b")) == nb);
    remove_dir(dir);
}

// More halves than one read chunk (2^20) convert across the chunk boundary.
TEST(read_f16_larger_than_a_chunk) {
    std::string dir = make_temp_dir("test_safetensors");
    std::string path = dir + "/big.safetensors";
    size_t n = (1 << 20) + 3;
    std::vector<uint16_t> halves(n);
    std::mt19937 rng(1);
    for (uint16_t& h : halves) { h = (uint16_t)rng(); }
    write_file(path, image("{" + entry("x", "F16", ("[" + std::to_string(n) + "]").c_str(), 0, 2 * n) + "}", u16_bytes(halves)));
    SafeFile file;
    safetensors_open(path.c_str(), &file);
    std::vector<float> out(n);
    safetensors_read_f32(path.c_str(), &file, &file.tensors[0], out.data());
    size_t same = 0;
    for (size_t i = 0; i < n; i++) { same += bits_of(out[i]) == bits_of(safetensors_f16_to_f32(halves[i])) ? 1 : 0; }
    CHECK(same == n);
    remove_dir(dir);
}

// ----------------------------------------------------------------------------
// valid headers

TEST(parses_valid_headers) {
    SafeFile file;
    CHECK(parse_error(image("{}"), &file) == "(parsed)" && file.tensors.empty() && file.data_offset == 10);
    CHECK(parse_error(image("{}      "), &file) == "(parsed)");  // trailing space padding
    // header order is kept even where the data comes in another order
    std::string entries = entry("second", "F32", "[2]", 4, 12) + "," + entry("first", "I8", "[2,2]", 0, 4);
    CHECK(parse_error(header_image(entries, 12), &file) == "(parsed)");
    CHECK(file.tensors.size() == 2 && file.tensors[0].name == "second" && file.tensors[1].name == "first");
    CHECK(file.tensors[1].shape == std::vector<int64_t>({2, 2}) && file.tensors[1].dtype == "I8");
    CHECK(safetensors_find(&file, "first") == &file.tensors[1] && safetensors_find(&file, "third") == nullptr);
    CHECK(file.file_size == 8 + 2 + entries.size() + 12 && file.data_offset == 8 + 2 + entries.size());
    // scalars and empty tensors, also at the very end of the data
    entries = entry("s", "F64", "[]", 0, 8) + "," + entry("e0", "F32", "[0]", 8, 8) + "," + entry("e1", "BF16", "[3,0,2]", 8, 8);
    CHECK(parse_error(header_image(entries, 8), &file) == "(parsed)");
    CHECK(safetensors_numel(&file.tensors[0]) == 1 && safetensors_numel(&file.tensors[2]) == 0);
    // metadata in order, with escapes
    std::string with_metadata = "{\"__metadata__\":{\"b\":\"1\",\"a\":\"x\\ny\"}," + entry("t", "U8", "[1]", 0, 1) + "}";
    CHECK(parse_error(image(with_metadata, "z"), &file) == "(parsed)");
    CHECK(file.metadata == Metadata({{"b", "1"}, {"a", "x\ny"}}) && file.tensors.size() == 1);
}

TEST(every_standard_dtype) {
    const char* dtypes[] = {"BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "U16", "I16", "F16",
                            "BF16", "U32", "I32", "F32", "U64", "I64", "F64"};
    const size_t sizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    for (size_t i = 0; i < 15; i++) {
        CHECK(safetensors_dtype_size(dtypes[i]) == sizes[i]);
        CHECK(parse_error(header_image(entry("t", dtypes[i], "[3]", 0, 3 * sizes[i]), 3 * sizes[i])) == "(parsed)");
    }
    CHECK(safetensors_dtype_size("f32") == 0 && safetensors_dtype_size("F4") == 0 && safetensors_dtype_size("") == 0);
}

// ----------------------------------------------------------------------------
// malformed files, each refused with one line

TEST(refuses_bad_lengths) {
    CHECK(refuses("", "file is 0 bytes, too short for the 8-byte header length"));
    CHECK(refuses(std::string("\x02\0\0\0\0", 5), "file is 5 bytes, too short for the 8-byte header length"));
    CHECK(refuses(u64_le(3) + "{}", "header length 3 runs past the end of the file (10 bytes)"));
    CHECK(refuses(u64_le(2147483648u) + "{}", "header length 2147483648 runs past the end of the file (10 bytes)"));
    CHECK(refuses(u64_le(UINT64_MAX) + "{}", "header length 18446744073709551615 runs past the end of the file (10 bytes)"));
    CHECK(refuses(u64_le(0), "header: bad JSON at byte 0: expected a value"));
    // a length over the limit in a file big enough to hold it: refused from the first 8 bytes alone
    SafeFile file;
    char error[256];
    std::string length = u64_le(SAFETENSORS_MAX_HEADER + 1);
    CHECK(!safetensors_parse_header((const uint8_t*)length.data(), 8, 300000000, &file, error, sizeof(error)));
    CHECK(strcmp(error, "header length 100000001 is over the limit of 100000000 bytes") == 0);
    // a caller that hands over less than the whole header
    std::string whole = image("{}  ", "");
    CHECK(!safetensors_parse_header((const uint8_t*)whole.data(), 10, whole.size(), &file, error, sizeof(error)));
    CHECK(strcmp(error, "only 2 of the header's 4 bytes are available") == 0);
    CHECK(!safetensors_parse_header((const uint8_t*)whole.data(), 4, whole.size(), &file, error, sizeof(error)));
    CHECK(strcmp(error, "the header length's 8 bytes are not available") == 0);
}

TEST(refuses_bad_header_json) {
    CHECK(refuses(image("{\"a\":}"), "header: bad JSON at byte 5: expected a value"));
    CHECK(refuses(image("{\"a\" {}}"), "header: bad JSON at byte 5: expected ':'"));
    CHECK(refuses(image("{} x"), "header: bad JSON at byte 3: unexpected text after the value"));
    CHECK(refuses(image("{\"\xFF\":1}"), "header: bad JSON at byte 2: invalid UTF-8 in string"));
    CHECK(refuses(image(std::string("{}\0\0", 4)), "header: bad JSON at byte 2: unexpected text after the value"));
    // JSON errors inside entries come before the format's own complaints
    CHECK(refuses(image("{\"w\":{\"dtype\":tru}}"), "header: bad JSON at byte 14: expected a value"));
    CHECK(refuses(image("{\"w\":{\"dtype\":[1,]}}"), "header: bad JSON at byte 17: expected a value"));
    CHECK(refuses(image("{\"w\":{\"shape\":[1,x]}}"), "header: bad JSON at byte 17: expected a value"));
    CHECK(refuses(image("{\"w\":{\"shape\":nul}}"), "header: bad JSON at byte 14: expected a value"));
    CHECK(refuses(image("{\"w\":{\"data_offsets\":{1}}}"), "header: bad JSON at byte 22: expected a string"));
    CHECK(refuses(image("{\"w\":-}"), "header: bad JSON at byte 6: expected a digit"));
    CHECK(refuses(image("{\"__metadata__\":[\"\\x\"]}"), "header: bad JSON at byte 18: bad escape"));
    CHECK(refuses(image("{\"w\":[1 2]}"), "header: bad JSON at byte 8: expected ',' or ']'"));
    CHECK(refuses(image("{\"__metadata__\":{\"k\":01}}"), "header: bad JSON at byte 21: leading zero in a number"));
    CHECK(refuses(image("{\"w\":{\"x\":" + std::string(63, '[') + std::string(63, ']') + "}}"),
                  "header: bad JSON at byte 72: nesting deeper than 64 levels"));  // the 65th level: root, entry, 63 arrays
    CHECK(refuses(image("{\"w\":{\"x\":" + std::string(62, '[') + std::string(62, ']') + "}}"), "tensor \"w\": no \"dtype\""));
    CHECK(refuses(image("[] x"), "header: bad JSON at byte 3: unexpected text after the value"));
    CHECK(refuses(image("[]"), "header is not a JSON object"));
    CHECK(refuses(image("\"{}\""), "header is not a JSON object"));
    CHECK(refuses(image("  {}"), "header does not start with '{'"));
}

TEST(refuses_bad_tensor_entries) {
    CHECK(refuses(header_image("\"w\":5", 0), "tensor \"w\": entry is not an object"));
    CHECK(refuses(header_image("\"w\":[\"F32\",[1],[0,4]]", 4), "tensor \"w\": entry is not an object"));
    CHECK(refuses(header_image("\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}", 4), "tensor \"w\": no \"dtype\""));
    CHECK(refuses(header_image("\"w\":{\"dtpye\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4), "tensor \"w\": no \"dtype\""));
    CHECK(refuses(header_image("\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}", 4), "tensor \"w\": no \"shape\""));
    CHECK(refuses(header_image("\"w\":{\"dtype\":\"F32\",\"shapes\":[1],\"data_offsets\":[0,4]}", 4), "tensor \"w\": no \"shape\""));
    CHECK(refuses(header_image("\"w\":{\"dtype\":\"F32\",\"shape\":[1]}", 4), "tensor \"w\": no \"data_offsets\""));
    CHECK(refuses(header_image("\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"offsets\":[0,4]}", 4), "tensor \"w\": no \"data_offsets\""));
    CHECK(refuses(header_image("\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}", 4),
                  "tensor \"w\": unknown key \"extra\""));
    CHECK(refuses(header_image("\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}", 4),
                  "tensor \"w\": \"dtype\" appears twice"));
}

TEST(refuses_bad_dtypes) {
    CHECK(refuses(header_image("\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}", 4), "tensor \"w\": dtype is not a string"));
    CHECK(refuses(header_image(entry("w", "F33", "[1]", 0, 4), 4), "tensor \"w\": unknown dtype \"F33\""));
    CHECK(refuses(header_image(entry("w", "f32", "[1]", 0, 4), 4), "tensor \"w\": unknown dtype \"f32\""));
    CHECK(refuses(header_image(entry("w", "", "[1]", 0, 4), 4), "tensor \"w\": unknown dtype \"\""));
}

TEST(refuses_bad_shapes) {
    CHECK(refuses(header_image(entry("w", "F32", "4", 0, 16), 16), "tensor \"w\": shape is not an array"));
    CHECK(refuses(header_image(entry("w", "F32", "[-1]", 0, 4), 4), "tensor \"w\": shape entry 0 is not a non-negative integer"));
    CHECK(refuses(header_image(entry("w", "F32", "[2.0]", 0, 8), 8), "tensor \"w\": shape entry 0 is not a non-negative integer"));
    CHECK(refuses(header_image(entry("w", "F32", "[1,2.5]", 0, 8), 8), "tensor \"w\": shape entry 1 is not a non-negative integer"));
    CHECK(refuses(header_image(entry("w", "F32", "[1,\"2\"]", 0, 8), 8), "tensor \"w\": shape entry 1 is not a non-negative integer"));
    CHECK(refuses(header_image(entry("w", "F32", "[2e0]", 0, 8), 8), "tensor \"w\": shape entry 0 is not a non-negative integer"));
    CHECK(refuses(header_image(entry("w", "F32", "[null]", 0, 4), 4), "tensor \"w\": shape entry 0 is not a non-negative integer"));
    CHECK(refuses(header_image(entry("w", "F32", "[4294967296,4294967296]", 0, 0), 0), "tensor \"w\": shape product overflows"));
    CHECK(refuses(header_image(entry("w", "U8", "[4611686018427387904,4]", 0, 0), 0), "tensor \"w\": shape product overflows"));
    CHECK(refuses(header_image(entry("w", "F64", "[2305843009213693952]", 0, 0), 0), "tensor \"w\": shape product overflows"));
    // a zero anywhere makes an empty tensor, however large the other dimensions
    SafeFile file;
    CHECK(parse_error(header_image(entry("w", "F64", "[9223372036854775807,9223372036854775807,0]", 0, 0), 0), &file) == "(parsed)");
    CHECK(safetensors_numel(&file.tensors[0]) == 0);
}

TEST(refuses_bad_offsets) {
    const char* message = "tensor \"w\": data_offsets is not [begin, end] of non-negative integers";
    const char* bad[] = {"[0]", "[0,4,8]", "[-4,0]", "[0,4.0]", "\"0,4\"", "{}", "[0,null]"};
    for (const char* offsets : bad) {
        CHECK(refuses(header_image("\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":" + std::string(offsets) + "}", 4), message));
    }
    CHECK(refuses(header_image(entry("w", "F32", "[1]", 8, 4), 8), "tensor \"w\": data_offsets [8, 4] end before they begin"));
    CHECK(refuses(header_image(entry("w", "F32", "[2]", 0, 4), 4),
                  "tensor \"w\": data_offsets [0, 4] hold 4 bytes, but its dtype and shape need 8"));
    CHECK(refuses(header_image(entry("w", "F16", "[2,2]", 0, 16), 16),
                  "tensor \"w\": data_offsets [0, 16] hold 16 bytes, but its dtype and shape need 8"));
    CHECK(refuses(header_image(entry("w", "F32", "[2]", 0, 8), 4), "tensor \"w\": data_offsets [0, 8] run past the end of the data (4 bytes)"));
    CHECK(refuses(header_image(entry("w", "F32", "[1]", 9223372036854775000u, 9223372036854775004u), 4),
                  "tensor \"w\": data_offsets [9223372036854775000, 9223372036854775004] run past the end of the data (4 bytes)"));
}

TEST(refuses_overlaps_holes_and_trailing_bytes) {
    CHECK(refuses(header_image(entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12), 12),
                  "tensor \"b\" overlaps tensor \"a\""));
    CHECK(refuses(header_image(entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 0, 8), 8),
                  "tensor \"b\" overlaps tensor \"a\""));
    CHECK(refuses(header_image(entry("a", "F32", "[2]", 0, 8) + "," + entry("z", "F32", "[0]", 4, 4), 8),
                  "tensor \"z\" overlaps tensor \"a\""));
    CHECK(refuses(header_image(entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12), 12),
                  "bytes [4, 8) of the data before tensor \"b\" belong to no tensor"));
    CHECK(refuses(header_image(entry("a", "F32", "[1]", 4, 8), 8), "bytes [0, 4) of the data before tensor \"a\" belong to no tensor"));
    CHECK(refuses(header_image(entry("a", "F32", "[1]", 0, 4), 8), "the last 4 bytes of the data belong to no tensor"));
    CHECK(refuses(header_image("", 1), "the last 1 bytes of the data belong to no tensor"));
}

TEST(refuses_duplicates_and_bad_metadata) {
    CHECK(refuses(header_image(entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[1]", 4, 8), 8), "\"a\" appears twice"));
    CHECK(refuses(header_image("\"__metadata__\":{},\"__metadata__\":{}", 0), "\"__metadata__\" appears twice"));
    CHECK(refuses(header_image("\"__metadata__\":[]", 0), "__metadata__ is not an object"));
    CHECK(refuses(header_image("\"__metadata__\":\"x\"", 0), "__metadata__ is not an object"));
    CHECK(refuses(header_image("\"__metadata__\":{\"k\":1}", 0), "__metadata__ \"k\" is not a string"));
    CHECK(refuses(header_image("\"__metadata__\":{\"a\":\"x\",\"k\":null}", 0), "__metadata__ \"k\" is not a string"));
    CHECK(refuses(header_image("\"__metadata__\":{\"k\":{\"n\":\"v\"}}", 0), "__metadata__ \"k\" is not a string"));
    CHECK(refuses(header_image("\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}", 0), "__metadata__ has the key \"k\" twice"));
}

// Names in errors are quoted, so a message stays on one line, and long names are cut short.
TEST(errors_quote_and_shorten_names) {
    CHECK(refuses(header_image(entry("a\\nb", "F33", "[1]", 0, 4), 4), "tensor \"a\\nb\": unknown dtype \"F33\""));
    std::string long_name(200, 'x');
    CHECK(refuses(header_image(entry(long_name, "F33", "[1]", 0, 4), 4),
                  "tensor \"" + std::string(64, 'x') + "\"...: unknown dtype \"F33\""));
    std::string accented = "x";  // then 2-byte characters: the cut must not split the one at byte 63
    for (int i = 0; i < 40; i++) { accented += "\xC3\xA9"; }
    CHECK(refuses(header_image(entry(accented, "F33", "[1]", 0, 4), 4),
                  "tensor \"" + accented.substr(0, 63) + "\"...: unknown dtype \"F33\""));
    char error[24];
    SafeFile file;
    std::string bytes = header_image(entry(long_name, "F33", "[1]", 0, 4), 4);
    CHECK(!safetensors_parse_header((const uint8_t*)bytes.data(), bytes.size(), bytes.size(), &file, error, sizeof(error)));
    CHECK(strlen(error) == sizeof(error) - 1);  // cut to the buffer, terminated
}

// ----------------------------------------------------------------------------
// file-level failures

// Opening a file of `bytes` fails with "<path>: <problem>".
static bool open_fails_with(const std::string& bytes, const std::string& problem) {
    return file_refused_with(bytes, problem, [](const char* path) {
        SafeFile file;
        safetensors_open(path, &file);
    });
}

TEST(open_fails_with_one_line) {
    CHECK(expect_exit_failure([] {
        SafeFile file;
        safetensors_open("/nonexistent/model.safetensors", &file);
    }, "cannot open /nonexistent/model.safetensors"));
    CHECK(open_fails_with("", "file is 0 bytes, too short for the 8-byte header length"));
    CHECK(open_fails_with("abc", "file is 3 bytes, too short for the 8-byte header length"));
    CHECK(open_fails_with(u64_le(2147483648u) + std::string(16, ' '), "header length 2147483648 runs past the end of the file (24 bytes)"));
    CHECK(open_fails_with(image("{\"w\" 1}"), "header: bad JSON at byte 5: expected ':'"));
    CHECK(open_fails_with(header_image(entry("w", "F32", "[2]", 0, 8), 4), "tensor \"w\": data_offsets [0, 8] run past the end of the data (4 bytes)"));
    CHECK(open_fails_with(header_image(entry("w", "F32", "[1]", 0, 4), 5), "the last 1 bytes of the data belong to no tensor"));
}

TEST(read_fails_naming_file_and_tensor) {
    std::string dir = make_temp_dir("test_safetensors");
    std::string path = dir + "/ids.safetensors";
    std::string header = "{" + entry("ids", "I32", "[2]", 0, 8) + "," + entry("w", "F32", "[4]", 8, 24) + "}";
    write_file(path, image(header, std::string(24, '\0')));
    SafeFile file;
    safetensors_open(path.c_str(), &file);
    std::vector<float> out(4);
    CHECK(expect_exit_failure([&] { safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "ids"), out.data()); },
                              (path + ": tensor \"ids\" has dtype I32; only F32, F16 and BF16 can be read as float32").c_str()));
    // the file shrinks after its header was read
    write_file(path, image(header, std::string(12, '\0')));
    std::string expected = path + ": tensor \"w\": cannot read 16 bytes at byte " + std::to_string(file.data_offset + 8) + ": file is truncated";
    CHECK(expect_exit_failure([&] { safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "w"), out.data()); },
                              expected.c_str()));
    remove(path.c_str());
    CHECK(expect_exit_failure([&] { safetensors_read_f32(path.c_str(), &file, safetensors_find(&file, "w"), out.data()); },
                              ("cannot open " + path).c_str()));
    remove_dir(dir);
}

// ----------------------------------------------------------------------------
// robustness

// Mangled valid files either parse into a consistent layout or fail with one line.
TEST(mangled_files_never_crash) {
    std::string header = "{\"__metadata__\":{\"format\":\"pt\"}," + entry("a", "F32", "[2,1]", 0, 8) + "," +
                         entry("b", "BF16", "[3]", 8, 14) + "," + entry("c", "U8", "[2]", 14, 16) + "}";
    std::string base = image(header, std::string(16, '\x11'));
    const char bytes[] = "{}[]\",:0123456789-.e \x00\x01\x80\xFF";
    std::mt19937 rng(9);
    int parsed = 0;
    for (int i = 0; i < 20000; i++) {
        std::string mangled = base;
        for (int edits = 1 + rng() % 3; edits > 0; edits--) {
            size_t pos = rng() % mangled.size();
            if (rng() % 4 == 0) {
                mangled.insert(pos, 1, bytes[rng() % (sizeof(bytes) - 1)]);
            } else {
                mangled[pos] = bytes[rng() % (sizeof(bytes) - 1)];
            }
        }
        SafeFile file;
        std::string error = parse_error(mangled, &file);
        if (error != "(parsed)") {
            CHECK(!error.empty() && error.find('\n') == std::string::npos);
            continue;
        }
        parsed++;
        uint64_t total = 0;
        for (const SafeTensor& t : file.tensors) {
            total += t.end - t.begin;
            CHECK(t.end - t.begin == safetensors_numel(&t) * safetensors_dtype_size(t.dtype));
        }
        CHECK(file.data_offset + total == mangled.size());
    }
    CHECK(parsed > 0);
}

TEST_MAIN()
