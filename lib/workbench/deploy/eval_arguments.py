"""Arguments of ``workbench eval`` and ``workbench promote`` and the checks of their values.

Nothing here loads torch, SB3, MLflow or a simulator: bad input is answered in one line
(exit 2) before any of them is imported, before any policy is loaded or run created.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from workbench import config
from workbench.config import ConfigError
from workbench.config.margin import parse_margin
from workbench.config.robustness import load_profile, profile_names
from workbench.deploy.arguments import add_allow_module, check_checkpoint_choice

DEFAULT_PROFILE = "default"
GATE_PROFILE = "gate"
DEFAULT_MARGIN = "5%"  # promote --not-worse-than's, of the incumbent's IQM per cell
ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def add_checkpoint_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", metavar="best|last|STEP",
                        help="with --run: which checkpoint (default: the final one)")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The policy (one source), the profile and its overrides."""
    parser.add_argument("--run", metavar="RUN_ID", help="a finished run of the configured store")
    add_checkpoint_argument(parser)
    parser.add_argument("--bundle", metavar="DIR", help="a bundle pulled by `workbench hub pull`")
    parser.add_argument("--repo-id", metavar="ORG/NAME", help="pull this Hub bundle first")
    parser.add_argument("--revision", metavar="SHA|TAG", help="with --repo-id: the revision")
    parser.add_argument("--policy", metavar="FILE",
                        help="an exported policy.onnx or policy.pt (with --env)")
    parser.add_argument("--env", metavar="NAME", help="with --policy: its task (conf/env)")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, metavar="NAME",
                        help="conf/eval/<NAME>.yaml: the factors, values, seeds and tolerance "
                        f"(default {DEFAULT_PROFILE}; have: {', '.join(profile_names())})")
    parser.add_argument("--out", metavar="DIR",
                        help="write robustness.json/.md and the figures here (default: a "
                        "temporary folder; they are logged to MLflow either way)")
    add_allow_module(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="profile overrides, e.g. seeds=[0,1,2] factors.friction=[0.8,1.2]")


def check_checkpoint(value: str | None) -> None:
    """``--checkpoint``, when given, as ``workbench export`` checks it."""
    if value is not None:
        check_checkpoint_choice(value)


def check_eval_arguments(args: argparse.Namespace) -> None:
    """Exactly one policy source, complete, before anything is loaded (one line, exit 2)."""
    given = [name for name in ("run", "bundle", "repo_id", "policy") if getattr(args, name)]
    if len(given) != 1:
        raise ConfigError("workbench eval: name one policy: --run RUN_ID, --bundle DIR, "
                          "--repo-id ORG/NAME --revision REV or --policy FILE --env NAME")
    if args.repo_id and not args.revision:
        raise ConfigError("--repo-id needs --revision SHA|TAG (the commit to evaluate)")
    if args.revision and not args.repo_id:
        raise ConfigError("--revision: only with --repo-id ORG/NAME")
    if args.checkpoint is not None and not args.run:
        raise ConfigError("--checkpoint chooses a run's checkpoint: use it with --run RUN_ID")
    check_checkpoint(args.checkpoint)
    if args.env and not args.policy:
        raise ConfigError("--env names the task of an exported file: use it with --policy")
    if args.policy:
        path = Path(args.policy)
        if path.suffix not in (".onnx", ".pt") or not path.is_file():
            raise ConfigError(f"--policy {args.policy}: not an exported policy.onnx or "
                              "policy.pt file; give a file workbench export wrote")
        if not args.env:
            raise ConfigError(f"--policy {args.policy}: name its task with --env NAME "
                              "(a conf/env option, e.g. --env hopper)")
        if args.env not in config.group_options("env"):
            raise ConfigError(f"--env {args.env}: not a conf/env option; choose one of "
                              f"{', '.join(config.group_options('env'))}")


def add_promote_arguments(parser: argparse.ArgumentParser) -> None:
    """The run, the alias, the gate's profile and the registered model's name."""
    parser.add_argument("--run", metavar="RUN_ID", required=True,
                        help="the finished run whose policy is promoted")
    add_checkpoint_argument(parser)
    parser.add_argument("--alias", required=True, metavar="ALIAS",
                        help="registry alias to set, e.g. candidate or on-robot")
    parser.add_argument("--profile", default=GATE_PROFILE, metavar="NAME",
                        help=f"the gate: conf/eval/<NAME>.yaml, every cell must hold "
                        f"(default {GATE_PROFILE})")
    parser.add_argument("--name", metavar="MODEL",
                        help="registered model name (default: <env>-<algo>, e.g. hopper-ppo)")
    parser.add_argument("--not-worse-than", metavar="ALIAS",
                        help="also evaluate the policy holding ALIAS (e.g. on-robot) under the "
                        "same profile, and refuse a candidate worse than it in any cell")
    parser.add_argument("--margin", metavar="M",
                        help=f"with --not-worse-than: how much worse a cell may be, a share of "
                        f"the incumbent's IQM (5%%) or a return (default {DEFAULT_MARGIN})")
    add_allow_module(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="profile overrides, e.g. seeds=[0,1,2]")


def check_promote_arguments(args: argparse.Namespace) -> None:
    """Alias, model name and checkpoint well-formed, the profile loads, and an alias the
    profile locks gets the profile as written (one line, exit 2)."""
    check_checkpoint(args.checkpoint)
    if not ALIAS.match(args.alias) or args.alias.lower() == "latest":
        raise ConfigError(f"--alias {args.alias!r}: an alias is a letter then letters, digits, "
                          "'-' or '_' (not 'latest', which MLflow reserves); e.g. --alias "
                          "candidate or --alias on-robot")
    if args.name is not None and not MODEL_NAME.match(args.name):
        raise ConfigError(f"--name {args.name!r}: a model name is letters, digits, '.', '-' "
                          "or '_' (e.g. --name hopper-ppo)")
    if args.not_worse_than is not None and not ALIAS.match(args.not_worse_than):
        raise ConfigError(f"--not-worse-than {args.not_worse_than!r}: not a registry alias; "
                          "name the alias of the policy to beat, e.g. --not-worse-than on-robot")
    if args.margin is not None and args.not_worse_than is None:
        raise ConfigError(f"--margin {args.margin}: it says how much worse than the policy of "
                          "--not-worse-than a cell may be; give --not-worse-than ALIAS too")
    parse_margin(args.margin or DEFAULT_MARGIN, "--margin")
    profile = load_profile(args.profile, args.overrides)
    if args.overrides and args.alias in profile.locked_aliases:
        raise ConfigError(
            f"--alias {args.alias}: profile {args.profile} locks it (locked_aliases in "
            f"conf/eval/{args.profile}.yaml): its gate runs as written, without "
            f"{' '.join(args.overrides)}; drop the overrides, or promote to another alias "
            "(e.g. --alias candidate)")
