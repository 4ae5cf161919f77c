#!/usr/bin/env bash
# `scripts/gpu-check prepare` as the GPU routine runs it first, on this
# checkout: every source file of src/ scanned (the CUDA-only ones with the
# CUDA toolkit's headers), the bundle written, and what travels to the GPU
# machine within its limits: the bundle at most 30 MB, the bundle and the
# project's files (tracked, and untracked but not ignored) at most 64 MiB.
# A new file that the scan cannot preprocess fails here, not on the GPU.
#   tests/scripts/gpu_check_prepare.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
mkdir -p "$work"
bundle="$work/gpu-bundle"
"$src/scripts/gpu-check" prepare "$bundle"
bundle_bytes=$(du -sb "$bundle" | cut -f1)
tree_bytes=$(cd "$src" && git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
echo "bundle $bundle_bytes B, project files $tree_bytes B"
if [ "$bundle_bytes" -gt 30000000 ]; then
  echo "the bundle is over 30 MB: $bundle_bytes B"
  exit 1
fi
if [ $((bundle_bytes + tree_bytes)) -gt $((64 << 20)) ]; then
  echo "the bundle and the project's files are over 64 MiB: $((bundle_bytes + tree_bytes)) B"
  exit 1
fi
echo "gpu-check prepare: the scan covers every source file; $((bundle_bytes + tree_bytes)) B travel (limit $((64 << 20)))"
