"""The docs (README.md and docs/) name only files that exist and `trainflow` commands the CLI has: a moved module, a
renamed test or a dropped command fails here, not in a reader's terminal. `mkdocs build --strict` (scripts/test.sh)
checks the links between pages; this checks what the prose names."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from trainflow.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
TOP = ("trainflow", "tests", "scripts", "bench", "flows", "tasks", "docs", ".ci", ".github")
# A repo path in backticks: `trainflow/registry/gate.py`, `tests/stages/` (a test id's ::name and globs are cut off).
PATH = re.compile(r"`((?:" + "|".join(re.escape(t) for t in TOP) + r")/[^`\s:*<>{}]*)")
# A command as typed: `trainflow models promote ...`, in code spans and code blocks alike.
COMMAND = re.compile(r"(?:^|[`$\s(])trainflow((?: [a-z][a-z-]*)+)")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found = {prefix}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= command_paths(sub, (*prefix, name))
    return found


def test_every_path_the_docs_name_exists() -> None:
    missing = [
        f"{page.relative_to(REPO)}: {path}"
        for page in pages()
        for path in PATH.findall(page.read_text())
        if not (REPO / path.rstrip(".,;")).exists()
    ]
    assert len(pages()) > 1 and not missing, "\n".join(missing)


def test_every_trainflow_command_the_docs_name_exists() -> None:
    known = command_paths(build_parser())
    groups = {path[0] for path in known if path}
    wrong = []
    for page in pages():
        for words in COMMAND.findall(page.read_text()):
            words = tuple(words.split())
            if words[0] not in groups:
                continue  # prose: "trainflow runs ...", "trainflow is ..."
            # the longest known command path the words start with must take the next word as an argument
            longest = max((p for p in known if words[: len(p)] == p), key=len)
            subgroups = {p[len(longest)] for p in known if len(p) > len(longest) and p[: len(longest)] == longest}
            if len(words) > len(longest) and subgroups:
                wrong.append(f"{page.relative_to(REPO)}: trainflow {' '.join(words)}")
    assert not wrong, "\n".join(wrong)


def test_the_checks_find_a_missing_path_and_an_unknown_command() -> None:
    text = "see `trainflow/no_such_module.py` and run `trainflow models demote x`"
    assert [p for p in PATH.findall(text) if not (REPO / p).exists()] == ["trainflow/no_such_module.py"]
    words = tuple(COMMAND.findall(text)[0].split())
    known = command_paths(build_parser())
    assert words[:2] not in known and ("models",) in known
