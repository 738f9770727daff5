"""A verification sweep: is B not worse than A? Seeds added in stages until it is decided.

``workbench sweep sweep=verify 'sweep.grid={algo.learning_rate:[3e-4,3e-5]}'`` (or a grid
over ``sweep.kernel``: two software stacks) trains the grid's two configurations, A first, on
``sweep.seeds`` (3 a side in the preset), judges them as ``workbench compare --margin`` does
(:mod:`workbench.review.noninferiority`), and while undecided adds ``sweep.verify.add_seeds``
seeds a side, up to ``sweep.verify.max_seeds``. Each look spends its share of the error by
the alpha-spending plan of the whole verification, so the chance of a wrong "not worse"
(and of a wrong "worse") over all stages stays at 2.5 % however early it stops.

It is a sweep, not a new runner: each stage is :func:`workbench.sweeps.sweep.run_sweep` of the
same sweep id with the stage's seeds, so the points are papermill executions with their
claims, the runs nest under the sweep's one parent run, and running the same command again
resumes it (FINISHED points are skipped, and the same runs give the same verdicts, so it
stops where it stopped). The parent carries the verdict (tags ``verify.*``, metrics
``verify/*`` per stage) and ``workbench report`` shows it (:func:`verification_section`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.config.margin import Margin, parse_margin, parse_percent
from workbench.console import printable
from workbench.review import noninferiority
from workbench.review.compare_request import Ref
from workbench.review.comparison import Comparison, compare, render_text
from workbench.review.noninferiority import NOT_WORSE, WORSE, Judgement
from workbench.review.records import Section, open_store
from workbench.sweeps.point import ClusterLost
from workbench.sweeps.request import SweepRequest, check_request, override_key, side_name
from workbench.sweeps.sweep import run_sweep
from workbench.tracking.store import MAX_TAG_VALUE_LENGTH, resolve_tracking_uri, truncate

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

VERDICT_TAG = "verify.verdict"  # not worse | worse | slower | undecided | stopped
LINES_TAG = "verify.lines"  # the verdicts in words, one per line (return, then time)
SEEDS_TAG = "verify.seeds"  # seeds a side at the last look
STAGE_TAG = "verify.stage"  # the last look, "2 of 4"
SIDES_TAG = "verify.sides"  # "A -> B": the two configurations' names
MARGIN_TAG = "verify.margin"  # as written: 5% (of A's IQM) or a return
EXIT_DECIDED_NOT_WORSE, EXIT_NOT_TAKEN = 0, 1
STAGE_METRICS = ("seeds", "level", "return_estimate", "return_low", "return_high",
                 "time_ratio", "time_low", "time_high")


@dataclass(frozen=True)
class Stage:
    """One look: how many seeds a side, at which one-sided level, and what it said."""

    number: int
    seeds: int
    level: float
    judgements: tuple[Judgement, ...]

    @property
    def stops(self) -> bool:
        """Decided: every verdict is, or one already refuses B (worse, or slower)."""
        return all(j.decided for j in self.judgements) or \
            any(j.verdict == WORSE for j in self.judgements)


@dataclass
class Verification:
    """What the verification found, stage by stage."""

    sweep_id: str
    parent_run_id: str
    sides: tuple[str, str]
    looks: list[int]  # seeds a side at each planned look
    margin: Margin
    stages: list[Stage] = field(default_factory=list)
    comparison: Comparison | None = None  # the last look's
    failures: list[str] = field(default_factory=list)  # points that did not finish

    @property
    def verdict(self) -> str:
        """``not worse``, ``worse``, ``slower``, ``undecided`` or ``stopped``."""
        return overall(self.stages[-1].judgements) if self.stages and not self.failures \
            else "stopped"


def overall(judgements: Sequence[Judgement]) -> str:
    """One word for a look: worse (the return), slower (the time), not worse (every verdict
    decided so), else undecided."""
    for judgement in judgements:
        if judgement.verdict == WORSE:
            return "worse" if judgement.measure == "return" else "slower"
    return NOT_WORSE if all(j.verdict == NOT_WORSE for j in judgements) else "undecided"


# --------------------------------------------------------------------------- the stages


def stage_seed_values(first: Sequence[int], count: int) -> list[int]:
    """The first ``count`` seeds of a side: ``first`` (sweep.seeds), then the next integers
    after its largest."""
    seeds = list(dict.fromkeys(first))[:count]
    while len(seeds) < count:
        seeds.append(max(seeds) + 1)
    return seeds


def stage_request(overrides: Sequence[str], seeds: Sequence[int], sweep_id: str,
                  yes: bool) -> SweepRequest:
    """The sweep of one stage: the command's overrides with the stage's seeds, under the
    verification's one sweep id (its first stage's)."""
    own = [o for o in overrides if override_key(o) not in ("sweep.seeds", "sweep.id")]
    return check_request([*own, f"sweep.seeds=[{','.join(map(str, seeds))}]",
                          f"sweep.id={sweep_id}"], yes=yes)


def run_verification(request: SweepRequest, overrides: Sequence[str], yes: bool = False
                     ) -> Verification:
    """Train and judge stage by stage until decided or at the cap (see the module's text).

    ``request`` is the command's checked request (its first stage); ``overrides`` the
    command line it came from. Bad input (a kernel that is missing or lacks the workbench)
    is a :class:`ConfigError` before anything runs; a stage whose points do not all finish
    stops the verification, and the same command resumes it.
    """
    sweep = request.sweep
    verify = sweep.verify
    assert verify.margin is not None  # a verification: check_request checked it
    margin = parse_margin(verify.margin, "sweep.verify.margin")
    time_margin = parse_percent(verify.time_margin, "sweep.verify.time_margin")
    first = list(dict.fromkeys(sweep.seeds))
    looks = noninferiority.stage_seeds(len(first), verify.add_seeds, verify.max_seeds)
    levels = noninferiority.stage_levels(looks)
    sides = tuple(dict.fromkeys(side_name(p) for p in request.points))
    refs = [Ref(f"verify {label}", name, "point", name, request.sweep_id)
            for label, name in zip("AB", sides, strict=True)]
    result: Verification | None = None
    client: MlflowClient | None = None
    for number, (count, level) in enumerate(zip(looks, levels, strict=True), start=1):
        seeds = stage_seed_values(first, count)
        staged = request if number == 1 else stage_request(overrides, seeds, request.sweep_id,
                                                           yes)
        swept = run_sweep(staged)
        if result is None:
            result = Verification(request.sweep_id, swept.parent_run_id, (sides[0], sides[1]),
                                  looks, margin)
            client = open_store(swept_uri(staged))
        assert client is not None
        if swept.failures:
            result.failures = [o.point for o in swept.failures]
            record(client, result)
            return result
        comparison = compare(client, refs[0], refs[1], store=swept_uri(staged),
                             target=verify.target, margin=margin, time_margin=time_margin,
                             level=level, seeds=seeds,
                             allow_different_tasks=verify.allow_different_tasks)
        stage = Stage(number, count, level, tuple(comparison.judgements))
        result.stages.append(stage)
        result.comparison = comparison
        record(client, result)
        print_stage(result, stage)
        if stage.stops:
            break
    assert result is not None
    return result


def swept_uri(request: SweepRequest) -> str:
    """The store the stage's sweep logged to (``MLFLOW_TRACKING_URI`` wins, as for a sweep)."""
    return resolve_tracking_uri(request.shared.tracking.uri)


def print_stage(result: Verification, stage: Stage) -> None:
    """``verify stage 2 of 4: 6 seeds a side (98.7 % intervals): <verdicts>``."""
    lines = "; ".join(j.line() for j in stage.judgements)
    print(f"verify stage {stage.number} of {len(result.looks)}: {stage.seeds} seeds a side: "
          f"{printable(lines)}", flush=True)


# --------------------------------------------------------------------------- the record


def stage_values(stage: Stage) -> dict[str, float]:
    """The look's figures as the parent's ``verify/*`` metrics (step: the stage)."""
    values = {"seeds": float(stage.seeds), "level": stage.level}
    for judgement in stage.judgements:
        prefix = "return" if judgement.measure == "return" else "time"
        names = ("estimate", "low", "high") if prefix == "return" else ("ratio", "low", "high")
        for name, value in zip(names, (judgement.estimate, judgement.low, judgement.high),
                               strict=True):
            if math.isfinite(value):
                values[f"{prefix}_{name}"] = value
    return values


def record(client: MlflowClient, result: Verification) -> None:
    """The verdict on the sweep's parent run: tags, and the last stage's metrics."""
    tags = {VERDICT_TAG: result.verdict, SIDES_TAG: f"{result.sides[0]} -> {result.sides[1]}",
            MARGIN_TAG: result.margin.written()}
    if result.failures:
        tags[LINES_TAG] = (f"stopped: {len(result.failures)} point(s) did not finish "
                           f"({', '.join(result.failures)}); run the same command again")
    if result.stages:
        last = result.stages[-1]
        tags[SEEDS_TAG] = str(last.seeds)
        tags[STAGE_TAG] = f"{last.number} of {len(result.looks)}"
        if not result.failures:
            tags[LINES_TAG] = "\n".join(j.line() for j in last.judgements)
        for key, figure in stage_values(last).items():
            client.log_metric(result.parent_run_id, f"verify/{key}", figure, step=last.number)
    for key, text in tags.items():
        client.set_tag(result.parent_run_id, key, truncate(text, MAX_TAG_VALUE_LENGTH))


def verification_section(client: MlflowClient, parent_run_id: str) -> Section | None:
    """The report's section for a verification sweep's parent (None for any other run):
    the verdict as its title, what it means, and one row per stage."""
    parent = client.get_run(parent_run_id)
    tags = parent.data.tags
    if VERDICT_TAG not in tags:
        return None
    history = {key: {m.step: m.value for m in
                     client.get_metric_history(parent_run_id, f"verify/{key}")}
               for key in STAGE_METRICS}
    share = tags.get(MARGIN_TAG, "").endswith("%")  # B - A in % of A's IQM, else points
    rows = []
    for step in sorted(history["seeds"]):
        def bounds(prefix: str, names: tuple[str, str, str], fmt: str, step: int = step) -> str:
            found = [history[f"{prefix}_{name}"].get(step) for name in names]
            if any(v is None for v in found):
                return "-"
            return f"{format(found[0], fmt)} [{format(found[1], fmt)}, {format(found[2], fmt)}]"

        level = history["level"].get(step)
        rows.append((str(step), f"{history['seeds'][step]:.0f}",
                     "-" if level is None else f"{(1 - 2 * level) * 100:.3g} %",
                     bounds("return", ("estimate", "low", "high"), "+.1%" if share else "+,.1f"),
                     bounds("time", ("ratio", "low", "high"), ".2f")))
    lines = tags.get(LINES_TAG, "")
    return Section(
        title=f"Verification: {tags[VERDICT_TAG]} ({tags.get(SIDES_TAG, 'A -> B')})",
        text=(f"{lines.replace(chr(10), ' ')} Stage {tags.get(STAGE_TAG, '?')}; each stage "
              "judges B - A (in % of A's IQM for a margin in %, else in return points) and "
              "B's time to the target over A's at its own level, so that a wrong verdict "
              "over all stages stays at 2.5 % each way (docs/reports.md#verifying-a-change)."),
        headers=("stage", "seeds a side", "interval", "B - A", "time B / A"),
        rows=tuple(rows))


def run_command(request: SweepRequest, overrides: Sequence[str], yes: bool) -> int:
    """``workbench sweep sweep=verify ...``: the stages, then the comparison and the verdict;
    exit 0 when B is not worse (and no slower), 1 otherwise (worse, slower, undecided at the
    cap, or stopped)."""
    try:
        result = run_verification(request, overrides, yes)
    except ClusterLost as exc:  # a Ray head that stopped answering: as workbench sweep says
        print(f"workbench: {printable(str(exc))}", file=sys.stderr)
        return EXIT_NOT_TAKEN
    if result.comparison is not None:
        print("\n" + render_text(result.comparison), end="")
    done = result.stages[-1].seeds if result.stages else 0
    print(f"verification {result.sweep_id} (parent run {result.parent_run_id}): "
          f"{result.verdict} after {done} seeds a side", flush=True)
    if result.verdict == NOT_WORSE:
        return EXIT_DECIDED_NOT_WORSE
    if result.failures:
        print(f"workbench: verification stopped: {', '.join(result.failures)} did not finish; "
              "run the same command again to resume", file=sys.stderr)
    return EXIT_NOT_TAKEN
