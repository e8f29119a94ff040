"""transformers' generate() speed on one of our model files, for scripts/bench_generate.sh: the
file's tensors as a GPT2LMHeadModel (FP32), greedy with the KV cache, every completion exactly
--new-tokens long, timed after one warm-up call. Prints, for each completion count, in full FP32
(TF32 off, PyTorch's default) and with TF32 matmuls:

    RESULT completions=M tf32=0|1 tok_per_s=Y
"""
import argparse
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from train_gpt2 import EOT, fail, gpt2_tokenizer, read_model_file  # noqa: E402

# Our per-layer tensors (stacked over layers) and their names in transformers.
LAYER_TENSORS = {"ln1w": "ln_1.weight", "ln1b": "ln_1.bias", "qkvw": "attn.c_attn.weight", "qkvb": "attn.c_attn.bias",
                 "attprojw": "attn.c_proj.weight", "attprojb": "attn.c_proj.bias", "ln2w": "ln_2.weight",
                 "ln2b": "ln_2.bias", "fcw": "mlp.c_fc.weight", "fcb": "mlp.c_fc.bias", "fcprojw": "mlp.c_proj.weight",
                 "fcprojb": "mlp.c_proj.bias"}


def gpt2_from_model_file(path, device):
    cfg, tensors = read_model_file(path)
    if cfg.attn != "softmax":
        fail(f"{path}: transformers' GPT-2 has softmax attention only, the file has {cfg.attn}")
    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.channels,
                        n_layer=cfg.num_layers, n_head=cfg.num_heads)
    state = {"transformer.wte.weight": tensors["wte"], "lm_head.weight": tensors["wte"],
             "transformer.wpe.weight": tensors["wpe"], "transformer.ln_f.weight": tensors["lnfw"],
             "transformer.ln_f.bias": tensors["lnfb"]}
    for ours, theirs in LAYER_TENSORS.items():
        for layer, tensor in enumerate(tensors[ours]):
            # Conv1D weights are (in, out), ours (out, in)
            state[f"transformer.h.{layer}.{theirs}"] = tensor.T if tensor.dim() == 2 else tensor
    with torch.device(device):  # random init on the device, fast, then overwritten
        model = GPT2LMHeadModel(config)
    model.load_state_dict(state)
    return model.eval()


def tokens_per_s(model, prompt, completions, new_tokens):
    inputs = torch.tensor([prompt] * completions, device=model.device)
    settings = dict(attention_mask=torch.ones_like(inputs), do_sample=False, use_cache=True, pad_token_id=EOT,
                    max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    model.generate(inputs, **settings)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    output = model.generate(inputs, **settings)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    assert output.shape == (completions, len(prompt) + new_tokens)
    return completions * new_tokens / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_file")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--completions", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    model = gpt2_from_model_file(args.model_file, "cuda")
    prompt = gpt2_tokenizer().encode_ordinary(args.prompt)
    print(f"{model.config.n_layer} layers, {len(prompt)} prompt tokens, {args.new_tokens} new tokens, "
          f"attention {model.config._attn_implementation}")
    for completions in args.completions:
        for tf32 in (0, 1):
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
            rate = tokens_per_s(model, prompt, completions, args.new_tokens)
            print(f"RESULT completions={completions} tf32={tf32} tok_per_s={rate:.1f}", flush=True)


if __name__ == "__main__":
    main()
