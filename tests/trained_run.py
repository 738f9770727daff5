"""Runs trained once per test session and shared (read-mostly), registered by tests/conftest.py.

- ``finished_run``: a tiny run with checkpoints (resume, checkpoint and manifest tests);
- ``exported_policy``: a tiny VecNormalize run exported through the real command line, the
  source of the export, Hub and bundle tests;
- ``exported_duck``: the mini duck's standing preset, shrunk, exported through the command
  line: the source of the contract, runner and sim-in-the-loop verification tests.

A fixture is shared only when it is registered once, in conftest.py: a session fixture
imported into several test modules is built once per module, each with its own cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TINY_VIDEO, embedded_store, run_cli

# Tiny, with checkpoints every iteration (128 steps) and the newest two kept.
CHECKPOINTED = [*TINY_VIDEO, "console.iteration_lines=false",
                "tracking.system_metrics=false", "checkpoint.every_steps=128",
                "checkpoint.keep_last=2"]
# Tiny HalfCheetah with VecNormalize: the normalization statistics travel with the policy.
# Its minibatch is the whole 2-env rollout: on one env (what export rebuilds the model on)
# SB3 would warn that 128 does not divide 64, which is not true of the run.
NORMALIZED = [*TINY_VIDEO, "env.normalize=true", "tracking.system_metrics=false",
              "eval.final_episodes=2", "algo.batch_size=128"]
# The Hub token is in the environment while the exported run is recorded (manifest, params):
# the greps of the store in tests/test_hub.py then also prove that recording never captures it.
HF_TEST_TOKEN = "hf_WorkbenchTestTokenNeverShown0123456789"
# What `workbench export` is asked for: 64 parity observations, 3 replay episodes, 20 warm-up
# calls before the latency is measured.
EXPORT_ARGS = ("--observations", "64", "--episodes", "3", "--warmup", "20")
# experiment=duck (VecNormalize, 4 envs, 50 Hz) shrunk to 2 PPO iterations and 50-step episodes:
# it does not stand yet, which is not what its tests look at (the contract, the runner, the
# real-time loop against its own final evaluation).
DUCK = ["experiment=duck", "total_timesteps=2048", "env.max_episode_steps=50",
        "eval.final_episodes=2", "video=off", "tracking.system_metrics=false",
        "console.progress_bar=false", "console.iteration_lines=false"]


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


@dataclass(frozen=True)
class ExportedPolicy(FinishedRun):
    """A finished run whose policy ``workbench export`` exported; ``stdout`` is what it
    printed (the report table)."""

    stdout: str = ""


def store_under(factory: pytest.TempPathFactory, name: str) -> tuple[Path, str]:
    """A new embedded store's experiments folder and tracking URI."""
    experiments = factory.mktemp(name) / "experiments"
    return experiments, f"sqlite:///{experiments / 'mlflow.db'}"


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FinishedRun]:
    from workbench.training import load_config, train

    experiments, uri = store_under(tmp_path_factory, "finished")
    with embedded_store(experiments):
        result = train(load_config(CHECKPOINTED))
    yield FinishedRun(experiments, uri, result.run_id)


@pytest.fixture(scope="session")
def exported_policy(tmp_path_factory: pytest.TempPathFactory) -> ExportedPolicy:
    """A tiny HalfCheetah run with VecNormalize, exported through the real command line."""
    from workbench.training import load_config, train

    experiments, uri = store_under(tmp_path_factory, "exported")
    with embedded_store(experiments) as patch:
        patch.setenv("HF_TOKEN", HF_TEST_TOKEN)
        result = train(load_config(NORMALIZED))
        proc = run_cli("export", "--run", result.run_id, *EXPORT_ARGS)
    assert proc.returncode == 0, proc.stderr
    assert "mini-batch" not in proc.stderr  # nothing false about the run's own env count
    print(proc.stdout)  # the report table with the measured figures (pytest -s shows it)
    return ExportedPolicy(experiments, uri, result.run_id, proc.stdout)


@pytest.fixture(scope="session")
def exported_duck(tmp_path_factory: pytest.TempPathFactory) -> ExportedPolicy:
    """The shrunk mini duck (:data:`DUCK`), exported through the real command line."""
    from workbench.training import load_config, train

    experiments, uri = store_under(tmp_path_factory, "duck")
    with embedded_store(experiments):
        result = train(load_config(DUCK))
        proc = run_cli("export", "--run", result.run_id, *EXPORT_ARGS)
    assert proc.returncode == 0, proc.stderr
    return ExportedPolicy(experiments, uri, result.run_id, proc.stdout)
