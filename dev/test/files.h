// Whole-file reads and writes for the tests and benchmarks.
#pragma once

#include <stdio.h>

#include <string>

#include "llmc/utils.h"

// The file's bytes, or "" if it cannot be opened (a test's comparison then fails visibly).
static inline std::string read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == NULL) { return ""; }
    std::string bytes;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) { bytes.append(buf, n); }
    fclose(f);
    return bytes;
}

static inline void write_file(const std::string& path, const std::string& bytes) {
    FILE* f = fopen_or_fail(path.c_str(), "wb");
    fwrite_or_fail(bytes.data(), 1, bytes.size(), f, path.c_str());
    fclose(f);
}
