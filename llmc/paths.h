// Finding the files that ship with the repository (the GPT-2 vocabulary, tiny Shakespeare)
// without depending on the current directory. find_bundled_file() takes a flag's value if
// one was given, else looks for the repository-relative path under, in order: the current
// directory; the running executable's directory, its parent and grandparent (the binaries
// live in the repository root, build/ and dev/...); and the repository path compiled in as
// GPT2FP32_SOURCE_DIR (the Makefile passes -DGPT2FP32_SOURCE_DIR="$(CURDIR)").
#pragma once

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "llmc/utils.h"

// The directory holding the running executable (from /proc/self/exe), or "" if unknown.
static inline std::string executable_dir(void) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) { return ""; }
    std::string path(buf, (size_t)n);
    size_t slash = path.rfind('/');
    if (slash == std::string::npos) { return ""; }
    return slash == 0 ? "/" : path.substr(0, slash);
}

static inline std::string join_path(const std::string& dir, const std::string& relative) {
    if (relative.empty() || relative[0] == '/') { return relative; }
    return dir.empty() || dir.back() == '/' ? dir + relative : dir + "/" + relative;
}

// The directories find_bundled_file() searches, in order, each once.
static inline std::vector<std::string> bundled_file_dirs(void) {
    std::vector<std::string> dirs;
    auto add = [&](const std::string& dir) {
        if (!dir.empty() && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) { dirs.push_back(dir); }
    };
    char cwd[PATH_MAX];
    add(getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : ".");
    std::string exe = executable_dir();
    for (int up = 0; up <= 2 && !exe.empty(); up++, exe = parent_dir(exe)) { add(exe); }
#ifdef GPT2FP32_SOURCE_DIR
    add(GPT2FP32_SOURCE_DIR);
#endif
    return dirs;
}

// True if `path` exists and is not a directory.
static inline bool bundled_file_usable(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

// The path to open for the bundled file `relative` (e.g. "dev/data/gpt2_encoder.json").
// `explicit_path` is the value of the command-line flag `flag` (e.g. "--vocab") that names
// the file, or nullptr when the flag was not given; when given it is returned as is and must
// exist. Otherwise returns `relative` if it exists from the current directory, else the
// first existing absolute path among the other places, else fails with one line naming every
// place looked (and the flag, if there is one: `flag` may be nullptr).
static inline std::string find_bundled_file(const char* relative, const char* explicit_path, const char* flag) {
    if (explicit_path != nullptr) {
        std::string named = flag != nullptr ? std::string(flag) + " " + explicit_path : std::string(explicit_path);
        struct stat st;
        if (stat(explicit_path, &st) != 0) { fail("%s: %s", named.c_str(), strerror(errno)); }
        if (S_ISDIR(st.st_mode)) { fail("%s: is a directory", named.c_str()); }
        return explicit_path;
    }
    std::vector<std::string> dirs = bundled_file_dirs();
    std::string looked;
    for (size_t i = 0; i < dirs.size(); i++) {
        std::string candidate = join_path(dirs[i], relative);
        if (bundled_file_usable(candidate.c_str())) { return i == 0 ? std::string(relative) : candidate; }
        looked += (i == 0 ? "" : ", ") + candidate;
    }
    if (flag != nullptr) { fail("cannot find %s: looked in %s; pass %s PATH", relative, looked.c_str(), flag); }
    fail("cannot find %s: looked in %s", relative, looked.c_str());
}
