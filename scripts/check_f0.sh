#!/usr/bin/env bash
# Split TF32 (-f 0) on a GPU, in parts that each fit one 10-minute device call; logs to $OUT (or
# /tmp) and a short summary last.
#   scripts/check_f0.sh tests   build; test_gpt2_fp32 -f 0, 1, 2 on the fixtures, --decode; the lab's
#                               product checks (matmul_forward 3 4 8 9, matmul_backward 2 3 8)
#   scripts/check_f0.sh d12     bench: d12 B=8 and 16, both attention kinds, -f 0 with PyTorch strict
#                               FP32, then -f 1 (TF32, for no regression) without PyTorch
#   scripts/check_f0.sh large   bench: d24 B=16 and d48 B=8, softmax, -f 0 with PyTorch strict FP32
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
fixtures=dev/test/fixtures
case "${1:-}" in
  tests)
    make -j4 train_gpt2_fp32 test_gpt2_fp32 > "$out/build.log" 2>&1
    make -C dev/cuda -j2 matmul_forward matmul_backward >> "$out/build.log" 2>&1
    for f in 0 1 2; do
      for kind in softmax relu; do
        ./test_gpt2_fp32 -f $f -m $fixtures/gpt2_small_${kind}_model.bin -s $fixtures/gpt2_small_${kind}_state.bin \
          > "$out/test_f${f}_$kind.log" 2>&1 && echo "test -f $f $kind: ok" || echo "test -f $f $kind: FAIL"
      done
    done
    ./test_gpt2_fp32 -f 0 -m $fixtures/hf_tiny -s $fixtures/hf_tiny_classic_state.bin > "$out/test_hf_tiny.log" 2>&1 \
      && echo "test -f 0 hf_tiny: ok" || echo "test -f 0 hf_tiny: FAIL"
    ./test_gpt2_fp32 --decode > "$out/test_decode.log" 2>&1 && echo "test --decode: ok" || echo "test --decode: FAIL"
    (cd dev/cuda && ./matmul_forward 3 4 8 9 && ./matmul_backward 2 3 8) > "$out/lab.log" 2>&1 || echo "lab: FAIL"
    grep -E "error against|\| matmul_(forward|backward) " "$out/lab.log" | grep -v "part:" | cut -c1-150
    ;;
  d12)
    scripts/bench.sh -e d12 -b "8 16" -k "softmax relu" -n 20 -f 0 2>&1 | tee "$out/bench_d12_f0.log" | tail -n 7
    scripts/bench.sh -e d12 -b "8 16" -k "softmax relu" -n 20 -f 1 --no-torch 2>&1 | tee "$out/bench_d12_f1.log" \
      | tail -n 7
    ;;
  large)
    scripts/bench.sh -e d24 -b 16 -k softmax -n 12 -f 0 2>&1 | tee "$out/bench_d24_f0.log" | tail -n 3
    scripts/bench.sh -e d48 -b 8 -k softmax -n 8 -f 0 2>&1 | tee "$out/bench_d48_f0.log" | tail -n 3
    ;;
  *) echo "usage: scripts/check_f0.sh tests|d12|large" >&2; exit 1 ;;
esac
