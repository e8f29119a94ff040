// SHA-256 (FIPS 180-4) of a byte buffer or a file, as a lowercase hex string. For tests.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <string>

struct Sha256 {
    uint32_t state[8];
    uint8_t block[64];   // bytes of the block being filled
    size_t block_used;
    uint64_t total_bytes;
};

static inline uint32_t sha256_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// Round constants: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline void sha256_init(Sha256* h) {
    // The first 32 bits of the fractional parts of the square roots of the first 8 primes.
    static constexpr uint32_t SHA256_H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(h->state, SHA256_H0, sizeof(SHA256_H0));
    h->block_used = 0;
    h->total_bytes = 0;
}

// Mixes one 64-byte block into the state.
static inline void sha256_compress(Sha256* h, const uint8_t* block) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) {
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 | (uint32_t)block[4 * i + 2] << 8 |
               (uint32_t)block[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = sha256_rotr(w[i - 15], 7) ^ sha256_rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = sha256_rotr(w[i - 2], 17) ^ sha256_rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h->state[0], b = h->state[1], c = h->state[2], d = h->state[3];
    uint32_t e = h->state[4], f = h->state[5], g = h->state[6], k = h->state[7];
    for (int i = 0; i < 64; i++) {
        uint32_t sum1 = sha256_rotr(e, 6) ^ sha256_rotr(e, 11) ^ sha256_rotr(e, 25);
        uint32_t choose = (e & f) ^ (~e & g);
        uint32_t t1 = k + sum1 + choose + SHA256_K[i] + w[i];
        uint32_t sum0 = sha256_rotr(a, 2) ^ sha256_rotr(a, 13) ^ sha256_rotr(a, 22);
        uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = sum0 + majority;
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h->state[0] += a; h->state[1] += b; h->state[2] += c; h->state[3] += d;
    h->state[4] += e; h->state[5] += f; h->state[6] += g; h->state[7] += k;
}

static inline void sha256_update(Sha256* h, const void* data, size_t len) {
    const uint8_t* bytes = (const uint8_t*)data;
    h->total_bytes += len;
    while (len > 0) {
        size_t n = 64 - h->block_used < len ? 64 - h->block_used : len;
        memcpy(h->block + h->block_used, bytes, n);
        h->block_used += n;
        bytes += n;
        len -= n;
        if (h->block_used == 64) {
            sha256_compress(h, h->block);
            h->block_used = 0;
        }
    }
}

// Pads (0x80, zeros, the bit length big-endian) and returns the digest in hex.
static inline std::string sha256_finish(Sha256* h) {
    uint64_t bit_length = h->total_bytes * 8;
    uint8_t padding[72] = {0x80};
    size_t pad_len = (h->block_used < 56 ? 56 : 120) - h->block_used;
    sha256_update(h, padding, pad_len);
    uint8_t length_bytes[8];
    for (int i = 0; i < 8; i++) { length_bytes[i] = (uint8_t)(bit_length >> (56 - 8 * i)); }
    sha256_update(h, length_bytes, 8);
    char hex[65];
    for (int i = 0; i < 8; i++) { snprintf(hex + 8 * i, 9, "%08x", h->state[i]); }
    return std::string(hex, 64);
}

static inline std::string sha256_hex(const void* data, size_t len) {
    Sha256 h;
    sha256_init(&h);
    sha256_update(&h, data, len);
    return sha256_finish(&h);
}

// Digest of a file's bytes, or "" if it cannot be read.
static inline std::string sha256_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (f == nullptr) { return ""; }
    Sha256 h;
    sha256_init(&h);
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) { sha256_update(&h, buf, n); }
    bool failed = ferror(f) != 0;
    fclose(f);
    return failed ? "" : sha256_finish(&h);
}
