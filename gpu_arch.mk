# GPU architecture for nvcc, shared by the top Makefile and dev/cuda/Makefile: the local GPU's
# compute capability if nvidia-smi finds one, otherwise a fat binary for sm_80 and sm_90a with
# compute_80 PTX, which the driver compiles at start on GPUs newer than both (they take the
# mma.sync path: sm_90a's code runs on Hopper only).
# Hopper (9.0) builds for sm_90a, the target with the warpgroup MMA (wgmma) instructions.
# Override with `make GPU_ARCH=90`.
GPU_ARCH ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
ifeq ($(strip $(GPU_ARCH)),)
  GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
             -gencode arch=compute_80,code=compute_80
else ifeq ($(strip $(GPU_ARCH)),90)
  GENCODE := -gencode arch=compute_90a,code=sm_90a
else
  GENCODE := -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH)
endif
