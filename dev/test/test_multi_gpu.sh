#!/usr/bin/env bash
# GPU test of data-parallel runs of ./train_gpt2_fp32 (GPT-2 124M, B=4 or 3, T=256), at every GPU
# count N in {2, 4, 8} the machine has:
#  - N GPUs with one micro-step each are bit-identical to 1 GPU with N micro-steps of the same -d
#    (losses, norms, validation losses, weights checksum), for both attention kinds, with clipping
#    and weight decay; ReLU with B=3 and -m 3, so the 9 validation rows do not divide over N;
#  - the validation loss is the same at 1, 2, 4 (8) GPUs; --eval's report and accuracy are the same
#    on N GPUs as on 1;
#  - checkpoints move between GPU counts: 1 -> N resumes as the straight run does, and N -> N/2 as
#    1 -> N/2 does (2 -> 1: as the straight run), bit for bit;
#  - a rank killed mid-run makes the run exit non-zero within 30 s; SIGTERM to one rank stops every
#    rank after the same step with a checkpoint that resumes bit-identical on 1 GPU;
#  - a missing data file or a bad flag: one line of error in all (no rank reports), non-zero.
# At N = 2 only: over NCCL's socket transport (as between nodes); 2 GPUs x 2 micro-steps twice are
# bit-identical; honest step times (1 GPU x 4 and 2 GPUs x 2 micro-steps); the launchers
# (torchrun-style variables, torchrun, mpirun -np 2, the file rendezvous), with --overlap on, off
# and auto keeping the bits; ranks given different flags or a -d that does not divide stop at start,
# and so do ranks whose GPUs would run other kernels (one planning for 48 KB a block), while ranks
# whose shared-memory limits differ but not their kernels run;
# a peer killed without a supervisor (TCP rendezvous; file rendezvous with 2 micro-steps). --overlap
# on (the moves beside the passes) at every N: the ReLU runs, and 2 GPUs x 2 micro-steps (the sent
# buckets add the earlier micro-step first).
# The one-GPU runs a check compares against run beside the N-GPU runs; with 4 GPUs or more, the
# 2-GPU checks and the 2-GPU-only ones run at the same time on two pairs of GPUs. Each part's output
# is printed whole, in order, with its time; the elapsed time at the end.
# TRAINER replaces ./train_gpt2_fp32 and TEST_GPUS the GPU count (to test this script on a CPU).
set -u
cd "$(dirname "$0")/../.."
trainer=${TRAINER:-./train_gpt2_fp32}
gpus=${TEST_GPUS:-$(scripts/visible_gpus.sh)}
if [ "${gpus:-0}" -lt 2 ]; then
  echo "SKIPPED (fewer than 2 GPUs): multi-GPU training runs"
  exit 0
fi
if [ -z "${TRAINER:-}" ] && make -s nccl-info | grep -q "not found"; then
  echo "SKIPPED (built without NCCL): multi-GPU training runs"
  exit 0
fi
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
work=$(mktemp -d)
# kill_tree PID: PID and every process below it (the parts' trainers are this shell's grandchildren)
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2> /dev/null
}
trap 'rm -rf "$work"; for child in $(pgrep -P $$); do kill_tree "$child"; done' EXIT
started=$SECONDS
base="-e d12 -t 256 -l 6e-4 -u 3 -k cosine -q 0.1 -c 0.1 -gc 0.5 -s 0 --seed 3"
flags="$base -b 4 -m 2 -v 5"           # 8 validation rows: they divide over 2, 4 and 8 GPUs
uneven="$base -b 3 -m 3 -v 4 -A relu"  # 9 validation rows: they do not
eval_file=dev/test/fixtures/eval_tiny.jsonl
source dev/test/runs.sh
same_numbers() { [ -n "$(numbers "$1")" ] && diff <(numbers "$1") <(numbers "$2") > /dev/null; }
same_or_show() { same_numbers "$1" "$2" || { grep -iE "error|step +16/" "$2" | tail -n 5 | sed 's/^/      /'; return 1; }; }
same_from() {  # same_from STEP A B: the numbers of A and B from STEP on, the same and not empty
  [ -n "$(numbers_from "$2" "$1")" ] && diff <(numbers_from "$2" "$1") <(numbers_from "$3" "$1") > /dev/null
}
port=$((20000 + RANDOM % 20000))  # each part (below) takes ports from its own hundred
next_port() { port=$((port + 1)); }
# until_line PATTERN LOG PID: waits (60 s at most) until LOG has a line matching PATTERN or PID is gone
until_line() {
  for _ in $(seq 1 300); do grep -q "$1" "$2" && return 0; kill -0 "$3" 2> /dev/null || return 1; sleep 0.2; done
  return 1
}
# exits_within SECONDS PID: waits for PID (a child of this shell) at most SECONDS; its exit status,
# or 124 after killing it when it did not exit in time
exits_within() {
  local deadline=$((SECONDS + $1))
  while kill -0 "$2" 2> /dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  kill -0 "$2" 2> /dev/null && { kill -9 "$2"; wait "$2"; return 124; }
  wait "$2"
}

# train LOG ARGS...: one run of the trainer, its output in LOG; its seconds go to $work/times.
train() {
  local log=$1 start=${EPOCHREALTIME:-$SECONDS} status
  shift
  "$trainer" "$@" > "$log" 2>&1
  status=$?
  awk -v a="$start" -v b="${EPOCHREALTIME:-$SECONDS}" -v name="${log#"$work"/}" \
    'BEGIN { printf "%6.1f s  %s\n", b - a, name }' >> "$work/times"
  return $status
}
val_losses() { grep -E '^step [0-9]+: val loss' "$1"; }
same_val() {  # same_val A B: the same validation losses, not none
  [ -n "$(val_losses "$1")" ] && [ "$(val_losses "$1")" = "$(val_losses "$2")" ]
}
accuracy_line() { grep -oE '^eval: accuracy [0-9.]+ \([0-9]+/[0-9]+\) at step [0-9]+' "$1"; }
same_eval() {  # same_eval LOG_A REPORT_A LOG_B REPORT_B: the same accuracy line and report file, not empty
  [ -n "$(accuracy_line "$1")" ] && [ "$(accuracy_line "$1")" = "$(accuracy_line "$3")" ] && [ -s "$2" ] &&
    cmp -s "$2" "$4" || { echo "      $(accuracy_line "$1") against $(accuracy_line "$3")"; return 1; }
}
# from_step SOURCE STEP DEST: DEST holds SOURCE's checkpoint of STEP (hard links) as its latest
from_step() {
  local file
  mkdir -p "$3"
  for file in model state; do
    file=$(printf '%s_%08d.bin' "$file" "$2")
    ln "$1/$file" "$3/$file" 2> /dev/null || cp "$1/$file" "$3/$file" || return 1
  done
  echo "$2" > "$3/latest"
}
# resumed_at STEP LOG: LOG's run resumed from a checkpoint of STEP. Without one, -y 1 starts from
# scratch, and N GPUs equal 1 GPU bit for bit: the comparisons alone cannot tell.
resumed_at() {
  grep -q "^resumed from .* at step $1 on " "$2" || { echo "      no 'resumed from ... at step $1' in $2"; return 1; }
}
# errors_once FRAGMENT COMMAND...: the command exits non-zero, and of all it prints (stdout and
# stderr) one line only is about an error or a rank stopping: "error: ...FRAGMENT..."
errors_once() {
  local fragment=$1 out status lines count
  shift
  out=$("$@" 2>&1)
  status=$?
  lines=$(grep -iE 'error|rank [0-9]+ .*(exit|stop|kill|fail)|stopping the other|abort|terminat' <<< "$out")
  count=$(grep -c . <<< "$lines")
  [ $status -ne 0 ] && [ "$count" = 1 ] && grep -q '^error: ' <<< "$lines" && grep -qF -- "$fragment" <<< "$lines" &&
    return 0
  echo "      exit status $status, $count lines about errors or ranks:"
  head -n 6 <<< "$lines" | sed 's/^/        /'
  return 1
}
# honest_times LOG: the step times from step 2 on are within 10% of their median, all but a fifth
# (a multi-GPU step now and then waits longer; time moved between steps, as accumulation once did,
# puts every step off by far more); the line
# "step times: N steps, S ms summed, W ms wall clock" counts them, S is their sum, W within 1% of S.
honest_times() {
  local times line n s w
  times=$(grep -E '^step +[0-9]+/[0-9]+ \|' "$1" | awk -F'|' '{
    split($1, word, "[ /]+"); if (word[2] + 0 < 2) next
    for (i = 2; i <= NF; i++) if ($i ~ /^ *[0-9.]+ ms *$/) { sub(/ ms.*/, "", $i); print $i + 0; break } }')
  line=$(grep -E '^step times: [0-9]+ steps, [0-9.]+ ms summed, [0-9.]+ ms wall clock' "$1" | tail -n 1)
  if [ -z "$times" ] || [ -z "$line" ]; then
    echo "      $(grep -c . <<< "$times") step times; 'step times:' line: ${line:-none}"
    return 1
  fi
  read -r n s w <<< "$(sed -E 's/^step times: ([0-9]+) steps, ([0-9.]+) ms summed, ([0-9.]+) ms wall.*/\1 \2 \3/' <<< "$line")"
  sort -g <<< "$times" | awk -v n="$n" -v s="$s" -v w="$w" '{ t[NR] = $1; sum += $1 } END {
    median = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    for (i = 1; i <= NR; i++) if (t[i] < 0.9 * median || t[i] > 1.1 * median) outside++
    printf "      steps 2-%d: median %.2f ms (%.2f..%.2f, %d beyond 10%%); S %.2f ms (printed %d steps, %.2f), W %.2f ms\n",
      NR + 1, median, t[1], t[NR], outside, s, n, sum, w
    ok = NR == n && median > 0 && outside <= NR / 5 && (s - sum) ^ 2 <= (0.006 * NR + 0.001 * sum) ^ 2 && (s - w) ^ 2 <= (0.01 * w) ^ 2
    exit !ok }'
}
split_rows() {  # split_rows N ONE_GPU_LOG N_GPU_LOG
  grep -qE "val data.* 9 rows split over $1 GPUs" "$3" || { echo "      $(grep 'val data' "$3")"; return 1; }
  same_val "$2" "$3"
}

# --------------------------------------------------------------------------------------------
# The checks at N GPUs
checks_at() {
  local N=$1 half=$(($1 / 2)) D=$((1024 * $1)) DR=$((768 * $1)) start=$SECONDS
  echo "--- $N GPUs"
  # 1 GPU with N micro-steps against N GPUs: softmax (with checkpoints at 8 and 16, and --eval at
  # the end), then ReLU with 9 validation rows; each GPU count writes its own eval report
  local ck="-x 16 -d $D -n 8 --eval $eval_file" ones=()
  train "$work/one_softmax_$N.log" $flags -A softmax $ck -o "$work/ck_one_$N" --eval-report "$work/report_one_$N.txt" &
  ones+=($!)
  train "$work/one_relu_$N.log" $uneven -x 8 -d "$DR" &
  ones+=($!)
  train "$work/gpus_softmax_$N.log" $flags -A softmax $ck -o "$work/ck_gpus_$N" --eval-report "$work/report_gpus_$N.txt" \
    --gpus "$N"
  train "$work/gpus_relu_$N.log" $uneven -x 8 -d "$DR" --gpus "$N" --overlap on
  wait "${ones[@]}"
  check "softmax: $N GPUs = 1 GPU with $N micro-steps, bit for bit" \
    same_or_show "$work/one_softmax_$N.log" "$work/gpus_softmax_$N.log"
  check "eval: report and accuracy on $N GPUs = on 1 GPU" \
    same_eval "$work/one_softmax_$N.log" "$work/report_one_$N.txt" "$work/gpus_softmax_$N.log" "$work/report_gpus_$N.txt"
  check "ReLU, B=3, --overlap on: $N GPUs = 1 GPU with $N micro-steps, bit for bit" \
    same_or_show "$work/one_relu_$N.log" "$work/gpus_relu_$N.log"
  check "the configuration table says what --overlap chose and why" \
    grep -qE '^\| overlap +\| on \(--overlap on\)' "$work/gpus_relu_$N.log"
  check "... and auto says which link it saw" grep -qE \
    '^\| overlap +\| (on|off) \(auto: (GPU peer to peer|host shared memory|network, RDMA|network, sockets)\)' \
    "$work/gpus_softmax_$N.log"
  check "validation: 9 rows split over $N GPUs (the row says so), the val losses of 1 GPU" \
    split_rows "$N" "$work/one_relu_$N.log" "$work/gpus_relu_$N.log"

  # checkpoints between GPU counts, from the step-8 checkpoints of the runs above
  check "the step-8 checkpoints of 1 and $N GPUs, copied to resume from" \
    eval "from_step '$work/ck_one_$N' 8 '$work/r_one_$N' && from_step '$work/ck_gpus_$N' 8 '$work/r_gpus_$N'"
  local resume="$flags -A softmax -x 16 -d $D -n 8 -y 1"
  train "$work/one_to_$N.log" $resume -o "$work/r_one_$N" --gpus "$N" &
  local half_flags
  half_flags=$([ "$half" = 1 ] || echo "--gpus $half")
  if [ "$half" != 1 ]; then  # N/2 GPUs with 2 micro-steps each add in another order than N GPUs: against 1 -> N/2
    check "... and again for $half GPUs" from_step "$work/ck_one_$N" 8 "$work/r_one_half_$N"
    train "$work/one_to_${half}_$N.log" $resume -o "$work/r_one_half_$N" --gpus "$half" &
  fi
  # shellcheck disable=SC2086  # half_flags: empty or two words
  train "$work/${N}_to_$half.log" $resume -o "$work/r_gpus_$N" $half_flags
  wait
  check "1 GPU -> checkpoint -> $N GPUs: resumed at step 8, steps 9-16 bit for bit" eval \
    "resumed_at 8 '$work/one_to_$N.log' && same_from 9 '$work/gpus_softmax_$N.log' '$work/one_to_$N.log'"
  check "... and it ran to step 16" grep -q "^step    16/16" "$work/one_to_$N.log"
  if [ "$half" = 1 ]; then
    check "$N GPUs -> checkpoint -> 1 GPU: resumed at step 8, steps 9-16 bit for bit" eval \
      "resumed_at 8 '$work/${N}_to_1.log' && same_from 9 '$work/gpus_softmax_$N.log' '$work/${N}_to_1.log'"
  else
    check "$N GPUs -> checkpoint -> $half GPUs: resumed at step 8, steps 9-16 as 1 GPU -> $half GPUs, bit for bit" eval \
      "resumed_at 8 '$work/one_to_${half}_$N.log' && resumed_at 8 '$work/${N}_to_$half.log' &&
       same_from 9 '$work/one_to_${half}_$N.log' '$work/${N}_to_$half.log'"
  fi
  rm -rf "$work/ck_one_$N" "$work/ck_gpus_$N" "$work/r_one_$N" "$work/r_one_half_$N" "$work/r_gpus_$N"

  check "$N GPUs, missing data: one error line, non-zero" \
    errors_once "missing_" "$trainer" $flags -x 4 --gpus "$N" -i "$work/missing_*.bin"
  check "$N GPUs, a bad flag: one error line, non-zero" \
    errors_once "--no-such-flag" "$trainer" $flags -x 4 --gpus "$N" --no-such-flag 1
  check "$N GPUs, a rank killed mid-run: the run exits non-zero within 30 s" killed_run "$N"
  check "$N GPUs, SIGTERM to one rank: all stop at the same step (75), resume on 1 GPU bit-identical" \
    signal_one_rank "$N"
  echo "    ($N GPUs: $((SECONDS - start)) s)"
}
killed_run() {  # the --gpus supervisor's last child rank is killed mid-run: the run ends non-zero within 30 s
  local N=$1 log="$work/killed_$1.log"
  "$trainer" $flags -x 100000 -v 0 --gpus "$N" > "$log" 2>&1 &
  local parent=$!
  until_line "^step    20/" "$log" $parent
  local victim
  victim=$(pgrep -P $parent | tail -n 1)
  [ -n "$victim" ] || { kill $parent 2> /dev/null; wait $parent; echo "      $(grep -m 1 error "$log")"; return 1; }
  kill -9 "$victim"
  local start=$SECONDS
  exits_within 40 $parent
  local status=$?
  echo "      exit status $status after $((SECONDS - start)) s"
  [ $status -ne 0 ] && [ $((SECONDS - start)) -le 30 ]
}
signal_one_rank() {  # SIGTERM to the last rank only: all stop after the same step with status 75,
                     # and the checkpoint resumes on 1 GPU as a straight run
  local N=$1 D=$((1024 * $1)) rank pids=() statuses=() status
  next_port
  local run="$trainer $flags -x 400 -d $D -v 0 -n 400 -o $work/signalled_$N"
  for rank in $(seq 0 $((N - 1))); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$N MASTER_PORT=$port $run > "$work/sig_${N}_$rank.log" 2>&1 &
    pids+=($!)
  done
  until_line "^step    10/" "$work/sig_${N}_0.log" "${pids[0]}"
  kill -TERM "${pids[N - 1]}"
  for rank in $(seq 0 $((N - 1))); do
    exits_within 60 "${pids[rank]}"
    statuses+=($?)
  done
  local stopped
  stopped=$(sed -n 's/^stopped by a signal after step \([0-9]*\): checkpoint .*/\1/p' "$work/sig_${N}_0.log")  # written
  echo "      statuses ${statuses[*]}, stopped after step ${stopped:-? (no checkpoint written)}"
  for status in "${statuses[@]}"; do [ "$status" = 75 ] || return 1; done
  [ -n "$stopped" ] || return 1
  local until=$((stopped + 5))
  train "$work/sig_straight_$N.log" $flags -x 400 -d "$D" -v 0 --stop-at $until &
  train "$work/sig_resumed_$N.log" $flags -x 400 -d "$D" -v 0 -n 400 -o "$work/signalled_$N" -y 1 --stop-at $until
  wait $!
  rm -rf "$work/signalled_$N"
  resumed_at "$stopped" "$work/sig_resumed_$N.log" && [ -n "$(grep checksum "$work/sig_straight_$N.log")" ] &&
    [ "$(grep checksum "$work/sig_straight_$N.log")" = "$(grep checksum "$work/sig_resumed_$N.log")" ]
}

# --------------------------------------------------------------------------------------------
# At 2 GPUs only: the transports, micro-steps, step times, launchers and start-up failures
checks_at_2_only() {
  local start=$SECONDS one="$work/one_2only.log" same="-x 16 -d 2048"
  echo "--- 2 GPUs only"
  train "$one" $flags $same &  # the 1-GPU run the launchers' runs must match, beside the socket run
  # shellcheck disable=SC2086
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 train "$work/socket.log" $flags $same --gpus 2  # never RDMA
  wait $!
  clipped() { grep '^step' "$1" | sed 's/.*norm \([0-9.]*\).*/\1/' | awk '$1 > 0.5 { n++ } END { exit !(n > 0) }'; }
  check "clipping was active (a norm above -gc 0.5)" clipped "$one"
  check "socket transport (as between nodes): bit for bit" same_or_show "$one" "$work/socket.log"
  check "... where auto takes off" grep -qE '^\| overlap +\| off \(auto: network, sockets\)' "$work/socket.log"

  # 4 micro-steps on 1 GPU, 2 on each of 2 GPUs: honest step times; 2 x 2 twice: the same bits
  local timed="$flags -x 12 -v 0 -d 4096"
  train "$work/timed_one.log" $timed
  train "$work/accum_a.log" $timed --gpus 2 --overlap off
  train "$work/accum_b.log" $timed --gpus 2 --overlap on
  check "2 GPUs x 2 micro-steps, --overlap off and on: bit for bit" same_numbers "$work/accum_a.log" "$work/accum_b.log"
  check "step times, 1 GPU x 4 micro-steps: within 10% of the median (4 in 5); summed = wall clock within 1%" \
    honest_times "$work/timed_one.log"
  check "step times, 2 GPUs x 2 micro-steps: within 10% of the median (4 in 5); summed = wall clock within 1%" \
    honest_times "$work/accum_a.log"
  check "2 GPUs: the exposed communication per step is printed" \
    grep -qE '^exposed communication: [0-9.]+ ms per step' "$work/accum_a.log"

  # launchers, each with another --overlap: it must not change the bits
  two_ranks "$work/torchrun.log" $flags $same --overlap on
  check "torchrun-style variables (--overlap on): bit for bit" same_or_show "$one" "$work/torchrun.log"
  two_ranks "$work/filerdv.log" $flags $same --rendezvous-dir "$work/rdv" --overlap off
  check "file rendezvous (--overlap off): bit for bit" same_or_show "$one" "$work/filerdv.log"
  if command -v torchrun > /dev/null; then
    torchrun --standalone --nproc_per_node 2 --no-python "$trainer" $flags $same --overlap on \
      > "$work/torchrun_real.log" 2>&1
    check "torchrun --nproc_per_node 2 (--overlap on): bit for bit" same_or_show "$one" "$work/torchrun_real.log"
  else
    echo "SKIPPED (no torchrun): torchrun --nproc_per_node 2"
  fi
  if command -v mpirun > /dev/null; then
    next_port
    local visible=()
    [ -z "${CUDA_VISIBLE_DEVICES:-}" ] || visible=(-x CUDA_VISIBLE_DEVICES)
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 -x NCCL_NVLS_ENABLE -x MASTER_PORT=$port \
      "${visible[@]}" "$trainer" $flags $same > "$work/mpirun.log" 2>&1
    check "mpirun -np 2: bit for bit" same_or_show "$one" "$work/mpirun.log"
  else
    echo "SKIPPED (no mpirun): mpirun -np 2"
  fi

  next_port
  check "ranks with different flags stop at start" fails_with "rank 1: the flags, model or data differ from rank 0's" mismatched
  check "file rendezvous, ranks with different flags: one error line (rank 0's), all stop within 9 s" mismatched_files
  next_port
  check "ranks with different --overlap stop at start" \
    fails_with "rank 1: the overlap decisions (--overlap) differ from rank 0's" mismatched_overlap
  next_port
  check "ranks whose GPUs run other kernels stop at start (rank 1 plans for 48 KB a block: the FP32 cores)" \
    fails_with "rank 1: the kernels the GPUs run" planned_for 48
  next_port
  check "ranks whose shared memory differs but not their kernels run (rank 1 plans for 226 KB a block, below its GPU's)" \
    eval "planned_for 226 && capped_below_gpu '$work/planned1.log' 226"
  check "-d that does not divide over 2 GPUs: one error line" \
    errors_once "not a positive multiple of B*T*GPUs" "$trainer" $flags -x 4 -d 3072 -b 4 -t 256 --gpus 2
  check "a peer killed mid-run (no supervisor): rank 0 exits non-zero within 30 s" \
    killed_peer "(connection to it closed)" 1
  check "... the same through a file rendezvous, 2 micro-steps: one error line, within 30 s" \
    killed_peer "(no heartbeat in $work/rdv_killed" 2 --rendezvous-dir "$work/rdv_killed" -d 4096
  echo "    (2 GPUs only: $((SECONDS - start)) s)"
}
two_ranks() {  # two_ranks LOG FLAGS...: rank 0 and 1 as torchrun would start them
  local log=$1
  shift
  next_port
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$trainer" "$@" > "$log.rank1" 2>&1 &
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$trainer" "$@" > "$log" 2>&1
  local status=$?
  wait $! || status=1
  return $status
}
mismatched() {  # rank 1 has another weight decay (the caller moves to the next port)
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 4 -d 2048 -c 0.2 > "$work/mismatch1.log" 2>&1 &
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 4 -d 2048 2>&1
  local status=$?
  wait
  return $status
}
mismatched_files() {  # the same through a file rendezvous: one error line (rank 0's), within 9 s
  local rdv="$work/rdv_mismatch" t0=$SECONDS
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 "$trainer" $flags -x 4 -d 2048 -c 0.2 --rendezvous-dir "$rdv" > "$work/mismatch_f1.log" 2>&1 &
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 "$trainer" $flags -x 4 -d 2048 --rendezvous-dir "$rdv" > "$work/mismatch_f0.log" 2>&1
  local status0=$? status1
  wait $!
  status1=$?
  [ "$status0" != 0 ] && [ "$status1" != 0 ] && [ $((SECONDS - t0)) -le 9 ] &&
    [ "$(cat "$work/mismatch_f0.log" "$work/mismatch_f1.log" | grep -c 'differ from rank 0')" = 1 ]
}
mismatched_overlap() {  # rank 1 asks for --overlap off, rank 0 for on
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 4 -d 2048 --overlap off > "$work/mismatch_o1.log" 2>&1 &
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 4 -d 2048 --overlap on 2>&1
  local status=$?
  wait
  return $status
}
planned_for() {  # planned_for KB: rank 1 plans its kernels for KB of shared memory a block (GPT2_TEST_SHARED_KB)
  GPT2_TEST_SHARED_KB=$1 RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 4 -d 2048 \
    > "$work/planned1.log" 2>&1 &
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 4 -d 2048 > "$work/planned0.log" 2>&1
  local status=$?
  wait $! || status=1
  [ "$status" = 0 ] || cat "$work/planned0.log"
  return $status
}
# killed_peer HOW MICRO [FLAGS...]: torchrun-style ranks of MICRO micro-steps each, no supervisor: rank
# 1 is killed, rank 0 must exit by itself within 30 s with one error line, which says HOW it knew
# (the TCP watcher's or the heartbeat files' words: the run met the way the flags asked)
killed_peer() {
  local how=$1 micro=$2
  shift 2
  next_port
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 100000 -v 0 "$@" > "$work/peer1.log" 2>&1 &
  local victim=$!
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port "$trainer" $flags -x 100000 -v 0 "$@" > "$work/peer0.log" 2>&1 &
  local survivor=$!
  if ! until_line "^step    20/" "$work/peer0.log" $survivor; then
    kill -9 $victim $survivor 2> /dev/null; wait
    echo "      rank 0 did not reach step 20: $(grep -m 1 error "$work/peer0.log")"
    return 1
  fi
  disown $victim  # no "Killed" notice
  kill -9 $victim
  local start=$SECONDS
  exits_within 40 $survivor
  local status=$?
  echo "      rank 0: exit status $status after $((SECONDS - start)) s: $(grep error "$work/peer0.log" | head -n 1)"
  grep -q "x $micro micro-steps" "$work/peer0.log" || { echo "      not $micro micro-steps a GPU"; return 1; }
  [ $status -ne 0 ] && [ $((SECONDS - start)) -le 30 ] && [ "$(grep -c error "$work/peer0.log")" = 1 ] &&
    grep error "$work/peer0.log" | grep -qF -- "$how"
}

# part NAME K GPUS FUNCTION ARGS...: FUNCTION's checks in a subshell, on the GPUs GPUS (ids, comma
# separated; empty: every visible one), with the K-th hundred of ports above $port; its output to
# $work/NAME.out, its pass and fail counts to $work/NAME.counts
part() {
  local name=$1 hundred=$2 on=$3
  shift 3
  (
    passed=0 failed=0 port=$((port + 100 * hundred))
    [ -z "$on" ] || export CUDA_VISIBLE_DEVICES=$on
    "$@"
    echo "$passed $failed" > "$work/$name.counts"
  ) > "$work/$name.out" 2>&1
}
# show_part NAME: its output, and its counts added to this shell's
show_part() {
  local p=0 f=1
  cat "$work/$1.out"
  [ -s "$work/$1.counts" ] && read -r p f < "$work/$1.counts"
  passed=$((passed + p)) failed=$((failed + f))
}

counts=2
[ "$gpus" -ge 4 ] && counts="$counts 4"
[ "$gpus" -ge 8 ] && counts="$counts 8"
mapfile -t gpu_ids < <(scripts/visible_gpus.sh --ids 2> /dev/null)
if [ "${#gpu_ids[@]}" -ge 4 ]; then  # two pairs of GPUs: the two 2-GPU parts at the same time
  part at_2 1 "${gpu_ids[0]},${gpu_ids[1]}" checks_at 2 &
  part only_2 2 "${gpu_ids[2]},${gpu_ids[3]}" checks_at_2_only
  wait
else
  part at_2 1 "" checks_at 2
  part only_2 2 "" checks_at_2_only
fi
show_part at_2
show_part only_2
for N in ${counts#2}; do
  part "at_$N" 3 "" checks_at "$N"
  show_part "at_$N"
done
# the validation loss before training: one value at every GPU count, both row layouts
same_val0() {
  local name val first=
  for name in "$@"; do
    val=$(grep -E '^step 0: val loss' "$work/$name.log")
    echo "      $name: ${val:-none}"
    [ -n "$val" ] || return 1
    first=${first:-$val}
    [ "$val" = "$first" ] || return 1
  done
}
relu_logs=() softmax_logs=()
for N in $counts; do relu_logs+=("one_relu_$N" "gpus_relu_$N"); softmax_logs+=("one_softmax_$N" "gpus_softmax_$N"); done
check "val loss at step 0, 9 rows: the same at 1 and ${counts// /, } GPUs" same_val0 "${relu_logs[@]}"
check "val loss at step 0, 8 rows: the same at 1 and ${counts// /, } GPUs" same_val0 "${softmax_logs[@]}"

echo "slowest trainer runs (of $(grep -c . "$work/times")):"
sort -rn "$work/times" | head -n 5 | sed 's/^/  /'
echo "$passed passed, $failed failed; GPUs ${counts// /, }: $((SECONDS - started)) s"
[ "$failed" -eq 0 ]
