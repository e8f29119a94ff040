// CPU tests of llmc/outputs.h in temporary folders: a new output is allowed; an existing one only
// with --force; one of the inputs never, however it is named (`..`, a symbolic link, a hard link),
// each with a one-line error naming the file.
#include <unistd.h>

#include <string>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/outputs.h"

// The problem output_allowed reports, "" if the output may be written.
static std::string problem_of(const std::string& output, const std::vector<std::string>& inputs, bool force) {
    std::string problem;
    bool allowed = output_allowed(output, inputs, force, &problem);
    CHECK(allowed == problem.empty());
    return problem;
}

TEST(new_output_allowed) {
    std::string dir = make_temp_dir("test_outputs");
    write_file(dir + "/in.bin", "in");
    CHECK(problem_of(dir + "/out.bin", {dir + "/in.bin"}, false) == "");
    CHECK(problem_of(dir + "/out.bin", {dir + "/missing.bin"}, false) == "");
    remove_dir(dir);
}

TEST(existing_output_needs_force) {
    std::string dir = make_temp_dir("test_outputs");
    write_file(dir + "/in.bin", "in");
    write_file(dir + "/out.bin", "old");
    CHECK(problem_of(dir + "/out.bin", {dir + "/in.bin"}, false) == dir + "/out.bin already exists (use --force to overwrite)");
    CHECK(problem_of(dir + "/out.bin", {dir + "/in.bin"}, true) == "");
    remove_dir(dir);
}

TEST(an_input_is_never_an_output) {
    std::string dir = make_temp_dir("test_outputs");
    std::string input = dir + "/model.safetensors";
    write_file(input, "weights");
    CHECK(mkdir((dir + "/sub").c_str(), 0755) == 0);
    CHECK(symlink(input.c_str(), (dir + "/soft.bin").c_str()) == 0);
    CHECK(link(input.c_str(), (dir + "/hard.bin").c_str()) == 0);
    for (const std::string& output : {input, dir + "/sub/../model.safetensors", dir + "/soft.bin", dir + "/hard.bin"}) {
        for (bool force : {false, true}) {
            CHECK(problem_of(output, {dir + "/config.json", input}, force) ==
                  output + " is the input " + input + ": choose another output");
        }
    }
    remove_dir(dir);
}

TEST(outputs_checked_before_any_is_written) {
    std::string dir = make_temp_dir("test_outputs");
    write_file(dir + "/b.json", "old");
    CHECK(expect_exit_failure([&] { outputs_allowed_or_fail({dir + "/a.bin", dir + "/b.json"}, {}, false); },
                              (dir + "/b.json already exists (use --force to overwrite)").c_str()));
    CHECK(!file_exists((dir + "/a.bin").c_str()));
    remove_dir(dir);
}

TEST_MAIN()
