"""Names of metrics the workbench logs beside SB3's and MLflow's own, shared by the code that
logs them (:mod:`workbench.training`) and the code that reads them (:mod:`workbench.review`).
"""

from __future__ import annotations

# Memory of the training process tree (PSS of the trainer and its env workers, MiB), sampled
# at rollout ends at most once a second. Machine-dependent like MLflow's system/* metrics, so
# it shares their prefix (and is left out of the reproducibility comparison with them).
PROCESS_MEMORY_KEY = "system/process_tree_memory_mb"
