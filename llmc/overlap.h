// Whether a data-parallel run moves its gradients beside the backward pass and its parameters
// beside the next forward pass (--overlap on), or all of them between the passes (off); `auto`
// decides from the link NCCL moves them over, by the rule the measurements below give. Either way
// the numbers are bit-identical. Every rank sees the link from its own host (LinkView); the run
// decides once from all of them (overlap_run_link), so the ranks agree by construction.
#pragma once

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <algorithm>
#include <string>
#include <vector>

enum OverlapMode : int { OVERLAP_AUTO = 0, OVERLAP_ON = 1, OVERLAP_OFF = 2 };
constexpr const char* OVERLAP_NAMES[] = {"auto", "on", "off"};  // by OverlapMode, as --overlap spells them

// The link between the ranks, as the run can tell it: GPUs of one host that reach each other's
// memory (NVLink or PCIe peer to peer), one host without that (NCCL through host shared memory),
// or NCCL's network transport (several hosts, or NCCL told to use neither of the others): RDMA
// (InfiniBand, RoCE, or a plugin such as EFA's) or TCP sockets. In that order of capability: the
// run takes the least capable link any rank sees.
enum Link : int { LINK_PEER = 0, LINK_HOST_MEMORY = 1, LINK_RDMA = 2, LINK_SOCKETS = 3 };
constexpr const char* LINK_NAMES[] = {"GPU peer to peer", "host shared memory", "network, RDMA", "network, sockets"};

// NCCL's environment switches that choose the link, as the run has them (nullptr: unset).
struct NcclLinkSwitches {
    const char* p2p_disable;  // NCCL_P2P_DISABLE
    const char* shm_disable;  // NCCL_SHM_DISABLE
    const char* ib_disable;   // NCCL_IB_DISABLE
    const char* net;          // NCCL_NET: "IB", "Socket" or a plugin's name
};

static inline NcclLinkSwitches nccl_link_switches_from_environment() {
    return {getenv("NCCL_P2P_DISABLE"), getenv("NCCL_SHM_DISABLE"), getenv("NCCL_IB_DISABLE"), getenv("NCCL_NET")};
}

// Whether the host has an InfiniBand or RoCE device (an entry in `dir`, as NCCL looks for them).
static inline bool rdma_device_present(const char* dir = "/sys/class/infiniband") {
    DIR* d = opendir(dir);
    if (d == nullptr) { return false; }
    bool found = false;
    for (dirent* entry; !found && (entry = readdir(d)) != nullptr;) { found = entry->d_name[0] != '.'; }
    closedir(d);
    return found;
}

struct OverlapChoice {
    bool on;
    std::string why;  // for the configuration table
};

// The link NCCL will take between ranks on `hosts` hosts: its switches first, then whether this GPU
// reaches the others' memory; a network is RDMA unless NCCL_NET names sockets, NCCL_IB_DISABLE=1,
// or the host has no RDMA device (NCCL's own order).
static inline Link overlap_link(int hosts, bool peer_access, NcclLinkSwitches nccl, bool rdma_device) {
    auto set = [](const char* v) { return v != nullptr && strcmp(v, "1") == 0; };
    if (hosts == 1 && peer_access && !set(nccl.p2p_disable)) { return LINK_PEER; }
    if (hosts == 1 && !set(nccl.shm_disable)) { return LINK_HOST_MEMORY; }
    if (nccl.net != nullptr && nccl.net[0] != '\0') { return strcasecmp(nccl.net, "Socket") == 0 ? LINK_SOCKETS : LINK_RDMA; }
    return rdma_device && !set(nccl.ib_disable) ? LINK_RDMA : LINK_SOCKETS;
}

// What one rank sees of the link, shared with every rank: its host (a hash of the name) and the
// link it would take with all ranks on one host or on several (overlap_link, Link's values).
struct LinkView {
    uint64_t host;
    int32_t one_host, several_hosts;
};

static inline LinkView link_view(uint64_t host, bool peer_access, NcclLinkSwitches nccl, bool rdma_device) {
    return {host, overlap_link(1, peer_access, nccl, rdma_device), overlap_link(2, peer_access, nccl, rdma_device)};
}

// The run's link from every rank's view (world of them), the same on every rank: on one host or
// on several as the views' hosts say, the least capable link any rank sees (a collective moves at
// its slowest link's pace).
static inline Link overlap_run_link(const LinkView* views, int world) {
    std::vector<uint64_t> hosts(world);
    for (int r = 0; r < world; r++) { hosts[r] = views[r].host; }
    std::sort(hosts.begin(), hosts.end());
    bool one_host = std::unique(hosts.begin(), hosts.end()) - hosts.begin() == 1;
    int32_t link = LINK_PEER;
    for (int r = 0; r < world; r++) { link = std::max(link, one_host ? views[r].one_host : views[r].several_hosts); }
    return (Link)link;
}

// Measured (README "Several GPUs", 2026-11-27). Over NVLink (4 H100s) the overlap hides nearly all
// of the moves, but NCCL's kernels beside the passes slow them more (d12, d24, d48: 64.6 / 170.9 /
// 366.9 ms a step off, 65.6 / 173.9 / 374.2 on; fewer CTAs move too slowly to hide); the model's
// size did not change the answer. Over host shared memory (2 H200s, 22.9 GB/s) it hides the moves
// at no cost (d12: 77.2 -> 71.0 ms, d48: 587.7 -> 475.9). Over sockets (2.45 GB/s) the moves are
// most of the step, and bucket by bucket they take longer than in one piece: on is slower (d12:
// 220.4 -> 255.0 ms, at 4 and 8 micro-steps too; d48: 2452 -> 2892). RDMA networks were not
// measured: their rate and their moves without the CPU are those of host shared memory, so they
// take its answer.
static inline OverlapChoice overlap_choose(OverlapMode mode, int world, Link link) {
    char why[160];
    if (world == 1) { return {false, "off (one GPU: nothing moves)"}; }
    if (mode != OVERLAP_AUTO) {
        snprintf(why, sizeof(why), "%s (--overlap %s)", OVERLAP_NAMES[mode], OVERLAP_NAMES[mode]);
        return {mode == OVERLAP_ON, why};
    }
    bool on = link == LINK_HOST_MEMORY || link == LINK_RDMA;
    snprintf(why, sizeof(why), "%s (auto: %s)", on ? "on" : "off", LINK_NAMES[link]);
    return {on, why};
}
