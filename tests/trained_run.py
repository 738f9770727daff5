"""A finished tiny run with checkpoints, trained once per test session (read-mostly)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TINY, embedded_store

# Tiny, with checkpoints every iteration (128 steps) and the newest two kept.
CHECKPOINTED = [*TINY, "env.vec_env=dummy", "console.iteration_lines=false",
                "tracking.system_metrics=false", "checkpoint.every_steps=128",
                "checkpoint.keep_last=2"]


@dataclass(frozen=True)
class FinishedRun:
    """Where the run lives and its id."""

    experiments: Path
    uri: str
    run_id: str

    def use(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point WORKBENCH_EXPERIMENTS and MLFLOW_TRACKING_URI at this run's store."""
        monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(self.experiments))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", self.uri)

    def artifacts(self) -> Path:
        """Local folder of the run's artifacts (embedded store)."""
        from mlflow.tracking import MlflowClient

        uri = MlflowClient(self.uri).get_run(self.run_id).info.artifact_uri
        return Path(uri.removeprefix("file://"))


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FinishedRun]:
    from workbench.training import load_config, train

    experiments = tmp_path_factory.mktemp("finished") / "experiments"
    uri = f"sqlite:///{experiments / 'mlflow.db'}"
    with embedded_store(experiments):
        result = train(load_config(CHECKPOINTED))
    yield FinishedRun(experiments, uri, result.run_id)
