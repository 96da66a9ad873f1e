"""Rewrite the paired runs' tables in README.md and docs/guide/lm_experiment.md from data/smollm2_paired.

Each table sits between ``<!-- paired:NAME -->`` and ``<!-- /paired -->`` and is computed by
:mod:`variance_lab.lm.paired_report` (2,000 prompt resamples per interval, fixed seeds).

Usage::

    python tools/lm_paired_report.py           # rewrite the tables
    python tools/lm_paired_report.py --check   # exit 1, naming the tables, when one is stale

The check reads numbers, not bytes: a printed number may differ by one unit of its last digit
(another machine's sums), nothing else.
"""

import argparse
import re
import sys
from pathlib import Path

from variance_lab.lm.paired_report import markdown, seed_rows

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "smollm2_paired"
FILES = (ROOT / "README.md", ROOT / "docs" / "guide" / "lm_experiment.md")
MARK = re.compile(r"<!-- paired:(?P<name>[a-z0-9_-]+) -->\n(?P<text>.*?)<!-- /paired -->", re.DOTALL)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
#: The README's rows: the headline quantities.
HEADLINE = (
    "clip_update",
    "rms_update",
    "ratio_update_length",
    "rms_bf16",
    "rms_fp16",
    "ratio_bf16_fp16",
    "ratio_bf16_update",
    "ratio_fp16_update",
    "topp_log_kept",
    "topp_outside",
    "rms_stale_lag2",
    "rms_stale_lag3",
    "ratio_stale_lag3",
)


def _lengths(rows: dict) -> str:
    keys = list(rows["lengths_pooled"])
    lines = ["| seed | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for s in rows["seeds"]:
        counts = rows["per_seed"][s]["lengths"]
        lines.append(f"| {s} | " + " | ".join(str(counts[k]) for k in keys) + " |")
    lines.append("| all | " + " | ".join(str(rows["lengths_pooled"][k]) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def tables(data: Path = DATA) -> dict[str, str]:
    """Return every table's Markdown by name."""
    gspo = seed_rows(data, "gspo")
    try:
        token = markdown(seed_rows(data, "token-mean"))
    except ValueError:  # no token-mean run shipped
        token = "(no token-mean run in this folder)\n"
    head = dict(gspo, spread={k: v for k, v in gspo["spread"].items() if k in HEADLINE})
    return {
        "readme": markdown(head),
        "gspo": markdown(gspo),
        "token-mean": token,
        "lengths": _lengths(gspo),
    }


def rewrite(text: str, found: dict[str, str]) -> str:
    """Return ``text`` with every marked table replaced by ``found[name]``."""

    def fill(m: re.Match) -> str:
        if m["name"] not in found:
            raise KeyError(f"no table named {m['name']!r}")
        return f"<!-- paired:{m['name']} -->\n{found[m['name']]}<!-- /paired -->"

    return MARK.sub(fill, text)


def same(a: str, b: str) -> bool:
    """Whether two tables say the same: equal words, numbers within one unit of their last digit."""
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        return False
    for x, y in zip(NUMBER.findall(a), NUMBER.findall(b), strict=True):
        unit = 10.0 ** (-len(x.split("e")[0].split(".")[1]) if "." in x else 0)
        scale = 10.0 ** int(x.split("e")[1]) if "e" in x else 1.0
        if abs(float(x) - float(y)) > 1.01 * unit * scale:
            return False
    return True


def main(argv=None) -> int:
    """Rewrite the tables, or with ``--check`` report the stale ones (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a table is stale")
    args = parser.parse_args(argv)
    found = tables()
    stale = []
    for path in FILES:
        text = path.read_text()
        for m in MARK.finditer(text):
            if not same(m["text"], found[m["name"]]):
                stale.append(f"{path.name}:{m['name']}")
        if not args.check:
            path.write_text(rewrite(text, found))
    if args.check and stale:
        print("stale paired tables: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
