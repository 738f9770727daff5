"""The exported policy on its way to a robot: ``workbench export --show-contract``, the
standalone runner (in an interpreter where only numpy and onnxruntime can be imported) and
``workbench deploy verify`` (the runner in its own process, MuJoCo in real time on the other
end of a local socket).

The policy is the session's shrunk mini duck (tests/trained_run.py), on a copy of its store:
the contracts tampered with here never reach the other modules' store.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import onnx
import psutil
import pytest
from mlflow.tracking import MlflowClient
from workbench.cli import main
from workbench.deploy import contract, runner, verification
from workbench.deploy.verification import RunnerCommand, RunnerFailed, RunnerProcess

from .conftest import embedded_copy, forget_artifact_locations
from .support.files import tree_state
from .trained_run import ExportedPolicy, FinishedRun

pytestmark = pytest.mark.slow  # the duck's training and export, then real-time episodes


@dataclass(frozen=True)
class Duck:
    run_id: str
    client: MlflowClient
    experiments: Path
    export: Path  # the run's export/ artifacts in the copied store (tests restore changes)


@pytest.fixture(scope="module")
def duck(exported_duck: ExportedPolicy, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Duck]:
    """A copy of the exported duck's store, in the environment while this module runs."""
    with embedded_copy(exported_duck.experiments, tmp_path_factory, "deploy") as (uri, target, _):
        client = MlflowClient(uri)
        artifacts = urlparse(client.get_run(exported_duck.run_id).info.artifact_uri).path
        yield Duck(exported_duck.run_id, client, target, Path(artifacts) / "export")
    forget_artifact_locations()


def rewrite_contract(source: Path, target: Path, change: Callable[[dict[str, Any]], None] | str
                     ) -> None:
    """``source``'s ONNX graph with its contract changed (a function of the parsed JSON, or
    raw text in its place) written to ``target``."""
    model = onnx.load(str(source))
    (prop,) = [p for p in model.metadata_props if p.key == runner.CONTRACT_KEY]
    if isinstance(change, str):
        prop.value = change
    else:
        data = json.loads(prop.value)
        change(data)
        prop.value = json.dumps(data)
    onnx.save(model, str(target))


@pytest.fixture()
def restored(duck: Duck) -> Iterator[Path]:
    """The duck's export folder; every file in it is put back as it was after the test."""
    saved = {p.name: p.read_bytes() for p in duck.export.iterdir()}
    yield duck.export
    for path in duck.export.iterdir():
        if path.name not in saved:
            path.unlink()
    for name, data in saved.items():
        (duck.export / name).write_bytes(data)


def runner_children() -> list[psutil.Process]:
    """This process's children still running runner.py."""
    return [p for p in psutil.Process().children(recursive=True)
            if any(part.endswith("runner.py") for part in p.cmdline())]


# --------------------------------------------------------------------------- verification


def test_verification_passes_three_stages_and_prints_the_latency_table(
        duck: Duck, capsys: pytest.CaptureFixture[str]) -> None:
    before = tree_state(duck.experiments)
    assert main(["deploy", "verify", "--run", duck.run_id, "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    print(out)  # the measured figures (pytest -s shows them)
    lines = out.splitlines()
    for stage in ("static", "single step", "continuous"):
        (line,) = [line for line in lines if line.startswith(f"{stage:<14}PASS  ")]
    assert "64 logged observations (samples.npz) in: max |action - logged action|" in out
    assert "ms within the 20 ms period" in out and "(same behaviour)" in out
    assert "vs the run's final evaluation" in out and "(consistent)" in out
    table = lines.index("runner latency (ms) after 20 warm-up calls, 1 ONNX Runtime thread; "
                        "period 20 ms (50 Hz)")
    assert lines[table + 1].split() == ["stage", "steps", "first", "p50", "p99", "max", "cycle",
                                        "max", "overruns"]
    rows = [lines[table + 2 + k].rsplit(maxsplit=7) for k in range(3)]
    assert [row[0] for row in rows] == ["static", "single step", "continuous"]
    assert [int(row[1]) for row in rows[:2]] == [64, 1] and int(rows[2][1]) > 0
    assert [row[-1] for row in rows] == ["unpaced", "0", rows[2][-1]]
    for row in rows:
        first, p50, p99, top, cycle = map(float, row[2:7])
        assert 0 < p50 <= p99 <= top <= cycle + 1e-9 and first > 0
    assert "verification PASS: 3 of 3 stages pass" in out
    assert tree_state(duck.experiments) == before  # a verification writes nothing
    assert runner_children() == []


def test_show_contract_prints_the_exported_contract_and_exports_nothing(
        duck: Duck, capsys: pytest.CaptureFixture[str]) -> None:
    before = tree_state(duck.experiments)
    assert main(["export", "--run", duck.run_id, "--show-contract"]) == 0
    out = capsys.readouterr().out
    assert out == runner.contract_table(runner.read_contract(duck.export / "policy.onnx")) + "\n"
    assert "50 Hz (period 20 ms), frame skip 5 x 4 ms" in out
    assert "  0         qpos.left_hip_roll                      rad" in out
    assert "  7         right_ankle                   rad            0.8         0  [-1, 1]" in out
    assert tree_state(duck.experiments) == before


def swap_actions(c: dict[str, Any]) -> None:
    first, second = c["action"]["entries"][:2]
    first["name"], second["name"] = second["name"], first["name"]


def shift_mean(c: dict[str, Any]) -> None:
    norm = c["normalization"]
    norm["mean"][5] += 0.5
    norm["sha256"] = runner.normalization_sha256(norm)


def drop_last_observation(c: dict[str, Any]) -> None:
    c["observation"]["size"] -= 1
    c["observation"]["entries"].pop()
    norm = c["normalization"]
    norm["mean"].pop()
    norm["var"].pop()
    norm["sha256"] = runner.normalization_sha256(norm)


def narrow_clip(c: dict[str, Any]) -> None:
    for entry in c["action"]["entries"]:
        entry.update(low=-0.001, high=0.001)


@pytest.mark.parametrize(("change", "code", "message"), [
    (swap_actions, 1, "verification failed: contract field action.entries[0].name: the "
     "contract says \"left_hip_pitch\", the run and its env say \"left_hip_roll\""),
    (shift_mean, 1, "verification failed: contract field normalization.mean[5]: the contract "
     "says"),
    (lambda c: c["robot"].update(sha256="f" * 64), 1, "verification failed: contract field "
     "robot.sha256: the contract says \"ffffffff"),
    (narrow_clip, 1, "verification failed: contract field action.entries[0].low: the contract "
     "says -0.001, the run and its env say -1.0"),
    (drop_last_observation, 2, "error: run {run} export/policy.onnx: contract: "
     "observation.size: the contract declares 30, the graph has 31"),
    (lambda c: c.update(format="workbench-policy-contract/2"), 2, "error: run {run} export/"
     "policy.onnx: contract: format: workbench-policy-contract/2 is newer than this reader's "
     "workbench-policy-contract/1"),
    ('{"format": "workbench-policy-contract/1", ', 2, "error: run {run} export/policy.onnx: "
     "contract: metadata workbench.contract is not valid JSON"),
])
def test_a_broken_contract_fails_in_one_line_naming_the_field(
        duck: Duck, restored: Path, change: Any, code: int, message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_contract(restored / "policy.onnx", restored / "policy.onnx", change)
    assert main(["deploy", "verify", "--run", duck.run_id]) == code
    captured = capsys.readouterr()
    assert captured.out == ""  # no stage ran
    assert captured.err.startswith("workbench: " + message.format(run=duck.run_id)), captured.err
    assert captured.err.count("\n") == 1
    assert runner_children() == []


def test_an_edited_runner_in_the_store_is_never_run(
        duck: Duck, restored: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    mark = tmp_path / "EXECUTED"
    (restored / "runner.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    assert main(["deploy", "verify", "--run", duck.run_id]) == 1
    assert capsys.readouterr().err.startswith("workbench: verification failed: runner.py: the "
                                              "run's export/runner.py differs from this "
                                              "workbench's runner")
    assert not mark.exists()


def test_verifying_without_an_export_is_bad_input(
        duck: Duck, restored: Path, finished_run: FinishedRun,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (restored / "runner.py").unlink()  # an export written before contracts and runners
    assert main(["deploy", "verify", "--run", duck.run_id]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: run {duck.run_id}: its export has no runner.py (exported before "
        f"contracts and runners); export it again: workbench export --run {duck.run_id}\n")
    assert main(["deploy", "verify", "--run", duck.run_id, "--episodes", "0"]) == 2
    assert "--episodes 0: must be 1 to 100" in capsys.readouterr().err
    finished_run.use(monkeypatch)
    before = tree_state(finished_run.experiments)
    for argv in (["deploy", "verify", "--run", finished_run.run_id],
                 ["export", "--run", finished_run.run_id, "--show-contract"]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"workbench: error: run {finished_run.run_id}: has no exported model "
            f"(export/policy.onnx); export it first: workbench export --run "
            f"{finished_run.run_id}\n")
    assert tree_state(finished_run.experiments) == before


# --------------------------------------------------------------------------- the runner


@pytest.fixture()
def robot(duck: Duck, tmp_path: Path) -> Path:
    """A folder as it reaches a robot: runner.py and policy.onnx, nothing else."""
    folder = tmp_path / "robot"
    folder.mkdir()
    for name in ("runner.py", "policy.onnx"):
        shutil.copyfile(duck.export / name, folder / name)
    return folder


@pytest.fixture()
def bare_python(robot: Path) -> RunnerCommand:
    """This interpreter without site-packages (``-S``), and a folder that holds only numpy
    and onnxruntime on its path: torch, MuJoCo, gymnasium and the workbench are not there."""
    site = Path(np.__file__).parents[1]
    only = robot.parent / "only-numpy-and-onnxruntime"
    only.mkdir()
    for name in ("numpy", "numpy.libs", "onnxruntime", "onnxruntime.libs"):
        if (site / name).exists():
            (only / name).symlink_to(site / name)
    return RunnerCommand(robot / "runner.py", (sys.executable, "-S"),
                         {"PYTHONPATH": str(only)})


def test_the_runner_needs_only_numpy_and_onnxruntime(
        duck: Duck, robot: Path, bare_python: RunnerCommand) -> None:
    probe = ("import importlib.util as u; print([m for m in ('numpy', 'onnxruntime', 'torch', "
             "'mujoco', 'gymnasium', 'stable_baselines3', 'mlflow', 'onnx', 'workbench') "
             "if u.find_spec(m)])")
    found = subprocess.run([*bare_python.python, "-c", probe], env=dict(bare_python.env or {}),
                           capture_output=True, text=True, check=True, cwd=robot)
    assert found.stdout.strip() == "['numpy', 'onnxruntime']"
    with np.load(duck.export / "samples.npz") as samples:
        stage = verification.static_stage(bare_python, robot / "policy.onnx",
                                          samples["observations"], samples["actions"])
    assert stage.passed, stage.line
    assert stage.timing is not None and stage.timing["steps"] == 64
    shown = subprocess.run([*bare_python.python, str(robot / "runner.py"),
                            str(robot / "policy.onnx"), "--show-contract"],
                           env=dict(bare_python.env or {}), capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("Contract workbench-policy-contract/1: Workbench/MiniDuck-v0")


def test_the_runner_records_its_steps_and_refuses_bad_observations(
        robot: Path, tmp_path: Path) -> None:
    record = tmp_path / "steps.json"
    command = RunnerCommand(robot / "runner.py", flags=("--record", str(record)))
    policy = robot / "policy.onnx"
    with RunnerProcess(command, policy, paced=True) as process:
        assert process.hello["period_s"] == 0.02 and process.hello["observation_size"] == 31
        for _ in range(3):
            action = process.act(np.zeros(31))
        assert action.shape == (8,)
        summary = process.stop()
    steps = json.loads(record.read_text())
    assert summary["steps"] == 3 and len(steps["steps_ms"]) == 3
    assert steps["latency_ms"] == summary["latency_ms"]
    record.unlink()
    for obs, said in [
        (np.r_[np.zeros(2), np.nan, np.zeros(28)],
         "runner: observation[2] (qpos.left_knee): nan is not a finite number"),
        (np.zeros(30), "runner: observation: 30 values, the contract declares 31"),
        (np.r_[np.zeros(30), 3.0], "runner: observation[30] (previous_action.right_ankle): 3 "
         "is outside its declared range [-1, 1]"),
    ]:
        with RunnerProcess(command, policy, paced=True) as process:
            with pytest.raises(RunnerFailed) as failed:
                process.act(obs)
            assert str(failed.value).startswith(said), failed.value
            assert process.process is not None and process.process.wait(5) == 2
        assert not record.exists()  # bad input: nothing written


def test_an_action_outside_the_declared_clip_stops_the_runner(robot: Path) -> None:
    rewrite_contract(robot / "policy.onnx", robot / "policy.onnx", narrow_clip)
    with RunnerProcess(RunnerCommand(robot / "runner.py"), robot / "policy.onnx",
                       paced=False) as process:
        with pytest.raises(RunnerFailed, match=r"^runner: action\[\d\] \(\w+\): \S+ is outside "
                           r"the declared clip \[-0.001, 0.001\]: the graph and its contract "
                           "disagree"):
            process.act(np.zeros(31))
        assert process.process is not None and process.process.wait(5) == 1


def test_the_runner_process_is_stopped_on_ctrl_c_and_on_failures(robot: Path) -> None:
    command = RunnerCommand(robot / "runner.py")
    for raised in (KeyboardInterrupt, RuntimeError):
        with pytest.raises(raised), RunnerProcess(command, robot / "policy.onnx",
                                                  paced=True) as process:
            process.act(np.zeros(31))
            assert process.process is not None
            pid = process.process.pid
            assert psutil.pid_exists(pid)
            raise raised()
        assert process.process.poll() is not None
    assert runner_children() == []


@pytest.mark.parametrize(("contract_text", "said"), [
    (lambda c: c.update(format="workbench-policy-contract/7"),
     "runner: error: format: workbench-policy-contract/7 is newer than this reader's"),
    ("[", "runner: error: metadata workbench.contract is not valid JSON"),
    (None, "runner: error: --connect 'nowhere': give HOST:PORT"),
])
def test_the_runner_refuses_bad_input_in_one_line(
        robot: Path, contract_text: Any, said: str) -> None:
    if contract_text is not None:
        rewrite_contract(robot / "policy.onnx", robot / "policy.onnx", contract_text)
    flags = ["--show-contract"] if contract_text is not None else ["--connect", "nowhere"]
    proc = subprocess.run([sys.executable, "-I", str(robot / "runner.py"),
                           str(robot / "policy.onnx"), *flags], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(said) and proc.stderr.count("\n") == 1, proc.stderr
    assert {p.name for p in robot.iterdir()} == {"runner.py", "policy.onnx"}


def test_the_contract_travels_as_the_runner_reads_it(duck: Duck) -> None:
    """The workbench's reader is the runner's: the same checked contract either way."""
    checked = contract.read_contract(duck.export / "policy.onnx", "duck")
    assert checked.raw == json.loads((duck.export / "export_report.json").read_text())["contract"]
    assert checked.raw["source"]["run_id"] == duck.run_id
    assert checked.observation_names[-1] == "previous_action.right_ankle"


# --------------------------------------------------------------------------- the promotion gate


def test_promote_refuses_a_policy_of_a_robot_changed_since_training(
        duck: Duck, restored: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = restored.parent / "manifest.json"
    saved = manifest.read_bytes()
    recorded = json.loads(saved)
    recorded["inputs"]["robot"]["sha256"] = "a" * 64  # what the run trained on, per its record
    manifest.write_text(json.dumps(recorded))
    try:
        code = main(["promote", "--run", duck.run_id, "--alias", "on-robot", "--profile", "duck",
                     "seeds=[0]", "episodes=1"])
    finally:
        manifest.write_bytes(saved)
    out = capsys.readouterr().out
    assert code == 1
    (line,) = [line for line in out.splitlines() if line.startswith("workbench: promote")]
    assert line.startswith("workbench: promote refused: contract field robot.sha256: the env "
                           "loads ") and "the run trained on aaaaaaaaaaaaaaaa (its manifest)" \
        in line and line.endswith("; nothing registered")
    assert duck.client.search_registered_models() == []
    experiments = [e.experiment_id for e in duck.client.search_experiments()]
    assert duck.client.search_runs(experiments, "tags.`workbench.kind` = 'eval'") == []


def test_the_latency_gate_holds_the_measured_maximum_against_the_period(duck: Duck) -> None:
    report = json.loads((duck.export / "export_report.json").read_text())
    latency, found = report["latency"], report["contract"]
    worst = latency["backends"]["onnxruntime"]["end_to_end_ms"]["max"]
    assert verification.latency_problem(latency, found) is None  # 20 ms is far above it
    tags = verification.deployment_tags(latency, found)
    assert tags["latency.period_ms"] == "20" and tags["contract.control_hz"] == "50"
    assert float(tags["latency.onnxruntime_max_ms"]) == pytest.approx(worst, rel=1e-3)
    assert tags["contract.robot_sha256"] == found["robot"]["sha256"]
    faster = json.loads(json.dumps(found))  # a loop whose period is half the measured maximum
    faster["control"].update(period_s=worst / 2e3, rate_hz=2e3 / worst)
    problem = verification.latency_problem(latency, faster)
    assert problem is not None and problem.startswith(
        f"latency: ONNX Runtime's maximum {worst:.3f} ms (over 1000 calls after 20 warm-up "
        f"calls) exceeds the {worst / 2:g} ms control period")
