// The input file of the libFuzzer targets whose parsers read a path: one memory-backed file
// (memfd_create), made once per process, rewritten with each input and opened by the parsers
// as /proc/self/fd/N.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

// The path of a file that now holds exactly these bytes.
static inline const char* fuzz_input_path(const uint8_t* data, size_t size) {
    static int fd = -1;
    static std::string path;
    if (fd < 0) {
        fd = memfd_create("fuzz_input", 0);
        if (fd < 0) { perror("memfd_create"); abort(); }
        path = "/proc/self/fd/" + std::to_string(fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) { perror(path.c_str()); abort(); }
    return path.c_str();
}
