"""The contract an exported policy carries: what a robot must send and may expect.

:func:`build_contract` assembles it from what the run already holds, nothing typed by hand:
the env's entries, control rate and robot description (:mod:`workbench.envs.contract`), the
normalization statistics the graph applies, where the policy came from and the package
versions that made it. ``workbench export`` writes it, as JSON, into ``policy.onnx``'s
``metadata_props`` (:func:`embed_onnx`), ``policy.pt``'s extra files (:data:`TORCHSCRIPT_FILE`)
and the export report; a Hub bundle's ``bundle.json`` holds it too.

Its format, reading and checks are the standalone runner's (:mod:`workbench.deploy.runner`,
which imports nothing of the workbench): one definition for the robot side and this one.
:func:`mismatch` compares a contract with the one the run and its env give now and names the
first field that differs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config import ConfigError
from workbench.deploy import runner
from workbench.envs.contract import env_contract
from workbench.envs.spec import EnvSpec
from workbench.training.bundle_format import RUNNER_FILE as RUNNER_FILE  # beside the files
from workbench.training.model import PolicySource

TORCHSCRIPT_FILE = "contract.json"  # the extra file of policy.pt holding the contract
# The fields a policy's contract must share with its run and env, in the order they are
# compared; versions and the origin's wording may differ between machines.
COMPARED = ("env_id", "observation", "action", "commands", "normalization", "control",
            "robot", "source.run_id", "source.checkpoint_step")


@dataclass(frozen=True)
class Provenance:
    """Where an exported policy came from."""

    origin: str  # "run <id>", "bundle <dir>"
    run_id: str | None = None
    checkpoint_step: int | None = None
    checkpoint: str | None = None  # the checkpoint's artifact path

    def record(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "checkpoint_step": self.checkpoint_step,
                "checkpoint": self.checkpoint, "origin": self.origin}


def normalization_stats(vecnormalize: Any) -> dict[str, Any]:
    """VecNormalize's observation statistics as plain JSON (a bundle's
    ``normalization.json``; no pickle leaves the store)."""
    if vecnormalize is None or not vecnormalize.norm_obs:
        return {"norm_obs": False}
    rms = vecnormalize.obs_rms
    return {
        "norm_obs": True,
        "clip_obs": float(vecnormalize.clip_obs),
        "epsilon": float(vecnormalize.epsilon),
        "obs_mean": np.asarray(rms.mean, dtype=np.float64).tolist(),
        "obs_var": np.asarray(rms.var, dtype=np.float64).tolist(),
        "obs_count": float(rms.count),
    }


def normalization_section(vecnormalize: Any) -> dict[str, Any]:
    """The contract's ``normalization``: the statistics the graph applies
    (``clip((obs - mean) / sqrt(var + epsilon), -clip, clip)``) and their hash."""
    stats = normalization_stats(vecnormalize)
    if not stats["norm_obs"]:
        return {"in_graph": False, "clip": None, "epsilon": None, "mean": None, "var": None,
                "sha256": None}
    section = {"in_graph": True, "clip": stats["clip_obs"], "epsilon": stats["epsilon"],
               "mean": stats["obs_mean"], "var": stats["obs_var"]}
    return {**section, "sha256": runner.normalization_sha256(section)}


def build_contract(source: PolicySource, provenance: Provenance,
                   versions: Mapping[str, str]) -> dict[str, Any]:
    """The contract of ``source``'s exported graph (checked as the runner reads it)."""
    env = env_contract(EnvSpec.from_config(source.config)).record()
    contract = {"format": runner.CONTRACT_FORMAT, **env,
                "normalization": normalization_section(source.vecnormalize),
                "source": provenance.record(), "versions": dict(versions)}
    runner.parse_contract(json.dumps(contract))  # what the robot side will read
    return contract


def contract_text(contract: Mapping[str, Any]) -> str:
    """The contract as the JSON text every artifact carries."""
    return json.dumps(contract, separators=(",", ":"))


def embed_onnx(path: Path, contract: Mapping[str, Any]) -> None:
    """Write the contract into ``path``'s ``metadata_props`` (key :data:`runner.CONTRACT_KEY`)."""
    import onnx

    model = onnx.load(str(path))
    kept = [p for p in model.metadata_props if p.key != runner.CONTRACT_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=runner.CONTRACT_KEY, value=contract_text(contract))
    onnx.save(model, str(path))


def read_contract(path: Path, label: str) -> runner.Contract:
    """The checked contract of an exported ``policy.onnx``; one line (exit code 2) naming
    ``label`` and the field when it cannot be read."""
    try:
        return runner.read_contract(path)
    except runner.ContractError as exc:
        raise ConfigError(f"{label}: contract: {exc}") from exc


def runner_source() -> bytes:
    """The standalone runner's bytes, as ``workbench export`` writes them."""
    return Path(runner.__file__).read_bytes()


# --------------------------------------------------------------------------- comparing


def mismatch(found: Mapping[str, Any], expected: Mapping[str, Any],
             sides: tuple[str, str] = ("the contract says", "the run and its env say")
             ) -> str | None:
    """The first field of :data:`COMPARED` where the contract ``found`` differs from
    ``expected``, as ``field: the contract says A, the run and its env say B`` (``sides``:
    the two phrases); None when they agree."""
    for path in COMPARED:
        difference = first_difference(lookup(found, path), lookup(expected, path), path, sides)
        if difference is not None:
            return difference
    return None


def lookup(contract: Mapping[str, Any], path: str) -> Any:
    value: Any = contract
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def first_difference(found: Any, expected: Any, where: str, sides: tuple[str, str]
                     ) -> str | None:
    """Where two JSON values first differ (numbers equal within 1e-9 relative)."""
    if isinstance(expected, Mapping) and isinstance(found, Mapping):
        for key in [*expected, *(k for k in found if k not in expected)]:
            difference = first_difference(found.get(key), expected.get(key), f"{where}.{key}",
                                          sides)
            if difference is not None:
                return difference
        return None
    if isinstance(expected, list) and isinstance(found, list):
        if len(found) != len(expected):
            return (f"{where}: {sides[0]} {len(found)} entries, {sides[1]} "
                    f"{len(expected)}")
        for i, (a, b) in enumerate(zip(found, expected, strict=True)):
            difference = first_difference(a, b, f"{where}[{i}]", sides)
            if difference is not None:
                return difference
        return None
    if same_value(found, expected):
        return None
    return f"{where}: {sides[0]} {shown(found)}, {sides[1]} {shown(expected)}"


def same_value(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(type(a) is type(b) and a == b)


def shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 70 else text[:67] + "..."


def summary_line(contract: Mapping[str, Any]) -> str:
    """One line for the export report: format, sizes, rate, normalization, robot."""
    control, robot, norm = contract["control"], contract["robot"], contract["normalization"]
    rate = f"{control['rate_hz']:g} Hz" if control["rate_hz"] is not None else "no rate"
    return (f"{contract['format']}: {contract['observation']['size']} observation values in "
            f"{len(contract['observation']['entries'])} entries, "
            f"{contract['action']['size']} actions, {rate}; normalization "
            f"{norm['sha256'][:12] if norm['in_graph'] else 'none'}; robot "
            f"{robot['sha256'][:12] if robot else 'none'}")
