"""BENCHMARKS.md's current table is bench/results/*.json rendered (bench/render.py): a result edited without
rendering, or a table edited by hand, fails here. Each result names a page that exists, and every `benchmarks/` path
the repository names exists (tests/contracts/test_docs_name_what_exists.py checks the other top folders)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("what", "command", "headline", "target", "met", "commit", "date", "machine", "page")
# A path under benchmarks/ as the docs and code name it: `benchmarks/out-of-core.md`, (benchmarks/history/...).
NAMED = re.compile(r"(?<![\w/.-])(benchmarks/[\w./-]*\.md)")


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "bench" / "render.py"), "--check"], capture_output=True,
                          text=True, cwd=root)  # fmt: skip


def test_the_current_table_is_the_results_rendered() -> None:
    done = check(REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_result_has_its_fields_and_an_existing_page() -> None:
    results = sorted((REPO / "bench" / "results").glob("*.json"))
    bad = []
    for path in results:
        result = json.loads(path.read_text())
        missing = [field for field in FIELDS if not isinstance(result.get(field), str) or not result[field]]
        if missing or not (REPO / result.get("page", "")).is_file():
            bad.append(f"{path.name}: missing {missing}, page {result.get('page')!r}")
    assert len(results) >= 16 and not bad, "\n".join(bad)


def test_every_benchmarks_path_the_repository_names_exists() -> None:
    files = [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "CHANGELOG.md"]
    for folder, pattern in (("docs", "*.md"), ("benchmarks", "*.md"), ("trainflow", "*.py"), ("bench", "*.py"),
                            ("tests", "*.py"), ("scripts", "*")):  # fmt: skip
        files += sorted(p for p in (REPO / folder).rglob(pattern) if p.is_file())
    missing = []
    for path in files:
        base = path.parent if path.is_relative_to(REPO / "benchmarks") else REPO
        for named in NAMED.findall(path.read_text(errors="replace")):
            # a page's own links are relative to it (history/x.md, ../x.md); everyone else's to the repository
            if not (REPO / named).exists() and not (base / named.removeprefix("benchmarks/")).exists():
                missing.append(f"{path.relative_to(REPO)}: {named}")
    assert not missing, "\n".join(missing)


def test_the_check_fails_when_a_result_and_the_table_disagree(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    shutil.copy2(REPO / "bench" / "render.py", tmp_path / "bench" / "render.py")
    shutil.copytree(REPO / "bench" / "results", tmp_path / "bench" / "results")
    shutil.copy2(REPO / "BENCHMARKS.md", tmp_path / "BENCHMARKS.md")
    assert check(tmp_path).returncode == 0
    path = tmp_path / "bench" / "results" / "noop-run.json"
    result = json.loads(path.read_text())
    path.write_text(json.dumps({**result, "headline": result["headline"] + " (edited)"}))
    done = check(tmp_path)
    assert done.returncode == 1 and "(edited)" in done.stdout
