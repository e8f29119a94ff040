// Token data loader for training and evaluation.
//
// Reads shards in the classic format: a header of 256 int32 (magic 20240520,
// version 1, token count, rest zero) followed by the tokens as little-endian uint16
// (the byte order of every CUDA host, so they are read as-is).
//
// A sample is the T+1 tokens starting at token j*T of a shard: its first T tokens are
// inputs, its last T the targets. An optimizer step reads one batch of B * world_size *
// micro_steps samples: each of `world_size` processes runs `micro_steps` micro-steps of B
// samples. A shard of N tokens holds floor((N-1)/T) samples and yields floor(samples /
// batch) batches; in batch k, micro-step m of process `rank` takes the samples at positions
// [((k*micro_steps + m)*world_size + rank)*B, +B) of the shard's sample order. So one process
// with n micro-steps reads, micro-step by micro-step, what n processes with one micro-step
// each read rank by rank, and a saved position (counted in batches) serves any split of the
// same micro-batches per step. After the last batch of a shard comes the next shard, after
// the last shard the next epoch.
//
// Without shuffling the shard and sample orders are the identity (a batch is then
// B*T+1 consecutive tokens). With shuffling each epoch has its own shard order and each
// (epoch, shard) its own sample order, both drawn from (seed, epoch, shard) alone, so the
// position (epoch, shard, batch) is the whole state and a restored loader continues
// exactly where a saved one stood.
//
// Only the current shard is held in memory. Every shard's header and size are validated when the
// loader starts; a shard's token ids (each < vocab_size) whenever it is loaded, so a large data
// set is not read in full at startup.
#pragma once

#include <glob.h>
#include <stdint.h>

#include <algorithm>
#include <string>
#include <vector>

#include "llmc/utils.h"

constexpr int32_t DATALOADER_MAGIC = 20240520;
constexpr int32_t DATALOADER_VERSION = 1;
constexpr int DATALOADER_HEADER_INTS = 256;
constexpr int64_t DATALOADER_HEADER_BYTES = DATALOADER_HEADER_INTS * (int64_t)sizeof(int32_t);

// The loader's position, for checkpoints: 64 bytes, fixed-size fields, no padding.
// It is the same on every rank (saved between optimizer steps). The fields after batch_index identify the run's
// configuration and data set; dataloader_restore() refuses a state where they differ.
struct DataLoaderState {
    int64_t epoch;        // epochs completed before the next batch
    int64_t shard_index;  // position, in this epoch's shard order, of the next batch's shard
    int64_t batch_index;  // index of the next batch within that shard
    uint64_t seed;        // shuffle seed given to dataloader_init()
    int64_t num_shards;   // number of shards matched by the pattern
    int64_t num_tokens;   // total tokens over all shards
    int32_t B;            // samples per batch and process
    int32_t T;            // tokens per sample (sequence length)
    int32_t micro_batches;  // micro-batches per optimizer step, all processes together
    int32_t shuffle;      // 1 if shuffling, 0 if not
};
static_assert(sizeof(DataLoaderState) == 64, "DataLoaderState must stay 64 bytes");

struct DataLoader {
    // Configuration.
    int B, T, rank, world_size, micro_steps;
    bool shuffle;
    uint64_t seed;
    uint32_t vocab_size;
    // The data set: shard paths in sorted order, their token and batch counts.
    std::vector<std::string> shard_paths;
    std::vector<int64_t> shard_tokens;
    std::vector<int64_t> shard_batches;
    int64_t total_tokens;
    // Position of the next batch, and of the next micro-step within it.
    int64_t epoch, shard_index, batch_index;
    int micro_step;
    // The shard in memory (an index into shard_paths, or -1) and its tokens.
    int64_t loaded_shard;
    std::vector<uint16_t> tokens;
    // Shard order of epoch `shard_order_epoch` (-1: none computed yet).
    int64_t shard_order_epoch;
    std::vector<int64_t> shard_order;
    // Sample order of shard `sample_order_shard` in epoch `sample_order_epoch` (shuffle only).
    int64_t sample_order_epoch, sample_order_shard;
    std::vector<uint32_t> sample_order;
    // The current batch: B rows of T tokens each.
    int32_t* inputs;
    int32_t* targets;
};

// ---------------------------------------------------------------------------------
// Deterministic shuffling: splitmix64 streams seeded by (seed, epoch, stream id).

// splitmix64's output function: a bijective mixer of 64-bit values.
static inline uint64_t dl_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

struct DlRng { uint64_t state; };

static inline uint64_t dl_rng_next(DlRng* rng) {
    rng->state += 0x9e3779b97f4a7c15ULL;
    return dl_mix64(rng->state);
}

// Uniform in [0, bound), unbiased: rejects the few draws below 2^64 mod bound.
static inline uint64_t dl_rng_below(DlRng* rng, uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = dl_rng_next(rng);
        if (r >= threshold) { return r % bound; }
    }
}

// Stream 0 orders an epoch's shards; stream 1+s orders the samples of shard s.
static inline DlRng dl_rng_for(uint64_t seed, int64_t epoch, uint64_t stream) {
    DlRng rng;
    rng.state = dl_mix64(dl_mix64(dl_mix64(seed) + (uint64_t)epoch) + stream);
    return rng;
}

// Fisher-Yates shuffle.
template <typename Index>
static inline void dl_shuffle(std::vector<Index>* items, DlRng* rng) {
    for (size_t i = items->size(); i > 1; i--) {
        size_t j = (size_t)dl_rng_below(rng, i);
        std::swap((*items)[i - 1], (*items)[j]);
    }
}

// ---------------------------------------------------------------------------------
// Shards.

static inline int64_t dl_samples_in(int64_t num_tokens, int T) {
    return num_tokens > 0 ? (num_tokens - 1) / T : 0;
}

// Back to the first batch of epoch 0.
static inline void dataloader_reset(DataLoader* dl) {
    dl->epoch = 0;
    dl->shard_index = 0;
    dl->batch_index = 0;
    dl->micro_step = 0;
}

// Validates a shard's header against its file size and returns its token count; any defect is
// a fatal error naming the file.
static inline int64_t dl_shard_token_count(const char* path) {
    int64_t bytes = file_size(path);
    if (bytes < 0) { fail("cannot stat shard %s: %s", path, strerror(errno)); }
    if (bytes < DATALOADER_HEADER_BYTES) {
        fail("%s: truncated shard: %lld bytes, less than the %lld-byte header", path,
             (long long)bytes, (long long)DATALOADER_HEADER_BYTES);
    }
    FILE* f = fopen_or_fail(path, "rb");
    int32_t header[DATALOADER_HEADER_INTS];
    fread_or_fail(header, sizeof(int32_t), DATALOADER_HEADER_INTS, f, path);
    fclose(f);  // before the checks: with FAIL_THROWS a failed one does not end the process
    if (header[0] != DATALOADER_MAGIC) {
        fail("%s: bad magic number %d (expected %d): not a token shard", path, header[0], DATALOADER_MAGIC);
    }
    if (header[1] != DATALOADER_VERSION) {
        fail("%s: unsupported shard version %d (expected %d)", path, header[1], DATALOADER_VERSION);
    }
    int64_t count = header[2];
    int64_t expected_bytes = DATALOADER_HEADER_BYTES + count * (int64_t)sizeof(uint16_t);
    if (count < 0 || bytes != expected_bytes) {
        fail("%s: %s: header says %lld tokens (%lld bytes) but the file has %lld bytes", path,
             bytes < expected_bytes ? "truncated shard" : "token count mismatch", (long long)count,
             (long long)expected_bytes, (long long)bytes);
    }
    return count;
}

// Reads one shard into `tokens`, validating its header and every token id.
static inline void dl_read_shard(const char* path, uint32_t vocab_size, std::vector<uint16_t>* tokens) {
    int64_t count = dl_shard_token_count(path);
    FILE* f = fopen_or_fail(path, "rb");
    if (fseek(f, DATALOADER_HEADER_BYTES, SEEK_SET) != 0) { fail("%s: cannot seek past the header", path); }
    tokens->resize((size_t)count);
    fread_or_fail(tokens->data(), sizeof(uint16_t), (size_t)count, f, path);
    fclose(f);
    const uint16_t* ids = tokens->data();
    for (int64_t i = 0; i < count; i++) {
        if (ids[i] >= vocab_size) {
            fail("%s: token id %u at token offset %lld (byte offset %lld) is out of range for vocab size %u",
                 path, (unsigned)ids[i], (long long)i,
                 (long long)(DATALOADER_HEADER_BYTES + i * (int64_t)sizeof(uint16_t)), vocab_size);
        }
    }
}

// The files matching `pattern`, sorted bytewise (whatever the locale); none is a fatal error.
static inline std::vector<std::string> dl_glob_sorted(const char* pattern) {
    glob_t matches;
    int rc = glob(pattern, GLOB_NOSORT, nullptr, &matches);
    if (rc == GLOB_NOMATCH) { fail("no data shards match the pattern %s", pattern); }
    if (rc != 0) { fail("cannot expand the data pattern %s (glob error %d)", pattern, rc); }
    std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    globfree(&matches);
    std::sort(paths.begin(), paths.end());
    return paths;
}

// Makes shard `shard` (an index into shard_paths) the one in memory.
static inline void dl_load_shard(DataLoader* dl, int64_t shard) {
    if (dl->loaded_shard == shard) { return; }
    const char* path = dl->shard_paths[(size_t)shard].c_str();
    dl_read_shard(path, dl->vocab_size, &dl->tokens);
    if ((int64_t)dl->tokens.size() != dl->shard_tokens[(size_t)shard]) {
        fail("%s changed since the data loader started (%lld tokens, was %lld)", path,
             (long long)dl->tokens.size(), (long long)dl->shard_tokens[(size_t)shard]);
    }
    dl->loaded_shard = shard;
}

// ---------------------------------------------------------------------------------
// Orders.

// The shard (index into shard_paths) at position `position` of epoch `epoch`.
static inline int64_t dl_shard_at(DataLoader* dl, int64_t epoch, int64_t position) {
    if (!dl->shuffle) { return position; }
    if (dl->shard_order_epoch != epoch) {
        dl->shard_order.resize(dl->shard_paths.size());
        for (size_t i = 0; i < dl->shard_order.size(); i++) { dl->shard_order[i] = (int64_t)i; }
        DlRng rng = dl_rng_for(dl->seed, epoch, 0);
        dl_shuffle(&dl->shard_order, &rng);
        dl->shard_order_epoch = epoch;
    }
    return dl->shard_order[(size_t)position];
}

// Computes the sample order of `shard` in `epoch` (shuffle only).
static inline void dl_update_sample_order(DataLoader* dl, int64_t epoch, int64_t shard) {
    if (dl->sample_order_epoch == epoch && dl->sample_order_shard == shard) { return; }
    int64_t num_samples = dl_samples_in(dl->shard_tokens[(size_t)shard], dl->T);
    dl->sample_order.resize((size_t)num_samples);
    for (int64_t i = 0; i < num_samples; i++) { dl->sample_order[(size_t)i] = (uint32_t)i; }
    DlRng rng = dl_rng_for(dl->seed, epoch, 1 + (uint64_t)shard);
    dl_shuffle(&dl->sample_order, &rng);
    dl->sample_order_epoch = epoch;
    dl->sample_order_shard = shard;
}

// ---------------------------------------------------------------------------------
// Public API.

static inline void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank,
                                   int world_size, int micro_steps, bool shuffle, uint64_t seed,
                                   uint32_t vocab_size) {
    if (B <= 0) { fail("batch size B must be positive, got %d", B); }
    if (T <= 0) { fail("sequence length T must be positive, got %d", T); }
    if (world_size <= 0) { fail("world_size must be positive, got %d", world_size); }
    if (micro_steps <= 0) { fail("micro_steps must be positive, got %d", micro_steps); }
    if (rank < 0 || rank >= world_size) { fail("rank %d is outside [0, world_size=%d)", rank, world_size); }
    if (vocab_size == 0) { fail("vocab_size must be positive"); }
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->world_size = world_size;
    dl->micro_steps = micro_steps;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->vocab_size = vocab_size;
    dl->shard_paths = dl_glob_sorted(pattern);
    dl->shard_tokens.clear();
    dl->shard_batches.clear();
    dl->total_tokens = 0;
    int64_t samples_per_batch = (int64_t)B * world_size * micro_steps;
    for (const std::string& path : dl->shard_paths) {
        int64_t num_tokens = dl_shard_token_count(path.c_str());
        int64_t num_batches = dl_samples_in(num_tokens, T) / samples_per_batch;
        if (num_batches == 0) {
            fail("%s: shard too small: %lld tokens, one batch of B=%d x T=%d x %d micro-batches needs %lld",
                 path.c_str(), (long long)num_tokens, B, T, world_size * micro_steps,
                 (long long)(samples_per_batch * T + 1));
        }
        dl->shard_tokens.push_back(num_tokens);
        dl->shard_batches.push_back(num_batches);
        dl->total_tokens += num_tokens;
    }
    dl->loaded_shard = -1;
    dl->shard_order_epoch = -1;
    dl->sample_order_epoch = -1;
    dl->sample_order_shard = -1;
    dl_load_shard(dl, dl_shard_at(dl, 0, 0));  // the first batch's shard, its tokens checked now
    dl->inputs = (int32_t*)malloc_or_fail((size_t)B * T * sizeof(int32_t));
    dl->targets = (int32_t*)malloc_or_fail((size_t)B * T * sizeof(int32_t));
    dataloader_reset(dl);
}

// Fills inputs/targets with this process's next micro-batch, then advances the position.
static inline void dataloader_next_batch(DataLoader* dl) {
    int64_t shard = dl_shard_at(dl, dl->epoch, dl->shard_index);
    dl_load_shard(dl, shard);
    if (dl->shuffle) { dl_update_sample_order(dl, dl->epoch, shard); }
    int64_t micro_batch = dl->batch_index * dl->micro_steps + dl->micro_step;
    int64_t first_position = (micro_batch * dl->world_size + dl->rank) * dl->B;
    const uint16_t* tokens = dl->tokens.data();
    for (int b = 0; b < dl->B; b++) {
        int64_t position = first_position + b;
        int64_t sample = dl->shuffle ? dl->sample_order[(size_t)position] : position;
        const uint16_t* row = tokens + sample * dl->T;
        int32_t* inputs = dl->inputs + (size_t)b * dl->T;
        int32_t* targets = dl->targets + (size_t)b * dl->T;
        for (int t = 0; t < dl->T; t++) {
            inputs[t] = row[t];
            targets[t] = row[t + 1];
        }
    }
    if (++dl->micro_step < dl->micro_steps) { return; }
    dl->micro_step = 0;
    dl->batch_index++;
    if (dl->batch_index == dl->shard_batches[(size_t)shard]) {
        dl->batch_index = 0;
        dl->shard_index++;
        if (dl->shard_index == (int64_t)dl->shard_paths.size()) {
            dl->shard_index = 0;
            dl->epoch++;
        }
    }
}


static inline DataLoaderState dataloader_state(const DataLoader* dl) {
    DataLoaderState state;
    memset(&state, 0, sizeof(state));
    state.epoch = dl->epoch;
    state.shard_index = dl->shard_index;
    state.batch_index = dl->batch_index;
    state.seed = dl->seed;
    state.num_shards = (int64_t)dl->shard_paths.size();
    state.num_tokens = dl->total_tokens;
    state.B = dl->B;
    state.T = dl->T;
    state.micro_batches = dl->world_size * dl->micro_steps;
    state.shuffle = dl->shuffle ? 1 : 0;
    return state;
}

// Continues from a saved position. The configuration must match (the seed only matters,
// and so is only compared, when shuffling) and the data set must have the same shape.
static inline void dataloader_restore(DataLoader* dl, const DataLoaderState* state) {
    DataLoaderState own = dataloader_state(dl);
    bool seed_differs = dl->shuffle && state->seed != own.seed;
    if (state->B != own.B || state->T != own.T || state->micro_batches != own.micro_batches ||
        state->shuffle != own.shuffle || seed_differs) {
        fail("data loader state does not match: saved B=%d T=%d micro-batches=%d shuffle=%d seed=%llu, "
             "now B=%d T=%d micro-batches=%d shuffle=%d seed=%llu",
             state->B, state->T, state->micro_batches, state->shuffle, (unsigned long long)state->seed,
             own.B, own.T, own.micro_batches, own.shuffle, (unsigned long long)own.seed);
    }
    if (state->num_shards != own.num_shards || state->num_tokens != own.num_tokens) {
        fail("data loader state is for another data set: saved %lld shards / %lld tokens, now %lld / %lld",
             (long long)state->num_shards, (long long)state->num_tokens, (long long)own.num_shards,
             (long long)own.num_tokens);
    }
    bool shard_ok = state->shard_index >= 0 && state->shard_index < own.num_shards;
    if (state->epoch < 0 || !shard_ok) {
        fail("data loader state out of range: epoch %lld, shard %lld of %lld", (long long)state->epoch,
             (long long)state->shard_index, (long long)own.num_shards);
    }
    int64_t shard = dl_shard_at(dl, state->epoch, state->shard_index);
    int64_t num_batches = dl->shard_batches[(size_t)shard];
    if (state->batch_index < 0 || state->batch_index >= num_batches) {
        fail("data loader state out of range: batch %lld of %lld in %s", (long long)state->batch_index,
             (long long)num_batches, dl->shard_paths[(size_t)shard].c_str());
    }
    dl->epoch = state->epoch;
    dl->shard_index = state->shard_index;
    dl->batch_index = state->batch_index;
    dl->micro_step = 0;
}

// ---------------------------------------------------------------------------------
// Evaluation rows: the samples that one process with one micro-step reads, numbered in its
// reading order (row j is row j % B of its batch j / B). Split over the ranks by rows, they give
// every rank the same rows to score whatever the number of ranks, so a validation loss summed
// in row order does not depend on it.

struct RowRange { int64_t begin, end; };

// Rank `rank`'s contiguous share of `rows` rows over `world` ranks; the first rows % world ranks
// take one row more.
static inline RowRange split_rows(int64_t rows, int rank, int world) {
    int64_t base = rows / world, extra = rows % world;
    int64_t begin = rank * base + std::min<int64_t>(rank, extra);
    return RowRange{begin, begin + base + (rank < extra ? 1 : 0)};
}

// Fills the B rows of inputs/targets with rows [first, first + count) of the loader's reading
// order (count <= B; the rest repeat the last one). The loader must read for one process with one
// micro-step; its position is left alone.
static inline void dataloader_read_rows(DataLoader* dl, int64_t first, int count) {
    if (dl->world_size != 1 || dl->micro_steps != 1 || count < 1 || count > dl->B) {
        fail("dataloader_read_rows: %d rows from a loader of B=%d for %d processes x %d micro-steps", count, dl->B,
             dl->world_size, dl->micro_steps);
    }
    for (int b = 0; b < dl->B; b++) {
        int64_t row = first + std::min(b, count - 1), batch = row / dl->B, position = 0;
        int64_t shard = dl_shard_at(dl, 0, position);
        while (batch >= dl->shard_batches[(size_t)shard]) {  // the batch's shard, in epoch 0's order
            batch -= dl->shard_batches[(size_t)shard];
            if (++position == (int64_t)dl->shard_paths.size()) { fail("dataloader_read_rows: row %lld is past the data", (long long)row); }
            shard = dl_shard_at(dl, 0, position);
        }
        dl_load_shard(dl, shard);
        if (dl->shuffle) { dl_update_sample_order(dl, 0, shard); }
        int64_t sample = batch * dl->B + row % dl->B;
        if (dl->shuffle) { sample = dl->sample_order[(size_t)sample]; }
        const uint16_t* tokens = dl->tokens.data() + sample * dl->T;
        for (int t = 0; t < dl->T; t++) {
            dl->inputs[(size_t)b * dl->T + t] = tokens[t];
            dl->targets[(size_t)b * dl->T + t] = tokens[t + 1];
        }
    }
}

// Fails, naming the file, unless `pattern` matches shards with valid headers and sizes: the
// checks dataloader_init starts with, for a launcher to make once before it starts the ranks.
static inline void dataloader_check_pattern(const char* pattern) {
    for (const std::string& path : dl_glob_sorted(pattern)) { dl_shard_token_count(path.c_str()); }
}

// Batches one process gets per epoch (the same on every rank).
static inline size_t dataloader_batches_per_epoch(const DataLoader* dl) {
    int64_t total = 0;
    for (int64_t n : dl->shard_batches) { total += n; }
    return (size_t)total;
}

// The largest B for which every shard matching `pattern` holds at least one batch of B x T
// per micro-batch (0 if some shard has fewer than T+1 tokens): lets a small validation split
// serve any B.
static inline int dataloader_max_batch(const char* pattern, int T, int micro_batches) {
    int64_t max_batch = INT32_MAX;
    for (const std::string& path : dl_glob_sorted(pattern)) {
        max_batch = std::min(max_batch, dl_samples_in(dl_shard_token_count(path.c_str()), T) / micro_batches);
    }
    return (int)max_batch;
}

static inline void dataloader_free(DataLoader* dl) {
    free(dl->inputs);
    free(dl->targets);
    dl->inputs = nullptr;
    dl->targets = nullptr;
    dl->shard_paths.clear();
    dl->shard_tokens.clear();
    dl->shard_batches.clear();
    std::vector<uint16_t>().swap(dl->tokens);
    std::vector<int64_t>().swap(dl->shard_order);
    std::vector<uint32_t>().swap(dl->sample_order);
    dl->loaded_shard = -1;
}
