#!/usr/bin/env bash
# GPU test of whole training runs of ./train_gpt2_fp32 (GPT-2 124M, B=4, T=256, 2 micro-steps):
#  - the same seed and data give bit-identical losses, norms and weights, also when the backward
#    pass recomputes residual2 (-r 1); another seed does not;
#  - 30 steps straight equal 15 steps + resume (-y 1) + 15 steps, bit for bit;
#  - resume and output-directory mistakes give a one-line error and a non-zero exit; -y 1 where no
#    checkpoint was ever completed starts from scratch; a damaged latest checkpoint makes resume
#    fall back to the one before.
set -u
cd "$(dirname "$0")/../.."
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIPPED (no GPU): training runs (determinism, resume)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run="./train_gpt2_fp32 -e d12 -b 4 -t 256 -d 2048 -l 6e-4 -u 5 -k cosine -q 0.1 -c 0.1 -v 10 -m 2 -s 0"
source dev/test/runs.sh

$run -x 20 --seed 1 > "$work/a.log" 2>&1
$run -x 20 --seed 1 > "$work/b.log" 2>&1
$run -x 20 --seed 2 > "$work/c.log" 2>&1
$run -x 20 --seed 1 -r 1 > "$work/r.log" 2>&1
check "20 steps ran" grep -q "^step    20/20" "$work/a.log"
check "same seed: bit-identical losses, norms, weights" diff <(numbers "$work/a.log") <(numbers "$work/b.log")
check "-r 1 (residual2 recomputed): bit-identical losses, norms, weights" \
  diff <(numbers "$work/a.log") <(numbers "$work/r.log")
check "other seed: different weights" test "$(grep checksum "$work/a.log")" != "$(grep checksum "$work/c.log")"

$run -x 30 --seed 1 -n 15 -o "$work/straight" > "$work/straight.log" 2>&1
$run -x 30 --seed 1 -n 15 -o "$work/resumed" --stop-at 15 > "$work/first.log" 2>&1
$run -x 30 --seed 1 -n 15 -o "$work/resumed" -y 1 > "$work/second.log" 2>&1
check "resume: checkpoint at step 15 written" test -f "$work/resumed/model_00000015.bin"
check "resume: steps 16-30 and weights bit-identical" \
  diff <(numbers_from "$work/straight.log" 16) <(numbers_from "$work/second.log" 16)
check "resume: steps 16-30 ran" grep -q "^step    30/30" "$work/second.log"

check "resume with another -b fails" fails_with "flag -b: differs from the run being resumed" \
  ./train_gpt2_fp32 -e d12 -b 2 -t 256 -d 2048 -l 6e-4 -u 5 -k cosine -q 0.1 -c 0.1 -x 30 --seed 1 -o "$work/resumed" -y 1
mkdir -p "$work/empty"
$run -x 2 -o "$work/empty" -y 1 > "$work/empty.log" 2>&1
check "-y 1 without a checkpoint starts from scratch, saying so" \
  grep -q "no checkpoint in .* was ever completed: starting from scratch" "$work/empty.log"
check "a new run refuses a directory holding a run" fails_with "already holds a run" $run -x 30 -o "$work/resumed"
head -c 5000 "$work/resumed/state_00000030.bin" > "$work/truncated" && mv "$work/truncated" "$work/resumed/state_00000030.bin"
$run -x 30 --seed 1 -n 15 -o "$work/resumed" -y 1 > "$work/fallback.log" 2>&1
check "a truncated checkpoint: named, and resume falls back to the one before" \
  grep -q "checkpoint of step 30 is damaged: .*truncated" "$work/fallback.log"
check "the fallback resume is bit-identical" diff <(numbers_from "$work/straight.log" 16) <(numbers_from "$work/fallback.log" 16)

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
