"""``python -m workbench`` is the same program as the ``workbench`` command."""

import sys

from workbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
