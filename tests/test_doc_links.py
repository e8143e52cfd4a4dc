"""The docs point only at what exists in this repository: every relative link resolves, every
source path they name (`runtime/agent/rounds.py`, `tenplex/cli/`) exists, and none points at a
file outside the repository."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "examples" / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
SOURCE_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]*?(?:\.py|/))(?::\w+)?`")
OUTSIDE = re.compile(r"(?:^|[\s(`\"'])\.\./|/work/|shared/|DESIGN\.md")
KNOWN_OUTPUTS = ("bench/results/", "experiments/results/", "demo-out/")  # written by runs, not tracked
UPSTREAM = ("conventions.md", "reference-tenplex.md", "dataset.md")  # name other projects' files


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = [t for t in LINK.findall(doc.read_text()) if "://" not in t and not (doc.parent / t).exists()]
    assert not broken, f"{doc.relative_to(ROOT)}: links to missing files {broken}"


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name not in UPSTREAM], ids=lambda p: str(p.relative_to(ROOT)))
def test_named_source_paths_exist(doc):
    missing = []
    for path in SOURCE_PATH.findall(doc.read_text()):
        if "://" in path or path.startswith(KNOWN_OUTPUTS) or "<" in path:
            continue
        if not any((base / path).exists() for base in (ROOT, ROOT / "tenplex", doc.parent)):
            missing.append(path)
    assert not missing, f"{doc.relative_to(ROOT)}: names paths that do not exist {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(doc):
    lines = [f"{i}: {line.strip()[:80]}" for i, line in enumerate(doc.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not lines, f"{doc.relative_to(ROOT)}: points outside the repository: {lines}"
