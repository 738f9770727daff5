"""What a report is made of: the runs with their metric histories and manifests, grouped
into points (configurations: the seeds of one config, :mod:`workbench.review.configurations`),
the environment facts, the diagnostics, the figures, and per task and across tasks the
configurations compared. :func:`build_report` assembles a :class:`Report` from a selection;
rendering it is :mod:`workbench.review.render`'s.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.config import CONFIG_ID_TAG, ConfigError, interpolation_sources
from workbench.review import configurations, diagnostics, figures, tradeoff
from workbench.review.configurations import Across, GridLayout
from workbench.review.diagnostics import Bottleneck, Diagnostic, Series, Thresholds
from workbench.review.tradeoff import Tradeoff, TradeoffOptions
from workbench.review.videos import PointVideo, point_videos
from workbench.sweeps.kernels import KERNEL_KEY
from workbench.tracking.manifest import MANIFEST_FILE, headline_tags
from workbench.tracking.manifest_diff import comparable
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import check_store, is_embedded, ui_link

if TYPE_CHECKING:  # mlflow and matplotlib load on use: `workbench --help` stays fast
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient
from workbench.review.options import DEFAULT_UI_URL, NAME_PATTERN, check_ui_url
from workbench.review.selection import SWEEP_ID, SWEEP_POINT, Selection, find_runs

# Params that differ between seeds or only say where/how a run was recorded: not part of
# what makes a grid point.
POINT_IGNORED = ("seed", "derived.", "tracking.", "console.", "sweep.", "env.num_envs",
                 "algo.n_steps", "env.name", "env.id")


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
    return run_record(run, metrics, load_manifest(client, run.info.run_id))


def run_record(run: Run, metrics: dict[str, Series] | None = None,
               manifest: dict[str, Any] | None = None) -> RunRecord:
    """A run's record from what the search returned (identity, tags, params); without
    ``metrics`` it is enough to group and label points, before any history is loaded."""
    return RunRecord(
        run_id=run.info.run_id,
        name=run.info.run_name or run.info.run_id[:8],
        experiment_id=run.info.experiment_id,
        status=run.info.status,
        start_ms=int(run.info.start_time or 0),
        end_ms=run.info.end_time,
        tags=dict(run.data.tags),
        params=dict(run.data.params),
        metrics=metrics or {},
        manifest=manifest,
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


# --------------------------------------------------------------------------- the report


@dataclass
class Point:
    """One configuration: the runs (seeds) sharing everything but the seed."""

    label: str
    runs: list[RunRecord]
    diverged: bool = False  # some run has NaN/inf in a metric
    task: str = ""  # the env it trained on (tradeoff.task_of)
    setting: str = ""  # the label without the task: the same configuration on every task
    order: int = 0  # its place in grid order (the sweep's, else the selection's)

    @property
    def num_envs(self) -> int | None:
        return self.runs[0].num_envs

    @property
    def scored(self) -> list[RunRecord]:
        """The runs the point's statistics count: FINISHED ones, one per seed (the one that
        ended last), so a stopped attempt or a rerun of a seed never enters a mean, an
        interval or a curve; :attr:`runs` still lists every run."""
        return scored_runs(self.runs)

    @property
    def plotted(self) -> list[RunRecord]:
        """The runs a figure draws: the scored ones, or while none has finished, every run
        (how far it got)."""
        return self.scored or self.runs

    @property
    def seeds(self) -> int:
        """Distinct seeds among the runs (a rerun of a seed is not another seed)."""
        return distinct_seeds(self.runs)

    @property
    def runs_text(self) -> str:
        """``3 seeds``, or ``4 runs of 1 seed`` when seeds repeat (see :func:`runs_text`)."""
        return runs_text(self.runs)

    @property
    def n_steps(self) -> int | None:
        return self.runs[0].n_steps

    def values(self, key: str) -> np.ndarray:
        """Finite final values of ``key`` over the point's scored runs."""
        found = np.array([r.last(key) for r in self.scored], dtype=float)
        return found[np.isfinite(found)]

    @property
    def rewards(self) -> np.ndarray:
        found = np.array([r.final_reward for r in self.scored], dtype=float)
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
        """Every seed the point trained has a FINISHED run (a stopped attempt of a seed that
        was then run to its end does not count against it)."""
        return distinct_seeds(self.scored) == self.seeds

    @property
    def status(self) -> str:
        counts = Counter(r.status for r in self.runs)
        return ", ".join(f"{s}" if n == 1 and len(self.runs) == 1 else f"{n} {s}"
                         for s, n in sorted(counts.items()))

    def rank_key(self) -> tuple[bool, bool, float, float, str]:
        """Diverged points last, then unfinished ones, then by mean reward (best first);
        equal rewards (a solved task) by training time, fastest first."""
        reward, wall = self.reward_mean, self.mean("summary/wall_time_s")
        return (self.diverged, not self.finished, -reward if not math.isnan(reward) else math.inf,
                wall if not math.isnan(wall) else math.inf, self.label)


def scored_runs(runs: Sequence[RunRecord]) -> list[RunRecord]:
    """The FINISHED runs, one per seed (the one that ended last), in the order given."""
    newest: dict[object, RunRecord] = {}
    for run in runs:
        if run.status != "FINISHED":
            continue
        seed = run.seed if run.seed is not None else run.run_id
        if seed not in newest or (run.end_ms or 0) >= (newest[seed].end_ms or 0):
            newest[seed] = run
    kept = {id(run) for run in newest.values()}
    return [run for run in runs if id(run) in kept]


def distinct_seeds(runs: Sequence[RunRecord]) -> int:
    """How many different seeds ``runs`` trained with; a run without one counts as its own."""
    return len({run.seed if run.seed is not None else run.run_id for run in runs})


def runs_text(runs: Sequence[RunRecord]) -> str:
    """``1 seed``, ``3 seeds``; ``4 runs of 1 seed`` or ``5 runs of 3 seeds`` when runs
    repeat a seed: four runs of seed 0 are one seed's spread, not four seeds'."""
    seeds = distinct_seeds(runs)
    counted = f"{seeds} seed{'' if seeds == 1 else 's'}"
    return counted if seeds == len(runs) else f"{len(runs)} runs of {counted}"


@dataclass(frozen=True)
class FigureFile:
    """A rendered figure: file name, title, caption, PNG bytes, the report section it sits in
    ("figures": the figure list; "scaling": the scaling ladder's section)."""

    filename: str
    title: str
    caption: str
    png: bytes
    section: str = "figures"


@dataclass(frozen=True)
class Section:
    """An extra part of a report after the ranking (a study's figures and top trials): a
    title, a paragraph, a table (a cell is text, or ``(text, url)`` for a link) and figures."""

    title: str
    text: str
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[str | tuple[str, str], ...], ...] = ()
    figures: tuple[FigureFile, ...] = ()


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
    sections: list[Section] = field(default_factory=list)  # e.g. a study's (review/study.py)
    # IQM intervals, time to target, scaling ladders (review.tradeoff)
    tradeoff: Tradeoff = field(default_factory=Tradeoff)
    videos: list[PointVideo] = field(default_factory=list)  # each point's best seed
    across: Across | None = None  # configurations across tasks (review.configurations)

    def run_url(self, run: RunRecord) -> str:
        """The run's page in the MLflow UI."""
        return ui_link(self.ui_url, run.experiment_id, run.run_id)


def group_points(runs: Sequence[RunRecord], layout: GridLayout = GridLayout()  # noqa: B008
                 ) -> list[Point]:
    """Runs grouped into configurations: same ``workbench.config_id`` and kernel (runs
    without a config id, older ones: same params except seed and bookkeeping), in grid order.

    Labels name the grid keys that vary (``lr=1e-4 env=hopper``,
    :func:`configurations.label_keys`); a num_envs x n_steps sweep and runs without grid tags
    keep ``<env>-ne<N>-ns<S>`` and the params that differ. Two configurations that would
    share a label get their config id's first characters appended.
    """
    varying = varying_params(runs)
    keys = configurations.label_keys(runs, layout)
    groups: dict[tuple[str, ...], list[RunRecord]] = {}
    names: dict[tuple[str, ...], tuple[str, str]] = {}
    order: dict[tuple[str, ...], int] = {}
    for index, run in enumerate(runs):
        legacy = (base_label(run), *(f"{k}={run.params.get(k, '-')}" for k in varying))
        config_id = run.tags.get(CONFIG_ID_TAG)
        # one configuration in two software stacks (sweep.kernel) is two points
        key = ("config", config_id, run.tags.get(KERNEL_KEY, "")) if config_id else \
            ("runs", *legacy)
        groups.setdefault(key, []).append(run)
        if key not in names:
            label = legacy[0] + ("  " + ", ".join(legacy[1:]) if len(legacy) > 1 else "")
            names[key] = configurations.grid_label(run.tags, keys) or (
                label, configurations.legacy_setting(label, tradeoff.task_of(run)))
        where = layout.position(run.tags.get(SWEEP_POINT))
        place = where if where is not None else len(layout.point_names) + index
        order[key] = min(order.get(key, place), place)
    labels = Counter(label for label, _ in names.values())
    points = []
    for key, members in groups.items():
        label, setting = names[key]
        if labels[label] > 1 and key[0] == "config":
            label, setting = f"{label} [{key[1][:8]}]", f"{setting} [{key[1][:8]}]"
        points.append(Point(label=label, runs=sorted(members, key=lambda r: (r.seed or 0)),
                            task=tradeoff.task_of(members[0]), setting=setting,
                            order=order[key]))
    return points


def varying_params(runs: Sequence[RunRecord]) -> list[str]:
    """Params (other than seed, bookkeeping and keys that follow from others) whose values
    differ between the runs.

    Only runs that logged a param count for it: a point that failed before training logged
    none, and its run must not make every param look varied (labels listing ~50 params).
    ``algo.batch_size``, half a rollout by default, follows from num_envs and n_steps, which
    the label names already.
    """
    followed = set(default_interpolations())
    keys = sorted({k for r in runs for k in r.params
                   if not k.startswith(POINT_IGNORED) and k not in followed})
    return [k for k in keys if len({r.params[k] for r in runs if k in r.params}) > 1]


@functools.cache
def default_interpolations() -> tuple[str, ...]:
    """The keys the default composition interpolates from others (``algo.batch_size``)."""
    return tuple(interpolation_sources())


def base_label(run: RunRecord) -> str:
    """``<env>-ne<num_envs>-ns<n_steps>`` (the run name without its seed), else the run name."""
    env = run.tags.get("env")
    if env and run.num_envs is not None and run.n_steps is not None:
        return f"{env}-ne{run.num_envs}-ns{run.n_steps}"
    return re.sub(r"-s\d+$", "", run.tags.get(SWEEP_POINT) or run.name)


def sweep_description(parent: Run, runs: Sequence[RunRecord],
                      layout: GridLayout = GridLayout()) -> str:  # noqa: B008
    """The sweep as its point runs show it (every attempt's points: one that added seeds
    through ``sweep.id=`` included): the grid keys it varied, in the sweep's order, its
    seeds, its points and runs, and its parent's status."""
    if not runs:
        return parent.data.tags.get("mlflow.note.content", "")
    values: dict[str, set[str]] = {}
    for run in runs:  # a sweep older than grid tags: its num_envs and n_steps tags
        keys = configurations.grid_values(run.tags) or {
            k: run.tags[k] for k in ("num_envs", "n_steps") if run.tags.get(k)}
        for key, value in keys.items():
            values.setdefault(key, set()).add(value)
    rank = {k: i for i, k in enumerate(dict.fromkeys([*layout.keys, *configurations.SHORTHAND]))}
    swept = sorted((k for k, found in values.items() if len(found) > 1),
                   key=lambda k: (rank.get(k, len(rank)), k))
    seeds = {str(r.seed) for r in runs if r.seed is not None}
    axes = [f"{short_key(key)} {listed(values[key])}" for key in swept]
    axes.append(f"seeds {listed(seeds)}")
    points = len({r.tags.get(SWEEP_POINT) or r.run_id for r in runs})
    attempts = f" ({len(runs)} runs)" if len(runs) != points else ""
    env = parent.data.params.get("sweep.env") or parent.data.tags.get("env", "")
    budget = parent.data.params.get("sweep.total_timesteps")
    steps = f" of {budget} steps" if budget else ""
    return (f"Sweep {parent.data.tags.get(SWEEP_ID, '')} on {env}: {' × '.join(axes)}, "
            f"{points} point{'' if points == 1 else 's'}{attempts}{steps}; parent run "
            f"{parent.info.status}.")


def short_key(key: str) -> str:
    """``num_envs`` and ``n_steps`` for the shorthand axes (as the sweep's header names
    them); any other grid key as written."""
    return key.rsplit(".", 1)[-1] if key in configurations.SHORTHAND_KEYS else key


def listed(values: Iterable[str]) -> str:
    """``[1, 2, 16]``: a grid axis's values as written, numbers in numeric order."""
    def order(value: str) -> tuple[int, float, str]:
        try:
            return 0, float(value), value
        except ValueError:
            return 1, 0.0, value
    return "[" + ", ".join(sorted(values, key=order)) + "]"


def build_report(
    client: MlflowClient,
    selection: Selection = Selection(),  # noqa: B008  (frozen, so a shared default is safe)
    *,
    store: str,
    thresholds: Thresholds | None = None,
    ui_url: str = DEFAULT_UI_URL,
    name: str | None = None,
    with_figures: bool = True,
    options: TradeoffOptions | None = None,
) -> Report:
    """Select, load and analyse runs; render the figures (unless not wanted). Writes nothing."""
    thresholds = thresholds or Thresholds()
    ui_url = check_ui_url(ui_url)
    store = redact_uri(store)  # it is quoted in messages and on the page
    options = options or TradeoffOptions()
    selection, found, parent = find_runs(client, selection, store)
    layout = GridLayout.of(parent.data.params) if parent else GridLayout()
    # --target-return's tasks and --baseline checked on tags and params, before any history
    check_options(group_points([run_record(run) for run in found], layout), options)
    runs = [load_run(client, run) for run in found]
    diagnosed = {r.run_id: diagnostics.diagnose(r.metrics, r.budget, thresholds) for r in runs}
    points = group_points(runs, layout)
    for point in points:
        point.diverged = any(d.check == "nonfinite" for r in point.runs
                             for d in diagnosed[r.run_id])
    points.sort(key=Point.rank_key)
    analysis = tradeoff.analyse(points, options)
    name = name or selection.default_name()
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"name={name!r}: use letters, digits, '.', '_' and '-' only")
    description = sweep_description(parent, runs, layout) if parent else ""
    across = configurations.analyse_across(points, options.targets, options.baseline,
                                           with_figure=with_figures) \
        if compares_configurations(runs, points, layout, options) else None
    sections = task_sections(points, analysis, with_figures)
    if across is not None:
        sections.append(across_section(across))
    return Report(
        name=name,
        title=f"Report: {selection.describe()}",
        selection=selection.describe(),
        store=store,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        ui_url=ui_url,
        description=description,
        runs=runs,
        points=points,
        diagnostics=diagnosed,
        bottlenecks={r.run_id: diagnostics.analyse_bottleneck(r.metrics, thresholds)
                     for r in runs},
        environment=environment_facts(runs),
        figures=render_figures(points, thresholds, analysis) if with_figures else [],
        thresholds=thresholds,
        tradeoff=analysis,
        videos=point_videos(client, points),
        sections=sections,
        across=across,
    )


def check_options(points: Sequence[Point], options: TradeoffOptions) -> None:
    """``--target-return TASK=...`` names a task of the selection and ``--baseline`` one of
    its configurations (:class:`ConfigError` otherwise)."""
    configurations.check_targets(points, options.targets)
    if options.baseline is not None:
        configurations.resolve_baseline(points, options.baseline)


def compares_configurations(runs: Sequence[RunRecord], points: Sequence[Point],
                            layout: GridLayout, options: TradeoffOptions) -> bool:
    """The report compares configurations across tasks when the selection holds several
    tasks, or a grid labels its points (``sweep.grid``), or ``--baseline`` asks for it; a
    num_envs x n_steps sweep of one task keeps its report as it was."""
    return (len({p.task for p in points}) > 1 or bool(configurations.label_keys(runs, layout))
            or options.baseline is not None)


def task_sections(points: Sequence[Point], analysis: Tradeoff, with_figures: bool
                  ) -> list[Section]:
    """One section per task when the points hold several: its configurations (rank order)
    with the IQM of the final return and its interval, and its reward curves."""
    by_env = points_by_env(points)
    if len(by_env) < 2:
        return []
    colors = figures.palette([p.label for p in points])
    sections = []
    for task, task_points in by_env.items():
        rows = tuple((p.setting, configurations.interval_text(analysis.intervals.get(p.label)),
                      p.runs_text) for p in task_points)
        shown: tuple[FigureFile, ...] = ()
        if with_figures:
            def curves(key: str, task_points: Sequence[Point] = task_points
                       ) -> list[figures.Curves]:
                return [figures.Curves(p.setting, colors[p.label],
                                       [r.metrics[key] for r in p.plotted if key in r.metrics])
                        for p in task_points]

            shown = (FigureFile(
                f"reward_curves-{tradeoff.suffix(task)}.png",
                f"Reward vs environment steps, {task}",
                f"Mean episode return of each configuration on {task}; the band is ±1 std over "
                "its runs.", figures.png_bytes(figures.reward_figure(
                    curves("rollout/ep_rew_mean"), curves("eval/mean_reward")))),)
        sections.append(Section(
            f"Task: {task}",
            f"The configurations that ran on {task}, best first: IQM of the final "
            "deterministic evaluation return over the seeds, with its stratified bootstrap "
            "95% interval.",
            headers=("configuration", "final return IQM [95% CI]", "seeds"), rows=rows,
            figures=shown))
    return sections


def across_section(across: Across) -> Section:
    """The configurations compared across tasks: normalized score and probability of
    improvement over the baseline, with the references and the verdict rule."""
    used = [r.text() for r in across.references if r.value is not None]
    left = [f"{r.task} ({r.source})" for r in across.left_out]
    text = (
        "Normalized score: final evaluation return / the task's reference; per configuration "
        "the IQM over its runs of every task with a reference, with a stratified bootstrap "
        "95% interval (strata: the tasks). References: "
        f"{'; '.join(used) or 'none'}. "
        + (f"Left out of the normalized score, no reference: {'; '.join(left)}. " if left
           else "")
        + f"Baseline: {across.baseline} ({across.baseline_origin}; --baseline "
        "LABEL_OR_CONFIG_ID picks another). P(better than baseline): the probability that "
        "a run of the configuration scores above a run of the baseline on the same task, "
        "averaged over the tasks both ran (it compares within a task, so it needs no "
        "reference), with a stratified bootstrap 95% interval. Verdict: better when the "
        "whole interval lies above 0.5, worse when below, else not distinguishable with N "
        "seeds (N: the fewest seeds either side has on a task).")
    rows = tuple((row.setting, ", ".join(row.tasks), row.seeds,
                  configurations.interval_text(row.normalized, ".2f"),
                  configurations.interval_text(row.improvement, ".2f"), row.verdict)
                 for row in across.rows)
    shown = () if across.profile is None else (FigureFile(
        across.profile.filename, across.profile.title, across.profile.caption,
        figures.png_bytes(across.profile.figure), "across"),)
    return Section("Across tasks: configurations against the baseline", text,
                   headers=("configuration", "tasks", "seeds", "normalized score IQM [95% CI]",
                            "P(better than baseline) [95% CI]", "verdict"),
                   rows=rows, figures=shown)



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


def render_figures(points: Sequence[Point], thresholds: Thresholds,
                   analysis: Tradeoff | None = None) -> list[FigureFile]:
    """The report's figures as PNG (points in rank order, one color each)."""
    colors = figures.palette([p.label for p in points])
    analysis = analysis or tradeoff.analyse(points, TradeoffOptions())

    def curves(key: str) -> list[figures.Curves]:
        return [figures.Curves(p.label, colors[p.label],
                               [r.metrics[key] for r in p.plotted if key in r.metrics])
                for p in points]

    out = [
        FigureFile("reward_curves.png", "Reward vs environment steps",
                   "Mean episode return per point; the band is ±1 std over its runs, each "
                   "counted up to its last step.",
                   figures.png_bytes(figures.reward_figure(curves("rollout/ep_rew_mean"),
                                                           curves("eval/mean_reward")))),
        *drawn(tradeoff.curve_figures(points, colors)),
        FigureFile("update_signals.png", "Entropy, clip fraction and approx KL",
                   "Per-iteration PPO update statistics; dashed red: diagnostic thresholds.",
                   figures.png_bytes(figures.signals_figure(
                       curves("train/entropy"), curves("train/clip_fraction"),
                       curves("train/approx_kl"), clip_max=thresholds.clip_fraction_max,
                       kl_max=thresholds.approx_kl_max))),
    ]
    if any("train/critic_loss" in r.metrics for p in points for r in p.runs):
        out.append(FigureFile(
            "off_policy_signals.png", "Entropy coefficient, critic and actor loss",
            "Per logged point of the off-policy algorithms (SAC, TD3, TQC, CrossQ); dashed "
            "red: the entropy coefficient's collapse threshold.",
            figures.png_bytes(figures.off_policy_signals_figure(
                curves("train/ent_coef"), curves("train/critic_loss"),
                curves("train/actor_loss"), ent_coef_min=thresholds.ent_coef_min))))
    by_env = points_by_env(points)
    for env, env_points in by_env.items():
        cells = grid_cells(env_points)
        if len(cells) < 2:  # one cell is not a grid: its colour bars would mean nothing
            continue
        # Rewards of different tasks do not share a scale: one heatmap figure per task.
        suffix = f"-{re.sub(r'[^A-Za-z0-9_.-]+', '_', env)}" if len(by_env) > 1 else ""
        where = f" ({env})" if len(by_env) > 1 else ""
        out.append(FigureFile(
            f"grid_heatmaps{suffix}.png",
            f"Final reward, fps and training time over the grid{where}",
            "Mean over the runs (seeds) of each (num_envs, n_steps) cell; dashed lines join "
            "cells with the same samples per update (num_envs × n_steps).",
            figures.png_bytes(figures.grid_figure(cells, figures.GRID_METRICS))))
    out += drawn([*tradeoff.target_figures(by_env, analysis),
                  *tradeoff.interval_figure(points, analysis, colors),
                  *tradeoff.profile_figures(by_env, colors)])
    out.append(FigureFile(
        "time_split.png", "Time split per iteration",
        "Seconds per PPO iteration spent collecting rollouts vs updating the policy.",
        figures.png_bytes(figures.time_split_figure([time_split(p) for p in points]))))
    return out + drawn(tradeoff.ladder_figures(analysis))


def drawn(found: Sequence[tradeoff.Drawn]) -> list[FigureFile]:
    """review.tradeoff's figures as PNG files."""
    return [FigureFile(d.filename, d.title, d.caption, figures.png_bytes(d.figure), d.section)
            for d in found]


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
        for run in point.scored:
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
    """Mean rollout/update/eval seconds per iteration over the point's plotted runs."""
    def per_iteration(key: str) -> float:
        totals, iterations = 0.0, 0
        for run in point.plotted:
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


def open_store(uri: str) -> MlflowClient:
    """A client for an existing store; a missing embedded store or a server that does not
    answer is bad input (nothing created)."""
    from mlflow.tracking import MlflowClient

    if is_embedded(uri):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise ConfigError(f"tracking store {redact_uri(uri)}: no such database; train or "
                              "sweep first, or set MLFLOW_TRACKING_URI / tracking.uri to the "
                              "team's store")
    check_store(uri)
    return MlflowClient(tracking_uri=uri)
