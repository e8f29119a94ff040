/*
Kernel lab: our Hopper GEMM against cuBLASLt. gemm_tf32 is the trainer's (its "Matrix products"
section: TMA loads into a ring of shared-memory stages, a producer warpgroup, two consumer
warpgroups taking turns on wgmma over 128 x 192 tiles, TMA stores from two staging buffers each;
sm_90a), which the trainer runs for the LM head's logits and for fc with the GELU in its epilogue;
gemm_tf32_wide is this file's (cooperative 128 x 256 tiles). Shapes: out (M, N) = inp (M, K) @
weight (N, K)^T + bias for the trainer's linear layers (qkv, attproj, fc, fc + GELU (against
cuBLASLt then gelu_forward, the trainer's other path), fcproj, the LM head, and its logits as the
trainer lays them out, Vp x B*T) at d12 (B = 4 and 16), d24 (B = 16) and d48 (B = 8); the
backward's products in the same form, as the trainer's transposed copies give them (the LM head's
input gradient, K = Vp, and the weight gradients, K = B*T); odd shapes (M and N not multiples of
the tiles, K = 772, the unpadded vocabulary).

  variant 1  cuBLASLt, TF32, bias epilogue (the trainer's matmul_forward)
  variant 2  gemm_tf32, the trainer's (N and K multiples of 4), with the GELU in its epilogue for
             fc + GELU
  variant 3  gemm_tf32_wide: tiles of 128 x 256, both consumers on each tile, TMA stores, 3 stages
  Split TF32 (-f 0, FP32 accuracy), against an FP64 reference like the rest:
  variant 4  the trainer's matmul_split: the operands split into scratch, cuBLASLt's products (hi lo
             + lo hi over the doubled summed dimension, hi hi in chunks of 256)
  variant 5  gemm_split_tf32, the trainer's on Hopper: 128 x 128 tiles, a ring of 4 stages, b split
             in shared memory and a in registers as the stages arrive, three wgmma per k-step, K
             split into parts where the tiles are few; also on the input gradients of fc and qkv
             as the trainer stores their output gradient, transposed ("a_t" shapes: a is (K, M))
  variant 6  gemm_tf32_regs: plain TF32 in variant 5's layout (a through registers, one wgmma a
             k-step) on 128 x 256 tiles; on the a_t shapes too, the weight gradients' among them
             (the output gradient read as stored, (B*T, OC), against cuBLASLt on the transposed copy)

  ./matmul_wgmma [--small] [variant ...]

--small checks only the odd shapes (edge tiles, with and without the GELU), untimed: what
test_other_paths.sh runs under compute-sanitizer's racecheck.

Each shape's launches are an NVTX range of its name, so that ncu can take one shape:
  ncu --nvtx --nvtx-include "d12 B=16 fc/" -k regex:"gemm|sm90" -c 1 --set full ./matmul_wgmma 2

FLOPs counted: 2 M N K (the bias is not counted). The last table gives, per shape, each
variant's time over cuBLASLt's (variant 1).

Measured on an H200 (2026-11-28, session 4; README.md has every table, the forms measured and not
kept, and what each experiment showed): gemm_tf32 against cuBLASLt at d12 B=16 qkv / attproj / fc
/ fcproj / LM head logits: 1.08 / 1.03 / 1.03 / 0.99 / 0.91; fc + GELU against cuBLASLt then
gelu_forward 0.93-0.95 at d12 B=16, d24 and d48 (1.03 at d12 B=4); the logits 0.91-1.00 at every
model size. At equal locked clocks (ncu, one staging buffer) fc was at parity (269 against 266
us). The weight gradients (K = B*T, as few as 72 tiles of 128 x 192 for 132 multiprocessors) take
0.98-1.56 of cuBLASLt's time. So the trainer keeps cuBLASLt except for fc + GELU and the LM head's logits. The error is
6-8e-4 of max |out| against cuBLASLt's 2-3e-4: the tensor cores truncate what TMA brings in to
TF32, cuBLASLt's operands come out rounded.

Split TF32 (session 6, H200): gemm_split_tf32 at 82-102 TFLOP/s of FP32-accurate products, 0.68-1.10
of cuBLASLt's split path's time in its first form and 10-20% faster since (README.md), errors
5-10e-7 of max |out| (cuBLASLt's split path 4-10e-7, plain FP32 6-10e-7); the trainer runs it for
every -f 0 product on Hopper.

Plain TF32 with a through registers (variant 6, session 8, H200): the backward's products at d12
B=16 in 0.99-1.10 of cuBLASLt's time, a read as stored (a_t, against cuBLASLt on the transposed
copy) 3-8% slower than a read along K, attproj's weight gradient 0.71 (K in parts); the forward's
1.05-1.42. Too little to take the transposed copies out of the trainer (README.md).
*/
#include "common.h"

#include <cudaTypedefs.h>
#include <nvtx3/nvToolsExt.h>
#include <cstring>
#include <map>
#include <tuple>

// ----------------------------------------------------------------------------------------------
// The lab's own form beside the trainer's gemm_tf32 (in its "Matrix products" section, with its
// primitives in "Hopper primitives"): cooperative wide tiles.

// An m64n256 wgmma's 128 accumulator registers: their operands %0-%127 and constraints.
#define WG_D128_OPERANDS                                                                                   \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                               \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                     \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                     \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                     \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                     \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                     \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "         \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_D128(d)                                                                                         \
    WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24), WG_D8(d, 32), WG_D8(d, 40), WG_D8(d, 48),        \
        WG_D8(d, 56), WG_D8(d, 64), WG_D8(d, 72), WG_D8(d, 80), WG_D8(d, 88), WG_D8(d, 96), WG_D8(d, 104), \
        WG_D8(d, 112), WG_D8(d, 120)

// The start of the lab's GEMM kernels, both consumers reading every stage: the ring's barriers,
// then the producer warpgroup (thread 0 copies the stages; it and the rest of the warpgroup then
// return false and leave); the consumers get 232 registers a thread and true.
template <int STAGES, int STAGE_FLOATS, bool A_T>
__device__ __forceinline__ bool gemm_lab_start(float* stages, uint64_t* loaded, uint64_t* consumed,
                                               const CUtensorMap* a_map, const CUtensorMap* b_map,
                                               const GemmGrid& grid) {
    if (threadIdx.x == 0) {
        gemm_ring_init(loaded, consumed, STAGES, 256);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        warpgroup_registers_lower<40>();
        if (threadIdx.x == 0) { gemm_produce<STAGES, STAGE_FLOATS, A_T>(stages, loaded, consumed, a_map, b_map, grid); }
        return false;
    }
    warpgroup_registers_raise<232>();
    return true;
}

// d (64 x 256) += A (64 x 8) B (256 x 8)^T, both panels in shared memory
__device__ __forceinline__ void wgmma_64x256_accumulate(float d[128], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
        WG_D128_OPERANDS
        "}, %128, %129, 1, 1, 1;\n"
        : WG_D128(d)
        : "l"(a), "l"(b));
}

// The cooperative wide form: tiles of 128 x GEMM_WIDE_N, both consumers on every tile (rows 0-63
// and 64-127, each one m64n256 wgmma per k-step sharing b's panel), the trainer's producer, ring and
// TMA stores. Per k-step of 8 the multiprocessor's shared memory then serves 20 KB of wgmma reads
// and 12 KB of TMA writes in 256 tensor-core cycles (125 B/cycle), against 12 + 8 KB in 128 cycles
// (160 B/cycle) for 128 x 128 tiles: shared memory gives 128 B/cycle. The tile's stores are not
// hidden under MMAs (both consumers store at once); the producer fills the next tile's stages.
constexpr int GEMM_WIDE_N = 256;

template <int STAGES>
__global__ void __launch_bounds__(GEMM_THREADS, 1) gemm_tf32_wide_kernel(const __grid_constant__ CUtensorMap a_map,
                                                                         const __grid_constant__ CUtensorMap b_map,
                                                                         const __grid_constant__ CUtensorMap out_map,
                                                                         const float* bias, int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ float shared_raw[];
    float* stages = shared_aligned_1024(shared_raw);  // [STAGES][a | b panel]
    constexpr int STAGE_FLOATS = gemm_stage_floats(GEMM_WIDE_N);
    float* staging = stages + STAGES * STAGE_FLOATS;  // [consumer][2][GEMM_STAGING_FLOATS]
    uint64_t* loaded = (uint64_t*)(staging + 4 * GEMM_STAGING_FLOATS);  // [STAGES]: copies landed
    uint64_t* consumed = loaded + STAGES;  // [STAGES]: both consumers' MMAs reading the stage are done
    GemmGrid grid = gemm_grid(M, N, K, GEMM_WIDE_N, 1);
    if (!gemm_lab_start<STAGES, STAGE_FLOATS, false>(stages, loaded, consumed, &a_map, &b_map, grid)) { return; }
    int consumer = threadIdx.x / 128 - 1, staged = 0;
    for (int j = 0, item = blockIdx.x; item < grid.items; j++, item += gridDim.x) {
        int2 origin = gemm_work(item, grid).origin;
        float acc[GEMM_WIDE_N / 2] = {};  // rows 64 * consumer onwards
        int first = j * grid.k_tiles;
        for (int kt = 0; kt < grid.k_tiles; kt++) {
            int n = first + kt, slot = n % STAGES;
            mbarrier_wait(&loaded[slot], (n / STAGES) & 1);
            const float* a = stages + slot * STAGE_FLOATS + consumer * 64 * 32;
            const float* b = stages + slot * STAGE_FLOATS + GEMM_TILE_M * 32;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                wgmma_64x256_accumulate(acc, wgmma_descriptor(a + 8 * ks), wgmma_descriptor(b + 8 * ks));
            }
            wgmma_commit();
            wgmma_wait_one();  // the stage before this one is read: free it
            if (kt > 0) { mbarrier_arrive(&consumed[(n - 1) % STAGES]); }
        }
        wgmma_wait_all();
        mbarrier_arrive(&consumed[(first + grid.k_tiles - 1) % STAGES]);
        pin_registers<GEMM_WIDE_N / 2>(acc);
        gemm_store_tma<GEMM_WIDE_N, false>(&out_map, nullptr, bias, staging + 2 * consumer * GEMM_STAGING_FLOATS,
                                           staged, acc, origin.x + 64 * consumer, origin.y, N, 1 + consumer);
    }
    if (threadIdx.x % 128 == 0) { bulk_wait_all(); }
#endif
}

template <int STAGES>
static void gemm_tf32_wide(float* out, const float* a, const float* b, const float* bias, int M, int N, int K) {
    constexpr size_t shared = gemm_shared_bytes(STAGES, GEMM_WIDE_N);
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gemm_tf32_wide_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared));
        configured = true;
    }
    CUtensorMap a_map = tensor_map_panels(a, M, K, K, GEMM_TILE_M), b_map = tensor_map_panels(b, N, K, K, GEMM_WIDE_N);
    CUtensorMap out_map = tensor_map_panels(out, M, N, N, 64);
    int grid = std::min(gemm_grid(M, N, K, GEMM_WIDE_N, 1).items, g_num_sms);
    gemm_tf32_wide_kernel<STAGES><<<grid, GEMM_THREADS, shared>>>(a_map, b_map, out_map, bias, M, N, K);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// Variant 6: plain TF32 with a through registers, the split kernel's layout with one MMA a k-step
// (issue 52's question: can a TF32 product read an output gradient as stored, (K, M), so that no
// transposed copy of it is written?). Both consumers take every tile of 128 x GEMM_REGS_N (rows
// 0-63 and 64-127), load their rows of a as fragments (ldmatrix, or a value at a time from a
// stored transposed), round them to TF32 and issue a k-step's m64n256 wgmma; K split into parts
// where the tiles are few (partial sums added in part order, as gemm_split_tf32). A ring of 4
// stages of 48 KB and one staging buffer a consumer (225 KB); a consumer drains its MMAs every
// GEMM_REGS_GROUP stages (README: what ptxas does otherwise).

// d (64 x 256) = [d +] A (64 x 8, registers) * B (256 x 8, shared)^T
__device__ __forceinline__ void wgmma_64x256_registers(float d[128], const float a[4], uint64_t b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
        WG_D128_OPERANDS
        "}, {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
        : WG_D128(d)
        : WG_A4(a), "l"(b), "r"((int)accumulate));
}

constexpr int GEMM_REGS_N = 256, GEMM_REGS_STAGES = 4, GEMM_REGS_BUFFERS = 1;
[[maybe_unused]] constexpr int GEMM_REGS_GROUP = 8;  // stages between drains of the MMAs (2, 4: slower)
constexpr size_t GEMM_REGS_SHARED =
    GEMM_REGS_STAGES * (gemm_stage_floats(GEMM_REGS_N) * sizeof(float) + 2 * sizeof(uint64_t)) +
    2 * GEMM_REGS_BUFFERS * GEMM_STAGING_FLOATS * sizeof(float) + 1024;

// A consumer's stage n: its a fragments into a (untouched until the MMAs reading them are done),
// its k-steps' MMAs as one group; once the group before is done, that stage is freed and its
// fragments, a_before, are kept live to this point (so that no register of theirs is reused while
// MMAs read them).
template <bool A_T>
__device__ __forceinline__ void gemm_regs_stage(float acc[GEMM_REGS_N / 2], float a[4][4], float a_before[4][4],
                                                const float* stages, uint64_t* loaded, uint64_t* consumed, int n,
                                                bool start, bool free_previous, int consumer) {
    float unused[4][4];  // the lo parts, never computed
    int slot = n % GEMM_REGS_STAGES;
    mbarrier_wait(&loaded[slot], (n / GEMM_REGS_STAGES) & 1);
    const float* stage = stages + (size_t)slot * gemm_stage_floats(GEMM_REGS_N);
    const float* b = stage + GEMM_TILE_M * 32;
    gemm_split_fragments<A_T>(a, unused, stage, 64 * consumer + 16 * (threadIdx.x % 128 / 32));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        wgmma_64x256_registers(acc, a[ks], wgmma_descriptor(b + 8 * ks), !start || ks > 0);
    }
    wgmma_commit();
    wgmma_wait_one();
    pin_registers<16>(&a_before[0][0]);
    if (free_previous) { mbarrier_arrive(&consumed[(n - 1) % GEMM_REGS_STAGES]); }
}

template <bool A_T>
__global__ void __launch_bounds__(GEMM_THREADS, 1) gemm_tf32_regs_kernel(
    const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
    const __grid_constant__ CUtensorMap out_map, const __grid_constant__ CUtensorMap partials_map,
    const float* bias, int M, int N, int K, int k_parts, int rows_pad) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int STAGES = GEMM_REGS_STAGES, STAGE_FLOATS = gemm_stage_floats(GEMM_REGS_N);
    constexpr int BUFFERS = GEMM_REGS_BUFFERS;
    extern __shared__ float shared_raw[];
    float* stages = shared_aligned_1024(shared_raw);  // [STAGES][a | b]
    float* staging = stages + STAGES * STAGE_FLOATS;  // [consumer][BUFFERS][GEMM_STAGING_FLOATS]
    uint64_t* loaded = (uint64_t*)(staging + 2 * BUFFERS * GEMM_STAGING_FLOATS);
    uint64_t* consumed = loaded + STAGES;
    GemmGrid grid = gemm_grid(M, N, K, GEMM_REGS_N, k_parts);
    if (!gemm_lab_start<STAGES, STAGE_FLOATS, A_T>(stages, loaded, consumed, &a_map, &b_map, grid)) { return; }
    int consumer = threadIdx.x / 128 - 1, staged = 0, n = 0;  // n: stages taken so far
    float* staging_buffers = staging + consumer * BUFFERS * GEMM_STAGING_FLOATS;
    for (int item = blockIdx.x; item < grid.items; item += gridDim.x) {
        GemmWork work = gemm_work(item, grid);
        float acc[GEMM_REGS_N / 2];  // the tile's first MMA starts it
        // stages in groups of GEMM_REGS_GROUP, each group's MMAs drained at its end (MMAs in flight
        // across the loop's back edge, reading registers, make ptxas serialise every wgmma); two
        // fragment sets in turn: one's read by MMAs while the other's load
        float a[2][4][4];
        for (int kt = 0; kt < work.k_tiles; kt += GEMM_REGS_GROUP) {
#pragma unroll
            for (int g = 0; g < GEMM_REGS_GROUP; g++) {
                if (kt + g == work.k_tiles) { break; }
                gemm_regs_stage<A_T>(acc, a[g & 1], a[(g + 1) & 1], stages, loaded, consumed, n++, kt + g == 0, g > 0,
                                     consumer);
            }
            wgmma_wait_all();
            pin_registers<GEMM_REGS_N / 2>(acc);
            pin_registers<32>(&a[0][0][0]);
            mbarrier_arrive(&consumed[(n - 1) % STAGES]);
        }
        int row0 = work.origin.x + 64 * consumer;
        bool first = work.part == 0;
        gemm_store_tma<GEMM_REGS_N, false, BUFFERS>(first ? &out_map : &partials_map, nullptr, first ? bias : nullptr,
                                                    staging_buffers, staged, acc,
                                                    first ? row0 : (work.part - 1) * rows_pad + row0, work.origin.y, N,
                                                    1 + consumer);
    }
    if (threadIdx.x % 128 == 0) { bulk_wait_all(); }
#endif
}

// out = a b^T + bias (bias optional), a stored (M, K) or, with a_t, (K, M); partials: scratch for the
// parts along K from part 1 on.
static void gemm_tf32_regs(float* out, const float* a, bool a_t, const float* b, const float* bias, int M, int N, int K,
                           float* partials, size_t partial_floats) {
    auto kernel = a_t ? gemm_tf32_regs_kernel<true> : gemm_tf32_regs_kernel<false>;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMM_REGS_SHARED));
    constexpr double STAGE_US = 2.0 * GEMM_TILE_M * GEMM_REGS_N * 32 / 2.6e6;  // one MMA at 2.6 TFLOP/s
    int k_parts = gemm_parts(M, N, K, GEMM_REGS_N, STAGE_US, partial_floats);
    GemmGrid grid = gemm_grid(M, N, K, GEMM_REGS_N, k_parts);
    int rows_pad = grid.row_tiles * GEMM_TILE_M;
    CUtensorMap a_map = a_t ? tensor_map_panels(a, K, M, M, 32) : tensor_map_panels(a, M, K, K, GEMM_TILE_M);
    CUtensorMap b_map = tensor_map_panels(b, N, K, K, GEMM_REGS_N);
    CUtensorMap out_map = tensor_map_panels(out, M, N, N, 64);
    CUtensorMap partials_map =
        k_parts > 1 ? tensor_map_panels(partials, (size_t)(k_parts - 1) * rows_pad, N, N, 64) : out_map;
    kernel<<<std::min(grid.items, g_num_sms), GEMM_THREADS, GEMM_REGS_SHARED>>>(a_map, b_map, out_map, partials_map,
                                                                                bias, M, N, K, k_parts, rows_pad);
    cudaCheck(cudaGetLastError());
    if (k_parts > 1) { sum_arrays(out, out, partials, gemm_part_floats(M, N), k_parts - 1, (size_t)M * N, 0); }
}

// ----------------------------------------------------------------------------------------------
// The lab

constexpr int NUM_VARIANTS = 6;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 cuBLASLt TF32 + bias (matmul_forward)",
    "2 gemm_tf32 (the trainer's: 128 x 192, TMA stores)",
    "3 gemm_tf32_wide (128 x 256, cooperative, TMA stores, 3 stages)",
    "4 cuBLASLt split TF32 (-f 0's matmul_split)",
    "5 gemm_split_tf32 (ours, split TF32 in one pass)",
    "6 gemm_tf32_regs (a in registers, 128 x 256, 4 stages)",
};

// Relative to max |out|: both operands read as TF32 (10 mantissa bits; the tensor cores drop the
// rest), the errors of K products adding up at random (measured: cuBLASLt 2-3e-4).
constexpr double TF32_TOLERANCE = 5e-3;
// Split TF32: FP32's, sums of K products (~sqrt(K) * 6e-8), as matmul_forward.cu holds it.
constexpr double FP32_TOLERANCE = 1e-5;
static double tolerance(int variant) { return variant == 4 || variant == 5 ? FP32_TOLERANCE : TF32_TOLERANCE; }

struct Shape {
    std::string name;
    int M, N, K;
    bool has_bias;
    bool gelu = false;  // also GELU(out) into gelu_out (the fc layer)
    bool a_t = false;   // inp stored transposed, (K, M): variants 4 to 6 only
};

struct Buffers {
    float *out, *gelu_out, *inp, *weight, *bias;
    float* inp_t;  // inp transposed, for the a_t shapes
};

// Ours store through TMA: rows of out and of the operands 16-byte aligned. Only variants 1 and 2
// have the GELU.
static bool runs_on(int variant, const Shape& s) {
    if ((s.gelu && variant > 2) || (s.a_t && variant < 4) || (s.a_t && s.M % 4 != 0)) { return false; }
    return variant == 1 || variant == 4 || (s.N % 4 == 0 && s.K % 4 == 0);
}

// Variant 1 with GELU is the trainer's other fc_forward path: cuBLASLt, then gelu_forward.
static void launch_variant(int variant, const Buffers& d, const Shape& s) {
    const float* bias = s.has_bias ? d.bias : nullptr;
    float* gelu_out = s.gelu ? d.gelu_out : nullptr;
    if (variant == 1) {
        matmul_forward(d.out, d.inp, d.weight, bias, s.M, s.K, s.N);
        if (s.gelu) { gelu_forward(gelu_out, d.out, (size_t)s.M * s.N); }
    } else if (variant == 2) {
        gemm_tf32(d.out, gelu_out, d.inp, d.weight, bias, s.M, s.N, s.K);
    } else if (variant == 3) {
        gemm_tf32_wide<3>(d.out, d.inp, d.weight, bias, s.M, s.N, s.K);
    } else if (variant == 4) {  // matmul_forward's shape, in cuBLAS's terms
        MatmulShape shape = {.m = s.N, .n = s.M, .k = s.K, .trans_a = true, .trans_b = s.a_t, .lda = s.K,
                             .ldb = s.a_t ? s.M : s.K, .batch = 1, .stride_a = 0, .stride_b = 0, .stride_out = 0,
                             .tf32 = true};
        matmul_split(d.out, d.weight, s.a_t ? d.inp_t : d.inp, bias, shape, 1.0f, 0.0f, 0);
    } else if (variant == 5) {
        gemm_split_tf32(d.out, s.a_t ? d.inp_t : d.inp, s.a_t, d.weight, bias, s.M, s.N, s.K, false, g_split_scratch[0],
                        g_split_scratch_floats[0]);
    } else {
        gemm_tf32_regs(d.out, s.a_t ? d.inp_t : d.inp, s.a_t, d.weight, bias, s.M, s.N, s.K, g_split_scratch[0],
                       g_split_scratch_floats[0]);
    }
}

// Max relative error of out (and of gelu_out) against the CPU (linear_check); infinite if any
// element is not finite.
static double check_variant(const Buffers& d, const Shape& s, int variant) {
    Launch launch = [&] {
        if (s.a_t) { transpose_matrices(d.inp_t, d.inp, s.M, s.K, 1); }  // linear_check's inp, as the variant reads it
        launch_variant(variant, d, s);
    };
    LinearCheck check = linear_check(d.inp, d.weight, s.has_bias ? d.bias : nullptr, d.out,
                                     s.gelu ? d.gelu_out : nullptr, s.M, s.N, s.K, launch);
    double error = error_value(check.out);
    if (s.gelu) { error = std::max(error, error_value(check.gelu)); }
    return check.finite ? error : INFINITY;
}

static std::map<std::string, std::map<int, double>> g_times;  // shape -> variant -> ms

// Each shape's launches in an NVTX range of its name, for ncu: ncu --nvtx --nvtx-include "d12 B=16 fc/"
static void run_shape(const Buffers& d, const Shape& s, int variant, bool timed) {
    nvtxRangePushA(s.name.c_str());
    double error = check_variant(d, s, variant);
    char name[128];
    snprintf(name, sizeof(name), "%s, %s", VARIANT_NAMES[variant], s.name.c_str());
    if (!timed) {
        print_row("matmul_wgmma", name, NAN, 2.0 * s.M * s.N * s.K, CEILING_TF32, error, tolerance(variant),
                  DETERMINISM_UNCHECKED);
        nvtxRangePop();
        return;
    }
    size_t n_out = (size_t)s.M * s.N;
    Launch launch = [&] { launch_variant(variant, d, s); };
    Launch poison_outputs = [&] {
        poison(d.out, n_out);
        if (s.gelu) { poison(d.gelu_out, n_out); }
    };
    std::vector<Output> outputs = {{d.out, n_out}};
    if (s.gelu) { outputs.push_back({d.gelu_out, n_out}); }
    Determinism det = deterministic(launch, poison_outputs, outputs);
    double ms = bench_ms(launch);
    g_times[s.name][variant] = ms;
    print_row("matmul_wgmma", name, ms, 2.0 * s.M * s.N * s.K, CEILING_TF32, error, tolerance(variant), det);
    nvtxRangePop();
}

// The trainer's five linear layers of a model of C channels over M rows.
static void add_layers(std::vector<Shape>* shapes, const char* model, int B, int C) {
    int M = B * LAB_T;
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "%s B=%d ", model, B);
    std::string p = prefix;
    shapes->push_back({p + "qkv", M, 3 * C, C, true});
    shapes->push_back({p + "attproj", M, C, C, true});
    shapes->push_back({p + "fc", M, 4 * C, C, true});
    shapes->push_back({p + "fc + gelu", M, 4 * C, C, true, true});
    shapes->push_back({p + "fcproj", M, C, 4 * C, true});
    shapes->push_back({p + "lm head", M, LAB_VP, C, false});
    shapes->push_back({p + "lm head logits_t", LAB_VP, M, C, false});  // the trainer's orientation
    // the backward's products in the same form, on the trainer's transposed copies: the LM head's
    // input gradient (K = Vp) and weight gradients (K = B*T)
    shapes->push_back({p + "lm head dinp", M, C, LAB_VP, false});
    shapes->push_back({p + "fc dinp", M, C, 4 * C, false});
    shapes->push_back({p + "fc dinp a_t", M, C, 4 * C, false, false, true});
    shapes->push_back({p + "qkv dinp", M, C, 3 * C, false});
    shapes->push_back({p + "qkv dinp a_t", M, C, 3 * C, false, false, true});
    shapes->push_back({p + "lm head dweight", LAB_VP, C, M, false});
    // and with the output gradient read as stored, (B*T, OC): a_t (variants 4-6)
    for (const auto& [name, OC, IC] : {std::tuple{"qkv", 3 * C, C}, {"attproj", C, C}, {"fc", 4 * C, C},
                                       {"fcproj", C, 4 * C}}) {
        shapes->push_back({p + name + " dweight", OC, IC, M, false});
        shapes->push_back({p + name + " dweight a_t", OC, IC, M, false, false, true});
    }
}

int main(int argc, char** argv) {
    bool small = argc > 1 && strcmp(argv[1], "--small") == 0;
    lab_init(argc - small, argv + small, NUM_VARIANTS);
    if (!g_wgmma) {
        printf("SKIPPED: gemm_tf32 needs the sm_90a build on a Hopper GPU\n");
        return 0;
    }
    std::vector<Shape> shapes = {{"odd 1000x1001x772", 1000, 1001, 772, true},
                                 {"odd 333x50257x768", 333, LAB_V, 768, false},
                                 {"odd 1000x1004x772", 1000, 1004, 772, true},
                                 {"odd 1000x1004x772 + gelu", 1000, 1004, 772, true, true},
                                 {"odd 1000x1004x772 a_t", 1000, 1004, 772, true, false, true}};
    if (!small) {
        add_layers(&shapes, "d12", 4, 768);
        add_layers(&shapes, "d12", 16, 768);
        add_layers(&shapes, "d24", 16, 1024);
        add_layers(&shapes, "d48", 8, 1600);
    }
    size_t max_out = 0, max_inp = 0, max_weight = 0, max_n = 0, max_partials = 0;
    for (const Shape& s : shapes) {
        max_partials = std::max(max_partials, split_partial_floats(s.N, s.M, s.K));
        max_out = std::max(max_out, (size_t)s.M * s.N);
        max_inp = std::max(max_inp, (size_t)s.M * s.K);
        max_weight = std::max(max_weight, (size_t)s.N * s.K);
        max_n = std::max(max_n, (size_t)s.N);
    }
    // matmul_split's operands and partial sums (gemm_split_tf32 takes its parts' partials from the same)
    if (variant_selected(4) || variant_selected(5) || variant_selected(6)) {
        split_scratch_reserve(2 * (max_inp + max_weight) + 4 + max_partials, 0);
    }
    Buffers d = {gpu_floats(max_out), gpu_floats(max_out), gpu_floats(max_inp), gpu_floats(max_weight),
                 gpu_floats(max_n), gpu_floats(max_inp)};
    for (const Shape& s : shapes) {
        for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
            if (variant_selected(variant) && runs_on(variant, s)) { run_shape(d, s, variant, !small); }
        }
    }
    if (!small) {
        note("time over cuBLASLt's (variant 1), per shape: variants 2 3 6; split TF32: 5 over 4; an a_t shape over "
             "its twin's variant 1 and 4 (cuBLASLt on the transposed copy)");
    }
    for (const Shape& s : shapes) {
        std::map<int, double>& t = g_times[s.name];
        const std::string twin = s.a_t ? s.name.substr(0, s.name.size() - 4) : s.name;  // less " a_t"
        std::map<int, double>& base_times = g_times[twin];
        if (base_times.count(1) == 0 && t.count(4) == 0) { continue; }
        std::string row = s.name + ":";
        for (int v : {2, 3, 6, 5}) {
            double base = v == 5 ? (t.count(4) ? t[4] : NAN) : (base_times.count(1) ? base_times[1] : NAN);
            char cell[32];
            snprintf(cell, sizeof(cell), " %.3f", t.count(v) ? t[v] / base : NAN);
            row += cell;
        }
        note("%s", row.c_str());
    }
    gpu_free_all();
    return lab_finish();
}
