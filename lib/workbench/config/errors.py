"""The one exception type of bad configuration or arguments (exit code 2 at the CLI)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad configuration or arguments: one line naming the input, the problem and the fix."""
