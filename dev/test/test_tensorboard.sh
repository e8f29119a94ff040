#!/usr/bin/env bash
# TensorBoard's own readers on the event files the trainer writes (dev/test/test_tensorboard.py:
# a CPU part, and a GPU part SKIPPED without a GPU), with the tensorboard package, the system's or
# build/pyenv's (dev/test/python_env.sh; SKIPPED where it cannot be installed). Needs
# build/tensorboard_demo, and ./train_gpt2_fp32 for the GPU part.
set -u
cd "$(dirname "$0")/../.."
source dev/test/python_env.sh
if ! python_env tensorboard; then
  echo "SKIPPED ($PYENV_WHY): TensorBoard event files read back by TensorBoard"
  exit 0
fi
exec "$PYENV_PYTHON" dev/test/test_tensorboard.py
