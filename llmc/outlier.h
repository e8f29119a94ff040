// A gradient-norm spike detector: OutlierWindow holds the last W values (W <= OUTLIER_CAPACITY)
// in a fixed-size ring, and outlier_zscore() says how many population standard deviations a new
// value lies from their mean. The window is plain old data of a fixed size, so a checkpoint can
// store it with memcpy and a restored run computes the same numbers bit for bit: the sums run in
// one order (oldest to newest, in double) whatever the ring's position.
//
// Typical use, once per step: z = outlier_zscore(&w, norm); treat z > threshold as a spike; then
// outlier_push(&w, norm). The caller skips non-finite norms (the NaN guard's business): they are
// never pushed, and outlier_push ignores one that arrives anyway, so the window stays finite.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "llmc/utils.h"

// The trainer decides on the GPU (grad_norm_finish_kernel), so that no step waits for the host.
#ifdef __CUDACC__
#define OUTLIER_HOST_DEVICE __host__ __device__
#else
#define OUTLIER_HOST_DEVICE
#endif

constexpr int32_t OUTLIER_CAPACITY = 64;

// Below this spread relative to the mean, the window's values are equal up to rounding: no z.
constexpr double OUTLIER_MIN_RELATIVE_STD = 1e-12;

struct OutlierWindow {
    double values[OUTLIER_CAPACITY];  // a ring: the newest value sits just before `next`
    int32_t window;                   // W: how many values make the statistics
    int32_t count;                    // values held so far, at most W
    int32_t next;                     // where the next value goes, in [0, W)
    int32_t reserved;                 // zero: keeps the size free of padding
};
static_assert(sizeof(OutlierWindow) == OUTLIER_CAPACITY * sizeof(double) + 16, "OutlierWindow is saved in checkpoints");
static_assert(std::is_trivially_copyable<OutlierWindow>::value, "OutlierWindow is saved and restored with memcpy");

// An empty window of W values (2 <= W <= OUTLIER_CAPACITY).
static inline void outlier_init(OutlierWindow* w, int window) {
    if (window < 2 || window > OUTLIER_CAPACITY) { fail("outlier window %d is outside [2, %d]", window, OUTLIER_CAPACITY); }
    memset(w, 0, sizeof(*w));
    w->window = window;
}

// Whether a window read back from a file is one that outlier_init and outlier_push can make
// (check it before use: a bad position would index outside the ring).
static inline bool outlier_valid(const OutlierWindow* w) {
    if (w->window < 2 || w->window > OUTLIER_CAPACITY || w->reserved != 0) { return false; }
    if (w->count < 0 || w->count > w->window || w->next < 0 || w->next >= w->window) { return false; }
    if (w->count < w->window && w->next != w->count) { return false; }  // a filling ring starts at 0
    for (int32_t i = 0; i < w->count; i++) {
        if (!isfinite(w->values[i])) { return false; }
    }
    return true;
}

// Adds a finite value, dropping the oldest once W are held; a non-finite one is ignored.
OUTLIER_HOST_DEVICE static inline void outlier_push(OutlierWindow* w, double value) {
    if (!isfinite(value)) { return; }
    w->values[w->next] = value;
    w->next = (w->next + 1) % w->window;
    if (w->count < w->window) { w->count++; }
}

// The i-th value held, oldest first.
OUTLIER_HOST_DEVICE static inline double outlier_at(const OutlierWindow* w, int32_t i) {
    return w->values[(w->next - w->count + i + w->window) % w->window];
}

// How many population standard deviations `value` lies above (+) or below (-) the window's mean;
// 0 until the window holds W values, and 0 if they are all equal (up to rounding).
OUTLIER_HOST_DEVICE static inline double outlier_zscore(const OutlierWindow* w, double value) {
    if (w->count < w->window) { return 0.0; }
    double sum = 0.0;
    for (int32_t i = 0; i < w->count; i++) { sum += outlier_at(w, i); }
    double mean = sum / w->count;
    double squares = 0.0;
    for (int32_t i = 0; i < w->count; i++) {
        double deviation = outlier_at(w, i) - mean;
        squares += deviation * deviation;
    }
    double stddev = sqrt(squares / w->count);
    if (!(stddev > OUTLIER_MIN_RELATIVE_STD * fabs(mean))) { return 0.0; }
    return (value - mean) / stddev;
}
