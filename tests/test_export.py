"""Export: TorchScript + ONNX of a tiny real run (MuJoCo, SB3, VecNormalize on, MLflow store),
with the three verifications: parity, ONNX-only replay, latency (printed, never asserted)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gymnasium
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from mlflow.tracking import MlflowClient
from stable_baselines3 import PPO
from workbench import cli
from workbench.deploy import contract, export, graph, runner
from workbench.envs import video
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env
from workbench.training import load_config
from workbench.training.model import PolicySource

from .conftest import copy_store, embedded_store
from .trained_run import ExportedPolicy

EXPORT_FILES = {"policy.pt", "policy.onnx", "export_report.json", "samples.npz", "latency.npz",
                "replay.mp4", "replay.gif", "runner.py"}


@dataclass
class Exported:
    run_id: str
    client: MlflowClient
    folder: Path  # the run's export/ artifacts, downloaded
    report: dict
    stdout: str


@pytest.fixture(scope="module")
def exported(exported_policy: ExportedPolicy, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Exported]:
    """The session's exported tiny run (tests/trained_run.py), its store in the environment
    while this module runs, and its export/ artifacts downloaded."""
    with embedded_store(exported_policy.experiments):
        client = MlflowClient(exported_policy.uri)
        dst = tmp_path_factory.mktemp("download")
        folder = Path(client.download_artifacts(exported_policy.run_id, "export", str(dst)))
        report = json.loads((folder / "export_report.json").read_text())
        yield Exported(exported_policy.run_id, client, folder, report, exported_policy.stdout)


def load_policy(exported: Exported, tmp_path: Path) -> PolicySource:
    return export.load_run(exported.client, exported.run_id, tmp_path)


def test_export_logs_files_report_and_metrics(exported: Exported) -> None:
    names = {Path(a.path).name for a in exported.client.list_artifacts(exported.run_id, "export")}
    assert names == EXPORT_FILES
    report = exported.report
    assert report["run_id"] == exported.run_id
    assert report["env_id"] == "HalfCheetah-v5"
    assert (report["observation_dim"], report["action_dim"]) == (17, 6)
    assert report["graph"]["observation_normalization"] is True
    assert report["graph"]["clip_obs"] == 10.0
    parity = report["parity"]
    assert parity["observations"] == 64
    assert parity["passed"] is True and report["passed"] is True
    for key in ("torchscript_max_abs_diff", "onnx_max_abs_diff", "onnx_batch1_max_abs_diff"):
        assert 0.0 <= parity[key] <= 1e-5, key
    metrics = exported.client.get_run(exported.run_id).data.metrics
    assert metrics["export/parity_onnx_max_abs_diff"] == parity["onnx_max_abs_diff"]
    assert metrics["export/replay_mean_return"] == report["replay"]["mean_return"]
    # The run keeps its training status: exporting adds files, it does not re-open the run.
    assert exported.client.get_run(exported.run_id).info.status == "FINISHED"
    assert "PASS" in exported.stdout and "onnxruntime" in exported.stdout


def test_onnx_graph_passes_checker_with_dynamic_batch(exported: Exported) -> None:
    model = onnx.load(str(exported.folder / "policy.onnx"))
    onnx.checker.check_model(model, full_check=True)
    (graph_input,), (graph_output,) = model.graph.input, model.graph.output
    assert (graph_input.name, graph_output.name) == ("obs", "action")
    in_dims = graph_input.type.tensor_type.shape.dim
    assert in_dims[0].dim_param and not in_dims[0].dim_value  # symbolic batch axis
    assert in_dims[1].dim_value == 17
    assert exported.report["graph"]["onnx_opset"] == max(o.version for o in model.opset_import
                                                         if o.domain in ("", "ai.onnx"))
    session = graph.onnx_session(exported.folder / "policy.onnx")
    for batch in (1, 7):
        out = session.run(None, {"obs": np.zeros((batch, 17), np.float32)})[0]
        assert out.shape == (batch, 6)


def test_graph_holds_normalization_and_clipping(exported: Exported, tmp_path: Path) -> None:
    source = load_policy(exported, tmp_path)
    with np.load(exported.folder / "samples.npz") as samples:
        obs = samples["observations"]
    session = graph.onnx_session(exported.folder / "policy.onnx")
    onnx_out = session.run(None, {"obs": obs})[0]
    with_norm, _ = source.model.predict(source.vecnormalize.normalize_obs(obs), deterministic=True)
    without_norm, _ = source.model.predict(obs, deterministic=True)
    assert np.max(np.abs(onnx_out - with_norm)) <= 1e-5
    assert np.max(np.abs(onnx_out - without_norm)) > 1e-3  # raw obs really are normalized
    # Extreme sensor values: normalization clips at +-clip_obs, actions stay in the box.
    extreme = np.full((2, 17), 1e6, np.float32) * np.array([[1.0], [-1.0]], np.float32)
    onnx_extreme = session.run(None, {"obs": extreme})[0]
    sb3_extreme, _ = source.model.predict(source.vecnormalize.normalize_obs(extreme),
                                          deterministic=True)
    np.testing.assert_allclose(onnx_extreme, sb3_extreme, atol=1e-5)
    assert onnx_extreme.min() >= -1.0 and onnx_extreme.max() <= 1.0
    scripted = torch.jit.load(str(exported.folder / "policy.pt"))
    with torch.no_grad():
        np.testing.assert_allclose(scripted(torch.from_numpy(extreme)).numpy(), sb3_extreme,
                                   atol=1e-5)


def test_both_files_carry_the_contract_and_the_runner_lies_beside_them(
        exported: Exported, tmp_path: Path) -> None:
    in_onnx = {p.key: p.value for p in onnx.load(str(exported.folder / "policy.onnx"))
               .metadata_props}[runner.CONTRACT_KEY]
    extra = {contract.TORCHSCRIPT_FILE: ""}
    torch.jit.load(str(exported.folder / "policy.pt"), _extra_files=extra)
    assert json.loads(in_onnx) == json.loads(extra[contract.TORCHSCRIPT_FILE]) \
        == exported.report["contract"]
    checked = runner.read_contract(exported.folder / "policy.onnx")
    assert (checked.observation_size, checked.action_size, checked.period_s) == (17, 6, 0.05)
    raw = checked.raw
    assert raw["source"]["run_id"] == exported.run_id
    assert raw["source"]["checkpoint_step"] == exported.report["checkpoint"]["step"]
    rms = load_policy(exported, tmp_path).vecnormalize.obs_rms
    assert raw["normalization"]["mean"] == rms.mean.tolist()
    assert raw["normalization"]["var"] == rms.var.tolist()
    assert raw["versions"]["onnxruntime"] == onnxruntime.__version__
    assert (exported.folder / "runner.py").read_bytes() == contract.runner_source()
    assert "contract          workbench-policy-contract/1: 17 observation values" in \
        exported.stdout


def test_replay_is_driven_by_onnx_and_matches_sb3_episodes(
    exported: Exported, tmp_path: Path
) -> None:
    replayed = exported.report["replay"]
    seeds = replayed["seeds"]
    assert len(seeds) == replayed["episodes"] == 3
    assert replayed["lengths"] == [50, 50, 50]  # env.max_episode_steps=50, no termination
    # The same seeded episodes driven by SB3 itself give the same returns: the graph's
    # normalization, network and clipping are SB3's.
    source = load_policy(exported, tmp_path)
    env = make_env(EnvSpec.from_config(source.config))
    sb3_returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action = source.deterministic_actions(obs.astype(np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        sb3_returns.append(total)
    env.close()
    np.testing.assert_allclose(replayed["returns"], sb3_returns, atol=1e-4)
    logged = exported.client.get_run(exported.run_id).data.metrics
    assert replayed["logged_eval_mean"] == logged["summary/eval_mean_reward"]
    expected_delta = replayed["mean_return"] - replayed["logged_eval_mean"]
    assert replayed["delta"] == pytest.approx(expected_delta)
    assert replayed["consistent"] == (abs(replayed["delta"]) <= replayed["tolerance"])
    assert replayed["note"] is None  # no eval.randomization: same nominal task as the log


def test_replay_video_is_the_onnx_policy_with_the_return_it_got(
    exported: Exported, tmp_path: Path
) -> None:
    replayed = exported.report["replay"]
    shown = replayed["video"]
    # debug=tiny's video: 20 rendered steps at 96x64, the task's real time (HalfCheetah: 20 fps)
    assert (shown["file"], shown["preview"]) == ("replay.mp4", "replay.gif")
    assert (shown["seed"], shown["steps"], shown["frames"]) == (replayed["seeds"][0], 20, 20)
    assert (shown["size"], shown["fps"]) == ([96, 64], 20.0)
    meta = video.probe(exported.folder / "replay.mp4")
    assert (meta["codec"], meta["size"], meta["frames"]) == ("h264", (96, 64), 20)
    # The same 20 steps driven by SB3 itself return what the video's episode returned.
    source = load_policy(exported, tmp_path)
    env = make_env(EnvSpec.from_config(source.config))
    obs, _ = env.reset(seed=shown["seed"])
    total = 0.0
    for _ in range(20):
        obs, reward, *_ = env.step(source.deterministic_actions(obs.astype(np.float32)[None])[0])
        total += float(reward)
    env.close()
    assert shown["return"] == pytest.approx(total, abs=1e-4)
    metrics = exported.client.get_run(exported.run_id).data.metrics
    assert metrics["export/replay_video_return"] == pytest.approx(shown["return"])
    assert f"replay.mp4 (+ replay.gif): ONNX Runtime, episode seed {shown['seed']}, return " \
        f"{shown['return']:.2f} over 20 steps" in exported.stdout


def test_latency_is_reported_per_backend(exported: Exported) -> None:
    latency = exported.report["latency"]
    assert (latency["calls"], latency["warmup"], latency["threads"]) == (1000, 20, 1)
    assert set(latency["backends"]) == {"sb3_eager", "torchscript", "onnxruntime"}
    for stats in latency["backends"].values():
        assert stats["first_call_ms"] > 0
        for mode in ("inference_ms", "end_to_end_ms"):
            s = stats[mode]
            assert 0 < s["p50"] <= s["p99"] <= s["max"]
    with np.load(exported.folder / "latency.npz") as samples:
        assert sorted(samples.files) == sorted(
            f"{b}__{m}" for b in latency["backends"] for m in ("inference", "end_to_end"))
        assert all(samples[k].shape == (1000,) for k in samples.files)


def test_fp16_variant_only_on_gpu(exported: Exported) -> None:
    fp16 = exported.report["fp16"]
    if torch.cuda.is_available():
        assert fp16["file"] == "policy_fp16_cuda.pt"
    else:
        assert fp16 == {"skipped": "no CUDA device (FP16 runs only on a GPU)"}


@pytest.mark.slow
def test_export_without_normalization(tmp_path: Path) -> None:
    """An untrained policy without VecNormalize: the graph is the bare actor plus clipping."""
    cfg = load_config(["env=inverted_pendulum", "env.max_episode_steps=20", "device=cpu"])
    model = PPO("MlpPolicy", gymnasium.make("InvertedPendulum-v5"), n_steps=64, batch_size=64,
                seed=0, device="cpu")
    source = PolicySource(model, None, cfg, None, None, origin="untrained")
    result = export.export_policy(source, tmp_path / "out", observations=16, episodes=1,
                                  calls=1000, warmup=0)
    assert result.passed
    assert result.report["graph"]["observation_normalization"] is False
    checked = runner.read_contract(tmp_path / "out" / "policy.onnx")
    assert checked.raw["normalization"] == {"in_graph": False, "clip": None, "epsilon": None,
                                            "mean": None, "var": None, "sha256": None}
    assert checked.raw["source"] == {"run_id": None, "checkpoint_step": None,
                                     "checkpoint": None, "origin": "untrained"}
    assert result.report["replay"]["consistent"] is None  # nothing logged to compare with
    assert {p.name for p in (tmp_path / "out").iterdir()} == EXPORT_FILES


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export"], "export: one of the arguments --run --bundle --repo-id is required"),
        (["export", "--run", "abc", "run"], "export: unrecognized arguments: run"),
        (["export", "--run", "abc", "--epsiodes", "3"],
         "export: unrecognized arguments: --epsiodes 3"),
        (["export", "--run", "abc", "--calls", "10"], "calls=10: latency needs at least 1000"),
        (["export", "--run", "abc", "--observations", "many"],
         "export: argument --observations: invalid int value: 'many'"),
        (["export", "--run", "0123abc"], "tracking store sqlite:///"),
        (["export", "--bundle", "/nonexistent"], "/nonexistent: no bundle.json there"),
        (["export", "--run", "x", "--bundle", "/tmp"],
         "export: argument --bundle: not allowed with argument --run"),
        (["export", "--bundle", "/tmp", "--revision", "v1"], "--revision: only with --repo-id"),
    ],
)
def test_bad_export_arguments_exit_2_with_one_line(
    argv: list[str], message: str, bare_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench: error: {message}"), err
    assert err.count("\n") == 1
    assert not (bare_store / "mlartifacts").exists()  # nothing written to the store


def test_unknown_run_in_existing_store(
    exported: Exported, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["export", "--run", "0123abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench: error: run 0123abc: no such run in sqlite:///"), err
    assert err.count("\n") == 1


NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "export.ipynb"


@pytest.mark.unit
def test_notebook_is_thin_and_stored_without_outputs() -> None:
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == "workbench"
    assert nb.metadata.kernelspec.language == "python"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].metadata.get("tags") == ["parameters"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "export.export_run(" in code[1].source


@pytest.mark.slow
def test_notebook_exports_through_papermill(
        exported: Exported, exported_policy: ExportedPolicy, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import papermill

    # The notebook exports the run again (other sizes) into its artifacts: on a copy of the
    # shared store, which the Hub and bundle tests read as `workbench export` left it.
    copy = tmp_path / "experiments"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", copy_store(exported_policy.experiments, copy))
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(copy))
    out = tmp_path / "export.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK), str(out), kernel_name="workbench", cwd=str(tmp_path),
        parameters={"run_id": exported.run_id, "n_obs": 16, "episodes": 1, "warmup": 0,
                    "robustness_overrides": ["seeds=[0]", "episodes=1", "factors.friction=[]",
                                             "factors.mass=[]", "factors.obs_noise=[]"]},
        progress_bar=False,
    )
    import nbformat

    executed = nbformat.read(out, as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert f"Export of run {exported.run_id} (HalfCheetah-v5)" in text
    assert "PASS" in text
    images = [o for c in executed.cells for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert "\n  action_delay holds" in text  # its verdict line
    # latency distributions, replay vs training log, return against each perturbation
    assert len(images) == 3
