#!/usr/bin/env bash
# Our trainer on several GPUs of one host against PyTorch DDP (torchrun train_gpt2.py: torch.compile,
# flash SDPA for softmax, TF32), same data and steps: GPT-2 from scratch, T=1024, B rows per GPU
# (d12: 16, d48: 8), one optimizer step per B x 1024 x GPUs batch. Prints ms/step, global tok/s,
# scaling efficiency (tok/s at G GPUs / (G x tok/s at 1 GPU), so the 1-GPU run is needed), our
# exposed communication, memory per GPU (the trainer's count and nvidia-smi's for GPU 0 during
# our run) and our tok/s / PyTorch's.
#   scripts/bench_gpus.sh [--gpus "1 2"] [-e "d12 d48"] [-k "softmax relu"] [-n STEPS] [-i DATA] [--no-torch]
# Kinds: d12 runs softmax and ReLU, d48 softmax only; -k sets the kinds of every model. Logs go to
# a temporary folder removed at the end, or to $BENCH_LOGS (kept) when set. TRAINER and TORCHRUN
# replace ./train_gpt2_fp32 (then it is not built) and torchrun, to test this script without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
gpus="1 2"; models="d12 d48"; kinds=; steps=30; torch=1
data=dev/data/tinyshakespeare/tiny_shakespeare_train.bin
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus=$2; shift 2 ;;
    -e) models=$2; shift 2 ;;
    -k) kinds=$2; shift 2 ;;
    -n) steps=$2; shift 2 ;;
    -i) data=$2; shift 2 ;;
    --no-torch) torch=0; shift ;;
    *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 1 ;;
  esac
done
trainer=${TRAINER:-./train_gpt2_fp32}
torchrun=${TORCHRUN:-torchrun}
[ -n "${TRAINER:-}" ] || make -j"$(nproc)" train_gpt2_fp32 > /dev/null
make data > /dev/null
have_smi=$(command -v nvidia-smi > /dev/null && echo 1 || echo 0)
gpu=$([ "$have_smi" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 || echo "unknown GPU")
if [ -n "${BENCH_LOGS:-}" ]; then logs=$BENCH_LOGS; mkdir -p "$logs"; else logs=$(mktemp -d); fi
smi_pid=
cleanup() {
  if [ -n "$smi_pid" ]; then kill "$smi_pid" 2> /dev/null || true; fi
  if [ -z "${BENCH_LOGS:-}" ]; then rm -rf "$logs"; fi
}
trap cleanup EXIT

# Runs a command into a log; on failure prints the log's tail and exits.
run_logged() {
  local what=$1 log=$2; shift 2
  "$@" > "$log" 2>&1 || { echo "error: $what failed:"; tail -n 15 "$log"; exit 1; }
}
# The first number after a line's prefix, or $3 when the log has no such line.
field() { grep "^$2" "$1" | head -n 1 | sed "s/^$2 *\([0-9.]*\).*/\1/" | grep . || echo "${3:--}"; }
# The max of GPU 0's memory.used samples (MiB) in GB, or - without samples.
smi_gb() { awk '$1 ~ /^[0-9]+$/ && $1 > max { max = $1 } END { if (max == "") print "-"; else printf "%.3f", max * 1048576 / 1e9 }' "$1"; }

declare -A ours_ms1 torch_ms1   # "model kind" -> ms/step on 1 GPU
rows=()
for model in $models; do
  case "$model" in
    d12) B=16; model_kinds=${kinds:-softmax relu} ;;
    d48) B=8; model_kinds=${kinds:-softmax} ;;
    *) echo "error: no batch size for model $model (d12 or d48)" >&2; exit 1 ;;
  esac
  for kind in $model_kinds; do
    for G in $gpus; do
      name=${model}_${kind}_$G
      gpu_flags=$([ "$G" = 1 ] || echo "--gpus $G")
      if [ "$have_smi" = 1 ]; then
        nvidia-smi --id=0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$logs/smi_$name.log" 2>&1 &
        smi_pid=$!
      fi
      # shellcheck disable=SC2086  # gpu_flags: empty or two words
      run_logged "our trainer ($model $kind, $G GPUs)" "$logs/ours_$name.log" "$trainer" $gpu_flags -e "$model" -A "$kind" \
        -b "$B" -t 1024 -d $((B * 1024 * G)) -x "$steps" -v 0 -s 0 -i "$data"
      smi=-
      if [ -n "$smi_pid" ]; then
        kill "$smi_pid" 2> /dev/null || true; wait "$smi_pid" 2> /dev/null || true; smi_pid=
        smi=$(smi_gb "$logs/smi_$name.log")
      fi
      ours_ms=$(field "$logs/ours_$name.log" 'average step:')
      comm_ms=$(field "$logs/ours_$name.log" 'exposed communication:' 0)
      ours_gb=$(field "$logs/ours_$name.log" 'GPU memory allocated:')
      opt_gb=$(field "$logs/ours_$name.log" '| optimizer memory *|')
      torch_ms=-; torch_gb=-
      if [ "$torch" = 1 ]; then
        flash=$([ "$kind" != softmax ] || echo --flash)
        # shellcheck disable=SC2086  # flash: empty or one word
        run_logged "PyTorch ($model $kind, $G GPUs)" "$logs/torch_$name.log" "$torchrun" --standalone --nproc_per_node "$G" \
          train_gpt2.py --model "$model" --attn "$kind" --batch "$B" --seq-len 1024 --steps "$steps" --train-shards "$data" \
          --compile --tf32 $flash
        torch_ms=$(grep '^RESULT' "$logs/torch_$name.log" | sed 's/.*ms_per_step=\([0-9.]*\).*/\1/')
        torch_gb=$(grep '^RESULT' "$logs/torch_$name.log" | sed 's/.*peak_mem_gb=\([0-9.]*\).*/\1/')
      fi
      if [ "$G" = 1 ]; then ours_ms1["$model $kind"]=$ours_ms; torch_ms1["$model $kind"]=$torch_ms; fi
      rows+=("$model $kind $B $G $ours_ms $comm_ms $ours_gb $smi $torch_ms $torch_gb")
      echo "$model $kind B=$B GPUs=$G: ours $ours_ms ms, exposed communication $comm_ms ms, $ours_gb GB per GPU" \
        "(optimizer $opt_gb GB), nvidia-smi $smi GB; PyTorch $torch_ms ms, $torch_gb GB"
    done
  done
done

echo
echo "GPT-2, T=1024, B rows per GPU, $steps steps, $gpu, $(date +%Y-%m-%d); tok/s global; scaling = tok/s / (GPUs x tok/s on 1 GPU)"
printf "%-5s %-8s %3s %4s | %9s %9s %6s %7s %7s %7s | %9s %9s %6s %7s | %7s\n" model attn B GPUs "ours ms" "tok/s" scale \
  "comm ms" "mem GB" "smi GB" "torch ms" "tok/s" scale "mem GB" "tok/s x"
for row in "${rows[@]}"; do
  read -r model kind B G ours_ms comm_ms ours_gb smi torch_ms torch_gb <<< "$row"
  awk -v model="$model" -v kind="$kind" -v B="$B" -v G="$G" -v ms="$ours_ms" -v comm="$comm_ms" -v gb="$ours_gb" \
    -v smi="$smi" -v tms="$torch_ms" -v tgb="$torch_gb" -v ms1="${ours_ms1["$model $kind"]:--}" \
    -v tms1="${torch_ms1["$model $kind"]:--}" 'BEGIN {
    tok = B * 1024 * G
    scale = ms1 == "-" ? "-" : sprintf("%.1f%%", 100 * ms1 / ms)
    printf "%-5s %-8s %3d %4d | %9.2f %9.0f %6s %7.2f %7.2f %7s | ", model, kind, B, G, ms, tok / ms * 1000, scale, comm, gb, smi
    if (tms == "-") { printf "%9s %9s %6s %7s | %7s\n", "-", "-", "-", "-", "-"; exit }
    tscale = tms1 == "-" ? "-" : sprintf("%.1f%%", 100 * tms1 / tms)
    printf "%9.2f %9.0f %6s %7.2f | %7.3f\n", tms, tok / tms * 1000, tscale, tgb, tms / ms
  }'
done
