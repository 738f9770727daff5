"""Reports for team review: pick runs, load them from MLflow, write ``reports/<name>/``.

``workbench report --sweep ID | --experiment NAME | --runs ID,ID,...`` (no selector: the
latest sweep) loads the runs' metric histories and manifests, ranks the grid points by final
evaluation reward, runs the diagnostics and bottleneck analysis
(:mod:`workbench.review.diagnostics`), draws the figures
(:mod:`workbench.review.figures`) and writes

- ``index.html``: one self-contained page (figures embedded as data URIs, inline CSS, no
  script, nothing fetched), opens from disk;
- ``report.md``: the same content for a wiki or a pull request, next to the PNG files.

Both are rendered from one list of blocks (:func:`report_blocks`), so they cannot drift apart.
``notebooks/compare.ipynb`` calls :func:`build_report` and shows the same figures and tables.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import html
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench import paths
from workbench.config import ConfigError, load_config
from workbench.review import diagnostics, figures
from workbench.review.diagnostics import Bottleneck, Diagnostic, Series, Thresholds
from workbench.tracking.manifest import MANIFEST_FILE, comparable, headline_tags
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import is_embedded, resolve_tracking_uri

if TYPE_CHECKING:  # mlflow and matplotlib load on use: `workbench --help` stays fast
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

DEFAULT_UI_URL = "http://127.0.0.1:5000"
SWEEP_ID, SWEEP_ROLE, SWEEP_POINT = "sweep_id", "sweep.role", "sweep.point"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Params that differ between seeds or only say where/how a run was recorded: not part of
# what makes a grid point.
POINT_IGNORED = ("seed", "derived.", "tracking.", "console.", "sweep.", "env.num_envs",
                 "algo.n_steps", "env.name", "env.id")


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Selection:
    """Which runs a report shows: one sweep, one experiment, explicit ids, and/or tags."""

    sweep_id: str | None = None
    experiment: str | None = None
    run_ids: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)  # every tag must match

    def __post_init__(self) -> None:
        given = [k for k, v in (("--sweep", self.sweep_id), ("--experiment", self.experiment),
                                ("--runs", self.run_ids)) if v]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)}: give only one of --sweep, --experiment, "
                              "--runs (add --tag KEY=VALUE to narrow any of them)")
        for key, value in [(SWEEP_ID, self.sweep_id or ""), *self.tags.items()]:
            if "'" in key + value or "`" in key:
                raise ConfigError(f"{key}={value!r}: quotes are not allowed in selectors")

    @property
    def is_empty(self) -> bool:
        return not (self.sweep_id or self.experiment or self.run_ids or self.tags)

    def describe(self) -> str:
        """What was selected, in words."""
        parts = []
        if self.sweep_id:
            parts.append(f"sweep {self.sweep_id}")
        if self.experiment:
            parts.append(f"experiment {self.experiment!r}")
        if self.run_ids:
            parts.append(f"{len(self.run_ids)} run id(s)")
        parts += [f"tag {k}={v}" for k, v in self.tags.items()]
        return ", ".join(parts) or "the latest sweep"

    def default_name(self) -> str:
        """The folder name under reports/ (``sweep-<id>``, ``experiment-<name>``, ...)."""
        if self.sweep_id:
            base = f"sweep-{self.sweep_id}"
        elif self.experiment:
            base = f"experiment-{self.experiment}"
        elif self.run_ids:
            digest = hashlib.sha1(",".join(sorted(self.run_ids)).encode()).hexdigest()[:8]
            base = f"runs-{len(self.run_ids)}-{digest}"
        else:
            base = "tags"
        if self.tags:
            base += "-" + "-".join(f"{k}-{v}" for k, v in sorted(self.tags.items()))
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", base)


def search_all(client: MlflowClient, experiment_ids: Sequence[str], filter_string: str = "",
               order_by: Sequence[str] | None = None, limit: int | None = None) -> list[Run]:
    """Every run matching ``filter_string`` (follows MLflow's page tokens)."""
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs(list(experiment_ids), filter_string, max_results=1000,
                                  order_by=list(order_by or []), page_token=token)
        runs.extend(page)
        token = page.token
        if not token or (limit and len(runs) >= limit):
            return runs[:limit] if limit else runs


def all_experiment_ids(client: MlflowClient) -> list[str]:
    """Ids of every active experiment in the store."""
    return [e.experiment_id for e in client.search_experiments()]


def tag_filter(tags: Mapping[str, str]) -> list[str]:
    """MLflow filter clauses for exact tag matches (dotted names quoted with backticks)."""
    return [f"tags.`{k}` = '{v}'" for k, v in tags.items()]


def sweep_parents(client: MlflowClient, experiment_ids: Sequence[str]) -> list[Run]:
    """Sweep parent runs, most recently active first.

    Activity is the later of start and end: a sweep resumed today (its parent is set RUNNING
    again and re-terminated) counts as today's, so ``make demo`` reports the sweep it just ran.
    """
    parents = search_all(client, experiment_ids, f"tags.`{SWEEP_ROLE}` = 'parent'")
    parents = [r for r in parents if r.data.tags.get(SWEEP_ID)]
    return sorted(parents, key=lambda r: max(r.info.start_time or 0, r.info.end_time or 0),
                  reverse=True)


def latest_sweep_id(client: MlflowClient, experiment_ids: Sequence[str]) -> str | None:
    """The sweep_id of the most recently active sweep (parent run, else any sweep run)."""
    parents = sweep_parents(client, experiment_ids)
    if parents:
        return parents[0].data.tags[SWEEP_ID]
    runs = search_all(client, experiment_ids, f"tags.`{SWEEP_ID}` LIKE '%'",
                      ["attributes.start_time DESC"], 1)
    return runs[0].data.tags[SWEEP_ID] if runs else None


def known_sweeps(client: MlflowClient, experiment_ids: Sequence[str], n: int = 5) -> list[str]:
    """Up to ``n`` sweep ids, most recently active first (for error messages)."""
    return [r.data.tags[SWEEP_ID] for r in sweep_parents(client, experiment_ids)[:n]]


def find_runs(client: MlflowClient, selection: Selection, store: str
              ) -> tuple[Selection, list[Run], Run | None]:
    """The selected runs (sweep children, never sweep parents), oldest first.

    Returns the selection (with the latest sweep filled in when none was given), the runs
    and the sweep's parent run when there is one. Nothing matching is a :class:`ConfigError`
    naming what was looked for and what exists.
    """
    experiment_ids = all_experiment_ids(client)
    if selection.is_empty:
        sweep_id = latest_sweep_id(client, experiment_ids)
        if sweep_id is None:
            raise ConfigError(
                f"no sweep found in {store}: run `workbench sweep` first, or choose runs with "
                "--experiment NAME or --runs ID,ID"
            )
        selection = Selection(sweep_id=sweep_id)
    clauses = tag_filter(selection.tags)
    parent: Run | None = None
    if selection.experiment:
        found = client.get_experiment_by_name(selection.experiment)
        if found is None:
            names = ", ".join(sorted(e.name for e in client.search_experiments()))
            raise ConfigError(f"--experiment {selection.experiment}: no such experiment in "
                              f"{store}; experiments: {names or 'none'}")
        experiment_ids = [found.experiment_id]
    if selection.sweep_id:
        clauses.append(f"tags.`{SWEEP_ID}` = '{selection.sweep_id}'")
    if selection.run_ids:
        runs = [get_run(client, run_id, store) for run_id in selection.run_ids]
        runs = [r for r in runs if all(r.data.tags.get(k) == v for k, v in selection.tags.items())]
    else:
        runs = search_all(client, experiment_ids, " and ".join(clauses),
                          ["attributes.start_time ASC"])
    parents = [r for r in runs if r.data.tags.get(SWEEP_ROLE) == "parent"]
    parent = parents[0] if parents and selection.sweep_id else None
    runs = [r for r in runs if r.data.tags.get(SWEEP_ROLE) != "parent"]
    if not runs:
        raise ConfigError(no_runs_message(client, selection, experiment_ids, store))
    return selection, runs, parent


def get_run(client: MlflowClient, run_id: str, store: str) -> Run:
    """One run by id; an unknown id is a :class:`ConfigError`."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        raise ConfigError(f"--runs {run_id}: no such run in {store}; copy run ids from "
                          "`workbench train` output or the MLflow UI") from exc


def no_runs_message(client: MlflowClient, selection: Selection, experiment_ids: Sequence[str],
                    store: str) -> str:
    """One line saying what matched nothing, and what the store has instead."""
    if selection.sweep_id:
        sweeps = known_sweeps(client, experiment_ids)
        hint = f"sweeps (latest first): {', '.join(sweeps)}" if sweeps else "no sweeps there"
        return (f"--sweep {selection.sweep_id}: no runs with tag sweep_id={selection.sweep_id} "
                f"in {store}; {hint}")
    return f"{selection.describe()}: no runs match in {store}"


# --------------------------------------------------------------------------- loading


@dataclass
class RunRecord:
    """One run as the report needs it: identity, tags, params, full metric histories."""

    run_id: str
    name: str
    experiment_id: str
    status: str
    start_ms: int
    end_ms: int | None
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, Series]
    manifest: dict[str, Any] | None = None

    def last(self, key: str) -> float:
        """The last logged value of ``key`` (NaN when never logged)."""
        s = self.metrics.get(key)
        return float(s.values[-1]) if s is not None and len(s) else math.nan

    def number(self, param: str, tag: str) -> int | None:
        """An integer param (or, failing that, tag) such as num_envs."""
        for raw in (self.params.get(param), self.tags.get(tag)):
            try:
                return int(str(raw))
            except (TypeError, ValueError):
                continue
        return None

    @property
    def num_envs(self) -> int | None:
        return self.number("env.num_envs", "num_envs")

    @property
    def n_steps(self) -> int | None:
        return self.number("algo.n_steps", "n_steps")

    @property
    def seed(self) -> int | None:
        return self.number("seed", "seed")

    @property
    def budget(self) -> int | None:
        """total_timesteps the run was configured for."""
        return self.number("total_timesteps", "total_timesteps")

    @property
    def final_reward(self) -> float:
        """Final deterministic evaluation return (``summary/``, else the last evaluation)."""
        value = self.last("summary/eval_mean_reward")
        return value if not math.isnan(value) else self.last("eval/mean_reward")


def load_run(client: MlflowClient, run: Run) -> RunRecord:
    """Metric histories (every key the run logged) and manifest of one run."""
    metrics: dict[str, Series] = {}
    for key in sorted(run.data.metrics):
        history = client.get_metric_history(run.info.run_id, key)
        metrics[key] = Series.of([m.step for m in history], [stored_value(m.value)
                                                              for m in history],
                                 [m.timestamp for m in history])
    return RunRecord(
        run_id=run.info.run_id,
        name=run.info.run_name or run.info.run_id[:8],
        experiment_id=run.info.experiment_id,
        status=run.info.status,
        start_ms=int(run.info.start_time or 0),
        end_ms=run.info.end_time,
        tags=dict(run.data.tags),
        params=dict(run.data.params),
        metrics=metrics,
        manifest=load_manifest(client, run.info.run_id),
    )


def stored_value(value: float) -> float:
    """A metric value as logged: SQL stores keep +-inf as +-float max, restored to +-inf here
    so that the NaN/inf diagnostic sees them (mlflow SqlAlchemyStore.sanitize_metric_value)."""
    return math.copysign(math.inf, value) if abs(value) >= sys.float_info.max else value


@contextlib.contextmanager
def quiet_downloads() -> Iterator[None]:
    """No MLflow progress bar per downloaded manifest (one per run is noise in a report);
    an explicit MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR setting is respected."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if key in os.environ:
        yield
        return
    os.environ[key] = "false"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def load_manifest(client: MlflowClient, run_id: str) -> dict[str, Any] | None:
    """The run's ``manifest.json``, or None when it has none (older runs) or it is unreadable."""
    if MANIFEST_FILE not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory() as tmp, quiet_downloads():
        try:
            local = client.download_artifacts(run_id, MANIFEST_FILE, tmp)
            loaded = json.loads(Path(local).read_text())
        except (OSError, ValueError):
            return None
    return loaded if isinstance(loaded, dict) else None


# --------------------------------------------------------------------------- the report model


@dataclass
class Point:
    """One grid point: the runs (seeds) sharing everything but the seed."""

    label: str
    runs: list[RunRecord]
    diverged: bool = False  # some run has NaN/inf in a metric

    @property
    def num_envs(self) -> int | None:
        return self.runs[0].num_envs

    @property
    def n_steps(self) -> int | None:
        return self.runs[0].n_steps

    def values(self, key: str) -> np.ndarray:
        """Finite final values of ``key`` over the point's runs."""
        found = np.array([r.last(key) for r in self.runs], dtype=float)
        return found[np.isfinite(found)]

    @property
    def rewards(self) -> np.ndarray:
        found = np.array([r.final_reward for r in self.runs], dtype=float)
        return found[np.isfinite(found)]

    @property
    def reward_mean(self) -> float:
        return float(np.mean(self.rewards)) if len(self.rewards) else math.nan

    @property
    def reward_std(self) -> float:
        """Standard deviation over seeds (population, ddof=0); NaN with fewer than two."""
        return float(np.std(self.rewards)) if len(self.rewards) > 1 else math.nan

    def mean(self, key: str) -> float:
        found = self.values(key)
        return float(np.mean(found)) if len(found) else math.nan

    @property
    def peak_rss_mb(self) -> float:
        found = self.values("summary/peak_rss_mb")
        return float(np.max(found)) if len(found) else math.nan

    @property
    def finished(self) -> bool:
        return all(r.status == "FINISHED" for r in self.runs)

    @property
    def status(self) -> str:
        counts = Counter(r.status for r in self.runs)
        return ", ".join(f"{s}" if n == 1 and len(self.runs) == 1 else f"{n} {s}"
                         for s, n in sorted(counts.items()))

    def rank_key(self) -> tuple[bool, bool, float, float, str]:
        """Diverged points last, then unfinished ones, then by mean reward (best first);
        equal rewards (a solved task) by wall time, fastest first."""
        reward, wall = self.reward_mean, self.mean("summary/wall_time_s")
        return (self.diverged, not self.finished, -reward if not math.isnan(reward) else math.inf,
                wall if not math.isnan(wall) else math.inf, self.label)


@dataclass(frozen=True)
class FigureFile:
    """A rendered figure: file name, title, caption, PNG bytes."""

    filename: str
    title: str
    caption: str
    png: bytes


@dataclass
class EnvironmentFacts:
    """What the runs' manifests say about their environment."""

    shared: dict[str, str]  # headline facts (as run tags), when no manifest fact differs
    differing: dict[str, dict[str, list[str]]]  # fact -> value -> run names
    without_manifest: list[str]  # run names

    @property
    def one_environment(self) -> bool:
        return not self.differing and bool(self.shared or not self.without_manifest)


@dataclass
class Report:
    """Everything a report shows, independent of its output format."""

    name: str
    title: str
    selection: str
    store: str
    created_at: str
    ui_url: str
    description: str
    runs: list[RunRecord]
    points: list[Point]  # ranked, best first
    diagnostics: dict[str, list[Diagnostic]]  # run id -> what fired
    bottlenecks: dict[str, Bottleneck]
    environment: EnvironmentFacts
    figures: list[FigureFile]
    thresholds: Thresholds

    def run_url(self, run: RunRecord) -> str:
        """The run's page in the MLflow UI."""
        return f"{self.ui_url.rstrip('/')}/#/experiments/{run.experiment_id}/runs/{run.run_id}"


def group_points(runs: Sequence[RunRecord]) -> list[Point]:
    """Runs grouped into grid points: same params except seed and bookkeeping."""
    varying = varying_params(runs)
    groups: dict[tuple[str, ...], list[RunRecord]] = {}
    for run in runs:
        key = (base_label(run), *(f"{k}={run.params.get(k, '-')}" for k in varying))
        groups.setdefault(key, []).append(run)
    points = []
    for key, members in groups.items():
        label = key[0] + ("  " + ", ".join(key[1:]) if len(key) > 1 else "")
        points.append(Point(label=label, runs=sorted(members, key=lambda r: (r.seed or 0))))
    return points


def varying_params(runs: Sequence[RunRecord]) -> list[str]:
    """Params (other than seed and bookkeeping) whose values differ between the runs."""
    keys = sorted({k for r in runs for k in r.params if not k.startswith(POINT_IGNORED)})
    return [k for k in keys if len({r.params.get(k) for r in runs}) > 1]


def base_label(run: RunRecord) -> str:
    """``<env>-ne<num_envs>-ns<n_steps>`` (the run name without its seed), else the run name."""
    env = run.tags.get("env")
    if env and run.num_envs is not None and run.n_steps is not None:
        return f"{env}-ne{run.num_envs}-ns{run.n_steps}"
    return re.sub(r"-s\d+$", "", run.tags.get(SWEEP_POINT) or run.name)


def sweep_description(parent: Run) -> str:
    """The parent run's description, else its grid in words (from the sweep's params)."""
    note = parent.data.tags.get("mlflow.note.content")
    if note:
        return note
    params = parent.data.params
    grid = " × ".join(f"{key} {params[f'sweep.{key}']}" for key in ("num_envs", "n_steps", "seeds")
                      if f"sweep.{key}" in params)
    if not grid:
        return ""
    budget = params.get("sweep.total_timesteps")
    steps = f", {budget} steps per point" if budget else ""
    env = params.get("sweep.env") or parent.data.tags.get("env", "")
    return (f"Sweep {parent.data.tags.get(SWEEP_ID, '')} on {env}: {grid}{steps}; parent run "
            f"{parent.info.status}.")


def build_report(
    client: MlflowClient,
    selection: Selection = Selection(),  # noqa: B008  (frozen, so a shared default is safe)
    *,
    store: str,
    thresholds: Thresholds | None = None,
    ui_url: str = DEFAULT_UI_URL,
    name: str | None = None,
    with_figures: bool = True,
) -> Report:
    """Select, load and analyse runs; render the figures (unless not wanted). Writes nothing."""
    thresholds = thresholds or Thresholds()
    selection, found, parent = find_runs(client, selection, store)
    runs = [load_run(client, run) for run in found]
    diagnosed = {r.run_id: diagnostics.diagnose(r.metrics, r.budget, thresholds) for r in runs}
    points = group_points(runs)
    for point in points:
        point.diverged = any(d.check == "nonfinite" for r in point.runs
                             for d in diagnosed[r.run_id])
    points.sort(key=Point.rank_key)
    name = name or selection.default_name()
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"name={name!r}: use letters, digits, '.', '_' and '-' only")
    description = sweep_description(parent) if parent else ""
    return Report(
        name=name,
        title=f"Report: {selection.describe()}",
        selection=selection.describe(),
        store=redact_uri(store),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        ui_url=ui_url,
        description=description,
        runs=runs,
        points=points,
        diagnostics=diagnosed,
        bottlenecks={r.run_id: diagnostics.analyse_bottleneck(r.metrics, thresholds)
                     for r in runs},
        environment=environment_facts(runs),
        figures=render_figures(points, thresholds) if with_figures else [],
        thresholds=thresholds,
    )


# --------------------------------------------------------------------------- environment


def manifest_facts(manifest: Mapping[str, Any]) -> dict[str, str]:
    """A manifest's environment facts as ``{"section.key": text}``.

    The manifest module decides what counts as environment (``manifest.comparable``: no
    timestamps, no per-invocation details; pip freeze per package); values become text.
    """
    return {key: fact_text(value) for key, value in comparable(manifest).items()}


def fact_text(value: Any) -> str:
    """A manifest value as table text (lists and mappings as compact JSON)."""
    if value is None:
        return "null"
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def headline_facts(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The facts one filters by (versions, CUDA, GPU, kernel, host, git), as the run tags."""
    try:
        return headline_tags(manifest)
    except (KeyError, TypeError, AttributeError):  # a partial manifest from an older workbench
        return {}


def environment_facts(runs: Sequence[RunRecord]) -> EnvironmentFacts:
    """Facts that differ between the runs' manifests, or the shared headline facts."""
    with_manifest = [r for r in runs if r.manifest]
    without = [r.name for r in runs if not r.manifest]
    per_run = {r.name: manifest_facts(r.manifest or {}) for r in with_manifest}
    keys = sorted({k for facts in per_run.values() for k in facts})
    differing: dict[str, dict[str, list[str]]] = {}
    for key in keys:
        by_value: dict[str, list[str]] = {}
        for run_name, facts in per_run.items():
            by_value.setdefault(facts.get(key, "(absent)"), []).append(run_name)
        if len(by_value) > 1:
            differing[key] = by_value
    shared = headline_facts(with_manifest[0].manifest or {}) if with_manifest and not differing \
        else {}
    return EnvironmentFacts(shared=shared, differing=differing, without_manifest=without)


# --------------------------------------------------------------------------- figures


def render_figures(points: Sequence[Point], thresholds: Thresholds) -> list[FigureFile]:
    """The report's figures as PNG (points in rank order, one color each)."""
    colors = figures.palette([p.label for p in points])

    def curves(key: str) -> list[figures.Curves]:
        return [figures.Curves(p.label, colors[p.label],
                               [r.metrics[key] for r in p.runs if key in r.metrics])
                for p in points]

    out = [
        FigureFile("reward_curves.png", "Reward vs environment steps",
                   "Mean episode return per point; the band is ±1 std over seeds.",
                   figures.png_bytes(figures.reward_figure(curves("rollout/ep_rew_mean"),
                                                           curves("eval/mean_reward")))),
        FigureFile("update_signals.png", "Entropy, clip fraction and approx KL",
                   "Per-iteration PPO update statistics; dashed red: diagnostic thresholds.",
                   figures.png_bytes(figures.signals_figure(
                       curves("train/entropy"), curves("train/clip_fraction"),
                       curves("train/approx_kl"), clip_max=thresholds.clip_fraction_max,
                       kl_max=thresholds.approx_kl_max))),
    ]
    by_env = points_by_env(points)
    for env, env_points in by_env.items():
        cells = grid_cells(env_points)
        if not cells:
            continue
        # Rewards of different tasks do not share a scale: one heatmap figure per task.
        suffix = f"-{re.sub(r'[^A-Za-z0-9_.-]+', '_', env)}" if len(by_env) > 1 else ""
        where = f" ({env})" if len(by_env) > 1 else ""
        out.append(FigureFile(
            f"grid_heatmaps{suffix}.png", f"Final reward, fps and wall time over the grid{where}",
            "Mean over the runs (seeds) of each (num_envs, n_steps) cell; dashed lines join "
            "cells with the same samples per update (num_envs × n_steps).",
            figures.png_bytes(figures.grid_figure(cells, figures.GRID_METRICS))))
    out.append(FigureFile(
        "time_split.png", "Time split per iteration",
        "Seconds per PPO iteration spent collecting rollouts vs updating the policy.",
        figures.png_bytes(figures.time_split_figure([time_split(p) for p in points]))))
    return out


def points_by_env(points: Sequence[Point]) -> dict[str, list[Point]]:
    """Points grouped by their task (the ``env`` tag, else the env.id param)."""
    grouped: dict[str, list[Point]] = {}
    for point in points:
        run = point.runs[0]
        env = run.tags.get("env") or run.params.get("env.id") or "unknown"
        grouped.setdefault(env, []).append(point)
    return grouped


def grid_cells(points: Sequence[Point]) -> dict[tuple[int, int], dict[str, float]]:
    """(num_envs, n_steps) -> mean final reward, fps and wall time over that cell's runs."""
    by_cell: dict[tuple[int, int], list[RunRecord]] = {}
    for point in points:
        for run in point.runs:
            if run.num_envs is not None and run.n_steps is not None:
                by_cell.setdefault((run.num_envs, run.n_steps), []).append(run)
    return {
        cell: {
            "reward": finite_mean(r.final_reward for r in runs),
            "fps": finite_mean(r.last("summary/fps") for r in runs),
            "wall": finite_mean(r.last("summary/wall_time_s") for r in runs),
        }
        for cell, runs in by_cell.items()
    }


def time_split(point: Point) -> figures.TimeSplit:
    """Mean rollout/update/eval seconds per iteration over the point's runs."""
    def per_iteration(key: str) -> float:
        totals, iterations = 0.0, 0
        for run in point.runs:
            s = run.metrics.get(key)
            rollout = run.metrics.get("time/rollout_s")
            if s is not None:
                totals += float(np.nansum(s.values))
            iterations += len(rollout) if rollout is not None else 0
        return totals / iterations if iterations else 0.0

    return figures.TimeSplit(point.label, per_iteration("time/rollout_s"),
                             per_iteration("time/update_s"), per_iteration("time/eval_s"))


def finite_mean(values: Iterable[float]) -> float:
    found = [v for v in values if math.isfinite(v)]
    return float(np.mean(found)) if found else math.nan


# --------------------------------------------------------------------------- content blocks


@dataclass(frozen=True)
class Link:
    """A table cell or text that links somewhere (the MLflow UI)."""

    text: str
    url: str


Cell = str | Link | list[Link]


@dataclass(frozen=True)
class Block:
    """One piece of report content: heading, paragraph, table or figure."""

    kind: str  # h1 | h2 | h3 | p | table | card (a titled small table) | figure
    text: str = ""
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[Cell, ...], ...] = ()
    figure: FigureFile | None = None
    css: str = ""  # a class for the HTML rendering (e.g. "verdict")


def fmt(value: float, spec: str = ".1f", unit: str = "") -> str:
    """A number for a table; NaN/None as an en dash, inf spelled out."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:{spec}}{unit}"


def report_blocks(report: Report) -> list[Block]:
    """The whole report as blocks, in reading order (HTML and Markdown render these)."""
    n_runs, n_points = len(report.runs), len(report.points)
    blocks = [
        Block("h1", report.title),
        Block("p", f"{n_runs} run(s) at {n_points} point(s) · store {report.store} · "
                   f"generated {report.created_at}"),
    ]
    if report.description:
        blocks.append(Block("p", report.description))
    blocks += ranking_blocks(report)
    blocks += [Block("h2", "Figures")]
    for fig in report.figures:
        blocks += [Block("h3", fig.title), Block("figure", fig.caption, figure=fig)]
    blocks += diagnostic_blocks(report)
    blocks += bottleneck_blocks(report)
    blocks += environment_blocks(report.environment)
    blocks += run_blocks(report)
    return blocks


def ranking_blocks(report: Report) -> list[Block]:
    """The ranked table of points."""
    rows = []
    for rank, p in enumerate(report.points, start=1):
        seeds = len(p.runs)
        reward = fmt(p.reward_mean, ".1f")
        if seeds > 1 and not math.isnan(p.reward_std):
            reward += f" ± {p.reward_std:.1f}"
        flag = " (diverged)" if p.diverged else ""
        rows.append((
            str(rank), p.label + flag, str(seeds), reward, fmt(p.mean("summary/fps"), ".0f"),
            fmt(p.mean("summary/wall_time_s"), ".1f"), fmt(p.peak_rss_mb, ".0f"), p.status,
            [Link(f"s{r.seed}" if r.seed is not None else r.name, report.run_url(r))
             for r in p.runs],
        ))
    return [
        Block("h2", "Ranking"),
        Block("p", "Ranked by final deterministic evaluation reward (mean over seeds, ± std "
                   "over seeds); equal rewards by wall time, fastest first. Points with NaN/inf "
                   "in any metric rank below all others, then points with runs that did not "
                   "finish."),
        Block("table", headers=("#", "point", "seeds", "final eval reward", "fps (steps/s)",
                                "wall time (s)", "peak memory (MiB)", "status", "runs"),
              rows=tuple(rows)),
    ]


def diagnostic_blocks(report: Report) -> list[Block]:
    """One row per fired diagnostic, with numbers and remedy; silent runs listed."""
    t = report.thresholds
    rows = [(Link(run.name, report.run_url(run)), d.title, d.evidence, d.remedy)
            for run in report.runs for d in report.diagnostics[run.run_id]]
    quiet = [run.name for run in report.runs if not report.diagnostics[run.run_id]]
    blocks = [
        Block("h2", "Diagnostics"),
        Block("p", f"Thresholds: clip_fraction > {t.clip_fraction_max:g} for "
                   f"{t.clip_fraction_iterations} iterations; approx KL > {t.approx_kl_max:g} in "
                   f"{t.approx_kl_iterations} iterations; "
                   f"entropy (policy std) below {t.entropy_collapse_ratio:g} × its start within "
                   f"{t.entropy_early_fraction:.0%} of the budget; reward change below "
                   f"{t.reward_flat_min_change:.0%} after {t.reward_flat_after_fraction:.0%} "
                   f"of the budget; iteration time × {t.iteration_time_growth:g}; NaN/inf "
                   "anywhere. Change them with `workbench report --help` options."),
    ]
    if rows:
        blocks.append(Block("table", headers=("run", "diagnostic", "numbers", "usual remedy"),
                            rows=tuple(rows), css="diagnostics"))
    else:
        blocks.append(Block("p", "No diagnostic fired for any run."))
    if rows and quiet:
        blocks.append(Block("p", f"No diagnostic fired for: {', '.join(quiet)}."))
    return blocks


def bottleneck_blocks(report: Report) -> list[Block]:
    """A small verdict table per run."""
    blocks = [
        Block("h2", "Where the time goes"),
        Block("p", f"Rollout vs update time from time/rollout_s and time/update_s; CPU, GPU "
                   f"and memory from MLflow's system metrics. A phase with ≥ "
                   f"{report.thresholds.bound_share:.0%} of the iteration time dominates; busy "
                   f"means CPU ≥ {report.thresholds.cpu_busy_percent:g}% or GPU ≥ "
                   f"{report.thresholds.gpu_busy_percent:g}%."),
    ]
    for run in report.runs:
        b = report.bottlenecks[run.run_id]
        rise = b.memory_rise_mb
        memory = (f"{b.memory_start_mb:.0f} → {b.memory_end_mb:.0f} MB ({rise:+.0f} MB)"
                  if rise is not None and b.memory_start_mb is not None
                  and b.memory_end_mb is not None else "too few samples")
        rows = (
            ("rollout / update time", f"{b.rollout_s:.2f} s / {b.update_s:.2f} s "
                                      f"({fmt(b.rollout_share * 100, '.0f')}% rollout)"),
            ("CPU utilization (mean)", fmt(b.cpu_percent, ".0f", "%")
             if b.cpu_percent is not None else "not logged"),
            ("GPU utilization (mean)", fmt(b.gpu_percent, ".0f", "%")
             if b.gpu_percent is not None else "no GPU metrics"),
            ("system memory, whole machine (first → last quarter)", memory),
            ("verdict", " + ".join(b.verdicts)),
            ("usual remedy", b.remedy),
        )
        blocks.append(Block("card", run.name, headers=("quantity", "value"), rows=rows,
                            css="verdict"))
    return blocks


def environment_blocks(env: EnvironmentFacts) -> list[Block]:
    """Manifest facts that differ between runs, or the one shared environment."""
    blocks = [Block("h2", "Environment")]
    if env.differing:
        rows = tuple((fact, value, ", ".join(names))
                     for fact, by_value in env.differing.items()
                     for value, names in by_value.items())
        blocks += [Block("p", f"{len(env.differing)} manifest fact(s) differ between the runs "
                              "shown:"),
                   Block("table", headers=("fact", "value", "runs"), rows=rows)]
    elif env.shared:
        blocks += [Block("p", "All runs share one environment."),
                   Block("table", headers=("fact", "value"),
                         rows=tuple(env.shared.items()))]
    if env.without_manifest:
        blocks.append(Block("p", "No manifest.json (recorded before manifests existed, or by "
                                 f"an older workbench): {', '.join(env.without_manifest)}."))
    return blocks


def run_blocks(report: Report) -> list[Block]:
    """Every run shown, with a link to its MLflow page."""
    rows = tuple(
        (Link(r.name, report.run_url(r)), r.run_id, r.status,
         datetime.fromtimestamp(r.start_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S"),
         fmt(r.final_reward, ".1f"), r.tags.get("mlflow.note.content", ""))
        for r in report.runs
    )
    return [Block("h2", "Runs"),
            Block("table", headers=("run", "run id", "status", "started (UTC)",
                                    "final eval reward", "description"), rows=rows)]


# --------------------------------------------------------------------------- rendering

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 1500px; padding: 0 1.5rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 2rem; margin-bottom: .2rem; }
h2 { font-size: 1.5rem; border-bottom: 2px solid #ccc; padding-bottom: .2rem; margin-top: 2.2rem; }
h3 { font-size: 1.15rem; margin: 1.4rem 0 .4rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .95rem; }
th, td { border: 1px solid #ccc; padding: .35rem .6rem; text-align: left; vertical-align: top; }
th { background: #f0f0f3; }
tr:nth-child(even) td { background: #fafafa; }
table.diagnostics td:nth-child(2) { font-weight: 600; color: #a12020; white-space: nowrap; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr));
         gap: 0 1.5rem; }
.card table { width: 100%; }
table.verdict td:first-child { width: 45%; color: #555; }
figure { margin: .5rem 0 1.5rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e3e3; }
figcaption { color: #555; font-size: .95rem; margin-top: .3rem; }
a { color: #0a5ad4; }
"""


def html_cell(cell: Cell) -> str:
    if isinstance(cell, Link):
        return f'<a href="{html.escape(cell.url)}">{html.escape(cell.text)}</a>'
    if isinstance(cell, list):
        return " ".join(html_cell(c) for c in cell)
    return html.escape(cell)


def render_html(report: Report, blocks: Sequence[Block]) -> str:
    """One self-contained page: inline CSS, figures as data URIs, no scripts."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(report.title)}</title>", f"<style>{CSS}</style>", "</head>",
        "<body>", blocks_html(blocks), "</body>", "</html>",
    ]) + "\n"


def blocks_html(blocks: Sequence[Block]) -> str:
    """HTML for blocks (also what the notebook displays)."""
    parts: list[str] = []
    for i, b in enumerate(blocks):
        previous = blocks[i - 1].kind if i else ""
        following = blocks[i + 1].kind if i + 1 < len(blocks) else ""
        if b.kind == "card" and previous != "card":
            parts.append('<div class="cards">')  # consecutive cards share a grid
        if b.kind in ("h1", "h2", "h3", "p"):
            parts.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "table":
            parts.append(html_table(b))
        elif b.kind == "card":
            parts.append(f'<section class="card"><h3>{html.escape(b.text)}</h3>'
                         f"{html_table(b)}</section>")
        elif b.kind == "figure" and b.figure is not None:
            data = base64.b64encode(b.figure.png).decode("ascii")
            parts.append(f'<figure><img src="data:image/png;base64,{data}" '
                         f'alt="{html.escape(b.figure.title)}">'
                         f"<figcaption>{html.escape(b.text)}</figcaption></figure>")
        if b.kind == "card" and following != "card":
            parts.append("</div>")
    return "\n".join(parts)


def html_table(b: Block) -> str:
    css = f' class="{b.css}"' if b.css else ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in b.headers)
    body = "".join("<tr>" + "".join(f"<td>{html_cell(c)}</td>" for c in row) + "</tr>"
                   for row in b.rows)
    return f"<table{css}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def md_cell(cell: Cell) -> str:
    if isinstance(cell, Link):
        return f"[{md_escape(cell.text)}]({cell.url})"
    if isinstance(cell, list):
        return " ".join(md_cell(c) for c in cell)
    return md_escape(cell)


def md_escape(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: Sequence[Block]) -> str:
    """The same content as Markdown; figures reference the PNG files next to it."""
    lines: list[str] = []
    marks = {"h1": "#", "h2": "##", "h3": "###"}
    for b in blocks:
        if b.kind in marks:
            lines += [f"{marks[b.kind]} {b.text}", ""]
        elif b.kind == "p":
            lines += [b.text, ""]
        elif b.kind in ("table", "card"):
            if b.kind == "card":
                lines += [f"### {b.text}", ""]
            lines.append("| " + " | ".join(md_escape(h) for h in b.headers) + " |")
            lines.append("|" + "---|" * len(b.headers))
            lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in b.rows]
            lines.append("")
        elif b.kind == "figure" and b.figure is not None:
            lines += [f"![{b.figure.title}]({b.figure.filename})", "", f"*{b.text}*", ""]
    return "\n".join(lines)


def write_report(report: Report, out_dir: Path) -> Path:
    """Write ``index.html``, ``report.md`` and the PNGs to ``out_dir``; returns index.html.

    Written to a sibling folder first and swapped in, so an interrupted write never leaves a
    half-updated report and figures of an earlier version never linger.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        blocks = report_blocks(report)
        for fig in report.figures:
            (staging / fig.filename).write_bytes(fig.png)
        (staging / "index.html").write_text(render_html(report, blocks), encoding="utf-8")
        (staging / "report.md").write_text(render_markdown(blocks), encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp makes it private; a report is for the team
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "index.html"


# --------------------------------------------------------------------------- command line

def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``workbench report``'s selectors, output options, one option per threshold, overrides."""
    select = parser.add_argument_group("which runs (none: the latest sweep)")
    which = select.add_mutually_exclusive_group()
    which.add_argument("--sweep", metavar="ID", type=non_empty,
                       help="a sweep's points (its sweep id)")
    which.add_argument("--experiment", metavar="NAME", type=non_empty,
                       help="every run of an MLflow experiment")
    which.add_argument("--runs", metavar="ID,ID,...", type=run_ids, help="these runs")
    select.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", type=tag,
                        help="only runs with this tag (repeatable)")
    parser.add_argument("--name", help="folder under reports/ (default: from the selection)")
    parser.add_argument("--out", type=Path, help="parent folder (default: reports/)")
    parser.add_argument("--ui-url", default=DEFAULT_UI_URL,
                        help=f"MLflow UI base for run links (default {DEFAULT_UI_URL})")
    group = parser.add_argument_group("diagnostic thresholds")
    defaults = Thresholds()
    for f in fields(Thresholds):
        kind = int if f.type in ("int", int) else float
        default = getattr(defaults, f.name)
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind,
                           default=default,
                           help=f"{f.metadata['help']} (default {default:g})")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides locating the store, e.g. tracking.uri=...")


def non_empty(text: str) -> str:
    """A selector value, e.g. ``--sweep ID``: not empty."""
    if not text:
        raise argparse.ArgumentTypeError("empty value; give an id or a name")
    return text


def run_ids(text: str) -> tuple[str, ...]:
    """``--runs a,b,c``: the run ids, none empty."""
    ids = tuple(r.strip() for r in text.split(","))
    if not all(ids):
        raise argparse.ArgumentTypeError(f"{text!r}: give run ids separated by commas")
    return ids


def tag(text: str) -> tuple[str, str]:
    """``--tag KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: write KEY=VALUE, e.g. --tag env=hopper")
    return key, value


def selection_from_args(args: argparse.Namespace) -> Selection:
    """The :class:`Selection` the command-line flags name."""
    return Selection(args.sweep, args.experiment, args.runs or (), dict(args.tag))


def run_command(args: argparse.Namespace) -> int:
    """``workbench report``: write the report and print the path of its index.html."""
    selection = selection_from_args(args)
    thresholds = Thresholds(**{f.name: getattr(args, f.name) for f in fields(Thresholds)})
    if args.name is not None and not NAME_PATTERN.match(args.name):
        raise ConfigError(f"--name {args.name!r}: use letters, digits, '.', '_' and '-' only")
    report = open_report(selection, overrides=args.overrides, thresholds=thresholds,
                         ui_url=args.ui_url, name=args.name)
    fired = sum(len(d) for d in report.diagnostics.values())
    print(f"report: {len(report.runs)} run(s), {len(report.points)} point(s), {fired} "
          f"diagnostic(s) fired ({report.selection})", file=sys.stderr)
    index = write_report(report, (args.out or paths.reports_dir()) / report.name)
    print(index)
    return 0


def open_report(
    selection: Selection = Selection(),  # noqa: B008  (frozen)
    *,
    overrides: Sequence[str] = (),
    thresholds: Thresholds | Mapping[str, Any] | None = None,
    ui_url: str = DEFAULT_UI_URL,
    name: str | None = None,
) -> Report:
    """Build a report against the configured store (the CLI's and the notebook's entry).

    ``overrides`` are config overrides that locate the store (``tracking.uri=...``);
    ``MLFLOW_TRACKING_URI`` wins as everywhere. ``thresholds`` may be a plain dict.
    """
    if thresholds is None or isinstance(thresholds, Mapping):
        thresholds = Thresholds.from_mapping(thresholds or {})
    cfg = load_config(overrides)
    uri = resolve_tracking_uri(cfg.tracking.uri)
    return build_report(open_store(uri), selection, store=uri, thresholds=thresholds,
                        ui_url=ui_url, name=name)


def open_store(uri: str) -> MlflowClient:
    """A client for an existing store; a missing embedded store is bad input (nothing created)."""
    from mlflow.tracking import MlflowClient


    if is_embedded(uri):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise ConfigError(f"tracking store {uri}: no such database; train or sweep first, "
                              "or set MLFLOW_TRACKING_URI / tracking.uri to the team's store")
    return MlflowClient(tracking_uri=uri)
