"""Every relative link of README.md and of the pages under docs/ resolves:
the file or folder it names exists, and a #fragment names a heading of the
page it points to (GitHub's anchors: lower case, punctuation dropped, spaces
as hyphens). Links inside fenced code blocks and to other sites are not
checked. Stdlib only, no build needed."""
import glob
import os
import re

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages():
    found = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [os.path.relpath(p, ROOT) for p in found]


def prose(path):
    """The lines of a Markdown file outside fenced code blocks."""
    fence = False
    for line in open(os.path.join(ROOT, path), encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            yield line


def anchor(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    return {anchor(line.lstrip("#")) for line in prose(path) if re.match(r"#{1,6} ", line)}


def links(path):
    return [m.group(1) for line in prose(path) for m in LINK.finditer(line)]


def test_the_docs_pages_are_there():
    assert "README.md" in pages()
    assert len(pages()) > 5, pages()


@pytest.mark.parametrize("page", pages())
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        if not os.path.exists(resolved):
            broken.append(f"{target}: no {os.path.relpath(resolved, ROOT)}")
        elif fragment and resolved.endswith(".md") and fragment not in anchors(os.path.relpath(resolved, ROOT)):
            broken.append(f"{target}: no heading #{fragment} in {os.path.relpath(resolved, ROOT)}")
    assert not broken, f"{page}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {os.path.normpath(t.partition("#")[0]) for t in links("README.md")}
    missing = [p for p in pages() if p != "README.md" and p not in linked]
    assert not missing, f"README.md does not link {missing}"
