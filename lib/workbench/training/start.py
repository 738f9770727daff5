"""What a training run starts from: its checked config, and fresh weights, its own last
checkpoint (``resume=<run_id>``) or a policy pulled from the Hub (``init.hub_repo_id``).

:func:`load_config` is the configuration of a training run: the config layer's composition and
checks, plus what needs the layers below training: the environment checks (simulator registry,
env kwargs, randomization, EnvPool support) and, for ``resume=<run_id>``, the run's own config
from the tracking store (:mod:`workbench.training.resume`). :func:`prepare` is the one
preparation step of a run: it finds the checkpoint or pulls the bundle, before the run exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from omegaconf import DictConfig
from stable_baselines3.common.vec_env import VecEnv

from workbench import config
from workbench.config import ConfigError, Device, OffPolicyConfig, WorkbenchConfig
from workbench.envs.checks import check_config
from workbench.envs.robot_files import RobotFiles, robot_files
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env
from workbench.tracking.outbox import RunWriter
from workbench.tracking.store import resolve_tracking_uri
from workbench.training.algorithms import replay_buffer_bytes
from workbench.training.bundle import PulledBundle, init_run_info, initialize_model, pull_for_init
from workbench.training.dataset import PulledDataset, pull_for_run
from workbench.training.resume import (
    ResumePoint,
    discard_incomplete,
    resume_claim,
    resume_config,
    same_backend,
)
from workbench.training.resume import prepare as resume_prepare
from workbench.training.snapshot import restore


def load_config(overrides: Sequence[str] = (),
                composed: DictConfig | None = None) -> WorkbenchConfig:
    """Compose and check the config of a training run (``resume=<run_id>`` included).

    With ``resume=<run_id>`` the result is that run's own config plus the overrides a resume
    may change (:data:`workbench.training.resume.MAY_CHANGE`). ``composed`` is
    ``config.compose(overrides)`` (or :func:`workbench.config.precheck`'s result) when the
    caller has it already: the CLI checks the config before this module's imports load.
    """
    if composed is None:
        composed = config.compose(overrides)
    cfg = resume_config(composed, overrides) if composed.get("resume") else config.validate(
        composed)
    check_config(cfg)
    check_device(cfg)
    check_replay_buffer(cfg)
    return cfg


def validate(cfg: WorkbenchConfig | DictConfig | Mapping[str, Any]) -> WorkbenchConfig:
    """The config layer's validation plus the environment and device checks (exit code 2)."""
    typed = config.validate(cfg)
    check_config(typed)
    check_device(typed)
    check_replay_buffer(typed)
    return typed


def check_replay_buffer(cfg: WorkbenchConfig) -> None:
    """An off-policy replay buffer fits in the memory this machine has available (SB3 would
    only warn, and the run would die swapping or killed hours in)."""
    if not isinstance(cfg.algo, OffPolicyConfig):
        return
    env = make_env(EnvSpec.from_config(cfg))
    try:
        size = replay_buffer_bytes(cfg.algo, env.observation_space, env.action_space)
    finally:
        env.close()
    available = psutil.virtual_memory().available
    if size > available:
        fits = int(cfg.algo.buffer_size * available / size)
        raise ConfigError(
            f"algo.buffer_size={cfg.algo.buffer_size}: the replay buffer needs "
            f"{size / 2**30:.1f} GiB and this machine has {available / 2**30:.1f} GiB "
            f"available; lower algo.buffer_size to at most {fits}"
        )


def check_device(cfg: WorkbenchConfig) -> None:
    """``device=cuda`` only where torch sees a CUDA device: never a silent CPU run."""
    if cfg.device == Device.cuda and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(
            f"device=cuda: torch {torch.__version__} ({build}) sees no CUDA device here; use "
            "device=auto or device=cpu, or install a CUDA build of torch (docs/gpu-servers.md)"
        )


@dataclass
class Start:
    """Where a run's weights and state come from: fresh, its own checkpoint, or a Hub bundle.

    Decided by :func:`prepare` before the run exists; the trainer asks it at the few points
    where the three differ (the backend, the records, the weights, the training state).
    """

    resumed: ResumePoint | None = None  # continue this run from its last checkpoint
    bundle: PulledBundle | None = None  # initialize the policy from this pulled bundle
    robot: RobotFiles | None = None  # the env's MJCF model and its files, hashed
    dataset: PulledDataset | None = None  # init.dataset, pulled and checked

    def inputs(self) -> dict[str, Any]:
        """The manifest's ``inputs`` section: the robot files and the dataset (or null)."""
        return {"robot": self.robot.to_manifest() if self.robot else None,
                "dataset": self.dataset.to_manifest() if self.dataset else None}

    def claimed(self) -> contextlib.AbstractContextManager[None]:
        """A resumed run's claim, held while it trains: one resume of a run at a time."""
        return resume_claim(self.resumed) if self.resumed else contextlib.nullcontext()

    def env_spec(self, spec: EnvSpec) -> EnvSpec:
        """A resumed run keeps the backend ``vec_env=auto`` chose for it (an exact resume)."""
        return same_backend(spec, self.resumed)

    def checkpoint_steps(self) -> list[int]:
        """Steps of the checkpoints the run already has in the store."""
        return list(self.resumed.stored_steps) if self.resumed else []

    def run_info(self, run_info: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The manifest's ``run`` section, with the pulled policy's pinned commit."""
        if self.bundle is None:
            return run_info
        return {**(run_info or {}), **init_run_info(self.bundle)}

    def params(self) -> dict[str, Any]:
        """Params of the start: the commit a tag or branch of the bundle resolved to."""
        return {"init.hub_commit": self.bundle.commit} if self.bundle else {}

    def initialize(self, model: Any, train_env: VecEnv) -> None:
        """The bundle's weights and observation statistics (fresh runs only)."""
        if self.bundle is not None:
            initialize_model(model, train_env, self.bundle)

    def restore(self, model: Any, train_env: VecEnv, eval_env: VecEnv,
                client: RunWriter) -> None:
        """A resumed run's training state, exactly where its checkpoint left it."""
        if self.resumed is not None:
            restore(model, train_env, eval_env, self.resumed.state)
            discard_incomplete(client, self.resumed)


def prepare(cfg: WorkbenchConfig) -> Start:
    """Find the checkpoint to resume or pull the bundle to start from; bad input raises here.

    Both are checked against ``cfg`` before the run exists, so a wrong run id, revision or
    network shape is a :class:`ConfigError` (exit 2), not a failed run. So are the run's
    inputs: the ``init.dataset`` pulled and checked (training/dataset.py), the env's robot
    files hashed (envs/robot_files.py).
    """
    start = (Start(resumed=resume_prepare(cfg, resolve_tracking_uri(cfg.tracking.uri)))
             if cfg.resume else Start(bundle=pull_for_init(cfg)))
    start.dataset = pull_for_run(cfg.init.dataset)
    start.robot = robot_files(EnvSpec.from_config(cfg))
    return start
