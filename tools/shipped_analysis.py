"""Write the reference output of ``variance-lab analyze`` on the data files the project ships.

``tests/rollouts/test_shipped_analysis.py`` compares today's output with it: every number that the
reference holds must come out the same, bit for bit (issue #36: making ``analyze`` fast on large
dumps must not move a number on these files). Run from a checkout of the commit the reference
pins, with that checkout first on the path::

    mkdir /tmp/before && git archive 6e37269 | tar -x -C /tmp/before && cd /tmp/before
    PYTHONPATH=$PWD python $REPO/tools/shipped_analysis.py \
        $REPO/tests/data/rollouts/shipped_analysis.json.gz 6e3726919c724397681e496c7dfcc1d74d808e5d

(The second argument, the commit recorded beside the outputs, defaults to ``git rev-parse HEAD``
of the folder it runs in.) The analyses run with BLAS on one thread (``threadpoolctl``), as
``analyze`` itself runs since it pins it (:func:`variance_lab.provenance.one_blas_thread`):
commit 6e37269 predates the pinning, and with its machine's threads (2 on the VM) its ``comb``
fits differ from one thread's by up to 18 %.

(The committed reference was written that way, at one BLAS thread, from commit 6e37269, the start
of the branch that made ``analyze`` scale, with Python 3.11.7, NumPy 2.4.6 and SciPy of the
project's venv on the 2-core AMD EPYC VM.) For each file of :data:`FILES` it runs ``variance-lab analyze FILE
--table-format json`` at its defaults, in process, and stores the parsed JSON under the file's
name, with the commit and versions beside, gzipped (about 70 kB).
"""

from __future__ import annotations

import gzip
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

#: The shipped data files, relative to the repository root.
FILES = (
    "data/arith_rollouts.jsonl.gz",
    "data/arith_rollouts_bf16.jsonl.gz",
    "data/smollm2/smollm2_mismatch_bf16.jsonl.gz",
    "data/smollm2/smollm2_mismatch_fp16.jsonl.gz",
    "data/smollm2/smollm2_mismatch_top-p.jsonl.gz",
    "data/smollm2/smollm2_onpolicy_gspo.jsonl.gz",
    "data/smollm2/smollm2_onpolicy_seq-mean-token-mean.jsonl.gz",
    "data/smollm2/smollm2_onpolicy_token-mean.jsonl.gz",
    "data/smollm2/smollm2_stale_gspo.jsonl.gz",
)


def analyze_json(path: str) -> dict:
    """Return the parsed output of ``variance-lab analyze PATH --table-format json``."""
    from variance_lab.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        status = main(["analyze", str(path), "--table-format", "json", "--out", str(out)])
        if status != 0:
            raise RuntimeError(f"variance-lab analyze {path} exited with {status}")
        return json.loads(out.read_text())


def main(argv: list[str]) -> int:
    """Write the reference to ``argv[0]`` (``argv[1]``: the commit to record, default the checkout's)."""
    import numpy as np
    import scipy
    from threadpoolctl import threadpool_limits

    root = Path.cwd()
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root)
    commit = argv[1] if len(argv) > 1 else git.stdout.strip()
    record = {
        "made_by": "tools/shipped_analysis.py",
        "commit": commit,
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
        },
        "blas_threads": 1,
    }
    with threadpool_limits(limits=1, user_api="blas"):
        record["files"] = {name: analyze_json(root / name) for name in FILES}
    with gzip.open(argv[0], "wt", encoding="utf-8") as fh:
        json.dump(record, fh, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
