"""Checks ./hf_convert against transformers (CPU is enough; run by `make test-hf`):
  - a transformers GPT-2 saved with save_pretrained (F32 and BF16), and one with the hub's key
    spelling and mask buffers, imports into a model file whose tensors equal the originals
    (Conv1D weights transposed, vocabulary padded), checked by this script's own mapping;
  - import then export gives back byte-identical F32 tensors;
  - the export loads in GPT2LMHeadModel with no missing or unexpected weights and gives the same
    logits as the original model; AutoTokenizer on it encodes the tokenizer test vectors exactly
    as our tokenizer (tiktoken's ids);
  - a ReLU-attention export is refused by stock transformers instead of running as softmax;
  - config fields the trainer cannot honour are refused, naming the field.
On a GPU (./train_gpt2_fp32 and ./test_gpt2_fp32 built), the trainer against transformers, through
classic debug states (version 2) that this script writes from transformers' own forward and
backward pass (FP32 matmuls, eager attention):
  - save_pretrained models (random init, GPT-2 124M's shape and a small one, F32 and BF16) given
    to the test binary as -m DIR: logits, loss and every gradient as test_gpt2_fp32's FP32
    tolerances demand (loss within 2e-5 nats);
  - a model fine-tuned here from a save_pretrained directory (-e DIR) for a few steps, exported
    with hf_convert, gives transformers the logits, loss and gradients of our model file.
With --make-fixture DIR it writes the small committed fixture instead (a tiny GPT-2 as
transformers saves it, and its classic model-file twin) for the CPU test (dev/test/test_hf.cpp).
Prints SKIPPED where torch or transformers is missing.
"""
import argparse
import copy
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel
except ImportError as missing:
    print(f"SKIPPED (no {missing.name}): Hugging Face interop test")
    sys.exit(0)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONVERT = os.path.join(REPO, "hf_convert")
TRAIN = os.path.join(REPO, "train_gpt2_fp32")
TEST = os.path.join(REPO, "test_gpt2_fp32")
PER_LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
             "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
             "mlp.c_proj.weight", "mlp.c_proj.bias"]
CONV1D = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(f"{'ok   ' if ok else 'FAIL '} {name}{'' if ok else ': ' + detail}")
    passed, failed = passed + ok, failed + (not ok)


def convert(*args, expect_ok=True):
    result = subprocess.run([CONVERT, *args], capture_output=True, text=True)
    if expect_ok and result.returncode != 0:
        raise RuntimeError(f"hf_convert {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def tiny_config(vocab=50257, positions=64):
    return GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=64, n_layer=2, n_head=2)


def read_model_file(path):
    """Our own reading of the classic model file: header, then the 16 tensors in order."""
    with open(path, "rb") as f:
        header = struct.unpack("256i", f.read(1024))
        values = np.frombuffer(f.read(), dtype=np.float32)
    max_t, vocab, layers, heads, channels, padded = header[2:8]
    return header, vocab, padded, layers, channels, max_t, values


def expected_model_file(state, layers, channels, padded):
    """The flat parameters a model file holds for a transformers state dict (F32 numpy)."""
    get = lambda name: state[name] if name in state else state["transformer." + name]
    wte = get("wte.weight")
    parts = [np.concatenate([wte, np.zeros((padded - wte.shape[0], channels), np.float32)]), get("wpe.weight")]
    for name in PER_LAYER:
        for layer in range(layers):
            tensor = get(f"h.{layer}.{name}")
            parts.append(tensor.T if name in CONV1D else tensor)
    parts += [get("ln_f.weight"), get("ln_f.bias")]
    return np.concatenate([np.ascontiguousarray(p).ravel() for p in parts])


def state_of(model):
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def make_fixture(out_dir):
    """A tiny GPT-2 (V=256, so a few hundred KB) as save_pretrained writes it, and its model file."""
    torch.manual_seed(1)
    model = GPT2LMHeadModel(tiny_config(vocab=256, positions=32))
    model.save_pretrained(out_dir)
    state = state_of(model)
    values = expected_model_file(state, 2, 64, 256)
    header = [20240326, 3, 32, 256, 2, 2, 64, 256, 0] + [0] * 247
    with open(os.path.join(out_dir, "..", "hf_tiny_model.bin"), "wb") as f:
        f.write(struct.pack("256i", *header))
        f.write(values.astype(np.float32).tobytes())
    print(f"wrote {out_dir} and its twin hf_tiny_model.bin")


def test_import_export(work):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_config()).eval()
    f32_dir, bf16_dir, hub_dir = (os.path.join(work, n) for n in ("f32", "bf16", "hub"))
    model.save_pretrained(f32_dir)
    state = state_of(model)
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    bf16.save_pretrained(bf16_dir)
    # the hub's spelling: no "transformer." prefix, the attention mask buffers kept
    os.makedirs(hub_dir)
    shutil.copy(os.path.join(f32_dir, "config.json"), hub_dir)
    hub = {k.removeprefix("transformer."): v for k, v in load_file(os.path.join(f32_dir, "model.safetensors")).items()}
    for layer in range(2):
        hub[f"h.{layer}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        hub[f"h.{layer}.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(hub, os.path.join(hub_dir, "model.safetensors"), metadata={"format": "pt"})

    for name, src, reference in [("F32", f32_dir, state), ("hub keys + buffers", hub_dir, state),
                                 ("BF16", bf16_dir, state_of(bf16))]:
        out = os.path.join(work, f"imported_{name[:3]}.bin")
        convert("import", src, out)
        header, vocab, padded, layers, channels, max_t, values = read_model_file(out)
        expected = expected_model_file(reference, layers, channels, padded)
        check(f"import {name}: shape (V={vocab} Vp={padded} L={layers} C={channels} maxT={max_t})",
              (vocab, padded, layers, channels, max_t) == (50257, 50304, 2, 64, 64))
        check(f"import {name}: every tensor equal", values.shape == expected.shape and np.array_equal(values, expected))
    convert("import", os.path.join(f32_dir, "model.safetensors"), os.path.join(work, "from_file.bin"))
    check("import from model.safetensors with config.json beside it",
          open(os.path.join(work, "from_file.bin"), "rb").read() == open(os.path.join(work, "imported_F32.bin"), "rb").read())

    export_dir = os.path.join(work, "export")
    convert("export", os.path.join(work, "imported_F32.bin"), export_dir)
    original = load_file(os.path.join(f32_dir, "model.safetensors"))
    exported = load_file(os.path.join(export_dir, "model.safetensors"))
    same = set(original) == set(exported) and all(original[k].dtype == exported[k].dtype and
                                                 original[k].tobytes() == exported[k].tobytes() for k in original)
    check("round trip HF -> ours -> HF: byte-identical F32 tensors", same,
          f"keys only in one: {sorted(set(original) ^ set(exported))[:4]}")

    loaded, info = GPT2LMHeadModel.from_pretrained(export_dir, output_loading_info=True)
    check("export loads with no missing or unexpected weights",
          not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], str(info))
    batch = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = model.eval()(batch).logits, loaded.eval()(batch).logits
    check("export gives the original logits", torch.equal(a, b), f"max diff {(a - b).abs().max().item()}")

    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    text = open(os.path.join(REPO, "dev", "test", "vectors", "tokenizer_text.txt"), encoding="utf-8", newline="").read()
    ids = [int(x) for x in open(os.path.join(REPO, "dev", "test", "vectors", "tokenizer_ids.txt")).read().split()]
    got = tokenizer.encode(text, split_special_tokens=True)  # "<|endoftext|>" in the text is text, as in ours
    check(f"AutoTokenizer ({type(tokenizer).__name__}) on the export encodes the test vectors exactly",
          got == ids, f"{len(got)} ids against {len(ids)}")
    check("AutoTokenizer knows <|endoftext|> as the special token 50256", tokenizer.encode("<|endoftext|>") == [50256])
    check("AutoTokenizer decodes them back", tokenizer.decode(ids) == text)
    return os.path.join(work, "imported_F32.bin")


def test_relu_and_refusals(work, model_file):
    relu = os.path.join(work, "relu.bin")
    data = bytearray(open(model_file, "rb").read())
    data[32:36] = struct.pack("i", 1)  # header slot 8: ReLU attention
    open(relu, "wb").write(data)
    relu_dir = os.path.join(work, "relu_export")
    convert("export", relu, relu_dir)
    config = json.load(open(os.path.join(relu_dir, "config.json")))
    check("ReLU export names its attention", config["model_type"] == "gpt2fp32_relu" and config["attention"] == "relu")
    try:
        AutoModelForCausalLM.from_pretrained(relu_dir)
        check("stock transformers refuses the ReLU export", False, "it loaded")
    except (ValueError, KeyError, OSError):
        check("stock transformers refuses the ReLU export", True)
    convert("import", relu_dir, os.path.join(work, "relu_back.bin"))
    check("ReLU round trip keeps the attention kind", open(os.path.join(work, "relu_back.bin"), "rb").read() == bytes(data))

    base = os.path.join(work, "export")
    for field, value in [("activation_function", "relu"), ("layer_norm_epsilon", 1e-6),
                         ("scale_attn_by_inverse_layer_idx", True), ("reorder_and_upcast_attn", True),
                         ("n_inner", 100), ("model_type", "llama")]:
        bad = os.path.join(work, f"bad_{field}")
        shutil.copytree(base, bad)
        config = json.load(open(os.path.join(bad, "config.json")))
        config[field] = value
        json.dump(config, open(os.path.join(bad, "config.json"), "w"))
        result = convert("import", bad, os.path.join(work, "bad.bin"), expect_ok=False)
        check(f"config {field} = {value!r} refused", result.returncode != 0 and field in result.stderr,
              result.stderr.strip())
    untied = os.path.join(work, "untied")
    shutil.copytree(base, untied)
    tensors = load_file(os.path.join(untied, "model.safetensors"))
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1.0
    save_file(tensors, os.path.join(untied, "model.safetensors"), metadata={"format": "pt"})
    result = convert("import", untied, os.path.join(work, "bad.bin"), expect_ok=False)
    check("an output layer that differs from wte refused", result.returncode != 0 and "lm_head" in result.stderr,
          result.stderr.strip())


def write_classic_state(path, model, batch, padded_vocab):
    """The classic debug state (version 2) of a transformers GPT-2 on batch (B, T+1): the inputs,
    targets, logits (B, T, V), the mean cross-entropy and every gradient in model-file order."""
    device = "cuda"
    model = model.float().to(device).eval()  # eval: no dropout; the gradients are still computed
    model.zero_grad(set_to_none=True)
    inputs, targets = batch[:, :-1].to(device), batch[:, 1:].to(device)
    logits = model(inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    grads = {name: p.grad.detach().cpu().numpy() for name, p in model.named_parameters()}
    cfg = model.config
    flat_grads = expected_model_file(grads, cfg.n_layer, cfg.n_embd, padded_vocab)
    B, T = inputs.shape
    with open(path, "wb") as f:
        f.write(struct.pack("256i", 20240327, 2, B, T, *([0] * 252)))
        f.write(inputs.cpu().numpy().astype("<i4").tobytes())
        f.write(targets.cpu().numpy().astype("<i4").tobytes())
        f.write(logits.detach().cpu().numpy().astype("<f4").tobytes())
        f.write(np.array([loss.item()], dtype="<f4").tobytes())
        f.write(flat_grads.astype("<f4").tobytes())
    return loss.item()


def run_test_binary(name, model_path, state_path):
    """test_gpt2_fp32 in full FP32 on a model and a state; prints its table's loss and worst rows."""
    result = subprocess.run([TEST, "-f", "0", "-m", model_path, "-s", state_path], capture_output=True, text=True)
    rows = [(line[:22].strip(), *map(float, line[22:].split()[:3])) for line in result.stdout.splitlines()
            if line.startswith(("logits", "loss", "grad "))]  # check, scale, error, tolerance
    grads = [row for row in rows if row[0].startswith("grad")]
    shown = [row for row in rows if row[0] in ("logits", "loss")] + [max(grads, key=lambda r: r[2] / r[3])] if grads else []
    for row, scale, error, tolerance in shown:
        print(f"      {row:<16} error {error:.3e} (tolerance {tolerance:.0e}, reference scale {scale:.3e})")
    check(name, result.returncode == 0 and "PASS" in result.stdout, (result.stdout + result.stderr)[-2000:])


def test_trainer_against_transformers(work):
    torch.set_float32_matmul_precision("highest")
    batch_gen = torch.Generator().manual_seed(5)
    shapes = [("GPT-2 124M shape", GPT2Config(attn_implementation="eager")),
              ("small shape", GPT2Config(vocab_size=50257, n_positions=128, n_embd=128, n_layer=2, n_head=4,
                                         attn_implementation="eager"))]
    for shape_name, config in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(2)
            model = GPT2LMHeadModel(config)
            name = f"{shape_name} {str(dtype).split('.')[-1]}"
            model_dir = os.path.join(work, name.replace(" ", "_"))
            model.to(dtype).save_pretrained(model_dir)
            batch = torch.randint(0, config.vocab_size, (4, 65), generator=batch_gen)
            state = os.path.join(work, "state.bin")
            write_classic_state(state, model, batch, padded_vocab=50304)
            run_test_binary(f"{name} from save_pretrained: logits, loss and gradients as transformers'", model_dir, state)

    # fine-tune from a save_pretrained directory, export, and check the export against ours
    torch.manual_seed(3)
    model = GPT2LMHeadModel(shapes[1][1])
    pretrained, out, export = (os.path.join(work, n) for n in ("pretrained", "finetune", "finetuned_export"))
    model.save_pretrained(pretrained)
    result = subprocess.run([TRAIN, "-e", pretrained, "-b", "4", "-t", "64", "-x", "5", "-l", "1e-3", "-f", "0",
                             "-v", "0", "-s", "0", "-n", "5", "-o", out, "--force"], capture_output=True, text=True)
    check("train_gpt2_fp32 -e fine-tunes a save_pretrained directory", result.returncode == 0, result.stderr[-1000:])
    if result.returncode != 0:
        return
    trained = os.path.join(out, "model_00000005.bin")
    convert("export", trained, export)
    exported, info = GPT2LMHeadModel.from_pretrained(export, output_loading_info=True, attn_implementation="eager")
    check("the fine-tuned export loads with no missing or unexpected weights",
          not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], str(info))
    state = os.path.join(work, "finetuned_state.bin")
    write_classic_state(state, exported, torch.randint(0, 50257, (4, 65), generator=batch_gen), padded_vocab=50304)
    run_test_binary("fine-tuned model file against its export in transformers: logits, loss, gradients", trained, state)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make-fixture", metavar="DIR")
    args = parser.parse_args()
    if args.make_fixture:
        make_fixture(args.make_fixture)
        return
    if not os.path.exists(CONVERT):
        sys.exit(f"error: {CONVERT} is missing: run make hf_convert")
    with tempfile.TemporaryDirectory() as work:
        model_file = test_import_export(work)
        test_relu_and_refusals(work, model_file)
        if not (os.path.exists(TRAIN) and os.path.exists(TEST)):
            print("SKIPPED (train_gpt2_fp32 or test_gpt2_fp32 not built): trainer against transformers")
        elif not torch.cuda.is_available():
            print("SKIPPED (no GPU): trainer against transformers")
        else:
            test_trainer_against_transformers(work)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
