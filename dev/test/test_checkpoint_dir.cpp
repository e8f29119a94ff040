// CPU tests of llmc/checkpoint_dir.h in temporary folders: the file names, `latest` written and read
// back (and refused when it holds no step), the steps found (other files ignored), the order a
// resume tries them (newest at or before `latest` first), only the names the trainer writes,
// pruning to the newest K intact pairs at or below `latest` (orphans above it removed), and -y 1's
// rule: a folder whose `latest` was never written (a run killed before its first checkpoint was
// complete, leaving a model file, or nothing) starts from scratch; one with `latest` resumes.
#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/checkpoint_dir.h"

// A folder holding a model and a state file for each of `steps`.
static std::string folder_with(const std::vector<int>& steps) {
    std::string dir = make_temp_dir("test_checkpoint_dir");
    for (int step : steps) {
        write_file(checkpoint_path(dir, "model", step), "m");
        write_file(checkpoint_path(dir, "state", step), "s");
    }
    return dir;
}

// Whether dir's model files and state files are those of `steps`, both.
static bool files_left(const std::string& dir, const std::vector<int>& steps) {
    CheckpointFiles files = checkpoint_scan(dir);
    return files.model == steps && files.state == steps;
}

TEST(paths) {
    CHECK(checkpoint_path("run", "model", 5) == "run/model_00000005.bin");
    CHECK(checkpoint_path("a/b", "state", 123456789) == "a/b/state_123456789.bin");
    CHECK(checkpoint_latest_path("run") == "run/latest");
}

TEST(latest_round_trip) {
    std::string dir = folder_with({});
    CHECK(!checkpoint_ever_completed(dir));
    checkpoint_write_latest(dir, 40);
    CHECK(checkpoint_ever_completed(dir));
    CHECK(read_file(dir + "/latest") == "40\n");
    CHECK(checkpoint_read_latest(dir) == 40);
    checkpoint_write_latest(dir, 50);
    CHECK(checkpoint_read_latest(dir) == 50);
    remove_dir(dir);
}

TEST(latest_without_a_step_is_refused) {
    std::string dir = folder_with({});
    for (const char* bad : {"", "x\n", "-3\n"}) {
        write_file(dir + "/latest", bad);
        CHECK(expect_exit_failure([&] { checkpoint_read_latest(dir); }, (dir + "/latest: does not hold a step number").c_str()));
    }
    remove_dir(dir);
}

TEST(steps_found_oldest_first) {
    std::string dir = folder_with({12, 3, 100000000, 9});
    for (const char* other : {"model_7.bin", "model_0000000x.bin", "model_00000004.bin.tmp.h.1", "main.log", "state_00000002.bin"}) {
        write_file(dir + "/" + other, "");
    }
    CHECK(checkpoint_steps(dir) == std::vector<int>({3, 9, 12, 100000000}));
    CHECK(checkpoint_steps(dir + "/missing").empty());
    remove_dir(dir);
}

TEST(resume_order_newest_at_or_before_latest) {
    std::string dir = folder_with({3, 6, 9, 12});
    CHECK(checkpoint_resume_order(dir, 12) == std::vector<int>({12, 9, 6, 3}));
    CHECK(checkpoint_resume_order(dir, 10) == std::vector<int>({9, 6, 3}));  // 12 not yet named by latest
    CHECK(checkpoint_resume_order(dir, 2).empty());
    remove_dir(dir);
}

TEST(prune_keeps_the_newest) {
    std::string dir = folder_with({3, 6, 9, 12});
    checkpoint_prune(dir, 12, 2);
    CHECK(checkpoint_steps(dir) == std::vector<int>({9, 12}));
    CHECK(!file_exists(checkpoint_path(dir, "state", 6).c_str()) && file_exists(checkpoint_path(dir, "state", 9).c_str()));
    checkpoint_prune(dir, 12, 5);
    CHECK(checkpoint_steps(dir) == std::vector<int>({9, 12}));
    remove_dir(dir);
}

// A kill -9 between a model file and `latest` leaves an orphan above `latest`; a resumed run that
// then checkpoints at a lower step (a SIGTERM, --stop-at) must keep the pair `latest` names, and
// the orphan goes (model or state file alone, or both).
TEST(prune_keeps_latest_and_removes_orphans_above_it) {
    std::string dir = folder_with({10, 12});
    write_file(checkpoint_path(dir, "model", 20), "orphan model");
    write_file(checkpoint_path(dir, "state", 30), "orphan state");
    write_file(checkpoint_path(dir, "model", 40), "m");
    write_file(checkpoint_path(dir, "state", 40), "s");
    checkpoint_prune(dir, 12, 1);
    CHECK(files_left(dir, {12}));
    CHECK(checkpoint_resume_order(dir, 12) == std::vector<int>({12}));
    remove_dir(dir);
}

TEST(prune_counts_only_pairs_at_or_below_latest) {
    std::string dir = folder_with({3, 6, 9});
    write_file(checkpoint_path(dir, "model", 15), "orphan");
    checkpoint_prune(dir, 9, 2);
    CHECK(files_left(dir, {6, 9}));
    remove_dir(dir);
}

// K counts intact pairs: with state_200 gone and K=2, the pairs 300 and 100 stay (counting model
// files alone kept 300 and 200, one intact checkpoint), and model_200 without its state goes.
TEST(prune_counts_intact_pairs) {
    std::string dir = folder_with({100, 200, 300});
    remove(checkpoint_path(dir, "state", 200).c_str());
    write_file(checkpoint_path(dir, "state", 50), "a state file without its model");
    checkpoint_prune(dir, 300, 2);
    CHECK(files_left(dir, {100, 300}));
    remove_dir(dir);
}

// Only the names the trainer writes are checkpoints: a stray model_000000300.bin (nine digits) is
// not step 300's, so pruning neither counts it nor deletes the real model_00000300.bin for it.
TEST(prune_ignores_non_canonical_names) {
    std::string dir = folder_with({200, 300});
    for (const char* stray : {"model_000000300.bin", "state_000000300.bin", "model_0000000300.bin"}) {
        write_file(dir + "/" + stray, "stray");
    }
    checkpoint_prune(dir, 300, 1);
    CHECK(files_left(dir, {300}));
    CHECK(read_file(checkpoint_path(dir, "model", 300)) == "m" && read_file(dir + "/model_000000300.bin") == "stray");
    remove_dir(dir);
}

TEST(state_file_names) {
    CHECK(checkpoint_step_of("state_00000042.bin", "state") == 42);
    CHECK(checkpoint_step_of("state_00000042.bin") == -1);
    CHECK(checkpoint_step_of("model_00000042.bin", "state") == -1);
    CHECK(checkpoint_step_of("state_0000042.bin", "state") == -1);
    CHECK(checkpoint_step_of("state_00000042.bin.tmp.h.1", "state") == -1);
    CHECK(checkpoint_step_of("model_123456789.bin") == 123456789);
    CHECK(checkpoint_step_of("model_2147483647.bin") == 2147483647);
    for (const char* other : {"model_000000300.bin", "model_0000000300.bin", "model_012345678.bin", "model_2147483648.bin",
                              "model_99999999999.bin", "model_+0000300.bin", "model_-0000300.bin", "model_00000300.bin ",
                              "modelx00000300.bin", "model_00000300.BIN", "model_.bin", "model"}) {
        CHECK(checkpoint_step_of(other) == -1);
    }
}

// -y 1's rule. Killed (kill -9) before its first checkpoint was complete, a run leaves a model file
// without its state file, temporary files and main.log, but no `latest`: start from scratch.
TEST(killed_before_the_first_checkpoint_starts_from_scratch) {
    std::string dir = make_temp_dir("test_checkpoint_dir");
    CHECK(!checkpoint_ever_completed(dir));
    CHECK(!checkpoint_ever_completed(dir + "/never_created"));
    write_file(checkpoint_path(dir, "model", 5), "complete model file");
    write_file(checkpoint_path(dir, "state", 5) + ".tmp.host.123", "partial state file");
    write_file(dir + "/main.log", "s:0 trl:10.9\n");
    CHECK(!checkpoint_ever_completed(dir));
    remove_dir(dir);
}

// Once `latest` was written, -y 1 resumes, even where every checkpoint is now damaged or gone: the
// resume then stops with its error rather than starting over.
TEST(a_completed_checkpoint_is_resumed_even_if_damaged) {
    std::string dir = folder_with({3});
    checkpoint_write_latest(dir, 3);
    CHECK(checkpoint_ever_completed(dir));
    remove(checkpoint_path(dir, "model", 3).c_str());
    CHECK(checkpoint_ever_completed(dir) && checkpoint_resume_order(dir, 3).empty());
    remove_dir(dir);
}

TEST_MAIN()
