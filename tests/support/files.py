"""Files a test watches or plants: a tree's state, a checkpoint put back after a forgery,
refusals that must leave everything untouched, a pickle payload."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench import cli

from tests.trained_run import FinishedRun


class Marker:
    """A pickle payload that touches a file when unpickled: proof of code execution."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    if not root.exists():
        return {}
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file()}


@contextlib.contextmanager
def put_back(folder: Path) -> Iterator[Path]:
    """``folder`` for the block, its files put back as they were after it."""
    saved = {p.name: p.read_bytes() for p in folder.iterdir()}
    try:
        yield folder
    finally:
        for name, content in saved.items():
            (folder / name).write_bytes(content)


def rehash(folder: Path) -> None:
    """Recompute the checkpoint's SHA-256 index, as someone who can write the store would."""
    meta = json.loads((folder / "state.json").read_text())
    for name in meta["files"]:
        meta["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "state.json").write_text(json.dumps(meta))


def assert_refused_untouched(argv: list[str], run: FinishedRun, capsys: pytest.CaptureFixture[str],
                             *expected: str) -> None:
    """Exit 2, one ``workbench: error:`` line, nothing written, the run still FINISHED."""
    before = tree_state(run.experiments)
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("workbench: error: ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, err
    assert tree_state(run.experiments) == before, "a refused resume writes nothing"
    assert MlflowClient(run.uri).get_run(run.run_id).info.status == "FINISHED"
