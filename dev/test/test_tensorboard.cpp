// CPU tests of llmc/tensorboard.h: the records byte for byte as TensorBoard's own Python package
// writes them (dev/test/fixtures/tensorboard, made by dev/test/make_tensorboard_fixture.py), the
// masked CRC, file names, and write errors (one line, then nothing). TensorBoard's reader reads
// them back in dev/test/test_tensorboard.py. Run from the repository root.
#include <algorithm>
#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/tensorboard.h"

constexpr const char* FIXTURE = "dev/test/fixtures/tensorboard/events.out.tfevents.fixture";

// A clock that returns these times in turn, for wall times and names known in advance.
static std::vector<double> g_times;
static size_t g_next_time;
static double fixed_clock() { return g_times[g_next_time++ % g_times.size()]; }
static void set_clock(const std::vector<double>& times) {
    g_times = times;
    g_next_time = 0;
}

static std::string only_file_in(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) { names.push_back(entry.path().string()); }
    return names.size() == 1 ? names[0] : "";
}

// The same events as make_tensorboard_fixture.py writes, with the same wall times.
TEST(records_match_what_tensorboard_wrote) {
    std::string text = "First line of a sample,\nand a second: caf\xc3\xa9 \xe2\x80\x94 ";
    for (int i = 0; i < 40; i++) { text += "long "; }
    set_clock({1700000000.25, 1700000001.5, 1700000002.75, 1700000003.0, 1700000004.125, 1700000005.0});
    std::string dir = make_temp_dir("test_tensorboard");
    TensorBoard tb;
    CHECK(tensorboard_open(&tb, dir, fixed_clock));
    tensorboard_scalars(&tb, 0, {{"perf/mfu_percent", 0.0f}});
    tensorboard_scalars(&tb, 12, {{"train/loss", 3.25f}, {"train/lr", 6e-4f}, {"train/grad_norm", -1.5f}});
    tensorboard_text(&tb, "samples", 12, text);
    tensorboard_session_start(&tb, 7);
    tensorboard_scalars(&tb, 3000000000LL, {{"val/loss", 4.5f}});
    tensorboard_close(&tb);
    std::string expected = read_file(FIXTURE);
    CHECK(expected.size() == 572);
    CHECK(read_file(only_file_in(dir)) == expected);
    remove_dir(dir);
}

// A raw byte of a path and a character cut short (a table row cut at its buffer's size) are
// written as U+FFFD: TensorBoard's text dashboard fails on ill-formed UTF-8.
TEST(text_repaired_to_utf8) {
    std::string broken = "run in /data/\xff\xfe: caf\xc3\xa9 \xe2\x80", repaired = "run in /data/\xef\xbf\xbd\xef\xbf\xbd: caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd";
    CHECK(utf8_repaired((const uint8_t*)broken.data(), broken.size()) == repaired);
    std::string files[2];
    for (int i = 0; i < 2; i++) {
        set_clock({1700000000.25});
        std::string dir = make_temp_dir("test_tensorboard");
        TensorBoard tb;
        CHECK(tensorboard_open(&tb, dir, fixed_clock));
        tensorboard_text(&tb, "configuration", 0, i == 0 ? broken : repaired);
        tensorboard_close(&tb);
        files[i] = read_file(only_file_in(dir));
        remove_dir(dir);
    }
    CHECK(!files[0].empty() && files[0] == files[1]);
}

TEST(masked_crc_of_known_input) {
    CHECK(tensorboard_masked_crc("123456789", 9) == 0xc78ab0e5);  // CRC32C 0xe3069283, masked
    CHECK(tensorboard_masked_crc("", 0) == 0xa282ead8);           // CRC 0: the mask's delta alone
    uint64_t length = 24;  // the fixture's first header, as TensorBoard wrote it
    CHECK(tensorboard_masked_crc(&length, 8) == 0x224b7fa3);
}

// events.out.tfevents.<seconds, 10 digits>.<host>, and a suffix where that name is taken.
TEST(file_names_never_overwrite) {
    char host[256] = "";
    CHECK(gethostname(host, sizeof(host) - 1) == 0);
    std::string dir = make_temp_dir("test_tensorboard");
    set_clock({123456789.5});
    TensorBoard first, second;
    CHECK(tensorboard_open(&first, dir, fixed_clock) && tensorboard_open(&second, dir, fixed_clock));
    CHECK(first.path == dir + "/events.out.tfevents.0123456789." + host);
    CHECK(second.path == first.path + ".001");
    tensorboard_close(&first);
    tensorboard_close(&second);
    CHECK(read_file(first.path) == read_file(second.path) && read_file(first.path).size() == 40);
    remove_dir(dir);
}

// The lines of a child's stderr.
static int line_count(const std::string& text) { return (int)std::count(text.begin(), text.end(), '\n'); }

// The folder removed mid-run: one line naming the file, then no more writes, and no crash.
TEST(removed_folder_stops_with_one_line) {
    std::string dir = make_temp_dir("test_tensorboard");
    set_clock({1700000000.0});
    std::string err = stderr_of_success([&] {
        TensorBoard tb;
        if (!tensorboard_open(&tb, dir, fixed_clock)) { exit(2); }
        remove_dir(dir);
        for (int step = 0; step < 3; step++) { tensorboard_scalars(&tb, step, {{"train/loss", 1.0f}}); }
        tensorboard_text(&tb, "samples", 3, "x");
        tensorboard_session_start(&tb, 4);
        if (tb.file != nullptr) { exit(3); }
        tensorboard_close(&tb);
    });
    CHECK(line_count(err) == 1);
    CHECK(err.find("tensorboard: cannot write " + dir + "/events.out.tfevents.1700000000.") == 0);
    CHECK(err.find(": No such file or directory; no more TensorBoard events are written") != std::string::npos);
    remove_dir(dir);
}

// A full disk (/dev/full fails every flush).
TEST(full_disk_stops_with_one_line) {
    std::string err = stderr_of_success([] {
        TensorBoard tb;
        tb.path = "/dev/full";
        tb.file = fopen(tb.path.c_str(), "wb");
        if (tb.file == nullptr) { return; }  // no /dev/full here: nothing to test
        tensorboard_scalars(&tb, 1, {{"train/loss", 1.0f}});
        tensorboard_scalars(&tb, 2, {{"train/loss", 1.0f}});
        if (tb.file != nullptr) { exit(3); }
    });
    int lines = line_count(err);
    CHECK(lines == (file_exists("/dev/full") ? 1 : 0));
    CHECK(lines == 0 || err == "tensorboard: cannot write /dev/full: No space left on device; no more TensorBoard "
                               "events are written (the run goes on)\n");
}

TEST(open_in_a_missing_folder_says_so) {
    set_clock({1700000000.0});
    std::string err = stderr_of_success([] {
        TensorBoard tb;
        if (tensorboard_open(&tb, "/nonexistent/run", fixed_clock) || tb.file != nullptr) { exit(3); }
        tensorboard_scalars(&tb, 1, {{"train/loss", 1.0f}});  // a writer never opened does nothing
        tensorboard_close(&tb);
    });
    CHECK(line_count(err) == 1);
    CHECK(err.find("tensorboard: cannot create /nonexistent/run/events.out.tfevents.1700000000.") == 0);
    CHECK(err.find(": No such file or directory; no TensorBoard events are written") != std::string::npos);
}

TEST_MAIN()
