// CPU tests of llmc/logger.h: each kind of main.log line in its exact format (scripts/plot.py
// parses them), flushed as written, nothing written without a log, and the TensorBoard events
// beside main.log (their tags; dev/test/test_tensorboard.py reads them back with TensorBoard).
#include <string>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/logger.h"

// What the writers in fn() leave in a log file, read back while it is still open (so: flushed).
template <typename F>
static std::string logged(F fn) {
    std::string dir = make_temp_dir("test_logger");
    std::string path = dir + "/main.log";
    RunLog log;
    log.file = fopen_or_fail(path.c_str(), "w");
    fn(&log);
    std::string text = read_file(path);
    run_log_close(&log);
    remove_dir(dir);
    return text;
}

TEST(step_line) {
    std::string text = logged([](RunLog* log) {
        log_step(log, {.step = 12, .loss = 3.25f, .lr = 6e-4f, .grad_norm = 1.5f, .ms = 42.125, .tokens_per_second = 97386.4,
                       .mfu_percent = 41.236});
    });
    CHECK(text == "s:12 trl:3.250000 lr:6.000000e-04 norm:1.500000 ms:42.125 tok/s:97386 mfu:41.24\n");
}

TEST(val_eval_and_skip_lines) {
    CHECK(logged([](RunLog* log) { log_val_loss(log, 20, 4.5f); }) == "s:20 tel:4.500000\n");
    CHECK(logged([](RunLog* log) { log_eval(log, 0, 0.29376); }) == "s:0 eval:0.2938\n");
    CHECK(logged([](RunLog* log) { log_skipped(log, 5, "non-finite norm", 2); }) == "s:5 skipped: non-finite norm\n");
}

TEST(comment_lines) {
    CHECK(logged([](RunLog* log) { log_resumed(log, 250, 2); }) == "# resumed at step 250 on 2 GPUs\n");
    CHECK(logged([](RunLog* log) { log_restarted(log); }) == "# no checkpoint to resume from: started from scratch\n");
    CHECK(logged([](RunLog* log) { log_tokens_per_step(log, 524288); }) == "# tokens per step: 524288\n");
    CHECK(logged([](RunLog* log) { log_checkpoint_stall(log, 30, 85.25); }) == "# checkpoint at step 30: the GPU stalled 85.2 ms\n");
    CHECK(logged([](RunLog* log) { log_checkpoint_written(log, 30, 2.414, true); }) ==
          "# checkpoint at step 30: written in 2.41 s in the background\n");
    CHECK(logged([](RunLog* log) { log_checkpoint_written(log, 30, 2.414, false); }) == "# checkpoint at step 30: written in 2.41 s\n");
}

TEST(lines_in_order) {
    std::string text = logged([](RunLog* log) {
        log_val_loss(log, 0, 10.0f);
        log_skipped(log, 0, "norm spike (z 7.1 > 6)", 1);
    });
    CHECK(text == "s:0 tel:10.000000\ns:0 skipped: norm spike (z 7.1 > 6)\n");
}

TEST(no_log_writes_nothing) {
    RunLog none;
    log_step(&none, {.step = 1, .loss = 1, .lr = 1, .grad_norm = 1, .ms = 1, .tokens_per_second = 1, .mfu_percent = 1});
    log_val_loss(&none, 1, 1.0f);
    log_eval(&none, 1, 1.0);
    log_skipped(&none, 1, "x", 1);
    log_tokens_per_step(&none, 1);
    log_resumed(&none, 1, 1);
    log_restarted(&none);
    log_checkpoint_stall(&none, 1, 1.0);
    log_checkpoint_written(&none, 1, 1.0, true);
    log_config(&none, 0, "table");
    log_sample(&none, 1, "text");
    run_log_close(&none);
    CHECK(true);  // reaching here: no write through a null FILE*
}

TEST(text_shown_as_a_code_block) {
    CHECK(markdown_code_block("| a |\n| b |") == "    | a |\n    | b |");
    CHECK(markdown_code_block("") == "    ");
}

// The folder's event file, beside main.log: each writer's tags, in the order written.
TEST(tensorboard_events_beside_main_log) {
    std::string dir = make_temp_dir("test_logger");
    RunLog log = run_log_open(dir, false, false, true);
    CHECK(log.file != nullptr && log.events.file != nullptr);
    log_config(&log, 0, "| model | d12 |");
    log_step(&log, {.step = 0, .loss = 1, .lr = 1, .grad_norm = 1, .ms = 1, .tokens_per_second = 1, .mfu_percent = 1});
    log_val_loss(&log, 0, 1.0f);
    log_eval(&log, 0, 0.5);
    log_skipped(&log, 0, "non-finite loss", 1);
    log_checkpoint_stall(&log, 0, 12.5);
    log_sample(&log, 1, "text");
    log_resumed(&log, 1, 1);
    std::string events = read_file(log.events.path);  // flushed as written
    run_log_close(&log);
    size_t at = 0;
    for (const char* tag : {"config", "    | model | d12 |", "train/loss", "train/lr", "train/grad_norm", "perf/step_ms",
                            "perf/tok_per_s", "perf/mfu_percent", "val/loss", "eval/accuracy", "train/skipped_updates",
                            "perf/checkpoint_stall_ms", "samples", "    text"}) {
        at = events.find(tag, at);
        if (at == std::string::npos) { fprintf(stderr, "  no %s in the events, or out of order\n", tag); }
        CHECK(at != std::string::npos);
    }
    std::string session_start = "\x3a\x02\x08\x01";  // Event field 7: SessionLog {status: START}
    CHECK(events.find(session_start) < events.find("config"));  // a new run's: at step 0, before all else
    CHECK(events.find("\x10\x01" + session_start) != std::string::npos);  // log_resumed's: at its step
    RunLog off = run_log_open(dir, true, false, false);  // --tensorboard 0
    CHECK(off.events.file == nullptr);
    run_log_close(&off);
    remove_dir(dir);
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
    RunLog log = run_log_open(dir, true, false, false);
    log_restarted(&log);
    run_log_close(&log);
    CHECK(read_file(dir + "/main.log") == "s:0 trl:10.900000\n# no checkpoint to resume from: started from scratch\n");
    fclose(log_open(dir, false, true));
    CHECK(read_file(dir + "/main.log").empty());
    remove_dir(dir);
}

// --force over a run: its log, latest, checkpoints and event files move into one replaced_*
// subfolder, whole; the user's other files and names that are no checkpoint's stay.
TEST(force_sets_the_earlier_run_aside) {
    std::string dir = make_temp_dir("test_logger");
    std::vector<std::string> run_files = {"main.log", "latest", "model_00000010.bin", "state_00000010.bin",
                                          "events.out.tfevents.1700000000.host"};
    for (const std::string& name : run_files) { write_file(dir + "/" + name, name); }
    write_file(dir + "/notes.txt", "mine");
    write_file(dir + "/model_000000010.bin", "not a checkpoint's name");
    fclose(log_open(dir, false, true));
    std::vector<std::string> asides;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().filename().string().rfind("replaced_", 0) == 0) { asides.push_back(entry.path().string()); }
    }
    CHECK(asides.size() == 1);
    for (const std::string& name : run_files) {
        CHECK(!asides.empty() && read_file(asides[0] + "/" + name) == name);
        if (name != "main.log") { CHECK(!file_exists((dir + "/" + name).c_str())); }
    }
    CHECK(read_file(dir + "/main.log").empty() && !checkpoint_ever_completed(dir));
    CHECK(read_file(dir + "/notes.txt") == "mine" && file_exists((dir + "/model_000000010.bin").c_str()));
    fclose(log_open(dir, false, true));  // again: a second subfolder, the first kept
    size_t count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        count += entry.path().filename().string().rfind("replaced_", 0) == 0;
    }
    CHECK(count == 2);
    remove_dir(dir);
}

TEST_MAIN()
