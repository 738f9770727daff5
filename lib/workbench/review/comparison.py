"""``workbench compare A B``: what changed between two runs, configurations or sweep points,
and whether it mattered.

The sides are found in the store (:mod:`workbench.review.compare_request` says how they are
written): a run id is that run, a config id every run tagged ``workbench.config_id`` with it
(its seeds), a sweep point every run of that sweep whose ``sweep.point`` is the name (with or
without its ``-s<seed>``). What changed is ``workbench manifest diff``'s comparison of one
representative run per side (the oldest): the config keys that differ, seeds left out, and the
environment facts of their manifests. Whether it mattered is :mod:`workbench.review.verdict`'s:
each side's seeds scored, their IQM with intervals, P(B > A) and one verdict line.
``notebooks/compare.ipynb`` shows the same through :func:`open_comparison`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config import (
    CONFIG_ID_TAG,
    DERIVED_FROM,
    ConfigError,
    interpolation_sources,
    load_config,
)
from workbench.config.margin import Margin
from workbench.console import printable_lines
from workbench.review import noninferiority, verdict
from workbench.review.compare_request import SYNTAX, Ref, check_arguments, margins, parse_ref
from workbench.review.records import RunRecord, Section, load_run, open_store, runs_text
from workbench.review.selection import (
    SWEEP_ID,
    SWEEP_POINT,
    SWEEP_ROLE,
    all_experiment_ids,
    has_tags,
    known_sweeps,
    search_all,
    tag_filter,
)
from workbench.review.statistics import Interval, PointTarget, point_target, time_to_target
from workbench.tracking.manifest_diff import (
    Difference,
    diff_cell,
    diff_manifests,
    diff_to_json,
    render_diff_text,
)
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import resolve_tracking_uri

if TYPE_CHECKING:  # mlflow loads on use
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

SEED_SUFFIX = re.compile(r"-s\d+$")  # a point's run name ends with its seed (docs/sweeps.md)


@dataclass
class Side:
    """One side of a comparison: what was asked for, what it turned out to be (``run``,
    ``config``, ``point``) and the runs it names, oldest first."""

    ref: Ref
    kind: str
    runs: list[RunRecord]

    @property
    def label(self) -> str:
        """``point tiny-grid/halfcheetah-ne1-ns64 (2 seeds)``, ``run 0f3a... (its name)``."""
        if self.kind == "run":
            return f"run {self.ref.value} ({self.runs[0].name})"
        if self.kind == "config":
            return f"config {self.ref.value} ({runs_text(self.runs)})"
        return f"point {self.ref.sweep}/{self.ref.value} ({runs_text(self.runs)})"

    @property
    def representative(self) -> RunRecord:
        """The run whose config and manifest stand for the side: the oldest that logged its
        config (a point that failed before training logged none)."""
        return next((r for r in self.runs if r.params), self.runs[0])


@dataclass
class Comparison:
    """Everything ``workbench compare`` says, independent of its output format."""

    a: Side
    b: Side
    config: list[Difference]  # resolved config keys that differ, seeds left out
    environment: list[Difference] | None  # manifest facts that differ; None: a side lacks one
    measures: list[verdict.Measure]  # the first is the final return
    targets: tuple[PointTarget, PointTarget] | None  # time to --target per side
    tasks: tuple[str, str]
    # with --margin: not worse, worse or undecided, for the final return, then the time to
    # --target (workbench.review.noninferiority)
    judgements: list[noninferiority.Judgement] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        final = self.measures[0]
        return verdict.verdict(final.improvement, len(final.a), len(final.b))


# --------------------------------------------------------------------------- finding the sides


def find_runs(client: MlflowClient, ref: Ref, store: str) -> tuple[str, list[Run]]:
    """What ``ref`` turned out to be (``run``, ``config``, ``point``) and the runs it names
    (sweep parents never), oldest first; nothing or an ambiguous id is a
    :class:`ConfigError` naming the side."""
    experiment_ids = all_experiment_ids(client)
    if ref.kind == "point":
        return "point", point_runs(client, ref, experiment_ids, store)
    by_id = run_by_id(client, ref.value) if ref.kind in ("run", "any") else None
    by_config = (tagged_runs(client, experiment_ids, {CONFIG_ID_TAG: ref.value})
                 if ref.kind in ("config", "any") else [])
    if by_id is not None and by_config:
        raise ConfigError(f"{ref.side} {ref.text!r}: both a run id and a config id in {store}; "
                          f"write run:{ref.value} or config:{ref.value}")
    if by_id is not None:
        if by_id.data.tags.get(SWEEP_ROLE) == "parent":
            raise ConfigError(f"{ref.side} {ref.text!r}: the parent run of sweep "
                              f"{by_id.data.tags.get(SWEEP_ID, '')}, which trained nothing; "
                              "compare its points: SWEEP_ID/POINT")
        return "run", [by_id]
    if by_config:
        return "config", by_config
    what = {"run": "no run", "config": "no run with config id", "any": "no run or config id"}
    raise ConfigError(f"{ref.side} {ref.text!r}: {what[ref.kind]} {ref.value} in {store}; "
                      f"give {SYNTAX} (workbench train prints a run id; the tag "
                      f"{CONFIG_ID_TAG} is a config id)")


def run_by_id(client: MlflowClient, run_id: str) -> Run | None:
    """The run with this id, None when the store has none."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def tagged_runs(client: MlflowClient, experiment_ids: Sequence[str], tags: dict[str, str]
                ) -> list[Run]:
    """Runs carrying every tag of ``tags`` (sweep parents left out), oldest first."""
    found = search_all(client, experiment_ids, " and ".join(tag_filter(tags)),
                       ["attributes.start_time ASC"])
    return [r for r in found if has_tags(r, tags) and r.data.tags.get(SWEEP_ROLE) != "parent"]


def point_runs(client: MlflowClient, ref: Ref, experiment_ids: Sequence[str], store: str
               ) -> list[Run]:
    """The runs of a sweep point: its ``sweep.point`` is the name, or the name plus a seed."""
    sweep = ref.sweep or ""
    runs = tagged_runs(client, experiment_ids, {SWEEP_ID: sweep})
    if not runs:
        sweeps = known_sweeps(client, experiment_ids)
        hint = f"sweeps (latest first): {', '.join(sweeps)}" if sweeps else "no sweeps there"
        raise ConfigError(f"{ref.side} {ref.text!r}: no sweep {sweep} in {store}; {hint}")
    names = {r.data.tags.get(SWEEP_POINT) or r.info.run_name or "" for r in runs}
    chosen = [r for r in runs if ref.value in point_names(r)]
    if not chosen:
        points = sorted({SEED_SUFFIX.sub("", n) for n in names if n})
        raise ConfigError(f"{ref.side} {ref.text!r}: no point {ref.value} in sweep {sweep}; "
                          f"its points: {', '.join(points)}")
    return chosen


def point_names(run: Run) -> set[str]:
    """The names a sweep point's run answers to: its point name, with and without the seed."""
    name = run.data.tags.get(SWEEP_POINT) or run.info.run_name or ""
    return {name, SEED_SUFFIX.sub("", name)}


def task(run: Run) -> str:
    """The task a run trained on: its ``env`` tag, else its env id (as the report says)."""
    return run.data.tags.get("env") or run.data.params.get("env.id") or "unknown"


def check_sides(a: Ref, b: Ref, runs_a: Sequence[Run], runs_b: Sequence[Run],
                allow_different_tasks: bool) -> tuple[str, str]:
    """The two sides' tasks, after the checks that need the runs: the same runs on both
    sides, and different tasks without ``allow_different_tasks``, are
    :class:`ConfigError`."""
    ids_a, ids_b = ({r.info.run_id for r in runs} for runs in (runs_a, runs_b))
    if ids_a == ids_b:
        raise ConfigError(f"compare {a.text} {b.text}: both name the same "
                          f"run{'s' if len(ids_a) > 1 else ''}; compare two different runs, "
                          "configs or sweep points")
    tasks_a = sorted({task(r) for r in runs_a})
    tasks_b = sorted({task(r) for r in runs_b})
    if tasks_a != tasks_b and not allow_different_tasks:
        raise ConfigError(f"compare {a.text} {b.text}: A trained on {', '.join(tasks_a)}, B on "
                          f"{', '.join(tasks_b)}, and returns of different tasks are not "
                          "comparable; compare the same task, or pass --allow-different-tasks")
    return ", ".join(tasks_a), ", ".join(tasks_b)


# --------------------------------------------------------------------------- the comparison


def compare(client: MlflowClient, a: Ref, b: Ref, *, store: str, target: float | None = None,
            allow_different_tasks: bool = False, margin: Margin | None = None,
            time_margin: float | None = None, level: float = noninferiority.ALPHA,
            seeds: Collection[int] | None = None) -> Comparison:
    """Find, check and load both sides, and compare them. Writes nothing.

    With ``margin``, also whether B is not worse than A by more than it, at one-sided
    ``level`` (a verification's stage spends less than the single look's 0.025), and with
    ``target`` and ``time_margin`` whether B reaches the target no slower. ``seeds``: only
    the FINISHED runs of these seeds count (a verification's stage)."""
    store = redact_uri(store)  # quoted in messages
    (kind_a, runs_a), (kind_b, runs_b) = find_runs(client, a, store), find_runs(client, b, store)
    if seeds is not None:
        runs_a, runs_b = (of_seeds(runs, seeds) for runs in (runs_a, runs_b))
    tasks = check_sides(a, b, runs_a, runs_b, allow_different_tasks)
    side_a = Side(a, kind_a, [load_run(client, r) for r in runs_a])
    side_b = Side(b, kind_b, [load_run(client, r) for r in runs_b])
    first_a, first_b = side_a.representative, side_b.representative
    environment = None
    if first_a.manifest is not None and first_b.manifest is not None:
        environment = diff_manifests(first_a.manifest, first_b.manifest)
    targets = None
    if target is not None:
        targets = (point_target([r.metrics for r in side_a.runs], target),
                   point_target([r.metrics for r in side_b.runs], target))
    changed = verdict.mark_derived(verdict.changed_config(first_a.params, first_b.params),
                                   {**DERIVED_FROM, **composed_sources(first_a),
                                    **composed_sources(first_b)})
    found = verdict.measures(side_a.runs, side_b.runs)
    judgements = []
    if margin is not None:
        judgements.append(noninferiority.judge_return(found[0].a, found[0].b, margin, level))
        if target is not None and time_margin is not None:
            judgements.append(judge_time_to(side_a.runs, side_b.runs, found[0], target,
                                            time_margin, level))
    return Comparison(side_a, side_b, changed, environment, found, targets, tasks, judgements)


def of_seeds(runs: Sequence[Run], seeds: Collection[int]) -> list[Run]:
    """The FINISHED runs among ``runs`` whose ``seed`` tag is one of ``seeds``."""
    wanted = {str(s) for s in seeds}
    return [r for r in runs if r.info.status == "FINISHED" and r.data.tags.get("seed") in wanted]


def judge_time_to(a: Sequence[RunRecord], b: Sequence[RunRecord], final: verdict.Measure,
                  target: float, time_margin: float, level: float) -> noninferiority.Judgement:
    """Whether B reaches ``target`` no slower than A by more than ``time_margin``: each seed's
    training seconds to it (reruns averaged), over the seeds with a final return."""
    def seconds(run: verdict.RunLike) -> float:
        hit = time_to_target(run.metrics, target)
        return hit.seconds if hit is not None else math.nan

    return noninferiority.judge_time(verdict.seed_scores(a, seconds),
                                     verdict.seed_scores(b, seconds), time_margin, target,
                                     (len(final.a), len(final.b)), level)


def composed_sources(run: RunRecord) -> dict[str, tuple[str, ...]]:
    """The keys of the run's config that follow from others (``algo.batch_size``'s
    interpolation), from its composition again with its manifest's overrides; none when the
    run has no manifest or its overrides no longer compose (a config group since removed)."""
    overrides = ((run.manifest or {}).get("run") or {}).get("overrides")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        return {}
    try:
        return interpolation_sources([o for o in overrides if not o.startswith("resume=")])
    except ConfigError:
        return {}


def open_comparison(a: str, b: str, *, sweep_id: str = "", target: float | None = None,
                    allow_different_tasks: bool = False, overrides: Sequence[str] = ()
                    ) -> Comparison:
    """The comparison of two sides written as on the command line, against the configured
    store (``overrides`` locate it; ``MLFLOW_TRACKING_URI`` wins): the notebook's entry.
    Errors name the notebook's parameters (``compare_a``, ``compare_b``)."""
    ref_a = parse_ref("compare_a", a, sweep_id or None)
    ref_b = parse_ref("compare_b", b, sweep_id or None)
    uri = resolve_tracking_uri(load_config(overrides).tracking.uri)
    return compare(open_store(uri), ref_a, ref_b, store=uri, target=target,
                   allow_different_tasks=allow_different_tasks)


# --------------------------------------------------------------------------- rendering


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as left-aligned columns (two spaces apart), the last column unpadded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)),
                       row[-1]]) for row in rows]


def render_text(comparison: Comparison) -> str:
    """The comparison for a terminal: what changed, whether it mattered, the verdict last."""
    a, b = comparison.a, comparison.b
    changed = comparison.config + (comparison.environment or [])
    lines = ["What changed (config: the oldest run of each side, seeds left out; environment: "
             "their manifests)", *render_diff_text(changed, a.label, b.label).splitlines()]
    if comparison.environment is None:
        lacking = [f"{s.representative.name} ({s.representative.run_id})"
                   for s in (a, b) if s.representative.manifest is None]
        lines.append(f"environment not compared: no manifest.json in {', '.join(lacking)}")
    if comparison.tasks[0] != comparison.tasks[1]:
        lines.append(f"different tasks ({comparison.tasks[0]} vs {comparison.tasks[1]}): "
                     "returns compared as they are, not normalized")
    lines += ["", f"Whether it mattered ({MEASURES})", *columns(measure_rows(comparison)),
              "", comparison.verdict]
    if comparison.judgements:
        lines += ["", f"Not worse? ({NONINFERIORITY})", *(j.line() for j in comparison.judgements)]
    return "\n".join(lines) + "\n"


MEASURES = ("per side: IQM [95 % interval] over seeds; P(B > A): the probability of "
            "improvement with its interval")
NONINFERIORITY = ("the final return's IQM against the margin, Yuen's trimmed t; "
                  "docs/reports.md#verifying-a-change")


def measure_rows(comparison: Comparison) -> list[list[str]]:
    """Whether it mattered: a header, then a row per measure (the final return first)."""
    final = comparison.measures[0]
    rows = [["measure", f"A ({seeds(len(final.a))})", f"B ({seeds(len(final.b))})", "P(B > A)"]]

    def scored(interval: Interval | None, n: int, of: int) -> str:  # fewer seeds: say so
        return verdict.interval_text(interval) + (f" ({seeds(n)})" if n != of else "")

    for m in comparison.measures:
        poi = m.improvement
        rows.append([m.name, scored(m.a_iqm, len(m.a), len(final.a)),
                     scored(m.b_iqm, len(m.b), len(final.b)),
                     verdict.poi_text(poi).removeprefix("PoI ") if poi else "n/a"])
    if comparison.targets is not None:
        ta, tb = comparison.targets
        rows.append([f"time to {ta.target:g}", ta.text(), tb.text(), "-"])
    return rows


def comparison_section(comparison: Comparison, shown: int = 8) -> Section:
    """The comparison as a report section (``workbench report --compare A B``): the verdict
    and what changed (the first ``shown`` differences) in its text, whether it mattered in
    its table."""
    changed = comparison.config + (comparison.environment or [])
    listed = "; ".join(f"{d.key} {diff_cell(d.a)} → {diff_cell(d.b)}" for d in changed[:shown])
    more = f" and {len(changed) - shown} more" if len(changed) > shown else ""
    what = (f"What changed: {listed}{more}." if changed else
            "What changed: nothing in the config (seeds left out) or the manifests.")
    if comparison.environment is None:
        what += " Environments not compared: a side has no manifest."
    if comparison.tasks[0] != comparison.tasks[1]:
        what += (f" Different tasks ({comparison.tasks[0]} vs {comparison.tasks[1]}): returns "
                 "compared as they are, not normalized.")
    what += "".join(f" {j.line()}." for j in comparison.judgements)
    header, *rows = measure_rows(comparison)
    return Section(
        title=f"Compare A vs B: {comparison.verdict}",
        text=f"A = {comparison.a.label}; B = {comparison.b.label}. {what} Whether it "
             f"mattered: {MEASURES}.",
        headers=tuple(header), rows=tuple(tuple(row) for row in rows))


def seeds(n: int) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} seed{'' if n == 1 else 's'}"


def finite(value: float) -> float | None:
    """``value``, or None when it is NaN or infinite (JSON has neither)."""
    return value if math.isfinite(value) else None


def interval_json(interval: Interval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {"estimate": finite(interval.estimate), "low": finite(interval.low),
            "high": finite(interval.high), "runs": interval.runs}


def side_json(side: Side) -> dict[str, Any]:
    return {"ref": side.ref.text, "kind": side.kind, "label": side.label,
            "runs": [r.run_id for r in side.runs]}


def render_json(comparison: Comparison) -> str:
    """The comparison as JSON (NaN as null)."""
    measures = [{"name": m.name, "a": list(m.a), "b": list(m.b),
                 "a_iqm": interval_json(m.a_iqm), "b_iqm": interval_json(m.b_iqm),
                 "improvement": interval_json(m.improvement)} for m in comparison.measures]
    targets = None
    if comparison.targets is not None:
        targets = {"target": comparison.targets[0].target,
                   "a": comparison.targets[0].text(), "b": comparison.targets[1].text()}
    out = {"a": side_json(comparison.a), "b": side_json(comparison.b),
           "tasks": list(comparison.tasks), "config": differences_json(comparison.config),
           "environment": None if comparison.environment is None
           else differences_json(comparison.environment),
           "measures": measures, "time_to_target": targets, "verdict": comparison.verdict,
           "noninferiority": [judgement_json(j) for j in comparison.judgements]}
    return json.dumps(out, indent=2, default=str) + "\n"


def judgement_json(judgement: noninferiority.Judgement) -> dict[str, Any]:
    """A non-inferiority verdict as JSON (NaN as null)."""
    return {"measure": judgement.measure, "verdict": judgement.verdict,
            "margin": judgement.margin.written(), "level": judgement.level,
            "seeds": list(judgement.seeds), "estimate": finite(judgement.estimate),
            "low": finite(judgement.low), "high": finite(judgement.high),
            "more_seeds": judgement.more_seeds, "target": judgement.target,
            "line": judgement.line()}


def differences_json(diffs: Sequence[Difference]) -> list[dict[str, Any]]:
    """The differences as ``workbench manifest diff --format json`` lists them."""
    listed: list[dict[str, Any]] = json.loads(diff_to_json(diffs, "", ""))["differences"]
    return listed


def run_command(args: argparse.Namespace) -> int:
    """``workbench compare A B``: print the comparison (text, or JSON with ``--json``)."""
    a, b, cfg = check_arguments(args)
    margin, time_margin = margins(args)
    uri = resolve_tracking_uri(cfg.tracking.uri)
    comparison = compare(open_store(uri), a, b, store=uri, target=args.target,
                         allow_different_tasks=args.allow_different_tasks, margin=margin,
                         time_margin=time_margin)
    text = render_json(comparison) if args.json else render_text(comparison)
    print(printable_lines(text), end="")
    return 0

