#!/usr/bin/env bash
# The CUDA device and CUDA graphs compiled as a GPU build compiles them: against a torch package
# folder (scripts/gpu-check torch-folder: Debian's libtorch in a pip wheel's
# layout, with an include/fmt that is an #error, as torch 2.x's fmt 12 is for
# spdlog) and the CUDA toolkit's headers. Fails where a file compiled with
# libtorch's include folders reaches fmt or spdlog.
#   tests/scripts/cuda_device_torch_folder.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
"$src/scripts/gpu-check" torch-folder "$work/torch"
if ! cmake -S "$src" -B "$work/build" -G Ninja -DVG_BUILD_TESTS=OFF -DVG_BENCH=OFF \
    -DVG_TORCH_DIR="$work/torch" -DVG_TORCH_CXX11_ABI=1 >"$work/configure.log" 2>&1; then
  tail -30 "$work/configure.log"
  exit 1
fi
if ! grep -q "cuda_syntax_check" "$work/build/build.ninja"; then
  echo "no CUDA toolkit headers (cuda_runtime_api.h under \$CUDA_HOME or /usr/local/cuda): cannot compile the CUDA device"
  exit 1
fi
ninja -C "$work/build" cuda_syntax_check
echo "src/device/cuda_device.cpp and cuda_graph.cpp compile against a torch folder with an fmt of its own"
