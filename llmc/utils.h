// Small host helpers shared by the trainer, the tests and the data tools:
// one-line fatal errors, checked file I/O, and atomic file writes
// (temporary file + fsync + rename, so a crash never leaves a half-written file).
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Prints "error: <message>" on one line to stderr and exits with status 1.
[[noreturn]] static inline void fail(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(1);
}

static inline FILE* fopen_or_fail(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f == NULL) { fail("cannot open %s: %s", path, strerror(errno)); }
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
    if (p == NULL && bytes > 0) { fail("out of host memory allocating %zu bytes", bytes); }
    return p;
}

// Size of a file in bytes, or -1 if it cannot be stat'ed.
static inline int64_t file_size(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) { return -1; }
    return (int64_t)st.st_size;
}

static inline bool file_exists(const char* path) { return access(path, F_OK) == 0; }

// Atomic writes: open_atomic() returns a FILE* on "<path>.tmp.<pid>"; commit_atomic()
// flushes, fsyncs and renames it over `path`. A crash in between leaves `path` untouched.
typedef struct {
    FILE* file;
    char path[4096];
    char tmp_path[4096 + 32];
} AtomicFile;

static inline void open_atomic(AtomicFile* af, const char* path) {
    if (strlen(path) >= sizeof(af->path)) { fail("path too long: %s", path); }
    strcpy(af->path, path);
    snprintf(af->tmp_path, sizeof(af->tmp_path), "%s.tmp.%d", path, (int)getpid());
    af->file = fopen_or_fail(af->tmp_path, "wb");
}

static inline void commit_atomic(AtomicFile* af) {
    if (fflush(af->file) != 0 || fsync(fileno(af->file)) != 0) {
        fail("%s: write failed: %s", af->tmp_path, strerror(errno));
    }
    if (fclose(af->file) != 0) { fail("%s: close failed: %s", af->tmp_path, strerror(errno)); }
    if (rename(af->tmp_path, af->path) != 0) {
        fail("cannot rename %s to %s: %s", af->tmp_path, af->path, strerror(errno));
    }
}

// Drops an unfinished atomic write (on an error path that does not exit).
static inline void abort_atomic(AtomicFile* af) {
    fclose(af->file);
    remove(af->tmp_path);
}
