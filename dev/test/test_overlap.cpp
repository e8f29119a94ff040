// CPU tests of llmc/overlap.h: the link a run sees (NCCL's switches, hosts, peer access) and the
// rule of --overlap auto, with what the configuration table says about it.
#include "dev/test/testing.h"
#include "llmc/overlap.h"

TEST(link_from_hosts_switches_and_peer_access) {
    CHECK(overlap_link(1, true, nullptr, nullptr) == LINK_PEER);
    CHECK(overlap_link(1, false, nullptr, nullptr) == LINK_HOST_MEMORY);
    CHECK(overlap_link(1, true, "1", nullptr) == LINK_HOST_MEMORY);
    CHECK(overlap_link(1, true, "1", "1") == LINK_NETWORK);
    CHECK(overlap_link(1, true, nullptr, "1") == LINK_PEER);  // shared memory off: NCCL still goes peer to peer
    CHECK(overlap_link(2, true, nullptr, nullptr) == LINK_NETWORK);
    CHECK(overlap_link(1, true, "0", "0") == LINK_PEER);
    CHECK(overlap_link(1, true, "", "10") == LINK_PEER);  // only "1" switches
}

TEST(one_gpu_never_overlaps) {
    for (OverlapMode mode : {OVERLAP_AUTO, OVERLAP_ON, OVERLAP_OFF}) {
        OverlapChoice choice = overlap_choose(mode, 1, LINK_NETWORK);
        CHECK(!choice.on);
        CHECK(choice.why == "off (one GPU: nothing moves)");
    }
}

TEST(on_and_off_are_obeyed) {
    OverlapChoice on = overlap_choose(OVERLAP_ON, 2, LINK_PEER);
    CHECK(on.on && on.why == "on (--overlap on)");
    OverlapChoice off = overlap_choose(OVERLAP_OFF, 4, LINK_NETWORK);
    CHECK(!off.on && off.why == "off (--overlap off)");
}

TEST(auto_off_between_gpu_peers_on_over_slower_links) {
    OverlapChoice peer = overlap_choose(OVERLAP_AUTO, 4, LINK_PEER);
    CHECK(!peer.on && peer.why == "off (auto: GPU peer to peer)");
    OverlapChoice host = overlap_choose(OVERLAP_AUTO, 2, LINK_HOST_MEMORY);
    CHECK(host.on && host.why == "on (auto: host shared memory)");
    OverlapChoice network = overlap_choose(OVERLAP_AUTO, 8, LINK_NETWORK);
    CHECK(network.on && network.why == "on (auto: network)");
}

TEST_MAIN()
