// CPU tests of llmc/checkpoint_writer.h in temporary folders: the order of a write (model file, state
// file, each renamed into place, then `latest`, then pruning) seen by fake slow file writers and by
// watching the folder during a slowed write; the real files equal a synchronous write's and read
// back; one write in flight (the next waits, a second start is refused); a failed write kept as its
// line naming the file, `latest` not moved; no pinned memory: synchronous writes; the writer thread
// leaves the stop signals to the main thread.
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/checkpoint_writer.h"

constexpr ModelShape MODEL = {.max_seq_len = 8, .vocab_size = 10, .padded_vocab_size = 12, .num_layers = 1,
                              .num_heads = 1, .channels = 4, .attention = ATTENTION_SOFTMAX};
const size_t P = count_parameters(&MODEL);

static int g_allocations = 0;
static void* plain_allocate(size_t bytes) {
    g_allocations++;
    return malloc(bytes);
}
static void* no_memory(size_t) {
    g_allocations++;
    return nullptr;
}
constexpr HostMemory PLAIN_MEMORY = {plain_allocate, free};
constexpr HostMemory NO_MEMORY = {no_memory, free};

// Fills w's snapshot as the checkpoint of `step`: every value differs with the step.
static void fill_snapshot(CheckpointWriter* w, int step) {
    CheckpointSnapshot* s = checkpoint_writer_snapshot(w);
    s->config = MODEL;
    s->state = RunState{};
    s->state.step = step;
    s->state.adam_step = step - 1;
    s->state.loader.shard_index = 2;
    s->state.loader.batch_index = 100 + step;
    outlier_init(&s->state.recent_norms, 4);
    outlier_push(&s->state.recent_norms, 1.5);
    for (size_t i = 0; i < P; i++) {
        s->params[i] = 0.001f * (float)i + (float)step;
        s->m[i] = -0.5f * (float)i;
        s->v[i] = 0.25f * (float)(i + step);
    }
}

static void write_and_wait(CheckpointWriter* w, const std::string& dir, int step, int keep, CheckpointResult* done) {
    fill_snapshot(w, step);
    checkpoint_writer_start(w, dir, step, keep);
    checkpoint_writer_wait(w, done);
}

static bool no_temp_files(const std::string& dir) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().filename().string().find(".tmp.") != std::string::npos) { return false; }
    }
    return true;
}

static std::string latest_of(const std::string& dir) { return read_file(checkpoint_latest_path(dir)); }

TEST(order_model_state_latest_prune) {
    std::string dir = make_temp_dir("test_checkpoint_writer");
    CheckpointWriter w;
    CHECK(checkpoint_writer_init(&w, P, true, PLAIN_MEMORY, 0));
    std::vector<std::string> events;  // written by the writer thread only while a write is in flight
    w.write_model = [&](const std::string& path, const CheckpointSnapshot& s) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        events.push_back("model " + std::to_string(s.state.step) + (latest_of(dir) == "3\n" ? " latest 3" : ""));
        checkpoint_write_model_file(path, s);
    };
    w.write_state = [&](const std::string& path, const CheckpointSnapshot& s) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        bool model_there = file_exists(checkpoint_path(dir, "model", s.state.step).c_str());
        events.push_back(std::string("state") + (model_there ? " after model" : "") +
                         (latest_of(dir) == "3\n" ? " latest 3" : ""));
        checkpoint_write_state_file(path, s);
    };
    CheckpointResult done;
    write_and_wait(&w, dir, 3, 1, &done);
    CHECK(done.step == 3 && done.error.empty() && latest_of(dir) == "3\n");
    events.clear();
    fill_snapshot(&w, 6);
    checkpoint_writer_start(&w, dir, 6, 1);
    CHECK(!checkpoint_writer_poll(&w, &done));  // still writing: the caller trains on
    CHECK(latest_of(dir) == "3\n");
    double waited = checkpoint_writer_wait(&w, &done);
    CHECK(waited > 0.1 && done.step == 6 && done.error.empty() && done.seconds >= 0.2);
    CHECK(events == std::vector<std::string>({"model 6 latest 3", "state after model latest 3"}));
    CHECK(latest_of(dir) == "6\n");
    CHECK(checkpoint_scan(dir).model == std::vector<int>({6}) && checkpoint_scan(dir).state == std::vector<int>({6}));
    CHECK(no_temp_files(dir));
    checkpoint_writer_free(&w);
    remove_dir(dir);
}

// The folder as a slowed write goes: 1 model file there, 2 the state file too, 3 `latest` moved.
static int folder_stage(const std::string& dir, int step) {
    bool model = file_exists(checkpoint_path(dir, "model", step).c_str());
    bool state = file_exists(checkpoint_path(dir, "state", step).c_str());
    bool latest = latest_of(dir) == std::to_string(step) + "\n";
    if (latest) { return model && state ? 3 : -1; }
    if (state) { return model ? 2 : -1; }
    return model ? 1 : 0;
}

TEST(folder_watched_during_a_slowed_write) {
    std::string dir = make_temp_dir("test_checkpoint_writer");
    CheckpointWriter w;
    CHECK(checkpoint_writer_init(&w, P, true, PLAIN_MEMORY, 150));
    CheckpointResult done;
    write_and_wait(&w, dir, 10, 1, &done);
    fill_snapshot(&w, 20);
    checkpoint_writer_start(&w, dir, 20, 1);
    std::vector<int> stages = {folder_stage(dir, 20)};
    while (!checkpoint_writer_poll(&w, &done)) {
        int stage = folder_stage(dir, 20);
        if (stage != stages.back()) { stages.push_back(stage); }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (folder_stage(dir, 20) != stages.back()) { stages.push_back(folder_stage(dir, 20)); }
    CHECK(stages == std::vector<int>({0, 1, 2, 3}));
    CHECK(done.step == 20 && done.error.empty() && done.seconds >= 0.45);
    CHECK(checkpoint_scan(dir).model == std::vector<int>({20}) && no_temp_files(dir));
    checkpoint_writer_free(&w);
    remove_dir(dir);
}

TEST(background_files_equal_synchronous_ones_and_read_back) {
    std::string background_dir = make_temp_dir("test_checkpoint_writer"), sync_dir = make_temp_dir("test_checkpoint_writer");
    CheckpointWriter background, sync;
    CHECK(checkpoint_writer_init(&background, P, true, PLAIN_MEMORY, 0));
    CHECK(!checkpoint_writer_init(&sync, P, false, PLAIN_MEMORY, 0));
    CheckpointResult done;
    write_and_wait(&background, background_dir, 7, 0, &done);
    write_and_wait(&sync, sync_dir, 7, 0, &done);
    for (const char* kind : {"model", "state"}) {
        std::string bytes = read_file(checkpoint_path(background_dir, kind, 7));
        CHECK(!bytes.empty() && bytes == read_file(checkpoint_path(sync_dir, kind, 7)));
    }
    ModelShape shape;
    std::vector<float> params;
    RunState state;
    std::string problem;
    CHECK(model_file_load(checkpoint_path(background_dir, "model", 7).c_str(), &shape, &params, &problem));
    CHECK(state_file_load(checkpoint_path(background_dir, "state", 7).c_str(), 7, P, 0, P, &state, &problem));
    CHECK(params.size() == P && params[5] == 0.005f + 7.0f && shape.channels == 4);
    CHECK(state.adam_step == 6 && state.loader.batch_index == 107 && state.m[3] == -1.5f && state.v[2] == 2.25f);
    CHECK(state.recent_norms.count == 1 && state.recent_norms.values[0] == 1.5);
    CHECK(sync.snapshot.pageable.capacity() == 0);  // a synchronous write's memory goes with it
    checkpoint_writer_free(&background);
    checkpoint_writer_free(&sync);
    remove_dir(background_dir);
    remove_dir(sync_dir);
}

TEST(one_write_in_flight) {
    std::string dir = make_temp_dir("test_checkpoint_writer");
    CheckpointWriter w;
    CHECK(checkpoint_writer_init(&w, P, true, PLAIN_MEMORY, 200));
    fill_snapshot(&w, 5);
    checkpoint_writer_start(&w, dir, 5, 0);
    CheckpointResult done;
    double waited = checkpoint_writer_wait(&w, &done);  // the next checkpoint waits, and says how long
    CHECK(waited > 0.3 && done.step == 5 && latest_of(dir) == "5\n");
    CHECK(checkpoint_writer_wait(&w, &done) < 0.1 && done.step == -1);  // none in flight
    fill_snapshot(&w, 6);
    checkpoint_writer_start(&w, dir, 6, 0);
    CHECK(expect_exit_failure([&] { checkpoint_writer_snapshot(&w); }, "the previous write is still in flight"));
    CHECK(expect_exit_failure([&] { checkpoint_writer_start(&w, dir, 7, 0); }, "the previous write is still in flight"));
    checkpoint_writer_wait(&w, &done);
    CHECK(done.step == 6 && latest_of(dir) == "6\n");
    CHECK(!checkpoint_writer_poll(&w, &done));
    checkpoint_writer_free(&w);
    remove_dir(dir);
}

TEST(a_failed_write_is_kept_as_its_line) {
    std::string dir = make_temp_dir("test_checkpoint_writer");
    CheckpointWriter w;
    CHECK(checkpoint_writer_init(&w, P, true, PLAIN_MEMORY, 0));
    CheckpointResult done;
    write_and_wait(&w, dir, 4, 1, &done);
    w.write_state = [](const std::string& path, const CheckpointSnapshot&) {
        fail("writing %s: No space left on device (the previous files are kept)", path.c_str());
    };
    write_and_wait(&w, dir, 8, 1, &done);  // the process goes on: the caller decides
    CHECK(done.step == 8 && done.error == "writing " + checkpoint_path(dir, "state", 8) +
                                              ": No space left on device (the previous files are kept)");
    CHECK(latest_of(dir) == "4\n" && file_exists(checkpoint_path(dir, "state", 4).c_str()));
    CHECK(file_exists(checkpoint_path(dir, "model", 4).c_str()));  // not pruned
    CHECK(!g_fail_throws);
    checkpoint_writer_free(&w);
    remove_dir(dir);
}

TEST(an_unwritable_folder_names_the_file) {
    std::string dir = make_temp_dir("test_checkpoint_writer");
    for (bool background : {true, false}) {
        CheckpointWriter w;
        CHECK(checkpoint_writer_init(&w, P, background, PLAIN_MEMORY, 0) == background);
        CheckpointResult done;
        write_and_wait(&w, dir + "/missing", 9, 0, &done);
        CHECK(done.error.find("cannot open " + dir + "/missing/model_00000009.bin.tmp.") == 0);
        CHECK(!g_fail_throws);
        checkpoint_writer_free(&w);
    }
    remove_dir(dir);
}

TEST(no_pinned_memory_writes_synchronously) {
    std::string dir = make_temp_dir("test_checkpoint_writer");
    CheckpointWriter w;
    g_allocations = 0;
    CHECK(!checkpoint_writer_init(&w, P, true, NO_MEMORY, 0));
    CHECK(g_allocations == 1 && !w.background);
    fill_snapshot(&w, 2);
    checkpoint_writer_start(&w, dir, 2, 0);
    CHECK(latest_of(dir) == "2\n");  // written when start returns
    CheckpointResult done;
    CHECK(checkpoint_writer_poll(&w, &done) && done.step == 2 && done.error.empty());
    checkpoint_writer_free(&w);
    CheckpointWriter asked_sync;  // --checkpoint-sync 1: no memory asked for
    CHECK(!checkpoint_writer_init(&asked_sync, P, false, PLAIN_MEMORY, 0) && g_allocations == 1);
    remove_dir(dir);
}

TEST(the_writer_thread_leaves_stop_signals_to_the_main_thread) {
    std::string dir = make_temp_dir("test_checkpoint_writer");
    CheckpointWriter w;
    CHECK(checkpoint_writer_init(&w, P, true, PLAIN_MEMORY, 0));
    bool blocked = false, main_blocked = true;
    w.write_model = [&](const std::string& path, const CheckpointSnapshot& s) {
        sigset_t mask;
        pthread_sigmask(SIG_BLOCK, nullptr, &mask);
        blocked = sigismember(&mask, SIGTERM) && sigismember(&mask, SIGINT) && sigismember(&mask, SIGUSR1);
        checkpoint_write_model_file(path, s);
    };
    CheckpointResult done;
    write_and_wait(&w, dir, 1, 0, &done);
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    main_blocked = sigismember(&mask, SIGTERM);
    CHECK(blocked && !main_blocked && done.error.empty());
    checkpoint_writer_free(&w);
    remove_dir(dir);
}

TEST_MAIN()
