// Tests of the multi-process launch helpers (llmc/launch.h): launcher variables, the TCP and
// file rendezvous, liveness and `--gpus N`. Ranks are forked processes on 127.0.0.1; the
// `--gpus` tests run this binary itself as the ranks (`--launch-child MODE`, see main()).
#include <filesystem>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/launch.h"

static const char* g_self_path = nullptr;  // argv[0], for the --gpus tests

// ---------------------------------------------------------------------------------
// Fixtures.

// A fake environment: name, value, name, value, ..., nullptr.
static const char* const* g_fake_env = nullptr;

static const char* fake_lookup(const char* name) {
    for (const char* const* e = g_fake_env; *e != nullptr; e += 2) {
        if (strcmp(e[0], name) == 0) { return e[1]; }
    }
    return nullptr;
}

static LaunchInfo info_from(const char* const* env) {
    g_fake_env = env;
    return launch_info_from_env(fake_lookup);
}

// True if reading `env` fails with `expected` in the one-line error.
static bool env_fails(const char* const* env, const char* expected) {
    return expect_exit_failure([env] { info_from(env); }, expected);
}

static LaunchInfo local_info(int rank, int world, int port) {
    LaunchInfo info = {.rank = rank,
                       .world = world,
                       .local_rank = rank,
                       .master_addr = "127.0.0.1",
                       .master_port = port,
                       .source = "test"};
    return info;
}

// Rank 0's blob in a run with this seed; other ranks start from zeros.
struct Blob { unsigned char bytes[128]; };

static Blob test_blob(int seed) {
    Blob blob;
    for (int i = 0; i < 128; i++) { blob.bytes[i] = (unsigned char)(seed * 31 + i * 7 + 1); }
    return blob;
}

static std::string blob_hex(const Blob& blob) {
    std::string hex;
    char byte[3];
    for (unsigned char b : blob.bytes) { snprintf(byte, sizeof(byte), "%02x", b); hex += byte; }
    return hex;
}

// The shared settings of one group of forked ranks.
static int g_port = 0;
static std::string g_dir;
static double g_timeout_s = 5.0;
static int g_seed = 1;

// A rank's body: runs in a forked child whose stderr goes to the test; prints "blob:<hex>"
// on success, and returns the child's exit status.
using RankBody = int (*)(int rank, int world);

struct RankPlan { RankBody body; int rank, world, delay_ms; };
struct RankRun { std::string output; int status; double exit_s; };  // status: code or 128+signal

static int status_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Forks one child per plan (after its delay), waits for all (killing any still alive after
// limit_s: status -1), and returns each one's stderr, status and exit time since the start.
static std::vector<RankRun> run_ranks(const std::vector<RankPlan>& plans, double limit_s) {
    std::vector<pid_t> pids;
    std::vector<int> pipes;
    double start = launch_now();
    for (const RankPlan& plan : plans) {
        CapturedChild child = fork_captured([&] {
            launch_sleep_ms(plan.delay_ms);
            return plan.body(plan.rank, plan.world);
        });
        pids.push_back(child.pid);
        pipes.push_back(child.stderr_fd);
    }
    std::vector<RankRun> runs(plans.size(), RankRun{"", -1, 0.0});
    for (size_t left = plans.size(); left > 0;) {
        double now = launch_now() - start;  // exit times are exact to one 10 ms sweep
        for (size_t i = 0; i < plans.size(); i++) {
            int status;
            if (pids[i] == 0 || waitpid(pids[i], &status, WNOHANG) != pids[i]) { continue; }
            runs[i].status = status_code(status);
            runs[i].exit_s = now;
            pids[i] = 0;
            left--;
        }
        if (left > 0 && now > limit_s) {
            for (pid_t& pid : pids) {
                if (pid != 0) { kill(pid, SIGKILL); waitpid(pid, nullptr, 0); pid = 0; }
            }
            break;
        }
        launch_sleep_ms(10);
    }
    for (size_t i = 0; i < plans.size(); i++) { runs[i].output = read_to_end(pipes[i]); }
    return runs;
}

static bool output_has(const RankRun& run, const std::string& fragment) {
    bool found = run.output.find(fragment) != std::string::npos;
    if (!found) { fprintf(stderr, "  expected \"%s\" in: %s\n", fragment.c_str(), run.output.c_str()); }
    return found;
}

// A run in which every rank ended 0 with rank 0's blob.
static bool all_got_blob(const std::vector<RankRun>& runs, int seed) {
    bool ok = true;
    for (const RankRun& run : runs) {
        if (run.status != 0) { fprintf(stderr, "  a rank ended %d: %s\n", run.status, run.output.c_str()); }
        ok = ok && run.status == 0 && output_has(run, "blob:" + blob_hex(test_blob(seed)));
    }
    return ok;
}

static Blob start_blob(int rank) {
    Blob blob = test_blob(g_seed);
    if (rank != 0) { memset(blob.bytes, 0, sizeof(blob.bytes)); }
    return blob;
}

static int print_blob(const Blob& blob) {
    fprintf(stderr, "blob:%s\n", blob_hex(blob).c_str());
    return 0;
}

static int tcp_rank(int rank, int world) {
    LaunchInfo me = local_info(rank, world, g_port);
    Blob blob = start_blob(rank);
    rendezvous_tcp(&me, blob.bytes, sizeof(blob.bytes), g_timeout_s);
    liveness_finish();
    return print_blob(blob);
}

static int file_rank(int rank, int world) {
    LaunchInfo me = local_info(rank, world, 0);
    Blob blob = start_blob(rank);
    rendezvous_file(&me, g_dir.c_str(), blob.bytes, sizeof(blob.bytes), g_timeout_s);
    return print_blob(blob);
}

// Connects to rank 0 and sends a hello with the wrong magic number.
static int stranger(int, int) {
    LaunchInfo me = local_info(1, 2, g_port);
    Blob blob = start_blob(1);
    struct addrinfo hints = {}, *found = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(me.master_addr, std::to_string(g_port).c_str(), &hints, &found) != 0) { return 2; }
    int fd = launch_connect(found, launch_now() + 2.0);
    freeaddrinfo(found);
    uint32_t hello[3] = {htonl(12345), htonl(1), htonl(2)};
    if (fd < 0 || !launch_write_full(fd, hello, sizeof(hello))) { return 2; }
    return launch_read_full(fd, blob.bytes, sizeof(blob.bytes), launch_now() + 3.0) == LAUNCH_IO_CLOSED ? 0 : 2;
}

// Liveness: every rank meets the others (TCP, or files with g_live_files), sleeps
// `live_ms[rank]` after liveness_start, then ends cleanly, or
// abruptly with _exit(3) if it is `g_dying_rank`, or through fail() if it is `g_failing_rank`.
// Rank 0 reports a lost peer as 40 + rank.
static int g_live_ms[3] = {0, 0, 0};
static int g_dying_rank = -1, g_failing_rank = -1;

static void exit_with_peer(int peer_rank) { _exit(40 + peer_rank); }

static bool g_live_files = false;  // the ranks meet through files in g_dir (heartbeat files), not TCP

static int live_rank(int rank, int world) {
    LaunchInfo me = local_info(rank, world, g_port);
    Blob blob = start_blob(rank);
    if (g_live_files) {
        rendezvous_file(&me, g_dir.c_str(), blob.bytes, sizeof(blob.bytes), g_timeout_s);
    } else {
        rendezvous_tcp(&me, blob.bytes, sizeof(blob.bytes), g_timeout_s);
    }
    liveness_start(rank == 0 ? exit_with_peer : nullptr);
    launch_sleep_ms(g_live_ms[rank]);
    if (rank == g_dying_rank) { _exit(3); }
    if (rank == g_failing_rank) { fail("rank %d: out of GPU memory", rank); }
    liveness_finish();
    launch_sleep_ms(300);  // still alive while the others finish
    return print_blob(blob);
}

// ---------------------------------------------------------------------------------
// 1. Launcher variables.

TEST(env_each_launcher) {
    const char* torchrun[] = {"RANK", "3", "WORLD_SIZE", "8", "LOCAL_RANK", "1", nullptr};
    LaunchInfo a = info_from(torchrun);
    CHECK(a.rank == 3 && a.world == 8 && a.local_rank == 1);
    CHECK(strcmp(a.source, "torchrun (RANK, WORLD_SIZE)") == 0);
    const char* ompi[] = {"OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "4",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "0", nullptr};
    LaunchInfo b = info_from(ompi);
    CHECK(b.rank == 2 && b.world == 4 && b.local_rank == 0 && strstr(b.source, "mpirun") != nullptr);
    const char* slurm[] = {"SLURM_PROCID", "5", "SLURM_NTASKS", "6", "SLURM_LOCALID", "1", nullptr};
    LaunchInfo c = info_from(slurm);
    CHECK(c.rank == 5 && c.world == 6 && c.local_rank == 1 && strstr(c.source, "srun") != nullptr);
    const char* none[] = {"SLURM_PROCID", "0", nullptr};  // no size variable: not a launch
    LaunchInfo d = info_from(none);
    CHECK(d.rank == 0 && d.world == 1 && d.local_rank == 0 && strstr(d.source, "none") != nullptr);
}

TEST(env_precedence_and_defaults) {
    const char* all[] = {"SLURM_PROCID", "1", "SLURM_NTASKS", "2", "OMPI_COMM_WORLD_RANK", "3",
                         "OMPI_COMM_WORLD_SIZE", "4", "RANK", "5", "WORLD_SIZE", "6", nullptr};
    LaunchInfo a = info_from(all);
    CHECK(a.rank == 5 && a.world == 6);
    CHECK(a.local_rank == 5);  // no LOCAL_RANK: the rank (one node)
    CHECK(strcmp(a.master_addr, "127.0.0.1") == 0 && a.master_port == 29500);
    const char* mpi_slurm[] = {"SLURM_PROCID", "1", "SLURM_NTASKS", "2", "OMPI_COMM_WORLD_RANK", "3",
                               "OMPI_COMM_WORLD_SIZE", "4", "MASTER_ADDR", "node17", "MASTER_PORT", "1234",
                               nullptr};
    LaunchInfo b = info_from(mpi_slurm);
    CHECK(b.rank == 3 && b.world == 4 && b.local_rank == 3);
    CHECK(strcmp(b.master_addr, "node17") == 0 && b.master_port == 1234);
    const char* torchrun[] = {"RANK", "1", "WORLD_SIZE", "2", "MASTER_PORT", "29400",
                              "TORCHELASTIC_USE_AGENT_STORE", "True", nullptr};
    CHECK(info_from(torchrun).master_port == 29401);  // torchrun's agent store keeps 29400
}

TEST(env_errors) {
    const char* not_int[] = {"RANK", "1x", "WORLD_SIZE", "2", nullptr};
    CHECK(env_fails(not_int, "error: RANK=1x is not an integer"));
    const char* empty[] = {"WORLD_SIZE", "", nullptr};
    CHECK(env_fails(empty, "WORLD_SIZE= is not an integer"));
    const char* too_big[] = {"RANK", "5", "WORLD_SIZE", "2", nullptr};
    CHECK(env_fails(too_big, "error: RANK=5 is outside [0, WORLD_SIZE=2)"));
    const char* negative[] = {"OMPI_COMM_WORLD_RANK", "-1", "OMPI_COMM_WORLD_SIZE", "2", nullptr};
    CHECK(env_fails(negative, "OMPI_COMM_WORLD_RANK=-1 is outside [0, OMPI_COMM_WORLD_SIZE=2)"));
    const char* world0[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "0", nullptr};
    CHECK(env_fails(world0, "SLURM_NTASKS=0 must be at least 1"));
    const char* local[] = {"RANK", "0", "WORLD_SIZE", "2", "LOCAL_RANK", "-2", nullptr};
    CHECK(env_fails(local, "LOCAL_RANK=-2 must not be negative"));
    const char* port[] = {"MASTER_PORT", "70000", nullptr};
    CHECK(env_fails(port, "MASTER_PORT=70000 is outside 1..65535"));
    const char* port0[] = {"MASTER_PORT", "0", nullptr};
    CHECK(env_fails(port0, "MASTER_PORT=0 is outside 1..65535"));
    const char* port_text[] = {"MASTER_PORT", "http", nullptr};
    CHECK(env_fails(port_text, "MASTER_PORT=http is not an integer"));
    const char* no_rank[] = {"WORLD_SIZE", "4", nullptr};
    CHECK(env_fails(no_rank, "WORLD_SIZE=4 is set but RANK is not"));
    const char* no_addr[] = {"MASTER_ADDR", "", nullptr};
    CHECK(env_fails(no_addr, "MASTER_ADDR= is empty"));
}

// ---------------------------------------------------------------------------------
// 2. Rendezvous.

TEST(tcp_rendezvous_four_ranks) {
    g_port = launch_free_port();
    g_timeout_s = 10.0;
    g_seed = 5;
    // Joiners first (they retry until rank 0 listens), rank 0 last.
    std::vector<RankRun> runs = run_ranks({{tcp_rank, 1, 4, 0}, {tcp_rank, 2, 4, 50}, {tcp_rank, 3, 4, 100},
                                           {tcp_rank, 0, 4, 400}}, 20.0);
    CHECK(all_got_blob(runs, 5));
    std::vector<RankRun> single = run_ranks({{tcp_rank, 0, 1, 0}}, 5.0);  // world 1: no socket
    CHECK(all_got_blob(single, 5));
}

TEST(tcp_rendezvous_timeouts) {
    g_port = launch_free_port();
    g_timeout_s = 1.0;
    std::string port = std::to_string(g_port);
    std::vector<RankRun> alone = run_ranks({{tcp_rank, 1, 2, 0}}, 10.0);
    CHECK(alone[0].status == 1);
    CHECK(output_has(alone[0], "error: rendezvous: rank 1 could not reach rank 0 at 127.0.0.1:" + port +
                                   " within 1 s"));
    CHECK(output_has(alone[0], "check MASTER_ADDR and MASTER_PORT"));
    std::vector<RankRun> few = run_ranks({{tcp_rank, 0, 4, 0}, {tcp_rank, 2, 4, 100}}, 10.0);
    CHECK(few[0].status == 1 && few[1].status == 1);
    CHECK(output_has(few[0], "error: rendezvous: only 2 of 4 ranks joined at port " + port + " within 1 s"));
    CHECK(output_has(few[1], "rank 0 at 127.0.0.1:" + port + " closed the connection"));
}

TEST(tcp_rendezvous_rejects_bad_peers) {
    g_timeout_s = 3.0;
    g_port = launch_free_port();
    std::vector<RankRun> world = run_ranks({{tcp_rank, 0, 2, 0}, {tcp_rank, 1, 3, 100}}, 10.0);
    CHECK(world[0].status == 1 && output_has(world[0], "rank 1 has world size 3, rank 0 has 2"));
    g_port = launch_free_port();
    std::vector<RankRun> twice = run_ranks({{tcp_rank, 0, 3, 0}, {tcp_rank, 1, 3, 100}, {tcp_rank, 1, 3, 200}},
                                           10.0);
    CHECK(twice[0].status == 1 && output_has(twice[0], "error: rendezvous: rank 1 joined twice"));
    g_port = launch_free_port();
    std::vector<RankRun> range = run_ranks({{tcp_rank, 0, 2, 0}, {tcp_rank, 2, 2, 100}}, 10.0);
    CHECK(range[0].status == 1 && output_has(range[0], "a peer joined as rank 2, outside [1, 2)"));
    g_port = launch_free_port();
    std::vector<RankRun> magic = run_ranks({{tcp_rank, 0, 2, 0}, {stranger, 1, 2, 100}}, 10.0);
    CHECK(magic[0].status == 1 && output_has(magic[0], "is not a rank of this run (wrong hello)"));
    CHECK(magic[1].status == 0);  // rank 0 closed the stranger's connection by exiting
    g_timeout_s = 1.0;
    g_port = launch_free_port();
    std::vector<RankRun> two_roots = run_ranks({{tcp_rank, 0, 2, 0}, {tcp_rank, 0, 2, 200}}, 10.0);
    CHECK(two_roots[1].status == 1);
    CHECK(output_has(two_roots[1], "port " + std::to_string(g_port) + " is in use on rank 0's host"));
}

TEST(file_rendezvous_ignores_stale_files) {
    std::string root = make_temp_dir("test_launch");
    g_dir = root + "/shared/rdv";  // missing: created by the ranks
    g_timeout_s = 10.0;
    g_seed = 1;  // a previous run leaves its nccl_id
    CHECK(all_got_blob(run_ranks({{file_rank, 0, 3, 0}, {file_rank, 1, 3, 0}, {file_rank, 2, 3, 0}}, 20.0), 1));
    g_timeout_s = 0.5;  // a crashed run leaves join files with other nonces
    std::vector<RankRun> crashed = run_ranks({{file_rank, 1, 3, 0}, {file_rank, 2, 3, 0}}, 10.0);
    CHECK(crashed[0].status == 1 && output_has(crashed[0], "rank 1 found no id from rank 0 in " + g_dir));
    CHECK(file_exists((g_dir + "/nccl_id").c_str()));
    CHECK(file_exists((g_dir + "/join_1").c_str()) && file_exists((g_dir + "/join_2").c_str()));
    // Rank 1 starts while the stale nccl_id is there; rank 2 after rank 0 began.
    g_timeout_s = 10.0;
    g_seed = 2;
    std::vector<RankRun> runs =
        run_ranks({{file_rank, 1, 3, 0}, {file_rank, 0, 3, 300}, {file_rank, 2, 3, 700}}, 20.0);
    CHECK(all_got_blob(runs, 2));
    remove_dir(root);
}

TEST(file_rendezvous_errors) {
    std::string root = make_temp_dir("test_launch");
    g_dir = root;
    g_timeout_s = 0.5;
    std::vector<RankRun> alone = run_ranks({{file_rank, 0, 3, 0}}, 10.0);
    CHECK(alone[0].status == 1);
    CHECK(output_has(alone[0], "error: rendezvous: only 1 of 3 ranks joined in " + root + " within 0.5 s"));
    write_file(root + "/plain", "not a directory");
    g_dir = root + "/plain/rdv";
    std::vector<RankRun> bad_dir = run_ranks({{file_rank, 1, 2, 0}}, 10.0);
    CHECK(bad_dir[0].status == 1 && output_has(bad_dir[0], "cannot create directory " + g_dir));
    remove_dir(root);
}

// ---------------------------------------------------------------------------------
// 3. Liveness.

TEST(liveness_dead_rank_stops_the_others) {
    g_port = launch_free_port();
    g_timeout_s = 10.0;
    g_dying_rank = 2;
    g_live_ms[0] = g_live_ms[1] = 30000;
    g_live_ms[2] = 300;
    std::vector<RankRun> runs = run_ranks({{live_rank, 0, 3, 0}, {live_rank, 1, 3, 0}, {live_rank, 2, 3, 0}},
                                          20.0);
    CHECK(runs[2].status == 3);
    CHECK(runs[0].status == 42);  // its on_peer_lost got rank 2
    CHECK(output_has(runs[0], "error: rank 2 stopped unexpectedly (connection to it closed)"));
    CHECK(runs[1].status == 1 && output_has(runs[1], "error: rank 0 stopped unexpectedly"));
    CHECK(runs[0].exit_s - runs[2].exit_s < 10.0 && runs[1].exit_s - runs[2].exit_s < 10.0);
    printf("  liveness: the others stopped %.2f s and %.2f s after rank 2 died\n",
           runs[0].exit_s - runs[2].exit_s, runs[1].exit_s - runs[2].exit_s);
}

// A rank that fails with an error line: the others exit too, quietly, so the run says it once.
TEST(liveness_failed_rank_is_reported_once) {
    g_port = launch_free_port();
    g_timeout_s = 10.0;
    g_dying_rank = -1;
    g_failing_rank = 2;
    g_live_ms[0] = g_live_ms[1] = 30000;
    g_live_ms[2] = 300;
    std::vector<RankRun> runs = run_ranks({{live_rank, 0, 3, 0}, {live_rank, 1, 3, 0}, {live_rank, 2, 3, 0}},
                                          20.0);
    g_failing_rank = -1;
    CHECK(runs[2].status == 1 && output_has(runs[2], "error: rank 2: out of GPU memory"));
    CHECK(runs[0].status == 1 && runs[0].output.empty());
    CHECK(runs[1].status == 1 && runs[1].output.empty());
    CHECK(runs[0].exit_s - runs[2].exit_s < 10.0 && runs[1].exit_s - runs[2].exit_s < 10.0);
}

TEST(liveness_clean_finish) {
    g_port = launch_free_port();
    g_timeout_s = 10.0;
    g_dying_rank = -1;
    g_seed = 3;
    // Rank 1 ends first, then rank 0, then rank 2: each sees the earlier ones' goodbyes.
    g_live_ms[1] = 0;
    g_live_ms[0] = 300;
    g_live_ms[2] = 600;
    std::vector<RankRun> runs = run_ranks({{live_rank, 0, 3, 0}, {live_rank, 1, 3, 0}, {live_rank, 2, 3, 0}},
                                          20.0);
    CHECK(all_got_blob(runs, 3));
    for (const RankRun& run : runs) { CHECK(run.output.find("error") == std::string::npos); }
}

// The same three after a file rendezvous: heartbeat files in its directory. A dead rank is
// silence for LIVENESS_SILENT_S; rank 0 says so once and the others exit quietly.
static std::vector<RankRun> run_live_files(int dying, int failing, std::vector<int> live_ms) {
    std::string root = make_temp_dir("test_launch");
    g_dir = root + "/rdv";
    g_live_files = true;
    g_timeout_s = 10.0;
    g_dying_rank = dying;
    g_failing_rank = failing;
    for (int r = 0; r < 3; r++) { g_live_ms[r] = live_ms[r]; }
    std::vector<RankRun> runs = run_ranks({{live_rank, 0, 3, 0}, {live_rank, 1, 3, 0}, {live_rank, 2, 3, 0}},
                                          40.0);
    g_live_files = false;
    g_dying_rank = g_failing_rank = -1;
    remove_dir(root);
    return runs;
}

TEST(liveness_files_dead_rank_stops_the_others) {
    std::vector<RankRun> runs = run_live_files(2, -1, {30000, 30000, 300});
    CHECK(runs[2].status == 3);
    CHECK(runs[0].status == 42);  // its on_peer_lost got rank 2
    CHECK(output_has(runs[0], "error: rank 2 stopped unexpectedly (no heartbeat in " + g_dir + " for 10 s)"));
    CHECK(runs[1].status == 1 && runs[1].output.empty());  // rank 0's heartbeat said "failed"
    double after0 = runs[0].exit_s - runs[2].exit_s, after1 = runs[1].exit_s - runs[2].exit_s;
    CHECK(after0 >= LIVENESS_SILENT_S - 1.0 && after0 < LIVENESS_SILENT_S + 3.0);
    CHECK(after1 >= after0 && after1 < after0 + 3.0);
    printf("  heartbeat files: the others stopped %.2f s and %.2f s after rank 2 died\n", after0, after1);
}

TEST(liveness_files_failed_rank_is_reported_once) {
    std::vector<RankRun> runs = run_live_files(-1, 2, {30000, 30000, 300});
    CHECK(runs[2].status == 1 && output_has(runs[2], "error: rank 2: out of GPU memory"));
    CHECK(runs[0].status == 1 && runs[0].output.empty());
    CHECK(runs[1].status == 1 && runs[1].output.empty());
    CHECK(runs[0].exit_s - runs[2].exit_s < 3.0 && runs[1].exit_s - runs[2].exit_s < 3.0);
}

// Rank 1 ends first, rank 0 (whose watcher read rank 1's goodbye) 12 s later, past the silence
// limit, then rank 2.
TEST(liveness_files_clean_finish) {
    g_seed = 3;
    std::vector<RankRun> runs = run_live_files(-1, -1, {12000, 0, 12500});
    CHECK(all_got_blob(runs, 3));
    for (const RankRun& run : runs) { CHECK(run.output.find("error") == std::string::npos); }
}

// ---------------------------------------------------------------------------------
// 4. --gpus N.

static int gpus_of(std::vector<const char*> args) {
    args.insert(args.begin(), "prog");
    return launch_gpus_flag((int)args.size(), (char**)args.data());
}

static bool gpus_fails(std::vector<const char*> args, const char* expected) {
    return expect_exit_failure([args] { gpus_of(args); }, expected);
}

TEST(gpus_flag) {
    CHECK(gpus_of({"--gpus", "4", "-x", "10"}) == 4);
    CHECK(gpus_of({"-b", "8", "-ng", "2"}) == 2);
    CHECK(gpus_of({"-b", "8"}) == 0);
    CHECK(gpus_fails({"--gpus", "0"}, "error: --gpus 0: the number of GPUs must be an integer from 1 to 1024"));
    CHECK(gpus_fails({"-ng", "two"}, "-ng two: the number of GPUs must be"));
    CHECK(gpus_fails({"--gpus", "3x"}, "--gpus 3x: the number of GPUs must be"));
    CHECK(gpus_fails({"-b", "8", "--gpus"}, "error: --gpus needs a value"));
}

// Runs launch_local(gpus, args) in a forked launcher (stderr captured); its status.
static int run_launcher(int gpus, std::vector<const char*> args, std::string* output, double* seconds,
                        int sigterm_after_ms = -1) {
    args.insert(args.begin(), g_self_path);
    double start = launch_now();
    CapturedChild child = fork_captured([&] { return launch_local(gpus, (int)args.size(), (char**)args.data()); });
    if (sigterm_after_ms >= 0) {
        launch_sleep_ms(sigterm_after_ms);
        kill(child.pid, SIGTERM);
    }
    *output += read_to_end(child.stderr_fd);
    int status = 0;
    waitpid(child.pid, &status, 0);
    *seconds = launch_now() - start;
    return status_code(status);
}

// A child of launch_local(): `--launch-child ok DIR` rendezvous over TCP with the variables
// it was given and writes DIR/rank_<r>; `fail`: rank 1 exits 7, rank 0 sleeps; `error`: rank 1
// fails with an error line, rank 0 sleeps; `sleep`: sleeps.
static int launch_child_main(int argc, char** argv) {
    const char* mode = argv[2];
    LaunchInfo me = launch_info_from_env();
    if (strcmp(mode, "fail") == 0 && me.rank == 1) { return 7; }
    if (strcmp(mode, "error") == 0 && me.rank == 1) { fail("no data shards match the pattern missing_*.bin"); }
    if (strcmp(mode, "fail") == 0 || strcmp(mode, "error") == 0 || strcmp(mode, "sleep") == 0) { sleep(60); return 0; }
    if (strcmp(mode, "ok") != 0 || argc != 4) { fail("bad --launch-child arguments (argc %d)", argc); }
    g_seed = 9;
    Blob blob = start_blob(me.rank);
    rendezvous_tcp(&me, blob.bytes, sizeof(blob.bytes), 10.0);
    liveness_start(nullptr);
    liveness_finish();
    char line[512];
    snprintf(line, sizeof(line), "%d %d %s %d %s %s", me.world, me.local_rank, me.master_addr, me.master_port,
             me.source, blob_hex(blob) == blob_hex(test_blob(9)) ? "blob-ok" : "blob-wrong");
    write_file(std::string(argv[3]) + "/rank_" + std::to_string(me.rank), line);
    return 0;
}

TEST(launch_local_runs_ranks) {
    std::string dir = make_temp_dir("test_launch");
    std::string output;
    double seconds = 0;
    int status = run_launcher(3, {"--gpus", "3", "--launch-child", "ok", dir.c_str()}, &output, &seconds);
    CHECK(status == 0);
    std::string rank0 = read_file(dir + "/rank_0");
    int port = atoi(rank0.c_str() + rank0.find("127.0.0.1 ") + 10);
    CHECK(port > 0 && port <= 65535);
    for (int rank = 0; rank < 3; rank++) {
        std::string expected = "3 " + std::to_string(rank) + " 127.0.0.1 " + std::to_string(port) +
                               " torchrun (RANK, WORLD_SIZE) blob-ok";
        std::string got = read_file(dir + "/rank_" + std::to_string(rank));
        CHECK(got == expected);
        if (got != expected) { fprintf(stderr, "  rank %d wrote \"%s\"\n", rank, got.c_str()); }
    }
    if (status != 0) { fprintf(stderr, "  launcher output: %s\n", output.c_str()); }
    remove_dir(dir);
}

// The launcher's port lies below the kernel's range for outgoing connections, and rank 0 can listen on it.
TEST(launch_free_port_is_below_the_outgoing_range) {
    for (int i = 0; i < 20; i++) {
        int port = launch_free_port();
        CHECK(port >= 20000 && port < 32000);
        int fd = launch_listen(port);
        CHECK(fd >= 0);
        close(fd);
    }
}

TEST(launch_local_stops_on_failure) {
    std::string output;
    double seconds = 0;
    int status = run_launcher(2, {"-ng", "2", "--launch-child", "fail"}, &output, &seconds);
    CHECK(status == 7);
    CHECK(seconds < 10.0);
    CHECK(output.find("error: rank 1 exited with status 7; stopping the other ranks") != std::string::npos);
    printf("  launch_local returned %d after %.2f s\n", status, seconds);
}

// A rank's error line is the launcher's whole output: no line of its own for a status of 1.
TEST(launch_local_reports_an_error_once) {
    std::string output;
    double seconds = 0;
    int status = run_launcher(2, {"--gpus", "2", "--launch-child", "error"}, &output, &seconds);
    CHECK(status == 1);
    CHECK(output == "error: no data shards match the pattern missing_*.bin\n");
}

TEST(launch_local_forwards_sigterm) {
    std::string output;
    double seconds = 0;
    int status = run_launcher(2, {"--gpus", "2", "--launch-child", "sleep"}, &output, &seconds, 500);
    CHECK(status == 128 + SIGTERM);
    CHECK(seconds < 10.0);
    CHECK(output.find("killed by signal 15") != std::string::npos);
}

// The test runner of testing.h, renamed so that main() can first serve --launch-child.
#define main run_tests
TEST_MAIN()
#undef main

int main(int argc, char** argv) {
    g_self_path = argv[0];
    if (argc >= 3 && strcmp(argv[1], "--launch-child") == 0) { return launch_child_main(argc, argv); }
    return run_tests(argc, argv);
}
