// CPU tests of llmc/args.h, the trainer's command line: every default, every flag read into its
// field, every check's error message (the texts users see), -h, and the usage text naming every
// flag. Run from the repository root (the bundled files are found from there).
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/args.h"

// Parses `flags` (after the program's name) for a run on `world` GPUs; the error, "" if none.
static std::string parse(const std::vector<const char*>& flags, TrainArgs* a, int world = 1) {
    std::vector<char*> argv = {(char*)"train_gpt2_fp32"};
    for (const char* flag : flags) { argv.push_back((char*)flag); }
    std::string error;
    bool ok = args_parse((int)argv.size(), argv.data(), world, a, &error);
    CHECK(ok == error.empty());
    return error;
}

static bool refused(const std::vector<const char*>& flags, const std::string& expected, int world = 1) {
    TrainArgs a;
    std::string error = parse(flags, &a, world);
    if (error != expected) { fprintf(stderr, "  expected \"%s\", got \"%s\"\n", expected.c_str(), error.c_str()); }
    return error == expected;
}

// A command line (on `world` GPUs) and the error it must give.
struct Refusal {
    std::vector<const char*> flags;
    const char* error;
    int world = 1;
};

static void check_refusals(const std::vector<Refusal>& refusals) {
    for (const Refusal& r : refusals) { CHECK(refused(r.flags, r.error, r.world)); }
}

TEST(defaults) {
    TrainArgs a;
    CHECK(parse({}, &a) == "");
    const RunShape& r = a.shape;
    CHECK(r.B == 4 && r.T == 1024 && r.micro_batches == 1 && r.max_steps == -1 && r.warmup_steps == 0);
    CHECK(r.schedule == SCHEDULE_COSINE && r.attention == ATTENTION_OF_MODEL && r.precision == 1 && r.overfit_single_batch == 0);
    CHECK(r.lr == 3e-4f && r.final_lr_frac == 0.0f && r.weight_decay == 0.0f && r.beta1 == 0.9f && r.beta2 == 0.95f);
    CHECK(r.eps == 1e-8f && r.grad_clip == 1.0f && r.seed == 1337 && r.spike_z == 6.0f && r.spike_window == 64);
    CHECK(a.train_pattern.empty() && a.val_pattern.empty() && a.tokenizer.empty() && strcmp(a.model, "d12") == 0);
    CHECK(a.output_dir == nullptr && a.rendezvous_dir == nullptr && a.total_batch_tokens == 4 * 1024);
    CHECK(a.val_every == 20 && a.val_batches == 20 && a.sample_every == 20 && a.gen_tokens == 64);
    CHECK(a.checkpoint_every == 0 && a.checkpoint_keep == 0 && a.resume == 0 && !a.force && a.stop_at == 0);
    CHECK(a.max_skips == 5 && a.recompute == 0 && a.debug_nan_step == -1 && a.peak_tflops == 0.0f);
    CHECK(a.tensorboard == 1 && a.checkpoint_sync == 0);
    CHECK(a.prompt == nullptr && a.prompt_file == nullptr && a.gen_new == 256 && a.batch_samples == 1 && !a.show_ids);
    CHECK(a.temperature == 1.0f && a.top_k == 0 && a.top_p == 1.0f);
    CHECK(a.eval_path == nullptr && a.eval_every == 0 && a.eval_report == nullptr && !a.help);
    CHECK(!args_generates(&a));
}

TEST(data_and_model_flags) {
    TrainArgs a;
    CHECK(parse({"-i", "tr_*.bin", "-j", "va_*.bin", "-e", "d24", "-A", "relu", "--seed", "-3", "-o", "out",
                 "--tokenizer", "v.json", "--rendezvous-dir", "meet"}, &a) == "");
    CHECK(a.train_pattern == "tr_*.bin" && a.val_pattern == "va_*.bin" && strcmp(a.model, "d24") == 0);
    CHECK(a.shape.attention == ATTENTION_RELU && a.shape.seed == (uint64_t)-3 && strcmp(a.output_dir, "out") == 0);
    CHECK(a.tokenizer == "v.json" && strcmp(a.rendezvous_dir, "meet") == 0);
    CHECK(parse({"-A", "softmax"}, &a) == "" && a.shape.attention == ATTENTION_SOFTMAX);
    for (const char* model : {"d6", "L6C384H6", "L1C32H1", "L48C1600H25", "model.bin", "L6C384H5.bin"}) {
        CHECK(parse({"-e", model}, &a) == "" && strcmp(a.model, model) == 0);
    }
}

// -e with a shape the kernels cannot run: one line naming the limits, before any other check.
TEST(bad_shapes_refused) {
    const char* limits = "the trainer runs 1 <= L <= 256, C <= 2048 a multiple of 4 and of NH, head size C/NH 32, 64 or 128";
    for (const char* bad : {"L6C384H5", "L0C384H6", "L300C384H6", "L6C384H4", "L6C4096H32", "L6C66H2"}) {
        TrainArgs a;
        std::string error = parse({"-b", "0", "-e", bad}, &a);
        CHECK(error.rfind(std::string("flag -e ") + bad + ": L=", 0) == 0 && error.find(limits) != std::string::npos);
    }
    CHECK(refused({"-e", "L6C384H5"}, std::string("flag -e L6C384H5: L=6 C=384 NH=5: ") + limits));
}

TEST(batch_and_optimisation_flags) {
    TrainArgs a;
    CHECK(parse({"-b", "8", "-t", "64", "-d", "2048", "-x", "7", "-l", "1e-3", "-u", "2", "-k", "linear", "-q", "0.1",
                 "-c", "0.05", "--beta1", "0.8", "--beta2", "0.9", "--eps", "1e-6", "-gc", "0.5", "-f", "0", "-a", "1",
                 "-r", "1"}, &a, 2) == "");
    const RunShape& r = a.shape;
    CHECK(r.B == 8 && r.T == 64 && a.total_batch_tokens == 2048 && r.micro_batches == 4 && r.max_steps == 7);
    CHECK(r.lr == 1e-3f && r.warmup_steps == 2 && r.schedule == SCHEDULE_LINEAR && r.final_lr_frac == 0.1f);
    CHECK(r.weight_decay == 0.05f && r.beta1 == 0.8f && r.beta2 == 0.9f && r.eps == 1e-6f && r.grad_clip == 0.5f);
    CHECK(r.precision == 0 && r.overfit_single_batch == 1 && a.recompute == 1);
    CHECK(parse({"-k", "constant"}, &a) == "" && a.shape.schedule == SCHEDULE_CONSTANT);
    CHECK(parse({}, &a) == "" && a.overlap == OVERLAP_AUTO);
    CHECK(parse({"--overlap", "on"}, &a) == "" && a.overlap == OVERLAP_ON);
    CHECK(parse({"--overlap", "off"}, &a) == "" && a.overlap == OVERLAP_OFF);
    CHECK(parse({"-b", "2", "-t", "8"}, &a, 3) == "" && a.total_batch_tokens == 48 && a.shape.micro_batches == 3);
    // -d and --seed past 32 bits
    CHECK(parse({"-b", "4", "-t", "1024", "-d", "4294967296"}, &a) == "" && a.total_batch_tokens == 4294967296LL &&
          a.shape.micro_batches == 1048576);
    CHECK(parse({"--seed", "5000000000"}, &a) == "" && a.shape.seed == 5000000000ULL);
    CHECK(parse({"--seed", "-1"}, &a) == "" && a.shape.seed == UINT64_MAX);
}

TEST(guard_output_and_checkpoint_flags) {
    TrainArgs a;
    CHECK(parse({"-sg", "3.5", "--spike-window", "8", "--max-skips", "2", "--debug-nan-step", "4", "-v", "5", "-m", "6",
                 "-s", "7", "-g", "8", "-o", "d", "-n", "9", "-nk", "2", "-y", "1", "--force", "--stop-at", "3",
                 "--peak-tflops", "100", "--gpus", "2", "-ng", "2", "--tensorboard", "0", "--checkpoint-sync", "1"},
                &a) == "");
    CHECK(a.shape.spike_z == 3.5f && a.shape.spike_window == 8 && a.max_skips == 2 && a.debug_nan_step == 4);
    CHECK(a.val_every == 5 && a.val_batches == 6 && a.sample_every == 7 && a.gen_tokens == 8);
    CHECK(a.checkpoint_every == 9 && a.checkpoint_keep == 2 && a.resume == 1 && a.force && a.stop_at == 3);
    CHECK(a.peak_tflops == 100.0f && a.tensorboard == 0 && a.checkpoint_sync == 1);
}

TEST(generation_and_evaluation_flags) {
    TrainArgs a;
    CHECK(parse({"--prompt", "", "--gen", "5", "--batch-samples", "3", "--temperature", "0", "--top-k", "40",
                 "--top-p", "0.9", "--show-ids"}, &a) == "");
    CHECK(a.prompt != nullptr && a.prompt[0] == '\0' && args_generates(&a) && a.gen_new == 5 && a.batch_samples == 3);
    CHECK(a.temperature == 0.0f && a.top_k == 40 && a.top_p == 0.9f && a.show_ids);
    CHECK(parse({"--prompt-file", "p.txt"}, &a) == "" && strcmp(a.prompt_file, "p.txt") == 0 && args_generates(&a));
    CHECK(parse({"--eval", "h.jsonl", "--eval-every", "10", "--eval-report", "r.txt", "-x", "0"}, &a) == "");
    CHECK(strcmp(a.eval_path, "h.jsonl") == 0 && a.eval_every == 10 && strcmp(a.eval_report, "r.txt") == 0);
    CHECK(parse({"--eval", "h.jsonl", "--eval-report", "r.txt", "-x", "0"}, &a, 4) == "");  // any GPU count
    CHECK(a.shape.max_steps == 0);
}

TEST(help_stops_parsing) {
    TrainArgs a;
    CHECK(parse({"-h", "-b", "0"}, &a) == "" && a.help);
    CHECK(parse({"--help"}, &a) == "" && a.help);
    CHECK(refused({"-b", "x", "-h"}, "flag -b: 'x' is not an integer"));
}

// Every check's message, as users see it.
TEST(error_messages) {
    check_refusals({
        // values that are not what the flag takes
        {{"-b"}, "flag -b needs a value (see -h)"},
        {{"--nonsense"}, "flag --nonsense needs a value (see -h)"},
        {{"--nonsense", "1"}, "unknown flag --nonsense (see -h)"},
        {{"-t", "12x"}, "flag -t: '12x' is not an integer"},
        {{"-x", ""}, "flag -x: '' is not an integer"},
        {{"-i", ""}, "flag -i: an empty path (an unset variable?)"},
        {{"-j", ""}, "flag -j: an empty path (an unset variable?)"},
        {{"--tokenizer", ""}, "flag --tokenizer: an empty path (an unset variable?)"},
        {{"-o", ""}, "flag -o: an empty path (an unset variable?)"},
        {{"--eval", ""}, "flag --eval: an empty path (an unset variable?)"},
        {{"-x", "3000000000"}, "flag -x: '3000000000' is not an integer"},
        {{"--seed", "1.5"}, "flag --seed: '1.5' is not an integer"},
        {{"-l", "fast"}, "flag -l: 'fast' is not a number"},
        {{"-l", "inf"}, "flag -l: 'inf' is not a number"},
        {{"-A", "linear"}, "flag -A: 'linear' is not one of the choices (see -h)"},
        {{"-k", "step"}, "flag -k: 'step' is not one of the choices (see -h)"},
        {{"--overlap", "1"}, "flag --overlap: '1' is not one of the choices (see -h)"},
        // the batch
        {{"-b", "0"}, "flag -b: batch size must be positive"},
        {{"-t", "-1"}, "flag -t: sequence length must be positive"},
        {{"-b", "2", "-t", "8", "-d", "24"},
         "flag -d: total batch 24 tokens is not a positive multiple of B*T*GPUs = 2*8*1 = 16"},
        {{"-b", "2", "-t", "8", "-d", "16"},
         "flag -d: total batch 16 tokens is not a positive multiple of B*T*GPUs = 2*8*2 = 32", 2},
        {{"-d", "99999999999999999999"}, "flag -d: '99999999999999999999' is not an integer"},
        {{"-b", "3000000000"}, "flag -b: '3000000000' is not an integer"},
        {{"-d", "-4096"}, "flag -d: total batch -4096 tokens is not a positive multiple of B*T*GPUs = 4*1024*1 = 4096"},
        // the optimizer and the guards
        {{"-x", "0"}, "flag -x: steps must be positive (0 only with --eval: evaluate without training)"},
        {{"-x", "-2"}, "flag -x: steps must be positive (0 only with --eval: evaluate without training)"},
        {{"-l", "-1"}, "flag -l: learning rate must not be negative"},
        {{"-u", "-1"}, "flag -u: warmup steps must not be negative"},
        {{"-q", "1.5"}, "flag -q: final fraction must be in [0, 1]"},
        {{"-c", "-0.1"}, "flag -c: weight decay must not be negative"},
        {{"--beta1", "1"}, "flag --beta1: must be in [0, 1)"},
        {{"--beta2", "-0.5"}, "flag --beta2: must be in [0, 1)"},
        {{"--eps", "0"}, "flag --eps: must be positive"},
        {{"-gc", "-1"}, "flag -gc: must not be negative"},
        {{"-sg", "-1"}, "flag -sg: must not be negative (0: off)"},
        {{"--spike-window", "1"}, "flag --spike-window: must be in [2, 64]"},
        {{"--spike-window", "65"}, "flag --spike-window: must be in [2, 64]"},
        {{"--max-skips", "0"}, "flag --max-skips: must be at least 1"},
        {{"-f", "3"}, "flag -f: must be 0, 1 or 2"},
        {{"-a", "-1"}, "flag -a: must be 0 or 1"},
        {{"-r", "2"}, "flag -r: must be 0 or 1"},
        // output and checkpoints
        {{"-v", "-1"}, "flag -v: must not be negative"},
        {{"-m", "-1"}, "flag -m: must not be negative"},
        {{"-s", "-1"}, "flag -s: must not be negative"},
        {{"-g", "-1"}, "flag -g: must not be negative"},
        {{"-n", "-1"}, "flag -n: must not be negative"},
        {{"-nk", "-1"}, "flag -nk: must not be negative"},
        {{"-y", "2"}, "flag -y: must be 0 or 1"},
        {{"-n", "5"}, "flag -o: -n and -y need an output directory"},
        {{"-y", "1"}, "flag -o: -n and -y need an output directory"},
        {{"--peak-tflops", "-1"}, "flag --peak-tflops: must not be negative"},
        {{"--stop-at", "-1"}, "flag --stop-at: must not be negative (0: off)"},
        {{"--checkpoint-sync", "2"}, "flag --checkpoint-sync: must be 0 or 1"},
        {{"--tensorboard", "2"}, "flag --tensorboard: must be 0 or 1"},
        // generation and evaluation
        {{"--prompt", "a", "--prompt-file", "p"}, "flag --prompt-file: and --prompt: give one of them"},
        {{"--gen", "0"}, "flag --gen: must be at least 1"},
        {{"--batch-samples", "0"}, "flag --batch-samples: must be at least 1"},
        {{"--temperature", "-1"}, "flag --temperature: must be a finite number >= 0"},
        {{"--top-k", "-1"}, "flag --top-k: must not be negative (0: off)"},
        {{"--top-p", "0"}, "flag --top-p: must be in (0, 1]"},
        {{"--top-p", "1.1"}, "flag --top-p: must be in (0, 1]"},
        {{"--eval", "h", "--eval-every", "-1"}, "flag --eval-every: must not be negative (0: at the end only)"},
        {{"--eval-every", "5"}, "flag --eval: --eval-every and --eval-report need an --eval file"},
        {{"--eval-report", "r"}, "flag --eval: --eval-every and --eval-report need an --eval file"},
    });
}

// The first failing check is the one reported, in the order of the usage text.
TEST(first_error_wins) {
    check_refusals({
        {{"-c", "-1", "-b", "0"}, "flag -b: batch size must be positive"},
        {{"-v", "-1", "-l", "-1"}, "flag -l: learning rate must not be negative"},
    });
}

TEST(bundled_files_found_for_training_only) {
    TrainArgs a;
    CHECK(parse({}, &a) == "");
    args_find_bundled_files(&a);
    CHECK(a.train_pattern == TINY_SHAKESPEARE_TRAIN && a.val_pattern == TINY_SHAKESPEARE_VAL);
    CHECK(a.tokenizer == GPT2_VOCABULARY);
    CHECK(parse({"--prompt", "x"}, &a) == "");
    args_find_bundled_files(&a);
    CHECK(a.train_pattern.empty() && a.val_pattern.empty() && a.tokenizer == GPT2_VOCABULARY);
    CHECK(parse({"-i", "mine.bin"}, &a) == "");
    args_find_bundled_files(&a);
    CHECK(a.train_pattern == "mine.bin" && a.val_pattern == TINY_SHAKESPEARE_VAL);
    CHECK(expect_exit_failure([] {
        TrainArgs missing;
        parse({"--tokenizer", "/nonexistent/v.json"}, &missing);
        args_find_bundled_files(&missing);
    }, "--tokenizer /nonexistent/v.json: No such file or directory"));
}

TEST(parse_or_fail_exits_with_the_error) {
    char* argv[] = {(char*)"train_gpt2_fp32", (char*)"-b", (char*)"0"};
    CHECK(expect_exit_failure([&] { args_parse_or_fail(3, argv, 1); }, "error: flag -b: batch size must be positive"));
}

// Every flag of the table, and each switch, is in the usage text (but the test hook --debug-nan-step).
TEST(usage_names_every_flag) {
    FILE* out = tmpfile();
    args_print_usage(out);
    std::string usage(ftell(out), '\0');
    rewind(out);
    CHECK(fread(&usage[0], 1, usage.size(), out) == usage.size());
    fclose(out);
    TrainArgs a;
    std::vector<std::string> names = {"-h", "--force", "--show-ids", "--gpus", "-ng"};
    for (const Flag& flag : args_flags(&a)) {
        if (strcmp(flag.name, "--debug-nan-step") != 0) { names.push_back(flag.name); }
    }
    for (const std::string& name : names) {
        bool named = usage.find("  " + name + " ") != std::string::npos || usage.find(" " + name + " ") != std::string::npos;
        if (!named) { fprintf(stderr, "  the usage text does not name %s\n", name.c_str()); }
        CHECK(named);
    }
    CHECK(usage.find("(default 6)") != std::string::npos);  // -sg's default, printed from SPIKE_Z_DEFAULT
}

// A resumed run's flags against the saved ones: the first differing field's flag, bit for bit.
TEST(resume_mismatch_names_the_flag) {
    RunShape saved = args_default_shape(), current = saved;
    CHECK(run_shape_mismatch(saved, current) == nullptr);
    auto flag_of = [&](auto change) {
        current = saved;
        change(&current);
        const char* flag = run_shape_mismatch(saved, current);
        return std::string(flag == nullptr ? "" : flag);
    };
    CHECK(flag_of([](RunShape* r) { r->lr = 1e-3f; }) == "-l");
    CHECK(flag_of([](RunShape* r) { r->schedule = SCHEDULE_LINEAR; }) == "-k");
    CHECK(flag_of([](RunShape* r) { r->seed = 7; }) == "--seed");
    CHECK(flag_of([](RunShape* r) { r->spike_window = 32; }) == "--spike-window");
    CHECK(flag_of([](RunShape* r) { r->weight_decay = -0.0f; }) == "-c");  // equal to 0.0f, other bits
    CHECK(flag_of([](RunShape* r) { r->attention = ATTENTION_RELU; }) == "");  // the model file's, checked there
}

TEST_MAIN()
