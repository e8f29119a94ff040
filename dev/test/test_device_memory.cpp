// CPU tests of llmc/device_memory.cuh (built with nvcc, which links the CUDA runtime): device_free of
// nullptr does nothing, of a pointer it never gave out is one line and a failing exit; device_malloc
// on a machine without a usable GPU says so, naming what it was for. Where a GPU is present, the
// bytes are counted and given back, and a request beyond the card is "out of GPU memory" naming it.
// Every CUDA call happens in a child process: a child forked after its parent used CUDA cannot.
#include "dev/test/testing.h"
#include "llmc/device_memory.cuh"

static bool have_gpu() {
    char err[256];
    int status = run_in_child([] {
        int count = 0;
        exit(cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 1);
    }, err, sizeof(err));
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(free_of_nullptr_does_nothing) {
    device_free(nullptr);
    CHECK(g_device_bytes == 0);
}

TEST(free_of_a_foreign_pointer_is_refused) {
    static int not_device_memory;
    CHECK(expect_exit_failure([] { device_free(&not_device_memory); }, "was not allocated by device_malloc"));
}

TEST(allocation_without_a_gpu_names_its_purpose) {
    if (have_gpu()) { return; }
    CHECK(expect_exit_failure([] { device_malloc(1 << 20, "the probe buffer"); },
                              "cannot allocate GPU memory for the probe buffer:"));
}

TEST(allocations_are_counted_and_given_back) {
    if (!have_gpu()) { return; }
    std::string err = stderr_of_success([] {
        void* a = device_malloc(1 << 20, "a");
        void* b = device_malloc(3 << 20, "b");
        bool counted = g_device_bytes == (4u << 20);
        device_free(a);
        bool one_back = g_device_bytes == (3u << 20);
        device_free(b);
        bool all_back = g_device_bytes == 0 && g_device_allocations.empty();
        if (!counted || !one_back || !all_back) {
            fprintf(stderr, "counted %d, one back %d, all back %d\n", counted, one_back, all_back);
            exit(1);
        }
    });
    CHECK(err.empty());
}

TEST(allocation_beyond_the_card_is_out_of_memory) {
    if (!have_gpu()) { return; }
    CHECK(expect_exit_failure([] { device_malloc((size_t)1 << 50, "a petabyte"); },
                              "out of GPU memory: a petabyte needs"));
}

TEST_MAIN()
