// ZeRO-1 arithmetic for data-parallel training: which rank owns which parameters, the chunks of
// the gradient norm, the buckets the gradients can move in and each rank's messages, where an
// owner receives the other ranks' gradients (for the trainer's rank-ordered sum, which makes N
// GPUs bit-identical to N micro-steps on one), and the split of a total batch into micro-steps.
// Offsets only: no GPU.
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

constexpr size_t ZERO_CHUNK = 32768;  // floats: the unit of ownership and of the norm's partial sums

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

#ifdef __CUDACC__
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

// Where an owner keeps what `sender` sent it: one slot per other rank, in rank order.
ZERO_HOST_DEVICE static inline int zero_sender_slot(int sender, int owner) { return sender < owner ? sender : sender - 1; }

// A range [begin, end) of the flat parameter vector.
struct ZeroRange { size_t begin, end; };

// The part of `range` inside [begin, end) (empty: begin == end).
static inline ZeroRange zero_intersect(ZeroRange range, size_t begin, size_t end) {
    ZeroRange part = {std::max(range.begin, begin), std::min(range.end, end)};
    return part.begin < part.end ? part : ZeroRange{part.begin, part.begin};
}

// The gradients' buckets in the order the backward pass completes them: one per layer from the
// top (layer l: block l of every tensor with layered[i], of sizes[i] / layers floats), then the
// tensors that are not per layer. Each bucket moves to the owners as soon as it is written.
static inline std::vector<std::vector<ZeroRange>> zero_gradient_buckets(const size_t* sizes, const bool* layered,
                                                                          int num_tensors, int layers) {
    std::vector<std::vector<ZeroRange>> buckets(layers + 1);
    size_t offset = 0;
    for (int i = 0; i < num_tensors; offset += sizes[i], i++) {
        if (!layered[i]) {
            buckets[layers].push_back({offset, offset + sizes[i]});
            continue;
        }
        size_t block = sizes[i] / layers;
        for (int l = 0; l < layers; l++) {
            buckets[layers - 1 - l].push_back({offset + l * block, offset + (l + 1) * block});
        }
    }
    return buckets;
}

// One point-to-point message of a move between ranks: `count` floats at `offset` in the buffer
// they leave from (send) or arrive in (receive), to or from rank `peer`.
struct ZeroMessage {
    int peer;
    bool send;
    size_t offset, count;
};

// Rank `rank`'s messages, in the order to post them, for moving the parts of `ranges` (of the
// flat vector, num_parameters floats) between the owners and the other ranks, in messages of at
// most max_floats. to_owners: every rank sends its values of the parts that other ranks own to
// them; an owner receives sender i's into slot zero_sender_slot(i, owner) of its slice's size, at
// their offset in the slice. Else (gathering): every owner sends its parts to every other rank,
// which receives them in place. Sender and receiver list each pair's messages in the same order,
// as NCCL pairs them.
static inline std::vector<ZeroMessage> zero_messages(const std::vector<ZeroRange>& ranges, size_t num_parameters,
                                                     int rank, int world, bool to_owners, size_t max_floats) {
    std::vector<ZeroMessage> messages;
    ZeroShard mine = zero_shard(num_parameters, rank, world);
    auto add = [&](int peer, bool send, ZeroRange part, size_t from, size_t to) {  // offset = index - from + to
        for (size_t begin = part.begin; begin < part.end; begin += max_floats) {
            messages.push_back({peer, send, begin - from + to, std::min(max_floats, part.end - begin)});
        }
    };
    for (int other = 0; other < world; other++) {
        if (other == rank) { continue; }
        ZeroShard theirs = zero_shard(num_parameters, other, world);
        size_t slot = zero_sender_slot(other, rank) * (mine.end - mine.begin);
        for (ZeroRange range : ranges) {
            ZeroRange their_part = zero_intersect(range, theirs.begin, theirs.end);
            ZeroRange my_part = zero_intersect(range, mine.begin, mine.end);
            if (to_owners) {
                add(other, true, their_part, 0, 0);
                add(other, false, my_part, mine.begin, slot);
            } else {
                add(other, true, my_part, 0, 0);
                add(other, false, their_part, 0, 0);
            }
        }
    }
    return messages;
}
