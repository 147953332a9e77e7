"""The result of `bash bench/mutation.sh`: mutants killed per file, and every survivor, as a markdown table.

Reads mutmut's per-file results (mutants/**/*.meta). A survivor listed in bench/mutation_equivalent.txt (one per line:
the mutant's name, then `#` and why no test can tell it from the original) is counted as equivalent; the kill rate is
killed / (all mutants - equivalent ones). A timed-out mutant (an endless loop, say) was detected, so it counts as
killed; a mutant no selected test reaches counts as a survivor.

    .venv/bin/python bench/mutation_report.py [--show] [--record]   # --show: print each unjudged survivor's diff too
                                                                    # --record: the kill rate to bench/results/
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = Path(__file__).with_name("mutation_equivalent.txt")
KILLED = {1, 3, 36, -24, 24, 152, 255, -11, -9}  # failed tests, pytest errors, timeouts, crashes
UNREACHED = 33  # mutmut: no selected test calls the function in-process (subprocess-only code: tune, ranks, the CLI)
TARGET = 0.85


def equivalent() -> dict[str, str]:
    if not EQUIVALENT.is_file():
        return {}
    out = {}
    for line in EQUIVALENT.read_text().splitlines():
        name, _, why = line.partition("#")
        if name.strip():
            out[name.strip()] = why.strip()
    return out


def results() -> dict[str, dict[str, int | None]]:
    """source file -> mutant name -> mutmut's exit code (None: not run)."""
    out = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        source = meta.relative_to(ROOT / "mutants").as_posix().removesuffix(".meta")
        out[source] = json.loads(meta.read_text())["exit_code_by_key"]
    return out


def diff(name: str) -> str:
    mutmut = Path(sys.executable).parent / "mutmut"
    shown = subprocess.run([str(mutmut), "show", name], cwd=ROOT, capture_output=True, text=True).stdout
    return "\n".join(line for line in shown.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def main() -> int:
    by_file = results()
    if not by_file:
        print("no mutmut results under mutants/: run bash bench/mutation.sh first")
        return 2
    judged = equivalent()
    rows, survivors = [], []
    totals: Counter[str] = Counter()
    for source, codes in by_file.items():
        c: Counter[str] = Counter()
        for name, code in codes.items():
            if code in KILLED:
                c["killed"] += 1
            elif code is None:
                c["not run"] += 1
            elif code == UNREACHED and name not in judged:
                c["unreached"] += 1
                survivors.append(name)
            elif name in judged:
                c["equivalent"] += 1
            else:
                c["survived"] += 1
                survivors.append(name)
        c["mutants"] = len(codes)
        totals.update(c)
        rows.append((source, c))
    # Two rates: over every mutant run (one no in-process test reaches counts as a survivor), and over those the
    # in-process tests reach (what mutmut can judge: the rest is tested, if at all, through subprocesses).
    print("| file | mutants | run | killed | equivalent | survived | unreached | kill rate | of reached |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for source, c in [*rows, ("**all**", totals)]:
        if source != "**all**" and c["mutants"] == c["not run"]:
            continue  # no mutant of this file in the run (a sample)
        judged_ = c["mutants"] - c["equivalent"] - c["not run"]
        rate = c["killed"] / max(judged_, 1)
        reached = f"{c['killed'] / (judged_ - c['unreached']):.1%}" if judged_ > c["unreached"] else "—"
        cells = [c["mutants"], c["mutants"] - c["not run"], c["killed"], c["equivalent"], c["survived"], c["unreached"]]
        print(f"| {source} | " + " | ".join(f"{v:,}" for v in cells) + f" | {rate:.1%} | {reached} |")
    judged_ = totals["mutants"] - totals["equivalent"] - totals["not run"]
    rate = totals["killed"] / max(judged_, 1)
    print(f"of the mutants the in-process tests reach: {totals['killed'] / max(judged_ - totals['unreached'], 1):.1%}")
    stale = sorted(set(judged) - {n for codes in by_file.values() for n in codes})
    print(f"\nkill rate of non-equivalent mutants: {rate:.1%} (target {TARGET:.0%})")
    if stale:
        print(f"{len(stale)} names in {EQUIVALENT.name} are not mutants of this code any more (the code changed)")
    if "--show" in sys.argv:
        for name in survivors:
            print(f"\n{name}\n{diff(name)}")
    else:
        print(f"{len(survivors)} survivors not judged equivalent; --show prints their diffs")
    if "--record" in sys.argv:
        from record import command_line, record

        run = totals["mutants"] - totals["not run"]
        record(
            "mutation",
            what=f"Mutation testing: a sample of {run:,} of {totals['mutants']:,} mutants",
            command=command_line(),
            headline=f"{totals['killed']} of {run} killed ({totals['killed'] / max(run, 1):.1%}); {totals['killed']} "
            f"of the {judged_} non-equivalent ({rate:.1%})",
            target=f"{TARGET:.0%}",
            met="yes" if rate >= TARGET else "no",
        )
    return 0 if rate >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
