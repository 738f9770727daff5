"""``workbench eval`` and ``workbench promote``: robustness profiles, the matrix, its verdicts,
the nested MLflow runs, and the registry alias behind the gate.

The policy is the session's exported tiny HalfCheetah run (tests/trained_run.py), evaluated on
a copy of its store: the matrices, exports and registrations written here never reach the
other modules' store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench.cli import main
from workbench.config import ConfigError, load_config
from workbench.config.robustness import RobustnessProfile, load_profile

from .conftest import embedded_copy
from .trained_run import ExportedPolicy

# Episodes of 100 steps (the tiny run's own are 8): returns large enough to compare.
EPISODES = ["max_episode_steps=100", "episodes=1"]
# A small matrix: two seeds x one episode per cell, a pair as a heatmap, EnvPool beside
# gymnasium (sim-to-sim): nominal, 2 + 2 + 1 + 1 values alone, the pair's 2 x 2, EnvPool: 12.
SMALL = ["seeds=[0,1]", *EPISODES, "factors={friction:[0.5,1.5],mass:[0.8,1.2],"
         "action_delay:[1],obs_noise:[0.05],actuator_gain:[]}", "pairs=[[friction,mass]]",
         "backends=[gymnasium,envpool]"]


@dataclass(frozen=True)
class Store:
    run_id: str
    client: MlflowClient
    experiments: Path


@pytest.fixture(scope="module")
def store_copy(exported_policy: ExportedPolicy, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Store]:
    """A copy of the exported run's store, in the environment while this module runs."""
    with embedded_copy(exported_policy.experiments, tmp_path_factory, "eval") as (uri, target, _):
        yield Store(exported_policy.run_id, MlflowClient(uri), target)


# --------------------------------------------------------------------------- profiles


@pytest.mark.unit
def test_every_shipped_profile_loads() -> None:
    for name in ("default", "gate", "duck"):
        profile = load_profile(name)
        assert isinstance(profile, RobustnessProfile) and (profile.factors or profile.backends)
    assert load_profile("gate", ["seeds=[4]", "factors.mass=[]"]).factors.keys() == {
        "friction", "obs_noise", "action_delay"}


@pytest.mark.unit
@pytest.mark.parametrize(("overrides", "message"), [
    (["factors.gravity=[1.1]"], "factors.gravity: unknown perturbation factor; the factors are "
                                "friction, mass"),
    (["factors.friction=[0,1.2]"], "factors.friction=[0, 1.2]: 0 is out of range; its values "
                                   "are numbers > 0"),
    (["factors.action_delay=[1.5]"], "1.5 is out of range; its values are whole numbers >= 0"),
    (["factors.friction=[1e308]"], "factors.friction=[1e+308]: 1e+308 is out of range; its "
                                   "values are numbers > 0 and <= 10 (scale of every geom's "
                                   "sliding friction)"),
    (["factors.action_delay=[100]"], "100 is out of range; its values are whole numbers >= 0 "
                                     "and <= 50"),
    (["min_return=.inf"], "min_return=inf: a return in the task's units"),
    (["locked_aliases=[latest!]"], "locked_aliases: 'latest!' is not a registry alias"),
    (["factors.mass=[a]"], "factors.mass=['a']: 'a' is not a number"),
    (["pairs=[[friction,damping]]"], "pairs: 'damping' has no values under factors"),
    (["backends=[mujoco_warp]"], "backends: 'mujoco_warp' is not a simulator backend"),
    (["tolerance=1.5"], "tolerance=1.5: a fraction of the nominal return, between 0 and 1"),
    (["seeds=[1,1]"], "seeds=[1, 1]: give at least one seed, none twice"),
    (["sedes=[1]"], "profile gate: sedes: Key 'sedes' not in 'RobustnessProfile'"),
])
def test_bad_profiles_are_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_profile("gate", overrides)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.unit
def test_an_unknown_profile_names_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match=r"--profile nope: no conf/eval/nope.yaml; choose "
                                          r"one of default, duck, gate"):
        load_profile("nope")


def test_what_a_task_cannot_apply_is_refused_before_anything_runs() -> None:
    from workbench.deploy.robustness import check_applicable

    pendulum = load_config(["env=pendulum"])
    with pytest.raises(ConfigError, match=r"factors.friction: a physics factor needs a MuJoCo"):
        check_applicable(load_profile("gate", ["factors.mass=[0.9]"]), pendulum)
    hopper = load_config(["env=hopper"])
    with pytest.raises(ConfigError, match=r"factors.friction: cannot be applied on EnvPool"):
        check_applicable(load_profile("gate", ["backend=envpool"]), hopper)
    duck = load_config(["env=duck"])
    with pytest.raises(ConfigError, match=r"backends: envpool cannot run this policy's task"):
        check_applicable(load_profile("duck", ["backends=[gymnasium,envpool]"]), duck)
    check_applicable(load_profile("duck"), duck)  # the duck takes frame_skip: 50 Hz at 5


# --------------------------------------------------------------------------- verdicts


@pytest.mark.unit
def test_verdicts_say_how_far_a_factor_holds_and_where_it_fails() -> None:
    from workbench.deploy import robustness as r

    profile = RobustnessProfile(factors={"friction": [0.5, 0.7, 1.3, 1.5],
                                         "action_delay": [1.0, 2.0, 3.0]}, tolerance=0.2)
    nominal = {name: f.nominal for name, f in r.FACTORS.items()}
    returns = {(): 100.0, (("friction", 0.5),): 50.0, (("friction", 0.7),): 85.0,
               (("friction", 1.3),): 90.0, (("friction", 1.5),): 81.0,
               (("action_delay", 1.0),): 95.0, (("action_delay", 2.0),): 60.0,
               (("action_delay", 3.0),): 10.0}
    results = [r.CellResult(r.Cell(settings), [v], [v], 10.0, 0.0)
               for settings, v in returns.items()]
    r.mark_holding(results, profile)
    matrix = r.Matrix("test", profile, "run x", "Hopper-v5", nominal, results)
    assert matrix.verdicts() == [
        "friction holds from 0.7x to 1.5x (-30 % to +50 %); fails at 0.5x",
        "action_delay holds to 1 step; fails from 2 steps",
    ]
    assert not matrix.passed and [c.cell.label for c in matrix.failing] == [
        "friction=0.5", "action_delay=2", "action_delay=3"]


@pytest.mark.unit
def test_a_relative_gate_alone_passes_a_falling_pendulum_and_a_floor_does_not() -> None:
    from workbench.deploy import robustness as r
    from workbench.envs.returns import task_reference

    # 1000-step episodes in which the pole falls after ~95 steps, at nominal and perturbed.
    def results() -> list:
        return [r.CellResult(r.Cell(settings), [v], [v], v, 0.0)
                for settings, v in (((), 95.0), ((("friction", 0.8),), 93.0))]

    nominal = {name: f.nominal for name, f in r.FACTORS.items()}
    relative = RobustnessProfile(factors={"friction": [0.8]}, tolerance=0.25)
    held = results()
    r.mark_holding(held, relative)
    assert all(c.holds for c in held)  # relative to its own 95, the policy "holds"
    floored = RobustnessProfile(factors={"friction": [0.8]}, tolerance=0.25, min_return=900)
    failed = results()
    r.mark_holding(failed, floored)
    matrix = r.Matrix("gate", floored, "run x", "InvertedPendulum-v5", nominal, failed,
                      reference=task_reference("inverted_pendulum", "InvertedPendulum-v5", 1000))
    assert not matrix.passed and matrix.threshold == 900 and not matrix.nominal.holds
    assert matrix.nominal_text() == "95.0 of 1,000 (the maximum: at most 1 per step x 1000 steps)"
    assert r.matrix_record(matrix)["reference"] == {
        "return": 1000.0, "source": "the maximum: at most 1 per step x 1000 steps"}


def test_a_factor_that_cannot_change_the_task_says_no_effect() -> None:
    from workbench.deploy import robustness as r

    profile = load_profile("default")  # friction, mass, actuator gain, noise, delay
    pendulum = load_config(["env=inverted_pendulum"])
    no_contact = "no two of its geoms can touch, and friction acts only in contacts"
    assert r.inert_factors(pendulum, profile) == {"friction": no_contact}
    assert r.inert_factors(load_config(["env=halfcheetah"]), profile) == {}
    nominal = r.nominal_values(pendulum)
    results = [r.CellResult(r.Cell(settings), [v], [v], v, 0.0)
               for settings, v in (((), 1000.0), ((("friction", 0.5),), 1000.0),
                                   ((("friction", 1.5),), 1000.0))]
    matrix = r.Matrix("x", RobustnessProfile(factors={"friction": [0.5, 1.5]}), "run x",
                      "InvertedPendulum-v5", nominal, results,
                      inert=r.inert_factors(pendulum, profile))
    assert matrix.verdicts() == [f"friction: no effect on this task ({no_contact})"]


# --------------------------------------------------------------------------- the command


def test_eval_bad_input_is_one_line_and_creates_no_run(
        store_copy: Store, capsys: pytest.CaptureFixture[str]) -> None:
    runs_before = len(store_copy.client.search_runs(
        [e.experiment_id for e in store_copy.client.search_experiments()]))
    for args, message in [
        (["--run", store_copy.run_id, "factors.gravity=[2]"], "unknown perturbation factor"),
        (["--run", store_copy.run_id, "--policy", "x.onnx"], "name one policy"),
        (["--policy", "policy.onnx"], "not an exported policy.onnx or policy.pt file"),
        (["--run", store_copy.run_id, "--checkpoint", "newest"], "not best, last or a step"),
        (["--run", store_copy.run_id, "backend=envpool", "factors={mass:[0.9]}"],
         ": cannot be applied on EnvPool (its C++ tasks take no gymnasium wrappers)"),
    ]:
        assert main(["eval", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert len(store_copy.client.search_runs(
        [e.experiment_id for e in store_copy.client.search_experiments()])) == runs_before


def test_eval_logs_a_matrix_with_nested_runs_heatmaps_and_verdicts(
        store_copy: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["eval", "--run", store_copy.run_id, "--profile", "default", "--out", str(out),
                 *SMALL]) == 0
    printed = capsys.readouterr().out
    eval_id = printed.split("MLflow run: ")[1].split()[0]
    assert printed.endswith(f"/robustness\nMLflow run: {eval_id}\ncopy: {out}\n")
    assert "[1/12] nominal:" in printed and "[12/12] nominal@envpool:" in printed
    assert "sim-to-sim: envpool" in printed and "same behaviour" in printed
    record = json.loads((out / "robustness.json").read_text())
    assert len(record["cells"]) == 12 and record["policy"] == f"run {store_copy.run_id}"
    assert record["export_check"]["action_mean_max_gap"] <= 1e-4
    assert (out / "heatmap_friction_mass.png").stat().st_size > 0
    assert (out / "factors.png").stat().st_size > 0

    client = store_copy.client
    parent = client.get_run(printed.split("MLflow run: ")[1].split()[0])
    assert parent.data.tags["workbench.kind"] == "eval" and parent.info.status == "FINISHED"
    assert f"\nfiles: {parent.info.artifact_uri}/robustness\n" in printed  # not a temp folder
    assert parent.data.tags["robustness.overrides"] == " ".join(SMALL)
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.info.run_name for c in children) == sorted(c["cell"] for c in
                                                                record["cells"])
    assert all(c.info.status == "FINISHED" and "robustness/mean_return" in c.data.metrics
               for c in children)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "robustness")}
    assert {"robustness/robustness.md", "robustness/heatmap_friction_mass.png"} <= artifacts
    source = client.get_run(store_copy.run_id).data.tags
    assert source["robustness.default.eval_run"] == parent.info.run_id
    assert source["robustness.default.verdicts"].splitlines()[0].startswith("friction ")
    # The model card of the run's Hub bundle carries the verdicts.
    from workbench.deploy import hub

    hub.write_bundle(client, store_copy.run_id, tmp_path / "bundle")
    card = (tmp_path / "bundle" / "README.md").read_text()
    assert "## Robustness" in card and f"\n- {record['verdicts'][0]}\n" in card


def test_eval_of_an_exported_onnx_file(store_copy: Store, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    run = store_copy.client.get_run(store_copy.run_id)
    onnx = Path(run.info.artifact_uri.removeprefix("file://")) / "export" / "policy.onnx"
    assert main(["eval", "--policy", str(onnx), "--env", "halfcheetah", "--profile", "gate",
                 "seeds=[0]", *EPISODES, "factors={obs_noise:[0.1]}"]) == 0
    printed = capsys.readouterr().out
    assert f"file {onnx}" in printed and "\n  obs_noise holds" in printed


# --------------------------------------------------------------------------- promote


def registered(client: MlflowClient, name: str) -> list:
    return client.search_model_versions(f"name = '{name}'")


def test_promote_refuses_a_failing_gate_and_registers_a_holding_one(
        store_copy: Store, capsys: pytest.CaptureFixture[str]) -> None:
    client, run_id = store_copy.client, store_copy.run_id
    # The gate profile with only its action delay of 1 step: 2 cells.
    gate = ["seeds=[0]", *EPISODES, "factors.friction=[]", "factors.mass=[]",
            "factors.obs_noise=[]"]
    # The gate of the alias a robot runs cannot be weakened on the command line.
    runs_before = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    assert main(["promote", "--run", run_id, "--alias", "on-robot", *gate, "tolerance=0.99",
                 "min_drop=1000"]) == 2
    assert capsys.readouterr().err == (
        "workbench: error: --alias on-robot: profile gate locks it (locked_aliases in "
        "conf/eval/gate.yaml): its gate runs as written, without seeds=[0] "
        "max_episode_steps=100 episodes=1 factors.friction=[] factors.mass=[] "
        "factors.obs_noise=[] tolerance=0.99 min_drop=1000; drop the overrides, or promote to "
        "another alias (e.g. --alias candidate)\n")
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == \
        runs_before  # refused before the export and the matrix
    # Every cell must hold: with a tolerance of 0 nothing below nominal does, and an absolute
    # floor above what the policy returns fails the nominal cell too.
    failing = [*gate, "factors.mass=[0.5,2.0]", "factors.action_delay=[1,3]",
               "tolerance=0.0001", "min_return=10000"]
    assert main(["promote", "--run", run_id, "--alias", "trial", *failing]) == 1
    printed = capsys.readouterr().out
    assert re.search(r"workbench: promote refused: the nominal return -?[\d,.]+ of 5,819 "
                     r"\(rl-baselines3-zoo's published PPO return at 1M steps \(benchmark.md\)\) "
                     r"is below the profile's floor min_return=10000; 5 cell\(s\) of profile "
                     r"gate fail: nominal \(-?[\d,.]+ < 10,000.0\), ", printed), printed
    assert "nothing registered" in printed
    assert not client.search_registered_models()

    assert main(["promote", "--run", run_id, "--alias", "candidate", "min_drop=10",
                 *gate]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"registered halfcheetah-ppo version 1 as halfcheetah-ppo@candidate "
                     r"\(profile gate with min_drop=10 seeds=\[0\] max_episode_steps=100 "
                     r"episodes=1 factors.friction=\[\] factors.mass=\[\] "
                     r"factors.obs_noise=\[\]: 2 cells hold at >= -?[\d,.]+; nominal return "
                     r"-?[\d,.]+ of 5,819 \(rl-baselines3-zoo's published PPO return", printed)
    assert "gate gate" not in printed and "workbench-promote-" not in printed
    version = client.get_model_version_by_alias("halfcheetah-ppo", "candidate")
    eval_run = client.get_run(version.tags["gate.eval_run"])
    assert f"files: {eval_run.info.artifact_uri}/robustness\n" in printed
    assert version.run_id == run_id and version.tags["gate.passed"] == "true"
    assert float(version.tags["parity.onnx_max_abs_diff"]) <= 1e-5
    assert version.tags["gate.profile"] == "gate" and version.tags["gate.cells"] == "2"
    # The gate as it was run: its overrides, cells, seeds, tolerance, floor and reference.
    assert version.tags["gate.overrides"] == " ".join(["min_drop=10", *gate])
    assert version.tags["gate.cell_labels"] == "nominal, action_delay=1"
    assert (version.tags["gate.seeds"], version.tags["gate.episodes"]) == ("[0]", "1")
    assert (version.tags["gate.tolerance"], version.tags["gate.min_drop"],
            version.tags["gate.min_return"]) == ("0.25", "10", "none")
    assert version.tags["gate.reference_return"] == "5819"
    assert eval_run.data.tags["robustness.overrides"] == version.tags["gate.overrides"]
    # the contract and the measured latency against the control period (20 Hz)
    assert version.tags["contract.format"] == "workbench-policy-contract/1"
    assert (version.tags["contract.control_hz"], version.tags["latency.period_ms"]) == ("20", "50")
    assert 0 < float(version.tags["latency.onnxruntime_max_ms"]) <= 50
    assert client.get_run(version.tags["gate.eval_run"]).data.tags["workbench.kind"] == "eval"
    # `hub push --model NAME@ALIAS` pushes the version the alias names and records the commit.
    from workbench.deploy import hub

    aliased = hub.model_version("halfcheetah-ppo@candidate")
    assert aliased.version == version.version
    hub.record_push_on_version(aliased, hub.PushResult("org/tiny", "a" * 40, "url", []))
    tags = client.get_model_version("halfcheetah-ppo", version.version).tags
    assert (tags["hub.repo_id"], tags["hub.revision"]) == ("org/tiny", "a" * 40)
    with pytest.raises(ConfigError, match="no such registered model alias"):
        hub.model_version("halfcheetah-ppo@on-robot")


def test_promote_bad_alias_is_one_line(store_copy: Store, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    assert main(["promote", "--run", store_copy.run_id, "--alias", "latest"]) == 2
    assert "MLflow reserves" in capsys.readouterr().err


@pytest.mark.unit
def test_the_report_shows_each_evaluated_runs_verdicts() -> None:
    from types import SimpleNamespace

    from workbench.review.render import Link, robustness_blocks

    tags = {"robustness.latest": "gate", "robustness.gate.passed": "false",
            "robustness.gate.verdicts": "friction holds to 1.2x\naction_delay holds only at "
                                        "nominal (0 steps); fails from 1 step"}
    runs = [SimpleNamespace(name="a", tags=tags), SimpleNamespace(name="b", tags={})]
    report = SimpleNamespace(runs=runs, run_url=lambda run: f"http://ui/{run.name}")
    heading, _, table = robustness_blocks(report)  # type: ignore[arg-type]
    assert heading.text == "Robustness" and [row[2] for row in table.rows] == [
        "friction holds to 1.2x", "action_delay holds only at nominal (0 steps); fails from "
        "1 step"]
    assert table.rows[0][0] == Link("a", "http://ui/a") and table.rows[0][3] == "some cells fail"
    assert robustness_blocks(SimpleNamespace(runs=runs[1:], run_url=str)) == []  # type: ignore[arg-type]
