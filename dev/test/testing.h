// A minimal unit-test runner: TEST(name) { ... CHECK(cond); ... } and main() from
// TEST_MAIN(). Prints one line per failed check and closes with "N passed, N failed".
// Tests that must see a process exit (fatal input errors) use expect_exit_failure(), or
// run_in_child() for its status and stderr (fork_captured() for a child to wait on yourself); file_refused_with() feeds a reader a file of given bytes.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <type_traits>

#include "dev/test/files.h"

using TestFn = void (*)(void);
struct TestCase { const char* name; TestFn fn; };

static TestCase g_tests[512];
static int g_num_tests = 0;
static int g_current_failures = 0;

struct TestRegistrar {
    TestRegistrar(const char* name, TestFn fn) { g_tests[g_num_tests++] = TestCase{name, fn}; }
};

#define TEST(name)                                                 \
    static void test_##name(void);                                 \
    static TestRegistrar registrar_##name(#name, test_##name);     \
    static void test_##name(void)

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            g_current_failures++;                                                     \
        }                                                                             \
    } while (0)

// A forked child whose stderr comes to the parent through a pipe.
struct CapturedChild {
    pid_t pid;
    int stderr_fd;  // the pipe's read end: read_to_end() it
};

// Forks a child that runs fn() with its stderr into a pipe and exits with what fn returns (0 if
// it returns nothing).
template <typename F>
static CapturedChild fork_captured(F fn) {
    int fds[2];
    if (pipe(fds) != 0) { fail("pipe: %s", strerror(errno)); }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        if constexpr (std::is_void<decltype(fn())>::value) {
            fn();
            _exit(0);
        } else {
            _exit(fn());
        }
    }
    close(fds[1]);
    return CapturedChild{pid, fds[0]};
}

// What is left to read from fd, until every writer has closed it; closes it.
static inline std::string read_to_end(int fd) {
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) { text.append(buf, (size_t)n); }
    close(fd);
    return text;
}

// Runs fn() in a child process with its stderr captured into err (err_size bytes, NUL-terminated);
// returns the child's wait status. The child exits 0 if fn returns.
template <typename F>
static int run_in_child(F fn, char* err, size_t err_size) {
    CapturedChild child = fork_captured([&] { fn(); });
    std::string text = read_to_end(child.stderr_fd);
    snprintf(err, err_size, "%s", text.c_str());
    int status = 0;
    waitpid(child.pid, &status, 0);
    return status;
}

// What fn() prints to stderr in a child process, CHECKing that the child exits 0.
template <typename F>
static std::string stderr_of_success(F fn) {
    char err[8192];
    int status = run_in_child(fn, err, sizeof(err));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return err;
}

// Runs fn() in a child process; true if the child exited non-zero and its stderr contains
// `expected` (a fragment of the one-line error).
template <typename F>
static bool expect_exit_failure(F fn, const char* expected) {
    char err[4096];
    int status = run_in_child(fn, err, sizeof(err));
    bool failed = WIFEXITED(status) && WEXITSTATUS(status) != 0;
    bool matched = strstr(err, expected) != nullptr;
    if (!failed || !matched) {
        fprintf(stderr, "  expected a failing exit with \"%s\", got status %d and stderr: %s\n",
                expected, status, err);
    }
    return failed && matched;
}

#define TEST_MAIN()                                                           \
    int main(int argc, char** argv) {                                         \
        const char* filter = argc > 1 ? argv[1] : nullptr;                       \
        int passed = 0, failed = 0;                                           \
        for (int i = 0; i < g_num_tests; i++) {                               \
            if (filter && strstr(g_tests[i].name, filter) == nullptr) continue;  \
            g_current_failures = 0;                                           \
            g_tests[i].fn();                                                  \
            if (g_current_failures == 0) { passed++; }                        \
            else { failed++; printf("FAILED %s\n", g_tests[i].name); }        \
        }                                                                     \
        printf("%d passed, %d failed\n", passed, failed);                     \
        return failed == 0 ? 0 : 1;                                           \
    }

// Writes `bytes` to a file in a new temporary directory and checks that read(path) exits non-zero
// with the one-line error "<path>: <problem>".
template <typename ReadFn>
static bool file_refused_with(const std::string& bytes, const std::string& problem, ReadFn read) {
    std::string dir = make_temp_dir("test_file");
    std::string path = dir + "/input";
    write_file(path, bytes);
    bool ok = expect_exit_failure([&] { read(path.c_str()); }, (path + ": " + problem).c_str());
    remove_dir(dir);
    return ok;
}
