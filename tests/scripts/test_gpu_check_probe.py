"""scripts/gpu_check_probe.py: which CUDA include folder a GPU build uses.

A torch 2.x CUDA wheel brings nvidia/cu13/include with cuda_runtime.h and
cuda_runtime_api.h but without crt/host_config.h; building against it fails
with "crt/host_config.h: No such file or directory". These trees are laid
out in a temporary folder; no torch or CUDA is needed.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import gpu_check_probe as probe  # noqa: E402


def touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("/* stand-in */\n")


def wheel_include(root, complete):
    inc = os.path.join(root, "site-packages", "nvidia", "cu13", "include")
    touch(os.path.join(inc, "cuda_runtime.h"))
    touch(os.path.join(inc, "cuda_runtime_api.h"))
    if complete:
        touch(os.path.join(inc, "crt", "host_config.h"))
    return inc


def toolkit(root):
    home = os.path.join(root, "cuda-13.0")
    touch(os.path.join(home, "include", "cuda_runtime_api.h"))
    touch(os.path.join(home, "include", "crt", "host_config.h"))
    return home


def choose(tmp, environ):
    """The probe's choice with this machine's own /usr/local/cuda out of sight."""
    roots = [os.path.join(tmp, "site-packages")]
    homes = probe.toolkit_homes(environ, default=os.path.join(tmp, "usr-local-cuda"))
    return probe.choose_cuda_include(probe.include_candidates(homes, roots))


def test_an_incomplete_wheel_include_loses_to_the_toolkit(tmp_path):
    tmp = str(tmp_path)
    wheel_include(tmp, complete=False)
    home = toolkit(tmp)
    folder, why = choose(tmp, {"CUDA_HOME": home})
    assert folder == os.path.join(home, "include")
    assert why == ""


def test_the_toolkit_comes_first_even_beside_a_complete_wheel(tmp_path):
    tmp = str(tmp_path)
    wheel_include(tmp, complete=True)
    home = toolkit(tmp)
    assert choose(tmp, {"CUDA_PATH": home})[0] == os.path.join(home, "include")


def test_a_complete_wheel_include_serves_without_a_toolkit(tmp_path):
    tmp = str(tmp_path)
    inc = wheel_include(tmp, complete=True)
    folder, _ = choose(tmp, {"CUDA_HOME": os.path.join(tmp, "no-such-toolkit")})
    assert folder == inc


def test_only_incomplete_folders_name_what_is_missing(tmp_path):
    tmp = str(tmp_path)
    inc = wheel_include(tmp, complete=False)
    folder, why = choose(tmp, {"CUDA_HOME": os.path.join(tmp, "no-such-toolkit")})
    assert folder == ""
    assert "crt/host_config.h" in why and inc in why


def test_toolkit_homes_keep_order_without_repeats():
    homes = probe.toolkit_homes({"CUDA_HOME": "/opt/cuda", "CUDA_PATH": "/opt/cuda"})
    assert homes == ["/opt/cuda", "/usr/local/cuda"]
