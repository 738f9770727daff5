"""A :class:`workbench.review.records.Report` as pages: ``index.html`` (one self-contained
page: figures embedded as data URIs, inline CSS, no script, nothing fetched, opens from disk)
and ``report.md`` (for a wiki or a pull request, next to the PNG files).

Both are rendered from one list of blocks (:func:`report_blocks`), so they cannot drift apart.
"""

from __future__ import annotations

import base64
import html
import math
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from workbench.console import printable
from workbench.review.diagnostics import MIN_CPU_SAMPLES, Bottleneck, GpuHealth
from workbench.review.records import EnvironmentFacts, FigureFile, Point, Report, RunRecord
from workbench.review.scaling import Ladder
from workbench.review.selection import RAY_HOSTNAME, RAY_NODE_ID, RAY_NODE_IP
from workbench.review.statistics import BOOTSTRAP_REPS
from workbench.review.videos import PointVideo, video_html
from workbench.tracking.logged_models import BEST_VALUE_KEY, BestCheckpoint, best_checkpoint
from workbench.tracking.metric_keys import ROBUSTNESS_LATEST_TAG, robustness_tag

# Characters with a meaning in Markdown (CommonMark and GitHub's: links, emphasis, code, tables,
# math, strikethrough) that run data may contain; each is written backslash-escaped. ``<``,
# ``>`` and ``&`` become HTML entities instead: renderers that pass HTML through (wikis,
# pull requests) then show a run named ``<script>`` as text.
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]()#!|~${}])")
MARKDOWN_LINE_START = re.compile(r"^(\s*)([-+=]|\d+(?=\.))")  # a list item or a rule
# Characters kept as they are in a link target; everything else is percent-encoded, so a
# ``)`` or a space in an id from the store cannot end the link and start another.
URL_SAFE = ":/#?&=%@+,;~.-_!*'"


@dataclass(frozen=True)
class Link:
    """A table cell or text that links somewhere (the MLflow UI)."""

    text: str
    url: str


Cell = str | Link | list[Link]


@dataclass(frozen=True)
class Block:
    """One piece of report content: heading, paragraph, table or figure."""

    kind: str  # h1 | h2 | h3 | p | table | card (a titled small table) | figure | video
    text: str = ""
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[Cell, ...], ...] = ()
    figure: FigureFile | None = None
    video: PointVideo | None = None
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
    blocks += section_blocks(report)
    blocks += [Block("h2", "Figures")]
    for fig in report.figures:
        if fig.section == "figures":
            blocks += [Block("h3", fig.title), Block("figure", fig.caption, figure=fig)]
    blocks += scaling_blocks(report)
    blocks += video_blocks(report)
    blocks += diagnostic_blocks(report)
    blocks += robustness_blocks(report)
    blocks += bottleneck_blocks(report)
    blocks += environment_blocks(report.environment)
    blocks += run_blocks(report)
    return blocks


def ranking_blocks(report: Report) -> list[Block]:
    """The ranked table of points."""
    rows = []
    for rank, p in enumerate(report.points, start=1):
        counted = len(p.scored)
        seeds = str(counted) if counted == len(p.runs) else f"{counted} ({len(p.runs)} runs)"
        reward = fmt(p.reward_mean, ".1f")
        if counted > 1 and not math.isnan(p.reward_std):
            reward += f" ± {p.reward_std:.1f}"
        flag = " (diverged)" if p.diverged else ""
        rows.append((
            str(rank), p.label + flag, seeds, reward, *interval_cells(report, p),
            fmt(p.mean("summary/fps"), ".0f"), fmt(p.mean("summary/wall_time_s"), ".1f"),
            report.tradeoff.times[p.label].text() if p.label in report.tradeoff.times else "–",
            fmt(p.peak_rss_mb, ".0f"), p.status,
            [Link(f"s{r.seed}" if r.seed is not None else r.name, report.run_url(r))
             for r in p.runs],
        ))
    # The table first: on a projector (1280x720) it is on the first screen; how it is ranked
    # and how the intervals are computed follow it.
    return [
        Block("h2", "Ranking"),
        Block("table", headers=("#", "point", "seeds", "final eval reward", "IQM [95% CI]",
                                "intervals overlap", "fps (steps/s)", "training time (s)",
                                "time to target", "peak memory (MiB)", "status", "runs"),
              rows=tuple(rows)),
        *overlap_blocks(report),
        Block("p", "Ranked by final deterministic evaluation reward (mean over seeds, ± std "
                   "over seeds); equal rewards by training time (model.learn alone), fastest "
                   "first. A point's figures count its FINISHED runs, one per seed (the last "
                   "to end): a stopped attempt or a rerun of a seed is listed, never counted. "
                   "Points with NaN/inf in any metric rank below all others, then points with "
                   "a seed that did not finish."),
        Block("p", statistics_text(report)),
    ]


def section_blocks(report: Report) -> list[Block]:
    """The report's extra sections (a study's top trials and figures), in order."""
    blocks: list[Block] = []
    for section in report.sections:
        blocks += [Block("h2", section.title), Block("p", section.text)]
        if section.headers:
            rows = tuple(tuple(Link(*c) if isinstance(c, tuple) else c for c in row)
                         for row in section.rows)
            blocks.append(Block("table", headers=section.headers, rows=rows))
        for fig in section.figures:
            blocks += [Block("h3", fig.title), Block("figure", fig.caption, figure=fig)]
    return blocks


def interval_cells(report: Report, point: Point) -> tuple[str, str]:
    """``IQM [low, high]`` and the ranks of the points whose intervals overlap this one's."""
    interval = report.tradeoff.intervals.get(point.label)
    if interval is None:
        return "–", "–"
    if not interval.known:
        return f"{interval.estimate:.1f} (1 seed: no interval)", "–"
    ranks = {p.label: rank for rank, p in enumerate(report.points, start=1)}
    others = [f"#{ranks[label]}" for label in report.tradeoff.overlaps.get(point.label, [])]
    return (f"{interval.estimate:.1f} [{interval.low:.1f}, {interval.high:.1f}]",
            ", ".join(others) or "none")


def statistics_text(report: Report) -> str:
    """What the IQM and time-to-target columns mean, with each task's target."""
    t = report.tradeoff
    targets = "; ".join(f"{task}: {fmt(target, 'g') if target is not None else 'none'} "
                        f"({t.target_origins.get(task, '')})" for task, target in t.targets.items())
    return ("IQM: interquartile mean of the final evaluation return over the seeds, with a "
            f"stratified bootstrap 95% interval (percentile, {BOOTSTRAP_REPS} resamples); "
            "'intervals overlap' lists the points whose interval shares values with this "
            "one's: these seeds do not tell them apart, whatever the order. Time to target: "
            "training seconds (rollouts + updates) until the deterministic evaluation first "
            "reached the target return (mean over the seeds that did, and how many; 'not "
            f"reached' if none). Targets: {targets or 'none'}.")


def overlap_blocks(report: Report) -> list[Block]:
    """One sentence on which neighbours in the ranking the seeds do not separate; the
    ranking is said to hold only when every point has an interval (two seeds or more)."""
    if not report.tradeoff.seeds_compared:
        return [Block("p", "Confidence intervals need two seeds or more per point "
                           "(sweep.seeds); with one, the order shows single runs.")]
    ranks = {p.label: rank for rank, p in enumerate(report.points, start=1)}
    single = [f"#{ranks[p.label]}" for p in report.points
              if not (i := report.tradeoff.intervals.get(p.label)) or not i.known]
    unsure = (f" {', '.join(single)} {'has' if len(single) == 1 else 'have'} fewer than two "
              "finished seeds: no interval, so their places are single runs." if single else "")
    pairs = sorted({tuple(sorted((ranks[a], ranks[b])))
                    for a, others in report.tradeoff.overlaps.items() for b in others})
    if not pairs:
        verdict = ("No two points' 95% intervals overlap: the ranking holds at these seeds."
                   if not single else
                   "No two intervals of the points with two seeds or more overlap.")
        return [Block("p", verdict + unsure)]
    listed = ", ".join(f"#{a} and #{b}" for a, b in pairs)
    return [Block("p", f"Not separated by the seeds (95% intervals overlap): {listed}. "
                       f"More seeds narrow the intervals.{unsure}")]


def scaling_blocks(report: Report) -> list[Block]:
    """The num_envs scaling ladders: knee, rungs, figure."""
    if not report.tradeoff.ladders:
        return []
    blocks = [Block("h2", "Scaling ladder"),
              Block("p", "Points of one task at one samples per update (num_envs × n_steps) "
                         "and three or more num_envs (sweep=scale). The knee: the last "
                         "num_envs before a doubling buys less than the minimum gain in "
                         "throughput, or before the process tree's peak memory crosses the "
                         "budget (--scale-min-gain, --memory-budget-mb).")]
    pictures = {f.title: f for f in report.figures if f.section == "scaling"}
    for ladder in report.tradeoff.ladders:
        title = f"Scaling ladder: {ladder.task}, {ladder.samples_per_update} samples per update"
        knee = ladder.knee
        mark = f"Knee at num_envs={knee.num_envs}" if knee.num_envs is not None else "No knee"
        blocks += [Block("h3", title), Block("p", f"{mark}: {knee.reason}."),
                   Block("table", headers=("num_envs", "n_steps", "seeds", "fps (steps/s)",
                                           "spread (iterations)",
                                           "gain per doubling", "rollout s/iter",
                                           "update s/iter", "peak memory (MiB)", "GPU util",
                                           "GPU memory (MB)"),
                         rows=ladder_rows(ladder))]
        if title in pictures:
            blocks.append(Block("figure", pictures[title].caption, figure=pictures[title]))
    return blocks


def ladder_rows(ladder: Ladder) -> tuple[tuple[str, ...], ...]:
    """One row per rung; the knee's marked."""
    gains = ("–", *(fmt(g * 100, "+.0f", "%") for g in ladder.knee.gains))
    return tuple(
        (f"{r.num_envs} (knee)" if r.num_envs == ladder.knee.num_envs else str(r.num_envs),
         str(r.n_steps), str(r.runs), fmt(r.fps, ".0f"), r.spread_text() or "–", gain,
         fmt(r.rollout_s, ".3f"),
         fmt(r.update_s, ".3f"), fmt(r.peak_memory_mb, ".0f"),
         fmt(r.gpu_percent, ".0f", "%") if r.gpu_percent is not None else "not logged",
         fmt(r.gpu_memory_mb, ".0f") if r.gpu_memory_mb is not None else "not logged")
        for r, gain in zip(ladder.rungs, gains, strict=True))


def video_blocks(report: Report) -> list[Block]:
    """Each point's best seed as its final video shows it (training/video.py)."""
    if not report.videos:
        return []
    return [
        Block("h2", "Videos"),
        Block("p", "The deterministic policy of each point's best seed after training, "
                   "rendered in the evaluation environment (the run's video/replay.mp4)."),
        *[Block("video", v.caption, video=v) for v in report.videos],
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


def robustness_blocks(report: Report) -> list[Block]:
    """The latest ``workbench eval`` verdicts of the runs that have one (docs/evaluation.md):
    one row per factor; nothing when no run was evaluated."""
    rows = []
    for run in report.runs:
        profile = run.tags.get(ROBUSTNESS_LATEST_TAG)
        verdicts = run.tags.get(robustness_tag(profile, "verdicts"), "") if profile else ""
        passed = run.tags.get(robustness_tag(profile, "passed"), "") if profile else ""
        rows += [(Link(run.name, report.run_url(run)), profile or "", line,
                  "every cell holds" if passed == "true" else "some cells fail")
                 for line in verdicts.splitlines()]
    if not rows:
        return []
    return [Block("h2", "Robustness"),
            Block("p", "The latest robustness matrix of each evaluated run (`workbench eval`): "
                       "each perturbation alone, the rest nominal; the figures and every cell "
                       "are in its eval run."),
            Block("table", headers=("run", "profile", "verdict", "matrix"), rows=tuple(rows))]


def bottleneck_blocks(report: Report) -> list[Block]:
    """A small verdict table per run."""
    t = report.thresholds
    blocks = [
        Block("h2", "Where the time goes"),
        Block("p", f"Rollout vs update time from time/rollout_s and time/update_s; CPU and "
                   f"GPU utilization from MLflow's system metrics (the first CPU sample, always "
                   f"0, dropped; a mean needs {MIN_CPU_SAMPLES} more), memory of the training "
                   f"process tree (PSS, sampled at rollout ends), GPU temperature and clocks "
                   f"from NVML. A phase with ≥ {t.bound_share:.0%} of the iteration time "
                   f"dominates; busy means CPU ≥ {t.cpu_busy_percent:g}% or GPU ≥ "
                   f"{t.gpu_busy_percent:g}%; clocks slowed for heat in ≥ "
                   f"{t.gpu_throttle_percent:g}% of samples is GPU throttling."),
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
            ("CPU utilization (mean)", cpu_text(b)),
            ("GPU utilization (mean)", fmt(b.gpu_percent, ".0f", "%")
             if b.gpu_percent is not None else "no GPU metrics"),
            *((("GPU temperature and clocks", gpu_health_text(b.gpu_health)),)
              if b.gpu_health is not None else ()),
            (f"memory, {b.memory_of} (first → last quarter)", memory),
            ("verdict", " + ".join(b.verdicts)),
            ("usual remedy", b.remedy),
        )
        blocks.append(Block("card", run.name, headers=("quantity", "value"), rows=rows,
                            css="verdict"))
    return blocks


def gpu_health_text(health: GpuHealth) -> str:
    """``64 °C mean, 71 °C peak; SM clock 1755 of 1980 MHz (89%); slowed for heat in 0%,
    at the power cap in 12% of samples`` (the parts that were logged)."""
    parts = []
    if health.temperature_c is not None:
        peak = (f", {health.temperature_peak_c:.0f} °C peak"
                if health.temperature_peak_c is not None else "")
        parts.append(f"{health.temperature_c:.0f} °C mean{peak}")
    ratio = health.clock_ratio
    if ratio is not None:
        parts.append(f"SM clock {health.sm_clock_mhz:.0f} of {health.sm_clock_max_mhz:.0f} MHz "
                     f"({ratio:.0%})")
    shares = [f"{label} in {share:.0f}%" for label, share in (
        ("slowed for heat", health.thermal_throttle_percent),
        ("at the power cap", health.power_throttle_percent)) if share is not None]
    if shares:
        parts.append(", ".join(shares) + " of samples")
    return "; ".join(parts) or "not logged"


def cpu_text(b: Bottleneck) -> str:
    """Mean CPU utilization, or why there is none."""
    if b.cpu_percent is not None:
        return f"{fmt(b.cpu_percent, '.0f', '%')} ({b.cpu_samples} samples)"
    if b.cpu_samples == 0:
        return "not logged"
    return (f"too few samples ({b.cpu_samples}; MLflow samples every "
            "tracking.system_metrics_interval_s)")


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
    """Every run shown, with a link to its MLflow page (and the Ray node it ran on, for runs
    of a Ray sweep: select one node's runs with ``--tag ray.node_id=ID``)."""
    on_ray = any(RAY_NODE_ID in r.tags for r in report.runs)
    best = {r.run_id: best_checkpoint(r.tags, {k: r.last(k) for k in (BEST_VALUE_KEY,)
                                               if k in r.metrics})
            for r in report.runs}
    with_best = any(best.values())  # checkpoint.keep=best runs: which checkpoint, and when
    rows = tuple(
        (Link(r.name, report.run_url(r)), r.run_id, r.status,
         datetime.fromtimestamp(r.start_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S"),
         fmt(r.final_reward, ".1f"),
         *((best_text(best[r.run_id]),) if with_best else ()),
         *((ray_node(r.tags),) if on_ray else ()),
         r.tags.get("mlflow.note.content", ""))
        for r in report.runs
    )
    headers = ("run", "run id", "status", "started (UTC)", "final eval reward",
               *(("best checkpoint",) if with_best else ()),
               *(("Ray node",) if on_ray else ()), "description")
    blocks = [Block("h2", "Runs"), Block("table", headers=headers, rows=rows)]
    return blocks + (ray_node_blocks(report) if on_ray else [])


def best_text(best: BestCheckpoint | None) -> str:
    """``123.4 at step 4096`` (``checkpoint.keep=best``), ``-`` for a run without one."""
    return "-" if best is None else f"{fmt(best.value, '.1f')} at step {best.step}"


def ray_node_blocks(report: Report) -> list[Block]:
    """The runs grouped by the Ray node they ran on: how many, how they ended, their mean
    training fps; a node whose runs end KILLED or run slower than the others' stands out."""
    by_node: dict[str, list[RunRecord]] = {}
    for run in report.runs:
        by_node.setdefault(ray_node(run.tags), []).append(run)
    rows = []
    for node, runs in sorted(by_node.items()):
        statuses = sorted({r.status for r in runs})
        counts = ", ".join(f"{sum(r.status == s for r in runs)} {s}" for s in statuses)
        fps = [v for r in runs if math.isfinite(v := r.last("summary/fps"))]
        rows.append((node, str(len(runs)), counts,
                     fmt(sum(fps) / len(fps) if fps else math.nan, ".0f")))
    return [Block("h3", "Runs per Ray node"),
            Block("table", headers=("Ray node", "runs", "statuses", "mean fps"),
                  rows=tuple(rows))]


def ray_node(tags: Mapping[str, str]) -> str:
    """``<ip> (<hostname>) <node id>`` of a Ray sweep's point, ``-`` for other runs."""
    node_id = tags.get(RAY_NODE_ID)
    if not node_id:
        return "-"
    host = tags.get(RAY_HOSTNAME)
    return f"{tags.get(RAY_NODE_IP, '?')}{f' ({host})' if host else ''} {node_id}"


# --------------------------------------------------------------------------- HTML


# Every figure is shown at one scale of its PNG, so a one-panel figure is not drawn at twice
# the size of a three-panel one: the scale at which a three-panel figure (~1,700 px) fills a
# 1280-px-wide screen's page, where its 17-pt tick labels (23.6 px in the PNG) read at 17 px
# and its 16-pt legend at 16; a wider figure is narrowed further to the page (max-width).
FIGURE_SCALE = 0.73

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
figure.video { display: inline-block; vertical-align: top; margin-right: 1.5rem; max-width: 480px; }
figure video { width: 100%; min-width: 240px; border: 1px solid #e3e3e3; background: #000; }
figcaption { color: #555; font-size: .95rem; margin-top: .3rem; }
a { color: #0a5ad4; }
"""


def link_target(url: str) -> str:
    """``url`` with every character outside :data:`URL_SAFE` percent-encoded."""
    return urllib.parse.quote(url, safe=URL_SAFE)


def html_text(text: str) -> str:
    """Text for HTML: markup escaped, and control characters and escape sequences shown as
    visible ``\\x1b``-style text (:func:`workbench.console.printable`), so a run's name or
    a sweep id cannot carry terminal escapes into a page someone may ``cat`` or copy."""
    return html.escape(printable(text))


def html_cell(cell: Cell) -> str:
    if isinstance(cell, Link):
        return f'<a href="{html.escape(link_target(cell.url))}">{html_text(cell.text)}</a>'
    if isinstance(cell, list):
        return " ".join(html_cell(c) for c in cell)
    return html_text(cell)


def render_html(report: Report, blocks: Sequence[Block]) -> str:
    """One self-contained page: inline CSS, figures as data URIs, no scripts."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html_text(report.title)}</title>", f"<style>{CSS}</style>", "</head>",
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
            parts.append(f"<{b.kind}>{html_text(b.text)}</{b.kind}>")
        elif b.kind == "table":
            parts.append(html_table(b))
        elif b.kind == "card":
            parts.append(f'<section class="card"><h3>{html_text(b.text)}</h3>'
                         f"{html_table(b)}</section>")
        elif b.kind == "figure" and b.figure is not None:
            data = base64.b64encode(b.figure.png).decode("ascii")
            width = round(png_width(b.figure.png) * FIGURE_SCALE)
            parts.append(f'<figure><img src="data:image/png;base64,{data}" width="{width}" '
                         f'alt="{html_text(b.figure.title)}">'
                         f"<figcaption>{html_text(b.text)}</figcaption></figure>")
        elif b.kind == "video" and b.video is not None:
            parts.append(video_html(b.video))
        if b.kind == "card" and following != "card":
            parts.append("</div>")
    return "\n".join(parts)


def png_width(png: bytes) -> int:
    """A PNG's width in pixels, from its IHDR chunk (0 when it is not a PNG)."""
    return int.from_bytes(png[16:20], "big") if png[:8] == b"\x89PNG\r\n\x1a\n" else 0


def html_table(b: Block) -> str:
    css = f' class="{b.css}"' if b.css else ""
    head = "".join(f"<th>{html_text(h)}</th>" for h in b.headers)
    body = "".join("<tr>" + "".join(f"<td>{html_cell(c)}</td>" for c in row) + "</tr>"
                   for row in b.rows)
    return f"<table{css}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# --------------------------------------------------------------------------- Markdown


def md_cell(cell: Cell) -> str:
    if isinstance(cell, Link):
        return f"[{md_escape(cell.text)}]({link_target(cell.url)})"
    if isinstance(cell, list):
        return " ".join(md_cell(c) for c in cell)
    return md_escape(cell)


def md_escape(text: str) -> str:
    """Text shown as written by any Markdown renderer, on one line (table cells included).

    Every text of a report may hold run data (names, tags, params, descriptions), so all of
    it is escaped: no link, image, emphasis, code span, math or HTML can come from a run.
    """
    text = printable(" ".join(text.splitlines()))  # no terminal escape from a run either
    text = html.escape(text, quote=False)
    text = MARKDOWN_SPECIAL.sub(r"\\\1", text)
    return MARKDOWN_LINE_START.sub(lambda m: m[1] + (m[2] + "\\" if m[2].isdigit()
                                                     else "\\" + m[2]), text)


def render_markdown(blocks: Sequence[Block]) -> str:
    """The same content as Markdown; figures reference the PNG files next to it."""
    lines: list[str] = []
    marks = {"h1": "#", "h2": "##", "h3": "###"}
    for b in blocks:
        if b.kind in marks:
            lines += [f"{marks[b.kind]} {md_escape(b.text)}", ""]
        elif b.kind == "p":
            lines += [md_escape(b.text), ""]
        elif b.kind in ("table", "card"):
            if b.kind == "card":
                lines += [f"### {md_escape(b.text)}", ""]
            lines.append("| " + " | ".join(md_escape(h) for h in b.headers) + " |")
            lines.append("|" + "---|" * len(b.headers))
            lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in b.rows]
            lines.append("")
        elif b.kind == "figure" and b.figure is not None:
            lines += [f"![{md_escape(b.figure.title)}]({link_target(b.figure.filename)})", "",
                      f"*{md_escape(b.text)}*", ""]
        elif b.kind == "video" and b.video is not None:
            lines += [f"![{md_escape(b.video.run_name)}]({link_target(b.video.stem)}.gif)", "",
                      f"*{md_escape(b.text)}* ([MP4]({link_target(b.video.stem)}.mp4))", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- writing


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
        for fig in [*report.figures, *(f for s in report.sections for f in s.figures)]:
            (staging / fig.filename).write_bytes(fig.png)
        for video in report.videos:
            (staging / f"{video.stem}.mp4").write_bytes(video.mp4)
            (staging / f"{video.stem}.gif").write_bytes(video.gif)
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
