// Checkpoints written in the background. The trainer copies a checkpoint (the parameters, AdamW's m
// and v, the run state) into a snapshot in host memory allocated once and pinned, so that the GPU is
// held only for that copy, and hands it over; one writer thread then writes the model file, then the
// state file (each atomically: a temporary file, fsync, rename), then moves `latest`, then prunes
// (llmc/checkpoint_dir.h), in that order: `latest` names a pair only once both files are durable,
// and a kill at any point leaves the previous checkpoint resumable. One write in flight: the next
// checkpoint waits for it first (the snapshot is reused). An error in the background (a full disk)
// is kept as its one line, naming the file, for the trainer to stop with at its next step. Without
// pinned memory, or when asked, the same writes run in the caller (synchronous: the GPU waits).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "llmc/checkpoint_dir.h"
#include "llmc/model_file.h"
#include "llmc/state_file.h"
#include "llmc/utils.h"

// Where the snapshot's memory comes from (the trainer's: page-locked host memory). allocate returns
// nullptr when the memory cannot be had; release frees what it returned.
struct HostMemory {
    void* (*allocate)(size_t bytes);
    void (*release)(void* ptr);
};

// A checkpoint's contents in host memory: what the model file and the state file hold.
struct CheckpointSnapshot {
    ModelShape config;            // the model file's header
    RunState state;               // the state file's header fields (its own m and v stay empty)
    float *params, *m, *v;        // P floats each: the parameters in model-file order, AdamW's moments
    size_t P;
    std::vector<float> pageable;  // the memory of a synchronous write, freed after it
};

// How a finished write went.
struct CheckpointResult {
    int step = -1;       // the checkpoint's step (-1: no write was in flight)
    double seconds = 0;  // from the start of the write to `latest` moved and the folder pruned
    std::string error;   // the failed write's one line, naming the file ("": written)
};

using CheckpointFileWriter = std::function<void(const std::string& path, const CheckpointSnapshot& s)>;

static inline void checkpoint_write_model_file(const std::string& path, const CheckpointSnapshot& s) {
    model_file_write(path.c_str(), &s.config, s.params);
}

static inline void checkpoint_write_state_file(const std::string& path, const CheckpointSnapshot& s) {
    state_file_write(path.c_str(), &s.state, s.m, s.v, s.P);
}

struct CheckpointWriter {
    bool background = false;  // a thread writes; else the caller, synchronously
    int delay_ms = 0;         // a test's slowdown: a pause before each file (GPT2_TEST_CHECKPOINT_DELAY_MS)
    HostMemory memory = {};
    float* pinned = nullptr;  // the background snapshot's 3P floats
    CheckpointSnapshot snapshot = {};
    std::future<CheckpointResult> in_flight;  // the write started last, until its result is taken
    // How each file is written: the real writers, or a test's fakes.
    CheckpointFileWriter write_model = checkpoint_write_model_file, write_state = checkpoint_write_state_file;
};

// Prepares w for checkpoints of P parameters: in the background when `background` is asked for and
// `memory` gives the snapshot's 3P floats, else synchronous. Returns whether in the background.
static inline bool checkpoint_writer_init(CheckpointWriter* w, size_t P, bool background, HostMemory memory,
                                          int delay_ms) {
    w->memory = memory;
    w->delay_ms = delay_ms;
    w->snapshot.P = P;
    w->pinned = background ? (float*)memory.allocate(3 * P * sizeof(float)) : nullptr;
    w->background = w->pinned != nullptr;
    return w->background;
}

static inline double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The write of one checkpoint, in its order; a failure (fail(), thrown here) ends it with its line.
static inline CheckpointResult checkpoint_write_job(const CheckpointWriter* w, const std::string& dir, int step,
                                                    int keep) {
    auto start = std::chrono::steady_clock::now();
    auto pause = [w] { std::this_thread::sleep_for(std::chrono::milliseconds(w->delay_ms)); };
    CheckpointResult result;
    result.step = step;
    bool throws = g_fail_throws;
    g_fail_throws = true;
    try {
        pause();
        w->write_model(checkpoint_path(dir, "model", step), w->snapshot);
        pause();
        w->write_state(checkpoint_path(dir, "state", step), w->snapshot);
        pause();
        checkpoint_write_latest(dir, step);
        if (keep > 0) { checkpoint_prune(dir, step, keep); }
    } catch (const FailError& e) {
        result.error = e.what();
    }
    g_fail_throws = throws;
    result.seconds = seconds_since(start);
    return result;
}

// The snapshot to fill for the next write, its pointers set: call it with no write in flight.
static inline CheckpointSnapshot* checkpoint_writer_snapshot(CheckpointWriter* w) {
    if (w->in_flight.valid()) { fail("checkpoint_writer_snapshot: the previous write is still in flight"); }
    CheckpointSnapshot* s = &w->snapshot;
    if (!w->background) { s->pageable.resize(3 * s->P); }
    float* base = w->background ? w->pinned : s->pageable.data();
    s->params = base;
    s->m = base + s->P;
    s->v = base + 2 * s->P;
    return s;
}

// Starts writing the snapshot as the checkpoint of `step` in dir, keeping the newest `keep` (0: all):
// on the writer thread, which the stop signals never interrupt (the main thread takes them); or
// here, synchronously. Either way its result is taken with checkpoint_writer_poll or _wait.
static inline void checkpoint_writer_start(CheckpointWriter* w, const std::string& dir, int step, int keep) {
    if (w->in_flight.valid()) { fail("checkpoint_writer_start: the previous write is still in flight"); }
    if (!w->background) {
        std::promise<CheckpointResult> done;
        done.set_value(checkpoint_write_job(w, dir, step, keep));
        std::vector<float>().swap(w->snapshot.pageable);
        w->in_flight = done.get_future();
        return;
    }
    sigset_t stops, previous;
    sigemptyset(&stops);
    for (int s : {SIGTERM, SIGINT, SIGUSR1}) { sigaddset(&stops, s); }
    pthread_sigmask(SIG_BLOCK, &stops, &previous);  // the thread inherits the mask it starts with
    w->in_flight = std::async(std::launch::async, checkpoint_write_job, w, dir, step, keep);
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

// The result of the write in flight once it has finished, without waiting: true once per write.
static inline bool checkpoint_writer_poll(CheckpointWriter* w, CheckpointResult* done) {
    if (!w->in_flight.valid() || w->in_flight.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        return false;
    }
    *done = w->in_flight.get();
    return true;
}

// Waits for the write in flight, if any: returns the seconds waited, and its result in *done
// (done->step -1: none was in flight).
static inline double checkpoint_writer_wait(CheckpointWriter* w, CheckpointResult* done) {
    auto start = std::chrono::steady_clock::now();
    *done = w->in_flight.valid() ? w->in_flight.get() : CheckpointResult();
    return seconds_since(start);
}

// Waits for the write in flight (its result dropped: take it first) and frees the snapshot.
static inline void checkpoint_writer_free(CheckpointWriter* w) {
    if (w->in_flight.valid()) { w->in_flight.wait(); }
    w->in_flight = std::future<CheckpointResult>();
    if (w->pinned != nullptr) { w->memory.release(w->pinned); }
    w->pinned = nullptr;
    w->background = false;
}
