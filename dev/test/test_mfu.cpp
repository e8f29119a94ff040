// CPU tests of llmc/mfu.h: the TF32 peak of each known GPU by its device name as CUDA reports it,
// the more specific name winning (H100 PCIe before H100, GH200 before H200, A100 before A10), 0 for
// unknown GPUs.
#include "dev/test/testing.h"
#include "llmc/mfu.h"

TEST(known_devices) {
    CHECK(tf32_peak_tflops("NVIDIA H100 80GB HBM3") == 494.7f);
    CHECK(tf32_peak_tflops("NVIDIA H100 PCIe") == 378.0f);
    CHECK(tf32_peak_tflops("NVIDIA H200") == 494.7f);
    CHECK(tf32_peak_tflops("NVIDIA GH200 480GB") == 494.7f);
    CHECK(tf32_peak_tflops("NVIDIA A100-SXM4-80GB") == 156.0f);
    CHECK(tf32_peak_tflops("NVIDIA L40S") == 183.0f);
    CHECK(tf32_peak_tflops("NVIDIA GeForce RTX 4090") == 82.6f);
    CHECK(tf32_peak_tflops("NVIDIA A10") == 62.5f);
}

TEST(unknown_devices_have_no_peak) {
    CHECK(tf32_peak_tflops("NVIDIA GeForce RTX 3090") == 0.0f);
    CHECK(tf32_peak_tflops("") == 0.0f);
}

// Each entry is found by its own name: none is hidden by an earlier, shorter one (the entry itself,
// not one with an equal peak: GH200's was hidden behind H200's for a while).
TEST(every_entry_reachable) {
    for (const GpuPeak& gpu : TF32_PEAKS) { CHECK(gpu_peak_entry(gpu.name) == &gpu); }
    CHECK(strcmp(gpu_peak_entry("NVIDIA GH200 480GB")->name, "GH200") == 0);
}

TEST_MAIN()
