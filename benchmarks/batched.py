"""Randomized sampling: ``env.vec_env=batched`` against dummy, subproc and EnvPool, side by side.

Robot runs train under domain randomization, which EnvPool's C++ tasks cannot take. Per task
(the mini duck and HalfCheetah-v5 by default) this measures, in one run, the random-action
stepping rate (``workbench.envs.calibration.stepping_rate``, as ``physics.py``'s ``R_env``)
of the environments ``workbench.envs.vector.make_envs`` builds for training:

- ``dummy``, ``subproc`` and ``batched`` under every factor of ``env.randomization``
  (:data:`RANDOMIZATION`: the heaviest setting, each wrapper and per-episode physics);
- ``batched`` and ``envpool`` without randomization (EnvPool runs gymnasium's MuJoCo tasks
  only, not the duck), the speed randomization is measured against;

each divided by the task's ``C_phys`` measured in the same repetition (``physics.py``:
``mj_step`` in C on one core, times the physical cores, over the frame skip). Repetitions
are interleaved (rep, then task, then backend) so load drift hits all alike; the table gives
medians. The goals (docs/benchmarks.md#batched-physics-with-randomization): ``batched``
with randomization at >= 0.5 of ``C_phys``, and at least 0.8 of EnvPool without it.

``C_phys`` assumes every core steps at the one-core rate. Each rep also measures what the
machine gives threads at once (``mj_step`` on separate copies in one thread per core, the GIL
released, against one thread): a shared or throttled machine gives less than its core count,
and every threaded backend (batched, EnvPool) with it. And where a batched, randomized step's
time goes: CPU time per env step of the physics (with its snapshot) and of the rest (the
tasks' and wrappers' Python, serial on the learner's thread), and the rate that split allows
at best on this machine's cores.

With ``WORKBENCH_BENCH_REFERENCE=1`` the results land in ``benchmarks/reference/batched.json``,
whose tables ``scripts/render_docs.py`` renders into docs/benchmarks.md.

    python benchmarks/batched.py                 # 16 envs, 3 reps of 1 s per backend
    python benchmarks/batched.py --quick         # 1 rep of 0.4 s
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import physics

TASKS = {"duck": "Workbench/MiniDuck-v0", "halfcheetah": "HalfCheetah-v5"}
# (backend, randomized): the rows of the table, in the order they are measured
CASES = [("dummy", True), ("subproc", True), ("batched", True), ("batched", False),
         ("envpool", False)]
GOAL_C_PHYS = 0.5  # batched, randomized: at least this share of C_phys
GOAL_ENVPOOL = 0.8  # batched, randomized: at least this share of EnvPool's unrandomized rate


def randomization() -> Any:
    """Every factor of ``env.randomization`` at robot-like ranges."""
    from workbench.config import RandomizationConfig

    return RandomizationConfig(obs_noise_std=0.01, action_noise_std=0.05, action_delay=1,
                               friction=[0.5, 1.5], mass_scale=[0.8, 1.2],
                               damping=[0.8, 1.2], actuator_gain=[0.8, 1.2])


def runnable(env_id: str, backend: str) -> bool:
    """EnvPool only where it is installed and runs the task."""
    from workbench.envs import envpool_vec

    return backend != "envpool" or envpool_vec.unsupported_reason(env_id) is None


def thread_capacity(env_id: str, seconds: float) -> float:
    """Cores' worth of ``mj_step`` that one thread per physical core gets at once (copies of
    the task's model, the GIL released), against one thread alone: the cores' count on an
    idle machine of its own."""
    import threading
    import time

    import gymnasium
    import mujoco

    env = gymnasium.make(env_id)
    model = env.unwrapped.model  # type: ignore[attr-defined]
    threads = physics.physical_cores()

    def steps_in(data: Any, until: float, counts: list[int]) -> None:
        while time.perf_counter() < until:
            mujoco.mj_step(model, data, nstep=10)
            counts.append(10)

    def rate(count: int) -> float:
        counts: list[int] = []
        until = time.perf_counter() + seconds
        workers = [threading.Thread(target=steps_in, args=(mujoco.MjData(model), until, counts))
                   for _ in range(count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return sum(counts) / seconds

    one = rate(1)
    env.close()
    return rate(threads) / one


def measure(tasks: list[str], num_envs: int, reps: int, seconds: float) -> tuple[
        dict[str, dict[str, list[float]]], dict[str, list[float]], list[float],
        dict[str, list[dict[str, float]]]]:
    """Rates per task and case (``backend`` or ``backend+rand``), C_phys per task, the
    threads' capacity (:func:`thread_capacity`) and the time split (:func:`time_split`),
    per rep."""
    from workbench.envs import robots  # noqa: F401  (registers the duck for C_phys)
    from workbench.envs.calibration import stepping_rate
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_envs

    rates: dict[str, dict[str, list[float]]] = {task: {} for task in tasks}
    limits: dict[str, list[float]] = {task: [] for task in tasks}
    capacity: list[float] = []
    splits: dict[str, list[dict[str, float]]] = {task: [] for task in tasks}
    for rep in range(reps):
        capacity.append(thread_capacity(tasks[0], seconds))
        for task in tasks:
            limits[task].append(physics.measure_cphys([task], 1, seconds)[task]["c_phys"])
            for backend, randomized in CASES:
                if not runnable(task, backend):
                    continue
                spec = EnvSpec(task, num_envs, vec_env=backend, seed=rep,
                               randomization=randomization() if randomized else None)
                venv = make_envs(spec)
                try:
                    rate = stepping_rate(venv, seconds)
                finally:
                    venv.close()
                rates[task].setdefault(label(backend, randomized), []).append(rate)
            splits[task].append(time_split(task, num_envs, seconds))
        print(f"  rep {rep + 1}/{reps} done ({harness.load_line()})", flush=True)
    return rates, limits, capacity, splits


def time_split(env_id: str, num_envs: int, seconds: float) -> dict[str, float]:
    """CPU microseconds per env step of batched with every factor, in one thread: the physics
    (plan, snapshot, ``mj_step``) and the rest of the step (the Python of tasks, wrappers and
    the VecEnv loop)."""
    import time

    import numpy as np
    from workbench.envs.backends import build_backend
    from workbench.envs.batched import BatchedVecEnv
    from workbench.envs.calibration import random_actions
    from workbench.envs.spec import EnvSpec

    venv = build_backend(EnvSpec(env_id, num_envs, vec_env="batched",
                                 randomization=randomization(), num_threads=1))
    batched = venv.unwrapped
    assert isinstance(batched, BatchedVecEnv)
    rng = np.random.default_rng(0)
    venv.reset()
    total = physics_s = 0.0
    steps = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        actions = random_actions(venv, rng)
        before = time.process_time()
        for copy, action in zip(batched.copies, actions, strict=True):  # the physics alone
            copy.plan(action)
        batched.threads.run(batched.copies)
        for copy in batched.copies:
            copy.settle()  # undone: the step below plans and steps again
        physics_s += time.process_time() - before
        before = time.process_time()
        venv.step(actions)
        total += time.process_time() - before
        steps += num_envs
    venv.close()
    return {"physics_us": 1e6 * physics_s / steps, "rest_us": 1e6 * (total - physics_s) / steps}


def label(backend: str, randomized: bool) -> str:
    return f"{backend}+rand" if randomized else backend


def summarize(rates: dict[str, dict[str, list[float]]], limits: dict[str, list[float]]
              ) -> dict[str, dict[str, dict[str, float]]]:
    """Per task and case: median env-steps/s, its share of C_phys (paired per rep) and of
    EnvPool's rate (paired per rep; absent where EnvPool does not run the task)."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for task, cases in rates.items():
        pool = cases.get("envpool")
        table[task] = {}
        for case, values in cases.items():
            row = {"steps_per_s": harness.median(values),
                   "c_phys_share": harness.median(physics.paired_ratios(values, limits[task]))}
            if pool:
                row["envpool_share"] = harness.median(
                    [v / p for v, p in zip(values, pool, strict=True)])
            table[task][case] = row
    return table


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--envs", type=int, default=16, help="env copies (default 16)")
    parser.add_argument("--reps", type=int)
    parser.add_argument("--seconds", type=float, help="stepping time per measurement")
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    seconds = args.seconds or (0.4 if args.quick else 1.0)
    tasks = [TASKS[name] for name in args.tasks]
    print(f"batched: {harness.load_line()}", flush=True)

    load_before = harness.load_line()
    rates, limits, capacity, splits = measure(tasks, args.envs, reps, seconds)
    table = summarize(rates, limits)
    cores = physics.physical_cores()
    tables = {"sampling": sampling_table(table, args.envs, reps, load_before, capacity),
              "time": time_table(splits, limits, cores)}
    for found in tables.values():
        harness.print_table(found["notes"], found["headers"], found["rows"])
    goals = {}
    for task, cases in table.items():
        batched = cases["batched+rand"]
        goals[task] = {"c_phys": batched["c_phys_share"] >= GOAL_C_PHYS,
                       "envpool": batched.get("envpool_share", 1.0) >= GOAL_ENVPOOL}
        print(f"  {task}: batched+rand at {batched['c_phys_share']:.2f} of C_phys (goal >= "
              f"{GOAL_C_PHYS}), " + (f"{batched['envpool_share']:.2f} of EnvPool (goal >= "
                                     f"{GOAL_ENVPOOL})" if "envpool_share" in batched else
                                     "no EnvPool figure for this task"))
    data = {"tables": tables, "table": table, "rates": rates, "c_phys_per_rep": limits,
            "thread_capacity_per_rep": capacity, "time_split_per_rep": splits, "goals": goals,
            "args": vars(args)}
    path = harness.write_results("batched", data)
    print(f"results: {path}  ({harness.load_line()})")
    return data


def sampling_table(table: dict[str, dict[str, dict[str, float]]], num_envs: int, reps: int,
                   load_before: str, capacity: list[float]) -> dict[str, Any]:
    """The docs' table: env-steps/s per task and case with its shares of C_phys and EnvPool."""
    cases = [label(backend, randomized) for backend, randomized in CASES]
    rows = []
    for task, found in table.items():
        row: list[Any] = [task]
        for case in cases:
            if case not in found:
                row.append("-")
                continue
            shares = f"{found[case]['c_phys_share']:.2f}"
            if "envpool_share" in found[case]:
                shares += f"; {found[case]['envpool_share']:.2f}"
            row.append(f"{found[case]['steps_per_s']:,.0f} ({shares})")
        rows.append(row)
    notes = (f"Env-steps/s at {num_envs} envs, random actions, median of {reps} interleaved "
             "reps; in brackets the share of the same rep's C_phys and of EnvPool's rate (+rand: "
             f"every randomization factor). Machine: {load_before} before, "
             f"{harness.load_line()} after; one thread per core got "
             f"{harness.median(capacity):.2f} cores' worth of mj_step at once.")
    return {"headers": ["task", *cases], "rows": rows, "notes": notes}


def time_table(splits: dict[str, list[dict[str, float]]], limits: dict[str, list[float]],
               cores: int) -> dict[str, Any]:
    """Where a batched, randomized step's time goes, and the rate that allows at best: the
    rest serial, the physics divided among the cores."""
    rows = []
    for task, per_rep in splits.items():
        physics_us = harness.median([s["physics_us"] for s in per_rep])
        rest_us = harness.median([s["rest_us"] for s in per_rep])
        bound = 1e6 / (rest_us + physics_us / cores)
        rows.append([task, f"{physics_us:.0f}", f"{rest_us:.0f}", f"{bound:,.0f}",
                     f"{bound / harness.median(limits[task]):.2f}"])
    notes = ("CPU time per env step of batched with every factor, in one thread (median of "
             "the reps): the physics (plan, snapshot, mj_step) and the rest (the tasks', "
             "wrappers' and VecEnv loop's Python, serial on the learner's thread); the best "
             f"rate that split allows on {cores} cores, and its share of C_phys.")
    return {"headers": ["task", "physics us", "rest us", "best env-steps/s", "/ C_phys"],
            "rows": rows, "notes": notes}


if __name__ == "__main__":
    main()
