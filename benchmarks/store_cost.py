"""What one MLflow ``log_batch`` of training metrics costs the process that sends it.

The outbox delivers a run's metric rows about once a second in one ``log_batch`` (each
iteration's ~20 keys, every iteration since the last call). This times that call alone, in
CPU seconds of the calling thread (``time.thread_time``: what it takes from a core, whatever
else the machine runs), for batches of 1 and of 10 iterations; the two give the cost per
call and per metric row. The store is a fresh SQLite file (MLflow's SQLAlchemy store, as the
embedded default), or ``--tracking-uri`` (e.g. a tracking server: the rows then cost the
sender only the HTTP request).

    python benchmarks/store_cost.py
    python benchmarks/store_cost.py --tracking-uri http://127.0.0.1:5000 --calls 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

KEYS = 20  # a PPO iteration's metric keys (SB3's and the workbench's)


def cpu_per_call(client: Any, run_id: str, iterations: int, calls: int, step: list[int]) -> float:
    """Median thread CPU seconds of ``calls`` log_batch calls of ``iterations`` x KEYS rows."""
    from mlflow.entities import Metric

    spent = []
    for _ in range(calls):
        rows = []
        for _ in range(iterations):
            step[0] += 512
            now = int(time.time() * 1000)
            rows += [Metric(f"train/key_{k}", 0.5 * k, now, step[0]) for k in range(KEYS)]
        started = time.thread_time()
        client.log_batch(run_id, metrics=rows)
        spent.append(time.thread_time() - started)
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="the store to time (default: a fresh SQLite file)")
    parser.add_argument("--calls", type=int, default=30, help="calls per batch size")
    args = parser.parse_args()
    from mlflow import MlflowClient

    print(f"store cost: {harness.load_line()}", flush=True)
    uri = args.tracking_uri or f"sqlite:///{Path(tempfile.mkdtemp()) / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(f"store-cost-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    step = [0]
    cpu_per_call(client, run_id, 1, 3, step)  # warm-up: the first calls set up the session
    one = cpu_per_call(client, run_id, 1, args.calls, step)
    ten = cpu_per_call(client, run_id, 10, args.calls, step)
    per_row = (ten - one) / (9 * KEYS)
    per_call = one - KEYS * per_row
    result = {"store": uri.split(":", 1)[0], "keys": KEYS, "cpu_ms_1_iteration": one * 1e3,
              "cpu_ms_10_iterations": ten * 1e3, "cpu_us_per_row": per_row * 1e6,
              "cpu_ms_per_call": per_call * 1e3}
    print(f"log_batch into {result['store']}: {one * 1e3:.1f} ms of CPU for 1 iteration "
          f"({KEYS} rows), {ten * 1e3:.1f} ms for 10 -> {per_row * 1e6:.0f} us per row + "
          f"{per_call * 1e3:.1f} ms per call")
    for rate in (6.5, 11.0):
        share = (per_call + rate * KEYS * per_row) * 100
        print(f"  at {rate} iterations/s, delivered once a second: {share:.1f} % of one core")
    print(f"results: {harness.write_results('store_cost', result)}")


if __name__ == "__main__":
    main()
