#!/usr/bin/env bash
# How many GPUs a CUDA program started from here can use: nvidia-smi lists every GPU of the machine,
# CUDA_VISIBLE_DEVICES may show fewer (set but empty: none). CUDA reads its entries up to the
# first invalid one (not an index below the count nor a GPU-/MIG- UUID), so that "0,7,1" on 4 GPUs
# shows GPU 0 only. Prints nothing without nvidia-smi.
# --ids: the visible GPUs' ids for nvidia-smi --id instead, one a line, in CUDA's order (the
# entries of CUDA_VISIBLE_DEVICES, else 0 to the count - 1).
command -v nvidia-smi > /dev/null || exit 0
count=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  ids=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | awk -v count="$count" \
          '(/^[0-9]+$/ && $0 + 0 < count) || /^(GPU|MIG)-/ { print; next } { exit }' | head -n "$count")
else
  ids=$(seq 0 $((count - 1)))
fi
if [ "${1:-}" = --ids ]; then [ -z "$ids" ] || echo "$ids"; else grep -c . <<< "$ids" || true; fi  # 0: none
