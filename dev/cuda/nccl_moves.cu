/*
Lab (issue 55): ZeRO-1's two moves through NCCL 2.28's collectives, on NCCL's kernels and on the
copy engines, beside a stream of cuBLAS TF32 GEMMs. One process drives every visible GPU (one rank
each); the buffers hold a model's P floats (d12, d48: the trainer's parameter counts).

  moves      a2a      ncclAlltoAll: each rank's P floats in n chunks, chunk j to rank j (the
                      gradients to their owners, which then sum the ranks in order themselves)
             gather   the same as n ncclGather in one group, root r gathering chunk r of every rank
             allgather ncclAllGather of each rank's chunk (the owners' updated parameters to everyone)
  buckets    with --buckets B each move is B moves one after the other, over B equal parts of the
             P floats, each part split evenly over the ranks (what moving ZeRO-1's buckets beside
             the passes on the copy engines needs: these collectives take equal counts from every
             rank); B = 1 (default) moves all P at once
  forms      sm       a default communicator, cudaMalloc'd buffers: NCCL's kernels move the data
             zero     a communicator of CTAPolicy NCCL_CTA_POLICY_ZERO, buffers from ncclMemAlloc
                      registered as symmetric windows (NCCL_WIN_COLL_SYMMETRIC). NCCL 2.28.9's
                      enqueue.cc then queues AllGather, AlltoAll, Gather and Scatter as copies
                      (cudaMemcpyBatchAsync, synchronised by stream memory operations) when every
                      rank is a CUDA peer on one node, both buffers are symmetric windows and the
                      driver is 12.5 or newer; otherwise its kernels run.

Each move is checked once (sampled elements of every rank's receive buffer from every source), then
timed. For each model, form and move: the move alone (ms, GB/s each rank receives), the GEMM stream alone
and with the moves beside it (the GEMMs' slowdown, the moves' time beside them). d12 B=16's fc
product (16384 x 3072 x 768) is the GEMM, repeated to outlast the moves.

  ./nccl_moves [--form sm|zero] [--model d12|d48] [--reps N] [--buckets B]
                                                   (default: both forms, both models, 5, 1)

Whether any NCCL kernel ran (one form at a time, under the project's kernel tracer):

  CUDA_INJECTION64_PATH=../../build/libkernel_trace.so KERNEL_TRACE_CSV=zero.csv ./nccl_moves --form zero
  grep -ci nccl zero.csv

Needs 2 GPUs or more and NCCL 2.28 or newer (ncclAlltoAll, ncclGather); prints SKIPPED otherwise.

Measured on 2 H200s (NVLink, NCCL 2.28.3; docs/performance.md has the table), before --buckets
(one bucket; the gathers then sent each root the same chunk, the same bytes): the zero form ran
no NCCL kernel; alone its all-to-all and all-gather match the sm form's (d48: 9.46 against
9.26-11.19 ms), its n gathers are 1.6x slower, and beside the GEMMs it costs them 23% of a move's
time (d48) against the sm form's 44%. --buckets (d48's 49 buckets: --buckets 49) is not yet run.
*/
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "llmc/model_file.h"
#include "llmc/utils.h"
#ifdef USE_NCCL
#include <nccl.h>
#endif

#if defined(USE_NCCL) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)

#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        cudaError_t error_ = (call);                                                                \
        if (error_ != cudaSuccess) { fail("%s: %s", #call, cudaGetErrorString(error_)); }          \
    } while (0)
#define NCCL_CHECK(call)                                                                            \
    do {                                                                                            \
        ncclResult_t result_ = (call);                                                              \
        if (result_ != ncclSuccess) { fail("%s: %s", #call, ncclGetErrorString(result_)); }        \
    } while (0)
#define CUBLAS_CHECK(call)                                                                          \
    do {                                                                                            \
        if ((call) != CUBLAS_STATUS_SUCCESS) { fail("%s failed", #call); }                         \
    } while (0)

constexpr int GEMM_M = 16384, GEMM_N = 3072, GEMM_K = 768;  // d12 B=16's fc product
enum Move { MOVE_A2A, MOVE_GATHER, MOVE_ALLGATHER };
constexpr const char* MOVE_NAMES[] = {"a2a", "gather", "allgather"};

// One GPU, one rank: its streams, the GEMM's operands and the move's buffers (P floats each, a
// chunk of P / n per rank).
struct Rank {
    int device;
    cudaStream_t compute, comm;
    cublasHandle_t cublas;
    float *gemm_a, *gemm_b, *gemm_out;
    ncclComm_t nccl;
    float *send, *recv;
    ncclWindow_t send_window, recv_window;
    cudaEvent_t start, gemms_done, moves_done;
};

// The buffers' layout: bucket b at b * n * piece floats, rank j's piece of it j * piece further.
struct Setup {
    std::vector<Rank> ranks;
    int buckets;
    size_t piece;  // floats a rank owns of each bucket (whole 4 KB pages)
    size_t chunk;  // floats a rank owns: buckets * piece
    bool zero;     // the copy-engine form
};

// Values in [-1, 1) hashed from the index: the tensor cores' power (and so their clock) depends on
// the operands' bits, which zeros would flatter.
__global__ void fill_kernel(float* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        p[i] = (float)(h >> 8) / (float)(1 << 23) - 1.0f;
    }
}

// A rank's send buffer: element k of rank i holds i * 1000 + k % 1000 (exact in a float).
__global__ void fill_send_kernel(float* p, size_t n, int rank) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        p[i] = (float)(rank * 1000 + (int)(i % 1000));
    }
}

static void gemms(Rank& r, int count) {
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < count; i++) {
        CUBLAS_CHECK(cublasSgemm(r.cublas, CUBLAS_OP_T, CUBLAS_OP_N, GEMM_N, GEMM_M, GEMM_K, &one, r.gemm_b, GEMM_K,
                                 r.gemm_a, GEMM_K, &zero, r.gemm_out, GEMM_N));
    }
}

// One move on every rank, queued on their communication streams: a group per bucket.
static void move(Setup& s, Move m) {
    int n = (int)s.ranks.size();
    for (int b = 0; b < s.buckets; b++) {
        size_t bucket = (size_t)b * n * s.piece;
        NCCL_CHECK(ncclGroupStart());
        for (int j = 0; j < n; j++) {
            Rank& r = s.ranks[j];
            if (m == MOVE_A2A) {
                NCCL_CHECK(ncclAlltoAll(r.send + bucket, r.recv + bucket, s.piece, ncclFloat, r.nccl, r.comm));
            } else if (m == MOVE_GATHER) {
                for (int root = 0; root < n; root++) {
                    NCCL_CHECK(ncclGather(r.send + bucket + root * s.piece, r.recv + bucket, s.piece, ncclFloat, root,
                                          r.nccl, r.comm));
                }
            } else {
                NCCL_CHECK(ncclAllGather(r.send + bucket + j * s.piece, r.recv + bucket, s.piece, ncclFloat, r.nccl,
                                         r.comm));
            }
        }
        NCCL_CHECK(ncclGroupEnd());
    }
}

// One move, then a few elements of every bucket of every rank's receive buffer from every source
// against what the move should have put there (a2a and gathers: source i's piece j at rank j's
// piece i; the all-gather: source i's piece i at every rank's piece i).
static void check(Setup& s, Move m) {
    for (Rank& r : s.ranks) {
        CUDA_CHECK(cudaSetDevice(r.device));
        CUDA_CHECK(cudaMemset(r.recv, 0xff, s.chunk * s.ranks.size() * sizeof(float)));  // NaN
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    move(s, m);
    int n = (int)s.ranks.size();
    for (int j = 0; j < n; j++) {
        CUDA_CHECK(cudaSetDevice(s.ranks[j].device));
        CUDA_CHECK(cudaStreamSynchronize(s.ranks[j].comm));
        for (int b : {0, s.buckets / 2, s.buckets - 1}) {
            size_t bucket = (size_t)b * n * s.piece;
            for (int i = 0; i < n; i++) {
                for (size_t t : {(size_t)0, s.piece / 2 + 7, s.piece - 1}) {
                    size_t sent_at = bucket + (m == MOVE_ALLGATHER ? i : j) * s.piece + t, at = bucket + i * s.piece + t;
                    float got, want = (float)(i * 1000 + (int)(sent_at % 1000));
                    CUDA_CHECK(cudaMemcpy(&got, s.ranks[j].recv + at, sizeof(float), cudaMemcpyDeviceToHost));
                    if (got != want) {
                        fail("%s (%s form): rank %d received %g from rank %d at %zu, expected %g", MOVE_NAMES[m],
                             s.zero ? "zero" : "sm", j, got, i, at, want);
                    }
                }
            }
        }
    }
}

static float elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
    return ms;
}

// Milliseconds the slowest rank took for `gemm_count` GEMMs and `move_count` moves started at
// once on each rank's two streams: {GEMMs, moves} (0 where none were asked).
static std::pair<double, double> timed(Setup& s, int gemm_count, Move m, int move_count) {
    for (Rank& r : s.ranks) {
        CUDA_CHECK(cudaSetDevice(r.device));
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaEventRecord(r.start, r.compute));
        CUDA_CHECK(cudaStreamWaitEvent(r.comm, r.start));
        gemms(r, gemm_count);
        CUDA_CHECK(cudaEventRecord(r.gemms_done, r.compute));
    }
    for (int i = 0; i < move_count; i++) { move(s, m); }
    double gemm_ms = 0.0, move_ms = 0.0;
    for (Rank& r : s.ranks) {
        CUDA_CHECK(cudaSetDevice(r.device));
        CUDA_CHECK(cudaEventRecord(r.moves_done, r.comm));
        CUDA_CHECK(cudaDeviceSynchronize());
        if (gemm_count > 0) { gemm_ms = std::max(gemm_ms, (double)elapsed_ms(r.start, r.gemms_done)); }
        if (move_count > 0) { move_ms = std::max(move_ms, (double)elapsed_ms(r.start, r.moves_done)); }
    }
    return {gemm_ms, move_ms};
}

static Setup setup(int n, size_t parameters, bool zero, int buckets) {
    Setup s;
    s.zero = zero;
    s.buckets = buckets;
    size_t unit = (size_t)n * buckets * 1024;
    s.piece = (parameters + unit - 1) / unit * 1024;  // whole 4 KB pages
    s.chunk = s.piece * buckets;
    size_t bytes = s.chunk * n * sizeof(float);
    s.ranks.resize(n);
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < n; i++) {
        Rank& r = s.ranks[i];
        r.device = i;
        CUDA_CHECK(cudaSetDevice(i));
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        if (zero) { config.CTAPolicy = NCCL_CTA_POLICY_ZERO; }
        NCCL_CHECK(ncclCommInitRankConfig(&r.nccl, n, id, i, &config));
    }
    NCCL_CHECK(ncclGroupEnd());
    for (Rank& r : s.ranks) {
        CUDA_CHECK(cudaSetDevice(r.device));
        CUDA_CHECK(cudaStreamCreateWithFlags(&r.compute, cudaStreamNonBlocking));
        CUDA_CHECK(cudaStreamCreateWithFlags(&r.comm, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&r.cublas));
        CUBLAS_CHECK(cublasSetMathMode(r.cublas, CUBLAS_TF32_TENSOR_OP_MATH));
        CUBLAS_CHECK(cublasSetStream(r.cublas, r.compute));
        CUDA_CHECK(cudaMalloc(&r.gemm_a, (size_t)GEMM_M * GEMM_K * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&r.gemm_b, (size_t)GEMM_N * GEMM_K * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&r.gemm_out, (size_t)GEMM_M * GEMM_N * sizeof(float)));
        fill_kernel<<<1024, 256>>>(r.gemm_a, (size_t)GEMM_M * GEMM_K);
        fill_kernel<<<1024, 256>>>(r.gemm_b, (size_t)GEMM_N * GEMM_K);
        CUDA_CHECK(cudaGetLastError());
        if (zero) {
            NCCL_CHECK(ncclMemAlloc((void**)&r.send, bytes));
            NCCL_CHECK(ncclMemAlloc((void**)&r.recv, bytes));
        } else {
            CUDA_CHECK(cudaMalloc(&r.send, bytes));
            CUDA_CHECK(cudaMalloc(&r.recv, bytes));
        }
        fill_send_kernel<<<1024, 256>>>(r.send, s.chunk * n, r.device);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaEventCreate(&r.start));
        CUDA_CHECK(cudaEventCreate(&r.gemms_done));
        CUDA_CHECK(cudaEventCreate(&r.moves_done));
    }
    if (zero) {  // registering a window is collective: every rank in one group
        NCCL_CHECK(ncclGroupStart());
        for (Rank& r : s.ranks) {
            CUDA_CHECK(cudaSetDevice(r.device));
            NCCL_CHECK(ncclCommWindowRegister(r.nccl, r.send, bytes, &r.send_window, NCCL_WIN_COLL_SYMMETRIC));
            NCCL_CHECK(ncclCommWindowRegister(r.nccl, r.recv, bytes, &r.recv_window, NCCL_WIN_COLL_SYMMETRIC));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    return s;
}

static void teardown(Setup& s) {
    if (s.zero) {
        NCCL_CHECK(ncclGroupStart());
        for (Rank& r : s.ranks) {
            CUDA_CHECK(cudaSetDevice(r.device));
            NCCL_CHECK(ncclCommWindowDeregister(r.nccl, r.send_window));
            NCCL_CHECK(ncclCommWindowDeregister(r.nccl, r.recv_window));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    for (Rank& r : s.ranks) {
        CUDA_CHECK(cudaSetDevice(r.device));
        if (s.zero) {
            NCCL_CHECK(ncclMemFree(r.send));
            NCCL_CHECK(ncclMemFree(r.recv));
        } else {
            CUDA_CHECK(cudaFree(r.send));
            CUDA_CHECK(cudaFree(r.recv));
        }
        for (float* p : {r.gemm_a, r.gemm_b, r.gemm_out}) { CUDA_CHECK(cudaFree(p)); }
        CUBLAS_CHECK(cublasDestroy(r.cublas));
        NCCL_CHECK(ncclCommDestroy(r.nccl));
        for (cudaStream_t stream : {r.compute, r.comm}) { CUDA_CHECK(cudaStreamDestroy(stream)); }
        for (cudaEvent_t event : {r.start, r.gemms_done, r.moves_done}) { CUDA_CHECK(cudaEventDestroy(event)); }
    }
}

// The table's rows for one model and form.
static void measure(const char* model, size_t parameters, int n, bool zero, int reps, int buckets) {
    Setup s = setup(n, parameters, zero, buckets);
    timed(s, 2, MOVE_A2A, 1);  // warm-up: cuBLAS's and NCCL's first calls
    double gemm_ms = timed(s, 20, MOVE_A2A, 0).first / 20;
    double received_gb = (double)s.chunk * (n - 1) * sizeof(float) * 1e-9;  // each rank, each move
    for (Move m : {MOVE_A2A, MOVE_GATHER, MOVE_ALLGATHER}) {
        check(s, m);
        double alone_ms = timed(s, 0, m, reps).second / reps;
        int gemm_count = (int)(2 * alone_ms * reps / gemm_ms) + 2;  // the GEMMs outlast the moves, slowed or not
        std::pair<double, double> beside = timed(s, gemm_count, m, reps);
        double gemms_alone_ms = gemm_ms * gemm_count;
        printf("| %s | %d | %d | %s | %s | %.2f | %.0f | %.2f | %.2f | %.2f | %.3f |\n", model, n, buckets,
               zero ? "zero" : "sm", MOVE_NAMES[m], alone_ms, received_gb / alone_ms * 1e3, beside.second / reps, gemms_alone_ms,
               beside.first, beside.first / gemms_alone_ms);
        fflush(stdout);
    }
    teardown(s);
}

int main(int argc, char** argv) {
    std::vector<std::string> forms = {"sm", "zero"}, models = {"d12", "d48"};
    int reps = 5, buckets = 1;
    for (int i = 1; i < argc; i++) {
        std::string flag = argv[i];
        if (i + 1 >= argc) { fail("%s: expected a value after it (usage in the file's header)", argv[i]); }
        std::string value = argv[++i];
        if (flag == "--form" && (value == "sm" || value == "zero")) { forms = {value}; }
        else if (flag == "--model" && (value == "d12" || value == "d48")) { models = {value}; }
        else if (flag == "--reps" && atoi(value.c_str()) > 0) { reps = atoi(value.c_str()); }
        else if (flag == "--buckets" && atoi(value.c_str()) > 0 && atoi(value.c_str()) <= 1024) { buckets = atoi(value.c_str()); }
        else {
            fail("%s %s: expected --form sm|zero, --model d12|d48, --reps N > 0 or --buckets B in 1..1024", flag.c_str(),
                 value.c_str());
        }
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIPPED: nccl_moves needs 2 GPUs or more (%d visible)\n", n);
        return 0;
    }
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version));
    printf("# NCCL %d, %d GPUs, GEMM %dx%dx%d TF32, %d moves a measurement\n", version, n, GEMM_M, GEMM_N, GEMM_K,
           reps);
    printf("| model | GPUs | buckets | form | move | alone ms | GB/s a rank | beside GEMMs ms | GEMMs alone ms | "
           "GEMMs beside ms | GEMM slowdown |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const std::string& model : models) {
        ModelShape shape;
        std::string problem;
        if (!model_shape_by_name(model.c_str(), &shape, &problem)) { fail("%s: %s", model.c_str(), problem.c_str()); }
        for (const std::string& form : forms) {
            measure(model.c_str(), count_parameters(&shape), n, form == "zero", reps, buckets);
        }
    }
    return 0;
}

#else

int main() {
    printf("SKIPPED: nccl_moves needs NCCL 2.28 or newer (built without it, or with an older nccl.h)\n");
    return 0;
}

#endif
