#!/usr/bin/env bash
# Generation speed on one GPU: our trainer against transformers' generate() (KV cache, greedy,
# scripts/bench_generate.py) from the same random-init weights (GPT-2 124M = d12, XL = d48), a
# 32-token prompt, 256 new tokens, 1 and 16 completions; in full FP32 (our -f 0; TF32 off, as
# PyTorch's default) and with TF32 (our default -f 1; PyTorch's "high" matmul precision).
# Ours: the tokens/s of the trainer's decode: line; transformers': the whole generate() call (its
# prefill included, about one step's time). Prints a markdown table; logs go to $OUT when set.
#   scripts/bench_generate.sh [--models "d12 d48"] [--quick]   (--quick: d12 only, 64 new tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
models=; new_tokens=256; quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models=$2; shift 2 ;;
    --quick) quick=1; new_tokens=64; shift ;;
    *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 1 ;;
  esac
done
models=${models:-$([ "$quick" = 1 ] && echo d12 || echo "d12 d48")}
make -j"$(nproc)" train_gpt2_fp32 > /dev/null
work=$(mktemp -d)  # the model files (6 GB for d48): not in $OUT
trap 'rm -rf "$work"' EXIT
logs=${OUT:-$work}
mkdir -p "$logs"
prompt="In a quiet village by the sea, an old fisherman told the children stories about the storms he had survived and the strange lights he had seen on the water."  # 32 GPT-2 tokens
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)

ours() {  # ours MODEL M F: the tokens/s of our decode: line, M completions at -f F
  local log="$logs/ours_$1_m$2_f$3.log"
  ./train_gpt2_fp32 -e "$work/$1.bin" --prompt "$prompt" --temperature 0 --gen "$new_tokens" --batch-samples "$2" \
    -f "$3" > "$log" 2>&1 || { echo "error: our trainer failed on $1, M=$2:" >&2; tail -n 3 "$log" >&2; exit 1; }
  local rate
  rate=$(grep '^decode:' "$log" | sed -E 's|.* ([0-9.]+) tokens/s.*|\1|')
  [ -n "$rate" ] || { echo "error: no decode: line in $log" >&2; exit 1; }
  echo "$rate"
}

rows=()
for model in $models; do
  python3 train_gpt2.py --device cpu --model "$model" --write-model "$work/$model.bin" > "$logs/write_$model.log"
  ours "$model" 1 1 > /dev/null  # warm-up: GPU clocks, the model file in the page cache
  for M in 1 16; do
    for f in 0 1; do
      rows+=("$model $M $f $(ours "$model" "$M" "$f")")
    done
  done
  python3 scripts/bench_generate.py "$work/$model.bin" --prompt "$prompt" --new-tokens "$new_tokens" --completions 1 16 \
    > "$logs/transformers_$model.log" 2>&1 || { echo "error: transformers failed on $model:"; tail -n 3 "$logs/transformers_$model.log"; exit 1; }
  rm "$work/$model.bin"
done

echo "greedy generation, 32-token prompt, $new_tokens new tokens, $gpu; M completions at once"
echo
echo "| model | M | precision | ours tok/s | transformers tok/s | ours / transformers |"
echo "|---|---:|---|---:|---:|---:|"
for row in "${rows[@]}"; do
  set -- $row
  theirs=$(grep "^RESULT completions=$2 tf32=$3 " "$logs/transformers_$1.log" | sed 's/.*tok_per_s=//')
  awk -v model="$1" -v M="$2" -v f="$3" -v ours="$4" -v theirs="$theirs" 'BEGIN {
    printf "| %s | %d | %s | %.0f | %.0f | %.2f |\n", model, M, f ? "TF32" : "FP32", ours, theirs, ours / theirs }'
done
