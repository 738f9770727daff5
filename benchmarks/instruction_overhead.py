"""Tracking overhead counted in instructions: the same two programs as tracking_overhead.py,
run under valgrind's callgrind, which counts executed instructions (all threads) instead of
seconds. The count does not move with machine load, so it resolves the few per cent that wall
time on a shared machine cannot (identical programs differ by up to +-10 % there).

Each side runs twice, for a short and a long budget; the difference is the instructions of the
extra PPO iterations alone (imports, store set-up, manifest and saving cancel out). Printed:
instructions per iteration of each side and their ratio (the wall-time target is <= 1.03).

Under valgrind a program runs ~50-100x slower while timers keep real time, so work done every
N seconds happens ~100x more often per iteration than in a normal run: the progress bar's
redraws (10 per second), MLflow's system-metrics sampler (every 10 s) and the run heartbeat
(every 10 s). The first two are switched off by default (``--workbench-overrides`` to change),
and so is the final video: its length follows the training time (``video.max_share``), so the
longer run would also render a longer video and the difference would not be iterations alone;
the heartbeat is switched off here (its interval set to infinity in the measured process: it
has no setting) and costs natively one tag write per 10 s, ~13 ms of CPU, i.e. ~0.1 %.
Takes ~25 minutes on 2 cores.

    python benchmarks/instruction_overhead.py
    python benchmarks/instruction_overhead.py --workbench-overrides   # everything on
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from tracking_overhead import add_config_arguments, commands_for

QUIET = ["console.progress_bar=false", "console.iteration_lines=false",
         "tracking.system_metrics=false", "video=off"]
# ``python -m workbench`` with the run heartbeat's timer switched off (see above).
NO_HEARTBEAT = ("import sys, workbench.tracking.runs as runs; "
                "runs.HEARTBEAT_INTERVAL_S = float('inf'); "
                "from workbench.cli import main; sys.exit(main())")


def count_instructions(command: list[str], out_file: Path, env: dict[str, str]) -> int:
    """Total instructions executed by ``command`` (every thread), from callgrind's totals."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
         "--dump-instr=no", *command],
        cwd=harness.ROOT, env=env, capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"failed under callgrind ({proc.returncode}): {' '.join(command)}\n"
                         f"{proc.stderr[-2000:]}")
    match = re.search(r"^totals:\s*(\d+)", out_file.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"no totals in {out_file}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arguments(parser)
    parser.set_defaults(workbench_overrides=QUIET)
    parser.add_argument("--iterations", type=int, nargs=2, default=[1, 3],
                        metavar=("SHORT", "LONG"),
                        help="PPO iterations of the short and the long run (default 1 and 3)")
    parser.add_argument("--parallel", type=int, default=4,
                        help="callgrind processes at once (counts do not depend on it)")
    args = parser.parse_args()
    short, long = args.iterations
    if not 0 < short < long:
        parser.exit(2, f"instruction_overhead: --iterations {short} {long}: "
                       "need 0 < SHORT < LONG\n")
    if shutil.which("valgrind") is None:
        parser.exit(2, "instruction_overhead: valgrind is not installed: "
                       "apt-get install valgrind\n")

    tmp = Path(tempfile.mkdtemp(prefix="wb-callgrind-"))  # callgrind files: ~25 MB each
    try:
        measure(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(args: argparse.Namespace, tmp: Path) -> None:
    """Count, print and write the results (store and callgrind files in ``tmp``)."""
    short, long = args.iterations
    per_iteration = args.num_envs * args.n_steps
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
           "WORKBENCH_EXPERIMENTS": str(tmp)}
    # Create the store outside callgrind: its schema migration is not what is measured.
    subprocess.run(commands_for(args, per_iteration)[1], cwd=harness.ROOT, env=env,
                   capture_output=True, check=True)
    jobs = {}
    for iterations in (short, long):
        bare, workbench = commands_for(args, iterations * per_iteration)
        module = workbench.index("-m")
        jobs[("bare", iterations)] = bare
        jobs[("workbench", iterations)] = [*workbench[:module], "-c", NO_HEARTBEAT,
                                           *workbench[module + 2:]]
    print(f"counting instructions of {len(jobs)} runs under callgrind (~25 min on 2 cores)...",
          flush=True)
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = {key: pool.submit(count_instructions, command,
                                    tmp / f"callgrind.{key[0]}.{key[1]}", env)
                   for key, command in jobs.items()}
        totals = {key: future.result() for key, future in futures.items()}

    extra = long - short
    per_it = {side: (totals[(side, long)] - totals[(side, short)]) / extra
              for side in ("bare", "workbench")}
    ratio = per_it["workbench"] / per_it["bare"]
    print(f"\n{args.env_id}, {args.num_envs} envs, n_steps {args.n_steps}, batch "
          f"{args.batch_size}; workbench overrides: {' '.join(args.workbench_overrides) or '-'}")
    print(f"{'':<10} {f'{short} it.':>16} {f'{long} it.':>16} {'per iteration':>16}")
    for side in ("bare", "workbench"):
        print(f"{side:<10} {totals[(side, short)]:>16,} {totals[(side, long)]:>16,} "
              f"{per_it[side]:>16,.0f}")
    print(f"instructions per iteration, workbench/bare: {ratio:.4f}  (wall-time target <= 1.03)")
    out = harness.write_results("instruction_overhead", {
        "args": vars(args), "totals": {f"{s}/{i}": v for (s, i), v in totals.items()},
        "per_iteration": per_it, "ratio": ratio})
    print(f"results: {out}")


if __name__ == "__main__":
    main()
