"""Record a passed ``.ci/run``: its wall time and the number of tests it ran, with the
machine, commit and date, as ``ci.json`` (``benchmarks/reference/`` with
``WORKBENCH_BENCH_REFERENCE=1``: docs/architecture.md's "Tests" line is rendered from it).

Called by ``.ci/run`` itself at the end of a passed run when ``WORKBENCH_BENCH_REFERENCE=1``
is set; the count is pytest's collection of ``tests/`` (every tier: what CI runs).

    WORKBENCH_BENCH_REFERENCE=1 .ci/run
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness


def collected_tests() -> int:
    """How many tests pytest collects under ``tests/`` (all tiers)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-n", "0", "tests"],
                          cwd=harness.ROOT, capture_output=True, text=True, check=True)
    found = re.search(r"^(\d+) tests? collected", done.stdout, re.MULTILINE)
    if found is None:
        raise SystemExit(f"ci_record: no test count in pytest's output: {done.stdout[-300:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, required=True, help="the run's wall time")
    args = parser.parse_args(argv)
    path = harness.write_results("ci", {"command": ".ci/run", "ci_seconds": args.seconds,
                                        "tests": collected_tests()})
    print(f"ci: recorded in {path.relative_to(harness.ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
