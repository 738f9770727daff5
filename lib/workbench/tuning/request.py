"""A tuning request, checked without the simulator or the store: the search space, the
objective, the study and every trial's shared overrides.

``check_request(overrides)`` composes the request (``search=ppo`` unless another search space
is chosen) and runs every check that is pure config: the space
(:mod:`workbench.tuning.space`), the objective and its settings (a target above what the task
can return by definition is bad input), the sampler, the keys every trial sets, the ranges.
It loads no learner, simulator or tracking store, so the CLI answers a typo at once;
:func:`workbench.tuning.plan.plan_tune` continues from the :class:`TuneRequest` with the env
checks and the stores. The study name is the env and the objective plus a hash of the space,
the objective and the shared overrides, so the same command finds its study again
(resumable); ``tune.n_trials`` is the study's total.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench import config
from workbench.config import ConfigError, TuneConfig, WorkbenchConfig
from workbench.config.schema import SEED_MAX
from workbench.envs.returns import return_bound
from workbench.sweeps.request import compose_typed, override_key
from workbench.tuning.objectives import Objective
from workbench.tuning.space import SearchSpace, largest_rollout, parse_space

DEFAULT_SEARCH = "search=ppo"  # with another algorithm: search=<algo.name> (conf/search/)
STUDY_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")  # fullmatch: no trailing newline
# Keys every trial gets from the study; overriding them for all trials is an error.
TRIAL_KEYS = {"eval.every_steps": "tune.eval_every_steps", "tracking.run_name": "the trial name"}


@dataclass(frozen=True)
class TuneRequest:
    """A tuning request whose config checks passed: the study, before the stores."""

    study: str
    space: SearchSpace
    objective: Objective
    settings: TuneConfig  # sampler, pruner, workers, executor, timeout
    n_trials: int
    base: WorkbenchConfig  # a trial's config before its sampled values
    point_overrides: list[str]  # every trial's notebook gets these, then its sampled values
    seeds: tuple[int, ...]  # tune.seeds: each trial trains once per seed; (): on `seed`
    recheck_seeds: tuple[int, ...]  # the fresh seeds of the check against the defaults
    enqueue: tuple[dict[str, Any], ...]  # tune.enqueue, checked: trials to run first

    @property
    def rechecks(self) -> bool:
        """True when the best trials are checked against the defaults on fresh seeds."""
        return bool(self.seeds) and self.settings.recheck_top > 0


def check_request(overrides: Sequence[str], n_trials: int | None = None, yes: bool = False
                  ) -> TuneRequest:
    """Compose and check a tuning request's config; raises :class:`ConfigError` on bad input.

    More than ``tune.max_seeds`` seeds (in ``tune.seeds`` or the check's) need ``yes``
    (``workbench tune --yes``), as a sweep of more than ``sweep.max_points`` points does."""
    overrides = list(overrides)
    if not any(override_key(o) == "search" for o in overrides):
        # the composed algorithm names the default space (its search.* overrides need one)
        first = compose_typed([o for o in overrides if not override_key(o).startswith("search")])
        check_seed_count(first.tune, yes)  # at the first composition: a long list is slow
        algo = first.algo.name
        overrides.insert(0, f"search={algo}" if algo != "ppo" else DEFAULT_SEARCH)
    typed = compose_typed(overrides)
    check_seed_count(typed.tune, yes)
    config.check_values(typed)  # the tune.* ranges among them
    space = parse_space(typed.search.name, typed.search.params, typed.algo.name)
    point_overrides = [o for o in overrides if not is_study_override(o)]
    check_trial_keys(point_overrides, space)
    tune = typed.tune
    objective = Objective(str(tune.objective), tune.target, tune.budget_s,
                          tune.eval_every_steps, tune.report_every_s)
    point_overrides.insert(0, f"eval.every_steps={tune.eval_every_steps}")
    base = compose_typed(point_overrides)
    config.check_values(base)
    check_objective(objective, base)
    check_budget(space, base)
    check_sampler(tune, space)
    seeds, recheck_seeds = check_seeds(tune)
    enqueue = tuple(space.fixed_values(values, f"tune.enqueue[{i}]")
                    for i, values in enumerate(tune.enqueue))
    for text in point_overrides if seeds else ():
        if override_key(text) == "seed":
            raise ConfigError(f"{text!r} on the command line: with tune.seeds every trial "
                              "trains on each of them; drop it or put it in tune.seeds")
    study = tune.study or study_identity(base.env.name, space, objective, point_overrides,
                                         seeds, str(tune.aggregate), enqueue)
    if not STUDY_PATTERN.fullmatch(study):
        raise ConfigError(f"tune.study={study!r}: use letters, digits, '_', '.', '-' only")
    total = n_trials if n_trials is not None else tune.n_trials
    if total < 1:
        raise ConfigError(f"--n-trials {total}: must be >= 1")
    if str(tune.sampler) == "grid":
        total = min(total, space.grid_size())
    if tune.ray.gpus_per_point < 0:
        raise ConfigError(f"tune.ray.gpus_per_point={tune.ray.gpus_per_point:g}: must be >= 0 "
                          "(0: the trials get no GPU from Ray)")
    return TuneRequest(study=study, space=space, objective=objective, settings=tune,
                       n_trials=total, base=base, point_overrides=point_overrides,
                       seeds=seeds, recheck_seeds=recheck_seeds, enqueue=enqueue)


def check_seeds(tune: TuneConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``tune.seeds`` and the check's fresh seeds: distinct, in range, not overlapping; the
    Wilcoxon pruner only with seeds (it compares trials seed by seed)."""
    if tune.seeds is None:
        if str(tune.pruner) == "wilcoxon":
            raise ConfigError("tune.pruner=wilcoxon compares trials seed by seed: add "
                              "tune.seeds=[0,1,2] (or choose tune.pruner=median)")
        if tune.recheck_seeds is not None:
            raise ConfigError("tune.recheck_seeds: the check against the defaults runs only "
                              "with tune.seeds=[...]; add them or drop tune.recheck_seeds")
        return (), ()
    seeds = distinct_seeds("tune.seeds", tune.seeds)
    if tune.recheck_seeds is None:
        fresh = tuple(range(max(seeds) + 1, max(seeds) + 1 + len(seeds)))
    else:
        fresh = distinct_seeds("tune.recheck_seeds", tune.recheck_seeds)
    reused = sorted(set(seeds) & set(fresh))
    if reused:
        raise ConfigError(f"tune.recheck_seeds={list(fresh)}: seeds {reused} are also in "
                          "tune.seeds; the check needs fresh seeds the study never saw")
    if tune.recheck_top and len(fresh) < 2:
        raise ConfigError(f"tune.recheck_seeds={list(fresh)}: one seed gives no interval; "
                          "give at least 2 (e.g. [10,11,12,13,14])")
    return seeds, fresh


def check_seed_count(tune: TuneConfig, yes: bool) -> None:
    """Refuse more than ``tune.max_seeds`` seeds unless confirmed: every seed is a training
    of every trial (and of every candidate of the check against the defaults, which takes as
    many fresh seeds as ``tune.seeds`` unless ``tune.recheck_seeds`` names them)."""
    seeds = list(tune.seeds or [])
    fresh = list(tune.recheck_seeds) if tune.recheck_seeds is not None else seeds
    if yes:
        return
    for key, values in (("tune.seeds", seeds), ("tune.recheck_seeds", fresh)):
        if len(values) > tune.max_seeds:
            check = len(fresh) * (tune.recheck_top + 1) if tune.recheck_top and seeds else 0
            raise ConfigError(
                f"{key}: {len(values):,} seeds is more than tune.max_seeds={tune.max_seeds} "
                f"({len(seeds):,} trainings per trial, {check:,} more for the check against "
                f"the defaults); pass --yes to run them all, or set "
                f"tune.max_seeds={len(values)}")


def distinct_seeds(key: str, values: Sequence[int]) -> tuple[int, ...]:
    """A non-empty list of distinct seeds within the config's seed range."""
    if not values:
        raise ConfigError(f"{key}=[]: give at least one seed, e.g. {key}=[0,1,2]")
    if len(set(values)) != len(values):
        raise ConfigError(f"{key}={list(values)}: a seed is repeated; each seed once")
    for value in values:
        if not 0 <= value <= SEED_MAX:
            raise ConfigError(f"{key}={list(values)}: seed {value} is outside 0..{SEED_MAX}")
    return tuple(int(v) for v in values)


def is_study_override(text: str) -> bool:
    """Overrides of the study itself (``tune.*``, ``search``, ``search.*``), not of trials."""
    key = override_key(text)
    return key in ("tune", "search") or key.startswith(("tune.", "search."))


def check_trial_keys(overrides: Sequence[str], space: SearchSpace) -> None:
    """Refuse overrides of keys each trial gets from the study or its sampled values."""
    sampled = space.targets()
    for text in overrides:
        key = override_key(text)
        if key in sampled:
            name = sampled[key]
            raise ConfigError(
                f"{text!r} on the command line: {key} is sampled per trial by "
                f"search.params.{name}; drop it from the search (~search.params.{name}) to fix "
                "its value, or change its range"
            )
        if key in TRIAL_KEYS:
            raise ConfigError(f"{text!r} on the command line: {key} is set per trial by the "
                              f"study; use {TRIAL_KEYS[key]} instead")


def check_objective(objective: Objective, base: WorkbenchConfig) -> None:
    """The objective's settings: a target and a budget where it needs them, a reachable target."""
    name = objective.name
    if name == "time_to_target" and objective.target is None:
        raise ConfigError("tune.objective=time_to_target needs tune.target=RETURN (the return "
                          "to reach, e.g. tune.target=900)")
    if name != "time_to_target" and objective.target is not None:
        raise ConfigError(f"tune.target={objective.target:g}: only tune.objective="
                          f"time_to_target uses a target (this study: {name}); drop tune.target")
    if objective.timed and objective.budget_s is None:
        raise ConfigError(f"tune.objective={name} needs tune.budget_s=SECONDS (each trial's "
                          "training time; a trial that never reaches the target scores it), "
                          "e.g. tune.budget_s=120")
    if objective.target is not None:
        bound = return_bound(base.env.id, base.env.max_episode_steps)
        if bound is not None and objective.target > bound[0]:
            raise ConfigError(
                f"tune.target={objective.target:g}: {base.env.id} cannot return more than "
                f"{bound[0]:g} per episode by definition ({bound[1]}); choose a target "
                f"<= {bound[0]:g}"
            )


def check_budget(space: SearchSpace, base: WorkbenchConfig) -> None:
    """``total_timesteps`` must hold the largest rollout the space can sample."""
    num_envs, n_steps = largest_rollout(space, base.env.num_envs, base.algo.steps_per_update())
    if num_envs * n_steps > base.total_timesteps:
        raise ConfigError(
            f"total_timesteps={base.total_timesteps} is smaller than the largest rollout the "
            f"search space samples (num_envs {num_envs} x n_steps {n_steps} = "
            f"{num_envs * n_steps}): raise total_timesteps or narrow search.params"
        )


def check_sampler(tune: TuneConfig, space: SearchSpace) -> None:
    """The sampler fits the space (a grid needs choices) and its package is installed."""
    if str(tune.sampler) == "grid":
        space.grid()
    if str(tune.sampler) == "cmaes":
        try:
            import cmaes  # noqa: F401  (Optuna's CmaEsSampler needs it)
        except ImportError as exc:
            raise ConfigError("tune.sampler=cmaes needs the cmaes package: pip install cmaes "
                              "(make setup installs it)") from exc


def study_identity(env: str, space: SearchSpace, objective: Objective,
                   point_overrides: Sequence[str], seeds: Sequence[int] = (),
                   aggregate: str = "median", enqueue: Sequence[Mapping[str, Any]] = ()) -> str:
    """``<env>-<objective>-<8 hex>``: the same request gives the same study (resumable); a
    study over seeds, or one that starts from enqueued trials, is another study."""
    identity: dict[str, object] = {"space": space.as_dict(), "objective": objective.as_dict(),
                                   "overrides": list(point_overrides)}
    if seeds:
        identity.update(seeds=list(seeds), aggregate=aggregate)
    if enqueue:
        identity.update(enqueue=[dict(values) for values in enqueue])
    payload = json.dumps(identity, sort_keys=True)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:8]
    return f"{env}-{objective.name.replace('_', '-')}-{digest}"
