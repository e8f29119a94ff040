# gpt2fp32: GPT-2 training in CUDA C++ (FP32 weights and activations, TF32 tensor cores).
#   make / make all   build every binary, the kernel lab (dev/cuda) included
#   make lab          build the kernel lab; make -C dev/cuda run builds and runs it (needs a GPU)
#   make train        build, prepare tiny Shakespeare if missing, train GPT-2 124M from scratch
#   make test         build, run the CPU tests and the GPU test (SKIPPED without a GPU)
#   make data         prepare the tiny Shakespeare shards
#   make test-124m    GPT-2 124M-shape references from train_gpt2.py (needs PyTorch), then the GPU test
#   make test-d6      the same in d6's shape (6 layers, 384 channels, 6 heads)
#   make test-faults  the fault tests (NaN, divergence, signals, kills, corrupt files, full disk) in full
#   make test-hf      hf_convert and (on a GPU) the trainer against transformers (needs PyTorch, transformers)
#   make test-generate  the trainer's generation and evaluation against train_gpt2.py (GPU; needs PyTorch, tiktoken)
#   make fuzz         the parsers and run guards under ASan/UBSan, then every fuzz target for FUZZ_SECONDS (clang)
#   make fixtures     regenerate the committed small test fixtures (needs PyTorch)
#   make bench-tokenizer   tokenizer throughput
#   make clean

NVCC ?= nvcc
CXX ?= g++
PYTHON ?= python3

include gpu_arch.mk

# The repository's path, compiled in so that the binaries find the bundled files (the vocabulary,
# tiny Shakespeare) from any directory (llmc/paths.h).
SOURCE_DIR_DEFINE := -DGPT2FP32_SOURCE_DIR=\"$(CURDIR)\"
CXXFLAGS := -O3 -std=c++17 -Wall -Wextra -I. -pthread $(SOURCE_DIR_DEFINE)
NVCC_COMMON := -O3 -std=c++17 --default-stream per-thread -I. -Xcompiler -Wall,-Wextra,-pthread $(SOURCE_DIR_DEFINE)
NVCCFLAGS = $(NVCC_COMMON) $(GENCODE)
NVCCLIBS := -lcublasLt -lcublas

include nccl.mk
NVCC_COMMON += $(NCCL_FLAGS)
NVCCLIBS += $(NCCL_LIBS)

TRAIN_DATA := dev/data/tinyshakespeare/tiny_shakespeare_train.bin
VAL_DATA := dev/data/tinyshakespeare/tiny_shakespeare_val.bin
LLMC_HEADERS := $(wildcard llmc/*.h llmc/*.cuh)
CPU_TESTS := build/test_tokenizer build/test_data build/test_paths build/test_launch build/test_zero build/test_json \
             build/test_safetensors build/test_hf build/test_guards build/test_eval build/test_state_file \
             build/test_debug_state build/test_step_idle build/test_args \
             build/test_mfu build/test_logger build/test_checkpoint_dir build/test_fingerprint \
             build/test_outputs build/test_prompt build/test_tensorboard build/test_overlap \
             build/test_checkpoint_writer build/test_device_memory
# build/tensorboard_demo writes a run's record with a resume for dev/test/test_tensorboard.sh.
BINARIES := train_gpt2_fp32 test_gpt2_fp32 prepare_data hf_convert $(CPU_TESTS) build/bench_tokenizer \
            build/tensorboard_demo

# CUPTI (the CUDA toolkit's profiling library) for the kernel tracer, dev/profile/kernel_trace.cpp;
# without it the tracer is not built.
CUPTI_DIR := $(firstword $(foreach d,$(CUDA_HOME) $(CUDA_HOME)/extras/CUPTI,$(if $(wildcard $(d)/include/cupti.h),$(d))))
CUPTI_LIB := $(firstword $(wildcard $(CUPTI_DIR)/lib64/libcupti.so $(CUPTI_DIR)/lib/libcupti.so))
ifneq ($(CUPTI_LIB),)
  BINARIES += build/libkernel_trace.so
endif

.PHONY: all train test data fixtures test-124m test-d6 test-hf test-generate test-faults fuzz bench-tokenizer clean lab nccl-info

all: $(BINARIES) lab

lab:
	$(MAKE) -C dev/cuda

train_gpt2_fp32: train_gpt2_fp32.cu $(LLMC_HEADERS)
	@$(call nvcc_build,$(NVCCFLAGS) $< -o $@ $(NVCCLIBS))

test_gpt2_fp32: test_gpt2_fp32.cu train_gpt2_fp32.cu $(LLMC_HEADERS)
	@$(call nvcc_build,$(NVCCFLAGS) $< -o $@ $(NVCCLIBS))

# The trainer and the test binary built as another target's PTX only, which the driver compiles at
# start, so that this GPU runs that target's paths (the GPU tests' other_paths group builds them):
# build/compute_75 the FP32-core paths of GPUs before Ampere, build/compute_80 TF32 mma.sync.
# Their flags come from gpu_arch.mk, with its refusals (compute_70 with CUDA 13).
build/compute_%/train_gpt2_fp32: train_gpt2_fp32.cu $(LLMC_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_COMMON) $(call gpu_arch_gencode,compute_$*) $< -o $@ $(NVCCLIBS)

build/compute_%/test_gpt2_fp32: test_gpt2_fp32.cu train_gpt2_fp32.cu $(LLMC_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_COMMON) $(call gpu_arch_gencode,compute_$*) $< -o $@ $(NVCCLIBS)

prepare_data: dev/data/prepare_data.cpp $(wildcard dev/data/*.h) $(LLMC_HEADERS)
	$(CXX) $(CXXFLAGS) $< -o $@

hf_convert: dev/hf/hf_convert.cpp $(LLMC_HEADERS)
	$(CXX) $(CXXFLAGS) $< -o $@

build/%: dev/test/%.cpp dev/test/testing.h $(wildcard dev/test/*.h dev/data/*.h dev/profile/*.h) $(LLMC_HEADERS)
	@mkdir -p build
	$(CXX) $(CXXFLAGS) $< -o $@

build/libkernel_trace.so: dev/profile/kernel_trace.cpp dev/profile/step_idle.h
	@mkdir -p build
	$(CXX) $(CXXFLAGS) -shared -fPIC -I$(CUPTI_DIR)/include $< -o $@ -L$(dir $(CUPTI_LIB)) -Xlinker -rpath=$(dir $(CUPTI_LIB)) -lcupti

# test_device_memory calls the CUDA runtime, which nvcc links.
build/test_device_memory: dev/test/test_device_memory.cpp dev/test/testing.h $(LLMC_HEADERS)
	@mkdir -p build
	$(NVCC) -O3 -std=c++17 -I. $< -o $@

# test_paths runs the binaries from other directories.
build/test_paths: | prepare_data train_gpt2_fp32 test_gpt2_fp32 hf_convert

$(TRAIN_DATA) $(VAL_DATA): prepare_data dev/data/tiny_shakespeare.txt dev/data/gpt2_encoder.json
	./prepare_data tinyshakespeare --force

data: $(TRAIN_DATA)

# GPT-2 124M from scratch on tiny Shakespeare: a few minutes on an H200.
train: train_gpt2_fp32 $(TRAIN_DATA)
	./train_gpt2_fp32 -e d12 -b 8 -t 1024 -l 6e-4 -u 50 -k cosine -q 0.1 -c 0.1 -x 300 -v 50 -m 0 -s 100 -g 128 -o log_d12 --force

# CPU tests, then the GPU tests (dev/test/gpu_tests.sh): the committed PyTorch fixtures at every -f
# for both attention kinds, whole runs (determinism, resume), faults and TensorBoard's files, in
# parallel on several GPUs; then data-parallel runs on 2, 4 and 8 GPUs (SKIPPED with fewer).
FIXTURES := dev/test/fixtures
test: all $(TRAIN_DATA)
	build/test_tokenizer
	build/test_data
	build/test_paths
	build/test_launch
	build/test_zero
	build/test_json
	build/test_safetensors
	build/test_hf
	build/test_guards
	build/test_eval
	build/test_state_file
	build/test_debug_state
	build/test_step_idle
	build/test_args
	build/test_mfu
	build/test_logger
	build/test_tensorboard
	build/test_checkpoint_dir
	build/test_checkpoint_writer
	build/test_device_memory
	build/test_fingerprint
	build/test_outputs
	build/test_prompt
	build/test_overlap
	dev/test/test_nccl_compat.sh
	dev/test/test_bench_gpus.sh
	dev/test/test_plot.sh
	dev/test/test_arch_builds.sh
	dev/test/gpu_tests.sh

# The reference steps exercise gradient accumulation, clipping and a warmup + cosine schedule.
REFERENCE_STEPS := --grad-accum 2 --grad-clip 1.5 --lr-warmup 3 --lr-schedule cosine --lr-final-frac 0.1

# Regenerate the committed fixtures (needs PyTorch, and transformers for hf_tiny; true FP32 on the CPU).
fixtures:
	for kind in softmax relu; do \
	  $(PYTHON) train_gpt2.py --device cpu --layers 2 --heads 2 --channels 128 --vocab 1000 --max-seq-len 64 \
	    --batch 4 --seq-len 64 --steps 10 --lr 1e-3 --weight-decay 0.1 --seed 0 --attn $$kind $(REFERENCE_STEPS) \
	    --write-model $(FIXTURES)/gpt2_small_$${kind}_model.bin --write-state $(FIXTURES)/gpt2_small_$${kind}_state.bin \
	    || exit 1; \
	done
	rm -rf $(FIXTURES)/hf_tiny && $(PYTHON) dev/test/test_hf.py --make-fixture $(FIXTURES)/hf_tiny && rm -f $(FIXTURES)/hf_tiny/generation_config.json
	$(PYTHON) train_gpt2.py --device cpu --init-from $(FIXTURES)/hf_tiny_model.bin --batch 4 --seq-len 32 --steps 1 \
	  --seed 0 --write-classic-state $(FIXTURES)/hf_tiny_classic_state.bin

# References in a model's shape by name (B=4, T=1024, both attention kinds, the validation tokens),
# generated where PyTorch is, each then checked at -f 0: $(call reference_check,MODEL). The
# learning rate is kept low: at 3e-4 a fresh 124M model hits a gradient-norm spike by step 3 that
# amplifies rounding differences, and the step comparisons would test chaos, not the code.
define reference_check
@mkdir -p build/ref_$1
for kind in softmax relu; do \
  $(PYTHON) train_gpt2.py --model $1 --attn $$kind --batch 4 --seq-len 1024 --steps 6 --lr 1e-4 $(REFERENCE_STEPS) \
    --tokens $(VAL_DATA) --write-model build/ref_$1/$${kind}_model.bin --write-state build/ref_$1/$${kind}_state.bin && \
  ./test_gpt2_fp32 -f 0 -m build/ref_$1/$${kind}_model.bin -s build/ref_$1/$${kind}_state.bin || exit 1; \
done
endef

# GPT-2 124M (d12), and d6 (6 layers, 384 channels, 6 heads: -e d6's shape, too big to commit).
test-124m: test_gpt2_fp32 $(VAL_DATA)
	$(call reference_check,d12)

test-d6: test_gpt2_fp32 $(VAL_DATA)
	$(call reference_check,d6)

# The file parsers and the run guards under AddressSanitizer and UndefinedBehaviorSanitizer, then
# every fuzz target (libFuzzer, clang; fail() throws there) for FUZZ_SECONDS, all at once, each on
# a scratch copy of its committed corpus; a target's output is shown when it ends, and make fails
# if any target found a crash, a leak or a slow input.
FUZZ_SECONDS ?= 30
SANITIZE := -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all
ASAN_TESTS := safetensors json hf tokenizer guards eval state_file debug_state args checkpoint_dir checkpoint_writer \
              outputs tensorboard
FUZZ_TARGETS := safetensors model_file shard tokenizer eval state_file debug_state
# The longest input each target tries: room for its format's header and a few records (a
# tokenizer needs all 256 bytes); dictionaries for the text formats; no single allocation over
# 64 MB for the checkpoint formats (a hostile header must be refused before it allocates).
FUZZ_FLAGS_safetensors := -max_len=4096 -dict=dev/test/fuzz/safetensors.dict
FUZZ_FLAGS_model_file := -max_len=4096
FUZZ_FLAGS_shard := -max_len=4096
FUZZ_FLAGS_tokenizer := -max_len=16384 -dict=dev/test/fuzz/tokenizer.dict
FUZZ_FLAGS_eval := -max_len=4096 -dict=dev/test/fuzz/eval.dict
FUZZ_FLAGS_state_file := -max_len=4096 -malloc_limit_mb=64
FUZZ_FLAGS_debug_state := -max_len=4096 -malloc_limit_mb=64
fuzz: $(ASAN_TESTS:%=build/test_%_asan) $(FUZZ_TARGETS:%=build/fuzz_%)
	for t in $(ASAN_TESTS); do build/test_$${t}_asan || exit 1; done
	$(MAKE) --no-print-directory -j$(words $(FUZZ_TARGETS)) --output-sync=target $(FUZZ_TARGETS:%=fuzz-run-%)

build/test_%_asan: dev/test/test_%.cpp dev/test/testing.h $(wildcard dev/test/*.h) $(wildcard dev/data/*.h) $(LLMC_HEADERS)
	@mkdir -p build
	$(CXX) $(CXXFLAGS) $(SANITIZE) $< -o $@

build/fuzz_%: dev/test/fuzz_%.cpp $(wildcard dev/test/*.h) $(LLMC_HEADERS)
	@mkdir -p build
	clang++ -std=c++17 -I. -DFAIL_THROWS $(SANITIZE) -fsanitize=fuzzer $< -o $@

fuzz-run-%:
	rm -rf build/fuzz_corpus/$* && mkdir -p build/fuzz_corpus/$* && cp dev/test/fuzz/$*/* build/fuzz_corpus/$*/
	build/fuzz_$* -max_total_time=$(FUZZ_SECONDS) -timeout=10 $(FUZZ_FLAGS_$*) -artifact_prefix=build/fuzz_$*- \
	  build/fuzz_corpus/$*

# The fault tests with 10 signals and 20 kills at random times (about 12 minutes on an H200;
# make test runs 3 of each).
test-faults: train_gpt2_fp32 $(TRAIN_DATA)
	dev/test/test_faults.sh

# hf_convert and, on a GPU, the trainer against transformers (SKIPPED without PyTorch or transformers).
test-hf: hf_convert train_gpt2_fp32 test_gpt2_fp32 $(TRAIN_DATA)
	$(PYTHON) dev/test/test_hf.py

# Greedy generation and evaluation against train_gpt2.py, sampling determinism, bad evaluation
# files (SKIPPED without a GPU, PyTorch or tiktoken).
test-generate: train_gpt2_fp32
	PYTHON=$(PYTHON) dev/test/test_generate.sh

bench-tokenizer: build/bench_tokenizer
	build/bench_tokenizer

# make print-VARIABLE shows a variable, e.g. print-GENCODE or print-NVCCFLAGS (dev/test/test_arch_builds.sh).
print-%:
	@echo '$($*)'

nccl-info:
	@echo "NCCL: $(if $(NCCL_LIB),$(NCCL_LIB) (several GPUs),not found (one GPU; NCCL_HOME=DIR to point at it))"

clean:
	rm -rf build train_gpt2_fp32 test_gpt2_fp32 prepare_data hf_convert
