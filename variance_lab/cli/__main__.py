"""``python -m variance_lab.cli``."""

import sys

from variance_lab.cli import main

sys.exit(main())
