// The project's JSON reader (RFC 8259) and a string quoter for writers.
//
// Nothing here exits; every reader returns false and records the problem and its byte offset.
// - Cursor primitives (JsonCursor, json_expect, json_string, json_number, json_value with no
//   tree to check a value) and walkers (json_array, json_object: a callback per element),
//   for loaders with a structure of their own that keep only what they need: the
//   tokenizer's encoder.json (1 MB, 50k entries), safetensors headers (up to 100 MB).
// - json_parse(), which builds a JsonValue tree: null, bool, number (integers also kept
//   exactly as int64), UTF-8 string, array, object (member order and duplicates kept).
//   About 100 bytes per value: for small documents such as config.json.
// Strict: no trailing text, no leading zeros, no control characters or ill-formed UTF-8
// in strings, no lone surrogates, no numbers beyond double (or integers beyond int64),
// and at most JSON_MAX_DEPTH nested arrays and objects, so deep input cannot overflow the stack.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "llmc/utf8.h"

constexpr int JSON_MAX_DEPTH = 64;

// ----------------------------------------------------------------------------
// Cursor primitives

// A position in a JSON text, and the first problem found there ("" while none).
struct JsonCursor {
    const uint8_t* data;
    size_t size, pos;
    size_t error_pos;
    char problem[64];
};

static inline JsonCursor json_cursor(const void* data, size_t size) {
    JsonCursor c;
    c.data = (const uint8_t*)data;
    c.size = size;
    c.pos = 0;
    c.error_pos = 0;
    c.problem[0] = '\0';
    return c;
}

// Records `problem` at byte `at`; returns false for the caller to pass on.
static inline bool json_error_at(JsonCursor* c, size_t at, const char* problem) {
    c->error_pos = at;
    snprintf(c->problem, sizeof(c->problem), "%s", problem);
    return false;
}

static inline bool json_error(JsonCursor* c, const char* problem) { return json_error_at(c, c->pos, problem); }

// "bad JSON at byte N: problem", the one-line message of a failed cursor.
static inline void json_format_error(const JsonCursor& c, char* error, size_t error_size) {
    if (error != nullptr && error_size > 0) { snprintf(error, error_size, "bad JSON at byte %zu: %s", c.error_pos, c.problem); }
}

static inline bool is_json_space(uint8_t b) { return b == ' ' || b == '\t' || b == '\r' || b == '\n'; }

static inline void json_skip_space(JsonCursor* c) {
    while (c->pos < c->size && is_json_space(c->data[c->pos])) { c->pos++; }
}

// Skips space, then returns the next byte without consuming it, or -1 at the end.
static inline int json_peek(JsonCursor* c) {
    json_skip_space(c);
    return c->pos < c->size ? c->data[c->pos] : -1;
}

// Skips space, then consumes `ch` or fails with "expected 'ch'".
static inline bool json_expect(JsonCursor* c, char ch) {
    if (json_peek(c) != (uint8_t)ch) {
        char problem[32];
        snprintf(problem, sizeof(problem), "expected '%c'", ch);
        return json_error(c, problem);
    }
    c->pos++;
    return true;
}

// Four hex digits at c->pos.
static inline bool json_hex4(JsonCursor* c, uint32_t* value) {
    if (c->size - c->pos < 4) { return json_error(c, "truncated \\u escape"); }
    *value = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t h = c->data[c->pos];
        int digit = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (digit < 0) { return json_error(c, "bad hex digit in \\u escape"); }
        *value = *value * 16 + (uint32_t)digit;
        c->pos++;
    }
    return true;
}

// The code point of a \u escape whose 'u' is at c->pos; a surrogate must come as a high-low pair.
static inline bool json_unicode_escape(JsonCursor* c, size_t escape_start, uint32_t* cp) {
    c->pos++;
    if (!json_hex4(c, cp)) { return false; }
    if (*cp >= 0xDC00 && *cp < 0xE000) { return json_error_at(c, escape_start, "lone low surrogate in \\u escape"); }
    if (*cp < 0xD800 || *cp >= 0xDC00) { return true; }
    const uint8_t* next = c->data + c->pos;
    if (c->size - c->pos < 2 || next[0] != '\\' || next[1] != 'u') {
        return json_error_at(c, escape_start, "lone high surrogate in \\u escape");
    }
    c->pos += 2;
    uint32_t low = 0;
    if (!json_hex4(c, &low)) { return false; }
    if (low < 0xDC00 || low >= 0xE000) { return json_error_at(c, escape_start, "lone high surrogate in \\u escape"); }
    *cp = 0x10000 + ((*cp - 0xD800) << 10) + (low - 0xDC00);
    return true;
}

// One escape whose backslash is at c->pos, appended to *out in UTF-8.
static inline bool json_escape(JsonCursor* c, std::string* out) {
    size_t escape_start = c->pos++;
    if (c->pos >= c->size) { return json_error(c, "unterminated string"); }
    uint8_t e = c->data[c->pos];
    uint32_t cp = 0;
    switch (e) {
        case '"': case '\\': case '/': cp = e; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!json_unicode_escape(c, escape_start, &cp)) { return false; }
            utf8_append(out, cp);
            return true;
        default: return json_error_at(c, escape_start, "bad escape");
    }
    c->pos++;
    out->push_back((char)cp);
    return true;
}

// Skips space, then reads a string into *out (UTF-8, escapes resolved).
static inline bool json_string(JsonCursor* c, std::string* out) {
    if (json_peek(c) != '"') { return json_error(c, "expected a string"); }
    c->pos++;
    out->clear();
    while (true) {
        size_t run_start = c->pos;  // plain ASCII is copied a run at a time
        while (c->pos < c->size) {
            uint8_t b = c->data[c->pos];
            if (b < 0x20 || b >= 0x80 || b == '"' || b == '\\') { break; }
            c->pos++;
        }
        out->append((const char*)c->data + run_start, c->pos - run_start);
        if (c->pos >= c->size) { return json_error(c, "unterminated string"); }
        uint8_t b = c->data[c->pos];
        if (b == '"') { break; }
        if (b == '\\') {
            if (!json_escape(c, out)) { return false; }
            continue;
        }
        if (b < 0x20) { return json_error(c, "control character in string"); }
        size_t len = utf8_sequence_length(c->data + c->pos, c->size - c->pos);
        if (len == 0) { return json_error(c, "invalid UTF-8 in string"); }
        out->append((const char*)c->data + c->pos, len);
        c->pos += len;
    }
    c->pos++;
    return true;
}

// A number as read: `number` always, `integer` exactly when it was written as an integer.
struct JsonNumber {
    bool is_integer;
    int64_t integer;
    double number;
};

static inline bool json_is_digit(JsonCursor* c) { return c->pos < c->size && c->data[c->pos] >= '0' && c->data[c->pos] <= '9'; }

// Consumes one or more digits, or fails with `problem`.
static inline bool json_digits(JsonCursor* c, const char* problem) {
    if (!json_is_digit(c)) { return json_error(c, problem); }
    while (json_is_digit(c)) { c->pos++; }
    return true;
}

// The int64 value of the integer text [start, end) ("-" and at most 19 digits).
static inline bool json_integer_value(JsonCursor* c, size_t start, size_t end, int64_t* value) {
    bool negative = c->data[start] == '-';
    size_t first = start + (negative ? 1 : 0);
    if (end - first > 19) { return json_error_at(c, start, "integer out of range"); }
    uint64_t magnitude = 0;
    for (size_t i = first; i < end; i++) { magnitude = magnitude * 10 + (c->data[i] - '0'); }
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (magnitude > limit) { return json_error_at(c, start, "integer out of range"); }
    *value = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    return true;
}

// The double value of the number text [start, end), by strtod on a terminated copy
// (correctly rounded; the "C" locale's '.' is assumed: the project never calls setlocale).
static inline bool json_double_value(JsonCursor* c, size_t start, size_t end, double* value) {
    std::string text((const char*)c->data + start, end - start);
    *value = strtod(text.c_str(), nullptr);
    if (isinf(*value)) { return json_error_at(c, start, "number out of range"); }
    return true;
}

// Skips space, then reads a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
static inline bool json_number(JsonCursor* c, JsonNumber* out) {
    json_skip_space(c);
    size_t start = c->pos;
    if (c->pos < c->size && c->data[c->pos] == '-') { c->pos++; }
    if (!json_is_digit(c)) { return json_error(c, "expected a digit"); }
    bool leading_zero = c->data[c->pos] == '0';
    if (!json_digits(c, "expected a digit")) { return false; }
    if (leading_zero && c->pos - start > (c->data[start] == '-' ? 2u : 1u)) {
        return json_error_at(c, start, "leading zero in a number");
    }
    out->is_integer = true;
    if (c->pos < c->size && c->data[c->pos] == '.') {
        c->pos++;
        if (!json_digits(c, "expected a digit after '.'")) { return false; }
        out->is_integer = false;
    }
    if (c->pos < c->size && (c->data[c->pos] == 'e' || c->data[c->pos] == 'E')) {
        c->pos++;
        if (c->pos < c->size && (c->data[c->pos] == '+' || c->data[c->pos] == '-')) { c->pos++; }
        if (!json_digits(c, "expected a digit in the exponent")) { return false; }
        out->is_integer = false;
    }
    out->integer = 0;
    if (!out->is_integer) { return json_double_value(c, start, c->pos, &out->number); }
    if (!json_integer_value(c, start, c->pos, &out->integer)) { return false; }
    bool negative_zero = out->integer == 0 && c->data[start] == '-';
    out->number = negative_zero ? -0.0 : (double)out->integer;
    return true;
}

// Consumes the literal `word` (true, false, null) at c->pos.
static inline bool json_literal(JsonCursor* c, const char* word) {
    size_t len = strlen(word);
    if (c->size - c->pos < len || memcmp(c->data + c->pos, word, len) != 0) { return json_error(c, "expected a value"); }
    c->pos += len;
    return true;
}

// ----------------------------------------------------------------------------
// Arrays and objects, walked element by element

// Reads the array ('[') or object ('{') at the cursor (after space), at nesting `depth` (0: top
// level): element() is called with the cursor before each element and must read it.
template <typename ElementFn>
static inline bool json_container(JsonCursor* c, int depth, char open, ElementFn element) {
    bool array = open == '[';
    char close = array ? ']' : '}';
    if (json_peek(c) != open) { return json_error(c, array ? "expected '['" : "expected '{'"); }
    if (depth >= JSON_MAX_DEPTH) { return json_error(c, "nesting deeper than 64 levels"); }
    c->pos++;
    if (json_peek(c) == close) {
        c->pos++;
        return true;
    }
    while (true) {
        if (!element()) { return false; }
        int next = json_peek(c);
        if (next != ',' && next != close) { return json_error(c, array ? "expected ',' or ']'" : "expected ',' or '}'"); }
        c->pos++;
        if (next == close) { return true; }
    }
}

// The array at the cursor: item(index) reads each element (at depth + 1).
template <typename ItemFn>
static inline bool json_array(JsonCursor* c, int depth, ItemFn item) {
    size_t index = 0;
    return json_container(c, depth, '[', [&] { return item(index++); });
}

// The object at the cursor: member(key) reads each member's value (at depth + 1); it may move
// the key.
template <typename MemberFn>
static inline bool json_object(JsonCursor* c, int depth, MemberFn member) {
    std::string key;
    return json_container(c, depth, '{', [&] { return json_string(c, &key) && json_expect(c, ':') && member(key); });
}

// ----------------------------------------------------------------------------
// The tree

enum JsonType : uint8_t { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct JsonValue {
    JsonType type = JSON_NULL;
    bool boolean = false;           // JSON_BOOL
    bool is_integer = false;        // JSON_NUMBER written as an integer: `integer` holds it exactly
    int64_t integer = 0;
    double number = 0;              // JSON_NUMBER, integers included
    std::string string;             // JSON_STRING, in UTF-8
    std::vector<JsonValue> items;   // JSON_ARRAY elements; JSON_OBJECT member values
    std::vector<std::string> keys;  // JSON_OBJECT member names: keys[i] names items[i]

    // The value of the first member named `key`, or nullptr (also when this is not an object).
    const JsonValue* find(const std::string& key) const {
        if (type != JSON_OBJECT) { return nullptr; }
        for (size_t i = 0; i < keys.size(); i++) {
            if (keys[i] == key) { return &items[i]; }
        }
        return nullptr;
    }
};

// Skips space, then reads any value at nesting `depth` into *out (a fresh JsonValue); with
// out nullptr it only checks the value, keeping nothing.
static inline bool json_value(JsonCursor* c, JsonValue* out, int depth) {
    int next = json_peek(c);
    if (next == '[') {
        if (out != nullptr) { out->type = JSON_ARRAY; }
        return json_array(c, depth, [&](size_t) {
            if (out == nullptr) { return json_value(c, nullptr, depth + 1); }
            out->items.emplace_back();
            return json_value(c, &out->items.back(), depth + 1);
        });
    }
    if (next == '{') {
        if (out != nullptr) { out->type = JSON_OBJECT; }
        return json_object(c, depth, [&](std::string& key) {
            if (out == nullptr) { return json_value(c, nullptr, depth + 1); }
            out->keys.push_back(std::move(key));
            out->items.emplace_back();
            return json_value(c, &out->items.back(), depth + 1);
        });
    }
    JsonValue scalar;  // where an unkept scalar is read
    JsonValue* v = out != nullptr ? out : &scalar;
    switch (next) {
        case '"': v->type = JSON_STRING; return json_string(c, &v->string);
        case 't': v->type = JSON_BOOL; v->boolean = true; return json_literal(c, "true");
        case 'f': v->type = JSON_BOOL; return json_literal(c, "false");
        case 'n': return json_literal(c, "null");
        default: break;
    }
    if (next != '-' && (next < '0' || next > '9')) { return json_error(c, "expected a value"); }
    JsonNumber number;
    if (!json_number(c, &number)) { return false; }
    v->type = JSON_NUMBER;
    v->is_integer = number.is_integer;
    v->integer = number.integer;
    v->number = number.number;
    return true;
}

// Parses the whole of text[0, size) into *out. On a defect returns false, leaves *out null
// and writes "bad JSON at byte N: problem" to error (if error_size > 0).
static inline bool json_parse(const char* text, size_t size, JsonValue* out, char* error, size_t error_size) {
    JsonCursor c = json_cursor(text, size);
    *out = JsonValue();
    bool ok = json_value(&c, out, 0);
    if (ok && json_peek(&c) != -1) { ok = json_error(&c, "unexpected text after the value"); }
    if (!ok) {
        *out = JsonValue();
        json_format_error(c, error, error_size);
    }
    return ok;
}

// ----------------------------------------------------------------------------
// Writing

// `text` as a JSON string literal: quotes, backslash escapes for '"', '\' and control
// characters; UTF-8 kept as is, each byte of an ill-formed sequence written as U+FFFD.
static inline std::string json_quote(const std::string& text) {
    static constexpr char HEX[] = "0123456789abcdef";
    const uint8_t* s = (const uint8_t*)text.data();
    std::string out = "\"";
    for (size_t pos = 0; pos < text.size();) {
        uint8_t b = s[pos];
        if (b >= 0x80) {
            size_t len = utf8_sequence_length(s + pos, text.size() - pos);
            out.append(len == 0 ? "\\ufffd" : text.substr(pos, len));
            pos += len == 0 ? 1 : len;
            continue;
        }
        pos++;
        switch (b) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (b >= 0x20) { out.push_back((char)b); break; }
                out += "\\u00";
                out.push_back(HEX[b >> 4]);
                out.push_back(HEX[b & 15]);
        }
    }
    out.push_back('"');
    return out;
}
