"""Tests scripts/plot.py on the committed logs dev/test/fixtures/logs/{softmax,relu}/main.log
(softmax: a `# tokens per step` line, a skipped update, a resume that logs steps 12 and 13 again;
relu: no such line, a restart from scratch and a resume), through Run, the matplotlib Figure that
make_figure returns, and the command line (PNG, CSV, one-line errors for damaged, empty and missing
logs); a classic log of train and val losses alone (`s:S trl:L`, `s:S tel:L`); -h and --csv with
matplotlib hidden, and a figure asked for without it. Run by dev/test/test_plot.sh, which provides
matplotlib.
"""
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import plot  # noqa: E402

LOGS = os.path.join(REPO, "dev", "test", "fixtures", "logs")
SOFTMAX, RELU = os.path.join(LOGS, "softmax"), os.path.join(LOGS, "relu")
# the classic trainer's main.log (and this project's first): train and val losses, no comments
CLASSIC_LOG = ("s:0 tel:10.9821\ns:0 trl:10.0000\ns:1 trl:9.5000\ns:2 trl:9.0000\ns:3 tel:8.5000\ns:3 trl:8.5000\n"
               "s:4 trl:8.0000\ns:5 trl:7.5000\ns:6 tel:7.7500\n")
# python -c HIDE_MATPLOTLIB plot.py ARGS...: plot.py as its command line runs it, with `import matplotlib` failing
HIDE_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
                   "runpy.run_path(sys.argv[0], run_name='__main__')")
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(f"{'ok   ' if ok else 'FAIL '} {name}{'' if ok else ': ' + str(detail)}")
    passed, failed = passed + ok, failed + (not ok)


def plot_cli(*args, matplotlib=True):
    hide = [] if matplotlib else ["-c", HIDE_MATPLOTLIB]
    return subprocess.run([sys.executable, *hide, os.path.join(REPO, "scripts", "plot.py"), *args],
                          capture_output=True, text=True)


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_read(softmax, relu):
    check("softmax: tokens per step from its comment", (softmax.tokens_per_step, softmax.exact_tokens) == (8192, True),
          (softmax.tokens_per_step, softmax.exact_tokens))
    check("relu: tokens per step from tok/s x ms", (relu.tokens_per_step, relu.exact_tokens) == (4096, False),
          (relu.tokens_per_step, relu.exact_tokens))
    check("steps 0..20 (train s:S is step S+1, val s:S step S)",
          list(softmax.rows) == list(range(21)) == list(relu.rows))
    row = softmax.rows[13]  # s:12, logged again after the resume
    check("a step logged again: the later line wins", (row["train_loss"], row["ms"]) == (5.904347, 905.118), row)
    check("relu: the restart from scratch supersedes steps 0..2", relu.rows[1]["train_loss"] == 11.000594, relu.rows[1])
    check("skipped update at step 8 (s:7)", softmax.rows[8].get("skipped") == "norm spike (z 7.1 > 6)", softmax.rows[8])
    check("val and eval at step 20", (softmax.rows[20]["val_loss"], softmax.rows[20]["eval"]) == (5.851203, 0.3))


def test_resume_drops_later_steps(work):
    path = os.path.join(work, "cut", "main.log")
    write(path, "".join(f"s:{s} trl:5 lr:1e-4 norm:1 ms:10.000 tok/s:100 mfu:1\n" for s in range(6))
          + "# resumed at step 3 on 2 GPUs\ns:3 trl:4 lr:1e-4 norm:1 ms:10.000 tok/s:100 mfu:1\n")
    run = plot.read_log(path, "cut")
    check("a resume drops the steps from its checkpoint on that it did not log again", list(run.rows) == [1, 2, 3, 4],
          list(run.rows))
    check("the first step after a resume is a setup step", run.rows[4]["setup"] and not run.rows[2]["setup"])


def test_figure(runs):
    fig = plot.make_figure(runs, "step")
    loss_ax, speed_ax = fig.axes
    lines = lines_by_label(loss_ax)
    legend = [text.get_text() for text in loss_ax.get_legend().get_texts()]
    vals = [t for t in legend if t.startswith(("softmax val", "relu val"))]
    check("legend: train curves named by folder, val curves",
          legend[:1] == ["softmax"] and "relu" in legend and len(vals) == 2, legend)
    train = lines["softmax"]
    check("softmax train curve: steps 1..20", list(train.get_xdata()) == list(range(1, 21)), train.get_xdata())
    raw = lines["_softmax raw"]
    check("raw curve: faint, the same colour", raw.get_alpha() < 1 and raw.get_color() == train.get_color())
    check("raw curve: the superseded step's later loss", raw.get_ydata()[12] == 5.904347, raw.get_ydata()[12])
    smooth = train.get_ydata()
    check("smoothed curve: an exponential moving average (0.9)",
          abs(smooth[1] - (0.9 * 10.953436 + 0.1 * 9.824114)) < 1e-12, smooth[:2])
    val = next(line for label, line in lines.items() if label.startswith("relu val"))
    check("relu val curve: steps 0, 10, 20", list(val.get_xdata()) == [0, 10, 20], val.get_xdata())
    speeds = lines_by_label(speed_ax)
    check("tok/s panel: both runs, without the steps that include setup (1, 13)",
          sorted(speeds) == ["relu", "softmax"] and 1 not in speeds["softmax"].get_xdata()
          and 13 not in speeds["softmax"].get_xdata() and len(speeds["softmax"].get_xdata()) == 18)
    check("x axis: steps", loss_ax.get_xlabel() == "step", loss_ax.get_xlabel())


def test_tokens_figure(runs):
    loss_ax, speed_ax = plot.make_figure(runs, "tokens").axes
    lines = lines_by_label(loss_ax)
    xs = list(lines["softmax"].get_xdata())
    check("--tokens: softmax train at (s+1) x 8192", xs == [8192 * s for s in range(1, 21)], xs)
    val = next(line for label, line in lines.items() if label.startswith("relu val"))
    check("--tokens: relu val at s x 4096", list(val.get_xdata()) == [0, 40960, 81920], val.get_xdata())
    check("--tokens: labelled approximate for relu", loss_ax.get_xlabel() == "tokens (approximate for relu)",
          loss_ax.get_xlabel())


def test_smoothed():
    check("--smooth 0: the raw curve", plot.smoothed([4.0, 2.0, 3.0], 0) == [4.0, 2.0, 3.0])
    out = plot.smoothed([4.0, float("nan"), 2.0], 0.5)
    check("a non-finite loss stays out of the average", out[0] == 4.0 and out[1] != out[1] and out[2] == 3.0, out)


def test_cli_figure(work):
    png = os.path.join(work, "ab.png")
    result = plot_cli(SOFTMAX, RELU, "-o", png, "--tokens")
    with open(png, "rb") as f:
        check("two runs: a PNG", result.returncode == 0 and f.read(8) == b"\x89PNG\r\n\x1a\n", result.stderr)
    one = shutil.copytree(SOFTMAX, os.path.join(work, "one"))
    result = plot_cli(one)
    check("one run: DIR/main.png by default", result.returncode == 0 and os.path.isfile(os.path.join(one, "main.png")),
          result.stderr)
    result = plot_cli(SOFTMAX, RELU)
    check("several runs without -o: refused", result.returncode != 0 and "-o" in result.stderr, result.stderr)
    result = plot_cli(one, "--csv", os.path.join(one, "main.log"))
    check("an output that is an input: refused", result.returncode != 0 and "one of the logs" in result.stderr,
          result.stderr)


def test_cli_csv(work):
    path = os.path.join(work, "runs.csv")
    result = plot_cli(SOFTMAX, RELU, "--csv", path)
    if result.returncode != 0:
        check("--csv", False, result.stderr)
        return
    with open(path, newline="") as f:
        text = f.read()
    reader = csv.DictReader(io.StringIO(text))
    rows = {(row["run"], int(row["step"])): row for row in reader}
    check("CSV columns", reader.fieldnames == plot.CSV_COLUMNS, reader.fieldnames)
    check("CSV: one row per run and step", len(rows) == 42 and len(text.splitlines()) == 43, len(rows))
    check("CSV: the superseded step's later line", rows["softmax", 13]["ms"] == "905.118", rows["softmax", 13])
    check("CSV: tokens", rows["softmax", 13]["tokens"] == str(13 * 8192) and rows["relu", 20]["tokens"] == "81920")
    first = rows["softmax", 0]
    check("CSV: empty cells where nothing was logged", first["train_loss"] == "" == rows["softmax", 1]["val_loss"]
          and first["val_loss"] == "10.98211", first)
    check("CSV: eval and skipped",
          rows["softmax", 10]["eval"] == "0.2667" and rows["softmax", 8]["skipped"].startswith("norm spike"))
    check("CSV only: no figure needed for several runs", not os.path.exists(os.path.join(SOFTMAX, "main.png")))


def check_refused(name, path, text, where):
    write(path, text)
    result = plot_cli(path, "-o", os.path.join(os.path.dirname(path), "x.png"))
    ok = result.returncode != 0 and where in result.stderr and "Traceback" not in result.stderr
    check(f"{name}: one message naming {where}", ok and len(result.stderr.splitlines()) == 1, result.stderr)


def test_bad_logs(work):
    good = "s:0 tel:10.9\ns:0 trl:10.9 lr:6e-5 norm:9 ms:800.000 tok/s:1000 mfu:1\n"
    bad = os.path.join(work, "bad", "main.log")
    check_refused("a value that is not a number", bad,
                  good + "s:1 trl:9.8 lr:1e-4 norm:x7 ms:100.000 tok/s:8192 mfu:30\n", f"{bad}:3")
    check_refused("a line that does not parse", bad, good + "s:1 trl:9.8 lr:1e-4 no\n", f"{bad}:3")
    check_refused("a train line with a key twice", bad, good + "s:1 trl:9.8 lr:1e-4 lr:1e-4\n", f"{bad}:3")
    check_refused("a train line with an unknown key", bad, good + "s:1 trl:9.8 speed:3\n", f"{bad}:3")
    check_refused("garbage", bad, "hello\n" + good, f"{bad}:1")
    empty = os.path.join(work, "empty", "main.log")
    check_refused("an empty log", empty, "", empty)
    check_refused("a log with no train step", empty, "# tokens per step: 8\ns:0 tel:10.9\n", empty)
    missing = os.path.join(work, "missing", "main.log")
    result = plot_cli(missing, "-o", os.path.join(work, "m.png"))
    check("a missing log: one message naming it", result.returncode != 0 and missing in result.stderr
          and "Traceback" not in result.stderr, result.stderr)


def test_classic(work):
    path = os.path.join(work, "classic", "main.log")
    write(path, CLASSIC_LOG)
    result = plot_cli(os.path.dirname(path))
    check("classic log: the command line draws it", result.returncode == 0
          and os.path.isfile(os.path.join(work, "classic", "main.png")), result.stderr)
    csv_path = os.path.join(work, "classic.csv")
    result = plot_cli(path, "--csv", csv_path)
    with open(csv_path) if result.returncode == 0 else io.StringIO() as f:
        rows = list(csv.DictReader(f))
    check("classic log: CSV with empty tokens cells", len(rows) == 7 and rows[3]["tokens"] == ""
          and rows[3]["train_loss"] == "9.0" and rows[3]["val_loss"] == "8.5", (result.stderr, rows[3:4]))
    result = plot_cli(path, "--tokens", "-o", os.path.join(work, "classic_tokens.png"))
    check("classic log with --tokens: one line saying it has no tokens", result.returncode != 0
          and len(result.stderr.splitlines()) == 1 and "tokens per step" in result.stderr, result.stderr)
    try:
        run = plot.read_log(path, "classic")
    except plot.LogError as e:
        check("classic log: read", False, e)
        return
    check("classic log: train steps 1..6 and val at 0, 3, 6, no tokens per step",
          list(run.rows) == list(range(7)) and run.tokens_per_step is None
          and [s for s, row in run.rows.items() if "val_loss" in row] == [0, 3, 6], run)
    fig = plot.make_figure([run], "step")
    check("classic log: one panel (no throughput logged)", len(fig.axes) == 1, fig.axes)
    lines = lines_by_label(fig.axes[0])
    check("classic log: train curve at steps 1..6", list(lines["classic"].get_xdata()) == list(range(1, 7))
          and lines["_classic raw"].get_ydata()[5] == 7.5, lines)
    val = next((line for label, line in lines.items() if label.startswith("classic val")), None)
    check("classic log: val curve at 0, 3, 6", val is not None and list(val.get_xdata()) == [0, 3, 6])
    softmax = plot.read_runs([SOFTMAX])[0]
    loss_ax, speed_ax = plot.make_figure([softmax, run], "step").axes
    check("beside a full log: both loss curves, throughput of the full log only",
          {"softmax", "classic"} <= set(lines_by_label(loss_ax)) and sorted(lines_by_label(speed_ax)) == ["softmax"])


def test_without_matplotlib(work):
    result = plot_cli("-h", matplotlib=False)
    check("no matplotlib: -h works", result.returncode == 0 and "--csv" in result.stdout, result.stderr)
    path = os.path.join(work, "hidden.csv")
    result = plot_cli(SOFTMAX, RELU, "--csv", path, matplotlib=False)
    check("no matplotlib: --csv of two runs works", result.returncode == 0 and os.path.isfile(path), result.stderr)
    one = shutil.copytree(SOFTMAX, os.path.join(work, "hidden"))
    result = plot_cli(one, "--csv", path, matplotlib=False)
    check("no matplotlib: --csv of one run works, and draws no figure", result.returncode == 0
          and not os.path.exists(os.path.join(one, "main.png")), result.stderr)
    for args in ([one], [one, "-o", os.path.join(work, "hidden.png"), "--csv", path]):
        result = plot_cli(*args, matplotlib=False)
        check(f"no matplotlib, a figure asked for ({' '.join(args[1:]) or 'by default'}): one line how to install it",
              result.returncode != 0 and len(result.stderr.splitlines()) == 1 and "pip install matplotlib"
              in result.stderr and "Traceback" not in result.stderr and not os.path.exists(os.path.join(one, "main.png")),
              result.stderr)


def main():
    runs = plot.read_runs([SOFTMAX, RELU + "/"])
    check("labels: the folder names", [run.label for run in runs] == ["softmax", "relu"], [run.label for run in runs])
    test_read(*runs)
    test_figure(runs)
    test_tokens_figure(runs)
    test_smoothed()
    with tempfile.TemporaryDirectory() as work:
        test_resume_drops_later_steps(work)
        test_cli_figure(work)
        test_cli_csv(work)
        test_bad_logs(work)
        test_classic(work)
        test_without_matplotlib(work)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
