"""``workbench promote``: a run's policy into MLflow's model registry, behind a gate.

    workbench promote --run RUN_ID --alias ALIAS [--checkpoint best|last|STEP]
                      [--profile NAME] [--name MODEL] [--allow-module MODULE]... [KEY=VALUE ...]

"Which policy is on the robot" becomes a registry alias (``hopper-ppo@on-robot``) instead of
someone's memory. The alias is set only when the gate holds, checked in this order:

1. the export (``workbench export``: TorchScript + ONNX, logged to the run under ``export/``)
   passes its parity check;
2. the export's contract matches the run, its env and the robot it trained on, and the
   export's measured maximum latency after warm-up fits the contract's control period
   (:func:`workbench.deploy.verification.deployment_check`);
3. the robustness matrix of the gate's profile (``conf/eval/<profile>.yaml``, default
   ``gate``; :mod:`workbench.deploy.robustness`) holds in every cell.

Then a model version is created from the run's ``export/`` artifacts (MLflow 3:
``create_model_version``), the gate's figures are written on it as tags (profile, cells,
nominal return, parity, the eval run, the checkpoint, the Hub bundle commit when the run was
pushed, the contract and the latency against the period) and the alias is pointed at it. A
failed gate exits 1, names the failing parity, field, latency or cells, and registers
nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.config import ConfigError
from workbench.config.robustness import load_profile
from workbench.deploy import evaluation, export, robustness, verification
from workbench.deploy.arguments import allowed_modules

REGISTRY_TAG_LIMIT = 5_000  # MLflow's tag values hold 8,000 characters


@dataclass
class Gate:
    """The two checks a promotion needs and their figures."""

    parity: Mapping[str, Any]
    matrix: robustness.Matrix | None  # None: not run (the parity or deployment failed first)
    eval_run_id: str | None
    config: Any = None  # the policy's WorkbenchConfig, once loaded
    deployment: verification.DeploymentCheck | None = None  # contract and latency, once run

    @property
    def passed(self) -> bool:
        return bool(self.parity.get("passed")) and self.matrix is not None and \
            self.matrix.passed


def model_name(cfg: Any, name: str | None) -> str:
    """``--name`` or ``<env>-<algo>`` (``hopper-ppo``)."""
    return name or f"{cfg.env.name}-{cfg.algo.name}"


def version_tags(gate: Gate, run: Any, alias: str, checkpoint: Mapping[str, Any] | None
                 ) -> dict[str, str]:
    """What the gate measured, on the model version (strings, within MLflow's limits)."""
    assert gate.matrix is not None
    matrix, parity = gate.matrix, gate.parity
    tags = {
        "workbench.alias": alias,
        "gate.profile": matrix.profile_name,
        "gate.passed": "true",
        "gate.cells": str(len(matrix.results)),
        "gate.nominal_return": f"{matrix.nominal.mean:.4g}",
        "gate.threshold": f"{matrix.threshold:.4g}",
        "gate.eval_run": gate.eval_run_id or "",
        "gate.verdicts": robustness.verdict_text(matrix)[:REGISTRY_TAG_LIMIT],
        "parity.onnx_max_abs_diff": f"{parity.get('onnx_max_abs_diff', float('nan')):.3g}",
        "parity.torchscript_max_abs_diff":
            f"{parity.get('torchscript_max_abs_diff', float('nan')):.3g}",
        "source_run": run.info.run_id,
    }
    if gate.deployment is not None:
        tags.update(gate.deployment.tags)
    if checkpoint:
        tags["checkpoint"] = str(checkpoint.get("path") or checkpoint.get("step") or "")
    for key in ("hub.repo_id", "hub.revision"):
        if key in run.data.tags:
            tags[key] = run.data.tags[key]
    return tags


def register(client: Any, name: str, run: Any, alias: str, tags: Mapping[str, str]) -> Any:
    """A new version of ``name`` from the run's ``export/`` artifacts, the alias on it."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name, description="Policies promoted by workbench promote (docs/evaluation.md)")
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/{export.ARTIFACT_DIR}", run_id=run.info.run_id,
        tags=dict(tags), description=f"{tags['gate.verdicts']}")
    client.set_registered_model_alias(name, alias, version.version)
    return version


def run_gate(args: argparse.Namespace, client: Any, out: Path) -> tuple[Gate, Any]:
    """Export with its parity check, then the robustness matrix of the profile."""
    allowed = allowed_modules(args.allow_module)
    profile = load_profile(args.profile, args.overrides)
    result = export.export_run(args.run, allowed_modules=allowed,
                               checkpoint_choice=args.checkpoint)
    parity = result.report["parity"]
    print(export.format_report(result.report))
    if not parity.get("passed"):
        return Gate(parity, None, None), result
    with tempfile.TemporaryDirectory(prefix="workbench-promote-") as work:
        policy = evaluation.load_policy(args, Path(work), client)
        assert policy.source is not None  # a run's policy comes with its training policy
        deployment = verification.deployment_check(client, args.run, result.report,
                                                   policy.source)
        if deployment.problem is not None:
            return Gate(parity, None, None, policy.config, deployment), result
        robustness.check_applicable(profile, policy.config)
        evaluated = evaluation.evaluate_policy(policy, args.profile, profile, client, out)
    evaluation.print_summary(evaluated)
    return Gate(parity, evaluated.matrix, evaluated.run_id, policy.config, deployment), result


def promote_command(args: argparse.Namespace) -> int:
    """Gate, then register; exit 1 (nothing registered) when the gate fails."""
    export.quiet_downloads()
    client = export.open_store()
    run = export.get_run(client, args.run)
    if run.info.status != "FINISHED":
        raise ConfigError(f"--run {args.run}: the run is {run.info.status}; only a finished "
                          "run's policy can be promoted")
    out = Path(tempfile.mkdtemp(prefix="workbench-promote-"))
    gate, exported = run_gate(args, client, out)
    if gate.deployment is not None and gate.deployment.problem is not None:
        print(f"workbench: promote refused: {gate.deployment.problem}; nothing registered")
        return 1
    if gate.matrix is None:
        print(f"workbench: promote refused: the export parity check failed (ONNX max abs diff "
              f"{gate.parity.get('onnx_max_abs_diff')}); nothing registered")
        return 1
    if not gate.passed:
        failing = ", ".join(f"{r.cell.label} ({r.mean:,.1f} < {gate.matrix.threshold:,.1f})"
                            for r in gate.matrix.failing)
        print(f"workbench: promote refused: {len(gate.matrix.failing)} cell(s) of profile "
              f"{args.profile} fail: {failing}; nothing registered")
        return 1
    name = model_name(gate.config, args.name)
    tags = version_tags(gate, export.get_run(client, args.run), args.alias,
                        exported.report.get("checkpoint"))
    version = register(client, name, run, args.alias, tags)
    print(f"registered {name} version {version.version} as {name}@{args.alias} "
          f"(gate {args.profile}: {len(gate.matrix.results)} cells hold, parity "
          f"{tags['parity.onnx_max_abs_diff']})")
    return 0

