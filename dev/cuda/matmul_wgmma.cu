/*
Kernel lab: a Hopper GEMM of our own (gemm_tf32 below: TMA loads into a ring of shared-memory stages,
a producer warpgroup, two consumer warpgroups taking turns on wgmma; sm_90a) against cuBLASLt on the trainer's
linear layers, out (M, N) = inp (M, K) @ weight (N, K)^T + bias: qkv, attproj, fc, fcproj and the
LM head at d12 (B = 4 and 16), d24 (B = 16) and d48 (B = 8), and on odd shapes (N and M not
multiples of the tiles, K = 772, the unpadded vocabulary).

  variant 1  cuBLASLt, TF32, bias epilogue (the trainer's matmul_forward)
  variant 2  gemm_tf32, a ring of 6 stages
  variant 3  gemm_tf32, a ring of 4 stages
  Fusion (b), the MLP's up-projection and its GELU (fc shapes only), both outputs written:
  variant 4  gemm_tf32 (6 stages) with the GELU in its epilogue
  variant 5  cuBLASLt with bias, then the trainer's gelu_forward (what the trainer does today)
  variant 6  gemm_tf32_wide: tiles of 128 x 256, both consumers on each tile (4 stages)
  variant 7  gemm_tf32_wide with its stores through shared memory and TMA (N a multiple of 4)
  variant 8  gemm_tf32 on tiles of 128 x 192 a consumer (5 stages)
  variant 9  gemm_tf32 (4 stages) with its stores through shared memory and TMA (N a multiple of 4)
  variant 10 gemm_tf32 on tiles of 128 x 192 (4 stages), TMA stores (N a multiple of 4)

Besides the forward's products, the LM head's input gradient (K = Vp) and the weight gradients
(K = B*T) in the same form, as the trainer's transposed copies give them.

  ./matmul_wgmma [variant ...]

Each shape's launches are an NVTX range of its name, so that ncu can take one shape:
  ncu --nvtx --nvtx-include "d12 B=16 fc/" -k regex:"gemm|sm90" -c 1 --set full ./matmul_wgmma 10

FLOPs counted: 2 M N K (the bias and the GELU are not counted). The last table gives, per shape,
each variant's time over cuBLASLt's (variant 1).

Measured on an H200 (2026-11-28; README.md has the tables and what each experiment showed):
the best form, variant 10, against cuBLASLt at d12 B=16 qkv / attproj / fc / fcproj / LM head:
1.11 / 1.06 / 1.05 / 0.98 / 0.85-0.93 (variant 3: 1.20 / 1.19 / 1.15 / 1.13 / 1.00); at equal
locked clocks (ncu) fc is at parity (269 against 266 us), ours on 132 multiprocessors with the
tensor pipe busy 87% of their time, cuBLASLt's on 120 at 95%. The weight gradients (K = B*T,
as few as 72 tiles of 128 x 192 for 132 multiprocessors) lose by 7-50%. So the trainer keeps cuBLASLt; the LM head's
forward product is the one shape won at every model size (0.85-0.97). The GELU epilogue costs
1.05-1.10x of cuBLASLt + gelu_forward. A build whose consumers skip their stores ran 0.82-0.95
of cuBLASLt: the epilogue, not the MMA loop, costs what is left.
Its error is 6-8e-4 against cuBLASLt's 2-3e-4: the tensor cores truncate what TMA brings in to
TF32, cuBLASLt's operands come out rounded.
*/
#include "common.h"

#include <cudaTypedefs.h>
#include <nvtx3/nvToolsExt.h>
#include <map>

// ----------------------------------------------------------------------------------------------
// The GEMM's Hopper primitives beyond the trainer's (its "Hopper primitives" section): TMA
// copies completing on mbarriers, the 64 x 128 wgmma, register budgets per warpgroup.

// Waits until at most one committed group of this warpgroup's MMAs is still running.
__device__ __forceinline__ void wgmma_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// d (64 x 128) += A (64 x 8) B (128 x 8)^T, both panels in shared memory
__device__ __forceinline__ void wgmma_64x128_accumulate(float d[64], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, 1, 1, 1;\n"
        : WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24),
          WG_D8(d, 32), WG_D8(d, 40), WG_D8(d, 48), WG_D8(d, 56)
        : "l"(a), "l"(b));
}

// d (64 x 192) += A (64 x 8) B (192 x 8)^T, both panels in shared memory
__device__ __forceinline__ void wgmma_64x192_accumulate(float d[96], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n192k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
        "}, %96, %97, 1, 1, 1;\n"
        : WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24), WG_D8(d, 32), WG_D8(d, 40), WG_D8(d, 48),
          WG_D8(d, 56), WG_D8(d, 64), WG_D8(d, 72), WG_D8(d, 80), WG_D8(d, 88)
        : "l"(a), "l"(b));
}

// The 64 x TILE_N wgmma above of that width.
template <int TILE_N>
__device__ __forceinline__ void wgmma_64xn_accumulate(float d[TILE_N / 2], uint64_t a, uint64_t b) {
    static_assert(TILE_N == 128 || TILE_N == 192, "wgmma of 64 x 128 or 64 x 192");
    if constexpr (TILE_N == 128) { wgmma_64x128_accumulate(d, a, b); } else { wgmma_64x192_accumulate(d, a, b); }
}

// d (64 x 256) += A (64 x 8) B (256 x 8)^T, both panels in shared memory
__device__ __forceinline__ void wgmma_64x256_accumulate(float d[128], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, 1, 1, 1;\n"
        : WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24), WG_D8(d, 32), WG_D8(d, 40), WG_D8(d, 48),
          WG_D8(d, 56), WG_D8(d, 64), WG_D8(d, 72), WG_D8(d, 80), WG_D8(d, 88), WG_D8(d, 96), WG_D8(d, 104),
          WG_D8(d, 112), WG_D8(d, 120)
        : "l"(a), "l"(b));
}

// mbarriers in shared memory: a phase completes when its count of arrivals has come and the bytes
// announced by expect_bytes have landed; waits name the phase's parity (0, 1, 0, ...).
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals));
}
// The inits, visible to the copy engine (then a barrier of the block).
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}

// Arrives and announces `bytes` that copies will bring in this phase.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* barrier, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(shared_address(barrier)), "r"(parity)
            : "memory");
    }
}

// The box of a 2D tensor map at (col, row) into shared memory, completing on barrier.
__device__ __forceinline__ void tma_load_2d(float* dst, const CUtensorMap* map, int col, int row, uint64_t* barrier) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(shared_address(dst)), "l"(map), "r"(col), "r"(row), "r"(shared_address(barrier))
        : "memory");
}

// The box of a 2D tensor map at (col, row) from shared memory (what lies outside the tensor is not
// written), in this thread's bulk group; commit, then wait until the group has read shared memory
// (the buffer is free) or has written all of it.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int col, int row, const float* src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 ::"l"(map), "r"(col), "r"(row), "r"(shared_address(src)) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// A barrier of `threads` threads on hardware barrier `id` (1-15; 0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// A warpgroup's registers per thread, raised or lowered (the kernel's cap at entry must allow the total).
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_registers_raise() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ __forceinline__ void warpgroup_registers_lower() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}

// cuTensorMapEncodeTiled, the driver's, reached through the runtime (no link to libcuda).
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (encode == nullptr) {
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault,
                                                   &found));
#else
        cudaCheck(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void**)&encode, cudaEnableDefault, &found));
#endif
        if (found != cudaDriverEntryPointSuccess) { fail("the CUDA driver has no cuTensorMapEncodeTiled"); }
    }
    return encode;
}

// A row-major (rows, cols) float matrix, leading dimension ld (a multiple of 4, 16-byte aligned base),
// copied in boxes of box_rows x 32 columns into 128-byte-swizzled panels; reads past the edges give 0.
static CUtensorMap tensor_map_panels(const float* base, size_t rows, size_t cols, size_t ld, int box_rows) {
    CUtensorMap map;
    cuuint64_t dims[2] = {cols, rows}, strides[1] = {ld * sizeof(float)};
    cuuint32_t box[2] = {32, (cuuint32_t)box_rows}, element_strides[2] = {1, 1};
    CUresult result = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void*)base, dims, strides, box,
                                           element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) { fail("tensor map of a %zu x %zu matrix (ld %zu): error %d", rows, cols, ld, (int)result); }
    return map;
}

// ----------------------------------------------------------------------------------------------
// Our GEMM on Hopper (sm_90a, TF32): out (M, N) = a (M, K) b (N, K)^T, both operands row-major with
// the summed dimension contiguous (a linear layer's input and weight as stored), then its epilogue:
// + bias[col], and gelu(out) written beside out where asked. A persistent CTA per multiprocessor
// takes tiles of GEMM_TILE x TILE_N (128 or 192) of out, blockIdx.x, + gridDim.x, ..., in turn to
// its two consumer warpgroups (ping-pong): their main loops take turns (each waits for the other's
// to end), so that while one multiplies its tile the other stores its last one under the MMAs. One
// thread of warpgroup 0 issues the TMA copies of every stage (GEMM_TILE x 32 of a, TILE_N x 32 of
// b) into a ring of STAGES, in tile order, running ahead into the next tile; a consumer multiplies
// 2 x 64 rows by TILE_N per stage (4 wgmma k-steps of 8), keeps one stage's MMAs in flight, and frees
// a stage once the MMAs reading it are done. With TMA_STORE a consumer's tile leaves through its
// 16 KB staging buffer (gemm_store_tma), else by float2 stores from the registers (gemm_store).
// Each output has one writer that sums k in order:
// bit-identical run to run. Tiles are numbered in groups of GEMM_GROUP_ROWS row tiles, the column
// tiles swept within a group, so that the CTAs at work at once share their operands in L2.
constexpr int GEMM_TILE = 128;         // rows and columns of out per tile
constexpr int GEMM_THREADS = 384;      // the producer warpgroup, then the two consumers
constexpr int GEMM_GROUP_ROWS = 16;    // row tiles per group of the raster
// A stage of tiles of GEMM_TILE x tile_n: a's panel, then b's.
__host__ __device__ constexpr int gemm_stage_floats(int tile_n) { return (GEMM_TILE + tile_n) * 32; }

struct GemmEpilogue {
    const float* bias;  // (N), or nullptr
    float* gelu_out;    // (M, N): gelu(out), or nullptr
};

constexpr int GEMM_STORE_COLS = 64;  // columns of out a consumer stages per TMA store (two 32-column panels)
constexpr int GEMM_STAGING_FLOATS = 64 * GEMM_STORE_COLS;  // a consumer's staging buffer

// The dynamic shared memory of a ring of STAGES: the stages, each consumer's staging buffer (TMA
// stores), the barriers, 1 KB for the alignment.
constexpr size_t gemm_shared_bytes(int stages, int tile_n, bool tma_store = false) {
    return (size_t)stages * (gemm_stage_floats(tile_n) * sizeof(float) + 2 * sizeof(uint64_t)) + 2 * sizeof(uint64_t) +
           (tma_store ? 2 * GEMM_STAGING_FLOATS * sizeof(float) : 0) + 1024;
}

// The first row and column of out of tile `tile` (GEMM_TILE x tile_n) in the grouped raster.
__device__ __forceinline__ int2 gemm_tile_origin(int tile, int row_tiles, int col_tiles, int tile_n) {
    int group = tile / (GEMM_GROUP_ROWS * col_tiles), first_row_tile = group * GEMM_GROUP_ROWS;
    int group_rows = min(GEMM_GROUP_ROWS, row_tiles - first_row_tile);
    int in_group = tile - group * GEMM_GROUP_ROWS * col_tiles;
    return make_int2((first_row_tile + in_group % group_rows) * GEMM_TILE, in_group / group_rows * tile_n);
}

// 64 rows x COLS of a consumer warpgroup's accumulator (the accumulator fragment of the trainer's
// "Hopper primitives") through the epilogue into out at (row0, col0). The epilogue's code runs
// while the other consumer's MMAs do, from the same instruction caches, so it is kept short (a
// per-element edge check unrolled over 128 registers made the kernel 157 KB and the GELU form
// 2.7x slower): a tile wholly inside out, N even, takes float2 stores unrolled over the registers;
// an edge tile copies the accumulator to local memory and walks it in a rolled loop.
template <int COLS>
__device__ __forceinline__ void gemm_store(float* out, GemmEpilogue epilogue, const float acc[COLS / 2], int row0,
                                           int col0, int M, int N) {
    int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4, row = row0 + 16 * (threadIdx.x % 128 / 32) + g;
    if (row0 + 64 <= M && col0 + COLS <= N && N % 2 == 0) {
        float* out_row = out + (size_t)row * N + col0 + 2 * q;
        const float* bias = epilogue.bias != nullptr ? epilogue.bias + col0 + 2 * q : nullptr;
        float* gelu_row = epilogue.gelu_out != nullptr ? epilogue.gelu_out + (size_t)row * N + col0 + 2 * q : nullptr;
#pragma unroll
        for (int n = 0; n < COLS / 8; n++) {
            float2 b = bias != nullptr ? *(const float2*)(bias + 8 * n) : make_float2(0.0f, 0.0f);
            float2 top = make_float2(acc[4 * n] + b.x, acc[4 * n + 1] + b.y);
            float2 bottom = make_float2(acc[4 * n + 2] + b.x, acc[4 * n + 3] + b.y);
            *(float2*)(out_row + 8 * n) = top;
            *(float2*)(out_row + (size_t)8 * N + 8 * n) = bottom;
            if (gelu_row != nullptr) {
                *(float2*)(gelu_row + 8 * n) = make_float2(gelu(top.x), gelu(top.y));
                *(float2*)(gelu_row + (size_t)8 * N + 8 * n) = make_float2(gelu(bottom.x), gelu(bottom.y));
            }
        }
        return;
    }
    float values[COLS / 2];  // local memory: the rolled loop indexes it
#pragma unroll
    for (int i = 0; i < COLS / 2; i++) { values[i] = acc[i]; }
#pragma unroll 1
    for (int i = 0; i < COLS / 2; i++) {
        int r = row + 8 * (i / 2 % 2), col = col0 + 8 * (i / 4) + 2 * q + i % 2;
        if (r >= M || col >= N) { continue; }
        float x = values[i] + (epilogue.bias != nullptr ? epilogue.bias[col] : 0.0f);
        out[(size_t)r * N + col] = x;
        if (epilogue.gelu_out != nullptr) { epilogue.gelu_out[(size_t)r * N + col] = gelu(x); }
    }
}

// 64 rows x COLS of a consumer's accumulator + bias into out at (row0, col0) through TMA stores: per
// 64 columns, the values are written into staging (two 128-byte-swizzled panels, the swizzle sparing
// shared memory's banks), then one thread stores both panels and goes on; before the next chunk is
// written that thread waits until the last store has read the buffer. The stores drain while the
// consumer multiplies its next tile. TMA leaves out what lies outside out (edge tiles).
template <int COLS>
__device__ __forceinline__ void gemm_store_tma(const CUtensorMap* out_map, const float* bias, float* staging,
                                               const float acc[COLS / 2], int row0, int col0, int N, int barrier_id) {
    int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4, row = 16 * (threadIdx.x % 128 / 32) + g;
    bool leader = threadIdx.x % 128 == 0;
#pragma unroll
    for (int chunk = 0; chunk < COLS / GEMM_STORE_COLS; chunk++) {
        if (leader) { bulk_wait_read(); }
        named_barrier(barrier_id, 128);
#pragma unroll
        for (int n = 0; n < GEMM_STORE_COLS / 8; n++) {
            int c = 8 * n + 2 * q, col = col0 + chunk * GEMM_STORE_COLS + c, i = 4 * (chunk * GEMM_STORE_COLS / 8 + n);
            float2 b = bias != nullptr && col < N ? *(const float2*)(bias + col) : make_float2(0.0f, 0.0f);
            *(float2*)(staging + panel_offset(row, c, 64)) = make_float2(acc[i] + b.x, acc[i + 1] + b.y);
            *(float2*)(staging + panel_offset(row + 8, c, 64)) = make_float2(acc[i + 2] + b.x, acc[i + 3] + b.y);
        }
        fence_proxy_async();  // the writes, visible to the copy engine
        named_barrier(barrier_id, 128);
        if (leader) {
            int col = col0 + chunk * GEMM_STORE_COLS;
            tma_store_2d(out_map, col, row0, staging);
            tma_store_2d(out_map, col + 32, row0, staging + 64 * 32);
            bulk_commit();
        }
    }
}

// The ring's barriers: a stage's copies have landed (the producer's arrival and the bytes), and the
// `readers` consumer threads that multiply it are done with it.
__device__ __forceinline__ void gemm_ring_init(uint64_t* loaded, uint64_t* consumed, int stages, int readers) {
    for (int s = 0; s < stages; s++) {
        mbarrier_init(&loaded[s], 1);
        mbarrier_init(&consumed[s], readers);
    }
}

// Warpgroup 0, the producer: it gives up registers, and its first thread copies every stage of
// this CTA's tiles (blockIdx.x, + gridDim.x, ...) in order into the ring of STAGES (a's GEMM_TILE x
// 32 panel, then b's TILE_N x 32), a slot refilled once the consumers have freed it, running ahead
// into the next tile.
template <int STAGES, int TILE_N>
__device__ __forceinline__ void gemm_produce(float* stages, uint64_t* loaded, uint64_t* consumed, const CUtensorMap* a_map,
                                             const CUtensorMap* b_map, int row_tiles, int col_tiles, int k_tiles) {
    warpgroup_registers_lower<40>();
    if (threadIdx.x != 0) { return; }
    constexpr int STAGE_FLOATS = gemm_stage_floats(TILE_N);
    int filled = 0;  // stages filled so far
    for (int tile = blockIdx.x; tile < row_tiles * col_tiles; tile += gridDim.x) {
        int2 origin = gemm_tile_origin(tile, row_tiles, col_tiles, TILE_N);
        for (int kt = 0; kt < k_tiles; kt++, filled++) {
            int slot = filled % STAGES;
            if (filled >= STAGES) { mbarrier_wait(&consumed[slot], (filled / STAGES - 1) & 1); }
            float* stage = stages + slot * STAGE_FLOATS;
            mbarrier_expect_bytes(&loaded[slot], STAGE_FLOATS * sizeof(float));
            tma_load_2d(stage, a_map, 32 * kt, origin.x, &loaded[slot]);
            tma_load_2d(stage + GEMM_TILE * 32, b_map, 32 * kt, origin.y, &loaded[slot]);
        }
    }
}

template <int STAGES, int TILE_N, bool TMA_STORE>
__global__ void __launch_bounds__(GEMM_THREADS, 1) gemm_tf32_kernel(const __grid_constant__ CUtensorMap a_map,
                                                                    const __grid_constant__ CUtensorMap b_map,
                                                                    const __grid_constant__ CUtensorMap out_map,
                                                                    float* out, GemmEpilogue epilogue, int M, int N,
                                                                    int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int STAGE_FLOATS = gemm_stage_floats(TILE_N);
    static_assert(STAGES > 2, "a consumer's main loop starts while the other's last two stages may be in use");
    extern __shared__ float shared_raw[];
    float* stages = (float*)(((uintptr_t)shared_raw + 1023) & ~(uintptr_t)1023);  // [STAGES][a | b panel]
    float* staging = stages + STAGES * STAGE_FLOATS;  // [consumer][GEMM_STAGING_FLOATS] (TMA stores)
    uint64_t* loaded = (uint64_t*)(staging + (TMA_STORE ? 2 * GEMM_STAGING_FLOATS : 0));  // [STAGES]: copies landed
    uint64_t* consumed = loaded + STAGES;      // [STAGES]: the MMAs reading the stage are done
    uint64_t* turn_done = consumed + STAGES;   // [consumer]: its main loop of a tile has issued every MMA
    int row_tiles = ceil_div(M, GEMM_TILE), col_tiles = ceil_div(N, TILE_N);
    int tiles = row_tiles * col_tiles, k_tiles = ceil_div(K, 32);
    if (threadIdx.x == 0) {
        gemm_ring_init(loaded, consumed, STAGES, 128);
        mbarrier_init(&turn_done[0], 128);
        mbarrier_init(&turn_done[1], 128);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        gemm_produce<STAGES, TILE_N>(stages, loaded, consumed, &a_map, &b_map, row_tiles, col_tiles, k_tiles);
        return;
    }
    warpgroup_registers_raise<232>();
    int consumer = threadIdx.x / 128 - 1;
    // the CTA's j-th tile is consumer j % 2's; its stages are the ring's j * k_tiles onwards
    for (int j = consumer, tile = blockIdx.x + consumer * gridDim.x; tile < tiles; j += 2, tile += 2 * gridDim.x) {
        int2 origin = gemm_tile_origin(tile, row_tiles, col_tiles, TILE_N);
        if (j > 0) { mbarrier_wait(&turn_done[1 - consumer], ((j - 1) / 2) & 1); }  // the other's turn on tile j - 1
        float acc[2][TILE_N / 2] = {};  // rows 0-63 and 64-127 of the tile
        int first = j * k_tiles;
        for (int kt = 0; kt < k_tiles; kt++) {
            int n = first + kt, slot = n % STAGES;
            mbarrier_wait(&loaded[slot], (n / STAGES) & 1);
            const float* a = stages + slot * STAGE_FLOATS;
            const float* b = a + GEMM_TILE * 32;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint64_t b_descriptor = wgmma_descriptor(b + 8 * ks);
                wgmma_64xn_accumulate<TILE_N>(acc[0], wgmma_descriptor(a + 8 * ks), b_descriptor);
                wgmma_64xn_accumulate<TILE_N>(acc[1], wgmma_descriptor(a + 64 * 32 + 8 * ks), b_descriptor);
            }
            wgmma_commit();
            wgmma_wait_one();  // the stage before this one is read: free it
            if (kt > 0) { mbarrier_arrive(&consumed[(n - 1) % STAGES]); }
        }
        mbarrier_arrive(&turn_done[consumer]);
        wgmma_wait_all();
        mbarrier_arrive(&consumed[(first + k_tiles - 1) % STAGES]);
        pin_registers<TILE_N>(&acc[0][0]);
        if constexpr (TMA_STORE) {
            float* mine = staging + consumer * GEMM_STAGING_FLOATS;
            gemm_store_tma<TILE_N>(&out_map, epilogue.bias, mine, acc[0], origin.x, origin.y, N, 1 + consumer);
            gemm_store_tma<TILE_N>(&out_map, epilogue.bias, mine, acc[1], origin.x + 64, origin.y, N, 1 + consumer);
        } else {
            gemm_store<TILE_N>(out, epilogue, acc[0], origin.x, origin.y, M, N);
            gemm_store<TILE_N>(out, epilogue, acc[1], origin.x + 64, origin.y, M, N);
        }
    }
    if (TMA_STORE && threadIdx.x % 128 == 0) { bulk_wait_all(); }
#endif
}

// TMA_STORE: the stores through gemm_store_tma (N a multiple of 4, no GELU), else gemm_store's.
template <int STAGES, int TILE_N = GEMM_TILE, bool TMA_STORE = false>
static void gemm_tf32(float* out, const float* a, const float* b, GemmEpilogue epilogue, int M, int N, int K,
                      cudaStream_t stream = 0) {
    if (TMA_STORE && (N % 4 != 0 || epilogue.gelu_out != nullptr)) { fail("gemm_tf32: TMA stores need N %% 4 == 0 and no GELU"); }
    constexpr size_t shared = gemm_shared_bytes(STAGES, TILE_N, TMA_STORE);
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gemm_tf32_kernel<STAGES, TILE_N, TMA_STORE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        configured = true;
    }
    CUtensorMap a_map = tensor_map_panels(a, M, K, K, GEMM_TILE), b_map = tensor_map_panels(b, N, K, K, TILE_N);
    CUtensorMap out_map = TMA_STORE ? tensor_map_panels(out, M, N, N, 64) : CUtensorMap{};
    unsigned int tiles = ceil_div(M, GEMM_TILE) * ceil_div(N, TILE_N);
    gemm_tf32_kernel<STAGES, TILE_N, TMA_STORE><<<std::min(tiles, (unsigned int)g_num_sms), GEMM_THREADS, shared, stream>>>(
        a_map, b_map, out_map, out, epilogue, M, N, K);
    cudaCheck(cudaGetLastError());
}

// The cooperative wide form: tiles of 128 x GEMM_WIDE_N, both consumers on every tile (rows 0-63
// and 64-127, each one m64n256 wgmma per k-step sharing b's panel), the producer as above. Per
// k-step of 8 the multiprocessor's shared memory then serves 20 KB of wgmma reads and 12 KB of TMA
// writes in 256 tensor-core cycles (125 B/cycle), against 12 + 8 KB in 128 cycles (160 B/cycle)
// for the 128 x 128 tiles above: shared memory gives 128 B/cycle. The tile's stores are not
// hidden under MMAs; the producer fills the next tile's stages meanwhile.
constexpr int GEMM_WIDE_N = 256;

constexpr size_t gemm_wide_shared_bytes(int stages, bool tma_store) {
    return (size_t)stages * (gemm_stage_floats(GEMM_WIDE_N) * sizeof(float) + 2 * sizeof(uint64_t)) +
           (tma_store ? 2 * GEMM_STAGING_FLOATS * sizeof(float) : 0) + 1024;
}

// TMA_STORE: the stores through gemm_store_tma (N a multiple of 4, no GELU), else gemm_store's.
template <int STAGES, bool TMA_STORE>
__global__ void __launch_bounds__(GEMM_THREADS, 1) gemm_tf32_wide_kernel(const __grid_constant__ CUtensorMap a_map,
                                                                         const __grid_constant__ CUtensorMap b_map,
                                                                         const __grid_constant__ CUtensorMap out_map,
                                                                         float* out, GemmEpilogue epilogue, int M,
                                                                         int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ float shared_raw[];
    float* stages = (float*)(((uintptr_t)shared_raw + 1023) & ~(uintptr_t)1023);  // [STAGES][a | b panel]
    constexpr int STAGE_FLOATS = gemm_stage_floats(GEMM_WIDE_N);
    float* staging = stages + STAGES * STAGE_FLOATS;  // [consumer][GEMM_STAGING_FLOATS] (TMA_STORE)
    uint64_t* loaded = (uint64_t*)(staging + (TMA_STORE ? 2 * GEMM_STAGING_FLOATS : 0));  // [STAGES]: copies landed
    uint64_t* consumed = loaded + STAGES;  // [STAGES]: both consumers' MMAs reading the stage are done
    int row_tiles = ceil_div(M, GEMM_TILE), col_tiles = ceil_div(N, GEMM_WIDE_N);
    int tiles = row_tiles * col_tiles, k_tiles = ceil_div(K, 32);
    if (threadIdx.x == 0) {
        gemm_ring_init(loaded, consumed, STAGES, 256);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        gemm_produce<STAGES, GEMM_WIDE_N>(stages, loaded, consumed, &a_map, &b_map, row_tiles, col_tiles, k_tiles);
        return;
    }
    warpgroup_registers_raise<232>();
    int consumer = threadIdx.x / 128 - 1;
    for (int j = 0, tile = blockIdx.x; tile < tiles; j++, tile += gridDim.x) {
        int2 origin = gemm_tile_origin(tile, row_tiles, col_tiles, GEMM_WIDE_N);
        float acc[GEMM_WIDE_N / 2] = {};  // rows 64 * consumer onwards
        int first = j * k_tiles;
        for (int kt = 0; kt < k_tiles; kt++) {
            int n = first + kt, slot = n % STAGES;
            mbarrier_wait(&loaded[slot], (n / STAGES) & 1);
            const float* a = stages + slot * STAGE_FLOATS + consumer * 64 * 32;
            const float* b = stages + slot * STAGE_FLOATS + GEMM_TILE * 32;
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
        mbarrier_arrive(&consumed[(first + k_tiles - 1) % STAGES]);
        pin_registers<GEMM_WIDE_N / 2>(acc);
        if constexpr (TMA_STORE) {
            gemm_store_tma<GEMM_WIDE_N>(&out_map, epilogue.bias, staging + consumer * GEMM_STAGING_FLOATS, acc,
                           origin.x + 64 * consumer, origin.y, N, 1 + consumer);
        } else {
            gemm_store<GEMM_WIDE_N>(out, epilogue, acc, origin.x + 64 * consumer, origin.y, M, N);
        }
    }
    if (TMA_STORE && threadIdx.x % 128 == 0) { bulk_wait_all(); }
#endif
}

template <int STAGES, bool TMA_STORE>
static void gemm_tf32_wide(float* out, const float* a, const float* b, GemmEpilogue epilogue, int M, int N, int K,
                           cudaStream_t stream = 0) {
    if (TMA_STORE && (N % 4 != 0 || epilogue.gelu_out != nullptr)) { fail("gemm_tf32_wide: TMA stores need N %% 4 == 0 and no GELU"); }
    constexpr size_t shared = gemm_wide_shared_bytes(STAGES, TMA_STORE);
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gemm_tf32_wide_kernel<STAGES, TMA_STORE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        configured = true;
    }
    CUtensorMap a_map = tensor_map_panels(a, M, K, K, GEMM_TILE), b_map = tensor_map_panels(b, N, K, K, GEMM_WIDE_N);
    CUtensorMap out_map = TMA_STORE ? tensor_map_panels(out, M, N, N, 64) : CUtensorMap{};
    unsigned int tiles = ceil_div(M, GEMM_TILE) * ceil_div(N, GEMM_WIDE_N);
    gemm_tf32_wide_kernel<STAGES, TMA_STORE><<<std::min(tiles, (unsigned int)g_num_sms), GEMM_THREADS, shared, stream>>>(
        a_map, b_map, out_map, out, epilogue, M, N, K);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------
// The lab

constexpr int NUM_VARIANTS = 10;
constexpr const char* VARIANT_NAMES[] = {
    nullptr,
    "1 cuBLASLt TF32 + bias (matmul_forward)",
    "2 gemm_tf32, 6 stages",
    "3 gemm_tf32, 4 stages",
    "4 (b) gemm_tf32 (6 stages) + GELU epilogue",
    "5 (b) cuBLASLt + bias, then gelu_forward",
    "6 gemm_tf32_wide (128 x 256), 4 stages",
    "7 gemm_tf32_wide (128 x 256), 4 stages, TMA stores",
    "8 gemm_tf32, tiles of 128 x 192, 5 stages",
    "9 gemm_tf32, 4 stages, TMA stores",
    "10 gemm_tf32, tiles of 128 x 192, 4 stages, TMA stores",
};

// Relative to max |out|: both operands read as TF32 (10 mantissa bits; the tensor cores drop the
// rest), the errors of K products adding up at random (measured: cuBLASLt 2-3e-4).
constexpr double TF32_TOLERANCE = 5e-3;

struct Shape {
    std::string name;
    int M, N, K;
    bool has_bias, fc;  // fc: the MLP's up-projection (variants 4 and 5)
};

struct Buffers {
    float *out, *gelu_out, *inp, *weight, *bias;
};

static bool runs_on(int variant, const Shape& s) {
    if (variant == 7 || variant >= 9) { return s.N % 4 == 0; }  // TMA stores: rows of out 16-byte aligned
    return (variant != 4 && variant != 5) || s.fc;
}

static void launch_variant(int variant, const Buffers& d, const Shape& s) {
    const float* bias = s.has_bias ? d.bias : nullptr;
    if (variant == 1) {
        matmul_forward(d.out, d.inp, d.weight, bias, s.M, s.K, s.N);
    } else if (variant == 2) {
        gemm_tf32<6>(d.out, d.inp, d.weight, {bias, nullptr}, s.M, s.N, s.K);
    } else if (variant == 3) {
        gemm_tf32<4>(d.out, d.inp, d.weight, {bias, nullptr}, s.M, s.N, s.K);
    } else if (variant == 4) {
        gemm_tf32<6>(d.out, d.inp, d.weight, {bias, d.gelu_out}, s.M, s.N, s.K);
    } else if (variant == 5) {
        matmul_forward(d.out, d.inp, d.weight, bias, s.M, s.K, s.N);
        gelu_forward(d.gelu_out, d.out, (size_t)s.M * s.N);
    } else if (variant == 8) {
        gemm_tf32<5, 192>(d.out, d.inp, d.weight, {bias, nullptr}, s.M, s.N, s.K);
    } else if (variant == 9) {
        gemm_tf32<4, GEMM_TILE, true>(d.out, d.inp, d.weight, {bias, nullptr}, s.M, s.N, s.K);
    } else if (variant == 10) {
        gemm_tf32<4, 192, true>(d.out, d.inp, d.weight, {bias, nullptr}, s.M, s.N, s.K);
    } else if (variant == 6) {
        gemm_tf32_wide<4, false>(d.out, d.inp, d.weight, {bias, nullptr}, s.M, s.N, s.K);
    } else {
        gemm_tf32_wide<4, true>(d.out, d.inp, d.weight, {bias, nullptr}, s.M, s.N, s.K);
    }
}

// Max relative error of out (and of gelu_out for the GELU variants) against the CPU
// (linear_check); infinite if any element of an output is not finite.
static double check_variant(const Buffers& d, const Shape& s, int variant) {
    bool gelu = variant == 4 || variant == 5;
    LinearCheck check = linear_check(d.inp, d.weight, s.has_bias ? d.bias : nullptr, d.out, gelu ? d.gelu_out : nullptr,
                                     s.M, s.N, s.K, [&] { launch_variant(variant, d, s); });
    return check.finite ? std::max(error_value(check.out), gelu ? error_value(check.gelu) : 0.0) : INFINITY;
}

static std::map<std::string, std::map<int, double>> g_times;  // shape -> variant -> ms

// Each shape's launches in an NVTX range of its name, for ncu: ncu --nvtx --nvtx-include "d12 B=16 fc/"
static void run_shape(const Buffers& d, const Shape& s, int variant) {
    nvtxRangePushA(s.name.c_str());
    double error = check_variant(d, s, variant);
    size_t n_out = (size_t)s.M * s.N;
    Launch launch = [&] { launch_variant(variant, d, s); };
    Launch poison_out = [&] { poison(d.out, n_out); };
    Determinism det = deterministic(launch, poison_out, {{d.out, n_out}});
    double ms = bench_ms(launch);
    g_times[s.name][variant] = ms;
    char name[128];
    snprintf(name, sizeof(name), "%s, %s", VARIANT_NAMES[variant], s.name.c_str());
    print_row("matmul_wgmma", name, ms, 2.0 * s.M * s.N * s.K, CEILING_TF32, error, TF32_TOLERANCE, det);
    nvtxRangePop();
}

// The trainer's five linear layers of a model of C channels over M rows.
static void add_layers(std::vector<Shape>* shapes, const char* model, int B, int C) {
    int M = B * LAB_T;
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "%s B=%d ", model, B);
    std::string p = prefix;
    shapes->push_back({p + "qkv", M, 3 * C, C, true, false});
    shapes->push_back({p + "attproj", M, C, C, true, false});
    shapes->push_back({p + "fc", M, 4 * C, C, true, true});
    shapes->push_back({p + "fcproj", M, C, 4 * C, true, false});
    shapes->push_back({p + "lm head", M, LAB_VP, C, false, false});
    // the backward's products in the same form, on the trainer's transposed copies: the LM head's
    // input gradient (K = Vp) and weight gradients (K = B*T)
    shapes->push_back({p + "lm head dinp", M, C, LAB_VP, false, false});
    shapes->push_back({p + "lm head dweight", LAB_VP, C, M, false, false});
    shapes->push_back({p + "qkv dweight", 3 * C, C, M, false, false});
    shapes->push_back({p + "fc dweight", 4 * C, C, M, false, false});
    shapes->push_back({p + "fcproj dweight", C, 4 * C, M, false, false});
}

int main(int argc, char** argv) {
    lab_init(argc, argv, NUM_VARIANTS);
    if (!g_wgmma) {
        printf("SKIPPED: gemm_tf32 needs the sm_90a build on a Hopper GPU\n");
        return 0;
    }
    std::vector<Shape> shapes = {{"odd 1000x1001x772", 1000, 1001, 772, true, true},
                                 {"odd 333x50257x768", 333, LAB_V, 768, false, false}};
    add_layers(&shapes, "d12", 4, 768);
    add_layers(&shapes, "d12", 16, 768);
    add_layers(&shapes, "d24", 16, 1024);
    add_layers(&shapes, "d48", 8, 1600);
    size_t max_out = 0, max_inp = 0, max_weight = 0, max_n = 0;
    for (const Shape& s : shapes) {
        max_out = std::max(max_out, (size_t)s.M * s.N);
        max_inp = std::max(max_inp, (size_t)s.M * s.K);
        max_weight = std::max(max_weight, (size_t)s.N * s.K);
        max_n = std::max(max_n, (size_t)s.N);
    }
    Buffers d = {gpu_floats(max_out), gpu_floats(max_out), gpu_floats(max_inp), gpu_floats(max_weight),
                 gpu_floats(max_n)};
    for (const Shape& s : shapes) {
        for (int variant = 1; variant <= NUM_VARIANTS; variant++) {
            if (variant_selected(variant) && runs_on(variant, s)) { run_shape(d, s, variant); }
        }
    }
    note("time over cuBLASLt's (variant 1), per shape: variants 2 3 6 7 8 9 10 | 4 over 5 (fc + GELU)");
    for (const Shape& s : shapes) {
        std::map<int, double>& t = g_times[s.name];
        if (t.count(1) == 0) { continue; }
        std::string row = s.name + ":";
        for (int v : {2, 3, 6, 7, 8, 9, 10}) {
            char cell[32];
            snprintf(cell, sizeof(cell), " %.3f", t.count(v) ? t[v] / t[1] : NAN);
            row += cell;
        }
        if (t.count(4) && t.count(5)) {
            char cell[32];
            snprintf(cell, sizeof(cell), " | %.3f", t[4] / t[5]);
            row += cell;
        }
        note("%s", row.c_str());
    }
    gpu_free_all();
    return lab_finish();
}
