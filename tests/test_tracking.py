"""Unit tier for the MLflow bridge: exact steps, batching, truncation, redaction."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import TRUNCATION_MARK, resolve_tracking_uri, truncate
from workbench.tracking.writer import MlflowWriter
from workbench.training.progress import ConsoleWriter


class RecordingClient:
    """Stands in for MlflowClient.log_batch only, to check the writer's exact output."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, float, int]]] = []

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        self.batches.append([(m.key, m.value, m.step) for m in metrics])


@pytest.mark.unit
def test_writer_redates_late_train_keys_to_their_iteration() -> None:
    client = RecordingClient()
    writer = MlflowWriter(client, "run")  # type: ignore[arg-type]
    # Dump 1 (after rollout 1): no update yet.
    writer.write({"rollout/ep_rew_mean": 1.0, "time/fps": 10}, {}, step=128)
    # Dump 2: rollout 2 plus the update of iteration 1.
    writer.write({"rollout/ep_rew_mean": 2.0, "train/approx_kl": 0.01, "time/update_s": 0.5},
                 {}, step=256)
    # Closing dump at training end: the last update's values only.
    writer.write({"train/approx_kl": 0.02, "time/update_s": 0.4}, {}, step=256)
    assert client.batches == [
        [("rollout/ep_rew_mean", 1.0, 128), ("time/fps", 10.0, 128)],
        [("rollout/ep_rew_mean", 2.0, 256), ("train/approx_kl", 0.01, 128),
         ("time/update_s", 0.5, 128)],
        [("train/approx_kl", 0.02, 256), ("time/update_s", 0.4, 256)],
    ]
    assert writer.calls == 3  # one batched call per dump


@pytest.mark.unit
def test_console_line_of_an_iteration_shows_that_iterations_update(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same dumps as above: line k carries update k's KL, as MLflow dates it."""
    console = ConsoleWriter(total_iterations=2)
    console.write({"rollout/ep_rew_mean": 1.0, "time/iterations": 1}, {}, step=128)
    assert capsys.readouterr().out == ""  # waits for update 1
    console.write({"rollout/ep_rew_mean": 2.0, "time/iterations": 2, "train/approx_kl": 0.01,
                   "time/update_s": 0.5}, {}, step=256)
    console.write({"train/approx_kl": 0.02, "time/update_s": 0.4}, {}, step=256)
    assert capsys.readouterr().out.splitlines() == [
        "it 1/2 | 128 steps | rew 1.0 | kl 0.0100 | upd 0.50s",
        "it 2/2 | 256 steps | rew 2.0 | kl 0.0200 | upd 0.40s",
    ]


@pytest.mark.unit
def test_writer_skips_non_numeric_values() -> None:
    client = RecordingClient()
    writer = MlflowWriter(client, "run")  # type: ignore[arg-type]
    writer.write({"a": "text", "b": True, "c": 3}, {}, step=1)
    assert client.batches == [[("c", 3.0, 1)]]


@pytest.mark.unit
def test_truncate_marks_cut_values() -> None:
    assert truncate("abc", 10) == "abc"
    cut = truncate("x" * 50, 20)
    assert len(cut) == 20 and cut.endswith(TRUNCATION_MARK)


@pytest.mark.unit
def test_redact_uri_hides_password() -> None:
    assert (redact_uri("postgresql://bob:s3cret@db:5432/mlflow")
            == "postgresql://bob:***@db:5432/mlflow")
    assert redact_uri("sqlite:///x/mlflow.db") == "sqlite:///x/mlflow.db"


@pytest.mark.unit
def test_env_uri_wins(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///a.db")
    assert resolve_tracking_uri("sqlite:///b.db") == "sqlite:///a.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_tracking_uri("sqlite:///b.db") == "sqlite:///b.db"


FIRST_REQUEST = """
import sys
from workbench.tracking.store import ensure_experiment, make_client
uri = sys.argv[1]
client = make_client(uri)
print(ensure_experiment(client, "workbench", uri))
"""


def test_parallel_first_requests_on_a_fresh_embedded_store(tmp_path: Path) -> None:
    # Without the store lock, processes migrating a fresh SQLite database at once fail with
    # "duplicate column name" (seen with seeds trained side by side); with it all succeed.
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_REQUEST, uri], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
             for _ in range(3)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
    assert len({out.strip().splitlines()[-1] for out, _ in outputs}) == 1  # one experiment
