"""Reports: a real small sweep end to end, run selection, ranking, manifests, bad input, UI."""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from workbench.cli import main, parse
from workbench.config import CONFIG_ID_TAG, ConfigError
from workbench.review import diagnostics, figures, records, render, report
from workbench.review.selection import Selection, all_experiment_ids, find_runs, known_sweeps

from . import reportdata
from .conftest import ROOT
from .support.ports import free_port

FIGURES = ["grid_heatmaps.png", "iqm_intervals.png", "reward_curves.png", "reward_vs_time.png",
           "time_split.png", "time_to_target.png", "update_signals.png"]


@pytest.fixture(scope="module")
def sweep(report_sweep: reportdata.Sweep) -> reportdata.Sweep:
    """The session's shared sweep (tests/reportdata.py)."""
    return report_sweep


# --------------------------------------------------------------------------- a real sweep


def test_report_of_a_real_sweep_writes_every_file(sweep: reportdata.Sweep,
                                                  tmp_path_factory: pytest.TempPathFactory
                                                  ) -> None:
    proc, folder = reportdata.written_report(tmp_path_factory.getbasetemp())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(folder / "index.html")
    videos = sorted(p.name for p in folder.iterdir() if p.name.startswith("video-"))
    assert len(videos) == 2 * 4  # MP4 and GIF of each point's best seed
    assert sorted(p.name for p in folder.iterdir() if p.name not in videos) == sorted(
        [*FIGURES, "index.html", "report.md"])
    for name in FIGURES:
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name

    page = (folder / "index.html").read_text()
    embedded = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(
        (folder / n).read_bytes() for n in FIGURES)
    # Self-contained: nothing is loaded from anywhere; links only point at the MLflow UI.
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert re.findall(r'src="(?!data:)', page) == []
    run_links = set(re.findall(r'href="([^"]+)"', page))
    assert run_links == {f"http://127.0.0.1:5000/#/experiments/1/runs/{run_id}?workflowType=machine_learning"
                         for run_id in sweep.child_ids}

    markdown = (folder / "report.md").read_text()
    for name in FIGURES:
        assert f"]({name})" in markdown
    # One content model, two renderings: the same headings in the same order.
    md_headings = [line.lstrip("#").strip() for line in markdown.splitlines()
                   if line.startswith("#")]
    html_headings = [html.unescape(h) for h in re.findall(r"<h[123]>(.*?)</h[123]>", page)]
    assert md_headings == html_headings
    assert md_headings[:4] == ["Report: sweep tiny-grid", "Ranking", "Figures",
                               "Reward vs environment steps"]
    for rank in range(1, 5):  # the ranking's rows: four points
        assert f"| {rank} | halfcheetah-ne" in markdown
    assert "| 5 | " not in markdown


def test_report_embeds_the_video_of_each_points_best_seed(
        sweep: reportdata.Sweep, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    client = reportdata.client_for(sweep)
    rep = records.build_report(client, Selection(sweep_id=sweep.sweep_id), store=sweep.uri,
                               with_figures=False)
    assert [v.point for v in rep.videos] == [p.label for p in rep.points]  # ranked order
    for point, shown in zip(rep.points, rep.videos, strict=True):
        best = max(point.runs, key=lambda r: r.final_reward)
        assert shown.run_id == best.run_id  # the 2-seed point shows its better seed
        logged = Path(client.download_artifacts(best.run_id, "video/replay.mp4", str(tmp_path)))
        assert shown.mp4 == logged.read_bytes()
        assert shown.gif[:6] == b"GIF89a"
    _, folder = reportdata.written_report(tmp_path_factory.getbasetemp())
    page = (folder / "index.html").read_text()
    embedded = re.findall(r'<video [^>]*src="data:video/mp4;base64,([^"]+)"', page)
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(v.mp4 for v in rep.videos)
    markdown = (folder / "report.md").read_text()
    for shown in rep.videos:
        assert (folder / f"{shown.stem}.mp4").read_bytes() == shown.mp4
        assert f"]({shown.stem}.gif)" in markdown and f"]({shown.stem}.mp4)" in markdown


def test_report_content_of_a_real_sweep(sweep: reportdata.Sweep) -> None:
    client = reportdata.client_for(sweep)
    rep = records.build_report(client, Selection(sweep_id=sweep.sweep_id), store=sweep.uri,
                              with_figures=False)  # the figures: the test above
    assert [r.run_id for r in rep.runs] == list(sweep.child_ids)  # oldest first, no parent
    assert rep.description == (  # the grid of every attempt's points, the parent's status
        "Sweep tiny-grid on halfcheetah: num_envs [1, 2] × n_steps [64, 128] × seeds [0, 1], "
        "8 points of 384 steps; parent run FINISHED.")
    # MLflow's run page: the parent's description tells both attempts (seed 1 came later).
    note = client.get_run(sweep.parent_id).data.tags["mlflow.note.content"]
    assert note.startswith("Sweep tiny-grid on halfcheetah: num_envs [1, 2] x n_steps [64, 128] "
                           "x seeds [0] = 4 points")
    assert " Then: Sweep tiny-grid on halfcheetah: num_envs [1, 2] x n_steps [64, 128] x seeds "\
           "[1] = 4 points" in note
    assert sorted(p.label for p in rep.points) == [
        "halfcheetah-ne1-ns128", "halfcheetah-ne1-ns64", "halfcheetah-ne2-ns128",
        "halfcheetah-ne2-ns64"]
    two_seeds = next(p for p in rep.points if p.label == "halfcheetah-ne2-ns64")
    assert [r.seed for r in two_seeds.runs] == [0, 1]
    rewards = [r.final_reward for r in two_seeds.runs]
    assert two_seeds.reward_mean == pytest.approx(sum(rewards) / 2)
    assert two_seeds.reward_std == pytest.approx(abs(rewards[0] - rewards[1]) / 2)
    ranked = [p.reward_mean for p in rep.points]
    assert ranked == sorted(ranked, reverse=True)
    assert set(records.grid_cells(rep.points)) == {(1, 64), (1, 128), (2, 64), (2, 128)}
    for run in rep.runs:
        b = rep.bottlenecks[run.run_id]
        assert b.rollout_s > 0 and b.update_s > 0 and 0 < b.rollout_share < 1
        assert b.verdict in {"sampling-bound", "update-bound", "neither busy", "balanced"}
        # Runs of a few seconds: MLflow's first CPU sample (always 0) makes no mean, and the
        # page says so instead of "0%".
        if b.cpu_samples < diagnostics.MIN_CPU_SAMPLES:
            assert b.cpu_percent is None and b.verdict != "neither busy"
            assert render.cpu_text(b) in ("not logged", f"too few samples ({b.cpu_samples}; "
                                          "MLflow samples every "
                                          "tracking.system_metrics_interval_s)")
        else:
            assert b.cpu_percent is not None and b.cpu_percent > 0
        assert b.memory_of == "process tree"  # the trainer's own, not the machine's
        assert run.tags["mlflow.note.content"].startswith(
            f"PPO on HalfCheetah-v5: {run.num_envs} envs x {run.n_steps} steps = "
            f"{run.num_envs * run.n_steps} samples per update")
    # Runs made before manifests existed: listed, not fatal.
    env = rep.environment
    if all(r.manifest is None for r in rep.runs):
        assert env.without_manifest == [r.name for r in rep.runs]
    else:
        assert env.without_manifest == [] and env.one_environment


# --------------------------------------------------------------------------- selection


def synthetic_run(client: MlflowClient, experiment_id: str, name: str, start: int,
                  tags: dict[str, str] | None = None, reward: float | None = None,
                  status: str = "FINISHED", end: int | None = None) -> str:
    """A run with a name, start and end time, tags and optionally a final evaluation reward."""
    run = client.create_run(experiment_id, start_time=start, run_name=name, tags=tags or {})
    if reward is not None:
        client.log_batch(run.info.run_id, metrics=[
            Metric("summary/eval_mean_reward", reward, start, 100)])
    client.set_terminated(run.info.run_id, status, end_time=end or start + 10)
    return run.info.run_id


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Three sweeps in two experiments plus a plain run, with known start and end times."""
    root = tmp_path_factory.mktemp("selection")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    alpha = client.create_experiment("alpha", artifact_location=(root / "a").as_uri())
    beta = client.create_experiment("beta", artifact_location=(root / "b").as_uri())
    ids: dict[str, object] = {"uri": uri, "root": root}

    def sweep_tags(sweep_id: str, role: str, point: str = "") -> dict[str, str]:
        tags = {"sweep_id": sweep_id, "sweep.role": role}
        return tags | ({"sweep.point": point} if point else {})

    ids["old_parent"] = synthetic_run(client, alpha, "sweep-old", 1000, sweep_tags("s-old",
                                                                                   "parent"))
    ids["old_a"] = synthetic_run(client, alpha, "p-ne1-ns8-s0", 1001,
                                 sweep_tags("s-old", "child", "p-ne1-ns8-s0"))
    ids["old_b"] = synthetic_run(client, alpha, "p-ne2-ns8-s0", 1002,
                                 sweep_tags("s-old", "child", "p-ne2-ns8-s0"))
    ids["plain"] = synthetic_run(client, alpha, "plain", 1003, {"preset": "demo"})
    ids["new_parent"] = synthetic_run(client, beta, "sweep-new", 2000, sweep_tags("s-new",
                                                                                  "parent"))
    ids["new_a"] = synthetic_run(client, beta, "q-ne1-ns8-s0", 2001,
                                 sweep_tags("s-new", "child", "q-ne1-ns8-s0"))
    # Started first but resumed last: its parent ended after every other run.
    ids["resumed_parent"] = synthetic_run(client, beta, "sweep-resumed", 500,
                                          sweep_tags("s-resumed", "parent"), end=9000)
    ids["resumed_a"] = synthetic_run(client, beta, "r-ne1-ns8-s0", 501,
                                     sweep_tags("s-resumed", "child", "r-ne1-ns8-s0"), end=8000)
    return ids


def picked(synthetic: dict[str, object], selection: Selection) -> tuple[str | None, list[str]]:
    uri = str(synthetic["uri"])
    chosen, runs, _ = find_runs(MlflowClient(uri), selection, uri)
    names = {v: k for k, v in synthetic.items() if isinstance(v, str)}
    return chosen.sweep_id, [names[r.info.run_id] for r in runs]


def test_no_selector_picks_the_most_recently_active_sweep(synthetic: dict[str, object]
                                                         ) -> None:
    assert picked(synthetic, Selection()) == ("s-resumed", ["resumed_a"])
    client = MlflowClient(str(synthetic["uri"]))
    ids = all_experiment_ids(client)
    assert known_sweeps(client, ids) == ["s-resumed", "s-new", "s-old"]


@pytest.mark.parametrize("selection, expected", [
    (Selection(sweep_id="s-old"), ["old_a", "old_b"]),
    (Selection(experiment="alpha"), ["old_a", "old_b", "plain"]),
    (Selection(experiment="alpha", tags={"preset": "demo"}), ["plain"]),
    (Selection(tags={"sweep.point": "p-ne2-ns8-s0"}), ["old_b"]),
])
def test_selection_by_sweep_experiment_and_tags(synthetic: dict[str, object],
                                                selection: Selection, expected: list[str]
                                                ) -> None:
    assert picked(synthetic, selection)[1] == expected


def test_selection_by_run_ids_keeps_their_order(synthetic: dict[str, object]) -> None:
    ids = (str(synthetic["plain"]), str(synthetic["old_a"]))
    assert picked(synthetic, Selection(run_ids=ids))[1] == ["plain", "old_a"]


@pytest.mark.unit
def test_selector_flags_and_config_overrides() -> None:
    argv = ["report", "--runs", "a,b", "--tag", "seed=0", "tracking.uri=sqlite:///x.db"]
    args, _ = parse(argv)
    selection, overrides = report.selection_from_args(args), args.overrides
    assert selection == Selection(run_ids=("a", "b"), tags={"seed": "0"})
    assert overrides == ["tracking.uri=sqlite:///x.db"]
    assert Selection(sweep_id="s1").default_name() == "sweep-s1"
    assert Selection(experiment="my exp").default_name() == "experiment-my_exp"
    assert Selection(run_ids=("b", "a")).default_name() == Selection(
        run_ids=("a", "b")).default_name()
    assert Selection(run_ids=("a", "b")).default_name().startswith("runs-2-")


@pytest.mark.unit
def test_target_and_ladder_options() -> None:
    args, _ = parse(["report", "--target-return", "950", "--target-return", "hopper=2500",
                     "--target-return=Reacher-v5=-3.75", "--memory-budget-mb", "8000"])
    options = report.options_from_args(args)
    assert dict(options.targets) == {"": 950.0, "hopper": 2500.0, "Reacher-v5": -3.75}
    assert (options.min_gain, options.memory_budget_mb) == (0.1, 8000.0)
    assert report.options_from_args(parse(["report"])[0]).targets == {}


@pytest.mark.parametrize("selection, message", [
    (Selection(sweep_id="nope"),
     "--sweep nope: no runs with tag sweep_id=nope in {uri}; sweeps (latest first): s-resumed, "
     "s-new, s-old"),
    (Selection(experiment="gamma"),
     "--experiment gamma: no such experiment in {uri}; experiments: Default, alpha, beta"),
    (Selection(run_ids=("0123abcd",)), "--runs 0123abcd: no such run in {uri}"),
    (Selection(experiment="beta", tags={"preset": "demo"}),
     "experiment 'beta', tag preset=demo: no runs match in {uri}"),
])
def test_nothing_selected_is_one_clear_line(synthetic: dict[str, object], selection: Selection,
                                            message: str) -> None:
    uri = str(synthetic["uri"])
    with pytest.raises(ConfigError) as caught:
        find_runs(MlflowClient(uri), selection, uri)
    assert str(caught.value).startswith(message.format(uri=uri))
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- ranking


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str, Path]:
    """One store for the synthetic-run tests below (each makes its own experiment)."""
    root = tmp_path_factory.mktemp("scratch")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    return MlflowClient(uri), uri, root


def experiment(scratch: tuple[MlflowClient, str, Path], name: str) -> str:
    client, _, root = scratch
    return client.create_experiment(name, artifact_location=(root / name).as_uri())


def test_a_diverged_run_never_ranks_first(scratch: tuple[MlflowClient, str, Path]) -> None:
    client, uri, _ = scratch
    exp = experiment(scratch, "rank")

    def run(name: str, num_envs: int, reward: float, status: str = "FINISHED") -> str:
        return synthetic_run(client, exp, name, 1000 + num_envs, {
            "env": "toy", "num_envs": str(num_envs), "n_steps": "8"}, reward, status)

    diverged = run("diverged", 1, 900.0)
    client.log_batch(diverged, metrics=[Metric("train/value_loss", math.nan, 0, 50)])
    failed = run("failed", 2, 500.0, status="FAILED")
    good = run("good", 3, 100.0)
    slow, fast = run("slow", 4, 100.0), run("fast", 5, 100.0)  # a tie, broken by wall time
    client.log_batch(slow, metrics=[Metric("summary/wall_time_s", 90.0, 0, 100)])
    client.log_batch(fast, metrics=[Metric("summary/wall_time_s", 30.0, 0, 100)])
    rep = records.build_report(client, Selection(run_ids=(diverged, failed, good, slow, fast)),
                              store=uri, with_figures=False)
    assert [(p.label, p.diverged, p.finished) for p in rep.points] == [
        ("toy-ne5-ns8", False, True), ("toy-ne4-ns8", False, True),
        ("toy-ne3-ns8", False, True), ("toy-ne2-ns8", False, False),
        ("toy-ne1-ns8", True, True)]
    ranking = next(b for b in render.report_blocks(rep) if b.kind == "table")
    assert [row[1] for row in ranking.rows] == [
        "toy-ne5-ns8", "toy-ne4-ns8", "toy-ne3-ns8", "toy-ne2-ns8", "toy-ne1-ns8 (diverged)"]
    # a FAILED run is listed, never counted: its point has no return
    assert [row[3] for row in ranking.rows] == ["100.0", "100.0", "100.0", "–", "900.0"]
    assert [row[10] for row in ranking.rows] == [
        "FINISHED", "FINISHED", "FINISHED", "FAILED", "FINISHED"]


def sweep_point_runs(client: MlflowClient, exp: str, sweep_id: str,
                     runs: list[tuple[str, int, str, float]]) -> list[str]:
    """A sweep over algo.learning_rate x env in ``exp``: its parent run, then one run per
    (learning rate, seed, status, final return), each carrying its point's grid tags."""
    parent = synthetic_run(client, exp, sweep_id, 1000, {"sweep_id": sweep_id,
                                                         "sweep.role": "parent"})
    client.log_batch(parent, params=[
        Param("sweep.grid", "{'algo.learning_rate': [0.0001, 0.001], 'env': ['hopper']}"),
        Param("sweep.env", "hopper")])
    ids = []
    for i, (lr, seed, status, reward) in enumerate(runs):
        point = f"lr={lr} env=hopper s{seed}"
        ids.append(synthetic_run(client, exp, point, 1001 + i, {
            "sweep_id": sweep_id, "sweep.role": "child", "sweep.point": point, "env": "hopper",
            "seed": str(seed), "num_envs": "2", "n_steps": "64",
            "sweep.grid.algo.learning_rate": lr, "sweep.grid.env": "hopper",
            "sweep.grid.env.num_envs": "2", "sweep.grid.algo.n_steps": "64",
            CONFIG_ID_TAG: f"config-lr{lr}"},
            reward, status, end=2000 + i))
    return ids


def ranking_text(rep: records.Report) -> tuple[tuple[tuple[object, ...], ...], str]:
    """The ranking table's rows and every paragraph of the report, joined."""
    blocks = render.report_blocks(rep)
    table = next(b for b in blocks if b.kind == "table")
    return table.rows, " ".join(b.text for b in blocks if b.kind == "p")


def test_a_stopped_attempt_is_listed_never_counted(
        scratch: tuple[MlflowClient, str, Path]) -> None:
    """A sweep stopped and resumed: one point has a KILLED run (its last periodic evaluation
    early on) and a FINISHED run of the same seed; only the FINISHED one counts."""
    client, uri, _ = scratch
    exp = experiment(scratch, "resumed")
    sweep_point_runs(client, exp, "s-resumed", [
        ("0.001", 0, "KILLED", 12.0), ("0.001", 0, "FINISHED", 900.0),
        ("0.0001", 0, "FINISHED", 500.0)])
    rep = records.build_report(client, Selection(sweep_id="s-resumed"), store=uri,
                               with_figures=False)
    assert rep.description == ("Sweep s-resumed on hopper: algo.learning_rate [0.0001, 0.001] "
                               "× seeds [0], 2 points (3 runs); parent run FINISHED.")
    best = rep.points[0]
    assert (best.label, best.reward_mean, best.finished) == ("lr=1e-3", 900.0, True)
    assert [r.status for r in best.scored] == ["FINISHED"]
    rows, text = ranking_text(rep)
    assert rows[0][2:6] == ("1 (2 runs)", "900.0", "900.0 (1 seed: no interval)", "–")
    assert rows[0][10] == "1 FINISHED, 1 KILLED"
    assert "interval" not in text.split("Ranked by")[0].replace("Confidence intervals need", "")
    assert "ranking holds" not in text and "Confidence intervals need two seeds" in text


def test_no_ranking_is_said_to_hold_on_a_point_with_one_seed(
        scratch: tuple[MlflowClient, str, Path]) -> None:
    client, uri, _ = scratch
    exp = experiment(scratch, "one-seed")
    sweep_point_runs(client, exp, "s-mixed", [
        ("0.001", 0, "FINISHED", 900.0), ("0.001", 1, "FINISHED", 910.0),
        ("0.0001", 0, "FINISHED", 100.0), ("0.0001", 1, "KILLED", 300.0)])
    rep = records.build_report(client, Selection(sweep_id="s-mixed"), store=uri,
                               with_figures=False)
    rows, text = ranking_text(rep)
    assert [row[2] for row in rows] == ["2", "1 (2 runs)"]
    assert rows[1][4] == "100.0 (1 seed: no interval)"
    assert not rep.points[1].finished  # seed 1 of that point never finished
    assert "ranking holds" not in text
    assert ("No two intervals of the points with two seeds or more overlap. #2 has fewer than "
            "two finished seeds: no interval, so their places are single runs.") in text


def test_each_task_gets_its_own_heatmaps(scratch: tuple[MlflowClient, str, Path]) -> None:
    client, uri, _ = scratch
    exp = experiment(scratch, "tasks")
    ids = [synthetic_run(client, exp, f"{env}-{ne}", 1000 + i, {
        "env": env, "num_envs": str(ne), "n_steps": "8"}, reward=float(i))
        for i, (env, ne) in enumerate([("hopper", 1), ("hopper", 2), ("walker 2d", 1)])]
    rep = records.build_report(client, Selection(run_ids=tuple(ids)), store=uri)
    assert [f.filename for f in rep.figures] == [  # walker's one cell is no grid: no heatmap
        "reward_curves.png", "update_signals.png", "grid_heatmaps-hopper.png", "time_split.png"]
    hopper = records.grid_cells(records.points_by_env(rep.points)["hopper"])
    assert {cell: values["reward"] for cell, values in hopper.items()} == {
        (1, 8): 0.0, (2, 8): 1.0}


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_a_point_that_failed_before_training_keeps_labels_short(
        scratch: tuple[MlflowClient, str, Path]) -> None:
    client, uri, _ = scratch
    exp = experiment(scratch, "prefail")
    params = {f"algo.key_{i:02d}": "1.0" for i in range(50)} | {"algo.n_epochs": "5"}
    ids = []
    for i, ne in enumerate((1, 2)):
        run_id = synthetic_run(client, exp, f"p-ne{ne}", 1000 + i, {
            "env": "hopper", "num_envs": str(ne), "n_steps": "8"}, reward=float(i))
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                         metrics=[Metric("rollout/ep_rew_mean", float(s), 1000, s)
                                  for s in (8, 16, 24)])
        ids.append(run_id)
    # The sweep's record of a point whose kernel died before training: tags, no params.
    ids.append(synthetic_run(client, exp, "p-ne4", 1003, {
        "env": "hopper", "num_envs": "4", "n_steps": "8", "error": "kernel died"},
        status="FAILED"))
    rep = records.build_report(client, Selection(run_ids=tuple(ids)), store=uri)
    assert sorted(p.label for p in rep.points) == ["hopper-ne1-ns8", "hopper-ne2-ns8",
                                                   "hopper-ne4-ns8"]
    for figure in rep.figures:
        width, height = png_size(figure.png)
        assert width < 4000 and height < 4000, (figure.filename, width, height)
    long = records.Point(label="x" * 500, runs=rep.points[0].runs)  # labels are cut anyway
    curves = [figures.Curves(long.label, "#000000", [r.metrics["rollout/ep_rew_mean"]
                                                      for r in long.runs])]
    assert png_size(figures.png_bytes(figures.reward_figure(curves, [])))[0] < 4000


# --------------------------------------------------------------------------- manifests


def manifest(torch: str = "2.13.0", host: str = "box") -> dict[str, object]:
    return {
        "created_at": "2026-01-01T00:00:00+00:00",
        "python": {"version": "3.11.7"},
        "packages": {"torch": torch, "mujoco": "3.3.0"},
        "pip_freeze": [f"torch=={torch}", "mujoco==3.3.0", "rich==13.0"],
        "os": {"system": "Linux", "kernel": "6.1"},
        "hardware": {"cpu_model": "Xeon", "logical_cores": 2, "gpus": []},
        "cuda": {"torch_cuda": None, "cudnn": None, "driver": None},
        "git": {"commit": "abc", "branch": "main", "dirty": False},
        "run": {"hostname": host, "command": "workbench train ...", "cwd": f"/home/{host}"},
    }


@pytest.mark.parametrize("manifests, differing, shared_text", [
    ([manifest(), manifest(), None],
     {}, "All runs share one environment."),
    ([manifest(), manifest(torch="2.12.0", host="other"), None],
     {"packages.torch": {"2.13.0": ["r0"], "2.12.0": ["r1"]},
      "run.hostname": {"box": ["r0"], "other": ["r1"]}}, None),
])
def test_manifest_facts_that_differ(scratch: tuple[MlflowClient, str, Path],
                                    manifests: list[dict[str, object] | None],
                                    differing: dict[str, dict[str, list[str]]],
                                    shared_text: str | None) -> None:
    client, uri, _ = scratch
    exp = experiment(scratch, f"env-{len(differing)}")
    ids = []
    for i, content in enumerate(manifests):
        run_id = synthetic_run(client, exp, f"r{i}", 1000 + i, reward=1.0)
        if content is not None:
            client.log_text(run_id, json.dumps(content), "manifest.json")
        ids.append(run_id)
    rep = records.build_report(client, Selection(run_ids=tuple(ids)), store=uri,
                              with_figures=False)
    assert rep.environment.differing == differing
    assert rep.environment.without_manifest == ["r2"]
    texts = [b.text for b in render.environment_blocks(rep.environment)]
    if shared_text:
        assert shared_text in texts
        assert rep.environment.shared == {
            "torch": "2.13.0", "mujoco": "3.3.0", "python": "3.11.7", "cuda": "none",
            "gpu": "none", "kernel": "6.1", "host": "box", "git_commit": "abc",
            "git_branch": "main", "git_dirty": "false"}
    else:
        assert texts[1] == "2 manifest fact(s) differ between the runs shown:"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv, message", [
    (["report", "--sweep", "a", "--runs", "b"],
     "report: argument --runs: not allowed with argument --sweep"),
    (["report", "--sweep", ""], "report: argument --sweep: empty value"),
    (["report", "--sweep", "nope"], "--sweep nope: no runs with tag sweep_id=nope"),
    (["report", "--approx-kl-max", "-1"], "threshold approx_kl_max=-1.0: must be > 0"),
    (["report", "--experiment", "alpha", "--name", "../x"], "--name '../x': use letters"),
    (["report", "algo.n_step=3"], "algo.n_step: unknown config key"),
    (["report", "--target-return", "abc"], "report: argument --target-return: 'abc': give a "
     "return, e.g. 950, or TASK=RETURN"),
    (["report", "--target-return", "=5"], "report: argument --target-return: '=5': name the "
     "task"),
    (["report", "--scale-min-gain", "0"], "report: argument --scale-min-gain: '0': must be > 0"),
])
def test_bad_input_exits_2_in_one_line(synthetic: dict[str, object], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], argv: list[str],
                                       message: str) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(synthetic["uri"]))
    monkeypatch.setenv("WORKBENCH_REPORTS", str(tmp_path / "reports"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench: error: {message}"), err
    assert err.count("\n") == 1
    assert not (tmp_path / "reports").exists()


@pytest.mark.unit
def test_missing_store_is_bad_input_and_creates_nothing(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    db = tmp_path / "none" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    assert main(["report"]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: tracking store sqlite:///{db}: no such database; train or sweep "
        "first, or set MLFLOW_TRACKING_URI / tracking.uri to the team's store\n")
    assert not db.parent.exists()


# --------------------------------------------------------------------------- notebook and UI


@pytest.mark.slow
def test_compare_notebook_runs_under_papermill(sweep: reportdata.Sweep, tmp_path: Path) -> None:
    import papermill

    output = tmp_path / "compare.ipynb"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in sweep.env().items():
            mp.setenv(key, value)
        mp.setenv("WORKBENCH_REPORTS", str(tmp_path / "reports"))
        papermill.execute_notebook(
            str(ROOT / "notebooks" / "compare.ipynb"), str(output),
            parameters={"sweep_id": sweep.sweep_id, "thresholds": {"approx_kl_max": 0.1}},
            kernel_name="workbench", cwd=str(ROOT / "notebooks"),
        )
    cells = json.loads(output.read_text())["cells"]
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4
    texts = "".join("".join(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert "Ranking" in texts and "Diagnostics" in texts and "halfcheetah-ne2-ns64" in texts
    assert (tmp_path / "reports" / f"sweep-{sweep.sweep_id}" / "index.html").is_file()


@pytest.mark.slow
def test_ui_serves_runs_with_descriptions_and_sweep_tags(sweep: reportdata.Sweep) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "workbench", "ui", "--port", str(port)], cwd=ROOT,
        env=reportdata.environ(sweep), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # the MLflow server and its worker die with the group
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert server.poll() is None, "workbench ui exited"
                time.sleep(1)
        request = urllib.request.Request(
            f"{base}/api/2.0/mlflow/runs/search", method="POST",
            data=json.dumps({"experiment_ids": ["1"],
                             "filter": f"tags.sweep_id = '{sweep.sweep_id}'"}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            runs = json.loads(answer.read())["runs"]
        tags = {run["info"]["run_id"]: {t["key"]: t["value"] for t in run["data"]["tags"]}
                for run in runs}
        assert set(tags) == {sweep.parent_id, *sweep.child_ids}
        assert tags[sweep.parent_id]["sweep.role"] == "parent"
        for run_id in sweep.child_ids:  # what the compare view groups and shows
            assert tags[run_id]["mlflow.parentRunId"] == sweep.parent_id
            assert tags[run_id]["mlflow.note.content"].startswith("PPO on HalfCheetah-v5: ")
            for key in ("sweep_id", "num_envs", "n_steps", "seed"):
                assert tags[run_id][key], key
        with urllib.request.urlopen(f"{base}/", timeout=30) as answer:
            assert b"<html" in answer.read().lower()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


# The report's content width on a 1280-px-wide screen (render.CSS: body padding 1.5rem).
CONTENT_PX_AT_1280 = 1280 - 48


def smallest_text_px(fig: object) -> tuple[float, str]:
    """The smallest text of a figure as a 1280-px-wide screen shows it: its size in points at
    the figure's dpi, scaled to the width the page gives the PNG; and which text it is."""
    import matplotlib.text

    assert isinstance(fig, figures.Figure)
    width = png_size(figures.png_bytes(fig))[0]
    scale = min(render.FIGURE_SCALE, CONTENT_PX_AT_1280 / width)  # as index.html shows it
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
    smallest = min(texts, key=lambda t: t.get_fontsize())
    return smallest.get_fontsize() * figures.DPI / 72 * scale, smallest.get_text()


def test_figures_text_reads_at_1280_px_from_the_back_of_a_room() -> None:
    steps = np.arange(0, 5000, 500)
    curve = [figures.Curves(f"inverted_pendulum-ne{ne}", "#1f77b4",
                            [diagnostics.Series(steps, steps / 10.0 + ne)])
             for ne in (2, 4, 8)]
    # Labels at the length limit make the legend taller, never the figure wider.
    long = [figures.Curves(f"{ne} " + "algo.learning_rate=1e-4 algo.gae_lambda=0.95 " * 2,
                           "#1f77b4", [diagnostics.Series(steps, steps / 10.0 + ne)])
            for ne in range(6)]
    cells = {(ne, ns): {"reward": ne * ns / 10, "fps": 1000.0 * ne, "wall": 100.0 / ne}
             for ne in (2, 4, 8) for ns in (64, 128, 256)}
    drawn = {"reward curves (2 panels)": figures.reward_figure(curve, curve),
             "update signals (3 panels)": figures.signals_figure(
                 curve, curve, curve, clip_max=0.3, kl_max=0.05),
             "grid heatmaps (3 panels)": figures.grid_figure(cells, figures.GRID_METRICS),
             "long labels (3 panels)": figures.signals_figure(
                 long, long, long, clip_max=0.3, kl_max=0.05)}
    smallest = {name: smallest_text_px(fig) for name, fig in drawn.items()}
    print({name: f"{px:.1f} px ({text!r})" for name, (px, text) in smallest.items()})
    assert all(px >= 16 for px, _ in smallest.values()), smallest


def test_iso_batch_lines_pass_behind_the_cell_numbers() -> None:
    import matplotlib.colors

    cells = {(ne, ns): {"reward": float(ne * ns)} for ne in (1, 2, 4) for ns in (64, 128, 256)}
    fig = figures.grid_figure(cells, figures.GRID_METRICS[:1])
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    numbers = [t for t in ax.texts if t.get_text().replace(".", "").isdigit()]
    assert lines and len(numbers) == len(cells)
    for number in numbers:  # drawn over every line, on an opaque patch of its cell's color
        assert all(number.get_zorder() > line.get_zorder() for line in lines)
        patch = number.get_bbox_patch()
        assert patch is not None and matplotlib.colors.to_rgba(patch.get_facecolor())[3] == 1
