"""``python -m variance_lab.cli``."""

import sys

from variance_lab.cli import main

if __name__ == "__main__":  # the docs' autosummary imports this module: do not run the CLI then
    sys.exit(main())
