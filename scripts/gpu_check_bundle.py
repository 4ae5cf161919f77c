#!/usr/bin/python3
"""`scripts/gpu-check prepare`: writes the bundle of build dependencies for
a machine without internet that has a compiler and a libtorch but none of
vramgate's other build dependencies. The project's own tree travels beside
it (the bundle holds no copy of it); the build finds the bundle through
VG_BUNDLED_INCLUDE_DIR and VG_BUNDLED_LIB_DIR (cmake/bundled_deps.cmake).

What the bundle holds, taken from the installed Debian packages:
  include/  the headers the build includes, found by preprocessing every
            source file with `g++ -M` in the VG_BUNDLED_DEPS configuration and
            mapping each header to its Debian package (dpkg -S), and then
            every header of those packages that a copied header names in an
            #include line, whatever its #if around it (what another compiler
            version may take), to a fixed point. Libraries and the C/C++
            runtime are left out (the target machine has its own), and so is
            libtorch (the target's is used).
  lib/      static archives of the compiled C libraries (PCRE2, libcrypto).
  BUNDLE.txt where it came from: commit, date, package versions.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Packages whose headers the target machine provides itself or must not get
# from here: the C library and kernel headers, the compiler's, libtorch's,
# CUDA's (a toolkit under /usr/local is outside /usr/include and left out anyway).
SYSTEM_PACKAGES = ("libc6-dev", "linux-libc-dev", "libstdc++", "libgcc", "gcc-", "libtorch", "libc10",
                   "libgoogle-glog-dev", "libgflags-dev",  # libtorch's own dependencies
                   "nvidia-cuda", "libcudart", "nvidia-cuda-toolkit")  # a Debian CUDA toolkit: the GPU machine has its own
# Defines of the VG_BUNDLED_DEPS configuration (cmake/bundled_deps.cmake).
BUNDLED_DEFINES = ["-DFMT_HEADER_ONLY", "-DSPDLOG_FMT_EXTERNAL", "-DTOML_HEADER_ONLY=1"]
STATIC_LIBS = ["libpcre2-8.a", "libcrypto.a"]
MULTIARCH = "/usr/include/x86_64-linux-gnu/"
INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def project_files(root):
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout.decode()
    for rel in out.split("\0"):
        if not rel or rel.startswith(("build/", "gpu-bundle/", "third_party/")):
            continue
        if os.path.isfile(os.path.join(root, rel)):
            yield rel


def cuda_include_dirs(scratch):
    """The include folders a file that includes libtorch's CUDA headers needs
    here, as the build's `cuda_syntax_check` gives them (cmake/torch.cmake):
    the CUDA runtime's headers ($CUDA_HOME, /usr/local/cuda) and, where
    Debian's libtorch lacks it, a stand-in for c10/cuda/impl/cuda_cmake_macros.h
    written under `scratch`. None when no CUDA runtime header is found."""
    cuda = next((d for d in (os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include"),
                             "/usr/local/cuda/include", "/usr/include")
                 if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))), None)
    if cuda is None:
        return None
    dirs = []
    if not os.path.isfile("/usr/include/c10/cuda/impl/cuda_cmake_macros.h"):
        stub = os.path.join(scratch, "c10", "cuda", "impl", "cuda_cmake_macros.h")
        os.makedirs(os.path.dirname(stub), exist_ok=True)
        with open(stub, "w") as f:
            f.write("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        dirs.append(scratch)
    return dirs + [cuda]


def headers_of(root, source, cuda_dirs):
    """The /usr headers `g++ -M` lists for `source`. A file that cannot be
    preprocessed for want of a CUDA header is preprocessed again with
    `cuda_dirs` (the CUDA-only files: cuda_device.cpp, cuda_graph.cpp and any
    later one), so no file is left out of the scan and none needs naming here."""
    base = ["g++", "-std=c++20", "-M", "-MT", "x", "-I" + os.path.join(root, "src")]
    tail = ["-I/usr/include/torch/csrc/api/include", *BUNDLED_DEFINES, source]
    r = subprocess.run(base + tail, capture_output=True, text=True)
    if r.returncode != 0 and re.search(r"cuda\w*\.h: No such file", r.stderr):
        if cuda_dirs is None:
            raise RuntimeError(f"{source} needs the CUDA runtime headers, and none were found "
                               "(set CUDA_HOME to a CUDA toolkit, or install one in /usr/local/cuda)")
        r = subprocess.run(base + [f"-I{d}" for d in cuda_dirs] + tail, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"g++ -M {source} failed:\n{r.stderr[-3000:]}")
    deps = r.stdout.replace("\\\n", " ").split()[1:]
    return {os.path.normpath(d) for d in deps if d.startswith("/usr/")}


def owners(paths):
    """Maps each header to its Debian package (dpkg -S), in chunks."""
    result = {}
    paths = sorted(paths)
    for i in range(0, len(paths), 200):
        chunk = paths[i:i + 200]
        r = subprocess.run(["dpkg", "-S", *chunk], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            pkg, _, path = line.partition(": ")
            for p in path.split(", "):
                result[p.strip()] = pkg.split(":")[0]
    return result


def include_relative(path):
    if path.startswith(MULTIARCH):
        return path[len(MULTIARCH):]
    if path.startswith("/usr/include/"):
        return path[len("/usr/include/"):]
    return None


def copy(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(src, dst)


def system_path(rel):
    """The /usr/include file an include-relative path names, or None."""
    for base in ("/usr/include/", MULTIARCH):
        if os.path.isfile(base + rel):
            return os.path.normpath(base + rel)
    return None


def named_includes(path):
    """The /usr/include files that `path` names in its #include lines (any #if
    branch): <x> from the include folders, "x" beside `path` first."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = set()
    for target in INCLUDE_LINE.findall(text):
        local = os.path.normpath(os.path.join(os.path.dirname(path), target))
        found = local if local.startswith("/usr/include/") and os.path.isfile(local) else system_path(target)
        if found:
            out.add(found)
    return out


# Boost libraries whose -M files are taken as they are: Boost.Preprocessor
# picks its files by its own limit macros, which the build leaves alone,
# not by compiler; the rest of it would be 4.5 MB of files never read.
AS_PREPROCESSED = {"preprocessor"}


def library_of(path):
    """The Boost library a header belongs to (boost/asio/x.hpp and
    boost/asio.hpp: "asio"), or "" outside Boost."""
    parts = include_relative(path).split("/")
    if parts[0] != "boost" or len(parts) < 2:
        return ""
    return parts[1].removesuffix(".hpp")


def include_closure(used, package_of_path, bundled):
    """`used` plus every header of a `bundled` package that a header in the
    set names, to a fixed point; in Boost, only headers of the libraries the
    build uses (an #if for an option the build leaves off, such as Asio's
    Boost.Regex support, brings no new library). `package_of_path` maps a
    path to its package (and is extended with dpkg -S for new paths)."""
    keep = {h for h in used if package_of_path.get(h) in bundled}
    libraries = {library_of(h) for h in keep} - AS_PREPROCESSED
    todo = list(keep)
    while todo:
        named = set()
        for h in todo:
            named |= named_includes(h) - keep
        named = {h for h in named if library_of(h) in libraries}
        unknown = [h for h in named if h not in package_of_path]
        package_of_path.update(owners(unknown))
        todo = [h for h in named if package_of_path.get(h) in bundled]
        keep |= set(todo)
    return keep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="the project checkout")
    ap.add_argument("--out", required=True, help="the bundle folder (replaced)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    out = os.path.abspath(args.out)
    t0 = time.monotonic()
    if os.path.exists(out):
        if not os.path.isfile(os.path.join(out, "BUNDLE.txt")):
            raise SystemExit(f"gpu-check prepare: {out} exists and is not a bundle: not replacing it")
        shutil.rmtree(out)

    files = list(project_files(root))
    sources = [os.path.join(root, f) for f in files if f.startswith("src/") and f.endswith(".cpp")]
    sources.append(os.path.join(root, "cmake", "boost_json_src.cpp"))
    used = set()
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-scan-") as scratch:
        cuda_dirs = cuda_include_dirs(scratch)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for headers in pool.map(lambda s: headers_of(root, s, cuda_dirs), sources):
                used |= headers
    used = {h for h in used if include_relative(h)}
    pkg_of = owners(used)
    unowned = sorted(h for h in used if h not in pkg_of)
    if unowned:
        raise SystemExit("headers that no Debian package owns (install them from packages): " + " ".join(unowned[:20]))

    packages = sorted({p for p in pkg_of.values() if not p.startswith(SYSTEM_PACKAGES)})
    inc = os.path.join(out, "include")
    headers = include_closure(used, pkg_of, set(packages))
    for path in sorted(headers):
        copy(path, os.path.join(inc, include_relative(path)))

    lib = os.path.join(out, "lib")
    os.makedirs(lib, exist_ok=True)
    for name in STATIC_LIBS:
        copy(os.path.join("/usr/lib/x86_64-linux-gnu", name), os.path.join(lib, name))

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip()
    versions = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *packages],
                              capture_output=True, text=True).stdout
    with open(os.path.join(out, "BUNDLE.txt"), "w") as f:
        f.write(f"vramgate bundle for scripts/gpu-check run\ncommit {commit}{' + uncommitted changes' if dirty else ''}\n"
                f"made {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n\nheaders from Debian packages:\n{versions}"
                f"\nstatic libraries: {', '.join(STATIC_LIBS)}\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    print(f"gpu-check prepare: {out}: {len(headers)} headers from {len(packages)} packages "
          f"({', '.join(packages)}), {len(STATIC_LIBS)} static libraries, {size / 1e6:.1f} MB, "
          f"{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
