"""``workbench promote``: a run's policy into MLflow's model registry, behind a gate.

    workbench promote --run RUN_ID --alias ALIAS [--checkpoint best|last|STEP]
                      [--profile NAME] [--name MODEL] [--not-worse-than ALIAS [--margin M]]
                      [--allow-module MODULE]... [KEY=VALUE ...]

"Which policy is on the robot" becomes a registry alias (``hopper-ppo@on-robot``) instead of
someone's memory. The alias is set only when the gate holds, checked in this order:

1. the export (``workbench export``: TorchScript + ONNX, logged to the run under ``export/``)
   passes its parity check;
2. the export's contract matches the run, its env and the robot it trained on, and the
   export's measured maximum latency after warm-up fits the contract's control period
   (:func:`workbench.deploy.verification.deployment_check`);
3. the robustness matrix of the gate's profile (``conf/eval/<profile>.yaml``, default
   ``gate``; :mod:`workbench.deploy.robustness`) holds in every cell;
4. with ``--not-worse-than ALIAS``: the policy holding that alias, evaluated now under the
   same profile, is not better in any cell by more than ``--margin`` (5 % by default): each
   cell's per-seed returns are judged as ``workbench compare --margin`` judges two sides (the
   judge comes from the review layer, :mod:`workbench.review.noninferiority`), at 2.5 %
   divided among the cells (Bonferroni), so a candidate within the margin is refused with a
   chance of at most 2.5 %. A cell the seeds leave undecided does not refuse; the version's
   tag ``gate.not_worse_than`` says how many were.

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
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workbench.config import ConfigError
from workbench.config.margin import Margin, parse_margin
from workbench.config.robustness import load_profile
from workbench.deploy import evaluation, export, robustness, verification
from workbench.deploy.arguments import allowed_modules
from workbench.deploy.eval_arguments import DEFAULT_MARGIN
from workbench.tracking import permissions
from workbench.tracking.store import truncate

REGISTRY_TAG_LIMIT = 5_000  # MLflow's tag values hold 8,000 characters
NOT_WORSE_ERROR = 0.025  # the chance, over all cells, of refusing a candidate within the margin
WORSE = "worse"
STEP = re.compile(r"(?:^|step-)0*(\d+)$")  # a registered version's checkpoint tag: its step


class Verdict(Protocol):
    """A judge's answer for one cell (:class:`workbench.review.noninferiority.Judgement`)."""

    @property
    def verdict(self) -> str: ...  # "not worse", "worse" or "undecided"

    def line(self) -> str: ...


# (incumbent's per-seed returns, candidate's, margin, one-sided level) -> verdict
Judge = Callable[[Sequence[float], Sequence[float], Margin, float], Verdict]


@dataclass(frozen=True)
class Incumbent:
    """The registered version a candidate must not be worse than (``--not-worse-than``)."""

    name: str
    alias: str
    version: Any  # MLflow's ModelVersion

    def text(self) -> str:
        return f"{self.name}@{self.alias} (version {self.version.version})"


@dataclass
class Gate:
    """The two checks a promotion needs and their figures."""

    parity: Mapping[str, Any]
    matrix: robustness.Matrix | None  # None: not run (the parity or deployment failed first)
    eval_run_id: str | None
    config: Any = None  # the policy's WorkbenchConfig, once loaded
    deployment: verification.DeploymentCheck | None = None  # contract and latency, once run
    overrides: tuple[str, ...] = ()  # the profile's KEY=VALUE overrides it ran with
    # --not-worse-than: each cell's label and the judge's verdict, candidate against incumbent
    rivals: list[tuple[str, Verdict]] = field(default_factory=list)
    incumbent: Incumbent | None = None
    margin: Margin | None = None

    @property
    def worse_cells(self) -> list[tuple[str, Verdict]]:
        return [(label, v) for label, v in self.rivals if v.verdict == WORSE]

    def rivalry_text(self) -> str:
        """``not worse than hopper-ppo@on-robot (version 3) in 5 of 7 cells, undecided in 2
        (margin 5 %)``."""
        assert self.incumbent is not None and self.margin is not None
        shown = sum(v.verdict == "not worse" for _, v in self.rivals)
        open_cells = [label for label, v in self.rivals if v.verdict not in ("not worse", WORSE)]
        undecided = f", undecided in {len(open_cells)} ({', '.join(open_cells)})" \
            if open_cells else ""
        return (f"not worse than {self.incumbent.text()} in {shown} of {len(self.rivals)} "
                f"cells{undecided} (margin {self.margin.text()})")

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
    if gate.incumbent is not None:
        tags["gate.not_worse_than"] = truncate(gate.rivalry_text(), REGISTRY_TAG_LIMIT)
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


def find_incumbent(client: Any, run: Any, args: argparse.Namespace) -> Incumbent | None:
    """The version holding ``--not-worse-than``'s alias, before anything runs (one line when
    there is none); None without the flag."""
    from mlflow.exceptions import MlflowException

    alias = args.not_worse_than
    if alias is None:
        return None
    name = planned_name(run, args.name)
    if name is None:
        raise ConfigError(f"--not-worse-than {alias}: the run's params do not name its model "
                          "(env.name, algo.name); give --name MODEL")
    try:
        version = client.get_model_version_by_alias(name, alias)
    except MlflowException:
        raise ConfigError(f"--not-worse-than {alias}: no version of model {name} holds alias "
                          f"{alias}; promote one there first (workbench promote --run RUN_ID "
                          f"--alias {alias}), or name another model with --name") from None
    return Incumbent(name, alias, version)


def registered_checkpoint(version: Any) -> str | None:
    """The step of the checkpoint a version was registered from (its ``checkpoint`` tag),
    as ``--checkpoint`` takes it; None: the run's final one."""
    found = STEP.search(str(version.tags.get("checkpoint", "")))
    return str(int(found.group(1))) if found else None


def incumbent_matrix(args: argparse.Namespace, client: Any, incumbent: Incumbent, out: Path
                     ) -> robustness.Matrix:
    """The incumbent's policy (the checkpoint its version was registered from) evaluated
    now, under the candidate's profile and overrides, logged as any ``workbench eval``."""
    profile = load_profile(args.profile, args.overrides)
    run_id = incumbent.version.run_id
    print(f"--not-worse-than {incumbent.alias}: evaluating {incumbent.text()}, run {run_id}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="workbench-promote-") as work:
        policy = evaluation.policy_of_run(client, run_id, Path(work),
                                          allowed_modules(args.allow_module),
                                          registered_checkpoint(incumbent.version))
        robustness.check_applicable(profile, policy.config)
        return evaluation.evaluate_policy(policy, args.profile, profile, client, out,
                                          args.overrides).matrix


def judge_cells(incumbent: robustness.Matrix, candidate: robustness.Matrix, margin: Margin,
                judge: Judge) -> list[tuple[str, Verdict]]:
    """Each cell of the candidate's matrix against the same cell of the incumbent's: their
    per-seed mean returns, at ``NOT_WORSE_ERROR`` shared among the cells."""
    level = NOT_WORSE_ERROR / len(candidate.results)
    rivals = []
    for result in candidate.results:
        before = incumbent.result(result.cell)
        if before is not None:
            rivals.append((result.cell.label,
                           judge(before.seed_returns, result.seed_returns, margin, level)))
    return rivals


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


def promote_command(args: argparse.Namespace, judge: Judge | None = None) -> int:
    """Gate, then register; exit 1 (nothing registered) when the gate fails. ``judge``
    compares the cells for ``--not-worse-than`` (the CLI passes the review layer's)."""
    export.quiet_downloads()
    client = export.open_store()
    run = export.get_run(client, args.run)
    if run.info.status != "FINISHED":
        raise ConfigError(f"--run {args.run}: the run is {run.info.status}; only a finished "
                          "run's policy can be promoted")
    check_may_write(client, run, planned_name(run, args.name))
    incumbent = find_incumbent(client, run, args)
    with tempfile.TemporaryDirectory(prefix="workbench-promote-") as out:
        gate, exported = run_gate(args, client, Path(out))
        if incumbent is not None and gate.passed:
            assert judge is not None, "--not-worse-than needs a judge"
            gate.incumbent = incumbent
            gate.margin = parse_margin(args.margin or DEFAULT_MARGIN, "--margin")
            assert gate.matrix is not None
            gate.rivals = judge_cells(incumbent_matrix(args, client, incumbent, Path(out)),
                                      gate.matrix, gate.margin, judge)
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
    if gate.worse_cells:
        assert gate.incumbent is not None
        worse = "; ".join(f"{label}: {v.line()}" for label, v in gate.worse_cells)
        print(f"workbench: promote refused: worse than {gate.incumbent.text()} under profile "
              f"{args.profile} (A: the incumbent, B: this run) in {len(gate.worse_cells)} of "
              f"{len(gate.rivals)} cells: {worse}; nothing registered")
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
    if gate.incumbent is not None:
        print(f"  {gate.rivalry_text()}")
    return 0

