"""A report's points as configurations, and how configurations compare within and across tasks.

A point is a **configuration**: the runs sharing the tag ``workbench.config_id`` (the seeds of
one resolved config; :mod:`workbench.config.identity`). It is labelled by the grid keys that
vary over the selection (the ``sweep.grid.<key>`` tags a grid sweep writes), short and
readable: ``lr=1e-4 env=hopper``. A num_envs x n_steps sweep, and runs without those tags
(older runs, single trainings), keep the ``<env>-ne<N>-ns<S>`` labels
(:func:`workbench.review.records.base_label`).

Across tasks a configuration is its **setting**: its label without the task (``lr=1e-4``),
the same on every task it ran. :func:`analyse_across` puts the tasks on one scale (normalized
score = final return / the task's reference, :mod:`workbench.review.references`) and gives
per setting the IQM of the normalized scores with a stratified bootstrap 95 % interval
(strata: the tasks), a performance profile, and the probability of improvement over a
baseline setting with its interval and verdict (:func:`statistics.improvement_verdict`).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from workbench.config import CONFIG_ID_TAG, ConfigError
from workbench.review import figures, statistics
from workbench.review.references import Reference, reference_for
from workbench.review.statistics import Interval
from workbench.review.tradeoff import Drawn
from workbench.sweeps import grid

GRID_TAG = grid.KEY_TAG_PREFIX  # a grid point's tag per key: sweep.grid.<key> = value
SHORTHAND = tuple(grid.SHORTHAND)  # env.num_envs, algo.n_steps: today's grid, in its order
SHORTHAND_KEYS = frozenset(SHORTHAND)
TASK_KEYS = frozenset({"env", "env.id", "env.name"})  # keys that choose the task
SHARED_SETTING = "the sweep's settings"  # the setting of a grid that varies the task only
MIN_BASELINE_PREFIX = 4  # characters of a config id that --baseline may give


class RunLike(Protocol):
    """What is read of a run (:class:`workbench.review.records.RunRecord`)."""

    tags: dict[str, str]
    params: dict[str, str]

    @property
    def seed(self) -> int | None: ...

    @property
    def final_reward(self) -> float: ...


class PointLike(Protocol):
    """What is read of a point (:class:`workbench.review.records.Point`)."""

    label: str
    task: str
    setting: str
    order: int

    @property
    def runs(self) -> Sequence[RunLike]: ...

    @property
    def scored(self) -> Sequence[RunLike]: ...  # FINISHED runs, one per seed


# --------------------------------------------------------------------------- labels


@dataclass(frozen=True)
class GridLayout:
    """What a sweep's parent run says of its grid: the order of its keys and of its points
    (the parent's ``sweep.grid`` and ``sweep.point_names`` params)."""

    keys: tuple[str, ...] = ()
    point_names: tuple[str, ...] = ()

    @classmethod
    def of(cls, params: Mapping[str, str]) -> GridLayout:
        """The layout from a parent's params; what is absent or unreadable (an older sweep, a
        value cut at MLflow's length limit) is left empty."""
        def literal(name: str) -> object:
            try:
                return ast.literal_eval(params.get(name, ""))
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return None

        keys, names = literal("sweep.grid"), literal("sweep.point_names")
        return cls(tuple(str(k) for k in keys) if isinstance(keys, dict) else (),
                   tuple(str(n) for n in names) if isinstance(names, list) else ())

    def position(self, point_name: str | None) -> int | None:
        """Where the point of that name sits in grid order (None: not known)."""
        if point_name is None or point_name not in self.point_names:
            return None
        return self.point_names.index(point_name)


def grid_values(tags: Mapping[str, str]) -> dict[str, str]:
    """A run's grid keys and values, from its ``sweep.grid.<key>`` tags."""
    return {k.removeprefix(GRID_TAG): v for k, v in tags.items() if k.startswith(GRID_TAG)}


def label_keys(runs: Sequence[RunLike], layout: GridLayout = GridLayout()) -> list[str]:
    """The grid keys that label the points: those whose values differ between the runs that
    carry them, in the sweep's order (else sorted); none when only today's num_envs x n_steps
    keys vary (those points keep their ``<env>-ne<N>-ns<S>`` labels)."""
    values: dict[str, set[str]] = {}
    for run in runs:
        for key, value in grid_values(run.tags).items():
            values.setdefault(key, set()).add(value)
    varying = [k for k, found in values.items() if len(found) > 1]
    if all(k in SHORTHAND_KEYS for k in varying):
        return []
    rank = {k: i for i, k in enumerate(layout.keys)}
    return sorted(varying, key=lambda k: (rank.get(k, len(rank)), k))


def value_label(text: str) -> str:
    """A tag's value as a label shows it: numbers as the sweep names them (``0.0001`` ->
    ``1e-4``), anything else as written."""
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return grid.value_text(number) if math.isfinite(number) else text
    return text


def grid_label(tags: Mapping[str, str], keys: Sequence[str]) -> tuple[str, str] | None:
    """(label, setting) of a run from its grid tags: ``lr=1e-4 env=hopper`` and ``lr=1e-4``
    (the label without the task); None when the run carries none of ``keys``."""
    values = grid_values(tags)
    shown = [k for k in keys if k in values]
    if not shown:
        return None
    prefixes = grid.label_prefixes([grid.Axis(k, ()) for k in keys])
    parts = {k: f"{prefixes[k]}={value_label(values[k])}" for k in shown}
    setting = " ".join(parts[k] for k in shown if k not in TASK_KEYS) or SHARED_SETTING
    return " ".join(parts.values()), setting


def legacy_setting(label: str, task: str) -> str:
    """The setting of a ``<env>-ne<N>-ns<S>`` label: the label without its task."""
    return label.removeprefix(f"{task}-") if label.startswith(f"{task}-") else label


def interval_text(interval: Interval | None, spec: str = ".1f") -> str:
    """``612.3 [580.1, 640.2]``, ``612.3 (1 seed: no interval)`` or an en dash."""
    if interval is None or not math.isfinite(interval.estimate):
        return "–"
    if not interval.known:
        return f"{interval.estimate:{spec}} (1 seed: no interval)"
    return f"{interval.estimate:{spec}} [{interval.low:{spec}}, {interval.high:{spec}}]"


# --------------------------------------------------------------------------- options


def settings_in_order(points: Sequence[PointLike]) -> list[str]:
    """The settings of the points, in grid order (each at its earliest point)."""
    first: dict[str, int] = {}
    for p in points:
        first[p.setting] = min(first.get(p.setting, p.order), p.order)
    return sorted(first, key=lambda s: (first[s], s))


def resolve_baseline(points: Sequence[PointLike], wanted: str | None) -> tuple[str, str]:
    """(setting, why it is the baseline): ``wanted`` names a setting, a point's label or a
    config id (or a prefix of one, at least 4 characters); None: the first setting in grid
    order. Naming nothing, or several settings, is a :class:`ConfigError`."""
    settings = settings_in_order(points)
    if wanted is None:
        return settings[0], "the first configuration in grid order"
    origin = f"--baseline {wanted}"
    if wanted in settings:
        return wanted, origin
    for p in points:
        if p.label == wanted:
            return p.setting, origin
    matched = sorted({p.setting for p in points for r in p.runs
                      if len(wanted) >= MIN_BASELINE_PREFIX
                      and r.tags.get(CONFIG_ID_TAG, "").startswith(wanted)})
    if len(matched) == 1:
        return matched[0], origin
    problem = (f"config id prefix of several configurations ({', '.join(matched)})" if matched
               else "no configuration of the selection has this label or config id")
    raise ConfigError(f"--baseline {wanted}: {problem}; configurations: {', '.join(settings)}")


def task_env_ids(points: Sequence[PointLike]) -> dict[str, str | None]:
    """Each task's gymnasium id (the ``env.id`` param of its first run)."""
    ids: dict[str, str | None] = {}
    for p in points:
        ids.setdefault(p.task, p.runs[0].params.get("env.id") if p.runs else None)
    return ids


def check_targets(points: Sequence[PointLike], targets: Mapping[str, float]) -> None:
    """Each ``--target-return TASK=RETURN`` names a task of the selection (env name or id)."""
    ids = task_env_ids(points)
    known = {*ids, *(i for i in ids.values() if i)}
    for task, value in targets.items():
        if task and task not in known:
            raise ConfigError(
                f"--target-return {task}={value:g}: no run of the selection trained on {task}; "
                f"tasks: {', '.join(ids)}")


# --------------------------------------------------------------------------- across tasks


@dataclass(frozen=True)
class SettingRow:
    """One setting across tasks: its normalized score and its improvement over the baseline."""

    setting: str
    tasks: tuple[str, ...]  # tasks it ran on
    seeds: str  # distinct seeds per task, e.g. "3 per task" or "hopper 3, walker2d 2"
    normalized: Interval | None  # IQM of the normalized scores (None: no task with reference)
    improvement: Interval | None  # P(this > baseline) (None: the baseline, or no shared task)
    verdict: str


@dataclass
class Across:
    """The cross-task comparison of a report's settings."""

    references: list[Reference]
    baseline: str
    baseline_origin: str
    rows: list[SettingRow] = field(default_factory=list)
    profile: Drawn | None = None

    @property
    def left_out(self) -> list[Reference]:
        """Tasks without a reference: outside the normalized aggregate."""
        return [r for r in self.references if r.value is None]


def scores_by_setting(points: Sequence[PointLike]) -> dict[str, dict[str, list[float]]]:
    """setting -> task -> the finite final returns of its runs."""
    found: dict[str, dict[str, list[float]]] = {}
    for p in points:
        task = found.setdefault(p.setting, {}).setdefault(p.task, [])
        task += [r.final_reward for r in p.scored if math.isfinite(r.final_reward)]
    return found


def seeds_by_setting(points: Sequence[PointLike]) -> dict[str, dict[str, int]]:
    """setting -> task -> distinct seeds with a finite final return."""
    seeds: dict[str, dict[str, set[object]]] = {}
    for p in points:
        task = seeds.setdefault(p.setting, {}).setdefault(p.task, set())
        task |= {r.seed if r.seed is not None else id(r) for r in p.scored
                 if math.isfinite(r.final_reward)}
    return {s: {t: len(v) for t, v in tasks.items()} for s, tasks in seeds.items()}


def seeds_text(per_task: Mapping[str, int]) -> str:
    """``3 per task`` when every task has as many, else ``hopper 3, walker2d 2``."""
    counts = set(per_task.values())
    if len(counts) == 1:
        (n,) = counts
        return f"{n} per task" if len(per_task) > 1 else str(n)
    return ", ".join(f"{t} {n}" for t, n in per_task.items())


def analyse_across(points: Sequence[PointLike], targets: Mapping[str, float],
                   baseline: str | None, *, with_figure: bool = True) -> Across:
    """References, normalized IQM with intervals, probability of improvement over the
    baseline and its verdict, per setting (grid order), and the profile figure; tasks are
    listed in grid order too."""
    points = sorted(points, key=lambda p: p.order)
    ids = task_env_ids(points)
    references = [reference_for(task, env_id, targets) for task, env_id in ids.items()]
    scale = {r.task: r.value for r in references}
    chosen, origin = resolve_baseline(points, baseline)
    scores, seeds = scores_by_setting(points), seeds_by_setting(points)
    base = scores.get(chosen, {})
    rows: list[SettingRow] = []
    normalized: dict[str, list[list[float]]] = {}
    for setting in settings_in_order(points):
        by_task = {t: v for t, v in scores.get(setting, {}).items() if v}
        strata = [[s / ref for s in v] for t, v in by_task.items()
                  if (ref := scale[t]) is not None]
        if strata:
            normalized[setting] = strata
        shared = [t for t in by_task if base.get(t)]
        improvement: Interval | None = None
        if setting == chosen:
            verdict = "baseline"
        elif not shared:
            verdict = "no task in common with the baseline"
        else:
            improvement = statistics.probability_of_improvement(
                [by_task[t] for t in shared], [base[t] for t in shared])
            fewest = min(min(seeds[setting][t], seeds[chosen][t]) for t in shared)
            verdict = statistics.improvement_verdict(improvement, fewest)
        rows.append(SettingRow(setting, tuple(by_task), seeds_text(seeds.get(setting, {})),
                               statistics.iqm_interval(strata) if strata else None,
                               improvement, verdict))
    across = Across(references, chosen, origin, rows)
    if with_figure:
        across.profile = profile_figure(normalized, len([r for r in references if r.value]))
    return across


def profile_figure(normalized: Mapping[str, Sequence[Sequence[float]]], tasks: int
                   ) -> Drawn | None:
    """Performance profiles of the normalized scores (settings with >= 3 runs), strata by
    task; None when no setting has enough runs."""
    shown = {k: v for k, v in normalized.items()
             if sum(len(s) for s in v) >= statistics.MIN_PROFILE_RUNS}
    if not shown:
        return None
    every = np.concatenate([np.asarray(s, dtype=float) for v in shown.values() for s in v])
    taus = np.linspace(float(every.min()), float(every.max()), 60)
    profiles = {k: statistics.performance_profile(v, taus) for k, v in shown.items()}
    colors = figures.palette(list(shown))
    where = f"normalized score, {tasks} task{'' if tasks == 1 else 's'}"
    return Drawn("performance_profile-normalized.png", f"Performance profile, {where}",
                 "Fraction of a configuration's runs whose normalized score (final return / the "
                 "task's reference) exceeds τ, for every τ; bands: stratified bootstrap 95 % "
                 "intervals (strata: the tasks).", "across",
                 figures.profile_figure(profiles, colors, where, score="normalized score"))
