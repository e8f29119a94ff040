// The model-FLOPs-utilisation estimate's denominator: the dense TF32 tensor-core peak of known GPUs
// (vendor datasheets, TFLOP/s), looked up by the device's name; --peak-tflops overrides it.
#pragma once

#include <string.h>

struct GpuPeak {
    const char* name;  // a part of the device name; the first match wins, so "H100 PCIe" precedes
                       // "H100" and "GH200" precedes "H200"
    float tf32_tflops;
};

inline constexpr GpuPeak TF32_PEAKS[] = {
    {"H100 PCIe", 378.0f}, {"H100", 494.7f}, {"GH200", 494.7f}, {"H200", 494.7f},
    {"A100", 156.0f},      {"L40S", 183.0f}, {"RTX 4090", 82.6f}, {"A10", 62.5f},
};

// The entry of the device named device_name, or nullptr when unknown.
static inline const GpuPeak* gpu_peak_entry(const char* device_name) {
    for (const GpuPeak& gpu : TF32_PEAKS) {
        if (strstr(device_name, gpu.name) != nullptr) { return &gpu; }
    }
    return nullptr;
}

// The TF32 peak of the device named device_name, or 0 when unknown (no MFU then).
static inline float tf32_peak_tflops(const char* device_name) {
    const GpuPeak* gpu = gpu_peak_entry(device_name);
    return gpu != nullptr ? gpu->tf32_tflops : 0.0f;
}
