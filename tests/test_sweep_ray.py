"""``sweep.executor=ray`` without a cluster: an unreachable one is bad input, and the pieces of
a Ray point (tags, dead attempts, refusals, the head watch). tests/test_sweep_ray_cluster.py
runs sweeps and studies on a real multi-node cluster."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from workbench.config import ConfigError
from workbench.notebook import NotebookParameters
from workbench.review.diagnostics import Series
from workbench.review.records import RunRecord
from workbench.review.render import run_blocks
from workbench.sweeps.plan import plan_sweep
from workbench.sweeps.point import (
    POINT_TAGS_ENV,
    ClusterLost,
    abandoned_reason,
    point_specs,
    point_tags_from_env,
)
from workbench.sweeps.ray_cluster import HeadWatch, check_capacity

from .conftest import run_cli
from .raycluster import free_port
from .support.runs import POINT_TINY

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")


def test_unreachable_cluster_is_bad_input(bare_store: Path) -> None:
    proc = run_cli("sweep", "sweep.executor=ray", f"sweep.ray.address=127.0.0.1:{free_port()}",
                   timeout=300)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("workbench: error: sweep.ray.address=127.0.0.1:")
    assert "cannot connect to a Ray cluster" in line
    assert not bare_store.exists()


# --------------------------------------------------------------------------- the Ray task's pieces


@pytest.mark.unit
def test_point_tags_come_from_the_kernels_environment_and_only_as_strings() -> None:
    tags = {"ray.node_id": "abc", "ray.node_ip": "10.0.0.7"}
    assert point_tags_from_env({POINT_TAGS_ENV: json.dumps(tags)}) == tags
    assert point_tags_from_env({}) == {}
    assert point_tags_from_env({POINT_TAGS_ENV: "not json"}) == {}
    assert point_tags_from_env({POINT_TAGS_ENV: "[1, 2]"}) == {}
    assert point_tags_from_env({POINT_TAGS_ENV: '{"a": "x", "b": 3}'}) == {"a": "x"}


@pytest.mark.unit
def test_a_sweep_points_run_carries_the_executors_tags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POINT_TAGS_ENV, json.dumps({"ray.node_id": "n1"}))
    point = NotebookParameters("hopper", 1, 64, 1000, 0, sweep_id="s-1", point="p")
    assert point.run_tags() == {"ray.node_id": "n1", "sweep_id": "s-1", "sweep.role": "child",
                                "sweep.point": "p"}
    by_hand = NotebookParameters("hopper", 1, 64, 1000, 0)
    assert by_hand.run_tags() == {}  # a notebook run by hand gets no sweep (or node) tags


@pytest.mark.unit
def test_a_dead_attempts_run_is_closed_with_where_it_ran() -> None:
    plan = plan_sweep(["sweep.num_envs=[2]", "sweep.n_steps=[64]", *POINT_TINY])
    (spec,) = point_specs(plan, plan.points, "parent", "0", cpus_per_point=1)
    dead = SimpleNamespace(data=SimpleNamespace(tags={"ray.node_id": "dead1",
                                                      "ray.node_ip": "10.0.0.7"}))
    retry = replace(spec, tags={**spec.tags, "ray.node_id": "live2", "ray.node_ip": "10.0.0.8"})
    assert abandoned_reason(dead, retry) == (  # type: ignore[arg-type]
        "killed: the Ray worker or node that ran this attempt died (node 10.0.0.7 dead1); "
        "Ray retried the point on node 10.0.0.8 live2")
    local = SimpleNamespace(data=SimpleNamespace(tags={}))
    assert abandoned_reason(local, spec).startswith(  # type: ignore[arg-type]
        "killed: abandoned, the sweep process that ran this point stopped")


@pytest.mark.unit
def test_a_ray_sweep_refuses_a_password_in_the_tracking_uri() -> None:
    uri = "tracking.uri=http://alice:s3cret-pass@10.0.0.5:5050"
    with pytest.raises(ConfigError) as info:
        plan_sweep(["sweep.executor=ray", uri, "sweep.num_envs=[2]", "sweep.n_steps=[64]",
                    *POINT_TINY])
    message = str(info.value)
    assert message.startswith("tracking.uri=http://alice:***@10.0.0.5:5050: with "
                              "sweep.executor=ray the URI travels in every Ray task")
    assert "s3cret-pass" not in message and "MLFLOW_TRACKING_PASSWORD" in message
    plan_sweep([uri, "sweep.num_envs=[2]", "sweep.n_steps=[64]", *POINT_TINY])  # local: no Ray
    with pytest.raises(ConfigError, match=r"^sweep.ray.gpus_per_point=-1: must be >= 0"):
        plan_sweep(["sweep.ray.gpus_per_point=-1", "sweep.num_envs=[2]", "sweep.n_steps=[64]",
                    *POINT_TINY])


@pytest.mark.unit
def test_a_cluster_no_point_fits_on_is_refused() -> None:
    nodes = [{"CPU": 0.0}, {"CPU": 4.0, "GPU": 1.0}]
    check_capacity("h:1", nodes, 4, 0.5)  # fits
    with pytest.raises(ConfigError, match=r"^sweep.ray.address=h:1: the cluster has no CPUs"):
        check_capacity("h:1", [{"CPU": 0.0}], 0, 0.0)
    with pytest.raises(ConfigError, match=r"^sweep.ray.gpus_per_point=2: no node of the "
                                          r"cluster at h:1 has that many GPUs \(the most is 1\)"):
        check_capacity("h:1", nodes, 4, 2.0)


@pytest.mark.unit
def test_the_run_table_shows_the_ray_node_of_ray_points_only() -> None:
    def record(name: str, tags: dict[str, str], status: str = "FINISHED",
               fps: float | None = 100.0) -> RunRecord:
        metrics = {} if fps is None else {"summary/fps": Series.of([1], [fps], [0])}
        return RunRecord(run_id=name, name=name, experiment_id="1", status=status,
                         start_ms=0, end_ms=1, tags=tags, params={}, metrics=metrics)

    node_1 = {"ray.node_id": "n1", "ray.node_ip": "10.0.0.7", "ray.hostname": "gpu-3"}
    report = SimpleNamespace(runs=[record("p1", node_1), record("p2", {}),
                                   record("p3", node_1, "KILLED", fps=None),
                                   record("p4", node_1, fps=300.0)],
                             run_url=lambda r: f"u/{r.run_id}")
    blocks = run_blocks(report)  # type: ignore[arg-type]
    table = blocks[1]
    assert table.headers[5] == "Ray node"
    assert [row[5] for row in table.rows] == ["10.0.0.7 (gpu-3) n1", "-", "10.0.0.7 (gpu-3) n1",
                                              "10.0.0.7 (gpu-3) n1"]
    assert blocks[2].text == "Runs per Ray node"  # grouped by node
    assert blocks[3].rows == (("-", "1", "1 FINISHED", "100"),
                              ("10.0.0.7 (gpu-3) n1", "3", "2 FINISHED, 1 KILLED", "200"))
    report.runs = [report.runs[1]]
    blocks = run_blocks(report)  # type: ignore[arg-type]
    assert "Ray node" not in blocks[1].headers and len(blocks) == 2  # no Ray point, no column


def test_the_head_watch_gives_up_on_a_silent_head() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    watch = HeadWatch(f"127.0.0.1:{listener.getsockname()[1]}", lost_after_s=3.0)
    watch.check()  # answers
    assert watch.silent_since is None
    listener.close()
    deadline = time.monotonic() + 60
    with pytest.raises(ClusterLost, match=r"^the Ray head at 127.0.0.1:\d+ stopped answering"):
        while time.monotonic() < deadline:
            watch.check()
            time.sleep(0.2)


def test_a_password_in_the_uri_of_a_ray_sweep_exits_2_before_anything(bare_store: Path) -> None:
    # MLFLOW_TRACKING_URI, which wins over tracking.uri, is where such a URI usually hides.
    proc = run_cli("sweep", "sweep.executor=ray", timeout=300,
                   env={"MLFLOW_TRACKING_URI": "http://bob:pw-123456@h:1"})
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("workbench: error: tracking.uri=http://bob:***@h:1: ")
    assert "pw-123456" not in proc.stdout + proc.stderr
    assert not bare_store.exists()


@pytest.mark.unit
def test_a_ray_study_refuses_a_password_in_its_tracking_uri_or_storage_url() -> None:
    from workbench.tuning.plan import plan_tune

    from .support.runs import TINY_STUDY

    ray_study = [*TINY_STUDY, "tune.executor=ray"]
    with pytest.raises(ConfigError) as info:
        plan_tune([*ray_study, "tracking.uri=http://alice:s3cret-pass@10.0.0.5:5050"])
    assert str(info.value).startswith("tracking.uri=http://alice:***@10.0.0.5:5050: with "
                                      "tune.executor=ray the URI travels in every Ray task")
    storage = "tune.storage=postgresql+psycopg2://bob:pg-s3cret@db:5432/optuna"
    with pytest.raises(ConfigError) as info:
        plan_tune([*ray_study, storage])
    message = str(info.value)
    assert message.startswith("tune.storage=postgresql+psycopg2://bob:***@db:5432/optuna: with "
                              "tune.executor=ray the storage URL travels in every Ray task")
    assert "pg-s3cret" not in message and "PGPASSWORD" in message
    assert plan_tune([*TINY_STUDY, storage]).storage.endswith("@db:5432/optuna")  # local: fine
    with pytest.raises(ConfigError, match=r"^tune.ray.gpus_per_point=-0.5: must be >= 0"):
        plan_tune([*ray_study, "tune.ray.gpus_per_point=-0.5"])
