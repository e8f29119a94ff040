// Whole-file reads and writes and temporary directories for the tests and benchmarks.
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include <filesystem>
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

// A new empty directory under /tmp named after `prefix`, as getcwd() spells it.
static inline std::string make_temp_dir(const char* prefix = "test") {
    std::string pattern = std::string("/tmp/") + prefix + "_XXXXXX";
    if (mkdtemp(&pattern[0]) == NULL) { fail("mkdtemp: %s", strerror(errno)); }
    return std::filesystem::canonical(pattern).string();
}

static inline void remove_dir(const std::string& dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}
