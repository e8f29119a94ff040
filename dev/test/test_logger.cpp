// CPU tests of llmc/logger.h: each kind of main.log line in its exact format (scripts/plot.py
// parses them), flushed as written, and nothing written without a log.
#include <string>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/logger.h"

// What the writers in fn() leave in a log file, read back while it is still open (so: flushed).
template <typename F>
static std::string logged(F fn) {
    std::string dir = make_temp_dir("test_logger");
    std::string path = dir + "/main.log";
    FILE* log = fopen_or_fail(path.c_str(), "w");
    fn(log);
    std::string text = read_file(path);
    fclose(log);
    remove_dir(dir);
    return text;
}

TEST(step_line) {
    std::string text = logged([](FILE* log) {
        log_step(log, {.step = 12, .loss = 3.25f, .lr = 6e-4f, .grad_norm = 1.5f, .ms = 42.125, .tokens_per_second = 97386.4,
                       .mfu_percent = 41.236});
    });
    CHECK(text == "s:12 trl:3.250000 lr:6.000000e-04 norm:1.500000 ms:42.125 tok/s:97386 mfu:41.24\n");
}

TEST(val_eval_and_skip_lines) {
    CHECK(logged([](FILE* log) { log_val_loss(log, 20, 4.5f); }) == "s:20 tel:4.500000\n");
    CHECK(logged([](FILE* log) { log_eval(log, 0, 0.29376); }) == "s:0 eval:0.2938\n");
    CHECK(logged([](FILE* log) { log_skipped(log, 5, "non-finite norm"); }) == "s:5 skipped: non-finite norm\n");
}

TEST(comment_lines) {
    CHECK(logged([](FILE* log) { log_resumed(log, 250, 2); }) == "# resumed at step 250 on 2 GPUs\n");
    CHECK(logged([](FILE* log) { log_restarted(log); }) == "# no checkpoint to resume from: started from scratch\n");
}

TEST(lines_in_order) {
    std::string text = logged([](FILE* log) {
        log_val_loss(log, 0, 10.0f);
        log_skipped(log, 0, "norm spike (z 7.1 > 6)");
    });
    CHECK(text == "s:0 tel:10.000000\ns:0 skipped: norm spike (z 7.1 > 6)\n");
}

TEST(no_log_writes_nothing) {
    log_step(nullptr, {.step = 1, .loss = 1, .lr = 1, .grad_norm = 1, .ms = 1, .tokens_per_second = 1, .mfu_percent = 1});
    log_val_loss(nullptr, 1, 1.0f);
    log_eval(nullptr, 1, 1.0);
    log_skipped(nullptr, 1, "x");
    log_resumed(nullptr, 1, 1);
    log_restarted(nullptr);
    CHECK(true);  // reaching here: no write through a null FILE*
}

TEST(open_refuses_a_folder_holding_a_run) {
    std::string dir = make_temp_dir("test_logger");
    fclose(log_open(dir + "/run", false, false));  // a new folder
    std::string expected = "flag -o: " + dir + "/run already holds a run; resume it with -y 1, or pass --force to start over";
    CHECK(expect_exit_failure([&] { log_open(dir + "/run", false, false); }, expected.c_str()));
    std::filesystem::create_directory(dir + "/checkpoints_only");
    write_file(dir + "/checkpoints_only/latest", "");
    CHECK(expect_exit_failure([&] { log_open(dir + "/checkpoints_only", false, false); }, "checkpoints_only already holds a run"));
    CHECK(expect_exit_failure([&] { log_open(dir + "/missing/run", false, false); },
                              ("flag -o: cannot create directory " + dir + "/missing/run: No such file or directory").c_str()));
    remove_dir(dir);
}

// -y 1 appends (after a resume, or a start from scratch); --force starts the log afresh.
TEST(open_appends_when_resuming) {
    std::string dir = make_temp_dir("test_logger");
    write_file(dir + "/main.log", "s:0 trl:10.900000\n");
    FILE* log = log_open(dir, true, false);
    log_restarted(log);
    fclose(log);
    CHECK(read_file(dir + "/main.log") == "s:0 trl:10.900000\n# no checkpoint to resume from: started from scratch\n");
    fclose(log_open(dir, false, true));
    CHECK(read_file(dir + "/main.log").empty());
    remove_dir(dir);
}

TEST_MAIN()
