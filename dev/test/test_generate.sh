#!/usr/bin/env bash
# GPU test of ./train_gpt2_fp32's generation and evaluation against the PyTorch reference
# (train_gpt2.py --generate / --eval: true FP32, on the CPU), on random-init models with GPT-2's
# whole vocabulary (L=2, NH=4, C=128, maxT=128, softmax and ReLU attention) and on the committed
# fixture models (V=1000, maxT=64):
#  - greedy (--temperature 0 -f 0, 40 tokens): the generated ids equal the reference's, for one
#    completion and for each of 3 in a batch;
#  - sampling (--temperature 0.8 --top-k 40, 4 completions): the same seed gives the same ids,
#    another seed different ones;
#  - evaluation (-x 0 -f 0) of dev/test/fixtures/eval_tiny.jsonl at -t 128 (whole rows), -t 40
#    (contexts cut) and -t 16 (contexts cut, examples with long endings skipped): the same
#    examples, labels, choices and accuracy, every loss within 1e-5 relative;
#  - a malformed line, a label of 7, an empty file: a non-zero exit and a one-line error, naming
#    the line where there is one.
set -u
cd "$(dirname "$0")/../.."
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIPPED (no GPU): generation and evaluation against PyTorch"
  exit 0
fi
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch, tiktoken" 2> /dev/null; then
  echo "SKIPPED (no PyTorch or tiktoken): generation and evaluation against PyTorch"
  exit 0
fi
eval_file=dev/test/fixtures/eval_tiny.jsonl
for needed in ./train_gpt2_fp32 "$eval_file"; do
  [ -f "$needed" ] || { echo "error: $needed is missing (make train_gpt2_fp32)"; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source dev/test/runs.sh
reference() { "$PYTHON" train_gpt2.py --device cpu "$@"; }
# 10 tokens from all over the vocabulary: 464 2068 7586 21831 18045 625 262 16931 3290 290.
prompt="The quick brown fox jumps over the lazy dog and"
# 10 tokens below 1000, for the fixtures: 464 582 531 326 339 561 307 736 287 262.
small_prompt="The man said that he would be back in the"

for kind in softmax relu; do
  reference --layers 2 --heads 4 --channels 128 --vocab 50257 --max-seq-len 128 --seed 0 --attn "$kind" \
    --write-model "$work/$kind.bin" > "$work/write.log" 2>&1 || { cat "$work/write.log"; exit 1; }
done

# The completions of a log (or stdin), each "ids K: ..." line spelled as the reference's "ids: ...".
completions() { grep -E '^ids [0-9]+:' "$@" | sed -E 's/^ids [0-9]+:/ids:/'; }
same_completions() {  # same_completions LOG COUNT EXPECTED: COUNT completions, each EXPECTED
  local got
  got=$(completions "$1")
  [ -n "$3" ] && [ "$(wc -l <<< "$got")" -eq "$2" ] && [ -z "$(grep -vxF -- "$3" <<< "$got")" ] && return 0
  echo "      expected $3"
  echo "      got      $(grep -vxF -m 1 -- "$3" <<< "$got") ($(wc -l <<< "$got") lines) $(grep -m 1 '^error' "$1")"
  return 1
}
greedy() {  # greedy NAME MODEL PROMPT
  local name=$1 model=$2 text=$3 expected
  reference --init-from "$model" --generate 40 --prompt "$text" > "$work/ref.log" 2>&1 || tail -n 1 "$work/ref.log"
  expected=$(grep '^ids:' "$work/ref.log")
  for m in 1 3; do
    ./train_gpt2_fp32 -e "$model" --prompt "$text" --temperature 0 --gen 40 --show-ids -f 0 --batch-samples "$m" \
      > "$work/greedy.log" 2>&1
    check "greedy $name, $m completion(s): the reference's ids" same_completions "$work/greedy.log" "$m" "$expected"
  done
}
for kind in softmax relu; do
  greedy "$kind V=50257" "$work/$kind.bin" "$prompt"
  greedy "fixture $kind V=1000" "dev/test/fixtures/gpt2_small_${kind}_model.bin" "$small_prompt"
done

sample() {  # sample SEED: the ids of 4 sampled completions
  ./train_gpt2_fp32 -e "$work/softmax.bin" --prompt "$prompt" --temperature 0.8 --top-k 40 --gen 40 --show-ids \
    --batch-samples 4 --seed "$1" 2>&1 | completions
}
sample 7 > "$work/seed7a"
sample 7 > "$work/seed7b"
sample 8 > "$work/seed8"
differ() { ! cmp -s "$1" "$2"; }
check "sampling: 4 completions" test "$(wc -l < "$work/seed7a")" -eq 4
check "sampling, the same seed: identical completions" cmp -s "$work/seed7a" "$work/seed7b"
check "sampling, another seed: different completions" differ "$work/seed7a" "$work/seed8"

# compare_reports OURS REFERENCE: the same header and examples (in file order), labels and
# choices; every loss within 1e-5 relative. Prints the largest relative error.
compare_reports() {
  "$PYTHON" - "$1" "$2" << 'EOF'
import sys

def read(path):
    lines = open(path).read().splitlines()
    return lines[:1], [line.split() for line in lines[1:]]

(ours_header, ours), (ref_header, ref) = read(sys.argv[1]), read(sys.argv[2])
problems = [] if ours_header == ref_header else [f"header {ours_header} against {ref_header}"]
if not ref:
    problems.append("the reference evaluated no example")
if [row[:3] for row in ours] != [row[:3] for row in ref]:
    problems.append(f"line, label, choice columns differ: {[r[:3] for r in ours][:3]}... against {[r[:3] for r in ref][:3]}...")
errors = [abs(float(a) - float(b)) / abs(float(b)) for o, r in zip(ours, ref) for a, b in zip(o[3:], r[3:])]
if any(len(row) != 7 for row in ours + ref) or len(errors) != 4 * len(ref) or max(errors, default=0) > 1e-5:
    problems.append("losses differ by more than 1e-5 relative (or are missing)")
print(f"      {len(ref)} examples; max relative loss error {max(errors, default=0):.2e}")
for problem in problems:
    print(f"      {problem}")
sys.exit(1 if problems else 0)
EOF
}
# The "correct/evaluated" of a log's accuracy line.
accuracy() { grep -oE '^eval: accuracy [0-9.]+ \([0-9]+/[0-9]+\)' "$1" | grep -oE '[0-9]+/[0-9]+'; }
same_accuracy() { [ -n "$(accuracy "$2")" ] && [ "$(accuracy "$1")" = "$(accuracy "$2")" ]; }
for kind in softmax relu; do
  for T in 128 40 16; do
    ./train_gpt2_fp32 -e "$work/$kind.bin" --eval "$eval_file" -x 0 -t "$T" -b 8 -f 0 --eval-report "$work/ours.txt" \
      > "$work/ours.log" 2>&1
    reference --init-from "$work/$kind.bin" --eval "$eval_file" --seq-len "$T" --eval-report "$work/ref_$T.txt" \
      > "$work/ref.log" 2>&1
    check "eval $kind -t $T: the reference's examples, labels, choices and losses" \
      compare_reports "$work/ours.txt" "$work/ref_$T.txt"
    check "eval $kind -t $T: the reference's accuracy ($(accuracy "$work/ref.log"))" \
      same_accuracy "$work/ours.log" "$work/ref.log"
  done
  check "eval $kind: -t 40 cuts contexts (its losses differ from -t 128)" differ "$work/ref_40.txt" "$work/ref_128.txt"
  check "eval $kind: -t 16 skips examples" test "$(wc -l < "$work/ref_16.txt")" -lt "$(wc -l < "$work/ref_128.txt")"
done

# fails_once PATTERN COMMAND...: the command exits non-zero with one error line, matching PATTERN (ERE)
fails_once() {
  local pattern=$1 out
  shift
  out=$("$@" 2>&1) && return 1
  [ "$(grep -c '^error' <<< "$out")" -eq 1 ] && grep '^error' <<< "$out" | grep -qE -- "$pattern" \
    || { echo "      got: $(tail -n 2 <<< "$out")"; return 1; }
}
names_line() { echo "(line $1([^0-9]|\$)|:$1(:| |\$))"; }  # "line N" or "FILE:N:"
evaluate() { ./train_gpt2_fp32 -e "$work/softmax.bin" --eval "$1" -x 0 -t 128 -b 8 -f 0; }
good='{"ctx": "A man is sitting on a roof. He", "endings": ["climbs down.", "reads.", "sleeps.", "waves."], "label": 0}'
printf '%s\n\n%s\n' "$good" '{"ctx": "A man", "endings": [' > "$work/malformed.jsonl"
printf '%s\n%s\n' "$good" '{"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 7}' > "$work/label7.jsonl"
: > "$work/empty.jsonl"
check "eval of a malformed line 3 (after a blank line): an error naming line 3" \
  fails_once "$(names_line 3)" evaluate "$work/malformed.jsonl"
check "eval of a label 7 on line 2: an error naming line 2" fails_once "$(names_line 2)" evaluate "$work/label7.jsonl"
check "eval of an empty file: an error" fails_once "" evaluate "$work/empty.jsonl"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
