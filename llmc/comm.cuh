// The processes of a data-parallel run and what they say to each other through NCCL: a Comm
// {rank, world, local_rank, stream, nccl}, printf0, and the few collectives the trainer uses.
// Every function does the right thing at world = 1 (and then makes no NCCL call), so callers
// never branch on the number of GPUs; builds without NCCL (no USE_NCCL) run one process only.
#pragma once

#include <cuda_runtime.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "llmc/device_memory.cuh"
#include "llmc/fingerprint.h"
#include "llmc/launch.h"
#include "llmc/utils.h"
#include "llmc/zero.h"
#ifdef USE_NCCL
#include <nccl.h>
#endif

struct Comm {
    int rank, world, local_rank;
    cudaStream_t stream;  // comm_init's, non-blocking: the collectives, the work queued between them (the
                          // gradients' additions and ordered sums), comm_all_gather_to_host's copies
#ifdef USE_NCCL
    ncclComm_t nccl;
#endif
    char* gather_buffer;  // device: comm_all_gather_to_host's, kept between calls (freed by comm_free)
    size_t gather_bytes;
};

static Comm comm_single() {
    Comm comm = Comm();
    comm.world = 1;
    return comm;
}

static Comm g_comm = comm_single();  // this process's place in the run (comm_init)

// printf on rank 0 only.
static void printf0(const char* fmt, ...) {
    if (g_comm.rank != 0) { return; }
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
}

#ifdef USE_NCCL
static void nccl_check(ncclResult_t result, const char* file, int line) {
    if (result != ncclSuccess) { fail("NCCL error at %s:%d: %s", file, line, ncclGetErrorString(result)); }
}
#define ncclCheck(result) nccl_check((result), __FILE__, __LINE__)
#endif

// Joins the run that `me` describes (the CUDA device already chosen): the NCCL id goes from rank
// 0 to the others through a TCP rendezvous at MASTER_ADDR:MASTER_PORT, or through files in
// rendezvous_dir when it is given; then the connections, or heartbeat files in rendezvous_dir,
// watch that every rank stays alive.
static void comm_init(Comm* comm, const LaunchInfo* me, const char* rendezvous_dir) {
    *comm = Comm();
    comm->rank = me->rank;
    comm->world = me->world;
    comm->local_rank = me->local_rank;
    if (cudaStreamCreateWithFlags(&comm->stream, cudaStreamNonBlocking) != cudaSuccess) {
        fail("cannot create the communication stream");
    }
    if (me->world == 1) { return; }
#ifndef USE_NCCL
    (void)rendezvous_dir;
    fail("%d processes requested (%s), but this build has no NCCL: install it (libnccl-dev, or NCCL_HOME=DIR) "
         "and rebuild with make", me->world, me->source);
#else
    ncclUniqueId id;
    if (me->rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
    if (rendezvous_dir != nullptr) {
        rendezvous_file(me, rendezvous_dir, &id, sizeof(id), 300.0);
    } else {
        rendezvous_tcp(me, &id, sizeof(id), 300.0);
    }
    liveness_start(nullptr);  // a rank that dies makes the others exit within seconds
    ncclCheck(ncclCommInitRank(&comm->nccl, me->world, id, me->rank));
#endif
}

// Whether this build can run several processes (it was built with NCCL).
static bool comm_available() {
#ifdef USE_NCCL
    return true;
#else
    return false;
#endif
}

// A wait for the GPU that may wait for NCCL (comm_wait, comm_sync): with several ranks it polls
// query() (cudaEventQuery, cudaStreamQuery) until it is no longer cudaErrorNotReady, so that an
// NCCL error (a peer gone, a network failure) aborts the communicator with one line, never a hang;
// a dead peer of a TCP rendezvous ends this process from the liveness watcher's thread. The
// caller's synchronize then returns at once.
template <typename Query>
static void comm_poll(const Comm* comm, Query query) {
#ifdef USE_NCCL
    while (comm->world > 1 && query() == cudaErrorNotReady) {
        ncclResult_t async_error;
        ncclCheck(ncclCommGetAsyncError(comm->nccl, &async_error));
        if (async_error != ncclSuccess && async_error != ncclInProgress) {
            ncclCommAbort(comm->nccl);
            fail("rank %d: NCCL failed while waiting for the GPU: %s", comm->rank, ncclGetErrorString(async_error));
        }
        struct timespec pause = {0, 50000};
        nanosleep(&pause, nullptr);
    }
#else
    (void)comm, (void)query;
#endif
}

// Waits for `event` like cudaEventSynchronize (comm_poll).
static void comm_wait(const Comm* comm, cudaEvent_t event) {
    comm_poll(comm, [&] { return cudaEventQuery(event); });
    if (cudaEventSynchronize(event) != cudaSuccess) { fail("rank %d: the GPU failed while waiting", comm->rank); }
}

// Waits for the work queued on comm->stream (comm_poll); false if it failed.
static bool comm_sync(const Comm* comm) {
    comm_poll(comm, [&] { return cudaStreamQuery(comm->stream); });
    return cudaStreamSynchronize(comm->stream) == cudaSuccess;
}

// The stream `waiter` waits for the work queued so far on `stream` (through `event`).
static void stream_waits(cudaStream_t waiter, cudaStream_t stream, cudaEvent_t event) {
    if (cudaEventRecord(event, stream) != cudaSuccess || cudaStreamWaitEvent(waiter, event, 0) != cudaSuccess) {
        fail("cannot order the CUDA streams");
    }
}

// In place: rank r's count floats at buffer + r*count go to every rank's buffer.
static void comm_all_gather(const Comm* comm, float* buffer, size_t count) {
    if (comm->world == 1) { return; }
#ifdef USE_NCCL
    ncclCheck(ncclAllGather(buffer + comm->rank * count, buffer, count, ncclFloat, comm->nccl, comm->stream));
#else
    (void)buffer, (void)count;
#endif
}

// Messages of at most COMM_MESSAGE_FLOATS, which NCCL spreads over its channels (one 3 GB
// message per peer measured 2.5x slower on 2 H200s).
constexpr size_t COMM_MESSAGE_FLOATS = (size_t)1 << 24;

// Posts this rank's messages of a move (llmc/zero.h's zero_messages) as one NCCL group on
// comm->stream: sends read from `source`, receives write into `dest`.
static void comm_post(const Comm* comm, const std::vector<ZeroMessage>& messages, const float* source, float* dest) {
    if (comm->world == 1 || messages.empty()) { return; }
#ifdef USE_NCCL
    ncclCheck(ncclGroupStart());
    for (const ZeroMessage& m : messages) {
        if (m.send) {
            ncclCheck(ncclSend(source + m.offset, m.count, ncclFloat, m.peer, comm->nccl, comm->stream));
        } else {
            ncclCheck(ncclRecv(dest + m.offset, m.count, ncclFloat, m.peer, comm->nccl, comm->stream));
        }
    }
    ncclCheck(ncclGroupEnd());
#else
    (void)source, (void)dest;
#endif
}

// Rank 0 receives every rank's slice [begin, end) of a sharded array (the owner's floats at
// `slice`) into host (num_parameters floats), through `buffer` (buffer_floats on the device).
static void comm_gather_slices(const Comm* comm, const float* slice, size_t num_parameters, float* host,
                               float* buffer, size_t buffer_floats) {
    ZeroShard mine = zero_shard(num_parameters, comm->rank, comm->world);
    if (comm->rank == 0 && cudaMemcpy(host + mine.begin, slice, (mine.end - mine.begin) * sizeof(float),
                                      cudaMemcpyDeviceToHost) != cudaSuccess) {
        fail("cannot copy the optimizer state to the host");
    }
#ifdef USE_NCCL
    for (int r = 1; r < comm->world; r++) {
        ZeroShard theirs = zero_shard(num_parameters, r, comm->world);
        for (size_t begin = theirs.begin; begin < theirs.end; begin += buffer_floats) {
            size_t count = std::min(buffer_floats, theirs.end - begin);
            if (comm->rank == r) {
                ncclCheck(ncclSend(slice + (begin - theirs.begin), count, ncclFloat, 0, comm->nccl, comm->stream));
            } else if (comm->rank == 0) {
                ncclCheck(ncclRecv(buffer, count, ncclFloat, r, comm->nccl, comm->stream));
                if (!comm_sync(comm) ||
                    cudaMemcpy(host + begin, buffer, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
                    fail("cannot gather the optimizer state from rank %d", r);
                }
            }
        }
    }
    if (comm->world > 1 && !comm_sync(comm)) { fail("cannot gather the optimizer state"); }
#else
    (void)buffer, (void)buffer_floats;
#endif
}

// Every rank's `bytes` at `mine` to every rank's host, rank r's at all + r * bytes: an all-gather
// through comm's device buffer (grown when too small, so that repeated calls do not free device
// memory, which synchronises the GPU), waited for; `what` names it in the error.
static void comm_all_gather_to_host(Comm* comm, const void* mine, void* all, size_t bytes, const char* what) {
    if (comm->world == 1) {
        memcpy(all, mine, bytes);
        return;
    }
#ifdef USE_NCCL
    size_t total = bytes * comm->world;
    if (total > comm->gather_bytes) {
        device_free(comm->gather_buffer);
        comm->gather_buffer = (char*)device_malloc(total, what);
        comm->gather_bytes = total;
    }
    // every copy on the collective's stream, so that NCCL reads this call's value (pageable host
    // memory: the upload has left `mine` when the call returns); each copy, which may block the
    // host, once the stream's earlier work is done
    char* gathered = comm->gather_buffer;
    char* own = gathered + comm->rank * bytes;
    bool ok = comm_sync(comm) && cudaMemcpyAsync(own, mine, bytes, cudaMemcpyHostToDevice, comm->stream) == cudaSuccess;
    ncclCheck(ncclAllGather(own, gathered, bytes, ncclChar, comm->nccl, comm->stream));
    ok = ok && comm_sync(comm) &&
         cudaMemcpyAsync(all, gathered, total, cudaMemcpyDeviceToHost, comm->stream) == cudaSuccess && comm_sync(comm);
    if (!ok) { fail("rank %d: cannot share %s with the other ranks", comm->rank, what); }
#else
    (void)what;
#endif
}

// values (n doubles, the same positions on every rank, each written by at most one rank and 0
// on the others) become the sum over the ranks in rank order on every rank: exact, since all but
// one term of each sum are zeros, and the doubles travel as raw bits.
static void comm_sum_disjoint(Comm* comm, double* values, size_t n) {
    if (comm->world == 1 || n == 0) { return; }
#ifdef USE_NCCL
    std::vector<double> all(n * comm->world);
    comm_all_gather_to_host(comm, values, all.data(), n * sizeof(double), "losses");
    for (size_t i = 0; i < n; i++) {
        double sum = all[i];
        for (int r = 1; r < comm->world; r++) { sum += all[r * n + i]; }
        values[i] = sum;
    }
#else
    (void)values;
#endif
}

// Fails on every rank, naming the first rank whose value differs from rank 0's (e.g. a hash of
// the flags and data that shape the run); rank 0 prints the line, the others exit with it.
static void comm_check_same(Comm* comm, uint64_t value, const char* what) {
    if (comm->world == 1) { return; }
#ifdef USE_NCCL
    std::vector<uint64_t> values(comm->world);
    comm_all_gather_to_host(comm, &value, values.data(), sizeof(value), what);
    for (int r = 1; r < comm->world; r++) {
        if (values[r] == values[0]) { continue; }
        // rank 0 reports it; its failure ends the others quietly (the TCP rendezvous's watcher), or they
        // leave quietly now (a file rendezvous has no watcher)
        if (comm->rank != 0) {
            if (!g_liveness.running) { exit(EXIT_FAILURE); }
            sleep(10);
        }
        fail("rank %d: %s differ from rank 0's (every rank must get the same)", r, what);
    }
#else
    (void)value, (void)what;
#endif
}

// Where a rank's GPU is, as every rank can name it.
struct GpuPlace {
    uint64_t host;     // a hash of its host's name
    char bus_id[32];   // its PCI bus id (cudaDeviceGetPCIBusId)
};

// Every rank's GpuPlace, rank r's at [r] (this process's GPU chosen).
static std::vector<GpuPlace> comm_gpu_places(Comm* comm) {
    GpuPlace mine = {};
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    mine.host = fnv1a_bytes(FNV1A_OFFSET, name, strlen(name));
    int device;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id) - 1, device) != cudaSuccess) {
        fail("rank %d: cannot read its GPU's PCI bus id", comm->rank);
    }
    std::vector<GpuPlace> places(comm->world);
    comm_all_gather_to_host(comm, &mine, places.data(), sizeof(mine), "the GPUs' places");
    return places;
}

// A normal end: the peers are told this rank finished, then the communicator is released.
static void comm_free(Comm* comm) {
    cudaStreamSynchronize(comm->stream);
#ifdef USE_NCCL
    if (comm->world > 1) {
        liveness_finish();
        ncclCommDestroy(comm->nccl);
    }
#endif
    device_free(comm->gather_buffer);
    comm->gather_buffer = nullptr;
    comm->gather_bytes = 0;
    cudaStreamDestroy(comm->stream);
}
