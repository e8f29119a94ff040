// Tests of llmc/paths.h (finding the bundled files from any directory) and of ./prepare_data,
// ./train_gpt2_fp32 and ./test_gpt2_fp32 run from directories other than the repository root
// (the last two also on a machine without a GPU: the files are found and checked before the GPU
// is needed). Run from any directory, after the binaries are built: build/test_paths [name
// filter]. The repository root is the parent of this binary's directory (build/).
#include <filesystem>

#include "dev/test/files.h"
#include "dev/test/sha256.h"
#include "dev/test/testing.h"
#include "llmc/paths.h"

constexpr const char* ENCODER_PATH = "dev/data/gpt2_encoder.json";
constexpr const char* TINYSHAKESPEARE_TEXT = "dev/data/tiny_shakespeare.txt";

#ifdef GPT2FP32_SOURCE_DIR
constexpr const char* SOURCE_DIR = GPT2FP32_SOURCE_DIR;
#else
constexpr const char* SOURCE_DIR = nullptr;
#endif

// ---------------------------------------------------------------------------------
// Fixtures.


static std::string repo_root(void) { return parent_dir(executable_dir()); }

// Runs the enclosing scope in `dir`, then returns to the directory it started in.
struct InDir {
    std::string previous;
    explicit InDir(const std::string& dir) {
        previous = std::filesystem::current_path().string();
        if (chdir(dir.c_str()) != 0) { fail("chdir %s: %s", dir.c_str(), strerror(errno)); }
    }
    ~InDir() {
        if (chdir(previous.c_str()) != 0) { fail("chdir %s: %s", previous.c_str(), strerror(errno)); }
    }
};

static std::string shell_quoted(const std::string& text) { return "'" + text + "'"; }

// Exit status of `command` run by the shell in `dir` (-1 if it did not exit normally).
static int run_in(const std::string& dir, const std::string& command) {
    int status = system(("cd " + shell_quoted(dir) + " && " + command).c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static std::string prepare_data_binary(void) { return repo_root() + "/prepare_data"; }

// ---------------------------------------------------------------------------------
// find_bundled_file().

TEST(explicit_path_is_used_as_given_and_must_exist) {
    std::string dir = make_temp_dir("test_paths");
    write_file(dir + "/my_vocab.json", "{}");
    std::string given = dir + "/my_vocab.json";
    CHECK(find_bundled_file(ENCODER_PATH, given.c_str(), "--vocab") == given);
    {
        InDir in(dir);
        CHECK(find_bundled_file(ENCODER_PATH, "my_vocab.json", "--vocab") == "my_vocab.json");
    }
    std::string missing = dir + "/missing.json";
    CHECK(expect_exit_failure([&]() { find_bundled_file(ENCODER_PATH, missing.c_str(), "--vocab"); },
                              ("error: --vocab " + missing + ": No such file or directory\n").c_str()));
    CHECK(expect_exit_failure([&]() { find_bundled_file(ENCODER_PATH, dir.c_str(), "--tokenizer"); },
                              ("error: --tokenizer " + dir + ": is a directory\n").c_str()));
    remove_dir(dir);
}

TEST(found_relative_to_the_repository_root) {
    InDir in(repo_root());
    CHECK(find_bundled_file(ENCODER_PATH, nullptr, "--vocab") == ENCODER_PATH);
    CHECK(find_bundled_file(TINYSHAKESPEARE_TEXT, nullptr, nullptr) == TINYSHAKESPEARE_TEXT);
}

TEST(found_from_another_directory) {
    std::string dir = make_temp_dir("test_paths");
    std::string expected = repo_root() + "/" + ENCODER_PATH;
    {
        InDir in(dir);
        CHECK(find_bundled_file(ENCODER_PATH, nullptr, "--vocab") == expected);
        std::string text = find_bundled_file(TINYSHAKESPEARE_TEXT, nullptr, nullptr);
        CHECK(text == repo_root() + "/" + TINYSHAKESPEARE_TEXT);
        CHECK(read_file(text).size() == 1115394);
        // A copy under the current directory comes first.
        std::filesystem::create_directories("dev/data");
        write_file("dev/data/gpt2_encoder.json", "{}");
        CHECK(find_bundled_file(ENCODER_PATH, nullptr, "--vocab") == ENCODER_PATH);
    }
    remove_dir(dir);
}

TEST(search_order_is_cwd_executable_dirs_then_source_dir) {
    CHECK(SOURCE_DIR != nullptr);  // the Makefile passes -DGPT2FP32_SOURCE_DIR
    std::string dir = make_temp_dir("test_paths");
    std::string exe = std::filesystem::canonical("/proc/self/exe").parent_path().string();
    std::vector<std::string> expected = {dir, exe, parent_dir(exe), parent_dir(parent_dir(exe))};
    if (SOURCE_DIR != nullptr && std::find(expected.begin(), expected.end(), SOURCE_DIR) == expected.end()) {
        expected.push_back(SOURCE_DIR);
    }
    {
        InDir in(dir);
        CHECK(bundled_file_dirs() == expected);
    }
    CHECK(exe == repo_root() + "/build");
    CHECK(SOURCE_DIR != nullptr && std::filesystem::equivalent(SOURCE_DIR, repo_root()));
    CHECK(parent_dir("/a/b") == "/a" && parent_dir("/a/b/") == "/a" && parent_dir("/a") == "/" && parent_dir("/") == "/");
    CHECK(join_path("/", "x/y") == "/x/y" && join_path("/a", "x") == "/a/x" && join_path("/a", "/abs") == "/abs");
    remove_dir(dir);
}

TEST(error_names_every_place_looked) {
    std::string dir = make_temp_dir("test_paths");
    const char* name = "dev/data/no_such_file.json";
    std::string looked;
    {
        InDir in(dir);
        for (const std::string& place : bundled_file_dirs()) { looked += (looked.empty() ? "" : ", ") + place + "/" + name; }
    }
    CHECK(looked.find(dir + "/" + name + ", " + repo_root() + "/build/" + name + ", " + repo_root() + "/" + name) == 0);
    InDir in(dir);
    CHECK(expect_exit_failure([&]() { find_bundled_file(name, nullptr, "--vocab"); },
                              ("error: cannot find " + std::string(name) + ": looked in " + looked +
                               "; pass --vocab PATH\n").c_str()));
    CHECK(expect_exit_failure([&]() { find_bundled_file(name, nullptr, nullptr); },
                              ("error: cannot find " + std::string(name) + ": looked in " + looked + "\n").c_str()));
    remove_dir(dir);
}

// ---------------------------------------------------------------------------------
// ./prepare_data from other directories.

TEST(prepare_data_encode_and_decode_from_another_directory) {
    std::string dir = make_temp_dir("test_paths");
    std::string bin = shell_quoted(prepare_data_binary());
    write_file(dir + "/hello.txt", "Hello world, caf\xc3\xa9!\n");
    CHECK(run_in(repo_root(), "./prepare_data encode " + shell_quoted(dir + "/hello.txt") + " > " + shell_quoted(dir + "/root.ids")) == 0);
    CHECK(run_in(dir, bin + " encode hello.txt > elsewhere.ids 2> elsewhere.err") == 0);
    CHECK(read_file(dir + "/root.ids") == "15496 995 11 40304 0 198\n");
    CHECK(read_file(dir + "/elsewhere.ids") == read_file(dir + "/root.ids"));
    CHECK(read_file(dir + "/elsewhere.err").empty());
    CHECK(run_in(dir, bin + " decode < elsewhere.ids > hello.out") == 0);
    CHECK(read_file(dir + "/hello.out") == read_file(dir + "/hello.txt"));
    CHECK(run_in(dir, "cat hello.txt | " + bin + " encode /dev/stdin > pipe.ids") == 0);  // a pipe has size 0
    CHECK(read_file(dir + "/pipe.ids") == read_file(dir + "/root.ids"));
    // --vocab anywhere after the mode.
    std::string vocab = shell_quoted(repo_root() + "/" + ENCODER_PATH);
    CHECK(run_in(dir, bin + " encode --vocab " + vocab + " hello.txt > flag.ids") == 0);
    CHECK(run_in(dir, bin + " encode hello.txt --vocab " + vocab + " > flag_after.ids") == 0);
    CHECK(read_file(dir + "/flag.ids") == read_file(dir + "/root.ids"));
    CHECK(read_file(dir + "/flag_after.ids") == read_file(dir + "/root.ids"));
    CHECK(run_in(dir, bin + " decode --vocab missing.json < flag.ids > bad.out 2> bad.err") == 1);
    CHECK(read_file(dir + "/bad.err") == "error: --vocab missing.json: No such file or directory\n");
    CHECK(run_in(dir, bin + " encode hello.txt --vocab 2> usage.err") == 1);
    CHECK(read_file(dir + "/usage.err").find("error: --vocab needs a PATH") != std::string::npos);
    CHECK(run_in(dir, bin + " -h > help.txt") == 0);
    CHECK(read_file(dir + "/help.txt").find("--vocab PATH") != std::string::npos);
    remove_dir(dir);
}

// ./hf_convert never overwrites without --force and never writes over one of its inputs: a
// one-line error naming the file, a non-zero exit, the file unchanged.
TEST(hf_convert_refuses_to_overwrite) {
    std::string dir = make_temp_dir("test_paths");
    std::filesystem::copy(repo_root() + "/dev/test/fixtures/hf_tiny", dir + "/hf");
    std::string bin = shell_quoted(repo_root() + "/hf_convert"), weights = read_file(dir + "/hf/model.safetensors");
    CHECK(run_in(dir, bin + " import hf hf/model.safetensors 2> self.err") == 1);
    CHECK(run_in(dir, bin + " import hf hf/../hf/config.json --force 2> config.err") == 1);
    CHECK(read_file(dir + "/self.err") ==
          "error: hf/model.safetensors is the input hf/model.safetensors: choose another output\n");
    CHECK(read_file(dir + "/config.err") == "error: hf/../hf/config.json is the input hf/config.json: choose another output\n");
    CHECK(read_file(dir + "/hf/model.safetensors") == weights);
    CHECK(run_in(dir, bin + " import hf model.bin > /dev/null") == 0);
    CHECK(run_in(dir, bin + " import hf model.bin 2> again.err") == 1);
    CHECK(read_file(dir + "/again.err") == "error: model.bin already exists (use --force to overwrite)\n");
    CHECK(run_in(dir, bin + " import hf model.bin --force > /dev/null") == 0);
    CHECK(run_in(dir, bin + " export model.bin out > /dev/null") == 0);
    CHECK(run_in(dir, bin + " export model.bin out 2> export.err") == 1);
    CHECK(read_file(dir + "/export.err") == "error: out/model.safetensors already exists (use --force to overwrite)\n");
    CHECK(run_in(dir, bin + " export model.bin out --force > /dev/null") == 0);
    remove_dir(dir);
}

// A copy of the binary outside the repository still finds the vocabulary through the
// compiled-in source path.
TEST(prepare_data_copy_outside_the_repository) {
    std::string dir = make_temp_dir("test_paths");
    std::filesystem::create_directories(dir + "/bin");
    std::filesystem::create_directories(dir + "/work");
    std::filesystem::copy_file(prepare_data_binary(), dir + "/bin/prepare_data");
    write_file(dir + "/work/hello.txt", "Hello world");
    CHECK(run_in(dir + "/work", "../bin/prepare_data encode hello.txt > hello.ids") == 0);
    CHECK(read_file(dir + "/work/hello.ids") == "15496 995\n");
    remove_dir(dir);
}

TEST(prepare_data_tinyshakespeare_from_another_directory) {
    std::string dir = make_temp_dir("test_paths");
    std::string bin = shell_quoted(prepare_data_binary());
    CHECK(run_in(dir, bin + " tinyshakespeare --threads 4 > written.txt 2> /dev/null") == 0);
    std::string val = dir + "/dev/data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string train = dir + "/dev/data/tinyshakespeare/tiny_shakespeare_train.bin";
    CHECK(sha256_file(val.c_str()) == "fe99db720dc7c83e694806d4e047a952909411da1daccde4ccc2e55f40882a62");
    CHECK(sha256_file(train.c_str()) == "8a70606be574040c26d225694f5f9759973b419852d22f7fe5c118e1b359dcc8");
    CHECK(read_file(dir + "/written.txt").find("wrote dev/data/tinyshakespeare/tiny_shakespeare_val.bin") == 0);
    CHECK(run_in(dir, bin + " tinyshakespeare -o out --threads 2 > /dev/null 2>&1") == 0);
    CHECK(read_file(dir + "/out/tiny_shakespeare_val.bin") == read_file(val));
    CHECK(read_file(dir + "/out/tiny_shakespeare_train.bin") == read_file(train));
    CHECK(run_in(dir, bin + " tinyshakespeare -o out 2> exists.err") == 1);
    CHECK(read_file(dir + "/exists.err") == "error: out/tiny_shakespeare_val.bin already exists (use --force to overwrite)\n");
    remove_dir(dir);
}

// ---------------------------------------------------------------------------------
// ./train_gpt2_fp32 and ./test_gpt2_fp32 from other directories.

constexpr const char* NO_GPU = "error: no CUDA GPU found";

TEST(trainer_finds_the_bundled_data_and_vocabulary_from_another_directory) {
    std::string dir = make_temp_dir("test_paths");
    std::string bin = shell_quoted(repo_root() + "/train_gpt2_fp32");
    // A GPU trains one step on tiny Shakespeare and prints a sample; without one, the run stops
    // only for the GPU.
    int status = run_in(dir, bin + " -e d12 -b 1 -t 32 -x 1 -v 1 -m 1 -s 1 -g 4 > train.out 2> train.err");
    std::string err = read_file(dir + "/train.err");
    CHECK(status == 0 || err.find(NO_GPU) == 0);
    if (status != 0 && err.find(NO_GPU) != 0) { fprintf(stderr, "  %s", err.c_str()); }
    CHECK(err.find("cannot find") == std::string::npos);
    CHECK(run_in(dir, bin + " --tokenizer missing.json 2> flag.err") == 1);
    CHECK(read_file(dir + "/flag.err") == "error: --tokenizer missing.json: No such file or directory\n");
    CHECK(run_in(dir, bin + " -e " + shell_quoted(dir) + " 2> dir.err") == 1);
    CHECK(read_file(dir + "/dir.err").find(dir + ": a directory without config.json") != std::string::npos ||
          read_file(dir + "/dir.err").find(NO_GPU) == 0);
    remove_dir(dir);
}

// Runs ./test_gpt2_fp32 in dir with `args`; its exit status, stdout and stderr in dir/test.out, .err.
static int run_test_binary(const std::string& dir, const std::string& args) {
    return run_in(dir, shell_quoted(repo_root() + "/test_gpt2_fp32") + " " + args + " > test.out 2> test.err");
}

TEST(test_binary_finds_the_bundled_fixture_from_another_directory) {
    std::string dir = make_temp_dir("test_paths");
    CHECK(run_test_binary(dir, "") == 0);
    std::string out = read_file(dir + "/test.out");
    CHECK(out.find(repo_root() + "/dev/test/fixtures/gpt2_small_softmax_state.bin") != std::string::npos);
    CHECK(out.find("PASS") != std::string::npos || out.find("SKIPPED (no GPU)") == 0);
    CHECK(run_test_binary(dir, "-m x.bin") == 1);
    CHECK(read_file(dir + "/test.err").find("error: flags -m and -s go together") == 0);
    remove_dir(dir);
}

// The classic files in the current directory are taken without flags; the tiny Hugging Face
// fixture's twin and its classic (version 2) state stand in for GPT-2 124M's.
TEST(test_binary_takes_the_classic_files_and_version_2_state) {
    std::string dir = make_temp_dir("test_paths");
    std::string fixtures = repo_root() + "/dev/test/fixtures/";
    std::filesystem::copy_file(fixtures + "hf_tiny_model.bin", dir + "/gpt2_124M.bin");
    CHECK(run_test_binary(dir, "") == 1);
    CHECK(read_file(dir + "/test.err") == "error: cannot open gpt2_124M_debug_state.bin: No such file or directory\n");
    std::string state = read_file(fixtures + "hf_tiny_classic_state.bin");
    write_file(dir + "/gpt2_124M_debug_state.bin", state);
    CHECK(run_test_binary(dir, "") == 0);
    std::string out = read_file(dir + "/test.out");
    CHECK(out.find("gpt2_124M_debug_state.bin") != std::string::npos);
    CHECK(out.find("SKIPPED (no GPU)") == 0 ||
          (out.find("(version 2)") != std::string::npos && out.find("no optimizer steps") != std::string::npos &&
           out.find("PASS") != std::string::npos));
    // the same state against the Hugging Face directory of the same model
    CHECK(run_test_binary(dir, "-m " + shell_quoted(fixtures + "hf_tiny") + " -s gpt2_124M_debug_state.bin") == 0);
    // defects: truncated, another version, a model of another vocabulary
    write_file(dir + "/short.bin", state.substr(0, state.size() - 4));
    CHECK(run_test_binary(dir, "-m gpt2_124M.bin -s short.bin") == 1);
    CHECK(read_file(dir + "/test.err").find("short.bin: 607232 bytes, expected 607236") != std::string::npos);
    std::string v3 = state;
    v3[4] = 3;
    write_file(dir + "/v3.bin", v3);
    CHECK(run_test_binary(dir, "-m gpt2_124M.bin -s v3.bin") == 1);
    CHECK(read_file(dir + "/test.err").find("version 3 not supported, expected 4 (train_gpt2.py) or 2 (classic)") !=
          std::string::npos);
    CHECK(run_test_binary(dir, "-m " + shell_quoted(fixtures + "gpt2_small_softmax_model.bin") + " -s gpt2_124M_debug_state.bin") == 1);
    CHECK(read_file(dir + "/test.err").find("bytes, expected") != std::string::npos);
    remove_dir(dir);
}

TEST_MAIN()
