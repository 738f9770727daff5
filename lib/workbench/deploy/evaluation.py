"""``workbench eval``: find the policy, run its robustness matrix, log it to MLflow.

    workbench eval --run RUN_ID [--checkpoint best|last|STEP] | --bundle DIR |
                   --repo-id ORG/NAME --revision REV | --policy FILE --env NAME
                   [--profile NAME] [--allow-module MODULE]... [KEY=VALUE ...]

``KEY=VALUE`` overrides the profile (``seeds=[0,1,2]``, ``factors.friction=[0.8,1.2]``). The
matrix itself is :mod:`workbench.deploy.robustness`; this module only connects it to its
sources (a run's checkpoint, a Hub bundle, an exported file) and to the tracking store: one
parent MLflow run (``workbench.kind=eval``) holding the matrix, and one nested run per cell,
logged as each cell finishes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import config
from workbench.config import ConfigError
from workbench.config.robustness import RobustnessProfile, load_profile
from workbench.deploy import export, hub, robustness, robustness_figures
from workbench.deploy.arguments import allowed_modules
from workbench.deploy.robustness import EvalPolicy, Matrix
from workbench.tracking import permissions
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import MAX_TAG_VALUE_LENGTH, truncate
from workbench.training.bundle import (
    PULL_TRUST_HINT,
    check_files,
    check_repo_id,
    load_bundle_source,
)

EXPERIMENT = "workbench"  # where an eval of a policy without a run is logged
# A login's own experiment on a team server, for an eval of a run it may only read.
OWN_EXPERIMENT = "workbench-{user}"


@dataclass
class EvalRun:
    """A finished ``workbench eval``: the matrix and the MLflow run holding it."""

    matrix: Matrix
    run_id: str
    directory: Path  # the written outputs
    artifacts: str = ""  # where the eval run keeps them: its artifact location's robustness/


def load_policy(args: argparse.Namespace, workdir: Path, client: Any) -> EvalPolicy:
    """The policy the arguments name, rebuilt as data (no pickle, no code from a store)."""
    allowed = allowed_modules(args.allow_module)
    if args.run:
        return policy_of_run(client, args.run, workdir, allowed, args.checkpoint)
    if args.policy:
        path = Path(args.policy)
        cfg = config.load_config([f"env={args.env}"])
        return robustness.policy_from_file(path, cfg)
    if args.repo_id:
        pulled = hub.pull(check_repo_id(args.repo_id), args.revision, allowed)
        directory, label = pulled.directory, f"bundle {pulled.repo_id}@{pulled.commit}"
    else:
        directory = hub.bundle_directory(args.bundle)
        label = f"bundle {directory}"
    checked = check_files(directory, label, allowed, PULL_TRUST_HINT)
    hub.verify_bundle(checked)
    source = load_bundle_source(checked, label=label)
    return EvalPolicy(config=source.config, actor=robustness.onnx_actor(
        directory / "policy.onnx"), origin=label, source=source,
        logged_eval=(source.eval_mean_reward, source.eval_std_reward))


def policy_of_run(client: Any, run_id: str, workdir: Path, allowed: Sequence[str] = (),
                  checkpoint: str | None = None) -> EvalPolicy:
    """A run's policy (its final checkpoint, or ``checkpoint``: best, last or a step)."""
    source = export.load_run(client, run_id, workdir, allowed, checkpoint)
    run = export.get_run(client, run_id)
    return robustness.policy_from_source(source, workdir, run_id, run.info.experiment_id)


def evaluate_run(run_id: str, profile_name: str = "gate", overrides: Sequence[str] = (),
                 checkpoint: str | None = None, out: Path | None = None) -> EvalRun:
    """``workbench eval --run RUN_ID --profile NAME [KEY=VALUE ...]`` from Python (the export
    notebook): the matrix, logged like the command's, its files in ``out`` (default: a
    temporary folder)."""
    profile = load_profile(profile_name, overrides)
    client = export.open_store()
    out = out or Path(tempfile.mkdtemp(prefix="workbench-eval-"))
    with tempfile.TemporaryDirectory(prefix="workbench-eval-policy-") as work:
        policy = policy_of_run(client, run_id, Path(work), checkpoint=checkpoint)
        robustness.check_applicable(profile, policy.config)
        return evaluate_policy(policy, profile_name, profile, client, out, overrides)


def evaluate_policy(policy: EvalPolicy, profile_name: str, profile: RobustnessProfile,
                    client: Any, out: Path, overrides: Sequence[str] = ()) -> EvalRun:
    """Run the matrix and log it: the parent run (with the profile's ``overrides``), a nested
    run per cell as it finishes, the outputs as artifacts, and the verdicts on the policy's
    own run where this login may write it."""
    experiment_id, tag_source = eval_experiment(client, policy)
    parent = client.create_run(experiment_id, run_name=f"eval-{profile_name}", tags={
        robustness.KIND_TAG: robustness.KIND, "robustness.profile": profile_name,
        "robustness.overrides": overrides_text(overrides),
        "robustness.policy": policy.origin[:500], "robustness.source_run": policy.run_id or "",
        "mlflow.note.content": f"workbench eval --profile {profile_name} of {policy.origin}"})
    parent_id = str(parent.info.run_id)
    print(f"eval run {parent_id}: profile {profile_name} on {policy.config.env.id} "
          f"({policy.origin})", flush=True)
    with robustness.closed_on_failure(client, [parent_id]):
        def on_cell(index: int, total: int, result: robustness.CellResult) -> None:
            robustness.log_cell(client, experiment_id, parent_id, result, profile_name)
            print(robustness.progress_line(index, total, result), flush=True)

        matrix = robustness.evaluate(policy, profile_name, profile, on_cell)
        names = write_outputs(matrix, out)
        for name in names:
            client.log_artifact(parent_id, str(out / name), robustness.ARTIFACT_DIR)
        client.log_metric(parent_id, "robustness/nominal_return", matrix.nominal.mean)
        client.log_metric(parent_id, "robustness/cells_failing", float(len(matrix.failing)))
        client.set_tag(parent_id, "robustness.passed", str(matrix.passed).lower())
        client.set_tag(parent_id, "robustness.verdicts", robustness.verdict_text(matrix))
        if policy.run_id and tag_source:
            for key, value in robustness.source_tags(matrix, parent_id).items():
                client.set_tag(policy.run_id, key, value)
        client.set_terminated(parent_id, "FINISHED")
    artifacts = f"{client.get_run(parent_id).info.artifact_uri}/{robustness.ARTIFACT_DIR}"
    return EvalRun(matrix, parent_id, out, redact_uri(artifacts))


def overrides_text(overrides: Sequence[str]) -> str:
    """The profile's ``KEY=VALUE`` overrides as one tag value (``none`` without any)."""
    return truncate(" ".join(overrides), MAX_TAG_VALUE_LENGTH) if overrides else "none"


def eval_experiment(client: Any, policy: EvalPolicy) -> tuple[str, bool]:
    """Where the eval run goes, and whether the policy's run gets the verdict tags.

    The policy's run's experiment (or ``workbench`` for a policy without a run) when this
    login may write there; on a team server where it may only read (a teammate's run), the
    login's own experiment ``workbench-<login>``, created if missing: the eval run links to
    the source run by its tag ``robustness.source_run``, and the source run is left as it
    was."""
    uri = str(client.tracking_uri)
    found = client.get_experiment_by_name(EXPERIMENT) if policy.experiment_id is None else None
    candidate = policy.experiment_id or (found.experiment_id if found else None)
    access = permissions.experiment_access(uri, candidate) if candidate else None
    if access is None or access.can_write:
        return str(candidate or experiment_for(client)), bool(policy.run_id)
    name = OWN_EXPERIMENT.format(user=access.user)
    own = client.get_experiment_by_name(name)
    mine = permissions.experiment_access(uri, own.experiment_id) if own else None
    if mine is not None and not mine.can_write:
        refusal = permissions.write_refusal(mine, "it", repr(name))
        raise ConfigError(f"experiment {name!r}: {refusal} on it; the eval of a run you may "
                          "only read goes there")
    print(f"note: your login {access.user} has {access.permission} on the experiment of "
          f"{policy.origin}: the eval run goes into your experiment {name!r}, linked to it by "
          "tag robustness.source_run; the source run's tags are left as they are", flush=True)
    return str(own.experiment_id if own else client.create_experiment(name)), False


def write_outputs(matrix: Matrix, directory: Path) -> list[str]:
    """``robustness.json``, ``robustness.md`` and the figures in ``directory``; their names."""
    directory.mkdir(parents=True, exist_ok=True)
    figures = robustness_figures.draw(matrix, directory)
    record = json.dumps(robustness.matrix_record(matrix), indent=2)
    (directory / "robustness.json").write_text(record + "\n")
    (directory / "robustness.md").write_text(robustness.matrix_markdown(matrix, figures))
    return ["robustness.json", "robustness.md", *figures]


def experiment_for(client: Any) -> str:
    """The default experiment's id, created when the store has none yet."""
    found = client.get_experiment_by_name(EXPERIMENT)
    return str(found.experiment_id if found else client.create_experiment(EXPERIMENT))


def print_summary(result: EvalRun) -> None:
    """Verdicts, the export check, the failing cells and where everything is."""
    matrix = result.matrix
    print(f"\nrobustness of {matrix.origin} ({matrix.profile_name}): nominal return "
          f"{matrix.nominal_text()}; a cell holds at >= {matrix.threshold:,.1f}")
    for line in matrix.verdicts():
        print(f"  {line}")
    if matrix.export_check:
        print(f"  {robustness.export_check_line(matrix.export_check)}")
    if matrix.failing:
        print(f"failing cells ({len(matrix.failing)} of {len(matrix.results)}): "
              + ", ".join(r.cell.label for r in matrix.failing))
    else:
        print(f"every cell holds ({len(matrix.results)} cells)")
    print(f"files: {result.artifacts or result.directory}\nMLflow run: {result.run_id}")


def eval_command(args: argparse.Namespace) -> int:
    """``workbench eval``: exit 0 when it ran (whatever the verdicts), 2 on bad input. The
    outputs are the eval run's artifacts; ``--out`` keeps a copy in a folder."""
    profile = load_profile(args.profile, args.overrides)
    export.quiet_downloads()
    client = export.open_store()
    with tempfile.TemporaryDirectory(prefix="workbench-eval-") as work:
        out = Path(args.out) if args.out else Path(work) / "robustness"
        policy = load_policy(args, Path(work), client)
        robustness.check_applicable(profile, policy.config)
        result = evaluate_policy(policy, args.profile, profile, client, out, args.overrides)
    print_summary(result)
    if args.out:
        print(f"copy: {out}")
    sys.stdout.flush()
    return 0
