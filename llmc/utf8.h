// UTF-8 well-formedness (Unicode Table 3-7), shared by the tokenizer and the JSON reader:
// what a lead byte starts, how much of a sequence is well-formed, decoding and encoding.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>

// What a lead byte starts: the sequence length (0: it cannot start one) and the
// allowed range of the second byte (later bytes are plain continuations 0x80-0xBF).
struct Utf8Lead {
    uint8_t length, second_min, second_max;
};

static inline Utf8Lead utf8_lead(uint8_t b) {
    if (b < 0x80) { return {1, 0, 0}; }
    if (b < 0xC2) { return {0, 0, 0}; }
    if (b < 0xE0) { return {2, 0x80, 0xBF}; }
    if (b == 0xE0) { return {3, 0xA0, 0xBF}; }  // no overlongs
    if (b == 0xED) { return {3, 0x80, 0x9F}; }  // no surrogates
    if (b < 0xF0) { return {3, 0x80, 0xBF}; }
    if (b == 0xF0) { return {4, 0x90, 0xBF}; }  // no overlongs
    if (b < 0xF4) { return {4, 0x80, 0xBF}; }
    if (b == 0xF4) { return {4, 0x80, 0x8F}; }  // nothing above U+10FFFF
    return {0, 0, 0};
}

// How many of the `avail` bytes at s (s[0] a lead of length > 0) form a well-formed
// prefix of its sequence: lead.length when complete, less when cut short or broken.
static inline size_t utf8_valid_prefix(const uint8_t* s, size_t avail, Utf8Lead lead) {
    if (lead.length == 1 || avail < 2 || s[1] < lead.second_min || s[1] > lead.second_max) { return 1; }
    size_t k = 2;
    while (k < lead.length && k < avail && (s[k] & 0xC0) == 0x80) { k++; }
    return k;
}

// Length of the well-formed sequence at s (avail > 0 bytes), or 0 if it is ill-formed or cut short.
static inline size_t utf8_sequence_length(const uint8_t* s, size_t avail) {
    Utf8Lead lead = utf8_lead(s[0]);
    if (lead.length == 0 || utf8_valid_prefix(s, avail, lead) < lead.length) { return 0; }
    return lead.length;
}

// The code point of a well-formed sequence of `length` bytes.
static inline uint32_t utf8_code_point(const uint8_t* s, size_t length) {
    static constexpr uint8_t LEAD_MASK[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = s[0] & LEAD_MASK[length];
    for (size_t i = 1; i < length; i++) { cp = (cp << 6) | (s[i] & 0x3F); }
    return cp;
}

// Appends code point cp (at most U+10FFFF) in UTF-8.
static inline void utf8_append(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
        out->push_back((char)cp);
    } else if (cp < 0x800) {
        out->push_back((char)(0xC0 | cp >> 6));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back((char)(0xE0 | cp >> 12));
        out->push_back((char)(0x80 | (cp >> 6 & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else {
        out->push_back((char)(0xF0 | cp >> 18));
        out->push_back((char)(0x80 | (cp >> 12 & 0x3F)));
        out->push_back((char)(0x80 | (cp >> 6 & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    }
}

// True if all `size` bytes at s are well-formed UTF-8.
static inline bool utf8_is_valid(const uint8_t* s, size_t size) {
    for (size_t pos = 0; pos < size;) {
        size_t len = utf8_sequence_length(s + pos, size - pos);
        if (len == 0) { return false; }
        pos += len;
    }
    return true;
}

// How many of the `size` bytes at s are not part of a well-formed sequence (the tokenizer takes
// each such byte as a character of its own); *first is the offset of the first of them (size if
// none).
static inline size_t utf8_invalid_bytes(const uint8_t* s, size_t size, size_t* first) {
    size_t count = 0;
    *first = size;
    for (size_t pos = 0; pos < size;) {
        if (s[pos] < 0x80) {
            pos++;
            continue;
        }
        size_t len = utf8_sequence_length(s + pos, size - pos);
        if (len > 0) {
            pos += len;
            continue;
        }
        if (count++ == 0) { *first = pos; }
        pos++;
    }
    return count;
}

// The bytes at s with each one that is not part of a well-formed sequence (a raw byte of a path, a
// character cut short) replaced by U+FFFD, so that readers that require UTF-8 take the text whole.
static inline std::string utf8_repaired(const uint8_t* s, size_t size) {
    std::string out;
    out.reserve(size);
    for (size_t pos = 0; pos < size;) {
        size_t len = s[pos] < 0x80 ? 1 : utf8_sequence_length(s + pos, size - pos);
        if (len == 0) {
            utf8_append(&out, 0xFFFD);
            pos++;
        } else {
            out.append((const char*)s + pos, len);
            pos += len;
        }
    }
    return out;
}

