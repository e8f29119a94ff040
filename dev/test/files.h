// Whole-file reads and writes and temporary directories for the tests and benchmarks.
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "llmc/utils.h"

// The file's bytes, or "" if it cannot be opened (a test's comparison then fails visibly).
static inline std::string read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) { return ""; }
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
    if (mkdtemp(&pattern[0]) == nullptr) { fail("mkdtemp: %s", strerror(errno)); }
    return std::filesystem::canonical(pattern).string();
}

static inline void remove_dir(const std::string& dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

// Whether dev/test/fuzz/TARGET/ holds these (name, bytes) seeds; with UPDATE_SEEDS=1 in the
// environment, writes them first (the tests that make a fuzz target's seeds regenerate them so).
static inline bool fuzz_seeds_committed(const std::string& target,
                                        const std::vector<std::pair<std::string, std::string>>& seeds) {
    bool all_same = true;
    for (const auto& [name, bytes] : seeds) {
        std::string path = "dev/test/fuzz/" + target + "/" + name;
        if (getenv("UPDATE_SEEDS") != nullptr) { write_file(path, bytes); }
        all_same = all_same && read_file(path) == bytes;
    }
    return all_same;
}
