// CPU tests of llmc/overlap.h: the link a run sees (NCCL's switches, hosts, peer access, an RDMA
// device), the run's link from every rank's view, and the rule of --overlap auto, with what the
// configuration table says about it.
#include "dev/test/testing.h"
#include "llmc/overlap.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>

static const NcclLinkSwitches NONE = {nullptr, nullptr, nullptr, nullptr};

static NcclLinkSwitches switches(const char* p2p, const char* shm, const char* ib = nullptr, const char* net = nullptr) {
    return {p2p, shm, ib, net};
}

TEST(one_host_from_switches_and_peer_access) {
    CHECK(overlap_link(1, true, NONE, false) == LINK_PEER);
    CHECK(overlap_link(1, false, NONE, false) == LINK_HOST_MEMORY);
    CHECK(overlap_link(1, true, switches("1", nullptr), false) == LINK_HOST_MEMORY);
    CHECK(overlap_link(1, true, switches(nullptr, "1"), false) == LINK_PEER);  // shared memory off: still peer to peer
    CHECK(overlap_link(1, false, switches(nullptr, "1"), false) == LINK_SOCKETS);  // neither: NCCL's network
    CHECK(overlap_link(1, true, switches("1", "1"), false) == LINK_SOCKETS);
    CHECK(overlap_link(1, true, switches("1", "1"), true) == LINK_RDMA);  // through the host's own HCA
    CHECK(overlap_link(1, true, switches("0", "0"), false) == LINK_PEER);
    CHECK(overlap_link(1, true, switches("", "10"), false) == LINK_PEER);  // only "1" switches
}

TEST(network_rdma_or_sockets) {
    CHECK(overlap_link(2, true, NONE, true) == LINK_RDMA);
    CHECK(overlap_link(2, true, NONE, false) == LINK_SOCKETS);
    CHECK(overlap_link(2, true, switches(nullptr, nullptr, "1"), true) == LINK_SOCKETS);  // NCCL_IB_DISABLE=1
    CHECK(overlap_link(2, true, switches(nullptr, nullptr, "0"), true) == LINK_RDMA);
    CHECK(overlap_link(2, true, switches(nullptr, nullptr, nullptr, "Socket"), true) == LINK_SOCKETS);
    CHECK(overlap_link(2, true, switches(nullptr, nullptr, nullptr, "socket"), true) == LINK_SOCKETS);
    CHECK(overlap_link(2, true, switches(nullptr, nullptr, nullptr, "IB"), false) == LINK_RDMA);
    CHECK(overlap_link(2, true, switches(nullptr, nullptr, nullptr, "AWS Libfabric"), false) == LINK_RDMA);
    CHECK(overlap_link(2, true, switches(nullptr, nullptr, nullptr, ""), false) == LINK_SOCKETS);  // empty: unset
    CHECK(overlap_link(4, false, switches("1", "1"), true) == LINK_RDMA);  // one-host switches change nothing
}

TEST(rdma_device_from_a_folder) {
    char dir[] = "/tmp/test_overlap_XXXXXX";
    CHECK(mkdtemp(dir) != nullptr);
    CHECK(!rdma_device_present(dir));  // empty
    std::string device = std::string(dir) + "/mlx5_0";
    CHECK(mkdir(device.c_str(), 0700) == 0);
    CHECK(rdma_device_present(dir));
    CHECK(rmdir(device.c_str()) == 0 && rmdir(dir) == 0);
    CHECK(!rdma_device_present(dir));  // missing
}

// Two hosts' hashes, and views of the link that see it as it is and as it is with sockets only.
static const uint64_t HOST_A = 0x1111, HOST_B = 0x2222;
static LinkView peer_view(uint64_t host) { return link_view(host, true, NONE, true); }
static LinkView sockets_view(uint64_t host) { return link_view(host, false, switches("1", "1", "1"), true); }

TEST(run_link_on_one_host_or_several_from_the_views_hosts) {
    LinkView one_host[2] = {peer_view(HOST_A), peer_view(HOST_A)};
    CHECK(overlap_run_link(one_host, 2) == LINK_PEER);
    LinkView two_hosts[4] = {peer_view(HOST_A), peer_view(HOST_A), peer_view(HOST_B), peer_view(HOST_B)};
    CHECK(overlap_run_link(two_hosts, 4) == LINK_RDMA);  // each rank's network view, not its peers
    CHECK(overlap_run_link(two_hosts, 1) == LINK_PEER);  // one rank: its own host
}

TEST(run_link_is_the_least_capable_any_rank_sees) {
    LinkView no_peer[3] = {peer_view(HOST_A), link_view(HOST_A, false, NONE, false), peer_view(HOST_A)};
    CHECK(overlap_run_link(no_peer, 3) == LINK_HOST_MEMORY);
    LinkView one_without_rdma[2] = {peer_view(HOST_A), link_view(HOST_B, true, NONE, false)};
    CHECK(overlap_run_link(one_without_rdma, 2) == LINK_SOCKETS);  // hosts that differ in /sys/class/infiniband
    LinkView switched[2] = {sockets_view(HOST_A), peer_view(HOST_A)};
    CHECK(overlap_run_link(switched, 2) == LINK_SOCKETS);  // NCCL_* switches that differ between ranks
}

// Every rank combines the same gathered views, in any rank order, to the same link.
TEST(run_link_does_not_depend_on_the_ranks_order) {
    LinkView views[4] = {peer_view(HOST_A), sockets_view(HOST_B), link_view(HOST_A, false, NONE, false),
                         peer_view(HOST_B)};
    Link first = overlap_run_link(views, 4);
    std::sort(views, views + 4, [](const LinkView& a, const LinkView& b) { return a.several_hosts > b.several_hosts; });
    CHECK(overlap_run_link(views, 4) == first && first == LINK_SOCKETS);
}

TEST(one_gpu_never_overlaps) {
    for (OverlapMode mode : {OVERLAP_AUTO, OVERLAP_ON, OVERLAP_OFF}) {
        OverlapChoice choice = overlap_choose(mode, 1, LINK_RDMA);
        CHECK(!choice.on);
        CHECK(choice.why == "off (one GPU: nothing moves)");
    }
}

TEST(on_and_off_are_obeyed) {
    OverlapChoice on = overlap_choose(OVERLAP_ON, 2, LINK_PEER);
    CHECK(on.on && on.why == "on (--overlap on)");
    OverlapChoice off = overlap_choose(OVERLAP_OFF, 4, LINK_RDMA);
    CHECK(!off.on && off.why == "off (--overlap off)");
}

TEST(auto_on_over_host_memory_and_rdma_off_between_peers_and_over_sockets) {
    OverlapChoice peer = overlap_choose(OVERLAP_AUTO, 4, LINK_PEER);
    CHECK(!peer.on && peer.why == "off (auto: GPU peer to peer)");
    OverlapChoice host = overlap_choose(OVERLAP_AUTO, 2, LINK_HOST_MEMORY);
    CHECK(host.on && host.why == "on (auto: host shared memory)");
    OverlapChoice rdma = overlap_choose(OVERLAP_AUTO, 8, LINK_RDMA);
    CHECK(rdma.on && rdma.why == "on (auto: network, RDMA)");
    OverlapChoice sockets = overlap_choose(OVERLAP_AUTO, 8, LINK_SOCKETS);
    CHECK(!sockets.on && sockets.why == "off (auto: network, sockets)");
}

TEST_MAIN()
