"""The package's layers: import-linter's contracts hold, and no import cycle exists among the
workbench's modules even counting imports inside functions (which import-linter sees too, but
a cycle closed by one would only show up at run time)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from importlinter import configuration
from importlinter.application.use_cases import SUCCESS, lint_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lib" / "workbench"

pytestmark = pytest.mark.unit


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the workbench modules it imports anywhere (top level, functions, TYPE_CHECKING)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target not in (name, "workbench"):
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_even_through_function_local_imports() -> None:
    edges = import_graph()
    assert len(edges) > 50  # the scan sees the whole package
    assert cycles(edges) == []


def test_the_scan_finds_a_cycle_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_function_local_workbench_imports_only_in_the_cli() -> None:
    local: list[str] = []
    for path in PACKAGE.rglob("*.py"):
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                module = node.module if isinstance(node, ast.ImportFrom) else (
                    node.names[0].name if isinstance(node, ast.Import) else None)
                if module and module.startswith("workbench"):
                    local.append(f"{module_name(path)}: {module}")
    assert local and all(entry.startswith("workbench.cli:") for entry in local), local


def test_import_linter_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    configuration.configure()  # what the lint-imports command does before linting
    result = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_logo=True,
                          cache_dir=None)
    out = capsys.readouterr().out
    assert result == SUCCESS, out
    assert "5 kept, 0 broken" in out


def test_no_test_module_imports_another() -> None:
    """Shared test helpers live in tests/support/ (or the fixture modules beside conftest.py),
    so a test module's helpers are never another test module's import."""
    tests = ROOT / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                target = node.module.rsplit(".", 1)[-1]
                if target.startswith("test_"):
                    found.append(f"{path.relative_to(ROOT)}: from {node.module}")
    assert found == []
