#!/usr/bin/env bash
# Our trainer on several GPUs of one host against PyTorch DDP (torchrun train_gpt2.py: torch.compile,
# flash SDPA for softmax, TF32), same data and steps: GPT-2 from scratch, T=1024, B rows per GPU
# (d12: 16, d48: 8), one optimizer step per B x 1024 x GPUs batch. Prints ms/step, global tok/s,
# scaling efficiency (tok/s at G GPUs / (G x tok/s at 1 GPU with as many micro-steps), so the 1-GPU
# run is needed), our exposed communication, memory per GPU (the trainer's count and nvidia-smi's
# for rank 0's GPU during our run) and our tok/s / PyTorch's; then issue 55's targets (d12 B=16 >= 98%
# scaling and >= 1.9x DDP's tok/s at each GPU count above 1, d48 B=8 at 4 GPUs and more >= 98% with exposed
# communication <= 7 ms), met or missed; the table last, in markdown.
#   scripts/bench_gpus.sh [--gpus "1 2 4"] [-e "d12 d48"] [-k "softmax relu"] [-n STEPS] [-w WARM]
#                         [-i DATA] [--no-torch] [--torch-d48] [--socket] [--sweep] [--links] [--link-models "d12 d48"]
#                         [--link-micro "4 8"]
# --gpus: d12 runs at each count, d48 at the first and the last (default: 1, 2, 4 as the machine
# has them). Kinds: d12 runs softmax and ReLU, d48 softmax only; -k sets the kinds of every model;
# -e "" runs no model rows (only --socket / --sweep / --links, with the 1-GPU baselines they need). -n steps
# per run (default 15), of which the first -w (default 3) are left out of the times on both sides
# (ours: the mean of the printed step times after them). PyTorch DDP runs for d12 (and d48 with
# --torch-d48); --no-torch: none.
# The default rows run --overlap auto (the trainer's choice); the others name theirs.
# --socket: 2 GPUs over NCCL's socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1, as between
#   nodes), d12 B=16 softmax: one micro-step with --overlap on and off (exposed communication with
#   the overlap against the whole transfer without it), and four micro-steps per GPU against 1 GPU
#   with four micro-steps.
# --sweep: --overlap off and on at d12 B=16, d24 B=16 and d48 B=8 on the largest GPU count (with
#   their 1-GPU baselines).
# --links: 2 GPUs over NCCL's host shared memory (NCCL_P2P_DISABLE=1: the order of an InfiniBand
#   link) and sockets (NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 as well: Ethernet), each link's rate measured first
#   (scripts/link_rate.py): the --link-models (default d12 B=16 and d48 B=8) with --overlap off and
#   on (d48 over sockets: 5 steps), and d12 at the --link-micro micro-steps per GPU (default 4 and 8;
#   "" for none) with --overlap off and on.
# Time on 4 H100s (estimated): the default bench about 6 minutes (ours: d12 ~7 s a run, d48 ~20 s;
# most of it is PyTorch's compiles, ~15-45 s a run), --socket about 1 minute, --sweep 3;
# --links on 2 H200s: 103 s with --link-models d12, 94 s with d48 and --link-micro "" (measured).
# Logs go to a temporary folder removed at the end, or to $BENCH_LOGS (kept) when set. TRAINER and
# TORCHRUN replace ./train_gpt2_fp32 (then it is not built) and torchrun, to test this script
# without a GPU (dev/test/test_bench_gpus.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
gpus=; models="d12 d48"; kinds=; steps=15; warm=3; torch=1; torch_d48=0; socket=0; sweep=0; links=0
link_models="d12 d48"; link_micro="4 8"
data=dev/data/tinyshakespeare/tiny_shakespeare_train.bin
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus=$2; shift 2 ;;
    -e) models=$2; shift 2 ;;
    -k) kinds=$2; shift 2 ;;
    -n) steps=$2; shift 2 ;;
    -w) warm=$2; shift 2 ;;
    -i) data=$2; shift 2 ;;
    --no-torch) torch=0; shift ;;
    --torch-d48) torch_d48=1; shift ;;
    --socket) socket=1; shift ;;
    --sweep) sweep=1; shift ;;
    --links) links=1; shift ;;
    --link-models) link_models=$2; shift 2 ;;
    --link-micro) link_micro=$2; shift 2 ;;
    *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 1 ;;
  esac
done
[ "$steps" -gt "$warm" ] || { echo "error: -n $steps leaves no timed steps after -w $warm" >&2; exit 1; }
trainer=${TRAINER:-./train_gpt2_fp32}
torchrun=${TORCHRUN:-torchrun}
[ -n "${TRAINER:-}" ] || make -j"$(nproc)" train_gpt2_fp32 > /dev/null
[ -e "$data" ] || make data > /dev/null
have_smi=$(command -v nvidia-smi > /dev/null && echo 1 || echo 0)
smi_id=$(scripts/visible_gpus.sh --ids | head -n 1)  # rank 0's GPU, whose memory nvidia-smi samples
gpu=$([ "$have_smi" = 1 ] && nvidia-smi --id="$smi_id" --query-gpu=name --format=csv,noheader || echo "unknown GPU")
if [ -z "$gpus" ]; then
  count=$(scripts/visible_gpus.sh)
  [ -n "$count" ] || count=2  # no nvidia-smi: the CPU test's fake trainer
  for G in 1 2 4; do [ "$G" -gt "$count" ] || gpus="$gpus $G"; done
fi
read -r -a gpu_list <<< "$gpus"
max_gpus=${gpu_list[-1]}
if [ -n "${BENCH_LOGS:-}" ]; then logs=$BENCH_LOGS; mkdir -p "$logs"; else logs=$(mktemp -d); fi
smi_pid=
cleanup() {
  if [ -n "$smi_pid" ]; then kill "$smi_pid" 2> /dev/null || true; fi
  if [ -z "${BENCH_LOGS:-}" ]; then rm -rf "$logs"; fi
}
trap cleanup EXIT
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
started=$SECONDS

# Runs a command into a log; on failure prints the log's tail and exits.
run_logged() {
  local what=$1 log=$2; shift 2
  "$@" > "$log" 2>&1 || { echo "error: $what failed:"; tail -n 15 "$log"; exit 1; }
}
# The first number after a line's prefix, or $3 when the log has no such line.
field() { grep "^$2" "$1" | head -n 1 | sed "s/^$2 *\([0-9.]*\).*/\1/" | grep . || echo "${3:--}"; }
# The mean of the printed step times after the first $warm steps, else the "average step:".
step_ms() {
  grep -E '^step +[0-9]+/[0-9]+ \|' "$1" | awk -F'|' -v warm="$warm" '{
    split($1, word, "[ /]+"); if (word[2] + 0 <= warm) next
    for (i = 2; i <= NF; i++) if ($i ~ /^ *[0-9.]+ ms *$/) { sub(/ ms.*/, "", $i); sum += $i; n++; break } }
    END { if (n > 0) printf "%.2f\n", sum / n }' | grep . || field "$1" 'average step:'
}
# The max of rank 0's GPU's memory.used samples (MiB) in GB, or - without samples.
smi_gb() { awk '$1 ~ /^[0-9]+$/ && $1 > max { max = $1 } END { if (max == "") print "-"; else printf "%.3f", max * 1048576 / 1e9 }' "$1"; }
batch_of() {
  case "$1" in d12|d24) echo 16 ;; d48) echo 8 ;; *) echo "error: no batch size for model $1 (d12, d24 or d48)" >&2; exit 1 ;; esac
}

declare -A base_ms torch_base_ms  # "model kind micro-steps" -> ms/step on 1 GPU
rows=()  # model;kind;B;GPUs;micro-steps;form;ours ms;comm ms;ours GB;smi GB;torch ms;torch GB
# ours NAME MODEL KIND G MICRO OVERLAP FORM [VAR=VALUE...]: one run of our trainer with --overlap
# OVERLAP (environment VAR=VALUE), and of PyTorch DDP with the same shape when $with_torch is 1 and
# the form is the default
ours() {
  local name=$1 model=$2 kind=$3 G=$4 micro=$5 overlap=$6 form=$7
  shift 7
  local B gpu_flags smi=- ours_ms comm_ms ours_gb opt_gb passes torch_ms=- torch_gb=- flash
  B=$(batch_of "$model")
  gpu_flags=$([ "$G" = 1 ] || echo "--gpus $G")
  if [ "$have_smi" = 1 ]; then
    nvidia-smi --id="$smi_id" --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$logs/smi_$name.log" 2>&1 &
    smi_pid=$!
  fi
  # shellcheck disable=SC2086  # gpu_flags: empty or two words
  run_logged "our trainer ($model $kind, $G GPUs, $form)" "$logs/ours_$name.log" env "$@" "$trainer" $gpu_flags \
    -e "$model" -A "$kind" -b "$B" -t 1024 -d $((B * 1024 * G * micro)) -x "$steps" -v 0 -s 0 -i "$data" \
    --overlap "$overlap"
  if [ -n "$smi_pid" ]; then
    kill "$smi_pid" 2> /dev/null || true; wait "$smi_pid" 2> /dev/null || true; smi_pid=
    smi=$(smi_gb "$logs/smi_$name.log")
  fi
  ours_ms=$(step_ms "$logs/ours_$name.log")
  comm_ms=$(field "$logs/ours_$name.log" 'exposed communication:' 0)
  ours_gb=$(field "$logs/ours_$name.log" 'GPU memory allocated:')
  passes=$(grep -o '(forward [0-9.]*, backward [0-9.]*' "$logs/ours_$name.log" | head -n 1 | tr -d '(' || true)
  opt_gb=$(field "$logs/ours_$name.log" '| optimizer memory *|')
  if [ "$with_torch" = 1 ] && [ "$form" = default ] && [ "$micro" = 1 ]; then
    flash=$([ "$kind" != softmax ] || echo --flash)
    # shellcheck disable=SC2086  # flash: empty or one word
    run_logged "PyTorch ($model $kind, $G GPUs)" "$logs/torch_$name.log" "$torchrun" --standalone --nproc_per_node "$G" \
      train_gpt2.py --model "$model" --attn "$kind" --batch "$B" --seq-len 1024 --steps "$steps" --warmup-steps "$warm" \
      --train-shards "$data" --compile --tf32 $flash
    torch_ms=$(grep '^RESULT' "$logs/torch_$name.log" | sed 's/.*ms_per_step=\([0-9.]*\).*/\1/')
    torch_gb=$(grep '^RESULT' "$logs/torch_$name.log" | sed 's/.*peak_mem_gb=\([0-9.]*\).*/\1/')
  fi
  if [ "$G" = 1 ] && [ "$form" = default ]; then
    base_ms["$model $kind $micro"]=$ours_ms; torch_base_ms["$model $kind $micro"]=$torch_ms
  fi
  rows+=("$model;$kind;$B;$G;$micro;$form;$ours_ms;$comm_ms;$ours_gb;$smi;$torch_ms;$torch_gb")
  echo "$model $kind B=$B GPUs=$G micro-steps=$micro $form: ours $ours_ms ms, exposed communication $comm_ms ms," \
    "$ours_gb GB per GPU (optimizer $opt_gb GB), nvidia-smi $smi GB; ${passes:-passes -} ms;" \
    "PyTorch $torch_ms ms, $torch_gb GB"
}
# baseline MODEL KIND MICRO: the 1-GPU run that scaling needs, unless the model rows had it
baseline() {
  [ -n "${base_ms["$1 $2 $3"]:-}" ] || with_torch=0 ours "${1}_${2}_1_m$3" "$1" "$2" 1 "$3" auto default
}

for model in $models; do
  case "$model" in
    d12) model_kinds=${kinds:-softmax relu}; model_gpus=("${gpu_list[@]}"); with_torch=$torch ;;
    d48) model_kinds=${kinds:-softmax}; model_gpus=("${gpu_list[0]}"); with_torch=$((torch * torch_d48))
         [ "${#gpu_list[@]}" = 1 ] || model_gpus+=("$max_gpus") ;;
    *) batch_of "$model" > /dev/null; exit 1 ;;
  esac
  for kind in $model_kinds; do
    for G in "${model_gpus[@]}"; do ours "${model}_${kind}_$G" "$model" "$kind" "$G" 1 auto default; done
  done
done
with_torch=0
if [ "$socket" = 1 ]; then
  baseline d12 softmax 1
  baseline d12 softmax 4
  sock=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1)  # sockets, not InfiniBand/RoCE where there
  ours socket_overlap d12 softmax 2 1 on "socket, --overlap on" "${sock[@]}"
  ours socket_no_overlap d12 softmax 2 1 off "socket, --overlap off" "${sock[@]}"
  ours socket_micro4 d12 softmax 2 4 auto "socket" "${sock[@]}"
fi
if [ "$sweep" = 1 ]; then
  for model in d12 d24 d48; do
    baseline "$model" softmax 1
    for overlap in off on; do
      ours "sweep_${model}_$overlap" "$model" softmax "$max_gpus" 1 "$overlap" "--overlap $overlap"
    done
  done
fi
if [ "$links" = 1 ]; then
  for link in shm socket; do
    link_env=(NCCL_P2P_DISABLE=1)
    [ "$link" = shm ] || link_env+=(NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1)  # sockets, never InfiniBand/RoCE
    run_logged "link rate ($link)" "$logs/link_$link.log" env "${link_env[@]}" "$torchrun" --standalone \
      --nproc_per_node 2 scripts/link_rate.py
    echo "link $link: $(grep '^RESULT' "$logs/link_$link.log")"
    for model in $link_models; do
      baseline "$model" softmax 1
      for overlap in off on; do
        if [ "$link $model" = "socket d48" ]; then
          steps=5 warm=2 ours "${link}_${model}_$overlap" "$model" softmax 2 1 "$overlap" "$link, --overlap $overlap" "${link_env[@]}"
        else
          ours "${link}_${model}_$overlap" "$model" softmax 2 1 "$overlap" "$link, --overlap $overlap" "${link_env[@]}"
        fi
      done
    done
    for micro in $link_micro; do
      baseline d12 softmax "$micro"
      for overlap in off on; do
        ours "${link}_micro${micro}_$overlap" d12 softmax 2 "$micro" "$overlap" "$link, --overlap $overlap" "${link_env[@]}"
      done
    done
  done
fi

# each row's numbers: model kind B G micro form ours_ms tok/s scaling comm gb smi torch_ms torch_tok/s torch_scaling torch_gb ratio
table_rows() {
  local row model kind B G micro form ours_ms comm_ms ours_gb smi torch_ms torch_gb
  for row in "${rows[@]}"; do
    IFS=';' read -r model kind B G micro form ours_ms comm_ms ours_gb smi torch_ms torch_gb <<< "$row"
    awk -v row="$row" -v B="$B" -v G="$G" -v micro="$micro" -v ms="$ours_ms" -v tms="$torch_ms" \
      -v ms1="${base_ms["$model $kind $micro"]:--}" -v tms1="${torch_base_ms["$model $kind $micro"]:--}" 'BEGIN {
      tok = B * 1024 * G * micro
      scale = ms1 == "-" || ms == "-" || G == 1 ? "-" : sprintf("%.1f", 100 * ms1 / ms)
      tok_s = ms == "-" ? "-" : sprintf("%.0f", tok / ms * 1000)
      if (tms == "-" || tms == "") { ttok = "-"; tscale = "-"; ratio = "-" }
      else {
        ttok = sprintf("%.0f", tok / tms * 1000)
        tscale = tms1 == "-" || G == 1 ? "-" : sprintf("%.1f", 100 * tms1 / tms)
        ratio = ms == "-" ? "-" : sprintf("%.3f", tms / ms)
      }
      print row ";" tok_s ";" scale ";" ttok ";" tscale ";" ratio }'
  done
}
mapfile -t results < <(table_rows)
# issue 55's targets (the --socket, --sweep and --links rows have none: its "no regression" is against the README)
target() {  # target TEXT OK: one line
  printf -- "- %s: %s\n" "$1" "$([ "$2" = 1 ] && echo met || echo MISSED)"
}
echo
echo "Targets of issue 55 ($gpu):"
for line in "${results[@]}"; do
  IFS=';' read -r model kind B G micro form ours_ms comm_ms ours_gb smi torch_ms torch_gb tok_s scale ttok tscale ratio <<< "$line"
  [ "$G" != 1 ] || continue
  ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "-" && a + 0 >= b) }' && echo 1 || echo 0; }
  if [ "$form" = default ] && [ "$model" = d12 ]; then
    target "d12 $kind, $G GPUs: scaling $scale% >= 98%" "$(ge "$scale" 98)"
    [ "$ratio" = - ] || target "d12 $kind, $G GPUs: tok/s ${ratio}x PyTorch DDP's >= 1.9x" "$(ge "$ratio" 1.9)"
  elif [ "$form" = default ] && [ "$model" = d48 ] && [ "$G" -ge 4 ]; then
    target "d48, $G GPUs: scaling $scale% >= 98%, exposed communication $comm_ms ms <= 7" \
      "$(awk -v s="$(ge "$scale" 98)" -v c="$comm_ms" 'BEGIN { print s == 1 && c != "-" && c + 0 <= 7 ? 1 : 0 }')"
  fi
done

echo
echo "GPT-2, T=1024, B rows per GPU, $steps steps (the first $warm untimed), $gpu, $(date +%Y-%m-%d), $((SECONDS - started)) s;" \
  "tok/s global; scaling = tok/s / (GPUs x tok/s on 1 GPU with as many micro-steps per GPU)"
echo
echo "| model | attention | B per GPU | GPUs | micro-steps | form | ours ms/step | tok/s | scaling | exposed comm ms | memory GB | nvidia-smi GB | DDP ms/step | DDP tok/s | DDP scaling | DDP memory GB | ours / DDP |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for line in "${results[@]}"; do
  IFS=';' read -r model kind B G micro form ours_ms comm_ms ours_gb smi torch_ms torch_gb tok_s scale ttok tscale ratio <<< "$line"
  pct() { [ "$1" = - ] && echo - || echo "$1%"; }
  [ "$G" != 1 ] || comm_ms=-
  echo "| $model | $kind | $B | $G | $micro | $form | $ours_ms | $tok_s | $(pct "$scale") | $comm_ms | $ours_gb | $smi |" \
    "${torch_ms:--} | $ttok | $(pct "$tscale") | ${torch_gb:--} | $ratio |"
done
