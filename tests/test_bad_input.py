"""The bad-input table: one line naming the input, exit 2, nothing started, nothing written.

Config rows (typo, wrong type, unknown group option, unknown gymnasium id, num_envs=0,
negative or too small total_timesteps, batch_size larger than the rollout, n_steps < 2) are
tests/test_config.py::BAD_INPUT; the papermill parameter row is the sweep's. This file adds
the rows about checkpoints, resume and the experiments directory.
"""

from __future__ import annotations

import argparse
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.config import ConfigError
from workbench.sweeps.plan import plan_sweep
from workbench.training import load_config, train
from workbench.tuning.plan import plan_tune

from .conftest import TINY, run_cli
from .support.files import tree_state
from .support.ports import free_port
from .trained_run import FinishedRun

UNKNOWN_ID = "0123456789abcdef0123456789abcdef"


def assert_rejected(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("workbench: error: ")
    assert len(err.strip().splitlines()) == 1, err
    assert expected in err, err


# --------------------------------------------------------------------------- no store at all


@pytest.mark.unit
def help_example(command: str) -> list[str]:
    """The overrides a command's ``--help`` shows as its example."""
    parser, _ = cli.build_parser([command])
    sub = next(a for a in parser._subparsers._group_actions
               if isinstance(a, argparse._SubParsersAction)).choices[command]
    (action,) = [a for a in sub._actions if a.dest == "overrides"]
    return shlex.split(action.help.split("e.g. ", 1)[1])


@pytest.mark.unit
def test_every_help_example_is_valid_input() -> None:
    """A user copies the example from ``--help`` first: it must pass the checks."""
    load_config(help_example("train"))
    sweep = plan_sweep(help_example("sweep"))
    assert sweep.points and not sweep.invalid
    assert plan_tune(help_example("tune")).n_trials > 0


def test_resume_unknown_id_without_a_store(bare_store: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    assert_rejected(["train", f"resume={UNKNOWN_ID}"],
                    f"resume={UNKNOWN_ID}: no such run in the tracking store", capsys)
    assert not bare_store.exists(), "no store may be created"


@pytest.mark.unit
def test_unwritable_experiments_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # A path below a regular file cannot be created, not even by root (CI runs as root, for
    # whom permission bits would not stop a write).
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    experiments = blocker / "experiments"
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{experiments / 'mlflow.db'}")
    assert_rejected(["train", "env.num_envs=1", "algo.n_steps=64", "algo.batch_size=64",
                     "total_timesteps=64"],
                    f"experiments directory {experiments}: not writable (Not a directory); fix "
                    "its permissions or set WORKBENCH_EXPERIMENTS to a writable directory", capsys)
    assert blocker.read_text() == ""


@pytest.mark.unit
@pytest.mark.parametrize(("override", "expected"), [
    ("checkpoint.every_steps=-1", "checkpoint.every_steps=-1: must be >= 0"),
    ("checkpoint.keep_last=-2", "checkpoint.keep_last=-2: must be >= 0"),
    ("checkpoint.every=5", "checkpoint.every: unknown config key; did you mean "
                           "checkpoint.every_steps?"),
])
def test_bad_checkpoint_settings(override: str, expected: str, bare_store: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert_rejected(["train", override], expected, capsys)
    assert not bare_store.exists()


# --------------------------------------------------------------------------- with a real run


def corrupt_arrays(folder: Path) -> None:
    data = bytearray((folder / "arrays.safetensors").read_bytes())
    data[-10] ^= 0xFF
    (folder / "arrays.safetensors").write_bytes(bytes(data))


def truncate_arrays(folder: Path) -> None:
    path = folder / "arrays.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def truncate_state(folder: Path) -> None:
    path = folder / "state.json"
    path.write_text(path.read_text()[:100])


RESUME_ROWS: list[tuple[str, list[str], Callable[[Path], None] | None, str]] = [
    ("unknown id", [f"resume={UNKNOWN_ID}"], None,
     f"resume={UNKNOWN_ID}: no such run in the tracking store"),
    ("forbidden override", ["resume={run}", "env.num_envs=4"], None,
     "env.num_envs: cannot be changed when resuming run {run} (a resumed run keeps its "
     "configuration); only total_timesteps, console, checkpoint"),
    ("group change", ["resume={run}", "env=hopper"], None,
     "env: cannot be changed when resuming run {run}"),
    ("nothing left to train", ["resume={run}"], None,
     "resume={run}: the last checkpoint is at step 384, which reaches total_timesteps=384; "
     "raise total_timesteps to train further"),
    ("corrupt checkpoint", ["resume={run}", "total_timesteps=512"], corrupt_arrays,
     "resume={run}: checkpoint checkpoints/step-000000000384 is corrupt: arrays.safetensors "
     "does not match its recorded SHA-256 (truncated or modified)"),
    ("truncated checkpoint", ["resume={run}", "total_timesteps=512"], truncate_arrays,
     "is corrupt: arrays.safetensors does not match its recorded SHA-256"),
    ("truncated state", ["resume={run}", "total_timesteps=512"], truncate_state,
     "resume={run}: checkpoint checkpoints/step-000000000384 is corrupt: state.json is "
     "truncated or not JSON"),
]


@pytest.mark.parametrize(("overrides", "damage", "expected"),
                         [row[1:] for row in RESUME_ROWS], ids=[row[0] for row in RESUME_ROWS])
def test_bad_resume(overrides: list[str], damage: Callable[[Path], None] | None, expected: str,
                    finished_run: FinishedRun, monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    finished_run.use(monkeypatch)
    folder = finished_run.artifacts() / "checkpoints" / "step-000000000384"
    saved = {p.name: p.read_bytes() for p in folder.iterdir()}
    try:
        if damage:
            damage(folder)
        before = tree_state(finished_run.experiments)
        argv = ["train", *(o.format(run=finished_run.run_id) for o in overrides)]
        assert_rejected(argv, expected.format(run=finished_run.run_id), capsys)
        assert tree_state(finished_run.experiments) == before, "nothing may be written"
        run = MlflowClient(finished_run.uri).get_run(finished_run.run_id)
        assert run.info.status == "FINISHED"
    finally:
        for name, content in saved.items():
            (folder / name).write_bytes(content)


def test_resume_of_a_live_run_is_refused(finished_run: FinishedRun,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    finished_run.use(monkeypatch)
    client = MlflowClient(finished_run.uri)
    client.update_run(finished_run.run_id, status="RUNNING")
    client.set_tag(finished_run.run_id, "workbench.heartbeat", f"{time.time() - 5:.3f}")
    try:
        assert cli.main(["train", f"resume={finished_run.run_id}", "total_timesteps=512"]) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(
            rf"workbench: error: resume={finished_run.run_id}: the run is RUNNING with a "
            r"heartbeat (\d+) s old \(its training may still be alive\); if its process is "
            r"gone, mark it KILLED with `workbench runs reap --older-than \1` once the "
            r"heartbeat is over 20 s old \(younger ones are live and never reaped\), then "
            r"resume\n",
            err), err
    finally:
        client.set_terminated(finished_run.run_id, "FINISHED")
        client.delete_tag(finished_run.run_id, "workbench.heartbeat")


def test_notebook_config_that_differs_from_the_run(finished_run: FinishedRun,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """train(cfg) checks a hand-built resume config too (the notebook path)."""
    finished_run.use(monkeypatch)
    cfg = load_config(["total_timesteps=512", "env.num_envs=2", "algo.n_steps=64",
                       "algo.batch_size=64"])
    cfg.resume = finished_run.run_id
    with pytest.raises(ConfigError, match=rf"^resume={finished_run.run_id}: algo.n_epochs=5 "
                       r"differs from the run's 2; a resumed run keeps its configuration"):
        train(cfg)


# --------------------------------------------------------------------------- unusable stores


def test_unreachable_tracking_server_is_one_line(store: Path) -> None:
    """One short request, not MLflow's minutes of HTTP retries (it took ~250 s before)."""
    uri = f"http://127.0.0.1:{free_port()}"
    done = run_cli("train", *TINY, env={"MLFLOW_TRACKING_URI": uri}, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"workbench: error: tracking server {uri}: not reachable ([Errno "
                           "111] Connection refused); start it (workbench server start) or point "
                           "MLFLOW_TRACKING_URI / tracking.uri at one that runs\n")
    assert not (store / "outbox").exists()


def test_corrupt_store_file_is_one_line_and_stays_untouched(store: Path, tmp_path: Path) -> None:
    db = tmp_path / "broken" / "mlflow.db"
    db.parent.mkdir()
    db.write_bytes(b"not a database at all\n" * 100)
    before = tree_state(db.parent)
    done = run_cli("train", *TINY, env={"MLFLOW_TRACKING_URI": f"sqlite:///{db}"}, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"workbench: error: tracking store sqlite:///{db}: mlflow.db is not a "
                           "SQLite database (corrupt or another file); move it away (or restore "
                           "it from a backup), or point MLFLOW_TRACKING_URI / tracking.uri at "
                           "another store\n")
    assert tree_state(db.parent) == before  # not even a lock file next to it
    assert not (store / "outbox").exists()


def test_store_in_an_unwritable_directory_is_one_line(store: Path) -> None:
    """A directory the process cannot write: sysfs refuses new files even to root (the tests
    run as root here, and chmod does not stop root)."""
    locked = Path("/sys")
    uri = f"sqlite:///{locked / 'mlflow.db'}"
    done = run_cli("train", *TINY, env={"MLFLOW_TRACKING_URI": uri}, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"workbench: error: tracking store {uri}: its directory {locked} "
                           "cannot be written (Permission denied); fix its permissions or point "
                           "MLFLOW_TRACKING_URI / tracking.uri at a writable place\n")
    assert not (locked / "mlflow.db").exists() and not (store / "outbox").exists()
