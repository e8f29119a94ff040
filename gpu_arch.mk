# GPU architectures for nvcc, shared by the top Makefile and dev/cuda/Makefile: GENCODE, the
# -gencode flags of GPU_ARCH, a list of targets, each a compute capability without its dot:
#   NN          machine code for GPUs of compute capability N.N (sm_NN; 90 is sm_90a, Hopper's target
#               with the warpgroup MMA, wgmma)
#   compute_NN  PTX only (compute_90 too, not 90a), which the driver compiles at start on any GPU of
#               N.N or newer
# e.g. `make GPU_ARCH=86`, `make GPU_ARCH="80 90"`, `make GPU_ARCH=compute_75`.
# Unset: the local GPU's compute capability if nvidia-smi finds one, otherwise "80 90 compute_80", a
# fat binary whose compute_80 PTX GPUs newer than both compile at start (they take the mma.sync path:
# sm_90a's code runs on Hopper only).
# Compute capability 6.0 or newer is needed, and 6.x, 7.0 and 7.2 need CUDA 12.x (CUDA 13 dropped
# them): `make NVCC=/usr/local/cuda-12.9/bin/nvcc GPU_ARCH=70`. Otherwise make stops at once, for any
# goal but clean, with one line saying why; nvcc itself refuses a target it does not know.
ifeq ($(origin GPU_ARCH),undefined)
  GPU_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | \
                      grep -E '^[0-9]+\.[0-9]+$$' | tr -d '.')
  gpu_arch_local := $(GPU_ARCH)
endif
# Empty (no GPU found, or GPU_ARCH= on the command line): the fat binary.
gpu_arch_list := $(or $(strip $(GPU_ARCH)),80 90 compute_80)

# Every compute capability below 6.0, and those CUDA 13 dropped.
GPU_ARCH_TOO_OLD := 10 11 12 13 20 21 30 32 35 37 50 52 53
GPU_ARCH_CUDA12 := 60 61 62 70 72

, := ,
gpu_arch_number = $(subst .,,$(patsubst compute_%,%,$1))
# How a refusal names the target: the local GPU or the GPU_ARCH word (also the word of a rule's
# target, the Makefile's build/compute_NN), and its compute capability.
gpu_arch_name = $(if $(filter $1,$(gpu_arch_local)),the local GPU,GPU_ARCH=$1) (compute capability \
  $(shell echo $(call gpu_arch_number,$1) | sed 's/.$$/.&/'))
gpu_arch_nvcc_release = $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
gpu_arch_stop = $(if $(filter-out clean,$(or $(MAKECMDGOALS),all)),$(error $1))

# $(call gpu_arch_check,WORD): stops make if the target of a GPU_ARCH word cannot be built.
gpu_arch_check = $(strip \
  $(if $(filter $(GPU_ARCH_TOO_OLD),$(call gpu_arch_number,$1)),\
    $(call gpu_arch_stop,$(call gpu_arch_name,$1) is too old: gpt2fp32 needs 6.0 or newer))\
  $(if $(filter $(GPU_ARCH_CUDA12),$(call gpu_arch_number,$1)),\
    $(if $(filter-out 1 2 3 4 5 6 7 8 9 10 11 12,$(firstword $(subst ., ,$(gpu_arch_nvcc_release)))),\
      $(call gpu_arch_stop,$(call gpu_arch_name,$1) needs CUDA 12.x$(,) and $(NVCC) is CUDA \
        $(gpu_arch_nvcc_release) (CUDA 13 dropped 6.x-7.2): make NVCC=/path/to/cuda-12/bin/nvcc$(if $(filter $1,$(gpu_arch_local)),, GPU_ARCH=$1)))))

# $(call gpu_arch_gencode,WORD): the -gencode flag of a GPU_ARCH word.
gpu_arch_gencode = $(call gpu_arch_check,$1)$(strip \
  $(if $(filter compute_%,$1),-gencode arch=compute_$(call gpu_arch_number,$1)$(,)code=compute_$(call gpu_arch_number,$1),\
  $(if $(filter 90,$(call gpu_arch_number,$1)),-gencode arch=compute_90a$(,)code=sm_90a,\
  -gencode arch=compute_$(call gpu_arch_number,$1)$(,)code=sm_$(call gpu_arch_number,$1))))

GENCODE := $(foreach word,$(gpu_arch_list),$(call gpu_arch_gencode,$(word)))

# $(call nvcc_build,ARGUMENTS): a recipe's nvcc run for $@ that also stops the build where ptxas
# serialises a kernel's wgmma. ptxas says so only in an info line ("wgmma.mma_async instructions
# are serialized due to ...": C7513 for registers an MMA reads being written while it may run,
# C7511 for too few registers), which is easily missed, and such a kernel ran up to 1.3x slower
# in the lab (dev/cuda/README.md, matmul_wgmma variant 6); $@ is then removed, so the next make
# tries again.
nvcc_build = echo '$(NVCC) $1'; log=$$(mktemp); $(NVCC) $1 2> $$log; status=$$?; cat $$log >&2; \
  if grep -q 'wgmma.mma_async instructions are serialized' $$log; then \
    echo "$@: ptxas serialised a kernel's wgmma (above)" >&2; rm -f $@; status=1; fi; \
  rm -f $$log; exit $$status
