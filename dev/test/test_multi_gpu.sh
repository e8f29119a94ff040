#!/usr/bin/env bash
# GPU test of data-parallel runs of ./train_gpt2_fp32 on 2 GPUs (GPT-2 124M, B=4, T=256):
#  - 2 GPUs with one micro-step each are bit-identical to 1 GPU with 2 micro-steps of the same
#    -d (losses, norms, validation losses, weights checksum), for both attention kinds, with
#    clipping and weight decay; also over NCCL's socket transport (as between nodes);
#  - 2 GPUs with 2 micro-steps each, run twice, are bit-identical;
#  - checkpoints move between GPU counts: 2 -> 1 and 1 -> 2 resume exactly;
#  - the launchers: --gpus 2, torchrun-style variables, mpirun -np 2, the file rendezvous;
#  - a rank killed mid-run makes the other exit non-zero within 30 s; ranks given different
#    flags, or a -d that does not divide, stop at start with a one-line error;
#  - SIGTERM to one rank: every rank stops after the same step, with a checkpoint.
set -u
cd "$(dirname "$0")/../.."
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "SKIPPED (fewer than 2 GPUs): multi-GPU training runs"
  exit 0
fi
if make -s nccl-info | grep -q "not found"; then
  echo "SKIPPED (built without NCCL): multi-GPU training runs"
  exit 0
fi
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
work=$(mktemp -d)
trap 'rm -rf "$work"; pkill -P $$ 2> /dev/null' EXIT
flags="-e d12 -b 4 -t 256 -l 6e-4 -u 3 -k cosine -q 0.1 -c 0.1 -gc 0.5 -v 5 -m 2 -s 0 --seed 3"
source dev/test/runs.sh
same_numbers() { [ -n "$(numbers "$1")" ] && diff <(numbers "$1") <(numbers "$2") > /dev/null; }
same_or_show() { same_numbers "$1" "$2" || { grep -iE "error|step +12/" "$2" | tail -n 5 | sed 's/^/      /'; return 1; }; }
port=$((20000 + RANDOM % 20000))
next_port() { port=$((port + 1)); }

for kind in softmax relu; do
  ./train_gpt2_fp32 $flags -A $kind -x 12 -d 2048 > "$work/one_$kind.log" 2>&1
  ./train_gpt2_fp32 $flags -A $kind -x 12 -d 2048 --gpus 2 > "$work/two_$kind.log" 2>&1
  check "$kind: 2 GPUs = 1 GPU with 2 micro-steps, bit for bit" same_numbers "$work/one_$kind.log" "$work/two_$kind.log"
done
clipped() { grep '^step' "$1" | sed 's/.*norm \([0-9.]*\).*/\1/' | awk '$1 > 0.5 { n++ } END { exit !(n > 0) }'; }
check "clipping was active (a norm above -gc 0.5)" clipped "$work/one_softmax.log"
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 ./train_gpt2_fp32 $flags -x 12 -d 2048 --gpus 2 > "$work/socket.log" 2>&1
check "socket transport (as between nodes): bit for bit" same_numbers "$work/one_softmax.log" "$work/socket.log"

./train_gpt2_fp32 $flags -x 8 -d 4096 --gpus 2 > "$work/accum_a.log" 2>&1
./train_gpt2_fp32 $flags -x 8 -d 4096 --gpus 2 > "$work/accum_b.log" 2>&1
check "2 GPUs x 2 micro-steps twice: bit for bit" same_numbers "$work/accum_a.log" "$work/accum_b.log"

# checkpoints between GPU counts: straight 2-GPU run against 2 -> 1 and 1 -> 2
run="./train_gpt2_fp32 $flags -x 16 -d 2048 -n 8"
$run --gpus 2 -o "$work/straight" > "$work/straight.log" 2>&1
$run --gpus 2 -o "$work/two_one" --stop-at 8 > "$work/two_one_a.log" 2>&1
$run -o "$work/two_one" -y 1 > "$work/two_one_b.log" 2>&1
check "2 GPUs -> checkpoint -> 1 GPU: steps 9-16 bit for bit" \
  diff <(numbers_from "$work/straight.log" 9) <(numbers_from "$work/two_one_b.log" 9)
$run -o "$work/one_two" --stop-at 8 > "$work/one_two_a.log" 2>&1
$run --gpus 2 -o "$work/one_two" -y 1 > "$work/one_two_b.log" 2>&1
check "1 GPU -> checkpoint -> 2 GPUs: steps 9-16 bit for bit" \
  diff <(numbers_from "$work/straight.log" 9) <(numbers_from "$work/one_two_b.log" 9)
check "the resumed runs ran to step 16" grep -q "^step    16/16" "$work/one_two_b.log"

# launchers
two_ranks() {  # two_ranks LOG EXTRA_ENV FLAGS...: rank 0 and 1 as torchrun would start them
  local log=$1 extra=$2
  shift 2
  next_port
  env $extra RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ./train_gpt2_fp32 "$@" > "$log.rank1" 2>&1 &
  env $extra RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ./train_gpt2_fp32 "$@" > "$log" 2>&1
  local status=$?
  wait $! || status=1
  return $status
}
two_ranks "$work/torchrun.log" "" $flags -x 12 -d 2048
check "torchrun-style variables: bit for bit" same_numbers "$work/one_softmax.log" "$work/torchrun.log"
two_ranks "$work/filerdv.log" "" $flags -x 12 -d 2048 --rendezvous-dir "$work/rdv"
check "file rendezvous: bit for bit" same_numbers "$work/one_softmax.log" "$work/filerdv.log"
if command -v torchrun > /dev/null; then
  torchrun --standalone --nproc_per_node 2 --no-python ./train_gpt2_fp32 $flags -x 12 -d 2048 > "$work/torchrun_real.log" 2>&1
  check "torchrun --nproc_per_node 2: bit for bit" same_or_show "$work/one_softmax.log" "$work/torchrun_real.log"
else
  echo "SKIPPED (no torchrun): torchrun --nproc_per_node 2"
fi
if command -v mpirun > /dev/null; then
  next_port
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 -x NCCL_NVLS_ENABLE -x MASTER_PORT=$port \
    ./train_gpt2_fp32 $flags -x 12 -d 2048 > "$work/mpirun.log" 2>&1
  check "mpirun -np 2: bit for bit" same_numbers "$work/one_softmax.log" "$work/mpirun.log"
else
  echo "SKIPPED (no mpirun): mpirun -np 2"
fi

# failures
mismatched() {  # rank 1 has another weight decay
  next_port
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=$port ./train_gpt2_fp32 $flags -x 4 -d 2048 -c 0.2 > "$work/mismatch1.log" 2>&1 &
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port ./train_gpt2_fp32 $flags -x 4 -d 2048 2>&1
  local status=$?
  wait
  return $status
}
check "ranks with different flags stop at start" fails_with "rank 1: the flags, model or data differ from rank 0's" mismatched
check "-d that does not divide over 2 GPUs fails" fails_with "not a positive multiple of B*T*GPUs" \
  ./train_gpt2_fp32 $flags -x 4 -d 3072 -b 4 -t 256 --gpus 2
killed_run() {  # the --gpus supervisor's child rank 1 is killed mid-run: the run ends non-zero within 30 s
  ./train_gpt2_fp32 $flags -x 100000 -v 0 --gpus 2 > "$work/killed.log" 2>&1 &
  local parent=$!
  for _ in $(seq 1 120); do grep -q "^step    20/" "$work/killed.log" && break; sleep 0.5; done
  local victim
  victim=$(pgrep -P $parent | sed -n 2p)
  [ -n "$victim" ] || return 1
  kill -9 "$victim"
  local start=$SECONDS
  wait $parent
  local status=$?
  echo "      exit status $status after $((SECONDS - start)) s"
  [ $status -ne 0 ] && [ $((SECONDS - start)) -le 30 ]
}
check "a rank killed mid-run (--gpus): the run exits non-zero within 30 s" killed_run
killed_peer() {  # torchrun-style ranks, no supervisor: rank 1 is killed, rank 0 must exit by itself
  next_port
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=$port ./train_gpt2_fp32 $flags -x 100000 -v 0 > "$work/peer1.log" 2>&1 &
  local victim=$!
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port ./train_gpt2_fp32 $flags -x 100000 -v 0 > "$work/peer0.log" 2>&1 &
  local survivor=$!
  for _ in $(seq 1 120); do grep -q "^step    20/" "$work/peer0.log" && break; sleep 0.5; done
  kill -9 $victim
  local start=$SECONDS
  wait $survivor
  local status=$?
  echo "      rank 0: exit status $status after $((SECONDS - start)) s: $(grep error "$work/peer0.log" | head -n 1)"
  [ $status -ne 0 ] && [ $((SECONDS - start)) -le 30 ]
}
check "a peer killed mid-run (no supervisor): rank 0 exits non-zero within 30 s" killed_peer
signal_one_rank() {  # SIGTERM to rank 1 only: both stop after the same step with status 75, and
                     # the checkpoint resumes on 1 GPU as a straight run
  next_port
  local run="./train_gpt2_fp32 $flags -x 400 -d 2048 -v 0 -n 400 -o $work/signalled"
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port $run > "$work/sig0.log" 2>&1 &
  local rank0=$!
  RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=$port $run > "$work/sig1.log" 2>&1 &
  local rank1=$!
  for _ in $(seq 1 120); do grep -q "^step    10/" "$work/sig0.log" && break; sleep 0.5; done
  kill -TERM $rank1
  wait $rank0; local status0=$?
  wait $rank1; local status1=$?
  local stopped
  stopped=$(sed -n 's/^stopped by a signal after step \([0-9]*\).*/\1/p' "$work/sig0.log")
  echo "      statuses $status0 and $status1, stopped after step ${stopped:-?}"
  [ "$status0" = 75 ] && [ "$status1" = 75 ] && [ -n "$stopped" ] || return 1
  local until=$((stopped + 5))
  ./train_gpt2_fp32 $flags -x 400 -d 2048 -v 0 --stop-at $until > "$work/sig_straight.log" 2>&1
  ./train_gpt2_fp32 $flags -x 400 -d 2048 -v 0 -n 400 -o "$work/signalled" -y 1 --stop-at $until > "$work/sig_resumed.log" 2>&1
  [ "$(grep checksum "$work/sig_straight.log")" = "$(grep checksum "$work/sig_resumed.log")" ]
}
check "SIGTERM to one rank: all stop at the same step (75), resume on 1 GPU bit-identical" signal_one_rank

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
