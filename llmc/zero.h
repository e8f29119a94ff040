// ZeRO-1 arithmetic for data-parallel training: which rank owns which parameters, the chunks of
// the gradient norm, where an owner receives the other ranks' gradients, the rank-ordered sum
// that makes N GPUs bit-identical to N micro-steps on one, and the split of a total batch into
// micro-steps. Offsets only: no GPU.
//
// The flat parameter vector (P floats, the model file's order) is cut into chunks of ZERO_CHUNK
// floats; rank r owns the contiguous chunks [r*cpr, (r+1)*cpr) where cpr = ceil(chunks / world),
// so a rank's slice is chunk-aligned and the last slices may be short or empty. The gradient norm
// sums each chunk's squares as one partial and the partials in chunk order: the same numbers for
// any world size.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

static const size_t ZERO_CHUNK = 32768;  // floats: the unit of ownership and of the norm's partial sums

struct ZeroShard {
    size_t num_chunks;       // ceil(P / ZERO_CHUNK)
    size_t chunks_per_rank;  // cpr
    size_t first_chunk, end_chunk;  // this rank's chunks
    size_t begin, end;       // this rank's parameters [begin, end)
};

static inline size_t zero_div_up(size_t a, size_t b) { return (a + b - 1) / b; }

static inline ZeroShard zero_shard(size_t num_parameters, int rank, int world) {
    ZeroShard s;
    s.num_chunks = zero_div_up(num_parameters, ZERO_CHUNK);
    s.chunks_per_rank = zero_div_up(s.num_chunks, (size_t)world);
    s.first_chunk = std::min(s.num_chunks, (size_t)rank * s.chunks_per_rank);
    s.end_chunk = std::min(s.num_chunks, s.first_chunk + s.chunks_per_rank);
    s.begin = std::min(num_parameters, s.first_chunk * ZERO_CHUNK);
    s.end = std::min(num_parameters, s.end_chunk * ZERO_CHUNK);
    return s;
}

// Micro-batches of micro_tokens per optimizer step for a total batch of total_tokens over world
// ranks: 0 unless total_tokens is a positive multiple of micro_tokens * world (each rank then
// runs the result / world micro-steps).
static inline int64_t zero_micro_batches(int64_t total_tokens, int64_t micro_tokens, int world) {
    if (total_tokens <= 0 || micro_tokens <= 0 || world <= 0 || total_tokens % (micro_tokens * world) != 0) { return 0; }
    return total_tokens / micro_tokens;
}

// The owner of parameter i.
static inline int zero_owner(size_t i, size_t num_parameters, int world) {
    return (int)(i / ZERO_CHUNK / zero_shard(num_parameters, 0, world).chunks_per_rank);
}

#ifdef __CUDACC__
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

// Where an owner keeps what `sender` sent it: one slot per other rank, in rank order.
ZERO_HOST_DEVICE static inline int zero_sender_slot(int sender, int owner) { return sender < owner ? sender : sender - 1; }

// The owner sums the ranks' contributions in rank order, starting from rank 0's: exactly what one
// GPU computes when it adds micro-step gradients g0 + g1 + ... in turn (the reference for the
// kernel that does it on the GPU).
static inline void zero_ordered_sum(float* out, const float* const* contributions, int world, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float sum = contributions[0][i];
        for (int r = 1; r < world; r++) { sum += contributions[r][i]; }
        out[i] = sum;
    }
}
