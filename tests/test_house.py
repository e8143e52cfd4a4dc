"""The house rules that keep the folders honest (STYLE: small files, a package per concept, the
library apart from its show), checked on the source tree. The import layers and the absence of
import cycles are import-linter contracts in pyproject.toml (`make lint`)."""

import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "tenplex"
LINE_BUDGET = 300
SHOW = ("demo", "bench", "tests", "fixtures", "experiments")  # beside the library, never inside it


def _modules() -> list[Path]:
    return sorted(LIBRARY.rglob("*.py"))


def _packages() -> list[Path]:
    return sorted({p.parent for p in _modules()})


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_library_file_is_over_the_line_budget():
    over = {_rel(p): n for p in _modules() if (n := len(p.read_text().splitlines())) > LINE_BUDGET}
    assert not over, f"files over {LINE_BUDGET} lines (split them by responsibility): {over}"


@pytest.mark.parametrize("package", _packages(), ids=lambda p: _rel(p))
def test_every_package_names_what_it_holds(package):
    init = package / "__init__.py"
    assert init.is_file(), f"{_rel(package)}: no __init__.py"
    assert ast.get_docstring(ast.parse(init.read_text())), f"{_rel(init)}: no docstring saying what the package holds"


@pytest.mark.parametrize("package", _packages(), ids=lambda p: _rel(p))
def test_no_prefix_family_waits_to_become_a_package(package):
    stems = [p.stem for p in package.glob("*.py") if not p.stem.startswith("__")]
    prefixes = collections.Counter(s.split("_")[0] for s in stems if "_" in s.strip("_"))
    families = {k: sorted(s for s in stems if s.startswith(k + "_")) for k, n in prefixes.items() if n >= 2}
    assert not families, f"{_rel(package)}: module families {families}: make each a subpackage"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_library_never_imports_its_show():
    bad = {_rel(p): sorted(r & set(SHOW)) for p in _modules() if (r := _imported_roots(p)) & set(SHOW)}
    assert not bad, f"library modules import demos, benches, tests or fixtures: {bad}"


def test_the_rules_catch_what_they_claim(tmp_path):
    """The helpers above flag a made-up family and a made-up import of the show."""
    (tmp_path / "store_a.py").write_text("")
    (tmp_path / "store_b.py").write_text("import demo.main\n")
    stems = [p.stem for p in tmp_path.glob("*.py")]
    assert collections.Counter(s.split("_")[0] for s in stems)["store"] == 2
    assert _imported_roots(tmp_path / "store_b.py") == {"demo"}
