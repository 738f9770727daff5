"""Export a trained policy for deployment (TorchScript + ONNX) and verify it.

A deployer feeds raw sensor values and wants actuator commands, so the exported graph holds
everything between the two: the run's ``VecNormalize`` observation statistics (the same
float64 formula SB3 uses), the actor network, and the deterministic action (the Gaussian's
mean, as SB3's ``predict(deterministic=True)``) clipped to the action space.

``export_run(run_id)`` writes ``policy.pt`` (TorchScript), ``policy.onnx`` (dynamic batch
axis) and ``export_report.json`` and logs them to the run under ``export/``. The report holds
three checks: load the weights, run a trajectory, compare with the training log, and measure
the worst case, before anything touches hardware:

1. parity: exported outputs vs SB3 ``predict(deterministic=True)`` on observations recorded
   from the environment (max abs difference, must be <= 1e-5 on CPU);
2. replay: seeded episodes driven only by the ONNX Runtime session in a fresh environment,
   mean return next to the run's final evaluation, and ``replay.mp4`` (+ ``replay.gif``) of
   the first episode with the return it got (the run's ``video.*`` settings);
3. latency: single-observation calls for SB3 eager, TorchScript and ONNX Runtime: p50, p99,
   max, the first call on a freshly loaded instance, and the end-to-end time from the
   environment's numpy observation to a numpy action.

Both files carry the policy's contract (:mod:`workbench.deploy.contract`: observation and
action entries, normalization, control rate, robot hash, provenance, versions), and the
standalone runner (:mod:`workbench.deploy.runner`) is written next to them as ``runner.py``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.vec_env import VecNormalize

from workbench import config
from workbench.config import ConfigError, RandomizationConfig, WorkbenchConfig
from workbench.deploy.arguments import (
    BEST,
    DEFAULT_CALLS,
    DEFAULT_EPISODES,
    DEFAULT_OBSERVATIONS,
    DEFAULT_WARMUP,
    LAST,
    check_budget,
    check_checkpoint_choice,
)
from workbench.deploy.arguments import MIN_CALLS as MIN_CALLS  # benchmarks/gpu_check.py's
from workbench.deploy.contract import (
    RUNNER_FILE,
    TORCHSCRIPT_FILE,
    Provenance,
    build_contract,
    contract_text,
    embed_onnx,
    runner_source,
    summary_line,
)
from workbench.deploy.graph import (
    INPUT_NAME,
    OUTPUT_NAME,
    deployed_policy,
    export_onnx,
    export_torchscript,
    observation_dim,
    onnx_session,
)
from workbench.deploy.latency import fp16_variant, latency_backends, measure_latency
from workbench.deploy.runner import CONTRACT_KEY
from workbench.envs import video
from workbench.envs.checks import check_data_env_id
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env, make_eval_env
from workbench.envs.video import VideoSettings
from workbench.tracking.logged_models import (
    EVAL_MEAN_KEY,
    EVAL_STD_KEY,
    BestCheckpoint,
    best_checkpoint,
)
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import is_embedded, make_client, resolve_tracking_uri
from workbench.training import checkpoint
from workbench.training.bundle import PULL_TRUST_HINT
from workbench.training.model import PolicySource, inference_model
from workbench.training.snapshot import set_vecnormalize_state

PARITY_TOLERANCE = 1e-5  # max abs action difference allowed on CPU
OBS_SEED_OFFSET = 30_000  # seeds apart from training (seed + r) and evaluation (seed + 10000)
REPLAY_SEED_OFFSET = 20_000
REPORT_NAME = "export_report.json"
VIDEO_STEM = "replay"  # replay.mp4 / replay.gif: the ONNX policy's replay video
ARTIFACT_DIR = "export"


@dataclass
class ExportResult:
    """What an export produced: the report, where the files are, raw latency samples."""

    report: dict[str, Any]
    directory: Path
    latency_samples: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.report["passed"])


# --------------------------------------------------------------------------- the deployed graph


# --------------------------------------------------------------------------- environments


def record_observations(source: PolicySource, count: int, seed: int) -> np.ndarray:
    """``count`` raw observations from a seeded env driven by the stochastic policy.

    Stochastic actions visit more states than the deterministic ones the checks compare.
    Returned as float32: what a deployer feeds the exported graph.
    """
    env = make_env(EnvSpec.from_config(source.config))
    rows: list[np.ndarray] = []
    try:
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        while len(rows) < count:
            rows.append(np.asarray(obs, dtype=np.float32))
            action, _ = source.model.predict(source.normalize(obs[None]), deterministic=False)
            obs, _, terminated, truncated, _ = env.step(action[0])
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        env.close()
    return np.stack(rows)


# --------------------------------------------------------------------------- the three checks


def check_parity(
    expected: np.ndarray, obs: np.ndarray, torchscript_path: Path, onnx_path: Path
) -> dict[str, Any]:
    """Max abs difference of TorchScript and ONNX Runtime outputs to ``expected``.

    ONNX Runtime runs the whole batch and then one observation at a time, which also
    exercises the dynamic batch axis at sizes N and 1.
    """
    module = torch.jit.load(str(torchscript_path))
    with torch.no_grad():
        scripted = module(torch.from_numpy(obs)).numpy()
    session = onnx_session(onnx_path)
    batched = session.run(None, {INPUT_NAME: obs})[0]
    single = np.concatenate([session.run(None, {INPUT_NAME: row[None]})[0] for row in obs])
    diffs = {
        "torchscript_max_abs_diff": float(np.max(np.abs(scripted - expected))),
        "onnx_max_abs_diff": float(np.max(np.abs(batched - expected))),
        "onnx_batch1_max_abs_diff": float(np.max(np.abs(single - expected))),
    }
    return {
        "observations": int(len(obs)),
        "tolerance": PARITY_TOLERANCE,
        **diffs,
        "passed": all(d <= PARITY_TOLERANCE for d in diffs.values()),
    }


def replay(
    onnx_path: Path, cfg: WorkbenchConfig, episodes: int, seed: int,
    logged_mean: float | None, logged_std: float | None,
) -> dict[str, Any]:
    """``episodes`` seeded episodes driven only by the ONNX Runtime session.

    Episode k starts from ``reset(seed=seed + k)``. The mean return is set next to the
    training log's final evaluation: the two agree when they differ by at most two standard
    deviations (the larger spread of the two) or 5% of the logged return. A tiny run's
    evaluation uses few episodes, so this is a sanity check, not a statistical test.
    """
    session = onnx_session(onnx_path)
    env = make_env(EnvSpec.from_config(cfg))
    returns: list[float] = []
    lengths: list[int] = []
    try:
        for k in range(episodes):
            obs, _ = env.reset(seed=seed + k)
            total, steps, done = 0.0, 0, False
            while not done:
                action = session.run(None, {INPUT_NAME: obs.astype(np.float32)[None]})[0][0]
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                steps += 1
                done = terminated or truncated
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    mean, std = float(np.mean(returns)), float(np.std(returns))
    result: dict[str, Any] = {
        "episodes": episodes,
        "seeds": [seed + k for k in range(episodes)],
        "returns": returns,
        "lengths": lengths,
        "mean_return": mean,
        "std_return": std,
        "logged_eval_mean": logged_mean,
        "logged_eval_std": logged_std,
        "delta": None,
        "tolerance": None,
        "consistent": None,
        "note": randomization_note(cfg),
    }
    if logged_mean is not None and math.isfinite(logged_mean):
        spread = max(std, logged_std if logged_std is not None and math.isfinite(logged_std) else 0)
        tolerance = max(2 * spread, 0.05 * abs(logged_mean))
        result.update(
            delta=mean - logged_mean, tolerance=tolerance,
            consistent=abs(mean - logged_mean) <= tolerance,
        )
    return result


def replay_video(onnx_path: Path, cfg: WorkbenchConfig, seed: int, directory: Path
                 ) -> dict[str, Any]:
    """``replay.mp4`` (and ``replay.gif``) of the replay's first episode, driven by the ONNX
    session, at the run's ``video.*`` settings; what it returned, or why there is none."""
    if not cfg.video.enabled:
        return {"skipped": "video.enabled=false in the run's config"}
    settings = VideoSettings.from_config(cfg.video)
    session = onnx_session(onnx_path)
    env = make_env(EnvSpec.from_config(cfg), video=settings)
    try:
        with video.encoding(directory, VIDEO_STEM, video.frame_rate(env, settings)) as encoder:
            recording = video.record_episode(  # each frame streamed to ffmpeg as it comes
                env, lambda obs: session.run(None, {INPUT_NAME: obs.astype(np.float32)})[0],
                seed, settings, encoder.add)
    except video.RenderingUnavailable as exc:
        return {"skipped": str(exc)}
    finally:
        env.close()
    files = encoder.close()
    return {
        "file": files.video.name, "preview": files.preview.name, "seed": seed,
        "return": recording.returns[0], "steps": recording.lengths[0], "frames": files.frames,
        "size": list(files.size), "fps": files.fps, "seconds": recording.seconds,
    }


def randomization_note(cfg: WorkbenchConfig) -> str | None:
    """Why replay and training log may differ by design: the replay runs the nominal task."""
    if cfg.eval.randomization == RandomizationConfig():
        return None
    return ("the logged evaluation ran under eval.randomization; this replay runs the nominal "
            "task (no randomization), as a deployed controller sees it")


# --------------------------------------------------------------------------- one export


def export_policy(
    source: PolicySource,
    directory: Path,
    *,
    observations: int = DEFAULT_OBSERVATIONS,
    episodes: int = DEFAULT_EPISODES,
    calls: int = DEFAULT_CALLS,
    warmup: int = DEFAULT_WARMUP,
    provenance: Provenance | None = None,
) -> ExportResult:
    """Export ``source`` into ``directory`` and run the three checks; nothing is logged here.

    Files: ``policy.pt`` and ``policy.onnx``, each carrying the contract (``provenance`` says
    where the policy came from; default: ``source.origin``), ``runner.py`` (the standalone
    runner), ``samples.npz`` (the recorded raw observations and SB3's actions for them,
    shipped with Hub bundles), ``latency.npz`` (every timed call), ``replay.mp4``/
    ``replay.gif`` (unless the run disabled videos or cannot render) and
    ``export_report.json``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    cfg = source.config
    obs_dim = observation_dim(source)
    module = deployed_policy(source)
    contract = build_contract(source, provenance or Provenance(origin=source.origin),
                              library_versions())
    torchscript_path, onnx_path = directory / "policy.pt", directory / "policy.onnx"
    export_torchscript(module, torchscript_path, obs_dim,
                       {TORCHSCRIPT_FILE: contract_text(contract)})
    opset = export_onnx(module, onnx_path, obs_dim)
    embed_onnx(onnx_path, contract)
    (directory / RUNNER_FILE).write_bytes(runner_source())

    obs = record_observations(source, observations, cfg.seed + OBS_SEED_OFFSET)
    expected = source.deterministic_actions(obs)
    np.savez(directory / "samples.npz", observations=obs, actions=expected)
    parity = check_parity(expected, obs, torchscript_path, onnx_path)
    replayed = replay(onnx_path, cfg, episodes, cfg.seed + REPLAY_SEED_OFFSET,
                      source.eval_mean_reward, source.eval_std_reward)
    replayed["video"] = replay_video(onnx_path, cfg, cfg.seed + REPLAY_SEED_OFFSET, directory)
    backends = latency_backends(source, torchscript_path, onnx_path, obs[0].astype(np.float64))
    latency, samples = measure_latency(backends, calls, warmup)
    arrays = {k.replace("/", "__"): v for k, v in samples.items()}
    np.savez(directory / "latency.npz", **arrays)  # type: ignore[arg-type]  # numpy's stub
    fp16 = fp16_variant(module, obs, expected, directory, calls, warmup)

    report = {
        "source": source.origin,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "env_id": cfg.env.id,
        "observation_dim": obs_dim,
        "action_dim": int(expected.shape[1]),
        "graph": {
            "torchscript": torchscript_path.name,
            "onnx": onnx_path.name,
            "onnx_opset": opset,
            "input": f"{INPUT_NAME}: float32 [batch, {obs_dim}] raw observation",
            "output": f"{OUTPUT_NAME}: float32 [batch, action_dim] deterministic action, "
            "clipped to the action space",
            "observation_normalization": module.normalize,
            "clip_obs": module.clip_obs if module.normalize else None,
            "contract": f"{onnx_path.name} metadata_props {CONTRACT_KEY!r}, "
            f"{torchscript_path.name} extra file {TORCHSCRIPT_FILE!r}",
            "runner": RUNNER_FILE,
        },
        "contract": contract,
        "versions": library_versions(),
        "parity": parity,
        "replay": replayed,
        "latency": latency,
        "fp16": fp16,
        "passed": bool(parity["passed"]),
    }
    (directory / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    return ExportResult(report=report, directory=directory, latency_samples=samples)


def library_versions() -> dict[str, str]:
    """Versions of the libraries that produced and checked the exported files."""
    from importlib.metadata import version

    names = ("torch", "onnx", "onnxruntime", "onnxscript", "stable-baselines3", "gymnasium",
             "mujoco", "numpy")
    return {name: version(name) for name in names}


# --------------------------------------------------------------------------- runs in MLflow


@dataclass(frozen=True)
class ChosenCheckpoint:
    """The checkpoint of a run that an export reads, and why (``--checkpoint``)."""

    stored: checkpoint.StoredCheckpoint
    choice: str  # "final" (no --checkpoint), "last", "best" or the step asked for
    eval_mean_reward: float | None = None  # its own evaluation (checkpoint/eval_*), if any
    eval_std_reward: float | None = None

    def record(self) -> dict[str, Any]:
        """The export report's ``checkpoint`` section."""
        return {"choice": self.choice, "step": self.stored.step, "path": self.stored.path,
                "eval_mean_reward": self.eval_mean_reward,
                "eval_std_reward": self.eval_std_reward}


def choose_checkpoint(client: Any, run: Any, choice: str | None) -> ChosenCheckpoint:
    """The run's checkpoint to export: the final one (``choice`` None: the run must have
    finished and the checkpoint be of its last step), the newest (``last``), the
    best-evaluated (``best``, ``checkpoint.keep=best``) or the one of a step. A choice the
    run cannot meet is a :class:`ConfigError` listing the checkpoints it has."""
    run_id = run.info.run_id
    if choice is not None:
        check_checkpoint_choice(choice)
    if choice is None:
        names = {a.path for a in client.list_artifacts(run_id, "model")}
        if "model/model.zip" not in names:
            raise ConfigError(
                f"run {run_id}: has no model/model.zip (status {run.info.status}); export "
                "needs a run whose training finished (or --checkpoint last|best|STEP)"
            )
    complete = [c for c in checkpoint.stored_checkpoints(client, run_id) if c.complete]
    if not complete:
        raise ConfigError(
            f"run {run_id}: has no checkpoint to export from (the workbench reads a run's "
            "policy from the checkpoint training writes at its end, never from SB3's "
            "pickles); train it again with this version of the workbench"
        )
    by_step = {c.step: c for c in complete}
    best = best_checkpoint(run.data.tags, run.data.metrics)
    if choice is None or choice == LAST:
        chosen = complete[-1]
    elif choice == BEST:
        if best is None or best.step not in by_step:
            why = ("records no best checkpoint (it was not trained with checkpoint.keep=best)"
                   if best is None else f"lost its best checkpoint (step {best.step})")
            raise ConfigError(f"run {run_id}: --checkpoint best: the run {why}; it has "
                              f"{checkpoint_list(complete, None)}")
        chosen = by_step[best.step]
    elif int(choice) in by_step:
        chosen = by_step[int(choice)]
    else:
        raise ConfigError(f"run {run_id}: --checkpoint {choice}: no checkpoint of that step; "
                          f"the run has {checkpoint_list(complete, best)}")
    if choice is None:
        check_final(client, run_id, chosen.step)
    mean, std = checkpoint_evaluation(client, run_id, chosen.step)
    return ChosenCheckpoint(chosen, choice or "final", mean, std)


def checkpoint_list(complete: Sequence[checkpoint.StoredCheckpoint],
                    best: BestCheckpoint | None) -> str:
    """``checkpoints of steps 384 (best), 896, 1024 (last): --checkpoint best|last|STEP``."""
    steps = []
    for c in complete:
        marks = [m for m, hit in (("best", best is not None and c.step == best.step),
                                  ("last", c is complete[-1])) if hit]
        steps.append(f"{c.step} ({'/'.join(marks)})" if marks else str(c.step))
    usable = "best|last|STEP" if best is not None else "last|STEP"
    return f"checkpoints of steps {', '.join(steps)}: --checkpoint {usable}"


def checkpoint_evaluation(client: Any, run_id: str, step: int
                          ) -> tuple[float | None, float | None]:
    """The evaluation the run recorded for its checkpoint of ``step`` (None: none made)."""
    found = []
    for key in (EVAL_MEAN_KEY, EVAL_STD_KEY):
        values = [m.value for m in client.get_metric_history(run_id, key) if m.step == step]
        found.append(float(values[-1]) if values else None)
    return found[0], found[1]


def load_run(client: Any, run_id: str, workdir: Path,
             allowed_modules: Sequence[str] = (),
             checkpoint_choice: str | ChosenCheckpoint | None = None) -> PolicySource:
    """The policy of a run, rebuilt from what the run wrote as data.

    A run may come from a shared store (a team server, a copied store), so nothing of it is
    unpickled: SB3's ``model/model.zip`` and ``vecnormalize.pkl`` are never read. The weights
    and VecNormalize statistics come from one of the run's checkpoints (safetensors and JSON,
    hashes checked, shapes checked against the network, see
    :mod:`workbench.training.checkpoint`): by default the one training writes at its end,
    else the one ``checkpoint_choice`` names (:func:`choose_checkpoint`); the network from
    that checkpoint's ``config.yaml``, whose ``module:Id`` env is imported only when the user
    allowed that module (``--allow-module``), as for a Hub bundle.
    """
    run = get_run(client, run_id)
    chosen = (checkpoint_choice if isinstance(checkpoint_choice, ChosenCheckpoint)
              else choose_checkpoint(client, run, checkpoint_choice))
    final = chosen.stored
    try:
        state, config_yaml = checkpoint.download(client, run_id, final, workdir)
        cfg = config.from_yaml(config_yaml)
    except (checkpoint.CorruptCheckpoint, ConfigError) as exc:
        raise ConfigError(f"run {run_id}: checkpoint {final.path} cannot be exported from: "
                          f"{exc}; delete that folder from the run's artifacts or train again"
                          ) from exc
    check_data_env_id(cfg.env.id, allowed_modules, PULL_TRUST_HINT)
    problem = checkpoint.misfit(state, cfg)
    if problem:
        raise ConfigError(f"run {run_id}: checkpoint {final.path} does not fit the run's "
                          f"model: {problem}; delete that folder from the run's artifacts or "
                          "train again")
    venv = make_eval_env(EnvSpec.from_config(cfg))  # VecNormalize(training=False) if normalized
    model = inference_model(cfg, venv, device="cpu")  # export and its checks infer on the CPU
    model.policy.load_state_dict(state["policy"])
    model.num_timesteps = final.step
    vecnormalize = venv if isinstance(venv, VecNormalize) else None
    if vecnormalize is not None:
        if state["vecnormalize"] is None:
            raise ConfigError(f"run {run_id}: checkpoint {final.path} has no VecNormalize "
                              "statistics, but the run's config normalizes observations")
        set_vecnormalize_state(vecnormalize, state["vecnormalize"])
    metrics = run.data.metrics
    if chosen.choice == "final":
        mean, std, origin = (metrics.get("summary/eval_mean_reward"),
                             metrics.get("summary/eval_std_reward"), f"run {run_id}")
    else:  # the replay is set next to that checkpoint's own evaluation, when it had one
        mean, std = chosen.eval_mean_reward, chosen.eval_std_reward
        origin = f"run {run_id} {final.path} (--checkpoint {chosen.choice})"
    return PolicySource(model=model, vecnormalize=vecnormalize, config=cfg,
                        eval_mean_reward=mean, eval_std_reward=std, origin=origin)


def check_final(client: Any, run_id: str, step: int) -> None:
    """The checkpoint at ``step`` holds the final policy: the run's summary (logged once,
    after training, at its last step) is of the same step."""
    summary = client.get_metric_history(run_id, "summary/fps")
    if summary and max(m.step for m in summary) != step:
        last = max(m.step for m in summary)
        raise ConfigError(
            f"run {run_id}: its newest checkpoint is of step {step}, its trained policy of "
            f"step {last}; export needs the checkpoint training wrote at its end (resume the "
            "run to finish it, or train again)"
        )


def open_store(tracking_uri: str | None = None) -> Any:
    """A client for the configured store; an embedded store must already exist (reading a
    run never creates an empty database)."""

    uri = resolve_tracking_uri(tracking_uri)
    if is_embedded(uri) and not Path(uri.removeprefix("sqlite:///")).exists():
        raise ConfigError(
            f"tracking store {uri} does not exist: no runs to read; train one first or set "
            "MLFLOW_TRACKING_URI to the store that holds the run"
        )
    return make_client(uri)


def latest_run_id(experiment: str = "workbench", tracking_uri: str | None = None) -> str:
    """Id of the most recent FINISHED run of ``experiment`` (the notebook's default)."""
    client = open_store(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = [] if found is None else client.search_runs(
        [found.experiment_id], filter_string="attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"], max_results=1,
    )
    if not runs:
        raise ConfigError(
            f"experiment {experiment!r}: no finished run to export; train one first "
            "(workbench train) or pass run_id"
        )
    return str(runs[0].info.run_id)


def get_run(client: Any, run_id: str) -> Any:
    """The MLflow run ``run_id`` or a ConfigError naming the store."""
    from mlflow.exceptions import MlflowException


    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        store = redact_uri(str(client.tracking_uri))
        raise ConfigError(
            f"run {run_id}: no such run in {store}; pass a run id printed by `workbench train` "
            "(or set MLFLOW_TRACKING_URI to the store that holds it)"
        ) from exc


def log_export(client: Any, run_id: str, result: ExportResult) -> None:
    """Log the export's files under ``export/`` and its headline figures as metrics."""
    from mlflow.entities import Metric

    client.log_artifacts(run_id, str(result.directory), artifact_path=ARTIFACT_DIR)
    report = result.report
    now = int(time.time() * 1000)
    figures = {
        "export/parity_torchscript_max_abs_diff": report["parity"]["torchscript_max_abs_diff"],
        "export/parity_onnx_max_abs_diff": report["parity"]["onnx_max_abs_diff"],
        "export/replay_mean_return": report["replay"]["mean_return"],
    }
    replayed_video = report["replay"].get("video") or {}
    if "return" in replayed_video:
        figures["export/replay_video_return"] = replayed_video["return"]
    for name, stats in report["latency"]["backends"].items():
        figures[f"export/latency_{name}_p99_ms"] = stats["end_to_end_ms"]["p99"]
        figures[f"export/latency_{name}_max_ms"] = stats["end_to_end_ms"]["max"]
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in figures.items()])


def export_run(
    run_id: str,
    *,
    tracking_uri: str | None = None,
    observations: int = DEFAULT_OBSERVATIONS,
    episodes: int = DEFAULT_EPISODES,
    calls: int = DEFAULT_CALLS,
    warmup: int = DEFAULT_WARMUP,
    allowed_modules: Sequence[str] = (),
    checkpoint_choice: str | None = None,
) -> ExportResult:
    """Export run ``run_id`` of the store, verify, and log everything to the run.

    ``allowed_modules``: modules the run's ``module:Id`` env may import (see :func:`load_run`).
    ``checkpoint_choice``: ``last``, ``best`` or a step (``--checkpoint``), instead of the
    final policy; the report's ``checkpoint`` section says which checkpoint it came from.

    The files are built in a temporary folder and logged in one call at the end, so a
    failure part-way leaves nothing half-written on the run.
    """
    check_budget(observations, episodes, calls, warmup)
    if checkpoint_choice is not None:
        check_checkpoint_choice(checkpoint_choice)
    client = open_store(tracking_uri)
    with tempfile.TemporaryDirectory(prefix="workbench-export-") as tmp:
        chosen = choose_checkpoint(client, get_run(client, run_id), checkpoint_choice)
        source = load_run(client, run_id, Path(tmp) / "download", allowed_modules, chosen)
        provenance = Provenance(origin=source.origin, run_id=run_id,
                                checkpoint_step=chosen.stored.step,
                                checkpoint=chosen.stored.path)
        result = export_policy(
            source, Path(tmp) / ARTIFACT_DIR, observations=observations, episodes=episodes,
            calls=calls, warmup=warmup, provenance=provenance,
        )
        result.report["run_id"] = run_id
        result.report["checkpoint"] = chosen.record()
        (result.directory / REPORT_NAME).write_text(json.dumps(result.report, indent=2) + "\n")
        log_export(client, run_id, result)
        artifact_uri = client.get_run(run_id).info.artifact_uri
    result.directory = Path(f"{artifact_uri}/{ARTIFACT_DIR}")
    return result


# --------------------------------------------------------------------------- presentation


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a console table: checks, then latency per backend."""
    parity, replayed, latency = report["parity"], report["replay"], report["latency"]
    lines = [
        f"Export of {report['source']} ({report['env_id']})",
        "=" * 78,
        f"{'graph':<18}{report['graph']['torchscript']}, {report['graph']['onnx']} "
        f"(opset {report['graph']['onnx_opset']}, dynamic batch); normalization "
        f"{'in graph' if report['graph']['observation_normalization'] else 'none'}",
        f"{'parity':<18}{'PASS' if parity['passed'] else 'FAIL'}  max |diff| vs SB3 on "
        f"{parity['observations']} obs: TorchScript {parity['torchscript_max_abs_diff']:.2e}, "
        f"ONNX Runtime {parity['onnx_max_abs_diff']:.2e} (batch 1: "
        f"{parity['onnx_batch1_max_abs_diff']:.2e}); tolerance {parity['tolerance']:.0e}",
        f"{'contract':<18}{contract_line(report)}",
        f"{'replay':<18}{replay_line(replayed)}",
        f"{'replay video':<18}{video_line(replayed.get('video') or {})}",
        f"{'fp16 (GPU)':<18}{fp16_line(report['fp16'])}",
        "-" * 78,
        f"latency, 1 observation, {latency['calls']} calls after {latency['warmup']} warm-up, "
        f"{latency['threads']} thread (ms)",
        f"{'backend':<14}{'first':>8}{'p50':>9}{'p99':>9}{'max':>9}"
        f"{'e2e p50':>10}{'e2e p99':>10}{'e2e max':>10}",
    ]
    for name, stats in latency["backends"].items():
        inf, e2e = stats["inference_ms"], stats["end_to_end_ms"]
        lines.append(
            f"{name:<14}{stats['first_call_ms']:>8.3f}{inf['p50']:>9.3f}{inf['p99']:>9.3f}"
            f"{inf['max']:>9.3f}{e2e['p50']:>10.3f}{e2e['p99']:>10.3f}{e2e['max']:>10.3f}"
        )
    lines.append("=" * 78)
    return "\n".join(lines)


def contract_line(report: Mapping[str, Any]) -> str:
    """The contract's summary and where it is (reports written before contracts: none)."""
    if "contract" not in report:
        return "none (exported before contracts; export again)"
    return (f"{summary_line(report['contract'])}; in {report['graph']['contract']}; "
            f"{report['graph']['runner']} next to them")


def replay_line(replayed: Mapping[str, Any]) -> str:
    text = (f"ONNX Runtime, {replayed['episodes']} episodes: "
            f"{replayed['mean_return']:.2f} +- {replayed['std_return']:.2f}")
    if replayed["consistent"] is None:
        return text + "; the run logged no final evaluation to compare with"
    verdict = "consistent" if replayed["consistent"] else "DIFFERS"
    note = f" [{replayed['note']}]" if replayed.get("note") else ""
    return (f"{text}; training log {replayed['logged_eval_mean']:.2f} +- "
            f"{replayed['logged_eval_std']:.2f}: {verdict} (delta {replayed['delta']:+.2f}, "
            f"tolerance {replayed['tolerance']:.2f}){note}")


def video_line(replayed_video: Mapping[str, Any]) -> str:
    if "file" not in replayed_video:
        return f"none: {replayed_video.get('skipped', 'not recorded')}"
    v = replayed_video
    return (f"{v['file']} (+ {v['preview']}): ONNX Runtime, episode seed {v['seed']}, return "
            f"{v['return']:.2f} over {v['steps']} steps; {v['frames']} frames "
            f"{v['size'][0]}x{v['size'][1]} at {v['fps']:g} fps, {v['seconds']:.1f} s")


def fp16_line(fp16: Mapping[str, Any]) -> str:
    if "skipped" in fp16:
        return f"skipped: {fp16['skipped']}"
    return (f"{fp16['device']}: max |diff| vs FP32 {fp16['max_abs_diff_vs_fp32_reference']:.1e}, "
            f"e2e p99 {fp16['end_to_end_ms']['p99']:.3f} ms")


# --------------------------------------------------------------------------- command line


def quiet_downloads() -> None:
    """No per-file progress bars when fetching a run's few small artifacts (command line)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
