// Tests of llmc/json.h: every kind of value, exact integers, escapes, each rejection with
// its message, the depth limit, json_quote, and mangled input that must never crash.
// Run from the repo root: build/test_json [name filter]
#include <math.h>

#include <random>
#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/json.h"

// ----------------------------------------------------------------------------
// helpers

static bool parse(const std::string& text, JsonValue* out) {
    char error[256];
    return json_parse(text.data(), text.size(), out, error, sizeof(error));
}

// The one-line error for `text`, or "(parsed)" if it is valid.
static std::string parse_error(const std::string& text) {
    JsonValue value;
    char error[256] = "";
    if (json_parse(text.data(), text.size(), &value, error, sizeof(error))) { return "(parsed)"; }
    return error;
}

// True if `text` is rejected with exactly `message`; prints what came instead.
static bool rejects(const std::string& text, const std::string& message) {
    std::string error = parse_error(text);
    if (error != message) { fprintf(stderr, "  %s: got \"%s\", expected \"%s\"\n", json_quote(text).c_str(), error.c_str(), message.c_str()); }
    return error == message;
}

// The string a JSON string literal holds, or "(error)".
static std::string string_of(const std::string& literal) {
    JsonValue value;
    if (!parse(literal, &value) || value.type != JSON_STRING) { return "(error)"; }
    return value.string;
}

static std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// ----------------------------------------------------------------------------
// values

TEST(every_kind_of_value) {
    JsonValue v;
    CHECK(parse("{\"n\": null, \"t\": true, \"f\": false, \"i\": -12, \"d\": 2.5, \"s\": \"hi\", "
                "\"a\": [1, [2, {}], []], \"o\": {\"k\": \"v\"}}", &v));
    CHECK(v.type == JSON_OBJECT && v.keys.size() == 8 && v.items.size() == 8);
    CHECK(v.keys == std::vector<std::string>({"n", "t", "f", "i", "d", "s", "a", "o"}));  // order kept
    CHECK(v.find("n") != nullptr && v.find("n")->type == JSON_NULL);
    CHECK(v.find("t")->type == JSON_BOOL && v.find("t")->boolean);
    CHECK(v.find("f")->type == JSON_BOOL && !v.find("f")->boolean);
    CHECK(v.find("i")->type == JSON_NUMBER && v.find("i")->is_integer && v.find("i")->integer == -12 && v.find("i")->number == -12.0);
    CHECK(v.find("d")->type == JSON_NUMBER && !v.find("d")->is_integer && v.find("d")->number == 2.5);
    CHECK(v.find("s")->type == JSON_STRING && v.find("s")->string == "hi");
    const JsonValue* a = v.find("a");
    CHECK(a->type == JSON_ARRAY && a->items.size() == 3 && a->keys.empty());
    CHECK(a->items[1].type == JSON_ARRAY && a->items[1].items[0].integer == 2 && a->items[1].items[1].type == JSON_OBJECT);
    CHECK(a->items[2].type == JSON_ARRAY && a->items[2].items.empty());
    CHECK(v.find("o")->find("k")->string == "v");
    CHECK(v.find("missing") == nullptr && a->find("k") == nullptr);
}

TEST(scalars_at_top_level_and_space) {
    JsonValue v;
    CHECK(parse(" \t\r\n 7 \n", &v) && v.type == JSON_NUMBER && v.integer == 7);
    CHECK(parse("\"x\"", &v) && v.string == "x");
    CHECK(parse("null", &v) && v.type == JSON_NULL);
    CHECK(parse("true", &v) && v.boolean);
    CHECK(parse("[ 1 , 2 ]", &v) && v.items.size() == 2);
    CHECK(parse("{ \"a\" : 1 }", &v) && v.find("a")->integer == 1);
}

TEST(duplicate_keys_kept_find_gives_the_first) {
    JsonValue v;
    CHECK(parse("{\"k\": 1, \"k\": 2}", &v));
    CHECK(v.keys.size() == 2 && v.find("k")->integer == 1 && v.items[1].integer == 2);
}

TEST(integers_are_exact) {
    JsonValue v;
    CHECK(parse("9223372036854775807", &v) && v.is_integer && v.integer == INT64_MAX);
    CHECK(parse("-9223372036854775808", &v) && v.is_integer && v.integer == INT64_MIN);
    CHECK(parse("9007199254740993", &v) && v.integer == 9007199254740993LL);  // 2^53 + 1: not a double
    CHECK(v.number == 9007199254740992.0);
    CHECK(parse("0", &v) && v.is_integer && v.integer == 0 && !signbit(v.number));
    CHECK(parse("-0", &v) && v.is_integer && v.integer == 0 && signbit(v.number));
    CHECK(parse("00000", &v) == false);
    CHECK(rejects("9223372036854775808", "bad JSON at byte 0: integer out of range"));
    CHECK(rejects("-9223372036854775809", "bad JSON at byte 0: integer out of range"));
    CHECK(rejects("18446744073709551616", "bad JSON at byte 0: integer out of range"));  // 2^64 would wrap
    CHECK(rejects("-18446744073709551617", "bad JSON at byte 0: integer out of range"));
    CHECK(rejects("[1, 123456789012345678901234567890]", "bad JSON at byte 4: integer out of range"));
}

TEST(doubles) {
    JsonValue v;
    CHECK(parse("1.5e3", &v) && !v.is_integer && v.number == 1500.0);
    CHECK(parse("-0.25", &v) && v.number == -0.25);
    CHECK(parse("1E-2", &v) && v.number == 0.01);
    CHECK(parse("2e+2", &v) && v.number == 200.0 && !v.is_integer);
    CHECK(parse("1.0", &v) && !v.is_integer && v.number == 1.0);
    CHECK(parse("0.1", &v) && v.number == 0.1);
    CHECK(parse("1.7976931348623157e308", &v) && v.number == 1.7976931348623157e308);
    CHECK(parse("1e-400", &v) && v.number == 0.0);  // underflow rounds to zero
    CHECK(rejects("1e400", "bad JSON at byte 0: number out of range"));
    CHECK(rejects("[-1.8e308]", "bad JSON at byte 1: number out of range"));
}

TEST(string_escapes) {
    CHECK(string_of("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"") == "\"\\/\b\f\n\r\t");
    CHECK(string_of("\"caf\\u00e9\"") == "caf\xC3\xA9");
    CHECK(string_of("\"\\u4E2D\"") == "\xE4\xB8\xAD");
    CHECK(string_of("\"\\ud83d\\ude00\"") == "\xF0\x9F\x98\x80");  // a surrogate pair is one character
    CHECK(string_of("\"\\uDBFF\\uDFFF\"") == "\xF4\x8F\xBF\xBF");  // U+10FFFF
    CHECK(string_of("\"a\\u0000b\"") == std::string("a\0b", 3));
    CHECK(string_of("\"\\u007f\"") == "\x7F");
    CHECK(string_of("\"raw \xC3\xA9 \xF0\x9F\x98\x80 \xEF\xBF\xBF\"") == "raw \xC3\xA9 \xF0\x9F\x98\x80 \xEF\xBF\xBF");
    CHECK(string_of("\"\"") == "");
}

// ----------------------------------------------------------------------------
// rejections

TEST(rejects_bad_structure) {
    CHECK(rejects("", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("   ", "bad JSON at byte 3: expected a value"));
    CHECK(rejects("[1,]", "bad JSON at byte 3: expected a value"));
    CHECK(rejects("[1 2]", "bad JSON at byte 3: expected ',' or ']'"));
    CHECK(rejects("[1", "bad JSON at byte 2: expected ',' or ']'"));
    CHECK(rejects("[", "bad JSON at byte 1: expected a value"));
    CHECK(rejects("{", "bad JSON at byte 1: expected a string"));
    CHECK(rejects("{\"a\" 1}", "bad JSON at byte 5: expected ':'"));
    CHECK(rejects("{\"a\": 1 \"b\": 2}", "bad JSON at byte 8: expected ',' or '}'"));
    CHECK(rejects("{\"a\": 1,}", "bad JSON at byte 8: expected a string"));
    CHECK(rejects("{1: 2}", "bad JSON at byte 1: expected a string"));
    CHECK(rejects("{\"a\"}", "bad JSON at byte 4: expected ':'"));
    CHECK(rejects("]", "bad JSON at byte 0: expected a value"));
}

TEST(rejects_trailing_text) {
    CHECK(rejects("[1] x", "bad JSON at byte 4: unexpected text after the value"));
    CHECK(rejects("{}{}", "bad JSON at byte 2: unexpected text after the value"));
    CHECK(rejects("truex", "bad JSON at byte 4: unexpected text after the value"));
    CHECK(rejects("1 2", "bad JSON at byte 2: unexpected text after the value"));
    CHECK(rejects(std::string("{}\0", 3), "bad JSON at byte 2: unexpected text after the value"));
}

TEST(rejects_bad_literals_and_non_json) {
    CHECK(rejects("tru", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("nul", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("True", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("NaN", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("Infinity", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("'a'", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("// c\n1", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("\xEF\xBB\xBF{}", "bad JSON at byte 0: expected a value"));  // a byte order mark
    CHECK(rejects("\f1", "bad JSON at byte 0: expected a value"));             // form feed is not JSON space
}

TEST(rejects_bad_numbers) {
    CHECK(rejects("01", "bad JSON at byte 0: leading zero in a number"));
    CHECK(rejects("[-012]", "bad JSON at byte 1: leading zero in a number"));
    CHECK(rejects("-", "bad JSON at byte 1: expected a digit"));
    CHECK(rejects("-a", "bad JSON at byte 1: expected a digit"));
    CHECK(rejects("1.", "bad JSON at byte 2: expected a digit after '.'"));
    CHECK(rejects("1.e5", "bad JSON at byte 2: expected a digit after '.'"));
    CHECK(rejects("1e", "bad JSON at byte 2: expected a digit in the exponent"));
    CHECK(rejects("1e+", "bad JSON at byte 3: expected a digit in the exponent"));
    CHECK(rejects(".5", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("+1", "bad JSON at byte 0: expected a value"));
    CHECK(rejects("0x10", "bad JSON at byte 1: unexpected text after the value"));
}

TEST(rejects_bad_strings) {
    CHECK(rejects("\"abc", "bad JSON at byte 4: unterminated string"));
    CHECK(rejects("\"abc\\", "bad JSON at byte 5: unterminated string"));
    CHECK(rejects("\"a\nb\"", "bad JSON at byte 2: control character in string"));
    CHECK(rejects("\"a\tb\"", "bad JSON at byte 2: control character in string"));
    CHECK(rejects("\"\x1f\"", "bad JSON at byte 1: control character in string"));
    CHECK(rejects(std::string("\"a\0\"", 4), "bad JSON at byte 2: control character in string"));
    CHECK(rejects("\"\\x\"", "bad JSON at byte 1: bad escape"));
    CHECK(rejects("\"\\U0041\"", "bad JSON at byte 1: bad escape"));
    CHECK(rejects("\"\\u12G4\"", "bad JSON at byte 5: bad hex digit in \\u escape"));
    CHECK(rejects("\"\\u12", "bad JSON at byte 3: truncated \\u escape"));
    CHECK(rejects("\"\xFF\"", "bad JSON at byte 1: invalid UTF-8 in string"));
    CHECK(rejects("\"ok \xC3\"", "bad JSON at byte 4: invalid UTF-8 in string"));         // cut short
    CHECK(rejects("\"\xC0\xAF\"", "bad JSON at byte 1: invalid UTF-8 in string"));        // overlong
    CHECK(rejects("\"\xED\xA0\x80\"", "bad JSON at byte 1: invalid UTF-8 in string"));    // an encoded surrogate
    CHECK(rejects("\"\xF4\x90\x80\x80\"", "bad JSON at byte 1: invalid UTF-8 in string"));  // above U+10FFFF
}

TEST(rejects_lone_surrogates) {
    CHECK(rejects("\"\\ud800\"", "bad JSON at byte 1: lone high surrogate in \\u escape"));
    CHECK(rejects("\"x\\uD83D\"", "bad JSON at byte 2: lone high surrogate in \\u escape"));
    CHECK(rejects("\"\\ud800\\u0041\"", "bad JSON at byte 1: lone high surrogate in \\u escape"));
    CHECK(rejects("\"\\ud800\\ud800\"", "bad JSON at byte 1: lone high surrogate in \\u escape"));
    CHECK(rejects("\"\\ud800\\n\"", "bad JSON at byte 1: lone high surrogate in \\u escape"));
    CHECK(rejects("\"\\udc00\"", "bad JSON at byte 1: lone low surrogate in \\u escape"));
    CHECK(rejects("\"\\ude00\\ud83d\"", "bad JSON at byte 1: lone low surrogate in \\u escape"));
    CHECK(rejects("\"\\ud83d\\ude0", "bad JSON at byte 9: truncated \\u escape"));
}

TEST(depth_limit) {
    JsonValue v;
    CHECK(parse(nested_arrays(JSON_MAX_DEPTH), &v));
    CHECK(rejects(nested_arrays(JSON_MAX_DEPTH + 1), "bad JSON at byte 64: nesting deeper than 64 levels"));
    std::string objects;
    for (int i = 0; i < JSON_MAX_DEPTH; i++) { objects += "{\"k\":"; }
    CHECK(parse(objects + "1" + std::string(JSON_MAX_DEPTH, '}'), &v));
    CHECK(rejects(objects + "[1]" + std::string(JSON_MAX_DEPTH, '}'), "bad JSON at byte 320: nesting deeper than 64 levels"));
    CHECK(rejects(objects + "{}" + std::string(JSON_MAX_DEPTH, '}'), "bad JSON at byte 320: nesting deeper than 64 levels"));
    // a megabyte of opening brackets is refused without deep recursion
    CHECK(rejects(std::string(1 << 20, '['), "bad JSON at byte 64: nesting deeper than 64 levels"));
}

TEST(failure_leaves_null_and_tolerates_small_buffers) {
    JsonValue v;
    v.type = JSON_STRING;
    v.string = "stale";
    char error[16];
    CHECK(!json_parse("[1, 2", 5, &v, error, sizeof(error)));
    CHECK(v.type == JSON_NULL && v.string.empty() && v.items.empty());
    CHECK(strcmp(error, "bad JSON at byt") == 0);  // cut short, still terminated
    CHECK(!json_parse("[1, 2", 5, &v, nullptr, 0));
    CHECK(json_parse("[1, 2]", 6, &v, nullptr, 0) && v.items.size() == 2);
}

// json_array and json_object hand each element to the caller, who reads it with the cursor.
TEST(walkers_visit_elements_in_order) {
    std::string text = "{\"a\": [1, 2, 3], \"b\": [], \"c\": [[4]]}";
    JsonCursor c = json_cursor(text.data(), text.size());
    std::vector<std::string> keys;
    int64_t sum = 0;
    size_t count = 0;
    bool ok = json_object(&c, 0, [&](std::string& key) {
        keys.push_back(key);
        if (key != "a") { return json_value(&c, nullptr, 1); }  // read and dropped
        return json_array(&c, 1, [&](size_t index) {
            JsonNumber n;
            count = index + 1;
            return json_number(&c, &n) && (sum += n.integer, true);
        });
    });
    CHECK(ok && c.pos == text.size());
    CHECK(keys == std::vector<std::string>({"a", "b", "c"}) && sum == 6 && count == 3);
    // a callback's failure stops the walk where it happened
    JsonCursor d = json_cursor("[1, x]", 6);
    CHECK(!json_array(&d, 0, [&](size_t) { return json_value(&d, nullptr, 1); }));
    CHECK(d.error_pos == 4 && strcmp(d.problem, "expected a value") == 0);
    // the depth limit holds for walkers too
    JsonCursor e = json_cursor("[]", 2);
    CHECK(!json_array(&e, JSON_MAX_DEPTH, [&](size_t) { return true; }) && strcmp(e.problem, "nesting deeper than 64 levels") == 0);
    JsonCursor f = json_cursor("{\"k\" 1}", 7);
    CHECK(!json_object(&f, 0, [&](std::string&) { return true; }) && f.error_pos == 5 && strcmp(f.problem, "expected ':'") == 0);
}

// With no tree to fill, json_value checks a value just as strictly.
TEST(checking_without_a_tree) {
    const char* good[] = {"1", "\"s\"", "[1, {\"a\": [true, null]}]", "{}", "-0.5e-3"};
    const char* bad[] = {"01", "\"\\ud800\"", "[1,]", "{\"a\" 1}", "tru"};
    for (const char* text : good) {
        JsonCursor c = json_cursor(text, strlen(text));
        CHECK(json_value(&c, nullptr, 0) && json_peek(&c) == -1);
    }
    for (const char* text : bad) {
        JsonCursor c = json_cursor(text, strlen(text));
        CHECK(!json_value(&c, nullptr, 0) && c.problem[0] != '\0');
    }
    std::string too_deep = nested_arrays(JSON_MAX_DEPTH + 1);
    JsonCursor deep = json_cursor(too_deep.data(), too_deep.size());
    CHECK(!json_value(&deep, nullptr, 0) && deep.error_pos == (size_t)JSON_MAX_DEPTH);
}

// The real 1 MB vocabulary loads as a tree too, 50,257 members in file order.
TEST(parses_the_gpt2_vocabulary) {
    std::string text = read_file("dev/data/gpt2_encoder.json");
    JsonValue v;
    CHECK(parse(text, &v) && v.type == JSON_OBJECT && v.keys.size() == 50257);
    CHECK(v.keys.size() > 0 && v.keys[0] == "!" && v.items[0].integer == 0);
    const JsonValue* eot = v.find("<|endoftext|>");
    CHECK(eot != nullptr && eot->is_integer && eot->integer == 50256);
}

// ----------------------------------------------------------------------------
// json_quote

TEST(quote_escapes) {
    CHECK(json_quote("") == "\"\"");
    CHECK(json_quote("plain") == "\"plain\"");
    CHECK(json_quote("a\"b\\c/") == "\"a\\\"b\\\\c/\"");
    CHECK(json_quote("\b\f\n\r\t") == "\"\\b\\f\\n\\r\\t\"");
    CHECK(json_quote(std::string("\x01\x1f\0\x7f", 4)) == std::string("\"\\u0001\\u001f\\u0000\x7f\""));
    CHECK(json_quote("caf\xC3\xA9 \xF0\x9F\x98\x80") == "\"caf\xC3\xA9 \xF0\x9F\x98\x80\"");
    CHECK(json_quote("bad \xFF \xC3") == "\"bad \\ufffd \\ufffd\"");  // ill-formed bytes
    CHECK(json_quote("\xED\xA0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");
}

// Quoting then parsing gives back any well-formed string.
TEST(quote_round_trips) {
    const char* alphabet[] = {"a", " ", "\"", "\\", "/", "\n", "\t", "(NUL)", "\x1f", "\x7f",
                              "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xEF\xBF\xBF"};
    std::string nul(1, '\0');
    std::mt19937 rng(3);
    for (int i = 0; i < 2000; i++) {
        std::string text;
        size_t len = rng() % 24;
        for (size_t k = 0; k < len; k++) {
            size_t pick = rng() % 14;
            text += pick == 7 ? nul : std::string(alphabet[pick]);
        }
        CHECK(string_of(json_quote(text)) == text);
    }
}

// ----------------------------------------------------------------------------
// robustness

// Mangled JSON either parses or fails with one line naming a byte inside the input.
TEST(mangled_input_never_crashes) {
    std::string base = "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\ud83d\\ude00\"], \"b\": {\"c\": {}}, \"d\": \"\xC3\xA9\"}";
    const char bytes[] = "{}[]\",:\\-+.0123456789eEtrufalsn \t\n\x01\x80\xC3\xFF";
    std::mt19937 rng(5);
    int parsed = 0, failed = 0;
    for (int i = 0; i < 20000; i++) {
        std::string text = base;
        for (int edits = 1 + rng() % 3; edits > 0; edits--) {
            size_t pos = rng() % (text.size() + 1);
            char b = bytes[rng() % (sizeof(bytes) - 1)];
            switch (rng() % 3) {
                case 0: if (pos < text.size()) { text[pos] = b; } break;
                case 1: text.insert(pos, 1, b); break;
                default: text = text.substr(0, pos); break;
            }
        }
        char error[256] = "";
        JsonValue v;
        if (json_parse(text.data(), text.size(), &v, error, sizeof(error))) {
            parsed++;
            continue;
        }
        failed++;
        size_t at = 0;
        bool one_line = sscanf(error, "bad JSON at byte %zu: ", &at) == 1 && strchr(error, '\n') == nullptr;
        CHECK(one_line && at <= text.size());
    }
    CHECK(parsed > 100 && failed > 10000);
}

TEST_MAIN()
