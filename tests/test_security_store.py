"""A shared tracking store is data: what a run holds never runs as code.

A run in a team server, a copied store or a colleague's run comes from outside. Each case is
something someone with write access to the store could plant: a checkpoint whose config names
a module for gymnasium to import, a checkpoint whose arrays do not fit the network (hashes
recomputed), pickles in a run's ``model/`` folder, a manifest whose ``pip_freeze`` carries pip
options. A sentinel module (or pickle) that writes a marker file stands for an attacker's code.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from workbench import cli

from .test_bad_input import tree_state
from .trained_run import FinishedRun

CHECKPOINT = "checkpoints/step-000000000384"  # the finished run's last checkpoint


# --------------------------------------------------------------------------- helpers


@pytest.fixture()
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An importable module that writes a marker file when imported: (its name, the mark)."""
    modules, mark = tmp_path / "mods", tmp_path / "SENTINEL-IMPORTED"
    modules.mkdir()
    name = f"wb_sentinel_{tmp_path.name.replace('-', '_')}"
    (modules / f"{name}.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(modules))
    yield name, mark
    sys.modules.pop(name, None)


@pytest.fixture()
def planted(finished_run: FinishedRun, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The finished run's last checkpoint folder, put back as it was after the test."""
    finished_run.use(monkeypatch)
    folder = finished_run.artifacts() / CHECKPOINT
    saved = {p.name: p.read_bytes() for p in folder.iterdir()}
    yield folder
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


# --------------------------------------------------------------------------- resume


def test_resume_never_imports_a_module_the_checkpoint_names(
    finished_run: FinishedRun, planted: Path, sentinel: tuple[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, mark = sentinel
    text = (planted / "config.yaml").read_text()
    assert "id: HalfCheetah-v5" in text
    (planted / "config.yaml").write_text(text.replace("id: HalfCheetah-v5",
                                                      f"id: {name}:HalfCheetah-v5"))
    rehash(planted)
    resume = f"resume={finished_run.run_id}"
    assert_refused_untouched(
        ["train", resume], finished_run, capsys,
        f"{resume}: the checkpoint's env.id='{name}:HalfCheetah-v5' would import module "
        f"'{name}'", f"add env.id={name}:HalfCheetah-v5 to the command line if you trust")
    assert not mark.exists() and name not in sys.modules, "the store's module was imported"
    # Naming another env.id is no way around it: a resumed run keeps its configuration.
    assert_refused_untouched(["train", resume, "env.id=Hopper-v5"], finished_run, capsys,
                             "env.id: cannot be changed when resuming run")
    assert not mark.exists()
    # The user's own env.id= (the same id) is the explicit choice to import it.
    assert_refused_untouched(["train", resume, f"env.id={name}:HalfCheetah-v5"], finished_run,
                             capsys, "the last checkpoint is at step 384")
    assert mark.exists()


@pytest.mark.parametrize("array", ["/policy/action_net.weight", "/last_obs"])
def test_resume_refuses_a_checkpoint_that_does_not_fit_the_model(
    array: str, finished_run: FinishedRun, planted: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(planted / "arrays.safetensors"))
    good = arrays[array]
    arrays[array] = np.zeros((good.shape[0] + 1, *good.shape[1:]), good.dtype)
    save_file(arrays, str(planted / "arrays.safetensors"))
    rehash(planted)
    key = array.lstrip("/")
    assert_refused_untouched(
        ["train", f"resume={finished_run.run_id}", "total_timesteps=512"], finished_run, capsys,
        f"checkpoint {CHECKPOINT} does not fit the run's model: {key} is shape "
        f"{[good.shape[0] + 1, *good.shape[1:]]}, the run's config needs shape {list(good.shape)}")
