// The trainer's command line: every flag with its default, the usage text and every check, parsed
// once into TrainArgs, which main hands on. args_parse() never exits: a bad command line comes
// back as its one-line error ("flag -b: batch size must be positive"), which the trainer fails
// with and dev/test/test_args.cpp checks flag by flag.
#pragma once

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <string>
#include <vector>

#include "llmc/model_file.h"
#include "llmc/outlier.h"
#include "llmc/overlap.h"
#include "llmc/paths.h"
#include "llmc/run_shape.h"
#include "llmc/utils.h"
#include "llmc/zero.h"

constexpr int SPIKE_WINDOW_DEFAULT = 64;
// Measured on a healthy run (make train's: GPT-2 124M, tiny Shakespeare, 300 steps): with W = 64
// the largest z of the gradient norm was 2.96, so 6 leaves twice that margin, while a real loss
// spike multiplies the norm many times over (z far above 6).
constexpr float SPIKE_Z_DEFAULT = 6.0f;

constexpr const char* TINY_SHAKESPEARE_TRAIN = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin";
constexpr const char* TINY_SHAKESPEARE_VAL = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin";
constexpr const char* GPT2_VOCABULARY = "dev/data/gpt2_encoder.json";

// The flags that shape the run's numbers, at their defaults (-1: decided later, from the data or
// the model).
static inline RunShape args_default_shape() {
    RunShape r = {};
    r.B = 4;
    r.T = 1024;
    r.micro_batches = 1;
    r.max_steps = -1;
    r.schedule = SCHEDULE_COSINE;
    r.attention = ATTENTION_OF_MODEL;
    r.precision = 1;
    r.lr = 3e-4f;
    r.beta1 = 0.9f;
    r.beta2 = 0.95f;
    r.eps = 1e-8f;
    r.grad_clip = 1.0f;
    r.seed = 1337;
    r.spike_z = SPIKE_Z_DEFAULT;
    r.spike_window = SPIKE_WINDOW_DEFAULT;
    return r;
}

// Values that name something given on the command line point into argv (nullptr: not given).
struct TrainArgs {
    RunShape shape = args_default_shape();
    std::string train_pattern, val_pattern;  // -i, -j (default: the bundled tiny Shakespeare)
    const char* model = "d12";               // -e: model file, Hugging Face model, or a shape (model_shape_by_name)
    const char* output_dir = nullptr;        // -o: main.log and checkpoints
    std::string tokenizer;                   // --tokenizer (default: the bundled vocabulary)
    const char* rendezvous_dir = nullptr;    // --rendezvous-dir: meet through files there, not TCP
    OverlapMode overlap = OVERLAP_AUTO;      // --overlap: moves between GPUs beside the passes (llmc/overlap.h)
    int64_t total_batch_tokens = 0;          // -d; 0: B*T*GPUs, no accumulation
    int val_every = 20, val_batches = 20, sample_every = 20, gen_tokens = 64;  // -v, -m, -s, -g
    int checkpoint_every = 0, checkpoint_keep = 0;                             // -n, -nk
    int resume = 0;                // -y
    bool force = false;            // --force
    int stop_at = 0;               // --stop-at: exit at this step after checkpointing (0: run to the end)
    int checkpoint_sync = 0;       // --checkpoint-sync: 1 = checkpoints written while the GPU waits
    int tensorboard = 1;           // --tensorboard: 1 = TensorBoard events beside main.log in -o DIR
    int max_skips = 5;             // --max-skips: consecutive skipped updates that end the run
    int recompute = 0;             // -r: 1 = the backward pass recomputes each layer's residual2
    int debug_nan_step = -1;       // --debug-nan-step: a test hook, NaN gradients at this step (-1: off)
    float peak_tflops = 0.0f;      // --peak-tflops; 0: from the table of known GPUs (llmc/mfu.h)
    // generation: --prompt or --prompt-file prints completions and exits
    const char* prompt = nullptr;       // the text
    const char* prompt_file = nullptr;  // or the file holding it
    int gen_new = 256, batch_samples = 1;  // --gen, --batch-samples
    bool show_ids = false;                 // --show-ids
    float temperature = 1.0f;              // --temperature
    int top_k = 0;                         // --top-k
    float top_p = 1.0f;                    // --top-p
    // evaluation: HellaSwag-style multiple choice (llmc/eval.h)
    const char* eval_path = nullptr;    // --eval FILE
    int eval_every = 0;                 // --eval-every N: also every N steps (0: at the end only)
    const char* eval_report = nullptr;  // --eval-report FILE: each example's choice and losses
    bool help = false;                  // -h, --help
};

static inline void args_print_usage(FILE* out) {
    fprintf(out,
        "usage: train_gpt2_fp32 [flags]\n"
        "data and model\n"
        "  -i PATTERN  training shards (default dev/data/tinyshakespeare/tiny_shakespeare_train.bin)\n"
        "  -j PATTERN  validation shards (default dev/data/tinyshakespeare/tiny_shakespeare_val.bin)\n"
        "  -e MODEL    model file, Hugging Face GPT-2 directory (config.json + model.safetensors),\n"
        "              or a shape to start from scratch: %s (GPT-2 small to XL from d12) or\n"
        "              %s, e.g. L4C256H4 (default d12)\n"
        "  -A KIND     attention: softmax or relu (default softmax, or the checkpoint's)\n"
        "  --seed N    seed for initialisation and sampling (default 1337)\n"
        "batch and optimisation\n"
        "  -b B        micro-batch size per GPU (default 4)\n"
        "  -t T        sequence length, 1..maxT (default 1024)\n"
        "  -d TOKENS   total batch in tokens over all GPUs, a multiple of B*T*GPUs: gradient accumulation\n"
        "              (default B*T*GPUs)\n"
        "  -x STEPS    optimizer steps (default: one epoch of the training data)\n"
        "  -l LR       peak learning rate (default 3e-4)\n"
        "  -u STEPS    linear warmup steps (default 0)\n"
        "  -k KIND     decay after warmup: cosine, linear or constant (default cosine)\n"
        "  -q FRAC     final learning rate as a fraction of -l (default 0.0)\n"
        "  -c WD       AdamW weight decay on the 2-D tensors (default 0.0)\n"
        "  --beta1 B1 --beta2 B2 --eps EPS   AdamW (default 0.9, 0.95, 1e-8)\n"
        "  -gc NORM    clip the global gradient norm to NORM, 0 = off (default 1.0)\n"
        "  -f 0|1|2    matrix products: 1 TF32 tensor cores (default); 0 FP32 accuracy on the tensor cores\n"
        "              (split TF32: three TF32 products); 2 cuBLAS's plain FP32, no tensor cores\n"
        "  -a 0|1      overfit a single batch (default 0)\n"
        "  -r 0|1      1 = recompute each layer's attention residual in the backward pass: L*B*T*C floats\n"
        "              less memory (2.5 GB for d48 at B=8) for one C x C product per layer, 2-3%% slower,\n"
        "              bit-identical results (default 0)\n"
        "guards (a skipped update changes no weight, moment or Adam step count)\n"
        "  -sg Z       skip an update whose gradient norm is more than Z standard deviations above the\n"
        "              mean of the last W norms, 0 = off (default %g)\n"
        "  --spike-window W    W for -sg, 2..64 (default 64)\n"
        "  --max-skips K       stop the run after K consecutive skipped updates (default 5); an update\n"
        "              with a non-finite loss or gradient norm is always skipped\n"
        "several GPUs (one process each; NCCL)\n"
        "  --gpus N, -ng N       start N processes on this node's first N GPUs (no launcher needed)\n"
        "  --rendezvous-dir DIR  meet through files in DIR (a shared filesystem) instead of TCP at\n"
        "                        MASTER_ADDR:MASTER_PORT; ranks come from torchrun-style RANK/WORLD_SIZE,\n"
        "                        mpirun's OMPI_COMM_WORLD_* or srun's SLURM_* variables\n"
        "  --overlap auto|on|off move gradients beside the backward pass and parameters beside the next\n"
        "                        forward pass (on) or between the passes (off); auto: on over host shared\n"
        "                        memory and RDMA networks, off between GPU peers and over sockets (the\n"
        "                        configuration table says which); default auto, bit-identical either way\n"
        "evaluation, output, checkpoints\n"
        "  -v N        validation loss every N steps, 0 = never (default 20)\n"
        "  -m N        validation batches of B rows, as one GPU reads them (split over the GPUs by\n"
        "              rows: the same loss at any GPU count), 0 = the whole split (default 20)\n"
        "  -s N        sample every N steps, 0 = never (default 20)\n"
        "  -g N        tokens to generate per sample (default 64)\n"
        "  -o DIR      write DIR/main.log and checkpoints (refuses a DIR holding a run without --force or -y 1)\n"
        "  -n N        checkpoint every N steps, 0 = only at the end (default 0; needs -o)\n"
        "  -nk K       keep the last K checkpoints, 0 = all (default 0)\n"
        "  -y 0|1      resume from the latest checkpoint in -o DIR, on any number of GPUs (default 0); with\n"
        "              no checkpoint there yet (a run stopped before its first), start from scratch\n"
        "  --force     start a new run in an -o DIR that holds another run (its files move to DIR/replaced_*)\n"
        "  --stop-at S exit at step S after writing its checkpoint, to resume later with -y 1\n"
        "  --checkpoint-sync 0|1  1 = write each checkpoint while the GPU waits; 0 = copy it to pinned host\n"
        "              memory and write it in the background while training goes on (synchronous where\n"
        "              that memory cannot be had) (default 0)\n"
        "  --tensorboard 0|1    TensorBoard events in -o DIR beside main.log (events.out.tfevents.*), 0 = off\n"
        "                       (default 1)\n"
        "  --tokenizer FILE     vocabulary for prompts and samples (default: the bundled dev/data/gpt2_encoder.json)\n"
        "  --peak-tflops F      TF32 peak of one GPU for MFU (default: a table of known GPUs)\n"
        "multiple-choice evaluation (HellaSwag's .jsonl: ctx, 4 endings, label; scored by the mean loss of\n"
        "each ending's tokens, the lowest wins)\n"
        "  --eval FILE         evaluate at the end of training, or without training with -x 0\n"
        "  --eval-every N      also every N steps (default 0: at the end only)\n"
        "  --eval-report FILE  write each example's choice and four losses\n"
        "generation (prints completions of a prompt with the -e model and exits; no data files needed)\n"
        "  --prompt TEXT       the prompt (\"\" starts from <|endoftext|>)\n"
        "  --prompt-file FILE  the prompt from a file\n"
        "  --gen N             new tokens per completion, up to the model's maxT (default 256)\n"
        "  --batch-samples M   completions, generated together (default 1)\n"
        "  --temperature T     0 = greedy (default 1.0)\n"
        "  --top-k K           sample from the K most likely tokens, 0 = all (default 0)\n"
        "  --top-p P           then from the most likely ones summing to P, 1 = all (default 1.0)\n"
        "  --show-ids          also print each completion's token ids\n"
        "  -h          this help\n", model_shape_names("|").c_str(), MODEL_SHAPE_FORM, SPIKE_Z_DEFAULT);
}

// ----------------------------------------------------------------------------------------------
// Values: each kind of flag value read into its field, or false with the error.

// An integer in [lo, hi], or false with the error.
static inline bool args_read_integer(const char* flag, const char* value, int64_t lo, int64_t hi, int64_t* out,
                                     std::string* error) {
    char* end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (*value == '\0' || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
        return set_problem(error, "flag %s: '%s' is not an integer", flag, value);
    }
    *out = v;
    return true;
}

static inline bool args_read_value(const char* flag, const char* value, int* out, std::string* error) {
    int64_t v = 0;
    if (!args_read_integer(flag, value, INT32_MIN, INT32_MAX, &v, error)) { return false; }
    *out = (int)v;
    return true;
}

static inline bool args_read_value(const char* flag, const char* value, int64_t* out, std::string* error) {
    return args_read_integer(flag, value, INT64_MIN, INT64_MAX, out, error);
}

// --seed: a 64-bit integer, its bits kept (a negative seed is a large one).
static inline bool args_read_value(const char* flag, const char* value, uint64_t* out, std::string* error) {
    int64_t v = 0;
    if (!args_read_integer(flag, value, INT64_MIN, INT64_MAX, &v, error)) { return false; }
    *out = (uint64_t)v;
    return true;
}

static inline bool args_read_value(const char* flag, const char* value, float* out, std::string* error) {
    char* end;
    float v = strtof(value, &end);
    if (*value == '\0' || *end != '\0' || !isfinite(v)) {
        return set_problem(error, "flag %s: '%s' is not a number", flag, value);
    }
    *out = v;
    return true;
}

static inline bool args_read_value(const char*, const char* value, const char** out, std::string*) {
    *out = value;
    return true;
}

static inline bool args_read_value(const char*, const char* value, std::string* out, std::string*) {
    *out = value;
    return true;
}

// ----------------------------------------------------------------------------------------------
// The table of flags that take a value.

using FlagReader = std::function<bool(const char* flag, const char* value, std::string* error)>;

struct Flag {
    const char* name;
    FlagReader read;
};

template <typename T>
static inline FlagReader args_field(T* field) {
    return [field](const char* flag, const char* value, std::string* error) {
        return args_read_value(flag, value, field, error);
    };
}

// A path: never empty, which would read as "not given" (-i "$DATA" with DATA unset would train on
// the bundled data).
template <typename T>
static inline FlagReader args_path(T* field) {
    return [field](const char* flag, const char* value, std::string* error) {
        if (*value == '\0') { return set_problem(error, "flag %s: an empty path (an unset variable?)", flag); }
        return args_read_value(flag, value, field, error);
    };
}

// One of an enum's names (its table, indexed by the enum's values from 0), stored as its value.
template <typename Enum, size_t N>
static inline FlagReader args_choice(Enum* field, const char* const (&names)[N]) {
    return [field, &names](const char* flag, const char* value, std::string* error) {
        for (size_t i = 0; i < N; i++) {
            if (strcmp(value, names[i]) == 0) {
                *field = (Enum)i;
                return true;
            }
        }
        return set_problem(error, "flag %s: '%s' is not one of the choices (see -h)", flag, value);
    };
}

static inline std::vector<Flag> args_flags(TrainArgs* a) {
    RunShape* r = &a->shape;
    return {
        {"-i", args_path(&a->train_pattern)}, {"-j", args_path(&a->val_pattern)}, {"-e", args_path(&a->model)},
        {"-o", args_path(&a->output_dir)}, {"--tokenizer", args_path(&a->tokenizer)},
        {"--rendezvous-dir", args_path(&a->rendezvous_dir)}, {"--overlap", args_choice(&a->overlap, OVERLAP_NAMES)},
        {"-A", args_choice(&r->attention, ATTENTION_NAMES)},
        {"--seed", args_field(&r->seed)}, {"-b", args_field(&r->B)}, {"-t", args_field(&r->T)},
        {"-d", args_field(&a->total_batch_tokens)}, {"-x", args_field(&r->max_steps)}, {"-l", args_field(&r->lr)},
        {"-u", args_field(&r->warmup_steps)}, {"-k", args_choice(&r->schedule, SCHEDULE_NAMES)},
        {"-q", args_field(&r->final_lr_frac)}, {"-c", args_field(&r->weight_decay)},
        {"--beta1", args_field(&r->beta1)}, {"--beta2", args_field(&r->beta2)}, {"--eps", args_field(&r->eps)},
        {"-gc", args_field(&r->grad_clip)}, {"-sg", args_field(&r->spike_z)},
        {"--spike-window", args_field(&r->spike_window)}, {"--max-skips", args_field(&a->max_skips)},
        {"--debug-nan-step", args_field(&a->debug_nan_step)}, {"-f", args_field(&r->precision)},
        {"-a", args_field(&r->overfit_single_batch)}, {"-v", args_field(&a->val_every)},
        {"-m", args_field(&a->val_batches)}, {"-s", args_field(&a->sample_every)}, {"-g", args_field(&a->gen_tokens)},
        {"-n", args_field(&a->checkpoint_every)}, {"-nk", args_field(&a->checkpoint_keep)},
        {"-y", args_field(&a->resume)}, {"-r", args_field(&a->recompute)},
        {"--peak-tflops", args_field(&a->peak_tflops)}, {"--stop-at", args_field(&a->stop_at)},
        {"--checkpoint-sync", args_field(&a->checkpoint_sync)}, {"--tensorboard", args_field(&a->tensorboard)},
        {"--prompt", args_field(&a->prompt)}, {"--prompt-file", args_path(&a->prompt_file)},
        {"--gen", args_field(&a->gen_new)}, {"--batch-samples", args_field(&a->batch_samples)},
        {"--temperature", args_field(&a->temperature)}, {"--top-k", args_field(&a->top_k)},
        {"--top-p", args_field(&a->top_p)}, {"--eval", args_path(&a->eval_path)},
        {"--eval-every", args_field(&a->eval_every)}, {"--eval-report", args_path(&a->eval_report)},
    };
}

// Reads the flag at argv[*i], and its value (moving *i past it), into *a.
static inline bool args_take_flag(const std::vector<Flag>& flags, int argc, char** argv, int* i, TrainArgs* a,
                                  std::string* error) {
    const char* flag = argv[*i];
    auto is = [flag](const char* name) { return strcmp(flag, name) == 0; };
    bool* switched = is("-h") || is("--help") ? &a->help : is("--force") ? &a->force : is("--show-ids") ? &a->show_ids : nullptr;
    if (switched != nullptr) {
        *switched = true;
        return true;
    }
    if (is("--gpus") || is("-ng")) {  // its value was read by launch_gpus_flag
        ++*i;
        return true;
    }
    if (*i + 1 >= argc) { return set_problem(error, "flag %s needs a value (see -h)", flag); }
    const char* value = argv[++*i];
    for (const Flag& known : flags) {
        if (is(known.name)) { return known.read(flag, value, error); }
    }
    return set_problem(error, "unknown flag %s (see -h)", flag);
}

// ----------------------------------------------------------------------------------------------
// The checks, in the order they are reported: the first failing one is the error.

// False with "flag FLAG: WHAT" unless ok.
static inline bool args_require(bool ok, const char* flag, const char* what, std::string* error) {
    return ok || set_problem(error, "flag %s: %s", flag, what);
}

// -e naming a shape (llmc/model_file.h's table or L<layers>C<channels>H<heads>): one the kernels run.
static inline bool args_check_model(const TrainArgs* a, std::string* error) {
    ModelShape shape;
    std::string problem;
    if (!model_shape_by_name(a->model, &shape, &problem) || problem.empty()) { return true; }
    return set_problem(error, "flag -e %s: %s", a->model, problem.c_str());
}

// -b, -t and -d, which fixes the micro-batches of a step over `world` GPUs.
static inline bool args_check_batch(TrainArgs* a, int world, std::string* error) {
    RunShape* r = &a->shape;
    if (!args_require(r->B > 0, "-b", "batch size must be positive", error) ||
        !args_require(r->T > 0, "-t", "sequence length must be positive", error)) {
        return false;
    }
    int64_t micro_tokens = (int64_t)r->B * r->T;
    if (a->total_batch_tokens == 0) { a->total_batch_tokens = micro_tokens * world; }
    int64_t micro_batches = zero_micro_batches(a->total_batch_tokens, micro_tokens, world);
    if (micro_batches == 0 || micro_batches > INT32_MAX) {
        return set_problem(error, "flag -d: total batch %lld tokens is not a positive multiple of B*T*GPUs = %d*%d*%d = %lld",
                           (long long)a->total_batch_tokens, r->B, r->T, world, (long long)(micro_tokens * world));
    }
    r->micro_batches = (int)micro_batches;
    return true;
}

static inline bool args_check_optimizer(const TrainArgs* a, std::string* e) {
    const RunShape* r = &a->shape;
    return args_require(r->max_steps == -1 || r->max_steps > 0 || (r->max_steps == 0 && a->eval_path != nullptr), "-x",
                        "steps must be positive (0 only with --eval: evaluate without training)", e) &&
           args_require(r->lr >= 0.0f, "-l", "learning rate must not be negative", e) &&
           args_require(r->warmup_steps >= 0, "-u", "warmup steps must not be negative", e) &&
           args_require(r->final_lr_frac >= 0.0f && r->final_lr_frac <= 1.0f, "-q", "final fraction must be in [0, 1]", e) &&
           args_require(r->weight_decay >= 0.0f, "-c", "weight decay must not be negative", e) &&
           args_require(r->beta1 >= 0.0f && r->beta1 < 1.0f, "--beta1", "must be in [0, 1)", e) &&
           args_require(r->beta2 >= 0.0f && r->beta2 < 1.0f, "--beta2", "must be in [0, 1)", e) &&
           args_require(r->eps > 0.0f, "--eps", "must be positive", e) &&
           args_require(r->grad_clip >= 0.0f, "-gc", "must not be negative", e) &&
           args_require(r->spike_z >= 0.0f, "-sg", "must not be negative (0: off)", e) &&
           args_require(r->spike_window >= 2 && r->spike_window <= OUTLIER_CAPACITY, "--spike-window",
                        "must be in [2, 64]", e) &&
           args_require(a->max_skips >= 1, "--max-skips", "must be at least 1", e) &&
           args_require(r->precision >= 0 && r->precision <= 2, "-f", "must be 0, 1 or 2", e) &&
           args_require(r->overfit_single_batch == 0 || r->overfit_single_batch == 1, "-a", "must be 0 or 1", e) &&
           args_require(a->recompute == 0 || a->recompute == 1, "-r", "must be 0 or 1", e);
}

static inline bool args_check_output(const TrainArgs* a, std::string* e) {
    return args_require(a->val_every >= 0, "-v", "must not be negative", e) &&
           args_require(a->val_batches >= 0, "-m", "must not be negative", e) &&
           args_require(a->sample_every >= 0, "-s", "must not be negative", e) &&
           args_require(a->gen_tokens >= 0, "-g", "must not be negative", e) &&
           args_require(a->checkpoint_every >= 0, "-n", "must not be negative", e) &&
           args_require(a->checkpoint_keep >= 0, "-nk", "must not be negative", e) &&
           args_require(a->resume == 0 || a->resume == 1, "-y", "must be 0 or 1", e) &&
           args_require(a->output_dir != nullptr || (a->checkpoint_every == 0 && !a->resume), "-o",
                        "-n and -y need an output directory", e) &&
           args_require(a->peak_tflops >= 0.0f, "--peak-tflops", "must not be negative", e) &&
           args_require(a->stop_at >= 0, "--stop-at", "must not be negative (0: off)", e) &&
           args_require(a->checkpoint_sync == 0 || a->checkpoint_sync == 1, "--checkpoint-sync", "must be 0 or 1", e) &&
           args_require(a->tensorboard == 0 || a->tensorboard == 1, "--tensorboard", "must be 0 or 1", e);
}

static inline bool args_check_generation(const TrainArgs* a, std::string* e) {
    return args_require(a->prompt == nullptr || a->prompt_file == nullptr, "--prompt-file",
                        "and --prompt: give one of them", e) &&
           args_require(a->gen_new >= 1, "--gen", "must be at least 1", e) &&
           args_require(a->batch_samples >= 1, "--batch-samples", "must be at least 1", e) &&
           args_require(a->temperature >= 0.0f && isfinite(a->temperature), "--temperature",
                        "must be a finite number >= 0", e) &&
           args_require(a->top_k >= 0, "--top-k", "must not be negative (0: off)", e) &&
           args_require(a->top_p > 0.0f && a->top_p <= 1.0f, "--top-p", "must be in (0, 1]", e);
}

static inline bool args_check_eval(const TrainArgs* a, std::string* e) {
    return args_require(a->eval_every >= 0, "--eval-every", "must not be negative (0: at the end only)", e) &&
           args_require(a->eval_path != nullptr || (a->eval_every == 0 && a->eval_report == nullptr), "--eval",
                        "--eval-every and --eval-report need an --eval file", e);
}

// ----------------------------------------------------------------------------------------------
// Parsing

// Whether the run generates (--prompt, --prompt-file): it prints completions and exits.
static inline bool args_generates(const TrainArgs* a) { return a->prompt != nullptr || a->prompt_file != nullptr; }

// Whether the run trains (reads training and validation data), rather than generating or only
// evaluating (-x 0 with --eval).
static inline bool args_trains(const TrainArgs* a) { return !args_generates(a) && a->shape.max_steps != 0; }

// Parses the command line of a run on `world` GPUs (processes) into *a; false with the one-line
// *error of the first bad flag. With -h, a->help and nothing checked.
static inline bool args_parse(int argc, char** argv, int world, TrainArgs* a, std::string* error) {
    *a = TrainArgs();
    std::vector<Flag> flags = args_flags(a);
    for (int i = 1; i < argc && !a->help; i++) {
        if (!args_take_flag(flags, argc, argv, &i, a, error)) { return false; }
    }
    return a->help || (args_check_model(a, error) && args_check_batch(a, world, error) &&
                       args_check_optimizer(a, error) && args_check_output(a, error) &&
                       args_check_generation(a, error) && args_check_eval(a, error));
}

// The bundled files for the paths not given, found from any directory (llmc/paths.h); generating
// or only evaluating reads no data. Fails naming the places looked.
static inline void args_find_bundled_files(TrainArgs* a) {
    bool trains = args_trains(a);
    if (trains && a->train_pattern.empty()) { a->train_pattern = find_bundled_file(TINY_SHAKESPEARE_TRAIN, nullptr, "-i"); }
    if (trains && a->val_pattern.empty()) { a->val_pattern = find_bundled_file(TINY_SHAKESPEARE_VAL, nullptr, "-j"); }
    const char* tokenizer = a->tokenizer.empty() ? nullptr : a->tokenizer.c_str();
    a->tokenizer = find_bundled_file(GPT2_VOCABULARY, tokenizer, "--tokenizer");
}

// The trainer's arguments: -h prints the usage and exits 0, a bad flag fails with its error.
static inline TrainArgs args_parse_or_fail(int argc, char** argv, int world) {
    TrainArgs a;
    std::string error;
    if (!args_parse(argc, argv, world, &a, &error)) { fail("%s", error.c_str()); }
    if (a.help) {
        args_print_usage(stdout);
        exit(0);
    }
    args_find_bundled_files(&a);
    return a;
}
