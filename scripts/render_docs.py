"""Fill the generated blocks of the docs from their sources: results are data, pages a view.

A generated block is everything between two marker lines::

    <!-- generated: NAME -->
    ...
    <!-- end generated: NAME -->

in a page under ``docs/`` (or README.md), or in a package's ``__init__.py`` docstring. NAME
says what fills it:

- ``table:FILE/TABLE``: the table ``TABLE`` of the committed results file
  ``benchmarks/reference/FILE.json`` (``{"tables": {TABLE: {"headers": [...], "rows":
  [[...]], "notes": "..."}}}``, with the ``command``, ``commit`` and ``date`` every benchmark
  writes through ``benchmarks/harness.py``), and a line under it naming the command, the
  machine, the date and the commit;
- ``modules``: every module of ``lib/workbench`` with the first line of its docstring (the
  map in docs/architecture.md);
- ``package:NAME``: the modules of ``lib/workbench/NAME`` with their first lines (that
  package's docstring);
- ``tests``: the test count and the CI run's time, from ``benchmarks/reference/ci.json``.

    python scripts/render_docs.py           # rewrite every block that differs
    python scripts/render_docs.py --check   # exit 1 naming the blocks that differ

``tests/test_docs.py`` runs the check, so a page never shows a figure its results file does
not hold, and the map never misses a module.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lib" / "workbench"
REFERENCE = ROOT / "benchmarks" / "reference"
LINE_LENGTH = 100  # the code's (ruff): a package docstring's module list wraps there
BLOCK = re.compile(r"(?P<start>^[ \t]*<!-- generated: (?P<name>\S+) -->\n)(?P<body>.*?)"
                   r"(?P<end>^[ \t]*<!-- end generated: (?P=name) -->$)", re.M | re.S)


class RenderError(ValueError):
    """A block whose source is missing or malformed."""


# --------------------------------------------------------------------------- the sources


def first_line(path: Path) -> str:
    """A module's summary: the first sentence of its docstring's first paragraph (``""``
    without one), reST literals as Markdown's."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    sentence = re.split(r"(?<=[.!?])\s", paragraph, maxsplit=1)[0]
    return re.sub(r":\w+:`([^`]+)`", r"`\1`", sentence.replace("``", "`"))


def modules(package: Path) -> Iterator[tuple[str, Path]]:
    """``(name, path)`` of the modules and subpackages directly in ``package``, by name."""
    for path in sorted(package.iterdir()):
        if path.suffix == ".py" and path.name != "__init__.py":
            yield path.stem, path
        elif path.is_dir() and (path / "__init__.py").is_file():
            yield f"{path.name}/", path / "__init__.py"


def cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return text.replace("|", "\\|")


def module_map() -> str:
    """Every package of lib/workbench (its docstring's first line) and each of its modules
    (theirs), packages in the order of the layers, top first."""
    rows = []
    for package in [PACKAGE, *sorted(p for p in PACKAGE.rglob("*")
                                     if (p / "__init__.py").is_file())]:
        where = "top" if package == PACKAGE else f"`{package.relative_to(PACKAGE)}/`"
        if package != PACKAGE:
            rows.append(f"| **{where}** | | **{cell(first_line(package / '__init__.py'))}** |")
        for name, path in modules(package):
            if not name.endswith("/"):  # a subpackage has its own rows
                rows.append(f"| {where} | `{name}` | {cell(first_line(path))} |")
    return "\n".join(["| package | module | what it is |", "|---|---|---|", *rows]) + "\n"


def package_list(name: str, indent: str) -> str:
    """The modules of one package, one line each, for its docstring."""
    found = list(modules(PACKAGE / name))
    width = max(len(f"{n}.py" if not n.endswith("/") else n) for n, _ in found)
    lines = []
    for module, path in found:
        shown = module if module.endswith("/") else f"{module}.py"
        lines.append(textwrap.fill(first_line(path), LINE_LENGTH,
                                   initial_indent=f"{indent}{shown:<{width}}  ",
                                   subsequent_indent=indent + " " * (width + 2)))
    return "\n".join(lines) + "\n"


def reference(name: str) -> dict[str, Any]:
    """A committed results file."""
    path = REFERENCE / f"{name}.json"
    if not path.is_file():
        raise RenderError(f"{path.relative_to(ROOT)}: no such results file")
    loaded = json.loads(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def provenance_line(data: dict[str, Any]) -> str:
    """``Measured by `command` on <cpu> (N cores), <date>, commit <sha>.``"""
    machine = data.get("machine") or {}
    where = machine.get("cpu", "an unrecorded machine")
    if machine.get("logical_cores"):
        where += f", {machine['logical_cores']} cores"
    return (f"Measured by `{data['command']}` on {where}, {data['date']}, "
            f"commit {data['commit']}.")


def table(name: str) -> str:
    """A results file's table, its notes and where it came from."""
    file, _, key = name.partition("/")
    data = reference(file)
    tables = data.get("tables") or {}
    if key not in tables:
        raise RenderError(f"benchmarks/reference/{file}.json: no table {key!r}; it has "
                          f"{', '.join(tables) or 'none'}")
    found = tables[key]
    lines = ["| " + " | ".join(cell(str(h)) for h in found["headers"]) + " |",
             "|" + "|".join("---" for _ in found["headers"]) + "|"]
    lines += ["| " + " | ".join(cell(str(c)) for c in row) + " |" for row in found["rows"]]
    notes = found.get("notes")
    return "\n".join([*lines, "", *([notes, ""] if notes else []),
                      provenance_line(data)]) + "\n"


def tests_line() -> str:
    """The test count and the CI time, as the last measured clean-clone CI run gives them."""
    data = reference("ci")
    return (f"{data['tests']:,} tests; the whole `.ci/run` on a clean clone took "
            f"{data['ci_seconds'] / 60:.0f} min on {data['machine']['cpu']} "
            f"({data['machine']['logical_cores']} cores), {data['date']}, commit "
            f"{data['commit']}.\n")


def render(name: str, indent: str) -> str:
    """The body of the block ``name``."""
    makers: dict[str, Callable[[str], str]] = {
        "table": table, "package": lambda rest: package_list(rest, indent),
    }
    kind, _, rest = name.partition(":")
    if name == "modules":
        return module_map()
    if name == "tests":
        return tests_line()
    if kind not in makers or not rest:
        raise RenderError(f"generated block {name!r}: not table:FILE/TABLE, package:NAME, "
                          "modules or tests")
    return makers[kind](rest)


# --------------------------------------------------------------------------- the pages


def pages() -> list[Path]:
    """Every file that may hold generated blocks."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted(PACKAGE.rglob("__init__.py"))]


def rendered(text: str) -> str:
    """``text`` with every generated block filled anew."""
    def fill(match: re.Match[str]) -> str:
        indent = re.match(r"[ \t]*", match.group("start")).group(0)  # type: ignore[union-attr]
        return match.group("start") + render(match.group("name"), indent) + match.group("end")

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 naming the files whose blocks differ; write nothing")
    args = parser.parse_args(argv)
    stale = []
    try:
        for path in pages():
            text = path.read_text()
            if "<!-- generated: " not in text:
                continue
            new = rendered(text)
            if new != text:
                stale.append(path)
                if not args.check:
                    path.write_text(new)
    except RenderError as exc:
        print(f"render_docs: {exc}", file=sys.stderr)
        return 2
    for path in stale:
        verb = "differs from its sources" if args.check else "rewritten"
        print(f"render_docs: {path.relative_to(ROOT)} {verb}",
              file=sys.stderr if args.check else sys.stdout)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
