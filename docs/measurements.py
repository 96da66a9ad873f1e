"""Measured numbers of the README and the guide, from one file (``docs/measurements.json``).

Prose never holds a hand copy of a measurement: the README carries each one between
``<!-- n:KEY -->`` and ``<!-- /n -->``, which this script rewrites from the JSON, and the
guide's pages write ``{{ KEY }}``, which ``docs/conf.py`` substitutes from the same texts.

Usage::

    python docs/measurements.py           # rewrite README.md's numbers from docs/measurements.json
    python docs/measurements.py --check   # exit 1, naming the keys, when README.md is stale
"""

import argparse
import json
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
README = DOCS.parent / "README.md"
MEASUREMENTS = DOCS / "measurements.json"
MARK = re.compile(r"<!-- n:(?P<key>[a-z0-9_]+) -->(?P<text>.*?)<!-- /n -->", re.DOTALL)


def texts(path: Path = MEASUREMENTS) -> dict[str, str]:
    """Return the text of every measurement, its template filled with its values and the machine.

    A measurement made on another machine than the file's ``machine`` names its own in its values.
    """
    data = json.loads(path.read_text())
    return {
        key: entry["template"].format(**{"machine": data["machine"], **entry["values"]})
        for key, entry in data["numbers"].items()
    }


def refresh(markdown: str, numbers: dict[str, str]) -> str:
    """Return ``markdown`` with every ``<!-- n:KEY -->...<!-- /n -->`` span holding ``numbers[KEY]``.

    Raises
    ------
    KeyError
        A span names a key that ``numbers`` lacks.
    """

    def fill(match: re.Match) -> str:
        key = match["key"]
        if key not in numbers:
            raise KeyError(f"README names measurement {key!r}, which {MEASUREMENTS.name} lacks")
        return f"<!-- n:{key} -->{numbers[key]}<!-- /n -->"

    return MARK.sub(fill, markdown)


def stale_keys(markdown: str, numbers: dict[str, str]) -> list[str]:
    """Keys whose span in ``markdown`` differs from ``numbers``."""
    return [m["key"] for m in MARK.finditer(markdown) if numbers.get(m["key"]) != m["text"]]


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or, with ``--check``, check) the README's measured numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when stale")
    args = parser.parse_args(argv)
    numbers = texts()
    text = README.read_text()
    if args.check:
        stale = stale_keys(text, numbers)
        if stale:
            keys = ", ".join(stale)
            print(f"README.md is stale for {keys}: run python docs/measurements.py", file=sys.stderr)
            return 1
        return 0
    new = refresh(text, numbers)
    if new != text:
        README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
