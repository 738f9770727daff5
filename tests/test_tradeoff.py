"""The report's trade-off and statistics: return vs training seconds, time to target, IQM
intervals over seeds, performance profiles and the num_envs scaling ladder, on the shared real
sweep (tests/reportdata.py), on synthetic runs, and on a real ``sweep=scale`` (slow)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from workbench.review import records, render, statistics
from workbench.review.selection import Selection
from workbench.review.tradeoff import TradeoffOptions

from . import reportdata
from .conftest import TINY, run_cli


@pytest.fixture(scope="module")
def sweep(report_sweep: reportdata.Sweep) -> reportdata.Sweep:
    """The session's shared sweep (tests/reportdata.py)."""
    return report_sweep


def ranking_table(rep: records.Report) -> render.Block:
    return next(b for b in render.report_blocks(rep) if b.kind == "table")


# --------------------------------------------------------------------------- the real sweep


def test_written_report_shows_time_curves_target_and_intervals(
        sweep: reportdata.Sweep, tmp_path_factory: pytest.TempPathFactory) -> None:
    proc, folder = reportdata.written_report(tmp_path_factory.getbasetemp())
    assert proc.returncode == 0, proc.stderr
    page = (folder / "index.html").read_text()
    headings = [html.unescape(h) for h in re.findall(r"<h[123]>(.*?)</h[123]>", page)]
    assert headings[3:5] == ["Reward vs environment steps", "Return vs training seconds"]
    assert "Time to target return 4800 over the grid, halfcheetah" in headings
    assert "IQM of the final return with 95 % intervals" in headings
    for header in ("IQM [95% CI]", "intervals overlap", "time to target"):
        assert f"<th>{header}</th>" in page
    # HalfCheetah's default target (gymnasium's reward_threshold, 4800) is far out of reach of
    # 384 steps: every point says so, none shows a time of 0.
    assert page.count("<td>not reached</td>") == 4
    assert ("Targets: halfcheetah: 4800 (reward_threshold of HalfCheetah-v5 in gymnasium's "
            "registry)") in html.unescape(page)
    assert (folder / "time_to_target.png").read_bytes()[:4] == b"\x89PNG"
    assert "Scaling ladder" not in headings  # two num_envs: a grid, not a ladder


def test_intervals_and_time_to_target_of_a_real_sweep(sweep: reportdata.Sweep) -> None:
    client = reportdata.client_for(sweep)
    rep = records.build_report(client, Selection(sweep_id=sweep.sweep_id), store=sweep.uri,
                              with_figures=False)
    t = rep.tradeoff
    assert t.targets == {"halfcheetah": 4800.0}
    for point in rep.points:
        low, high = sorted(r.final_reward for r in point.runs)
        interval = t.intervals[point.label]
        # Two seeds: IQM = their mean, the bootstrap interval spans exactly the two.
        assert (interval.estimate, interval.low, interval.high, interval.runs) == (
            pytest.approx((low + high) / 2), low, high, 2)
        expected = [o.label for o in rep.points if o is not point
                    and t.intervals[o.label].low <= high and low <= t.intervals[o.label].high]
        assert t.overlaps[point.label] == expected
    table = ranking_table(rep)
    ranks = {p.label: rank for rank, p in enumerate(rep.points, start=1)}
    for row, point in zip(table.rows, rep.points, strict=True):
        interval = t.intervals[point.label]
        assert row[4] == f"{interval.estimate:.1f} [{interval.low:.1f}, {interval.high:.1f}]"
        assert row[5] == (", ".join(f"#{ranks[o]}" for o in t.overlaps[point.label]) or "none")
        assert row[8] == "not reached"

    # A target every run reaches: the time is the training clock at its first crossing.
    reachable = min(float(np.max(r.metrics["eval/mean_reward"].values)) for r in rep.runs)
    rep = records.build_report(client, Selection(sweep_id=sweep.sweep_id), store=sweep.uri,
                              with_figures=False, options=TradeoffOptions({"": reachable}))
    for point in rep.points:
        times = rep.tradeoff.times[point.label]
        assert times.reached == 2 and times.target == reachable
        for run, hit in zip(point.runs, times.hits, strict=True):
            rewards = run.metrics["eval/mean_reward"]
            step = int(rewards.steps[np.flatnonzero(rewards.values >= reachable)[0]])
            rollout, update = run.metrics["time/rollout_s"], run.metrics["time/update_s"]
            seconds = (rollout.values[rollout.steps <= step].sum()
                       + update.values[update.steps < step].sum())
            assert hit == statistics.TargetHit(step, pytest.approx(seconds))
            curve = statistics.reward_vs_seconds(run.metrics)
            assert curve is not None and len(curve) == len(rewards)
            assert 0 < curve.steps[-1] <= run.last("summary/wall_time_s")
        assert ranking_table(rep).rows[rep.points.index(point)][8] == times.text()
        assert times.text().endswith(" steps)")


# --------------------------------------------------------------------------- synthetic runs


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str, Path]:
    root = tmp_path_factory.mktemp("tradeoff")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    return MlflowClient(uri), uri, root


def logged_run(client: MlflowClient, experiment_id: str, num_envs: int, n_steps: int,
               seed: int, metrics: dict[str, float]) -> str:
    """A finished run of task "toy" at (num_envs, n_steps) with final metrics and 4
    iterations of timings."""
    run = client.create_run(experiment_id, run_name=f"toy-ne{num_envs}-ns{n_steps}-s{seed}",
                            tags={"env": "toy", "num_envs": str(num_envs),
                                  "n_steps": str(n_steps), "seed": str(seed)})
    batch = num_envs * n_steps
    logged = [Metric(key, value, 0, 4 * batch) for key, value in metrics.items()]
    for i in range(1, 5):
        logged += [Metric("time/rollout_s", 0.2 / num_envs, 0, i * batch),
                   Metric("time/update_s", 0.1, 0, i * batch)]
    client.log_batch(run.info.run_id, metrics=logged)
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def test_scaling_ladder_section_marks_the_knee(scratch: tuple[MlflowClient, str, Path]) -> None:
    client, uri, root = scratch
    exp = client.create_experiment("ladder", artifact_location=(root / "ladder").as_uri())
    fps = {2: 1000.0, 4: 1800.0, 8: 3000.0, 16: 3100.0}
    ids = tuple(logged_run(client, exp, n, 4096 // n, 0, {
        "summary/fps": f, "summary/peak_rss_mb": 400.0 + 50 * n,
        "summary/eval_mean_reward": 1.0}) for n, f in fps.items())
    rep = records.build_report(client, Selection(run_ids=ids), store=uri,
                              options=TradeoffOptions(memory_budget_mb=10_000))
    (ladder,) = rep.tradeoff.ladders
    assert (ladder.task, ladder.samples_per_update, ladder.knee.num_envs) == ("toy", 4096, 8)
    assert [r.num_envs for r in ladder.rungs] == [2, 4, 8, 16]
    blocks = render.report_blocks(rep)
    section = [b for b in blocks[[b.text for b in blocks].index("Scaling ladder"):]]
    assert section[3].text.startswith("Knee at num_envs=8: num_envs 8 → 16: throughput 3000 → "
                                      "3100 steps/s (+3% per doubling, below 10%)")
    rows = section[4].rows
    assert [row[0] for row in rows] == ["2", "4", "8 (knee)", "16"]
    assert [row[4] for row in rows] == ["1000–1000", "1800–1800", "3000–3000", "3100–3100"]
    assert [row[5] for row in rows] == ["–", "+80%", "+67%", "+3%"]
    assert [row[8] for row in rows] == ["500", "600", "800", "1200"]
    assert section[5].kind == "figure" and section[5].figure.filename == "scaling.png"
    figure_list = [b.figure.filename for b in blocks[:blocks.index(section[0])]
                   if b.kind == "figure"]
    assert "scaling.png" not in figure_list  # in its own section, not twice
    # A tighter memory budget moves the knee down: 8 envs need 800 MiB.
    rep = records.build_report(client, Selection(run_ids=ids), store=uri, with_figures=False,
                              options=TradeoffOptions(memory_budget_mb=700))
    assert rep.tradeoff.ladders[0].knee.num_envs == 4
    assert rep.tradeoff.ladders[0].knee.by == "memory"


def test_three_seeds_get_a_performance_profile(scratch: tuple[MlflowClient, str, Path]) -> None:
    client, uri, root = scratch
    exp = client.create_experiment("profile", artifact_location=(root / "profile").as_uri())
    ids = tuple(logged_run(client, exp, n, 64, seed, {"summary/eval_mean_reward": reward})
                for n, rewards in ((1, (10.0, 20.0, 30.0)), (2, (25.0, 35.0, 45.0)))
                for seed, reward in enumerate(rewards))
    rep = records.build_report(client, Selection(run_ids=ids), store=uri,
                              options=TradeoffOptions({"toy": 1.0}))
    names = [f.filename for f in rep.figures]
    assert "performance_profile.png" in names and "iqm_intervals.png" in names
    best, other = rep.points
    assert rep.tradeoff.intervals[best.label].estimate == pytest.approx(35.0)
    assert rep.tradeoff.overlaps[best.label] == [other.label]
    texts = [b.text for b in render.report_blocks(rep)]
    assert any(t.startswith("Not separated by the seeds (95% intervals overlap): #1 and #2.")
               for t in texts)
    assert any("Targets: toy: 1 (--target-return)." in t for t in texts)


# --------------------------------------------------------------------------- sweep=scale


@pytest.mark.slow
def test_scale_sweep_runs_and_its_report_marks_a_knee(tmp_path: Path) -> None:
    experiments = tmp_path / "experiments"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{experiments / 'mlflow.db'}",
           "WORKBENCH_EXPERIMENTS": str(experiments), "WORKBENCH_CPU_BUDGET": "2"}
    tiny = [o for o in TINY if o.split("=")[0] not in ("env.num_envs", "algo.n_steps")]
    # The preset's ladder shortened to fit a small CI machine: 1, 2, 4 envs at 256 samples
    # per update, 4 iterations each, one point at a time.
    sweep = run_cli("sweep", "sweep=scale", "sweep.id=scale-test", "sweep.num_envs=[1,2,4]",
                    "sweep.iso_batch=256", *tiny, "total_timesteps=1024", "eval.every_steps=0",
                    env=env, timeout=900)
    assert sweep.returncode == 0, sweep.stderr
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    rep = records.build_report(client, Selection(sweep_id="scale-test"),
                               store=env["MLFLOW_TRACKING_URI"], with_figures=False)
    (ladder,) = rep.tradeoff.ladders
    assert [(r.num_envs, r.n_steps) for r in ladder.rungs] == [(1, 256), (2, 128), (4, 64)]
    assert all(r.fps > 0 and r.rollout_s > 0 and r.update_s > 0 and r.peak_memory_mb > 0
               for r in ladder.rungs)
    # The knee under the default rules, recomputed from the measured numbers.
    gains = [(b.fps / a.fps) ** (1 / np.log2(b.num_envs / a.num_envs)) - 1
             for a, b in zip(ladder.rungs, ladder.rungs[1:], strict=False)]
    budget = ladder.memory_budget_mb
    assert budget is not None and budget > 0  # 80 % of the machine's memory, from the manifest
    over = next((i for i, r in enumerate(ladder.rungs) if r.peak_memory_mb > budget), None)
    slow = next((i for i, g in enumerate(gains) if g < 0.10), None)
    if over is not None and (slow is None or over <= slow):
        expected = ladder.rungs[over - 1].num_envs if over else None
    elif slow is not None:
        small, large = ladder.rungs[slow], ladder.rungs[slow + 1]
        # A dip the iterations' spread covers is no clear knee (a loaded machine).
        covered = large.fps_high >= small.fps_low * 1.1 ** np.log2(large.num_envs / small.num_envs)
        expected = None if covered else small.num_envs
    else:
        expected = None
    assert all(r.fps_low <= r.fps <= r.fps_high for r in ladder.rungs)  # 4 iterations each
    assert ladder.knee.num_envs == expected, ladder.knee.reason
    # Whatever this machine measured, a doubling cannot buy 100x the throughput: with that as
    # the minimum gain the knee is the first rung, marked on the written page.
    out = tmp_path / "reports"
    report = run_cli("report", "--sweep", "scale-test", "--out", str(out),
                     "--scale-min-gain", "100", env=env)
    assert report.returncode == 0, report.stderr
    page = (out / "sweep-scale-test" / "index.html").read_text()
    knee = re.search(r"<p>Knee at num_envs=(\d+): (.*?)</p>", page)
    assert knee is not None, "no knee marked"
    assert knee[1] == "1" and "per doubling, below 10000%" in knee[2]
    assert "<td>1 (knee)</td>" in page
    assert re.search(r"<td>\d+–\d+</td>", page), "no spread in the ladder's table"
    assert (out / "sweep-scale-test" / "scaling.png").read_bytes()[:4] == b"\x89PNG"
