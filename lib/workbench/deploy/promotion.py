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
``create_model_version``), the gate as it was run is written on it as tags (profile and its
command-line overrides, cells, threshold and floor, nominal return beside the task's
reference, parity, the eval run, the checkpoint, the Hub bundle commit when the run was
pushed, the contract and the latency against the period) and the alias is pointed at it. A
failed gate exits 1, names the failing parity, field, latency or cells, and registers
nothing. A profile may lock aliases (``locked_aliases``): those are set only by the profile as
written, without overrides (:func:`workbench.deploy.eval_arguments.check_promote_arguments`).
On a team server the login's right to write the run and the model is asked first (one line,
exit 2).
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
from workbench.tracking import permissions
from workbench.tracking.store import truncate

REGISTRY_TAG_LIMIT = 5_000  # MLflow's tag values hold 8,000 characters


@dataclass
class Gate:
    """The two checks a promotion needs and their figures."""

    parity: Mapping[str, Any]
    matrix: robustness.Matrix | None  # None: not run (the parity or deployment failed first)
    eval_run_id: str | None
    config: Any = None  # the policy's WorkbenchConfig, once loaded
    deployment: verification.DeploymentCheck | None = None  # contract and latency, once run
    overrides: tuple[str, ...] = ()  # the profile's KEY=VALUE overrides it ran with

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
    matrix, parity, profile = gate.matrix, gate.parity, gate.matrix.profile
    reference = matrix.reference
    tags = {
        "workbench.alias": alias,
        "gate.profile": matrix.profile_name,
        "gate.overrides": evaluation.overrides_text(gate.overrides),
        "gate.passed": "true",
        "gate.cells": str(len(matrix.results)),
        "gate.cell_labels": truncate(", ".join(r.cell.label for r in matrix.results),
                                     REGISTRY_TAG_LIMIT),
        "gate.seeds": str(list(profile.seeds)),
        "gate.episodes": str(profile.episodes),
        "gate.tolerance": f"{profile.tolerance:g}",
        "gate.min_drop": f"{profile.min_drop:g}",
        "gate.min_return": "none" if profile.min_return is None else f"{profile.min_return:g}",
        "gate.nominal_return": f"{matrix.nominal.mean:.4g}",
        "gate.reference_return": "none" if reference is None else f"{reference.value:.4g}",
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


def check_may_write(client: Any, run: Any, name: str | None) -> None:
    """On a team server, this login must be able to write the run (the export's artifacts,
    the verdict tags) and the registered model when it exists: asked first, one line."""
    uri = str(client.tracking_uri)
    access = permissions.experiment_access(uri, run.info.experiment_id)
    if access is not None and not access.can_write:
        experiment = repr(client.get_experiment(run.info.experiment_id).name)
        raise ConfigError(
            f"--run {run.info.run_id}: "
            + permissions.write_refusal(access, f"run {run.info.run_id}",
                                        f"experiment {experiment}")
            + f" on experiment {experiment} (promote logs the export to the run), or promote "
            "a run of your own")
    if name is None or not model_exists(client, name):
        return  # a new registered model: any login may create one
    access = permissions.model_access(uri, name)
    if access is not None and not access.can_write:
        raise ConfigError(
            f"--name {name}: "
            + permissions.write_refusal(access, f"model {name}", f"registered model {name!r}")
            + " on it, or register under another name (--name)")


def model_exists(client: Any, name: str) -> bool:
    """Whether the registry has a model ``name``."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        return False
    return True


def planned_name(run: Any, name: str | None) -> str | None:
    """``--name``, or ``<env>-<algo>`` from the run's params (None when it lacks them)."""
    params = run.data.params
    if name or not {"env.name", "algo.name"} <= set(params):
        return name
    return f"{params['env.name']}-{params['algo.name']}"


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
        evaluated = evaluation.evaluate_policy(policy, args.profile, profile, client, out,
                                               args.overrides)
    evaluation.print_summary(evaluated)
    return Gate(parity, evaluated.matrix, evaluated.run_id, policy.config, deployment,
                tuple(args.overrides)), result


def promote_command(args: argparse.Namespace) -> int:
    """Gate, then register; exit 1 (nothing registered) when the gate fails."""
    export.quiet_downloads()
    client = export.open_store()
    run = export.get_run(client, args.run)
    if run.info.status != "FINISHED":
        raise ConfigError(f"--run {args.run}: the run is {run.info.status}; only a finished "
                          "run's policy can be promoted")
    check_may_write(client, run, planned_name(run, args.name))
    with tempfile.TemporaryDirectory(prefix="workbench-promote-") as out:
        gate, exported = run_gate(args, client, Path(out))
    return register_gated(args, client, run, gate, exported)


def register_gated(args: argparse.Namespace, client: Any, run: Any, gate: Gate,
                   exported: Any) -> int:
    """Register the run's export behind the gate that was run; exit 1 when it failed."""
    if gate.deployment is not None and gate.deployment.problem is not None:
        print(f"workbench: promote refused: {gate.deployment.problem}; nothing registered")
        return 1
    if gate.matrix is None:
        print(f"workbench: promote refused: the export parity check failed (ONNX max abs diff "
              f"{gate.parity.get('onnx_max_abs_diff')}); nothing registered")
        return 1
    if not gate.passed:
        matrix = gate.matrix
        failing = ", ".join(f"{r.cell.label} ({r.mean:,.1f} < {matrix.threshold:,.1f})"
                            for r in matrix.failing)
        floor = "" if matrix.nominal.holds else (
            f"the nominal return {matrix.nominal_text()} is below the profile's floor "
            f"min_return={matrix.profile.min_return:g}; ")
        print(f"workbench: promote refused: {floor}{len(matrix.failing)} cell(s) of profile "
              f"{args.profile} fail: {failing}; nothing registered")
        return 1
    name = model_name(gate.config, args.name)
    tags = version_tags(gate, export.get_run(client, args.run), args.alias,
                        exported.report.get("checkpoint"))
    version = register(client, name, run, args.alias, tags)
    overridden = f" with {' '.join(gate.overrides)}" if gate.overrides else " as written"
    print(f"registered {name} version {version.version} as {name}@{args.alias} (profile "
          f"{args.profile}{overridden}: {len(gate.matrix.results)} cells hold at >= "
          f"{gate.matrix.threshold:,.1f}; nominal return {gate.matrix.nominal_text()}; "
          f"parity {tags['parity.onnx_max_abs_diff']})")
    return 0

