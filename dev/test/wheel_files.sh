#!/usr/bin/env bash
# wheel_files.sh PACKAGE==VERSION PREFIX DEST: the files of the package registry's wheel whose names
# start with PREFIX, extracted under DEST (the wheel downloaded beside them, then removed); non-zero
# with the reason on one line of stderr. The CPU tests that need a package's headers use it
# (test_nccl_compat.sh: NCCL's, test_arch_builds.sh: cuBLAS's).
set -u
package=$1 prefix=$2 dest=$3
mkdir -p "$dest" || exit 1
download=$(mktemp -d -p "$dest" .wheel.XXXXXX) || exit 1
trap 'rm -rf "$download"' EXIT
if ! python3 -m pip download -q --disable-pip-version-check --no-deps -d "$download" "$package" \
     > "$download/pip.log" 2>&1; then
  echo "pip download $package failed: $(tail -n 1 "$download/pip.log")" >&2
  exit 1
fi
python3 - "$download" "$prefix" "$dest" << 'PY'
import glob, sys, zipfile
download, prefix, dest = sys.argv[1:]
with zipfile.ZipFile(glob.glob(download + "/*.whl")[0]) as wheel:
    names = [name for name in wheel.namelist() if name.startswith(prefix)]
    if not names:
        sys.exit(f"the wheel has no {prefix}")
    wheel.extractall(dest, names)
PY
