// Tests of llmc/tokenizer.h against facts from tiktoken's "gpt2" encoding.
// Run from the repo root: build/test_tokenizer [name filter]
#include <stdlib.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/gpt2_tokenizer.h"
#include "dev/test/testing.h"
#include "llmc/tokenizer.h"

constexpr const char* SHAKESPEARE_PATH = "dev/data/tiny_shakespeare.txt";
constexpr const char* VECTOR_TEXT_PATH = "dev/test/vectors/tokenizer_text.txt";
constexpr const char* VECTOR_IDS_PATH = "dev/test/vectors/tokenizer_ids.txt";

// ----------------------------------------------------------------------------
// helpers

static std::vector<uint32_t> encode(const std::string& text, const Tokenizer& tok = gpt2()) {
    std::vector<uint32_t> ids;
    tokenizer_encode(&tok, text.data(), text.size(), &ids);
    return ids;
}

static std::string decode(const std::vector<uint32_t>& ids, const Tokenizer& tok = gpt2()) {
    std::string text;
    tokenizer_decode_append(&tok, ids.data(), ids.size(), &text);
    return text;
}

static bool round_trips(const std::string& text) { return decode(encode(text)) == text; }

// The pre-tokenizer's pieces of `text`.
static std::vector<std::string> pieces(const std::string& text) {
    const uint8_t* s = (const uint8_t*)text.data();
    std::vector<std::string> result;
    for (size_t pos = 0; pos < text.size();) {
        size_t end = piece_end(char_class_table(), s, pos, text.size());
        result.push_back(text.substr(pos, end - pos));
        pos = end;
    }
    return result;
}



// The classic .bin of `tokens` (id order), written by hand.
static std::string bin_image(int32_t version, int32_t eot, const std::vector<std::string>& tokens) {
    int32_t header[TOKENIZER_BIN_HEADER_INTS] = {TOKENIZER_BIN_MAGIC, version, (int32_t)tokens.size(), eot};
    std::string image((const char*)header, sizeof(header));
    for (const std::string& token : tokens) { image += (char)token.size() + token; }
    return image;
}

static std::vector<std::string> gpt2_tokens() {
    std::vector<std::string> tokens;
    for (uint32_t id = 0; id < gpt2().vocab_size; id++) {
        const uint8_t* bytes;
        size_t len;
        tokenizer_decode(&gpt2(), id, &bytes, &len);
        tokens.emplace_back((const char*)bytes, len);
    }
    return tokens;
}

// ----------------------------------------------------------------------------
// exact ids

TEST(hello_world) {
    CHECK(encode("Hello world") == std::vector<uint32_t>({15496, 995}));
    CHECK(gpt2().vocab_size == 50257);
    CHECK(gpt2().eot_token == 50256);
}

TEST(shakespeare_start) {
    std::vector<uint32_t> expected = {5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502, 2740, 13, 628};
    std::string start = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n";
    CHECK(read_file(SHAKESPEARE_PATH).compare(0, start.size(), start) == 0);
    CHECK(encode(start) == expected);
    // in the whole file the "\n\n" is followed by text, so it splits into two "\n"
    std::vector<uint32_t> whole = encode(read_file(SHAKESPEARE_PATH));
    CHECK(std::vector<uint32_t>(whole.begin(), whole.begin() + 14) ==
          std::vector<uint32_t>(expected.begin(), expected.begin() + 14));
    CHECK(whole[14] == 198 && whole[15] == 198);
}

struct IdsCase {
    const char* name;
    const char* text;
    std::vector<uint32_t> ids;
};

// Texts and their ids from tiktoken's gpt2 encoding.
static const IdsCase TIKTOKEN_CASES[] = {
    {"hello",
     "Hello world",
     {15496, 995}},
    {"latin",
     "Café naïve façade, Ångström in Łódź; İstanbul straße",
     {34, 1878, 2634, 41492, 24685, 16175, 671, 11, 6184, 227, 782, 2536, 9101, 76, 287, 25370, 223, 10205, 67, 129, 118, 26, 34754, 108, 24179, 3534, 39683, 68}},
    {"greek",
     "Η γρήγορη αλεπού",
     {138, 245, 7377, 111, 33643, 138, 106, 42063, 26517, 33643, 138, 115, 26367, 39377, 30950, 46582, 26517, 139, 235}},
    {"cyrillic",
     "Съешь же ещё этих булок",
     {140, 94, 141, 232, 16843, 141, 230, 45367, 12466, 114, 16843, 12466, 113, 141, 231, 141, 239, 220, 141, 235, 20375, 18849, 141, 227, 12466, 109, 35072, 30143, 25443, 118}},
    {"arabic",
     "نص حكيم له سر قاطع",
     {23338, 148, 113, 17550, 255, 149, 225, 22654, 25405, 220, 13862, 29519, 17550, 111, 26897, 18923, 224, 34247, 115, 44690}},
    {"hebrew",
     "דג סקרן שט בים",
     {147, 241, 147, 240, 14360, 94, 147, 100, 37778, 147, 253, 14360, 102, 147, 246, 14360, 239, 33951, 251}},
    {"devanagari",
     "हिन्दी भाषा",
     {11976, 117, 11976, 123, 11976, 101, 24231, 235, 11976, 99, 24231, 222, 28225, 255, 48077, 11976, 115, 48077}},
    {"thai",
     "ภาษาไทย ง่าย",
     {19567, 254, 19567, 110, 19567, 102, 19567, 110, 31479, 226, 19567, 245, 19567, 95, 220, 19567, 229, 31479, 230, 19567, 110, 19567, 95}},
    {"cjk",
     "我能吞下玻璃而不伤身体。いろはカタカナ",
     {22755, 239, 47797, 121, 28938, 252, 10310, 233, 163, 236, 119, 163, 240, 225, 32003, 234, 38834, 27670, 97, 164, 118, 104, 19526, 241, 16764, 18566, 1792, 235, 31676, 21763, 23376, 21763, 26229}},
    {"hangul",
     "한국어 키스의 고유조건",
     {47991, 250, 166, 113, 255, 168, 244, 112, 220, 169, 224, 97, 168, 232, 97, 35975, 246, 220, 166, 111, 254, 168, 250, 254, 168, 94, 108, 166, 109, 112}},
    {"fullwidth",
     "ＡＢＣ ａｂｃ ０１２３",
     {171, 120, 94, 171, 120, 95, 171, 120, 96, 27332, 121, 223, 171, 121, 224, 171, 121, 225, 27332, 120, 238, 171, 120, 239, 171, 120, 240, 171, 120, 241}},
    {"arabic_indic_digits",
     "رقم ١٢٣٤٥ و ۶۷۸",
     {26897, 149, 224, 25405, 18923, 94, 149, 95, 149, 96, 149, 97, 149, 98, 42092, 220, 151, 114, 151, 115, 151, 116}},
    {"roman_numerals",
     "Chapter Ⅻ, ⅳ and ↂ",
     {14126, 2343, 227, 104, 11, 2343, 227, 111, 290, 17804, 224}},
    {"other_numbers",
     "x² ½ ① 𝟘𝟙",
     {87, 31185, 25208, 2343, 239, 254, 220, 47728, 253, 246, 47728, 253, 247}},
    {"emoji",
     "👍 👍🏽 👨\xE2\x80\x8D👩\xE2\x80\x8D👧\xE2\x80\x8D👦 🏳\xEF\xB8\x8F\xE2\x80\x8D🌈 🇺🇸🇯🇵 ❤\xEF\xB8\x8F",
     {41840, 235, 50169, 235, 8582, 237, 121, 50169, 101, 447, 235, 41840, 102, 447, 235, 41840, 100, 447, 235, 41840, 99, 12520, 237, 111, 37929, 447, 235, 8582, 234, 230, 12520, 229, 118, 8582, 229, 116, 8582, 229, 107, 8582, 229, 113, 43074, 97, 37929}},
    {"combining",
     "e\xCC\x81 a\xCC\x88" "b n\xCC\x83o Z\xCD\x91\xCD\x92 क\xE0\xA5\x8Dष",
     {68, 136, 223, 257, 136, 230, 65, 299, 136, 225, 78, 1168, 137, 239, 137, 240, 28225, 243, 24231, 235, 11976, 115}},
    {"digits",
     "1234567890 3.14159 1,000,000 007 12abc34",
     {10163, 2231, 30924, 3829, 513, 13, 1415, 19707, 352, 11, 830, 11, 830, 3571, 22, 1105, 39305, 2682}},
    {"contractions_lower",
     "I'll we've you're they'd she's I'm don't",
     {40, 1183, 356, 1053, 345, 821, 484, 1549, 673, 338, 314, 1101, 836, 470}},
    {"contractions_upper",
     "DON'T I'LL WE'VE YOU'RE He'S",
     {41173, 6, 51, 314, 6, 3069, 12887, 6, 6089, 7013, 6, 2200, 679, 6, 50}},
    {"contractions_punct",
     "the 'quoted's x.'s (it)'s ''ll 'sup",
     {1169, 705, 421, 5191, 338, 2124, 2637, 82, 357, 270, 33047, 82, 10148, 297, 705, 37330}},
    {"tabs",
     "\tindented\t\ttext\t",
     {197, 521, 4714, 197, 197, 5239, 197}},
    {"crlf",
     "line one\r\nline two\r\n\r\nend",
     {1370, 530, 201, 198, 1370, 734, 201, 198, 201, 198, 437}},
    {"space_runs",
     "a  b   c    d \t e",
     {64, 220, 275, 220, 220, 269, 220, 220, 220, 288, 220, 197, 304}},
    {"leading_trailing",
     "   leading and trailing   ",
     {220, 220, 3756, 290, 25462, 220, 220, 220}},
    {"newline_runs",
     "x\n\n\ny\n\n\n\n z\n",
     {87, 628, 198, 88, 628, 628, 1976, 198}},
    {"unicode_spaces",
     "a\xC2\xA0" "b\xE3\x80\x80" "c\xE2\x80\x83 d \xC2\xA0" "e\xC2\x85" "f",
     {64, 1849, 65, 5099, 222, 66, 447, 225, 288, 220, 1849, 68, 126, 227, 69}},
    {"c_code",
     "int main(void) {\n    for (int i = 0; i < 10; i++) {\n        printf(\"%d\\n\", i);\n    }\n    return 0;\n}\n",
     {600, 1388, 7, 19382, 8, 1391, 198, 220, 220, 220, 329, 357, 600, 1312, 796, 657, 26, 1312, 1279, 838, 26, 1312, 29577, 1391, 198, 220, 220, 220, 220, 220, 220, 220, 30812, 7203, 4, 67, 59, 77, 1600, 1312, 1776, 198, 220, 220, 220, 1782, 198, 220, 220, 220, 1441, 657, 26, 198, 92, 198}},
    {"python_code",
     "def f(x):\n    if x:\n        return [y ** 2 for y in x]  # squares\n    return None\n",
     {4299, 277, 7, 87, 2599, 198, 220, 220, 220, 611, 2124, 25, 198, 220, 220, 220, 220, 220, 220, 220, 1441, 685, 88, 12429, 362, 329, 331, 287, 2124, 60, 220, 1303, 24438, 198, 220, 220, 220, 1441, 6045, 198}},
    {"endoftext_is_text",
     "a<|endoftext|>b",
     {64, 27, 91, 437, 1659, 5239, 91, 29, 65}},
    {"unicode16_letter",
     "a\xF0\x9E\x97\x90 7\xF0\x90\xB5\x80",
     {64, 172, 252, 245, 238, 767, 172, 238, 113, 222}},
    {"unicode17_not_letter",
     "a\xE0\xB1\x9C",
     {64, 156, 109, 250}},
};

TEST(tiktoken_cases) {
    for (const IdsCase& c : TIKTOKEN_CASES) {
        bool ok = encode(c.text) == c.ids && decode(c.ids) == c.text;
        if (!ok) { fprintf(stderr, "  case %s differs from tiktoken\n", c.name); }
        CHECK(ok);
    }
}

// The varied text of dev/test/vectors must encode exactly as tiktoken did.
TEST(tiktoken_vectors) {
    std::string text = read_file(VECTOR_TEXT_PATH);
    std::vector<uint32_t> expected;
    std::string ids_text = read_file(VECTOR_IDS_PATH);
    for (const char* p = ids_text.c_str(); *p != '\0' && *p != '\n';) {
        char* end;
        expected.push_back((uint32_t)strtoul(p, &end, 10));
        p = end;
    }
    std::vector<uint32_t> ids = encode(text);
    size_t same = 0;
    while (same < ids.size() && same < expected.size() && ids[same] == expected[same]) { same++; }
    if (same != ids.size() || same != expected.size()) {
        fprintf(stderr, "  %zu ids (expected %zu), first difference at %zu\n", ids.size(), expected.size(), same);
    }
    CHECK(expected.size() > 100000);
    CHECK(ids == expected);
    CHECK(decode(ids) == text);
}

// 1 MB of "a" is one piece (merged through the heap); tiktoken gives 250,000 x "aaaa".
TEST(megabyte_single_piece) {
    std::vector<uint32_t> ids = encode(std::string(1000000, 'a'));
    CHECK(ids == std::vector<uint32_t>(250000, 24794));
}

TEST(megabyte_single_line) {
    std::string line = read_file(SHAKESPEARE_PATH);
    for (char& c : line) { c = c == '\n' ? ' ' : c; }
    std::vector<uint32_t> ids = encode(line);
    CHECK(ids.size() > 200000);
    CHECK(decode(ids) == line);
}

// ----------------------------------------------------------------------------
// pre-tokenizer

TEST(pieces_follow_the_pattern) {
    using Pieces = std::vector<std::string>;
    CHECK(pieces("I'll") == Pieces({"I", "'ll"}));
    CHECK(pieces("DON'T") == Pieces({"DON", "'", "T"}));
    CHECK(pieces("He'S") == Pieces({"He", "'", "S"}));
    CHECK(pieces("we've") == Pieces({"we", "'ve"}));
    CHECK(pieces("it's'nt") == Pieces({"it", "'s", "'", "nt"}));
    CHECK(pieces("x.'s") == Pieces({"x", ".'", "s"}));
    CHECK(pieces(" 's") == Pieces({" '", "s"}));
    CHECK(pieces("a  b") == Pieces({"a", " ", " b"}));
    CHECK(pieces("a \n b") == Pieces({"a", " \n", " b"}));
    CHECK(pieces("a\n\nb") == Pieces({"a", "\n", "\n", "b"}));
    CHECK(pieces("x\r\ny") == Pieces({"x", "\r", "\n", "y"}));
    CHECK(pieces("\t\tx") == Pieces({"\t", "\t", "x"}));
    CHECK(pieces("end   ") == Pieces({"end", "   "}));
    CHECK(pieces("  ") == Pieces({"  "}));
    CHECK(pieces("abc123") == Pieces({"abc", "123"}));
    CHECK(pieces(" 123") == Pieces({" 123"}));
    CHECK(pieces(" $100") == Pieces({" $", "100"}));
    CHECK(pieces("café") == Pieces({"café"}));
    CHECK(pieces("日本語です") == Pieces({"日本語です"}));
    CHECK(pieces("Hello\xC2\xA0world") == Pieces({"Hello", "\xC2\xA0", "world"}));
    CHECK(pieces("\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBDx") == Pieces({"\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "x"}));
}

// Each byte of an ill-formed sequence is one character of class other.
TEST(invalid_utf8_pieces) {
    using Pieces = std::vector<std::string>;
    CHECK(pieces("a\x80" "b") == Pieces({"a", "\x80", "b"}));
    CHECK(pieces(" \xFF\xFE") == Pieces({" \xFF\xFE"}));
    CHECK(pieces("\xE2\x82" "a") == Pieces({"\xE2\x82", "a"}));
    CHECK(pieces("a\xC3") == Pieces({"a", "\xC3"}));
    CHECK(pieces("\xC3\xA9\xC3") == Pieces({"\xC3\xA9", "\xC3"}));
    CHECK(pieces("\xED\xA0\x80x") == Pieces({"\xED\xA0\x80", "x"}));
}

TEST(unicode_classes) {
    const CharClassTable& table = char_class_table();
    CHECK(char_class(table, 'a') == CHAR_LETTER && char_class(table, 0x4E2D) == CHAR_LETTER);
    CHECK(char_class(table, '7') == CHAR_NUMBER && char_class(table, 0x2167) == CHAR_NUMBER);
    CHECK(char_class(table, 0x0663) == CHAR_NUMBER && char_class(table, 0xFF10) == CHAR_NUMBER);
    CHECK(char_class(table, 0x3000) == CHAR_SPACE && char_class(table, 0x85) == CHAR_SPACE);
    CHECK(char_class(table, 0x200B) == CHAR_OTHER && char_class(table, 0x0301) == CHAR_OTHER);
    CHECK(char_class(table, 0x1E5D0) == CHAR_LETTER);  // new in Unicode 16.0
    CHECK(char_class(table, 0x0C5C) == CHAR_OTHER);    // new in Unicode 17.0, after tiktoken's tables
    CHECK(char_class(table, 0x10FFFF) == CHAR_OTHER);
}

// ----------------------------------------------------------------------------
// round trips and odd input

TEST(round_trips) {
    const char* texts[] = {
        "",
        " ",
        "\n",
        "The quick brown fox jumps over the lazy dog.",
        "  leading, trailing and   inner   spaces  ",
        "\t\ttabs\tand\r\ncrlf\r\n\r\n",
        "<|endoftext|> is text here",
        "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 family",
        "mixed 中文 English 123 ١٢٣ ΑΒΓ",
    };
    for (const char* text : texts) { CHECK(round_trips(text)); }
}

TEST(empty_input_appends_nothing) {
    std::vector<uint32_t> ids = {7, 8};
    tokenizer_encode(&gpt2(), "", 0, &ids);
    CHECK(ids == std::vector<uint32_t>({7, 8}));
    tokenizer_encode(&gpt2(), "Hello world", 11, &ids);
    CHECK(ids == std::vector<uint32_t>({7, 8, 15496, 995}));
}

TEST(every_single_byte) {
    for (int b = 0; b < 256; b++) {
        std::string text(1, (char)b);
        std::vector<uint32_t> ids = encode(text);
        CHECK(ids.size() == 1 && ids[0] == gpt2().byte_token[b] && decode(ids) == text);
    }
    CHECK(encode("!") == std::vector<uint32_t>({0}));
    CHECK(encode("\n") == std::vector<uint32_t>({198}));
    CHECK(encode(" ") == std::vector<uint32_t>({220}));
}

TEST(all_bytes_in_one_string) {
    std::string ascending, descending;
    for (int b = 0; b < 256; b++) {
        ascending += (char)b;
        descending += (char)(255 - b);
    }
    CHECK(round_trips(ascending));
    CHECK(round_trips(descending));
    CHECK(round_trips(ascending + ascending + descending));
}

TEST(invalid_utf8_round_trips) {
    const char* texts[] = {
        "\x80", "\xBF\x80\x80", "a\x80" "b",          // lone continuation bytes
        "\xC3", "\xE2\x82", "\xF0\x9F\x98", "x\xE2\x82 y",  // truncated sequences
        "\xC0\xAF", "\xE0\x80\xAF", "\xF0\x80\x80\xAF",  // overlongs
        "\xED\xA0\x80", "\xED\xBF\xBF" "abc",           // surrogates
        "\xF4\x90\x80\x80", "\xF5\xF6\xF7\xF8\xFE\xFF",  // above U+10FFFF, never valid
        " \xFF word \xC3\xA9\xC3 it\xE2\x80's",
    };
    for (const char* text : texts) { CHECK(round_trips(text)); }
    std::mt19937 rng(7);
    for (int i = 0; i < 2000; i++) {
        std::string text(rng() % 64, '\0');
        for (char& c : text) { c = (char)(rng() % 4 == 0 ? ' ' : 0x80 + rng() % 128); }
        CHECK(round_trips(text));
    }
}

// ----------------------------------------------------------------------------
// BPE internals

// The heap merge (long pieces) makes exactly the merges of the linear one (short pieces).
TEST(heap_merge_matches_linear_merge) {
    const char* alphabet[] = {"a", "b", "e", "r", " ", "=", "-", "0", "\xC3", "\x83", "\xE4\xB8\xAD", "'"};
    std::mt19937 rng(11);
    for (int i = 0; i < 3000; i++) {
        std::string piece;
        size_t len = 2 + rng() % (LINEAR_BPE_MAX_LEN - 3);
        while (piece.size() < len) { piece += alphabet[rng() % 12]; }
        piece.resize(len);
        std::vector<uint32_t> linear, heap;
        const uint8_t* s = (const uint8_t*)piece.data();
        bpe_merge_linear(&gpt2(), s, piece.size(), &linear);
        bpe_merge_heap(&gpt2(), s, piece.size(), &heap);
        CHECK(linear == heap);
    }
}

TEST(concurrent_encoding) {
    std::string text = read_file(VECTOR_TEXT_PATH) + read_file(SHAKESPEARE_PATH).substr(0, 300000);
    std::vector<uint32_t> expected = encode(text);
    std::vector<std::vector<uint32_t>> results(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < results.size(); t++) {
        threads.emplace_back([&, t] { results[t] = encode(text); });
    }
    for (std::thread& thread : threads) { thread.join(); }
    for (const std::vector<uint32_t>& ids : results) { CHECK(ids == expected); }
}

// A thread's memo must not serve one tokenizer's merges to another.
TEST(memo_is_per_tokenizer) {
    std::string dir = make_temp_dir("test_tokenizer");
    std::string path = dir + "/bytes_only.bin";
    std::vector<std::string> byte_tokens = gpt2_tokens();
    byte_tokens.resize(256);  // GPT-2's ids 0..255 are its single bytes
    byte_tokens.push_back("<|endoftext|>");
    write_file(path, bin_image(2, 256, byte_tokens));
    Tokenizer bytes_only;
    tokenizer_init(&bytes_only, path.c_str());
    std::string text = "qzxv qzxv wibblewobble";
    std::vector<uint32_t> merged = encode(text);
    std::vector<uint32_t> unmerged = encode(text, bytes_only);
    CHECK(merged.size() < text.size());
    CHECK(unmerged.size() == text.size());
    CHECK(encode(text) == merged);
    tokenizer_free(&bytes_only);
    remove(path.c_str());
    rmdir(dir.c_str());
}

// ----------------------------------------------------------------------------
// files

TEST(bin_round_trip) {
    std::string dir = make_temp_dir("test_tokenizer");
    std::string path = dir + "/gpt2_tokenizer.bin";
    tokenizer_write_bin(&gpt2(), path.c_str());
    Tokenizer reloaded;
    tokenizer_init(&reloaded, path.c_str());
    CHECK(reloaded.vocab_size == gpt2().vocab_size && reloaded.eot_token == gpt2().eot_token);
    std::vector<std::string> tokens = gpt2_tokens();
    CHECK(read_file(path.c_str()) == bin_image(2, 50256, tokens));
    bool same_tokens = true;
    for (uint32_t id = 0; id < reloaded.vocab_size; id++) {
        const uint8_t* bytes;
        size_t len;
        tokenizer_decode(&reloaded, id, &bytes, &len);
        same_tokens = same_tokens && std::string((const char*)bytes, len) == tokens[id];
    }
    CHECK(same_tokens);
    std::string text = read_file(VECTOR_TEXT_PATH);
    CHECK(encode(text, reloaded) == encode(text));
    tokenizer_free(&reloaded);
    CHECK(reloaded.vocab_size == 0);
    remove(path.c_str());
    rmdir(dir.c_str());
}

TEST(bin_version_1_implies_gpt2_eot) {
    std::string dir = make_temp_dir("test_tokenizer");
    std::string path = dir + "/v1.bin";
    write_file(path, bin_image(1, 0, gpt2_tokens()));
    Tokenizer tok;
    tokenizer_init(&tok, path.c_str());
    CHECK(tok.vocab_size == 50257 && tok.eot_token == 50256);
    CHECK(encode("Hello world", tok) == std::vector<uint32_t>({15496, 995}));
    tokenizer_free(&tok);
    remove(path.c_str());
    rmdir(dir.c_str());
}

// Loading a tokenizer file of `data` fails with "<path>: <problem>".
static bool load_fails_with(const std::string& data, const char* problem) {
    return file_refused_with(data, problem, [](const char* path) {
        Tokenizer tok;
        tokenizer_init(&tok, path);
    });
}

TEST(bad_files_fail_with_one_line) {
    CHECK(expect_exit_failure([] {
        Tokenizer tok;
        tokenizer_init(&tok, "/nonexistent/gpt2_tokenizer.bin");
    }, "cannot open /nonexistent/gpt2_tokenizer.bin"));
    std::string bin = bin_image(2, 50256, gpt2_tokens());
    CHECK(load_fails_with("", "file is empty"));
    CHECK(load_fails_with("not a tokenizer", "bad magic"));
    CHECK(load_fails_with(bin.substr(0, 100), "truncated header"));
    CHECK(load_fails_with(bin.substr(0, bin.size() / 2), "file is truncated"));
    CHECK(load_fails_with(bin + "x", "1 unexpected bytes after the last token"));
    CHECK(load_fails_with(bin_image(3, 50256, gpt2_tokens()), "unsupported version 3"));
    CHECK(load_fails_with(bin_image(2, 60000, gpt2_tokens()), "eot token 60000 out of range"));
    CHECK(load_fails_with(bin_image(2, 0, {"a", ""}), "token 1 has length 0"));
    CHECK(load_fails_with(bin_image(2, 1, {"a", "b", "a"}), "tokens 0 and 2 have the same bytes"));
    // A header claiming 2^31 - 1 tokens in a tiny file fails before allocating for them (it
    // asked for 64 GB of empty strings).
    std::string huge = bin_image(2, 0, {"a"});
    int32_t claimed = INT32_MAX;
    memcpy(&huge[8], &claimed, 4);
    CHECK(load_fails_with(huge, "vocab size 2147483647 cannot fit in 2 bytes of tokens (a length byte each)"));
}

TEST(bad_json_fails_with_one_line) {
    CHECK(load_fails_with("{\"a\": 0, \"b\" 1}", "bad JSON at byte 13: expected ':'"));
    CHECK(load_fails_with("{\"a\": 0", "bad JSON at byte 7: expected ',' or '}'"));
    CHECK(load_fails_with("{\"a\": -1}", "bad JSON at byte 6: expected a non-negative integer id"));
    CHECK(load_fails_with("{\"a\": 0} x", "bad JSON at byte 9: unexpected text after the object"));
    CHECK(load_fails_with("{}", "the vocabulary is empty"));
    CHECK(load_fails_with("{\"a\": 0, \"b\": 0}", "id 0 appears twice"));
    CHECK(load_fails_with("{\"a\": 0, \"b\": 2}", "id 2 out of range"));
    CHECK(load_fails_with("{\"\\u4e2d\": 0}", "token string at byte 1 has U+4E2D, not in GPT-2's byte alphabet"));
    CHECK(load_fails_with("{\"a\": 0, \"a\": 1, \"<|endoftext|>\": 2}", "tokens 0 and 1 have the same bytes"));
    CHECK(load_fails_with("{\"a\": 0}", "no \"<|endoftext|>\" entry"));
    CHECK(load_fails_with("{\"a\": 0, \"<|endoftext|>\": 1}", "no token for the byte 0x00"));
}

TEST(decode_rejects_out_of_range_ids) {
    CHECK(expect_exit_failure([] {
        const uint8_t* bytes;
        size_t len;
        tokenizer_decode(&gpt2(), 50257, &bytes, &len);
    }, "token id 50257 out of range (vocab size 50257)"));
}

// ----------------------------------------------------------------------------
// printing streamed tokens

// What a printer emits for `chunks` fed in turn, then finished.
static std::string printed(const std::vector<std::string>& chunks) {
    Utf8Printer printer;
    std::string out;
    for (const std::string& chunk : chunks) { printer.feed((const uint8_t*)chunk.data(), chunk.size(), &out); }
    printer.finish(&out);
    return out;
}

TEST(utf8_printer) {
    const std::string REPLACEMENT = "\xEF\xBF\xBD";
    Utf8Printer printer;
    std::string out;
    printer.feed((const uint8_t*)"caf\xC3", 4, &out);
    CHECK(out == "caf");  // the incomplete "é" is held back
    printer.feed((const uint8_t*)"\xA9!", 2, &out);
    CHECK(out == "caf\xC3\xA9!");
    CHECK(printed({"\xE2", "\x82", "\xAC"}) == "\xE2\x82\xAC");
    CHECK(printed({"a\x80" "b"}) == "a" + REPLACEMENT + "b");
    CHECK(printed({"\xE2\x82", "a"}) == REPLACEMENT + "a");
    CHECK(printed({"ok\xF0\x9F\x98"}) == "ok" + REPLACEMENT);  // flushed at the end
    CHECK(printed({"\xC0\xAF"}) == REPLACEMENT + REPLACEMENT);
    CHECK(printed({"\xED\xA0\x80"}) == REPLACEMENT + REPLACEMENT + REPLACEMENT);
    // sampled text printed token by token comes out whole
    std::string text = "emoji \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD, \xE4\xB8\xAD\xE6\x96\x87 and caf\xC3\xA9";
    std::vector<std::string> token_chunks;
    for (uint32_t id : encode(text)) { token_chunks.push_back(decode({id})); }
    CHECK(token_chunks.size() > 8);
    CHECK(printed(token_chunks) == text);
}

TEST_MAIN()
