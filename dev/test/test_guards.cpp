// Tests of the host-side guards of a training run: CRC32C (llmc/checksum.h), the gradient-norm
// spike detector (llmc/outlier.h), preemption signals (llmc/signals.h), and in llmc/utils.h the
// cleanup of stale temporary files (this host's only) and atomic writes, which fail on a full
// disk and sync the directory of the rename.
// Run from the repo root: build/test_guards [name filter]
#include <math.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/checksum.h"
#include "llmc/outlier.h"
#include "llmc/signals.h"
#include "llmc/utils.h"

// ----------------------------------------------------------------------------
// helpers

// CRC32C one bit at a time, straight from the definition.
static uint32_t crc32c_bitwise(const uint8_t* data, size_t n) {
    uint32_t reg = 0xFFFFFFFF;
    for (size_t i = 0; i < n; i++) {
        reg ^= data[i];
        for (int bit = 0; bit < 8; bit++) { reg = (reg >> 1) ^ ((reg & 1) ? 0x82F63B78 : 0); }
    }
    return ~reg;
}

static uint32_t crc_of(const std::string& bytes) { return crc32c_update(0, bytes.data(), bytes.size()); }

static std::vector<uint8_t> random_bytes(size_t n, std::mt19937* rng) {
    std::vector<uint8_t> bytes(n);
    for (uint8_t& b : bytes) { b = (uint8_t)(*rng)(); }
    return bytes;
}

static bool same_bits(double a, double b) { return memcmp(&a, &b, sizeof(double)) == 0; }

// z of `value` against `values` (oldest first) by the documented recipe, for comparison.
static double reference_zscore(const std::vector<double>& values, double value) {
    double sum = 0.0, squares = 0.0;
    for (double v : values) { sum += v; }
    double mean = sum / values.size();
    for (double v : values) { squares += (v - mean) * (v - mean); }
    return (value - mean) / sqrt(squares / values.size());
}

// The names in `dir`, sorted.
static std::vector<std::string> dir_names(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) { names.push_back(entry.path().filename().string()); }
    std::sort(names.begin(), names.end());
    return names;
}

// The PID of a process that has exited (and been reaped).
static pid_t dead_pid(void) {
    pid_t pid = fork();
    if (pid == 0) { _exit(0); }
    waitpid(pid, nullptr, 0);
    return pid;
}

static std::string this_host(void) {
    char host[ATOMIC_HOST_MAX + 1];
    atomic_host_name(host);
    return host;
}

// A temporary file's name as open_atomic makes it, of this host unless another is given.
static std::string temp_name(const std::string& base, pid_t pid, const std::string& host = this_host()) {
    return base + ".tmp." + host + "." + std::to_string(pid);
}

// A temporary file's name as versions before the host was in it made it.
static std::string old_temp_name(const std::string& base, pid_t pid) { return base + ".tmp." + std::to_string(pid); }

// The exit status of fn() run in a child, or -1 if the child did not exit normally.
template <typename F>
static int child_exit_status(F fn, char* err, size_t err_size) {
    int status = run_in_child(fn, err, err_size);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// ----------------------------------------------------------------------------
// CRC32C

TEST(crc32c_known_vectors) {
    CHECK(crc_of("123456789") == 0xE3069283);
    CHECK(crc_of(std::string(32, '\0')) == 0x8A9136AA);
    CHECK(crc_of(std::string(32, '\xFF')) == 0x62A8AB43);
    std::string ascending, descending;
    for (int i = 0; i < 32; i++) {
        ascending += (char)i;
        descending += (char)(31 - i);
    }
    CHECK(crc_of(ascending) == 0x46DD794E);  // RFC 3720's iSCSI vectors
    CHECK(crc_of(descending) == 0x113FDB5C);
    CHECK(crc_of("") == 0);
    CHECK(crc32c_update(0x12345678, nullptr, 0) == 0x12345678);  // no bytes: no change
}

// Every length 0..300 from every start offset 0..7 (unaligned loads, the 8-byte steps and the tail).
TEST(crc32c_matches_bitwise_definition) {
    std::mt19937 rng(1);
    std::vector<uint8_t> bytes = random_bytes(320, &rng);
    bool all_match = true;
    for (size_t offset = 0; offset < 8; offset++) {
        for (size_t n = 0; n <= 300; n++) {
            all_match = all_match && crc32c_update(0, bytes.data() + offset, n) == crc32c_bitwise(bytes.data() + offset, n);
        }
    }
    CHECK(all_match);
}

TEST(crc32c_streams_in_any_split) {
    std::mt19937 rng(2);
    std::vector<uint8_t> bytes = random_bytes(100000, &rng);
    uint32_t one_shot = crc32c_update(0, bytes.data(), bytes.size());
    CHECK(one_shot == crc32c_bitwise(bytes.data(), bytes.size()));
    for (int trial = 0; trial < 20; trial++) {
        uint32_t crc = 0;
        for (size_t pos = 0; pos < bytes.size();) {
            size_t n = std::min(bytes.size() - pos, (size_t)(rng() % (trial < 10 ? 17 : 5000)));
            crc = crc32c_update(crc, bytes.data() + pos, n);
            pos += n;
        }
        CHECK(crc == one_shot);
    }
}

// ----------------------------------------------------------------------------
// outlier window

TEST(outlier_zscore_against_a_full_window) {
    OutlierWindow w;
    outlier_init(&w, 4);
    outlier_push(&w, 100.0);  // pushed out when the fifth value arrives
    for (double v : {1.0, 2.0}) {
        outlier_push(&w, v);
        CHECK(outlier_zscore(&w, 1000.0) == 0.0);  // fewer than W values: never a spike
    }
    outlier_push(&w, 3.0);
    CHECK(outlier_zscore(&w, 1000.0) > 20.0);  // 100, 1, 2, 3
    outlier_push(&w, 4.0);
    // 1, 2, 3, 4: mean 2.5, population variance 1.25
    CHECK(fabs(outlier_zscore(&w, 5.0) - sqrt(5.0)) < 1e-12);
    CHECK(fabs(outlier_zscore(&w, 0.0) + sqrt(5.0)) < 1e-12);
    CHECK(outlier_zscore(&w, 2.5) == 0.0);
}

TEST(outlier_equal_values_give_zero_not_a_division) {
    for (double v : {0.0, 0.1, 3.0, 1e30}) {
        OutlierWindow w;
        outlier_init(&w, 8);
        for (int i = 0; i < 8; i++) { outlier_push(&w, v); }
        double z_far = outlier_zscore(&w, v * 2 + 1), z_same = outlier_zscore(&w, v);
        CHECK(z_far == 0.0 && z_same == 0.0);  // 0.1's mean is off by rounding: still 0
    }
}

TEST(outlier_ignores_non_finite_values) {
    OutlierWindow w;
    outlier_init(&w, 3);
    outlier_push(&w, 1.0);
    OutlierWindow before = w;
    outlier_push(&w, NAN);
    outlier_push(&w, INFINITY);
    outlier_push(&w, -INFINITY);
    CHECK(memcmp(&before, &w, sizeof(w)) == 0);
    CHECK(outlier_valid(&w));
}

// The sums run oldest to newest whatever the ring's position: bit-identical to the recipe on a
// list, at every step of a long random sequence.
TEST(outlier_sums_in_ring_order) {
    std::mt19937 rng(3);
    std::lognormal_distribution<double> norms(0.0, 0.5);
    OutlierWindow w;
    outlier_init(&w, 37);
    std::vector<double> recent;
    bool all_same = true;
    for (int step = 0; step < 500; step++) {
        double norm = norms(rng);
        if (recent.size() == 37) { all_same = all_same && same_bits(outlier_zscore(&w, norm), reference_zscore(recent, norm)); }
        outlier_push(&w, norm);
        recent.push_back(norm);
        if (recent.size() > 37) { recent.erase(recent.begin()); }
    }
    CHECK(all_same);
}

// A window copied out as bytes (as into a checkpoint) and back continues bit for bit.
TEST(outlier_restores_bit_for_bit) {
    std::mt19937 rng(4);
    std::lognormal_distribution<double> norms(1.0, 0.3);
    OutlierWindow w;
    outlier_init(&w, OUTLIER_CAPACITY);
    for (int step = 0; step < 200; step++) { outlier_push(&w, norms(rng)); }
    unsigned char saved[sizeof(OutlierWindow)];
    memcpy(saved, &w, sizeof(w));
    OutlierWindow restored;
    memcpy(&restored, saved, sizeof(restored));
    CHECK(outlier_valid(&restored));
    bool all_same = true;
    for (int step = 0; step < 300; step++) {
        double norm = norms(rng);
        all_same = all_same && same_bits(outlier_zscore(&w, norm), outlier_zscore(&restored, norm));
        outlier_push(&w, norm);
        outlier_push(&restored, norm);
    }
    CHECK(all_same && memcmp(&w, &restored, sizeof(w)) == 0);
}

TEST(outlier_valid_rejects_corrupt_windows) {
    OutlierWindow w;
    outlier_init(&w, 4);
    outlier_push(&w, 1.0);
    CHECK(outlier_valid(&w));
    OutlierWindow bad = w;
    bad.next = 4;
    CHECK(!outlier_valid(&bad));
    bad = w;
    bad.window = OUTLIER_CAPACITY + 1;
    CHECK(!outlier_valid(&bad));
    bad = w;
    bad.count = 5;
    CHECK(!outlier_valid(&bad));
    bad = w;
    bad.next = 3;  // filling, yet not at the end of the values held
    CHECK(!outlier_valid(&bad));
    bad = w;
    bad.values[0] = NAN;
    CHECK(!outlier_valid(&bad));
}

TEST(outlier_init_checks_the_window) {
    std::string range = " is outside [2, " + std::to_string(OUTLIER_CAPACITY) + "]";
    CHECK(expect_exit_failure([] { OutlierWindow w; outlier_init(&w, 1); }, ("outlier window 1" + range).c_str()));
    std::string too_large = std::to_string(OUTLIER_CAPACITY + 1);
    CHECK(expect_exit_failure([] { OutlierWindow w; outlier_init(&w, OUTLIER_CAPACITY + 1); },
                              ("outlier window " + too_large + range).c_str()));
}

// ----------------------------------------------------------------------------
// signals (each test in a child process: the pending flag cannot be cleared)

TEST(signals_none_pending_after_install) {
    char err[256];
    CHECK(child_exit_status([] { signals_install(); _exit(signals_pending() == 0 ? 0 : 1); }, err, sizeof(err)) == 0);
}

TEST(signals_first_one_is_kept) {
    char err[256];
    auto term_then_usr1 = [] {
        signals_install();
        raise(SIGTERM);
        bool term = signals_pending() == SIGTERM;
        raise(SIGUSR1);
        _exit(term && signals_pending() == SIGTERM ? 0 : 1);
    };
    CHECK(child_exit_status(term_then_usr1, err, sizeof(err)) == 0);
    auto usr1 = [] {
        signals_install();
        raise(SIGUSR1);
        _exit(signals_pending() == SIGUSR1 ? 0 : 1);
    };
    CHECK(child_exit_status(usr1, err, sizeof(err)) == 0);
}

TEST(signals_install_restarting_handlers) {
    char err[256];
    auto check_actions = [] {
        signals_install();
        for (int s : {SIGTERM, SIGINT, SIGUSR1}) {
            struct sigaction action;
            sigaction(s, nullptr, &action);
            if (action.sa_handler != signals_handler || !(action.sa_flags & SA_RESTART)) { _exit(1); }
        }
        _exit(0);
    };
    CHECK(child_exit_status(check_actions, err, sizeof(err)) == 0);
}

TEST(signals_second_interrupt_exits_at_once) {
    char err[256];
    auto two_interrupts = [] {
        signals_install();
        raise(SIGINT);
        if (signals_pending() != SIGINT) { _exit(1); }
        raise(SIGINT);
        _exit(2);  // not reached
    };
    CHECK(child_exit_status(two_interrupts, err, sizeof(err)) == 130);
    CHECK(strstr(err, "second interrupt: exiting now") != nullptr);
    auto term_then_interrupt = [] {
        signals_install();
        raise(SIGTERM);
        raise(SIGINT);
        _exit(2);
    };
    CHECK(child_exit_status(term_then_interrupt, err, sizeof(err)) == 130);
}

// What a trainer does: poll between steps, and exit with EXIT_PREEMPTED once told to stop.
TEST(signals_from_another_process_stop_a_polling_loop) {
    CHECK(EXIT_PREEMPTED == 75);
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        signals_install();
        if (write(ready[1], "x", 1) != 1) { _exit(1); }
        while (signals_pending() == 0) { usleep(1000); }
        _exit(signals_pending() == SIGTERM ? EXIT_PREEMPTED : 1);
    }
    char byte;
    CHECK(read(ready[0], &byte, 1) == 1);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == EXIT_PREEMPTED);
    close(ready[0]);
    close(ready[1]);
}

// ----------------------------------------------------------------------------
// stale temporary files

// The NCCL and overlap switches' parser: unset, in range, and each kind of bad value.
TEST(env_int_reads_a_range_or_fails) {
    unsetenv("TEST_ENV_INT");
    CHECK(env_int("TEST_ENV_INT", 0, 2, 7) == 7);
    setenv("TEST_ENV_INT", "2", 1);
    CHECK(env_int("TEST_ENV_INT", 0, 2, 7) == 2);
    for (const char* bad : {"3", "-1", "", "1x", "one"}) {
        setenv("TEST_ENV_INT", bad, 1);
        std::string expected = std::string("TEST_ENV_INT=") + bad + ": must be an integer in [0, 2]";
        CHECK(expect_exit_failure([] { env_int("TEST_ENV_INT", 0, 2, 0); }, expected.c_str()));
    }
    unsetenv("TEST_ENV_INT");
}

TEST(stale_temp_names) {
    CHECK(atomic_temp_pid("model.bin.tmp.node-7.1234", "node-7") == 1234);
    CHECK(atomic_temp_pid("model.bin.tmp.node-7.1234", "node-8") == 0);  // another host's
    CHECK(atomic_temp_pid("model.bin.tmp.node-7.1234", "node") == 0);
    CHECK(atomic_temp_pid("model.bin.tmp.node-7.1234", "7") == 0);
    CHECK(atomic_temp_pid("model.bin.tmp.1234", "node-7") == 1234);  // an older version's: this host's
    CHECK(atomic_temp_pid("a.tmp.b.tmp.h.7", "h") == 7);
    CHECK(atomic_temp_pid(".tmp.h.5", "h") == 5);
    CHECK(atomic_temp_pid(".tmp.5", "h") == 5);
    CHECK(atomic_temp_pid("model.bin", "h") == 0);
    CHECK(atomic_temp_pid("model.bin.h.5", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp.", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp.h.", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp..5", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp.12a", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp.0", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp.h.0123", "h") == 0);
    CHECK(atomic_temp_pid("x.tmp.h.1234567890", "h") == 0);  // more digits than a PID has
    CHECK(atomic_temp_pid("xtmp.123", "h") == 0);
    CHECK(atomic_temp_pid("x.TMP.h.123", "h") == 0);
}

TEST(temp_names_spell_the_host) {
    char spelled[ATOMIC_HOST_MAX + 1];
    atomic_host_spelling("node-12.cluster.example.org", spelled);
    CHECK(strcmp(spelled, "node-12-cluster-example-org") == 0);
    atomic_host_spelling("a_b c/d\xc3\xa9Z9", spelled);
    CHECK(strcmp(spelled, "a-b-c-d--Z9") == 0);
    atomic_host_spelling(std::string(200, 'x').c_str(), spelled);
    CHECK(std::string(spelled) == std::string(ATOMIC_HOST_MAX, 'x'));
    std::string host = this_host();
    const char* spelled_chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-";
    CHECK(!host.empty() && host.find_first_not_of(spelled_chars) == std::string::npos);
    AtomicFile af;
    open_atomic(&af, "/tmp/x");
    CHECK(af.tmp_path == temp_name("/tmp/x", getpid()));
    CHECK(atomic_temp_pid(af.tmp_path.c_str(), host.c_str()) == getpid());
    abort_atomic(&af);
}

TEST(stale_temp_files_removed_and_nothing_else) {
    std::string dir = make_temp_dir("test_guards");
    pid_t gone = dead_pid();
    pid_t live = fork();
    if (live == 0) {
        sleep(60);
        _exit(0);
    }
    write_file(dir + "/model.bin", "complete");
    write_file(dir + "/" + temp_name("model.bin", gone), "half");
    write_file(dir + "/" + old_temp_name("old.bin", gone), "an older version's");
    write_file(dir + "/" + temp_name("state.bin", getpid()), "half");
    write_file(dir + "/" + temp_name("live.bin", live), "being written");
    write_file(dir + "/" + temp_name("parent.bin", getppid()), "another process's");
    write_file(dir + "/" + temp_name("remote.bin", gone, "another-node"), "another host's");
    write_file(dir + "/x.tmp", "");
    write_file(dir + "/x.tmp.12a", "");
    write_file(dir + "/x.tmp.0", "");
    std::filesystem::create_directory(dir + "/" + temp_name("d", gone));
    std::filesystem::create_symlink(dir + "/model.bin", dir + "/" + temp_name("link", gone));
    CHECK(remove_stale_temp_files(dir.c_str()) == 3);
    std::vector<std::string> kept = {"model.bin", temp_name("live.bin", live), temp_name("parent.bin", getppid()),
                                     temp_name("remote.bin", gone, "another-node"), "x.tmp", "x.tmp.12a", "x.tmp.0",
                                     temp_name("d", gone), temp_name("link", gone)};
    std::sort(kept.begin(), kept.end());
    CHECK(dir_names(dir) == kept);
    CHECK(remove_stale_temp_files(dir.c_str()) == 0);
    CHECK(read_file(dir + "/model.bin") == "complete");
    kill(live, SIGKILL);
    waitpid(live, nullptr, 0);
    CHECK(remove_stale_temp_files(dir.c_str()) == 1);  // its writer is gone now
    CHECK(remove_stale_temp_files((dir + "/missing").c_str()) == 0);
    remove_dir(dir);
}

// A writer killed mid-write leaves its temporary file; the next run's cleanup removes it.
TEST(stale_temp_file_of_a_killed_writer) {
    std::string dir = make_temp_dir("test_guards");
    std::string path = dir + "/model_00000010.bin";
    write_file(path, "previous");
    pid_t pid = fork();
    if (pid == 0) {
        AtomicFile af;
        open_atomic(&af, path.c_str());
        atomic_write_or_fail(&af, "partial", 1, 7);
        fflush(af.file);
        raise(SIGKILL);
    }
    waitpid(pid, nullptr, 0);
    CHECK(dir_names(dir).size() == 2);
    CHECK(remove_stale_temp_files(dir.c_str()) == 1);
    CHECK(dir_names(dir) == std::vector<std::string>({"model_00000010.bin"}));
    CHECK(read_file(path) == "previous");
    remove_dir(dir);
}

// ----------------------------------------------------------------------------
// atomic writes that fail

// In a child limited to files of `limit` bytes (SIGXFSZ ignored, so writes fail with EFBIG):
// writes `chunks` of `chunk_size` bytes atomically to path and commits.
static void write_with_file_size_limit(const std::string& path, rlim_t limit, size_t chunk_size, int chunks) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {limit, limit};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) { _exit(3); }
    std::vector<char> chunk(chunk_size, 'n');
    AtomicFile af;
    open_atomic(&af, path.c_str());
    for (int i = 0; i < chunks; i++) { atomic_write_or_fail(&af, chunk.data(), 1, chunk.size()); }
    commit_atomic(&af);
}

TEST(atomic_write_on_a_full_disk_keeps_the_old_file) {
    std::string dir = make_temp_dir("test_guards");
    std::string path = dir + "/model_00000010.bin";
    std::string expected = "error: writing " + path + ": File too large (the previous files are kept)";
    write_file(path, "old contents");
    // a large write fails in fwrite; small ones fail when commit_atomic flushes them
    CHECK(expect_exit_failure([&] { write_with_file_size_limit(path, 4096, 1 << 20, 1); }, expected.c_str()));
    CHECK(expect_exit_failure([&] { write_with_file_size_limit(path, 1000, 600, 2); }, expected.c_str()));
    CHECK(dir_names(dir) == std::vector<std::string>({"model_00000010.bin"}));
    CHECK(read_file(path) == "old contents");
    char err[512];
    int status = run_in_child([&] { write_with_file_size_limit(path, 4096, 600, 2); }, err, sizeof(err));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // under the limit: replaced
    CHECK(read_file(path) == std::string(1200, 'n'));
    remove_dir(dir);
}

TEST(atomic_rename_failure_leaves_nothing) {
    std::string dir = make_temp_dir("test_guards");
    std::string path = dir + "/checkpoint";
    std::filesystem::create_directories(path + "/occupied");  // a non-empty directory cannot be replaced
    auto write_over_directory = [&] {
        AtomicFile af;
        open_atomic(&af, path.c_str());
        atomic_write_or_fail(&af, "x", 1, 1);
        commit_atomic(&af);
    };
    CHECK(expect_exit_failure(write_over_directory, ("error: writing " + path + ": Is a directory").c_str()));
    CHECK(dir_names(dir) == std::vector<std::string>({"checkpoint"}));
    remove_dir(dir);
}

// The rename lands in the file's directory, "." for a bare name (its directory is synced).
TEST(atomic_write_into_the_current_directory) {
    std::string dir = make_temp_dir("test_guards");
    char err[512];
    auto write_bare_name = [&] {
        if (chdir(dir.c_str()) != 0) { _exit(3); }
        AtomicFile af;
        open_atomic(&af, "latest");
        atomic_write_or_fail(&af, "12\n", 1, 3);
        commit_atomic(&af);
    };
    CHECK(child_exit_status(write_bare_name, err, sizeof(err)) == 0);
    CHECK(read_file(dir + "/latest") == "12\n");
    CHECK(dir_names(dir) == std::vector<std::string>({"latest"}));
    CHECK(parent_dir("latest") == "." && parent_dir("run/latest") == "run" && parent_dir("/latest") == "/");
    CHECK(expect_exit_failure([&] { fsync_dir_or_fail((dir + "/missing").c_str()); },
                              ("error: cannot sync the directory " + dir + "/missing: No such file").c_str()));
    remove_dir(dir);
}

TEST_MAIN()
