"""A tuning request, planned: the checked request plus what needs the simulator and the stores.

``plan_tune(overrides)`` checks the request's config (:func:`workbench.tuning.request.
check_request`: the space, the objective, the sampler, the keys every trial sets), then the
env checks once, the tracking store and the study's storage, and returns a :class:`TunePlan`:
nothing computed or written yet.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench import paths
from workbench.config import WorkbenchConfig
from workbench.envs.checks import check_config
from workbench.sweeps.plan import check_no_password_travels, refuse_password_on_ray
from workbench.sweeps.request import compose_typed
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import resolve_tracking_uri
from workbench.tuning.request import TuneRequest, check_request
from workbench.tuning.storage import storage_url


@dataclass(frozen=True)
class TunePlan(TuneRequest):
    """Everything a study will do, validated before any compute or store write: the checked
    request, and where it runs."""

    env: str
    tracking_uri: str
    experiment: str
    storage: str
    out_dir: Path  # experiments/tuning/<study>: executed notebooks

    @property
    def ray_address(self) -> str | None:
        return self.settings.ray.address

    def study_params(self) -> dict[str, object]:
        """The parent run's params: the space, the objective, the shared overrides."""
        t = self.settings
        return {
            "tune.study": self.study, "tune.env": self.env,
            "tune.objective": self.objective.name, "tune.target": self.objective.target,
            "tune.budget_s": self.objective.budget_s,
            "tune.eval_every_steps": self.objective.eval_every_steps,
            "tune.sampler": str(t.sampler), "tune.pruner": str(t.pruner),
            "tune.n_trials": self.n_trials, "tune.search": self.space.name,
            "tune.space": self.space.describe(), "tune.overrides": self.point_overrides,
            "tune.total_timesteps": self.base.total_timesteps,
            **({"tune.seeds": list(self.seeds), "tune.aggregate": str(t.aggregate),
                "tune.recheck_top": t.recheck_top, "tune.recheck_seeds": list(self.recheck_seeds)}
               if self.seeds else {}),
        }


def plan_tune(overrides: Sequence[str] | TuneRequest, n_trials: int | None = None) -> TunePlan:
    """Check a tuning request and plan it; raises :class:`ConfigError` on bad input.

    The config checks are :func:`workbench.tuning.request.check_request`'s (``overrides``
    may be its result already, ``n_trials`` then unused); then the tracking store is
    resolved, the env checks run once (every trial shares env.id, kwargs) and the study's
    storage is found.
    """
    request = (overrides if isinstance(overrides, TuneRequest)
               else check_request(overrides, n_trials))
    base, tune = request.base, request.settings
    tracking_uri = resolve_tracking_uri(base.tracking.uri)
    check_config(base)  # the env checks, once: every trial shares env.id, kwargs
    on_ray = str(tune.executor) == "ray"
    if on_ray:
        check_no_password_travels(tracking_uri, "tune.executor")
    storage = storage_url(tune.storage, tracking_uri)
    if on_ray:
        check_no_password_in_storage(storage)
    return TunePlan(
        study=request.study, env=base.env.name, space=request.space,
        objective=request.objective, settings=tune, n_trials=request.n_trials, base=base,
        point_overrides=request.point_overrides, seeds=request.seeds,
        recheck_seeds=request.recheck_seeds, enqueue=request.enqueue, tracking_uri=tracking_uri,
        experiment=base.tracking.experiment, storage=storage,
        out_dir=paths.experiments_dir() / "tuning" / request.study,
    )


def check_no_password_in_storage(storage: str) -> None:
    """A Ray study's trials carry the storage URL in their Ray tasks (specs Ray shows in its
    dashboard and state API): it may hold no password."""
    refuse_password_on_ray(
        f"tune.storage={redact_uri(storage)}", storage,
        "with tune.executor=ray the storage URL travels in every Ray task, password included; "
        "remove the password from the URL and give it to every node through its environment "
        "before `ray start` (PostgreSQL: PGPASSWORD or ~/.pgpass)")


def trial_config(plan: TunePlan, values: dict[str, object]) -> WorkbenchConfig:
    """A trial's full config: the shared overrides plus its sampled values (for the best
    config file and the batch-size adjustment)."""
    typed = compose_typed([*plan.point_overrides, *plan.space.overrides(values)])
    return copy.deepcopy(typed)
