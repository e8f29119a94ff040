#!/usr/bin/env bash
# CPU test: llmc/comm.cuh, the trainer's only NCCL code, compiles against the oldest NCCL the README
# names (2.18), whose header comes from the package registry's nvidia-nccl-cu12 wheel (kept in
# build/nccl-2.18.3 by dev/test/wheel_files.sh); SKIPPED with the reason where it cannot be
# fetched. Prints its time.
set -u
cd "$(dirname "$0")/../.."
start=$SECONDS
version=2.18.3
dir=build/nccl-$version
cuda_include=$(dirname "$(dirname "$(command -v "${NVCC:-nvcc}")")")/include
include=$dir/nvidia/nccl/include
if [ ! -f "$include/nccl.h" ] &&
   ! why=$(dev/test/wheel_files.sh "nvidia-nccl-cu12==$version" nvidia/nccl/include/nccl.h "$dir" 2>&1); then
  echo "SKIPPED ($why): NCCL $version compatibility"
  exit 0
fi
grep -q "NCCL_MINOR *18" "$include/nccl.h" || { echo "FAIL  $include/nccl.h is not NCCL 2.18"; exit 1; }
printf '#include "llmc/comm.cuh"\nint main() { return comm_available() ? 0 : 1; }\n' > "$dir/compat.cpp"
if g++ -std=c++17 -fsyntax-only -Wall -Wextra -DUSE_NCCL -I"$include" -I"$cuda_include" -I. "$dir/compat.cpp" \
     > "$dir/compile.log" 2>&1; then
  echo "ok    llmc/comm.cuh compiles against NCCL $version's nccl.h"
  status=0
else
  echo "FAIL  llmc/comm.cuh against NCCL $version's nccl.h:"
  head -n 20 "$dir/compile.log"
  status=1
fi
echo "(test_nccl_compat: $((SECONDS - start)) s)"
exit $status
