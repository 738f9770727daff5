"""Lineage of a run's inputs: the robot description (the MJCF file and every file it uses)
and an ``init.dataset`` pulled from the Hugging Face Hub, recorded in the manifest's
``inputs`` and as MLflow run inputs, and compared by ``workbench manifest diff``.

The real Hub is unreachable from these machines, so the dataset comes from a local Hub cache
populated in huggingface_hub's documented layout (``datasets--org--name/{blobs,snapshots/
<commit>}``), read with ``HF_HUB_OFFLINE=1`` through huggingface_hub's own
``snapshot_download`` (as tests/test_hub.py does for policy bundles).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing
import os
import struct
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import mujoco
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from stable_baselines3.common.callbacks import BaseCallback
from workbench import cli
from workbench.config import ConfigError
from workbench.envs import robot_files
from workbench.tracking import manifest, manifest_diff
from workbench.training import dataset as hub_dataset
from workbench.training import load_config, train

from .conftest import TINY
from .support.hub import populate_cache

REPO = "test-org/walk-logs"


# --------------------------------------------------------------------------- stand-ins


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype.hasobject)
    return buffer.getvalue()


def populate_dataset_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> str:
    """``files`` as one commit of the dataset ``repo_id`` in a Hub cache; returns the commit."""
    return populate_cache(cache, repo_id, files, repo_type="dataset")


@pytest.fixture()
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HUB_OFFLINE=1 with a cache under tmp_path (huggingface_hub reads both variables once,
    at import, into ``huggingface_hub.constants``); experiments/ under tmp_path too."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    return cache


DATASET_FILES = {
    "README.md": b"# walk logs\n",
    ".gitattributes": b"*.npy filter=lfs\n",
    "data/episodes.npy": npy_bytes(np.arange(12, dtype=np.float32).reshape(3, 4)),
    "data/meta.json": b'{"episodes": 3}\n',
}


class DatasetDirSeen(BaseCallback):
    """Records ``WORKBENCH_DATASET_DIR`` as the training sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str | None] = set()

    def _on_step(self) -> bool:
        self.seen.add(os.environ.get(hub_dataset.DATASET_DIR_VARIABLE))
        return True


# --------------------------------------------------------------------------- a tiny run


def test_run_records_its_robot_and_dataset_as_inputs(store: Path, offline_hub: Path,
                                                     tmp_path: Path) -> None:
    commit = populate_dataset_cache(offline_hub, REPO, DATASET_FILES)
    seen = DatasetDirSeen()
    result = train(load_config([*TINY, "tracking.system_metrics=false",
                                f"init.dataset={REPO}@{commit}"]), callbacks=[seen])
    folder = tmp_path / "experiments" / "datasets" / REPO / commit
    assert seen.seen == {str(folder)}  # the run's own folder, while it trains
    assert hub_dataset.DATASET_DIR_VARIABLE not in os.environ  # and only then
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) \
        == ["README.md", "data/episodes.npy", "data/meta.json"]  # .gitattributes is the Hub's

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    recorded = json.loads(Path(client.download_artifacts(
        result.run_id, "manifest.json", str(tmp_path / "dl"))).read_text())
    inputs = recorded["inputs"]
    model = Path(huggingface_hub.constants.__file__).parents[1] / "gymnasium"  # site-packages
    cheetah = model / "envs" / "mujoco" / "assets" / "half_cheetah.xml"
    robot = inputs["robot"]
    assert robot["model"] == "gymnasium/envs/mujoco/assets/half_cheetah.xml"
    assert robot["files"] == {robot["model"]: {
        "sha256": hashlib.sha256(cheetah.read_bytes()).hexdigest(),
        "size": cheetah.stat().st_size}}
    data = inputs["dataset"]
    assert (data["repo_id"], data["commit"], data["local_dir"]) == (REPO, commit, str(folder))
    assert data["files"] == {name: {"sha256": hashlib.sha256(DATASET_FILES[name]).hexdigest(),
                                    "size": len(DATASET_FILES[name])}
                             for name in ("README.md", "data/episodes.npy", "data/meta.json")}

    by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset
                  for i in client.get_run(result.run_id).inputs.dataset_inputs}
    assert set(by_context) == {"robot", "dataset"}
    assert by_context["robot"].name == robot["model"]
    assert by_context["robot"].digest == robot["sha256"][:36]  # MLflow keeps 36 characters
    assert json.loads(by_context["robot"].profile)["sha256"] == robot["sha256"]
    assert json.loads(by_context["robot"].source)["uri"] == cheetah.resolve().as_uri()
    assert (by_context["dataset"].name, by_context["dataset"].digest) == (REPO, commit[:36])
    assert json.loads(by_context["dataset"].source) == {
        "url": f"https://huggingface.co/datasets/{REPO}/tree/{commit}"}
    assert json.loads(by_context["dataset"].profile)["commit"] == commit
    assert client.get_run(result.run_id).data.params["init.dataset"] == f"{REPO}@{commit}"


@pytest.mark.parametrize("value, message", [
    ("org/name@main", "init.dataset=org/name@main: the revision 'main' is a branch or tag "
                      "name, which can move; pin the full 40-character commit sha"),
    ("org/name@v1.0", "init.dataset=org/name@v1.0: the revision 'v1.0' is a branch or tag "
                      "name"),
    ("org/name", "init.dataset='org/name': not ORG/NAME@REVISION; write it as "
                 "init.dataset=my-org/walk-logs@<40-hex commit sha>"),
    ("name@" + "a" * 40, "init.dataset='name@" + "a" * 40 + "': not ORG/NAME@REVISION"),
])
def test_unpinned_or_malformed_dataset_is_one_line_exit_2_and_no_run(
    value: str, message: str, bare_store: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["train", *TINY, f"init.dataset={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench: error: {message}"), err
    assert err.count("\n") == 1
    assert not bare_store.exists()  # no store, no run


def test_subprocess_workers_see_the_dataset_folder_of_their_own_run(tmp_path: Path) -> None:
    # SubprocVecEnv workers come from multiprocessing's forkserver (envs/backends.py), which
    # keeps the environment it started with.
    forkserver = multiprocessing.get_context("forkserver")

    def in_a_worker() -> str | None:
        with forkserver.Pool(1) as pool:
            return pool.apply(os.getenv, (hub_dataset.DATASET_DIR_VARIABLE,))

    assert in_a_worker() is None  # the server now runs, without the variable
    for name in ("one", "two"):
        pulled = hub_dataset.PulledDataset(REPO, name[0] * 40, tmp_path / name, ())
        with hub_dataset.dataset_environment(pulled):
            assert in_a_worker() == str(tmp_path / name)
    assert in_a_worker() is None


# --------------------------------------------------------------------------- the dataset's rules


@pytest.mark.unit
@pytest.mark.parametrize("name, data, problem", [
    ("policy.pkl", b"\x80\x04N.", "policy.pkl is not a data file"),
    ("load.py", b"import os\n", "load.py is not a data file"),
    ("data/objects.npy", npy_bytes(np.array([{"a": 1}], dtype=object)),
     "data/objects.npy holds Python objects, which load through pickle"),
])
def test_a_dataset_with_code_or_pickles_is_refused_and_leaves_nothing(
    name: str, data: bytes, problem: str, offline_hub: Path, tmp_path: Path,
) -> None:
    commit = populate_dataset_cache(offline_hub, REPO, {"README.md": b"# x\n", name: data})
    with pytest.raises(ConfigError, match=rf"^init.dataset={REPO}@{commit}: {problem}"):
        hub_dataset.pull_for_run(f"{REPO}@{commit}")
    assert not [p for p in (tmp_path / "experiments").rglob("*") if p.is_file()]


@pytest.mark.unit
def test_a_pulled_dataset_changed_on_disk_is_refused(offline_hub: Path) -> None:
    commit = populate_dataset_cache(offline_hub, REPO, DATASET_FILES)
    pulled = hub_dataset.pull_dataset(REPO, commit)
    assert hub_dataset.pull_dataset(REPO, commit) == pulled  # checked again, from the index
    (pulled.directory / "data" / "meta.json").write_text('{"episodes": 4}\n')
    with pytest.raises(ConfigError, match=r"differs from the commit pulled into it .* delete "
                                          r"that folder to pull it afresh$"):
        hub_dataset.pull_dataset(REPO, commit)


@pytest.mark.unit
def test_a_dataset_commit_missing_offline_is_one_line(offline_hub: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^init.dataset={REPO}@{'b' * 40}: not \(completely\) "
                                          r"in the local Hub cache .* HF_HUB_OFFLINE=1"):
        hub_dataset.pull_for_run(f"{REPO}@{'b' * 40}")


# --------------------------------------------------------------------------- the robot files


def binary_stl(scale: float) -> bytes:
    """A tetrahedron as a binary STL file (what MuJoCo reads for a mesh)."""
    points = [(0, 0, 0), (scale, 0, 0), (0, scale, 0), (0, 0, scale)]
    faces = [(0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3)]
    body = b"".join(struct.pack("<12fH", 0, 0, 0, *points[a], *points[b], *points[c], 0)
                    for a, b, c in faces)
    return b"\0" * 80 + struct.pack("<I", len(faces)) + body


def write_robot(folder: Path, leg_mass: float = 1.0) -> Path:
    """A small MJCF robot: an included part file and a mesh under ``<compiler meshdir>``."""
    (folder / "parts").mkdir(parents=True, exist_ok=True)
    (folder / "meshes").mkdir(exist_ok=True)
    (folder / "meshes" / "foot.stl").write_bytes(binary_stl(0.1))
    (folder / "parts" / "leg.xml").write_text(
        f'<mujoco><worldbody><body name="leg" pos="0 0 1"><freejoint/>'
        f'<geom type="mesh" mesh="foot" mass="{leg_mass}"/></body></worldbody></mujoco>')
    model = folder / "robot.xml"
    model.write_text('<mujoco model="robot"><compiler meshdir="meshes"/>'
                     '<asset><mesh name="foot" file="foot.stl"/></asset>'
                     '<include file="parts/leg.xml"/></mujoco>')
    return model


def cli_diff(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = manifest_diff.run_command(argparse.Namespace(
        manifest_command="diff", run_a=str(a), run_b=str(b), format="text", overrides=[]))
    return code, capsys.readouterr().out


def test_a_changed_included_file_is_a_named_manifest_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_robot(tmp_path / "robot")
    assert mujoco.MjModel.from_xml_path(str(model)).nmesh == 1  # MuJoCo loads the same files
    before = robot_files.collect(model, "Robot-v0")
    assert [f.path for f in before.files] == ["robot/robot.xml", "robot/meshes/foot.stl",
                                              "robot/parts/leg.xml"]
    base = manifest.collect_manifest(inputs={"robot": before.to_manifest(), "dataset": None})
    (tmp_path / "a.json").write_text(manifest.to_json(base))

    write_robot(tmp_path / "robot", leg_mass=2.0)  # one included file changes
    after = robot_files.collect(model, "Robot-v0")
    changed: dict[str, Any] = {**base, "inputs": {"robot": after.to_manifest(), "dataset": None}}
    (tmp_path / "b.json").write_text(manifest.to_json(changed))
    code, out = cli_diff(tmp_path / "a.json", tmp_path / "b.json", capsys)
    assert code == 1
    rows = [line.split() for line in out.splitlines() if line.startswith("inputs ")]
    leg = hashlib.sha256((tmp_path / "robot" / "parts" / "leg.xml").read_bytes()).hexdigest()
    assert ["inputs", "robot.files.robot/parts/leg.xml.sha256", before.files[2].sha256,
            leg] in rows
    assert ["inputs", "robot.sha256", before.sha256, after.sha256] in rows
    assert len(rows) == 2 and out.rstrip().endswith("2 differences: inputs 2")

    (tmp_path / "c.json").write_text(manifest.to_json(base))
    assert cli_diff(tmp_path / "a.json", tmp_path / "c.json", capsys)[0] == 0


@pytest.mark.unit
def test_asset_files_resolve_against_the_compiler_folders(tmp_path: Path) -> None:
    folder = tmp_path / "terrain"
    for name in ("assets/height.png", "textures/grid.png", "textures/sky-r.png",
                 "textures/sky-l.png", "parts/nested/arm.xml", "parts/nested/hand.xml"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    # a nested include written relative to its own file, as MuJoCo also accepts
    (folder / "parts" / "nested" / "arm.xml").write_text('<mujoco><include file="hand.xml"/>'
                                                         '</mujoco>')
    (folder / "parts" / "nested" / "hand.xml").write_text('<mujoco/>')
    model = folder / "scene.xml"
    model.write_text(
        '<mujoco><compiler assetdir="assets" texturedir="textures"/><asset>'
        '<hfield name="h" file="height.png" size="1 1 1 1"/>'
        '<texture name="g" type="2d" file="grid.png"/>'
        '<texture name="s" type="skybox" fileright="sky-r.png" fileleft="sky-l.png"/>'
        '<texture name="b" type="2d" builtin="checker" width="8" height="8"/>'
        '</asset><include file="parts/nested/arm.xml"/></mujoco>')
    robot = robot_files.collect(model, "Terrain-v0")
    assert [f.path for f in robot.files] == [
        "terrain/scene.xml", "terrain/assets/height.png", "terrain/parts/nested/arm.xml",
        "terrain/parts/nested/hand.xml", "terrain/textures/grid.png",
        "terrain/textures/sky-l.png", "terrain/textures/sky-r.png"]
    assert robot.files[1].sha256 == hashlib.sha256(b"assets/height.png").hexdigest()


@pytest.mark.unit
@pytest.mark.parametrize("compiler, reference, shown", [
    ('<compiler meshdir="../outside"/>', 'file="foot.stl"', "'foot.stl' (via ../outside)"),
    ("", 'file="/etc/hostname"', "'/etc/hostname' (via the model folder)"),
])
def test_a_robot_file_outside_the_model_folder_is_one_line(
    compiler: str, reference: str, shown: str, tmp_path: Path
) -> None:
    model = write_robot(tmp_path / "robot")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "foot.stl").write_bytes(binary_stl(0.1))
    model.write_text(f'<mujoco>{compiler}<asset><mesh name="foot" {reference}/></asset>'
                     '</mujoco>')
    with pytest.raises(ConfigError) as caught:
        robot_files.collect(model, "Robot-v0")
    assert str(caught.value) == (
        f"env.id=Robot-v0: robot file robot.xml references {shown}, which is outside the "
        f"model's folder {model.parent}; keep every file the model uses under that folder")
