# NCCL for several GPUs: found in NCCL_HOME, the CUDA toolkit or /usr (NCCL=0 builds without it,
# one GPU only). Sets NCCL_FLAGS and NCCL_LIBS for nvcc (empty without NCCL) and NCCL_LIB, the
# library found. Included by the Makefile and by dev/cuda/Makefile (the lab's nccl_moves).
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC))))
NCCL ?= 1
NCCL_FLAGS :=
NCCL_LIBS :=
ifeq ($(NCCL),1)
  NCCL_DIR := $(firstword $(foreach d,$(NCCL_HOME) $(CUDA_HOME) /usr,$(if $(wildcard $(d)/include/nccl.h),$(d))))
  NCCL_LIB := $(firstword $(wildcard $(NCCL_DIR)/lib64/libnccl.so $(NCCL_DIR)/lib/libnccl.so \
                                     $(NCCL_DIR)/lib/x86_64-linux-gnu/libnccl.so $(NCCL_DIR)/lib/aarch64-linux-gnu/libnccl.so))
  ifneq ($(NCCL_LIB),)
    NCCL_FLAGS := -DUSE_NCCL -I$(NCCL_DIR)/include
    NCCL_LIBS := -L$(dir $(NCCL_LIB)) -Xlinker -rpath=$(dir $(NCCL_LIB)) -lnccl
  endif
endif
