#!/usr/bin/env python3
"""Draws training runs in one figure: train loss (smoothed, the raw curve faint behind it) and
validation loss, and throughput in its own panel where a log has it; or writes every logged number
as CSV.

    python scripts/plot.py log_d12                            # log_d12/main.png
    python scripts/plot.py log_a log_b -o ab.png --tokens     # two runs against tokens trained on
    python scripts/plot.py log_a log_b --csv runs.csv         # every logged number, for pandas

A run is a folder (its main.log) or a log file, labelled by its folder's name. One run's figure
goes beside its log (NAME.png for NAME.log) unless -o names it; several runs need -o. With --csv, a
figure is drawn only where -o names one. Figures need matplotlib; -h and --csv do not.
Existing outputs are replaced (each through a temporary file): a figure is redrawn as a run goes on.

main.log (llmc/logger.h): `s:STEP trl:LOSS lr:LR norm:NORM ms:MS tok/s:TOKS mfu:PERCENT` for
0-based train step STEP, `s:STEP skipped: WHY` for its update, `s:STEP tel:LOSS` and
`s:STEP eval:ACCURACY` measured before step STEP ran, and `# ...` comments. A resumed process
logs steps again: `# resumed at step R` drops the lines of steps R and later written before it,
`# no checkpoint to resume from` all lines before it. Older logs (this project's first, and the
classic trainer's) have train lines of `s:STEP trl:LOSS` alone: a train line needs trl, and any of
the other keys may be missing; the throughput panel is left out where no run logged tok/s.

Steps are counted as the console counts them, steps done when the number was logged: train and
skipped lines s:S are step S+1, val and eval lines s:S are step S. Tokens = step x tokens per step,
from the log's `# tokens per step: N` line or, where it has none, approximately from tok/s x ms;
a log with neither has no tokens (empty CSV cells, and --tokens refuses it).

CSV: one row per run and step, columns run, step, tokens, train_loss, lr, norm, ms, tok_s, mfu,
val_loss, eval, skipped (the reason); a cell is empty where that step logged no such value.
"""

import argparse
import collections
import csv
import io
import math
import os
import re
import sys
from dataclasses import dataclass

CSV_COLUMNS = ["run", "step", "tokens", "train_loss", "lr", "norm", "ms", "tok_s", "mfu", "val_loss", "eval", "skipped"]
# a step line's first key: its kind, and the columns of its keys (the first one needed, the others optional)
LINE_KINDS = {
    "trl": ("train", {"trl": "train_loss", "lr": "lr", "norm": "norm", "ms": "ms", "tok/s": "tok_s", "mfu": "mfu"}),
    "tel": ("val", {"tel": "val_loss"}),
    "eval": ("eval", {"eval": "eval"}),
}
STEP_LINE = re.compile(r"s:(\d+) (skipped: (.+)|\S.*)")
TOKENS_LINE = re.compile(r"# tokens per step: (\d+)")
RESUMED_LINE = re.compile(r"# resumed at step (\d+)\b.*")
RESTARTED_LINE = "# no checkpoint to resume from"


class LogError(Exception):
    """A log that cannot be read: the message names the file, and the line where one is damaged."""


@dataclass
class Run:
    """One run's log: rows[step] = {column: value}, steps counted as the module's docstring says."""
    label: str
    path: str
    tokens_per_step: int  # None where the log has neither that line nor tok/s and ms
    exact_tokens: bool  # from a `# tokens per step` line, not derived from tok/s x ms
    rows: dict


def parse_step_line(line):
    """Returns (kind, step, {column: value}) of a step line; ValueError says why it is not one."""
    match = STEP_LINE.fullmatch(line)
    if match is None:
        raise ValueError("not a main.log line")
    step = int(match[1])
    if match[3] is not None:
        return "skipped", step, {"skipped": match[3]}
    pairs = [item.split(":", 1) for item in match[2].split()]
    if any(len(pair) != 2 for pair in pairs) or pairs[0][0] not in LINE_KINDS:
        raise ValueError("not a main.log line")
    kind, columns = LINE_KINDS[pairs[0][0]]
    keys = [key for key, _ in pairs]
    if len(set(keys)) < len(keys) or not set(keys) <= set(columns):
        raise ValueError(f"a {kind} line takes the keys {', '.join(columns)}, once each")
    return kind, step, {columns[key]: to_float(text) for key, text in pairs}


def to_float(text):
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None


def superseded_from(comment):
    """The first log step that a resume or restart comment supersedes, or None for other comments."""
    resumed = RESUMED_LINE.fullmatch(comment)
    if resumed:
        return int(resumed[1])
    return 0 if comment.startswith(RESTARTED_LINE) else None


def read_log(path, label):
    """Reads one run's log into a Run; LogError where it is missing, damaged or has no train step."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise LogError(f"{path}: {e.strerror}") from None
    records, tokens, process_start = {}, None, True  # records[(kind, log step)]: the latest line's values
    for line_number, line in enumerate(lines, 1):
        line = line.strip()
        if line.startswith("#"):  # the comments that start a process: tokens per step, resumed, restarted
            tokens_line, first_superseded = TOKENS_LINE.fullmatch(line), superseded_from(line)
            tokens = int(tokens_line[1]) if tokens_line else tokens
            if first_superseded is not None:
                records = {key: values for key, values in records.items() if key[1] < first_superseded}
            process_start |= tokens_line is not None or first_superseded is not None
        elif line:
            try:
                kind, step, values = parse_step_line(line)
            except ValueError as e:
                raise LogError(f"{path}:{line_number}: {e}: {line!r}") from None
            if kind == "train":  # a process's first step includes its setup
                values["setup"], process_start = process_start, False
            records[kind, step] = values
    return make_run(path, label, records, tokens)


def make_run(path, label, records, tokens):
    """A Run from read_log's records, tokens per step derived from tok/s x ms where tokens is None
    (and None where the log has no finite pair of them)."""
    train = [values for (kind, _), values in records.items() if kind == "train"]
    if not train:
        raise LogError(f"{path}: no training steps logged")
    exact = tokens is not None
    if not exact:  # tok/s is printed rounded to an integer, ms to 3 decimals: take the most common
        products = [v["tok_s"] * v["ms"] / 1000 for v in train
                    if "tok_s" in v and "ms" in v and math.isfinite(v["tok_s"] * v["ms"])]
        if products:
            tokens = collections.Counter(round(p) for p in products).most_common(1)[0][0]
    rows = collections.defaultdict(dict)
    for (kind, step), values in records.items():
        rows[step + 1 if kind in ("train", "skipped") else step].update(values)
    return Run(label, path, tokens, exact, dict(sorted(rows.items())))


def read_runs(arguments):
    """The Runs of run folders or log files, labelled by folder name (by argument where those clash)."""
    paths = [os.path.join(a, "main.log") if os.path.isdir(a) else a for a in arguments]
    labels = [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in paths]
    if len(set(labels)) < len(labels):
        labels = arguments
    return [read_log(path, label) for path, label in zip(paths, labels)]


def smoothed(values, factor):
    """Exponential moving average, factor the weight of the past (0: none); non-finite values stay out."""
    average, out = None, []
    for value in values:
        if math.isfinite(value):
            average = value if average is None else factor * average + (1 - factor) * value
        out.append(average if math.isfinite(value) else math.nan)
    return out


def series(run, column, x_axis, steady=False):
    """x values ('step' or 'tokens') and values of the rows that logged column; steady: no setup steps."""
    scale = run.tokens_per_step if x_axis == "tokens" else 1
    rows = [(step, row) for step, row in run.rows.items() if column in row and not (steady and row.get("setup"))]
    return [step * scale for step, _ in rows], [row[column] for _, row in rows]


def make_figure(runs, x_axis="step", smooth=0.9, title="GPT-2 training"):
    """The runs' figure: loss against x_axis ('step' or 'tokens', every run with tokens_per_step) on the
    left, tok/s on the right where a run logged it (else loss alone)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    if any("tok_s" in row for run in runs for row in run.rows.values()):
        fig = Figure(figsize=(13, 4.8))
        loss_ax, speed_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        panels = ((loss_ax, "loss"), (speed_ax, "throughput (k tokens/s)"))
    else:
        fig = Figure(figsize=(8, 4.8))
        loss_ax, speed_ax = fig.subplots(), None
        panels = ((loss_ax, "loss"),)
    for i, run in enumerate(runs):
        color = f"C{i}"
        steps, losses = series(run, "train_loss", x_axis)
        loss_ax.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8, label=f"_{run.label} raw")
        loss_ax.plot(steps, smoothed(losses, smooth), color=color, linewidth=1.5, label=run.label)
        steps, losses = series(run, "val_loss", x_axis)
        if losses:
            label = f"{run.label} val (min {min(losses):.3f})"
            loss_ax.plot(steps, losses, "o--", color=color, markersize=3, label=label)
        steps, speeds = series(run, "tok_s", x_axis, steady=True)
        if speed_ax is not None and speeds:
            speed_ax.plot(steps, [s / 1e3 for s in speeds], color=color, linewidth=1, label=run.label)
    approximate = [run.label for run in runs if not run.exact_tokens]
    x_label = f"tokens (approximate for {', '.join(approximate)})" if x_axis == "tokens" and approximate else x_axis
    for ax, y_label in panels:
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        if x_axis == "tokens":
            ax.xaxis.set_major_formatter(EngFormatter())
    loss_ax.set_title(title)
    if speed_ax is not None:
        speed_ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


def csv_text(runs):
    """The runs as CSV, in the layout the module's docstring gives."""
    text = io.StringIO()
    writer = csv.DictWriter(text, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")  # no "setup"
    writer.writeheader()
    for run in runs:
        for step, row in run.rows.items():
            tokens = "" if run.tokens_per_step is None else step * run.tokens_per_step
            writer.writerow({"run": run.label, "step": step, "tokens": tokens, **row})
    return text.getvalue()


def figure_bytes(fig, path):
    """The figure in the format path's extension names."""
    data = io.BytesIO()
    fig.savefig(data, format=os.path.splitext(path)[1][1:], dpi=100)
    return data.getvalue()


def write_through_temp(path, data):
    """Writes data (bytes) to a temporary file renamed to path, so that no reader sees half of it."""
    temp = f"{path}.tmp{os.getpid()}"
    try:
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except OSError as e:
        raise LogError(f"cannot write {path}: {e.strerror}") from None
    finally:
        if os.path.exists(temp):
            os.remove(temp)


def figure_formats():
    """The figure formats matplotlib writes, imported here and not at the top so that -h and --csv run
    without it; without it, one line saying how to install it, and exit 1."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        sys.exit("plot.py: error: figures need matplotlib: python3 -m pip install matplotlib (--csv needs none)")
    return FigureCanvasBase.get_supported_filetypes()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="a run's folder (DIR/main.log) or log file")
    parser.add_argument("-o", "--output", metavar="FILE.png", help="the figure (or .svg, .pdf, ...)")
    parser.add_argument("--tokens", action="store_true", help="tokens trained on as the x axis, not steps")
    parser.add_argument("--smooth", type=float, default=0.9,
                        help="train loss moving-average factor, from 0 (none) to below 1 (0.9)")
    parser.add_argument("--csv", metavar="FILE", help="write every logged number to FILE as CSV (layout above)")
    parser.add_argument("--title", default="GPT-2 training", help="title of the loss panel")
    args = parser.parse_args()
    if not 0 <= args.smooth < 1:
        parser.error("--smooth: a factor from 0 to below 1")
    if args.output is None and len(args.runs) > 1 and args.csv is None:
        parser.error("several runs: name the figure with -o FILE.png (or write only --csv)")
    args.figure = args.output is not None or args.csv is None  # one run's figure by default, not beside --csv
    if args.figure:
        formats = figure_formats()
        if args.output is not None and os.path.splitext(args.output)[1][1:] not in formats:
            parser.error(f"-o {args.output}: not a figure format matplotlib writes (.png, .svg, .pdf, ...)")
    return args


def main():
    args = parse_args()
    try:
        runs = read_runs(args.runs)
        output = args.output or (os.path.splitext(runs[0].path)[0] + ".png" if args.figure else None)
        inputs = {os.path.realpath(run.path) for run in runs}
        for path in (output, args.csv):
            if path is not None and os.path.realpath(path) in inputs:
                raise LogError(f"{path} is one of the logs read")
        if args.tokens or args.csv:
            for run in runs:
                if run.tokens_per_step is None and args.tokens and output is not None:
                    raise LogError(f"--tokens: {run.path} has no '# tokens per step' line, nor tok/s and ms")
                if run.tokens_per_step is None:
                    print(f"note: {run.path} has no '# tokens per step' line, nor tok/s and ms: no tokens",
                          file=sys.stderr)
                elif not run.exact_tokens:
                    print(f"note: {run.path} has no '# tokens per step' line: about {run.tokens_per_step} "
                          "tokens per step, from tok/s x ms", file=sys.stderr)
        if output is not None:
            fig = make_figure(runs, "tokens" if args.tokens else "step", args.smooth, args.title)
            write_through_temp(output, figure_bytes(fig, output))
            print(f"wrote {output}")
        if args.csv is not None:
            write_through_temp(args.csv, csv_text(runs).encode())
            print(f"wrote {args.csv}")
    except LogError as e:
        sys.exit(f"plot.py: error: {e}")


if __name__ == "__main__":
    main()
