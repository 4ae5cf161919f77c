#!/usr/bin/env python3
"""What `scripts/gpu-check run` builds against, read from the torch of the
Python that runs this file: where the torch package is, its version, C++ ABI
and CUDA, the visible GPUs, the CUDA headers and the cudart torch loads, and
cmake/ninja. Prints shell assignments (KEY='value'), one a line.

The CUDA headers come from the first candidate folder that holds the whole
runtime set, cuda_runtime_api.h and crt/host_config.h (cuda_runtime.h
includes the latter): $CUDA_HOME, $CUDA_PATH and /usr/local/cuda first, then
the include folders of the nvidia-* pip wheels, which may carry only part of
the set (nvidia/cu13/include has cuda_runtime.h without crt/).

Standard library at import time; torch only in main(), so the choices below
are tested without it (tests/scripts/test_gpu_check_probe.py).
"""
import glob
import os
import shlex
import shutil
import site
import sys

# Headers a folder must hold for the build's CUDA translation units.
CUDA_RUNTIME_HEADERS = ("cuda_runtime_api.h", os.path.join("crt", "host_config.h"))


def toolkit_homes(environ, default="/usr/local/cuda"):
    """CUDA toolkit folders to try, in order: $CUDA_HOME, $CUDA_PATH, `default`."""
    homes = [environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), default]
    return [h for i, h in enumerate(homes) if h and h not in homes[:i]]


def include_candidates(homes, package_roots):
    """Include folders to try: each toolkit home's include/, then every
    include/ folder under the nvidia/ folder of each Python package root."""
    out = [os.path.join(h, "include") for h in homes]
    for root in package_roots:
        out += sorted(os.path.dirname(p) for p in glob.glob(
            os.path.join(root, "nvidia", "**", "include", "cuda_runtime_api.h"), recursive=True))
    return out


def complete_cuda_include(folder):
    """True when `folder` holds every header of CUDA_RUNTIME_HEADERS."""
    return all(os.path.isfile(os.path.join(folder, h)) for h in CUDA_RUNTIME_HEADERS)


def choose_cuda_include(candidates):
    """(folder, why): the first complete candidate, or ("", the reason none was)."""
    partial = []
    for folder in candidates:
        if complete_cuda_include(folder):
            return folder, ""
        if os.path.isfile(os.path.join(folder, "cuda_runtime_api.h")):
            partial.append(folder)
    if partial:
        return "", "only incomplete CUDA include folders (no crt/host_config.h): " + ", ".join(partial)
    return "", "no folder with cuda_runtime_api.h among " + ", ".join(candidates)


def first_glob(patterns):
    for p in patterns:
        hits = sorted(glob.glob(p, recursive=True))
        if hits:
            return hits[0]
    return ""


def loaded_cudart():
    """The libcudart this process has mapped (torch's), or ""."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libcudart.so" in path:
                return path
    return ""


def tool(name):
    """`name` on PATH, or the binary of the pip package of that name, or ""."""
    path = shutil.which(name)
    if path:
        return path
    try:
        mod = __import__(name)
    except Exception:
        return ""
    cand = os.path.join(getattr(mod, "CMAKE_BIN_DIR", getattr(mod, "BIN_DIR", "")), name)
    return cand if os.path.isfile(cand) else ""


def main():
    import torch
    d = os.path.dirname(torch.__file__)
    roots = [os.path.dirname(d)] + [p for p in site.getsitepackages() if os.path.isdir(p)]
    homes = toolkit_homes(os.environ)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        torch.zeros(1, device="cuda")  # loads the CUDA runtime torch uses
    cudart = loaded_cudart() or first_glob(
        [os.path.join(r, "nvidia", "**", "libcudart.so*") for r in roots] +
        [os.path.join(h, "lib64", "libcudart.so*") for h in homes])
    inc, why = choose_cuda_include(include_candidates(homes, roots))
    values = {
        "TORCH_DIR": d, "TORCH_VERSION": torch.__version__, "TORCH_CUDA": torch.version.cuda or "",
        "CXX11_ABI": str(int(torch.compiled_with_cxx11_abi())), "GPUS": str(gpus),
        "CUDA_INC": inc, "CUDA_INC_WHY": why, "CUDART": cudart,
        "CMAKE": tool("cmake"), "NINJA": tool("ninja"),
        "GPU_NAME": torch.cuda.get_device_name(0) if gpus else "",
    }
    for k, v in values.items():
        print(f"{k}={shlex.quote(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
