"""The workbench's own upgrades, verified: one verification sweep per upgrade and task.

``benchmarks/reference/upgrades.json`` lists under ``verifications`` each upgrade of a locked
package, the task it is verified on and what the verification found, and holds the table
docs/benchmarks.md#upgrades shows (``tables.verdicts``, rendered by
``scripts/render_docs.py`` like every committed results table), made from them here:

    python benchmarks/upgrades.py commands                  # the command of every row
    python benchmarks/upgrades.py record mlflow halfcheetah  # after that row's command ran
    python benchmarks/upgrades.py table                     # the table from the verifications
    python scripts/render_docs.py                           # then the page from the table

A row's command builds the candidate stack (``make candidate UPGRADE=PACKAGE==VERSION``: a
second virtualenv from the lock with that upgrade, registered as the Jupyter kernel
``workbench-PACKAGE-VERSION``) and runs ``workbench sweep sweep=verify`` with A in today's
kernel and B in the candidate's (docs/reports.md#verifying-a-change). ``record`` reads that
verification's parent run (tags ``verify.*``, metrics ``verify/*``) from the store the
environment names (``MLFLOW_TRACKING_URI``, else the project's). An upgrade is taken into
the lock only when every task's row says not worse and no slower.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import harness

RESULTS = harness.ROOT / "benchmarks" / "reference" / "upgrades.json"
HEADERS = ["upgrade", "task", "verdict (margin 5 %)", "seeds a side", "B - A (return)",
           "time to target, B / A", "taken"]
NOTES = ("One verification per row: A in today's lock, B in the candidate's, seeds added in "
         "stages of 3 a side up to 12 until decided; B - A in % of A's IQM final return and "
         "B's training seconds to the target over A's, each with the interval of the stage "
         "that decided. Each row's command below reproduces it.")


def load(path: Path = RESULTS) -> dict[str, Any]:
    """The results file."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def kernel(row: dict[str, Any]) -> str:
    """The candidate's kernel: ``workbench-mlflow-3.18.0``."""
    return f"workbench-{row['package']}-{row['to']}"


def command(row: dict[str, Any], tasks: dict[str, Any]) -> str:
    """The one command that reproduces a row: the candidate stack, then its verification."""
    task = tasks[row["task"]]
    sweep = ["workbench", "sweep", "sweep=verify", f"env={row['task']}", *task["overrides"],
             f"sweep.grid={{sweep.kernel:[workbench,{kernel(row)}]}}",
             f"sweep.verify.target={task['target']:g}"]
    return (f"make candidate UPGRADE={row['package']}=={row['to']} && .venv/bin/"
            + shlex.join(sweep))


def taken(rows: list[dict[str, Any]], package: str) -> str:
    """Whether an upgrade goes into the lock: every task not worse and no slower."""
    mine = [r for r in rows if r["package"] == package]
    if any(r.get("verdict") is None for r in mine):
        return "no: not verified yet"
    if all(r["verdict"] == "not worse" for r in mine):
        return "yes"
    return "no: " + ", ".join(f"{r['verdict']} on {r['task']}" for r in mine
                              if r["verdict"] != "not worse")


def interval(values: list[float] | None, fmt: str) -> str:
    """``-1.2% [-3.4%, +1.0%]`` from ``[estimate, low, high]``, ``-`` without one."""
    if not values:
        return "-"
    return f"{format(values[0], fmt)} [{format(values[1], fmt)}, {format(values[2], fmt)}]"


def label(row: dict[str, Any]) -> str:
    return f"{row['package']} → {row['to']}, {row['task']}"


def verdicts_table(data: dict[str, Any]) -> dict[str, Any]:
    """``tables.verdicts`` of the results file, one row per upgrade and task, each with its
    command (and when it ran, once recorded) as its source."""
    rows = data["verifications"]
    cells = [[f"{r['package']} → {r['to']}", r["task"], r.get("verdict") or f"not run: {r['note']}",
              "-" if r.get("seeds") is None else str(r["seeds"]),
              interval(r.get("return"), "+.1%"), interval(r.get("time"), ".2f"),
              taken(rows, r["package"])] for r in rows]
    sources = [{"label": label(r), "command": command(r, data["tasks"]),
                **{k: r[k] for k in ("date", "commit") if r.get(k)}} for r in rows]
    return {"headers": HEADERS, "rows": cells, "notes": NOTES, "sources": sources,
            "machine": {"description": "the machine each dated row ran on (an undated row has "
                                       "not run yet)"}}


def record(data: dict[str, Any], package: str, task: str) -> dict[str, Any]:
    """Read the verification of a row from the store into the row."""
    from mlflow.tracking import MlflowClient

    row = next(r for r in data["verifications"] if (r["package"], r["task"]) == (package, task))
    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = [r for r in client.search_runs(experiments, "tags.`sweep.role` = 'parent'",
                                           order_by=["attributes.start_time DESC"])
             if "verify.verdict" in r.data.tags and kernel(row) in r.data.params.get(
                 "sweep.point_names", "") and r.data.params.get("sweep.env") == task]
    if not found:
        raise SystemExit(f"no verification of {kernel(row)} on {task} in the store; run: "
                         f"{command(row, data['tasks'])}")
    tags, metrics = found[0].data.tags, found[0].data.metrics
    row.update({
        "verdict": tags["verify.verdict"], "seeds": int(tags["verify.seeds"]),
        "sweep_id": tags["sweep_id"], "lines": tags.get("verify.lines", ""),
        "return": [metrics[f"verify/return_{k}"] for k in ("estimate", "low", "high")]
        if "verify/return_low" in metrics else None,
        "time": [metrics[f"verify/time_{k}"] for k in ("ratio", "low", "high")]
        if "verify/time_low" in metrics else None,
        **{k: v for k, v in harness.provenance().items() if k in ("date", "commit")},
    })
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("commands", help="print the command of every row")
    rec = sub.add_parser("record", help="read a row's verification from the store")
    rec.add_argument("package")
    rec.add_argument("task")
    sub.add_parser("table", help="write tables.verdicts from the verifications")
    args = parser.parse_args(argv)
    data = load()
    if args.action == "commands":
        for row in data["verifications"]:
            print(command(row, data["tasks"]))
        return 0
    if args.action == "record":
        print(json.dumps(record(data, args.package, args.task), indent=2, ensure_ascii=False))
    data["tables"] = {"verdicts": verdicts_table(data)}
    RESULTS.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
