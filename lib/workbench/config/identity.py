"""A run's configuration id: a short, stable hash of its learning problem, seed left out.

Two seeds of one configuration share the id, and any key that changes what is learned (the
task, its wrappers and randomization, the algorithm's hyperparameters and network, the
budget, the evaluation that measures it, the initial policy) changes it. Left out are the
keys that only say how a run is executed or recorded: :data:`IGNORED`. Every run carries it as
the tag ``workbench.config_id`` (``workbench train``, notebook runs, sweep points, tuning
trials), so MLflow's UI groups the seeds of one configuration by that tag.
"""

from __future__ import annotations

import hashlib
import json

from workbench.config.schema import WorkbenchConfig, to_dict

CONFIG_ID_TAG = "workbench.config_id"
# Keys (dotted) that do not change the learning problem: the seed, where and how the run is
# recorded and shown, how it is executed (device, threads, vectorization backend,
# determinism switches), checkpoints and resuming, and the sweep's and tuner's own settings.
IGNORED = (
    "seed", "resume", "experiment_name", "device", "torch_threads", "env.vec_env",
    "env.num_threads",
    "tracking", "console", "video", "checkpoint", "repro", "sweep", "search", "tune",
)


def config_id(cfg: WorkbenchConfig) -> str:
    """12 hex digits of SHA-256 over the resolved config without :data:`IGNORED`."""
    tree = to_dict(cfg)
    for dotted in IGNORED:
        *parents, leaf = dotted.split(".")
        node = tree
        for part in parents:
            node = node[part]
        node.pop(leaf, None)
    payload = json.dumps(tree, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
