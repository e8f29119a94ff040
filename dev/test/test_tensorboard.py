"""TensorBoard's own readers on the event files llmc/tensorboard.h writes (run by
dev/test/test_tensorboard.sh with the python that python_env picks, from the repository root):

CPU: build/tensorboard_demo writes a run through llmc/logger.h's writers with a resume (steps
0..9, then a second file that starts a session at step 6 and logs steps 6..12); both of
TensorBoard's EventAccumulators read every tag, each value equal to main.log's, the steps
strictly increasing: the session start dropped the first process's steps 6..9, which the files
still hold.

GPU (SKIPPED without nvidia-smi): the trainer's runs, checked the same way against their main.log
(every scalar to float precision; config and samples at their steps): a straight run with
--eval and a skipped update (every tag), a --stop-at run resumed with -y 1, a run killed after a
checkpoint and resumed, and a run that failed before its first checkpoint requeued with -y 1
(a restart from scratch).
"""
import glob
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tensorboard.backend.event_processing import event_accumulator, event_file_loader, plugin_event_accumulator
from tensorboard.util import tensor_util

logging.getLogger("tensorboard").setLevel(logging.ERROR)  # each purge's warning: the checks below say what happened

SCALAR_TAGS = ["train/loss", "train/lr", "train/grad_norm", "perf/step_ms", "perf/tok_per_s", "perf/mfu_percent",
               "val/loss", "eval/accuracy", "train/skipped_updates"]
TEXT_TAGS = ["config", "samples"]
# main.log's fields: the tag each becomes, and the decimals it is printed with (-6: %.6e, relative).
FIELDS = {"trl": ("train/loss", 6), "lr": ("train/lr", -6), "norm": ("train/grad_norm", 6), "ms": ("perf/step_ms", 3),
          "tok/s": ("perf/tok_per_s", 0), "mfu": ("perf/mfu_percent", 2), "tel": ("val/loss", 6),
          "eval": ("eval/accuracy", 4)}

passed = 0
failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok    " + name)
    else:
        failed += 1
        print("FAIL  " + name + (": " + detail if detail else ""))


def purge(series, step):
    """What a session start (a resume, a restart) at `step` leaves of {tag: {step: value}}."""
    for points in series.values():
        for s in [s for s in points if s >= step]:
            del points[s]


def read_main_log(path):
    """main.log as TensorBoard should show it: {tag: {step: (value, decimals)}}, the lines a resume or
    restart supersedes dropped; config (text) at each process's start step."""
    series = {tag: {} for tag in SCALAR_TAGS + TEXT_TAGS}
    starting = False  # a process's first line was read: its start step is in the line after it
    for line in list(open(path, encoding="utf-8")) + [""]:
        if starting:  # a resume at its step; a new run, or a restart from scratch, at 0
            resumed = re.match(r"# resumed at step (\d+)", line)
            start = int(resumed.group(1)) if resumed else 0
            purge(series, start)
            series["config"][start] = None
        starting = line.startswith("# tokens per step:")
        if line.startswith("s:") and " skipped: " in line:
            skipped = series["train/skipped_updates"]
            skipped[int(line[2:].split()[0])] = (float(len(skipped) + 1), 0)  # the count so far
        elif line.startswith("s:"):
            step = int(line[2:].split()[0])
            for field in line.split()[1:]:
                name, value = field.split(":", 1)
                tag, decimals = FIELDS[name]
                series[tag][step] = (float(value), decimals)
    return series


def read_events(logdir, accumulator):
    """Every tag's points as one of TensorBoard's EventAccumulators keeps them: {tag: [(step, value)]}."""
    if accumulator == "event_accumulator":
        acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0,
                                                                        event_accumulator.TENSORS: 0})
        acc.Reload()
        out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
        for tag in acc.Tags()["tensors"]:
            out[tag] = [(e.step, e.tensor_proto.string_val[0].decode("utf-8")) for e in acc.Tensors(tag)]
        return out
    acc = plugin_event_accumulator.EventAccumulator(logdir, size_guidance={plugin_event_accumulator.TENSORS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        values = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in acc.Tensors(tag)]
        out[tag] = [(s, v.decode("utf-8") if isinstance(v, bytes) else v) for s, v in values]
    return out


def raw_steps(logdir, tag):
    """The steps of `tag` in the files themselves, in the order written (no purge)."""
    steps = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


def near(logged, decimals, value):
    """A scalar as TensorBoard holds it (float32) against main.log's printed value."""
    if math.isnan(logged) or math.isnan(value):
        return math.isnan(logged) and math.isnan(value)
    printed = abs(logged) * 0.5e-6 if decimals < 0 else 0.5 * 10.0 ** -decimals
    return abs(value - logged) <= 1.01 * (printed + abs(logged) * 2.0 ** -24) + 1e-30


def compare(name, logdir, expected_tags, texts=None):
    """The run in logdir against its main.log, read by both accumulators."""
    log = read_main_log(os.path.join(logdir, "main.log"))
    for accumulator in ["event_accumulator", "plugin_event_accumulator"]:
        events = read_events(logdir, accumulator)
        where = "%s (%s)" % (name, accumulator)
        check(where + ": every tag", all(tag in events for tag in expected_tags),
              "missing %s" % [tag for tag in expected_tags if tag not in events])
        # event_accumulator's purge leaves tensors, text among them: only its scalars are checked
        text_purged = accumulator == "plugin_event_accumulator"
        checked = {tag: points for tag, points in events.items() if text_purged or tag in SCALAR_TAGS}
        increasing = all(all(a[0] < b[0] for a, b in zip(points, points[1:])) for points in checked.values())
        check(where + ": steps strictly increasing in every tag", increasing,
              str({tag: [s for s, _ in points] for tag, points in checked.items()}))
        bad = []
        for tag in SCALAR_TAGS:
            points = events.get(tag, [])
            if [s for s, _ in points] != sorted(log[tag]):
                bad.append("%s steps %s, main.log %s" % (tag, [s for s, _ in points], sorted(log[tag])))
            bad += ["%s step %d: %r, main.log %r" % (tag, s, v, log[tag][s][0]) for s, v in points
                    if s in log[tag] and not near(log[tag][s][0], log[tag][s][1], v)]
        check(where + ": scalars equal main.log's", not bad, "; ".join(bad[:5]))
        if not text_purged:
            continue
        config_steps = [s for s, _ in events.get("config", [])]
        check(where + ": config at each process's start step", config_steps == sorted(log["config"]),
              "%s, main.log %s" % (config_steps, sorted(log["config"])))
        for tag, expected in (texts or {}).items():
            check(where + ": %s text" % tag, events.get(tag) == expected, "%r" % events.get(tag))


def cpu_part():
    work = tempfile.mkdtemp(prefix="test_tensorboard_")
    try:
        run = os.path.join(work, "demo")
        subprocess.run(["build/tensorboard_demo", run], check=True)
        config = lambda step: "    | config | started at step %d |\n    " % step
        sample = lambda step, process: "    sample at step %d\n    process %d" % (step, process)
        compare("demo", run, SCALAR_TAGS + TEXT_TAGS,
                {"config": [(0, config(0)), (6, config(6))],
                 "samples": [(4, sample(4, 0)), (8, sample(8, 1)), (12, sample(12, 1))]})
        check("demo: two event files, names in the order written", len(glob.glob(run + "/events.out.tfevents.*")) == 2)
        check("demo: the files still hold the first process's steps 6..9",
              raw_steps(run, "train/loss") == list(range(10)) + list(range(6, 13)), str(raw_steps(run, "train/loss")))
        acc = event_accumulator.EventAccumulator(run, size_guidance={event_accumulator.SCALARS: 0},
                                                 purge_orphaned_data=False)
        acc.Reload()
        kept = [e.step for e in acc.Scalars("train/loss")]
        check("demo: without purge_orphaned_data the steps 6..9 of both processes show",
              kept == raw_steps(run, "train/loss"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


TRAIN = ["./train_gpt2_fp32", "-e", "d12", "-b", "4", "-t", "256", "-d", "2048", "-v", "6", "-m", "2", "-s", "6",
         "-g", "16", "-n", "6"]
EVAL = ["--eval", "dev/test/fixtures/eval_tiny.jsonl", "--eval-every", "6"]


def train(work, name, *flags, ok=True):
    with open(os.path.join(work, name + ".out"), "a") as out:
        status = subprocess.run(TRAIN + list(flags), stdout=out, stderr=subprocess.STDOUT).returncode
    if (status == 0) != ok:
        print(open(os.path.join(work, name + ".out")).read()[-3000:])
        check("%s: exit status %d" % (name, status), False)


def train_until_step(work, name, step, *flags):
    """Starts a run and kills it (SIGKILL) once main.log holds step `step`'s line and a checkpoint is
    complete (`latest`: checkpoints are written beside the steps)."""
    out = open(os.path.join(work, name + ".out"), "a")
    process = subprocess.Popen(TRAIN + list(flags), stdout=out, stderr=subprocess.STDOUT)
    folder = flags[flags.index("-o") + 1]
    log, latest = os.path.join(folder, "main.log"), os.path.join(folder, "latest")
    while process.poll() is None and not (os.path.exists(latest) and os.path.exists(log) and
                                          ("s:%d trl:" % step) in open(log).read()):
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    out.close()


def gpu_part():
    work = tempfile.mkdtemp(prefix="test_tensorboard_gpu_")
    try:
        straight = os.path.join(work, "straight")
        train(work, "straight", "-x", "12", "-o", straight, "--debug-nan-step", "3", *EVAL)
        compare("straight run", straight, SCALAR_TAGS + TEXT_TAGS)
        check("straight run: # tokens per step: 2048",
              "# tokens per step: 2048\n" in open(straight + "/main.log").read())

        resumed = os.path.join(work, "resumed")
        train(work, "resumed", "-x", "12", "-o", resumed, "--stop-at", "6")
        train(work, "resumed", "-x", "12", "-o", resumed, "-y", "1")
        compare("--stop-at 6, then -y 1", resumed, ["train/loss", "val/loss", "samples", "config"])

        killed = os.path.join(work, "killed")
        train_until_step(work, "killed", 8, "-x", "20", "-o", killed)
        logged = max(int(m) for m in re.findall(r"^s:(\d+) trl", open(killed + "/main.log").read(), re.M))
        train(work, "killed", "-x", "20", "-o", killed, "-y", "1")
        resumed_at = re.search(r"# resumed at step (\d+)", open(killed + "/main.log").read())
        check("killed after a checkpoint: steps past it were logged before the resume",
              resumed_at is not None and logged >= int(resumed_at.group(1)), "last step %d, %s" % (logged, resumed_at))
        compare("killed after a checkpoint, then -y 1", killed, ["train/loss", "val/loss", "samples", "config"])

        requeued = os.path.join(work, "requeued")
        train(work, "requeued", "-x", "12", "-o", requeued, "--debug-nan-step", "2", "--max-skips", "1", ok=False)
        train(work, "requeued", "-x", "12", "-o", requeued, "-y", "1")
        check("requeued without a checkpoint: the failed run's steps are in its file",
              raw_steps(requeued, "train/loss")[:3] == [0, 1, 2], str(raw_steps(requeued, "train/loss")))
        compare("requeued -y 1 without a checkpoint (restart)", requeued, ["train/loss", "val/loss", "config"])

        off = os.path.join(work, "off")
        train(work, "off", "-x", "1", "-o", off, "--tensorboard", "0")
        check("--tensorboard 0: no event file", not glob.glob(off + "/events.out.tfevents.*"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    cpu_part()
    gpu = shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    if not gpu:
        print("SKIPPED (no GPU): TensorBoard events of training runs")
    else:
        gpu_part()
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
