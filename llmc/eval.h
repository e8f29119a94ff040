// HellaSwag-style multiple-choice evaluation, host side: reading the examples, packing them
// into forward passes and scoring them from the per-position losses the model computes.
//
// File: JSON Lines, one example per line: {"ctx": "...", "endings": [4 strings], "label": 0..3}
// (other members ignored). Lines of only whitespace are skipped; CRLF line ends and a last
// line without a newline are accepted. Nothing here exits: a defect returns false with the
// one-line message "PATH:LINE: problem".
//
// Convention (train_gpt2.py replicates it): context = tokenizer_encode(ctx), ending i =
// tokenizer_encode(" " + endings[i]), every id below the model's vocabulary size. Row i is
// context + ending i; a row longer than T keeps only the last T - len(ending i) context
// tokens. An example whose context has no tokens, or with an ending of T tokens or more (no
// room for context), is skipped and counted. An ending's score is the mean cross-entropy of
// its tokens given what precedes them in its row; the lowest mean wins, the lowest index on ties.
//
// Batches: examples sorted by their longest row (stable), 4 rows each, packed whole into
// forward passes of rows x T tokens with rows * T <= max_tokens and T the longest row rounded
// up to a multiple of 8 (at most the run's T). A row's tokens sit at positions 0..len-1 of
// inputs, and targets[p] = token p + 1; so an ending of n tokens after c context tokens is
// scored by the losses at positions [c - 1, c - 1 + n). Every other target, and every input
// past a row's end, is 0, its loss ignored. Of W ranks, rank r takes batches r, r + W, ...
#pragma once

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "llmc/json.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

constexpr int EVAL_ENDINGS = 4;
constexpr int EVAL_ALIGN = 8;  // a batch's T is a multiple of this, or the run's T

struct EvalExample {
    int line = 0;                             // 1-based line number in the file
    int label = 0;                            // the right ending
    std::vector<int> context;                 // the context's last tokens, as many as the longest row keeps
    std::vector<int> endings[EVAL_ENDINGS];   // the tokens of " " + ending i
    int context_len[EVAL_ENDINGS] = {};       // row i: the last context_len[i] tokens of context, then ending i
};

struct EvalSet {
    std::string path;
    int T = 0;                         // the longest a row may be
    std::vector<EvalExample> examples;  // in file order
    int skipped_empty = 0;             // contexts with no tokens
    int skipped_long = 0;              // an ending of T tokens or more
    int truncated = 0;                 // examples with a row whose context was cut
};

// The ending a row scores: losses[row * T + first, + count) of its batch.
struct EvalRow {
    int example, ending, first, count;
};

// One forward pass: inputs and targets are rows x T, row-major; used[r] describes row r.
struct EvalBatch {
    int rows = 0, T = 0;
    std::vector<int> inputs, targets;
    std::vector<EvalRow> used;
};

using EvalLosses = std::array<double, EVAL_ENDINGS>;  // an example's mean loss per ending

struct EvalResult {
    int correct = 0, evaluated = 0;
    std::vector<int> choices;  // per example: the ending with the lowest mean loss
    double accuracy() const { return evaluated > 0 ? (double)correct / evaluated : 0.0; }
};

// ----------------------------------------------------------------------------
// Loading

static inline bool eval_is_blank(const char* text, size_t size) {
    return std::all_of(text, text + size, [](char b) { return is_json_space((uint8_t)b); });
}

// The whole line as one JSON value.
static inline bool eval_parse_json(const char* text, size_t size, const char* where, JsonValue* value, std::string* error) {
    JsonCursor c = json_cursor(text, size);
    bool ok = json_value(&c, value, 0) && (json_peek(&c) == -1 || json_error(&c, "unexpected text after the value"));
    return ok || set_problem(error, "%s: not valid JSON (%s at byte %zu)", where, c.problem, c.error_pos);
}

// "WHERE: "key" is missing" or "WHERE: "key" is not <what>"; false.
static inline bool eval_bad_member(const char* where, const char* key, const JsonValue* value, const char* what, std::string* error) {
    if (value == nullptr) { return set_problem(error, "%s: \"%s\" is missing", where, key); }
    return set_problem(error, "%s: \"%s\" is not %s", where, key, what);
}

// An object with "ctx" a string, "endings" 4 strings and "label" an integer in 0..3.
static inline bool eval_check_members(const JsonValue& v, const char* where, std::string* error) {
    if (v.type != JSON_OBJECT) { return set_problem(error, "%s: not a JSON object", where); }
    const JsonValue* ctx = v.find("ctx");
    if (ctx == nullptr || ctx->type != JSON_STRING) { return eval_bad_member(where, "ctx", ctx, "a string", error); }
    const JsonValue* endings = v.find("endings");
    bool four_strings = endings != nullptr && endings->type == JSON_ARRAY && endings->items.size() == EVAL_ENDINGS &&
                        std::all_of(endings->items.begin(), endings->items.end(),
                                    [](const JsonValue& e) { return e.type == JSON_STRING; });
    if (!four_strings) { return eval_bad_member(where, "endings", endings, "an array of 4 strings", error); }
    const JsonValue* label = v.find("label");
    if (label == nullptr || label->type != JSON_NUMBER || !label->is_integer) {
        return eval_bad_member(where, "label", label, "an integer", error);
    }
    if (label->integer < 0 || label->integer >= EVAL_ENDINGS) {
        return set_problem(error, "%s: \"label\" is %lld, not 0..3", where, (long long)label->integer);
    }
    return true;
}

// The ids of `text`, each checked to be below vocab_size.
static inline bool eval_encode(const Tokenizer* tok, const std::string& text, int vocab_size, const char* where,
                               std::vector<int>* ids, std::string* error) {
    std::vector<uint32_t> raw;
    tokenizer_encode(tok, text.data(), text.size(), &raw);
    for (uint32_t id : raw) {
        if ((int64_t)id >= vocab_size) {
            return set_problem(error, "%s: token %u is outside the model's vocabulary (V = %d)", where, id, vocab_size);
        }
    }
    ids->assign(raw.begin(), raw.end());
    return true;
}

static inline int eval_row_length(const EvalExample& ex, int ending) {
    return ex.context_len[ending] + (int)ex.endings[ending].size();
}

// Cuts the example's rows to T (see the top) and keeps it, or counts it as skipped.
static inline void eval_keep(EvalSet* set, EvalExample* ex) {
    if (ex->context.empty()) {
        set->skipped_empty++;
        return;
    }
    int64_t context_size = (int64_t)ex->context.size(), longest_kept = 0, shortest_kept = context_size;
    for (int i = 0; i < EVAL_ENDINGS; i++) {
        int64_t room = (int64_t)set->T - (int64_t)ex->endings[i].size();
        if (room < 1) {
            set->skipped_long++;
            return;
        }
        ex->context_len[i] = (int)std::min(context_size, room);
        longest_kept = std::max(longest_kept, (int64_t)ex->context_len[i]);
        shortest_kept = std::min(shortest_kept, (int64_t)ex->context_len[i]);
    }
    if (shortest_kept < context_size) { set->truncated++; }
    ex->context.erase(ex->context.begin(), ex->context.end() - longest_kept);
    set->examples.push_back(std::move(*ex));
}

// Reads the example on line `line` (not blank) into the set.
static inline bool eval_read_line(EvalSet* set, const char* text, size_t size, int line, const Tokenizer* tok,
                                  int vocab_size, std::string* error) {
    std::string where = set->path + ":" + std::to_string(line);
    JsonValue value;
    if (!eval_parse_json(text, size, where.c_str(), &value, error) || !eval_check_members(value, where.c_str(), error)) {
        return false;
    }
    EvalExample ex;
    ex.line = line;
    ex.label = (int)value.find("label")->integer;
    if (!eval_encode(tok, value.find("ctx")->string, vocab_size, where.c_str(), &ex.context, error)) { return false; }
    const std::vector<JsonValue>& endings = value.find("endings")->items;
    for (int i = 0; i < EVAL_ENDINGS; i++) {
        if (!eval_encode(tok, " " + endings[i].string, vocab_size, where.c_str(), &ex.endings[i], error)) { return false; }
    }
    eval_keep(set, &ex);
    return true;
}

// "N with an empty context, M with an ending too long for T = 8" (the counts that are not 0).
static inline std::string eval_skip_reasons(const EvalSet& set) {
    std::string reasons;
    if (set.skipped_empty > 0) { reasons = std::to_string(set.skipped_empty) + " with an empty context"; }
    if (set.skipped_long > 0) {
        reasons += (reasons.empty() ? "" : ", ") + std::to_string(set.skipped_long) +
                   " with an ending too long for T = " + std::to_string(set.T);
    }
    return reasons;
}

// Reads, tokenizes, checks and cuts to T every example of the file at `path` into *set.
static inline bool eval_load(const char* path, const Tokenizer* tok, int vocab_size, int T, EvalSet* set,
                             std::string* error) {
    *set = EvalSet();
    set->path = path;
    set->T = T;
    FILE* f = fopen(path, "rb");
    if (f == nullptr) { return set_problem(error, "%s: cannot open (%s)", path, strerror(errno)); }
    char* text = nullptr;
    size_t capacity = 0;
    ssize_t size;
    bool ok = true;
    for (int line = 1; ok && (size = getline(&text, &capacity, f)) >= 0; line++) {
        if (!eval_is_blank(text, (size_t)size)) { ok = eval_read_line(set, text, (size_t)size, line, tok, vocab_size, error); }
    }
    int read_error = ferror(f) ? errno : 0;
    free(text);
    fclose(f);
    if (!ok) { return false; }
    if (read_error != 0) { return set_problem(error, "%s: cannot read (%s)", path, strerror(read_error)); }
    if (!set->examples.empty()) { return true; }
    if (set->skipped_empty + set->skipped_long == 0) { return set_problem(error, "%s: no examples", path); }
    return set_problem(error, "%s: no examples left (%s)", path, eval_skip_reasons(*set).c_str());
}

// ----------------------------------------------------------------------------
// Batches

static inline int eval_longest_row(const EvalExample& ex) {
    int longest = 0;
    for (int i = 0; i < EVAL_ENDINGS; i++) { longest = std::max(longest, eval_row_length(ex, i)); }
    return longest;
}

// A forward pass's T for rows of up to `longest` tokens.
static inline int eval_batch_T(int longest, int T) {
    return std::min((longest + EVAL_ALIGN - 1) / EVAL_ALIGN * EVAL_ALIGN, T);
}

// Writes example e's rows into b from row `row` on (inputs and targets zero there).
static inline void eval_fill_rows(const EvalSet& set, int e, int row, EvalBatch* b) {
    const EvalExample& ex = set.examples[e];
    for (int i = 0; i < EVAL_ENDINGS; i++, row++) {
        int c = ex.context_len[i], length = eval_row_length(ex, i);
        int* input = &b->inputs[(size_t)row * b->T];
        std::copy(ex.context.end() - c, ex.context.end(), input);
        std::copy(ex.endings[i].begin(), ex.endings[i].end(), input + c);
        std::copy(input + 1, input + length, &b->targets[(size_t)row * b->T]);
        b->used.push_back(EvalRow{e, i, c - 1, (int)ex.endings[i].size()});
    }
}

// The batch of examples order[start, end), the last one holding the longest row.
static inline EvalBatch eval_make_batch(const EvalSet& set, const std::vector<int>& order, size_t start, size_t end) {
    EvalBatch b;
    b.rows = (int)(end - start) * EVAL_ENDINGS;
    b.T = eval_batch_T(eval_longest_row(set.examples[order[end - 1]]), set.T);
    b.inputs.assign((size_t)b.rows * b.T, 0);
    b.targets.assign((size_t)b.rows * b.T, 0);
    for (size_t k = start; k < end; k++) { eval_fill_rows(set, order[k], (int)(k - start) * EVAL_ENDINGS, &b); }
    return b;
}

// Packs the set into forward passes of at most max_tokens tokens and keeps this rank's share
// (0 <= rank < world): every example lands in exactly one batch of one rank.
static inline bool eval_plan(const EvalSet& set, size_t max_tokens, int rank, int world, std::vector<EvalBatch>* batches,
                             std::string* error) {
    batches->clear();
    if (max_tokens < (size_t)EVAL_ENDINGS * set.T) {
        return set_problem(error, "--eval needs room for 4 rows of T tokens per forward pass (B >= 4)");
    }
    std::vector<int> longest(set.examples.size()), order(set.examples.size());
    for (size_t e = 0; e < set.examples.size(); e++) { longest[e] = eval_longest_row(set.examples[e]); }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return longest[a] < longest[b]; });
    size_t index = 0;  // of the batch across all ranks
    for (size_t start = 0, end; start < order.size(); start = end, index++) {
        end = start + 1;  // grow while the rows still fit at the newest (longest) example's T
        while (end < order.size() &&
               (end - start + 1) * EVAL_ENDINGS * eval_batch_T(longest[order[end]], set.T) <= max_tokens) {
            end++;
        }
        if (index % (size_t)world == (size_t)rank) { batches->push_back(eval_make_batch(set, order, start, end)); }
    }
    return true;
}

// ----------------------------------------------------------------------------
// Scoring

// Stores each used row's mean loss over its ending's positions (summed in order, in double)
// in (*mean_losses)[example][ending]. losses: rows x T floats; mean_losses: one per example,
// zero-filled, so that a sum over ranks gives every example's.
static inline void eval_score_batch(const EvalBatch& b, const float* losses, std::vector<EvalLosses>* mean_losses) {
    for (size_t r = 0; r < b.used.size(); r++) {
        const EvalRow& row = b.used[r];
        const float* loss = losses + r * b.T + row.first;
        double sum = 0;
        for (int k = 0; k < row.count; k++) { sum += loss[k]; }
        (*mean_losses)[row.example][row.ending] = sum / row.count;
    }
}

// Each example's choice (the lowest mean loss, the lowest index on ties) against its label.
static inline EvalResult eval_result(const EvalSet& set, const std::vector<EvalLosses>& mean_losses) {
    EvalResult result;
    for (size_t e = 0; e < set.examples.size(); e++) {
        const EvalLosses& m = mean_losses[e];
        int choice = (int)(std::min_element(m.begin(), m.end()) - m.begin());
        result.choices.push_back(choice);
        result.correct += choice == set.examples[e].label;
        result.evaluated++;
    }
    return result;
}

// One line per example in file order, "LINE LABEL CHOICE L0 L1 L2 L3", after a '#' header.
static inline std::string eval_report(const EvalSet& set, const std::vector<EvalLosses>& mean_losses,
                                      const EvalResult& result) {
    std::string report = "# line label choice loss0 loss1 loss2 loss3\n";
    for (size_t e = 0; e < set.examples.size(); e++) {
        const EvalLosses& m = mean_losses[e];
        char line[256];
        snprintf(line, sizeof(line), "%d %d %d %.9g %.9g %.9g %.9g\n", set.examples[e].line, set.examples[e].label,
                 result.choices[e], m[0], m[1], m[2], m[3]);
        report += line;
    }
    return report;
}

// Writes eval_report() to `path` atomically; fails (exits) if it cannot.
static inline void eval_write_report(const char* path, const EvalSet& set, const std::vector<EvalLosses>& mean_losses,
                                     const EvalResult& result) {
    std::string report = eval_report(set, mean_losses, result);
    AtomicFile file;
    open_atomic(&file, path);
    atomic_write_or_fail(&file, report.data(), 1, report.size());
    commit_atomic(&file);
}
