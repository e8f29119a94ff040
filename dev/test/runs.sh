# Shared by the GPU tests of whole training runs (sourced): checks with a pass/fail count, and the
# numbers of a run's log that must match bit for bit.
passed=0
failed=0
check() {  # check NAME COMMAND...: the command must succeed
  local name=$1
  shift
  if "$@"; then echo "ok    $name"; passed=$((passed + 1)); else echo "FAIL  $name"; failed=$((failed + 1)); fi
}
# The numbers of a log: each step's loss, lr and norm (not its timings), val losses, the checksum
# (not the "step times:" line).
numbers() { grep -E '^step|^weights checksum' "$1" | grep -v '^step times:' | awk -F'|' '{print $1 $2 $3 $4}'; }
# The numbers of a log from step $2 on (train steps are 1-based, val steps 0-based), and its checksum.
numbers_from() { numbers "$1" | awk -v first="$2" '/^step/ { n = $0; sub(/^step +/, "", n); if (n + 0 < first) next } { print }'; }
fails_with() {  # fails_with FRAGMENT COMMAND...: the command must exit non-zero, saying FRAGMENT
  local fragment=$1 out
  shift
  out=$("$@" 2>&1) && return 1
  grep -qF -- "$fragment" <<< "$out" || { echo "      got: $(tail -n 2 <<< "$out")"; return 1; }
}
# capped_below_gpu LOG KB: LOG's process planned its kernels for KB of shared memory a block
# (GPT2_TEST_SHARED_KB), less than its GPU has: the cap took effect
capped_below_gpu() {
  local gpu
  gpu=$(sed -n "s/^GPT2_TEST_SHARED_KB: the kernels planned for $2 KB of shared memory a block (this GPU: \([0-9]*\) KB)$/\1/p" "$1")
  [ -n "$gpu" ] && [ "$gpu" -gt "$2" ] || { echo "      $1: no cap of $2 KB below the GPU's"; return 1; }
}
# The test binary's checks on the committed PyTorch fixtures, the flags of one run each: every -f
# for both attention kinds, then --decode (gpu_tests.sh and test_other_paths.sh; gpu_tests.sh adds
# the chunked split products and the Hugging Face model).
fixture_small=dev/test/fixtures/gpt2_small
fixture_runs=()
for fixture_f in 0 1 2; do
  for fixture_kind in softmax relu; do
    fixture_runs+=("-f $fixture_f -m ${fixture_small}_${fixture_kind}_model.bin -s ${fixture_small}_${fixture_kind}_state.bin")
  done
done
fixture_runs+=(--decode)
