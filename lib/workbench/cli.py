"""Command line: ``workbench COMMAND [--flags] [OVERRIDES...]`` (also ``python -m workbench``).

One grammar for every command: argparse flags, and Hydra overrides as positional arguments
where a command composes a config (train, sweep, tune, ui, report, compare, runs, manifest
diff). Every parse error is one line (``workbench: error: COMMAND: ...``), exit code 2.

Exit codes: 0 success; 2 bad input, reported in one line before any compute;
130/143 interrupted (SIGINT/SIGTERM); 1 anything else.

Each command's module is imported only when that command runs (the ``from workbench...``
lines inside the ``setup_*`` functions), and a command that loads torch, stable-baselines3,
MLflow, matplotlib or the simulator imports those modules only after its input is checked:
its arguments come from a light module (``deploy.arguments``, ``review.options``), its config
is composed and checked by the config layer or the light request modules
(``sweeps.request``, ``tuning.request``) first. ``workbench --help`` or a typo then answers
at once. This is the only layer that imports lazily, and nothing imports it.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

from workbench import config
from workbench.config import ConfigError
from workbench.console import printable

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
Runner = Callable[[argparse.Namespace], int]


class BadInput(Exception):
    """A command-line argument that is not usable (exit code 2)."""


class Parser(argparse.ArgumentParser):
    """argparse with the workbench's error style: one line, raised as :class:`BadInput`."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("workbench").strip()
        raise BadInput(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")


def add_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    """The positional Hydra overrides of a command that composes the config."""
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help=f"Hydra overrides, e.g. {example}")


# --------------------------------------------------------------------------- train


def config_epilog() -> str:
    """The config groups with their options, and the presets (``train --help``)."""
    lines = ["config groups (choose with GROUP=OPTION, e.g. env=hopper):"]
    for group in config.GROUPS:
        if group in ("experiment", *config.CHOSEN_GROUPS):
            continue
        lines.append(f"  {group:<10} {', '.join(config.group_options(group))}")
    for group, origin in config.CHOSEN_GROUPS.items():
        lines.append(f"  {group:<10} chosen from {origin}: "
                     f"{', '.join(config.group_options(group))}; ~{group} leaves it out")
    lines.append("presets (experiment=NAME): " + ", ".join(config.group_options("experiment")))
    lines.append("print the composed config without training: workbench train --cfg job "
                 "[OVERRIDES]")
    return "\n".join(lines)


def setup_train(parser: argparse.ArgumentParser) -> Runner:
    """``workbench train [--cfg job] [OVERRIDES]``."""
    parser.add_argument("--cfg", choices=("job",),
                        help="print the composed config (Hydra's --cfg job) and exit; no run")
    add_overrides(parser, "env=hopper env.num_envs=8 algo.n_steps=256 seed=3")
    parser.epilog = config_epilog()
    return run_train


def run_train(args: argparse.Namespace) -> int:
    """Train one run and print its MLflow run id (or, with ``--cfg job``, the config)."""
    # The config layer's checks first: a typo answers before torch, SB3 and MLflow load.
    composed = config.precheck(args.overrides)
    from workbench.training import load_config, train  # torch, SB3, MLflow: only to train

    cfg = load_config(args.overrides, composed)
    if args.cfg == "job":  # as Hydra's --cfg job: the composed, checked config, no run
        print(config.to_yaml(cfg), end="")
        return EXIT_OK
    run_info = {
        "started_by": "cli",
        "command": shlex.join(["workbench", *sys.argv[1:]]),
        "argv": list(sys.argv),
        "overrides": list(args.overrides),
    }
    print(train(cfg, run_info=run_info).run_id)
    return EXIT_OK


# --------------------------------------------------------------------------- other commands


def setup_sweep(parser: argparse.ArgumentParser) -> Runner:
    """``workbench sweep [OVERRIDES]``."""
    parser.add_argument("--yes", action="store_true",
                        help="run a grid of more than sweep.max_points points (default 64)")
    add_overrides(parser, "env=hopper 'sweep.num_envs=[1,2,4]' 'sweep.n_steps=[128,256]' "
                          "'sweep.seeds=[0,1]' total_timesteps=50000")
    from workbench.sweeps import request

    def run(args: argparse.Namespace) -> int:
        # before MLflow, torch, the simulator
        checked = request.check_request(args.overrides, yes=args.yes)
        if checked.sweep.verify.margin is not None:  # sweep=verify: stages until decided
            from workbench.review import verification

            return verification.run_command(checked, args.overrides, args.yes)
        from workbench.sweeps.sweep import ClusterLost, run_sweep

        try:
            result = run_sweep(checked)
        except ClusterLost as exc:
            print(f"workbench: {printable(str(exc))}", file=sys.stderr)
            return EXIT_FAILED
        if result.failures:
            listed = ", ".join(f"{o.point} ({o.error})" for o in result.failures)
            print(f"workbench: {len(result.failures)} of {len(result.outcomes)} points did not "
                  f"finish: {printable(listed)}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK

    return run


def setup_tune(parser: argparse.ArgumentParser) -> Runner:
    """``workbench tune [--n-trials N] [OVERRIDES]``."""
    parser.add_argument("--n-trials", type=int, metavar="N",
                        help="trials of the study in total, every worker's counted; running "
                             "the command again runs the rest (same as tune.n_trials=N)")
    parser.add_argument("--yes", action="store_true",
                        help="train on more seeds than tune.max_seeds (default 20)")
    add_overrides(parser, "env=hopper search=ppo tune.objective=time_to_target "
                          "tune.target=2000 tune.budget_s=120 tune.workers=2")
    from workbench.tuning import request

    def run(args: argparse.Namespace) -> int:
        # before MLflow, torch
        checked = request.check_request(args.overrides, args.n_trials, yes=args.yes)
        from workbench.review.statistics import judge_over_seeds
        from workbench.sweeps.point import ClusterLost
        from workbench.tuning.study import run_tune

        try:
            result = run_tune(checked, judge=judge_over_seeds)
        except ClusterLost as exc:
            print(f"workbench: {printable(str(exc))}", file=sys.stderr)
            return EXIT_FAILED
        if result.failures:
            listed = ", ".join(f"{r.number} ({r.error})" for r in result.failures)
            print(f"workbench: {len(result.failures)} of {len(result.records)} trials failed: "
                  f"{printable(listed)}", file=sys.stderr)
            return EXIT_FAILED
        if result.recheck and result.recheck.failed:
            print(f"workbench: the best trials were {result.recheck.verdict}; run the same "
                  "command again to check them", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK

    return run


def setup_ui(parser: argparse.ArgumentParser) -> Runner:
    """``workbench ui [--host] [--port] [--workers] [--meeting] [--filter EXPR] [OVERRIDES]``."""
    from workbench.review import ui

    ui.add_cli_arguments(parser)
    add_overrides(parser, "tracking.uri=sqlite:///path/to/mlflow.db")
    return ui.run_command


def setup_calibrate(parser: argparse.ArgumentParser) -> Runner:
    """``workbench calibrate [--seconds S] [OVERRIDES]``."""
    from workbench.envs import calibration

    calibration.add_cli_arguments(parser)
    return calibration.run_command


def setup_server(parser: argparse.ArgumentParser) -> Runner:
    """``workbench server start|stop|status``."""
    from workbench.team import server

    server.add_cli_arguments(parser)
    return server.run_command


def setup_runs(parser: argparse.ArgumentParser) -> Runner:
    """``workbench runs copy|reap|sync``: one sub-parser per action, each setting ``runs_func``."""
    from workbench.team import migrate
    from workbench.tracking import runs

    actions = parser.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    copy = actions.add_parser("copy", help=migrate.COPY_HELP, description=migrate.COPY_HELP)
    migrate.add_cli_arguments(copy)
    copy.set_defaults(runs_func=migrate.run_command)
    runs.add_cli_actions(actions)
    return lambda args: int(args.runs_func(args))


def setup_manifest(parser: argparse.ArgumentParser) -> Runner:
    """``workbench manifest [--format]``, ``manifest diff RUN_A RUN_B``, ``manifest lock RUN``."""
    from workbench.tracking import manifest_diff

    manifest_diff.add_cli_arguments(parser)
    return manifest_diff.run_command


def setup_report(parser: argparse.ArgumentParser) -> Runner:
    """``workbench report [selectors] [output options] [thresholds] [OVERRIDES]``."""
    from workbench.review import options

    options.add_cli_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        options.check_arguments(args)  # before MLflow, matplotlib, torch and the simulator
        from workbench.review import report

        return report.run_command(args)

    return run


def setup_compare(parser: argparse.ArgumentParser) -> Runner:
    """``workbench compare A B [--sweep ID] [--target R] [--margin M] [--allow-different-tasks]
    [--json] [OVERRIDES]``."""
    from workbench.review import compare_request

    compare_request.add_cli_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        compare_request.check_arguments(args)  # before MLflow, numpy, matplotlib and torch
        from workbench.review import comparison

        return comparison.run_command(args)

    return run


def setup_export(parser: argparse.ArgumentParser) -> Runner:
    """``workbench export --run RUN_ID | --bundle DIR | --repo-id ORG/NAME --revision REV``."""
    from workbench.deploy import arguments

    arguments.add_export_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        arguments.check_export_arguments(args)  # before torch, SB3, MLflow and the simulator
        from workbench.deploy import commands

        return commands.export_command(args)

    return run


def setup_hub(parser: argparse.ArgumentParser) -> Runner:
    """``workbench hub push|pull``."""
    from workbench.deploy import arguments

    arguments.add_hub_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        from workbench.deploy import commands

        return commands.hub_command(args)

    return run


def setup_deploy(parser: argparse.ArgumentParser) -> Runner:
    """``workbench deploy verify --run RUN_ID``."""
    from workbench.deploy import arguments

    arguments.add_deploy_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        arguments.check_deploy_arguments(args)  # before torch, SB3, MLflow and the simulator
        from workbench.deploy import commands

        return commands.deploy_command(args)

    return run


def setup_eval(parser: argparse.ArgumentParser) -> Runner:
    """``workbench eval --run RUN_ID | --bundle DIR | ... [--profile NAME] [KEY=VALUE ...]``."""
    from workbench.deploy import eval_arguments

    eval_arguments.add_eval_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        eval_arguments.check_eval_arguments(args)  # before torch, SB3, MLflow and the simulator
        from workbench.config.robustness import load_profile

        load_profile(args.profile, args.overrides)
        from workbench.deploy import evaluation

        return evaluation.eval_command(args)

    return run


def setup_promote(parser: argparse.ArgumentParser) -> Runner:
    """``workbench promote --run RUN_ID --alias ALIAS [--profile NAME]``."""
    from workbench.deploy import eval_arguments

    eval_arguments.add_promote_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        eval_arguments.check_promote_arguments(args)
        from workbench.config.robustness import load_profile

        load_profile(args.profile, args.overrides)
        from workbench.deploy import promotion
        from workbench.review.noninferiority import judge_return

        return promotion.promote_command(args, judge=judge_return)

    return run


@dataclass(frozen=True)
class Command:
    """One ``workbench`` verb: its help line and what adds its arguments."""

    help: str
    setup: Callable[[argparse.ArgumentParser], Runner]


COMMANDS: dict[str, Command] = {
    "train": Command("train one run (algo=ppo|a2c|sac|td3|tqc|crossq); prints its MLflow "
                     "run id", setup_train),
    "sweep": Command("sweep notebooks/train.ipynb over a grid of config keys x sweep.seeds "
                     "with papermill: sweep.grid={KEY:[VALUES],...} and/or sweep.num_envs x "
                     "sweep.n_steps", setup_sweep),
    "tune": Command("tune hyperparameters: an Optuna study over search.params whose trials are "
                    "papermill executions of notebooks/train.ipynb", setup_tune),
    "ui": Command("open the MLflow UI on the configured store (127.0.0.1)", setup_ui),
    "calibrate": Command("measure the vectorization backends for the configured task and "
                         "show which env.vec_env=auto uses", setup_calibrate),
    "server": Command("team mode: shared MLflow server on PostgreSQL with basic auth: "
                      "server start|stop|status", setup_server),
    "runs": Command("recorded runs: runs copy --from URI --to URI; runs reap; runs sync",
                    setup_runs),
    "manifest": Command("print this machine's environment manifest; "
                        "'manifest diff RUN_A RUN_B' compares two runs; 'manifest lock RUN' "
                        "writes a requirements file recreating a run's environment",
                        setup_manifest),
    "report": Command("write a review report for a sweep, an experiment or runs; "
                      "prints the path of its index.html", setup_report),
    "compare": Command("what changed between two runs, configs or sweep points (A B: run id, "
                       "config id, SWEEP_ID/POINT) and whether it mattered: seeds, IQM, "
                       "P(B > A), a verdict", setup_compare),
    "export": Command("export a run's policy to TorchScript + ONNX, verify parity, replay and "
                      "latency: export --run RUN_ID", setup_export),
    "deploy": Command("rehearse a robot deployment: deploy verify --run RUN_ID runs the "
                      "exported runner in its own process against MuJoCo in real time",
                      setup_deploy),
    "eval": Command("a policy (run, bundle or exported file) over a robustness matrix of "
                    "perturbations x seeds (conf/eval/<profile>.yaml): verdicts, heatmaps, "
                    "nested MLflow runs", setup_eval),
    "promote": Command("register a run's policy in the MLflow model registry under an alias "
                       "when its export parity and robustness gate hold", setup_promote),
    "hub": Command("Hugging Face Hub: hub push --run RUN_ID --repo-id ORG/NAME | "
                   "hub pull --repo-id ORG/NAME --revision SHA|TAG", setup_hub),
}


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, dict[str, Runner]]:
    """The parser; only the command named in ``argv`` gets its arguments (and its imports).

    Returns it with the runner of that command (an empty dict when ``argv`` names none).
    """
    parser = Parser(
        prog="workbench", allow_abbrev=False,
        description="Experiment workbench for deep RL on robots (PPO, A2C, SAC, TD3, TQC and "
                    "CrossQ on MuJoCo; MLflow, Hydra).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runners: dict[str, Runner] = {}
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if name in argv[:1]:
            runners[name] = command.setup(p)
            p.set_defaults(command_parser=p)
    return parser, runners


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, Runner]:
    """The parsed arguments and the runner of their command; an unknown argument is reported
    by that command's parser (``workbench export: unrecognized arguments: ...``)."""
    parser, runners = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args, runners[args.command]


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (a scheduler's kill) takes the same clean path as Ctrl-C: the run is marked
    # KILLED and the environments are closed; the exit code tells the two apart.
    raise KeyboardInterrupt(signal.Signals(signum).name)


MAX_ERROR_LENGTH = 1000  # characters of an error line; a quoted value beyond is cut


def shortened(line: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """``line`` within ``limit`` characters: its middle left out (the start names the input,
    the end says the fix), saying how much."""
    if len(line) <= limit:
        return line
    left = f" [... {len(line) - limit} characters left out ...] "
    keep = (limit - len(left)) // 2
    return line[:keep] + left + line[-keep:]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``workbench`` command; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    received: list[int] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        _raise_interrupt(signum, frame)

    signal.signal(signal.SIGTERM, on_term)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A shell starts background jobs (`workbench sweep ... &` in a script) with SIGINT
        # ignored; Ctrl-C and `kill -INT` must still stop the work cleanly.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        args, run = parse(argv)
        return int(run(args))
    except (ConfigError, BadInput) as exc:
        # One line, whatever the message quotes (a run's name, a tag read from a store), and
        # a readable one, however long the value it quotes.
        print(f"workbench: error: {shortened(printable(str(exc)))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        print("workbench: interrupted", file=sys.stderr)
        # workbench.training.faults.TrainingInterrupted carries the signal that stopped training.
        sigterm = received or getattr(exc, "signum", None) == signal.SIGTERM
        return EXIT_SIGTERM if sigterm else EXIT_SIGINT
    finally:
        stop_worker_servers()


def stop_worker_servers() -> None:
    """Stop multiprocessing's helper processes when environments were built (no orphans)."""
    cores: Any = sys.modules.get("workbench.envs.cores")  # loaded only if envs were built
    if cores is not None:
        cores.stop_worker_servers()


if __name__ == "__main__":
    sys.exit(main())
