"""scripts/lint keeps only the clang-format diagnostics on the lines a change wrote: clang-format
--lines also reports the other lines of a statement that spans a changed line."""
import importlib.machinery
import importlib.util
import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def load_lint():
    loader = importlib.machinery.SourceFileLoader("lint", os.path.join(ROOT, "scripts", "lint"))
    spec = importlib.util.spec_from_loader("lint", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


STDERR = (
    "src/x.cpp:41:99: error: code should be clang-formatted [-Wclang-format-violations]\n"
    '    {"a", "b",\n'
    "                                                                                                  ^\n"
    "src/x.cpp:97:12: error: code should be clang-formatted [-Wclang-format-violations]\n"
    "     int   y=1;\n"
    "           ^\n"
    "<stdin>:130:5: error: code should be clang-formatted [-Wclang-format-violations]\n"
    "  z;\n"
    "    ^\n"
)


def test_only_the_diagnostics_on_changed_lines_are_kept():
    kept = load_lint().on_lines(STDERR, [(96, 98)])
    assert "src/x.cpp:97:12" in kept and "int   y=1;" in kept
    assert ":41:" not in kept and ":130:" not in kept


def test_stdin_locations_count_and_no_ranges_keeps_everything():
    lint = load_lint()
    assert "<stdin>:130:5" in lint.on_lines(STDERR, [(130, 130)])
    assert lint.on_lines(STDERR, []) == STDERR
    assert lint.on_lines(STDERR, [(1, 2)]) == ""
