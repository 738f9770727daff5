"""Names of metrics the workbench logs beside SB3's and MLflow's own, shared by the code that
logs them (:mod:`workbench.training`) and the code that reads them (:mod:`workbench.review`).
"""

from __future__ import annotations

# Memory of the training process tree (PSS of the trainer and its env workers, MiB), sampled
# at rollout ends at most every ``tracking.system_metrics_interval_s``. Machine-dependent like
# MLflow's system/* metrics, so it shares their prefix (and is left out of the
# reproducibility comparison with them).
PROCESS_MEMORY_KEY = "system/process_tree_memory_mb"

# Runs that are not trainings: ``workbench eval`` logs a parent run tagged ``workbench.kind=eval``
# and one nested run per cell of its matrix (``eval-cell``); reports leave both out of their
# selections and show the verdicts on the policy's own run instead (tags ``robustness.*``).
RUN_KIND_TAG = "workbench.kind"
EVAL_KIND, EVAL_CELL_KIND = "eval", "eval-cell"
ROBUSTNESS_LATEST_TAG = "robustness.latest"  # the profile of a run's latest eval


def robustness_tag(profile: str, field: str) -> str:
    """``robustness.<profile>.<field>``: a run's eval record (verdicts, passed, eval_run)."""
    return f"robustness.{profile}.{field}"
