// Small host helpers shared by the trainer, the tests and the data tools:
// one-line fatal errors, checked file I/O, atomic file writes (temporary file + fsync +
// rename + fsync of the directory, so a crash never leaves a half-written file) and the removal
// of the temporary files that killed writers on this host left behind.
#pragma once

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <stdexcept>

// Compiled with -DFAIL_THROWS (the fuzz targets), fail() throws this instead of exiting, so that
// a rejected input is an ordinary outcome rather than the end of the process; so it does in a
// thread that sets g_fail_throws (the background checkpoint writer, whose caller decides).
struct FailError : std::runtime_error {
    explicit FailError(const std::string& message) : std::runtime_error(message) {}
};
inline thread_local bool g_fail_throws = false;

// printf's formatting into a std::string.
static inline std::string format_args(const char* fmt, va_list args) {
    va_list again;
    va_copy(again, args);
    std::string text((size_t)vsnprintf(nullptr, 0, fmt, args), '\0');
    vsnprintf(&text[0], text.size() + 1, fmt, again);
    va_end(again);
    return text;
}

// What fail() does besides printing. Quiet, it prints nothing: a data-parallel rank other than 0
// checking what every rank finds alike (flags, data), which rank 0 reports. The hook runs before
// the exit: a rank with peers tells them that it failed and said why (llmc/launch.h).
static bool g_fail_quiet = false;
static void (*g_fail_hook)(void) = nullptr;

// Prints "error: <message>" on one line to stderr, in one write so that the lines of processes
// sharing the terminal do not interleave, and exits with status 1 (with FAIL_THROWS, or in a
// thread that set g_fail_throws: throws FailError(<message>) and prints nothing).
[[noreturn]] static inline void fail(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::string message = format_args(fmt, args);
    va_end(args);
#ifdef FAIL_THROWS
    throw FailError(message);
#else
    if (g_fail_throws) { throw FailError(message); }
    std::string line = "error: " + message + "\n";
    if (!g_fail_quiet && write(STDERR_FILENO, line.data(), line.size()) < 0) {}
    if (g_fail_hook != nullptr) { g_fail_hook(); }
    exit(1);
#endif
}

// Sets *problem to the formatted one-line message and returns false: how the readers whose
// caller decides what a defect means (a resume falls back to an older checkpoint) report one.
__attribute__((format(printf, 2, 3))) static inline bool set_problem(std::string* problem, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    *problem = format_args(fmt, args);
    va_end(args);
    return false;
}

// The index of the first non-finite value among n, or n.
static inline size_t first_nonfinite(const float* values, size_t n) {
    size_t i = 0;
    while (i < n && isfinite(values[i])) { i++; }
    return i;
}

static inline FILE* fopen_or_fail(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f == nullptr) { fail("cannot open %s: %s", path, strerror(errno)); }
    return f;
}

// Reads exactly `count` items or fails naming the file.
static inline void fread_or_fail(void* dst, size_t size, size_t count, FILE* f, const char* path) {
    if (count == 0) { return; }
    size_t got = fread(dst, size, count, f);
    if (got != count) {
        fail("%s: %s (wanted %zu items of %zu bytes, got %zu)", path,
             ferror(f) ? strerror(errno) : "file is truncated", count, size, got);
    }
}

static inline void fwrite_or_fail(const void* src, size_t size, size_t count, FILE* f, const char* path) {
    if (count == 0) { return; }
    if (fwrite(src, size, count, f) != count) { fail("%s: write failed: %s", path, strerror(errno)); }
}

static inline void* malloc_or_fail(size_t bytes) {
    void* p = malloc(bytes);
    if (p == nullptr && bytes > 0) { fail("out of host memory allocating %zu bytes", bytes); }
    return p;
}

// Size of a file in bytes, or -1 if it cannot be stat'ed.
static inline int64_t file_size(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) { return -1; }
    return (int64_t)st.st_size;
}

static inline bool file_exists(const char* path) { return access(path, F_OK) == 0; }

// An integer environment variable in [lo, hi], or `unset` when it is not set; anything else fails
// with one line naming the variable and the range.
static inline int env_int(const char* name, int lo, int hi, int unset) {
    const char* text = getenv(name);
    if (text == nullptr) { return unset; }
    char* end = nullptr;
    long n = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || n < lo || n > hi) { fail("%s=%s: must be an integer in [%d, %d]", name, text, lo, hi); }
    return (int)n;
}

// Atomic writes: open_atomic() returns a FILE* on "<path>.tmp.<host>.<pid>", atomic_write_or_fail()
// writes to it, commit_atomic() flushes, fsyncs and renames it over `path`, then fsyncs the
// directory so that the rename survives a power loss. A crash in between leaves `path` untouched;
// a failed write, flush, fsync, close or rename (a full disk) removes the temporary file and fails
// naming `path`.
struct AtomicFile {
    FILE* file;
    std::string path, tmp_path;  // the final name, and the name it is written under until the rename
};

// A PID means something only on its host: temporary-file names carry the host too, so that
// nodes sharing a run directory tell their files apart. At most this many characters of it.
constexpr size_t ATOMIC_HOST_MAX = 64;

// A host name as temporary-file names spell it: each character other than [A-Za-z0-9-] made
// '-' (a '.' would make the name ambiguous), cut to ATOMIC_HOST_MAX characters.
static inline void atomic_host_spelling(const char* host, char out[ATOMIC_HOST_MAX + 1]) {
    size_t n = strnlen(host, ATOMIC_HOST_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = host[i];
        bool kept = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
        out[i] = kept ? c : '-';
    }
    out[n] = '\0';
}

// This host's name as gethostname gives it, "unknown-host" if it has none (TensorBoard's file names).
static inline std::string host_name() {
    char host[256] = "";
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') { return "unknown-host"; }
    return host;
}

// This host's name, spelled as above.
static inline void atomic_host_name(char out[ATOMIC_HOST_MAX + 1]) { atomic_host_spelling(host_name().c_str(), out); }

static inline void open_atomic(AtomicFile* af, const char* path) {
    char host[ATOMIC_HOST_MAX + 1];
    atomic_host_name(host);
    af->path = path;
    af->tmp_path = af->path + ".tmp." + host + "." + std::to_string((int)getpid());
    af->file = fopen_or_fail(af->tmp_path.c_str(), "wb");
}

// Drops an unfinished atomic write (on an error path that does not exit).
static inline void abort_atomic(AtomicFile* af) {
    if (af->file != nullptr) { fclose(af->file); }
    af->file = nullptr;
    remove(af->tmp_path.c_str());
}

// Drops the write and fails with the reason (an errno value), naming the final path.
[[noreturn]] static inline void fail_atomic(AtomicFile* af, int error) {
    abort_atomic(af);
    fail("writing %s: %s (the previous files are kept)", af->path.c_str(), strerror(error));
}

static inline void atomic_write_or_fail(AtomicFile* af, const void* src, size_t size, size_t count) {
    if (count == 0) { return; }
    if (fwrite(src, size, count, af->file) != count) { fail_atomic(af, errno); }
}

// "/a/b" -> "/a", "/a" -> "/", "/" -> "/", "a" -> ".".
static inline std::string parent_dir(const std::string& dir) {
    size_t last = dir.find_last_not_of('/');  // trailing slashes do not count
    if (last == std::string::npos) { return "/"; }
    size_t slash = dir.rfind('/', last);
    if (slash == std::string::npos) { return "."; }
    return slash == 0 ? "/" : dir.substr(0, slash);
}

// Makes the renames done in `dir` durable (they are changes to the directory, not to the file).
static inline void fsync_dir_or_fail(const char* dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) {
        int error = errno;
        if (fd >= 0) { close(fd); }
        fail("cannot sync the directory %s: %s", dir, strerror(error));
    }
    close(fd);
}

static inline void commit_atomic(AtomicFile* af) {
    if (fflush(af->file) != 0 || fsync(fileno(af->file)) != 0) { fail_atomic(af, errno); }
    int closed = fclose(af->file);
    af->file = nullptr;  // closed even when fclose reports an error
    if (closed != 0) { fail_atomic(af, errno); }
    if (rename(af->tmp_path.c_str(), af->path.c_str()) != 0) { fail_atomic(af, errno); }
    fsync_dir_or_fail(parent_dir(af->path).c_str());
}

static inline bool ends_with(const char* text, size_t length, const char* suffix) {
    size_t n = strlen(suffix);
    return length >= n && memcmp(text + length - n, suffix, n) == 0;
}

// The writer's PID in the name of a temporary file of `host` (spelled as atomic_host_name does):
// "<anything>.tmp.<host>.<pid>" as open_atomic makes them, or "<anything>.tmp.<pid>" as older
// versions did (taken as this host's). 0 for another host's file, any other name, a leading zero
// or a number no PID can be.
static inline pid_t atomic_temp_pid(const char* name, const char* host) {
    size_t end = strlen(name), start = end;
    while (start > 0 && name[start - 1] >= '0' && name[start - 1] <= '9') { start--; }
    if (start == end || end - start > 9 || name[start] == '0') { return 0; }
    char host_suffix[ATOMIC_HOST_MAX + 8];
    snprintf(host_suffix, sizeof(host_suffix), ".tmp.%s.", host);
    if (!ends_with(name, start, host_suffix) && !ends_with(name, start, ".tmp.")) { return 0; }
    return (pid_t)atol(name + start);
}

// Whether the temporary files of `pid` are stale: it has exited, or it is this process (which
// calls remove_stale_temp_files only with no atomic write open).
static inline bool atomic_writer_is_gone(pid_t pid) {
    return pid == getpid() || (kill(pid, 0) != 0 && errno == ESRCH);
}

// Deletes the regular files in `dir` that are this host's temporary files (atomic_temp_pid) and
// whose writer is gone (see above), and returns how many; a missing `dir` has none. Other hosts'
// files are left alone: their PIDs cannot be judged here.
static inline int remove_stale_temp_files(const char* dir) {
    DIR* listing = opendir(dir);
    if (listing == nullptr) {
        if (errno == ENOENT) { return 0; }
        fail("cannot list %s: %s", dir, strerror(errno));
    }
    char host[ATOMIC_HOST_MAX + 1];
    atomic_host_name(host);
    int removed = 0;
    for (struct dirent* entry; (entry = readdir(listing)) != nullptr;) {
        pid_t pid = atomic_temp_pid(entry->d_name, host);
        if (pid == 0 || !atomic_writer_is_gone(pid)) { continue; }
        std::string path = std::string(dir) + "/" + entry->d_name;
        struct stat st;
        if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) { continue; }
        if (unlink(path.c_str()) == 0) {
            removed++;
        } else if (errno != ENOENT) {
            int error = errno;
            closedir(listing);
            fail("cannot remove the stale temporary file %s: %s", path.c_str(), strerror(error));
        }
    }
    closedir(listing);
    return removed;
}
