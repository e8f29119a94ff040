// CPU tests of llmc/zero.h, the arithmetic of data-parallel training: shards of the parameters for
// any number of ranks, the moves to the owners (with the slot layout the trainer's
// ordered_sum_kernel reads) and the rank-ordered sum that makes N GPUs bit-identical to N
// micro-steps on one, the gradient norm's chunks, and the split of -d into micro-steps.
#include <math.h>

#include <algorithm>
#include <random>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/zero.h"

// The owner of parameter i from the chunk arithmetic alone: the reference zero_shard must agree with.
static int owner_of(size_t i, size_t num_parameters, int world) {
    return (int)(i / ZERO_CHUNK / zero_shard(num_parameters, 0, world).chunks_per_rank);
}

TEST(shards_cover_the_parameters_once_chunk_aligned) {
    for (size_t P : {(size_t)1, (size_t)4, ZERO_CHUNK - 4, ZERO_CHUNK, ZERO_CHUNK + 4, 5 * ZERO_CHUNK + 12,
                     (size_t)124475904, (size_t)1557686400}) {
        for (int world : {1, 2, 3, 4, 7, 8, 64}) {
            size_t expected_begin = 0;
            for (int r = 0; r < world; r++) {
                ZeroShard s = zero_shard(P, r, world);
                CHECK(s.begin == expected_begin);
                CHECK(s.begin <= s.end && s.end <= P);
                CHECK(s.begin % ZERO_CHUNK == 0 || s.begin == P);
                CHECK(s.end % ZERO_CHUNK == 0 || s.end == P);
                CHECK((size_t)world * s.chunks_per_rank >= s.num_chunks);
                CHECK(s.end_chunk - s.first_chunk <= s.chunks_per_rank);
                for (size_t i : {s.begin, s.end - 1}) {
                    if (s.begin < s.end) { CHECK(owner_of(i, P, world) == r); }
                }
                expected_begin = s.end;
            }
            CHECK(expected_begin == P);
        }
    }
    ZeroShard empty = zero_shard(ZERO_CHUNK, 3, 4);  // one chunk, four ranks: ranks 1..3 own nothing
    CHECK(empty.begin == ZERO_CHUNK && empty.end == ZERO_CHUNK);
}

// GPT-2-like tensors (2 of them not per layer, then per-layer ones, then 2 more not per layer):
// the buckets cover every parameter once, layers from the top, and cut into the owners' slices
// they cover each rank's slice once, for any number of ranks.
TEST(gradient_buckets_cover_every_parameter_once) {
    for (int layers : {1, 2, 12}) {
        size_t C = 96;
        std::vector<size_t> sizes = {1000 * C, 64 * C};
        std::vector<bool> flags = {false, false};
        for (size_t per_layer : {C, 3 * C * C, 4 * C, C * 4 * C}) {
            sizes.push_back(layers * per_layer);
            flags.push_back(true);
        }
        sizes.insert(sizes.end(), {C, C});
        flags.insert(flags.end(), {false, false});
        bool layered[16];
        for (size_t i = 0; i < flags.size(); i++) { layered[i] = flags[i]; }
        size_t P = 0;
        for (size_t size : sizes) { P += size; }
        auto buckets = zero_gradient_buckets(sizes.data(), layered, (int)sizes.size(), layers);
        CHECK(buckets.size() == (size_t)layers + 1);
        CHECK(buckets[0][0].begin == sizes[0] + sizes[1] + (layers - 1) * C);  // the top layer's first block
        std::vector<int> seen(P, 0);
        for (const auto& bucket : buckets) {
            for (ZeroRange range : bucket) {
                for (size_t i = range.begin; i < range.end; i++) { seen[i]++; }
            }
        }
        CHECK(std::count(seen.begin(), seen.end(), 1) == (long)P);
        for (int world = 1; world <= 9; world++) {
            std::vector<int> owned(P, 0);
            for (int r = 0; r < world; r++) {
                ZeroShard s = zero_shard(P, r, world);
                for (const auto& bucket : buckets) {
                    for (ZeroRange range : bucket) {
                        ZeroRange part = zero_intersect(range, s.begin, s.end);
                        CHECK(part.begin <= part.end && (part.begin == part.end || (part.begin >= s.begin && part.end <= s.end)));
                        for (size_t i = part.begin; i < part.end; i++) { owned[i] += 1 + r; }
                    }
                }
            }
            bool right = true;
            for (size_t i = 0; i < P; i++) { right = right && owned[i] == 1 + owner_of(i, P, world); }
            CHECK(right);
        }
    }
}

// zero_messages run on host arrays for N = 1..9 ranks, with buckets and messages small enough to
// split: each pair's sends and receives match one for one (as NCCL pairs them), the owners' slots
// get every other rank's values of their slice, and gathering gives every rank the owners' values.
TEST(messages_move_every_part_to_its_owner_and_back) {
    size_t P = 3 * ZERO_CHUNK + 1000;
    std::vector<std::vector<ZeroRange>> buckets = {{{5000, 40000}, {70000, 70004}}, {{0, 5000}, {40000, 70000}},
                                                   {{70004, P}}};
    for (int world = 1; world <= 9; world++) {
        std::vector<std::vector<float>> data(world, std::vector<float>(P)), received(world);
        for (int r = 0; r < world; r++) {
            for (size_t i = 0; i < P; i++) { data[r][i] = (float)(r * 1000003 + i); }
            received[r].assign(world * zero_shard(P, 0, world).chunks_per_rank * ZERO_CHUNK, -1.0f);
        }
        for (bool to_owners : {true, false}) {
            for (const auto& bucket : buckets) {
                std::vector<std::vector<ZeroMessage>> messages(world);
                for (int r = 0; r < world; r++) { messages[r] = zero_messages(bucket, P, r, world, to_owners, 4096); }
                for (int s = 0; s < world; s++) {
                    for (int d = 0; d < world; d++) {
                        std::vector<const ZeroMessage*> sends, receives;
                        for (const ZeroMessage& m : messages[s]) { if (m.send && m.peer == d) { sends.push_back(&m); } }
                        for (const ZeroMessage& m : messages[d]) { if (!m.send && m.peer == s) { receives.push_back(&m); } }
                        CHECK(sends.size() == receives.size());
                        for (size_t i = 0; i < std::min(sends.size(), receives.size()); i++) {
                            CHECK(sends[i]->count == receives[i]->count && sends[i]->count <= 4096);
                            float* into = to_owners ? received[d].data() : data[d].data();
                            std::copy_n(data[s].begin() + sends[i]->offset, sends[i]->count, into + receives[i]->offset);
                        }
                    }
                }
            }
            bool right = true;
            for (int owner = 0; owner < world; owner++) {
                ZeroShard mine = zero_shard(P, owner, world);
                for (int sender = 0; sender < world && to_owners; sender++) {
                    if (sender == owner) { continue; }
                    const float* slot = received[owner].data() + zero_sender_slot(sender, owner) * (mine.end - mine.begin);
                    for (size_t i = mine.begin; i < mine.end; i++) { right = right && slot[i - mine.begin] == (float)(sender * 1000003 + i); }
                }
                for (int r = 0; r < world && !to_owners; r++) {
                    for (size_t i = mine.begin; i < mine.end; i++) { right = right && data[r][i] == (float)(owner * 1000003 + i); }
                }
            }
            CHECK(right);
        }
    }
}

TEST(micro_batches_split_over_ranks) {
    CHECK(zero_micro_batches(16 * 1024, 4 * 1024, 1) == 4);
    CHECK(zero_micro_batches(16 * 1024, 4 * 1024, 2) == 4);  // 2 micro-steps on each of 2 ranks
    CHECK(zero_micro_batches(16 * 1024, 4 * 1024, 4) == 4);
    CHECK(zero_micro_batches(16 * 1024, 4 * 1024, 8) == 0);  // fewer micro-batches than ranks
    CHECK(zero_micro_batches(12 * 1024, 4 * 1024, 2) == 0);  // 3 micro-batches over 2 ranks
    CHECK(zero_micro_batches(4 * 1024 + 1, 4 * 1024, 1) == 0);
    CHECK(zero_micro_batches(0, 4 * 1024, 1) == 0);
    CHECK(zero_micro_batches(-8192, 4096, 1) == 0);
}

// Random gradients spread over many magnitudes, so that the order of additions shows.
static std::vector<std::vector<float>> random_grads(int count, size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f), exponent(-8.0f, 8.0f);
    std::vector<std::vector<float>> grads(count, std::vector<float>(n));
    for (auto& g : grads) {
        for (float& x : g) { x = unit(rng) * exp2f(exponent(rng)); }
    }
    return grads;
}

// The whole move of a data-parallel run on the CPU: every rank holds its micro-step's gradients;
// each "sends" its values of every other rank's slice into that owner's slots (the layout
// zero_messages with to_owners gives), and the owner sums them as ordered_sum_kernel does. The
// owners' slices must equal, bit for bit, one GPU's accumulation g0 + g1 + ... in order.
static bool data_parallel_equals_accumulation(size_t P, int world) {
    std::vector<std::vector<float>> grads = random_grads(world, P, 7 + world);
    std::vector<float> accumulated(P, 0.0f);  // one GPU: the first micro-step into zeros, then += each
    for (int m = 0; m < world; m++) {
        for (size_t i = 0; i < P; i++) { accumulated[i] = m == 0 ? 0.0f + grads[m][i] : accumulated[i] + grads[m][i]; }
    }
    for (int owner = 0; owner < world; owner++) {
        ZeroShard s = zero_shard(P, owner, world);
        size_t owned = s.end - s.begin;
        std::vector<float> received((world - 1) * owned);
        for (int sender = 0; sender < world; sender++) {
            if (sender == owner) { continue; }
            float* slot = received.data() + zero_sender_slot(sender, owner) * owned;
            memcpy(slot, grads[sender].data() + s.begin, owned * sizeof(float));
        }
        std::vector<float> sum(owned);
        for (size_t i = 0; i < owned; i++) {  // ordered_sum_kernel, element i
            float own = grads[owner][s.begin + i];
            float total = owner == 0 ? own : received[i];
            for (int r = 1; r < world; r++) { total += r == owner ? own : received[zero_sender_slot(r, owner) * owned + i]; }
            sum[i] = total;
        }
        if (memcmp(sum.data(), accumulated.data() + s.begin, owned * sizeof(float)) != 0) { return false; }
    }
    return true;
}

TEST(owners_sum_in_rank_order_bit_identical_to_accumulation) {
    for (size_t P : {(size_t)8, 3 * ZERO_CHUNK + 12, 16 * ZERO_CHUNK}) {
        for (int world : {1, 2, 3, 5, 8}) { CHECK(data_parallel_equals_accumulation(P, world)); }
    }
}

// Summed in another order, the same gradients give other bits: so the owners' order must be fixed.
TEST(order_of_the_sum_matters) {
    size_t n = 4096;
    std::vector<std::vector<float>> g = random_grads(3, n, 3);
    std::vector<float> in_order(n), reversed(n);
    for (size_t i = 0; i < n; i++) {
        in_order[i] = (g[0][i] + g[1][i]) + g[2][i];
        reversed[i] = (g[2][i] + g[1][i]) + g[0][i];
    }
    CHECK(memcmp(in_order.data(), reversed.data(), n * sizeof(float)) != 0);
}

// The norm's partial sums are per chunk, whoever owns the chunk: the gathered partials, and the
// norm summed from them in chunk order, are the same for every world size.
TEST(norm_partials_do_not_depend_on_world) {
    size_t P = 7 * ZERO_CHUNK + 100;
    std::vector<float> g = random_grads(1, P, 5)[0];
    auto norm_for = [&](int world) {
        ZeroShard s0 = zero_shard(P, 0, world);
        std::vector<float> partials(world * s0.chunks_per_rank, 0.0f);
        for (int r = 0; r < world; r++) {
            ZeroShard s = zero_shard(P, r, world);
            for (size_t c = s.first_chunk; c < s.end_chunk; c++) {
                float sum = 0.0f;
                for (size_t i = c * ZERO_CHUNK; i < std::min(P, (c + 1) * ZERO_CHUNK); i++) { sum += g[i] * g[i]; }
                partials[c] = sum;
            }
        }
        float total_sum = 0.0f;
        for (size_t c = 0; c < s0.num_chunks; c++) { total_sum += partials[c]; }
        return total_sum;
    };
    float one = norm_for(1);
    for (int world : {2, 3, 4, 8, 16}) {
        float other = norm_for(world);
        CHECK(memcmp(&one, &other, sizeof(float)) == 0);
    }
}

TEST_MAIN()
