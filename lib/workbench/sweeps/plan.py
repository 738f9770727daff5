"""A sweep request, planned: the checked request plus what needs the simulator and the store.

``plan_sweep(overrides)`` checks the request's config (:func:`workbench.sweeps.request.
check_request`: the grid, the sweep's settings, every point's cross-field checks), then the
env checks once per group choice and the tracking store, and returns a :class:`SweepPlan`:
nothing computed or written yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import paths
from workbench.config import ConfigError
from workbench.envs.checks import check_config
from workbench.sweeps.grid import plain, value_text
from workbench.sweeps.request import Point, SweepRequest, check_request
from workbench.sweeps.request import expand_grid as expand_grid  # the grid's API, as before
from workbench.sweeps.request import point_name as point_name
from workbench.tracking.redaction import URI_PASSWORD, redact_uri
from workbench.tracking.store import resolve_tracking_uri

NOTEBOOK = "notebooks/train.ipynb"  # relative to the project root of whichever machine runs it


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SweepPlan:
    """Everything a sweep will do, validated before any compute or store write."""

    sweep_id: str
    name: str
    env: str
    points: list[Point]
    point_overrides: list[str]  # Hydra overrides every point's notebook receives
    total_timesteps: int
    workers: int
    timeout: float | None
    executor: str
    ray_address: str | None
    ray_gpus_per_point: float
    tracking_uri: str
    experiment: str
    out_dir: Path  # experiments/sweeps/<sweep_id>: executed notebooks
    invalid: dict[str, str] = field(default_factory=dict)  # point -> config error
    grid: dict[str, list[Any]] = field(default_factory=dict)  # sweep.grid's axes, if any

    def grid_params(self) -> dict[str, Any]:
        """The parent run's params: the grid and what every point shares."""
        num_envs = sorted({p.num_envs for p in self.points})
        return {
            "sweep.id": self.sweep_id,
            "sweep.name": self.name,
            "sweep.env": self.env,
            **({"sweep.grid": self.grid} if self.grid else {}),
            "sweep.num_envs": num_envs,
            "sweep.n_steps": sorted({p.n_steps for p in self.points}),
            "sweep.seeds": sorted({p.seed for p in self.points}),
            "sweep.points": len(self.points),
            "sweep.point_names": [p.name for p in self.points],
            "sweep.overrides": self.point_overrides,
            "sweep.total_timesteps": self.total_timesteps,
        }

    def grid_line(self) -> str:
        """``num_envs [1, 2] x n_steps [64, 128] x seeds [0]``, a grid sweep's keys first."""
        params = self.grid_params()
        axes = [f"{key} [{', '.join(value_text(v) for v in values)}]"
                for key, values in self.grid.items()]
        if not self.grid or any(k == "env.num_envs" for k, _ in self.points[0].keys):
            axes.append(f"num_envs {params['sweep.num_envs']}")
        if not self.grid or any(k == "algo.n_steps" for k, _ in self.points[0].keys):
            axes.append(f"n_steps {params['sweep.n_steps']}")
        return " x ".join([*axes, f"seeds {params['sweep.seeds']}"])

    def describe(self) -> str:
        """The parent run's description in MLflow's UI: the grid, the budget, the seeds."""
        shared = f"; overrides {' '.join(self.point_overrides)}" if self.point_overrides else ""
        return (f"Sweep {self.sweep_id} on {self.env}: {self.grid_line()} = "
                f"{len(self.points)} points of {self.total_timesteps} env steps each, "
                f"{self.workers} worker(s) on {self.executor}{shared}.")


def plan_sweep(overrides: Sequence[str] | SweepRequest) -> SweepPlan:
    """Check a sweep request and plan it; raises :class:`ConfigError` on bad input.

    The config checks are :func:`workbench.sweeps.request.check_request`'s (``overrides`` may
    be its result already); then the tracking store is resolved and the env checks run once
    (every point shares env.id, kwargs, randomization).
    """
    request = overrides if isinstance(overrides, SweepRequest) else check_request(overrides)
    typed, sweep = request.shared, request.sweep
    tracking_uri = resolve_tracking_uri(typed.tracking.uri)
    if sweep.executor == "ray":
        check_no_password_travels(tracking_uri)
    for variant in request.variants or [typed]:  # once per group choice: env.id, kwargs, ...
        check_config(variant)
    envs = list(dict.fromkeys(p.env for p in request.points))
    return SweepPlan(
        sweep_id=request.sweep_id,
        name=sweep.name,
        env=",".join(envs),
        points=request.points,
        point_overrides=request.point_overrides,
        total_timesteps=typed.total_timesteps,
        workers=sweep.workers,
        timeout=sweep.timeout,
        executor=sweep.executor,
        ray_address=sweep.ray.address,
        ray_gpus_per_point=sweep.ray.gpus_per_point,
        tracking_uri=tracking_uri,
        experiment=typed.tracking.experiment,
        out_dir=paths.experiments_dir() / "sweeps" / request.sweep_id,
        invalid=request.invalid,
        grid={axis.key: [plain(v) for v in axis.values] for axis in request.axes
              if not axis.shorthand},
    )


def check_no_password_travels(tracking_uri: str, executor_key: str = "sweep.executor") -> None:
    """Refuse a tracking URI with a password for a Ray sweep (or study).

    The URI is part of every point's task, and Ray keeps task specs where its dashboard,
    logs and state API show them; the login belongs in each node's environment instead.
    """
    refuse_password_on_ray(
        f"tracking.uri={redact_uri(tracking_uri)}", tracking_uri,
        f"with {executor_key}=ray the URI travels in every Ray task, password included; remove "
        "the login from the URI and export MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD on every node before `ray start` (and where the sweep runs)")


def refuse_password_on_ray(setting: str, url: str, why_and_fix: str) -> None:
    """One line naming ``setting`` (already redacted) when ``url`` holds a password."""
    if URI_PASSWORD.search(url):
        raise ConfigError(f"{setting}: {why_and_fix}")
