"""`trainflow verify`: a version that reproduces (stdout, exit 0) or does not (stderr naming what differed and why,
exit 1); the model references it and `models show` take; the commit a version comes from, dirty when a tracked file
other than dvc.lock differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.cli import CONFIGURED, recorder

from trainflow import cli
from trainflow.core.errors import UserError
from trainflow.core.paths import Paths

RESULT = {
    "model": "m/3",
    "git_commit": "0123456789abcdef0123",
    "data_hash": "d41d8.dir",
    "model_sha256": "aaaaaaaaaaaaaaaabbbb",
    "retrained_sha256": "ccccccccccccccccdddd",
    "metrics_differ": [],
    "environment_differs": None,
}


@pytest.mark.parametrize(("args", "commit"), [([], None), (["--commit", "HEAD"], "HEAD")])
def test_verify_says_a_version_reproduces_on_stdout(
    args: list[str],
    commit: str | None,
    project: Paths,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainflow.registry import verify

    calls: list[Any] = []
    monkeypatch.setattr(verify, "verify", recorder(calls, {**RESULT, "verified": True}))
    assert cli.main(["verify", "m/3", *args]) == 0
    assert calls == [(("m/3", project.root, commit), {})] and [project.root] == CONFIGURED
    assert capsys.readouterr() == (
        "verify: m/3 (commit 0123456789ab, data d41d8.dir) reproduces: the retrained model is byte for byte the "
        "registered one (sha256 aaaaaaaaaaaaaaaa)\n",
        "",
    )


DID_NOT = (
    "error: verify: m/3 (commit 0123456789ab, data d41d8.dir) did not reproduce: the retrained model's sha256 is "
    "cccccccccccccccc, the registered one's aaaaaaaaaaaaaaaa{said}. The data, code and params were checked before "
    "retraining and are the ones it was trained with; "
)


@pytest.mark.parametrize(
    ("differ", "env", "why"),
    [
        (
            [],
            None,
            "the environment it was trained in was not recorded (an older trainflow), so what differed is the training "
            "itself: another device or precision (bit-exact on a CPU, or on one GPU with train.deterministic), or "
            "other library versions",
        ),
        (
            ["accuracy", "f1"],
            ["env.numpy: 1.0 when trained, 2.0 here", "env.torch: 2.12.0 when trained, 2.13.0 here"],
            "the environment differs from the one it was trained in: env.numpy: 1.0 when trained, 2.0 here; env.torch: "
            "2.12.0 when trained, 2.13.0 here. Training is bit-exact in one environment: verify it where it was "
            "trained, or retrain and register it here",
        ),
        (
            [],
            [],
            "so is the environment recorded with it, so the training itself was not deterministic: bit-exact on a CPU, "
            "and on one GPU with train.deterministic",
        ),
    ],
    ids=["no-environment-recorded", "another-environment", "the-same-environment"],
)
def test_verify_says_a_version_did_not_reproduce_and_names_the_environment_on_stderr_exit_1(
    differ: list[str],
    env: list[str] | None,
    why: str,
    project: Paths,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainflow.registry import verify

    result = {**RESULT, "verified": False, "metrics_differ": differ, "environment_differs": env}
    monkeypatch.setattr(verify, "verify", lambda model, root, commit: result)
    assert cli.main(["verify", "m/3"]) == 1
    said = "; test metrics differ: accuracy, f1" if differ else ""
    assert capsys.readouterr() == ("", DID_NOT.format(said=said) + why + "\n")


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("m@champion", ("m", "champion")),
        ("models:/m@challenger", ("m", "challenger")),
        ("models:/team/m/3", ("team/m", "3")),
        ("m/12", ("m", "12")),
        ("a@b/c", ("a", "b/c")),
    ],
)
def test_a_model_reference_is_its_name_and_its_alias_or_version(model: str, named: tuple[str, str]) -> None:
    from trainflow.registry.verify import resolve

    assert resolve(model) == named


@pytest.mark.parametrize("model", ["m", "models:/m", "@champion", "m@", "/3", "m/"])
def test_a_reference_without_a_version_says_how_to_name_one(model: str) -> None:
    from trainflow.registry.verify import resolve

    with pytest.raises(UserError) as err:
        resolve(model)
    assert str(err.value) == f"verify {model}: name a version, as NAME@champion, NAME@challenger or NAME/3"


def test_the_commit_is_dirty_when_a_tracked_file_other_than_dvc_lock_differs(tmp_path: Path) -> None:
    import subprocess

    from trainflow.registry.lineage import git_commit

    assert git_commit(tmp_path) == ("unknown", False)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    (tmp_path / "dvc.lock").write_text("{}\n")
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("x")
    (tmp_path / "dvc.lock").write_text("stages: {}\n")
    assert git_commit(tmp_path) == (head, False)
    (tmp_path / "params.yaml").write_text("seed: 2\n")
    assert git_commit(tmp_path) == (head, True)
