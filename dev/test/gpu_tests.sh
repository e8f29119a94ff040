#!/usr/bin/env bash
# The GPU part of `make test`, in groups that need one GPU each: the test binary on the committed
# PyTorch fixtures (every -f, both attention kinds, chunked split products, a Hugging Face model,
# decode), whole training runs, the fault tests (three parts), the TensorBoard files of a run and
# other GPUs' paths (PTX builds, shared-memory caps); then the data-parallel runs on every GPU.
# The one-GPU groups run at the same time, group i on GPU i mod the count where
# there are several, all on the one GPU where it has memory for them (24 GB: their runs are small),
# else one after the other. Each group's output is printed whole, in order, with its time; the exit
# status is non-zero if any group failed. Without a GPU every group prints its SKIPPED line.
set -u
cd "$(dirname "$0")/../.."
fixtures=dev/test/fixtures
started=$SECONDS

fixture_checks() {
  local small=$fixtures/gpt2_small status=0 args
  for args in "-f 0 -m ${small}_softmax_model.bin -s ${small}_softmax_state.bin" \
              "-f 0 -m ${small}_relu_model.bin -s ${small}_relu_state.bin" \
              "-f 0 -c 32 -m ${small}_softmax_model.bin -s ${small}_softmax_state.bin" \
              "-f 1 -m ${small}_softmax_model.bin -s ${small}_softmax_state.bin" \
              "-f 1 -m ${small}_relu_model.bin -s ${small}_relu_state.bin" \
              "-f 2 -m ${small}_softmax_model.bin -s ${small}_softmax_state.bin" \
              "-f 2 -m ${small}_relu_model.bin -s ${small}_relu_state.bin" \
              "-f 0 -m $fixtures/hf_tiny -s $fixtures/hf_tiny_classic_state.bin" \
              "--decode"; do
    echo "./test_gpt2_fp32 $args"
    # shellcheck disable=SC2086  # args: the flags, split
    ./test_gpt2_fp32 $args || status=1
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
together=0
if [ "$count" -gt 1 ]; then
  together=1
elif [ "$count" = 1 ]; then
  memory_mib=$(nvidia-smi --id="${gpu_ids[0]}" --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null)
  [ "${memory_mib:-0}" -lt 24000 ] || together=1
fi
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
pids=()
for i in "${!groups[@]}"; do
  if [ "$together" = 1 ]; then run_group "$i" "${groups[$i]}" & pids+=($!); else run_group "$i" "${groups[$i]}"; fi
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
for group in "${groups[@]}"; do
  echo "== $group"
  cat "$logs/$group"
  grep -q "FAILED (exit status" "$logs/$group" && failed=1
done
echo "== multi_gpu"
start=$SECONDS
dev/test/test_multi_gpu.sh || failed=1
echo "multi_gpu: $((SECONDS - start)) s"
echo "GPU tests: $((SECONDS - started)) s ($([ "$together" = 1 ] && echo "groups at once on $count GPU(s)" || echo "groups one after the other"))"
exit $failed
