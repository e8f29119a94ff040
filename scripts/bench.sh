#!/usr/bin/env bash
# Our trainer against PyTorch (train_gpt2.py: torch.compile, flash SDPA for softmax, TF32) on the
# same GPU, data and steps: GPT-2 from scratch (124M = d12 by default; d24 medium, d48 XL), T=1024,
# one optimizer step per B x T batch. Prints ms/step, tok/s, MFU (dense TF32 peak), peak memory and
# our time / PyTorch's, then our time per phase and the top kernels of one d12 step (ncu, when present).
# While our steps run, nvidia-smi samples the GPU every 50 ms: the share of time a kernel was running
# (busy: 100% means no idle GPU between kernels), the SM clock and the power, averaged over the
# samples from step 3 to the end (the clock drops when a long run reaches the power limit), of the
# GPU the trainer runs on (the first CUDA_VISIBLE_DEVICES shows: scripts/visible_gpus.sh --ids).
# --idle also runs our trainer for 12 steps under the kernel tracer (dev/profile/kernel_trace.cpp,
# CUPTI): the time per step in which no kernel or copy ran on any stream, and what ran around the gaps.
#   scripts/bench.sh [-e "d12 d24 d48"] [-b "4 8 16 32"] [-k "softmax relu"] [-n STEPS] [-r 0|1] [-f 0|1|2] [--no-torch] [--kernels] [--idle]
# e.g. the larger models' rows: scripts/bench.sh -e "d24" -b 16 -k softmax; scripts/bench.sh -e d48 -b 8 -k softmax
# -r 1 runs our trainer with -r 1 (residual2 recomputed: less memory, a little slower); its rows say "/r1".
# -f 0 or 2 (strict FP32) runs our trainer with that -f and PyTorch without --tf32 (matmul precision
# 'highest'); its rows say "/f0" or "/f2".
# TRAINER runs another trainer instead of building ours (dev/test/test_bench_gpus.sh's fake).
set -euo pipefail
cd "$(dirname "$0")/.."
models="d12"; batches="4 8 16 32"; kinds="softmax relu"; steps=30; recompute=0; precision=1; torch=1; kernels=0; idle=0
while [ $# -gt 0 ]; do
  case "$1" in
    -e) models=$2; shift 2 ;;
    -b) batches=$2; shift 2 ;;
    -k) kinds=$2; shift 2 ;;
    -n) steps=$2; shift 2 ;;
    -r) recompute=$2; shift 2 ;;
    -f) precision=$2; shift 2 ;;
    --no-torch) torch=0; shift ;;
    --kernels) kernels=1; shift ;;
    --idle) idle=1; shift ;;
    *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 1 ;;
  esac
done
trainer=${TRAINER:-./train_gpt2_fp32}
[ -n "${TRAINER:-}" ] || make -j"$(nproc)" train_gpt2_fp32 > /dev/null
if [ "$idle" = 1 ]; then
  make build/libkernel_trace.so > /dev/null || { echo "error: --idle needs the kernel tracer (CUPTI)" >&2; exit 1; }
fi
data=dev/data/tinyshakespeare/tiny_shakespeare_train.bin
[ -e "$data" ] || make data > /dev/null
logs=$(mktemp -d)
smi_id=$(scripts/visible_gpus.sh --ids | head -n 1)  # the trainer's GPU, the one nvidia-smi samples
gpu=$(nvidia-smi --id="$smi_id" --query-gpu=name --format=csv,noheader)

# Runs our trainer (its output to $1.log) with nvidia-smi sampling the GPU into $1.smi; $1.marks
# gets the times (of day) at which the log showed step 3 and the final average.
run_sampled() {
  local base=$1; shift
  nvidia-smi --id="$smi_id" --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 \
    > "$base.smi" 2> /dev/null &
  local smi=$! start="" end="" status=0
  "$@" > "$base.log" 2>&1 &
  local trainer=$!
  while kill -0 "$trainer" 2> /dev/null; do
    [ -z "$start" ] && grep -q '^step     3/' "$base.log" && start=$(date +%T.%N)
    [ -z "$end" ] && grep -q '^average step' "$base.log" && end=$(date +%T.%N)
    sleep 0.02
  done
  wait "$trainer" || status=$?
  kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null || true
  echo "${start:-00:00:00} ${end:-23:59:59}" > "$base.marks"
  return $status
}

# "busy% MHz W": the means of the samples between the marks (- when none).
gpu_stats() {
  awk -v marks="$(cat "$1.marks")" -F', ' '
    function seconds(t,  p) { split(t, p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
    BEGIN { split(marks, m, " "); from = seconds(m[1]); to = seconds(m[2]) }
    { split($1, stamp, " "); t = seconds(stamp[2]); if (t >= from && t <= to) { busy += $2; mhz += $3; watts += $4; n++ } }
    END { if (n) printf "%.1f %.0f %.0f", busy / n, mhz / n, watts / n; else printf "- - -" }' "$1.smi"
}

# Our MFU as the trainer reports it, averaged over the steps after the first (which includes setup):
# the step lines only, not the closing "step times" line.
trainer_mfu() { grep -E '^step +[0-9]+/' "$1" | awk -F'|' 'NR > 1 { sub(/.*MFU /, "", $7); sum += $7; n++ } END { printf "%.1f", n ? sum / n : 0 }'; }

rows=(); traced=()
for model in $models; do
  for kind in $kinds; do
    for B in $batches; do
      run=${model}_${kind}_$B
      run_sampled "$logs/ours_$run" "$trainer" -e "$model" -A "$kind" -b "$B" -t 1024 -x "$steps" -v 0 -s 0 \
        -r "$recompute" -f "$precision" -i "$data" || { echo "error: our trainer failed at $model B=$B $kind:"; tail -n 3 "$logs/ours_$run.log"; exit 1; }
      read -r busy mhz watts <<< "$(gpu_stats "$logs/ours_$run")"
      ours_ms=$(grep '^average step' "$logs/ours_$run.log" | awk '{print $3}')
      ours_gb=$(grep '^GPU memory allocated' "$logs/ours_$run.log" | awk '{print $4}')
      ours_mfu=$(trainer_mfu "$logs/ours_$run.log")
      phases=$(grep '^average step' "$logs/ours_$run.log" | sed 's/.*(\(.*\))/\1/')
      torch_ms=-; torch_gb=-
      if [ "$torch" = 1 ]; then
        flash=$([ "$kind" = softmax ] && echo --flash || true)
        tf32=$([ "$precision" = 1 ] && echo --tf32 || true)
        python3 train_gpt2.py --model "$model" --attn "$kind" --batch "$B" --seq-len 1024 --steps "$steps" --train-shards "$data" \
          --compile $tf32 $flash > "$logs/torch_$run.log" 2>&1 \
          || { echo "error: PyTorch failed at $model B=$B $kind:"; tail -n 3 "$logs/torch_$run.log"; exit 1; }
        torch_ms=$(grep '^RESULT' "$logs/torch_$run.log" | sed 's/.*ms_per_step=\([0-9.]*\).*/\1/')
        torch_gb=$(grep '^RESULT' "$logs/torch_$run.log" | sed 's/.*peak_mem_gb=\([0-9.]*\).*/\1/')
      fi
      if [ "$idle" = 1 ]; then
        CUDA_INJECTION64_PATH=build/libkernel_trace.so KERNEL_TRACE_REPORT="$logs/idle_$run.txt" "$trainer" \
          -e "$model" -A "$kind" -b "$B" -t 1024 -x 12 -v 0 -s 0 -r "$recompute" -f "$precision" -i "$data" > /dev/null 2>&1 \
          || { echo "error: the traced run failed at $model B=$B $kind"; exit 1; }
        traced+=("$model $kind B=$B:$logs/idle_$run.txt")
      fi
      label=$model; [ "$recompute" = 1 ] && label=$label/r1; [ "$precision" != 1 ] && label=$label/f$precision
      rows+=("$label $kind $B $ours_ms $ours_mfu $ours_gb $torch_ms $torch_gb $busy $mhz $watts")
      echo "$model $kind B=$B: ours $ours_ms ms ($phases), $ours_gb GB, GPU busy $busy% at $mhz MHz, $watts W;" \
        "PyTorch $torch_ms ms, $torch_gb GB"
    done
  done
done

echo
echo "GPT-2 from scratch, T=1024, $steps steps, $gpu; MFU as the trainer reports it (against the GPU's dense TF32 peak)"
printf "%-6s %-8s %3s | %9s %9s %6s %8s %6s %5s | %9s %9s %8s | %7s %7s\n" model attn B "ours ms" "tok/s" MFU "mem GB" \
  "busy%" MHz "torch ms" "tok/s" "mem GB" "time x" "mem x"
for row in "${rows[@]}"; do
  set -- $row
  awk -v model="$1" -v kind="$2" -v B="$3" -v ms="$4" -v mfu="$5" -v gb="$6" -v tms="$7" -v tgb="$8" -v busy="$9" \
      -v mhz="${10}" 'BEGIN {
    tok = B * 1024
    if (tms == "-") { printf "%-6s %-8s %3d | %9.2f %9.0f %5.1f%% %8.2f %6s %5s | %9s %9s %8s | %7s %7s\n", model, kind, B, ms, tok / ms * 1000, mfu, gb, busy, mhz, "-", "-", "-", "-", "-" }
    else { printf "%-6s %-8s %3d | %9.2f %9.0f %5.1f%% %8.2f %6s %5s | %9.2f %9.0f %8.2f | %7.3f %7.3f\n", model, kind, B, ms, tok / ms * 1000, mfu, gb, busy, mhz, tms, tok / tms * 1000, tgb, ms / tms, gb / tgb }
  }'
done

if [ "$idle" = 1 ]; then
  for entry in "${traced[@]}"; do
    echo
    echo "${entry%%:*}, 12 steps under the kernel tracer:"
    cat "${entry#*:}"
  done
fi

if [ "$kernels" = 1 ] && command -v ncu > /dev/null; then
  B=$(echo $batches | awk '{print $NF}'); kind=$(echo $kinds | awk '{print $1}')
  echo
  echo "top kernels of the first step (B=$B, $kind; ncu, kernels serialised, caches not flushed):"
  ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --launch-count 800 "$trainer" -e d12 -A "$kind" -b "$B" -t 1024 -x 1 -v 0 -s 0 -i "$data" \
    > "$logs/ncu.csv" 2> /dev/null || true
  awk -F'","' 'BEGIN { ms["ns"] = ms["nsecond"] = 1e-6; ms["us"] = ms["usecond"] = 1e-3; ms["ms"] = ms["msecond"] = 1
            ms["s"] = ms["second"] = 1e3 }
    $0 ~ /gpu__time_duration/ && $5 !~ /init_normal/ { name = $5; sub(/\(.*/, "", name); sub(/^void /, "", name)
      value = $NF; gsub(/[",]/, "", value); t[name] += value * ms[$(NF - 1)]; total += value * ms[$(NF - 1)] }
    END { for (k in t) printf "%8.3f ms %5.1f%%  %s\n", t[k], 100 * t[k] / total, k; printf "%8.3f ms total\n", total }' \
    "$logs/ncu.csv" | sort -rn | head -n 16
fi
rm -rf "$logs"
