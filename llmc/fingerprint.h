// FNV-1a (64-bit), the one hash of what must be equal: across the ranks of a run (run_fingerprint:
// the flags that shape it, the model's shape, the data set and the step it starts from) and across
// runs (the trainer's weights checksum). fnv1a() folds in units of one size: bytes for a
// fingerprint, 32-bit words for the weights (one per parameter, as the checksum has always been).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#include "llmc/dataloader.h"
#include "llmc/model_file.h"
#include "llmc/run_shape.h"

constexpr uint64_t FNV1A_OFFSET = 0xcbf29ce484222325ull;
constexpr uint64_t FNV1A_PRIME = 0x100000001b3ull;

// The hash so far (FNV1A_OFFSET before the first unit) extended by `count` units.
template <typename Unit>
static inline uint64_t fnv1a(uint64_t hash, const Unit* units, size_t count) {
    static_assert(std::is_unsigned<Unit>::value, "FNV-1a folds in unsigned units");
    for (size_t i = 0; i < count; i++) { hash = (hash ^ units[i]) * FNV1A_PRIME; }
    return hash;
}

static inline uint64_t fnv1a_bytes(uint64_t hash, const void* data, size_t size) {
    return fnv1a(hash, (const uint8_t*)data, size);
}

// What must be the same on every rank: the flags that shape the run, the model's shape, the data
// set (shard paths and sizes) and the step it starts from.
static inline uint64_t run_fingerprint(const RunShape* shape, const ModelShape* model, const DataLoader* train,
                                       const DataLoader* val, int start_step) {
    uint64_t hash = fnv1a_bytes(FNV1A_OFFSET, shape, sizeof(*shape));
    hash = fnv1a_bytes(hash, model, sizeof(*model));
    for (const DataLoader* loader : {train, val}) {
        for (size_t i = 0; i < loader->shard_paths.size(); i++) {
            hash = fnv1a_bytes(hash, loader->shard_paths[i].c_str(), loader->shard_paths[i].size() + 1);
            hash = fnv1a_bytes(hash, &loader->shard_tokens[i], sizeof(loader->shard_tokens[i]));
        }
    }
    return fnv1a_bytes(hash, &start_step, sizeof(start_step));
}
