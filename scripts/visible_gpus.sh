#!/usr/bin/env bash
# How many GPUs a CUDA program started from here can use: nvidia-smi lists every GPU of the machine,
# CUDA_VISIBLE_DEVICES may show fewer (set but empty: none). Prints nothing without nvidia-smi.
command -v nvidia-smi > /dev/null || exit 0
count=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  visible=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
  [ "$visible" -lt "$count" ] && count=$visible
fi
echo "$count"
