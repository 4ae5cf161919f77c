"""scripts/test: which presets it builds and which tests it asks ctest for.

The script runs from a copy in a temporary folder, with scripts/install-deps
and scripts/build replaced by stand-ins and a ctest on the PATH that only
records its arguments: nothing is installed, built or tested.
"""
import os
import shutil
import stat
import subprocess

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
UNIT_FILTER = "^(e2e|e2e_in_process|soak)$"


def stand_in(path, body):
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


@pytest.fixture
def tree(tmp_path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy2(os.path.join(ROOT, "scripts", "test"), scripts / "test")
    log = tmp_path / "calls.log"
    stand_in(scripts / "install-deps", f'echo "install-deps $*" >> {log}')
    stand_in(scripts / "build", f'echo "build $*" >> {log}')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir / "ctest", f'echo "ctest $*" >> {log}')
    return tmp_path, log, bin_dir


def run(tree, *stages):
    root, log, bin_dir = tree
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    out = subprocess.run([str(root / "scripts" / "test"), *stages], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return log.read_text().splitlines(), out.stdout


def test_the_default_run_is_the_ci_suite(tree):
    calls, out = run(tree)
    assert calls[0] == "install-deps --test"
    assert [c.split()[1] for c in calls if c.startswith("build")] == ["release", "tsan", "asan", "fuzz"]
    ctests = [c for c in calls if c.startswith("ctest")]
    assert [c.split()[2] for c in ctests] == ["release", "tsan", "asan", "fuzz"]
    assert not any(UNIT_FILTER in c for c in ctests)  # the release stage runs the end-to-end tests
    for stage in ("release", "tsan", "asan", "fuzz"):
        assert f"== {stage}: build " in out


def test_the_unit_stage_runs_the_release_build_without_end_to_end_tests(tree):
    calls, out = run(tree, "unit")
    assert calls == ["install-deps --test", "build release",
                     f"ctest --preset release -j 2 --timeout 1200 --no-tests=error --exclude-regex {UNIT_FILTER}"]
    assert "== unit: build " in out


def test_stages_run_in_the_order_given(tree):
    calls, _ = run(tree, "unit", "fuzz")
    assert [c.split()[1] for c in calls if c.startswith("build")] == ["release", "fuzz"]
