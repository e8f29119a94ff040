// Multi-process launch helpers, host only (no CUDA, no NCCL): launch_info_from_env() reads
// which rank of how many this process is from torchrun, mpirun or srun variables;
// rendezvous_tcp() / rendezvous_file() copy rank 0's opaque blob (the NCCL unique id) to
// every other rank; liveness_start() / liveness_finish() watch the other ranks (the rendezvous
// connections, or heartbeat files in the rendezvous directory) so that a rank that dies stops
// the others within seconds; launch_gpus_flag() and
// launch_local() run one copy of this program per GPU on one node (`--gpus N`).
// Linux only (/proc/self/exe, MSG_NOSIGNAL, PR_SET_PDEATHSIG).
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include <filesystem>
#include <string>
#include <vector>

#include "llmc/signals.h"
#include "llmc/utils.h"

extern char** environ;

// ---------------------------------------------------------------------------------
// 1. Who am I: launcher variables.

struct LaunchInfo {
    int rank, world, local_rank;
    char master_addr[256];  // default "127.0.0.1"
    int master_port;        // default 29500
    char source[64];        // which launcher's variables were read
};

using EnvLookup = const char* (*)(const char* name);  // getenv by default; tests pass a fake

static inline const char* launch_getenv(const char* name) { return getenv(name); }

// Reads an integer variable into *value; false if unset, fails if not an integer.
static inline bool launch_env_int(EnvLookup lookup, const char* name, int* value) {
    const char* text = lookup(name);
    if (text == nullptr) { return false; }
    char* end = nullptr;
    errno = 0;
    long parsed = strtol(text, &end, 10);
    bool starts_ok = text[0] == '-' || (text[0] >= '0' && text[0] <= '9');
    if (!starts_ok || *end != '\0' || errno != 0 || parsed < INT_MIN || parsed > INT_MAX) {
        fail("%s=%s is not an integer", name, text);
    }
    *value = (int)parsed;
    return true;
}

// Precedence: torchrun (also what --gpus sets), then OpenMPI, then Slurm; a launcher
// counts as present when its size variable is set. A missing local-rank variable defaults
// to the rank (all ranks on one node).
static inline LaunchInfo launch_info_from_env(EnvLookup lookup = launch_getenv) {
    static constexpr const char* LAUNCHERS[][4] = {
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun (RANK, WORLD_SIZE)"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "mpirun (OMPI_COMM_WORLD_*)"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "srun (SLURM_*)"},
    };
    LaunchInfo info = {.rank = 0,
                       .world = 1,
                       .local_rank = 0,
                       .master_addr = "127.0.0.1",
                       .master_port = 29500,
                       .source = "none (one process)"};
    for (const auto& src : LAUNCHERS) {
        if (!launch_env_int(lookup, src[1], &info.world)) { continue; }
        if (info.world < 1) { fail("%s=%d must be at least 1", src[1], info.world); }
        if (!launch_env_int(lookup, src[0], &info.rank)) {
            fail("%s=%d is set but %s is not", src[1], info.world, src[0]);
        }
        if (info.rank < 0 || info.rank >= info.world) {
            fail("%s=%d is outside [0, %s=%d)", src[0], info.rank, src[1], info.world);
        }
        info.local_rank = info.rank;
        launch_env_int(lookup, src[2], &info.local_rank);
        if (info.local_rank < 0) { fail("%s=%d must not be negative", src[2], info.local_rank); }
        snprintf(info.source, sizeof(info.source), "%s", src[3]);
        break;
    }
    const char* addr = lookup("MASTER_ADDR");
    if (addr != nullptr) {
        if (addr[0] == '\0' || strlen(addr) >= sizeof(info.master_addr)) {
            fail("MASTER_ADDR=%s is empty or too long", addr);
        }
        strcpy(info.master_addr, addr);
    }
    if (launch_env_int(lookup, "MASTER_PORT", &info.master_port) &&
        (info.master_port < 1 || info.master_port > 65535)) {
        fail("MASTER_PORT=%d is outside 1..65535", info.master_port);
    }
    // torchrun's agent keeps its own store on MASTER_PORT: meet on the port above it
    const char* agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE");
    if (agent_store != nullptr && strcmp(agent_store, "True") == 0) {
        if (info.master_port == 65535) { fail("MASTER_PORT=65535 leaves no port above torchrun's store"); }
        info.master_port++;
    }
    return info;
}

// ---------------------------------------------------------------------------------
// 2. Meeting: rendezvous. Rank 0's blob (size bytes) is copied to every other rank's blob.

constexpr uint32_t LAUNCH_MAGIC = 0x6c6c6d63u;  // "llmc": a joining rank's hello and the id file
constexpr char LAUNCH_GOODBYE = 'G';            // liveness: "this rank ends normally"
constexpr char LAUNCH_FAILED = 'F';             // liveness: "this rank failed and printed why"

static inline double launch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void launch_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

// Milliseconds left until `deadline`, for poll() (0 once it has passed).
static inline int launch_ms_left(double deadline) {
    double left = deadline - launch_now();
    return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

enum LaunchIo { LAUNCH_IO_OK, LAUNCH_IO_CLOSED, LAUNCH_IO_TIMEOUT };

// Reads exactly n bytes before `deadline` (partial reads and EINTR handled).
static inline LaunchIo launch_read_full(int fd, void* buf, size_t n, double deadline) {
    size_t done = 0;
    while (done < n) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = poll(&pfd, 1, launch_ms_left(deadline));
        if (ready < 0 && errno == EINTR) { continue; }
        if (ready == 0) { return LAUNCH_IO_TIMEOUT; }
        ssize_t got = recv(fd, (char*)buf + done, n - done, 0);
        if (got < 0 && errno == EINTR) { continue; }
        if (got <= 0) { return LAUNCH_IO_CLOSED; }
        done += (size_t)got;
    }
    return LAUNCH_IO_OK;
}

// Writes all n bytes; false if the peer is gone (no SIGPIPE: MSG_NOSIGNAL).
static inline bool launch_write_full(int fd, const void* buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t sent = send(fd, (const char*)buf + done, n - done, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) { continue; }
        if (sent <= 0) { return false; }
        done += (size_t)sent;
    }
    return true;
}

// What liveness watches (one process = one run): the TCP connections that outlive the
// rendezvous, or, after a file rendezvous, the ranks' heartbeat files in its directory.
struct Liveness {
    std::vector<int> fds, peer_ranks;   // rank 0: one per peer; other ranks: rank 0 only
    std::string dir;                    // file rendezvous: its directory, this rank, the run's key
    int rank = 0;
    uint64_t key = 0;
    int wake_pipe[2] = {-1, -1};        // liveness_finish() wakes the watcher through it
    pthread_t thread;
    bool running = false;
    void (*on_peer_lost)(int peer_rank) = nullptr;
};
static Liveness g_liveness;

// Keepalive probes notice a peer host that vanished without closing (power, network).
static inline void launch_keepalive(int fd) {
    int on = 1, idle = 10, interval = 2, count = 5;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

static inline int launch_listen(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { fail("rendezvous: socket: %s", strerror(errno)); }
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0) {
        if (errno == EADDRINUSE) {
            fail("rendezvous: port %d is in use on rank 0's host (set MASTER_PORT to a free port)", port);
        }
        fail("rendezvous: cannot listen on port %d (MASTER_PORT): %s", port, strerror(errno));
    }
    if (listen(fd, SOMAXCONN) != 0) { fail("rendezvous: listen on port %d: %s", port, strerror(errno)); }
    return fd;
}

// Rank 0: accepts world-1 hellos, checks them, then sends the blob to each peer.
static inline void rendezvous_tcp_root(const LaunchInfo* me, const void* blob, size_t size,
                                       double timeout_s) {
    double deadline = launch_now() + timeout_s;
    int listen_fd = launch_listen(me->master_port);
    std::vector<int> fd_of_rank(me->world, -1);
    for (int joined = 1; joined < me->world;) {
        struct pollfd pfd = {listen_fd, POLLIN, 0};
        int ready = poll(&pfd, 1, launch_ms_left(deadline));
        if (ready == 0) {
            fail("rendezvous: only %d of %d ranks joined at port %d within %g s", joined, me->world,
                 me->master_port, timeout_s);
        }
        int fd = ready < 0 ? -1 : accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) { continue; }  // EINTR, or a connection that went away
        uint32_t hello[3];  // magic, rank, world, in network byte order
        double hello_deadline = deadline < launch_now() + 5.0 ? deadline : launch_now() + 5.0;
        if (launch_read_full(fd, hello, sizeof(hello), hello_deadline) != LAUNCH_IO_OK) {
            close(fd);  // silent or gone: not a rank of this run
            continue;
        }
        int rank = (int)ntohl(hello[1]), world = (int)ntohl(hello[2]);
        if (ntohl(hello[0]) != LAUNCH_MAGIC) {
            fail("rendezvous: a connection to port %d is not a rank of this run (wrong hello)",
                 me->master_port);
        }
        if (world != me->world) {
            fail("rendezvous: rank %d has world size %d, rank 0 has %d", rank, world, me->world);
        }
        if (rank < 1 || rank >= me->world) {
            fail("rendezvous: a peer joined as rank %d, outside [1, %d)", rank, me->world);
        }
        if (fd_of_rank[rank] >= 0) { fail("rendezvous: rank %d joined twice", rank); }
        fd_of_rank[rank] = fd;
        joined++;
    }
    close(listen_fd);
    for (int rank = 1; rank < me->world; rank++) {
        if (!launch_write_full(fd_of_rank[rank], blob, size)) {
            fail("rendezvous: rank %d closed its connection before receiving the id", rank);
        }
        launch_keepalive(fd_of_rank[rank]);
        g_liveness.fds.push_back(fd_of_rank[rank]);
        g_liveness.peer_ranks.push_back(rank);
    }
}

// One connection attempt to addr, bounded by `deadline`; the socket or -1 (errno set).
static inline int launch_connect(const struct addrinfo* addr, double deadline) {
    int fd = socket(addr->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) { return -1; }
    int err = connect(fd, addr->ai_addr, addr->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
        struct pollfd pfd = {fd, POLLOUT, 0};
        int ms = launch_ms_left(deadline);
        int ready = poll(&pfd, 1, ms < 1000 ? ms : 1000);
        err = ready < 0 ? errno : ETIMEDOUT;
        socklen_t len = sizeof(err);
        if (ready > 0) { getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len); }
    }
    if (err != 0) {
        close(fd);
        errno = err;
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

// A joining rank: connects (retrying every ~100 ms), says hello, receives the blob.
static inline void rendezvous_tcp_join(const LaunchInfo* me, void* blob, size_t size, double timeout_s) {
    double deadline = launch_now() + timeout_s;
    char port[16];
    snprintf(port, sizeof(port), "%d", me->master_port);
    const char* last_error = "no attempt";
    int fd = -1;
    while (fd < 0) {
        if (launch_now() >= deadline) {
            fail("rendezvous: rank %d could not reach rank 0 at %s:%s within %g s (%s; check MASTER_ADDR "
                 "and MASTER_PORT)", me->rank, me->master_addr, port, timeout_s, last_error);
        }
        struct addrinfo hints = {}, *found = nullptr;
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(me->master_addr, port, &hints, &found);
        if (gai != 0) { last_error = gai_strerror(gai); }
        for (struct addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
            fd = launch_connect(a, deadline);
            if (fd < 0) { last_error = strerror(errno); }
        }
        if (found != nullptr) { freeaddrinfo(found); }
        if (fd < 0) { launch_sleep_ms(100); }
    }
    uint32_t hello[3] = {htonl(LAUNCH_MAGIC), htonl((uint32_t)me->rank), htonl((uint32_t)me->world)};
    LaunchIo io = launch_write_full(fd, hello, sizeof(hello)) ? launch_read_full(fd, blob, size, deadline)
                                                              : LAUNCH_IO_CLOSED;
    if (io == LAUNCH_IO_TIMEOUT) {
        fail("rendezvous: rank %d reached rank 0 at %s:%s but got no id within %g s (not all ranks joined?)",
             me->rank, me->master_addr, port, timeout_s);
    }
    if (io == LAUNCH_IO_CLOSED) {
        fail("rendezvous: rank 0 at %s:%s closed the connection before sending the id (see its error)",
             me->master_addr, port);
    }
    launch_keepalive(fd);
    g_liveness.fds.push_back(fd);
    g_liveness.peer_ranks.push_back(0);
}

// Rank 0 listens on all interfaces at master_port; the others connect to master_addr.
// The connections stay open for liveness_start() / liveness_finish().
static inline void rendezvous_tcp(const LaunchInfo* me, void* blob, size_t size, double timeout_s) {
    if (me->world == 1) { return; }
    if (me->rank == 0) { rendezvous_tcp_root(me, blob, size, timeout_s); }
    else { rendezvous_tcp_join(me, blob, size, timeout_s); }
}

// File rendezvous (a shared directory, no open port). Every joining rank r keeps
// dir/join_<r> holding its random nonce; rank 0 deletes stale files, collects the nonces
// and writes dir/nccl_id = {magic, world, size, the nonces, the blob}; a joiner takes the
// blob only from an nccl_id holding its own nonce, so stale files never pair two runs.

static inline uint64_t launch_nonce(void) {
    uint64_t nonce = 0;
    FILE* f = fopen("/dev/urandom", "rb");
    if (f != nullptr) {
        if (fread(&nonce, sizeof(nonce), 1, f) != 1) { nonce = 0; }
        fclose(f);
    }
    nonce ^= (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(launch_now() * 1e9);
    return nonce == 0 ? 1 : nonce;
}

// The whole file, or an empty vector if it cannot be read (missing, being replaced).
static inline std::vector<uint64_t> launch_read_words(const std::string& path) {
    std::vector<uint64_t> words;
    int64_t bytes = file_size(path.c_str());
    FILE* f = bytes > 0 ? fopen(path.c_str(), "rb") : nullptr;
    if (f == nullptr) { return words; }
    words.resize((size_t)(bytes + 7) / 8);
    if (fread(words.data(), 1, (size_t)bytes, f) != (size_t)bytes) { words.clear(); }
    fclose(f);
    return words;
}

static inline void launch_write_atomic(const std::string& path, const void* data, size_t bytes) {
    AtomicFile af;
    open_atomic(&af, path.c_str());
    atomic_write_or_fail(&af, data, 1, bytes);
    commit_atomic(&af);
}

// Creates dir and its missing parents, or fails naming it.
static inline void launch_make_dirs(const char* dir) {
    std::error_code error, stat_error;
    std::filesystem::create_directories(dir, error);
    if (error || !std::filesystem::is_directory(dir, stat_error)) {
        std::string reason = error ? error.message() : "not a directory";
        fail("rendezvous: cannot create directory %s: %s", dir, reason.c_str());
    }
}

// Rank 0 removes nccl_id, join_<digits> and alive_<digits> (liveness) left by earlier runs.
static inline void launch_remove_stale(const char* dir) {
    remove((std::string(dir) + "/nccl_id").c_str());
    DIR* d = opendir(dir);
    if (d == nullptr) { fail("rendezvous: cannot list %s: %s", dir, strerror(errno)); }
    for (struct dirent* e; (e = readdir(d)) != nullptr;) {
        bool ours = strncmp(e->d_name, "join_", 5) == 0 || strncmp(e->d_name, "alive_", 6) == 0;
        const char* digits = strchr(e->d_name, '_');
        if (!ours || digits[1 + strspn(digits + 1, "0123456789")] != '\0') { continue; }
        remove((std::string(dir) + "/" + e->d_name).c_str());
    }
    closedir(d);
}

// The run's key, the same on every rank of a file rendezvous: a mix of the ranks' join nonces.
static inline uint64_t launch_run_key(const uint64_t* nonces, int world) {
    uint64_t key = LAUNCH_MAGIC;
    for (int r = 0; r < world; r++) { key = (key ^ nonces[r]) * 0x100000001b3ull; }
    return key;
}

// After a file rendezvous, liveness_start watches heartbeat files: rank 0 every other rank's,
// the others rank 0's (as over TCP), in the run `key`.
static inline void liveness_use_files(const char* dir, int rank, int world, uint64_t key) {
    g_liveness.dir = dir;
    g_liveness.rank = rank;
    g_liveness.key = key;
    g_liveness.peer_ranks.clear();
    if (rank != 0) {
        g_liveness.peer_ranks.push_back(0);
        return;
    }
    for (int peer = 1; peer < world; peer++) { g_liveness.peer_ranks.push_back(peer); }
}

static inline void rendezvous_file(const LaunchInfo* me, const char* dir, void* blob, size_t size,
                                   double timeout_s) {
    if (me->world == 1) { return; }
    double deadline = launch_now() + timeout_s;
    launch_make_dirs(dir);
    std::string id_path = std::string(dir) + "/nccl_id";
    size_t header_words = 3 + (size_t)me->world;
    if (me->rank == 0) {
        launch_remove_stale(dir);
        std::vector<uint64_t> file(header_words + (size + 7) / 8, 0);
        file[0] = LAUNCH_MAGIC;
        file[1] = (uint64_t)me->world;
        file[2] = size;
        for (int joined = 1;;) {
            for (int rank = 1; rank < me->world; rank++) {
                if (file[3 + rank] != 0) { continue; }  // already read
                std::vector<uint64_t> join = launch_read_words(std::string(dir) + "/join_" + std::to_string(rank));
                if (join.size() == 2 && join[0] == LAUNCH_MAGIC && join[1] != 0) {
                    file[3 + rank] = join[1];
                    joined++;
                }
            }
            if (joined == me->world) { break; }
            if (launch_now() >= deadline) {
                fail("rendezvous: only %d of %d ranks joined in %s within %g s", joined, me->world, dir,
                     timeout_s);
            }
            launch_sleep_ms(100);
        }
        memcpy(&file[header_words], blob, size);
        launch_write_atomic(id_path, file.data(), header_words * 8 + size);
        liveness_use_files(dir, 0, me->world, launch_run_key(&file[3], me->world));
        return;
    }
    uint64_t join[2] = {LAUNCH_MAGIC, launch_nonce()};
    std::string join_path = std::string(dir) + "/join_" + std::to_string(me->rank);
    for (;;) {
        std::vector<uint64_t> mine = launch_read_words(join_path);
        if (mine.size() != 2 || mine[1] != join[1]) { launch_write_atomic(join_path, join, sizeof(join)); }
        std::vector<uint64_t> id = launch_read_words(id_path);
        if (id.size() == header_words + (size + 7) / 8 && id[0] == LAUNCH_MAGIC &&
            id[1] == (uint64_t)me->world && id[2] == size && id[3 + me->rank] == join[1]) {
            memcpy(blob, &id[header_words], size);
            remove(join_path.c_str());  // rank 0 has read it
            liveness_use_files(dir, me->rank, me->world, launch_run_key(&id[3], me->world));
            return;
        }
        if (launch_now() >= deadline) {
            fail("rendezvous: rank %d found no id from rank 0 in %s within %g s (is rank 0 running with the "
                 "same directory?)", me->rank, dir, timeout_s);
        }
        launch_sleep_ms(100);
    }
}

// ---------------------------------------------------------------------------------
// 3. Liveness: a watcher thread over the rendezvous connections, or over heartbeat files after
// a file rendezvous. A connection that ends without a goodbye byte, or a heartbeat that stops
// for LIVENESS_SILENT_S, means its peer died: print one line, call on_peer_lost (which runs on
// the watcher thread), then _exit(1). When rank 0 exits, every other rank sees its connection
// close (or its heartbeat say "failed") and exits too, so one dead rank stops the whole run.

constexpr int LIVENESS_BEAT_MS = 500;       // heartbeat files: each rank rewrites its own this often
constexpr double LIVENESS_SILENT_S = 10.0;  // a peer's heartbeat unchanged this long: dead

// DIR/alive_<rank>: {LAUNCH_MAGIC, the run's key, a beat count, a state (0, LAUNCH_GOODBYE,
// LAUNCH_FAILED)}, replaced whole by a rename; errors are ignored (the peers then see silence).
static inline std::string liveness_beat_path(int rank) { return g_liveness.dir + "/alive_" + std::to_string(rank); }

static inline void liveness_beat(uint64_t beats, char state) {
    uint64_t words[4] = {LAUNCH_MAGIC, g_liveness.key, beats, (uint64_t)state};
    std::string path = liveness_beat_path(g_liveness.rank), temp = path + ".tmp";
    int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { return; }
    bool written = write(fd, words, sizeof(words)) == (ssize_t)sizeof(words);
    if (close(fd) == 0 && written) { rename(temp.c_str(), path.c_str()); }
}

// With heartbeat files the ranks watching this one learn that it failed (and said why) at their
// next read, not a silence later.
[[noreturn]] static inline void liveness_peer_lost(int peer_rank, const char* how) {
    fprintf(stderr, "error: rank %d stopped unexpectedly (%s)\n", peer_rank, how);
    if (!g_liveness.dir.empty()) { liveness_beat(0, LAUNCH_FAILED); }
    if (g_liveness.on_peer_lost != nullptr) { g_liveness.on_peer_lost(peer_rank); }
    _exit(1);  // not exit(): the main thread may be running or blocked
}

// fail()'s hook once the watcher runs: the peers learn that this rank failed and said why, so
// they exit without lines of their own (rank 0 passes it on to the others).
static inline void liveness_tell_failed(void) {
    char failed = LAUNCH_FAILED;
    for (int fd : g_liveness.fds) {
        if (send(fd, &failed, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {}
    }
    if (!g_liveness.dir.empty()) { liveness_beat(0, LAUNCH_FAILED); }
}

static inline void* liveness_watch_connections(void) {
    std::vector<int> peer_ranks = g_liveness.peer_ranks;  // a copy: exit() may destroy the global
    std::vector<struct pollfd> watched = {{g_liveness.wake_pipe[0], POLLIN, 0}};  // then one per peer
    for (int fd : g_liveness.fds) { watched.push_back({fd, POLLIN, 0}); }
    std::vector<bool> said_goodbye(watched.size(), false);
    for (;;) {
        if (poll(watched.data(), watched.size(), -1) < 0) { continue; }  // EINTR
        if (watched[0].revents != 0) { return nullptr; }                   // liveness_finish()
        for (size_t i = 1; i < watched.size(); i++) {
            if (watched[i].revents == 0) { continue; }
            char buf[64];
            ssize_t got = recv(watched[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (got > 0 && memchr(buf, LAUNCH_FAILED, (size_t)got) != nullptr) {
                liveness_tell_failed();
                _exit(1);  // the failed rank printed the error
            }
            if (got > 0 && memchr(buf, LAUNCH_GOODBYE, (size_t)got) != nullptr) { said_goodbye[i] = true; }
            if (got > 0 || (got < 0 && (errno == EINTR || errno == EAGAIN))) { continue; }
            watched[i].fd = -1;  // EOF or error: stop watching it
            if (!said_goodbye[i]) { liveness_peer_lost(peer_ranks[i - 1], "connection to it closed"); }
        }
    }
}

// Beats, and reads the peers' heartbeats, every LIVENESS_BEAT_MS until liveness_finish() writes
// to the wake pipe. A heartbeat of another run (an earlier run's file) counts as silence.
static inline void* liveness_watch_files(void) {
    std::vector<int> peer_ranks = g_liveness.peer_ranks;
    std::vector<uint64_t> last_beats(peer_ranks.size(), 0);
    std::vector<double> heard(peer_ranks.size(), launch_now());
    std::vector<bool> gone(peer_ranks.size(), false);  // said goodbye
    char silence[128];
    snprintf(silence, sizeof(silence), "no heartbeat in %s for %g s", g_liveness.dir.c_str(), LIVENESS_SILENT_S);
    struct pollfd wake = {g_liveness.wake_pipe[0], POLLIN, 0};
    for (uint64_t beats = 1;; beats++) {
        liveness_beat(beats, 0);
        if (poll(&wake, 1, LIVENESS_BEAT_MS) > 0) { return nullptr; }  // liveness_finish()
        for (size_t i = 0; i < peer_ranks.size(); i++) {
            if (gone[i]) { continue; }
            std::vector<uint64_t> beat = launch_read_words(liveness_beat_path(peer_ranks[i]));
            bool current = beat.size() == 4 && beat[0] == LAUNCH_MAGIC && beat[1] == g_liveness.key;
            if (current && beat[3] == (uint64_t)LAUNCH_FAILED) {
                liveness_tell_failed();
                _exit(1);  // the failed rank printed the error
            }
            gone[i] = current && beat[3] == (uint64_t)LAUNCH_GOODBYE;
            if (current && beat[2] != last_beats[i]) {
                last_beats[i] = beat[2];
                heard[i] = launch_now();
            }
            if (!gone[i] && launch_now() - heard[i] > LIVENESS_SILENT_S) { liveness_peer_lost(peer_ranks[i], silence); }
        }
    }
}

static inline void* liveness_watch(void*) {
    return g_liveness.dir.empty() ? liveness_watch_connections() : liveness_watch_files();
}

// Starts the watcher over the TCP rendezvous connections or the file rendezvous' heartbeats
// (no-op after neither).
static inline void liveness_start(void (*on_peer_lost)(int peer_rank)) {
    if (g_liveness.running || g_liveness.peer_ranks.empty()) { return; }
    g_liveness.on_peer_lost = on_peer_lost;
    if (pipe2(g_liveness.wake_pipe, O_CLOEXEC) != 0) { fail("liveness: pipe: %s", strerror(errno)); }
    int err = pthread_create(&g_liveness.thread, nullptr, liveness_watch, nullptr);
    if (err != 0) { fail("liveness: cannot start the watcher thread: %s", strerror(err)); }
    g_liveness.running = true;
    g_fail_hook = liveness_tell_failed;
}

// Clean shutdown: stop watching, then say goodbye to every peer and close. The watcher stops
// first, so the peer-side reset that a close can cause is never seen by a live watcher.
static inline void liveness_finish(void) {
    g_fail_hook = nullptr;
    if (g_liveness.running) {
        char wake = 1;
        if (write(g_liveness.wake_pipe[1], &wake, 1) != 1) { fail("liveness: cannot stop the watcher"); }
        pthread_join(g_liveness.thread, nullptr);
        close(g_liveness.wake_pipe[0]);
        close(g_liveness.wake_pipe[1]);
        g_liveness.running = false;
        if (!g_liveness.dir.empty()) { liveness_beat(0, LAUNCH_GOODBYE); }
    }
    for (int fd : g_liveness.fds) {
        char goodbye = LAUNCH_GOODBYE, drain[64];
        launch_write_full(fd, &goodbye, 1);
        shutdown(fd, SHUT_WR);
        while (recv(fd, drain, sizeof(drain), MSG_DONTWAIT) > 0) {}  // unread bytes would turn FIN into RST
        close(fd);
    }
    g_liveness.fds.clear();
    g_liveness.peer_ranks.clear();
    g_liveness.dir.clear();
}

// ---------------------------------------------------------------------------------
// 4. One node without a launcher: `--gpus N` (or `-ng N`) runs N copies of this program.

// The value of --gpus N or -ng N in argv (0 if absent); fails unless N >= 1.
static inline int launch_gpus_flag(int argc, char** argv) {
    int gpus = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gpus") != 0 && strcmp(argv[i], "-ng") != 0) { continue; }
        if (i + 1 >= argc) { fail("%s needs a value (the number of GPUs)", argv[i]); }
        char* end = nullptr;
        long value = strtol(argv[i + 1], &end, 10);
        if (*end != '\0' || end == argv[i + 1] || value < 1 || value > 1024) {
            fail("%s %s: the number of GPUs must be an integer from 1 to 1024", argv[i], argv[i + 1]);
        }
        gpus = (int)value;
        i++;
    }
    return gpus;
}

// A port for rank 0 to listen on, free now and below the range the kernel gives outgoing
// connections (32768 and up by default): the other ranks' connection attempts, made while rank 0
// starts, cannot take it first, as they could take a port the kernel handed out (port 0).
static inline int launch_free_port(void) {
    unsigned int seed = (unsigned int)getpid() ^ (unsigned int)time(nullptr);
    for (int attempt = 0; attempt < 1000; attempt++) {
        int port = 20000 + (int)(rand_r(&seed) % 12000);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in addr = {};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_ANY);
        addr.sin_port = htons((uint16_t)port);
        bool free_now = fd >= 0 && bind(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0;
        if (fd >= 0) { close(fd); }
        if (free_now) { return port; }
    }
    fail("cannot find a free port in 20000-31999 for the rendezvous (set MASTER_PORT)");
}

// The children, for the signal handler that forwards SIGINT/SIGTERM (0 = reaped).
static volatile pid_t* g_launch_children = nullptr;
static int g_launch_num_children = 0;

static inline void launch_forward_signal(int sig) {
    for (int i = 0; i < g_launch_num_children; i++) {
        if (g_launch_children[i] > 0) { kill(g_launch_children[i], sig); }
    }
}

// Child k's environment: ours minus the launch variables, plus its own.
static inline std::vector<std::string> launch_child_env(int rank, int world, int port) {
    static constexpr const char* LAUNCH_VARIABLES[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=",
                                                       "MASTER_PORT="};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; e++) {
        bool replaced = false;
        for (const char* prefix : LAUNCH_VARIABLES) { replaced |= strncmp(*e, prefix, strlen(prefix)) == 0; }
        if (!replaced) { env.push_back(*e); }
    }
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("LOCAL_RANK=" + std::to_string(rank));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    return env;
}

// The launcher's own SIGINT/SIGTERM/SIGUSR1 dispositions, from before it installed the forwarding.
static struct sigaction g_launch_old_int, g_launch_old_term, g_launch_old_usr1;

// In a new child: default actions again (or ignored, as the launcher had them).
static inline void launch_child_signals(void) {
    struct sigaction action = {};
    action.sa_handler = g_launch_old_int.sa_handler == SIG_IGN ? SIG_IGN : SIG_DFL;
    sigaction(SIGINT, &action, nullptr);
    action.sa_handler = g_launch_old_term.sa_handler == SIG_IGN ? SIG_IGN : SIG_DFL;
    sigaction(SIGTERM, &action, nullptr);
    action.sa_handler = g_launch_old_usr1.sa_handler == SIG_IGN ? SIG_IGN : SIG_DFL;
    sigaction(SIGUSR1, &action, nullptr);
}

// Starts one rank and records its pid in *slot. SIGINT/SIGTERM wait (blocked) until then,
// so a signal is never forwarded past a child, nor handled by a child not yet exec'd.
static inline void launch_spawn(char** child_argv, const std::vector<std::string>& env,
                                volatile pid_t* slot) {
    std::vector<char*> envp;
    for (const std::string& e : env) { envp.push_back((char*)e.c_str()); }
    envp.push_back(nullptr);
    sigset_t stop, saved;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &stop, &saved);
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        launch_child_signals();
        setpgid(0, 0);  // a terminal's Ctrl-C reaches the launcher only, which passes it on once
        pthread_sigmask(SIG_SETMASK, &saved, nullptr);
        prctl(PR_SET_PDEATHSIG, SIGTERM);  // the ranks end with the launcher
        if (getppid() != parent) { _exit(1); }
        execve("/proc/self/exe", child_argv, envp.data());
        fprintf(stderr, "error: cannot run /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    if (pid < 0) { fail("cannot start a rank: fork: %s", strerror(errno)); }
    *slot = pid;
    pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

// Exit status for the caller: 0, the code a rank exited with, or 128 + its signal.
static inline int launch_report_exit(int rank, int status) {
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        fprintf(stderr, "error: rank %d killed by signal %d (%s); stopping the other ranks\n", rank, sig,
                strsignal(sig));
        return 128 + sig;
    }
    if (WEXITSTATUS(status) != 1) {  // 1: fail(), whose line the rank (or rank 0) printed
        fprintf(stderr, "error: rank %d exited with status %d; stopping the other ranks\n", rank,
                WEXITSTATUS(status));
    }
    return WEXITSTATUS(status);
}

// Reaps one child (blocking, or not with WNOHANG); its rank, or -1 if none.
static inline int launch_reap(int flags, int* status) {
    for (;;) {
        pid_t pid = waitpid(-1, status, flags);
        if (pid < 0 && errno == EINTR) { continue; }
        if (pid <= 0) { return -1; }
        for (int rank = 0; rank < g_launch_num_children; rank++) {
            if (g_launch_children[rank] == pid) { g_launch_children[rank] = 0; return rank; }
        }
    }
}

// Runs `gpus` copies of this executable with argv minus --gpus/-ng N, each with RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, and waits. SIGINT,
// SIGTERM and SIGUSR1 are passed on to them. When one fails, stops the others (SIGTERM, SIGKILL
// after 10 s) and returns its status; when they stopped for a signal (EXIT_PREEMPTED), returns that.
static inline int launch_local(int gpus, int argc, char** argv) {
    std::vector<char*> child_argv;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && (strcmp(argv[i], "--gpus") == 0 || strcmp(argv[i], "-ng") == 0)) { i++; continue; }
        child_argv.push_back(argv[i]);
    }
    child_argv.push_back(nullptr);
    int port = launch_free_port();
    std::vector<pid_t> children(gpus, 0);
    g_launch_children = children.data();
    g_launch_num_children = gpus;
    struct sigaction forward = {};
    forward.sa_handler = launch_forward_signal;
    sigaction(SIGINT, &forward, &g_launch_old_int);
    sigaction(SIGTERM, &forward, &g_launch_old_term);
    sigaction(SIGUSR1, &forward, &g_launch_old_usr1);
    for (int rank = 0; rank < gpus; rank++) {
        launch_spawn(child_argv.data(), launch_child_env(rank, gpus, port), &g_launch_children[rank]);
    }
    int result = 0, status = 0, alive = gpus;
    bool preempted = false;
    while (result == 0 && alive > 0) {
        int rank = launch_reap(0, &status);
        if (rank < 0) { break; }
        alive--;
        preempted |= WIFEXITED(status) && WEXITSTATUS(status) == EXIT_PREEMPTED;
        if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != EXIT_PREEMPTED)) {
            result = launch_report_exit(rank, status);
        }
    }
    if (result == 0 && preempted) { result = EXIT_PREEMPTED; }
    launch_forward_signal(SIGTERM);
    for (double kill_at = launch_now() + 10.0; alive > 0;) {
        if (launch_reap(WNOHANG, &status) >= 0) { alive--; continue; }
        if (launch_now() >= kill_at) { launch_forward_signal(SIGKILL); kill_at = 1e300; }
        launch_sleep_ms(20);
    }
    sigaction(SIGINT, &g_launch_old_int, nullptr);
    sigaction(SIGTERM, &g_launch_old_term, nullptr);
    sigaction(SIGUSR1, &g_launch_old_usr1, nullptr);
    g_launch_num_children = 0;
    g_launch_children = nullptr;
    return result;
}
