#!/usr/bin/env bash
# CPU test of scripts/bench_gpus.sh with a fake trainer and a fake torchrun (TRAINER, TORCHRUN): the
# rows it runs (model rows, --socket, --sweep, --links), the --overlap and environment each gets, the warm-up steps
# left out of our times, scaling against the 1-GPU run with as many micro-steps, issue 55's targets
# (none for the socket, sweep and link rows), the markdown table, --no-torch, a failed run stopping
# the bench with its log, and the GPU count (scripts/visible_gpus.sh); then scripts/bench.sh's GPU
# samples and MFU.
set -u
cd "$(dirname "$0")/../.."
source dev/test/runs.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$work/data.bin"
# The fake trainer: ms per step from the model, micro-steps, GPU count and transport; the first 3
# steps 10x slower (the bench must leave them out); exposed communication from the transport and
# --overlap (off: 6 ms, on or auto: 2). It records the variables the bench sets (NCCL_P2P_DISABLE,
# NCCL_SHM_DISABLE, NCCL_IB_DISABLE; a GPU machine may set other NCCL_* ones) and its --overlap in $CALLS.
cat > "$work/trainer" << 'EOF'
#!/usr/bin/env bash
G=1 model=d12 B=0 d=0 steps=0 overlap=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) G=$2; shift 2 ;; -e) model=$2; shift 2 ;; -b) B=$2; shift 2 ;; -d) d=$2; shift 2 ;;
    --overlap) overlap=$2; shift 2 ;;
    -x) steps=$2; shift 2 ;; -A|-t|-v|-s|-i) shift 2 ;; *) echo "error: unknown flag $1"; exit 1 ;;
  esac
done
[ "${FAKE_FAIL:-}" = "$model $G" ] && { echo "error: out of memory"; exit 1; }
micro=$((d / (B * 1024 * G)))
echo "$model G=$G micro=$micro overlap=$overlap $(env | grep -E '^(NCCL_P2P_DISABLE=|NCCL_SHM_DISABLE=|NCCL_IB_DISABLE=)' | sort | tr '\n' ' ')" >> "$CALLS"
base=$([ "$model" = d12 ] && echo 60 || echo 330)
socket=$([ "${NCCL_P2P_DISABLE:-0}" = 1 ] && echo 1 || echo 0)
comm=0
if [ "$G" -gt 1 ]; then
  comm=$([ "$overlap" = off ] && echo 6 || echo 2)
  [ "$socket" = 0 ] || comm=$((comm * 5))
fi
ms=$(awk -v b="$base" -v m="$micro" -v c="$comm" 'BEGIN { printf "%.2f", b * m * 1.0 + c }')
echo "| optimizer memory | 0.498 GB |"
for s in $(seq 1 "$steps"); do
  t=$([ "$s" -le 3 ] && awk -v m="$ms" 'BEGIN { printf "%.2f", m * 10 }' || echo "$ms")
  printf 'step %5d/%d | loss 9.000000 | lr 6.000e-04 | norm 1.0000 | %s ms | 1000 tok/s | MFU 10.0%% | ETA 0.1 min\n' "$s" "$steps" "$t"
done
echo "average step: 999.00 ms (forward 1, backward 1, update 1 ms on the GPU)"
[ "$G" = 1 ] || echo "exposed communication: $comm.00 ms per step"
echo "GPU memory allocated: 10.190 GB"
EOF
cat > "$work/torchrun" << 'EOF'
#!/usr/bin/env bash
G=$3
echo "torch G=$G $*" >> "$CALLS"
echo "RESULT ms_per_step=$([ "$G" = 1 ] && echo 110.000 || echo 120.000) tok_per_s=1 peak_mem_gb=12.500"
EOF
chmod +x "$work/trainer" "$work/torchrun"
bench() {  # bench NAME ARGS...: the bench with the fakes, into $work/NAME.out, its calls in $work/NAME.calls
  local name=$1
  shift
  CALLS="$work/$name.calls" TRAINER="$work/trainer" TORCHRUN="$work/torchrun" \
    scripts/bench_gpus.sh -i "$work/data.bin" "$@" > "$work/$name.out" 2>&1
}
export CALLS
row() { grep -E "^\| $2 \|" "$work/$1.out"; }  # row NAME "d12 \| softmax \| 16 \| 2 \| 1 \| default"
fails() { ! "$@"; }

check "default rows, --gpus '1 2 4': runs, exit 0" bench main --gpus "1 2 4"
check "d12 both kinds at 1, 2, 4 GPUs and d48 at 1 and 4: 8 table rows" \
  test "$(grep -cE '^\| d(12|48) \|' "$work/main.out")" = 8
check "d48 at 2 GPUs: not run" eval "! grep -q 'd48 G=2' '$work/main.calls'"
check "PyTorch DDP: for d12 only (6 runs), with --warmup-steps 3" \
  test "$(grep -c '^torch .*--warmup-steps 3' "$work/main.calls")" = 6
check "ours: the first 3 steps left out (60.00 ms on 1 GPU, 62.00 at 2)" eval \
  "row main 'd12 \| softmax \| 16 \| 1 \| 1 \| default' | grep -qF '| 60.00 |' &&
   row main 'd12 \| softmax \| 16 \| 2 \| 1 \| default' | grep -qF '| 62.00 |'"
# 2 GPUs: 62 ms against 60 -> 96.8%; tok/s 16*1024*2/0.062; DDP 120 against 110 -> 91.7%, 120/62 = 1.935
check "scaling, tok/s, DDP's and the ratio" eval \
  "row main 'd12 \| relu \| 16 \| 2 \| 1 \| default' | grep -qF '| 62.00 | 528516 | 96.8% | 2.00 | 10.190 | - | 120.000 | 273067 | 91.7% | 12.500 | 1.935 |'"
check "issue 55's targets: d12 scaling missed, ratio met; d48 at 4 met" eval \
  "grep -q '^Targets of issue 55 ' '$work/main.out' &&
   grep -q 'd12 softmax, 2 GPUs: scaling 96.8% >= 98%: MISSED' '$work/main.out' &&
   grep -q 'd12 relu, 4 GPUs: tok/s 1.935x PyTorch DDP.s >= 1.9x: met' '$work/main.out' &&
   grep -q 'd48, 4 GPUs: scaling 99.4% >= 98%, exposed communication 2.00 ms <= 7: met' '$work/main.out'"
check "the table is last" eval "tail -n 1 '$work/main.out' | grep -q '^| d48 | softmax | 8 | 4 |'"

check "--socket --sweep -e '' --no-torch --gpus '1 2': runs, exit 0" bench extra --socket --sweep -e "" --no-torch --gpus "1 2"
check "... no PyTorch run" eval "! grep -q '^torch' '$work/extra.calls'"
check "... baselines: 1 GPU with 1 and with 4 micro-steps, --overlap auto" eval \
  "grep -q '^d12 G=1 micro=1 overlap=auto \$' '$work/extra.calls' && grep -q '^d12 G=1 micro=4 overlap=auto \$' '$work/extra.calls'"
check "... socket rows: NCCL_P2P_DISABLE, NCCL_SHM_DISABLE and NCCL_IB_DISABLE, --overlap on and off, 4 micro-steps" eval \
  "grep -q '^d12 G=2 micro=1 overlap=on NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1' '$work/extra.calls' &&
   grep -q '^d12 G=2 micro=1 overlap=off NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1' '$work/extra.calls' &&
   grep -q '^d12 G=2 micro=4 overlap=auto NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1' '$work/extra.calls'"
# socket, 4 micro-steps: 4*60 + 10 = 250 ms against 240 on 1 GPU -> 96.0%
check "... socket, 4 micro-steps: scaling against 1 GPU with 4 micro-steps" eval \
  "row extra 'd12 \| softmax \| 16 \| 2 \| 4 \| socket' | grep -qF '| 250.00 | 524288 | 96.0% | 10.00 |'"
check "... no targets for the socket and sweep rows (issue 55 has none)" eval \
  "! sed -n '/^Targets/,/^\$/p' '$work/extra.out' | grep -q '^- '"
check "... sweep: d12, d24, d48 at 2 GPUs with --overlap off and on, each with its 1-GPU baseline" eval \
  "(for m in d12 d24 d48; do grep -q \"^\$m G=1 micro=1 overlap=auto \\\$\" '$work/extra.calls' &&
     grep -q \"^\$m G=2 micro=1 overlap=off \\\$\" '$work/extra.calls' &&
     grep -q \"^\$m G=2 micro=1 overlap=on \\\$\" '$work/extra.calls' || exit 1; done) &&
   row extra 'd48 \| softmax \| 8 \| 2 \| 1 \| --overlap on' | grep -qF '| 332.00 |' &&
   row extra 'd48 \| softmax \| 8 \| 2 \| 1 \| --overlap off' | grep -qF '| 336.00 |'"
check "--links --link-models d48 -e '' --no-torch --gpus '1 2': runs, exit 0" bench links --links --link-models d48 -e "" --no-torch --gpus "1 2"
check "... the link rates first (torchrun link_rate.py), d48 over each link with --overlap off and on" eval \
  "test \$(grep -c 'link_rate.py' '$work/links.calls') = 2 &&
   grep -q '^d48 G=2 micro=1 overlap=on NCCL_P2P_DISABLE=1 \$' '$work/links.calls' &&
   grep -q '^d48 G=2 micro=1 overlap=off NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \$' '$work/links.calls' &&
   ! grep -q '^d12 G=2 micro=1 ' '$work/links.calls'"
check "... d12 at 4 and 8 micro-steps over each link, --overlap off and on" \
  test "$(grep -cE '^d12 G=2 micro=(4|8) overlap=(on|off) ' "$work/links.calls")" = 8
check "... no targets for the link rows (issue 55 has none)" eval \
  "! sed -n '/^Targets/,/^\$/p' '$work/links.out' | grep -q '^- '"

check "a failed run: the bench exits non-zero with its log's tail" eval \
  "FAKE_FAIL='d12 2' fails bench failed --gpus '1 2' -e d12 --no-torch &&
   grep -q '^error: our trainer (d12 softmax, 2 GPUs, default) failed' '$work/failed.out' &&
   grep -q 'out of memory' '$work/failed.out'"
check "an unknown argument: an error" fails_with "unknown argument --bogus" scripts/bench_gpus.sh --bogus

# scripts/visible_gpus.sh, which the bench, gpu_tests.sh and test_multi_gpu.sh count GPUs with, under a fake
# nvidia-smi of 4 GPUs
mkdir -p "$work/smi"
printf '#!/bin/sh\nfor i in 0 1 2 3; do echo "GPU $i: Fake H100"; done\n' > "$work/smi/nvidia-smi"
chmod +x "$work/smi/nvidia-smi"
# visible [VAR=VALUE | -u VAR]... [-- ARGS]: the script under that environment, with ARGS
visible() {
  local vars=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# = 0 ] || shift
  env "${vars[@]}" PATH="$work/smi:$PATH" scripts/visible_gpus.sh "$@"
}
check "visible GPUs: 4 unset, 2 of CUDA_VISIBLE_DEVICES=0,2, 0 of an empty one (exit status 0), 4 of 0,1,2,3,4" eval \
  "test \"\$(visible -u CUDA_VISIBLE_DEVICES)\" = 4 && test \"\$(visible CUDA_VISIBLE_DEVICES=0,2)\" = 2 &&
   test \"\$(visible CUDA_VISIBLE_DEVICES=)\" = 0 && test \"\$(visible CUDA_VISIBLE_DEVICES=0,1,2,3,4)\" = 4 &&
   visible CUDA_VISIBLE_DEVICES= > /dev/null"
check "visible GPUs' ids: 0-3 unset, 2 and 0 of CUDA_VISIBLE_DEVICES=2,0, none of an empty one" eval \
  "test \"\$(visible -u CUDA_VISIBLE_DEVICES -- --ids | tr '\n' ' ')\" = '0 1 2 3 ' &&
   test \"\$(visible CUDA_VISIBLE_DEVICES=2,0 -- --ids | tr '\n' ' ')\" = '2 0 ' &&
   test -z \"\$(visible CUDA_VISIBLE_DEVICES= -- --ids)\""
check "visible GPUs: CUDA stops at the first invalid entry (0,7,1: 1; 1,x,2: 1; -1,0: 0; GPU-ab,3: 2)" eval \
  "test \"\$(visible CUDA_VISIBLE_DEVICES=0,7,1 -- --ids)\" = 0 && test \"\$(visible CUDA_VISIBLE_DEVICES=1,x,2)\" = 1 &&
   test \"\$(visible CUDA_VISIBLE_DEVICES=-1,0)\" = 0 && test \"\$(visible CUDA_VISIBLE_DEVICES=0,,1)\" = 1 &&
   test \"\$(visible CUDA_VISIBLE_DEVICES=GPU-ab,3 -- --ids | tr '\n' ' ')\" = 'GPU-ab 3 '"
check "visible GPUs: nothing without nvidia-smi" test -z "$(PATH=/nonexistent /bin/bash scripts/visible_gpus.sh)"

# scripts/bench.sh (one GPU against PyTorch) with a fake trainer and a fake nvidia-smi of 4 GPUs,
# GPU 2 busy 90% at 1980 MHz and the others 10% at 1000: it samples the GPU the trainer runs on
# (the first CUDA_VISIBLE_DEVICES shows) and names it; its MFU averages the step lines only (40%),
# not the closing "step times" line.
cat > "$work/smi/nvidia-smi" << 'EOF'
#!/usr/bin/env bash
ids="0 1 2 3" query="" loop=0
for arg in "$@"; do
  case "$arg" in
    -L) for i in $ids; do echo "GPU $i: Fake H100 #$i"; done; exit 0 ;;
    --id=*) ids=${arg#--id=} ;; --query-gpu=*) query=${arg#--query-gpu=} ;; -lms) loop=1 ;;
  esac
done
sample() {
  for i in $ids; do
    if [ "$query" = name ]; then echo "Fake H100 #$i"; continue; fi
    [ "$i" = 2 ] && echo "$(date '+%Y/%m/%d %T.%3N'), 90, 1980, 500.00" || echo "$(date '+%Y/%m/%d %T.%3N'), 10, 1000, 100.00"
  done
}
sample
while [ "$loop" = 1 ]; do sleep 0.05; sample; done
EOF
cat > "$work/one_gpu_trainer" << 'EOF'
#!/usr/bin/env bash
for s in 1 2 3 4 5 6; do
  printf 'step %5d/6 | loss 9.000000 | lr 6.000e-04 | norm 1.0000 | 50.00 ms | 1000 tok/s | MFU 40.0%% | ETA 0.1 min\n' "$s"
  sleep 0.3  # ~18 samples of the fake nvidia-smi between step 3 and the end, a loaded machine too
done
echo "average step: 50.00 ms (forward 1, backward 1, update 1 ms on the GPU)"
echo "step times: 6 steps, 300.0 ms summed, 310.0 ms wall clock"
echo "GPU memory allocated: 3.000 GB"
EOF
chmod +x "$work/smi/nvidia-smi" "$work/one_gpu_trainer"
check "bench.sh on GPU 2 (CUDA_VISIBLE_DEVICES=2,0): runs, exit 0" eval \
  "CUDA_VISIBLE_DEVICES=2,0 PATH='$work/smi:$PATH' TRAINER='$work/one_gpu_trainer' scripts/bench.sh -b 4 -k softmax \
     -n 6 --no-torch > '$work/bench.out' 2>&1"
check "... GPU 2's samples and name, not all GPUs' or GPU 0's" eval \
  "grep -q 'GPU busy 90.0% at 1980 MHz, 500 W' '$work/bench.out' && grep -q 'Fake H100 #2' '$work/bench.out'"
check "... MFU 40.0%: the step lines only" grep -qE '^d12 +softmax +4 \| +50.00 +[0-9]+ +40.0%' "$work/bench.out"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
