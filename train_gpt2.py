#!/usr/bin/env python3
"""PyTorch reference for gpt2fp32: the same GPT-2 (softmax or ReLU attention), in FP32.

Reference mode builds (or loads) a model, writes it as a model file, runs a few AdamW
steps on one batch and writes a debug state file (logits, loss, gradients, step losses and norms)
that the CUDA trainer's tests compare against. It always computes attention explicitly,
with TF32 off, so the numbers are true FP32.

    python train_gpt2.py --device cpu --layers 2 --heads 2 --channels 128 --vocab 1000 \
        --max-seq-len 64 --batch 4 --seq-len 64 --attn relu \
        --write-model model.bin --write-state state.bin

Training mode trains on token shards and reports the speed of PyTorch itself, as the
peer the CUDA trainer is benchmarked against:

    python train_gpt2.py --model d12 --train-shards 'data/*_train_*.bin' \
        --batch 8 --seq-len 1024 --steps 50 --compile --flash --tf32

Started by torchrun, training mode is data-parallel (DistributedDataParallel, NCCL on CUDA, gloo
on the CPU): --batch rows per process, each taking its own rows of one global batch, and rank 0
reports the global throughput:

    torchrun --standalone --nproc_per_node 8 train_gpt2.py --model d12 --train-shards ... --batch 8

Generation and evaluation mode is the reference for the trainer's greedy generation and its
HellaSwag-style evaluation, in the same true FP32 (needs tiktoken; the tokenizer is built from the bundled
encoder.json, no download): a greedy completion of a prompt, printed as its generated ids, and
the mean loss of each of four endings of every example, written as a per-example report:

    python train_gpt2.py --init-from model.bin --generate 40 --prompt "The meaning of life is"
    python train_gpt2.py --init-from model.bin --eval examples.jsonl --seq-len 128 --eval-report report.txt
"""

import argparse
import glob
import json
import math
import os
import re
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

MODEL_MAGIC = 20240326
STATE_MAGIC = 20240327
SHARD_MAGIC = 20240520
MODEL_VERSION = 3
STATE_VERSION = 4
CLASSIC_STATE_VERSION = 2  # the classic gpt2_124M_debug_state.bin: no optimizer steps
SHARD_VERSION = 1
HEADER_INTS = 256
ATTN_KINDS = ("softmax", "relu")  # index = the attention kind stored in file headers
LR_SCHEDULES = ("cosine", "linear", "constant")  # index = the schedule stored in state headers
LAYERNORM_EPS = 1e-5
INIT_STD = 0.02

REPO = os.path.dirname(os.path.abspath(__file__))
# GPT-2's tokenizer: the bundled vocabulary, tiktoken's pre-tokenization pattern, <|endoftext|>.
GPT2_ENCODER = os.path.join(REPO, "dev", "data", "gpt2_encoder.json")
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256  # <|endoftext|>

# --model's shapes: the trainer's -e table (MODEL_SHAPES in llmc/model_file.h, read from there) or
# the custom form L<layers>C<channels>H<heads>; GPT-2's vocabulary and maxT.
MODEL_SHAPES_FILE = os.path.join(REPO, "llmc", "model_file.h")
PRESET_VOCAB = 50257
PRESET_MAX_SEQ_LEN = 1024

# Parameter groups by name (stacked over layers: ln1w holds every layer's ln1 weight).
DECAYED_PARAMS = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
RESIDUAL_PROJECTIONS = {"attprojw", "fcprojw"}
LAYERNORM_WEIGHTS = {"ln1w", "ln2w", "lnfw"}


def fail(message):
    raise SystemExit(f"error: {message}")


@dataclass(frozen=True)
class GPTConfig:
    max_seq_len: int
    vocab_size: int
    padded_vocab_size: int
    num_layers: int
    num_heads: int
    channels: int
    attn: str  # one of ATTN_KINDS

    def validate(self):
        if min(self.max_seq_len, self.vocab_size, self.num_layers, self.num_heads, self.channels) <= 0:
            fail(f"every model dimension must be positive: {self}")
        if self.channels % self.num_heads != 0:
            fail(f"channels {self.channels} is not a multiple of heads {self.num_heads}")
        if self.padded_vocab_size < self.vocab_size:
            fail(f"padded vocab {self.padded_vocab_size} is smaller than vocab {self.vocab_size}")
        if self.attn not in ATTN_KINDS:
            fail(f"unknown attention kind {self.attn!r}")


def round_up_vocab(vocab_size):
    return (vocab_size + 127) // 128 * 128


def parameter_shapes(cfg):
    """(name, shape) of every parameter in model-file order; wte has V rows here, Vp in files."""
    L, C = cfg.num_layers, cfg.channels
    return [
        ("wte", (cfg.vocab_size, C)),
        ("wpe", (cfg.max_seq_len, C)),
        ("ln1w", (L, C)),
        ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)),
        ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)),
        ("attprojb", (L, C)),
        ("ln2w", (L, C)),
        ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)),
        ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)),
        ("fcprojb", (L, C)),
        ("lnfw", (C,)),
        ("lnfb", (C,)),
    ]


# ----------------------------------------------------------------------------
# Model


def causal_attention(q, k, v, attn, use_sdpa):
    """Attention of (B, NH, T, hs) queries over keys s <= t; returns (B, NH, T, hs)."""
    if attn == "softmax" and use_sdpa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T, head_size = q.size(-2), q.size(-1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_size)
    visible = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if attn == "softmax":
        weights = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    else:
        # ReLU attention: each row is divided by its number of visible keys, t + 1.
        visible_keys = torch.arange(1, T + 1, dtype=q.dtype, device=q.device).view(T, 1)
        weights = F.relu(scores).masked_fill(~visible, 0.0) / visible_keys
    return weights @ v


class GPT(nn.Module):
    """GPT-2 whose parameters are the model file's tensors, stacked over layers."""

    def __init__(self, cfg, use_sdpa=False):
        super().__init__()
        self.cfg = cfg
        self.use_sdpa = use_sdpa
        for name, shape in parameter_shapes(cfg):
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))

    def init_weights(self, seed):
        torch.manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.num_layers)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name in LAYERNORM_WEIGHTS:
                    param.fill_(1.0)
                elif name not in DECAYED_PARAMS:
                    param.zero_()  # biases, LayerNorm biases
                else:
                    param.normal_(0.0, residual_std if name in RESIDUAL_PROJECTIONS else INIT_STD)

    def attention(self, x, layer):
        B, T, C = x.shape
        num_heads = self.cfg.num_heads
        qkv = F.linear(x, self.qkvw[layer], self.qkvb[layer])
        q, k, v = (part.view(B, T, num_heads, C // num_heads).transpose(1, 2) for part in qkv.split(C, dim=-1))
        y = causal_attention(q, k, v, self.cfg.attn, self.use_sdpa)
        y = y.transpose(1, 2).reshape(B, T, C)
        return F.linear(y, self.attprojw[layer], self.attprojb[layer])

    def mlp(self, x, layer):
        hidden = F.gelu(F.linear(x, self.fcw[layer], self.fcb[layer]), approximate="tanh")
        return F.linear(hidden, self.fcprojw[layer], self.fcprojb[layer])

    def forward(self, inputs, targets=None):
        """(B, T) token ids -> (B, T, V) logits and the mean cross-entropy over all positions
        (None without targets)."""
        C = self.cfg.channels
        x = F.embedding(inputs, self.wte) + self.wpe[: inputs.size(1)]
        for layer in range(self.cfg.num_layers):
            x = x + self.attention(F.layer_norm(x, (C,), self.ln1w[layer], self.ln1b[layer], LAYERNORM_EPS), layer)
            x = x + self.mlp(F.layer_norm(x, (C,), self.ln2w[layer], self.ln2b[layer], LAYERNORM_EPS), layer)
        x = F.layer_norm(x, (C,), self.lnfw, self.lnfb, LAYERNORM_EPS)
        logits = F.linear(x, self.wte)  # tied output weights
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def make_adamw(model, lr, betas, eps, weight_decay, fused):
    """AdamW with weight decay only on the embeddings and the weight matrices."""
    decayed = [p for name, p in model.named_parameters() if name in DECAYED_PARAMS]
    undecayed = [p for name, p in model.named_parameters() if name not in DECAYED_PARAMS]
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": undecayed, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused, foreach=False)


# ----------------------------------------------------------------------------
# Files (little-endian; the C++ side reads exactly these layouts)


def write_atomically(path, arrays):
    """Writes the arrays back to back to a temporary file, then renames it into place."""
    temp_path = f"{path}.tmp.{os.getpid()}"
    with open(temp_path, "wb") as f:
        for array in arrays:
            f.write(np.ascontiguousarray(array).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp_path, path)


def int_header(magic, version, values):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[: 2 + len(values)] = [magic, version, *values]
    return header


def pad_rows(array, rows):
    padded = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    padded[: array.shape[0]] = array
    return padded


def file_tensors(cfg, tensors):
    """float32 arrays in model-file order and layout, from a name -> tensor mapping
    (parameters or their gradients); wte gets its zero padding rows up to Vp."""
    arrays = []
    for name, _ in parameter_shapes(cfg):
        array = tensors[name].detach().to("cpu", torch.float32).numpy().astype("<f4")
        arrays.append(pad_rows(array, cfg.padded_vocab_size) if name == "wte" else array)
    return arrays


def write_model_file(path, model):
    cfg = model.cfg
    header = int_header(MODEL_MAGIC, MODEL_VERSION, [cfg.max_seq_len, cfg.vocab_size, cfg.num_layers, cfg.num_heads,
                                      cfg.channels, cfg.padded_vocab_size, ATTN_KINDS.index(cfg.attn)])
    write_atomically(path, [header, *file_tensors(cfg, dict(model.named_parameters()))])


def read_int_header(path, magic, f):
    header = np.fromfile(f, dtype="<i4", count=HEADER_INTS)
    if header.size != HEADER_INTS:
        fail(f"{path}: file is shorter than its {HEADER_INTS}-int header")
    if header[0] != magic:
        fail(f"{path}: bad magic {header[0]} (expected {magic})")
    return header


def read_model_file(path):
    """Returns the config and a name -> float32 tensor mapping (wte with its V used rows)."""
    with open(path, "rb") as f:
        header = read_int_header(path, MODEL_MAGIC, f)
        if header[1] != MODEL_VERSION:
            fail(f"{path}: unsupported version {header[1]} (expected {MODEL_VERSION})")
        max_seq_len, vocab, layers, heads, channels, padded_vocab, attn_kind = (int(v) for v in header[2:9])
        if not 0 <= attn_kind < len(ATTN_KINDS):
            fail(f"{path}: unknown attention kind {attn_kind}")
        cfg = GPTConfig(max_seq_len, vocab, padded_vocab, layers, heads, channels, ATTN_KINDS[attn_kind])
        cfg.validate()
        values = np.fromfile(f, dtype="<f4")
    shapes = [(name, (padded_vocab, channels) if name == "wte" else shape) for name, shape in parameter_shapes(cfg)]
    expected = sum(math.prod(shape) for _, shape in shapes)
    if values.size != expected:
        fail(f"{path}: holds {values.size} floats after the header, the config needs {expected}")
    tensors, offset = {}, 0
    for name, shape in shapes:
        size = math.prod(shape)
        tensors[name] = torch.from_numpy(values[offset : offset + size].reshape(shape).copy())
        offset += size
    tensors["wte"] = tensors["wte"][:vocab]
    return cfg, tensors


def float_bits(values):
    return np.array(values, dtype="<f4").view("<i4")


def write_state_file(path, cfg, hyperparams, schedule, inputs, targets, logits, loss, grads, step_losses, grad_norms):
    """Debug state: the batch, the initial model's logits, loss and (accumulated) gradients,
    and the loss and gradient norm of each AdamW step taken on that batch."""
    B, T = inputs.shape
    header = int_header(STATE_MAGIC, STATE_VERSION, [B, T, cfg.vocab_size, cfg.padded_vocab_size,
                                                     ATTN_KINDS.index(cfg.attn), len(step_losses)])
    header[8:13] = float_bits(hyperparams)  # lr, beta1, beta2, eps, weight_decay
    header[13] = schedule.grad_accum
    header[14] = float_bits([schedule.grad_clip])[0]
    header[15] = schedule.warmup
    header[16] = LR_SCHEDULES.index(schedule.kind)
    header[17] = float_bits([schedule.final_frac])[0]
    flat_logits = logits.detach().to("cpu", torch.float32).numpy().reshape(B * T, cfg.vocab_size)
    padded_logits = np.zeros((B * T, cfg.padded_vocab_size), dtype="<f4")
    padded_logits[:, : cfg.vocab_size] = flat_logits
    write_atomically(path, [
        header,
        inputs.cpu().numpy().astype("<i4"),
        targets.cpu().numpy().astype("<i4"),
        padded_logits,
        np.array([loss], dtype="<f4"),
        *file_tensors(cfg, grads),
        np.array(step_losses, dtype="<f4"),
        np.array(grad_norms, dtype="<f4"),
    ])


def write_classic_state_file(path, cfg, inputs, targets, logits, loss, grads):
    """The classic debug state (version 2, as gpt2_124M_debug_state.bin): header [magic, 2, B, T],
    the batch, the logits (B, T, V) unpadded, the loss and the gradients (wte padded to Vp)."""
    B, T = inputs.shape
    write_atomically(path, [
        int_header(STATE_MAGIC, CLASSIC_STATE_VERSION, [B, T]),
        inputs.cpu().numpy().astype("<i4"),
        targets.cpu().numpy().astype("<i4"),
        logits.detach().to("cpu", torch.float32).numpy().astype("<f4"),
        np.array([loss], dtype="<f4"),
        *file_tensors(cfg, grads),
    ])


def read_shard_tokens(path):
    """Tokens of a classic shard (256-int header: magic, version, count; then uint16 tokens)."""
    with open(path, "rb") as f:
        header = read_int_header(path, SHARD_MAGIC, f)
    if header[1] != SHARD_VERSION:
        fail(f"{path}: unsupported shard version {header[1]} (expected {SHARD_VERSION})")
    count = int(header[2])
    header_bytes = HEADER_INTS * 4
    if os.path.getsize(path) != header_bytes + 2 * count:
        fail(f"{path}: size does not match its token count {count}")
    return np.memmap(path, dtype="<u2", mode="r", offset=header_bytes, shape=(count,))


def batch_from_tokens(tokens, batch_size, seq_len):
    """(B, T) inputs and their next-token targets from B*T+1 consecutive tokens."""
    window = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    return window[:-1].view(batch_size, seq_len), window[1:].view(batch_size, seq_len)


class ShardBatches:
    """Consecutive B*T+1-token windows over the shards, in name order, cycling forever."""

    def __init__(self, pattern, batch_size, seq_len, vocab_size):
        self.paths = sorted(glob.glob(pattern))
        if not self.paths:
            fail(f"no shard matches {pattern!r}")
        self.batch_size, self.seq_len, self.vocab_size = batch_size, seq_len, vocab_size
        self.shard_index = -1
        self.open_next_shard()

    def open_next_shard(self):
        self.shard_index = (self.shard_index + 1) % len(self.paths)
        path = self.paths[self.shard_index]
        self.tokens = read_shard_tokens(path)
        if self.tokens.size < self.batch_size * self.seq_len + 1:
            fail(f"{path}: {self.tokens.size} tokens, fewer than one batch of B*T+1")
        self.position = 0

    def next_batch(self):
        window_len = self.batch_size * self.seq_len + 1
        if self.position + window_len > self.tokens.size:
            self.open_next_shard()
        window = self.tokens[self.position : self.position + window_len]
        if window.max() >= self.vocab_size:
            fail(f"{self.paths[self.shard_index]}: token {window.max()} is outside the vocabulary")
        self.position += window_len - 1  # the next window starts at this one's last token
        return batch_from_tokens(window, self.batch_size, self.seq_len)


# ----------------------------------------------------------------------------
# Tokenizer


def gpt2_tokenizer():
    """tiktoken's "gpt2" encoding, built offline from the bundled encoder.json (GPT-2's merge rank
    of a token is its id); encode with encode_ordinary, so that "<|endoftext|>" is plain text."""
    import tiktoken  # only generation and evaluation need it

    # GPT-2's byte-to-unicode alphabet: printable bytes stand for themselves, the others for chr(256 + k).
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    byte_of_char = {chr(b): b for b in printable}
    byte_of_char.update({chr(256 + k): b for k, b in enumerate(b for b in range(256) if b not in printable)})
    with open(GPT2_ENCODER, encoding="utf-8") as f:
        encoder = json.load(f)
    special = {"<|endoftext|>": encoder.pop("<|endoftext|>")}
    ranks = {bytes(byte_of_char[ch] for ch in token): rank for token, rank in encoder.items()}
    return tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens=special, explicit_n_vocab=len(ranks) + 1)


# ----------------------------------------------------------------------------
# Setup shared by the modes


CONFIG_FLAGS = ("layers", "heads", "channels", "vocab", "max_seq_len")
REFERENCE_FLAGS = ("write_model", "write_state", "write_classic_state", "tokens")
INFERENCE_FLAGS = ("generate", "prompt", "eval", "eval_report")


def flags_given(args, names):
    """The command-line spelling of the flags among `names` that were given."""
    return [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) is not None]


def model_shapes():
    """{name: (layers, heads, channels)}: the rows of llmc/model_file.h's MODEL_SHAPES."""
    with open(MODEL_SHAPES_FILE, encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("MODEL_SHAPES[] = {"):]
    rows = re.findall(r'\{"(\w+)", (\d+), (\d+), (\d+)\}', table[:table.index("};")])
    return {name: (int(layers), int(heads), int(channels)) for name, layers, heads, channels in rows}


def shape_by_name(name):
    """(layers, heads, channels) of a MODEL_SHAPES name or of L<layers>C<channels>H<heads>."""
    custom = re.fullmatch(r"L(\d{1,6})C(\d{1,6})H(\d{1,6})", name)
    if custom:
        return int(custom[1]), int(custom[3]), int(custom[2])
    shapes = model_shapes()
    if name not in shapes:
        fail(f"--model {name}: not one of {', '.join(shapes)} nor L<layers>C<channels>H<heads> (e.g. L6C384H6)")
    return shapes[name]


def config_from_args(args):
    attn = args.attn or "softmax"
    explicit = [getattr(args, name) for name in CONFIG_FLAGS]
    if args.model is not None and any(v is not None for v in explicit):
        fail("give either --model or the explicit config flags, not both")
    if args.model is not None or all(v is None for v in explicit):
        layers, heads, channels = shape_by_name(args.model or "d12")
        vocab, max_seq_len = PRESET_VOCAB, PRESET_MAX_SEQ_LEN
    elif any(v is None for v in explicit):
        fail("an explicit config needs all of --layers --heads --channels --vocab --max-seq-len")
    else:
        layers, heads, channels, vocab, max_seq_len = explicit
    padded_vocab = args.padded_vocab if args.padded_vocab is not None else round_up_vocab(vocab)
    cfg = GPTConfig(max_seq_len, vocab, padded_vocab, layers, heads, channels, attn)
    cfg.validate()
    return cfg


def build_model(args, use_sdpa=False):
    """The model from --init-from, or freshly initialised from --seed; always built on the
    CPU first so that a seed gives the same weights on every device."""
    if args.init_from is None:
        model = GPT(config_from_args(args), use_sdpa)
        model.init_weights(args.seed)
        return model
    config_flags_given = flags_given(args, ("model", "padded_vocab", "attn", *CONFIG_FLAGS))
    if config_flags_given:
        fail(f"--init-from takes the config from the file; drop {' '.join(config_flags_given)}")
    cfg, tensors = read_model_file(args.init_from)
    model = GPT(cfg, use_sdpa)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(tensors[name])
    return model


def fp32_model(args, device):
    """The model of reference, generation and evaluation modes: explicit attention, TF32 off."""
    if args.compile or args.flash or args.tf32:
        fail("--compile, --flash and --tf32 apply only to training mode (--train-shards)")
    torch.set_float32_matmul_precision("highest")  # TF32 off: true FP32 matmuls
    return build_model(args).to(device)


def check_seq_len(cfg, seq_len):
    if not 0 < seq_len <= cfg.max_seq_len:
        fail(f"--seq-len {seq_len} must be in 1..{cfg.max_seq_len} (the model's max sequence length)")


@dataclass(frozen=True)
class StepSchedule:
    """Gradient accumulation, clipping and the learning-rate schedule of reference mode."""
    grad_accum: int
    grad_clip: float   # global norm; 0 = off
    warmup: int
    kind: str
    final_frac: float
    steps: int

    def learning_rate(self, lr, step):
        """As the trainer: linear warmup, then decay to final_frac * lr (computed in double,
        rounded to float32)."""
        if step < self.warmup:
            return float(np.float32(lr * (step + 1) / self.warmup))
        decay_steps = self.steps - self.warmup
        progress = (step - self.warmup) / decay_steps if decay_steps > 0 else 0.0
        factor = 1.0
        if self.kind == "cosine":
            factor = self.final_frac + (1.0 - self.final_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))
        elif self.kind == "linear":
            factor = 1.0 - (1.0 - self.final_frac) * progress
        return float(np.float32(lr * factor))


def step_schedule(args):
    if args.grad_accum < 1 or args.batch % args.grad_accum != 0:
        fail(f"--grad-accum {args.grad_accum} must be positive and divide --batch {args.batch}")
    if args.grad_clip < 0 or args.lr_warmup < 0 or not 0.0 <= args.lr_final_frac <= 1.0:
        fail("--grad-clip and --lr-warmup must not be negative, --lr-final-frac must be in [0, 1]")
    return StepSchedule(args.grad_accum, float(np.float32(args.grad_clip)), args.lr_warmup, args.lr_schedule,
                        float(np.float32(args.lr_final_frac)), args.steps)


def float32_hyperparameters(args, default_lr):
    """lr, beta1, beta2, eps, weight_decay rounded to float32: the values the C++ side reads."""
    lr = default_lr if args.lr is None else args.lr
    return tuple(float(np.float32(v)) for v in (lr, args.beta1, args.beta2, args.eps, args.weight_decay))


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------
# Reference mode


def reference_batch(args, cfg):
    """The (B, T) batch: the first B*T+1 tokens of --tokens, or random tokens from --seed, skewed
    like text (id = V * u^4 for uniform u: a few ids frequent, so that the trainer's wte gradient
    splits a frequent token's positions over several buckets)."""
    count = args.batch * args.seq_len + 1
    if args.tokens is not None:
        tokens = read_shard_tokens(args.tokens)
        if tokens.size < count:
            fail(f"{args.tokens}: {tokens.size} tokens, fewer than B*T+1 = {count}")
        tokens = tokens[:count]
        if tokens.max() >= cfg.vocab_size:
            fail(f"{args.tokens}: token {tokens.max()} is outside the vocabulary of {cfg.vocab_size}")
    else:
        generator = torch.Generator().manual_seed(args.seed)
        u = torch.rand(count, generator=generator, dtype=torch.float64)
        tokens = (u.pow(4) * cfg.vocab_size).long().clamp(max=cfg.vocab_size - 1).numpy()
    return batch_from_tokens(tokens, args.batch, args.seq_len)


def run_reference(args, device):
    if args.steps < 1:
        fail("--steps must be at least 1")
    model = fp32_model(args, device)
    cfg = model.cfg
    check_seq_len(cfg, args.seq_len)
    print(f"config: {cfg}")
    if args.write_model is not None:
        write_model_file(args.write_model, model)
        print(f"wrote {args.write_model}")
    if args.write_state is None and args.write_classic_state is None:
        return

    inputs, targets = (t.to(device) for t in reference_batch(args, cfg))
    hyperparams = float32_hyperparameters(args, default_lr=1e-4)
    lr, beta1, beta2, eps, weight_decay = hyperparams
    schedule = step_schedule(args)
    optimizer = make_adamw(model, lr, (beta1, beta2), eps, weight_decay, fused=False)
    with torch.no_grad():
        initial_logits = model(inputs, targets)[0].cpu()
    micro_batch = args.batch // schedule.grad_accum
    step_losses, grad_norms = [], []
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for micro in range(schedule.grad_accum):
            rows = slice(micro * micro_batch, (micro + 1) * micro_batch)
            _, loss = model(inputs[rows], targets[rows])
            (loss / schedule.grad_accum).backward()
            step_loss += loss.item() / schedule.grad_accum
        if step == 0:  # the initial model's accumulated gradients
            initial_grads = {name: p.grad.detach().cpu().clone() for name, p in model.named_parameters()}
        max_norm = schedule.grad_clip if schedule.grad_clip > 0 else float("inf")
        grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item())
        step_losses.append(step_loss)
        for group in optimizer.param_groups:
            group["lr"] = schedule.learning_rate(lr, step)
        print(f"step {step + 1}/{args.steps} loss {step_loss:.6f} norm {grad_norms[-1]:.6f} "
              f"lr {optimizer.param_groups[0]['lr']:.6e}")
        optimizer.step()
    if args.write_state is not None:
        write_state_file(args.write_state, cfg, hyperparams, schedule, inputs, targets, initial_logits, step_losses[0],
                         initial_grads, step_losses, grad_norms)
        print(f"wrote {args.write_state}")
    if args.write_classic_state is not None:
        write_classic_state_file(args.write_classic_state, cfg, inputs, targets, initial_logits, step_losses[0],
                                 initial_grads)
        print(f"wrote {args.write_classic_state}")


# ----------------------------------------------------------------------------
# Generation and evaluation mode


def check_in_vocab(cfg, tokens, what):
    if tokens and max(tokens) >= cfg.vocab_size:
        fail(f"{what}: token {max(tokens)} is outside the model's vocabulary of {cfg.vocab_size}")


@torch.no_grad()
def next_token_logits(model, tokens, device):
    """The logits (V,) that the last of `tokens` gives for the next one: a full forward, no cache."""
    logits, _ = model(torch.tensor([tokens], device=device))
    return logits[0, -1]


def greedy_completion(model, prompt, count, device):
    """Up to `count` tokens after `prompt`, each the argmax of the logits (the first on ties);
    stops after <|endoftext|>, which is kept."""
    tokens = list(prompt)
    for _ in range(count):
        tokens.append(int(next_token_logits(model, tokens, device).argmax()))
        if tokens[-1] == EOT:
            break
    return tokens[len(prompt) :]


def run_generation(args, model, tokenizer, device):
    if args.generate < 1:
        fail("--generate must be at least 1")
    cfg = model.cfg
    prompt = tokenizer.encode_ordinary(args.prompt) or [EOT]
    check_in_vocab(cfg, prompt, "--prompt")
    if len(prompt) + args.generate > cfg.max_seq_len:
        fail(f"{len(prompt)} prompt tokens + --generate {args.generate} exceed the model's max sequence length "
             f"{cfg.max_seq_len}")
    print("ids:", *greedy_completion(model, prompt, args.generate, device))


def parse_eval_line(path, number, line):
    """One HellaSwag-format object: {"ctx": str, "endings": [4 str], "label": 0..3}."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        fail(f"{path}:{number}: not a JSON object ({e.msg})")
    if not (isinstance(item, dict) and isinstance(item.get("ctx"), str) and isinstance(item.get("endings"), list)
            and len(item["endings"]) == 4 and all(isinstance(e, str) for e in item["endings"])):
        fail(f'{path}:{number}: needs "ctx" (a string) and "endings" (4 strings)')
    label = item.get("label")
    if type(label) is not int or not 0 <= label < 4:
        fail(f'{path}:{number}: "label" must be an integer in 0..3, not {label!r}')
    return item["ctx"], item["endings"], label


def read_eval_examples(path, tokenizer, cfg):
    """(line number, context ids, the 4 endings' ids, label) of each line that is not only JSON
    whitespace; an ending is encoded with a leading space, as it continues the context."""
    examples = []
    with open(path, "rb") as f:  # lines end at "\n" only, as the trainer counts them
        for number, line in enumerate(f, 1):
            if not line.strip(b" \t\r\n"):
                continue
            ctx, endings, label = parse_eval_line(path, number, line)
            context = tokenizer.encode_ordinary(ctx)
            ending_ids = [tokenizer.encode_ordinary(" " + ending) for ending in endings]
            for tokens in (context, *ending_ids):
                check_in_vocab(cfg, tokens, f"{path}:{number}")
            examples.append((number, context, ending_ids, label))
    if not examples:
        fail(f"{path}: no examples")
    return examples


@torch.no_grad()
def ending_losses(model, context, endings, seq_len, device):
    """Mean cross-entropy (nats) of each ending's tokens predicted after the context, kept to its
    last seq_len - len(ending) tokens; None where the example does not fit or has no context."""
    if not context or any(seq_len - len(ending) < 1 for ending in endings):
        return None
    losses = []
    for ending in endings:
        kept = context[-(seq_len - len(ending)) :]
        logits, _ = model(torch.tensor([kept + ending], device=device))
        # positions len(kept)-1 .. len(kept)+len(ending)-2 predict the ending's tokens
        predictions = logits[0, len(kept) - 1 : len(kept) + len(ending) - 1]
        token_losses = F.cross_entropy(predictions, torch.tensor(ending, device=device), reduction="none")
        losses.append(token_losses.double().mean().item())  # float32 losses, float64 mean
    return losses


def run_evaluation(args, model, tokenizer, device):
    check_seq_len(model.cfg, args.seq_len)
    rows, correct = ["# line label choice loss0 loss1 loss2 loss3"], 0
    for number, context, endings, label in read_eval_examples(args.eval, tokenizer, model.cfg):
        losses = ending_losses(model, context, endings, args.seq_len, device)
        if losses is None:
            continue
        choice = min(range(len(losses)), key=losses.__getitem__)  # the lowest index on ties
        correct += choice == label
        rows.append(f"{number} {label} {choice} " + " ".join(f"{loss:.9g}" for loss in losses))
    evaluated = len(rows) - 1
    if evaluated == 0:
        fail(f"{args.eval}: no example fits --seq-len {args.seq_len}")
    if args.eval_report is not None:
        with open(args.eval_report, "w") as f:
            f.write("\n".join(rows) + "\n")
    print(f"eval: accuracy {correct / evaluated:.4f} ({correct}/{evaluated})")


def run_inference(args, device):
    if (args.prompt is None) != (args.generate is None):
        fail("--generate and --prompt go together")
    if args.eval_report is not None and args.eval is None:
        fail("--eval-report needs --eval")
    model = fp32_model(args, device)
    tokenizer = gpt2_tokenizer()
    if args.generate is not None:
        run_generation(args, model, tokenizer, device)
    if args.eval is not None:
        run_evaluation(args, model, tokenizer, device)


# ----------------------------------------------------------------------------
# Training / benchmark mode


def world_size():
    """Processes in the run: torchrun's WORLD_SIZE, 1 when started without it."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device):
    """Joins torchrun's process group (NCCL on CUDA, one GPU per process; gloo on the CPU);
    returns this process's rank and device."""
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), device


def run_training(args, device):
    if args.steps <= args.warmup_steps:
        fail(f"--steps {args.steps} leaves no timed steps after {args.warmup_steps} warm-up steps")
    world, rank = world_size(), 0
    if world > 1:
        rank, device = init_distributed(device)
    log = print if rank == 0 else lambda *_: None
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    model = build_model(args, use_sdpa=args.flash).to(device)
    cfg = model.cfg
    check_seq_len(cfg, args.seq_len)
    log(f"config: {cfg}")
    lr, beta1, beta2, eps, weight_decay = float32_hyperparameters(args, default_lr=3e-4)
    optimizer = make_adamw(model, lr, (beta1, beta2), eps, weight_decay, fused=True)
    step_model = model
    if world > 1:
        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    step_model = torch.compile(step_model) if args.compile else step_model
    # Every process reads the global batch of B * world rows and keeps its own B of them, so
    # that the data is the same as in one process with --batch B * world.
    batches = ShardBatches(args.train_shards, args.batch * world, args.seq_len, cfg.vocab_size)
    rows = slice(rank * args.batch, (rank + 1) * args.batch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    timed_ms = []
    for step in range(args.steps):
        start = time.perf_counter()
        inputs, targets = (t[rows].to(device) for t in batches.next_batch())
        optimizer.zero_grad(set_to_none=True)
        _, loss = step_model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        synchronize(device)
        step_ms = (time.perf_counter() - start) * 1000
        if step >= args.warmup_steps:
            timed_ms.append(step_ms)
        # Under torchrun: the loss of rank 0's rows.
        log(f"step {step + 1}/{args.steps} loss {loss.item():.6f} ms {step_ms:.2f}")

    ms_per_step = sum(timed_ms) / len(timed_ms)  # rank 0's
    tokens_per_s = args.batch * world * args.seq_len / (ms_per_step / 1000)
    peak_mem_gb = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0  # per GPU
    world_field = f" world={world}" if world > 1 else ""
    log(f"RESULT ms_per_step={ms_per_step:.3f} tok_per_s={tokens_per_s:.1f} peak_mem_gb={peak_mem_gb:.3f}{world_field}")
    if world > 1:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_argument_group("model (default --model d12; --init-from takes it from a model file)")
    model.add_argument("--model", help="d6, d12 (GPT-2 small) ... d48 (XL) as the trainer's -e names them, "
                       "or L<layers>C<channels>H<heads>")
    model.add_argument("--layers", type=int)
    model.add_argument("--heads", type=int)
    model.add_argument("--channels", type=int)
    model.add_argument("--vocab", type=int)
    model.add_argument("--max-seq-len", type=int)
    model.add_argument("--padded-vocab", type=int, help="default: vocab rounded up to a multiple of 128")
    model.add_argument("--attn", choices=ATTN_KINDS, help="attention kind (default softmax)")
    model.add_argument("--init-from", metavar="FILE", help="start from this model file instead of --seed")
    model.add_argument("--seed", type=int, default=0, help="weights and random tokens")

    run = parser.add_argument_group("run")
    run.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    run.add_argument("--batch", type=int, default=4, help="rows per step (per process under torchrun)")
    run.add_argument("--seq-len", type=int, default=64)
    run.add_argument("--steps", type=int, default=10)
    run.add_argument("--lr", type=float, help="default 1e-4 (reference) or 3e-4 (training)")
    run.add_argument("--beta1", type=float, default=0.9)
    run.add_argument("--beta2", type=float, default=0.999)
    run.add_argument("--eps", type=float, default=1e-8)
    run.add_argument("--weight-decay", type=float, default=0.1)

    reference = parser.add_argument_group("reference mode")
    reference.add_argument("--write-model", metavar="PATH", help="the initial model, as a model file")
    reference.add_argument("--write-state", metavar="PATH", help="debug state of --steps AdamW steps on one batch")
    reference.add_argument("--write-classic-state", metavar="PATH",
                           help="the classic debug state (version 2: logits, loss, gradients; no steps)")
    reference.add_argument("--tokens", metavar="SHARD", help="take the batch from this shard, not random tokens")
    reference.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (divides --batch)")
    reference.add_argument("--grad-clip", type=float, default=0.0, help="global gradient-norm clipping, 0 = off")
    reference.add_argument("--lr-warmup", type=int, default=0, help="linear warmup steps")
    reference.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="constant", help="decay after warmup")
    reference.add_argument("--lr-final-frac", type=float, default=0.0, help="final lr as a fraction of --lr")

    training = parser.add_argument_group("training mode")
    training.add_argument("--train-shards", metavar="PATTERN", help="glob of classic token shards")
    training.add_argument("--warmup-steps", type=int, default=3, help="steps left out of the timing")
    training.add_argument("--compile", action="store_true", help="torch.compile the model")
    training.add_argument("--flash", action="store_true", help="SDPA for softmax attention")
    training.add_argument("--tf32", action="store_true", help="TF32 matmuls")

    inference = parser.add_argument_group("generation and evaluation mode")
    inference.add_argument("--generate", type=int, metavar="N", help="greedy: print the N ids generated after --prompt")
    inference.add_argument("--prompt", metavar="TEXT", help="GPT-2 tokens; empty: start from <|endoftext|>")
    inference.add_argument("--eval", metavar="FILE", help="HellaSwag-format jsonl; rows of up to --seq-len tokens")
    inference.add_argument("--eval-report", metavar="PATH", help="each example's label, choice and 4 ending losses")
    return parser.parse_args()


def main():
    args = parse_args()
    if args.batch <= 0:
        fail("--batch must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but CUDA is not available")
    device = torch.device(args.device)
    reference_flags, inference_flags = flags_given(args, REFERENCE_FLAGS), flags_given(args, INFERENCE_FLAGS)
    if args.train_shards is not None:
        if reference_flags or inference_flags:
            fail(f"{' '.join(reference_flags + inference_flags)} do not apply to training mode (--train-shards)")
        run_training(args, device)
    elif world_size() > 1:
        fail("reference, generation and evaluation modes run in one process, not under torchrun")
    elif inference_flags:
        if reference_flags:
            fail(f"{' '.join(reference_flags)} (reference mode) do not mix with {' '.join(inference_flags)}")
        run_inference(args, device)
    elif args.write_model is None and args.write_state is None and args.write_classic_state is None:
        fail("nothing to do: give --write-model/--write-state (reference), --train-shards (training), "
             "--generate or --eval")
    else:
        run_reference(args, device)


if __name__ == "__main__":
    main()
