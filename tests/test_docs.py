"""Each fact of the docs has one home, and the homes stay true to the code.

- The config groups and their options are listed once, in docs/configuration.md, and exactly
  as ``conf/`` holds them; README.md links there instead of keeping a second table.
- Every metric key the code logs under the workbench's own prefixes is in docs/tracking.md's
  metric table, and no other page repeats that list.
- docs/benchmarks.md's contents list is its ``##`` sections, in order.
- Every relative link of README.md, SECURITY.md, experiments/README.md and docs/ (its folders
  too) reaches a file of the repository, and a ``#anchor`` into a Markdown file one of its
  headings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "experiments" / "README.md",
         *sorted(DOCS.rglob("*.md"))]
GROUP_HEADER = re.compile(r"^\|\s*group\s*\|\s*options\s*\|", re.MULTILINE)

pytestmark = pytest.mark.unit


def conf_groups() -> dict[str, set[str]]:
    """Each folder of conf/ with the options (YAML files) it holds."""
    return {d.name: {f.stem for f in d.glob("*.yaml")} for d in CONF.iterdir()
            if d.is_dir() and any(d.glob("*.yaml"))}


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a Markdown page."""
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found, f"no '## {heading}' section"
    return found.group(1)


def table_rows(text: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows (header and rule left out)."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[2:]]


def test_group_table_lists_every_group_and_option_of_conf() -> None:
    groups = section((DOCS / "configuration.md").read_text(), "Groups")
    listed = {}
    for cells in table_rows(groups):
        group = cells[0].strip("`")
        assert group not in listed, f"group {group} listed twice"
        listed[group] = set(re.findall(r"`([^`]+)`", cells[1]))
    assert listed == conf_groups()


def test_group_table_has_one_home() -> None:
    homes = [page.relative_to(ROOT).as_posix() for page in PAGES
             if GROUP_HEADER.search(page.read_text())]
    assert homes == ["docs/configuration.md"]
    readme = (ROOT / "README.md").read_text()
    assert "docs/configuration.md#groups" in readme
    assert not re.search(r"^\| `env` \|", readme, re.MULTILINE)


def logged_keys() -> set[str]:
    """Metric keys the workbench itself logs: string literals under its own prefixes."""
    pattern = re.compile(r"[\"']((?:time|eval|summary|trial|video|system)/[a-z_0-9]+)[\"']")
    keys = set()
    for path in (ROOT / "lib" / "workbench").rglob("*.py"):
        keys |= set(pattern.findall(path.read_text()))
    return keys


def test_metric_table_lists_every_key_the_workbench_logs() -> None:
    table = section((DOCS / "tracking.md").read_text(), "Metrics")
    keys = logged_keys()
    assert {"time/rollout_cpu_s", "system/process_tree_memory_mb", "video/render_seconds",
            "trial/train_s", "summary/peak_rss_mb"} <= keys  # the scan finds them
    missing = sorted(key for key in keys  # per-GPU keys are listed as gpu_<i>
                     if f"`{re.sub(r'gpu_[0-9]+_', 'gpu_<i>_', key)}`" not in table)
    assert not missing, f"logged but not in docs/tracking.md#metrics: {missing}"


def test_metric_list_has_one_home() -> None:
    table = section((DOCS / "tracking.md").read_text(), "Metrics")
    keys = set(re.findall(r"`((?:rollout|train|time|eval|summary|system)/[a-z_0-9]+)`", table))
    assert len(keys) >= 30
    for page in PAGES:
        if page == DOCS / "tracking.md":
            continue
        text = page.read_text()
        repeated = sorted(key for key in keys if f"`{key}`" in text)
        # A page may name the keys it is about (a diagnostic, a figure), not a third of the list.
        assert len(repeated) < len(keys) / 3, (
            f"{page.relative_to(ROOT)} repeats the metric list of docs/tracking.md: {repeated}")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return re.findall(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE)


def test_benchmarks_contents_list_every_section() -> None:
    page = DOCS / "benchmarks.md"
    text = page.read_text()
    contents = re.findall(r"^- \[(.+)\]\(#(.+)\)$", text.split("\n## ", 1)[0], re.MULTILINE)
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert [title for title, _ in contents] == sections
    assert [anchor for _, anchor in contents] == [slug(s) for s in sections]


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in links(page):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        outside = not target.exists() or ROOT not in (target, *target.parents)
        if outside or (anchor and target.suffix == ".md"
                       and anchor not in map(slug, headings(target))):
            broken.append(link)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_doc_references_in_conf_and_code_resolve() -> None:
    """``docs/PAGE.md#anchor`` in conf/ comments and lib/ docstrings names a real section."""
    sources = [*CONF.rglob("*.yaml"), *(ROOT / "lib" / "workbench").rglob("*.py")]
    broken, seen = [], 0
    for source in sources:
        for page, anchor in re.findall(r"\b(docs/[\w/-]+\.md)(?:#([\w-]+))?", source.read_text()):
            seen += 1
            target = ROOT / page
            if not target.is_file() or (anchor and anchor not in map(slug, headings(target))):
                broken.append(f"{source.relative_to(ROOT)}: {page}#{anchor}")
    assert seen >= 10, seen
    assert not broken, broken


def test_the_torch_version_is_written_once_in_the_docs() -> None:
    """README names the pinned torch (scripts/torch_build.py's TORCH_VERSION); every other
    page refers to it instead of writing it again, so a torch upgrade edits one line."""
    pin = re.search(r'^TORCH_VERSION = "([^"]+)"$',
                    (ROOT / "scripts" / "torch_build.py").read_text(), re.M)
    assert pin, "scripts/torch_build.py: no TORCH_VERSION"
    assert f"torch {pin.group(1)}" in (ROOT / "README.md").read_text()
    repeated = [p.relative_to(ROOT).as_posix() for p in PAGES[1:]
                if pin.group(1) in p.read_text()]
    assert repeated == []


def render_docs() -> Any:
    """scripts/render_docs.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_docs",
                                                  ROOT / "scripts" / "render_docs.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_generated_blocks_match_their_sources(capsys: pytest.CaptureFixture[str]) -> None:
    """Every table of figures is its committed results file, the module map and the package
    docstrings' lists every module (scripts/render_docs.py rewrites them)."""
    assert render_docs().main(["--check"]) == 0, capsys.readouterr().err
    assert "<!-- generated: modules -->" in (DOCS / "architecture.md").read_text()


def test_a_table_says_where_each_figure_was_measured(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's own provenance wins over its file's; rows from several measurements list
    each; a cell taken from another table is that table's figure, with its command."""
    script = render_docs()
    monkeypatch.setattr(script, "REFERENCE", tmp_path)
    machine = {"description": "the test machine"}
    (tmp_path / "runs.json").write_text(json.dumps({
        "command": "bench a", "commit": "abc", "date": "2026-01-01", "machine": machine,
        "tables": {
            "speed": {"headers": ["task", "steps/s"], "rows": [["Hopper", "4,660"]],
                      "command": "bench b", "date": "2026-01-02"},
            "returns": {"headers": ["task", "return"], "rows": [["Hopper", "3423"]],
                        "sources": [{"label": "Hopper", "command": "bench c",
                                     "date": "2026-01-03", "commit": "def"}]}}}))
    (tmp_path / "glance.json").write_text(json.dumps({
        "command": "-", "commit": "-", "date": "-", "machine": machine,
        "tables": {"rows": {"headers": ["task", "steps/s", "return", "measured"], "rows": [[
            "Hopper", {"ref": "runs/speed", "row": "Hopper", "column": "steps/s"},
            {"ref": "runs/returns", "row": "Hopper", "column": "return"},
            [{"ref": "runs/speed", "field": "date"}, ", ",
             {"ref": "runs/speed", "field": "commit"}]]]}}}))

    assert script.table("runs/speed").endswith(
        "Measured by `bench b` on the test machine, 2026-01-02, commit abc.\n")
    assert "- Hopper: `bench c` (2026-01-03, commit def).\n" in script.table("runs/returns")
    glance = script.table("glance/rows")
    assert "| Hopper | 4,660 | 3423 | 2026-01-02, abc |" in glance
    assert glance.endswith("Measured on the test machine:\n\n- Hopper: `bench b`; `bench c`.\n")
    bad = {"ref": "runs/speed", "row": "Walker2d", "column": "steps/s"}
    with pytest.raises(script.RenderError, match="no single row 'Walker2d'"):
        script.text(bad)
