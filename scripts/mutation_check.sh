#!/usr/bin/env bash
# Breaks the trainer on purpose, one mutation per build, and checks that test_gpt2_fp32 then
# FAILS on the committed fixtures in full FP32 (it must, or the test could not catch the bug).
# Needs a GPU. Usage: scripts/mutation_check.sh [GPU_ARCH]
set -u
cd "$(dirname "$0")/.."
arch=${1:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.')}
fixtures=dev/test/fixtures

# name | fixtures it must fail on (KIND+c32: with -c 32, split TF32's chunks of 32) | sed expression
# applied to train_gpt2_fp32.cu
mutations=(
  "relu forward without 1/(t+1)|relu|s#row_scale\[i\] = 1.0f / (warp_query0 + transposed_row(i, q) + 1);#row_scale[i] = 1.0f;#"
  "relu backward without 1/(t+1)|relu|s#dp = s > 0.0f ? dp \* stat_a : 0.0f;#dp = s > 0.0f ? dp : 0.0f;#"
  "attprojb gradient added into fcprojb|softmax relu|s#bias_backward(g.attprojb + l \* C,#bias_backward(g.fcprojb + l * C,#"
  "bias gradient sums one row chunk|softmax|s#for (unsigned int y = 0; y < gridDim.y; y++)#for (unsigned int y = 0; y < 1; y++)#"
  "fcproj weight gradient from the GELU's input, not its output|softmax|s#tiles\[1\]\[ty + 8 \* k\]\[tx\] = gelu(x\[k\]);#tiles[1][ty + 8 * k][tx] = x[k];#"
  "wte gradient of a frequent token drops its last bucket|softmax|s#for (int b = first; b < last; b++)#for (int b = first; b < last - 1; b++)#"
  "GELU derivative without the 3 in 3*0.044715*x^2|softmax|s#(1.0f + 3.0f \* 0.044715f \* x \* x)#(1.0f + 0.044715f * x * x)#"
  "GELU derivative without its sech^2 term|softmax|s#0.5f \* (1.0f + th) + 0.5f \* x \* sech2#0.5f * (1.0f + th) + 0.0f * x * sech2#"
  "softmax backward without delta|softmax|s#dp = p \* (dp - stat_b);#dp = p * dp;#"
  "weight decay on every tensor|softmax|s#(table.decay_mask >> tensor) \& 1u ? weight_decay : 0.0f#weight_decay#"
  "layernorm backward without mean_g_xhat|softmax|s#- xhat\[j\] \* mean_g_xhat#- xhat[j] * 0.0f#"
  "layernorm dweight/dbias sum drops all stripes but one|softmax|s#for (int s = 1; s < stripes; s++)#for (int s = 1; s < 1; s++)#"
  "weight gradients added to what the memory held|softmax|s#N, inp_transposed, false, 1.0f, 0.0f,#N, inp_transposed, false, 1.0f, 1.0f,#"
  "dlnf without its last vocabulary chunk|softmax|s#partials + n, n, splits - 1, n)#partials + n, n, splits - 2, n)#"
  "transposing kernels store only each step's first 32-row tile|softmax|s#t < ROWS / 32; t++#t < 1; t++#"
  "classifier running sum not rescaled to a new maximum|softmax|s#stats\[k\].sum \*= exp2f((stats\[k\].max - chunk_max) \* LOG2E);#stats[k].sum *= 1.0f;#"
  "split TF32 without the low parts|softmax|s#l\[i\] = tf32_round(xs\[i\] - h\[i\]);#l[i] = 0.0f;#"
  "split TF32 hi hi chunks one by one without the last|softmax|s#for (int c = 0; c < full_chunks + (last > 0); c++)#for (int c = 0; c < full_chunks + (last > 0) - 1; c++)#"
  "split TF32 partial sums without the last chunk|softmax+c32|s#sum_arrays(out, out, partials, n, full_chunks + (last > 0), n, stream)#sum_arrays(out, out, partials, n, full_chunks + (last > 0) - 1, n, stream)#"
)

caught=0
missed=0
for entry in "${mutations[@]}"; do
  IFS='|' read -r name kinds expression <<< "$entry"
  dir=build/mutants/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')
  rm -rf "$dir" && mkdir -p "$dir"  # no test binary of an earlier run left to be run
  sed "$expression" train_gpt2_fp32.cu > "$dir/train_gpt2_fp32.cu"
  cp test_gpt2_fp32.cu "$dir/"
  if cmp -s train_gpt2_fp32.cu "$dir/train_gpt2_fp32.cu"; then
    echo "NOT APPLIED  $name (the pattern no longer matches the source)"
    missed=$((missed + 1))
    rm -rf "$dir"
    continue
  fi
  ( nvcc -O3 -std=c++17 --default-stream per-thread -gencode arch=compute_$arch,code=sm_$arch -I. "$dir/test_gpt2_fp32.cu" -o "$dir/test" \
      -lcublasLt -lcublas > "$dir/build.log" 2>&1 ) &
done
wait

for entry in "${mutations[@]}"; do
  IFS='|' read -r name kinds expression <<< "$entry"
  dir=build/mutants/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')
  [ -d "$dir" ] || continue  # not applied, counted above
  if [ ! -x "$dir/test" ]; then
    echo "NOT BUILT    $name: $(grep -m1 'error' "$dir/build.log" 2>/dev/null | cut -c1-100)"
    missed=$((missed + 1))
    continue
  fi
  for entry_kind in $kinds; do
    kind=${entry_kind%+c32}
    chunk=(); [ "$kind" = "$entry_kind" ] || chunk=(-c 32)
    if "$dir/test" -f 0 "${chunk[@]}" -m $fixtures/gpt2_small_${kind}_model.bin -s $fixtures/gpt2_small_${kind}_state.bin > "$dir/$kind.log" 2>&1; then
      echo "MISSED       $name ($kind): the test passed"
      missed=$((missed + 1))
    elif ! grep -q 'FAIL$' "$dir/$kind.log"; then  # a crash is not a catch
      echo "MISSED       $name ($kind): no check failed, the test stopped: $(grep -m1 -i 'error' "$dir/$kind.log" | cut -c1-100)"
      missed=$((missed + 1))
    else
      echo "caught       $name ($kind): $(grep -c 'FAIL$' "$dir/$kind.log") checks failed, first: $(grep -m1 'FAIL$' "$dir/$kind.log" | cut -c1-22)"
      caught=$((caught + 1))
    fi
  done
done
echo "mutations: $caught caught, $missed missed"
[ "$missed" -eq 0 ]
