"""``python -m benchmarks [--quick] [--only SECTIONS] [--json PATH]``: the benchmark suite."""

import sys

from benchmarks.suite import main

sys.exit(main())
