# Sourced by the tests that need Python packages the machine may lack (tensorboard, matplotlib):
# `python_env PACKAGE...` sets PYENV_PYTHON to the system's python3 where it has them all, else
# makes build/pyenv (a virtual environment, made once and kept) and installs the missing packages
# there from the package registry. It returns non-zero, with the reason in PYENV_WHY, where that
# cannot be done: the caller prints its SKIPPED line with it.
python_env() {
  local root venv missing=() package all="$*"
  PYENV_WHY=
  PYENV_PYTHON=python3
  if command -v python3 > /dev/null && python3 -c "import ${all// /, }" > /dev/null 2>&1; then return 0; fi
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  venv=$root/build/pyenv
  PYENV_PYTHON=$venv/bin/python3
  if [ ! -x "$PYENV_PYTHON" ]; then
    command -v python3 > /dev/null || { PYENV_WHY="no python3"; return 1; }
    mkdir -p "$root/build"
    python3 -m venv "$venv" > /dev/null 2>&1 || { rm -rf "$venv"; PYENV_WHY="python3 -m venv failed"; return 1; }
  fi
  for package in "$@"; do
    "$PYENV_PYTHON" -c "import $package" > /dev/null 2>&1 || missing+=("$package")
  done
  [ "${#missing[@]}" = 0 ] && return 0
  if ! "$PYENV_PYTHON" -m pip install -q --disable-pip-version-check "${missing[@]}" > "$root/build/pyenv_install.log" 2>&1; then
    PYENV_WHY="pip install ${missing[*]} failed: $(tail -n 1 "$root/build/pyenv_install.log")"
    return 1
  fi
}
