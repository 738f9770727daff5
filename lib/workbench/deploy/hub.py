"""Hugging Face Hub: push a run's policy bundle, pull one back by a pinned revision.

A result is reproducible only when the exact model can be fetched again by repository id and
revision. ``push`` writes the run's bundle (:func:`write_bundle`: the export's ONNX graph and
samples, safetensors weights, normalization JSON, config, manifest, a model card) and uploads
it as one commit whose SHA is recorded on the MLflow run (``hub.repo_id``, ``hub.revision``);
``pull`` downloads exactly one commit (:mod:`workbench.training.bundle`) and verifies it
before anything uses it, ONNX graph included (:func:`verify_bundle`). The SB3 ``model.zip``
and ``vecnormalize.pkl`` are pickles and never leave the user's own store.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from workbench import config, console
from workbench.config import ConfigError, WorkbenchConfig
from workbench.config.compose import hydra_value
from workbench.deploy import export, graph, runner
from workbench.deploy.contract import (
    RUNNER_FILE,
    Provenance,
    mismatch,
    normalization_stats,
    read_contract,
    runner_source,
    summary_line,
)
from workbench.tracking.metric_keys import ROBUSTNESS_LATEST_TAG, robustness_tag
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import set_tags
from workbench.training import algorithms
from workbench.training.bundle import (
    PARITY_TOLERANCE,
    PULL_TRUST_HINT,
    CheckedBundle,
    PulledBundle,
    check_files,
    check_repo_id,
    check_weights,
    checks_summary,
    load_bundle_source,
)
from workbench.training.bundle import pull as pull_bundle
from workbench.training.bundle_format import (
    BUNDLE_FORMAT,
    CARD_NAME,
    INDEX_NAME,
    REPLAY_VIDEO,
    REPLAY_VIDEO_MAX_BYTES,
    BundleError,
    BundleRefused,
    sha256,
)

# What a bundle holds, and what each file is (model card and `workbench hub pull` output).
BUNDLE_FILES = {
    "policy.onnx": "raw observation -> deterministic action; normalization and action "
    "clipping inside the graph (dynamic batch axis); its contract in metadata_props",
    RUNNER_FILE: "the standalone runner (numpy and onnxruntime only): `python runner.py "
    "policy.onnx --show-contract`, or `--connect HOST:PORT` to serve a robot's driver at the "
    "control rate",
    "weights.safetensors": "SB3 policy state dict (actor and critics), for "
    "training from this policy (init.hub_repo_id)",
    "normalization.json": "VecNormalize observation statistics: mean, var, count, epsilon, "
    "clip_obs",
    "samples.npz": "recorded raw observations and SB3's deterministic actions for them "
    "(parity check after a pull)",
    "config.yaml": "the resolved training configuration",
    "export_report.json": "parity, replay and latency figures measured at export",
    "manifest.json": "software, hardware and git state of the training run",
    REPLAY_VIDEO: "replay video: an episode driven by policy.onnx at export (its return is in "
    "export_report.json)",
    CARD_NAME: "this model card",
}
# The model card's hyperparameter table: these, and every algo.* key of the run's algorithm.
HYPERPARAMETERS = ("env.num_envs", "env.normalize", "total_timesteps", "seed")
CARD_PACKAGES = ("torch", "stable-baselines3", "gymnasium", "mujoco", "numpy", "mlflow",
                 "hydra-core", "onnx", "onnxruntime")
# Where a run was recorded is not part of what it is: left out of the reproduce command.
NOT_REPRODUCED = ("tracking.uri",)


@dataclass(frozen=True)
class PushResult:
    """One pushed commit."""

    repo_id: str
    commit: str
    commit_url: str
    files: list[str]


def bundle_directory(text: str) -> Path:
    """A bundle directory given on the command line, checked to exist."""
    directory = Path(text).expanduser().resolve()
    if not directory.is_dir() or not (directory / INDEX_NAME).is_file():
        raise ConfigError(
            f"{text}: no {INDEX_NAME} there; pass the directory printed by "
            "`workbench hub pull`"
        )
    return directory


# --------------------------------------------------------------------------- building a bundle


def write_bundle(client: Any, run_id: str, folder: Path, repo_id: str | None = None,
                 allowed_modules: Sequence[str] = ()) -> dict[str, Any]:
    """Write the bundle of run ``run_id`` into ``folder``; returns its index (bundle.json).

    The run must have been exported (``export/``); the ONNX graph and samples are those the
    export verified, so the Hub holds exactly what was checked. ``repo_id`` (the repository
    it is pushed to) goes into the model card's pull command. ``allowed_modules``: modules
    the run's ``module:Id`` env may import (:func:`workbench.deploy.export.load_run`).
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    work = folder.parent / "download"
    run = export.get_run(client, run_id)
    exported = Path(client.download_artifacts(run_id, export.ARTIFACT_DIR, str(work)))
    for name in ("policy.onnx", "samples.npz", "export_report.json", RUNNER_FILE):
        shutil.copy(exported / name, folder / name)
    shipped = read_contract(folder / "policy.onnx", f"run {run_id} export/policy.onnx").raw
    replay_video = copy_replay_video(exported, folder)
    source = export.load_run(client, run_id, work / "model-download", allowed_modules)
    state = {k: v.detach().cpu().contiguous() for k, v in source.model.policy.state_dict().items()}
    save_file(state, str(folder / "weights.safetensors"),
              metadata={"format": "pt", "policy": "stable_baselines3 ActorCriticPolicy"})
    stats = normalization_stats(source.vecnormalize)
    (folder / "normalization.json").write_text(json.dumps(stats, indent=2) + "\n")
    cfg_text = Path(client.download_artifacts(run_id, "config.yaml", str(work))).read_text()
    (folder / "config.yaml").write_text(redact_config(cfg_text))
    manifest = run_manifest(client, run_id, work)
    if manifest is not None:
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    report = json.loads((folder / "export_report.json").read_text())
    index = {
        "format": BUNDLE_FORMAT,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_id": run_id,
        "run_name": run.info.run_name,
        "env_id": source.config.env.id,
        "algo": algorithms.algorithm(source.config.algo).label,
        "num_timesteps": int(source.model.num_timesteps),
        "eval_mean_reward": finite(source.eval_mean_reward),
        "eval_std_reward": finite(source.eval_std_reward),
        "eval_episodes": source.config.eval.final_episodes,
        "onnx_opset": report["graph"]["onnx_opset"],
        "manifest": manifest is not None,
        "init_hub_commit": run.data.params.get("init.hub_commit"),
        "contract": shipped,
    }
    card = model_card(index, source.config, report, manifest, replay_video=replay_video,
                      repo_id=repo_id, robustness=robustness_lines(run.data.tags))
    (folder / CARD_NAME).write_text(card)
    index["files"] = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return index


def copy_replay_video(exported: Path, folder: Path) -> bool:
    """The export's replay video into the bundle when it has one within the size bound."""
    path = exported / REPLAY_VIDEO
    if not path.is_file():
        return False
    if path.stat().st_size > REPLAY_VIDEO_MAX_BYTES:
        print(f"{REPLAY_VIDEO}: {path.stat().st_size} bytes, over {REPLAY_VIDEO_MAX_BYTES}: "
              "left out of the bundle (lower video.max_steps or video.width/height)")
        return False
    shutil.copy(path, folder / REPLAY_VIDEO)
    return True


def redact_config(text: str) -> str:
    """The run's config.yaml with the tracking URI's password removed."""
    from omegaconf import OmegaConf

    tree = OmegaConf.create(text)
    uri = OmegaConf.select(tree, "tracking.uri")
    if uri:
        OmegaConf.update(tree, "tracking.uri", redact_uri(str(uri)))
    return OmegaConf.to_yaml(tree)


def run_manifest(client: Any, run_id: str, work: Path) -> dict[str, Any] | None:
    """The run's manifest.json (written by workbench.tracking.manifest), or None for older runs."""
    if "manifest.json" not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    path = Path(client.download_artifacts(run_id, "manifest.json", str(work)))
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


# --------------------------------------------------------------------------- the model card

# Placeholders of the card's pull command: plain words, so the line stays a valid command.
REPO_PLACEHOLDER = "ORG/NAME"
COMMIT_PLACEHOLDER = "COMMIT_SHA"


def robustness_lines(tags: Mapping[str, str]) -> list[str]:
    """The model card's robustness section from the run's latest ``workbench eval`` (its
    verdicts are tags of the run, docs/evaluation.md); none when the policy was not evaluated."""
    profile = tags.get(ROBUSTNESS_LATEST_TAG)
    verdicts = tags.get(robustness_tag(profile, "verdicts")) if profile else None
    if not profile or not verdicts:
        return []
    return ["## Robustness", "",
            f"The robustness matrix of profile `{profile}` (MLflow run "
            f"`{tags.get(robustness_tag(profile, 'eval_run'), '')}`): one verdict per "
            "perturbation, each alone, the rest nominal.", "",
            *[f"- {console.printable(line)}" for line in verdicts.splitlines()], ""]


def model_card(
    index: Mapping[str, Any], cfg: WorkbenchConfig, report: Mapping[str, Any],
    manifest: Mapping[str, Any] | None, *, replay_video: bool = False,
    repo_id: str | None = None, robustness: Sequence[str] = (),
) -> str:
    """README.md: task, algorithm, hyperparameters, result, steps, software, how to reproduce.

    The metadata block is written by huggingface_hub's ``ModelCardData`` (model-index with
    the evaluation result, as the SB3 zoo's cards do). Every command in it is one the
    ``workbench`` parser accepts (tests/test_printed_commands.py): the pull names ``repo_id``
    (:data:`REPO_PLACEHOLDER` when not known) and :data:`COMMIT_PLACEHOLDER`, since the card
    is part of the commit whose SHA it would name.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    env_id = index["env_id"]
    mean, std = index["eval_mean_reward"], index["eval_std_reward"]
    reward = f"{mean:.2f} +/- {std:.2f}" if mean is not None and std is not None else "n/a"
    results = []
    if mean is not None:
        results.append(EvalResult(
            task_type="reinforcement-learning", task_name="reinforcement-learning",
            dataset_type=env_id, dataset_name=env_id, metric_type="mean_reward",
            metric_name="mean_reward", metric_value=reward,
        ))
    data = ModelCardData(
        library_name="stable-baselines3", model_name=f"{index['algo']}-{env_id}",
        tags=["reinforcement-learning", "deep-reinforcement-learning", "stable-baselines3",
              "onnx", "workbench", env_id],
        eval_results=results or None,
    )
    body = "\n".join([
        f"# {index['algo']} on {env_id}",
        "",
        f"A {env_id} policy trained with {library(index['algo'])} {index['algo']} by the "
        "Workbench "
        f"(MLflow run `{index['run_id']}`, `{index['run_name']}`).",
        "",
        "## Result",
        "",
        f"- final deterministic evaluation: **{reward.replace('+/-', '±')}** "
        f"(mean ± std over {index['eval_episodes']} episodes)",
        f"- training steps: {index['num_timesteps']}",
        f"- ONNX replay at export: {report['replay']['mean_return']:.2f} ± "
        f"{report['replay']['std_return']:.2f} over {report['replay']['episodes']} episodes",
        "",
        *(replay_video_lines(index, report) if replay_video else []),
        *robustness,
        "## Algorithm and key hyperparameters",
        "",
        *hyperparameter_table(cfg),
        "",
        "## Files",
        "",
        "| file | content |",
        "|---|---|",
        *[f"| `{n}` | {w} |" for n, w in BUNDLE_FILES.items()
          if (n != "manifest.json" or manifest is not None)
          and (n != REPLAY_VIDEO or replay_video)],
        f"| `{INDEX_NAME}` | index: run, result, sha256 of every file |",
        "",
        "## Software",
        "",
        *software_lines(manifest),
        "",
        "## Reproduce",
        "",
        "```bash",
        f"# this bundle, pinned: {COMMIT_PLACEHOLDER} is this commit's SHA (the repo's history)",
        shlex.join(["workbench", "hub", "pull", "--repo-id", repo_id or REPO_PLACEHOLDER,
                    "--revision", COMMIT_PLACEHOLDER]),
        "# the training run (the exact resolved configuration is config.yaml):",
        reproduce_command(cfg, index.get("init_hub_commit")),
        "```",
        "",
        "## Use",
        "",
        "What the robot must send and may expect is the policy's contract"
        + (f" ({summary_line(index['contract'])})" if index.get("contract") else "")
        + f", inside `policy.onnx` and `{INDEX_NAME}`. "
        f"`{RUNNER_FILE}` runs the policy at the contract's rate, checking every observation "
        "and action against it; it needs only numpy and onnxruntime:",
        "",
        "```bash",
        f"python {RUNNER_FILE} policy.onnx --show-contract      # every entry, unit and range",
        f"python {RUNNER_FILE} policy.onnx --connect HOST:PORT  # serve the robot's driver",
        "```",
        "",
        "Or call the graph yourself:",
        "",
        "```python",
        "import numpy as np, onnxruntime as ort",
        'session = ort.InferenceSession("policy.onnx")',
        'action = session.run(None, {"obs": np.asarray(obs, np.float32)[None]})[0][0]',
        "```",
        "",
        f"Parity at export (max |diff| vs SB3 `predict(deterministic=True)` on "
        f"{report['parity']['observations']} observations): ONNX Runtime "
        f"{report['parity']['onnx_max_abs_diff']:.1e}, TorchScript "
        f"{report['parity']['torchscript_max_abs_diff']:.1e}.",
        "",
    ])
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))


def replay_video_lines(index: Mapping[str, Any], report: Mapping[str, Any]) -> list[str]:
    """The card's replay video (the SB3 zoo's ``replay.mp4``), with the return it got."""
    replayed = report["replay"].get("video") or {}
    if "return" not in replayed:
        return []
    return [
        "## Replay",
        "",
        f'<video controls loop muted src="{REPLAY_VIDEO}" width="{replayed["size"][0]}">'
        f"</video>",
        "",
        f"[`{REPLAY_VIDEO}`]({REPLAY_VIDEO}): `policy.onnx` driving {index['env_id']} "
        f"(episode seed {replayed['seed']}), return **{replayed['return']:.2f}** over "
        f"{replayed['steps']} steps.",
        "",
    ]


def hyperparameter_table(cfg: WorkbenchConfig) -> list[str]:
    flat = config.flatten(config.to_dict(cfg))
    label = algorithms.algorithm(cfg.algo).label
    rows = ["| key | value |", "|---|---|",
            f"| algorithm | {label} ({library(label)} MlpPolicy) |"]
    keys = [*HYPERPARAMETERS[:2], *(k for k in flat if k.startswith("algo.")),
            *HYPERPARAMETERS[2:]]
    rows += [f"| `{key}` | {flat[key]} |" for key in keys if key in flat]
    return rows


def library(label: str) -> str:
    """The library an algorithm comes from: sb3-contrib for TQC and CrossQ."""
    return "sb3-contrib" if label in ("TQC", "CrossQ") else "stable-baselines3"


def software_lines(manifest: Mapping[str, Any] | None) -> list[str]:
    """Versions from the run's manifest; without one, those of the environment that pushed."""
    if manifest is None:
        versions = export.library_versions()
        return [
            "The run has no manifest.json; versions of the environment that built this bundle:",
            "",
            f"- python {sys.version.split()[0]}",
            *[f"- {name} {version}" for name, version in versions.items()],
        ]
    packages = manifest.get("packages") or {}
    lines = ["From the run's manifest.json:", ""]
    python = manifest.get("python")
    version = python.get("version") if isinstance(python, Mapping) else python
    if version:
        lines.append(f"- python {version}")
    lines += [f"- {name} {packages[name]}" for name in CARD_PACKAGES if packages.get(name)]
    cuda = manifest.get("cuda") or {}
    if isinstance(cuda, Mapping) and cuda.get("available"):
        lines.append("- cuda " + ", ".join(f"{k} {v}" for k, v in cuda.items() if v))
    git = manifest.get("git") or {}
    if isinstance(git, Mapping) and git.get("commit"):
        dirty = " (dirty)" if git.get("dirty") else ""
        lines.append(f"- workbench git commit {git['commit']}{dirty}")
    run = manifest.get("run") or {}
    if isinstance(run, Mapping) and run.get("command"):
        lines += ["", f"Started as: `{run['command']}` ({run.get('started_by')})."]
    return lines


def reproduce_command(cfg: WorkbenchConfig, init_commit: str | None = None) -> str:
    """``workbench train <overrides>`` that composes exactly ``cfg`` (except its store).

    The overrides are the differences to the run's env/experiment defaults; composing them
    again must give the same config, which is checked here rather than assumed.
    """
    base = [f"env={cfg.env.name}"] if cfg.env.name in config.group_options("env") else []
    if cfg.algo.name != "ppo":  # the algorithm's group option (PPO's is the default)
        base.append(f"algo={cfg.algo.name}")
    if cfg.experiment_name and cfg.experiment_name in config.group_options("experiment"):
        base.append(f"experiment={cfg.experiment_name}")
    target = reproducible(config.flatten(config.to_dict(cfg)))
    if init_commit:
        target["init.hub_revision"] = init_commit  # the tag it used may move; the commit won't
    defaults = reproducible(config.flatten(config.to_dict(config.load_config(base))))
    overrides = [
        f"{'' if key in defaults else '+'}{key}={hydra_value(value)}"
        for key, value in target.items()
        if key not in defaults or defaults[key] != value
    ]
    again = reproducible(config.flatten(config.to_dict(config.load_config(base + overrides))))
    if again != target:
        raise RuntimeError(f"cannot express the run's config as overrides: {overrides}")
    return " ".join(["workbench", "train", *(shlex.quote(o) for o in base + overrides)])


def reproducible(flat: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flat.items() if k not in NOT_REPRODUCED}


# --------------------------------------------------------------------------- verifying a bundle


def verify_bundle(checked: CheckedBundle) -> dict[str, Any]:
    """Verify a bundle that passed the static checks; raises BundleError naming the first
    failed check.

    The ONNX graph holds its own weights (no external data files), passes ``onnx.checker``,
    loads in ONNX Runtime and reproduces the shipped sample actions; so does the SB3 policy
    rebuilt from the safetensors weights, within the export tolerance.
    """
    onnx_path = checked.directory / "policy.onnx"
    check_onnx(onnx_path, checked.label)
    failures: tuple[type[Exception], ...] = (*onnx_runtime_errors(), ValueError)
    try:
        session = graph.onnx_session(onnx_path)
        actions = session.run(None, {export.INPUT_NAME: checked.observations})[0]
        onnx_diff = float(np.max(np.abs(actions - checked.actions)))
    except failures as exc:
        raise BundleError(f"{checked.label}: policy.onnx does not run on the shipped samples "
                          f"in ONNX Runtime: {str(exc).splitlines()[0][:200]}") from exc
    if not onnx_diff <= PARITY_TOLERANCE:  # NaN fails too
        raise BundleError(
            f"{checked.label}: ONNX Runtime differs from the shipped sample actions by "
            f"{onnx_diff:.2e} (> {PARITY_TOLERANCE:.0e})"
        )
    contract_line = check_contract_and_runner(checked, session)
    checks = checks_summary(checked, check_weights(checked))
    return {**checks, "onnx": f"checker ok, opset {checked.index.onnx_opset}",
            "onnx_max_abs_diff": onnx_diff, "contract": contract_line}


def check_contract_and_runner(checked: CheckedBundle, session: Any) -> str:
    """``bundle.json``'s contract is well-formed and the very one inside ``policy.onnx``
    (whose input and output it fits), and ``runner.py`` is byte for byte this workbench's
    runner: a runner is run on robots, so the bundle's author does not get to write it."""
    label = checked.label
    try:
        shipped = runner.parse_contract(json.dumps(checked.index.contract))
        text = session.get_modelmeta().custom_metadata_map.get(runner.CONTRACT_KEY)
        if text is None:
            raise runner.ContractError(f"policy.onnx carries no {runner.CONTRACT_KEY}")
        runner.check_graph(session, shipped)
        inside = runner.parse_contract(text)
    except runner.ContractError as exc:
        raise BundleRefused(label, f"contract: {exc}") from exc
    difference = mismatch(shipped.raw, inside.raw, (f"{INDEX_NAME} says", "policy.onnx says"))
    if difference is not None or inside.raw["versions"] != shipped.raw["versions"]:
        raise BundleRefused(label, f"{INDEX_NAME}'s contract is not the one inside policy.onnx "
                            f"({difference or 'versions'})")
    if (checked.directory / RUNNER_FILE).read_bytes() != runner_source():
        raise BundleRefused(label, f"{RUNNER_FILE} is not the runner this workbench writes "
                            "(edited, or written by another workbench version); the runner "
                            "goes to robots, so only the known one is accepted")
    return (f"{shipped.raw['format']} in {INDEX_NAME} and policy.onnx; {RUNNER_FILE} is this "
            "workbench's runner")


def check_onnx(path: Path, label: str) -> None:
    """``policy.onnx`` parses, keeps every tensor inside the file and passes ``onnx.checker``.

    External data would make ONNX (and ONNX Runtime) read other files, named by the graph,
    relative to it: a bundle's graph is refused unless it is self-contained.
    """
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as exc:
        raise BundleRefused(label, f"policy.onnx is not an ONNX model ({exc})") from exc
    if any(onnx.external_data_helper.uses_external_data(t) for t in graph_tensors(model)):
        raise BundleRefused(label, "policy.onnx refers to external data files; a bundle's "
                            "graph holds its own weights")
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise BundleError(f"{label}: policy.onnx fails onnx.checker: "
                          f"{str(exc).splitlines()[0][:200]}") from exc


def graph_tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto of an ONNX model: initializers and node attributes, subgraphs and
    functions included."""
    def of_nodes(nodes: Any) -> Iterator[Any]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from of_graph(sub)

    def of_graph(g: Any) -> Iterator[Any]:
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        yield from of_nodes(g.node)

    yield from of_graph(model.graph)
    for function in model.functions:
        yield from of_nodes(function.node)


def onnx_runtime_errors() -> tuple[type[Exception], ...]:
    """ONNX Runtime's exception classes (its pybind layer's, not RuntimeError subclasses)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    names = ("Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NoSuchFile",
             "NotImplemented", "RuntimeException", "EPFail")
    return tuple(getattr(ort_state, n) for n in names if hasattr(ort_state, n))


def verify_export(directory: Path, allowed_modules: Sequence[str] = (), **budget: int
                  ) -> export.ExportResult:
    """``workbench export`` on a pulled bundle: parity, replay and latency of its policy.

    The report goes next to the bundle (``<commit>-export/``), never into it: the pulled
    directory stays byte-identical to the commit.
    """
    checked = check_files(directory, str(directory), allowed_modules, PULL_TRUST_HINT)
    verify_bundle(checked)
    source = load_bundle_source(checked, label=f"bundle {directory}")
    out = directory.with_name(directory.name + "-export")
    provenance = Provenance(origin=source.origin, run_id=checked.index.run_id,
                            checkpoint_step=checked.index.num_timesteps)
    return export.export_policy(source, out, provenance=provenance, **budget)


# --------------------------------------------------------------------------- Hub I/O


def check_can_push() -> None:
    """Online and logged in, or a ConfigError before anything is built (token never shown)."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise ConfigError("hub push: HF_HUB_OFFLINE is set; pushing needs the network, unset it")
    if get_token() is None:
        raise ConfigError(
            "hub push: no Hugging Face token; set HF_TOKEN or log in with `hf auth login`"
        )


def push(
    run_id: str, repo_id: str, *, private: bool = True, tracking_uri: str | None = None,
    allowed_modules: Sequence[str] = (),
) -> PushResult:
    """Upload run ``run_id``'s bundle as one commit; tag the run with the commit SHA.

    Uses ``HfApi.create_repo`` and ``HfApi.create_commit``: one commit holds the whole bundle
    and returns its SHA. Runs without an export are exported (and verified) first.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    check_repo_id(repo_id)
    check_can_push()
    client = export.open_store(tracking_uri)
    export.get_run(client, run_id)
    exported = {a.path for a in client.list_artifacts(run_id, export.ARTIFACT_DIR)}
    if not {f"{export.ARTIFACT_DIR}/{n}" for n in ("policy.onnx", RUNNER_FILE)} <= exported:
        print(f"run {run_id} has no export with a contract and runner yet: exporting and "
              "verifying first")
        result = export.export_run(run_id, tracking_uri=tracking_uri,
                                   allowed_modules=allowed_modules)
        print(export.format_report(result.report))
        if not result.passed:
            raise BundleError(f"run {run_id}: export verification failed; nothing pushed")
    with tempfile.TemporaryDirectory(prefix="workbench-hub-") as tmp:
        folder = Path(tmp) / "bundle"
        index = write_bundle(client, run_id, folder, repo_id, allowed_modules)
        api = HfApi()
        api.create_repo(repo_id, private=private, exist_ok=True)
        files = sorted(p.name for p in folder.iterdir())
        info = api.create_commit(
            repo_id,
            operations=[CommitOperationAdd(path_in_repo=n, path_or_fileobj=str(folder / n))
                        for n in files],
            commit_message=f"workbench: {index['algo']} {index['env_id']} from run {run_id}",
            commit_description=f"{index['num_timesteps']} training steps; see README.md",
        )
    set_tags(client, run_id, {"hub.repo_id": repo_id, "hub.revision": info.oid})
    return PushResult(repo_id=repo_id, commit=info.oid, commit_url=info.commit_url, files=files)


def model_version(reference: str, tracking_uri: str | None = None) -> Any:
    """The registered model version ``NAME@ALIAS`` points at (``workbench promote`` sets
    aliases); one line naming what is missing otherwise."""
    from mlflow.exceptions import MlflowException

    name, _, alias = reference.partition("@")
    if not name or not alias:
        raise ConfigError(f"--model {reference!r}: give NAME@ALIAS, e.g. hopper-ppo@on-robot")
    client = export.open_store(tracking_uri)
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        raise ConfigError(f"--model {reference}: no such registered model alias in the store "
                          f"({str(exc).splitlines()[0][:200]}); set one with workbench promote "
                          "--run RUN_ID --alias ALIAS") from exc


def record_push_on_version(version: Any, result: PushResult,
                           tracking_uri: str | None = None) -> None:
    """The pushed bundle's repository and commit, as tags of the model version."""
    client = export.open_store(tracking_uri)
    for key, value in (("hub.repo_id", result.repo_id), ("hub.revision", result.commit)):
        client.set_model_version_tag(version.name, version.version, key, value)


def pull(repo_id: str, revision: str | None, allowed_modules: Sequence[str] = ()
         ) -> PulledBundle:
    """Download exactly one commit of ``repo_id``, check and verify it, ONNX graph included;
    kept in ``experiments/hub/`` only once it passed (:func:`workbench.training.bundle.pull`).
    """
    return pull_bundle(repo_id, revision, allowed_modules=allowed_modules,
                       verifier=verify_bundle)


# --------------------------------------------------------------------------- printing


def print_push(result: PushResult) -> None:
    rows = [("repo", result.repo_id), ("commit", result.commit), ("url", result.commit_url),
            ("files", ", ".join(result.files)),
            ("run tags", f"hub.repo_id={result.repo_id}, hub.revision={result.commit}")]
    _print_rows("Pushed to the Hugging Face Hub", rows)
    print(result.commit)


def print_pull(bundle: PulledBundle) -> None:
    checks = bundle.checks
    rows = [
        ("repo", bundle.repo_id),
        ("revision", f"{bundle.requested_revision} -> commit {bundle.commit}"),
        ("files", ", ".join(checks["files"])),
        ("integrity", "sha256 of every file matches bundle.json"),
        ("manifest", checks["manifest"]),
        ("onnx", checks["onnx"]),
        ("contract", checks["contract"]),
        ("parity", f"{checks['samples']} samples: ONNX Runtime {checks['onnx_max_abs_diff']:.2e}, "
                   f"safetensors weights {checks['weights_max_abs_diff']:.2e} "
                   f"(<= {PARITY_TOLERANCE:.0e})"),
        ("directory", bundle.directory),
    ]
    _print_rows("Pulled and verified", rows)
    print(bundle.directory)


def _print_rows(title: str, rows: Sequence[tuple[str, Any]]) -> None:

    console.print_table(rows, title=title)
