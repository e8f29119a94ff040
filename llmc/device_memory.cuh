// GPU memory that names its owner: device_malloc and device_free, the one way the trainer and its
// communicator allocate device memory, so that a failure says what could not be had and how much
// is free, and g_device_bytes (the run's total, printed at start-up) counts everything.
#pragma once

#include <cuda_runtime.h>

#include <map>

#include "llmc/utils.h"

static size_t g_device_bytes;                        // allocated through device_malloc, not yet freed
static std::map<void*, size_t> g_device_allocations;  // their sizes, for device_free

// cudaMalloc that names what it was for when the GPU is out of memory (or cannot be used at all).
static void* device_malloc(size_t bytes, const char* what) {
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fail("out of GPU memory: %s needs %.2f GiB, %.2f GiB of %.2f GiB free (try a smaller -b or -t)",
             what, bytes / 1073741824.0, free_bytes / 1073741824.0, total_bytes / 1073741824.0);
    }
    if (err != cudaSuccess) { fail("cannot allocate GPU memory for %s: %s", what, cudaGetErrorString(err)); }
    g_device_bytes += bytes;
    g_device_allocations[ptr] = bytes;
    return ptr;
}

// Frees what device_malloc allocated (nullptr: nothing).
static void device_free(void* ptr) {
    if (ptr == nullptr) { return; }
    auto allocation = g_device_allocations.find(ptr);
    if (allocation == g_device_allocations.end()) { fail("device_free: %p was not allocated by device_malloc", ptr); }
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) { fail("device_free: %s", cudaGetErrorString(err)); }
    g_device_bytes -= allocation->second;
    g_device_allocations.erase(allocation);
}
