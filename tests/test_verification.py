"""Verifying a change: ``sweep=verify`` in stages until decided, the points of another software
stack (``sweep.kernel``), ``workbench compare --margin`` on real runs, and ``workbench promote
--not-worse-than``.

Real sweeps (papermill, MLflow, MuJoCo) on small budgets: a clear case (InvertedPendulum with a
learning rate 10x too small, 3 seeds a side, which stops at its first stage) run in a second
kernel of this virtualenv; a close case on a copy of the session's shared sweep, whose first
stage is the shared sweep's own seeds (resumed, nothing trained) and whose second adds one
seed a side; the same configuration trained again in the second kernel, for two runs of one
configuration.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import mlflow.artifacts
import pytest
from mlflow.tracking import MlflowClient
from workbench.cli import main
from workbench.config import ConfigError
from workbench.config.margin import Margin
from workbench.review import noninferiority, verification
from workbench.review.report import open_report
from workbench.review.selection import Selection
from workbench.sweeps.request import check_request

from . import reportdata
from .conftest import embedded_copy, embedded_store

SECOND = "workbench-again"  # this virtualenv under a second kernel name: a second stack
# InvertedPendulum, 100-step episodes, 4 PPO iterations: the tuned rate reaches ~90 of 100,
# a tenth of it ~30 (a deliberately worse side), in seconds.
PENDULUM = ["env=inverted_pendulum", "env.num_envs=4", "algo.n_steps=256",
            "total_timesteps=4096", "env.max_episode_steps=100", "env.vec_env=dummy",
            "video=off", "eval.final_episodes=2", "tracking.system_metrics=false"]
CLEAR = ["sweep", "sweep=verify", "sweep.grid={algo.learning_rate:[2.22425e-4,2.22425e-5]}",
         "sweep.verify.max_seeds=6", f"sweep.kernel={SECOND}", *PENDULUM]
# The shared sweep's grid, narrowed to two of its points (the same names, so its seeds 0
# and 1 are the first stage), with a margin no 3 seeds can settle.
CLOSE = ["sweep=verify", f"sweep.id={reportdata.SWEEP_ID}", "sweep.num_envs=[1]",
         "sweep.n_steps=[64,128]", "sweep.seeds=[0,1]", "sweep.verify.add_seeds=1",
         "sweep.verify.max_seeds=3", "sweep.verify.margin=0.01", "sweep.workers=2",
         *reportdata.POINT_TINY, "video=off", "tracking.system_metrics=false"]  # not judged


def kernel_spec(root: Path, name: str, python: str, env: dict[str, str] | None = None) -> None:
    """A Jupyter kernel ``name`` started by ``python`` under ``root/kernels``, with ``env``
    added to its environment (Jupyter's kernel spec ``env``)."""
    folder = root / "kernels" / name
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps({
        "argv": [python, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"], "display_name": name, "language": "python",
        "env": env or {}}))


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """JUPYTER_PATH with ``workbench-again`` (this virtualenv, with PYTHONHASHSEED=0: a
    variable the manifest records, so a run shows which kernel it ran in) and ``bare`` (the
    Python this virtualenv was made from, without the workbench)."""
    root = tmp_path_factory.mktemp("jupyter")
    kernel_spec(root, SECOND, sys.executable, {"PYTHONHASHSEED": "0"})
    kernel_spec(root, "bare", getattr(sys, "_base_executable", sys.executable))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(root))
        yield root


# --------------------------------------------------------------------------- bad input


LR = "sweep.grid={algo.learning_rate:[1e-4,3e-4]}"


@pytest.mark.unit
@pytest.mark.parametrize(("overrides", "line"), [
    ([LR, "sweep.verify.margin=0%"], "sweep.verify.margin=0%: a margin must be above 0 % and "
     "below 100 %; give e.g. 5% (of A's IQM) or a return such as 50"),
    ([LR, "sweep.verify.margin=100%"], "sweep.verify.margin=100%: a margin must be above 0 % "
     "and below 100 %"),
    ([LR, "sweep.verify.max_seeds=2"], "sweep.verify.max_seeds=2: below the first stage's 3 "
     "seeds (sweep.seeds); set sweep.verify.max_seeds=3 or more, or fewer sweep.seeds"),
    (["sweep.grid={algo.learning_rate:[1e-4,3e-4,1e-3]}"], "sweep=verify: the grid has 3 "
     "configurations (lr1e-4, lr3e-4, lr1e-3); a verification compares two, A first"),
    (["sweep.grid={env:[hopper,walker2d]}"], "sweep=verify: A (hopper) trains on hopper, B "
     "(walker2d) on walker2d, and returns of different tasks are not comparable; verify on "
     "one task, or set sweep.verify.allow_different_tasks=true"),
])
def test_a_verification_request_is_checked_before_anything_runs(overrides: list[str],
                                                                 line: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_request(["sweep=verify", *overrides])
    assert str(info.value).startswith(line)


@pytest.mark.unit
def test_two_kernels_are_two_sides_of_one_configuration() -> None:
    request = check_request(["sweep=verify", f"sweep.grid={{sweep.kernel:[workbench,{SECOND}]}}",
                             "sweep.seeds=[0,1]", "env=hopper"])
    names = [p.name for p in request.points]
    assert names == ["workbench-s0", f"{SECOND}-s0", "workbench-s1", f"{SECOND}-s1"]  # A, B
    a, b = request.points[:2]
    assert (a.kernel, b.kernel) == ("workbench", SECOND) and a.config_id == b.config_id
    assert a.overrides() == ["tracking.run_name=workbench-s0"]
    assert b.overrides() == [f"sweep.kernel={SECOND}", f"tracking.run_name={SECOND}-s0"]
    plain = check_request(["sweep.num_envs=[1]", "sweep.n_steps=[64]"]).sweep_id
    assert check_request(["sweep.num_envs=[1]", "sweep.n_steps=[64]",
                          f"sweep.kernel={SECOND}"]).sweep_id != plain  # another stack


@pytest.mark.unit
def test_a_report_keeps_one_configuration_in_two_stacks_apart() -> None:
    """Both stacks' runs share a config id (the learning problem is the same); the report
    shows them as two points, by the kernel each ran in."""
    from workbench.config import CONFIG_ID_TAG
    from workbench.review import records

    def run(kernel: str, seed: int) -> records.RunRecord:
        name = f"{kernel}-s{seed}"
        tags = {"env": "hopper", "seed": str(seed), "sweep.point": name, CONFIG_ID_TAG: "c0ffee",
                "sweep.grid.sweep.kernel": kernel, **({"sweep.kernel": kernel}
                                                      if kernel != "workbench" else {})}
        return records.RunRecord(run_id=name, name=name, experiment_id="0", status="FINISHED",
                                 start_ms=0, end_ms=1, tags=tags, params={}, metrics={})

    points = records.group_points([run(k, s) for s in (0, 1) for k in ("workbench", SECOND)])
    assert sorted((p.label, len(p.runs)) for p in points) == [
        ("kernel=workbench", 2), (f"kernel={SECOND}", 2)]


def test_a_missing_kernel_or_one_without_the_workbench_is_one_line(
        kernels: Path, bare_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for kernel, line in [
        ("nope", "sweep.kernel=nope: no Jupyter kernel 'nope' (registered: "),
        ("bare", "sweep.kernel=bare: its interpreter "),
    ]:
        args = ["sweep", "sweep.num_envs=[1]", "sweep.n_steps=[64]", f"sweep.kernel={kernel}"]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"workbench: error: {line}") and err.count("\n") == 1, err
    assert "has no workbench installed; install the project into that virtualenv" in err
    assert not bare_store.exists()  # no store, no run, no sweep folder: nothing started


# --------------------------------------------------------------------------- the clear case


@dataclass(frozen=True)
class Clear:
    """The clear case's store and what its command printed."""

    experiments: Path
    client: MlflowClient
    code: int
    out: str

    def point_run(self, point: str) -> str:
        found = self.client.search_runs(
            [e.experiment_id for e in self.client.search_experiments()],
            f"tags.`sweep.point` = '{point}'")
        return str(found[0].info.run_id)


@pytest.fixture(scope="module")
def clear(kernels: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clear]:
    experiments = tmp_path_factory.mktemp("clear") / "experiments"
    with embedded_store(experiments) as patch:
        patch.setenv("WORKBENCH_CPU_BUDGET", "2")  # 2 points at a time, 1 core each
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(CLEAR)
        yield Clear(experiments, MlflowClient(f"sqlite:///{experiments / 'mlflow.db'}"), code,
                    out.getvalue())


@pytest.mark.slow  # 6 points (kernel start, ~4 s of training each) on 2 workers
def test_a_clear_case_stops_at_its_first_stage(clear: Clear) -> None:
    assert clear.code == 1, clear.out[-3000:]  # B is worse: not taken
    stages = re.findall(r"^verify stage (\d) of (\d): (\d) seeds a side: (.*)$", clear.out, re.M)
    assert [s[:3] for s in stages] == [("1", "2", "3")]  # stopped at stage 1 of 2
    assert stages[0][3].startswith("B is worse than A by more than 5 % (96.9 % interval of "
                                   "B - A: ")
    parent = clear.client.search_runs(
        [e.experiment_id for e in clear.client.search_experiments()],
        "tags.`sweep.role` = 'parent'")[0]
    tags = parent.data.tags
    assert (tags["verify.verdict"], tags["verify.seeds"], tags["verify.stage"],
            tags["verify.sides"]) == ("worse", "3", "1 of 2", "lr2.224e-4 -> lr2.224e-5")
    assert tags["verify.lines"] == stages[0][3]
    level = parent.data.metrics["verify/level"]
    assert level == pytest.approx(noninferiority.stage_levels([3, 6])[0])
    assert parent.data.metrics["verify/return_high"] < -0.05  # the interval, in the store
    assert clear.out.rstrip().endswith(f"verification {tags['sweep_id']} (parent run "
                                       f"{parent.info.run_id}): worse after 3 seeds a side")
    # Every point ran in the kernel sweep.kernel named: its tag, its config, and the kernel
    # spec's own environment in its manifest.
    run = clear.client.get_run(clear.point_run("lr2.224e-5-s2"))
    assert run.data.tags["sweep.kernel"] == SECOND and run.data.params["sweep.kernel"] == SECOND
    manifest = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/manifest.json")
    assert manifest["run"]["environment"]["PYTHONHASHSEED"] == "0"
    # The sweep's report opens on the verification: its verdict, a row per stage.
    section = open_report(Selection(sweep_id=tags["sweep_id"])).sections[0]
    assert section.title == "Verification: worse (lr2.224e-4 -> lr2.224e-5)"
    assert section.text.startswith(stages[0][3])
    (row,) = section.rows
    assert row[:3] == ("1", "3", "96.9 %") and row[3].startswith(
        f"{parent.data.metrics['verify/return_estimate']:+.1%} [")  # a share: margin 5%
    assert tags["verify.margin"] == "5%" and row[4] == "-"  # no target, no time


# --------------------------------------------------------------------------- the close case


@dataclass(frozen=True)
class Close:
    uri: str
    experiments: Path


@pytest.fixture(scope="module")
def close(report_sweep: reportdata.Sweep, kernels: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Close]:
    """A copy of the shared sweep's store, in the environment while this module runs."""
    with embedded_copy(report_sweep.experiments, tmp_path_factory, "close") as (uri, target, patch):
        patch.setenv("WORKBENCH_CPU_BUDGET", "2")
        yield Close(uri, target)


@pytest.mark.slow  # 4 points: a stage of 2, and the same configuration in another kernel
def test_a_close_case_goes_to_the_cap_and_two_runs_of_one_config_are_undecided(
        close: Close, capsys: pytest.CaptureFixture[str]) -> None:
    client = MlflowClient(close.uri)
    before = {r.info.run_id for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "")}
    assert main(["sweep", *CLOSE]) == 1  # undecided at the cap: not taken
    out = capsys.readouterr().out
    stages = re.findall(r"^verify stage (\d) of (\d): (\d) seeds a side: (.*)$", out, re.M)
    assert [s[:3] for s in stages] == [("1", "2", "2"), ("2", "2", "3")]
    assert all(s[3].startswith("undecided: about ") for s in stages), stages
    new = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()],
                                         "") if r.info.run_id not in before]
    trained = sorted(r.data.tags.get("sweep.point", "") for r in new
                     if r.data.tags.get("sweep.role") == "child")
    assert trained == ["halfcheetah-ne1-ns128-s2", "halfcheetah-ne1-ns64-s2"]  # stage 2 only
    (parent,) = client.search_runs(  # the shared sweep's parent, the verification's now
        [e.experiment_id for e in client.search_experiments()],
        f"tags.sweep_id = '{reportdata.SWEEP_ID}' and tags.`sweep.role` = 'parent'")
    assert parent.data.tags["verify.verdict"] == "undecided"
    assert parent.data.tags["verify.stage"] == "2 of 2"
    section = verification.verification_section(client, parent.info.run_id)
    assert section is not None and [row[:2] for row in section.rows] == [("1", "2"), ("2", "3")]

    # The same configuration in a second stack (this virtualenv under another kernel name):
    # two runs of one config, which a tiny margin and 2 seeds a side cannot settle.
    again = ["sweep.num_envs=[1]", "sweep.n_steps=[64]", "sweep.seeds=[0,1]",
             f"sweep.kernel={SECOND}", "sweep.workers=2", *reportdata.POINT_TINY]
    request = check_request(again)
    assert main(["sweep", *again]) == 0
    capsys.readouterr()
    a, b = f"{reportdata.SWEEP_ID}/halfcheetah-ne1-ns64", f"{request.sweep_id}/halfcheetah-ne1-ns64"
    assert main(["compare", a, b, "--margin", "0.01", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    changed = {d["key"]: (d["a"], d["b"]) for d in data["config"]}
    assert changed == {"sweep.kernel": ("workbench", SECOND)}  # what changed: the stack
    environment = {(d["section"], d["key"]): d["b"] for d in data["environment"]}
    assert environment["run", "environment.PYTHONHASHSEED"] == "0"  # and its manifest
    (judged,) = data["noninferiority"]
    assert judged["verdict"] == "undecided" and judged["seeds"] == [3, 2]
    assert judged["more_seeds"] >= 1 and judged["line"].startswith(
        f"undecided: about {judged['more_seeds']} more seed")


# --------------------------------------------------------------------------- promote


# The gate profile narrowed to two cells (nominal, a one-step action delay), 3 seeds of one
# episode each, every cell holding: what is judged is the candidate against the incumbent.
GATE = ["seeds=[0,1,2]", "episodes=1", "factors.friction=[]", "factors.mass=[]",
        "factors.obs_noise=[]", "min_drop=1000"]


@pytest.mark.slow  # two promotions: exports, and three small matrices
def test_promote_refuses_a_candidate_worse_than_the_policy_holding_the_alias(
        clear: Clear, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = clear.point_run("lr2.224e-4-s0"), clear.point_run("lr2.224e-5-s0")
    experiments = [e.experiment_id for e in clear.client.search_experiments()]
    runs = len(clear.client.search_runs(experiments, ""))
    # No version holds the alias yet: one line, before any export or matrix.
    assert main(["promote", "--run", good, "--alias", "stable", "--not-worse-than", "stable",
                 *GATE]) == 2
    assert capsys.readouterr().err == (
        "workbench: error: --not-worse-than stable: no version of model inverted_pendulum-ppo "
        "holds alias stable; promote one there first (workbench promote --run RUN_ID --alias "
        "stable), or name another model with --name\n")
    assert len(clear.client.search_runs(experiments, "")) == runs
    assert main(["promote", "--run", good, "--alias", "stable", *GATE]) == 0
    capsys.readouterr()
    # The lr/10 policy returns a third of the incumbent's: refused, nothing registered.
    assert main(["promote", "--run", bad, "--alias", "stable", "--not-worse-than", "stable",
                 "--margin", "5%", *GATE]) == 1
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("workbench: promote")]
    assert line.startswith(
        "workbench: promote refused: worse than inverted_pendulum-ppo@stable (version 1) under "
        "profile gate (A: the incumbent, B: this run) in 2 of 2 cells: nominal: B is worse than "
        "A by more than 5 % (97.5 % interval of B - A: "), line
    assert "action_delay=1: B is worse than A by more than 5 %" in line
    assert line.endswith("3 vs 3 seeds); nothing registered")
    assert f"--not-worse-than stable: evaluating inverted_pendulum-ppo@stable (version 1), run " \
           f"{good}" in out  # the incumbent, evaluated now under the same profile
    versions = clear.client.search_model_versions("name = 'inverted_pendulum-ppo'")
    assert [str(v.version) for v in versions] == ["1"]
    # Another seed of the incumbent's configuration is not shown worse: registered, and the
    # version says how each cell went.
    other = clear.point_run("lr2.224e-4-s1")
    assert main(["promote", "--run", other, "--alias", "stable", "--not-worse-than", "stable",
                 *GATE]) == 0
    out = capsys.readouterr().out
    version = clear.client.get_model_version_by_alias("inverted_pendulum-ppo", "stable")
    assert str(version.version) == "2" and version.run_id == other
    said = version.tags["gate.not_worse_than"]
    assert said.startswith("not worse than inverted_pendulum-ppo@stable (version 1) in ")
    assert said.endswith("(margin 5 %)") and f"  {said}\n" in out


@pytest.mark.unit
def test_a_candidate_not_shown_worse_is_registered_with_what_the_cells_said() -> None:
    """The judge of the cells and the version's tag, on two matrices' per-seed returns: a cell
    shown not worse, one left undecided; the level is 2.5 % shared among the cells."""
    from workbench.deploy import promotion, robustness
    from workbench.review.noninferiority import judge_return

    def matrix(nominal: list[float], delayed: list[float]) -> robustness.Matrix:
        cells = [robustness.Cell(), robustness.Cell((("action_delay", 1.0),))]
        results = [robustness.CellResult(cell, values, values, 100.0, 0.1)
                   for cell, values in zip(cells, (nominal, delayed), strict=True)]
        return robustness.Matrix("gate", None, "run", "Hopper-v5", {}, results)  # type: ignore[arg-type]

    incumbent = matrix([1000, 1002, 998], [900, 700, 1100])
    candidate = matrix([1001, 1003, 999], [905, 702, 1098])
    levels: list[float] = []

    def judge(a: list[float], b: list[float], margin: object, level: float) -> object:
        levels.append(level)
        return judge_return(a, b, margin, level)  # type: ignore[arg-type]

    rivals = promotion.judge_cells(incumbent, candidate, Margin(0.05, True), judge)
    assert levels == [0.0125, 0.0125]
    assert [(label, v.verdict) for label, v in rivals] == [("nominal", "not worse"),
                                                          ("action_delay=1", "undecided")]
    version = type("Version", (), {"version": "3", "tags": {}})()
    gate = promotion.Gate({"passed": True}, candidate, None, rivals=rivals,
                          incumbent=promotion.Incumbent("hopper-ppo", "on-robot", version),
                          margin=Margin(0.05, True))
    assert not gate.worse_cells
    assert gate.rivalry_text() == ("not worse than hopper-ppo@on-robot (version 3) in 1 of 2 "
                                   "cells, undecided in 1 (action_delay=1) (margin 5 %)")
    assert promotion.registered_checkpoint(type("V", (), {"tags": {
        "checkpoint": "checkpoints/step-000000004096"}})()) == "4096"

