"""Fill the generated blocks of the docs from their sources: results are data, pages a view.

A generated block is everything between two marker lines::

    <!-- generated: NAME -->
    ...
    <!-- end generated: NAME -->

in a page under ``docs/`` (or README.md), or in a package's ``__init__.py`` docstring. NAME
says what fills it:

- ``table:FILE/TABLE``: the table ``TABLE`` of the committed results file
  ``benchmarks/reference/FILE.json`` (``{"tables": {TABLE: {"headers": [...], "rows":
  [[...]], "notes": "..."}}}``, with the ``command``, ``commit``, ``date`` and ``machine``
  every benchmark writes through ``benchmarks/harness.py``; a machine without a ``cpu`` is
  named by its ``description``), and under it its ``notes`` and a sentence naming the
  command, the machine, the date and the commit. A table measured apart from the rest of
  its file carries its own ``command``, ``commit``, ``date`` or ``machine``; one whose rows
  come from several measurements carries ``sources`` (``[{"label", "command", "date",
  "commit"}]``), listed under it instead of the sentence. A cell ``{"ref": "FILE/TABLE",
  "row": LABEL, "column": HEADER}`` is that cell of another table (its row whose first cell
  is LABEL), ``{"ref": "FILE/TABLE", "field": "date"}`` (or ``commit``, ``command``; with
  ``"row"``, that row's source's) where that table was measured, and a list of cells their
  texts joined: a figure shown twice has one home. Such a table lists each row's commands;
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


def found_table(name: str) -> dict[str, Any]:
    """The table ``FILE/TABLE``, with where it was measured (the file's ``command``,
    ``commit``, ``date`` and ``machine`` unless the table has its own)."""
    file, _, key = name.partition("/")
    data = reference(file)
    tables = data.get("tables") or {}
    if key not in tables:
        raise RenderError(f"benchmarks/reference/{file}.json: no table {key!r}; it has "
                          f"{', '.join(tables) or 'none'}")
    where = {k: data[k] for k in ("command", "commit", "date", "machine") if k in data}
    return {**where, **tables[key], "name": name}


def source_of(table: dict[str, Any], label: str) -> dict[str, Any]:
    """Where the row ``label`` of ``table`` was measured: its entry of ``sources``, else the
    table's own provenance."""
    for source in table.get("sources") or []:
        if source.get("label") == label:
            return {**table, **source}
    return table


def text(value: Any, used: list[dict[str, Any]] | None = None) -> str:
    """A cell's text; a reference resolved (and where it came from added to ``used``)."""
    if isinstance(value, list):
        return "".join(text(part, used) for part in value)
    if not isinstance(value, dict):
        return str(value)
    if "ref" not in value:
        raise RenderError(f"a cell {value!r}: neither text nor a reference")
    table = found_table(value["ref"])
    source = source_of(table, value["row"]) if "row" in value else table
    if used is not None:
        used.append(source)
    if "field" in value:
        return str(source[value["field"]])
    rows = [row for row in table["rows"] if text(row[0]) == value["row"]]
    if len(rows) != 1 or value["column"] not in table["headers"]:
        raise RenderError(f"{value['ref']}: no single row {value['row']!r} with a column "
                          f"{value['column']!r}")
    return text(rows[0][table["headers"].index(value["column"])])


def where(machine: dict[str, Any] | None) -> str:
    """The machine: its CPU and cores as the harness records them, or its description."""
    machine = machine or {}
    if not machine.get("cpu"):
        return str(machine.get("description", "an unrecorded machine"))
    cores = machine.get("logical_cores")
    return machine["cpu"] + (f", {cores} cores" if cores else "")


def provenance_line(data: dict[str, Any]) -> str:
    """``Measured by `command` on <cpu> (N cores), <date>, commit <sha>.``"""
    return (f"Measured by `{data['command']}` on {where(data.get('machine'))}, "
            f"{data['date']}, commit {data['commit']}.")


def measurement(source: dict[str, Any], dated: bool = True) -> str:
    """```command`` (date, commit sha)`` of one source."""
    when = ", ".join([*([source["date"]] if source.get("date") else []),
                      *([f"commit {source['commit']}"] if source.get("commit") else [])])
    return f"`{source['command']}`" + (f" ({when})" if when and dated else "")


def sources_list(found: dict[str, Any], per_row: list[tuple[str, list[dict[str, Any]]]]
                 ) -> list[str]:
    """Where the rows come from: one line; or its ``sources``, each with its date and
    commit; or, for a table that takes its figures from others, each row's commands (their
    dates and commits are on those tables, or in the row)."""
    dated = bool(found.get("sources"))
    if dated:
        per_row = [(s["label"], [s]) for s in found["sources"]]
    if not any(used for _, used in per_row):
        return [provenance_line(found)]
    lines = [f"Measured on {where(found.get('machine'))}:", ""]
    for label, used in per_row:
        unique = list({measurement(s, dated): s for s in used if s.get("command")})
        if unique:
            lines.append(f"- {label}: {'; '.join(unique)}.")
    return lines


def table(name: str) -> str:
    """A results file's table, its notes and where it came from."""
    found = found_table(name)
    lines = ["| " + " | ".join(cell(str(h)) for h in found["headers"]) + " |",
             "|" + "|".join("---" for _ in found["headers"]) + "|"]
    per_row = []
    for row in found["rows"]:
        used: list[dict[str, Any]] = []
        lines.append("| " + " | ".join(cell(text(c, used)) for c in row) + " |")
        per_row.append((text(row[0]), used))
    notes, where_from = found.get("notes"), sources_list(found, per_row)
    if notes and len(where_from) == 1:  # one paragraph: what was measured, then by what
        where_from = [f"{notes} {where_from[0]}"]
    elif notes:
        where_from = [notes, "", *where_from]
    return "\n".join([*lines, "", *where_from]) + "\n"


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
