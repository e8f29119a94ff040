#!/usr/bin/env bash
# CPU test of the builds for GPUs other than this machine's (issue 46):
#  1. gpu_arch.mk: the -gencode flags make uses (make print-GENCODE) for each GPU_ARCH and for the
#     local GPU under a fake nvidia-smi, and its one-line refusals (below 6.0; 6.x-7.2 with CUDA 13),
#     against a fake nvcc of each CUDA version;
#  2. the trainer compiled to an object with the Makefile's flags (make print-NVCCFLAGS, NCCL=0) by
#     this nvcc (CUDA 13): sm_75 with compute_75 PTX (GPU_ARCH="75 compute_75"), sm_100, sm_120;
#  3. sm_60 and sm_70 with CUDA 12.9: by nvcc 12 where there is one (CUDA12_NVCC, else the newest
#     /usr/local/cuda-12*), else by clang 19 or newer, its device code against CUDA 12.9's headers
#     and through CUDA 12.9's ptxas, from the package registry's wheels (kept in build/cuda12; they
#     have no nvcc); SKIPPED with the reason where neither can be had.
# The compiles run $(nproc) at a time. ARCH_SOURCE=FILE compiles FILE in place of train_gpt2_fp32.cu.
# About 2 minutes on 2 cores (the first run adds the wheels' download); prints its time.
set -u
cd "$(dirname "$0")/../.." || exit 1
start=$SECONDS
source dev/test/runs.sh
source=${ARCH_SOURCE:-train_gpt2_fp32.cu}
nvcc=${NVCC:-nvcc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# make from the repository, free of the variables of a make that runs this test (make test GPU_ARCH=..).
submake() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u GPU_ARCH make -s --no-print-directory "$@"; }

# ---- 1. gpu_arch.mk's decisions
mkdir -p "$work/bin"
# fake nvcc 12.9 and 13.0, answering --version only
for version in 12.9 13.0; do
  printf '#!/bin/sh\necho "Cuda compilation tools, release %s, V%s.0"\n' "$version" "$version" > "$work/bin/nvcc$version"
done
chmod +x "$work/bin"/nvcc*
# gencode NVIDIA_SMI NVCC_VERSION [MAKE ARGS...]: make's GENCODE (or its refusal, and then a non-zero
# exit) with a fake nvidia-smi that prints NVIDIA_SMI (none: fails as where there is no driver).
gencode() {
  local smi=$1 version=$2
  shift 2
  mkdir -p "$work/smi"
  if [ "$smi" = none ]; then
    printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."\nexit 9\n'
  else
    printf '#!/bin/sh\nprintf "%s\\n"\n' "$smi"
  fi > "$work/smi/nvidia-smi"
  chmod +x "$work/smi/nvidia-smi"
  PATH="$work/smi:$PATH" submake print-GENCODE NVCC="$work/bin/nvcc$version" "$@" 2>&1
}
sm() { echo "-gencode arch=compute_$1,code=sm_$1"; }
# is ARGS...: gencode's output must be EXPECTED and its exit status 0
is() {
  local expected=$1 out
  shift
  out=$(gencode "$@") && [ "$out" = "$expected" ] || { echo "      got: $out"; return 1; }
}
# refuses FRAGMENT ARGS...: gencode must exit non-zero with one line that says FRAGMENT
refuses() {
  local fragment=$1 out
  shift
  out=$(gencode "$@") && { echo "      got exit 0: $out"; return 1; }
  [ "$(wc -l <<< "$out")" = 1 ] && grep -qF -- "$fragment" <<< "$out" || { echo "      got: $out"; return 1; }
}
fat="$(sm 80) -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80"
check "no GPU (nvidia-smi fails): sm_80, sm_90a and compute_80 PTX" is "$fat" none 13.0
check "GPU_ARCH= (empty) on a GPU of 9.0: sm_80, sm_90a and compute_80 PTX" is "$fat" 9.0 13.0 GPU_ARCH=
check "local GPU 9.0 (two of them): sm_90a" is "-gencode arch=compute_90a,code=sm_90a" "9.0
9.0" 13.0
check "local GPU 8.6: sm_86" is "$(sm 86)" 8.6 13.0
check "local GPU 5.2: refused" refuses "the local GPU (compute capability 5.2) is too old: gpt2fp32 needs 6.0 or newer" 5.2 13.0
check "local GPU 7.0, CUDA 13: refused" refuses "the local GPU (compute capability 7.0) needs CUDA 12.x, and $work/bin/nvcc13.0 is CUDA 13.0" 7.0 13.0
check "local GPU 7.0, CUDA 12.9: sm_70" is "$(sm 70)" 7.0 12.9
for arch in 75 80 86 89 100 120; do
  check "GPU_ARCH=$arch: sm_$arch" is "$(sm $arch)" 9.0 13.0 GPU_ARCH=$arch
done
check "GPU_ARCH=90: sm_90a (on a GPU of 8.6)" is "-gencode arch=compute_90a,code=sm_90a" 8.6 13.0 GPU_ARCH=90
for arch in 60 61 70 72; do
  check "GPU_ARCH=$arch, CUDA 13: refused" \
    refuses "GPU_ARCH=$arch (compute capability ${arch:0:1}.${arch:1}) needs CUDA 12.x, and $work/bin/nvcc13.0 is CUDA 13.0 (CUDA 13 dropped 6.x-7.2): make NVCC=/path/to/cuda-12/bin/nvcc GPU_ARCH=$arch" \
    none 13.0 GPU_ARCH=$arch
done
check "GPU_ARCH=60 and 70, CUDA 12.9: sm_60, sm_70" is "$(sm 60) $(sm 70)" none 12.9 GPU_ARCH="60 70"
for arch in 50 52 35; do
  check "GPU_ARCH=$arch: refused" \
    refuses "GPU_ARCH=$arch (compute capability ${arch:0:1}.${arch:1}) is too old: gpt2fp32 needs 6.0 or newer" none 13.0 GPU_ARCH=$arch
done
check "GPU_ARCH=compute_75: compute_75 PTX only" is "-gencode arch=compute_75,code=compute_75" 9.0 13.0 GPU_ARCH=compute_75
check "GPU_ARCH=compute_90: plain compute_90 PTX (not 90a)" is "-gencode arch=compute_90,code=compute_90" none 13.0 GPU_ARCH=compute_90
check "GPU_ARCH=compute_70, CUDA 13: refused" refuses "GPU_ARCH=compute_70 (compute capability 7.0) needs CUDA 12.x" none 13.0 GPU_ARCH=compute_70
check "GPU_ARCH=\"75 compute_75\" and 8.6: sm_75 with its PTX; sm_86" eval \
  "is '$(sm 75) -gencode arch=compute_75,code=compute_75' none 13.0 GPU_ARCH='75 compute_75' &&
   is '$(sm 86)' none 13.0 GPU_ARCH=8.6"
check "make clean with a refused GPU_ARCH: runs" eval "submake -n clean GPU_ARCH=52 > /dev/null"
# ptx_build NN: make -n of the Makefile's build/compute_NN trainer (the other paths' PTX builds), CUDA 13
ptx_build() { PATH="$work/smi:$PATH" submake -n -B "build/compute_$1/train_gpt2_fp32" NVCC="$work/bin/nvcc13.0" 2>&1; }
check "build/compute_75/train_gpt2_fp32: compute_75 PTX" eval "ptx_build 75 | grep -qF -- '-gencode arch=compute_75,code=compute_75'"
check "build/compute_70/train_gpt2_fp32, CUDA 13: refused as GPU_ARCH=compute_70 is" eval \
  "! ptx_build 70 > '$work/ptx70.out' && grep -qF 'GPU_ARCH=compute_70 (compute capability 7.0) needs CUDA 12.x' '$work/ptx70.out'"

# ---- 2. and 3. the trainer, compiled to an object
# compile NAME COMMAND...: runs COMMAND in the background, $(nproc) at a time, into $work/NAME.log
# and $work/NAME.status (exit status and seconds); finish NAME DESCRIPTION then checks it, with its
# time and CPU time (other work on the machine slows the first).
slots=$(nproc)
compile() {
  local name=$1
  shift
  while [ "$(jobs -rp | wc -l)" -ge "$slots" ]; do wait -n; done
  ( t=$SECONDS; "$@" > "$work/$name.log" 2>&1; echo "$? $((SECONDS - t))" > "$work/$name.status"; times > "$work/$name.times" ) &
}
finish() {
  local status seconds cpu
  read -r status seconds < "$work/$1.status"
  # the CPU time of its processes (the second line of bash's times: children's user and system)
  cpu=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); n += p[1] * 60 + p[2] } printf "%.0f", n }' \
        "$work/$1.times")
  check "$2 ($seconds s, $cpu s CPU)" test "$status" = 0
  if [ "$status" != 0 ]; then
    # the distinct errors, with how often each comes, else the log's end
    grep -qE 'error|fatal' "$work/$1.log" || { tail -n 5 "$work/$1.log"; return; }
    grep -E 'error|fatal' "$work/$1.log" | sed -E 's/^ptxas [^,]*, line [0-9]+; //' | sort | uniq -c | sort -rn | head -n 8
  fi
}
# nvcc_compile NVCC GPU_ARCH OBJECT: the trainer as the Makefile compiles it, to an object (the
# source's folder first on the include path, for the llmc/ beside an ARCH_SOURCE)
nvcc_compile() {
  local flags
  flags=$(submake print-NVCCFLAGS NVCC="$1" GPU_ARCH="$2" NCCL=0) || { echo "$flags"; return 1; }
  eval "\"\$1\" -I\"\$(dirname \"\$source\")\" $flags -c \"\$source\" -o \"\$3\""
}
[ -f "$source" ] || { echo "FAIL  no $source"; exit 1; }
compile sm_100 nvcc_compile "$nvcc" 100 "$work/sm_100.o"
compile sm_75 nvcc_compile "$nvcc" "75 compute_75" "$work/sm_75.o"
compile sm_120 nvcc_compile "$nvcc" 120 "$work/sm_120.o"

# CUDA 12.9 for sm_60 and sm_70: an nvcc 12, else clang and the wheels' CUDA 12.9 (headers, ptxas).
cuda12_nvcc=${CUDA12_NVCC:-$(ls -d /usr/local/cuda-12*/bin/nvcc 2> /dev/null | sort -V | tail -n 1)}
cuda12=build/cuda12
cuda12_why=
clang=
# cuda12_wheels: CUDA 12.9's nvcc wheel (ptxas, libdevice, crt headers), runtime, CCCL and cuBLAS's
# headers in build/cuda12/wheels (cuBLAS's 600 MB wheel downloaded for its headers, then removed, by
# dev/test/wheel_files.sh), laid out as a CUDA installation in build/cuda12/root; non-zero with the
# reason in cuda12_why.
cuda12_wheels() {
  local wheels=$cuda12/wheels/nvidia
  if [ ! -f "$wheels/cublas/include/cublasLt.h" ]; then
    rm -rf "$cuda12" && mkdir -p "$cuda12"
    if ! python3 -m pip install -q --disable-pip-version-check --no-deps --target "$cuda12/wheels" \
           nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27 \
           > "$cuda12/install.log" 2>&1 ||
       ! dev/test/wheel_files.sh nvidia-cublas-cu12==12.9.1.4 nvidia/cublas/include/ "$cuda12/wheels" \
           >> "$cuda12/install.log" 2>&1; then
      cuda12_why="pip failed: $(tail -n 1 "$cuda12/install.log")"
      return 1
    fi
  fi
  rm -rf "$cuda12/root" && mkdir -p "$cuda12/root/include" "$cuda12/stub"
  ln -s "$PWD/$wheels/cuda_nvcc/bin" "$PWD/$wheels/cuda_nvcc/nvvm" "$cuda12/root/"
  ln -s "$PWD/$wheels"/{cuda_runtime,cuda_nvcc,cublas,cuda_cccl}/include/* "$cuda12/root/include/" 2> /dev/null
  rm -f "$cuda12/root/include"/__*
  # clang's CUDA wrapper includes cuRAND's kernel header (unused here), and it leaves out CUDA's
  # sm_32_intrinsics.hpp, defining __ldg but not the trainer's __ldcg (clang 19).
  : > "$cuda12/stub/curand_mtgp32_kernel.h"
  cat > "$cuda12/stub/clang_intrinsics.h" << 'EOF'
#pragma once
#ifndef __CLANG_CUDA_ADDITIONAL_INTRINSICS_H__
__device__ inline float __ldcg(const float* p) { float r; asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(r) : "l"(p)); return r; }
__device__ inline float4 __ldcg(const float4* p) {
    float4 r;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
    return r;
}
#endif
EOF
  "$cuda12/root/bin/ptxas" --version | grep -q 'release 12\.9' || { cuda12_why="the wheels' ptxas is not 12.9"; return 1; }
}
# clang_compile ARCH OBJECT: the trainer's device code for sm_ARCH by clang (host code type-checked
# too), CUDA 12.9's headers only (not the system's CUDA in /usr/local/include), the Makefile's
# flags less nvcc's own (--default-stream per-thread is what nvcc defines for it).
clang_compile() {
  local flags gcc_version system=()
  flags=$(submake print-NVCCFLAGS NVCC="$nvcc" GPU_ARCH=80 NCCL=0) || { echo "$flags"; return 1; }
  flags=$(sed -E 's/--default-stream per-thread/-DCUDA_API_PER_THREAD_DEFAULT_STREAM=1/; s/-gencode [^ ]+//g;
                  s/-Xcompiler [^ ]+//g' <<< "$flags")
  gcc_version=$(gcc -dumpversion)
  for dir in "$cuda12/stub" "/usr/include/c++/$gcc_version" "/usr/include/$(gcc -dumpmachine)/c++/$gcc_version" \
             "/usr/include/c++/$gcc_version/backward" "/usr/include/$(gcc -dumpmachine)" /usr/include; do
    system+=(-idirafter "$dir")
  done
  eval "\"\$clang\" -x cuda --cuda-path=\"\$cuda12/root\" -nostdlibinc \"\${system[@]}\" -include clang_intrinsics.h \
    --cuda-gpu-arch=sm_\$1 --cuda-device-only -Wno-unknown-cuda-version -I\"\$(dirname \"\$source\")\" $flags -c \"\$source\" -o \"\$2\""
}
cuda12_with=
if [ -n "$cuda12_nvcc" ] && "$cuda12_nvcc" --version 2> /dev/null | grep -q 'release 12\.'; then
  cuda12_with="nvcc $("$cuda12_nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
  compile sm_60 nvcc_compile "$cuda12_nvcc" 60 "$work/sm_60.o"
  compile sm_70 nvcc_compile "$cuda12_nvcc" 70 "$work/sm_70.o"
else
  for candidate in clang++-21 clang++-20 clang++-19 clang++; do
    major=$("$candidate" -dumpversion 2> /dev/null | cut -d. -f1)
    [ -n "$major" ] && [ "$major" -ge 19 ] && { clang=$candidate; break; }
  done
  if [ -z "$clang" ]; then
    cuda12_why="no nvcc 12 (CUDA12_NVCC) and no clang 19 or newer (apt-get install clang-19)"
  elif cuda12_wheels; then
    cuda12_with="$clang $("$clang" -dumpversion) and the wheels' CUDA 12.9 ptxas"
    compile sm_60 clang_compile 60 "$work/sm_60.o"
    compile sm_70 clang_compile 70 "$work/sm_70.o"
  fi
fi
wait

finish sm_75 "$source for sm_75 with compute_75 PTX, $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/nvcc \1/p')"
cuobjdump=$(dirname "$(command -v "$nvcc")")/cuobjdump
if [ -x "$cuobjdump" ]; then
  check "... the object holds sm_75 code and compute_75 PTX" eval \
    "'$cuobjdump' --list-elf '$work/sm_75.o' | grep -q 'sm_75' && '$cuobjdump' --list-ptx '$work/sm_75.o' | grep -q 'sm_75'"
else
  echo "SKIPPED (no cuobjdump beside $nvcc): the sm_75 object's code and PTX"
fi
finish sm_100 "$source for sm_100"
finish sm_120 "$source for sm_120"
if [ -n "$cuda12_with" ]; then
  finish sm_60 "$source for sm_60, $cuda12_with"
  finish sm_70 "$source for sm_70, $cuda12_with"
else
  echo "SKIPPED ($cuda12_why): $source for sm_60 and sm_70 with CUDA 12"
fi

echo "$passed passed, $failed failed"
echo "(test_arch_builds: $((SECONDS - start)) s)"
[ "$failed" -eq 0 ]
