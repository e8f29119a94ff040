// A minimal unit-test runner: TEST(name) { ... CHECK(cond); ... } and main() from
// TEST_MAIN(). Prints one line per failed check and closes with "N passed, N failed".
// Tests that must see a process exit (fatal input errors) use expect_exit_failure(), or
// run_in_child() for its status and stderr; file_refused_with() feeds a reader a file of given bytes.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "dev/test/files.h"

typedef void (*TestFn)(void);
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

// Runs fn() in a child process with its stderr captured into err (err_size bytes, NUL-terminated);
// returns the child's wait status. The child exits 0 if fn returns.
template <typename F>
static int run_in_child(F fn, char* err, size_t err_size) {
    int pipefd[2];
    err[0] = '\0';
    if (pipe(pipefd) != 0) { return -1; }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], STDERR_FILENO);
        fn();
        _exit(0);
    }
    close(pipefd[1]);
    size_t len = 0;
    ssize_t n;
    while ((n = read(pipefd[0], err + len, err_size - 1 - len)) > 0) { len += (size_t)n; }
    err[len] = '\0';
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

// Runs fn() in a child process; true if the child exited non-zero and its stderr contains
// `expected` (a fragment of the one-line error).
template <typename F>
static bool expect_exit_failure(F fn, const char* expected) {
    char err[4096];
    int status = run_in_child(fn, err, sizeof(err));
    bool failed = WIFEXITED(status) && WEXITSTATUS(status) != 0;
    bool matched = strstr(err, expected) != NULL;
    if (!failed || !matched) {
        fprintf(stderr, "  expected a failing exit with \"%s\", got status %d and stderr: %s\n",
                expected, status, err);
    }
    return failed && matched;
}

#define TEST_MAIN()                                                           \
    int main(int argc, char** argv) {                                         \
        const char* filter = argc > 1 ? argv[1] : NULL;                       \
        int passed = 0, failed = 0;                                           \
        for (int i = 0; i < g_num_tests; i++) {                               \
            if (filter && strstr(g_tests[i].name, filter) == NULL) continue;  \
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
