"""Hugging Face Hub push/pull of a tiny real run's policy bundle, through huggingface_hub's own
code (HfApi.create_repo/create_commit, snapshot_download).

The real Hub is unreachable from these machines (only PyPI, Debian and npm are), so:
- push goes to a stand-in HTTP server on 127.0.0.1 (``HF_ENDPOINT``) that answers the four
  endpoints ``create_repo`` + ``create_commit`` call and records what it receives;
- pull reads a local Hub cache pre-populated in huggingface_hub's documented layout
  (``models--org--name/{blobs,snapshots/<commit>,refs/<tag>}``) with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shlex
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import numpy as np
import onnx
import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file
from stable_baselines3 import PPO
from workbench import cli, config
from workbench.config import ConfigError
from workbench.deploy import contract, hub, runner
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_envs
from workbench.training import bundle_format, load_config, train
from workbench.training.model import build_model

from .conftest import embedded_store, run_cli
from .support.hub import offline_cache, populate_cache
from .trained_run import HF_TEST_TOKEN, NORMALIZED, ExportedPolicy

TOKEN = HF_TEST_TOKEN
REPO = "test-org/tiny-ppo"
BUNDLE = {"README.md", "bundle.json", "config.yaml", "export_report.json",
          "normalization.json", "policy.onnx", "runner.py", "samples.npz",
          "weights.safetensors", "replay.mp4"}


# --------------------------------------------------------------------------- stand-in Hub


@dataclass
class StandInHub:
    """The Hub endpoints behind ``HfApi.create_repo`` and ``HfApi.create_commit``.

    Every file is declared a regular (non-LFS) upload in the preupload answer, so the commit
    carries the files' bytes inline (base64 in the NDJSON commit payload) and the stand-in
    sees exactly what was uploaded.
    """

    url: str = ""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    repos: list[dict[str, Any]] = field(default_factory=list)
    commits: list[dict[str, Any]] = field(default_factory=list)

    def handle(self, method: str, path: str, auth: str | None, body: bytes) -> tuple[int, Any]:
        self.requests.append((method, path, auth))
        parts = path.split("?")[0].strip("/").split("/")
        if method == "POST" and parts == ["api", "repos", "create"]:
            payload = json.loads(body)
            self.repos.append(payload)
            return 200, {"url": f"{self.url}/{payload['organization']}/{payload['name']}"}
        if method == "POST" and parts == ["api", "validate-yaml"]:
            return 200, {"errors": [], "warnings": []}
        if method == "POST" and parts[:2] == ["api", "models"] and parts[4:5] == ["preupload"]:
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                    "shouldIgnore": False, "oid": None} for f in files]}
        if method == "POST" and parts[:2] == ["api", "models"] and parts[4:5] == ["commit"]:
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            files = {entry["value"]["path"]: base64.b64decode(entry["value"]["content"])
                     for entry in lines if entry["key"] == "file"}
            oid = hashlib.sha1(body).hexdigest()
            repo = f"{parts[2]}/{parts[3]}"
            self.commits.append({"repo": repo, "header": lines[0]["value"], "files": files,
                                 "oid": oid, "revision": parts[5]})
            return 200, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid,
                         "pullRequestUrl": None}
        return 404, {"error": f"{method} {path} is not part of the stand-in"}


@pytest.fixture()
def stand_in_hub() -> Iterator[StandInHub]:
    state = StandInHub()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code, answer = state.handle(self.command, self.path,
                                        self.headers.get("Authorization"), body)
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_HEAD = _serve

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


# --------------------------------------------------------------------------- a tiny exported run


@dataclass
class Run:
    run_id: str
    client: MlflowClient
    store: Path


@pytest.fixture(scope="module")
def exported_run(exported_policy: ExportedPolicy) -> Iterator[Run]:
    """The session's exported tiny run (tests/trained_run.py; recorded with the token in
    the environment), its store in the environment while this module runs."""
    with embedded_store(exported_policy.experiments) as patch:
        patch.setenv("HF_TOKEN", TOKEN)
        yield Run(exported_policy.run_id, MlflowClient(exported_policy.uri),
                  exported_policy.experiments)


def hub_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment of a workbench subprocess: its own HF home/cache, the test token."""
    return {"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": TOKEN, **extra}


def bundle_files(run: Run, tmp_path: Path) -> dict[str, bytes]:
    folder = tmp_path / "built" / "bundle"
    hub.write_bundle(run.client, run.run_id, folder)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def assert_no_token(*texts: str, folders: tuple[Path, ...] = ()) -> None:
    for text in texts:
        assert TOKEN not in text
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert TOKEN.encode() not in path.read_bytes(), path


# --------------------------------------------------------------------------- push


def test_push_uploads_bundle_card_and_tags_run(
    exported_run: Run, stand_in_hub: StandInHub, tmp_path: Path
) -> None:
    proc = run_cli("hub", "push", "--run", exported_run.run_id, "--repo-id", REPO,
                   env=hub_env(tmp_path, HF_ENDPOINT=stand_in_hub.url))
    assert proc.returncode == 0, proc.stderr
    (commit,) = stand_in_hub.commits
    assert proc.stdout.strip().splitlines()[-1] == commit["oid"]
    assert (commit["repo"], commit["revision"]) == (REPO, "main")
    assert stand_in_hub.repos == [{"name": "tiny-ppo", "organization": "test-org",
                                   "visibility": "private"}]
    has_manifest = "manifest.json" in {a.path for a in exported_run.client.list_artifacts(
        exported_run.run_id)}
    assert set(commit["files"]) == BUNDLE | ({"manifest.json"} if has_manifest else set())
    if has_manifest:  # the manifest helper records one with every run
        manifest = json.loads(commit["files"]["manifest.json"])
        assert manifest["packages"]["torch"] == torch.__version__
    # Every request carried the token, as huggingface_hub's own header (nothing else reads it).
    authorized = [auth for method, _, auth in stand_in_hub.requests if method == "POST"]
    assert authorized and set(authorized) == {f"Bearer {TOKEN}"}

    run = exported_run.client.get_run(exported_run.run_id)
    assert run.data.tags["hub.repo_id"] == REPO
    assert run.data.tags["hub.revision"] == commit["oid"]

    files = commit["files"]
    index = json.loads(files["bundle.json"])
    assert index["files"] == {n: hashlib.sha256(files[n]).hexdigest()
                              for n in files if n != "bundle.json"}
    inside = {p.key: p.value for p in onnx.load_from_string(files["policy.onnx"]).metadata_props}
    assert index["contract"] == json.loads(inside[runner.CONTRACT_KEY])
    assert files["runner.py"] == contract.runner_source()
    card = files["README.md"].decode()
    mean, std = (run.data.metrics["summary/eval_mean_reward"],
                 run.data.metrics["summary/eval_std_reward"])
    for expected in [
        "library_name: stable-baselines3", "# PPO on HalfCheetah-v5",
        f"**{mean:.2f} ± {std:.2f}** (mean ± std over 2 episodes)",
        "- training steps: 384", "| `algo.n_steps` | 64 |", "| `env.num_envs` | 2 |",
        "| `algo.learning_rate` | 0.0003 |", f"- torch {torch.__version__}",
        f"value: {mean:.2f} +/- {std:.2f}", exported_run.run_id,
        "From the run's manifest.json:" if has_manifest else "The run has no manifest.json",
        "## Replay", '<video controls loop muted src="replay.mp4"', "| `replay.mp4` | replay video",
        "python runner.py policy.onnx --show-contract", "`runner.py` runs the policy at the "
        "contract's rate", "(workbench-policy-contract/1: 17 observation values in 17 entries, "
        "6 actions, 20 Hz;",
        f"workbench hub pull --repo-id {REPO} --revision {hub.COMMIT_PLACEHOLDER}",
    ]:
        assert expected in card, expected
    assert files["replay.mp4"][4:8] == b"ftyp"  # the export's MP4, listed and hashed above
    replayed = json.loads(files["export_report.json"])["replay"]["video"]
    assert f"return **{replayed['return']:.2f}** over {replayed['steps']} steps" in card
    # The reproduce command composes exactly the run's configuration.
    (command,) = [line for line in card.splitlines() if line.startswith("workbench train ")]
    overrides = shlex.split(command)[2:]
    run_config = config.flatten(config.to_dict(load_config(NORMALIZED)))
    assert config.flatten(config.to_dict(load_config(overrides))) == run_config
    # Nothing executable in the bundle: no pickles, npz readable without them.
    assert not any(name.endswith((".pkl", ".zip", ".pt")) for name in files)
    assert_no_token(proc.stdout, proc.stderr, *(f.decode("latin-1") for f in files.values()),
                    folders=(exported_run.store, tmp_path))


def test_push_refuses_without_token_or_offline(
    exported_run: Run, stand_in_hub: StandInHub, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", stand_in_hub.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", "/nonexistent/token")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    argv = ["hub", "push", "--run", exported_run.run_id, "--repo-id", REPO]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ("workbench: error: hub push: no Hugging Face token; set "
                                       "HF_TOKEN or log in with `hf auth login`\n")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ("workbench: error: hub push: HF_HUB_OFFLINE is set; "
                                       "pushing needs the network, unset it\n")
    assert stand_in_hub.requests == []  # nothing was sent anywhere


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["hub"], "hub: the following arguments are required: ACTION"),
        (["hub", "push", "--repo-id", "a/b"], "hub push: one of the arguments --run --model is "
         "required"),
        (["hub", "push", "--model", "hopper-ppo", "--repo-id", "a/b"],
         "--model 'hopper-ppo': give NAME@ALIAS, e.g. hopper-ppo@on-robot"),
        (["hub", "push", "--run", "x", "--repo-id", "not a repo"],
         "repository id 'not a repo': "),
        (["hub", "push", "--run", "x", "--repo-id", "a/b", "--public=maybe"],
         "hub push: argument --public: ignored explicit argument 'maybe'"),
        (["hub", "pull", "--repo-id", "a/b"], "hub pull: the following arguments are required: "
         "--revision"),
        (["hub", "pull", "--revision", "abc"], "hub pull: the following arguments are required: "
         "--repo-id"),
        (["hub", "pull", "--repo-id", "a/b", "--revision", ""], "revision: missing for a/b"),
    ],
)
def test_bad_hub_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench: error: {message}"), err
    assert err.count("\n") == 1


# --------------------------------------------------------------------------- pull


def test_pull_offline_from_cache_by_tag_then_commit(exported_run: Run, tmp_path: Path) -> None:
    files = bundle_files(exported_run, tmp_path)
    commit = populate_cache(tmp_path / "hf-cache", REPO, files, refs={"v1": "HEAD"})
    env = hub_env(tmp_path, HF_HUB_OFFLINE="1")
    proc = run_cli("hub", "pull", "--repo-id", REPO, "--revision", "v1", env=env)
    assert proc.returncode == 0, proc.stderr
    directory = exported_run.store / "hub" / REPO / commit
    assert proc.stdout.strip().splitlines()[-1] == str(directory)
    assert f"revision 'v1' of {REPO} resolved to commit {commit}" in proc.stdout
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == files
    assert "parity     64 samples: ONNX Runtime" in proc.stdout
    assert_no_token(proc.stdout, proc.stderr, folders=(directory,))


def test_pull_by_commit_needs_no_resolving(
    exported_run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    commit = populate_cache(tmp_path / "cache", REPO, bundle_files(exported_run, tmp_path))
    offline_cache(monkeypatch, tmp_path / "cache")
    bundle = hub.pull(REPO, commit)
    assert (bundle.commit, bundle.requested_revision) == (commit, commit)
    assert bundle.directory == exported_run.store / "hub" / REPO / commit
    assert "resolved to commit" not in capsys.readouterr().out
    manifest = "present" if (bundle.directory / "manifest.json").exists() else \
        "absent (the run had none)"
    assert bundle.checks["manifest"] == manifest
    assert bundle.checks["onnx_max_abs_diff"] <= 1e-5
    assert bundle.checks["weights_max_abs_diff"] <= 1e-5


def test_pull_unknown_revision_offline_is_bad_input(
    exported_run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:

    offline_cache(monkeypatch, tmp_path / "empty-cache")
    assert cli.main(["hub", "pull", "--repo-id", REPO, "--revision", "v9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench: error: {REPO}@v9: not in the local Hub "
                          f"cache ({tmp_path / 'empty-cache'}) and HF_HUB_OFFLINE=1; pull it "
                          "once with network access"), err
    assert err.count("\n") == 1


def test_pull_rejects_an_altered_bundle(
    exported_run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = bundle_files(exported_run, tmp_path)
    with np.load(io.BytesIO(files["samples.npz"])) as samples:
        obs, actions = samples["observations"], samples["actions"]
    altered = tmp_path / "altered.npz"
    np.savez(altered, observations=obs, actions=actions + 1e-3)
    files["samples.npz"] = altered.read_bytes()
    commit = populate_cache(tmp_path / "cache", REPO, files, refs={"bad": "HEAD"})
    offline_cache(monkeypatch, tmp_path / "cache")
    assert cli.main(["hub", "pull", "--repo-id", REPO, "--revision", "bad"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("samples.npz differs from its sha256 in bundle.json")
    # Even with a matching index, parity against the shipped samples catches it.
    index = json.loads(files["bundle.json"])
    index["files"]["samples.npz"] = hashlib.sha256(files["samples.npz"]).hexdigest()
    files["bundle.json"] = json.dumps(index).encode()
    populate_cache(tmp_path / "cache", REPO, files, refs={"bad2": "HEAD"})
    with pytest.raises(hub.BundleError, match=r"ONNX Runtime differs from the shipped sample "
                                              r"actions by 1\.00e-03"):
        hub.pull(REPO, "bad2")
    # A commit that fails verification is never kept (it was checked in a staging copy).
    assert not (exported_run.store / "hub" / REPO / commit).exists()


def test_pull_rejects_an_oversized_replay_video(
    exported_run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = bundle_files(exported_run, tmp_path)
    assert files["replay.mp4"][4:8] == b"ftyp"
    # Listed and hashed correctly, but larger than a bundle's replay video may be.
    files["replay.mp4"] += bytes(bundle_format.REPLAY_VIDEO_MAX_BYTES)
    index = json.loads(files["bundle.json"])
    index["files"]["replay.mp4"] = hashlib.sha256(files["replay.mp4"]).hexdigest()
    files["bundle.json"] = json.dumps(index).encode()
    populate_cache(tmp_path / "cache", REPO, files, refs={"big": "HEAD"})
    offline_cache(monkeypatch, tmp_path / "cache")
    with pytest.raises(bundle_format.BundleRefused,
                       match=r"replay.mp4 is \d+ bytes, more than the 20971520 a bundle file"):
        hub.pull(REPO, "big")


# --------------------------------------------------------------------------- using a pulled bundle


@pytest.fixture()
def pulled(exported_run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> hub.PulledBundle:
    files = bundle_files(exported_run, tmp_path)
    populate_cache(tmp_path / "cache", REPO, files, refs={"v1": "HEAD"})
    offline_cache(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    return hub.pull(REPO, "v1")


@pytest.mark.slow
def test_export_verification_runs_on_a_pulled_bundle(pulled: hub.PulledBundle) -> None:
    result = hub.verify_export(pulled.directory, observations=16, episodes=1, calls=1000,
                               warmup=0)
    assert result.passed
    assert result.directory == pulled.directory.with_name(pulled.commit + "-export")
    index = json.loads((pulled.directory / "bundle.json").read_text())
    assert result.report["replay"]["logged_eval_mean"] == index["eval_mean_reward"]
    assert result.report["source"] == f"bundle {pulled.directory}"
    # The pulled directory stays exactly the commit's files; the report lives next to it.
    assert {p.name for p in pulled.directory.iterdir()} == {*index["files"], "bundle.json"}


@pytest.mark.slow
def test_training_starts_from_a_pulled_bundle(
    pulled: hub.PulledBundle, exported_run: Run, tmp_path: Path
) -> None:
    bundle_weights = load_file(str(pulled.directory / "weights.safetensors"))
    # seed=1 would initialize differently; a negligible learning rate keeps the loaded
    # weights (Adam moves each by at most ~lr per step), so they must still be the bundle's.
    result = train(load_config([*NORMALIZED, "seed=1", "algo.learning_rate=1e-10",
                                f"init.hub_repo_id={REPO}", "init.hub_revision=v1"]))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    params = client.get_run(result.run_id).data.params
    assert params["init.hub_repo_id"] == REPO
    assert params["init.hub_revision"] == "v1"
    assert params["init.hub_commit"] == pulled.commit
    manifest_path = client.download_artifacts(result.run_id, "manifest.json", str(tmp_path))
    run_section = json.loads(Path(manifest_path).read_text())["run"]
    assert run_section["init_hub"] == {"repo_id": REPO, "revision": "v1", "commit": pulled.commit}
    folder = Path(client.download_artifacts(result.run_id, "model", str(tmp_path / "dl")))
    trained = PPO.load(folder / "model.zip", device="cpu").policy.state_dict()
    for name, tensor in bundle_weights.items():
        assert torch.allclose(trained[name], tensor, atol=1e-6), name
    # the same configuration without the bundle starts elsewhere
    fresh_cfg = load_config([*NORMALIZED, "seed=1"])
    fresh_env = make_envs(EnvSpec.from_config(fresh_cfg))
    try:
        fresh = build_model(fresh_cfg, fresh_env).policy.state_dict()
    finally:
        fresh_env.close()
    assert not torch.allclose(fresh["action_net.weight"], bundle_weights["action_net.weight"])


def test_init_config_needs_a_pinned_revision_and_a_matching_bundle(
    pulled: hub.PulledBundle,
) -> None:
    with pytest.raises(ConfigError, match=r"^init.hub_revision: missing for init.hub_repo_id"):
        load_config([f"init.hub_repo_id={REPO}"])
    with pytest.raises(ConfigError, match=r"^init.hub_revision=v1: set without init.hub_repo_id"):
        load_config(["init.hub_revision=v1"])
    cfg = load_config([*NORMALIZED, "algo.policy.pi=[32]", f"init.hub_repo_id={REPO}",
                       "init.hub_revision=v1"])
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("workbench")
    before = len(client.search_runs([experiment.experiment_id]))
    with pytest.raises(ConfigError, match=r"^algo.policy.pi=\[32\]: the bundle .* was trained "
                                          r"with algo.policy.pi=\[256, 256\]; set "
                                          r"algo.policy.pi=\[256,256\]"):
        train(cfg)
    assert len(client.search_runs([experiment.experiment_id])) == before  # no run created
