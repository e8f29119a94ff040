// GPT-2's byte-level BPE tokenizer, exact to tiktoken's "gpt2" encoding (encode_ordinary).
//
// Loading: OpenAI's encoder.json (token string in GPT-2's byte alphabet -> id) or the
// classic gpt2_tokenizer.bin (256 x int32 header, then per token a length byte and its
// bytes). In both, a token's id is also its BPE merge rank.
//
// Encoding: a hand-written pre-tokenizer splits the text the way the r50k pattern
//   '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does, then each piece that is not itself a token is BPE-merged: repeatedly join the
// adjacent pair whose bytes form the lowest-ranked token (leftmost on ties). Bytes that
// are not well-formed UTF-8 count one character each, of class "other", so any input
// encodes and decodes back to itself. tokenizer_encode may run concurrently on one
// const Tokenizer: its memo of BPE results is per thread.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmc/json.h"
#include "llmc/unicode_tables.h"
#include "llmc/utf8.h"
#include "llmc/utils.h"

constexpr int32_t TOKENIZER_BIN_MAGIC = 20240328;
constexpr int TOKENIZER_BIN_HEADER_INTS = 256;
constexpr uint32_t GPT2_EOT_TOKEN = 50256;  // the end-of-text id a version 1 .bin implies
constexpr uint32_t NO_TOKEN = UINT32_MAX;

struct Tokenizer {
    uint32_t vocab_size = 0;
    uint32_t eot_token = 0;
    std::vector<uint8_t> token_bytes;     // every token's bytes, concatenated in id order
    std::vector<uint32_t> token_offsets;  // token i is token_bytes[offsets[i], offsets[i + 1])
    std::vector<uint64_t> rank_slots;     // open addressing on bytes: (hash tag << 32) | (id + 1)
    uint64_t rank_mask = 0;               // rank_slots.size() - 1
    uint32_t byte_token[256] = {};        // the id of each single byte
    size_t max_token_len = 0;
    uint64_t serial = 0;                  // tells the per-thread BPE memos which tokenizer they hold
};

// ----------------------------------------------------------------------------
// Character classes of the pre-tokenizer

enum CharClass : uint8_t { CHAR_OTHER = 0, CHAR_LETTER = 1, CHAR_NUMBER = 2, CHAR_SPACE = 3 };

constexpr uint32_t NUM_CODE_POINTS = 0x110000;
constexpr uint32_t CLASS_BLOCK_SIZE = 256;

// Two-level class lookup: code point / 256 picks one of the distinct 256-entry blocks.
// Block 0 (U+0000-U+00FF) is stored first, so classes[b] is the class of byte b < 0x80.
struct CharClassTable {
    uint16_t block_of[NUM_CODE_POINTS / CLASS_BLOCK_SIZE];
    std::vector<uint8_t> classes;
};

template <size_t N>
inline void mark_ranges(std::vector<uint8_t>* flat, const uint32_t (&ranges)[N][2], CharClass cls) {
    for (size_t i = 0; i < N; i++) {
        for (uint32_t cp = ranges[i][0]; cp <= ranges[i][1]; cp++) { (*flat)[cp] = cls; }
    }
}

inline CharClassTable build_char_class_table() {
    std::vector<uint8_t> flat(NUM_CODE_POINTS, CHAR_OTHER);
    mark_ranges(&flat, UNICODE_LETTER_RANGES, CHAR_LETTER);
    mark_ranges(&flat, UNICODE_NUMBER_RANGES, CHAR_NUMBER);
    mark_ranges(&flat, UNICODE_WHITE_SPACE_RANGES, CHAR_SPACE);
    CharClassTable table;
    std::unordered_map<std::string, uint16_t> index_of_block;
    for (uint32_t b = 0; b < NUM_CODE_POINTS / CLASS_BLOCK_SIZE; b++) {
        std::string block((const char*)&flat[b * CLASS_BLOCK_SIZE], CLASS_BLOCK_SIZE);
        auto inserted = index_of_block.emplace(block, (uint16_t)index_of_block.size());
        if (inserted.second) { table.classes.insert(table.classes.end(), block.begin(), block.end()); }
        table.block_of[b] = inserted.first->second;
    }
    return table;
}

// Built on first use and kept for the life of the process.
inline const CharClassTable& char_class_table() {
    static const CharClassTable table = build_char_class_table();
    return table;
}

inline CharClass char_class(const CharClassTable& table, uint32_t cp) {
    return (CharClass)table.classes[(size_t)table.block_of[cp / CLASS_BLOCK_SIZE] * CLASS_BLOCK_SIZE +
                                    cp % CLASS_BLOCK_SIZE];
}

// Class and byte length of the character at s[pos] (pos < n). A byte that does not
// start a well-formed UTF-8 sequence is a one-byte character of class other.
inline CharClass char_at(const CharClassTable& table, const uint8_t* s, size_t pos, size_t n, size_t* len) {
    uint8_t b = s[pos];
    if (b < 0x80) {
        *len = 1;
        return (CharClass)table.classes[b];
    }
    Utf8Lead lead = utf8_lead(b);
    if (lead.length == 0 || utf8_valid_prefix(s + pos, n - pos, lead) < lead.length) {
        *len = 1;
        return CHAR_OTHER;
    }
    *len = lead.length;
    return char_class(table, utf8_code_point(s + pos, lead.length));
}

// ----------------------------------------------------------------------------
// Pre-tokenizer: the r50k pattern as a state machine over characters

// End of the run of class `cls` characters starting at pos.
inline size_t class_run_end(const CharClassTable& table, const uint8_t* s, size_t pos, size_t n, CharClass cls) {
    size_t len;
    while (pos < n && char_at(table, s, pos, n, &len) == cls) { pos += len; }
    return pos;
}

// End of a contraction ('s 'd 'm 't 'll 've 're, case-sensitive) at pos, or pos if none.
inline size_t contraction_end(const uint8_t* s, size_t pos, size_t n) {
    if (pos + 1 >= n || s[pos] != '\'') { return pos; }
    uint8_t c1 = s[pos + 1];
    if (c1 == 's' || c1 == 'd' || c1 == 'm' || c1 == 't') { return pos + 2; }
    if (pos + 2 >= n) { return pos; }
    uint8_t c2 = s[pos + 2];
    bool two_letter = (c1 == 'l' && c2 == 'l') || (c1 == 'v' && c2 == 'e') || (c1 == 'r' && c2 == 'e');
    return two_letter ? pos + 3 : pos;
}

// End of the pre-tokenizer piece that starts at pos (pos < n).
inline size_t piece_end(const CharClassTable& table, const uint8_t* s, size_t pos, size_t n) {
    size_t end = contraction_end(s, pos, n);
    if (end > pos) { return end; }
    size_t len;
    CharClass cls = char_at(table, s, pos, n, &len);
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space, then a run of one class
    if (s[pos] == ' ' && pos + 1 < n) {
        size_t next_len;
        CharClass next = char_at(table, s, pos + 1, n, &next_len);
        if (next != CHAR_SPACE) { return class_run_end(table, s, pos + 1 + next_len, n, next); }
    }
    if (cls != CHAR_SPACE) { return class_run_end(table, s, pos + len, n, cls); }
    // "\s+(?!\S)|\s+": a whitespace run gives up its last character to a following
    // non-space, unless that would leave it empty
    size_t last_start = pos;
    end = pos + len;
    while (end < n && char_at(table, s, end, n, &len) == CHAR_SPACE) {
        last_start = end;
        end += len;
    }
    if (end < n && last_start > pos) { return last_start; }
    return end;
}

// ----------------------------------------------------------------------------
// Token lookup by bytes

// A fast hash of a short byte string: 8 bytes at a time, mixed by multiply-xorshift.
inline uint64_t hash_bytes(const uint8_t* s, size_t n) {
    constexpr uint64_t MUL = 0x9E3779B97F4A7C15ull;
    uint64_t h = n * MUL;
    for (; n >= 8; s += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, s, 8);
        h = (h ^ word) * MUL;
        h ^= h >> 29;
    }
    uint64_t tail = 0;
    memcpy(&tail, s, n);
    h = (h ^ tail) * 0xD6E8FEB86659FD93ull;
    return h ^ (h >> 32);
}

inline const uint8_t* token_data(const Tokenizer* tok, uint32_t id) { return &tok->token_bytes[tok->token_offsets[id]]; }
inline size_t token_length(const Tokenizer* tok, uint32_t id) {
    return tok->token_offsets[id + 1] - tok->token_offsets[id];
}

// Slot index of the token with these bytes, or of the empty slot where it would go.
inline size_t find_rank_slot(const Tokenizer* tok, const uint8_t* s, size_t n, uint64_t hash) {
    uint64_t tag = hash >> 32;
    for (size_t i = hash & tok->rank_mask;; i = (i + 1) & tok->rank_mask) {
        uint64_t slot = tok->rank_slots[i];
        if (slot == 0) { return i; }
        uint32_t id = (uint32_t)slot - 1;
        if ((slot >> 32) == tag && token_length(tok, id) == n && memcmp(token_data(tok, id), s, n) == 0) { return i; }
    }
}

// The id of the token with exactly these bytes (the end-of-text token excluded), or NO_TOKEN.
inline uint32_t token_with_bytes(const Tokenizer* tok, const uint8_t* s, size_t n, uint64_t hash) {
    if (n > tok->max_token_len) { return NO_TOKEN; }
    uint64_t slot = tok->rank_slots[find_rank_slot(tok, s, n, hash)];
    return slot == 0 ? NO_TOKEN : (uint32_t)slot - 1;
}

inline uint32_t token_with_bytes(const Tokenizer* tok, const uint8_t* s, size_t n) {
    return n > tok->max_token_len ? NO_TOKEN : token_with_bytes(tok, s, n, hash_bytes(s, n));
}

// ----------------------------------------------------------------------------
// Byte pair merging of one piece

constexpr size_t LINEAR_BPE_MAX_LEN = 128;  // longer pieces merge through a heap

// BPE the way tiktoken does it, for short pieces: scan all pairs for the lowest rank each step.
inline void bpe_merge_linear(const Tokenizer* tok, const uint8_t* s, size_t n, std::vector<uint32_t>* out) {
    uint32_t starts[LINEAR_BPE_MAX_LEN + 1];  // start of each part, then n
    uint32_t ids[LINEAR_BPE_MAX_LEN];         // token of each part
    uint32_t pair_ranks[LINEAR_BPE_MAX_LEN];  // rank of part i joined with part i + 1
    size_t parts = n;
    for (size_t i = 0; i < n; i++) {
        starts[i] = (uint32_t)i;
        ids[i] = tok->byte_token[s[i]];
    }
    starts[n] = (uint32_t)n;
    auto rank_of_pair = [&](size_t i) { return token_with_bytes(tok, s + starts[i], starts[i + 2] - starts[i]); };
    for (size_t i = 0; i + 1 < parts; i++) { pair_ranks[i] = rank_of_pair(i); }
    while (parts > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < parts; i++) {
            if (pair_ranks[i] < pair_ranks[best]) { best = i; }
        }
        if (pair_ranks[best] == NO_TOKEN) { break; }
        ids[best] = pair_ranks[best];
        // part best + 1 is absorbed: shift the later parts (and their pairs) down by one
        for (size_t i = best + 1; i < parts; i++) { starts[i] = starts[i + 1]; }
        for (size_t i = best + 1; i + 1 < parts; i++) { ids[i] = ids[i + 1]; }
        for (size_t i = best + 1; i + 2 < parts; i++) { pair_ranks[i] = pair_ranks[i + 1]; }
        parts--;
        if (best + 1 < parts) { pair_ranks[best] = rank_of_pair(best); }
        if (best > 0) { pair_ranks[best - 1] = rank_of_pair(best - 1); }
    }
    out->insert(out->end(), ids, ids + parts);
}

// A pair of adjacent parts [left, mid) and [mid, end) whose join is token `rank`.
struct MergeCandidate {
    uint32_t rank, left, mid, end;
};

// Heap order: the lowest rank on top, the leftmost among equal ranks.
inline bool merges_after(const MergeCandidate& a, const MergeCandidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

// The same merges as bpe_merge_linear in O(n log n), for long pieces. Parts are a linked
// list by start offset; heap entries whose parts have since changed are skipped.
inline void bpe_merge_heap(const Tokenizer* tok, const uint8_t* s, size_t n, std::vector<uint32_t>* out) {
    constexpr uint32_t DEAD = UINT32_MAX;
    std::vector<uint32_t> next(n), prev(n), ids(n);  // indexed by part start
    std::vector<MergeCandidate> heap;
    auto push_pair = [&](uint32_t left, uint32_t mid) {
        if (mid >= n) { return; }
        uint32_t end = next[mid];
        uint32_t rank = token_with_bytes(tok, s + left, end - left);
        if (rank == NO_TOKEN) { return; }
        heap.push_back({rank, left, mid, end});
        std::push_heap(heap.begin(), heap.end(), merges_after);
    };
    for (uint32_t i = 0; i < n; i++) {
        next[i] = i + 1;
        prev[i] = i - 1;  // wraps to DEAD for the first part
        ids[i] = tok->byte_token[s[i]];
    }
    for (uint32_t i = 0; i + 1 < n; i++) { push_pair(i, i + 1); }
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), merges_after);
        MergeCandidate merge = heap.back();
        heap.pop_back();
        if (next[merge.left] != merge.mid || next[merge.mid] != merge.end) { continue; }
        ids[merge.left] = merge.rank;
        next[merge.left] = merge.end;
        next[merge.mid] = DEAD;
        if (merge.end < n) { prev[merge.end] = merge.left; }
        if (prev[merge.left] != DEAD) { push_pair(prev[merge.left], merge.left); }
        push_pair(merge.left, merge.end);
    }
    for (uint32_t i = 0; i < n; i = next[i]) { out->push_back(ids[i]); }
}

inline void bpe_merge(const Tokenizer* tok, const uint8_t* s, size_t n, std::vector<uint32_t>* out) {
    if (n <= LINEAR_BPE_MAX_LEN) {
        bpe_merge_linear(tok, s, n, out);
    } else {
        bpe_merge_heap(tok, s, n, out);
    }
}

// ----------------------------------------------------------------------------
// Per-thread memo: piece bytes -> ids, for pieces that needed merging

constexpr size_t PIECE_CACHE_SLOTS = 1 << 16;
constexpr size_t PIECE_CACHE_MAX_ENTRIES = PIECE_CACHE_SLOTS / 2;
constexpr size_t CACHED_PIECE_MAX_LEN = 64;

struct PieceCacheEntry {
    uint32_t key_offset, key_len, ids_offset, ids_len;
};

struct PieceCache {
    uint64_t tokenizer_serial = 0;       // whose results these are
    std::vector<uint64_t> slots;         // (hash tag << 32) | (entry index + 1), 0 = empty
    std::vector<PieceCacheEntry> entries;
    std::vector<uint8_t> keys;           // entries' piece bytes
    std::vector<uint32_t> ids;           // entries' token ids
};

inline void piece_cache_reset(PieceCache* cache, uint64_t tokenizer_serial) {
    cache->tokenizer_serial = tokenizer_serial;
    cache->slots.assign(PIECE_CACHE_SLOTS, 0);
    cache->entries.clear();
    cache->keys.clear();
    cache->ids.clear();
}

// This thread's memo, emptied whenever it was filled by another tokenizer.
inline PieceCache& piece_cache_for(const Tokenizer* tok) {
    thread_local PieceCache cache;
    if (cache.tokenizer_serial != tok->serial) { piece_cache_reset(&cache, tok->serial); }
    return cache;
}

// Slot index of the entry for these bytes, or of the empty slot where it would go.
inline size_t find_cache_slot(const PieceCache& cache, const uint8_t* s, size_t n, uint64_t hash) {
    uint64_t tag = hash >> 32;
    for (size_t i = hash & (PIECE_CACHE_SLOTS - 1);; i = (i + 1) & (PIECE_CACHE_SLOTS - 1)) {
        uint64_t slot = cache.slots[i];
        if (slot == 0) { return i; }
        const PieceCacheEntry& e = cache.entries[(uint32_t)slot - 1];
        if ((slot >> 32) == tag && e.key_len == n && memcmp(&cache.keys[e.key_offset], s, n) == 0) { return i; }
    }
}

// Appends the ids of one pre-tokenizer piece: the piece's own token if it is one
// (as tiktoken does), else its merges, memoized for short pieces.
inline void encode_piece(const Tokenizer* tok, PieceCache* cache, const uint8_t* s, size_t n,
                         std::vector<uint32_t>* out) {
    if (n > CACHED_PIECE_MAX_LEN) {
        uint32_t id = token_with_bytes(tok, s, n);
        if (id != NO_TOKEN) {
            out->push_back(id);
        } else {
            bpe_merge(tok, s, n, out);
        }
        return;
    }
    uint64_t hash = hash_bytes(s, n);
    uint32_t id = token_with_bytes(tok, s, n, hash);
    if (id != NO_TOKEN) {
        out->push_back(id);
        return;
    }
    size_t slot = find_cache_slot(*cache, s, n, hash);
    if (cache->slots[slot] != 0) {
        const PieceCacheEntry& e = cache->entries[(uint32_t)cache->slots[slot] - 1];
        out->insert(out->end(), &cache->ids[e.ids_offset], &cache->ids[e.ids_offset] + e.ids_len);
        return;
    }
    size_t first = out->size();
    bpe_merge(tok, s, n, out);
    if (cache->entries.size() == PIECE_CACHE_MAX_ENTRIES) {
        piece_cache_reset(cache, cache->tokenizer_serial);
        slot = find_cache_slot(*cache, s, n, hash);
    }
    PieceCacheEntry entry = {(uint32_t)cache->keys.size(), (uint32_t)n, (uint32_t)cache->ids.size(),
                             (uint32_t)(out->size() - first)};
    cache->keys.insert(cache->keys.end(), s, s + n);
    cache->ids.insert(cache->ids.end(), out->begin() + first, out->end());
    cache->entries.push_back(entry);
    cache->slots[slot] = ((hash >> 32) << 32) | cache->entries.size();
}

// Appends the ids of `text` (len bytes, any bytes at all) to *out. "<|endoftext|>" in the
// text is plain text. Safe to call from several threads at once.
inline void tokenizer_encode(const Tokenizer* tok, const char* text, size_t len, std::vector<uint32_t>* out) {
    const CharClassTable& table = char_class_table();
    PieceCache& cache = piece_cache_for(tok);
    const uint8_t* s = (const uint8_t*)text;
    for (size_t pos = 0; pos < len;) {
        size_t end = piece_end(table, s, pos, len);
        encode_piece(tok, &cache, s + pos, end - pos, out);
        pos = end;
    }
}

// ----------------------------------------------------------------------------
// Decoding

inline void tokenizer_decode(const Tokenizer* tok, uint32_t id, const uint8_t** bytes, size_t* len) {
    if (id >= tok->vocab_size) { fail("token id %u out of range (vocab size %u)", id, tok->vocab_size); }
    *bytes = token_data(tok, id);
    *len = token_length(tok, id);
}

// Appends the bytes of `count` tokens to *out.
inline void tokenizer_decode_append(const Tokenizer* tok, const uint32_t* ids, size_t count, std::string* out) {
    for (size_t i = 0; i < count; i++) {
        const uint8_t* bytes;
        size_t len;
        tokenizer_decode(tok, ids[i], &bytes, &len);
        out->append((const char*)bytes, len);
    }
}

// ----------------------------------------------------------------------------
// Loading

// Fills the tokenizer from its tokens' bytes in id order, failing (naming `path`) on a
// duplicate token or a byte with no token of its own.
inline void tokenizer_build(Tokenizer* tok, const char* path, const std::vector<std::string>& tokens, uint32_t eot) {
    static std::atomic<uint64_t> next_serial{1};
    tok->vocab_size = (uint32_t)tokens.size();
    tok->eot_token = eot;
    tok->token_bytes.clear();
    tok->token_offsets.assign(1, 0);
    tok->max_token_len = 0;
    for (const std::string& token : tokens) {
        tok->token_bytes.insert(tok->token_bytes.end(), token.begin(), token.end());
        tok->token_offsets.push_back((uint32_t)tok->token_bytes.size());
        tok->max_token_len = std::max(tok->max_token_len, token.size());
    }
    size_t num_slots = 1024;
    while (num_slots < 2 * tokens.size()) { num_slots *= 2; }
    tok->rank_slots.assign(num_slots, 0);
    tok->rank_mask = num_slots - 1;
    for (uint32_t id = 0; id < tok->vocab_size; id++) {
        if (id == eot) { continue; }  // encode_ordinary never yields it
        const uint8_t* s = token_data(tok, id);
        size_t n = token_length(tok, id);
        uint64_t hash = hash_bytes(s, n);
        size_t slot = find_rank_slot(tok, s, n, hash);
        if (tok->rank_slots[slot] != 0) {
            fail("%s: tokens %u and %u have the same bytes", path, (uint32_t)tok->rank_slots[slot] - 1, id);
        }
        tok->rank_slots[slot] = ((hash >> 32) << 32) | (id + 1);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        tok->byte_token[b] = token_with_bytes(tok, &byte, 1);
        if (tok->byte_token[b] == NO_TOKEN) { fail("%s: no token for the byte 0x%02X", path, b); }
    }
    tok->serial = next_serial++;
    char_class_table();  // build the process-wide class table now rather than in the first encode
}

inline int32_t read_int32_le(const uint8_t* p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

// The classic .bin: header [magic, version 1|2, vocab size, eot (version 2)], then per
// token a length byte (> 0) and its bytes.
inline void load_tokenizer_bin(Tokenizer* tok, const char* path, const std::vector<uint8_t>& data) {
    size_t header_bytes = TOKENIZER_BIN_HEADER_INTS * sizeof(int32_t);
    if (data.size() < header_bytes) { fail("%s: truncated header (%zu bytes)", path, data.size()); }
    int32_t version = read_int32_le(&data[4]);
    int32_t vocab_size = read_int32_le(&data[8]);
    if (version != 1 && version != 2) { fail("%s: unsupported version %d (expected 1 or 2)", path, version); }
    if (vocab_size <= 0) { fail("%s: bad vocab size %d", path, vocab_size); }
    size_t token_area = data.size() - header_bytes;
    if ((size_t)vocab_size > token_area) {  // checked before allocating for that many tokens
        fail("%s: vocab size %d cannot fit in %zu bytes of tokens (a length byte each)", path, vocab_size, token_area);
    }
    int64_t eot = version == 2 ? read_int32_le(&data[12]) : GPT2_EOT_TOKEN;
    if (eot < 0 || eot >= vocab_size) { fail("%s: eot token %lld out of range (vocab size %d)", path, (long long)eot, vocab_size); }
    std::vector<std::string> tokens(vocab_size);
    size_t pos = header_bytes;
    for (int32_t id = 0; id < vocab_size; id++) {
        if (pos >= data.size() || pos + 1 + data[pos] > data.size()) {
            fail("%s: file is truncated (token %d of %d)", path, id, vocab_size);
        }
        size_t len = data[pos];
        if (len == 0) { fail("%s: token %d has length 0", path, id); }
        tokens[id].assign((const char*)&data[pos + 1], len);
        pos += 1 + len;
    }
    if (pos != data.size()) { fail("%s: %zu unexpected bytes after the last token", path, data.size() - pos); }
    tokenizer_build(tok, path, tokens, (uint32_t)eot);
}

// GPT-2 writes each byte as one character: printable bytes (0x21-0x7E, 0xA1-0xAC,
// 0xAE-0xFF) as themselves, the k-th other byte as U+0100 + k. Returns the byte a
// character stands for, or -1 if it is not in this alphabet.
inline int gpt2_alphabet_byte(uint32_t cp) {
    static const std::vector<int> byte_of_char = [] {
        std::vector<int> table(256 + 68, -1);
        int num_unprintable = 0;
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            table[printable ? b : 256 + num_unprintable++] = b;
        }
        return table;
    }();
    return cp < byte_of_char.size() ? byte_of_char[cp] : -1;
}

// Fails with "PATH: bad JSON at byte N: problem" unless the JSON step went well.
inline void encoder_json_check(bool ok, const JsonCursor& c, const char* path) {
    if (!ok) { fail("%s: bad JSON at byte %zu: %s", path, c.error_pos, c.problem); }
}

// A token's id: a non-negative integer below 2^31 (after skipping space).
inline uint32_t encoder_json_id(JsonCursor* c, const char* path) {
    int next = json_peek(c);
    size_t start = c->pos;
    JsonNumber id = {};
    bool ok = next >= '0' && next <= '9' ? json_number(c, &id) : json_error(c, "expected a non-negative integer id");
    if (ok && !id.is_integer) { ok = json_error_at(c, start, "expected a non-negative integer id"); }
    if (ok && id.integer > INT32_MAX) { ok = json_error_at(c, start, "id too large"); }
    encoder_json_check(ok, *c, path);
    return (uint32_t)id.integer;
}

// A token string's bytes: each character (UTF-8) of `text` stands for one byte in GPT-2's alphabet.
inline void gpt2_token_bytes(const std::string& text, const char* path, size_t entry_pos, std::string* bytes) {
    const uint8_t* s = (const uint8_t*)text.data();
    bytes->clear();
    for (size_t pos = 0; pos < text.size();) {
        size_t len = utf8_sequence_length(s + pos, text.size() - pos);  // the JSON reader made it well-formed
        uint32_t cp = utf8_code_point(s + pos, len);
        int b = gpt2_alphabet_byte(cp);
        if (b < 0) { fail("%s: token string at byte %zu has U+%04X, not in GPT-2's byte alphabet", path, entry_pos, cp); }
        bytes->push_back((char)b);
        pos += len;
    }
}

// encoder.json: {"token string": id, ...} with ids 0..N-1 each once and token strings
// in GPT-2's byte alphabet; the end-of-text token is the entry "<|endoftext|>". Read
// with llmc/json.h's cursor, entry by entry, so errors can name each entry's byte offset.
inline void load_tokenizer_json(Tokenizer* tok, const char* path, const std::vector<uint8_t>& data) {
    constexpr const char* EOT = "<|endoftext|>";
    JsonCursor c = json_cursor(data.data(), data.size());
    std::vector<std::pair<uint32_t, std::string>> entries;  // (id, token bytes)
    std::string text, bytes;
    encoder_json_check(json_expect(&c, '{'), c, path);
    bool empty = json_peek(&c) == '}';
    while (!empty) {
        size_t entry_pos = c.pos;
        encoder_json_check(json_string(&c, &text), c, path);
        gpt2_token_bytes(text, path, entry_pos, &bytes);
        encoder_json_check(json_expect(&c, ':'), c, path);
        entries.emplace_back(encoder_json_id(&c, path), bytes);
        int next = json_peek(&c);
        if (next == '}') { break; }
        encoder_json_check(next == ',' || json_error(&c, "expected ',' or '}'"), c, path);
        c.pos++;
    }
    encoder_json_check(json_expect(&c, '}'), c, path);
    encoder_json_check(json_peek(&c) == -1 || json_error(&c, "unexpected text after the object"), c, path);
    if (entries.empty()) { fail("%s: the vocabulary is empty", path); }
    std::vector<std::string> tokens(entries.size());
    std::vector<bool> seen(entries.size(), false);
    uint32_t eot = NO_TOKEN;
    for (const auto& entry : entries) {
        uint32_t id = entry.first;
        if (id >= entries.size()) { fail("%s: id %u out of range: ids must be 0..%zu", path, id, entries.size() - 1); }
        if (seen[id]) { fail("%s: id %u appears twice", path, id); }
        seen[id] = true;
        tokens[id] = entry.second;
        if (entry.second == EOT) { eot = id; }
        if (entry.second.empty()) { fail("%s: token %u is empty", path, id); }
    }
    if (eot == NO_TOKEN) { fail("%s: no \"%s\" entry", path, EOT); }
    tokenizer_build(tok, path, tokens, eot);
}

// Loads encoder.json or the classic .bin, told apart by the .bin's magic number.
inline void tokenizer_init(Tokenizer* tok, const char* path) {
    FILE* f = fopen_or_fail(path, "rb");
    int64_t size = file_size(path);
    if (size < 0) { fail("cannot stat %s", path); }
    std::vector<uint8_t> data((size_t)size);
    fread_or_fail(data.data(), 1, data.size(), f, path);
    fclose(f);
    if (data.empty()) { fail("%s: file is empty", path); }
    if (data.size() >= 4 && read_int32_le(data.data()) == TOKENIZER_BIN_MAGIC) {
        load_tokenizer_bin(tok, path, data);
        return;
    }
    size_t first = 0;
    while (first < data.size() && is_json_space(data[first])) { first++; }
    if (first == data.size() || data[first] != '{') {
        int32_t magic = data.size() >= 4 ? read_int32_le(data.data()) : 0;
        fail("%s: bad magic %d: neither a tokenizer .bin (magic %d) nor a JSON vocabulary", path, magic,
             TOKENIZER_BIN_MAGIC);
    }
    load_tokenizer_json(tok, path, data);
}

inline void tokenizer_free(Tokenizer* tok) { *tok = Tokenizer(); }

// Writes the classic .bin (version 2) atomically.
inline void tokenizer_write_bin(const Tokenizer* tok, const char* path) {
    int32_t header[TOKENIZER_BIN_HEADER_INTS] = {TOKENIZER_BIN_MAGIC, 2, (int32_t)tok->vocab_size, (int32_t)tok->eot_token};
    AtomicFile af;
    open_atomic(&af, path);
    atomic_write_or_fail(&af, header, sizeof(header), 1);
    for (uint32_t id = 0; id < tok->vocab_size; id++) {
        size_t len = token_length(tok, id);
        if (len > 255) {
            abort_atomic(&af);
            fail("%s: token %u is %zu bytes, more than a .bin can hold", path, id, len);
        }
        uint8_t len_byte = (uint8_t)len;
        atomic_write_or_fail(&af, &len_byte, 1, 1);
        atomic_write_or_fail(&af, token_data(tok, id), 1, len);
    }
    commit_atomic(&af);
}

// ----------------------------------------------------------------------------
// Printing streamed tokens

// Turns token bytes, arriving one token at a time, into valid UTF-8: an incomplete
// sequence at the end is held back until the next token completes it, and each
// maximal invalid subsequence becomes U+FFFD.
struct Utf8Printer {
    std::string held;  // the start of a sequence still waiting for its continuation bytes

    void feed(const uint8_t* bytes, size_t len, std::string* out) {
        std::string pending = held + std::string((const char*)bytes, len);
        held.clear();
        const uint8_t* s = (const uint8_t*)pending.data();
        size_t n = pending.size();
        for (size_t i = 0; i < n;) {
            Utf8Lead lead = utf8_lead(s[i]);
            size_t valid = lead.length == 0 ? 1 : utf8_valid_prefix(s + i, n - i, lead);
            if (lead.length > 0 && valid == lead.length) {
                out->append((const char*)s + i, valid);
            } else if (lead.length > 0 && i + valid == n) {
                held.assign((const char*)s + i, valid);
            } else {
                out->append("\xEF\xBF\xBD");
            }
            i += valid;
        }
    }

    // Ends the stream: a held incomplete sequence becomes U+FFFD.
    void finish(std::string* out) {
        if (!held.empty()) { out->append("\xEF\xBF\xBD"); }
        held.clear();
    }

    // Appends the printable part of token `id` to out.
    void append_token(const Tokenizer* tok, uint32_t id, std::string* out) {
        const uint8_t* bytes;
        size_t len;
        tokenizer_decode(tok, id, &bytes, &len);
        feed(bytes, len, out);
    }

    // Prints the printable part of token `id` to f and flushes it.
    void print_token(const Tokenizer* tok, uint32_t id, FILE* f) {
        std::string text;
        append_token(tok, id, &text);
        fwrite(text.data(), 1, text.size(), f);
        fflush(f);
    }

    void finish(FILE* f) {
        std::string text;
        finish(&text);
        fwrite(text.data(), 1, text.size(), f);
        fflush(f);
    }
};
