// Tests of llmc/eval.h: reading HellaSwag-style files (each rejection with its message, blank
// lines, CRLF), the tokenization convention, skips and truncation, batch planning across ranks,
// scoring from per-position losses and the per-example report.
// Run from the repo root: build/test_eval [name filter]
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/gpt2_tokenizer.h"
#include "dev/test/testing.h"
#include "llmc/eval.h"

constexpr const char* TINY_PATH = "dev/test/fixtures/eval_tiny.jsonl";
constexpr int GPT2_VOCAB = 50257;

// ----------------------------------------------------------------------------
// helpers

static std::vector<int> encode(const std::string& text) {
    std::vector<uint32_t> ids;
    tokenizer_encode(&gpt2(), text.data(), text.size(), &ids);
    return std::vector<int>(ids.begin(), ids.end());
}

// One example as a JSON line (no newline).
static std::string example_line(const std::string& ctx, const std::vector<std::string>& endings, int label) {
    std::string line = "{\"ctx\": " + json_quote(ctx) + ", \"endings\": [";
    for (size_t i = 0; i < endings.size(); i++) { line += (i > 0 ? ", " : "") + json_quote(endings[i]); }
    return line + "], \"label\": " + std::to_string(label) + "}";
}

static const std::string GOOD_LINE = example_line("The cat sat", {"down.", "up.", "away.", "still."}, 0);

// What eval_load made of a file holding `bytes`, named `name` in its messages (its path ends so).
struct Loaded {
    bool ok;
    std::string error, path;
    EvalSet set;
};

static Loaded load_bytes(const std::string& bytes, int T = 64, int vocab_size = GPT2_VOCAB) {
    std::string dir = make_temp_dir("test_eval");
    Loaded loaded;
    loaded.path = dir + "/input.jsonl";
    write_file(loaded.path, bytes);
    loaded.ok = eval_load(loaded.path.c_str(), &gpt2(), vocab_size, T, &loaded.set, &loaded.error);
    remove_dir(dir);
    return loaded;
}

// True if a file of `bytes` is refused with "PATH<problem>"; prints what came instead.
static bool refused_with(const std::string& bytes, const std::string& problem, int T = 64, int vocab_size = GPT2_VOCAB) {
    Loaded loaded = load_bytes(bytes, T, vocab_size);
    std::string expected = loaded.path + problem;
    if (loaded.ok || loaded.error != expected) {
        fprintf(stderr, "  got %s \"%s\", expected \"%s\"\n", loaded.ok ? "success" : "error", loaded.error.c_str(), expected.c_str());
    }
    return !loaded.ok && loaded.error == expected;
}

// The second line of a file whose first line is good.
static bool second_line_refused_with(const std::string& line, const std::string& problem) {
    return refused_with(GOOD_LINE + "\n" + line + "\n", ":2: " + problem);
}

static EvalSet load_tiny(int T) {
    EvalSet set;
    std::string error;
    if (!eval_load(TINY_PATH, &gpt2(), GPT2_VOCAB, T, &set, &error)) { fprintf(stderr, "  %s\n", error.c_str()); }
    return set;
}

// The text of `count` tokens: " cat" is one GPT-2 token.
static std::string cats(int count) {
    std::string text;
    for (int i = 0; i < count; i++) { text += i == 0 ? "cat" : " cat"; }
    return text;
}

// Row i of an example as planned: the kept context, then the ending.
static std::vector<int> row_tokens(const EvalExample& ex, int i) {
    std::vector<int> row(ex.context.end() - ex.context_len[i], ex.context.end());
    row.insert(row.end(), ex.endings[i].begin(), ex.endings[i].end());
    return row;
}

// ----------------------------------------------------------------------------
// loading

TEST(tiny_fixture_loads_with_the_tokenization_convention) {
    EvalSet set = load_tiny(128);
    CHECK(set.examples.size() == 30);
    CHECK(set.skipped_empty == 0 && set.skipped_long == 0 && set.truncated == 0);
    CHECK(set.path == TINY_PATH && set.T == 128);
    std::string text = read_file(TINY_PATH);
    int labels[4] = {};
    size_t line_start = 0;
    for (size_t e = 0; e < set.examples.size() && line_start < text.size(); e++) {
        size_t line_end = text.find('\n', line_start);
        JsonValue v;
        CHECK(json_parse(text.data() + line_start, line_end - line_start, &v, nullptr, 0));
        const EvalExample& ex = set.examples[e];
        CHECK(ex.line == (int)e + 1 && v.find("ind")->integer == (int64_t)e);
        CHECK(ex.label == (int)v.find("label")->integer);
        CHECK(ex.context == encode(v.find("ctx")->string));
        for (int i = 0; i < 4; i++) {
            CHECK(ex.endings[i] == encode(" " + v.find("endings")->items[i].string));
            CHECK(ex.context_len[i] == (int)ex.context.size());
            CHECK(eval_row_length(ex, i) <= 100);
        }
        labels[ex.label]++;
        line_start = line_end + 1;
    }
    CHECK(labels[0] >= 5 && labels[1] >= 5 && labels[2] >= 5 && labels[3] >= 5);
    CHECK(set.examples[0].endings[0][0] == encode(" When")[0]);  // the space goes before the ending
    CHECK(load_tiny(64).truncated == 0 && load_tiny(48).truncated == 0 && load_tiny(47).truncated > 0);  // as the README says
}

TEST(blank_lines_crlf_and_no_final_newline) {
    std::string second = example_line("A dog ran", {"far.", "fast.", "home.", "away."}, 3);
    Loaded loaded = load_bytes("\n  \t\r\n" + GOOD_LINE + "\r\n\r\n" + second);
    CHECK(loaded.ok);
    CHECK(loaded.set.examples.size() == 2);
    if (loaded.set.examples.size() != 2) { return; }
    const EvalExample& a = loaded.set.examples[0];
    const EvalExample& b = loaded.set.examples[1];
    CHECK(a.line == 3 && a.label == 0 && a.context == encode("The cat sat") && a.endings[0] == encode(" down."));
    CHECK(b.line == 5 && b.label == 3 && b.context == encode("A dog ran") && b.endings[3] == encode(" away."));
}

TEST(other_members_ignored_and_escapes_resolved) {
    Loaded loaded = load_bytes("{\"ind\": 7, \"label\": 2, \"extra\": [{}], \"ctx\": \"caf\\u00e9 \\\"x\\\"\", "
                               "\"endings\": [\"a\", \"b\", \"c\", \"d\"]}\n");
    CHECK(loaded.ok && loaded.set.examples.size() == 1);
    CHECK(loaded.ok && loaded.set.examples[0].context == encode("caf\xC3\xA9 \"x\"") && loaded.set.examples[0].label == 2);
}

TEST(rejects_bad_json_with_line_and_byte) {
    CHECK(second_line_refused_with("{\"ctx\": \"a\",", "not valid JSON (expected a string at byte 13)"));
    CHECK(second_line_refused_with("{\"ctx\": \"a\"} x", "not valid JSON (unexpected text after the value at byte 13)"));
    CHECK(second_line_refused_with("{'ctx': 1}", "not valid JSON (expected a string at byte 1)"));
    CHECK(second_line_refused_with(std::string("{\"ctx\": \"a\0\"}", 13), "not valid JSON (control character in string at byte 10)"));
    CHECK(refused_with("\xEF\xBB\xBF" + GOOD_LINE + "\n", ":1: not valid JSON (expected a value at byte 0)"));  // a byte order mark
}

TEST(rejects_bad_members_naming_them) {
    CHECK(second_line_refused_with("[1, 2]", "not a JSON object"));
    CHECK(second_line_refused_with("\"text\"", "not a JSON object"));
    CHECK(second_line_refused_with("{\"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}", "\"ctx\" is missing"));
    CHECK(second_line_refused_with("{\"ctx\": 5, \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}", "\"ctx\" is not a string"));
    CHECK(second_line_refused_with("{\"ctx\": \"a\", \"label\": 0}", "\"endings\" is missing"));
    CHECK(second_line_refused_with("{\"ctx\": \"a\", \"endings\": \"abcd\", \"label\": 0}", "\"endings\" is not an array of 4 strings"));
    CHECK(second_line_refused_with(example_line("a", {"b", "c", "d"}, 0), "\"endings\" is not an array of 4 strings"));
    CHECK(second_line_refused_with(example_line("a", {"b", "c", "d", "e", "f"}, 0), "\"endings\" is not an array of 4 strings"));
    CHECK(second_line_refused_with("{\"ctx\": \"a\", \"endings\": [\"a\", \"b\", null, \"d\"], \"label\": 0}",
                                   "\"endings\" is not an array of 4 strings"));
    CHECK(second_line_refused_with("{\"ctx\": \"a\", \"endings\": [\"a\", \"b\", \"c\", \"d\"]}", "\"label\" is missing"));
    CHECK(second_line_refused_with("{\"ctx\": \"a\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": \"1\"}", "\"label\" is not an integer"));
    CHECK(second_line_refused_with("{\"ctx\": \"a\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 1.0}", "\"label\" is not an integer"));
    CHECK(second_line_refused_with(example_line("a", {"b", "c", "d", "e"}, 4), "\"label\" is 4, not 0..3"));
    CHECK(second_line_refused_with(example_line("a", {"b", "c", "d", "e"}, -1), "\"label\" is -1, not 0..3"));
}

TEST(rejects_unreadable_and_empty_files) {
    std::string error;
    EvalSet set;
    CHECK(!eval_load("/nonexistent/eval.jsonl", &gpt2(), GPT2_VOCAB, 64, &set, &error));
    CHECK(error == "/nonexistent/eval.jsonl: cannot open (No such file or directory)");
    std::string dir = make_temp_dir("test_eval");
    CHECK(!eval_load(dir.c_str(), &gpt2(), GPT2_VOCAB, 64, &set, &error));
    CHECK(error == dir + ": cannot read (Is a directory)");
    remove_dir(dir);
    CHECK(refused_with("", ": no examples"));
    CHECK(refused_with("\n \r\n\t\n", ": no examples"));
    CHECK(refused_with(example_line("", {"a", "b", "c", "d"}, 0) + "\n" + example_line("x", {cats(8), "b", "c", "d"}, 0),
                       ": no examples left (1 with an empty context, 1 with an ending too long for T = 8)", 8));
}

TEST(token_ids_at_or_above_the_vocabulary_refused) {
    int hello = encode(" hello")[0];
    CHECK(encode(" hello").size() == 1 && hello >= 1000);
    std::string line = example_line("a b", {"c", "hello", "d", "e"}, 1);
    CHECK(refused_with(line, ":1: token " + std::to_string(hello) + " is outside the model's vocabulary (V = " +
                                 std::to_string(hello) + ")", 64, hello));
    CHECK(load_bytes(line, 64, hello + 1).ok);
    CHECK(load_bytes(example_line("a b", {"c", "d", "e", "f"}, 1), 64, 1000).ok);  // small ids fit V = 1000
    std::vector<int> ids = encode("The cat sat");
    int first_large = *std::find_if(ids.begin(), ids.end(), [](int id) { return id >= 1000; });
    CHECK(ids[0] < 1000 && first_large != ids[0]);  // the first id past V is named
    CHECK(refused_with(GOOD_LINE, ":1: token " + std::to_string(first_large) + " is outside the model's vocabulary (V = 1000)", 64, 1000));
}

TEST(skips_and_truncation_to_T) {
    const int T = 8;
    std::string ctx = "one two three four five six seven eight nine ten";
    std::vector<int> ctx_ids = encode(ctx);
    CHECK(ctx_ids.size() == 10 && encode(" " + cats(3)).size() == 3);
    std::string file = example_line("", {"a", "b", "c", "d"}, 0) + "\n" +             // empty context: skipped
                       example_line(ctx, {"a", cats(8), "c", "d"}, 1) + "\n" +         // 8-token ending: skipped
                       example_line(ctx, {"a", cats(2), cats(3), cats(4)}, 2) + "\n" +  // every row cut
                       example_line("one two", {"a", "b", "c", "d"}, 3) + "\n" +        // fits
                       example_line("one two three", {"a", "b", "c", cats(6)}, 0) + "\n" +  // one row cut
                       example_line("one", {"a", "b", "c", cats(7)}, 1) + "\n";          // the longest ending that fits
    Loaded loaded = load_bytes(file, T);
    const EvalSet& set = loaded.set;
    CHECK(loaded.ok && set.examples.size() == 4);
    CHECK(set.skipped_empty == 1 && set.skipped_long == 1 && set.truncated == 2);
    CHECK(eval_skip_reasons(set) == "1 with an empty context, 1 with an ending too long for T = 8");
    if (set.examples.size() != 4) { return; }
    const EvalExample& cut = set.examples[0];
    CHECK(cut.line == 3 && cut.context == std::vector<int>(ctx_ids.end() - 7, ctx_ids.end()));
    CHECK(cut.context_len[0] == 7 && cut.context_len[1] == 6 && cut.context_len[2] == 5 && cut.context_len[3] == 4);
    for (int i = 0; i < 4; i++) {
        std::vector<int> expected(ctx_ids.end() - cut.context_len[i], ctx_ids.end());
        std::vector<int> row = row_tokens(cut, i);
        CHECK(std::vector<int>(row.begin(), row.begin() + cut.context_len[i]) == expected && (int)row.size() == T);
    }
    const EvalExample& fits = set.examples[1];
    CHECK(fits.line == 4 && fits.context == encode("one two") && fits.context_len[3] == 2);
    const EvalExample& one_cut = set.examples[2];
    CHECK(one_cut.context == encode("one two three"));
    CHECK(one_cut.context_len[0] == 3 && one_cut.context_len[2] == 3 && one_cut.context_len[3] == 2);
    const EvalExample& tight = set.examples[3];
    CHECK(tight.line == 6 && tight.context_len[3] == 1 && eval_row_length(tight, 3) == T);
    CHECK(eval_skip_reasons(load_bytes(GOOD_LINE).set) == "");
}

// ----------------------------------------------------------------------------
// batches

// The (example, ending) pairs of every used row, in batch order.
static std::vector<std::pair<int, int>> rows_of(const std::vector<EvalBatch>& batches) {
    std::vector<std::pair<int, int>> rows;
    for (const EvalBatch& b : batches) {
        for (const EvalRow& r : b.used) { rows.emplace_back(r.example, r.ending); }
    }
    return rows;
}

// Every invariant of one batch of `set` planned for max_tokens.
static bool batch_holds_together(const EvalSet& set, const EvalBatch& b, size_t max_tokens) {
    bool ok = b.rows > 0 && b.rows % 4 == 0 && (int)b.used.size() == b.rows && (size_t)b.rows * b.T <= max_tokens;
    ok = ok && (b.T % 8 == 0 || b.T == set.T) && b.T <= set.T;
    ok = ok && b.inputs.size() == (size_t)b.rows * b.T && b.targets.size() == b.inputs.size();
    int longest = 0;
    for (int r = 0; ok && r < b.rows; r++) {
        const EvalRow& row = b.used[r];
        ok = row.example == b.used[r - r % 4].example && row.ending == r % 4;  // an example's rows together, in order
        const EvalExample& ex = set.examples[row.example];
        std::vector<int> tokens = row_tokens(ex, row.ending);
        std::vector<int> input(b.inputs.begin() + (size_t)r * b.T, b.inputs.begin() + (size_t)(r + 1) * b.T);
        std::vector<int> target(b.targets.begin() + (size_t)r * b.T, b.targets.begin() + (size_t)(r + 1) * b.T);
        std::vector<int> padded_input = tokens, padded_target(tokens.begin() + 1, tokens.end());
        padded_input.resize(b.T, 0);
        padded_target.resize(b.T, 0);
        ok = ok && input == padded_input && target == padded_target;
        ok = ok && row.first == ex.context_len[row.ending] - 1 && row.count == (int)ex.endings[row.ending].size();
        ok = ok && std::vector<int>(target.begin() + row.first, target.begin() + row.first + row.count) == ex.endings[row.ending];
        longest = std::max(longest, (int)tokens.size());
    }
    return ok && b.T == std::min((longest + 7) / 8 * 8, set.T);  // no more padding than needed
}

static void check_plans(const EvalSet& set) {
    for (size_t max_tokens : {4 * (size_t)set.T, 4 * (size_t)set.T + 7, 10 * (size_t)set.T, 64 * (size_t)set.T}) {
        std::string error;
        std::vector<EvalBatch> all;
        CHECK(eval_plan(set, max_tokens, 0, 1, &all, &error));
        for (size_t k = 0; k < all.size(); k++) {
            CHECK(batch_holds_together(set, all[k], max_tokens));
            if (k + 1 < all.size()) {  // sorted by longest row, each batch too full for the next example
                const EvalExample& next = set.examples[all[k + 1].used[0].example];
                int next_T = eval_batch_T(eval_longest_row(next), set.T);
                CHECK(all[k].T <= next_T && (size_t)(all[k].rows + 4) * next_T > max_tokens);
            }
        }
        std::vector<std::pair<int, int>> rows = rows_of(all);
        for (size_t r = 4; r < rows.size(); r += 4) {  // ties keep file order
            const EvalExample& a = set.examples[rows[r - 4].first];
            const EvalExample& b = set.examples[rows[r].first];
            CHECK(eval_longest_row(a) < eval_longest_row(b) || (eval_longest_row(a) == eval_longest_row(b) && a.line < b.line));
        }
        std::set<std::pair<int, int>> unique(rows.begin(), rows.end());
        CHECK(rows.size() == 4 * set.examples.size() && unique.size() == rows.size());
        for (int world : {2, 3}) {
            for (int rank = 0; rank < world; rank++) {
                std::vector<EvalBatch> mine, expected;
                CHECK(eval_plan(set, max_tokens, rank, world, &mine, &error));
                for (size_t k = rank; k < all.size(); k += world) { expected.push_back(all[k]); }
                CHECK(rows_of(mine) == rows_of(expected));
                for (size_t k = 0; k < mine.size() && k < expected.size(); k++) {
                    CHECK(mine[k].inputs == expected[k].inputs && mine[k].targets == expected[k].targets);
                }
            }
        }
    }
}

TEST(plans_hold_together_for_every_rank) {
    check_plans(load_tiny(128));
    EvalSet cut = load_tiny(20);  // many rows cut
    CHECK(cut.truncated > 10 && cut.examples.size() + cut.skipped_long == 30);
    check_plans(cut);
    check_plans(load_tiny(13));  // T not a multiple of 8
}

TEST(plan_sorts_stably_by_longest_row) {
    std::string file = example_line(cats(20), {"a", "b", "c", "d"}, 0) + "\n" +  // longest row 21
                       example_line(cats(3), {"a", "b", "c", "d"}, 0) + "\n" +   // 4
                       example_line(cats(2), {"a", "b", cats(2), "d"}, 0) + "\n" +  // 4
                       example_line(cats(9), {"a", "b", "c", "d"}, 0) + "\n";    // 10
    Loaded loaded = load_bytes(file, 32);
    std::vector<EvalBatch> batches;
    std::string error;
    CHECK(loaded.ok && eval_plan(loaded.set, 4 * 32, 0, 1, &batches, &error));
    CHECK(batches.size() == 3);
    if (batches.size() != 3) { return; }
    CHECK(batches[0].rows == 8 && batches[0].T == 8 && batches[0].used[0].example == 1 && batches[0].used[4].example == 2);
    CHECK(batches[1].rows == 4 && batches[1].T == 16 && batches[1].used[0].example == 3);
    CHECK(batches[2].rows == 4 && batches[2].T == 24 && batches[2].used[0].example == 0);
}

TEST(plan_needs_room_for_4_rows_of_T) {
    EvalSet set = load_tiny(128);
    std::vector<EvalBatch> batches(1);
    std::string error;
    CHECK(!eval_plan(set, 4 * 128 - 1, 0, 1, &batches, &error) && batches.empty());
    CHECK(error == "--eval needs room for 4 rows of T tokens per forward pass (B >= 4)");
    CHECK(eval_plan(set, 4 * 128, 0, 1, &batches, &error) && !batches.empty());
    std::vector<EvalBatch> none;
    CHECK(eval_plan(set, 1 << 20, 1, 2, &none, &error) && none.empty());  // one batch, taken by rank 0
}

// ----------------------------------------------------------------------------
// scoring

TEST(score_averages_the_ending_positions_only) {
    EvalBatch b;
    b.rows = 1;
    b.T = 8;
    b.used.push_back(EvalRow{1, 2, 2, 3});
    float losses[8] = {99, 99, 1, 2, 6, 99, 99, 99};
    std::vector<EvalLosses> means(2, EvalLosses{});
    eval_score_batch(b, losses, &means);
    CHECK(means[1][2] == 3.0);
    CHECK(means[0] == EvalLosses({0, 0, 0, 0}) && means[1][0] == 0 && means[1][1] == 0 && means[1][3] == 0);
}

TEST(score_sums_in_double) {
    EvalBatch b;
    b.rows = 1;
    b.T = 4;
    b.used.push_back(EvalRow{0, 0, 0, 4});
    float losses[4] = {1e8f, 1.0f, 1.0f, 1.0f};  // in float, 1e8 + 1 would stay 1e8
    std::vector<EvalLosses> means(1, EvalLosses{});
    eval_score_batch(b, losses, &means);
    CHECK(means[0][0] == 25000000.75);
}

TEST(choice_is_the_lowest_mean_lowest_index_on_ties) {
    EvalSet set;
    set.examples.resize(5);
    int labels[5] = {0, 1, 1, 3, 2};
    for (int e = 0; e < 5; e++) { set.examples[e].label = labels[e]; }
    std::vector<EvalLosses> means = {{1, 1, 2, 3}, {2, 1, 1, 3}, {3, 2, 2, 2}, {4, 3, 2, 1}, {0.5, 2, 0.25, 0.2}};
    EvalResult result = eval_result(set, means);
    CHECK(result.choices == std::vector<int>({0, 1, 1, 3, 3}));
    CHECK(result.correct == 4 && result.evaluated == 5 && result.accuracy() == 0.8);
    CHECK(EvalResult().accuracy() == 0.0);
}

// Whole pipeline: losses that favour the label on examples with an even index, ending 0 otherwise.
TEST(ranks_scores_sum_to_the_whole_set) {
    EvalSet set = load_tiny(128);
    std::vector<EvalLosses> means(set.examples.size(), EvalLosses{});
    const int world = 3;
    for (int rank = 0; rank < world; rank++) {
        std::vector<EvalBatch> batches;
        std::string error;
        CHECK(eval_plan(set, 16 * 128, rank, world, &batches, &error));
        std::vector<EvalLosses> mine(set.examples.size(), EvalLosses{});
        for (const EvalBatch& b : batches) {
            std::vector<float> losses((size_t)b.rows * b.T, 1e6f);  // garbage wherever no ending is scored
            for (size_t r = 0; r < b.used.size(); r++) {
                const EvalRow& row = b.used[r];
                int favoured = row.example % 2 == 0 ? set.examples[row.example].label : 0;
                for (int k = 0; k < row.count; k++) { losses[r * b.T + row.first + k] = row.ending == favoured ? 1.5f : 2.5f; }
            }
            eval_score_batch(b, losses.data(), &mine);
        }
        for (size_t e = 0; e < means.size(); e++) {
            for (int i = 0; i < 4; i++) { means[e][i] += mine[e][i]; }
        }
    }
    EvalResult result = eval_result(set, means);
    int expected = 0;
    for (size_t e = 0; e < set.examples.size(); e++) {
        int favoured = e % 2 == 0 ? set.examples[e].label : 0;
        CHECK(result.choices[e] == favoured && means[e][favoured] == 1.5);
        expected += favoured == set.examples[e].label;
    }
    CHECK(result.correct == expected && result.evaluated == 30 && expected > 15 && expected < 30);
}

TEST(report_lines_in_file_order) {
    Loaded loaded = load_bytes("\n" + GOOD_LINE + "\n" + example_line("A dog ran", {"a", "b", "c", "d"}, 2) + "\n");
    std::vector<EvalLosses> means = {{0.1, 2.5, 1.0 / 3.0, 4}, {1e-12, 7, 7, 123456789.5}};
    EvalResult result = eval_result(loaded.set, means);
    std::string expected =
        "# line label choice loss0 loss1 loss2 loss3\n"
        "2 0 0 0.1 2.5 0.333333333 4\n"
        "3 2 0 1e-12 7 7 123456790\n";
    CHECK(eval_report(loaded.set, means, result) == expected);
    std::string dir = make_temp_dir("test_eval");
    std::string path = dir + "/report.txt";
    write_file(path, "old");
    eval_write_report(path.c_str(), loaded.set, means, result);
    CHECK(read_file(path) == expected);
    CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
    remove_dir(dir);
}

TEST_MAIN()
