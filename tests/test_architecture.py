"""The house rules, enforced: one-way imports (import-linter contracts in pyproject.toml), no import cycles between
modules counting lazy (function-level) imports, mypy on the package, and one bucket vocabulary."""

from __future__ import annotations

import ast
import graphlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import traceanalyzer
from traceanalyzer.model.buckets import BUCKET_COLORS, BUCKETS, EXCLUSIVE_PRECEDENCE

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(traceanalyzer.__file__).resolve().parent


def _module_names(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name → (file, is a package ``__init__``) for every ``.py`` under ``package``."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an ``if TYPE_CHECKING:`` block (annotations only, never run)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module → modules of the same package it imports, at module level or inside functions (``TYPE_CHECKING``
    blocks aside). ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module."""
    modules = _module_names(package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.add(sub if sub in modules else module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (first module repeated at the end), or None."""
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_no_import_cycles_counting_lazy_imports() -> None:
    graph = import_graph(PACKAGE)
    assert "traceanalyzer.pipeline.summarize" in graph and graph["traceanalyzer.analysis.summary"]
    assert cycle(graph) is None, f"import cycle: {' -> '.join(cycle(graph) or [])}"


def test_cycle_check_sees_lazy_imports_and_skips_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n")
    assert import_graph(pkg) == {"pkg": set(), "pkg.sub": set(), "pkg.a": {"pkg.sub.b"}, "pkg.sub.b": set()}
    assert cycle(import_graph(pkg)) is None
    (pkg / "sub" / "b.py").write_text("def f() -> None:\n    from ..a import x\n")
    assert cycle(import_graph(pkg)) is not None


def _tool(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: pip install -e '.[test]' (the test extra brings it)")


def test_import_contracts_hold() -> None:
    _tool("importlinter")
    script = Path(sys.executable).with_name("lint-imports")
    cmd = [str(script)] if script.exists() else [sys.executable, "-c",
                                                 "import sys; from importlinter.cli import lint_imports_command; "
                                                 "sys.exit(lint_imports_command())"]
    run = subprocess.run([*cmd, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_mypy_passes_on_the_package() -> None:
    _tool("mypy")
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def _bucket_literals(path: Path) -> list[int]:
    """Lines of tuple/list/set/dict literals naming three or more buckets."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and items is not None:
            named = {i.value for i in items if isinstance(i, ast.Constant) and i.value in BUCKETS}
            if len(named) >= 3:
                lines.append(node.lineno)
    return lines


def test_buckets_are_declared_once() -> None:
    assert sorted(EXCLUSIVE_PRECEDENCE) == sorted(BUCKETS) == sorted(BUCKET_COLORS)
    spelled = {str(p.relative_to(PACKAGE)): lines for p in PACKAGE.rglob("*.py")
               if p != PACKAGE / "model" / "buckets.py" and (lines := _bucket_literals(p))}
    assert spelled == {}, f"bucket lists outside traceanalyzer/model/buckets.py: {spelled}"
    assert _bucket_literals(PACKAGE / "model" / "buckets.py") == [] and len(BUCKETS) >= 3  # built from BUCKET_TABLE


#: Small concepts with one home: name → the module (under traceanalyzer/) that defines it.
ONE_HOME = {"PathLike": "model/trace.py", "fmt_ns": "model/units.py", "fmt_ms": "model/units.py",
            "fmt_brief_ns": "model/units.py", "fmt_round_ns": "model/units.py", "fmt_pct": "model/units.py"}


def test_small_concepts_are_defined_once() -> None:
    homes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                if name in ONE_HOME:
                    homes.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    assert homes == {name: [home] for name, home in ONE_HOME.items()}
