"""What differs between two runs' environments and configs: ``workbench manifest diff``.

A manifest comes from a run id of the configured store or a ``manifest.json`` path; the
comparison covers the environment facts (:func:`comparable`: packages, OS, hardware, CUDA,
git, the run's recorded environment variables), the run's inputs (each robot and dataset file
by path: a changed mesh shows as ``inputs  robot.files.<path>.sha256``) and, where both
sides carry one, the resolved config. Rendered as aligned text, JSON or Markdown (reports).
The ``manifest`` command's parser lives here too, with ``manifest lock``
(``manifest_lock.py``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError, flatten, load_config
from workbench.console import printable, printable_lines
from workbench.tracking.redaction import (
    redact_uri,
)
from workbench.tracking.store import check_store, is_embedded, resolve_tracking_uri

if TYPE_CHECKING:
    import argparse

from workbench.tracking.manifest import (
    INPUT_KEYS_NOT_COMPARED,
    MANIFEST_FILE,
    REQUIRED_KEYS,
    RUN_KEYS_COMPARED,
    collect_manifest,
    normalize_name,
    to_json,
)
from workbench.tracking.manifest_lock import lock_requirements


class _Missing:
    """Marks a fact one side of a diff does not have (distinct from a recorded null)."""

    def __repr__(self) -> str:
        return "-"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Difference:
    """One fact that differs between two runs (``MISSING`` where one side lacks it)."""

    section: str
    key: str
    a: Any
    b: Any


@dataclass
class ManifestSource:
    """A manifest to compare, with the resolved config it ran (flattened, values as text)."""

    label: str
    manifest: dict[str, Any]
    config: dict[str, str] | None


def comparable(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's environment facts as ``{"section.key": value}`` for comparison.

    ``created_at`` and the per-invocation run details (command, cwd, run id) are left out;
    ``pip_freeze`` is compared per package, without repeating the headline ``packages``;
    ``inputs`` file by file (``inputs.robot.files.<path>.sha256``), without where this
    machine keeps them (``local_dir``). A manifest recorded before inputs were has none.
    """
    flat: dict[str, Any] = {}
    for section in ("python", "packages", "os", "hardware", "cuda", "git"):
        flat.update(_flatten(manifest.get(section, {}), f"{section}."))
    packages = manifest.get("packages")
    headline = {normalize_name(p) for p in packages if isinstance(p, str)} if isinstance(
        packages, Mapping) else set()
    flat.update(freeze_versions(manifest.get("pip_freeze", []), headline))
    run = manifest.get("run", {})
    if not isinstance(run, Mapping):  # not what a workbench writes: compared as it is
        run = {key: run for key in RUN_KEYS_COMPARED}
    for key in RUN_KEYS_COMPARED:
        flat.update(_flatten({key: run.get(key)}, "run."))
    inputs = manifest.get("inputs") or {}
    if not isinstance(inputs, Mapping):  # not what a workbench writes: compared as it is
        flat["inputs"] = inputs
        return flat
    for kind, record in inputs.items():
        if isinstance(record, Mapping):
            record = {k: v for k, v in record.items() if k not in INPUT_KEYS_NOT_COMPARED}
        flat.update(_flatten({kind: record}, "inputs."))
    return flat


def freeze_versions(freeze: Any, headline: set[str]) -> dict[str, Any]:
    """``pip_freeze`` as ``{"pip_freeze.<name>": version}``, leaving out the packages the
    headline lists. A manifest is data: entries that are not ``name==version`` text (a
    number, an object, null) are compared as they are, by position (``pip_freeze.#3``), and
    a ``pip_freeze`` that is not a list as a whole."""
    if not isinstance(freeze, list):
        return {"pip_freeze": freeze}
    flat: dict[str, Any] = {}
    for index, line in enumerate(freeze):
        if not isinstance(line, str):
            flat[f"pip_freeze.#{index}"] = line
            continue
        name, _, version = line.partition("==")
        if normalize_name(name) not in headline:
            flat[f"pip_freeze.{normalize_name(name)}"] = version
    return flat


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        flat: dict[str, Any] = {}
        for k, v in value.items():
            flat.update(_flatten(v, f"{prefix}{k}."))
        return flat
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        flat = {}
        for i, v in enumerate(value):
            flat.update(_flatten(v, f"{prefix}{i}."))
        return flat
    return {prefix.rstrip("."): value}


def diff_manifests(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """Environment differences between two manifests, in schema order."""
    return _diff_flat(comparable(a), comparable(b), section_of=lambda k: k.split(".", 1)[0])


def diff_configs(a: Mapping[str, str], b: Mapping[str, str]) -> list[Difference]:
    """Differences of two flattened configs by key name (``derived.*`` only when both sides
    have them: a manifest file's sibling config.yaml has none, a run's params do)."""
    if not (_has_derived(a) and _has_derived(b)):
        a = {k: v for k, v in a.items() if not k.startswith("derived.")}
        b = {k: v for k, v in b.items() if not k.startswith("derived.")}
    return _diff_flat(dict(sorted(a.items())), dict(sorted(b.items())),
                      section_of=lambda k: "config")


def _has_derived(flat: Mapping[str, str]) -> bool:
    return any(k.startswith("derived.") for k in flat)


def _diff_flat(
    a: dict[str, Any], b: dict[str, Any], section_of: Callable[[str], str]
) -> list[Difference]:
    keys = list(a) + [k for k in b if k not in a]
    out = []
    for key in keys:
        va, vb = a.get(key, MISSING), b.get(key, MISSING)
        if va != vb:
            section = section_of(key)
            short = key[len(section) + 1 :] if key.startswith(f"{section}.") else key
            out.append(Difference(section, short, va, vb))
    return out


def diff_sources(a: ManifestSource, b: ManifestSource) -> list[Difference]:
    """Environment and, where both sides carry one, config differences."""
    diffs = diff_manifests(a.manifest, b.manifest)
    if a.config is not None and b.config is not None:
        diffs += diff_configs(a.config, b.config)
    return diffs


def flat_config_text(tree: Mapping[str, Any]) -> dict[str, str]:
    """A nested config as ``{"dotted.key": str(value)}``, comparable with MLflow params."""
    return {k: str(v) for k, v in flatten(tree).items()}


def load_source(ref: str, store_uri: Callable[[], str]) -> ManifestSource:
    """A manifest from a path (file, or a folder holding manifest.json) or a run id.

    A file's sibling ``config.yaml`` (run artifact folders and ``model/`` have one) gives its
    config; a run's config comes from its params. Raises ``ConfigError`` (exit 2) on a ref
    that is neither.
    """
    path = Path(ref)
    if path.is_dir():
        path = path / MANIFEST_FILE
    if path.is_file():
        return _source_from_file(path)
    if path.suffix == ".json" or os.sep in ref:
        raise ConfigError(f"{ref}: no such manifest file; pass a run id or a manifest.json path")
    return _source_from_run(ref, store_uri())


def _source_from_file(path: Path) -> ManifestSource:
    import yaml

    try:
        manifest = parse_manifest(path.read_text(), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not readable as JSON ({exc}); pass a manifest.json") from exc
    _check_is_manifest(manifest, str(path))
    config_file = path.with_name("config.yaml")
    config = None
    if config_file.is_file():
        tree = yaml.safe_load(config_file.read_text())
        config = flat_config_text(tree) if isinstance(tree, dict) else None
    return ManifestSource(str(path), manifest, config)


# A manifest nests four levels (hardware.gpus[i].name); deeper JSON is not one, and would
# exhaust the recursion of the JSON decoder or of the comparison.
MAX_MANIFEST_DEPTH = 16


def parse_manifest(text: str, label: str) -> Any:
    """JSON text as a manifest candidate: valid JSON nested at most :data:`MAX_MANIFEST_DEPTH`."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(f"{printable(label)}: not readable as JSON ({reason}); pass a "
                          "manifest.json") from None
    if nesting_depth(value) > MAX_MANIFEST_DEPTH:
        raise ConfigError(f"{printable(label)}: not a workbench manifest (nested deeper than "
                          f"{MAX_MANIFEST_DEPTH} levels); pass a run's manifest.json")
    return value


def nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest in a JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _check_is_manifest(manifest: Any, label: str) -> None:

    missing = [k for k in REQUIRED_KEYS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise ConfigError(
            f"{label}: not a workbench manifest (missing {', '.join(missing)}); "
            "pass a run's manifest.json"
        )


def _source_from_run(run_id: str, uri: str) -> ManifestSource:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    shown = redact_uri(uri)
    if is_embedded(uri) and not Path(uri.removeprefix("sqlite:///")).is_file():
        # Asking a missing SQLite store would create an empty one: refuse before touching it.
        raise ConfigError(
            f"{run_id}: not a file, and there is no MLflow store at {shown}; pass a "
            "manifest.json path, or point MLFLOW_TRACKING_URI / tracking.uri at the store"
        )
    check_store(uri)  # a server that does not answer, a corrupt file: one line
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "UNAUTHENTICATED":  # a team server without a valid login
            raise ConfigError(
                f"tracking server {shown}: the login is missing or was refused (401); export "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD of your account"
            ) from None
        raise ConfigError(
            f"{run_id}: no such run in {shown} and no such file; pass a run id "
            "(workbench train prints it) or a manifest.json path"
        ) from exc
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = client.download_artifacts(run_id, MANIFEST_FILE, tmp)
        except (MlflowException, OSError) as exc:
            raise ConfigError(
                f"run {run_id} has no {MANIFEST_FILE} (recorded before manifests existed?); "
                "diff needs a manifest on both sides"
            ) from exc
        manifest = parse_manifest(Path(local).read_text(), f"run {run_id}")
    _check_is_manifest(manifest, f"run {run_id}")
    label = f"run {run_id} ({run.info.run_name})"
    return ManifestSource(label, manifest, dict(run.data.params))


def diff_cell(value: Any) -> str:
    """A fact as one table cell: missing as "-", None as "null", pipes escaped."""
    if value is MISSING:
        return "-"
    if value is None:
        return "null"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(diff_cell(v) for v in row) + " |" for row in rows]
    return lines


def render_markdown(manifest: Mapping[str, Any]) -> str:
    """A readable Markdown page: one table per section (pip freeze only counted)."""
    lines = [f"# Environment manifest ({manifest['created_at']})", ""]
    titles = {"python": "Python", "packages": "Packages", "os": "Operating system",
              "cuda": "CUDA", "git": "Git", "run": "Run"}
    for section in ("python", "packages", "os"):
        lines += [f"## {titles[section]}", "", *_md_table(("key", "value"),
                  list(manifest[section].items())), ""]
    hardware = {k: v for k, v in manifest["hardware"].items() if k != "gpus"}
    if hardware.get("memory_bytes"):
        hardware["memory_bytes"] = f"{hardware['memory_bytes'] / 2**30:.1f} GiB"
    lines += ["## Hardware", "", *_md_table(("key", "value"), list(hardware.items())), ""]
    gpus = manifest["hardware"]["gpus"]
    gpu_rows = [(g["index"], g["name"], f"{g['memory_bytes'] / 2**30:.1f} GiB", g["driver"],
                 g["compute_capability"]) for g in gpus]
    lines += ["### GPUs", ""]
    lines += (_md_table(("#", "name", "memory", "driver", "compute capability"), gpu_rows)
              if gpus else ["none"])
    lines.append("")
    for section in ("cuda", "git", "run"):
        rows = [(k, v) for k, v in manifest[section].items()]
        lines += [f"## {titles[section]}", "", *_md_table(("key", "value"), rows), ""]
    input_table = input_rows(manifest.get("inputs") or {})
    lines += ["## Inputs", "", *(_md_table(("input", "file", "sha256", "bytes"), input_table)
                                 if input_table else ["none"]), ""]
    lines.append(f"pip freeze: {len(manifest['pip_freeze'])} distributions (in the JSON form).")
    return "\n".join(lines) + "\n"


def input_rows(inputs: Mapping[str, Any]) -> list[tuple[str, str, str, Any]]:
    """One row per input file: kind, path, SHA-256 (first 16 hex digits), size."""
    rows: list[tuple[str, str, str, Any]] = []
    for kind, record in inputs.items() if isinstance(inputs, Mapping) else ():
        files = record.get("files") if isinstance(record, Mapping) else None
        for path, fact in (files or {}).items():
            if isinstance(fact, Mapping):
                rows.append((kind, str(path), str(fact.get("sha256"))[:16], fact.get("size")))
    return rows


def render_diff_text(diffs: Sequence[Difference], a: str, b: str) -> str:
    """Aligned columns for a terminal; the last line counts differences per section."""
    head = [f"A: {a}", f"B: {b}"]
    if not diffs:
        return "\n".join([*head, "identical: no differences in packages, OS, hardware, CUDA, "
                          "git, inputs or config"]) + "\n"
    rows = [("section", "key", "A", "B")] + [
        (d.section, d.key, diff_cell(d.a), diff_cell(d.b)) for d in diffs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    body = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    counts: dict[str, int] = {}
    for d in diffs:
        counts[d.section] = counts.get(d.section, 0) + 1
    summary = ", ".join(f"{s} {n}" for s, n in counts.items())
    return "\n".join([*head, "", *body, "", f"{len(diffs)} differences: {summary}"]) + "\n"


def render_diff_markdown(diffs: Sequence[Difference], a: str, b: str) -> str:
    """The differences as a Markdown table (for reports)."""
    lines = [f"A: {diff_cell(a)}  ", f"B: {diff_cell(b)}", ""]
    if not diffs:
        return "\n".join([*lines, "identical"]) + "\n"
    rows = [(d.section, d.key, d.a, d.b) for d in diffs]
    return "\n".join([*lines, *_md_table(("section", "key", "A", "B"), rows)]) + "\n"


def diff_to_json(diffs: Sequence[Difference], a: str, b: str) -> str:
    """The differences as JSON (``null`` for a missing side)."""
    def plain(v: Any) -> Any:
        return None if v is MISSING else v

    items = [{"section": d.section, "key": d.key, "a": plain(d.a), "b": plain(d.b)}
             for d in diffs]
    return json.dumps({"a": a, "b": b, "identical": not diffs, "differences": items},
                      indent=2, default=str) + "\n"


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``workbench manifest [--format json|md]``, ``manifest diff A B``, ``manifest lock RUN``."""
    parser.add_argument("--format", choices=("json", "md"), default="json",
                        help="json (default) or md, a readable table")
    sub = parser.add_subparsers(dest="manifest_command", metavar="{diff,lock}")
    diff = sub.add_parser(
        "diff", help="what differs between two runs (exit 0 identical, 1 different)",
        description="Compare two runs' manifests and configs. RUN is a run id in the "
        "configured store or a path to a manifest.json (or the folder holding one). "
        "Exit codes: 0 identical, 1 different, 2 bad id/path.",
    )
    diff.add_argument("run_a", metavar="RUN_A")
    diff.add_argument("run_b", metavar="RUN_B")
    diff.add_argument("--format", choices=("text", "json", "md"), default="text")
    diff.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                      help="Hydra overrides selecting the store, e.g. tracking.uri=...")
    lock = sub.add_parser(
        "lock", help="a requirements file that recreates a run's environment",
        description="Write the pip requirements of a recorded run (its manifest's pip freeze, "
        "torch's build with its index, the workbench itself left out), to stdout or -o FILE. "
        "RUN is a run id in the configured store or a path to a manifest.json.",
    )
    lock.add_argument("run", metavar="RUN")
    lock.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    lock.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                      help="Hydra overrides selecting the store, e.g. tracking.uri=...")


def run_command(args: argparse.Namespace) -> int:
    """``workbench manifest``: this machine's manifest, a diff of two runs, or a run's lock."""
    if args.manifest_command not in ("diff", "lock"):
        manifest = collect_manifest()
        print(render_markdown(manifest) if args.format == "md" else to_json(manifest), end="")
        return 0

    @functools.cache
    def store_uri() -> str:  # resolved only when a ref is a run id, and only once

        if os.environ.get("MLFLOW_TRACKING_URI") and not args.overrides:
            return os.environ["MLFLOW_TRACKING_URI"]  # it wins anyway; skip composing
        return resolve_tracking_uri(load_config(args.overrides).tracking.uri)

    if args.manifest_command == "lock":
        return write_lock(args.run, args.output, store_uri)
    a = load_source(args.run_a, store_uri)
    b = load_source(args.run_b, store_uri)
    diffs = diff_sources(a, b)
    render = {"text": render_diff_text, "json": diff_to_json, "md": render_diff_markdown}
    print(printable_lines(render[args.format](diffs, a.label, b.label)), end="")
    return 1 if diffs else 0


def write_lock(ref: str, output: str | None, store_uri: Callable[[], str]) -> int:
    """``manifest lock RUN [-o FILE]``: the run's requirements to stdout or ``output``.

    Exit code 1 when the manifest's ``pip_freeze`` held entries that are not ``name==version``
    pins (the workbench records none; the store's copy was changed): they are left out of the
    file, which is still written, and listed in one line on stderr, so that
    ``workbench manifest lock RUN -o FILE && pip install -r FILE`` stops there.
    """
    target = Path(output) if output else None
    if target is not None and (target.is_dir() or not target.parent.is_dir()):
        raise ConfigError(f"-o {output}: not a file in an existing folder; pass e.g. "
                          "-o requirements-run.txt")
    source = load_source(ref, store_uri)
    label = printable(source.label)
    lock = lock_requirements(source.manifest, label)
    if target is None:
        print(lock.text, end="")
    else:
        target.write_text(lock.text)
        print(f"wrote {target}: {lock.pinned} pinned packages for {label}")
    if lock.dropped:
        listed = ", ".join(repr(entry) for entry in lock.dropped[:5])
        more = f" and {len(lock.dropped) - 5} more" if len(lock.dropped) > 5 else ""
        print(f"workbench: manifest lock: left out {len(lock.dropped)} pip_freeze entries of "
              f"{label} that are not name==version pins: {listed}{more}; the workbench "
              "records only pins, so that manifest was changed after the run: check where "
              "the run comes from before installing anything from it", file=sys.stderr)
        return 1
    return 0
