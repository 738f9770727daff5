"""The physical limit and how close each vectorization backend gets to it.

``C_phys`` (per MuJoCo task): MuJoCo's own stepping rate, ``mj_step`` with ``nstep=frame_skip``
in C (random controls, one Python call per env step), on one core, times the machine's
physical cores, divided by the task's frame skip: the env-steps/s no Python or IPC overhead
could beat. It is a ceiling, so the best of ``--reps`` measurements is kept.

``R_env`` = random-action vectorized stepping rate / ``C_phys``, per backend (``dummy``,
``subproc``, ``envpool``) and ``num_envs`` in {1, 2, 4, 8, 16}; the median of ``--reps``
measurements, interleaved (rep by rep, every backend and size) so load drift hits all alike.
Rates come from ``workbench.envs.calibration.stepping_rate``, the loop ``workbench calibrate``
uses, over the environments ``workbench.envs.vector.make_envs`` builds for training.

    python benchmarks/physics.py                # all MuJoCo tasks' C_phys; R_env on HalfCheetah
    python benchmarks/physics.py --quick        # HalfCheetah only, 1 and 16 envs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

TASKS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "Swimmer-v5",
         "InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Reacher-v5"]
BACKENDS = ["dummy", "subproc", "envpool"]
SIZES = [1, 2, 4, 8, 16]


def mj_steps_per_second(env_id: str, seconds: float) -> tuple[float, int]:
    """Single-core ``mj_step`` rate of the task's model and its frame skip."""
    import gymnasium
    import mujoco
    import numpy as np

    env = gymnasium.make(env_id)
    model, data = env.unwrapped.model, env.unwrapped.data  # type: ignore[attr-defined]
    frame_skip = int(env.unwrapped.frame_skip)  # type: ignore[attr-defined]
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    low, high = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    controls = rng.uniform(low, high, (1000, model.nu))
    steps, started, elapsed = 0, time.perf_counter(), 0.0
    while elapsed < seconds:
        for ctrl in controls:
            data.ctrl[:] = ctrl
            mujoco.mj_step(model, data, nstep=frame_skip)
        steps += len(controls) * frame_skip
        mujoco.mj_resetData(model, data)  # an episode's worth, then start over (no blow-up)
        elapsed = time.perf_counter() - started
    env.close()
    return steps / elapsed, frame_skip


def physical_cores() -> int:
    from workbench.envs.cores import physical_cores as cores

    return cores()


def measure_cphys(tasks: list[str], reps: int, seconds: float) -> dict[str, dict[str, float]]:
    cores = physical_cores()
    table: dict[str, dict[str, float]] = {}
    for env_id in tasks:
        best, frame_skip = 0.0, 1
        for _ in range(reps):
            rate, frame_skip = mj_steps_per_second(env_id, seconds)
            best = max(best, rate)
        table[env_id] = {"mj_steps_per_s_per_core": best, "frame_skip": frame_skip,
                         "cores": cores, "c_phys": best * cores / frame_skip}
    return table


def measure_renv(env_id: str, backends: list[str], sizes: list[int], reps: int,
                 seconds: float) -> tuple[dict[str, dict[int, list[float]]], list[float]]:
    """Interleaved: rep, then the task's C_phys, then size, then backend.

    Returns the stepping rates and the C_phys measured in each rep, so that every rate is
    divided by the ceiling measured minutes apart from it, not by one from another moment
    (on shared machines the speed drifts by +-20 % within minutes).
    """
    from workbench.envs import envpool_vec
    from workbench.envs.calibration import stepping_rate
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_envs

    usable = [b for b in backends if b != "envpool" or envpool_vec.is_installed()]
    rates: dict[str, dict[int, list[float]]] = {b: {n: [] for n in sizes} for b in usable}
    limits: list[float] = []
    for rep in range(reps):
        limits.append(measure_cphys([env_id], 1, seconds)[env_id]["c_phys"])
        for n in sizes:
            for backend in usable:
                venv = make_envs(EnvSpec(env_id, n, vec_env=backend, seed=rep))
                try:
                    rates[backend][n].append(stepping_rate(venv, seconds))
                finally:
                    venv.close()
        print(f"  R_env rep {rep + 1}/{reps} done ({harness.load_line()})", flush=True)
    return rates, limits


def paired_ratios(rates: list[float], limits: list[float]) -> list[float]:
    """Each rep's rate over the same rep's C_phys."""
    return [r / c for r, c in zip(rates, limits, strict=True)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks", nargs="+", help="tasks for C_phys (default: all MuJoCo)")
    parser.add_argument("--env-id", default="HalfCheetah-v5", help="task for R_env")
    parser.add_argument("--backends", nargs="+", default=BACKENDS, choices=BACKENDS)
    parser.add_argument("--sizes", nargs="+", type=int)
    parser.add_argument("--reps", type=int)
    parser.add_argument("--seconds", type=float, help="stepping time per measurement")
    args = parser.parse_args(argv)
    tasks = args.tasks or ([args.env_id] if args.quick else TASKS)
    sizes = args.sizes or ([1, 16] if args.quick else SIZES)
    reps = args.reps or (1 if args.quick else 3)
    seconds = args.seconds or (0.4 if args.quick else 1.0)
    print(f"physics: {harness.load_line()}", flush=True)

    cphys = measure_cphys(tasks, reps, seconds)
    harness.print_table(
        f"C_phys: MuJoCo's stepping limit (best of {reps}), env-steps/s on "
        f"{physical_cores()} physical cores",
        ["task", "mj_step/s/core", "frame_skip", "C_phys env-steps/s"],
        [[t, v["mj_steps_per_s_per_core"], v["frame_skip"], v["c_phys"]]
         for t, v in cphys.items()])

    rates, limits = measure_renv(args.env_id, args.backends, sizes, reps, seconds)
    renv = {b: {n: harness.median(paired_ratios(v, limits)) for n, v in per.items()}
            for b, per in rates.items()}
    harness.print_table(
        f"R_env = vectorized random-action env-steps/s / C_phys of the same rep "
        f"(C_phys {harness.median(limits):.0f} median), {args.env_id}, median of {reps}",
        ["backend", *[f"{n} envs" for n in sizes], "best steps/s"],
        [[b, *[renv[b][n] for n in sizes], max(harness.median(v) for v in rates[b].values())]
         for b in rates])
    best_at_max = max(renv[b][max(sizes)] for b in renv)
    print(f"  best R_env at {max(sizes)} envs: {best_at_max:.2f} (target >= 0.5)")
    data = {"c_phys": cphys, "r_env": renv, "rates": rates, "c_phys_per_rep": limits,
            "env_id": args.env_id,
            "args": vars(args), "best_r_env_at_max_envs": best_at_max}
    path = harness.write_results("physics", data)
    print(f"results: {path}  ({harness.load_line()})")
    return data


if __name__ == "__main__":
    main()
