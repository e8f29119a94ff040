// Logic of the data preparation tool (main() is in prepare_data.cpp; the tests call these
// functions directly): GPT-2 token ids of a file and back, the tiny Shakespeare shards,
// and shards of any .txt/.jsonl corpus.
//
// Documents are encoded in parallel and written in document order, so the output does
// not depend on the thread count. Every document is preceded by the end-of-text token.
// Shards use the dataloader's format (llmc/dataloader.h) and are written atomically;
// an existing output is only replaced with `force`. Inputs too small for a training shard
// are refused before anything is written. Bytes that are not UTF-8 are encoded as they are
// (byte-level BPE encodes any byte) after a one-line warning per file.
#pragma once

#include <ctype.h>
#include <stdint.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/json.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

struct PrepareOptions {
    int threads = 1;                  // encoding threads
    bool force = false;               // replace existing outputs
    bool verbose = true;              // progress line on stderr, written files on stdout
    int64_t shard_size = 100000000;   // tokens per shard (shards mode)
    std::string out_prefix;           // shards mode: OUT_PREFIX_val_000000.bin, OUT_PREFIX_train_000001.bin, ...;
                                      // tinyshakespeare mode (prepare_data.cpp): the output directory
    std::vector<std::string> inputs;  // shards mode: directories, .txt and .jsonl files
};

// Tokens in the tiny Shakespeare validation shard; the rest go to the training shard.
constexpr size_t TINYSHAKESPEARE_VAL_TOKENS = 32768;

// ---------------------------------------------------------------------------------
// Small helpers.

// Reads to the end, so that pipes (whose size is 0) work too: encode <(echo hello).
static inline std::string read_whole_file(const char* path) {
    FILE* f = fopen_or_fail(path, "rb");
    int64_t bytes = file_size(path);
    std::string text(bytes > 0 ? (size_t)bytes : 0, '\0');
    text.resize(fread(&text[0], 1, text.size(), f));
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) { text.append(buf, n); }
    if (ferror(f)) { fail("%s: read failed: %s", path, strerror(errno)); }
    fclose(f);
    return text;
}

static inline bool has_suffix(const std::string& text, const char* suffix) {
    size_t n = strlen(suffix);
    return text.size() >= n && text.compare(text.size() - n, n, suffix) == 0;
}

static inline double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Whether a progress line without its newline is on the terminal (progress_print): a warning
// ends it first.
static bool g_progress_line_open = false;

// One line on stderr if the bytes of `path` are not all well-formed UTF-8: how many bytes are
// not, where the first is, and that they are encoded as they are. GPT-2's byte-level BPE has a
// token for every byte (llmc/tokenizer.h takes each such byte as a character of its own), so
// the ids decode back to the file's exact bytes.
static inline void warn_if_not_utf8(const std::string& path, const std::string& text) {
    size_t first = 0;
    size_t count = utf8_invalid_bytes((const uint8_t*)text.data(), text.size(), &first);
    if (count == 0) { return; }
    fprintf(stderr,
            "%swarning: %s: %zu byte%s not UTF-8 (the first at byte offset %zu); encoded as raw bytes, "
            "which decode back unchanged\n",
            g_progress_line_open ? "\n" : "", path.c_str(), count, count == 1 ? " is" : "s are", first);
    fflush(stderr);
    g_progress_line_open = false;
}

// ---------------------------------------------------------------------------------
// JSON Lines: the "text" string of one line's object (read with llmc/json.h).

// Extracts the "text" string of the JSON object on one line (the last one if repeated).
// On failure returns false with `error` describing the problem and its column.
static inline bool parse_jsonl_text(const char* line, size_t len, std::string* text, std::string* error) {
    JsonCursor c = json_cursor(line, len);
    bool found = false;
    auto member = [&](const std::string& key) {
        if (key != "text") { return json_value(&c, nullptr, 1); }
        if (json_peek(&c) != '"') { return json_error(&c, "the \"text\" field is not a string"); }
        found = true;
        return json_string(&c, text);
    };
    bool ok = json_peek(&c) == '{' ? json_object(&c, 0, member) : json_error(&c, "expected an object");
    if (ok && json_peek(&c) != -1) { ok = json_error(&c, "unexpected characters after the object"); }
    if (ok && !found) { ok = json_error(&c, "the object has no \"text\" field"); }
    if (!ok) {
        char where[64];
        snprintf(where, sizeof(where), " (column %zu)", c.error_pos + 1);
        *error = std::string(c.problem) + where;
    }
    return ok;
}

// ---------------------------------------------------------------------------------
// Inputs: documents from .txt files (one each) and .jsonl files (one per line).

// A directory's .txt and .jsonl files, recursively, sorted by path (byte order).
static inline std::vector<std::string> files_in_directory(const std::string& dir) {
    namespace fs = std::filesystem;
    std::vector<std::string> files;
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        std::string path = it->path().string();
        if (it->is_regular_file(ec) && (has_suffix(path, ".txt") || has_suffix(path, ".jsonl"))) {
            files.push_back(path);
        }
    }
    if (ec) { fail("cannot list directory %s: %s", dir.c_str(), ec.message().c_str()); }
    if (files.empty()) { fail("directory %s has no .txt or .jsonl files", dir.c_str()); }
    std::sort(files.begin(), files.end());
    return files;
}

// The input files in order: each argument in turn, a directory expanded in place.
static inline std::vector<std::string> collect_input_files(const std::vector<std::string>& inputs) {
    namespace fs = std::filesystem;
    std::vector<std::string> files;
    for (const std::string& input : inputs) {
        std::error_code ec;
        if (fs::is_directory(input, ec)) {
            std::vector<std::string> found = files_in_directory(input);
            files.insert(files.end(), found.begin(), found.end());
        } else if (!fs::exists(input, ec)) {
            fail("input %s does not exist", input.c_str());
        } else if (has_suffix(input, ".txt") || has_suffix(input, ".jsonl")) {
            files.push_back(input);
        } else {
            fail("input %s is not a directory, .txt or .jsonl file", input.c_str());
        }
    }
    return files;
}

struct DocumentReader {
    std::vector<std::string> files;
    size_t next_file = 0;
    FILE* jsonl = nullptr;  // the .jsonl file being read, if any
    std::string jsonl_path;
    int64_t line_number = 0;
    char* line = nullptr;
    size_t line_capacity = 0;
};

// The next document of a .jsonl file being read; false at its end. Blank lines are skipped.
static inline bool next_jsonl_document(DocumentReader* reader, std::string* doc) {
    ssize_t len;
    while ((len = getline(&reader->line, &reader->line_capacity, reader->jsonl)) >= 0) {
        reader->line_number++;
        if (reader->line[len - 1] == '\n') { len--; }
        const char* line = reader->line;
        if (std::all_of(line, line + len, [](char ch) { return is_json_space((uint8_t)ch); })) { continue; }
        std::string error;
        if (!parse_jsonl_text(line, (size_t)len, doc, &error)) {
            fail("%s:%lld: bad JSON line: %s", reader->jsonl_path.c_str(), (long long)reader->line_number,
                 error.c_str());
        }
        return true;
    }
    if (ferror(reader->jsonl)) { fail("%s: read failed: %s", reader->jsonl_path.c_str(), strerror(errno)); }
    fclose(reader->jsonl);
    reader->jsonl = nullptr;
    return false;
}

// The next document of all inputs; false when they are exhausted.
static inline bool next_document(DocumentReader* reader, std::string* doc) {
    for (;;) {
        if (reader->jsonl != nullptr && next_jsonl_document(reader, doc)) { return true; }
        if (reader->next_file == reader->files.size()) { return false; }
        const std::string& path = reader->files[reader->next_file++];
        if (has_suffix(path, ".txt")) {
            *doc = read_whole_file(path.c_str());
            warn_if_not_utf8(path, *doc);
            return true;
        }
        reader->jsonl = fopen_or_fail(path.c_str(), "rb");
        reader->jsonl_path = path;
        reader->line_number = 0;
    }
}

static inline void document_reader_free(DocumentReader* reader) {
    if (reader->jsonl != nullptr) { fclose(reader->jsonl); }
    free(reader->line);
    reader->line = nullptr;
}

// ---------------------------------------------------------------------------------
// Parallel encoding in document order.

using DocumentSource = std::function<bool(std::string*)>;           // next document; false at the end
using TokenSink = std::function<void(const std::vector<uint32_t>&)>;  // one document's tokens, in order

struct Progress {
    bool enabled;
    bool to_terminal;
    double start_time, last_print_time;
    int64_t documents, tokens, bytes;
};

static inline void progress_print(Progress* p, bool final) {
    double now = seconds_now();
    if (!p->enabled || (!final && now - p->last_print_time < 1.0)) { return; }
    p->last_print_time = now;
    double mb_per_s = (double)p->bytes / 1e6 / std::max(now - p->start_time, 1e-9);
    fprintf(stderr, "%s%lld documents, %lld tokens, %.1f MB/s%s", p->to_terminal ? "\r" : "",
            (long long)p->documents, (long long)p->tokens, mb_per_s, final || !p->to_terminal ? "\n" : "");
    fflush(stderr);
    g_progress_line_open = p->to_terminal && !final;
}

// A batch of documents and, once encoded, their tokens (end-of-text first).
struct EncodeRound {
    std::vector<std::string> docs;
    std::vector<std::vector<uint32_t>> tokens;
    size_t bytes = 0;
    std::atomic<size_t> next_doc{0};  // the next document for a thread to take
};

// Reads documents into `round` until it holds `round_bytes` of text or the source ends.
static inline void read_round(const DocumentSource& source, size_t round_bytes, EncodeRound* round) {
    round->docs.clear();
    round->bytes = 0;
    std::string doc;
    while (round->bytes < round_bytes && source(&doc)) {
        round->bytes += doc.size();
        round->docs.push_back(std::move(doc));
    }
    round->tokens.resize(round->docs.size());
    round->next_doc = 0;
}

// Takes and encodes documents of `round` until none is left; threads share a round.
static inline void encode_round_work(const Tokenizer* tokenizer, EncodeRound* round) {
    for (size_t i = round->next_doc++; i < round->docs.size(); i = round->next_doc++) {
        std::vector<uint32_t>& out = round->tokens[i];
        out.clear();
        out.push_back(tokenizer->eot_token);
        tokenizer_encode(tokenizer, round->docs[i].data(), round->docs[i].size(), &out);
    }
}

static inline void sink_round(const EncodeRound& round, const TokenSink& sink, Progress* progress) {
    for (size_t i = 0; i < round.docs.size(); i++) {
        sink(round.tokens[i]);
        progress->tokens += (int64_t)round.tokens[i].size();
    }
    progress->documents += (int64_t)round.docs.size();
    progress->bytes += (int64_t)round.bytes;
    progress_print(progress, false);
}

// Encodes every document of `source` on `threads` threads and hands the tokens to `sink`
// in document order. While helper threads encode one round, the calling thread sinks
// the round before and reads the round after, then joins the encoding.
static inline void encode_documents(const Tokenizer* tokenizer, int threads, bool verbose,
                                    const DocumentSource& source, const TokenSink& sink) {
    double start = seconds_now();
    Progress progress = {.enabled = verbose,
                         .to_terminal = isatty(STDERR_FILENO) == 1,
                         .start_time = start,
                         .last_print_time = start,
                         .documents = 0,
                         .tokens = 0,
                         .bytes = 0};
    size_t round_bytes = (size_t)std::max(threads, 2) << 21;  // 2 MB of text per thread
    EncodeRound rounds[2];
    EncodeRound* current = &rounds[0];  // read, to encode now
    EncodeRound* other = &rounds[1];    // encoded and not yet sunk, then the next to read
    read_round(source, round_bytes, current);
    while (!current->docs.empty()) {
        std::vector<std::thread> helpers;
        for (int t = 1; t < threads; t++) { helpers.emplace_back(encode_round_work, tokenizer, current); }
        sink_round(*other, sink, &progress);
        read_round(source, round_bytes, other);
        encode_round_work(tokenizer, current);
        for (std::thread& helper : helpers) { helper.join(); }
        std::swap(current, other);
    }
    sink_round(*other, sink, &progress);
    progress_print(&progress, true);
}

// ---------------------------------------------------------------------------------
// Shards.

// Appends ids as uint16; an id above 65535 is a fatal error.
static inline void append_uint16(const uint32_t* ids, size_t count, std::vector<uint16_t>* out) {
    uint32_t any_bits = 0;
    for (size_t i = 0; i < count; i++) { any_bits |= ids[i]; }
    for (size_t i = 0; any_bits > 0xFFFF && i < count; i++) {
        if (ids[i] > 0xFFFF) { fail("token id %u does not fit in a uint16 shard", ids[i]); }
    }
    size_t old_size = out->size();
    out->resize(old_size + count);
    uint16_t* dst = out->data() + old_size;
    for (size_t i = 0; i < count; i++) { dst[i] = (uint16_t)ids[i]; }
}

// Writes one shard atomically; an existing file is replaced only with `force`.
static inline void write_shard(const std::string& path, const uint16_t* tokens, size_t count, bool force,
                               bool verbose) {
    if (!force && file_exists(path.c_str())) { fail("%s already exists (use --force to overwrite)", path.c_str()); }
    if (count > (size_t)INT32_MAX) { fail("%s: %zu tokens do not fit in one shard", path.c_str(), count); }
    int32_t header[DATALOADER_HEADER_INTS] = {0};
    header[0] = DATALOADER_MAGIC;
    header[1] = DATALOADER_VERSION;
    header[2] = (int32_t)count;
    AtomicFile out;
    open_atomic(&out, path.c_str());
    atomic_write_or_fail(&out, header, sizeof(int32_t), DATALOADER_HEADER_INTS);
    atomic_write_or_fail(&out, tokens, sizeof(uint16_t), count);
    commit_atomic(&out);
    if (verbose) {
        printf("wrote %s (%zu tokens)\n", path.c_str(), count);
        fflush(stdout);
    }
}

static inline void make_parent_directories(const std::string& path) {
    std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) { std::filesystem::create_directories(parent, ec); }
    if (ec) { fail("cannot create directory %s: %s", parent.string().c_str(), ec.message().c_str()); }
}

// Shard `index` of a prefix: index 0 is the validation shard, the others training shards.
static inline std::string shard_path(const std::string& prefix, int64_t index) {
    char suffix[64];
    snprintf(suffix, sizeof(suffix), "_%s_%06lld.bin", index == 0 ? "val" : "train", (long long)index);
    return prefix + suffix;
}

// The number in a file name BASE_val_NNNNNN.bin or BASE_train_NNNNNN.bin, else -1.
static inline int64_t shard_number(const std::string& name, const std::string& base) {
    for (const char* split : {"_val_", "_train_"}) {
        std::string head = base + split;
        bool numbered = name.size() == head.size() + 10 && name.compare(0, head.size(), head) == 0 &&
                        has_suffix(name, ".bin") &&
                        std::all_of(name.begin() + (long)head.size(), name.end() - 4,
                                    [](char ch) { return ch >= '0' && ch <= '9'; });
        if (numbered) { return atoll(name.c_str() + head.size()); }
    }
    return -1;
}

// Existing files named like shards of `prefix`, in shard order.
static inline std::vector<std::string> existing_shards(const std::string& prefix) {
    namespace fs = std::filesystem;
    fs::path prefix_path(prefix);
    fs::path dir = prefix_path.parent_path().empty() ? fs::path(".") : prefix_path.parent_path();
    std::string base = prefix_path.filename().string();
    std::string dir_part = prefix.substr(0, prefix.size() - base.size());  // as spelled in shard_path()
    std::vector<std::pair<int64_t, std::string>> numbered;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::string name = it->path().filename().string();
        int64_t number = shard_number(name, base);
        if (number >= 0) { numbered.emplace_back(number, dir_part + name); }
    }
    std::sort(numbered.begin(), numbered.end());
    std::vector<std::string> found;
    for (const auto& shard : numbered) { found.push_back(shard.second); }
    return found;
}

// Collects tokens and writes them as shards of `shard_size` tokens, the last one partial.
// A full shard is written when the token after it comes, so that inputs which only fill the
// validation shard are refused with nothing written (prepare_shards).
struct ShardWriter {
    std::string prefix;
    int64_t shard_size;
    bool force, verbose;
    std::vector<uint16_t> pending;       // tokens of the shard being filled
    std::vector<std::string> written;    // paths written so far
};

static inline void shard_writer_flush(ShardWriter* w) {
    std::string path = shard_path(w->prefix, (int64_t)w->written.size());
    if (w->written.empty()) { make_parent_directories(path); }
    write_shard(path, w->pending.data(), w->pending.size(), w->force, w->verbose);
    w->written.push_back(path);
    w->pending.clear();
}

static inline void shard_writer_add(ShardWriter* w, const std::vector<uint32_t>& ids) {
    for (size_t taken = 0; taken < ids.size();) {
        if (w->pending.size() == (size_t)w->shard_size) { shard_writer_flush(w); }
        size_t count = std::min((size_t)w->shard_size - w->pending.size(), ids.size() - taken);
        append_uint16(ids.data() + taken, count, &w->pending);
        taken += count;
    }
}

// The inputs as an error message names them: the first three, then how many more.
static inline std::string inputs_for_message(const std::vector<std::string>& inputs) {
    std::string text;
    for (size_t i = 0; i < inputs.size() && i < 3; i++) { text += (i > 0 ? ", " : "") + inputs[i]; }
    if (inputs.size() > 3) { text += " and " + std::to_string(inputs.size() - 3) + " more"; }
    return text;
}

// ---------------------------------------------------------------------------------
// The tool's modes.

// `encode`: the token ids of a file's bytes on one line.
static inline void print_encoding(const Tokenizer* tokenizer, const char* path, FILE* out) {
    std::string text = read_whole_file(path);
    warn_if_not_utf8(path, text);
    std::vector<uint32_t> ids;
    tokenizer_encode(tokenizer, text.data(), text.size(), &ids);
    std::string line;
    for (size_t i = 0; i < ids.size(); i++) {
        if (i > 0) { line.push_back(' '); }
        line += std::to_string(ids[i]);
    }
    line.push_back('\n');
    fwrite_or_fail(line.data(), 1, line.size(), out, "output");
}

// `decode`: whitespace-separated ids from `in`, their bytes to `out` (nothing if any id is bad).
static inline void decode_ids(const Tokenizer* tokenizer, FILE* in, FILE* out) {
    std::string text;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) { text.append(buf, n); }
    if (ferror(in)) { fail("decode: read failed: %s", strerror(errno)); }
    std::vector<uint32_t> ids;
    for (size_t pos = 0; pos < text.size();) {
        if (isspace((unsigned char)text[pos])) {
            pos++;
            continue;
        }
        size_t end = pos;
        while (end < text.size() && !isspace((unsigned char)text[end])) { end++; }
        std::string word = text.substr(pos, end - pos);
        bool digits = std::all_of(word.begin(), word.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        errno = 0;
        unsigned long long id = digits ? strtoull(word.c_str(), nullptr, 10) : 0;
        if (!digits || errno != 0 || id >= tokenizer->vocab_size) {
            fail("decode: bad token id \"%s\" (ids are integers below %u)", word.c_str(), tokenizer->vocab_size);
        }
        ids.push_back((uint32_t)id);
        pos = end;
    }
    for (uint32_t id : ids) {
        const uint8_t* bytes;
        size_t len;
        tokenizer_decode(tokenizer, id, &bytes, &len);
        fwrite_or_fail(bytes, 1, len, out, "output");
    }
}

// `tinyshakespeare`: the text split on "\n\n"; each piece, with its "\n\n" put back
// (except the last), is a document. The first 32,768 tokens are the validation shard.
static inline void prepare_tinyshakespeare(const Tokenizer* tokenizer, const char* text_path, const char* out_dir,
                                           const PrepareOptions* options) {
    std::string val_path = std::string(out_dir) + "/tiny_shakespeare_val.bin";
    std::string train_path = std::string(out_dir) + "/tiny_shakespeare_train.bin";
    for (const std::string& path : {val_path, train_path}) {
        if (!options->force && file_exists(path.c_str())) {
            fail("%s already exists (use --force to overwrite)", path.c_str());
        }
    }
    std::string text = read_whole_file(text_path);
    warn_if_not_utf8(text_path, text);
    size_t piece_start = 0;
    bool pieces_left = true;
    DocumentSource next_piece = [&](std::string* doc) {
        if (!pieces_left) { return false; }
        size_t separator = text.find("\n\n", piece_start);
        if (separator == std::string::npos) {
            doc->assign(text, piece_start, std::string::npos);
            pieces_left = false;
        } else {
            doc->assign(text, piece_start, separator + 2 - piece_start);
            piece_start = separator + 2;
        }
        return true;
    };
    std::vector<uint16_t> tokens;
    encode_documents(tokenizer, options->threads, options->verbose, next_piece,
                     [&](const std::vector<uint32_t>& ids) { append_uint16(ids.data(), ids.size(), &tokens); });
    if (tokens.size() <= TINYSHAKESPEARE_VAL_TOKENS) {
        fail("%s: too little text for a training split: %zu tokens, and the validation shard takes the first %zu "
             "(at least %zu needed)",
             text_path, tokens.size(), TINYSHAKESPEARE_VAL_TOKENS, TINYSHAKESPEARE_VAL_TOKENS + 1);
    }
    make_parent_directories(val_path);
    write_shard(val_path, tokens.data(), TINYSHAKESPEARE_VAL_TOKENS, options->force, options->verbose);
    write_shard(train_path, tokens.data() + TINYSHAKESPEARE_VAL_TOKENS, tokens.size() - TINYSHAKESPEARE_VAL_TOKENS,
                options->force, options->verbose);
}

// `shards`: every document of the inputs, in order, cut into shards of `shard_size`
// tokens; the first is the validation shard. Inputs that do not fill it and give at least
// one token of training shard are refused, with nothing written. With `force`, shards of
// an earlier run under the same prefix that this run does not rewrite are removed.
static inline void prepare_shards(const Tokenizer* tokenizer, const PrepareOptions* options) {
    std::vector<std::string> existing = existing_shards(options->out_prefix);
    if (!existing.empty() && !options->force) {
        fail("%s already exists (use --force to overwrite)", existing[0].c_str());
    }
    DocumentReader reader;
    reader.files = collect_input_files(options->inputs);
    ShardWriter writer = {.prefix = options->out_prefix,
                          .shard_size = options->shard_size,
                          .force = options->force,
                          .verbose = options->verbose,
                          .pending = {},
                          .written = {}};
    int64_t documents = 0;
    encode_documents(tokenizer, options->threads, options->verbose,
                     [&](std::string* doc) { return next_document(&reader, doc); },
                     [&](const std::vector<uint32_t>& ids) {
                         documents++;
                         shard_writer_add(&writer, ids);
                     });
    document_reader_free(&reader);
    if (writer.written.empty()) {  // every token is in the validation shard, none left to train on
        fail("the inputs (%s) give %lld document%s of %zu tokens in all, too few: the validation shard takes the "
             "first %lld (--shard-size) and training needs at least one more; nothing written",
             inputs_for_message(options->inputs).c_str(), (long long)documents, documents == 1 ? "" : "s",
             writer.pending.size(), (long long)options->shard_size);
    }
    shard_writer_flush(&writer);
    for (const std::string& path : existing) {
        bool rewritten = std::find(writer.written.begin(), writer.written.end(), path) != writer.written.end();
        if (!rewritten && remove(path.c_str()) != 0) {
            fail("cannot remove stale shard %s: %s", path.c_str(), strerror(errno));
        }
    }
}
