#!/usr/bin/env python3
"""Plots a training run's DIR/main.log as a PNG: train and validation loss, and throughput.

    python scripts/plot.py log_d12/main.log -o log_d12/loss.png

main.log has one line per step, `s:STEP trl:LOSS lr:LR norm:NORM ms:MS tok/s:TOKS mfu:PERCENT`,
one per validation, `s:STEP tel:LOSS`, and `# ...` comments (a resume). When a resumed run
logs a step again, its later line wins.
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_log(path):
    """Returns {kind: {step: fields}} for kind 'train' and 'val'."""
    runs = {"train": {}, "val": {}}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                fields = dict(item.split(":", 1) for item in line.split())
                step = int(fields.pop("s"))
                values = {key: float(value) for key, value in fields.items()}
            except ValueError:
                raise SystemExit(f"error: {path}:{number}: not a log line: {line!r}")
            runs["val" if "tel" in values else "train"][step] = values
    if not runs["train"]:
        raise SystemExit(f"error: {path}: no training steps")
    return runs


def plot(runs, title, output):
    train_steps = sorted(runs["train"])
    val_steps = sorted(runs["val"])
    fig, (loss_ax, speed_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    loss_ax.plot(train_steps, [runs["train"][s]["trl"] for s in train_steps], label="train", linewidth=1)
    if val_steps:
        val = [runs["val"][s]["tel"] for s in val_steps]
        loss_ax.plot(val_steps, val, "o-", label=f"val (min {min(val):.3f})", markersize=3)
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss")
    loss_ax.set_title(title)
    loss_ax.grid(alpha=0.3)
    loss_ax.legend()
    speed_steps = [s for s in train_steps if "tok/s" in runs["train"][s]][1:]  # the first step includes setup
    speed_ax.plot(speed_steps, [runs["train"][s]["tok/s"] / 1e3 for s in speed_steps], linewidth=1)
    speed_ax.set_xlabel("step")
    speed_ax.set_ylabel("throughput (k tokens/s)")
    speed_ax.set_ylim(bottom=0)
    speed_ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="a run's main.log")
    parser.add_argument("-o", "--output", help="PNG to write (default: the log's name with .png)")
    parser.add_argument("--title", default="GPT-2 training", help="title of the loss plot")
    args = parser.parse_args()
    output = args.output or args.log.rsplit(".", 1)[0] + ".png"
    plot(read_log(args.log), args.title, output)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
