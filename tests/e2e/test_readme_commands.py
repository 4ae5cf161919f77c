"""Every script that a command block of the README or of a page under docs/
runs by its path (bench/..., tools/..., scripts/...) is executable, and a
Python one starts with #!/usr/bin/python3 (Debian's Python, which has the
python3-* packages the scripts import). A fresh clone must not answer the
documentation with "Permission denied"."""
import glob
import os
import re

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
READMES = ["README.md", "models/tinylm/README.md", "tests/fuzz/README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
SCRIPT = re.compile(r"^(?:\$\s+)?((?:bench|tools|scripts)/[\w./-]+)")


def commands():
    """(readme, script) for each command line of each fenced block."""
    found = []
    for readme in READMES:
        path = os.path.join(ROOT, readme)
        if not os.path.exists(path):
            continue
        in_block = False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                in_block = not in_block
                continue
            if not in_block:
                continue
            for part in re.split(r"&&|;|\|", line.strip()):
                m = SCRIPT.match(part.strip())
                if m and not os.path.isdir(os.path.join(ROOT, m.group(1))):  # a folder in a layout listing
                    found.append((readme, m.group(1)))
    return sorted(set(found))


def test_the_readme_runs_scripts():
    scripts = {s for _, s in commands()}
    # The commands of the quick start (README.md) and of docs/benchmarks.md at least.
    for expected in ("scripts/quickstart", "scripts/test", "bench/loadgen.py", "bench/scenarios.py"):
        assert expected in scripts, sorted(scripts)
    readmes = {readme for readme, _ in commands()}
    assert {"README.md", "docs/benchmarks.md"} <= readmes, sorted(readmes)


@pytest.mark.parametrize("readme,script", commands())
def test_readme_script_is_executable(readme, script):
    path = os.path.join(ROOT, script)
    assert os.path.isfile(path), f"{readme} runs {script}, which does not exist"
    assert os.access(path, os.X_OK), f"{readme} runs {script}, which is not executable (git update-index --chmod=+x)"
    first = open(path, encoding="utf-8").readline().rstrip("\n")
    assert first.startswith("#!"), f"{script} has no #! line"
    if script.endswith(".py"):
        assert first == "#!/usr/bin/python3", f"{script} starts with {first!r}, not #!/usr/bin/python3"
