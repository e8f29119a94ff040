#!/usr/bin/env bash
# CPU test of scripts/plot.py: dev/test/test_plot.py, with matplotlib, the system's or build/pyenv's
# (SKIPPED where dev/test/python_env.sh cannot install it).
cd "$(dirname "$0")/../.." || exit 1
source dev/test/python_env.sh
python_env matplotlib || { echo "SKIPPED ($PYENV_WHY): plot.py tests"; exit 0; }
exec "$PYENV_PYTHON" dev/test/test_plot.py
