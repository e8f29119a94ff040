#!/usr/bin/env bash
# Builds the kernel lab and runs its binaries (all, or those named: ./run_all.sh adamw global_norm),
# each binary's output in $LAB_LOGS (default dev/cuda/logs), then prints one table of all rows.
# Binaries that do not use common.h (attention) print their own table, shown after the main one.
set -u
cd "$(dirname "$0")"
logs=${LAB_LOGS:-logs}
mkdir -p "$logs"
make -j"$(nproc)" >"$logs/build.log" 2>&1 || { cat "$logs/build.log"; exit 1; }

if [ $# -gt 0 ]; then names=("$@"); else names=($(ls *.cu | sed 's/\.cu$//')); fi
status=0
for name in "${names[@]}"; do
  start=$(date +%s)
  if ./"$name" >"$logs/$name.log" 2>&1; then result=ok; else result=FAILED; status=1; fi
  echo "# $name: $result in $(( $(date +%s) - start )) s (log: $logs/$name.log)"
done

echo
echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1), $(date -u '+%Y-%m-%d %H:%M UTC')"
lab_names=()
for name in "${names[@]}"; do grep -q '#include "common.h"' "$name.cu" && lab_names+=("$name"); done
if [ ${#lab_names[@]} -gt 0 ]; then
  grep -m 2 '^|' "$logs/${lab_names[0]}.log"
  for name in "${lab_names[@]}"; do grep '^|' "$logs/$name.log" | tail -n +3; done
  echo
  for name in "${lab_names[@]}"; do
    grep '^# ' "$logs/$name.log" | tail -n +2 | grep -v '^# PASS' | sed "s/^# /# $name: /"
    grep '^error' "$logs/$name.log" | sed "s/^/# $name: /"
  done
fi
for name in "${names[@]}"; do
  grep -q '#include "common.h"' "$name.cu" && continue
  echo
  echo "# $name (its own table)"
  grep '^|' "$logs/$name.log"
done
exit $status
