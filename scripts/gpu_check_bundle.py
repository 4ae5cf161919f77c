#!/usr/bin/python3
"""`scripts/gpu-check prepare`: writes a self-contained source bundle for a
machine without internet that has a compiler and a libtorch but none of
vramgate's other build dependencies.

The bundle holds the project's files (tracked and untracked-but-not-ignored,
as git lists them) plus, under third_party/, what the build takes from the
installed Debian packages:
  include/  the headers the build includes, found by preprocessing every
            source file with `g++ -M` in the VG_BUNDLED_DEPS configuration and
            mapping each header to its Debian package (dpkg -S). Libraries
            and the C/C++ runtime are left out (the target machine has its
            own), and so is libtorch (the target's is used). Boost is copied
            per library folder that is used (boost/asio/, boost/beast/, ...),
            every other package whole, so that headers included only under
            other compiler versions are there too.
  lib/      static archives of the compiled C libraries (PCRE2, libcrypto).
  BUNDLE.txt where it came from: commit, date, package versions.
"""
import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import time

# Packages whose headers the target machine provides itself or must not get
# from here: the C library and kernel headers, the compiler's, libtorch's.
SYSTEM_PACKAGES = ("libc6-dev", "linux-libc-dev", "libstdc++", "libgcc", "gcc-", "libtorch", "libc10",
                   "libgoogle-glog-dev", "libgflags-dev")  # the last two: libtorch's own dependencies
# Defines of the VG_BUNDLED_DEPS configuration (cmake/bundled_deps.cmake).
BUNDLED_DEFINES = ["-DFMT_HEADER_ONLY", "-DSPDLOG_FMT_EXTERNAL", "-DTOML_HEADER_ONLY=1"]
STATIC_LIBS = ["libpcre2-8.a", "libcrypto.a"]
MULTIARCH = "/usr/include/x86_64-linux-gnu/"


def project_files(root):
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout.decode()
    for rel in out.split("\0"):
        if not rel or rel.startswith(("build/", "gpu-bundle/", "third_party/")):
            continue
        if os.path.isfile(os.path.join(root, rel)):
            yield rel


def headers_of(root, source):
    cmd = ["g++", "-std=c++20", "-M", "-MT", "x", "-I" + os.path.join(root, "src"),
           "-I/usr/include/torch/csrc/api/include", *BUNDLED_DEFINES, source]
    r = subprocess.run(cmd, capture_output=True, text=True)
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
        shutil.rmtree(out)

    files = list(project_files(root))
    for rel in files:
        copy(os.path.join(root, rel), os.path.join(out, rel))

    sources = [os.path.join(root, f) for f in files if f.startswith("src/") and f.endswith(".cpp")
               and not f.endswith("/cuda_device.cpp")]  # needs CUDA headers; includes nothing else bundled
    sources.append(os.path.join(root, "cmake", "boost_json_src.cpp"))
    used = set()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for headers in pool.map(lambda s: headers_of(root, s), sources):
            used |= headers
    used = {h for h in used if include_relative(h)}
    pkg_of = owners(used)
    unowned = sorted(h for h in used if h not in pkg_of)
    if unowned:
        raise SystemExit("headers that no Debian package owns (install them from packages): " + " ".join(unowned[:20]))

    packages = sorted({p for p in pkg_of.values() if not p.startswith(SYSTEM_PACKAGES)})
    inc = os.path.join(out, "third_party", "include")
    copied = 0
    for pkg in packages:
        listed = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=True).stdout.split("\n")
        if pkg.startswith("libboost"):
            # Boost per library: boost/<lib>/... and boost/<lib>.hpp for each
            # library folder a used header lives in; used top-level files.
            libs = set()
            for h in used:
                rel = include_relative(h)
                if pkg_of.get(h) == pkg and rel.startswith("boost/"):
                    parts = rel.split("/")
                    libs.add(parts[1] if len(parts) > 2 else rel)
            keep = lambda rel: rel.startswith("boost/") and (
                rel in libs or rel.split("/")[1] in libs or rel.split("/")[1].removesuffix(".hpp") in libs)
        else:
            keep = lambda rel: True
        for path in listed:
            rel = include_relative(path)
            if rel and os.path.isfile(path) and keep(rel):
                copy(path, os.path.join(inc, rel))
                copied += 1

    lib = os.path.join(out, "third_party", "lib")
    os.makedirs(lib, exist_ok=True)
    for name in STATIC_LIBS:
        copy(os.path.join("/usr/lib/x86_64-linux-gnu", name), os.path.join(lib, name))

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip()
    versions = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *packages],
                              capture_output=True, text=True).stdout
    with open(os.path.join(out, "third_party", "BUNDLE.txt"), "w") as f:
        f.write(f"vramgate bundle for scripts/gpu-check run\ncommit {commit}{' + uncommitted changes' if dirty else ''}\n"
                f"made {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n\nheaders from Debian packages:\n{versions}"
                f"\nstatic libraries: {', '.join(STATIC_LIBS)}\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    print(f"gpu-check prepare: {out}: {len(files)} project files, {copied} headers from {len(packages)} packages "
          f"({', '.join(packages)}), {len(STATIC_LIBS)} static libraries, {size / 1e6:.1f} MB, "
          f"{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
