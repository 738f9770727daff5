"""Hostile Hub bundles and checkpoints: pulled files and checkpoint indexes are data.

Each case is a bundle (or a checkpoint) someone could publish or plant: a config that names
a module for gymnasium to import, files the index does not list, an index that points outside
the bundle or has the wrong shape, values that would take GiBs to honour. Every one must be
refused in one line (exit code 2) before anything is imported, built or kept. A sentinel
module that writes a marker file when imported stands for code an attacker would run.

The real Hub is unreachable from these machines: as in tests/test_hub.py, bundles are pulled
with ``HF_HUB_OFFLINE=1`` from a local Hub cache written in huggingface_hub's layout, which is
exactly where ``snapshot_download`` reads a commit from.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.deploy import hub
from workbench.training import checkpoint

from .conftest import embedded_store
from .support.files import tree_state
from .support.hub import offline_cache, populate_cache
from .trained_run import NORMALIZED, ExportedPolicy, FinishedRun

Files = dict[str, bytes]


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def genuine(exported_policy: ExportedPolicy, tmp_path_factory: pytest.TempPathFactory
            ) -> Files:
    """A real bundle of the session's tiny exported run, as `workbench hub push` writes it."""
    folder = tmp_path_factory.mktemp("genuine") / "built"
    with embedded_store(exported_policy.experiments):
        hub.write_bundle(MlflowClient(exported_policy.uri), exported_policy.run_id, folder)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@dataclass
class Place:
    """Where a test pulls into: the Hub cache, the experiments directory, the temp dir."""

    cache: Path
    experiments: Path
    temp: Path
    mark: Path  # written by the sentinel module if anything imports it
    sentinel: str  # that module's name, importable in this process

    def leftovers(self) -> list[Path]:
        """What a refused pull left behind (it must be nothing)."""
        return [*self.experiments.rglob("*"), *self.temp.iterdir()]


@pytest.fixture()
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Place]:
    experiments, temp, modules = (tmp_path / "experiments", tmp_path / "tmp", tmp_path / "mods")
    temp.mkdir()
    modules.mkdir()
    mark = tmp_path / "SENTINEL-IMPORTED"
    sentinel = f"wb_sentinel_{tmp_path.name.replace('-', '_')}"
    (modules / f"{sentinel}.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # staging happens in here
    offline_cache(monkeypatch, tmp_path / "cache")
    yield Place(tmp_path / "cache", experiments, temp, mark, sentinel)
    sys.modules.pop(sentinel, None)


def reindexed(files: Files, index_change: Callable[[dict], None] | None = None) -> Files:
    """``files`` with bundle.json's hashes recomputed, as an attacker who writes both would."""
    index = json.loads(files["bundle.json"])
    for name in index["files"]:
        if name in files:
            index["files"][name] = hashlib.sha256(files[name]).hexdigest()
    if index_change:
        index_change(index)
    return {**files, "bundle.json": json.dumps(index, indent=2).encode()}


def with_config(files: Files, old: str, new: str) -> Files:
    text = files["config.yaml"].decode()
    assert old in text, old
    return {**files, "config.yaml": text.replace(old, new).encode()}


def pull(place: Place, repo: str, files: Files, capsys: pytest.CaptureFixture[str],
         *flags: str) -> tuple[int, str]:
    """``workbench hub pull`` of ``files`` as one commit of ``repo``: (exit code, stderr)."""
    commit = populate_cache(place.cache, repo, files)
    code = cli.main(["hub", "pull", "--repo-id", repo, "--revision", commit, *flags])
    return code, capsys.readouterr().err


def assert_refused(code: int, err: str, place: Place, *expected: str) -> None:
    """Exit 2, one line naming the bundle and the problem, nothing imported or kept."""
    assert not place.mark.exists(), "the sentinel module was imported"
    assert place.sentinel not in sys.modules
    assert code == 2, err
    assert err.startswith("workbench: error: bundle "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    assert place.leftovers() == [], "a refused pull must leave nothing behind"


# --------------------------------------------------------------------------- env ids


def test_module_env_id_is_refused_without_importing(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    env_id = f"{place.sentinel}:HalfCheetah-v5"
    files = reindexed(with_config(genuine, "id: HalfCheetah-v5", f"id: {env_id}"),
                      lambda index: index.update(env_id=env_id))
    code, err = pull(place, "evil/module-id", files, capsys)
    assert_refused(code, err, place, f"env.id='{env_id}' would import module "
                   f"'{place.sentinel}'", f"pass --allow-module {place.sentinel} if you trust")


def test_stdlib_module_env_id_is_refused_too(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tester's case: ``this:`` (importing it prints the Zen of Python)."""
    files = reindexed(with_config(genuine, "id: HalfCheetah-v5", "id: this:HalfCheetah-v5"),
                      lambda index: index.update(env_id="this:HalfCheetah-v5"))
    code, err = pull(place, "evil/zen", files, capsys)
    assert_refused(code, err, place, "would import module 'this'")
    assert "Beautiful is better than ugly" not in capsys.readouterr().out


def test_allow_module_is_the_only_way_a_bundle_imports_code(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    env_id = f"{place.sentinel}:HalfCheetah-v5"
    files = reindexed(with_config(genuine, "id: HalfCheetah-v5", f"id: {env_id}"),
                      lambda index: index.update(env_id=env_id))
    code, err = pull(place, "evil/allowed", files, capsys, "--allow-module", "other_pkg")
    assert_refused(code, err, place, "would import module")
    code, err = pull(place, "evil/allowed-2", files, capsys, "--allow-module", place.sentinel)
    assert code == 0, err
    assert place.mark.exists()  # the user named it: imported, then the bundle verified


def test_unregistered_env_id_is_refused(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    files = reindexed(with_config(genuine, "id: HalfCheetah-v5", "id: HalfCheetah-v99"),
                      lambda index: index.update(env_id="HalfCheetah-v99"))
    code, err = pull(place, "evil/unknown-id", files, capsys)
    assert_refused(code, err, place, "'HalfCheetah-v99': not a registered gymnasium id")


def test_training_from_a_bundle_does_not_import_its_module(
    genuine: Files, place: Place, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """init.hub_repo_id: the bundle's module is imported only if the user's own env.id names
    it; the user's HalfCheetah-v5 does not."""
    env_id = f"{place.sentinel}:HalfCheetah-v5"
    files = reindexed(with_config(genuine, "id: HalfCheetah-v5", f"id: {env_id}"),
                      lambda index: index.update(env_id=env_id))
    commit = populate_cache(place.cache, "evil/init", files)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{place.experiments / 'mlflow.db'}")
    code = cli.main(["train", *NORMALIZED, "init.hub_repo_id=evil/init",
                     f"init.hub_revision={commit}"])
    assert_refused(code, capsys.readouterr().err, place, "would import module",
                   "training from it needs that env.id in your own config")


# --------------------------------------------------------------------------- files and index


def test_unlisted_file_fails_the_pull_and_is_not_kept(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = f"open({str(place.mark)!r}, 'w').close()\n".encode()
    code, err = pull(place, "evil/unlisted", {**genuine, "payload.py": payload}, capsys)
    assert_refused(code, err, place, "payload.py is not listed in bundle.json")


@pytest.mark.slow  # two `python -m workbench` processes: ~30 s on a loaded machine
def test_a_kept_payload_cannot_be_imported_by_a_second_bundle(
    genuine: Files, tmp_path: Path
) -> None:
    """The tester's chain with the real command from a project root: bundle A ships an
    unlisted ``payload.py``; bundle B's env.id names it as a module under experiments/hub/.
    Before, A was kept and B's pull ran its code."""
    mark = tmp_path / "PAYLOAD-RAN"
    root = tmp_path / "project"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"),
           "HF_HOME": str(tmp_path / "hf-home"), "WORKBENCH_EXPERIMENTS": str(root / "experiments")}
    payload = f"open({str(mark)!r}, 'w').close()\n".encode()
    first = populate_cache(tmp_path / "cache", "evil/a", {**genuine, "payload.py": payload})
    env_id = f"experiments.hub.evil.a.{first}.payload:HalfCheetah-v5"
    second = populate_cache(tmp_path / "cache", "evil/b", reindexed(
        with_config(genuine, "id: HalfCheetah-v5", f"id: {env_id}"),
        lambda index: index.update(env_id=env_id)))
    root.mkdir()
    for repo, commit in (("evil/a", first), ("evil/b", second)):
        # cwd is the project root, which `python -m` puts first on sys.path
        done = subprocess.run([sys.executable, "-m", "workbench", "hub", "pull", "--repo-id",
                               repo, "--revision", commit], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "payload.py is not listed" not in done.stderr  # B fails on its env id
    assert "would import module" in done.stderr
    assert not mark.exists(), "the payload ran"
    assert list((root / "experiments").rglob("*")) == []


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_index_names_outside_the_bundle_are_refused(
    where: str, genuine: Files, place: Place, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the bundle\n")
    name = str(secret) if where == "absolute" else "../" * 40 + str(secret).lstrip("/")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    files = reindexed(genuine, lambda index: index["files"].update({name: digest}))
    code, err = pull(place, f"evil/{where}", files, capsys)
    assert_refused(code, err, place, "bundle.json lists", "which is not a file of a workbench "
                   "policy bundle")


def test_link_out_of_the_hub_cache_is_refused(
    genuine: Files, place: Place, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache snapshot's README.md that links to a file outside the repository's cache."""
    secret = tmp_path / "secret.md"
    secret.write_bytes(b"# private notes of this machine\n")
    files = reindexed({**genuine, "README.md": secret.read_bytes()})
    commit = populate_cache(place.cache, "evil/link", files)
    link = place.cache / "models--evil--link" / "snapshots" / commit / "README.md"
    link.unlink()
    link.symlink_to(secret)
    code = cli.main(["hub", "pull", "--repo-id", "evil/link", "--revision", commit])
    assert_refused(code, capsys.readouterr().err, place, "README.md points outside the bundle")


def test_export_of_a_bundle_folder_with_a_link_is_refused(
    genuine: Files, place: Place, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "unpacked"
    folder.mkdir()
    for name, data in genuine.items():
        (folder / name).write_bytes(data)
    outside = tmp_path / "elsewhere.md"
    outside.write_bytes(genuine["README.md"])
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to(outside)
    before = tree_state(tmp_path)
    code = cli.main(["export", "--bundle", str(folder), "--observations", "16", "--episodes",
                     "1", "--warmup", "0"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == (f"workbench: error: bundle {folder}: README.md is a symbolic link; a "
                   "bundle holds regular files (ask its publisher to push it again with "
                   "`workbench hub push`)\n")
    assert tree_state(tmp_path) == before  # no <bundle>-export folder


INDEX_CASES: list[tuple[str, Callable[[dict], None], str]] = [
    ("files as a list", lambda i: i.update(files=sorted(i["files"])),
     "bundle.json: files is a list of 10, expected an object"),
    ("hash not hex", lambda i: i["files"].update({"policy.onnx": "x" * 64}),
     "the sha256 of policy.onnx is"),
    ("unknown key", lambda i: i.update(run_script="rm -rf /"), "unknown key 'run_script'"),
    ("missing key", lambda i: i.pop("env_id"), "missing key 'env_id'"),
    ("version as a number", lambda i: i.update(format=1), "format 1 is not"),
    ("steps as a string", lambda i: i.update(num_timesteps="384"),
     'num_timesteps is "384", expected an integer'),
    ("manifest flag lies", lambda i: i.update(manifest=not i["manifest"]), "manifest="),
    ("required file unlisted", lambda i: i["files"].pop("samples.npz"),
     "bundle.json does not list samples.npz"),
    ("older format", lambda i: i.update(format="workbench-policy-bundle/1"),
     "bundle.json: format 'workbench-policy-bundle/1' is older than "
     "'workbench-policy-bundle/2': it carries no contract and no runner"),
    ("contract not an object", lambda i: i.update(contract="{}"),
     'bundle.json: contract is "{}", expected an object'),
    ("contract of a newer format", lambda i: i["contract"].update(
        format="workbench-policy-contract/9"), "contract: format: workbench-policy-contract/9 "
     "is newer than this reader's workbench-policy-contract/1"),
    ("contract not the graph's", lambda i: i["contract"]["action"]["entries"][0].update(
        name="gas_pedal"), "bundle.json's contract is not the one inside policy.onnx "
     "(action.entries[0].name: bundle.json says \"gas_pedal\", policy.onnx says "
     "\"bthigh\")"),
]


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in INDEX_CASES],
                         ids=[c[0] for c in INDEX_CASES])
def test_malformed_index_is_one_line(
    change: Callable[[dict], None], expected: str, genuine: Files, place: Place,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = pull(place, "evil/index", reindexed(genuine, change), capsys)
    assert_refused(code, err, place, expected)


def test_a_runner_other_than_the_workbenchs_is_refused_and_never_run(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """runner.py goes to robots: the bundle's author does not get to write it."""
    trojan = f"import {place.sentinel}\n".encode() + genuine["runner.py"]
    code, err = pull(place, "evil/runner", reindexed({**genuine, "runner.py": trojan}), capsys)
    assert_refused(code, err, place, "runner.py is not the runner this workbench writes")


def test_duplicate_keys_and_deep_nesting_are_refused(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    text = reindexed(genuine)["bundle.json"].decode()
    twice = text.replace('"algo": "PPO",', '"algo": "PPO", "algo": "PPO",')
    code, err = pull(place, "evil/twice", {**genuine, "bundle.json": twice.encode()}, capsys)
    assert_refused(code, err, place, "duplicate key 'algo'")
    deep = b"[" * 100_000 + b"]" * 100_000
    code, err = pull(place, "evil/deep", {**genuine, "bundle.json": deep}, capsys)
    assert_refused(code, err, place, "bundle.json is not valid JSON: nested too deeply")


def test_onnx_graph_with_external_data_is_refused(
    genuine: Files, place: Place, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An initializer stored "outside" the graph would make ONNX read a file the graph names."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 4096)
    model = onnx.load_from_string(genuine["policy.onnx"])
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../" * 40 + str(secret).lstrip("/")
    files = reindexed({**genuine, "policy.onnx": model.SerializeToString()})
    code, err = pull(place, "evil/onnx", files, capsys)
    assert_refused(code, err, place, "policy.onnx refers to external data files")


# --------------------------------------------------------------------------- config values


CONFIG_CASES: list[tuple[str, list[tuple[str, str]], str]] = [
    # 300 copies: just above the cap, and cheap enough for the old code to build them
    ("num_envs", [("num_envs: 2", "num_envs: 300"), ("total_timesteps: 384",
                                                      "total_timesteps: 20000")],
     "env.num_envs=300: more than the 256 a pulled bundle may ask for"),
    ("rollout", [("n_steps: 64", "n_steps: 200000"), ("total_timesteps: 384",
                                                      "total_timesteps: 400000")],
     "env.num_envs * algo.n_steps=400000: more than the 262144"),
    ("wide layer", [("pi:\n    - 256", "pi:\n    - 100000")],
     "algo.policy.pi (units per layer)=100000"),
    ("file kwarg", [("kwargs: {}", "kwargs:\n    xml_file: /etc/hostname")],
     "env.kwargs.xml_file='/etc/hostname': a pulled config may not point the simulator"),
    ("interpolation", [("run_name: null", "run_name: ${oc.env:HOME}")],
     "config.yaml has ${...} interpolations"),
    ("alias", [("    pi:\n    - 256\n    - 256\n    vf:\n    - 256\n    - 256",
                "    pi: &net\n    - 256\n    - 256\n    vf: *net")],
     "config.yaml uses YAML anchors or aliases"),
    ("schema", [("  num_envs: 2", "  num_envs: 2\n  command: id")],
     "config.yaml: env.command: "),
]


@pytest.mark.parametrize(("changes", "expected"), [c[1:] for c in CONFIG_CASES],
                         ids=[c[0] for c in CONFIG_CASES])
def test_config_values_are_bounded(
    changes: list[tuple[str, str]], expected: str, genuine: Files, place: Place,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = genuine
    for old, new in changes:
        files = with_config(files, old, new)
    code, err = pull(place, "evil/config", reindexed(files), capsys)
    assert_refused(code, err, place, expected)


def test_a_genuine_bundle_still_pulls(
    genuine: Files, place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control: the same machinery accepts what `workbench hub push` writes, with the Hub's
    .gitattributes beside it (skipped, not kept)."""
    commit = populate_cache(place.cache, "good/bundle", {**genuine, ".gitattributes": b"*.onnx"
                                                         b" filter=lfs\n"})
    assert cli.main(["hub", "pull", "--repo-id", "good/bundle", "--revision", commit]) == 0
    directory = place.experiments / "hub" / "good" / "bundle" / commit
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(directory)
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == genuine
    assert list(place.temp.iterdir()) == []  # the staging copy is gone
    assert not place.mark.exists()



# --------------------------------------------------------------------------- checkpoints


@pytest.fixture()
def latest(finished_run: FinishedRun, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[Path]:
    """The session's run's newest checkpoint folder in its artifacts, restored after the test
    exactly as it was (other modules' tests read it)."""
    finished_run.use(monkeypatch)
    folder = finished_run.artifacts() / "checkpoints" / "step-000000000384"
    saved = {p.name: p.read_bytes() for p in folder.iterdir()}
    yield folder
    for path in folder.iterdir():  # a test may have replaced a file by a link: remove it
        path.unlink()
    for name, content in saved.items():
        (folder / name).write_bytes(content)


def edit_state(folder: Path, change: Callable[[dict], object]) -> None:
    meta = json.loads((folder / "state.json").read_text())
    change(meta)
    (folder / "state.json").write_text(json.dumps(meta))


def outside_file(tmp_path: Path) -> tuple[Path, str]:
    secret = tmp_path / "outside.bin"
    secret.write_bytes(b"a file of this machine, not of the checkpoint\n")
    return secret, hashlib.sha256(secret.read_bytes()).hexdigest()


CHECKPOINT_CASES: list[tuple[str, Callable[[dict, Path, str], None], str]] = [
    ("parent path", lambda m, p, h: m["files"].update(
        {"../" * 40 + str(p).lstrip("/"): h}), "state.json lists '../../"),
    ("absolute path", lambda m, p, h: m["files"].update({str(p): h}), "state.json lists '/"),
    ("dot-dot folder", lambda m, p, h: m.update(files={"../": h}), "state.json lists '../'"),
    ("files as a list", lambda m, p, h: m.update(files=sorted(m["files"])),
     "state.json: files is a list, expected a mapping"),
    ("config unlisted", lambda m, p, h: m["files"].pop("config.yaml"),
     "state.json lists 'config.yaml'; a checkpoint's files are exactly"),
    ("state tree", lambda m, p, h: m["state"].update(policy={"__items__": 5}),
     "state.json: the state tree is malformed"),
    ("state keys", lambda m, p, h: m["state"].pop("rng"), "state.json: state lacks rng"),
    ("step", lambda m, p, h: (m.update(num_timesteps=999999), m["state"].update(
        num_timesteps=999999)), "state.json is of step 999999, not of the folder's step 384"),
]


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in CHECKPOINT_CASES],
                         ids=[c[0] for c in CHECKPOINT_CASES])
def test_forged_checkpoint_index_is_one_line(
    change: Callable[[dict, Path, str], None], expected: str, latest: Path,
    finished_run: FinishedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    secret, digest = outside_file(tmp_path)
    edit_state(latest, lambda meta: change(meta, secret, digest))
    before = tree_state(finished_run.experiments)
    code = cli.main(["train", f"resume={finished_run.run_id}", "total_timesteps=512"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"workbench: error: resume={finished_run.run_id}: checkpoint "
                          "checkpoints/step-000000000384 is corrupt: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert expected in err, err
    assert tree_state(finished_run.experiments) == before, "nothing may be written"
    assert MlflowClient(finished_run.uri).get_run(finished_run.run_id).info.status == "FINISHED"


def test_deeply_nested_state_json_is_corrupt_not_a_crash(latest: Path) -> None:
    (latest / "state.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(checkpoint.CorruptCheckpoint, match="state.json is truncated or not JSON"):
        checkpoint.read_files(latest)


def test_checkpoint_file_linked_out_of_its_folder_is_refused(
    latest: Path, tmp_path: Path
) -> None:
    """A local folder (read_files reads what it is given) whose config.yaml links elsewhere,
    with the hash of what it links to."""
    outside = tmp_path / "config.yaml"
    outside.write_bytes((latest / "config.yaml").read_bytes())
    (latest / "config.yaml").unlink()
    (latest / "config.yaml").symlink_to(outside)
    with pytest.raises(checkpoint.CorruptCheckpoint,
                       match="config.yaml points outside the checkpoint folder"):
        checkpoint.read_files(latest)


def test_missing_state_json_is_an_incomplete_checkpoint(latest: Path) -> None:
    (latest / "state.json").unlink()
    with pytest.raises(checkpoint.CorruptCheckpoint,
                       match=r"^state.json is missing \(incomplete checkpoint\)$"):
        checkpoint.read_files(latest)
