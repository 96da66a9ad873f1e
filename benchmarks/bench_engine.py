"""Engine throughput and scaling against the bare kernel: the suite's ``throughput`` section.

Kept for its old command; the suite (``python -m benchmarks``) runs this and the rest::

    .venv/bin/python benchmarks/bench_engine.py [--repeats 5] [--quick]
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.suite import main

    sys.exit(main(["--only", "throughput", *sys.argv[1:]]))
