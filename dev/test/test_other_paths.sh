#!/usr/bin/env bash
# GPU test of the paths of other GPUs, on this one: the trainer and the test binary built as
# compute_75 PTX (the FP32-core paths of Pascal, Volta and Turing: plain FP32 products, FP32-core
# flash attention) and as compute_80 PTX (TF32 mma.sync, as on Ampere, Ada and Blackwell), which the
# driver compiles at start; and this GPU's build under a block's shared memory capped as on other
# GPUs (GPT2_TEST_SHARED_KB: 99 KB RTX 30/40/50, whose hs 128 takes the 16-row dQ and dK/dV tiles;
# 48 KB, below every GPU with TF32 cores, the FP32-core attention beside TF32 products, its backward
# with the plans for 64 KB multiprocessors as on a T4). Each: the PyTorch fixtures at -f 0/1/2 for
# both attention kinds and --decode, and a short training run twice, bit-identical; at hs 128 and
# T = 200 (a multiple of no tile) the same runs of the compute_75 build and under the 99 and 48 KB
# caps. Then the lab's attention check under the 99 KB cap at hs 32, 64 and 128, T = 1, 77, 130,
# 200 and 333: the tensor cores (variants 2, 3: the small tiles at hs 128) and the FP32 cores
# (variant 10; variant 11 its plans for 64 KB multiprocessors). Last, our Hopper GEMMs and the
# wgmma attention forward under compute-sanitizer's racecheck on the lab's small shapes. Prints its
# time.
set -u
cd "$(dirname "$0")/../.."
start=$SECONDS
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIPPED (no GPU): other GPUs' paths (compute_75 and compute_80 PTX builds, shared-memory caps)"
  exit 0
fi
source dev/test/runs.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
make -s -j"$(nproc)" build/compute_75/test_gpt2_fp32 build/compute_75/train_gpt2_fp32 \
  build/compute_80/test_gpt2_fp32 build/compute_80/train_gpt2_fp32 > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; echo "FAIL  the compute_75 and compute_80 builds"; exit 1; }
echo "(builds: $((SECONDS - start)) s)"

# fixtures DIR: the test binary of DIR on every fixture check
fixtures() {
  local args log
  log=$(mktemp -p "$work")
  for args in "${fixture_runs[@]}"; do
    # shellcheck disable=SC2086  # args: the flags, split
    "$1/test_gpt2_fp32" $args > "$log" 2>&1 || { echo "    $1/test_gpt2_fp32 $args:"; grep -E 'FAIL|error' "$log" | head -n 8; return 1; }
  done
}
# twice DIR NAME KIND [SHAPE]: two short runs of DIR's trainer (d12 at T = 128, or SHAPE's -e, -b, -t
# and -d), bit-identical (their logs kept as NAME_a, NAME_b)
twice() {
  local run="$1/train_gpt2_fp32 ${4:-"-e d12 -b 4 -t 128 -d 1024"} -x 6 -v 3 -m 2 -s 0 -A $3"
  $run > "$work/$2_a.log" 2>&1 && $run > "$work/$2_b.log" 2>&1 &&
    grep -q '^step     6/6' "$work/$2_a.log" && diff <(numbers "$work/$2_a.log") <(numbers "$work/$2_b.log") > /dev/null
}
attention_row() { grep '^| attention kernels' "$work/$1_a.log" | sed 's/ *|$//; s/.*| //'; }
# configuration ID WHAT DIR [KB [SHAPE]]: DIR's binaries (with a block's shared memory capped at KB,
# none if empty) on every fixture check (d12's shape only: the fixtures' hs is 64) and two training
# runs of each kind (logs ID_a, ID_b, of SHAPE's model if given: twice), its check lines printed
configuration() {
  local name=$1 what=$2 dir=$3 shape=${5:-}
  [ -z "${4:-}" ] || export GPT2_TEST_SHARED_KB=$4
  [ -n "$shape" ] || check "$what: every fixture check (-f 0, 1, 2, both kinds) and --decode" fixtures "$dir"
  check "$what: a training run twice, bit-identical (softmax)" twice "$dir" "$name" softmax "$shape"
  check "$what: a training run twice, bit-identical (ReLU)" twice "$dir" "${name}_relu" relu "$shape"
}
hs128="-e L2C256H2 -b 4 -t 200 -d 1600"  # hs 128, T = 200: 2 layers of 2 heads, 2 micro-steps
# The configurations at once (each a small run on the same GPU), their lines in order.
names=(compute_75 compute_80 cap99 cap48 compute_75_hs128 cap99_hs128 cap48_hs128)
configuration compute_75 "compute_75 PTX" build/compute_75 > "$work/compute_75.out" 2>&1 &
configuration compute_80 "compute_80 PTX" build/compute_80 > "$work/compute_80.out" 2>&1 &
configuration cap99 "this GPU's build, 99 KB a block" . 99 > "$work/cap99.out" 2>&1 &
configuration cap48 "this GPU's build, 48 KB a block" . 48 > "$work/cap48.out" 2>&1 &
configuration compute_75_hs128 "compute_75 PTX, hs 128, T 200" build/compute_75 "" "$hs128" \
  > "$work/compute_75_hs128.out" 2>&1 &
configuration cap99_hs128 "this GPU's build, 99 KB a block, hs 128, T 200" . 99 "$hs128" > "$work/cap99_hs128.out" 2>&1 &
configuration cap48_hs128 "this GPU's build, 48 KB a block, hs 128, T 200" . 48 "$hs128" > "$work/cap48_hs128.out" 2>&1 &
wait
for name in "${names[@]}"; do cat "$work/$name.out"; done
passed=$(cat "$work"/*.out | grep -c '^ok')
failed=$(cat "$work"/*.out | grep -c '^FAIL')
check "compute_75 PTX runs the FP32-core attention and plain FP32 products" \
  eval "attention_row compute_75 | grep -q '^FP32 cores' && grep -q 'FP32 (plain), every -f' '$work/compute_75_a.log'"
check "compute_80 PTX runs mma.sync (no wgmma) and TF32 products" \
  eval "attention_row compute_80 | grep -q '^mma.sync forward, mma.sync backward' && grep -qE '^\| matmul precision +\| TF32 ' '$work/compute_80_a.log'"

check "compute_75 PTX at hs 128: the FP32-core attention" eval "attention_row compute_75_hs128 | grep -q '^FP32 cores (hs 128'"
check "48 KB a block: the FP32-core attention (the mma.sync forward's tiles need 64 KB), its backward planned for 64 KB multiprocessors" \
  eval "attention_row cap48 | grep -q '^FP32 cores.*the backward planned for 64 KB multiprocessors'"
check "48 KB a block at hs 128: the FP32-core backward planned for 64 KB multiprocessors" \
  eval "attention_row cap48_hs128 | grep -q '^FP32 cores (hs 128.*the backward planned for 64 KB multiprocessors'"
check "compute_75 PTX on this GPU's multiprocessors: the FP32-core backward's plans of today" \
  eval "attention_row compute_75 | grep -q '^FP32 cores' && ! attention_row compute_75 | grep -q 'planned for 64 KB'"
check "99 KB a block (below this GPU's): the tensor-core kernels with the default tiles at hs 64" \
  eval "capped_below_gpu '$work/cap99_a.log' 99 && attention_row cap99 | grep -qE 'mma.sync backward \(dQ 32 keys, dK/dV 64 queries'"
check "99 KB a block at hs 128: the 16-row dQ and dK/dV tiles (the default ones need 128 KB)" \
  eval "attention_row cap99_hs128 | grep -qE 'mma.sync backward \(dQ 16 keys, dK/dV 16 queries'"
if [ -x dev/cuda/attention ]; then
  check "99 KB a block: the lab's attention check (hs 32, 64, 128, ragged T; tensor cores, FP32 cores and their 64 KB-SM plans)" \
    eval "GPT2_TEST_SHARED_KB=99 dev/cuda/attention --small 2 3 10 11 > '$work/lab99.log' 2>&1 || { tail -n 20 '$work/lab99.log'; false; }"
else
  echo "SKIPPED (dev/cuda/attention not built): the lab's attention check at 99 KB"
fi
# Our Hopper GEMMs (the trainer's gemm_tf32, for fc + GELU and the LM head's logits, and
# gemm_split_tf32, -f 0's products) under racecheck, on the lab's odd shapes (edge tiles) with and
# without the GELU epilogue, a stored and transposed.
# racecheck_clean LOG STATUS: racecheck exited 0 and found no hazard, and (the premise) the lab's
# log has each kernel's rows of its odd shapes, none over its tolerance: the kernels ran under it.
racecheck_clean() {
  local log=$1 status=$2 row
  [ "$status" -eq 0 ] && grep -q 'RACECHECK SUMMARY: 0 hazards' "$log" || return 1
  for row in '2 gemm_tf32.*, odd 1000x1004x772' '2 gemm_tf32.*, odd 1000x1004x772 \+ gelu' \
             '5 gemm_split_tf32.*, odd 1000x1004x772' '5 gemm_split_tf32.*, odd 1000x1004x772 a_t'; do
    grep -E "^\| matmul_wgmma +\| $row +\|" "$log" | grep -qv FAIL || return 1
  done
}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x dev/cuda/matmul_wgmma ] && [ -x "$sanitizer" ]; then
  "$sanitizer" --tool racecheck --error-exitcode 1 dev/cuda/matmul_wgmma --small 2 5 > "$work/gemm_racecheck.log" 2>&1
  racecheck_status=$?
  if grep -q '^SKIPPED' "$work/gemm_racecheck.log"; then
    echo "SKIPPED ($(grep '^SKIPPED' "$work/gemm_racecheck.log" | sed 's/^SKIPPED: //')): our GEMMs under racecheck"
  else
    check "gemm_tf32 and gemm_split_tf32 under racecheck (edge tiles, the GELU, a transposed): no hazard, every check within tolerance" \
      eval "racecheck_clean '$work/gemm_racecheck.log' $racecheck_status || { tail -n 20 '$work/gemm_racecheck.log'; false; }"
  fi
else
  echo "SKIPPED (dev/cuda/matmul_wgmma not built or no compute-sanitizer): our GEMMs under racecheck"
fi
# The Hopper attention forward (four warpgroups a CTA at hs 64, two at hs 32 and 128) under
# racecheck, on the lab's small checks (hs 32, 64, 128, ragged T), only its kernel instrumented.
# attention_racecheck_clean LOG STATUS FILTER: racecheck exited 0 and found no hazard, every check
# passed, and (the premise) FILTER names a kernel of the lab binary and each head size's check of
# variant 4 took the wgmma forward (the lab prints the trainer's plan): the kernel ran under it.
attention_racecheck_clean() {
  local log=$1 status=$2 filter=$3 hs
  [ "$status" -eq 0 ] && grep -q 'RACECHECK SUMMARY: 0 hazards' "$log" && grep -q '^PASS' "$log" || return 1
  "$(dirname "$sanitizer")/cuobjdump" -symbols dev/cuda/attention | grep -q "STT_FUNC.*$filter" || return 1
  for hs in 32 64 128; do
    grep -qE "^check .* hs$hs .* 4 flash TF32 wgmma .* ok, path: wgmma forward" "$log" || return 1
  done
}
if [ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1)" != 9.0 ]; then
  echo "SKIPPED (not a Hopper GPU): the wgmma attention forward under racecheck"
elif [ -x dev/cuda/attention ] && [ -x "$sanitizer" ]; then
  filter=flash_forward_wgmma
  "$sanitizer" --tool racecheck --error-exitcode 1 --kernel-name kns=$filter dev/cuda/attention --small 4 \
    > "$work/attention_racecheck.log" 2>&1
  racecheck_status=$?
  check "the wgmma attention forward under racecheck (hs 32, 64, 128, ragged T): no hazard, every check passing" \
    eval "attention_racecheck_clean '$work/attention_racecheck.log' $racecheck_status $filter ||
          { tail -n 20 '$work/attention_racecheck.log'; false; }"
else
  echo "SKIPPED (dev/cuda/attention not built or no compute-sanitizer): the wgmma attention forward under racecheck"
fi
echo "$passed passed, $failed failed (other paths: $((SECONDS - start)) s)"
[ "$failed" -eq 0 ]
