"""Render bench/results/*.json into BENCHMARKS.md's current table (between its two marker comments).

    .venv/bin/python bench/render.py            # rewrite the table
    .venv/bin/python bench/render.py --check    # exit 1 when BENCHMARKS.md differs from what this would write

One row per result file, in ORDER (names not in it follow, alphabetically); the "what" cell links to the result's
page. A result is what bench/record.py writes (a bench run with `--record`) or a row transcribed by hand; every
field is the cell's markdown, with "|" escaped here.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BENCHMARKS = ROOT / "BENCHMARKS.md"
START = "<!-- current-table:start -->"
END = "<!-- current-table:end -->"
FIELDS = ("what", "command", "headline", "target", "met", "commit", "date", "machine", "page")
HEADER = ("what", "command", "headline figure", "target", "met", "commit", "date", "machine")
# The table's order: README line 2's cost first, then the engine, the data layer, the models, the gate, the tests.
ORDER = (
    "test-tiers",
    "engine-overhead",
    "gpu",
    "data-baselines",
    "data-throughput",
    "out-of-core",
    "onnx-export",
    "profile-off",
    "text-defaults",
    "noop-run",
    "distributed",
    "small-tables",
    "gate-level",
    "gate-real-pairs",
    "mutation",
    "soak",
)


def load(results: Path = RESULTS) -> list[tuple[str, dict[str, str]]]:
    """(name, result) for every results file, in the table's order."""
    found = {path.stem: json.loads(path.read_text()) for path in sorted(results.glob("*.json"))}
    for name, result in found.items():
        missing = [field for field in FIELDS if not isinstance(result.get(field), str)]
        if missing:
            raise SystemExit(f"bench/results/{name}.json: no {', '.join(missing)} (each a string)")
    known = [name for name in ORDER if name in found]
    return [(name, found[name]) for name in [*known, *sorted(set(found) - set(known))]]


def cell(text: str) -> str:
    """`text` in a table cell: a "|" not already escaped is escaped, and no line breaks."""
    return re.sub(r"(?<!\\)\|", r"\\|", " ".join(text.split()))


def table(results: list[tuple[str, dict[str, str]]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for _, r in results:
        what = f"[{cell(r['what'])}]({r['page']})"
        rest = [cell(r[field]) for field in FIELDS[1:-1]]
        lines.append("| " + " | ".join([what, *rest]) + " |")
    return "\n".join(lines)


def rendered(text: str, results: list[tuple[str, dict[str, str]]]) -> str:
    """`text` (BENCHMARKS.md) with the table between the markers replaced."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise SystemExit(f"BENCHMARKS.md needs one {START} and, after it, one {END}")
    before, rest = text.split(START)
    _, after = rest.split(END)
    return f"{before}{START}\n{table(results)}\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when BENCHMARKS.md is not current")
    args = ap.parse_args(argv)
    text = BENCHMARKS.read_text()
    new = rendered(text, load())
    if args.check:
        if new != text:
            diff = difflib.unified_diff(text.splitlines(), new.splitlines(), "BENCHMARKS.md", "rendered", lineterm="")
            print("\n".join(diff))
            print("BENCHMARKS.md's table is not bench/results/*.json: run .venv/bin/python bench/render.py",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if new != text:
        BENCHMARKS.write_text(new)
        print("BENCHMARKS.md: table rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
