#!/usr/bin/env bash
# The GPU part of `make test`, in groups that need one GPU each: the test binary on the committed
# PyTorch fixtures (every -f, both attention kinds, chunked split products, a Hugging Face model,
# decode), whole training runs, the fault tests (three parts), the TensorBoard files of a run and
# other GPUs' paths (PTX builds, shared-memory caps); then the data-parallel runs on every GPU.
# The one-GPU groups run in waves, group i on GPU i mod the count, as many at once on each GPU as
# the smallest visible GPU's memory allows: all seven from 40 GB, four from 24 GB, else one. Their
# peak memory was not measured (no tool here does it); the caps assume at most about 5 GB a group
# (d12 runs at small B and T: 2 GB of weights, gradients and AdamW moments each) and other_paths'
# six configurations at once the heaviest. Each group's output is printed whole, in order, with its
# time; the exit status is non-zero if any group failed. Without a GPU every group prints its
# SKIPPED line.
set -u
cd "$(dirname "$0")/../.."
started=$SECONDS

source dev/test/runs.sh
fixtures=dev/test/fixtures
# -f 0 -c 32: cuBLASLt's split products in chunks of 32, so that the fixtures' short products take
# both ways of adding chunks; under a 99 KB cap, since on Hopper our GEMM would take them. Its
# premise, checked: the run says it took those chunks of 32 (or that there is no GPU).
said_chunks_of_32() { grep -qE '^(SKIPPED|split TF32: hi hi in chunks of 32 summed values$)' <<< "$1"; }
chunks_of_32() {
  local out status=0
  out=$(GPT2_TEST_SHARED_KB=99 ./test_gpt2_fp32 "$@" 2>&1) || status=1
  echo "$out"
  said_chunks_of_32 "$out" || { echo "FAIL  -f 0 -c 32 did not take cuBLASLt's split chunks of 32"; status=1; }
  return $status
}
fixture_checks() {
  local status=0 args
  for args in "${fixture_runs[@]}" "-f 0 -c 32 -m ${fixture_small}_softmax_model.bin -s ${fixture_small}_softmax_state.bin" \
              "-f 0 -m $fixtures/hf_tiny -s $fixtures/hf_tiny_classic_state.bin"; do
    echo "./test_gpt2_fp32 $args"
    if [[ $args == *"-c 32"* ]]; then
      # shellcheck disable=SC2086  # args: the flags, split
      chunks_of_32 $args || status=1
    else
      # shellcheck disable=SC2086
      ./test_gpt2_fp32 $args || status=1
    fi
  done
  return $status
}
training_runs() { dev/test/test_training_runs.sh; }
faults_guards() { dev/test/test_faults.sh guards; }
faults_signals() { SIGNAL_TRIALS=3 dev/test/test_faults.sh signals; }
faults_kills() { KILL_TRIALS=3 dev/test/test_faults.sh kills; }
tensorboard_files() { dev/test/test_tensorboard.sh; }
other_paths() { dev/test/test_other_paths.sh; }
groups=(fixture_checks training_runs faults_guards faults_signals faults_kills tensorboard_files other_paths)

# The visible GPUs, by their nvidia-smi ids (which CUDA_VISIBLE_DEVICES takes too).
mapfile -t gpu_ids < <(scripts/visible_gpus.sh --ids)
count=${#gpu_ids[@]}
smallest_mib=$(for id in "${gpu_ids[@]}"; do
  nvidia-smi --id="$id" --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null; done | sort -n | head -n 1)
per_gpu=1  # groups at once on each GPU
if [ "${smallest_mib:-0}" -ge 40000 ]; then per_gpu=${#groups[@]}; elif [ "${smallest_mib:-0}" -ge 24000 ]; then per_gpu=4; fi
wave=$((count > 0 ? count * per_gpu : 1))
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# run_group I NAME: group NAME on GPU I % count, its output and time into $logs/NAME
run_group() {
  local start=$SECONDS status=0 visible=
  [ "$count" -lt 2 ] || visible=${gpu_ids[$(($1 % count))]}
  if [ -n "$visible" ]; then CUDA_VISIBLE_DEVICES=$visible "$2" > "$logs/$2" 2>&1 || status=$?
  else "$2" > "$logs/$2" 2>&1 || status=$?; fi
  echo "$2: $((SECONDS - start)) s$([ "$status" = 0 ] || echo ", FAILED (exit status $status)")" >> "$logs/$2"
  return $status
}
failed=0
pids=()
wait_wave() {
  local pid
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
}
for i in "${!groups[@]}"; do
  run_group "$i" "${groups[$i]}" &
  pids+=($!)
  [ "${#pids[@]}" -lt "$wave" ] || wait_wave
done
wait_wave
for group in "${groups[@]}"; do
  echo "== $group"
  cat "$logs/$group"
  grep -q "FAILED (exit status" "$logs/$group" && failed=1
done
echo "== multi_gpu"
start=$SECONDS
dev/test/test_multi_gpu.sh || failed=1
echo "multi_gpu: $((SECONDS - start)) s"
echo "GPU tests: $((SECONDS - started)) s (groups $wave at a time on $count GPU(s))"
exit $failed
