"""Manifest tier: schema, this machine's facts, git states, secret scrubbing, diff, CLI.

``assert_manifest_schema`` is the manifest contract of docs/tracking.md as a reusable check: other
tests (papermill sweeps, notebooks) import it from here.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient
from workbench import cli, config
from workbench.tracking import manifest, manifest_diff, manifest_lock
from workbench.tracking.redaction import (
    is_secret_name,
    remote_without_credentials,
    scrub,
    scrub_command,
    scrub_text,
    scrub_yaml,
    secret_values,
)
from workbench.tracking.store import ensure_experiment, make_client

from .conftest import ROOT, TINY, run_cli
from .trained_run import FinishedRun

REQUIRED_PACKAGES = (
    "torch", "stable-baselines3", "gymnasium", "mujoco", "mlflow", "hydra-core", "papermill",
    "numpy",
)
GPU_KEYS = {"index", "name", "memory_bytes", "driver", "uuid", "compute_capability"}
RUN_STARTERS = {"cli", "notebook", "papermill", "python"}


def _optional(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or isinstance(value, kind)


def assert_manifest_schema(d: Mapping[str, Any]) -> None:
    """Every key docs/tracking.md promises is present with its type; the manifest is plain JSON."""
    assert list(d) == list(manifest.TOP_LEVEL_KEYS), list(d)
    assert json.loads(json.dumps(d)) == d
    assert datetime.fromisoformat(d["created_at"]).utcoffset() is not None

    py = d["python"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", py["version"]), py
    assert isinstance(py["implementation"], str) and isinstance(py["executable"], str)

    packages = d["packages"]
    assert set(REQUIRED_PACKAGES) <= set(packages), packages
    assert all(isinstance(packages[name], str) for name in REQUIRED_PACKAGES), packages
    assert all(_optional(v, str) for v in packages.values()), packages
    freeze = d["pip_freeze"]
    assert isinstance(freeze, list)
    assert all(isinstance(line, str) and "==" in line for line in freeze)
    names = [line.split("==")[0] for line in freeze]
    assert names == sorted(set(names))  # one line per distribution, by name like pip freeze
    assert f"torch=={packages['torch']}" in freeze

    os_ = d["os"]
    assert set(os_) == {"system", "kernel", "kernel_version", "machine", "distribution", "libc"}
    assert all(isinstance(os_[k], str) and os_[k] for k in ("system", "kernel", "machine"))
    assert _optional(os_["distribution"], str) and _optional(os_["libc"], str)

    hw = d["hardware"]
    assert _optional(hw["cpu_model"], str) and _optional(hw["board"], str)
    assert isinstance(hw["logical_cores"], int) and hw["logical_cores"] >= 1
    assert _optional(hw["physical_cores"], int)
    assert isinstance(hw["available_cores"], int) and hw["available_cores"] >= 1
    assert isinstance(hw["memory_bytes"], int) and hw["memory_bytes"] > 0
    assert isinstance(hw["gpus"], list)
    for gpu in hw["gpus"]:
        assert set(gpu) == GPU_KEYS, gpu
        assert isinstance(gpu["name"], str) and isinstance(gpu["memory_bytes"], int)
        assert _optional(gpu["driver"], str)

    cuda = d["cuda"]
    assert set(cuda) == {"torch_cuda", "cudnn", "driver", "driver_cuda", "available",
                         "device_count"}
    assert all(_optional(cuda[k], str) for k in ("torch_cuda", "cudnn", "driver", "driver_cuda"))
    assert isinstance(cuda["available"], bool) and isinstance(cuda["device_count"], int)
    if not cuda["available"]:
        assert cuda["device_count"] == 0

    git = d["git"]
    assert set(git) == {"commit", "branch", "dirty", "dirty_files", "remote"}
    assert git["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", git["commit"]), git
    assert _optional(git["branch"], str) and _optional(git["remote"], str)
    assert _optional(git["dirty"], bool) and _optional(git["dirty_files"], list)
    assert git["dirty"] is (None if git["dirty_files"] is None else bool(git["dirty_files"]))

    run = d["run"]
    assert run["started_by"] in RUN_STARTERS, run
    assert _optional(run["command"], str) and _optional(run["notebook"], str)
    assert _optional(run["papermill_parameters"], dict)
    assert isinstance(run["overrides"], list) and all(isinstance(o, str) for o in run["overrides"])
    assert _optional(run["seed"], int) and not isinstance(run["seed"], bool)
    assert isinstance(run["hostname"], str) and run["hostname"]
    assert isinstance(run["deterministic"], bool)
    assert isinstance(run["environment"], dict)
    assert _optional(run["run_id"], str)


def git_out(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in manifest.GIT_LOCATION_VARS}
    return subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", *args],
        cwd=cwd, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()


def has_gpu() -> bool:
    return torch.cuda.is_available() or Path("/proc/driver/nvidia/version").exists()


# --------------------------------------------------------------------------- collection


def test_collected_manifest_describes_this_machine() -> None:
    m = manifest.collect_manifest({"overrides": ["seed=3"]}, seed=3)
    assert_manifest_schema(m)
    for name in REQUIRED_PACKAGES:
        assert m["packages"][name] == metadata.version(name), name
    assert f"stable-baselines3=={metadata.version('stable-baselines3')}" in m["pip_freeze"]
    assert m["python"]["version"] == platform.python_version()
    assert m["os"]["kernel"] == platform.release()
    assert m["hardware"]["logical_cores"] == os.cpu_count()
    assert m["hardware"]["memory_bytes"] == psutil.virtual_memory().total
    assert m["cuda"]["torch_cuda"] == torch.version.cuda
    assert m["git"]["commit"] == git_out(ROOT, "rev-parse", "HEAD")
    assert m["run"]["seed"] == 3 and m["run"]["overrides"] == ["seed=3"]
    assert m["run"]["hostname"] == socket.gethostname()
    assert m["run"]["started_by"] == "python"  # pytest, not the workbench CLI


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU path; this machine has a GPU")
def test_no_gpu_empty_list_and_null_cuda() -> None:
    m = manifest.collect_manifest()
    assert m["hardware"]["gpus"] == []
    assert m["cuda"]["available"] is False and m["cuda"]["device_count"] == 0
    assert (m["cuda"]["driver"], m["cuda"]["driver_cuda"], m["cuda"]["cudnn"]) == (None,) * 3
    tags = manifest.headline_tags(m)
    assert (tags["gpu"], tags["cuda"]) == ("none", "none")


@pytest.mark.unit
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_listed_with_driver() -> None:
    m = manifest.collect_manifest()
    assert len(m["hardware"]["gpus"]) >= torch.cuda.device_count()
    assert m["hardware"]["gpus"][0]["name"] == torch.cuda.get_device_name(0)
    assert m["cuda"]["driver"] and m["cuda"]["torch_cuda"] == torch.version.cuda


def test_outside_a_git_work_tree_git_is_null(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # A GIT_DIR inherited from a shell or hook must not be mistaken for the project's repo.
    monkeypatch.setenv("GIT_DIR", str(ROOT / ".git"))
    assert manifest.collect_git(tmp_path) == {
        "commit": None, "branch": None, "dirty": None, "dirty_files": None, "remote": None,
    }
    env = {k: v for k, v in os.environ.items() if k != "GIT_DIR"}
    env["WORKBENCH_ROOT"] = str(tmp_path)  # the "checkout" is a plain folder
    proc = subprocess.run([sys.executable, "-m", "workbench", "manifest"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)
    assert_manifest_schema(m)
    assert set(m["git"].values()) == {None}
    assert m["run"]["started_by"] == "cli" and m["run"]["command"] == "workbench manifest"
    assert m["run"]["cwd"] == str(tmp_path)
    assert "git_commit" not in manifest.headline_tags(m)


@pytest.fixture()
def dirty_repo(tmp_path: Path) -> Path:
    """A git repo with one commit, a credentialed remote, a modified file and an untracked one."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git_out(repo, "init", "-q", "-b", "main")
    (repo / "policy.py").write_text("LR = 3e-4\n")
    git_out(repo, "add", "policy.py")
    git_out(repo, "commit", "-q", "-m", "first")
    git_out(repo, "remote", "add", "origin", "https://bob:ghp_RemoteTok42x@example.com/o/r.git")
    (repo / "policy.py").write_text("LR = 1e-3\n")
    (repo / "notes.txt").write_text("scratch\n")
    return repo


def test_dirty_tree_state_and_diff(dirty_repo: Path) -> None:
    git = manifest.collect_git(dirty_repo)
    assert git == {
        "commit": git_out(dirty_repo, "rev-parse", "HEAD"),
        "branch": "main",
        "dirty": True,
        "dirty_files": ["policy.py"],
        "remote": "https://example.com/o/r.git",
    }
    diff = manifest.git_diff(dirty_repo)
    assert diff is not None
    assert diff.splitlines()[:2] == [
        f"# workbench: uncommitted changes of tracked files against {git['commit']}",
        "# untracked files, not included: notes.txt",
    ]
    assert "-LR = 3e-4" in diff and "+LR = 1e-3" in diff
    # The stored diff recovers the code: applied to a clean checkout it gives the same file.
    git_out(dirty_repo, "stash", "-q")
    (dirty_repo / "change.diff").write_text(diff)
    git_out(dirty_repo, "apply", "change.diff")
    assert (dirty_repo / "policy.py").read_text() == "LR = 1e-3\n"


def test_dirty_files_named_in_manifest_and_tag(dirty_repo: Path) -> None:
    # Staged, unstaged, moved (both names) and spaced paths are named; untracked files not.
    (dirty_repo / "train loop.py").write_text("STEPS = 1\n")
    (dirty_repo / "old.py").write_text("X = 1\n")
    git_out(dirty_repo, "add", "train loop.py", "old.py")
    git_out(dirty_repo, "commit", "-q", "-m", "more")
    (dirty_repo / "train loop.py").write_text("STEPS = 2\n")
    git_out(dirty_repo, "mv", "old.py", "new.py")
    git = manifest.collect_git(dirty_repo)
    assert git["dirty"] is True
    assert git["dirty_files"] == ["new.py", "old.py", "policy.py", "train loop.py"]
    tags = manifest.headline_tags({**manifest.collect_manifest(root=dirty_repo), "git": git})
    assert tags["git_dirty"] == "true"
    assert tags["git_dirty_files"] == "4 files: new.py, old.py, policy.py, ..."
    assert manifest.dirty_summary(["a", "b", "c", "d"]) == "4 files: a, b, c, ..."
    git_out(dirty_repo, "commit", "-q", "-am", "clean")
    clean = manifest.collect_git(dirty_repo)
    assert (clean["dirty"], clean["dirty_files"]) == (False, [])


def test_notebook_outputs_leave_tree_clean_with_repo_filter(tmp_path: Path) -> None:
    """A JupyterLab session saves outputs into a committed notebook: with the repository's
    .gitattributes and `make git-filter` (as `make setup` runs it), git and the manifest see
    no change; a changed cell source still is one. The checkout and the interpreter sit under
    paths with spaces and non-ASCII characters, as a user's may."""
    repo = tmp_path / "新 实验" / "repo"
    venv = tmp_path / "the venv" / "新 实验"  # the interpreter's environment, reached by a link
    venv.parent.mkdir()
    venv.symlink_to(sys.prefix, target_is_directory=True)
    (repo / "notebooks").mkdir(parents=True)
    git_out(repo, "init", "-q", "-b", "main")
    (repo / ".gitattributes").write_text((ROOT / ".gitattributes").read_text())
    notebook = repo / "notebooks" / "train.ipynb"
    notebook.write_text((ROOT / "notebooks" / "train.ipynb").read_text())
    made = subprocess.run(
        ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-C", str(repo),
         "git-filter", f"PY={venv / 'bin' / 'python'}"], check=True, capture_output=True,
        text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k not in manifest.GIT_LOCATION_VARS})
    clean = git_out(repo, "config", "filter.nbstripout.clean")
    assert str(venv) in clean, (clean, made.stdout, made.stderr)
    git_out(repo, "add", ".")
    git_out(repo, "commit", "-q", "-m", "notebooks")
    cells = json.loads(notebook.read_text())
    first_code = next(c for c in cells["cells"] if c["cell_type"] == "code")
    first_code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["x" * 1000]}]
    first_code["execution_count"] = 7
    cells["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}  # a Lab save
    notebook.write_text(json.dumps(cells, indent=1))
    started = time.monotonic()
    git = manifest.collect_git(repo)
    took = time.monotonic() - started
    if git["dirty"]:  # what the filter made of it, to tell a failing filter from a real change
        filtered = subprocess.run(clean, shell=True, cwd=repo, input=notebook.read_text(),
                                  capture_output=True, text=True, timeout=120)
        raise AssertionError(
            f"dirty {git['dirty_files']} after {took:.1f} s; the filter alone: exit "
            f"{filtered.returncode}, stderr {filtered.stderr[-1500:]!r}; git diff --stat: "
            f"{git_out(repo, 'diff', '--stat')!r}")
    assert git["dirty_files"] == [], git
    assert manifest.git_diff(repo) is None
    first_code["source"] = ["seed = 5\n"]
    notebook.write_text(json.dumps(cells, indent=1))
    git = manifest.collect_git(repo)
    assert (git["dirty"], git["dirty_files"]) == (True, ["notebooks/train.ipynb"])
    diff = manifest.git_diff(repo)
    assert diff is not None and "seed = 5" in diff and "x" * 1000 not in diff


def test_record_manifest_notebook_run_info_into_store(store: Path, dirty_repo: Path) -> None:
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = make_client(uri)
    experiment = ensure_experiment(client, "manifest-test", uri)
    run_id = client.create_run(experiment, tags={"gpu": "set-by-caller"}).info.run_id
    run_info = {
        "notebook": "notebooks/train.ipynb",
        "papermill_parameters": {"seed": 1, "n_steps": 64, "hf_token": "hf_nbParamTok77"},
        "overrides": ["seed=1", "algo.n_steps=64"],
    }
    recorded = manifest.record_manifest(client, run_id, run_info, seed=1, root=dirty_repo,
                                        keep_tags=["gpu"])
    stored = json.loads(Path(client.download_artifacts(run_id, "manifest.json", str(store)))
                        .read_text())
    assert stored == recorded
    assert_manifest_schema(stored)
    assert stored["run"]["started_by"] == "papermill"
    assert stored["run"]["notebook"] == "notebooks/train.ipynb"
    assert stored["run"]["papermill_parameters"] == {"seed": 1, "n_steps": 64, "hf_token": "***"}
    assert stored["run"]["overrides"] == ["seed=1", "algo.n_steps=64"]
    assert (stored["run"]["seed"], stored["run"]["run_id"]) == (1, run_id)
    assert stored["run"]["command"] is None  # a kernel's argv is its launcher, not a command
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert artifacts == {"manifest.json", "git.diff"}
    tags = client.get_run(run_id).data.tags
    assert tags["git_dirty"] == "true" and tags["git_commit"] == stored["git"]["commit"]
    assert tags["git_dirty_files"] == "1 file: policy.py"
    assert stored["git"]["dirty_files"] == ["policy.py"]
    assert tags["gpu"] == "set-by-caller"  # a tag the caller set on purpose is kept
    assert tags["torch"] == metadata.version("torch")

    git_out(dirty_repo, "commit", "-q", "-am", "second")  # clean tree: no git.diff
    clean_run = client.create_run(experiment).info.run_id
    manifest.record_manifest(client, clean_run, None, root=dirty_repo)
    assert {a.path for a in client.list_artifacts(clean_run)} == {"manifest.json"}
    assert client.get_run(clean_run).data.tags["git_dirty"] == "false"


# --------------------------------------------------------------------------- secrets


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "secret"),
    [("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("MLFLOW_TRACKING_PASSWORD", True),
     ("AWS_REGION", True), ("OPENAI_API_KEY", True), ("db_password", True),
     ("GITHUB_SECRET", True), ("PWD", False), ("HOME", False), ("CUDA_VISIBLE_DEVICES", False),
     ("MLFLOW_TRACKING_URI", False)],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


@pytest.mark.unit
def test_scrubbing_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok_Secret_4242")
    monkeypatch.setenv("SHORT_KEY", "1")  # too short to hunt in text; still never recorded
    secrets = secret_values()
    assert "tok_Secret_4242" in secrets and "1" not in secrets
    assert scrub_text("postgresql://bob:pw@db:5432/m") == "postgresql://bob:***@db:5432/m"
    assert scrub_text("redis://:pw@cache/0") == "redis://:***@cache/0"
    assert scrub_text("sqlite:////tmp/x/mlflow.db") == "sqlite:////tmp/x/mlflow.db"
    assert scrub_text("note=tok_Secret_4242!") == "note=***!"
    assert (scrub_command("train +tracking.tags.api_key=abc seed=1")
            == "train +tracking.tags.api_key=*** seed=1")
    assert scrub_command("tokenizers==0.15.2") == "tokenizers==0.15.2"
    assert scrub({"a": {"password": "x", "n": 3, "token_budget": None}, "l": ["u"]}) == {
        "a": {"password": "***", "n": 3, "token_budget": None}, "l": ["u"],
    }
    assert (remote_without_credentials("https://x-access-token:ghs_1@github.com/o/r")
            == "https://github.com/o/r")
    assert remote_without_credentials("git@github.com:o/r.git") == "git@github.com:o/r.git"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("NVIDIA_API_KEY", "nv_Secret_99")
    env = manifest.recorded_environment()
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "NVIDIA_API_KEY" not in env


SECRET_ENV = {
    "HF_TOKEN": "hf_wbTestTok3n9Q7xZ",
    "MLFLOW_TRACKING_PASSWORD": "mlfPw-7Rk2Lq9Wd",
    "AWS_SECRET_ACCESS_KEY": "awsSecr3tZz81KqPp",
    "AWS_ACCESS_KEY_ID": "AKIAWBTEST0042QX",
    "WORKBENCH_TEST_API_KEY": "apiKey_5Vn8Hc2Tt",
    "DB_PASSWORD": "dbPass_Qw3rty99",
    "TORCH_AUTH_TOKEN": "torchTok_Ab12Cd34",  # TORCH_* is recorded; this name never is
}
URI_PASSWORD = "pgPw7731xqZ"
TAG_SECRET = "tagTok_8Jm3Rr5"


def test_cli_run_records_manifest_and_leaks_no_secret(store: Path) -> None:
    overrides = [
        *TINY,
        f"tracking.uri=postgresql://bob:{URI_PASSWORD}@db.example:5432/mlflow",  # env URI wins
        f"+tracking.tags.note={SECRET_ENV['WORKBENCH_TEST_API_KEY']}",  # a secret pasted by hand
        f"+tracking.tags.service_token={TAG_SECRET}",  # a credential-named key
    ]
    proc = run_cli("train", *overrides, env=SECRET_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = proc.stdout.strip().splitlines()[-1]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(run_id)

    root = Path(client.download_artifacts(run_id, "", str(store / "download")))
    m = json.loads((root / "manifest.json").read_text())
    assert_manifest_schema(m)
    assert (root / "model" / "manifest.json").read_text() == (root / "manifest.json").read_text()
    assert m["run"]["started_by"] == "cli" and m["run"]["seed"] == 0
    assert m["run"]["run_id"] == run_id and m["run"]["hostname"] == socket.gethostname()
    assert m["run"]["overrides"] == [
        *TINY,
        "tracking.uri=postgresql://bob:***@db.example:5432/mlflow",
        "+tracking.tags.note=***",
        "+tracking.tags.service_token=***",
    ]
    assert m["run"]["command"] == "workbench train " + " ".join(m["run"]["overrides"])
    assert "TORCH_AUTH_TOKEN" not in m["run"]["environment"]
    assert ("git.diff" in os.listdir(root)) is bool(m["git"]["dirty"])

    tags = run.data.tags
    assert tags["torch"] == metadata.version("torch")
    assert tags["sb3"] == metadata.version("stable-baselines3")
    assert tags["mujoco"] == metadata.version("mujoco")
    assert tags["gymnasium"] == metadata.version("gymnasium")
    assert tags["cuda"] == (torch.version.cuda or "none")
    assert tags["gpu"] == manifest.gpu_summary(m["hardware"]["gpus"])
    if m["git"]["commit"] is not None:
        assert tags["git_commit"] == m["git"]["commit"]
        assert tags["git_dirty"] == str(m["git"]["dirty"]).lower()
    assert (tags["note"], tags["service_token"]) == ("***", "***")
    params = run.data.params
    assert params["tracking.uri"] == "postgresql://bob:***@db.example:5432/mlflow"
    assert params["tracking.tags.service_token"] == "***"
    assert "uri: postgresql://bob:***@db.example:5432/mlflow" in (root / "config.yaml").read_text()

    # No secret value anywhere: every file of the store (SQLite database, artifacts), the
    # downloaded copies, and everything the command printed.
    values = [*SECRET_ENV.values(), URI_PASSWORD, TAG_SECRET]
    files = [p for p in store.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in files) and len(files) > 5
    for path in files:
        data = path.read_bytes()
        leaked = [v for v in values if v.encode() in data]
        assert not leaked, (path, leaked)
    printed = proc.stdout + proc.stderr
    assert not [v for v in values if v in printed]


# --------------------------------------------------------------------------- diff


def _write_source(folder: Path, m: Mapping[str, Any], overrides: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(manifest.to_json(m))
    cfg = config.load_config([*TINY, *overrides])
    (folder / "config.yaml").write_text(scrub_yaml(config.to_dict(cfg)))
    return folder


@pytest.fixture()
def two_sources(tmp_path: Path) -> tuple[Path, Path, str]:
    """Two run folders: B has another torch build, another commit, another n_steps."""
    base = manifest.collect_manifest(seed=0)
    changed = copy.deepcopy(base)
    old_torch = base["packages"]["torch"]
    changed["packages"]["torch"] = "2.12.1+cu126"
    changed["pip_freeze"] = sorted(
        "torch==2.12.1+cu126" if line.startswith("torch==") else line
        for line in base["pip_freeze"]
    )
    changed["git"]["commit"] = "0" * 40
    changed["created_at"] = "2030-01-01T00:00:00+00:00"  # not a difference
    changed["run"]["command"] = "something else"  # not a difference
    a = _write_source(tmp_path / "a", base, [])
    b = _write_source(tmp_path / "b", changed, ["algo.n_steps=128", "algo.batch_size=128"])
    return a, b, old_torch


def test_diff_finds_package_git_and_config_changes(two_sources: tuple[Path, Path, str]) -> None:
    a, b, old_torch = two_sources
    base = json.loads((a / "manifest.json").read_text())
    diffs = manifest_diff.diff_sources(manifest_diff.load_source(str(a), str),
                                  manifest_diff.load_source(str(b / "manifest.json"), str))
    assert [(d.section, d.key, d.a, d.b) for d in diffs] == [
        ("packages", "torch", old_torch, "2.12.1+cu126"),
        ("git", "commit", base["git"]["commit"], "0" * 40),
        ("config", "algo.batch_size", "64", "128"),
        ("config", "algo.n_steps", "64", "128"),
    ]


def test_diff_cli_exit_codes_and_formats(bare_store: Path, two_sources: tuple[Path, Path, str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    a, b, old_torch = two_sources
    text = run_cli("manifest", "diff", str(a), str(b))  # the real program, once
    assert text.returncode == 1, text.stderr
    assert re.search(rf"^packages\s+torch\s+{re.escape(old_torch)}\s+2\.12\.1\+cu126$",
                     text.stdout, re.M), text.stdout
    assert re.search(r"^config\s+algo\.n_steps\s+64\s+128$", text.stdout, re.M)
    assert text.stdout.splitlines()[-1] == "4 differences: packages 1, git 1, config 2"

    assert cli.main(["manifest", "diff", str(a), str(a / "manifest.json")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("identical")
    assert cli.main(["manifest", "diff", str(a), str(b), "--format", "json"]) == 1
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["identical"] is False and len(as_json["differences"]) == 4
    assert cli.main(["manifest", "diff", str(a), str(b), "--format", "md"]) == 1
    assert "| config | algo.n_steps | 64 | 128 |" in capsys.readouterr().out

    proc = run_cli("manifest", "diff", str(a), "0123456789abcdef0123456789abcdef")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("workbench: error: 0123456789abcdef0123456789abcdef:")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    missing = str(a / "nope" / "manifest.json")
    assert cli.main(["manifest", "diff", missing, str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench: error: {missing}:") and err.count("\n") == 1
    assert not bare_store.exists()  # a bad run id never creates the store


def test_cli_manifest_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["manifest", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Environment manifest (")
    assert f"| torch | {metadata.version('torch')} |" in out
    for heading in ("## Packages", "## Operating system", "## Hardware", "### GPUs", "## CUDA",
                    "## Git", "## Run"):
        assert heading in out


@pytest.mark.slow
def test_notebook_kernel_is_detected_without_run_info(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A real papermill execution in a real Jupyter kernel: started_by, notebook, no argv."""
    import nbformat
    import papermill

    source = tmp_path / "probe.ipynb"
    out_file = tmp_path / "manifest.json"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python",
                                 "display_name": "Python 3"}
    params = nbformat.v4.new_code_cell("out = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "from pathlib import Path\nfrom workbench.tracking import manifest\n"
        "Path(out).write_text(manifest.to_json(manifest.collect_manifest(seed=5)))"
    )]
    nbformat.write(nb, source)
    # JupyterLab gives each kernel its notebook path this way; ipykernel exposes it.
    monkeypatch.setenv("JPY_SESSION_NAME", "notebooks/probe.ipynb")
    papermill.execute_notebook(str(source), str(tmp_path / "executed.ipynb"),
                               parameters={"out": str(out_file)}, kernel_name="python3",
                               progress_bar=False)
    m = json.loads(out_file.read_text())
    assert_manifest_schema(m)
    run = m["run"]
    assert (run["started_by"], run["notebook"], run["command"], run["seed"]) == (
        "notebook", "notebooks/probe.ipynb", None, 5)


# --------------------------------------------------------------------------- lock


def requirement_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith(("#", "-"))]


def test_lock_recreates_a_recorded_run(finished_run: FinishedRun, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A real run's manifest, through the CLI, into a file pip reads."""
    from packaging.requirements import Requirement

    finished_run.use(monkeypatch)
    recorded = json.loads((finished_run.artifacts() / "manifest.json").read_text())
    out = tmp_path / "requirements-run.txt"
    assert cli.main(["manifest", "lock", finished_run.run_id, "-o", str(out)]) == 0
    pins = requirement_lines(out.read_text())
    printed = capsys.readouterr().out
    assert printed == f"wrote {out}: {len(pins)} pinned packages for run {finished_run.run_id} " \
        f"({MlflowClient(finished_run.uri).get_run(finished_run.run_id).info.run_name})\n"
    # Every recorded distribution, exactly pinned, but the workbench (this checkout) and pip.
    assert pins == [line for line in recorded["pip_freeze"]
                    if not line.startswith(("workbench==", "pip=="))]
    assert all(str(Requirement(p).specifier).startswith("==") for p in pins)
    assert f"torch=={recorded['packages']['torch']}" in pins
    text = out.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[0].startswith(f"# The Python environment of run {finished_run.run_id} (")
    assert f"# python {platform.python_version()} (CPython)" in header
    torch_version = recorded["packages"]["torch"]
    if recorded["cuda"]["torch_cuda"] is None:
        assert f"# torch {torch_version}: the CPU build (no CUDA)" in header
    else:
        assert f"# torch {torch_version}: CUDA {recorded['cuda']['torch_cuda']}" in text
    build = torch_version.partition("+")[2]
    index_lines = [line for line in text.splitlines() if line.startswith("--")]
    assert index_lines == ([f"--extra-index-url https://download.pytorch.org/whl/{build}"]
                           if build else [])
    assert f"commit {recorded['git']['commit']}" in text or recorded["git"]["commit"] is None
    # To stdout without -o, the same text.
    assert cli.main(["manifest", "lock", finished_run.run_id]) == 0
    assert capsys.readouterr().out == text


@pytest.mark.unit
def test_lock_names_the_cuda_build_and_its_index(tmp_path: Path) -> None:
    m = {
        "created_at": "2030-01-01T00:00:00+00:00",
        "python": {"version": "3.11.9", "implementation": "CPython", "executable": "x"},
        "pip_freeze": ["mlflow==3.17.2", "nvidia-cublas-cu12==12.8.4.1", "pip==24.0",
                       "torch==2.13.0+cu128", "workbench==0.1.0"],
        "os": {"system": "Linux", "machine": "x86_64", "libc": "glibc 2.28"},
        "hardware": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 2},
        "cuda": {"torch_cuda": "12.8", "cudnn": "91002", "driver": "570.86.15",
                 "driver_cuda": "12.8"},
        "git": {"commit": "a" * 40, "dirty": True},
    }
    text = manifest_lock.lock_requirements(m, "run abc (hopper)").text
    assert text.splitlines()[6:] == [
        "--extra-index-url https://download.pytorch.org/whl/cu128",
        "mlflow==3.17.2", "nvidia-cublas-cu12==12.8.4.1", "torch==2.13.0+cu128",
    ]
    assert ("# torch 2.13.0+cu128: CUDA 12.8, cuDNN 91002; ran on driver 570.86.15 (CUDA 12.8), "
            "NVIDIA H100 80GB HBM3") in text
    assert "#   python3.11 -m venv .venv" in text
    assert f"in a checkout of commit {'a' * 40} (the run had uncommitted changes" in text
    assert "on Linux, x86_64, glibc 2.28" in text
    pypi = manifest_lock.lock_requirements(
        {**m, "pip_freeze": ["torch==2.13.0"], "cuda": {"torch_cuda": "13.0"}}, "x").text
    assert "--extra-index-url" not in pypi and "CUDA 13.0, PyPI's default wheel" in pypi


def test_lock_bad_input_is_one_line(bare_store: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["manifest", "lock", "0123456789abcdef", "-o",
                     str(tmp_path / "missing" / "r.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench: error: -o {tmp_path / 'missing' / 'r.txt'}: not a file")
    assert err.count("\n") == 1
    assert cli.main(["manifest", "lock", "0123456789abcdef"]) == 2
    assert capsys.readouterr().err.startswith("workbench: error: 0123456789abcdef:")
    assert not bare_store.exists()  # a bad run id never creates the store
