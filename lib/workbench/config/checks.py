"""Validation: merge into the schema, then the range and cross-field checks it cannot express.

Pure checks only: nothing here builds an environment or opens a store. The checks that need
the simulator (env ids, env kwargs, randomization, EnvPool support) are
:mod:`workbench.envs.checks`; the ones that need the tracking store (``resume=``) are
:mod:`workbench.training.start`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from workbench.config.algorithms import (
    OffPolicyConfig,
    OnPolicyConfig,
    PPOConfig,
    SACConfig,
    algo_schema,
    coefficient_problem,
)
from workbench.config.errors import ConfigError
from workbench.config.schema import (
    CheckpointKeep,
    InitConfig,
    Range,
    VideoConfig,
    WorkbenchConfig,
    choices,
    schema_type,
)

# Longest run, experiment, sweep and study name, and tag name: a sweep id adds 9 characters
# and a study file a few more, well inside the 255 bytes of a file name.
MAX_NAME_LENGTH = 100
# Longest tag value (MLflow stores up to 8000; a tag is a label, not a document).
MAX_TAG_VALUE_LENGTH = 1000


def validate(cfg: DictConfig | Mapping[str, Any] | WorkbenchConfig) -> WorkbenchConfig:
    """Merge ``cfg`` into the schema (types, unknown keys) and run the range and cross-field
    checks; the environment checks are :func:`workbench.envs.checks.check_config`."""
    if isinstance(cfg, WorkbenchConfig):
        typed = cfg
    else:
        try:
            algo = algo_schema(_algo_name(cfg))
        except KeyError as exc:
            raise ConfigError(f"{exc.args[0]}; this config.yaml was written by another "
                              "version of the workbench or by hand") from exc
        schema = OmegaConf.structured(WorkbenchConfig)
        try:
            schema.algo = OmegaConf.structured(algo)
            merged = OmegaConf.merge(schema, cfg)
            typed = OmegaConf.to_object(merged)  # type: ignore[assignment]
        except OmegaConfBaseException as exc:
            raise ConfigError(describe_omegaconf_error(exc)) from exc
    check_values(typed)
    return typed


def _algo_name(cfg: DictConfig | Mapping[str, Any]) -> str:
    """``algo.name`` of a composed or stored config (PPO when the file predates algorithms)."""
    algo = cfg.get("algo") if isinstance(cfg, Mapping | DictConfig) else None
    name = algo.get("name", "ppo") if isinstance(algo, Mapping | DictConfig) else "ppo"
    return str(name)


def check_values(cfg: WorkbenchConfig) -> None:
    """Range and cross-field checks a type cannot express; raises :class:`ConfigError`.

    The ranges are declared next to each field in the schema (``ranged``, ``sizes``): a
    meaningless value (``algo.gamma=1.5``, ``algo.clip_range=0``, a NaN learning rate, a
    layer of size 0, ``seed=-1``) stops here with the key, the range and an example.
    """
    check_ranges(cfg, "")
    check_names(cfg)
    if not cfg.tracking.experiment.strip():
        raise ConfigError(f"tracking.experiment={cfg.tracking.experiment!r}: must not be empty "
                          "(e.g. tracking.experiment=workbench)")
    check_algo(cfg)
    check_checkpoint(cfg)
    check_init(cfg.init)
    check_video(cfg.video)


def check_algo(cfg: WorkbenchConfig) -> None:
    """The algorithm's cross-field checks: a rollout that fits, coefficients SB3 can parse."""
    a = cfg.algo
    if isinstance(a, OnPolicyConfig):
        p = a.policy
        if (p.squash_output or p.use_expln) and not a.use_sde:
            key = "squash_output" if p.squash_output else "use_expln"
            raise ConfigError(f"algo.policy.{key}=true: only with gSDE; add algo.use_sde=true "
                              f"or drop algo.policy.{key}")
    rollout = cfg.env.num_envs * a.steps_per_update()
    if isinstance(a, PPOConfig) and a.batch_size > rollout:
        raise ConfigError(
            f"algo.batch_size={a.batch_size} is larger than one rollout "
            f"(env.num_envs * algo.n_steps = {cfg.env.num_envs} * {a.n_steps} = {rollout}): "
            f"lower algo.batch_size to at most {rollout} or raise env.num_envs/algo.n_steps"
        )
    if isinstance(a, OnPolicyConfig) and cfg.total_timesteps < rollout:
        raise ConfigError(
            f"total_timesteps={cfg.total_timesteps} is smaller than one rollout "
            f"(env.num_envs * algo.n_steps = {rollout}): raise total_timesteps to at least "
            f"{rollout} or shrink the rollout"
        )
    if isinstance(a, OffPolicyConfig):
        check_off_policy(a)


def check_off_policy(a: OffPolicyConfig) -> None:
    """Entropy settings SB3 can parse; gSDE's sample frequency only with gSDE."""
    for key, auto_init in (("ent_coef", True), ("target_entropy", False)):
        value = getattr(a, key, None)
        problem = coefficient_problem(value, auto_init=auto_init) if value is not None else None
        if problem:
            raise ConfigError(f"algo.{key}={value!r}: {problem}")
    if isinstance(a, SACConfig) and a.use_sde is False and a.sde_sample_freq != -1:
        raise ConfigError(f"algo.sde_sample_freq={a.sde_sample_freq}: only with gSDE; add "
                          "algo.use_sde=true or drop algo.sde_sample_freq")


def check_checkpoint(cfg: WorkbenchConfig) -> None:
    """``checkpoint.keep=best`` compares periodic checkpoints: they must be written during
    training, not only at its end (the ranges of ``every_steps`` and ``keep_last`` are the
    schema's; an unknown ``keep`` value is refused by its ``Enum``)."""
    c = cfg.checkpoint
    if c.keep != CheckpointKeep.best:
        return
    if c.every_steps == 0:
        raise ConfigError(
            "checkpoint.keep=best: checkpoint.every_steps=0 writes no checkpoint during "
            "training, so there is no best one to keep; set checkpoint.every_steps (e.g. "
            f"checkpoint.every_steps={max(cfg.total_timesteps // 10, 1)}) or drop "
            "checkpoint.keep=best")
    if c.every_steps >= cfg.total_timesteps:
        raise ConfigError(
            f"checkpoint.keep=best: checkpoint.every_steps={c.every_steps} is not below "
            f"total_timesteps={cfg.total_timesteps}, so only the final checkpoint would be "
            f"evaluated; lower it (e.g. checkpoint.every_steps="
            f"{max(cfg.total_timesteps // 10, 1)}) or drop checkpoint.keep=best")


def check_names(cfg: WorkbenchConfig) -> None:
    """Names the stores and the file system keep are one printable line of bounded length.

    Run, experiment, sweep and study names become MLflow fields, folder and file names
    (a sweep's notebooks, a study's tuned preset) and console lines: a control character
    could forge a line on a terminal, and a name past the file system's 255 bytes fails
    half-way through setting a run up. Documented in docs/robustness.md.
    """
    names = {"tracking.experiment": cfg.tracking.experiment, "tracking.run_name":
             cfg.tracking.run_name, "sweep.name": cfg.sweep.name, "sweep.id": cfg.sweep.id,
             "tune.study": cfg.tune.study}
    for key, value in names.items():
        if value is not None:
            check_name(key, value, MAX_NAME_LENGTH)
    for tag, value in cfg.tracking.tags.items():
        check_name("tracking.tags", str(tag), MAX_NAME_LENGTH, what="tag name")
        check_name(f"tracking.tags.{tag}", str(value), MAX_TAG_VALUE_LENGTH)


def check_name(key: str, value: str, limit: int, what: str = "value") -> None:
    """``value``: at most ``limit`` characters on one printable line, else :class:`ConfigError`."""
    shown = repr(value[:40]) + ("..." if len(value) > 40 else "")
    shown = shown.encode("ascii", "backslashreplace").decode()  # the error line stays one line
    if len(value) > limit:
        raise ConfigError(f"{key}={shown}: the {what} has {len(value)} characters, more than "
                          f"the {limit} allowed; shorten it")
    if not value.isprintable():
        raise ConfigError(f"{key}={shown}: the {what} holds a control or invisible character; "
                          "use one line of printable characters")


def check_video(video: VideoConfig) -> None:
    """H.264 in the yuv420p format every player reads needs even frame sizes."""
    for key in ("width", "height"):
        value = getattr(video, key)
        if value % 2:
            raise ConfigError(f"video.{key}={value}: must be even (H.264 frames); use "
                              f"video.{key}={value + 1}")


def check_ranges(node: Any, prefix: str) -> None:
    """Every field of ``node`` (a schema dataclass) with a declared range, recursively."""
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            check_ranges(value, f"{key}.")
        elif "range" in f.metadata and value is not None:
            check_number(key, value, f.metadata["range"])
        elif "each" in f.metadata:
            for item in value:
                check_number(key, item, f.metadata["each"], shown=list(value))


def check_number(key: str, value: float, valid: Range, shown: Any = None) -> None:
    """``value`` inside ``valid``, else one line naming the key, the range and an example."""
    if not valid.contains(float(value)):
        shown = value if shown is None else shown
        each = "each size " if isinstance(shown, list) else ""
        finite = "" if math.isfinite(float(value)) else "a finite number "
        raise ConfigError(f"{key}={shown}: {each}must be {finite}{valid.describe()} "
                          f"(e.g. {key}={valid.example})")


def check_init(init: InitConfig) -> None:
    """A Hub initialization names both the repository and a revision (never a moving default)."""
    if init.hub_repo_id and not init.hub_revision:
        raise ConfigError(
            f"init.hub_revision: missing for init.hub_repo_id={init.hub_repo_id}; pin it, e.g. "
            "init.hub_revision=<commit sha or tag> (workbench hub push prints the commit)"
        )
    if init.hub_revision and not init.hub_repo_id:
        raise ConfigError(
            f"init.hub_revision={init.hub_revision}: set without init.hub_repo_id; add "
            "init.hub_repo_id=<org/name> or drop the revision"
        )
    if init.dataset is not None:
        check_dataset(init.dataset)


# ``init.dataset``: ORG/NAME@REVISION, names as the Hub allows them (letters, digits, "-",
# "_", "."; no "--" or ".."), the revision a full commit: the only one that never moves.
DATASET_SPEC = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]"
                          r"{0,95})@(?P<revision>.+)")
COMMIT = re.compile(r"[0-9a-f]{40}")
DATASET_EXAMPLE = "init.dataset=my-org/walk-logs@<40-hex commit sha>"


def check_dataset(value: str) -> tuple[str, str]:
    """``init.dataset`` as ``(repo_id, commit)``; one line naming the problem otherwise."""
    match = DATASET_SPEC.fullmatch(value.strip())
    repo = match.group("repo") if match else ""
    if match is None or "--" in repo or ".." in repo or repo.endswith((".", "-")):
        raise ConfigError(f"init.dataset={value!r}: not ORG/NAME@REVISION; write it as "
                          f"{DATASET_EXAMPLE}")
    revision = match.group("revision")
    if not COMMIT.fullmatch(revision):
        what = ("a short or upper-case sha" if re.fullmatch(r"[0-9a-fA-F]{7,40}", revision)
                else "a branch or tag name, which can move")
        raise ConfigError(f"init.dataset={value}: the revision {revision!r} is {what}; pin the "
                          f"full 40-character commit sha ({repo}'s history on the Hub shows it), "
                          f"e.g. init.dataset={repo}@<commit>")
    return repo, revision


def describe_omegaconf_error(exc: OmegaConfBaseException) -> str:
    """One line from an OmegaConf validation error: key, problem, expected type or choices.

    Built from the exception's fields (``full_key``, ``value``, ``msg``) and the schema, so
    it does not depend on how OmegaConf words its messages.
    """
    key = getattr(exc, "full_key", None) or "config"
    value = getattr(exc, "value", None)
    valid = choices(key)
    if valid is not None and value is not None:
        return f"{key}={value!r}: not a valid choice; choose one of {', '.join(valid)}"
    msg = getattr(exc, "msg", None) or str(exc)
    problem = msg.strip().splitlines()[0]
    shown = f"{key}={value}" if value is not None else key
    expected = schema_type(key)
    fix = f"; expected {expected}" if expected else ""
    return f"{shown}: {problem}{fix}"


def from_yaml(text: str) -> WorkbenchConfig:
    """A stored ``config.yaml`` (a run's, a checkpoint's, a bundle's) validated by the schema.

    OmegaConf parses YAML with a safe loader: no code runs, whoever wrote the file.
    """
    node = OmegaConf.create(text)
    if not isinstance(node, DictConfig):
        raise ConfigError("config.yaml does not hold a mapping of config keys")
    return validate(node)
