/*
Kernel lab: the encoder backward, from dout (B*T = 8192 tokens, C = 768):
  dwte[token] += sum of dout over the positions holding that token (onto the LM head's gradient),
  dwpe[t] = sum over b of dout[b, t] (written: no zeroing between steps)

  variant 1  naive: a thread per element of dout, float atomicAdd into dwte and the zeroed dwpe
             (not deterministic)
  variant 2  the trainer's encoder_backward (wte_backward_kernel + wpe_backward_kernel): the
             positions grouped by token on the host (token_buckets_build), a frequent token's in
             buckets of WTE_BUCKET_POSITIONS; blocks striding over the buckets (a grid independent of
             the batch, for CUDA graphs), each summing a bucket's positions in order, a token's
             bucket sums added in order by its last block; a thread per (t, 4 channels) summing b
             in order
  variant 3  one bucket per token, the wte kernel loading 8 rows before adding them (in order):
             more loads in flight for a frequent token's long bucket
  variant 4  the trainer's kernels on one bucket per token (the trainer before it split buckets):
             one block sums a frequent token's positions alone

Each variant runs on uniform tokens and on skewed ones (u^4: a few ids frequent, as in text; the
most frequent takes ~7% of the positions).

  ./encoder_backward [variant ...]

Bytes counted: dout read once, the touched rows of dwte and all of dwpe read and written:
(B T C + 2 U C + 2 T C) * 4 with U the number of distinct tokens.
*/
#include "common.h"

constexpr int NUM_VARIANTS = 4;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 naive: float atomicAdd per element",
    "2 trainer: token buckets, wte + wpe kernels",
    "3 a bucket per token, 8 rows in flight",
    "4 trainer's kernels, a bucket per token",
};
constexpr int ROWS_IN_FLIGHT = 8;

// Relative to max |value|: fp32 sums of up to B = 8 (dwpe) or several hundred (a frequent token's
// dwte row) terms of size ~1, each addition rounding by up to 2^-24 of the running sum.
constexpr double TOLERANCE = 1e-5;

__global__ void atomic_kernel(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) { return; }
    size_t bt = idx / C;
    int c = idx % C, t = bt % T;
    atomicAdd(&dwte[(size_t)tokens[bt] * C + c], dout[idx]);
    atomicAdd(&dwpe[(size_t)t * C + c], dout[idx]);
}

__global__ void rows_in_flight_kernel(float4* dwte, const float4* dout, const int* bucket_tokens,
                                      const int* bucket_starts, const int* bucket_positions, int C4) {
    size_t token = bucket_tokens[blockIdx.x];
    int begin = bucket_starts[blockIdx.x], end = bucket_starts[blockIdx.x + 1];
    for (int c4 = threadIdx.x; c4 < C4; c4 += blockDim.x) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int i = begin;
        for (; i + ROWS_IN_FLIGHT <= end; i += ROWS_IN_FLIGHT) {
            float4 rows[ROWS_IN_FLIGHT];
#pragma unroll
            for (int u = 0; u < ROWS_IN_FLIGHT; u++) { rows[u] = dout[(size_t)bucket_positions[i + u] * C4 + c4]; }
#pragma unroll
            for (int u = 0; u < ROWS_IN_FLIGHT; u++) { sum = sum + rows[u]; }
        }
        for (; i < end; i++) { sum = sum + dout[(size_t)bucket_positions[i] * C4 + c4]; }
        dwte[token * C4 + c4] = dwte[token * C4 + c4] + sum;
    }
}

struct Buffers {
    float *dwte, *dwpe, *dwte0, *dwpe0, *dout;
    float* partials;  // variants 2, 4: one row per bucket
    int *tokens, *bucket_tokens, *bucket_starts, *bucket_positions, *bucket_groups, *group_bounds;
    int* device_num_buckets;  // num_buckets on the device, as the trainer's kernel reads it
    unsigned int* group_counters;
    int num_buckets;
    int B, T, C;
};

static void launch_variant(int variant, const Buffers& d) {
    int B = d.B, T = d.T, C = d.C;
    if (variant == 1) {
        cudaCheck(cudaMemsetAsync(d.dwpe, 0, (size_t)T * C * sizeof(float)));
        atomic_kernel<<<ceil_div((size_t)B * T * C, 256), 256>>>(d.dwte, d.dwpe, d.dout, d.tokens, B, T, C);
        cudaCheck(cudaGetLastError());
    } else if (variant == 2 || variant == 4) {
        encoder_backward(d.dwte, d.dwpe, d.partials, d.group_counters, d.dout, d.device_num_buckets, d.bucket_tokens,
                         d.bucket_starts, d.bucket_positions, d.bucket_groups, d.group_bounds, B, T, T, C);
    } else {
        rows_in_flight_kernel<<<d.num_buckets, 256>>>((float4*)d.dwte, (const float4*)d.dout, d.bucket_tokens,
                                                      d.bucket_starts, d.bucket_positions, C / 4);
        cudaCheck(cudaGetLastError());
        wpe_backward_kernel<<<ceil_div((size_t)T * C / 4, 256), 256>>>((float4*)d.dwpe, (const float4*)d.dout, B, T, T,
                                                                       C / 4);
        cudaCheck(cudaGetLastError());
    }
}

static void reset(const Buffers& d) {
    copy_floats(d.dwte, d.dwte0, (size_t)LAB_VP * d.C);
    copy_floats(d.dwpe, d.dwpe0, (size_t)d.T * d.C);
}

// Fresh tokens and gradients; the buckets built on the host as the trainer does (timed), with at
// most bucket_positions positions each.
static void fill(Buffers* d, bool skewed, int bucket_positions, TokenBuckets* tb, double* bucket_ms) {
    size_t bt = (size_t)d->B * d->T;
    fill_tokens(d->tokens, bt, LAB_V, skewed);
    fill_uniform(d->dout, bt * d->C, -1.0f, 1.0f);
    fill_uniform(d->dwte0, (size_t)LAB_VP * d->C, -1.0f, 1.0f);
    fill_uniform(d->dwpe0, (size_t)d->T * d->C, -1.0f, 1.0f);
    std::vector<int> tokens = download_ints(d->tokens, bt);
    double start = wall_seconds();
    token_buckets_build(tb, tokens.data(), (int)bt, LAB_V, bucket_positions);
    *bucket_ms = (wall_seconds() - start) * 1e3;
    d->num_buckets = tb->num_buckets;
    cudaCheck(cudaMemcpy(d->device_num_buckets, &tb->num_buckets, sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d->bucket_tokens, tb->tokens.data(), tb->num_buckets * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d->bucket_starts, tb->starts.data(), (tb->num_buckets + 1) * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d->bucket_positions, tb->positions.data(), bt * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d->bucket_groups, tb->groups.data(), tb->num_buckets * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d->group_bounds, tb->group_bounds.data(), 2 * tb->num_groups * sizeof(int),
                         cudaMemcpyHostToDevice));
}

static double check(const Buffers& d) {
    size_t bt = (size_t)d.B * d.T, n_wte = (size_t)LAB_VP * d.C, n_wpe = (size_t)d.T * d.C;
    int C = d.C;
    std::vector<int> tokens = download_ints(d.tokens, bt);
    std::vector<float> dout = download(d.dout, bt * C), dwte0 = download(d.dwte0, n_wte);
    std::vector<double> dwte_ref(dwte0.begin(), dwte0.end()), dwpe_ref(n_wpe, 0.0);  // dwpe0 is overwritten
    for (size_t i = 0; i < bt; i++) {
        for (int c = 0; c < C; c++) {
            dwte_ref[(size_t)tokens[i] * C + c] += dout[i * C + c];
            dwpe_ref[(i % d.T) * C + c] += dout[i * C + c];
        }
    }
    return std::max(relative_error(download(d.dwte, n_wte), dwte_ref), relative_error(download(d.dwpe, n_wpe), dwpe_ref));
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    Buffers d = {};
    d.B = LAB_B, d.T = LAB_T, d.C = LAB_C;
    size_t bt = (size_t)d.B * d.T, n_wte = (size_t)LAB_VP * d.C, n_wpe = (size_t)d.T * d.C;
    d.dwte = gpu_floats(n_wte), d.dwpe = gpu_floats(n_wpe), d.dwte0 = gpu_floats(n_wte), d.dwpe0 = gpu_floats(n_wpe);
    d.dout = gpu_floats(bt * d.C);
    d.tokens = gpu_ints(bt), d.bucket_tokens = gpu_ints(bt), d.bucket_starts = gpu_ints(bt + 1);
    d.bucket_positions = gpu_ints(bt), d.bucket_groups = gpu_ints(bt), d.group_bounds = gpu_ints(bt + 1);
    d.device_num_buckets = gpu_ints(1);
    d.partials = gpu_floats(bt * d.C);
    d.group_counters = (unsigned int*)gpu_ints(bt);
    cudaCheck(cudaMemset(d.group_counters, 0, bt * sizeof(unsigned int)));
    TokenBuckets tb;
    for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
        if (!variant_selected(variant)) { continue; }
        for (bool skewed : {false, true}) {
            double bucket_ms = 0.0;
            fill(&d, skewed, variant == 2 ? WTE_BUCKET_POSITIONS : INT_MAX, &tb, &bucket_ms);
            reset(d);
            launch_variant(variant, d);
            double error = check(d);
            Launch launch = [&] { launch_variant(variant, d); };
            Launch restore = [&] { reset(d); };
            Determinism det = deterministic(launch, restore, {{d.dwte, n_wte}, {d.dwpe, n_wpe}});
            int distinct = 0, largest = 0, run = 0;  // tokens, and the most frequent one's positions
            for (int i = 0; i < tb.num_buckets; i++) {  // a token's buckets are consecutive
                bool same_token = i > 0 && tb.tokens[i] == tb.tokens[i - 1];
                run = (same_token ? run : 0) + tb.starts[i + 1] - tb.starts[i];
                distinct += same_token ? 0 : 1;
                largest = std::max(largest, run);
            }
            char name[96];
            snprintf(name, sizeof(name), "%s, %s tokens", VARIANT_NAMES[variant], skewed ? "skewed" : "uniform");
            double bytes = ((double)bt * d.C + 2.0 * distinct * d.C + 2.0 * n_wpe) * 4;
            print_row("encoder_backward", name, bench_ms(launch, restore), bytes, CEILING_COPY, error, TOLERANCE, det);
            if (variant == 2) {
                note("%s tokens: %d distinct, the most frequent at %d positions, %d buckets in %d groups; "
                     "token_buckets_build on the host: %.2f ms",
                     skewed ? "skewed" : "uniform", distinct, largest, tb.num_buckets, tb.num_groups, bucket_ms);
            }
        }
    }
    gpu_free_all();
    return lab_finish();
}
