// CPU tests of llmc/gpt2_hf.h, GPT-2 between the classic model file and Hugging Face's format:
// the committed fixture (a tiny GPT-2 as transformers' save_pretrained wrote it, and its model-file
// twin written by dev/test/test_hf.py's own mapping) imports bit for bit; export then import gives
// the same parameters and the fixture's own tensors back; config fields and tensors this trainer
// cannot honour are refused naming them; merges.txt derived from the bundled vocabulary starts as
// GPT-2's does. Run from the repository root.
#include <string>
#include <vector>

#include "dev/test/files.h"
#include "dev/test/testing.h"
#include "llmc/gpt2_hf.h"

constexpr const char* FIXTURE_DIR = "dev/test/fixtures/hf_tiny";
constexpr const char* FIXTURE_TWIN = "dev/test/fixtures/hf_tiny_model.bin";

// A file of the fixture directory.
static std::string fixture_file(const char* name) { return std::string(FIXTURE_DIR) + "/" + name; }

static bool same_model(const ModelShape& a, const std::vector<float>& pa, const ModelShape& b,
                       const std::vector<float>& pb) {
    return memcmp(&a, &b, sizeof(a)) == 0 && pa.size() == pb.size() &&
           memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0;
}

TEST(fixture_imports_bit_for_bit) {
    ModelShape twin_shape, shape;
    std::vector<float> twin, params;
    model_file_read(FIXTURE_TWIN, &twin_shape, &twin);
    gpt2_from_hf(FIXTURE_DIR, &shape, &params);
    CHECK(shape.num_layers == 2 && shape.channels == 64 && shape.vocab_size == 256 && shape.padded_vocab_size == 256);
    CHECK(same_model(shape, params, twin_shape, twin));
    gpt2_from_hf(fixture_file("model.safetensors").c_str(), &shape, &params);  // the file, config.json beside it
    CHECK(same_model(shape, params, twin_shape, twin));
}

TEST(export_then_import_round_trip) {
    ModelShape shape, back_shape;
    std::vector<float> params, back;
    model_file_read(FIXTURE_TWIN, &shape, &params);
    std::string dir = make_temp_dir("test_hf");
    gpt2_to_hf(dir.c_str(), &shape, params.data(), NULL);
    gpt2_from_hf(dir.c_str(), &back_shape, &back);
    CHECK(same_model(shape, params, back_shape, back));
    // every tensor of the fixture comes back with the same bytes
    SafeFile original, exported;
    std::string exported_path = dir + "/model.safetensors";
    safetensors_open(fixture_file("model.safetensors").c_str(), &original);
    safetensors_open(exported_path.c_str(), &exported);
    CHECK(original.tensors.size() == exported.tensors.size());
    for (const SafeTensor& t : original.tensors) {
        const SafeTensor* e = safetensors_find(&exported, t.name.c_str());
        CHECK(e != NULL && e->shape == t.shape && e->dtype == t.dtype);
        if (e == NULL || e->shape != t.shape) { continue; }
        std::vector<float> a(safetensors_numel(&t)), b(a.size());
        safetensors_read_f32(fixture_file("model.safetensors").c_str(), &original, &t, a.data());
        safetensors_read_f32(exported_path.c_str(), &exported, e, b.data());
        CHECK(memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
    remove_dir(dir);
}

// Importing the model in dir fails saying `message`; dir is removed.
static bool import_refused(const std::string& dir, const char* message) {
    bool refused = expect_exit_failure([&] {
        ModelShape shape;
        std::vector<float> params;
        gpt2_from_hf(dir.c_str(), &shape, &params);
    }, message);
    remove_dir(dir);
    return refused;
}

// A copy of the fixture with config.json's `from` replaced by `to`; import must fail saying `message`.
static bool config_refused(const char* from, const char* to, const char* message) {
    std::string dir = make_temp_dir("test_hf");
    std::string config = read_file(fixture_file("config.json").c_str());
    size_t at = config.find(from);
    if (at == std::string::npos) { fail("the fixture's config.json has no %s", from); }
    write_file(dir + "/config.json", config.replace(at, strlen(from), to));
    write_file(dir + "/model.safetensors", read_file(fixture_file("model.safetensors").c_str()));
    return import_refused(dir, message);
}

TEST(config_fields_it_cannot_honour_are_refused) {
    CHECK(config_refused("\"gelu_new\"", "\"relu\"", "field activation_function = \"relu\" is not supported"));
    CHECK(config_refused("\"layer_norm_epsilon\": 1e-05", "\"layer_norm_epsilon\": 1e-06", "field layer_norm_epsilon"));
    CHECK(config_refused("\"scale_attn_by_inverse_layer_idx\": false", "\"scale_attn_by_inverse_layer_idx\": true",
                         "field scale_attn_by_inverse_layer_idx = true is not supported"));
    CHECK(config_refused("\"reorder_and_upcast_attn\": false", "\"reorder_and_upcast_attn\": true",
                         "field reorder_and_upcast_attn = true"));
    CHECK(config_refused("\"n_inner\": null", "\"n_inner\": 100", "field n_inner = 100 is not supported"));
    CHECK(config_refused("\"model_type\": \"gpt2\"", "\"model_type\": \"llama\"", "field model_type = \"llama\""));
    CHECK(config_refused("\"n_embd\"", "\"n_embed\"", "field n_embd is missing"));
    CHECK(config_refused("\"n_layer\": 2", "\"n_layer\": 3", "tensor transformer.h.2.ln_1.weight is missing"));
    CHECK(config_refused("\"n_layer\": 2", "\"n_layer\": -2", "field n_layer must be a positive integer"));
    CHECK(config_refused("{", "[", "bad JSON at byte"));
}

// The fixture with its tensors rewritten by `edit`; import must fail saying `message`.
template <typename Edit>
static bool tensors_refused(Edit edit, const char* message) {
    SafeFile file;
    safetensors_open(fixture_file("model.safetensors").c_str(), &file);
    std::vector<std::vector<float>> values;
    std::vector<SafeTensorOut> tensors;
    values.reserve(file.tensors.size() + 1);
    for (const SafeTensor& t : file.tensors) {
        values.emplace_back(safetensors_numel(&t));
        safetensors_read_f32(fixture_file("model.safetensors").c_str(), &file, &t, values.back().data());
        tensors.push_back({t.name, t.shape, values.back().data()});
    }
    edit(&tensors, &values);
    std::string dir = make_temp_dir("test_hf");
    write_file(dir + "/config.json", read_file(fixture_file("config.json").c_str()));
    safetensors_write_f32((dir + "/model.safetensors").c_str(), tensors, {{"format", "pt"}});
    return import_refused(dir, message);
}

TEST(tensors_it_cannot_use_are_refused) {
    typedef std::vector<SafeTensorOut> Tensors;
    typedef std::vector<std::vector<float>> Values;
    auto named = [](Tensors* t, const char* name) {
        for (SafeTensorOut& out : *t) {
            if (out.name == name) { return &out; }
        }
        fail("the fixture has no %s", name);
    };
    CHECK(tensors_refused([&](Tensors* t, Values*) { t->erase(t->begin() + 3); }, "is missing"));
    CHECK(tensors_refused([&](Tensors* t, Values*) { named(t, "transformer.h.1.mlp.c_fc.weight")->shape = {256, 64}; },
                          "tensor transformer.h.1.mlp.c_fc.weight has shape (256, 64), expected (64, 256)"));
    CHECK(tensors_refused([&](Tensors* t, Values*) { named(t, "transformer.ln_f.bias")->name = "transformer.ln_x.bias"; },
                          "unexpected tensor transformer.ln_x.bias"));
    CHECK(tensors_refused([&](Tensors* t, Values* v) {
        v->emplace_back(256 * 64, 0.5f);
        t->push_back({"lm_head.weight", {256, 64}, v->back().data()});
    }, "lm_head.weight differs from wte"));
    // an output layer equal to wte, and the hub's mask buffers, are accepted
    std::string dir = make_temp_dir("test_hf");
    SafeFile file;
    safetensors_open(fixture_file("model.safetensors").c_str(), &file);
    std::vector<float> wte(256 * 64), mask(32 * 32, 1.0f);
    safetensors_read_f32(fixture_file("model.safetensors").c_str(), &file, safetensors_find(&file, "transformer.wte.weight"), wte.data());
    ModelShape shape;
    std::vector<float> params, twin;
    model_file_read(FIXTURE_TWIN, &shape, &twin);
    gpt2_to_hf(dir.c_str(), &shape, twin.data(), NULL);
    SafeFile exported;
    std::string path = dir + "/model.safetensors";
    safetensors_open(path.c_str(), &exported);
    std::vector<std::vector<float>> values;
    std::vector<SafeTensorOut> tensors;
    values.reserve(exported.tensors.size());
    for (const SafeTensor& t : exported.tensors) {
        values.emplace_back(safetensors_numel(&t));
        safetensors_read_f32(path.c_str(), &exported, &t, values.back().data());
        tensors.push_back({t.name.substr(strlen("transformer.")), t.shape, values.back().data()});  // the hub's keys
    }
    tensors.push_back({"lm_head.weight", {256, 64}, wte.data()});
    tensors.push_back({"h.0.attn.bias", {1, 1, 32, 32}, mask.data()});
    safetensors_write_f32(path.c_str(), tensors, {{"format", "pt"}});
    ModelShape back_shape;
    gpt2_from_hf(dir.c_str(), &back_shape, &params);
    CHECK(same_model(shape, twin, back_shape, params));
    remove_dir(dir);
}

TEST(merges_from_the_vocabulary) {
    Tokenizer tok;
    tokenizer_init(&tok, "dev/data/gpt2_encoder.json");
    uint32_t left, right;
    tokenizer_merge_pair(&tok, 256, &left, &right);  // GPT-2's first merge: " t"
    CHECK(left == 220 && right == 83);
    ModelShape shape = {.max_seq_len = 8, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = 1,
                        .num_heads = 1, .channels = 32, .attention = ATTENTION_SOFTMAX};
    std::vector<float> params(count_parameters(&shape), 0.25f);
    std::string dir = make_temp_dir("test_hf");
    gpt2_to_hf(dir.c_str(), &shape, params.data(), &tok);
    std::string merges = read_file(dir + "/merges.txt");
    CHECK(merges.rfind("#version: 0.2\n\xC4\xA0 t\n\xC4\xA0 a\nh e\ni n\nr e\no n\n\xC4\xA0t he\n", 0) == 0);
    size_t lines = 0;
    for (char c : merges) { lines += c == '\n'; }
    CHECK(lines == 1 + 50000);
    JsonValue vocab;
    std::string text = read_file(dir + "/vocab.json");
    char error[256];
    CHECK(json_parse(text.data(), text.size(), &vocab, error, sizeof(error)) && vocab.keys.size() == 50257);
    const JsonValue* eot = vocab.find("<|endoftext|>");
    CHECK(eot != NULL && eot->integer == 50256);
    const JsonValue* space_t = vocab.find("\xC4\xA0t");
    CHECK(space_t != NULL && space_t->integer == 256);
    remove_dir(dir);
    tokenizer_free(&tok);
}

// The table of parameter tensors: GPT-2 124M's count, the exact formula, decay on the 2-D tensors only.
TEST(parameter_table_gives_gpt2_shapes) {
    ModelShape d12;
    std::string problem;
    CHECK(model_shape_by_name("d12", &d12, &problem) && problem.empty() && d12.num_heads == 12);
    CHECK(count_parameters(&d12) == 124475904);  // GPT-2 124M with the vocabulary padded to 50304
    for (const NamedShape& named : MODEL_SHAPES) {
        ModelShape shape;
        CHECK(model_shape_by_name(named.name, &shape, &problem) && problem.empty());
        CHECK(shape.num_layers == named.layers && shape.num_heads == named.heads && shape.channels == named.channels);
        CHECK(count_parameters(&shape) == model_file_exact_parameters(&shape) && model_shape_problem(&shape).empty());
    }
    for (const ParameterTensor& t : PARAMETER_TENSORS) { CHECK(t.decayed == (t.cols != DIM_ONE)); }
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(&d12, sizes);
    CHECK(sizes[0] == 50304u * 768 && sizes[4] == 12u * 3 * 768 * 768 && sizes[15] == 768);
}

// d6 and the custom form L<layers>C<channels>H<heads>; names that are not shapes are files.
TEST(shapes_by_name) {
    ModelShape d6, custom;
    std::string problem;
    CHECK(model_shape_by_name("d6", &d6, &problem) && problem.empty());
    CHECK(d6.num_layers == 6 && d6.channels == 384 && d6.num_heads == 6 && d6.attention == ATTENTION_SOFTMAX);
    CHECK(count_parameters(&d6) == 30357504);  // 6 layers of 12 C^2 + 13 C, 50304 + 1024 embedding rows, 2 C
    CHECK(model_shape_by_name("L6C384H6", &custom, &problem) && problem.empty());
    CHECK(memcmp(&custom, &d6, sizeof(d6)) == 0);
    CHECK(model_shape_by_name("L2C128H4", &custom, &problem) && problem.empty() && custom.num_heads == 4);
    CHECK(model_shape_by_name("L256C2048H16", &custom, &problem) && problem.empty());
    for (const char* file : {"d13", "d", "L6C384", "L6C384H6x", "l6c384h6", "L6C384H", "LC384H6", "L1234567C64H1",
                             "L6 C384H6", "model.bin", ""}) {
        CHECK(!model_shape_by_name(file, &custom, &problem));
    }
}

// Named shapes the kernels cannot run: one line naming every limit.
TEST(bad_shapes_name_the_limits) {
    const char* limits = "the trainer runs 1 <= L <= 256, C <= 2048 a multiple of 4 and of NH, head size C/NH 32, 64 or 128";
    ModelShape shape;
    for (const char* bad : {"L0C384H6", "L257C384H6", "L6C384H5", "L6C384H4", "L6C96H1", "L6C4096H32", "L6C0H1",
                            "L6C384H0", "L6C200H1", "L6C66H2"}) {
        std::string problem;
        CHECK(model_shape_by_name(bad, &shape, &problem) && problem.find(limits) != std::string::npos);
    }
    std::string problem;
    CHECK(model_shape_by_name("L6C384H5", &shape, &problem) && problem == std::string("L=6 C=384 NH=5: ") + limits);
}

// The Hugging Face export carries a small shape: config.json's n_layer, n_head, n_embd read back.
TEST(hf_export_carries_d6) {
    ModelShape d6, back;
    std::string problem;
    CHECK(model_shape_by_name("L2C128H4", &d6, &problem));
    d6.vocab_size = 300, d6.padded_vocab_size = 384, d6.max_seq_len = 64, d6.attention = ATTENTION_RELU;
    std::vector<float> params(count_parameters(&d6));
    for (size_t i = 0; i < params.size(); i++) { params[i] = (float)(i % 97) * 0.01f; }
    float* wte_padding = params.data() + (size_t)d6.vocab_size * d6.channels;  // read back as zeros
    std::fill(wte_padding, params.data() + (size_t)d6.padded_vocab_size * d6.channels, 0.0f);
    std::string dir = make_temp_dir("test_hf");
    gpt2_to_hf(dir.c_str(), &d6, params.data(), nullptr);
    std::vector<float> read;
    gpt2_from_hf(dir.c_str(), &back, &read);
    CHECK(back.num_layers == 2 && back.channels == 128 && back.num_heads == 4 && back.attention == ATTENTION_RELU);
    CHECK(read == params);
    remove_dir(dir);
}

// Found by fuzzing: a header whose parameter count wraps to 0 in 64 bits (L = 2^31-1, C = 2^30).
TEST(model_file_with_an_overflowing_count_is_refused) {
    ModelShape shape;
    std::vector<float> params;
    CHECK(expect_exit_failure([&]() { model_file_read("dev/test/fuzz/model_file/overflowing_count.bin", &shape, &params); },
                              "over 2^40 parameters"));
}

TEST_MAIN()
