#!/usr/bin/env bash
# GPU test of the faults a long run meets (./train_gpt2_fp32, GPT-2 124M at B=4, T=64):
#  - NaN gradients at one step (the --debug-nan-step hook): the update is skipped, weights, moments
#    and Adam's step count unchanged bit for bit, and the run goes on;
#  - a divergent run (-l 1e3 -gc 0) stops non-zero after --max-skips skipped updates;
#  - the spike guard (-sg) skips the same steps in a straight and in a resumed run;
#  - a model with a NaN weight is refused at load, naming the tensor and index;
#  - SIGTERM at random steps: a checkpoint, exit status 75, and the resumed run ends bit-identical
#    to one never interrupted (SIGNAL_TRIALS times; every other trial's signal lands during a
#    background write slowed by the test switch GPT2_TEST_CHECKPOINT_DELAY_MS, which the run waits for);
#  - kill -9 at random times, mostly while checkpoints are being written, then resume: bit-identical
#    to the straight run, and no temporary file left behind (KILL_TRIALS times; every other trial
#    kills during a slowed background write);
#  - a requeued job: the same -y 1 command killed five times at random from its first second on
#    (before its first checkpoint too), then run to the end: bit-identical to the straight run;
#  - a model file left above `latest` by a writer killed between the model and the state file,
#    then a resumed run that checkpoints at a lower step with -nk 1: the pair `latest` names is
#    kept, the orphan removed, the resume bit-identical;
#  - a flipped byte in the latest state file: resume falls back to the checkpoint before it;
#  - a full disk (a file-size limit) while checkpointing, in the background and with
#    --checkpoint-sync 1: an error naming the file, no temporary file left;
#  - background and synchronous writes give the same bytes.
# Three parts, each runnable alone (`test_faults.sh guards|signals|kills`; none: all): guards (NaN,
# divergence, spike, bad weights, full disk), signals (SIGTERM, SIGINT), kills (kill -9, requeue,
# orphan, flipped byte). Prints its time.
set -u
cd "$(dirname "$0")/../.."
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIPPED (no GPU): fault tests (guards, signals, kills, corrupt checkpoints)"
  exit 0
fi
SIGNAL_TRIALS=${SIGNAL_TRIALS:-10}
KILL_TRIALS=${KILL_TRIALS:-20}
PARALLEL_TRIALS=${PARALLEL_TRIALS:-5}  # trials at once (each a d12 run of ~2 GB on the GPU, 1.5 GB checkpoints on disk)
part=${1:-all}  # guards, signals or kills: one part (make test runs the three at once), else all
case "$part" in guards|signals|kills|all) ;; *) echo "usage: $0 [guards|signals|kills]" >&2; exit 2 ;; esac
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run="./train_gpt2_fp32 -e d12 -b 4 -t 64 -l 6e-4 -u 3 -c 0.1 -v 0 -s 0 --seed 7"
source dev/test/runs.sh
checksum() { grep '^weights checksum' "$1"; }
no_temp_files() { ! ls "$1" | grep -q '\.tmp\.'; }
# resumed_at LOG STEP: LOG's -y 1 run resumed at STEP, or (STEP empty: there was no checkpoint) started
# from scratch; a run that silently started over would end bit-identical too
resumed_at() {
  if [ -n "$2" ]; then grep -q "^resumed from .* at step $2 on" "$1"; else grep -q "^-y 1: no checkpoint .* starting from scratch" "$1"; fi
}
differ() { ! cmp -s "$1" "$2"; }
# header int slot $2 of file $1
header_int() { od -An -t d4 -j $((4 * $2)) -N 4 "$1" | tr -d ' '; }
# in_parallel N FUNCTION: FUNCTION 1 .. FUNCTION N, PARALLEL_TRIALS at a time (each a run on the
# same GPU), their output in trial order
in_parallel() {
  local n=$1 fn=$2 i
  for i in $(seq "$n"); do
    "$fn" "$i" > "$work/trial_${fn}_$i.out" &
    (( i % PARALLEL_TRIALS == 0 )) && wait
  done
  wait
  for i in $(seq "$n"); do cat "$work/trial_${fn}_$i.out"; done
}
# runs "$@" in the background until its log ($1) has a line matching $2, then after $3 seconds
# sends signal $4; waits, echoes the status
interrupt_on() {
  local log=$1 pattern=$2 pause=$3 sig=$4
  shift 4
  "$@" > "$log" 2>&1 &
  local pid=$!
  until grep -qE "$pattern" "$log" 2> /dev/null || ! kill -0 $pid 2> /dev/null; do sleep 0.02; done
  sleep "$pause"
  kill -"$sig" $pid 2> /dev/null
  wait $pid 2> /dev/null
  echo $?
}
# runs "$@" until its log ($1) shows step $2, then sends signal $3; echoes the status
interrupt_at() { local log=$1 step=$2 sig=$3; shift 3; interrupt_on "$log" "^step +$step/" 0 "$sig" "$@"; }
# $slowed $run ...: the test switch pauses the checkpoint writer 400 ms before each of its files, so
# that a write lasts more than 1.2 s and a fault sent within_slow_write after it starts lands during
# it (env execs the trainer: the signal reaches it, not a shell)
slowed="env GPT2_TEST_CHECKPOINT_DELAY_MS=400"
within_slow_write() { local r=$((RANDOM % 110)); printf '%d.%02d' $((r / 100)) $((r % 100)); }  # 0.00 .. 1.09 s

if want guards; then
# NaN gradients at step 5 (0-based): checkpoints after steps 5 and 6 hold the same weights and moments
$run -x 7 -n 1 -o "$work/nan" --debug-nan-step 5 > "$work/nan.log" 2>&1
check "NaN gradients: the run finishes" grep -q "^step     7/7" "$work/nan.log"
check "NaN gradients: the skip is logged" grep -q "^s:5 skipped: non-finite norm" "$work/nan/main.log"
check "NaN gradients: weights unchanged over the skipped step" cmp -s "$work/nan/model_00000005.bin" "$work/nan/model_00000006.bin"
check "NaN gradients: moments unchanged" cmp -s <(tail -c +1025 "$work/nan/state_00000005.bin") <(tail -c +1025 "$work/nan/state_00000006.bin")
check "NaN gradients: Adam's step count did not advance" \
  test "$(header_int "$work/nan/state_00000006.bin" 3)" = 5 -a "$(header_int "$work/nan/state_00000007.bin" 3)" = 6
check "NaN gradients: the next step updates" differ "$work/nan/model_00000006.bin" "$work/nan/model_00000007.bin"

check "divergence (-l 1e3 -gc 0) stops non-zero" fails_with "updates in a row skipped" \
  ./train_gpt2_fp32 -e d12 -b 4 -t 64 -l 1e3 -gc 0 -v 0 -s 0 -x 40

# spike guard with a short window: straight against stopped + resumed
spiky="$run -x 30 -n 10 -nk 1 -sg 1.0 --spike-window 4"
$spiky -o "$work/spike_a" > "$work/spike_a.log" 2>&1
$spiky -o "$work/spike_b" --stop-at 10 > /dev/null 2>&1
$spiky -o "$work/spike_b" -y 1 > "$work/spike_b.log" 2>&1
check "spike guard: some updates skipped" grep -q "skipped: norm spike" "$work/spike_a/main.log"
check "spike guard: a resumed run skips the same steps" \
  diff <(grep skipped "$work/spike_a/main.log") <(grep skipped "$work/spike_b/main.log")
check "spike guard: resumed run bit-identical" diff <(numbers_from "$work/spike_a.log" 11) <(numbers_from "$work/spike_b.log" 11)

# a NaN weight (in a model file without a checksum) is refused at load
cp "$work/nan/model_00000001.bin" "$work/nan_weight.bin"
rm -rf "$work/nan" "$work/spike_a" "$work/spike_b"  # a d12 checkpoint is 1.5 GB
printf '\x00\x00\x00\x00' | dd of="$work/nan_weight.bin" bs=1 seek=36 conv=notrunc 2> /dev/null  # slot 9: no checksum
printf '\xff\xff\xc0\x7f' | dd of="$work/nan_weight.bin" bs=1 seek=$((1024 + 4 * 123)) conv=notrunc 2> /dev/null
check "a NaN weight is refused, naming it" fails_with "wte[123] is not finite" $run -x 2 -e "$work/nan_weight.bin"
printf '\x01\x00\x00\x00' | dd of="$work/nan_weight.bin" bs=1 seek=36 conv=notrunc 2> /dev/null
check "a corrupt model file is refused by its checksum" fails_with "the file is corrupt" $run -x 2 -e "$work/nan_weight.bin"

# a full disk: a file-size limit below the size of a checkpoint, in the background (the run stops
# at a later step) and synchronously
for mode in background sync; do
  flags=$([ $mode = sync ] && echo "--checkpoint-sync 1")
  # shellcheck disable=SC2086  # flags: none, or the flag and its value
  status=$( (trap '' XFSZ; ulimit -f 300000; $run -x 6 -n 3 -o "$work/full_$mode" $flags > "$work/full_$mode.log" 2>&1); echo $?)
  check "full disk ($mode writes): the run stops with status 1 naming the file" \
    test "$status" = 1 -a -n "$(grep 'error: writing .*full_.*/.*_00000003.bin: File too large (the previous files are kept)' "$work/full_$mode.log")"
  check "full disk ($mode writes): no temporary file left" no_temp_files "$work/full_$mode"
  check "full disk ($mode writes): no latest" test ! -e "$work/full_$mode/latest"
done
rm -rf "$work"/full_*

# the same bytes from background and synchronous writes
$run -x 2 -n 1 -o "$work/bytes_background" > /dev/null 2>&1 &
$run -x 2 -n 1 -o "$work/bytes_sync" --checkpoint-sync 1 > /dev/null 2>&1
wait
same_files=1
for file in model_00000001.bin state_00000001.bin model_00000002.bin state_00000002.bin latest; do
  [ -s "$work/bytes_sync/$file" ] && cmp -s "$work/bytes_background/$file" "$work/bytes_sync/$file" || same_files=0
done
check "background and --checkpoint-sync 1 writes: the same files, byte for byte" test "$same_files" = 1
rm -rf "$work"/bytes_*
fi

if want signals; then
# SIGTERM at random steps, then resume: as the straight run
$run -x 40 -n 10 -nk 1 -o "$work/straight" > "$work/straight.log" 2>&1
signal_trial() {  # signal_trial N: prints "ok" when trial N's resumed run ends as the straight one
  local dir="$work/signal_$1" step=$((RANDOM % 29 + 2))  # steps 2..30 of 40: the run is still going
  local status waited=1
  if (( $1 % 2 == 1 )); then  # odd trials: during the slowed background write of checkpoint 10 or 20
    step=$((RANDOM % 2 * 10 + 10))  # (not 30: the run may be at its end, waiting for it, when the signal comes)
    status=$(interrupt_on "$dir.log" "^checkpoint at step $step: the GPU stalled" "$(within_slow_write)" TERM \
      $slowed $run -x 40 -n 10 -nk 1 -o "$dir")
    grep -q "^checkpoint at step $step: written in .* in the background" "$dir.log" || waited=0  # the exit waited for it
  else
    status=$(interrupt_at "$dir.log" "$step" TERM $run -x 40 -n 10 -nk 1 -o "$dir")
  fi
  local stopped
  stopped=$(sed -n 's/^stopped by a signal after step \([0-9]*\): checkpoint .*/\1/p' "$dir.log")
  if [ -n "$stopped" ] && [ "$status" = 75 ] && [ "$waited" = 1 ]; then
    $run -x 40 -n 10 -nk 1 -o "$dir" -y 1 > "$dir.resume.log" 2>&1
    [ "$(checksum "$dir.resume.log")" = "$(checksum "$work/straight.log")" ] && resumed_at "$dir.resume.log" "$stopped" &&
      echo ok
  else
    echo "      trial $1 (signal at step $step): status $status, waited for the write in flight: $waited" >&2
  fi
  rm -rf "$dir"
}
signal_ok=$(in_parallel "$SIGNAL_TRIALS" signal_trial | grep -c '^ok$')
check "SIGTERM at $SIGNAL_TRIALS random steps: checkpoint, status 75, resume bit-identical ($signal_ok ok)" \
  test "$signal_ok" = "$SIGNAL_TRIALS"
status=$(interrupt_at "$work/int.log" 5 INT $run -x 400 -o "$work/int")
check "SIGINT stops with a checkpoint too" test "$status" = 75 -a -n "$(ls "$work"/int/model_*.bin 2> /dev/null)"
rm -rf "$work/int"
fi

if want kills; then
# kill -9 at random times while checkpointing (one every 3 steps), then resume
$run -x 12 -n 3 -o "$work/kill_straight" > "$work/kill_straight.log" 2>&1
kill_trial() {  # kill_trial N: prints "ok" when trial N's resumed run ends as the straight one, no temporary files left
  local dir="$work/kill_$1" during_write=1 latest
  if (( $1 % 2 == 1 )); then  # odd trials: during the slowed background write of checkpoint 3, 6 or 9
    local step=$((RANDOM % 3 * 3 + 3))
    interrupt_on "$dir.log" "^checkpoint at step $step: the GPU stalled" "$(within_slow_write)" KILL \
      $slowed $run -x 12 -n 3 -o "$dir" > /dev/null
    # the kill cut that write: not reported written, latest not moved to it
    grep -q "^checkpoint at step $step: written in" "$dir.log" && during_write=0
    [ "$(cat "$dir/latest" 2> /dev/null)" = "$step" ] && during_write=0
  else
    $run -x 12 -n 3 -o "$dir" > "$dir.log" 2>&1 &
    local pid=$!
    until grep -q "^step" "$dir.log" 2> /dev/null || ! kill -0 $pid 2> /dev/null; do sleep 0.02; done
    sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
    kill -9 $pid 2> /dev/null
    wait $pid 2> /dev/null
  fi
  latest=$(cat "$dir/latest" 2> /dev/null)
  $run -x 12 -n 3 -o "$dir" -y 1 > "$dir.resume.log" 2>&1
  [ "$(checksum "$dir.resume.log")" = "$(checksum "$work/kill_straight.log")" ] && no_temp_files "$dir" &&
    resumed_at "$dir.resume.log" "$latest" && [ "$during_write" = 1 ] && echo ok
  rm -rf "$dir"
}
kill_ok=$(in_parallel "$KILL_TRIALS" kill_trial | grep -c '^ok$')
check "kill -9 at $KILL_TRIALS random times: resume bit-identical, no temporary files ($kill_ok ok)" \
  test "$kill_ok" = "$KILL_TRIALS"

# a requeued job: one command with -y 1, from the first start on; killed before its first checkpoint
# was complete, it starts from scratch (saying so in main.log), later it resumes
requeued="$run -x 12 -n 3 -o $work/requeued -y 1"
for attempt in 1 2 3 4 5; do
  $requeued > "$work/requeued_$attempt.log" 2>&1 &
  pid=$!
  sleep "$((RANDOM % 3)).$((RANDOM % 10))"
  kill -9 $pid 2> /dev/null
  wait $pid 2> /dev/null
done
$requeued > "$work/requeued.log" 2>&1
check "requeued -y 1 job killed 5 times: ends bit-identical to the straight run" \
  test "$(checksum "$work/requeued.log")" = "$(checksum "$work/kill_straight.log")"
check "requeued -y 1 job: the start from scratch is in main.log" \
  grep -q "^# no checkpoint to resume from: started from scratch" "$work/requeued/main.log"
rm -rf "$work/requeued"

# an orphan above latest: the writer killed after the model file of step 6, during the pause before
# its state file (latest names 3); a resumed run that checkpoints at a lower step with -nk 1: pruning
# keeps latest's pair, removes the orphan, and the next -y 1 resumes from it, bit-identical to the
# straight run
GPT2_TEST_CHECKPOINT_DELAY_MS=1000 $run -x 12 -n 3 -nk 1 -o "$work/orphan" > "$work/orphan_1.log" 2>&1 &
pid=$!
until [ -e "$work/orphan/model_00000006.bin" ] || ! kill -0 $pid 2> /dev/null; do sleep 0.02; done
kill -9 $pid 2> /dev/null
wait $pid 2> /dev/null
check "orphan above latest: the killed writer left model 6 without its state, latest 3" \
  test -e "$work/orphan/model_00000006.bin" -a ! -e "$work/orphan/state_00000006.bin" -a "$(cat "$work/orphan/latest")" = 3
$run -x 12 -n 3 -nk 1 -o "$work/orphan" -y 1 --stop-at 4 > "$work/orphan_2.log" 2>&1
check "orphan above latest: pruning kept latest's pair (step 4) and removed the orphan" \
  test "$(ls "$work/orphan" | grep -E '^(model|state)_' | tr '\n' ' ')" = "model_00000004.bin state_00000004.bin "
$run -x 12 -n 3 -nk 1 -o "$work/orphan" -y 1 > "$work/orphan_3.log" 2>&1
check "orphan above latest: resumed at step 4, bit-identical to the straight run" \
  test "$(checksum "$work/orphan_3.log")" = "$(checksum "$work/kill_straight.log")" -a -n "$(grep 'resumed .* at step 4' "$work/orphan_3.log")"
rm -rf "$work/orphan"

# a flipped byte in the latest state: resume falls back to the checkpoint before
cp -r "$work/kill_straight" "$work/flipped"
printf '\x5a' | dd of="$work/flipped/state_00000012.bin" bs=1 seek=$((1024 + 4096)) conv=notrunc 2> /dev/null
$run -x 12 -n 3 -o "$work/flipped" -y 1 > "$work/flipped.log" 2>&1
check "flipped byte: the damaged checkpoint is named" grep -q "checkpoint of step 12 is damaged: .*checksum" "$work/flipped.log"
check "flipped byte: resumed from step 9, bit-identical" \
  test "$(checksum "$work/flipped.log")" = "$(checksum "$work/kill_straight.log")" -a -n "$(grep 'resumed .* at step 9' "$work/flipped.log")"
head -c 5000 "$work/flipped/state_00000012.bin" > "$work/short" && mv "$work/short" "$work/flipped/state_00000012.bin"
for step in 3 6 9; do printf '\x5a' | dd of="$work/flipped/state_0000000$step.bin" bs=1 seek=2000 conv=notrunc 2> /dev/null; done
check "no intact checkpoint: a clear error" fails_with "no intact checkpoint in" $run -x 12 -n 3 -o "$work/flipped" -y 1
fi

echo "$passed passed, $failed failed ($part: $SECONDS s)"
[ "$failed" -eq 0 ]
