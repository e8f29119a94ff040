#!/usr/bin/env bash
# Split TF32 (-f 0) on a GPU, in parts that each fit one 10-minute device call on a bare machine
# (each builds what it needs); logs to $OUT (or /tmp), a short summary last.
#   scripts/check_f0.sh tests   test_gpt2_fp32 -f 0, 1, 2 on the fixtures (make test's lines, -c 32 too),
#                               --decode, make test-hf (SKIPPED without transformers); d12 B=4 for
#                               8 steps with -f 0 and -f 2: their losses side by side (the LM head's
#                               batched, chunked products at full size; they agree to ~1e-5)
#   scripts/check_f0.sh lab     matmul_forward 3 4 8 9 10 11, matmul_backward 2 3 8 9 10 11: time,
#                               TFLOP/s, max and mean error against FP64 (TF32, plain FP32, split)
#   scripts/check_f0.sh d12     bench: d12 B=8 and 16, both attention kinds, -f 0 with PyTorch
#                               strict FP32 in the same call, then -f 1 (no regression) alone
#   scripts/check_f0.sh d24     bench: d24 B=16 softmax, -f 0 with PyTorch strict FP32
#   scripts/check_f0.sh d48     bench: d48 B=8 softmax, -f 0 with PyTorch strict FP32
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
fixtures=dev/test/fixtures
case "${1:-}" in
  tests)
    make -j4 train_gpt2_fp32 test_gpt2_fp32 hf_convert > "$out/build.log" 2>&1 || { tail -n 20 "$out/build.log"; exit 1; }
    make data > /dev/null 2>&1
    for f in 0 1 2; do
      for kind in softmax relu; do
        ./test_gpt2_fp32 -f $f -m $fixtures/gpt2_small_${kind}_model.bin -s $fixtures/gpt2_small_${kind}_state.bin \
          > "$out/test_f${f}_$kind.log" 2>&1 && echo "test -f $f $kind: ok" || echo "test -f $f $kind: FAIL"
      done
    done
    ./test_gpt2_fp32 -f 0 -c 32 -m $fixtures/gpt2_small_softmax_model.bin -s $fixtures/gpt2_small_softmax_state.bin \
      > "$out/test_f0_c32.log" 2>&1 && echo "test -f 0 -c 32 softmax: ok" || echo "test -f 0 -c 32 softmax: FAIL"
    ./test_gpt2_fp32 -f 0 -m $fixtures/hf_tiny -s $fixtures/hf_tiny_classic_state.bin > "$out/test_hf_tiny.log" 2>&1 \
      && echo "test -f 0 hf_tiny: ok" || echo "test -f 0 hf_tiny: FAIL"
    ./test_gpt2_fp32 --decode > "$out/test_decode.log" 2>&1 && echo "test --decode: ok" || echo "test --decode: FAIL"
    for f in 0 2; do
      ./train_gpt2_fp32 -e d12 -b 4 -t 1024 -x 8 -v 0 -s 0 -f $f -i dev/data/tinyshakespeare/tiny_shakespeare_train.bin \
        > "$out/train_d12_f$f.log" 2>&1 || echo "train d12 -f $f: FAIL"
    done
    paste <(grep '^step' "$out/train_d12_f0.log" | awk -F'|' '{print $1 $2}') \
      <(grep '^step' "$out/train_d12_f2.log" | awk -F'|' '{print $2}')
    make test-hf > "$out/test_hf.log" 2>&1 && echo "make test-hf: ok ($(grep -c SKIPPED "$out/test_hf.log") SKIPPED lines)" \
      || echo "make test-hf: FAIL"
    ;;
  lab)
    make -C dev/cuda -j2 matmul_forward matmul_backward > "$out/build.log" 2>&1 || { tail -n 20 "$out/build.log"; exit 1; }
    (cd dev/cuda && ./matmul_forward 3 4 8 9 10 11 && ./matmul_backward 2 3 8 9 10 11) > "$out/lab.log" 2>&1 \
      || echo "lab: FAIL (see lab.log)"
    grep -E "error against|\| matmul_(forward|backward) " "$out/lab.log" | grep -v "part:\|GEMM \|transpose_" \
      | sed 's/  */ /g' | cut -c1-150
    ;;
  d12)
    scripts/bench.sh -e d12 -b "8 16" -k "softmax relu" -n 20 -f 0 > "$out/bench_d12_f0.log" 2>&1
    scripts/bench.sh -e d12 -b "8 16" -k "softmax relu" -n 20 -f 1 --no-torch > "$out/bench_d12_f1.log" 2>&1
    grep -A 6 "^GPT-2 from scratch" "$out/bench_d12_f0.log" "$out/bench_d12_f1.log"
    ;;
  d24 | d48)
    B=$([ "$1" = d24 ] && echo 16 || echo 8); steps=$([ "$1" = d24 ] && echo 12 || echo 8)
    scripts/bench.sh -e "$1" -b $B -k softmax -n $steps -f 0 > "$out/bench_$1_f0.log" 2>&1
    grep -A 2 "^GPT-2 from scratch" "$out/bench_$1_f0.log" || tail -n 5 "$out/bench_$1_f0.log"
    ;;
  *) echo "usage: scripts/check_f0.sh tests|lab|d12|d24|d48" >&2; exit 1 ;;
esac
