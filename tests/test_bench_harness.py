"""The benchmark harness's measured child processes (benchmarks/harness.py)."""

from __future__ import annotations

import sys

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their sibling harness
import harness  # noqa: E402

HOLD_MB = 256


def test_a_childs_peak_memory_is_its_own_not_its_parents() -> None:
    """On Linux an exec'd child's ``ru_maxrss`` starts at its parent's memory: a child that
    stays small must not report this (pytest) process's peak, one that grows reports its own."""
    small = harness.Child([sys.executable, "-c", "pass"]).finish()
    assert small["peak_rss_mb"] < 100, small["peak_rss_mb"]
    assert harness.vm_hwm_mb() > 100  # the test process is bigger: the check above can fail
    grows = harness.Child([sys.executable, "-c",
                           f"import time; held = b'x' * ({HOLD_MB} << 20); time.sleep(1)"]).finish()
    assert HOLD_MB <= grows["peak_rss_mb"] < HOLD_MB + 100, grows["peak_rss_mb"]
