// Whether a data-parallel run moves its gradients beside the backward pass and its parameters
// beside the next forward pass (--overlap on), or all of them between the passes (off); `auto`
// decides from the link NCCL moves them over, by the rule the measurements below give. Either way
// the numbers are bit-identical.
#pragma once

#include <stddef.h>
#include <stdio.h>

#include <string>

enum OverlapMode : int { OVERLAP_AUTO = 0, OVERLAP_ON = 1, OVERLAP_OFF = 2 };
constexpr const char* OVERLAP_NAMES[] = {"auto", "on", "off"};  // by OverlapMode, as --overlap spells them

// The link between the ranks, as the run can tell it: GPUs of one host that reach each other's
// memory (NVLink or PCIe peer to peer), one host without that (NCCL through host shared memory),
// or a network (several hosts, or NCCL told to use neither).
enum Link : int { LINK_PEER = 0, LINK_HOST_MEMORY = 1, LINK_NETWORK = 2 };
constexpr const char* LINK_NAMES[] = {"GPU peer to peer", "host shared memory", "network"};

struct OverlapChoice {
    bool on;
    std::string why;  // for the configuration table
};

// Measured on 4 H100s (README "Several GPUs", 2026-11-27): over NVLink the overlap hides nearly all
// of the moves, but NCCL's kernels beside the passes slow them more (d12, d24, d48: 64.6 / 170.9 /
// 366.9 ms a step off, 65.6 / 173.9 / 374.2 on; fewer CTAs move too slowly to hide); over host
// shared memory it hides 255 of d48's 268 ms at no cost (597.9 -> 521.1 ms), and a network is
// slower still. The model's size did not change the answer over NVLink (d12 to d48).
// The link NCCL will take between ranks on `hosts` hosts: its own environment switches first
// (NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1), then whether this GPU reaches the others' memory.
static inline Link overlap_link(int hosts, bool peer_access, const char* p2p_disable, const char* shm_disable) {
    auto set = [](const char* v) { return v != nullptr && v[0] == '1' && v[1] == '\0'; };
    if (hosts > 1 || (set(p2p_disable) && set(shm_disable))) { return LINK_NETWORK; }
    if (set(p2p_disable) || !peer_access) { return LINK_HOST_MEMORY; }
    return LINK_PEER;
}

static inline OverlapChoice overlap_choose(OverlapMode mode, int world, Link link) {
    char why[160];
    if (world == 1) { return {false, "off (one GPU: nothing moves)"}; }
    if (mode != OVERLAP_AUTO) {
        snprintf(why, sizeof(why), "%s (--overlap %s)", OVERLAP_NAMES[mode], OVERLAP_NAMES[mode]);
        return {mode == OVERLAP_ON, why};
    }
    bool on = link != LINK_PEER;
    snprintf(why, sizeof(why), "%s (auto: %s)", on ? "on" : "off", LINK_NAMES[link]);
    return {on, why};
}
