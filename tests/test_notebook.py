"""notebooks/train.ipynb: committed clean, parameters checked in the cell after them, a real
papermill execution (real kernel, MuJoCo, MLflow store) logs a complete run, and re-running
all cells in the same kernel works."""

from __future__ import annotations

import ast
import base64
import html
import json
import os
import re
import struct
from pathlib import Path

import gymnasium
import nbformat
import papermill
import pytest
from mlflow.tracking import MlflowClient
from nbclient import NotebookClient
from papermill.exceptions import PapermillExecutionError
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook
from stable_baselines3.common.vec_env import DummyVecEnv
from workbench import notebook
from workbench.envs import robots  # noqa: F401  (registers the workbench's own ids)
from workbench.notebook import CurveHistory, ParameterError, check_parameters
from workbench.training.trainer import TrainResult, summary_rows

from .conftest import ROOT, TINY_VIDEO, copy_store
from .trained_run import FinishedRun

NOTEBOOK = ROOT / "notebooks" / "train.ipynb"
# TINY_VIDEO (the notebook shows the run's video) without the keys its own parameters set.
PARAMETER_KEYS = ("env", "env.num_envs", "algo.n_steps", "total_timesteps", "seed")
TINY_OVERRIDES = [o for o in TINY_VIDEO if o.split("=")[0] not in PARAMETER_KEYS]
TINY_PARAMETERS = {"env": "halfcheetah", "num_envs": 2, "n_steps": 64, "total_timesteps": 384,
                   "overrides": [*TINY_OVERRIDES, "tracking.system_metrics=false"]}


def committed() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def parameters_cell_source() -> str:
    (cell,) = [c for c in committed().cells if "parameters" in c.metadata.get("tags", [])]
    return cell.source


def history(*cells: str) -> list[str]:
    """IPython's ``In`` as the check cell sees it: '' first, the check cell itself last."""
    return ["", *cells, "params = notebook.check_parameters(globals(), In)"]


# What the notebook's training prints besides its figure and summary table: its header only.
QUIET = ["console.progress_bar=false", "console.iteration_lines=false", "console.summary=false"]
DEFAULTS = {"env": "hopper", "num_envs": 4, "n_steps": 512, "total_timesteps": 4096, "seed": 1,
            "overrides": [], "sweep_id": "", "parent_run_id": "", "point": "", "study": "",
            "trial": -1}


# --------------------------------------------------------------------------- committed file


def test_committed_notebook_is_clean_and_papermill_ready() -> None:
    nb = committed()
    assert nb.metadata["kernelspec"]["name"] == "workbench"  # registered by `make setup`
    assert nb.metadata["kernelspec"]["language"] == "python"
    assert "language_info" not in nb.metadata  # the git filter strips what Jupyter adds
    assert nb.cells[0].metadata["tags"] == ["parameters"]
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], cell.source[:40]
            assert cell.execution_count is None, cell.source[:40]


@pytest.mark.unit
def test_parameters_cell_declares_exactly_the_checked_parameters() -> None:
    source = parameters_cell_source()
    assert source.startswith(notebook.PARAMETERS_CELL_MARKER)
    declared = {}
    for node in ast.parse(source).body:
        assert isinstance(node, ast.AnnAssign), ast.unparse(node)  # plain values only
        declared[node.target.id] = (node.annotation.id, ast.literal_eval(node.value))
    assert {name: t for name, (t, _) in declared.items()} == {
        name: t.__name__ for name, t in notebook.PARAMETERS.items()}
    namespace = {name: value for name, (_, value) in declared.items()}
    assert check_parameters(namespace, history(source)).env == namespace["env"]


def test_papermill_infers_the_parameters_with_types() -> None:
    inferred = papermill.inspect_notebook(str(NOTEBOOK))
    assert {k: v["inferred_type_name"] for k, v in inferred.items()} == {
        name: t.__name__ for name, t in notebook.PARAMETERS.items()}


@pytest.mark.unit
@pytest.mark.parametrize("name", ["train.ipynb", "compare.ipynb", "export.ipynb"])
def test_papermill_sees_every_parameter_of_every_notebook(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """papermill skips (with a warning on every run, and leaves out of --help-notebook) a
    parameter line that holds more than one ``=``, e.g. in its comment."""
    path = ROOT / "notebooks" / name
    cell = next(c for c in nbformat.read(path, as_version=4).cells
                if "parameters" in c.metadata.get("tags", []))
    assigned = [ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
                for node in ast.parse(cell.source).body]
    with caplog.at_level("WARNING", logger="papermill"):
        inferred = papermill.inspect_notebook(str(path))
    assert list(inferred) == assigned
    assert "Unable to parse" not in caplog.text


# --------------------------------------------------------------------------- checks (unit)


def test_injected_values_pass_and_map_to_overrides() -> None:
    params = check_parameters(
        {**DEFAULTS, "overrides": ["env.normalize=true"]},
        history("# Notebook parameters\nenv: str = 'x'", '# Parameters\nenv = "hopper"\n'),
    )
    assert params.config_overrides() == [*QUIET,
        "env=hopper", "env.num_envs=4", "algo.n_steps=512",
        "total_timesteps=4096", "seed=1", "env.normalize=true"]
    assert params.run_tags() == {}
    assert params.run_info("notebooks/train.ipynb") == {
        "notebook": "notebooks/train.ipynb", "papermill_parameters": {"env": "hopper"},
        "overrides": params.config_overrides()}


@pytest.mark.unit
def test_a_resume_in_overrides_keeps_the_runs_shape() -> None:
    """``overrides = ["resume=<id>"]``, as the notebook's stop line says: the run keeps its
    env, rollout and seed, so the notebook passes only its budget and the overrides."""
    params = check_parameters({**DEFAULTS, "overrides": ["resume=abc123"]}, history())
    assert params.config_overrides() == [*QUIET, "total_timesteps=4096", "resume=abc123"]


@pytest.mark.unit
def test_sweep_parameters_give_the_child_tags() -> None:
    params = check_parameters({**DEFAULTS, "sweep_id": "s-1", "parent_run_id": "p",
                               "point": "hopper-ne4-ns512-s1"}, history())
    assert params.run_tags() == {"sweep_id": "s-1", "sweep.role": "child",
                                 "sweep.point": "hopper-ne4-ns512-s1"}


@pytest.mark.unit
def test_outside_a_study_the_notebook_adds_no_trial() -> None:
    session = notebook.tuning_trial(check_parameters(DEFAULTS, history()))
    assert (session.tags, session.callbacks) == ({}, [])
    with pytest.raises(ParameterError, match="^notebook parameter trial=-1: a study's trial"):
        notebook.tuning_trial(check_parameters({**DEFAULTS, "study": "s"}, history()))


@pytest.mark.unit
@pytest.mark.parametrize(("name", "value", "message"), [
    ("num_envs", "four",
     "notebook parameter num_envs='four': expected int, got str (papermill example: "
     "-p num_envs 4)"),
    ("num_envs", True, "notebook parameter num_envs=True: expected int, got bool"),
    ("total_timesteps", 1e5, "notebook parameter total_timesteps=100000.0: expected int, got "
     "float"),
    ("env", 3, "notebook parameter env=3: expected str, got int"),
    ("overrides", "env.normalize=true",
     "notebook parameter overrides='env.normalize=true': expected list, got str"),
    ("overrides", ["seed=1", 2], "notebook parameter overrides=['seed=1', 2]: every entry must "
     "be a string"),
])
def test_wrong_types_fail_with_one_line(name: str, value: object, message: str) -> None:
    with pytest.raises(ParameterError) as info:
        check_parameters({**DEFAULTS, name: value}, history())
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.unit
def test_unknown_injected_name_fails() -> None:
    cells = history("# Notebook parameters\nenv: str = 'x'", "# Parameters\nnum_env = 8\n")
    with pytest.raises(ParameterError, match=r"^unknown notebook parameter 'num_env': valid "
                                             r"parameters are env, num_envs, n_steps"):
        check_parameters({**DEFAULTS, "num_env": 8}, cells)


def test_only_the_latest_parameter_cells_count() -> None:
    # Interactive re-runs: an earlier injected cell and later cells binding other names
    # (``cfg``, ``result``) are not parameters.
    cells = history("# Notebook parameters\nenv: str = 'x'", "# Parameters\nbogus = 1\n",
                    "cfg = load_config([])", "# Notebook parameters\nenv: str = 'x'")
    assert notebook.parameter_cell_names(cells) == (["env"], [])
    assert check_parameters(DEFAULTS, cells).run_info("nb.ipynb")["papermill_parameters"] is None


@pytest.mark.unit
def test_missing_parameter_fails() -> None:
    namespace = {k: v for k, v in DEFAULTS.items() if k != "seed"}
    with pytest.raises(ParameterError, match="^notebook parameter 'seed' is missing"):
        check_parameters(namespace, history())


@pytest.mark.unit
def test_the_live_eval_line_ends_at_the_final_evaluation() -> None:
    """train()'s final evaluation runs after model.learn, outside SB3's logger: the live
    figure adds it as the eval line's last point, as the summary reports it."""
    curves = notebook.LiveCurves()
    curves.history.write({"eval/mean_reward": 11.0}, {}, step=256)  # a periodic evaluation
    result = TrainResult(run_id="r", run_name="n", experiment_id="1", tracking_uri="sqlite://",
                         status="FINISHED", num_timesteps=640, eval_mean_reward=47.4,
                         eval_std_reward=1.0, fps=1.0, wall_time_s=1.0, peak_rss_mb=1.0,
                         artifact_uri="file:///a")
    curves.final_evaluation(result)
    assert curves.history.points[notebook.EVAL_KEY] == [(256, 11.0), (640, 47.4)]


@pytest.mark.unit
def test_the_live_figure_shows_steps_logged_past_the_budget() -> None:
    """SB3 trains whole rollouts: 40,000 steps at 2,048 a rollout end at 40,960, where the
    final evaluation is logged; the x-axis reaches it."""
    points = {"rollout/ep_rew_mean": [(20480, 1.0), (40960, 2.0)],
              notebook.EVAL_KEY: [(40960, 3.0)]}
    figure = notebook.curves_figure(points, total=40000)
    assert all(ax.get_xlim()[1] >= 40960 for ax in figure.axes)
    assert notebook.curves_figure({}, total=40000).axes[0].get_xlim() == (0, 40000)


@pytest.mark.unit
def test_curve_history_dates_train_values_like_mlflow() -> None:
    history_writer = CurveHistory(["rollout/ep_rew_mean", "train/approx_kl"])
    history_writer.write({"rollout/ep_rew_mean": 1.0, "time/fps": 5}, {}, step=128)
    history_writer.write({"rollout/ep_rew_mean": 2.0, "train/approx_kl": 0.01}, {}, step=256)
    history_writer.write({"train/approx_kl": 0.02}, {}, step=256)  # closing dump
    assert history_writer.points == {
        "rollout/ep_rew_mean": [(128, 1.0), (256, 2.0)],
        "train/approx_kl": [(128, 0.01), (256, 0.02)],
    }


@pytest.mark.unit
def test_the_summary_shows_every_value_in_full() -> None:
    """The model and checkpoint rows end on the commands that export and resume the run: the
    notebook's table shows them whole (pandas cut values at 50 characters), as text too."""
    run_id = "b98bd61d7e5044a580a187c6d9259e52"
    result = TrainResult(run_id=run_id, run_name="n", experiment_id="1",
                         tracking_uri="sqlite:///x.db", status="FINISHED", num_timesteps=384,
                         eval_mean_reward=1.0, eval_std_reward=0.0, fps=1.0, wall_time_s=1.0,
                         peak_rss_mb=1.0, artifact_uri=f"file:///store/<1>/{run_id}/artifacts",
                         checkpoint="checkpoints/step-000000000384")
    table = notebook.summary_table(result)
    page = table._repr_html_()
    for name, value in summary_rows(result):
        assert f'white-space: nowrap">{html.escape(name)}</th>' in page
        assert f'<td style="text-align: left">{html.escape(str(value))}</td>' in page
    assert f"workbench export --run {run_id} for ONNX)" in page
    assert f"file:///store/&lt;1&gt;/{run_id}/artifacts" in page  # escaped
    assert f"workbench train resume={run_id} total_timesteps=<more> continues it)" in repr(table)
    assert repr(table).splitlines()[0] == f"run id             {run_id}"


@pytest.mark.unit
def test_render_curves_gives_a_png_legible_unscaled_at_1280_px() -> None:
    png = notebook.render_curves({"train/entropy": [(1, 0.5), (2, 0.4)]}, total=4)
    assert png.startswith(b"\x89PNG")
    width, height = struct.unpack(">II", png[16:24])  # the PNG's IHDR chunk
    assert (width, height) == (820, 460)  # JupyterLab at 1280 px: 833 px of output width
    figure = notebook.curves_figure({"train/entropy": [(1, 0.5)]}, total=4)
    labels = [t for ax in figure.axes for t in [*ax.get_xticklabels(), *ax.get_yticklabels()]]
    assert min(t.get_fontsize() for t in labels) * notebook.CURVES_DPI / 72 >= 12  # px


@pytest.mark.unit
def test_a_commanded_quantity_gets_a_panel_of_achieved_and_commanded() -> None:
    """The walking duck tracks its speed and yaw rate against the command: one panel each,
    the achieved curve and the commanded one; an odd panel count leaves the last cell empty."""
    env = DummyVecEnv([lambda: gymnasium.make("Workbench/MiniDuckWalk-v0")])
    panels = notebook.commanded_curves(env)
    env.close()
    assert [key for key, _ in panels] == ["track/speed|track/command_speed",
                                          "track/yaw_rate|track/command_yaw_rate"]
    points = {"track/speed": [(1, 0.1), (2, 0.15)], "track/command_speed": [(1, 0.2), (2, 0.2)]}
    figure = notebook.curves_figure(points, total=2, curves=[*notebook.CURVES, panels[0]])
    shown = [ax for ax in figure.axes if ax.get_visible()]
    assert len(figure.axes) == 6 and len(shown) == 5
    assert [line.get_label() for line in shown[4].get_lines()] == [
        "track/speed", "track/command_speed"]


# --------------------------------------------------------------------------- real execution


def test_papermill_execution_logs_a_complete_run(store: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(output), parameters=TINY_PARAMETERS,
                               progress_bar=False, cwd=str(NOTEBOOK.parent))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "halfcheetah-ne2-ns64-s0"
    assert run.data.params["env.num_envs"] == "2"
    assert run.data.params["algo.n_steps"] == "64"
    assert run.data.params["console.progress_bar"] == "False"
    assert "sweep_id" not in run.data.tags
    # 384 steps / 128 per rollout: 3 iterations.
    for key in ("rollout/ep_rew_mean", "train/entropy", "train/clip_fraction", "train/approx_kl"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps == [128, 256, 384], key
    assert {"summary/eval_mean_reward", "summary/fps"} <= set(run.data.metrics)
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {
        "config.yaml", "model", "manifest.json"}
    manifest = json.loads(Path(client.download_artifacts(
        run.info.run_id, "manifest.json", str(tmp_path))).read_text())
    assert manifest["run"]["started_by"] == "papermill"
    assert manifest["run"]["notebook"] == "notebooks/train.ipynb"
    assert manifest["run"]["papermill_parameters"] == TINY_PARAMETERS
    assert manifest["run"]["overrides"][:5] == [*QUIET, "env=halfcheetah", "env.num_envs=2"]

    nb = nbformat.read(output, as_version=4)
    outputs = {cell.id: cell.outputs for cell in nb.cells if cell.cell_type == "code"}
    live = [o for o in outputs["train"] if o.output_type == "display_data"]
    assert len(live) == 1 and "image/png" in live[0].data  # one figure, updated in place
    summary = outputs["summary"]
    assert summary[0].text == f"MLflow run id: {run.info.run_id}\n"
    assert run.info.run_id in summary[1].data["text/html"]
    assert "artifacts/checkpoints/step-000000000384/" in summary[1].data["text/html"]  # saved
    # The run's video plays inline, embedded in the executed notebook (debug=tiny: 96x64).
    (shown,) = [o for o in outputs["video"] if o.output_type == "execute_result"]
    assert [o.output_type for o in outputs["video"]] == ["execute_result"]  # no progress bar
    page = shown.data["text/html"]
    (encoded,) = re.findall(r'<video [^>]*src="data:video/mp4;base64,([^"]+)"', page)
    logged = Path(client.download_artifacts(run.info.run_id, "video/replay.mp4", str(tmp_path)))
    assert base64.b64decode(encoded) == logged.read_bytes()
    assert "20 frames 96x64" in page


def test_the_stop_lines_resume_runs_in_the_notebook(finished_run: FinishedRun,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What a stopped run's line says (``overrides = ["resume=<id>"]``), done in a real kernel
    with the notebook's other parameters left as they were: the run continues, its own."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI",
                       copy_store(finished_run.experiments, tmp_path / "experiments"))
    output = tmp_path / "out.ipynb"
    parameters = {**TINY_PARAMETERS, "env": "hopper", "num_envs": 4, "total_timesteps": 512,
                  "overrides": [f"resume={finished_run.run_id}"]}
    papermill.execute_notebook(str(NOTEBOOK), str(output), parameters=parameters,
                               progress_bar=False, cwd=str(NOTEBOOK.parent))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    assert (run.info.run_id, run.info.status) == (finished_run.run_id, "FINISHED")
    assert run.data.params["env.id"].startswith("HalfCheetah")  # the run's, not the cell's
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/entropy")]
    assert steps == [128, 256, 384, 512]


def test_an_unknown_name_stops_in_the_check_cell(bare_store: Path, tmp_path: Path) -> None:
    """(A wrong type, through papermill's command line: tests/test_notebook_errors.py.)"""
    output = tmp_path / "bad.ipynb"
    with pytest.raises(PapermillExecutionError) as info:
        papermill.execute_notebook(str(NOTEBOOK), str(output),
                                   parameters={"num_env": 8}, progress_bar=False)
    assert info.value.evalue.startswith("unknown notebook parameter 'num_env'")
    assert not (bare_store / "mlflow.db").exists()  # nothing was written to the store


@pytest.mark.slow
def test_rerunning_all_cells_in_the_same_kernel(store: Path) -> None:
    nb = parameterize_notebook(load_notebook_node(str(NOTEBOOK)),
                               {**TINY_PARAMETERS, "total_timesteps": 128})
    client = NotebookClient(nb, kernel_name="workbench", timeout=600,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    with client.setup_kernel():
        for _ in range(2):
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
    tracking = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    runs = tracking.search_runs([tracking.get_experiment_by_name("workbench").experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
