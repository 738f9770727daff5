"""The workbench's own upgrades: benchmarks/upgrades.py's verifications, the table it makes of
them (docs/benchmarks.md#upgrades) and the command of each row."""

from __future__ import annotations

import importlib
import shlex
import sys

import pytest
from workbench.sweeps.request import check_request

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its sibling harness


@pytest.mark.unit
def test_the_upgrades_table_is_the_verifications_and_each_command_parses() -> None:
    """benchmarks/reference/upgrades.json's table (docs/benchmarks.md#upgrades, rendered by
    scripts/render_docs.py, which tests/test_docs.py checks) is what benchmarks/upgrades.py
    makes of its verifications, and each row's verification is a request the sweep accepts
    (its kernels are checked when it runs, once make candidate registered them)."""
    upgrades = importlib.import_module("upgrades")
    data = upgrades.load()
    assert data["tables"] == {"verdicts": upgrades.verdicts_table(data)}
    assert {row["package"] for row in data["verifications"]} == {"mlflow", "envpool", "torch"}
    for row in data["verifications"]:
        make, sweep = upgrades.command(row, data["tasks"]).split(" && ")
        assert make == f"make candidate UPGRADE={row['package']}=={row['to']}"
        words = shlex.split(sweep)
        assert words[:3] == [".venv/bin/workbench", "sweep", "sweep=verify"]
        if row["package"] != "torch":
            continue  # one package's rows stand for all: the same template, other names
        request = check_request(words[2:])
        assert [p.kernel for p in request.points[:2]] == ["workbench", upgrades.kernel(row)]
        assert request.sweep.verify.target == data["tasks"][row["task"]]["target"]
    rows = data["verifications"]
    assert upgrades.taken(rows, "torch") == "no: not verified yet"
    verified = [{**row, "verdict": verdict} for row, verdict in
                zip(rows[:2], ("not worse", "worse"), strict=True)]
    assert upgrades.taken(verified, "mlflow") == "no: worse on hopper"
    assert upgrades.taken([{**rows[0], "verdict": "not worse"}], "mlflow") == "yes"
