/*
Kernel lab: layernorm backward, over N = B*T = 8192 rows of C channels, for C = 768, 1024, 1280
and 1600 (GPT-2 small to XL). Per row, with xhat = (x - mean) * rstd and g = dout * weight:
  dinp    += (g - mean(g) - xhat * mean(g * xhat)) * rstd
  dweight = sum over rows of dout * xhat,    dbias = sum over rows of dout  (written, not added to:
  the trainer needs no zeroing of its gradients between steps)
The row part is independent per row; the dweight and dbias sums run across all rows, and how the
blocks' shares are combined decides the speed and whether the result is bit-identical run to run.

  variant 1  naive: a thread per row (dinp), then a thread per channel summing all rows in order
  variant 2  warp per row, per-block sums, float atomicAdd into the zeroed dweight/dbias (not
             deterministic)
  variant 3  warp per row, per-block partial sums, a second kernel (the trainer's
             layernorm_backward_sums_kernel) adds them in block order
  variant 4  one launch, warp per row, the last block to finish adds the partials
             (arrive_last_in_group): the trainer's until variant 6 replaced it
  variant 5  as 3 in one cooperative launch: after a grid-wide barrier every block adds a slice of
             the partials (the final sum spread over the chip instead of one block)
  variant 6  the trainer's layernorm_backward: a thread per float4 channel and a block per group
             of rows: the accumulators are one float4 each whatever C; 4 rows in flight per
             thread; each row's sums over the block through shared memory; the final sum a second
             kernel as in 3 (queued with programmatic dependent launch). Until 2026-11-25 it was one
             cooperative launch with the final sum spread as in 5: as fast alone, but a grid that
             must be resident all at once waited for the side stream's products to leave the SMs
  variant 7  as 5 with each warp's dweight and dbias shares in its slice of shared memory instead
             of registers: fewer registers, more warps per SM (the main phase is latency-bound)

  ./layernorm_backward [variant ...]

Bytes counted: dout and inp read once, dinp read and written (it accumulates), mean and rstd read,
weight read, dweight and dbias written: (4 N C + 2 N + 3 C) * 4 bytes. The partial sums
are overhead, not counted.
*/
#include "common.h"

constexpr int NUM_VARIANTS = 7;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: thread per row, thread per channel",
    "2 warp per row, float atomicAdd of block sums",
    "3 warp per row, block partials + finalize kernel",
    "4 warp per row, last block sums (trainer before 6)",
    "5 warp per row, cooperative grid sync, spread sum",
    "6 trainer: thread per channel, rows in flight, sums kernel",
    "7 as 5, the warps' shares in shared memory",
};

// fp32 sums: C terms per row for dinp, N = 8192 rows per channel for dweight and dbias, each
// relative to its largest |value|; a float sum of n terms errs by ~sqrt(n) * 6e-8 of their scale.
constexpr double TOLERANCE = 1e-5;

constexpr int WARP_ROW_BLOCK = 256;  // threads of variants 2, 3, 5 and 7

// ----------------------------------------------------------------------------------------------
// Variant 1: naive

__global__ void naive_rows_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                  const float* mean, const float* rstd, int N, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) { return; }
    const float* d = dout + (size_t)row * C;
    const float* x = inp + (size_t)row * C;
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int c = 0; c < C; c++) {
        float g = d[c] * weight[c];
        sum_g += g;
        sum_g_xhat += g * (x[c] - mean[row]) * rstd[row];
    }
    float mean_g = sum_g / C, mean_g_xhat = sum_g_xhat / C;
    for (int c = 0; c < C; c++) {
        float xhat = (x[c] - mean[row]) * rstd[row];
        dinp[(size_t)row * C + c] += (d[c] * weight[c] - mean_g - xhat * mean_g_xhat) * rstd[row];
    }
}

__global__ void naive_channels_kernel(float* dweight, float* dbias, const float* dout, const float* inp,
                                      const float* mean, const float* rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float dw = 0.0f, db = 0.0f;
    for (int row = 0; row < N; row++) {
        float d = dout[(size_t)row * C + c];
        dw += d * (inp[(size_t)row * C + c] - mean[row]) * rstd[row];
        db += d;
    }
    dweight[c] = dw;
    dbias[c] = db;
}

// ----------------------------------------------------------------------------------------------
// Variants 2, 3, 5, 7: a warp per row. The lane's shares of dweight and dbias are kept in
// registers (CHUNKS float4 each, CHUNKS * 128 >= C) or, with SHARED, in the warp's slice of
// shared memory; a block's warps are then added in warp order.

// The warp's row: dinp_row += dx; adds dout * xhat and dout to the lane's chunks of dw and db
// (registers), or with SHARED to shares[c4] and shares[C4 + c4] (the warp's shared memory).
template <int CHUNKS, bool SHARED>
__device__ void warp_row_backward(const cg::thread_block_tile<32>& warp, float4* dw, float4* db, float4* shares,
                                  float* dinp, const float* dout, const float* inp, const float* weight,
                                  const float* mean, const float* rstd, int row, int C) {
    int C4 = C / 4, lane = warp.thread_rank();
    const float4* dout4 = (const float4*)dout + (size_t)row * C4;
    const float4* inp4 = (const float4*)inp + (size_t)row * C4;
    float4* dinp4 = (float4*)dinp + (size_t)row * C4;
    float4 m = make_float4(mean[row], mean[row], mean[row], mean[row]);
    float r = rstd[row];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c4 = lane + 32 * k;
        if (c4 < C4) {
            float4 d = dout4[c4], xhat = (inp4[c4] - m) * r, g = d * ((const float4*)weight)[c4];
            sum_g += sum4(g);
            sum_g_xhat += sum4(g * xhat);
            if constexpr (SHARED) {
                shares[c4] = shares[c4] + d * xhat;
                shares[C4 + c4] = shares[C4 + c4] + d;
            } else {
                dw[k] = dw[k] + d * xhat;
                db[k] = db[k] + d;
            }
        }
    }
    float mean_g = cg::reduce(warp, sum_g, cg::plus<float>()) / C;
    float mean_g_xhat = cg::reduce(warp, sum_g_xhat, cg::plus<float>()) / C;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c4 = lane + 32 * k;
        if (c4 < C4) {
            float4 xhat = (inp4[c4] - m) * r, g = dout4[c4] * ((const float4*)weight)[c4];
            float4 dx = (g - make_float4(mean_g, mean_g, mean_g, mean_g) - xhat * mean_g_xhat) * r;
            dinp4[c4] = dinp4[c4] + dx;
        }
    }
}

// The block's rows, a warp at a time, then block_sums[0, C4) = dweight shares and [C4, 2 C4) =
// dbias shares of the block, its warps added in warp order.
template <int CHUNKS>
__device__ void warp_rows_block_sums(float4* block_sums, float* dinp, const float* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd, int N, int C) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int C4 = C / 4, lane = warp.thread_rank();
    float4 dw[CHUNKS], db[CHUNKS];
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) { dw[k] = db[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    int warps = gridDim.x * warp.meta_group_size();
    for (int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank(); row < N; row += warps) {
        warp_row_backward<CHUNKS, false>(warp, dw, db, nullptr, dinp, dout, inp, weight, mean, rstd, row, C);
    }
    for (int w = 0; w < warp.meta_group_size(); w++) {
        if (warp.meta_group_rank() == w) {
#pragma unroll
            for (int k = 0; k < CHUNKS; k++) {
                int c4 = lane + 32 * k;
                if (c4 < C4) {
                    block_sums[c4] = w == 0 ? dw[k] : block_sums[c4] + dw[k];
                    block_sums[C4 + c4] = w == 0 ? db[k] : block_sums[C4 + c4] + db[k];
                }
            }
        }
        block.sync();
    }
}

template <int CHUNKS>
__global__ void atomic_kernel(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* weight, const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float4 block_sums[];
    warp_rows_block_sums<CHUNKS>(block_sums, dinp, dout, inp, weight, mean, rstd, N, C);
    for (int i = threadIdx.x; i < C / 2; i += blockDim.x) {
        float4 s = block_sums[i];
        float* target = i < C / 4 ? dweight + 4 * i : dbias + 4 * (i - C / 4);
        atomicAdd(target, s.x);
        atomicAdd(target + 1, s.y);
        atomicAdd(target + 2, s.z);
        atomicAdd(target + 3, s.w);
    }
}

template <int CHUNKS>
__global__ void partials_kernel(float* dinp, float* partials, const float* dout, const float* inp, const float* weight,
                                const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float4 block_sums[];
    warp_rows_block_sums<CHUNKS>(block_sums, dinp, dout, inp, weight, mean, rstd, N, C);
    for (int i = threadIdx.x; i < C / 2; i += blockDim.x) { ((float4*)partials)[(size_t)blockIdx.x * (C / 2) + i] = block_sums[i]; }
}

// Variant 4: the partials summed in block order by the last block to finish.
template <int CHUNKS>
__global__ void last_block_kernel(float* dinp, float* dweight, float* dbias, float* partials, unsigned int* counter,
                                  const float* dout, const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) {
    extern __shared__ float4 block_sums[];
    warp_rows_block_sums<CHUNKS>(block_sums, dinp, dout, inp, weight, mean, rstd, N, C);
    float4* partials4 = (float4*)partials;
    for (int i = threadIdx.x; i < C / 2; i += blockDim.x) { partials4[(size_t)blockIdx.x * (C / 2) + i] = block_sums[i]; }
    if (!arrive_last_in_group(counter, gridDim.x)) { return; }
    for (int i = threadIdx.x; i < C / 2; i += blockDim.x) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned int b = 0; b < gridDim.x; b++) { sum = sum + __ldcg(&partials4[(size_t)b * (C / 2) + i]); }
        float4* target = i < C / 4 ? (float4*)dweight + i : (float4*)dbias + (i - C / 4);
        *target = sum;
    }
}

template <int CHUNKS>
__global__ void cooperative_kernel(float* dinp, float* dweight, float* dbias, float* partials, const float* dout,
                                   const float* inp, const float* weight, const float* mean, const float* rstd, int N,
                                   int C) {
    extern __shared__ float4 block_sums[];
    warp_rows_block_sums<CHUNKS>(block_sums, dinp, dout, inp, weight, mean, rstd, N, C);
    for (int i = threadIdx.x; i < C / 2; i += blockDim.x) { ((float4*)partials)[(size_t)blockIdx.x * (C / 2) + i] = block_sums[i]; }
    cg::this_grid().sync();  // every block's partials are written and visible
    for (int group = blockIdx.x; group < final_sum_groups(C); group += gridDim.x) {
        final_sum_column_group(dweight, dbias, (const float4*)partials, gridDim.x, C / 4, group);
    }
}

// Variant 7: each warp's shares in its slice of shared memory; the block's slices added in warp
// order into its partials, then the final sum spread over the grid as in variant 5.
template <int CHUNKS>
__global__ void __launch_bounds__(WARP_ROW_BLOCK, CHUNKS <= 6 ? 4 : CHUNKS <= 8 ? 3 : 2)
    shared_shares_kernel(float* dinp, float* dweight, float* dbias, float* partials, const float* dout,
                         const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float4 warp_shares[];  // [warp][2 C4]
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int C4 = C / 4;
    float4* shares = warp_shares + (size_t)warp.meta_group_rank() * 2 * C4;
    for (int i = warp.thread_rank(); i < 2 * C4; i += 32) { shares[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    int warps = gridDim.x * warp.meta_group_size();
    for (int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank(); row < N; row += warps) {
        warp_row_backward<CHUNKS, true>(warp, nullptr, nullptr, shares, dinp, dout, inp, weight, mean, rstd, row, C);
    }
    block.sync();
    for (int i = threadIdx.x; i < 2 * C4; i += blockDim.x) {
        float4 sum = warp_shares[i];
        for (int w = 1; w < warp.meta_group_size(); w++) { sum = sum + warp_shares[(size_t)w * 2 * C4 + i]; }
        ((float4*)partials)[(size_t)blockIdx.x * 2 * C4 + i] = sum;
    }
    cg::this_grid().sync();
    for (int group = blockIdx.x; group < final_sum_groups(C); group += gridDim.x) {
        final_sum_column_group(dweight, dbias, (const float4*)partials, gridDim.x, C4, group);
    }
}

// As many blocks as fit on the chip at once (the cooperative launch needs no more, the others
// gain nothing from more: each block loops over rows).
template <typename Kernel>
static int resident_grid(Kernel kernel, int block_size, size_t shared) {
    int per_sm = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_size, shared));
    return g_num_sms * std::min(per_sm, LAYERNORM_BACKWARD_MAX_BLOCKS_PER_SM);
}

struct Buffers {
    float *dinp, *dweight, *dbias, *partials;
    unsigned int* counter;
    const float *dout, *inp, *weight, *mean, *rstd;
    int N, C;
};

// A grid of as many blocks as fit at once, so that a grid-wide barrier can be waited on.
template <typename Kernel>
static void launch_cooperative(Kernel kernel, int block_size, size_t shared, Buffers a) {
    void* args[] = {&a.dinp, &a.dweight, &a.dbias, &a.partials, &a.dout, &a.inp, &a.weight, &a.mean, &a.rstd, &a.N, &a.C};
    int grid = resident_grid(kernel, block_size, shared);
    if (grid == 0) { fail("cooperative launch: not one block of %d threads fits on an SM", block_size); }
    cudaCheck(cudaLaunchCooperativeKernel((void*)kernel, grid, block_size, args, shared, 0));
}

template <int CHUNKS>
static void launch_warp_row_variant(int variant, const Buffers& d) {
    size_t shared = 2 * d.C * sizeof(float);
    if (variant == 2) {
        cudaCheck(cudaMemsetAsync(d.dweight, 0, d.C * sizeof(float)));
        cudaCheck(cudaMemsetAsync(d.dbias, 0, d.C * sizeof(float)));
        int grid = resident_grid(atomic_kernel<CHUNKS>, WARP_ROW_BLOCK, shared);
        atomic_kernel<CHUNKS><<<grid, WARP_ROW_BLOCK, shared>>>(d.dinp, d.dweight, d.dbias, d.dout, d.inp, d.weight,
                                                                d.mean, d.rstd, d.N, d.C);
    } else if (variant == 3) {
        int grid = resident_grid(partials_kernel<CHUNKS>, WARP_ROW_BLOCK, shared);
        partials_kernel<CHUNKS><<<grid, WARP_ROW_BLOCK, shared>>>(d.dinp, d.partials, d.dout, d.inp, d.weight, d.mean,
                                                                  d.rstd, d.N, d.C);
        cudaCheck(cudaGetLastError());
        layernorm_backward_sums_kernel<<<final_sum_groups(d.C), 256>>>(d.dweight, d.dbias, d.partials, grid, d.C);
    } else if (variant == 4) {
        int grid = resident_grid(last_block_kernel<CHUNKS>, WARP_ROW_BLOCK, shared);
        last_block_kernel<CHUNKS><<<grid, WARP_ROW_BLOCK, shared>>>(d.dinp, d.dweight, d.dbias, d.partials, d.counter,
                                                                    d.dout, d.inp, d.weight, d.mean, d.rstd, d.N, d.C);
    } else if (variant == 5) {
        launch_cooperative(cooperative_kernel<CHUNKS>, WARP_ROW_BLOCK, shared, d);
    } else {
        size_t slices = WARP_ROW_BLOCK / 32 * shared;
        cudaCheck(cudaFuncSetAttribute(shared_shares_kernel<CHUNKS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)slices));
        launch_cooperative(shared_shares_kernel<CHUNKS>, WARP_ROW_BLOCK, slices, d);
    }
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------

static void launch_variant(int variant, const Buffers& d) {
    if (variant == 1) {
        naive_rows_kernel<<<ceil_div(d.N, 128), 128>>>(d.dinp, d.dout, d.inp, d.weight, d.mean, d.rstd, d.N, d.C);
        cudaCheck(cudaGetLastError());
        naive_channels_kernel<<<ceil_div(d.C, 128), 128>>>(d.dweight, d.dbias, d.dout, d.inp, d.mean, d.rstd, d.N, d.C);
        cudaCheck(cudaGetLastError());
    } else if (variant == 6) {
        layernorm_backward(d.dinp, d.dweight, d.dbias, d.partials, d.dout, d.inp, d.weight, d.mean, d.rstd, d.N, d.C);
    } else {
#define LAUNCH_WARP_ROW(K) launch_warp_row_variant<K>(variant, d)
        DISPATCH_CHUNKS(d.C, LAUNCH_WARP_ROW);
#undef LAUNCH_WARP_ROW
    }
}

// ----------------------------------------------------------------------------------------------
// CPU reference in double: dinp, dweight, dbias after one backward from the given start values
// (which dweight and dbias overwrite).

struct Reference {
    std::vector<double> dinp, dweight, dbias;
};

static Reference cpu_reference(const std::vector<float>& dout, const std::vector<float>& inp,
                               const std::vector<float>& weight, const std::vector<float>& mean,
                               const std::vector<float>& rstd, const std::vector<float>& dinp0, int N, int C) {
    Reference ref = {std::vector<double>(dinp0.begin(), dinp0.end()), std::vector<double>(C, 0.0),
                     std::vector<double>(C, 0.0)};
    std::vector<double> xhat(C);
    for (int row = 0; row < N; row++) {
        const float* d = &dout[(size_t)row * C];
        double sum_g = 0.0, sum_g_xhat = 0.0;
        for (int c = 0; c < C; c++) {
            xhat[c] = ((double)inp[(size_t)row * C + c] - mean[row]) * rstd[row];
            sum_g += (double)d[c] * weight[c];
            sum_g_xhat += (double)d[c] * weight[c] * xhat[c];
        }
        for (int c = 0; c < C; c++) {
            ref.dinp[(size_t)row * C + c] += ((double)d[c] * weight[c] - sum_g / C - xhat[c] * sum_g_xhat / C) * rstd[row];
            ref.dweight[c] += (double)d[c] * xhat[c];
            ref.dbias[c] += d[c];
        }
    }
    return ref;
}

// mean and rstd of each row of inp, as the forward pass stores them (eps 1e-5).
static void row_statistics(const std::vector<float>& inp, int N, int C, std::vector<float>* mean, std::vector<float>* rstd) {
    mean->resize(N);
    rstd->resize(N);
    for (int row = 0; row < N; row++) {
        double sum = 0.0, sum_sq = 0.0;
        for (int c = 0; c < C; c++) { sum += inp[(size_t)row * C + c]; }
        double m = sum / C;
        for (int c = 0; c < C; c++) { sum_sq += (inp[(size_t)row * C + c] - m) * (inp[(size_t)row * C + c] - m); }
        (*mean)[row] = (float)m;
        (*rstd)[row] = (float)(1.0 / sqrt(sum_sq / C + 1e-5));
    }
}

struct Problem {
    Buffers d;
    float *dinp0, *dweight0, *dbias0;  // start values of the outputs: dinp adds to its, the others overwrite
    float *dinp, *dweight, *dbias, *dout, *inp, *weight, *mean, *rstd;
};

static Problem problem_create(int N, int C) {
    Problem p;
    size_t nc = (size_t)N * C;
    p.dinp0 = gpu_floats(nc), p.dweight0 = gpu_floats(C), p.dbias0 = gpu_floats(C);
    p.dinp = gpu_floats(nc), p.dweight = gpu_floats(C), p.dbias = gpu_floats(C);
    p.dout = gpu_floats(nc), p.inp = gpu_floats(nc), p.weight = gpu_floats(C), p.mean = gpu_floats(N), p.rstd = gpu_floats(N);
    float* partials = gpu_floats((size_t)g_num_sms * LAYERNORM_BACKWARD_MAX_BLOCKS_PER_SM * 2 * C);
    unsigned int* counter = (unsigned int*)gpu_ints(1);
    cudaCheck(cudaMemset(counter, 0, sizeof(unsigned int)));
    p.d = Buffers{p.dinp, p.dweight, p.dbias, partials, counter, p.dout, p.inp, p.weight, p.mean, p.rstd, N, C};
    return p;
}

// Fresh random inputs and start values; mean and rstd computed from inp as the forward would.
static void problem_fill(Problem* p) {
    int N = p->d.N, C = p->d.C;
    size_t nc = (size_t)N * C;
    fill_uniform(p->dout, nc, -1.0f, 1.0f);
    fill_uniform(p->inp, nc, -2.0f, 3.0f);
    fill_uniform(p->weight, C, -1.5f, 1.5f);
    fill_uniform(p->dinp0, nc, -1.0f, 1.0f);
    fill_uniform(p->dweight0, C, -1.0f, 1.0f);
    fill_uniform(p->dbias0, C, -1.0f, 1.0f);
    std::vector<float> mean, rstd;
    row_statistics(download(p->inp, nc), N, C, &mean, &rstd);
    cudaCheck(cudaMemcpy(p->mean, mean.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(p->rstd, rstd.data(), N * sizeof(float), cudaMemcpyHostToDevice));
}

static void problem_reset(const Problem& p) {
    size_t nc = (size_t)p.d.N * p.d.C;
    copy_floats(p.dinp, p.dinp0, nc);
    copy_floats(p.dweight, p.dweight0, p.d.C);
    copy_floats(p.dbias, p.dbias0, p.d.C);
}

static double check_variant(Problem* p, int variant) {
    int N = p->d.N, C = p->d.C;
    size_t nc = (size_t)N * C;
    problem_fill(p);
    problem_reset(*p);
    launch_variant(variant, p->d);
    Reference ref = cpu_reference(download(p->dout, nc), download(p->inp, nc), download(p->weight, C),
                                  download(p->mean, N), download(p->rstd, N), download(p->dinp0, nc), N, C);
    return std::max({relative_error(download(p->dinp, nc), ref.dinp), relative_error(download(p->dweight, C), ref.dweight),
                     relative_error(download(p->dbias, C), ref.dbias)});
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    const int channels[] = {768, 1024, 1280, 1600};
    const int N = LAB_ROWS;
    for (int C : channels) {
        Problem p = problem_create(N, C);
        double bytes = (4.0 * N * C + 2.0 * N + 3.0 * C) * sizeof(float);
        for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
            if (!variant_selected(variant)) { continue; }
            char name[96];
            snprintf(name, sizeof(name), "%s, C=%d", VARIANT_NAMES[variant], C);
            double error = check_variant(&p, variant);
            Launch launch = [&] { launch_variant(variant, p.d); };
            Launch reset = [&] { problem_reset(p); };
            Determinism det = deterministic(launch, reset, {{p.dinp, (size_t)N * C}, {p.dweight, (size_t)C}, {p.dbias, (size_t)C}});
            double ms = bench_ms(launch, reset);
            print_row("layernorm_backward", name, ms, bytes, CEILING_COPY, error, TOLERANCE, det);
        }
        gpu_free_all();
    }
    return lab_finish();
}
