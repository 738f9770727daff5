"""A point claimed by one ``workbench sweep`` at a time: an exclusive lock beside its notebook.

Two invocations of the same sweep id on one machine (two terminals, a cron job and a person)
would otherwise both train every point not yet FINISHED, and each would close the other's
running point KILLED. Before running a point, an invocation takes ``<point>.claim`` in the
sweep's notebook folder with ``flock`` (non-blocking); the other skips the points held and
says so. The kernel releases the lock when the point ends or its owner dies, however it dies
(SIGKILL included), so a dead owner's claim is taken over by the next invocation. The lock is
per machine: Ray workers on other machines rely on the FINISHED-run check instead. The claim
itself is :func:`workbench.claims.exclusive_claim`.
"""

from __future__ import annotations

from workbench.claims import claim_holder, exclusive_claim

point_claim = exclusive_claim  # the claim file stays beside the notebook, holding the last pid

__all__ = ["claim_holder", "point_claim"]
